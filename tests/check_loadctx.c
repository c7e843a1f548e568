/* SPDX-License-Identifier: MIT */
/*
 * check_loadctx.c - the pool of read contexts (chunk/loadctx.h): contexts
 * come back from the free list, at most `keep` are kept, buffers grow and
 * stay huge-page aligned, a record beyond the buffer limit gets its own
 * buffer, warm contexts are touched and counted.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/util.h"
#include "chunk/loadctx.h"
#include "testlib.h"

static struct ckpt_loadctx_stats stats(ckpt_loadctx_pool *p)
{
	struct ckpt_loadctx_stats st;

	ckpt_loadctx_stats(p, &st);
	return st;
}

START_TEST(test_get_put_keep)
{
	ckpt_loadctx_pool *p = NULL;
	ckpt_loadctx *a, *b, *c;

	ckpt_loadctx_pool_free(NULL);
	ck_assert_int_eq(ckpt_loadctx_pool_new(2, &p), 0);
	a = ckpt_loadctx_get(p);
	b = ckpt_loadctx_get(p);
	c = ckpt_loadctx_get(p);
	ck_assert(a && b && c && a != b && b != c);
	ck_assert_ptr_nonnull(ckpt_loadctx_dc(a));
	ck_assert_uint_eq(stats(p).made, 3);
	ckpt_loadctx_put(p, a);
	ckpt_loadctx_put(p, b);
	ckpt_loadctx_put(p, c); /* the third is freed: keep 2 */
	ck_assert_uint_eq(stats(p).free, 2);
	/* the free list hands them out again without making new ones */
	a = ckpt_loadctx_get(p);
	b = ckpt_loadctx_get(p);
	ck_assert_uint_eq(stats(p).made, 3);
	ck_assert_uint_eq(stats(p).free, 0);
	ckpt_loadctx_put(p, a);
	ckpt_loadctx_put(p, b);
	ckpt_loadctx_pool_free(p);
}
END_TEST

START_TEST(test_buffers)
{
	ckpt_loadctx_pool *p = NULL;
	ckpt_loadctx *x;
	uint8_t *a, *b, *big;
	void *own = (void *)1;

	ck_assert_int_eq(ckpt_loadctx_pool_new(4, &p), 0);
	x = ckpt_loadctx_get(p);
	a = ckpt_loadctx_buf(x, 5000, &own);
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_null(own);
	ck_assert_uint_eq((uintptr_t)a % CKPT_HUGE_ALIGN, 0);
	memset(a, 1, 5000);
	/* the same buffer while it is large enough, a larger one after */
	ck_assert_ptr_eq(ckpt_loadctx_buf(x, CKPT_HUGE_ALIGN, &own), a);
	b = ckpt_loadctx_buf(x, CKPT_HUGE_ALIGN + 1, &own);
	ck_assert_ptr_nonnull(b);
	ck_assert_ptr_null(own);
	ck_assert_uint_eq((uintptr_t)b % CKPT_HUGE_ALIGN, 0);
	memset(b, 2, CKPT_HUGE_ALIGN + 1);
	/* beyond the limit: a buffer of the load's own */
	big = ckpt_loadctx_buf(x, CKPT_LOADCTX_BUF_MAX + 1, &own);
	ck_assert_ptr_nonnull(big);
	ck_assert_ptr_eq(big, own);
	ck_assert_uint_eq((uintptr_t)big % CKPT_CHUNK_BUF_ALIGN, 0);
	big[CKPT_LOADCTX_BUF_MAX] = 3;
	free(own);
	ckpt_loadctx_put(p, x);
	ckpt_loadctx_pool_free(p);
}
END_TEST

START_TEST(test_warm)
{
	ckpt_loadctx_pool *p = NULL;
	ckpt_loadctx *x;
	unsigned char vec[16];
	void *own;
	uint8_t *a;

	ck_assert_int_eq(ckpt_loadctx_pool_new(16, &p), 0);
	ckpt_loadctx_warm(p, 3, 3u << 20, 1u << 20);
	ck_assert_uint_eq(stats(p).made, 3);
	ck_assert_uint_eq(stats(p).warm, 3);
	ck_assert_uint_eq(stats(p).free, 3);
	/* a warm context's buffer is resident before anything writes to it */
	x = ckpt_loadctx_get(p);
	a = ckpt_loadctx_buf(x, 3u << 20, &own);
	ck_assert_ptr_null(own);
	ck_assert_int_eq(mincore(a, sizeof(vec) * 4096, vec), 0);
	for (size_t i = 0; i < sizeof(vec); i++)
		ck_assert_uint_eq(vec[i] & 1, 1);
	ckpt_loadctx_put(p, x);
	/* a buffer beyond the limit is not made warm */
	ckpt_loadctx_warm(p, 2, CKPT_LOADCTX_BUF_MAX + 1, 1u << 20);
	ck_assert_uint_eq(stats(p).warm, 3);
	ckpt_loadctx_pool_free(p);
}
END_TEST

static Suite *loadctx_suite(void)
{
	Suite *s = suite_create("loadctx");
	TCase *tc = tcase_create("pool");

	tcase_add_test(tc, test_get_put_keep);
	tcase_add_test(tc, test_buffers);
	tcase_add_test(tc, test_warm);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(loadctx_suite());
}
