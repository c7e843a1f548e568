/* SPDX-License-Identifier: MIT */
/*
 * compress.h - per-chunk zstd compression with an optional byte shuffle.
 *
 * Each chunk is stored with one codec, whose id is written in the pack
 * record.  The ids below are on-disk values: never renumber them.
 *
 * Zstd frames written here carry the content size and a content checksum
 * (ZSTD_c_checksumFlag, XXH64 low 32 bits), so corruption of a compressed
 * chunk is reported by ckpt_decompress() as -EIO.  CKPT_CODEC_RAW has no
 * such protection: the pack layer's ckpt_checksum() over the stored bytes
 * is what detects corruption of raw chunks.
 *
 * Byte shuffle (as in blosc): for element size E and n = len / E whole
 * elements, byte plane b (0..E-1) holds byte b of every element:
 * out[b * n + i] = in[i * E + b]; the trailing len % E bytes are copied
 * unchanged at the end.  On bf16/fp16/fp32 tensors this puts the sign and
 * exponent bytes, which are highly repetitive, next to each other.
 */
#ifndef CKPT_COMPRESS_H
#define CKPT_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

/* On-disk codec ids (stored in pack records; fixed numbers). */
#define CKPT_CODEC_RAW        0 /* stored bytes == raw bytes */
#define CKPT_CODEC_ZSTD       1 /* zstd frame of the raw bytes */
#define CKPT_CODEC_ZSTD_SHUF2 2 /* zstd frame of the 2-byte-shuffled raw bytes */
#define CKPT_CODEC_ZSTD_SHUF4 3 /* zstd frame of the 4-byte-shuffled raw bytes */

#define CKPT_COMPRESS_LEVEL_MAX 19

/*
 * Size of the sample used to choose between shuffled and plain zstd for
 * chunks larger than this (see ckpt_compress()).  Not an on-disk value.
 */
#define CKPT_COMPRESS_SAMPLE (64u * 1024)

/*
 * Compressor.  Opaque; owns a ZSTD_CCtx and scratch buffers that grow to
 * the largest chunk seen.  NOT thread-safe: use one per thread.
 */
typedef struct ckpt_compressor ckpt_compressor;

/*
 * Create a compressor.  level 0 means never compress (every chunk is
 * stored RAW); 1..CKPT_COMPRESS_LEVEL_MAX is the zstd level.
 * On success stores it in *ret (free with ckpt_compressor_free()), returns 0.
 * Errors: -EINVAL (ret NULL, level < 0 or > CKPT_COMPRESS_LEVEL_MAX),
 * -ENOMEM.
 */
int ckpt_compressor_new(int level, ckpt_compressor **ret);

/* Free a compressor and its buffers.  Accepts NULL. */
void ckpt_compressor_free(ckpt_compressor *c);

/*
 * Compress src[0..len).  elem_size is a hint: 2 or 4 for tensor data of
 * that element size, 0 for anything else.
 *
 * Codec choice:
 *  - level 0 or len 0: RAW;
 *  - elem_size 0 (or len < 2 * elem_size): plain zstd;
 *  - elem_size 2/4 and len <= CKPT_COMPRESS_SAMPLE: the chunk is compressed
 *    both plain and shuffled and the smaller is kept;
 *  - elem_size 2/4 and larger chunks: a CKPT_COMPRESS_SAMPLE-byte sample
 *    (4 slices gathered from evenly spaced places) is compressed plain and,
 *    shuffled, one byte plane at a time; the whole chunk is then compressed
 *    once with the winner (ties go to plain).  Measured on 1 MiB chunks of
 *    bf16 and fp32 data of several shapes, half-zero chunks and fp32 with a
 *    2-byte hint, at levels 1 and 3, this picked the same codec as
 *    compressing the whole chunk both ways in every case, for a small
 *    fraction of that CPU time; a single middle window compressed in one
 *    piece often picked the worse one.
 *  - a shuffled chunk is one zstd frame whose blocks end at every byte
 *    plane's end, so that no zstd block mixes two planes under one Huffman
 *    table.  Its planes are coded either as
 *    literals only, without a single LZ match (Huffman, raw or RLE blocks
 *    of at most 128 KiB), or with matches (ZSTD_c_minMatch 7).  The sample
 *    (or, for small chunks, the chunk) is coded both ways and literals
 *    only is kept unless it comes out more than 1/64 larger: on float
 *    tensors it is smaller and decodes markedly faster; data with
 *    real repeats keeps its matches.  Literals only needs zstd's
 *    ZSTD_compressSequences (zstd >= 1.5, found by configure); without
 *    it planes always keep their matches.  Either way the frame decodes
 *    like any other (docs/format.md, codec ids 2 and 3);
 *  - if the chosen result is not smaller than len - len / 64, the chunk
 *    does not shrink meaningfully and is stored as CKPT_CODEC_RAW.
 *
 * On success returns 0 with *ret_codec the codec id, *ret_out the stored
 * bytes and *ret_out_len their length.  For RAW *ret_out is src itself;
 * otherwise it points into a buffer owned by c that stays valid until the
 * next call on c or ckpt_compressor_free(c).
 * Errors: -EINVAL (NULL pointer, src NULL with len > 0, elem_size not
 * 0/2/4, len beyond what zstd accepts), -ENOMEM, -EIO (unexpected zstd
 * failure).  Output parameters are untouched on error.
 */
