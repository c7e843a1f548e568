/* SPDX-License-Identifier: MIT */
/*
 * readahead.c - worker threads that load chunks ahead of sequential readers.
 */
#include "store/readahead.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"

#define RA_MAX_THREADS 16
#define RA_SLACK (4ull << 20) /* reads this far from the last one still count as sequential */

struct ckpt_readahead {
	ckpt_store *s;
	pthread_mutex_t lock;
	pthread_cond_t work;
	/* Fields below are protected by lock. */
	ckpt_digest *q; /* ring of queue_len digests */
	unsigned qlen, qhead, qcount;
	unsigned idle; /* workers waiting for work */
	unsigned warm; /* workers set up (ckpt_store_prefetch_warm tried) */
	pthread_cond_t ready; /* signalled as warm grows */
	bool stop;
	struct ckpt_ra_stats stats;
	/* Set before the workers start. */
	unsigned nthreads;
	pthread_t threads[RA_MAX_THREADS];
};

/*
 * Chunks a worker takes from the queue at once: records of them that lie
 * close together in a pack are read with one request (see
 * ckpt_store_prefetch_chunks).  A batch is at most RA_BATCH chunks and at
 * most 1/RA_SHARE of the queue: one sequential reader queues about 16
 * chunks per 8 MiB, so the workers take one or two each and the reader's
 * next chunk does not wait for a large batch's reads (a fixed batch of 8
 * made one reader slower); several readers keep the queue deep and the
 * batches grow (which made four readers faster; docs/performance.md).
 */
#define RA_BATCH 8
#define RA_SHARE 8

/* Count a finished batch of n chunks (lock held). */
static void ra_count(ckpt_readahead *ra, size_t n, int r, size_t loaded, size_t skipped)
{
	ra->stats.skipped += skipped;
	ra->stats.loaded += loaded;
	/* the readers will hit (and report) these themselves */
	ra->stats.failed += r < 0 ? n - loaded - skipped : (size_t)r;
}

/*
 * A worker keeps batches' reads in flight while it decodes the batch before
 * them (ckpt_store_prefetch_begin / _finish): it takes the next batch from
 * the queue and submits its reads, then decodes the oldest one it has
 * begun.  So the disk works while the CPUs decode, also when every worker
 * is busy decoding; a worker waits for the disk only when the queue is
 * empty.  It holds at most RA_DEPTH batches, one per span buffer of its
 * thread (CKPT_PREFETCH_INFLIGHT), and begins a batch ahead only while no
 * other worker is idle: with one reader the queue is short (about 16
 * chunks per 8 MiB), and a worker holding two batches made the reader wait
 * for its decodes where an idle worker would have taken the chunk (one
 * reader of the stored sources was measurably slower).
 */
#define RA_DEPTH CKPT_PREFETCH_INFLIGHT

static void *ra_main(void *arg)
{
	ckpt_readahead *ra = arg;
	struct {
		ckpt_prefetch *pf;
		size_t n;
		ckpt_digest d[RA_BATCH]; /* pf points into these until finished */
	} b[RA_DEPTH];
	unsigned head = 0, npend = 0; /* begun, not finished: b[head], b[head + 1] ... */

	/* set up at mount, not during the first read (failure: on first use) */
	(void)ckpt_store_prefetch_warm(ra->s);
	pthread_mutex_lock(&ra->lock);
	ra->warm++;
	pthread_cond_broadcast(&ra->ready);
	for (;;) {
		size_t loaded = 0, skipped = 0;
		int r;

		while (!ra->stop && ra->qcount == 0 && npend == 0) {
			ra->idle++;
			pthread_cond_wait(&ra->work, &ra->lock);
			ra->idle--;
		}
		if (ra->stop && npend == 0)
			break;
		if (!ra->stop && ra->qcount > 0 && npend < RA_DEPTH && (npend == 0 || ra->idle == 0)) {
			unsigned k = (head + npend) % RA_DEPTH;
			size_t n = 0, want;

			want = CKPT_MAX((size_t)1, CKPT_MIN((size_t)RA_BATCH, ra->qcount / RA_SHARE));
			while (n < want && ra->qcount > 0) {
				b[k].d[n++] = ra->q[ra->qhead];
				ra->qhead = (ra->qhead + 1) % ra->qlen;
				ra->qcount--;
			}
			pthread_mutex_unlock(&ra->lock);
			/* the first batch is finished next (its reads are made
			 * then); one begun ahead of another has its reads sent */
			r = ckpt_store_prefetch_begin(ra->s, b[k].d, n, npend > 0, &b[k].pf);
			pthread_mutex_lock(&ra->lock);
			if (r < 0) {
				ra_count(ra, n, r, 0, 0);
			} else {
				b[k].n = n;
				npend++;
			}
			/* more to begin before decoding, while the queue has some
			 * and no other worker is idle to take it */
			if (npend < RA_DEPTH && ra->qcount > 0 && ra->idle == 0 && !ra->stop)
				continue;
		}
		if (npend == 0)
			continue;
		pthread_mutex_unlock(&ra->lock);
		r = ckpt_store_prefetch_finish(ra->s, b[head].pf, &loaded, &skipped);
		pthread_mutex_lock(&ra->lock);
		ra_count(ra, b[head].n, r, loaded, skipped);
		head = (head + 1) % RA_DEPTH;
		npend--;
	}
	pthread_mutex_unlock(&ra->lock);
	return NULL;
}

