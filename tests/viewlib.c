/* SPDX-License-Identifier: MIT */
/*
 * viewlib.c - the set-up code of the view suites (see viewlib.h).
 */
#include "viewlib.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/util.h"

char tdir[96];
char spath[128];
ckpt_store *st;
ckpt_pool *pool;

void setup(void)
{
	struct ckpt_store_opts o;

	tl_test_dir(tdir, sizeof(tdir));
	snprintf(spath, sizeof(spath), "%s/store", tdir);
	ckpt_store_opts_init(&o);
	o.create = true;
	o.cache_size = 8u << 20;
	st = tl_store_open(spath, &o);
	ck_assert_int_eq(ckpt_pool_new(2, &pool), 0);
}

void teardown(void)
{
	ckpt_pool_free(pool);
	pool = NULL;
	if (st)
		ckpt_view_forget_store(st);
	ckpt_store_free(st);
	st = NULL;
	tl_dir_remove(tdir);
}

/* ---- building sources ------------------------------------------------- */

uint64_t tdef_bytes(const struct tdef *t)
{
	uint64_t n = ckpt_dtype_bits(t->dt);

	for (unsigned d = 0; d < t->ndim; d++)
		n *= t->shape[d];
	return n / 8;
}

uint64_t mkdir_in(uint64_t parent, const char *name)
{
	return tl_mknode(st, parent, name, S_IFDIR | 0755);
}

uint64_t put_raw(uint64_t dir, const char *fname, const uint8_t *buf, size_t len)
{
	return tl_write_file(st, pool, dir, fname, buf, len);
}

uint64_t put_st(uint64_t dir, const char *fname, const char *ckptfs,
		const struct tdef *t, size_t n)
{
	struct ckpt_st_tensor_spec specs[32];
	const char *keys[] = { "format", CKPT_SHARDMETA_KEY };
	const char *vals[] = { "pt", ckptfs };
	uint8_t *hdr = NULL, *buf;
	size_t hlen = 0, len;
	struct ckpt_inode in;
	uint64_t ino;

	ck_assert_uint_le(n, CKPT_ARRAY_SIZE(specs));
	for (size_t i = 0; i < n; i++) {
		specs[i].name = t[i].name;
		specs[i].dtype = t[i].dt;
		specs[i].ndim = t[i].ndim;
		specs[i].shape = t[i].shape;
	}
	ck_assert_int_eq(ckpt_st_serialize(specs, n, keys, vals, ckptfs ? 2 : 1, &hdr, &hlen), 0);
	len = hlen;
	for (size_t i = 0; i < n; i++)
		len += tdef_bytes(&t[i]);
	buf = malloc(len);
	ck_assert_ptr_nonnull(buf);
	memcpy(buf, hdr, hlen);
	len = hlen;
	for (size_t i = 0; i < n; i++) {
		memcpy(buf + len, t[i].data, tdef_bytes(&t[i]));
		len += tdef_bytes(&t[i]);
	}
	free(hdr);
	ino = put_raw(dir, fname, buf, len);
	free(buf);
	ck_assert_int_eq(ckpt_store_getattr(st, ino, &in), 0);
	ck_assert_msg(in.flags & CKPT_INODE_F_SAFETENSORS, "%s not flagged safetensors", fname);
	ck_assert_uint_eq(in.size, len);
	return ino;
}

float *fgen(size_t n, float base)
{
	float *p = malloc((n ? n : 1) * sizeof(*p));

	ck_assert_ptr_nonnull(p);
	for (size_t i = 0; i < n; i++)
		p[i] = base + (float)i;
	return p;
}

uint8_t *sub2(const void *g, uint64_t cols, unsigned elem, uint64_t r0, uint64_t r1,
	      uint64_t c0, uint64_t c1)
{
	const uint8_t *src = g;
	size_t row = (size_t)(c1 - c0) * elem;
	uint8_t *p = malloc((r1 - r0) * row + 1);

	ck_assert_ptr_nonnull(p);
	for (uint64_t r = r0; r < r1; r++)
		memcpy(p + (r - r0) * row, src + (r * cols + c0) * elem, row);
	return p;
}

ckpt_view *build(uint64_t dir, unsigned tp, unsigned pp, const ckpt_tp_rules *rules)
{
	struct ckpt_layout l = { tp, pp };
	ckpt_view *v = NULL;
	char err[512] = "";
	int r = ckpt_view_build(st, dir, &l, rules, &v, err, sizeof(err));

	ck_assert_msg(r == 0, "build tp%u_pp%u: %d (%s)", tp, pp, r, err);
	ck_assert_ptr_nonnull(v);
	return v;
}

/* ---- reading view files ----------------------------------------------- */

