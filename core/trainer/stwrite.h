/* stwrite.h: writing one file durably and publishing it by rename (internal).
 *
 * tr_write_file() writes len bytes from buf to TMP inside the directory dirfd in chunks of
 * write_bytes at offsets that are multiples of write_bytes, fsyncs it and renames it to NAME
 * (replacing a stale file of that name).  The directory itself is fsynced by the caller once
 * after all its renames (tr_fsync_dir).  Errors name the file ("DIR/NAME: write: reason").
 * Thread-safe: each call uses only its own descriptor.
 */
#ifndef CKPTFS_TRAINER_STWRITE_H
#define CKPTFS_TRAINER_STWRITE_H

#include <stddef.h>
#include <stdint.h>

int tr_write_file(int dirfd, const char *dirpath, const char *name, const char *tmp,
		  const void *buf, uint64_t len, size_t write_bytes, char *err, size_t errlen);
/* fsync of a directory; file systems that cannot sync directories (EINVAL, ENOTSUP, ENOSYS)
 * count as synced, since their renames are then as durable as they can be made. */
int tr_fsync_dir(int dirfd, const char *dirpath, char *err, size_t errlen);
/* Reads a whole small file (at most max bytes) into a NUL-terminated malloc'd buffer. */
int tr_read_small(int dirfd, const char *name, size_t max, char **ret_buf, size_t *ret_len);

#endif /* CKPTFS_TRAINER_STWRITE_H */
