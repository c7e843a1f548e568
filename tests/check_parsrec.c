/* SPDX-License-Identifier: MIT */
/*
 * check_parsrec.c - unit tests for core/views/parsrec.[ch]: the codec of
 * the persisted parse of a view source ('P' records, docs/format.md 5.8).
 *
 * Records are made from a hand-built parse (struct srcdata) and a hand-built
 * extent list; no store is involved.  check_view.c covers the records
 * through a store (written on first parse, used after a reopen, replaced
 * when damaged).
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "views/parsrec.h"
#include "testlib.h"

/* Three tensors in name order, sharing name prefixes: a TP-split box, a
 * flat FSDP piece with an explicit pp, a replicated whole tensor. */
static const uint64_t shape_a[] = { 4, 6 }, shape_b[] = { 10 }, shape_c[] = { 3 };
static const uint64_t dims_a[] = { 8, 6, 4, 0, 4, 6 };  /* gs, off, shape */
static const uint64_t dims_b[] = { 5, 4, 0, 0, 5, 4 };  /* box = global */
static const uint64_t dims_c[] = { 3, 0, 3 };

static struct ckpt_st_tensor tensors[3];
static struct smeta metas[3];
static struct srcdata src;
static struct ckpt_extent_list *ext;

static void setup(void)
{
	ckpt_digest dg;

	tensors[0] = (struct ckpt_st_tensor){ "layers.0.attn.weight", CKPT_DT_BF16, 2, shape_a, 0,
					      48 };
	tensors[1] = (struct ckpt_st_tensor){ "layers.0.mlp.weight", CKPT_DT_F32, 1, shape_b, 48,
					      88 };
	tensors[2] = (struct ckpt_st_tensor){ "norm", CKPT_DT_F64, 1, shape_c, 88, 112 };
	metas[0] = (struct smeta){ .ndim = 2, .tp_dim = 0, .pp = { CKPT_PP_LAYER, 0 },
				   .gs = dims_a, .off = dims_a + 2, .shape = dims_a + 4 };
	metas[1] = (struct smeta){ .ndim = 2, .tp_dim = CKPT_TP_DIM_UNSET, .flat = true,
				   .has_pp = true, .pp = { CKPT_PP_LAST, 0 }, .flat_begin = 7,
				   .flat_end = 17, .gs = dims_b, .off = dims_b + 2,
				   .shape = dims_b + 4 };
	metas[2] = (struct smeta){ .ndim = 1, .tp_dim = -1, .pp = { CKPT_PP_ALL, 0 },
				   .gs = dims_c, .off = dims_c + 1, .shape = dims_c + 2 };
	memset(&src, 0, sizeof(src));
	src.source = true;
	src.has_nl = true;
	src.nl = 32;
	src.data_start = 4104;
	src.group = "model";
	src.tensors = tensors;
	src.metas = metas;
	src.ntensors = 3;
	ext = ckpt_extent_list_new();
	ck_assert_ptr_nonnull(ext);
	memset(&dg, 0x11, sizeof(dg));
	ck_assert_int_eq(ckpt_extent_list_append(ext, 4104, CKPT_EXT_CHUNK, &dg), 0);
	memset(&dg, 0x22, sizeof(dg));
	ck_assert_int_eq(ckpt_extent_list_append(ext, 112, CKPT_EXT_CHUNK, &dg), 0);
}

static void teardown(void)
{
	ckpt_extent_list_free(ext);
	ext = NULL;
}

static void encode(uint8_t **rec, size_t *len)
{
	ck_assert_int_eq(vw_parsrec_encode(&src, ext, rec, len), 0);
	ck_assert_uint_ge(*len, 34);
	ck_assert_uint_eq((*rec)[0], CKPT_PARSREC_VERSION);
}

static void decoded_free(struct srcdata *d)
{
	free(d->blob);
	free(d->tensors);
	free(d->metas);
}

static void expect_u64s(const uint64_t *a, const uint64_t *b, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		ck_assert_uint_eq(a[i], b[i]);
}

