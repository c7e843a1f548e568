/* SPDX-License-Identifier: MIT */
/*
 * store.c - chunk store and namespace over packs + RocksDB.
 *
 * Invariants:
 *  I1. Every extent of kind CHUNK in a committed extent list names a digest
 *      with a 'C' entry in the index whose pack record exists and was
 *      fdatasync'ed before the batch that created the entry was written.
 *  I2. refcount('C' d) == number of CHUNK extents naming d over all 'F'
 *      records.  Commit and reap update both in one batch under ns_lock.
 *  I3. A digest in the pending table has a complete record in a pack of this
 *      process (append returned).  Lookups consult pending first, then the
 *      index, so a chunk moving from pending to the index is never missed:
 *      it is removed from pending only after its index batch is written.
 *  I4. Directory nlink = 2 + number of subdirectories; every other inode's
 *      nlink = number of dentries naming it.  nlink 0 <=> 'O' key present.
 *  I5. next_ino / next_pack in memory are >= every id in use.  next_ino is
 *      persisted in the batch that first uses a new value; next_pack is
 *      persisted (synced) before the pack file is created.
 */
#include "store/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <linux/aio_abi.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "chunk/cache.h"
#include "chunk/chunker.h"
#include "chunk/compress.h"
#include "chunk/pack.h"
#include "base/util.h"

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

#define MARKER_NAME "ckptfs-store"
#define MARKER_MAGIC "ckptfs-store"

struct pending {
	ckpt_digest digest;
	struct ckpt_chunk_loc loc;
	struct pending *next;
};

#define PENDING_BUCKETS 4096

/* A closed file's new content, visible through the store but not yet in the
 * index (see "overlay" in the header comment of store.h). */
struct commit {
	uint64_t ino;
	struct ckpt_extent_list *list;
	uint32_t flags;
	int64_t mtime_ns;
	uint64_t seq; /* bumped on every replacement */
	struct commit *next;
};

#define COMMIT_BUCKETS 1024
#define CKPT_OVERLAY_FLUSH_BYTES (256ull << 20)

struct ckpt_store {
	char *path;
	struct ckpt_store_opts opts;
	int lock_fd;
	int packs_fd;
	ckpt_index *ix;
	ckpt_hasher *hasher;
	ckpt_cache *cache;
	uint8_t uuid[16];
	pthread_key_t tls_key; /* per-thread compressor/decompressor */
	pthread_mutex_t rctx_lock;
	struct rctx *rctx_free; /* read contexts not in use (rctx_get), rctx_lock */
	unsigned rctx_nfree;    /* their number, rctx_lock */
	uint64_t rctx_made, rctx_warm; /* made in all, made at open (rctx_lock) */
	struct ckpt_prefetch_stats pf_stats; /* read-ahead's requests (atomic adds) */

	pthread_mutex_t ns_lock;
	/* Protected by ns_lock: */
	uint64_t next_ino;

	/* Readers hold pack_rw (read) while they use a sealed pack's object;
	 * compaction takes it (write) to free the object of a deleted pack, so
	 * that its disk space is released without waiting for unmount.
	 * Read-ahead holds it while it submits reads (pf_submit), not until
	 * they complete: a submitted read holds its own reference to the file. */
	pthread_rwlock_t pack_rw;
	pthread_mutex_t pack_lock;
	/* Protected by pack_lock: */
	ckpt_pack **packs; /* opened packs, any order */
	size_t npacks, cap_packs;
	ckpt_pack *wpack;  /* current append target (also in packs[]) */
	ckpt_pack *bgpack; /* append target of background work: compressed and
			    * moved chunks stay apart from fresh raw ones, so
			    * packs of raw data die whole and need no copying */
	uint64_t next_pack;

	pthread_mutex_t pending_lock;
	/* Protected by pending_lock: */
	struct pending *pending[PENDING_BUCKETS];

	/* Lock order: commit_lock -> ns_lock -> {pack,pending,overlay}_lock. */
	pthread_mutex_t commit_lock; /* serializes writers of file content to the index */
	pthread_mutex_t overlay_lock;
	/* Protected by overlay_lock: */
	struct commit *overlay[COMMIT_BUCKETS];
	size_t overlay_n;
	uint64_t overlay_bytes, overlay_seq;
	bool flusher_stop;
	pthread_cond_t flusher_cond;
	/* Immutable after open: */
	bool flusher_started;
	pthread_t flusher;

	/* Background compression and compaction (store.h, "Background work").
	 * Lock order: bg_lock is never held while taking another lock. */
	pthread_mutex_t bg_lock;
	pthread_cond_t bg_cond;
	/* Protected by bg_lock: */
	struct bg_item *bgq;
	size_t bgq_head, bgq_n, bgq_cap;
	bool bg_stop, bg_busy, bg_compact_clean;
	struct ckpt_bg_stats bg;
	/* Atomic: */
	atomic_llong last_put_ns;
	atomic_int puts_inflight;
	uint64_t *bg_skip; /* background thread only */
	size_t nbg_skip;
	bool bg_started;
	pthread_t bg_thread;
};

struct bg_item {
	ckpt_digest d;
	uint8_t elem;
};

static struct commit *overlay_find_locked(ckpt_store *s, uint64_t ino);
static int db_load_extents(ckpt_store *s, uint64_t ino, struct ckpt_extent_list **ret_list);

/*
 * Span buffers of read-ahead (ckpt_store_prefetch_begin): SPAN_BUF bytes
 * each, aligned to 2 MiB and advised MADV_HUGEPAGE.  This virtio disk
 * serves O_DIRECT reads into huge pages about twice as fast as into 4 KiB
 * pages, at any request size from 512 KiB to 4 MiB (docs/performance.md
 * 6d, 6e).  A thread has PF_INFLIGHT of them: one per batch it has begun
 * and not finished.
 */
#define SPAN_MAX (4u << 20) /* one request */
#define SPAN_BUF (8u << 20) /* the spans of one batch */
#define SPAN_ALIGN CKPT_HUGE_ALIGN
#define SPAN_GAP (64u << 10) /* records this far apart still share a span */
#define PF_INFLIGHT CKPT_PREFETCH_INFLIGHT /* batches begun and not finished */
#define PF_SPANS 16         /* requests of one batch; the rest load alone */

struct tls_ctx {
	ckpt_compressor *cc;
	ckpt_decompressor *dc;
	void *span_map[PF_INFLIGHT]; /* SPAN_BUF + SPAN_ALIGN bytes each, or NULL */
	uint8_t *span[PF_INFLIGHT];  /* SPAN_BUF bytes inside, 2 MiB aligned */
	bool span_busy[PF_INFLIGHT]; /* held by a batch begun and not finished */
	aio_context_t aio; /* the thread's kernel AIO context (aio_state 1) */
	int aio_state;     /* 0 not set up yet, 1 set up, -1 unavailable */
};

static void tls_free(void *p)
{
	struct tls_ctx *t = p;

	if (!t)
		return;
	ckpt_compressor_free(t->cc);
	ckpt_decompressor_free(t->dc);
	/* every batch was finished: no read is in flight */
	if (t->aio_state == 1)
		(void)syscall(SYS_io_destroy, t->aio);
	for (int i = 0; i < PF_INFLIGHT; i++)
		if (t->span_map[i])
			munmap(t->span_map[i], SPAN_BUF + SPAN_ALIGN);
	free(t);
}

/*
 * Read contexts: what one chunk load by verify_chunk() works in (a record
 * buffer for its O_DIRECT read and a decompressor), borrowed from the
 * store's free list for that one load by whatever thread loads it.  They
 * used to be per thread; but libfuse starts and ends worker threads as the
 * load changes (eight started during one cold four-reader view read), and
 * a new thread's first load faulted in and zeroed a new record buffer and
 * decompressor: 7.5% of the daemon's CPU time in that read
 * (docs/performance.md 6l).  The free list outlives the threads, and when
 * the store opens with touch_at_open() RCTX_WARM of them are made and
 * touched for chunks of the default chunker's maximum size.  At most
 * RCTX_KEEP are kept free; a load finding none makes one.
 *
 * The record buffer: huge pages, since this virtio disk serves O_DIRECT
 * reads into huge pages at 2.2-2.6 GB/s and into 4 KiB pages at 1.05-1.08
 * whatever the request size (docs/performance.md 6e).
 */
#define RCTX_WARM 4
#define RCTX_KEEP 16

struct rctx {
	ckpt_decompressor *dc;
	void *rec_map;  /* rec_cap + SPAN_ALIGN bytes, or NULL */
	uint8_t *rec;   /* rec_cap bytes, 2 MiB aligned */
	size_t rec_cap; /* a multiple of SPAN_ALIGN, at most SPAN_BUF */
	struct rctx *next; /* on the free list */
};

static void rctx_free(struct rctx *x)
{
	if (!x)
		return;
	ckpt_decompressor_free(x->dc);
	if (x->rec_map)
		munmap(x->rec_map, x->rec_cap + SPAN_ALIGN);
	free(x);
}

/* A new read context, counted in s->rctx_made; NULL without memory. */
static struct rctx *rctx_new(ckpt_store *s)
{
	struct rctx *x = calloc(1, sizeof(*x));

	if (!x)
		return NULL;
	if (ckpt_decompressor_new(&x->dc) < 0) {
		free(x);
		return NULL;
	}
	/* every decoded chunk is checked against its keyed digest */
	ckpt_decompressor_skip_checksum(x->dc);
	pthread_mutex_lock(&s->rctx_lock);
	s->rctx_made++;
	pthread_mutex_unlock(&s->rctx_lock);
	return x;
}

/* x's record buffer, at least need bytes (need <= SPAN_BUF); NULL without
 * memory (x keeps its old buffer). */
static uint8_t *rctx_rec(struct rctx *x, size_t need)
{
	size_t cap = (need + SPAN_ALIGN - 1) / SPAN_ALIGN * SPAN_ALIGN;
	void *m;
	uint8_t *a;

	if (x->rec && x->rec_cap >= need)
		return x->rec;
	a = ckpt_map_huge(cap, &m);
	if (!a)
		return NULL;
	if (x->rec_map)
		munmap(x->rec_map, x->rec_cap + SPAN_ALIGN);
	x->rec_map = m;
	x->rec = a;
	x->rec_cap = cap;
	return a;
}

/* A read context off the free list, or a new one; NULL without memory. */
static struct rctx *rctx_get(ckpt_store *s)
{
	struct rctx *x;

	pthread_mutex_lock(&s->rctx_lock);
	x = s->rctx_free;
	if (x) {
		s->rctx_free = x->next;
		s->rctx_nfree--;
	}
	pthread_mutex_unlock(&s->rctx_lock);
	return x ? x : rctx_new(s);
}

static void rctx_put(ckpt_store *s, struct rctx *x)
{
	pthread_mutex_lock(&s->rctx_lock);
	if (s->rctx_nfree < RCTX_KEEP) {
		x->next = s->rctx_free;
		s->rctx_free = x;
		s->rctx_nfree++;
		x = NULL;
	}
	pthread_mutex_unlock(&s->rctx_lock);
	rctx_free(x);
}

/* Make RCTX_WARM read contexts, sized for the default chunker's largest
 * chunk and touched (touch_at_open()).  Failing is not an error: loads
 * then make their own. */
static void rctx_warm(ckpt_store *s)
{
	size_t need = ckpt_pack_direct_len(CKPT_PACK_DIRECT_ALIGN - 1, CKPT_CDC_DEFAULT_MAX);

	for (int i = 0; i < RCTX_WARM; i++) {
		struct rctx *x = rctx_new(s);

		if (!x)
			return;
		if (!rctx_rec(x, need) || ckpt_decompressor_reserve(x->dc, CKPT_CDC_DEFAULT_MAX) < 0) {
			rctx_free(x);
			return;
		}
		ckpt_mem_populate(x->rec, x->rec_cap);
		pthread_mutex_lock(&s->rctx_lock);
		s->rctx_warm++;
		pthread_mutex_unlock(&s->rctx_lock);
		rctx_put(s, x);
	}
}

/* The thread's span buffer i, mapped on first use; NULL without memory. */
static uint8_t *tls_span(struct tls_ctx *t, int i)
{
	if (!t->span[i])
		t->span[i] = ckpt_map_huge(SPAN_BUF, &t->span_map[i]);
	return t->span[i];
}

/* A free span buffer of the thread, marked busy: its index, or -1 when
 * both are held or there is no memory. */
static int tls_span_take(struct tls_ctx *t)
{
	for (int i = 0; i < PF_INFLIGHT; i++) {
		if (t->span_busy[i])
			continue;
		if (!tls_span(t, i))
			return -1;
		t->span_busy[i] = true;
		return i;
	}
	return -1;
}

/*
 * The thread's AIO context, set up on first use: true when it has one.
 * Without one (the kernel lacks AIO, or fs.aio-max-nr is reached) the
 * thread reads its spans with pread; that is logged once per thread.
 */
static bool tls_aio(ckpt_store *s, struct tls_ctx *t)
{
	if (t->aio_state == 0) {
		t->aio = 0;
		if (s->opts.sync_readahead) {
			t->aio_state = -1;
		} else if (syscall(SYS_io_setup, PF_INFLIGHT * PF_SPANS, &t->aio) == 0) {
			t->aio_state = 1;
		} else {
			ckpt_warn("%s: no kernel AIO (%s): read-ahead reads with pread", s->path,
				  strerror(errno));
			t->aio_state = -1;
		}
	}
	return t->aio_state == 1;
}

static struct tls_ctx *tls_get(ckpt_store *s)
{
	struct tls_ctx *t = pthread_getspecific(s->tls_key);

	if (t)
		return t;
	t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	if (ckpt_compressor_new(s->opts.compress_level, &t->cc) < 0 ||
	    ckpt_decompressor_new(&t->dc) < 0) {
		tls_free(t);
		return NULL;
	}
	/* every decoded chunk is checked against its keyed digest */
	ckpt_decompressor_skip_checksum(t->dc);
	pthread_setspecific(s->tls_key, t);
	return t;
}

/* Whether read memory is touched when the store opens (a buffer reserve
 * for the cache, read-ahead's span buffers): -o buf_reserve, not 0. */
static bool touch_at_open(const struct ckpt_store_opts *o)
{
	return o->buf_reserve && o->cache_size;
}

int ckpt_store_prefetch_warm(ckpt_store *s)
{
	struct tls_ctx *t;

	if (!touch_at_open(&s->opts))
		return 0; /* nothing touched ahead of use (buf_reserve=0) */
	t = tls_get(s);
	if (!t)
		return -ENOMEM;
	(void)tls_aio(s, t);
	for (int i = 0; i < PF_INFLIGHT; i++) {
		if (!tls_span(t, i))
			return -ENOMEM;
		ckpt_mem_populate(t->span[i], SPAN_BUF);
	}
	/* the planes of a shuffled chunk, before they are interleaved */
	return ckpt_decompressor_reserve(t->dc, CKPT_CDC_DEFAULT_MAX);
}

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void ckpt_store_opts_init(struct ckpt_store_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->mode = CKPT_STORE_RW;
	o->compress_level = 1;
	o->cache_size = 256u << 20;
	o->pack_max = 1ull << 30;
}

ckpt_index *ckpt_store_index(ckpt_store *s)
{
	return s->ix;
}

const char *ckpt_store_path(const ckpt_store *s)
{
	return s->path;
}

bool ckpt_store_writable(const ckpt_store *s)
{
	return s->opts.mode == CKPT_STORE_RW;
}

bool ckpt_store_put_is_cheap(const ckpt_store *s)
{
	return s->opts.compress_level == 0 || (s->bg_started && !s->opts.inline_compress);
}

int ckpt_store_compress_level(const ckpt_store *s)
{
	return s->opts.compress_level;
}

/* ---------------------------------------------------------------- meta */

static int meta_get_u64(ckpt_store *s, const char *name, uint64_t *ret)
{
	uint8_t key[64], buf[8];
	int r = ckpt_index_get_fixed(s->ix, key, ckpt_key_meta(key, name), buf, 8);

	if (r < 0)
		return r;
	*ret = ckpt_get_le64(buf);
	return 0;
}

static void batch_meta_u64(ckpt_batch *b, const char *name, uint64_t v)
{
	uint8_t key[64], buf[8];

	ckpt_put_le64(buf, v);
	ckpt_batch_put(b, key, ckpt_key_meta(key, name), buf, 8);
}

static void batch_meta_bytes(ckpt_batch *b, const char *name, const void *v, size_t len)
{
	uint8_t key[64];

	ckpt_batch_put(b, key, ckpt_key_meta(key, name), v, len);
}

static void batch_inode(ckpt_batch *b, const struct ckpt_inode *in)
{
	uint8_t key[16], val[CKPT_INODE_REC_LEN];

	ckpt_inode_encode(in, val);
	ckpt_batch_put(b, key, ckpt_key_ino(key, CKPT_KEY_INODE, in->ino), val, sizeof(val));
}

/* ---------------------------------------------------------------- packs */

/* Caller holds pack_lock. */
static ckpt_pack *find_pack_locked(ckpt_store *s, uint64_t id)
{
	for (size_t i = 0; i < s->npacks; i++)
		if (ckpt_pack_id(s->packs[i]) == id)
			return s->packs[i];
	return NULL;
}

