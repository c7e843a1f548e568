/* SPDX-License-Identifier: MIT */
/*
 * ctltree.h - the control tree: MOUNT/.ckptfs/, the daemon's read-only
 * virtual files (docs/user-guide.md, "Logs and metrics").
 *
 *   .ckptfs/          a directory, 0555, owned by the store root's owner;
 *                     found by name but not listed by the root's readdir
 *   .ckptfs/metrics   0444: the process's metrics in the Prometheus text
 *                     format 0.0.4 (base/metrics.h), rendered once per open;
 *                     stat shows size 0 (as /proc files do) and reads are
 *                     direct_io, so a reader gets the whole text to EOF
 *
 * Its inode numbers are CTL_INO_BASE.. (above the view trees'; store inode
 * numbers stay far below).  The name ".ckptfs" in the store's root is the
 * tree's: an entry of that name in the store (made before the control
 * tree existed) is shadowed while mounted, and the daemon warns about it
 * at mount.  Every change is refused
 * (-EROFS; -EEXIST for making .ckptfs or metrics).  Thread-safe (no mutable
 * state but each open file's own text).  Nothing here depends on FUSE.
 */
#ifndef CKPTFS_CTLTREE_H
#define CKPTFS_CTLTREE_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "meta/ns.h"
#include "store/store.h"
#include "tree.h"

#define CTL_DIR_NAME ".ckptfs"
#define CTL_INO_BASE (1ull << 62)
#define CTL_INO_DIR CTL_INO_BASE
#define CTL_INO_METRICS (CTL_INO_BASE + 1)

static inline bool ctl_is_ino(uint64_t ino)
{
	return ino >= CTL_INO_BASE && ino < CTL_INO_BASE + 16;
}

/* Is name in parent the control tree's (the directory, or inside it)? */
static inline bool ctl_is_name(uint64_t parent, const char *name)
{
	return ctl_is_ino(parent) || (parent == CKPT_ROOT_INO && !strcmp(name, CTL_DIR_NAME));
}

/* s (the owner of the store root is the files' owner) outlives the tree.
 * 0 and *ret (ctltree_free), or -ENOMEM. */
int ctltree_new(ckpt_store *s, struct tree **ret);
void ctltree_free(struct tree *t);

#endif
