/* copy_host.c: the copy engine (copy.h): host copies, the batched snapshot copier with its
 * host copy threads, and the dispatch to the CUDA half (copy_cuda.cu) in a CUDA build. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include <errno.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/copy.h"
#include "trainer/trainer_int.h"
#ifdef CKPTFS_CUDA
#include "trainer/copy_cuda.h"
#endif

/* The reason of this thread's last failure (copy.h). */
static _Thread_local char copy_err[256];

const char *tr_copy_error(void)
{
	return copy_err;
}

#ifdef CKPTFS_CUDA
static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int probe_count; /* written once under probe_once */

static void probe(void)
{
	probe_count = trc_device_count();
}
#endif

int tr_cuda_usable(void)
{
#ifdef CKPTFS_CUDA
	/* The probe initializes the CUDA runtime; do it once per process. */
	pthread_once(&probe_once, probe);
	return probe_count > 0;
#else
	return 0;
#endif
}

static int nodev(int device)
{
#ifdef CKPTFS_CUDA
	tr_fmt(copy_err, sizeof(copy_err), "no usable CUDA device %d (%d usable GPUs)",
	       device, tr_cuda_usable() ? probe_count : 0);
#else
	tr_fmt(copy_err, sizeof(copy_err),
	       "device pointer (CUDA device %d) but libckptfs was built without CUDA", device);
#endif
	return -ENODEV;
}

TR_EXPORT int ckptfs_cuda_available(void)
{
	return tr_cuda_usable();
}

/* One synchronous copy between host memory and device `device` (-1: host to host);
 * to_device says which side the device pointer is on. */
static int copy_one(void *dst, const void *src, size_t len, int device, bool to_device)
{
	copy_err[0] = '\0';
	if (len == 0)
		return 0;
	if (!dst || !src) {
		tr_fmt(copy_err, sizeof(copy_err), "NULL pointer");
		return -EINVAL;
	}
	if (device < 0) {
		memcpy(dst, src, len);
		return 0;
	}
#ifdef CKPTFS_CUDA
	if (tr_cuda_usable())
		return to_device ? trc_memcpy(dst, device, src, -1, len, copy_err, sizeof(copy_err))
				 : trc_memcpy(dst, -1, src, device, len, copy_err, sizeof(copy_err));
#endif
	return nodev(device);
}

int tr_copy_to_host(void *dst, const void *src, size_t len, int device)
{
	return copy_one(dst, src, len, device, false);
}

int tr_copy_to_device(void *dst, int device, const void *src, size_t len)
{
	return copy_one(dst, src, len, device, true);
}

int tr_host_register(void *addr, size_t len)
{
	copy_err[0] = '\0';
#ifdef CKPTFS_CUDA
	if (tr_cuda_usable() && len > 0)
		return trc_host_register(addr, len, copy_err, sizeof(copy_err));
#endif
	(void)addr;
	(void)len;
	return 0;
}

void tr_host_unregister(void *addr)
{
#ifdef CKPTFS_CUDA
	if (tr_cuda_usable())
		trc_host_unregister(addr);
#endif
	(void)addr;
}

/* --- the batched copier ------------------------------------------------------------------ */

/* Host copies are cut into units of about UNIT bytes (small copies merged, large ones split)
 * so that the threads share the work evenly. */
#define UNIT ((size_t)16 << 20)

struct hcopy {
	char *dst;
	const char *src;
	size_t len;
};

/* A unit: `len` bytes starting at byte `off` of copy `first`, running on into the next
 * copies. */
struct unit {
	size_t first, off, len;
};

struct tr_copier {
	int threads;            /* host copy threads including the caller's */
	pthread_t *tids;        /* threads - 1 workers */
	int n_tids;
	pthread_mutex_t lock;   /* protects gen, next, left, stop */
	pthread_cond_t work;    /* a new generation of units (or stop) */
	pthread_cond_t idle;    /* left reached 0 */
	uint64_t gen;
	size_t next, left;
	int stop;
	/* Owned by the owner thread between waits; read-only to workers during a generation. */
	struct hcopy *q;
	size_t nq, capq;
	struct unit *units;
	size_t nunits, capunits;
	long n_added;           /* copies added since the last wait */
	int err;                /* first failure of an add since the last wait */
	long err_idx;
	char err_msg[256];
#ifdef CKPTFS_CUDA
	struct trc_streams *streams;  /* made on the first device copy */
#endif
};

static void run_unit(const struct tr_copier *c, const struct unit *u)
{
	size_t i = u->first, off = u->off, left = u->len;

	while (left > 0) {
		const struct hcopy *h = &c->q[i];
		size_t n = h->len - off;

		if (n > left)
			n = left;
		memcpy(h->dst + off, h->src + off, n);
		left -= n;
		off = 0;
		i++;
	}
}

/* Takes units until none is left; returns with the lock held. */
static void take_units(struct tr_copier *c)
{
	while (c->next < c->nunits) {
		size_t u = c->next++;

		pthread_mutex_unlock(&c->lock);
		run_unit(c, &c->units[u]);
		pthread_mutex_lock(&c->lock);
		if (--c->left == 0)
			pthread_cond_broadcast(&c->idle);
	}
}