static int add_pack_locked(ckpt_store *s, ckpt_pack *p)
{
	if (s->npacks == s->cap_packs) {
		size_t cap = s->cap_packs ? s->cap_packs * 2 : 16;
		ckpt_pack **v = realloc(s->packs, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		s->packs = v;
		s->cap_packs = cap;
	}
	s->packs[s->npacks++] = p;
	return 0;
}

static int get_pack(ckpt_store *s, uint64_t id, ckpt_pack **ret)
{
	ckpt_pack *p;
	int r = 0;

	pthread_mutex_lock(&s->pack_lock);
	p = find_pack_locked(s, id);
	if (!p) {
		r = ckpt_pack_open(s->packs_fd, id, s->uuid, false, &p);
		if (r == 0) {
			r = add_pack_locked(s, p);
			if (r < 0)
				ckpt_pack_free(p);
		} else {
			ckpt_err("%s: cannot open pack %" PRIu64 ": %s", s->path, id, strerror(-r));
		}
	}
	pthread_mutex_unlock(&s->pack_lock);
	if (r == 0)
		*ret = p;
	return r;
}

static int new_pack_locked(ckpt_store *s, ckpt_pack **ret);

/* Start a new write pack.  Caller holds pack_lock. */
static int roll_pack_locked(ckpt_store *s)
{
	ckpt_pack *p;
	int r = new_pack_locked(s, &p);

	if (r == 0)
		s->wpack = p;
	return r;
}

/* Create and register a new pack.  Caller holds pack_lock. */
static int new_pack_locked(ckpt_store *s, ckpt_pack **ret)
{
	ckpt_batch *b;
	ckpt_pack *p = NULL;
	uint64_t id = s->next_pack;
	int r;

	/* Persist the counter first so an id is never reused after a crash. */
	b = ckpt_batch_new();
	if (!b)
		return -ENOMEM;
	batch_meta_u64(b, "next_pack", id + 1);
	r = ckpt_index_write(s->ix, b, true);
	ckpt_batch_free(b);
	if (r < 0)
		return r;
	s->next_pack = id + 1;
	r = ckpt_pack_create(s->packs_fd, id, s->uuid, &p);
	if (r < 0) {
		ckpt_err("%s: cannot create pack %" PRIu64 ": %s", s->path, id, strerror(-r));
		return r;
	}
	r = add_pack_locked(s, p);
	if (r < 0) {
		ckpt_pack_free(p);
		return r;
	}
	*ret = p;
	return 0;
}

/* -------------------------------------------------------------- pending */

static unsigned pending_bucket(const ckpt_digest *d)
{
	uint32_t h;

	memcpy(&h, d->bytes + 4, sizeof(h));
	return h % PENDING_BUCKETS;
}

static bool pending_find(ckpt_store *s, const ckpt_digest *d, struct ckpt_chunk_loc *ret)
{
	struct pending *p;
	bool found = false;

	pthread_mutex_lock(&s->pending_lock);
	for (p = s->pending[pending_bucket(d)]; p; p = p->next) {
		if (memcmp(p->digest.bytes, d->bytes, CKPT_DIGEST_LEN) == 0) {
			if (ret)
				*ret = p->loc;
			found = true;
			break;
		}
	}
	pthread_mutex_unlock(&s->pending_lock);
	return found;
}

/* Insert unless present; returns true if it was inserted. */
static bool pending_add(ckpt_store *s, const ckpt_digest *d, const struct ckpt_chunk_loc *loc)
{
	struct pending *p, *n = malloc(sizeof(*n));
	unsigned b = pending_bucket(d);
	bool added = false;

	pthread_mutex_lock(&s->pending_lock);
	for (p = s->pending[b]; p; p = p->next)
		if (memcmp(p->digest.bytes, d->bytes, CKPT_DIGEST_LEN) == 0)
			break;
	if (!p && n) {
		n->digest = *d;
		n->loc = *loc;
		n->next = s->pending[b];
		s->pending[b] = n;
		n = NULL;
		added = true;
	}
	pthread_mutex_unlock(&s->pending_lock);
	free(n);
	return added;
}

static void pending_remove(ckpt_store *s, const ckpt_digest *d)
{
	struct pending **pp, *p;

	pthread_mutex_lock(&s->pending_lock);
	for (pp = &s->pending[pending_bucket(d)]; (p = *pp); pp = &p->next) {
		if (memcmp(p->digest.bytes, d->bytes, CKPT_DIGEST_LEN) == 0) {
			*pp = p->next;
			free(p);
			break;
		}
	}
	pthread_mutex_unlock(&s->pending_lock);
}

/* --------------------------------------------------------------- chunks */

int ckpt_store_chunk_loc(ckpt_store *s, const ckpt_digest *d, struct ckpt_chunk_loc *ret_loc,
			 uint64_t *ret_refcount)
{
	uint8_t key[32], val[CKPT_CHUNK_REC_LEN];
	int r;

	if (pending_find(s, d, ret_loc)) {
		if (ret_refcount)
			*ret_refcount = 0;
		return 0;
	}
	r = ckpt_index_get_fixed(s->ix, key, ckpt_key_chunk(key, d), val, sizeof(val));
	if (r < 0)
		return r;
	return ckpt_chunk_rec_decode(val, sizeof(val), ret_loc, ret_refcount);
}

static int verify_chunk(ckpt_store *s, const ckpt_digest *d, const struct ckpt_chunk_loc *loc,
			void *dst, bool rec_csum);

int ckpt_store_verify_chunk(ckpt_store *s, const ckpt_digest *d,
			    const struct ckpt_chunk_loc *loc, void *dst)
{
	return verify_chunk(s, d, loc, dst, true);
}

/* Decode the record rec (stored bytes at src) of chunk d into dst (loc->raw_len
 * bytes) and check it against the index entry and the keyed digest.  NULL,
 * or what is wrong. */
static const char *decode_chunk(ckpt_store *s, ckpt_decompressor *dc, const ckpt_digest *d,
				const struct ckpt_chunk_loc *loc, const struct ckpt_pack_rec *rec,
				const uint8_t *src, void *dst)
{
	ckpt_digest check;

	if (memcmp(rec->digest, d->bytes, CKPT_DIGEST_LEN) != 0 || rec->raw_len != loc->raw_len ||
	    rec->codec != loc->codec)
		return "record does not match its index entry";
	if (ckpt_decompress(dc, rec->codec, src, rec->stored_len, dst, rec->raw_len) < 0)
		return "decompression failed";
	ckpt_hash_chunk(s->hasher, dst, rec->raw_len, &check);
	if (memcmp(check.bytes, d->bytes, CKPT_DIGEST_LEN) != 0)
		return "content does not match its digest";
	return NULL;
}

/*
 * rec_csum false (reads through the mount): skip the pack record's checksum
 * of the stored bytes.  The decoded bytes are still checked against the
 * keyed digest, which detects any damage the checksum would; only the
 * message differs ("decompression failed" or "content does not match").
 * fsck and background work keep the full check for precise diagnostics.
 */
static int verify_chunk(ckpt_store *s, const ckpt_digest *d, const struct ckpt_chunk_loc *loc,
			void *dst, bool rec_csum)
{
	struct rctx *x = rctx_get(s);
	struct ckpt_pack_rec rec;
	ckpt_pack *p;
	uint8_t *buf;
	const uint8_t *src = NULL;
	void *mem = NULL;
	char hex[2 * CKPT_DIGEST_LEN + 1];
	const char *why = NULL;
	size_t need;
	int r;

	if (!x)
		return -ENOMEM;
	need = ckpt_pack_direct_len(loc->offset, loc->stored_len);
	/* the context's buffer; a record larger than any chunker makes by
	 * default gets its own */
	buf = need <= SPAN_BUF ? rctx_rec(x, need) : NULL;
	if (!buf && need > SPAN_BUF && posix_memalign(&mem, CKPT_PACK_DIRECT_ALIGN, need) == 0)
		buf = mem;
	if (!buf) {
		r = -ENOMEM;
		goto out;
	}
	pthread_rwlock_rdlock(&s->pack_rw);
	r = get_pack(s, loc->pack_id, &p);
	/* O_DIRECT: no copy out of the page cache, and packs do not fill it */
	if (r == 0) {
		r = ckpt_pack_read_direct(p, loc->offset, loc->stored_len, rec_csum, buf, need,
					  &rec, &src);
		if (r == -EOPNOTSUPP)
			r = 1; /* no O_DIRECT here (tmpfs): through the page cache */
	}
	if (r == 1) {
		/* the same buffer: it holds at least the stored bytes */
		if (rec_csum)
			r = ckpt_pack_read(p, loc->offset, loc->stored_len, &rec, buf);
		else
			r = ckpt_pack_read_trusting(p, loc->offset, loc->stored_len, &rec, buf);
		src = buf;
	}
	pthread_rwlock_unlock(&s->pack_rw);
	if (r == -ENOENT) {
		r = -EIO;
		why = "pack file missing";
		goto out;
	}
	if (r < 0) {
		why = "record header or stored-bytes checksum mismatch";
		goto out;
	}
	why = decode_chunk(s, x->dc, d, loc, &rec, src, dst);
	if (why)
		r = -EIO;
out:
	if (why) {
		ckpt_digest_to_hex(d, hex);
		ckpt_err("%s: chunk %s in pack %" PRIu64 " at offset %" PRIu64 " is damaged: %s",
			 s->path, hex, loc->pack_id, loc->offset, why);
	}
	free(mem);
	rctx_put(s, x);
	return r;
}

/* Read and verify chunk d (uncached) into a new pooled buffer.  known: its
 * location if the caller has just looked it up, else NULL. */
static int load_chunk(ckpt_store *s, const ckpt_digest *d, const struct ckpt_chunk_loc *known,
		      uint8_t **ret_buf, size_t *ret_len)
{
	struct ckpt_chunk_loc loc;
	uint8_t *buf;
	int r;

	if (known) {
		loc = *known;
	} else {
		r = ckpt_store_chunk_loc(s, d, &loc, NULL);
		if (r < 0)
			return r == -ENOENT ? -EIO : r;
	}
	buf = ckpt_cache_buf_alloc(s->cache, loc.raw_len);
	if (!buf)
		return -ENOMEM;
	r = verify_chunk(s, d, &loc, buf, false);
	if (r == -EIO) {
		/* background work may have moved the chunk (and deleted
		 * its old pack) between the lookup and the read */
		struct ckpt_chunk_loc now;
		if (ckpt_store_chunk_loc(s, d, &now, NULL) == 0 &&
		    (now.pack_id != loc.pack_id || now.offset != loc.offset) &&
		    now.raw_len == loc.raw_len) {
			loc = now;
			r = verify_chunk(s, d, &loc, buf, false);
		}
	}
	if (r < 0) {
		ckpt_cache_buf_free(s->cache, buf, loc.raw_len);
		return r;
	}
	*ret_buf = buf;
	*ret_len = loc.raw_len;
	return 0;
}

int ckpt_store_chunk_get(ckpt_store *s, const ckpt_digest *d, bool stream,
			 ckpt_cache_entry **ret_entry, const uint8_t **ret_data, size_t *ret_len)
{
	ckpt_cache_entry *e;
	const uint8_t *data = NULL;
	size_t dlen = 0;
	uint8_t *buf;
	bool fill;
	int r;

	/* Single flight: a chunk being loaded (by another reader or by
	 * read-ahead) is waited for, not loaded twice. */
	e = ckpt_cache_acquire(s->cache, d, &data, &dlen, &fill);
	if (!e)
		return -ENOMEM;
	if (fill) {
		r = load_chunk(s, d, NULL, &buf, &dlen);
		if (r < 0) {
			ckpt_cache_abandon(s->cache, e);
			return r;
		}
		data = ckpt_cache_fill_buf(s->cache, e, buf, dlen, stream, true);
	}
	*ret_entry = e;
	*ret_data = data;
	*ret_len = dlen;
	return 0;
}

void ckpt_store_chunk_put(ckpt_store *s, ckpt_cache_entry *e)
{
	ckpt_cache_release(s->cache, e);
}

struct pf_item {
	const ckpt_digest *d;
	ckpt_cache_entry *e;
	struct ckpt_chunk_loc loc;
	const uint8_t *src;       /* its stored bytes in a span, or NULL: it loads alone */
	struct ckpt_pack_rec rec; /* its checked header (src != NULL) */
};

#define PF_UNREAD INT64_MIN /* pf_span.res: no result yet */

/* One request: the records of items o[i..j), which lie close together in
 * one pack, read as the aligned range [start, start + len) into buf. */
struct pf_span {
	ckpt_prefetch *pf;
	size_t i, j;
	uint64_t pack_id, start;
	size_t len;   /* bytes requested: a multiple of CKPT_PACK_DIRECT_ALIGN */
	size_t need;  /* bytes that must come back: up to the last record's end */
	uint8_t *buf; /* inside the batch's span buffer */
	int64_t res;  /* bytes read, -errno, or PF_UNREAD; until _finish reads
		       * the span itself only an AIO completion sets it */
	struct iocb cb;
};

/*
 * A batch between ckpt_store_prefetch_begin and _finish.  Owned by the
 * thread that began it; its spans' reads are in flight in that thread's
 * AIO context and land in one of that thread's span buffers (slot).
 */
struct ckpt_prefetch {
	struct pf_item *it;  /* the reserved chunks, in the order asked for */
	struct pf_item **o;  /* the same sorted by pack and offset */
	size_t n, m, lost;   /* asked for, reserved, not in the index */
	int slot;            /* the thread's span buffer in use, or -1 */
	size_t nspans, inflight;
	struct pf_span sp[PF_SPANS];
};

static int pf_cmp(const void *a, const void *b)
{
	const struct ckpt_chunk_loc *x = &(*(struct pf_item *const *)a)->loc;
	const struct ckpt_chunk_loc *y = &(*(struct pf_item *const *)b)->loc;

	if (x->pack_id != y->pack_id)
		return x->pack_id < y->pack_id ? -1 : 1;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static uint64_t pf_end(const struct pf_item *it)
{
	return it->loc.offset + CKPT_PACK_REC_HDR_SIZE + it->loc.stored_len;
}

/*
 * Group the sorted items into spans (records that lie close together, one
 * request each, a record alone too) in a span buffer of the thread while
 * they fit in it: items left without one load alone in _finish.
 */
static void pf_plan(struct tls_ctx *t, ckpt_prefetch *pf)
{
	struct pf_item **o = pf->o;
	const uint64_t blk = CKPT_PACK_DIRECT_ALIGN;
	size_t used = 0, i, j;

	for (i = 0; i < pf->m && pf->nspans < PF_SPANS; i = j) {
		uint64_t a = o[i]->loc.offset / blk * blk;
		struct pf_span *sp;
		size_t len;

		for (j = i + 1; j < pf->m; j++)
			if (o[j]->loc.pack_id != o[i]->loc.pack_id || o[j]->loc.offset < pf_end(o[j - 1]) ||
			    o[j]->loc.offset - pf_end(o[j - 1]) > SPAN_GAP || pf_end(o[j]) - a > SPAN_MAX)
				break;
		len = (size_t)((pf_end(o[j - 1]) - a + blk - 1) / blk * blk);
		if (len > SPAN_BUF - used)
			break;
		if (pf->slot < 0 && (pf->slot = tls_span_take(t)) < 0)
			break;
		sp = &pf->sp[pf->nspans++];
		sp->pf = pf;
		sp->i = i;
		sp->j = j;
		sp->pack_id = o[i]->loc.pack_id;
		sp->start = a;
		sp->len = len;
		sp->need = (size_t)(pf_end(o[j - 1]) - a);
		sp->buf = t->span[pf->slot] + used;
		sp->res = PF_UNREAD;
		used += len;
	}
}

/* Submit the spans' reads to the thread's AIO context; the ones that cannot
 * be (no AIO, no O_DIRECT, a refused submission) are read in _finish. */
static void pf_submit(ckpt_store *s, struct tls_ctx *t, ckpt_prefetch *pf)
{
	struct iocb *cbs[PF_SPANS];
	size_t k = 0, done = 0;

	if (!pf->nspans || !tls_aio(s, t))
		return;
	/* the pack lock keeps each descriptor open until its read is submitted */
	pthread_rwlock_rdlock(&s->pack_rw);
	for (size_t i = 0; i < pf->nspans; i++) {
		struct pf_span *sp = &pf->sp[i];
		ckpt_pack *p;
		int fd;

		if (get_pack(s, sp->pack_id, &p) < 0 || (fd = ckpt_pack_direct_fd(p)) < 0)
			continue;
		memset(&sp->cb, 0, sizeof(sp->cb));
		sp->cb.aio_data = (uint64_t)(uintptr_t)sp;
		sp->cb.aio_lio_opcode = IOCB_CMD_PREAD;
		sp->cb.aio_fildes = (uint32_t)fd;
		sp->cb.aio_buf = (uint64_t)(uintptr_t)sp->buf;
		sp->cb.aio_nbytes = sp->len;
		sp->cb.aio_offset = (int64_t)sp->start;
		cbs[k++] = &sp->cb;
	}
	while (done < k) {
		long r = syscall(SYS_io_submit, t->aio, (long)(k - done), cbs + done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break; /* the rest is read in _finish */
		done += (size_t)r;
	}
	pthread_rwlock_unlock(&s->pack_rw);
	pf->inflight = done;
}

/*
 * Wait until pf's reads have completed.  Completions of the thread's other
 * batch come in through the same context and are recorded in its spans.
 * Should the context fail, it is destroyed (which waits for its reads) and
 * the thread reads without AIO from then on; spans left without a result
 * are read in _finish.
 */
static void pf_reap(ckpt_store *s, struct tls_ctx *t, ckpt_prefetch *pf)
{
	struct io_event ev[PF_INFLIGHT * PF_SPANS];

	while (pf->inflight > 0 && t->aio_state == 1) {
		long r = syscall(SYS_io_getevents, t->aio, 1L, (long)(PF_INFLIGHT * PF_SPANS), ev,
				 NULL);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			ckpt_warn("%s: io_getevents: %s: read-ahead reads with pread", s->path,
				  strerror(errno));
			(void)syscall(SYS_io_destroy, t->aio);
			t->aio_state = -1;
			break;
		}
		for (long i = 0; i < r; i++) {
			struct pf_span *sp = (struct pf_span *)(uintptr_t)ev[i].data;
			sp->res = ev[i].res;
			sp->pf->inflight--;
		}
	}
	if (t->aio_state != 1)
		pf->inflight = 0; /* its spans without a result are read again */
}

int ckpt_store_prefetch_begin(ckpt_store *s, const ckpt_digest *d, size_t n, bool submit,
			      ckpt_prefetch **ret_pf)
{
	struct tls_ctx *t = tls_get(s);
	ckpt_prefetch *pf;
	size_t i;

	*ret_pf = NULL;
	if (!t || !(pf = calloc(1, sizeof(*pf))))
		return -ENOMEM;
	pf->slot = -1;
	pf->n = n;
	pf->it = calloc(n ? n : 1, sizeof(*pf->it));
	pf->o = calloc(n ? n : 1, sizeof(*pf->o));
	if (!pf->it || !pf->o) {
		free(pf->it);
		free(pf->o);
		free(pf);
		return -ENOMEM;
	}
	for (i = 0; i < n; i++) {
		struct pf_item *x = &pf->it[pf->m];

		x->d = &d[i];
		x->e = ckpt_cache_reserve(s->cache, &d[i]);
		if (!x->e)
			continue; /* cached, being loaded, or no memory */
		if (ckpt_store_chunk_loc(s, &d[i], &x->loc, NULL) < 0) {
			ckpt_cache_abandon(s->cache, x->e);
			pf->lost++;
			continue;
		}
		pf->o[pf->m] = x;
		pf->m++;
	}
	qsort(pf->o, pf->m, sizeof(*pf->o), pf_cmp);
	pf_plan(t, pf);
	if (submit)
		pf_submit(s, t, pf);
	*ret_pf = pf;
	return 0;
}

int ckpt_store_prefetch_finish(ckpt_store *s, ckpt_prefetch *pf, size_t *ret_loaded,
			       size_t *ret_skipped)
{
	struct tls_ctx *t = tls_get(s); /* the thread's own: begin made it */
	size_t loaded = 0, i;
	int r;

	pf_reap(s, t, pf);
	pthread_rwlock_rdlock(&s->pack_rw);
	for (i = 0; i < pf->nspans; i++) {
		struct pf_span *sp = &pf->sp[i];
		uint64_t start;
		size_t len;
		ckpt_pack *p;

		if (get_pack(s, sp->pack_id, &p) < 0) {
			__atomic_fetch_add(&s->pf_stats.failed, 1, __ATOMIC_RELAXED);
			continue; /* gone (compacted): its items load alone */
		}
		__atomic_fetch_add(sp->res != PF_UNREAD ? &s->pf_stats.aio : &s->pf_stats.sync, 1,
				   __ATOMIC_RELAXED);
		if (sp->res == PF_UNREAD) {
			/* not submitted: read it here (through the page cache
			 * where the file system has no O_DIRECT: then alone) */
			r = ckpt_pack_read_window(p, sp->start, sp->need, sp->buf, sp->len, &start,
						  &len);
			sp->res = r < 0 ? r : (int64_t)len;
		}
		if (sp->res < (int64_t)sp->need) {
			__atomic_fetch_add(&s->pf_stats.failed, 1, __ATOMIC_RELAXED);
			continue; /* failed or short: its items load alone and report */
		}
		for (size_t k = sp->i; k < sp->j; k++) {
			struct pf_item *x = pf->o[k];
			if (ckpt_pack_rec_at(p, x->loc.offset, sp->buf + (x->loc.offset - sp->start),
					     x->loc.stored_len, false, &x->rec, &x->src) < 0)
				x->src = NULL; /* its load reads it alone and reports */
		}
	}
	pthread_rwlock_unlock(&s->pack_rw);
	/* decode in the order the reader will want them */
	for (i = 0; i < pf->m; i++) {
		struct pf_item *x = &pf->it[i];
		uint8_t *buf = NULL;
		size_t len;

		if (x->src && (buf = ckpt_cache_buf_alloc(s->cache, x->loc.raw_len)) &&
		    !decode_chunk(s, t->dc, x->d, &x->loc, &x->rec, x->src, buf)) {
			len = x->loc.raw_len;
		} else {
			if (buf)
				ckpt_cache_buf_free(s->cache, buf, x->loc.raw_len);
			if (load_chunk(s, x->d, &x->loc, &buf, &len) < 0) {
				ckpt_cache_abandon(s->cache, x->e);
				continue;
			}
		}
		ckpt_cache_fill_buf(s->cache, x->e, buf, len, true, true);
		ckpt_cache_release(s->cache, x->e);
		loaded++;
	}
	r = (int)(pf->lost + pf->m - loaded);
	*ret_loaded = loaded;
	*ret_skipped = pf->n - pf->m - pf->lost;
	if (pf->slot >= 0)
		t->span_busy[pf->slot] = false;
	free(pf->o);
	free(pf->it);
	free(pf);
	return r;
}

void ckpt_store_load_ctx_stats(ckpt_store *s, struct ckpt_load_ctx_stats *ret)
{
	pthread_mutex_lock(&s->rctx_lock);
	ret->made = s->rctx_made;
	ret->warm = s->rctx_warm;
	ret->free = s->rctx_nfree;
	pthread_mutex_unlock(&s->rctx_lock);
}

void ckpt_store_prefetch_stats(ckpt_store *s, struct ckpt_prefetch_stats *ret)
{
	ret->aio = __atomic_load_n(&s->pf_stats.aio, __ATOMIC_RELAXED);
	ret->sync = __atomic_load_n(&s->pf_stats.sync, __ATOMIC_RELAXED);
	ret->failed = __atomic_load_n(&s->pf_stats.failed, __ATOMIC_RELAXED);
}

int ckpt_store_prefetch_chunks(ckpt_store *s, const ckpt_digest *d, size_t n,
			       size_t *ret_loaded, size_t *ret_skipped)
{
	ckpt_prefetch *pf;
	int r;

	*ret_loaded = *ret_skipped = 0;
	r = ckpt_store_prefetch_begin(s, d, n, false, &pf);
	if (r < 0)
		return r;
	return ckpt_store_prefetch_finish(s, pf, ret_loaded, ret_skipped);
}

void ckpt_store_cache_stats(ckpt_store *s, struct ckpt_cache_stats *ret)
{
	ckpt_cache_get_stats(s->cache, ret);
}

uint8_t *ckpt_store_buf_alloc(ckpt_store *s, size_t len)
{
	return ckpt_cache_buf_alloc(s->cache, len ? len : 1);
}

void ckpt_store_buf_free(ckpt_store *s, uint8_t *buf, size_t len)
{
	ckpt_cache_buf_free(s->cache, buf, len ? len : 1);
}

int ckpt_store_read_chunk(ckpt_store *s, const ckpt_digest *d, uint64_t off, void *dst,
			  size_t len)
{
	ckpt_cache_entry *e;
	const uint8_t *data;
	size_t dlen;
	int r;

	r = ckpt_store_chunk_get(s, d, false, &e, &data, &dlen);
	if (r < 0)
		return r;
	if (off > dlen || len > dlen - off) {
		r = -EIO;
	} else {
		memcpy(dst, data + off, len);
		r = 0;
	}
	ckpt_cache_release(s->cache, e);
	return r;
}

static int verify_same(ckpt_store *s, const ckpt_digest *d, const struct iovec *iov, int cnt,
		       size_t len)
{
	struct ckpt_chunk_loc loc;
	uint8_t *buf;
	int r = ckpt_store_chunk_loc(s, d, &loc, NULL);
	size_t at = 0;

	if (r < 0)
		return r;
	if (loc.raw_len != len)
		return -EIO;
	buf = malloc(len ? len : 1);
	if (!buf)
		return -ENOMEM;
	r = ckpt_store_verify_chunk(s, d, &loc, buf);
	for (int i = 0; r == 0 && i < cnt; i++) {
		if (memcmp(buf + at, iov[i].iov_base, iov[i].iov_len) != 0)
			r = -EIO;
		at += iov[i].iov_len;
	}
	free(buf);
	if (r == -EIO) {
		char hex[33];
		ckpt_digest_to_hex(d, hex);
		ckpt_err("%s: verify_dedup: different bytes under digest %s; write refused", s->path,
			 hex);
	}
	return r;
}

/* Keep free space for the index: RocksDB cannot be relied on to survive
 * running out of disk (it may assert, and recovery needs space), so pack
 * appends fail with ENOSPC while free space is below the reserve:
 * min(CKPT_RESERVE_MAX, 1/8 of the filesystem). */
#define CKPT_RESERVE_MAX (256ull << 20)
static int check_space(ckpt_store *s, size_t need)
{
	struct statvfs st;
	uint64_t avail, total, reserve;

	if (fstatvfs(s->packs_fd, &st) < 0)
		return 0; /* cannot tell: let the write itself fail */
	avail = (uint64_t)st.f_bavail * st.f_frsize;
	total = (uint64_t)st.f_blocks * st.f_frsize;
	reserve = CKPT_MIN(CKPT_RESERVE_MAX, total / 8);
	if (avail < reserve + need + CKPT_PACK_REC_HDR_SIZE) {
		ckpt_warn("%s: backing filesystem nearly full (%" PRIu64 " bytes free, %" PRIu64
			  " reserved for the index): ENOSPC", s->path, avail, reserve);
		return -ENOSPC;
	}
	return 0;
}

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Append a record to pack p (thread-safe; packs are never freed while they
 * are append targets). */
static int append_to(ckpt_pack *p, const struct ckpt_pack_rec *rec, const struct iovec *iov,
		     int cnt, struct ckpt_chunk_loc *ret_loc)
{
	int r;

	memset(ret_loc, 0, sizeof(*ret_loc));
	r = ckpt_pack_appendv(p, rec, iov, cnt, &ret_loc->offset);
	if (r < 0)
		return r;
	ret_loc->pack_id = ckpt_pack_id(p);
	ret_loc->stored_len = rec->stored_len;
	ret_loc->raw_len = rec->raw_len;
	ret_loc->codec = rec->codec;
	return 0;
}

/* Append a record to the current write pack (rolling it when full). */
static int append_record(ckpt_store *s, const struct ckpt_pack_rec *rec, const struct iovec *iov,
			 int cnt, struct ckpt_chunk_loc *ret_loc)
{
	ckpt_pack *p;
	int r = 0;

	pthread_mutex_lock(&s->pack_lock);
	if (!s->wpack || ckpt_pack_size(s->wpack) >= s->opts.pack_max)
		r = roll_pack_locked(s);
	p = s->wpack;
	pthread_mutex_unlock(&s->pack_lock);
	return r < 0 ? r : append_to(p, rec, iov, cnt, ret_loc);
}

/* Append for the background thread (to bgpack). */
static int append_record_bg(ckpt_store *s, const struct ckpt_pack_rec *rec, const void *data,
			    struct ckpt_chunk_loc *ret_loc)
{
	struct iovec one = { (void *)data, rec->stored_len };
	ckpt_pack *p;
	int r = 0;

	pthread_mutex_lock(&s->pack_lock);
	if (!s->bgpack || ckpt_pack_size(s->bgpack) >= s->opts.pack_max)
		r = new_pack_locked(s, &s->bgpack);
	p = s->bgpack;
	pthread_mutex_unlock(&s->pack_lock);
	return r < 0 ? r : append_to(p, rec, &one, 1, ret_loc);
}

static void bg_enqueue(ckpt_store *s, const ckpt_digest *d, uint8_t elem)
{
	pthread_mutex_lock(&s->bg_lock);
	if (s->bgq_head > 0 && s->bgq_head == s->bgq_n) {
		s->bgq_head = s->bgq_n = 0;
	}
	if (s->bgq_n == s->bgq_cap) {
		size_t nc = s->bgq_cap ? s->bgq_cap * 2 : 1024;
		struct bg_item *nq;
		if (s->bgq_head > 0) { /* compact before growing */
			memmove(s->bgq, s->bgq + s->bgq_head,
				(s->bgq_n - s->bgq_head) * sizeof(*s->bgq));
			s->bgq_n -= s->bgq_head;
			s->bgq_head = 0;
		}
		if (s->bgq_n == s->bgq_cap) {
			nq = realloc(s->bgq, nc * sizeof(*nq));
			if (!nq) {
				/* stays raw until the next open re-queues it */
				pthread_mutex_unlock(&s->bg_lock);
				return;
			}
			s->bgq = nq;
			s->bgq_cap = nc;
		}
	}
	s->bgq[s->bgq_n].d = *d;
	s->bgq[s->bgq_n].elem = elem;
	s->bgq_n++;
	s->bg_compact_clean = false;
	pthread_cond_broadcast(&s->bg_cond);
	pthread_mutex_unlock(&s->bg_lock);
}

int ckpt_store_put_chunk(ckpt_store *s, const void *data, size_t len, unsigned elem_size,
			 ckpt_digest *ret_digest)
{
	struct iovec one = { (void *)data, len };

	if (!data)
		return -EINVAL;
	return ckpt_store_put_chunkv(s, &one, 1, elem_size, ret_digest);
}

int ckpt_store_put_chunkv(ckpt_store *s, const struct iovec *iov, int cnt, unsigned elem_size,
			  ckpt_digest *ret_digest)
{
	struct tls_ctx *t;
	bool deferred;
	struct ckpt_chunk_loc loc;
	struct ckpt_pack_rec rec;
	struct iovec outv;
	const struct iovec *stored = iov;
	int nstored = cnt;
	uint8_t *joined = NULL;
	size_t len = 0;
	ckpt_digest d;
	uint8_t key[32];
	uint8_t *val;
	size_t vlen;
	int r;

	if (!iov || cnt < 1 || cnt > CKPT_PACK_MAX_IOV)
		return -EINVAL;
	for (int i = 0; i < cnt; i++) {
		if (!iov[i].iov_base)
			return -EINVAL;
		len += iov[i].iov_len;
	}
	if (len == 0 || len > CKPT_CHUNK_MAX)
		return -EINVAL;
	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	r = ckpt_hash_chunkv(s->hasher, iov, cnt, &d);
	if (r < 0)
		return r;
	*ret_digest = d;
	/* Dedup: pending first, then the index (see I3). */
	if (pending_find(s, &d, NULL))
		goto dedup_hit;
	r = ckpt_index_get(s->ix, key, ckpt_key_chunk(key, &d), &val, &vlen);
	if (r == 0) {
		free(val);
		goto dedup_hit;
	}
	if (r != -ENOENT)
		return r;

	memset(&rec, 0, sizeof(rec));
	deferred = s->bg_started && !s->opts.inline_compress && s->opts.compress_level > 0;
	if (deferred) {
		/* the save path runs at disk speed; bg_main compresses later */
		rec.codec = CKPT_CODEC_RAW;
		rec.stored_len = (uint32_t)len;
	} else {
		const void *in = iov[0].iov_base, *out;
		size_t out_len;

		t = tls_get(s);
		if (!t)
			return -ENOMEM;
		if (cnt > 1) {
			/* the compressor wants one buffer */
			joined = malloc(len);
			if (!joined)
				return -ENOMEM;
			size_t at = 0;

			for (int i = 0; i < cnt; i++) {
				memcpy(joined + at, iov[i].iov_base, iov[i].iov_len);
				at += iov[i].iov_len;
			}
			in = joined;
		}
		r = ckpt_compress(t->cc, in, len, elem_size, &rec.codec, &out, &out_len);
		if (r < 0)
			goto out;
		outv.iov_base = (void *)out;
		outv.iov_len = out_len;
		stored = &outv;
		nstored = 1;
		rec.stored_len = (uint32_t)out_len;
	}
	r = check_space(s, rec.stored_len);
	if (r < 0)
		goto out;
	rec.raw_len = (uint32_t)len;
	memcpy(rec.digest, d.bytes, CKPT_DIGEST_LEN);
	atomic_fetch_add(&s->puts_inflight, 1);
	atomic_store(&s->last_put_ns, mono_ns());
	r = append_record(s, &rec, stored, nstored, &loc);
	if (r == 0) {
		if (deferred) {
			loc.flags = CKPT_CHUNK_F_DEFERRED;
			loc.elem = (uint8_t)elem_size;
		}
		/* a racing twin may have won: harmless duplicate */
		if (pending_add(s, &d, &loc) && deferred)
			bg_enqueue(s, &d, (uint8_t)elem_size);
	}
	atomic_fetch_sub(&s->puts_inflight, 1);
out:
	free(joined);
	return r;

dedup_hit:
	if (s->opts.verify_dedup)
		return verify_same(s, &d, iov, cnt, len);
	return 0;
}


/* ------------------------------------------------------ background work */

struct chunk_info {
	ckpt_digest d;
	struct ckpt_chunk_loc loc;
	uint64_t refs;    /* as stored */
	uint64_t counted; /* as counted from extent lists (fsck) */
	bool damaged;
};
static int load_chunks(ckpt_store *s, struct chunk_info **ret, size_t *ret_n);
static int list_packs(ckpt_store *s, uint64_t **ret_ids, size_t *ret_n, uint64_t *ret_bytes);

#define BG_IDLE_NS (1000 * 1000000ll) /* writes paused this long: background may run */
#define BG_BATCH 32
#define BG_COMPACT_LIVE 50 /* compact sealed packs under this % live */

struct reloc {
	ckpt_digest d;
	struct ckpt_chunk_loc old, new;
};

static bool same_loc(const struct ckpt_chunk_loc *a, const struct ckpt_chunk_loc *b)
{
	return a->pack_id == b->pack_id && a->offset == b->offset;
}

/* Point chunks at their new records.  Each new record must already be
 * durable.  A chunk whose location changed meanwhile is left alone. */
static int publish(ckpt_store *s, const struct reloc *v, size_t n)
{
	ckpt_batch *b = ckpt_batch_new();
	int r = 0;

	if (!b)
		return -ENOMEM;
	pthread_mutex_lock(&s->ns_lock);
	for (size_t i = 0; i < n; i++) {
		uint8_t key[32], val[CKPT_CHUNK_REC_LEN];
		struct ckpt_chunk_loc cur;
		struct pending *p;
		uint64_t refs;
		bool done = false;

		pthread_mutex_lock(&s->pending_lock);
		for (p = s->pending[pending_bucket(&v[i].d)]; p; p = p->next) {
			if (!memcmp(p->digest.bytes, v[i].d.bytes, CKPT_DIGEST_LEN)) {
				if (same_loc(&p->loc, &v[i].old))
					p->loc = v[i].new;
				done = true;
				break;
			}
		}
		pthread_mutex_unlock(&s->pending_lock);
		if (done)
			continue;
		r = ckpt_index_get_fixed(s->ix, key, ckpt_key_chunk(key, &v[i].d), val, sizeof(val));
		if (r == -ENOENT) {
			r = 0;
			continue;
		}
		if (r == 0)
			r = ckpt_chunk_rec_decode(val, sizeof(val), &cur, &refs);
		if (r < 0)
			break;
		if (!same_loc(&cur, &v[i].old))
			continue;
		ckpt_chunk_rec_encode(&v[i].new, refs, val);
		ckpt_batch_put(b, key, ckpt_key_chunk(key, &v[i].d), val, sizeof(val));
	}
	if (r == 0 && ckpt_batch_count(b) > 0)
		r = ckpt_index_write(s->ix, b, false);
	pthread_mutex_unlock(&s->ns_lock);
	ckpt_batch_free(b);
	return r;
}

/* Sync the records listed in v (their new locations). */
static int sync_relocs(ckpt_store *s, const struct reloc *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t end = v[i].new.offset + ckpt_pack_rec_span(v[i].new.stored_len);
		ckpt_pack *p;
		int r;

		if (same_loc(&v[i].new, &v[i].old))
			continue; /* flag change only */
		r = get_pack(s, v[i].new.pack_id, &p);
		if (r == 0)
			r = ckpt_pack_sync(p, end); /* cheap when already covered */
		if (r < 0)
			return r;
	}
	return 0;
}

/* Compress deferred chunks: new compressed record, or just clear the flag
 * when compression does not pay. */
static void bg_compress(ckpt_store *s, const struct bg_item *items, size_t n)
{
	struct tls_ctx *t = tls_get(s);
	struct reloc rel[BG_BATCH];
	size_t nrel = 0;
	uint8_t *raw = NULL;

	if (!t)
		return;
	for (size_t i = 0; i < n; i++) {
		struct ckpt_chunk_loc loc, nl;
		struct ckpt_pack_rec rec;
		const void *out;
		size_t out_len;
		uint8_t codec;

		if (ckpt_store_chunk_loc(s, &items[i].d, &loc, NULL) < 0 ||
		    !(loc.flags & CKPT_CHUNK_F_DEFERRED))
			continue;
		free(raw);
		raw = malloc(loc.raw_len ? loc.raw_len : 1);
		if (!raw || ckpt_store_verify_chunk(s, &items[i].d, &loc, raw) < 0)
			continue;
		if (ckpt_compress(t->cc, raw, loc.raw_len, items[i].elem, &codec, &out, &out_len) < 0)
			continue;
		s->bg.compressed_in += loc.raw_len;
		if (codec == CKPT_CODEC_RAW) {
			nl = loc; /* incompressible: keep the record, clear the flag */
			s->bg.incompressible++;
			s->bg.compressed_out += loc.raw_len;
		} else {
			memset(&rec, 0, sizeof(rec));
			rec.codec = codec;
			rec.stored_len = (uint32_t)out_len;
			rec.raw_len = loc.raw_len;
			memcpy(rec.digest, items[i].d.bytes, CKPT_DIGEST_LEN);
			if (check_space(s, out_len) < 0 || append_record_bg(s, &rec, out, &nl) < 0)
				continue;
			s->bg.compressed++;
			s->bg.compressed_out += out_len;
		}
		nl.flags = 0;
		nl.elem = 0;
		rel[nrel].d = items[i].d;
		rel[nrel].old = loc;
		rel[nrel].new = nl;
		nrel++;
	}
	free(raw);
	if (nrel && sync_relocs(s, rel, nrel) == 0)
		publish(s, rel, nrel);
}

static bool pending_in_pack(ckpt_store *s, uint64_t id)
{
	bool found = false;

	pthread_mutex_lock(&s->pending_lock);
	for (size_t b = 0; b < PENDING_BUCKETS && !found; b++)
		for (struct pending *p = s->pending[b]; p && !found; p = p->next)
			found = p->loc.pack_id == id;
	pthread_mutex_unlock(&s->pending_lock);
	return found;
}

/* Packs compaction must leave alone (a damaged record was found in them).
 * Only the background thread touches these. */
static void bg_skip_pack(ckpt_store *s, uint64_t id)
{
	uint64_t *v = realloc(s->bg_skip, (s->nbg_skip + 1) * sizeof(*v));

	if (!v)
		return;
	v[s->nbg_skip++] = id;
	s->bg_skip = v;
	ckpt_err("%s: pack %" PRIu64 " has a damaged record: background compaction skips it; "
		 "run `ckpt fsck`", s->path, id);
}

static bool bg_skipped(const ckpt_store *s, uint64_t id)
{
	for (size_t i = 0; i < s->nbg_skip; i++)
		if (s->bg_skip[i] == id)
			return true;
	return false;
}

/* 1 if some index entry names pack id, 0 if none, <0 on error. */
static int index_names_pack(ckpt_store *s, uint64_t id)
{
	uint8_t prefix[1] = { CKPT_KEY_CHUNK };
	const uint8_t *k, *v;
	size_t kl, vl;
	ckpt_iter *it;
	int r = ckpt_iter_new(s->ix, prefix, 1, &it), found = 0;

	if (r < 0)
		return r;
	while (!found && (r = ckpt_iter_next(it, &k, &kl, &v, &vl)) > 0) {
		struct ckpt_chunk_loc loc;
		if (ckpt_chunk_rec_decode(v, vl, &loc, NULL) == 0 && loc.pack_id == id)
			found = 1;
	}
	ckpt_iter_free(it);
	return r < 0 ? r : found;
}

/* Move every chunk out of one mostly-dead sealed pack and delete it.
 * Returns 1 if a pack was compacted, 0 if none qualified, <0 on error. */
static int bg_compact(ckpt_store *s)
{
	struct chunk_info *chunks = NULL;
	uint64_t *ids = NULL, wid = UINT64_MAX, victim = UINT64_MAX;
	size_t nchunks = 0, nids = 0, nrel = 0, cap = 0;
	struct reloc *rel = NULL;
	uint8_t *buf = NULL;
	ckpt_pack *src = NULL;
	char name[64];
	int r;

	pthread_mutex_lock(&s->pack_lock);
	if (s->wpack)
		wid = ckpt_pack_id(s->wpack);
	pthread_mutex_unlock(&s->pack_lock);
	r = load_chunks(s, &chunks, &nchunks);
	if (r == 0)
		r = list_packs(s, &ids, &nids, NULL);
	if (r < 0)
		goto out;
	for (size_t pi = 0; pi < nids && victim == UINT64_MAX; pi++) {
		uint64_t live = 0, size = 0;
		struct stat st;
		if (bg_skipped(s, ids[pi]) || pending_in_pack(s, ids[pi]))
			continue; /* damaged, or unindexed chunks still live there */
		ckpt_pack_name(ids[pi], name, sizeof(name));
		if (fstatat(s->packs_fd, name, &st, 0) < 0)
			continue;
		size = (uint64_t)st.st_size;
		for (size_t i = 0; i < nchunks; i++)
			if (chunks[i].loc.pack_id == ids[pi])
				live += ckpt_pack_rec_span(chunks[i].loc.stored_len);
		if (size > CKPT_PACK_HDR_SIZE &&
		    live * 100 < (size - CKPT_PACK_HDR_SIZE) * BG_COMPACT_LIVE)
			victim = ids[pi];
	}
	if (victim == UINT64_MAX)
		goto out;
	pthread_mutex_lock(&s->pack_lock);
	if (victim == wid && s->wpack && ckpt_pack_id(s->wpack) == wid)
		r = roll_pack_locked(s); /* mostly garbage by now: seal it */
	if (s->bgpack && ckpt_pack_id(s->bgpack) == victim)
		s->bgpack = NULL; /* never copy a pack into itself */
	pthread_mutex_unlock(&s->pack_lock);
	if (r < 0)
		goto out;
	ckpt_pack_name(victim, name, sizeof(name));
	r = get_pack(s, victim, &src); /* keeps its fd open for racing readers */
	buf = malloc(CKPT_CHUNK_MAX);
	if (r < 0 || !buf) {
		r = r < 0 ? r : -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < nchunks; i++) {
		struct ckpt_chunk_loc old;
		struct ckpt_pack_rec rec;
		if (chunks[i].loc.pack_id != victim)
			continue;
		old = chunks[i].loc;
		if (ckpt_pack_read(src, old.offset, old.stored_len, &rec, buf) < 0) {
			r = -EIO; /* damaged: leave the pack for fsck */
			goto out;
		}
		if (nrel == cap) {
			size_t nc = cap ? cap * 2 : 256;
			struct reloc *nv = realloc(rel, nc * sizeof(*nv));
			if (!nv) {
				r = -ENOMEM;
				goto out;
			}
			rel = nv;
			cap = nc;
		}
		r = check_space(s, rec.stored_len);
		if (r == 0)
			r = append_record_bg(s, &rec, buf, &rel[nrel].new);
		if (r < 0)
			goto out;
		rel[nrel].new.flags = old.flags;
		rel[nrel].new.elem = old.elem;
		rel[nrel].old = old;
		memcpy(rel[nrel].d.bytes, rec.digest, CKPT_DIGEST_LEN);
		nrel++;
	}
	r = sync_relocs(s, rel, nrel);
	if (r == 0)
		r = publish(s, rel, nrel);
	if (r < 0)
		goto out;
	/* Puts that might still be appending to the pack started before it was
	 * sealed; wait for any in flight now.  Then, with commits held off (a
	 * commit moves chunks from pending to the index), make sure that
	 * neither the pending table nor the index names the pack any more. */
	while (atomic_load(&s->puts_inflight) > 0)
		usleep(1000);
	pthread_mutex_lock(&s->commit_lock);
	if (pending_in_pack(s, victim)) {
		r = 0;
	} else {
		r = index_names_pack(s, victim);
		if (r == 0)
			r = ckpt_index_sync_wal(s->ix); /* the index no longer names it */
		if (r == 0 && unlinkat(s->packs_fd, name, 0) < 0)
			r = -errno;
		if (r == 0)
			r = 2;
	}
	pthread_mutex_unlock(&s->commit_lock);
	if (r != 2) {
		r = r > 0 ? 0 : r; /* still in use: try again later */
		goto out;
	}
	r = 0;
	if (r == 0) {
		fsync(s->packs_fd);
		/* release the file's space now: no reader uses the object once
		 * we hold pack_rw for writing */
		pthread_rwlock_wrlock(&s->pack_rw);
		pthread_mutex_lock(&s->pack_lock);
		for (size_t i = 0; i < s->npacks; i++) {
			if (ckpt_pack_id(s->packs[i]) == victim) {
				ckpt_pack_free(s->packs[i]);
				s->packs[i] = s->packs[--s->npacks];
				break;
			}
		}
		pthread_mutex_unlock(&s->pack_lock);
		pthread_rwlock_unlock(&s->pack_rw);
		s->bg.moved += nrel;
		s->bg.packs_deleted++;
		r = 1;
	}
out:
	if (r == -EIO && victim != UINT64_MAX)
		bg_skip_pack(s, victim); /* damaged: leave it to fsck/gc, don't retry */
	free(chunks);
	free(ids);
	free(rel);
	free(buf);
	return r;
}

static void *bg_main(void *arg)
{
	ckpt_store *s = arg;
	struct bg_item items[BG_BATCH];

	pthread_mutex_lock(&s->bg_lock);
	while (!s->bg_stop) {
		int64_t idle = mono_ns() - atomic_load(&s->last_put_ns);
		size_t n = 0;
		struct timespec ts;

		if (idle < BG_IDLE_NS || (s->bgq_n == s->bgq_head && s->bg_compact_clean)) {
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 50 * 1000000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&s->bg_cond, &s->bg_lock, &ts);
			continue;
		}
		while (n < BG_BATCH && s->bgq_head < s->bgq_n)
			items[n++] = s->bgq[s->bgq_head++];
		s->bg_busy = true;
		pthread_mutex_unlock(&s->bg_lock);
		if (n > 0) {
			bg_compress(s, items, n);
		} else {
			/* The queue is empty: make the overlay durable first (its
			 * chunks are pending and pin their packs), then compact. */
			ckpt_store_flush(s);
			if (bg_compact(s) <= 0) {
				pthread_mutex_lock(&s->bg_lock);
				if (s->bgq_n == s->bgq_head)
					s->bg_compact_clean = true;
				pthread_mutex_unlock(&s->bg_lock);
			}
		}
		pthread_mutex_lock(&s->bg_lock);
		s->bg_busy = false;
		pthread_cond_broadcast(&s->bg_cond);
	}
	pthread_mutex_unlock(&s->bg_lock);
	return NULL;
}

