/* SPDX-License-Identifier: MIT */
/*
 * safetensors.h - parse, validate and synthesize safetensors headers.
 *
 * File layout: an 8-byte little-endian u64 N, N bytes of UTF-8 JSON (the
 * header), then the data area.  The header maps tensor names to
 * {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the
 * start of the data area) plus an optional "__metadata__" string->string map.
 *
 * Validation follows the reference implementation (huggingface/safetensors,
 * SafeTensors::read_metadata + Metadata::validate):
 *   - 2 <= N <= CKPT_ST_MAX_HEADER, header is valid UTF-8, first byte is '{'
 *     (trailing JSON whitespace is allowed padding), JSON parsed by jansson
 *     with duplicate keys rejected at every level, top level an object;
 *   - every tensor entry is an object with a known "dtype" string, a "shape"
 *     array of non-negative integers and a "data_offsets" array of exactly two
 *     non-negative integers; unknown extra fields are ignored;
 *   - "__metadata__" is absent, null, or an object whose values are strings;
 *   - tensors sorted by (begin, end) (ties by name) must tile the data area
 *     from offset 0 without holes or overlap, begin <= end, and
 *     end - begin == product(shape) * bits(dtype) / 8, with overflow checks
 *     (a running checked product, as the reference does) and the bit count a
 *     multiple of 8;
 *   - the file size equals 8 + N + data_len (ckpt_st_check_file_size).
 *
 * Known divergences from the reference; (a) and (e) accept what it rejects,
 * the others reject what it accepts:
 *   (a) jansson reads "-0" as the integer 0, the reference rejects it;
 *   (b) integers >= 2^63 fail to parse in jansson (json_int_t is int64), the
 *       reference accepts them up to 2^64-1 (only ever valid in a shape that
 *       holds a 0 before the running product overflows, or inside ignored
 *       unknown fields);
 *   (c) "\u0000" in any JSON string is rejected (names are C strings);
 *   (d) serde's alternative encodings (a tensor entry given as a JSON array
 *       ["F32", [..], [b, e]], a dtype given as {"F32": null}) are rejected;
 *   (e) nesting depth inside ignored unknown fields is limited by jansson
 *       (2048) instead of serde_json (128): deeper-than-128 is accepted.
 *   Sub-byte dtypes (F4, F6_E2M3, F6_E3M2) and F8_E8M0, C64 are accepted with
 *   the reference's bit-size rules.
 *
 * Thread-safety: no global mutable state.  A parsed ckpt_st_header is
 * immutable; any number of threads may call the accessors on it concurrently.
 * All strings and arrays reachable from a header are owned by it and stay
 * valid until ckpt_st_header_free().
 */
#ifndef CKPT_SAFETENSORS_H
#define CKPT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

/* Largest accepted header length N (bytes), same as the reference. */
#define CKPT_ST_MAX_HEADER 100000000ULL
/* Size of the little-endian length prefix. */
#define CKPT_ST_PREFIX_LEN 8

/*
 * Element types.  In-memory only: the values may be renumbered at any time;
 * anything persisted must use ckpt_dtype_name().  F4, F6_E2M3, F6_E3M2 are
 * sub-byte types (4/6 bits per element, bit-packed); a tensor of those types
 * is valid only when product(shape) * bits is a multiple of 8.
 */
enum ckpt_dtype {
	CKPT_DT_BOOL,
	CKPT_DT_F4,
	CKPT_DT_F6_E2M3,
	CKPT_DT_F6_E3M2,
	CKPT_DT_U8,
	CKPT_DT_I8,
	CKPT_DT_F8_E5M2,
	CKPT_DT_F8_E4M3,
	CKPT_DT_F8_E8M0,
	CKPT_DT_I16,
	CKPT_DT_U16,
	CKPT_DT_F16,
	CKPT_DT_BF16,
	CKPT_DT_I32,
	CKPT_DT_U32,
	CKPT_DT_F32,
	CKPT_DT_C64,
	CKPT_DT_F64,
	CKPT_DT_I64,
	CKPT_DT_U64,
	CKPT_DT_NR, /* number of dtypes, not a dtype */
};

/* Name as written in safetensors headers ("BF16"), or NULL if dt is not a
 * valid dtype.  Returns a static string. */
const char *ckpt_dtype_name(enum ckpt_dtype dt);

/* A shape (or multi-index) for an error message: "[3, 4]", truncated to
 * len; past CKPT_ST_SHAPE_FMT_DIMS dims, ", ..." stands for the rest. */
#define CKPT_ST_SHAPE_FMT_DIMS 8
void ckpt_st_fmt_shape(char *buf, size_t len, const uint64_t *shape, unsigned ndim);

/* Look up a dtype by its exact (case-sensitive) name.
 * Returns 0 and sets *ret_dt, or -EINVAL if name is NULL or unknown. */
int ckpt_dtype_from_name(const char *name, enum ckpt_dtype *ret_dt);

/* Bits per element (4 for F4, 6 for F6_*, 8 for BOOL, 16 for BF16, 64 for C64),
 * or 0 if dt is not a valid dtype. */
unsigned ckpt_dtype_bits(enum ckpt_dtype dt);

/* One tensor of a parsed header.  Read-only for callers; owned by the header. */
struct ckpt_st_tensor {
	const char *name;	/* NUL-terminated UTF-8 */
	enum ckpt_dtype dtype;
	unsigned ndim;
	const uint64_t *shape;	/* ndim entries (may be NULL when ndim == 0) */
	uint64_t begin, end;	/* byte offsets relative to the data area */
};

