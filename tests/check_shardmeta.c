/* SPDX-License-Identifier: MIT */
/*
 * check_shardmeta.c - unit tests for core/views/shardmeta.[ch].
 *
 * Shard headers are built with ckpt_st_serialize() and parsed with
 * ckpt_st_parse(), so the metadata travels exactly as in a real file.  JSON
 * in the tables is written with ' for " (converted by js()).
 */
#include "views/shardmeta.h"
#include "base/util.h"
#include "testlib.h"

#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ERRLEN 512

/* Copy of s with ' replaced by " (static buffer; tests run one at a time). */
static const char *js(const char *s)
{
	static char buf[8192];
	size_t i;

	ck_assert_uint_lt(strlen(s), sizeof(buf));
	for (i = 0; s[i]; i++)
		buf[i] = s[i] == '\'' ? '"' : s[i];
	buf[i] = '\0';
	return buf;
}

/* Header holding tensors ts and, when ckptfs != NULL, __metadata__ with
 * "format": "pt" and "ckptfs": ckptfs. */
static ckpt_st_header *mk_header(const struct ckpt_st_tensor_spec *ts, size_t n,
				 const char *ckptfs)
{
	const char *keys[2] = { "format", CKPT_SHARDMETA_KEY };
	const char *vals[2] = { "pt", ckptfs };
	ckpt_st_header *h = NULL;
	uint8_t *buf = NULL;
	size_t len = 0;
	char err[ERRLEN];

	ck_assert_int_eq(ckpt_st_serialize(ts, n, keys, vals, ckptfs ? 2 : 1, &buf, &len), 0);
	ck_assert_int_eq(ckpt_st_parse(buf + 8, len - 8, &h, err, sizeof(err)), 0);
	free(buf);
	return h;
}

static const uint64_t sh_a[] = { 4, 6 }, sh_f[] = { 10 }, sh_w[] = { 2, 3 };
/* The standard shard: a F32 [4, 6], f F32 [10], s F32 scalar, a layer tensor. */
static const struct ckpt_st_tensor_spec std_tensors[] = {
	{ "a", CKPT_DT_F32, 2, sh_a },
	{ "f", CKPT_DT_F32, 1, sh_f },
	{ "s", CKPT_DT_F32, 0, NULL },
	{ "model.layers.0.w", CKPT_DT_BF16, 2, sh_w },
};

static int parse_std(const char *ckptfs, ckpt_st_header **ret_h, ckpt_shardmeta **ret_m,
		     char *err)
{
	*ret_h = mk_header(std_tensors, CKPT_ARRAY_SIZE(std_tensors), ckptfs);
	return ckpt_shardmeta_parse(*ret_h, ret_m, err, ERRLEN);
}

static void get_meta(const ckpt_shardmeta *m, const ckpt_st_header *h, const char *name,
		     struct ckpt_tensor_meta *ret)
{
	const struct ckpt_st_tensor *t = ckpt_st_tensor_find(h, name);

	ck_assert_ptr_nonnull(t);
	memset(ret, 0xa5, sizeof(*ret));
	ck_assert_int_eq(ckpt_shardmeta_tensor(m, t, ret), 0);
}

/* Exact geometry; dims past ndim must be zero. */
static void assert_meta(const struct ckpt_tensor_meta *t, unsigned ndim, const uint64_t *global,
			const uint64_t *off, const uint64_t *box, bool flat, uint64_t fb,
			uint64_t fe, int tp_dim, bool has_pp, int pp_kind, uint64_t layer)
{
	ck_assert_uint_eq(t->ndim, ndim);
	ck_assert_uint_eq(t->geom.box.ndim, ndim);
	for (unsigned i = 0; i < CKPT_MAX_DIMS; i++) {
		ck_assert_uint_eq(t->global_shape[i], i < ndim ? global[i] : 0);
		ck_assert_uint_eq(t->geom.box.off[i], i < ndim && off ? off[i] : 0);
		ck_assert_uint_eq(t->geom.box.shape[i], i < ndim ? box[i] : 0);
	}
	ck_assert_int_eq(t->geom.flat, flat);
	ck_assert_uint_eq(t->geom.flat_begin, fb);
	ck_assert_uint_eq(t->geom.flat_end, fe);
	ck_assert_int_eq(t->tp_dim, tp_dim);
	ck_assert_int_eq(t->has_pp, has_pp);
	ck_assert_int_eq(t->pp.kind, has_pp ? pp_kind : 0);
	ck_assert_uint_eq(t->pp.layer, has_pp ? layer : 0);
}

/* ---- parse: valid -------------------------------------------------------- */

START_TEST(test_absent)
{
	ckpt_st_header *h;
	ckpt_shardmeta *m = NULL;
	struct ckpt_tensor_meta t;
	char err[ERRLEN] = "junk";
	uint64_t nl = 77;

	ck_assert_int_eq(parse_std(NULL, &h, &m, err), 0);
	ck_assert_str_eq(err, "");
	ck_assert_str_eq(ckpt_shardmeta_group(m), "model");
	ck_assert(!ckpt_shardmeta_num_layers(m, &nl));
	ck_assert_uint_eq(nl, 77);
	get_meta(m, h, "a", &t);
	assert_meta(&t, 2, sh_a, NULL, sh_a, false, 0, 0, CKPT_TP_DIM_UNSET, false, 0, 0);
	get_meta(m, h, "f", &t);
	assert_meta(&t, 1, sh_f, NULL, sh_f, false, 0, 0, CKPT_TP_DIM_UNSET, false, 0, 0);
	get_meta(m, h, "s", &t);
	assert_meta(&t, 0, NULL, NULL, NULL, false, 0, 0, CKPT_TP_DIM_UNSET, false, 0, 0);
	ckpt_shardmeta_free(m);

	/* An empty object (only the version) gives the same defaults. */
	ckpt_st_header_free(h);
	ck_assert_int_eq(parse_std("{\"version\":1}", &h, &m, err), 0);
	ck_assert_str_eq(ckpt_shardmeta_group(m), "model");
	ck_assert(!ckpt_shardmeta_num_layers(m, NULL));
	get_meta(m, h, "model.layers.0.w", &t);
	assert_meta(&t, 2, sh_w, NULL, sh_w, false, 0, 0, CKPT_TP_DIM_UNSET, false, 0, 0);
	ckpt_shardmeta_free(m);
	ckpt_st_header_free(h);
}
END_TEST

START_TEST(test_full_example)
{
	static const uint64_t stored[] = { 4096, 4096 }, g[] = { 8192, 4096 }, o[] = { 4096, 0 };
	static const struct ckpt_st_tensor_spec ts[] = {
		{ "model.layers.17.mlp.up_proj.weight", CKPT_DT_BF16, 2, stored },
		{ "model.norm.weight", CKPT_DT_F32, 1, sh_f },
	};
	const char *meta = js("{'version': 1, 'group': 'model', 'num_layers': 32,"
			      " 'unknown_top': {'x': [1, 2]},"
			      " 'tensors': {'model.layers.17.mlp.up_proj.weight': {"
			      "  'global_shape': [8192, 4096], 'offsets': [4096, 0],"
			      "  'tp_dim': 0, 'pp': 17, 'future_field': 'ignored'}}}");
	ckpt_st_header *h = mk_header(ts, 2, meta);
	ckpt_shardmeta *m = NULL;
	struct ckpt_tensor_meta t;
	char err[ERRLEN];
	uint64_t nl = 0;

	ck_assert_int_eq(ckpt_shardmeta_parse(h, &m, err, sizeof(err)), 0);
	ck_assert_str_eq(err, "");
	ck_assert_str_eq(ckpt_shardmeta_group(m), "model");
	ck_assert(ckpt_shardmeta_num_layers(m, &nl));
	ck_assert_uint_eq(nl, 32);
	get_meta(m, h, ts[0].name, &t);
	assert_meta(&t, 2, g, o, stored, false, 0, 0, 0, true, CKPT_PP_LAYER, 17);
	/* no entry: whole */
	get_meta(m, h, ts[1].name, &t);
	assert_meta(&t, 1, sh_f, NULL, sh_f, false, 0, 0, CKPT_TP_DIM_UNSET, false, 0, 0);
	ckpt_shardmeta_free(m);
	ckpt_st_header_free(h);
}
END_TEST

