/* SPDX-License-Identifier: MIT */
/*
 * fuzz_layout.c - view names and the layout arithmetic (views/layout.h).
 *
 * The first byte of the input picks what is fuzzed:
 *   0  ckpt_tp_bounds and the stage placement of layers, against 128-bit
 *      reference arithmetic (the rest: size, layer, num_layers, T, P);
 *   1  ckpt_box_runs of a small target box and piece (flat or not), against
 *      a map of every element built one element at a time;
 *   2  ckpt_box_intersect, against a per-dimension reference;
 *   other: the input (up to a NUL) is a name: ckpt_layout_parse of a view
 *      root name ("tpT_ppP") against a reference of the rule of docs/views.md
 *      section 2.1 and ckpt_layout_name's inverse, and the name rules of
 *      tensors (ckpt_layer_from_name, ckpt_pp_from_name).
 */
#include "fuzz.h"

#include <errno.h>

#include "views/layout.h"
#include "views/shardmeta.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_quiet();
	return 0;
}

/* A little-endian reader over the input that gives zeros past its end. */
struct rd {
	const uint8_t *p;
	size_t n;
};

static uint64_t rd_bytes(struct rd *r, unsigned nb)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < nb; i++) {
		uint64_t b = 0;

		if (r->n) {
			b = *r->p++;
			r->n--;
		}
		v |= b << (8 * i);
	}
	return v;
}

/* ---- names ---- */

/* Decimal in [1, CKPT_LAYOUT_MAX] without sign or leading zero; advances *s. */
static bool ref_count(const char **s, unsigned *ret)
{
	const char *p = *s;
	unsigned long v = 0;
	size_t nd = 0;

	while (p[nd] >= '0' && p[nd] <= '9')
		nd++;
	if (nd == 0 || nd > 4 || p[0] == '0')
		return false;
	for (size_t i = 0; i < nd; i++)
		v = v * 10 + (unsigned long)(p[i] - '0');
	if (v > CKPT_LAYOUT_MAX)
		return false;
	*s = p + nd;
	*ret = (unsigned)v;
	return true;
}

static bool ref_layout(const char *s, struct ckpt_layout *l)
{
	if (strncmp(s, "tp", 2) != 0)
		return false;
	s += 2;
	if (!ref_count(&s, &l->tp) || strncmp(s, "_pp", 3) != 0)
		return false;
	s += 3;
	return ref_count(&s, &l->pp) && *s == '\0';
}

/* The rule of ckpt_layer_from_name (shardmeta.h): the first segment (at the
 * start or after a '.') PREFIX N '.' with one of the layer prefixes and N
 * one or more digits of a value at most 2^63 - 1. */
static bool ref_layer(const char *name, uint64_t *ret)
{
	static const char *const pre[] = { "layers.", "h.", "blocks.", "layer." };

	for (const char *p = name; *p; p++) {
		if (p != name && p[-1] != '.')
			continue;
		for (size_t i = 0; i < CKPT_ARRAY_SIZE(pre); i++) {
			const char *q = p + strlen(pre[i]);
			unsigned __int128 v = 0;

			if (strncmp(p, pre[i], strlen(pre[i])) != 0 || *q < '0' || *q > '9')
				continue;
			for (; *q >= '0' && *q <= '9'; q++)
				if (v <= INT64_MAX)
					v = v * 10 + (unsigned)(*q - '0');
			if (*q == '.' && v <= INT64_MAX) {
				*ret = (uint64_t)v;
				return true;
			}
		}
	}
	return false;
}

