// SPDX-License-Identifier: MIT
/*
 * check_compress.c - unit tests for core/compress.c
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_getFrameHeader */
#include <zstd.h>

#include "chunk/compress.h"
#include "testlib.h"

#define MIB (1024u * 1024)

static uint64_t rng_state;

static uint64_t rng_next(void)
{
	return tl_splitmix64(&rng_state);
}

static void fill_random(uint8_t *buf, size_t len, uint64_t seed)
{
	rng_state = seed;
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)rng_next();
}

static double rng_normal(void)
{
	double u1 = ((double)(rng_next() >> 11) + 1.0) / 9007199254740993.0;
	double u2 = (double)(rng_next() >> 11) / 9007199254740992.0;

	return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* Little-endian bf16 values ~ N(0, std) (float32 truncated to its top 16 bits). */
static void fill_bf16(uint8_t *buf, size_t len, double std, uint64_t seed)
{
	rng_state = seed;
	for (size_t i = 0; i + 2 <= len; i += 2) {
		float f = (float)(rng_normal() * std);
		uint32_t u;

		memcpy(&u, &f, 4);
		buf[i] = (uint8_t)(u >> 16);
		buf[i + 1] = (uint8_t)(u >> 24);
	}
	if (len % 2)
		buf[len - 1] = 0x3c;
}

/* Little-endian fp32 values ~ N(0, std), low mantissa bits zeroed (fp32 upcast of fp16-ish). */
static void fill_f32(uint8_t *buf, size_t len, double std, uint64_t seed)
{
	rng_state = seed;
	for (size_t i = 0; i + 4 <= len; i += 4) {
		float f = (float)(rng_normal() * std);
		uint32_t u;

		memcpy(&u, &f, 4);
		u &= 0xffffe000u;
		buf[i] = (uint8_t)u;
		buf[i + 1] = (uint8_t)(u >> 8);
		buf[i + 2] = (uint8_t)(u >> 16);
		buf[i + 3] = (uint8_t)(u >> 24);
	}
	for (size_t i = len - len % 4; i < len; i++)
		buf[i] = 0x3c;
}

/* Reference shuffle straight from the format definition. */
static void ref_shuffle(const uint8_t *in, uint8_t *out, size_t len, unsigned e)
{
	size_t n = e ? len / e : 0;

	if (e <= 1) {
		memcpy(out, in, len);
		return;
	}
	for (unsigned b = 0; b < e; b++)
		for (size_t i = 0; i < n; i++)
			out[b * n + i] = in[i * e + b];
	memcpy(out + n * e, in + n * e, len - n * e);
}

/* Stored bytes for codec built independently of ckpt_compress(). */
static uint8_t *make_stored(uint8_t codec, const uint8_t *raw, size_t len, size_t *ret_len)
{
	size_t cap = ZSTD_compressBound(len);
	uint8_t *tmp = malloc(len + 1), *out = malloc(cap);
	unsigned e = codec == CKPT_CODEC_ZSTD_SHUF2 ? 2 : codec == CKPT_CODEC_ZSTD_SHUF4 ? 4 : 1;
	size_t r;

	ck_assert_ptr_nonnull(tmp);
	ck_assert_ptr_nonnull(out);
	ref_shuffle(raw, tmp, len, e);
	r = ZSTD_compress(out, cap, tmp, len, 3);
	ck_assert(!ZSTD_isError(r));
	free(tmp);
	*ret_len = r;
	return out;
}

/* ---- shuffle ---- */

START_TEST(test_shuffle_layout)
{
	const uint8_t in[10] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 };
	const uint8_t want2[7] = { 0, 2, 4, 1, 3, 5, 6 };
	const uint8_t want4[10] = { 0, 4, 1, 5, 2, 6, 3, 7, 8, 9 };
	const uint8_t want3[10] = { 0, 3, 6, 1, 4, 7, 2, 5, 8, 9 };
	uint8_t out[10], back[10];

	ckpt_shuffle(in, out, 7, 2);
	ck_assert_mem_eq(out, want2, 7);
	ckpt_unshuffle(out, back, 7, 2);
	ck_assert_mem_eq(back, in, 7);

	ckpt_shuffle(in, out, 10, 4);
	ck_assert_mem_eq(out, want4, 10);
	ckpt_unshuffle(out, back, 10, 4);
	ck_assert_mem_eq(back, in, 10);

	ckpt_shuffle(in, out, 10, 3);
	ck_assert_mem_eq(out, want3, 10);
	ckpt_unshuffle(out, back, 10, 3);
	ck_assert_mem_eq(back, in, 10);

	/* Fewer bytes than one element, and element size 0/1: plain copy. */
	ckpt_shuffle(in, out, 3, 4);
	ck_assert_mem_eq(out, in, 3);
	ckpt_shuffle(in, out, 10, 1);
	ck_assert_mem_eq(out, in, 10);
	ckpt_shuffle(in, out, 10, 0);
	ck_assert_mem_eq(out, in, 10);
	ckpt_shuffle(NULL, NULL, 0, 2); /* must not touch anything */
}
END_TEST