START_TEST(test_only_tp_pp)
{
	ckpt_st_header *h;
	ckpt_shardmeta *m = NULL;
	struct ckpt_tensor_meta t;
	char err[ERRLEN];

	ck_assert_int_eq(parse_std(js("{'version':1,'tensors':{'a':{'tp_dim':1,'pp':'first'},"
				      "'f':{'tp_dim':-1},'s':{'pp':'all'}}}"),
				   &h, &m, err),
			 0);
	get_meta(m, h, "a", &t);
	assert_meta(&t, 2, sh_a, NULL, sh_a, false, 0, 0, 1, true, CKPT_PP_FIRST, 0);
	get_meta(m, h, "f", &t);
	assert_meta(&t, 1, sh_f, NULL, sh_f, false, 0, 0, -1, false, 0, 0);
	get_meta(m, h, "s", &t);
	assert_meta(&t, 0, NULL, NULL, NULL, false, 0, 0, CKPT_TP_DIM_UNSET, true, CKPT_PP_ALL, 0);
	get_meta(m, h, "model.layers.0.w", &t);
	assert_meta(&t, 2, sh_w, NULL, sh_w, false, 0, 0, CKPT_TP_DIM_UNSET, false, 0, 0);
	ckpt_shardmeta_free(m);
	ckpt_st_header_free(h);
}
END_TEST

START_TEST(test_flat)
{
	static const uint64_t s1[] = { 8388608 }, s2[] = { 100 }, s3[] = { 0 }, s4[] = { 24 };
	static const uint64_t g[] = { 8192, 4096 }, o[] = { 4096, 0 }, b[] = { 4096, 4096 };
	static const uint64_t g2[] = { 10, 20 }, g4[] = { 2, 3, 4 };
	static const struct ckpt_st_tensor_spec ts[] = {
		{ "flat", CKPT_DT_BF16, 1, s1 },
		{ "whole_flat", CKPT_DT_F32, 1, s2 },
		{ "empty", CKPT_DT_F32, 1, s3 },
		{ "all3d", CKPT_DT_F32, 1, s4 },
	};
	const char *meta = js("{'version':1,'tensors':{"
			      "'flat':{'global_shape':[8192,4096],'offsets':[4096,0],"
			      "'box_shape':[4096,4096],'flat_range':[0,8388608],"
			      "'tp_dim':0,'pp':'last'},"
			      "'whole_flat':{'global_shape':[10,20],'flat_range':[50,150]},"
			      "'empty':{'global_shape':[10,20],'flat_range':[200,200]},"
			      "'all3d':{'global_shape':[2,3,4],'flat_range':[0,24],'pp':'ends'}}}");
	ckpt_st_header *h = mk_header(ts, CKPT_ARRAY_SIZE(ts), meta);
	ckpt_shardmeta *m = NULL;
	struct ckpt_tensor_meta t;
	char err[ERRLEN];

	ck_assert_int_eq(ckpt_shardmeta_parse(h, &m, err, sizeof(err)), 0);
	get_meta(m, h, "flat", &t);
	assert_meta(&t, 2, g, o, b, true, 0, 8388608, 0, true, CKPT_PP_LAST, 0);
	/* box_shape defaults to global_shape, offsets to zeros */
	get_meta(m, h, "whole_flat", &t);
	assert_meta(&t, 2, g2, NULL, g2, true, 50, 150, CKPT_TP_DIM_UNSET, false, 0, 0);
	get_meta(m, h, "empty", &t);
	assert_meta(&t, 2, g2, NULL, g2, true, 200, 200, CKPT_TP_DIM_UNSET, false, 0, 0);
	get_meta(m, h, "all3d", &t);
	assert_meta(&t, 3, g4, NULL, g4, true, 0, 24, CKPT_TP_DIM_UNSET, true, CKPT_PP_ENDS, 0);
	ckpt_shardmeta_free(m);
	ckpt_st_header_free(h);
}
END_TEST

START_TEST(test_pp_forms)
{
	static const struct {
		const char *pp;
		int kind;
		uint64_t layer;
	} ok[] = {
		{ "17", CKPT_PP_LAYER, 17 },	   { "0", CKPT_PP_LAYER, 0 },
		{ "'first'", CKPT_PP_FIRST, 0 },   { "'last'", CKPT_PP_LAST, 0 },
		{ "'ends'", CKPT_PP_ENDS, 0 },	   { "'all'", CKPT_PP_ALL, 0 },
		{ "9223372036854775807", CKPT_PP_LAYER, INT64_MAX },
	};
	static const char *const bad[] = { "'bogus'", "'First'", "-1", "1.0", "null", "true",
					   "[1]", "''" };
	char buf[256], err[ERRLEN];
	struct ckpt_tensor_meta t;
	ckpt_st_header *h;
	ckpt_shardmeta *m;

	for (size_t i = 0; i < CKPT_ARRAY_SIZE(ok); i++) {
		snprintf(buf, sizeof(buf), "{'version':1,'tensors':{'a':{'pp':%s}}}", ok[i].pp);
		ck_assert_int_eq(parse_std(js(buf), &h, &m, err), 0);
		get_meta(m, h, "a", &t);
		ck_assert(t.has_pp);
		ck_assert_int_eq(t.pp.kind, ok[i].kind);
		ck_assert_uint_eq(t.pp.layer, ok[i].layer);
		ckpt_shardmeta_free(m);
		ckpt_st_header_free(h);
	}
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(bad); i++) {
		snprintf(buf, sizeof(buf), "{'version':1,'tensors':{'a':{'pp':%s}}}", bad[i]);
		m = (ckpt_shardmeta *)1;
		ck_assert_int_eq(parse_std(js(buf), &h, &m, err), -EINVAL);
		ck_assert_ptr_null(m);
		ck_assert_msg(strstr(err, "tensor 'a'") && strstr(err, "pp"), "%s", err);
		ckpt_st_header_free(h);
	}
	/* pp below num_layers is fine, at num_layers is not */
	ck_assert_int_eq(parse_std(js("{'version':1,'num_layers':18,'tensors':{'a':{'pp':17}}}"),
				   &h, &m, err),
			 0);
	ckpt_shardmeta_free(m);
	ckpt_st_header_free(h);
	ck_assert_int_eq(parse_std(js("{'version':1,'num_layers':17,'tensors':{'a':{'pp':17}}}"),
				   &h, &m, err),
			 -EINVAL);
	ck_assert_msg(strstr(err, "tensor 'a'") && strstr(err, "num_layers"), "%s", err);
	ckpt_st_header_free(h);
}
END_TEST

START_TEST(test_group)
{
	static const char *const bad[] = { "''", "'a/b'", "'/'", "'.hidden'", "'.'", "5", "null",
					   "['x']" };
	char buf[512], g200[CKPT_SHARDMETA_GROUP_MAX + 2], err[ERRLEN];
	ckpt_st_header *h;
	ckpt_shardmeta *m;

	ck_assert_int_eq(parse_std(js("{'version':1,'group':'llama-70b.v2 \xc3\xa9'}"), &h, &m,
				   err),
			 0);
	ck_assert_str_eq(ckpt_shardmeta_group(m), "llama-70b.v2 \xc3\xa9");
	ckpt_shardmeta_free(m);
	ckpt_st_header_free(h);

	memset(g200, 'g', CKPT_SHARDMETA_GROUP_MAX);
	g200[CKPT_SHARDMETA_GROUP_MAX] = '\0';
	snprintf(buf, sizeof(buf), "{'version':1,'group':'%s'}", g200);
	ck_assert_int_eq(parse_std(js(buf), &h, &m, err), 0);
	ck_assert_str_eq(ckpt_shardmeta_group(m), g200);
	ckpt_shardmeta_free(m);
	ckpt_st_header_free(h);

	strcat(g200, "g");	/* 201 bytes */
	snprintf(buf, sizeof(buf), "{'version':1,'group':'%s'}", g200);
	ck_assert_int_eq(parse_std(js(buf), &h, &m, err), -EINVAL);
	ck_assert_ptr_null(m);
	ck_assert_msg(strstr(err, "group") && strstr(err, "200"), "%s", err);
	ckpt_st_header_free(h);

	for (size_t i = 0; i < CKPT_ARRAY_SIZE(bad); i++) {
		snprintf(buf, sizeof(buf), "{'version':1,'group':%s}", bad[i]);
		ck_assert_int_eq(parse_std(js(buf), &h, &m, err), -EINVAL);
		ck_assert_msg(strstr(err, "group"), "%s: %s", bad[i], err);
		ckpt_st_header_free(h);
	}
	ck_assert_ptr_null(ckpt_shardmeta_group(NULL));
	ck_assert(!ckpt_shardmeta_num_layers(NULL, NULL));
}
END_TEST

