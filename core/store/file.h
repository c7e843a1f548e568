/* SPDX-License-Identifier: MIT */
/*
 * file.h - the write path: turning writes into chunks and commits.
 *
 * A ckpt_writer holds the uncommitted state of one regular file while it is
 * open for writing.  It has two modes:
 *
 *  STREAM  the common case: the file was created or truncated and written
 *          strictly sequentially.  Bytes are cut into chunks as they arrive
 *          (tensor-aligned for safetensors, FastCDC otherwise) and handed to
 *          the worker pool, which hashes, compresses and appends them to a
 *          pack.  Nothing is written to disk twice.
 *          Appending at the end of an existing file also streams (FastCDC
 *          from the old end; no safetensors detection).
 *  STAGED  any other write (overwrite in the middle, sparse write past the
 *          end, partial truncate): the content
 *          is materialized into an unlinked scratch file under
 *          STORE/staging and chunked at commit time.  Slower, but general.
 *
 * Chunking plan (docs/design.md "Chunking"): if the file starts with a valid
 * safetensors header, the header is cut into pieces of at most 4 MiB and
 * every tensor's data into pieces of CKPT_TENSOR_PIECE bytes counted from
 * the tensor's first byte, so equal tensors give equal chunks whatever the
 * header length.  Anything else (and bytes after the tensor data) uses
 * FastCDC with the default parameters of chunker.h.  All-zero pieces become
 * zero extents and are not stored.
 *
 * Commit (ckpt_writer_commit) publishes the current content atomically via
 * ckpt_store_commit_file(); the writer stays usable afterwards.
 *
 * Thread-safety: a writer may be used from several threads (it has its own
 * lock); a pool is thread-safe.
 */
#ifndef CKPT_FILE_H
#define CKPT_FILE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "store/store.h"

#define CKPT_TENSOR_PIECE (1u << 20)
#define CKPT_HEADER_PIECE (4u << 20)
/* Bytes of chunks one writer may have queued or in flight. */
#define CKPT_WRITER_INFLIGHT (32u << 20)

typedef struct ckpt_pool ckpt_pool;
typedef struct ckpt_writer ckpt_writer;

/* Start nthreads chunk workers (0 = one per online CPU). */
int ckpt_pool_new(unsigned nthreads, ckpt_pool **ret_pool);
/* Stops the workers after the queue drains.  Accepts NULL. */
void ckpt_pool_free(ckpt_pool *p);

/* Writer for regular file ino.  truncate: start from empty content;
 * otherwise the committed content is the starting point. */
int ckpt_writer_new(ckpt_store *s, ckpt_pool *pool, uint64_t ino, bool truncate,
		    ckpt_writer **ret_writer);
/* Waits for queued chunks, discards uncommitted changes.  Accepts NULL. */
void ckpt_writer_free(ckpt_writer *w);

/* Write len bytes at off.  Returns 0 or -errno (a failure of an earlier
 * background chunk, e.g. -ENOSPC, is reported here or at commit; it is
 * sticky until the writer is freed or truncated to 0). */
int ckpt_writer_write(ckpt_writer *w, const void *buf, size_t len, uint64_t off);
/* Read the writer's current content.  Returns bytes read or -errno. */
ssize_t ckpt_writer_read(ckpt_writer *w, void *buf, size_t len, uint64_t off);
int ckpt_writer_truncate(ckpt_writer *w, uint64_t size);
/* fallocate(2) on the writer's content.  mode 0 (reserve), with or without
 * FALLOC_FL_KEEP_SIZE: the size grows to off + len if it was smaller, the
 * new range reads as zeros and stores nothing until written (a writer
 * streaming at its end keeps streaming); -ENOSPC when the chunk backend's
 * free space is under len, nothing changed.  FALLOC_FL_PUNCH_HOLE (with
 * KEEP_SIZE) and FALLOC_FL_ZERO_RANGE: the range becomes zeros (through the
 * staged path).  Other modes: -EOPNOTSUPP.  Errors are not sticky. */
int ckpt_writer_fallocate(ckpt_writer *w, int mode, uint64_t off, uint64_t len);
uint64_t ckpt_writer_size(ckpt_writer *w);
int64_t ckpt_writer_mtime(ckpt_writer *w);
/* utimens() on an open file: the mtime the next commit records (until a
 * later write sets it to that write's time). */
void ckpt_writer_set_mtime(ckpt_writer *w, int64_t mtime_ns);
/* The same, only if the writer has changes to commit (whose commit then
 * records the mtime); returns whether it had. */
bool ckpt_writer_set_mtime_if_dirty(ckpt_writer *w, int64_t mtime_ns);
/* Whether the writer went STAGED (for tests and messages). */
bool ckpt_writer_staged(ckpt_writer *w);
/* True when there are changes not yet committed. */
bool ckpt_writer_dirty(ckpt_writer *w);
/* Publish the current content (see store.h for durable). */
int ckpt_writer_commit(ckpt_writer *w, bool durable);

#endif
