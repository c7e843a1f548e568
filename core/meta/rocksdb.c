/* SPDX-License-Identifier: MIT */
/*
 * rocksdb.c - the RocksDB metadata engine (engine.h), the only file that
 * calls RocksDB.
 *
 * A read-write engine is an OptimisticTransactionDB: a transaction buffers
 * its writes in an indexed write batch, reads made for update record the
 * key, and commit checks, under RocksDB's own per-key locks, that no key
 * read for update or written was changed since; a conflict comes back as
 * Busy (or TryAgain when the memtable history no longer covers the
 * transaction) and is returned as -EAGAIN.  Optimistic rather than
 * pessimistic (TransactionDB): the store serializes its own writers, so
 * conflicts are rare and taking no row locks keeps single-key work as cheap
 * as a plain write batch.  A durable commit is a commit followed by a sync
 * of the write-ahead log (the transaction's write options are fixed when
 * it begins).  A read-only engine is a plain read-only DB without the lock
 * file; beginning a transaction on it fails with -EROFS.
 *
 * The on-disk database is the same as before transactions were used: the
 * transaction layer keeps no state of its own on disk.
 */
#include "meta/engine.h"

#include <dirent.h>
#include <errno.h>
#include <rocksdb/c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

#define PREFIX_MAX 512

struct rdb {
	struct ckpt_engine base;
	rocksdb_optimistictransactiondb_t *odb; /* NULL when read-only */
	rocksdb_t *db; /* the base DB: plain reads, scans, sync, flush */
	rocksdb_options_t *opts;
	rocksdb_block_based_table_options_t *topts;
	rocksdb_cache_t *cache;
	rocksdb_filterpolicy_t *filter; /* owned by topts once set */
	rocksdb_readoptions_t *ropts;
	rocksdb_writeoptions_t *wopts;
	rocksdb_optimistictransaction_options_t *topt;
	rocksdb_flushoptions_t *fopts;
};

struct rtxn {
	struct ckpt_txn base;
	rocksdb_transaction_t *t;
};

struct rscan {
	struct ckpt_scan base;
	rocksdb_iterator_t *it;
	rocksdb_readoptions_t *ropts;
	const rocksdb_snapshot_t *snap; /* NULL in a transaction */
	uint8_t prefix[PREFIX_MAX];
	size_t plen;
	uint8_t *start; /* NULL: seek to prefix */
	size_t slen;
	bool started;
};

/* RocksDB reports errors as strings; map the ones callers act on. */
static int rocks_errno(char *err)
{
	int r = -EIO;

	if (!err)
		return 0;
	if (strstr(err, "Resource busy") || strstr(err, "Try again")) {
		rocksdb_free(err); /* a conflict: the caller retries, nothing to log */
		return -EAGAIN;
	}
	if (strstr(err, "No space left") || strstr(err, "NoSpace"))
		r = -ENOSPC;
	ckpt_err("index: %s", err);
	rocksdb_free(err);
	return r;
}

/* The number of write-ahead logs (NNNNNN.log) in dir, or -errno. */
static int count_wals(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	size_t len;
	int n = 0;

	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		len = strlen(de->d_name);
		if (len > 4 && strcmp(de->d_name + len - 4, ".log") == 0)
			n++;
	}
	closedir(d);
	return n;
}

static int rdb_flush(ckpt_engine *e);

/*
 * RocksDB 7.x (Debian 12 ships 7.8) creates a write-ahead log at every
 * read-write open and lets a log go only once a memtable flush has moved
 * the oldest log to keep past it.  An open that writes nothing flushes
 * nothing, so every mount that only reads left one more empty log behind,
 * and each open lists them all again (fixed upstream in RocksDB 8.3,
 * "Delete empty WAL files on reopen").  When more than WALS_MAX logs are
 * there, write one tombstone of a key that never exists ('M' "wal-trim")
 * and flush it: the flush records the newer log number and RocksDB deletes
 * the old logs.  The tombstone's tiny table is merged away by compaction.
 */
#define WALS_MAX 4

static int trim_wals(struct rdb *x, const char *dir)
{
	static const char key[] = { 'M', 'w', 'a', 'l', '-', 't', 'r', 'i', 'm' };
	char *err = NULL;
	int r = count_wals(dir);

	if (r <= WALS_MAX)
		return r < 0 ? r : 0;
	rocksdb_delete(x->db, x->wopts, key, sizeof(key), &err);
	r = rocks_errno(err);
	if (r == 0)
		r = rdb_flush(&x->base);
	return r;
}

