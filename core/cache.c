/* SPDX-License-Identifier: MIT */
/*
 * cache.c - LRU chunk cache.
 *
 * Invariants (all under c->lock):
 *  - every entry is in exactly one hash chain;
 *  - an entry is on the LRU list iff its pin count is zero;
 *  - c->bytes is the sum of len over all entries (pinned or not);
 *  - after any insert or release, unpinned entries are evicted from the LRU
 *    tail until c->bytes <= c->capacity or no unpinned entry is left.
 */
#include "cache.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct ckpt_cache_entry {
	ckpt_digest digest;
	uint8_t *data;
	size_t len;
	unsigned pins;
	bool dead; /* forgotten while pinned: free at last release */
	struct ckpt_cache_entry *hnext;
	struct ckpt_cache_entry *lru_prev, *lru_next; /* valid iff pins == 0 */
};

struct ckpt_cache {
	pthread_mutex_t lock;
	/* Fields below are protected by lock. */
	uint64_t capacity;
	uint64_t bytes;
	size_t nentries;
	size_t nbuckets; /* power of two */
	struct ckpt_cache_entry **buckets;
	struct ckpt_cache_entry lru; /* sentinel: lru.lru_next is most recent */
	struct ckpt_cache_stats stats;
};

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
	c->capacity = capacity;
	c->lru.lru_next = c->lru.lru_prev = &c->lru;
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
	e->lru_next = c->lru.lru_next;
	e->lru_prev = &c->lru;
	c->lru.lru_next->lru_prev = e;
	c->lru.lru_next = e;
}

static void hash_unlink(ckpt_cache *c, struct ckpt_cache_entry *e)
{
	struct ckpt_cache_entry **pp = &c->buckets[bucket_of(c, &e->digest)];

	while (*pp && *pp != e)
		pp = &(*pp)->hnext;
	if (*pp)
		*pp = e->hnext;
}

static void entry_destroy(ckpt_cache *c, struct ckpt_cache_entry *e)
{
	c->bytes -= e->len;
	c->nentries--;
	free(e->data);
	free(e);
}

static void evict_locked(ckpt_cache *c)
{
	while (c->bytes > c->capacity && c->lru.lru_prev != &c->lru) {
		struct ckpt_cache_entry *e = c->lru.lru_prev;

		lru_unlink(e);
		hash_unlink(c, e);
		entry_destroy(c, e);
		c->stats.evictions++;
	}
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
			free(e->data);
			free(e);
		}
	}
	free(c->buckets);
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

ckpt_cache_entry *ckpt_cache_lookup(ckpt_cache *c, const ckpt_digest *d,
				    const uint8_t **ret_data, size_t *ret_len)
{
	struct ckpt_cache_entry *e;

	pthread_mutex_lock(&c->lock);
	e = find_locked(c, d);
	if (e) {
		pin_locked(e);
		c->stats.hits++;
		*ret_data = e->data;
		*ret_len = e->len;
	} else {
		c->stats.misses++;
	}
	pthread_mutex_unlock(&c->lock);
	return e;
}

ckpt_cache_entry *ckpt_cache_insert(ckpt_cache *c, const ckpt_digest *d, uint8_t *data,
				    size_t len, const uint8_t **ret_data)
{
	struct ckpt_cache_entry *e;

	pthread_mutex_lock(&c->lock);
	e = find_locked(c, d);
	if (e) {
		free(data);
		pin_locked(e);
		goto out;
	}
	e = calloc(1, sizeof(*e));
	if (!e) {
		free(data);
		goto out;
	}
	e->digest = *d;
	e->data = data;
	e->len = len;
	e->pins = 1;
	e->hnext = c->buckets[bucket_of(c, d)];
	c->buckets[bucket_of(c, d)] = e;
	c->bytes += len;
	c->nentries++;
	if (c->nentries > c->nbuckets)
		grow_locked(c);
	evict_locked(c);
out:
	if (e)
		*ret_data = e->data;
	pthread_mutex_unlock(&c->lock);
	return e;
}

void ckpt_cache_release(ckpt_cache *c, ckpt_cache_entry *e)
{
	if (!e)
		return;
	pthread_mutex_lock(&c->lock);
	if (--e->pins == 0) {
		if (e->dead) {
			entry_destroy(c, e);
		} else {
			lru_push_front(c, e);
			evict_locked(c);
		}
	}
	pthread_mutex_unlock(&c->lock);
}

void ckpt_cache_forget(ckpt_cache *c, const ckpt_digest *d)
{
	struct ckpt_cache_entry *e;

	pthread_mutex_lock(&c->lock);
	e = find_locked(c, d);
	if (e) {
		hash_unlink(c, e);
		if (e->pins == 0) {
			lru_unlink(e);
			entry_destroy(c, e);
		} else {
			e->dead = true;
		}
	}
	pthread_mutex_unlock(&c->lock);
}

void ckpt_cache_get_stats(ckpt_cache *c, struct ckpt_cache_stats *ret_stats)
{
	pthread_mutex_lock(&c->lock);
	*ret_stats = c->stats;
	ret_stats->bytes = c->bytes;
	ret_stats->entries = c->nentries;
	pthread_mutex_unlock(&c->lock);
}
