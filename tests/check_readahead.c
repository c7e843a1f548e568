/* SPDX-License-Identifier: MIT */
/*
 * check_readahead.c - chunk read-ahead (store/readahead.h): the window
 * arithmetic, sequential-read detection, and the workers loading queued
 * chunks into a store's cache (loaded, skipped, failed and dropped counts;
 * the chunks they loaded are cache hits for the reader).
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "store/readahead.h"
#include "testlib.h"

static char dir[512];

static void setup(void)
{
	tl_test_dir(dir, sizeof(dir));
}

static void teardown(void)
{
	tl_dir_remove(dir);
}

/* Sequential-read detection of read-ahead. */
START_TEST(test_ra_window)
{
	struct ckpt_ra_window w = { 0 };
	const uint64_t M = 1 << 20, W = 8 * M, size = 100 * M;
	uint64_t from, to;
	bool seq;

	/* first read at 0: the next window */
	ck_assert(ckpt_ra_window_next(&w, 0, M, size, W, &from, &to, &seq));
	ck_assert_uint_eq(from, M);
	ck_assert_uint_eq(to, 9 * M);
	/* still more than half a window ahead: nothing */
	ck_assert(!ckpt_ra_window_next(&w, M, M, size, W, &from, &to, &seq));
	ck_assert(!ckpt_ra_window_next(&w, 2 * M, M, size, W, &from, &to, &seq));
	/* less than half a window queued beyond the read: top it up */
	ck_assert(!ckpt_ra_window_next(&w, 3 * M, M, size, W, &from, &to, &seq));
	ck_assert(ckpt_ra_window_next(&w, 5 * M, M, size, W, &from, &to, &seq));
	ck_assert_uint_ge(from, 9 * M);
	ck_assert_uint_eq(to, 14 * M);
	ck_assert(seq);
	/* a jump far away is random access */
	ck_assert(!ckpt_ra_window_next(&w, 60 * M, M, size, W, &from, &to, &seq));
	ck_assert(!seq);
	/* the end of the file bounds the window */
	ck_assert(ckpt_ra_window_next(&w, 61 * M, M, 64 * M, W, &from, &to, &seq));
	ck_assert_uint_eq(from, 62 * M);
	ck_assert_uint_eq(to, 64 * M);
	ck_assert(!ckpt_ra_window_next(&w, 63 * M, M, 64 * M, W, &from, &to, &seq));
	/* starting over at 0 restarts the window */
	ck_assert(ckpt_ra_window_next(&w, 0, M, size, W, &from, &to, &seq));
	ck_assert_uint_eq(from, M);
	ck_assert_uint_eq(to, 9 * M);
}
END_TEST

/* Direct readers' windows: 3/8 of the stream budget shared by the streams,
 * within [CKPT_RA_WINDOW_MIN, CKPT_RA_WINDOW_MAX]; a shrunk window still
 * tops up from where the reader is. */
START_TEST(test_ra_window_size)
{
	const uint64_t M = 1 << 20;
	struct ckpt_ra_window w = { 0 };
	uint64_t from, to;
	bool seq;

	ck_assert_uint_eq(CKPT_RA_WINDOW_MIN, 8 * M);
	ck_assert_uint_eq(CKPT_RA_WINDOW_MAX, 32 * M);
	ck_assert_uint_eq(ckpt_ra_window_size(64 * M, 0), 24 * M);
	ck_assert_uint_eq(ckpt_ra_window_size(64 * M, 1), 24 * M);
	ck_assert_uint_eq(ckpt_ra_window_size(64 * M, 2), 12 * M);
	ck_assert_uint_eq(ckpt_ra_window_size(64 * M, 3), 8 * M);
	ck_assert_uint_eq(ckpt_ra_window_size(64 * M, 100), 8 * M);
	ck_assert_uint_eq(ckpt_ra_window_size(256 * M, 1), 32 * M);
	ck_assert_uint_eq(ckpt_ra_window_size(256 * M, 2), 32 * M);
	ck_assert_uint_eq(ckpt_ra_window_size(256 * M, 4), 24 * M);
	ck_assert_uint_eq(ckpt_ra_window_size(0, 1), 8 * M);
	/* a reader alone queues 24 MiB ahead; when others start, its
	 * window shrinks to 8 MiB and the next top-up starts at the reader */
	ck_assert(ckpt_ra_window_next(&w, 0, M, 100 * M, ckpt_ra_window_size(64 * M, 1), &from,
				      &to, &seq));
	ck_assert_uint_eq(to, 25 * M);
	ck_assert(ckpt_ra_window_next(&w, M, M, 100 * M, ckpt_ra_window_size(64 * M, 4), &from,
				      &to, &seq));
	ck_assert_uint_eq(from, 2 * M);
	ck_assert_uint_eq(to, 10 * M);
	ck_assert(seq);
}
END_TEST

