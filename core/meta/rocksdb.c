/* SPDX-License-Identifier: MIT */
/*
 * rocksdb.c - the RocksDB metadata engine (engine.h), the only file that
 * calls RocksDB.
 *
 * A RocksDB database has one writer process (RocksDB's LOCK file), so every
 * transaction that can conflict with another runs in this process, and the
 * engine detects conflicts itself, optimistically, in memory: a
 * transaction buffers its writes in an indexed write batch (its gets read
 * the batch over the database) and remembers the keys it read for update
 * or wrote, as slots of a table of OCC_SLOTS hashes.  Commits are numbered;
 * the table keeps, per slot, the number of the last commit that wrote a key
 * hashing there.  A commit checks under occ_lock that no slot it tracks was
 * written by a commit numbered after its own begin, then writes its batch:
 * the first committer wins, a later one gets -EAGAIN.  Two keys sharing a
 * slot can cause a needless retry, never a missed conflict.  This costs a
 * hash per key, where RocksDB's OptimisticTransactionDB searches the
 * memtables once more for every tracked key at commit; the database on
 * disk is the same plain one either way.
 *
 * A durable commit writes its batch, then syncs the write-ahead log outside
 * occ_lock, so that a sync does not hold up other commits.  A read-only
 * engine is a read-only DB without the lock file; beginning a transaction
 * on it fails with -EROFS.
 */
#include "meta/engine.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <rocksdb/c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/util.h"
#include "base/xxh.h"

#define PREFIX_MAX 512
#define OCC_SLOTS (1u << 18)
#define TXN_SPARE 4

struct rdb {
	struct ckpt_engine base;
	rocksdb_t *db;
	bool read_only;
	rocksdb_options_t *opts;
	rocksdb_block_based_table_options_t *topts;
	rocksdb_cache_t *cache;
	rocksdb_filterpolicy_t *filter; /* owned by topts once set */
	rocksdb_readoptions_t *ropts;
	rocksdb_writeoptions_t *wopts;
	rocksdb_flushoptions_t *fopts;
	pthread_mutex_t occ_lock;
	/* Protected by occ_lock: */
	uint64_t seq;   /* commits so far */
	uint64_t *last; /* OCC_SLOTS: per slot, the last commit writing there */
	struct rtxn *spare[TXN_SPARE]; /* ended transactions kept for reuse */
	unsigned nspare;
};

#define SLOT_WRITTEN 0x80000000u /* in rtxn.slots: the key was written */

struct rtxn {
	struct ckpt_txn base;
	rocksdb_writebatch_wi_t *wb;
	uint64_t start;  /* commits made before this transaction began */
	uint32_t *slots; /* tracked keys' slots, | SLOT_WRITTEN when written */
	size_t n, cap;
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

