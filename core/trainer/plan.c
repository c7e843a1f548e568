/* plan.c: descriptor validation and output file images (plan.h). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include <errno.h>
#include <stdbool.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trainer/copy.h"
#include "trainer/plan.h"
#include "trainer/trainer_int.h"
#include "base/jalloc.h"
#include "views/safetensors.h"
#include "views/shardmeta.h"

#define GROUP_MAX 200
/* A blob is written as .tmp-rRRRRR-NAME first: that name must fit NAME_MAX (255) too. */
#define BLOB_NAME_MAX (255 - 12)
/* The largest file (and pool layout) a save may make: an off_t must hold every offset. */
#define FILE_MAX ((uint64_t)INT64_MAX)

void tr_tensor_file_name(char *buf, size_t len, const char *group, int rank, unsigned part)
{
	if (part == 0)
		snprintf(buf, len, "%s-rank%05d.safetensors", group, rank);
	else
		snprintf(buf, len, "%s-rank%05d-%u.safetensors", group, rank, part);
}

static const char *group_of(const struct ckptfs_tensor *t)
{
	return t->group ? t->group : "model";
}

/* a * b into *r, 0 or -EOVERFLOW. */
static int mul64(uint64_t a, uint64_t b, uint64_t *r)
{
	if (a != 0 && b > UINT64_MAX / a)
		return -EOVERFLOW;
	*r = a * b;
	return 0;
}

static int dims_elems(const int64_t *dims, int n, uint64_t *ret)
{
	uint64_t e = 1;

	for (int d = 0; d < n; d++)
		if (mul64(e, (uint64_t)dims[d], &e) < 0)
			return -EOVERFLOW;
	*ret = e;
	return 0;
}

static int check_dims(const int64_t *dims, int n)
{
	if (n > 0 && !dims)
		return -EINVAL;
	for (int d = 0; d < n; d++)
		if (dims[d] < 0)
			return -EINVAL;
	return 0;
}

static int check_group(const char *g)
{
	size_t n = strlen(g);

	if (n == 0 || n > GROUP_MAX || g[0] == '.' || strchr(g, '/'))
		return -EINVAL;
	return 0;
}

#define FAIL(code, ...)                                                                    \
	do {                                                                               \
		tr_fmt(err, errlen, __VA_ARGS__);                                           \
		return (code);                                                             \
	} while (0)

/* Checks one tensor and fills its size; the message names the tensor. */
static int check_tensor(const struct ckptfs_tensor *t, size_t i, int num_layers,
			struct tr_item *it, char *err, size_t errlen)
{
	const char *g = group_of(t), *nm = t->name;
	enum ckpt_dtype dt;
	uint64_t elems, gelems, bits, bytes;
	int gnd;

