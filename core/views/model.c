/* SPDX-License-Identifier: MIT */
/*
 * model.c - the layout-independent part of a view (struct vmodel): the
 * sources of a directory -> pieces (one per stored tensor) -> global
 * tensors (pieces of one group with one name, sorted by group then name)
 * -> groups (with the layout the sources were saved in).  Models are
 * shared through a process-wide cache by the views of every layout of an
 * unchanged directory.
 *
 * What pieces disagree on (dtype, global shape, tp_dim) is recorded on the
 * global tensor as its problem, reported when a file holding it is opened;
 * coverage and the bytes of replicas are checked at open (vcheck.c).
 * Pieces from files without ckptfs metadata that differ in shape (or, by
 * their chunk digests, in bytes) are what per-rank slices saved under the
 * global name look like: they are flagged as such, counted for `ckpt ls`
 * and logged once per build.
 */
#include "views/view_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/util.h"

static void model_destroy(struct vcache_node *n);
static struct vcache model_cache = VCACHE_INIT(16, model_destroy, CKPT_VIEW_CACHE_MEM_DEFAULT);

static void model_destroy(struct vcache_node *n)
{
	struct vmodel *m = vcache_entry(n, struct vmodel);

	for (size_t i = 0; i < m->nsrcs; i++) {
		free(m->srcs[i].name);
		vw_srcdata_unref(m->srcs[i].d);
	}
	free(m->srcs);
	free(m->pieces);
	for (size_t i = 0; i < m->ngts; i++)
		free(m->gts[i].problem);
	free(m->gts);
	for (size_t i = 0; i < m->ngroups; i++)
		free(m->groups[i].name);
	free(m->groups);
	free(m);
}

void vw_model_unref(struct vmodel *m)
{
	if (m)
		vcache_unref(&model_cache, &m->node);
}

void vw_model_forget_store(ckpt_store *s)
{
	vcache_forget_store(&model_cache, s);
}

size_t vw_model_count(void)
{
	return vcache_count(&model_cache);
}

size_t vw_model_kept_bytes(void)
{
	return vcache_kept_bytes(&model_cache);
}

void vw_model_set_budget(size_t bytes)
{
	vcache_set_budget(&model_cache, bytes);
}

/* What model m holds, for the cache's byte budget: its own tables and the
 * parses of its sources (which it keeps alive; a parse shared by several
 * models is counted in each). */
static size_t model_bytes(const struct vmodel *m)
{
	size_t b = sizeof(*m) + m->nsrcs * sizeof(*m->srcs) +
		   m->npieces * sizeof(*m->pieces) + m->ngts * sizeof(*m->gts) +
		   m->ngroups * sizeof(*m->groups);

	for (size_t i = 0; i < m->nsrcs; i++) {
		b += strlen(m->srcs[i].name) + 1;
		if (m->srcs[i].d)
			b += m->srcs[i].d->node.bytes;
	}
	for (size_t i = 0; i < m->ngts; i++)
		if (m->gts[i].problem)
			b += strlen(m->gts[i].problem) + 1;
	return b;
}

/* The sources among the entries of the model's directory (from
 * vw_scan_dir), and the latest mtime of its regular files. */
static int collect_sources(struct vmodel *v, ckpt_store *s, const struct ckpt_dirent *ents,
			   size_t n, const struct ckpt_inode *ins, char *err, size_t errlen)
{
	int r = 0;

	v->srcs = calloc(n ? n : 1, sizeof(*v->srcs));
	if (!v->srcs)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const struct ckpt_inode in = ins[i];
		struct src *src;

		if (!S_ISREG(ents[i].mode) || !in.ino)
			continue;
		if (in.mtime_ns > v->mtime_ns)
			v->mtime_ns = in.mtime_ns;
		if (!(in.flags & CKPT_INODE_F_SAFETENSORS))
			continue;
		src = &v->srcs[v->nsrcs++];
		src->ino = in.ino;
		src->mtime_ns = in.mtime_ns;
		src->name = strdup(ents[i].name);
		if (!src->name) {
			r = -ENOMEM;
			break;
		}
		r = vw_source_load(s, in.ino, in.size, in.mtime_ns, src->name, &src->d, err, errlen);
		if (r < 0)
			break;
	}
	return r;
}

