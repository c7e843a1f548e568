/* SPDX-License-Identifier: MIT */
/*
 * metrics.h - the process's metrics and their rendering in the Prometheus
 * text exposition format, version 0.0.4 (docs/user-guide.md, "Logs and
 * metrics", lists every metric).
 *
 * Three kinds of things are rendered, in this order:
 *   - the core's counters (enum ckpt_metric): process-wide sums, added to
 *     on hot paths with ckpt_metric_add();
 *   - histograms (ckpt_histogram), owned by whoever observes into them;
 *   - collectors: functions registered with ckpt_metrics_register() that
 *     write their own families (values read from elsewhere at render time,
 *     the histograms they own) through the writer calls (ckpt_mw_*).
 *
 * Cost on the hot path: counters and histograms are sharded by thread
 * (CKPT_METRIC_SHARDS shards, each on its own cache lines; a thread keeps
 * the shard it was given first) and updated with relaxed atomic adds: no
 * lock, no shared cache line between threads of different shards.  Reads
 * sum the shards; a render is not a snapshot of one instant (a counter read
 * later may include adds made after an earlier one was read), but every
 * counter only grows.
 *
 * Thread-safety: every call may be made from any thread.  Registration and
 * rendering take one mutex; a collector runs under it and must not
 * register or unregister.
 *
 * Errors: 0 or a negative errno (-ENOMEM).  Nothing here calls abort().
 */
#ifndef CKPT_METRICS_H
#define CKPT_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CKPT_METRIC_SHARDS 16

/* The core's counters.  core_names[] in metrics.c gives each its family
 * name, its labels and its help text. */
enum ckpt_metric {
	CKPT_M_WRITE_BYTES,       /* bytes written into files through the mount */
	CKPT_M_READ_BYTES,        /* bytes read from files (stored and view files) */
	CKPT_M_CHUNKS_NEW,        /* chunks put that the store did not hold */
	CKPT_M_CHUNKS_DEDUP,      /* chunks put that it held already (not stored again) */
	CKPT_M_CHUNK_BYTES_NEW,   /* their raw bytes */
	CKPT_M_CHUNK_BYTES_DEDUP,
	CKPT_M_STORED_BYTES,      /* bytes appended for new chunks, as stored */
	/* Bytes given to the compressor while writing, and what its output
	 * took: not rendered here, the store's collector renders them beside
	 * background compression's (core/store/metrics.c). */
	CKPT_M_COMPRESS_IN_INLINE,
	CKPT_M_COMPRESS_OUT_INLINE,
	CKPT_M_FILES_COMMITTED,   /* file contents committed to the index */
	CKPT_M_COUNT
};

void ckpt_metric_add(enum ckpt_metric m, uint64_t n);
/* The sum over the shards. */
uint64_t ckpt_metric_get(enum ckpt_metric m);

/*
 * Histograms of non-negative integer values (latencies in nanoseconds):
 * n upper bounds, ascending, and an implicit +Inf bucket.  new: 0 and
 * *ret, -EINVAL (n 0, above 64, or bounds not ascending), -ENOMEM.
 * observe: the value lands in the first bucket whose bound is >= it.
 * read: non-cumulative bucket counts into ret_buckets (n + 1 of them), the
 * count and the sum of the values.
 */
typedef struct ckpt_histogram ckpt_histogram;
int ckpt_histogram_new(const uint64_t *bounds, size_t n, ckpt_histogram **ret);
void ckpt_histogram_free(ckpt_histogram *h);
void ckpt_histogram_observe(ckpt_histogram *h, uint64_t v);
size_t ckpt_histogram_nbounds(const ckpt_histogram *h);
void ckpt_histogram_read(const ckpt_histogram *h, uint64_t *ret_buckets, uint64_t *ret_count,
			 uint64_t *ret_sum);

/* The text being rendered. */
typedef struct ckpt_mw ckpt_mw;

/* A family's "# HELP" and "# TYPE" lines (type: counter, gauge or
 * histogram); once per family, before its samples. */
void ckpt_mw_family(ckpt_mw *w, const char *name, const char *type, const char *help);
/* One sample: labels NULL or the inside of the braces, already escaped
 * (`op="read",errno="EIO"`). */
void ckpt_mw_u64(ckpt_mw *w, const char *name, const char *labels, uint64_t v);
void ckpt_mw_double(ckpt_mw *w, const char *name, const char *labels, double v);
/* A histogram's samples NAME_bucket{...,le="B"} (cumulative, up to
 * le="+Inf"), NAME_sum and NAME_count; values and bounds multiplied by
 * scale (1e-9: nanoseconds rendered as seconds). */
void ckpt_mw_histogram(ckpt_mw *w, const char *name, const char *labels,
		       const ckpt_histogram *h, double scale);

typedef void ckpt_metrics_collect_fn(void *arg, ckpt_mw *w);
/* Add (fn, arg) to the collectors, rendered in registration order. */
int ckpt_metrics_register(ckpt_metrics_collect_fn *fn, void *arg);
/* Remove (fn, arg); after it returns fn is not running and is not called
 * again with arg.  Unknown pairs are ignored. */
void ckpt_metrics_unregister(ckpt_metrics_collect_fn *fn, void *arg);

/* The whole exposition (core counters, then the collectors' families):
 * 0 and *ret_text (malloc'd, NUL-terminated, free()) with *ret_len, or
 * -ENOMEM. */
int ckpt_metrics_render(char **ret_text, size_t *ret_len);

#endif
