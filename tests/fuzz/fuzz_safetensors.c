/* SPDX-License-Identifier: MIT */
/*
 * fuzz_safetensors.c - the safetensors header parser (views/safetensors.h).
 *
 * Input: the N header bytes that follow the 8-byte length prefix of a
 * safetensors file.  A header that ckpt_st_parse() refuses must come with a
 * one-line reason; one that it accepts must keep every promise of
 * safetensors.h: tensors in data order tiling [0, data_len) with sizes that
 * match shape and dtype, lookups by name and key that find every entry,
 * metadata in key order, and a serialization (ckpt_st_serialize) that
 * parses back to the same tensors and metadata.  The sharding metadata of
 * an accepted header is parsed too (fuzz_shardmeta.c goes deeper there).
 */
#include "fuzz.h"

#include <errno.h>

#include "views/safetensors.h"
#include "views/shardmeta.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_quiet();
	return 0;
}

/* Bytes of a tensor from its shape and dtype (validated: cannot overflow). */
static uint64_t tensor_bytes(const struct ckpt_st_tensor *t)
{
	uint64_t n = 1;

	for (unsigned d = 0; d < t->ndim; d++)
		FUZZ_CHECK(!__builtin_mul_overflow(n, t->shape[d], &n), "tensor '%s'", t->name);
	FUZZ_CHECK(!__builtin_mul_overflow(n, (uint64_t)ckpt_dtype_bits(t->dtype), &n),
		   "tensor '%s'", t->name);
	FUZZ_CHECK(n % 8 == 0, "tensor '%s': %llu bits", t->name, (unsigned long long)n);
	return n / 8;
}

static void check_header(const ckpt_st_header *h, size_t n)
{
	size_t nt = ckpt_st_tensor_count(h), nm = ckpt_st_metadata_count(h);
	uint64_t end = 0;
	const char *prev_key = NULL;

	FUZZ_CHECK(ckpt_st_header_n(h) == n, "n");
	for (size_t i = 0; i < nt; i++) {
		const struct ckpt_st_tensor *t = ckpt_st_tensor_at(h, i);

		FUZZ_CHECK(t != NULL, "tensor %zu of %zu", i, nt);
		FUZZ_CHECK(strcmp(t->name, "__metadata__") != 0, "a tensor named __metadata__");
		FUZZ_CHECK(ckpt_dtype_name(t->dtype) != NULL, "tensor '%s': dtype", t->name);
		FUZZ_CHECK(t->ndim == 0 || t->shape != NULL, "tensor '%s': shape", t->name);
		FUZZ_CHECK(t->begin == end, "tensor '%s' begins at %llu, not %llu", t->name,
			   (unsigned long long)t->begin, (unsigned long long)end);
		FUZZ_CHECK(t->end - t->begin == tensor_bytes(t) && t->end >= t->begin,
			   "tensor '%s': size", t->name);
		FUZZ_CHECK(ckpt_st_tensor_find(h, t->name) == t, "find '%s'", t->name);
		end = t->end;
	}
	FUZZ_CHECK(ckpt_st_tensor_at(h, nt) == NULL, "tensor past the count");
	FUZZ_CHECK(ckpt_st_data_len(h) == end, "data_len");
	FUZZ_CHECK(ckpt_st_check_file_size(h, CKPT_ST_PREFIX_LEN + n + end) == 0, "file size");
	FUZZ_CHECK(ckpt_st_check_file_size(h, CKPT_ST_PREFIX_LEN + n + end + 1) == -EINVAL,
		   "file size + 1");
	for (size_t i = 0; i < nm; i++) {
		const char *k, *v;

		FUZZ_CHECK(ckpt_st_metadata_at(h, i, &k, &v) == 0, "metadata %zu", i);
		FUZZ_CHECK(!prev_key || strcmp(prev_key, k) < 0, "metadata keys out of order");
		FUZZ_CHECK(ckpt_st_metadata_get(h, k) == v, "metadata '%s'", k);
		prev_key = k;
	}
	FUZZ_CHECK(ckpt_st_metadata_at(h, nm, NULL, NULL) == -ENOENT, "metadata past the count");
}

/* Serialize h's tensors and metadata and parse the result: the same header
 * must come back (offsets included: serialization lays tensors out in the
 * order given, which is h's data order). */
