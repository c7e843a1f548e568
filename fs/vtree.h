/* SPDX-License-Identifier: MIT */
/*
 * vtree.h - the virtual /tpT_ppP/ trees of the daemon.
 *
 * MOUNT/tpT_ppP/PATH mirrors MOUNT/PATH read-only: directories and
 * non-safetensors files pass through, the safetensors sources of each
 * directory are replaced by the files of its resharded view (core/view.h).
 * Virtual inodes are numbered from VTREE_INO_BASE upwards (store inode
 * numbers stay far below) and live until unmount.  Views are cached per
 * (layout, directory), the view_cache most recently used ones, and rebuilt
 * when the directory's sources change or after they were dropped.  A view
 * of a 20,000-tensor checkpoint holds 2-50 MB (more for layouts that split
 * more tensors): an evaluator walking checkpoint after checkpoint grew the
 * daemon by about 55 MB per checkpoint and 3 layouts while every view
 * stayed cached (docs/performance.md 6e).
 *
 * All functions return 0 / a positive value or a negative errno; replies
 * are made by the caller (fs/ckptfs.c).  Thread-safe.
 */
#ifndef CKPTFS_VTREE_H
#define CKPTFS_VTREE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "views/shardmeta.h"
#include "store/store.h"

#define VTREE_INO_BASE (1ull << 60)

static inline bool vtree_is_virtual(uint64_t ino)
{
	return ino >= VTREE_INO_BASE;
}

/* view_cache: how many views to keep (0 counts as 1). */
#define VTREE_VIEW_CACHE_DEFAULT 8
int vtree_init(ckpt_store *s, const ckpt_tp_rules *rules, unsigned view_cache);
void vtree_fini(void);

struct vtree_stats {
	uint64_t views;     /* cached now */
	uint64_t builds;    /* views built since mount */
	uint64_t evictions; /* dropped for newer ones */
};
void vtree_get_stats(struct vtree_stats *ret);

/* Is name in parent a view root ("tpT_ppP" directly under the mount root)? */
bool vtree_is_view_name(uint64_t parent, const char *name);

/* Lookup in a virtual directory, or of a view root under the store root.
 * ret gets the virtual inode's attributes (ret->ino is the virtual ino). */
int vtree_lookup(uint64_t parent, const char *name, struct ckpt_inode *ret);
int vtree_getattr(uint64_t vino, struct ckpt_inode *ret);
/* Entry and attribute cache timeouts (seconds) for a virtual inode. */
void vtree_timeouts(uint64_t vino, double *ret_entry, double *ret_attr);
/* Tell the view cache that something in the store changed (a commit, a
 * namespace change): cached views recheck their sources' signature. */
void vtree_changed(void);
/* A file was committed: if it is a safetensors source, parse it in the
 * background so that the first view of its directory opens quickly. */
void vtree_prefetch(uint64_t ino);
int vtree_readlink(uint64_t vino, char **ret_target);
/* Entries of a virtual directory (inode numbers are virtual). */
int vtree_readdir(uint64_t vino, struct ckpt_dirent **ret_ents, size_t *ret_n);

struct vtree_file;
/* Open a virtual file for reading.  -EIO (reason logged) when a view file
 * cannot be served; -EISDIR for directories. */
int vtree_open(uint64_t vino, struct vtree_file **ret);
/* g: optional gather for a zero-copy reply (struct ckpt_gather). */
ssize_t vtree_read(struct vtree_file *f, void *buf, size_t len, uint64_t off,
		   struct ckpt_gather *g);
/* Size of an open file, and the chunks behind [off, off+len) of it (for
 * read-ahead; see ckpt_vfile_chunks()). */
uint64_t vtree_file_size(const struct vtree_file *f);
size_t vtree_chunks(struct vtree_file *f, uint64_t off, uint64_t len, ckpt_digest *out,
		    size_t max);
/* Whether another vtree_file of the same inode is open now. */
bool vtree_file_shared(const struct vtree_file *f);
void vtree_close(struct vtree_file *f);

#endif
