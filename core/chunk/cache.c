/* SPDX-License-Identifier: MIT */
/*
 * cache.c - LRU chunk cache.
 *
 * Invariants (all under c->lock):
 *  - every entry is in exactly one hash chain;
 *  - an entry is on the LRU list iff its pin count is zero;
 *  - c->bytes is the sum of charge over all entries (pinned or not), and
 *    c->stream_bytes that over the stream entries; charge is len, or for
 *    data in a pooled buffer the buffer's mapped size (what it costs in
 *    memory, up to twice len: ckpt_cache_buf_alloc);
 *  - an unpinned entry is on exactly one list: lru if not a stream entry,
 *    else dlru once readers have read all its bytes (nread >= len), else
 *    slru;
 *  - after any insert or release, stream entries are evicted while
 *    c->stream_bytes > c->stream_cap, the oldest of dlru first, then of
 *    slru; then unpinned entries (lru, dlru, slru, oldest first) until
 *    c->bytes <= c->capacity or no unpinned entry is left.
 */
#include "chunk/cache.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "base/util.h"

/* Chunk buffers: anonymous mappings of a multiple of BUF_GRAIN bytes. */
#define BUF_GRAIN (128u << 10)
#define BUF_CLASSES 257 /* up to 32 MiB; larger buffers are never pooled */
#define BUF_POOL_MAX (32ull << 20)
#define BUF_HDR 64
#define BUF_SLACK 4 /* reuse a free buffer up to 4 classes (512 KiB) larger */

/* Where ckpt_cache_buf_alloc got a buffer (index of buf_stats). */
enum buf_origin {
	BUF_POOLED,   /* a free buffer of the pool, as it was */
	BUF_RESIZED,  /* a free buffer of the pool, remapped to the size */
	BUF_FRESH,    /* a new mapping */
	BUF_RESERVED, /* a run of the reserve */
	BUF_ORIGINS
};

struct ckpt_cache_entry {
	ckpt_digest digest;
	uint8_t *data;
	size_t len;
	unsigned pins;
	bool loading; /* placeholder: its owner is loading the data (len 0) */
	bool stream;  /* loaded for a sequential reader: on the stream list */
	bool pooled;  /* data from ckpt_cache_buf_alloc (else malloc) */
	size_t nread; /* bytes of it handed to readers (ckpt_cache_release_read) */
	size_t charge; /* bytes it counts against the capacity: len, or its
			* buffer's mapped size when pooled */
	struct ckpt_cache_entry *hnext;
	struct ckpt_cache_entry *lru_prev, *lru_next; /* valid iff pins == 0 */
};

struct ckpt_cache {
	pthread_mutex_t lock;
	/* loaded[load_cond_of(d)] is broadcast when a placeholder of digest d
	 * is filled or abandoned; those waiting for d wait on it.  Several,
	 * so that a fill wakes only the readers waiting for chunks of its
	 * slot, not every reader waiting for any chunk (four readers each
	 * waiting for read-ahead's loads woke each other at every fill). */
	pthread_cond_t loaded[16];
	/* Fields below are protected by lock. */
	uint64_t capacity;
	uint64_t bytes;
	size_t nentries;
	size_t nbuckets; /* power of two */
	struct ckpt_cache_entry **buckets;
	struct ckpt_cache_entry lru; /* sentinel: lru.lru_next is most recent */
	struct ckpt_cache_entry slru; /* the same for stream entries not yet read */
	struct ckpt_cache_entry dlru; /* and for those read to the end */
	uint64_t stream_bytes, stream_cap; /* stream entries' bytes and their budget */
	/* Free chunk buffers by size class (index cap / BUF_GRAIN), pool_lock. */
	pthread_mutex_t pool_lock;
	void *pool[BUF_CLASSES];
	uint64_t pool_bytes;
	/* The reserve (ckpt_cache_reserve_bufs): one mapping of res_units *
	 * BUF_GRAIN bytes, touched when made and kept until
	 * ckpt_cache_free().  res_base, res_map and res_units are set once,
	 * before the cache is shared, and read without a lock; res_used (a
	 * bit set per unit handed out: a buffer is a run of units) and
	 * res_free (the clear bits) are under pool_lock.  Reserve buffers
	 * never enter pool[] and are never remapped. */
	uint8_t *res_base; /* 2 MiB aligned, in huge pages where the kernel can */
	void *res_map;     /* the mapping (ckpt_map_huge) */
	size_t res_units, res_free;
	uint64_t *res_used;
	uint64_t buf_stats[BUF_ORIGINS]; /* buffers handed out, by origin (atomic) */
	struct ckpt_cache_stats stats;
};