/* ---- parse: invalid ------------------------------------------------------ */

static const struct {
	const char *meta;	/* ' for " */
	int err;
	const char *want1, *want2;	/* substrings of the reason */
} bad_cases[] = {
	/* whole value */
	{ "{", -EINVAL, "invalid JSON", NULL },
	{ "", -EINVAL, "invalid JSON", NULL },
	{ "abc", -EINVAL, "invalid JSON", NULL },
	{ "{'version':1} x", -EINVAL, "invalid JSON", NULL },
	{ "{'version':1,'version':1}", -EINVAL, "invalid JSON", "duplicate" },
	{ "[1]", -EINVAL, "not a JSON object", NULL },
	{ "5", -EINVAL, "not a JSON object", NULL },
	{ "'x'", -EINVAL, "not a JSON object", NULL },
	{ "null", -EINVAL, "not a JSON object", NULL },
	/* version */
	{ "{}", -EINVAL, "version", "missing" },
	{ "{'version':'1'}", -EINVAL, "version", NULL },
	{ "{'version':1.0}", -EINVAL, "version", NULL },
	{ "{'version':0}", -EINVAL, "version", NULL },
	{ "{'version':-1}", -EINVAL, "version", NULL },
	{ "{'version':2}", -EPROTONOSUPPORT, "version 2", "not reshardable" },
	{ "{'version':99,'tensors':7,'group':''}", -EPROTONOSUPPORT, "version 99", NULL },
	/* top-level fields */
	{ "{'version':1,'num_layers':-1}", -EINVAL, "num_layers", NULL },
	{ "{'version':1,'num_layers':'32'}", -EINVAL, "num_layers", NULL },
	{ "{'version':1,'num_layers':3.5}", -EINVAL, "num_layers", NULL },
	{ "{'version':1,'tensors':[]}", -EINVAL, "tensors", NULL },
	{ "{'version':1,'tensors':null}", -EINVAL, "tensors", NULL },
	{ "{'version':1,'tensors':{'nope':{}}}", -EINVAL, "tensor 'nope'", "no such tensor" },
	{ "{'version':1,'tensors':{'__metadata__':{}}}", -EINVAL, "tensor '__metadata__'", NULL },
	{ "{'version':1,'tensors':{'a':{},'a':{}}}", -EINVAL, "duplicate", NULL },
	{ "{'version':1,'tensors':{'a':5}}", -EINVAL, "tensor 'a'", "not an object" },
	/* global_shape */
	{ "{'version':1,'tensors':{'a':{'global_shape':7}}}", -EINVAL, "tensor 'a'",
	  "global_shape" },
	{ "{'version':1,'tensors':{'a':{'global_shape':[4,-6]}}}", -EINVAL, "tensor 'a'",
	  "global_shape" },
	{ "{'version':1,'tensors':{'a':{'global_shape':[4,6.0]}}}", -EINVAL, "tensor 'a'",
	  "global_shape" },
	{ "{'version':1,'tensors':{'a':{'global_shape':[4,'6']}}}", -EINVAL, "tensor 'a'",
	  "global_shape" },
	{ "{'version':1,'tensors':{'a':{'global_shape':[4]}}}", -EINVAL, "tensor 'a'",
	  "global_shape" },
	{ "{'version':1,'tensors':{'a':{'global_shape':[4,6,1]}}}", -EINVAL, "tensor 'a'",
	  "global_shape" },
	{ "{'version':1,'tensors':{'a':{'global_shape':[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}}}",
	  -EINVAL, "tensor 'a'", "maximum of 16" },
	{ "{'version':1,'tensors':{'a':{'global_shape':[3,6]}}}", -EINVAL, "tensor 'a'",
	  "offsets" },
	{ "{'version':1,'tensors':{'a':{'global_shape':[4611686018427387904,6]}}}", -EINVAL,
	  "tensor 'a'", "global_shape" },
	/* offsets */
	{ "{'version':1,'tensors':{'a':{'offsets':{}}}}", -EINVAL, "tensor 'a'", "offsets" },
	{ "{'version':1,'tensors':{'a':{'offsets':[0]}}}", -EINVAL, "tensor 'a'", "offsets" },
	{ "{'version':1,'tensors':{'a':{'offsets':[0,0,0]}}}", -EINVAL, "tensor 'a'",
	  "offsets" },
	{ "{'version':1,'tensors':{'a':{'offsets':[1,0]}}}", -EINVAL, "tensor 'a'", "offsets" },
	{ "{'version':1,'tensors':{'a':{'global_shape':[8,6],'offsets':[0,1]}}}", -EINVAL,
	  "tensor 'a'", "offsets" },
	{ "{'version':1,'tensors':{'a':{'global_shape':[10,6],"
	  "'offsets':[9223372036854775807,0]}}}", -EINVAL, "tensor 'a'", "offsets" },
	{ "{'version':1,'tensors':{'a':{'offsets':[0,-1]}}}", -EINVAL, "tensor 'a'", "offsets" },
	/* box_shape / flat_range */
	{ "{'version':1,'tensors':{'a':{'box_shape':[4,6]}}}", -EINVAL, "tensor 'a'",
	  "box_shape" },
	{ "{'version':1,'tensors':{'f':{'global_shape':[10],'flat_range':5}}}", -EINVAL,
	  "tensor 'f'", "flat_range" },
	{ "{'version':1,'tensors':{'f':{'global_shape':[10],'flat_range':[0]}}}", -EINVAL,
	  "tensor 'f'", "flat_range" },
	{ "{'version':1,'tensors':{'f':{'global_shape':[10],'flat_range':[0,10,1]}}}", -EINVAL,
	  "tensor 'f'", "flat_range" },
	{ "{'version':1,'tensors':{'f':{'global_shape':[10],'flat_range':[-1,9]}}}", -EINVAL,
	  "tensor 'f'", "flat_range" },
	{ "{'version':1,'tensors':{'f':{'global_shape':[10],'flat_range':[0,'10']}}}", -EINVAL,
	  "tensor 'f'", "flat_range" },
	{ "{'version':1,'tensors':{'f':{'global_shape':[20],'flat_range':[15,5]}}}", -EINVAL,
	  "tensor 'f'", "begin 15 > end 5" },
	{ "{'version':1,'tensors':{'f':{'global_shape':[2,5],'flat_range':[1,11]}}}", -EINVAL,
	  "tensor 'f'", "exceeds the box's 10 elements" },
	{ "{'version':1,'tensors':{'f':{'global_shape':[4,5],'box_shape':[2,5],"
	  "'flat_range':[5,15]}}}", -EINVAL, "tensor 'f'", "flat_range" },
	{ "{'version':1,'tensors':{'f':{'global_shape':[4,5],'flat_range':[0,11]}}}", -EINVAL,
	  "tensor 'f'", "1-D of length 11" },
	{ "{'version':1,'tensors':{'a':{'global_shape':[4,6],'flat_range':[0,24]}}}", -EINVAL,
	  "tensor 'a'", "1-D" },
	{ "{'version':1,'tensors':{'f':{'global_shape':[4,5],'box_shape':[2],"
	  "'flat_range':[0,10]}}}", -EINVAL, "tensor 'f'", "box_shape" },
	{ "{'version':1,'tensors':{'f':{'global_shape':[4,5],'box_shape':[2,5],"
	  "'offsets':[3,0],'flat_range':[0,10]}}}", -EINVAL, "tensor 'f'", "box_shape" },
	{ "{'version':1,'tensors':{'f':{'global_shape':[4,5],'box_shape':[2,6],"
	  "'flat_range':[0,10]}}}", -EINVAL, "tensor 'f'", "box_shape" },
	{ "{'version':1,'tensors':{'f':{'global_shape':[4,5],'box_shape':'x',"
	  "'flat_range':[0,10]}}}", -EINVAL, "tensor 'f'", "box_shape" },
	/* tp_dim */
	{ "{'version':1,'tensors':{'a':{'tp_dim':2}}}", -EINVAL, "tensor 'a'", "tp_dim" },
	{ "{'version':1,'tensors':{'a':{'tp_dim':-2}}}", -EINVAL, "tensor 'a'", "tp_dim" },
	{ "{'version':1,'tensors':{'a':{'tp_dim':'0'}}}", -EINVAL, "tensor 'a'", "tp_dim" },
	{ "{'version':1,'tensors':{'a':{'tp_dim':1.0}}}", -EINVAL, "tensor 'a'", "tp_dim" },
	{ "{'version':1,'tensors':{'a':{'tp_dim':true}}}", -EINVAL, "tensor 'a'", "tp_dim" },
	{ "{'version':1,'tensors':{'s':{'tp_dim':0}}}", -EINVAL, "tensor 's'", "tp_dim" },
	{ "{'version':1,'tensors':{'f':{'global_shape':[4,5],'flat_range':[0,10],'tp_dim':2}}}",
	  -EINVAL, "tensor 'f'", "tp_dim" },
	/* a later entry fails after earlier good ones (no leak, nothing returned) */
	{ "{'version':1,'tensors':{'a':{'tp_dim':0},'f':{'tp_dim':0},"
	  "'model.layers.0.w':{'pp':'x'}}}", -EINVAL, "tensor 'model.layers.0.w'", "pp" },
};

