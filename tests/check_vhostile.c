/* SPDX-License-Identifier: MIT */
/*
 * check_vhostile.c - views of sources whose metadata is legal but odd, that
 * an independent probe fed to ckptfs (issue 22): a num_layers of 2^62,
 * "__metadata__": null, tensor names "", "/" and "../x", data offsets out
 * of the order of the header's keys.  The parsers accept each, as the
 * reference safetensors implementation does; these tests show that a view
 * of such a source serves the right bytes under the documented rules, and
 * that no tensor name ever becomes a file name.  (What the parsers refuse is
 * tested in check_safetensors.c and check_shardmeta.c, and fuzzed in
 * tests/fuzz.)
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "views/safetensors.h"
#include "views/shardmeta.h"
#include "views/view.h"
#include "viewlib.h"

/* The num_layers of the view file fname of v. */
static uint64_t file_num_layers(ckpt_view *v, const char *fname, struct vbuf *vb)
{
	ckpt_shardmeta *sm = NULL;
	char err[256];
	uint64_t nl = 0;

	vread(v, fname, 4096, vb);
	ck_assert_msg(ckpt_shardmeta_parse(vb->h, &sm, err, sizeof(err)) == 0, "%s", err);
	ck_assert(ckpt_shardmeta_num_layers(sm, &nl));
	ckpt_shardmeta_free(sm);
	return nl;
}

/*
 * num_layers 2^62 (and an explicit pp of 2^62 - 1): stage p holds layers
 * [floor(p N / P), floor((p + 1) N / P)), computed exactly for any N, so
 * with P = 4 layers 0 and 5 are on stage 0 and layer 2^62 - 1 on stage 3;
 * the view files carry num_layers 2^62 and build in time that does not
 * depend on it.
 */
START_TEST(test_num_layers_2e62)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "huge");
	const uint64_t big = 1ull << 62;
	float *d[4] = { fgen(4, 0), fgen(4, 10), fgen(4, 20), fgen(4, 30) };
	struct tdef t[4] = {
		{ "model.embed_tokens.weight", CKPT_DT_F32, 1, { 4 }, d[0] },
		{ "model.layers.0.w", CKPT_DT_F32, 1, { 4 }, d[1] },
		{ "model.layers.5.w", CKPT_DT_F32, 1, { 4 }, d[2] },
		{ "model.norm.weight", CKPT_DT_F32, 1, { 4 }, d[3] },
	};
	const char *s0[] = { "model.embed_tokens.weight", "model.layers.0.w" };
	const char *s3[] = { "model.layers.5.w", "model.norm.weight" };
	char meta[256];
	struct vbuf vb = { 0 };
	ckpt_view *v;

	snprintf(meta, sizeof(meta),
		 "{\"version\": 1, \"num_layers\": %llu, \"tensors\": "
		 "{\"model.layers.5.w\": {\"pp\": %llu}}}",
		 (unsigned long long)big, (unsigned long long)(big - 1));
	put_st(dir, "m.safetensors", meta, t, 4);
	v = build(dir, 1, 4, NULL);
	ck_assert_uint_eq(ckpt_view_nfiles(v), 4);
	ck_assert_uint_eq(file_num_layers(v, "model_tp0_pp0.safetensors", &vb), big);
	expect_names(&vb, s0, 2);
	expect_tensor(&vb, s0[0], CKPT_DT_F32, 1, (const uint64_t[]){ 4 }, d[0]);
	expect_tensor(&vb, s0[1], CKPT_DT_F32, 1, (const uint64_t[]){ 4 }, d[1]);
	vbuf_free(&vb);
	for (unsigned p = 1; p < 3; p++) {
		char fname[64];

		snprintf(fname, sizeof(fname), "model_tp0_pp%u.safetensors", p);
		ck_assert_uint_eq(file_num_layers(v, fname, &vb), big);
		ck_assert_uint_eq(ckpt_st_tensor_count(vb.h), 0);
		vbuf_free(&vb);
	}
	ck_assert_uint_eq(file_num_layers(v, "model_tp0_pp3.safetensors", &vb), big);
	expect_names(&vb, s3, 2);
	expect_tensor(&vb, s3[0], CKPT_DT_F32, 1, (const uint64_t[]){ 4 }, d[2]);
	expect_tensor(&vb, s3[1], CKPT_DT_F32, 1, (const uint64_t[]){ 4 }, d[3]);
	vbuf_free(&vb);
	ckpt_view_unref(v);
	for (int i = 0; i < 4; i++)
		free(d[i]);
}
END_TEST

