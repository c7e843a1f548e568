/* SPDX-License-Identifier: MIT */
/*
 * check_view.c - unit tests for core/views/view.h: resharded views (tpT_ppP) of
 * the safetensors files of a store directory.
 *
 * Every test gets a fresh store and sources written through the real write
 * path (viewlib.h).  Every expected byte is computed here from the global
 * tensors.  What opening a file checks is tested in check_vcheck.c.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/file.h"
#include "views/layout.h"
#include "views/safetensors.h"
#include "views/shardmeta.h"
#include "store/store.h"
#include "testlib.h"
#include "base/util.h"
#include "views/view.h"
#include "viewlib.h"

/* ---- tensor parallel -------------------------------------------------- */

/*
 * Directory "tp": two files saved tp2, each with
 *   w [10, 6] F32 split on rows (tp_dim 0): rank r holds rows [5r, 5r+5)
 *   c [4, 9]  F32 with tp_dim 1, but stored as rows [2r, 2r+2)
 *   e [5, 2]  F32 tp_dim 0, whole in rank 0 only
 */
struct tpfix {
	uint64_t dir, ino[2];
	float *w, *c, *e;
};

static void tp_setup(struct tpfix *x)
{
	x->dir = mkdir_in(CKPT_ROOT_INO, "tp");
	x->w = fgen(60, 1000);
	x->c = fgen(36, 5000);
	x->e = fgen(10, 9000);
	for (unsigned r = 0; r < 2; r++) {
		uint8_t *wp = sub2(x->w, 6, 4, 5 * r, 5 * r + 5, 0, 6);
		uint8_t *cp = sub2(x->c, 9, 4, 2 * r, 2 * r + 2, 0, 9);
		char meta[1024], fname[64];
		struct tdef t[3] = {
			{ "w", CKPT_DT_F32, 2, { 5, 6 }, wp },
			{ "c", CKPT_DT_F32, 2, { 2, 9 }, cp },
			{ "e", CKPT_DT_F32, 2, { 5, 2 }, x->e },
		};
		snprintf(meta, sizeof(meta),
			 "{\"version\": 1, \"tensors\": {"
			 "\"w\": {\"global_shape\": [10, 6], \"offsets\": [%u, 0], \"tp_dim\": 0},"
			 "\"c\": {\"global_shape\": [4, 9], \"offsets\": [%u, 0], \"tp_dim\": 1}"
			 "%s}}",
			 5 * r, 2 * r, r == 0 ? ", \"e\": {\"tp_dim\": 0}" : "");
		snprintf(fname, sizeof(fname), "model-rank%u.safetensors", r);
		x->ino[r] = put_st(x->dir, fname, meta, t, r == 0 ? 3 : 2);
		free(wp);
		free(cp);
	}
}

static void tp_teardown(struct tpfix *x)
{
	free(x->w);
	free(x->c);
	free(x->e);
}

START_TEST(test_tp1_whole)
{
	struct tpfix x;
	struct vbuf vb = { 0 };
	ckpt_view *v;
	const char *files[] = { "model.safetensors" };
	const char *order[] = { "c", "e", "w" };
	const uint64_t ws[] = { 10, 6 }, cs[] = { 4, 9 }, es[] = { 5, 2 };

	tp_setup(&x);
	v = build(x.dir, 1, 1, NULL);
	expect_files(v, files, 1);
	ck_assert(ckpt_view_is_source(v, x.ino[0]));
	ck_assert(ckpt_view_is_source(v, x.ino[1]));
	vread(v, "model.safetensors", 1 << 20, &vb);
	expect_names(&vb, order, 3);
	expect_tensor(&vb, "w", CKPT_DT_F32, 2, ws, x.w);
	expect_tensor(&vb, "c", CKPT_DT_F32, 2, cs, x.c);
	expect_tensor(&vb, "e", CKPT_DT_F32, 2, es, x.e);
	ck_assert_uint_eq(vb.size, vb.ds + (60 + 36 + 10) * 4);
	vbuf_free(&vb);
	ckpt_view_unref(v);
	tp_teardown(&x);
}
END_TEST


/* A LEB128 number of a 'P' record at *pos. */
static uint64_t prec_var(const uint8_t *v, size_t n, size_t *pos)
{
	uint64_t x = 0;

	for (unsigned sh = 0;; sh += 7) {
		ck_assert_uint_lt(*pos, n);
		ck_assert_uint_lt(sh, 64);
		x |= (uint64_t)(v[*pos] & 0x7f) << sh;
		if (!(v[(*pos)++] & 0x80))
			return x;
	}
}

/* Split a version-3 'P' record (docs/format.md 5.8) into its tensor
 * entries: *ret_hdr gets the length of the part before them, names[i] each
 * entry's whole name, rest[i] / lens[i] what follows the name. */
static size_t prec_split(const uint8_t *v, size_t n, size_t *ret_hdr, char (*names)[64],
			 const uint8_t **rest, size_t *lens, size_t max)
{
	size_t pos = 1 + 1 + 1 + 1, nt, k;
	uint32_t nt32;
	uint16_t gl;

	ck_assert_uint_eq(v[0], 3);
	ck_assert_uint_le(v[3], 1); /* flags: whether the file has ckptfs metadata */
	memcpy(&nt32, v + pos, 4);
	nt = nt32;
	pos += 4 + 8 + 8 + 8;
	memcpy(&gl, v + pos, 2);
	pos += 2 + gl;
	*ret_hdr = pos;
	ck_assert_uint_le(nt, max);
	for (k = 0; k < nt; k++) {
		uint64_t pre = prec_var(v, n, &pos), sfx = prec_var(v, n, &pos);
		size_t start, nd, md;
		uint8_t fl;

		ck_assert_uint_lt(pre + sfx, 64);
		if (k)
			ck_assert_uint_le(pre, strlen(names[k - 1]));
		else
			ck_assert_uint_eq(pre, 0);
		if (pre)
			memcpy(names[k], names[k - 1], pre);
		memcpy(names[k] + pre, v + pos, sfx);
		names[k][pre + sfx] = '\0';
		pos += sfx;
		start = pos;
		pos += 1 + v[pos]; /* dtype */
		nd = v[pos++];
		for (size_t i = 0; i < nd + 2; i++) /* shape, begin, length */
			prec_var(v, n, &pos);
		md = v[pos++];
		for (size_t i = 0; i < 3 * md; i++)
			prec_var(v, n, &pos);
		fl = v[pos++];
		if (fl & 1) {
			prec_var(v, n, &pos);
			prec_var(v, n, &pos);
		}
		pos += 2; /* tp_dim, pp kind */
		prec_var(v, n, &pos);
		rest[k] = v + start;
		lens[k] = pos - start;
	}
	ck_assert_uint_eq(pos, n);
	return nt;
}

/* The tensor names of a 'P' record are in strcmp order. */
static void prec_expect_sorted(const uint8_t *v, size_t n)
{
	char names[16][64];
	const uint8_t *rest[16];
	size_t lens[16], hl, nt = prec_split(v, n, &hl, names, rest, lens, 16);

	for (size_t k = 1; k < nt; k++)
		ck_assert_str_lt(names[k - 1], names[k]);
}

/* The parse of the sources is persisted in the index ('P' keys): after the
 * in-memory caches are dropped and the store reopened, views are built from
 * the records, byte-identical; a rewritten header invalidates its record. */
START_TEST(test_persisted_parse)
{
	struct tpfix x;
	struct vbuf a = { 0 }, b = { 0 }, c = { 0 };
	struct ckpt_store_opts o;
	uint8_t *val = NULL;
	size_t vlen;
	char err[512] = "";
	ckpt_view *v;

	tp_setup(&x);
	v = build(x.dir, 2, 1, NULL);
	vread(v, "model_tp1_pp0.safetensors", 4097, &a);
	ckpt_view_unref(v);
	ck_assert_int_eq(ckpt_store_parsed_get(st, x.ino[0], &val, &vlen), 0);
	/* tensors in name order (c, e, w), not data order (w, c, e) */
	prec_expect_sorted(val, vlen);
	/* a record whose tensors are not in name order (as version-1 records
	 * were) is used, and written again in name order */
	{
		char names[16][64];
		const uint8_t *rest[16];
		size_t lens[16], hl, nt = prec_split(val, vlen, &hl, names, rest, lens, 16), pos;
		uint8_t *old = malloc(2 * vlen + 64);
		struct vbuf d = { 0 };

		ck_assert_uint_eq(nt, 3);
		memcpy(old, val, hl);
		pos = hl;
		for (size_t k = nt; k-- > 0;) {
			size_t nl = strlen(names[k]);
			old[pos++] = 0;             /* no shared prefix */
			old[pos++] = (uint8_t)nl;   /* < 128: one LEB128 byte */
			memcpy(old + pos, names[k], nl);
			pos += nl;
			memcpy(old + pos, rest[k], lens[k]);
			pos += lens[k];
		}
		ck_assert_int_eq(ckpt_store_parsed_put(st, x.ino[0], old, pos), 0);
		free(old);
		ckpt_view_forget_store(st);
		v = build(x.dir, 2, 1, NULL);
		vread(v, "model_tp1_pp0.safetensors", 4097, &d);
		ck_assert_uint_eq(a.size, d.size);
		ck_assert_mem_eq(a.b, d.b, a.size);
		ckpt_view_unref(v);
		vbuf_free(&d);
		free(val);
		ck_assert_int_eq(ckpt_store_parsed_get(st, x.ino[0], &val, &vlen), 0);
		prec_expect_sorted(val, vlen);
	}
	free(val);
	/* reopen: nothing cached in memory, the records are used */
	ckpt_pool_free(pool);
	ckpt_view_forget_store(st);
	ckpt_store_free(st);
	ckpt_store_opts_init(&o);
	ck_assert_int_eq(ckpt_store_open(spath, &o, &st, err, sizeof(err)), 0);
	ck_assert_int_eq(ckpt_pool_new(2, &pool), 0);
	v = build(x.dir, 2, 1, NULL);
	vread(v, "model_tp1_pp0.safetensors", 4097, &b);
	ck_assert_uint_eq(a.size, b.size);
	ck_assert_mem_eq(a.b, b.b, a.size);
	ckpt_view_unref(v);
	/* a damaged record is ignored (the JSON is parsed again) */
	ck_assert_int_eq(ckpt_store_parsed_put(st, x.ino[1], "\x01junk", 5), 0);
	ckpt_view_forget_store(st);
	v = build(x.dir, 2, 1, NULL);
	vread(v, "model_tp1_pp0.safetensors", 1 << 20, &c);
	ck_assert_mem_eq(a.b, c.b, a.size);
	ckpt_view_unref(v);
	/* ... and replaced by a current one (version 1 records are ignored the
	 * same way) */
	ck_assert_int_eq(ckpt_store_parsed_get(st, x.ino[1], &val, &vlen), 0);
	prec_expect_sorted(val, vlen);
	free(val);
	vbuf_free(&a);
	vbuf_free(&b);
	vbuf_free(&c);
	tp_teardown(&x);
}
END_TEST

