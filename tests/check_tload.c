/* check_tload.c: the loader of libckptfs (ckptfs_loader_*, ckptfs_load).
 *
 * Every test writes its own safetensors files with a small writer here (jansson for the
 * header and the ckptfs metadata string), independent of the library's saver, and checks the
 * loaded bytes against a reference computed element by element from the global tensor. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trainer/ckptfs.h"
#include "trainer/load.h"

#define MAXD CKPTFS_MAX_DIMS

/* Weak: the suite also links against a library whose save half (and so this function) is
 * not built yet; then there is no GPU either. */
extern int ckptfs_cuda_available(void) __attribute__((weak));

static int cuda_available(void)
{
	return ckptfs_cuda_available ? ckptfs_cuda_available() : 0;
}

/* ---- scratch directories ------------------------------------------------------------------ */

static char base_dir[256];

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(p);
}

static void rm_tree(const char *dir)
{
	nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static void dirs_setup(void)
{
	snprintf(base_dir, sizeof(base_dir), "/tmp/check_tload_XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(base_dir));
}

static void dirs_teardown(void)
{
	rm_tree(base_dir);
}

/* A fresh directory base_dir/name. */
static const char *mkdir_t(const char *name)
{
	static char buf[8][512];
	static int k;
	char *p = buf[k++ % 8];

	snprintf(p, 512, "%s/%s", base_dir, name);
	rm_tree(p);
	ck_assert_int_eq(mkdir(p, 0755), 0);
	return p;
}

/* ---- deterministic data ------------------------------------------------------------------- */

static uint64_t rng_state = 88172645463325252ull;

static uint64_t rnd(void)
{
	uint64_t x = rng_state;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return rng_state = x;
}

static uint64_t rndn(uint64_t n)
{
	return n ? rnd() % n : 0;
}

/* A global tensor with random bytes. */
struct gt {
	const char *name, *dtype;
	unsigned eb;
	int nd;
	uint64_t shape[MAXD];
	uint8_t *data;
	uint64_t elems;
};

static void gt_init(struct gt *g, const char *name, const char *dtype, unsigned eb, int nd,
		    const uint64_t *shape)
{
	g->name = name;
	g->dtype = dtype;
	g->eb = eb;
	g->nd = nd;
	g->elems = 1;
	for (int k = 0; k < nd; k++) {
		g->shape[k] = shape[k];
		g->elems *= shape[k];
	}
	g->data = malloc(g->elems * eb + 1);
	ck_assert_ptr_nonnull(g->data);
	for (uint64_t i = 0; i < g->elems * eb; i++)
		g->data[i] = (uint8_t)rnd();
}

/* Reference: element f of the flattening of box (off, sh) of g, its global linear index. */
static uint64_t ref_lin(const struct gt *g, const uint64_t *off, const uint64_t *sh, uint64_t f)
{
	uint64_t lin = 0, idx[MAXD];

	for (int k = g->nd; k-- > 0;) {
		idx[k] = off[k] + f % sh[k];
		f /= sh[k];
	}
	for (int k = 0; k < g->nd; k++)
		lin = lin * g->shape[k] + idx[k];
	return lin;
}

/* Elements [a, b) of the flattening of box (off, sh) into out. */
static void ref_flat(const struct gt *g, const uint64_t *off, const uint64_t *sh, uint64_t a,
		     uint64_t b, uint8_t *out)
{
	for (uint64_t f = a; f < b; f++)
		memcpy(out + (f - a) * g->eb, g->data + ref_lin(g, off, sh, f) * g->eb, g->eb);
}

static uint64_t box_elems(int nd, const uint64_t *sh)
{
	uint64_t n = 1;

	for (int k = 0; k < nd; k++)
		n *= sh[k];
	return n;
}

/* ---- a safetensors writer ----------------------------------------------------------------- */

/* Strings from json_dumps() go back through jansson's allocator (the library installs its
 * own). */
static void jfree(void *p)
{
	json_malloc_t m;
	json_free_t f;

	json_get_alloc_funcs(&m, &f);
	f(p);
}

struct ftensor {
	char name[128];
	const char *dtype;
	int nd;
	uint64_t shape[MAXD];
	uint8_t *data;
	uint64_t nbytes;
	json_t *entry; /* ckptfs entry or NULL (whole) */
};

struct fb {
	int n;
	struct ftensor t[64];
};

static json_t *u64s(int n, const uint64_t *v)
{
	json_t *a = json_array();

	for (int k = 0; k < n; k++)
		json_array_append_new(a, json_integer((json_int_t)v[k]));
	return a;
}

/* A piece of g: the box (off, sh), or with flat the elements [a, b) of its flattening. */
static void fb_piece(struct fb *b, const struct gt *g, const char *name, const uint64_t *off,
		     const uint64_t *sh, int flat, uint64_t a, uint64_t e)
{
	struct ftensor *t = &b->t[b->n++];
	uint64_t n;

	ck_assert_int_le(b->n, 64);
	snprintf(t->name, sizeof(t->name), "%s", name ? name : g->name);
	t->dtype = g->dtype;
	if (!flat) {
		a = 0;
		e = box_elems(g->nd, sh);
	}
	n = e - a;
	t->nbytes = n * g->eb;
	t->data = malloc(t->nbytes + 1);
	ref_flat(g, off, sh, a, e, t->data);
	t->entry = json_object();
	json_object_set_new(t->entry, "global_shape", u64s(g->nd, g->shape));
	json_object_set_new(t->entry, "offsets", u64s(g->nd, off));
	if (flat) {
		t->nd = 1;
		t->shape[0] = n;
		json_object_set_new(t->entry, "box_shape", u64s(g->nd, sh));
		json_object_set_new(t->entry, "flat_range", json_pack("[II]", (json_int_t)a,
								      (json_int_t)e));
	} else {
		t->nd = g->nd;
		memcpy(t->shape, sh, sizeof(uint64_t) * (size_t)g->nd);
	}
}

static void fb_box(struct fb *b, const struct gt *g, const uint64_t *off, const uint64_t *sh)
{
	fb_piece(b, g, NULL, off, sh, 0, 0, 0);
}

/* The whole tensor, without an entry. */
static void fb_whole(struct fb *b, const struct gt *g)
{
	uint64_t z[MAXD] = {0};

	fb_piece(b, g, NULL, z, g->shape, 0, 0, 0);
	json_decref(b->t[b->n - 1].entry);
	b->t[b->n - 1].entry = NULL;
}

/* Writes the file; meta: 0 none, 1 ckptfs metadata of group (NULL: default), or raw a string
 * used as the ckptfs value verbatim.  Frees the builder's contents. */
static void fb_write_raw(struct fb *b, const char *dir, const char *fname, int meta,
			 const char *group, const char *raw)
{
	json_t *h = json_object(), *m, *tens;
	char path[1024], *js, *ms;
	uint64_t off = 0, n, pad;
	FILE *f;

	if (meta || raw) {
		m = json_object();
		tens = json_object();
		for (int i = 0; i < b->n; i++)
			if (b->t[i].entry)
				json_object_set(tens, b->t[i].name, b->t[i].entry);
		json_object_set_new(m, "version", json_integer(1));
		if (group)
			json_object_set_new(m, "group", json_string(group));
		json_object_set_new(m, "tensors", tens);
		ms = json_dumps(m, JSON_COMPACT);
		json_decref(m);
		json_object_set_new(h, "__metadata__",
				    json_pack("{ss}", "ckptfs", raw ? raw : ms));
		jfree(ms);
	}
	for (int i = 0; i < b->n; i++) {
		struct ftensor *t = &b->t[i];

		json_t *e = json_object();

		json_object_set_new(e, "dtype", json_string(t->dtype));
		json_object_set_new(e, "shape", u64s(t->nd, t->shape));
		json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)off,
								 (json_int_t)(off + t->nbytes)));
		json_object_set_new(h, t->name, e);
		off += t->nbytes;
	}
	js = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
	ck_assert_ptr_nonnull(js);
	json_decref(h);
	n = strlen(js);
	pad = (8 - (8 + n) % 8) % 8;
	snprintf(path, sizeof(path), "%s/%s", dir, fname);
	f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	{
		uint8_t pre[8];
		uint64_t nn = n + pad;

		for (int k = 0; k < 8; k++)
			pre[k] = (uint8_t)(nn >> (8 * k));
		fwrite(pre, 1, 8, f);
		fwrite(js, 1, n, f);
		for (uint64_t k = 0; k < pad; k++)
			fputc(' ', f);
	}
	for (int i = 0; i < b->n; i++) {
		fwrite(b->t[i].data, 1, b->t[i].nbytes, f);
		free(b->t[i].data);
		json_decref(b->t[i].entry);
	}
	ck_assert_int_eq(fclose(f), 0);
	jfree(js);
	b->n = 0;
}

