/* copy.h: the copy engine of libckptfs (internal to the library).
 *
 * Moves bytes between host memory and CUDA device memory for the saver's snapshot and the
 * loader's device destinations.  The library is built with or without CUDA (CKPTFS_CUDA);
 * without it, or without a usable GPU at run time, every host-to-host copy works and every
 * copy that involves a device pointer fails with -ENODEV.
 *
 * Errors: 0 on success or a negative errno: -ENODEV (no CUDA build, no usable GPU or a device
 * ordinal out of range), -EINVAL (bad arguments), -EIO (a CUDA call failed).  The reason of
 * the calling thread's last failure is kept in thread-local storage (tr_copy_error()); callers
 * prefix it with the tensor or file they were copying.
 *
 * Threads: every function is safe to call from any thread.  A tr_copier is used by one thread
 * at a time (its owner); different copiers are independent.
 */
#ifndef CKPTFS_TRAINER_COPY_H
#define CKPTFS_TRAINER_COPY_H

#include <stddef.h>

/* Copies len bytes from src to host memory dst and returns when they are there.  device -1:
 * src is host memory (memcpy); >= 0: src is a pointer on that CUDA device (a synchronous
 * device-to-host copy, fastest when dst is pinned). */
int tr_copy_to_host(void *dst, const void *src, size_t len, int device);

/* Copies len bytes from host memory src to dst and returns when they are there.  device -1:
 * dst is host memory (memcpy); >= 0: dst is a pointer on that CUDA device (host-to-device). */
int tr_copy_to_device(void *dst, int device, const void *src, size_t len);

/* 1 when the library was built with CUDA and at least one GPU is usable now (the answer is
 * computed once per process), else 0. */
int tr_cuda_usable(void);

/* The reason of the calling thread's last failed copy ("" if none); valid until its next
 * call into the copy engine. */
const char *tr_copy_error(void);

/* Page-locks (pins) [addr, addr + len) for fast device-to-host copies.  A no-op returning 0
 * without CUDA or without a GPU.  The range must later be released with tr_host_unregister()
 * before it is unmapped. */
int tr_host_register(void *addr, size_t len);
void tr_host_unregister(void *addr);

/* A batch of copies into host memory issued together and awaited together: host sources are
 * copied by up to `threads` threads (large copies split into pieces), device sources on the
 * copier's own CUDA streams (several per device, round robin) with an event per stream.
 * tr_copier_wait() returns when every copy queued since the last wait has landed. */
struct tr_copier;
int tr_copier_new(int threads, struct tr_copier **ret_copier);
/* Waits for nothing; frees the streams, events and threads.  Accepts NULL. */
void tr_copier_free(struct tr_copier *c);
/* Queues one copy of len bytes from src (host if device is -1, else that device) to host dst.
 * Device copies start at once (asynchronously); host copies run at tr_copier_wait().  Fails
 * with -ENODEV for a device without CUDA. */
int tr_copier_add(struct tr_copier *c, void *dst, const void *src, size_t len, int device);
/* Runs the queued host copies and waits for every queued device copy.  Returns 0 or the first
 * error; *ret_failed (may be NULL) is set to the index (in add order since the last wait) of
 * the copy that failed, or -1. */
int tr_copier_wait(struct tr_copier *c, long *ret_failed);

#endif /* CKPTFS_TRAINER_COPY_H */
