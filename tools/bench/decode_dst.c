/* SPDX-License-Identifier: MIT */
/*
 * decode_dst.c - how much does the destination of a chunk decode cost?
 *
 * usage: decode_dst FILE ELEM
 *
 * Takes 400 chunks of 512 KiB from the first 16 MiB of FILE after its first
 * MiB (wrapping), byte-shuffles each with element size ELEM (2 or 4) and
 * compresses it as one zstd frame at level 1, as the store stores tensor
 * chunks (CKPT_CODEC_ZSTD_SHUF2/4).  Then, three passes of each, with
 * 64 MiB written between steps so that the frames start out of the CPU
 * cache:
 *  - hot:   each chunk decoded (ckpt_decompress, as the store reads) into
 *           one buffer used for every chunk, then copied out to a 1 MiB
 *           buffer (standing in for the reply to the reader);
 *  - cold:  each chunk decoded into its own buffer of one pre-faulted
 *           region (as chunks decoded ahead into the chunk cache), then,
 *           after all were decoded, each copied out (the reply comes later);
 *  - fresh: each chunk decoded into a new anonymous mapping, copied out,
 *           unmapped (a chunk buffer the pool could not supply).
 * Prints GB/s of decoded bytes for decode plus copy-out; for cold also the
 * two steps apart.  docs/performance.md 6i.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <zstd.h>

#include "chunk/compress.h"
#include "benchclock.h"

#define CHUNK (512u << 10)
#define NCHUNKS 400u
#define SPAN 32u /* distinct source slices (16 MiB) */
#define FLUSH (64u << 20)

int main(int argc, char **argv)
{
	unsigned e = argc == 3 ? (unsigned)atoi(argv[2]) : 0;
	size_t cap = ZSTD_compressBound(CHUNK), zlen[NCHUNKS];
	uint8_t *raw = NULL, *shuf = NULL, *frames = NULL, *hot = NULL, *out = NULL;
	uint8_t *flush = NULL, *region = MAP_FAILED, codec;
	ckpt_decompressor *dc = NULL;
	double gb = (double)NCHUNKS * CHUNK / 1e9;
	int ret = 1;
	FILE *f = NULL;

	if (argc != 3 || (e != 2 && e != 4)) {
		fprintf(stderr, "usage: decode_dst FILE ELEM(2|4)\n");
		return 2;
	}
	codec = e == 2 ? CKPT_CODEC_ZSTD_SHUF2 : CKPT_CODEC_ZSTD_SHUF4;
	f = fopen(argv[1], "rb");
	raw = malloc(CHUNK);
	shuf = malloc(CHUNK);
	frames = malloc(cap * NCHUNKS);
	hot = malloc(CHUNK);
	out = malloc(1u << 20);
	flush = malloc(FLUSH);
	region = mmap(NULL, (size_t)NCHUNKS * CHUNK, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (!f || !raw || !shuf || !frames || !hot || !out || !flush || region == MAP_FAILED ||
	    ckpt_decompressor_new(&dc) < 0) {
		perror(argv[1]);
		goto out;
	}
	ckpt_decompressor_skip_checksum(dc); /* as the store decodes */
	for (unsigned c = 0; c < NCHUNKS; c++) {
		if (fseek(f, (1L << 20) + (long)(c % SPAN) * CHUNK, SEEK_SET) != 0 ||
		    fread(raw, 1, CHUNK, f) != CHUNK) {
			fprintf(stderr, "%s: shorter than %u bytes\n", argv[1],
				(1u << 20) + SPAN * CHUNK);
			goto out;
		}
		ckpt_shuffle(raw, shuf, CHUNK, e);
		zlen[c] = ZSTD_compress(frames + c * cap, cap, shuf, CHUNK, 1);
		if (ZSTD_isError(zlen[c])) {
			fprintf(stderr, "zstd failed\n");
			goto out;
		}
	}
	for (int pass = 0; pass < 3; pass++) {
		double t0, t1, t2, t3, t4;

		memset(flush, pass, FLUSH);
		t0 = now();
		for (unsigned c = 0; c < NCHUNKS; c++) {
			if (ckpt_decompress(dc, codec, frames + c * cap, zlen[c], hot, CHUNK) < 0)
				goto out;
			memcpy(out + (c & 1) * CHUNK, hot, CHUNK);
		}
		t1 = now();
		memset(flush, pass + 1, FLUSH);
		t2 = now();
		for (unsigned c = 0; c < NCHUNKS; c++)
			if (ckpt_decompress(dc, codec, frames + c * cap, zlen[c],
					    region + (size_t)c * CHUNK, CHUNK) < 0)
				goto out;
		t3 = now();
		for (unsigned c = 0; c < NCHUNKS; c++)
			memcpy(out + (c & 1) * CHUNK, region + (size_t)c * CHUNK, CHUNK);
		t4 = now();
		memset(flush, pass + 2, FLUSH);
		{
			double t5 = now(), t6;

			for (unsigned c = 0; c < NCHUNKS; c++) {
				uint8_t *d = mmap(NULL, CHUNK, PROT_READ | PROT_WRITE,
						  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

				if (d == MAP_FAILED ||
				    ckpt_decompress(dc, codec, frames + c * cap, zlen[c], d, CHUNK) < 0)
					goto out;
				memcpy(out + (c & 1) * CHUNK, d, CHUNK);
				munmap(d, CHUNK);
			}
			t6 = now();
			printf("pass %d: hot %.2f GB/s | cold %.2f GB/s (decode %.2f, copy-out %.2f) "
			       "| fresh %.2f GB/s\n",
			       pass, gb / (t1 - t0), gb / (t4 - t2), gb / (t3 - t2), gb / (t4 - t3),
			       gb / (t6 - t5));
		}
	}
	ret = 0;
out:
	if (f)
		fclose(f);
	if (region != MAP_FAILED)
		munmap(region, (size_t)NCHUNKS * CHUNK);
	ckpt_decompressor_free(dc);
	free(raw);
	free(shuf);
	free(frames);
	free(hot);
	free(out);
	free(flush);
	return ret;
}
