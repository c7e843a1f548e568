// SPDX-License-Identifier: MIT
/*
 * check_hash.c - unit tests for core/hash.c
 */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/hash.h"
#include "testlib.h"

static const char kat_str[] = "ckptfs checkpoint filesystem"; /* 28 bytes */

static void fixed_secret(uint8_t *sec, size_t len, unsigned mul)
{
	for (size_t i = 0; i < len; i++)
		sec[i] = (uint8_t)(i * mul + 13);
}

static void fill_pattern(uint8_t *buf, size_t len)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(i * 31 + 7);
}

static ckpt_hasher *make_hasher(unsigned mul)
{
	uint8_t sec[CKPT_SECRET_LEN];
	ckpt_hasher *h = NULL;

	fixed_secret(sec, sizeof(sec), mul);
	ck_assert_int_eq(ckpt_hasher_new(sec, sizeof(sec), &h), 0);
	ck_assert_ptr_nonnull(h);
	return h;
}

static void digest_from_u64(ckpt_digest *d, uint64_t hi, uint64_t lo)
{
	for (int i = 0; i < 8; i++) {
		d->bytes[i] = (uint8_t)(hi >> (56 - 8 * i));
		d->bytes[8 + i] = (uint8_t)(lo >> (56 - 8 * i));
	}
}

START_TEST(test_checksum_known_values)
{
	uint8_t buf[1000];

	/* 0x2d06800538d394c2 is the published XXH3-64 value of empty input. */
	ck_assert_uint_eq(ckpt_checksum(NULL, 0), UINT64_C(0x2d06800538d394c2));
	ck_assert_uint_eq(ckpt_checksum("", 0), UINT64_C(0x2d06800538d394c2));
	ck_assert_uint_eq(ckpt_checksum("abc", 3), UINT64_C(0x78af5f94892f3950));
	ck_assert_uint_eq(ckpt_checksum(kat_str, 28), UINT64_C(0xf4510d48219e214a));
	fill_pattern(buf, sizeof(buf));
	ck_assert_uint_eq(ckpt_checksum(buf, sizeof(buf)), UINT64_C(0x989765d0ea7a5ecd));
	/* Oracle: library XXH3_64bits, seed 0. */
	ck_assert_uint_eq(ckpt_checksum(buf, 999), XXH3_64bits(buf, 999));
	buf[500] ^= 1;
	ck_assert_uint_ne(ckpt_checksum(buf, sizeof(buf)), UINT64_C(0x989765d0ea7a5ecd));
}
END_TEST

START_TEST(test_hash_known_answer)
{
	ckpt_hasher *h = make_hasher(167);
	ckpt_digest d, want;
	uint8_t buf[1000];
	char hex[2 * CKPT_DIGEST_LEN + 1];

	ckpt_hash_chunk(h, kat_str, 28, &d);
	/* Canonical form is big-endian high64 then low64. */
	digest_from_u64(&want, UINT64_C(0xbfb4e6a5b4cd2645), UINT64_C(0xfceb5b1d75d76962));
	ck_assert_mem_eq(d.bytes, want.bytes, CKPT_DIGEST_LEN);
	ckpt_digest_to_hex(&d, hex);
	ck_assert_str_eq(hex, "bfb4e6a5b4cd2645fceb5b1d75d76962");

	fill_pattern(buf, sizeof(buf));
	ckpt_hash_chunk(h, buf, sizeof(buf), &d);
	digest_from_u64(&want, UINT64_C(0x629bd57cbb9d70d1), UINT64_C(0xb19b72255fc2da4e));
	ck_assert_mem_eq(d.bytes, want.bytes, CKPT_DIGEST_LEN);
	ckpt_hasher_free(h);
}
END_TEST