static void rdb_close(ckpt_engine *e)
{
	struct rdb *x = (struct rdb *)e;

	if (x->odb) {
		rocksdb_optimistictransactiondb_close_base_db(x->db);
		rocksdb_optimistictransactiondb_close(x->odb);
	} else if (x->db) {
		rocksdb_close(x->db);
	}
	if (x->opts)
		rocksdb_options_destroy(x->opts);
	if (x->topts)
		rocksdb_block_based_options_destroy(x->topts);
	if (x->cache)
		rocksdb_cache_destroy(x->cache);
	if (x->ropts)
		rocksdb_readoptions_destroy(x->ropts);
	if (x->wopts)
		rocksdb_writeoptions_destroy(x->wopts);
	if (x->topt)
		rocksdb_optimistictransaction_options_destroy(x->topt);
	if (x->fopts)
		rocksdb_flushoptions_destroy(x->fopts);
	free(x);
}

static int rdb_open(const char *dir, const struct ckpt_engine_opts *o, ckpt_engine **ret,
		    char *errbuf, size_t errlen)
{
	struct rdb *x = calloc(1, sizeof(*x));
	char *err = NULL;
	int r = -ENOMEM;

	if (!x) {
		snprintf(errbuf, errlen, "out of memory");
		return r;
	}
	x->base.ops = &ckpt_engine_rocksdb;
	x->opts = rocksdb_options_create();
	rocksdb_options_set_create_if_missing(x->opts, o->create);
	rocksdb_options_increase_parallelism(x->opts, 2);
	rocksdb_options_set_compression(x->opts, rocksdb_lz4_compression);
	rocksdb_options_set_max_open_files(x->opts, 512);
	rocksdb_options_set_keep_log_file_num(x->opts, 4);
	rocksdb_options_set_recycle_log_file_num(x->opts, 0);
	x->topts = rocksdb_block_based_options_create();
	x->cache = rocksdb_cache_create_lru(o->cache_bytes ? o->cache_bytes : 64u << 20);
	rocksdb_block_based_options_set_block_cache(x->topts, x->cache);
	x->filter = rocksdb_filterpolicy_create_bloom_full(10);
	rocksdb_block_based_options_set_filter_policy(x->topts, x->filter);
	rocksdb_options_set_block_based_table_factory(x->opts, x->topts);
	if (o->read_only) {
		x->db = rocksdb_open_for_read_only(x->opts, dir, 0, &err);
	} else {
		x->odb = rocksdb_optimistictransactiondb_open(x->opts, dir, &err);
		if (x->odb)
			x->db = rocksdb_optimistictransactiondb_get_base_db(x->odb);
	}
	if (err) {
		snprintf(errbuf, errlen, "cannot open index %s: %s", dir, err);
		r = strstr(err, "lock") ? -EBUSY : -EIO;
		rocksdb_free(err);
		x->odb = NULL;
		x->db = NULL;
		rdb_close(&x->base);
		return r;
	}
	x->ropts = rocksdb_readoptions_create();
	x->wopts = rocksdb_writeoptions_create();
	rocksdb_writeoptions_set_sync(x->wopts, 0);
	x->topt = rocksdb_optimistictransaction_options_create();
	x->fopts = rocksdb_flushoptions_create();
	rocksdb_flushoptions_set_wait(x->fopts, 1);
	if (!o->read_only) {
		r = trim_wals(x, dir);
		if (r < 0) /* harmless: the logs stay for the next open to try */
			ckpt_warn("index %s: cannot drop old write-ahead logs: %s", dir,
				  strerror(-r));
	}
	*ret = &x->base;
	return 0;
}

static int rdb_get(ckpt_engine *e, ckpt_txn *t, const void *key, size_t klen, unsigned flags,
		   ckpt_engine_val_fn fn, void *arg)
{
	struct rdb *x = (struct rdb *)e;
	rocksdb_pinnableslice_t *ps;
	const char *v;
	char *err = NULL;
	size_t vlen = 0;
	int r;

	if (!t)
		ps = rocksdb_get_pinned(x->db, x->ropts, key, klen, &err);
	else if (flags & CKPT_TXN_FOR_UPDATE)
		ps = rocksdb_transaction_get_pinned_for_update(((struct rtxn *)t)->t, x->ropts, key,
							       klen, 1, &err);
	else
		ps = rocksdb_transaction_get_pinned(((struct rtxn *)t)->t, x->ropts, key, klen, &err);
	if (err)
		return rocks_errno(err);
	if (!ps)
		return -ENOENT;
	v = rocksdb_pinnableslice_value(ps, &vlen);
	r = fn(arg, (const uint8_t *)v, vlen);
	rocksdb_pinnableslice_destroy(ps);
	return r;
}

static int rdb_begin(ckpt_engine *e, ckpt_txn **ret)
{
	struct rdb *x = (struct rdb *)e;
	struct rtxn *t;

	if (!x->odb)
		return -EROFS;
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->base.engine = e;
	t->t = rocksdb_optimistictransaction_begin(x->odb, x->wopts, x->topt, NULL);
	if (!t->t) {
		free(t);
		return -ENOMEM;
	}
	*ret = &t->base;
	return 0;
}

static int rdb_put(ckpt_txn *t, const void *key, size_t klen, const void *val, size_t vlen)
{
	char *err = NULL;

	rocksdb_transaction_put(((struct rtxn *)t)->t, key, klen, val, vlen, &err);
	return rocks_errno(err);
}