START_TEST(test_shuffle_matches_reference)
{
	static const unsigned elems[] = { 2, 4, 3, 8, 12 };
	/* Around the 16-element SIMD step and its tails. */
	static const size_t sizes[] = { 0, 1, 2, 31, 32, 33, 63, 64, 65, 66, 67,
					127, 128, 129, 1000, 4099, MIB + 5 };
	size_t max = MIB + 5;
	uint8_t *in = malloc(max), *got = malloc(max), *want = malloc(max), *back = malloc(max);

	ck_assert(in && got && want && back);
	fill_random(in, max, 42);
	for (size_t ei = 0; ei < sizeof(elems) / sizeof(elems[0]); ei++) {
		for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
			size_t len = sizes[si];
			unsigned e = elems[ei];

			ref_shuffle(in, want, len, e);
			ckpt_shuffle(in, got, len, e);
			ck_assert_msg(memcmp(got, want, len) == 0, "shuffle e=%u len=%zu", e, len);
			ckpt_unshuffle(got, back, len, e);
			ck_assert_msg(memcmp(back, in, len) == 0, "unshuffle e=%u len=%zu", e, len);
		}
	}
	free(in);
	free(got);
	free(want);
	free(back);
}
END_TEST

/* ckpt_unshuffle_planes: planes anywhere in memory (here each its own
 * buffer, allocated in reverse order) give what ckpt_unshuffle gives for
 * them laid end to end, around the SIMD step and its tails. */
START_TEST(test_unshuffle_planes)
{
	static const unsigned elems[] = { 1, 2, 3, 4, 8 };
	static const size_t counts[] = { 0, 1, 15, 16, 17, 33, 1000 };
	uint8_t *shuf = malloc(8 * 1000), *want = malloc(8 * 1000), *got = malloc(8 * 1000 + 1);

	ck_assert(shuf && want && got);
	fill_random(shuf, 8 * 1000, 7);
	for (size_t ei = 0; ei < sizeof(elems) / sizeof(elems[0]); ei++) {
		for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
			unsigned e = elems[ei];
			size_t n = counts[ci];
			uint8_t *copy[8];
			const uint8_t *planes[8];

			for (unsigned b = e; b-- > 0;) {
				copy[b] = malloc(n ? n : 1);
				ck_assert_ptr_nonnull(copy[b]);
				memcpy(copy[b], shuf + (size_t)b * n, n);
				planes[b] = copy[b];
			}
			ckpt_unshuffle(shuf, want, n * e, e);
			memset(got, 0xa5, 8 * 1000 + 1);
			ckpt_unshuffle_planes(planes, e, n, got);
			ck_assert_msg(memcmp(got, want, n * e) == 0, "e=%u n=%zu", e, n);
			ck_assert_uint_eq(got[n * e], 0xa5); /* nothing past n elements */
			for (unsigned b = 0; b < e; b++)
				free(copy[b]);
		}
	}
	free(shuf);
	free(want);
	free(got);
}
END_TEST

/* ---- compressor construction ---- */

START_TEST(test_compressor_new_args)
{
	ckpt_compressor *c = NULL;
	ckpt_decompressor *d = NULL;

	ck_assert_int_eq(ckpt_compressor_new(-1, &c), -EINVAL);
	ck_assert_int_eq(ckpt_compressor_new(-5, &c), -EINVAL);
	ck_assert_int_eq(ckpt_compressor_new(CKPT_COMPRESS_LEVEL_MAX + 1, &c), -EINVAL);
	ck_assert_int_eq(ckpt_compressor_new(3, NULL), -EINVAL);
	ck_assert_ptr_null(c);
	for (int lvl = 0; lvl <= CKPT_COMPRESS_LEVEL_MAX; lvl += CKPT_COMPRESS_LEVEL_MAX) {
		ck_assert_int_eq(ckpt_compressor_new(lvl, &c), 0);
		ck_assert_ptr_nonnull(c);
		ckpt_compressor_free(c);
		c = NULL;
	}
	ck_assert_int_eq(ckpt_decompressor_new(NULL), -EINVAL);
	ck_assert_int_eq(ckpt_decompressor_new(&d), 0);
	ckpt_decompressor_free(d);
	ckpt_compressor_free(NULL);
	ckpt_decompressor_free(NULL);
}
END_TEST

START_TEST(test_compress_bad_args)
{
	ckpt_compressor *c;
	uint8_t buf[64] = { 0 }, codec = 99;
	const void *out = NULL;
	size_t out_len = 12345;

	ck_assert_int_eq(ckpt_compressor_new(1, &c), 0);
	ck_assert_int_eq(ckpt_compress(c, buf, sizeof(buf), 3, &codec, &out, &out_len), -EINVAL);
	ck_assert_int_eq(ckpt_compress(c, buf, sizeof(buf), 8, &codec, &out, &out_len), -EINVAL);
	ck_assert_int_eq(ckpt_compress(c, NULL, 1, 0, &codec, &out, &out_len), -EINVAL);
	ck_assert_int_eq(ckpt_compress(NULL, buf, 1, 0, &codec, &out, &out_len), -EINVAL);
	ck_assert_int_eq(ckpt_compress(c, buf, 1, 0, NULL, &out, &out_len), -EINVAL);
	ck_assert_int_eq(ckpt_compress(c, buf, 1, 0, &codec, NULL, &out_len), -EINVAL);
	ck_assert_int_eq(ckpt_compress(c, buf, 1, 0, &codec, &out, NULL), -EINVAL);
	/* Output parameters untouched on error. */
	ck_assert_uint_eq(codec, 99);
	ck_assert_ptr_null(out);
	ck_assert_uint_eq(out_len, 12345);
	ckpt_compressor_free(c);
}
END_TEST

