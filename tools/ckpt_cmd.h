/* SPDX-License-Identifier: MIT */
/*
 * ckpt_cmd.h - what the files of the ckpt tool share: the parsed arguments
 * of a command, opening a store, paths inside it, and the commands kept in
 * their own files (ckpt_verify.c, ckpt_du.c, ckpt_prune.c).  The command
 * table and the parser are in ckpt.c.
 *
 * Conventions of every command: results on stdout (JSON with --json, one
 * object, docs/user-guide.md section 5.1), errors on stderr naming the
 * store, the file and the reason, progress on stderr (progress.h); exit
 * status 0 success, 1 damage found or failure, 2 usage error.
 */
#ifndef CKPT_TOOLS_CMD_H
#define CKPT_TOOLS_CMD_H

#include <stdbool.h>
#include <stdint.h>

#include "progress.h"
#include "store/store.h"

/* One command's arguments after parsing: positionals in order, options by name. */
struct args {
	const char *pos[3];
	int npos;
	const char *layout;
	const char *tp_rules;
	const char *live;
	const char *sample;     /* verify --sample N% | N */
	const char *bytes;      /* verify --bytes SIZE */
	const char *seed;       /* verify --seed N */
	const char *keep_last;  /* prune --keep-last N */
	const char *keep_every; /* prune --keep-every K */
	int json;               /* --json */
	int dry_run;            /* prune --dry-run */
	int progress;           /* enum ckpt_bar_mode: --progress / --no-progress */
};

/* --meta CONNINFO (every command): the store's metadata is in PostgreSQL
 * (docs/cluster.md); NULL: RocksDB in STORE/index.  open_store_opts uses it. */
extern const char *meta_where;

/* Open the store at path with the options in *o (mode and compaction
 * threshold set by the caller; no chunk cache); errors are printed. */
int open_store_opts(const char *path, struct ckpt_store_opts *o, ckpt_store **ret);
int open_store(const char *path, enum ckpt_store_mode mode, ckpt_store **ret);
/* Resolve "/a/b" (relative to the store root) to an inode. */
int resolve(ckpt_store *s, const char *path, struct ckpt_inode *ret);
/* "a/b" from a and b (malloc'd), or NULL. */
char *join(const char *a, const char *b);

/* Print doc (a jansson json_t *, consumed) on stdout: one object,
 * indented, keys in the order added.  0, or 1 (and a message) when it
 * cannot be written. */
struct json_t;
int print_json_doc(struct json_t *doc);

/* Parse SIZE: a number of bytes with an optional K, M, G, T suffix (powers
 * of 1024; "KiB", "MB" and the like are accepted too).  0 or -EINVAL. */
int parse_size(const char *s, uint64_t *ret);
/* Parse a non-negative decimal integer.  0 or -EINVAL. */
int parse_u64(const char *s, uint64_t *ret);

/* ckpt verify STORE (ckpt_verify.c); vo->progress is set there. */
int cmd_verify(const char *store, struct ckpt_verify_opts *vo, enum ckpt_bar_mode progress);
/* ckpt du STORE [PATH] (ckpt_du.c). */
int cmd_du(const char *store, const char *path, bool json);
/* ckpt prune DIR (ckpt_prune.c); keep_last and keep_every 0: that rule is off. */
int cmd_prune(const char *dir, uint64_t keep_last, uint64_t keep_every, bool dry_run);

#endif
