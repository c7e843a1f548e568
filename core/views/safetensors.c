/* SPDX-License-Identifier: MIT */
/*
 * safetensors.c - safetensors header parser/validator (jansson) and header
 * serializer.  See safetensors.h for the contract.
 *
 * A parsed header lives in one allocation: the struct, the tensors in data
 * order, an index of tensor pointers in name order, the metadata pairs in key
 * order, all shape arrays, then all strings.  Freeing is a single free().
 */
#include "views/safetensors.h"
#include "base/jalloc.h"
#include "base/util.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ST_METADATA_KEY "__metadata__"

struct st_meta {
	const char *key;
	const char *value;
};

struct ckpt_st_header {
	uint64_t n;
	uint64_t data_len;
	size_t ntensors;
	size_t nmeta;
	struct ckpt_st_tensor *tensors;		/* data order */
	const struct ckpt_st_tensor **by_name;	/* strcmp order of names */
	struct st_meta *meta;			/* strcmp order of keys */
};

static const struct {
	const char *name;
	unsigned bits;
} dtypes[CKPT_DT_NR] = {
	[CKPT_DT_BOOL] = { "BOOL", 8 },
	[CKPT_DT_F4] = { "F4", 4 },
	[CKPT_DT_F6_E2M3] = { "F6_E2M3", 6 },
	[CKPT_DT_F6_E3M2] = { "F6_E3M2", 6 },
	[CKPT_DT_U8] = { "U8", 8 },
	[CKPT_DT_I8] = { "I8", 8 },
	[CKPT_DT_F8_E5M2] = { "F8_E5M2", 8 },
	[CKPT_DT_F8_E4M3] = { "F8_E4M3", 8 },
	[CKPT_DT_F8_E8M0] = { "F8_E8M0", 8 },
	[CKPT_DT_I16] = { "I16", 16 },
	[CKPT_DT_U16] = { "U16", 16 },
	[CKPT_DT_F16] = { "F16", 16 },
	[CKPT_DT_BF16] = { "BF16", 16 },
	[CKPT_DT_I32] = { "I32", 32 },
	[CKPT_DT_U32] = { "U32", 32 },
	[CKPT_DT_F32] = { "F32", 32 },
	[CKPT_DT_C64] = { "C64", 64 },
	[CKPT_DT_F64] = { "F64", 64 },
	[CKPT_DT_I64] = { "I64", 64 },
	[CKPT_DT_U64] = { "U64", 64 },
};

const char *ckpt_dtype_name(enum ckpt_dtype dt)
{
	if ((unsigned)dt >= CKPT_DT_NR)
		return NULL;
	return dtypes[dt].name;
}

int ckpt_dtype_from_name(const char *name, enum ckpt_dtype *ret_dt)
{
	if (!name)
		return -EINVAL;
	for (unsigned i = 0; i < CKPT_DT_NR; i++) {
		if (strcmp(dtypes[i].name, name) == 0) {
			if (ret_dt)
				*ret_dt = (enum ckpt_dtype)i;
			return 0;
		}
	}
	return -EINVAL;
}

unsigned ckpt_dtype_bits(enum ckpt_dtype dt)
{
	if ((unsigned)dt >= CKPT_DT_NR)
		return 0;
	return dtypes[dt].bits;
}

/* ---- error reporting ---------------------------------------------------- */

struct st_err {
	char *buf;
	size_t len;
};

#define st_seterr(e, ...) ckpt_errf((e)->buf, (e)->len, __VA_ARGS__)

void ckpt_st_fmt_shape(char *buf, size_t len, const uint64_t *shape, unsigned ndim)
{
	size_t pos = 0;
	int w;

	w = snprintf(buf, len, "[");
	for (unsigned i = 0; i < ndim && w >= 0; i++) {
		pos += (size_t)w;
		if (pos >= len)
			return;
		if (i == CKPT_ST_SHAPE_FMT_DIMS) {
			w = snprintf(buf + pos, len - pos, ", ...");
			break;
		}
		w = snprintf(buf + pos, len - pos, "%s%llu", i ? ", " : "",
			     (unsigned long long)shape[i]);
	}
	if (w < 0)
		return;
	pos += (size_t)w;
	if (pos < len)
		snprintf(buf + pos, len - pos, "]");
}

/* ---- UTF-8 -------------------------------------------------------------- */

/* Strict UTF-8 check (no overlongs, no surrogates, max U+10FFFF), the same
 * rules as Rust's str::from_utf8.  Returns n if valid, else the offset of the
 * first byte of the first invalid sequence. */
