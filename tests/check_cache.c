/* SPDX-License-Identifier: MIT */
/*
 * check_cache.c - unit tests for core/chunk/cache.c (bounded LRU chunk cache).
 *
 * Every test works on a private cache; nothing touches the file system.
 * The stress test runs 4 threads over a small key space so that lookups,
 * inserts of the same digest, releases and evictions race.
 */
#include <check.h>
#include <sys/mman.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chunk/cache.h"
#include "base/util.h"
#include "testlib.h"

/* malloc'd buffer of len bytes, every byte = fill. */
static uint8_t *blob(size_t len, uint8_t fill)
{
	uint8_t *p = malloc(len ? len : 1);

	ck_assert_ptr_nonnull(p);
	memset(p, fill, len);
	return p;
}

static struct ckpt_cache_stats stats(ckpt_cache *c)
{
	struct ckpt_cache_stats st;

	memset(&st, 0xa5, sizeof(st));
	ckpt_cache_get_stats(c, &st);
	return st;
}

/* The pinned entry of d and its data, or NULL (counted a miss) when d is
 * absent: acquire, and a placeholder it makes abandoned at once. */
static ckpt_cache_entry *c_lookup(ckpt_cache *c, const ckpt_digest *d, const uint8_t **ret_data,
				  size_t *ret_len)
{
	bool fill;
	ckpt_cache_entry *e = ckpt_cache_acquire(c, d, ret_data, ret_len, &fill);

	ck_assert_ptr_nonnull(e);
	if (fill) {
		ckpt_cache_abandon(c, e);
		return NULL;
	}
	return e;
}

/* data (malloc'd, always taken) as d's entry, returned pinned: a new one
 * filled (no hit or miss counted), or the one present (data freed). */
static ckpt_cache_entry *c_insert(ckpt_cache *c, const ckpt_digest *d, uint8_t *data, size_t len,
				  const uint8_t **ret_data)
{
	ckpt_cache_entry *e = ckpt_cache_reserve(c, d);
	bool fill = true;
	size_t elen;

	if (!e) /* present or being loaded; or gone again (other threads) */
		e = ckpt_cache_acquire(c, d, ret_data, &elen, &fill);
	ck_assert_ptr_nonnull(e);
	if (fill)
		*ret_data = ckpt_cache_fill_as(c, e, data, len, false);
	else
		free(data);
	return e;
}

static bool present(ckpt_cache *c, uint32_t k)
{
	ckpt_digest d = tl_digest(k);
	const uint8_t *data;
	size_t len;
	ckpt_cache_entry *e = c_lookup(c, &d, &data, &len);

	ckpt_cache_release(c, e);
	return e != NULL;
}

START_TEST(test_new_free)
{
	ckpt_cache *c = NULL;
	struct ckpt_cache_stats st;

	ckpt_cache_free(NULL);
	ck_assert_int_eq(ckpt_cache_new(1000, &c), 0);
	ck_assert_ptr_nonnull(c);
	st = stats(c);
	ck_assert_uint_eq(st.hits, 0);
	ck_assert_uint_eq(st.misses, 0);
	ck_assert_uint_eq(st.bytes, 0);
	ck_assert_uint_eq(st.entries, 0);
	ck_assert_uint_eq(st.evictions, 0);
	ckpt_cache_release(c, NULL); /* no-op */
	ckpt_cache_free(c);
}
END_TEST

START_TEST(test_hit_miss)
{
	ckpt_cache *c;
	ckpt_digest d = tl_digest(1), d2 = tl_digest(2);
	const uint8_t *data = NULL, *data2 = NULL;
	size_t len = 0;
	ckpt_cache_entry *e, *e2;
	struct ckpt_cache_stats st;

	ck_assert_int_eq(ckpt_cache_new(1 << 20, &c), 0);
	ck_assert_ptr_null(c_lookup(c, &d, &data, &len));
	e = c_insert(c, &d, blob(100, 0x11), 100, &data);
	ck_assert_ptr_nonnull(e);
	ck_assert_ptr_nonnull(data);
	ck_assert_uint_eq(data[0], 0x11);
	ck_assert_uint_eq(data[99], 0x11);
	ckpt_cache_release(c, e);

	e2 = c_lookup(c, &d, &data2, &len);
	ck_assert_ptr_eq(e2, e);
	ck_assert_ptr_eq(data2, data);
	ck_assert_uint_eq(len, 100);
	ckpt_cache_release(c, e2);
	/* another digest still misses */
	ck_assert_ptr_null(c_lookup(c, &d2, &data2, &len));

	st = stats(c);
	ck_assert_uint_eq(st.hits, 1);
	ck_assert_uint_eq(st.misses, 2);
	ck_assert_uint_eq(st.bytes, 100);
	ck_assert_uint_eq(st.entries, 1);
	ck_assert_uint_eq(st.evictions, 0);
	ckpt_cache_free(c);
}
END_TEST