static pthread_cond_t *load_cond_of(ckpt_cache *c, const ckpt_digest *d)
{
	uint64_t h;

	memcpy(&h, d->bytes + 8, sizeof(h));
	return &c->loaded[h % CKPT_ARRAY_SIZE(c->loaded)];
}

static size_t bucket_of(const ckpt_cache *c, const ckpt_digest *d)
{
	uint64_t h;

	memcpy(&h, d->bytes, sizeof(h));
	return (size_t)(h & (c->nbuckets - 1));
}

int ckpt_cache_new(uint64_t capacity, ckpt_cache **ret_cache)
{
	ckpt_cache *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	c->nbuckets = 1024;
	c->buckets = calloc(c->nbuckets, sizeof(*c->buckets));
	if (!c->buckets) {
		free(c);
		return -ENOMEM;
	}
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->pool_lock, NULL);
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(c->loaded); i++)
		pthread_cond_init(&c->loaded[i], NULL);
	c->capacity = capacity;
	c->lru.lru_next = c->lru.lru_prev = &c->lru;
	c->slru.lru_next = c->slru.lru_prev = &c->slru;
	c->dlru.lru_next = c->dlru.lru_prev = &c->dlru;
	c->stream_cap = CKPT_MIN(capacity / 4, CKPT_CACHE_STREAM_MAX);
	*ret_cache = c;
	return 0;
}

static void lru_unlink(struct ckpt_cache_entry *e)
{
	e->lru_prev->lru_next = e->lru_next;
	e->lru_next->lru_prev = e->lru_prev;
	e->lru_prev = e->lru_next = NULL;
}

static void lru_push_front(ckpt_cache *c, struct ckpt_cache_entry *e)
{
	struct ckpt_cache_entry *head = !e->stream ? &c->lru
					: e->nread >= e->len ? &c->dlru : &c->slru;

	e->lru_next = head->lru_next;
	e->lru_prev = head;
	head->lru_next->lru_prev = e;
	head->lru_next = e;
}

static void hash_unlink(ckpt_cache *c, struct ckpt_cache_entry *e)
{
	struct ckpt_cache_entry **pp = &c->buckets[bucket_of(c, &e->digest)];

	while (*pp && *pp != e)
		pp = &(*pp)->hnext;
	if (*pp)
		*pp = e->hnext;
}

/* A buffer is a mapping of class * BUF_GRAIN bytes: a BUF_HDR header (the
 * class; in the pool also the next free buffer) then the data. */
static size_t buf_class(size_t len)
{
	return (len + BUF_HDR + BUF_GRAIN - 1) / BUF_GRAIN;
}

static void *pool_pop_locked(ckpt_cache *c, size_t k)
{
	void *p = c->pool[k], *next;

	if (p) {
		memcpy(&next, (uint8_t *)p + sizeof(size_t), sizeof(next));
		c->pool[k] = next;
		c->pool_bytes -= k * BUF_GRAIN;
	}
	return p;
}

/* The class of a buffer from ckpt_cache_buf_alloc. */
static size_t buf_class_of(const uint8_t *buf)
{
	size_t k;

	memcpy(&k, buf - BUF_HDR, sizeof(k));
	return k;
}

/*
 * A free buffer for class k from the pool, or NULL (*ret_how: BUF_POOLED
 * or BUF_RESIZED).  Chunk sizes vary (content-defined: 128 KiB to 2 MiB
 * by default), so the pool often has no buffer of k's class; a buffer of
 * another class still beats a new mapping, whose every page is a fault and
 * a zeroing (and, in a virtual machine, memory the host must first back).
 * In order of preference:
 *  - the smallest of classes k .. k + max(BUF_SLACK, k), as it is (at most
 *    about half of it unused; the cache charges the whole buffer);
 *  - the largest of a smaller class, grown to k with mremap: its pages move
 *    along, only the new tail is fresh;
 *  - the smallest of a larger class, shrunk to k with mremap (its tail is
 *    unmapped).
 */
