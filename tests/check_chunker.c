// SPDX-License-Identifier: MIT
/*
 * check_chunker.c - unit tests for core/chunker.c
 */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chunk/chunker.h"
#include "testlib.h"

#define KIB 1024u
#define MIB (1024u * 1024)
#define CKPT_MIN_T(a, b) ((a) < (b) ? (a) : (b))

static const struct ckpt_cdc_params defp = {
	CKPT_CDC_DEFAULT_MIN, CKPT_CDC_DEFAULT_AVG, CKPT_CDC_DEFAULT_MAX
};
static const struct ckpt_cdc_params smallp = { 64, 256, 1024 };
/* The parameters the known answers below were computed for. */
static const struct ckpt_cdc_params kap = { 256 * KIB, 1 * MIB, 4 * MIB };

/* Stream of splitmix64(seed) outputs, each written little-endian. */
static uint8_t *random_buf(size_t len, uint64_t seed)
{
	uint8_t *buf = malloc(len + 8);
	uint64_t st = seed;

	ck_assert_ptr_nonnull(buf);
	for (size_t i = 0; i < len; i += 8) {
		uint64_t v = tl_splitmix64(&st);

		for (int k = 0; k < 8; k++)
			buf[i + k] = (uint8_t)(v >> (8 * k));
	}
	return buf;
}

/* ---- independent reference implementation of the documented rules ---- */

static uint64_t ref_gear[256];

static void ref_init(void)
{
	uint64_t st = UINT64_C(0x636b707466732131);

	for (int i = 0; i < 256; i++)
		ref_gear[i] = tl_splitmix64(&st);
}

static size_t ref_cut(const struct ckpt_cdc_params *p, const uint8_t *buf, size_t len, bool eof)
{
	unsigned bits = 0;
	uint64_t ms = 0, ml = 0, h = 0;
	size_t end = len < p->max_size ? len : p->max_size;

	while (((size_t)1 << bits) < p->avg_size)
		bits++;
	for (unsigned b = 0; b < bits + 2; b++)
		ms |= UINT64_C(1) << (62 - b);
	for (unsigned b = 0; b < bits - 2; b++)
		ml |= UINT64_C(1) << (62 - b);
	for (size_t i = p->min_size; i < end; i++) {
		h = (h << 1) + ref_gear[buf[i]];
		if ((h & (i < p->avg_size ? ms : ml)) == 0)
			return i + 1;
	}
	if (len >= p->max_size)
		return p->max_size;
	return eof ? len : 0;
}

/* Chunk a whole buffer; returns the number of chunks, lengths in lens[]. */
static size_t chunk_all(const struct ckpt_cdc_params *p, const uint8_t *buf, size_t len,
			size_t *lens, size_t max_chunks, bool use_ref)
{
	size_t off = 0, n = 0;

	while (off < len) {
		size_t c = use_ref ? ref_cut(p, buf + off, len - off, true)
				   : ckpt_cdc_cut(p, buf + off, len - off, true);

		ck_assert_uint_gt(c, 0);
		ck_assert_uint_le(c, len - off);
		ck_assert_uint_lt(n, max_chunks);
		lens[n++] = c;
		off += c;
	}
	return n;
}

/* ---- tests ---- */

START_TEST(test_params_check)
{
	struct ckpt_cdc_params p;

	ck_assert_int_eq(ckpt_cdc_params_check(&defp), 0);
	ck_assert_int_eq(ckpt_cdc_params_check(&smallp), 0);
	ck_assert_int_eq(ckpt_cdc_params_check(NULL), -EINVAL);

	p = (struct ckpt_cdc_params){ 64, 128, 129 }; /* tightest valid */
	ck_assert_int_eq(ckpt_cdc_params_check(&p), 0);
	p = (struct ckpt_cdc_params){ 63, 128, 1024 }; /* min too small */
	ck_assert_int_eq(ckpt_cdc_params_check(&p), -EINVAL);
	p = (struct ckpt_cdc_params){ 0, 128, 1024 };
	ck_assert_int_eq(ckpt_cdc_params_check(&p), -EINVAL);
	p = (struct ckpt_cdc_params){ 256, 256, 1024 }; /* min == avg */
	ck_assert_int_eq(ckpt_cdc_params_check(&p), -EINVAL);
	p = (struct ckpt_cdc_params){ 512, 256, 1024 }; /* min > avg */
	ck_assert_int_eq(ckpt_cdc_params_check(&p), -EINVAL);
	p = (struct ckpt_cdc_params){ 64, 1024, 1024 }; /* avg == max */
	ck_assert_int_eq(ckpt_cdc_params_check(&p), -EINVAL);
	p = (struct ckpt_cdc_params){ 64, 1024, 512 }; /* avg > max */
	ck_assert_int_eq(ckpt_cdc_params_check(&p), -EINVAL);
	p = (struct ckpt_cdc_params){ 64, 1000, 4096 }; /* avg not a power of two */
	ck_assert_int_eq(ckpt_cdc_params_check(&p), -EINVAL);
	p = (struct ckpt_cdc_params){ 64, 3 * 256, 4096 };
	ck_assert_int_eq(ckpt_cdc_params_check(&p), -EINVAL);
	p = (struct ckpt_cdc_params){ 1 * MIB, 32 * MIB, 64 * MIB }; /* max at the limit */
	ck_assert_int_eq(ckpt_cdc_params_check(&p), 0);
	p = (struct ckpt_cdc_params){ 1 * MIB, 32 * MIB, 64 * MIB + 1 };
	ck_assert_int_eq(ckpt_cdc_params_check(&p), -EINVAL);
	p = (struct ckpt_cdc_params){ 1 * MIB, 64 * MIB, 128 * MIB };
	ck_assert_int_eq(ckpt_cdc_params_check(&p), -EINVAL);
}
END_TEST

