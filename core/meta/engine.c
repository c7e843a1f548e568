/* SPDX-License-Identifier: MIT */
/*
 * engine.c - the table of metadata engines, the calls that dispatch to
 * them (engine.h), and what every engine's metadata log needs around the
 * driver: the writes of each transaction serialized for the log, the
 * comparison of engine and log at open, snapshots.
 */
#include "meta/engine.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/util.h"
#include "meta/mlog.h"

static const struct ckpt_engine_ops *const engines[] = {
	&ckpt_engine_rocksdb,
	&ckpt_engine_postgres,
};

const struct ckpt_engine_ops *ckpt_engine_at(size_t i)
{
	return i < sizeof(engines) / sizeof(engines[0]) ? engines[i] : NULL;
}

const struct ckpt_engine_ops *ckpt_engine_find(const char *name)
{
	for (size_t i = 0; ckpt_engine_at(i); i++)
		if (strcmp(engines[i]->name, name) == 0)
			return engines[i];
	return NULL;
}

static int get_fixed(ckpt_engine *e, ckpt_txn *t, const void *key, size_t klen, unsigned flags,
		     void *buf, size_t len);

/* Replaying logged commits into the engine at open: one transaction per
 * commit. */
struct replay {
	ckpt_engine *e;
	ckpt_txn *t;
	uint64_t n;
};

static int replay_txn(struct replay *rp)
{
	return rp->t ? 0 : ckpt_txn_begin(rp->e, &rp->t);
}

static int replay_put(void *ud, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl)
{
	struct replay *rp = ud;
	int r = replay_txn(rp);

	return r < 0 ? r : ckpt_txn_put(rp->t, k, kl, v, vl);
}

static int replay_del(void *ud, const uint8_t *k, size_t kl)
{
	struct replay *rp = ud;
	int r = replay_txn(rp);

	return r < 0 ? r : ckpt_txn_delete(rp->t, k, kl);
}

static int replay_mark(void *ud, uint64_t number, uint64_t stamp)
{
	struct replay *rp = ud;
	int r = 0;

	if (rp->t)
		r = ckpt_txn_commit(rp->t, false);
	rp->t = NULL;
	rp->n++;
	return r;
}

/* Record that e holds logged commit `number` (before the log is attached:
 * not logged). */
static int put_mark(ckpt_engine *e, uint64_t number)
{
	uint8_t v[8];
	ckpt_txn *t;
	int r = ckpt_txn_begin(e, &t);

	if (r < 0)
		return r;
	ckpt_put_le64(v, number);
	ckpt_txn_put(t, CKPT_ENGINE_MARK_KEY, CKPT_ENGINE_MARK_KEY_LEN, v, sizeof(v));
	return ckpt_txn_commit(t, true);
}

/* Find where the engine stands in its metadata log in dir, bring the two
 * together, and attach the log to e (engine.h, "The metadata log"). */
