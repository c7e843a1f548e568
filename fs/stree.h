/* SPDX-License-Identifier: MIT */
/*
 * stree.h - the store tree: the store's own files and directories, served
 * read-write through the tree ops (tree.h).  Store inode numbers are the
 * mount's inode numbers.
 *
 * Inode lifecycle (modelled on libfuse's passthrough_ll): a node exists
 * while the kernel holds lookups on the inode (nlookup > 0) or files are
 * open on it (nopen > 0).  When both drop to zero the node is freed and the
 * store is asked to reap the inode (which deletes it if it was unlinked).
 *
 * Open files: a file opened for writing shares the node's ckpt_writer (all
 * writers of one inode see one content); commit (flush/fsync) commits it,
 * the last writable release commits and frees it.  A read-only file reads
 * the committed content through a snapshot of the extent list, switched to
 * the latest committed version at its next read after a commit
 * (close-to-open consistency, as the kernel's page cache and file size,
 * shared by all handles of an inode, behave), so readers never observe a
 * half-written file.
 *
 * Thread-safe: one lock guards the node table; each read-only file's
 * snapshot has its own.
 */
#ifndef CKPTFS_STREE_H
#define CKPTFS_STREE_H

#include "store/file.h"
#include "store/store.h"
#include "tree.h"

/* What the store tree tells the layer above. */
struct stree_hooks {
	void *ctx;
	/* A name or an inode's attributes changed. */
	void (*changed)(void *ctx);
	/* New content of ino was committed.  sync: drop the kernel's caches of
	 * ino before returning (only from requests the kernel sends without
	 * holding the inode's lock or page locks: FLUSH, FSYNC, RELEASE);
	 * else queue that. */
	void (*committed)(void *ctx, uint64_t ino, bool sync);
};

/* s, pool and hooks must outlive the tree. */
int stree_new(ckpt_store *s, ckpt_pool *pool, const struct stree_hooks *hooks,
	      struct tree **ret);
/* The kernel's writeback cache is on: writable files may use the page
 * cache (see "Page cache and writers" in stree.c).  Before the first open. */
void stree_set_writeback(struct tree *t, bool on);
/* Commit every writer still open (at unmount the kernel normally releases
 * every file first). */
void stree_commit_all(struct tree *t);
/* Frees the nodes; files must be released.  Accepts NULL. */
void stree_free(struct tree *t);

#endif
