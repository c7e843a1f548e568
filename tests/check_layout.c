// SPDX-License-Identifier: MIT
/*
 * check_layout.c - unit tests for core/views/layout.c
 */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "views/layout.h"
#include "testlib.h"

/* ---- helpers ---- */

static struct ckpt_box mkbox(unsigned ndim, const uint64_t *off, const uint64_t *shape)
{
	struct ckpt_box b;

	memset(&b, 0, sizeof(b));
	b.ndim = ndim;
	for (unsigned i = 0; i < ndim; i++) {
		b.off[i] = off ? off[i] : 0;
		b.shape[i] = shape[i];
	}
	return b;
}

#define BOX(n, offs, shapes) mkbox((n), (const uint64_t[])offs, (const uint64_t[])shapes)
#define L(...) { __VA_ARGS__ }

static struct ckpt_piece_geom mkpiece(struct ckpt_box b, bool flat, uint64_t fb, uint64_t fe)
{
	struct ckpt_piece_geom g;

	memset(&g, 0, sizeof(g));
	g.box = b;
	g.flat = flat;
	g.flat_begin = fb;
	g.flat_end = fe;
	return g;
}

struct run {
	uint64_t dst, src, len;
};

#define MAX_RECORD 64

struct recorder {
	struct run runs[MAX_RECORD];
	unsigned n;
	unsigned stop_after; /* 0: never */
	int stop_rc;
};

static int record_cb(void *ud, uint64_t dst, uint64_t src, uint64_t len)
{
	struct recorder *r = ud;

	ck_assert_uint_lt(r->n, MAX_RECORD);
	r->runs[r->n].dst = dst;
	r->runs[r->n].src = src;
	r->runs[r->n].len = len;
	r->n++;
	if (r->stop_after && r->n == r->stop_after)
		return r->stop_rc;
	return 0;
}

static void expect_runs(const struct ckpt_box *t, const struct ckpt_piece_geom *p, unsigned eb,
			const struct run *want, unsigned nwant)
{
	struct recorder r;

	memset(&r, 0, sizeof(r));
	ck_assert_int_eq(ckpt_box_runs(t, p, eb, record_cb, &r), 0);
	ck_assert_uint_eq(r.n, nwant);
	for (unsigned i = 0; i < nwant; i++) {
		ck_assert_uint_eq(r.runs[i].dst, want[i].dst);
		ck_assert_uint_eq(r.runs[i].src, want[i].src);
		ck_assert_uint_eq(r.runs[i].len, want[i].len);
	}
}

#define EXPECT_RUNS(t, p, eb, ...)                                                                 \
	do {                                                                                       \
		const struct run want_[] = { __VA_ARGS__ };                                        \
		expect_runs((t), (p), (eb), want_, sizeof(want_) / sizeof(want_[0]));              \
	} while (0)

static void expect_no_runs(const struct ckpt_box *t, const struct ckpt_piece_geom *p, unsigned eb)
{
	struct recorder r;

	memset(&r, 0, sizeof(r));
	ck_assert_int_eq(ckpt_box_runs(t, p, eb, record_cb, &r), 0);
	ck_assert_uint_eq(r.n, 0);
}

/* ---- view names ---- */

START_TEST(test_parse_accept)
{
	static const struct {
		const char *name;
		unsigned tp, pp;
	} ok[] = {
		{ "tp1_pp1", 1, 1 },	   { "tp2_pp4", 2, 4 },	      { "tp8_pp1", 8, 1 },
		{ "tp10_pp20", 10, 20 },   { "tp4096_pp4096", 4096, 4096 },
		{ "tp1_pp4096", 1, 4096 }, { "tp999_pp3", 999, 3 },
	};

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		struct ckpt_layout l = { 77, 77 };

		ck_assert_msg(ckpt_layout_parse(ok[i].name, &l) == 0, "%s", ok[i].name);
		ck_assert_uint_eq(l.tp, ok[i].tp);
		ck_assert_uint_eq(l.pp, ok[i].pp);
	}
}
END_TEST

START_TEST(test_parse_reject)
{
	static const char *const bad[] = {
		"",	       "tp",	     "tp_pp",	    "tp0_pp1",	  "tp1_pp0",  "tp01_pp1",
		"tp1_pp01",    "tp00_pp1",   "tp2_pp2x",    "TP2_pp2",	  "tp2_PP2",  "Tp2_pp2",
		"tp2pp2",      "tp2__pp2",   "tp2_pp",	    "tp_pp2",	  "tp+2_pp2", "tp-2_pp2",
		"tp2_pp+2",    " tp2_pp2",   "tp2_pp2 ",    "tp2 _pp2",	  "tp4097_pp1",
		"tp1_pp4097",  "tp10000_pp1", "tp99999999999999999999_pp1", "tp2_pp2/",
		"tp2_pp2_pp2", "xtp2_pp2",   "tp2-pp2",	    "tp0x2_pp2",  "tp2_p2",   "tp1e3_pp1",
		"tp2.0_pp2",   "tp\xd9\xa3_pp1",
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct ckpt_layout l = { 77, 78 };

		ck_assert_msg(ckpt_layout_parse(bad[i], &l) == -EINVAL, "accepted '%s'", bad[i]);
		ck_assert_uint_eq(l.tp, 77); /* untouched */
		ck_assert_uint_eq(l.pp, 78);
	}
	ck_assert_int_eq(ckpt_layout_parse(NULL, &(struct ckpt_layout){ 0, 0 }), -EINVAL);
	ck_assert_int_eq(ckpt_layout_parse("tp1_pp1", NULL), -EINVAL);
}
END_TEST

