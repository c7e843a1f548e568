/* SPDX-License-Identifier: MIT */
/*
 * decode_planes.c - would storing the byte planes of a shuffled chunk
 * separately (incompressible planes raw, the others as zstd frames) decode
 * faster than one zstd frame of the whole shuffled chunk?
 *
 * usage: decode_planes FILE ELEM LEVEL [CHUNK_KIB]
 *
 * Takes 400 chunks of CHUNK_KIB (default 512) KiB from FILE (from offset
 * 1 MiB on, wrapping), byte-shuffles each with element size ELEM (2 or 4,
 * ckpt_shuffle) and stores it four ways: (a) as the store did before
 * 2026-11-30, one zstd frame (LEVEL, default parameters) of the shuffled
 * chunk; (b) plane by plane, a plane that zstd does not shrink by at least
 * 1/64 stored raw; (c) as the store does now, ckpt_compress() with the
 * element size as hint (one frame whose zstd blocks end at the planes'
 * ends; planes of float tensors as literals only); (d) as the store did
 * between 7a6ab31 and 2d39ea7, one frame whose blocks end at the planes'
 * ends, with LZ matches (ZSTD_c_minMatch 7).  Prints each way's ratio,
 * then decodes all 400 chunks each way, four times, with the chunks'
 * stored bytes not in the CPU cache (64 MiB written between passes): (a),
 * (c) and (d) with ckpt_decompress, as the store reads such chunks; (b)
 * zstd for the compressed planes into a scratch buffer, then the unshuffle
 * from the raw planes where they lie (ckpt_unshuffle_planes).  Prints GB/s
 * of decoded bytes per pass.  Its figures are cited in docs/performance.md.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zstd.h>

#include "chunk/compress.h"
#include "benchclock.h"

#define NCHUNKS 400u

struct planes {
	const uint8_t *at[4]; /* where plane b's bytes are once decoded */
	uint8_t *stored[4];   /* plane b as stored */
	size_t len[4];        /* its stored length; == n: raw */
};