static size_t st_utf8_check(const uint8_t *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		uint8_t c = s[i];
		uint8_t lo = 0x80, hi = 0xbf;
		size_t need;

		if (c < 0x80) {
			/* ASCII fast path, 8 bytes at a time. */
			while (i + 8 <= n) {
				uint64_t w;

				memcpy(&w, s + i, 8);
				if (w & 0x8080808080808080ULL)
					break;
				i += 8;
			}
			while (i < n && s[i] < 0x80)
				i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf) {
			need = 1;
		} else if (c >= 0xe0 && c <= 0xef) {
			need = 2;
			if (c == 0xe0)
				lo = 0xa0;
			else if (c == 0xed)
				hi = 0x9f;
		} else if (c >= 0xf0 && c <= 0xf4) {
			need = 3;
			if (c == 0xf0)
				lo = 0x90;
			else if (c == 0xf4)
				hi = 0x8f;
		} else {
			return i;
		}
		if (n - i - 1 < need)
			return i;
		if (s[i + 1] < lo || s[i + 1] > hi)
			return i;
		for (size_t k = 2; k <= need; k++)
			if (s[i + k] < 0x80 || s[i + k] > 0xbf)
				return i;
		i += need + 1;
	}
	return n;
}

/* ---- parsing ------------------------------------------------------------ */

/*
 * jansson parses the whole header (see st_scan()); for a header of many
 * tensors most of the cost is jansson's node allocation, so callers that
 * open such files often should cache the parsed header.
 */

#define ST_JSON_FLAGS (JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK | JSON_REJECT_DUPLICATES)

/* A tensor while scanning; offsets into the builder's pools. */
struct st_tmp {
	size_t name_off;
	size_t dim_off;
	unsigned ndim;
	enum ckpt_dtype dtype;
	uint64_t begin, end;
};

struct st_builder {
	struct st_tmp *t;
	size_t nt, cap_t;
	uint64_t *dims;
	size_t nd, cap_d;
	char *str;		/* NUL-terminated tensor names, back to back */
	size_t ns, cap_s;
	json_t *meta;		/* owned; NULL when absent or null */
	size_t meta_bytes;	/* keys + values + NULs */
	bool seen_meta;
};

/* Make room for need elements of *pp (capacity *cap); false on failure. */
static bool st_grow(void **pp, size_t *cap, size_t need, size_t elem)
{
	size_t ncap = *cap ? *cap : 64, bytes;
	void *p;

	if (need <= *cap)
		return true;
	while (ncap < need)
		if (__builtin_mul_overflow(ncap, 2, &ncap))
			return false;
	if (__builtin_mul_overflow(ncap, elem, &bytes))
		return false;
	p = realloc(*pp, bytes);
	if (!p)
		return false;
	*pp = p;
	*cap = ncap;
	return true;
}

static bool st_is_uint(const json_t *v)
{
	return json_is_integer(v) && json_integer_value(v) >= 0;
}

/* Type-check one tensor entry; return its dtype. */
static int st_check_entry(const char *name, json_t *v, enum ckpt_dtype *ret_dt,
			  struct st_err *e)
{
	json_t *dt, *shape, *offs, *x;
	size_t i;

	if (!json_is_object(v)) {
		st_seterr(e, "tensor '%s': entry is not an object", name);
		return -EINVAL;
	}
	dt = json_object_get(v, "dtype");
	shape = json_object_get(v, "shape");
	offs = json_object_get(v, "data_offsets");
	if (!dt || !shape || !offs) {
		st_seterr(e, "tensor '%s': missing field '%s'", name,
			  !dt ? "dtype" : !shape ? "shape" : "data_offsets");
		return -EINVAL;
	}
	if (!json_is_string(dt)) {
		st_seterr(e, "tensor '%s': dtype is not a string", name);
		return -EINVAL;
	}
	if (ckpt_dtype_from_name(json_string_value(dt), ret_dt) < 0) {
		st_seterr(e, "tensor '%s': unknown dtype '%s'", name, json_string_value(dt));
		return -EINVAL;
	}
	if (!json_is_array(shape)) {
		st_seterr(e, "tensor '%s': shape is not an array", name);
		return -EINVAL;
	}
	json_array_foreach(shape, i, x) {
		if (!st_is_uint(x)) {
			st_seterr(e, "tensor '%s': shape[%zu] is not a non-negative integer",
				  name, i);
			return -EINVAL;
		}
	}
	if (!json_is_array(offs) || json_array_size(offs) != 2) {
		st_seterr(e, "tensor '%s': data_offsets is not an array of 2 integers", name);
		return -EINVAL;
	}
	json_array_foreach(offs, i, x) {
		if (!st_is_uint(x)) {
			st_seterr(e, "tensor '%s': data_offsets[%zu] is not a non-negative integer",
				  name, i);
			return -EINVAL;
		}
	}
	return 0;
}