int ckpt_store_settle(ckpt_store *s, unsigned timeout_ms)
{
	struct timespec ts;
	int r = 0;

	if (!s->bg_started)
		return 0;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&s->bg_lock);
	s->bg_compact_clean = false; /* look once more */
	pthread_cond_broadcast(&s->bg_cond);
	while (r == 0 && (s->bg_busy || s->bgq_head < s->bgq_n || !s->bg_compact_clean))
		r = pthread_cond_timedwait(&s->bg_cond, &s->bg_lock, &ts);
	pthread_mutex_unlock(&s->bg_lock);
	return r ? -ETIMEDOUT : 0;
}

void ckpt_store_bg_stats(ckpt_store *s, struct ckpt_bg_stats *ret)
{
	pthread_mutex_lock(&s->bg_lock);
	*ret = s->bg;
	ret->queued = s->bgq_n - s->bgq_head;
	pthread_mutex_unlock(&s->bg_lock);
}

/* Queue chunks left raw by an earlier run (crash or unmount before the
 * background work finished). */
static int requeue_deferred(ckpt_store *s)
{
	uint8_t prefix[1] = { CKPT_KEY_CHUNK };
	const uint8_t *k, *v;
	size_t kl, vl;
	ckpt_iter *it;
	int r = ckpt_iter_new(s->ix, prefix, 1, &it);

	if (r < 0)
		return r;
	while ((r = ckpt_iter_next(it, &k, &kl, &v, &vl)) > 0) {
		struct ckpt_chunk_loc loc;
		ckpt_digest d;
		if (kl != 1 + CKPT_DIGEST_LEN || ckpt_chunk_rec_decode(v, vl, &loc, NULL) < 0)
			continue;
		if (!(loc.flags & CKPT_CHUNK_F_DEFERRED))
			continue;
		memcpy(d.bytes, k + 1, CKPT_DIGEST_LEN);
		bg_enqueue(s, &d, loc.elem);
	}
	ckpt_iter_free(it);
	return r;
}

