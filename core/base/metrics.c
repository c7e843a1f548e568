/* SPDX-License-Identifier: MIT */
/*
 * metrics.c - counters, histograms, collectors and the Prometheus text
 * rendering (see metrics.h).
 */
#include "base/metrics.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

#define CACHE_LINE 64

/* ------------------------------------------------------------- shards */

/* The shard of the calling thread: given round-robin at its first use. */
static atomic_uint next_shard;
static __thread int my_shard = -1;

static unsigned shard_of_thread(void)
{
	if (my_shard < 0)
		my_shard = (int)(atomic_fetch_add_explicit(&next_shard, 1, memory_order_relaxed) %
				 CKPT_METRIC_SHARDS);
	return (unsigned)my_shard;
}

/* --------------------------------------------------------- core counters */

/* One shard of every core counter, on cache lines of its own. */
struct counter_shard {
	_Alignas(CACHE_LINE) atomic_uint_least64_t v[CKPT_M_COUNT];
};
static struct counter_shard counters[CKPT_METRIC_SHARDS];

void ckpt_metric_add(enum ckpt_metric m, uint64_t n)
{
	if ((unsigned)m >= CKPT_M_COUNT)
		return;
	atomic_fetch_add_explicit(&counters[shard_of_thread()].v[m], n, memory_order_relaxed);
}

uint64_t ckpt_metric_get(enum ckpt_metric m)
{
	uint64_t sum = 0;

	if ((unsigned)m >= CKPT_M_COUNT)
		return 0;
	for (unsigned i = 0; i < CKPT_METRIC_SHARDS; i++)
		sum += atomic_load_explicit(&counters[i].v[m], memory_order_relaxed);
	return sum;
}

/* How each core counter is rendered: family, labels, help (the help of a
 * family is given with its first counter; the counters of a family are
 * next to each other).  No family: rendered by a collector. */
static const struct {
	const char *family;
	const char *labels;
	const char *help;
} core_names[CKPT_M_COUNT] = {
	[CKPT_M_WRITE_BYTES] = { "ckptfs_written_bytes_total", NULL,
		"Bytes written into files through the mount (logical)." },
	[CKPT_M_READ_BYTES] = { "ckptfs_read_bytes_total", NULL,
		"Bytes read from files through the mount (logical; stored and view files)." },
	[CKPT_M_CHUNKS_NEW] = { "ckptfs_chunks_total", "result=\"stored\"",
		"Chunks of written content: stored (new to the store) or dedup (the store "
		"held them already; not stored again)." },
	[CKPT_M_CHUNKS_DEDUP] = { "ckptfs_chunks_total", "result=\"dedup\"", NULL },
	[CKPT_M_CHUNK_BYTES_NEW] = { "ckptfs_chunk_bytes_total", "result=\"stored\"",
		"Raw bytes of those chunks: stored or dedup." },
	[CKPT_M_CHUNK_BYTES_DEDUP] = { "ckptfs_chunk_bytes_total", "result=\"dedup\"", NULL },
	[CKPT_M_STORED_BYTES] = { "ckptfs_stored_bytes_total", NULL,
		"Bytes appended to the chunk backend for new chunks, as first stored "
		"(compressed, or raw where compression is left to background work)." },
	[CKPT_M_FILES_COMMITTED] = { "ckptfs_files_committed_total", NULL,
		"File contents committed to the index (a file closed several times before "
		"a commit counts once)." },
};

/* ------------------------------------------------------------ histograms */

#define HIST_MAX_BOUNDS 64

/* One shard: counts[0..n] (n + 1 buckets), then the sum. */
struct ckpt_histogram {
	size_t n;
	size_t stride; /* atomics per shard, rounded up to whole cache lines */
	uint64_t bounds[HIST_MAX_BOUNDS];
	atomic_uint_least64_t *v; /* CKPT_METRIC_SHARDS * stride, cache-line aligned */
};

