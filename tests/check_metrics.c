/* SPDX-License-Identifier: MIT */
/*
 * check_metrics.c - unit tests for core/base/metrics.c: the core counters
 * (sharded by thread, summed on read), histograms (bucket choice at and
 * between bounds, cumulative rendering), collectors (order, removal) and
 * the Prometheus text rendering.  The integration test t_metrics.sh parses
 * a mounted daemon's rendering with a real parser (prometheus_client).
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/metrics.h"
#include "testlib.h"

#define NTHREADS 8
#define NADDS 100000

static void *adder(void *arg)
{
	(void)arg;
	for (int i = 0; i < NADDS; i++)
		ckpt_metric_add(CKPT_M_WRITE_BYTES, 3);
	return NULL;
}

/* Adds from many threads (several per shard, and more threads than one
 * shard) all count. */
START_TEST(test_counters_threads)
{
	pthread_t t[NTHREADS];
	uint64_t before = ckpt_metric_get(CKPT_M_WRITE_BYTES);

	for (int i = 0; i < NTHREADS; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, adder, NULL), 0);
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(t[i], NULL);
	ck_assert_uint_eq(ckpt_metric_get(CKPT_M_WRITE_BYTES) - before, 3ull * NTHREADS * NADDS);
	/* another counter did not move; out-of-range ids are ignored */
	ck_assert_uint_eq(ckpt_metric_get(CKPT_M_READ_BYTES), 0);
	ckpt_metric_add(CKPT_M_COUNT, 5);
	ck_assert_uint_eq(ckpt_metric_get(CKPT_M_COUNT), 0);
}
END_TEST

START_TEST(test_histogram_buckets)
{
	const uint64_t bounds[] = { 10, 100, 1000 };
	uint64_t b[4], count, sum;
	ckpt_histogram *h;

	ck_assert_int_eq(ckpt_histogram_new(bounds, 0, &h), -EINVAL);
	ck_assert_int_eq(ckpt_histogram_new((const uint64_t[]){ 5, 5 }, 2, &h), -EINVAL);
	ck_assert_int_eq(ckpt_histogram_new((const uint64_t[]){ 9, 3 }, 2, &h), -EINVAL);
	ck_assert_int_eq(ckpt_histogram_new(bounds, 3, &h), 0);
	ck_assert_uint_eq(ckpt_histogram_nbounds(h), 3);
	/* le is inclusive: a value equal to a bound is in that bound's bucket */
	ckpt_histogram_observe(h, 0);
	ckpt_histogram_observe(h, 10);
	ckpt_histogram_observe(h, 11);
	ckpt_histogram_observe(h, 100);
	ckpt_histogram_observe(h, 999);
	ckpt_histogram_observe(h, 1001);
	ckpt_histogram_observe(h, UINT32_MAX);
	ckpt_histogram_read(h, b, &count, &sum);
	ck_assert_uint_eq(b[0], 2);
	ck_assert_uint_eq(b[1], 2);
	ck_assert_uint_eq(b[2], 1);
	ck_assert_uint_eq(b[3], 2);
	ck_assert_uint_eq(count, 7);
	ck_assert_uint_eq(sum, 0 + 10 + 11 + 100 + 999 + 1001 + (uint64_t)UINT32_MAX);
	ckpt_histogram_free(h);
	ckpt_histogram_free(NULL);
}
END_TEST

static ckpt_histogram *shared_h;

static void *observer(void *arg)
{
	(void)arg;
	for (int i = 0; i < NADDS; i++)
		ckpt_histogram_observe(shared_h, (uint64_t)(i % 3) * 50);
	return NULL;
}

START_TEST(test_histogram_threads)
{
	const uint64_t bounds[] = { 10, 60 };
	pthread_t t[NTHREADS];
	uint64_t b[3], count, sum;

	ck_assert_int_eq(ckpt_histogram_new(bounds, 2, &shared_h), 0);
	for (int i = 0; i < NTHREADS; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, observer, NULL), 0);
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(t[i], NULL);
	ckpt_histogram_read(shared_h, b, &count, &sum);
	ck_assert_uint_eq(count, (uint64_t)NTHREADS * NADDS);
	ck_assert_uint_eq(b[0] + b[1] + b[2], count);
	/* i % 3: 0 -> le 10; 50 -> le 60; 100 -> +Inf */
	ck_assert_uint_eq(b[0], (uint64_t)NTHREADS * ((NADDS + 2) / 3));
	ck_assert_uint_eq(b[2], (uint64_t)NTHREADS * (NADDS / 3));
	ckpt_histogram_free(shared_h);
}
END_TEST

static ckpt_histogram *coll_h;

static void coll_a(void *arg, ckpt_mw *w)
{
	ckpt_mw_family(w, "test_gauge", "gauge", (const char *)arg);
	ckpt_mw_u64(w, "test_gauge", NULL, 42);
	ckpt_mw_u64(w, "test_gauge", "kind=\"x\"", 7);
	ckpt_mw_double(w, "test_gauge", "kind=\"y\"", 0.25);
}

static void coll_b(void *arg, ckpt_mw *w)
{
	(void)arg;
	ckpt_mw_family(w, "test_seconds", "histogram", "A histogram.");
	ckpt_mw_histogram(w, "test_seconds", "op=\"read\"", coll_h, 1e-9);
	ckpt_mw_histogram(w, "test_seconds", NULL, coll_h, 1e-9);
}