/* -------------------------------------------------------------- tensors */

static int piece_cmp(const void *a, const void *b)
{
	const struct piece *x = a, *y = b;
	int c = x->group == y->group ? 0 : strcmp(x->group, y->group);

	if (c)
		return c;
	c = strcmp(x->t->name, y->t->name);
	if (c)
		return c;
	return x->src < y->src ? -1 : x->src > y->src;
}

/* Sources by group, then index. */
static int src_group_cmp(const void *a, const void *b, void *arg)
{
	const struct src *srcs = arg;
	size_t x = *(const size_t *)a, y = *(const size_t *)b;
	int c = strcmp(srcs[x].d->group, srcs[y].d->group);

	if (c)
		return c;
	return x < y ? -1 : x > y;
}

/* Merge heap over the sources of one group: the next tensor of each. */
struct mhead {
	size_t src, k;
};

static bool mhead_less(const struct vmodel *v, const struct mhead *a, const struct mhead *b)
{
	int c = strcmp(v->srcs[a->src].d->tensors[a->k].name, v->srcs[b->src].d->tensors[b->k].name);

	return c < 0 || (c == 0 && a->src < b->src);
}

static void mheap_down(const struct vmodel *v, struct mhead *h, size_t n, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, m = i;
		struct mhead t;
		if (l < n && mhead_less(v, &h[l], &h[m]))
			m = l;
		if (l + 1 < n && mhead_less(v, &h[l + 1], &h[m]))
			m = l + 1;
		if (m == i)
			return;
		t = h[i];
		h[i] = h[m];
		h[m] = t;
		i = m;
	}
}

static void add_piece(struct vmodel *v, size_t si, size_t k)
{
	const struct srcdata *src = v->srcs[si].d;
	struct piece *p = &v->pieces[v->npieces++];

	p->src = si;
	p->t = &src->tensors[k];
	p->group = src->group;
	p->m = &src->metas[k];
}

/* Pieces in (group, name, source) order.  Source tables are in name order
 * (sort_table), so the sources of each group are merged; a table that is
 * not (sort_table ran out of memory) falls back to sorting every piece. */
static int collect_pieces(struct vmodel *v)
{
	size_t n = 0, ns = 0, *order = NULL;
	struct mhead *heap = NULL;
	bool sorted = true;

	for (size_t i = 0; i < v->nsrcs; i++) {
		const struct srcdata *src = v->srcs[i].d;
		if (!src->source)
			continue;
		n += src->ntensors;
		ns++;
		for (size_t k = 1; k < src->ntensors && sorted; k++)
			if (strcmp(src->tensors[k - 1].name, src->tensors[k].name) > 0)
				sorted = false;
	}
	v->pieces = calloc(n ? n : 1, sizeof(*v->pieces));
	order = calloc(ns ? ns : 1, sizeof(*order));
	heap = calloc(ns ? ns : 1, sizeof(*heap));
	if (!v->pieces || !order || !heap) {
		free(order);
		free(heap);
		return -ENOMEM;
	}
	ns = 0;
	for (size_t i = 0; i < v->nsrcs; i++)
		if (v->srcs[i].d->source)
			order[ns++] = i;
	if (!sorted) {
		for (size_t j = 0; j < ns; j++)
			for (size_t k = 0; k < v->srcs[order[j]].d->ntensors; k++)
				add_piece(v, order[j], k);
		qsort(v->pieces, v->npieces, sizeof(*v->pieces), piece_cmp);
		goto out;
	}
	qsort_r(order, ns, sizeof(*order), src_group_cmp, v->srcs);
	for (size_t a = 0, b; a < ns; a = b) {
		size_t nh = 0;
		for (b = a; b < ns && !strcmp(v->srcs[order[b]].d->group, v->srcs[order[a]].d->group); b++)
			if (v->srcs[order[b]].d->ntensors) {
				heap[nh].src = order[b];
				heap[nh].k = 0;
				nh++;
			}
		for (size_t i = nh / 2; i-- > 0;)
			mheap_down(v, heap, nh, i);
		while (nh) {
			add_piece(v, heap[0].src, heap[0].k);
			if (++heap[0].k == v->srcs[heap[0].src].d->ntensors)
				heap[0] = heap[--nh];
			mheap_down(v, heap, nh, 0);
		}
	}
out:
	free(order);
	free(heap);
	return 0;
}