static void *pool_take(ckpt_cache *c, size_t k, enum buf_origin *ret_how)
{
	size_t j = 0, i, top = k + CKPT_MAX((size_t)BUF_SLACK, k);
	void *p = NULL, *q;

	*ret_how = BUF_POOLED;
	pthread_mutex_lock(&c->pool_lock);
	for (i = k; i < BUF_CLASSES && i <= top && !p; i++)
		if ((p = pool_pop_locked(c, i)))
			j = i;
	for (i = k - 1; i >= 1 && !p; i--)
		if ((p = pool_pop_locked(c, i)))
			j = i;
	for (i = top + 1; i < BUF_CLASSES && !p; i++)
		if ((p = pool_pop_locked(c, i)))
			j = i;
	pthread_mutex_unlock(&c->pool_lock);
	if (!p || (j >= k && j <= top))
		return p; /* its header still holds its class j */
	*ret_how = BUF_RESIZED;
	q = mremap(p, j * BUF_GRAIN, k * BUF_GRAIN, MREMAP_MAYMOVE);
	if (q == MAP_FAILED) {
		munmap(p, j * BUF_GRAIN);
		return NULL;
	}
	memcpy(q, &k, sizeof(k));
	return q;
}

static bool res_bit(const ckpt_cache *c, size_t u)
{
	return c->res_used[u / 64] >> (u % 64) & 1;
}

static void res_mark(ckpt_cache *c, size_t u, size_t k, bool used)
{
	for (size_t i = u; i < u + k; i++) {
		if (used)
			c->res_used[i / 64] |= 1ull << (i % 64);
		else
			c->res_used[i / 64] &= ~(1ull << (i % 64));
	}
	if (used)
		c->res_free -= k;
	else
		c->res_free += k;
}

/* The first run of k free units of the reserve, marked used, or NULL. */
static void *res_take(ckpt_cache *c, size_t k)
{
	size_t u, run = 0;
	void *p = NULL;

	pthread_mutex_lock(&c->pool_lock);
	if (k > c->res_free)
		goto out;
	for (u = 0; u < c->res_units; u++) {
		if (c->res_used[u / 64] == ~0ull && u % 64 == 0) {
			run = 0;
			u += 63;
			continue;
		}
		run = res_bit(c, u) ? 0 : run + 1;
		if (run == k) {
			res_mark(c, u + 1 - k, k, true);
			p = c->res_base + (u + 1 - k) * BUF_GRAIN;
			break;
		}
	}
out:
	pthread_mutex_unlock(&c->pool_lock);
	return p;
}

static bool in_reserve(const ckpt_cache *c, const uint8_t *p)
{
	return c->res_base && p >= c->res_base && p < c->res_base + c->res_units * BUF_GRAIN;
}

int ckpt_cache_reserve_bufs(ckpt_cache *c, uint64_t bytes)
{
	size_t n = (size_t)(bytes / BUF_GRAIN);
	uint64_t *used;
	uint8_t *p;
	void *map;

	if (!c || c->res_base)
		return -EINVAL;
	if (n == 0)
		return 0;
	used = calloc((n + 63) / 64, sizeof(*used));
	if (!used)
		return -ENOMEM;
	p = ckpt_map_huge(n * BUF_GRAIN, &map);
	if (!p) {
		free(used);
		return -ENOMEM;
	}
	ckpt_mem_populate(p, n * BUF_GRAIN);
	pthread_mutex_lock(&c->pool_lock);
	c->res_base = p;
	c->res_map = map;
	c->res_units = c->res_free = n;
	c->res_used = used;
	pthread_mutex_unlock(&c->pool_lock);
	return 0;
}

uint8_t *ckpt_cache_buf_alloc(ckpt_cache *c, size_t len)
{
	size_t k = buf_class(len);
	void *p = NULL;
	enum buf_origin how = BUF_RESERVED;

	if (len > SIZE_MAX - BUF_HDR - BUF_GRAIN)
		return NULL;
	if (c->res_base && k <= c->res_units) {
		p = res_take(c, k);
		if (p)
			memcpy(p, &k, sizeof(k));
	}
	if (!p && k < BUF_CLASSES)
		p = pool_take(c, k, &how);
	if (!p) {
		how = BUF_FRESH;
		p = mmap(NULL, k * BUF_GRAIN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			 -1, 0);
		if (p == MAP_FAILED)
			return NULL;
		memcpy(p, &k, sizeof(k));
	}
	__atomic_add_fetch(&c->buf_stats[how], 1, __ATOMIC_RELAXED);
	return (uint8_t *)p + BUF_HDR;
}