static int rdb_del(ckpt_txn *t, const void *key, size_t klen)
{
	char *err = NULL;

	rocksdb_transaction_delete(((struct rtxn *)t)->t, key, klen, &err);
	return rocks_errno(err);
}

static int rdb_sync(ckpt_engine *e)
{
	char *err = NULL;

	rocksdb_flush_wal(((struct rdb *)e)->db, 1, &err);
	return rocks_errno(err);
}

static void rdb_abort(ckpt_txn *t)
{
	rocksdb_transaction_destroy(((struct rtxn *)t)->t); /* unapplied writes dropped */
	free(t);
}

static int rdb_commit(ckpt_txn *t, bool durable)
{
	ckpt_engine *e = t->engine;
	char *err = NULL;
	int r;

	rocksdb_transaction_commit(((struct rtxn *)t)->t, &err);
	r = rocks_errno(err);
	rdb_abort(t);
	if (r == 0 && durable)
		r = rdb_sync(e);
	return r;
}

static int rdb_flush(ckpt_engine *e)
{
	struct rdb *x = (struct rdb *)e;
	char *err = NULL;

	rocksdb_flush(x->db, x->fopts, &err);
	if (err)
		return rocks_errno(err);
	return rdb_sync(e);
}

static void rdb_scan_free(ckpt_scan *sc)
{
	struct rscan *s = (struct rscan *)sc;

	if (s->it)
		rocksdb_iter_destroy(s->it);
	if (s->snap)
		rocksdb_release_snapshot(((struct rdb *)sc->engine)->db, s->snap);
	if (s->ropts)
		rocksdb_readoptions_destroy(s->ropts);
	free(s->start);
	free(s);
}

/* memcmp order of byte strings, a prefix first. */
static int key_cmp(const void *a, size_t alen, const void *b, size_t blen)
{
	int c = memcmp(a, b, alen < blen ? alen : blen);

	if (c)
		return c;
	return alen < blen ? -1 : alen > blen;
}

static int rdb_scan_new(ckpt_engine *e, ckpt_txn *t, const void *prefix, size_t plen,
			const void *start, size_t slen, ckpt_scan **ret)
{
	struct rdb *x = (struct rdb *)e;
	struct rscan *s;

	if (plen > PREFIX_MAX)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->base.engine = e;
	memcpy(s->prefix, prefix, plen);
	s->plen = plen;
	if (start && key_cmp(start, slen, prefix, plen) > 0) {
		/* the first key at or after start (a start before the prefix
		 * changes nothing: every key it selects starts with it) */
		s->start = malloc(slen ? slen : 1);
		if (!s->start) {
			free(s);
			return -ENOMEM;
		}
		memcpy(s->start, start, slen);
		s->slen = slen;
	}
	s->ropts = rocksdb_readoptions_create();
	rocksdb_readoptions_set_fill_cache(s->ropts, 0);
	if (t) {
		s->it = rocksdb_transaction_create_iterator(((struct rtxn *)t)->t, s->ropts);
	} else {
		s->snap = rocksdb_create_snapshot(x->db);
		rocksdb_readoptions_set_snapshot(s->ropts, s->snap);
		s->it = rocksdb_create_iterator(x->db, s->ropts);
	}
	*ret = &s->base;
	return 0;
}

static int rdb_scan_next(ckpt_scan *sc, const uint8_t **ret_key, size_t *ret_klen,
			 const uint8_t **ret_val, size_t *ret_vlen)
{
	struct rscan *s = (struct rscan *)sc;
	char *err = NULL;
	const char *k;
	size_t klen;

	if (!s->started) {
		if (s->start)
			rocksdb_iter_seek(s->it, (const char *)s->start, s->slen);
		else
			rocksdb_iter_seek(s->it, (const char *)s->prefix, s->plen);
		s->started = true;
	} else {
		rocksdb_iter_next(s->it);
	}
	if (!rocksdb_iter_valid(s->it)) {
		rocksdb_iter_get_error(s->it, &err);
		return rocks_errno(err);
	}
	k = rocksdb_iter_key(s->it, &klen);
	if (klen < s->plen || memcmp(k, s->prefix, s->plen) != 0)
		return 0;
	*ret_key = (const uint8_t *)k;
	*ret_klen = klen;
	*ret_val = (const uint8_t *)rocksdb_iter_value(s->it, ret_vlen);
	return 1;
}

const struct ckpt_engine_ops ckpt_engine_rocksdb = {
	.name = "rocksdb",
	.open = rdb_open,
	.close = rdb_close,
	.get = rdb_get,
	.begin = rdb_begin,
	.put = rdb_put,
	.del = rdb_del,
	.commit = rdb_commit,
	.abort = rdb_abort,
	.scan_new = rdb_scan_new,
	.scan_next = rdb_scan_next,
	.scan_free = rdb_scan_free,
	.sync = rdb_sync,
	.flush = rdb_flush,
};
