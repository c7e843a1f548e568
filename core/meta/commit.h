/* SPDX-License-Identifier: MIT */
/*
 * commit.h - commits of file content to the metadata: in one engine
 * transaction, the files' new extent lists, their inodes' size, flags and
 * times, and the reference counts of every chunk added or dropped.  The
 * store's overlay and flusher (core/store/commit.c) decide when; this is
 * what a commit writes.
 *
 * Reference counts: a chunk's count is the number of extents naming it in
 * all committed extent lists.  A commit reads each chunk record it changes
 * for update, so two writers sharing an engine cannot lose an increment;
 * a chunk not yet in the index gets its record from the caller's unindexed
 * callback (the store's pending table: chunks written and synced by the
 * chunk backend, named by no commit yet).
 *
 * Thread-safety: the calls may run in any thread; the caller serializes
 * its own commits if it wants to avoid needless conflicts.  Errors:
 * negative errno; -EIO for a damaged record or a chunk referenced but
 * found nowhere (logged with the caller's name); -EAGAIN only if conflicts
 * persist past CKPT_TXN_TRIES attempts.
 */
#ifndef CKPT_COMMIT_H
#define CKPT_COMMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meta/engine.h"
#include "meta/records.h"

/* A change of one chunk's reference count. */
struct ckpt_refdelta {
	ckpt_digest d;
	int64_t n;
};

/* +1 for every chunk extent of add, -1 for every one of sub (either may be
 * NULL), merged per digest in digest order, zero sums dropped; *ret is
 * malloc'd (the caller frees it). */
int ckpt_refdelta_build(const struct ckpt_extent_list *add, const struct ckpt_extent_list *sub,
			struct ckpt_refdelta **ret, size_t *ret_n);

/* Where a chunk the index does not name yet is: true and *ret_loc. */
typedef bool (*ckpt_unindexed_fn)(void *arg, const ckpt_digest *d, struct ckpt_chunk_loc *ret_loc);

struct ckpt_commit_env {
	ckpt_engine *eng;
	ckpt_unindexed_fn unindexed;
	void *arg;
	const char *name; /* for messages: the store's path */
	/* Shared engines (docs/cluster.md section 7): a refcount that falls
	 * to 0 writes the chunk's 'Z' record (epoch 0: not yet seen by gc),
	 * one that rises from 0 deletes it. */
	bool zero_marks;
	/* If set, every content commit (not a reap) calls it first in its
	 * transaction: the gc fence, which reads the node's session for
	 * update and fails (-ESTALE, logged) when gc declared it dead; the
	 * commit then fails with that error. */
	int (*fence)(void *arg, ckpt_txn *t);
};

/* Apply v[0..n) in t (each chunk record read for update).  An underflow
 * is logged and clamped to 0 (fsck reports it). */
int ckpt_refdelta_apply(const struct ckpt_commit_env *env, ckpt_txn *t,
			const struct ckpt_refdelta *v, size_t n);

/* One file's new content. */
struct ckpt_content {
	uint64_t ino;
	const struct ckpt_extent_list *list;
	uint32_t flags;   /* CKPT_INODE_F_* */
	int64_t mtime_ns; /* also the new ctime */
};

/* Commit v[0..n) in one transaction, run again on a conflict; files that
 * are gone or no longer regular are skipped.  On success *ret_added /
 * *ret_nadded (may be NULL) list the chunks whose count went up (malloc'd,
 * the caller frees): the caller's unindexed chunks among them are indexed
 * now. */
int ckpt_content_commit(const struct ckpt_commit_env *env, const struct ckpt_content *v, size_t n,
			bool durable, ckpt_digest **ret_added, size_t *ret_nadded);

#endif
