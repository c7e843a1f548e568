/* SPDX-License-Identifier: MIT */
/*
 * parsrec.c - encoding and decoding of the persisted parse of a view source
 * (see parsrec.h; the format is docs/format.md section 5.8).
 */
#include "views/parsrec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

struct wbuf {
	uint8_t *p;
	size_t n, cap;
	bool oom;
};

static void wb_put(struct wbuf *b, const void *v, size_t n)
{
	if (b->oom)
		return;
	if (b->n + n > b->cap) {
		size_t nc = b->cap ? b->cap * 2 : 4096;
		uint8_t *np;
		while (nc < b->n + n)
			nc *= 2;
		np = realloc(b->p, nc);
		if (!np) {
			b->oom = true;
			return;
		}
		b->p = np;
		b->cap = nc;
	}
	memcpy(b->p + b->n, v, n);
	b->n += n;
}

static void wb_u8(struct wbuf *b, uint8_t v)
{
	wb_put(b, &v, 1);
}

static void wb_u16(struct wbuf *b, uint16_t v)
{
	uint8_t x[2];
	ckpt_put_le16(x, v);
	wb_put(b, x, 2);
}

static void wb_u32(struct wbuf *b, uint32_t v)
{
	uint8_t x[4];
	ckpt_put_le32(x, v);
	wb_put(b, x, 4);
}

static void wb_u64(struct wbuf *b, uint64_t v)
{
	uint8_t x[8];
	ckpt_put_le64(x, v);
	wb_put(b, x, 8);
}

struct rbuf {
	const uint8_t *p;
	size_t n, off;
	bool bad;
};