/* ---- round trips ---- */

static void round_trip(ckpt_compressor *c, ckpt_decompressor *d, const uint8_t *raw, size_t len,
		       unsigned elem, uint8_t *ret_codec, size_t *ret_out_len)
{
	uint8_t codec = 0xee;
	const void *out = NULL;
	size_t out_len = 0;
	uint8_t *back = malloc(len + 16);

	ck_assert_ptr_nonnull(back);
	ck_assert_int_eq(ckpt_compress(c, raw, len, elem, &codec, &out, &out_len), 0);
	ck_assert_uint_le(codec, CKPT_CODEC_ZSTD_SHUF4);
	if (codec == CKPT_CODEC_RAW) {
		ck_assert_ptr_eq(out, raw);
		ck_assert_uint_eq(out_len, len);
	} else {
		ck_assert_uint_lt(out_len, len - len / 64);
		if (elem == 0)
			ck_assert_uint_eq(codec, CKPT_CODEC_ZSTD);
		if (elem == 2)
			ck_assert(codec == CKPT_CODEC_ZSTD || codec == CKPT_CODEC_ZSTD_SHUF2);
		if (elem == 4)
			ck_assert(codec == CKPT_CODEC_ZSTD || codec == CKPT_CODEC_ZSTD_SHUF4);
	}
	memset(back, 0xa5, len + 16);
	ck_assert_int_eq(ckpt_decompress(d, codec, out, out_len, back, len), 0);
	ck_assert(memcmp(back, raw, len) == 0);
	for (size_t i = len; i < len + 16; i++)
		ck_assert_uint_eq(back[i], 0xa5);
	free(back);
	if (ret_codec)
		*ret_codec = codec;
	if (ret_out_len)
		*ret_out_len = out_len;
}

START_TEST(test_round_trip_sizes)
{
	static const size_t sizes[] = { 0, 1, 3, 7, 64, 1000, 65535, 65536, 65537, MIB + 5 };
	static const unsigned elems[] = { 0, 2, 4 };
	size_t max = MIB + 5;
	uint8_t *rnd = malloc(max), *bf = malloc(max), *f32 = malloc(max), *zero = calloc(1, max);
	ckpt_compressor *c;
	ckpt_decompressor *d;
	uint8_t codec;

	ck_assert(rnd && bf && f32 && zero);
	fill_random(rnd, max, 1);
	fill_bf16(bf, max, 0.02, 2);
	fill_f32(f32, max, 1.0, 3);
	ck_assert_int_eq(ckpt_compressor_new(3, &c), 0);
	ck_assert_int_eq(ckpt_decompressor_new(&d), 0);
	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		for (size_t ei = 0; ei < 3; ei++) {
			size_t len = sizes[si];

			round_trip(c, d, rnd, len, elems[ei], NULL, NULL);
			round_trip(c, d, bf, len, elems[ei], NULL, NULL);
			round_trip(c, d, f32, len, elems[ei], NULL, NULL);
			round_trip(c, d, zero, len, elems[ei], &codec, NULL);
			/* Tiny inputs cannot shrink by a zstd frame; zeros >= 64 B always do. */
			if (len < 16)
				ck_assert_uint_eq(codec, CKPT_CODEC_RAW);
			if (len >= 64)
				ck_assert_uint_ne(codec, CKPT_CODEC_RAW);
		}
	}
	ckpt_compressor_free(c);
	ckpt_decompressor_free(d);
	free(rnd);
	free(bf);
	free(f32);
	free(zero);
}
END_TEST

/* Every codec decodes payloads produced independently of ckpt_compress(). */
START_TEST(test_decode_every_codec)
{
	static const size_t sizes[] = { 0, 1, 3, 7, 33, MIB + 5 };
	static const uint8_t codecs[] = { CKPT_CODEC_ZSTD, CKPT_CODEC_ZSTD_SHUF2,
					  CKPT_CODEC_ZSTD_SHUF4 };
	size_t max = MIB + 5;
	uint8_t *raw = malloc(max), *back = malloc(max + 8);
	ckpt_decompressor *d;

	ck_assert(raw && back);
	fill_bf16(raw, max, 0.05, 9);
	ck_assert_int_eq(ckpt_decompressor_new(&d), 0);
	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		size_t len = sizes[si], slen;

		/* RAW */
		memset(back, 0x5a, max + 8);
		ck_assert_int_eq(ckpt_decompress(d, CKPT_CODEC_RAW, raw, len, back, len), 0);
		ck_assert(memcmp(back, raw, len) == 0);
		ck_assert_uint_eq(back[len], 0x5a);
		for (size_t ci = 0; ci < 3; ci++) {
			uint8_t *st = make_stored(codecs[ci], raw, len, &slen);

			memset(back, 0x5a, max + 8);
			ck_assert_int_eq(ckpt_decompress(d, codecs[ci], st, slen, back, len), 0);
			ck_assert_msg(memcmp(back, raw, len) == 0, "codec %u len %zu",
				      codecs[ci], len);
			ck_assert_uint_eq(back[len], 0x5a);
			free(st);
		}
	}
	ckpt_decompressor_free(d);
	free(raw);
	free(back);
}
END_TEST