static void fuzz_name(const uint8_t *data, size_t size)
{
	char *s = fuzz_strndup(data, size), buf[CKPT_LAYOUT_NAME_MAX];
	struct ckpt_layout l = { 0, 0 }, ref = { 0, 0 };
	struct ckpt_pp pp;
	uint64_t layer = 0;
	bool ok;
	int r;

	if (!s)
		return;
	r = ckpt_layout_parse(s, &l);
	ok = ref_layout(s, &ref);
	FUZZ_CHECK((r == 0) == ok, "'%s': parse %d, reference %d", s, r, ok);
	if (ok) {
		FUZZ_CHECK(l.tp == ref.tp && l.pp == ref.pp, "'%s': tp%u_pp%u", s, l.tp, l.pp);
		r = ckpt_layout_name(&l, buf, sizeof(buf));
		FUZZ_CHECK(r == (int)strlen(s) && strcmp(buf, s) == 0, "'%s': name '%s'", s, buf);
		r = ckpt_layout_name(&l, buf, strlen(s));
		FUZZ_CHECK(r == -ENAMETOOLONG && strlen(buf) == strlen(s) - 1, "'%s': short buffer",
			   s);
	} else {
		FUZZ_CHECK(r == -EINVAL && l.tp == 0 && l.pp == 0, "'%s': refused, %d", s, r);
	}
	{
		uint64_t want = 0;
		bool has = ckpt_layer_from_name(s, &layer), has_ref = ref_layer(s, &want);

		FUZZ_CHECK(has == has_ref && (!has || layer == want),
			   "'%s': layer %d %llu, reference %d %llu", s, has,
			   (unsigned long long)layer, has_ref, (unsigned long long)want);
	}
	ckpt_pp_from_name(s, &pp);
	FUZZ_CHECK(pp.kind == CKPT_PP_LAYER || pp.kind == CKPT_PP_FIRST || pp.kind == CKPT_PP_LAST,
		   "'%s': pp kind %d", s, pp.kind);
	free(s);
}

/* ---- tensor and pipeline parallel arithmetic ---- */

static uint64_t ref_stage_begin(unsigned p, uint64_t n, unsigned P)
{
	return (uint64_t)((unsigned __int128)p * n / P);
}

static void fuzz_parallel(struct rd *r)
{
	uint64_t size = rd_bytes(r, 8), layer = rd_bytes(r, 8), nl = rd_bytes(r, 8);
	unsigned T = (unsigned)(rd_bytes(r, 2) % (CKPT_LAYOUT_MAX + 1));
	unsigned P = (unsigned)(rd_bytes(r, 2) % (CKPT_LAYOUT_MAX + 1));
	uint64_t prev_end = 0, b, e, c;
	unsigned parts = T ? T : 1, s;

	/* the rule of ckpt_tp_bounds: c = ceil(size / parts), part t covers
	 * [min(t*c, size), min((t+1)*c, size)) */
	c = size / parts + (size % parts != 0);
	for (unsigned t = 0; t <= parts; t++) {
		unsigned __int128 lo = (unsigned __int128)t * c, hi = lo + c;

		ckpt_tp_bounds(size, T, t, &b, &e);
		if (lo > size)
			lo = size;
		if (hi > size || t == parts)
			hi = size;
		if (t == parts)
			lo = size;
		FUZZ_CHECK(b == (uint64_t)lo && e == (uint64_t)hi && b == prev_end,
			   "tp_bounds(%llu, %u, %u) = [%llu, %llu)", (unsigned long long)size, T, t,
			   (unsigned long long)b, (unsigned long long)e);
		prev_end = e;
	}
	FUZZ_CHECK(prev_end == size, "tp_bounds do not cover %llu", (unsigned long long)size);

	s = ckpt_pp_stage_of_layer(layer, nl, P);
	if (P == 0 || nl == 0) {
		FUZZ_CHECK(s == 0, "stage %u of P %u, N %llu", s, P, (unsigned long long)nl);
	} else if (layer >= nl) {
		FUZZ_CHECK(s == P - 1, "layer past N: stage %u", s);
	} else {
		FUZZ_CHECK(s < P && ref_stage_begin(s, nl, P) <= layer &&
				   layer < ref_stage_begin(s + 1, nl, P),
			   "layer %llu of %llu on %u stages: stage %u", (unsigned long long)layer,
			   (unsigned long long)nl, P, s);
	}
	for (int kind = CKPT_PP_LAYER; kind <= CKPT_PP_ALL + 1; kind++) {
		struct ckpt_pp pp = { kind, layer };
		unsigned p = P ? (unsigned)(layer % P) : 0;
		bool on = ckpt_pp_on_stage(&pp, nl, P, p), want;

		switch (kind) {
		case CKPT_PP_LAYER:
			want = P && p == s;
			break;
		case CKPT_PP_FIRST:
			want = P && p == 0;
			break;
		case CKPT_PP_LAST:
			want = P && p == P - 1;
			break;
		case CKPT_PP_ENDS:
			want = P && (p == 0 || p == P - 1);
			break;
		case CKPT_PP_ALL:
			want = P != 0;
			break;
		default:
			want = false;
		}
		FUZZ_CHECK(on == want, "pp_on_stage kind %d, stage %u of %u", kind, p, P);
	}
}

