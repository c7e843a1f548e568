/* SPDX-License-Identifier: MIT */
/*
 * check_vcheck.c - unit tests for what opening a view file checks
 * (core/views/vcheck.c, through view.h): replicas must hold the same bytes,
 * overlapping pieces must agree, every element must be covered, pieces
 * must agree on dtype, global shape and tp_dim; each problem is reported
 * with the group, tensor, files and range, and files without one still
 * open.  Plain files (no ckptfs metadata) that hold one tensor with
 * different bytes or shapes are reported as lacking sharding metadata.
 * Set-up code: viewlib.h.
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "viewlib.h"
#include "base/util.h"
#include "views/view_int.h"

/* ---- replicas and consistency ----------------------------------------- */

START_TEST(test_dp_replicas_equal)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "dp");
	float *w = fgen(12, 42);
	const uint64_t s[] = { 3, 4 };
	struct tdef t = { "w", CKPT_DT_F32, 2, { 3, 4 }, w };
	struct vbuf vb = { 0 };
	struct reports rp = { 0 };
	ckpt_view *v;

	/* different metadata (so different header lengths), same bytes */
	put_st(dir, "dp0.safetensors", NULL, &t, 1);
	put_st(dir, "dp1.safetensors", "{\"version\": 1}", &t, 1);
	v = build(dir, 1, 1, NULL);
	vread(v, "model.safetensors", 5, &vb);
	expect_tensor(&vb, "w", CKPT_DT_F32, 2, s, w);
	vbuf_free(&vb);
	ck_assert_int_eq(ckpt_view_check(v, report_cb, &rp), 0);
	ck_assert_int_eq(rp.n, 0);
	ckpt_view_unref(v);
	free(w);
}
END_TEST

START_TEST(test_dp_replicas_differ)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "dp");
	float *w = fgen(12, 42), *w2 = fgen(12, 42);
	struct tdef t = { "w", CKPT_DT_F32, 2, { 3, 4 }, w };
	struct tdef ok = { "ok", CKPT_DT_F32, 1, { 12 }, w };
	struct reports rp = { 0 };
	struct ckpt_view_group_info gi;
	ckpt_view *v;
	char err[1024];

	w2[11] = -1.0f; /* one element differs */
	/* files with ckptfs metadata: a replica that differs is just that */
	put_st(dir, "dp0.safetensors", "{\"version\": 1}", &t, 1);
	t.data = w2;
	put_st(dir, "dp1.safetensors", "{\"version\": 1}", &t, 1);
	put_st(dir, "other.safetensors", "{\"version\": 1, \"group\": \"other\"}", &ok, 1);
	v = build(dir, 1, 1, NULL);
	ck_assert_int_eq(try_open(v, "model.safetensors", err, sizeof(err)), -EIO);
	ck_assert_msg(strstr(err, "'w'") && strstr(err, "replicas disagree") &&
			      strstr(err, "dp0.safetensors") && strstr(err, "dp1.safetensors"),
		      "%s", err);
	ck_assert_int_eq(try_open(v, "other.safetensors", err, sizeof(err)), 0);
	ck_assert_int_eq(ckpt_view_check(v, report_cb, &rp), 1);
	ck_assert_int_eq(rp.n, 1);
	ck_assert_str_eq(rp.file[0], "model.safetensors");
	ck_assert_msg(strstr(rp.why[0], "'w'") && strstr(rp.why[0], "replicas disagree"), "%s",
		      rp.why[0]);
	group_info(v, "other", &gi);
	ck_assert_uint_eq(gi.problems, 0);
	group_info(v, "model", &gi);
	ck_assert_uint_eq(gi.problems, 0);
	ck_assert_uint_eq(gi.nometa, 0);
	ckpt_view_unref(v);
	free(w);
	free(w2);
}
END_TEST

/* ---- plain per-rank files (no ckptfs metadata) ------------------------- */

