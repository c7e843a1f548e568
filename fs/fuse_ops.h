/* SPDX-License-Identifier: MIT */
/*
 * fuse_ops.h - the FUSE low-level op adapters over the VFS layer (vfs.h).
 *
 * Each adapter turns a request's arguments into a vfs call and sends
 * exactly one reply; a negative errno from below becomes a FUSE error reply
 * in one place (reply_err in fuse_ops.c).
 */
#ifndef CKPTFS_FUSE_OPS_H
#define CKPTFS_FUSE_OPS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <stdbool.h>

#include "options.h"
#include "vfs.h"

/* The session's userdata (fuse_session_new): must outlive the session. */
struct fuse_ops_data {
	struct vfs *vfs;
	enum direct_read direct_read; /* -o direct_read */
	bool direct_read_given;
};

/* The ops table for fuse_session_new(): every handler timed and its errors
 * counted (opstats.h).  Call once, from main, before the session starts. */
const struct fuse_lowlevel_ops *fuse_ops_table(void);

/* A vfs_inval_fn over fuse_lowlevel_notify_inval_inode; ctx: the
 * struct fuse_session. */
void fuse_ops_inval(void *ctx, uint64_t ino, uint64_t off, uint64_t len);

#endif