static void fb_write(struct fb *b, const char *dir, const char *fname, int meta)
{
	fb_write_raw(b, dir, fname, meta, NULL, NULL);
}

/* ---- loading helpers ---------------------------------------------------------------------- */

static struct ckptfs_loader *open_ok(const char *dir, int threads)
{
	struct ckptfs_loader_opts o;
	struct ckptfs_loader *l = NULL;
	char msg[1024];
	int rc;

	ckptfs_loader_opts_init(&o);
	o.io_threads = threads;
	rc = ckptfs_loader_open(dir, &o, &l);
	ckptfs_loader_error(NULL, msg, sizeof(msg));
	ck_assert_msg(rc == 0, "open %s: %d %s", dir, rc, msg);
	return l;
}

static int open_fail(const char *dir, int require, char *msg, size_t len)
{
	struct ckptfs_loader_opts o;
	struct ckptfs_loader *l = NULL;
	int rc;

	ckptfs_loader_opts_init(&o);
	o.require_complete = require;
	rc = ckptfs_loader_open(dir, &o, &l);
	ck_assert_ptr_null(l);
	ck_assert_int_eq(ckptfs_loader_error(NULL, msg, len), rc);
	return rc;
}

static struct ckptfs_load_req req_box(const struct gt *g, const char *group, const int64_t *off,
				      const int64_t *sh, void *dst)
{
	struct ckptfs_load_req q;

	memset(&q, 0, sizeof(q));
	q.group = group;
	q.name = g->name;
	q.dtype = g->dtype;
	q.dst = dst;
	q.device = -1;
	q.ndim = g->nd;
	q.shape = sh;
	q.offsets = off;
	return q;
}

/* Loads box (off, sh) of g and compares with the reference. */
static void check_box(struct ckptfs_loader *l, const struct gt *g, const uint64_t *off,
		      const uint64_t *sh)
{
	int64_t o[MAXD], s[MAXD];
	uint64_t n = box_elems(g->nd, sh);
	uint8_t *got = malloc(n * g->eb + 1), *want = malloc(n * g->eb + 1);
	struct ckptfs_load_req q;
	char msg[1024];
	int rc;

	for (int k = 0; k < g->nd; k++) {
		o[k] = (int64_t)off[k];
		s[k] = (int64_t)sh[k];
	}
	memset(got, 0xEE, n * g->eb);
	q = req_box(g, NULL, o, s, got);
	rc = ckptfs_load(l, &q, 1);
	ckptfs_loader_error(l, msg, sizeof(msg));
	ck_assert_msg(rc == 0, "load %s: %d %s", g->name, rc, msg);
	ref_flat(g, off, sh, 0, n, want);
	ck_assert_msg(memcmp(got, want, n * g->eb) == 0, "%s: bytes differ", g->name);
	free(got);
	free(want);
}

static void check_whole(struct ckptfs_loader *l, const struct gt *g)
{
	uint64_t z[MAXD] = {0};

	check_box(l, g, z, g->shape);
}

/* Loads elements [a, b) of box (off, sh) of g and compares. */
static void check_flat(struct ckptfs_loader *l, const struct gt *g, const uint64_t *off,
		       const uint64_t *sh, uint64_t a, uint64_t b)
{
	int64_t o[MAXD], s[MAXD];
	uint8_t *got = malloc((b - a) * g->eb + 1), *want = malloc((b - a) * g->eb + 1);
	struct ckptfs_load_req q;
	char msg[1024];
	int rc;

	for (int k = 0; k < g->nd; k++) {
		o[k] = (int64_t)off[k];
		s[k] = (int64_t)sh[k];
	}
	q = req_box(g, NULL, o, NULL, got);
	q.flat = 1;
	q.box_shape = s;
	q.flat_start = (int64_t)a;
	q.flat_end = (int64_t)b;
	rc = ckptfs_load(l, &q, 1);
	ckptfs_loader_error(l, msg, sizeof(msg));
	ck_assert_msg(rc == 0, "load flat %s: %d %s", g->name, rc, msg);
	ref_flat(g, off, sh, a, b, want);
	ck_assert_msg(memcmp(got, want, (b - a) * g->eb) == 0, "%s: flat bytes differ", g->name);
	free(got);
	free(want);
}

/* torch.chunk bounds of part t of size s cut in p */
static void chunk_bounds(uint64_t s, uint64_t p, uint64_t t, uint64_t *b, uint64_t *e)
{
	uint64_t c = (s + p - 1) / p;

	*b = t * c < s ? t * c : s;
	*e = (t + 1) * c < s ? (t + 1) * c : s;
}

/* Writes g split in p parts along dim d, one file per part (prefix_rankN.safetensors). */
static void write_tp(const char *dir, const char *prefix, const struct gt *g, int d, uint64_t p)
{
	for (uint64_t t = 0; t < p; t++) {
		struct fb b = {0};
		uint64_t off[MAXD] = {0}, sh[MAXD], s, e;
		char fn[128];

		memcpy(sh, g->shape, sizeof(sh));
		chunk_bounds(g->shape[d], p, t, &s, &e);
		off[d] = s;
		sh[d] = e - s;
		fb_box(&b, g, off, sh);
		snprintf(fn, sizeof(fn), "%s_rank%02llu.safetensors", prefix, (unsigned long long)t);
		fb_write(&b, dir, fn, 1);
	}
}

/* Loads every TP part t of p along dim d and compares. */
static void check_tp_parts(struct ckptfs_loader *l, const struct gt *g, int d, uint64_t p)
{
	for (uint64_t t = 0; t < p; t++) {
		uint64_t off[MAXD] = {0}, sh[MAXD], s, e;

		memcpy(sh, g->shape, sizeof(sh));
		chunk_bounds(g->shape[d], p, t, &s, &e);
		off[d] = s;
		sh[d] = e - s;
		check_box(l, g, off, sh);
	}
}

/* ---- tests -------------------------------------------------------------------------------- */

START_TEST(test_version)
{
	ck_assert_int_eq(ckptfs_api_version(), CKPTFS_API_VERSION);
}
END_TEST