/* ---- codec choice ---- */

START_TEST(test_random_is_raw)
{
	size_t len = MIB;
	uint8_t *rnd = malloc(len);
	ckpt_compressor *c;
	ckpt_decompressor *d;
	uint8_t codec;
	const void *out;
	size_t out_len;

	ck_assert_ptr_nonnull(rnd);
	fill_random(rnd, len, 7);
	ck_assert_int_eq(ckpt_compressor_new(3, &c), 0);
	ck_assert_int_eq(ckpt_decompressor_new(&d), 0);
	for (unsigned e = 0; e <= 4; e += 2) {
		ck_assert_int_eq(ckpt_compress(c, rnd, len, e, &codec, &out, &out_len), 0);
		ck_assert_uint_eq(codec, CKPT_CODEC_RAW);
		ck_assert_ptr_eq(out, rnd);
		ck_assert_uint_eq(out_len, len);
	}
	/* 8 KiB of zeros (0.8%) saves less than len/64: still RAW. */
	memset(rnd, 0, 8192);
	ck_assert_int_eq(ckpt_compress(c, rnd, len, 0, &codec, &out, &out_len), 0);
	ck_assert_uint_eq(codec, CKPT_CODEC_RAW);
	/* 32 KiB of zeros (3.1%) clears the threshold. */
	memset(rnd, 0, 32768);
	ck_assert_int_eq(ckpt_compress(c, rnd, len, 0, &codec, &out, &out_len), 0);
	ck_assert_uint_eq(codec, CKPT_CODEC_ZSTD);
	ck_assert_uint_lt(out_len, len - len / 64);
	ck_assert_uint_gt(out_len, len - 32768);
	ckpt_compressor_free(c);
	ckpt_decompressor_free(d);
	free(rnd);
}
END_TEST

START_TEST(test_level0_is_raw)
{
	size_t len = MIB;
	uint8_t *zero = calloc(1, len);
	ckpt_compressor *c;
	uint8_t codec;
	const void *out;
	size_t out_len;

	ck_assert_ptr_nonnull(zero);
	ck_assert_int_eq(ckpt_compressor_new(0, &c), 0);
	for (unsigned e = 0; e <= 4; e += 2) {
		ck_assert_int_eq(ckpt_compress(c, zero, len, e, &codec, &out, &out_len), 0);
		ck_assert_uint_eq(codec, CKPT_CODEC_RAW);
		ck_assert_ptr_eq(out, zero);
		ck_assert_uint_eq(out_len, len);
	}
	ckpt_compressor_free(c);
	free(zero);
}
END_TEST

static void check_shuffle_wins(size_t len, unsigned elem, uint8_t want_codec)
{
	uint8_t *raw = malloc(len);
	ckpt_compressor *c;
	ckpt_decompressor *d;
	uint8_t codec;
	size_t shuf_len, plain_len;

	ck_assert_ptr_nonnull(raw);
	if (elem == 2)
		fill_bf16(raw, len, 0.02, 11);
	else
		fill_f32(raw, len, 0.02, 11);
	ck_assert_int_eq(ckpt_compressor_new(3, &c), 0);
	ck_assert_int_eq(ckpt_decompressor_new(&d), 0);
	round_trip(c, d, raw, len, elem, &codec, &shuf_len);
	ck_assert_uint_eq(codec, want_codec);
	round_trip(c, d, raw, len, 0, &codec, &plain_len);
	ck_assert_uint_eq(codec, CKPT_CODEC_ZSTD);
	/*
	 * Shuffle must give a better ratio; clearly so (>= 5%) on large chunks,
	 * whose byte planes land in separate zstd blocks.  A chunk of one zstd
	 * block (<= 128 KiB) gains much less.
	 */
	if (len > 128 * 1024)
		ck_assert_msg(shuf_len * 100 < plain_len * 95, "len %zu: shuffled %zu vs plain %zu",
			      len, shuf_len, plain_len);
	else
		ck_assert_msg(shuf_len < plain_len, "len %zu: shuffled %zu vs plain %zu",
			      len, shuf_len, plain_len);
	ckpt_compressor_free(c);
	ckpt_decompressor_free(d);
	free(raw);
}

START_TEST(test_bf16_prefers_shuffle)
{
	check_shuffle_wins(MIB, 2, CKPT_CODEC_ZSTD_SHUF2);      /* sampled decision */
	check_shuffle_wins(MIB + 1, 2, CKPT_CODEC_ZSTD_SHUF2);  /* odd tail byte */
	check_shuffle_wins(40000, 2, CKPT_CODEC_ZSTD_SHUF2);    /* small: both tried */
	check_shuffle_wins(MIB, 4, CKPT_CODEC_ZSTD_SHUF4);
	check_shuffle_wins(200000, 2, CKPT_CODEC_ZSTD_SHUF2);   /* just above the sample */
	check_shuffle_wins(40000, 4, CKPT_CODEC_ZSTD_SHUF4);
}
END_TEST

