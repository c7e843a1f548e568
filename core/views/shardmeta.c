/* SPDX-License-Identifier: MIT */
/*
 * shardmeta.c - parse/serialize the "ckptfs" sharding metadata of safetensors
 * shard files (jansson), tensor-parallel dim rules and name-based pipeline
 * stages.  See shardmeta.h for the contract.
 *
 * A parsed ckpt_shardmeta keeps one resolved ckpt_tensor_meta per tensor
 * entry, sorted by name for binary search; tensors without an entry are
 * synthesized on lookup from the stored tensor itself.
 */
#include "views/shardmeta.h"

#include <inttypes.h>
#include "base/jalloc.h"
#include "base/util.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <regex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SM_NAME_FMT_MAX 160	/* bytes of a tensor name quoted in a reason */

struct sm_entry {
	char *name;
	struct ckpt_tensor_meta meta;
};

struct ckpt_shardmeta {
	char group[CKPT_SHARDMETA_GROUP_MAX + 1];
	bool has_num_layers;
	uint64_t num_layers;
	size_t n;
	struct sm_entry *e;	/* strcmp order of names */
};

/* ---- error reporting ---------------------------------------------------- */

struct sm_err {
	char *buf;
	size_t len;
};

#define sm_seterr(e, ...) ckpt_errf((e)->buf, (e)->len, __VA_ARGS__)

/* Reason prefixed with "ckptfs metadata: tensor 'NAME': FIELD: ". */
__attribute__((format(printf, 4, 5)))
static void sm_tensor_err(struct sm_err *e, const char *name, const char *field,
			  const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	sm_seterr(e, "ckptfs metadata: tensor '%.*s%s': %s: %s", SM_NAME_FMT_MAX, name,
		  strlen(name) > SM_NAME_FMT_MAX ? "..." : "", field, msg);
}

/* ---- small helpers ------------------------------------------------------ */

/* Product of n dims; false on overflow (a zero dim gives 0, never overflow). */
static bool sm_elems(const uint64_t *dims, unsigned n, uint64_t *ret)
{
	uint64_t p = 1;

	for (unsigned i = 0; i < n; i++)
		if (dims[i] == 0) {
			*ret = 0;
			return true;
		}
	for (unsigned i = 0; i < n; i++)
		if (__builtin_mul_overflow(p, dims[i], &p))
			return false;
	*ret = p;
	return true;
}

