/* SPDX-License-Identifier: MIT */
/*
 * engine.c - the table of metadata engines and the calls that dispatch to
 * them (engine.h).
 */
#include "meta/engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

int ckpt_engine_open(const char *name, const char *where, const struct ckpt_engine_opts *o,
		     ckpt_engine **ret, char *err, size_t errlen)
{
	const struct ckpt_engine_ops *ops = ckpt_engine_find(name ? name : CKPT_ENGINE_DEFAULT);

	if (!ops) {
		snprintf(err, errlen, "%s: unknown metadata engine '%s'", where, name);
		return -EINVAL;
	}
	return ops->open(where, o, ret, err, errlen);
}

void ckpt_engine_close(ckpt_engine *e)
{
	if (e)
		e->ops->close(e);
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

int ckpt_engine_sync(ckpt_engine *e)
{
	return e->ops->sync(e);
}

int ckpt_engine_flush(ckpt_engine *e)
{
	return e->ops->flush(e);
}

int ckpt_txn_begin(ckpt_engine *e, ckpt_txn **ret)
{
	return e->ops->begin(e, ret);
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

	if (r < 0)
		t->err = r;
	return r;
}

int ckpt_txn_delete(ckpt_txn *t, const void *key, size_t klen)
{
	int r = t->err ? t->err : t->engine->ops->del(t, key, klen);

	if (r < 0)
		t->err = r;
	return r;
}

int ckpt_txn_commit(ckpt_txn *t, bool durable)
{
	int r = t->err;

	if (r < 0) {
		t->engine->ops->abort(t);
		return r;
	}
	return t->engine->ops->commit(t, durable);
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