/*
 * Whether a source carries ckptfs metadata survives in its persisted parse:
 * after the store is reopened (views built from the records), plain per-rank
 * files that differ are still reported as lacking sharding metadata, and
 * described replicas that differ still as disagreeing replicas.
 */
START_TEST(test_persisted_described)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "naive");
	float *a = fgen(6, 1), *b = fgen(6, 100);
	struct tdef ta = { "w", CKPT_DT_F32, 2, { 2, 3 }, a }, tb = ta;
	struct tdef ga = { "g", CKPT_DT_F32, 2, { 2, 3 }, a }, gb = ga;
	static const char *gmeta = "{\"version\": 1, \"group\": \"described\"}";
	uint64_t ino[4];
	struct ckpt_store_opts o;
	char err[1024] = "", err2[1024] = "", err3[1024] = "", err4[1024] = "";
	uint8_t *val = NULL;
	size_t vlen;
	ckpt_view *v;

	tb.data = b;
	gb.data = b;
	ino[0] = put_st(dir, "rank0.safetensors", NULL, &ta, 1);
	ino[1] = put_st(dir, "rank1.safetensors", NULL, &tb, 1);
	ino[2] = put_st(dir, "g0.safetensors", gmeta, &ga, 1);
	ino[3] = put_st(dir, "g1.safetensors", gmeta, &gb, 1);
	v = build(dir, 1, 1, NULL);
	ck_assert_int_eq(try_open(v, "model.safetensors", err, sizeof(err)), -EIO);
	ck_assert_int_eq(try_open(v, "described.safetensors", err3, sizeof(err3)), -EIO);
	ckpt_view_unref(v);
	ck_assert_msg(strstr(err, "no sharding metadata") != NULL, "%s", err);
	ck_assert_msg(strstr(err3, "replicas disagree") != NULL, "%s", err3);
	for (int i = 0; i < 4; i++) {
		ck_assert_int_eq(ckpt_store_parsed_get(st, ino[i], &val, &vlen), 0);
		ck_assert_uint_ge(vlen, 4);
		ck_assert_uint_eq(val[0], 3);
		ck_assert_uint_eq(val[3], i < 2 ? 0 : 1);
		free(val);
	}
	ckpt_pool_free(pool);
	ckpt_view_forget_store(st);
	ckpt_store_free(st);
	ckpt_store_opts_init(&o);
	ck_assert_int_eq(ckpt_store_open(spath, &o, &st, err2, sizeof(err2)), 0);
	ck_assert_int_eq(ckpt_pool_new(2, &pool), 0);
	v = build(dir, 1, 1, NULL);
	ck_assert_int_eq(try_open(v, "model.safetensors", err2, sizeof(err2)), -EIO);
	ck_assert_int_eq(try_open(v, "described.safetensors", err4, sizeof(err4)), -EIO);
	ckpt_view_unref(v);
	ck_assert_str_eq(err2, err);
	ck_assert_str_eq(err4, err3);
	/* the views take the flag from the record: marked as described, the
	 * plain files' replicas are reported as such */
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(ckpt_store_parsed_get(st, ino[i], &val, &vlen), 0);
		val[3] = 1;
		ck_assert_int_eq(ckpt_store_parsed_put(st, ino[i], val, vlen), 0);
		free(val);
	}
	ckpt_view_forget_store(st);
	v = build(dir, 1, 1, NULL);
	ck_assert_int_eq(try_open(v, "model.safetensors", err2, sizeof(err2)), -EIO);
	ckpt_view_unref(v);
	ck_assert_msg(strstr(err2, "replicas disagree (rank0.safetensors and rank1.safetensors"),
		      "%s", err2);
	free(a);
	free(b);
}
END_TEST

/* tp4: torch.chunk of 10 rows -> 3, 3, 3, 1; of 5 rows -> 2, 2, 1, 0 */
START_TEST(test_tp4_uneven)
{
	struct tpfix x;
	ckpt_view *v;
	const char *files[] = { "model_tp0_pp0.safetensors", "model_tp1_pp0.safetensors",
				"model_tp2_pp0.safetensors", "model_tp3_pp0.safetensors" };
	const uint64_t wb[] = { 0, 3, 6, 9, 10 }, eb[] = { 0, 2, 4, 5, 5 };
	tp_setup(&x);
	v = build(x.dir, 4, 1, NULL);
	expect_files(v, files, 4);
	for (unsigned t = 0; t < 4; t++) {
		struct vbuf vb = { 0 };
		uint64_t ws[2] = { wb[t + 1] - wb[t], 6 }, es[2] = { eb[t + 1] - eb[t], 2 };
		uint64_t c0 = CKPT_MIN(3u * t, 9u), c1 = CKPT_MIN(3u * t + 3, 9u);
		uint64_t cs[2] = { 4, c1 - c0 };
		uint8_t *we = sub2(x.w, 6, 4, wb[t], wb[t + 1], 0, 6);
		uint8_t *ee = sub2(x.e, 2, 4, eb[t], eb[t + 1], 0, 2);
		uint8_t *ce = sub2(x.c, 9, 4, 0, 4, c0, c1);

		vread(v, files[t], 4096, &vb);
		expect_tensor(&vb, "w", CKPT_DT_F32, 2, ws, we);
		expect_tensor(&vb, "e", CKPT_DT_F32, 2, es, ee);
		expect_tensor(&vb, "c", CKPT_DT_F32, 2, cs, ce);
		ck_assert_uint_eq(vb.size, vb.ds + (ws[0] * 6 + es[0] * 2 + 4 * cs[1]) * 4);
		free(we);
		free(ee);
		free(ce);
		vbuf_free(&vb);
	}
	ckpt_view_unref(v);
	tp_teardown(&x);
}
END_TEST

/* tp3: c has tp_dim 1 but was saved split on rows -> every part reads both
 * sources (cross-dim resharding); w: 10 rows / 3 -> 4, 4, 2. */
START_TEST(test_tp3_cross_dim)
{
	struct tpfix x;
	ckpt_view *v;
	const uint64_t wb[] = { 0, 4, 8, 10 };

	tp_setup(&x);
	v = build(x.dir, 3, 1, NULL);
	ck_assert_uint_eq(ckpt_view_nfiles(v), 3);
	for (unsigned t = 0; t < 3; t++) {
		struct vbuf vb = { 0 };
		char fname[64];
		uint64_t cs[2] = { 4, 3 }, ws[2] = { wb[t + 1] - wb[t], 6 };
		uint8_t *ce = sub2(x.c, 9, 4, 0, 4, 3 * t, 3 * t + 3);
		uint8_t *we = sub2(x.w, 6, 4, wb[t], wb[t + 1], 0, 6);

		snprintf(fname, sizeof(fname), "model_tp%u_pp0.safetensors", t);
		ck_assert_str_eq(ckpt_view_file_name(v, t), fname);
		vread(v, fname, 7, &vb);
		expect_tensor(&vb, "c", CKPT_DT_F32, 2, cs, ce);
		expect_tensor(&vb, "w", CKPT_DT_F32, 2, ws, we);
		free(ce);
		free(we);
		vbuf_free(&vb);
	}
	ckpt_view_unref(v);
	tp_teardown(&x);
}
END_TEST

/* Header of a view file: order, metadata, ckptfs entry, sizes, and reads in
 * odd-sized pieces give the same bytes. */
#define BR 520u
#define BC 1024u
#define BH (BR / 2)