START_TEST(test_name_roundtrip)
{
	char buf[CKPT_LAYOUT_NAME_MAX];
	struct ckpt_layout l, back;
	static const unsigned vals[] = { 1, 2, 3, 9, 10, 99, 100, 1000, 4095, 4096 };

	for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
		for (size_t j = 0; j < sizeof(vals) / sizeof(vals[0]); j++) {
			int n;

			l.tp = vals[i];
			l.pp = vals[j];
			n = ckpt_layout_name(&l, buf, sizeof(buf));
			ck_assert_int_gt(n, 0);
			ck_assert_uint_eq((size_t)n, strlen(buf));
			ck_assert_int_eq(ckpt_layout_parse(buf, &back), 0);
			ck_assert_uint_eq(back.tp, l.tp);
			ck_assert_uint_eq(back.pp, l.pp);
		}
	}
	l.tp = 2;
	l.pp = 16;
	ck_assert_int_eq(ckpt_layout_name(&l, buf, sizeof(buf)), 8);
	ck_assert_str_eq(buf, "tp2_pp16");
	/* exact fit: 9 bytes for 8 chars + NUL; 8 is too small (truncated) */
	ck_assert_int_eq(ckpt_layout_name(&l, buf, 9), 8);
	ck_assert_int_eq(ckpt_layout_name(&l, buf, 8), -ENAMETOOLONG);
	ck_assert_str_eq(buf, "tp2_pp1");
	ck_assert_int_eq(ckpt_layout_name(&l, buf, 0), -ENAMETOOLONG);
	l.tp = 4096;
	l.pp = 4096;
	ck_assert_int_eq(ckpt_layout_name(&l, buf, sizeof(buf)), CKPT_LAYOUT_NAME_MAX - 1);
	ck_assert_str_eq(buf, "tp4096_pp4096");
	/* invalid layouts */
	l.tp = 0;
	ck_assert_int_eq(ckpt_layout_name(&l, buf, sizeof(buf)), -EINVAL);
	l.tp = 4097;
	ck_assert_int_eq(ckpt_layout_name(&l, buf, sizeof(buf)), -EINVAL);
	l.tp = 1;
	l.pp = 0;
	ck_assert_int_eq(ckpt_layout_name(&l, buf, sizeof(buf)), -EINVAL);
	ck_assert_int_eq(ckpt_layout_name(NULL, buf, sizeof(buf)), -EINVAL);
	l.pp = 1;
	ck_assert_int_eq(ckpt_layout_name(&l, NULL, 10), -EINVAL);
}
END_TEST

/* ---- tensor parallel ---- */

static void expect_tp(uint64_t size, unsigned parts, const uint64_t *bounds /* 2*parts */)
{
	for (unsigned t = 0; t < parts; t++) {
		uint64_t b = 99, e = 99;

		ckpt_tp_bounds(size, parts, t, &b, &e);
		ck_assert_msg(b == bounds[2 * t] && e == bounds[2 * t + 1],
			      "size %llu parts %u t %u: [%llu,%llu)", (unsigned long long)size,
			      parts, t, (unsigned long long)b, (unsigned long long)e);
	}
}

START_TEST(test_tp_bounds)
{
	uint64_t b, e;

	expect_tp(5, 4, (const uint64_t[]){ 0, 2, 2, 4, 4, 5, 5, 5 });
	expect_tp(8, 4, (const uint64_t[]){ 0, 2, 2, 4, 4, 6, 6, 8 });
	expect_tp(10, 3, (const uint64_t[]){ 0, 4, 4, 8, 8, 10 });
	expect_tp(2, 4, (const uint64_t[]){ 0, 1, 1, 2, 2, 2, 2, 2 });
	expect_tp(1, 3, (const uint64_t[]){ 0, 1, 1, 1, 1, 1 });
	expect_tp(0, 3, (const uint64_t[]){ 0, 0, 0, 0, 0, 0 });
	expect_tp(7, 1, (const uint64_t[]){ 0, 7 });
	/* 9 in 6: c = 2 -> 0-2 2-4 4-6 6-8 8-9 9-9 */
	expect_tp(9, 6, (const uint64_t[]){ 0, 2, 2, 4, 4, 6, 6, 8, 8, 9, 9, 9 });
	ckpt_tp_bounds(4096, 4096, 4095, &b, &e);
	ck_assert_uint_eq(b, 4095);
	ck_assert_uint_eq(e, 4096);
	ckpt_tp_bounds(4097, 4096, 4095, &b, &e); /* c = 2: parts 2049.. are empty */
	ck_assert_uint_eq(b, 4097);
	ck_assert_uint_eq(e, 4097);
	ckpt_tp_bounds(4097, 4096, 2048, &b, &e);
	ck_assert_uint_eq(b, 4096);
	ck_assert_uint_eq(e, 4097);
	/* t >= parts and parts == 0 */
	ckpt_tp_bounds(5, 4, 4, &b, &e);
	ck_assert_uint_eq(b, 5);
	ck_assert_uint_eq(e, 5);
	ckpt_tp_bounds(5, 0, 0, &b, &e);
	ck_assert_uint_eq(b, 0);
	ck_assert_uint_eq(e, 5);
	ckpt_tp_bounds(5, 0, 1, &b, &e);
	ck_assert_uint_eq(b, 5);
	ck_assert_uint_eq(e, 5);
	/* huge sizes: no overflow in ceil or t*c */
	ckpt_tp_bounds(UINT64_MAX, 2, 0, &b, &e);
	ck_assert_uint_eq(b, 0);
	ck_assert_uint_eq(e, UINT64_C(1) << 63);
	ckpt_tp_bounds(UINT64_MAX, 2, 1, &b, &e);
	ck_assert_uint_eq(b, UINT64_C(1) << 63);
	ck_assert_uint_eq(e, UINT64_MAX);
	ckpt_tp_bounds(UINT64_MAX, 4096, 4095, &b, &e);
	ck_assert_uint_eq(b, UINT64_C(4095) << 52);
	ck_assert_uint_eq(e, UINT64_MAX);
	/* NULL outputs are skipped */
	ckpt_tp_bounds(5, 4, 1, NULL, &e);
	ck_assert_uint_eq(e, 4);
	ckpt_tp_bounds(5, 4, 1, &b, NULL);
	ck_assert_uint_eq(b, 2);
}
END_TEST

/* Parts tile [0, size) in order, each at most ceil(size/parts). */
START_TEST(test_tp_bounds_tiling)
{
	for (uint64_t size = 0; size < 70; size++) {
		for (unsigned parts = 1; parts < 20; parts++) {
			uint64_t prev = 0, c = (size + parts - 1) / parts;

			for (unsigned t = 0; t < parts; t++) {
				uint64_t b, e;

				ckpt_tp_bounds(size, parts, t, &b, &e);
				ck_assert_uint_eq(b, prev);
				ck_assert_uint_le(b, e);
				ck_assert_uint_le(e - b, c);
				prev = e;
			}
			ck_assert_uint_eq(prev, size);
		}
	}
}
END_TEST

/* ---- pipeline parallel ---- */