/* Two digests that land in the same hash bucket (same first 8 bytes) must
 * still be told apart. */
START_TEST(test_same_bucket)
{
	ckpt_cache *c;
	ckpt_digest a, b;
	const uint8_t *data;
	size_t len;
	ckpt_cache_entry *e;

	memset(&a, 0x42, sizeof(a));
	b = a;
	b.bytes[15] ^= 1;
	ck_assert_int_eq(ckpt_cache_new(1 << 20, &c), 0);
	ckpt_cache_release(c, c_insert(c, &a, blob(10, 0xaa), 10, &data));
	ck_assert_ptr_null(c_lookup(c, &b, &data, &len));
	ckpt_cache_release(c, c_insert(c, &b, blob(20, 0xbb), 20, &data));
	e = c_lookup(c, &a, &data, &len);
	ck_assert_ptr_nonnull(e);
	ck_assert_uint_eq(len, 10);
	ck_assert_uint_eq(data[0], 0xaa);
	ckpt_cache_release(c, e);
	e = c_lookup(c, &b, &data, &len);
	ck_assert_ptr_nonnull(e);
	ck_assert_uint_eq(len, 20);
	ck_assert_uint_eq(data[0], 0xbb);
	ckpt_cache_release(c, e);
	ckpt_cache_free(c);
}
END_TEST

START_TEST(test_pin_prevents_eviction)
{
	ckpt_cache *c;
	ckpt_digest a = tl_digest(1), b = tl_digest(2);
	const uint8_t *da, *db;
	ckpt_cache_entry *ea, *eb;
	struct ckpt_cache_stats st;

	ck_assert_int_eq(ckpt_cache_new(100, &c), 0);
	ea = c_insert(c, &a, blob(60, 1), 60, &da);
	eb = c_insert(c, &b, blob(60, 2), 60, &db);
	ck_assert_ptr_nonnull(ea);
	ck_assert_ptr_nonnull(eb);
	/* Over capacity, but both pinned: nothing may go. */
	st = stats(c);
	ck_assert_uint_eq(st.bytes, 120);
	ck_assert_uint_eq(st.entries, 2);
	ck_assert_uint_eq(st.evictions, 0);
	ck_assert_uint_eq(da[59], 1);
	ck_assert_uint_eq(db[59], 2);

	/* Releasing b makes it the only evictable entry: it goes, a stays. */
	ckpt_cache_release(c, eb);
	st = stats(c);
	ck_assert_uint_eq(st.bytes, 60);
	ck_assert_uint_eq(st.entries, 1);
	ck_assert_uint_eq(st.evictions, 1);
	ck_assert_uint_eq(da[0], 1); /* still valid: pinned */
	ckpt_cache_release(c, ea);
	st = stats(c);
	ck_assert_uint_eq(st.bytes, 60);
	ck_assert_uint_eq(st.entries, 1);
	ck_assert(present(c, 1));
	ck_assert(!present(c, 2));
	ckpt_cache_free(c);
}
END_TEST

/* A pinned entry pinned twice needs two releases before it can go. */
START_TEST(test_double_pin)
{
	ckpt_cache *c;
	ckpt_digest a = tl_digest(7);
	const uint8_t *d1, *d2;
	size_t len;
	ckpt_cache_entry *e1, *e2;
	struct ckpt_cache_stats st;

	ck_assert_int_eq(ckpt_cache_new(0, &c), 0);
	e1 = c_insert(c, &a, blob(50, 9), 50, &d1);
	e2 = c_lookup(c, &a, &d2, &len);
	ck_assert_ptr_eq(e1, e2);
	ckpt_cache_release(c, e1);
	st = stats(c);
	ck_assert_uint_eq(st.entries, 1); /* still pinned once */
	ck_assert_uint_eq(d2[49], 9);
	ckpt_cache_release(c, e2);
	st = stats(c);
	ck_assert_uint_eq(st.entries, 0);
	ck_assert_uint_eq(st.bytes, 0);
	ck_assert_uint_eq(st.evictions, 1);
	ckpt_cache_free(c);
}
END_TEST

