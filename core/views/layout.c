// SPDX-License-Identifier: MIT
/*
 * layout.c - layout arithmetic of resharded views (see layout.h).
 */
#include "views/layout.h"

#include <errno.h>
#include <stdio.h>

#include "base/util.h"

/* ---- view names ---- */

/*
 * Parse a decimal in [1, CKPT_LAYOUT_MAX] without sign or leading zero at *p;
 * advance *p past it.  Returns 0 or -EINVAL.
 */
static int parse_count(const char **p, unsigned *ret_val)
{
	const char *s = *p;
	unsigned v = 0;

	if (*s < '1' || *s > '9')
		return -EINVAL;
	while (*s >= '0' && *s <= '9') {
		v = v * 10 + (unsigned)(*s - '0');
		if (v > CKPT_LAYOUT_MAX)
			return -EINVAL;
		s++;
	}
	*p = s;
	*ret_val = v;
	return 0;
}

int ckpt_layout_parse(const char *name, struct ckpt_layout *ret)
{
	const char *p = name;
	unsigned tp, pp;

	if (!name || !ret)
		return -EINVAL;
	if (p[0] != 't' || p[1] != 'p')
		return -EINVAL;
	p += 2;
	if (parse_count(&p, &tp))
		return -EINVAL;
	if (p[0] != '_' || p[1] != 'p' || p[2] != 'p')
		return -EINVAL;
	p += 3;
	if (parse_count(&p, &pp))
		return -EINVAL;
	if (*p != '\0')
		return -EINVAL;
	ret->tp = tp;
	ret->pp = pp;
	return 0;
}

int ckpt_layout_name(const struct ckpt_layout *l, char *buf, size_t len)
{
	int n;

	if (!l || !buf || l->tp < 1 || l->tp > CKPT_LAYOUT_MAX || l->pp < 1 ||
	    l->pp > CKPT_LAYOUT_MAX)
		return -EINVAL;
	n = snprintf(buf, len, "tp%u_pp%u", l->tp, l->pp);
	if (n < 0)
		return -EINVAL;
	if ((size_t)n >= len)
		return -ENAMETOOLONG;
	return n;
}

/* ---- tensor parallel ---- */

void ckpt_tp_bounds(uint64_t size, unsigned parts, unsigned t, uint64_t *ret_begin,
		    uint64_t *ret_end)
{
	uint64_t c, b, e;

	if (parts == 0)
		parts = 1;
	/* ceil without the overflow of size + parts - 1 */
	c = size / parts + (size % parts != 0);
	if (t >= parts) {
		b = size;
		e = size;
	} else {
		/* t*c and (t+1)*c may exceed 2^64 only when they exceed size */
		if (__builtin_mul_overflow((uint64_t)t, c, &b) || b > size)
			b = size;
		if (__builtin_mul_overflow((uint64_t)t + 1, c, &e) || e > size)
			e = size;
	}
	if (ret_begin)
		*ret_begin = b;
	if (ret_end)
		*ret_end = e;
}

/* ---- pipeline parallel ---- */

/*
 * floor(p * n / P) for p <= P, exact without 128-bit arithmetic:
 * p*n/P = p*(n/P) + p*(n%P)/P, with p*(n/P) <= n and p*(n%P) < P*P < 2^64.
 */
static uint64_t stage_begin(unsigned p, uint64_t n, unsigned P)
{
	return (uint64_t)p * (n / P) + ((uint64_t)p * (n % P)) / P;
}

