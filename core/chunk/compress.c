// SPDX-License-Identifier: MIT
/*
 * compress.c - per-chunk zstd with an optional byte shuffle.
 */
#include "chunk/compress.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_d_forceIgnoreChecksum, ZSTD_compressSequences */
#include <zstd.h>
#include <zstd_errors.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "base/util.h"

struct ckpt_compressor {
	int level;
	ZSTD_CCtx *cctx;  /* plain chunks */
	ZSTD_CCtx *pctx;  /* byte planes of shuffled chunks (zstd_planes_into) */
#ifdef CKPT_ZSTD_SEQUENCES
	ZSTD_CCtx *lctx;  /* literals-only frames of byte planes (zstd_literals_into) */
	ZSTD_Sequence *seqs; /* their block list */
	size_t seqs_cap;
#endif
	uint8_t *out;   /* compressed output of the chosen codec */
	size_t out_cap;
	uint8_t *alt;   /* second output (sample or small-chunk alternative) */
	size_t alt_cap;
	uint8_t *lit;   /* third output (small chunks' literals-only planes) */
	size_t lit_cap;
	uint8_t *shuf;  /* shuffled copy of the input */
	size_t shuf_cap;
	uint8_t *sample; /* gathered sample + its shuffled copy */
	size_t sample_cap;
};

struct ckpt_decompressor {
	ZSTD_DCtx *dctx;
	uint8_t *scratch; /* decoded shuffled bytes before unshuffle */
	size_t scratch_cap;
};

/* ---- byte shuffle ---- */

static void shuffle_generic(const uint8_t *src, uint8_t *dst, size_t n, unsigned e)
{
	for (unsigned b = 0; b < e; b++) {
		uint8_t *plane = dst + (size_t)b * n;

		for (size_t i = 0; i < n; i++)
			plane[i] = src[i * e + b];
	}
}

static void unshuffle_generic(const uint8_t *const *planes, uint8_t *dst, size_t n, unsigned e)
{
	for (unsigned b = 0; b < e; b++) {
		const uint8_t *plane = planes[b];

		for (size_t i = 0; i < n; i++)
			dst[i * e + b] = plane[i];
	}
}

/*
 * The element-size-2/4 kernels process 16 elements per step with SSE2
 * (baseline on x86-64; GCC 12 does not vectorize the strided scalar loop
 * at -O2) and finish with the scalar loop.
 */
static void shuffle2(const uint8_t *src, uint8_t *dst, size_t n)
{
	uint8_t *d0 = dst, *d1 = dst + n;
	size_t i = 0;

#ifdef __SSE2__
	const __m128i lo = _mm_set1_epi16(0x00ff);

	for (; i + 16 <= n; i += 16) {
		__m128i a = _mm_loadu_si128((const __m128i *)(src + 2 * i));
		__m128i b = _mm_loadu_si128((const __m128i *)(src + 2 * i + 16));

		_mm_storeu_si128((__m128i *)(d0 + i),
				 _mm_packus_epi16(_mm_and_si128(a, lo), _mm_and_si128(b, lo)));
		_mm_storeu_si128((__m128i *)(d1 + i),
				 _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8)));
	}
#endif
	for (; i < n; i++) {
		d0[i] = src[2 * i];
		d1[i] = src[2 * i + 1];
	}
}

static void unshuffle2(const uint8_t *s0, const uint8_t *s1, uint8_t *dst, size_t n)
{
	size_t i = 0;

#ifdef __SSE2__
	for (; i + 16 <= n; i += 16) {
		__m128i p0 = _mm_loadu_si128((const __m128i *)(s0 + i));
		__m128i p1 = _mm_loadu_si128((const __m128i *)(s1 + i));

		_mm_storeu_si128((__m128i *)(dst + 2 * i), _mm_unpacklo_epi8(p0, p1));
		_mm_storeu_si128((__m128i *)(dst + 2 * i + 16), _mm_unpackhi_epi8(p0, p1));
	}
#endif
	for (; i < n; i++) {
		dst[2 * i] = s0[i];
		dst[2 * i + 1] = s1[i];
	}
}