START_TEST(test_header_and_reads)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "hdr");
	/* BR x BC F32 split in 2 (tp2 rows): each half is more than one 1 MiB chunk */
	float *big = fgen(BR * BC, 1);
	double f64[3] = { 1.5, -2.5, 3.25 };
	int64_t i64[2] = { -7, 1LL << 40 };
	uint16_t bf[5] = { 1, 2, 3, 4, 5 };
	uint8_t u8[3] = { 9, 8, 7 };
	float a32[4] = { 0.5f, 1.5f, 2.5f, 3.5f };
	const char *order[] = { "f64", "i64", "a32", "big", "bf", "u8" };
	struct vbuf ref = { 0 };
	ckpt_view *v;
	ckpt_shardmeta *sm = NULL;
	struct ckpt_tensor_meta tm;
	const char *fmt = NULL;
	char err[512];
	uint64_t nl = 0;

	for (unsigned r = 0; r < 2; r++) {
		uint8_t *bp = sub2(big, BC, 4, BH * r, BH * r + BH, 0, BC);
		char m[256], fname[32];
		struct tdef t[] = {
			{ "u8", CKPT_DT_U8, 1, { 3 }, u8 },
			{ "big", CKPT_DT_F32, 2, { BH, BC }, bp },
			{ "bf", CKPT_DT_BF16, 1, { 5 }, bf },
			{ "f64", CKPT_DT_F64, 1, { 3 }, f64 },
			{ "i64", CKPT_DT_I64, 1, { 2 }, i64 },
			{ "a32", CKPT_DT_F32, 1, { 4 }, a32 },
		};
		snprintf(m, sizeof(m),
			 "{\"version\":1,\"tensors\":{\"big\":{\"global_shape\":[%u,%u],"
			 "\"offsets\":[%u,0]}}}",
			 BR, BC, BH * r);
		snprintf(fname, sizeof(fname), "r%u.safetensors", r);
		put_st(dir, fname, m, t, CKPT_ARRAY_SIZE(t));
		free(bp);
	}
	v = build(dir, 2, 1, NULL);
	ck_assert_uint_eq(ckpt_view_nfiles(v), 2);
	for (unsigned t = 0; t < 2; t++) {
		const char *fname = ckpt_view_file_name(v, t);
		uint64_t bs[2] = { BH, BC }, s3[1] = { 3 }, s2[1] = { 2 }, s4[1] = { 4 };
		uint64_t s5[1] = { 5 };
		uint8_t *be = sub2(big, BC, 4, BH * t, BH * t + BH, 0, BC);
		uint64_t data = 0;

		vread(v, fname, 1 << 20, &ref);
		expect_names(&ref, order, 6);
		expect_tensor(&ref, "big", CKPT_DT_F32, 2, bs, be);
		expect_tensor(&ref, "f64", CKPT_DT_F64, 1, s3, f64);
		expect_tensor(&ref, "i64", CKPT_DT_I64, 1, s2, i64);
		expect_tensor(&ref, "a32", CKPT_DT_F32, 1, s4, a32);
		expect_tensor(&ref, "bf", CKPT_DT_BF16, 1, s5, bf);
		expect_tensor(&ref, "u8", CKPT_DT_U8, 1, s3, u8);
		free(be);
		for (size_t i = 0; i < ckpt_st_tensor_count(ref.h); i++) {
			const struct ckpt_st_tensor *x = ckpt_st_tensor_at(ref.h, i);
			ck_assert_uint_eq(x->begin, data);
			data = x->end;
		}
		ck_assert_uint_eq(ckpt_view_file_size(v, t), ref.ds + data);
		ck_assert_uint_eq(data, BH * BC * 4 + 24 + 16 + 16 + 10 + 3);

		/* metadata */
		ck_assert_uint_eq(ckpt_st_metadata_count(ref.h), 2);
		fmt = ckpt_st_metadata_get(ref.h, "format");
		ck_assert_ptr_nonnull(fmt);
		ck_assert_str_eq(fmt, "pt");
		ck_assert_ptr_nonnull(ckpt_st_metadata_get(ref.h, CKPT_SHARDMETA_KEY));
		ck_assert_msg(ckpt_shardmeta_parse(ref.h, &sm, err, sizeof(err)) == 0, "%s", err);
		ck_assert_str_eq(ckpt_shardmeta_group(sm), "model");
		ck_assert(ckpt_shardmeta_num_layers(sm, &nl));
		ck_assert_uint_eq(nl, 0);
		ck_assert_int_eq(ckpt_shardmeta_tensor(sm, ckpt_st_tensor_find(ref.h, "big"), &tm),
				 0);
		ck_assert_uint_eq(tm.ndim, 2);
		ck_assert_uint_eq(tm.global_shape[0], BR);
		ck_assert_uint_eq(tm.global_shape[1], BC);
		ck_assert_uint_eq(tm.geom.box.off[0], BH * t);
		ck_assert_uint_eq(tm.geom.box.off[1], 0);
		ck_assert_uint_eq(tm.geom.box.shape[0], BH);
		ck_assert_uint_eq(tm.geom.box.shape[1], BC);
		ck_assert(!tm.geom.flat);
		ck_assert_int_eq(tm.tp_dim, 0);
		ck_assert(tm.has_pp);
		ck_assert_int_eq(tm.pp.kind, CKPT_PP_LAST);
		ck_assert_int_eq(ckpt_shardmeta_tensor(sm, ckpt_st_tensor_find(ref.h, "u8"), &tm),
				 0);
		ck_assert_int_eq(tm.tp_dim, -1); /* replicated (built-in rules) */
		ck_assert_uint_eq(tm.global_shape[0], 3);
		ckpt_shardmeta_free(sm);
		sm = NULL;

		/* odd-sized reads, sequential, give the same bytes */
		{
			const size_t pieces[] = { 4097, 65536 + 3 };
			for (size_t k = 0; k < CKPT_ARRAY_SIZE(pieces); k++) {
				struct vbuf vb = { 0 };
				vread(v, fname, pieces[k], &vb);
				ck_assert_uint_eq(vb.size, ref.size);
				ck_assert(memcmp(vb.b, ref.b, ref.size) == 0);
				vbuf_free(&vb);
			}
		}
		/* 7-byte reads over the header and the first 64 KiB of data */
		{
			ckpt_vfile *f = NULL;
			uint8_t *buf = malloc(ref.ds + 65536 + 7);
			ck_assert_ptr_nonnull(buf);
			ck_assert_int_eq(ckpt_vfile_open(v, t, &f, err, sizeof(err)), 0);
			for (uint64_t off = 0; off < ref.ds + 65536; off += 7)
				ck_assert_int_eq(ckpt_vfile_read(f, buf + off, 7, off), 7);
			ck_assert(memcmp(buf, ref.b, ref.ds + 65536) == 0);
			ckpt_vfile_free(f);
			free(buf);
		}
		/* random-offset reads crossing the header/data and chunk boundaries */
		{
			ckpt_vfile *f = NULL;
			uint8_t buf[9000];
			const uint64_t offs[] = { 0, ref.ds - 5, ref.ds, (1u << 20) - 3,
						  ref.size - 4096, ref.size - 1 };
			ck_assert_int_eq(ckpt_vfile_open(v, t, &f, err, sizeof(err)), 0);
			for (size_t k = 0; k < CKPT_ARRAY_SIZE(offs); k++) {
				uint64_t want = CKPT_MIN((uint64_t)sizeof(buf), ref.size - offs[k]);
				ck_assert_int_eq(ckpt_vfile_read(f, buf, sizeof(buf), offs[k]),
						 (ssize_t)want);
				ck_assert(memcmp(buf, ref.b + offs[k], want) == 0);
			}
			ck_assert_int_eq(ckpt_vfile_read(f, buf, 1, ref.size + 100), 0);
			ckpt_vfile_free(f);
		}
		vbuf_free(&ref);
	}
	/* tp1: the whole of big */
	ckpt_view_unref(v);
	v = build(dir, 1, 1, NULL);
	{
		uint64_t bs[2] = { BR, BC };
		vread(v, "model.safetensors", 4097, &ref);
		expect_tensor(&ref, "big", CKPT_DT_F32, 2, bs, big);
		vbuf_free(&ref);
	}
	ckpt_view_unref(v);
	free(big);
}
END_TEST

/* ---- pipeline placement ----------------------------------------------- */

#define NPP 12 /* tensors of the pipeline fixture */

struct ppfix {
	uint64_t dir;
	const char *names[NPP];
	float *data[NPP];
	uint64_t shape[NPP][2];
};

/*
 * Saved pp2 in two files: layers 0-2 + embed in pp0, layers 3-5 + lm_head +
 * norm in pp1; rope.inv_freq ("all") and shared.scale ("ends") in both.
 * num_layers: the JSON fragment to add to the metadata ("" = absent).
 */
static void pp_setup(struct ppfix *x, const char *dirname, const char *num_layers)
{
	static const char *names[NPP] = {
		"lm_head.weight",
		"model.embed_tokens.weight",
		"model.layers.0.mlp.weight",
		"model.layers.1.mlp.weight",
		"model.layers.2.mlp.weight",
		"model.layers.3.mlp.weight",
		"model.layers.4.mlp.weight",
		"model.layers.5.mlp.weight",
		"model.norm.weight",
		"rope.inv_freq",
		"shared.scale",
		"special.first",
	};
	/* explicit pp entries; special.first would be on the last stage by name */
	static const char *pps[NPP] = {
		[0] = "last", [9] = "all", [10] = "ends", [11] = "first",
	};
	/* file of each tensor: 0, 1 or 2 (both) */
	static const int where[NPP] = { 1, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 0 };

	x->dir = mkdir_in(CKPT_ROOT_INO, dirname);
	for (size_t i = 0; i < NPP; i++) {
		x->names[i] = names[i];
		x->shape[i][0] = 2;
		x->shape[i][1] = 3 + (i % 3);
		x->data[i] = fgen(x->shape[i][0] * x->shape[i][1], 100.0f * (float)i);
	}
	for (int f = 0; f < 2; f++) {
		struct tdef t[NPP];
		size_t n = 0, k;
		char m[2048], fname[32];
		const char *sep = "";

		k = (size_t)snprintf(m, sizeof(m), "{\"version\": 1%s, \"tensors\": {", num_layers);
		for (size_t i = 0; i < NPP; i++) {
			if (where[i] != f && where[i] != 2)
				continue;
			t[n].name = names[i];
			t[n].dt = CKPT_DT_F32;
			t[n].ndim = 2;
			t[n].shape[0] = x->shape[i][0];
			t[n].shape[1] = x->shape[i][1];
			t[n].data = x->data[i];
			n++;
			if (pps[i]) {
				k += (size_t)snprintf(m + k, sizeof(m) - k,
						      "%s\"%s\": {\"pp\": \"%s\"}", sep,
						      names[i], pps[i]);
				sep = ", ";
			}
		}
		snprintf(m + k, sizeof(m) - k, "}}");
		snprintf(fname, sizeof(fname), "pp%d.safetensors", f);
		put_st(x->dir, fname, m, t, n);
	}
}

static void pp_teardown(struct ppfix *x)
{
	for (size_t i = 0; i < NPP; i++)
		free(x->data[i]);
}