START_TEST(test_roundtrip)
{
	struct srcdata d = { 0 };
	uint8_t *rec;
	size_t len;

	encode(&rec, &len);
	ck_assert_int_eq(vw_parsrec_decode(rec, len, ext, &d), 0);
	ck_assert(d.source);
	ck_assert(d.has_nl);
	ck_assert_uint_eq(d.nl, 32);
	ck_assert_uint_eq(d.data_start, 4104);
	ck_assert_str_eq(d.group, "model");
	ck_assert_uint_eq(d.ntensors, 3);
	for (size_t k = 0; k < 3; k++) {
		const struct ckpt_st_tensor *t = &d.tensors[k], *w = &tensors[k];
		const struct smeta *m = &d.metas[k], *x = &metas[k];

		ck_assert_str_eq(t->name, w->name);
		ck_assert_int_eq(t->dtype, w->dtype);
		ck_assert_uint_eq(t->ndim, w->ndim);
		expect_u64s(t->shape, w->shape, w->ndim);
		ck_assert_uint_eq(t->begin, w->begin);
		ck_assert_uint_eq(t->end, w->end);
		ck_assert_uint_eq(m->ndim, x->ndim);
		expect_u64s(m->gs, x->gs, x->ndim);
		expect_u64s(m->off, x->off, x->ndim);
		expect_u64s(m->shape, x->shape, x->ndim);
		ck_assert_int_eq(m->tp_dim, x->tp_dim);
		ck_assert_int_eq(m->flat, x->flat);
		ck_assert_int_eq(m->has_pp, x->has_pp);
		ck_assert_int_eq(m->pp.kind, x->pp.kind);
		ck_assert_uint_eq(m->pp.layer, x->pp.layer);
		if (x->flat) {
			ck_assert_uint_eq(m->flat_begin, x->flat_begin);
			ck_assert_uint_eq(m->flat_end, x->flat_end);
		}
	}
	/* the names are stored as shared prefix + rest: the second entry
	 * repeats "layers.0." of the first, so its whole name is not there */
	ck_assert_ptr_null(memmem(rec, len, "layers.0.mlp", 12));
	decoded_free(&d);
	free(rec);
}
END_TEST

/* A file that is not reshardable: no tensors, no group. */
START_TEST(test_not_source)
{
	struct srcdata d = { 0 };
	uint8_t *rec;
	size_t len;

	src.source = false;
	src.has_nl = false;
	src.ntensors = 0;
	src.group = NULL;
	encode(&rec, &len);
	ck_assert_uint_eq(len, 34);
	ck_assert_int_eq(vw_parsrec_decode(rec, len, ext, &d), 0);
	ck_assert(!d.source);
	ck_assert_uint_eq(d.ntensors, 0);
	ck_assert_str_eq(d.group, "");
	decoded_free(&d);
	free(rec);
}
END_TEST

/* The record is tied to the chunks of the header, not to the data. */
START_TEST(test_fingerprint)
{
	struct srcdata d = { 0 };
	uint8_t *rec;
	size_t len;
	uint64_t fp = vw_parsrec_fingerprint(ext, src.data_start);

	encode(&rec, &len);
	/* another data chunk: the record stays valid */
	ext->v[1].digest.bytes[0] ^= 1;
	ck_assert_uint_eq(vw_parsrec_fingerprint(ext, src.data_start), fp);
	ck_assert_int_eq(vw_parsrec_decode(rec, len, ext, &d), 0);
	decoded_free(&d);
	/* another header chunk: stale */
	ext->v[0].digest.bytes[0] ^= 1;
	ck_assert_uint_ne(vw_parsrec_fingerprint(ext, src.data_start), fp);
	memset(&d, 0, sizeof(d));
	ck_assert_int_eq(vw_parsrec_decode(rec, len, ext, &d), -ESTALE);
	ck_assert_ptr_null(d.tensors);
	ck_assert_ptr_null(d.blob);
	free(rec);
}
END_TEST

/* Another version, every truncation and a trailing byte are rejected
 * without reading past the record. */
START_TEST(test_damaged)
{
	struct srcdata d = { 0 };
	uint8_t *rec, *cut;
	size_t len;

	encode(&rec, &len);
	for (uint8_t ver = 0; ver < 4; ver++) {
		uint8_t save = rec[0];
		if (ver == CKPT_PARSREC_VERSION)
			continue;
		rec[0] = ver;
		ck_assert_int_eq(vw_parsrec_decode(rec, len, ext, &d), -EINVAL);
		rec[0] = save;
	}
	for (size_t n = 0; n < len; n++) {
		cut = malloc(n ? n : 1); /* exactly n bytes: ASan/valgrind see overreads */
		ck_assert_ptr_nonnull(cut);
		memcpy(cut, rec, n);
		memset(&d, 0, sizeof(d));
		ck_assert_int_eq(vw_parsrec_decode(cut, n, ext, &d), -EINVAL);
		ck_assert_ptr_null(d.tensors);
		free(cut);
	}
	cut = malloc(len + 1);
	ck_assert_ptr_nonnull(cut);
	memcpy(cut, rec, len);
	cut[len] = 0;
	ck_assert_int_eq(vw_parsrec_decode(cut, len + 1, ext, &d), -EINVAL);
	free(cut);
	free(rec);
}
END_TEST

/* Inconsistent contents: tensors in a record marked not reshardable, a
 * shared prefix longer than the previous name, an unknown dtype. */