static void check_roundtrip(const ckpt_st_header *h)
{
	size_t nt = ckpt_st_tensor_count(h), nm = ckpt_st_metadata_count(h);
	struct ckpt_st_tensor_spec *specs = calloc(nt ? nt : 1, sizeof(*specs));
	const char **keys = calloc(nm ? nm : 1, sizeof(*keys));
	const char **vals = calloc(nm ? nm : 1, sizeof(*vals));
	ckpt_st_header *h2 = NULL;
	uint8_t *buf = NULL;
	size_t len = 0;
	uint64_t n2;
	char err[256];
	int r;

	if (!specs || !keys || !vals)
		goto out;
	for (size_t i = 0; i < nt; i++) {
		const struct ckpt_st_tensor *t = ckpt_st_tensor_at(h, i);

		specs[i] = (struct ckpt_st_tensor_spec){ t->name, t->dtype, t->ndim, t->shape };
	}
	for (size_t i = 0; i < nm; i++)
		ckpt_st_metadata_at(h, i, &keys[i], &vals[i]);
	r = ckpt_st_serialize(specs, nt, keys, vals, nm, &buf, &len);
	if (r == -ENOMEM || r == -E2BIG)
		goto out;
	FUZZ_CHECK(r == 0, "serialize of a parsed header: %d", r);
	FUZZ_CHECK(len % 8 == 0 && len >= CKPT_ST_PREFIX_LEN, "serialized length %zu", len);
	FUZZ_CHECK(ckpt_st_header_len(buf, &n2) == 0 && n2 == len - CKPT_ST_PREFIX_LEN,
		   "serialized prefix");
	r = ckpt_st_parse(buf + CKPT_ST_PREFIX_LEN, len - CKPT_ST_PREFIX_LEN, &h2, err,
			  sizeof(err));
	if (r == -ENOMEM)
		goto out;
	FUZZ_CHECK(r == 0, "serialized header does not parse: %s", err);
	FUZZ_CHECK(ckpt_st_tensor_count(h2) == nt && ckpt_st_metadata_count(h2) == nm,
		   "counts after the round trip");
	for (size_t i = 0; i < nt; i++) {
		const struct ckpt_st_tensor *a = ckpt_st_tensor_at(h, i), *b = ckpt_st_tensor_at(h2, i);

		FUZZ_CHECK(strcmp(a->name, b->name) == 0 && a->dtype == b->dtype &&
				   a->ndim == b->ndim && a->begin == b->begin && a->end == b->end &&
				   (a->ndim == 0 ||
				    memcmp(a->shape, b->shape, a->ndim * sizeof(*a->shape)) == 0),
			   "tensor %zu ('%s') changed in the round trip", i, a->name);
	}
	for (size_t i = 0; i < nm; i++) {
		const char *k, *v;

		ckpt_st_metadata_at(h2, i, &k, &v);
		FUZZ_CHECK(strcmp(k, keys[i]) == 0 && strcmp(v, vals[i]) == 0,
			   "metadata '%s' changed in the round trip", keys[i]);
	}
out:
	ckpt_st_header_free(h2);
	free(buf);
	free(specs);
	free(keys);
	free(vals);
}

static void check_shardmeta(const ckpt_st_header *h)
{
	ckpt_shardmeta *m = NULL;
	char err[256];
	int r = ckpt_shardmeta_parse(h, &m, err, sizeof(err));

	if (r < 0) {
		FUZZ_CHECK(m == NULL && err[0], "refused sharding metadata without a reason");
		fuzz_check_err_line(err);
		return;
	}
	for (size_t i = 0; i < ckpt_st_tensor_count(h); i++) {
		const struct ckpt_st_tensor *t = ckpt_st_tensor_at(h, i);
		struct ckpt_tensor_meta tm;

		r = ckpt_shardmeta_tensor(m, t, &tm);
		/* only a whole tensor of more than CKPT_MAX_DIMS dims has no geometry */
		FUZZ_CHECK(r == 0 || (r == -EINVAL && t->ndim > CKPT_MAX_DIMS),
			   "tensor '%s': %d", t->name, r);
	}
	ckpt_shardmeta_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ckpt_st_header *h = (ckpt_st_header *)data; /* must be reset by the parser */
	char err[256];
	int r;

	r = ckpt_st_parse(data, size, &h, err, sizeof(err));
	if (r < 0) {
		FUZZ_CHECK(h == NULL, "header left set on error");
		FUZZ_CHECK(r == -EINVAL || r == -ENOMEM, "error %d", r);
		FUZZ_CHECK(err[0] != '\0', "refused without a reason");
		fuzz_check_err_line(err);
		return 0;
	}
	FUZZ_CHECK(err[0] == '\0', "accepted with a reason: %s", err);
	check_header(h, size);
	check_roundtrip(h);
	check_shardmeta(h);
	ckpt_st_header_free(h);
	return 0;
}