/* Plain safetensors files: every tensor whole; index, info and find. */
START_TEST(test_whole_plain)
{
	const char *dir = mkdir_t("plain");
	struct gt a, b, c;
	struct fb f = {0};
	struct ckptfs_loader *l;
	struct ckptfs_tensor_info info;
	uint64_t sa[2] = {5, 7}, sb[1] = {13}, off[2] = {1, 2}, sh[2] = {3, 4};

	gt_init(&a, "w", "F32", 4, 2, sa);
	gt_init(&b, "bias", "BF16", 2, 1, sb);
	gt_init(&c, "scalar", "I64", 8, 0, NULL);
	fb_whole(&f, &a);
	fb_whole(&f, &b);
	fb_write(&f, dir, "a.safetensors", 0);
	fb_whole(&f, &c);
	fb_write(&f, dir, "b.safetensors", 0);
	/* not pieces: other suffixes, hidden temporaries */
	fb_whole(&f, &c);
	fb_write(&f, dir, ".tmp.safetensors", 0);
	close(open(strcat(strcpy((char[600]){0}, dir), "/notes.txt"), O_CREAT | O_WRONLY, 0644));

	l = open_ok(dir, 2);
	ck_assert_uint_eq(ckptfs_loader_count(l), 3);
	ck_assert_int_eq(ckptfs_loader_info(l, 0, &info), 0);
	ck_assert_str_eq(info.group, "model");
	ck_assert_str_eq(info.name, "bias");
	ck_assert_str_eq(info.dtype, "BF16");
	ck_assert_int_eq(info.ndim, 1);
	ck_assert_int_eq(info.shape[0], 13);
	ck_assert_int_eq(info.tp_dim, CKPTFS_TP_DIM_UNSET);
	ck_assert_int_eq(info.pp, CKPTFS_PP_UNSET);
	ck_assert_int_eq(ckptfs_loader_find(l, NULL, "w"), 2);
	ck_assert_int_eq(ckptfs_loader_find(l, "model", "scalar"), 1);
	ck_assert_int_eq(ckptfs_loader_find(l, "optim", "w"), -ENOENT);
	ck_assert_int_eq(ckptfs_loader_info(l, 3, &info), -ENOENT);
	check_whole(l, &a);
	check_whole(l, &b);
	check_whole(l, &c);
	check_box(l, &a, off, sh);
	check_flat(l, &a, off, sh, 3, 11);
	check_flat(l, &a, (uint64_t[2]){0, 0}, sa, 0, 35);
	{
		/* all three in one call */
		uint8_t da[140], db[26], dc[8];
		struct ckptfs_load_req q[3] = {req_box(&a, NULL, NULL, NULL, da),
					       req_box(&b, "model", NULL, NULL, db),
					       req_box(&c, NULL, NULL, NULL, dc)};

		ck_assert_int_eq(ckptfs_load(l, q, 3), 0);
		ck_assert_mem_eq(da, a.data, 140);
		ck_assert_mem_eq(db, b.data, 26);
		ck_assert_mem_eq(dc, c.data, 8);
	}
	ckptfs_loader_free(l);
	free(a.data);
	free(b.data);
	free(c.data);
}
END_TEST

/* TP shards along dim 0 and dim 1 loaded whole, as other TP splits (uneven, empty parts) and
 * as sub-boxes. */
START_TEST(test_tp_reshard)
{
	const char *dir = mkdir_t("tp");
	struct gt q, o;
	struct ckptfs_loader *l;
	struct ckptfs_tensor_info info;
	uint64_t sq[2] = {10, 6}, so[2] = {6, 9};

	gt_init(&q, "layers.0.q_proj.weight", "BF16", 2, 2, sq);
	gt_init(&o, "layers.0.o_proj.weight", "F32", 4, 2, so);
	write_tp(dir, "q", &q, 0, 4); /* rows 3,3,3,1 */
	write_tp(dir, "o", &o, 1, 4); /* cols 3,3,3,0: an empty last part */
	l = open_ok(dir, 4);
	ck_assert_uint_eq(ckptfs_loader_count(l), 2);
	ck_assert_int_ge(ckptfs_loader_find(l, NULL, q.name), 0);
	ck_assert_int_eq(ckptfs_loader_info(l, (size_t)ckptfs_loader_find(l, NULL, q.name),
					    &info), 0);
	ck_assert_int_eq(info.shape[0], 10);
	ck_assert_int_eq(info.shape[1], 6);
	check_whole(l, &q);
	check_whole(l, &o);
	for (uint64_t p = 1; p <= 7; p++) {
		check_tp_parts(l, &q, 0, p);
		check_tp_parts(l, &q, 1, p);
		check_tp_parts(l, &o, 0, p);
		check_tp_parts(l, &o, 1, p);
	}
	check_box(l, &o, (uint64_t[2]){2, 2}, (uint64_t[2]){3, 5});
	check_box(l, &o, (uint64_t[2]){6, 9}, (uint64_t[2]){0, 0});
	check_flat(l, &q, (uint64_t[2]){0, 0}, sq, 5, 59);
	check_flat(l, &o, (uint64_t[2]){1, 2}, (uint64_t[2]){4, 7}, 3, 27);
	ckptfs_loader_free(l);
	free(q.data);
	free(o.data);
}
END_TEST

/* A 3-D tensor in a 2x3 grid of pieces loaded as assorted 3-D boxes. */
START_TEST(test_3d_boxes)
{
	const char *dir = mkdir_t("3d");
	struct gt g;
	struct ckptfs_loader *l;
	uint64_t s[3] = {5, 7, 4};

	gt_init(&g, "t3", "F16", 2, 3, s);
	for (uint64_t i = 0; i < 2; i++)
		for (uint64_t j = 0; j < 3; j++) {
			uint64_t off[3] = {0, 0, 0}, sh[3] = {5, 7, 4}, b, e;
			struct fb f = {0};
			char fn[64];

			chunk_bounds(5, 2, i, &b, &e);
			off[0] = b;
			sh[0] = e - b;
			chunk_bounds(7, 3, j, &b, &e);
			off[1] = b;
			sh[1] = e - b;
			fb_box(&f, &g, off, sh);
			snprintf(fn, sizeof(fn), "p%llu%llu.safetensors", (unsigned long long)i,
				 (unsigned long long)j);
			fb_write(&f, dir, fn, 1);
		}
	l = open_ok(dir, 3);
	check_whole(&*l, &g);
	for (int r = 0; r < 200; r++) {
		uint64_t off[3], sh[3];

		for (int k = 0; k < 3; k++) {
			off[k] = rndn(s[k] + 1);
			sh[k] = rndn(s[k] - off[k] + 1);
		}
		check_box(l, &g, off, sh);
		if (box_elems(3, sh)) {
			uint64_t n = box_elems(3, sh), a = rndn(n + 1), b = a + rndn(n - a + 1);

			check_flat(l, &g, off, sh, a, b);
		}
	}
	ckptfs_loader_free(l);
	free(g.data);
}
END_TEST

/* FSDP-style flat shards (uneven, one empty) loaded as boxes and flat ranges; box shards
 * loaded as flat ranges (FSDP1 targets). */