	if (!nm || !nm[0])
		FAIL(-EINVAL, "tensor #%zu: missing name", i);
	if (check_group(g) < 0)
		FAIL(-EINVAL, "tensor '%s': invalid group '%s' (1..%d bytes, no '/', not starting "
		     "with '.')", nm, g, GROUP_MAX);
	if (!strcmp(nm, "__metadata__"))
		FAIL(-EINVAL, "tensor '%s' (group '%s'): reserved name", nm, g);
	if (!t->dtype || ckpt_dtype_from_name(t->dtype, &dt) < 0)
		FAIL(-EINVAL, "tensor '%s' (group '%s'): unknown dtype '%s'", nm, g,
		     t->dtype ? t->dtype : "(null)");
	bits = ckpt_dtype_bits(dt);
	if (t->ndim < 0 || t->ndim > CKPTFS_MAX_DIMS)
		FAIL(-EINVAL, "tensor '%s' (group '%s'): ndim %d out of range 0..%d", nm, g,
		     t->ndim, CKPTFS_MAX_DIMS);
	if (check_dims(t->shape, t->ndim) < 0)
		FAIL(-EINVAL, "tensor '%s' (group '%s'): shape missing or negative", nm, g);
	if (dims_elems(t->shape, t->ndim, &elems) < 0 || mul64(elems, bits, &bytes) < 0)
		FAIL(-EOVERFLOW, "tensor '%s' (group '%s'): size overflows", nm, g);
	if (bytes % 8)
		FAIL(-EINVAL, "tensor '%s' (group '%s'): %" PRIu64 " elements of %s are not a whole "
		     "number of bytes", nm, g, elems, t->dtype);
	bytes /= 8;
	if (bytes > 0 && !t->data)
		FAIL(-EINVAL, "tensor '%s' (group '%s'): NULL data", nm, g);
	if (t->device < -1)
		FAIL(-EINVAL, "tensor '%s' (group '%s'): invalid device %d", nm, g, t->device);
	if (t->global_ndim < 0 || t->global_ndim > CKPTFS_MAX_DIMS)
		FAIL(-EINVAL, "tensor '%s' (group '%s'): global_ndim %d out of range 0..%d", nm, g,
		     t->global_ndim, CKPTFS_MAX_DIMS);
	gnd = t->global_ndim ? t->global_ndim : t->ndim;
	if (t->global_ndim == 0) {
		if (t->flat)
			FAIL(-EINVAL, "tensor '%s' (group '%s'): flat range without a global shape",
			     nm, g);
		gelems = elems;
	} else {
		const int64_t *gs = t->global_shape, *box;
		int64_t zeros[CKPTFS_MAX_DIMS] = { 0 };
		const int64_t *off = t->offsets ? t->offsets : zeros;
		uint64_t belems;

		if (check_dims(gs, gnd) < 0)
			FAIL(-EINVAL, "tensor '%s' (group '%s'): global_shape missing or negative",
			     nm, g);
		if (check_dims(off, gnd) < 0)
			FAIL(-EINVAL, "tensor '%s' (group '%s'): negative offsets", nm, g);
		if (dims_elems(gs, gnd, &gelems) < 0)
			FAIL(-EOVERFLOW, "tensor '%s' (group '%s'): global size overflows", nm, g);
		if (!t->flat) {
			if (t->ndim != gnd)
				FAIL(-EINVAL, "tensor '%s' (group '%s'): ndim %d differs from "
				     "global_ndim %d (not a flat piece)", nm, g, t->ndim, gnd);
			box = t->shape;
		} else {
			box = t->box_shape ? t->box_shape : gs;
			if (check_dims(box, gnd) < 0)
				FAIL(-EINVAL, "tensor '%s' (group '%s'): negative box_shape", nm, g);
		}
		for (int d = 0; d < gnd; d++)
			if (off[d] > gs[d] || box[d] > gs[d] - off[d])
				FAIL(-EINVAL, "tensor '%s' (group '%s'): box of %" PRId64 " at "
				     "offset %" PRId64 " exceeds global_shape %" PRId64
				     " in dimension %d", nm, g, box[d], off[d], gs[d], d);
		if (t->flat) {
			if (dims_elems(box, gnd, &belems) < 0)
				FAIL(-EOVERFLOW, "tensor '%s' (group '%s'): box size overflows", nm, g);
			if (t->ndim != 1)
				FAIL(-EINVAL, "tensor '%s' (group '%s'): a flat piece is 1-D, not %d-D",
				     nm, g, t->ndim);
			if (t->flat_start < 0 || t->flat_start > t->flat_end ||
			    (uint64_t)t->flat_end > belems)
				FAIL(-EINVAL, "tensor '%s' (group '%s'): flat range [%" PRId64 ", %"
				     PRId64 ") outside the box's %" PRIu64 " elements", nm, g,
				     t->flat_start, t->flat_end, belems);
			if (t->shape[0] != t->flat_end - t->flat_start)
				FAIL(-EINVAL, "tensor '%s' (group '%s'): %" PRId64 " elements stored "
				     "for flat range [%" PRId64 ", %" PRId64 ")", nm, g, t->shape[0],
				     t->flat_start, t->flat_end);
		}
	}
	if (mul64(gelems, bits, &bytes) < 0)
		FAIL(-EOVERFLOW, "tensor '%s' (group '%s'): global size overflows", nm, g);
	if (t->tp_dim != CKPTFS_TP_DIM_UNSET && (t->tp_dim < -1 || t->tp_dim >= gnd))
		FAIL(-EINVAL, "tensor '%s' (group '%s'): tp_dim %d outside -1..%d", nm, g,
		     t->tp_dim, gnd - 1);
	if (t->pp < CKPTFS_PP_ALL)
		FAIL(-EINVAL, "tensor '%s' (group '%s'): invalid pp %d", nm, g, t->pp);
	if (t->pp >= 0 && num_layers >= 0 && t->pp >= num_layers)
		FAIL(-EINVAL, "tensor '%s' (group '%s'): pp layer %d >= num_layers %d", nm, g,
		     t->pp, num_layers);
	if (t->device >= 0 && !t->replica && !tr_cuda_usable())
		FAIL(-ENODEV, "tensor '%s' (group '%s'): device pointer (CUDA device %d) but %s",
		     nm, g, t->device,
#ifdef CKPTFS_CUDA
		     "no GPU is usable"
#else
		     "libckptfs was built without CUDA"
#endif
		);
	it->tensor = t;
	it->index = i;
	it->bits = (unsigned)bits;
	mul64(elems, bits, &bytes);
	it->bytes = bytes / 8;
	it->data_off = 0;
	return 0;
}

