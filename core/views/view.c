/* SPDX-License-Identifier: MIT */
/*
 * view.c - resharded views (see view.h).
 *
 * Build: sources (safetensors files of the directory) -> pieces (one per
 * stored tensor) -> global tensors (pieces of one group with one name,
 * sorted by group then name) -> view files (per group, stage p and TP rank
 * t: the global tensors placed on p, each cut to part t).
 *
 * Open: for every tensor of the file, the pieces are reduced to distinct
 * geometries (replicas with identical geometry must have identical chunk
 * digests, which tensor-aligned chunking guarantees for identical bytes).
 * When the distinct pieces are boxes whose parts of the tensor are disjoint
 * and add up to it, that proves the tensor (tensor_check); otherwise each
 * distinct piece contributes byte runs (layout.c), and a sweep over the runs
 * in target order checks coverage and compares the bytes where pieces of
 * different geometry overlap (tensor_runs).  A file version that passed
 * once is not checked again (V1).
 *
 * Read: the byte runs of a tensor are computed on the first read of its
 * bytes through an open file, and kept until the file is closed.
 *
 * Invariants:
 *  V1. A view never changes after ckpt_view_build() returns (its files are
 *      only planned, and marked verified, on first use).
 *  V2. The runs of each tensor of an open file are sorted by dst and tile
 *      the tensor's bytes [hdr_len + data_off, + nbytes) exactly (no gap,
 *      no overlap); the tensors tile [hdr_len, size) in order.
 */
#include "views/view.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "views/safetensors.h"
#include "base/util.h"

/*
 * A small process-wide cache of reference-counted entries (parsed sources,
 * models).  The cache holds one reference on each of its `keep` newest
 * entries ("kept"); users hold their own.  An entry is destroyed when its
 * last reference goes.  Lookups are type-specific (hcache_find + match).
 */
struct hnode {
	ckpt_store *s;     /* the store the entry was parsed from */
	int refs;          /* protected by the cache's lock */
	bool kept;         /* the cache holds one of the refs */
	struct hnode *next;
};

struct hcache {
	pthread_mutex_t lock;
	struct hnode *head; /* newest first */
	size_t keep;
	void (*destroy)(struct hnode *n);
};

#define hcache_entry(ptr, type) ((type *)(void *)((char *)(ptr) - offsetof(type, node)))