START_TEST(test_hash_properties)
{
	ckpt_hasher *h1 = make_hasher(167), *h1b = make_hasher(167), *h2 = make_hasher(101);
	size_t len = 1 << 20;
	uint8_t *buf = malloc(len);
	ckpt_digest a, b, c;

	ck_assert_ptr_nonnull(buf);
	fill_pattern(buf, len);
	ckpt_hash_chunk(h1, buf, len, &a);
	ckpt_hash_chunk(h1b, buf, len, &b);
	ck_assert_int_eq(ckpt_digest_cmp(&a, &b), 0); /* same secret, same data */
	ckpt_hash_chunk(h1, buf, len, &b);
	ck_assert_int_eq(ckpt_digest_cmp(&a, &b), 0); /* repeatable */
	ckpt_hash_chunk(h2, buf, len, &c);
	ck_assert_int_ne(ckpt_digest_cmp(&a, &c), 0); /* different secret */

	buf[len / 2] ^= 0x10; /* one bit */
	ckpt_hash_chunk(h1, buf, len, &b);
	ck_assert_int_ne(ckpt_digest_cmp(&a, &b), 0);
	buf[len / 2] ^= 0x10;
	ckpt_hash_chunk(h1, buf, len - 1, &b); /* length matters */
	ck_assert_int_ne(ckpt_digest_cmp(&a, &b), 0);

	/* Empty input is valid and keyed. */
	ckpt_hash_chunk(h1, NULL, 0, &a);
	ckpt_hash_chunk(h2, NULL, 0, &b);
	ck_assert_int_ne(ckpt_digest_cmp(&a, &b), 0);

	/* Keyed hash differs from the unkeyed default. */
	ckpt_hash_chunk(h1, kat_str, 28, &a);
	{
		XXH128_hash_t u = XXH3_128bits(kat_str, 28);

		digest_from_u64(&b, u.high64, u.low64);
		ck_assert_int_ne(ckpt_digest_cmp(&a, &b), 0);
	}
	free(buf);
	ckpt_hasher_free(h1);
	ckpt_hasher_free(h1b);
	ckpt_hasher_free(h2);
}
END_TEST

/* The digest of pieces is the digest of their concatenation. */
START_TEST(test_hash_chunkv)
{
	static const size_t cuts[][2] = { { 0, 0 }, { 1, 1 }, { 7, 1000 }, { 240, 241 },
					  { 65536, 65536 + 4096 }, { 500000, 999999 },
					  { 1048583, 1048583 } };
	ckpt_hasher *h = make_hasher(167);
	size_t len = (1 << 20) + 7;
	uint8_t *buf = malloc(len);
	ckpt_digest whole, part;

	ck_assert_ptr_nonnull(buf);
	fill_pattern(buf, len);
	ckpt_hash_chunk(h, buf, len, &whole);
	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
		struct iovec iov[3] = {
			{ buf, cuts[i][0] },
			{ buf + cuts[i][0], cuts[i][1] - cuts[i][0] },
			{ buf + cuts[i][1], len - cuts[i][1] },
		};
		ck_assert_int_eq(ckpt_hash_chunkv(h, iov, 3, &part), 0);
		ck_assert_msg(ckpt_digest_cmp(&whole, &part) == 0, "cuts %zu,%zu", cuts[i][0],
			      cuts[i][1]);
		ck_assert_int_eq(ckpt_hash_chunkv(h, iov + 1, 2, &part), 0);
		ckpt_hash_chunk(h, buf + cuts[i][0], len - cuts[i][0], &whole);
		ck_assert_int_eq(ckpt_digest_cmp(&whole, &part), 0);
		ckpt_hash_chunk(h, buf, len, &whole);
	}
	{
		struct iovec one = { buf, len };

		ck_assert_int_eq(ckpt_hash_chunkv(h, &one, 1, &part), 0);
		ck_assert_int_eq(ckpt_digest_cmp(&whole, &part), 0);
	}
	free(buf);
	ckpt_hasher_free(h);
}
END_TEST

/* The algorithm table: id 1 is keyed XXH3-128 with this header's digest
 * and secret sizes; unknown ids (0 is never one) find nothing. */
START_TEST(test_hash_algos)
{
	const struct ckpt_hash_algo *a = ckpt_hash_algo_by_id(CKPT_HASH_XXH3_128_KEYED);
	size_t n = 0;

	ck_assert_int_eq(CKPT_HASH_XXH3_128_KEYED, 1);
	ck_assert_int_eq(CKPT_HASH_ALGO_DEFAULT, CKPT_HASH_XXH3_128_KEYED);
	ck_assert_ptr_nonnull(a);
	ck_assert_uint_eq(a->id, 1);
	ck_assert_str_eq(a->name, "xxh3-128-keyed");
	ck_assert_uint_eq(a->digest_len, CKPT_DIGEST_LEN);
	ck_assert_uint_eq(a->secret_len, CKPT_SECRET_LEN);
	ck_assert_ptr_null(ckpt_hash_algo_by_id(0));
	ck_assert_ptr_null(ckpt_hash_algo_by_id(2));
	ck_assert_ptr_null(ckpt_hash_algo_by_id(UINT32_MAX));
	for (uint32_t last = 0; ckpt_hash_algo_at(n); n++) {
		a = ckpt_hash_algo_at(n);
		ck_assert_uint_gt(a->id, last); /* id order, no 0 */
		ck_assert_ptr_eq(ckpt_hash_algo_by_id(a->id), a);
		last = a->id;
	}
	ck_assert_uint_eq(n, 1);
}
END_TEST