#define HINT "describe it (docs/views.md section 3) or save with ckptfs.save (docs/trainer.md)"

/*
 * What a user of plain safetensors writes when each TP rank saves its own
 * slice under the global name, slices of one shape: the "replicas" differ.
 * Reported as missing sharding metadata (open, check, group info), while a
 * tensor the files hold with equal bytes is fine and a TP layout's file
 * that does not hold the tensor opens.
 */
START_TEST(test_naive_shards_bytes)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "naive");
	float *w0 = fgen(6, 1), *w1 = fgen(6, 100), *n = fgen(4, 7);
	struct tdef t0[2] = { { "embed_tokens.weight", CKPT_DT_F32, 2, { 2, 3 }, w0 },
			      { "norm.weight", CKPT_DT_F32, 1, { 4 }, n } };
	struct tdef t1[2] = { { "embed_tokens.weight", CKPT_DT_F32, 2, { 2, 3 }, w1 },
			      { "norm.weight", CKPT_DT_F32, 1, { 4 }, n } };
	static const char want[] =
		"group 'model', tensor 'embed_tokens.weight' is in 2 files (rank0.safetensors, "
		"rank1.safetensors) with different bytes and no sharding metadata: " HINT;
	struct ckpt_view_group_info gi;
	struct reports rp = { 0 };
	char err[1024];
	ckpt_view *v;

	put_st(dir, "rank0.safetensors", NULL, t0, 2);
	put_st(dir, "rank1.safetensors", NULL, t1, 2);
	v = build(dir, 1, 1, NULL);
	ck_assert_int_eq(try_open(v, "model.safetensors", err, sizeof(err)), -EIO);
	ck_assert_str_eq(err, want);
	ck_assert_int_eq(ckpt_view_check(v, report_cb, &rp), 1);
	ck_assert_str_eq(rp.file[0], "model.safetensors");
	ck_assert_str_eq(rp.why[0], want);
	ckpt_view_group_info(v, 0, &gi);
	ck_assert_uint_eq(gi.tensors, 2);
	ck_assert_uint_eq(gi.files, 2);
	ck_assert_uint_eq(gi.nometa, 1); /* the chunk digests differ */
	ck_assert_uint_eq(gi.problems, 0);
	ckpt_view_unref(v);
	/* pp2: the embedding is on stage 0, the norm on stage 1 */
	v = build(dir, 1, 2, NULL);
	ck_assert_int_eq(try_open(v, "model_tp0_pp0.safetensors", err, sizeof(err)), -EIO);
	ck_assert_str_eq(err, want);
	ck_assert_int_eq(try_open(v, "model_tp0_pp1.safetensors", err, sizeof(err)), 0);
	ckpt_view_unref(v);
	free(w0);
	free(w1);
	free(n);
}
END_TEST

/* More than four files: the first four are named. */
START_TEST(test_naive_shards_many_files)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "naive5");
	struct reports rp = { 0 };
	struct ckpt_view_group_info gi;
	ckpt_view *v;

	for (int r = 0; r < 5; r++) {
		float *w = fgen(4, 10.0f * (float)r);
		struct tdef t = { "w", CKPT_DT_F32, 1, { 4 }, w };
		char name[32];
		snprintf(name, sizeof(name), "r%d.safetensors", r);
		put_st(dir, name, NULL, &t, 1);
		free(w);
	}
	v = build(dir, 1, 1, NULL);
	ck_assert_int_eq(ckpt_view_check(v, report_cb, &rp), 1);
	ck_assert_str_eq(rp.why[0],
			 "group 'model', tensor 'w' is in 5 files (r0.safetensors, r1.safetensors, "
			 "r2.safetensors, r3.safetensors, and 1 more) with different bytes and no "
			 "sharding metadata: " HINT);
	ckpt_view_group_info(v, 0, &gi);
	ck_assert_uint_eq(gi.nometa, 1);
	ckpt_view_unref(v);
}
END_TEST

