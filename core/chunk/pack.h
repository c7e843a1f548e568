/* SPDX-License-Identifier: MIT */
/*
 * pack.h - append-only pack files holding chunk records.
 *
 * A pack file lives in the store's pack directory under the name
 * "pack-%016" PRIx64 ".ckpk" of its 64-bit id.  It starts with a 64-byte
 * file header followed by records.  The pack layer treats the chunk digest
 * and the codec as opaque bytes; the store's metadata (not this module)
 * maps digest -> (location, stored_len, raw_len, codec).
 *
 * On-disk format, version 1.  All integers are little-endian.  Checksums
 * are XXH3-64 with seed 0 (unkeyed), the function ckpt_checksum() uses.
 *
 * File header, 64 bytes, at offset 0:
 *   off len field
 *     0   8  magic "CKPTPACK"
 *     8   4  format version = 1 (CKPT_PACK_VERSION)
 *    12   4  header size = 64 (CKPT_PACK_HDR_SIZE)
 *    16   8  pack id (must match the id in the file name)
 *    24  16  store uuid
 *    40   8  creation time (unix seconds)
 *    48   8  XXH3-64 of header bytes 0..47
 *    56   8  zero (reserved; a version 1 reader rejects non-zero)
 * Bytes 0..15 (magic, version, header size) keep their meaning in every
 * future version, so a reader can always tell "newer format" apart from
 * "not a pack".
 *
 * Record, at any 8-byte-aligned offset >= 64: a 48-byte record header, then
 * stored_len stored bytes, then 0..7 zero bytes of padding so that the next
 * record starts 8-byte aligned (total: ckpt_pack_rec_span(stored_len)):
 *   off len field
 *     0   4  magic "CKRC"
 *     4   1  codec (opaque to the pack layer)
 *     5   1  flags = 0 (non-zero makes the header invalid)
 *     6   2  record header size = 48 (CKPT_PACK_REC_HDR_SIZE)
 *     8   4  stored_len (<= CKPT_PACK_MAX_STORED)
 *    12   4  raw_len (opaque to the pack layer)
 *    16  16  chunk digest
 *    32   8  XXH3-64 of the stored bytes
 *    40   8  XXH3-64 of record header bytes 0..39
 * The padding is not covered by any checksum.
 *
 * Space between records that holds no valid record header is a "hole":
 * the remains of an append that failed (e.g. ENOSPC) or of a torn write at
 * the end of the file after a crash.  Holes are never referenced by the
 * index; ckpt_pack_scan() steps over them by searching forward, 8 bytes at
 * a time, for the next valid record header.  A hole that happens to contain
 * a byte-exact copy of a valid record header (e.g. a pack file stored as
 * chunk data with codec "none") can make the scan report a record that the
 * index does not reference; callers of scan must treat unreferenced records
 * as garbage, never as data.
 *
 * Durability protocol for callers: append, then ckpt_pack_sync() covering
 * the record, and only then commit the index entry that points at it.
 *
 * Errors: every function returning int returns 0 on success or a negative
 * errno.  Corrupt or foreign on-disk data is always -EIO.
 */
#ifndef CKPT_PACK_H
#define CKPT_PACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define CKPT_PACK_VERSION 1
#define CKPT_PACK_HDR_SIZE 64
#define CKPT_PACK_REC_HDR_SIZE 48
#define CKPT_PACK_MAGIC "CKPTPACK"	/* 8 bytes, no NUL on disk */
#define CKPT_PACK_MAGIC_LEN 8
#define CKPT_PACK_REC_MAGIC "CKRC"	/* 4 bytes, no NUL on disk */
#define CKPT_PACK_REC_MAGIC_LEN 4
#define CKPT_PACK_ALIGN 8		/* record offsets and spans */
#define CKPT_PACK_MAX_STORED (64u * 1024 * 1024)
#define CKPT_PACK_NAME_MAX 32		/* buffer size for ckpt_pack_name() */
#define CKPT_PACK_FILE_MODE 0600	/* mode of newly created pack files */
#define CKPT_PACK_KICK (8u * 1024 * 1024) /* write-behind step, see pack.c */

/* A record as seen by callers: everything but the checksums. */
struct ckpt_pack_rec {
	uint8_t codec;
	uint32_t stored_len, raw_len;
	uint8_t digest[16];
};

