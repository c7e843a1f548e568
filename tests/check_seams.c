/* SPDX-License-Identifier: MIT */
/*
 * check_seams.c - one store-level scenario run over every pair of a
 * registered chunk backend (chunk/backend.h) and a registered metadata
 * engine (meta/engine.h), chosen through the store options: create, write
 * files (with a duplicate), commit, rename, overwrite, unlink, reopen,
 * fsck, gc, and a read-only open that sees the same tree.  Each table has
 * a new backend or engine is covered here by registering it.  The loop
 * index _i is backend * n_engines + engine.  A shared engine (PostgreSQL)
 * keeps the metadata in a new database of the suite's own server
 * (pglib.h), made once per test.
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "chunk/backend.h"
#include "meta/engine.h"
#include "store/file.h"
#include "store/store.h"
#include "pglib.h"
#include "testlib.h"

static char tdir[96]; /* per test, inside the test case's base directory */
static char spath[128];
static char where[256]; /* a shared engine's database, "" until made */

static void setup(void)
{
	tl_test_dir(tdir, sizeof(tdir));
	snprintf(spath, sizeof(spath), "%s/store", tdir);
	where[0] = 0;
}

static void teardown(void)
{
	tl_dir_remove(tdir);
}

static int count(bool backends)
{
	int n = 0;

	if (backends)
		while (ckpt_chunk_backends[n])
			n++;
	else
		while (ckpt_engine_at((size_t)n))
			n++;
	return n;
}

/* The store options of pair i. */
static struct ckpt_store_opts pair_opts(int i, enum ckpt_store_mode mode)
{
	struct ckpt_store_opts o;
	int ne = count(false);

	ckpt_store_opts_init(&o);
	o.mode = mode;
	o.create = mode == CKPT_STORE_RW;
	o.chunk_backend = ckpt_chunk_backends[i / ne]->name;
	o.meta_engine = ckpt_engine_at((size_t)(i % ne))->name;
	if (ckpt_engine_at((size_t)(i % ne))->shared) {
		if (!where[0])
			tl_pg_new_db(where, sizeof(where));
		o.meta_where = where;
	}
	return o;
}

static ckpt_store *open_pair(int i, enum ckpt_store_mode mode)
{
	struct ckpt_store_opts o = pair_opts(i, mode);

	return tl_store_open(spath, &o);
}

static uint64_t lookup(ckpt_store *s, uint64_t dir, const char *name)
{
	struct ckpt_inode in;

	ck_assert_msg(ckpt_store_lookup(s, dir, name, &in) == 0, "lookup %s", name);
	return in.ino;
}

static void expect_content(ckpt_store *s, uint64_t dir, const char *name, const uint8_t *want,
			   size_t len)
{
	size_t got_len = 0;
	uint8_t *got = tl_read_file(s, lookup(s, dir, name), &got_len);

	ck_assert_uint_eq(got_len, len);
	ck_assert_msg(memcmp(got, want, len) == 0, "content of %s", name);
	free(got);
}

static void count_problem(void *ud, const char *path, const char *what)
{
	(void)path;
	(void)what;
	++*(int *)ud;
}

static void expect_fsck_clean(ckpt_store *s)
{
	int n = 0;

	ck_assert_int_eq(ckpt_store_fsck(s, count_problem, &n), 0);
	ck_assert_int_eq(n, 0);
}