int ckpt_histogram_new(const uint64_t *bounds, size_t n, ckpt_histogram **ret)
{
	const size_t per_line = CACHE_LINE / sizeof(atomic_uint_least64_t);
	ckpt_histogram *h;
	size_t bytes;

	if (n == 0 || n > HIST_MAX_BOUNDS)
		return -EINVAL;
	for (size_t i = 1; i < n; i++)
		if (bounds[i] <= bounds[i - 1])
			return -EINVAL;
	h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->n = n;
	memcpy(h->bounds, bounds, n * sizeof(*bounds));
	h->stride = (n + 2 + per_line - 1) / per_line * per_line;
	bytes = CKPT_METRIC_SHARDS * h->stride * sizeof(*h->v);
	h->v = aligned_alloc(CACHE_LINE, bytes);
	if (!h->v) {
		free(h);
		return -ENOMEM;
	}
	for (size_t i = 0; i < CKPT_METRIC_SHARDS * h->stride; i++)
		atomic_init(&h->v[i], 0);
	*ret = h;
	return 0;
}

void ckpt_histogram_free(ckpt_histogram *h)
{
	if (!h)
		return;
	free(h->v);
	free(h);
}

size_t ckpt_histogram_nbounds(const ckpt_histogram *h)
{
	return h->n;
}

void ckpt_histogram_observe(ckpt_histogram *h, uint64_t v)
{
	atomic_uint_least64_t *s = h->v + shard_of_thread() * h->stride;
	size_t lo = 0, hi = h->n;

	while (lo < hi) { /* the first bound >= v; n: +Inf */
		size_t mid = lo + (hi - lo) / 2;

		if (h->bounds[mid] >= v)
			hi = mid;
		else
			lo = mid + 1;
	}
	atomic_fetch_add_explicit(&s[lo], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&s[h->n + 1], v, memory_order_relaxed);
}

void ckpt_histogram_read(const ckpt_histogram *h, uint64_t *ret_buckets, uint64_t *ret_count,
			 uint64_t *ret_sum)
{
	uint64_t count = 0, sum = 0;

	memset(ret_buckets, 0, (h->n + 1) * sizeof(*ret_buckets));
	for (unsigned sh = 0; sh < CKPT_METRIC_SHARDS; sh++) {
		atomic_uint_least64_t *s = h->v + sh * h->stride;

		for (size_t i = 0; i <= h->n; i++)
			ret_buckets[i] += atomic_load_explicit(&s[i], memory_order_relaxed);
		sum += atomic_load_explicit(&s[h->n + 1], memory_order_relaxed);
	}
	/* Shards are read while others observe: the count is the buckets' sum
	 * (not the shards' count fields), so that +Inf always equals _count. */
	for (size_t i = 0; i <= h->n; i++)
		count += ret_buckets[i];
	*ret_count = count;
	*ret_sum = sum;
}

/* ---------------------------------------------------------------- writer */

struct ckpt_mw {
	char *buf;
	size_t len, cap;
	bool nomem;
};

