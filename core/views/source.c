/* SPDX-License-Identifier: MIT */
/*
 * source.c - the sources of a view: listing a directory, and the parse of
 * each safetensors file in it (tensor table and ckptfs metadata), shared
 * through a process-wide cache and persisted in the index (parsrec.c).
 *
 * A parse is looked up, in order: in the cache (same store, inode, size and
 * mtime), in the persisted record (same header chunks), and only then made
 * by reading and parsing the JSON header, which is the costliest step of
 * the first view of a large directory.  Either way its tensor table is put
 * in strcmp order of names, so that model.c merges the sources of a group
 * instead of sorting every piece.
 */
#include "views/view_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "views/parsrec.h"
#include "base/util.h"

static void srcdata_destroy(struct vcache_node *n);

/* The cache keeps its 64 newest parses, so a header parsed ahead of time
 * (ckpt_view_prefetch) or for a view since dropped is still there for the
 * next view. */
static struct vcache src_cache = VCACHE_INIT(64, srcdata_destroy, CKPT_VIEW_CACHE_MEM_DEFAULT / 2);

static void srcdata_destroy(struct vcache_node *n)
{
	struct srcdata *d = vcache_entry(n, struct srcdata);

	ckpt_extent_list_free(d->ext);
	ckpt_st_header_free(d->hdr);
	ckpt_shardmeta_free(d->meta);
	free(d->metas);
	free(d->mdims);
	free(d->tensors);
	free(d->blob);
	free(d);
}

void vw_srcdata_unref(struct srcdata *d)
{
	if (d)
		vcache_unref(&src_cache, &d->node);
}

void vw_source_forget_store(ckpt_store *s)
{
	vcache_forget_store(&src_cache, s);
}

/* A parse whose file is gone (or an orphan: unlinked, kept while open), or
 * has another size or mtime, is never found again (src_match). */
static bool src_dead(const struct vcache_node *n)
{
	const struct srcdata *d = vcache_entry(n, const struct srcdata);
	struct ckpt_inode in;
	int r = ckpt_store_getattr(n->s, d->ino, &in);

	return r == -ENOENT || (r == 0 && (in.nlink == 0 || in.size != d->size ||
					   in.mtime_ns != d->mtime_ns));
}

void vw_source_sweep(void)
{
	vcache_sweep(&src_cache, src_dead);
}

size_t vw_source_count(void)
{
	return vcache_count(&src_cache);
}

size_t vw_source_kept_bytes(void)
{
	return vcache_kept_bytes(&src_cache);
}

void vw_source_set_budget(size_t bytes)
{
	vcache_set_budget(&src_cache, bytes);
}

int vw_scan_dir(ckpt_store *s, uint64_t dir, struct ckpt_dirent **ret_ents, size_t *ret_n,
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
	int r = vw_scan_dir(s, dir, &ents, &n, &ins, ret_sig);

	if (r == 0) {
		ckpt_dirents_free(ents, n);
		free(ins);
	}
	return r;
}

/* Read and parse the header of source file `name` into d (ext, hdr, meta,
 * data_start, source); what it set is freed with d on failure. */