START_TEST(test_store_scenario)
{
	const size_t big = 700000, small = 5000;
	uint8_t *a = tl_random_buf(big, 1), *b2 = tl_random_buf(big, 2);
	uint8_t *c = tl_random_buf(small, 3), *e = tl_random_buf(big, 4);
	struct ckpt_store_stats st;
	struct ckpt_gc_stats gs;
	ckpt_pool *pool;
	ckpt_store *s = open_pair(_i, CKPT_STORE_RW);
	uint64_t d, ino_e;
	char err[512];

	ck_assert_int_eq(ckpt_pool_new(2, &pool), 0);
	d = tl_mknode(s, CKPT_ROOT_INO, "d", S_IFDIR | 0755);
	tl_write_file(s, pool, d, "a", a, big);
	tl_write_file(s, pool, d, "b", a, big); /* the same chunks as a */
	tl_write_file(s, pool, d, "c", c, small);
	ino_e = tl_write_file(s, pool, CKPT_ROOT_INO, "e", e, big);
	st = tl_flushed_stats(s);
	ck_assert_uint_eq(st.files, 4);
	ck_assert_uint_eq(st.dirs, 2);
	ck_assert_uint_eq(st.logical_bytes, 3 * big + small);
	ck_assert_uint_lt(st.unique_bytes, 2 * big + small + 1); /* b deduplicated */
	expect_fsck_clean(s);

	/* namespace changes, and content that replaces content */
	ck_assert_int_eq(ckpt_store_rename(s, d, "a", CKPT_ROOT_INO, "a2", 0), 0);
	tl_write_file(s, pool, d, "b", b2, big);
	ck_assert_int_eq(ckpt_store_unlink(s, d, "c", false), 0);
	ck_assert_int_eq(ckpt_store_unlink(s, CKPT_ROOT_INO, "e", false), 0);
	ckpt_pool_free(pool);
	ckpt_store_free(s); /* e is an orphan: the next open reaps it */

	s = open_pair(_i, CKPT_STORE_RW);
	expect_content(s, CKPT_ROOT_INO, "a2", a, big);
	expect_content(s, d, "b", b2, big);
	{
		struct ckpt_inode in;
		ck_assert_int_eq(ckpt_store_lookup(s, d, "a", &in), -ENOENT);
		ck_assert_int_eq(ckpt_store_lookup(s, d, "c", &in), -ENOENT);
		ck_assert_int_eq(ckpt_store_lookup(s, CKPT_ROOT_INO, "e", &in), -ENOENT);
		ck_assert_int_eq(ckpt_store_getattr(s, ino_e, &in), -ENOENT);
	}
	expect_fsck_clean(s);
	st = tl_flushed_stats(s);
	ck_assert_uint_eq(st.files, 2);
	ck_assert_uint_gt(st.dead_chunks, 0); /* c's and e's */

	/* gc drops them and keeps every live byte readable */
	ck_assert_int_eq(ckpt_store_gc(s, &gs), 0);
	ck_assert_uint_eq(gs.chunks_dropped, st.dead_chunks);
	st = tl_flushed_stats(s);
	ck_assert_uint_eq(st.dead_chunks, 0);
	expect_fsck_clean(s);
	expect_content(s, CKPT_ROOT_INO, "a2", a, big);
	expect_content(s, d, "b", b2, big);
	ckpt_store_free(s);

	/* a read-only open beside nothing sees the same tree */
	s = open_pair(_i, CKPT_STORE_RO_SHARED);
	ck_assert(!ckpt_store_writable(s));
	expect_content(s, CKPT_ROOT_INO, "a2", a, big);
	expect_content(s, d, "b", b2, big);
	expect_fsck_clean(s);
	ck_assert_int_eq(ckpt_store_mknode(s, d, "x", S_IFREG | 0644, 0, 0, NULL,
					   &(struct ckpt_inode){ 0 }),
			 -EROFS);
	ckpt_store_free(s);

	/* the pair's names are what the store opened: an unknown one is refused */
	{
		struct ckpt_store_opts o = pair_opts(_i, CKPT_STORE_RW);

		o.meta_engine = "no-such-engine";
		s = NULL;
		ck_assert_int_eq(ckpt_store_open(spath, &o, &s, err, sizeof(err)), -EINVAL);
		ck_assert_ptr_null(s);
		ck_assert_msg(strstr(err, "no-such-engine") != NULL, "%s", err);
		o = pair_opts(_i, CKPT_STORE_RW);
		o.chunk_backend = "no-such-backend";
		ck_assert_int_eq(ckpt_store_open(spath, &o, &s, err, sizeof(err)), -EINVAL);
		ck_assert_msg(strstr(err, "no-such-backend") != NULL, "%s", err);
	}
	free(a);
	free(b2);
	free(c);
	free(e);
}
END_TEST

static Suite *seams_suite(void)
{
	Suite *s = suite_create("seams");
	TCase *tc = tcase_create("backend x engine");

	tl_tcase_dirs(tc, "check_seams-");
	tcase_add_unchecked_fixture(tc, tl_pg_start, tl_pg_stop);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_store_scenario, 0, count(true) * count(false));
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(seams_suite());
}
