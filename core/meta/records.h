/* SPDX-License-Identifier: MIT */
/*
 * records.h - the layout of every metadata record: key builders and the
 * encoders/decoders of the values, separate from the key-value engine that
 * stores them (meta/engine.h).  docs/format.md describes each layout byte by
 * byte; these codecs must stay byte-compatible with existing stores.
 *
 * Key space (the first byte is the record type; integers in keys are
 * big-endian so that they sort numerically):
 *   'M' name              -> meta value (format, uuid, secret, counters,
 *                            hash algorithm id)
 *   'C' digest[16]        -> chunk entry   (struct ckpt_chunk_loc + refcount)
 *   'I' ino(be64)         -> inode record  (struct ckpt_inode)
 *   'D' parent(be64) name -> dentry        (child ino + type bits)
 *   'F' ino(be64)         -> chunk list of a regular file
 *   'L' ino(be64)         -> symlink target (raw bytes)
 *   'O' ino(be64)         -> empty: inode is an orphan (nlink == 0), reaped
 *                            when the last user lets go or at the next mount
 *   'P' ino(be64)         -> parsed safetensors header of a view source (a
 *                            cache, see view.c; ignored when stale)
 * and only on a shared engine (several nodes, docs/cluster.md section 7):
 *   'S' node name         -> the node's session (struct ckpt_session)
 *   'Z' digest[16]        -> the chunk's refcount fell to 0; the gc epoch
 *                            that first saw it (0: not seen yet)
 *   'U' unit(be64)        -> the unit (pack) is appended to by a session
 * Every 'C', 'I', 'D' and 'F' value starts with a one-byte record version
 * (CKPT_REC_VERSION; an inode record of a device node is version
 * CKPT_INODE_REC_VERSION_RDEV); 'M' values are raw (their layout is fixed by
 * name), 'L' is the raw target, 'O' is empty.
 *
 * Errors: decoders return -EIO on a value of the wrong length or version
 * (a damaged record), -ENOMEM when out of memory.  Thread-safety: all
 * functions are pure or work on caller-owned objects; an extent list is not
 * safe for concurrent modification.
 */
#ifndef CKPT_RECORDS_H
#define CKPT_RECORDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/hash.h"
#include "chunk/backend.h"

#define CKPT_REC_VERSION 1

#define CKPT_KEY_META 'M'
#define CKPT_KEY_CHUNK 'C'
#define CKPT_KEY_INODE 'I'
#define CKPT_KEY_DENTRY 'D'
#define CKPT_KEY_FILE 'F'
#define CKPT_KEY_LINK 'L'
#define CKPT_KEY_ORPHAN 'O'
#define CKPT_KEY_PARSED 'P'
#define CKPT_KEY_SESSION 'S'
#define CKPT_KEY_ZERO 'Z'
#define CKPT_KEY_UNIT 'U'

#define CKPT_NAME_MAX 255
#define CKPT_KEY_MAX (1 + 8 + CKPT_NAME_MAX)


/* Key builders; return the key length. */
size_t ckpt_key_ino(uint8_t *key, char type, uint64_t ino);
size_t ckpt_key_dentry(uint8_t *key, uint64_t parent, const char *name, size_t namelen);
size_t ckpt_key_chunk(uint8_t *key, const ckpt_digest *d);
size_t ckpt_key_meta(uint8_t *key, const char *name);
/* The parent and name of dentry key[0..klen): *ret_name points into key (not
 * NUL-terminated), *ret_namelen bytes.  -EIO (a damaged key) unless it is 'D',
 * 8 bytes and a name of 1..CKPT_NAME_MAX bytes without '/' or NUL that is
 * neither "." nor "..": the names the namespace creates. */
int ckpt_key_dentry_decode(const uint8_t *key, size_t klen, uint64_t *ret_parent,
			   const char **ret_name, size_t *ret_namelen);

/* Inode records are 80 bytes in both versions.  Version 1 has bytes 72..79
 * reserved; version 2 holds the device number of a character or block
 * device there.  The encoder writes version 2 only for a non-zero rdev, so
 * stores without device nodes stay readable by version-1 readers, which
 * report a device node's record as damaged rather than misread it. */
#define CKPT_INODE_REC_LEN 80
#define CKPT_INODE_REC_VERSION_RDEV 2
#define CKPT_INODE_F_SAFETENSORS 0x1u /* content parsed as a valid safetensors file */
struct ckpt_inode {
	uint64_t ino;
	uint32_t mode, uid, gid, nlink;
	uint64_t size;
	int64_t atime_ns, mtime_ns, ctime_ns;
	uint64_t parent; /* directories: parent directory; others: 0 */
	uint32_t flags;  /* CKPT_INODE_F_* */
	uint64_t generation;
	uint64_t rdev;   /* character and block devices: the device number
			  * (makedev(major, minor)); 0 for every other type */
};
void ckpt_inode_encode(const struct ckpt_inode *in, uint8_t out[CKPT_INODE_REC_LEN]);
int ckpt_inode_decode(uint64_t ino, const uint8_t *buf, size_t len, struct ckpt_inode *ret);

