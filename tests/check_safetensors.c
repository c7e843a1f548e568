/* SPDX-License-Identifier: MIT */
/*
 * check_safetensors.c - unit tests for core/views/safetensors.[ch].
 *
 * The large-header test reports its parse time and asserts a budget of
 * thread CPU time (the default is in the test): generous enough not to
 * flake on a loaded shared machine, tight enough to catch algorithmic
 * regressions (quadratic behaviour costs seconds).  Set
 * CKPT_ST_PARSE_BUDGET_MS=50 to check the design target on a quiet machine,
 * or 0 to disable (e.g. under valgrind).
 */
#include "views/safetensors.h"
#include "base/util.h"
#include "testlib.h"

#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ERRLEN 512

static int parse_str(const char *s, ckpt_st_header **h, char *err)
{
	return ckpt_st_parse((const uint8_t *)s, strlen(s), h, err, ERRLEN);
}

static void assert_tensor(const struct ckpt_st_tensor *t, const char *name, enum ckpt_dtype dt,
			  unsigned ndim, const uint64_t *shape, uint64_t begin, uint64_t end)
{
	ck_assert_ptr_nonnull(t);
	ck_assert_str_eq(t->name, name);
	ck_assert_int_eq(t->dtype, dt);
	ck_assert_uint_eq(t->ndim, ndim);
	for (unsigned i = 0; i < ndim; i++)
		ck_assert_uint_eq(t->shape[i], shape[i]);
	ck_assert_uint_eq(t->begin, begin);
	ck_assert_uint_eq(t->end, end);
}

/* ---- dtypes ------------------------------------------------------------- */

START_TEST(test_dtype_table)
{
	static const struct {
		const char *name;
		enum ckpt_dtype dt;
		unsigned bits;
	} want[] = {
		{ "BOOL", CKPT_DT_BOOL, 8 },	   { "F4", CKPT_DT_F4, 4 },
		{ "F6_E2M3", CKPT_DT_F6_E2M3, 6 }, { "F6_E3M2", CKPT_DT_F6_E3M2, 6 },
		{ "U8", CKPT_DT_U8, 8 },	   { "I8", CKPT_DT_I8, 8 },
		{ "F8_E5M2", CKPT_DT_F8_E5M2, 8 }, { "F8_E4M3", CKPT_DT_F8_E4M3, 8 },
		{ "F8_E8M0", CKPT_DT_F8_E8M0, 8 }, { "I16", CKPT_DT_I16, 16 },
		{ "U16", CKPT_DT_U16, 16 },	   { "F16", CKPT_DT_F16, 16 },
		{ "BF16", CKPT_DT_BF16, 16 },	   { "I32", CKPT_DT_I32, 32 },
		{ "U32", CKPT_DT_U32, 32 },	   { "F32", CKPT_DT_F32, 32 },
		{ "C64", CKPT_DT_C64, 64 },	   { "F64", CKPT_DT_F64, 64 },
		{ "I64", CKPT_DT_I64, 64 },	   { "U64", CKPT_DT_U64, 64 },
	};
	enum ckpt_dtype dt;

	ck_assert_uint_eq(CKPT_ARRAY_SIZE(want), CKPT_DT_NR);
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(want); i++) {
		ck_assert_str_eq(ckpt_dtype_name(want[i].dt), want[i].name);
		ck_assert_uint_eq(ckpt_dtype_bits(want[i].dt), want[i].bits);
		dt = CKPT_DT_NR;
		ck_assert_int_eq(ckpt_dtype_from_name(want[i].name, &dt), 0);
		ck_assert_int_eq(dt, want[i].dt);
	}
	ck_assert_int_eq(ckpt_dtype_from_name("f32", &dt), -EINVAL);
	ck_assert_int_eq(ckpt_dtype_from_name("F32 ", &dt), -EINVAL);
	ck_assert_int_eq(ckpt_dtype_from_name("", &dt), -EINVAL);
	ck_assert_int_eq(ckpt_dtype_from_name("float32", &dt), -EINVAL);
	ck_assert_int_eq(ckpt_dtype_from_name(NULL, &dt), -EINVAL);
	ck_assert_ptr_null(ckpt_dtype_name(CKPT_DT_NR));
	ck_assert_ptr_null(ckpt_dtype_name((enum ckpt_dtype)-1));
	ck_assert_uint_eq(ckpt_dtype_bits(CKPT_DT_NR), 0);
}
END_TEST

/* ---- N prefix ------------------------------------------------------------ */

START_TEST(test_header_len)
{
	uint8_t p[8];
	uint64_t n = 7;

	ckpt_put_le64(p, 2);
	ck_assert_int_eq(ckpt_st_header_len(p, &n), 0);
	ck_assert_uint_eq(n, 2);
	ckpt_put_le64(p, 0x0102);
	ck_assert_int_eq(ckpt_st_header_len(p, &n), 0);
	ck_assert_uint_eq(n, 258);
	ckpt_put_le64(p, CKPT_ST_MAX_HEADER);
	ck_assert_int_eq(ckpt_st_header_len(p, &n), 0);
	ck_assert_uint_eq(n, 100000000);
	ckpt_put_le64(p, CKPT_ST_MAX_HEADER + 1);
	ck_assert_int_eq(ckpt_st_header_len(p, &n), -EINVAL);
	ck_assert_uint_eq(n, 100000001);
	ckpt_put_le64(p, UINT64_MAX);
	ck_assert_int_eq(ckpt_st_header_len(p, &n), -EINVAL);
	ckpt_put_le64(p, 1);
	ck_assert_int_eq(ckpt_st_header_len(p, &n), -EINVAL);
	ckpt_put_le64(p, 0);
	ck_assert_int_eq(ckpt_st_header_len(p, &n), -EINVAL);
	ck_assert_int_eq(ckpt_st_header_len(NULL, &n), -EINVAL);
	ck_assert_int_eq(ckpt_st_header_len(p, NULL), -EINVAL);
}
END_TEST

/* ---- valid headers ------------------------------------------------------- */