START_TEST(test_pp_stage_tables)
{
	/* N=32, P=4: 8 layers per stage */
	for (uint64_t l = 0; l < 32; l++)
		ck_assert_uint_eq(ckpt_pp_stage_of_layer(l, 32, 4), (unsigned)(l / 8));
	/* N=30, P=4: boundaries floor(p*30/4) = 0, 7, 15, 22, 30 */
	static const unsigned s30[30] = { 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
					  2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3 };
	for (uint64_t l = 0; l < 30; l++)
		ck_assert_uint_eq(ckpt_pp_stage_of_layer(l, 30, 4), s30[l]);
	/* N=3, P=4: boundaries 0, 0, 1, 2, 3 -> stage 0 is empty */
	ck_assert_uint_eq(ckpt_pp_stage_of_layer(0, 3, 4), 1);
	ck_assert_uint_eq(ckpt_pp_stage_of_layer(1, 3, 4), 2);
	ck_assert_uint_eq(ckpt_pp_stage_of_layer(2, 3, 4), 3);
	/* N=1, P=3: boundaries 0, 0, 0, 1 -> the only layer on the last stage */
	ck_assert_uint_eq(ckpt_pp_stage_of_layer(0, 1, 3), 2);
	/* N=5, P=2: boundaries 0, 2, 5 */
	ck_assert_uint_eq(ckpt_pp_stage_of_layer(1, 5, 2), 0);
	ck_assert_uint_eq(ckpt_pp_stage_of_layer(2, 5, 2), 1);
	/* L >= N -> last stage; N == 0 -> stage 0; P == 1 -> 0 */
	ck_assert_uint_eq(ckpt_pp_stage_of_layer(30, 30, 4), 3);
	ck_assert_uint_eq(ckpt_pp_stage_of_layer(UINT64_MAX, 30, 4), 3);
	ck_assert_uint_eq(ckpt_pp_stage_of_layer(5, 0, 4), 0);
	ck_assert_uint_eq(ckpt_pp_stage_of_layer(0, 0, 4), 0);
	ck_assert_uint_eq(ckpt_pp_stage_of_layer(17, 32, 1), 0);
	ck_assert_uint_eq(ckpt_pp_stage_of_layer(3, 8, 0), 0);
	/* huge N: floor(p*N/P) exact without 128-bit products */
	uint64_t n = UINT64_MAX - 6;
	ck_assert_uint_eq(ckpt_pp_stage_of_layer(n / 2 - 1, n, 2), 0);
	ck_assert_uint_eq(ckpt_pp_stage_of_layer(n / 2, n, 2), 1);
	ck_assert_uint_eq(ckpt_pp_stage_of_layer(n - 1, n, 4096), 4095);
	ck_assert_uint_eq(ckpt_pp_stage_of_layer(0, n, 4096), 0);
}
END_TEST

/* Against the defining inequality, brute force. */
START_TEST(test_pp_stage_brute)
{
	for (uint64_t n = 1; n < 40; n++) {
		for (unsigned P = 1; P < 12; P++) {
			for (uint64_t l = 0; l < n; l++) {
				unsigned p = ckpt_pp_stage_of_layer(l, n, P);

				ck_assert_uint_lt(p, P);
				ck_assert_uint_le(p * n / P, l);
				ck_assert_uint_lt(l, (p + 1) * n / P);
			}
		}
	}
}
END_TEST

START_TEST(test_pp_on_stage)
{
	struct ckpt_pp pp = { CKPT_PP_LAYER, 9 };

	/* N=30, P=4: layer 9 on stage 1 */
	for (unsigned p = 0; p < 4; p++)
		ck_assert(ckpt_pp_on_stage(&pp, 30, 4, p) == (p == 1));
	pp.layer = 30; /* >= N: last stage */
	for (unsigned p = 0; p < 4; p++)
		ck_assert(ckpt_pp_on_stage(&pp, 30, 4, p) == (p == 3));
	pp.layer = 2;
	for (unsigned p = 0; p < 4; p++) /* N == 0: stage 0 */
		ck_assert(ckpt_pp_on_stage(&pp, 0, 4, p) == (p == 0));
	pp.kind = CKPT_PP_FIRST;
	for (unsigned p = 0; p < 4; p++)
		ck_assert(ckpt_pp_on_stage(&pp, 30, 4, p) == (p == 0));
	pp.kind = CKPT_PP_LAST;
	for (unsigned p = 0; p < 4; p++)
		ck_assert(ckpt_pp_on_stage(&pp, 30, 4, p) == (p == 3));
	pp.kind = CKPT_PP_ENDS;
	for (unsigned p = 0; p < 4; p++)
		ck_assert(ckpt_pp_on_stage(&pp, 30, 4, p) == (p == 0 || p == 3));
	ck_assert(ckpt_pp_on_stage(&pp, 30, 1, 0));
	pp.kind = CKPT_PP_ALL;
	for (unsigned p = 0; p < 4; p++)
		ck_assert(ckpt_pp_on_stage(&pp, 30, 4, p));
	/* out of range stage, P == 0, unknown kind, NULL */
	ck_assert(!ckpt_pp_on_stage(&pp, 30, 4, 4));
	ck_assert(!ckpt_pp_on_stage(&pp, 30, 0, 0));
	pp.kind = 5;
	ck_assert(!ckpt_pp_on_stage(&pp, 30, 4, 0));
	pp.kind = -1;
	ck_assert(!ckpt_pp_on_stage(&pp, 30, 4, 0));
	ck_assert(!ckpt_pp_on_stage(NULL, 30, 4, 0));
	/* fixed on-disk values */
	ck_assert_int_eq(CKPT_PP_LAYER, 0);
	ck_assert_int_eq(CKPT_PP_FIRST, 1);
	ck_assert_int_eq(CKPT_PP_LAST, 2);
	ck_assert_int_eq(CKPT_PP_ENDS, 3);
	ck_assert_int_eq(CKPT_PP_ALL, 4);
}
END_TEST

/* ---- boxes ---- */

