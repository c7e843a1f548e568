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
 * occ_lock, so that a sync does not hold up other commits.  With a
 * metadata log (engine.h), a commit appends its record to it under
 * occ_lock, before its batch is written, stamped with the sequence number
 * RocksDB will have after the batch (its latest one plus the batch's
 * count: every write of the engine runs under occ_lock, but the open's
 * trim_wals, before the log is attached); quiesce runs under occ_lock too.
 * A read-only engine is a read-only DB without the lock file; beginning a
 * transaction on it fails with -EROFS.
 *
 * Full disks (docs/design.md section 3.1).  RocksDB 7.8 as Debian builds it
 * keeps its assertions: once an append to a file fails (ENOSPC), the next
 * append, sync or close of that file aborts the process.  Its info LOG is
 * such a file, and its write-ahead log too.  So RocksDB is never asked to
 * write when space is short:
 *  - its info LOG gets its header at open and nothing after (HEADER level);
 *  - memtables are sized from the filesystem (SPACE_WBUF), so that a flush,
 *    and RocksDB's own recovery from a write error (which waits until that
 *    much is free), need little;
 *  - every write (a commit, a flush) first checks the free space of the
 *    filesystem (space_check): an ordinary write needs `guard` bytes free
 *    beyond itself, else it fails with -ENOSPC; a write that releases space
 *    (ckpt_txn_releases_space: deleting files) needs only `floor`, and may
 *    first give back the reserve file (RESERVE_NAME, `reserve` bytes kept
 *    allocated in the index directory while space allows), so that files
 *    can be deleted through the mount on a disk that something else filled;
 *  - if RocksDB still fails a write (another program took the space in
 *    between), the engine marks itself failed: it gives back the reserve,
 *    makes no sync and no flush until a write succeeds again (RocksDB
 *    recovers by itself once `wbuf` bytes are free), and leaves the database
 *    unclosed at close if it never did (the next open replays its log).
 */
#include "meta/engine.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <rocksdb/c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/util.h"
#include "base/xxh.h"

#define PREFIX_MAX 512
#define OCC_SLOTS (1u << 18)
#define TXN_SPARE 4

#define RESERVE_NAME "ckptfs-reserve"
#define SPACE_CHECK_NS (10 * 1000000ll) /* statvfs at most this often while far from full */
/* RocksDB's InfoLogLevel: HEADER_LEVEL, what is logged at open only */
#define ROCKS_LOG_HEADER 5

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

	/* The space guard (see the top of this file).  Immutable after open: */
	char *dir;
	int dirfd;      /* the index directory (statvfs, the reserve file) */
	uint64_t wbuf;  /* write_buffer_size */
	uint64_t guard; /* free bytes an ordinary write leaves */
	uint64_t floor; /* free bytes a write that releases space leaves */
	uint64_t reserve; /* size of the reserve file */
	pthread_mutex_t space_lock; /* taken inside occ_lock or alone */
	/* Protected by space_lock: */
	bool reserve_held; /* the reserve file exists, `reserve` bytes allocated */
	bool failed;       /* a write failed in RocksDB and none succeeded since */
	int failed_err;    /* its error */
	bool refusing;     /* writes are being refused (logged once) */
	int64_t checked_ns; /* last statvfs, and what it found free */
	uint64_t avail;
	uint64_t written;   /* bytes written since (an estimate: batch sizes) */
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

/* ------------------------------------------------------------ space guard */

/* Free bytes of the index's filesystem now (for an unprivileged writer), or
 * UINT64_MAX when it cannot be told.  Caller holds space_lock. */
static uint64_t space_now_locked(struct rdb *x)
{
	struct statvfs st;

	if (fstatvfs(x->dirfd, &st) < 0)
		return UINT64_MAX;
	x->avail = (uint64_t)st.f_bavail * st.f_frsize;
	x->written = 0;
	x->checked_ns = ckpt_mono_ns();
	return x->avail;
}