/* ---------------------------------------------------------------- files */

void ckpt_read_cursor_init(struct ckpt_read_cursor *c, const struct ckpt_extent_list *l)
{
	memset(c, 0, sizeof(*c));
	c->l = l;
}

void ckpt_store_cursor_done(ckpt_store *s, struct ckpt_read_cursor *c)
{
	if (c->e)
		ckpt_cache_release_read(s->cache, c->e, c->got);
	c->e = NULL;
	c->got = 0;
}

ssize_t ckpt_store_cursor_read(ckpt_store *s, struct ckpt_read_cursor *c, void *dst, size_t len,
			       uint64_t off)
{
	const struct ckpt_extent_list *l = c->l;
	uint8_t *p = dst;
	size_t done = 0;
	size_t i = c->hint;

	if (off >= l->size)
		return 0;
	if (len > l->size - off)
		len = (size_t)(l->size - off);
	/* Views read many short runs in order: try the last extent and the
	 * next one before searching. */
	if (!(i < l->n && l->v[i].off <= off && off - l->v[i].off < l->v[i].len)) {
		if (i + 1 < l->n && l->v[i + 1].off <= off && off - l->v[i + 1].off < l->v[i + 1].len)
			i++;
		else
			i = ckpt_extent_list_find(l, off);
	}
	while (done < len && i < l->n) {
		const struct ckpt_extent *e = &l->v[i];
		uint64_t in = off + done - e->off;
		size_t n = CKPT_MIN((size_t)(e->len - in), len - done);
		if (e->kind == CKPT_EXT_ZERO) {
			memset(p + done, 0, n);
			if (c->g)
				ckpt_gather_buf(c->g, p + done, n);
		} else {
			if (!c->e || c->ei != i) {
				ckpt_store_cursor_done(s, c);
				int r = ckpt_store_chunk_get(s, &e->digest, c->g && c->g->stream,
							     &c->e, &c->data, &c->dlen);
				if (r < 0)
					return r;
				c->ei = i;
			}
			if (in > c->dlen || n > c->dlen - in)
				return -EIO;
			c->got += n;
			if (c->g && n >= CKPT_GATHER_MIN && c->g->niov + 2 <= CKPT_GATHER_MAX) {
				/* reference the cached bytes; one slot stays free for
				 * the pieces after the last reference */
				ckpt_cache_ref(s->cache, c->e);
				c->g->pins[c->g->npins++] = c->e;
				c->g->iov[c->g->niov].iov_base = (void *)(c->data + in);
				c->g->iov[c->g->niov].iov_len = n;
				c->g->niov++;
			} else {
				memcpy(p + done, c->data + in, n);
				if (c->g)
					ckpt_gather_buf(c->g, p + done, n);
			}
		}
		c->hint = i;
		done += n;
		i++;
	}
	return (ssize_t)done;
}

void ckpt_gather_init(struct ckpt_gather *g)
{
	g->stream = false;
	g->niov = 0;
	g->npins = 0;
}

void ckpt_gather_buf(struct ckpt_gather *g, const uint8_t *p, size_t n)
{
	struct iovec *last = g->niov ? &g->iov[g->niov - 1] : NULL;

	if (!n)
		return;
	if (last && (const uint8_t *)last->iov_base + last->iov_len == p) {
		last->iov_len += n;
		return;
	}
	/* the cursor keeps a slot free for this (see ckpt_store_cursor_read) */
	g->iov[g->niov].iov_base = (void *)p;
	g->iov[g->niov].iov_len = n;
	g->niov++;
}

void ckpt_store_gather_done(ckpt_store *s, struct ckpt_gather *g)
{
	for (size_t i = 0; i < g->npins; i++)
		ckpt_cache_release(s->cache, g->pins[i]);
	g->npins = 0;
	g->niov = 0;
}

ssize_t ckpt_store_read_extents_gather(ckpt_store *s, const struct ckpt_extent_list *l,
				       void *dst, size_t len, uint64_t off, struct ckpt_gather *g)
{
	struct ckpt_read_cursor c;
	ssize_t r;

	ckpt_read_cursor_init(&c, l);
	c.g = g;
	r = ckpt_store_cursor_read(s, &c, dst, len, off);
	ckpt_store_cursor_done(s, &c);
	return r;
}

ssize_t ckpt_store_read_extents(ckpt_store *s, const struct ckpt_extent_list *l, void *dst,
				size_t len, uint64_t off)
{
	struct ckpt_read_cursor c;
	ssize_t r;

	ckpt_read_cursor_init(&c, l);
	r = ckpt_store_cursor_read(s, &c, dst, len, off);
	ckpt_store_cursor_done(s, &c);
	return r;
}

size_t ckpt_store_prefetch_list(const struct ckpt_extent_list *l, uint64_t off, uint64_t len,
				ckpt_digest *out, size_t max, const ckpt_digest *skip)
{
	size_t n = 0, i;

	if (off >= l->size)
		return 0;
	if (len > l->size - off)
		len = l->size - off;
	for (i = ckpt_extent_list_find(l, off); i < l->n && l->v[i].off < off + len && n < max;
	     i++) {
		const struct ckpt_extent *e = &l->v[i];
		if (e->kind == CKPT_EXT_ZERO)
			continue;
		if (n ? !memcmp(out[n - 1].bytes, e->digest.bytes, CKPT_DIGEST_LEN) :
			(skip && !memcmp(skip->bytes, e->digest.bytes, CKPT_DIGEST_LEN)))
			continue;
		out[n++] = e->digest;
	}
	return n;
}