START_TEST(test_box_elems)
{
	struct ckpt_box b;

	b = BOX(0, L(0), L(0));
	ck_assert_uint_eq(ckpt_box_elems(&b), 1);
	b = BOX(3, L(0, 0, 0), L(2, 3, 4));
	ck_assert_uint_eq(ckpt_box_elems(&b), 24);
	b = BOX(2, L(0, 0), L(UINT64_C(1) << 32, (UINT64_C(1) << 32) - 1));
	ck_assert_uint_eq(ckpt_box_elems(&b), UINT64_MAX - UINT32_MAX);
	b = BOX(2, L(0, 0), L(UINT64_C(1) << 32, UINT64_C(1) << 32));
	ck_assert_uint_eq(ckpt_box_elems(&b), UINT64_MAX);
	/* a zero dimension wins over an overflowing product */
	b = BOX(3, L(0, 0, 0), L(UINT64_C(1) << 40, UINT64_C(1) << 40, 0));
	ck_assert_uint_eq(ckpt_box_elems(&b), 0);
	b.ndim = CKPT_MAX_DIMS + 1;
	ck_assert_uint_eq(ckpt_box_elems(&b), UINT64_MAX);
	ck_assert_uint_eq(ckpt_box_elems(NULL), UINT64_MAX);
}
END_TEST

START_TEST(test_box_intersect)
{
	struct ckpt_box a, b, r;

	memset(&r, 0, sizeof(r));
	a = BOX(2, L(0, 0), L(4, 6));
	b = BOX(2, L(2, 3), L(5, 5));
	ck_assert(ckpt_box_intersect(&a, &b, &r));
	ck_assert_uint_eq(r.ndim, 2);
	ck_assert_uint_eq(r.off[0], 2);
	ck_assert_uint_eq(r.off[1], 3);
	ck_assert_uint_eq(r.shape[0], 2);
	ck_assert_uint_eq(r.shape[1], 3);
	/* symmetric, and ret may alias an input */
	ck_assert(ckpt_box_intersect(&b, &a, &b));
	ck_assert_mem_eq(&b, &r, sizeof(r));
	/* touching edges: empty */
	a = BOX(2, L(0, 0), L(4, 6));
	b = BOX(2, L(4, 0), L(1, 6));
	r.ndim = 99;
	ck_assert(!ckpt_box_intersect(&a, &b, &r));
	ck_assert_uint_eq(r.ndim, 99);
	b = BOX(2, L(0, 6), L(4, 1));
	ck_assert(!ckpt_box_intersect(&a, &b, NULL));
	/* a zero-size box intersects nothing, even inside */
	b = BOX(2, L(1, 1), L(0, 2));
	ck_assert(!ckpt_box_intersect(&a, &b, NULL));
	/* containment */
	b = BOX(2, L(1, 2), L(1, 1));
	ck_assert(ckpt_box_intersect(&a, &b, &r));
	ck_assert_mem_eq(&r.off, &b.off, 2 * sizeof(uint64_t));
	ck_assert_mem_eq(&r.shape, &b.shape, 2 * sizeof(uint64_t));
	/* scalars */
	a = BOX(0, L(0), L(0));
	b = a;
	ck_assert(ckpt_box_intersect(&a, &b, &r));
	ck_assert_uint_eq(r.ndim, 0);
	/* errors */
	a = BOX(2, L(0, 0), L(4, 6));
	b = BOX(1, L(0), L(4));
	ck_assert(!ckpt_box_intersect(&a, &b, &r));
	b = a;
	b.ndim = a.ndim = CKPT_MAX_DIMS + 1;
	ck_assert(!ckpt_box_intersect(&a, &b, &r));
	a = BOX(1, L(UINT64_MAX), L(2));
	b = BOX(1, L(0), L(UINT64_MAX));
	ck_assert(!ckpt_box_intersect(&a, &b, &r));
	ck_assert(!ckpt_box_intersect(NULL, &b, &r));
	ck_assert(!ckpt_box_intersect(&a, NULL, &r));
	/* the largest valid ends */
	a = BOX(1, L(UINT64_MAX - 2), L(2));
	b = BOX(1, L(0), L(UINT64_MAX));
	ck_assert(ckpt_box_intersect(&a, &b, &r));
	ck_assert_uint_eq(r.off[0], UINT64_MAX - 2);
	ck_assert_uint_eq(r.shape[0], 2);
}
END_TEST

/* ---- runs: exact lists ---- */

START_TEST(test_runs_identical)
{
	struct ckpt_box t = BOX(2, L(0, 0), L(4, 6));
	struct ckpt_piece_geom p = mkpiece(t, false, 0, 0);

	EXPECT_RUNS(&t, &p, 2, { 0, 0, 48 });
	/* identical boxes away from the origin, 3-D */
	t = BOX(3, L(5, 1, 7), L(2, 3, 4));
	p = mkpiece(t, false, 0, 0);
	EXPECT_RUNS(&t, &p, 4, { 0, 0, 96 });
	/* scalar */
	t = BOX(0, L(0), L(0));
	p = mkpiece(t, false, 0, 0);
	EXPECT_RUNS(&t, &p, 8, { 0, 0, 8 });
	/* identical 1-D */
	t = BOX(1, L(3), L(10));
	p = mkpiece(t, false, 0, 0);
	EXPECT_RUNS(&t, &p, 1, { 0, 0, 10 });
}
END_TEST

START_TEST(test_runs_2d_split)
{
	/* global [4, 6], 4-byte elements */
	struct ckpt_box t = BOX(2, L(0, 0), L(4, 3)); /* column split part 0 of 2 */
	struct ckpt_piece_geom p = mkpiece(BOX(2, L(2, 0), L(2, 6)), false, 0, 0); /* rows 2-3 */

	EXPECT_RUNS(&t, &p, 4, { 24, 0, 12 }, { 36, 24, 12 });
	/* the other way round: row split target, column split piece */
	t = BOX(2, L(2, 0), L(2, 6));
	p = mkpiece(BOX(2, L(0, 3), L(4, 3)), false, 0, 0);
	EXPECT_RUNS(&t, &p, 4, { 12, 24, 12 }, { 36, 36, 12 });
	/* row split vs row split: one block */
	t = BOX(2, L(1, 0), L(2, 6));
	p = mkpiece(BOX(2, L(2, 0), L(2, 6)), false, 0, 0);
	EXPECT_RUNS(&t, &p, 4, { 24, 0, 24 });
	/* column split vs column split, overlapping by one column */
	t = BOX(2, L(0, 0), L(4, 3));
	p = mkpiece(BOX(2, L(0, 2), L(4, 2)), false, 0, 0);
	EXPECT_RUNS(&t, &p, 1, { 2, 0, 1 }, { 5, 2, 1 }, { 8, 4, 1 }, { 11, 6, 1 });
	/* disjoint */
	t = BOX(2, L(0, 0), L(2, 6));
	p = mkpiece(BOX(2, L(2, 0), L(2, 6)), false, 0, 0);
	expect_no_runs(&t, &p, 4);
	/* empty target / empty piece */
	t = BOX(2, L(0, 0), L(0, 6));
	p = mkpiece(BOX(2, L(0, 0), L(4, 6)), false, 0, 0);
	expect_no_runs(&t, &p, 4);
	t = BOX(2, L(0, 0), L(4, 6));
	p = mkpiece(BOX(2, L(0, 0), L(4, 0)), false, 0, 0);
	expect_no_runs(&t, &p, 4);
}
END_TEST

