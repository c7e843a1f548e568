/* copy_cuda.h: the CUDA half of the copy engine (copy_cuda.cu), called only by copy_host.c
 * and only in a build with CKPTFS_CUDA.  Every function returns 0 or a negative errno and, on
 * failure, writes the CUDA reason into err (errlen bytes, NUL-terminated).  Safe from any
 * thread: each call selects the device it needs on the calling thread first and puts the
 * thread's current device back before it returns. */
#ifndef CKPTFS_TRAINER_COPY_CUDA_H
#define CKPTFS_TRAINER_COPY_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices (0 when the driver or a device is missing). */
int trc_device_count(void);
/* Synchronous copy; a device argument of -1 means host memory on that side. */
int trc_memcpy(void *dst, int dst_device, const void *src, int src_device, size_t len,
               char *err, size_t errlen);
int trc_host_register(void *addr, size_t len, char *err, size_t errlen);
void trc_host_unregister(void *addr);

/* Dedicated non-blocking streams (TRC_STREAMS per device, made on first use) with one event
 * each, for batches of device-to-host copies.  Owned by one thread at a time. */
#define TRC_STREAMS 2
struct trc_streams;
int trc_streams_new(struct trc_streams **ret_streams);
void trc_streams_free(struct trc_streams *st);
/* Starts a device-to-host copy on the next stream of device (round robin). */
int trc_d2h_async(struct trc_streams *st, void *dst, const void *src, size_t len, int device,
                  char *err, size_t errlen);
/* Records an event on every stream used since the last wait and waits for them all. */
int trc_streams_wait(struct trc_streams *st, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* CKPTFS_TRAINER_COPY_CUDA_H */