/*
 * fp32 values shaped like Adam moments: a top byte (sign and high exponent
 * bits) from eight values with probabilities 1/2, 1/4, ... (about 2 bits of
 * entropy) and three uniformly random low bytes.  Shuffled, plane 3 should
 * shrink to about a quarter and planes 0-2 not at all: a ratio near 1.2.
 */
static void fill_moments(uint8_t *buf, size_t len, uint64_t seed)
{
	static const uint8_t top[8] = { 0x3a, 0x3b, 0x39, 0x3c, 0x38, 0x3d, 0x37, 0xba };

	rng_state = seed;
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)rng_next();
	for (size_t i = 3; i < len; i += 4) {
		uint64_t r = rng_next();
		unsigned k = 0;

		while (k < 7 && (r & 1)) {
			k++;
			r >>= 1;
		}
		buf[i] = top[k];
	}
}

/*
 * The planes of a shuffled chunk must not share zstd blocks (zstd_planes_into
 * in compress.c).  At lengths whose planes are not multiples of 128 KiB, one
 * frame of the whole shuffled chunk puts the end of a random plane and the
 * start of the exponent plane into one block with one Huffman table: on this
 * data such frames came to 1.128x (60,000 bytes), 1.185x (200,000), 1.182x
 * (300,000) and 1.194x (640 KiB + 3).  With a block per plane every length
 * reaches 1.206-1.209x.  1 MiB (planes of 256 KiB) is the case where
 * whole-frame blocks already fell on plane boundaries (1.206x either way).
 */
START_TEST(test_planes_own_blocks)
{
	static const size_t lens[] = { 300000, 640 * 1024 + 3, 200000, 60000, MIB };
	ckpt_compressor *c;
	ckpt_decompressor *d;

	ck_assert_int_eq(ckpt_compressor_new(1, &c), 0);
	ck_assert_int_eq(ckpt_decompressor_new(&d), 0);
	for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
		size_t len = lens[k], out_len;
		uint8_t *raw = malloc(len), codec;

		ck_assert_ptr_nonnull(raw);
		fill_moments(raw, len, 21 + k);
		round_trip(c, d, raw, len, 4, &codec, &out_len);
		ck_assert_uint_eq(codec, CKPT_CODEC_ZSTD_SHUF4);
		ck_assert_msg((double)len / (double)out_len >= 1.20,
			      "len %zu: ratio %.4f below 1.20", len, (double)len / (double)out_len);
		free(raw);
	}
	ckpt_compressor_free(c);
	ckpt_decompressor_free(d);
}
END_TEST

/*
 * Number of LZ sequences (matches) in the zstd frame f[0..len), or -1 if it
 * does not parse.  Walks the blocks as RFC 8878 section 3.1.1 lays them out:
 * a raw or RLE block has none; a compressed block's literals section is
 * followed by the sequences section, whose first bytes give the count.
 */
static long frame_sequences(const uint8_t *f, size_t len)
{
	ZSTD_frameHeader h;
	size_t pos;
	long nseq = 0;
	bool last = false;

	if (ZSTD_getFrameHeader(&h, f, len) != 0)
		return -1;
	pos = h.headerSize;
	while (!last) {
		uint32_t bh, type, bsize;

		if (len - pos < 3)
			return -1;
		bh = f[pos] | (uint32_t)f[pos + 1] << 8 | (uint32_t)f[pos + 2] << 16;
		last = bh & 1;
		type = (bh >> 1) & 3;
		bsize = bh >> 3;
		pos += 3;
		if (type == 2) {
			const uint8_t *b = f + pos, *q;
			unsigned lt = b[0] & 3, sf = (b[0] >> 2) & 3;
			size_t hl, body;

			if (bsize < 5 || len - pos < bsize)
				return -1;
			if (lt <= 1) { /* raw or RLE literals: regenerated size only */
				hl = sf == 1 ? 2 : sf == 3 ? 3 : 1;
				body = sf == 1 ? (size_t)(b[0] >> 4) + ((size_t)b[1] << 4) :
				       sf == 3 ? (size_t)(b[0] >> 4) + ((size_t)b[1] << 4) +
						 ((size_t)b[2] << 12) :
						 (size_t)(b[0] >> 3);
				if (lt == 1)
					body = 1;
			} else { /* Huffman literals: regenerated size, then compressed size */
				uint64_t v = 0;

				hl = sf <= 1 ? 3 : sf == 2 ? 4 : 5;
				for (size_t i = 0; i < hl; i++)
					v |= (uint64_t)b[i] << (8 * i);
				body = sf <= 1 ? (v >> 14) & 0x3ff : sf == 2 ? (v >> 18) & 0x3fff :
				       (v >> 22) & 0x3ffff;
			}
			if (hl + body >= bsize)
				return -1;
			q = b + hl + body;
			nseq += q[0] < 128 ? q[0] : q[0] < 255 ? ((q[0] - 128) << 8) + q[1] :
			       q[1] + (q[2] << 8) + 0x7f00;
			pos += bsize;
		} else if (type <= 1) {
			pos += type == 0 ? bsize : 1;
		} else {
			return -1;
		}
		if (pos > len)
			return -1;
	}
	return nseq;
}

