/* SPDX-License-Identifier: MIT */
/*
 * plan.c - the files of a view in its layout: their names when the view is
 * built, and on first use of each file its plan: which global tensors it
 * holds (those placed on its pipeline stage, each cut to its TP rank's
 * part), their order and offsets, and its safetensors header, which fixes
 * its size.
 *
 * Tensors are ordered by dtype size, largest first, then by name, so that
 * every tensor's data stays aligned to its element size.
 */
#include "views/view_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

struct order {
	size_t g;
	unsigned bits;
	const char *name;
};

static int order_cmp(const void *a, const void *b)
{
	const struct order *x = a, *y = b;

	if (x->bits != y->bits)
		return x->bits > y->bits ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* Sort ord (in name order: global tensors are) by order_cmp: a stable
 * pass per dtype size, largest first, instead of comparing names. */
static void order_by_bits(struct order *ord, size_t n)
{
	unsigned bits[8];
	size_t nb = 0, k = 0;
	struct order *tmp;

	for (size_t i = 0; i < n; i++) {
		size_t j;
		for (j = 0; j < nb && bits[j] != ord[i].bits; j++)
			;
		if (j == nb) {
			if (nb == CKPT_ARRAY_SIZE(bits))
				goto fallback;
			bits[nb++] = ord[i].bits;
		}
		if (i && strcmp(ord[i - 1].name, ord[i].name) >= 0)
			goto fallback; /* not in name order after all */
	}
	tmp = malloc((n ? n : 1) * sizeof(*tmp));
	if (!tmp)
		goto fallback;
	while (nb) {
		size_t top = 0;
		for (size_t j = 1; j < nb; j++)
			if (bits[j] > bits[top])
				top = j;
		for (size_t i = 0; i < n; i++)
			if (ord[i].bits == bits[top])
				tmp[k++] = ord[i];
		bits[top] = bits[--nb];
	}
	memcpy(ord, tmp, n * sizeof(*ord));
	free(tmp);
	return;
fallback:
	qsort(ord, n, sizeof(*ord), order_cmp);
}

struct plan_meta_ctx {
	const ckpt_view *v;
	const struct vfile_plan *f;
	uint64_t num_layers;
};

/* The output metadata of tensor i of a file being planned (into *tmp). */
static const struct ckpt_tensor_meta *plan_meta(void *ud, size_t i, const char **ret_name,
						 struct ckpt_tensor_meta *tmp)
{
	const struct plan_meta_ctx *c = ud;
	const struct gtensor *g = &c->v->m->gts[c->f->t[i].g];

	*ret_name = g->name;
	memset(tmp, 0, sizeof(*tmp));
	vw_part_box(g, c->v->layout.tp, c->f->tp_rank, &tmp->geom.box);
	tmp->ndim = g->ndim;
	memcpy(tmp->global_shape, g->gshape, sizeof(g->gshape));
	tmp->tp_dim = g->tp_dim;
	tmp->has_pp = true;
	tmp->pp = g->pp;
	if (g->pp.kind == CKPT_PP_LAYER && g->pp.layer >= c->num_layers)
		tmp->pp.kind = CKPT_PP_LAST; /* where layout.c placed it */
	return tmp;
}

static int plan_file(ckpt_view *v, struct vfile_plan *f)
{
	size_t group = f->group;
	unsigned t = f->tp_rank, p = f->pp_rank;
	const struct vgroup *grp = &v->m->groups[group];
	size_t n = grp->g1 - grp->g0, k = 0, ndims = 0;
	struct order *ord = calloc(n ? n : 1, sizeof(*ord));
	struct ckpt_st_tensor_spec *specs = NULL;
	struct plan_meta_ctx mc = { v, f, grp->num_layers };
	uint64_t *shapes = NULL;
	char *meta_json = NULL;
	uint64_t off = 0;
	int r = -ENOMEM;

	if (!ord)
		goto out;
	for (size_t gi = grp->g0; gi < grp->g1; gi++) {
		const struct gtensor *g = &v->m->gts[gi];
		if (!ckpt_pp_on_stage(&g->pp, grp->num_layers, v->layout.pp, p))
			continue;
		ord[k].g = gi;
		ord[k].bits = ckpt_dtype_bits(g->dtype);
		ord[k].name = g->name;
		ndims += g->ndim;
		k++;
	}
	order_by_bits(ord, k);
	f->t = calloc(k ? k : 1, sizeof(*f->t));
	specs = calloc(k ? k : 1, sizeof(*specs));
	shapes = calloc(ndims ? ndims : 1, sizeof(*shapes));
	if (!f->t || !specs || !shapes)
		goto out;
	f->nt = k;
	f->group = group;
	ndims = 0;
	for (size_t i = 0; i < k; i++) {
		const struct gtensor *g = &v->m->gts[ord[i].g];
		struct vtensor *vt = &f->t[i];
		struct ckpt_box box;

		vt->g = ord[i].g;
		vw_part_box(g, v->layout.tp, t, &box);
		vt->nbytes = ckpt_box_elems(&box) * g->elem_bytes;
		vt->data_off = off;
		off += vt->nbytes;
		specs[i].name = g->name;
		specs[i].dtype = g->dtype;
		specs[i].ndim = g->ndim;
		specs[i].shape = shapes + ndims;
		memcpy(shapes + ndims, box.shape, g->ndim * sizeof(*shapes));
		ndims += g->ndim;
	}
	r = ckpt_shardmeta_serialize_cb(grp->name, true, grp->num_layers, k, plan_meta, &mc,
					&meta_json);
	if (r < 0)
		goto out;
	{
		const char *keys[] = { "format", CKPT_SHARDMETA_KEY };
		const char *vals[] = { "pt", meta_json };
		r = ckpt_st_serialize(specs, k, keys, vals, 2, &f->hdr, &f->hdr_len);
	}
	if (r < 0)
		goto out;
	f->size = f->hdr_len + off;
out:
	free(ord);
	free(specs);
	free(shapes);
	free(meta_json);
	return r;
}

int vw_plan_files(ckpt_view *v)
{
	size_t per = (size_t)v->layout.tp * v->layout.pp;

	v->files = calloc(v->m->ngroups * per + 1, sizeof(*v->files));
	if (!v->files)
		return -ENOMEM;
	/* Only names here: headers (which fix the sizes) are built on first
	 * use of each file (vw_ensure_plan), so a stat of one file of a tp8_pp4
	 * view does not serialize 32 headers. */
	for (size_t gi = 0; gi < v->m->ngroups; gi++) {
		for (unsigned p = 0; p < v->layout.pp; p++) {
			for (unsigned t = 0; t < v->layout.tp; t++) {
				struct vfile_plan *f = &v->files[v->nfiles++];
				int r;
				f->group = gi;
				f->tp_rank = t;
				f->pp_rank = p;
				if (v->layout.tp == 1 && v->layout.pp == 1)
					r = asprintf(&f->name, "%s.safetensors", v->m->groups[gi].name);
				else
					r = asprintf(&f->name, "%s_tp%u_pp%u.safetensors",
						     v->m->groups[gi].name, t, p);
				if (r < 0) {
					f->name = NULL;
					return -ENOMEM;
				}
			}
		}
	}
	return 0;
}

int vw_ensure_plan(ckpt_view *v, size_t i)
{
	struct vfile_plan *f = &v->files[i];
	int r;

	pthread_mutex_lock(&v->plan_lock);
	if (!f->planned) {
		f->plan_err = plan_file(v, f);
		f->planned = true;
	}
	r = f->plan_err;
	pthread_mutex_unlock(&v->plan_lock);
	return r;
}

void vw_plans_free(struct vfile_plan *files, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(files[i].name);
		free(files[i].hdr);
		free(files[i].t);
	}
	free(files);
}