int ckpt_readahead_new(ckpt_store *s, unsigned nthreads, unsigned queue_len,
		       ckpt_readahead **ret)
{
	ckpt_readahead *ra;
	int r = 0;

	if (!s || !ret || !queue_len)
		return -EINVAL;
	if (!nthreads) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		nthreads = n > 0 ? (unsigned)(2 * n) : 2;
	}
	if (nthreads > RA_MAX_THREADS)
		nthreads = RA_MAX_THREADS;
	ra = calloc(1, sizeof(*ra));
	if (!ra)
		return -ENOMEM;
	ra->q = calloc(queue_len, sizeof(*ra->q));
	if (!ra->q) {
		free(ra);
		return -ENOMEM;
	}
	ra->s = s;
	ra->qlen = queue_len;
	pthread_mutex_init(&ra->lock, NULL);
	pthread_cond_init(&ra->work, NULL);
	pthread_cond_init(&ra->ready, NULL);
	r = ckpt_threads_start(ra->threads, nthreads, ra_main, ra);
	if (r < 0) {
		ckpt_readahead_free(ra);
		return r;
	}
	ra->nthreads = (unsigned)r;
	/* return once every worker holds its buffers: the mount waits for them,
	 * the first read does not */
	pthread_mutex_lock(&ra->lock);
	while (ra->warm < ra->nthreads)
		pthread_cond_wait(&ra->ready, &ra->lock);
	pthread_mutex_unlock(&ra->lock);
	*ret = ra;
	return 0;
}

void ckpt_readahead_free(ckpt_readahead *ra)
{
	if (!ra)
		return;
	ckpt_threads_stop(&ra->lock, &ra->work, &ra->stop, ra->threads, ra->nthreads);
	pthread_cond_destroy(&ra->work);
	pthread_cond_destroy(&ra->ready);
	pthread_mutex_destroy(&ra->lock);
	free(ra->q);
	free(ra);
}

void ckpt_readahead_submit(ckpt_readahead *ra, const ckpt_digest *d, size_t n)
{
	size_t added = 0;

	if (!ra || !n)
		return;
	pthread_mutex_lock(&ra->lock);
	ra->stats.submitted += n;
	for (size_t i = 0; i < n; i++) {
		if (ra->qcount == ra->qlen) {
			ra->stats.dropped += n - i;
			break;
		}
		ra->q[(ra->qhead + ra->qcount) % ra->qlen] = d[i];
		ra->qcount++;
		added++;
	}
	if (added == 1)
		pthread_cond_signal(&ra->work);
	else if (added > 1)
		pthread_cond_broadcast(&ra->work);
	pthread_mutex_unlock(&ra->lock);
}

void ckpt_readahead_get_stats(ckpt_readahead *ra, struct ckpt_ra_stats *ret)
{
	pthread_mutex_lock(&ra->lock);
	*ret = ra->stats;
	pthread_mutex_unlock(&ra->lock);
}

uint64_t ckpt_ra_window_size(uint64_t stream_cap, unsigned streams)
{
	uint64_t w = stream_cap / 8 * 3 / (streams ? streams : 1);

	return CKPT_MIN(CKPT_RA_WINDOW_MAX, CKPT_MAX(CKPT_RA_WINDOW_MIN, w));
}

bool ckpt_ra_window_next(struct ckpt_ra_window *w, uint64_t off, uint64_t len, uint64_t size,
			 uint64_t window, uint64_t *from, uint64_t *to, bool *ret_seq)
{
	uint64_t end = off + len, prev, cur, lo, hi;

	prev = __atomic_exchange_n(&w->last_end, end, __ATOMIC_RELAXED);
	*ret_seq = !(off != 0 && (off + RA_SLACK < prev || off > prev + RA_SLACK));
	if (!*ret_seq)
		return false; /* random access: leave it to the kernel's read-ahead */
	cur = __atomic_load_n(&w->ra_end, __ATOMIC_RELAXED);
	for (;;) {
		/* ahead by more than a window: stale (the reader went back) */
		lo = CKPT_MAX(cur > end + window ? end : cur, end);
		hi = CKPT_MIN(size, end + window);
		if (hi <= lo || (lo > end && lo - end >= window / 2))
			return false; /* enough queued already */
		if (__atomic_compare_exchange_n(&w->ra_end, &cur, hi, false, __ATOMIC_RELAXED,
						__ATOMIC_RELAXED))
			break;
	}
	*from = lo;
	*to = hi;
	return true;
}