START_TEST(test_lru_order)
{
	ckpt_cache *c;
	const uint8_t *data;
	size_t len;

	ck_assert_int_eq(ckpt_cache_new(100, &c), 0);
	for (uint32_t k = 1; k <= 2; k++) {
		ckpt_digest d = tl_digest(k);
		ckpt_cache_release(c, c_insert(c, &d, blob(40, (uint8_t)k), 40, &data));
	}
	/* touch 1: 2 becomes least recently used */
	ck_assert(present(c, 1));
	{
		ckpt_digest d = tl_digest(3);
		ckpt_cache_release(c, c_insert(c, &d, blob(40, 3), 40, &data));
	}
	ck_assert(present(c, 1));
	ck_assert(!present(c, 2));
	ck_assert(present(c, 3));
	ck_assert_uint_eq(stats(c).evictions, 1);
	ck_assert_uint_eq(stats(c).bytes, 80);
	/* an entry larger than the capacity is evicted as soon as released,
	 * and takes everything older with it */
	{
		ckpt_digest d = tl_digest(4);
		ckpt_cache_entry *e = c_insert(c, &d, blob(150, 4), 150, &data);
		ck_assert_ptr_nonnull(e);
		ck_assert_uint_eq(stats(c).bytes, 150); /* 1 and 3 evicted already */
		ck_assert_uint_eq(data[149], 4);
		ckpt_cache_release(c, e);
	}
	ck_assert_uint_eq(stats(c).bytes, 0);
	ck_assert_uint_eq(stats(c).entries, 0);
	ck_assert(!present(c, 4));
	(void)len;
	ckpt_cache_free(c);
}
END_TEST

/* After every release with nothing pinned: bytes <= capacity. */
START_TEST(test_capacity_bound)
{
	const uint64_t cap = 10000;
	ckpt_cache *c;
	uint32_t seed = 12345;
	uint64_t inserted = 0;

	ck_assert_int_eq(ckpt_cache_new(cap, &c), 0);
	for (int i = 0; i < 2000; i++) {
		ckpt_digest d;
		const uint8_t *data;
		size_t len;
		ckpt_cache_entry *e;
		uint32_t k;

		seed = seed * 1103515245u + 12345u;
		k = (seed >> 8) % 300;
		len = 1 + (seed >> 20) % 2500;
		d = tl_digest(k);
		e = c_lookup(c, &d, &data, &len);
		if (!e) {
			e = c_insert(c, &d, blob(len, (uint8_t)k), len, &data);
			ck_assert_ptr_nonnull(e);
			inserted++;
		}
		ck_assert_uint_eq(data[0], (uint8_t)k);
		ckpt_cache_release(c, e);
		ck_assert_uint_le(stats(c).bytes, cap);
	}
	{
		struct ckpt_cache_stats st = stats(c);
		ck_assert_uint_eq(st.hits + st.misses, 2000);
		ck_assert_uint_eq(st.misses, inserted);
		ck_assert_uint_gt(st.evictions, 0);
		ck_assert_uint_ge(inserted, st.evictions + st.entries);
		ck_assert_uint_eq(inserted, st.evictions + st.entries);
	}
	ckpt_cache_free(c);
}
END_TEST

START_TEST(test_capacity_zero)
{
	ckpt_cache *c;
	ckpt_digest d = tl_digest(5);
	const uint8_t *data;
	size_t len;
	ckpt_cache_entry *e;
	struct ckpt_cache_stats st;

	ck_assert_int_eq(ckpt_cache_new(0, &c), 0);
	e = c_insert(c, &d, blob(4096, 0x5a), 4096, &data);
	ck_assert_ptr_nonnull(e);
	ck_assert_uint_eq(data[4095], 0x5a);
	st = stats(c);
	ck_assert_uint_eq(st.entries, 1);
	ck_assert_uint_eq(st.bytes, 4096);
	ckpt_cache_release(c, e);
	st = stats(c);
	ck_assert_uint_eq(st.entries, 0);
	ck_assert_uint_eq(st.bytes, 0);
	ck_assert_ptr_null(c_lookup(c, &d, &data, &len));
	/* zero-length data is accepted too */
	e = c_insert(c, &d, malloc(1), 0, &data);
	ck_assert_ptr_nonnull(e);
	ckpt_cache_release(c, e);
	ckpt_cache_free(c);
}
END_TEST