START_TEST(test_invalid)
{
	ckpt_st_header *h;
	ckpt_shardmeta *m = (ckpt_shardmeta *)1;
	char err[ERRLEN];
	int r;

	r = parse_std(js(bad_cases[_i].meta), &h, &m, err);
	ck_assert_msg(r == bad_cases[_i].err, "case %d '%s': r=%d (%s)", _i, bad_cases[_i].meta,
		      r, err);
	ck_assert_ptr_null(m);
	ck_assert_msg(strstr(err, bad_cases[_i].want1), "case %d: '%s' lacks '%s'", _i, err,
		      bad_cases[_i].want1);
	if (bad_cases[_i].want2)
		ck_assert_msg(strstr(err, bad_cases[_i].want2), "case %d: '%s' lacks '%s'", _i,
			      err, bad_cases[_i].want2);
	ck_assert_ptr_null(strchr(err, '\n'));
	ck_assert(strncmp(err, "ckptfs metadata: ", 17) == 0);
	ckpt_st_header_free(h);
}
END_TEST

START_TEST(test_invalid_args)
{
	static const uint64_t s17[17] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2 };
	static const uint64_t s46[] = { 6, 4 }, s5[] = { 5 };
	static const struct ckpt_st_tensor_spec ts17[] = { { "big", CKPT_DT_U8, 17, s17 } };
	static const struct ckpt_st_tensor_spec other[] = {
		{ "a", CKPT_DT_F32, 2, s46 },
		{ "f", CKPT_DT_F32, 1, s5 },
	};
	ckpt_st_header *h, *h2;
	ckpt_shardmeta *m = (ckpt_shardmeta *)1;
	struct ckpt_tensor_meta t;
	char err[ERRLEN], small[12];

	h = mk_header(std_tensors, CKPT_ARRAY_SIZE(std_tensors), NULL);
	ck_assert_int_eq(ckpt_shardmeta_parse(NULL, &m, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_null(m);
	ck_assert_int_eq(ckpt_shardmeta_parse(h, NULL, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(ckpt_shardmeta_parse(h, &m, NULL, 0), 0);
	ck_assert_int_eq(ckpt_shardmeta_tensor(NULL, ckpt_st_tensor_find(h, "a"), &t), -EINVAL);
	ck_assert_int_eq(ckpt_shardmeta_tensor(m, NULL, &t), -EINVAL);
	ck_assert_int_eq(ckpt_shardmeta_tensor(m, ckpt_st_tensor_find(h, "a"), NULL), -EINVAL);
	ckpt_shardmeta_free(m);
	ckpt_shardmeta_free(NULL);
	ckpt_st_header_free(h);

	/* Reasons are truncated to errlen and stay NUL-terminated. */
	ck_assert_int_eq(parse_std(js("{'version':1,'tensors':{'a':{'tp_dim':9}}}"), &h, &m, err),
			 -EINVAL);
	ck_assert_int_eq(ckpt_shardmeta_parse(h, &m, small, sizeof(small)), -EINVAL);
	ck_assert_str_eq(small, "ckptfs meta");
	ckpt_st_header_free(h);

	/* A 17-dim stored tensor: whole lookup and an entry both refuse it. */
	h = mk_header(ts17, 1, NULL);
	ck_assert_int_eq(ckpt_shardmeta_parse(h, &m, err, sizeof(err)), 0);
	ck_assert_int_eq(ckpt_shardmeta_tensor(m, ckpt_st_tensor_find(h, "big"), &t), -EINVAL);
	ckpt_shardmeta_free(m);
	ckpt_st_header_free(h);
	h = mk_header(ts17, 1, js("{'version':1,'tensors':{'big':{'tp_dim':-1}}}"));
	ck_assert_int_eq(ckpt_shardmeta_parse(h, &m, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "tensor 'big'") && strstr(err, "maximum of 16"), "%s", err);
	ckpt_st_header_free(h);

	/* A tensor from another header whose shape contradicts the entry. */
	ck_assert_int_eq(parse_std(js("{'version':1,'tensors':{'a':{'tp_dim':0},"
				      "'f':{'global_shape':[20],'flat_range':[0,10]}}}"),
				   &h, &m, err),
			 0);
	h2 = mk_header(other, 2, NULL);
	ck_assert_int_eq(ckpt_shardmeta_tensor(m, ckpt_st_tensor_find(h2, "a"), &t), -EINVAL);
	ck_assert_int_eq(ckpt_shardmeta_tensor(m, ckpt_st_tensor_find(h2, "f"), &t), -EINVAL);
	ck_assert_int_eq(ckpt_shardmeta_tensor(m, ckpt_st_tensor_find(h, "f"), &t), 0);
	ckpt_shardmeta_free(m);
	ckpt_st_header_free(h2);
	ckpt_st_header_free(h);
}
END_TEST

/* ---- serialize ----------------------------------------------------------- */

/* ckpt_shardmeta_serialize_cb's view of an array of outs (copies into tmp,
 * as a computing caller would). */
static const struct ckpt_tensor_meta *many_get(void *ud, size_t i, const char **ret_name,
					       struct ckpt_tensor_meta *tmp)
{
	const struct ckpt_shardmeta_out *v = ud;

	*ret_name = v[i].name;
	*tmp = *v[i].meta;
	return tmp;
}

static void fill(struct ckpt_tensor_meta *t, unsigned ndim, const uint64_t *g, const uint64_t *o,
		 const uint64_t *b, bool flat, uint64_t fb, uint64_t fe, int tp, bool has_pp,
		 int kind, uint64_t layer)
{
	memset(t, 0, sizeof(*t));
	t->ndim = ndim;
	t->geom.box.ndim = ndim;
	for (unsigned i = 0; i < ndim; i++) {
		t->global_shape[i] = g[i];
		t->geom.box.off[i] = o ? o[i] : 0;
		t->geom.box.shape[i] = b[i];
	}
	t->geom.flat = flat;
	t->geom.flat_begin = fb;
	t->geom.flat_end = fe;
	t->tp_dim = tp;
	t->has_pp = has_pp;
	t->pp.kind = kind;
	t->pp.layer = layer;
}

START_TEST(test_serialize_exact)
{
	static const uint64_t g[] = { 8, 6 }, o[] = { 4, 0 }, b[] = { 4, 6 };
	struct ckpt_tensor_meta t1, t2;
	struct ckpt_shardmeta_out v[2] = { { "w", &t1 }, { "x\"/\xc3\xa9", &t2 } };
	char *out = (char *)1;

	fill(&t1, 2, g, o, b, false, 0, 0, 0, true, CKPT_PP_LAYER, 3);
	fill(&t2, 2, g, NULL, b, true, 6, 18, CKPT_TP_DIM_UNSET, true, CKPT_PP_FIRST, 0);
	ck_assert_int_eq(ckpt_shardmeta_serialize("grp", true, 4, v, 2, &out), 0);
	ck_assert_str_eq(out, js("{'version':1,'group':'grp','num_layers':4,'tensors':{"
				 "'w':{'global_shape':[8,6],'offsets':[4,0],'tp_dim':0,'pp':3},"
				 "'x\\'/\xc3\xa9':{'global_shape':[8,6],'offsets':[0,0],"
				 "'box_shape':[4,6],'flat_range':[6,18],'pp':'first'}}}"));
	free(out);
	ck_assert_int_eq(ckpt_shardmeta_serialize(NULL, false, 0, NULL, 0, &out), 0);
	ck_assert_str_eq(out, js("{'version':1,'group':'model','tensors':{}}"));
	free(out);
}
END_TEST

START_TEST(test_serialize_roundtrip)
{
	static const uint64_t g1[] = { 8192, 4096 }, o1[] = { 4096, 0 }, b1[] = { 4096, 4096 };
	static const uint64_t g2[] = { 10, 20, 30 }, o2[] = { 2, 0, 10 }, b2[] = { 4, 20, 10 };
	static const uint64_t g3[] = { 16 }, b3[] = { 16 };
	static const uint64_t one[] = { 1 };
	struct ckpt_tensor_meta in[6], out;
	static const char *const names[6] = {
		"model.layers.5.self_attn.q_proj.weight", "flat.piece", "model.norm.weight",
		"scalar", "embed \xe2\x82\xac", "ends.flat.scalar",
	};
	struct ckpt_shardmeta_out v[6];
	struct ckpt_st_tensor_spec ts[7];
	uint64_t shapes[7][CKPT_MAX_DIMS];
	const char *keys[2] = { "format", CKPT_SHARDMETA_KEY }, *vals[2] = { "pt", NULL };
	ckpt_st_header *h = NULL;
	ckpt_shardmeta *m = NULL;
	uint8_t *buf = NULL;
	size_t len = 0;
	char *json = NULL, err[ERRLEN];
	uint64_t nl = 0;

	fill(&in[0], 2, g1, o1, b1, false, 0, 0, 0, true, CKPT_PP_LAYER, 5);
	fill(&in[1], 3, g2, o2, b2, true, 17, 700, 2, true, CKPT_PP_ALL, 0);
	fill(&in[2], 1, g3, NULL, b3, false, 0, 0, -1, true, CKPT_PP_LAST, 0);
	fill(&in[3], 0, NULL, NULL, NULL, false, 0, 0, CKPT_TP_DIM_UNSET, false, 0, 0);
	fill(&in[4], 2, g1, NULL, g1, true, 0, 0, 1, true, CKPT_PP_FIRST, 0);
	fill(&in[5], 0, NULL, NULL, NULL, true, 0, 1, -1, true, CKPT_PP_ENDS, 0);
	for (size_t i = 0; i < 6; i++) {
		v[i].name = names[i];
		v[i].meta = &in[i];
		ts[i].name = names[i];
		ts[i].dtype = CKPT_DT_BF16;
		ts[i].shape = shapes[i];
		if (in[i].geom.flat) {
			ts[i].ndim = 1;
			shapes[i][0] = in[i].geom.flat_end - in[i].geom.flat_begin;
		} else {
			ts[i].ndim = in[i].ndim;
			memcpy(shapes[i], in[i].geom.box.shape, sizeof(shapes[i]));
		}
	}
	/* plus a tensor without an entry */
	ts[6] = (struct ckpt_st_tensor_spec){ "extra", CKPT_DT_U8, 1, one };

	ck_assert_int_eq(ckpt_shardmeta_serialize("g1", true, 40, v, 6, &json), 0);
	vals[1] = json;
	ck_assert_int_eq(ckpt_st_serialize(ts, 7, keys, vals, 2, &buf, &len), 0);
	ck_assert_int_eq(ckpt_st_parse(buf + 8, len - 8, &h, err, sizeof(err)), 0);
	ck_assert_int_eq(ckpt_shardmeta_parse(h, &m, err, sizeof(err)), 0);
	ck_assert_str_eq(ckpt_shardmeta_group(m), "g1");
	ck_assert(ckpt_shardmeta_num_layers(m, &nl));
	ck_assert_uint_eq(nl, 40);
	for (size_t i = 0; i < 6; i++) {
		get_meta(m, h, names[i], &out);
		ck_assert_msg(memcmp(&out, &in[i], sizeof(out)) == 0, "tensor %zu differs", i);
	}
	get_meta(m, h, "extra", &out);
	assert_meta(&out, 1, one, NULL, one, false, 0, 0, CKPT_TP_DIM_UNSET, false, 0, 0);
	ckpt_shardmeta_free(m);
	ckpt_st_header_free(h);
	free(buf);
	free(json);
}
END_TEST

START_TEST(test_serialize_errors)
{
	static const uint64_t g[] = { 8, 6 }, o[] = { 4, 0 }, b[] = { 4, 6 }, b5[] = { 5, 6 };
	static const uint64_t huge[] = { (uint64_t)INT64_MAX + 1, 1 }, hb[] = { 1, 1 };
	static const uint64_t ovf[] = { 1ULL << 40, 1ULL << 40 };
	struct ckpt_tensor_meta ok, t;
	struct ckpt_shardmeta_out v[2] = { { "w", &ok }, { "y", &t } };
	char *out = (char *)1, g201[CKPT_SHARDMETA_GROUP_MAX + 2];

	fill(&ok, 2, g, o, b, false, 0, 0, 0, true, CKPT_PP_LAYER, 3);
#define SER_FAILS(want, ...)                                                     \
	do {                                                                     \
		out = (char *)1;                                                 \
		ck_assert_int_eq(ckpt_shardmeta_serialize(__VA_ARGS__, &out), want); \
		ck_assert_ptr_null(out);                                         \
	} while (0)

	ck_assert_int_eq(ckpt_shardmeta_serialize("g", false, 0, v, 1, NULL), -EINVAL);
	SER_FAILS(-EINVAL, "g", false, 0, NULL, 1);
	memset(g201, 'g', sizeof(g201) - 1);
	g201[sizeof(g201) - 1] = '\0';
	SER_FAILS(-EINVAL, g201, false, 0, v, 1);
	SER_FAILS(-EINVAL, "", false, 0, v, 1);
	SER_FAILS(-EINVAL, "a/b", false, 0, v, 1);
	SER_FAILS(-EINVAL, ".g", false, 0, v, 1);
	SER_FAILS(-EINVAL, "bad\xff", false, 0, v, 1);
	SER_FAILS(-EOVERFLOW, "g", true, (uint64_t)INT64_MAX + 1, v, 1);
	/* pp 3 needs num_layers > 3 */
	SER_FAILS(-EINVAL, "g", true, 3, v, 1);
	ck_assert_int_eq(ckpt_shardmeta_serialize("g", true, 4, v, 1, &out), 0);
	free(out);

	/* second entry broken in various ways */
	{
		/* many entries: the callback form writes the same JSON, and a
		 * duplicate name anywhere fails */
		enum { N = 2000 };
		struct ckpt_shardmeta_out *many = calloc(N, sizeof(*many));
		char (*names)[16] = calloc(N, sizeof(*names));
		char *j1 = NULL, *j2 = NULL;

		ck_assert_ptr_nonnull(many);
		ck_assert_ptr_nonnull(names);
		for (int i = 0; i < N; i++) {
			snprintf(names[i], sizeof(names[i]), "t%d", i);
			many[i].name = names[i];
			many[i].meta = &ok;
		}
		ck_assert_int_eq(ckpt_shardmeta_serialize("g", true, 4, many, N, &j1), 0);
		ck_assert_int_eq(ckpt_shardmeta_serialize_cb("g", true, 4, N, many_get, many, &j2),
				 0);
		ck_assert_str_eq(j1, j2);
		free(j1);
		free(j2);
		many[N - 1].name = names[777];
		SER_FAILS(-EINVAL, "g", true, 4, many, N);
		ck_assert_int_eq(ckpt_shardmeta_serialize_cb("g", true, 4, N, many_get, many, &j2),
				 -EINVAL);
		ck_assert_ptr_null(j2);
		free(many);
		free(names);
	}
	t = ok;
	v[1].name = "w";
	SER_FAILS(-EINVAL, "g", false, 0, v, 2);	/* duplicate name */
	v[1].name = NULL;
	SER_FAILS(-EINVAL, "g", false, 0, v, 2);
	v[1].name = "\xc3";
	SER_FAILS(-EINVAL, "g", false, 0, v, 2);
	v[1].name = "\xed\xa0\x80";	/* UTF-16 surrogate */
	SER_FAILS(-EINVAL, "g", false, 0, v, 2);
	v[1].name = "y";
	v[1].meta = NULL;
	SER_FAILS(-EINVAL, "g", false, 0, v, 2);
	v[1].meta = &t;

	t.ndim = CKPT_MAX_DIMS + 1;
	SER_FAILS(-EINVAL, "g", false, 0, v, 2);
	t = ok;
	t.geom.box.ndim = 1;
	SER_FAILS(-EINVAL, "g", false, 0, v, 2);
	fill(&t, 2, g, o, b5, false, 0, 0, 0, false, 0, 0);	/* 4 + 5 > 8 */
	SER_FAILS(-EINVAL, "g", false, 0, v, 2);
	fill(&t, 2, g, o, b, true, 0, 25, 0, false, 0, 0);	/* box has 24 elements */
	SER_FAILS(-EINVAL, "g", false, 0, v, 2);
	fill(&t, 2, g, o, b, true, 5, 4, 0, false, 0, 0);
	SER_FAILS(-EINVAL, "g", false, 0, v, 2);
	fill(&t, 2, g, o, b, false, 0, 0, 2, false, 0, 0);
	SER_FAILS(-EINVAL, "g", false, 0, v, 2);
	fill(&t, 2, g, o, b, false, 0, 0, -3, false, 0, 0);
	SER_FAILS(-EINVAL, "g", false, 0, v, 2);
	fill(&t, 2, g, o, b, false, 0, 0, 0, true, 9, 0);
	SER_FAILS(-EINVAL, "g", false, 0, v, 2);
	fill(&t, 2, g, o, b, false, 0, 0, 0, true, CKPT_PP_LAYER, (uint64_t)INT64_MAX + 1);
	SER_FAILS(-EOVERFLOW, "g", false, 0, v, 2);
	fill(&t, 2, huge, NULL, hb, false, 0, 0, 0, false, 0, 0);
	SER_FAILS(-EOVERFLOW, "g", false, 0, v, 2);
	fill(&t, 2, ovf, NULL, hb, false, 0, 0, 0, false, 0, 0);
	SER_FAILS(-EOVERFLOW, "g", false, 0, v, 2);
	/* pp kind is ignored when has_pp is false */
	fill(&t, 2, g, o, b, false, 0, 0, 0, false, 9, 0);
	ck_assert_int_eq(ckpt_shardmeta_serialize("g", false, 0, v, 2, &out), 0);
	ck_assert_ptr_null(strstr(out, "'pp':9"));
	free(out);
#undef SER_FAILS
}
END_TEST

/* ---- jansson allocation failures ----------------------------------------- */

static long jansson_budget = -1;

static void *failing_malloc(size_t n)
{
	if (jansson_budget == 0)
		return NULL;
	if (jansson_budget > 0)
		jansson_budget--;
	return malloc(n);
}

START_TEST(test_jansson_oom)
{
	static const uint64_t g[] = { 8, 6 }, o[] = { 4, 0 }, b[] = { 4, 6 };
	struct ckpt_tensor_meta t1;
	struct ckpt_shardmeta_out v[1] = { { "a", &t1 } };
	const char *meta = js("{'version':1,'group':'gg','num_layers':4,'tensors':{"
			      "'a':{'global_shape':[8,6],'offsets':[4,0],'tp_dim':0,'pp':3},"
			      "'f':{'global_shape':[20],'flat_range':[5,15],'pp':'first'}}}");
	ckpt_st_header *h;
	ckpt_shardmeta *m = NULL;
	struct ckpt_tensor_meta t;
	char err[ERRLEN], *out = NULL;
	int r, fails = 0;

	h = mk_header(std_tensors, CKPT_ARRAY_SIZE(std_tensors), meta);
	json_set_alloc_funcs(failing_malloc, free);
	for (long budget = 0;; budget++) {
		jansson_budget = budget;
		r = ckpt_shardmeta_parse(h, &m, err, sizeof(err));
		if (r == 0)
			break;
		ck_assert_msg(r == -ENOMEM || r == -EINVAL, "budget %ld: r=%d (%s)", budget, r,
			      err);
		ck_assert_ptr_null(m);
		fails++;
	}
	ck_assert_int_gt(fails, 5);
	fails = 0;
	fill(&t1, 2, g, o, b, false, 0, 0, 0, true, CKPT_PP_LAYER, 3);
	for (long budget = 0;; budget++) {
		jansson_budget = budget;
		r = ckpt_shardmeta_serialize(NULL, false, 0, v, 1, &out);
		if (r == 0)
			break;
		ck_assert_int_eq(r, -ENOMEM);
		ck_assert_ptr_null(out);
		fails++;
	}
	jansson_budget = -1;
	json_set_alloc_funcs(malloc, free);
	/* the serializer writes JSON itself: jansson allocations cannot fail it */
	ck_assert_int_eq(fails, 0);
	ck_assert_str_eq(out, js("{'version':1,'group':'model','tensors':{'a':{'global_shape':"
				 "[8,6],'offsets':[4,0],'tp_dim':0,'pp':3}}}"));
	free(out);
	ck_assert_str_eq(ckpt_shardmeta_group(m), "gg");
	get_meta(m, h, "a", &t);
	ck_assert_int_eq(memcmp(&t, &t1, sizeof(t)), 0);
	ckpt_shardmeta_free(m);
	ckpt_st_header_free(h);
}
END_TEST

/* ---- tp rules ------------------------------------------------------------ */

START_TEST(test_tp_builtin)
{
	static const struct {
		const char *name;
		unsigned ndim;
		int want;
	} cases[] = {
		{ "model.layers.3.self_attn.q_proj.weight", 2, 0 },
		{ "model.layers.3.self_attn.k_proj.weight", 2, 0 },
		{ "model.layers.3.self_attn.v_proj.weight", 2, 0 },
		{ "model.layers.3.self_attn.q_proj.bias", 1, 0 },
		{ "model.layers.3.self_attn.o_proj.weight", 2, 1 },
		{ "model.layers.3.self_attn.o_proj.bias", 1, -1 },
		{ "model.layers.3.self_attn.o_proj.bias", 2, -1 },	/* not by ndim */
		{ "model.layers.3.mlp.gate_proj.weight", 2, 0 },
		{ "model.layers.3.mlp.up_proj.weight", 2, 0 },
		{ "model.layers.3.mlp.down_proj.weight", 2, 1 },
		{ "model.layers.3.mlp.down_proj.bias", 1, -1 },
		{ "model.layers.3.input_layernorm.weight", 1, -1 },
		{ "model.embed_tokens.weight", 2, 0 },
		{ "lm_head.weight", 2, 0 },
		{ "model.norm.weight", 1, -1 },
		/* matched dim >= ndim -> -1 */
		{ "model.layers.3.self_attn.o_proj.weight", 1, -1 },
		{ "model.layers.3.self_attn.q_proj.weight", 0, -1 },
		{ "", 2, -1 },
	};
	ckpt_tp_rules *r = NULL;
	char err[ERRLEN] = "junk";

	ck_assert_int_eq(ckpt_tp_rules_new(NULL, &r, err, sizeof(err)), 0);
	ck_assert_str_eq(err, "");
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(cases); i++) {
		ck_assert_msg(ckpt_tp_rules_dim(r, cases[i].name, cases[i].ndim) == cases[i].want,
			      "%s", cases[i].name);
		ck_assert_int_eq(ckpt_tp_rules_dim(NULL, cases[i].name, cases[i].ndim),
				 cases[i].want);
	}
	ck_assert_int_eq(ckpt_tp_rules_dim(r, NULL, 2), -1);
	ck_assert_int_eq(ckpt_tp_rules_new(NULL, NULL, err, sizeof(err)), -EINVAL);
	ckpt_tp_rules_free(r);
	ckpt_tp_rules_free(NULL);
}
END_TEST

/* Write text (len bytes) to a new temp file; path in buf. */
static void write_tmp(char *path, size_t plen, const char *text, size_t len)
{
	const char *dir = getenv("TMPDIR");
	int fd;

	snprintf(path, plen, "%s/check_shardmeta.XXXXXX", dir && *dir ? dir : "/tmp");
	fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, len), (ssize_t)len);
	close(fd);
}