/* Items of one file: dtype size descending (every tensor stays aligned to its element size),
 * then by name. */
static int cmp_item(const void *a, const void *b)
{
	const struct tr_item *x = a, *y = b;

	if (x->bits != y->bits)
		return x->bits > y->bits ? -1 : 1;
	return strcmp(x->tensor->name, y->tensor->name);
}

/* Items grouped by (group, name), to find duplicates and build the files. */
static int cmp_group_name(const void *a, const void *b)
{
	const struct tr_item *x = a, *y = b;
	int c = strcmp(group_of(x->tensor), group_of(y->tensor));

	return c ? c : strcmp(x->tensor->name, y->tensor->name);
}

/* (group, name), then the caller's order: the k-th piece of a name is its k-th descriptor. */
static int cmp_group_name_index(const void *a, const void *b)
{
	const struct tr_item *x = a, *y = b;
	int c = cmp_group_name(a, b);

	return c ? c : (x->index > y->index) - (x->index < y->index);
}

/* File order of the written items: group, part, name. */
static int cmp_group_part_name(const void *a, const void *b)
{
	const struct tr_item *x = a, *y = b;
	int c = strcmp(group_of(x->tensor), group_of(y->tensor));

	if (c)
		return c;
	if (x->part != y->part)
		return x->part < y->part ? -1 : 1;
	return strcmp(x->tensor->name, y->tensor->name);
}

static bool same_i64(const int64_t *a, const int64_t *b, int n)
{
	for (int d = 0; d < n; d++)
		if ((a ? a[d] : 0) != (b ? b[d] : 0))
			return false;
	return true;
}

/* Whether two descriptors of one name conflict: one is the whole tensor (which holds the
 * other), or both place the same piece.  Other overlaps are the views' to check. */
static bool same_placement(const struct ckptfs_tensor *x, const struct ckptfs_tensor *y)
{
	if (x->global_ndim == 0 || y->global_ndim == 0)
		return true;
	if (x->global_ndim != y->global_ndim || x->ndim != y->ndim || !!x->flat != !!y->flat)
		return false;
	if (!same_i64(x->offsets, y->offsets, x->global_ndim))
		return false;
	if (x->flat)
		return x->flat_start == y->flat_start && x->flat_end == y->flat_end &&
		       same_i64(x->box_shape ? x->box_shape : x->global_shape,
				y->box_shape ? y->box_shape : y->global_shape, x->global_ndim);
	return same_i64(x->shape, y->shape, x->ndim);
}

static json_t *int_array(const int64_t *v, int n)
{
	json_t *a = json_array();

	for (int d = 0; a && d < n; d++)
		if (json_array_append_new(a, json_integer(v[d])) < 0) {
			json_decref(a);
			return NULL;
		}
	return a;
}

static int same_dims(const int64_t *a, const int64_t *b, int n)
{
	for (int d = 0; d < n; d++)
		if (a[d] != b[d])
			return 0;
	return 1;
}

static int set_new(json_t *o, const char *k, json_t *v)
{
	return v ? json_object_set_new(o, k, v) : -1;
}

