/* SPDX-License-Identifier: MIT */
/*
 * view.h - resharded views: the safetensors files of one stored directory
 * as they would be for another tensor/pipeline-parallel layout.
 *
 * A view is built from the safetensors files directly inside a store
 * directory (inodes flagged CKPT_INODE_F_SAFETENSORS).  Their tensors are
 * pieces of global tensors (see shardmeta.h); files are grouped by their
 * metadata "group" (default "model").  For layout tpT_ppP each group yields
 * the files "{group}_tp{t}_pp{p}.safetensors" (t < T, p < P), or
 * "{group}.safetensors" for tp1_pp1; see docs/views.md for the rules.
 *
 * File names are computed when the view is built, each file's header (and
 * so its exact size) on first use.  Opening a file (ckpt_vfile_open) checks
 * that every tensor can be served, which is where missing or inconsistent
 * pieces are detected (-EIO with the reason); a version that passed once is
 * not checked again.  Each tensor's data is mapped to byte runs of the
 * source files on the first read of its bytes through an open file.  Reads
 * decompress only the chunks that cover the requested bytes (through the
 * store's chunk cache).
 *
 * Parses of sources are cached in memory and persisted in the index ('P'
 * keys), checked against the chunks holding each file's header, so the
 * first view after a mount does not parse JSON again.
 *
 * Source safetensors files whose ckptfs metadata is invalid or of a newer
 * version are not reshardable: they are not consumed by the view and appear
 * in it as ordinary files (ckpt_view_is_source() is false for them).
 *
 * Ownership, snapshot semantics, thread-safety and errors: views.h (a
 * built view changes only by planning files on first use, under its own
 * lock; ckpt_view_ref/unref are atomic; a vfile may be read from several
 * threads at once).
 */
#ifndef CKPT_VIEW_H
#define CKPT_VIEW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "views/layout.h"
#include "views/shardmeta.h"
#include "store/store.h"

typedef struct ckpt_view ckpt_view;
typedef struct ckpt_vfile ckpt_vfile;

/* Build the view of store directory dir for layout l.  rules: tp rules
 * (NULL: built-in rules only).  The view holds a reference; release it with
 * ckpt_view_unref().  Errors: -ENOTDIR, -ENOENT, -EIO (reading a source
 * header failed), -ENOMEM; err gets a message. */
int ckpt_view_build(ckpt_store *s, uint64_t dir, const struct ckpt_layout *l,
		    const ckpt_tp_rules *rules, ckpt_view **ret_view, char *err, size_t errlen);
void ckpt_view_ref(ckpt_view *v);
/* Parse the header and metadata of safetensors file ino now, into the
 * cache that view builds share, so that the first view of its directory
 * opens quickly.  No-op for other files. */
int ckpt_view_prefetch(ckpt_store *s, uint64_t ino);
/* Drop the process-wide caches' holds on everything parsed from store s
 * (call before ckpt_store_free(s); views still referenced stay valid). */
void ckpt_view_forget_store(ckpt_store *s);
/* What the process-wide caches that view builds share hold now: models
 * (one per directory viewed) and parsed source files, kept by the caches or
 * in use by views.  The caches keep the newest few of each, and let go of
 * those of directories and files deleted or changed when the next view is
 * built. */
struct ckpt_view_cache_stats {
	size_t models, sources;             /* alive: kept or in use */
	size_t model_bytes, source_bytes;   /* estimated bytes of those kept */
};
void ckpt_view_cache_stats(struct ckpt_view_cache_stats *ret);
/* The caches' byte budget (process-wide): the models kept stay within
 * `bytes` (a model counts its parsed sources too), the parses kept within
 * half of it; the newest of each is kept whatever its size.  Entries that
 * views still use stay alive beyond it.  0: counts only.  Default
 * CKPT_VIEW_CACHE_MEM_DEFAULT. */
#define CKPT_VIEW_CACHE_MEM_DEFAULT (256ull << 20)
void ckpt_view_cache_set_budget(size_t bytes);
void ckpt_view_unref(ckpt_view *v); /* accepts NULL */