int ckpt_compress(ckpt_compressor *c, const void *src, size_t len, unsigned elem_size,
		  uint8_t *ret_codec, const void **ret_out, size_t *ret_out_len);

/*
 * Decompressor.  Opaque; owns a ZSTD_DCtx and a scratch buffer for
 * unshuffling.  NOT thread-safe: use one per thread.
 */
typedef struct ckpt_decompressor ckpt_decompressor;

/* Create a decompressor.  Returns 0, -EINVAL (ret NULL) or -ENOMEM. */
int ckpt_decompressor_new(ckpt_decompressor **ret);

/*
 * Stop verifying zstd frame checksums (XXH64 of the decoded bytes) in d.
 * Only for callers that verify the decoded bytes themselves: the store
 * checks every chunk against its keyed digest, which makes the frame
 * checksum a second pass over the same bytes (about a third of the
 * decompression time of shuffled bf16 here).  Corrupt frames are still
 * rejected when they do not decode to exactly raw_len bytes.
 */
void ckpt_decompressor_skip_checksum(ckpt_decompressor *d);

/*
 * Size the decompressor's working buffer (the byte planes of a shuffled
 * chunk before they are interleaved) for chunks of up to raw_len bytes now,
 * and touch it, so that decodes of such chunks fault no memory in.  Without
 * it the buffer grows on demand, each growth a new allocation whose pages
 * are faulted and zeroed on first use.  Returns 0 or -ENOMEM (d unchanged).
 */
int ckpt_decompressor_reserve(ckpt_decompressor *d, size_t raw_len);

/* Free a decompressor.  Accepts NULL. */
void ckpt_decompressor_free(ckpt_decompressor *d);

/*
 * Decode src[0..src_len), stored with codec, into dst, which receives
 * exactly raw_len bytes.  Never writes past dst + raw_len (on error the
 * contents of dst[0..raw_len) are unspecified).
 * Errors: -EINVAL (unknown codec, NULL d, NULL src/dst with a non-zero
 * length), -EIO (corrupt data, failed zstd content checksum, or data that
 * does not decode to exactly raw_len bytes), -ENOMEM.
 */
int ckpt_decompress(ckpt_decompressor *d, uint8_t codec, const void *src, size_t src_len,
		    void *dst, size_t raw_len);

/*
 * Byte shuffle / unshuffle len bytes from src to dst (layout above).
 * src and dst must not overlap.  elem_size 0 or 1 is a plain copy; any
 * other element size is supported (2 and 4 use SSE2 on x86-64).
 * Thread-safe; cannot fail.
 */
void ckpt_shuffle(const uint8_t *src, uint8_t *dst, size_t len, unsigned elem_size);
void ckpt_unshuffle(const uint8_t *src, uint8_t *dst, size_t len, unsigned elem_size);
/*
 * The unshuffle of n whole elements from elem_size (>= 1) byte planes of n
 * bytes each that need not lie together: dst[i * elem_size + b] =
 * planes[b][i].  No trailing bytes.  Planes must not overlap dst.
 * Thread-safe; cannot fail.
 */
void ckpt_unshuffle_planes(const uint8_t *const *planes, unsigned elem_size, size_t n,
			   uint8_t *dst);

#endif