/* The tensors entry of t, or NULL when every field is the default (the whole tensor). */
static int tensor_entry(const struct ckptfs_tensor *t, json_t **ret)
{
	json_t *e = json_object();
	int gnd = t->global_ndim, r = 0;

	*ret = NULL;
	if (!e)
		return -ENOMEM;
	if (gnd > 0) {
		int nonzero = 0;

		for (int d = 0; t->offsets && d < gnd; d++)
			nonzero |= t->offsets[d] != 0;
		if (t->flat || !same_dims(t->global_shape, t->shape, gnd))
			r |= set_new(e, "global_shape", int_array(t->global_shape, gnd));
		if (nonzero)
			r |= set_new(e, "offsets", int_array(t->offsets, gnd));
		if (t->flat) {
			int64_t fr[2] = { t->flat_start, t->flat_end };

			if (t->box_shape && !same_dims(t->box_shape, t->global_shape, gnd))
				r |= set_new(e, "box_shape", int_array(t->box_shape, gnd));
			r |= set_new(e, "flat_range", int_array(fr, 2));
		}
	}
	if (t->tp_dim != CKPTFS_TP_DIM_UNSET)
		r |= set_new(e, "tp_dim", json_integer(t->tp_dim));
	if (t->pp >= 0)
		r |= set_new(e, "pp", json_integer(t->pp));
	else if (t->pp != CKPTFS_PP_UNSET) {
		static const char *const names[] = { "first", "last", "ends", "all" };

		r |= set_new(e, "pp", json_string(names[CKPTFS_PP_FIRST - t->pp]));
	}
	if (r) {
		json_decref(e);
		return -ENOMEM;
	}
	if (json_object_size(e) == 0) {
		json_decref(e);
		return 0;
	}
	*ret = e;
	return 0;
}

/* Builds out->header for the items of one group. */
static int build_header(struct tr_out *out, int num_layers, char *err, size_t errlen)
{
	json_t *meta, *tens;
	struct ckpt_st_tensor_spec *specs = NULL;
	uint64_t *sh = NULL;
	char *js = NULL;
	const char *keys[2] = { "format", CKPT_SHARDMETA_KEY }, *vals[2] = { "pt", NULL };
	ckpt_st_header *h = NULL;
	ckpt_shardmeta *m = NULL;
	char why[512];
	int ret = -ENOMEM;

	/* Every jansson value of this function lives in the arena of this scope (core/base/jalloc.h):
	 * a header of thousands of tensors is built and parsed without thousands of mallocs. */
	ckpt_json_scope_begin();
	meta = json_object();
	tens = json_object();
	if (!meta || !tens)
		goto out;
	if (json_object_set_new(meta, "version", json_integer(1)) < 0 ||
	    set_new(meta, "group", json_string(out->group)) < 0)
		goto out;
	if (num_layers >= 0 && json_object_set_new(meta, "num_layers", json_integer(num_layers)) < 0)
		goto out;
	specs = calloc(out->n_items ? out->n_items : 1, sizeof(*specs));
	sh = calloc(out->n_items * CKPTFS_MAX_DIMS + 1, sizeof(*sh));
	if (!specs || !sh)
		goto out;
	for (size_t k = 0; k < out->n_items; k++) {
		const struct ckptfs_tensor *t = out->items[k].tensor;
		json_t *e;

		ckpt_dtype_from_name(t->dtype, &specs[k].dtype);
		specs[k].name = t->name;
		specs[k].ndim = (unsigned)t->ndim;
		specs[k].shape = sh + k * CKPTFS_MAX_DIMS;
		for (int d = 0; d < t->ndim; d++)
			sh[k * CKPTFS_MAX_DIMS + d] = (uint64_t)t->shape[d];
		ret = tensor_entry(t, &e);
		if (ret < 0)
			goto out;
		if (e && json_object_set_new(tens, t->name, e) < 0) {
			ret = -EINVAL;
			tr_fmt(err, errlen, "tensor '%s' (group '%s'): name is not valid UTF-8",
			       t->name, out->group);
			goto out;
		}
	}
	ret = -ENOMEM;
	if (json_object_set(meta, "tensors", tens) < 0)
		goto out;
	js = json_dumps(meta, JSON_COMPACT | JSON_PRESERVE_ORDER);
	if (!js) {
		ret = -EINVAL;
		tr_fmt(err, errlen, "group '%s': invalid name (not valid UTF-8)", out->group);
		goto out;
	}
	vals[1] = js;
	ret = ckpt_st_serialize(specs, out->n_items, keys, vals, 2, &out->header,
				&out->header_len);
	if (ret < 0) {
		tr_fmt(err, errlen, "%s: cannot build the safetensors header (%s)", out->name,
		       strerror(-ret));
		goto out;
	}
	/* The views must accept what this rank writes: check with their own parsers (the
	 * header only, a small fraction of the snapshot's work). */
	ret = ckpt_st_parse(out->header + 8, out->header_len - 8, &h, why, sizeof(why));
	if (ret == 0)
		ret = ckpt_shardmeta_parse(h, &m, why, sizeof(why));
	if (ret < 0) {
		tr_fmt(err, errlen, "%s: the header does not validate: %s", out->name, why);
		goto out;
	}
	ret = 0;
out:
	if (ret == -ENOMEM && err && !err[0])
		tr_fmt(err, errlen, "%s: out of memory", out->name);
	ckpt_shardmeta_free(m);
	ckpt_st_header_free(h);
	tr_json_free(js);
	free(specs);
	free(sh);
	json_decref(tens);
	json_decref(meta);
	ckpt_json_scope_end();
	return ret;
}