typedef struct ckpt_pack ckpt_pack;	/* opaque */

/*
 * Thread-safety summary: ckpt_pack_append(), ckpt_pack_sync(),
 * ckpt_pack_read(), ckpt_pack_scan(), ckpt_pack_id() and ckpt_pack_size()
 * may be called concurrently on the same pack from any number of threads.
 * ckpt_pack_free() must not race with any other call on the same pack.
 * The module has no global mutable state.
 */

/*
 * Create pack `id` in the directory `dirfd` (any directory fd, O_PATH
 * allowed): open the file with O_CREAT|O_EXCL|O_CLOEXEC and mode
 * CKPT_PACK_FILE_MODE (& ~umask), write the header (creation time = now),
 * fsync the file and then the directory.  On any failure after the file was
 * created, the file is unlinked again.
 * On success *ret_pack owns a writable pack (free with ckpt_pack_free());
 * on failure *ret_pack is left untouched.
 * Errors: -EINVAL (NULL argument), -EEXIST (pack already exists), -ENOMEM,
 * or the errno of openat/pwrite/fsync (e.g. -ENOSPC, -EIO).
 */
int ckpt_pack_create(int dirfd, uint64_t id, const uint8_t uuid[16], ckpt_pack **ret_pack);

/*
 * Open the existing pack `id` in `dirfd`, read-only or read-write.
 * Header checks, in order: magic (else -EIO); version: 0 -> -EIO, greater
 * than CKPT_PACK_VERSION -> -EPROTONOSUPPORT (checked before the checksum,
 * because a newer format may place its checksum elsewhere; a bit flip in the
 * version field can therefore also surface as -EPROTONOSUPPORT); header size
 * != 64, checksum, reserved bytes, pack id or uuid mismatch -> -EIO.  A file
 * shorter than 64 bytes or not a regular file -> -EIO.
 * writable: appends go after the last byte of the file, rounded up to 8
 * (ckpt_pack_size()).  A torn record at the tail (left by a crash) stays in
 * place as garbage, but if its header survived intact while its data did
 * not, open zeroes that record header and fdatasyncs, so that the stale
 * header cannot claim bytes of later appends.  To find such headers a
 * writable open walks all record headers (one 48-byte pread per record; a
 * forward search through holes).  A read-only open reads only the file
 * header.  There is no cross-process locking: at most one ckpt_pack may have
 * a given pack open writable at a time (the caller enforces this); the size
 * of a read-only pack is fixed at open time.
 * On success *ret_pack owns the pack; on failure it is left untouched.
 * Errors: the above, -EINVAL (NULL argument), -ENOENT, -ENOMEM, other
 * errnos of openat/pread/pwrite/fdatasync.
 */
int ckpt_pack_open(int dirfd, uint64_t id, const uint8_t uuid[16], bool writable,
		   ckpt_pack **ret_pack);

/* Close the pack's fd and free it.  Does not sync.  Accepts NULL. */
void ckpt_pack_free(ckpt_pack *p);

/* The pack id (0 for NULL). */
uint64_t ckpt_pack_id(const ckpt_pack *p);

/* End of the reserved space: the offset the next append will get.  Always a
 * multiple of 8 and >= CKPT_PACK_HDR_SIZE.  0 for NULL. */
uint64_t ckpt_pack_size(const ckpt_pack *p);

/*
 * Append one record: header built from *rec, data = stored[0..rec->stored_len)
 * (stored may be NULL when stored_len is 0).  The record's offset is reserved
 * under a mutex and the data is written with one pwritev outside it, so
 * several threads append in parallel.  The data is not durable until
 * ckpt_pack_sync() covers it.
 * On success *ret_offset (if ret_offset is not NULL) is the record offset.
 * On a write failure (e.g. -ENOSPC, -EFBIG) the reserved range is left as a
 * hole (its record header is zeroed on a best-effort basis) that no index
 * entry may reference; later appends still work and go after it.
 * Errors: -EINVAL (NULL p/rec, stored NULL with stored_len > 0, stored_len >
 * CKPT_PACK_MAX_STORED), -EBADF (pack opened read-only), -EFBIG (the pack
 * would exceed the maximum file offset), the error latched by a failed
 * ckpt_pack_sync(), or the errno of pwritev.
 */