/* Reads a little out of order stay sequential; a queue ahead of the reader
 * by more than a window (the reader went back) is stale. */
START_TEST(test_window_slack_stale)
{
	const uint64_t M = 1ull << 20, win = 8 * M, size = 100 * M;
	struct ckpt_ra_window w;
	uint64_t from, to;
	bool seq;

	memset(&w, 0, sizeof(w));
	ck_assert(ckpt_ra_window_next(&w, 0, 10 * M, size, win, &from, &to, &seq));
	/* several FUSE threads: this read starts before the last one ended */
	(void)ckpt_ra_window_next(&w, 9 * M + M / 2, M, size, win, &from, &to, &seq);
	ck_assert(seq);
	ck_assert(!ckpt_ra_window_next(&w, 60 * M, M, size, win, &from, &to, &seq));
	ck_assert(!seq);
	memset(&w, 0, sizeof(w));
	ck_assert(ckpt_ra_window_next(&w, 0, 40 * M, size, win, &from, &to, &seq));
	ck_assert_uint_eq(to, 48 * M);
	ck_assert(ckpt_ra_window_next(&w, 0, M, size, win, &from, &to, &seq));
	ck_assert_uint_eq(from, M);
	ck_assert_uint_eq(to, M + win);
}
END_TEST

#define NCHUNK 24

/* Wait until every submitted digest was counted (loaded, skipped, failed
 * or dropped); the stats then. */
static struct ckpt_ra_stats settle(ckpt_readahead *ra)
{
	struct ckpt_ra_stats st;

	for (int i = 0; i < 2000; i++) {
		ckpt_readahead_get_stats(ra, &st);
		if (st.loaded + st.skipped + st.failed + st.dropped == st.submitted)
			return st;
		usleep(5000);
	}
	ck_abort_msg("read-ahead did not finish: submitted %llu loaded %llu skipped %llu "
		     "failed %llu dropped %llu", (unsigned long long)st.submitted,
		     (unsigned long long)st.loaded, (unsigned long long)st.skipped,
		     (unsigned long long)st.failed, (unsigned long long)st.dropped);
	return st;
}

static ckpt_store *store_with_chunks(bool sync_ra, ckpt_digest *d, uint8_t **data)
{
	struct ckpt_store_opts o;
	ckpt_store *s;

	ckpt_store_opts_init(&o);
	o.create = true;
	o.sync_readahead = sync_ra;
	s = tl_store_open(dir, &o);
	for (int i = 0; i < NCHUNK; i++) {
		data[i] = tl_random_buf(40000 + 1000 * (size_t)i, 500 + (uint64_t)i);
		ck_assert_int_eq(ckpt_store_put_chunk(s, data[i], 40000 + 1000 * (size_t)i, 0, &d[i]), 0);
	}
	return s;
}

/* Queued chunks are loaded into the cache: the reader then hits, and gets
 * the right bytes; chunks cached already are skipped. */