START_TEST(test_duplicate_insert)
{
	ckpt_cache *c;
	ckpt_digest d = tl_digest(9);
	const uint8_t *d1, *d2, *d3;
	size_t len;
	ckpt_cache_entry *e1, *e2, *e3;
	struct ckpt_cache_stats st;

	ck_assert_int_eq(ckpt_cache_new(1 << 20, &c), 0);
	e1 = c_insert(c, &d, blob(32, 0x01), 32, &d1);
	/* the second buffer is freed by the cache (valgrind checks) */
	e2 = c_insert(c, &d, blob(64, 0x02), 64, &d2);
	ck_assert_ptr_eq(e1, e2);
	ck_assert_ptr_eq(d1, d2);
	ck_assert_uint_eq(d2[0], 0x01);
	st = stats(c);
	ck_assert_uint_eq(st.entries, 1);
	ck_assert_uint_eq(st.bytes, 32);
	ckpt_cache_release(c, e1);
	/* while unpinned, a duplicate insert pins it again */
	e3 = c_insert(c, &d, blob(8, 0x03), 8, &d3);
	ck_assert_ptr_eq(e3, e1);
	ck_assert_uint_eq(d3[31], 0x01);
	ckpt_cache_release(c, e2);
	ckpt_cache_release(c, e3);
	e1 = c_lookup(c, &d, &d1, &len);
	ck_assert_ptr_nonnull(e1);
	ck_assert_uint_eq(len, 32);
	ckpt_cache_release(c, e1);
	ckpt_cache_free(c);
}
END_TEST

/* Many entries: the hash table grows; every entry stays findable. */
START_TEST(test_many_entries)
{
	ckpt_cache *c;
	const uint32_t n = 5000;

	ck_assert_int_eq(ckpt_cache_new(UINT64_MAX, &c), 0);
	for (uint32_t k = 0; k < n; k++) {
		ckpt_digest d = tl_digest(k);
		const uint8_t *data;
		ckpt_cache_entry *e = c_insert(c, &d, blob(4, (uint8_t)k), 4, &data);
		ck_assert_ptr_nonnull(e);
		ckpt_cache_release(c, e);
	}
	ck_assert_uint_eq(stats(c).entries, n);
	ck_assert_uint_eq(stats(c).bytes, 4ull * n);
	for (uint32_t k = 0; k < n; k++) {
		ckpt_digest d = tl_digest(k);
		const uint8_t *data;
		size_t len;
		ckpt_cache_entry *e = c_lookup(c, &d, &data, &len);
		ck_assert_ptr_nonnull(e);
		ck_assert_uint_eq(len, 4);
		ck_assert_uint_eq(data[3], (uint8_t)k);
		ckpt_cache_release(c, e);
	}
	ck_assert_uint_eq(stats(c).hits, n);
	ck_assert_uint_eq(stats(c).evictions, 0);
	ckpt_cache_free(c); /* frees unpinned entries (valgrind checks) */
}
END_TEST

/* ---- multi-threaded stress ---- */

#define ST_THREADS 4
#define ST_KEYS 64
#define ST_CAP 20000

struct stress_arg {
	ckpt_cache *c;
	uint32_t seed;
	int iters;
	long lookups, bad;
};

static size_t key_len(uint32_t k)
{
	return 100 + (k * 97) % 900;
}

static bool check_data(const uint8_t *data, size_t len, uint32_t k)
{
	if (len != key_len(k))
		return false;
	for (size_t i = 0; i < len; i++)
		if (data[i] != (uint8_t)(k + i))
			return false;
	return true;
}

static void *stress_main(void *p)
{
	struct stress_arg *a = p;

	for (int i = 0; i < a->iters; i++) {
		uint32_t k;
		ckpt_digest d;
		const uint8_t *data;
		size_t len;
		ckpt_cache_entry *e;

		a->seed = a->seed * 1664525u + 1013904223u;
		k = (a->seed >> 16) % ST_KEYS;
		d = tl_digest(k);
		e = c_lookup(a->c, &d, &data, &len);
		a->lookups++;
		if (!e) {
			uint8_t *buf;
			len = key_len(k);
			buf = malloc(len);
			if (!buf) {
				a->bad++;
				continue;
			}
			for (size_t j = 0; j < len; j++)
				buf[j] = (uint8_t)(k + j);
			e = c_insert(a->c, &d, buf, len, &data);
			if (!e) {
				a->bad++;
				continue;
			}
		}
		if (!check_data(data, key_len(k), k))
			a->bad++;
		ckpt_cache_release(a->c, e);
	}
	return NULL;
}