START_TEST(test_runs_3d_merge)
{
	/* global [4, 3, 5]; target rows 1-2, piece rows 0-2: trailing dims whole in both */
	struct ckpt_box t = BOX(3, L(1, 0, 0), L(2, 3, 5));
	struct ckpt_piece_geom p = mkpiece(BOX(3, L(0, 0, 0), L(3, 3, 5)), false, 0, 0);

	EXPECT_RUNS(&t, &p, 2, { 0, 30, 60 });
	/* target split on dim 1, piece on dim 0: runs cover dims 1..2 (2*5 elements) */
	t = BOX(3, L(0, 1, 0), L(4, 2, 5));
	p = mkpiece(BOX(3, L(2, 0, 0), L(2, 3, 5)), false, 0, 0);
	EXPECT_RUNS(&t, &p, 2, { 40, 10, 20 }, { 60, 40, 20 });
	/* split on the last dim: one run per (dim0, dim1) */
	t = BOX(3, L(0, 0, 0), L(2, 2, 2));
	p = mkpiece(BOX(3, L(0, 0, 1), L(2, 2, 4)), false, 0, 0);
	EXPECT_RUNS(&t, &p, 1, { 1, 0, 1 }, { 3, 4, 1 }, { 5, 8, 1 }, { 7, 12, 1 });
	/* middle dim narrower than the target only: no merge across dim 0 */
	t = BOX(3, L(0, 0, 0), L(2, 3, 5));
	p = mkpiece(BOX(3, L(0, 1, 0), L(2, 1, 5)), false, 0, 0);
	EXPECT_RUNS(&t, &p, 1, { 5, 0, 5 }, { 20, 5, 5 });
	/* size-1 dims that agree merge: [2,1,3] in [2,1,3] */
	t = BOX(3, L(0, 0, 0), L(2, 1, 3));
	p = mkpiece(BOX(3, L(0, 0, 0), L(3, 1, 3)), false, 0, 0);
	EXPECT_RUNS(&t, &p, 1, { 0, 0, 6 });
}
END_TEST

START_TEST(test_runs_flat)
{
	/* global [4, 4], piece = whole tensor flattened, 2-byte elements */
	struct ckpt_box whole = BOX(2, L(0, 0), L(4, 4));
	struct ckpt_box cols23 = BOX(2, L(0, 2), L(4, 2));
	struct ckpt_piece_geom p;

	/* starts and ends mid-row: elements 1..6 */
	p = mkpiece(whole, true, 1, 7);
	EXPECT_RUNS(&cols23, &p, 2, { 0, 2, 4 }, { 4, 10, 2 });
	EXPECT_RUNS(&whole, &p, 2, { 2, 0, 12 });
	/* several rows: elements 2..13 */
	p = mkpiece(whole, true, 2, 14);
	EXPECT_RUNS(&cols23, &p, 2, { 0, 0, 4 }, { 4, 8, 4 }, { 8, 16, 4 });
	/* whole target: head, middle block and tail merge into one run */
	EXPECT_RUNS(&whole, &p, 2, { 4, 0, 24 });
	/* whole range */
	p = mkpiece(whole, true, 0, 16);
	EXPECT_RUNS(&whole, &p, 2, { 0, 0, 32 });
	EXPECT_RUNS(&cols23, &p, 2, { 0, 4, 4 }, { 4, 12, 4 }, { 8, 20, 4 }, { 12, 28, 4 });
	/* entirely outside the target (row 0, cols 0-1) */
	p = mkpiece(whole, true, 0, 2);
	expect_no_runs(&cols23, &p, 2);
	p = mkpiece(whole, true, 4, 6);
	expect_no_runs(&cols23, &p, 2);
	/* zero length */
	p = mkpiece(whole, true, 5, 5);
	expect_no_runs(&whole, &p, 2);
	p = mkpiece(whole, true, 16, 16);
	expect_no_runs(&whole, &p, 2);
	/* last element only */
	p = mkpiece(whole, true, 15, 16);
	EXPECT_RUNS(&cols23, &p, 2, { 14, 0, 2 });
	/* flat piece over a sub-box (rows 1-2): box elements 3..5 = (1,3) (2,0) (2,1) */
	p = mkpiece(BOX(2, L(1, 0), L(2, 4)), true, 3, 6);
	EXPECT_RUNS(&whole, &p, 2, { 14, 0, 6 });
	EXPECT_RUNS(&cols23, &p, 2, { 6, 0, 2 });
	/* 3-D: global [2, 3, 4], flat [5, 19) = (0,1,1) .. (1,1,2), target dim 1 rows 1-2 */
	struct ckpt_box t3 = BOX(3, L(0, 1, 0), L(2, 2, 4));
	p = mkpiece(BOX(3, L(0, 0, 0), L(2, 3, 4)), true, 5, 19);
	/* (0,1,1..3),(0,2,0..3) contiguous in both -> dst 1..7 src 0..6;
	 * (1,1,0..2) -> dst 8..10 src 11..13 */
	EXPECT_RUNS(&t3, &p, 1, { 1, 0, 7 }, { 8, 11, 3 });
	/* scalar: [0,1) is the element, [0,0) and [1,1) nothing */
	struct ckpt_box s = BOX(0, L(0), L(0));
	p = mkpiece(s, true, 0, 1);
	EXPECT_RUNS(&s, &p, 4, { 0, 0, 4 });
	p = mkpiece(s, true, 0, 0);
	expect_no_runs(&s, &p, 4);
	p = mkpiece(s, true, 1, 1);
	expect_no_runs(&s, &p, 4);
}
END_TEST