/* Cut points pinned for on-disk compatibility (computed with an independent script). */
START_TEST(test_known_answer)
{
	static const size_t want_def[] = { 720927, 1493715, 1184813, 1106862, 1146280,
					   313725, 325134 };
	size_t len = 6 * MIB, lens[64], n;
	uint8_t *buf = random_buf(len, 1);

	n = chunk_all(&kap, buf, len, lens, 64, false);
	ck_assert_uint_eq(n, sizeof(want_def) / sizeof(want_def[0]));
	for (size_t i = 0; i < n; i++)
		ck_assert_uint_eq(lens[i], want_def[i]);
	free(buf);
}
END_TEST

START_TEST(test_known_answer_small)
{
	static const size_t want_small[] = { 266, 210, 264, 243, 257, 281, 373, 270,
					     337, 319, 305, 232, 350, 422, 301, 290 };
	uint8_t *buf = random_buf(64 * KIB, 2);
	size_t off = 0;

	for (size_t i = 0; i < sizeof(want_small) / sizeof(want_small[0]); i++) {
		size_t c = ckpt_cdc_cut(&smallp, buf + off, 64 * KIB - off, false);

		ck_assert_uint_eq(c, want_small[i]);
		off += c;
	}
	free(buf);
}
END_TEST

/* The implementation follows the documented rules exactly (table included). */
START_TEST(test_matches_reference)
{
	static const struct ckpt_cdc_params ps[] = {
		{ CKPT_CDC_DEFAULT_MIN, CKPT_CDC_DEFAULT_AVG, CKPT_CDC_DEFAULT_MAX },
		{ 64, 256, 1024 },
		{ 2 * KIB, 8 * KIB, 64 * KIB },
		{ 64, 128, 129 },
	};
	size_t len = 16 * MIB;
	uint8_t *buf = random_buf(len, 3);
	size_t *a = malloc(sizeof(size_t) * 200000), *b = malloc(sizeof(size_t) * 200000);

	ck_assert(a && b);
	for (size_t k = 0; k < sizeof(ps) / sizeof(ps[0]); k++) {
		size_t plen = k == 0 ? len : len / 16;
		size_t na = chunk_all(&ps[k], buf, plen, a, 200000, false);
		size_t nb = chunk_all(&ps[k], buf, plen, b, 200000, true);

		ck_assert_uint_eq(na, nb);
		ck_assert(memcmp(a, b, na * sizeof(size_t)) == 0);
		ck_assert_uint_gt(na, 1);
	}
	free(a);
	free(b);
	free(buf);
}
END_TEST

START_TEST(test_sizes_and_average)
{
	size_t len = 64 * MIB, lens[512], n, sum = 0;
	uint8_t *buf = random_buf(len, 4);
	size_t *lens2 = malloc(sizeof(lens));

	ck_assert_ptr_nonnull(lens2);
	n = chunk_all(&defp, buf, len, lens, 512, false);
	for (size_t i = 0; i < n; i++) {
		sum += lens[i];
		if (i + 1 < n)
			ck_assert_uint_gt(lens[i], CKPT_CDC_DEFAULT_MIN);
		ck_assert_uint_le(lens[i], CKPT_CDC_DEFAULT_MAX);
	}
	ck_assert_uint_eq(sum, len);
	/* Mean chunk size within 0.5x..2x of avg_size. */
	ck_assert_uint_ge(len / n, CKPT_CDC_DEFAULT_AVG / 2);
	ck_assert_uint_le(len / n, CKPT_CDC_DEFAULT_AVG * 2);

	/* Deterministic: a second pass gives identical cuts. */
	ck_assert_uint_eq(chunk_all(&defp, buf, len, lens2, 512, false), n);
	ck_assert(memcmp(lens, lens2, n * sizeof(size_t)) == 0);
	free(lens2);
	free(buf);
}
END_TEST