START_TEST(test_valid_multi)
{
	static const char *js =
		"{\"__metadata__\":{\"format\":\"pt\",\"step\":\"100\"},"
		"\"a.weight\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
		"\"a.bias\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[12,24]},"
		"\"mask\":{\"dtype\":\"BOOL\",\"shape\":[5],\"data_offsets\":[24,29],"
		"\"extra\":{\"ignored\":[1.5,null]}},"
		"\"scale\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[29,37]}}";
	static const uint64_t s23[] = { 2, 3 }, s3[] = { 3 }, s5[] = { 5 };
	ckpt_st_header *h = NULL;
	char err[ERRLEN] = "junk";

	ck_assert_int_eq(parse_str(js, &h, err), 0);
	ck_assert_str_eq(err, "");
	ck_assert_uint_eq(ckpt_st_tensor_count(h), 4);
	ck_assert_uint_eq(ckpt_st_header_n(h), strlen(js));
	ck_assert_uint_eq(ckpt_st_data_len(h), 37);
	assert_tensor(ckpt_st_tensor_at(h, 0), "a.weight", CKPT_DT_BF16, 2, s23, 0, 12);
	assert_tensor(ckpt_st_tensor_at(h, 1), "a.bias", CKPT_DT_F32, 1, s3, 12, 24);
	assert_tensor(ckpt_st_tensor_at(h, 2), "mask", CKPT_DT_BOOL, 1, s5, 24, 29);
	assert_tensor(ckpt_st_tensor_at(h, 3), "scale", CKPT_DT_F64, 0, NULL, 29, 37);
	ck_assert_ptr_null(ckpt_st_tensor_at(h, 4));
	ck_assert_ptr_eq(ckpt_st_tensor_find(h, "mask"), ckpt_st_tensor_at(h, 2));
	ck_assert_ptr_eq(ckpt_st_tensor_find(h, "a.bias"), ckpt_st_tensor_at(h, 1));
	ck_assert_ptr_eq(ckpt_st_tensor_find(h, "a.weight"), ckpt_st_tensor_at(h, 0));
	ck_assert_ptr_eq(ckpt_st_tensor_find(h, "scale"), ckpt_st_tensor_at(h, 3));
	ck_assert_ptr_null(ckpt_st_tensor_find(h, "a"));
	ck_assert_ptr_null(ckpt_st_tensor_find(h, "__metadata__"));
	ck_assert_ptr_null(ckpt_st_tensor_find(h, NULL));
	ck_assert_uint_eq(ckpt_st_metadata_count(h), 2);
	ck_assert_str_eq(ckpt_st_metadata_get(h, "format"), "pt");
	ck_assert_int_eq(ckpt_st_check_file_size(h, 8 + strlen(js) + 37), 0);
	ckpt_st_header_free(h);
}
END_TEST

START_TEST(test_out_of_order_sorted)
{
	static const char *js =
		"{\"c\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]},"
		"\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[4,8]},"
		"\"b\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[0,4]}}";
	static const uint64_t s4[] = { 4 }, s1[] = { 1 }, s2[] = { 2 };
	ckpt_st_header *h = NULL;
	char err[ERRLEN];

	ck_assert_int_eq(parse_str(js, &h, err), 0);
	assert_tensor(ckpt_st_tensor_at(h, 0), "b", CKPT_DT_U16, 1, s2, 0, 4);
	assert_tensor(ckpt_st_tensor_at(h, 1), "a", CKPT_DT_I32, 1, s1, 4, 8);
	assert_tensor(ckpt_st_tensor_at(h, 2), "c", CKPT_DT_U8, 1, s4, 8, 12);
	ck_assert_ptr_eq(ckpt_st_tensor_find(h, "c"), ckpt_st_tensor_at(h, 2));
	ck_assert_uint_eq(ckpt_st_data_len(h), 12);
	ckpt_st_header_free(h);
}
END_TEST

START_TEST(test_zero_size)
{
	/* Zero-size tensors at start, middle (tied with another one) and end;
	 * ties on (begin, end) are ordered by name. */
	static const char *js =
		"{\"z2\":{\"dtype\":\"F32\",\"shape\":[0,7],\"data_offsets\":[2,2]},"
		"\"z0\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[0,0]},"
		"\"x\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[0,2]},"
		"\"z1\":{\"dtype\":\"U64\",\"shape\":[3,0],\"data_offsets\":[2,2]},"
		"\"y\":{\"dtype\":\"F4\",\"shape\":[2,3],\"data_offsets\":[2,5]},"
		"\"zz\":{\"dtype\":\"F6_E2M3\",\"shape\":[0],\"data_offsets\":[5,5]}}";
	static const uint64_t s0[] = { 0 }, s2[] = { 2 }, s30[] = { 3, 0 }, s07[] = { 0, 7 },
			      s23[] = { 2, 3 };
	ckpt_st_header *h = NULL;
	char err[ERRLEN];

	ck_assert_int_eq(parse_str(js, &h, err), 0);
	ck_assert_uint_eq(ckpt_st_tensor_count(h), 6);
	assert_tensor(ckpt_st_tensor_at(h, 0), "z0", CKPT_DT_F16, 1, s0, 0, 0);
	assert_tensor(ckpt_st_tensor_at(h, 1), "x", CKPT_DT_I8, 1, s2, 0, 2);
	assert_tensor(ckpt_st_tensor_at(h, 2), "z1", CKPT_DT_U64, 2, s30, 2, 2);
	assert_tensor(ckpt_st_tensor_at(h, 3), "z2", CKPT_DT_F32, 2, s07, 2, 2);
	assert_tensor(ckpt_st_tensor_at(h, 4), "y", CKPT_DT_F4, 2, s23, 2, 5);
	assert_tensor(ckpt_st_tensor_at(h, 5), "zz", CKPT_DT_F6_E2M3, 1, s0, 5, 5);
	ck_assert_uint_eq(ckpt_st_data_len(h), 5);
	ckpt_st_header_free(h);

	/* Only zero-size tensors: data_len 0. */
	ck_assert_int_eq(parse_str("{\"e\":{\"dtype\":\"F32\",\"shape\":[0],"
				   "\"data_offsets\":[0,0]}}", &h, err), 0);
	ck_assert_uint_eq(ckpt_st_data_len(h), 0);
	ck_assert_uint_eq(ckpt_st_tensor_count(h), 1);
	ckpt_st_header_free(h);
}
END_TEST

START_TEST(test_empty_and_padding)
{
	ckpt_st_header *h = NULL;
	char err[ERRLEN];

	ck_assert_int_eq(parse_str("{}", &h, err), 0);
	ck_assert_uint_eq(ckpt_st_tensor_count(h), 0);
	ck_assert_uint_eq(ckpt_st_data_len(h), 0);
	ck_assert_uint_eq(ckpt_st_metadata_count(h), 0);
	ck_assert_uint_eq(ckpt_st_header_n(h), 2);
	ck_assert_ptr_null(ckpt_st_tensor_at(h, 0));
	ck_assert_ptr_null(ckpt_st_tensor_find(h, ""));
	ck_assert_int_eq(ckpt_st_check_file_size(h, 10), 0);
	ckpt_st_header_free(h);

	ck_assert_int_eq(parse_str("{}      ", &h, err), 0);
	ck_assert_uint_eq(ckpt_st_header_n(h), 8);
	ck_assert_int_eq(ckpt_st_check_file_size(h, 16), 0);
	ckpt_st_header_free(h);

	ck_assert_int_eq(parse_str("{ \"t\" : {\"dtype\":\"U8\", \"shape\" : [ 1 ],\n"
				   "\"data_offsets\":[0, 1] } }\t\r\n  ", &h, err), 0);
	ck_assert_uint_eq(ckpt_st_tensor_count(h), 1);
	ckpt_st_header_free(h);

	/* __metadata__: null means absent; {} is empty. */
	ck_assert_int_eq(parse_str("{\"__metadata__\":null}", &h, err), 0);
	ck_assert_uint_eq(ckpt_st_metadata_count(h), 0);
	ckpt_st_header_free(h);
	ck_assert_int_eq(parse_str("{\"__metadata__\":{}}", &h, err), 0);
	ck_assert_uint_eq(ckpt_st_metadata_count(h), 0);
	ck_assert_uint_eq(ckpt_st_tensor_count(h), 0);
	ckpt_st_header_free(h);

	/* An empty tensor name is a valid key. */
	ck_assert_int_eq(parse_str("{\"\":{\"dtype\":\"U8\",\"shape\":[1],"
				   "\"data_offsets\":[0,1]}}", &h, err), 0);
	ck_assert_ptr_eq(ckpt_st_tensor_find(h, ""), ckpt_st_tensor_at(h, 0));
	ckpt_st_header_free(h);
	/* So are names that look like paths (as in the reference): they are only
	 * ever written into headers, never made file names (check_vhostile.c). */
	ck_assert_int_eq(parse_str("{\"/\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
				   "\"../x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
				   &h, err), 0);
	ck_assert_str_eq(ckpt_st_tensor_at(h, 0)->name, "/");
	ck_assert_ptr_eq(ckpt_st_tensor_find(h, "../x"), ckpt_st_tensor_at(h, 1));
	ckpt_st_header_free(h);
}
END_TEST