int ckpt_pack_append(ckpt_pack *p, const struct ckpt_pack_rec *rec, const void *stored,
		     uint64_t *ret_offset);

/*
 * ckpt_pack_append() of the stored bytes given as nstored (1..
 * CKPT_PACK_MAX_IOV) pieces whose lengths add up to rec->stored_len; the
 * record is the same as for their concatenation.  -EINVAL also when the
 * lengths do not add up.
 */
#define CKPT_PACK_MAX_IOV 4
int ckpt_pack_appendv(ckpt_pack *p, const struct ckpt_pack_rec *rec, const struct iovec *stored,
		      int nstored, uint64_t *ret_offset);

/*
 * Make durable (fdatasync) every record that ends at or before `upto` and
 * whose ckpt_pack_append() returned before this call.  upto is clamped to
 * ckpt_pack_size() at the time of the call, so UINT64_MAX means "everything
 * appended so far".  The fdatasync is skipped when an earlier sync already
 * covered upto; concurrent callers are serialised so that one fdatasync can
 * serve several of them (group commit).  A sync covers the prefix of the
 * file up to the oldest append still in flight when it started.
 * If fdatasync fails, its error is latched: this and every later
 * ckpt_pack_sync() and ckpt_pack_append() on this pack return it (the kernel
 * may already have dropped the unwritten pages, so a later successful
 * fdatasync would prove nothing).  The caller must retire the pack.
 * Thread-safe.  Returns 0 or -errno (-EINVAL for NULL p).
 */
int ckpt_pack_sync(ckpt_pack *p, uint64_t upto);

/*
 * Read the record at `offset` into buf, which must hold expected_stored_len
 * bytes (buf may be NULL when expected_stored_len is 0).  One preadv reads
 * header and data.  Verifies the record magic, flags, header size and header
 * checksum, that the stored_len in the header equals expected_stored_len
 * (pass it from the index), and the checksum of the stored bytes.
 * On success fills *ret_rec if ret_rec is not NULL.  On failure the contents
 * of buf and *ret_rec are unspecified.  Thread-safe (pread only).
 * Errors: -EINVAL (NULL p, buf NULL with expected_stored_len > 0,
 * expected_stored_len > CKPT_PACK_MAX_STORED, offset < 64 or not a multiple
 * of 8), -EIO (any mismatch, or the file ends inside the record), or the
 * errno of preadv.
 */
int ckpt_pack_read(ckpt_pack *p, uint64_t offset, uint32_t expected_stored_len,
		   struct ckpt_pack_rec *ret_rec, void *buf);
/* The same without the checksum of the stored bytes (the header is still
 * fully checked): for callers that verify what the bytes decode to against
 * the chunk's keyed digest, which catches every damage the checksum would. */
int ckpt_pack_read_trusting(ckpt_pack *p, uint64_t offset, uint32_t expected_stored_len,
			    struct ckpt_pack_rec *ret_rec, void *buf);

/*
 * ckpt_pack_read_trusting through an O_DIRECT descriptor of the pack (opened
 * on first use): the record is read from the disk into the caller's buf,
 * without the copy out of the page cache and without filling the page cache
 * with packs that the chunk cache and the mount's page cache hold decoded
 * anyway.  buf is aligned to CKPT_PACK_DIRECT_ALIGN and holds cap bytes, at
 * least ckpt_pack_direct_len(offset, expected_stored_len); the callers keep
 * one such buffer per thread (a fresh buffer per record costs a page fault
 * per 4 KiB).  *ret_stored points at the stored bytes inside buf.
 * check_data: also verify the checksum of the stored bytes (as
 * ckpt_pack_read does).  Also for a pack being appended to: the kernel
 * writes back the range's dirty pages before an O_DIRECT read, so a record
 * whose append returned reads back exactly.  -EINVAL also when cap is too
 * small; -EOPNOTSUPP when the pack's file system refuses O_DIRECT (use
 * ckpt_pack_read then).  Other errors as ckpt_pack_read.
 */
#define CKPT_PACK_DIRECT_ALIGN 4096u
int ckpt_pack_read_direct(ckpt_pack *p, uint64_t offset, uint32_t expected_stored_len,
			  bool check_data, uint8_t *buf, size_t cap, struct ckpt_pack_rec *ret_rec,
			  const uint8_t **ret_stored);