static void pp_expect(ckpt_view *v, struct ppfix *x, unsigned p, const char *const *names,
		      size_t n, uint64_t num_layers)
{
	struct vbuf vb = { 0 };
	char fname[64], err[256];
	ckpt_shardmeta *sm = NULL;
	uint64_t nl = 0;

	snprintf(fname, sizeof(fname), "model_tp0_pp%u.safetensors", p);
	vread(v, fname, 4097, &vb);
	expect_names(&vb, names, n);
	for (size_t k = 0; k < n; k++) {
		for (size_t i = 0; i < NPP; i++)
			if (!strcmp(x->names[i], names[k]))
				expect_tensor(&vb, names[k], CKPT_DT_F32, 2, x->shape[i],
					      x->data[i]);
	}
	ck_assert_msg(ckpt_shardmeta_parse(vb.h, &sm, err, sizeof(err)) == 0, "%s", err);
	ck_assert(ckpt_shardmeta_num_layers(sm, &nl));
	ck_assert_uint_eq(nl, num_layers);
	ckpt_shardmeta_free(sm);
	vbuf_free(&vb);
}

START_TEST(test_pp_inferred_layers)
{
	struct ppfix x;
	ckpt_view *v;
	struct ckpt_view_group_info gi;
	/* N = 6, P = 4: stage p holds layers [floor(6p/4), floor(6(p+1)/4)) =
	 * {0}, {1, 2}, {3}, {4, 5} */
	const char *s0[] = { "model.embed_tokens.weight", "model.layers.0.mlp.weight",
			     "rope.inv_freq", "shared.scale", "special.first" };
	const char *s1[] = { "model.layers.1.mlp.weight", "model.layers.2.mlp.weight",
			     "rope.inv_freq" };
	const char *s2[] = { "model.layers.3.mlp.weight", "rope.inv_freq" };
	const char *s3[] = { "lm_head.weight", "model.layers.4.mlp.weight",
			     "model.layers.5.mlp.weight", "model.norm.weight", "rope.inv_freq",
			     "shared.scale" };
	const char *files[] = { "model_tp0_pp0.safetensors", "model_tp0_pp1.safetensors",
				"model_tp0_pp2.safetensors", "model_tp0_pp3.safetensors" };

	pp_setup(&x, "pp", "");
	v = build(x.dir, 1, 4, NULL);
	expect_files(v, files, 4);
	pp_expect(v, &x, 0, s0, CKPT_ARRAY_SIZE(s0), 6);
	pp_expect(v, &x, 1, s1, CKPT_ARRAY_SIZE(s1), 6);
	pp_expect(v, &x, 2, s2, CKPT_ARRAY_SIZE(s2), 6);
	pp_expect(v, &x, 3, s3, CKPT_ARRAY_SIZE(s3), 6);
	ck_assert_uint_eq(ckpt_view_ngroups(v), 1);
	ckpt_view_group_info(v, 0, &gi);
	ck_assert_str_eq(gi.name, "model");
	ck_assert_uint_eq(gi.tensors, NPP);
	ck_assert_uint_eq(gi.files, 2);
	ck_assert_uint_eq(gi.saved_tp, 1);
	ck_assert_uint_eq(gi.saved_pp, 2);
	ck_assert_uint_eq(gi.num_layers, 6);
	ck_assert_uint_eq(gi.problems, 0);
	ckpt_view_unref(v);
	pp_teardown(&x);
}
END_TEST

START_TEST(test_pp_explicit_layers)
{
	struct ppfix x;
	ckpt_view *v;
	struct ckpt_view_group_info gi;
	/* N = 8, P = 4: {0, 1}, {2, 3}, {4, 5}, {6, 7} */
	const char *s0[] = { "model.embed_tokens.weight", "model.layers.0.mlp.weight",
			     "model.layers.1.mlp.weight", "rope.inv_freq", "shared.scale",
			     "special.first" };
	const char *s1[] = { "model.layers.2.mlp.weight", "model.layers.3.mlp.weight",
			     "rope.inv_freq" };
	const char *s2[] = { "model.layers.4.mlp.weight", "model.layers.5.mlp.weight",
			     "rope.inv_freq" };
	const char *s3[] = { "lm_head.weight", "model.norm.weight", "rope.inv_freq",
			     "shared.scale" };

	pp_setup(&x, "pp8", ", \"num_layers\": 8");
	v = build(x.dir, 1, 4, NULL);
	ck_assert_uint_eq(ckpt_view_nfiles(v), 4);
	pp_expect(v, &x, 0, s0, CKPT_ARRAY_SIZE(s0), 8);
	pp_expect(v, &x, 1, s1, CKPT_ARRAY_SIZE(s1), 8);
	pp_expect(v, &x, 2, s2, CKPT_ARRAY_SIZE(s2), 8);
	pp_expect(v, &x, 3, s3, CKPT_ARRAY_SIZE(s3), 8);
	ckpt_view_group_info(v, 0, &gi);
	ck_assert_uint_eq(gi.num_layers, 8);
	ck_assert_uint_eq(gi.saved_pp, 2);
	ckpt_view_unref(v);

	/* tp1_pp1 of the same directory: one file with everything */
	v = build(x.dir, 1, 1, NULL);
	{
		struct vbuf vb = { 0 };
		vread(v, "model.safetensors", 4096, &vb);
		ck_assert_uint_eq(ckpt_st_tensor_count(vb.h), NPP);
		for (size_t i = 0; i < NPP; i++)
			expect_tensor(&vb, x.names[i], CKPT_DT_F32, 2, x.shape[i], x.data[i]);
		vbuf_free(&vb);
	}
	ckpt_view_unref(v);
	pp_teardown(&x);
}
END_TEST

/*
 * num_layers given as 4 but the names hold layers 0..5: layout.h says a
 * layer >= num_layers goes to the last stage, shardmeta.h only bounds
 * explicit "pp" integers, and view.h does not list -EINVAL for
 * ckpt_view_build.  The view must still build.
 */
START_TEST(test_pp_layer_beyond_num_layers)
{
	struct ppfix x;
	struct ckpt_layout l = { 1, 2 };
	ckpt_view *v = NULL;
	char err[512] = "";
	int r;
	/* N = 4, P = 2: {0, 1}, {2, 3} + layers 4, 5 on the last stage */
	const char *s0[] = { "model.embed_tokens.weight", "model.layers.0.mlp.weight",
			     "model.layers.1.mlp.weight", "rope.inv_freq", "shared.scale",
			     "special.first" };

	pp_setup(&x, "pp4", ", \"num_layers\": 4");
	r = ckpt_view_build(st, x.dir, &l, NULL, &v, err, sizeof(err));
	if (r != 0)
		pp_teardown(&x); /* nothing leaks when the assertion fails */
	ck_assert_msg(r == 0,
		      "ckpt_view_build with num_layers 4 and a tensor named layers.5: %d (%s)", r,
		      err);
	pp_expect(v, &x, 0, s0, CKPT_ARRAY_SIZE(s0), 4);
	ckpt_view_unref(v);
	pp_teardown(&x);
}
END_TEST

/* ---- FSDP flat pieces ------------------------------------------------- */

START_TEST(test_fsdp_flat)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "fsdp");
	float *ea = fgen(35, 300), *sq = fgen(35, 700);
	const unsigned cut[] = { 0, 12, 20, 35 };
	struct ckpt_view_group_info gi;
	ckpt_view *v;
	struct vbuf vb = { 0 };
	const uint64_t s57[] = { 5, 7 }, s37[] = { 3, 7 }, s27[] = { 2, 7 };
	const char *files1[] = { "optim.safetensors" };
	const char *files2[] = { "optim_tp0_pp0.safetensors", "optim_tp1_pp0.safetensors" };

	for (unsigned r = 0; r < 3; r++) {
		char meta[1024], fname[32];
		struct tdef t[2] = {
			{ "exp_avg", CKPT_DT_F32, 1, { cut[r + 1] - cut[r] }, ea + cut[r] },
			{ "exp_avg_sq", CKPT_DT_F32, 1, { cut[r + 1] - cut[r] }, sq + cut[r] },
		};
		snprintf(meta, sizeof(meta),
			 "{\"version\": 1, \"group\": \"optim\", \"tensors\": {"
			 "\"exp_avg\": {\"global_shape\": [5, 7], \"offsets\": [0, 0], "
			 "\"box_shape\": [5, 7], \"flat_range\": [%u, %u], \"tp_dim\": 0},"
			 "\"exp_avg_sq\": {\"global_shape\": [5, 7], \"flat_range\": [%u, %u]}}}",
			 cut[r], cut[r + 1], cut[r], cut[r + 1]);
		snprintf(fname, sizeof(fname), "fsdp%u.safetensors", r);
		put_st(dir, fname, meta, t, 2);
	}
	v = build(dir, 1, 1, NULL);
	expect_files(v, files1, 1);
	vread(v, "optim.safetensors", 7, &vb);
	expect_tensor(&vb, "exp_avg", CKPT_DT_F32, 2, s57, ea);
	expect_tensor(&vb, "exp_avg_sq", CKPT_DT_F32, 2, s57, sq);
	vbuf_free(&vb);
	ckpt_view_group_info(v, 0, &gi);
	ck_assert_str_eq(gi.name, "optim");
	ck_assert_uint_eq(gi.tensors, 2);
	ck_assert_uint_eq(gi.files, 3);
	ck_assert_uint_eq(gi.saved_tp, 1);
	ck_assert_uint_eq(gi.saved_pp, 1);
	ck_assert_uint_eq(gi.num_layers, 0);
	ck_assert_uint_eq(gi.problems, 0);
	ckpt_view_unref(v);

	/* tp2: exp_avg rows [0,3) = elements [0,21) from all three pieces,
	 * rows [3,5) from the last; exp_avg_sq replicated (no tp_dim, no rule) */
	v = build(dir, 2, 1, NULL);
	expect_files(v, files2, 2);
	vread(v, files2[0], 4097, &vb);
	expect_tensor(&vb, "exp_avg", CKPT_DT_F32, 2, s37, ea);
	expect_tensor(&vb, "exp_avg_sq", CKPT_DT_F32, 2, s57, sq);
	vbuf_free(&vb);
	vread(v, files2[1], 4097, &vb);
	expect_tensor(&vb, "exp_avg", CKPT_DT_F32, 2, s27, ea + 21);
	expect_tensor(&vb, "exp_avg_sq", CKPT_DT_F32, 2, s57, sq);
	vbuf_free(&vb);
	ckpt_view_unref(v);
	free(ea);
	free(sq);
}
END_TEST