static size_t align_up(size_t v, size_t a)
{
	return (v + a - 1) / a * a;
}

/* The signature: a byte string that is equal for two saves exactly when they give the same
 * files (given equal data).  Strings are length-prefixed, so no two inputs collide. */
struct sig {
	char *b;
	size_t len, cap;
	int oom;
};

static void sig_put(struct sig *g, const void *p, size_t n)
{
	if (g->oom)
		return;
	if (g->len + n > g->cap) {
		size_t c = g->cap ? g->cap : 4096;
		char *nb;

		while (c < g->len + n)
			c *= 2;
		nb = realloc(g->b, c);
		if (!nb) {
			g->oom = 1;
			return;
		}
		g->b = nb;
		g->cap = c;
	}
	memcpy(g->b + g->len, p, n);
	g->len += n;
}

static void sig_i64(struct sig *g, int64_t v)
{
	sig_put(g, &v, sizeof(v));
}

static void sig_str(struct sig *g, const char *s)
{
	size_t n = s ? strlen(s) : (size_t)-1;

	sig_put(g, &n, sizeof(n));
	if (s)
		sig_put(g, s, n);
}

static void sig_dims(struct sig *g, const int64_t *d, int n)
{
	sig_i64(g, d ? n : -1);
	if (d && n > 0)
		sig_put(g, d, (size_t)n * sizeof(*d));
}

static int make_sig(const struct ckptfs_save_args *a, struct sig *g)
{
	sig_i64(g, a->rank);
	sig_i64(g, a->num_layers);
	sig_i64(g, (int64_t)a->n_tensors);
	for (size_t i = 0; i < a->n_tensors; i++) {
		const struct ckptfs_tensor *t = &a->tensors[i];
		int gnd = t->global_ndim >= 0 && t->global_ndim <= CKPTFS_MAX_DIMS ? t->global_ndim : 0;
		int nd = t->ndim >= 0 && t->ndim <= CKPTFS_MAX_DIMS ? t->ndim : 0;

		sig_str(g, t->group);
		sig_str(g, t->name);
		sig_str(g, t->dtype);
		sig_i64(g, t->ndim);
		sig_dims(g, t->shape, nd);
		sig_i64(g, t->global_ndim);
		sig_dims(g, t->global_shape, gnd);
		sig_dims(g, t->offsets, gnd);
		sig_i64(g, t->flat);
		sig_i64(g, t->flat_start);
		sig_i64(g, t->flat_end);
		sig_dims(g, t->box_shape, gnd);
		sig_i64(g, t->tp_dim);
		sig_i64(g, t->pp);
		sig_i64(g, t->replica != 0);
	}
	sig_i64(g, (int64_t)a->n_blobs);
	for (size_t b = 0; b < a->n_blobs; b++) {
		sig_str(g, a->blobs[b].name);
		sig_i64(g, (int64_t)a->blobs[b].len);
	}
	return g->oom ? -ENOMEM : 0;
}

/* Re-points plan p (of an equal signature) at a's descriptors; checks what the signature does
 * not cover: data pointers and devices. */
