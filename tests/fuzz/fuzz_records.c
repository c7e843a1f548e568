/* SPDX-License-Identifier: MIT */
/*
 * fuzz_records.c - every decoder of a metadata record (meta/records.h and
 * the 'P' records of views/parsrec.h; docs/format.md section 5).
 *
 * Input: KIND VALUE.  KIND % 8 picks the decoder:
 *   0 inode ('I'), 1 dentry ('D'), 2 chunk ('C'), 3 extent list ('F'),
 *   4 persisted parse ('P'), 5 dentry key;
 * for 'P', VALUE is SIZE[8] RECORD: the file's extent list is zero runs
 * adding up to SIZE (at most 2^40), and with KIND's bit 0x80 the harness
 * writes the right fingerprint of those extents into RECORD, so that the
 * fuzzer gets past it.
 * What must hold: a value of the wrong length or version is refused with
 * -EIO (-EINVAL for 'P'); a decoded record encodes to a value that decodes
 * to the same record; a decoded extent list is consecutive extents adding up
 * to its size, and find, truncate and dup keep that; a decoded 'P' record is
 * one that a valid safetensors file of that size with valid sharding
 * metadata gives (the rules of metacheck.h and of safetensors.h), since
 * the views use it in place of the parse; a dentry key names one entry
 * (1..255 bytes, no '/' or NUL).
 */
#include "fuzz.h"
#include "metacheck.h"

#include <errno.h>

#include "meta/records.h"
#include "views/parsrec.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_quiet();
	return 0;
}

static bool inode_eq(const struct ckpt_inode *a, const struct ckpt_inode *b)
{
	return a->ino == b->ino && a->mode == b->mode && a->uid == b->uid && a->gid == b->gid &&
	       a->nlink == b->nlink && a->size == b->size && a->atime_ns == b->atime_ns &&
	       a->mtime_ns == b->mtime_ns && a->ctime_ns == b->ctime_ns &&
	       a->parent == b->parent && a->flags == b->flags && a->generation == b->generation;
}

static void fuzz_inode(const uint8_t *v, size_t len)
{
	struct ckpt_inode in, in2;
	uint8_t buf[CKPT_INODE_REC_LEN];
	int r = ckpt_inode_decode(42, v, len, &in);

	FUZZ_CHECK(r == 0 || r == -EIO, "inode: %d", r);
	FUZZ_CHECK(r < 0 || len == CKPT_INODE_REC_LEN, "inode of %zu bytes", len);
	if (r < 0)
		return;
	ckpt_inode_encode(&in, buf);
	FUZZ_CHECK(ckpt_inode_decode(42, buf, sizeof(buf), &in2) == 0 && inode_eq(&in, &in2),
		   "inode round trip");
}

static void fuzz_dentry(const uint8_t *v, size_t len)
{
	uint64_t ino, ino2;
	uint32_t mode, mode2;
	uint8_t buf[CKPT_DENTRY_REC_LEN];
	int r = ckpt_dentry_decode(v, len, &ino, &mode);

	FUZZ_CHECK(r == 0 || r == -EIO, "dentry: %d", r);
	if (r < 0)
		return;
	ckpt_dentry_encode(ino, mode, buf);
	FUZZ_CHECK(ckpt_dentry_decode(buf, sizeof(buf), &ino2, &mode2) == 0 && ino2 == ino &&
			   mode2 == mode,
		   "dentry round trip");
}

static void fuzz_chunk(const uint8_t *v, size_t len)
{
	struct ckpt_chunk_loc loc, loc2;
	uint64_t rc, rc2;
	uint8_t buf[CKPT_CHUNK_REC_LEN];
	int r = ckpt_chunk_rec_decode(v, len, &loc, &rc);

	FUZZ_CHECK(r == 0 || r == -EIO, "chunk: %d", r);
	if (r < 0)
		return;
	ckpt_chunk_rec_encode(&loc, rc, buf);
	FUZZ_CHECK(ckpt_chunk_rec_decode(buf, sizeof(buf), &loc2, &rc2) == 0 && rc == rc2 &&
			   loc.codec == loc2.codec && loc.flags == loc2.flags &&
			   loc.elem == loc2.elem && loc.stored_len == loc2.stored_len &&
			   loc.raw_len == loc2.raw_len &&
			   memcmp(loc.where, loc2.where, sizeof(loc.where)) == 0,
		   "chunk round trip");
}