START_TEST(test_runs_errors)
{
	struct ckpt_box t = BOX(2, L(0, 0), L(4, 4));
	struct ckpt_piece_geom p = mkpiece(t, false, 0, 0);
	struct recorder r;
	struct ckpt_box big;

	memset(&r, 0, sizeof(r));
	ck_assert_int_eq(ckpt_box_runs(NULL, &p, 4, record_cb, &r), -EINVAL);
	ck_assert_int_eq(ckpt_box_runs(&t, NULL, 4, record_cb, &r), -EINVAL);
	ck_assert_int_eq(ckpt_box_runs(&t, &p, 4, NULL, &r), -EINVAL);
	ck_assert_int_eq(ckpt_box_runs(&t, &p, 0, record_cb, &r), -EINVAL);
	/* ndim mismatch and too many dims */
	p.box.ndim = 1;
	ck_assert_int_eq(ckpt_box_runs(&t, &p, 4, record_cb, &r), -EINVAL);
	p.box.ndim = 3;
	ck_assert_int_eq(ckpt_box_runs(&t, &p, 4, record_cb, &r), -EINVAL);
	big = BOX(0, L(0), L(0));
	big.ndim = CKPT_MAX_DIMS + 1;
	p = mkpiece(big, false, 0, 0);
	ck_assert_int_eq(ckpt_box_runs(&big, &p, 4, record_cb, &r), -EINVAL);
	/* flat range beyond the box, reversed */
	p = mkpiece(t, true, 3, 17);
	ck_assert_int_eq(ckpt_box_runs(&t, &p, 4, record_cb, &r), -EINVAL);
	p = mkpiece(t, true, 17, 17);
	ck_assert_int_eq(ckpt_box_runs(&t, &p, 4, record_cb, &r), -EINVAL);
	p = mkpiece(t, true, 5, 4);
	ck_assert_int_eq(ckpt_box_runs(&t, &p, 4, record_cb, &r), -EINVAL);
	p = mkpiece(BOX(0, L(0), L(0)), true, 0, 2);
	big = BOX(0, L(0), L(0));
	ck_assert_int_eq(ckpt_box_runs(&big, &p, 4, record_cb, &r), -EINVAL);
	/* a flat range of an empty box must be empty */
	p = mkpiece(BOX(2, L(0, 0), L(4, 0)), true, 0, 1);
	ck_assert_int_eq(ckpt_box_runs(&t, &p, 4, record_cb, &r), -EINVAL);
	ck_assert_uint_eq(r.n, 0);
}
END_TEST

START_TEST(test_runs_overflow)
{
	struct recorder r;
	struct ckpt_box t = BOX(2, L(0, 0), L(4, 4));
	struct ckpt_box huge;
	struct ckpt_piece_geom p;

	memset(&r, 0, sizeof(r));
	/* target element count overflows */
	huge = BOX(2, L(0, 0), L(UINT64_C(1) << 32, UINT64_C(1) << 32));
	p = mkpiece(t, false, 0, 0);
	ck_assert_int_eq(ckpt_box_runs(&huge, &p, 1, record_cb, &r), -EOVERFLOW);
	/* piece element count overflows */
	p = mkpiece(huge, false, 0, 0);
	ck_assert_int_eq(ckpt_box_runs(&t, &p, 1, record_cb, &r), -EOVERFLOW);
	p = mkpiece(huge, true, 0, 1);
	ck_assert_int_eq(ckpt_box_runs(&t, &p, 1, record_cb, &r), -EOVERFLOW);
	/* element count fits, bytes do not */
	huge = BOX(2, L(0, 0), L(UINT64_C(1) << 32, UINT64_C(1) << 31));
	p = mkpiece(t, false, 0, 0);
	ck_assert_int_eq(ckpt_box_runs(&huge, &p, 2, record_cb, &r), -EOVERFLOW);
	p = mkpiece(huge, false, 0, 0);
	ck_assert_int_eq(ckpt_box_runs(&t, &p, 2, record_cb, &r), -EOVERFLOW);
	/* ... but a small flat range of that box is fine (stored bytes fit) */
	p = mkpiece(huge, true, 2, 4);
	EXPECT_RUNS(&t, &p, 2, { 4, 0, 4 });
	/* with 1-byte elements the whole box fits */
	p = mkpiece(huge, false, 0, 0);
	EXPECT_RUNS(&t, &p, 1, { 0, 0, 4 }, { 4, UINT64_C(1) << 31, 4 },
		    { 8, UINT64_C(2) << 31, 4 }, { 12, UINT64_C(3) << 31, 4 });
	/* off + shape overflows */
	huge = BOX(2, L(UINT64_MAX, 0), L(2, 4));
	p = mkpiece(t, false, 0, 0);
	ck_assert_int_eq(ckpt_box_runs(&huge, &p, 1, record_cb, &r), -EOVERFLOW);
	p = mkpiece(huge, false, 0, 0);
	ck_assert_int_eq(ckpt_box_runs(&t, &p, 1, record_cb, &r), -EOVERFLOW);
	ck_assert_uint_eq(r.n, 0); /* no run before an error */
	/* boxes far from the origin are fine */
	huge = BOX(2, L(UINT64_MAX - 4, UINT64_MAX - 4), L(4, 4));
	p = mkpiece(BOX(2, L(UINT64_MAX - 3, UINT64_MAX - 4), L(1, 4)), false, 0, 0);
	EXPECT_RUNS(&huge, &p, 8, { 32, 0, 32 });
}
END_TEST

START_TEST(test_runs_cb_stop)
{
	struct ckpt_box t = BOX(2, L(0, 0), L(4, 3));
	struct ckpt_piece_geom p = mkpiece(BOX(2, L(0, 0), L(4, 6)), false, 0, 0);
	struct recorder r;

	memset(&r, 0, sizeof(r));
	r.stop_after = 1;
	r.stop_rc = 7;
	ck_assert_int_eq(ckpt_box_runs(&t, &p, 4, record_cb, &r), 7);
	ck_assert_uint_eq(r.n, 1);
	memset(&r, 0, sizeof(r));
	r.stop_after = 4; /* the last run (emitted at the end) */
	r.stop_rc = -EIO;
	ck_assert_int_eq(ckpt_box_runs(&t, &p, 4, record_cb, &r), -EIO);
	ck_assert_uint_eq(r.n, 4);
	memset(&r, 0, sizeof(r));
	r.stop_after = 2;
	r.stop_rc = -5;
	p = mkpiece(BOX(2, L(0, 0), L(4, 6)), true, 1, 20);
	ck_assert_int_eq(ckpt_box_runs(&t, &p, 4, record_cb, &r), -5);
	ck_assert_uint_eq(r.n, 2);
}
END_TEST