static void *worker(void *arg)
{
	struct tr_copier *c = arg;
	uint64_t seen = 0;

	pthread_mutex_lock(&c->lock);
	for (;;) {
		while (!c->stop && c->gen == seen)
			pthread_cond_wait(&c->work, &c->lock);
		if (c->stop)
			break;
		seen = c->gen;
		take_units(c);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

int tr_copier_new(int threads, struct tr_copier **ret_copier)
{
	struct tr_copier *c;
	int ret = 0;

	*ret_copier = NULL;
	if (threads < 1)
		threads = 1;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->threads = threads;
	c->err_idx = -1;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->work, NULL);
	pthread_cond_init(&c->idle, NULL);
	if (threads > 1) {
		c->tids = calloc((size_t)threads - 1, sizeof(*c->tids));
		if (!c->tids) {
			ret = -ENOMEM;
			goto out;
		}
		for (; c->n_tids < threads - 1; c->n_tids++) {
			int e = tr_thread_start(&c->tids[c->n_tids], worker, c);

			if (e) {
				ret = -e;
				goto out;
			}
		}
	}
	*ret_copier = c;
out:
	if (ret < 0)
		tr_copier_free(c);
	return ret;
}

void tr_copier_free(struct tr_copier *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->lock);
	c->stop = 1;
	pthread_cond_broadcast(&c->work);
	pthread_mutex_unlock(&c->lock);
	for (int i = 0; i < c->n_tids; i++)
		pthread_join(c->tids[i], NULL);
#ifdef CKPTFS_CUDA
	if (c->streams)
		trc_streams_free(c->streams);
#endif
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->work);
	pthread_cond_destroy(&c->idle);
	free(c->tids);
	free(c->q);
	free(c->units);
	free(c);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
	size_t n = *cap ? *cap : 64;
	void *np;

	if (need <= *cap)
		return 0;
	while (n < need)
		n *= 2;
	np = realloc(*p, n * elem);
	if (!np)
		return -ENOMEM;
	*p = np;
	*cap = n;
	return 0;
}

static void add_failed(struct tr_copier *c, int err, const char *msg)
{
	if (c->err)
		return;
	c->err = err;
	c->err_idx = c->n_added;
	snprintf(c->err_msg, sizeof(c->err_msg), "%s", msg);
}

int tr_copier_add(struct tr_copier *c, void *dst, const void *src, size_t len, int device)
{
	int ret = 0;

	copy_err[0] = '\0';
	if (len == 0)
		goto out;
	if (device < 0) {
		ret = grow((void **)&c->q, &c->capq, c->nq + 1, sizeof(*c->q));
		if (ret < 0) {
			tr_fmt(copy_err, sizeof(copy_err), "out of memory");
			goto out;
		}
		c->q[c->nq++] = (struct hcopy){ dst, src, len };
		goto out;
	}
#ifdef CKPTFS_CUDA
	if (tr_cuda_usable()) {
		if (!c->streams) {
			ret = trc_streams_new(&c->streams);
			if (ret < 0) {
				tr_fmt(copy_err, sizeof(copy_err), "out of memory");
				goto out;
			}
		}
		ret = trc_d2h_async(c->streams, dst, src, len, device, copy_err, sizeof(copy_err));
		goto out;
	}
#endif
	ret = nodev(device);
out:
	if (ret < 0)
		add_failed(c, ret, copy_err);
	c->n_added++;
	return ret;
}

/* Cuts the queued host copies into units. */
static int make_units(struct tr_copier *c)
{
	size_t total = 0, target, i = 0, off = 0;
	int ret;

	c->nunits = 0;
	for (size_t k = 0; k < c->nq; k++)
		total += c->q[k].len;
	/* At least a unit per thread when there is enough to share, never tiny units. */
	target = total / (size_t)c->threads / 4;
	if (target > UNIT)
		target = UNIT;
	if (target < ((size_t)1 << 20))
		target = (size_t)1 << 20;
	while (i < c->nq) {
		struct unit u = { i, off, 0 };

		while (i < c->nq && u.len < target) {
			size_t n = c->q[i].len - off;

			if (n > target - u.len)
				n = target - u.len;
			u.len += n;
			off += n;
			if (off == c->q[i].len) {
				i++;
				off = 0;
			}
		}
		ret = grow((void **)&c->units, &c->capunits, c->nunits + 1, sizeof(*c->units));
		if (ret < 0)
			return ret;
		c->units[c->nunits++] = u;
	}
	return 0;
}

int tr_copier_wait(struct tr_copier *c, long *ret_failed)
{
	int ret = 0;

	copy_err[0] = '\0';
	if (c->nq > 0) {
		if (c->threads == 1) {
			for (size_t k = 0; k < c->nq; k++)
				memcpy(c->q[k].dst, c->q[k].src, c->q[k].len);
		} else if (make_units(c) < 0) {
			/* No room for the units: copy on this thread alone. */
			for (size_t k = 0; k < c->nq; k++)
				memcpy(c->q[k].dst, c->q[k].src, c->q[k].len);
		} else {
			pthread_mutex_lock(&c->lock);
			c->next = 0;
			c->left = c->nunits;
			c->gen++;
			pthread_cond_broadcast(&c->work);
			take_units(c);
			while (c->left > 0)
				pthread_cond_wait(&c->idle, &c->lock);
			pthread_mutex_unlock(&c->lock);
		}
	}
#ifdef CKPTFS_CUDA
	if (c->streams) {
		char msg[256];
		int r = trc_streams_wait(c->streams, msg, sizeof(msg));

		if (r < 0 && !c->err) {
			c->err = r;
			c->err_idx = -1;
			snprintf(c->err_msg, sizeof(c->err_msg), "%s", msg);
		}
	}
#endif
	if (c->err) {
		ret = c->err;
		tr_fmt(copy_err, sizeof(copy_err), "%s", c->err_msg);
	}
	if (ret_failed)
		*ret_failed = ret < 0 ? c->err_idx : -1;
	c->nq = 0;
	c->n_added = 0;
	c->err = 0;
	c->err_idx = -1;
	return ret;
}
