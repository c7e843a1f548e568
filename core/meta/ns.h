/* SPDX-License-Identifier: MIT */
/*
 * ns.h - the namespace over a metadata engine: inodes, directory entries,
 * symlink targets and orphan markers (layouts in meta/records.h), and the
 * reads and writes of records in engine transactions that the store's
 * commit path shares with it.
 *
 * Every namespace operation is one engine transaction that reads what it
 * decides on for update (the parent directory's inode among them: every
 * change of a directory's entries also writes that inode, so concurrent
 * changes of one directory conflict) and is run again on a conflict
 * (ckpt_txn_run).  Atomicity against other writers of a shared engine
 * comes from that; the writer lock given to ckpt_ns_new only serializes
 * this process's writers so that they do not conflict with each other
 * needlessly (the store takes the same lock around its own transactions).
 * Inode numbers come from the "next_ino" meta record, reserved
 * CKPT_NS_INO_BATCH at a time by the create that finds its range used up.
 *
 * Reads without a transaction (lookup, readlink, readdir, path_of, the
 * t == NULL record reads) see committed state and take no lock.
 *
 * Ownership: the namespace borrows the engine and the writer lock; both
 * outlive it.  Returned names, targets and entry arrays are malloc'd and
 * the caller's.  Thread-safety: every call may be made from any thread.
 * Errors: negative errno, the POSIX meaning of each operation (-ENOENT,
 * -EEXIST, -ENOTDIR, -EISDIR, -ENOTEMPTY, -EINVAL, -ENAMETOOLONG, -EPERM,
 * -EROFS on a read-only namespace), -EIO for a damaged record, -EAGAIN
 * only if conflicts persist past CKPT_TXN_TRIES attempts.
 */
#ifndef CKPT_NS_H
#define CKPT_NS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meta/engine.h"
#include "meta/records.h"

#define CKPT_ROOT_INO 1
#define CKPT_NS_INO_BATCH 64

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

/* ckpt_ns_setattr's selection of fields. */
#define CKPT_SET_MODE 0x1u
#define CKPT_SET_UID 0x2u
#define CKPT_SET_GID 0x4u
#define CKPT_SET_ATIME 0x8u
#define CKPT_SET_MTIME 0x10u
#define CKPT_SET_CTIME 0x20u
/* Clear S_ISUID, and S_ISGID if S_IXGRP is set (after the other fields):
 * what the kernel asks for on a write, truncate or chown by a caller
 * without CAP_FSETID. */
#define CKPT_SET_KILL_SUIDGID 0x40u
/* Clear S_ISGID whatever S_IXGRP says (a caller without CAP_FSETID who is
 * not in the file's group writes or truncates it). */
#define CKPT_SET_KILL_SGID 0x80u

/* mode with the bits CKPT_SET_KILL_SUIDGID clears cleared. */
uint32_t ckpt_mode_kill_suidgid(uint32_t mode);

struct ckpt_dirent {
	char *name;
	uint64_t ino;
	uint32_t mode;
};
void ckpt_dirents_free(struct ckpt_dirent *ents, size_t n);

/* ---- records through the engine (t == NULL: committed state; otherwise
 * read in t for update; puts buffer in t, errors at commit) ---- */

int ckpt_meta_get(ckpt_engine *e, ckpt_txn *t, const void *key, size_t klen, uint8_t **ret_val,
		  size_t *ret_len);
int ckpt_meta_get_fixed(ckpt_engine *e, ckpt_txn *t, const void *key, size_t klen, void *buf,
			size_t len);
int ckpt_meta_get_u64(ckpt_engine *e, ckpt_txn *t, const char *name, uint64_t *ret);
void ckpt_meta_put_u64(ckpt_txn *t, const char *name, uint64_t v);
void ckpt_meta_put_bytes(ckpt_txn *t, const char *name, const void *v, size_t len);
int ckpt_meta_get_inode(ckpt_engine *e, ckpt_txn *t, uint64_t ino, struct ckpt_inode *ret);
void ckpt_meta_put_inode(ckpt_txn *t, const struct ckpt_inode *in);
/* A file's extent list (an empty one when it has none); -EIO damaged. */
int ckpt_meta_get_extents(ckpt_engine *e, ckpt_txn *t, uint64_t ino,
			  struct ckpt_extent_list **ret_list);