/* name[0..namelen) need not be NUL-terminated. */
static int st_add_tensor(struct st_builder *b, const char *name, size_t namelen, json_t *v,
			 struct st_err *e)
{
	struct st_tmp *t;
	json_t *shape, *offs, *x;
	enum ckpt_dtype dt;
	size_t ndim, i;
	char *cname;
	void *p;
	int r;

	/* Copy the name first: it is needed NUL-terminated for messages. */
	p = b->str;
	if (!st_grow(&p, &b->cap_s, b->ns + namelen + 1, 1))
		return -ENOMEM;
	b->str = p;
	cname = b->str + b->ns;
	memcpy(cname, name, namelen);
	cname[namelen] = '\0';

	r = st_check_entry(cname, v, &dt, e);
	if (r < 0)
		return r;
	shape = json_object_get(v, "shape");
	offs = json_object_get(v, "data_offsets");
	ndim = json_array_size(shape);
	if (ndim > UINT_MAX) {
		st_seterr(e, "tensor '%s': too many dimensions", cname);
		return -EINVAL;
	}
	p = b->t;
	if (!st_grow(&p, &b->cap_t, b->nt + 1, sizeof(*b->t)))
		return -ENOMEM;
	b->t = p;
	p = b->dims;
	if (!st_grow(&p, &b->cap_d, b->nd + ndim, sizeof(*b->dims)))
		return -ENOMEM;
	b->dims = p;

	t = &b->t[b->nt++];
	t->name_off = b->ns;
	t->dim_off = b->nd;
	t->ndim = (unsigned)ndim;
	t->dtype = dt;
	t->begin = (uint64_t)json_integer_value(json_array_get(offs, 0));
	t->end = (uint64_t)json_integer_value(json_array_get(offs, 1));
	json_array_foreach(shape, i, x)
		b->dims[b->nd++] = (uint64_t)json_integer_value(x);
	b->ns += namelen + 1;
	return 0;
}

static int st_add_meta(struct st_builder *b, json_t *v, struct st_err *e)
{
	const char *k;
	json_t *x;

	if (b->seen_meta) {
		st_seterr(e, "duplicate key '" ST_METADATA_KEY "'");
		return -EINVAL;
	}
	b->seen_meta = true;
	if (json_is_null(v))
		return 0;
	if (!json_is_object(v)) {
		st_seterr(e, ST_METADATA_KEY " is not an object");
		return -EINVAL;
	}
	json_object_foreach(v, k, x) {
		if (!json_is_string(x)) {
			st_seterr(e, ST_METADATA_KEY " value for key '%s' is not a string", k);
			return -EINVAL;
		}
		b->meta_bytes += strlen(k) + json_string_length(x) + 2;
	}
	b->meta = json_incref(v);
	return 0;
}

static size_t st_skip_ws(const uint8_t *s, size_t n, size_t pos)
{
	while (pos < n && (s[pos] == ' ' || s[pos] == '\t' || s[pos] == '\n' || s[pos] == '\r'))
		pos++;
	return pos;
}

/* jansson-parse the JSON value starting at json[*pos]; advance *pos past it. */
static int st_load(const uint8_t *json, size_t n, size_t *pos, json_t **ret_v,
		   struct st_err *e)
{
	json_error_t jerr;
	json_t *v;

	v = json_loadb((const char *)json + *pos, n - *pos, ST_JSON_FLAGS, &jerr);
	if (!v) {
		/* jansson 2.14 returns NULL with an empty message (and no error
		 * code set) when its lexer buffer cannot be allocated. */
		if (!jerr.text[0] || json_error_code(&jerr) == json_error_out_of_memory)
			return -ENOMEM;
		st_seterr(e, "invalid JSON at byte %zu: %s", *pos + (size_t)jerr.position,
			  jerr.text);
		return -EINVAL;
	}
	*pos += (size_t)jerr.position;	/* bytes consumed, set on success too */
	*ret_v = v;
	return 0;
}