START_TEST(test_tp_rules_file)
{
	static const char text[] =
		"# custom rules\n"
		"\n"
		"   \t\n"
		"  # indented comment\n"
		"mlp\\.down_proj\\.weight$ 0\n"
		"self_attn\\.o_proj\\.weight   -1\r\n"
		"^custom\\.(a|b)\\. 2\n"
		"with space [0-9]+ 1\n"
		"\tq_proj\t7";	/* no final newline */
	ckpt_tp_rules *r = NULL;
	char path[256], err[ERRLEN];

	write_tmp(path, sizeof(path), text, sizeof(text) - 1);
	ck_assert_int_eq(ckpt_tp_rules_new(path, &r, err, sizeof(err)), 0);
	ck_assert_str_eq(err, "");
	/* file rules first */
	ck_assert_int_eq(ckpt_tp_rules_dim(r, "model.layers.0.mlp.down_proj.weight", 2), 0);
	ck_assert_int_eq(ckpt_tp_rules_dim(r, "model.layers.0.self_attn.o_proj.weight", 2), -1);
	ck_assert_int_eq(ckpt_tp_rules_dim(r, "custom.a.x", 3), 2);
	ck_assert_int_eq(ckpt_tp_rules_dim(r, "custom.b.x", 2), -1);	/* 2 >= ndim */
	ck_assert_int_eq(ckpt_tp_rules_dim(r, "xcustom.a.x", 3), -1);	/* anchored */
	ck_assert_int_eq(ckpt_tp_rules_dim(r, "a.with space 12.b", 2), 1);
	ck_assert_int_eq(ckpt_tp_rules_dim(r, "q_proj.weight", 8), 7);
	ck_assert_int_eq(ckpt_tp_rules_dim(r, "q_proj.weight", 2), -1);
	/* then built-ins */
	ck_assert_int_eq(ckpt_tp_rules_dim(r, "model.layers.0.mlp.down_proj.weightx", 2), 1);
	ck_assert_int_eq(ckpt_tp_rules_dim(r, "model.layers.0.mlp.up_proj.weight", 2), 0);
	ck_assert_int_eq(ckpt_tp_rules_dim(r, "lm_head.weight", 2), 0);
	ck_assert_int_eq(ckpt_tp_rules_dim(r, "norm.weight", 1), -1);
	ckpt_tp_rules_free(r);
	unlink(path);
}
END_TEST

