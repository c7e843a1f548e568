/* copy_cuda.cu: the CUDA half of the copy engine (copy_cuda.h): synchronous copies, host
 * registration, and per-device streams with events for snapshot batches.  Built only when
 * configure found nvcc; linked with the static CUDA runtime so libckptfs.so needs no
 * LD_LIBRARY_PATH. */
#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/copy_cuda.h"

static int fail(cudaError_t e, const char *what, char *err, size_t errlen)
{
	if (err && errlen)
		snprintf(err, errlen, "%s: %s (CUDA error %d)", what, cudaGetErrorString(e), (int)e);
	return -EIO;
}

extern "C" int trc_device_count(void)
{
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		cudaGetLastError(); /* clear the sticky "no device" error of this thread */
		return 0;
	}
	return n;
}

/* The calling thread's current device, or -1 (no context yet, or an error, cleared).  Every
 * entry point that selects a device puts the caller's back before it returns: a trainer's
 * thread keeps the device its framework set (torch allocates "cuda" tensors there). */
static int cur_device(void)
{
	int d = -1;

	if (cudaGetDevice(&d) != cudaSuccess) {
		cudaGetLastError();
		return -1;
	}
	return d;
}

static void restore_device(int prev)
{
	if (prev >= 0 && cudaSetDevice(prev) != cudaSuccess)
		cudaGetLastError();
}

static int use_device(int device, char *err, size_t errlen)
{
	cudaError_t e = cudaSetDevice(device);

	if (e != cudaSuccess)
		return fail(e, "cudaSetDevice", err, errlen);
	return 0;
}

extern "C" int trc_memcpy(void *dst, int dst_device, const void *src, int src_device,
                          size_t len, char *err, size_t errlen)
{
	cudaMemcpyKind kind;
	cudaError_t e;
	int r, prev = cur_device();

	if (dst_device >= 0 && src_device >= 0)
		kind = cudaMemcpyDeviceToDevice;
	else if (dst_device >= 0)
		kind = cudaMemcpyHostToDevice;
	else if (src_device >= 0)
		kind = cudaMemcpyDeviceToHost;
	else
		kind = cudaMemcpyHostToHost;
	r = use_device(dst_device >= 0 ? dst_device : src_device, err, errlen);
	if (r < 0)
		goto out;
	e = cudaMemcpy(dst, src, len, kind);
	if (e != cudaSuccess)
		r = fail(e, "cudaMemcpy", err, errlen);
out:
	restore_device(prev);
	return r;
}

extern "C" int trc_host_register(void *addr, size_t len, char *err, size_t errlen)
{
	cudaError_t e = cudaHostRegister(addr, len, cudaHostRegisterPortable);

	if (e != cudaSuccess) {
		cudaGetLastError();
		return fail(e, "cudaHostRegister", err, errlen);
	}
	return 0;
}

extern "C" void trc_host_unregister(void *addr)
{
	if (cudaHostUnregister(addr) != cudaSuccess)
		cudaGetLastError();
}

/* Streams and events of one device, made on its first copy. */
struct trc_dev {
	int made;
	cudaStream_t stream[TRC_STREAMS];
	cudaEvent_t event[TRC_STREAMS];
	int used[TRC_STREAMS];  /* a copy was queued since the last wait */
	int synced;             /* the device was synchronized for the current batch */
	unsigned next;          /* round robin */
};

struct trc_streams {
	int n_devs;
	struct trc_dev *dev;   /* n_devs entries */
};

extern "C" int trc_streams_new(struct trc_streams **ret_streams)
{
	struct trc_streams *st = (struct trc_streams *)calloc(1, sizeof(*st));
	int n = trc_device_count();

	*ret_streams = NULL;
	if (!st)
		return -ENOMEM;
	st->n_devs = n;
	if (n > 0) {
		st->dev = (struct trc_dev *)calloc((size_t)n, sizeof(*st->dev));
		if (!st->dev) {
			free(st);
			return -ENOMEM;
		}
	}
	*ret_streams = st;
	return 0;
}