#define CKPT_DENTRY_REC_LEN 16
void ckpt_dentry_encode(uint64_t ino, uint32_t mode, uint8_t out[CKPT_DENTRY_REC_LEN]);
int ckpt_dentry_decode(const uint8_t *buf, size_t len, uint64_t *ret_ino, uint32_t *ret_mode);

#define CKPT_CHUNK_REC_LEN 40
/* struct ckpt_chunk_loc is the chunk backend's (chunk/backend.h); its
 * where bytes are stored as they are, opaque to the index. */
void ckpt_chunk_rec_encode(const struct ckpt_chunk_loc *loc, uint64_t refcount,
			   uint8_t out[CKPT_CHUNK_REC_LEN]);
int ckpt_chunk_rec_decode(const uint8_t *buf, size_t len, struct ckpt_chunk_loc *ret_loc,
			  uint64_t *ret_refcount);

/* Shared engines only (docs/format.md section 11.1).  A node's session:
 * who it is, when it last proved alive, and the oldest gc epoch whose
 * garbage it may still reference.  Node names are 1..CKPT_NODE_MAX bytes
 * of [A-Za-z0-9._:-] (ckpt_node_name_ok). */
#define CKPT_NODE_MAX 64
#define CKPT_HOST_MAX 64
struct ckpt_session {
	uint64_t id;           /* random, new at every registration */
	int64_t heartbeat_ns;  /* wall clock (CLOCK_REALTIME) of the node */
	uint64_t pin;          /* gc epoch: garbage of epochs >= pin stays */
	uint32_t timeout_ms;   /* dead once heartbeat_ns is this much old */
	uint32_t pid;
	char host[CKPT_HOST_MAX + 1];
	int64_t suspect_ns;    /* gc's wall clock when it first found the
				* heartbeat too old (0: not suspected); a
				* heartbeat clears it */
};
#define CKPT_SESSION_REC_MAX (42 + CKPT_HOST_MAX)
bool ckpt_node_name_ok(const char *name);
size_t ckpt_key_session(uint8_t *key, const char *node);
/* Returns the value's length. */
size_t ckpt_session_encode(const struct ckpt_session *ss, uint8_t out[CKPT_SESSION_REC_MAX]);
int ckpt_session_decode(const uint8_t *buf, size_t len, struct ckpt_session *ret);
/* 'Z' (a chunk at refcount 0) and 'U' (a unit's appending session). */
#define CKPT_ZERO_REC_LEN 9
#define CKPT_UNIT_REC_LEN 9
size_t ckpt_key_zero(uint8_t *key, const ckpt_digest *d);
void ckpt_zero_encode(uint64_t epoch, uint8_t out[CKPT_ZERO_REC_LEN]);
int ckpt_zero_decode(const uint8_t *buf, size_t len, uint64_t *ret_epoch);
size_t ckpt_key_unit(uint8_t *key, uint64_t unit);
void ckpt_unit_encode(uint64_t session, uint8_t out[CKPT_UNIT_REC_LEN]);
int ckpt_unit_decode(const uint8_t *buf, size_t len, uint64_t *ret_session);

/* A file's content: consecutive extents covering [0, size). */
#define CKPT_EXT_CHUNK 0 /* bytes of the chunk named by digest */
#define CKPT_EXT_ZERO 1  /* a run of zeros (sparse region or all-zero chunk) */
#define CKPT_FILE_HDR_LEN 16
#define CKPT_FILE_ENT_LEN 24
/* A CKPT_EXT_CHUNK extent covers the first len bytes of its chunk (len may
 * be shorter than the chunk after a truncate). */
struct ckpt_extent {
	uint64_t off; /* derived on decode: sum of previous lengths */
	uint32_t len;
	uint8_t kind; /* CKPT_EXT_* */
	ckpt_digest digest; /* zero for CKPT_EXT_ZERO */
};
struct ckpt_extent_list {
	size_t n, cap;
	struct ckpt_extent *v;
	uint64_t size; /* = v[n-1].off + v[n-1].len, or 0 */
};
struct ckpt_extent_list *ckpt_extent_list_new(void);
void ckpt_extent_list_free(struct ckpt_extent_list *l);
int ckpt_extent_list_append(struct ckpt_extent_list *l, uint32_t len, uint8_t kind,
			    const ckpt_digest *d);
/* Drop everything at or after off (an extent crossing off is shortened). */
void ckpt_extent_list_truncate(struct ckpt_extent_list *l, uint64_t off);
struct ckpt_extent_list *ckpt_extent_list_dup(const struct ckpt_extent_list *l);
/* Index of the extent containing off, or l->n if off >= size. */
size_t ckpt_extent_list_find(const struct ckpt_extent_list *l, uint64_t off);
int ckpt_extent_list_encode(const struct ckpt_extent_list *l, uint8_t **ret_buf, size_t *ret_len);
int ckpt_extent_list_decode(const uint8_t *buf, size_t len, struct ckpt_extent_list **ret);

#endif