/*
 * Parse the whole header with jansson (one json_loadb of the document; no
 * hand-written tokenizing: the issue requires a maintained JSON library),
 * then convert each entry.  Duplicate top-level keys are rejected by jansson
 * (JSON_REJECT_DUPLICATES); trailing bytes other than whitespace are
 * rejected below.
 */
static int st_scan(const uint8_t *json, size_t n, struct st_builder *b, struct st_err *e)
{
	json_t *root = NULL, *val;
	const char *kname;
	size_t pos = 0;
	int r;

	r = st_load(json, n, &pos, &root, e);
	if (r < 0)
		return r;
	if (!json_is_object(root)) {
		st_seterr(e, "header is not a JSON object");
		r = -EINVAL;
		goto out;
	}
	pos = st_skip_ws(json, n, pos);
	if (pos != n) {
		st_seterr(e, "invalid JSON at byte %zu: trailing characters after the object",
			  pos);
		r = -EINVAL;
		goto out;
	}
	json_object_foreach(root, kname, val) {
		size_t klen = strlen(kname);

		if (klen == strlen(ST_METADATA_KEY) && memcmp(kname, ST_METADATA_KEY, klen) == 0)
			r = st_add_meta(b, val, e);
		else
			r = st_add_tensor(b, kname, klen, val, e);
		if (r < 0)
			goto out;
	}
out:
	json_decref(root);
	return r;
}

/* Reserve count * size bytes at alignment align; return the offset. */
static bool st_reserve(size_t *off, size_t count, size_t size, size_t align, size_t *ret_at)
{
	size_t bytes, at;

	if (__builtin_add_overflow(*off, align - 1, &at))
		return false;
	at &= ~(align - 1);
	if (__builtin_mul_overflow(count, size, &bytes) ||
	    __builtin_add_overflow(at, bytes, off))
		return false;
	*ret_at = at;
	return true;
}

static int st_cmp_data(const void *a, const void *b)
{
	const struct ckpt_st_tensor *x = a, *y = b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return strcmp(x->name, y->name);
}

static int st_cmp_name(const void *a, const void *b)
{
	const struct ckpt_st_tensor *const *x = a, *const *y = b;

	return strcmp((*x)->name, (*y)->name);
}

static int st_cmp_meta(const void *a, const void *b)
{
	const struct st_meta *x = a, *y = b;

	return strcmp(x->key, y->key);
}

static char *st_strcpy(char **sp, const char *s, size_t len)
{
	char *d = *sp;

	memcpy(d, s, len);
	d[len] = '\0';
	*sp += len + 1;
	return d;
}

/* Copy the builder into one allocation, sorted; reject duplicate names. */
static int st_finish(const struct st_builder *b, uint64_t n, ckpt_st_header **ret_h,
		     struct st_err *e)
{
	size_t off = sizeof(struct ckpt_st_header), nmeta = b->meta ? json_object_size(b->meta) : 0;
	size_t at_t, at_idx, at_meta, at_dims, at_str, strbytes;
	ckpt_st_header *h;
	uint64_t *dims;
	char *base, *str, *sp;