static void check_extents(const struct ckpt_extent_list *l)
{
	uint64_t off = 0;

	for (size_t i = 0; i < l->n; i++) {
		FUZZ_CHECK(l->v[i].off == off && l->v[i].len > 0 && l->v[i].kind <= CKPT_EXT_ZERO,
			   "extent %zu", i);
		off += l->v[i].len;
	}
	FUZZ_CHECK(off == l->size, "extents add up to %llu, size %llu", (unsigned long long)off,
		   (unsigned long long)l->size);
}

static bool extents_eq(const struct ckpt_extent_list *a, const struct ckpt_extent_list *b)
{
	if (a->n != b->n || a->size != b->size)
		return false;
	for (size_t i = 0; i < a->n; i++)
		if (a->v[i].off != b->v[i].off || a->v[i].len != b->v[i].len ||
		    a->v[i].kind != b->v[i].kind ||
		    memcmp(&a->v[i].digest, &b->v[i].digest, sizeof(a->v[i].digest)) != 0)
			return false;
	return true;
}

static void fuzz_extents(const uint8_t *v, size_t len)
{
	struct ckpt_extent_list *l = NULL, *l2 = NULL, *dup = NULL;
	uint8_t *buf = NULL;
	size_t blen = 0;
	int r = ckpt_extent_list_decode(v, len, &l);

	FUZZ_CHECK(r == 0 || r == -EIO || r == -ENOMEM, "extents: %d", r);
	if (r < 0)
		return;
	check_extents(l);
	r = ckpt_extent_list_encode(l, &buf, &blen);
	if (r == 0) {
		FUZZ_CHECK(blen == len, "extents re-encoded to %zu bytes of %zu", blen, len);
		r = ckpt_extent_list_decode(buf, blen, &l2);
		FUZZ_CHECK(r == -ENOMEM || (r == 0 && extents_eq(l, l2)), "extents round trip");
	}
	dup = ckpt_extent_list_dup(l);
	if (dup) {
		FUZZ_CHECK(extents_eq(l, dup), "dup");
		/* every offset finds the extent that holds it */
		for (size_t i = 0; i < l->n; i++) {
			const struct ckpt_extent *e = &l->v[i];

			FUZZ_CHECK(ckpt_extent_list_find(l, e->off) == i &&
					   ckpt_extent_list_find(l, e->off + e->len - 1) == i,
				   "find in extent %zu", i);
		}
		FUZZ_CHECK(ckpt_extent_list_find(l, l->size) == l->n, "find past the end");
		/* truncate in the middle of the list (inside an extent when one is long) */
		if (l->size) {
			uint64_t cut = l->size / 2 + (l->size & 1);

			ckpt_extent_list_truncate(dup, cut);
			FUZZ_CHECK(dup->size == cut, "truncate to %llu", (unsigned long long)cut);
			check_extents(dup);
			FUZZ_CHECK(dup->n == 0 || dup->v[dup->n - 1].digest.bytes[0] ==
							  l->v[dup->n - 1].digest.bytes[0],
				   "truncate kept another extent");
		}
	}
	ckpt_extent_list_free(l);
	ckpt_extent_list_free(l2);
	ckpt_extent_list_free(dup);
	free(buf);
}

/* ---- 'P' records ---- */

static int tensor_cmp_data(const void *a, const void *b)
{
	const struct ckpt_st_tensor *const *x = a, *const *y = b;

	if ((*x)->begin != (*y)->begin)
		return (*x)->begin < (*y)->begin ? -1 : 1;
	if ((*x)->end != (*y)->end)
		return (*x)->end < (*y)->end ? -1 : 1;
	return strcmp((*x)->name, (*y)->name);
}

static int tensor_cmp_name(const void *a, const void *b)
{
	const struct ckpt_st_tensor *const *x = a, *const *y = b;

	return strcmp((*x)->name, (*y)->name);
}

static void meta_of(const struct smeta *m, struct ckpt_tensor_meta *tm)
{
	memset(tm, 0, sizeof(*tm));
	tm->ndim = m->ndim;
	tm->geom.box.ndim = m->ndim;
	for (unsigned i = 0; i < m->ndim && i < CKPT_MAX_DIMS; i++) {
		tm->global_shape[i] = m->gs[i];
		tm->geom.box.off[i] = m->off[i];
		tm->geom.box.shape[i] = m->shape[i];
	}
	tm->geom.flat = m->flat;
	tm->geom.flat_begin = m->flat ? m->flat_begin : 0;
	tm->geom.flat_end = m->flat ? m->flat_end : 0;
	tm->tp_dim = m->tp_dim;
	tm->has_pp = m->has_pp;
	tm->pp = m->pp;
}

/* What a valid source file of `size` bytes parses to: a header length in
 * range, a valid group, tensors with unique names, known dtypes of whole
 * bytes, that tile the data area up to the end of the file, each with a
 * valid geometry. */