static bool sm_utf8_ok(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	while (*p) {
		unsigned c = *p, need;
		uint32_t cp;

		if (c < 0x80) {
			p++;
			continue;
		} else if (c >= 0xc2 && c <= 0xdf) {
			need = 1;
			cp = c & 0x1f;
		} else if (c >= 0xe0 && c <= 0xef) {
			need = 2;
			cp = c & 0x0f;
		} else if (c >= 0xf0 && c <= 0xf4) {
			need = 3;
			cp = c & 0x07;
		} else {
			return false;
		}
		for (unsigned i = 1; i <= need; i++) {
			if ((p[i] & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (p[i] & 0x3f);
		}
		if ((need == 2 && cp < 0x800) || (need == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		p += need + 1;
	}
	return true;
}

/* Group rule: non-empty, <= CKPT_SHARDMETA_GROUP_MAX bytes, no '/', no
 * leading '.'.  Returns NULL if ok, else what is wrong. */
static const char *sm_group_problem(const char *g)
{
	size_t len = strlen(g);

	if (len == 0)
		return "must not be empty";
	if (len > CKPT_SHARDMETA_GROUP_MAX)
		return "longer than 200 bytes";
	if (strchr(g, '/'))
		return "must not contain '/'";
	if (g[0] == '.')
		return "must not start with '.'";
	return NULL;
}

static bool sm_pp_kind_ok(int kind)
{
	return kind == CKPT_PP_LAYER || kind == CKPT_PP_FIRST || kind == CKPT_PP_LAST ||
	       kind == CKPT_PP_ENDS || kind == CKPT_PP_ALL;
}

static const struct {
	const char *name;
	int kind;
} pp_names[] = {
	{ "first", CKPT_PP_FIRST },
	{ "last", CKPT_PP_LAST },
	{ "ends", CKPT_PP_ENDS },
	{ "all", CKPT_PP_ALL },
};

/* ---- parse -------------------------------------------------------------- */

/* Read field (an array of non-negative integers, at most CKPT_MAX_DIMS) into
 * dims[]; *ret_n = its length. */
static int sm_get_dims(const char *tname, const char *field, const json_t *v, uint64_t *dims,
		       unsigned *ret_n, struct sm_err *e)
{
	const json_t *x;
	size_t i;

	if (!json_is_array(v)) {
		sm_tensor_err(e, tname, field, "expected an array of non-negative integers");
		return -EINVAL;
	}
	if (json_array_size(v) > CKPT_MAX_DIMS) {
		sm_tensor_err(e, tname, field, "%zu dims, more than the maximum of %d",
			      json_array_size(v), CKPT_MAX_DIMS);
		return -EINVAL;
	}
	json_array_foreach(v, i, x) {
		if (!json_is_integer(x) || json_integer_value(x) < 0) {
			sm_tensor_err(e, tname, field, "element %zu is not a non-negative integer",
				      i);
			return -EINVAL;
		}
		dims[i] = (uint64_t)json_integer_value(x);
	}
	*ret_n = (unsigned)json_array_size(v);
	return 0;
}

static int sm_get_pp(const ckpt_shardmeta *m, const char *tname, const json_t *v,
		     struct ckpt_pp *ret, struct sm_err *e)
{
	if (json_is_integer(v) && json_integer_value(v) >= 0) {
		ret->kind = CKPT_PP_LAYER;
		ret->layer = (uint64_t)json_integer_value(v);
		if (m->has_num_layers && ret->layer >= m->num_layers) {
			sm_tensor_err(e, tname, "pp", "layer %llu >= num_layers %llu",
				      (unsigned long long)ret->layer,
				      (unsigned long long)m->num_layers);
			return -EINVAL;
		}
		return 0;
	}
	if (json_is_string(v)) {
		for (size_t i = 0; i < CKPT_ARRAY_SIZE(pp_names); i++) {
			if (strcmp(json_string_value(v), pp_names[i].name) == 0) {
				ret->kind = pp_names[i].kind;
				ret->layer = 0;
				return 0;
			}
		}
	}
	sm_tensor_err(e, tname, "pp",
		      "expected a layer index or \"first\", \"last\", \"ends\", \"all\"");
	return -EINVAL;
}

/* The box (ret->geom.box) must lie inside ret->global_shape. */
static int sm_check_box(const char *tname, const char *field, const struct ckpt_tensor_meta *t,
			struct sm_err *e)
{
	const struct ckpt_box *b = &t->geom.box;

	for (unsigned i = 0; i < t->ndim; i++) {
		uint64_t end;

		if (__builtin_add_overflow(b->off[i], b->shape[i], &end) ||
		    end > t->global_shape[i]) {
			sm_tensor_err(e, tname, field,
				      "dim %u: offset %llu + size %llu exceeds global_shape %llu",
				      i, (unsigned long long)b->off[i],
				      (unsigned long long)b->shape[i],
				      (unsigned long long)t->global_shape[i]);
			return -EINVAL;
		}
	}
	return 0;
}

/* Geometry of a flat piece: box_shape (default global_shape) + flat_range. */
static int sm_get_flat(const char *tname, const struct ckpt_st_tensor *t, const json_t *jb,
		       const json_t *jf, struct ckpt_tensor_meta *ret, struct sm_err *e)
{
	struct ckpt_piece_geom *g = &ret->geom;
	uint64_t ab[2], belems = 0;
	unsigned n;
	int r;

	if (!json_is_array(jf) || json_array_size(jf) != 2) {
		sm_tensor_err(e, tname, "flat_range", "expected [begin, end]");
		return -EINVAL;
	}
	for (size_t i = 0; i < 2; i++) {
		const json_t *x = json_array_get(jf, i);

		if (!json_is_integer(x) || json_integer_value(x) < 0) {
			sm_tensor_err(e, tname, "flat_range",
				      "element %zu is not a non-negative integer", i);
			return -EINVAL;
		}
		ab[i] = (uint64_t)json_integer_value(x);
	}
	if (ab[0] > ab[1]) {
		sm_tensor_err(e, tname, "flat_range", "begin %llu > end %llu",
			      (unsigned long long)ab[0], (unsigned long long)ab[1]);
		return -EINVAL;
	}
	if (jb) {
		r = sm_get_dims(tname, "box_shape", jb, g->box.shape, &n, e);
		if (r < 0)
			return r;
		if (n != ret->ndim) {
			sm_tensor_err(e, tname, "box_shape", "%u dims, global_shape has %u", n,
				      ret->ndim);
			return -EINVAL;
		}
	} else {
		memcpy(g->box.shape, ret->global_shape, sizeof(g->box.shape));
	}
	r = sm_check_box(tname, "box_shape", ret, e);
	if (r < 0)
		return r;
	sm_elems(g->box.shape, ret->ndim, &belems);	/* box inside global: no overflow */
	if (ab[1] > belems) {
		sm_tensor_err(e, tname, "flat_range", "end %llu exceeds the box's %llu elements",
			      (unsigned long long)ab[1], (unsigned long long)belems);
		return -EINVAL;
	}
	if (t->ndim != 1 || t->shape[0] != ab[1] - ab[0]) {
		sm_tensor_err(e, tname, "flat_range",
			      "stored tensor must be 1-D of length %llu (end - begin)",
			      (unsigned long long)(ab[1] - ab[0]));
		return -EINVAL;
	}
	g->flat = true;
	g->flat_begin = ab[0];
	g->flat_end = ab[1];
	return 0;
}

static int sm_parse_entry(const ckpt_shardmeta *m, const struct ckpt_st_tensor *t,
			  const json_t *v, struct ckpt_tensor_meta *ret, struct sm_err *e)
{
	const char *tn = t->name;
	const json_t *jg, *jo, *jb, *jf, *jt, *jp;
	uint64_t gelems, gbits;
	unsigned n;
	int r;

	memset(ret, 0, sizeof(*ret));
	if (!json_is_object(v)) {
		sm_tensor_err(e, tn, "entry", "not an object");
		return -EINVAL;
	}
	jg = json_object_get(v, "global_shape");
	jo = json_object_get(v, "offsets");
	jb = json_object_get(v, "box_shape");
	jf = json_object_get(v, "flat_range");
	jt = json_object_get(v, "tp_dim");
	jp = json_object_get(v, "pp");

	if (jg) {
		r = sm_get_dims(tn, "global_shape", jg, ret->global_shape, &ret->ndim, e);
		if (r < 0)
			return r;
	} else {
		if (t->ndim > CKPT_MAX_DIMS) {
			sm_tensor_err(e, tn, "global_shape",
				      "stored tensor has %u dims, more than the maximum of %d",
				      t->ndim, CKPT_MAX_DIMS);
			return -EINVAL;
		}
		ret->ndim = t->ndim;
		for (unsigned i = 0; i < t->ndim; i++)
			ret->global_shape[i] = t->shape[i];
	}
	ret->geom.box.ndim = ret->ndim;
	if (jo) {
		r = sm_get_dims(tn, "offsets", jo, ret->geom.box.off, &n, e);
		if (r < 0)
			return r;
		if (n != ret->ndim) {
			sm_tensor_err(e, tn, "offsets", "%u dims, global_shape has %u", n,
				      ret->ndim);
			return -EINVAL;
		}
	}
	/* Boxes lie inside global_shape, so their element counts cannot overflow. */
	gbits = ckpt_dtype_bits(t->dtype);
	if (!sm_elems(ret->global_shape, ret->ndim, &gelems) ||
	    __builtin_mul_overflow(gelems, gbits, &gbits)) {
		sm_tensor_err(e, tn, "global_shape", "size in bits overflows 64 bits");
		return -EINVAL;
	}
	if (jf) {
		r = sm_get_flat(tn, t, jb, jf, ret, e);
		if (r < 0)
			return r;
	} else {
		if (jb) {
			sm_tensor_err(e, tn, "box_shape", "only allowed with flat_range");
			return -EINVAL;
		}
		if (t->ndim != ret->ndim) {
			sm_tensor_err(e, tn, "global_shape", "%u dims, the stored tensor has %u",
				      ret->ndim, t->ndim);
			return -EINVAL;
		}
		for (unsigned i = 0; i < t->ndim; i++)
			ret->geom.box.shape[i] = t->shape[i];
		r = sm_check_box(tn, "offsets", ret, e);
		if (r < 0)
			return r;
	}
	ret->tp_dim = CKPT_TP_DIM_UNSET;
	if (jt) {
		if (!json_is_integer(jt) || json_integer_value(jt) < -1 ||
		    json_integer_value(jt) >= (json_int_t)ret->ndim) {
			sm_tensor_err(e, tn, "tp_dim", "expected an integer in [-1, %u)",
				      ret->ndim);
			return -EINVAL;
		}
		ret->tp_dim = (int)json_integer_value(jt);
	}
	if (jp) {
		r = sm_get_pp(m, tn, jp, &ret->pp, e);
		if (r < 0)
			return r;
		ret->has_pp = true;
	}
	return 0;
}

static int sm_entry_cmp(const void *a, const void *b)
{
	return strcmp(((const struct sm_entry *)a)->name, ((const struct sm_entry *)b)->name);
}

static int sm_parse_tensors(ckpt_shardmeta *m, const ckpt_st_header *h, const json_t *v,
			    struct sm_err *e)
{
	const char *key;
	json_t *x;
	int r;

	if (!json_is_object(v)) {
		sm_seterr(e, "ckptfs metadata: tensors: not an object");
		return -EINVAL;
	}
	if (json_object_size(v) == 0)
		return 0;
	m->e = calloc(json_object_size(v), sizeof(*m->e));
	if (!m->e)
		return -ENOMEM;
	json_object_foreach((json_t *)v, key, x) {
		const struct ckpt_st_tensor *t = ckpt_st_tensor_find(h, key);
		struct sm_entry *ent = &m->e[m->n];

		if (!t) {
			sm_tensor_err(e, key, "tensors", "no such tensor in the file");
			return -EINVAL;
		}
		r = sm_parse_entry(m, t, x, &ent->meta, e);
		if (r < 0)
			return r;
		ent->name = strdup(key);
		if (!ent->name)
			return -ENOMEM;
		m->n++;
	}
	qsort(m->e, m->n, sizeof(*m->e), sm_entry_cmp);
	return 0;
}

static int sm_parse_root(ckpt_shardmeta *m, const ckpt_st_header *h, const json_t *root,
			 struct sm_err *e)
{
	const json_t *x;
	const char *why;

	if (!json_is_object(root)) {
		sm_seterr(e, "ckptfs metadata: not a JSON object");
		return -EINVAL;
	}
	x = json_object_get(root, "version");
	if (!x) {
		sm_seterr(e, "ckptfs metadata: version: missing");
		return -EINVAL;
	}
	if (!json_is_integer(x) || json_integer_value(x) < 1) {
		sm_seterr(e, "ckptfs metadata: version: expected a positive integer");
		return -EINVAL;
	}
	if (json_integer_value(x) != CKPT_SHARDMETA_VERSION) {
		sm_seterr(e, "ckptfs metadata: version %lld is not supported (this build reads "
			  "version %d): file is not reshardable",
			  (long long)json_integer_value(x), CKPT_SHARDMETA_VERSION);
		return -EPROTONOSUPPORT;
	}

	x = json_object_get(root, "group");
	if (x) {
		if (!json_is_string(x)) {
			sm_seterr(e, "ckptfs metadata: group: not a string");
			return -EINVAL;
		}
		why = sm_group_problem(json_string_value(x));
		if (why) {
			sm_seterr(e, "ckptfs metadata: group '%.*s': %s", SM_NAME_FMT_MAX,
				  json_string_value(x), why);
			return -EINVAL;
		}
		strcpy(m->group, json_string_value(x));
	}

	x = json_object_get(root, "num_layers");
	if (x) {
		if (!json_is_integer(x) || json_integer_value(x) < 0) {
			sm_seterr(e, "ckptfs metadata: num_layers: "
				  "expected a non-negative integer");
			return -EINVAL;
		}
		m->has_num_layers = true;
		m->num_layers = (uint64_t)json_integer_value(x);
	}

	x = json_object_get(root, "tensors");
	if (x)
		return sm_parse_tensors(m, h, x, e);
	return 0;
}

int ckpt_shardmeta_parse(const ckpt_st_header *h, ckpt_shardmeta **ret, char *err,
			 size_t errlen)
{
	struct sm_err e = { err, errlen };
	ckpt_shardmeta *m = NULL;
	json_t *root = NULL;
	json_error_t jerr;
	const char *val;
	int r;

	if (err && errlen)
		err[0] = '\0';
	if (ret)
		*ret = NULL;
	if (!h || !ret) {
		sm_seterr(&e, "ckptfs metadata: NULL argument");
		return -EINVAL;
	}
	ckpt_json_scope_begin();
	m = calloc(1, sizeof(*m));
	if (!m) {
		r = -ENOMEM;
		goto fail;
	}
	strcpy(m->group, CKPT_SHARDMETA_GROUP_DEFAULT);

	val = ckpt_st_metadata_get(h, CKPT_SHARDMETA_KEY);
	if (val) {
		root = json_loads(val, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
		if (!root) {
			/* jansson 2.14 may fail an allocation with an empty message */
			if (!jerr.text[0] || json_error_code(&jerr) == json_error_out_of_memory) {
				r = -ENOMEM;
				goto fail;
			}
			sm_seterr(&e, "ckptfs metadata: invalid JSON at byte %d: %s",
				  jerr.position, jerr.text);
			r = -EINVAL;
			goto fail;
		}
		r = sm_parse_root(m, h, root, &e);
		if (r < 0)
			goto fail;
	}
	json_decref(root);
	ckpt_json_scope_end();
	*ret = m;
	return 0;
fail:
	if (r == -ENOMEM)
		sm_seterr(&e, "ckptfs metadata: out of memory");
	json_decref(root);
	ckpt_json_scope_end();
	ckpt_shardmeta_free(m);
	return r;
}

void ckpt_shardmeta_free(ckpt_shardmeta *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->n; i++)
		free(m->e[i].name);
	free(m->e);
	free(m);
}

const char *ckpt_shardmeta_group(const ckpt_shardmeta *m)
{
	return m ? m->group : NULL;
}

bool ckpt_shardmeta_num_layers(const ckpt_shardmeta *m, uint64_t *ret)
{
	if (!m || !m->has_num_layers)
		return false;
	if (ret)
		*ret = m->num_layers;
	return true;
}

int ckpt_shardmeta_tensor(const ckpt_shardmeta *m, const struct ckpt_st_tensor *t,
			  struct ckpt_tensor_meta *ret)
{
	const struct sm_entry *ent;
	struct sm_entry key;

	if (!m || !t || !t->name || !ret || (t->ndim && !t->shape))
		return -EINVAL;
	key.name = (char *)t->name;
	ent = m->n ? bsearch(&key, m->e, m->n, sizeof(*m->e), sm_entry_cmp) : NULL;
	if (ent) {
		const struct ckpt_tensor_meta *em = &ent->meta;

		/* t must be the stored tensor the entry was validated against */
		if (em->geom.flat) {
			if (t->ndim != 1 || t->shape[0] != em->geom.flat_end - em->geom.flat_begin)
				return -EINVAL;
		} else {
			if (t->ndim != em->geom.box.ndim)
				return -EINVAL;
			for (unsigned i = 0; i < t->ndim; i++)
				if (t->shape[i] != em->geom.box.shape[i])
					return -EINVAL;
		}
		*ret = *em;
		return 0;
	}
	if (t->ndim > CKPT_MAX_DIMS)
		return -EINVAL;
	memset(ret, 0, sizeof(*ret));
	ret->ndim = t->ndim;
	ret->geom.box.ndim = t->ndim;
	for (unsigned i = 0; i < t->ndim; i++) {
		ret->global_shape[i] = t->shape[i];
		ret->geom.box.shape[i] = t->shape[i];
	}
	ret->tp_dim = CKPT_TP_DIM_UNSET;
	return 0;
}

/* ---- serialize ---------------------------------------------------------- */

/* Check a meta against the format rules (what parse would accept). */
static int sm_check_meta(const struct ckpt_tensor_meta *t, bool has_nl, uint64_t nl)
{
	const struct ckpt_piece_geom *g = &t->geom;
	uint64_t elems;

	if (t->ndim > CKPT_MAX_DIMS || g->box.ndim != t->ndim)
		return -EINVAL;
	for (unsigned i = 0; i < t->ndim; i++) {
		uint64_t end;

		if (__builtin_add_overflow(g->box.off[i], g->box.shape[i], &end) ||
		    end > t->global_shape[i])
			return -EINVAL;
		if (t->global_shape[i] > INT64_MAX)
			return -EOVERFLOW;
	}
	if (!sm_elems(t->global_shape, t->ndim, &elems))
		return -EOVERFLOW;
	if (g->flat) {
		if (!sm_elems(g->box.shape, t->ndim, &elems) || g->flat_begin > g->flat_end ||
		    g->flat_end > elems)
			return -EINVAL;
		if (g->flat_end > INT64_MAX)
			return -EOVERFLOW;
	}
	if (t->tp_dim != CKPT_TP_DIM_UNSET && (t->tp_dim < -1 || t->tp_dim >= (int)t->ndim))
		return -EINVAL;
	if (t->has_pp) {
		if (!sm_pp_kind_ok(t->pp.kind))
			return -EINVAL;
		if (t->pp.kind == CKPT_PP_LAYER) {
			if (has_nl && t->pp.layer >= nl)
				return -EINVAL;
			if (t->pp.layer > INT64_MAX)
				return -EOVERFLOW;
		}
	}
	return 0;
}

int ckpt_shardmeta_check_group(const char *group)
{
	return group && !sm_group_problem(group) ? 0 : -EINVAL;
}

int ckpt_shardmeta_check(const struct ckpt_st_tensor *t, const struct ckpt_tensor_meta *m,
			 bool has_nl, uint64_t nl)
{
	const struct ckpt_piece_geom *g;
	uint64_t elems = 0;

	if (!t || !m || (t->ndim && !t->shape) || sm_check_meta(m, has_nl, nl) < 0)
		return -EINVAL;
	g = &m->geom;
	for (unsigned i = m->ndim; i < CKPT_MAX_DIMS; i++)
		if (m->global_shape[i] || g->box.off[i] || g->box.shape[i])
			return -EINVAL;
	sm_elems(m->global_shape, m->ndim, &elems); /* fits: checked by sm_check_meta */
	if (__builtin_mul_overflow(elems, (uint64_t)ckpt_dtype_bits(t->dtype), &elems))
		return -EINVAL;
	if (g->flat)
		return t->ndim == 1 && t->shape[0] == g->flat_end - g->flat_begin ? 0 : -EINVAL;
	if (t->ndim != m->ndim || g->flat_begin || g->flat_end)
		return -EINVAL;
	for (unsigned i = 0; i < t->ndim; i++)
		if (t->shape[i] != g->box.shape[i])
			return -EINVAL;
	return 0;
}

struct sm_dump {
	char *buf;	/* NUL-terminated once anything was appended */
	size_t len, cap;
};

/* Make room for n more bytes and the NUL. */
static __attribute__((noinline)) int sm_grow(struct sm_dump *d, size_t n)
{
	size_t ncap = d->cap ? d->cap : 4096;
	char *nb;

	while (ncap - d->len <= n)
		if (__builtin_mul_overflow(ncap, 2, &ncap))
			return -1;
	nb = realloc(d->buf, ncap);
	if (!nb)
		return -1;
	d->buf = nb;
	d->cap = ncap;
	return 0;
}

/* Inline so that the copies of short literals are inlined too. */
static inline int sm_dump_cb(const char *p, size_t n, void *data)
{
	struct sm_dump *d = data;

	if ((n >= d->cap - d->len || !d->buf) && sm_grow(d, n) < 0)
		return -1;
	memcpy(d->buf + d->len, p, n);
	d->len += n;
	d->buf[d->len] = '\0';
	return 0;
}

static inline int sm_puts(struct sm_dump *d, const char *str)
{
	return sm_dump_cb(str, strlen(str), d) < 0 ? -ENOMEM : 0;
}

static int sm_putu(struct sm_dump *d, uint64_t v)
{
	char buf[CKPT_U64_DEC_MAX];
	size_t n = ckpt_u64_dec(v, buf);

	return sm_dump_cb(buf + sizeof(buf) - n, n, d) < 0 ? -ENOMEM : 0;
}

static int sm_puti(struct sm_dump *d, int64_t v)
{
	int r = 0;

	if (v < 0) {
		r = sm_puts(d, "-");
		return r ? r : sm_putu(d, (uint64_t)0 - (uint64_t)v);
	}
	return sm_putu(d, (uint64_t)v);
}

/* A JSON string as jansson writes it: UTF-8 passes through (validated by
 * the caller); '"', '\\' and control characters are escaped. */
static int sm_putstr(struct sm_dump *d, const char *str)
{
	const char *run = str;
	int r = sm_puts(d, "\"");

	for (const char *p = str; !r && *p; p++) {
		unsigned char c = (unsigned char)*p;
		char esc[8];
		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		if (p > run && sm_dump_cb(run, (size_t)(p - run), d) < 0)
			return -ENOMEM;
		switch (c) {
		case '"': strcpy(esc, "\\\""); break;
		case '\\': strcpy(esc, "\\\\"); break;
		case '\b': strcpy(esc, "\\b"); break;
		case '\f': strcpy(esc, "\\f"); break;
		case '\n': strcpy(esc, "\\n"); break;
		case '\r': strcpy(esc, "\\r"); break;
		case '\t': strcpy(esc, "\\t"); break;
		default: snprintf(esc, sizeof(esc), "\\u%04X", c); break;
		}
		r = sm_puts(d, esc);
		run = p + 1;
	}
	if (!r && *run)
		r = sm_puts(d, run);
	return r ? r : sm_puts(d, "\"");
}

static int sm_putdims(struct sm_dump *d, const uint64_t *dims, unsigned n)
{
	int r = sm_puts(d, "[");

	for (unsigned i = 0; i < n && !r; i++) {
		if (i)
			r = sm_puts(d, ",");
		if (!r)
			r = sm_putu(d, dims[i]);
	}
	return r ? r : sm_puts(d, "]");
}

static int sm_put_entry(struct sm_dump *d, const struct ckpt_tensor_meta *t)
{
	const struct ckpt_piece_geom *g = &t->geom;
	uint64_t range[2] = { g->flat_begin, g->flat_end };
	int r = sm_puts(d, "{\"global_shape\":");

	if (!r)
		r = sm_putdims(d, t->global_shape, t->ndim);
	if (!r)
		r = sm_puts(d, ",\"offsets\":");
	if (!r)
		r = sm_putdims(d, g->box.off, t->ndim);
	if (!r && g->flat) {
		r = sm_puts(d, ",\"box_shape\":");
		if (!r)
			r = sm_putdims(d, g->box.shape, t->ndim);
		if (!r)
			r = sm_puts(d, ",\"flat_range\":");
		if (!r)
			r = sm_putdims(d, range, 2);
	}
	if (!r && t->tp_dim != CKPT_TP_DIM_UNSET) {
		r = sm_puts(d, ",\"tp_dim\":");
		if (!r)
			r = sm_puti(d, t->tp_dim);
	}
	if (!r && t->has_pp) {
		r = sm_puts(d, ",\"pp\":");
		if (!r && t->pp.kind == CKPT_PP_LAYER) {
			r = sm_putu(d, t->pp.layer);
		} else if (!r) {
			const char *name = NULL;
			for (size_t i = 0; i < CKPT_ARRAY_SIZE(pp_names); i++)
				if (pp_names[i].kind == t->pp.kind)
					name = pp_names[i].name;
			r = name ? sm_putstr(d, name) : -EINVAL;
		}
	}
	return r ? r : sm_puts(d, "}");
}

int ckpt_shardmeta_serialize_cb(const char *group, bool has_num_layers, uint64_t num_layers,
				size_t n, ckpt_shardmeta_get_fn get, void *ud, char **ret_json)
{
	struct sm_dump d = { NULL, 0, 0 };
	const char **names = NULL;
	int r;

	if (!ret_json)
		return -EINVAL;
	*ret_json = NULL;
	if (!get && n)
		return -EINVAL;
	if (!group)
		group = CKPT_SHARDMETA_GROUP_DEFAULT;
	if (sm_group_problem(group) || !sm_utf8_ok(group))
		return -EINVAL;
	if (has_num_layers && num_layers > INT64_MAX)
		return -EOVERFLOW;
	names = malloc((n ? n : 1) * sizeof(*names));
	if (!names)
		return -ENOMEM;
	/* room for typical entries up front (see sm_dump_cb) */
	d.cap = 4096 + (n < SIZE_MAX / 256 ? n * 160 : 0);
	d.buf = malloc(d.cap);
	if (!d.buf)
		d.cap = 0;

	/* Written directly (no jansson tree of every entry);
	 * ckpt_shardmeta_parse() reads it back in the unit tests.  Entries are
	 * checked as they are written. */
	r = sm_puts(&d, "{\"version\":");
	if (!r)
		r = sm_putu(&d, CKPT_SHARDMETA_VERSION);
	if (!r)
		r = sm_puts(&d, ",\"group\":");
	if (!r)
		r = sm_putstr(&d, group);
	if (!r && has_num_layers) {
		r = sm_puts(&d, ",\"num_layers\":");
		if (!r)
			r = sm_putu(&d, num_layers);
	}
	if (!r)
		r = sm_puts(&d, ",\"tensors\":{");
	for (size_t i = 0; i < n && !r; i++) {
		struct ckpt_tensor_meta tmp;
		const struct ckpt_tensor_meta *m;
		const char *name = NULL;

		m = get(ud, i, &name, &tmp);
		if (!name || !m || !sm_utf8_ok(name)) {
			r = -EINVAL;
			break;
		}
		r = sm_check_meta(m, has_num_layers, num_layers);
		if (r < 0)
			break;
		names[i] = name;
		if (i)
			r = sm_puts(&d, ",");
		if (!r)
			r = sm_putstr(&d, name);
		if (!r)
			r = sm_puts(&d, ":");
		if (!r)
			r = sm_put_entry(&d, m);
	}
	if (!r)
		r = sm_puts(&d, "}}");
	if (!r)
		r = ckpt_check_unique_strs(names, sizeof(*names), n);
	free(names);
	if (r < 0) {
		free(d.buf);
		return r;
	}
	*ret_json = d.buf;
	return 0;
}

static const struct ckpt_tensor_meta *sm_get_out(void *ud, size_t i, const char **ret_name,
						 struct ckpt_tensor_meta *tmp)
{
	const struct ckpt_shardmeta_out *v = ud;

	(void)tmp;
	*ret_name = v[i].name;
	return v[i].meta;
}

int ckpt_shardmeta_serialize(const char *group, bool has_num_layers, uint64_t num_layers,
			     const struct ckpt_shardmeta_out *v, size_t n, char **ret_json)
{
	if (ret_json)
		*ret_json = NULL;
	if (!v && n)
		return -EINVAL;
	return ckpt_shardmeta_serialize_cb(group, has_num_layers, num_layers, n,
					   sm_get_out, (void *)v, ret_json);
}

/* ---- tensor-parallel rules ---------------------------------------------- */

struct tp_rule {
	regex_t re;
	int dim;
};

struct ckpt_tp_rules {
	size_t n, cap;
	struct tp_rule *rules;	/* file order */
};

static const char *const tp_builtin_dim0[] = {
	"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head",
};
static const char *const tp_builtin_dim1[] = { "o_proj.weight", "down_proj.weight" };

static int tp_builtin_dim(const char *name)
{
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(tp_builtin_dim0); i++)
		if (strstr(name, tp_builtin_dim0[i]))
			return 0;
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(tp_builtin_dim1); i++)
		if (strstr(name, tp_builtin_dim1[i]))
			return 1;
	return -1;
}

static bool tp_is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

/* Parse one line (modified in place) of file path; append its rule to r
 * (blank and comment lines add nothing). */
static int tp_parse_line(ckpt_tp_rules *r, const char *path, unsigned lineno, char *line,
			 struct sm_err *e)
{
	char *re, *end, *dim, *q;
	struct tp_rule *rule;
	long d;
	int rc;

	for (re = line; tp_is_space(*re); re++)
		;
	if (*re == '\0' || *re == '#')
		return 0;
	end = re + strlen(re);
	while (end > re && tp_is_space(end[-1]))
		*--end = '\0';
	for (dim = end; dim > re && !tp_is_space(dim[-1]); dim--)
		;
	if (dim == re) {
		sm_seterr(e, "%s:%u: expected 'REGEX DIM'", path, lineno);
		return -EINVAL;
	}
	for (q = dim; q > re && tp_is_space(q[-1]); q--)
		;
	*q = '\0';
	errno = 0;
	d = strtol(dim, &q, 10);
	if (*q != '\0' || errno || d < -1 || d > INT_MAX) {
		sm_seterr(e, "%s:%u: invalid dim '%.32s' (expected an integer >= -1)", path,
			  lineno, dim);
		return -EINVAL;
	}
	if (r->n == r->cap) {
		size_t ncap = r->cap ? r->cap * 2 : 8;
		struct tp_rule *p = realloc(r->rules, ncap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		r->rules = p;
		r->cap = ncap;
	}
	rule = &r->rules[r->n];
	rc = regcomp(&rule->re, re, REG_EXTENDED | REG_NOSUB);
	if (rc == REG_ESPACE)
		return -ENOMEM;
	if (rc != 0) {
		char msg[128];

		regerror(rc, &rule->re, msg, sizeof(msg));
		sm_seterr(e, "%s:%u: invalid regex '%.*s': %s", path, lineno, SM_NAME_FMT_MAX, re,
			  msg);
		return -EINVAL;
	}
	rule->dim = (int)d;
	r->n++;
	return 0;
}

static int tp_load(ckpt_tp_rules *r, const char *path, struct sm_err *e)
{
	char *line = NULL;
	size_t cap = 0;
	unsigned lineno = 0;
	ssize_t len;
	FILE *f;
	int rc = 0;

	f = fopen(path, "re");
	if (!f) {
		rc = -errno;
		sm_seterr(e, "%s: %s", path, strerror(-rc));
		return rc;
	}
	while ((len = getline(&line, &cap, f)) >= 0) {
		lineno++;
		if (strlen(line) != (size_t)len) {
			sm_seterr(e, "%s:%u: NUL byte in line", path, lineno);
			rc = -EINVAL;
			goto out;
		}
		rc = tp_parse_line(r, path, lineno, line, e);
		if (rc < 0)
			goto out;
	}
	if (ferror(f)) {
		rc = errno ? -errno : -EIO;
		sm_seterr(e, "%s: %s", path, strerror(-rc));
	}
out:
	free(line);
	fclose(f);
	return rc;
}

int ckpt_tp_rules_new(const char *path, ckpt_tp_rules **ret, char *err, size_t errlen)
{
	struct sm_err e = { err, errlen };
	ckpt_tp_rules *r;
	int rc;

	if (err && errlen)
		err[0] = '\0';
	if (!ret) {
		sm_seterr(&e, "tp rules: NULL argument");
		return -EINVAL;
	}
	*ret = NULL;
	r = calloc(1, sizeof(*r));
	if (!r) {
		rc = -ENOMEM;
		goto fail;
	}
	if (path) {
		rc = tp_load(r, path, &e);
		if (rc < 0)
			goto fail;
	}
	*ret = r;
	return 0;
fail:
	if (rc == -ENOMEM)
		sm_seterr(&e, "tp rules: out of memory");
	ckpt_tp_rules_free(r);
	return rc;
}

void ckpt_tp_rules_free(ckpt_tp_rules *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->n; i++)
		regfree(&r->rules[i].re);
	free(r->rules);
	free(r);
}

int ckpt_tp_rules_dim(const ckpt_tp_rules *r, const char *name, unsigned ndim)
{
	int dim = -1;
	size_t i;

	if (!name)
		return -1;
	for (i = 0; r && i < r->n; i++) {
		if (regexec(&r->rules[i].re, name, 0, NULL, 0) == 0) {
			dim = r->rules[i].dim;
			break;
		}
	}
	if (!r || i == r->n)
		dim = tp_builtin_dim(name);
	return dim >= 0 && (unsigned)dim < ndim ? dim : -1;
}

/* ---- pipeline stage from names ------------------------------------------ */

static const char *const layer_prefixes[] = { "layers.", "h.", "blocks.", "layer." };
static const char *const first_words[] = { "embed", "wte", "wpe", "tok_embeddings" };

/* "N." at s: decimal digits that fit in 64 bits followed by '.'. */
static bool sm_layer_number(const char *s, uint64_t *ret)
{
	uint64_t v = 0;
	const char *p;

	for (p = s; *p >= '0' && *p <= '9'; p++)
		if (__builtin_mul_overflow(v, 10, &v) ||
		    __builtin_add_overflow(v, (uint64_t)(*p - '0'), &v))
			return false;
	if (p == s || *p != '.' || v > INT64_MAX)
		return false; /* a layer past 2^63 - 1 cannot be written as a "pp" */
	*ret = v;
	return true;
}

bool ckpt_layer_from_name(const char *name, uint64_t *ret_layer)
{
	uint64_t v;

	if (!name)
		return false;
	for (const char *p = name; *p; p++) {
		if (p != name && p[-1] != '.')
			continue;
		for (size_t i = 0; i < CKPT_ARRAY_SIZE(layer_prefixes); i++) {
			size_t len = strlen(layer_prefixes[i]);

			if (strncmp(p, layer_prefixes[i], len) == 0 &&
			    sm_layer_number(p + len, &v)) {
				if (ret_layer)
					*ret_layer = v;
				return true;
			}
		}
	}
	return false;
}

void ckpt_pp_from_name(const char *name, struct ckpt_pp *ret)
{
	if (!ret)
		return;
	ret->layer = 0;
	if (ckpt_layer_from_name(name, &ret->layer)) {
		ret->kind = CKPT_PP_LAYER;
		return;
	}
	ret->kind = CKPT_PP_LAST;
	if (!name)
		return;
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(first_words); i++)
		if (strstr(name, first_words[i]))
			ret->kind = CKPT_PP_FIRST;
}