int ckpt_store_load_extents(ckpt_store *s, uint64_t ino, struct ckpt_extent_list **ret_list)
{
	struct commit *c;
	struct ckpt_extent_list *l = NULL;

	pthread_mutex_lock(&s->overlay_lock);
	c = overlay_find_locked(s, ino);
	if (c)
		l = ckpt_extent_list_dup(c->list);
	pthread_mutex_unlock(&s->overlay_lock);
	if (c) {
		*ret_list = l;
		return l ? 0 : -ENOMEM;
	}
	return db_load_extents(s, ino, ret_list);
}

struct delta {
	ckpt_digest d;
	int64_t n;
};

static int delta_cmp(const void *a, const void *b)
{
	return memcmp(((const struct delta *)a)->d.bytes, ((const struct delta *)b)->d.bytes,
		      CKPT_DIGEST_LEN);
}

static int delta_add(struct delta **v, size_t *n, size_t *cap, const struct ckpt_extent_list *l,
		     int sign);
static size_t delta_merge(struct delta *v, size_t n);

/* +1 for every chunk extent of add, -1 for every one of sub, merged per
 * digest; *ret_n entries with a nonzero sum. */
static int build_delta(const struct ckpt_extent_list *add, const struct ckpt_extent_list *sub,
		       struct delta **ret, size_t *ret_n)
{
	struct delta *v = NULL;
	size_t n = 0, cap = 0;
	int r = delta_add(&v, &n, &cap, add, 1);

	if (r == 0)
		r = delta_add(&v, &n, &cap, sub, -1);
	if (r < 0) {
		free(v);
		return r;
	}
	*ret_n = delta_merge(v, n);
	*ret = v;
	return 0;
}

/* Add refcount changes to b.  Caller holds ns_lock.  New entries come from
 * the pending table (their packs were synced by the caller).  On success
 * *ret_new lists digests that left the pending table's responsibility. */
static int apply_delta(ckpt_store *s, ckpt_batch *b, const struct delta *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint8_t key[32], val[CKPT_CHUNK_REC_LEN];
		struct ckpt_chunk_loc loc;
		uint64_t refs = 0;
		size_t klen = ckpt_key_chunk(key, &v[i].d);
		int r = ckpt_index_get_fixed(s->ix, key, klen, val, sizeof(val));

		if (r == 0) {
			r = ckpt_chunk_rec_decode(val, sizeof(val), &loc, &refs);
			if (r < 0)
				return r;
		} else if (r == -ENOENT) {
			if (v[i].n < 0 || !pending_find(s, &v[i].d, &loc)) {
				char hex[33];
				ckpt_digest_to_hex(&v[i].d, hex);
				ckpt_err("%s: chunk %s referenced but unknown", s->path, hex);
				return -EIO;
			}
		} else {
			return r;
		}
		if (v[i].n < 0 && refs < (uint64_t)-v[i].n) {
			char hex[33];
			ckpt_digest_to_hex(&v[i].d, hex);
			ckpt_warn("%s: refcount underflow on chunk %s (fsck will report)", s->path,
				  hex);
			refs = 0;
		} else {
			refs = (uint64_t)((int64_t)refs + v[i].n);
		}
		ckpt_chunk_rec_encode(&loc, refs, val);
		ckpt_batch_put(b, key, klen, val, sizeof(val));
	}
	return 0;
}

/* Sync the packs holding pending chunks that l references (I1). */
static int sync_pending_of(ckpt_store *s, const struct ckpt_extent_list *l)
{
	struct {
		uint64_t id, end;
	} need[8];
	size_t nneed = 0;
	int r;

	for (size_t i = 0; i < l->n; i++) {
		struct ckpt_chunk_loc loc;
		uint64_t end;
		size_t j;

		if (l->v[i].kind != CKPT_EXT_CHUNK || !pending_find(s, &l->v[i].digest, &loc))
			continue;
		end = loc.offset + ckpt_pack_rec_span(loc.stored_len);
		for (j = 0; j < nneed; j++)
			if (need[j].id == loc.pack_id)
				break;
		if (j == nneed) {
			if (nneed == CKPT_ARRAY_SIZE(need)) {
				/* Unusual: many packs; flush what we have. */
				for (size_t k = 0; k < nneed; k++) {
					ckpt_pack *p;
					r = get_pack(s, need[k].id, &p);
					if (r == 0)
						r = ckpt_pack_sync(p, need[k].end);
					if (r < 0)
						return r;
				}
				nneed = 0;
				j = 0;
			}
			need[j].id = loc.pack_id;
			need[j].end = 0;
			nneed++;
		}
		if (end > need[j].end)
			need[j].end = end;
	}
	for (size_t k = 0; k < nneed; k++) {
		ckpt_pack *p;
		r = get_pack(s, need[k].id, &p);
		if (r == 0)
			r = ckpt_pack_sync(p, need[k].end);
		if (r < 0)
			return r;
	}
	return 0;
}

/* ------------------------------------------------------ commits/overlay */

/* Add +sign for every chunk extent of l to the delta vector. */
static int delta_add(struct delta **v, size_t *n, size_t *cap, const struct ckpt_extent_list *l,
		     int sign)
{
	for (size_t i = 0; l && i < l->n; i++) {
		if (l->v[i].kind != CKPT_EXT_CHUNK)
			continue;
		if (*n == *cap) {
			size_t nc = *cap ? *cap * 2 : 256;
			struct delta *nv = realloc(*v, nc * sizeof(*nv));
			if (!nv)
				return -ENOMEM;
			*v = nv;
			*cap = nc;
		}
		(*v)[(*n)++] = (struct delta){ l->v[i].digest, sign };
	}
	return 0;
}

/* Sort and merge per digest, dropping zero sums. */
static size_t delta_merge(struct delta *v, size_t n)
{
	size_t out = 0, k = 0;

	qsort(v, n, sizeof(*v), delta_cmp);
	for (size_t i = 0; i < n; i++) {
		if (out > 0 && memcmp(v[out - 1].d.bytes, v[i].d.bytes, CKPT_DIGEST_LEN) == 0)
			v[out - 1].n += v[i].n;
		else
			v[out++] = v[i];
	}
	for (size_t i = 0; i < out; i++)
		if (v[i].n != 0)
			v[k++] = v[i];
	return k;
}

static int db_getattr(ckpt_store *s, uint64_t ino, struct ckpt_inode *ret)
{
	uint8_t key[16], val[CKPT_INODE_REC_LEN];
	int r = ckpt_index_get_fixed(s->ix, key, ckpt_key_ino(key, CKPT_KEY_INODE, ino), val,
				     sizeof(val));

	if (r < 0)
		return r;
	return ckpt_inode_decode(ino, val, sizeof(val), ret);
}

static int db_load_extents(ckpt_store *s, uint64_t ino, struct ckpt_extent_list **ret_list)
{
	uint8_t key[16];
	uint8_t *val;
	size_t vlen;
	int r = ckpt_index_get(s->ix, key, ckpt_key_ino(key, CKPT_KEY_FILE, ino), &val, &vlen);

	if (r == -ENOENT) {
		*ret_list = ckpt_extent_list_new();
		return *ret_list ? 0 : -ENOMEM;
	}
	if (r < 0)
		return r;
	r = ckpt_extent_list_decode(val, vlen, ret_list);
	free(val);
	if (r < 0)
		ckpt_err("%s: extent list of inode %" PRIu64 " is damaged", s->path, ino);
	return r;
}

/* Write the content of n files into the index in one batch.  Caller holds
 * commit_lock.  Files that no longer exist are skipped. */
static int commit_many(ckpt_store *s, struct commit *const *v, size_t n, bool durable)
{
	struct delta *dv = NULL;
	size_t ndv = 0, cap = 0;
	ckpt_batch *b = NULL;
	int r = 0;

	for (size_t i = 0; i < n && r == 0; i++)
		r = sync_pending_of(s, v[i]->list);
	if (r < 0)
		return r;
	b = ckpt_batch_new();
	if (!b)
		return -ENOMEM;
	pthread_mutex_lock(&s->ns_lock);
	for (size_t i = 0; i < n; i++) {
		struct ckpt_extent_list *old = NULL;
		struct ckpt_inode in;
		uint8_t key[16], *enc = NULL;
		size_t enclen;

		r = db_getattr(s, v[i]->ino, &in);
		if (r == -ENOENT || (r == 0 && !S_ISREG(in.mode))) {
			r = 0; /* deleted meanwhile */
			continue;
		}
		if (r == 0)
			r = db_load_extents(s, v[i]->ino, &old);
		if (r == 0)
			r = delta_add(&dv, &ndv, &cap, v[i]->list, 1);
		if (r == 0)
			r = delta_add(&dv, &ndv, &cap, old, -1);
		ckpt_extent_list_free(old);
		if (r < 0)
			goto out;
		ckpt_key_ino(key, CKPT_KEY_FILE, v[i]->ino);
		if (v[i]->list->n > 0) {
			r = ckpt_extent_list_encode(v[i]->list, &enc, &enclen);
			if (r < 0)
				goto out;
			ckpt_batch_put(b, key, 9, enc, enclen);
			free(enc);
		} else {
			ckpt_batch_delete(b, key, 9);
		}
		in.size = v[i]->list->size;
		in.flags = v[i]->flags;
		in.mtime_ns = v[i]->mtime_ns;
		in.ctime_ns = v[i]->mtime_ns;
		batch_inode(b, &in);
	}
	ndv = delta_merge(dv, ndv);
	r = apply_delta(s, b, dv, ndv);
	if (r < 0)
		goto out;
	r = ckpt_index_write(s->ix, b, durable);
	if (r < 0)
		goto out;
	for (size_t i = 0; i < ndv; i++)
		if (dv[i].n > 0)
			pending_remove(s, &dv[i].d);
out:
	pthread_mutex_unlock(&s->ns_lock);
	free(dv);
	ckpt_batch_free(b);
	return r;
}

static void commit_free(struct commit *c)
{
	if (!c)
		return;
	ckpt_extent_list_free(c->list);
	free(c);
}

/* Remove and return the overlay entry of ino.  Caller holds overlay_lock. */
static struct commit *overlay_take_locked(ckpt_store *s, uint64_t ino)
{
	struct commit **pp = &s->overlay[ino % COMMIT_BUCKETS], *c;

	for (; (c = *pp); pp = &c->next) {
		if (c->ino == ino) {
			*pp = c->next;
			s->overlay_n--;
			s->overlay_bytes -= c->list->size;
			return c;
		}
	}
	return NULL;
}

static struct commit *overlay_find_locked(ckpt_store *s, uint64_t ino)
{
	struct commit *c = s->overlay[ino % COMMIT_BUCKETS];

	while (c && c->ino != ino)
		c = c->next;
	return c;
}

/* Reinsert an entry taken out for a commit that failed, unless a newer
 * one arrived meanwhile (then c is dropped).  Takes ownership of c. */
static void overlay_put_back(ckpt_store *s, struct commit *c)
{
	pthread_mutex_lock(&s->overlay_lock);
	if (!overlay_find_locked(s, c->ino)) {
		c->next = s->overlay[c->ino % COMMIT_BUCKETS];
		s->overlay[c->ino % COMMIT_BUCKETS] = c;
		s->overlay_n++;
		s->overlay_bytes += c->list->size;
		c = NULL;
	}
	pthread_mutex_unlock(&s->overlay_lock);
	commit_free(c);
}

static struct commit *overlay_take(ckpt_store *s, uint64_t ino)
{
	struct commit *c;

	pthread_mutex_lock(&s->overlay_lock);
	c = overlay_take_locked(s, ino);
	pthread_mutex_unlock(&s->overlay_lock);
	return c;
}

static int overlay_flush_if_any(ckpt_store *s)
{
	bool any;

	pthread_mutex_lock(&s->overlay_lock);
	any = s->overlay_n > 0;
	pthread_mutex_unlock(&s->overlay_lock);
	return any ? ckpt_store_flush(s) : 0;
}

int ckpt_store_flush(ckpt_store *s)
{
	struct commit **v = NULL;
	size_t n = 0;
	int r = 0;

	if (s->opts.mode != CKPT_STORE_RW)
		return 0;
	pthread_mutex_lock(&s->commit_lock);
	/* Copy the entries: they stay visible in the overlay until the batch
	 * that makes them visible in the index is written. */
	pthread_mutex_lock(&s->overlay_lock);
	if (s->overlay_n > 0)
		v = calloc(s->overlay_n, sizeof(*v));
	for (size_t b = 0; v && b < COMMIT_BUCKETS; b++) {
		for (struct commit *c = s->overlay[b]; c; c = c->next) {
			struct commit *copy = calloc(1, sizeof(*copy));
			if (copy)
				copy->list = ckpt_extent_list_dup(c->list);
			if (!copy || !copy->list) {
				commit_free(copy);
				r = -ENOMEM;
				break;
			}
			copy->ino = c->ino;
			copy->flags = c->flags;
			copy->mtime_ns = c->mtime_ns;
			copy->seq = c->seq;
			v[n++] = copy;
		}
	}
	if (s->overlay_n > 0 && !v)
		r = -ENOMEM;
	pthread_mutex_unlock(&s->overlay_lock);
	if (r == 0 && n > 0) {
		r = commit_many(s, v, n, false);
		if (r < 0 && n > 1) {
			/* isolate the entry that fails: index the others one by one */
			int first = r;
			r = 0;
			for (size_t i = 0; i < n; i++) {
				int ri = commit_many(s, &v[i], 1, false);
				if (ri < 0) {
					ckpt_err("%s: cannot index closed file (inode %" PRIu64
						 "): %s (will retry)", s->path, v[i]->ino, strerror(-ri));
					v[i]->seq = UINT64_MAX; /* keep its overlay entry */
					r = first;
				}
			}
		}
		pthread_mutex_lock(&s->overlay_lock);
		for (size_t i = 0; i < n; i++) {
			struct commit *c = overlay_find_locked(s, v[i]->ino);
			if (c && c->seq == v[i]->seq && (r == 0 || v[i]->seq != UINT64_MAX))
				commit_free(overlay_take_locked(s, v[i]->ino));
		}
		pthread_mutex_unlock(&s->overlay_lock);
		if (r < 0 && n == 1)
			ckpt_err("%s: cannot index closed file (inode %" PRIu64 "): %s (will retry)",
				 s->path, v[0]->ino, strerror(-r));
	}
	pthread_mutex_unlock(&s->commit_lock);
	for (size_t i = 0; i < n; i++)
		commit_free(v[i]);
	free(v);
	return r;
}

static void *flusher_main(void *arg)
{
	ckpt_store *s = arg;

	pthread_mutex_lock(&s->overlay_lock);
	while (!s->flusher_stop) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&s->flusher_cond, &s->overlay_lock, &ts);
		if (s->overlay_n > 0) {
			pthread_mutex_unlock(&s->overlay_lock);
			ckpt_store_flush(s);
			pthread_mutex_lock(&s->overlay_lock);
		}
	}
	pthread_mutex_unlock(&s->overlay_lock);
	return NULL;
}

int ckpt_store_commit_file(ckpt_store *s, uint64_t ino, const struct ckpt_extent_list *l,
			   uint32_t flags, int64_t mtime_ns, bool durable)
{
	struct commit *c, *old;
	int r;

	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	c = calloc(1, sizeof(*c));
	if (c)
		c->list = ckpt_extent_list_dup(l);
	if (!c || !c->list) {
		commit_free(c);
		return -ENOMEM;
	}
	c->ino = ino;
	c->flags = flags;
	c->mtime_ns = mtime_ns;
	if (durable) {
		struct commit *prev;

		pthread_mutex_lock(&s->commit_lock);
		prev = overlay_take(s, ino); /* superseded if this succeeds */
		r = commit_many(s, &c, 1, true);
		if (r < 0 && prev)
			overlay_put_back(s, prev); /* the last close stays visible */
		else
			commit_free(prev);
		pthread_mutex_unlock(&s->commit_lock);
		commit_free(c);
		return r;
	}
	pthread_mutex_lock(&s->overlay_lock);
	old = overlay_take_locked(s, ino);
	c->seq = ++s->overlay_seq;
	c->next = s->overlay[ino % COMMIT_BUCKETS];
	s->overlay[ino % COMMIT_BUCKETS] = c;
	s->overlay_n++;
	s->overlay_bytes += l->size;
	if (s->overlay_bytes > CKPT_OVERLAY_FLUSH_BYTES)
		pthread_cond_signal(&s->flusher_cond);
	pthread_mutex_unlock(&s->overlay_lock);
	commit_free(old);
	return 0;
}

int ckpt_store_sync_file(ckpt_store *s, uint64_t ino)
{
	struct commit *c;
	int r;

	if (s->opts.mode != CKPT_STORE_RW)
		return 0;
	pthread_mutex_lock(&s->commit_lock);
	c = overlay_take(s, ino);
	if (c)
		r = commit_many(s, &c, 1, true);
	else
		r = ckpt_index_sync_wal(s->ix);
	if (r < 0 && c) {
		overlay_put_back(s, c); /* keep it for the background flush */
		c = NULL;
	}
	pthread_mutex_unlock(&s->commit_lock);
	commit_free(c);
	return r;
}

/* ------------------------------------------------------------ namespace */

int ckpt_store_getattr(ckpt_store *s, uint64_t ino, struct ckpt_inode *ret)
{
	struct commit *c;
	int r = db_getattr(s, ino, ret);

	if (r < 0 || !S_ISREG(ret->mode))
		return r;
	pthread_mutex_lock(&s->overlay_lock);
	c = overlay_find_locked(s, ino);
	if (c) {
		ret->size = c->list->size;
		ret->flags = c->flags;
		ret->mtime_ns = c->mtime_ns;
		if (ret->ctime_ns < c->mtime_ns)
			ret->ctime_ns = c->mtime_ns;
	}
	pthread_mutex_unlock(&s->overlay_lock);
	return 0;
}

static int check_name(const char *name)
{
	size_t n = strlen(name);

	if (n == 0 || strchr(name, '/'))
		return -EINVAL;
	if (n > CKPT_NAME_MAX)
		return -ENAMETOOLONG;
	return 0;
}

static int get_dentry(ckpt_store *s, uint64_t parent, const char *name, uint64_t *ret_ino,
		      uint32_t *ret_mode)
{
	uint8_t key[CKPT_KEY_MAX], val[CKPT_DENTRY_REC_LEN];
	size_t klen = ckpt_key_dentry(key, parent, name, strlen(name));
	int r = ckpt_index_get_fixed(s->ix, key, klen, val, sizeof(val));

	if (r < 0)
		return r;
	return ckpt_dentry_decode(val, sizeof(val), ret_ino, ret_mode);
}