static void check_parse(const struct srcdata *d, uint64_t size)
{
	const struct ckpt_st_tensor **ord;
	uint64_t end = 0;
	size_t glen;

	FUZZ_CHECK(d->data_start >= CKPT_ST_PREFIX_LEN + 2 &&
			   d->data_start <= CKPT_ST_PREFIX_LEN + CKPT_ST_MAX_HEADER,
		   "data_start %llu", (unsigned long long)d->data_start);
	if (!d->source) {
		FUZZ_CHECK(d->ntensors == 0, "tensors in a file that is not a source");
		return;
	}
	FUZZ_CHECK(d->group, "source without a group");
	glen = strlen(d->group);
	FUZZ_CHECK(glen > 0 && glen <= CKPT_SHARDMETA_GROUP_MAX && !strchr(d->group, '/') &&
			   d->group[0] != '.',
		   "group '%s'", d->group);
	FUZZ_CHECK(!d->has_nl || d->nl <= INT64_MAX, "num_layers %llu",
		   (unsigned long long)d->nl);
	ord = malloc((d->ntensors ? d->ntensors : 1) * sizeof(*ord));
	if (!ord)
		return;
	for (size_t k = 0; k < d->ntensors; k++) {
		const struct ckpt_st_tensor *t = &d->tensors[k];
		struct ckpt_tensor_meta tm;
		const char *why;
		uint64_t n = 1;
		unsigned bits = ckpt_dtype_bits(t->dtype);

		ord[k] = t;
		FUZZ_CHECK(bits && bits % 8 == 0, "tensor '%s': dtype %d", t->name, (int)t->dtype);
		FUZZ_CHECK(t->ndim <= CKPT_MAX_DIMS && d->metas[k].ndim <= CKPT_MAX_DIMS,
			   "tensor '%s': ndim", t->name);
		for (unsigned i = 0; i < t->ndim; i++)
			FUZZ_CHECK(t->shape[i] <= INT64_MAX &&
					   !__builtin_mul_overflow(n, t->shape[i], &n),
				   "tensor '%s': shape", t->name);
		FUZZ_CHECK(!__builtin_mul_overflow(n, (uint64_t)bits / 8, &n) &&
				   t->end >= t->begin && t->end - t->begin == n,
			   "tensor '%s': %llu bytes for data [%llu, %llu)", t->name,
			   (unsigned long long)n, (unsigned long long)t->begin,
			   (unsigned long long)t->end);
		meta_of(&d->metas[k], &tm);
		why = fuzz_meta_problem(t, &tm, d->has_nl, d->nl);
		FUZZ_CHECK(!why, "tensor '%s': %s", t->name, why);
	}
	qsort(ord, d->ntensors, sizeof(*ord), tensor_cmp_name);
	for (size_t k = 1; k < d->ntensors; k++)
		FUZZ_CHECK(strcmp(ord[k - 1]->name, ord[k]->name) != 0, "tensor '%s' twice",
			   ord[k]->name);
	qsort(ord, d->ntensors, sizeof(*ord), tensor_cmp_data);
	for (size_t k = 0; k < d->ntensors; k++) {
		FUZZ_CHECK(ord[k]->begin == end, "tensor '%s' begins at %llu, not %llu",
			   ord[k]->name, (unsigned long long)ord[k]->begin,
			   (unsigned long long)end);
		end = ord[k]->end;
	}
	FUZZ_CHECK(d->data_start + end == size, "data ends at %llu in a file of %llu bytes",
		   (unsigned long long)(d->data_start + end), (unsigned long long)size);
	free(ord);
}

static bool u64s_eq(const uint64_t *a, const uint64_t *b, unsigned n)
{
	return n == 0 || memcmp(a, b, n * sizeof(*a)) == 0;
}

static void check_same(const struct srcdata *a, const struct srcdata *b)
{
	FUZZ_CHECK(a->source == b->source && a->has_nl == b->has_nl && a->nl == b->nl &&
			   a->described == b->described && a->data_start == b->data_start &&
			   a->ntensors == b->ntensors && strcmp(a->group, b->group) == 0,
		   "'P' record round trip");
	for (size_t k = 0; k < a->ntensors; k++) {
		const struct ckpt_st_tensor *t = &a->tensors[k], *u = &b->tensors[k];
		const struct smeta *m = &a->metas[k], *n = &b->metas[k];

		FUZZ_CHECK(strcmp(t->name, u->name) == 0 && t->dtype == u->dtype &&
				   t->ndim == u->ndim && u64s_eq(t->shape, u->shape, t->ndim) &&
				   t->begin == u->begin && t->end == u->end && m->ndim == n->ndim &&
				   u64s_eq(m->gs, n->gs, m->ndim) && u64s_eq(m->off, n->off, m->ndim) &&
				   u64s_eq(m->shape, n->shape, m->ndim) && m->flat == n->flat &&
				   (!m->flat || (m->flat_begin == n->flat_begin &&
						 m->flat_end == n->flat_end)) &&
				   m->tp_dim == n->tp_dim && m->has_pp == n->has_pp &&
				   m->pp.kind == n->pp.kind && m->pp.layer == n->pp.layer,
			   "'P' record round trip of tensor %zu", k);
	}
}