int main(int argc, char **argv)
{
	unsigned e = argc >= 4 ? (unsigned)atoi(argv[2]) : 0;
	int level = argc >= 4 ? atoi(argv[3]) : 0;
	const size_t CHUNK = (argc >= 5 ? (size_t)atoi(argv[4]) : 512) << 10;
	size_t n = CHUNK / (e ? e : 1), cap = ZSTD_compressBound(CHUNK), zlen[NCHUNKS];
	size_t clen[NCHUNKS], mlen[NCHUNKS], tot_a = 0, tot_b = 0, tot_c = 0, tot_d = 0;
	uint8_t ccodec[NCHUNKS], *cstored, *mstored;
	uint8_t *raw, *shuf, *frames, *scratch, *dst, *flush;
	struct planes *pl;
	ckpt_compressor *cc = NULL;
	ckpt_decompressor *dc = NULL;
	ZSTD_DCtx *dctx;
	ZSTD_CCtx *mctx;
	FILE *f;

	if (argc < 4 || argc > 5 || (e != 2 && e != 4) || level < 1 || level > 19 ||
	    CHUNK < 4096 || CHUNK > (64u << 20)) {
		fprintf(stderr, "usage: decode_planes FILE ELEM(2|4) LEVEL(1-19) [CHUNK_KIB]\n");
		return 2;
	}
	f = fopen(argv[1], "rb");
	raw = malloc(CHUNK);
	shuf = malloc(CHUNK);
	frames = malloc(cap * NCHUNKS);
	cstored = malloc(cap * NCHUNKS);
	mstored = malloc(cap * NCHUNKS);
	pl = calloc(NCHUNKS, sizeof(*pl));
	scratch = malloc(CHUNK);
	dst = malloc(CHUNK);
	flush = malloc(64u << 20);
	dctx = ZSTD_createDCtx();
	mctx = ZSTD_createCCtx();
	if (!f || !raw || !shuf || !frames || !cstored || !mstored || !pl || !scratch || !dst ||
	    !flush || !dctx || !mctx ||
	    ZSTD_isError(ZSTD_CCtx_setParameter(mctx, ZSTD_c_compressionLevel, level)) ||
	    ZSTD_isError(ZSTD_CCtx_setParameter(mctx, ZSTD_c_checksumFlag, 1)) ||
	    ZSTD_isError(ZSTD_CCtx_setParameter(mctx, ZSTD_c_minMatch, 7)) ||
	    ckpt_compressor_new(level, &cc) < 0 || ckpt_decompressor_new(&dc) < 0) {
		perror(argv[1]);
		return 1;
	}
	ckpt_decompressor_skip_checksum(dc); /* as the store decodes */
	for (unsigned c = 0; c < NCHUNKS; c++) {
		if (fseek(f, (long)(1u << 20) + (long)c * CHUNK, SEEK_SET) != 0 ||
		    fread(raw, 1, CHUNK, f) != CHUNK) {
			if (fseek(f, 1L << 20, SEEK_SET) != 0 || fread(raw, 1, CHUNK, f) != CHUNK) {
				fprintf(stderr, "%s: shorter than %zu bytes\n", argv[1], 2 * CHUNK);
				return 1;
			}
		}
		{
			const void *out;

			if (ckpt_compress(cc, raw, CHUNK, e, &ccodec[c], &out, &clen[c]) < 0) {
				fprintf(stderr, "ckpt_compress failed\n");
				return 1;
			}
			memcpy(cstored + c * cap, out, clen[c]);
			tot_c += clen[c];
		}
		ckpt_shuffle(raw, shuf, CHUNK, e);
		zlen[c] = ZSTD_compress(frames + c * cap, cap, shuf, CHUNK, level);
		{
			/* (d): a block per plane, with matches */
			ZSTD_outBuffer ob = { mstored + c * cap, cap, 0 };
			size_t r = ZSTD_CCtx_reset(mctx, ZSTD_reset_session_only);

			if (!ZSTD_isError(r))
				r = ZSTD_CCtx_setPledgedSrcSize(mctx, CHUNK);
			for (unsigned b = 0; b < e && !ZSTD_isError(r); b++) {
				ZSTD_inBuffer ib = { shuf + b * n, b + 1 < e ? n : CHUNK - b * n, 0 };

				do {
					r = ZSTD_compressStream2(mctx, &ob, &ib,
								 b + 1 < e ? ZSTD_e_flush : ZSTD_e_end);
				} while (!ZSTD_isError(r) && r);
			}
			if (ZSTD_isError(r)) {
				fprintf(stderr, "zstd failed (d)\n");
				return 1;
			}
			mlen[c] = ob.pos;
			tot_d += ob.pos;
		}
		for (unsigned b = 0; b < e; b++) {
			size_t bound = ZSTD_compressBound(n), z;

			pl[c].stored[b] = malloc(bound);
			z = ZSTD_compress(pl[c].stored[b], bound, shuf + b * n, n, level);
			if (ZSTD_isError(z) || z >= n - n / 64) {
				memcpy(pl[c].stored[b], shuf + b * n, n);
				z = n;
			}
			pl[c].len[b] = z;
			tot_b += z;
		}
		if (ZSTD_isError(zlen[c])) {
			fprintf(stderr, "zstd failed\n");
			return 1;
		}
		tot_a += zlen[c];
	}
	printf("%zu KiB chunks, ratio: (a) one frame %.4f, (b) planes apart %.4f, "
	       "(c) ckpt_compress %.4f, (d) planes with matches %.4f\n", CHUNK >> 10,
	       (double)NCHUNKS * CHUNK / tot_a, (double)NCHUNKS * CHUNK / tot_b,
	       (double)NCHUNKS * CHUNK / tot_c, (double)NCHUNKS * CHUNK / tot_d);
	for (int pass = 0; pass < 4; pass++) {
		double t0, t1, t2, t3, t4, t5, t6;
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
		t3 = now();
		memset(flush, pass + 2, 64u << 20); /* (not timed) */
		t4 = now();
		for (unsigned c = 0; c < NCHUNKS; c++)
			if (ckpt_decompress(dc, ccodec[c], cstored + c * cap, clen[c], dst, CHUNK) < 0)
				return 1;
		t5 = now();
		memset(flush, pass + 3, 64u << 20); /* (not timed) */
		t6 = now();
		for (unsigned c = 0; c < NCHUNKS; c++)
			if (ckpt_decompress(dc, e == 2 ? CKPT_CODEC_ZSTD_SHUF2 : CKPT_CODEC_ZSTD_SHUF4,
					    mstored + c * cap, mlen[c], dst, CHUNK) < 0)
				return 1;
		printf("pass %d: (a) one frame %.2f GB/s, (b) planes apart %.2f GB/s, "
		       "(c) ckpt_compress's frames %.2f GB/s, (d) planes with matches %.2f GB/s\n",
		       pass, (double)NCHUNKS * CHUNK / (t1 - t0) / 1e9,
		       (double)NCHUNKS * CHUNK / (t3 - t2) / 1e9,
		       (double)NCHUNKS * CHUNK / (t5 - t4) / 1e9,
		       (double)NCHUNKS * CHUNK / (now() - t6) / 1e9);
	}
	return 0;
}
