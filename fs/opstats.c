/* SPDX-License-Identifier: MIT */
/*
 * opstats.c - the metrics of FUSE requests (see opstats.h).
 */
#include "config.h"

#include "opstats.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/metrics.h"
#include "base/util.h"

static const char *const names[FOP_COUNT] = {
	[FOP_LOOKUP] = "lookup", [FOP_FORGET] = "forget", [FOP_GETATTR] = "getattr",
	[FOP_SETATTR] = "setattr", [FOP_READLINK] = "readlink", [FOP_MKNOD] = "mknod",
	[FOP_MKDIR] = "mkdir", [FOP_SYMLINK] = "symlink", [FOP_LINK] = "link",
	[FOP_UNLINK] = "unlink", [FOP_RMDIR] = "rmdir", [FOP_RENAME] = "rename",
	[FOP_OPEN] = "open", [FOP_CREATE] = "create", [FOP_READ] = "read",
	[FOP_WRITE] = "write", [FOP_FLUSH] = "flush", [FOP_FSYNC] = "fsync",
	[FOP_RELEASE] = "release", [FOP_OPENDIR] = "opendir", [FOP_READDIR] = "readdir",
	[FOP_RELEASEDIR] = "releasedir", [FOP_FSYNCDIR] = "fsyncdir", [FOP_STATFS] = "statfs",
};

/* Bucket bounds in ns: 10 us to 10 s, 1-2.5-5 per decade. */
static const uint64_t bounds[] = {
	10000, 25000, 50000, 100000, 250000, 500000,
	1000000, 2500000, 5000000, 10000000, 25000000, 50000000,
	100000000, 250000000, 500000000, 1000000000, 2500000000ull, 5000000000ull,
	10000000000ull,
};

/* errno values counted by name; others count as ERRNO_OTHER. */
#define ERRNO_SLOTS 134
#define ERRNO_OTHER 0

static ckpt_histogram *hist[FOP_COUNT];
static atomic_uint_least64_t errs[FOP_COUNT][ERRNO_SLOTS];
static double start_time;
static bool registered;
static __thread int cur_op = -1;

const char *opstats_name(enum fop op)
{
	return (unsigned)op < FOP_COUNT ? names[op] : "?";
}

int64_t opstats_begin(enum fop op)
{
	cur_op = (int)op;
	return ckpt_mono_ns();
}

void opstats_end(enum fop op, int64_t t0)
{
	int64_t dt = ckpt_mono_ns() - t0;

	if (hist[op])
		ckpt_histogram_observe(hist[op], dt > 0 ? (uint64_t)dt : 0);
	cur_op = -1;
}

void opstats_error(int err)
{
	if (cur_op < 0 || err <= 0)
		return;
	atomic_fetch_add_explicit(&errs[cur_op][err < ERRNO_SLOTS ? err : ERRNO_OTHER], 1,
				  memory_order_relaxed);
}

static void errno_label(int e, char *buf, size_t len)
{
	const char *n = e == ERRNO_OTHER ? "other" : strerrorname_np(e);

	if (n)
		snprintf(buf, len, "%s", n);
	else
		snprintf(buf, len, "E%d", e);
}

static void collect(void *arg, ckpt_mw *w)
{
	char labels[96], en[32];

	(void)arg;
	ckpt_mw_family(w, "ckptfs_start_time_seconds", "gauge",
		       "When the daemon mounted, in seconds since the Unix epoch.");
	ckpt_mw_double(w, "ckptfs_start_time_seconds", NULL, start_time);
	ckpt_mw_family(w, "ckptfs_fuse_request_duration_seconds", "histogram",
		       "Time from a FUSE request's handler entry to its return (the reply "
		       "included), by op.");
	for (unsigned op = 0; op < FOP_COUNT; op++) {
		snprintf(labels, sizeof(labels), "op=\"%s\"", names[op]);
		if (hist[op])
			ckpt_mw_histogram(w, "ckptfs_fuse_request_duration_seconds", labels,
					  hist[op], 1e-9);
	}
	ckpt_mw_family(w, "ckptfs_fuse_errors_total", "counter",
		       "Error replies to FUSE requests, by op and errno (ENOENT of lookup "
		       "is a name that does not exist).");
	for (unsigned op = 0; op < FOP_COUNT; op++) {
		for (int e = 0; e < ERRNO_SLOTS; e++) {
			uint64_t n = atomic_load_explicit(&errs[op][e], memory_order_relaxed);

			if (!n)
				continue;
			errno_label(e, en, sizeof(en));
			snprintf(labels, sizeof(labels), "op=\"%s\",errno=\"%s\"", names[op], en);
			ckpt_mw_u64(w, "ckptfs_fuse_errors_total", labels, n);
		}
	}
}

int opstats_init(void)
{
	int r = 0;

	start_time = (double)ckpt_now_ns() / 1e9;
	for (unsigned op = 0; op < FOP_COUNT && r == 0; op++)
		r = ckpt_histogram_new(bounds, CKPT_ARRAY_SIZE(bounds), &hist[op]);
	if (r == 0)
		r = ckpt_metrics_register(collect, NULL);
	if (r < 0) {
		opstats_free();
		return r;
	}
	registered = true;
	return 0;
}

void opstats_free(void)
{
	if (registered)
		ckpt_metrics_unregister(collect, NULL);
	registered = false;
	for (unsigned op = 0; op < FOP_COUNT; op++) {
		ckpt_histogram_free(hist[op]);
		hist[op] = NULL;
	}
}