/*
 * TP slices of different shapes saved under the global name (rows 0:3 and
 * 3:5 of a [5, 3] tensor): found at build, reported with both shapes.  The
 * same with one file carrying ckptfs metadata keeps the global-shape
 * message (the writer described its tensors).
 */
START_TEST(test_naive_shards_shape)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "naive");
	uint64_t dir2 = mkdir_in(CKPT_ROOT_INO, "half");
	float *w = fgen(15, 1);
	struct tdef t0 = { "w", CKPT_DT_F32, 2, { 3, 3 }, w };
	struct tdef t1 = { "w", CKPT_DT_F32, 2, { 2, 3 }, w + 9 };
	static const char want[] =
		"group 'model', tensor 'w' is in 2 files (r0.safetensors, r1.safetensors) with "
		"different shapes ([3, 3] in r0.safetensors, [2, 3] in r1.safetensors) and no "
		"sharding metadata: " HINT;
	struct ckpt_view_group_info gi;
	struct reports rp = { 0 };
	char err[1024];
	ckpt_view *v;

	put_st(dir, "r0.safetensors", NULL, &t0, 1);
	put_st(dir, "r1.safetensors", NULL, &t1, 1);
	v = build(dir, 2, 1, NULL);
	ck_assert_int_eq(try_open(v, "model_tp0_pp0.safetensors", err, sizeof(err)), -EIO);
	ck_assert_str_eq(err, want);
	ck_assert_int_eq(ckpt_view_check(v, report_cb, &rp), 2); /* both TP files */
	ck_assert_str_eq(rp.why[0], want);
	ckpt_view_group_info(v, 0, &gi);
	ck_assert_uint_eq(gi.nometa, 1);
	ck_assert_uint_eq(gi.problems, 0);
	ckpt_view_unref(v);

	put_st(dir2, "r0.safetensors", "{\"version\": 1}", &t0, 1);
	put_st(dir2, "r1.safetensors", NULL, &t1, 1);
	v = build(dir2, 1, 1, NULL);
	ck_assert_int_eq(try_open(v, "model.safetensors", err, sizeof(err)), -EIO);
	ck_assert_str_eq(err, "group 'model', tensor 'w': pieces disagree on global shape: [3, 3] "
			      "in r0.safetensors, [2, 3] in r1.safetensors");
	ckpt_view_group_info(v, 0, &gi);
	ck_assert_uint_eq(gi.nometa, 0);
	ck_assert_uint_eq(gi.problems, 1);
	ckpt_view_unref(v);
	free(w);
}
END_TEST

/* Plain files holding the same tensor with equal bytes are replicas: no
 * problem anywhere. */
START_TEST(test_naive_replicas_equal)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "dp");
	float *w = fgen(3 << 18, 5); /* 3 MiB: several chunks */
	struct tdef t = { "w", CKPT_DT_F32, 1, { 3 << 18 }, w };
	struct ckpt_view_group_info gi;
	struct reports rp = { 0 };
	ckpt_view *v;

	put_st(dir, "dp0.safetensors", NULL, &t, 1);
	put_st(dir, "dp1.safetensors", NULL, &t, 1);
	v = build(dir, 1, 1, NULL);
	ckpt_view_group_info(v, 0, &gi);
	ck_assert_uint_eq(gi.nometa, 0);
	ck_assert_int_eq(ckpt_view_check(v, report_cb, &rp), 0);
	ckpt_view_unref(v);
	free(w);
}
END_TEST

/* vw_same_digests: what the extents alone prove. */
static struct ckpt_extent_list *exts(const uint32_t *len, const uint8_t *id, size_t n)
{
	struct ckpt_extent_list *l = ckpt_extent_list_new();