/* A flat range missing in the middle: -EIO naming the tensor and index. */
START_TEST(test_fsdp_gap)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "gap");
	float *ea = fgen(35, 300);
	const unsigned cut[] = { 0, 12, 20, 35 };
	ckpt_view *v;
	char err[1024];

	for (unsigned r = 0; r < 3; r += 2) {
		char meta[512], fname[32];
		struct tdef t = { "exp_avg", CKPT_DT_F32, 1, { cut[r + 1] - cut[r] }, ea + cut[r] };
		snprintf(meta, sizeof(meta),
			 "{\"version\": 1, \"tensors\": {\"exp_avg\": {\"global_shape\": [5, 7],"
			 " \"flat_range\": [%u, %u]}}}",
			 cut[r], cut[r + 1]);
		snprintf(fname, sizeof(fname), "fsdp%u.safetensors", r);
		put_st(dir, fname, meta, &t, 1);
	}
	v = build(dir, 1, 1, NULL);
	ck_assert_int_eq(try_open(v, "model.safetensors", err, sizeof(err)), -EIO);
	/* elements [12, 20) missing: index [1, 5] of the 5x7 tensor */
	ck_assert_str_eq(err, "group 'model', tensor 'exp_avg': no stored piece covers 8 elements "
			      "starting at index [1, 5]");
	ckpt_view_unref(v);
	free(ea);
}
END_TEST


/*
 * Runs are computed per tensor on the first read of its bytes, by whichever
 * reader gets there first: several threads reading one open file at once,
 * in different orders and sizes, all get the right bytes.  Tensors cut
 * along dim 1 give one run per row and source.
 */
struct creader {
	ckpt_vfile *f;
	uint64_t size;
	size_t piece;
	bool backwards;
	uint8_t *b;
	int bad;
};

static void *creader_main(void *arg)
{
	struct creader *c = arg;
	uint64_t nblocks = (c->size + c->piece - 1) / c->piece;

	for (uint64_t k = 0; k < nblocks; k++) {
		uint64_t blk = c->backwards ? nblocks - 1 - k : k, off = blk * c->piece;
		size_t want = (size_t)CKPT_MIN((uint64_t)c->piece, c->size - off);
		if (ckpt_vfile_read(c->f, c->b + off, c->piece, off) != (ssize_t)want)
			c->bad++;
	}
	return NULL;
}

START_TEST(test_concurrent_reads)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "conc");
	enum { R = 37, C = 24, NT = 6, NTH = 4 };
	float *w[NT];
	uint8_t *h0[NT], *h1[NT];
	struct tdef t0[NT], t1[NT];
	char names[NT][16], meta0[2048], meta1[2048];
	size_t k0 = 0, k1 = 0;
	const uint64_t s[] = { R, C };
	struct creader cr[NTH];
	pthread_t th[NTH];
	struct vbuf vb = { 0 };
	ckpt_vfile *f = NULL;
	char err[1024] = "";
	ckpt_view *v;
	int i;

	k0 = (size_t)snprintf(meta0, sizeof(meta0), "{\"version\": 1, \"tensors\": {");
	k1 = (size_t)snprintf(meta1, sizeof(meta1), "{\"version\": 1, \"tensors\": {");
	for (int t = 0; t < NT; t++) {
		snprintf(names[t], sizeof(names[t]), "w%d", t);
		w[t] = fgen(R * C, (float)(1000 * t));
		h0[t] = sub2(w[t], C, 4, 0, R, 0, C / 2);
		h1[t] = sub2(w[t], C, 4, 0, R, C / 2, C);
		t0[t] = (struct tdef){ names[t], CKPT_DT_F32, 2, { R, C / 2 }, h0[t] };
		t1[t] = (struct tdef){ names[t], CKPT_DT_F32, 2, { R, C / 2 }, h1[t] };
		k0 += (size_t)snprintf(meta0 + k0, sizeof(meta0) - k0,
				       "%s\"%s\": {\"global_shape\": [%d, %d], \"offsets\": [0, 0]}",
				       t ? ", " : "", names[t], R, C);
		k1 += (size_t)snprintf(meta1 + k1, sizeof(meta1) - k1,
				       "%s\"%s\": {\"global_shape\": [%d, %d], \"offsets\": [0, %d]}",
				       t ? ", " : "", names[t], R, C, C / 2);
	}
	snprintf(meta0 + k0, sizeof(meta0) - k0, "}}");
	snprintf(meta1 + k1, sizeof(meta1) - k1, "}}");
	put_st(dir, "r0.safetensors", meta0, t0, NT);
	put_st(dir, "r1.safetensors", meta1, t1, NT);
	v = build(dir, 1, 1, NULL);
	vread(v, "model.safetensors", 4096, &vb);
	for (int t = 0; t < NT; t++)
		expect_tensor(&vb, names[t], CKPT_DT_F32, 2, s, w[t]);
	i = ckpt_view_find(v, "model.safetensors");
	ck_assert_int_ge(i, 0);
	ck_assert_int_eq(ckpt_vfile_open(v, (size_t)i, &f, err, sizeof(err)), 0);
	for (int k = 0; k < NTH; k++) {
		static const size_t pieces[NTH] = { 7, 100, 4096, 13 };
		cr[k] = (struct creader){ f, vb.size, pieces[k], k % 2 == 1, calloc(1, vb.size),
					  0 };
		ck_assert_ptr_nonnull(cr[k].b);
		ck_assert_int_eq(pthread_create(&th[k], NULL, creader_main, &cr[k]), 0);
	}
	for (int k = 0; k < NTH; k++) {
		ck_assert_int_eq(pthread_join(th[k], NULL), 0);
		ck_assert_int_eq(cr[k].bad, 0);
		ck_assert_msg(memcmp(cr[k].b, vb.b, vb.size) == 0, "reader %d got other bytes", k);
		free(cr[k].b);
	}
	ckpt_vfile_free(f);
	vbuf_free(&vb);
	ckpt_view_unref(v);
	for (int t = 0; t < NT; t++) {
		free(w[t]);
		free(h0[t]);
		free(h1[t]);
	}
}
END_TEST

/*
 * Directory "big": w [512, 256] F32 saved tp2 split on rows, so that a
 * tp1 view reads it as two runs of 256 KiB, one from each source.
 */
struct bigfix {
	uint64_t dir, ino[2];
	float *w;
};

static void big_setup(struct bigfix *x)
{
	x->dir = mkdir_in(CKPT_ROOT_INO, "big");
	x->w = fgen(512 * 256, 1);
	for (unsigned r = 0; r < 2; r++) {
		uint8_t *wp = sub2(x->w, 256, 4, 256 * r, 256 * r + 256, 0, 256);
		struct tdef t = { "w", CKPT_DT_F32, 2, { 256, 256 }, wp };
		char meta[256], fname[64];

		snprintf(meta, sizeof(meta),
			 "{\"version\": 1, \"tensors\": {\"w\": {\"global_shape\": [512, 256], "
			 "\"offsets\": [%u, 0], \"tp_dim\": 0}}}",
			 256 * r);
		snprintf(fname, sizeof(fname), "r%u.safetensors", r);
		x->ino[r] = put_st(x->dir, fname, meta, &t, 1);
		free(wp);
	}
}

static ckpt_vfile *open_file(ckpt_view *v, const char *fname)
{
	int i = ckpt_view_find(v, fname);
	ckpt_vfile *f = NULL;
	char err[512] = "";

	ck_assert_int_ge(i, 0);
	ck_assert_msg(ckpt_vfile_open(v, (size_t)i, &f, err, sizeof(err)) == 0, "%s", err);
	return f;
}

/* A read with a gather lists the same bytes as a plain read, handing the
 * large chunk pieces over from the cache instead of copying them. */
START_TEST(test_read_gather)
{
	struct bigfix x;
	struct vbuf vb = { 0 };
	struct ckpt_gather g;
	ckpt_view *v;
	ckpt_vfile *f;
	uint8_t *buf, *cat;
	size_t pos = 0, zero_copy = 0;
	ssize_t got;

	big_setup(&x);
	v = build(x.dir, 1, 1, NULL);
	vread(v, "model.safetensors", 1 << 20, &vb);
	f = open_file(v, "model.safetensors");
	buf = malloc(vb.size);
	cat = malloc(vb.size);
	ck_assert(buf && cat);
	ckpt_gather_init(&g);
	/* from inside the header to the end */
	got = ckpt_vfile_read_gather(f, buf, vb.size - 5, 5, &g);
	ck_assert_int_eq(got, (ssize_t)(vb.size - 5));
	ck_assert_uint_gt(g.niov, 1);
	for (size_t i = 0; i < g.niov; i++) {
		const uint8_t *p = g.iov[i].iov_base;
		if (p < buf || p >= buf + vb.size)
			zero_copy += g.iov[i].iov_len;
		memcpy(cat + pos, p, g.iov[i].iov_len);
		pos += g.iov[i].iov_len;
	}
	ck_assert_uint_eq(pos, vb.size - 5);
	ck_assert_mem_eq(cat, vb.b + 5, pos);
	ck_assert_uint_ge(zero_copy, CKPT_GATHER_MIN);
	ckpt_store_gather_done(st, &g);
	free(buf);
	free(cat);
	ckpt_vfile_free(f);
	vbuf_free(&vb);
	ckpt_view_unref(v);
	free(x.w);
}
END_TEST

static bool digest_in(const ckpt_digest *d, const ckpt_digest *set, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!memcmp(d->bytes, set[i].bytes, CKPT_DIGEST_LEN))
			return true;
	return false;
}

/* The chunks behind a range of a view file (for read-ahead): those of the
 * source bytes it maps to, at most max. */