/* ---- boxes ---- */

#define RUNS_MAX_DIMS 4
#define RUNS_MAX_DIM 7
#define RUNS_MAX_ELEMS 4096 /* 7^4 */

struct runs_ctx {
	int64_t *map; /* per target byte: the piece byte it gets, or -1 */
	uint64_t target_bytes, piece_bytes;
	uint64_t next_dst, last_dst_end, last_src_end;
	bool any;
};

static int runs_cb(void *ud, uint64_t dst, uint64_t src, uint64_t len)
{
	struct runs_ctx *c = ud;

	FUZZ_CHECK(len > 0, "empty run");
	FUZZ_CHECK(dst >= c->next_dst, "runs out of dst order or overlapping");
	FUZZ_CHECK(!c->any || dst != c->last_dst_end || src != c->last_src_end,
		   "runs not merged at dst %llu", (unsigned long long)dst);
	FUZZ_CHECK(dst + len <= c->target_bytes && src + len <= c->piece_bytes,
		   "run [%llu, +%llu) from %llu outside the boxes", (unsigned long long)dst,
		   (unsigned long long)len, (unsigned long long)src);
	for (uint64_t i = 0; i < len; i++) {
		FUZZ_CHECK(c->map[dst + i] == (int64_t)(src + i),
			   "target byte %llu gets piece byte %llu, expected %lld",
			   (unsigned long long)(dst + i), (unsigned long long)(src + i),
			   (long long)c->map[dst + i]);
		c->map[dst + i] = -2; /* copied */
	}
	c->next_dst = c->last_dst_end = dst + len;
	c->last_src_end = src + len;
	c->any = true;
	return 0;
}

static void rd_box(struct rd *r, struct ckpt_box *b, unsigned ndim)
{
	memset(b, 0, sizeof(*b));
	b->ndim = ndim;
	for (unsigned d = 0; d < ndim; d++) {
		b->off[d] = rd_bytes(r, 1) % RUNS_MAX_DIM;
		b->shape[d] = rd_bytes(r, 1) % RUNS_MAX_DIM;
	}
}

static uint64_t box_count(const struct ckpt_box *b)
{
	uint64_t n = 1;

	for (unsigned d = 0; d < b->ndim; d++)
		n *= b->shape[d];
	return n;
}