#ifdef __SSE2__
/* Byte `shift / 8` of each 32-bit lane of a..d, packed into 16 bytes in order. */
static inline __m128i plane4(__m128i a, __m128i b, __m128i c, __m128i d, int shift)
{
	const __m128i lo = _mm_set1_epi32(0xff);
	__m128i ab, cd;

	/* Values are 0..255 so the signed 32->16 saturating pack is exact. */
	ab = _mm_packs_epi32(_mm_and_si128(_mm_srl_epi32(a, _mm_cvtsi32_si128(shift)), lo),
			     _mm_and_si128(_mm_srl_epi32(b, _mm_cvtsi32_si128(shift)), lo));
	cd = _mm_packs_epi32(_mm_and_si128(_mm_srl_epi32(c, _mm_cvtsi32_si128(shift)), lo),
			     _mm_and_si128(_mm_srl_epi32(d, _mm_cvtsi32_si128(shift)), lo));
	return _mm_packus_epi16(ab, cd);
}
#endif

static void shuffle4(const uint8_t *src, uint8_t *dst, size_t n)
{
	uint8_t *d0 = dst, *d1 = dst + n, *d2 = dst + 2 * n, *d3 = dst + 3 * n;
	size_t i = 0;

#ifdef __SSE2__
	for (; i + 16 <= n; i += 16) {
		const uint8_t *s = src + 4 * i;
		__m128i a = _mm_loadu_si128((const __m128i *)s);
		__m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
		__m128i d = _mm_loadu_si128((const __m128i *)(s + 48));

		_mm_storeu_si128((__m128i *)(d0 + i), plane4(a, b, c, d, 0));
		_mm_storeu_si128((__m128i *)(d1 + i), plane4(a, b, c, d, 8));
		_mm_storeu_si128((__m128i *)(d2 + i), plane4(a, b, c, d, 16));
		_mm_storeu_si128((__m128i *)(d3 + i), plane4(a, b, c, d, 24));
	}
#endif
	for (; i < n; i++) {
		d0[i] = src[4 * i];
		d1[i] = src[4 * i + 1];
		d2[i] = src[4 * i + 2];
		d3[i] = src[4 * i + 3];
	}
}

static void unshuffle4(const uint8_t *s0, const uint8_t *s1, const uint8_t *s2,
		       const uint8_t *s3, uint8_t *dst, size_t n)
{
	size_t i = 0;

#ifdef __SSE2__
	for (; i + 16 <= n; i += 16) {
		__m128i p0 = _mm_loadu_si128((const __m128i *)(s0 + i));
		__m128i p1 = _mm_loadu_si128((const __m128i *)(s1 + i));
		__m128i p2 = _mm_loadu_si128((const __m128i *)(s2 + i));
		__m128i p3 = _mm_loadu_si128((const __m128i *)(s3 + i));
		__m128i lo01 = _mm_unpacklo_epi8(p0, p1), hi01 = _mm_unpackhi_epi8(p0, p1);
		__m128i lo23 = _mm_unpacklo_epi8(p2, p3), hi23 = _mm_unpackhi_epi8(p2, p3);
		uint8_t *d = dst + 4 * i;

		_mm_storeu_si128((__m128i *)d, _mm_unpacklo_epi16(lo01, lo23));
		_mm_storeu_si128((__m128i *)(d + 16), _mm_unpackhi_epi16(lo01, lo23));
		_mm_storeu_si128((__m128i *)(d + 32), _mm_unpacklo_epi16(hi01, hi23));
		_mm_storeu_si128((__m128i *)(d + 48), _mm_unpackhi_epi16(hi01, hi23));
	}
#endif
	for (; i < n; i++) {
		dst[4 * i] = s0[i];
		dst[4 * i + 1] = s1[i];
		dst[4 * i + 2] = s2[i];
		dst[4 * i + 3] = s3[i];
	}
}