static int attach_log(ckpt_engine *e, const char *where, const char *dir, char *err,
		      size_t errlen)
{
	static const struct ckpt_mlog_sink sink = { replay_put, replay_del, replay_mark };
	struct replay rp = { e, NULL, 0 };
	uint64_t mark = 0, last = 0, pos = 0, base, stamp = e->ops->stamp(e);
	bool marked = false, fresh = false;
	ckpt_mlog *m = NULL;
	uint8_t v[8];
	int r = ckpt_mlog_open(dir, &m, err, errlen);

	if (r < 0) {
		/* The index itself is fine: run without the log (the next open
		 * that can write it takes a new snapshot) rather than refuse. */
		ckpt_err("%s; the index runs without its metadata log until an open that can "
			 "write it", err);
		err[0] = '\0';
		return 0;
	}
	r = get_fixed(e, NULL, CKPT_ENGINE_MARK_KEY, CKPT_ENGINE_MARK_KEY_LEN, 0, v, sizeof(v));
	if (r == 0) {
		mark = ckpt_get_le64(v);
		marked = true;
	} else if (r != -ENOENT) {
		ckpt_errf(err, errlen, "%s: cannot read which logged commit it holds: %s", where,
			  strerror(-r));
		goto fail;
	}
	if (!marked || ckpt_mlog_last(m, &last) < 0) {
		fresh = true;
	} else if (ckpt_mlog_locate(m, mark, stamp, &pos) < 0) {
		ckpt_warn("%s: holds writes its metadata log %s does not (ahead of it since commit "
			  "%" PRIu64 "): a new snapshot of the index is taken", where, dir, mark);
		fresh = true;
	} else if (pos < last) {
		r = ckpt_mlog_replay_after(m, pos, &sink, &rp);
		ckpt_txn_abort(rp.t);
		if (r == -ENOENT) {
			ckpt_warn("%s: the index holds commit %" PRIu64 ", its log %s goes to %" PRIu64
				  ", and the commits between cannot be read from the log: a new "
				  "snapshot of the index is taken", where, pos, dir, last);
			fresh = true;
		} else if (r < 0) {
			ckpt_errf(err, errlen, "%s: cannot replay commits %" PRIu64 "..%" PRIu64
				  " from the metadata log %s: %s", where, pos + 1, last, dir,
				  strerror(-r));
			goto fail;
		} else {
			ckpt_warn("%s: the index lacked %" PRIu64 " commits after %" PRIu64
				  " that its log %s holds: replayed", where, rp.n, pos, dir);
			r = e->ops->flush(e);
			if (r < 0) {
				ckpt_errf(err, errlen, "%s: cannot write the replayed commits: %s",
					  where, strerror(-r));
				goto fail;
			}
			pos = last;
		}
	}
	/* a new log numbers above everything the directory names, so that
	 * nothing chains an old log to it */
	base = fresh ? ckpt_mlog_highest(m) + 1 : pos;
	if (fresh && marked && mark >= base)
		base = mark + 1;
	if (!marked || mark != base) {
		r = put_mark(e, base);
		if (r < 0) {
			ckpt_errf(err, errlen, "%s: cannot record which logged commit it holds: %s",
				  where, strerror(-r));
			goto fail;
		}
	}
	r = ckpt_mlog_start(m, base);
	if (r < 0) { /* as above: no space for a new log, say */
		ckpt_err("%s: cannot write its metadata log %s (%s): it runs without it until an "
			 "open that can", where, dir, strerror(-r));
		ckpt_mlog_close(m);
		return 0;
	}
	e->mlog = m;
	if (fresh || ckpt_mlog_due(m)) {
		r = ckpt_engine_backup(e);
		if (r < 0) /* the log still holds every commit from here */
			ckpt_warn("%s: cannot take a snapshot into %s: %s", where, dir,
				  strerror(-r));
	}
	/* An empty commit with the engine's stamp now: an engine written
	 * without its log from here on has a stamp no record matches. */
	{
		uint64_t n;
		if (ckpt_mlog_append(m, NULL, 0, 0, e->ops->stamp(e), &n) < 0)
			ckpt_mlog_break(m);
	}
	return 0;
fail:
	ckpt_mlog_close(m);
	return r;
}

int ckpt_engine_open(const char *name, const char *where, const struct ckpt_engine_opts *o,
		     ckpt_engine **ret, char *err, size_t errlen)
{
	const struct ckpt_engine_ops *ops = ckpt_engine_find(name ? name : CKPT_ENGINE_DEFAULT);
	ckpt_engine *e = NULL;
	int r;

	if (!ops) {
		snprintf(err, errlen, "%s: unknown metadata engine '%s'", where, name);
		return -EINVAL;
	}
	r = ops->open(where, o, &e, err, errlen);
	if (r < 0)
		return r;
	e->mlog = NULL;
	if (o->log_dir && !o->read_only) {
		r = attach_log(e, where, o->log_dir, err, errlen);
		if (r < 0) {
			ops->close(e);
			return r;
		}
	}
	*ret = e;
	return 0;
}

