/* SPDX-License-Identifier: MIT */
/*
 * readahead.h - chunk read-ahead for sequential readers.
 *
 * A FUSE read of a cold chunk reads it from its pack, verifies and
 * decompresses it on the thread that asked, while the kernel waits; one
 * sequential reader then keeps about one CPU busy and leaves the disk idle
 * while it decompresses.  Read-ahead loads the chunks after a sequential
 * reader's position on worker threads into the chunk cache, so that pack
 * reads, decompression and the FUSE copy of the current request overlap.
 *
 * A ckpt_ra_window per open file detects sequential reads and says which
 * byte range to load next; the caller maps that range to chunk digests and
 * hands them to ckpt_readahead_submit().  Workers take batches of queued
 * digests (up to 8, at most an eighth of the queue) and load those not
 * cached or being loaded (ckpt_store_prefetch_chunks: a reader that needs a
 * chunk a worker is loading waits for it instead of loading it again).
 *
 * Memory: the queue holds digests only (a fixed number; excess submissions
 * are dropped), loaded chunks go into the chunk cache and count against its
 * capacity, at most one batch per worker is being loaded at a time, and
 * each worker has an 8 MiB span buffer for the batch's pack reads, mapped
 * on first use.
 *
 * Thread-safety: every function may be called concurrently, except _free.
 */
#ifndef CKPT_READAHEAD_H
#define CKPT_READAHEAD_H

#include <stdbool.h>
#include <stdint.h>

#include "base/hash.h"
#include "store/store.h"

typedef struct ckpt_readahead ckpt_readahead;

/* Start nthreads workers (0: two per CPU, at most 16) for store s with a
 * queue of queue_len digests.  Returns 0, -ENOMEM or -errno of
 * pthread_create. */
int ckpt_readahead_new(ckpt_store *s, unsigned nthreads, unsigned queue_len,
		       ckpt_readahead **ret);
/* Stop the workers (queued digests are dropped).  Accepts NULL. */
void ckpt_readahead_free(ckpt_readahead *ra);
/* Queue n digests for loading, in order; those already cached or being
 * loaded are skipped, those that do not fit in the queue dropped. */
void ckpt_readahead_submit(ckpt_readahead *ra, const ckpt_digest *d, size_t n);

struct ckpt_ra_stats {
	uint64_t submitted, dropped, loaded, skipped, failed;
};
void ckpt_readahead_get_stats(ckpt_readahead *ra, struct ckpt_ra_stats *ret);

/*
 * How many bytes ahead of a sequential reader of a direct_io file to queue
 * chunks: a reader of such a file has one request in flight and no kernel
 * read-ahead, so only the workers' depth hides the disk's latency.  With
 * one stream a 24-32 MiB window read a view faster than 8 MiB, but four
 * streams with such windows outran the cache's stream budget (chunks were
 * evicted before their reader came, and reads got slower).  So the
 * streams, the direct_io read handles open at the moment, share 3/8 of
 * stream_cap (ckpt_cache_stats): at the default 64 MiB, 24 MiB for one
 * stream, 12 MiB each for two, never less than CKPT_RA_WINDOW_MIN or more
 * than CKPT_RA_WINDOW_MAX.  streams 0 counts as 1.
 */
#define CKPT_RA_WINDOW_MIN (8ull << 20)
#define CKPT_RA_WINDOW_MAX (32ull << 20)
uint64_t ckpt_ra_window_size(uint64_t stream_cap, unsigned streams);

/* Sequential-read detection for one open file (zero-initialised state is
 * valid).  Lock-free. */
struct ckpt_ra_window {
	uint64_t last_end; /* end of the latest read */
	uint64_t ra_end;   /* read-ahead issued up to here */
};

/* Record a read of [off, off+len) of a file of size bytes.  *ret_seq: the
 * read continues the previous one (within slack, reads arrive out of order
 * from several FUSE threads) or starts at 0.  If so and less than window/2
 * bytes beyond it have been queued, returns true with [*from, *to) the next
 * bytes to load (up to window bytes after the read). */
bool ckpt_ra_window_next(struct ckpt_ra_window *w, uint64_t off, uint64_t len, uint64_t size,
			 uint64_t window, uint64_t *from, uint64_t *to, bool *ret_seq);

#endif