int ckpt_store_lookup(ckpt_store *s, uint64_t parent, const char *name, struct ckpt_inode *ret)
{
	uint64_t ino;
	uint32_t mode;
	int r = check_name(name);

	if (r < 0)
		return r;
	r = get_dentry(s, parent, name, &ino, &mode);
	if (r < 0)
		return r;
	return ckpt_store_getattr(s, ino, ret);
}

static void batch_dentry(ckpt_batch *b, uint64_t parent, const char *name, uint64_t ino,
			 uint32_t mode)
{
	uint8_t key[CKPT_KEY_MAX], val[CKPT_DENTRY_REC_LEN];

	ckpt_dentry_encode(ino, mode & S_IFMT, val);
	ckpt_batch_put(b, key, ckpt_key_dentry(key, parent, name, strlen(name)), val, sizeof(val));
}

static void batch_dentry_delete(ckpt_batch *b, uint64_t parent, const char *name)
{
	uint8_t key[CKPT_KEY_MAX];

	ckpt_batch_delete(b, key, ckpt_key_dentry(key, parent, name, strlen(name)));
}

static void batch_orphan(ckpt_batch *b, uint64_t ino, bool set)
{
	uint8_t key[16];

	ckpt_key_ino(key, CKPT_KEY_ORPHAN, ino);
	if (set)
		ckpt_batch_put(b, key, 9, "", 0);
	else
		ckpt_batch_delete(b, key, 9);
}

static int get_dir(ckpt_store *s, uint64_t ino, struct ckpt_inode *ret)
{
	int r = db_getattr(s, ino, ret);

	if (r < 0)
		return r;
	if (!S_ISDIR(ret->mode))
		return -ENOTDIR;
	if (ret->nlink == 0)
		return -ENOENT;
	return 0;
}

int ckpt_store_mknode(ckpt_store *s, uint64_t parent, const char *name, uint32_t mode,
		      uint32_t uid, uint32_t gid, const char *symlink_target,
		      struct ckpt_inode *ret)
{
	struct ckpt_inode dir, in;
	ckpt_batch *b = NULL;
	uint64_t ino;
	uint32_t m;
	int r = check_name(name);

	if (r < 0)
		return r;
	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	if (!S_ISREG(mode) && !S_ISDIR(mode) && !S_ISLNK(mode))
		return -EPERM;
	if (symlink_target && strlen(symlink_target) >= PATH_MAX)
		return -ENAMETOOLONG;
	pthread_mutex_lock(&s->ns_lock);
	r = get_dir(s, parent, &dir);
	if (r < 0)
		goto out;
	r = get_dentry(s, parent, name, &ino, &m);
	if (r == 0) {
		r = -EEXIST;
		goto out;
	}
	if (r != -ENOENT)
		goto out;
	b = ckpt_batch_new();
	if (!b) {
		r = -ENOMEM;
		goto out;
	}
	memset(&in, 0, sizeof(in));
	in.ino = s->next_ino;
	in.mode = mode;
	in.uid = uid;
	in.gid = gid;
	in.nlink = S_ISDIR(mode) ? 2 : 1;
	in.atime_ns = in.mtime_ns = in.ctime_ns = now_ns();
	in.parent = S_ISDIR(mode) ? parent : 0;
	in.generation = 1;
	if (S_ISLNK(mode)) {
		uint8_t key[16];
		in.size = strlen(symlink_target);
		ckpt_batch_put(b, key, ckpt_key_ino(key, CKPT_KEY_LINK, in.ino), symlink_target,
			       in.size);
	}
	batch_inode(b, &in);
	batch_dentry(b, parent, name, in.ino, mode);
	dir.mtime_ns = dir.ctime_ns = in.ctime_ns;
	if (S_ISDIR(mode))
		dir.nlink++;
	batch_inode(b, &dir);
	batch_meta_u64(b, "next_ino", in.ino + 1);
	r = ckpt_index_write(s->ix, b, false);
	if (r < 0)
		goto out;
	s->next_ino++;
	*ret = in;
out:
	pthread_mutex_unlock(&s->ns_lock);
	ckpt_batch_free(b);
	return r;
}

int ckpt_store_link(ckpt_store *s, uint64_t ino, uint64_t newparent, const char *newname,
		    struct ckpt_inode *ret)
{
	struct ckpt_inode dir, in;
	ckpt_batch *b = NULL;
	uint64_t x;
	uint32_t m;
	int r = check_name(newname);

	if (r < 0)
		return r;
	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	pthread_mutex_lock(&s->ns_lock);
	r = get_dir(s, newparent, &dir);
	if (r < 0)
		goto out;
	r = db_getattr(s, ino, &in);
	if (r < 0)
		goto out;
	if (S_ISDIR(in.mode)) {
		r = -EPERM;
		goto out;
	}
	r = get_dentry(s, newparent, newname, &x, &m);
	if (r == 0) {
		r = -EEXIST;
		goto out;
	}
	if (r != -ENOENT)
		goto out;
	b = ckpt_batch_new();
	if (!b) {
		r = -ENOMEM;
		goto out;
	}
	if (in.nlink == 0)
		batch_orphan(b, ino, false);
	in.nlink++;
	in.ctime_ns = now_ns();
	batch_inode(b, &in);
	batch_dentry(b, newparent, newname, ino, in.mode);
	dir.mtime_ns = dir.ctime_ns = in.ctime_ns;
	batch_inode(b, &dir);
	r = ckpt_index_write(s->ix, b, false);
	if (r == 0)
		*ret = in;
out:
	pthread_mutex_unlock(&s->ns_lock);
	ckpt_batch_free(b);
	return r;
}

int ckpt_store_readlink(ckpt_store *s, uint64_t ino, char **ret_target)
{
	uint8_t key[16];
	uint8_t *val;
	size_t vlen;
	char *t;
	int r = ckpt_index_get(s->ix, key, ckpt_key_ino(key, CKPT_KEY_LINK, ino), &val, &vlen);

	if (r == -ENOENT)
		return -EINVAL;
	if (r < 0)
		return r;
	t = malloc(vlen + 1);
	if (!t) {
		free(val);
		return -ENOMEM;
	}
	memcpy(t, val, vlen);
	t[vlen] = '\0';
	free(val);
	*ret_target = t;
	return 0;
}

static int dir_is_empty(ckpt_store *s, uint64_t ino)
{
	uint8_t prefix[9];
	const uint8_t *k, *v;
	size_t kl, vl;
	ckpt_iter *it;
	int r;

	prefix[0] = CKPT_KEY_DENTRY;
	ckpt_put_be64(prefix + 1, ino);
	r = ckpt_iter_new(s->ix, prefix, sizeof(prefix), &it);
	if (r < 0)
		return r;
	r = ckpt_iter_next(it, &k, &kl, &v, &vl);
	ckpt_iter_free(it);
	if (r < 0)
		return r;
	return r == 0 ? 1 : 0;
}

/* Drop one name of victim (already removed from its directory by the
 * caller's batch).  Caller holds ns_lock. */
static void drop_link(ckpt_batch *b, struct ckpt_inode *victim, int64_t now)
{
	if (S_ISDIR(victim->mode))
		victim->nlink = 0;
	else if (victim->nlink > 0)
		victim->nlink--;
	victim->ctime_ns = now;
	if (victim->nlink == 0)
		batch_orphan(b, victim->ino, true);
	batch_inode(b, victim);
}

int ckpt_store_unlink(ckpt_store *s, uint64_t parent, const char *name, bool rmdir)
{
	struct ckpt_inode dir, victim;
	ckpt_batch *b = NULL;
	uint64_t ino;
	uint32_t m;
	int64_t now = now_ns();
	int r = check_name(name);

	if (r < 0)
		return r;
	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	pthread_mutex_lock(&s->ns_lock);
	r = get_dir(s, parent, &dir);
	if (r < 0)
		goto out;
	r = get_dentry(s, parent, name, &ino, &m);
	if (r < 0)
		goto out;
	r = db_getattr(s, ino, &victim);
	if (r < 0)
		goto out;
	if (rmdir && !S_ISDIR(victim.mode)) {
		r = -ENOTDIR;
		goto out;
	}
	if (!rmdir && S_ISDIR(victim.mode)) {
		r = -EISDIR;
		goto out;
	}
	if (rmdir) {
		r = dir_is_empty(s, ino);
		if (r < 0)
			goto out;
		if (r == 0) {
			r = -ENOTEMPTY;
			goto out;
		}
		dir.nlink--;
	}
	b = ckpt_batch_new();
	if (!b) {
		r = -ENOMEM;
		goto out;
	}
	batch_dentry_delete(b, parent, name);
	drop_link(b, &victim, now);
	dir.mtime_ns = dir.ctime_ns = now;
	batch_inode(b, &dir);
	r = ckpt_index_write(s->ix, b, false);
out:
	pthread_mutex_unlock(&s->ns_lock);
	ckpt_batch_free(b);
	return r;
}

/* Is `anc` an ancestor of (or equal to) dir `ino`?  Caller holds ns_lock. */
static int is_ancestor(ckpt_store *s, uint64_t anc, uint64_t ino)
{
	for (int depth = 0; depth < 4096; depth++) {
		struct ckpt_inode in;
		int r;

		if (ino == anc)
			return 1;
		if (ino == CKPT_ROOT_INO)
			return 0;
		r = db_getattr(s, ino, &in);
		if (r < 0)
			return r;
		ino = in.parent;
	}
	return -ELOOP;
}

int ckpt_store_rename(ckpt_store *s, uint64_t parent, const char *name, uint64_t newparent,
		      const char *newname, unsigned flags)
{
	struct ckpt_inode pdir, ndir, src, dst;
	bool have_dst = false, same_dir = parent == newparent;
	ckpt_batch *b = NULL;
	uint64_t sino, dino;
	uint32_t m;
	int64_t now = now_ns();
	int r;

	if ((r = check_name(name)) < 0 || (r = check_name(newname)) < 0)
		return r;
	if (flags & ~(unsigned)(RENAME_NOREPLACE | RENAME_EXCHANGE))
		return -EINVAL;
	if ((flags & RENAME_NOREPLACE) && (flags & RENAME_EXCHANGE))
		return -EINVAL;
	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	/* Publishing by rename (save under a temporary name, then rename) must
	 * not publish a name whose content is only in memory: index the closed
	 * files first, so that a daemon crash after rename() returned cannot
	 * leave the new name pointing at old or empty content. */
	r = overlay_flush_if_any(s);
	if (r < 0)
		return r;
	pthread_mutex_lock(&s->ns_lock);
	if ((r = get_dir(s, parent, &pdir)) < 0 || (r = get_dir(s, newparent, &ndir)) < 0)
		goto out;
	if ((r = get_dentry(s, parent, name, &sino, &m)) < 0)
		goto out;
	if ((r = db_getattr(s, sino, &src)) < 0)
		goto out;
	r = get_dentry(s, newparent, newname, &dino, &m);
	if (r == 0) {
		have_dst = true;
		if ((r = db_getattr(s, dino, &dst)) < 0)
			goto out;
	} else if (r != -ENOENT) {
		goto out;
	}
	if (have_dst && (flags & RENAME_NOREPLACE)) {
		r = -EEXIST;
		goto out;
	}
	if (!have_dst && (flags & RENAME_EXCHANGE)) {
		r = -ENOENT;
		goto out;
	}
	if (have_dst && dino == sino) {
		r = 0; /* same inode: POSIX says do nothing */
		goto out;
	}
	/* A directory may not move below itself. */
	if (S_ISDIR(src.mode) && !same_dir) {
		r = is_ancestor(s, sino, newparent);
		if (r < 0)
			goto out;
		if (r) {
			r = -EINVAL;
			goto out;
		}
	}
	if ((flags & RENAME_EXCHANGE) && S_ISDIR(dst.mode) && !same_dir) {
		r = is_ancestor(s, dino, parent);
		if (r < 0)
			goto out;
		if (r) {
			r = -EINVAL;
			goto out;
		}
	}
	if (have_dst && !(flags & RENAME_EXCHANGE)) {
		if (S_ISDIR(src.mode) && !S_ISDIR(dst.mode)) {
			r = -ENOTDIR;
			goto out;
		}
		if (!S_ISDIR(src.mode) && S_ISDIR(dst.mode)) {
			r = -EISDIR;
			goto out;
		}
		if (S_ISDIR(dst.mode)) {
			r = dir_is_empty(s, dino);
			if (r < 0)
				goto out;
			if (r == 0) {
				r = -ENOTEMPTY;
				goto out;
			}
		}
	}
	b = ckpt_batch_new();
	if (!b) {
		r = -ENOMEM;
		goto out;
	}
	/* Link-count changes of the two parent directories (one inode when
	 * same_dir: then both deltas apply to it). */
	{
		int pdelta = 0, ndelta = 0;

		if (flags & RENAME_EXCHANGE) {
			batch_dentry(b, parent, name, dino, dst.mode);
			batch_dentry(b, newparent, newname, sino, src.mode);
			if (!same_dir) {
				if (S_ISDIR(src.mode)) {
					src.parent = newparent;
					pdelta--;
					ndelta++;
				}
				if (S_ISDIR(dst.mode)) {
					dst.parent = parent;
					ndelta--;
					pdelta++;
				}
			}
			dst.ctime_ns = now;
			batch_inode(b, &dst);
		} else {
			batch_dentry_delete(b, parent, name);
			batch_dentry(b, newparent, newname, sino, src.mode);
			if (have_dst) {
				drop_link(b, &dst, now);
				if (S_ISDIR(dst.mode))
					ndelta--;
			}
			if (S_ISDIR(src.mode)) {
				src.parent = newparent;
				pdelta--;
				ndelta++;
			}
		}
		src.ctime_ns = now;
		batch_inode(b, &src);
		if (same_dir) {
			pdir.nlink = (uint32_t)((int64_t)pdir.nlink + pdelta + ndelta);
			pdir.mtime_ns = pdir.ctime_ns = now;
			batch_inode(b, &pdir);
		} else {
			pdir.nlink = (uint32_t)((int64_t)pdir.nlink + pdelta);
			ndir.nlink = (uint32_t)((int64_t)ndir.nlink + ndelta);
			pdir.mtime_ns = pdir.ctime_ns = now;
			ndir.mtime_ns = ndir.ctime_ns = now;
			batch_inode(b, &pdir);
			batch_inode(b, &ndir);
		}
	}
	r = ckpt_index_write(s->ix, b, false);
out:
	pthread_mutex_unlock(&s->ns_lock);
	ckpt_batch_free(b);
	return r;
}

int ckpt_store_reap(ckpt_store *s, uint64_t ino)
{
	struct ckpt_extent_list *old = NULL;
	struct delta *dv = NULL;
	size_t ndv = 0;
	struct ckpt_inode in;
	ckpt_batch *b = NULL;
	uint8_t key[16], *val;
	size_t vlen;
	int r;

	if (s->opts.mode != CKPT_STORE_RW)
		return 0;
	pthread_mutex_lock(&s->commit_lock);
	pthread_mutex_lock(&s->ns_lock);
	r = ckpt_index_get(s->ix, key, ckpt_key_ino(key, CKPT_KEY_ORPHAN, ino), &val, &vlen);
	if (r == -ENOENT) {
		r = 0;
		goto out;
	}
	if (r < 0)
		goto out;
	free(val);
	r = db_getattr(s, ino, &in);
	b = ckpt_batch_new();
	if (!b) {
		r = -ENOMEM;
		goto out;
	}
	if (r == 0 && in.nlink > 0) {
		batch_orphan(b, ino, false); /* stale marker */
		r = ckpt_index_write(s->ix, b, false);
		goto out;
	}
	if (r == 0 && S_ISREG(in.mode)) {
		r = db_load_extents(s, ino, &old);
		if (r < 0)
			goto out;
		r = build_delta(NULL, old, &dv, &ndv);
		if (r < 0)
			goto out;
		r = apply_delta(s, b, dv, ndv);
		if (r < 0)
			goto out;
	}
	ckpt_batch_delete(b, key, ckpt_key_ino(key, CKPT_KEY_INODE, ino));
	ckpt_batch_delete(b, key, ckpt_key_ino(key, CKPT_KEY_FILE, ino));
	ckpt_batch_delete(b, key, ckpt_key_ino(key, CKPT_KEY_LINK, ino));
	ckpt_batch_delete(b, key, ckpt_key_ino(key, CKPT_KEY_PARSED, ino));
	batch_orphan(b, ino, false);
	r = ckpt_index_write(s->ix, b, false);
	if (r == 0)
		commit_free(overlay_take(s, ino)); /* content of a deleted file */
out:
	pthread_mutex_unlock(&s->ns_lock);
	pthread_mutex_unlock(&s->commit_lock);
	ckpt_batch_free(b);
	ckpt_extent_list_free(old);
	free(dv);
	return r;
}

int ckpt_store_setattr(ckpt_store *s, uint64_t ino, unsigned what, const struct ckpt_inode *in,
		       struct ckpt_inode *ret)
{
	struct ckpt_inode cur;
	ckpt_batch *b = NULL;
	int r;

	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	pthread_mutex_lock(&s->ns_lock);
	r = db_getattr(s, ino, &cur);
	if (r < 0)
		goto out;
	if (what & CKPT_SET_MODE)
		cur.mode = (cur.mode & S_IFMT) | (in->mode & 07777);
	if (what & CKPT_SET_UID)
		cur.uid = in->uid;
	if (what & CKPT_SET_GID)
		cur.gid = in->gid;
	if (what & CKPT_SET_ATIME)
		cur.atime_ns = in->atime_ns;
	if (what & CKPT_SET_MTIME)
		cur.mtime_ns = in->mtime_ns;
	cur.ctime_ns = (what & CKPT_SET_CTIME) ? in->ctime_ns : now_ns();
	b = ckpt_batch_new();
	if (!b) {
		r = -ENOMEM;
		goto out;
	}
	batch_inode(b, &cur);
	r = ckpt_index_write(s->ix, b, false);
	if (r == 0 && (what & CKPT_SET_MTIME)) {
		/* a closed file's pending content must not undo utimens() */
		struct commit *c;
		pthread_mutex_lock(&s->overlay_lock);
		c = overlay_find_locked(s, ino);
		if (c)
			c->mtime_ns = cur.mtime_ns;
		pthread_mutex_unlock(&s->overlay_lock);
	}
	if (r == 0 && ret)
		*ret = cur;
out:
	pthread_mutex_unlock(&s->ns_lock);
	ckpt_batch_free(b);
	return r;
}