START_TEST(test_small_params_average)
{
	size_t len = 4 * MIB, n, *lens = malloc(sizeof(size_t) * 65536);
	uint8_t *buf = random_buf(len, 5);

	ck_assert_ptr_nonnull(lens);
	n = chunk_all(&smallp, buf, len, lens, 65536, false);
	for (size_t i = 0; i + 1 < n; i++) {
		ck_assert_uint_gt(lens[i], 64);
		ck_assert_uint_le(lens[i], 1024);
	}
	ck_assert_uint_ge(len / n, 128);
	ck_assert_uint_le(len / n, 512);
	free(lens);
	free(buf);
}
END_TEST

/* Inserting bytes at the front only disturbs the first chunk(s). */
START_TEST(test_shift_resistance)
{
	size_t len = 16 * MIB, shift = 100, na, nb, same = 0;
	uint8_t *orig = random_buf(len, 6), *mod = malloc(len + shift);
	size_t a[128], b[128];
	size_t ia = 0, ib = 0, ea = 0, eb = 0; /* bytes before chunk a[ia] / b[ib] */

	ck_assert_ptr_nonnull(mod);
	memset(mod, 0x42, shift);
	memcpy(mod + shift, orig, len);
	na = chunk_all(&defp, orig, len, a, 128, false);
	nb = chunk_all(&defp, mod, len + shift, b, 128, false);
	/* Count chunks of mod that equal a chunk of orig (same end, same length). */
	while (ia < na && ib < nb) {
		size_t end_a = ea + a[ia] + shift, end_b = eb + b[ib];

		if (end_a == end_b) {
			if (a[ia] == b[ib])
				same++;
			ea += a[ia++];
			eb += b[ib++];
		} else if (end_a < end_b) {
			ea += a[ia++];
		} else {
			eb += b[ib++];
		}
	}
	ck_assert_uint_ge(na, 8);
	/* All but at most the first two chunks are shared. */
	ck_assert_msg(same + 2 >= na, "only %zu of %zu chunks survived the shift", same, na);
	free(orig);
	free(mod);
}
END_TEST

/* Streaming: 0 until the cut is inside the buffer, then always that same cut. */
START_TEST(test_need_more_data)
{
	size_t len = 8 * MIB;
	uint8_t *buf = random_buf(len, 7);
	size_t cut = ckpt_cdc_cut(&defp, buf, len, false);
	static const size_t small_lens[] = { 1, 63, 64 };

	ck_assert_uint_gt(cut, CKPT_CDC_DEFAULT_MIN);
	ck_assert_uint_le(cut, CKPT_CDC_DEFAULT_MAX);
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, buf, 1, false), 0);
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, buf, CKPT_CDC_DEFAULT_MIN - 1, false), 0);
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, buf, CKPT_CDC_DEFAULT_MIN, false), 0);
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, buf, CKPT_CDC_DEFAULT_MIN + 1, false), 0);
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, buf, cut - 1, false), 0);
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, buf, cut, false), cut);
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, buf, cut + 1, false), cut);
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, buf, CKPT_CDC_DEFAULT_MAX, false), cut);
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, buf, len, true), cut);
	/* eof with the cut inside the data still cuts there. */
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, buf, cut + 1, true), cut);
	/* eof before the cut: the rest is the final chunk. */
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, buf, cut - 1, true), cut - 1);

	/* Growing the buffer in odd steps finds the same cut exactly once it is in. */
	for (size_t l = 1; l < cut + 5000; l += 4099) {
		size_t c = ckpt_cdc_cut(&defp, buf, l, false);

		ck_assert_uint_eq(c, l >= cut ? cut : 0);
	}
	for (size_t i = 0; i < sizeof(small_lens) / sizeof(small_lens[0]); i++)
		ck_assert_uint_eq(ckpt_cdc_cut(&smallp, buf, small_lens[i], false), 0);
	free(buf);
}
END_TEST