	ck_assert_ptr_nonnull(l);
	for (size_t i = 0; i < n; i++) {
		ckpt_digest d;
		memset(&d, 0, sizeof(d));
		d.bytes[0] = id[i];
		ck_assert_int_eq(ckpt_extent_list_append(l, len[i],
							 id[i] ? CKPT_EXT_CHUNK : CKPT_EXT_ZERO,
							 id[i] ? &d : NULL),
				 0);
	}
	return l;
}

START_TEST(test_same_digests)
{
	/* a: header 100, tensor of 10 + 10 + 5 bytes (chunks 1, 2, 3) */
	const uint32_t la[] = { 100, 10, 10, 5 }, lb[] = { 60, 10, 10, 5 };
	const uint32_t lc[] = { 60, 10, 10, 5 }, ld[] = { 60, 10, 15 };
	const uint32_t le[] = { 60, 10, 10, 5 }, lf[] = { 55, 15, 10, 5 };
	const uint8_t ia[] = { 9, 1, 2, 3 }, ib[] = { 8, 1, 2, 3 }, ic[] = { 8, 1, 0, 3 };
	const uint8_t id[] = { 8, 1, 7 }, ie[] = { 8, 1, 2, 4 }, jf[] = { 8, 1, 2, 3 };
	struct ckpt_extent_list *a = exts(la, ia, 4), *b = exts(lb, ib, 4), *c = exts(lc, ic, 4);
	struct ckpt_extent_list *d = exts(ld, id, 3), *e = exts(le, ie, 4), *f = exts(lf, jf, 4);

	ck_assert_int_eq(vw_same_digests(a, 100, b, 60, 25), 1);
	ck_assert_int_eq(vw_same_digests(a, 100, b, 60, 0), 1);
	ck_assert_int_eq(vw_same_digests(a, 100, b, 60, 12), 1);  /* a prefix of one chunk */
	ck_assert_int_eq(vw_same_digests(a, 100, e, 60, 23), -1); /* chunks 3, 4 extend past */
	ck_assert_int_eq(vw_same_digests(a, 100, b, 60, 20), 1);
	ck_assert_int_eq(vw_same_digests(a, 100, c, 60, 25), 0);  /* zero run vs chunk */
	ck_assert_int_eq(vw_same_digests(a, 100, e, 60, 25), 0);  /* last chunk differs */
	ck_assert_int_eq(vw_same_digests(a, 100, d, 60, 25), -1); /* cut differently */
	ck_assert_int_eq(vw_same_digests(a, 100, f, 60, 25), -1); /* not at an extent start */
	ck_assert_int_eq(vw_same_digests(a, 100, b, 60, 30), -1); /* past the end */
	ckpt_extent_list_free(a);
	ckpt_extent_list_free(b);
	ckpt_extent_list_free(c);
	ckpt_extent_list_free(d);
	ckpt_extent_list_free(e);
	ckpt_extent_list_free(f);
}
END_TEST

/*
 * Pieces of different geometry that overlap must agree: b [4, 4] is stored
 * whole in a.safetensors and its rows [0, 2) (different values) in
 * b.safetensors.  only_b: b is the only tensor.  Otherwise a.safetensors
 * also holds "a" [4] F32 just before b, so that a and b are contiguous both
 * in the source and in the view file.
 */