START_TEST(test_tp_rules_errors)
{
	static const struct {
		const char *text;
		size_t len;	/* 0: strlen */
		const char *want;
	} cases[] = {
		{ "ok 0\n# c\nfoo( 0\n", 0, ":3: invalid regex 'foo('" },
		{ "a[ 1\n", 0, ":1: invalid regex" },
		{ "ok 0\nabc\n", 0, ":2: expected 'REGEX DIM'" },
		{ "abc x\n", 0, ":1: invalid dim 'x'" },
		{ "\n\nabc -2\n", 0, ":3: invalid dim '-2'" },
		{ "abc 1.5\n", 0, ":1: invalid dim '1.5'" },
		{ "abc 99999999999999999999\n", 0, ":1: invalid dim" },
		{ "abc 2147483648\n", 0, ":1: invalid dim" },
		{ "abc +\n", 0, ":1: invalid dim" },
		{ "ok 1\na\0b 1\n", 11, ":2: NUL byte" },
	};
	ckpt_tp_rules *r;
	char path[256], err[ERRLEN];

	for (size_t i = 0; i < CKPT_ARRAY_SIZE(cases); i++) {
		size_t len = cases[i].len ? cases[i].len : strlen(cases[i].text);

		write_tmp(path, sizeof(path), cases[i].text, len);
		r = (ckpt_tp_rules *)1;
		ck_assert_int_eq(ckpt_tp_rules_new(path, &r, err, sizeof(err)), -EINVAL);
		ck_assert_ptr_null(r);
		ck_assert_msg(strstr(err, path) == err, "case %zu: %s", i, err);
		ck_assert_msg(strstr(err, cases[i].want), "case %zu: '%s' lacks '%s'", i, err,
			      cases[i].want);
		ck_assert_ptr_null(strchr(err, '\n'));
		unlink(path);
	}
	ck_assert_int_eq(ckpt_tp_rules_new("/nonexistent/rules.txt", &r, err, sizeof(err)),
			 -ENOENT);
	ck_assert_ptr_null(r);
	ck_assert(strstr(err, "/nonexistent/rules.txt") == err);
	/* -1 and an empty file are fine */
	write_tmp(path, sizeof(path), "x -1\n", 5);
	ck_assert_int_eq(ckpt_tp_rules_new(path, &r, err, sizeof(err)), 0);
	ck_assert_int_eq(ckpt_tp_rules_dim(r, "x.q_proj", 2), -1);
	ckpt_tp_rules_free(r);
	unlink(path);
	write_tmp(path, sizeof(path), "", 0);
	ck_assert_int_eq(ckpt_tp_rules_new(path, &r, err, sizeof(err)), 0);
	ck_assert_int_eq(ckpt_tp_rules_dim(r, "x.q_proj", 2), 0);
	ckpt_tp_rules_free(r);
	unlink(path);
}
END_TEST