/* The committed entries of n chunks in one engine request
 * (ckpt_engine_get_many): ret_found[i] says whether d[i] has one, and then
 * ret_locs[i] is its location.  0, or -errno (-EIO: a damaged entry). */
int ckpt_meta_get_chunks(ckpt_engine *e, const ckpt_digest *d, size_t n,
			 struct ckpt_chunk_loc *ret_locs, bool *ret_found);
int ckpt_meta_get_chunk(ckpt_engine *e, ckpt_txn *t, const ckpt_digest *d,
			struct ckpt_chunk_loc *ret_loc, uint64_t *ret_refs);
void ckpt_meta_put_chunk(ckpt_txn *t, const ckpt_digest *d, const struct ckpt_chunk_loc *loc,
			 uint64_t refs);

/* ---- the namespace ---- */

typedef struct ckpt_ns ckpt_ns;

/* writable: false makes every change -EROFS.  name: for messages (the
 * store's path). */
int ckpt_ns_new(ckpt_engine *e, pthread_mutex_t *writer_lock, bool writable, const char *name,
		ckpt_ns **ret);
void ckpt_ns_free(ckpt_ns *ns);
/* The node whose id orphan markers ('O' values) carry from now on (a node
 * of a shared store, docs/cluster.md section 8); NULL or "": none (one
 * node).  Call before any change. */
void ckpt_ns_set_owner(ckpt_ns *ns, const char *node);

/* The inode number parent/name names (committed state). */
int ckpt_ns_lookup(ckpt_ns *ns, uint64_t parent, const char *name, uint64_t *ret_ino);
/* Create a regular file, directory or symlink (target != NULL); mode: the
 * type and the permission bits.  -EINVAL for any other type. */
int ckpt_ns_mknode(ckpt_ns *ns, uint64_t parent, const char *name, uint32_t mode, uint32_t uid,
		   uint32_t gid, const char *symlink_target, struct ckpt_inode *ret);
/* Create a fifo, socket, character or block device (mode's type; rdev: the
 * device number, kept for devices only).  Such inodes hold no content.
 * -EINVAL for any other type. */
int ckpt_ns_mknod(ckpt_ns *ns, uint64_t parent, const char *name, uint32_t mode, uint32_t uid,
		  uint32_t gid, uint64_t rdev, struct ckpt_inode *ret);
int ckpt_ns_link(ckpt_ns *ns, uint64_t ino, uint64_t newparent, const char *newname,
		 struct ckpt_inode *ret);
/* Remove a name; an inode whose nlink drops to 0 becomes an orphan. */
int ckpt_ns_unlink(ckpt_ns *ns, uint64_t parent, const char *name, bool rmdir);
/* flags: 0, RENAME_NOREPLACE or RENAME_EXCHANGE. */
int ckpt_ns_rename(ckpt_ns *ns, uint64_t parent, const char *name, uint64_t newparent,
		   const char *newname, unsigned flags);
int ckpt_ns_setattr(ckpt_ns *ns, uint64_t ino, unsigned what, const struct ckpt_inode *in,
		    struct ckpt_inode *ret);
/* Delete orphan ino's records if it still is one.  release, if the orphan
 * is a regular file, is called in the same transaction with its extent
 * list to release its chunks (it may run more than once: on a conflict
 * the whole transaction is run again).  *ret_gone: the records were
 * deleted. */
typedef int (*ckpt_ns_release_fn)(void *arg, ckpt_txn *t, const struct ckpt_extent_list *old);
int ckpt_ns_reap(ckpt_ns *ns, uint64_t ino, ckpt_ns_release_fn release, void *arg,
		 bool *ret_gone);
int ckpt_ns_readlink(ckpt_ns *ns, uint64_t ino, char **ret_target);
/* All entries of directory ino, in name order (no "." / ".."). */
int ckpt_ns_readdir(ckpt_ns *ns, uint64_t ino, struct ckpt_dirent **ret_ents, size_t *ret_n);
/* Full path of ino (for messages), malloc'd; "?" components if unknown. */
char *ckpt_ns_path_of(ckpt_ns *ns, uint64_t ino);

#endif