START_TEST(test_flat_sources)
{
	const char *dir = mkdir_t("flat");
	struct gt g, h;
	struct ckptfs_loader *l;
	uint64_t s[2] = {9, 11}, cut[6] = {0, 17, 17, 40, 98, 99}, z[2] = {0, 0};
	uint64_t hs[3] = {4, 3, 5};

	gt_init(&g, "fsdp.w", "F32", 4, 2, s);
	for (int i = 0; i < 5; i++) {
		struct fb f = {0};
		char fn[64];

		fb_piece(&f, &g, NULL, z, s, 1, cut[i], cut[i + 1]);
		snprintf(fn, sizeof(fn), "fsdp_%d.safetensors", i);
		fb_write(&f, dir, fn, 1);
	}
	/* h: rows 0-1 as a flat range of the box [2,3,5] at 0 cut in two, rows 2-3 a box */
	gt_init(&h, "mix", "I16", 2, 3, hs);
	{
		struct fb f = {0};

		fb_piece(&f, &h, NULL, (uint64_t[3]){0, 0, 0}, (uint64_t[3]){2, 3, 5}, 1, 0, 13);
		fb_write(&f, dir, "mix_a.safetensors", 1);
		fb_piece(&f, &h, NULL, (uint64_t[3]){0, 0, 0}, (uint64_t[3]){2, 3, 5}, 1, 13, 30);
		fb_write(&f, dir, "mix_b.safetensors", 1);
		fb_box(&f, &h, (uint64_t[3]){2, 0, 0}, (uint64_t[3]){2, 3, 5});
		fb_write(&f, dir, "mix_c.safetensors", 1);
	}
	l = open_ok(dir, 2);
	check_whole(l, &g);
	check_whole(l, &h);
	for (uint64_t p = 1; p <= 5; p++) {
		check_tp_parts(l, &g, 0, p);
		check_tp_parts(l, &g, 1, p);
		check_tp_parts(l, &h, 1, p);
		check_tp_parts(l, &h, 2, p);
	}
	/* FSDP1-style targets: flat ranges of the whole flattening, any cut */
	for (int r = 0; r < 100; r++) {
		uint64_t a = rndn(100), b = a + rndn(100 - a);
		uint64_t a2 = rndn(61), b2 = a2 + rndn(61 - a2);

		check_flat(l, &g, z, s, a, b);
		check_flat(l, &h, (uint64_t[3]){0, 0, 0}, hs, a2, b2);
		check_flat(l, &h, (uint64_t[3]){1, 1, 1}, (uint64_t[3]){3, 2, 3}, a2 % 18, 18);
	}
	ckptfs_loader_free(l);
	free(g.data);
	free(h.data);
}
END_TEST

/* Replicas: any one suffices; overlapping pieces of different geometry; groups apart. */
START_TEST(test_replicas_groups)
{
	const char *dir = mkdir_t("rep");
	struct gt g, w2;
	struct ckptfs_loader *l;
	uint64_t s[2] = {8, 4};
	char path[1024];

	gt_init(&g, "w", "F64", 8, 2, s);
	write_tp(dir, "dp0", &g, 0, 2);
	write_tp(dir, "dp1", &g, 0, 2);
	{
		/* an overlapping piece of another geometry, and the optimizer group */
		struct fb f = {0};

		fb_box(&f, &g, (uint64_t[2]){2, 1}, (uint64_t[2]){5, 3});
		fb_write(&f, dir, "dp2_rank00.safetensors", 1);
		gt_init(&w2, "w", "F32", 4, 1, (uint64_t[1]){3});
		fb_whole(&f, &w2);
		fb_write_raw(&f, dir, "optim_rank00.safetensors", 1, "optim", NULL);
	}
	l = open_ok(dir, 4);
	ck_assert_uint_eq(ckptfs_loader_count(l), 2);
	ck_assert_int_eq(ckptfs_loader_find(l, "optim", "w"), 1);
	check_whole(l, &g);
	check_tp_parts(l, &g, 0, 3);
	check_tp_parts(l, &g, 1, 3);
	{
		float d[3];
		struct ckptfs_load_req q = req_box(&w2, "optim", NULL, NULL, d);

		ck_assert_int_eq(ckptfs_load(l, &q, 1), 0);
		ck_assert_mem_eq(d, w2.data, 12);
	}
	/* each byte read once although three pieces hold some of it */
	{
		struct ckptfs__load_stats st;

		ck_assert_int_eq(ckptfs__loader_stats(l, &st), 0);
		ck_assert_uint_eq(st.bytes_read - st.gap_bytes, st.bytes_needed);
	}
	ckptfs_loader_free(l);
	/* without the first replica's files, the second ones serve */
	snprintf(path, sizeof(path), "%s/dp0_rank00.safetensors", dir);
	ck_assert_int_eq(unlink(path), 0);
	snprintf(path, sizeof(path), "%s/dp1_rank01.safetensors", dir);
	ck_assert_int_eq(unlink(path), 0);
	l = open_ok(dir, 1);
	check_whole(l, &g);
	ckptfs_loader_free(l);
	free(g.data);
	free(w2.data);
}
END_TEST

/* A piece missing: the load fails naming the tensor and the first uncovered index; the parts
 * that are stored still load. */
START_TEST(test_missing_piece)
{
	const char *dir = mkdir_t("miss");
	struct gt g;
	struct ckptfs_loader *l;
	uint64_t s[2] = {6, 4};
	char path[1024], msg[1024];
	uint8_t buf[6 * 4 * 4];
	struct ckptfs_load_req q;
	int64_t off[2] = {1, 1}, sh[2] = {4, 2};

	gt_init(&g, "lm_head.weight", "F32", 4, 2, s);
	write_tp(dir, "r", &g, 0, 3); /* rows [0,2) [2,4) [4,6) */
	snprintf(path, sizeof(path), "%s/r_rank01.safetensors", dir);
	ck_assert_int_eq(unlink(path), 0);
	l = open_ok(dir, 2);
	check_box(l, &g, (uint64_t[2]){0, 0}, (uint64_t[2]){2, 4});
	check_box(l, &g, (uint64_t[2]){4, 0}, (uint64_t[2]){2, 4});
	q = req_box(&g, NULL, NULL, NULL, buf);
	ck_assert_int_eq(ckptfs_load(l, &q, 1), -ENODATA);
	ck_assert_int_eq(ckptfs_loader_error(l, msg, sizeof(msg)), -ENODATA);
	ck_assert_msg(strstr(msg, "group 'model', tensor 'lm_head.weight': no stored piece covers "
			      "8 elements starting at index [2, 0]"), "%s", msg);
	ck_assert_ptr_nonnull(strstr(msg, dir));
	q = req_box(&g, NULL, off, sh, buf);
	ck_assert_int_eq(ckptfs_load(l, &q, 1), -ENODATA);
	ckptfs_loader_error(l, msg, sizeof(msg));
	ck_assert_msg(strstr(msg, "covers 4 elements starting at index [2, 1]"), "%s", msg);
	/* a flat request: the hole counted in its own flattening */
	q.flat = 1;
	q.shape = NULL;
	q.offsets = NULL;
	q.box_shape = NULL;
	q.flat_start = 3;
	q.flat_end = 21;
	ck_assert_int_eq(ckptfs_load(l, &q, 1), -ENODATA);
	ckptfs_loader_error(l, msg, sizeof(msg));
	ck_assert_msg(strstr(msg, "covers 8 elements starting at index [2, 0]"), "%s", msg);
	/* a later success clears the error */
	check_box(l, &g, (uint64_t[2]){5, 1}, (uint64_t[2]){1, 3});
	ck_assert_int_eq(ckptfs_loader_error(l, msg, sizeof(msg)), 0);
	ck_assert_str_eq(msg, "");
	ckptfs_loader_free(l);
	free(g.data);
}
END_TEST

/* Disagreeing pieces refuse the open; a request of another dtype or shape fails the load;
 * unknown tensors; a device destination without a GPU. */