extern "C" void trc_streams_free(struct trc_streams *st)
{
	int prev;

	if (!st)
		return;
	prev = cur_device();
	for (int d = 0; d < st->n_devs; d++) {
		struct trc_dev *dv = &st->dev[d];

		if (!dv->made)
			continue;
		cudaSetDevice(d);
		for (int i = 0; i < TRC_STREAMS; i++) {
			cudaStreamSynchronize(dv->stream[i]);
			cudaEventDestroy(dv->event[i]);
			cudaStreamDestroy(dv->stream[i]);
		}
	}
	restore_device(prev);
	free(st->dev);
	free(st);
}

static int make_dev(struct trc_dev *dv, char *err, size_t errlen)
{
	cudaError_t e;

	for (int i = 0; i < TRC_STREAMS; i++) {
		e = cudaStreamCreateWithFlags(&dv->stream[i], cudaStreamNonBlocking);
		if (e != cudaSuccess) {
			for (int j = 0; j < i; j++) {
				cudaEventDestroy(dv->event[j]);
				cudaStreamDestroy(dv->stream[j]);
			}
			return fail(e, "cudaStreamCreate", err, errlen);
		}
		e = cudaEventCreateWithFlags(&dv->event[i], cudaEventDisableTiming);
		if (e != cudaSuccess) {
			cudaStreamDestroy(dv->stream[i]);
			for (int j = 0; j < i; j++) {
				cudaEventDestroy(dv->event[j]);
				cudaStreamDestroy(dv->stream[j]);
			}
			return fail(e, "cudaEventCreate", err, errlen);
		}
	}
	dv->made = 1;
	return 0;
}

extern "C" int trc_d2h_async(struct trc_streams *st, void *dst, const void *src, size_t len,
                             int device, char *err, size_t errlen)
{
	struct trc_dev *dv;
	cudaError_t e;
	unsigned i;
	int r, prev;

	if (device < 0 || device >= st->n_devs) {
		if (err && errlen)
			snprintf(err, errlen, "CUDA device %d does not exist (%d usable)", device,
			         st->n_devs);
		return -ENODEV;
	}
	dv = &st->dev[device];
	prev = cur_device();
	r = use_device(device, err, errlen);
	if (r < 0)
		goto out;
	if (!dv->made) {
		r = make_dev(dv, err, errlen);
		if (r < 0)
			goto out;
	}
	/* The copies run on the library's own non-blocking streams, which are not ordered after
	 * the caller's: wait once per batch for the work already queued on the device (kernels
	 * still writing the tensors), whatever stream it is on. */
	if (!dv->synced) {
		e = cudaDeviceSynchronize();
		if (e != cudaSuccess) {
			r = fail(e, "cudaDeviceSynchronize", err, errlen);
			goto out;
		}
		dv->synced = 1;
	}
	i = dv->next++ % TRC_STREAMS;
	e = cudaMemcpyAsync(dst, src, len, cudaMemcpyDeviceToHost, dv->stream[i]);
	if (e != cudaSuccess) {
		r = fail(e, "cudaMemcpyAsync", err, errlen);
		goto out;
	}
	dv->used[i] = 1;
out:
	restore_device(prev);
	return r;
}

extern "C" int trc_streams_wait(struct trc_streams *st, char *err, size_t errlen)
{
	int ret = 0, prev = cur_device();

	/* Record every event first so that all streams keep running, then wait for each. */
	for (int d = 0; d < st->n_devs; d++) {
		struct trc_dev *dv = &st->dev[d];

		if (!dv->made)
			continue;
		cudaSetDevice(d);
		for (int i = 0; i < TRC_STREAMS; i++) {
			cudaError_t e;

			if (!dv->used[i])
				continue;
			e = cudaEventRecord(dv->event[i], dv->stream[i]);
			if (e != cudaSuccess && ret == 0)
				ret = fail(e, "cudaEventRecord", err, errlen);
		}
	}
	for (int d = 0; d < st->n_devs; d++) {
		struct trc_dev *dv = &st->dev[d];

		if (!dv->made)
			continue;
		cudaSetDevice(d);
		dv->synced = 0;
		for (int i = 0; i < TRC_STREAMS; i++) {
			cudaError_t e;

			if (!dv->used[i])
				continue;
			dv->used[i] = 0;
			e = cudaEventSynchronize(dv->event[i]);
			if (e != cudaSuccess && ret == 0)
				ret = fail(e, "cudaEventSynchronize", err, errlen);
		}
	}
	restore_device(prev);
	return ret;
}