/* ---- pp from names ------------------------------------------------------- */

START_TEST(test_pp_from_name)
{
	static const struct {
		const char *name;
		int kind;
		uint64_t layer;
	} cases[] = {
		{ "model.layers.12.mlp", CKPT_PP_LAYER, 12 },
		{ "model.layers.12.mlp.down_proj.weight", CKPT_PP_LAYER, 12 },
		{ "transformer.h.3.attn", CKPT_PP_LAYER, 3 },
		{ "blocks.0.x", CKPT_PP_LAYER, 0 },
		{ "encoder.layer.7.output", CKPT_PP_LAYER, 7 },
		{ "layers.007.w", CKPT_PP_LAYER, 7 },
		{ "model.layers.abc.layers.4.x", CKPT_PP_LAYER, 4 },
		{ "model.layers.4.blocks.9.x", CKPT_PP_LAYER, 4 },
		{ "layers.9223372036854775807.x", CKPT_PP_LAYER, INT64_MAX },
		/* past what a "pp" of a view file can hold: not a layer name */
		{ "layers.9223372036854775808.x", CKPT_PP_LAST, 0 },
		{ "layers.18446744073709551615.x", CKPT_PP_LAST, 0 },
		{ "layers.18446744073709551616.x", CKPT_PP_LAST, 0 },	/* overflow */
		{ "xlayers.3.", CKPT_PP_LAST, 0 },
		{ "model.xh.3.w", CKPT_PP_LAST, 0 },
		{ "model.layers.12", CKPT_PP_LAST, 0 },	/* no '.' after N */
		{ "model.layers..w", CKPT_PP_LAST, 0 },
		{ "model.layers.3a.w", CKPT_PP_LAST, 0 },
		{ "tok_embeddings.weight", CKPT_PP_FIRST, 0 },
		{ "model.embed_tokens.weight", CKPT_PP_FIRST, 0 },
		{ "transformer.wte.weight", CKPT_PP_FIRST, 0 },
		{ "transformer.wpe.weight", CKPT_PP_FIRST, 0 },
		{ "model.layers.2.embed.x", CKPT_PP_LAYER, 2 },	/* layer wins */
		{ "lm_head.weight", CKPT_PP_LAST, 0 },
		{ "norm.weight", CKPT_PP_LAST, 0 },
		{ "", CKPT_PP_LAST, 0 },
	};
	struct ckpt_pp pp;
	uint64_t layer;

	for (size_t i = 0; i < CKPT_ARRAY_SIZE(cases); i++) {
		memset(&pp, 0x5a, sizeof(pp));
		ckpt_pp_from_name(cases[i].name, &pp);
		ck_assert_msg(pp.kind == cases[i].kind && pp.layer == cases[i].layer,
			      "%s: kind %d layer %" PRIu64, cases[i].name, pp.kind, pp.layer);
		layer = 12345;
		ck_assert_int_eq(ckpt_layer_from_name(cases[i].name, &layer),
				 cases[i].kind == CKPT_PP_LAYER);
		ck_assert_uint_eq(layer, cases[i].kind == CKPT_PP_LAYER ? cases[i].layer : 12345);
	}
	ck_assert(ckpt_layer_from_name("h.5.x", NULL));
	ck_assert(!ckpt_layer_from_name(NULL, &layer));
	ckpt_pp_from_name(NULL, &pp);
	ck_assert_int_eq(pp.kind, CKPT_PP_LAST);
	ckpt_pp_from_name("x", NULL);
}
END_TEST