/* The buffer bytes ckpt_pack_read_direct needs for a record of stored_len
 * stored bytes at pack offset `offset`: the aligned blocks it lies in. */
static inline size_t ckpt_pack_direct_len(uint64_t offset, uint32_t stored_len)
{
	const uint64_t blk = CKPT_PACK_DIRECT_ALIGN;

	return (size_t)((offset % blk + CKPT_PACK_REC_HDR_SIZE + (uint64_t)stored_len + blk - 1) /
			blk * blk);
}

/*
 * The O_DIRECT read under ckpt_pack_read_direct, for callers that read
 * several records at once (read-ahead): reads from offset rounded down to
 * CKPT_PACK_DIRECT_ALIGN into buf (aligned to it; cap bytes, a multiple of
 * it) until buf is full or the file ends; at least the need bytes from
 * offset must come back.  *ret_start is the pack offset of buf[0] and
 * *ret_len how many bytes were read.  Errors: -EINVAL (bad arguments,
 * offset % 4096 + need > cap), -EOPNOTSUPP (no O_DIRECT here), -EIO (the
 * file ends before offset + need; logged), or pread's errno.
 */
int ckpt_pack_read_window(ckpt_pack *p, uint64_t offset, uint64_t need, uint8_t *buf, size_t cap,
			  uint64_t *ret_start, size_t *ret_len);
/*
 * The pack's O_DIRECT descriptor (opened on first use), for callers that
 * submit their own asynchronous reads of it (read-ahead, kernel AIO): reads
 * at offsets and lengths that are multiples of CKPT_PACK_DIRECT_ALIGN into
 * buffers aligned to it.  It is closed with the pack: submit while the pack
 * cannot be freed (the store's pack lock); a submitted read holds its own
 * reference to the file.  Check what comes back with ckpt_pack_rec_at.
 * -EOPNOTSUPP when the pack's file system refuses O_DIRECT, -EINVAL for NULL.
 */
int ckpt_pack_direct_fd(ckpt_pack *p);
/*
 * Check the record at pack offset `offset` whose bytes start at `at` (its
 * header, then expected_stored_len stored bytes) as the pack's readers do:
 * header, stored length, and with check_data the stored bytes' checksum.
 * 0 with *ret_stored (and *ret_rec unless NULL) set; -EIO, logged, on a
 * mismatch.
 */
int ckpt_pack_rec_at(ckpt_pack *p, uint64_t offset, const uint8_t *at,
		     uint32_t expected_stored_len, bool check_data, struct ckpt_pack_rec *ret_rec,
		     const uint8_t **ret_stored);

/* Total on-disk size of a record with this stored length:
 * 48 + stored_len rounded up to a multiple of 8. */
uint64_t ckpt_pack_rec_span(uint32_t stored_len);

/*
 * Walk the records from offset 64 up to the file size at the time of the
 * call.  For each record whose header is valid (magic, checksum, flags 0,
 * header size 48, stored_len <= max) and whose data lies entirely within the
 * file, calls cb(ud, offset, rec) and jumps to offset + span.  The data is
 * not read, so a reported record may still fail ckpt_pack_read() (e.g. a
 * partly written-back record after a crash): fsck must read it.  At an
 * invalid header (hole, torn tail) or a valid header whose data extends past
 * the end of the file, it searches forward 8 bytes at a time (reading 64 KiB
 * windows) for the next valid record header and continues there.
 * Safe to run concurrently with appends (records still being written are
 * skipped like holes).
 * Returns 0 when the end of the file is reached, the first non-zero value
 * returned by cb (the walk stops there), -EINVAL (NULL p or cb), -ENOMEM, or
 * the errno of pread/fstat.
 */
int ckpt_pack_scan(ckpt_pack *p, int (*cb)(void *ud, uint64_t offset,
					   const struct ckpt_pack_rec *rec),
		   void *ud);

/*
 * Write the file name of pack `id` ("pack-%016" PRIx64 ".ckpk", 26 chars)
 * into buf of len bytes (CKPT_PACK_NAME_MAX is enough), NUL-terminated.
 * Errors: -EINVAL (buf NULL), -ENAMETOOLONG (len too small; buf is then
 * left as an empty string if len > 0).
 */
int ckpt_pack_name(uint64_t id, char *buf, size_t len);

#endif