static void overlap_case(bool only_b)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "ov");
	float *a = fgen(4, 1), *b = fgen(16, 100), *b2 = fgen(8, 500);
	struct tdef ta[2] = {
		{ "a", CKPT_DT_F32, 1, { 4 }, a },
		{ "b", CKPT_DT_F32, 2, { 4, 4 }, b },
	};
	struct tdef tb = { "b", CKPT_DT_F32, 2, { 2, 4 }, b2 };
	struct reports rp = { 0 };
	ckpt_view *v;
	char err[1024];
	int r;

	put_st(dir, "a.safetensors", NULL, only_b ? ta + 1 : ta, only_b ? 1 : 2);
	put_st(dir, "b.safetensors",
	       "{\"version\": 1, \"tensors\": {\"b\": {\"global_shape\": [4, 4], "
	       "\"offsets\": [0, 0]}}}",
	       &tb, 1);
	v = build(dir, 1, 1, NULL);
	ck_assert_int_eq(ckpt_view_check(v, report_cb, &rp), 1);
	ck_assert_msg(strstr(rp.why[0], "overlapping pieces") != NULL, "%s", rp.why[0]);
	r = try_open(v, "model.safetensors", err, sizeof(err));
	/* release everything before asserting: nothing leaks on failure */
	ckpt_view_unref(v);
	free(a);
	free(b);
	free(b2);
	ck_assert_msg(r == -EIO, "open with disagreeing overlapping pieces of 'b'%s: %d, want -EIO",
		      only_b ? "" : " (after tensor 'a')", r);
	ck_assert_msg(strstr(err, "'b'") && strstr(err, "overlapping pieces") &&
			      strstr(err, "disagree") && strstr(err, "index [0, 0]"),
		      "%s", err);
}

START_TEST(test_overlap_disagree)
{
	overlap_case(true);
}
END_TEST

START_TEST(test_overlap_disagree_after_contiguous_tensor)
{
	overlap_case(false);
}
END_TEST

/* Overlapping pieces of different geometry with equal bytes are fine. */
START_TEST(test_overlap_agree)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "ov");
	float *b = fgen(16, 100);
	struct tdef ta = { "b", CKPT_DT_F32, 2, { 4, 4 }, b };
	struct tdef tb = { "b", CKPT_DT_F32, 2, { 3, 4 }, b + 4 };
	const uint64_t s[] = { 4, 4 }, s2[] = { 2, 4 };
	struct vbuf vb = { 0 };
	ckpt_view *v;

	put_st(dir, "a.safetensors", NULL, &ta, 1);
	put_st(dir, "b.safetensors",
	       "{\"version\": 1, \"tensors\": {\"b\": {\"global_shape\": [4, 4], "
	       "\"offsets\": [1, 0]}}}",
	       &tb, 1);
	v = build(dir, 2, 1, NULL);
	vread(v, "model_tp0_pp0.safetensors", 3, &vb);
	expect_tensor(&vb, "b", CKPT_DT_F32, 2, s2, b);
	vbuf_free(&vb);
	vread(v, "model_tp1_pp0.safetensors", 3, &vb);
	expect_tensor(&vb, "b", CKPT_DT_F32, 2, s2, b + 8);
	vbuf_free(&vb);
	ckpt_view_unref(v);
	v = build(dir, 1, 1, NULL);
	vread(v, "model.safetensors", 3, &vb);
	expect_tensor(&vb, "b", CKPT_DT_F32, 2, s, b);
	vbuf_free(&vb);
	/* later opens of the same version skip the checks; reads still trim
	 * the overlap */
	vread(v, "model.safetensors", 5, &vb);
	expect_tensor(&vb, "b", CKPT_DT_F32, 2, s, b);
	vbuf_free(&vb);
	vread(v, "model.safetensors", 4096, &vb);
	expect_tensor(&vb, "b", CKPT_DT_F32, 2, s, b);
	vbuf_free(&vb);
	ckpt_view_unref(v);
	free(b);
}
END_TEST

/*
 * Saved tp2 with rank 1 absent: q (layer 0, rows split) misses rows [2, 4).
 * Files of the view that hold no missing part still open.
 */