START_TEST(test_eof_and_max)
{
	size_t len = 9 * MIB;
	uint8_t *zero = calloc(1, len), *buf = random_buf(len, 8);

	ck_assert_ptr_nonnull(zero);
	/* Empty input. */
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, buf, 0, true), 0);
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, buf, 0, false), 0);
	/* Short final chunks, including below min_size. */
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, buf, 1, true), 1);
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, buf, 1000, true), 1000);
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, buf, CKPT_CDC_DEFAULT_MIN, true),
			  CKPT_CDC_DEFAULT_MIN);

	/* Zeros never match a mask: forced cuts at max_size. */
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, zero, len, false), CKPT_CDC_DEFAULT_MAX);
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, zero, len, true), CKPT_CDC_DEFAULT_MAX);
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, zero, CKPT_CDC_DEFAULT_MAX, false),
			  CKPT_CDC_DEFAULT_MAX);
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, zero, CKPT_CDC_DEFAULT_MAX - 1, false), 0);
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, zero, CKPT_CDC_DEFAULT_MAX - 1, true),
			  CKPT_CDC_DEFAULT_MAX - 1);
	ck_assert_uint_eq(ckpt_cdc_cut(&defp, zero, CKPT_CDC_DEFAULT_MAX + 1, true),
			  CKPT_CDC_DEFAULT_MAX);
	ck_assert_uint_eq(ckpt_cdc_cut(&smallp, zero, 5000, false), 1024);

	/* Invalid parameters or buffer: 0, never a crash. */
	{
		struct ckpt_cdc_params bad = { 64, 100, 1024 };

		ck_assert_uint_eq(ckpt_cdc_cut(&bad, buf, len, true), 0);
		ck_assert_uint_eq(ckpt_cdc_cut(NULL, buf, len, true), 0);
		ck_assert_uint_eq(ckpt_cdc_cut(&defp, NULL, len, true), 0);
	}
	free(zero);
	free(buf);
}
END_TEST

/* Feeding a stream in pieces of various sizes through ckpt_cdc_cut_resume
 * cuts exactly where the reference cuts the whole stream, for both
 * parameter sets, random data and data with long zero runs (no cut until
 * max_size). */
START_TEST(test_resume_matches_oneshot)
{
	static const size_t steps[] = { 1, 7, 63, 64, 65, 4096, 10240, 131072 };
	const struct ckpt_cdc_params *ps[] = { &defp, &smallp };
	size_t len = 8 * MIB;
	uint8_t *buf = random_buf(len, 99);

	memset(buf + 3 * MIB, 0, 3 * MIB); /* forced max_size cuts */
	for (size_t pi = 0; pi < 2; pi++) {
		const struct ckpt_cdc_params *p = ps[pi];
		size_t span = p == &smallp ? 64 * KIB : len;

		for (size_t si = 0; si < sizeof(steps) / sizeof(steps[0]); si++) {
			size_t start = 0, avail = 0, scanned = 0, nchunks = 0;

			while (start < span) {
				size_t cut;
				bool eof;

				avail = CKPT_MIN_T(avail + steps[si], span - start);
				eof = start + avail == span;
				cut = ckpt_cdc_cut_resume(p, buf + start, avail, eof, &scanned);
				if (cut == 0) {
					ck_assert(!eof);
					ck_assert_uint_le(scanned, avail);
					continue;
				}
				ck_assert_uint_eq(cut, ref_cut(p, buf + start, span - start, true));
				ck_assert_uint_eq(scanned, 0);
				start += cut;
				avail -= cut;
				nchunks++;
			}
			ck_assert_uint_gt(nchunks, 1);
		}
	}
	free(buf);
}
END_TEST

/* Data with structure: the gear loop scans blocks as four interleaved lanes
 * (chunker.c); its cuts must be the one-byte loop's (ref_cut) wherever the
 * cuts fall relative to the lanes.  kind 0: random; 1: text-like (four
 * letters); 2: a 65-byte period; 3: zeros with one random byte in 97;
 * 4: bf16-like (random low byte, high byte from three values). */
static uint8_t *structured_buf(size_t len, int kind, uint64_t seed)
{
	uint8_t *buf = random_buf(len, seed);

	for (size_t i = 0; i < len; i++) {
		switch (kind) {
		case 1:
			buf[i] = (uint8_t)('a' + (buf[i] & 3));
			break;
		case 2:
			buf[i] = i >= 65 ? buf[i - 65] : buf[i];
			break;
		case 3:
			buf[i] = i % 97 == 0 ? buf[i] : 0;
			break;
		case 4:
			if (i & 1)
				buf[i] = (uint8_t)(0x3c + buf[i] % 3);
			break;
		default:
			break;
		}
	}
	return buf;
}