START_TEST(test_hasher_copies_secret)
{
	uint8_t sec[CKPT_SECRET_LEN];
	ckpt_hasher *h = NULL, *ref = make_hasher(167);
	ckpt_digest a, b;

	fixed_secret(sec, sizeof(sec), 167);
	ck_assert_int_eq(ckpt_hasher_new(sec, sizeof(sec), &h), 0);
	memset(sec, 0, sizeof(sec)); /* caller's buffer changes after new */
	ckpt_hash_chunk(h, kat_str, 28, &a);
	ckpt_hash_chunk(ref, kat_str, 28, &b);
	ck_assert_int_eq(ckpt_digest_cmp(&a, &b), 0);
	ckpt_hasher_free(h);
	ckpt_hasher_free(ref);
}
END_TEST

START_TEST(test_hasher_bad_secret)
{
	uint8_t sec[CKPT_SECRET_LEN];
	ckpt_hasher *h = (ckpt_hasher *)0x1;

	fixed_secret(sec, sizeof(sec), 167);
	ck_assert_int_eq(ckpt_hasher_new(sec, CKPT_SECRET_LEN_MIN - 1, &h), -EINVAL);
	ck_assert_ptr_eq(h, (ckpt_hasher *)0x1); /* untouched */
	ck_assert_int_eq(ckpt_hasher_new(sec, 0, &h), -EINVAL);
	ck_assert_int_eq(ckpt_hasher_new(NULL, CKPT_SECRET_LEN, &h), -EINVAL);
	ck_assert_int_eq(ckpt_hasher_new(sec, CKPT_SECRET_LEN, NULL), -EINVAL);
	/* Exactly the minimum is accepted. */
	ck_assert_int_eq(ckpt_hasher_new(sec, CKPT_SECRET_LEN_MIN, &h), 0);
	ckpt_hasher_free(h);
	ckpt_hasher_free(NULL);
}
END_TEST

START_TEST(test_digest_cmp_order)
{
	ckpt_digest a, b;

	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	ck_assert_int_eq(ckpt_digest_cmp(&a, &b), 0);
	b.bytes[CKPT_DIGEST_LEN - 1] = 1;
	ck_assert_int_lt(ckpt_digest_cmp(&a, &b), 0);
	a.bytes[0] = 1;
	ck_assert_int_gt(ckpt_digest_cmp(&a, &b), 0);
	b.bytes[0] = 0xff; /* unsigned byte order */
	ck_assert_int_lt(ckpt_digest_cmp(&a, &b), 0);
}
END_TEST

START_TEST(test_hex_round_trip)
{
	ckpt_digest d, e;
	char hex[2 * CKPT_DIGEST_LEN + 1];
	static const uint8_t raw[CKPT_DIGEST_LEN] = {
		0x0f, 0x20, 0x31, 0x42, 0x53, 0x64, 0x75, 0x86,
		0x97, 0x08, 0x19, 0x2a, 0x3b, 0x4c, 0x5d, 0x6e,
	};

	memcpy(d.bytes, raw, CKPT_DIGEST_LEN);
	ckpt_digest_to_hex(&d, hex);
	ck_assert_str_eq(hex, "0f203142536475869708192a3b4c5d6e");
	ck_assert_int_eq(ckpt_digest_from_hex(hex, &e), 0);
	ck_assert_mem_eq(d.bytes, e.bytes, CKPT_DIGEST_LEN);

	ck_assert_int_eq(ckpt_digest_from_hex("0F203142536475869708192A3B4C5D6E", &e), 0);
	ck_assert_mem_eq(d.bytes, e.bytes, CKPT_DIGEST_LEN);

	memset(&d, 0xff, sizeof(d));
	ckpt_digest_to_hex(&d, hex);
	ck_assert_str_eq(hex, "ffffffffffffffffffffffffffffffff");
	ck_assert_int_eq(ckpt_digest_from_hex(hex, &e), 0);
	ck_assert_mem_eq(d.bytes, e.bytes, CKPT_DIGEST_LEN);
}
END_TEST