void ckpt_engine_close(ckpt_engine *e)
{
	ckpt_mlog *m;

	if (!e)
		return;
	m = e->mlog;
	e->ops->close(e);
	ckpt_mlog_close(m);
}

const char *ckpt_engine_log_dir(const ckpt_engine *e)
{
	return e->mlog ? ckpt_mlog_dir(e->mlog) : NULL;
}

bool ckpt_engine_backup_due(ckpt_engine *e)
{
	return e->mlog && ckpt_mlog_due(e->mlog);
}

struct switch_arg {
	ckpt_engine *e;
	uint64_t base;
	ckpt_scan *sc;
};

/* While no commit is applied: the new log starts here, and the scan sees
 * exactly the commits before it. */
static int switch_log(void *arg)
{
	struct switch_arg *a = arg;
	int r = ckpt_mlog_switch(a->e->mlog, &a->base);

	if (r == 0)
		r = a->e->ops->scan_new(a->e, NULL, "", 0, NULL, 0, &a->sc);
	return r;
}

int ckpt_engine_backup(ckpt_engine *e)
{
	struct switch_arg a = { e, 0, NULL };
	const uint8_t *k, *v;
	size_t kl, vl;
	ckpt_msnap *w = NULL;
	int r;

	if (!e->mlog)
		return -EOPNOTSUPP;
	/* Everything the engine's own write-ahead log holds then lies in the
	 * logs a restore keeps (the one this snapshot starts and the one
	 * before). */
	r = e->ops->flush(e);
	if (r == 0)
		r = e->ops->quiesce(e, switch_log, &a);
	if (r == 0)
		r = ckpt_msnap_begin(e->mlog, a.base, &w);
	while (r == 0 && (r = ckpt_scan_next(a.sc, &k, &kl, &v, &vl)) > 0) {
		r = 0;
		if (kl != CKPT_ENGINE_MARK_KEY_LEN || memcmp(k, CKPT_ENGINE_MARK_KEY, kl) != 0)
			r = ckpt_msnap_add(w, k, kl, v, vl); /* the mark is the engine's own */
	}
	ckpt_scan_free(a.sc);
	if (w) {
		int r2 = ckpt_msnap_end(w, r == 0);
		if (r == 0)
			r = r2;
	}
	return r;
}

int ckpt_engine_log_commit(ckpt_txn *t, uint64_t stamp)
{
	ckpt_engine *e = t->engine;
	uint64_t num;
	int r;

	if (!e->mlog)
		return 0;
	r = ckpt_mlog_append(e->mlog, t->lbuf, t->llen, t->lops, stamp, &num);
	return r == -ESTALE ? 0 : r; /* a broken log: unlogged until the next snapshot */
}

void ckpt_engine_log_stale(ckpt_engine *e)
{
	if (e->mlog)
		ckpt_mlog_break(e->mlog);
}

void ckpt_engine_log_undo(ckpt_txn *t)
{
	if (t->engine->mlog)
		ckpt_mlog_unappend(t->engine->mlog);
}

void ckpt_txn_base_free(ckpt_txn *t)
{
	free(t->lbuf);
	t->lbuf = NULL;
	t->lcap = t->llen = 0;
}

void ckpt_txn_base_trim(ckpt_txn *t)
{
	if (t->lcap > (1u << 20))
		ckpt_txn_base_free(t);
}

const char *ckpt_engine_name(const ckpt_engine *e)
{
	return e->ops->name;
}

struct copy_arg {
	uint8_t *buf; /* fixed: the caller's buffer */
	size_t len;
	uint8_t *val; /* otherwise: the copy made */
};

static int copy_val(void *arg, const uint8_t *val, size_t len)
{
	struct copy_arg *a = arg;

	a->val = malloc(len ? len : 1);
	if (!a->val)
		return -ENOMEM;
	memcpy(a->val, val, len);
	a->len = len;
	return 0;
}

