/* SPDX-License-Identifier: MIT */
/*
 * tree.h - the namespace trees the mount is made of, and the one ops table
 * through which the VFS layer (vfs.c) dispatches to them.
 *
 * Three trees share the mount's inode space: the store tree (stree.c: the
 * store's own files, read-write), the view trees (vtree.c: /tpT_ppP/,
 * read-only, their inode numbers from VTREE_INO_BASE up) and the control
 * tree (ctltree.c: /.ckptfs/, read-only, from CTL_INO_BASE up).  vfs.c
 * picks the tree of a request from its inode, or for a name from (parent,
 * name): a view root "tpT_ppP" under the store's root belongs to the view
 * trees, ".ckptfs" there to the control tree.
 * Requests on an open file go to the tree that opened it.
 *
 * The contract of fs/ (main.c has the module map):
 * - Errors: every op returns 0 / a positive value or a negative errno and
 *   logs what the user needs to know (the file and the reason); none
 *   replies to the kernel (fuse_ops.c does, once per request).
 * - Threads: ops are called from many FUSE threads at once, also on one
 *   open file; each tree states its locking (stree.h, vtree.h).
 * - Ownership: the caller owns what an op returns (readlink's target:
 *   free(); readdir's entries: ckpt_dirents_free()), except an open file,
 *   which belongs to its tree until the caller hands it to release, once.
 *   A tree outlives its files.
 * - A read-only tree answers changes with its refusal (-EROFS, or -EEXIST
 *   for making a name that exists).
 */
#ifndef CKPTFS_TREE_H
#define CKPTFS_TREE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "store/readahead.h"
#include "store/store.h"

/* What a lookup (or a create) hands to the kernel. */
struct tree_entry {
	struct ckpt_inode attr;  /* attr.ino is the mount's inode number */
	uint64_t generation;
	double entry_timeout;    /* seconds */
	double attr_timeout;
};

struct tree;

/* The head of every open file.  The tree's open fills in ops, ino and
 * writable; vfs.c owns the rest.  Freed by the tree's release. */
struct tree_file {
	const struct tree_ops *ops;
	struct tree *tree;
	uint64_t ino;              /* the mount's inode number */
	bool writable;
	bool direct;               /* opened with direct_io (set once at open) */
	struct ckpt_ra_window ra;  /* read-only files: read-ahead state */
	uint64_t dropped;          /* drop-behind: kernel pages below this offset
				    * were queued for dropping (atomic) */
};

struct tree_ops {
	/* Its read-only files are view files: -o direct_read=views covers
	 * them (else only direct_read=all). */
	bool views;
	/* Its files' content is made at open (the control tree): they are
	 * always opened with direct_io (stat shows size 0), without
	 * read-ahead. */
	bool generated;

	/* Namespace.  lookup counts one kernel reference in trees that count
	 * them (forget drops nlookup of them). */
	int (*lookup)(struct tree *t, uint64_t parent, const char *name, struct tree_entry *ret);
	void (*forget)(struct tree *t, uint64_t ino, uint64_t nlookup);
	int (*getattr)(struct tree *t, uint64_t ino, struct ckpt_inode *ret,
		       double *ret_timeout);
	/* what: CKPT_SET_* and TREE_SET_SIZE; in carries the new values.
	 * CKPT_SET_KILL_SUIDGID and CKPT_SET_KILL_SGID alone change nothing
	 * (not even ctime) when the mode has no bit to clear. */
	int (*setattr)(struct tree *t, uint64_t ino, unsigned what, const struct ckpt_inode *in);
	int (*readlink)(struct tree *t, uint64_t ino, char **ret_target);
	/* Entries of directory ino (ckpt_dirents_free them). */
	int (*readdir)(struct tree *t, uint64_t ino, struct ckpt_dirent **ret_ents,
		       size_t *ret_n);
	/* mode: the type with the permission bits: S_IFREG, S_IFDIR, S_IFLNK
	 * (target: the symlink's), S_IFIFO, S_IFSOCK, S_IFCHR or S_IFBLK
	 * (rdev: the device number). */
	int (*mknode)(struct tree *t, uint64_t parent, const char *name, uint32_t mode,
		      uint32_t uid, uint32_t gid, const char *target, uint64_t rdev,
		      struct tree_entry *ret);
	/* Called on the tree of ino unless newparent/newname is in another. */
	int (*link)(struct tree *t, uint64_t ino, uint64_t newparent, const char *newname,
		    struct tree_entry *ret);
	int (*unlink)(struct tree *t, uint64_t parent, const char *name, bool dir);
	/* Called on the tree of the old name unless the new one is in another. */
	int (*rename)(struct tree *t, uint64_t parent, const char *name, uint64_t newparent,
		      const char *newname, unsigned flags);
	/* Where ino is, for messages (malloc'd; NULL when out of memory). */
	char *(*path)(struct tree *t, uint64_t ino);

	/* Files.  open: flags as open(2); O_TRUNC with write access empties. */
	int (*open)(struct tree *t, uint64_t ino, int flags, struct tree_file **ret);
	/* Before a read of a read-only file: switch to the content readers
	 * should see now.  NULL: its content never changes while open. */
	int (*refresh)(struct tree_file *f);
	/* g: gather for a zero-copy reply (read-only files), NULL for a
	 * plain copy into buf (files open for writing). */
	ssize_t (*read)(struct tree_file *f, void *buf, size_t len, uint64_t off,
			struct ckpt_gather *g);
	/* Read-only files, for read-ahead: the size, and the chunks behind
	 * [off, off+len) (at most max). */
	uint64_t (*size)(struct tree_file *f);
	size_t (*chunks)(struct tree_file *f, uint64_t off, uint64_t len, ckpt_digest *out,
			 size_t max);
	/* Whether another file of the same inode is open now. */
	bool (*shared)(struct tree_file *f);
	int (*write)(struct tree_file *f, const void *buf, size_t len, uint64_t off);
	/* flush (durable false) and fsync (true). */
	int (*commit)(struct tree_file *f, bool durable);
	void (*release)(struct tree_file *f);
};

#define TREE_SET_SIZE 0x100u /* beyond the CKPT_SET_* bits */

/* A tree: embedded first in each tree's own struct. */
struct tree {
	const struct tree_ops *ops;
};

#endif