static void fuzz_runs(struct rd *r)
{
	unsigned ndim = (unsigned)(rd_bytes(r, 1) % (RUNS_MAX_DIMS + 1));
	unsigned eb = 1 + (unsigned)(rd_bytes(r, 1) % 4);
	struct ckpt_piece_geom piece = { 0 };
	struct ckpt_box target;
	struct runs_ctx c = { 0 };
	uint64_t pn, tn, fb, fe;
	int ret;

	rd_box(r, &target, ndim);
	rd_box(r, &piece.box, ndim);
	pn = box_count(&piece.box);
	tn = box_count(&target);
	piece.flat = rd_bytes(r, 1) & 1;
	fb = rd_bytes(r, 2) % (pn + 1);
	fe = rd_bytes(r, 2) % (pn + 1);
	if (piece.flat) {
		piece.flat_begin = fb < fe ? fb : fe;
		piece.flat_end = fb < fe ? fe : fb;
	}
	c.target_bytes = tn * eb;
	c.piece_bytes = (piece.flat ? piece.flat_end - piece.flat_begin : pn) * eb;
	c.map = malloc((tn ? tn : 1) * eb * sizeof(*c.map));
	if (!c.map)
		return;
	for (uint64_t i = 0; i < tn * eb; i++)
		c.map[i] = -1;
	/* every stored element of the piece, in row-major order of its box */
	for (uint64_t i = 0; i < pn; i++) {
		uint64_t rem = i, dst = 0, coord[RUNS_MAX_DIMS];
		bool inside = true;

		if (piece.flat && (i < piece.flat_begin || i >= piece.flat_end))
			continue;
		for (unsigned d = ndim; d-- > 0;) {
			coord[d] = piece.box.off[d] + rem % piece.box.shape[d];
			rem /= piece.box.shape[d];
		}
		for (unsigned d = 0; d < ndim; d++) {
			if (coord[d] < target.off[d] || coord[d] >= target.off[d] + target.shape[d])
				inside = false;
			dst = dst * target.shape[d] + (coord[d] - target.off[d]);
		}
		if (!inside)
			continue;
		for (unsigned k = 0; k < eb; k++)
			c.map[dst * eb + k] = (int64_t)(((piece.flat ? i - piece.flat_begin : i) * eb) + k);
	}
	ret = ckpt_box_runs(&target, &piece, eb, runs_cb, &c);
	FUZZ_CHECK(ret == 0, "box_runs: %d", ret);
	/* -1: no piece byte lands there; -2: copied by a run */
	for (uint64_t i = 0; i < tn * eb; i++)
		FUZZ_CHECK(c.map[i] < 0, "target byte %llu (piece byte %lld) not copied",
			   (unsigned long long)i, (long long)c.map[i]);
	free(c.map);
}

static void fuzz_intersect(struct rd *r)
{
	struct ckpt_box a, b, out;
	unsigned na = (unsigned)(rd_bytes(r, 1) % (CKPT_MAX_DIMS + 2));
	unsigned nb = rd_bytes(r, 1) % 8 ? na : (unsigned)(rd_bytes(r, 1) % (CKPT_MAX_DIMS + 2));
	bool want = na == nb && na <= CKPT_MAX_DIMS, got;

	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	a.ndim = na;
	b.ndim = nb;
	for (unsigned d = 0; d < CKPT_MAX_DIMS; d++) {
		unsigned wide = (unsigned)rd_bytes(r, 1);

		a.off[d] = rd_bytes(r, wide & 1 ? 8 : 1);
		a.shape[d] = rd_bytes(r, wide & 2 ? 8 : 1);
		b.off[d] = rd_bytes(r, wide & 4 ? 8 : 1);
		b.shape[d] = rd_bytes(r, wide & 8 ? 8 : 1);
	}
	for (unsigned d = 0; want && d < na; d++) {
		unsigned __int128 ae = (unsigned __int128)a.off[d] + a.shape[d];
		unsigned __int128 be = (unsigned __int128)b.off[d] + b.shape[d];
		uint64_t lo = a.off[d] > b.off[d] ? a.off[d] : b.off[d];
		unsigned __int128 hi = ae < be ? ae : be;

		if (ae > UINT64_MAX || be > UINT64_MAX || hi <= lo)
			want = false;
	}
	out = a;
	got = ckpt_box_intersect(&a, &b, &out);
	FUZZ_CHECK(got == want, "intersect: %d, reference %d", got, want);
	if (!got) {
		FUZZ_CHECK(memcmp(&out, &a, sizeof(out)) == 0, "ret changed on false");
		return;
	}
	for (unsigned d = 0; d < na; d++) {
		uint64_t lo = a.off[d] > b.off[d] ? a.off[d] : b.off[d];
		uint64_t ae = a.off[d] + a.shape[d], be = b.off[d] + b.shape[d];

		FUZZ_CHECK(out.off[d] == lo && out.off[d] + out.shape[d] == (ae < be ? ae : be),
			   "intersect dim %u", d);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct rd r = { data + 1, size ? size - 1 : 0 };

	if (size == 0)
		return 0;
	switch (data[0]) {
	case 0:
		fuzz_parallel(&r);
		break;
	case 1:
		fuzz_runs(&r);
		break;
	case 2:
		fuzz_intersect(&r);
		break;
	default:
		fuzz_name(data, size);
	}
	return 0;
}