static int copy_fixed(void *arg, const uint8_t *val, size_t len)
{
	struct copy_arg *a = arg;

	if (len != a->len)
		return -EIO;
	memcpy(a->buf, val, len);
	return 0;
}

static int no_copy(void *arg, const uint8_t *val, size_t len)
{
	(void)arg;
	(void)val;
	(void)len;
	return 0;
}

static int get_copy(ckpt_engine *e, ckpt_txn *t, const void *key, size_t klen, unsigned flags,
		    uint8_t **ret_val, size_t *ret_len)
{
	struct copy_arg a = { 0 };
	int r = e->ops->get(e, t, key, klen, flags, copy_val, &a);

	if (r < 0)
		return r;
	*ret_val = a.val;
	*ret_len = a.len;
	return 0;
}

static int get_fixed(ckpt_engine *e, ckpt_txn *t, const void *key, size_t klen, unsigned flags,
		     void *buf, size_t len)
{
	struct copy_arg a = { .buf = buf, .len = len };

	return e->ops->get(e, t, key, klen, flags, copy_fixed, &a);
}

static int has(ckpt_engine *e, ckpt_txn *t, const void *key, size_t klen, unsigned flags)
{
	int r = e->ops->get(e, t, key, klen, flags, no_copy, NULL);

	if (r == -ENOENT)
		return 0;
	return r < 0 ? r : 1;
}

int ckpt_engine_get(ckpt_engine *e, const void *key, size_t klen, uint8_t **ret_val,
		    size_t *ret_len)
{
	return get_copy(e, NULL, key, klen, 0, ret_val, ret_len);
}

int ckpt_engine_get_fixed(ckpt_engine *e, const void *key, size_t klen, void *buf, size_t len)
{
	return get_fixed(e, NULL, key, klen, 0, buf, len);
}

int ckpt_engine_has(ckpt_engine *e, const void *key, size_t klen)
{
	return has(e, NULL, key, klen, 0);
}

struct many_one {
	ckpt_engine_many_fn fn;
	void *arg;
	size_t i;
};

static int many_one(void *arg, const uint8_t *val, size_t len)
{
	struct many_one *m = arg;

	return m->fn(m->arg, m->i, val, len);
}

bool ckpt_engine_batches(const ckpt_engine *e)
{
	return e->ops->get_many != NULL;
}

int ckpt_engine_get_many(ckpt_engine *e, const uint8_t *const *keys, const size_t *klens,
			 size_t n, ckpt_engine_many_fn fn, void *arg)
{
	struct many_one m = { fn, arg, 0 };
	int r = 0;

	if (n == 0)
		return 0;
	if (e->ops->get_many)
		return e->ops->get_many(e, keys, klens, n, fn, arg);
	for (m.i = 0; m.i < n && r >= 0; m.i++) {
		r = e->ops->get(e, NULL, keys[m.i], klens[m.i], 0, many_one, &m);
		if (r == -ENOENT)
			r = 0;
	}
	return r < 0 ? r : 0;
}

/* The metadata log is synced when the engine is flushed and closed, and at
 * each snapshot, not at every durable commit or sync: what it guards
 * against is damage to the engine's files, not a power loss, which the
 * engine's own durability covers (a log that lost its tail in one is
 * behind the engine at the next open, which then takes a new snapshot).
 * An fdatasync of the log beside the engine's at every fsync of a small
 * file nearly doubled its cost (docs/design.md section 15). */
int ckpt_engine_sync(ckpt_engine *e)
{
	return e->ops->sync(e);
}

int ckpt_engine_flush(ckpt_engine *e)
{
	int r = e->ops->flush(e);

	if (r == 0 && e->mlog)
		r = ckpt_mlog_sync(e->mlog);
	return r;
}

int ckpt_txn_begin(ckpt_engine *e, ckpt_txn **ret)
{
	int r = e->ops->begin(e, ret);

	if (r == 0) {
		(*ret)->releases_space = false;
		(*ret)->llen = 0;
		(*ret)->lops = 0;
	}
	return r;
}

