/* SPDX-License-Identifier: MIT */
/*
 * chunker.h - FastCDC content-defined chunking (stateless cut-point finder).
 *
 * Algorithm: FastCDC (Xia et al., USENIX ATC 2016) with normalized
 * chunking level 2.  For a chunk starting at buf[0]:
 *   - the first min_size bytes are skipped (never a cut inside them);
 *   - from position min_size on, h starts at 0 and for every byte b at
 *     position i: h = (h << 1) + gear[b] (mod 2^64);
 *   - while i < avg_size the cut test uses mask_s, from avg_size on mask_l;
 *     when (h & mask) == 0 the chunk ends after byte i (length i + 1);
 *   - with no cut the chunk ends at max_size (or at end of data).
 * With B = log2(avg_size), mask_s has B + 2 one-bits and mask_l has B - 2,
 * placed in the highest bits below bit 63: mask(n) = ((1 << n) - 1) << (63 - n).
 * High bits are used because bit k of the gear hash depends on the last k + 1
 * bytes, so every tested bit sees a window of at least 37 bytes.
 *
 * ON-DISK COMPATIBILITY: the gear table, the masks and the rules above fix
 * every chunk boundary, and so which chunks deduplicate against data already
 * stored.  Changing any of them does not corrupt a store but makes new
 * writes share nothing with old ones.  gear[i] (i = 0..255) is the i-th
 * output of splitmix64 seeded with 0x636b707466732131 ("ckptfs!1"):
 *   state += 0x9e3779b97f4a7c15; z = state;
 *   z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
 *   z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
 *   gear[i] = z ^ (z >> 31);
 * so gear[0] = 0xd1974b2f656b3fa4, gear[255] = 0xb4ef86f2234b50f1.
 *
 * Everything here is a pure function of its arguments: thread-safe, no
 * allocation, no global mutable state.
 */
#ifndef CKPT_CHUNKER_H
#define CKPT_CHUNKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ckpt_cdc_params {
	size_t min_size; /* no cut before this many bytes */
	size_t avg_size; /* target average; a power of two */
	size_t max_size; /* forced cut here */
};

/*
 * Defaults chosen by measurement (tools/bench/chunk_sizes, figures in
 * docs/design.md): on a torch.save-like stream with half of the tensors
 * unchanged between two steps, a 512 KiB average finds most of the dedup
 * that smaller chunks find at a fraction of their index entries, and far
 * more than 1 MiB chunks; the compression ratio does not depend on it.
 * Safetensors files do not use CDC for tensor data (file.h).
 */
#define CKPT_CDC_DEFAULT_MIN (128u * 1024)
#define CKPT_CDC_DEFAULT_AVG (512u * 1024)
#define CKPT_CDC_DEFAULT_MAX (2u * 1024 * 1024)

/* Bounds enforced by ckpt_cdc_params_check(). */
#define CKPT_CDC_MIN_MIN 64u
#define CKPT_CDC_MAX_MAX (64u * 1024 * 1024)

/*
 * Validate p: min_size >= CKPT_CDC_MIN_MIN, min_size < avg_size < max_size,
 * avg_size a power of two, max_size <= CKPT_CDC_MAX_MAX.
 * Returns 0, or -EINVAL (including p == NULL).
 */
int ckpt_cdc_params_check(const struct ckpt_cdc_params *p);

/*
 * Find the end of the chunk that starts at buf[0].  buf holds len bytes of
 * the stream from that point; eof tells whether the stream ends at len.
 * p must have passed ckpt_cdc_params_check() (not re-checked here).
 *
 * Returns the chunk length (cut point), in 1..max_size:
 *   - the first content-defined cut at or before max_size found in
 *     buf[0..min(len, max_size)), or
 *   - max_size when len >= max_size and no cut was found, or
 *   - len when eof, len <= max_size and no cut was found;
 * or 0 when more data is needed (!eof, no cut in buf[0..len), len <
 * max_size) and also for eof with len == 0.
 * A cut depends only on the bytes before it, so once found it is the same
 * for every longer buf; passing at least max_size bytes (or everything up
 * to eof) always yields a cut.
 */
size_t ckpt_cdc_cut(const struct ckpt_cdc_params *p, const uint8_t *buf, size_t len, bool eof);
/*
 * ckpt_cdc_cut() for a caller that offers the same chunk's bytes again and
 * again as more arrive (a writer fed small writes): *scanned says how many
 * bytes of buf earlier calls already scanned without finding a cut (0 for
 * a new chunk), and only the bytes after them are tested, so feeding a
 * chunk in small pieces costs one scan of it instead of one per piece.
 * The result is exactly ckpt_cdc_cut()'s.  On return *scanned is updated:
 * 0 when a cut was returned (the next chunk starts at it), else the
 * bytes scanned so far.  buf must hold the same bytes as before.
 */
size_t ckpt_cdc_cut_resume(const struct ckpt_cdc_params *p, const uint8_t *buf, size_t len,
			   bool eof, size_t *scanned);


/*
 * Cutting state of a chunk whose bytes come in pieces that need not stay
 * in memory (ckpt_cdc_feed): what the scan of the bytes seen so far left.
 * All zero for a new chunk.
 */
struct ckpt_cdc_state {
	uint64_t h;  /* gear hash after the bytes seen (0 before min_size) */
	size_t seen; /* bytes of the current chunk seen, with no cut */
};

/*
 * Feed the next n bytes of the chunk st describes.  Returns k in 1..n when
 * the chunk ends after buf[k - 1] (a content-defined cut, or max_size
 * reached), st then being reset for the next chunk (which starts at
 * buf[k]); or 0 when buf holds no cut (st->seen grew by n).  The chunk
 * ends where ckpt_cdc_cut() over its bytes in one buffer ends it; at the
 * end of the stream the caller ends it after its st->seen bytes.  p must
 * have passed ckpt_cdc_params_check(); st must not be NULL.
 */
size_t ckpt_cdc_feed(const struct ckpt_cdc_params *p, struct ckpt_cdc_state *st, const uint8_t *buf,
		     size_t n);

#endif