START_TEST(test_missing_piece)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "miss");
	float *q = fgen(12, 10), *n = fgen(3, 77), *o = fgen(4, 55);
	uint8_t *q0 = sub2(q, 3, 4, 0, 2, 0, 3);
	struct tdef t[2] = {
		{ "layers.0.q", CKPT_DT_F32, 2, { 2, 3 }, q0 },
		{ "layers.0.norm", CKPT_DT_F32, 1, { 3 }, n },
	};
	struct tdef to = { "o", CKPT_DT_F32, 1, { 4 }, o };
	const uint64_t s23[] = { 2, 3 }, s3[] = { 3 }, s4[] = { 4 };
	struct reports rp = { 0 };
	struct ckpt_view_group_info gi;
	struct vbuf vb = { 0 };
	ckpt_view *v;
	char err[1024];

	put_st(dir, "rank0.safetensors",
	       "{\"version\": 1, \"tensors\": {\"layers.0.q\": {\"global_shape\": [4, 3], "
	       "\"offsets\": [0, 0], \"tp_dim\": 0}}}",
	       t, 2);
	put_st(dir, "optim.safetensors", "{\"version\": 1, \"group\": \"optim\"}", &to, 1);

	v = build(dir, 1, 1, NULL);
	/* a failed open is not remembered: every open fails the same way */
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(try_open(v, "model.safetensors", err, sizeof(err)), -EIO);
		ck_assert_str_eq(err, "group 'model', tensor 'layers.0.q': no stored piece covers 6 "
				      "elements starting at index [2, 0]");
	}
	ck_assert_int_eq(try_open(v, "optim.safetensors", err, sizeof(err)), 0);
	ck_assert_int_eq(ckpt_view_check(v, report_cb, &rp), 1);
	ck_assert_str_eq(rp.file[0], "model.safetensors");
	ck_assert_ptr_nonnull(strstr(rp.why[0], "layers.0.q"));
	ckpt_view_unref(v);

	/* tp2: rank 0's part is complete, rank 1's is not */
	v = build(dir, 2, 1, NULL);
	vread(v, "model_tp0_pp0.safetensors", 4096, &vb);
	expect_tensor(&vb, "layers.0.q", CKPT_DT_F32, 2, s23, q0);
	expect_tensor(&vb, "layers.0.norm", CKPT_DT_F32, 1, s3, n);
	vbuf_free(&vb);
	ck_assert_int_eq(try_open(v, "model_tp1_pp0.safetensors", err, sizeof(err)), -EIO);
	ck_assert_msg(strstr(err, "'layers.0.q'") && strstr(err, "index [2, 0]"), "%s", err);
	vread(v, "optim_tp1_pp0.safetensors", 4096, &vb);
	expect_tensor(&vb, "o", CKPT_DT_F32, 1, s4, o);
	vbuf_free(&vb);
	rp.n = 0;
	ck_assert_int_eq(ckpt_view_check(v, report_cb, &rp), 1);
	ck_assert_str_eq(rp.file[0], "model_tp1_pp0.safetensors");
	group_info(v, "optim", &gi);
	ck_assert_uint_eq(gi.problems, 0);
	ckpt_view_unref(v);
	free(q);
	free(q0);
	free(n);
	free(o);
}
END_TEST

/*
 * group_info.problems counts the build-time conflicts only (docs/views.md
 * section 11: `ckpt ls` does not flag missing pieces or disagreeing
 * replicas of described files, which opening a file finds); nometa counts
 * plain files whose copies of a tensor differ by their chunk digests.
 */
START_TEST(test_group_info_problems_build_time_only)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "miss");
	float *q = fgen(6, 10), *r2 = fgen(4, 20);
	struct tdef t = { "layers.0.q", CKPT_DT_F32, 2, { 2, 3 }, q };
	struct tdef tr = { "r", CKPT_DT_F32, 1, { 4 }, r2 };
	struct ckpt_view_group_info gi;
	struct reports rp = { 0 };
	ckpt_view *v;

	put_st(dir, "rank0.safetensors",
	       "{\"version\": 1, \"tensors\": {\"layers.0.q\": {\"global_shape\": [4, 3], "
	       "\"offsets\": [0, 0], \"tp_dim\": 0}}}",
	       &t, 1);
	put_st(dir, "r1.safetensors", NULL, &tr, 1);
	r2[0] = -5.0f;
	put_st(dir, "r2.safetensors", NULL, &tr, 1);
	v = build(dir, 1, 1, NULL);
	ckpt_view_group_info(v, 0, &gi);
	ck_assert_uint_eq(gi.tensors, 2);
	ck_assert_uint_eq(gi.files, 3);
	ck_assert_uint_eq(gi.problems, 0);
	/* r1 and r2 (plain files) differ by their chunk digests */
	ck_assert_uint_eq(gi.nometa, 1);
	/* ckpt_view_check finds both: one report per (file, tensor) */
	ck_assert_int_eq(ckpt_view_check(v, report_cb, &rp), 2);
	ck_assert_int_eq(rp.n, 2);
	ckpt_view_unref(v);
	free(q);
	free(r2);
}
END_TEST