START_TEST(test_vfile_chunks)
{
	struct bigfix x;
	ckpt_digest src[2][32], got[64];
	size_t nsrc[2] = { 0, 0 }, n;
	uint64_t size, half;
	ckpt_view *v;
	ckpt_vfile *f;

	big_setup(&x);
	/* the data chunks of each source (extents that reach past its header) */
	for (unsigned r = 0; r < 2; r++) {
		struct ckpt_extent_list *l = NULL;
		uint8_t prefix[8];
		uint64_t hn;

		ck_assert_int_eq(ckpt_store_load_extents(st, x.ino[r], &l), 0);
		ck_assert_int_eq(ckpt_store_read_extents(st, l, prefix, 8, 0), 8);
		ck_assert_int_eq(ckpt_st_header_len(prefix, &hn), 0);
		for (size_t i = 0; i < l->n; i++)
			if (l->v[i].kind == CKPT_EXT_CHUNK && l->v[i].off + l->v[i].len > 8 + hn &&
			    !digest_in(&l->v[i].digest, src[r], nsrc[r])) {
				ck_assert_uint_lt(nsrc[r], 32);
				src[r][nsrc[r]++] = l->v[i].digest;
			}
		ckpt_extent_list_free(l);
		ck_assert_uint_ge(nsrc[r], 1);
	}
	v = build(x.dir, 1, 1, NULL);
	f = open_file(v, "model.safetensors");
	size = ckpt_vfile_size(f);
	half = size - 256 * 256 * 4; /* where source 1's rows start */
	/* the whole file: every data chunk of both sources, each once */
	n = ckpt_vfile_chunks(f, 0, size, got, 64);
	ck_assert_uint_eq(n, nsrc[0] + nsrc[1]);
	for (size_t i = 0; i < n; i++) {
		ck_assert(digest_in(&got[i], src[0], nsrc[0]) ||
			  digest_in(&got[i], src[1], nsrc[1]));
		ck_assert(!digest_in(&got[i], got, i));
	}
	/* the second half: source 1's only, all of them */
	n = ckpt_vfile_chunks(f, half, size - half, got, 64);
	ck_assert_uint_eq(n, nsrc[1]);
	for (size_t i = 0; i < n; i++)
		ck_assert(digest_in(&got[i], src[1], nsrc[1]));
	/* at most max; nothing past the end */
	ck_assert_uint_eq(ckpt_vfile_chunks(f, 0, size, got, 1), 1);
	ck_assert_uint_eq(ckpt_vfile_chunks(f, size, 4096, got, 64), 0);
	ckpt_vfile_free(f);
	ckpt_view_unref(v);
	free(x.w);
}
END_TEST

/* Prefetching parses a source ahead of its first view (and persists the
 * parse); other files and missing inodes are no-ops or errors. */
START_TEST(test_prefetch)
{
	struct bigfix x;
	uint8_t *rec = NULL;
	size_t len = 0;
	uint64_t cfg;

	big_setup(&x);
	cfg = put_raw(x.dir, "config.json", (const uint8_t *)"{}", 2);
	ck_assert_int_eq(ckpt_store_parsed_get(st, x.ino[0], &rec, &len), -ENOENT);
	ck_assert_int_eq(ckpt_view_prefetch(st, x.ino[0]), 0);
	ck_assert_int_eq(ckpt_store_parsed_get(st, x.ino[0], &rec, &len), 0);
	ck_assert_uint_gt(len, 0);
	free(rec);
	ck_assert_int_eq(ckpt_view_prefetch(st, cfg), 0);
	ck_assert_int_eq(ckpt_store_parsed_get(st, cfg, &rec, &len), -ENOENT);
	ck_assert_int_eq(ckpt_view_prefetch(st, x.dir), 0);
	ck_assert_int_eq(ckpt_view_prefetch(st, 999999), -ENOENT);
	free(x.w);
}
END_TEST


/*
 * The caches that view builds share let go of the models and parses of
 * directories and files that were deleted or rewritten when the next view
 * is built, not when they are the oldest: a training job saves a directory
 * per step and deletes old ones, and the caches must not hold the deleted
 * steps.
 */
#define expect_cached(models, sources) expect_cached_at(models, sources, __LINE__)
static void expect_cached_at(size_t models, size_t sources, int line)
{
	struct ckpt_view_cache_stats cs;

	ckpt_view_cache_stats(&cs);
	ck_assert_msg(cs.models == models && cs.sources == sources,
		      "line %d: %zu models and %zu parses cached, not %zu and %zu", line,
		      cs.models, cs.sources, models, sources);
}

static uint64_t put_step(const char *name, unsigned nfiles, float base)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, name);
	float *w = fgen(12, base);
	struct tdef t[1] = { { "w", CKPT_DT_F32, 2, { 3, 4 }, w } };

	for (unsigned i = 0; i < nfiles; i++) {
		char fname[64];
		snprintf(fname, sizeof(fname), "model-%u.safetensors", i);
		put_st(dir, fname, NULL, t, 1); /* replicas */
	}
	free(w);
	return dir;
}

START_TEST(test_cache_drops_deleted)
{
	uint64_t a = put_step("step_1", 3, 100), b, c;
	float *w2 = fgen(12, 500);
	struct tdef t2[1] = { { "w", CKPT_DT_F32, 2, { 3, 4 }, w2 } };
	ckpt_view *v;

	expect_cached(0, 0);
	ckpt_view_unref(build(a, 1, 1, NULL));
	ckpt_view_unref(build(a, 2, 1, NULL)); /* the same model */
	expect_cached(1, 3);
	/* step_1 deleted, step_2 saved and viewed: step_1's model and parses go */
	for (unsigned i = 0; i < 3; i++) {
		char fname[64];
		snprintf(fname, sizeof(fname), "model-%u.safetensors", i);
		ck_assert_int_eq(ckpt_store_unlink(st, a, fname, false), 0);
	}
	ck_assert_int_eq(ckpt_store_unlink(st, CKPT_ROOT_INO, "step_1", true), 0);
	b = put_step("step_2", 2, 200);
	ckpt_view_unref(build(b, 1, 1, NULL));
	expect_cached(1, 2);
	/* a rewritten file: its old parse and the model that holds it go too
	 * (the two files now disagree: the view still builds, the tensor's
	 * problem shows when a file is opened) */
	put_st(b, "model-1.safetensors", NULL, t2, 1);
	ckpt_view_unref(build(b, 1, 1, NULL));
	expect_cached(1, 2);
	/* a view still in use keeps its model and parses, deleted or not */
	v = build(b, 1, 1, NULL);
	ck_assert_int_eq(ckpt_store_unlink(st, b, "model-0.safetensors", false), 0);
	ck_assert_int_eq(ckpt_store_unlink(st, b, "model-1.safetensors", false), 0);
	c = put_step("step_3", 1, 300);
	ckpt_view_unref(build(c, 1, 1, NULL));
	expect_cached(2, 3);
	ck_assert_uint_eq(ckpt_view_nfiles(v), 1);
	ckpt_view_unref(v);
	expect_cached(1, 1);
	free(w2);
}
END_TEST

/*
 * A view file is a valid source again (docs/views.md section 6): the tp4
 * files copied into another directory give the same tp1 and tp3 views, and
 * tp1_pp1 of a copied tp1_pp1 file is byte-identical to it.
 */
static void copy_view(ckpt_view *v, uint64_t dir)
{
	for (size_t i = 0; i < ckpt_view_nfiles(v); i++) {
		struct vbuf vb = { 0 };
		vread(v, ckpt_view_file_name(v, i), 1 << 20, &vb);
		put_raw(dir, ckpt_view_file_name(v, i), vb.b, vb.size);
		vbuf_free(&vb);
	}
}

static void expect_same_view(ckpt_view *a, ckpt_view *b)
{
	ck_assert_uint_eq(ckpt_view_nfiles(a), ckpt_view_nfiles(b));
	for (size_t i = 0; i < ckpt_view_nfiles(a); i++) {
		struct vbuf x = { 0 }, y = { 0 };
		ck_assert_str_eq(ckpt_view_file_name(a, i), ckpt_view_file_name(b, i));
		vread(a, ckpt_view_file_name(a, i), 65536, &x);
		vread(b, ckpt_view_file_name(b, i), 65536, &y);
		ck_assert_uint_eq(x.size, y.size);
		ck_assert_msg(memcmp(x.b, y.b, x.size) == 0, "%s differs",
			      ckpt_view_file_name(a, i));
		vbuf_free(&x);
		vbuf_free(&y);
	}
}

START_TEST(test_roundtrip)
{
	struct tpfix x;
	struct ppfix y;
	uint64_t back = mkdir_in(CKPT_ROOT_INO, "back"), one = mkdir_in(CKPT_ROOT_INO, "one");
	uint64_t ppback = mkdir_in(CKPT_ROOT_INO, "ppback");
	ckpt_view *v4, *v1, *b1, *b3, *v3, *o1;
	struct ckpt_view_group_info gi;

	tp_setup(&x);
	v4 = build(x.dir, 4, 1, NULL);
	copy_view(v4, back);
	ckpt_view_unref(v4);
	v1 = build(x.dir, 1, 1, NULL);
	b1 = build(back, 1, 1, NULL);
	expect_same_view(v1, b1);
	ckpt_view_group_info(b1, 0, &gi);
	ck_assert_uint_eq(gi.files, 4);
	ck_assert_uint_eq(gi.saved_tp, 4);
	ckpt_view_unref(b1);
	v3 = build(x.dir, 3, 1, NULL);
	b3 = build(back, 3, 1, NULL);
	expect_same_view(v3, b3);
	ckpt_view_unref(v3);
	ckpt_view_unref(b3);

	copy_view(v1, one);
	o1 = build(one, 1, 1, NULL);
	expect_same_view(v1, o1);
	ckpt_view_unref(o1);
	ckpt_view_unref(v1);
	tp_teardown(&x);

	/* pipeline: tp1_pp4 files back to tp1_pp1 and tp2_pp2 */
	pp_setup(&y, "pp", "");
	v4 = build(y.dir, 2, 4, NULL);
	copy_view(v4, ppback);
	ckpt_view_unref(v4);
	v1 = build(y.dir, 1, 1, NULL);
	b1 = build(ppback, 1, 1, NULL);
	expect_same_view(v1, b1);
	ckpt_view_unref(v1);
	ckpt_view_unref(b1);
	v1 = build(y.dir, 2, 2, NULL);
	b1 = build(ppback, 2, 2, NULL);
	expect_same_view(v1, b1);
	ckpt_view_unref(v1);
	ckpt_view_unref(b1);
	pp_teardown(&y);
}
END_TEST

