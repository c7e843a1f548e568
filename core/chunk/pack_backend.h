/* SPDX-License-Identifier: MIT */
/*
 * pack_backend.h - the "pack" chunk backend (backend.h) over pack files
 * (pack.h): what its locations mean, for the backend's own files and for
 * tests that damage a record on purpose.  Nothing else decodes locations.
 *
 * where = le64 pack id, le64 offset of the record header in the pack: the
 * bytes the index's chunk entry has always held there (docs/format.md 5.2).
 *
 * The private part (below CKPT_PACK_BACKEND_PRIVATE) is shared by
 * pack_backend.c (pack set, put, sync, get, units) and pack_span.c (span
 * reads with kernel AIO).
 */
#ifndef CKPT_PACK_BACKEND_H
#define CKPT_PACK_BACKEND_H

#include "base/util.h"
#include "chunk/backend.h"

static inline void ckpt_pack_loc_set(struct ckpt_chunk_loc *loc, uint64_t id, uint64_t offset)
{
	ckpt_put_le64(loc->where, id);
	ckpt_put_le64(loc->where + 8, offset);
}
static inline uint64_t ckpt_pack_loc_id(const struct ckpt_chunk_loc *loc)
{
	return ckpt_get_le64(loc->where);
}
static inline uint64_t ckpt_pack_loc_offset(const struct ckpt_chunk_loc *loc)
{
	return ckpt_get_le64(loc->where + 8);
}

#ifdef CKPT_PACK_BACKEND_PRIVATE
#include <linux/aio_abi.h>
#include <pthread.h>
#include <string.h>

#include "chunk/pack.h"

/*
 * Span buffers: SPAN_BUF bytes each, aligned to huge pages and advised
 * MADV_HUGEPAGE, since O_DIRECT reads into huge pages cost the kernel less
 * per byte than reads into 4 KiB pages (docs/performance.md has the
 * figures).  A thread has CKPT_CHUNK_SPAN_INFLIGHT of them: one per batch
 * it has begun and not ended.
 */
#define SPAN_MAX (4u << 20) /* one request */
#define SPAN_BUF (8u << 20) /* the spans of one batch */
#define SPAN_GAP (64u << 10) /* records this far apart still share a span */
#define SPAN_N 16            /* requests of one batch; the rest load alone */
#define SPAN_INFLIGHT CKPT_CHUNK_SPAN_INFLIGHT

/* A thread's span state (pthread key of the backend). */
struct pb_tls {
	void *span_map[SPAN_INFLIGHT]; /* SPAN_BUF + huge alignment bytes each, or NULL */
	uint8_t *span[SPAN_INFLIGHT];  /* SPAN_BUF bytes inside, aligned */
	bool span_busy[SPAN_INFLIGHT]; /* held by a batch begun and not ended */
	aio_context_t aio; /* the thread's kernel AIO context (aio_state 1) */
	int aio_state;     /* 0 not set up yet, 1 set up, -1 unavailable */
};

struct pack_be {
	struct ckpt_chunk_backend base;
	char *path; /* the store's, for messages */
	uint8_t uuid[16];
	bool writable, sync_readahead;
	uint64_t unit_max;
	int (*next_id)(void *ud, uint64_t *ret_id);
	void *ud;
	int dirfd; /* STORE/packs */
	pthread_key_t tls_key;

	/* Readers hold rw (read) while they use a pack's object; reclaim takes
	 * it (write) to free the object of a deleted pack, so that its disk
	 * space is released at once.  Span reads hold it while they submit
	 * (a submitted read holds its own reference to the file), not until
	 * the reads complete. */
	pthread_rwlock_t rw;
	pthread_mutex_t lock;
	/* Protected by lock: */
	ckpt_pack **packs; /* opened packs, any order */
	size_t npacks, cap_packs;
	ckpt_pack *wpack;  /* append target of CKPT_CHUNK_FRESH (also in packs[]) */
	ckpt_pack *bgpack; /* append target of CKPT_CHUNK_MOVED */

	/* span requests (atomic adds) */
	uint64_t span_async, span_sync, span_failed;
};

static inline void pb_rec_from_pack(struct ckpt_chunk_rec *dst, const struct ckpt_pack_rec *src)
{
	dst->codec = src->codec;
	dst->stored_len = src->stored_len;
	dst->raw_len = src->raw_len;
	memcpy(dst->digest, src->digest, sizeof(dst->digest));
}

/* pack_backend.c */
int pb_get_pack(struct pack_be *b, uint64_t id, ckpt_pack **ret);

/* pack_span.c */
void pb_tls_free(void *p);
int pb_span_begin(ckpt_chunk_backend *cb, struct ckpt_chunk_span_item **items, size_t n,
		  bool submit, ckpt_chunk_span **ret);
void pb_span_wait(ckpt_chunk_backend *cb, ckpt_chunk_span *sp);
void pb_span_end(ckpt_chunk_backend *cb, ckpt_chunk_span *sp);
int pb_span_warm(ckpt_chunk_backend *cb);
#endif

#endif