START_TEST(test_escaped_keys)
{
	/* Keys with escapes go through jansson and are compared decoded. */
	static const char *js =
		"{\"__metadata\\u005f_\":{\"k\\u00e9\":\"v\\n\"},"
		"\"w\\u00e9\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
		"\"tab\\tq\\\"bs\\\\\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]},"
		"\"\xc3\xa9t\xc3\xa9\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}";
	ckpt_st_header *h = NULL;
	char err[ERRLEN];

	ck_assert_int_eq(parse_str(js, &h, err), 0);
	ck_assert_uint_eq(ckpt_st_tensor_count(h), 3);
	ck_assert_str_eq(ckpt_st_tensor_at(h, 0)->name, "w\xc3\xa9");
	ck_assert_str_eq(ckpt_st_tensor_at(h, 1)->name, "tab\tq\"bs\\");
	ck_assert_str_eq(ckpt_st_tensor_at(h, 2)->name, "\xc3\xa9t\xc3\xa9");
	ck_assert_ptr_eq(ckpt_st_tensor_find(h, "tab\tq\"bs\\"), ckpt_st_tensor_at(h, 1));
	ck_assert_ptr_eq(ckpt_st_tensor_find(h, "\xc3\xa9t\xc3\xa9"), ckpt_st_tensor_at(h, 2));
	ck_assert_uint_eq(ckpt_st_metadata_count(h), 1);
	ck_assert_str_eq(ckpt_st_metadata_get(h, "k\xc3\xa9"), "v\n");
	ckpt_st_header_free(h);
}
END_TEST

START_TEST(test_reference_divergences)
{
	/* Documented in safetensors.h; these pin the current behaviour. */
	char deep[700], err[ERRLEN];
	ckpt_st_header *h = NULL;
	int pos;

	/* (a) "-0" is read as 0 (the reference rejects it as a float). */
	ck_assert_int_eq(parse_str("{\"a\":{\"dtype\":\"U8\",\"shape\":[-0],"
				   "\"data_offsets\":[0,-0]}}", &h, err), 0);
	ck_assert_uint_eq(ckpt_st_tensor_at(h, 0)->shape[0], 0);
	ckpt_st_header_free(h);
	/* (b) 2^63 does not parse (the reference accepts it here). */
	ck_assert_int_eq(parse_str("{\"a\":{\"dtype\":\"U8\",\"shape\":[0,9223372036854775808],"
				   "\"data_offsets\":[0,0]}}", &h, err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "too big integer"));
	/* (e) nesting of 200 in an ignored field is accepted (serde: limit 128). */
	pos = snprintf(deep, sizeof(deep), "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],"
		       "\"data_offsets\":[0,1],\"x\":");
	for (int i = 0; i < 200; i++)
		deep[pos++] = '[';
	for (int i = 0; i < 200; i++)
		deep[pos++] = ']';
	deep[pos++] = '}';
	deep[pos++] = '}';
	deep[pos] = '\0';
	ck_assert_int_eq(parse_str(deep, &h, err), 0);
	ck_assert_uint_eq(ckpt_st_data_len(h), 1);
	ckpt_st_header_free(h);
}
END_TEST

/* ---- invalid headers (one loop iteration each) ---------------------------- */

#define T(name, body) "\"" name "\":{" body "}"
#define U8(n, b, e) "\"dtype\":\"U8\",\"shape\":[" #n "],\"data_offsets\":[" #b "," #e "]"