	if (x->db)
		rocksdb_close(x->db);
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
	if (x->fopts)
		rocksdb_flushoptions_destroy(x->fopts);
	for (unsigned i = 0; i < x->nspare; i++) {
		rocksdb_writebatch_wi_destroy(x->spare[i]->wb);
		free(x->spare[i]->slots);
		free(x->spare[i]);
	}
	pthread_mutex_destroy(&x->occ_lock);
	free(x->last);
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
	x->read_only = o->read_only;
	pthread_mutex_init(&x->occ_lock, NULL);
	if (!o->read_only) {
		x->last = calloc(OCC_SLOTS, sizeof(*x->last));
		if (!x->last) {
			snprintf(errbuf, errlen, "out of memory");
			rdb_close(&x->base);
			return r;
		}
	}
	/* owner only: the index holds the store's chunk hash secret (RocksDB
	 * would make it 0755) */
	if (o->create && mkdir(dir, 0700) < 0 && errno != EEXIST) {
		r = -errno;
		snprintf(errbuf, errlen, "cannot create index %s: %s", dir, strerror(-r));
		rdb_close(&x->base);
		return r;
	}
	x->opts = rocksdb_options_create();
	rocksdb_options_set_create_if_missing(x->opts, o->create);
	rocksdb_options_increase_parallelism(x->opts, 2);
	rocksdb_options_set_compression(x->opts, rocksdb_lz4_compression);
	/* A read-only open beside a live writer opens every table file now
	 * (-1): the writer deletes files its compactions replace, and a view
	 * that opened them later would fail its reads. */
	rocksdb_options_set_max_open_files(x->opts, o->read_only ? -1 : 512);
	rocksdb_options_set_keep_log_file_num(x->opts, 4);
	rocksdb_options_set_recycle_log_file_num(x->opts, 0);
	x->topts = rocksdb_block_based_options_create();
	x->cache = rocksdb_cache_create_lru(o->cache_bytes ? o->cache_bytes : 64u << 20);
	rocksdb_block_based_options_set_block_cache(x->topts, x->cache);
	x->filter = rocksdb_filterpolicy_create_bloom_full(10);
	rocksdb_block_based_options_set_filter_policy(x->topts, x->filter);
	rocksdb_options_set_block_based_table_factory(x->opts, x->topts);
	if (o->read_only)
		x->db = rocksdb_open_for_read_only(x->opts, dir, 0, &err);
	else
		x->db = rocksdb_open(x->opts, dir, &err);
	if (err) {
		snprintf(errbuf, errlen, "cannot open index %s: %s", dir, err);
		r = strstr(err, "lock") ? -EBUSY : -EIO;
		rocksdb_free(err);
		x->db = NULL;
		rdb_close(&x->base);
		return r;
	}
	x->ropts = rocksdb_readoptions_create();
	x->wopts = rocksdb_writeoptions_create();
	rocksdb_writeoptions_set_sync(x->wopts, 0);
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

/* Remember key's slot in t (written: t writes it). */
static int track(struct rtxn *t, const void *key, size_t klen, bool written)
{
	uint32_t slot = (uint32_t)(XXH3_64bits(key, klen) % OCC_SLOTS);

	if (t->n == t->cap) {
		size_t nc = t->cap ? t->cap * 2 : 16;
		uint32_t *nv = realloc(t->slots, nc * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		t->slots = nv;
		t->cap = nc;
	}
	t->slots[t->n++] = slot | (written ? SLOT_WRITTEN : 0);
	return 0;
}

static int rdb_get(ckpt_engine *e, ckpt_txn *t, const void *key, size_t klen, unsigned flags,
		   ckpt_engine_val_fn fn, void *arg)
{
	struct rdb *x = (struct rdb *)e;
	char *err = NULL;
	size_t vlen = 0;
	int r;

	if (t) {
		struct rtxn *tx = (struct rtxn *)t;
		char *v;

		if ((flags & CKPT_TXN_FOR_UPDATE) && (r = track(tx, key, klen, false)) < 0)
			return r;
		v = rocksdb_writebatch_wi_get_from_batch_and_db(tx->wb, x->db, x->ropts, key, klen,
								 &vlen, &err);
		if (err)
			return rocks_errno(err);
		if (!v)
			return -ENOENT;
		r = fn(arg, (const uint8_t *)v, vlen);
		rocksdb_free(v);
	} else {
		rocksdb_pinnableslice_t *ps = rocksdb_get_pinned(x->db, x->ropts, key, klen, &err);
		const char *v;

		if (err)
			return rocks_errno(err);
		if (!ps)
			return -ENOENT;
		v = rocksdb_pinnableslice_value(ps, &vlen);

		r = fn(arg, (const uint8_t *)v, vlen);
		rocksdb_pinnableslice_destroy(ps);
	}
	return r;
}

static int rdb_begin(ckpt_engine *e, ckpt_txn **ret)
{
	struct rdb *x = (struct rdb *)e;
	struct rtxn *t;

	if (x->read_only)
		return -EROFS;
	pthread_mutex_lock(&x->occ_lock);
	t = x->nspare ? x->spare[--x->nspare] : NULL;
	pthread_mutex_unlock(&x->occ_lock);
	if (!t) { /* a write batch costs an allocation of its arena: reuse them */
		t = calloc(1, sizeof(*t));
		if (!t)
			return -ENOMEM;
		t->base.engine = e;
		t->wb = rocksdb_writebatch_wi_create(0, 1);
	}
	pthread_mutex_lock(&x->occ_lock);
	t->start = x->seq;
	pthread_mutex_unlock(&x->occ_lock);
	*ret = &t->base;
	return 0;
}

static int rdb_put(ckpt_txn *t, const void *key, size_t klen, const void *val, size_t vlen)
{
	struct rtxn *tx = (struct rtxn *)t;
	int r = track(tx, key, klen, true);

	if (r == 0)
		rocksdb_writebatch_wi_put(tx->wb, key, klen, val, vlen);
	return r;
}

static int rdb_del(ckpt_txn *t, const void *key, size_t klen)
{
	struct rtxn *tx = (struct rtxn *)t;
	int r = track(tx, key, klen, true);

	if (r == 0)
		rocksdb_writebatch_wi_delete(tx->wb, key, klen);
	return r;
}

static int rdb_sync(ckpt_engine *e)
{
	char *err = NULL;

	rocksdb_flush_wal(((struct rdb *)e)->db, 1, &err);
	return rocks_errno(err);
}

static void rdb_abort(ckpt_txn *t)
{
	struct rtxn *tx = (struct rtxn *)t;
	struct rdb *x = (struct rdb *)t->engine;

	rocksdb_writebatch_wi_clear(tx->wb); /* unapplied writes dropped */
	tx->n = 0;
	tx->base.err = 0;
	pthread_mutex_lock(&x->occ_lock);
	if (x->nspare < TXN_SPARE && tx->cap <= 4096) {
		x->spare[x->nspare++] = tx;
		tx = NULL;
	}
	pthread_mutex_unlock(&x->occ_lock);
	if (tx) {
		rocksdb_writebatch_wi_destroy(tx->wb);
		free(tx->slots);
		free(tx);
	}
}

static int rdb_commit(ckpt_txn *t, bool durable)
{
	struct rtxn *tx = (struct rtxn *)t;
	struct rdb *x = (struct rdb *)t->engine;
	char *err = NULL;
	bool writes = false;
	int r = 0;

	pthread_mutex_lock(&x->occ_lock);
	for (size_t i = 0; i < tx->n; i++) {
		if (x->last[tx->slots[i] & ~SLOT_WRITTEN] > tx->start) {
			r = -EAGAIN; /* a commit since our begin wrote a key we track */
			break;
		}
		writes |= (tx->slots[i] & SLOT_WRITTEN) != 0;
	}
	if (r == 0 && writes) {
		rocksdb_write_writebatch_wi(x->db, x->wopts, tx->wb, &err);
		r = rocks_errno(err);
		if (r == 0) {
			x->seq++;
			for (size_t i = 0; i < tx->n; i++)
				if (tx->slots[i] & SLOT_WRITTEN)
					x->last[tx->slots[i] & ~SLOT_WRITTEN] = x->seq;
		}
	}
	pthread_mutex_unlock(&x->occ_lock);
	rdb_abort(t);
	if (r == 0 && writes && durable)
		r = rdb_sync(&x->base);
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
		/* takes over the base iterator */
		s->it = rocksdb_writebatch_wi_create_iterator_with_base(
			((struct rtxn *)t)->wb, rocksdb_create_iterator(x->db, s->ropts));
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