/* Allocate the reserve file while there is room for it and more.  Caller
 * holds space_lock. */
static void reserve_make_locked(struct rdb *x, uint64_t avail)
{
	int fd;

	if (x->reserve_held || x->reserve == 0 || avail < x->guard + x->reserve + x->wbuf)
		return;
	fd = openat(x->dirfd, RESERVE_NAME, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	if (posix_fallocate(fd, 0, (off_t)x->reserve) == 0) {
		x->reserve_held = true;
	} else {
		(void)ftruncate(fd, 0);
	}
	close(fd);
	if (x->reserve_held)
		(void)space_now_locked(x);
}

/* Give the reserve file's space back to the filesystem.  Caller holds
 * space_lock. */
static void reserve_release_locked(struct rdb *x)
{
	if (!x->reserve_held)
		return;
	(void)unlinkat(x->dirfd, RESERVE_NAME, 0);
	x->reserve_held = false;
	ckpt_warn("index %s: filesystem nearly full: gave back the index's reserve of %" PRIu64
		  " bytes", x->dir, x->reserve);
	(void)space_now_locked(x);
}

/*
 * May RocksDB write about `bytes` now?  0, or -ENOSPC (logged once per
 * episode).  releases: the write releases space (it may use the floor and
 * the reserve).  A recent statvfs far from the limits is reused, less what
 * was written since.
 */
static int space_check(struct rdb *x, uint64_t bytes, bool releases)
{
	uint64_t avail, need = x->guard + bytes;
	int r = 0;

	pthread_mutex_lock(&x->space_lock);
	avail = x->avail > x->written ? x->avail - x->written : 0;
	if (x->failed || avail < 2 * need || ckpt_mono_ns() - x->checked_ns > SPACE_CHECK_NS)
		avail = space_now_locked(x);
	if (avail == UINT64_MAX)
		goto out; /* cannot tell: let RocksDB try */
	if (avail >= need) {
		reserve_make_locked(x, avail);
		if (x->refusing)
			ckpt_warn("index %s: %" PRIu64 " bytes free again: metadata changes work "
				  "again", x->dir, avail);
		x->refusing = false;
		goto out;
	}
	if (releases && avail < x->floor + bytes) {
		reserve_release_locked(x);
		avail = x->avail;
	}
	if (!releases || avail < x->floor + bytes)
		r = -ENOSPC;
	if (r < 0 && !x->refusing) {
		x->refusing = true;
		ckpt_warn("index %s: %" PRIu64 " bytes free, less than the %" PRIu64 " the index "
			  "keeps for itself: metadata changes fail with ENOSPC (deleting files "
			  "works while %" PRIu64 " bytes are free)", x->dir, avail, x->guard,
			  x->floor);
	}
out:
	if (r == 0)
		x->written += bytes;
	pthread_mutex_unlock(&x->space_lock);
	return r;
}

/* Record the outcome of a RocksDB write: a failure may have poisoned one of
 * its files (see the top of this file). */
static void write_done(struct rdb *x, int r)
{
	pthread_mutex_lock(&x->space_lock);
	if (r == 0) {
		if (x->failed)
			ckpt_warn("index %s: writes work again", x->dir);
		x->failed = false;
	} else if (r != -EAGAIN) {
		if (!x->failed)
			ckpt_warn("index %s: a write failed (%s): no syncs or flushes of the index "
				  "until one succeeds", x->dir, strerror(-r));
		x->failed = true;
		x->failed_err = r;
		reserve_release_locked(x); /* room for RocksDB to recover */
	}
	pthread_mutex_unlock(&x->space_lock);
}

/* The error of the last failed write while no write succeeded since, else
 * 0. */
static int write_failed(struct rdb *x)
{
	int r;

	pthread_mutex_lock(&x->space_lock);
	r = x->failed ? x->failed_err : 0;
	pthread_mutex_unlock(&x->space_lock);
	return r;
}

/* The memtable size for a filesystem of `total` bytes: 1/64 of it, between
 * 1 and 64 MiB (RocksDB's default). */
static uint64_t wbuf_for(uint64_t total)
{
	uint64_t w = total / 64;

	w &= ~((1ull << 20) - 1);
	return CKPT_MIN(CKPT_MAX(w, 1ull << 20), 64ull << 20);
}

/* Before a read-write open: size the memtables, the guard and the reserve
 * from the filesystem of dir (or of its parent when dir does not exist
 * yet), and make sure that RocksDB has room to open: with less than
 * `floor` free, the reserve file (if there is one) is given back first, and
 * the open fails with -ENOSPC if that is still not enough. */
static int space_plan(struct rdb *x, char *errbuf, size_t errlen)
{
	struct statvfs st;
	uint64_t avail;
	char *parent;
	int r = statvfs(x->dir, &st);

	if (r < 0 && errno == ENOENT && (parent = strdup(x->dir))) {
		char *slash = strrchr(parent, '/');

		if (slash && slash != parent)
			*slash = '\0';
		else
			strcpy(parent, slash ? "/" : ".");
		r = statvfs(parent, &st);
		free(parent);
	}
	if (r < 0)
		return 0; /* cannot tell: RocksDB's defaults */
	x->wbuf = wbuf_for((uint64_t)st.f_blocks * st.f_frsize);
	x->guard = 2 * x->wbuf + (1ull << 20);
	x->floor = 512ull << 10;
	x->reserve = x->wbuf + (1ull << 20);
	avail = (uint64_t)st.f_bavail * st.f_frsize;
	if (avail >= x->floor + x->wbuf)
		return 0;
	{
		int dfd = open(x->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

		if (dfd >= 0 && unlinkat(dfd, RESERVE_NAME, 0) == 0) {
			ckpt_warn("index %s: filesystem nearly full (%" PRIu64 " bytes free): gave "
				  "back the index's reserve to open", x->dir, avail);
			if (fstatvfs(dfd, &st) == 0)
				avail = (uint64_t)st.f_bavail * st.f_frsize;
		}
		if (dfd >= 0)
			close(dfd);
	}
	if (avail >= x->floor)
		return 0;
	snprintf(errbuf, errlen, "cannot open index %s: only %" PRIu64 " bytes free on its "
		 "filesystem, RocksDB needs at least %" PRIu64 " to open: free some space",
		 x->dir, avail, x->floor);
	return -ENOSPC;
}

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
	r = space_check(x, sizeof(key) + x->wbuf, false);
	if (r < 0)
		return r;
	rocksdb_delete(x->db, x->wopts, key, sizeof(key), &err);
	r = rocks_errno(err);
	write_done(x, r);
	if (r == 0)
		r = rdb_flush(&x->base);
	return r;
}

/* Whether the database may be closed: closing after a failed write that no
 * write followed aborts RocksDB if that write poisoned a file (see the top
 * of this file).  One write is tried (a tombstone of a key that never
 * exists) to find out whether RocksDB recovered. */
static bool closable(struct rdb *x)
{
	static const char key[] = { 'M', 'w', 'a', 'l', '-', 't', 'r', 'i', 'm' };
	char *err = NULL;
	int r;

	if (!write_failed(x))
		return true;
	rocksdb_delete(x->db, x->wopts, key, sizeof(key), &err);
	r = rocks_errno(err);
	write_done(x, r);
	if (r == 0)
		return true;
	ckpt_err("index %s: left open after a failed write (%s): the next open replays its log",
		 x->dir, strerror(-r));
	return false;
}

static void rdb_close(ckpt_engine *e)
{
	struct rdb *x = (struct rdb *)e;

	if (x->db && (x->read_only || closable(x)))
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
		ckpt_txn_base_free(&x->spare[i]->base);
		free(x->spare[i]->slots);
		free(x->spare[i]);
	}
	pthread_mutex_destroy(&x->occ_lock);
	pthread_mutex_destroy(&x->space_lock);
	if (x->dirfd >= 0)
		close(x->dirfd);
	free(x->dir);
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
	x->dirfd = -1;
	pthread_mutex_init(&x->occ_lock, NULL);
	pthread_mutex_init(&x->space_lock, NULL);
	x->dir = strdup(dir);
	if (!x->dir) {
		snprintf(errbuf, errlen, "out of memory");
		rdb_close(&x->base);
		return r;
	}
	if (!o->read_only) {
		x->last = calloc(OCC_SLOTS, sizeof(*x->last));
		if (!x->last) {
			snprintf(errbuf, errlen, "out of memory");
			rdb_close(&x->base);
			return r;
		}
		r = space_plan(x, errbuf, errlen);
		if (r < 0) {
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
	rocksdb_options_set_info_log_level(x->opts, ROCKS_LOG_HEADER);
	if (x->wbuf)
		rocksdb_options_set_write_buffer_size(x->opts, (size_t)x->wbuf);
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
	if (o->read_only) {
		/* The writer's compactions delete table files: one the MANIFEST
		 * we read still named may be gone by the time it is opened.  Read
		 * the new MANIFEST. */
		for (int tries = 0;; tries++) {
			x->db = rocksdb_open_for_read_only(x->opts, dir, 0, &err);
			if (!err || tries >= 20 || !strstr(err, "No such file or directory"))
				break;
			rocksdb_free(err);
			err = NULL;
			usleep(10000);
		}
	} else {
		x->db = rocksdb_open(x->opts, dir, &err);
	}
	if (err) {
		snprintf(errbuf, errlen, "cannot open index %s: %s", dir, err);
		/* the writer's LOCK file held elsewhere ("While lock file: ...",
		 * "lock hold by current process"), not "block checksum" */
		r = strstr(err, "lock file") || strstr(err, "lock hold by") ? -EBUSY : -EIO;
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
		x->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (x->dirfd < 0) {
			r = -errno;
			snprintf(errbuf, errlen, "cannot open index %s: %s", dir, strerror(-r));
			rdb_close(&x->base);
			return r;
		}
		pthread_mutex_lock(&x->space_lock);
		{
			struct stat st;

			x->reserve_held = fstatat(x->dirfd, RESERVE_NAME, &st, 0) == 0 &&
					  (uint64_t)st.st_blocks * 512 >= x->reserve;
		}
		reserve_make_locked(x, space_now_locked(x));
		pthread_mutex_unlock(&x->space_lock);
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
	struct rdb *x = (struct rdb *)e;
	char *err = NULL;
	int r = write_failed(x);

	if (r < 0)
		return r; /* the log may be poisoned: syncing it would abort */
	rocksdb_flush_wal(x->db, 1, &err);
	return rocks_errno(err);
}

static void rdb_abort(ckpt_txn *t)
{
	struct rtxn *tx = (struct rtxn *)t;
	struct rdb *x = (struct rdb *)t->engine;

	rocksdb_writebatch_wi_clear(tx->wb); /* unapplied writes dropped */
	tx->n = 0;
	tx->base.err = 0;
	ckpt_txn_base_trim(&tx->base);
	pthread_mutex_lock(&x->occ_lock);
	if (x->nspare < TXN_SPARE && tx->cap <= 4096) {
		x->spare[x->nspare++] = tx;
		tx = NULL;
	}
	pthread_mutex_unlock(&x->occ_lock);
	if (tx) {
		rocksdb_writebatch_wi_destroy(tx->wb);
		ckpt_txn_base_free(&tx->base);
		free(tx->slots);
		free(tx);
	}
}

static int rdb_commit(ckpt_txn *t, bool durable)
{
	struct rtxn *tx = (struct rtxn *)t;
	struct rdb *x = (struct rdb *)t->engine;
	char *err = NULL;
	bool writes = false, wrote = false;
	size_t bytes = 0;
	uint64_t stamp = 0;
	int r = 0;

	if (rocksdb_writebatch_wi_count(tx->wb) > 0) {
		(void)rocksdb_writebatch_wi_data(tx->wb, &bytes);
		/* the metadata log's record of the batch takes about as much
		 * again, on the same filesystem */
		if (t->engine->mlog)
			bytes *= 2;
		r = space_check(x, bytes, t->releases_space);
		if (r < 0) {
			rdb_abort(t);
			return r;
		}
	}
	pthread_mutex_lock(&x->occ_lock);
	for (size_t i = 0; i < tx->n; i++) {
		if (x->last[tx->slots[i] & ~SLOT_WRITTEN] > tx->start) {
			r = -EAGAIN; /* a commit since our begin wrote a key we track */
			break;
		}
		writes |= (tx->slots[i] & SLOT_WRITTEN) != 0;
	}
	if (r == 0 && writes) {
		stamp = rocksdb_get_latest_sequence_number(x->db) +
			(uint64_t)rocksdb_writebatch_wi_count(tx->wb);
		r = ckpt_engine_log_commit(t, stamp);
	}
	if (r == 0 && writes) {
		rocksdb_write_writebatch_wi(x->db, x->wopts, tx->wb, &err);
		r = rocks_errno(err);
		wrote = true;
		if (r < 0)
			ckpt_engine_log_undo(t);
		else if (t->engine->mlog && rocksdb_get_latest_sequence_number(x->db) != stamp)
			ckpt_engine_log_stale(t->engine);
		if (r == 0) {
			x->seq++;
			for (size_t i = 0; i < tx->n; i++)
				if (tx->slots[i] & SLOT_WRITTEN)
					x->last[tx->slots[i] & ~SLOT_WRITTEN] = x->seq;
		}
	}
	pthread_mutex_unlock(&x->occ_lock);
	rdb_abort(t);
	if (wrote)
		write_done(x, r);
	if (r == 0 && writes && durable)
		r = rdb_sync(&x->base);
	return r;
}

static int rdb_flush(ckpt_engine *e)
{
	struct rdb *x = (struct rdb *)e;
	uint64_t mem = 0;
	char *err = NULL;
	int r = write_failed(x);

	if (r < 0)
		return r;
	/* the memtables become a table file: only with room for it, else
	 * their log stays for the next open to replay */
	if (rocksdb_property_int(x->db, "rocksdb.cur-size-all-mem-tables", &mem) != 0)
		mem = x->wbuf;
	if (space_check(x, mem, false) == 0) {
		rocksdb_flush(x->db, x->fopts, &err);
		if (err)
			return rocks_errno(err);
	}
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

static uint64_t rdb_stamp(ckpt_engine *e)
{
	return rocksdb_get_latest_sequence_number(((struct rdb *)e)->db);
}

static int rdb_quiesce(ckpt_engine *e, int (*fn)(void *arg), void *arg)
{
	struct rdb *x = (struct rdb *)e;
	int r;

	pthread_mutex_lock(&x->occ_lock);
	r = fn(arg);
	pthread_mutex_unlock(&x->occ_lock);
	return r;
}

/* RocksDB's RepairDB: a new MANIFEST from the table files that read whole
 * (a table with a damaged block is moved to lost/ with all its keys), and
 * the write-ahead logs turned into tables, skipping damaged records. */
static int rdb_salvage(const char *dir, char *errbuf, size_t errlen)
{
	rocksdb_options_t *o = rocksdb_options_create();
	char *err = NULL;
	int r = 0;

	rocksdb_repair_db(o, dir, &err);
	if (err) {
		ckpt_errf(errbuf, errlen, "%s: RocksDB repair failed: %s", dir, err);
		rocksdb_free(err);
		r = -EIO;
	}
	rocksdb_options_destroy(o);
	return r;
}

const struct ckpt_engine_ops ckpt_engine_rocksdb = {
	.name = "rocksdb",
	.shared = false,
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
	.quiesce = rdb_quiesce,
	.stamp = rdb_stamp,
	.salvage = rdb_salvage,
};
