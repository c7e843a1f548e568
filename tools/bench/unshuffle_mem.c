/* SPDX-License-Identifier: MIT */
/*
 * unshuffle_mem.c - is the 4-byte unshuffle of a decoded chunk limited by
 * its instructions or by memory?
 *
 * usage: unshuffle_mem [PASSES]
 *
 * Unshuffles one 512 KiB shuffled chunk (4 planes of 128 KiB, random bytes)
 * into (a) one 512 KiB destination, over and over (it stays in the CPU
 * cache), and (b) 256 different 512 KiB destinations in turn (128 MiB,
 * touched once before timing so that no page faults are counted; each is
 * out of the cache when its turn comes, as a recycled chunk buffer is in
 * the daemon), each with the SSE2 loop the store uses
 * (ckpt_unshuffle_planes) and with a 256-bit AVX2 loop, and for (b) also a
 * plain memcpy of the same bytes.  Prints GB/s of unshuffled bytes per
 * pass.  If (b) runs at the memcpy's speed for both loops, wider vectors
 * cannot help.  docs/performance.md 6g.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chunk/compress.h"
#include "benchclock.h"

#define N (128u << 10)   /* elements: one 512 KiB chunk of 4-byte values */
#define NDST 256u        /* destinations for the out-of-cache case */
#define HOT_ROUNDS 2000u

static void sse2(const uint8_t *const *pl, uint8_t *dst)
{
	ckpt_unshuffle_planes(pl, 4, N, dst);
}

__attribute__((target("avx2"))) static void avx2(const uint8_t *const *pl, uint8_t *dst)
{
	for (size_t i = 0; i + 32 <= N; i += 32) {
		__m256i p0 = _mm256_loadu_si256((const __m256i *)(pl[0] + i));
		__m256i p1 = _mm256_loadu_si256((const __m256i *)(pl[1] + i));
		__m256i p2 = _mm256_loadu_si256((const __m256i *)(pl[2] + i));
		__m256i p3 = _mm256_loadu_si256((const __m256i *)(pl[3] + i));
		__m256i lo01 = _mm256_unpacklo_epi8(p0, p1), hi01 = _mm256_unpackhi_epi8(p0, p1);
		__m256i lo23 = _mm256_unpacklo_epi8(p2, p3), hi23 = _mm256_unpackhi_epi8(p2, p3);
		/* per 128-bit lane: a holds elements 0-3 | 16-19, b 4-7 | 20-23, ... */
		__m256i a = _mm256_unpacklo_epi16(lo01, lo23), b = _mm256_unpackhi_epi16(lo01, lo23);
		__m256i c = _mm256_unpacklo_epi16(hi01, hi23), d = _mm256_unpackhi_epi16(hi01, hi23);
		uint8_t *o = dst + 4 * i;

		_mm256_storeu_si256((__m256i *)o, _mm256_permute2x128_si256(a, b, 0x20));
		_mm256_storeu_si256((__m256i *)(o + 32), _mm256_permute2x128_si256(c, d, 0x20));
		_mm256_storeu_si256((__m256i *)(o + 64), _mm256_permute2x128_si256(a, b, 0x31));
		_mm256_storeu_si256((__m256i *)(o + 96), _mm256_permute2x128_si256(c, d, 0x31));
	}
}

int main(int argc, char **argv)
{
	int passes = argc > 1 ? atoi(argv[1]) : 3;
	uint8_t *src = aligned_alloc(64, 4 * N), *one = aligned_alloc(64, 4 * N);
	uint8_t *chk = aligned_alloc(64, 4 * N);
	uint8_t *dsts = aligned_alloc(64, (size_t)NDST * 4 * N);
	const uint8_t *pl[4];
	double t, hs, ha, cs, ca, cm;

	if (!src || !one || !chk || !dsts || !__builtin_cpu_supports("avx2")) {
		fprintf(stderr, "unshuffle_mem: out of memory or no AVX2\n");
		return 1;
	}
	srand(1);
	for (size_t i = 0; i < 4 * N; i++)
		src[i] = (uint8_t)rand();
	for (int p = 0; p < 4; p++)
		pl[p] = src + (size_t)p * N;
	memset(dsts, 1, (size_t)NDST * 4 * N);
	sse2(pl, one);
	avx2(pl, chk);
	if (memcmp(one, chk, 4 * N) != 0) {
		fprintf(stderr, "unshuffle_mem: the AVX2 loop disagrees with ckpt_unshuffle_planes\n");
		return 1;
	}
	printf("GB/s of unshuffled bytes; 512 KiB chunk, 4-byte elements\n");
	printf("%-6s %12s %12s %12s %12s %12s\n", "pass", "cached:sse2", "cached:avx2",
	       "cold:sse2", "cold:avx2", "cold:memcpy");
	for (int r = 0; r < passes; r++) {
		t = now();
		for (unsigned k = 0; k < HOT_ROUNDS; k++)
			sse2(pl, one);
		hs = HOT_ROUNDS * 4.0 * N / (now() - t) / 1e9;
		t = now();
		for (unsigned k = 0; k < HOT_ROUNDS; k++)
			avx2(pl, one);
		ha = HOT_ROUNDS * 4.0 * N / (now() - t) / 1e9;
		t = now();
		for (unsigned k = 0; k < NDST; k++)
			sse2(pl, dsts + (size_t)k * 4 * N);
		cs = NDST * 4.0 * N / (now() - t) / 1e9;
		t = now();
		for (unsigned k = 0; k < NDST; k++)
			avx2(pl, dsts + (size_t)k * 4 * N);
		ca = NDST * 4.0 * N / (now() - t) / 1e9;
		t = now();
		for (unsigned k = 0; k < NDST; k++)
			memcpy(dsts + (size_t)k * 4 * N, src, 4 * N);
		cm = NDST * 4.0 * N / (now() - t) / 1e9;
		printf("%-6d %12.1f %12.1f %12.1f %12.1f %12.1f\n", r + 1, hs, ha, cs, ca, cm);
	}
	free(src);
	free(one);
	free(chk);
	free(dsts);
	return 0;
}