/*
 * Layer numbers past what a view file's metadata can hold (a JSON integer,
 * at most 2^63 - 1) used to fail every file of the group (EOVERFLOW building
 * the header): a name "layers.9223372036854775808.w" is not a layer name
 * (placed by the other name rules: last stage), and an explicit pp of
 * 2^63 - 1 without num_layers makes the group's num_layers 2^63 - 1 (not
 * 2^63), so that layer goes to the last stage as any L >= N does.
 */
START_TEST(test_layers_past_json)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "name"), dir2 = mkdir_in(CKPT_ROOT_INO, "pp");
	float *d = fgen(4, 0), *e = fgen(4, 50);
	struct tdef t[2] = { { "layers.9223372036854775808.w", CKPT_DT_F32, 1, { 4 }, d },
			     { "layers.1.w", CKPT_DT_F32, 1, { 4 }, e } };
	struct tdef u[2] = { { "a", CKPT_DT_F32, 1, { 4 }, d },
			     { "layers.0.w", CKPT_DT_F32, 1, { 4 }, e } };
	static const char *const last[] = { "layers.1.w", "layers.9223372036854775808.w" };
	struct vbuf vb = { 0 };
	ckpt_view *v;

	put_st(dir, "m.safetensors", NULL, t, 2);
	v = build(dir, 1, 2, NULL); /* N = 2: layer 1 on stage 1 */
	ck_assert_uint_eq(file_num_layers(v, "model_tp0_pp0.safetensors", &vb), 2);
	ck_assert_uint_eq(ckpt_st_tensor_count(vb.h), 0);
	vbuf_free(&vb);
	ck_assert_uint_eq(file_num_layers(v, "model_tp0_pp1.safetensors", &vb), 2);
	expect_names(&vb, last, 2);
	expect_tensor(&vb, last[1], CKPT_DT_F32, 1, (const uint64_t[]){ 4 }, d);
	vbuf_free(&vb);
	ckpt_view_unref(v);

	put_st(dir2, "m.safetensors", "{\"version\": 1, \"tensors\": {\"a\": "
		   "{\"pp\": 9223372036854775807}}}", u, 2);
	v = build(dir2, 1, 2, NULL);
	ck_assert_uint_eq(file_num_layers(v, "model_tp0_pp0.safetensors", &vb), INT64_MAX);
	expect_names(&vb, &u[1].name, 1);
	vbuf_free(&vb);
	ck_assert_uint_eq(file_num_layers(v, "model_tp0_pp1.safetensors", &vb), INT64_MAX);
	expect_names(&vb, &u[0].name, 1);
	expect_tensor(&vb, "a", CKPT_DT_F32, 1, (const uint64_t[]){ 4 }, d);
	vbuf_free(&vb);
	ckpt_view_unref(v);
	free(d);
	free(e);
}
END_TEST

/* Tensor names "", "/", "../x" and "../../etc/passwd" are names inside
 * headers only: the view directory holds the group's files and nothing
 * else, and each tensor is served under its own name with its bytes. */
START_TEST(test_path_like_names)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "names");
	static const char *const names[] = { "", "../../etc/passwd", "../x", "/" };
	static const char *const one[] = { "model.safetensors" };
	static const char *const two[] = { "model_tp0_pp0.safetensors",
					   "model_tp1_pp0.safetensors" };
	float *d[4];
	struct tdef t[4];
	struct vbuf vb = { 0 };
	ckpt_view *v;

	for (int i = 0; i < 4; i++) {
		d[i] = fgen(6, 10.0f * (float)i);
		t[i] = (struct tdef){ names[i], CKPT_DT_F32, 2, { 2, 3 }, d[i] };
	}
	put_st(dir, "odd.safetensors", NULL, t, 4);
	v = build(dir, 1, 1, NULL);
	expect_files(v, one, 1);
	vread(v, "model.safetensors", 4096, &vb);
	expect_names(&vb, names, 4);
	for (int i = 0; i < 4; i++)
		expect_tensor(&vb, names[i], CKPT_DT_F32, 2, t[i].shape, d[i]);
	vbuf_free(&vb);
	ckpt_view_unref(v);
	/* no name rule splits them: replicated in both TP ranks */
	v = build(dir, 2, 1, NULL);
	expect_files(v, two, 2);
	for (int r = 0; r < 2; r++) {
		vread(v, two[r], 4096, &vb);
		for (int i = 0; i < 4; i++)
			expect_tensor(&vb, names[i], CKPT_DT_F32, 2, t[i].shape, d[i]);
		vbuf_free(&vb);
	}
	ckpt_view_unref(v);
	for (int i = 0; i < 4; i++)
		free(d[i]);
}
END_TEST