/*
 * Byte planes of float tensors are coded as literals only (zstd_literals_into
 * in compress.c): on them LZ matches cost more than they save, and each
 * costs the decoder a sequence.  On this data the frames of zstd_planes_into
 * (minMatch 7, the code before) held 1,306-29,474 sequences per chunk and
 * came to 1.206-1.209x (fp32) and 1.462-1.473x (bf16); literals only: no
 * sequence, 1.231-1.232x and 1.491-1.494x.  Built without
 * ZSTD_compressSequences (zstd < 1.5) the planes keep their matches and only
 * the round trip and the frame's layout are checked.
 */
START_TEST(test_planes_literals_only)
{
	static const size_t lens[] = { 300000, 640 * 1024 + 3, 60000, MIB };
	ckpt_compressor *c;
	ckpt_decompressor *d;

	ck_assert_int_eq(ckpt_compressor_new(1, &c), 0);
	ck_assert_int_eq(ckpt_decompressor_new(&d), 0);
	for (size_t k = 0; k < 2 * sizeof(lens) / sizeof(lens[0]); k++) {
		size_t len = lens[k % 4], out_len;
		unsigned e = k < 4 ? 4 : 2;
		uint8_t *raw = malloc(len), *back = malloc(len), *shuf = malloc(len), codec;
		const void *out;

		ck_assert(raw && back && shuf);
		if (e == 4)
			fill_moments(raw, len, 31 + k);
		else
			fill_bf16(raw, len, 0.02, 31 + k);
		ck_assert_int_eq(ckpt_compress(c, raw, len, e, &codec, &out, &out_len), 0);
		ck_assert_uint_eq(codec, e == 4 ? CKPT_CODEC_ZSTD_SHUF4 : CKPT_CODEC_ZSTD_SHUF2);
#ifdef CKPT_ZSTD_SEQUENCES
		ck_assert_msg((double)len / (double)out_len >= (e == 4 ? 1.22 : 1.48),
			      "len %zu e %u: ratio %.4f", len, e, (double)len / (double)out_len);
		ck_assert_msg(frame_sequences(out, out_len) == 0, "len %zu e %u: %ld sequences",
			      len, e, frame_sequences(out, out_len));
#else
		ck_assert_int_ge(frame_sequences(out, out_len), 0);
#endif
		/* an ordinary frame: plain zstd, checking its checksum, decodes it
		 * to the shuffled bytes */
		ck_assert_uint_eq(ZSTD_decompress(back, len, out, out_len), len);
		ckpt_shuffle(raw, shuf, len, e);
		ck_assert(memcmp(back, shuf, len) == 0);
		round_trip(c, d, raw, len, e, NULL, NULL);
		free(raw);
		free(back);
		free(shuf);
	}
	ckpt_compressor_free(c);
	ckpt_decompressor_free(d);
}
END_TEST

/*
 * Planes with real repeats keep their matches: fp32 moments whose second
 * half repeats the first (as duplicated rows would) came to 2.41x, with
 * 611 (60,000 bytes) and 14,425 (1 MiB) sequences; as literals only each
 * half would be coded like the other, about 1.23x.
 */
START_TEST(test_planes_keep_matches)
{
	/* the small chunk first: a fresh compressor grows its buffers in
	 * that call, and what it returns must be where they are now */
	static const size_t lens[] = { 60000, MIB };
	ckpt_compressor *c;
	ckpt_decompressor *d;

	ck_assert_int_eq(ckpt_compressor_new(1, &c), 0);
	ck_assert_int_eq(ckpt_decompressor_new(&d), 0);
	for (size_t k = 0; k < 2; k++) {
		size_t len = lens[k], out_len;
		uint8_t *raw = malloc(len), codec;
		const void *out;

		ck_assert_ptr_nonnull(raw);
		fill_moments(raw, len / 2, 41 + k);
		memcpy(raw + len / 2, raw, len / 2);
		ck_assert_int_eq(ckpt_compress(c, raw, len, 4, &codec, &out, &out_len), 0);
		ck_assert_msg((double)len / (double)out_len >= 2.2, "len %zu: ratio %.4f", len,
			      (double)len / (double)out_len);
		ck_assert_int_gt(frame_sequences(out, out_len), 0);
		round_trip(c, d, raw, len, 4, NULL, NULL);
		free(raw);
	}
	ckpt_compressor_free(c);
	ckpt_decompressor_free(d);
}
END_TEST

/* A chunk whose middle half is zeros: the sample must not look only there. */
START_TEST(test_sample_not_fooled_by_middle)
{
	size_t len = MIB;
	uint8_t *raw = malloc(len), *shuf = malloc(len);
	ckpt_compressor *c;
	ckpt_decompressor *d;
	uint8_t codec;
	size_t got, plain, shuffled;
	const void *out;

	ck_assert(raw && shuf);
	fill_bf16(raw, len, 0.02, 23);
	memset(raw + len / 4, 0, len / 2);
	ck_assert_int_eq(ckpt_compressor_new(1, &c), 0);
	ck_assert_int_eq(ckpt_decompressor_new(&d), 0);
	round_trip(c, d, raw, len, 2, &codec, &got);
	ck_assert_uint_eq(codec, CKPT_CODEC_ZSTD_SHUF2);
	/* And shuffling really is the better choice for the whole chunk. */
	ck_assert_int_eq(ckpt_compress(c, raw, len, 0, &codec, &out, &plain), 0);
	ckpt_shuffle(raw, shuf, len, 2);
	ck_assert_int_eq(ckpt_compress(c, shuf, len, 0, &codec, &out, &shuffled), 0);
	ck_assert_uint_eq(got, shuffled);
	ck_assert_uint_lt(shuffled, plain);
	ckpt_compressor_free(c);
	ckpt_decompressor_free(d);
	free(raw);
	free(shuf);
}
END_TEST