/* ---- snapshot and signature ------------------------------------------- */

START_TEST(test_snapshot)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "snap");
	float *w1 = fgen(64, 1), *w2 = fgen(64, 1000);
	struct tdef t = { "w", CKPT_DT_F32, 2, { 8, 8 }, w1 };
	const uint64_t s[] = { 8, 8 };
	uint64_t sig0, sig1, sig2, ino;
	ckpt_view *v, *v2;
	ckpt_vfile *f = NULL;
	struct vbuf vb = { 0 };
	uint8_t *buf;
	uint64_t size;
	char err[512];

	ino = put_st(dir, "w.safetensors", NULL, &t, 1);
	ck_assert_int_eq(ckpt_view_signature(st, dir, &sig0), 0);
	ck_assert_int_eq(ckpt_view_signature(st, dir, &sig1), 0);
	ck_assert_uint_eq(sig0, sig1);
	v = build(dir, 1, 1, NULL);
	ck_assert_uint_eq(ckpt_view_sig(v), sig0);
	ck_assert(ckpt_view_is_source(v, ino));
	{
		struct ckpt_inode in;
		ck_assert_int_eq(ckpt_store_getattr(st, ino, &in), 0);
		ck_assert_int_eq(ckpt_view_mtime(v), in.mtime_ns);
	}
	v2 = build(dir, 1, 1, NULL);
	ck_assert_uint_eq(ckpt_view_sig(v2), sig0);
	ckpt_view_unref(v2);

	ck_assert_int_eq(ckpt_vfile_open(v, 0, &f, err, sizeof(err)), 0);
	ckpt_view_unref(v); /* the open file keeps the view alive */
	size = ckpt_vfile_size(f);

	/* rewrite the source with other values */
	t.data = w2;
	put_st(dir, "w.safetensors", NULL, &t, 1);
	ck_assert_int_eq(ckpt_view_signature(st, dir, &sig2), 0);
	ck_assert_uint_ne(sig2, sig0);

	buf = malloc(size);
	ck_assert_ptr_nonnull(buf);
	ck_assert_int_eq(ckpt_vfile_read(f, buf, size, 0), (ssize_t)size);
	ck_assert(memcmp(buf + size - 256, w1, 256) == 0);
	ckpt_vfile_free(f);
	free(buf);

	v = build(dir, 1, 1, NULL);
	ck_assert_uint_eq(ckpt_view_sig(v), sig2);
	vread(v, "model.safetensors", 100, &vb);
	expect_tensor(&vb, "w", CKPT_DT_F32, 2, s, w2);
	vbuf_free(&vb);
	ckpt_view_unref(v);

	/* a new non-safetensors file changes the signature too */
	{
		const uint8_t txt[] = "hello";
		put_raw(dir, "notes.txt", txt, 5);
		ck_assert_int_eq(ckpt_view_signature(st, dir, &sig1), 0);
		ck_assert_uint_ne(sig1, sig2);
	}
	/* a sub-directory's contents do not */
	{
		uint64_t sub = mkdir_in(dir, "sub");
		ck_assert_int_eq(ckpt_view_signature(st, dir, &sig0), 0);
		put_st(sub, "x.safetensors", NULL, &t, 1);
		ck_assert_int_eq(ckpt_view_signature(st, dir, &sig2), 0);
		ck_assert_uint_eq(sig0, sig2);
	}
	free(w1);
	free(w2);
}
END_TEST

/* ---- sources that are not reshardable -------------------------------- */

START_TEST(test_not_reshardable)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "nr");
	float *w = fgen(8, 1), *x = fgen(4, 50);
	struct tdef tw = { "w", CKPT_DT_F32, 2, { 4, 2 }, w };
	struct tdef tx = { "x", CKPT_DT_F32, 1, { 4 }, x };
	const uint64_t s42[] = { 4, 2 }, s22[] = { 2, 2 };
	uint64_t good, v2, bad, txt, sub;
	struct ckpt_view_group_info gi;
	struct vbuf vb = { 0 };
	ckpt_view *v;
	const char *files[] = { "model_tp0_pp0.safetensors", "model_tp1_pp0.safetensors" };

	good = put_st(dir, "good.safetensors", "{\"version\": 1, \"tensors\": {\"w\": "
			"{\"tp_dim\": 0}}}", &tw, 1);
	v2 = put_st(dir, "v2.safetensors", "{\"version\": 2, \"group\": \"other\"}", &tx, 1);
	bad = put_st(dir, "bad.safetensors", "{\"version\": 1, \"tensors\": {\"nope\": {}}}", &tx,
		     1);
	{
		const uint8_t t[] = "not a safetensors file";
		const uint8_t f4[2] = { 0x12, 0x34 };
		struct tdef tf = { "q4", CKPT_DT_F4, 1, { 4 }, f4 };
		txt = put_raw(dir, "notes.txt", t, sizeof(t));
		sub = put_st(dir, "f4.safetensors", NULL, &tf, 1); /* sub-byte dtype */
	}
	v = build(dir, 1, 1, NULL);
	ck_assert(ckpt_view_is_source(v, good));
	ck_assert(!ckpt_view_is_source(v, v2));
	ck_assert(!ckpt_view_is_source(v, bad));
	ck_assert(!ckpt_view_is_source(v, txt));
	ck_assert(!ckpt_view_is_source(v, sub));
	ck_assert(!ckpt_view_is_source(v, 999999));
	ck_assert_uint_eq(ckpt_view_ngroups(v), 1);
	ckpt_view_group_info(v, 0, &gi);
	ck_assert_str_eq(gi.name, "model");
	ck_assert_uint_eq(gi.tensors, 1);
	ck_assert_uint_eq(gi.files, 1);
	ck_assert_uint_eq(gi.problems, 0);
	ck_assert_int_eq(ckpt_view_find(v, "other.safetensors"), -ENOENT);
	vread(v, "model.safetensors", 4096, &vb);
	ck_assert_uint_eq(ckpt_st_tensor_count(vb.h), 1);
	expect_tensor(&vb, "w", CKPT_DT_F32, 2, s42, w);
	vbuf_free(&vb);
	ckpt_view_unref(v);

	v = build(dir, 2, 1, NULL);
	expect_files(v, files, 2);
	vread(v, files[1], 4096, &vb);
	expect_tensor(&vb, "w", CKPT_DT_F32, 2, s22, w + 4);
	ck_assert_uint_eq(ckpt_st_tensor_count(vb.h), 1);
	vbuf_free(&vb);
	ckpt_view_unref(v);
	free(w);
	free(x);
}
END_TEST

/* ---- group info -------------------------------------------------------- */

/* tp2_pp2 save (4 files) + an optimizer group: inferred layout and counts. */
START_TEST(test_group_info)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "gi");
	float *q[4], *nrm = fgen(4, 900), *o = fgen(3, 950);
	struct ckpt_view_group_info gi;
	struct tdef to = { "step", CKPT_DT_F32, 1, { 3 }, o };
	ckpt_view *v;

	for (unsigned l = 0; l < 4; l++)
		q[l] = fgen(16, 100.0f * (float)l);
	for (unsigned p = 0; p < 2; p++) {
		for (unsigned t = 0; t < 2; t++) {
			char meta[1024], fname[64], n0[64], n1[64];
			uint8_t *a = sub2(q[2 * p], 4, 4, 2 * t, 2 * t + 2, 0, 4);
			uint8_t *b = sub2(q[2 * p + 1], 4, 4, 2 * t, 2 * t + 2, 0, 4);
			struct tdef td[3] = {
				{ n0, CKPT_DT_F32, 2, { 2, 4 }, a },
				{ n1, CKPT_DT_F32, 2, { 2, 4 }, b },
				{ "model.norm.weight", CKPT_DT_F32, 1, { 4 }, nrm },
			};
			snprintf(n0, sizeof(n0), "model.layers.%u.self_attn.q_proj.weight", 2 * p);
			snprintf(n1, sizeof(n1), "model.layers.%u.self_attn.q_proj.weight",
				 2 * p + 1);
			snprintf(meta, sizeof(meta),
				 "{\"version\": 1, \"tensors\": {"
				 "\"%s\": {\"global_shape\": [4, 4], \"offsets\": [%u, 0]},"
				 "\"%s\": {\"global_shape\": [4, 4], \"offsets\": [%u, 0]}}}",
				 n0, 2 * t, n1, 2 * t);
			snprintf(fname, sizeof(fname), "mp_rank_%u%u.safetensors", t, p);
			put_st(dir, fname, meta, td, p == 1 ? 3 : 2);
			free(a);
			free(b);
		}
	}
	put_st(dir, "optim.safetensors",
	       "{\"version\": 1, \"group\": \"optim\", \"num_layers\": 3}", &to, 1);
	v = build(dir, 1, 1, NULL);
	ck_assert_uint_eq(ckpt_view_ngroups(v), 2);
	ckpt_view_group_info(v, 0, &gi);
	ck_assert_str_eq(gi.name, "model");
	ck_assert_uint_eq(gi.tensors, 5);
	ck_assert_uint_eq(gi.files, 4);
	ck_assert_uint_eq(gi.saved_tp, 2);
	ck_assert_uint_eq(gi.saved_pp, 2);
	ck_assert_uint_eq(gi.num_layers, 4);
	ck_assert_uint_eq(gi.problems, 0);
	ckpt_view_group_info(v, 1, &gi);
	ck_assert_str_eq(gi.name, "optim");
	ck_assert_uint_eq(gi.tensors, 1);
	ck_assert_uint_eq(gi.files, 1);
	ck_assert_uint_eq(gi.saved_tp, 1);
	ck_assert_uint_eq(gi.saved_pp, 1);
	ck_assert_uint_eq(gi.num_layers, 3);
	ck_assert_uint_eq(gi.problems, 0);
	{
		struct vbuf vb = { 0 };
		const uint64_t s[] = { 4, 4 };
		vread(v, "model.safetensors", 4096, &vb);
		for (unsigned l = 0; l < 4; l++) {
			char n[64];
			snprintf(n, sizeof(n), "model.layers.%u.self_attn.q_proj.weight", l);
			expect_tensor(&vb, n, CKPT_DT_F32, 2, s, q[l]);
		}
		vbuf_free(&vb);
	}
	ckpt_view_unref(v);
	for (unsigned l = 0; l < 4; l++)
		free(q[l]);
	free(nrm);
	free(o);
}
END_TEST

