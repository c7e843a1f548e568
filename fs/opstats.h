/* SPDX-License-Identifier: MIT */
/*
 * opstats.h - the daemon's metrics of FUSE requests: a latency histogram per
 * op and errors by (op, errno), rendered with the process's metrics
 * (base/metrics.h) as ckptfs_fuse_request_duration_seconds and
 * ckptfs_fuse_errors_total.
 *
 * fuse_ops.c brackets every op handler with opstats_begin/opstats_end (the
 * time from the handler's entry to its return, the reply included: every
 * handler replies before it returns) and reports the errno of every error
 * reply with opstats_error, which charges it to the op the calling thread
 * is in.  Hot-path cost: a clock read at each end, three relaxed atomic adds
 * on the thread's shard; no lock.
 *
 * Thread-safety: begin, end and error from any thread, between
 * opstats_init() and opstats_free() (called from main, around the session).
 */
#ifndef CKPTFS_OPSTATS_H
#define CKPTFS_OPSTATS_H

#include <stdint.h>

enum fop {
	FOP_LOOKUP, FOP_FORGET, FOP_GETATTR, FOP_SETATTR, FOP_READLINK, FOP_MKNOD, FOP_MKDIR,
	FOP_SYMLINK, FOP_LINK, FOP_UNLINK, FOP_RMDIR, FOP_RENAME, FOP_OPEN, FOP_CREATE,
	FOP_READ, FOP_WRITE, FOP_FLUSH, FOP_FSYNC, FOP_RELEASE, FOP_OPENDIR, FOP_READDIR,
	FOP_RELEASEDIR, FOP_FSYNCDIR, FOP_STATFS,
	FOP_COUNT
};

/* Histograms made, collector registered: 0 or -ENOMEM. */
int opstats_init(void);
void opstats_free(void);

/* The op's start (monotonic ns); the op becomes the thread's current one. */
int64_t opstats_begin(enum fop op);
void opstats_end(enum fop op, int64_t t0);
/* An error reply (err: positive errno) of the thread's current op. */
void opstats_error(int err);

/* The name of op as the metrics label it ("lookup"). */
const char *opstats_name(enum fop op);

#endif