void ckpt_shuffle(const uint8_t *src, uint8_t *dst, size_t len, unsigned elem_size)
{
	size_t n, body;

	if (elem_size <= 1 || len < elem_size) {
		if (len)
			memcpy(dst, src, len);
		return;
	}
	n = len / elem_size;
	body = n * elem_size;
	if (elem_size == 2)
		shuffle2(src, dst, n);
	else if (elem_size == 4)
		shuffle4(src, dst, n);
	else
		shuffle_generic(src, dst, n, elem_size);
	if (len > body)
		memcpy(dst + body, src + body, len - body);
}

void ckpt_unshuffle_planes(const uint8_t *const *planes, unsigned elem_size, size_t n,
			   uint8_t *dst)
{
	if (elem_size == 2)
		unshuffle2(planes[0], planes[1], dst, n);
	else if (elem_size == 4)
		unshuffle4(planes[0], planes[1], planes[2], planes[3], dst, n);
	else
		unshuffle_generic(planes, dst, n, elem_size);
}

void ckpt_unshuffle(const uint8_t *src, uint8_t *dst, size_t len, unsigned elem_size)
{
	const uint8_t *planes[8];
	size_t n, body;

	if (elem_size <= 1 || len < elem_size) {
		if (len)
			memcpy(dst, src, len);
		return;
	}
	n = len / elem_size;
	body = n * elem_size;
	if (elem_size <= CKPT_ARRAY_SIZE(planes)) {
		for (unsigned b = 0; b < elem_size; b++)
			planes[b] = src + (size_t)b * n;
		ckpt_unshuffle_planes(planes, elem_size, n, dst);
	} else {
		for (size_t i = 0; i < n; i++)
			for (unsigned b = 0; b < elem_size; b++)
				dst[i * elem_size + b] = src[(size_t)b * n + i];
	}
	if (len > body)
		memcpy(dst + body, src + body, len - body);
}

/* ---- helpers ---- */

/* Grow *buf to at least need bytes (contents not preserved). */
static int ensure_buf(uint8_t **buf, size_t *cap, size_t need)
{
	uint8_t *p;

	if (*cap >= need)
		return 0;
	p = malloc(need);
	if (!p)
		return -ENOMEM;
	free(*buf);
	*buf = p;
	*cap = need;
	return 0;
}

static int zstd_errno(size_t r)
{
	return ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation ? -ENOMEM : -EIO;
}

/*
 * Compress src[0..len) with cctx into dst[0..cap).  Returns the compressed
 * size, 0 if it does not fit in cap (i.e. not worth storing compressed), or
 * -errno.
 */
static ssize_t zstd_into(ZSTD_CCtx *cctx, uint8_t *dst, size_t cap, const void *src, size_t len)
{
	size_t r = ZSTD_compress2(cctx, dst, cap, src, len);

	if (ZSTD_isError(r)) {
		if (ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall)
			return 0;
		return zstd_errno(r);
	}
	return (ssize_t)r;
}

/*
 * Compress a shuffled chunk (len bytes, element size e >= 2, len >= 2 * e:
 * e planes of len / e bytes, then the len % e trailing bytes) into one zstd
 * frame in dst[0..cap), ending a zstd block at every plane boundary.  The
 * frame is an ordinary one (CKPT_CODEC_ZSTD_SHUF2/4 decode it as before);
 * only where its blocks end differs.
 *
 * Why: zstd cuts a frame into blocks of up to 128 KiB, and each block has
 * one literals (Huffman) table.  Unless a plane is a multiple of 128 KiB
 * (a 512 KiB fp32 or 256 KiB bf16 chunk), some block holds the end of one
 * plane and the start of the next, e.g. the random low mantissa bytes of
 * fp32 values together with their exponent bytes, and codes both with one
 * table: the exponent plane then compresses worse and the block decodes
 * at Huffman speed instead of being copied.  The chunker cuts chunks of
 * any size (the optimizer states of the benchmark's checkpoint come in
 * chunks of 128-640 KiB), so most chunks had such blocks.
 *
 * pctx also sets ZSTD_c_minMatch 7: on byte planes of tensors (i.i.d.
 * values) shorter matches cost more to decode than they save.  Measured
 * with tools/bench/decode_planes (figures in docs/performance.md): better
 * ratios and much faster decoding of fp32 optimizer states at level 1,
 * and better ratios and decode speeds at levels 3 and 9 too.
 *
 * Returns the compressed size, 0 if it does not fit in cap, or -errno.
 */