/* ---- runs: property test against an element-by-element reference ---- */

static uint64_t rng_state;

static uint64_t rnd(void)
{
	return tl_splitmix64(&rng_state);
}

static uint64_t rnd_below(uint64_t n)
{
	return n ? rnd() % n : 0;
}

/* A random sub-box of global shape g; sometimes a TP part along a dim. */
static struct ckpt_box rnd_box(unsigned ndim, const uint64_t *g)
{
	struct ckpt_box b;
	unsigned mode = (unsigned)rnd_below(4);

	memset(&b, 0, sizeof(b));
	b.ndim = ndim;
	for (unsigned k = 0; k < ndim; k++) {
		b.off[k] = 0;
		b.shape[k] = g[k];
	}
	if (ndim == 0 || mode == 0)
		return b; /* whole tensor */
	if (mode == 1) {
		unsigned d = (unsigned)rnd_below(ndim);
		unsigned parts = 1 + (unsigned)rnd_below(4);
		uint64_t lo, hi;

		ckpt_tp_bounds(g[d], parts, (unsigned)rnd_below(parts), &lo, &hi);
		b.off[d] = lo;
		b.shape[d] = hi - lo;
		return b;
	}
	for (unsigned k = 0; k < ndim; k++) {
		uint64_t lo = rnd_below(g[k] + 1), hi = rnd_below(g[k] + 1);

		if (lo > hi) {
			uint64_t tmp = lo;

			lo = hi;
			hi = tmp;
		}
		if (lo == hi && rnd_below(4)) /* keep empty boxes rare */
			hi = lo < g[k] ? lo + 1 : lo;
		if (lo == hi && lo > 0 && rnd_below(4))
			lo--;
		b.off[k] = lo;
		b.shape[k] = hi - lo;
	}
	return b;
}

static bool in_box(const struct ckpt_box *b, const uint64_t *x)
{
	for (unsigned k = 0; k < b->ndim; k++) {
		if (x[k] < b->off[k] || x[k] - b->off[k] >= b->shape[k])
			return false;
	}
	return true;
}

/* Row-major index of global coordinate x inside box b. */
static uint64_t lin(const struct ckpt_box *b, const uint64_t *x)
{
	uint64_t v = 0;

	for (unsigned k = 0; k < b->ndim; k++)
		v = v * b->shape[k] + (x[k] - b->off[k]);
	return v;
}

/* Advance x over box g (global coordinates from 0); false after the last. */
static bool next_coord(unsigned ndim, const uint64_t *g, uint64_t *x)
{
	for (unsigned k = ndim; k-- > 0;) {
		if (++x[k] < g[k])
			return true;
		x[k] = 0;
	}
	return false;
}

static void put_val(uint8_t *p, unsigned eb, uint64_t v)
{
	for (unsigned i = 0; i < eb; i++)
		p[i] = (uint8_t)(v >> (8 * (i % 8)));
}

struct apply {
	uint8_t *dst;
	const uint8_t *src;
	uint64_t dst_len, src_len;
	uint64_t nruns;
	bool have_prev;
	uint64_t pdst, psrc, plen;
};

static int apply_cb(void *ud, uint64_t dst, uint64_t src, uint64_t len)
{
	struct apply *a = ud;

	ck_assert_uint_gt(len, 0);
	ck_assert_uint_le(len, a->dst_len);
	ck_assert_uint_le(dst, a->dst_len - len);
	ck_assert_uint_le(len, a->src_len);
	ck_assert_uint_le(src, a->src_len - len);
	if (a->have_prev) {
		/* increasing, non-overlapping, and never mergeable with the previous */
		ck_assert_uint_ge(dst, a->pdst + a->plen);
		ck_assert(!(dst == a->pdst + a->plen && src == a->psrc + a->plen));
	}
	memcpy(a->dst + dst, a->src + src, len);
	a->have_prev = true;
	a->pdst = dst;
	a->psrc = src;
	a->plen = len;
	a->nruns++;
	return 0;
}

#define PROP_CASES 4000
#define PROP_MAX_DIM 5