START_TEST(test_inconsistent)
{
	struct srcdata d = { 0 };
	uint8_t *rec;
	size_t len, first;

	encode(&rec, &len);
	rec[1] = 0; /* source */
	ck_assert_int_eq(vw_parsrec_decode(rec, len, ext, &d), -EINVAL);
	rec[1] = 1;
	first = 34 + strlen("model"); /* the first entry: prefix, rest, name */
	ck_assert_uint_eq(rec[first], 0);
	rec[first] = 1; /* a prefix of a name before the first */
	ck_assert_int_eq(vw_parsrec_decode(rec, len, ext, &d), -EINVAL);
	rec[first] = 0;
	{
		size_t dt = first + 2 + strlen(tensors[0].name) + 1;
		ck_assert_mem_eq(rec + dt, "BF16", 4);
		rec[dt] = 'X';
		ck_assert_int_eq(vw_parsrec_decode(rec, len, ext, &d), -EINVAL);
		rec[dt] = 'B';
	}
	ck_assert_int_eq(vw_parsrec_decode(rec, len, ext, &d), 0);
	decoded_free(&d);
	free(rec);
}
END_TEST

/* Records that decode but do not describe a parse of a valid source (a
 * damaged record, which the views would otherwise use in place of the
 * header): each is refused.  Found by tests/fuzz/fuzz_records.c. */
static void expect_refused(const char *what)
{
	struct srcdata d = { 0 };
	uint8_t *rec;
	size_t len;

	ck_assert_int_eq(vw_parsrec_encode(&src, ext, &rec, &len), 0);
	if (vw_parsrec_decode(rec, len, ext, &d) != -EINVAL)
		ck_abort_msg("%s: not refused", what);
	ck_assert_ptr_null(d.tensors);
	ck_assert_ptr_null(d.blob);
	free(rec);
}

START_TEST(test_not_a_parse)
{
	static const uint64_t gs_small[] = { 7, 6, 4, 0, 4, 6 }; /* rows 4..8 of 7 */
	static const uint64_t shape_4[] = { 4 };
	struct ckpt_st_tensor t0 = tensors[0], t1 = tensors[1];
	struct smeta m0 = metas[0], m1 = metas[1];
	struct srcdata d = { 0 };
	uint8_t *rec;
	size_t len;

	src.data_start = 9; /* shorter than the smallest header */
	expect_refused("data_start 9");
	src.data_start = 4104;
	src.group = "mo/del";
	expect_refused("group with '/'");
	src.group = ".hidden";
	expect_refused("group starting with '.'");
	src.group = "model";
	metas[0].gs = gs_small;
	expect_refused("box outside global_shape");
	metas[0] = m0;
	metas[0].tp_dim = 2;
	expect_refused("tp_dim 2 of 2 dims");
	metas[0] = m0;
	metas[0].has_pp = true;
	metas[0].pp.layer = 32;
	expect_refused("pp layer 32 of num_layers 32");
	metas[0] = m0;
	metas[1].flat_end = 16;
	expect_refused("flat range of 9 elements for 10 stored");
	metas[1] = m1;
	tensors[1].shape = shape_4; /* F32 [4]: 16 bytes, not 40 */
	expect_refused("size and data offsets disagree");
	tensors[1] = t1;
	tensors[0].dtype = CKPT_DT_F4;
	expect_refused("sub-byte dtype");
	tensors[0] = t0;
	tensors[1].name = "layers.0.attn.weight";
	expect_refused("two tensors of one name");
	tensors[1] = t1;
	tensors[1].begin += 8;
	tensors[1].end += 8;
	tensors[2].begin += 8;
	tensors[2].end += 8;
	expect_refused("a hole in the data");
	tensors[1] = t1;
	tensors[2].begin -= 8;
	tensors[2].end -= 8;
	/* the data ends 8 bytes before the file does */
	ck_assert_int_eq(ckpt_extent_list_append(ext, 8, CKPT_EXT_ZERO, NULL), 0);
	expect_refused("data shorter than the file");
	ckpt_extent_list_truncate(ext, 4104 + 112);

	/* bytes a parse never writes: source and has_num_layers other than 0/1, a NUL in
	 * a name */
	ck_assert_int_eq(vw_parsrec_encode(&src, ext, &rec, &len), 0);
	rec[1] = 2;
	ck_assert_int_eq(vw_parsrec_decode(rec, len, ext, &d), -EINVAL);
	rec[1] = 1;
	rec[2] = 2;
	ck_assert_int_eq(vw_parsrec_decode(rec, len, ext, &d), -EINVAL);
	rec[2] = 1;
	ck_assert_mem_eq(rec + 34 + 5 + 2, "layers", 6);
	rec[34 + 5 + 2 + 3] = '\0';
	ck_assert_int_eq(vw_parsrec_decode(rec, len, ext, &d), -EINVAL);
	rec[34 + 5 + 2 + 3] = 'e';
	ck_assert_int_eq(vw_parsrec_decode(rec, len, ext, &d), 0);
	decoded_free(&d);
	free(rec);
}
END_TEST

static Suite *parsrec_suite(void)
{
	Suite *s = suite_create("parsrec");
	TCase *tc = tcase_create("codec");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_roundtrip);
	tcase_add_test(tc, test_not_source);
	tcase_add_test(tc, test_fingerprint);
	tcase_add_test(tc, test_damaged);
	tcase_add_test(tc, test_inconsistent);
	tcase_add_test(tc, test_not_a_parse);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(parsrec_suite());
}