/* A source written by hand: header JSON (padded to a multiple of 8 with the
 * prefix) and data. */
static uint64_t put_json(uint64_t dir, const char *fname, const char *json, const void *data,
			 size_t dlen)
{
	size_t n = strlen(json), pad = (8 - (8 + n) % 8) % 8, len = 8 + n + pad + dlen;
	uint8_t *buf = malloc(len);
	uint64_t ino;
	struct ckpt_inode in;

	ck_assert_ptr_nonnull(buf);
	ckpt_put_le64(buf, n + pad);
	memcpy(buf + 8, json, n);
	memset(buf + 8 + n, ' ', pad);
	memcpy(buf + 8 + n + pad, data, dlen);
	ino = put_raw(dir, fname, buf, len);
	free(buf);
	ck_assert_int_eq(ckpt_store_getattr(st, ino, &in), 0);
	ck_assert_msg(in.flags & CKPT_INODE_F_SAFETENSORS, "%s is not flagged as safetensors",
		      fname);
	return ino;
}

/* "__metadata__": null is no metadata (as absent, and as the reference
 * reads it): the file is a plain source of whole tensors. */
START_TEST(test_metadata_null)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "null");
	float *w = fgen(4, 7);
	static const char *const one[] = { "model.safetensors" };
	struct vbuf vb = { 0 };
	ckpt_view *v;

	put_json(dir, "n.safetensors",
		 "{\"__metadata__\":null,\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],"
		 "\"data_offsets\":[0,16]}}",
		 w, 16);
	v = build(dir, 1, 1, NULL);
	expect_files(v, one, 1);
	vread(v, "model.safetensors", 4096, &vb);
	expect_tensor(&vb, "w", CKPT_DT_F32, 2, (const uint64_t[]){ 2, 2 }, w);
	vbuf_free(&vb);
	ckpt_view_unref(v);
	free(w);
}
END_TEST

/* Data offsets in another order than the header's keys (the reference
 * sorts tensors by offsets): each tensor is served with its own bytes. */
START_TEST(test_offsets_out_of_order)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "order");
	float *d = fgen(12, 1); /* c: [0, 8), a: [8, 24), b: [24, 48) */
	static const char *const names[] = { "a", "b", "c" };
	struct vbuf vb = { 0 };
	ckpt_view *v;

	put_json(dir, "o.safetensors",
		 "{\"b\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[24,48]},"
		 "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]},"
		 "\"c\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
		 d, 48);
	v = build(dir, 1, 1, NULL);
	vread(v, "model.safetensors", 4096, &vb);
	expect_names(&vb, names, 3);
	expect_tensor(&vb, "a", CKPT_DT_F32, 1, (const uint64_t[]){ 4 }, d + 2);
	expect_tensor(&vb, "b", CKPT_DT_F32, 1, (const uint64_t[]){ 6 }, d + 6);
	expect_tensor(&vb, "c", CKPT_DT_F32, 1, (const uint64_t[]){ 2 }, d);
	vbuf_free(&vb);
	ckpt_view_unref(v);
	free(d);
}
END_TEST

static Suite *vhostile_suite(void)
{
	Suite *s = suite_create("vhostile");
	TCase *tc = view_tcase(s, "odd metadata");

	tcase_add_test(tc, test_num_layers_2e62);
	tcase_add_test(tc, test_layers_past_json);
	tcase_add_test(tc, test_path_like_names);
	tcase_add_test(tc, test_metadata_null);
	tcase_add_test(tc, test_offsets_out_of_order);
	return s;
}

int main(void)
{
	return tl_run(vhostile_suite());
}
