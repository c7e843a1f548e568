/* SPDX-License-Identifier: MIT */
/*
 * view.c - the view object (see view.h): building a view from its model
 * (model.c) and the names of its files (plan.c), its lifetime, and what it
 * tells about its files and groups.
 *
 * Invariants:
 *  V1. A view never changes after ckpt_view_build() returns (its files are
 *      only planned, and marked verified, on first use); neither do its
 *      model and the parses of its sources, which other views share.
 *  V2. The runs of each tensor of an open file are sorted by dst and tile
 *      the tensor's bytes [hdr_len + data_off, + nbytes) exactly (no gap,
 *      no overlap); the tensors tile [hdr_len, size) in order.
 */
#include "views/view_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/util.h"

void ckpt_view_ref(ckpt_view *v)
{
	atomic_fetch_add(&v->refs, 1);
}

static void view_destroy(ckpt_view *v)
{
	vw_model_unref(v->m);
	vw_plans_free(v->files, v->nfiles);
	pthread_mutex_destroy(&v->plan_lock);
	free(v);
}

void ckpt_view_unref(ckpt_view *v)
{
	if (v && atomic_fetch_sub(&v->refs, 1) == 1)
		view_destroy(v);
}

int ckpt_view_build(ckpt_store *s, uint64_t dir, const struct ckpt_layout *l,
		    const ckpt_tp_rules *rules, ckpt_view **ret_view, char *err, size_t errlen)
{
	struct ckpt_inode din;
	ckpt_view *v;
	int r;

	if (l->tp < 1 || l->pp < 1 || l->tp > CKPT_LAYOUT_MAX || l->pp > CKPT_LAYOUT_MAX)
		return -EINVAL;
	r = ckpt_store_getattr(s, dir, &din);
	if (r < 0)
		return r;
	if (!S_ISDIR(din.mode))
		return -ENOTDIR;
	v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	atomic_init(&v->refs, 1);
	pthread_mutex_init(&v->plan_lock, NULL);
	v->s = s;
	v->layout = *l;
	r = vw_model_get(s, dir, din.mtime_ns, rules, &v->m, err, errlen);
	if (r == 0)
		r = vw_plan_files(v);
	if (r < 0) {
		if (r == -ENOMEM)
			ckpt_errf(err, errlen, "out of memory");
		view_destroy(v);
		return r;
	}
	*ret_view = v;
	return 0;
}

void ckpt_view_forget_store(ckpt_store *s)
{
	vw_source_forget_store(s);
	vw_model_forget_store(s);
}

void ckpt_view_cache_stats(struct ckpt_view_cache_stats *ret)
{
	ret->models = vw_model_count();
	ret->sources = vw_source_count();
	ret->model_bytes = vw_model_kept_bytes();
	ret->source_bytes = vw_source_kept_bytes();
}

void ckpt_view_cache_set_budget(size_t bytes)
{
	vw_model_set_budget(bytes);
	vw_source_set_budget(bytes / 2);
}

uint64_t ckpt_view_sig(const ckpt_view *v)
{
	return v->m->sig;
}

size_t ckpt_view_nfiles(const ckpt_view *v)
{
	return v->nfiles;
}

const char *ckpt_view_file_name(const ckpt_view *v, size_t i)
{
	return v->files[i].name;
}

uint64_t ckpt_view_file_size(ckpt_view *v, size_t i)
{
	int r = vw_ensure_plan(v, i);

	if (r < 0) {
		ckpt_err("view file %s: cannot build its header: %s", v->files[i].name,
			 strerror(-r));
		return 0;
	}
	return v->files[i].size;
}

int ckpt_view_find(const ckpt_view *v, const char *name)
{
	for (size_t i = 0; i < v->nfiles; i++)
		if (!strcmp(v->files[i].name, name))
			return (int)i;
	return -ENOENT;
}

int64_t ckpt_view_mtime(const ckpt_view *v)
{
	return v->m->mtime_ns;
}

bool ckpt_view_is_source(const ckpt_view *v, uint64_t ino)
{
	for (size_t i = 0; i < v->m->nsrcs; i++)
		if (v->m->srcs[i].ino == ino)
			return v->m->srcs[i].d->source;
	return false;
}

size_t ckpt_view_nsources(const ckpt_view *v)
{
	return v->m->nsrcs;
}

const struct ckpt_extent_list *ckpt_view_source_extents(const ckpt_view *v, size_t i)
{
	return v->m->srcs[i].d->ext;
}

size_t ckpt_view_ngroups(const ckpt_view *v)
{
	return v->m->ngroups;
}

void ckpt_view_group_info(const ckpt_view *v, size_t i, struct ckpt_view_group_info *ret)
{
	const struct vgroup *g = &v->m->groups[i];

	memset(ret, 0, sizeof(*ret));
	ret->name = g->name;
	ret->tensors = g->g1 - g->g0;
	ret->files = g->nfiles;
	ret->saved_tp = g->saved_tp;
	ret->saved_pp = g->saved_pp;
	ret->num_layers = g->num_layers;
	for (size_t k = g->g0; k < g->g1; k++) {
		const struct gtensor *t = &v->m->gts[k];
		if (t->problem_nometa || t->nometa_bytes)
			ret->nometa++;
		else if (t->problem)
			ret->problems++;
	}
}