START_TEST(test_stress_threads)
{
	ckpt_cache *c;
	pthread_t th[ST_THREADS];
	struct stress_arg a[ST_THREADS];
	struct ckpt_cache_stats st;
	long lookups = 0;

	ck_assert_int_eq(ckpt_cache_new(ST_CAP, &c), 0);
	for (int t = 0; t < ST_THREADS; t++) {
		a[t] = (struct stress_arg){ .c = c, .seed = 1000u + (uint32_t)t, .iters = 20000 };
		ck_assert_int_eq(pthread_create(&th[t], NULL, stress_main, &a[t]), 0);
	}
	for (int t = 0; t < ST_THREADS; t++) {
		ck_assert_int_eq(pthread_join(th[t], NULL), 0);
		ck_assert_int_eq(a[t].bad, 0);
		lookups += a[t].lookups;
	}
	st = stats(c);
	ck_assert_uint_ge(st.hits + st.misses, (uint64_t)lookups); /* a racing insert may hit too */
	ck_assert_uint_gt(st.hits, 0);
	ck_assert_uint_gt(st.evictions, 0);
	/* nothing pinned any more: the bound holds */
	ck_assert_uint_le(st.bytes, ST_CAP);
	ck_assert_uint_le(st.entries, ST_KEYS);
	/* bytes agrees with the entries actually present */
	{
		uint64_t sum = 0, n = 0;
		for (uint32_t k = 0; k < ST_KEYS; k++) {
			ckpt_digest d = tl_digest(k);
			const uint8_t *data;
			size_t len;
			ckpt_cache_entry *e = c_lookup(c, &d, &data, &len);
			if (e) {
				ck_assert(check_data(data, len, k));
				sum += len;
				n++;
				ckpt_cache_release(c, e);
			}
		}
		ck_assert_uint_eq(sum, stats(c).bytes);
		ck_assert_uint_eq(n, stats(c).entries);
	}
	ckpt_cache_free(c);
}
END_TEST

/* acquire: a miss returns a placeholder to fill; lookups miss it, a second
 * acquire waits for it and then hits; abandon lets a waiter load itself. */
struct waiter {
	ckpt_cache *c;
	ckpt_digest d;
	const uint8_t *data;
	size_t len;
	bool fill;
	ckpt_cache_entry *e;
};

static void *acquire_thread(void *p)
{
	struct waiter *w = p;

	w->e = ckpt_cache_acquire(w->c, &w->d, &w->data, &w->len, &w->fill);
	return NULL;
}

START_TEST(test_single_flight)
{
	ckpt_cache *c;
	ckpt_digest d = tl_digest(7);
	const uint8_t *data;
	size_t len;
	bool fill;
	ckpt_cache_entry *e, *e2;
	struct waiter w = { 0 };
	pthread_t t;

	ck_assert_int_eq(ckpt_cache_new(1000, &c), 0);
	e = ckpt_cache_acquire(c, &d, &data, &len, &fill);
	ck_assert_ptr_nonnull(e);
	ck_assert(fill);
	ck_assert_ptr_null(ckpt_cache_reserve(c, &d)); /* being loaded: nothing to do */
	w.c = c;
	w.d = d;
	ck_assert_int_eq(pthread_create(&t, NULL, acquire_thread, &w), 0);
	usleep(20000); /* the waiter blocks until fill */
	ck_assert_ptr_nonnull(ckpt_cache_fill_as(c, e, blob(100, 0x42), 100, false));
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	ck_assert_ptr_nonnull(w.e);
	ck_assert(!w.fill);
	ck_assert_uint_eq(w.len, 100);
	ck_assert_uint_eq(w.data[99], 0x42);
	ck_assert_uint_eq(stats(c).bytes, 100);
	ckpt_cache_release(c, w.e);
	ckpt_cache_release(c, e);

	/* abandon: a waiter gets a placeholder of its own */
	d = tl_digest(8);
	e = ckpt_cache_acquire(c, &d, &data, &len, &fill);
	ck_assert(fill);
	memset(&w, 0, sizeof(w));
	w.c = c;
	w.d = d;
	ck_assert_int_eq(pthread_create(&t, NULL, acquire_thread, &w), 0);
	usleep(20000);
	ckpt_cache_abandon(c, e);
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	ck_assert_ptr_nonnull(w.e);
	ck_assert(w.fill);
	ckpt_cache_fill_as(c, w.e, blob(10, 1), 10, false);
	ckpt_cache_release(c, w.e);

	/* reserve on an absent digest, fill, then hits; ref needs its own release */
	d = tl_digest(9);
	e = ckpt_cache_reserve(c, &d);
	ck_assert_ptr_nonnull(e);
	ckpt_cache_fill_as(c, e, blob(20, 2), 20, false);
	ckpt_cache_ref(c, e);
	ckpt_cache_release(c, e);
	ckpt_cache_release(c, e);
	e2 = c_lookup(c, &d, &data, &len);
	ck_assert_ptr_eq(e2, e);
	ck_assert_uint_eq(len, 20);
	ckpt_cache_release(c, e2);
	ck_assert_uint_eq(stats(c).bytes, 130);
	ckpt_cache_free(c);
}
END_TEST