/* Text-like data: plain zstd must win over shuffling even with a hint. */
START_TEST(test_text_prefers_plain)
{
	size_t len = 2 * MIB;
	uint8_t *raw = malloc(len);
	static const char *words[] = { "layer", "weight", "bias", "attention", "mlp",
				       "norm", "embed", "{\"dtype\":", "\"BF16\"", "shape" };
	ckpt_compressor *c;
	ckpt_decompressor *d;
	uint8_t codec;
	size_t pos = 0;

	ck_assert_ptr_nonnull(raw);
	rng_state = 5;
	while (pos < len) {
		const char *w = words[rng_next() % 10];
		size_t wl = strlen(w);

		for (size_t i = 0; i <= wl && pos < len; i++)
			raw[pos++] = i < wl ? (uint8_t)w[i] : (uint8_t)(rng_next() % 3 ? ' ' : '.');
	}
	ck_assert_int_eq(ckpt_compressor_new(3, &c), 0);
	ck_assert_int_eq(ckpt_decompressor_new(&d), 0);
	round_trip(c, d, raw, len, 2, &codec, NULL);
	ck_assert_uint_eq(codec, CKPT_CODEC_ZSTD);
	round_trip(c, d, raw, 5000, 4, &codec, NULL);
	ck_assert_uint_eq(codec, CKPT_CODEC_ZSTD);
	ckpt_compressor_free(c);
	ckpt_decompressor_free(d);
	free(raw);
}
END_TEST

/* Buffers are reused across calls of different sizes without confusion. */
START_TEST(test_compressor_reuse)
{
	size_t big = 3 * MIB;
	uint8_t *a = malloc(big);
	ckpt_compressor *c;
	ckpt_decompressor *d;
	static const size_t seq[] = { 3 * MIB, 100, 40000, 2 * MIB + 3, 70000, 3 * MIB };

	ck_assert_ptr_nonnull(a);
	fill_bf16(a, big, 0.1, 13);
	ck_assert_int_eq(ckpt_compressor_new(1, &c), 0);
	ck_assert_int_eq(ckpt_decompressor_new(&d), 0);
	for (size_t i = 0; i < sizeof(seq) / sizeof(seq[0]); i++) {
		round_trip(c, d, a, seq[i], 2, NULL, NULL);
		round_trip(c, d, a + 1, seq[i] - 1, 4, NULL, NULL);
		round_trip(c, d, a, seq[i], 0, NULL, NULL);
	}
	ckpt_compressor_free(c);
	ckpt_decompressor_free(d);
	free(a);
}
END_TEST

/* A decompressor sized ahead (ckpt_decompressor_reserve) decodes chunks
 * below, at and above the reserved size; reserving less than it has is a
 * no-op, and NULL is refused. */
START_TEST(test_decompressor_reserve)
{
	static const size_t sizes[] = { 100, MIB, 2 * MIB, 2 * MIB + 7, 64 };
	size_t max = 2 * MIB + 7;
	uint8_t *raw = malloc(max), *back = malloc(max);
	ckpt_decompressor *d;

	ck_assert(raw && back);
	fill_bf16(raw, max, 0.05, 21);
	ck_assert_int_eq(ckpt_decompressor_reserve(NULL, MIB), -EINVAL);
	ck_assert_int_eq(ckpt_decompressor_new(&d), 0);
	ck_assert_int_eq(ckpt_decompressor_reserve(d, 2 * MIB), 0);
	ck_assert_int_eq(ckpt_decompressor_reserve(d, MIB), 0);
	ck_assert_int_eq(ckpt_decompressor_reserve(d, 0), 0);
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		for (uint8_t codec = CKPT_CODEC_ZSTD_SHUF2; codec <= CKPT_CODEC_ZSTD_SHUF4;
		     codec++) {
			size_t slen;
			uint8_t *st = make_stored(codec, raw, sizes[i], &slen);

			memset(back, 0, max);
			ck_assert_int_eq(ckpt_decompress(d, codec, st, slen, back, sizes[i]), 0);
			ck_assert_msg(memcmp(back, raw, sizes[i]) == 0, "codec %u len %zu", codec,
				      sizes[i]);
			free(st);
		}
	}
	ckpt_decompressor_free(d);
	free(raw);
	free(back);
}
END_TEST

/* ---- decode errors ---- */

