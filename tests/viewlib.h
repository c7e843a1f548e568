/* SPDX-License-Identifier: MIT */
/*
 * viewlib.h - the set-up code of the view suites (check_view.c,
 * check_vcheck.c): a fresh store per test, safetensors sources written
 * through the real write path, and view files read back and parsed.
 *
 * Every test of a case that uses setup/teardown as its checked fixture (and
 * tl_tcase_dirs) gets a store at spath under its own directory, st, and a
 * pool of 2 chunk workers, pool.  Safetensors bytes are built with
 * ckpt_st_serialize() plus tensor data; the "ckptfs" metadata JSON is
 * written by hand by the tests.  Helpers assert on failure (testlib.h).
 */
#ifndef CKPT_VIEWLIB_H
#define CKPT_VIEWLIB_H

#include <check.h>
#include <stdint.h>

#include "store/store.h"
#include "testlib.h"
#include "views/views.h"

extern char tdir[96];  /* the test's directory (in its case's base directory) */
extern char spath[128]; /* its store: tdir/store */
extern ckpt_store *st;
extern ckpt_pool *pool;

void setup(void);
void teardown(void);
/* The test cases of a view suite: named, with the fixtures above. */
TCase *view_tcase(Suite *s, const char *name);

/* ---- building sources ------------------------------------------------- */

struct tdef {
	const char *name;
	enum ckpt_dtype dt;
	unsigned ndim;
	uint64_t shape[4];
	const void *data; /* elems(shape) * bytes(dt) bytes */
};

uint64_t tdef_bytes(const struct tdef *t);
/* A new directory in parent; returns its inode. */
uint64_t mkdir_in(uint64_t parent, const char *name);
/* Write raw bytes as file dir/fname (created, or truncated if it exists),
 * commit and flush.  Returns the inode. */
uint64_t put_raw(uint64_t dir, const char *fname, const uint8_t *buf, size_t len);
/* Serialize a safetensors file (metadata "ckptfs" = ckptfs unless NULL)
 * and store it as dir/fname.  Returns the inode; asserts it is flagged as
 * safetensors. */
uint64_t put_st(uint64_t dir, const char *fname, const char *ckptfs,
		const struct tdef *t, size_t n);
/* Float tensor with values base, base + 1, ... (exact in F32). */
float *fgen(size_t n, float base);
/* Rows [r0, r1) x columns [c0, c1) of a row-major matrix with `cols`
 * columns, elem bytes per element, as a new buffer. */
uint8_t *sub2(const void *g, uint64_t cols, unsigned elem, uint64_t r0, uint64_t r1,
	      uint64_t c0, uint64_t c1);
/* The view of dir in layout tp{tp}_pp{pp} (asserts it builds). */
ckpt_view *build(uint64_t dir, unsigned tp, unsigned pp, const ckpt_tp_rules *rules);

/* ---- reading view files ----------------------------------------------- */

/* A view file read whole, and its header parsed. */
struct vbuf {
	uint8_t *b;
	uint64_t size;
	ckpt_st_header *h;
	uint64_t ds; /* data start: 8 + N */
};

void vbuf_free(struct vbuf *vb);
/* Open view file fname, read it whole in reads of `piece` bytes, check its
 * header and size, into *ret. */
void vread(ckpt_view *v, const char *fname, size_t piece, struct vbuf *ret);
/* Assert that tensor name of vb has dtype dt, shape[0..ndim) and bytes
 * data. */
void expect_tensor(const struct vbuf *vb, const char *name, enum ckpt_dtype dt,
		   unsigned ndim, const uint64_t *shape, const void *data);
/* The view file holds exactly the tensors names[0..n) in this order. */
void expect_names(const struct vbuf *vb, const char *const *names, size_t n);
/* The view's files, in order, are exactly names[0..n). */
void expect_files(const ckpt_view *v, const char *const *names, size_t n);
/* Try to open view file fname; returns the result, err gets the message. */
int try_open(ckpt_view *v, const char *fname, char *err, size_t errlen);

/* What ckpt_view_check() reported (the first 8 problems, and how many). */
struct reports {
	int n;
	char file[8][128];
	char why[8][512];
};


void report_cb(void *ud, const char *file, const char *why);
/* The group info of group name (asserts it is in the view). */
void group_info(const ckpt_view *v, const char *name, struct ckpt_view_group_info *ret);

#endif