static ssize_t zstd_planes_into(ckpt_compressor *c, uint8_t *dst, size_t cap,
				const uint8_t *shuf, size_t len, unsigned e)
{
	const size_t n = len / e;
	ZSTD_outBuffer out = { dst, cap, 0 };
	size_t r;

	r = ZSTD_CCtx_reset(c->pctx, ZSTD_reset_session_only);
	if (!ZSTD_isError(r))
		r = ZSTD_CCtx_setPledgedSrcSize(c->pctx, len);
	if (ZSTD_isError(r))
		return zstd_errno(r);
	for (unsigned b = 0; b < e; b++) {
		/* the last plane takes the trailing bytes along */
		ZSTD_inBuffer in = { shuf + b * n, b + 1 < e ? n : len - b * n, 0 };
		ZSTD_EndDirective end = b + 1 < e ? ZSTD_e_flush : ZSTD_e_end;

		do {
			r = ZSTD_compressStream2(c->pctx, &out, &in, end);
			if (ZSTD_isError(r))
				return zstd_errno(r);
			if (r && out.pos == out.size)
				return 0; /* does not fit; the next call resets pctx */
		} while (r);
	}
	return (ssize_t)out.pos;
}

/*
 * How a shuffled chunk's planes are coded (not an on-disk value: both
 * write ordinary frames of codec 2 or 3).
 */
enum planes_mode {
	PLANES_NONE,     /* not shuffled: plain zstd */
	PLANES_MATCHES,  /* zstd_planes_into: LZ matches and literals */
	PLANES_LITERALS, /* zstd_literals_into: literals only */
};

#ifdef CKPT_ZSTD_SEQUENCES
/*
 * Compress a shuffled chunk (as zstd_planes_into) into one zstd frame
 * without a single LZ match: every block is a piece of one plane of at
 * most ZSTD_BLOCKSIZE_MAX bytes, all literals, coded with a Huffman table
 * of its own (or the previous one, or raw or RLE, where zstd finds that
 * smaller).  zstd has no parameter that turns matches off; the frame is
 * made by handing ZSTD_compressSequences one literals-only sequence per
 * block, which also skips the match search.  Decoders see an ordinary
 * frame.
 *
 * Why: on byte planes of floating-point tensors the matches zstd finds
 * (7 bytes and longer, by chance, in the low-entropy sign/exponent plane)
 * save fewer bits than they cost, and each one costs the decoder a
 * sequence to execute.  Measured with tools/bench/decode_planes on the
 * benchmark's files, level 1, planes with matches against literals only
 * (figures in docs/performance.md): literals only came out slightly
 * smaller and decoded markedly faster, for fp32 optimizer states and bf16
 * weights, in 256 KiB and 1 MiB chunks.
 * Data with real repeats (zero runs, repeated rows) still needs matches;
 * choose_planes() picks per chunk.
 *
 * dst must have room for literals_bound(len, e) bytes whatever limit is:
 * zstd 1.5.4's ZSTD_compressSequences writes past a dstCapacity that is
 * too small for its blocks (seen with valgrind on a 6-byte dst; zstd
 * PR #3040 fixed one such place in 1.5.2), so it is always given room for
 * the worst case and the result is held against limit here.
 *
 * Returns the compressed size, 0 if that is over limit (or zstd could not
 * code it that way), or -errno (-ENOMEM).
 */
static size_t literals_blocks(size_t len, unsigned e)
{
	return len / ZSTD_BLOCKSIZE_MAX + e + 1; /* at most; pieces split at planes */
}

static size_t literals_bound(size_t len, unsigned e)
{
	/* every block raw at worst (3-byte header), frame header, checksum */
	return len + 3 * literals_blocks(len, e) + ZSTD_FRAMEHEADERSIZE_MAX + 4;
}