void ckpt_cache_buf_free(ckpt_cache *c, uint8_t *buf, size_t len)
{
	void *p;
	size_t k;

	(void)len;
	if (!buf)
		return;
	p = buf - BUF_HDR;
	memcpy(&k, p, sizeof(k));
	if (in_reserve(c, p)) {
		pthread_mutex_lock(&c->pool_lock);
		res_mark(c, (size_t)((uint8_t *)p - c->res_base) / BUF_GRAIN, k, false);
		pthread_mutex_unlock(&c->pool_lock);
		return;
	}
	if (k < BUF_CLASSES) {
		pthread_mutex_lock(&c->pool_lock);
		if (c->pool_bytes + k * BUF_GRAIN <= BUF_POOL_MAX) {
			memcpy((uint8_t *)p + sizeof(size_t), &c->pool[k], sizeof(void *));
			c->pool[k] = p;
			c->pool_bytes += k * BUF_GRAIN;
			p = NULL;
		}
		pthread_mutex_unlock(&c->pool_lock);
	}
	if (p)
		munmap(p, k * BUF_GRAIN);
}

static void entry_data_free(ckpt_cache *c, struct ckpt_cache_entry *e)
{
	if (e->pooled)
		ckpt_cache_buf_free(c, e->data, e->len);
	else
		free(e->data);
}

static void entry_destroy(ckpt_cache *c, struct ckpt_cache_entry *e)
{
	c->bytes -= e->charge;
	if (e->stream)
		c->stream_bytes -= e->charge;
	c->nentries--;
	entry_data_free(c, e);
	free(e);
}

static void evict_one_locked(ckpt_cache *c, struct ckpt_cache_entry *e)
{
	if (e->stream && e->nread < e->len)
		c->stats.evicted_unread++;
	lru_unlink(e);
	hash_unlink(c, e);
	entry_destroy(c, e);
	c->stats.evictions++;
}

/* The oldest entry of list head, or NULL when it is empty. */
static struct ckpt_cache_entry *lru_oldest(struct ckpt_cache_entry *head)
{
	return head->lru_prev != head ? head->lru_prev : NULL;
}

/* Stream entries beyond their budget go first, those read to the end
 * before those still to be read (oldest first in each), then the least
 * recently used entries of any list until under capacity. */
static void evict_locked(ckpt_cache *c)
{
	struct ckpt_cache_entry *e;

	while (c->stream_bytes > c->stream_cap &&
	       ((e = lru_oldest(&c->dlru)) || (e = lru_oldest(&c->slru))))
		evict_one_locked(c, e);
	while (c->bytes > c->capacity && ((e = lru_oldest(&c->lru)) || (e = lru_oldest(&c->dlru)) ||
					   (e = lru_oldest(&c->slru))))
		evict_one_locked(c, e);
}

static void grow_locked(ckpt_cache *c)
{
	size_t n = c->nbuckets * 2;
	struct ckpt_cache_entry **nb = calloc(n, sizeof(*nb));

	if (!nb)
		return; /* keep the old table: longer chains, still correct */
	for (size_t i = 0; i < c->nbuckets; i++) {
		struct ckpt_cache_entry *e = c->buckets[i], *next;
		for (; e; e = next) {
			uint64_t h;
			next = e->hnext;
			memcpy(&h, e->digest.bytes, sizeof(h));
			e->hnext = nb[h & (n - 1)];
			nb[h & (n - 1)] = e;
		}
	}
	free(c->buckets);
	c->buckets = nb;
	c->nbuckets = n;
}

void ckpt_cache_free(ckpt_cache *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->nbuckets; i++) {
		struct ckpt_cache_entry *e = c->buckets[i], *next;
		for (; e; e = next) {
			next = e->hnext;
			entry_data_free(c, e);
			free(e);
		}
	}
	for (size_t k = 0; k < BUF_CLASSES; k++) {
		void *p;
		while ((p = pool_pop_locked(c, k)))
			munmap(p, k * BUF_GRAIN);
	}
	if (c->res_base)
		munmap(c->res_map, c->res_units * BUF_GRAIN + CKPT_HUGE_ALIGN);
	free(c->res_used);
	pthread_mutex_destroy(&c->pool_lock);
	free(c->buckets);
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(c->loaded); i++)
		pthread_cond_destroy(&c->loaded[i]);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

static struct ckpt_cache_entry *find_locked(ckpt_cache *c, const ckpt_digest *d)
{
	struct ckpt_cache_entry *e = c->buckets[bucket_of(c, d)];

	while (e && memcmp(e->digest.bytes, d->bytes, CKPT_DIGEST_LEN) != 0)
		e = e->hnext;
	return e;
}

static void pin_locked(struct ckpt_cache_entry *e)
{
	if (e->pins++ == 0)
		lru_unlink(e);
}

void ckpt_cache_ref(ckpt_cache *c, ckpt_cache_entry *e)
{
	pthread_mutex_lock(&c->lock);
	e->pins++;
	pthread_mutex_unlock(&c->lock);
}

void ckpt_cache_release(ckpt_cache *c, ckpt_cache_entry *e)
{
	ckpt_cache_release_read(c, e, 0);
}