START_TEST(test_mismatch)
{
	const char *dir = mkdir_t("mm"), *dir2 = mkdir_t("mm2");
	struct gt a, b, c;
	struct fb f = {0};
	struct ckptfs_loader *l;
	char msg[1024];
	uint8_t buf[256];
	struct ckptfs_load_req q;
	int64_t big[2] = {5, 4}, off[2] = {3, 0}, sh[2] = {2, 4};

	gt_init(&a, "x", "F32", 4, 2, (uint64_t[2]){4, 4});
	gt_init(&b, "x", "BF16", 2, 2, (uint64_t[2]){4, 4});
	gt_init(&c, "x", "F32", 4, 2, (uint64_t[2]){4, 8});
	fb_box(&f, &a, (uint64_t[2]){0, 0}, (uint64_t[2]){2, 4});
	fb_write(&f, dir, "r0.safetensors", 1);
	fb_box(&f, &b, (uint64_t[2]){2, 0}, (uint64_t[2]){2, 4});
	fb_write(&f, dir, "r1.safetensors", 1);
	ck_assert_int_eq(open_fail(dir, 0, msg, sizeof(msg)), -EINVAL);
	ck_assert_msg(strstr(msg, "tensor 'x': pieces disagree on dtype: F32 in ") &&
		      strstr(msg, "/r0.safetensors, BF16 in ") && strstr(msg, "/r1.safetensors"),
		      "%s", msg);

	fb_box(&f, &a, (uint64_t[2]){0, 0}, (uint64_t[2]){2, 4});
	fb_write(&f, dir2, "r0.safetensors", 1);
	fb_box(&f, &c, (uint64_t[2]){2, 0}, (uint64_t[2]){2, 4});
	fb_write(&f, dir2, "r1.safetensors", 1);
	ck_assert_int_eq(open_fail(dir2, 0, msg, sizeof(msg)), -EINVAL);
	ck_assert_msg(strstr(msg, "tensor 'x': pieces disagree on global shape: [4, 4] in ") &&
		      strstr(msg, "[4, 8] in "), "%s", msg);

	fb_box(&f, &a, (uint64_t[2]){2, 0}, (uint64_t[2]){2, 4});
	fb_write(&f, dir2, "r1.safetensors", 1);
	l = open_ok(dir2, 2);
	check_whole(l, &a);
	q = req_box(&b, NULL, NULL, NULL, buf);
	ck_assert_int_eq(ckptfs_load(l, &q, 1), -EINVAL);
	ckptfs_loader_error(l, msg, sizeof(msg));
	ck_assert_msg(strstr(msg, "tensor 'x': dtype mismatch: requested BF16, stored F32"), "%s",
		      msg);
	q = req_box(&a, NULL, NULL, big, buf);
	ck_assert_int_eq(ckptfs_load(l, &q, 1), -EINVAL);
	ckptfs_loader_error(l, msg, sizeof(msg));
	ck_assert_msg(strstr(msg, "tensor 'x': global shape mismatch: the requested box [5, 4] at "
			      "[0, 0] does not fit the stored global shape [4, 4]"), "%s", msg);
	q = req_box(&a, NULL, off, sh, buf);
	q.ndim = 3;
	ck_assert_int_eq(ckptfs_load(l, &q, 1), -EINVAL);
	ckptfs_loader_error(l, msg, sizeof(msg));
	ck_assert_msg(strstr(msg, "requested 3 dimensions, stored global shape [4, 4]"), "%s", msg);
	q = req_box(&a, NULL, (int64_t[2]){2, 0}, NULL, buf);
	q.flat = 1;
	q.flat_start = 0;
	q.flat_end = 9;
	q.box_shape = sh;
	ck_assert_int_eq(ckptfs_load(l, &q, 1), -EINVAL);
	ckptfs_loader_error(l, msg, sizeof(msg));
	ck_assert_msg(strstr(msg, "flat range [0, 9) outside the 8 elements"), "%s", msg);
	/* no shape means the global shape, also with offsets */
	q = req_box(&a, NULL, off, NULL, buf);
	ck_assert_int_eq(ckptfs_load(l, &q, 1), -EINVAL);
	ckptfs_loader_error(l, msg, sizeof(msg));
	ck_assert_msg(strstr(msg, "the requested box [4, 4] at [3, 0] does not fit"), "%s", msg);
	q = req_box(&a, "optim", NULL, NULL, buf);
	ck_assert_int_eq(ckptfs_load(l, &q, 1), -ENOENT);
	ckptfs_loader_error(l, msg, sizeof(msg));
	ck_assert_msg(strstr(msg, "group 'optim', tensor 'x': not in the checkpoint"), "%s", msg);
	q = req_box(&a, NULL, NULL, NULL, buf);
	q.device = 0;
	if (!cuda_available()) {
		ck_assert_int_eq(ckptfs_load(l, &q, 1), -ENODEV);
		ckptfs_loader_error(l, msg, sizeof(msg));
		ck_assert_msg(strstr(msg, "tensor 'x': a device destination (device 0)"), "%s", msg);
	}
	ckptfs_loader_free(l);
	free(a.data);
	free(b.data);
	free(c.data);
}
END_TEST

/* Invalid or unsupported ckptfs metadata and broken files refuse the open, naming the file and
 * the parser's reason. */
START_TEST(test_invalid_meta)
{
	const char *cases[][2] = {
		{"{\"version\": 1, \"tensors\": {\"x\": {\"global_shape\": [2, 4], \"offsets\": "
		 "[1, 0]}}}", "invalid ckptfs metadata"},
		{"{\"version\": 2}", "invalid ckptfs metadata"},
		{"not json", "invalid ckptfs metadata"},
		{"{\"version\": 1, \"tensors\": {\"y\": {}}}", "invalid ckptfs metadata"},
	};
	struct gt a;
	struct fb f = {0};
	char msg[1024], path[1024];
	const char *dir;
	int rc;

	gt_init(&a, "x", "F32", 4, 2, (uint64_t[2]){2, 4});
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		dir = mkdir_t("inv");
		fb_box(&f, &a, (uint64_t[2]){0, 0}, (uint64_t[2]){2, 4});
		fb_write(&f, dir, "a.safetensors", 1);
		fb_box(&f, &a, (uint64_t[2]){0, 0}, (uint64_t[2]){2, 4});
		fb_write_raw(&f, dir, "b.safetensors", 1, NULL, cases[i][0]);
		rc = open_fail(dir, 0, msg, sizeof(msg));
		ck_assert_msg(rc == (i == 1 ? -EPROTONOSUPPORT : -EINVAL), "case %zu: %d", i, rc);
		ck_assert_msg(strstr(msg, "/b.safetensors: ") && strstr(msg, cases[i][1]),
			      "case %zu: %s", i, msg);
	}
	/* several bad files among many (read by several threads): the first by name is named */
	dir = mkdir_t("inv3");
	for (int i = 0; i < 12; i++) {
		char fn[64];

		snprintf(fn, sizeof(fn), "f%02d.safetensors", i);
		fb_box(&f, &a, (uint64_t[2]){0, 0}, (uint64_t[2]){2, 4});
		fb_write_raw(&f, dir, fn, 1, NULL, i == 5 || i == 9 ? "{\"version\": 0}" : NULL);
	}
	for (int r = 0; r < 5; r++) {
		ck_assert_int_eq(open_fail(dir, 0, msg, sizeof(msg)), -EINVAL);
		ck_assert_msg(strstr(msg, "/f05.safetensors: invalid ckptfs metadata"), "%s", msg);
	}
	/* a truncated file, a file that is not safetensors */
	dir = mkdir_t("inv2");
	fb_whole(&f, &a);
	fb_write(&f, dir, "a.safetensors", 0);
	snprintf(path, sizeof(path), "%s/a.safetensors", dir);
	ck_assert_int_eq(truncate(path, 100), 0);
	ck_assert_int_eq(open_fail(dir, 0, msg, sizeof(msg)), -EINVAL);
	ck_assert_msg(strstr(msg, "/a.safetensors: file size 100 does not match its header"), "%s",
		      msg);
	ck_assert_int_eq(truncate(path, 3), 0);
	ck_assert_int_eq(open_fail(dir, 0, msg, sizeof(msg)), -EINVAL);
	ck_assert_msg(strstr(msg, "/a.safetensors: not a safetensors file"), "%s", msg);
	/* a directory that does not exist */
	snprintf(path, sizeof(path), "%s/nothing", base_dir);
	ck_assert_int_eq(open_fail(path, 0, msg, sizeof(msg)), -ENOENT);
	ck_assert_ptr_nonnull(strstr(msg, path));
	free(a.data);
}
END_TEST