static ssize_t zstd_literals_into(ckpt_compressor *c, uint8_t *dst, size_t limit,
				  const uint8_t *shuf, size_t len, unsigned e)
{
	const size_t n = len / e;
	const size_t need = literals_blocks(len, e);
	size_t ns = 0, r;

	if (c->seqs_cap < need) {
		ZSTD_Sequence *p = realloc(c->seqs, need * sizeof(*p));

		if (!p)
			return -ENOMEM;
		c->seqs = p;
		c->seqs_cap = need;
	}
	for (unsigned b = 0; b < e; b++) {
		/* the last plane takes the trailing bytes along */
		size_t plen = b + 1 < e ? n : len - b * n;

		for (size_t off = 0; off < plen; off += ZSTD_BLOCKSIZE_MAX) {
			/* offset 0, matchLength 0: a block delimiter holding only literals */
			memset(&c->seqs[ns], 0, sizeof(c->seqs[ns]));
			c->seqs[ns++].litLength = (unsigned)CKPT_MIN(plen - off,
								    (size_t)ZSTD_BLOCKSIZE_MAX);
		}
	}
	r = ZSTD_CCtx_reset(c->lctx, ZSTD_reset_session_only);
	if (!ZSTD_isError(r))
		r = ZSTD_compressSequences(c->lctx, dst, literals_bound(len, e), c->seqs, ns,
					   shuf, len);
	if (ZSTD_isError(r)) {
		/*
		 * Only allocation failures are errors.  With a dst shorter than
		 * its frame header, zstd 1.5.4 reports "Unspecified error"
		 * rather than dstSize_tooSmall; any failure of this optional
		 * coding leaves the chunk to the others, which is always safe.
		 */
		if (ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation)
			return -ENOMEM;
		return 0;
	}
	return r <= limit ? (ssize_t)r : 0;
}
#endif

/*
 * The shuffled chunk coded as mode says (PLANES_MATCHES or
 * PLANES_LITERALS) into c->out, grown as the coding needs; 0 if the
 * result is over limit.
 */
static ssize_t planes_into(ckpt_compressor *c, enum planes_mode mode, size_t limit,
			   const uint8_t *shuf, size_t len, unsigned e)
{
#ifdef CKPT_ZSTD_SEQUENCES
	if (mode == PLANES_LITERALS) {
		int err = ensure_buf(&c->out, &c->out_cap, literals_bound(len, e));

		if (err)
			return err;
		return zstd_literals_into(c, c->out, limit, shuf, len, e);
	}
#else
	(void)mode;
#endif
	return zstd_planes_into(c, c->out, limit, shuf, len, e);
}

/*
 * Literals-only planes are kept unless they come out more than 1/64
 * larger than the planes with matches: they decode markedly faster (see
 * zstd_planes_literals).
 */
static bool literals_win(ssize_t lit, ssize_t match)
{
	return lit > 0 && (match == 0 || lit <= match + match / 64);
}

static uint8_t shuf_codec(unsigned elem_size)
{
	return elem_size == 2 ? CKPT_CODEC_ZSTD_SHUF2 : CKPT_CODEC_ZSTD_SHUF4;
}

/*
 * Decide whether and how shuffling pays for a chunk larger than the
 * sample.  The sample is SAMPLE_PARTS slices gathered from evenly spaced
 * places (a single window is fooled by chunks whose middle is e.g. all
 * zeros).  It is compressed once plain and, shuffled, once per byte plane
 * with the planes' parameters, with matches and (where built) literals
 * only: the chunk's planes get zstd blocks of their own, which
 * compressing the small shuffled sample in one piece does not reproduce
 * (it underestimates the gain; see the report in the header).  Returns a
 * planes_mode (PLANES_NONE: plain) or -errno.
 */
#define SAMPLE_PARTS 4

