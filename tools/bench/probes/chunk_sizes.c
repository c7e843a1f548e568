/* SPDX-License-Identifier: MIT */
/*
 * chunk_sizes - the measurement behind ckptfs's chunk sizes.
 *
 * Data: a synthetic checkpoint stream like torch.save/pickle output: tensors
 * of bf16 weights drawn from N(0, 0.02) (64 KiB .. 8 MiB each) separated by
 * small variable-length records, written twice ("step 1", "step 2") where
 * step 2 rewrites half of the tensors and shifts everything by a few bytes.
 *
 * For each FastCDC average size it reports how much of step 2 deduplicates
 * against step 1, the chunk count per GiB (index size), and zstd-1 with
 * byte shuffle ratio and speed for tensor pieces of that size.
 *
 * usage: chunk_sizes [MiB of tensors per step, default 256]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chunk/chunker.h"
#include "chunk/compress.h"
#include "base/hash.h"
#include "benchclock.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void fill_bf16(uint8_t *p, size_t n)
{
	for (size_t i = 0; i + 1 < n; i += 2) {
		double u1 = ((double)(rnd() >> 11) + 1) / 9007199254740993.0;
		double u2 = (double)(rnd() >> 11) / 9007199254740992.0;
		float f = (float)(0.02 * sqrt(-2 * log(u1)) * cos(2 * M_PI * u2));
		uint32_t bits;
		memcpy(&bits, &f, 4);
		p[i] = (uint8_t)(bits >> 16);
		p[i + 1] = (uint8_t)(bits >> 24);
	}
}

struct dig {
	ckpt_digest d;
};

static int dig_cmp(const void *a, const void *b)
{
	return memcmp(a, b, sizeof(ckpt_digest));
}

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 256, total = mib << 20;
	size_t ntens = 0, cap = 1024;
	size_t *tlen = malloc(cap * sizeof(*tlen));
	uint8_t *s1 = malloc(total + (1 << 20)), *s2 = malloc(total + (1 << 20));
	uint8_t secret[CKPT_SECRET_LEN];
	ckpt_hasher *h;
	size_t len1 = 0, len2 = 0, frozen = 0;
	static const size_t avgs[] = { 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20 };

	memset(secret, 7, sizeof(secret));
	ckpt_hasher_new(secret, sizeof(secret), &h);
	/* step 1 / step 2 streams */
	for (size_t used = 0; used < total; ntens++) {
		size_t n = (size_t)(64 << 10) << (rnd() % 8); /* 64 KiB .. 8 MiB */
		size_t rec = 30 + rnd() % 60;
		if (n > total - used)
			n = total - used;
		if (ntens == cap)
			tlen = realloc(tlen, (cap *= 2) * sizeof(*tlen));
		tlen[ntens] = n;
		for (size_t i = 0; i < rec; i++)
			s1[len1 + i] = (uint8_t)rnd();
		len1 += rec;
		/* step 2 record headers differ in length (names, offsets) */
		for (size_t i = 0; i < rec + ntens % 3; i++)
			s2[len2 + i] = (uint8_t)rnd();
		len2 += rec + ntens % 3;
		fill_bf16(s1 + len1, n);
		if (ntens % 2)
			fill_bf16(s2 + len2, n); /* trained: changed */
		else
			memcpy(s2 + len2, s1 + len1, n), frozen += n; /* frozen: unchanged */
		len1 += n;
		len2 += n;
		used += n;
	}
	printf("data: %zu tensors, step 1 %.1f MiB, step 2 %.1f MiB (half the tensors unchanged)\n\n",
	       ntens, len1 / 1048576.0, len2 / 1048576.0);
	printf("%-10s %-12s %-14s %-12s %-14s %-12s\n", "avg", "chunks/GiB", "step2 dedup %",
	       "ideal %", "zstd1 ratio", "MB/s");
	for (size_t a = 0; a < sizeof(avgs) / sizeof(avgs[0]); a++) {
		struct ckpt_cdc_params p = { avgs[a] / 4, avgs[a], avgs[a] * 4 };
		struct dig *d1 = malloc(sizeof(*d1) * (len1 / p.min_size + 2));
		size_t n1 = 0, off = 0, dup = 0, n2 = 0, raw = 0, stored = 0;
		ckpt_compressor *c;
		double t0, ct = 0;

		while (off < len1) {
			size_t cut = ckpt_cdc_cut(&p, s1 + off, len1 - off, true);
			ckpt_hash_chunk(h, s1 + off, cut, &d1[n1++].d);
			off += cut;
		}
		qsort(d1, n1, sizeof(*d1), dig_cmp);
		for (off = 0; off < len2;) {
			size_t cut = ckpt_cdc_cut(&p, s2 + off, len2 - off, true);
			struct dig k;
			ckpt_hash_chunk(h, s2 + off, cut, &k.d);
			if (bsearch(&k, d1, n1, sizeof(*d1), dig_cmp))
				dup += cut;
			off += cut;
			n2++;
		}
		/* compression of tensor pieces of this size (shuffled, level 1) */
		ckpt_compressor_new(1, &c);
		for (off = 0; off + avgs[a] <= len1 && raw < (64u << 20); off += avgs[a]) {
			uint8_t codec;
			const void *out;
			size_t olen;
			t0 = now();
			ckpt_compress(c, s1 + off, avgs[a], 2, &codec, &out, &olen);
			ct += now() - t0;
			raw += avgs[a];
			stored += olen;
		}
		ckpt_compressor_free(c);
		printf("%-10zu %-12.0f %-14.1f %-12.1f %-14.3f %-12.0f\n", avgs[a],
		       n2 * 1073741824.0 / len2, 100.0 * dup / len2, 100.0 * frozen / len2,
		       (double)raw / stored, raw / ct / 1e6);
		free(d1);
	}
	ckpt_hasher_free(h);
	free(s1);
	free(s2);
	free(tlen);
	return 0;
}