/* A cheap fingerprint of the sources of dir's view (inode, size, mtime and
 * flags of every regular file in dir): equal fingerprints => equal views. */
int ckpt_view_signature(ckpt_store *s, uint64_t dir, uint64_t *ret_sig);
uint64_t ckpt_view_sig(const ckpt_view *v); /* the fingerprint at build time */

size_t ckpt_view_nfiles(const ckpt_view *v);
const char *ckpt_view_file_name(const ckpt_view *v, size_t i);
/* Exact size of view file i.  Builds the file's header on first use (0 and
 * a log line if that fails: out of memory). */
uint64_t ckpt_view_file_size(ckpt_view *v, size_t i);
/* Index of the file called name, or -ENOENT. */
int ckpt_view_find(const ckpt_view *v, const char *name);
/* Latest mtime (ns) of the directory and the regular files in it. */
int64_t ckpt_view_mtime(const ckpt_view *v);
/* True if store inode ino is a safetensors source consumed by this view
 * (and so hidden from it). */
bool ckpt_view_is_source(const ckpt_view *v, uint64_t ino);
/* The extent lists the view's files read from, one per parsed file of its
 * directory (i < ckpt_view_nsources(v)); they live as long as the view.
 * The daemon pins their chunks while a view file is open (store.h, holds). */
size_t ckpt_view_nsources(const ckpt_view *v);
const struct ckpt_extent_list *ckpt_view_source_extents(const ckpt_view *v, size_t i);

/* Summary of a view's groups, for `ckpt ls`. */
struct ckpt_view_group_info {
	const char *name;
	size_t tensors;        /* global tensors */
	size_t files;          /* source files */
	unsigned saved_tp;     /* inferred layout the sources were saved in */
	unsigned saved_pp;
	uint64_t num_layers;
	size_t problems;       /* tensors whose pieces conflict (dtype, global shape,
				* tp_dim) other than those counted in nometa;
				* missing pieces and disagreeing replicas are
				* found when files are opened (ckpt check) */
	size_t nometa;         /* tensors held by several files without ckptfs
				* metadata that differ: in shape, or in bytes
				* as far as chunk digests tell (no data is read;
				* ckpt check compares the bytes) */
};
size_t ckpt_view_ngroups(const ckpt_view *v);
void ckpt_view_group_info(const ckpt_view *v, size_t i, struct ckpt_view_group_info *ret);

/* Check every tensor of every file of the view (what opening each would
 * check), reporting each problem through cb.  Returns the number of
 * problems or -ENOMEM. */
int ckpt_view_check(ckpt_view *v, void (*cb)(void *ud, const char *file, const char *why),
		    void *ud);

/* Open view file i: check that its tensors can be served (once per file
 * version: later opens skip the checks).  -EIO when a tensor of the file is
 * not covered by stored pieces, replicas or overlapping pieces disagree, or
 * pieces disagree on dtype or global shape; err then names the group,
 * tensor and range. */
int ckpt_vfile_open(ckpt_view *v, size_t i, ckpt_vfile **ret_file, char *err, size_t errlen);
void ckpt_vfile_free(ckpt_vfile *f); /* accepts NULL */
uint64_t ckpt_vfile_size(const ckpt_vfile *f);
/* Read up to len bytes at off; returns bytes read (short only at EOF) or
 * -errno (-EIO: a damaged chunk). */
ssize_t ckpt_vfile_read(ckpt_vfile *f, void *buf, size_t len, uint64_t off);
/* The same with a gather (zero-copy, see struct ckpt_gather; g may be NULL). */
ssize_t ckpt_vfile_read_gather(ckpt_vfile *f, void *buf, size_t len, uint64_t off,
			       struct ckpt_gather *g);
/* Digests of the source chunks behind [off, off+len) of f in read order, at
 * most max, mostly without repeats (for read-ahead).  Returns the count. */
size_t ckpt_vfile_chunks(ckpt_vfile *f, uint64_t off, uint64_t len, ckpt_digest *out,
			 size_t max);

#endif