static int choose_planes(ckpt_compressor *c, const uint8_t *in, size_t len, unsigned e)
{
	const size_t part = CKPT_COMPRESS_SAMPLE / SAMPLE_PARTS;
	const size_t plane = CKPT_COMPRESS_SAMPLE / e;
	size_t scap = ZSTD_compressBound(CKPT_COMPRESS_SAMPLE);
	uint8_t *gath, *shuf;
	ssize_t r, plain_sz, shuf_sz = 0, best;
	enum planes_mode mode = PLANES_MATCHES;
	int err;

	err = ensure_buf(&c->sample, &c->sample_cap, 2 * CKPT_COMPRESS_SAMPLE);
	if (err)
		return err;
#ifdef CKPT_ZSTD_SEQUENCES
	scap = CKPT_MAX(scap, literals_bound(plane, 1));
#endif
	err = ensure_buf(&c->alt, &c->alt_cap, scap);
	if (err)
		return err;
	gath = c->sample;
	shuf = c->sample + CKPT_COMPRESS_SAMPLE;
	for (size_t q = 0; q < SAMPLE_PARTS; q++) {
		/* Slice centred at (2q+1)/8 of the chunk; len > sample keeps it in range. */
		size_t off = len / (2 * SAMPLE_PARTS) * (2 * q + 1) - part / 2;

		off -= off % e;
		memcpy(gath + q * part, in + off, part);
	}
	plain_sz = zstd_into(c->cctx, c->alt, scap, gath, CKPT_COMPRESS_SAMPLE);
	if (plain_sz <= 0)
		return plain_sz < 0 ? (int)plain_sz : -EIO;
	ckpt_shuffle(gath, shuf, CKPT_COMPRESS_SAMPLE, e);
	for (unsigned b = 0; b < e; b++) {
		r = zstd_into(c->pctx, c->alt, scap, shuf + b * plane, plane);
		if (r <= 0)
			return r < 0 ? (int)r : -EIO;
		shuf_sz += r;
	}
	best = shuf_sz;
#ifdef CKPT_ZSTD_SEQUENCES
	{
		ssize_t lit_sz = 0;

		for (unsigned b = 0; b < e; b++) {
			r = zstd_literals_into(c, c->alt, scap, shuf + b * plane, plane, 1);
			if (r < 0)
				return (int)r;
			if (r == 0) {
				lit_sz = 0; /* not an option */
				break;
			}
			lit_sz += r;
		}
		if (literals_win(lit_sz, shuf_sz)) {
			mode = PLANES_LITERALS;
			best = lit_sz;
		}
	}
#endif
	return best < plain_sz ? (int)mode : PLANES_NONE;
}

/* ---- compressor ---- */

/*
 * A compression context for level with frame checksums and content sizes;
 * min_match 0 keeps the level's own.  Returns 0, -ENOMEM or -EINVAL.
 */
static int cctx_new(int level, int min_match, ZSTD_CCtx **ret)
{
	ZSTD_CCtx *cc = ZSTD_createCCtx();
	size_t r;

	if (!cc)
		return -ENOMEM;
	r = ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, level);
	if (!ZSTD_isError(r))
		r = ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
	if (!ZSTD_isError(r))
		r = ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 1);
	if (!ZSTD_isError(r) && min_match)
		r = ZSTD_CCtx_setParameter(cc, ZSTD_c_minMatch, min_match);
	if (ZSTD_isError(r)) {
		ZSTD_freeCCtx(cc);
		return -EINVAL;
	}
	*ret = cc;
	return 0;
}

int ckpt_compressor_new(int level, ckpt_compressor **ret)
{
	ckpt_compressor *c;
	int err;

	if (!ret || level < 0 || level > CKPT_COMPRESS_LEVEL_MAX)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->level = level;
	if (level > 0) {
		err = cctx_new(level, 0, &c->cctx);
		if (!err)
			err = cctx_new(level, 7, &c->pctx);
#ifdef CKPT_ZSTD_SEQUENCES
		if (!err)
			err = cctx_new(level, 0, &c->lctx);
		if (!err && (ZSTD_isError(ZSTD_CCtx_setParameter(c->lctx, ZSTD_c_blockDelimiters,
								 ZSTD_sf_explicitBlockDelimiters)) ||
			     ZSTD_isError(ZSTD_CCtx_setParameter(c->lctx,
								 ZSTD_c_literalCompressionMode,
								 ZSTD_ps_enable))))
			err = -EINVAL;
#endif
		if (err)
			goto fail;
	}
	*ret = c;
	return 0;
fail:
	ckpt_compressor_free(c);
	return err;
}