static int rebind(struct tr_plan *p, const struct ckptfs_save_args *a, char *err, size_t errlen)
{
	size_t nb = 0;

	p->any_device = 0;
	for (size_t k = 0; k < p->n_outs; k++) {
		struct tr_out *o = &p->outs[k];

		if (!o->group) {
			o->blob = &a->blobs[nb++];
			if (o->blob->len > 0 && !o->blob->data)
				FAIL(-EINVAL, "blob '%s': NULL data", o->name);
			continue;
		}
		for (size_t i = 0; i < o->n_items; i++) {
			const struct ckptfs_tensor *t = &a->tensors[o->items[i].index];

			o->items[i].tensor = t;
			if (o->items[i].bytes > 0 && !t->data)
				FAIL(-EINVAL, "tensor '%s' (group '%s'): NULL data", t->name, o->group);
			if (t->device < -1)
				FAIL(-EINVAL, "tensor '%s' (group '%s'): invalid device %d", t->name,
				     o->group, t->device);
			if (t->device >= 0 && !tr_cuda_usable())
				FAIL(-ENODEV, "tensor '%s' (group '%s'): device pointer (CUDA device %d) "
				     "but no GPU is usable or libckptfs was built without CUDA", t->name,
				     o->group, t->device);
			if (t->device >= 0)
				p->any_device = 1;
		}
	}
	return 0;
}

int tr_plan_build(const struct ckptfs_save_args *a, struct tr_plan **prev,
		  struct tr_plan **ret_plan, char *err, size_t errlen)
{
	struct sig g = { 0 };
	struct tr_plan *p = NULL;
	struct tr_item *all = NULL;
	size_t n_all = 0, n_groups = 0, pg = (size_t)sysconf(_SC_PAGESIZE), off = 0;
	char fname[GROUP_MAX + 64];
	int ret = -ENOMEM;