/* tp2 save whose pieces disagree on dtype, global shape or explicit tp_dim. */
enum { DIS_DTYPE, DIS_SHAPE, DIS_TPDIM };

static void disagree_case(int kind)
{
	static const char *const meta1[] = {
		[DIS_DTYPE] = "{\"version\": 1, \"tensors\": {\"w\": {\"global_shape\": [4, 3], "
			      "\"offsets\": [2, 0]}, \"k\": {\"pp\": \"first\"}}}",
		[DIS_SHAPE] = "{\"version\": 1, \"tensors\": {\"w\": {\"global_shape\": [5, 3], "
			      "\"offsets\": [2, 0]}, \"k\": {\"pp\": \"first\"}}}",
		[DIS_TPDIM] = "{\"version\": 1, \"tensors\": {\"w\": {\"global_shape\": [4, 3], "
			      "\"offsets\": [2, 0], \"tp_dim\": 1}, \"k\": {\"pp\": \"first\"}}}",
	};
	static const char *const why[] = {
		[DIS_DTYPE] = "pieces disagree on dtype: F32 in r0.safetensors, F16 in "
			      "r1.safetensors",
		[DIS_SHAPE] = "pieces disagree on global shape: [4, 3] in r0.safetensors, "
			      "[5, 3] in r1.safetensors",
		[DIS_TPDIM] = "pieces disagree on tp_dim (0 in r0.safetensors, 1 in "
			      "r1.safetensors)",
	};
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "dis");
	float *w = fgen(12, 3);
	uint16_t h[6] = { 1, 2, 3, 4, 5, 6 };
	float *k = fgen(5, 800);
	struct tdef t0[2] = { { "w", CKPT_DT_F32, 2, { 2, 3 }, w },
			      { "k", CKPT_DT_F32, 1, { 5 }, k } };
	struct tdef t1[2] = { { "w", kind == DIS_DTYPE ? CKPT_DT_F16 : CKPT_DT_F32, 2, { 2, 3 },
				kind == DIS_DTYPE ? (const void *)h : (const void *)(w + 6) },
			      { "k", CKPT_DT_F32, 1, { 5 }, k } };
	struct ckpt_view_group_info gi;
	struct reports rp = { 0 };
	ckpt_view *v;
	char err[1024], want[512];
	const uint64_t s5[] = { 5 };
	struct vbuf vb = { 0 };

	put_st(dir, "r0.safetensors",
	       "{\"version\": 1, \"tensors\": {\"w\": {\"global_shape\": [4, 3], "
	       "\"offsets\": [0, 0], \"tp_dim\": 0}, \"k\": {\"pp\": \"first\"}}}",
	       t0, 2);
	put_st(dir, "r1.safetensors", meta1[kind], t1, 2);
	snprintf(want, sizeof(want), "group 'model', tensor 'w': %s", why[kind]);
	v = build(dir, 1, 1, NULL);
	ck_assert_int_eq(try_open(v, "model.safetensors", err, sizeof(err)), -EIO);
	ck_assert_str_eq(err, want);
	ckpt_view_group_info(v, 0, &gi);
	ck_assert_uint_eq(gi.tensors, 2);
	ck_assert_uint_eq(gi.problems, 1);
	ck_assert_int_eq(ckpt_view_check(v, report_cb, &rp), 1);
	ck_assert_str_eq(rp.why[0], want);
	ckpt_view_unref(v);

	/* pp2: w (last stage by name) breaks stage 1 only */
	v = build(dir, 1, 2, NULL);
	vread(v, "model_tp0_pp0.safetensors", 4096, &vb);
	expect_tensor(&vb, "k", CKPT_DT_F32, 1, s5, k);
	ck_assert_uint_eq(ckpt_st_tensor_count(vb.h), 1);
	vbuf_free(&vb);
	ck_assert_int_eq(try_open(v, "model_tp0_pp1.safetensors", err, sizeof(err)), -EIO);
	ck_assert_str_eq(err, want);
	ckpt_view_unref(v);
	free(w);
	free(k);
}

