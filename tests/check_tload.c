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

static __attribute__((unused)) int open_fail(const char *dir, int require, char *msg, size_t len)
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
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int nf = srunner_ntests_failed(sr);
	srunner_free(sr);
	return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