void ckpt_cache_release_read(ckpt_cache *c, ckpt_cache_entry *e, size_t nread)
{
	if (!e)
		return;
	pthread_mutex_lock(&c->lock);
	e->nread = nread > SIZE_MAX - e->nread ? SIZE_MAX : e->nread + nread;
	if (--e->pins == 0) {
		lru_push_front(c, e);
		evict_locked(c);
	}
	pthread_mutex_unlock(&c->lock);
}

/* New placeholder for d, pinned once; caller holds the lock and knows d is absent. */
static struct ckpt_cache_entry *placeholder_locked(ckpt_cache *c, const ckpt_digest *d)
{
	struct ckpt_cache_entry *e = calloc(1, sizeof(*e));

	if (!e)
		return NULL;
	e->digest = *d;
	e->loading = true;
	e->pins = 1;
	e->hnext = c->buckets[bucket_of(c, d)];
	c->buckets[bucket_of(c, d)] = e;
	c->nentries++;
	if (c->nentries > c->nbuckets)
		grow_locked(c);
	return e;
}

ckpt_cache_entry *ckpt_cache_acquire(ckpt_cache *c, const ckpt_digest *d,
				     const uint8_t **ret_data, size_t *ret_len, bool *ret_fill)
{
	struct ckpt_cache_entry *e;

	*ret_fill = false;
	pthread_mutex_lock(&c->lock);
	while ((e = find_locked(c, d)) && e->loading)
		pthread_cond_wait(load_cond_of(c, d), &c->lock);
	if (e) {
		pin_locked(e);
		c->stats.hits++;
		*ret_data = e->data;
		*ret_len = e->len;
	} else {
		c->stats.misses++;
		e = placeholder_locked(c, d);
		*ret_fill = e != NULL;
	}
	pthread_mutex_unlock(&c->lock);
	return e;
}

ckpt_cache_entry *ckpt_cache_reserve(ckpt_cache *c, const ckpt_digest *d)
{
	struct ckpt_cache_entry *e = NULL;

	pthread_mutex_lock(&c->lock);
	if (!find_locked(c, d))
		e = placeholder_locked(c, d);
	pthread_mutex_unlock(&c->lock);
	return e;
}

const uint8_t *ckpt_cache_fill_as(ckpt_cache *c, ckpt_cache_entry *e, uint8_t *data, size_t len,
				  bool stream)
{
	return ckpt_cache_fill_buf(c, e, data, len, stream, false);
}

const uint8_t *ckpt_cache_fill_buf(ckpt_cache *c, ckpt_cache_entry *e, uint8_t *data, size_t len,
				   bool stream, bool pooled)
{
	pthread_mutex_lock(&c->lock);
	e->data = data;
	e->len = len;
	e->loading = false;
	e->stream = stream;
	e->pooled = pooled;
	e->charge = pooled ? buf_class_of(data) * BUF_GRAIN : len;
	c->bytes += e->charge;
	if (stream)
		c->stream_bytes += e->charge;
	evict_locked(c);
	pthread_cond_broadcast(load_cond_of(c, &e->digest));
	pthread_mutex_unlock(&c->lock);
	return data;
}

void ckpt_cache_abandon(ckpt_cache *c, ckpt_cache_entry *e)
{
	pthread_mutex_lock(&c->lock);
	hash_unlink(c, e);
	c->nentries--;
	pthread_cond_broadcast(load_cond_of(c, &e->digest));
	pthread_mutex_unlock(&c->lock);
	free(e);
}

void ckpt_cache_get_stats(ckpt_cache *c, struct ckpt_cache_stats *ret_stats)
{
	pthread_mutex_lock(&c->lock);
	*ret_stats = c->stats;
	ret_stats->bytes = c->bytes;
	ret_stats->entries = c->nentries;
	ret_stats->stream_bytes = c->stream_bytes;
	ret_stats->stream_cap = c->stream_cap;
	pthread_mutex_unlock(&c->lock);
	ret_stats->bufs_pooled = __atomic_load_n(&c->buf_stats[BUF_POOLED], __ATOMIC_RELAXED);
	ret_stats->bufs_resized = __atomic_load_n(&c->buf_stats[BUF_RESIZED], __ATOMIC_RELAXED);
	ret_stats->bufs_fresh = __atomic_load_n(&c->buf_stats[BUF_FRESH], __ATOMIC_RELAXED);
	ret_stats->bufs_reserve = __atomic_load_n(&c->buf_stats[BUF_RESERVED], __ATOMIC_RELAXED);
}