	*ret_plan = NULL;
	if (err && errlen)
		err[0] = '\0';
	if (a->n_tensors > 0 && !a->tensors) {
		tr_fmt(err, errlen, "tensors is NULL with n_tensors %zu", a->n_tensors);
		return -EINVAL;
	}
	if (a->n_blobs > 0 && !a->blobs) {
		tr_fmt(err, errlen, "blobs is NULL with n_blobs %zu", a->n_blobs);
		return -EINVAL;
	}
	ret = make_sig(a, &g);
	if (ret < 0)
		goto out;
	if (prev && *prev && (*prev)->sig_len == g.len && !memcmp((*prev)->sig, g.b, g.len)) {
		ret = rebind(*prev, a, err, errlen);
		if (ret < 0)
			goto out;
		*ret_plan = *prev;
		*prev = NULL;
		goto out;
	}
	ret = -ENOMEM;
	p = calloc(1, sizeof(*p));
	all = calloc(a->n_tensors + 1, sizeof(*all));
	if (!p || !all)
		goto out;
	/* Every descriptor is checked, replicas too: a bad one is a caller bug on every rank. */
	for (size_t i = 0; i < a->n_tensors; i++) {
		ret = check_tensor(&a->tensors[i], i, a->num_layers, &all[i], err, errlen);
		if (ret < 0)
			goto out;
	}
	qsort(all, a->n_tensors, sizeof(*all), cmp_group_name_index);
	/* Pieces of one name: each must place a different piece; the k-th goes to part k. */
	for (size_t i = 1; i < a->n_tensors; i++) {
		if (cmp_group_name(&all[i - 1], &all[i]))
			continue;
		all[i].part = all[i - 1].part + 1;
		for (size_t j = i - all[i].part; j < i; j++)
			if (same_placement(all[j].tensor, all[i].tensor)) {
				ret = -EINVAL;
				tr_fmt(err, errlen, "tensor '%s' (group '%s'): given twice (#%zu and "
				       "#%zu) for the same part of the tensor", all[i].tensor->name,
				       group_of(all[i].tensor), all[j].index, all[i].index);
				goto out;
			}
	}
	/* Keep the written ones, grouped by (group, part). */
	for (size_t i = 0; i < a->n_tensors; i++)
		if (!all[i].tensor->replica)
			all[n_all++] = all[i];
	qsort(all, n_all, sizeof(*all), cmp_group_part_name);
	for (size_t i = 0; i < n_all; i++)
		if (i == 0 || strcmp(group_of(all[i].tensor), group_of(all[i - 1].tensor)) ||
		    all[i].part != all[i - 1].part)
			n_groups++;
	p->outs = calloc(n_groups + a->n_blobs + 1, sizeof(*p->outs));
	if (!p->outs)
		goto out;
	for (size_t i = 0; i < n_all;) {
		struct tr_out *o = &p->outs[p->n_outs++];
		size_t j = i;
		uint64_t data = 0;

		while (j < n_all && !strcmp(group_of(all[j].tensor), group_of(all[i].tensor)) &&
		       all[j].part == all[i].part)
			j++;
		tr_tensor_file_name(fname, sizeof(fname), group_of(all[i].tensor), a->rank,
				    all[i].part);
		o->name = strdup(fname);
		o->group = strdup(group_of(all[i].tensor));
		o->items = malloc((j - i) * sizeof(*o->items));
		if (!o->name || !o->group || !o->items)
			goto out;
		memcpy(o->items, all + i, (j - i) * sizeof(*o->items));
		o->n_items = j - i;
		qsort(o->items, o->n_items, sizeof(*o->items), cmp_item);
		ret = build_header(o, a->num_layers, err, errlen);
		if (ret < 0)
			goto out;
		ret = -ENOMEM;
		for (size_t k = 0; k < o->n_items; k++) {
			o->items[k].data_off = o->header_len + data;
			/* Each item is below 2^61 bytes (its element count times its bits fit 64
			 * bits), so the sum cannot wrap before it passes FILE_MAX. */
			data += o->items[k].bytes;
			if (data > FILE_MAX - o->header_len) {
				ret = -EFBIG;
				tr_fmt(err, errlen, "%s: more than 2^63-1 bytes (tensor '%s')", o->name,
				       o->items[k].tensor->name);
				goto out;
			}
			if (o->items[k].tensor->device >= 0)
				p->any_device = 1;
		}
		o->size = o->header_len + data;
		i = j;
	}
	for (size_t b = 0; b < a->n_blobs; b++) {
		const struct ckptfs_blob *bl = &a->blobs[b];
		const char *n = bl->name;
		struct tr_out *o;

		if (!n || !n[0] || strlen(n) > BLOB_NAME_MAX || n[0] == '.' || strchr(n, '/') ||
		    !strcmp(n, TR_MARKER_NAME)) {
			ret = -EINVAL;
			tr_fmt(err, errlen, "blob #%zu '%s': invalid name (a plain file name of 1..%d "
			       "bytes, no '/', not starting with '.', not %s)", b, n ? n : "(null)",
			       BLOB_NAME_MAX, TR_MARKER_NAME);
			goto out;
		}
		if (bl->len > 0 && !bl->data) {
			ret = -EINVAL;
			tr_fmt(err, errlen, "blob '%s': NULL data", n);
			goto out;
		}
		for (size_t k = 0; k < p->n_outs; k++)
			if (!strcmp(p->outs[k].name, n)) {
				ret = -EINVAL;
				tr_fmt(err, errlen, "blob '%s': name used twice in this save", n);
				goto out;
			}
		o = &p->outs[p->n_outs++];
		o->name = strdup(n);
		if (!o->name)
			goto out;
		o->blob = bl;
		o->size = bl->len;
	}
	for (size_t k = 0; k < p->n_outs; k++) {
		/* Sizes are at most FILE_MAX each: the sum is checked before it can wrap, so the
		 * layout never places an image over another one (or past the pool's end). */
		if (p->outs[k].size > FILE_MAX - pg || off > FILE_MAX - pg - p->outs[k].size) {
			ret = -EFBIG;
			tr_fmt(err, errlen, "%s: the save's files total more than 2^63-1 bytes",
			       p->outs[k].name);
			goto out;
		}
		p->outs[k].pool_off = off;
		off = align_up(off + p->outs[k].size, pg);
		p->bytes += p->outs[k].size;
	}
	p->pool_bytes = off;
	p->sig = g.b;
	p->sig_len = g.len;
	g.b = NULL;
	ret = 0;
	*ret_plan = p;
	p = NULL;
out:
	if (ret == -ENOMEM && err && !err[0])
		tr_fmt(err, errlen, "out of memory planning the save");
	tr_plan_free(p);
	free(all);
	free(g.b);
	return ret;
}

void tr_plan_free(struct tr_plan *p)
{
	if (!p)
		return;
	for (size_t k = 0; k < p->n_outs; k++) {
		free(p->outs[k].name);
		free(p->outs[k].group);
		free(p->outs[k].header);
		free(p->outs[k].items);
	}
	free(p->outs);
	free(p->sig);
	free(p);
}
