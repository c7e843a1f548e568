/* SPDX-License-Identifier: MIT */
/*
 * vcheck.c - the byte runs of each tensor of a view file, and the checks
 * that prove a tensor can be served.
 *
 * For every tensor, the pieces are reduced to distinct geometries (replicas
 * with identical geometry must have identical bytes: compared by chunk
 * digests, which tensor-aligned chunking makes equal for identical bytes,
 * else by reading).  When the distinct pieces are boxes whose parts of the
 * tensor are disjoint and add up to it, that proves the tensor
 * (vw_tensor_check); otherwise each distinct piece contributes byte runs
 * (layout.c), and a sweep over the runs in target order checks coverage and
 * compares the bytes where pieces of different geometry overlap
 * (vw_tensor_runs).  Every error names the group, the tensor, the source
 * files and the range.  Replicas that differ where neither file carries
 * ckptfs metadata are reported as what they most likely are: per-rank
 * slices saved under the global name, which need sharding metadata.
 */
#include "views/view_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

static int runvec_push(struct runvec *rv, const struct run *r)
{
	if (rv->n > 0) {
		/* merge with the previous run when contiguous in both files */
		struct run *last = &rv->v[rv->n - 1];
		if (last->src == r->src && last->dst + last->len == r->dst &&
		    last->src_off + last->len == r->src_off) {
			last->len += r->len;
			return 0;
		}
	}
	if (rv->n == rv->cap) {
		size_t nc = rv->cap ? rv->cap * 2 : 64;
		struct run *nv = realloc(rv->v, nc * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		rv->v = nv;
		rv->cap = nc;
	}
	rv->v[rv->n++] = *r;
	return 0;
}

struct run_ctx {
	struct runvec *rv;
	size_t src;
	uint64_t src_base;
};

static int run_cb(void *ud, uint64_t dst, uint64_t src_off, uint64_t len)
{
	struct run_ctx *c = ud;
	struct run r = { dst, len, c->src, c->src_base + src_off };

	return runvec_push(c->rv, &r);
}

static int run_cmp(const void *a, const void *b)
{
	const struct run *x = a, *y = b;

	if (x->dst != y->dst)
		return x->dst < y->dst ? -1 : 1;
	return x->len > y->len ? -1 : x->len < y->len;
}

/* Do two pieces have the same geometry? */
static bool same_geom(const struct piece *a, const struct piece *b)
{
	const struct smeta *x = a->m, *y = b->m;

	if (x->flat != y->flat || x->ndim != y->ndim)
		return false;
	if (x->flat && (x->flat_begin != y->flat_begin || x->flat_end != y->flat_end))
		return false;
	for (unsigned d = 0; d < x->ndim; d++)
		if (x->off[d] != y->off[d] || x->shape[d] != y->shape[d])
			return false;
	return true;
}

/* The geometry of a piece, as layout.c takes it. */
static void piece_geom(const struct piece *p, struct ckpt_piece_geom *ret)
{
	const struct smeta *m = p->m;

	memset(ret, 0, sizeof(*ret));
	ret->box.ndim = m->ndim;
	memcpy(ret->box.off, m->off, m->ndim * sizeof(ret->box.off[0]));
	memcpy(ret->box.shape, m->shape, m->ndim * sizeof(ret->box.shape[0]));
	ret->flat = m->flat;
	ret->flat_begin = m->flat_begin;
	ret->flat_end = m->flat_end;
}

int vw_same_digests(const struct ckpt_extent_list *la, uint64_t oa,
		    const struct ckpt_extent_list *lb, uint64_t ob, uint64_t len)
{
	size_t ia = ckpt_extent_list_find(la, oa), ib = ckpt_extent_list_find(lb, ob);

	if (len == 0)
		return 1;
	/* extents must start at the same relative offsets (what tensor-aligned
	 * chunking gives for tensors of equal size) */
	if (ia >= la->n || ib >= lb->n || la->v[ia].off != oa || lb->v[ib].off != ob)
		return -1;
	for (uint64_t done = 0; done < len; ia++, ib++) {
		const struct ckpt_extent *x, *y;
		uint64_t nx, ny;
		bool whole;
		if (ia >= la->n || ib >= lb->n)
			return -1;
		x = &la->v[ia];
		y = &lb->v[ib];
		nx = CKPT_MIN((uint64_t)x->len, len - done);
		ny = CKPT_MIN((uint64_t)y->len, len - done);
		if (nx != ny)
			return -1;
		/* both extents inside the range: a chunk is never all zeros
		 * (those become zero extents), and different keyed digests mean
		 * different chunks */
		whole = x->len == nx && y->len == ny;
		if (x->kind != y->kind)
			return whole ? 0 : -1;
		if (x->kind == CKPT_EXT_CHUNK &&
		    memcmp(x->digest.bytes, y->digest.bytes, CKPT_DIGEST_LEN))
			return whole ? 0 : -1;
		done += nx;
	}
	return 1;
}

/* Compare bytes [off, off+len) of two sources by their chunk digests when
 * both are chunked identically, else by reading.  1 equal, 0 different,
 * <0 error. */
static int same_bytes(ckpt_view *v, size_t sa, uint64_t oa, size_t sb, uint64_t ob,
		      uint64_t len)
{
	const struct ckpt_extent_list *la = v->m->srcs[sa].d->ext, *lb = v->m->srcs[sb].d->ext;
	uint8_t *ba = NULL, *bb = NULL;
	int r = 1;

	/* equal digests prove equal bytes; anything else is settled by reading
	 * (a digest mismatch may be chunks that extend past the range) */
	if (vw_same_digests(la, oa, lb, ob, len) == 1)
		return 1;
	ba = malloc(1u << 20);
	bb = malloc(1u << 20);
	if (!ba || !bb) {
		r = -ENOMEM;
		goto out;
	}
	for (uint64_t done = 0; done < len && r == 1;) {
		size_t n = (size_t)CKPT_MIN((uint64_t)(1u << 20), len - done);
		ssize_t x = ckpt_store_read_extents(v->s, la, ba, n, oa + done);
		ssize_t y = ckpt_store_read_extents(v->s, lb, bb, n, ob + done);
		if (x < 0 || y < 0)
			r = x < 0 ? (int)x : (int)y;
		else if ((size_t)x != n || (size_t)y != n)
			r = -EIO;
		else if (memcmp(ba, bb, n))
			r = 0;
		done += n;
	}
out:
	free(ba);
	free(bb);
	return r;
}

/* Global multi-index of element e (row-major) of box b. */
static void fmt_index(char *buf, size_t len, const struct ckpt_box *b, uint64_t e)
{
	uint64_t idx[CKPT_MAX_DIMS];

	for (int d = (int)b->ndim - 1; d >= 0; d--) {
		uint64_t ext = b->shape[d] ? b->shape[d] : 1;
		idx[d] = b->off[d] + e % ext;
		e /= ext;
	}
	ckpt_st_fmt_shape(buf, len, idx, b->ndim);
}

/* The pieces of g with distinct geometries (indices into the pieces, in
 * order) into uniq (room for all of g's pieces).  check: replicas of one
 * geometry must hold the same bytes (-EIO with err set otherwise). */
static int unique_pieces(ckpt_view *v, const struct gtensor *g, size_t *uniq, size_t *ret_nu,
			 bool check, char *err, size_t errlen)
{
	const struct vmodel *m = v->m;
	size_t nu = 0;

	for (size_t i = g->p0; i < g->p1; i++) {
		const struct piece *p = &m->pieces[i];
		const struct piece *q;
		size_t k;
		int r;

		for (k = 0; k < nu; k++)
			if (same_geom(&m->pieces[uniq[k]], p))
				break;
		if (k == nu) {
			uniq[nu++] = i;
			continue;
		}
		if (!check)
			continue;
		q = &m->pieces[uniq[k]];
		r = same_bytes(v, q->src, m->srcs[q->src].d->data_start + q->t->begin, p->src,
			       m->srcs[p->src].d->data_start + p->t->begin, p->t->end - p->t->begin);
		if (r < 0)
			return r;
		if (r == 0 && !m->srcs[q->src].d->described && !m->srcs[p->src].d->described) {
			/* whole tensors of plain files: most likely each rank saved its
			 * own slice under the global name */
			char files[512];
			vw_fmt_files(m, g, files, sizeof(files));
			ckpt_errf(err, errlen,
				  "group '%s', tensor '%s' is in %s with different bytes and no "
				  "sharding metadata: " VW_NOMETA_HINT,
				  m->groups[g->group].name, g->name, files);
			return -EIO;
		}
		if (r == 0) {
			ckpt_errf(err, errlen,
				  "group '%s', tensor '%s': replicas disagree (%s and %s hold the "
				  "same piece with different bytes)",
				  m->groups[g->group].name, g->name, m->srcs[q->src].name,
				  m->srcs[p->src].name);
			return -EIO;
		}
	}
	*ret_nu = nu;
	return 0;
}

/* Runs of one tensor of a view file (see view_int.h): its distinct pieces'
 * byte runs (layout.c), swept in target order to check coverage and to
 * compare the bytes where pieces of different geometry overlap. */
int vw_tensor_runs(ckpt_view *v, const struct vfile_plan *f, const struct vtensor *vt,
		       struct runvec *out, bool check, char *err, size_t errlen)
{
	const struct vmodel *m = v->m;
	const struct gtensor *g = &m->gts[vt->g];
	const char *gname = m->groups[g->group].name;
	struct runvec rv = { 0 };
	size_t *uniq = NULL, nu = 0;
	uint64_t cur = 0, base = f->hdr_len + vt->data_off;
	struct ckpt_box box;
	char idx[256];
	int r = 0;

	if (g->problem) {
		ckpt_errf(err, errlen, "group '%s', tensor '%s'%s %s", gname, g->name,
			  g->problem_nometa ? "" : ":", g->problem);
		return -EIO;
	}
	if (vt->nbytes == 0)
		return 0;
	vw_part_box(g, v->layout.tp, f->tp_rank, &box);
	uniq = calloc(g->p1 - g->p0, sizeof(*uniq));
	if (!uniq)
		return -ENOMEM;
	r = unique_pieces(v, g, uniq, &nu, check, err, errlen);
	if (r < 0)
		goto out;
	for (size_t k = 0; k < nu; k++) {
		const struct piece *p = &m->pieces[uniq[k]];
		struct run_ctx c = { &rv, p->src, m->srcs[p->src].d->data_start + p->t->begin };
		struct ckpt_piece_geom geom;
		piece_geom(p, &geom);
		r = ckpt_box_runs(&box, &geom, g->elem_bytes, run_cb, &c);
		if (r != 0) {
			r = r < 0 ? r : -EIO;
			ckpt_errf(err, errlen, "group '%s', tensor '%s': bad piece geometry in %s",
				  gname, g->name, m->srcs[p->src].name);
			goto out;
		}
	}
	for (size_t i = 1; i < rv.n; i++) {
		if (run_cmp(&rv.v[i - 1], &rv.v[i]) > 0) {
			qsort(rv.v, rv.n, sizeof(*rv.v), run_cmp);
			break;
		}
	}
	for (size_t i = 0; i < rv.n; i++) {
		struct run r2 = rv.v[i];
		uint64_t end = r2.dst + r2.len;

		if (r2.dst > cur) {
			fmt_index(idx, sizeof(idx), &box, cur / g->elem_bytes);
			ckpt_errf(err, errlen,
				  "group '%s', tensor '%s': no stored piece covers %" PRIu64
				  " elements starting at index %s",
				  gname, g->name, (r2.dst - cur) / g->elem_bytes, idx);
			r = -EIO;
			goto out;
		}
		if (r2.dst < cur) {
			/* overlap with earlier runs: compare the overlapping bytes */
			uint64_t ov = check ? CKPT_MIN(end, cur) - r2.dst : 0;
			/* in file offsets: runs already emitted may have been merged
			 * with runs of the previous tensor */
			uint64_t a0 = base + r2.dst, a1 = base + r2.dst + ov;
			for (size_t j = 0; j < out->n && ov > 0; j++) {
				const struct run *e = &out->v[j];
				uint64_t lo = CKPT_MAX(e->dst, a0), hi = CKPT_MIN(e->dst + e->len, a1);
				int same;
				if (lo >= hi)
					continue;
				same = same_bytes(v, e->src, e->src_off + (lo - e->dst), r2.src,
						  r2.src_off + (lo - a0), hi - lo);
				if (same < 0) {
					r = same;
					goto out;
				}
				if (!same) {
					fmt_index(idx, sizeof(idx), &box, (lo - base) / g->elem_bytes);
					ckpt_errf(err, errlen,
						  "group '%s', tensor '%s': overlapping pieces in %s and %s "
						  "disagree (from index %s)",
						  gname, g->name, m->srcs[e->src].name,
						  m->srcs[r2.src].name, idx);
					r = -EIO;
					goto out;
				}
			}
			if (end <= cur)
				continue;
			r2.src_off += cur - r2.dst;
			r2.len = end - cur;
			r2.dst = cur;
		}
		r2.dst += base;
		r = runvec_push(out, &r2);
		if (r < 0)
			goto out;
		cur = end;
	}
	if (cur < vt->nbytes) {
		fmt_index(idx, sizeof(idx), &box, cur / g->elem_bytes);
		ckpt_errf(err, errlen,
			  "group '%s', tensor '%s': no stored piece covers %" PRIu64
			  " elements starting at index %s",
			  gname, g->name, (vt->nbytes - cur) / g->elem_bytes, idx);
		r = -EIO;
	}
out:
	free(rv.v);
	free(uniq);
	return r;
}

/*
 * What an open checks for one tensor (the checks of vw_tensor_runs), without
 * computing its runs when its geometry alone proves it: every distinct
 * piece is a box (not flat) and their intersections with the part are
 * pairwise disjoint and add up to the part's element count, so the part is
 * covered exactly once (no gap, no overlap to compare).  Anything else
 * (gaps, overlaps, flat pieces, many pieces) goes through vw_tensor_runs, which
 * finds the same problems with the same messages.
 */
#define FAST_PIECES 16

int vw_tensor_check(ckpt_view *v, const struct vfile_plan *f, const struct vtensor *vt,
			char *err, size_t errlen)
{
	const struct gtensor *g = &v->m->gts[vt->g];
	struct ckpt_box box, parts[FAST_PIECES];
	size_t uniq[FAST_PIECES], nu = 0, nparts = 0;
	uint64_t want, sum = 0;
	struct runvec out = { 0 };
	int r;

	if (g->problem || vt->nbytes == 0 || g->p1 - g->p0 > FAST_PIECES)
		goto slow;
	r = unique_pieces(v, g, uniq, &nu, true, err, errlen);
	if (r < 0)
		return r;
	vw_part_box(g, v->layout.tp, f->tp_rank, &box);
	want = ckpt_box_elems(&box);
	if (want == UINT64_MAX)
		goto slow;
	for (size_t k = 0; k < nu; k++) {
		const struct piece *p = &v->m->pieces[uniq[k]];
		struct ckpt_piece_geom geom;
		uint64_t n;
		if (p->m->flat || p->m->ndim != box.ndim)
			goto slow;
		piece_geom(p, &geom);
		if (!ckpt_box_intersect(&geom.box, &box, &parts[nparts]))
			continue;
		for (size_t j = 0; j < nparts; j++)
			if (ckpt_box_intersect(&parts[j], &parts[nparts], NULL))
				goto slow; /* overlap: bytes to compare */
		n = ckpt_box_elems(&parts[nparts]);
		if (n == UINT64_MAX || __builtin_add_overflow(sum, n, &sum))
			goto slow;
		nparts++;
	}
	if (sum == want)
		return 0;
slow:
	r = vw_tensor_runs(v, f, vt, &out, true, err, errlen);
	free(out.v);
	return r;
}

int ckpt_view_check(ckpt_view *v, void (*cb)(void *ud, const char *file, const char *why),
		    void *ud)
{
	int problems = 0;

	for (size_t i = 0; i < v->nfiles; i++) {
		const struct vfile_plan *f = &v->files[i];
		int rp = vw_ensure_plan(v, i);
		if (rp < 0) {
			cb(ud, f->name, strerror(-rp));
			problems++;
			continue;
		}
		for (size_t k = 0; k < f->nt; k++) {
			char err[1024];
			int r;

			err[0] = '\0';
			r = vw_tensor_check(v, f, &f->t[k], err, sizeof(err));
			if (r == -ENOMEM)
				return r;
			if (r < 0) {
				cb(ud, f->name, err[0] ? err : strerror(-r));
				problems++;
			}
		}
	}
	return problems;
}