/* require_complete: the completion marker, a save that did not finish, plain directories. */
START_TEST(test_require_complete)
{
	const char *dir = mkdir_t("ck"), *part;
	struct gt a;
	struct fb f = {0};
	struct ckptfs_loader_opts o;
	struct ckptfs_loader *l = NULL;
	char msg[1024], path[1024], want[4096];
	int fd;

	gt_init(&a, "x", "F32", 4, 1, (uint64_t[1]){4});
	fb_whole(&f, &a);
	fb_write(&f, dir, "a.safetensors", 1);
	/* no marker */
	ck_assert_int_eq(open_fail(dir, 1, msg, sizeof(msg)), -EBADMSG);
	snprintf(want, sizeof(want), "%s: incomplete checkpoint: no ckptfs-checkpoint.json", dir);
	ck_assert_str_eq(msg, want);
	/* without require_complete the same directory opens */
	l = open_ok(dir, 1);
	ckptfs_loader_free(l);
	/* complete */
	snprintf(path, sizeof(path), "%s/ckptfs-checkpoint.json", dir);
	fd = open(path, O_CREAT | O_WRONLY, 0644);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, "{}", 2), 2);
	close(fd);
	ckptfs_loader_opts_init(&o);
	o.require_complete = 1;
	ck_assert_int_eq(ckptfs_loader_open(dir, &o, &l), 0);
	check_whole(l, &a);
	ckptfs_loader_free(l);
	/* a trailing slash is the same directory */
	snprintf(path, sizeof(path), "%s/", dir);
	ck_assert_int_eq(ckptfs_loader_open(path, &o, &l), 0);
	ckptfs_loader_free(l);
	/* the save did not finish: only DIR.partial */
	part = mkdir_t("step9.partial");
	fb_whole(&f, &a);
	fb_write(&f, part, "a.safetensors", 1);
	snprintf(path, sizeof(path), "%s/step9", base_dir);
	ck_assert_int_eq(open_fail(path, 1, msg, sizeof(msg)), -ENOENT);
	snprintf(want, sizeof(want),
		 "%s: incomplete checkpoint: the save did not finish (%s.partial exists, no "
		 "completion marker)", path, path);
	ck_assert_str_eq(msg, want);
	/* neither */
	snprintf(path, sizeof(path), "%s/step10", base_dir);
	ck_assert_int_eq(open_fail(path, 1, msg, sizeof(msg)), -ENOENT);
	ck_assert_ptr_nonnull(strstr(msg, "No such file or directory"));
	free(a.data);
}
END_TEST

/* Scalars, empty tensors and empty requests, bit-packed dtypes. */
START_TEST(test_edge_shapes)
{
	const char *dir = mkdir_t("edge");
	struct gt sc, em, f4, one;
	struct fb f = {0};
	struct ckptfs_loader *l;
	uint8_t buf[64];
	struct ckptfs_load_req q;
	char msg[1024];

	gt_init(&sc, "step", "I64", 8, 0, NULL);
	gt_init(&em, "empty", "F32", 4, 2, (uint64_t[2]){0, 5});
	gt_init(&f4, "packed", "F4", 1, 1, (uint64_t[1]){8}); /* 8 elements, 4 bytes */
	gt_init(&one, "one", "U8", 1, 3, (uint64_t[3]){1, 1, 1});
	fb_whole(&f, &sc);
	fb_box(&f, &em, (uint64_t[2]){0, 0}, (uint64_t[2]){0, 5});
	fb_box(&f, &one, (uint64_t[3]){0, 0, 0}, (uint64_t[3]){1, 1, 1});
	fb_write(&f, dir, "a.safetensors", 1);
	/* F4: 8 elements are 4 bytes, written by hand */
	fb_whole(&f, &f4);
	f.t[0].nbytes = 4;
	fb_write(&f, dir, "b.safetensors", 0);
	l = open_ok(dir, 2);
	check_whole(l, &sc);
	check_whole(l, &em);
	check_whole(l, &one);
	check_flat(l, &sc, NULL, NULL, 0, 1);
	check_flat(l, &sc, NULL, NULL, 1, 1);
	check_box(l, &one, (uint64_t[3]){1, 0, 1}, (uint64_t[3]){0, 1, 0});
	q = req_box(&f4, NULL, NULL, NULL, buf);
	ck_assert_int_eq(ckptfs_load(l, &q, 1), 0);
	ck_assert_mem_eq(buf, f4.data, 4);
	q.offsets = (int64_t[1]){2};
	q.shape = (int64_t[1]){2};
	ck_assert_int_eq(ckptfs_load(l, &q, 1), -ENOTSUP);
	ckptfs_loader_error(l, msg, sizeof(msg));
	ck_assert_msg(strstr(msg, "tensor 'packed': dtype F4 is bit-packed"), "%s", msg);
	/* zero requests */
	ck_assert_int_eq(ckptfs_load(l, NULL, 0), 0);
	ckptfs_loader_free(l);
	free(sc.data);
	free(em.data);
	free(f4.data);
	free(one.data);
}
END_TEST

/* Sixteen dimensions: pieces cut along three of them, boxes and flat ranges back. */
START_TEST(test_16_dims)
{
	const char *dir = mkdir_t("d16");
	struct gt g;
	uint64_t s[16], cut[3] = {0, 5, 9};
	struct ckptfs_loader *l;

	for (int k = 0; k < 16; k++)
		s[k] = k < 10 ? 2 : 1;
	s[5] = 3;
	gt_init(&g, "t16", "I32", 4, 16, s);
	for (int p = 0; p < 8; p++) {
		uint64_t off[16] = {0}, sh[16];
		struct fb f = {0};
		char fn[32];

		memcpy(sh, s, sizeof(sh));
		for (int c = 0; c < 3; c++) {
			uint64_t b, e;

			chunk_bounds(s[cut[c]], 2, (uint64_t)(p >> c) & 1, &b, &e);
			off[cut[c]] = b;
			sh[cut[c]] = e - b;
		}
		fb_box(&f, &g, off, sh);
		snprintf(fn, sizeof(fn), "p%d.safetensors", p);
		fb_write(&f, dir, fn, 1);
	}
	l = open_ok(dir, 3);
	check_whole(l, &g);
	for (int r = 0; r < 50; r++) {
		uint64_t off[16], sh[16], n;

		for (int k = 0; k < 16; k++) {
			off[k] = rndn(s[k]);
			sh[k] = 1 + rndn(s[k] - off[k]);
		}
		check_box(l, &g, off, sh);
		n = box_elems(16, sh);
		check_flat(l, &g, off, sh, rndn(n), n);
	}
	ckptfs_loader_free(l);
	free(g.data);
}
END_TEST

/* The load reads only what the requests cover: the counters, and a file whose unneeded tail is
 * cut off after the open. */