/* num_layers of 2^62 is legal (placement is exact for any value, see
 * check_vhostile.c); past 2^63 - 1 it is not a JSON integer jansson reads,
 * and is refused with the position of the number. */
START_TEST(test_num_layers_huge)
{
	ckpt_st_header *h;
	ckpt_shardmeta *m;
	char err[ERRLEN];
	uint64_t nl = 0;
	struct ckpt_tensor_meta t;

	ck_assert_int_eq(parse_std(js("{'version':1,'num_layers':4611686018427387904,"
				      "'tensors':{'a':{'pp':4611686018427387903}}}"),
				   &h, &m, err),
			 0);
	ck_assert(ckpt_shardmeta_num_layers(m, &nl));
	ck_assert_uint_eq(nl, 1ull << 62);
	get_meta(m, h, "a", &t);
	ck_assert_int_eq(t.pp.kind, CKPT_PP_LAYER);
	ck_assert_uint_eq(t.pp.layer, (1ull << 62) - 1);
	ckpt_shardmeta_free(m);
	ckpt_st_header_free(h);
	m = (ckpt_shardmeta *)1;
	ck_assert_int_eq(parse_std(js("{'version':1,'num_layers':9223372036854775808}"), &h, &m, err),
			 -EINVAL);
	ck_assert_ptr_null(m);
	ck_assert_msg(strstr(err, "invalid JSON"), "%s", err);
	ckpt_st_header_free(h);
}
END_TEST

/* ckpt_shardmeta_check: what parse gives passes; each rule broken fails. */
START_TEST(test_check)
{
	static const uint64_t sh[] = { 4, 6 }, sh1[] = { 10 };
	const struct ckpt_st_tensor a = { "a", CKPT_DT_F32, 2, sh, 0, 96 };
	const struct ckpt_st_tensor f = { "f", CKPT_DT_F32, 1, sh1, 96, 136 };
	ckpt_st_header *h;
	ckpt_shardmeta *m;
	char err[ERRLEN];
	struct ckpt_tensor_meta ta, tf, x;

	ck_assert_int_eq(parse_std(js("{'version':1,'num_layers':8,'tensors':{"
				      "'a':{'global_shape':[8,6],'offsets':[4,0],'tp_dim':0,'pp':7},"
				      "'f':{'global_shape':[5,4],'flat_range':[7,17]}}}"),
				   &h, &m, err),
			 0);
	get_meta(m, h, "a", &ta);
	get_meta(m, h, "f", &tf);
	ck_assert_int_eq(ckpt_shardmeta_check(&a, &ta, true, 8), 0);
	ck_assert_int_eq(ckpt_shardmeta_check(&f, &tf, true, 8), 0);
	ck_assert_int_eq(ckpt_shardmeta_check(&a, &ta, false, 0), 0);
	ck_assert_int_eq(ckpt_shardmeta_check(&a, &ta, true, 7), -EINVAL); /* pp 7 of 7 */
	ck_assert_int_eq(ckpt_shardmeta_check(&f, &ta, true, 8), -EINVAL); /* other shape */
	ck_assert_int_eq(ckpt_shardmeta_check(&a, &tf, true, 8), -EINVAL);
	x = ta;
	x.global_shape[0] = 7; /* rows 4..8 of 7 */
	ck_assert_int_eq(ckpt_shardmeta_check(&a, &x, true, 8), -EINVAL);
	x = ta;
	x.tp_dim = 2;
	ck_assert_int_eq(ckpt_shardmeta_check(&a, &x, true, 8), -EINVAL);
	x = ta;
	x.global_shape[2] = 1; /* past ndim */
	ck_assert_int_eq(ckpt_shardmeta_check(&a, &x, true, 8), -EINVAL);
	x = ta;
	x.global_shape[0] = 1ull << 63; /* not a JSON integer */
	ck_assert_int_eq(ckpt_shardmeta_check(&a, &x, true, 8), -EINVAL);
	x = ta;
	x.global_shape[0] = 1ull << 62; /* 2^62 * 6 elements overflow */
	ck_assert_int_eq(ckpt_shardmeta_check(&a, &x, true, 8), -EINVAL);
	x = tf;
	x.geom.flat_end = 16; /* 9 elements for 10 stored */
	ck_assert_int_eq(ckpt_shardmeta_check(&f, &x, true, 8), -EINVAL);
	x = tf;
	x.geom.flat_end = 21; /* past the box's 20 elements */
	x.geom.flat_begin = 11;
	ck_assert_int_eq(ckpt_shardmeta_check(&f, &x, true, 8), -EINVAL);
	x = ta;
	x.has_pp = true;
	x.pp.kind = CKPT_PP_ALL + 1;
	ck_assert_int_eq(ckpt_shardmeta_check(&a, &x, true, 8), -EINVAL);
	ck_assert_int_eq(ckpt_shardmeta_check(NULL, &ta, true, 8), -EINVAL);
	ck_assert_int_eq(ckpt_shardmeta_check(&a, NULL, true, 8), -EINVAL);
	ck_assert_int_eq(ckpt_shardmeta_check_group("model"), 0);
	ck_assert_int_eq(ckpt_shardmeta_check_group(""), -EINVAL);
	ck_assert_int_eq(ckpt_shardmeta_check_group("a/b"), -EINVAL);
	ck_assert_int_eq(ckpt_shardmeta_check_group(".."), -EINVAL);
	ck_assert_int_eq(ckpt_shardmeta_check_group(NULL), -EINVAL);
	ckpt_shardmeta_free(m);
	ckpt_st_header_free(h);
}
END_TEST

static Suite *shardmeta_suite(void)
{
	Suite *s = suite_create("shardmeta");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_absent);
	tcase_add_test(tc, test_full_example);
	tcase_add_test(tc, test_only_tp_pp);
	tcase_add_test(tc, test_flat);
	tcase_add_test(tc, test_pp_forms);
	tcase_add_test(tc, test_group);
	tcase_add_loop_test(tc, test_invalid, 0, (int)CKPT_ARRAY_SIZE(bad_cases));
	tcase_add_test(tc, test_invalid_args);
	tcase_add_test(tc, test_serialize_exact);
	tcase_add_test(tc, test_serialize_roundtrip);
	tcase_add_test(tc, test_serialize_errors);
	tcase_add_test(tc, test_jansson_oom);
	tcase_add_test(tc, test_tp_builtin);
	tcase_add_test(tc, test_tp_rules_file);
	tcase_add_test(tc, test_tp_rules_errors);
	tcase_add_test(tc, test_pp_from_name);
	tcase_add_test(tc, test_num_layers_huge);
	tcase_add_test(tc, test_check);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(shardmeta_suite());
}