/* ---- tp rules ------------------------------------------------------------ */

START_TEST(test_tp_rules)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "llama");
	float *q = fgen(16, 1), *o = fgen(8, 100), *n = fgen(4, 200);
	struct tdef t[3] = {
		{ "model.layers.0.self_attn.q_proj.weight", CKPT_DT_F32, 2, { 4, 4 }, q },
		{ "model.layers.0.self_attn.o_proj.weight", CKPT_DT_F32, 2, { 2, 4 }, o },
		{ "model.layers.0.input_layernorm.weight", CKPT_DT_F32, 1, { 4 }, n },
	};
	char rpath[160], err[512];
	ckpt_tp_rules *rules = NULL;
	ckpt_view *v;
	FILE *fp;

	put_st(dir, "model.safetensors", NULL, t, 3);
	v = build(dir, 2, 1, NULL);
	for (unsigned r = 0; r < 2; r++) {
		struct vbuf vb = { 0 };
		const uint64_t sq[] = { 2, 4 }, so[] = { 2, 2 }, sn[] = { 4 };
		uint8_t *qe = sub2(q, 4, 4, 2 * r, 2 * r + 2, 0, 4);
		uint8_t *oe = sub2(o, 4, 4, 0, 2, 2 * r, 2 * r + 2);
		ckpt_shardmeta *sm = NULL;
		struct ckpt_tensor_meta tm;

		vread(v, ckpt_view_file_name(v, r), 4096, &vb);
		expect_tensor(&vb, t[0].name, CKPT_DT_F32, 2, sq, qe);
		expect_tensor(&vb, t[1].name, CKPT_DT_F32, 2, so, oe);
		expect_tensor(&vb, t[2].name, CKPT_DT_F32, 1, sn, n);
		ck_assert_int_eq(ckpt_shardmeta_parse(vb.h, &sm, err, sizeof(err)), 0);
		ck_assert_int_eq(ckpt_shardmeta_tensor(sm, ckpt_st_tensor_find(vb.h, t[0].name),
						       &tm), 0);
		ck_assert_int_eq(tm.tp_dim, 0);
		ck_assert_uint_eq(tm.geom.box.off[0], 2 * r);
		ck_assert_int_eq(tm.pp.kind, CKPT_PP_LAYER);
		ck_assert_uint_eq(tm.pp.layer, 0);
		ck_assert_int_eq(ckpt_shardmeta_tensor(sm, ckpt_st_tensor_find(vb.h, t[1].name),
						       &tm), 0);
		ck_assert_int_eq(tm.tp_dim, 1);
		ck_assert_uint_eq(tm.geom.box.off[1], 2 * r);
		ck_assert_int_eq(ckpt_shardmeta_tensor(sm, ckpt_st_tensor_find(vb.h, t[2].name),
						       &tm), 0);
		ck_assert_int_eq(tm.tp_dim, -1);
		ckpt_shardmeta_free(sm);
		free(qe);
		free(oe);
		vbuf_free(&vb);
	}
	ckpt_view_unref(v);

	snprintf(rpath, sizeof(rpath), "%s/rules.txt", tdir);
	fp = fopen(rpath, "w");
	ck_assert_ptr_nonnull(fp);
	fputs("# test rules\ninput_layernorm 0\n", fp);
	fclose(fp);
	ck_assert_msg(ckpt_tp_rules_new(rpath, &rules, err, sizeof(err)) == 0, "%s", err);
	v = build(dir, 2, 1, rules);
	for (unsigned r = 0; r < 2; r++) {
		struct vbuf vb = { 0 };
		const uint64_t sq[] = { 2, 4 }, sn[] = { 2 };

		vread(v, ckpt_view_file_name(v, r), 4096, &vb);
		expect_tensor(&vb, t[2].name, CKPT_DT_F32, 1, sn, n + 2 * r);
		{
			uint8_t *qe = sub2(q, 4, 4, 2 * r, 2 * r + 2, 0, 4);
			expect_tensor(&vb, t[0].name, CKPT_DT_F32, 2, sq, qe);
			free(qe);
		}
		vbuf_free(&vb);
	}
	ckpt_view_unref(v);
	ckpt_tp_rules_free(rules);
	free(q);
	free(o);
	free(n);
}
END_TEST

/* ---- API edges ---------------------------------------------------------- */

START_TEST(test_edges)
{
	uint64_t dir = mkdir_in(CKPT_ROOT_INO, "empty");
	float *w = fgen(4, 1);
	struct tdef t = { "w", CKPT_DT_F32, 1, { 4 }, w };
	struct ckpt_layout l = { 1, 1 }, bad = { 0, 1 }, big = { 1, CKPT_LAYOUT_MAX + 1 };
	struct ckpt_inode din;
	ckpt_view *v = NULL;
	ckpt_vfile *f = NULL;
	char err[256];
	uint64_t ino;

	/* empty directory: no groups, no files, the directory's mtime */
	v = build(dir, 2, 2, NULL);
	ck_assert_uint_eq(ckpt_view_ngroups(v), 0);
	ck_assert_uint_eq(ckpt_view_nfiles(v), 0);
	ck_assert_int_eq(ckpt_store_getattr(st, dir, &din), 0);
	ck_assert_int_eq(ckpt_view_mtime(v), din.mtime_ns);
	ck_assert_int_eq(ckpt_view_find(v, "model.safetensors"), -ENOENT);
	ck_assert_int_eq(ckpt_vfile_open(v, 0, &f, err, sizeof(err)), -ENOENT);
	ckpt_view_ref(v);
	ckpt_view_unref(v);
	ckpt_view_unref(v);
	ckpt_view_unref(NULL);
	ckpt_vfile_free(NULL);

	ino = put_st(dir, "w.safetensors", NULL, &t, 1);
	v = NULL;
	ck_assert_int_eq(ckpt_view_build(st, ino, &l, NULL, &v, err, sizeof(err)), -ENOTDIR);
	ck_assert_ptr_null(v);
	ck_assert_int_eq(ckpt_view_build(st, 424242, &l, NULL, &v, err, sizeof(err)), -ENOENT);
	ck_assert_int_eq(ckpt_view_build(st, dir, &bad, NULL, &v, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(ckpt_view_build(st, dir, &big, NULL, &v, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_null(v);

	v = build(dir, 1, 1, NULL);
	ck_assert_uint_eq(ckpt_view_nfiles(v), 1);
	ck_assert_int_eq(ckpt_view_find(v, "model_tp0_pp0.safetensors"), -ENOENT);
	ck_assert_int_eq(ckpt_vfile_open(v, 1, &f, err, sizeof(err)), -ENOENT);
	ck_assert_int_eq(ckpt_vfile_open(v, 0, &f, err, sizeof(err)), 0);
	{
		uint64_t size = ckpt_vfile_size(f);
		uint8_t buf[64];
		/* short read at EOF */
		ck_assert_int_eq(ckpt_vfile_read(f, buf, sizeof(buf), size - 10), 10);
		ck_assert(memcmp(buf + 6, w + 3, 4) == 0);
		ck_assert_int_eq(ckpt_vfile_read(f, buf, 0, 0), 0);
		ck_assert_int_eq(ckpt_vfile_read(f, buf, sizeof(buf), size), 0);
	}
	ckpt_vfile_free(f);
	ckpt_view_unref(v);

	/* pp > number of layers: stages without tensors hold empty files */
	v = build(dir, 1, 3, NULL);
	ck_assert_uint_eq(ckpt_view_nfiles(v), 3);
	for (unsigned p = 0; p < 2; p++) {
		struct vbuf vb = { 0 };
		vread(v, ckpt_view_file_name(v, p), 4096, &vb);
		ck_assert_uint_eq(ckpt_st_tensor_count(vb.h), 0);
		ck_assert_uint_eq(vb.size, vb.ds);
		vbuf_free(&vb);
	}
	ckpt_view_unref(v);
	free(w);
}
END_TEST

static Suite *view_suite(void)
{
	Suite *s = suite_create("view");
	TCase *tp = view_tcase(s, "tp");
	TCase *pp = view_tcase(s, "pp");
	TCase *misc = view_tcase(s, "misc");

	tcase_add_test(tp, test_tp1_whole);
	tcase_add_test(tp, test_persisted_parse);
	tcase_add_test(tp, test_persisted_described);
	tcase_add_test(tp, test_tp4_uneven);
	tcase_add_test(tp, test_tp3_cross_dim);
	tcase_add_test(tp, test_header_and_reads);
	tcase_add_test(tp, test_fsdp_flat);
	tcase_add_test(tp, test_fsdp_gap);
	tcase_add_test(tp, test_tp_rules);
	tcase_add_test(tp, test_concurrent_reads);
	tcase_add_test(tp, test_read_gather);
	tcase_add_test(tp, test_vfile_chunks);
	tcase_add_test(tp, test_prefetch);
	tcase_add_test(tp, test_cache_drops_deleted);

	tcase_add_test(pp, test_pp_inferred_layers);
	tcase_add_test(pp, test_pp_explicit_layers);
	tcase_add_test(pp, test_pp_layer_beyond_num_layers);

	tcase_add_test(misc, test_snapshot);
	tcase_add_test(misc, test_not_reshardable);
	tcase_add_test(misc, test_group_info);
	tcase_add_test(misc, test_edges);
	tcase_add_test(misc, test_roundtrip);
	return s;
}

int main(void)
{
	return tl_run(view_suite());
}