void ckpt_dirents_free(struct ckpt_dirent *ents, size_t n)
{
	for (size_t i = 0; ents && i < n; i++)
		free(ents[i].name);
	free(ents);
}

int ckpt_store_readdir(ckpt_store *s, uint64_t ino, struct ckpt_dirent **ret_ents,
		       size_t *ret_n)
{
	struct ckpt_dirent *v = NULL;
	size_t n = 0, cap = 0;
	uint8_t prefix[9];
	const uint8_t *k, *val;
	size_t kl, vl;
	ckpt_iter *it = NULL;
	int r;

	prefix[0] = CKPT_KEY_DENTRY;
	ckpt_put_be64(prefix + 1, ino);
	r = ckpt_iter_new(s->ix, prefix, sizeof(prefix), &it);
	if (r < 0)
		return r;
	while ((r = ckpt_iter_next(it, &k, &kl, &val, &vl)) > 0) {
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 32;
			struct ckpt_dirent *nv = realloc(v, nc * sizeof(*nv));
			if (!nv) {
				r = -ENOMEM;
				break;
			}
			v = nv;
			cap = nc;
		}
		r = ckpt_dentry_decode(val, vl, &v[n].ino, &v[n].mode);
		if (r < 0)
			break;
		v[n].name = strndup((const char *)k + 9, kl - 9);
		if (!v[n].name) {
			r = -ENOMEM;
			break;
		}
		n++;
	}
	ckpt_iter_free(it);
	if (r < 0) {
		ckpt_dirents_free(v, n);
		return r;
	}
	*ret_ents = v;
	*ret_n = n;
	return 0;
}

int ckpt_store_statfs(ckpt_store *s, struct statvfs *ret)
{
	if (fstatvfs(s->packs_fd, ret) < 0)
		return -errno;
	ret->f_namemax = CKPT_NAME_MAX;
	return 0;
}

char *ckpt_store_path_of(ckpt_store *s, uint64_t ino)
{
	/* Directories know their parent; for files search the parent's
	 * entries is too costly, so callers pass a directory + name where they
	 * can.  Here: walk up for directories, "<inode N>" otherwise. */
	char *path = strdup("");
	uint64_t cur = ino;

	for (int depth = 0; path && cur != CKPT_ROOT_INO && depth < 256; depth++) {
		struct ckpt_inode in, pin;
		struct ckpt_dirent *ents = NULL;
		size_t n = 0;
		const char *nm = NULL;
		char *np;

		if (db_getattr(s, cur, &in) < 0 || !S_ISDIR(in.mode) ||
		    db_getattr(s, in.parent, &pin) < 0 ||
		    ckpt_store_readdir(s, in.parent, &ents, &n) < 0) {
			if (asprintf(&np, "<inode %" PRIu64 ">%s", cur, path) < 0)
				np = NULL;
			free(path);
			return np;
		}
		for (size_t i = 0; i < n; i++)
			if (ents[i].ino == cur)
				nm = ents[i].name;
		if (asprintf(&np, "/%s%s", nm ? nm : "?", path) < 0)
			np = NULL;
		ckpt_dirents_free(ents, n);
		free(path);
		path = np;
		cur = in.parent;
	}
	if (path && !*path) {
		free(path);
		path = strdup("/");
	}
	return path;
}

/* ------------------------------------------------------------ open/close */

static int read_marker(int dfd, const char *path, char *err, size_t errlen)
{
	char buf[64];
	ssize_t n;
	unsigned ver;
	int fd = openat(dfd, MARKER_NAME, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0)
		return -EIO;
	buf[n] = '\0';
	if (sscanf(buf, MARKER_MAGIC " %u", &ver) != 1) {
		snprintf(err, errlen, "%s: not a ckptfs store (bad %s marker)", path, MARKER_NAME);
		return -EINVAL;
	}
	if (ver > CKPT_STORE_FORMAT) {
		snprintf(err, errlen,
			 "%s: store format %u is newer than this ckptfs supports (%d); upgrade ckptfs",
			 path, ver, CKPT_STORE_FORMAT);
		return -EPROTONOSUPPORT;
	}
	if (ver < 1) {
		snprintf(err, errlen, "%s: invalid store format %u", path, ver);
		return -EINVAL;
	}
	return 0;
}

static int dir_is_empty_fs(int dfd)
{
	int fd = dup(dfd);
	DIR *d;
	struct dirent *de;
	int empty = 1;

	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
		    strcmp(de->d_name, "lost+found"))
			empty = 0;
	closedir(d);
	return empty;
}

static int write_marker(int dfd)
{
	char buf[64];
	int n = snprintf(buf, sizeof(buf), MARKER_MAGIC " %d\n", CKPT_STORE_FORMAT);
	int fd = openat(dfd, MARKER_NAME ".tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	int r = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, buf, (size_t)n) != n || fsync(fd) < 0)
		r = -errno ? -errno : -EIO;
	close(fd);
	if (r == 0 && renameat(dfd, MARKER_NAME ".tmp", dfd, MARKER_NAME) < 0)
		r = -errno;
	if (r == 0 && fsync(dfd) < 0)
		r = -errno;
	return r;
}

/* Initialize meta and the root directory of a fresh index. */
static int init_index(ckpt_store *s)
{
	uint8_t secret[CKPT_SECRET_LEN], buf[4];
	struct ckpt_inode root;
	ckpt_batch *b;
	int r;

	r = ckpt_secret_generate(secret, sizeof(secret));
	if (r < 0)
		return r;
	r = ckpt_secret_generate(s->uuid, sizeof(s->uuid));
	if (r < 0)
		return r;
	b = ckpt_batch_new();
	if (!b)
		return -ENOMEM;
	ckpt_put_le32(buf, CKPT_STORE_FORMAT);
	batch_meta_bytes(b, "format", buf, 4);
	batch_meta_bytes(b, "secret", secret, sizeof(secret));
	batch_meta_bytes(b, "uuid", s->uuid, sizeof(s->uuid));
	batch_meta_u64(b, "next_ino", CKPT_ROOT_INO + 1);
	batch_meta_u64(b, "next_pack", 1);
	memset(&root, 0, sizeof(root));
	root.ino = CKPT_ROOT_INO;
	root.mode = S_IFDIR | 0755;
	root.nlink = 2;
	root.uid = getuid();
	root.gid = getgid();
	root.atime_ns = root.mtime_ns = root.ctime_ns = now_ns();
	root.parent = CKPT_ROOT_INO;
	root.generation = 1;
	batch_inode(b, &root);
	r = ckpt_index_write(s->ix, b, true);
	ckpt_batch_free(b);
	return r;
}

static int load_meta(ckpt_store *s, char *err, size_t errlen)
{
	uint8_t key[64], secret[CKPT_SECRET_LEN], buf[4];
	int r;

	r = ckpt_index_get_fixed(s->ix, key, ckpt_key_meta(key, "format"), buf, 4);
	if (r == 0 && ckpt_get_le32(buf) > CKPT_STORE_FORMAT) {
		snprintf(err, errlen, "%s: index format %u is newer than supported (%d)", s->path,
			 ckpt_get_le32(buf), CKPT_STORE_FORMAT);
		return -EPROTONOSUPPORT;
	}
	if (r == 0)
		r = ckpt_index_get_fixed(s->ix, key, ckpt_key_meta(key, "secret"), secret,
					 sizeof(secret));
	if (r == 0)
		r = ckpt_index_get_fixed(s->ix, key, ckpt_key_meta(key, "uuid"), s->uuid,
					 sizeof(s->uuid));
	if (r == 0)
		r = meta_get_u64(s, "next_ino", &s->next_ino);
	if (r == 0)
		r = meta_get_u64(s, "next_pack", &s->next_pack);
	if (r < 0) {
		snprintf(err, errlen, "%s: index metadata missing or damaged (%s)", s->path,
			 strerror(-r));
		return r == -ENOENT ? -EIO : r;
	}
	return ckpt_hasher_new(secret, sizeof(secret), &s->hasher);
}

/* Remove leftovers of files being rewritten when the last process died. */
static void clean_staging(ckpt_store *s, int dfd)
{
	int fd = openat(dfd, "staging", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d;
	struct dirent *de;

	if (fd < 0)
		return;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return;
	}
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			unlinkat(fd, de->d_name, 0);
	closedir(d);
	(void)s;
}

static int reap_orphans(ckpt_store *s)
{
	uint8_t prefix[1] = { CKPT_KEY_ORPHAN };
	const uint8_t *k, *v;
	size_t kl, vl;
	uint64_t *inos = NULL;
	size_t n = 0, cap = 0;
	ckpt_iter *it;
	int r = ckpt_iter_new(s->ix, prefix, 1, &it);

	if (r < 0)
		return r;
	while ((r = ckpt_iter_next(it, &k, &kl, &v, &vl)) > 0) {
		if (kl != 9)
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 16;
			uint64_t *ni = realloc(inos, nc * sizeof(*ni));
			if (!ni) {
				r = -ENOMEM;
				break;
			}
			inos = ni;
			cap = nc;
		}
		inos[n++] = ckpt_get_be64(k + 1);
	}
	ckpt_iter_free(it);
	for (size_t i = 0; r >= 0 && i < n; i++)
		r = ckpt_store_reap(s, inos[i]);
	free(inos);
	return r < 0 ? r : 0;
}

int ckpt_store_open(const char *path, const struct ckpt_store_opts *o, ckpt_store **ret_store,
		    char *err, size_t errlen)
{
	ckpt_store *s = NULL;
	char *ixdir = NULL;
	bool fresh = false;
	int dfd = -1, r;

	err[0] = '\0';
	if (o->compress_level < 0 || o->compress_level > 19) {
		snprintf(err, errlen, "compression level %d out of range 0..19", o->compress_level);
		return -EINVAL;
	}
	if (o->create && mkdir(path, 0755) < 0 && errno != EEXIST) {
		r = -errno;
		snprintf(err, errlen, "%s: cannot create store directory: %s", path, strerror(errno));
		return r;
	}
	dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		r = -errno;
		snprintf(err, errlen, "%s: %s", path,
			 errno == ENOENT ? "no such store (directory does not exist)" :
					   strerror(errno));
		return r;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		r = -ENOMEM;
		goto fail;
	}
	s->lock_fd = -1;
	s->packs_fd = -1;
	s->opts = *o;
	s->path = strdup(path);
	pthread_mutex_init(&s->ns_lock, NULL);
	pthread_mutex_init(&s->pack_lock, NULL);
	pthread_rwlock_init(&s->pack_rw, NULL);
	pthread_mutex_init(&s->pending_lock, NULL);
	pthread_mutex_init(&s->commit_lock, NULL);
	pthread_mutex_init(&s->overlay_lock, NULL);
	pthread_mutex_init(&s->bg_lock, NULL);
	pthread_cond_init(&s->bg_cond, NULL);
	pthread_cond_init(&s->flusher_cond, NULL);
	pthread_key_create(&s->tls_key, tls_free);
	pthread_mutex_init(&s->rctx_lock, NULL);

	r = read_marker(dfd, path, err, errlen);
	if (r == -ENOENT) {
		r = dir_is_empty_fs(dfd);
		if (r < 0)
			goto fail;
		if (!r) {
			snprintf(err, errlen, "%s: not a ckptfs store (no %s marker, directory not empty)",
				 path, MARKER_NAME);
			r = -EINVAL;
			goto fail;
		}
		if (!o->create || o->mode != CKPT_STORE_RW) {
			snprintf(err, errlen, "%s: not a ckptfs store (empty directory)", path);
			r = -EINVAL;
			goto fail;
		}
		fresh = true;
	} else if (r < 0) {
		if (!err[0])
			snprintf(err, errlen, "%s: cannot read store marker: %s", path, strerror(-r));
		goto fail;
	}

	if (o->mode != CKPT_STORE_RO_SHARED) {
		s->lock_fd = openat(dfd, "lock", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
		if (s->lock_fd < 0 || flock(s->lock_fd, LOCK_EX | LOCK_NB) < 0) {
			r = errno == EWOULDBLOCK ? -EBUSY : -errno;
			snprintf(err, errlen, "%s: %s", path,
				 r == -EBUSY ? "store is in use (already mounted by another ckptfs "
					       "daemon, or a ckpt command is running)" :
					       strerror(-r));
			goto fail;
		}
	}
	if (fresh) {
		if ((mkdirat(dfd, "packs", 0755) < 0 && errno != EEXIST) ||
		    (mkdirat(dfd, "staging", 0700) < 0 && errno != EEXIST)) {
			r = -errno;
			snprintf(err, errlen, "%s: cannot create store layout: %s", path,
				 strerror(errno));
			goto fail;
		}
	}
	s->packs_fd = openat(dfd, "packs", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (s->packs_fd < 0) {
		r = -errno;
		snprintf(err, errlen, "%s: missing packs directory: %s", path, strerror(errno));
		goto fail;
	}
	if (asprintf(&ixdir, "%s/index", path) < 0) {
		r = -ENOMEM;
		goto fail;
	}
	r = ckpt_index_open(ixdir, fresh, o->mode == CKPT_STORE_RO_SHARED, 64u << 20, &s->ix, err,
			    errlen);
	if (r < 0)
		goto fail;
	if (fresh) {
		r = init_index(s);
		if (r == 0)
			r = write_marker(dfd); /* last: a half-created store has no marker */
		if (r < 0) {
			snprintf(err, errlen, "%s: cannot initialize store: %s", path, strerror(-r));
			goto fail;
		}
	}
	r = load_meta(s, err, errlen);
	if (r < 0)
		goto fail;
	r = ckpt_cache_new(o->cache_size, &s->cache);
	if (r < 0)
		goto fail;
	if (touch_at_open(o)) {
		struct ckpt_cache_stats cs;
		uint64_t want = o->buf_reserve;

		/* the stream entries, the reply buffers and the chunks pinned or
		 * read in part beside them (docs/performance.md 6k) */
		ckpt_cache_get_stats(s->cache, &cs);
		if (want == CKPT_BUF_RESERVE_AUTO)
			want = cs.stream_cap + (32u << 20);
		want = CKPT_MIN(want, o->cache_size);

		/* a knob for speed: without it every buffer is mapped on demand */
		r = ckpt_cache_reserve_bufs(s->cache, want);
		if (r < 0)
			ckpt_warn("%s: cannot reserve %" PRIu64 " MiB of chunk buffers (%s); "
				  "mapping them on demand", path, want >> 20, strerror(-r));
		rctx_warm(s);
	}
	if (o->mode == CKPT_STORE_RW) {
		clean_staging(s, dfd);
		r = reap_orphans(s);
		if (r < 0) {
			snprintf(err, errlen, "%s: cannot reap orphaned files: %s", path,
				 strerror(-r));
			goto fail;
		}
		r = -pthread_create(&s->flusher, NULL, flusher_main, s);
		if (r < 0)
			goto fail;
		s->flusher_started = true;
	}
	if (o->mode == CKPT_STORE_RW && o->background) {
		r = requeue_deferred(s);
		if (r < 0)
			goto fail;
		r = -pthread_create(&s->bg_thread, NULL, bg_main, s);
		if (r < 0)
			goto fail;
		s->bg_started = true;
	}
	free(ixdir);
	close(dfd);
	*ret_store = s;
	return 0;
fail:
	if (!err[0])
		snprintf(err, errlen, "%s: %s", path, strerror(-r));
	free(ixdir);
	close(dfd);
	ckpt_store_free(s);
	return r;
}

void ckpt_store_free(ckpt_store *s)
{
	struct tls_ctx *t;

	if (!s)
		return;
	if (s->bg_started) {
		pthread_mutex_lock(&s->bg_lock);
		s->bg_stop = true;
		pthread_cond_broadcast(&s->bg_cond);
		pthread_mutex_unlock(&s->bg_lock);
		pthread_join(s->bg_thread, NULL);
		s->bg_started = false;
	}
	if (s->flusher_started) {
		pthread_mutex_lock(&s->overlay_lock);
		s->flusher_stop = true;
		pthread_cond_signal(&s->flusher_cond);
		pthread_mutex_unlock(&s->overlay_lock);
		pthread_join(s->flusher, NULL);
	}
	if (s->ix && s->opts.mode == CKPT_STORE_RW) {
		if (ckpt_store_flush(s) < 0)
			ckpt_err("%s: closed files not yet indexed were lost at shutdown", s->path);
		pthread_mutex_lock(&s->pack_lock);
		for (size_t i = 0; i < s->npacks; i++)
			ckpt_pack_sync(s->packs[i], UINT64_MAX);
		pthread_mutex_unlock(&s->pack_lock);
		ckpt_index_flush(s->ix);
	}
	for (size_t i = 0; i < s->npacks; i++)
		ckpt_pack_free(s->packs[i]);
	free(s->packs);
	for (size_t i = 0; i < PENDING_BUCKETS; i++) {
		struct pending *p = s->pending[i], *n;
		for (; p; p = n) {
			n = p->next;
			free(p);
		}
	}
	t = pthread_getspecific(s->tls_key);
	tls_free(t);
	pthread_setspecific(s->tls_key, NULL);
	pthread_key_delete(s->tls_key);
	while (s->rctx_free) {
		struct rctx *x = s->rctx_free;

		s->rctx_free = x->next;
		rctx_free(x);
	}
	pthread_mutex_destroy(&s->rctx_lock);
	ckpt_index_free(s->ix);
	ckpt_cache_free(s->cache);
	ckpt_hasher_free(s->hasher);
	if (s->packs_fd >= 0)
		close(s->packs_fd);
	if (s->lock_fd >= 0)
		close(s->lock_fd);
	pthread_mutex_destroy(&s->ns_lock);
	pthread_mutex_destroy(&s->pack_lock);
	pthread_rwlock_destroy(&s->pack_rw);
	pthread_mutex_destroy(&s->pending_lock);
	for (size_t i = 0; i < COMMIT_BUCKETS; i++) {
		struct commit *c = s->overlay[i], *n;
		for (; c; c = n) {
			n = c->next;
			commit_free(c);
		}
	}
	pthread_mutex_destroy(&s->commit_lock);
	pthread_mutex_destroy(&s->overlay_lock);
	pthread_mutex_destroy(&s->bg_lock);
	pthread_cond_destroy(&s->bg_cond);
	free(s->bgq);
	free(s->bg_skip);
	pthread_cond_destroy(&s->flusher_cond);
	free(s->path);
	free(s);
}

/* ----------------------------------------------------------- maintenance */


static int chunk_info_cmp(const void *a, const void *b)
{
	return memcmp(((const struct chunk_info *)a)->d.bytes, ((const struct chunk_info *)b)->d.bytes,
		      CKPT_DIGEST_LEN);
}

static int load_chunks(ckpt_store *s, struct chunk_info **ret, size_t *ret_n)
{
	uint8_t prefix[1] = { CKPT_KEY_CHUNK };
	const uint8_t *k, *v;
	size_t kl, vl, n = 0, cap = 0;
	struct chunk_info *arr = NULL;
	ckpt_iter *it;
	int r = ckpt_iter_new(s->ix, prefix, 1, &it);

	if (r < 0)
		return r;
	while ((r = ckpt_iter_next(it, &k, &kl, &v, &vl)) > 0) {
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 1024;
			struct chunk_info *na = realloc(arr, nc * sizeof(*na));
			if (!na) {
				r = -ENOMEM;
				break;
			}
			arr = na;
			cap = nc;
		}
		memset(&arr[n], 0, sizeof(arr[n]));
		if (kl != 1 + CKPT_DIGEST_LEN ||
		    ckpt_chunk_rec_decode(v, vl, &arr[n].loc, &arr[n].refs) < 0) {
			r = -EIO;
			break;
		}
		memcpy(arr[n].d.bytes, k + 1, CKPT_DIGEST_LEN);
		n++;
	}
	ckpt_iter_free(it);
	if (r < 0) {
		free(arr);
		return r;
	}
	*ret = arr; /* already sorted: keys are 'C' + digest */
	*ret_n = n;
	return 0;
}

