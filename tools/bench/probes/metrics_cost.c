/* SPDX-License-Identifier: MIT */
/*
 * metrics_cost.c - what does the per-request bookkeeping of issue 23's
 * metrics cost: a counter add, a histogram observe, the clock read that
 * times a request, and the whole per-request sequence of fs/fuse_ops.c's
 * wrappers (two clock reads, one observe), from 1 and from N threads at
 * once (threads adding to their own shards).
 *
 * usage: metrics_cost [MILLIONS] [THREADS]   (defaults 20 and 2)
 *
 * Prints nanoseconds per call, per thread; the median of 5 runs of each.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/metrics.h"
#include "base/util.h"
#include "benchclock.h"

static long iters;
static ckpt_histogram *hist;
static int which;

static void *work(void *arg)
{
	(void)arg;
	switch (which) {
	case 0:
		for (long i = 0; i < iters; i++)
			ckpt_metric_add(CKPT_M_WRITE_BYTES, 4096);
		break;
	case 1:
		for (long i = 0; i < iters; i++)
			ckpt_histogram_observe(hist, (uint64_t)(i & 0xfffff) * 37);
		break;
	case 2: {
		int64_t sum = 0;
		for (long i = 0; i < iters; i++)
			sum += ckpt_mono_ns();
		if (sum == 42)
			printf("!\n");
		break;
	}
	case 3:
		for (long i = 0; i < iters; i++) {
			int64_t t0 = ckpt_mono_ns();
			ckpt_metric_add(CKPT_M_WRITE_BYTES, 4096);
			ckpt_histogram_observe(hist, (uint64_t)(ckpt_mono_ns() - t0));
		}
		break;
	}
	return NULL;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double run(int nthreads)
{
	pthread_t t[64];
	double r[5];

	for (int k = 0; k < 5; k++) {
		double t0 = now();
		for (int i = 0; i < nthreads; i++)
			pthread_create(&t[i], NULL, work, NULL);
		for (int i = 0; i < nthreads; i++)
			pthread_join(t[i], NULL);
		r[k] = (now() - t0) / (double)iters * 1e9;
	}
	qsort(r, 5, sizeof(r[0]), cmp);
	return r[2];
}

int main(int argc, char **argv)
{
	static const char *const names[] = { "counter add", "histogram observe", "clock read",
					      "request bookkeeping (2 clock reads, add, observe)" };
	static const uint64_t bounds[] = { 10000, 25000, 50000, 100000, 250000, 500000, 1000000,
					   2500000, 5000000, 10000000, 25000000, 50000000,
					   100000000, 250000000, 500000000, 1000000000,
					   2500000000ull, 5000000000ull, 10000000000ull };
	int n = argc > 2 ? atoi(argv[2]) : 2;

	iters = (long)((argc > 1 ? atof(argv[1]) : 20) * 1e6);
	if (iters < 1 || n < 1 || n > 64 ||
	    ckpt_histogram_new(bounds, CKPT_ARRAY_SIZE(bounds), &hist) < 0) {
		fprintf(stderr, "usage: %s [MILLIONS] [THREADS (1-64)]\n", argv[0]);
		return 1;
	}
	for (which = 0; which < 4; which++)
		printf("%-50s %6.1f ns (1 thread), %6.1f ns (%d threads)\n", names[which], run(1),
		       run(n), n);
	ckpt_histogram_free(hist);
	return 0;
}