START_TEST(test_runs_property)
{
	uint64_t g[CKPT_MAX_DIMS], x[CKPT_MAX_DIMS];
	uint8_t *global = NULL, *stored = NULL, *got = NULL, *want = NULL;
	uint64_t total_runs = 0;

	rng_state = 0x6c61796f7574ULL;
	global = malloc(8 * 1296); /* PROP_MAX_DIM+1 ^ 4 elements of up to 8 bytes */
	stored = malloc(8 * 1296);
	got = malloc(8 * 1296);
	want = malloc(8 * 1296);
	ck_assert(global && stored && got && want);

	for (int cs = 0; cs < PROP_CASES; cs++) {
		static const unsigned ebs[] = { 2, 3, 4, 8 };
		unsigned ndim = (unsigned)rnd_below(5); /* 0..4, mostly 1..4 */
		unsigned eb = ebs[rnd_below(4)];
		uint64_t gn = 1, tn, bn, fb = 0, fe = 0, nref = 0;
		struct ckpt_box t;
		struct ckpt_piece_geom p;
		struct apply a;
		bool have_prev = false;
		uint64_t pd = 0, ps = 0;
		int rc;

		if (ndim == 0 && rnd_below(3))
			ndim = 1 + (unsigned)rnd_below(4);
		for (unsigned k = 0; k < ndim; k++) {
			g[k] = 1 + rnd_below(PROP_MAX_DIM + 1);
			gn *= g[k];
		}
		/* global value of element i: i + 1 (never 0) */
		memset(x, 0, sizeof(x));
		for (uint64_t i = 0; i < gn; i++)
			put_val(global + i * eb, eb, i + 1);

		t = rnd_box(ndim, g);
		memset(&p, 0, sizeof(p));
		p.box = rnd_box(ndim, g);
		if (rnd_below(5) == 0)
			p.box = t;
		tn = ckpt_box_elems(&t);
		bn = ckpt_box_elems(&p.box);
		p.flat = rnd_below(2);
		if (p.flat) {
			fb = rnd_below(bn + 1);
			fe = rnd_below(bn + 1);
			if (fb > fe) {
				uint64_t tmp = fb;

				fb = fe;
				fe = tmp;
			}
			p.flat_begin = fb;
			p.flat_end = fe;
		}

		/* materialize the piece's stored bytes and the reference target */
		memset(stored, 0, 8 * 1296);
		memset(got, 0, 8 * 1296);
		memset(want, 0, 8 * 1296);
		memset(x, 0, sizeof(x));
		if (gn > 0) {
			uint64_t gi = 0;

			do {
				bool in_p = in_box(&p.box, x), in_t = in_box(&t, x);
				uint64_t li = in_p ? lin(&p.box, x) : 0;

				if (in_p && p.flat && (li < fb || li >= fe))
					in_p = false;
				if (in_p) {
					uint64_t so = p.flat ? li - fb : li;

					memcpy(stored + so * eb, global + gi * eb, eb);
					if (in_t) {
						uint64_t dd = lin(&t, x);

						memcpy(want + dd * eb, global + gi * eb, eb);
						/* count maximal runs: elements come in
						 * increasing order in both t and piece */
						if (!have_prev || dd != pd + 1 || so != ps + 1)
							nref++;
						have_prev = true;
						pd = dd;
						ps = so;
					}
				}
				gi++;
			} while (next_coord(ndim, g, x));
		}

		memset(&a, 0, sizeof(a));
		a.dst = got;
		a.src = stored;
		a.dst_len = tn * eb;
		a.src_len = (p.flat ? fe - fb : bn) * eb;
		rc = ckpt_box_runs(&t, &p, eb, apply_cb, &a);
		ck_assert_msg(rc == 0, "case %d rc %d", cs, rc);
		ck_assert_msg(memcmp(got, want, tn * eb) == 0, "case %d: bytes differ", cs);
		ck_assert_msg(a.nruns == nref, "case %d: %llu runs, %llu maximal", cs,
			      (unsigned long long)a.nruns, (unsigned long long)nref);
		total_runs += a.nruns;
	}
	ck_assert_uint_gt(total_runs, PROP_CASES); /* the generator produces real work */
	free(global);
	free(stored);
	free(got);
	free(want);
}
END_TEST

/* ---- runs: performance shape from the design ---- */

struct counter {
	uint64_t n, bytes, first_dst, first_src, last_dst, last_src, len;
};

static int count_cb(void *ud, uint64_t dst, uint64_t src, uint64_t len)
{
	struct counter *c = ud;

	if (c->n == 0) {
		c->first_dst = dst;
		c->first_src = src;
	}
	c->last_dst = dst;
	c->last_src = src;
	c->len = len;
	c->bytes += len;
	c->n++;
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

START_TEST(test_runs_big)
{
	/* 8192 x 4096 bf16: target = TP part 1 of 2 along dim 1, piece = all rows */
	struct ckpt_box t = BOX(2, L(0, 2048), L(8192, 2048));
	struct ckpt_piece_geom p = mkpiece(BOX(2, L(0, 0), L(8192, 4096)), false, 0, 0);
	struct counter c;
	double t0, dt;
	const int reps = 100;

	t0 = now_s();
	for (int i = 0; i < reps; i++) {
		memset(&c, 0, sizeof(c));
		ck_assert_int_eq(ckpt_box_runs(&t, &p, 2, count_cb, &c), 0);
	}
	dt = now_s() - t0;
	ck_assert_uint_eq(c.n, 8192);
	ck_assert_uint_eq(c.bytes, UINT64_C(8192) * 2048 * 2);
	ck_assert_uint_eq(c.first_dst, 0);
	ck_assert_uint_eq(c.first_src, 4096);
	ck_assert_uint_eq(c.last_dst, UINT64_C(8191) * 4096);
	ck_assert_uint_eq(c.last_src, UINT64_C(8191) * 8192 + 4096);
	ck_assert_uint_eq(c.len, 4096);
	fprintf(stderr, "layout: %.1f ns per run (8192 runs x %d)\n", dt * 1e9 / (8192.0 * reps),
		reps);
	ck_assert(dt / reps < 0.01); /* generous: << 1 us per run expected */

	/* FSDP: a flat shard of 1/64 of the whole tensor against the same target:
	 * only the 128 rows it touches are visited */
	p = mkpiece(BOX(2, L(0, 0), L(8192, 4096)), true, UINT64_C(3) * 524288 + 100,
		    UINT64_C(4) * 524288 + 100);
	memset(&c, 0, sizeof(c));
	ck_assert_int_eq(ckpt_box_runs(&t, &p, 2, count_cb, &c), 0);
	/* rows 384 (from col 100) .. 512 (up to col 100): row 384 cols 2048.., rows 385..511 */
	ck_assert_uint_eq(c.n, 128);
	ck_assert_uint_eq(c.first_dst, UINT64_C(384) * 2048 * 2);
	ck_assert_uint_eq(c.first_src, (UINT64_C(2048) - 100) * 2);
	ck_assert_uint_eq(c.bytes, UINT64_C(128) * 2048 * 2);
}
END_TEST

static Suite *layout_suite(void)
{
	Suite *s = suite_create("layout");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_parse_accept);
	tcase_add_test(tc, test_parse_reject);
	tcase_add_test(tc, test_name_roundtrip);
	tcase_add_test(tc, test_tp_bounds);
	tcase_add_test(tc, test_tp_bounds_tiling);
	tcase_add_test(tc, test_pp_stage_tables);
	tcase_add_test(tc, test_pp_stage_brute);
	tcase_add_test(tc, test_pp_on_stage);
	tcase_add_test(tc, test_box_elems);
	tcase_add_test(tc, test_box_intersect);
	tcase_add_test(tc, test_runs_identical);
	tcase_add_test(tc, test_runs_2d_split);
	tcase_add_test(tc, test_runs_3d_merge);
	tcase_add_test(tc, test_runs_flat);
	tcase_add_test(tc, test_runs_errors);
	tcase_add_test(tc, test_runs_overflow);
	tcase_add_test(tc, test_runs_cb_stop);
	tcase_add_test(tc, test_runs_property);
	tcase_add_test(tc, test_runs_big);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(layout_suite());
}
