/* SPDX-License-Identifier: MIT */
/*
 * decode_planes.c - would storing the byte planes of a shuffled chunk
 * separately (incompressible planes raw, the others as zstd frames) decode
 * faster than one zstd frame of the whole shuffled chunk?
 *
 * usage: decode_planes FILE ELEM LEVEL
 *
 * Takes 400 chunks of 512 KiB from FILE (from offset 1 MiB on, wrapping),
 * byte-shuffles each with element size ELEM (2 or 4, ckpt_shuffle) and
 * stores it two ways: (a) as the store does, one zstd frame (LEVEL) of the
 * shuffled chunk; (b) plane by plane, a plane that zstd does not shrink by
 * at least 1/64 stored raw.  Then decodes all 400 chunks each way, four
 * times, with the chunks' stored bytes not in the CPU cache (204 MiB of
 * stored data, and 64 MiB written between passes): (a) ckpt_decompress, as
 * the store reads such chunks; (b) zstd for the compressed planes into a
 * scratch buffer, then the unshuffle from the raw planes where they lie
 * (ckpt_unshuffle_planes, the same SSE2 steps as ckpt_unshuffle).
 * Prints GB/s of decoded bytes per pass.  docs/performance.md 6e.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zstd.h>

#include "../../core/compress.h"
#include "benchclock.h"

#define CHUNK (512u << 10)
#define NCHUNKS 400u

struct planes {
	const uint8_t *at[4]; /* where plane b's bytes are once decoded */
	uint8_t *stored[4];   /* plane b as stored */
	size_t len[4];        /* its stored length; == n: raw */
};

int main(int argc, char **argv)
{
	unsigned e = argc == 4 ? (unsigned)atoi(argv[2]) : 0;
	int level = argc == 4 ? atoi(argv[3]) : 0;
	size_t n = CHUNK / (e ? e : 1), cap = ZSTD_compressBound(CHUNK), zlen[NCHUNKS];
	uint8_t *raw, *shuf, *frames, *scratch, *dst, *flush;
	struct planes *pl;
	ckpt_compressor *cc = NULL;
	ckpt_decompressor *dc = NULL;
	ZSTD_DCtx *dctx;
	FILE *f;

	if (argc != 4 || (e != 2 && e != 4) || level < 1 || level > 19) {
		fprintf(stderr, "usage: decode_planes FILE ELEM(2|4) LEVEL(1-19)\n");
		return 2;
	}
	f = fopen(argv[1], "rb");
	raw = malloc(CHUNK);
	shuf = malloc(CHUNK);
	frames = malloc(cap * NCHUNKS);
	pl = calloc(NCHUNKS, sizeof(*pl));
	scratch = malloc(CHUNK);
	dst = malloc(CHUNK);
	flush = malloc(64u << 20);
	dctx = ZSTD_createDCtx();
	if (!f || !raw || !shuf || !frames || !pl || !scratch || !dst || !flush || !dctx ||
	    ckpt_compressor_new(level, &cc) < 0 || ckpt_decompressor_new(&dc) < 0) {
		perror(argv[1]);
		return 1;
	}
	ckpt_decompressor_skip_checksum(dc); /* as the store decodes */
	for (unsigned c = 0; c < NCHUNKS; c++) {
		if (fseek(f, (long)(1u << 20) + (long)c * CHUNK, SEEK_SET) != 0 ||
		    fread(raw, 1, CHUNK, f) != CHUNK) {
			if (fseek(f, 1L << 20, SEEK_SET) != 0 || fread(raw, 1, CHUNK, f) != CHUNK) {
				fprintf(stderr, "%s: shorter than %u bytes\n", argv[1], 2 * CHUNK);
				return 1;
			}
		}
		ckpt_shuffle(raw, shuf, CHUNK, e);
		zlen[c] = ZSTD_compress(frames + c * cap, cap, shuf, CHUNK, level);
		for (unsigned b = 0; b < e; b++) {
			size_t bound = ZSTD_compressBound(n), z;

			pl[c].stored[b] = malloc(bound);
			z = ZSTD_compress(pl[c].stored[b], bound, shuf + b * n, n, level);
			if (ZSTD_isError(z) || z >= n - n / 64) {
				memcpy(pl[c].stored[b], shuf + b * n, n);
				z = n;
			}
			pl[c].len[b] = z;
		}
		if (ZSTD_isError(zlen[c])) {
			fprintf(stderr, "zstd failed\n");
			return 1;
		}
	}
	for (int pass = 0; pass < 4; pass++) {
		double t0, t1, t2;
		uint8_t *z = scratch;

		memset(flush, pass, 64u << 20);
		t0 = now();
		for (unsigned c = 0; c < NCHUNKS; c++)
			if (ckpt_decompress(dc, e == 2 ? CKPT_CODEC_ZSTD_SHUF2 : CKPT_CODEC_ZSTD_SHUF4,
					    frames + c * cap, zlen[c], dst, CHUNK) < 0)
				return 1;
		t1 = now();
		memset(flush, pass + 1, 64u << 20); /* (not timed) */
		t2 = now();
		for (unsigned c = 0; c < NCHUNKS; c++) {
			z = scratch;
			for (unsigned b = 0; b < e; b++) {
				if (pl[c].len[b] == n) {
					pl[c].at[b] = pl[c].stored[b];
				} else {
					if (ZSTD_decompressDCtx(dctx, z, n, pl[c].stored[b], pl[c].len[b]) != n)
						return 1;
					pl[c].at[b] = z;
					z += n;
				}
			}
			ckpt_unshuffle_planes(pl[c].at, e, n, dst);
		}
		printf("pass %d: one frame + unshuffle %.2f GB/s, planes %.2f GB/s\n", pass,
		       (double)NCHUNKS * CHUNK / (t1 - t0) / 1e9,
		       (double)NCHUNKS * CHUNK / (now() - t2) / 1e9);
	}
	return 0;
}