/* Pooled chunk buffers: a freed buffer is reused for the next one of its
 * size class; pooled entries go back to the pool when evicted. */
START_TEST(test_buf_pool)
{
	ckpt_cache *c;
	ckpt_digest d = tl_digest(11);
	ckpt_cache_entry *e;
	uint8_t *a, *b;

	/* capacity 0: an entry is evicted at its last release */
	ck_assert_int_eq(ckpt_cache_new(0, &c), 0);
	a = ckpt_cache_buf_alloc(c, 1000);
	ck_assert_ptr_nonnull(a);
	memset(a, 0x5a, 1000);
	ckpt_cache_buf_free(c, a, 1000);
	b = ckpt_cache_buf_alloc(c, 2000); /* same 128 KiB class */
	ck_assert_ptr_eq(a, b);
	e = ckpt_cache_reserve(c, &d);
	ck_assert_ptr_nonnull(e);
	ckpt_cache_fill_buf(c, e, b, 2000, false, true);
	ckpt_cache_release(c, e); /* evicted: the buffer goes back to the pool */
	ck_assert(!present(c, 11));
	ck_assert_ptr_eq(ckpt_cache_buf_alloc(c, 1), a);
	ckpt_cache_buf_free(c, a, 1);
	a = ckpt_cache_buf_alloc(c, 3u << 20); /* another class */
	ck_assert_ptr_nonnull(a);
	a[(3u << 20) - 1] = 1;
	ckpt_cache_buf_free(c, a, 3u << 20);
	ckpt_cache_free(c); /* unmaps the pool */
}
END_TEST

/* Chunk sizes vary, so the pool serves other classes too: a smaller free
 * buffer is grown (its pages, and so its bytes, move along: no fresh
 * memory for them), a larger one within twice the class is used as it is,
 * a much larger one is shrunk; an entry in a pooled buffer is charged the
 * buffer's mapped size. */
START_TEST(test_buf_reuse_other_class)
{
	const size_t G = 128u << 10;
	struct ckpt_cache_stats st;
	ckpt_cache *c;
	ckpt_digest d = tl_digest(12);
	ckpt_cache_entry *e;
	uint8_t *a, *b;
	size_t i;

	ck_assert_int_eq(ckpt_cache_new(0, &c), 0); /* entries go at their last release */
	a = ckpt_cache_buf_alloc(c, 600u << 10); /* class 5 */
	ck_assert_ptr_nonnull(a);
	for (i = 0; i < (600u << 10); i++)
		a[i] = (uint8_t)(i * 7);
	ckpt_cache_buf_free(c, a, 600u << 10);
	b = ckpt_cache_buf_alloc(c, 1100u << 10); /* class 9: grows the class 5 one */
	ck_assert_ptr_nonnull(b);
	for (i = 0; i < (600u << 10); i++)
		if (b[i] != (uint8_t)(i * 7))
			ck_abort_msg("byte %zu of the grown buffer changed", i);
	memset(b, 1, 1100u << 10);
	ckpt_cache_get_stats(c, &st);
	ck_assert_uint_eq(st.bufs_fresh, 1);
	ck_assert_uint_eq(st.bufs_resized, 1);
	ckpt_cache_buf_free(c, b, 1100u << 10);
	a = ckpt_cache_buf_alloc(c, 600u << 10); /* class 5 takes the class 9 one as it is */
	ck_assert_ptr_eq(a, b);
	e = ckpt_cache_reserve(c, &d);
	ck_assert_ptr_nonnull(e);
	ckpt_cache_fill_buf(c, e, a, 600u << 10, true, true);
	ckpt_cache_get_stats(c, &st);
	ck_assert_uint_eq(st.bytes, 9 * G);
	ck_assert_uint_eq(st.stream_bytes, 9 * G);
	ck_assert_uint_eq(st.bufs_pooled, 1);
	ckpt_cache_release(c, e); /* evicted */
	ckpt_cache_get_stats(c, &st);
	ck_assert_uint_eq(st.bytes, 0);
	ck_assert_uint_eq(st.stream_bytes, 0);
	a = ckpt_cache_buf_alloc(c, 1000); /* class 1: shrinks the class 9 one */
	ck_assert_ptr_nonnull(a);
	memset(a, 2, 1000);
	ckpt_cache_get_stats(c, &st);
	ck_assert_uint_eq(st.bufs_resized, 2);
	ck_assert_uint_eq(st.bufs_fresh, 1);
	e = ckpt_cache_reserve(c, &d);
	ckpt_cache_fill_buf(c, e, a, 1000, false, true);
	ckpt_cache_get_stats(c, &st);
	ck_assert_uint_eq(st.bytes, G);
	ckpt_cache_release(c, e);
	ckpt_cache_free(c);
}
END_TEST