START_TEST(test_reads_only_needed)
{
	const char *dir = mkdir_t("need");
	struct gt g;
	struct ckptfs_loader *l;
	struct ckptfs__load_stats st;
	struct ckptfs__load_tune tu = {0};
	uint64_t s[2] = {64, 256};
	char path[1024], msg[1024];
	uint8_t *buf = malloc(64 * 256 * 4);
	struct ckptfs_load_req q;
	int64_t off[2] = {12, 0}, sh[2] = {4, 256};

	gt_init(&g, "w", "F32", 4, 2, s);
	write_tp(dir, "c", &g, 1, 4); /* columns split: every row is a short run per file */
	l = open_ok(dir, 4);
	/* without coalescing: exactly the needed bytes, one run per row and file */
	tu.gap_max = UINT64_MAX;
	ckptfs__loader_tune(l, &tu);
	check_tp_parts(l, &g, 0, 3);
	ck_assert_int_eq(ckptfs__loader_stats(l, &st), 0);
	ck_assert_uint_eq(st.bytes_needed, 20 * 256 * 4); /* the last part: rows [44, 64) */
	ck_assert_uint_eq(st.bytes_read, st.bytes_needed);
	ck_assert_uint_eq(st.gap_bytes, 0);
	/* rows of one file are contiguous there, so one read per file */
	ck_assert_uint_eq(st.reads, 4);
	ck_assert_uint_eq(st.files, 4);
	/* a sub-box: columns [8, 200) read as separate runs without gaps */
	check_box(l, &g, (uint64_t[2]){3, 8}, (uint64_t[2]){40, 192});
	ckptfs__loader_stats(l, &st);
	ck_assert_uint_eq(st.bytes_read, 40 * 192 * 4);
	ck_assert_uint_eq(st.runs, 40 * 4);
	/* with coalescing: the gaps are read but no more than the gaps */
	tu.gap_max = 0;
	ckptfs__loader_tune(l, &tu);
	check_box(l, &g, (uint64_t[2]){3, 8}, (uint64_t[2]){40, 192});
	ckptfs__loader_stats(l, &st);
	ck_assert_uint_eq(st.bytes_read - st.gap_bytes, 40 * 192 * 4);
	ck_assert_uint_le(st.gap_bytes, 39 * 64 * 4);
	ck_assert_uint_le(st.reads, 4);
	/* cut file c_rank00 after row 15 (the loader has it open already): rows below load */
	snprintf(path, sizeof(path), "%s/c_rank00.safetensors", dir);
	{
		struct stat sb;

		ck_assert_int_eq(stat(path, &sb), 0);
		ck_assert_int_eq(truncate(path, sb.st_size - (64 - 16) * 64 * 4), 0);
	}
	q = req_box(&g, NULL, off, sh, buf);
	ck_assert_int_eq(ckptfs_load(l, &q, 1), 0);
	{
		uint8_t *want = malloc(4 * 256 * 4);

		ref_flat(&g, (uint64_t[2]){12, 0}, (uint64_t[2]){4, 256}, 0, 1024, want);
		ck_assert_mem_eq(buf, want, 4 * 256 * 4);
		free(want);
	}
	off[0] = 14;
	ck_assert_int_eq(ckptfs_load(l, &q, 1), -EIO);
	ckptfs_loader_error(l, msg, sizeof(msg));
	ck_assert_msg(strstr(msg, "/c_rank00.safetensors: reading ") && strstr(msg, "file ends"),
		      "%s", msg);
	ckptfs_loader_free(l);
	free(buf);
	free(g.data);
}
END_TEST

/* A larger tensor saved split along dim 1, loaded split along dim 0 and as flat ranges:
 * 1 and 4 threads, small chunks, with and without coalescing: the reference bytes each time. */
START_TEST(test_large_threads)
{
	const char *dir = mkdir_t("large");
	struct gt g;
	uint64_t s[2] = {1024, 1536};
	uint64_t tunes[4][2] = {{0, 0}, {UINT64_MAX, 0}, {0, 65536}, {UINT64_MAX, 4096}};
	uint8_t *want = malloc(1024 * 1536 * 2), *got = malloc(1024 * 1536 * 2);

	gt_init(&g, "big", "BF16", 2, 2, s);
	write_tp(dir, "r", &g, 1, 4);
	ref_flat(&g, (uint64_t[2]){0, 0}, s, 0, 1024 * 1536, want);
	for (int th = 1; th <= 4; th += 3)
		for (int k = 0; k < 4; k++) {
			struct ckptfs_loader *l = open_ok(dir, th);
			struct ckptfs__load_tune tu = {
				.gap_max = tunes[k][0], .chunk_bytes = tunes[k][1],
				.willneed = k % 2 ? 1 : -1,
				/* k 2, 3: through a staging buffer of an odd size, refilled */
				.stage_bytes = k >= 2 ? (1u << 20) + 3 : 0, .stage_host = k >= 2};
			struct ckptfs_load_req q[5];
			int64_t off[3][2], sh[3][2], z[2] = {0, 0}, bs[2] = {1024, 1536};

			ckptfs__loader_tune(l, &tu);
			memset(got, 0, 1024 * 1536 * 2);
			/* rows in three uneven parts, then the flattening cut in two */
			for (int t = 0; t < 3; t++) {
				uint64_t b, e;

				chunk_bounds(1024, 3, (uint64_t)t, &b, &e);
				off[t][0] = (int64_t)b;
				off[t][1] = 0;
				sh[t][0] = (int64_t)(e - b);
				sh[t][1] = 1536;
				q[t] = req_box(&g, NULL, off[t], sh[t], got + b * 1536 * 2);
			}
			ck_assert_int_eq(ckptfs_load(l, q, 3), 0);
			ck_assert_msg(memcmp(got, want, 1024 * 1536 * 2) == 0, "th %d tune %d", th, k);
			memset(got, 0, 1024 * 1536 * 2);
			q[3] = req_box(&g, NULL, z, NULL, got);
			q[3].flat = 1;
			q[3].box_shape = bs;
			q[3].flat_start = 0;
			q[3].flat_end = 700001;
			q[4] = q[3];
			q[4].dst = got + 700001 * 2;
			q[4].flat_start = 700001;
			q[4].flat_end = 1024 * 1536;
			ck_assert_int_eq(ckptfs_load(l, q + 3, 2), 0);
			ck_assert_msg(memcmp(got, want, 1024 * 1536 * 2) == 0, "flat th %d tune %d", th,
				      k);
			ckptfs_loader_free(l);
		}
	free(want);
	free(got);
	free(g.data);
}
END_TEST

/* Random tensors, random source layouts (grids of boxes, flat ranges of the whole or of the
 * boxes, replicas), random targets (boxes, flat ranges of boxes), all in one call, with random
 * thread counts and planning constants: the reference bytes. */
#define NSRC 160
struct rsrc {
	uint64_t off[MAXD], sh[MAXD];
	int flat;
	uint64_t a, b;
};

static int random_sources(const struct gt *g, struct rsrc *src, int max)
{
	uint64_t parts[MAXD], prod = 1, n = 0, boxes;
	int kind = (int)rndn(3), n_src = 0;

	for (int k = 0; k < g->nd; k++) {
		parts[k] = prod < 12 ? 1 + rndn(3) : 1;
		prod *= parts[k];
	}
	boxes = prod;
	if (kind == 1) /* flat pieces of the whole */
		boxes = 1;
	for (uint64_t bi = 0; bi < boxes; bi++) {
		struct rsrc bx = {0};
		uint64_t r = bi;

		for (int k = g->nd; k-- > 0;) {
			uint64_t p = kind == 1 ? 1 : parts[k], b, e;

			chunk_bounds(g->shape[k], p, r % p, &b, &e);
			r /= p;
			bx.off[k] = b;
			bx.sh[k] = e - b;
		}
		n = box_elems(g->nd, bx.sh);
		if (kind == 0 || n == 0) {
			if (n_src < max)
				src[n_src++] = bx;
			continue;
		}
		/* cut [0, n) at random points into up to 4 flat pieces (some empty) */
		{
			uint64_t cuts[6];
			int nc = 1 + (int)rndn(4);

			cuts[0] = 0;
			for (int c = 1; c < nc; c++)
				cuts[c] = rndn(n + 1);
			cuts[nc] = n;
			for (int c = 1; c < nc; c++)
				for (int d = c + 1; d < nc; d++)
					if (cuts[d] < cuts[c]) {
						uint64_t t = cuts[c];

						cuts[c] = cuts[d];
						cuts[d] = t;
					}
			for (int c = 0; c < nc && n_src < max; c++) {
				src[n_src] = bx;
				src[n_src].flat = 1;
				src[n_src].a = cuts[c];
				src[n_src].b = cuts[c + 1];
				n_src++;
			}
		}
	}
	return n_src;
}

