/* SPDX-License-Identifier: MIT */
/*
 * options.h - the daemon's command line: STORE MOUNTPOINT [-f] [-d] [-o ...].
 *
 * options_parse() takes ckptfs's own -o options out of args (libfuse's stay
 * for fuse_session_new) and checks them; every error is printed to stderr
 * naming the option and the reason.  Not thread-safe (call once, from main).
 */
#ifndef CKPTFS_OPTIONS_H
#define CKPTFS_OPTIONS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <stdbool.h>

#include "store/store.h"

/* -o direct_read: which read-only handles bypass the page cache. */
enum direct_read {
	DIRECT_READ_NONE,
	DIRECT_READ_VIEWS, /* the default */
	DIRECT_READ_ALL,
};

struct ckptfs_opts {
	char *store;                 /* absolute path */
	struct ckpt_store_opts sopts;
	char *tp_rules;              /* -o tp_rules=FILE, or NULL */
	unsigned workers;            /* 0: one per CPU */
	unsigned ra_workers;         /* UINT_MAX: default; 0: read-ahead off */
	unsigned readahead_kb;       /* the mount's read-ahead; 0: the kernel's */
	unsigned view_cache;
	uint64_t view_mem;           /* -o view_mem: ckpt_view_cache_set_budget */
	bool drop_behind;
	bool writeback_cache; /* -o writeback_cache */
	enum direct_read direct_read;
	bool direct_read_given;      /* -o direct_read was on the command line */
	char *log_file;              /* -o log=FILE, absolute, or NULL */
	bool syslog;                 /* -o syslog */
	char *meta;                  /* -o meta=CONNINFO (sopts.meta_where points here), or NULL */
	char *node;                  /* -o node=NAME (sopts.node_name points here), or NULL */
};

/* Parse the command line into ret and cmd (cmd->mountpoint is malloc'd).
 * Returns 0 to run the daemon, 1 when --help or --version was printed, -1
 * on a bad command line (message printed).  Free ret with options_free()
 * and cmd->mountpoint with free() in every case. */
int options_parse(struct fuse_args *args, struct fuse_cmdline_opts *cmd,
		  struct ckptfs_opts *ret);
void options_free(struct ckptfs_opts *o);

#endif