static int parse_source(ckpt_store *s, const char *name, struct srcdata *d, char *err,
			size_t errlen)
{
	uint8_t prefix[8], *json = NULL;
	uint64_t n;
	ssize_t got;
	char why[256];
	int r;

	r = ckpt_store_load_extents(s, d->ino, &d->ext);
	if (r < 0)
		goto fail;
	got = ckpt_store_read_extents(s, d->ext, prefix, 8, 0);
	if (got != 8 || ckpt_st_header_len(prefix, &n) < 0) {
		r = got < 0 ? (int)got : -EIO;
		goto fail;
	}
	json = malloc(n);
	if (!json) {
		r = -ENOMEM;
		goto fail;
	}
	got = ckpt_store_read_extents(s, d->ext, json, n, 8);
	if (got != (ssize_t)n) {
		r = got < 0 ? (int)got : -EIO;
		goto fail;
	}
	r = ckpt_st_parse(json, n, &d->hdr, why, sizeof(why));
	free(json);
	json = NULL;
	if (r < 0) {
		/* flagged at commit as valid: the store changed under us */
		ckpt_errf(err, errlen, "%s: header no longer parses: %s", name, why);
		return -EIO;
	}
	if (ckpt_st_check_file_size(d->hdr, d->ext->size) < 0) {
		/* flagged at commit as exactly header + data: the same */
		ckpt_errf(err, errlen, "%s: header describes %llu bytes of data, the file holds %llu "
			  "after the header", name, (unsigned long long)ckpt_st_data_len(d->hdr),
			  (unsigned long long)(d->ext->size - CKPT_ST_PREFIX_LEN - n));
		return -EIO;
	}
	d->data_start = 8 + n;
	d->described = ckpt_st_metadata_get(d->hdr, "ckptfs") != NULL;
	r = ckpt_shardmeta_parse(d->hdr, &d->meta, why, sizeof(why));
	if (r < 0) {
		ckpt_warn("%s: ckptfs metadata not usable (%s); served as an ordinary file", name,
			  why);
		d->meta = NULL;
		d->source = false;
		return 0;
	}
	d->source = true;
	for (size_t i = 0; i < ckpt_st_tensor_count(d->hdr); i++) {
		unsigned bits = ckpt_dtype_bits(ckpt_st_tensor_at(d->hdr, i)->dtype);
		if (bits % 8) {
			ckpt_warn("%s: sub-byte dtype %s cannot be resharded; served as an ordinary "
				  "file", name, ckpt_dtype_name(ckpt_st_tensor_at(d->hdr, i)->dtype));
			d->source = false;
			break;
		}
	}
	return 0;
fail:
	free(json);
	ckpt_errf(err, errlen, "%s: cannot read safetensors header: %s", name, strerror(-r));
	return r < 0 ? r : -EIO;
}

/* d's tensor table (tensors, metas, mdims, group, num_layers) from its
 * parsed header and metadata.  Out of memory leaves d not reshardable. */
static void table_from_parse(struct srcdata *d)
{
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
	d->group = ckpt_shardmeta_group(d->meta);
	d->has_nl = ckpt_shardmeta_num_layers(d->meta, &d->nl);
}

struct name_ord {
	const char *name;
	size_t i;
};

static int name_ord_cmp(const void *a, const void *b)
{
	return strcmp(((const struct name_ord *)a)->name, ((const struct name_ord *)b)->name);
}

/* Put a tensor table (and its metas) in strcmp order of names.  Returns 1
 * if it reordered, 0 if already in order, -ENOMEM (the table is then left
 * as it was; model.c copes). */
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

/* What parse d holds, for the cache's byte budget.  blob: the size of its
 * blob (names and dims of a decoded parse), or 0.  A parse that still holds
 * its parsed JSON (hdr) counts four times its header's length for it. */
static size_t srcdata_bytes(const struct srcdata *d, size_t blob)
{
	size_t b = sizeof(*d) + blob +
		   d->ntensors * (sizeof(*d->tensors) + sizeof(*d->metas));

	if (d->ext)
		b += d->ext->cap * sizeof(*d->ext->v);
	if (d->hdr)
		b += 4 * (size_t)d->data_start;
	return b;
}

/*
 * Persist d's parse (a cache: best effort, and only on a writable store),
 * and return the parse to keep: the record decoded again, which holds the
 * tensor table in a few flat arrays, instead of d, which also holds the
 * parsed JSON and metadata (several times the header's size).  d is
 * consumed.  When the record cannot be made or read back, d itself.
 */
static struct srcdata *persist_compact(ckpt_store *s, struct srcdata *d)
{
	struct srcdata *c = NULL;
	uint8_t *rec = NULL;
	size_t len = 0;

