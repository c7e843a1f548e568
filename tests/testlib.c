/* SPDX-License-Identifier: MIT */
/* testlib.c - the Check suites' shared set-up code (testlib.h). */
#include "testlib.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int tl_run(Suite *s)
{
	SRunner *sr = srunner_create(s);
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* ---- directories ------------------------------------------------------- */

void tl_dir_make(char *buf, size_t len, const char *parent, const char *prefix)
{
	int n = snprintf(buf, len, "%s/%sXXXXXX", parent, prefix);

	ck_assert_msg(n > 0 && (size_t)n < len, "directory name %s/%s too long", parent, prefix);
	ck_assert_msg(mkdtemp(buf) != NULL, "mkdtemp %s: %s", buf, strerror(errno));
}

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path);
}

void tl_dir_remove(char *dir)
{
	if (dir && dir[0])
		nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
	if (dir)
		dir[0] = '\0';
}

/* The base directory of the running test case: set by the unchecked
 * fixture in the parent, inherited by every forked test. */
static const char *base_prefix;
static char basedir[64];

static void base_setup(void)
{
	tl_dir_make(basedir, sizeof(basedir), "/tmp", base_prefix);
}

static void base_teardown(void)
{
	tl_dir_remove(basedir);
}

void tl_tcase_dirs(TCase *tc, const char *prefix)
{
	base_prefix = prefix;
	tcase_add_unchecked_fixture(tc, base_setup, base_teardown);
}

void tl_test_dir(char *buf, size_t len)
{
	ck_assert_msg(basedir[0], "tl_test_dir without tl_tcase_dirs");
	tl_dir_make(buf, len, basedir, "t-");
}

/* ---- stores and indexes ------------------------------------------------- */

ckpt_store *tl_store_open(const char *path, const struct ckpt_store_opts *o)
{
	ckpt_store *s = NULL;
	char err[512] = "";
	int r = ckpt_store_open(path, o, &s, err, sizeof(err));

	ck_assert_msg(r == 0, "open %s: %d %s", path, r, err);
	ck_assert_ptr_nonnull(s);
	return s;
}

ckpt_store *tl_store_create(const char *path)
{
	struct ckpt_store_opts o;

	ckpt_store_opts_init(&o);
	o.create = true;
	return tl_store_open(path, &o);
}

ckpt_engine *tl_engine_open(const char *name, const char *dir)
{
	struct ckpt_engine_opts o = { .create = true };
	ckpt_engine *e = NULL;
	char err[256] = "";
	int r = ckpt_engine_open(name, dir, &o, &e, err, sizeof(err));

	ck_assert_msg(r == 0, "engine %s at %s: %d %s", name ? name : "(default)", dir, r, err);
	ck_assert_ptr_nonnull(e);
	return e;
}

void tl_engine_put(ckpt_engine *e, const void *key, size_t klen, const void *val, size_t vlen)
{
	ckpt_txn *t;

	ck_assert_int_eq(ckpt_txn_begin(e, &t), 0);
	ck_assert_int_eq(ckpt_txn_put(t, key, klen, val, vlen), 0);
	ck_assert_int_eq(ckpt_txn_commit(t, false), 0);
}

uint64_t tl_mknode(ckpt_store *s, uint64_t parent, const char *name, uint32_t mode)
{
	struct ckpt_inode in;
	int r = ckpt_store_mknode(s, parent, name, mode, 0, 0, NULL, &in);

	ck_assert_msg(r == 0, "mknode %s: %d", name, r);
	return in.ino;
}

uint64_t tl_write_file(ckpt_store *s, ckpt_pool *pool, uint64_t dir, const char *name,
		       const uint8_t *buf, size_t len)
{
	struct ckpt_inode in;
	ckpt_writer *w = NULL;
	int r = ckpt_store_lookup(s, dir, name, &in);

	if (r == -ENOENT)
		r = ckpt_store_mknode(s, dir, name, S_IFREG | 0644, 0, 0, NULL, &in);
	ck_assert_msg(r == 0, "create %s: %d", name, r);
	ck_assert_int_eq(ckpt_writer_new(s, pool, in.ino, true, &w), 0);
	if (len > 13) {
		ck_assert_int_eq(ckpt_writer_write(w, buf, len - 13, 0), 0);
		ck_assert_int_eq(ckpt_writer_write(w, buf + len - 13, 13, len - 13), 0);
	} else {
		ck_assert_int_eq(ckpt_writer_write(w, buf, len, 0), 0);
	}
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ckpt_writer_free(w);
	ck_assert_int_eq(ckpt_store_flush(s), 0);
	return in.ino;
}

uint8_t *tl_read_file(ckpt_store *s, uint64_t ino, size_t *ret_len)
{
	struct ckpt_extent_list *l = NULL;
	uint8_t *buf;
	ssize_t n;

	ck_assert_int_eq(ckpt_store_load_extents(s, ino, &l), 0);
	buf = malloc(l->size ? l->size : 1);
	ck_assert_ptr_nonnull(buf);
	n = ckpt_store_read_extents(s, l, buf, l->size, 0);
	ck_assert_int_eq(n, (ssize_t)l->size);
	*ret_len = l->size;
	ckpt_extent_list_free(l);
	return buf;
}

struct ckpt_store_stats tl_flushed_stats(ckpt_store *s)
{
	struct ckpt_store_stats st;

	ck_assert_int_eq(ckpt_store_flush(s), 0);
	ck_assert_int_eq(ckpt_store_stats(s, &st), 0);
	return st;
}

/* ---- pseudo-random data ------------------------------------------------- */

uint64_t tl_splitmix64(uint64_t *state)
{
	uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));

	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

void tl_fill_random(uint8_t *p, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;

	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (uint8_t)(x >> 24);
	}
}

uint8_t *tl_random_buf(size_t n, uint64_t seed)
{
	uint8_t *p = malloc(n ? n : 1);

	ck_assert_ptr_nonnull(p);
	tl_fill_random(p, n, seed);
	return p;
}

ckpt_digest tl_digest(uint32_t k)
{
	ckpt_digest d;

	for (int i = 0; i < CKPT_DIGEST_LEN; i++)
		d.bytes[i] = (uint8_t)((k >> (8 * (i % 4))) ^ (uint32_t)(i * 37));
	return d;
}