static void srcdata_clear(struct srcdata *d)
{
	free(d->blob);
	free(d->tensors);
	free(d->metas);
	memset(d, 0, sizeof(*d));
}

static void fuzz_parsrec(const uint8_t *v, size_t len, bool fix)
{
	struct ckpt_extent_list *ext = ckpt_extent_list_new();
	struct srcdata d = { 0 }, d2 = { 0 };
	uint8_t *rec = NULL, *rec2 = NULL;
	size_t len2 = 0;
	uint64_t size;
	int r;

	if (!ext || len < 8)
		goto out;
	size = ckpt_get_le64(v) & ((1ull << 40) - 1);
	v += 8;
	len -= 8;
	for (uint64_t left = size; left;) {
		uint32_t n = left > UINT32_MAX ? UINT32_MAX : (uint32_t)left;

		if (ckpt_extent_list_append(ext, n, CKPT_EXT_ZERO, NULL) < 0)
			goto out;
		left -= n;
	}
	rec = malloc(len ? len : 1); /* exactly len bytes: ASan sees overreads */
	if (!rec)
		goto out;
	memcpy(rec, v, len);
	if (fix && len >= 24)
		ckpt_put_le64(rec + 8, vw_parsrec_fingerprint(ext, ckpt_get_le64(rec + 16)));
	r = vw_parsrec_decode(rec, len, ext, &d);
	FUZZ_CHECK(r == 0 || r == -EINVAL || r == -ESTALE || r == -ENOMEM, "decode: %d", r);
	if (r < 0) {
		FUZZ_CHECK(!d.blob && !d.tensors && !d.metas, "left allocated on error");
		goto out;
	}
	check_parse(&d, size);
	r = vw_parsrec_encode(&d, ext, &rec2, &len2);
	if (r == -ENOMEM)
		goto out;
	FUZZ_CHECK(r == 0, "encode of a decoded record: %d", r);
	r = vw_parsrec_decode(rec2, len2, ext, &d2);
	FUZZ_CHECK(r == 0 || r == -ENOMEM, "decode of a re-encoded record: %d", r);
	if (r == 0)
		check_same(&d, &d2);
out:
	srcdata_clear(&d);
	srcdata_clear(&d2);
	free(rec);
	free(rec2);
	ckpt_extent_list_free(ext);
}

static void fuzz_dentry_key(const uint8_t *k, size_t len)
{
	uint8_t key[CKPT_KEY_MAX];
	const char *name = NULL;
	size_t n = 0;
	uint64_t parent;
	int r = ckpt_key_dentry_decode(k, len, &parent, &name, &n);

	FUZZ_CHECK(r == 0 || r == -EIO, "dentry key: %d", r);
	if (r < 0)
		return;
	FUZZ_CHECK(n >= 1 && n <= CKPT_NAME_MAX && !memchr(name, '/', n) && !memchr(name, 0, n) &&
			   !(n == 1 && name[0] == '.') && !(n == 2 && memcmp(name, "..", 2) == 0),
		   "dentry key name of %zu bytes", n);
	FUZZ_CHECK(ckpt_key_dentry(key, parent, name, n) == len && memcmp(key, k, len) == 0,
		   "dentry key round trip");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *v;

	if (size < 1)
		return 0;
	/* the value in a buffer of its exact size */
	v = malloc(size - 1 ? size - 1 : 1);
	if (!v)
		return 0;
	memcpy(v, data + 1, size - 1);
	switch (data[0] & 7) {
	case 0:
		fuzz_inode(v, size - 1);
		break;
	case 1:
		fuzz_dentry(v, size - 1);
		break;
	case 2:
		fuzz_chunk(v, size - 1);
		break;
	case 3:
		fuzz_extents(v, size - 1);
		break;
	case 4:
		fuzz_parsrec(v, size - 1, data[0] & 0x80);
		break;
	case 5:
		fuzz_dentry_key(v, size - 1);
		break;
	default:
		break;
	}
	free(v);
	return 0;
}
