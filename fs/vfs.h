/* SPDX-License-Identifier: MIT */
/*
 * vfs.h - the daemon's VFS layer: the mount's namespace and open files over
 * the store tree (stree.h) and the view trees (vtree.h), with the policies
 * that do not belong to either tree: which tree serves a request, which
 * read-only files bypass the page cache (direct_io), read-ahead into the
 * chunk cache, drop-behind of the kernel's cached pages, and the kernel
 * cache invalidations they and commits need.
 *
 * Every function returns 0 / a positive value or a negative errno; none
 * talks to FUSE (the adapters in fuse_ops.c reply).  Thread-safe after
 * vfs_new(); vfs_set_direct() is called before the first open.
 */
#ifndef CKPTFS_VFS_H
#define CKPTFS_VFS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/statvfs.h>
#include <sys/types.h>

#include "store/readahead.h"
#include "store/file.h"
#include "store/store.h"
#include "tree.h"
#include "views/shardmeta.h"
#include "vtree.h"

struct vfs;

struct vfs_config {
	ckpt_store *store;
	ckpt_pool *pool;
	ckpt_readahead *ra;          /* NULL: chunk read-ahead off */
	uint64_t stream_cap;         /* the chunk cache's stream budget */
	const ckpt_tp_rules *rules;  /* for the views */
	unsigned view_cache;         /* views kept built */
	bool drop_behind;
	/* Whether the kernel maps direct_io files shared: read-only files use
	 * direct_io only then (a shared mapping would fail otherwise). */
	bool (*direct_granted)(void);
};

/* Everything in c must outlive the vfs. */
int vfs_new(const struct vfs_config *c, struct vfs **ret);
/* Files must be released.  Accepts NULL. */
void vfs_free(struct vfs *v);

/* Drop the kernel's cached pages of [off, off+len) of ino, or with len 0
 * its attributes and all its pages, or with off VFS_INVAL_ATTR its
 * attributes only. */
typedef void vfs_inval_fn(void *ctx, uint64_t ino, uint64_t off, uint64_t len);
#define VFS_INVAL_ATTR UINT64_MAX
/* Start the thread that sends queued invalidations through fn (sending
 * them from a request handler can deadlock on the inode); vfs_stop_inval()
 * before ctx goes away. */
void vfs_start_inval(struct vfs *v, vfs_inval_fn *fn, void *ctx);
void vfs_stop_inval(struct vfs *v);
/* Read-only files of the view trees / of the store tree may bypass the
 * page cache (once c->direct_granted()). */
void vfs_set_direct(struct vfs *v, bool views, bool files);
/* The kernel's writeback cache is on: files open for writing may use the
 * page cache (once, before the first open). */
void vfs_set_writeback(struct vfs *v, bool on);
/* At unmount: commit whatever is still open for writing. */
void vfs_commit_all(struct vfs *v);
void vfs_get_view_stats(struct vfs *v, struct vtree_stats *ret);

/* Namespace (ino, parent: the mount's inode numbers).  An entry returned
 * counts one kernel lookup, dropped by vfs_forget(). */
int vfs_lookup(struct vfs *v, uint64_t parent, const char *name, struct tree_entry *ret);
void vfs_forget(struct vfs *v, uint64_t ino, uint64_t nlookup);
int vfs_getattr(struct vfs *v, uint64_t ino, struct ckpt_inode *ret, double *ret_timeout);
/* what: CKPT_SET_* | TREE_SET_SIZE, values in in; ret: the attributes after. */
int vfs_setattr(struct vfs *v, uint64_t ino, unsigned what, const struct ckpt_inode *in,
		struct ckpt_inode *ret, double *ret_timeout);
/* Whether the caller of the request being handled is in group gid. */
typedef bool vfs_in_group_fn(void *ctx, uint32_t gid);
/* For a write, an open with O_TRUNC or a truncate of ino by a caller
 * without CAP_FSETID, from its request handler: clear S_ISUID, and S_ISGID
 * if S_IXGRP is set or the caller is not in the file's group (in_group),
 * and drop the kernel's cached attributes of ino.  Nothing is written when
 * no bit is to be cleared. */
int vfs_kill_suidgid(struct vfs *v, uint64_t ino, vfs_in_group_fn *in_group, void *ctx);
int vfs_readlink(struct vfs *v, uint64_t ino, char **ret_target);
int vfs_readdir(struct vfs *v, uint64_t ino, struct ckpt_dirent **ret_ents, size_t *ret_n);
int vfs_mknode(struct vfs *v, uint64_t parent, const char *name, uint32_t mode, uint32_t uid,
	       uint32_t gid, const char *target, uint64_t rdev, struct tree_entry *ret);
int vfs_link(struct vfs *v, uint64_t ino, uint64_t newparent, const char *newname,
	     struct tree_entry *ret);
int vfs_unlink(struct vfs *v, uint64_t parent, const char *name, bool dir);
int vfs_rename(struct vfs *v, uint64_t parent, const char *name, uint64_t newparent,
	       const char *newname, unsigned flags);
/* fsyncdir: everything written so far made durable. */
int vfs_sync(struct vfs *v);
int vfs_statfs(struct vfs *v, struct statvfs *ret);

/* Files.  (*ret)->direct says whether it bypasses the page cache.  A file
 * is released once, by vfs_release(), also after an interrupted open. */
int vfs_open(struct vfs *v, uint64_t ino, int flags, struct tree_file **ret);
/* Make a regular file parent/name and open it (O_TRUNC added). */
int vfs_create(struct vfs *v, uint64_t parent, const char *name, uint32_t mode, uint32_t uid,
	       uint32_t gid, int flags, struct tree_entry *ret_entry, struct tree_file **ret);
/* Read into buf, a buffer of at least len bytes from vfs_buf_alloc().
 * *ret_gathered: the reply is g's iovecs (zero-copy, see struct
 * ckpt_gather), else the returned bytes of buf.  Afterwards, once the reply
 * is sent, vfs_read_done() in every case.  Failures are logged. */
ssize_t vfs_read(struct vfs *v, struct tree_file *f, void *buf, size_t len, uint64_t off,
		 struct ckpt_gather *g, bool *ret_gathered);
uint8_t *vfs_buf_alloc(struct vfs *v, size_t len);
void vfs_read_done(struct vfs *v, struct ckpt_gather *g, bool gathered, uint8_t *buf,
		   size_t len);
/* -EBADF unless f was opened for writing.  Failures are logged. */
int vfs_write(struct vfs *v, struct tree_file *f, const void *buf, size_t len, uint64_t off);
/* fallocate(2) (ckpt_writer_fallocate says which modes do what); -EBADF
 * unless f was opened for writing.  Failures other than the refusals
 * (-EOPNOTSUPP, -ENOSPC, -EINVAL, -EFBIG) are logged. */
int vfs_fallocate(struct vfs *v, struct tree_file *f, int mode, uint64_t off, uint64_t len);
/* flush (durable false) or fsync (true). */
int vfs_commit(struct vfs *v, struct tree_file *f, bool durable);
void vfs_release(struct vfs *v, struct tree_file *f);

#endif