void ckpt_compressor_free(ckpt_compressor *c)
{
	if (!c)
		return;
	ZSTD_freeCCtx(c->cctx);
	ZSTD_freeCCtx(c->pctx);
#ifdef CKPT_ZSTD_SEQUENCES
	ZSTD_freeCCtx(c->lctx);
	free(c->seqs);
#endif
	free(c->out);
	free(c->alt);
	free(c->lit);
	free(c->shuf);
	free(c->sample);
	free(c);
}

int ckpt_compress(ckpt_compressor *c, const void *src, size_t len, unsigned elem_size,
		  uint8_t *ret_codec, const void **ret_out, size_t *ret_out_len)
{
	const uint8_t *in = src;
	size_t bound, limit;
	uint8_t codec = CKPT_CODEC_RAW;
	const void *out = src;
	size_t out_len = len;
	ssize_t n;
	int err, use_shuf;

	if (!c || !ret_codec || !ret_out || !ret_out_len || (!src && len))
		return -EINVAL;
	if (elem_size != 0 && elem_size != 2 && elem_size != 4)
		return -EINVAL;
	if (c->level == 0 || len == 0)
		goto done;
	bound = ZSTD_compressBound(len);
	if (ZSTD_isError(bound))
		return -EINVAL;
	/* Keep only results strictly smaller than len - len / 64. */
	limit = len - len / 64 - 1;
	if (limit == 0)
		goto done;
	err = ensure_buf(&c->out, &c->out_cap, limit);
	if (err)
		return err;

	if (elem_size == 0 || len < 2 * elem_size) {
		n = zstd_into(c->cctx, c->out, limit, in, len);
		if (n < 0)
			return (int)n;
		if (n > 0) {
			codec = CKPT_CODEC_ZSTD;
			out = c->out;
			out_len = (size_t)n;
		}
		goto done;
	}

	err = ensure_buf(&c->shuf, &c->shuf_cap, len);
	if (err)
		return err;

	if (len <= CKPT_COMPRESS_SAMPLE) {
		/* Small chunk: compress it every way and keep the smallest. */
		const uint8_t *shuf_out;
		ssize_t ns;

		err = ensure_buf(&c->alt, &c->alt_cap, limit);
		if (err)
			return err;
		shuf_out = c->alt; /* (after ensure_buf, which may move it) */
		n = zstd_into(c->cctx, c->out, limit, in, len);
		if (n < 0)
			return (int)n;
		ckpt_shuffle(in, c->shuf, len, elem_size);
		ns = zstd_planes_into(c, c->alt, limit, c->shuf, len, elem_size);
		if (ns < 0)
			return (int)ns;
#ifdef CKPT_ZSTD_SEQUENCES
		{
			/* out holds plain, alt the planes with matches, lit the
			 * literals only */
			ssize_t nl;

			err = ensure_buf(&c->lit, &c->lit_cap, literals_bound(len, elem_size));
			if (err)
				return err;
			nl = zstd_literals_into(c, c->lit, limit, c->shuf, len, elem_size);
			if (nl < 0)
				return (int)nl;
			if (literals_win(nl, ns)) {
				shuf_out = c->lit;
				ns = nl;
			}
		}
#endif
		if (ns > 0 && (n == 0 || ns < n)) {
			codec = shuf_codec(elem_size);
			out = shuf_out;
			out_len = (size_t)ns;
		} else if (n > 0) {
			codec = CKPT_CODEC_ZSTD;
			out = c->out;
			out_len = (size_t)n;
		}
		goto done;
	}

	/* Large chunk: decide on a sample, then compress the chunk once. */
	use_shuf = choose_planes(c, in, len, elem_size);
	if (use_shuf < 0)
		return use_shuf;
	if (use_shuf != PLANES_NONE) {
		ckpt_shuffle(in, c->shuf, len, elem_size);
		n = planes_into(c, (enum planes_mode)use_shuf, limit, c->shuf, len, elem_size);
	} else {
		n = zstd_into(c->cctx, c->out, limit, in, len);
	}
	if (n < 0)
		return (int)n;
	if (n > 0) {
		codec = use_shuf ? shuf_codec(elem_size) : CKPT_CODEC_ZSTD;
		out = c->out;
		out_len = (size_t)n;
	}
done:
	*ret_codec = codec;
	*ret_out = out;
	*ret_out_len = out_len;
	return 0;
}

