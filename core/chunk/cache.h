/* SPDX-License-Identifier: MIT */
/*
 * cache.h - bounded LRU cache of decompressed chunks, keyed by digest.
 *
 * Reads arrive in 128 KiB..1 MiB pieces while chunks are ~1 MiB, so without
 * this cache every chunk would be decompressed several times.  Entries are
 * reference counted: a lookup pins the entry, the caller copies out of it
 * without holding the cache lock, then releases it.  Only unpinned entries
 * are evicted, so the cache can exceed its capacity by at most the bytes
 * pinned at one moment (bounded by the number of reader threads times the
 * largest chunk).
 *
 * Thread-safety: every function may be called concurrently.
 */
#ifndef CKPT_CACHE_H
#define CKPT_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/hash.h"

typedef struct ckpt_cache ckpt_cache;
typedef struct ckpt_cache_entry ckpt_cache_entry;

/* capacity: bytes of chunk data kept (an entry in a pooled buffer counts
 * the buffer's size: ckpt_cache_buf_alloc); 0 disables caching (inserts are
 * returned pinned and freed on release). */
int ckpt_cache_new(uint64_t capacity, ckpt_cache **ret_cache);
/* All entries must have been released. Accepts NULL. */
void ckpt_cache_free(ckpt_cache *c);

/*
 * Single-flight loading.  Entries may be placeholders whose data one thread
 * (the owner) is loading; acquire waits for them.
 *
 * acquire: on a hit returns the pinned entry with its data (*ret_fill false),
 * waiting first if the digest is being loaded.  On a miss inserts a
 * placeholder and returns it pinned with *ret_fill true: the caller must load
 * the data and fill the placeholder (ckpt_cache_fill_as or _fill_buf) or
 * abandon it.  NULL only on allocation failure.
 * reserve: a pinned placeholder if d is absent (the caller must fill or
 * abandon it), else NULL (present, being loaded, or no memory): for
 * prefetching, which never waits.
 * fill_as: give the placeholder its data (malloc'd, ownership passes); the
 * entry stays pinned by the caller; returns data.
 * abandon: drop a placeholder that could not be loaded (waiters retry).
 */
ckpt_cache_entry *ckpt_cache_acquire(ckpt_cache *c, const ckpt_digest *d,
				     const uint8_t **ret_data, size_t *ret_len, bool *ret_fill);
ckpt_cache_entry *ckpt_cache_reserve(ckpt_cache *c, const ckpt_digest *d);
/*
 * fill_as(stream = true): the chunk was loaded for a sequential reader (read-
 * ahead, streaming a file once).  Stream entries live on a list of their own
 * with a budget of their own (default a quarter of the capacity, at most
 * CKPT_CACHE_STREAM_MAX): streaming a large file recycles that much memory
 * instead of filling the whole cache with chunks that the kernel's page
 * cache holds anyway: fresh memory costs a page fault and a zeroing per
 * page, a large share of a cold read's CPU time (docs/performance.md).
 */
#define CKPT_CACHE_STREAM_MAX (64ull << 20)
const uint8_t *ckpt_cache_fill_as(ckpt_cache *c, ckpt_cache_entry *e, uint8_t *data, size_t len,
				  bool stream);

/*
 * Chunk buffers recycled by the cache.  With malloc, chunk buffers loaded by
 * many threads spread over glibc's per-thread arenas, and each arena keeps
 * up to M_TRIM_THRESHOLD of freed memory, so the daemon's memory grew to
 * several times what the cache held after a few parallel readers.  These
 * buffers are anonymous mappings in 128 KiB steps; freed ones are kept for
 * reuse up to 32 MiB in all and unmapped beyond, so memory follows what the
 * cache holds.  A request takes a free buffer of its size class or up to
 * twice it (at least 512 KiB larger) as it is; failing that, a free buffer
 * of another class resized with mremap (the pages it has touched stay, so
 * they are not faulted and zeroed again); only then a new mapping.  An
 * entry in such a buffer is charged the buffer's mapped size against the
 * capacity, so the cache's bound is a bound on its memory.
 * buf_alloc returns NULL when out of memory; a buffer goes back with
 * buf_free or into the cache with fill_buf(pooled = true).
 */
uint8_t *ckpt_cache_buf_alloc(ckpt_cache *c, size_t len);
/*
 * Give the buffers a reserve: bytes (rounded down to 128 KiB) of memory
 * mapped and touched now (MAP_POPULATE) and kept until ckpt_cache_free().
 * ckpt_cache_buf_alloc then takes the first free run of the reserve that
 * fits before it tries the pool or maps anything; ckpt_cache_buf_free gives
 * the run back.  A buffer's first touch costs a page fault and a zeroing
 * per 4 KiB page (in a virtual machine also the host backing the page),
 * and the pool keeps at most 32 MiB of freed buffers, so without a reserve a
 * daemon keeps faulting memory in for every large read.  With one, reads
 * that fit it fault nothing: the cost is paid once, when the store opens,
 * and the memory stays resident (it counts in the daemon's RSS from then
 * on).  Call at most once, before the cache is shared between threads.
 * Returns 0 (also for bytes < 128 KiB: no reserve), -EINVAL (c NULL or a
 * reserve already made), -ENOMEM or another negative errno from mmap.
 */
int ckpt_cache_reserve_bufs(ckpt_cache *c, uint64_t bytes);
void ckpt_cache_buf_free(ckpt_cache *c, uint8_t *buf, size_t len);
const uint8_t *ckpt_cache_fill_buf(ckpt_cache *c, ckpt_cache_entry *e, uint8_t *data, size_t len,
				   bool stream, bool pooled);
void ckpt_cache_abandon(ckpt_cache *c, ckpt_cache_entry *e);

/* Pin an entry the caller has pinned already once more (each pin needs its
 * own release). */
void ckpt_cache_ref(ckpt_cache *c, ckpt_cache_entry *e);

/* Unpin an entry returned by acquire or reserve (after fill). */
void ckpt_cache_release(ckpt_cache *c, ckpt_cache_entry *e);
/*
 * Unpin it and count nread more of its bytes as handed to a reader.  A
 * stream entry whose bytes have all been handed out (in sum, by any
 * readers) is evicted before stream entries not yet read to the end: those
 * are chunks read-ahead loaded for a reader still to come, or chunks one
 * reader read in part and another will read the rest of (two tp4 ranks of
 * a view read the two halves of each row of a tp2 shard).  Under plain LRU
 * such a chunk was evicted, and loaded a second time, whenever the two
 * readers drifted apart by more than the stream budget.
 */
void ckpt_cache_release_read(ckpt_cache *c, ckpt_cache_entry *e, size_t nread);

struct ckpt_cache_stats {
	uint64_t hits, misses, bytes, entries, evictions, stream_bytes;
	uint64_t evicted_unread; /* stream entries evicted before read to the end */
	uint64_t stream_cap; /* the budget of stream entries (ckpt_cache_fill_as) */
	/* chunk buffers handed out by ckpt_cache_buf_alloc: from the pool as
	 * they were, from the pool resized (mremap), newly mapped, from the
	 * reserve (ckpt_cache_reserve_bufs) */
	uint64_t bufs_pooled, bufs_resized, bufs_fresh, bufs_reserve;
};
void ckpt_cache_get_stats(ckpt_cache *c, struct ckpt_cache_stats *ret_stats);

#endif