int ckpt_txn_get(ckpt_txn *t, const void *key, size_t klen, unsigned flags, uint8_t **ret_val,
		 size_t *ret_len)
{
	return get_copy(t->engine, t, key, klen, flags, ret_val, ret_len);
}

int ckpt_txn_get_fixed(ckpt_txn *t, const void *key, size_t klen, unsigned flags, void *buf,
		       size_t len)
{
	return get_fixed(t->engine, t, key, klen, flags, buf, len);
}

int ckpt_txn_has(ckpt_txn *t, const void *key, size_t klen, unsigned flags)
{
	return has(t->engine, t, key, klen, flags);
}

int ckpt_txn_put(ckpt_txn *t, const void *key, size_t klen, const void *val, size_t vlen)
{
	int r = t->err ? t->err : t->engine->ops->put(t, key, klen, val, vlen);

	if (r == 0 && t->engine->mlog) {
		r = ckpt_mlog_op_add(&t->lbuf, &t->llen, &t->lcap, CKPT_MLOG_OP_PUT, key, klen, val,
				     vlen);
		t->lops++;
	}
	if (r < 0)
		t->err = r;
	return r;
}

int ckpt_txn_delete(ckpt_txn *t, const void *key, size_t klen)
{
	int r = t->err ? t->err : t->engine->ops->del(t, key, klen);

	if (r == 0 && t->engine->mlog) {
		r = ckpt_mlog_op_add(&t->lbuf, &t->llen, &t->lcap, CKPT_MLOG_OP_DEL, key, klen, NULL,
				     0);
		t->lops++;
	}
	if (r < 0)
		t->err = r;
	return r;
}

int ckpt_txn_commit(ckpt_txn *t, bool durable)
{
	ckpt_engine *e = t->engine;
	int r = t->err;

	if (r < 0) {
		e->ops->abort(t);
		return r;
	}
	return e->ops->commit(t, durable); /* the log is synced at flush (above) */
}

void ckpt_txn_releases_space(ckpt_txn *t)
{
	t->releases_space = true;
}

void ckpt_txn_abort(ckpt_txn *t)
{
	if (t)
		t->engine->ops->abort(t);
}

bool ckpt_txn_retry(int r, unsigned *attempt)
{
	struct timespec ts = { 0, 0 };

	if (r != -EAGAIN || ++*attempt >= CKPT_TXN_TRIES)
		return false;
	/* The winner of the conflict is committing now: give it a moment,
	 * longer each time (10 us doubling, at most about 10 ms). */
	ts.tv_nsec = 10000L << (*attempt < 10 ? *attempt : 10);
	nanosleep(&ts, NULL);
	return true;
}

int ckpt_txn_run(ckpt_engine *e, ckpt_txn_fn fn, void *arg, bool durable)
{
	unsigned attempt = 0;
	ckpt_txn *t;
	int r;

	do {
		r = ckpt_txn_begin(e, &t);
		if (r < 0)
			return r;
		r = fn(t, arg);
		if (r == 0) {
			r = ckpt_txn_commit(t, durable);
		} else {
			ckpt_txn_abort(t);
			if (r > 0)
				r = 0;
		}
	} while (ckpt_txn_retry(r, &attempt));
	return r;
}

int ckpt_scan_new(ckpt_engine *e, ckpt_txn *t, const void *prefix, size_t plen,
		  const void *start, size_t slen, ckpt_scan **ret)
{
	return e->ops->scan_new(e, t, prefix, plen, start, slen, ret);
}

int ckpt_scan_next(ckpt_scan *sc, const uint8_t **ret_key, size_t *ret_klen,
		   const uint8_t **ret_val, size_t *ret_vlen)
{
	return sc->engine->ops->scan_next(sc, ret_key, ret_klen, ret_val, ret_vlen);
}

void ckpt_scan_free(ckpt_scan *sc)
{
	if (sc)
		sc->engine->ops->scan_free(sc);
}