unsigned ckpt_pp_stage_of_layer(uint64_t layer, uint64_t num_layers, unsigned P)
{
	unsigned lo = 0, hi;

	if (P == 0 || num_layers == 0)
		return 0;
	if (layer >= num_layers)
		return P - 1;
	/* largest p in [0, P-1] with stage_begin(p) <= layer; stage_begin(0) = 0 */
	hi = P - 1;
	while (lo < hi) {
		unsigned mid = lo + (hi - lo + 1) / 2;

		if (stage_begin(mid, num_layers, P) <= layer)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

bool ckpt_pp_on_stage(const struct ckpt_pp *pp, uint64_t num_layers, unsigned P, unsigned p)
{
	if (!pp || p >= P)
		return false;
	switch (pp->kind) {
	case CKPT_PP_LAYER:
		return ckpt_pp_stage_of_layer(pp->layer, num_layers, P) == p;
	case CKPT_PP_FIRST:
		return p == 0;
	case CKPT_PP_LAST:
		return p == P - 1;
	case CKPT_PP_ENDS:
		return p == 0 || p == P - 1;
	case CKPT_PP_ALL:
		return true;
	default:
		return false;
	}
}

/* ---- boxes ---- */

uint64_t ckpt_box_elems(const struct ckpt_box *b)
{
	uint64_t n = 1;
	bool overflow = false;

	if (!b || b->ndim > CKPT_MAX_DIMS)
		return UINT64_MAX;
	for (unsigned i = 0; i < b->ndim; i++) {
		if (b->shape[i] == 0)
			return 0;
		if (__builtin_mul_overflow(n, b->shape[i], &n))
			overflow = true; /* keep looking for a 0 */
	}
	return overflow ? UINT64_MAX : n;
}

/* off + shape fits in every dimension */
static bool box_ends_ok(const struct ckpt_box *b)
{
	for (unsigned i = 0; i < b->ndim; i++) {
		if (b->off[i] > UINT64_MAX - b->shape[i])
			return false;
	}
	return true;
}

bool ckpt_box_intersect(const struct ckpt_box *a, const struct ckpt_box *b, struct ckpt_box *ret)
{
	uint64_t lo[CKPT_MAX_DIMS], hi[CKPT_MAX_DIMS];
	unsigned n;

	if (!a || !b || a->ndim != b->ndim || a->ndim > CKPT_MAX_DIMS)
		return false;
	if (!box_ends_ok(a) || !box_ends_ok(b))
		return false;
	n = a->ndim;
	for (unsigned i = 0; i < n; i++) {
		lo[i] = CKPT_MAX(a->off[i], b->off[i]);
		hi[i] = CKPT_MIN(a->off[i] + a->shape[i], b->off[i] + b->shape[i]);
		if (hi[i] <= lo[i])
			return false;
	}
	if (ret) {
		ret->ndim = n;
		for (unsigned i = 0; i < n; i++) {
			ret->off[i] = lo[i];
			ret->shape[i] = hi[i] - lo[i];
		}
	}
	return true;
}

/* ---- byte runs ---- */

/*
 * State of one ckpt_box_runs call.  All offsets are in elements until the
 * run is handed to cb; element offsets of the source are relative to the
 * start of the piece's box flattening, and flat_begin is subtracted when a
 * run is emitted (every emitted element lies at or after flat_begin).
 */
struct run_ctx {
	const struct ckpt_box *tgt;
	const struct ckpt_box *src;
	unsigned ndim;
	uint64_t eb;
	uint64_t flat_begin;
	uint64_t tstride[CKPT_MAX_DIMS]; /* row-major strides of tgt, elements */
	uint64_t sstride[CKPT_MAX_DIMS]; /* row-major strides of src, elements */
	ckpt_run_cb cb;
	void *ud;
	/* pending run, merged with the next one when contiguous in both */
	bool have;
	uint64_t pdst, psrc, plen;
};

static int push_run(struct run_ctx *c, uint64_t dst, uint64_t src, uint64_t len)
{
	int rc;

	if (c->have) {
		if (c->pdst + c->plen == dst && c->psrc + c->plen == src) {
			c->plen += len;
			return 0;
		}
		rc = c->cb(c->ud, c->pdst * c->eb, (c->psrc - c->flat_begin) * c->eb,
			   c->plen * c->eb);
		if (rc)
			return rc;
	}
	c->have = true;
	c->pdst = dst;
	c->psrc = src;
	c->plen = len;
	return 0;
}

/*
 * Emit the runs of sub-box s of the piece's box (every element of s is
 * stored in the piece) that lie inside the target, in row-major order.
 */
static int emit_box(struct run_ctx *c, const struct ckpt_box *s)
{
	uint64_t idx[CKPT_MAX_DIMS];
	struct ckpt_box j;
	uint64_t dst = 0, src = 0, len = 1;
	unsigned n = c->ndim, d = 0;
	int rc;

	if (!ckpt_box_intersect(s, c->tgt, &j))
		return 0;
	/*
	 * d = last dimension where j is narrower than the target or the
	 * source: dimensions after d are whole in both, so each run covers
	 * j's extent along d and everything after it.
	 */
	for (unsigned k = n; k-- > 0;) {
		if (j.shape[k] != c->tgt->shape[k] || j.shape[k] != c->src->shape[k]) {
			d = k;
			break;
		}
	}
	for (unsigned k = 0; k < n; k++) {
		dst += (j.off[k] - c->tgt->off[k]) * c->tstride[k];
		src += (j.off[k] - c->src->off[k]) * c->sstride[k];
		if (k >= d)
			len *= j.shape[k];
		idx[k] = 0;
	}
	for (;;) {
		bool done = true;

		rc = push_run(c, dst, src, len);
		if (rc)
			return rc;
		/* odometer over dimensions 0..d-1; wraps are exact modulo 2^64 */
		for (unsigned k = d; k-- > 0;) {
			dst += c->tstride[k];
			src += c->sstride[k];
			if (++idx[k] < j.shape[k]) {
				done = false;
				break;
			}
			dst -= j.shape[k] * c->tstride[k];
			src -= j.shape[k] * c->sstride[k];
			idx[k] = 0;
		}
		if (done)
			return 0;
	}
}

/*
 * Emit the runs of the elements [a, b) of the piece box's flattening, whose
 * dimensions before k are fixed in cur (offset, shape 1) and whose range is
 * relative to that slice (0 <= a <= b <= sstride[k-1]).  The range is cut
 * into at most 2*(ndim-k)-1 boxes, in order: a partial slice at the head, a
 * block of whole slices, a partial slice at the tail.
 */
static int flat_split(struct run_ctx *c, struct ckpt_box *cur, unsigned k, uint64_t a,
		      uint64_t b)
{
	const struct ckpt_box *s = c->src;
	uint64_t inner = c->sstride[k];
	uint64_t a0 = a / inner, ar = a % inner, b0 = b / inner, br = b % inner;
	int rc;

	if (a >= b)
		return 0;
	if (a0 == b0) {
		/* inside one slice along k (so inner > 1 and k + 1 < ndim) */
		cur->off[k] = s->off[k] + a0;
		cur->shape[k] = 1;
		return flat_split(c, cur, k + 1, ar, br);
	}
	if (ar) {
		cur->off[k] = s->off[k] + a0;
		cur->shape[k] = 1;
		rc = flat_split(c, cur, k + 1, ar, inner);
		if (rc)
			return rc;
		a0++;
	}
	if (a0 < b0) {
		cur->off[k] = s->off[k] + a0;
		cur->shape[k] = b0 - a0;
		for (unsigned i = k + 1; i < c->ndim; i++) {
			cur->off[i] = s->off[i];
			cur->shape[i] = s->shape[i];
		}
		rc = emit_box(c, cur);
		if (rc)
			return rc;
	}
	if (br) {
		cur->off[k] = s->off[k] + b0;
		cur->shape[k] = 1;
		return flat_split(c, cur, k + 1, 0, br);
	}
	return 0;
}

/* Validate a box's ends and return its element count, or a negative errno. */
static int box_check(const struct ckpt_box *b, uint64_t *ret_elems)
{
	uint64_t n;

	if (!box_ends_ok(b))
		return -EOVERFLOW;
	n = ckpt_box_elems(b);
	if (n == UINT64_MAX)
		return -EOVERFLOW;
	*ret_elems = n;
	return 0;
}

int ckpt_box_runs(const struct ckpt_box *target, const struct ckpt_piece_geom *piece,
		  unsigned elem_bytes, ckpt_run_cb cb, void *ud)
{
	const struct ckpt_box *src;
	struct run_ctx c;
	struct ckpt_box cur;
	uint64_t tn, sn, stored, tmp;
	int rc;

	if (!target || !piece || !cb || elem_bytes == 0)
		return -EINVAL;
	src = &piece->box;
	if (target->ndim > CKPT_MAX_DIMS || src->ndim != target->ndim)
		return -EINVAL;
	rc = box_check(target, &tn);
	if (rc)
		return rc;
	rc = box_check(src, &sn);
	if (rc)
		return rc;
	if (piece->flat && (piece->flat_begin > piece->flat_end || piece->flat_end > sn))
		return -EINVAL;
	stored = piece->flat ? piece->flat_end - piece->flat_begin : sn;
	if (__builtin_mul_overflow(tn, (uint64_t)elem_bytes, &tmp) ||
	    __builtin_mul_overflow(stored, (uint64_t)elem_bytes, &tmp))
		return -EOVERFLOW;
	if (tn == 0 || stored == 0)
		return 0;

	c.tgt = target;
	c.src = src;
	c.ndim = src->ndim;
	c.eb = elem_bytes;
	c.flat_begin = piece->flat ? piece->flat_begin : 0;
	c.cb = cb;
	c.ud = ud;
	c.have = false;
	c.pdst = c.psrc = c.plen = 0;
	/* no product below overflows: both element counts fit and are > 0 */
	tn = sn = 1;
	for (unsigned k = c.ndim; k-- > 0;) {
		c.tstride[k] = tn;
		c.sstride[k] = sn;
		tn *= target->shape[k];
		sn *= src->shape[k];
	}

	if (!piece->flat || c.ndim == 0) {
		/* a non-empty flat range of a scalar is the whole scalar */
		rc = emit_box(&c, src);
	} else {
		cur.ndim = c.ndim;
		rc = flat_split(&c, &cur, 0, piece->flat_begin, piece->flat_end);
	}
	if (rc)
		return rc;
	if (c.have)
		return cb(ud, c.pdst * c.eb, (c.psrc - c.flat_begin) * c.eb, c.plen * c.eb);
	return 0;
}