/* The reserve: runs of it first (first fit), touched memory, never pooled
 * or remapped, the pool and new mappings once it is full. */
START_TEST(test_buf_reserve)
{
	const size_t G = 128u << 10;
	struct ckpt_cache_stats st;
	ckpt_cache *c, *c2;
	ckpt_digest d = tl_digest(13);
	ckpt_cache_entry *e;
	unsigned char vec[(8 * (128u << 10)) / 4096];
	uint8_t *a, *b, *f, *x;
	size_t i;

	/* capacity 0: an entry goes at its last release */
	ck_assert_int_eq(ckpt_cache_new(0, &c), 0);
	ck_assert_int_eq(ckpt_cache_reserve_bufs(NULL, 1u << 20), -EINVAL);
	ck_assert_int_eq(ckpt_cache_reserve_bufs(c, 1u << 20), 0); /* 8 units of 128 KiB */
	ck_assert_int_eq(ckpt_cache_reserve_bufs(c, 1u << 20), -EINVAL); /* only once */
	a = ckpt_cache_buf_alloc(c, 600u << 10); /* 5 units */
	b = ckpt_cache_buf_alloc(c, 300u << 10); /* 3 units: the rest */
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_eq(b, a + 5 * G);
	/* the whole reserve is resident before anything writes to it */
	ck_assert_int_eq(mincore(a - 64, 8 * G, vec), 0);
	for (i = 0; i < sizeof(vec); i++)
		ck_assert_uint_eq(vec[i] & 1, 1);
	f = ckpt_cache_buf_alloc(c, 1000); /* full: a new mapping */
	ck_assert_ptr_nonnull(f);
	ck_assert(f < a - 64 || f >= a - 64 + 8 * G);
	ckpt_cache_get_stats(c, &st);
	ck_assert_uint_eq(st.bufs_reserve, 2);
	ck_assert_uint_eq(st.bufs_fresh, 1);
	for (i = 0; i < (300u << 10); i++)
		b[i] = (uint8_t)(i * 3);
	ckpt_cache_buf_free(c, b, 300u << 10);
	ckpt_cache_buf_free(c, f, 1000); /* to the pool */
	x = ckpt_cache_buf_alloc(c, 200u << 10); /* 2 units: first fit is b's run */
	ck_assert_ptr_eq(x, b);
	for (i = 0; i < (200u << 10); i++) /* the same memory, not remapped */
		if (x[i] != (uint8_t)(i * 3))
			ck_abort_msg("byte %zu of the reserve changed", i);
	ckpt_cache_buf_free(c, a, 600u << 10);
	a = ckpt_cache_buf_alloc(c, 1000); /* 1 unit: the reserve's start, not the pool */
	ck_assert_ptr_eq(a, x - 5 * G);
	ckpt_cache_get_stats(c, &st);
	ck_assert_uint_eq(st.bufs_reserve, 4);
	ck_assert_uint_eq(st.bufs_pooled, 0);
	/* 5 units free, but not 5 in one run (4 + 1): the pool's buffer grown */
	b = ckpt_cache_buf_alloc(c, 600u << 10);
	ck_assert_ptr_nonnull(b);
	ckpt_cache_get_stats(c, &st);
	ck_assert_uint_eq(st.bufs_resized, 1);
	ckpt_cache_buf_free(c, b, 600u << 10);
	/* a reserve buffer in the cache counts its run, and goes back to the
	 * reserve when the entry goes */
	e = ckpt_cache_reserve(c, &d);
	ck_assert_ptr_nonnull(e);
	ckpt_cache_fill_buf(c, e, x, 200u << 10, true, true);
	ckpt_cache_get_stats(c, &st);
	ck_assert_uint_eq(st.bytes, 2 * G);
	ckpt_cache_release(c, e); /* evicted: its run goes back to the reserve */
	x = ckpt_cache_buf_alloc(c, 850u << 10); /* 7 units: the freed run and around it */
	ck_assert_ptr_eq(x, a + G);
	ckpt_cache_buf_free(c, x, 850u << 10);
	ckpt_cache_buf_free(c, a, 1000);
	ckpt_cache_free(c);

	/* less than one unit: no reserve */
	ck_assert_int_eq(ckpt_cache_new(64u << 20, &c2), 0);
	ck_assert_int_eq(ckpt_cache_reserve_bufs(c2, 1000), 0);
	a = ckpt_cache_buf_alloc(c2, 1000);
	ckpt_cache_get_stats(c2, &st);
	ck_assert_uint_eq(st.bufs_reserve, 0);
	ck_assert_uint_eq(st.bufs_fresh, 1);
	ckpt_cache_buf_free(c2, a, 1000);
	ckpt_cache_free(c2);
}
END_TEST