static void mw_printf(ckpt_mw *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mw_printf(ckpt_mw *w, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (w->nomem)
		return;
	for (;;) {
		size_t room = w->cap - w->len;

		va_start(ap, fmt);
		n = vsnprintf(w->buf + w->len, room, fmt, ap);
		va_end(ap);
		if (n < 0) {
			w->nomem = true;
			return;
		}
		if ((size_t)n < room) {
			w->len += (size_t)n;
			return;
		}
		size_t nc = (w->cap + (size_t)n + 1) * 2;
		char *nb = realloc(w->buf, nc);
		if (!nb) {
			w->nomem = true;
			return;
		}
		w->buf = nb;
		w->cap = nc;
	}
}

void ckpt_mw_family(ckpt_mw *w, const char *name, const char *type, const char *help)
{
	mw_printf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void ckpt_mw_u64(ckpt_mw *w, const char *name, const char *labels, uint64_t v)
{
	if (labels && *labels)
		mw_printf(w, "%s{%s} %llu\n", name, labels, (unsigned long long)v);
	else
		mw_printf(w, "%s %llu\n", name, (unsigned long long)v);
}

void ckpt_mw_double(ckpt_mw *w, const char *name, const char *labels, double v)
{
	if (labels && *labels)
		mw_printf(w, "%s{%s} %.17g\n", name, labels, v);
	else
		mw_printf(w, "%s %.17g\n", name, v);
}

void ckpt_mw_histogram(ckpt_mw *w, const char *name, const char *labels,
		       const ckpt_histogram *h, double scale)
{
	uint64_t b[HIST_MAX_BOUNDS + 1], count, sum, cum = 0;
	const char *sep = labels && *labels ? "," : "";

	if (!labels)
		labels = "";
	ckpt_histogram_read(h, b, &count, &sum);
	for (size_t i = 0; i < h->n; i++) {
		cum += b[i];
		mw_printf(w, "%s_bucket{%s%sle=\"%.9g\"} %llu\n", name, labels, sep,
			  (double)h->bounds[i] * scale, (unsigned long long)cum);
	}
	mw_printf(w, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep,
		  (unsigned long long)count);
	if (*labels) {
		mw_printf(w, "%s_sum{%s} %.17g\n", name, labels, (double)sum * scale);
		mw_printf(w, "%s_count{%s} %llu\n", name, labels, (unsigned long long)count);
	} else {
		mw_printf(w, "%s_sum %.17g\n", name, (double)sum * scale);
		mw_printf(w, "%s_count %llu\n", name, (unsigned long long)count);
	}
}

/* ------------------------------------------------------------ collectors */

struct collector {
	ckpt_metrics_collect_fn *fn;
	void *arg;
};

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
/* Protected by reg_lock: */
static struct collector *collectors;
static size_t ncollectors, cap_collectors;

int ckpt_metrics_register(ckpt_metrics_collect_fn *fn, void *arg)
{
	int r = 0;

	pthread_mutex_lock(&reg_lock);
	if (ncollectors == cap_collectors) {
		size_t nc = cap_collectors ? cap_collectors * 2 : 8;
		struct collector *c = realloc(collectors, nc * sizeof(*c));

		if (!c) {
			r = -ENOMEM;
			goto out;
		}
		collectors = c;
		cap_collectors = nc;
	}
	collectors[ncollectors++] = (struct collector){ fn, arg };
out:
	pthread_mutex_unlock(&reg_lock);
	return r;
}

void ckpt_metrics_unregister(ckpt_metrics_collect_fn *fn, void *arg)
{
	pthread_mutex_lock(&reg_lock);
	for (size_t i = 0; i < ncollectors; i++) {
		if (collectors[i].fn == fn && collectors[i].arg == arg) {
			memmove(collectors + i, collectors + i + 1,
				(ncollectors - i - 1) * sizeof(*collectors));
			ncollectors--;
			break;
		}
	}
	if (ncollectors == 0) {
		free(collectors);
		collectors = NULL;
		cap_collectors = 0;
	}
	pthread_mutex_unlock(&reg_lock);
}

int ckpt_metrics_render(char **ret_text, size_t *ret_len)
{
	ckpt_mw w = { NULL, 0, 0, false };

	w.cap = 16384;
	w.buf = malloc(w.cap);
	if (!w.buf)
		return -ENOMEM;
	w.buf[0] = '\0';
	for (unsigned m = 0; m < CKPT_M_COUNT; m++) {
		if (!core_names[m].family)
			continue;
		if (core_names[m].help)
			ckpt_mw_family(&w, core_names[m].family, "counter", core_names[m].help);
		ckpt_mw_u64(&w, core_names[m].family, core_names[m].labels,
			    ckpt_metric_get((enum ckpt_metric)m));
	}
	pthread_mutex_lock(&reg_lock);
	for (size_t i = 0; i < ncollectors; i++)
		collectors[i].fn(collectors[i].arg, &w);
	pthread_mutex_unlock(&reg_lock);
	if (w.nomem) {
		free(w.buf);
		return -ENOMEM;
	}
	*ret_text = w.buf;
	*ret_len = w.len;
	return 0;
}