static struct chunk_info *find_chunk(struct chunk_info *arr, size_t n, const ckpt_digest *d)
{
	struct chunk_info key;

	key.d = *d;
	return bsearch(&key, arr, n, sizeof(*arr), chunk_info_cmp);
}

static int list_packs(ckpt_store *s, uint64_t **ret_ids, size_t *ret_n, uint64_t *ret_bytes)
{
	int fd = dup(s->packs_fd);
	DIR *d;
	struct dirent *de;
	uint64_t *ids = NULL, bytes = 0;
	size_t n = 0, cap = 0;

	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	rewinddir(d);
	while ((de = readdir(d))) {
		uint64_t id;
		char tail[8];
		struct stat st;

		if (sscanf(de->d_name, "pack-%16" SCNx64 ".%7s", &id, tail) != 2 ||
		    strcmp(tail, "ckpk") != 0)
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 16;
			uint64_t *ni = realloc(ids, nc * sizeof(*ni));
			if (!ni) {
				closedir(d);
				free(ids);
				return -ENOMEM;
			}
			ids = ni;
			cap = nc;
		}
		ids[n++] = id;
		if (fstatat(s->packs_fd, de->d_name, &st, 0) == 0)
			bytes += (uint64_t)st.st_size;
	}
	closedir(d);
	*ret_ids = ids;
	*ret_n = n;
	if (ret_bytes)
		*ret_bytes = bytes;
	return 0;
}

int ckpt_store_stats(ckpt_store *s, struct ckpt_store_stats *ret)
{
	uint8_t prefix[1] = { CKPT_KEY_INODE };
	const uint8_t *k, *v;
	size_t kl, vl, n;
	struct chunk_info *arr = NULL;
	uint64_t *ids = NULL, indexed = 0;
	ckpt_iter *it;
	int r;

	memset(ret, 0, sizeof(*ret));
	r = ckpt_iter_new(s->ix, prefix, 1, &it);
	if (r < 0)
		return r;
	while ((r = ckpt_iter_next(it, &k, &kl, &v, &vl)) > 0) {
		struct ckpt_inode in;
		if (kl != 9 || ckpt_inode_decode(ckpt_get_be64(k + 1), v, vl, &in) < 0) {
			r = -EIO;
			break;
		}
		if (in.nlink == 0)
			continue;
		if (S_ISREG(in.mode)) {
			ret->files++;
			ret->logical_bytes += in.size;
		} else if (S_ISDIR(in.mode)) {
			ret->dirs++;
		} else if (S_ISLNK(in.mode)) {
			ret->symlinks++;
		}
	}
	ckpt_iter_free(it);
	if (r < 0)
		return r;
	r = load_chunks(s, &arr, &n);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n; i++) {
		indexed += ckpt_pack_rec_span(arr[i].loc.stored_len);
		if (arr[i].loc.flags & CKPT_CHUNK_F_DEFERRED)
			ret->deferred_chunks++;
		if (arr[i].refs > 0) {
			ret->chunks++;
			ret->unique_bytes += arr[i].loc.raw_len;
			ret->stored_bytes += arr[i].loc.stored_len;
		} else {
			ret->dead_chunks++;
			ret->dead_bytes += arr[i].loc.stored_len;
		}
	}
	free(arr);
	r = list_packs(s, &ids, &n, &ret->pack_bytes);
	if (r < 0)
		return r;
	ret->pack_files = n;
	indexed += n * CKPT_PACK_HDR_SIZE;
	/* records no index entry names: content of files deleted before it was
	 * indexed, writes abandoned by a crash, failed appends */
	ret->unindexed_bytes = ret->pack_bytes > indexed ? ret->pack_bytes - indexed : 0;
	free(ids);
	return 0;
}

/* ino -> (parent, name) from every dentry, for naming files in reports. */
struct name_ent {
	uint64_t ino, parent;
	char *name;
};

static int name_ent_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct name_ent *)a)->ino, y = ((const struct name_ent *)b)->ino;

	return x < y ? -1 : x > y;
}

static int load_names(ckpt_store *s, struct name_ent **ret, size_t *ret_n)
{
	uint8_t prefix[1] = { CKPT_KEY_DENTRY };
	const uint8_t *k, *v;
	size_t kl, vl, n = 0, cap = 0;
	struct name_ent *arr = NULL;
	ckpt_iter *it;
	int r = ckpt_iter_new(s->ix, prefix, 1, &it);

	if (r < 0)
		return r;
	while ((r = ckpt_iter_next(it, &k, &kl, &v, &vl)) > 0) {
		uint32_t mode;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 1024;
			struct name_ent *na = realloc(arr, nc * sizeof(*na));
			if (!na) {
				r = -ENOMEM;
				break;
			}
			arr = na;
			cap = nc;
		}
		if (kl < 10 || ckpt_dentry_decode(v, vl, &arr[n].ino, &mode) < 0) {
			r = -EIO;
			break;
		}
		arr[n].parent = ckpt_get_be64(k + 1);
		arr[n].name = strndup((const char *)k + 9, kl - 9);
		n++;
	}
	ckpt_iter_free(it);
	if (r < 0) {
		for (size_t i = 0; i < n; i++)
			free(arr[i].name);
		free(arr);
		return r;
	}
	qsort(arr, n, sizeof(*arr), name_ent_cmp);
	*ret = arr;
	*ret_n = n;
	return 0;
}

static char *name_path(struct name_ent *names, size_t n, uint64_t ino)
{
	char *path = strdup(""), *np;

	for (int depth = 0; path && ino != CKPT_ROOT_INO && depth < 4096; depth++) {
		struct name_ent key = { .ino = ino }, *e;

		e = bsearch(&key, names, n, sizeof(*names), name_ent_cmp);
		if (!e) {
			if (asprintf(&np, "<inode %" PRIu64 ">%s", ino, path) < 0)
				np = NULL;
			free(path);
			return np;
		}
		if (asprintf(&np, "/%s%s", e->name ? e->name : "?", path) < 0)
			np = NULL;
		free(path);
		path = np;
		ino = e->parent;
	}
	if (path && !*path) {
		free(path);
		path = strdup("/");
	}
	return path;
}

int ckpt_store_fsck(ckpt_store *s, void (*cb)(void *ud, const char *path, const char *what),
		    void *ud)
{
	uint8_t prefix[1] = { CKPT_KEY_FILE };
	const uint8_t *k, *v;
	size_t kl, vl, nchunks = 0, nnames = 0;
	struct chunk_info *chunks = NULL;
	struct name_ent *names = NULL;
	uint8_t *buf = NULL;
	ckpt_iter *it = NULL;
	char msg[512];
	int problems = 0, r;

	r = load_chunks(s, &chunks, &nchunks);
	if (r < 0)
		goto out;
	r = load_names(s, &names, &nnames);
	if (r < 0)
		goto out;
	buf = malloc(CKPT_CHUNK_MAX);
	if (!buf) {
		r = -ENOMEM;
		goto out;
	}
	/* 1. every indexed chunk reads back and matches its digest */
	for (size_t i = 0; i < nchunks; i++) {
		if (chunks[i].loc.raw_len > CKPT_CHUNK_MAX ||
		    ckpt_store_verify_chunk(s, &chunks[i].d, &chunks[i].loc, buf) < 0) {
			char hex[33];
			chunks[i].damaged = true;
			ckpt_digest_to_hex(&chunks[i].d, hex);
			snprintf(msg, sizeof(msg),
				 "chunk %s (pack %" PRIu64 ", offset %" PRIu64 ") is damaged", hex,
				 chunks[i].loc.pack_id, chunks[i].loc.offset);
			cb(ud, NULL, msg);
			problems++;
		}
	}
	/* 2. every file's extents name known, intact chunks; count references */
	r = ckpt_iter_new(s->ix, prefix, 1, &it);
	if (r < 0)
		goto out;
	while ((r = ckpt_iter_next(it, &k, &kl, &v, &vl)) > 0) {
		struct ckpt_extent_list *l = NULL;
		uint64_t ino = kl == 9 ? ckpt_get_be64(k + 1) : 0;
		char *path = name_path(names, nnames, ino);
		struct ckpt_inode in;

		if (ckpt_extent_list_decode(v, vl, &l) < 0) {
			cb(ud, path, "extent list is damaged");
			problems++;
			free(path);
			continue;
		}
		if (db_getattr(s, ino, &in) < 0) {
			cb(ud, path, "extent list without inode");
			problems++;
		} else if (in.size != l->size) {
			snprintf(msg, sizeof(msg), "size %" PRIu64 " but extents cover %" PRIu64,
				 in.size, l->size);
			cb(ud, path, msg);
			problems++;
		}
		for (size_t i = 0; i < l->n; i++) {
			struct chunk_info *c;
			if (l->v[i].kind != CKPT_EXT_CHUNK)
				continue;
			c = find_chunk(chunks, nchunks, &l->v[i].digest);
			if (!c) {
				snprintf(msg, sizeof(msg), "offset %" PRIu64 ": chunk missing from index",
					 l->v[i].off);
				cb(ud, path, msg);
				problems++;
				continue;
			}
			c->counted++;
			if (c->damaged) {
				snprintf(msg, sizeof(msg),
					 "damaged data at offset %" PRIu64 " (%" PRIu32 " bytes)",
					 l->v[i].off, l->v[i].len);
				cb(ud, path, msg);
				problems++;
			} else if (l->v[i].len > c->loc.raw_len) {
				snprintf(msg, sizeof(msg), "offset %" PRIu64 ": extent longer than chunk",
					 l->v[i].off);
				cb(ud, path, msg);
				problems++;
			}
		}
		ckpt_extent_list_free(l);
		free(path);
	}
	ckpt_iter_free(it);
	it = NULL;
	if (r < 0)
		goto out;
	/* 3. stored reference counts match */
	for (size_t i = 0; i < nchunks; i++) {
		if (chunks[i].refs != chunks[i].counted) {
			char hex[33];
			ckpt_digest_to_hex(&chunks[i].d, hex);
			snprintf(msg, sizeof(msg),
				 "chunk %s: refcount %" PRIu64 " but %" PRIu64 " references", hex,
				 chunks[i].refs, chunks[i].counted);
			cb(ud, NULL, msg);
			problems++;
		}
	}
	/* 4. every name points at a live inode */
	for (size_t i = 0; i < nnames; i++) {
		struct ckpt_inode in;
		if (db_getattr(s, names[i].ino, &in) < 0 || in.nlink == 0) {
			char *path = name_path(names, nnames, names[i].ino);
			cb(ud, path, "directory entry points at a missing inode");
			problems++;
			free(path);
		}
	}
	r = problems;
out:
	ckpt_iter_free(it);
	for (size_t i = 0; i < nnames; i++)
		free(names[i].name);
	free(names);
	free(chunks);
	free(buf);
	return r;
}

struct pack_usage {
	uint64_t id;
	uint64_t live_bytes; /* record spans of referenced chunks */
	uint64_t size;
};

static int pack_usage_find(struct pack_usage *u, size_t n, uint64_t id)
{
	for (size_t i = 0; i < n; i++)
		if (u[i].id == id)
			return (int)i;
	return -1;
}

int ckpt_store_gc(ckpt_store *s, struct ckpt_gc_stats *ret)
{
	struct chunk_info *chunks = NULL;
	struct pack_usage *use = NULL;
	uint64_t *ids = NULL;
	size_t nchunks = 0, nids = 0;
	ckpt_batch *b = NULL;
	uint8_t *buf = NULL;
	int r;

	memset(ret, 0, sizeof(*ret));
	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	r = load_chunks(s, &chunks, &nchunks);
	if (r < 0)
		goto out;
	r = list_packs(s, &ids, &nids, &ret->bytes_before);
	if (r < 0)
		goto out;
	use = calloc(nids ? nids : 1, sizeof(*use));
	buf = malloc(CKPT_CHUNK_MAX + 64);
	if (!use || !buf) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < nids; i++) {
		char name[64];
		struct stat st;
		use[i].id = ids[i];
		ckpt_pack_name(ids[i], name, sizeof(name));
		if (fstatat(s->packs_fd, name, &st, 0) == 0)
			use[i].size = (uint64_t)st.st_size;
	}
	/* 1. drop index entries of unreferenced chunks */
	b = ckpt_batch_new();
	if (!b) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < nchunks; i++) {
		uint8_t key[32];
		int p;
		if (chunks[i].refs == 0) {
			ckpt_batch_delete(b, key, ckpt_key_chunk(key, &chunks[i].d));
			ret->chunks_dropped++;
			ret->bytes_dropped += chunks[i].loc.stored_len;
			continue;
		}
		p = pack_usage_find(use, nids, chunks[i].loc.pack_id);
		if (p >= 0)
			use[p].live_bytes += ckpt_pack_rec_span(chunks[i].loc.stored_len);
	}
	r = ckpt_index_write(s->ix, b, true);
	if (r < 0)
		goto out;
	/* 2. per pack: delete if nothing live, rewrite if mostly dead */
	for (size_t pi = 0; pi < nids; pi++) {
		struct pack_usage *u = &use[pi];
		uint64_t payload = u->size > CKPT_PACK_HDR_SIZE ? u->size - CKPT_PACK_HDR_SIZE : 0;
		char name[64];
		ckpt_pack *src = NULL;
		bool keep = false; /* a damaged chunk stays where it is */

		ckpt_pack_name(u->id, name, sizeof(name));
		if (u->live_bytes > 0 && u->live_bytes * 10 >= payload * 8)
			continue; /* >= 80% live: not worth copying */
		if (u->live_bytes > 0) {
			ckpt_batch_free(b);
			b = ckpt_batch_new();
			if (!b) {
				r = -ENOMEM;
				goto out;
			}
			r = get_pack(s, u->id, &src);
			if (r < 0)
				goto out;
			pthread_mutex_lock(&s->pack_lock);
			if (!s->wpack || ckpt_pack_size(s->wpack) >= s->opts.pack_max ||
			    ckpt_pack_id(s->wpack) == u->id)
				r = roll_pack_locked(s); /* never copy a pack into itself */
			pthread_mutex_unlock(&s->pack_lock);
			if (r < 0)
				goto out;
			for (size_t i = 0; i < nchunks; i++) {
				struct ckpt_pack_rec rec;
				struct ckpt_chunk_loc nl;
				uint8_t key[32], val[CKPT_CHUNK_REC_LEN];
				if (chunks[i].refs == 0 || chunks[i].loc.pack_id != u->id)
					continue;
				r = ckpt_pack_read(src, chunks[i].loc.offset, chunks[i].loc.stored_len,
						   &rec, buf);
				if (r == -EIO) {
					char hex[33];
					ckpt_digest_to_hex(&chunks[i].d, hex);
					ckpt_err("%s: gc: chunk %s in pack %" PRIu64
						 " is damaged; pack kept, run ckpt fsck",
						 s->path, hex, u->id);
					keep = true;
					r = 0;
					continue;
				}
				if (r < 0)
					break;
				if (ckpt_pack_size(s->wpack) >= s->opts.pack_max) {
					pthread_mutex_lock(&s->pack_lock);
					r = roll_pack_locked(s);
					pthread_mutex_unlock(&s->pack_lock);
					if (r < 0)
						break;
				}
				nl = chunks[i].loc;
				r = ckpt_pack_append(s->wpack, &rec, buf, &nl.offset);
				if (r < 0)
					break;
				nl.pack_id = ckpt_pack_id(s->wpack);
				r = ckpt_pack_sync(s->wpack, nl.offset + ckpt_pack_rec_span(nl.stored_len));
				if (r < 0)
					break;
				ckpt_chunk_rec_encode(&nl, chunks[i].refs, val);
				ckpt_batch_put(b, key, ckpt_key_chunk(key, &chunks[i].d), val,
					       sizeof(val));
				chunks[i].loc = nl;
			}
			if (r < 0)
				goto out;
			/* new copies are durable; switch the index, then drop the old pack */
			r = ckpt_index_write(s->ix, b, true);
			if (r < 0)
				goto out;
			ret->packs_rewritten++;
		}
		if (keep || (s->wpack && ckpt_pack_id(s->wpack) == u->id))
			continue;
		pthread_mutex_lock(&s->pack_lock);
		for (size_t i = 0; i < s->npacks; i++) {
			if (ckpt_pack_id(s->packs[i]) == u->id) {
				ckpt_pack_free(s->packs[i]);
				s->packs[i] = s->packs[--s->npacks];
				break;
			}
		}
		pthread_mutex_unlock(&s->pack_lock);
		if (unlinkat(s->packs_fd, name, 0) < 0) {
			r = -errno;
			goto out;
		}
		ret->packs_deleted++;
	}
	fsync(s->packs_fd);
	free(ids);
	ids = NULL;
	r = list_packs(s, &ids, &nids, &ret->bytes_after);
out:
	ckpt_batch_free(b);
	free(chunks);
	free(use);
	free(ids);
	free(buf);
	return r;
}