START_TEST(test_lanes_match_reference)
{
	static const struct ckpt_cdc_params ps[] = {
		{ CKPT_CDC_DEFAULT_MIN, CKPT_CDC_DEFAULT_AVG, CKPT_CDC_DEFAULT_MAX },
		{ 64, 64 * KIB, 1 * MIB },   /* long scans, a cut in ~1 block in 16 */
		{ 64, 16 * KIB, 256 * KIB }, /* cuts in many blocks */
		{ 2 * KIB, 8 * KIB, 64 * KIB },
		{ 64, 256, 1024 },
	};
	size_t len = 8 * MIB;
	size_t *a = malloc(sizeof(size_t) * 200000), *b = malloc(sizeof(size_t) * 200000);

	ck_assert(a && b);
	for (int kind = 0; kind < 5; kind++) {
		uint8_t *buf = structured_buf(len, kind, 1000 + (uint64_t)kind);

		for (size_t k = 0; k < sizeof(ps) / sizeof(ps[0]); k++) {
			size_t na = chunk_all(&ps[k], buf, len, a, 200000, false);
			size_t nb = chunk_all(&ps[k], buf, len, b, 200000, true);

			ck_assert_uint_eq(na, nb);
			ck_assert(memcmp(a, b, na * sizeof(size_t)) == 0);
		}
		free(buf);
	}
	free(a);
	free(b);
}
END_TEST

/* ckpt_cdc_feed over pieces of assorted sizes (the writer's requests)
 * cuts the stream exactly where the reference cuts it in one buffer. */
START_TEST(test_feed_matches_reference)
{
	static const struct ckpt_cdc_params ps[] = {
		{ CKPT_CDC_DEFAULT_MIN, CKPT_CDC_DEFAULT_AVG, CKPT_CDC_DEFAULT_MAX },
		{ 64, 16 * KIB, 256 * KIB },
		{ 64, 256, 1024 },
		{ 64, 128, 129 },
	};
	size_t len = 6 * MIB;
	size_t *a = malloc(sizeof(size_t) * 200000);

	ck_assert_ptr_nonnull(a);
	for (int kind = 0; kind < 5; kind++) {
		uint8_t *buf = structured_buf(len, kind, 2000 + (uint64_t)kind);

		memset(buf + 2 * MIB, 0, 3 * MIB); /* max_size cuts too */
		for (size_t k = 0; k < sizeof(ps) / sizeof(ps[0]); k++) {
			size_t na = chunk_all(&ps[k], buf, len, a, 200000, true), ia = 0;
			struct ckpt_cdc_state st = { 0, 0 };
			uint64_t rng = 77 + (uint64_t)k;
			size_t off = 0, chunk_start = 0;

			while (off < len) {
				uint64_t r = tl_splitmix64(&rng);
				/* pieces of 1 byte to 300 KiB, 4 KiB and 1 MiB */
				size_t n = r % 4 == 0 ? 4096 : r % 4 == 1 ? MIB : 1 + (size_t)(r >> 8) % (300 * KIB);

				n = CKPT_MIN_T(n, len - off);
				while (n > 0) {
					size_t cut = ckpt_cdc_feed(&ps[k], &st, buf + off, n);

					if (cut == 0) {
						off += n;
						break;
					}
					ck_assert_uint_le(cut, n);
					ck_assert_uint_lt(ia, na);
					ck_assert_uint_eq(off + cut - chunk_start, a[ia]);
					ia++;
					off += cut;
					n -= cut;
					chunk_start = off;
					ck_assert_uint_eq(st.seen, 0);
				}
			}
			/* end of stream: the rest is the last chunk */
			if (st.seen > 0) {
				ck_assert_uint_lt(ia, na);
				ck_assert_uint_eq(st.seen, a[ia]);
				ia++;
			}
			ck_assert_uint_eq(ia, na);
		}
		free(buf);
	}
	free(a);
}
END_TEST

static Suite *chunker_suite(void)
{
	Suite *s = suite_create("chunker");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_unchecked_fixture(tc, ref_init, NULL);
	tcase_add_test(tc, test_params_check);
	tcase_add_test(tc, test_known_answer);
	tcase_add_test(tc, test_known_answer_small);
	tcase_add_test(tc, test_matches_reference);
	tcase_add_test(tc, test_sizes_and_average);
	tcase_add_test(tc, test_small_params_average);
	tcase_add_test(tc, test_shift_resistance);
	tcase_add_test(tc, test_need_more_data);
	tcase_add_test(tc, test_eof_and_max);
	tcase_add_test(tc, test_resume_matches_oneshot);
	tcase_add_test(tc, test_lanes_match_reference);
	tcase_add_test(tc, test_feed_matches_reference);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(chunker_suite());
}