/* Stream a chunk into the cache as read-ahead does: reserve, fill as a
 * stream entry, release. */
static void put_stream(ckpt_cache *c, uint32_t k, size_t len)
{
	ckpt_digest d = tl_digest(k);
	ckpt_cache_entry *e = ckpt_cache_reserve(c, &d);

	ck_assert_ptr_nonnull(e);
	ckpt_cache_fill_as(c, e, blob(len, (uint8_t)k), len, true);
	ckpt_cache_release(c, e);
}

/* A reader takes n bytes of chunk k. */
static void read_part(ckpt_cache *c, uint32_t k, size_t n)
{
	ckpt_digest d = tl_digest(k);
	const uint8_t *data;
	size_t len;
	ckpt_cache_entry *e = c_lookup(c, &d, &data, &len);

	ck_assert_ptr_nonnull(e);
	ckpt_cache_release_read(c, e, n);
}

/* Over the stream budget, chunks read to the end go before chunks not yet
 * read to the end, whatever their age; the parts read by several readers
 * add up. */
START_TEST(test_stream_read_first_evicted)
{
	const size_t L = 1000;
	struct ckpt_cache_stats st;
	ckpt_cache *c;

	/* a stream budget of 3 L: a quarter of the capacity */
	ck_assert_int_eq(ckpt_cache_new(12 * L, &c), 0);
	put_stream(c, 1, L); /* oldest */
	put_stream(c, 2, L);
	put_stream(c, 3, L);
	read_part(c, 1, L / 2); /* half of 1: another reader needs the rest */
	read_part(c, 3, L / 2);
	read_part(c, 3, L / 2); /* 3 read to the end by two readers */
	read_part(c, 2, L / 4);
	put_stream(c, 4, L); /* over the budget: 3 goes, though the newest */
	ck_assert(present(c, 1));
	ck_assert(present(c, 2));
	ck_assert(!present(c, 3));
	ck_assert(present(c, 4));
	st = stats(c);
	ck_assert_uint_eq(st.evicted_unread, 0);
	put_stream(c, 5, L); /* none read to the end: the least recent goes */
	ck_assert(!present(c, 1));
	st = stats(c);
	ck_assert_uint_eq(st.evicted_unread, 1);
	ck_assert_uint_eq(st.stream_bytes, 3 * L);
	ckpt_cache_free(c);
}
END_TEST

static Suite *cache_suite(void)
{
	Suite *s = suite_create("cache");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_new_free);
	tcase_add_test(tc, test_hit_miss);
	tcase_add_test(tc, test_same_bucket);
	tcase_add_test(tc, test_pin_prevents_eviction);
	tcase_add_test(tc, test_double_pin);
	tcase_add_test(tc, test_lru_order);
	tcase_add_test(tc, test_capacity_bound);
	tcase_add_test(tc, test_capacity_zero);
	tcase_add_test(tc, test_duplicate_insert);
	tcase_add_test(tc, test_many_entries);
	tcase_add_test(tc, test_stress_threads);
	tcase_add_test(tc, test_single_flight);
	tcase_add_test(tc, test_stream_read_first_evicted);
	tcase_add_test(tc, test_buf_pool);
	tcase_add_test(tc, test_buf_reuse_other_class);
	tcase_add_test(tc, test_buf_reserve);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(cache_suite());
}