	if (__builtin_add_overflow(b->ns, b->meta_bytes, &strbytes) ||
	    !st_reserve(&off, b->nt, sizeof(*h->tensors), _Alignof(struct ckpt_st_tensor),
			&at_t) ||
	    !st_reserve(&off, b->nt, sizeof(*h->by_name), _Alignof(void *), &at_idx) ||
	    !st_reserve(&off, nmeta, sizeof(*h->meta), _Alignof(struct st_meta), &at_meta) ||
	    !st_reserve(&off, b->nd, sizeof(uint64_t), _Alignof(uint64_t), &at_dims) ||
	    !st_reserve(&off, strbytes, 1, 1, &at_str))
		return -ENOMEM;
	base = malloc(off);
	if (!base)
		return -ENOMEM;
	h = (ckpt_st_header *)base;
	h->n = n;
	h->data_len = 0;
	h->ntensors = b->nt;
	h->nmeta = nmeta;
	h->tensors = (struct ckpt_st_tensor *)(base + at_t);
	h->by_name = (const struct ckpt_st_tensor **)(base + at_idx);
	h->meta = (struct st_meta *)(base + at_meta);
	dims = (uint64_t *)(base + at_dims);
	str = base + at_str;
	if (b->nd)
		memcpy(dims, b->dims, b->nd * sizeof(*dims));
	if (b->ns)
		memcpy(str, b->str, b->ns);
	for (size_t i = 0; i < b->nt; i++) {
		const struct st_tmp *t = &b->t[i];

		h->tensors[i] = (struct ckpt_st_tensor){
			.name = str + t->name_off,
			.dtype = t->dtype,
			.ndim = t->ndim,
			.shape = t->ndim ? dims + t->dim_off : NULL,
			.begin = t->begin,
			.end = t->end,
		};
	}
	if (b->meta) {
		struct st_meta *m = h->meta;
		const char *k;
		json_t *v;

		sp = str + b->ns;
		json_object_foreach(b->meta, k, v) {
			m->key = st_strcpy(&sp, k, strlen(k));
			m->value = st_strcpy(&sp, json_string_value(v), json_string_length(v));
			m++;
		}
		qsort(h->meta, h->nmeta, sizeof(*h->meta), st_cmp_meta);
	}
	/* Writers usually emit tensors in data order; skip the sort then. */
	for (size_t i = 1; i < h->ntensors; i++) {
		if (st_cmp_data(&h->tensors[i - 1], &h->tensors[i]) > 0) {
			qsort(h->tensors, h->ntensors, sizeof(*h->tensors), st_cmp_data);
			break;
		}
	}
	for (size_t i = 0; i < h->ntensors; i++)
		h->by_name[i] = &h->tensors[i];
	qsort(h->by_name, h->ntensors, sizeof(*h->by_name), st_cmp_name);
	for (size_t i = 1; i < h->ntensors; i++) {
		if (strcmp(h->by_name[i - 1]->name, h->by_name[i]->name) == 0) {
			st_seterr(e, "duplicate tensor name '%s'", h->by_name[i]->name);
			free(h);
			return -EINVAL;
		}
	}
	*ret_h = h;
	return 0;
}

/* "tensor 'w': shape [3] of F32 <what>"; the shape is only formatted here. */
static void st_shape_err(struct st_err *e, const struct ckpt_st_tensor *t, const char *what)
{
	char sh[160];

	if (!e->buf || e->len == 0)
		return;
	ckpt_st_fmt_shape(sh, sizeof(sh), t->shape, t->ndim);
	st_seterr(e, "tensor '%s': shape %s of %s %s", t->name, sh, ckpt_dtype_name(t->dtype),
		  what);
}

/* Metadata::validate: tensors (in data order) tile [0, data_len). */
static int st_validate(ckpt_st_header *h, struct st_err *e)
{
	uint64_t start = 0;
	char what[80];

	for (size_t i = 0; i < h->ntensors; i++) {
		const struct ckpt_st_tensor *t = &h->tensors[i];
		unsigned long long b = t->begin, en = t->end;
		uint64_t nel = 1, nbits;

		if (t->end < t->begin) {
			st_seterr(e, "tensor '%s': data_offsets [%llu, %llu] end before they begin",
				  t->name, b, en);
			return -EINVAL;
		}
		if (t->begin != start) {
			if (i == 0)
				st_seterr(e, "tensor '%s': data_offsets [%llu, %llu] but the first "
					  "tensor must begin at 0", t->name, b, en);
			else
				st_seterr(e, "tensor '%s': data_offsets [%llu, %llu] %s previous "
					  "tensor '%s' ending at %llu", t->name, b, en,
					  t->begin > start ? "leave a hole after" : "overlap",
					  h->tensors[i - 1].name, (unsigned long long)start);
			return -EINVAL;
		}
		start = t->end;
		/* Running checked product, as the reference: [2^40, 2^40, 0] fails. */
		for (unsigned d = 0; d < t->ndim; d++) {
			if (__builtin_mul_overflow(nel, t->shape[d], &nel)) {
				st_shape_err(e, t, "overflows the element count");
				return -EINVAL;
			}
		}
		if (__builtin_mul_overflow(nel, (uint64_t)ckpt_dtype_bits(t->dtype), &nbits)) {
			st_shape_err(e, t, "overflows the bit count");
			return -EINVAL;
		}
		if (nbits % 8) {
			snprintf(what, sizeof(what), "is %llu bits, not whole bytes",
				 (unsigned long long)nbits);
			st_shape_err(e, t, what);
			return -EINVAL;
		}
		if (t->end - t->begin != nbits / 8) {
			snprintf(what, sizeof(what), "needs %llu bytes but data_offsets are "
				 "[%llu, %llu]", (unsigned long long)(nbits / 8), b, en);
			st_shape_err(e, t, what);
			return -EINVAL;
		}
	}
	h->data_len = start;
	return 0;
}

