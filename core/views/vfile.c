/* SPDX-License-Identifier: MIT */
/*
 * vfile.c - an open view file: the checks at open (once per file version),
 * and reads served from the byte runs of each tensor, computed on the first
 * read of its bytes and kept until the file is closed.
 *
 * A read copies the header bytes from the plan and each run's bytes from its
 * source through a store read cursor (chunks decompressed only where
 * covered, through the store's chunk cache); with a gather, large chunk
 * pieces are handed over from the cache without copying (struct
 * ckpt_gather).
 */
#include "views/view_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

/* The byte runs of one tensor of an open file (dst: file offsets). */
struct truns {
	size_t n;
	struct run v[];
};

struct ckpt_vfile {
	ckpt_view *v; /* one reference */
	const struct vfile_plan *plan;
	/* per tensor of plan, computed on the first read of its bytes and
	 * published with a compare-and-swap (reads may run concurrently) */
	_Atomic(struct truns *) *truns;
};

int ckpt_vfile_open(ckpt_view *v, size_t i, ckpt_vfile **ret_file, char *err, size_t errlen)
{
	struct vfile_plan *f;
	ckpt_vfile *vf;
	int r = 0;

	if (i >= v->nfiles)
		return -ENOENT;
	r = vw_ensure_plan(v, i);
	if (r < 0) {
		ckpt_errf(err, errlen, "cannot build the header of %s: %s", v->files[i].name,
			  strerror(-r));
		return r;
	}
	f = &v->files[i];
	if (!atomic_load(&f->verified)) {
		for (size_t k = 0; k < f->nt && r == 0; k++)
			r = vw_tensor_check(v, f, &f->t[k], err, errlen);
		if (r < 0)
			return r;
		atomic_store(&f->verified, true);
	}
	vf = calloc(1, sizeof(*vf));
	if (!vf)
		return -ENOMEM;
	vf->truns = calloc(f->nt ? f->nt : 1, sizeof(*vf->truns));
	if (!vf->truns) {
		free(vf);
		return -ENOMEM;
	}
	ckpt_view_ref(v);
	vf->v = v;
	vf->plan = f;
	*ret_file = vf;
	return 0;
}

void ckpt_vfile_free(ckpt_vfile *f)
{
	if (!f)
		return;
	for (size_t k = 0; k < f->plan->nt; k++)
		free(atomic_load(&f->truns[k]));
	free(f->truns);
	ckpt_view_unref(f->v);
	free(f);
}

uint64_t ckpt_vfile_size(const ckpt_vfile *f)
{
	return f->plan->size;
}

/* The runs of tensor k of f, computed on first use. */
static int vfile_truns(ckpt_vfile *f, size_t k, struct truns **ret)
{
	struct truns *t = atomic_load(&f->truns[k]), *expect = NULL;
	struct runvec rv = { 0 };
	char err[1024];
	int r;

	if (t) {
		*ret = t;
		return 0;
	}
	err[0] = '\0';
	r = vw_tensor_runs(f->v, f->plan, &f->plan->t[k], &rv, false, err, sizeof(err));
	if (r == 0) {
		t = malloc(sizeof(*t) + rv.n * sizeof(t->v[0]));
		if (!t)
			r = -ENOMEM;
	}
	if (r < 0) {
		/* the open checked the tensor: only ENOMEM gets here */
		if (r != -ENOMEM)
			ckpt_err("view file %s: %s", f->plan->name, err[0] ? err : strerror(-r));
		free(rv.v);
		return r;
	}
	t->n = rv.n;
	if (rv.n)
		memcpy(t->v, rv.v, rv.n * sizeof(t->v[0]));
	free(rv.v);
	if (!atomic_compare_exchange_strong(&f->truns[k], &expect, t)) {
		free(t); /* another reader was first */
		t = expect;
	}
	*ret = t;
	return 0;
}