START_TEST(test_randomized)
{
	static const char *dts[4] = {"U8", "BF16", "F32", "F64"};
	static const unsigned ebs[4] = {1, 2, 4, 8};
	struct fb *files = calloc(NSRC + 8, sizeof(*files));

	rng_state ^= 0x9e3779b97f4a7c15ull * (uint64_t)(_i + 1);
	for (int round = 0; round < 60; round++) {
		const char *dir = mkdir_t("rnd");
		struct gt g[3];
		struct rsrc src[NSRC];
		int nt = 1 + (int)rndn(3), used[NSRC + 8] = {0};
		char names[3][16];
		struct ckptfs_load_req q[12];
		int64_t qoff[12][MAXD], qsh[12][MAXD];
		uint8_t *dst[12], *want[12];
		uint64_t qbytes[12];
		int nq = 0;
		struct ckptfs_loader *l;
		struct ckptfs__load_tune tu = {0};
		char msg[1024];
		int rc;

		for (int t = 0; t < nt; t++) {
			uint64_t sh[MAXD];
			int nd = (int)rndn(5), di = (int)rndn(4), ns;

			for (int k = 0; k < nd; k++)
				sh[k] = rndn(10) == 0 ? 0 : 1 + rndn(9);
			snprintf(names[t], sizeof(names[t]), "t%d", t);
			gt_init(&g[t], names[t], dts[di], ebs[di], nd, sh);
			ns = random_sources(&g[t], src, NSRC);
			ck_assert_int_lt(ns, NSRC); /* none left out */
			/* an overlapping extra piece of another geometry (a box or a flat range of
			 * one), listed first so that it sorts among the others by file */
			if (ns < NSRC - 1 && rndn(2) == 0) {
				struct rsrc *x = &src[ns++];
				uint64_t n;

				memset(x, 0, sizeof(*x));
				for (int k = 0; k < nd; k++) {
					x->off[k] = rndn(sh[k] + 1);
					x->sh[k] = rndn(sh[k] - x->off[k] + 1);
				}
				n = box_elems(nd, x->sh);
				if (rndn(2)) {
					x->flat = 1;
					x->a = rndn(n + 1);
					x->b = x->a + rndn(n - x->a + 1);
				}
			}
			for (int i = 0; i < ns; i++) {
				int fi = i;

				fb_piece(&files[fi], &g[t], NULL, src[i].off, src[i].sh, src[i].flat,
					 src[i].a, src[i].b);
				used[fi] = 1;
				/* a replica of this piece in another file */
				if (rndn(5) == 0) {
					int ri = NSRC + (int)rndn(8);
					int dup = 0;

					for (int k = 0; k < files[ri].n; k++)
						dup |= strcmp(files[ri].t[k].name, names[t]) == 0;
					if (!dup) {
						fb_piece(&files[ri], &g[t], NULL, src[i].off, src[i].sh,
							 src[i].flat, src[i].a, src[i].b);
						used[ri] = 1;
					}
				}
			}
		}
		for (int fi = 0; fi < NSRC + 8; fi++) {
			char fn[32];

			if (!used[fi])
				continue;
			snprintf(fn, sizeof(fn), "%s%03d.safetensors", fi < NSRC ? "r" : "rep", fi);
			fb_write(&files[fi], dir, fn, 1);
		}
		/* requests */
		for (int t = 0; t < nt; t++) {
			int nr = 1 + (int)rndn(4);

			for (int r = 0; r < nr && nq < 12; r++, nq++) {
				uint64_t off[MAXD], sh[MAXD], n, a, b;
				int flat = (int)rndn(2);

				for (int k = 0; k < g[t].nd; k++) {
					off[k] = rndn(g[t].shape[k] + 1);
					sh[k] = rndn(g[t].shape[k] - off[k] + 1);
					if (rndn(3) == 0) { /* whole along k, more often */
						off[k] = 0;
						sh[k] = g[t].shape[k];
					}
					qoff[nq][k] = (int64_t)off[k];
					qsh[nq][k] = (int64_t)sh[k];
				}
				n = box_elems(g[t].nd, sh);
				a = 0;
				b = n;
				if (flat) {
					a = rndn(n + 1);
					b = a + rndn(n - a + 1);
				}
				qbytes[nq] = (b - a) * g[t].eb;
				dst[nq] = malloc(qbytes[nq] + 1);
				want[nq] = malloc(qbytes[nq] + 1);
				memset(dst[nq], 0xA5, qbytes[nq]);
				ref_flat(&g[t], off, sh, a, b, want[nq]);
				q[nq] = req_box(&g[t], NULL, qoff[nq], qsh[nq], dst[nq]);
				if (flat) {
					q[nq].flat = 1;
					q[nq].shape = NULL;
					q[nq].box_shape = qsh[nq];
					q[nq].flat_start = (int64_t)a;
					q[nq].flat_end = (int64_t)b;
				}
			}
		}
		l = open_ok(dir, 1 + (int)rndn(6));
		tu.gap_max = rndn(3) == 0 ? UINT64_MAX : rndn(200);
		tu.chunk_bytes = rndn(2) ? 0 : 1 + rndn(300);
		tu.mode = (int)rndn(3);
		tu.willneed = (int)rndn(3) - 1;
		tu.stage_host = rndn(3) == 0;
		tu.stage_bytes = rndn(2) ? 0 : 1 + rndn(300);
		ckptfs__loader_tune(l, &tu);
		rc = ckptfs_load(l, q, (size_t)nq);
		ckptfs_loader_error(l, msg, sizeof(msg));
		ck_assert_msg(rc == 0, "round %d: %d %s", round, rc, msg);
		for (int i = 0; i < nq; i++) {
			ck_assert_msg(memcmp(dst[i], want[i], qbytes[i]) == 0,
				      "round %d request %d (%s, flat %d): bytes differ", round, i,
				      q[i].name, q[i].flat);
			free(dst[i]);
			free(want[i]);
		}
		{
			struct ckptfs__load_stats st;

			ckptfs__loader_stats(l, &st);
			ck_assert_uint_le(st.bytes_read - st.gap_bytes, st.bytes_needed);
		}
		ckptfs_loader_free(l);
		for (int t = 0; t < nt; t++)
			free(g[t].data);
	}
	free(files);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("tload");
	TCase *tc = tcase_create("load");

	tcase_add_unchecked_fixture(tc, dirs_setup, dirs_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_version);
	tcase_add_test(tc, test_whole_plain);
	tcase_add_test(tc, test_tp_reshard);
	tcase_add_test(tc, test_3d_boxes);
	tcase_add_test(tc, test_flat_sources);
	tcase_add_test(tc, test_replicas_groups);
	tcase_add_test(tc, test_missing_piece);
	tcase_add_test(tc, test_mismatch);
	tcase_add_test(tc, test_invalid_meta);
	tcase_add_test(tc, test_require_complete);
	tcase_add_test(tc, test_edge_shapes);
	tcase_add_test(tc, test_16_dims);
	tcase_add_test(tc, test_reads_only_needed);
	tcase_add_test(tc, test_large_threads);
	tcase_add_loop_test(tc, test_randomized, 0, 4);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int nf = srunner_ntests_failed(sr);
	srunner_free(sr);
	return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