START_TEST(test_dtype_disagree)
{
	disagree_case(DIS_DTYPE);
}
END_TEST

START_TEST(test_shape_disagree)
{
	disagree_case(DIS_SHAPE);
}
END_TEST

START_TEST(test_tp_dim_disagree)
{
	disagree_case(DIS_TPDIM);
}
END_TEST

/* Explicit pp that disagree: not a problem, the first source by name wins
 * (docs/views.md section 13). */
START_TEST(test_pp_conflict_first_source_wins)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "ppc");
	float *w = fgen(4, 1);
	struct tdef t = { "w", CKPT_DT_F32, 1, { 4 }, w };
	struct ckpt_view_group_info gi;
	struct vbuf vb = { 0 };
	ckpt_view *v;

	put_st(dir, "b.safetensors", "{\"version\":1,\"tensors\":{\"w\":{\"pp\":\"last\"}}}", &t,
	       1);
	put_st(dir, "a.safetensors", "{\"version\":1,\"tensors\":{\"w\":{\"pp\":\"first\"}}}", &t,
	       1);
	v = build(dir, 1, 2, NULL);
	ckpt_view_group_info(v, 0, &gi);
	ck_assert_uint_eq(gi.problems, 0);
	vread(v, "model_tp0_pp0.safetensors", 4096, &vb);
	ck_assert_uint_eq(ckpt_st_tensor_count(vb.h), 1);
	vbuf_free(&vb);
	vread(v, "model_tp0_pp1.safetensors", 4096, &vb);
	ck_assert_uint_eq(ckpt_st_tensor_count(vb.h), 0);
	vbuf_free(&vb);
	ckpt_view_unref(v);
	free(w);
}
END_TEST

static Suite *vcheck_suite(void)
{
	Suite *s = suite_create("vcheck");
	TCase *cons = view_tcase(s, "consistency");

	tcase_add_test(cons, test_dp_replicas_equal);
	tcase_add_test(cons, test_dp_replicas_differ);
	tcase_add_test(cons, test_naive_shards_bytes);
	tcase_add_test(cons, test_naive_shards_many_files);
	tcase_add_test(cons, test_naive_shards_shape);
	tcase_add_test(cons, test_naive_replicas_equal);
	tcase_add_test(cons, test_same_digests);
	tcase_add_test(cons, test_overlap_disagree);
	tcase_add_test(cons, test_overlap_disagree_after_contiguous_tensor);
	tcase_add_test(cons, test_overlap_agree);
	tcase_add_test(cons, test_missing_piece);
	tcase_add_test(cons, test_group_info_problems_build_time_only);
	tcase_add_test(cons, test_dtype_disagree);
	tcase_add_test(cons, test_shape_disagree);
	tcase_add_test(cons, test_tp_dim_disagree);
	tcase_add_test(cons, test_pp_conflict_first_source_wins);
	return s;
}

int main(void)
{
	return tl_run(vcheck_suite());
}