START_TEST(test_hex_bad_input)
{
	ckpt_digest e, orig;

	memset(&e, 0xa5, sizeof(e));
	orig = e;
	ck_assert_int_eq(ckpt_digest_from_hex(NULL, &e), -EINVAL);
	ck_assert_int_eq(ckpt_digest_from_hex("", &e), -EINVAL);
	/* 31 digits (odd, short). */
	ck_assert_int_eq(ckpt_digest_from_hex("0f203142536475869708192a3b4c5d6", &e), -EINVAL);
	/* 30 digits. */
	ck_assert_int_eq(ckpt_digest_from_hex("0f203142536475869708192a3b4c5d", &e), -EINVAL);
	/* 33 digits. */
	ck_assert_int_eq(ckpt_digest_from_hex("0f203142536475869708192a3b4c5d6e0", &e), -EINVAL);
	/* Non-hex characters at the start, middle and end. */
	ck_assert_int_eq(ckpt_digest_from_hex("0g203142536475869708192a3b4c5d6e", &e), -EINVAL);
	ck_assert_int_eq(ckpt_digest_from_hex("xf203142536475869708192a3b4c5d6e", &e), -EINVAL);
	ck_assert_int_eq(ckpt_digest_from_hex("0f2031425364758697-8192a3b4c5d6e", &e), -EINVAL);
	ck_assert_int_eq(ckpt_digest_from_hex("0f203142536475869708192a3b4c5d6z", &e), -EINVAL);
	ck_assert_int_eq(ckpt_digest_from_hex("0f203142536475869708192a3b4c5d6 ", &e), -EINVAL);
	ck_assert_int_eq(ckpt_digest_from_hex("0f203142536475869708192a3b4c5d6e\n", &e), -EINVAL);
	ck_assert_int_eq(ckpt_digest_from_hex("0f203142536475869708192a3b4c5d6e", NULL), -EINVAL);
	ck_assert_mem_eq(e.bytes, orig.bytes, CKPT_DIGEST_LEN); /* untouched on error */
}
END_TEST

START_TEST(test_secret_generate)
{
	uint8_t a[CKPT_SECRET_LEN], b[CKPT_SECRET_LEN], zero[CKPT_SECRET_LEN];
	size_t nz = 0;

	memset(a, 0, sizeof(a));
	memset(b, 0, sizeof(b));
	memset(zero, 0, sizeof(zero));
	ck_assert_int_eq(ckpt_secret_generate(a, sizeof(a)), 0);
	ck_assert_int_eq(ckpt_secret_generate(b, sizeof(b)), 0);
	ck_assert_int_ne(memcmp(a, zero, sizeof(a)), 0);
	ck_assert_int_ne(memcmp(a, b, sizeof(a)), 0);
	for (size_t i = 0; i < sizeof(a); i++)
		nz += a[i] != 0;
	/* 192 random bytes: P(more than 16 zeros) is negligible. */
	ck_assert_uint_ge(nz, sizeof(a) - 16);
	ck_assert_int_eq(ckpt_secret_generate(NULL, 0), 0);
	ck_assert_int_eq(ckpt_secret_generate(NULL, 1), -EINVAL);
	/* Larger than one getrandom() call may return (> 256 bytes). */
	{
		size_t big = 1 << 20;
		uint8_t *p = calloc(1, big);

		ck_assert_ptr_nonnull(p);
		ck_assert_int_eq(ckpt_secret_generate(p, big), 0);
		nz = 0;
		for (size_t i = big - 4096; i < big; i++)
			nz += p[i] != 0;
		ck_assert_uint_gt(nz, 3900); /* tail was filled, expected ~4080 */
		free(p);
	}
}
END_TEST

static Suite *hash_suite(void)
{
	Suite *s = suite_create("hash");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_checksum_known_values);
	tcase_add_test(tc, test_hash_known_answer);
	tcase_add_test(tc, test_hash_chunkv);
	tcase_add_test(tc, test_hash_properties);
	tcase_add_test(tc, test_hasher_copies_secret);
	tcase_add_test(tc, test_hash_algos);
	tcase_add_test(tc, test_hasher_bad_secret);
	tcase_add_test(tc, test_digest_cmp_order);
	tcase_add_test(tc, test_hex_round_trip);
	tcase_add_test(tc, test_hex_bad_input);
	tcase_add_test(tc, test_secret_generate);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(hash_suite());
}