/* LEB128: 7 bits a byte, low first, high bit set on all but the last. */
static void wb_var(struct wbuf *b, uint64_t v)
{
	uint8_t t[10];
	size_t n = 0;

	while (v >= 0x80) {
		t[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	t[n++] = (uint8_t)v;
	wb_put(b, t, n);
}

static const uint8_t *rb_take(struct rbuf *b, size_t n)
{
	const uint8_t *p;

	if (b->bad || b->n - b->off < n) {
		b->bad = true;
		return NULL;
	}
	p = b->p + b->off;
	b->off += n;
	return p;
}

static uint8_t rb_u8(struct rbuf *b)
{
	const uint8_t *p = rb_take(b, 1);
	return p ? p[0] : 0;
}

static uint16_t rb_u16(struct rbuf *b)
{
	const uint8_t *p = rb_take(b, 2);
	return p ? ckpt_get_le16(p) : 0;
}

static uint32_t rb_u32(struct rbuf *b)
{
	const uint8_t *p = rb_take(b, 4);
	return p ? ckpt_get_le32(p) : 0;
}

static uint64_t rb_u64(struct rbuf *b)
{
	const uint8_t *p = rb_take(b, 8);
	return p ? ckpt_get_le64(p) : 0;
}

static uint64_t rb_var(struct rbuf *b)
{
	uint64_t v = 0;

	for (unsigned sh = 0; sh < 64; sh += 7) {
		const uint8_t *p = rb_take(b, 1);
		if (!p)
			return 0;
		v |= (uint64_t)(p[0] & 0x7f) << sh;
		if (!(p[0] & 0x80))
			return v;
	}
	b->bad = true; /* longer than 10 bytes */
	return 0;
}

/* Fingerprint of the extents that hold bytes [0, data_start). */
uint64_t vw_parsrec_fingerprint(const struct ckpt_extent_list *l, uint64_t data_start)
{
	struct wbuf b = { 0 };
	uint64_t fp;

	for (size_t i = 0; i < l->n && l->v[i].off < data_start; i++) {
		wb_u32(&b, l->v[i].len);
		wb_u8(&b, l->v[i].kind);
		wb_put(&b, l->v[i].digest.bytes, CKPT_DIGEST_LEN);
	}
	fp = b.oom ? 0 : ckpt_checksum(b.p ? b.p : (const uint8_t *)"", b.n);
	free(b.p);
	return fp;
}

int vw_parsrec_encode(const struct srcdata *d, const struct ckpt_extent_list *ext,
		      uint8_t **ret, size_t *ret_len)
{
	struct wbuf b = { 0 };
	size_t glen = d->group ? strlen(d->group) : 0;

	wb_u8(&b, CKPT_PARSREC_VERSION);
	wb_u8(&b, d->source);
	wb_u8(&b, d->has_nl);
	wb_u8(&b, d->described ? CKPT_PARSREC_F_DESCRIBED : 0);
	wb_u32(&b, (uint32_t)d->ntensors);
	wb_u64(&b, vw_parsrec_fingerprint(ext, d->data_start));
	wb_u64(&b, d->data_start);
	wb_u64(&b, d->nl);
	wb_u16(&b, (uint16_t)glen);
	wb_put(&b, d->group ? d->group : "", glen);
	for (size_t k = 0; k < d->ntensors; k++) {
		const struct ckpt_st_tensor *t = &d->tensors[k];
		const struct smeta *m = &d->metas[k];
		const char *dt = ckpt_dtype_name(t->dtype);
		size_t nl = strlen(t->name), pre = 0;

		/* the name as the length of the prefix shared with the previous
		 * name and the rest (the tensors are in name order) */
		if (k) {
			const char *prev = d->tensors[k - 1].name;
			while (prev[pre] && prev[pre] == t->name[pre])
				pre++;
		}
		wb_var(&b, pre);
		wb_var(&b, nl - pre);
		wb_put(&b, t->name + pre, nl - pre);
		wb_u8(&b, (uint8_t)strlen(dt));
		wb_put(&b, dt, strlen(dt));
		wb_u8(&b, (uint8_t)t->ndim);
		for (unsigned i = 0; i < t->ndim; i++)
			wb_var(&b, t->shape[i]);
		wb_var(&b, t->begin);
		wb_var(&b, t->end - t->begin);
		wb_u8(&b, (uint8_t)m->ndim);
		for (unsigned i = 0; i < m->ndim; i++) {
			wb_var(&b, m->gs[i]);
			wb_var(&b, m->off[i]);
			wb_var(&b, m->shape[i]);
		}
		wb_u8(&b, (uint8_t)((m->flat ? 1 : 0) | (m->has_pp ? 2 : 0)));
		if (m->flat) {
			wb_var(&b, m->flat_begin);
			wb_var(&b, m->flat_end);
		}
		wb_u8(&b, (uint8_t)(m->tp_dim + 2)); /* -2 (unset) ... CKPT_MAX_DIMS - 1 */
		wb_u8(&b, (uint8_t)m->pp.kind);
		wb_var(&b, m->pp.layer);
	}
	if (b.oom) {
		free(b.p);
		return -ENOMEM;
	}
	*ret = b.p;
	*ret_len = b.n;
	return 0;
}

/* Pass 1 over the tensor entries that follow the group name: validate
 * them and add up the sizes of the name and dims blobs. */
static bool scan_entries(struct rbuf c, uint32_t nt, size_t glen, size_t *ret_names,
			 size_t *ret_dims)
{
	size_t prev_len = 0, names = glen + 1, dims = 0;

	rb_take(&c, glen);
	for (uint32_t k = 0; k < nt && !c.bad; k++) {
		uint64_t pre = rb_var(&c), rest = rb_var(&c);
		uint8_t dl, nd, md, fl;
		if (pre > prev_len || rest > c.n) {
			c.bad = true;
			break;
		}
		rb_take(&c, (size_t)rest);
		prev_len = (size_t)(pre + rest);
		names += prev_len + 1;
		dl = rb_u8(&c);
		rb_take(&c, dl);
		nd = rb_u8(&c);
		dims += nd;
		for (unsigned i = 0; i < nd + 2u; i++)
			rb_var(&c);
		md = rb_u8(&c);
		dims += 3 * (size_t)md;
		for (unsigned i = 0; i < 3u * md; i++)
			rb_var(&c);
		fl = rb_u8(&c);
		if (fl & 1) {
			rb_var(&c);
			rb_var(&c);
		}
		if (rb_u8(&c) > CKPT_MAX_DIMS + 1 || fl > 3)
			c.bad = true;
		rb_u8(&c);
		rb_var(&c);
		if (nd > CKPT_MAX_DIMS || md > CKPT_MAX_DIMS)
			c.bad = true;
	}
	*ret_names = names;
	*ret_dims = dims;
	return !c.bad && c.off == c.n;
}

static int cmp_data(const void *a, const void *b)
{
	const struct ckpt_st_tensor *const *x = a, *const *y = b;

	if ((*x)->begin != (*y)->begin)
		return (*x)->begin < (*y)->begin ? -1 : 1;
	if ((*x)->end != (*y)->end)
		return (*x)->end < (*y)->end ? -1 : 1;
	return 0;
}

static int cmp_name(const void *a, const void *b)
{
	const struct ckpt_st_tensor *const *x = a, *const *y = b;

	return strcmp((*x)->name, (*y)->name);
}

/* Whether tensor t with metadata m is one a parse gives: a dtype of whole
 * bytes, a size that matches its data offsets, a valid geometry. */
static bool entry_ok(const struct srcdata *d, const struct ckpt_st_tensor *t,
		     const struct smeta *m)
{
	unsigned bits = ckpt_dtype_bits(t->dtype);
	struct ckpt_tensor_meta tm;
	uint64_t n = 1;

	if (bits % 8 || m->pp.kind < CKPT_PP_LAYER || m->pp.kind > CKPT_PP_ALL)
		return false;
	for (unsigned i = 0; i < t->ndim; i++)
		if (t->shape[i] > INT64_MAX || __builtin_mul_overflow(n, t->shape[i], &n))
			return false;
	if (__builtin_mul_overflow(n, (uint64_t)bits / 8, &n) || t->end - t->begin != n ||
	    t->end > INT64_MAX)
		return false;
	memset(&tm, 0, sizeof(tm));
	tm.ndim = m->ndim;
	tm.geom.box.ndim = m->ndim;
	for (unsigned i = 0; i < m->ndim; i++) {
		tm.global_shape[i] = m->gs[i];
		tm.geom.box.off[i] = m->off[i];
		tm.geom.box.shape[i] = m->shape[i];
	}
	tm.geom.flat = m->flat;
	tm.geom.flat_begin = m->flat ? m->flat_begin : 0;
	tm.geom.flat_end = m->flat ? m->flat_end : 0;
	tm.tp_dim = m->tp_dim;
	tm.has_pp = m->has_pp;
	tm.pp = m->pp;
	return ckpt_shardmeta_check(t, &tm, d->has_nl, d->nl) == 0;
}

/*
 * A decoded record must be what a parse of a valid source of file_size bytes
 * gives (a damaged record that decodes must not stand in for the parse): a
 * header length in range; for a source a valid group and num_layers, tensors
 * with distinct names and valid entries that tile the data area, which ends
 * where the file does.  0 or -EINVAL; -ENOMEM.
 */
static int check_parse(const struct srcdata *d, uint64_t file_size)
{
	const struct ckpt_st_tensor **ord = NULL;
	uint64_t end = 0;
	int r = -EINVAL;

	if (d->data_start < CKPT_ST_PREFIX_LEN + 2 ||
	    d->data_start > CKPT_ST_PREFIX_LEN + CKPT_ST_MAX_HEADER)
		return -EINVAL;
	if (!d->source)
		return 0;
	if (ckpt_shardmeta_check_group(d->group) < 0 || (d->has_nl && d->nl > INT64_MAX))
		return -EINVAL;
	ord = malloc((d->ntensors ? d->ntensors : 1) * sizeof(*ord));
	if (!ord)
		return -ENOMEM;
	for (size_t k = 0; k < d->ntensors; k++) {
		if (!entry_ok(d, &d->tensors[k], &d->metas[k]))
			goto out;
		ord[k] = &d->tensors[k];
	}
	qsort(ord, d->ntensors, sizeof(*ord), cmp_name);
	for (size_t k = 1; k < d->ntensors; k++)
		if (strcmp(ord[k - 1]->name, ord[k]->name) == 0)
			goto out;
	qsort(ord, d->ntensors, sizeof(*ord), cmp_data);
	for (size_t k = 0; k < d->ntensors; k++) {
		if (ord[k]->begin != end)
			goto out;
		end = ord[k]->end;
	}
	if (d->data_start + end == file_size)
		r = 0;
out:
	free(ord);
	return r;
}

int vw_parsrec_decode(const uint8_t *rec, size_t len, const struct ckpt_extent_list *ext,
		      struct srcdata *d)
{
	struct rbuf b = { rec, len, 0, false };
	size_t names, dims, pos_names, pos_dims = 0;
	uint32_t nt;
	uint16_t glen;
	uint8_t flags, source, has_nl;
	uint64_t fp;
	uint64_t *shapes;
	char *strs;
	int r = -EINVAL;

	d->blob = NULL;
	d->tensors = NULL;
	d->metas = NULL;
	d->ntensors = 0;
	if (rb_u8(&b) != CKPT_PARSREC_VERSION)
		goto bad;
	source = rb_u8(&b);
	has_nl = rb_u8(&b);
	d->source = source;
	d->has_nl = has_nl;
	flags = rb_u8(&b);
	d->described = (flags & CKPT_PARSREC_F_DESCRIBED) != 0;
	nt = rb_u32(&b);
	fp = rb_u64(&b);
	d->data_start = rb_u64(&b);
	d->nl = rb_u64(&b);
	glen = rb_u16(&b);
	if (b.bad || nt > len || source > 1 || has_nl > 1 || (!source && nt) ||
	    (flags & ~CKPT_PARSREC_F_DESCRIBED))
		goto bad;
	if (vw_parsrec_fingerprint(ext, d->data_start) != fp) {
		r = -ESTALE;
		goto bad;
	}
	if (!scan_entries(b, nt, glen, &names, &dims))
		goto bad;
	d->blob = malloc(names + dims * sizeof(uint64_t) + 8);
	d->tensors = calloc(nt ? nt : 1, sizeof(*d->tensors));
	d->metas = calloc(nt ? nt : 1, sizeof(*d->metas));
	if (!d->blob || !d->tensors || !d->metas) {
		r = -ENOMEM;
		goto bad;
	}
	shapes = d->blob;
	strs = (char *)(shapes + dims);
	memcpy(strs, rb_take(&b, glen), glen);
	strs[glen] = '\0';
	if (strlen(strs) != glen)
		goto bad;
	d->group = strs;
	pos_names = glen + 1;
	for (uint32_t k = 0; k < nt; k++) {
		struct ckpt_st_tensor *t = &d->tensors[k];
		struct smeta *m = &d->metas[k];
		size_t pre = (size_t)rb_var(&b), rest = (size_t)rb_var(&b);
		const uint8_t *tail;
		uint64_t *md;
		uint8_t dl, fl;
		char dt[32];

		/* checked by scan_entries: pre <= length of the previous name */
		if (pre)
			memcpy(strs + pos_names, d->tensors[k - 1].name, pre);
		tail = rb_take(&b, rest);
		if (memchr(tail, '\0', rest))
			goto bad; /* names are C strings */
		memcpy(strs + pos_names + pre, tail, rest);
		strs[pos_names + pre + rest] = '\0';
		t->name = strs + pos_names;
		pos_names += pre + rest + 1;
		dl = rb_u8(&b);
		if (dl >= sizeof(dt))
			goto bad;
		memcpy(dt, rb_take(&b, dl), dl);
		dt[dl] = '\0';
		if (ckpt_dtype_from_name(dt, &t->dtype) < 0)
			goto bad;
		t->ndim = rb_u8(&b);
		t->shape = shapes + pos_dims;
		for (unsigned i = 0; i < t->ndim; i++)
			shapes[pos_dims++] = rb_var(&b);
		t->begin = rb_var(&b);
		t->end = t->begin + rb_var(&b);
		if (t->end < t->begin)
			goto bad;
		m->ndim = rb_u8(&b);
		md = shapes + pos_dims;
		pos_dims += 3 * (size_t)m->ndim;
		m->gs = md;
		m->off = md + m->ndim;
		m->shape = md + 2 * m->ndim;
		for (unsigned i = 0; i < m->ndim; i++) {
			md[i] = rb_var(&b);
			md[m->ndim + i] = rb_var(&b);
			md[2 * m->ndim + i] = rb_var(&b);
		}
		fl = rb_u8(&b);
		m->flat = fl & 1;
		m->has_pp = (fl & 2) != 0;
		if (m->flat) {
			m->flat_begin = rb_var(&b);
			m->flat_end = rb_var(&b);
		}
		m->tp_dim = (int)rb_u8(&b) - 2;
		m->pp.kind = rb_u8(&b);
		m->pp.layer = rb_var(&b);
		if (b.bad)
			goto bad;
	}
	d->ntensors = nt;
	r = check_parse(d, ext->size);
	if (r < 0)
		goto bad;
	return 0;
bad:
	free(d->blob);
	free(d->tensors);
	free(d->metas);
	d->blob = NULL;
	d->tensors = NULL;
	d->metas = NULL;
	d->group = NULL;
	return r;
}