int ckpt_st_header_len(const uint8_t prefix[8], uint64_t *ret_n)
{
	uint64_t n;

	if (!prefix || !ret_n)
		return -EINVAL;
	n = ckpt_get_le64(prefix);
	*ret_n = n;
	if (n > CKPT_ST_MAX_HEADER || n < 2)
		return -EINVAL;
	return 0;
}

int ckpt_st_parse(const uint8_t *json, size_t n, ckpt_st_header **ret_header,
		  char *errbuf, size_t errlen)
{
	struct st_err e = { errbuf, errlen };
	struct st_builder b = { 0 };
	ckpt_st_header *h = NULL;
	size_t bad;
	int r;

	if (ret_header)
		*ret_header = NULL;
	if (!json || !ret_header) {
		st_seterr(&e, "invalid arguments");
		return -EINVAL;
	}
	if (n > CKPT_ST_MAX_HEADER) {
		st_seterr(&e, "header length %zu exceeds the maximum %llu", n, CKPT_ST_MAX_HEADER);
		return -EINVAL;
	}
	if (n < 2) {
		st_seterr(&e, "header length %zu is too small", n);
		return -EINVAL;
	}
	bad = st_utf8_check(json, n);
	if (bad != n) {
		st_seterr(&e, "header is not valid UTF-8 (byte %zu)", bad);
		return -EINVAL;
	}
	if (json[0] != '{') {
		st_seterr(&e, "header does not start with '{'");
		return -EINVAL;
	}
	ckpt_json_scope_begin();
	r = st_scan(json, n, &b, &e);
	if (r == 0)
		r = st_finish(&b, n, &h, &e);
	json_decref(b.meta);
	b.meta = NULL;
	ckpt_json_scope_end();
	if (r < 0)
		goto out;
	r = st_validate(h, &e);
out:
	free(b.t);
	free(b.dims);
	free(b.str);
	json_decref(b.meta);
	if (r < 0) {
		if (r == -ENOMEM)
			st_seterr(&e, "out of memory");
		ckpt_st_header_free(h);
		return r;
	}
	st_seterr(&e, "%s", "");
	*ret_header = h;
	return 0;
}

void ckpt_st_header_free(ckpt_st_header *h)
{
	free(h);
}

size_t ckpt_st_tensor_count(const ckpt_st_header *h)
{
	return h ? h->ntensors : 0;
}

const struct ckpt_st_tensor *ckpt_st_tensor_at(const ckpt_st_header *h, size_t i)
{
	if (!h || i >= h->ntensors)
		return NULL;
	return &h->tensors[i];
}