/* Record the first problem of g; returns true if this one was recorded. */
static bool problem(struct gtensor *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool problem(struct gtensor *g, const char *fmt, ...)
{
	va_list ap;

	if (g->problem)
		return false; /* keep the first */
	va_start(ap, fmt);
	if (vasprintf(&g->problem, fmt, ap) < 0)
		g->problem = NULL;
	va_end(ap);
	return g->problem != NULL;
}

void vw_fmt_files(const struct vmodel *m, const struct gtensor *g, char *buf, size_t len)
{
	size_t n = g->p1 - g->p0, used;
	int w = snprintf(buf, len, "%zu files (", n);

	if (w < 0 || (size_t)w >= len)
		return;
	used = (size_t)w;
	for (size_t i = 0; i < n && i < 4 && used < len; i++) {
		w = snprintf(buf + used, len - used, "%s%s", i ? ", " : "",
			     m->srcs[m->pieces[g->p0 + i].src].name);
		if (w < 0)
			return;
		used += (size_t)w;
	}
	if (used < len && n > 4)
		used += (size_t)snprintf(buf + used, len - used, ", and %zu more", n - 4);
	if (used < len)
		snprintf(buf + used, len - used, ")");
}

/* Resolve dtype, shape, tp_dim and pp of one global tensor. */
static void resolve(struct vmodel *v, struct gtensor *g, const ckpt_tp_rules *rules)
{
	const struct piece *p0 = &v->pieces[g->p0];
	unsigned split_dims = 0;
	int split = -1, tp = CKPT_TP_DIM_UNSET;
	bool have_pp = false;

	g->name = p0->t->name;
	g->dtype = p0->t->dtype;
	g->elem_bytes = ckpt_dtype_bits(g->dtype) / 8;
	g->ndim = p0->m->ndim;
	memcpy(g->gshape, p0->m->gs, g->ndim * sizeof(g->gshape[0]));
	for (size_t i = g->p0; i < g->p1; i++) {
		const struct piece *p = &v->pieces[i];
		if (p->t->dtype != g->dtype) {
			problem(g, "pieces disagree on dtype: %s in %s, %s in %s",
				ckpt_dtype_name(g->dtype), v->srcs[p0->src].name,
				ckpt_dtype_name(p->t->dtype), v->srcs[p->src].name);
		}
		if (p->m->ndim != g->ndim ||
		    memcmp(p->m->gs, g->gshape, g->ndim * sizeof(g->gshape[0])) != 0) {
			char a[128], b[128];
			ckpt_st_fmt_shape(a, sizeof(a), g->gshape, g->ndim);
			ckpt_st_fmt_shape(b, sizeof(b), p->m->gs, p->m->ndim);
			if (!v->srcs[p0->src].d->described && !v->srcs[p->src].d->described) {
				/* whole tensors of plain files: most likely each rank saved
				 * its own slice under the global name */
				char files[512];
				vw_fmt_files(v, g, files, sizeof(files));
				if (problem(g, "is in %s with different shapes (%s in %s, %s in %s) "
					       "and no sharding metadata: " VW_NOMETA_HINT,
					    files, a, v->srcs[p0->src].name, b, v->srcs[p->src].name))
					g->problem_nometa = true;
			}
			problem(g, "pieces disagree on global shape: %s in %s, %s in %s", a,
				v->srcs[p0->src].name, b, v->srcs[p->src].name);
		}
		if (p->m->tp_dim != CKPT_TP_DIM_UNSET) {
			if (tp != CKPT_TP_DIM_UNSET && tp != p->m->tp_dim)
				problem(g, "pieces disagree on tp_dim (%d in %s, %d in %s)", tp,
					v->srcs[p0->src].name, p->m->tp_dim, v->srcs[p->src].name);
			tp = p->m->tp_dim;
		}
		if (p->m->has_pp && !have_pp) {
			g->pp = p->m->pp;
			have_pp = true;
		}
		for (unsigned d = 0; d < p->m->ndim && d < CKPT_MAX_DIMS; d++) {
			if (p->m->shape[d] != p->m->gs[d] && !(split_dims & (1u << d))) {
				split_dims |= 1u << d;
				split = (int)d;
			}
		}
	}
	if (tp == CKPT_TP_DIM_UNSET) {
		if (split_dims && !(split_dims & (split_dims - 1)))
			tp = split; /* exactly one split dim */
		else
			tp = ckpt_tp_rules_dim(rules, g->name, g->ndim);
	}
	if (tp >= (int)g->ndim)
		tp = -1;
	g->tp_dim = tp;
	if (!have_pp)
		ckpt_pp_from_name(g->name, &g->pp);
}

/*
 * Do g's pieces without sharding metadata (whole tensors of plain files, of
 * one shape since g has no problem) hold different bytes?  Decided from
 * the chunk digests in memory, without I/O: undecided comparisons (chunks
 * that do not line up) count as equal here and are settled by an open.
 */
static void find_nometa_bytes(const struct vmodel *v, struct gtensor *g)
{
	const struct piece *first = NULL;

	if (g->problem || g->p1 - g->p0 < 2)
		return;
	for (size_t i = g->p0; i < g->p1 && !g->nometa_bytes; i++) {
		const struct piece *p = &v->pieces[i];
		const struct srcdata *d = v->srcs[p->src].d, *fd;
		if (d->described || !d->ext)
			continue;
		if (!first) {
			first = p;
			continue;
		}
		fd = v->srcs[first->src].d;
		if (vw_same_digests(fd->ext, fd->data_start + first->t->begin, d->ext,
				    d->data_start + p->t->begin, p->t->end - p->t->begin) == 0)
			g->nometa_bytes = true;
	}
}

/* Infer the layout the sources of a group were saved in. */
static void infer_saved_layout(struct vmodel *v, struct vgroup *grp)
{
	uint64_t *firsts = NULL;
	size_t nf = 0;

	grp->saved_tp = 1;
	grp->saved_pp = 1;
	for (size_t gi = grp->g0; gi < grp->g1; gi++) {
		const struct gtensor *g = &v->gts[gi];
		unsigned parts = 0;
		uint64_t seen[64];
		size_t nseen = 0;
		if (g->tp_dim < 0)
			continue;
		for (size_t i = g->p0; i < g->p1; i++) {
			const struct piece *p = &v->pieces[i];
			uint64_t off = p->m->off[g->tp_dim];
			size_t k;
			if (p->m->shape[g->tp_dim] == g->gshape[g->tp_dim])
				continue;
			for (k = 0; k < nseen && seen[k] != off; k++)
				;
			if (k == nseen && nseen < CKPT_ARRAY_SIZE(seen))
				seen[nseen++] = off;
		}
		parts = (unsigned)nseen;
		if (parts > grp->saved_tp)
			grp->saved_tp = parts;
	}
	/* pipeline stages: distinct first layers among the group's files */
	firsts = calloc(v->nsrcs ? v->nsrcs : 1, sizeof(*firsts));
	if (!firsts)
		return;
	for (size_t si = 0; si < v->nsrcs; si++) {
		const struct srcdata *src = v->srcs[si].d;
		uint64_t first = UINT64_MAX;
		size_t k;
		if (!src->source || strcmp(src->group, grp->name))
			continue;
		for (size_t i = 0; i < src->ntensors; i++) {
			const struct smeta *m = &src->metas[i];
			struct ckpt_pp pp;
			if (m->has_pp)
				pp = m->pp;
			else
				ckpt_pp_from_name(src->tensors[i].name, &pp);
			if (pp.kind == CKPT_PP_LAYER && pp.layer < first)
				first = pp.layer;
		}
		if (first == UINT64_MAX)
			continue;
		for (k = 0; k < nf && firsts[k] != first; k++)
			;
		if (k == nf)
			firsts[nf++] = first;
	}
	if (nf > 1)
		grp->saved_pp = (unsigned)nf;
	free(firsts);
}

static int build_groups(struct vmodel *v, const ckpt_tp_rules *rules)
{
	v->gts = calloc(v->npieces ? v->npieces : 1, sizeof(*v->gts));
	v->groups = calloc(v->npieces ? v->npieces : 1, sizeof(*v->groups));
	if (!v->gts || !v->groups)
		return -ENOMEM;
	for (size_t i = 0; i < v->npieces;) {
		const struct piece *p = &v->pieces[i];
		struct gtensor *g = &v->gts[v->ngts];
		size_t j = i + 1;

		while (j < v->npieces &&
		       (v->pieces[j].group == p->group || !strcmp(v->pieces[j].group, p->group)) &&
		       !strcmp(v->pieces[j].t->name, p->t->name))
			j++;
		if (v->ngroups == 0 || strcmp(v->groups[v->ngroups - 1].name, p->group)) {
			struct vgroup *grp = &v->groups[v->ngroups++];
			grp->name = strdup(p->group);
			if (!grp->name)
				return -ENOMEM;
			grp->g0 = v->ngts;
		}
		g->p0 = i;
		g->p1 = j;
		g->group = v->ngroups - 1;
		resolve(v, g, rules);
		find_nometa_bytes(v, g);
		v->ngts++;
		v->groups[v->ngroups - 1].g1 = v->ngts;
		i = j;
	}
	for (size_t gi = 0; gi < v->ngroups; gi++) {
		struct vgroup *grp = &v->groups[gi];
		bool explicit = false;
		uint64_t n = 0;

		for (size_t si = 0; si < v->nsrcs; si++) {
			uint64_t x;
			const struct srcdata *d = v->srcs[si].d;
			if (!d->source || strcmp(d->group, grp->name))
				continue;
			grp->nfiles++;
			x = d->nl;
			if (d->has_nl) {
				if (!explicit || x > n)
					n = x;
				explicit = true;
			}
		}
		if (!explicit) {
			/* at most 2^63 - 1, what a view file's num_layers can hold: a layer
			 * index of 2^63 - 1 then goes to the last stage (as L >= N does) */
			for (size_t k = grp->g0; k < grp->g1; k++)
				if (v->gts[k].pp.kind == CKPT_PP_LAYER && v->gts[k].pp.layer >= n)
					n = v->gts[k].pp.layer < INT64_MAX ? v->gts[k].pp.layer + 1
									   : INT64_MAX;
		}
		grp->num_layers = n;
		infer_saved_layout(v, grp);
	}
	return 0;
}

void vw_part_box(const struct gtensor *g, unsigned T, unsigned t, struct ckpt_box *b)
{
	memset(b, 0, sizeof(*b));
	b->ndim = g->ndim;
	for (unsigned d = 0; d < g->ndim; d++)
		b->shape[d] = g->gshape[d];
	if (g->tp_dim >= 0) {
		uint64_t lo, hi;
		ckpt_tp_bounds(g->gshape[g->tp_dim], T, t, &lo, &hi);
		b->off[g->tp_dim] = lo;
		b->shape[g->tp_dim] = hi - lo;
	}
}

/* Log, once per build of a model, the tensors of each group that several
 * plain files hold with different contents: every view file holding one
 * will fail to open, and the fix is on the writer's side. */
static void warn_nometa(const struct vmodel *v)
{
	for (size_t gi = 0; gi < v->ngroups; gi++) {
		const struct vgroup *grp = &v->groups[gi];
		const struct gtensor *first = NULL;
		size_t n = 0;
		char files[512], more[64] = "";

		for (size_t k = grp->g0; k < grp->g1; k++) {
			const struct gtensor *g = &v->gts[k];
			if (!g->problem_nometa && !g->nometa_bytes)
				continue;
			if (!first)
				first = g;
			n++;
		}
		if (!first)
			continue;
		if (n > 1)
			snprintf(more, sizeof(more), " (and %zu more tensor(s) like it)", n - 1);
		if (first->problem_nometa) {
			ckpt_warn("group '%s', tensor '%s' %s%s", grp->name, first->name,
				  first->problem, more);
		} else {
			vw_fmt_files(v, first, files, sizeof(files));
			ckpt_warn("group '%s', tensor '%s' is in %s with different bytes and no "
				  "sharding metadata: " VW_NOMETA_HINT "%s",
				  grp->name, first->name, files, more);
		}
	}
}

/* ---------------------------------------------------------------- cache */

/* A model whose directory is gone, or one of whose sources is gone or has
 * another size or mtime, has a signature no scan gives again: it is never
 * found again.  Gone: no inode, or an orphan (nlink 0: removed, kept while
 * in use).  (Files added beside its sources make it as useless, but telling
 * needs a scan of the directory: such a model goes by age.) */
static bool model_dead(const struct vcache_node *n)
{
	const struct vmodel *m = vcache_entry(n, const struct vmodel);
	struct ckpt_inode in;
	int r = ckpt_store_getattr(n->s, m->dir, &in);

	if (r == -ENOENT || (r == 0 && (in.nlink == 0 || !S_ISDIR(in.mode))))
		return true;
	for (size_t i = 0; r == 0 && i < m->nsrcs; i++) {
		const struct src *src = &m->srcs[i];
		r = ckpt_store_getattr(n->s, src->ino, &in);
		if (r == -ENOENT || (r == 0 && (in.nlink == 0 || in.size != src->d->size ||
						in.mtime_ns != src->d->mtime_ns)))
			return true;
	}
	return false; /* or unknown (an I/O error): kept */
}

struct model_key {
	ckpt_store *s;
	uint64_t dir, sig;
	const ckpt_tp_rules *rules;
};

static bool model_match(const struct vcache_node *n, const void *key)
{
	const struct vmodel *m = vcache_entry(n, const struct vmodel);
	const struct model_key *k = key;

	return n->s == k->s && m->dir == k->dir && m->sig == k->sig && m->rules == k->rules;
}

int vw_model_get(ckpt_store *s, uint64_t dir, int64_t dir_mtime_ns, const ckpt_tp_rules *rules,
		 struct vmodel **ret, char *err, size_t errlen)
{
	struct ckpt_inode *ins = NULL;
	struct ckpt_dirent *ents = NULL;
	struct vcache_node *n;
	struct vmodel *m;
	size_t nents = 0;
	uint64_t sig;
	int r = vw_scan_dir(s, dir, &ents, &nents, &ins, &sig);

	if (r < 0) {
		ckpt_errf(err, errlen, "cannot list directory: %s", strerror(-r));
		return r;
	}
	{
		struct model_key key = { s, dir, sig, rules };
		n = vcache_find(&model_cache, model_match, &key);
	}
	if (n) {
		m = vcache_entry(n, struct vmodel);
		goto out;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		r = -ENOMEM;
		goto out;
	}
	m->dir = dir;
	m->sig = sig;
	m->rules = rules;
	m->mtime_ns = dir_mtime_ns;
	r = collect_sources(m, s, ents, nents, ins, err, errlen);
	if (r == 0)
		r = collect_pieces(m);
	if (r == 0)
		r = build_groups(m, rules);
	if (r < 0) {
		model_destroy(&m->node);
		m = NULL;
		goto out;
	}
	warn_nometa(m);
	m->node.bytes = model_bytes(m);
	vcache_insert(&model_cache, &m->node, s); /* the caller's reference and the cache's */
	/* A new model: the directories viewed changed.  The models and parses
	 * that can no longer be found go now rather than when they are the
	 * oldest, which could be many views later (a training job saves a new
	 * directory per step and deletes old ones).  Models first: they hold
	 * parses. */
	vcache_sweep(&model_cache, model_dead);
	vw_source_sweep();
out:
	ckpt_dirents_free(ents, nents);
	free(ins);
	*ret = m;
	return r;
}