START_TEST(test_decompress_errors)
{
	size_t len = 256 * 1024;
	uint8_t *raw = malloc(len), *back = malloc(len + 64), *copy;
	ckpt_compressor *c;
	ckpt_decompressor *d;
	static const unsigned elems[] = { 0, 2, 4 };

	ck_assert(raw && back);
	fill_bf16(raw, len, 0.02, 17);
	ck_assert_int_eq(ckpt_compressor_new(3, &c), 0);
	ck_assert_int_eq(ckpt_decompressor_new(&d), 0);
	for (size_t ei = 0; ei < 3; ei++) {
		uint8_t codec;
		const void *out;
		size_t out_len;

		ck_assert_int_eq(ckpt_compress(c, raw, len, elems[ei], &codec, &out, &out_len), 0);
		ck_assert_uint_ne(codec, CKPT_CODEC_RAW);
		copy = malloc(out_len);
		ck_assert_ptr_nonnull(copy);

		/* Wrong raw_len: too small (no overflow past dst) and too large. */
		memset(back, 0x77, len + 64);
		ck_assert_int_eq(ckpt_decompress(d, codec, out, out_len, back, len - 1), -EIO);
		ck_assert_uint_eq(back[len - 1], 0x77);
		for (size_t i = len; i < len + 64; i++)
			ck_assert_uint_eq(back[i], 0x77);
		ck_assert_int_eq(ckpt_decompress(d, codec, out, out_len, back, len + 1), -EIO);
		ck_assert_int_eq(ckpt_decompress(d, codec, out, out_len, back, 0), -EIO);

		/* Truncated payload. */
		ck_assert_int_eq(ckpt_decompress(d, codec, out, out_len - 1, back, len), -EIO);
		ck_assert_int_eq(ckpt_decompress(d, codec, out, out_len / 2, back, len), -EIO);
		ck_assert_int_eq(ckpt_decompress(d, codec, out, 0, back, len), -EIO);

		/* Single-bit flips at several places: header, body, checksum. */
		for (size_t k = 0; k < 8; k++) {
			size_t pos = k == 0 ? 0 : k == 7 ? out_len - 1 : out_len * k / 7;

			memcpy(copy, out, out_len);
			copy[pos] ^= (uint8_t)(1u << (k % 8));
			memset(back, 0x77, len + 64);
			ck_assert_msg(ckpt_decompress(d, codec, copy, out_len, back, len) == -EIO,
				      "codec %u flip at %zu not detected", codec, pos);
			for (size_t i = len; i < len + 64; i++)
				ck_assert_uint_eq(back[i], 0x77);
		}
		/* Garbage. */
		fill_random(copy, out_len, 99 + ei);
		ck_assert_int_eq(ckpt_decompress(d, codec, copy, out_len, back, len), -EIO);

		/* The decompressor still works after errors. */
		ck_assert_int_eq(ckpt_decompress(d, codec, out, out_len, back, len), 0);
		ck_assert(memcmp(back, raw, len) == 0);
		free(copy);
	}

	/* RAW with mismatched length. */
	ck_assert_int_eq(ckpt_decompress(d, CKPT_CODEC_RAW, raw, 10, back, 11), -EIO);
	ck_assert_int_eq(ckpt_decompress(d, CKPT_CODEC_RAW, raw, 11, back, 10), -EIO);

	/* Unknown codec ids. */
	ck_assert_int_eq(ckpt_decompress(d, 4, raw, 10, back, 10), -EINVAL);
	ck_assert_int_eq(ckpt_decompress(d, 255, raw, 10, back, 10), -EINVAL);

	/* NULL arguments. */
	ck_assert_int_eq(ckpt_decompress(NULL, CKPT_CODEC_RAW, raw, 10, back, 10), -EINVAL);
	ck_assert_int_eq(ckpt_decompress(d, CKPT_CODEC_RAW, NULL, 10, back, 10), -EINVAL);
	ck_assert_int_eq(ckpt_decompress(d, CKPT_CODEC_ZSTD, raw, 10, NULL, 10), -EINVAL);
	ck_assert_int_eq(ckpt_decompress(d, CKPT_CODEC_RAW, NULL, 0, NULL, 0), 0);

	ckpt_compressor_free(c);
	ckpt_decompressor_free(d);
	free(raw);
	free(back);
}
END_TEST

static Suite *compress_suite(void)
{
	Suite *s = suite_create("compress");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_shuffle_layout);
	tcase_add_test(tc, test_shuffle_matches_reference);
	tcase_add_test(tc, test_unshuffle_planes);
	tcase_add_test(tc, test_compressor_new_args);
	tcase_add_test(tc, test_compress_bad_args);
	tcase_add_test(tc, test_round_trip_sizes);
	tcase_add_test(tc, test_decode_every_codec);
	tcase_add_test(tc, test_random_is_raw);
	tcase_add_test(tc, test_level0_is_raw);
	tcase_add_test(tc, test_bf16_prefers_shuffle);
	tcase_add_test(tc, test_planes_own_blocks);
	tcase_add_test(tc, test_planes_literals_only);
	tcase_add_test(tc, test_planes_keep_matches);
	tcase_add_test(tc, test_sample_not_fooled_by_middle);
	tcase_add_test(tc, test_text_prefers_plain);
	tcase_add_test(tc, test_compressor_reuse);
	tcase_add_test(tc, test_decompress_errors);
	tcase_add_test(tc, test_decompressor_reserve);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(compress_suite());
}