const struct ckpt_st_tensor *ckpt_st_tensor_find(const ckpt_st_header *h, const char *name)
{
	size_t lo = 0, hi;

	if (!h || !name)
		return NULL;
	hi = h->ntensors;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(name, h->by_name[mid]->name);

		if (c == 0)
			return h->by_name[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

uint64_t ckpt_st_data_len(const ckpt_st_header *h)
{
	return h ? h->data_len : 0;
}

uint64_t ckpt_st_header_n(const ckpt_st_header *h)
{
	return h ? h->n : 0;
}

int ckpt_st_check_file_size(const ckpt_st_header *h, uint64_t file_size)
{
	uint64_t want;

	if (!h)
		return -EINVAL;
	if (__builtin_add_overflow(h->n, (uint64_t)CKPT_ST_PREFIX_LEN, &want) ||
	    __builtin_add_overflow(want, h->data_len, &want))
		return -EINVAL;
	return want == file_size ? 0 : -EINVAL;
}

const char *ckpt_st_metadata_get(const ckpt_st_header *h, const char *key)
{
	size_t lo = 0, hi;

	if (!h || !key)
		return NULL;
	hi = h->nmeta;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(key, h->meta[mid].key);

		if (c == 0)
			return h->meta[mid].value;
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

size_t ckpt_st_metadata_count(const ckpt_st_header *h)
{
	return h ? h->nmeta : 0;
}

int ckpt_st_metadata_at(const ckpt_st_header *h, size_t i, const char **ret_key,
			const char **ret_value)
{
	if (!h)
		return -EINVAL;
	if (i >= h->nmeta)
		return -ENOENT;
	if (ret_key)
		*ret_key = h->meta[i].key;
	if (ret_value)
		*ret_value = h->meta[i].value;
	return 0;
}

/* ---- serializing -------------------------------------------------------- */

/*
 * The header is emitted directly (only escaping is needed; every emitted
 * value is a string or an integer), which avoids building and dumping a
 * jansson tree of every tensor.  The output is checked by the tests through
 * ckpt_st_parse(), i.e. by jansson.
 */

struct st_sb {
	char *buf;
	size_t len, cap;
	bool oom;
};

/* Make room for len more bytes (sb->oom on failure). */
static __attribute__((noinline)) void st_sb_grow(struct st_sb *sb, size_t len)
{
	size_t ncap = sb->cap ? sb->cap : 256;
	char *nb;

	while (ncap - sb->len < len) {
		if (__builtin_mul_overflow(ncap, 2, &ncap)) {
			sb->oom = true;
			return;
		}
	}
	nb = realloc(sb->buf, ncap);
	if (!nb) {
		sb->oom = true;
		return;
	}
	sb->buf = nb;
	sb->cap = ncap;
}

/* Room for len more bytes; false once out of memory. */
static inline bool st_sb_reserve(struct st_sb *sb, size_t len)
{
	if (!sb->oom && len > sb->cap - sb->len)
		st_sb_grow(sb, len);
	return !sb->oom;
}

/* Inline so that the copies of short literals are inlined too. */
static inline void st_sb_put(struct st_sb *sb, const char *s, size_t len)
{
	if (!st_sb_reserve(sb, len))
		return;
	memcpy(sb->buf + sb->len, s, len);
	sb->len += len;
}

static inline void st_sb_puts(struct st_sb *sb, const char *s)
{
	st_sb_put(sb, s, strlen(s));
}

static void st_sb_u64(struct st_sb *sb, uint64_t v)
{
	char tmp[CKPT_U64_DEC_MAX];
	size_t n = ckpt_u64_dec(v, tmp);

	st_sb_put(sb, tmp + sizeof(tmp) - n, n);
}

/* Second character of the two-character JSON escape of c, or 0 if none. */
static char st_short_escape(unsigned char c)
{
	switch (c) {
	case '"':
		return '"';
	case '\\':
		return '\\';
	case '\b':
		return 'b';
	case '\f':
		return 'f';
	case '\n':
		return 'n';
	case '\r':
		return 'r';
	case '\t':
		return 't';
	default:
		return 0;
	}
}

/* JSON string literal; s is valid UTF-8 (checked by the caller). */
static void st_sb_jstr(struct st_sb *sb, const char *s)
{
	static const char hex[] = "0123456789abcdef";
	size_t need = 2;
	char *o;

	/* exact size first (a ckptfs metadata string is JSON: it escapes a
	 * quote every few bytes), then one tight loop */
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		need += *p >= 0x20 && *p != '"' && *p != '\\' ? 1 : st_short_escape(*p) ? 2 : 6;
	if (!st_sb_reserve(sb, need))
		return;
	o = sb->buf + sb->len;
	*o++ = '"';
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		char e;

		if (c >= 0x20 && c != '"' && c != '\\') {
			*o++ = (char)c;
			continue;
		}
		*o++ = '\\';
		e = st_short_escape(c);
		if (e) {
			*o++ = e;
		} else {
			*o++ = 'u';
			*o++ = '0';
			*o++ = '0';
			*o++ = hex[c >> 4];
			*o++ = hex[c & 15];
		}
	}
	*o++ = '"';
	sb->len = (size_t)(o - sb->buf);
}

static bool st_valid_cstr(const char *s)
{
	size_t len;

	if (!s)
		return false;
	len = strlen(s);
	return st_utf8_check((const uint8_t *)s, len) == len;
}

/* Byte size of a tensor spec; -EINVAL/-EOVERFLOW as documented. */
static int st_spec_bytes(const struct ckpt_st_tensor_spec *s, uint64_t *ret_bytes)
{
	unsigned bits = ckpt_dtype_bits(s->dtype);
	uint64_t nel = 1, nbits;

	if (!st_valid_cstr(s->name) || strcmp(s->name, ST_METADATA_KEY) == 0 || !bits ||
	    (s->ndim && !s->shape))
		return -EINVAL;
	for (unsigned d = 0; d < s->ndim; d++)
		if (s->shape[d] > INT64_MAX || __builtin_mul_overflow(nel, s->shape[d], &nel))
			return -EOVERFLOW;
	if (__builtin_mul_overflow(nel, (uint64_t)bits, &nbits))
		return -EOVERFLOW;
	if (nbits % 8)
		return -EINVAL;
	*ret_bytes = nbits / 8;
	return 0;
}

static int st_ser_check(const struct ckpt_st_tensor_spec *tensors, size_t ntensors,
			const char *const *keys, const char *const *values, size_t nmeta)
{
	uint64_t off = 0, bytes;
	int r;

	for (size_t i = 0; i < ntensors; i++) {
		r = st_spec_bytes(&tensors[i], &bytes);
		if (r < 0)
			return r;
		if (__builtin_add_overflow(off, bytes, &off) || off > INT64_MAX)
			return -EOVERFLOW;
	}
	for (size_t i = 0; i < nmeta; i++)
		if (!st_valid_cstr(keys[i]) || !st_valid_cstr(values[i]))
			return -EINVAL;
	if (ntensors > 1) {
		r = ckpt_check_unique_strs(&tensors[0].name, sizeof(*tensors), ntensors);
		if (r < 0)
			return r;
	}
	return nmeta > 1 ? ckpt_check_unique_strs(keys, sizeof(*keys), nmeta) : 0;
}

int ckpt_st_serialize(const struct ckpt_st_tensor_spec *tensors, size_t ntensors,
		      const char *const *meta_keys, const char *const *meta_values, size_t nmeta,
		      uint8_t **ret_buf, size_t *ret_len)
{
	static const char zeros[CKPT_ST_PREFIX_LEN];
	struct st_sb sb = { 0 };
	uint64_t off = 0, bytes;
	size_t n;
	int r;

	if (ret_buf)
		*ret_buf = NULL;
	if (ret_len)
		*ret_len = 0;
	if (!ret_buf || !ret_len || (ntensors && !tensors) ||
	    (nmeta && (!meta_keys || !meta_values)))
		return -EINVAL;
	r = st_ser_check(tensors, ntensors, meta_keys, meta_values, nmeta);
	if (r < 0)
		return r;

	{
		/* room for the usual case up front: growing a large header by
		 * doubling copies it and faults in fresh pages each time */
		size_t est = 64;
		for (size_t i = 0; i < nmeta; i++)
			est += strlen(meta_keys[i]) + strlen(meta_values[i]) * 5 / 4 + 8;
		for (size_t i = 0; i < ntensors; i++)
			est += strlen(tensors[i].name) + 64 + 21 * (size_t)tensors[i].ndim;
		sb.buf = malloc(est);
		if (sb.buf)
			sb.cap = est;
	}
	st_sb_put(&sb, zeros, sizeof(zeros));
	st_sb_put(&sb, "{", 1);
	if (nmeta) {
		st_sb_puts(&sb, "\"" ST_METADATA_KEY "\":{");
		for (size_t i = 0; i < nmeta; i++) {
			if (i)
				st_sb_put(&sb, ",", 1);
			st_sb_jstr(&sb, meta_keys[i]);
			st_sb_put(&sb, ":", 1);
			st_sb_jstr(&sb, meta_values[i]);
		}
		st_sb_put(&sb, "}", 1);
	}
	for (size_t i = 0; i < ntensors; i++) {
		const struct ckpt_st_tensor_spec *s = &tensors[i];

		if (i || nmeta)
			st_sb_put(&sb, ",", 1);
		st_sb_jstr(&sb, s->name);
		st_sb_puts(&sb, ":{\"dtype\":\"");
		st_sb_puts(&sb, ckpt_dtype_name(s->dtype));
		st_sb_puts(&sb, "\",\"shape\":[");
		for (unsigned d = 0; d < s->ndim; d++) {
			if (d)
				st_sb_put(&sb, ",", 1);
			st_sb_u64(&sb, s->shape[d]);
		}
		st_sb_puts(&sb, "],\"data_offsets\":[");
		st_spec_bytes(s, &bytes);	/* checked above */
		st_sb_u64(&sb, off);
		st_sb_put(&sb, ",", 1);
		off += bytes;
		st_sb_u64(&sb, off);
		st_sb_puts(&sb, "]}");
	}
	st_sb_put(&sb, "}", 1);
	while (!sb.oom && sb.len % 8)
		st_sb_put(&sb, " ", 1);
	if (sb.oom) {
		r = -ENOMEM;
		goto fail;
	}
	n = sb.len - CKPT_ST_PREFIX_LEN;
	if (n > CKPT_ST_MAX_HEADER) {
		r = -E2BIG;
		goto fail;
	}
	ckpt_put_le64((uint8_t *)sb.buf, n);
	*ret_buf = (uint8_t *)sb.buf;
	*ret_len = sb.len;
	return 0;
fail:
	free(sb.buf);
	return r;
}