/* The exposition: core counters with HELP and TYPE once per family,
 * collectors in registration order, cumulative buckets ending in +Inf
 * equal to _count, _sum scaled; a removed collector is gone. */
START_TEST(test_render)
{
	const uint64_t bounds[] = { 1000, 1000000 }; /* 1 us, 1 ms */
	char *text, *a, *b;
	size_t len;

	ck_assert_int_eq(ckpt_histogram_new(bounds, 2, &coll_h), 0);
	ckpt_histogram_observe(coll_h, 500);
	ckpt_histogram_observe(coll_h, 2000);
	ckpt_histogram_observe(coll_h, 3000000000ull);
	ckpt_metric_add(CKPT_M_READ_BYTES, 12345);
	ckpt_metric_add(CKPT_M_CHUNKS_DEDUP, 2);
	ck_assert_int_eq(ckpt_metrics_register(coll_a, "A gauge."), 0);
	ck_assert_int_eq(ckpt_metrics_register(coll_b, NULL), 0);
	ck_assert_int_eq(ckpt_metrics_render(&text, &len), 0);
	ck_assert_uint_eq(strlen(text), len);
	ck_assert_ptr_nonnull(strstr(text, "# HELP ckptfs_read_bytes_total "));
	ck_assert_ptr_nonnull(strstr(text, "\n# TYPE ckptfs_read_bytes_total counter\n"
					   "ckptfs_read_bytes_total 12345\n"));
	ck_assert_ptr_nonnull(strstr(text, "\nckptfs_chunks_total{result=\"stored\"} 0\n"
					   "ckptfs_chunks_total{result=\"dedup\"} 2\n"));
	/* one TYPE line per family */
	a = strstr(text, "# TYPE ckptfs_chunks_total counter");
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_null(strstr(a + 1, "# TYPE ckptfs_chunks_total"));
	/* the store's collector renders the compression families, not the core */
	ck_assert_ptr_null(strstr(text, "ckptfs_compress_input_bytes_total"));
	ck_assert_ptr_nonnull(strstr(text, "# HELP test_gauge A gauge.\n# TYPE test_gauge gauge\n"
					   "test_gauge 42\ntest_gauge{kind=\"x\"} 7\n"
					   "test_gauge{kind=\"y\"} 0.25\n"));
	ck_assert_ptr_nonnull(strstr(text,
		"# TYPE test_seconds histogram\n"
		"test_seconds_bucket{op=\"read\",le=\"1e-06\"} 1\n"
		"test_seconds_bucket{op=\"read\",le=\"0.001\"} 2\n"
		"test_seconds_bucket{op=\"read\",le=\"+Inf\"} 3\n"
		"test_seconds_sum{op=\"read\"} 3.0000025"));
	ck_assert_ptr_nonnull(strstr(text, "test_seconds_count{op=\"read\"} 3\n"
					   "test_seconds_bucket{le=\"1e-06\"} 1\n"));
	ck_assert_ptr_nonnull(strstr(text, "\ntest_seconds_count 3\n"));
	/* collectors in registration order, after the core counters */
	a = strstr(text, "test_gauge 42");
	b = strstr(text, "test_seconds_bucket");
	ck_assert(strstr(text, "ckptfs_files_committed_total") < a);
	ck_assert(a && b && a < b);
	ck_assert_int_eq(text[len - 1], '\n');
	free(text);

	ckpt_metrics_unregister(coll_a, "A gauge.");
	ckpt_metrics_unregister(coll_a, "not registered");
	ck_assert_int_eq(ckpt_metrics_render(&text, &len), 0);
	ck_assert_ptr_null(strstr(text, "test_gauge"));
	ck_assert_ptr_nonnull(strstr(text, "test_seconds_count 3\n"));
	free(text);
	ckpt_metrics_unregister(coll_b, NULL);
	ck_assert_int_eq(ckpt_metrics_render(&text, &len), 0);
	ck_assert_ptr_null(strstr(text, "test_seconds"));
	free(text);
	ckpt_histogram_free(coll_h);
}
END_TEST

static void coll_big(void *arg, ckpt_mw *w)
{
	char name[64];

	(void)arg;
	for (int i = 0; i < 5000; i++) {
		snprintf(name, sizeof(name), "test_many_%d", i);
		ckpt_mw_family(w, name, "gauge", "Many families: the text grows past its first buffer.");
		ckpt_mw_u64(w, name, NULL, (uint64_t)i);
	}
}

START_TEST(test_render_grows)
{
	char *text;
	size_t len;

	ck_assert_int_eq(ckpt_metrics_register(coll_big, NULL), 0);
	ck_assert_int_eq(ckpt_metrics_render(&text, &len), 0);
	ck_assert_uint_gt(len, 300000);
	ck_assert_ptr_nonnull(strstr(text, "\ntest_many_4999 4999\n"));
	free(text);
	ckpt_metrics_unregister(coll_big, NULL);
}
END_TEST

static Suite *metrics_suite(void)
{
	Suite *s = suite_create("metrics");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_counters_threads);
	tcase_add_test(tc, test_histogram_buckets);
	tcase_add_test(tc, test_histogram_threads);
	tcase_add_test(tc, test_render);
	tcase_add_test(tc, test_render_grows);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(metrics_suite());
}
