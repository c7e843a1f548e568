/* SPDX-License-Identifier: MIT */
/*
 * fuzz_compress.c - the decoding of stored chunk bytes (chunk/compress.h):
 * zstd frames, plain or of byte planes, and raw chunks.
 *
 * Input: CODEC RAWLEN[3] (little-endian) FLAGS BYTES.  BYTES is decoded as
 * the stored bytes of a chunk of codec CODEC and raw length RAWLEN modulo
 * MAX_RAW + 1 (larger outputs cost AddressSanitizer milliseconds per run to
 * allocate and poison, and take no other path) by two decompressors, one of which skips zstd's frame
 * checksums (as the store's does, which verifies the keyed digest instead).
 * What must hold: the result is 0, -EIO (corrupt, wrong length), -EINVAL
 * (only for an unknown codec) or -ENOMEM; nothing is written outside the
 * RAWLEN bytes of the output (AddressSanitizer); a frame that decodes with
 * its checksum verified decodes to the same bytes without.  Then BYTES is
 * compressed (FLAGS: level 1 or 3, element size hint 0, 2 or 4) and must
 * decode back to itself with the codec chosen.
 */
#include "fuzz.h"

#include <errno.h>

#include "chunk/compress.h"

#define MAX_RAW (256u << 10)

static ckpt_decompressor *dec, *dec_nosum;
static ckpt_compressor *comp[2];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_quiet();
	if (ckpt_decompressor_new(&dec) < 0 || ckpt_decompressor_new(&dec_nosum) < 0 ||
	    ckpt_compressor_new(1, &comp[0]) < 0 || ckpt_compressor_new(3, &comp[1]) < 0)
		abort();
	ckpt_decompressor_skip_checksum(dec_nosum);
	return 0;
}

static bool expected_err(int r, uint8_t codec)
{
	return r == -EIO || r == -ENOMEM || (r == -EINVAL && codec > CKPT_CODEC_ZSTD_SHUF4);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const unsigned elems[] = { 0, 2, 4, 0 };
	uint8_t codec, flags, *out = NULL, *out2 = NULL, *back = NULL, got_codec;
	const void *stored;
	size_t raw_len, n, stored_len;
	int r, r2;

	if (size < 5)
		return 0;
	codec = data[0];
	raw_len = (data[1] | (size_t)data[2] << 8 | (size_t)data[3] << 16) % (MAX_RAW + 1);
	flags = data[4];
	data += 5;
	n = size - 5;

	/* exactly raw_len bytes each: AddressSanitizer sees any write past them */
	out = malloc(raw_len ? raw_len : 1);
	out2 = malloc(raw_len ? raw_len : 1);
	if (!out || !out2)
		goto out;
	r = ckpt_decompress(dec, codec, data, n, raw_len ? out : NULL, raw_len);
	FUZZ_CHECK(r == 0 || expected_err(r, codec), "codec %u: %d", codec, r);
	r2 = ckpt_decompress(dec_nosum, codec, data, n, raw_len ? out2 : NULL, raw_len);
	FUZZ_CHECK(r2 == 0 || expected_err(r2, codec), "codec %u without checksums: %d", codec, r2);
	if (r == 0) {
		FUZZ_CHECK(r2 == 0 && memcmp(out, out2, raw_len) == 0,
			   "a frame that decodes with its checksum decodes otherwise without");
		if (codec == CKPT_CODEC_RAW)
			FUZZ_CHECK(n == raw_len && memcmp(out, data, n) == 0, "raw chunk");
	}

	/* what is compressed decodes back */
	r = ckpt_compress(comp[flags & 1], data, n, elems[(flags >> 1) & 3], &got_codec, &stored,
			  &stored_len);
	if (r == -ENOMEM)
		goto out;
	FUZZ_CHECK(r == 0, "compress of %zu bytes: %d", n, r);
	FUZZ_CHECK(got_codec <= CKPT_CODEC_ZSTD_SHUF4, "codec %u", got_codec);
	FUZZ_CHECK(got_codec == CKPT_CODEC_RAW ? stored_len == n && stored == (const void *)data
					       : stored_len < n,
		   "codec %u: %zu stored bytes of %zu", got_codec, stored_len, n);
	back = malloc(n ? n : 1);
	if (!back)
		goto out;
	r = ckpt_decompress(flags & 8 ? dec_nosum : dec, got_codec, stored, stored_len,
			    n ? back : NULL, n);
	FUZZ_CHECK(r == 0 && memcmp(back, data, n) == 0, "round trip of codec %u: %d", got_codec,
		   r);
out:
	free(out);
	free(out2);
	free(back);
	return 0;
}