typedef struct ckpt_st_header ckpt_st_header; /* opaque */

/*
 * Decode N from the first 8 bytes of a file.
 * Returns 0 and sets *ret_n, or -EINVAL if N > CKPT_ST_MAX_HEADER or N < 2
 * (*ret_n is still set to the decoded value so callers can log it).
 */
int ckpt_st_header_len(const uint8_t prefix[8], uint64_t *ret_n);

/*
 * Parse and validate the header JSON json[0..n) (the N bytes after the
 * prefix; need not be NUL-terminated; not retained after return).
 * On success returns 0 and stores a new header in *ret_header (caller frees
 * with ckpt_st_header_free()); if errbuf != NULL and errlen > 0, errbuf is
 * set to "".
 * Errors: -EINVAL for any invalid header (including n out of range and NULL
 * arguments), -ENOMEM on allocation failure (jansson reports some of its own
 * allocation failures as syntax errors; those surface as -EINVAL).  On error
 * *ret_header is set to NULL and, if errbuf != NULL and errlen > 0, a
 * one-line NUL-terminated reason (truncated to errlen; control characters,
 * e.g. from tensor names, replaced by '?') is written to errbuf.
 * Cost: O(n + T log T) for T tensors.
 */
int ckpt_st_parse(const uint8_t *json, size_t n, ckpt_st_header **ret_header,
		  char *errbuf, size_t errlen);

/* Free a header and everything it owns.  Accepts NULL. */
void ckpt_st_header_free(ckpt_st_header *h);

/* Number of tensors (0 if h is NULL). */
size_t ckpt_st_tensor_count(const ckpt_st_header *h);

/* i-th tensor in data order (sorted by begin, then end, then name), or NULL
 * if h is NULL or i >= count. */
const struct ckpt_st_tensor *ckpt_st_tensor_at(const ckpt_st_header *h, size_t i);

/* Tensor by exact name (O(log T) binary search), or NULL if absent or if h or
 * name is NULL. */
const struct ckpt_st_tensor *ckpt_st_tensor_find(const ckpt_st_header *h, const char *name);

/* Length of the data area: end of the last tensor (0 if none or h is NULL). */
uint64_t ckpt_st_data_len(const ckpt_st_header *h);

/* N as parsed (the header length passed to ckpt_st_parse); 0 if h is NULL. */
uint64_t ckpt_st_header_n(const ckpt_st_header *h);

/* Returns 0 if file_size == 8 + N + data_len, else -EINVAL (also for NULL h
 * or if the sum overflows). */
int ckpt_st_check_file_size(const ckpt_st_header *h, uint64_t file_size);

/* Value of __metadata__[key], or NULL if absent (or h/key NULL).
 * O(log M).  The string is owned by h. */
const char *ckpt_st_metadata_get(const ckpt_st_header *h, const char *key);

/* Number of __metadata__ entries (0 when absent or null, or h NULL). */
size_t ckpt_st_metadata_count(const ckpt_st_header *h);

/*
 * i-th __metadata__ entry, in strcmp() order of keys.  Sets *ret_key and
 * *ret_value (either may be NULL if not wanted; strings owned by h).
 * Returns 0, -EINVAL if h is NULL, -ENOENT if i >= count.
 */
int ckpt_st_metadata_at(const ckpt_st_header *h, size_t i, const char **ret_key,
			const char **ret_value);

/* A tensor to serialize: data offsets are assigned by ckpt_st_serialize(). */
struct ckpt_st_tensor_spec {
	const char *name;
	enum ckpt_dtype dtype;
	unsigned ndim;
	const uint64_t *shape;	/* ndim entries; may be NULL when ndim == 0 */
};

/*
 * Build a safetensors prefix + header for the given tensors and metadata.
 * Data offsets are assigned contiguously from 0 in the order given (the data
 * area must then hold the tensors in that order).  "__metadata__" is written
 * first and only if nmeta > 0; metadata keys/values are written in the order
 * given.  Output: 8-byte little-endian N, then compact JSON starting with
 * '{', padded with spaces so that 8 + N is a multiple of 8.  The result
 * parses with ckpt_st_parse().
 * On success returns 0, *ret_buf is a malloc'd buffer (caller free()s) of
 * *ret_len bytes.  The inputs are not retained.
 * Errors (nothing allocated, *ret_buf = NULL, *ret_len = 0):
 *   -EINVAL   NULL output pointers; NULL arrays with a non-zero count; a NULL
 *             or non-UTF-8 name/key/value; a tensor named "__metadata__";
 *             duplicate tensor names or metadata keys; unknown dtype; ndim > 0
 *             with NULL shape; a sub-byte tensor whose bit count is not a
 *             multiple of 8;
 *   -EOVERFLOW element/byte counts or offsets overflow, or a shape value or
 *             offset exceeds INT64_MAX (not representable for the parser);
 *   -E2BIG    the header would exceed CKPT_ST_MAX_HEADER;
 *   -ENOMEM   allocation failure.
 * Thread-safe (no shared state).
 */
int ckpt_st_serialize(const struct ckpt_st_tensor_spec *tensors, size_t ntensors,
		      const char *const *meta_keys, const char *const *meta_values, size_t nmeta,
		      uint8_t **ret_buf, size_t *ret_len);

#endif
