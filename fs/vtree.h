/* SPDX-License-Identifier: MIT */
/*
 * vtree.h - the view trees: read-only /tpT_ppP/ mirrors of the store tree.
 *
 * MOUNT/tpT_ppP/PATH mirrors MOUNT/PATH read-only: directories and
 * non-safetensors files pass through, the safetensors sources of each
 * directory are replaced by the files of its resharded view (views/view.h).
 * Virtual inodes are numbered from VTREE_INO_BASE upwards (store inode
 * numbers stay far below) and live until vtree_free().  Views are cached per
 * (layout, directory), the view_cache most recently used ones, and rebuilt
 * when the directory's sources change or after they were dropped.  A view
 * holds memory in proportion to its checkpoint's tensor count (more for
 * layouts that split more tensors), so an evaluator walking checkpoint after
 * checkpoint would grow the daemon without bound if every view stayed
 * cached; view_cache bounds that.
 *
 * The trees are served through the tree ops (tree.h): vtree_tree().  Every
 * change is refused (-EROFS; -EEXIST for making a view root's name).  A
 * background thread parses committed safetensors sources (vtree_prefetch).
 * Thread-safe: one lock guards the vnode tables and the view cache.
 * Nothing here depends on FUSE.
 */
#ifndef CKPTFS_VTREE_H
#define CKPTFS_VTREE_H

#include <stdbool.h>
#include <stdint.h>

#include "store/store.h"
#include "tree.h"
#include "views/shardmeta.h"

#define VTREE_INO_BASE (1ull << 60)

/* Whether ino is an inode of the view trees. */
static inline bool vtree_is_virtual(uint64_t ino)
{
	return ino >= VTREE_INO_BASE;
}

/* Is name in parent a view root ("tpT_ppP" directly under the store root)? */
bool vtree_is_view_name(uint64_t parent, const char *name);

/* The read bits (of 0444) of a view file owned by vu:vg that source s
 * allows: a class of users gets one only if each of its users could read s
 * (vtree.c has the rule).  A view file's mode is the AND over its
 * directory's safetensors files. */
uint32_t vtree_view_read_bits(uint32_t vu, uint32_t vg, const struct ckpt_inode *s);

struct vtree;

/* view_cache: how many views to keep (0 counts as 1).  s and rules must
 * outlive the tree. */
#define VTREE_VIEW_CACHE_DEFAULT 8
int vtree_new(ckpt_store *s, const ckpt_tp_rules *rules, unsigned view_cache,
	      struct vtree **ret);
/* Files must be released.  Accepts NULL. */
void vtree_free(struct vtree *vt);
struct tree *vtree_tree(struct vtree *vt);

struct vtree_stats {
	uint64_t views;     /* cached now */
	uint64_t builds;    /* views built since vtree_new() */
	uint64_t evictions; /* dropped for newer ones */
};
void vtree_get_stats(struct vtree *vt, struct vtree_stats *ret);

/* Something in the store changed (a commit, a namespace or attribute
 * change): cached views recheck their sources' signature, and view files
 * their sources' modes, at their next use. */
void vtree_changed(struct vtree *vt);
/* A file was committed: if it is a safetensors source, parse it in the
 * background so that the first view of its directory opens quickly. */
void vtree_prefetch(struct vtree *vt, uint64_t ino);

#endif