static const struct {
	const char *json;
	const char *why;	/* substring of the reason */
} bad_cases[] = {
	/* layout */
	{ "{" T("a", U8(4, 0, 4)) "," T("b", U8(4, 8, 12)) "}",
	  "leave a hole after previous tensor 'a'" },
	{ "{" T("a", U8(8, 0, 8)) "," T("b", U8(4, 4, 8)) "}", "overlap" },
	{ "{" T("a", U8(4, 2, 6)) "}", "first tensor must begin at 0" },
	{ "{" T("a", U8(4, 0, 4)) "," T("b", U8(0, 8, 4)) "}", "end before they begin" },
	{ "{" T("w", "\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,10]") "}",
	  "tensor 'w': shape [3] of F32 needs 12 bytes but data_offsets are [0, 10]" },
	{ "{" T("w", "\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[0,0]") "}",
	  "shape [] of BF16 needs 2 bytes but data_offsets are [0, 0]" },
	{ "{" T("w", "\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1,3],"
		     "\"data_offsets\":[0,4]") "}",
	  "shape [1, 1, 1, 1, 1, 1, 1, 1, ...] of F32 needs 12 bytes" },
	{ "{" T("a", U8(4, 0, 4)) "," T("b", U8(4, 4, 8)) "," T("c", U8(4, 4, 8)) "}", "overlap" },
	/* sizes and overflow */
	{ "{" T("w", "\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],"
		     "\"data_offsets\":[0,0]") "}",
	  "shape [1099511627776, 1099511627776] of F32 overflows the element count" },
	/* the reference's running product overflows before it reaches the 0 */
	{ "{" T("w", "\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776,0],"
		     "\"data_offsets\":[0,0]") "}", "overflows the element count" },
	{ "{" T("w", "\"dtype\":\"F64\",\"shape\":[2305843009213693952],"
		     "\"data_offsets\":[0,0]") "}", "overflows the bit count" },
	{ "{" T("w", "\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,1]") "}",
	  "is 12 bits, not whole bytes" },
	{ "{" T("w", "\"dtype\":\"F6_E3M2\",\"shape\":[2],\"data_offsets\":[0,1]") "}",
	  "is 12 bits" },
	{ "{" T("w", "\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[0,1]") "}",
	  "needs 2 bytes" },
	/* dtype */
	{ "{" T("w", "\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]") "}",
	  "unknown dtype 'F33'" },
	{ "{" T("w", "\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]") "}",
	  "unknown dtype" },
	{ "{" T("w", "\"dtype\":\"float32\",\"shape\":[1],\"data_offsets\":[0,4]") "}",
	  "unknown dtype" },
	{ "{" T("w", "\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]") "}",
	  "dtype is not a string" },
	{ "{" T("w", "\"dtype\":{\"F32\":null},\"shape\":[1],\"data_offsets\":[0,4]") "}",
	  "dtype is not a string" },
	/* shape */
	{ "{" T("w", "\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]") "}",
	  "shape[0] is not a non-negative integer" },
	{ "{" T("w", "\"dtype\":\"U8\",\"shape\":[2.0],\"data_offsets\":[0,2]") "}",
	  "shape[0] is not" },
	{ "{" T("w", "\"dtype\":\"U8\",\"shape\":[1,2e0],\"data_offsets\":[0,2]") "}",
	  "shape[1] is not" },
	{ "{" T("w", "\"dtype\":\"U8\",\"shape\":[\"2\"],\"data_offsets\":[0,2]") "}",
	  "shape[0] is not" },
	{ "{" T("w", "\"dtype\":\"U8\",\"shape\":[true],\"data_offsets\":[0,1]") "}",
	  "shape[0] is not" },
	{ "{" T("w", "\"dtype\":\"U8\",\"shape\":2,\"data_offsets\":[0,2]") "}",
	  "shape is not an array" },
	{ "{" T("w", "\"dtype\":\"U8\",\"shape\":null,\"data_offsets\":[0,2]") "}",
	  "shape is not an array" },
	{ "{" T("w", "\"dtype\":\"U8\",\"shape\":[18446744073709551616],"
		     "\"data_offsets\":[0,0]") "}",
	  "invalid JSON" },
	/* data_offsets */
	{ "{" T("w", "\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0]") "}",
	  "not an array of 2" },
	{ "{" T("w", "\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[]") "}",
	  "not an array of 2" },
	{ "{" T("w", "\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0,0]") "}",
	  "not an array of 2" },
	{ "{" T("w", "\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":{\"0\":0}") "}",
	  "not an array of 2" },
	{ "{" T("w", "\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":\"0,0\"") "}",
	  "not an array of 2" },
	{ "{" T("w", "\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,-4]") "}",
	  "data_offsets[1] is not a non-negative integer" },
	{ "{" T("w", "\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0.0,4]") "}",
	  "data_offsets[0] is not" },
	{ "{" T("w", "\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,null]") "}",
	  "data_offsets[1] is not" },
	/* missing fields / entry type */
	{ "{" T("w", "\"shape\":[1],\"data_offsets\":[0,1]") "}", "missing field 'dtype'" },
	{ "{" T("w", "\"dtype\":\"U8\",\"data_offsets\":[0,1]") "}", "missing field 'shape'" },
	{ "{" T("w", "\"dtype\":\"U8\",\"shape\":[1]") "}", "missing field 'data_offsets'" },
	{ "{\"w\":5}", "entry is not an object" },
	{ "{\"w\":null}", "entry is not an object" },
	{ "{\"w\":[\"U8\",[1],[0,1]]}", "entry is not an object" },
	{ "{\"w\":\"U8\"}", "entry is not an object" },
	/* duplicates */
	{ "{" T("a", U8(1, 0, 1)) "," T("a", U8(1, 1, 2)) "}", "duplicate object key" },
	{ "{" T("a", U8(0, 0, 0)) "," T("a", U8(0, 0, 0)) "}", "duplicate object key" },
	{ "{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
	  "duplicate object key" },
	{ "{\"__metadata__\":{\"k\":\"v\",\"k\":\"w\"}}", "duplicate object key" },
	{ "{\"__metadata__\":{},\"__metadata__\":{}}", "duplicate object key" },
	{ "{\"__metadata__\":null,\"__metadata__\":null}", "duplicate object key" },
	{ "{\"__metadata__\":{},\"__metadata\\u005f_\":{}}", "duplicate object key" },
	{ "{" T("a", U8(1, 0, 1)) "," T("\\u0061", U8(1, 1, 2)) "}", "duplicate object key" },
	/* start / top level / syntax */
	{ " {}", "does not start with '{'" },
	{ "\n{}", "does not start with '{'" },
	{ "[{}]", "does not start with '{'" },
	{ "\"{}\"", "does not start with '{'" },
	{ "\xef\xbb\xbf{}", "does not start with '{'" },
	{ "{}x", "invalid JSON" },
	{ "{}{}", "invalid JSON" },
	{ "{,}", "invalid JSON" },
	{ "{\"a\":{" U8(1, 0, 1) "},}", "invalid JSON" },
	{ "{\"a\" 1}", "invalid JSON" },
	{ "{'a':1}", "invalid JSON" },
	{ "{\"a\":{\"dtype\":\"U8\",\"shape\":[01],\"data_offsets\":[0,1]}}", "invalid JSON" },
	{ "{\"\\ud800\":{}}", "invalid JSON" },
	{ "{\"a\\u0000b\":" "{" U8(1, 0, 1) "}}", "invalid JSON" },
	{ "{   ", "invalid JSON" },
	{ "{\"a\tb\":{" U8(1, 0, 1) "}}", "invalid JSON at byte" },
	{ "{\"a\\qb\":{" U8(1, 0, 1) "}}", "invalid JSON at byte" },
	{ "{\"a", "invalid JSON at byte" },
	{ "{\"a\\", "invalid JSON at byte" },
	/* top-level structure */
	{ "{\"a\"}", "invalid JSON" },
	{ "{\"a\" " U8(1, 0, 1) "}", "invalid JSON" },
	{ "{\"a\":}", "invalid JSON at byte 6" },
	{ "{\"a\":{" U8(1, 0, 1) "}", "invalid JSON" },
	{ "{" T("a", U8(1, 0, 1)) " " T("b", U8(1, 1, 2)) "}", "invalid JSON" },
	{ "{" T("a", U8(1, 0, 1)) ",," T("b", U8(1, 1, 2)) "}", "invalid JSON" },
	{ "{" T("a", U8(1, 0, 1)) ",}", "invalid JSON" },
	{ "{" T("a", U8(1, 0, 1)) "}}", "trailing characters" },
	{ "{" T("a", U8(1, 0, 1)) "} ,", "trailing characters" },
	{ "{,\"a\":1}", "invalid JSON" },
	{ "{1:" "{" U8(1, 0, 1) "}}", "invalid JSON" },
	{ "{null:{}}", "invalid JSON" },
	{ "{[\"a\"]:{}}", "invalid JSON" },
	{ "{\"a\":{" U8(1, 0, 1) "}\"b\"", "invalid JSON" },
	{ "{\"a\":{" U8(1, 0, 1) "}x}", "invalid JSON" },
	{ "{\"a\":truex}", "invalid JSON" },
	{ "{\"a\":{" U8(1, 0, 1) "}\f}", "invalid JSON" },
	{ "{\"a\"\v:{" U8(1, 0, 1) "}}", "invalid JSON" },
	{ "{\"a\":{" U8(1, 0, 1) "}", "invalid JSON" },
	/* UTF-8 */
	{ "{\"\xff\":{}}", "not valid UTF-8 (byte 2)" },
	{ "{\"\xc0\xaf\":{}}", "not valid UTF-8" },
	{ "{\"\xe0\x80\xaf\":{}}", "not valid UTF-8" },
	{ "{\"\xed\xa0\x80\":{}}", "not valid UTF-8" },
	{ "{\"\xf4\x90\x80\x80\":{}}", "not valid UTF-8" },
	{ "{\"\xe2\x82\":{}}", "not valid UTF-8" },
	{ "{\"\x80\":{}}", "not valid UTF-8" },
	{ "{}     \xe2\x82", "not valid UTF-8 (byte 7)" },
	/* metadata */
	{ "{\"__metadata__\":{\"a\":1}}", "__metadata__ value for key 'a' is not a string" },
	{ "{\"__metadata__\":{\"a\\nb\":1}}", "value for key 'a?b' is not a string" },
	{ "{\"x\\ty\":5}", "tensor 'x?y': entry is not an object" },
	{ "{\"x\x7fy\":5}", "tensor 'x?y': entry is not an object" }, /* DEL, raw */
	{ "{\"__metadata__\":{\"a\":null}}", "is not a string" },
	{ "{\"__metadata__\":{\"a\":{\"b\":\"c\"}}}", "is not a string" },
	{ "{\"__metadata__\":\"x\"}", "__metadata__ is not an object" },
	{ "{\"__metadata__\":[\"a\",\"b\"]}", "__metadata__ is not an object" },
	{ "{\"__metadata__\":0}", "__metadata__ is not an object" },
	{ "{\"__metadata__\":{\"a\":\"b\"}," T("a", U8(4, 0, 3)) "}", "needs 4 bytes" },
};

START_TEST(test_invalid)
{
	const char *js = bad_cases[_i].json;
	ckpt_st_header *h = (ckpt_st_header *)&h;
	char err[ERRLEN] = "";
	int r;

	r = parse_str(js, &h, err);
	ck_assert_msg(r == -EINVAL, "case %d (%s): r=%d", _i, js, r);
	ck_assert_ptr_null(h);
	ck_assert_msg(strstr(err, bad_cases[_i].why) != NULL, "case %d (%s): reason '%s'", _i, js,
		      err);
	ck_assert_ptr_null(strchr(err, '\n'));
	/* Same result without an error buffer. */
	ck_assert_int_eq(ckpt_st_parse((const uint8_t *)js, strlen(js), &h, NULL, 0), -EINVAL);
	ck_assert_ptr_null(h);
}
END_TEST

START_TEST(test_invalid_args_and_n)
{
	static const uint8_t js[] = "{}  ";
	ckpt_st_header *h = NULL;
	char err[ERRLEN];
	char small[8];

	ck_assert_int_eq(ckpt_st_parse(js, 1, &h, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "too small"));
	ck_assert_int_eq(ckpt_st_parse(js, 0, &h, err, sizeof(err)), -EINVAL);
	/* Rejected on n alone; the buffer is never read. */
	ck_assert_int_eq(ckpt_st_parse(js, CKPT_ST_MAX_HEADER + 1, &h, err, sizeof(err)),
			 -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "exceeds the maximum"));
	ck_assert_ptr_null(h);
	ck_assert_int_eq(ckpt_st_parse(NULL, 2, &h, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(ckpt_st_parse(js, 2, NULL, err, sizeof(err)), -EINVAL);
	/* n bounds what is parsed: "{}" + 2 spaces, then a NUL, then "{" */
	ck_assert_int_eq(ckpt_st_parse(js, 4, &h, err, sizeof(err)), 0);
	ck_assert_uint_eq(ckpt_st_header_n(h), 4);
	ckpt_st_header_free(h);
	ck_assert_int_eq(ckpt_st_parse(js, 5, &h, err, sizeof(err)), -EINVAL); /* NUL byte */
	ck_assert_ptr_nonnull(strstr(err, "invalid JSON"));
	ck_assert_int_eq(ckpt_st_parse((const uint8_t *)"{", 1, &h, err, sizeof(err)), -EINVAL);
	/* Truncated reason. */
	memset(small, 'x', sizeof(small));
	ck_assert_int_eq(ckpt_st_parse((const uint8_t *)" {}", 3, &h, small, 4), -EINVAL);
	ck_assert_str_eq(small, "hea");
	ck_assert_int_eq(small[4], 'x');
	ckpt_st_header_free(NULL);
}
END_TEST

START_TEST(test_null_header_accessors)
{
	const char *k = NULL, *v = NULL;

	ck_assert_uint_eq(ckpt_st_tensor_count(NULL), 0);
	ck_assert_ptr_null(ckpt_st_tensor_at(NULL, 0));
	ck_assert_ptr_null(ckpt_st_tensor_find(NULL, "a"));
	ck_assert_uint_eq(ckpt_st_data_len(NULL), 0);
	ck_assert_uint_eq(ckpt_st_header_n(NULL), 0);
	ck_assert_int_eq(ckpt_st_check_file_size(NULL, 10), -EINVAL);
	ck_assert_ptr_null(ckpt_st_metadata_get(NULL, "a"));
	ck_assert_uint_eq(ckpt_st_metadata_count(NULL), 0);
	ck_assert_int_eq(ckpt_st_metadata_at(NULL, 0, &k, &v), -EINVAL);
}
END_TEST

/* ---- file size / metadata ------------------------------------------------ */

START_TEST(test_check_file_size)
{
	static const char *js = "{" T("a", U8(10, 0, 10)) "," T("b", U8(6, 10, 16)) "}  ";
	ckpt_st_header *h = NULL;
	char err[ERRLEN];
	uint64_t want = 8 + strlen(js) + 16;

	ck_assert_int_eq(parse_str(js, &h, err), 0);
	ck_assert_uint_eq(ckpt_st_data_len(h), 16);
	ck_assert_int_eq(ckpt_st_check_file_size(h, want), 0);
	ck_assert_int_eq(ckpt_st_check_file_size(h, want - 1), -EINVAL);
	ck_assert_int_eq(ckpt_st_check_file_size(h, want + 1), -EINVAL);
	ck_assert_int_eq(ckpt_st_check_file_size(h, 0), -EINVAL);
	ck_assert_int_eq(ckpt_st_check_file_size(h, 8 + strlen(js)), -EINVAL);
	ck_assert_int_eq(ckpt_st_check_file_size(h, UINT64_MAX), -EINVAL);
	ckpt_st_header_free(h);

	/* Largest single tensor: 2^61 - 1 bytes (the bit count must fit 64 bits). */
	ck_assert_int_eq(parse_str("{\"big\":{\"dtype\":\"U8\",\"shape\":[2305843009213693951],"
				   "\"data_offsets\":[0,2305843009213693951]}}", &h, err), 0);
	ck_assert_uint_eq(ckpt_st_data_len(h), (1ULL << 61) - 1);
	ck_assert_int_eq(ckpt_st_check_file_size(h, (1ULL << 61) - 1), -EINVAL);
	ck_assert_int_eq(ckpt_st_check_file_size(h, (1ULL << 61) - 1 + 8 +
						 ckpt_st_header_n(h)), 0);
	ckpt_st_header_free(h);
	ck_assert_int_eq(parse_str("{\"big\":{\"dtype\":\"U8\",\"shape\":[2305843009213693952],"
				   "\"data_offsets\":[0,2305843009213693952]}}", &h, err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "overflows the bit count"));

	/* A leading 0 keeps the running product at 0 whatever follows. */
	ck_assert_int_eq(parse_str("{\"z\":{\"dtype\":\"F32\",\"shape\":[0,9223372036854775807,"
				   "9223372036854775807],\"data_offsets\":[0,0]}}", &h, err), 0);
	ck_assert_uint_eq(ckpt_st_tensor_at(h, 0)->shape[2], INT64_MAX);
	ck_assert_uint_eq(ckpt_st_data_len(h), 0);
	ckpt_st_header_free(h);
}
END_TEST

START_TEST(test_metadata)
{
	static const char *js =
		"{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
		"\"__metadata__\":{\"zeta\":\"last\",\"alpha\":\"\","
		"\"m\\u00e9ta\":\"caf\\u00e9 \\\"q\\\"\","
		"\"__metadata__\":\"nested key is fine\"}}";
	ckpt_st_header *h = NULL;
	const char *k = NULL, *v = NULL;
	char err[ERRLEN];

	ck_assert_int_eq(parse_str(js, &h, err), 0);
	ck_assert_uint_eq(ckpt_st_tensor_count(h), 1);
	ck_assert_uint_eq(ckpt_st_metadata_count(h), 4);
	ck_assert_str_eq(ckpt_st_metadata_get(h, "zeta"), "last");
	ck_assert_str_eq(ckpt_st_metadata_get(h, "alpha"), "");
	ck_assert_str_eq(ckpt_st_metadata_get(h, "m\xc3\xa9ta"), "caf\xc3\xa9 \"q\"");
	ck_assert_str_eq(ckpt_st_metadata_get(h, "__metadata__"), "nested key is fine");
	ck_assert_ptr_null(ckpt_st_metadata_get(h, "w"));
	ck_assert_ptr_null(ckpt_st_metadata_get(h, "Alpha"));
	ck_assert_ptr_null(ckpt_st_metadata_get(h, NULL));
	/* Iteration is in strcmp order of keys. */
	ck_assert_int_eq(ckpt_st_metadata_at(h, 0, &k, &v), 0);
	ck_assert_str_eq(k, "__metadata__");
	ck_assert_int_eq(ckpt_st_metadata_at(h, 1, &k, &v), 0);
	ck_assert_str_eq(k, "alpha");
	ck_assert_str_eq(v, "");
	ck_assert_int_eq(ckpt_st_metadata_at(h, 2, &k, NULL), 0);
	ck_assert_str_eq(k, "m\xc3\xa9ta");
	ck_assert_int_eq(ckpt_st_metadata_at(h, 3, NULL, &v), 0);
	ck_assert_str_eq(v, "last");
	k = v = NULL;
	ck_assert_int_eq(ckpt_st_metadata_at(h, 4, &k, &v), -ENOENT);
	ck_assert_ptr_null(k);
	ck_assert_ptr_null(v);
	ckpt_st_header_free(h);
}
END_TEST

/* ---- serializer ---------------------------------------------------------- */

static void assert_framing(const uint8_t *buf, size_t len)
{
	uint64_t n;

	ck_assert_uint_ge(len, 16);
	ck_assert_uint_eq(len % 8, 0);
	ck_assert_int_eq(ckpt_st_header_len(buf, &n), 0);
	ck_assert_uint_eq(n + 8, len);
	ck_assert_int_eq(buf[8], '{');
}

START_TEST(test_serialize_exact)
{
	static const uint64_t s2[] = { 2 };
	static const struct ckpt_st_tensor_spec t[] = { { "w", CKPT_DT_F32, 1, s2 } };
	static const char *const mk[] = { "k" }, *const mv[] = { "v" };
	static const char want[] = "{\"__metadata__\":{\"k\":\"v\"},\"w\":{\"dtype\":\"F32\","
				   "\"shape\":[2],\"data_offsets\":[0,8]}}";
	uint8_t *buf = NULL;
	size_t len = 0, wl = strlen(want);

	ck_assert_int_eq(ckpt_st_serialize(t, 1, mk, mv, 1, &buf, &len), 0);
	assert_framing(buf, len);
	ck_assert_uint_eq(len, 8 + ((wl + 7) & ~(size_t)7));
	ck_assert_int_eq(memcmp(buf + 8, want, wl), 0);
	for (size_t i = 8 + wl; i < len; i++)
		ck_assert_int_eq(buf[i], ' ');
	free(buf);

	/* Escaping: quote, backslash, short escapes, other control characters;
	 * UTF-8 and DEL pass through. */
	{
		static const char *const ek[] = { "q\"b\\n\n\x01\x1f\x7f\xc3\xa9" };
		static const char *const ev[] = { "\t\b\f\r" };
		static const char ewant[] = "{\"__metadata__\":{\"q\\\"b\\\\n\\n\\u0001\\u001f\x7f"
					    "\xc3\xa9\":\"\\t\\b\\f\\r\"}}";
		ckpt_st_header *h = NULL;
		char err[ERRLEN];

		ck_assert_int_eq(ckpt_st_serialize(NULL, 0, ek, ev, 1, &buf, &len), 0);
		assert_framing(buf, len);
		ck_assert_int_eq(memcmp(buf + 8, ewant, strlen(ewant)), 0);
		ck_assert_int_eq(ckpt_st_parse(buf + 8, len - 8, &h, err, sizeof(err)), 0);
		ck_assert_str_eq(ckpt_st_metadata_get(h, ek[0]), ev[0]);
		ckpt_st_header_free(h);
		free(buf);
	}

	/* No tensors, no metadata: "{}" padded to 8. */
	ck_assert_int_eq(ckpt_st_serialize(NULL, 0, NULL, NULL, 0, &buf, &len), 0);
	ck_assert_uint_eq(len, 16);
	ck_assert_int_eq(memcmp(buf, "\x08\0\0\0\0\0\0\0{}      ", 16), 0);
	free(buf);
}
END_TEST

START_TEST(test_serialize_roundtrip)
{
	static const uint64_t s_big[] = { 4, 3 }, s_f4[] = { 2, 5 }, s_z[] = { 0, 9 },
			      s_c[] = { 3 };
	static const struct ckpt_st_tensor_spec t[] = {
		{ "model.layers.0.w", CKPT_DT_BF16, 2, s_big },
		{ "\xc5\xb5/\xc3\xa4 \"q\"\\", CKPT_DT_F4, 2, s_f4 },
		{ "empty", CKPT_DT_F32, 2, s_z },
		{ "scalar", CKPT_DT_I64, 0, NULL },
		{ "a_first_by_name", CKPT_DT_C64, 1, s_c },
	};
	static const uint64_t want_b[] = { 0, 24, 29, 29, 37 }, want_e[] = { 24, 29, 29, 37, 61 };
	static const char *const mk[] = { "format", "tab\tkey" };
	static const char *const mv[] = { "pt", "line\nbreak \xe2\x82\xac" };
	ckpt_st_header *h = NULL;
	uint8_t *buf = NULL;
	size_t len = 0;
	char err[ERRLEN];
	const char *k, *v;

	ck_assert_int_eq(ckpt_st_serialize(t, 5, mk, mv, 2, &buf, &len), 0);
	assert_framing(buf, len);
	ck_assert_int_eq(ckpt_st_parse(buf + 8, len - 8, &h, err, sizeof(err)), 0);
	ck_assert_uint_eq(ckpt_st_header_n(h), len - 8);
	ck_assert_uint_eq(ckpt_st_tensor_count(h), 5);
	for (size_t i = 0; i < 5; i++) {
		const struct ckpt_st_tensor *p = ckpt_st_tensor_at(h, i);

		assert_tensor(p, t[i].name, t[i].dtype, t[i].ndim, t[i].shape, want_b[i],
			      want_e[i]);
		ck_assert_ptr_eq(ckpt_st_tensor_find(h, t[i].name), p);
	}
	ck_assert_uint_eq(ckpt_st_data_len(h), 61);
	ck_assert_int_eq(ckpt_st_check_file_size(h, len + 61), 0);
	ck_assert_uint_eq(ckpt_st_metadata_count(h), 2);
	ck_assert_int_eq(ckpt_st_metadata_at(h, 1, &k, &v), 0);
	ck_assert_str_eq(k, "tab\tkey");
	ck_assert_str_eq(v, mv[1]);
	ck_assert_str_eq(ckpt_st_metadata_get(h, "format"), "pt");
	ckpt_st_header_free(h);
	free(buf);
}
END_TEST

START_TEST(test_serialize_errors)
{
	static const uint64_t s1[] = { 1 }, s3[] = { 3 }, s_of[] = { 1ULL << 62, 4 },
			      s_huge[] = { 0, 1ULL << 63 }, s_bits[] = { 1ULL << 61 },
			      s_end[] = { (1ULL << 61) - 1 };
	static const char *const mk2[] = { "k", "k" }, *const mv2[] = { "a", "b" };
	static const char *const mk_bad[] = { "\xff" }, *const mv1[] = { "v" };
	static const char *const mk1[] = { "k" }, *const mv_null[] = { NULL };
	struct ckpt_st_tensor_spec t[2] = {
		{ "a", CKPT_DT_U8, 1, s1 },
		{ "b", CKPT_DT_U8, 1, s1 },
	};
	uint8_t *buf = (uint8_t *)&buf;
	size_t len = 99;

#define SER(nt, mk, mv, nm) ckpt_st_serialize(t, nt, mk, mv, nm, &buf, &len)
	ck_assert_int_eq(SER(2, NULL, NULL, 0), 0);
	free(buf);

	t[1].name = "a";
	ck_assert_int_eq(SER(2, NULL, NULL, 0), -EINVAL);
	ck_assert_ptr_null(buf);
	ck_assert_uint_eq(len, 0);
	t[1].name = "__metadata__";
	ck_assert_int_eq(SER(2, NULL, NULL, 0), -EINVAL);
	t[1].name = NULL;
	ck_assert_int_eq(SER(2, NULL, NULL, 0), -EINVAL);
	t[1].name = "\xc3";
	ck_assert_int_eq(SER(2, NULL, NULL, 0), -EINVAL);
	t[1].name = "b";
	t[1].dtype = CKPT_DT_NR;
	ck_assert_int_eq(SER(2, NULL, NULL, 0), -EINVAL);
	t[1].dtype = CKPT_DT_F4;
	t[1].shape = s3;
	ck_assert_int_eq(SER(2, NULL, NULL, 0), -EINVAL); /* 12 bits */
	t[1].shape = NULL;
	ck_assert_int_eq(SER(2, NULL, NULL, 0), -EINVAL); /* ndim 1, NULL shape */
	t[1].dtype = CKPT_DT_F32;
	t[1].ndim = 2;
	t[1].shape = s_of;
	ck_assert_int_eq(SER(2, NULL, NULL, 0), -EOVERFLOW); /* 2^64 elements */
	t[1].shape = s_huge;
	ck_assert_int_eq(SER(2, NULL, NULL, 0), -EOVERFLOW); /* dim > INT64_MAX */
	t[1].ndim = 1;
	t[1].shape = s_bits;
	ck_assert_int_eq(SER(2, NULL, NULL, 0), -EOVERFLOW); /* 2^66 bits */
	t[1].dtype = CKPT_DT_U8;
	t[1].shape = s_end;
	ck_assert_int_eq(SER(2, NULL, NULL, 0), 0); /* end 1 + (2^61 - 1) is fine */
	free(buf);
	t[1].shape = s1;
	{
		/* 1 + 4 * (2^61 - 1) fits INT64_MAX, one more does not. */
		struct ckpt_st_tensor_spec big[6] = {
			{ "a", CKPT_DT_U8, 1, s1 },	{ "b", CKPT_DT_U8, 1, s_end },
			{ "c", CKPT_DT_U8, 1, s_end },	{ "d", CKPT_DT_U8, 1, s_end },
			{ "e", CKPT_DT_U8, 1, s_end },	{ "f", CKPT_DT_U8, 1, s_end },
		};

		ck_assert_int_eq(ckpt_st_serialize(big, 5, NULL, NULL, 0, &buf, &len), 0);
		free(buf);
		ck_assert_int_eq(ckpt_st_serialize(big, 6, NULL, NULL, 0, &buf, &len),
				 -EOVERFLOW);
		ck_assert_ptr_null(buf);
	}

	{
		/* duplicates among many names: found wherever they are */
		enum { N = 3000 };
		struct ckpt_st_tensor_spec *many = calloc(N, sizeof(*many));
		char (*names)[16] = calloc(N, sizeof(*names));

		ck_assert_ptr_nonnull(many);
		ck_assert_ptr_nonnull(names);
		for (int i = 0; i < N; i++) {
			snprintf(names[i], sizeof(names[i]), "layers.%d.w", i);
			many[i] = (struct ckpt_st_tensor_spec){ names[i], CKPT_DT_U8, 1, s1 };
		}
		ck_assert_int_eq(ckpt_st_serialize(many, N, NULL, NULL, 0, &buf, &len), 0);
		free(buf);
		many[N - 1].name = names[1234];
		ck_assert_int_eq(ckpt_st_serialize(many, N, NULL, NULL, 0, &buf, &len), -EINVAL);
		many[N - 1].name = names[N - 1];
		many[0].name = names[N - 2];
		ck_assert_int_eq(ckpt_st_serialize(many, N, NULL, NULL, 0, &buf, &len), -EINVAL);
		ck_assert_ptr_null(buf);
		free(many);
		free(names);
	}
	ck_assert_int_eq(SER(2, mk2, mv2, 2), -EINVAL);
	ck_assert_int_eq(SER(2, mk_bad, mv1, 1), -EINVAL);
	ck_assert_int_eq(SER(2, mk1, mv_null, 1), -EINVAL);
	ck_assert_int_eq(SER(2, NULL, mv1, 1), -EINVAL);
	ck_assert_int_eq(ckpt_st_serialize(NULL, 1, NULL, NULL, 0, &buf, &len), -EINVAL);
	ck_assert_int_eq(ckpt_st_serialize(t, 2, NULL, NULL, 0, NULL, &len), -EINVAL);
	ck_assert_int_eq(ckpt_st_serialize(t, 2, NULL, NULL, 0, &buf, NULL), -EINVAL);
	ck_assert_ptr_null(buf);
#undef SER
}
END_TEST

/* ---- allocation failures inside jansson ---------------------------------- */

static long jansson_budget = -1;	/* allocations left; -1 = unlimited */

static void *failing_malloc(size_t size)
{
	if (jansson_budget == 0)
		return NULL;
	if (jansson_budget > 0)
		jansson_budget--;
	return malloc(size);
}

START_TEST(test_jansson_oom)
{
	static const char *js =
		"{\"__metadata__\":{\"a\":\"b\",\"c\":\"d\"},"
		"\"x\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
		"\"y\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[16,19]}}";
	ckpt_st_header *h = NULL;
	char err[ERRLEN];
	int r, nomem = 0, fails = 0;

	/* jansson reports some allocation failures as syntax errors ("invalid
	 * token"), so -EINVAL is accepted too; what matters is no crash, no
	 * leak (valgrind) and no header on failure. */
	json_set_alloc_funcs(failing_malloc, free);
	for (long budget = 0;; budget++) {
		jansson_budget = budget;
		r = parse_str(js, &h, err);
		if (r == 0)
			break;
		ck_assert_msg(r == -ENOMEM || r == -EINVAL, "budget %ld: r=%d (%s)", budget, r,
			      err);
		ck_assert_ptr_null(h);
		if (r == -ENOMEM) {
			ck_assert_str_eq(err, "out of memory");
			nomem++;
		}
		fails++;
	}
	jansson_budget = -1;
	json_set_alloc_funcs(malloc, free);
	ck_assert_int_gt(fails, 20);
	ck_assert_int_gt(nomem, 0);
	ck_assert_uint_eq(ckpt_st_tensor_count(h), 2);
	ck_assert_str_eq(ckpt_st_metadata_get(h, "c"), "d");
	ckpt_st_header_free(h);
}
END_TEST

/* ---- scale --------------------------------------------------------------- */

#define NBIG 20000

static double now_ms(clockid_t clk)
{
	struct timespec ts;

	clock_gettime(clk, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

START_TEST(test_20000_tensors)
{
	static const enum ckpt_dtype dts[] = { CKPT_DT_BF16, CKPT_DT_F32, CKPT_DT_U8, CKPT_DT_F64 };
	struct ckpt_st_tensor_spec *spec = calloc(NBIG, sizeof(*spec));
	uint64_t *shapes = calloc(NBIG * 2, sizeof(*shapes));
	char (*names)[48] = calloc(NBIG, sizeof(*names));
	size_t *perm = calloc(NBIG, sizeof(*perm));
	char *js = NULL, *p;
	uint64_t *off = calloc(NBIG + 1, sizeof(*off));
	uint64_t seed = 12345;
	ckpt_st_header *h = NULL;
	uint8_t *buf = NULL;
	size_t len = 0, cap = (size_t)NBIG * 160;
	char err[ERRLEN];
	double best_cpu = 1e9, best_wall = 1e9, budget;
	const char *env;

	ck_assert(spec && shapes && names && perm && off);
	for (size_t i = 0; i < NBIG; i++) {
		snprintf(names[i], sizeof(names[i]), "model.layers.%zu.mlp.w%zu", i / 8, i % 8);
		shapes[2 * i] = 1 + i % 17;
		shapes[2 * i + 1] = 1 + i % 5;
		spec[i] = (struct ckpt_st_tensor_spec){ names[i], dts[i % 4], 2, &shapes[2 * i] };
		off[i + 1] = off[i] + shapes[2 * i] * shapes[2 * i + 1] *
				     ckpt_dtype_bits(spec[i].dtype) / 8;
		perm[i] = i;
	}
	/* Emit the entries in a shuffled order (deterministic LCG). */
	for (size_t i = NBIG - 1; i > 0; i--) {
		size_t j, tmp;

		seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
		j = (size_t)((seed >> 33) % (i + 1));
		tmp = perm[i];
		perm[i] = perm[j];
		perm[j] = tmp;
	}
	js = malloc(cap);
	ck_assert_ptr_nonnull(js);
	p = js;
	p += sprintf(p, "{\"__metadata__\":{\"format\":\"pt\"}");
	for (size_t k = 0; k < NBIG; k++) {
		size_t i = perm[k];

		p += sprintf(p, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%" PRIu64 ",%" PRIu64 "],"
			     "\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", names[i],
			     ckpt_dtype_name(spec[i].dtype), shapes[2 * i], shapes[2 * i + 1],
			     off[i], off[i + 1]);
	}
	p += sprintf(p, "}");
	ck_assert_uint_lt((size_t)(p - js), cap);

	/* Thread CPU time is asserted (less sensitive to a busy machine than
	 * wall time); both are reported. */
	for (int run = 0; run < 5; run++) {
		double w0 = now_ms(CLOCK_MONOTONIC), c0 = now_ms(CLOCK_THREAD_CPUTIME_ID);

		ck_assert_int_eq(ckpt_st_parse((uint8_t *)js, (size_t)(p - js), &h, err,
					       sizeof(err)), 0);
		best_cpu = CKPT_MIN(best_cpu, now_ms(CLOCK_THREAD_CPUTIME_ID) - c0);
		best_wall = CKPT_MIN(best_wall, now_ms(CLOCK_MONOTONIC) - w0);
		if (run < 4)
			ckpt_st_header_free(h);
	}
	fprintf(stderr, "safetensors: parse %d tensors (%zu bytes): best of 5: %.2f ms cpu, "
		"%.2f ms wall\n", NBIG, (size_t)(p - js), best_cpu, best_wall);
	env = getenv("CKPT_ST_PARSE_BUDGET_MS");
	budget = env ? atof(env) : 150.0;
	if (budget > 0)
		ck_assert_msg(best_cpu < budget, "parse took %.2f ms cpu (budget %.0f ms)",
			      best_cpu, budget);

	ck_assert_uint_eq(ckpt_st_tensor_count(h), NBIG);
	ck_assert_uint_eq(ckpt_st_data_len(h), off[NBIG]);
	for (size_t i = 0; i < NBIG; i++) {
		const struct ckpt_st_tensor *t = ckpt_st_tensor_at(h, i);

		assert_tensor(t, names[i], spec[i].dtype, 2, &shapes[2 * i], off[i], off[i + 1]);
		ck_assert_ptr_eq(ckpt_st_tensor_find(h, names[i]), t);
	}
	ck_assert_str_eq(ckpt_st_metadata_get(h, "format"), "pt");
	ckpt_st_header_free(h);

	/* Serializer at scale, round trip. */
	{
		double t0 = now_ms(CLOCK_MONOTONIC);

		ck_assert_int_eq(ckpt_st_serialize(spec, NBIG, NULL, NULL, 0, &buf, &len), 0);
		fprintf(stderr, "safetensors: serialize %d tensors: %.2f ms\n", NBIG,
			now_ms(CLOCK_MONOTONIC) - t0);
	}
	assert_framing(buf, len);
	ck_assert_int_eq(ckpt_st_parse(buf + 8, len - 8, &h, err, sizeof(err)), 0);
	ck_assert_uint_eq(ckpt_st_tensor_count(h), NBIG);
	ck_assert_uint_eq(ckpt_st_data_len(h), off[NBIG]);
	ck_assert_uint_eq(ckpt_st_tensor_at(h, NBIG - 1)->begin, off[NBIG - 1]);
	ckpt_st_header_free(h);

	free(buf);
	free(js);
	free(off);
	free(perm);
	free(names);
	free(shapes);
	free(spec);
}
END_TEST

static Suite *safetensors_suite(void)
{
	Suite *s = suite_create("safetensors");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_dtype_table);
	tcase_add_test(tc, test_header_len);
	tcase_add_test(tc, test_valid_multi);
	tcase_add_test(tc, test_out_of_order_sorted);
	tcase_add_test(tc, test_zero_size);
	tcase_add_test(tc, test_empty_and_padding);
	tcase_add_test(tc, test_escaped_keys);
	tcase_add_test(tc, test_reference_divergences);
	tcase_add_loop_test(tc, test_invalid, 0, (int)CKPT_ARRAY_SIZE(bad_cases));
	tcase_add_test(tc, test_invalid_args_and_n);
	tcase_add_test(tc, test_null_header_accessors);
	tcase_add_test(tc, test_check_file_size);
	tcase_add_test(tc, test_metadata);
	tcase_add_test(tc, test_serialize_exact);
	tcase_add_test(tc, test_serialize_roundtrip);
	tcase_add_test(tc, test_serialize_errors);
	tcase_add_test(tc, test_jansson_oom);
	tcase_add_test(tc, test_20000_tensors);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(safetensors_suite());
}