START_TEST(test_workers_load)
{
	ckpt_digest d[NCHUNK];
	uint8_t *data[NCHUNK];
	ckpt_store *s = store_with_chunks(_i, d, data);
	struct ckpt_cache_stats c0, c1;
	struct ckpt_ra_stats st;
	ckpt_readahead *ra = NULL;

	ck_assert_int_eq(ckpt_readahead_new(s, 3, 64, &ra), 0);
	ckpt_store_cache_stats(s, &c0);
	ckpt_readahead_submit(ra, d, NCHUNK);
	st = settle(ra);
	ck_assert_uint_eq(st.submitted, NCHUNK);
	ck_assert_uint_eq(st.loaded, NCHUNK);
	ck_assert_uint_eq(st.failed, 0);
	ck_assert_uint_eq(st.dropped, 0);
	for (int i = 0; i < NCHUNK; i++) {
		size_t len = 40000 + 1000 * (size_t)i;
		uint8_t *back = malloc(len);

		ck_assert_int_eq(ckpt_store_read_chunk(s, &d[i], 0, back, len), 0);
		ck_assert_mem_eq(back, data[i], len);
		free(back);
	}
	ckpt_store_cache_stats(s, &c1);
	ck_assert_uint_eq(c1.misses, c0.misses); /* every read was a hit */
	ck_assert_uint_ge(c1.hits, c0.hits + NCHUNK);
	/* all cached now: submitted again, they are skipped */
	ckpt_readahead_submit(ra, d, NCHUNK);
	st = settle(ra);
	ck_assert_uint_eq(st.skipped, NCHUNK);
	ck_assert_uint_eq(st.loaded, NCHUNK);
	ckpt_readahead_free(ra);
	ckpt_store_free(s);
	for (int i = 0; i < NCHUNK; i++)
		free(data[i]);
}
END_TEST

/* A digest the store does not have is counted failed (its reader reports
 * it); a queue that is full drops what does not fit. */
START_TEST(test_workers_fail_drop)
{
	ckpt_digest d[NCHUNK], many[200];
	uint8_t *data[NCHUNK];
	ckpt_store *s = store_with_chunks(false, d, data);
	struct ckpt_ra_stats st;
	ckpt_readahead *ra = NULL;

	ck_assert_int_eq(ckpt_readahead_new(s, 0, 4, &ra), 0);
	{
		ckpt_digest unknown[2] = { tl_digest(9001), tl_digest(9002) };

		ckpt_readahead_submit(ra, unknown, 2);
		st = settle(ra);
		ck_assert_uint_eq(st.failed, 2);
		ck_assert_uint_eq(st.loaded, 0);
	}
	/* one call fills the queue of 4 before any worker can take from it */
	for (int i = 0; i < 200; i++)
		many[i] = d[i % NCHUNK];
	ckpt_readahead_submit(ra, many, 200);
	st = settle(ra);
	ck_assert_uint_eq(st.submitted, 202);
	ck_assert_uint_eq(st.dropped, 196);
	ck_assert_uint_eq(st.loaded + st.skipped, 4);
	ckpt_readahead_submit(ra, many, 0);
	ckpt_readahead_submit(NULL, many, 1);
	ckpt_readahead_free(ra);
	ckpt_readahead_free(NULL);
	ck_assert_int_eq(ckpt_readahead_new(s, 1, 0, &ra), -EINVAL);
	ck_assert_int_eq(ckpt_readahead_new(NULL, 1, 4, &ra), -EINVAL);
	ckpt_store_free(s);
	for (int i = 0; i < NCHUNK; i++)
		free(data[i]);
}
END_TEST

/* Stopping with digests still queued drops them without loading. */
START_TEST(test_free_with_queue)
{
	ckpt_digest d[NCHUNK];
	uint8_t *data[NCHUNK];
	ckpt_store *s = store_with_chunks(false, d, data);
	ckpt_readahead *ra = NULL;

	ck_assert_int_eq(ckpt_readahead_new(s, 1, 1024, &ra), 0);
	for (int k = 0; k < 20; k++)
		ckpt_readahead_submit(ra, d, NCHUNK);
	ckpt_readahead_free(ra);
	ckpt_store_free(s);
	for (int i = 0; i < NCHUNK; i++)
		free(data[i]);
}
END_TEST

static Suite *readahead_suite(void)
{
	Suite *s = suite_create("readahead");
	TCase *w = tcase_create("window"), *tc = tcase_create("workers");

	tcase_add_test(w, test_ra_window);
	tcase_add_test(w, test_ra_window_size);
	tcase_add_test(w, test_window_slack_stale);
	suite_add_tcase(s, w);
	tl_tcase_dirs(tc, "check_readahead-");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_workers_load, 0, 2); /* AIO, then pread */
	tcase_add_test(tc, test_workers_fail_drop);
	tcase_add_test(tc, test_free_with_queue);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(readahead_suite());
}