void vbuf_free(struct vbuf *vb)
{
	free(vb->b);
	ckpt_st_header_free(vb->h);
	memset(vb, 0, sizeof(*vb));
}

void vread(ckpt_view *v, const char *fname, size_t piece, struct vbuf *ret)
{
	int i = ckpt_view_find(v, fname);
	ckpt_vfile *f = NULL;
	char err[1024] = "";
	uint64_t n, done = 0;
	int r;

	ck_assert_msg(i >= 0, "view file %s not found", fname);
	r = ckpt_vfile_open(v, (size_t)i, &f, err, sizeof(err));
	ck_assert_msg(r == 0, "open %s: %d (%s)", fname, r, err);
	ret->size = ckpt_vfile_size(f);
	ck_assert_uint_eq(ret->size, ckpt_view_file_size(v, (size_t)i));
	ret->b = malloc(ret->size + 1);
	ck_assert_ptr_nonnull(ret->b);
	while (done < ret->size) {
		ssize_t got = ckpt_vfile_read(f, ret->b + done, piece, done);
		ck_assert_int_eq(got, (ssize_t)CKPT_MIN((uint64_t)piece, ret->size - done));
		done += (uint64_t)got;
	}
	ck_assert_int_eq(ckpt_vfile_read(f, ret->b, 16, ret->size), 0);
	ckpt_vfile_free(f);
	ck_assert_uint_ge(ret->size, 8);
	ck_assert_int_eq(ckpt_st_header_len(ret->b, &n), 0);
	ck_assert_uint_le(8 + n, ret->size);
	r = ckpt_st_parse(ret->b + 8, n, &ret->h, err, sizeof(err));
	ck_assert_msg(r == 0, "%s: header does not parse: %s", fname, err);
	ck_assert_int_eq(ckpt_st_check_file_size(ret->h, ret->size), 0);
	ret->ds = 8 + n;
}

void expect_tensor(const struct vbuf *vb, const char *name, enum ckpt_dtype dt,
		   unsigned ndim, const uint64_t *shape, const void *data)
{
	const struct ckpt_st_tensor *t = ckpt_st_tensor_find(vb->h, name);
	uint64_t n = ckpt_dtype_bits(dt) / 8;

	ck_assert_msg(t != NULL, "tensor %s missing", name);
	ck_assert_int_eq(t->dtype, dt);
	ck_assert_uint_eq(t->ndim, ndim);
	for (unsigned d = 0; d < ndim; d++) {
		ck_assert_uint_eq(t->shape[d], shape[d]);
		n *= shape[d];
	}
	ck_assert_uint_eq(t->end - t->begin, n);
	ck_assert_msg(memcmp(vb->b + vb->ds + t->begin, data, n) == 0, "bytes of %s differ",
		      name);
}

void expect_names(const struct vbuf *vb, const char *const *names, size_t n)
{
	ck_assert_uint_eq(ckpt_st_tensor_count(vb->h), n);
	for (size_t i = 0; i < n; i++)
		ck_assert_str_eq(ckpt_st_tensor_at(vb->h, i)->name, names[i]);
}

void expect_files(const ckpt_view *v, const char *const *names, size_t n)
{
	ck_assert_uint_eq(ckpt_view_nfiles(v), n);
	for (size_t i = 0; i < n; i++) {
		ck_assert_str_eq(ckpt_view_file_name(v, i), names[i]);
		ck_assert_int_eq(ckpt_view_find(v, names[i]), (int)i);
	}
}

int try_open(ckpt_view *v, const char *fname, char *err, size_t errlen)
{
	int i = ckpt_view_find(v, fname);
	ckpt_vfile *f = NULL;
	int r;

	ck_assert_msg(i >= 0, "view file %s not found", fname);
	err[0] = '\0';
	r = ckpt_vfile_open(v, (size_t)i, &f, err, errlen);
	if (r == 0) {
		ck_assert_ptr_nonnull(f);
		ckpt_vfile_free(f);
	}
	return r;
}

void report_cb(void *ud, const char *file, const char *why)
{
	struct reports *rp = ud;

	if (rp->n < 8) {
		snprintf(rp->file[rp->n], sizeof(rp->file[0]), "%s", file);
		snprintf(rp->why[rp->n], sizeof(rp->why[0]), "%s", why);
	}
	rp->n++;
}

void group_info(const ckpt_view *v, const char *name, struct ckpt_view_group_info *ret)
{
	for (size_t i = 0; i < ckpt_view_ngroups(v); i++) {
		ckpt_view_group_info(v, i, ret);
		if (!strcmp(ret->name, name))
			return;
	}
	ck_abort_msg("group %s not in the view", name);
}

TCase *view_tcase(Suite *s, const char *name)
{
	TCase *tc = tcase_create(name);

	tl_tcase_dirs(tc, "check_view-");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);
	return tc;
}
