/* SPDX-License-Identifier: MIT */
/*
 * loadctx.h - read contexts: what one chunk load works in (a record buffer
 * for the chunk backend's get, in huge pages, and a decompressor), borrowed
 * from a pool for that one load by whatever thread loads it.
 *
 * Not per thread: libfuse starts and ends worker threads as the load
 * changes, and a new thread's first load would fault in and zero a new
 * record buffer and decompressor on the read path.  The pool outlives the
 * threads; ckpt_loadctx_warm() makes and touches contexts ahead of use.  At
 * most `keep` are kept free; a get finding none makes one.
 *
 * The record buffer is in huge pages (ckpt_map_huge): the pack backend
 * reads into it with O_DIRECT, which costs the kernel less per byte into
 * huge pages than into 4 KiB pages (docs/performance.md has the figures).
 * Its decompressor skips zstd's content checksum: every decoded chunk is
 * checked against its keyed digest by the caller.
 *
 * Ownership: a context belongs to the pool while free and to its borrower
 * between get and put; buffers and decompressor belong to the context.
 * Thread-safety: get, put and stats may be called concurrently; a context
 * is used by one thread at a time; pool_free must not race with anything.
 */
#ifndef CKPT_LOADCTX_H
#define CKPT_LOADCTX_H

#include <stddef.h>
#include <stdint.h>

#include "chunk/backend.h"
#include "chunk/compress.h"

#define CKPT_LOADCTX_BUF_MAX (8u << 20) /* larger records get a buffer of their own */

typedef struct ckpt_loadctx ckpt_loadctx;
typedef struct ckpt_loadctx_pool ckpt_loadctx_pool;

/* A pool keeping at most keep free contexts.  0 or -ENOMEM. */
int ckpt_loadctx_pool_new(unsigned keep, ckpt_loadctx_pool **ret);
/* Free the pool and its free contexts (all must have been put back).
 * Accepts NULL. */
void ckpt_loadctx_pool_free(ckpt_loadctx_pool *p);

/* A context off the free list, or a new one; NULL without memory. */
ckpt_loadctx *ckpt_loadctx_get(ckpt_loadctx_pool *p);
/* Give x back (freed when keep are free already). */
void ckpt_loadctx_put(ckpt_loadctx_pool *p, ckpt_loadctx *x);

/* A buffer of at least need bytes: x's own, huge-page aligned (grown if
 * need be), or beyond CKPT_LOADCTX_BUF_MAX one made for this load, aligned
 * to CKPT_CHUNK_BUF_ALIGN (*ret_own: free() it after the load; NULL when
 * x's is used).  NULL without memory. */
uint8_t *ckpt_loadctx_buf(ckpt_loadctx *x, size_t need, void **ret_own);
/* x's decompressor. */
ckpt_decompressor *ckpt_loadctx_dc(ckpt_loadctx *x);

/* Make n contexts with a buffer of buf bytes and a decompressor reserved
 * for chunks of raw bytes, touch them, and put them in the pool (counted
 * as warm).  Failing is not an error: loads then make their own. */
void ckpt_loadctx_warm(ckpt_loadctx_pool *p, unsigned n, size_t buf, size_t raw);

/* made: contexts made since the pool was; warm: of those, by _warm; free:
 * in the pool now. */
struct ckpt_loadctx_stats {
	uint64_t made, warm, free;
};
void ckpt_loadctx_stats(ckpt_loadctx_pool *p, struct ckpt_loadctx_stats *ret);

#endif