/*
 * Consolidating tensor-parallel shards interleaves the sources row by row:
 * one read of a tp1 view of a weight split by rows at tp2 is many runs of
 * one row each, alternating between two sources.  One read cursor per
 * source (a few slots, reused round-robin) keeps each source's current
 * chunk pinned across those runs instead of a cache lookup per run.
 */
#define VFILE_CURSORS 8

/* Index of the first tensor of p ending after pos (tensors tile the data
 * area in order; empty ones are skipped by the callers). */
static size_t vfile_first_tensor(const struct vfile_plan *p, uint64_t pos)
{
	size_t lo = 0, hi = p->nt;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (p->hdr_len + p->t[mid].data_off + p->t[mid].nbytes <= pos)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Index of the first run of t ending after pos. */
static size_t truns_first(const struct truns *t, uint64_t pos)
{
	size_t a = 0, b = t->n;

	while (a < b) {
		size_t mid = a + (b - a) / 2;
		if (t->v[mid].dst + t->v[mid].len <= pos)
			a = mid + 1;
		else
			b = mid;
	}
	return a;
}

/* Per-source slots of one request (read cursors, listed ranges): a source
 * keeps its slot; a new one takes a free slot, then the oldest in round
 * robin. */
struct vslots {
	size_t src[VFILE_CURSORS];
	unsigned n, next;
};

/* The slot of source src.  *ret_fresh: it was not src's (the caller sets it
 * up); *ret_evicted: it held another source until now (the caller releases
 * that first). */
static unsigned vslot_get(struct vslots *sl, size_t src, bool *ret_fresh, bool *ret_evicted)
{
	unsigned c;

	*ret_fresh = *ret_evicted = false;
	for (c = 0; c < sl->n && sl->src[c] != src; c++)
		;
	if (c < sl->n)
		return c;
	*ret_fresh = true;
	if (sl->n < VFILE_CURSORS) {
		c = sl->n++;
	} else {
		c = sl->next;
		sl->next = (sl->next + 1) % VFILE_CURSORS;
		*ret_evicted = true;
	}
	sl->src[c] = src;
	return c;
}

ssize_t ckpt_vfile_read(ckpt_vfile *f, void *buf, size_t len, uint64_t off)
{
	return ckpt_vfile_read_gather(f, buf, len, off, NULL);
}

#define VFILE_BATCH 128 /* chunks loaded as one batch before a read */

ssize_t ckpt_vfile_read_gather(ckpt_vfile *f, void *buf, size_t len, uint64_t off,
			       struct ckpt_gather *g)
{
	const struct vfile_plan *p = f->plan;
	uint8_t *out = buf;
	size_t done = 0;
	struct ckpt_read_cursor cur[VFILE_CURSORS];
	struct vslots sl = { .n = 0 };
	ssize_t ret;

	if (off >= p->size)
		return 0;
	len = (size_t)CKPT_MIN((uint64_t)len, p->size - off);
	if (off < p->hdr_len) {
		size_t n = (size_t)CKPT_MIN((uint64_t)len, p->hdr_len - off);
		memcpy(out, p->hdr + off, n);
		if (g)
			ckpt_gather_buf(g, out, n);
		done = n;
	}
	if (done == len)
		return (ssize_t)done;
	if (ckpt_store_batches_loads(f->v->s)) { /* the chunks of the whole range as one batch */
		ckpt_digest d[VFILE_BATCH];
		ckpt_store_load_batch(f->v->s, d,
				      ckpt_vfile_chunks(f, off + done, len - done, d, VFILE_BATCH));
	}
	for (size_t k = vfile_first_tensor(p, off + done); done < len && k < p->nt; k++) {
		struct truns *t;
		int r;

		if (p->t[k].nbytes == 0)
			continue;
		r = vfile_truns(f, k, &t);
		if (r < 0) {
			ret = r;
			goto out;
		}
		for (size_t j = truns_first(t, off + done); done < len && j < t->n; j++) {
			const struct run *rn = &t->v[j];
			uint64_t pos = off + done, in = pos - rn->dst;
			size_t n = (size_t)CKPT_MIN((uint64_t)(len - done), rn->len - in);
			bool fresh, evicted;
			unsigned c;
			ssize_t got;

			if (pos < rn->dst) {
				ret = -EIO; /* V2 broken */
				goto out;
			}
			c = vslot_get(&sl, rn->src, &fresh, &evicted);
			if (evicted)
				ckpt_store_cursor_done(f->v->s, &cur[c]);
			if (fresh) {
				ckpt_read_cursor_init(&cur[c], f->v->m->srcs[rn->src].d->ext);
				cur[c].g = g;
			}
			got = ckpt_store_cursor_read(f->v->s, &cur[c], out + done, n,
						     rn->src_off + in);
			if (got < 0 || (size_t)got != n) {
				ret = got < 0 ? got : -EIO;
				goto out;
			}
			done += n;
		}
		if (done < len && off + done < p->hdr_len + p->t[k].data_off + p->t[k].nbytes) {
			ret = -EIO; /* V2 broken: the tensor's runs end early */
			goto out;
		}
	}
	ret = done < len ? -EIO /* V2 broken */ : (ssize_t)done;
out:
	for (unsigned c = 0; c < sl.n; c++)
		ckpt_store_cursor_done(f->v->s, &cur[c]);
	return ret;
}

size_t ckpt_vfile_chunks(ckpt_vfile *f, uint64_t off, uint64_t len, ckpt_digest *out,
			 size_t max)
{
	const struct vfile_plan *p = f->plan;
	/* per source slot: source bytes [lo, hi) whose chunks were listed */
	struct {
		uint64_t lo, hi;
	} seen[VFILE_CURSORS];
	struct vslots sl = { .n = 0 };
	size_t n = 0;

	if (off >= p->size)
		return 0;
	len = CKPT_MIN(len, p->size - off);
	for (size_t k = vfile_first_tensor(p, off); k < p->nt && n < max; k++) {
		struct truns *t;

		if (p->hdr_len + p->t[k].data_off >= off + len)
			break;
		if (p->t[k].nbytes == 0 || vfile_truns(f, k, &t) < 0)
			continue;
		for (size_t j = truns_first(t, off); j < t->n && n < max; j++) {
			const struct run *r = &t->v[j];
			const struct ckpt_extent_list *l = f->v->m->srcs[r->src].d->ext;
			uint64_t a, b;
			bool fresh, evicted;
			unsigned c;

			if (r->dst >= off + len)
				break;
			a = r->src_off + (off > r->dst ? off - r->dst : 0);
			b = r->src_off + CKPT_MIN(r->len, off + len - r->dst);
			c = vslot_get(&sl, r->src, &fresh, &evicted);
			if (fresh)
				seen[c].lo = seen[c].hi = a;
			if (a >= seen[c].lo && b <= seen[c].hi)
				continue; /* those chunks are listed already */
			if (a < seen[c].lo || a > seen[c].hi)
				seen[c].lo = seen[c].hi = a;
			a = CKPT_MAX(a, seen[c].hi);
			/* list whole extents from a: remember where the last one ends */
			for (size_t i = ckpt_extent_list_find(l, a); i < l->n && l->v[i].off < b &&
			     n < max; i++) {
				const struct ckpt_extent *e = &l->v[i];
				bool dup = false;

				seen[c].hi = e->off + e->len;
				if (e->kind == CKPT_EXT_ZERO)
					continue;
				for (size_t x = n > 16 ? n - 16 : 0; x < n && !dup; x++)
					dup = !memcmp(out[x].bytes, e->digest.bytes, CKPT_DIGEST_LEN);
				if (!dup)
					out[n++] = e->digest;
			}
		}
	}
	return n;
}