/* ---- decompressor ---- */

int ckpt_decompressor_new(ckpt_decompressor **ret)
{
	ckpt_decompressor *d;

	if (!ret)
		return -EINVAL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->dctx = ZSTD_createDCtx();
	if (!d->dctx) {
		free(d);
		return -ENOMEM;
	}
	*ret = d;
	return 0;
}

void ckpt_decompressor_skip_checksum(ckpt_decompressor *d)
{
	if (d)
		ZSTD_DCtx_setParameter(d->dctx, ZSTD_d_forceIgnoreChecksum,
				       ZSTD_d_ignoreChecksum);
}

int ckpt_decompressor_reserve(ckpt_decompressor *d, size_t raw_len)
{
	int err;

	if (!d)
		return -EINVAL;
	if (raw_len <= d->scratch_cap)
		return 0;
	err = ensure_buf(&d->scratch, &d->scratch_cap, raw_len);
	if (err)
		return err;
	memset(d->scratch, 0, d->scratch_cap);
	return 0;
}

void ckpt_decompressor_free(ckpt_decompressor *d)
{
	if (!d)
		return;
	ZSTD_freeDCtx(d->dctx);
	free(d->scratch);
	free(d);
}

/* Decode one zstd payload into dst, which must come out exactly raw_len bytes. */
static int zstd_exact(ckpt_decompressor *d, const void *src, size_t src_len,
		      void *dst, size_t raw_len)
{
	unsigned long long fcs;
	size_t r;

	/* Cheap early rejection: frame header declares a different size. */
	fcs = ZSTD_getFrameContentSize(src, src_len);
	if (fcs == ZSTD_CONTENTSIZE_ERROR)
		return -EIO;
	if (fcs != ZSTD_CONTENTSIZE_UNKNOWN && fcs != raw_len)
		return -EIO;
	r = ZSTD_decompressDCtx(d->dctx, dst, raw_len, src, src_len);
	if (ZSTD_isError(r))
		return zstd_errno(r);
	if (r != raw_len)
		return -EIO;
	return 0;
}

int ckpt_decompress(ckpt_decompressor *d, uint8_t codec, const void *src, size_t src_len,
		    void *dst, size_t raw_len)
{
	unsigned e;
	int err;

	if (!d || (!src && src_len) || (!dst && raw_len))
		return -EINVAL;
	switch (codec) {
	case CKPT_CODEC_RAW:
		if (src_len != raw_len)
			return -EIO;
		if (raw_len)
			memcpy(dst, src, raw_len);
		return 0;
	case CKPT_CODEC_ZSTD:
		return zstd_exact(d, src, src_len, dst, raw_len);
	case CKPT_CODEC_ZSTD_SHUF2:
	case CKPT_CODEC_ZSTD_SHUF4:
		e = codec == CKPT_CODEC_ZSTD_SHUF2 ? 2 : 4;
		/* At least 1 byte so that raw_len == 0 still has a valid pointer. */
		err = ensure_buf(&d->scratch, &d->scratch_cap, raw_len ? raw_len : 1);
		if (err)
			return err;
		err = zstd_exact(d, src, src_len, d->scratch, raw_len);
		if (err)
			return err;
		ckpt_unshuffle(d->scratch, dst, raw_len, e);
		return 0;
	default:
		return -EINVAL;
	}
}