static void hnode_unref(struct hcache *c, struct hnode *n)
{
	struct hnode **pp;

	if (!n)
		return;
	pthread_mutex_lock(&c->lock);
	if (--n->refs > 0) {
		pthread_mutex_unlock(&c->lock);
		return;
	}
	for (pp = &c->head; *pp && *pp != n; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = n->next;
	pthread_mutex_unlock(&c->lock);
	c->destroy(n);
}

/* Drop the cache's hold on one kept entry that pred selects (idx: its
 * position in the list).  Returns false when there is none. */
static bool hcache_release_one(struct hcache *c,
			       bool (*pred)(const struct hnode *n, size_t idx, const void *arg),
			       const void *arg)
{
	struct hnode *n;
	size_t k = 0;

	pthread_mutex_lock(&c->lock);
	for (n = c->head; n; n = n->next, k++)
		if (n->kept && pred(n, k, arg))
			break;
	if (n)
		n->kept = false;
	pthread_mutex_unlock(&c->lock);
	if (!n)
		return false;
	hnode_unref(c, n);
	return true;
}

static bool past_keep(const struct hnode *n, size_t idx, const void *arg)
{
	(void)n;
	return idx >= *(const size_t *)arg;
}

static bool of_store(const struct hnode *n, size_t idx, const void *arg)
{
	(void)idx;
	return n->s == arg;
}

/* Insert a new entry holding the caller's reference and the cache's; the
 * cache then lets go of entries past its `keep` newest. */
static void hcache_insert(struct hcache *c, struct hnode *n, ckpt_store *s)
{
	n->s = s;
	n->refs = 2;
	n->kept = true;
	pthread_mutex_lock(&c->lock);
	n->next = c->head;
	c->head = n;
	pthread_mutex_unlock(&c->lock);
	while (hcache_release_one(c, past_keep, &c->keep))
		;
}

/* The first entry match() accepts, with a reference taken, or NULL. */
static struct hnode *hcache_find(struct hcache *c, bool (*match)(const struct hnode *n,
								 const void *key),
				 const void *key)
{
	struct hnode *n;

	pthread_mutex_lock(&c->lock);
	for (n = c->head; n; n = n->next)
		if (match(n, key))
			break;
	if (n)
		n->refs++;
	pthread_mutex_unlock(&c->lock);
	return n;
}

/* The ckptfs metadata of one stored tensor (struct ckpt_tensor_meta without
 * its 16-dimension arrays: 72 bytes instead of 448, which matters for
 * 20,000-tensor sources).  gs, off, shape: ndim entries each, in the
 * source's dims buffer. */
struct smeta {
	unsigned ndim;
	int tp_dim;
	bool flat, has_pp;
	struct ckpt_pp pp;
	uint64_t flat_begin, flat_end;
	const uint64_t *gs, *off, *shape; /* global shape, box offset and shape */
};

/* Parsed sources are shared by every view built while they are unchanged
 * (several layouts of one directory parse each header once). */
struct srcdata {
	struct hnode node;
	uint64_t ino, size;
	int64_t mtime_ns;
	struct ckpt_extent_list *ext;
	ckpt_st_header *hdr;
	ckpt_shardmeta *meta;
	uint64_t data_start;
	bool source;
	struct smeta *metas; /* per tensor (parallel to tensors) */
	uint64_t *mdims;     /* their dims (parsed JSON; else in blob) */
	/* The tensor table the view uses: from hdr/meta (parsed JSON) or from
	 * the persisted parse (then hdr and meta are NULL, names and shapes
	 * live in blob). */
	struct ckpt_st_tensor *tensors;
	size_t ntensors;
	const char *group;
	bool has_nl;
	uint64_t nl;
	void *blob;
};

static void srcdata_destroy(struct hnode *n);

/* The cache keeps its 64 newest parses, so a header parsed ahead of time
 * (ckpt_view_prefetch) or for a view since dropped is still there for the
 * next view. */
static struct hcache src_cache = { PTHREAD_MUTEX_INITIALIZER, NULL, 64, srcdata_destroy };

struct src {
	uint64_t ino;
	char *name;
	struct ckpt_extent_list *ext; /* these point into cached */
	ckpt_st_header *hdr;
	ckpt_shardmeta *meta;
	const struct smeta *metas;
	const struct ckpt_st_tensor *tensors;
	size_t ntensors;
	const char *group;
	bool has_nl;
	uint64_t nl;
	uint64_t data_start; /* 8 + N */
	int64_t mtime_ns;
	bool source; /* consumed by the view (reshardable) */
	struct srcdata *cached;
};

static void srcdata_destroy(struct hnode *n)
{
	struct srcdata *d = hcache_entry(n, struct srcdata);

	ckpt_extent_list_free(d->ext);
	ckpt_st_header_free(d->hdr);
	ckpt_shardmeta_free(d->meta);
	free(d->metas);
	free(d->mdims);
	free(d->tensors);
	free(d->blob);
	free(d);
}

static void srcdata_unref(struct srcdata *d)
{
	if (d)
		hnode_unref(&src_cache, &d->node);
}

struct piece {
	size_t src;
	const struct ckpt_st_tensor *t;
	const struct smeta *m; /* the source's (cached parse) */
	const char *group;
};

struct gtensor {
	const char *name;
	size_t group;
	size_t p0, p1; /* pieces[p0..p1) */
	enum ckpt_dtype dtype;
	unsigned elem_bytes;
	unsigned ndim;
	uint64_t gshape[CKPT_MAX_DIMS];
	int tp_dim;
	struct ckpt_pp pp;
	char *problem; /* non-NULL: every file holding it fails to open */
};

struct vgroup {
	char *name;
	size_t g0, g1; /* gtensors[g0..g1) */
	uint64_t num_layers;
	size_t nfiles;
	unsigned saved_tp, saved_pp;
};

struct vtensor {
	size_t g;          /* global tensor; its part: vt_box() */
	uint64_t data_off;   /* in the file's data area */
	uint64_t nbytes;
};

struct vfile_plan {
	char *name;
	size_t group;
	unsigned tp_rank, pp_rank;
	bool planned; /* header, tensors and size computed (under plan_lock) */
	int plan_err;
	/* every tensor passed the checks of an open once: the view never
	 * changes (V1), so later opens skip them */
	atomic_bool verified;
	uint8_t *hdr;
	size_t hdr_len;
	uint64_t size;
	struct vtensor *t;
	size_t nt;
};

/* The layout-independent part of a view (sources, pieces, global tensors,
 * groups), shared by the views of every layout of one unchanged directory. */
struct vmodel {
	struct hnode node;
	uint64_t dir, sig;
	const ckpt_tp_rules *rules;
	int64_t mtime_ns;
	struct src *srcs;
	size_t nsrcs;
	struct piece *pieces;
	size_t npieces;
	struct gtensor *gts;
	size_t ngts;
	struct vgroup *groups;
	size_t ngroups;
};

struct ckpt_view {
	atomic_int refs;
	ckpt_store *s;
	struct ckpt_layout layout;
	uint64_t sig;
	int64_t mtime_ns;
	pthread_mutex_t plan_lock; /* files are planned on first use */
	struct vmodel *model; /* owns everything below up to files */
	struct src *srcs;
	size_t nsrcs;
	struct piece *pieces;
	size_t npieces;
	struct gtensor *gts;
	size_t ngts;
	struct vgroup *groups;
	size_t ngroups;
	struct vfile_plan *files;
	size_t nfiles;
};

struct run {
	uint64_t dst; /* offset in the view file */
	uint64_t len;
	size_t src;   /* index into view->srcs */
	uint64_t src_off; /* offset in the source file */
};

/* The byte runs of one tensor of an open file (dst: file offsets). */
struct truns {
	size_t n;
	struct run v[];
};

struct ckpt_vfile {
	ckpt_view *v;
	const struct vfile_plan *plan;
	/* per tensor of plan, computed on the first read of its bytes and
	 * published with a compare-and-swap (reads may run concurrently) */
	_Atomic(struct truns *) *truns;
};

static void seterr(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	ckpt_verrf(err, errlen, fmt, ap);
	va_end(ap);
}

/* ------------------------------------------------------------ lifetime */

void ckpt_view_ref(ckpt_view *v)
{
	atomic_fetch_add(&v->refs, 1);
}

static void model_destroy(struct hnode *n);
static struct hcache model_cache = { PTHREAD_MUTEX_INITIALIZER, NULL, 16, model_destroy };

static void model_parts_free(struct src *srcs, size_t nsrcs, struct piece *pieces,
			     struct gtensor *gts, size_t ngts, struct vgroup *groups,
			     size_t ngroups)
{
	for (size_t i = 0; i < nsrcs; i++) {
		free(srcs[i].name);
		srcdata_unref(srcs[i].cached);
	}
	free(srcs);
	free(pieces);
	for (size_t i = 0; i < ngts; i++)
		free(gts[i].problem);
	free(gts);
	for (size_t i = 0; i < ngroups; i++)
		free(groups[i].name);
	free(groups);
}

static void model_destroy(struct hnode *n)
{
	struct vmodel *m = hcache_entry(n, struct vmodel);

	model_parts_free(m->srcs, m->nsrcs, m->pieces, m->gts, m->ngts, m->groups, m->ngroups);
	free(m);
}

static void model_unref(struct vmodel *m)
{
	if (m)
		hnode_unref(&model_cache, &m->node);
}

static void view_destroy(ckpt_view *v)
{
	if (v->model)
		model_unref(v->model);
	else
		model_parts_free(v->srcs, v->nsrcs, v->pieces, v->gts, v->ngts, v->groups,
				 v->ngroups);
	for (size_t i = 0; i < v->nfiles; i++) {
		free(v->files[i].name);
		free(v->files[i].hdr);
		free(v->files[i].t);
	}
	free(v->files);
	pthread_mutex_destroy(&v->plan_lock);
	free(v);
}

void ckpt_view_unref(ckpt_view *v)
{
	if (v && atomic_fetch_sub(&v->refs, 1) == 1)
		view_destroy(v);
}

/* ------------------------------------------------------------- sources */

/* The entries of dir, the attributes of its regular files (ins[i].ino == 0
 * for other entries and files that vanished) and the fingerprint of
 * ckpt_view_signature(), in one pass. */
static int scan_dir(ckpt_store *s, uint64_t dir, struct ckpt_dirent **ret_ents, size_t *ret_n,
		    struct ckpt_inode **ret_ins, uint64_t *ret_sig)
{
	struct ckpt_dirent *ents = NULL;
	struct ckpt_inode *ins;
	size_t n = 0, k = 0;
	uint64_t *buf;
	int r = ckpt_store_readdir(s, dir, &ents, &n);

	if (r < 0)
		return r;
	buf = malloc((n * 4 + 1) * sizeof(*buf));
	ins = calloc(n ? n : 1, sizeof(*ins));
	if (!buf || !ins) {
		free(buf);
		free(ins);
		ckpt_dirents_free(ents, n);
		return -ENOMEM;
	}
	buf[k++] = dir;
	for (size_t i = 0; i < n; i++) {
		struct ckpt_inode *in = &ins[i];
		if (!S_ISREG(ents[i].mode) || ckpt_store_getattr(s, ents[i].ino, in) < 0) {
			memset(in, 0, sizeof(*in));
			continue;
		}
		buf[k++] = in->ino;
		buf[k++] = in->size;
		buf[k++] = (uint64_t)in->mtime_ns;
		buf[k++] = in->flags;
	}
	*ret_sig = ckpt_checksum(buf, k * sizeof(*buf));
	free(buf);
	*ret_ents = ents;
	*ret_n = n;
	*ret_ins = ins;
	return 0;
}

int ckpt_view_signature(ckpt_store *s, uint64_t dir, uint64_t *ret_sig)
{
	struct ckpt_dirent *ents = NULL;
	struct ckpt_inode *ins = NULL;
	size_t n = 0;
	int r = scan_dir(s, dir, &ents, &n, &ins, ret_sig);

	if (r == 0) {
		ckpt_dirents_free(ents, n);
		free(ins);
	}
	return r;
}

/* Read and parse the header of a safetensors source (uncached). */
static int parse_source(ckpt_store *s, struct src *src, char *err, size_t errlen)
{
	uint8_t prefix[8], *json = NULL;
	uint64_t n;
	ssize_t got;
	char why[256];
	int r;

	r = ckpt_store_load_extents(s, src->ino, &src->ext);
	if (r < 0)
		goto fail;
	got = ckpt_store_read_extents(s, src->ext, prefix, 8, 0);
	if (got != 8 || ckpt_st_header_len(prefix, &n) < 0) {
		r = got < 0 ? (int)got : -EIO;
		goto fail;
	}
	json = malloc(n);
	if (!json) {
		r = -ENOMEM;
		goto fail;
	}
	got = ckpt_store_read_extents(s, src->ext, json, n, 8);
	if (got != (ssize_t)n) {
		r = got < 0 ? (int)got : -EIO;
		goto fail;
	}
	r = ckpt_st_parse(json, n, &src->hdr, why, sizeof(why));
	free(json);
	json = NULL;
	if (r < 0) {
		/* flagged at commit as valid: the store changed under us */
		seterr(err, errlen, "%s: header no longer parses: %s", src->name, why);
		return -EIO;
	}
	src->data_start = 8 + n;
	r = ckpt_shardmeta_parse(src->hdr, &src->meta, why, sizeof(why));
	if (r < 0) {
		ckpt_warn("%s: ckptfs metadata not usable (%s); served as an ordinary file",
			  src->name, why);
		src->meta = NULL;
		src->source = false;
		return 0;
	}
	src->source = true;
	for (size_t i = 0; i < ckpt_st_tensor_count(src->hdr); i++) {
		unsigned bits = ckpt_dtype_bits(ckpt_st_tensor_at(src->hdr, i)->dtype);
		if (bits % 8) {
			ckpt_warn("%s: sub-byte dtype %s cannot be resharded; served as an ordinary "
				  "file", src->name, ckpt_dtype_name(ckpt_st_tensor_at(src->hdr, i)->dtype));
			src->source = false;
			break;
		}
	}
	return 0;
fail:
	free(json);
	seterr(err, errlen, "%s: cannot read safetensors header: %s", src->name, strerror(-r));
	return r < 0 ? r : -EIO;
}


/* Put a source's tensor table (and its metas) in strcmp order of names, so
 * that view builds merge sources instead of sorting every piece.  Returns 1
 * if it reordered, 0 if already in order, -ENOMEM. */
struct name_ord {
	const char *name;
	size_t i;
};

static int name_ord_cmp(const void *a, const void *b)
{
	return strcmp(((const struct name_ord *)a)->name, ((const struct name_ord *)b)->name);
}

static int sort_table(struct ckpt_st_tensor *t, struct smeta *m, size_t n)
{
	struct name_ord *ord;
	struct ckpt_st_tensor *t2;
	struct smeta *m2;
	size_t k;

	for (k = 1; k < n; k++)
		if (strcmp(t[k - 1].name, t[k].name) > 0)
			break;
	if (k >= n)
		return 0;
	ord = malloc(n * sizeof(*ord));
	t2 = malloc(n * sizeof(*t2));
	m2 = malloc(n * sizeof(*m2));
	if (!ord || !t2 || !m2) {
		free(ord);
		free(t2);
		free(m2);
		return -ENOMEM;
	}
	for (k = 0; k < n; k++) {
		ord[k].name = t[k].name;
		ord[k].i = k;
	}
	qsort(ord, n, sizeof(*ord), name_ord_cmp);
	for (k = 0; k < n; k++) {
		t2[k] = t[ord[k].i];
		m2[k] = m[ord[k].i];
	}
	memcpy(t, t2, n * sizeof(*t));
	memcpy(m, m2, n * sizeof(*m));
	free(ord);
	free(t2);
	free(m2);
	return 1;
}

/* ---------------------------------------------- persisted parse results */

/*
 * The parse of a source (tensor table, ckptfs metadata) is kept in the index
 * under 'P' + ino (format in docs/format.md), so that the first view after a
 * mount does not parse JSON again: 20,000-tensor headers cost ~0.7 s.  The
 * record is valid while the chunks holding the file's header are the same
 * (fingerprint of their extents), whatever else changed.
 */
#define PARSE_REC_VERSION 2 /* 1: fixed-width fields, names whole */

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
static uint64_t header_fingerprint(const struct ckpt_extent_list *l, uint64_t data_start)
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

static void persist_parse(ckpt_store *s, const struct srcdata *d,
			  const struct ckpt_extent_list *ext)
{
	struct wbuf b = { 0 };
	size_t glen = d->group ? strlen(d->group) : 0;

	if (!ckpt_store_writable(s) || !ext)
		return;
	wb_u8(&b, PARSE_REC_VERSION);
	wb_u8(&b, d->source);
	wb_u8(&b, d->has_nl);
	wb_u8(&b, 0);
	wb_u32(&b, (uint32_t)d->ntensors);
	wb_u64(&b, header_fingerprint(ext, d->data_start));
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
	if (!b.oom)
		(void)ckpt_store_parsed_put(s, d->ino, b.p, b.n); /* a cache: best effort */
	free(b.p);
}

/* srcdata from the persisted parse of src, or NULL (absent, stale, bad). */
static struct srcdata *load_parse_record(ckpt_store *s, struct src *src, uint64_t size)
{
	struct srcdata *d = NULL;
	struct ckpt_extent_list *ext = NULL;
	struct rbuf b = { 0 };
	uint8_t *val = NULL;
	size_t vlen, names = 0, dims = 0, mdims = 0, pos_names = 0, pos_dims = 0;
	uint32_t nt;
	uint16_t glen;
	uint64_t fp;
	char *strs;
	uint64_t *shapes;

	if (ckpt_store_parsed_get(s, src->ino, &val, &vlen) < 0)
		return NULL;
	b.p = val;
	b.n = vlen;
	if (rb_u8(&b) != PARSE_REC_VERSION)
		goto bad;
	d = calloc(1, sizeof(*d));
	if (!d)
		goto bad;
	d->source = rb_u8(&b);
	d->has_nl = rb_u8(&b);
	rb_u8(&b);
	nt = rb_u32(&b);
	fp = rb_u64(&b);
	d->data_start = rb_u64(&b);
	d->nl = rb_u64(&b);
	glen = rb_u16(&b);
	if (b.bad || nt > vlen || (!d->source && nt))
		goto bad;
	if (ckpt_store_load_extents(s, src->ino, &ext) < 0 ||
	    header_fingerprint(ext, d->data_start) != fp)
		goto bad;
	/* pass 1: sizes of the name and shape blobs, and validation */
	{
		struct rbuf c = b;
		size_t prev_len = 0;
		rb_take(&c, glen);
		names += glen + 1;
		for (uint32_t k = 0; k < nt && !c.bad; k++) {
			uint64_t pre = rb_var(&c), rest = rb_var(&c);
			uint8_t dl, nd, md, fl;
			if (pre > prev_len || rest > vlen) {
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
			mdims += 3 * (size_t)md;
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
		if (c.bad || c.off != c.n)
			goto bad;
	}
	d->blob = malloc(names + (dims + mdims) * sizeof(uint64_t) + 8);
	d->tensors = calloc(nt ? nt : 1, sizeof(*d->tensors));
	d->metas = calloc(nt ? nt : 1, sizeof(*d->metas));
	if (!d->blob || !d->tensors || !d->metas)
		goto bad;
	shapes = d->blob;
	strs = (char *)(shapes + dims + mdims);
	memcpy(strs, rb_take(&b, glen), glen);
	strs[glen] = '\0';
	d->group = strs;
	pos_names = glen + 1;
	for (uint32_t k = 0; k < nt; k++) {
		struct ckpt_st_tensor *t = &d->tensors[k];
		struct smeta *m = &d->metas[k];
		size_t pre = (size_t)rb_var(&b), rest = (size_t)rb_var(&b);
		uint64_t *md;
		uint8_t dl, fl;
		char dt[32];

		/* checked by pass 1: pre <= length of the previous name */
		if (pre)
			memcpy(strs + pos_names, d->tensors[k - 1].name, pre);
		memcpy(strs + pos_names + pre, rb_take(&b, rest), rest);
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
	d->ino = src->ino;
	d->size = size;
	d->mtime_ns = src->mtime_ns;
	d->ext = ext;
	free(val);
	return d;
bad:
	if (d) {
		free(d->blob);
		free(d->tensors);
		free(d->metas);
		free(d);
	}
	ckpt_extent_list_free(ext);
	free(val);
	return NULL;
}

struct src_key {
	ckpt_store *s;
	uint64_t ino, size;
	int64_t mtime_ns;
};

static bool src_match(const struct hnode *n, const void *key)
{
	const struct srcdata *d = hcache_entry(n, const struct srcdata);
	const struct src_key *k = key;

	return n->s == k->s && d->ino == k->ino && d->size == k->size &&
	       d->mtime_ns == k->mtime_ns;
}

/* Parse a source, or share the parse of an unchanged one. */
static int load_source(ckpt_store *s, struct src *src, uint64_t size, char *err, size_t errlen)
{
	struct srcdata *d;
	int r;

	{
		struct src_key key = { s, src->ino, size, src->mtime_ns };
		struct hnode *n = hcache_find(&src_cache, src_match, &key);
		d = n ? hcache_entry(n, struct srcdata) : NULL;
	}
	if (!d && (d = load_parse_record(s, src, size)) != NULL) {
		/* parsed on an earlier mount: no JSON to parse (records of older
		 * builds are in data order: rewrite them in name order) */
		if (sort_table(d->tensors, d->metas, d->ntensors) > 0)
			persist_parse(s, d, d->ext);
		hcache_insert(&src_cache, &d->node, s);
	} else if (!d) {
		r = parse_source(s, src, err, errlen);
		if (r < 0) {
			ckpt_extent_list_free(src->ext);
			ckpt_st_header_free(src->hdr);
			ckpt_shardmeta_free(src->meta);
			src->ext = NULL;
			src->hdr = NULL;
			src->meta = NULL;
			return r;
		}
		d = calloc(1, sizeof(*d));
		if (!d) {
			ckpt_extent_list_free(src->ext);
			ckpt_st_header_free(src->hdr);
			ckpt_shardmeta_free(src->meta);
			return -ENOMEM;
		}
		d->ino = src->ino;
		d->size = size;
		d->mtime_ns = src->mtime_ns;
		d->ext = src->ext;
		d->hdr = src->hdr;
		d->meta = src->meta;
		d->data_start = src->data_start;
		d->source = src->source;
		if (d->source) {
			size_t nt = ckpt_st_tensor_count(d->hdr), nd = 0;
			for (size_t k = 0; k < nt; k++) {
				struct ckpt_tensor_meta tm;
				if (ckpt_shardmeta_tensor(d->meta, ckpt_st_tensor_at(d->hdr, k), &tm) == 0)
					nd += 3 * (size_t)tm.ndim;
			}
			d->metas = calloc(nt ? nt : 1, sizeof(*d->metas));
			d->mdims = calloc(nd ? nd : 1, sizeof(*d->mdims));
			d->tensors = calloc(nt ? nt : 1, sizeof(*d->tensors));
			nd = 0;
			for (size_t k = 0; d->metas && d->mdims && d->tensors && k < nt; k++) {
				struct ckpt_tensor_meta tm;
				struct smeta *m = &d->metas[k];
				uint64_t *md = d->mdims + nd;
				d->tensors[k] = *ckpt_st_tensor_at(d->hdr, k);
				if (ckpt_shardmeta_tensor(d->meta, &d->tensors[k], &tm) < 0) {
					d->source = false; /* validated by parse: cannot happen */
					break;
				}
				nd += 3 * (size_t)tm.ndim;
				m->ndim = tm.ndim;
				m->tp_dim = tm.tp_dim;
				m->flat = tm.geom.flat;
				m->has_pp = tm.has_pp;
				m->pp = tm.pp;
				m->flat_begin = tm.geom.flat_begin;
				m->flat_end = tm.geom.flat_end;
				m->gs = md;
				m->off = md + tm.ndim;
				m->shape = md + 2 * tm.ndim;
				memcpy(md, tm.global_shape, tm.ndim * sizeof(*md));
				memcpy(md + tm.ndim, tm.geom.box.off, tm.ndim * sizeof(*md));
				memcpy(md + 2 * tm.ndim, tm.geom.box.shape, tm.ndim * sizeof(*md));
			}
			if (!d->metas || !d->mdims || !d->tensors)
				d->source = false;
			d->ntensors = d->source ? nt : 0;
			if (d->source)
				sort_table(d->tensors, d->metas, nt); /* else merged unsorted */
			d->group = ckpt_shardmeta_group(d->meta);
			d->has_nl = ckpt_shardmeta_num_layers(d->meta, &d->nl);
		}
		persist_parse(s, d, src->ext);
		hcache_insert(&src_cache, &d->node, s);
	}
	src->cached = d;
	src->ext = d->ext;
	src->hdr = d->hdr;
	src->meta = d->meta;
	src->data_start = d->data_start;
	src->source = d->source;
	src->metas = d->metas;
	src->tensors = d->tensors;
	src->ntensors = d->ntensors;
	src->group = d->group;
	src->has_nl = d->has_nl;
	src->nl = d->nl;
	return 0;
}

/* The sources among the entries of the view's directory (from scan_dir). */
static int collect_sources(ckpt_view *v, const struct ckpt_dirent *ents, size_t n,
			   const struct ckpt_inode *ins, char *err, size_t errlen)
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
		r = load_source(v->s, src, in.size, err, errlen);
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
	int c = strcmp(srcs[x].group, srcs[y].group);

	if (c)
		return c;
	return x < y ? -1 : x > y;
}

/* Merge heap over the sources of one group: the next tensor of each. */
struct mhead {
	size_t src, k;
};

static bool mhead_less(const ckpt_view *v, const struct mhead *a, const struct mhead *b)
{
	int c = strcmp(v->srcs[a->src].tensors[a->k].name, v->srcs[b->src].tensors[b->k].name);

	return c < 0 || (c == 0 && a->src < b->src);
}

static void mheap_down(const ckpt_view *v, struct mhead *h, size_t n, size_t i)
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

static void add_piece(ckpt_view *v, size_t si, size_t k)
{
	struct src *src = &v->srcs[si];
	struct piece *p = &v->pieces[v->npieces++];

	p->src = si;
	p->t = &src->tensors[k];
	p->group = src->group;
	p->m = &src->metas[k];
}

/* Pieces in (group, name, source) order.  Source tables are in name order
 * (sort_table), so the sources of each group are merged; a table that is
 * not (sort_table ran out of memory) falls back to sorting every piece. */
static int collect_pieces(ckpt_view *v)
{
	size_t n = 0, ns = 0, *order = NULL;
	struct mhead *heap = NULL;
	bool sorted = true;

	for (size_t i = 0; i < v->nsrcs; i++) {
		const struct src *src = &v->srcs[i];
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
		if (v->srcs[i].source)
			order[ns++] = i;
	if (!sorted) {
		for (size_t j = 0; j < ns; j++)
			for (size_t k = 0; k < v->srcs[order[j]].ntensors; k++)
				add_piece(v, order[j], k);
		qsort(v->pieces, v->npieces, sizeof(*v->pieces), piece_cmp);
		goto out;
	}
	qsort_r(order, ns, sizeof(*order), src_group_cmp, v->srcs);
	for (size_t a = 0, b; a < ns; a = b) {
		size_t nh = 0;
		for (b = a; b < ns && !strcmp(v->srcs[order[b]].group, v->srcs[order[a]].group); b++)
			if (v->srcs[order[b]].ntensors) {
				heap[nh].src = order[b];
				heap[nh].k = 0;
				nh++;
			}
		for (size_t i = nh / 2; i-- > 0;)
			mheap_down(v, heap, nh, i);
		while (nh) {
			add_piece(v, heap[0].src, heap[0].k);
			if (++heap[0].k == v->srcs[heap[0].src].ntensors)
				heap[0] = heap[--nh];
			mheap_down(v, heap, nh, 0);
		}
	}
out:
	free(order);
	free(heap);
	return 0;
}

static void problem(struct gtensor *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(struct gtensor *g, const char *fmt, ...)
{
	va_list ap;

	if (g->problem)
		return; /* keep the first */
	va_start(ap, fmt);
	if (vasprintf(&g->problem, fmt, ap) < 0)
		g->problem = NULL;
	va_end(ap);
}

static void fmt_shape(char *buf, size_t len, const uint64_t *shape, unsigned ndim)
{
	size_t k = (size_t)snprintf(buf, len, "[");

	for (unsigned i = 0; i < ndim && k < len; i++)
		k += (size_t)snprintf(buf + k, len - k, "%s%" PRIu64, i ? ", " : "", shape[i]);
	if (k < len)
		snprintf(buf + k, len - k, "]");
}

/* Resolve dtype, shape, tp_dim and pp of one global tensor. */
static void resolve(ckpt_view *v, struct gtensor *g, const ckpt_tp_rules *rules)
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
			fmt_shape(a, sizeof(a), g->gshape, g->ndim);
			fmt_shape(b, sizeof(b), p->m->gs, p->m->ndim);
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

/* Infer the layout the sources of a group were saved in. */
static void infer_saved_layout(ckpt_view *v, struct vgroup *grp)
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
		const struct src *src = &v->srcs[si];
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

static int build_groups(ckpt_view *v, const ckpt_tp_rules *rules)
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
			if (!v->srcs[si].source || strcmp(v->srcs[si].group, grp->name))
				continue;
			grp->nfiles++;
			x = v->srcs[si].nl;
			if (v->srcs[si].has_nl) {
				if (!explicit || x > n)
					n = x;
				explicit = true;
			}
		}
		if (!explicit) {
			for (size_t k = grp->g0; k < grp->g1; k++)
				if (v->gts[k].pp.kind == CKPT_PP_LAYER && v->gts[k].pp.layer + 1 > n)
					n = v->gts[k].pp.layer + 1;
		}
		grp->num_layers = n;
		infer_saved_layout(v, grp);
	}
	return 0;
}

/* ----------------------------------------------------------- view files */

/* The part of global tensor g that TP rank t of T holds, in global
 * coordinates (section 5 of docs/views.md). */
static void part_box(const struct gtensor *g, unsigned T, unsigned t, struct ckpt_box *b)
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
	const struct gtensor *g = &c->v->gts[c->f->t[i].g];

	*ret_name = g->name;
	memset(tmp, 0, sizeof(*tmp));
	part_box(g, c->v->layout.tp, c->f->tp_rank, &tmp->geom.box);
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
	const struct vgroup *grp = &v->groups[group];
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
		const struct gtensor *g = &v->gts[gi];
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
		const struct gtensor *g = &v->gts[ord[i].g];
		struct vtensor *vt = &f->t[i];
		struct ckpt_box box;

		vt->g = ord[i].g;
		part_box(g, v->layout.tp, t, &box);
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

static int plan_files(ckpt_view *v)
{
	size_t per = (size_t)v->layout.tp * v->layout.pp;

	v->files = calloc(v->ngroups * per + 1, sizeof(*v->files));
	if (!v->files)
		return -ENOMEM;
	/* Only names here: headers (which fix the sizes) are built on first
	 * use of each file (ensure_plan), so a stat of one file of a tp8_pp4
	 * view does not serialize 32 headers. */
	for (size_t gi = 0; gi < v->ngroups; gi++) {
		for (unsigned p = 0; p < v->layout.pp; p++) {
			for (unsigned t = 0; t < v->layout.tp; t++) {
				struct vfile_plan *f = &v->files[v->nfiles++];
				int r;
				f->group = gi;
				f->tp_rank = t;
				f->pp_rank = p;
				if (v->layout.tp == 1 && v->layout.pp == 1)
					r = asprintf(&f->name, "%s.safetensors", v->groups[gi].name);
				else
					r = asprintf(&f->name, "%s_tp%u_pp%u.safetensors",
						     v->groups[gi].name, t, p);
				if (r < 0) {
					f->name = NULL;
					return -ENOMEM;
				}
			}
		}
	}
	return 0;
}

static int ensure_plan(ckpt_view *v, size_t i)
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

struct model_key {
	ckpt_store *s;
	uint64_t dir, sig;
	const ckpt_tp_rules *rules;
};

static bool model_match(const struct hnode *n, const void *key)
{
	const struct vmodel *m = hcache_entry(n, const struct vmodel);
	const struct model_key *k = key;

	return n->s == k->s && m->dir == k->dir && m->sig == k->sig && m->rules == k->rules;
}

/* Point v at the cached model of (dir, v->sig, rules), if any. */
static bool model_get(ckpt_view *v, uint64_t dir, const ckpt_tp_rules *rules)
{
	struct model_key key = { v->s, dir, v->sig, rules };
	struct hnode *n = hcache_find(&model_cache, model_match, &key);
	struct vmodel *m = n ? hcache_entry(n, struct vmodel) : NULL;

	if (!m)
		return false;
	v->model = m;
	v->mtime_ns = m->mtime_ns;
	v->srcs = m->srcs;
	v->nsrcs = m->nsrcs;
	v->pieces = m->pieces;
	v->npieces = m->npieces;
	v->gts = m->gts;
	v->ngts = m->ngts;
	v->groups = m->groups;
	v->ngroups = m->ngroups;
	return true;
}

/* Hand v's freshly built model to the cache (v keeps using it). */
static void model_put(ckpt_view *v, uint64_t dir, const ckpt_tp_rules *rules)
{
	struct vmodel *m = calloc(1, sizeof(*m));

	if (!m)
		return;
	m->dir = dir;
	m->sig = v->sig;
	m->rules = rules;
	m->mtime_ns = v->mtime_ns;
	m->srcs = v->srcs;
	m->nsrcs = v->nsrcs;
	m->pieces = v->pieces;
	m->npieces = v->npieces;
	m->gts = v->gts;
	m->ngts = v->ngts;
	m->groups = v->groups;
	m->ngroups = v->ngroups;
	v->model = m;
	hcache_insert(&model_cache, &m->node, v->s); /* v's reference and the cache's */
}

int ckpt_view_build(ckpt_store *s, uint64_t dir, const struct ckpt_layout *l,
		    const ckpt_tp_rules *rules, ckpt_view **ret_view, char *err, size_t errlen)
{
	ckpt_view *v;
	struct ckpt_inode din, *ins = NULL;
	struct ckpt_dirent *ents = NULL;
	size_t nents = 0;
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
	v->mtime_ns = din.mtime_ns;
	r = scan_dir(s, dir, &ents, &nents, &ins, &v->sig);
	if (r < 0)
		seterr(err, errlen, "cannot list directory: %s", strerror(-r));
	if (r == 0 && !model_get(v, dir, rules)) {
		r = collect_sources(v, ents, nents, ins, err, errlen);
		if (r == 0)
			r = collect_pieces(v);
		if (r == 0)
			r = build_groups(v, rules);
		if (r == 0)
			model_put(v, dir, rules); /* keeps working without it */
	}
	ckpt_dirents_free(ents, nents);
	free(ins);
	if (r == 0)
		r = plan_files(v);
	if (r < 0) {
		if (r == -ENOMEM)
			seterr(err, errlen, "out of memory");
		view_destroy(v);
		return r;
	}
	*ret_view = v;
	return 0;
}

void ckpt_view_forget_store(ckpt_store *s)
{
	while (hcache_release_one(&src_cache, of_store, s))
		;
	while (hcache_release_one(&model_cache, of_store, s))
		;
}

int ckpt_view_prefetch(ckpt_store *s, uint64_t ino)
{
	struct ckpt_inode in;
	struct src src;
	int r = ckpt_store_getattr(s, ino, &in);

	if (r < 0)
		return r;
	if (!S_ISREG(in.mode) || !(in.flags & CKPT_INODE_F_SAFETENSORS))
		return 0;
	memset(&src, 0, sizeof(src));
	src.ino = ino;
	src.mtime_ns = in.mtime_ns;
	src.name = (char *)"(prefetch)";
	r = load_source(s, &src, in.size, NULL, 0);
	if (r == 0)
		srcdata_unref(src.cached); /* the cache keeps it */
	return r;
}

uint64_t ckpt_view_sig(const ckpt_view *v)
{
	return v->sig;
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
	int r = ensure_plan(v, i);

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
	return v->mtime_ns;
}

bool ckpt_view_is_source(const ckpt_view *v, uint64_t ino)
{
	for (size_t i = 0; i < v->nsrcs; i++)
		if (v->srcs[i].ino == ino)
			return v->srcs[i].source;
	return false;
}

size_t ckpt_view_ngroups(const ckpt_view *v)
{
	return v->ngroups;
}

void ckpt_view_group_info(const ckpt_view *v, size_t i, struct ckpt_view_group_info *ret)
{
	const struct vgroup *g = &v->groups[i];

	memset(ret, 0, sizeof(*ret));
	ret->name = g->name;
	ret->tensors = g->g1 - g->g0;
	ret->files = g->nfiles;
	ret->saved_tp = g->saved_tp;
	ret->saved_pp = g->saved_pp;
	ret->num_layers = g->num_layers;
	for (size_t k = g->g0; k < g->g1; k++)
		if (v->gts[k].problem)
			ret->problems++;
}

/* ------------------------------------------------------------- opening */

struct runvec {
	struct run *v;
	size_t n, cap;
};

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

/* Compare bytes [off, off+len) of two sources by their chunk digests when
 * both are chunked identically, else by reading.  1 equal, 0 different,
 * <0 error. */
static int same_bytes(ckpt_view *v, size_t sa, uint64_t oa, size_t sb, uint64_t ob,
		      uint64_t len)
{
	const struct ckpt_extent_list *la = v->srcs[sa].ext, *lb = v->srcs[sb].ext;
	size_t ia = ckpt_extent_list_find(la, oa), ib = ckpt_extent_list_find(lb, ob);
	uint8_t *ba = NULL, *bb = NULL;
	int r = 1;

	/* fast path: extents start at the same relative offsets with equal
	 * digests (what tensor-aligned chunking gives for equal tensors) */
	if (ia < la->n && ib < lb->n && la->v[ia].off == oa && lb->v[ib].off == ob) {
		uint64_t done = 0;
		while (done < len && ia < la->n && ib < lb->n) {
			const struct ckpt_extent *x = &la->v[ia], *y = &lb->v[ib];
			uint64_t nx = CKPT_MIN((uint64_t)x->len, len - done);
			if (x->len != y->len && !(nx == len - done && y->len >= nx))
				break;
			if (x->kind != y->kind ||
			    (x->kind == CKPT_EXT_CHUNK &&
			     memcmp(x->digest.bytes, y->digest.bytes, CKPT_DIGEST_LEN)))
				break;
			done += nx;
			ia++;
			ib++;
		}
		if (done >= len)
			return 1;
	}
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
	fmt_shape(buf, len, idx, b->ndim);
}

/* The pieces of g with distinct geometries (indices into v->pieces, in
 * order) into uniq (room for all of g's pieces).  check: replicas of one
 * geometry must hold the same bytes (-EIO with err set otherwise). */
static int unique_pieces(ckpt_view *v, const struct gtensor *g, size_t *uniq, size_t *ret_nu,
			 bool check, char *err, size_t errlen)
{
	size_t nu = 0;

	for (size_t i = g->p0; i < g->p1; i++) {
		const struct piece *p = &v->pieces[i];
		const struct piece *q;
		size_t k;
		int r;

		for (k = 0; k < nu; k++)
			if (same_geom(&v->pieces[uniq[k]], p))
				break;
		if (k == nu) {
			uniq[nu++] = i;
			continue;
		}
		if (!check)
			continue;
		q = &v->pieces[uniq[k]];
		r = same_bytes(v, q->src, v->srcs[q->src].data_start + q->t->begin, p->src,
			       v->srcs[p->src].data_start + p->t->begin, p->t->end - p->t->begin);
		if (r < 0)
			return r;
		if (r == 0) {
			seterr(err, errlen,
			       "group '%s', tensor '%s': replicas disagree (%s and %s hold the "
			       "same piece with different bytes)",
			       v->groups[g->group].name, g->name, v->srcs[q->src].name,
			       v->srcs[p->src].name);
			return -EIO;
		}
	}
	*ret_nu = nu;
	return 0;
}

/* Runs of one tensor of a view file, appended to out (dst relative to the
 * file).  Returns -EIO with err set when the tensor cannot be served.
 * check: compare replicas and overlapping pieces (else the tensor is known
 * to have passed, e.g. by tensor_check at open, and overlaps are only
 * trimmed). */
static int tensor_runs(ckpt_view *v, const struct vfile_plan *f, const struct vtensor *vt,
		       struct runvec *out, bool check, char *err, size_t errlen)
{
	const struct gtensor *g = &v->gts[vt->g];
	const char *gname = v->groups[g->group].name;
	struct runvec rv = { 0 };
	size_t *uniq = NULL, nu = 0;
	uint64_t cur = 0, base = f->hdr_len + vt->data_off;
	struct ckpt_box box;
	char idx[256];
	int r = 0;

	if (g->problem) {
		seterr(err, errlen, "group '%s', tensor '%s': %s", gname, g->name, g->problem);
		return -EIO;
	}
	if (vt->nbytes == 0)
		return 0;
	part_box(g, v->layout.tp, f->tp_rank, &box);
	uniq = calloc(g->p1 - g->p0, sizeof(*uniq));
	if (!uniq)
		return -ENOMEM;
	r = unique_pieces(v, g, uniq, &nu, check, err, errlen);
	if (r < 0)
		goto out;
	for (size_t k = 0; k < nu; k++) {
		const struct piece *p = &v->pieces[uniq[k]];
		struct run_ctx c = { &rv, p->src, v->srcs[p->src].data_start + p->t->begin };
		struct ckpt_piece_geom geom;
		piece_geom(p, &geom);
		r = ckpt_box_runs(&box, &geom, g->elem_bytes, run_cb, &c);
		if (r != 0) {
			r = r < 0 ? r : -EIO;
			seterr(err, errlen, "group '%s', tensor '%s': bad piece geometry in %s",
			       gname, g->name, v->srcs[p->src].name);
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
			seterr(err, errlen,
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
					seterr(err, errlen,
					       "group '%s', tensor '%s': overlapping pieces in %s and %s "
					       "disagree (from index %s)",
					       gname, g->name, v->srcs[e->src].name,
					       v->srcs[r2.src].name, idx);
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
		seterr(err, errlen,
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
 * What an open checks for one tensor (the checks of tensor_runs), without
 * computing its runs when its geometry alone proves it: every distinct
 * piece is a box (not flat) and their intersections with the part are
 * pairwise disjoint and add up to the part's element count, so the part is
 * covered exactly once (no gap, no overlap to compare).  Anything else
 * (gaps, overlaps, flat pieces, many pieces) goes through tensor_runs, which
 * finds the same problems with the same messages.
 */
#define FAST_PIECES 16

static int tensor_check(ckpt_view *v, const struct vfile_plan *f, const struct vtensor *vt,
			char *err, size_t errlen)
{
	const struct gtensor *g = &v->gts[vt->g];
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
	part_box(g, v->layout.tp, f->tp_rank, &box);
	want = ckpt_box_elems(&box);
	if (want == UINT64_MAX)
		goto slow;
	for (size_t k = 0; k < nu; k++) {
		const struct piece *p = &v->pieces[uniq[k]];
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
	r = tensor_runs(v, f, vt, &out, true, err, errlen);
	free(out.v);
	return r;
}

int ckpt_view_check(ckpt_view *v, void (*cb)(void *ud, const char *file, const char *why),
		    void *ud)
{
	int problems = 0;

	for (size_t i = 0; i < v->nfiles; i++) {
		const struct vfile_plan *f = &v->files[i];
		int rp = ensure_plan(v, i);
		if (rp < 0) {
			cb(ud, f->name, strerror(-rp));
			problems++;
			continue;
		}
		for (size_t k = 0; k < f->nt; k++) {
			char err[1024];
			int r;

			err[0] = '\0';
			r = tensor_check(v, f, &f->t[k], err, sizeof(err));
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

int ckpt_vfile_open(ckpt_view *v, size_t i, ckpt_vfile **ret_file, char *err, size_t errlen)
{
	struct vfile_plan *f;
	ckpt_vfile *vf;
	int r = 0;

	if (i >= v->nfiles)
		return -ENOENT;
	r = ensure_plan(v, i);
	if (r < 0) {
		seterr(err, errlen, "cannot build the header of %s: %s", v->files[i].name,
		       strerror(-r));
		return r;
	}
	f = &v->files[i];
	if (!atomic_load(&f->verified)) {
		for (size_t k = 0; k < f->nt && r == 0; k++)
			r = tensor_check(v, f, &f->t[k], err, errlen);
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
	r = tensor_runs(f->v, f->plan, &f->plan->t[k], &rv, false, err, sizeof(err));
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
 * a 1 MiB read of a tp1 view of a tp2 row-parallel weight is ~2,000 runs of
 * 512 bytes alternating between two sources.  One read cursor per source
 * (a few slots, reused round-robin) keeps each source's current chunk
 * pinned across those runs instead of a cache lookup per run.
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
				ckpt_read_cursor_init(&cur[c], f->v->srcs[rn->src].ext);
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
			const struct ckpt_extent_list *l = f->v->srcs[r->src].ext;
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