	if (!d->ext || vw_parsrec_encode(d, d->ext, &rec, &len) < 0)
		goto out;
	if (ckpt_store_writable(s))
		(void)ckpt_store_parsed_put(s, d->ino, rec, len);
	c = calloc(1, sizeof(*c));
	if (!c)
		goto out;
	c->ino = d->ino;
	c->size = d->size;
	c->mtime_ns = d->mtime_ns;
	if (vw_parsrec_decode(rec, len, d->ext, c) < 0) {
		free(c); /* decode freed what it allocated */
		c = NULL;
		goto out;
	}
	c->ext = d->ext;
	d->ext = NULL;
	srcdata_destroy(&d->node);
	d = c;
out:
	d->node.bytes = srcdata_bytes(d, c ? len : 0);
	free(rec);
	return d;
}

/* Persist d's parse (a cache: best effort, and only on a writable store). */
static void persist_parse(ckpt_store *s, const struct srcdata *d)
{
	uint8_t *rec = NULL;
	size_t len = 0;

	if (!ckpt_store_writable(s) || !d->ext)
		return;
	if (vw_parsrec_encode(d, d->ext, &rec, &len) == 0)
		(void)ckpt_store_parsed_put(s, d->ino, rec, len);
	free(rec);
}

/* The persisted parse of d->ino into d (with d->ext), or false (absent,
 * stale, damaged, out of memory: the header is parsed instead). */
static bool load_parse_record(ckpt_store *s, struct srcdata *d)
{
	uint8_t *rec = NULL;
	size_t len = 0;
	int r;

	if (ckpt_store_parsed_get(s, d->ino, &rec, &len) < 0)
		return false;
	r = ckpt_store_load_extents(s, d->ino, &d->ext);
	if (r == 0)
		r = vw_parsrec_decode(rec, len, d->ext, d);
	if (r == 0)
		d->node.bytes = srcdata_bytes(d, len);
	free(rec);
	if (r < 0) {
		ckpt_extent_list_free(d->ext);
		d->ext = NULL;
		return false;
	}
	return true;
}

struct src_key {
	ckpt_store *s;
	uint64_t ino, size;
	int64_t mtime_ns;
};

static bool src_match(const struct vcache_node *n, const void *key)
{
	const struct srcdata *d = vcache_entry(n, const struct srcdata);
	const struct src_key *k = key;

	return n->s == k->s && d->ino == k->ino && d->size == k->size &&
	       d->mtime_ns == k->mtime_ns;
}

int vw_source_load(ckpt_store *s, uint64_t ino, uint64_t size, int64_t mtime_ns,
		   const char *name, struct srcdata **ret, char *err, size_t errlen)
{
	struct src_key key = { s, ino, size, mtime_ns };
	struct vcache_node *n = vcache_find(&src_cache, src_match, &key);
	struct srcdata *d;
	int r;

	if (n) {
		*ret = vcache_entry(n, struct srcdata);
		return 0;
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->ino = ino;
	d->size = size;
	d->mtime_ns = mtime_ns;
	if (load_parse_record(s, d)) {
		/* parsed on an earlier mount: no JSON to parse (records of older
		 * builds are in data order: rewrite them in name order) */
		if (sort_table(d->tensors, d->metas, d->ntensors) > 0)
			persist_parse(s, d);
	} else {
		r = parse_source(s, name, d, err, errlen);
		if (r < 0) {
			srcdata_destroy(&d->node);
			return r;
		}
		if (d->source) {
			table_from_parse(d);
			if (d->source)
				sort_table(d->tensors, d->metas, d->ntensors); /* else merged unsorted */
		}
		d = persist_compact(s, d);
	}
	vcache_insert(&src_cache, &d->node, s);
	*ret = d;
	return 0;
}

int ckpt_view_prefetch(ckpt_store *s, uint64_t ino)
{
	struct ckpt_inode in;
	struct srcdata *d = NULL;
	int r = ckpt_store_getattr(s, ino, &in);

	if (r < 0)
		return r;
	if (!S_ISREG(in.mode) || !(in.flags & CKPT_INODE_F_SAFETENSORS))
		return 0;
	r = vw_source_load(s, ino, in.size, in.mtime_ns, "(prefetch)", &d, NULL, 0);
	if (r == 0)
		vw_srcdata_unref(d); /* the cache keeps it */
	return r;
}
