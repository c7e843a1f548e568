/* SPDX-License-Identifier: MIT */
/*
 * check_tsave.c - unit tests for the save half of libckptfs (core/trainer): the pool (reuse,
 * bound), the files written (header, sharding metadata, bytes; blobs; replicas skipped), the
 * checkpoint directory protocol (world 1 and 2, a missing rank, stale markers, EEXIST) and
 * back-pressure.  Every test works in its own temporary directory under $TMPDIR (or /tmp)
 * and, like every Check test, in its own forked process; the runner removes the directories
 * at the end even when a test failed.
 *
 * Test-only instrumentation: ckptfs__test_set_write_delay() and ckptfs__test_pool_base(),
 * declared in core/trainer/trainer_int.h and exported by the library for these tests only.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "trainer/ckptfs.h"
#include "trainer/trainer_int.h"

/* ---- helpers ----------------------------------------------------------------------------- */

/* base_dir: made once in the runner's process (unchecked fixture) and removed there at the end,
 * also when a test failed in its forked process; tmp_root: each test's own directory in it. */
static char base_dir[900];
static char tmp_root[1024];

static void rm_rf(const char *p)
{
	char cmd[1100];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", p);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", p);
}

static void base_setup(void)
{
	const char *t = getenv("TMPDIR");

	snprintf(base_dir, sizeof(base_dir), "%s/tsave-XXXXXX", t && *t ? t : "/tmp");
	if (!mkdtemp(base_dir)) {
		perror(base_dir);
		exit(1);
	}
}

static void base_teardown(void)
{
	rm_rf(base_dir);
}

static void setup(void)
{
	snprintf(tmp_root, sizeof(tmp_root), "%s/t-XXXXXX", base_dir);
	ck_assert_ptr_nonnull(mkdtemp(tmp_root));
}

static void teardown(void)
{
	rm_rf(tmp_root);
}

static char *pathf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *pathf(const char *fmt, ...)
{
	static char bufs[8][4200];
	static int k;
	char *b = bufs[k++ % 8], rel[3000];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(rel, sizeof(rel), fmt, ap);
	va_end(ap);
	snprintf(b, 4200, "%s/%s", tmp_root, rel);
	return b;
}

static int exists(const char *p)
{
	struct stat st;

	return stat(p, &st) == 0;
}

static char *read_all(const char *p, size_t *ret_len)
{
	FILE *f = fopen(p, "rb");
	char *b;
	long n;

	ck_assert_msg(f != NULL, "%s: %s", p, strerror(errno));
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	b = malloc((size_t)n + 1);
	ck_assert_int_eq(fread(b, 1, (size_t)n, f), (size_t)n);
	b[n] = '\0';
	fclose(f);
	if (ret_len)
		*ret_len = (size_t)n;
	return b;
}

/* A parsed safetensors file: the header JSON and the data area. */
struct stfile {
	char *raw;
	size_t len;
	uint64_t n;
	json_t *hdr;
	json_t *meta;   /* the parsed "ckptfs" string */
	const char *data;
};

static void st_open(struct stfile *f, const char *p)
{
	json_error_t je;
	const char *ck;

	memset(f, 0, sizeof(*f));
	f->raw = read_all(p, &f->len);
	ck_assert_uint_ge(f->len, 8);
	memcpy(&f->n, f->raw, 8);
	ck_assert_uint_eq((8 + f->n) % 8, 0);
	ck_assert_uint_le(8 + f->n, f->len);
	f->hdr = json_loadb(f->raw + 8, f->n, JSON_REJECT_DUPLICATES, &je);
	ck_assert_msg(f->hdr != NULL, "%s: %s", p, je.text);
	f->data = f->raw + 8 + f->n;
	ck_assert_str_eq(json_string_value(json_object_get(json_object_get(f->hdr, "__metadata__"),
							  "format")), "pt");
	ck = json_string_value(json_object_get(json_object_get(f->hdr, "__metadata__"), "ckptfs"));
	ck_assert_ptr_nonnull(ck);
	f->meta = json_loads(ck, JSON_REJECT_DUPLICATES, &je);
	ck_assert_msg(f->meta != NULL, "%s: ckptfs: %s", p, je.text);
	ck_assert_int_eq(json_integer_value(json_object_get(f->meta, "version")), 1);
}

static void st_close(struct stfile *f)
{
	json_decref(f->hdr);
	json_decref(f->meta);
	free(f->raw);
}

/* The bytes of tensor name in f (asserts its dtype and shape). */
static const char *st_tensor(struct stfile *f, const char *name, const char *dtype,
			     const int64_t *shape, int ndim, size_t *ret_len)
{
	json_t *t = json_object_get(f->hdr, name), *sh, *off;
	uint64_t b, e;

	ck_assert_msg(t != NULL, "tensor %s missing", name);
	ck_assert_str_eq(json_string_value(json_object_get(t, "dtype")), dtype);
	sh = json_object_get(t, "shape");
	ck_assert_int_eq((int)json_array_size(sh), ndim);
	for (int d = 0; d < ndim; d++)
		ck_assert_int_eq(json_integer_value(json_array_get(sh, (size_t)d)), shape[d]);
	off = json_object_get(t, "data_offsets");
	b = (uint64_t)json_integer_value(json_array_get(off, 0));
	e = (uint64_t)json_integer_value(json_array_get(off, 1));
	ck_assert_uint_le(8 + f->n + e, f->len);
	*ret_len = (size_t)(e - b);
	return f->data + b;
}

static json_t *load_json(const char *p)
{
	json_error_t je;
	json_t *o = json_load_file(p, JSON_REJECT_DUPLICATES, &je);

	ck_assert_msg(o != NULL, "%s: %s", p, je.text);
	return o;
}

static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

static struct ckptfs_saver *saver(size_t pool, int bp, int timeout_ms)
{
	struct ckptfs_saver_opts o;
	struct ckptfs_saver *s = NULL;

	ckptfs_saver_opts_init(&o);
	o.pool_bytes = pool;
	o.backpressure = bp;
	o.commit_timeout_ms = timeout_ms;
	o.write_bytes = 4096; /* several chunks per file even for small tensors */
	ck_assert_int_eq(ckptfs_saver_new(&o, &s), 0);
	return s;
}

static void args_init(struct ckptfs_save_args *a, const char *path, int rank, int world)
{
	memset(a, 0, sizeof(*a));
	a->path = path;
	a->rank = rank;
	a->world = world;
	a->job_id = 77;
	a->seq = 1;
	a->num_layers = -1;
}

static void tensor_init(struct ckptfs_tensor *t, const char *group, const char *name,
			const char *dtype, int ndim, const int64_t *shape, const void *data)
{
	memset(t, 0, sizeof(*t));
	t->group = group;
	t->name = name;
	t->dtype = dtype;
	t->ndim = ndim;
	t->shape = shape;
	t->data = data;
	t->device = -1;
	t->tp_dim = CKPTFS_TP_DIM_UNSET;
	t->pp = CKPTFS_PP_UNSET;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void fill(float *v, size_t n, float base)
{
	for (size_t i = 0; i < n; i++)
		v[i] = base + (float)i;
}

/* ---- tests ------------------------------------------------------------------------------- */

START_TEST(test_version)
{
	ck_assert_int_eq(ckptfs_api_version(), CKPTFS_API_VERSION);
	ck_assert(ckptfs_cuda_available() == 0 || ckptfs_cuda_available() == 1);
}
END_TEST

START_TEST(test_world1_files)
{
	struct ckptfs_saver *s = saver(1 << 24, CKPTFS_BP_WAIT, 5000);
	struct ckptfs_save_args a;
	struct ckptfs_tensor t[4];
	struct ckptfs_blob blob = { "rng.pkl", "random-state", 12 };
	static float w[6 * 4], b[4], e[5 * 3];
	static double m[8];
	int64_t shw[2] = { 6, 4 }, gw[2] = { 12, 4 }, ow[2] = { 6, 0 }, shb[1] = { 4 };
	int64_t she[1] = { 5 }, ge[2] = { 4, 4 }, shm[1] = { 8 };
	const char *p = pathf("step1");
	struct ckptfs_save_stats st;
	struct stfile f;
	json_t *mk, *tens, *e1;
	const char *d;
	size_t len;
	char err[512];

	fill(w, 24, 1.0f);
	fill(b, 4, 100.0f);
	fill(e, 15, 200.0f);
	for (int i = 0; i < 8; i++)
		m[i] = 0.5 * i;
	args_init(&a, p, 0, 1);
	tensor_init(&t[0], NULL, "layers.0.w", "F32", 2, shw, w);
	t[0].global_ndim = 2;
	t[0].global_shape = gw;
	t[0].offsets = ow;
	t[0].tp_dim = 0;
	t[0].pp = 0;
	tensor_init(&t[1], "model", "norm.b", "F32", 1, shb, b);
	t[1].pp = CKPTFS_PP_LAST;
	/* A flat piece: elements [3, 8) of the 4x4 box. */
	tensor_init(&t[2], "model", "flat.e", "F32", 1, she, e);
	t[2].global_ndim = 2;
	t[2].global_shape = ge;
	t[2].flat = 1;
	t[2].flat_start = 3;
	t[2].flat_end = 8;
	tensor_init(&t[3], "optim", "exp_avg.layers.0.w", "F64", 1, shm, m);
	a.tensors = t;
	a.n_tensors = 4;
	a.blobs = &blob;
	a.n_blobs = 1;
	a.num_layers = 2;
	a.manifest_extra = "{\"step\": 1, \"lr\": [0.1]}";
	ck_assert_int_eq(ckptfs_save_async(s, &a), 0);
	/* The snapshot is taken: scribbling over the tensors now changes nothing. */
	memset(w, 0, sizeof(w));
	ck_assert_int_eq(ckptfs_save_wait(s, 10000), 0);
	ck_assert_int_eq(ckptfs_save_done(s), 1);
	ck_assert_int_eq(ckptfs_saver_error(s, err, sizeof(err)), 0);
	ck_assert(exists(p));
	ck_assert(!exists(pathf("step1.partial")));
	/* Exactly: two tensor files, the blob, the completion marker. */
	ck_assert_int_eq(count_entries(p), 4);

	st_open(&f, pathf("step1/model-rank00000.safetensors"));
	ck_assert_str_eq(json_string_value(json_object_get(f.meta, "group")), "model");
	ck_assert_int_eq(json_integer_value(json_object_get(f.meta, "num_layers")), 2);
	tens = json_object_get(f.meta, "tensors");
	e1 = json_object_get(tens, "layers.0.w");
	ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(e1, "global_shape"), 0)), 12);
	ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(e1, "offsets"), 0)), 6);
	ck_assert_int_eq(json_integer_value(json_object_get(e1, "tp_dim")), 0);
	ck_assert_int_eq(json_integer_value(json_object_get(e1, "pp")), 0);
	ck_assert_ptr_null(json_object_get(e1, "flat_range"));
	e1 = json_object_get(tens, "norm.b");
	ck_assert_str_eq(json_string_value(json_object_get(e1, "pp")), "last");
	/* Defaults are omitted. */
	ck_assert_ptr_null(json_object_get(e1, "global_shape"));
	ck_assert_ptr_null(json_object_get(e1, "tp_dim"));
	e1 = json_object_get(tens, "flat.e");
	ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(e1, "flat_range"), 0)), 3);
	ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(e1, "flat_range"), 1)), 8);
	ck_assert_ptr_null(json_object_get(e1, "box_shape"));
	ck_assert_ptr_null(json_object_get(e1, "offsets"));
	d = st_tensor(&f, "layers.0.w", "F32", shw, 2, &len);
	fill(w, 24, 1.0f);
	ck_assert_uint_eq(len, sizeof(w));
	ck_assert_int_eq(memcmp(d, w, len), 0);
	d = st_tensor(&f, "norm.b", "F32", shb, 1, &len);
	ck_assert_int_eq(memcmp(d, b, len), 0);
	d = st_tensor(&f, "flat.e", "F32", she, 1, &len);
	ck_assert_int_eq(memcmp(d, e, len), 0);
	st_close(&f);

	st_open(&f, pathf("step1/optim-rank00000.safetensors"));
	ck_assert_str_eq(json_string_value(json_object_get(f.meta, "group")), "optim");
	d = st_tensor(&f, "exp_avg.layers.0.w", "F64", shm, 1, &len);
	ck_assert_int_eq(memcmp(d, m, sizeof(m)), 0);
	st_close(&f);

	d = read_all(pathf("step1/rng.pkl"), &len);
	ck_assert_uint_eq(len, 12);
	ck_assert_int_eq(memcmp(d, "random-state", 12), 0);
	free((void *)d);

	mk = load_json(pathf("step1/ckptfs-checkpoint.json"));
	ck_assert_str_eq(json_string_value(json_object_get(mk, "format")), "ckptfs-checkpoint");
	ck_assert_int_eq(json_integer_value(json_object_get(mk, "format_version")), 1);
	ck_assert_int_eq(json_integer_value(json_object_get(mk, "world")), 1);
	ck_assert_str_eq(json_string_value(json_object_get(mk, "job_id")), "77");
	ck_assert_int_eq(json_integer_value(json_object_get(mk, "seq")), 1);
	ck_assert_str_eq(json_string_value(json_array_get(json_object_get(mk, "groups"), 0)), "model");
	ck_assert_str_eq(json_string_value(json_array_get(json_object_get(mk, "groups"), 1)), "optim");
	ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(mk, "extra"), "step")), 1);
	ck_assert_int_eq(json_array_size(json_object_get(json_array_get(json_object_get(mk, "ranks"), 0),
							 "files")), 3);
	json_decref(mk);
	ck_assert_int_eq(ckptfs_saver_stats(s, &st), 0);
	ck_assert_uint_gt(st.bytes, sizeof(w) + sizeof(m) + 12);
	ckptfs_saver_free(s);
}
END_TEST

/* ---- world 2 ----------------------------------------------------------------------------- */

struct rank_ctx {
	const char *path;
	int rank, world, delay_ms, timeout_ms;
	int no_wait_commit;
	uint64_t job_id;
	int save_ret, wait_ret;
	char err[512];
};

static void *rank_main(void *arg)
{
	struct rank_ctx *r = arg;
	struct ckptfs_saver_opts o;
	struct ckptfs_saver *s = NULL;
	struct ckptfs_save_args a;
	struct ckptfs_tensor t[2];
	float w[8];
	int64_t sh[1] = { 8 }, g[1] = { 16 }, off[1];

	ckptfs_saver_opts_init(&o);
	o.pool_bytes = 1 << 22;
	o.commit_timeout_ms = r->timeout_ms;
	o.wait_commit = !r->no_wait_commit;
	ck_assert_int_eq(ckptfs_saver_new(&o, &s), 0);
	fill(w, 8, (float)(r->rank * 100));
	off[0] = 8 * r->rank;
	ckptfs__test_set_write_delay(s, r->delay_ms);
	args_init(&a, r->path, r->rank, r->world);
	a.job_id = r->job_id;
	tensor_init(&t[0], NULL, "w", "F32", 1, sh, w);
	t[0].global_ndim = 1;
	t[0].global_shape = g;
	t[0].offsets = off;
	/* Replicated: rank 1 writes it, rank 0 skips it. */
	tensor_init(&t[1], NULL, "bias", "F32", 1, sh, w);
	t[1].replica = r->rank == 0;
	a.tensors = t;
	a.n_tensors = 2;
	r->save_ret = ckptfs_save_async(s, &a);
	r->wait_ret = r->save_ret ? r->save_ret : ckptfs_save_wait(s, -1);
	ckptfs_saver_error(s, r->err, sizeof(r->err));
	ckptfs_saver_free(s);
	return NULL;
}

START_TEST(test_world2)
{
	struct rank_ctx r[2] = { { .rank = 0 }, { .rank = 1 } };
	pthread_t th[2];
	char p[4200], f0[4200];
	struct stfile f;
	json_t *mk;
	size_t len;

	snprintf(p, sizeof(p), "%s", pathf("w2"));
	for (int i = 0; i < 2; i++) {
		r[i].path = p;
		r[i].world = 2;
		r[i].job_id = 5;
		r[i].timeout_ms = 10000;
	}
	/* Rank 1 is slow: rank 0 must wait for its marker.  Poll (a loaded machine or valgrind
	 * may take a while to get rank 0's file out) but never past rank 1's delay. */
	r[1].delay_ms = 1500;
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, rank_main, &r[i]), 0);
	snprintf(f0, sizeof(f0), "%s", pathf("w2.partial/model-rank00000.safetensors"));
	for (int i = 0; i < 1000 && !exists(f0) && !exists(p); i++)
		usleep(1000);
	ck_assert(!exists(p));
	ck_assert(exists(f0));
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 2; i++) {
		ck_assert_msg(r[i].save_ret == 0 && r[i].wait_ret == 0, "rank %d: %s", i, r[i].err);
	}
	ck_assert(exists(p));
	ck_assert_int_eq(count_entries(p), 3);
	st_open(&f, pathf("w2/model-rank00000.safetensors"));
	ck_assert_ptr_null(json_object_get(f.hdr, "bias"));
	st_tensor(&f, "w", "F32", (int64_t[]){ 8 }, 1, &len);
	st_close(&f);
	st_open(&f, pathf("w2/model-rank00001.safetensors"));
	ck_assert_ptr_nonnull(json_object_get(f.hdr, "bias"));
	ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(
		json_object_get(json_object_get(f.meta, "tensors"), "w"), "offsets"), 0)), 8);
	st_close(&f);
	mk = load_json(pathf("w2/ckptfs-checkpoint.json"));
	ck_assert_int_eq(json_integer_value(json_object_get(mk, "world")), 2);
	ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(json_object_get(mk, "ranks"), 1),
							  "rank")), 1);
	json_decref(mk);
}
END_TEST


/* One F32 tensor "w" of n elements (values base, base+1, ...), world 1. */
static int save1(struct ckptfs_saver *s, const char *path, float *buf, size_t n, float base)
{
	struct ckptfs_save_args a;
	struct ckptfs_tensor t;
	int64_t sh[1] = { (int64_t)n };

	fill(buf, n, base);
	args_init(&a, path, 0, 1);
	tensor_init(&t, NULL, "w", "F32", 1, sh, buf);
	a.tensors = &t;
	a.n_tensors = 1;
	return ckptfs_save_async(s, &a);
}

static void check_w(const char *file, size_t n, float base)
{
	struct stfile f;
	int64_t sh[1] = { (int64_t)n };
	float *want = malloc(n * sizeof(float));
	const char *d;
	size_t len;

	fill(want, n, base);
	st_open(&f, file);
	d = st_tensor(&f, "w", "F32", sh, 1, &len);
	ck_assert_uint_eq(len, n * sizeof(float));
	ck_assert_msg(memcmp(d, want, len) == 0, "%s: bytes differ", file);
	st_close(&f);
	free(want);
}

START_TEST(test_pool_reuse)
{
	struct ckptfs_saver *s = saver(1 << 24, CKPTFS_BP_WAIT, 5000);
	size_t n = 300000, pop;
	float *buf = malloc(n * sizeof(float));
	const void *base = ckptfs__test_pool_base(s);

	ck_assert_ptr_nonnull(base);
	/* Reserved, not populated, before the first save. */
	ck_assert_uint_eq(ckptfs_saver_pool_bytes(s), 0);
	ck_assert_int_eq(save1(s, pathf("a"), buf, n, 1.0f), 0);
	ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
	pop = ckptfs_saver_pool_bytes(s);
	ck_assert_uint_ge(pop, n * sizeof(float));
	ck_assert_uint_lt(pop, n * sizeof(float) + 2 * 65536);
	ck_assert_int_eq(save1(s, pathf("b"), buf, n, 7.0f), 0);
	ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
	/* Same mapping, nothing more populated. */
	ck_assert_ptr_eq(ckptfs__test_pool_base(s), base);
	ck_assert_uint_eq(ckptfs_saver_pool_bytes(s), pop);
	/* A smaller save reuses it too. */
	ck_assert_int_eq(save1(s, pathf("c"), buf, n / 2, 9.0f), 0);
	ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
	ck_assert_ptr_eq(ckptfs__test_pool_base(s), base);
	ck_assert_uint_eq(ckptfs_saver_pool_bytes(s), pop);
	check_w(pathf("a/model-rank00000.safetensors"), n, 1.0f);
	check_w(pathf("b/model-rank00000.safetensors"), n, 7.0f);
	check_w(pathf("c/model-rank00000.safetensors"), n / 2, 9.0f);
	ckptfs_saver_free(s);
	free(buf);
}
END_TEST

START_TEST(test_efbig)
{
	struct ckptfs_saver *s = saver(65536, CKPTFS_BP_WAIT, 5000);
	size_t n = 100000;
	float *buf = malloc(n * sizeof(float));
	char err[512];

	ck_assert_int_eq(save1(s, pathf("big"), buf, n, 0.0f), -EFBIG);
	ck_assert_int_eq(ckptfs_saver_error(s, err, sizeof(err)), -EFBIG);
	/* Both sizes are named: what the snapshot needs and the bound. */
	{
		const char *nd = strstr(err, "needs ");

		ck_assert_msg(nd && strtoull(nd + 6, NULL, 10) >= n * sizeof(float) &&
			      strstr(err, "pool_bytes is 65536") && strstr(err, pathf("big")), "%s", err);
	}
	ck_assert(!exists(pathf("big")));
	ck_assert(!exists(pathf("big.partial")));
	ck_assert_uint_eq(ckptfs_saver_pool_bytes(s), 0);
	/* A save that fits still works afterwards. */
	ck_assert_int_eq(save1(s, pathf("small"), buf, 100, 0.0f), 0);
	ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
	ck_assert_int_eq(ckptfs_saver_error(s, err, sizeof(err)), 0);
	ckptfs_saver_free(s);
	free(buf);
}
END_TEST

START_TEST(test_eexist)
{
	struct ckptfs_saver *s = saver(1 << 20, CKPTFS_BP_WAIT, 5000);
	float buf[16];
	char err[512];

	ck_assert_int_eq(mkdir(pathf("there"), 0755), 0);
	ck_assert_int_eq(save1(s, pathf("there"), buf, 16, 0.0f), -EEXIST);
	ck_assert_int_eq(ckptfs_saver_error(s, err, sizeof(err)), -EEXIST);
	ck_assert_msg(strstr(err, pathf("there")) != NULL, "%s", err);
	ck_assert(!exists(pathf("there.partial")));
	/* A trailing slash names the same directory. */
	ck_assert_int_eq(save1(s, pathf("there/"), buf, 16, 0.0f), -EEXIST);
	ckptfs_saver_free(s);
}
END_TEST

START_TEST(test_bp_fail)
{
	struct ckptfs_saver *s = saver(1 << 20, CKPTFS_BP_FAIL, 5000);
	float buf[64];
	char err[512];

	ckptfs__test_set_write_delay(s, 400);
	ck_assert_int_eq(save1(s, pathf("first"), buf, 64, 1.0f), 0);
	ck_assert_int_eq(ckptfs_save_done(s), 0);
	ck_assert_int_eq(save1(s, pathf("second"), buf, 64, 2.0f), -EBUSY);
	ck_assert_int_eq(ckptfs_saver_error(s, err, sizeof(err)), -EBUSY);
	/* The message names the checkpoint still being written. */
	ck_assert_msg(strstr(err, pathf("first")) != NULL, "%s", err);
	ck_assert(!exists(pathf("second.partial")));
	ck_assert_int_eq(ckptfs_save_wait(s, 10), -ETIMEDOUT);
	ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
	ck_assert_int_eq(ckptfs_save_done(s), 1);
	/* The refused save did not touch the pool the writer was using. */
	check_w(pathf("first/model-rank00000.safetensors"), 64, 1.0f);
	ck_assert_int_eq(save1(s, pathf("second"), buf, 64, 2.0f), 0);
	ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
	check_w(pathf("second/model-rank00000.safetensors"), 64, 2.0f);
	ckptfs_saver_free(s);
}
END_TEST

START_TEST(test_bp_wait)
{
	struct ckptfs_saver *s = saver(1 << 20, CKPTFS_BP_WAIT, 5000);
	float buf[64];
	uint64_t t0;

	ckptfs__test_set_write_delay(s, 300);
	t0 = now_ns();
	ck_assert_int_eq(save1(s, pathf("one"), buf, 64, 1.0f), 0);
	ck_assert(!exists(pathf("one")));
	/* The second save waits until the first is complete, then snapshots. */
	ck_assert_int_eq(save1(s, pathf("two"), buf, 64, 2.0f), 0);
	ck_assert_uint_ge(now_ns() - t0, 300ull * 1000000);
	ck_assert(exists(pathf("one/ckptfs-checkpoint.json")));
	ck_assert(!exists(pathf("two")));
	/* The caller may change its tensor at once. */
	fill(buf, 64, 3.0f);
	ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
	check_w(pathf("one/model-rank00000.safetensors"), 64, 1.0f);
	check_w(pathf("two/model-rank00000.safetensors"), 64, 2.0f);
	/* Freeing a saver with a save in flight finishes that save first. */
	ck_assert_int_eq(save1(s, pathf("three"), buf, 64, 4.0f), 0);
	ckptfs_saver_free(s);
	check_w(pathf("three/model-rank00000.safetensors"), 64, 4.0f);
}
END_TEST

START_TEST(test_missing_rank)
{
	struct rank_ctx r = { .rank = 0, .world = 3, .job_id = 9, .timeout_ms = 300 };

	r.path = pathf("miss");
	rank_main(&r);
	ck_assert_int_eq(r.save_ret, 0);
	ck_assert_int_eq(r.wait_ret, -ETIMEDOUT);
	ck_assert_msg(strstr(r.err, "ranks 1, 2") && strstr(r.err, "timed out") &&
		      strstr(r.err, pathf("miss.partial")), "%s", r.err);
	ck_assert(!exists(pathf("miss")));
	ck_assert(exists(pathf("miss.partial/model-rank00000.safetensors")));
}
END_TEST

static void write_text(const char *p, const char *text)
{
	FILE *f = fopen(p, "w");

	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

START_TEST(test_stale_markers)
{
	struct rank_ctx r[2] = { { .rank = 0 }, { .rank = 1 } };
	pthread_t th[2];
	const char *p = pathf("st");
	char marker[600];
	json_t *mk;

	/* A crashed earlier save (another job) left a done marker of rank 1 with the same seq,
	 * a file of a rank that no longer exists and a temporary file. */
	ck_assert_int_eq(mkdir(pathf("st.partial"), 0755), 0);
	snprintf(marker, sizeof(marker),
		 "{\"format\":\"ckptfs-rank-done\",\"format_version\":1,\"job_id\":\"4\",\"seq\":1,"
		 "\"world\":2,\"rank\":1,\"groups\":[\"model\"],\"files\":[{\"name\":"
		 "\"model-rank00001.safetensors\",\"size\":8}]}");
	write_text(pathf("st.partial/.rank-00001.done"), marker);
	write_text(pathf("st.partial/model-rank00001.safetensors"), "stale!!!");
	write_text(pathf("st.partial/model-rank00007.safetensors"), "stale");
	write_text(pathf("st.partial/.tmp-r00003-model-rank00003.safetensors"), "stale");
	write_text(pathf("st.partial/ckptfs-checkpoint.json"), "{}");
	for (int i = 0; i < 2; i++) {
		r[i].path = p;
		r[i].world = 2;
		r[i].job_id = 5;
		r[i].timeout_ms = 10000;
	}
	ck_assert_int_eq(pthread_create(&th[0], NULL, rank_main, &r[0]), 0);
	/* Rank 1 starts late: rank 0 must ignore the other job's marker and wait. */
	usleep(400 * 1000);
	ck_assert(!exists(p));
	ck_assert_int_eq(pthread_create(&th[1], NULL, rank_main, &r[1]), 0);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 2; i++)
		ck_assert_msg(r[i].save_ret == 0 && r[i].wait_ret == 0, "rank %d: %s", i, r[i].err);
	/* Only this save's files remain. */
	ck_assert_int_eq(count_entries(p), 3);
	ck_assert(exists(pathf("st/model-rank00000.safetensors")));
	mk = load_json(pathf("st/ckptfs-checkpoint.json"));
	ck_assert_str_eq(json_string_value(json_object_get(mk, "job_id")), "5");
	json_decref(mk);
	{
		struct stfile f;
		size_t len;

		st_open(&f, pathf("st/model-rank00001.safetensors"));
		st_tensor(&f, "bias", "F32", (int64_t[]){ 8 }, 1, &len);
		st_close(&f);
	}
}
END_TEST

START_TEST(test_write_error_names_file)
{
	struct ckptfs_saver *s = saver(1 << 20, CKPTFS_BP_WAIT, 5000);
	float buf[16];
	char err[512];

	/* A directory where the file must go: the rename fails. */
	ck_assert_int_eq(mkdir(pathf("bad.partial"), 0755), 0);
	ck_assert_int_eq(mkdir(pathf("bad.partial/model-rank00000.safetensors"), 0755), 0);
	ck_assert_int_eq(mkdir(pathf("bad.partial/model-rank00000.safetensors/x"), 0755), 0);
	ck_assert_int_eq(save1(s, pathf("bad"), buf, 16, 0.0f), 0);
	ck_assert_int_lt(ckptfs_save_wait(s, -1), 0);
	ck_assert_int_lt(ckptfs_saver_error(s, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, pathf("bad.partial/model-rank00000.safetensors: rename")) != NULL,
		      "%s", err);
	ck_assert(!exists(pathf("bad")));
	ckptfs_saver_free(s);
}
END_TEST

/* Each bad descriptor fails with its errno and a message naming the tensor. */
START_TEST(test_validation)
{
	struct ckptfs_saver *s = saver(1 << 20, CKPTFS_BP_WAIT, 5000);
	struct ckptfs_save_args a;
	struct ckptfs_tensor t[2];
	struct ckptfs_blob bl = { ".hidden", "x", 1 };
	float buf[16] = { 0 };
	int64_t sh[2] = { 4, 4 }, g[2] = { 4, 8 }, off[2] = { 0, 6 }, f5[1] = { 5 };
	char err[512];

	char *path = strdup(pathf("v")); /* pathf's buffers are reused */

	args_init(&a, path, 0, 1);
	a.tensors = t;
	a.n_tensors = 1;
#define EXPECT(code, what)                                                                   \
	do {                                                                                 \
		ck_assert_int_eq(ckptfs_save_async(s, &a), code);                            \
		ckptfs_saver_error(s, err, sizeof(err));                                     \
		ck_assert_msg(strstr(err, what) != NULL, "'%s' not in: %s", what, err);      \
		ck_assert(!exists(pathf("v.partial")));                                      \
	} while (0)
	tensor_init(&t[0], NULL, "t.bad", "F33", 2, sh, buf);
	EXPECT(-EINVAL, "tensor 't.bad' (group 'model'): unknown dtype 'F33'");
	tensor_init(&t[0], NULL, "t.box", "F32", 2, sh, buf);
	t[0].global_ndim = 2;
	t[0].global_shape = g;
	t[0].offsets = off;
	EXPECT(-EINVAL, "tensor 't.box' (group 'model'): box of 4 at offset 6 exceeds");
	off[1] = 4;
	t[0].tp_dim = 2;
	EXPECT(-EINVAL, "tensor 't.box' (group 'model'): tp_dim 2");
	t[0].tp_dim = 1;
	a.num_layers = 2;
	t[0].pp = 2;
	EXPECT(-EINVAL, "tensor 't.box' (group 'model'): pp layer 2 >= num_layers 2");
	t[0].pp = 1;
	tensor_init(&t[1], NULL, "t.box", "F32", 2, sh, buf);
	t[1].replica = 1;
	a.n_tensors = 2;
	EXPECT(-EINVAL, "tensor 't.box' (group 'model'): given twice");
	t[1].group = "optim";
	tensor_init(&t[0], NULL, "t.flat", "F32", 1, f5, buf);
	t[0].global_ndim = 2;
	t[0].global_shape = g;
	t[0].flat = 1;
	t[0].flat_start = 30;
	t[0].flat_end = 35;
	EXPECT(-EINVAL, "tensor 't.flat' (group 'model'): flat range [30, 35) outside");
	t[0].flat_start = 3;
	t[0].flat_end = 7;
	EXPECT(-EINVAL, "tensor 't.flat' (group 'model'): 5 elements stored for flat range");
	t[0].flat_end = 8;
	t[0].group = "a/b";
	EXPECT(-EINVAL, "tensor 't.flat': invalid group 'a/b'");
	t[0].group = NULL;
	t[0].data = NULL;
	EXPECT(-EINVAL, "tensor 't.flat' (group 'model'): NULL data");
	t[0].data = buf;
	t[0].device = 0;
	if (!ckptfs_cuda_available())
		EXPECT(-ENODEV, "tensor 't.flat' (group 'model'): device pointer (CUDA device 0)");
	t[0].device = -1;
	a.blobs = &bl;
	a.n_blobs = 1;
	EXPECT(-EINVAL, "blob #0 '.hidden': invalid name");
	bl.name = "model-rank00000.safetensors";
	EXPECT(-EINVAL, "blob 'model-rank00000.safetensors': name used twice");
	{
		/* Its temporary name (.tmp-rRRRRR-NAME) must fit NAME_MAX too: refused here, not
		 * by the writer after the save was accepted. */
		static char longname[250];

		memset(longname, 'a', sizeof(longname) - 1);
		bl.name = longname;
		EXPECT(-EINVAL, "invalid name (a plain file name of 1..243 bytes");
	}
	bl.name = "ok.bin";
	a.manifest_extra = "[1]";
	EXPECT(-EINVAL, "manifest_extra is not a JSON object");
	a.manifest_extra = NULL;
	a.rank = 2;
	a.world = 2;
	EXPECT(-EINVAL, "rank 2 of world 2");
	a.rank = 0;
	a.world = 1;
	/* Now everything is valid. */
	ck_assert_int_eq(ckptfs_save_async(s, &a), 0);
	ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
	ck_assert_msg(count_entries(pathf("v")) == 3, "%d entries", count_entries(pathf("v")));
#undef EXPECT
	ckptfs_saver_free(s);
	free(path);
}
END_TEST

/* A rank whose tensors are all replicas writes no tensor file. */
START_TEST(test_all_replicas)
{
	struct ckptfs_saver *s = saver(1 << 20, CKPTFS_BP_WAIT, 5000);
	struct ckptfs_save_args a;
	struct ckptfs_tensor t;
	float buf[4] = { 0 };
	int64_t sh[1] = { 4 };
	json_t *mk;

	args_init(&a, pathf("rep"), 0, 1);
	tensor_init(&t, NULL, "w", "F32", 1, sh, buf);
	t.replica = 1;
	a.tensors = &t;
	a.n_tensors = 1;
	ck_assert_int_eq(ckptfs_save_async(s, &a), 0);
	ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
	ck_assert_int_eq(count_entries(pathf("rep")), 1);
	mk = load_json(pathf("rep/ckptfs-checkpoint.json"));
	ck_assert_int_eq(json_array_size(json_object_get(mk, "groups")), 0);
	json_decref(mk);
	ckptfs_saver_free(s);
}
END_TEST

/* Several pieces of one global tensor from one rank (a fused QKV's query groups) go to part
 * files, one name per file; the loader reassembles the tensor from them. */
START_TEST(test_repeated_name_parts)
{
	struct ckptfs_saver *s = saver(1 << 20, CKPTFS_BP_WAIT, 5000);
	struct ckptfs_loader *l = NULL;
	struct ckptfs_save_args a;
	struct ckptfs_tensor t[3];
	struct ckptfs_load_req r;
	float full[8 * 2], out[8 * 2];
	int64_t g[2] = { 8, 2 }, sh[2] = { 2, 2 }, o0[2] = { 0, 0 }, o1[2] = { 4, 0 },
		o2[2] = { 6, 0 };
	struct stfile f;
	size_t len;

	fill(full, 16, 1.0f);
	args_init(&a, pathf("parts"), 0, 1);
	tensor_init(&t[0], NULL, "q", "F32", 2, sh, full + 0);
	tensor_init(&t[1], NULL, "q", "F32", 2, sh, full + 8);
	tensor_init(&t[2], NULL, "q", "F32", 2, sh, full + 12);
	for (int i = 0; i < 3; i++) {
		t[i].global_ndim = 2;
		t[i].global_shape = g;
	}
	t[0].offsets = o0;
	t[1].offsets = o1;
	t[2].offsets = o2;
	a.tensors = t;
	a.n_tensors = 3;
	ck_assert_int_eq(ckptfs_save_async(s, &a), 0);
	ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
	ck_assert(exists(pathf("parts/model-rank00000.safetensors")));
	ck_assert(exists(pathf("parts/model-rank00000-1.safetensors")));
	ck_assert(exists(pathf("parts/model-rank00000-2.safetensors")));
	st_open(&f, pathf("parts/model-rank00000-1.safetensors"));
	ck_assert_int_eq(memcmp(st_tensor(&f, "q", "F32", sh, 2, &len), full + 8, 16), 0);
	st_close(&f);

	/* Rows 0-1 and 4-7 were saved: load them back through the loader. */
	ck_assert_int_eq(ckptfs_loader_open(pathf("parts"), NULL, &l), 0);
	memset(&r, 0, sizeof(r));
	r.name = "q";
	r.dtype = "F32";
	r.dst = out;
	r.device = -1;
	r.ndim = 2;
	r.shape = (int64_t[]){ 4, 2 };
	r.offsets = o1;
	ck_assert_int_eq(ckptfs_load(l, &r, 1), 0);
	ck_assert_int_eq(memcmp(out, full + 8, 8 * sizeof(float)), 0);
	ckptfs_loader_free(l);

	/* The same part twice is refused. */
	t[2].offsets = o1;
	a.path = pathf("parts2");
	ck_assert_int_eq(ckptfs_save_async(s, &a), -EINVAL);
	ckptfs_saver_free(s);
}
END_TEST

/* A process killed mid-save leaves no PATH; the next save of the same path completes and
 * removes the dead save's leftovers. */
START_TEST(test_crash_mid_save)
{
	float buf[64];
	pid_t pid = fork();
	int st;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct ckptfs_saver *s = saver(1 << 20, CKPTFS_BP_WAIT, 5000);

		ckptfs__test_set_write_delay(s, 5000);
		save1(s, pathf("cr"), buf, 64, 1.0f);
		ckptfs_save_wait(s, -1);
		_exit(0);
	}
	/* Kill it while it writes (its writer sleeps 5 s before the file). */
	for (int i = 0; i < 1000 && !exists(pathf("cr.partial")); i++)
		usleep(10 * 1000);
	usleep(100 * 1000);
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	ck_assert(!exists(pathf("cr")));
	ck_assert(exists(pathf("cr.partial")));
	write_text(pathf("cr.partial/.tmp-r00000-model-rank00000.safetensors"), "torn");
	{
		struct ckptfs_saver *s = saver(1 << 20, CKPTFS_BP_WAIT, 5000);

		ck_assert_int_eq(save1(s, pathf("cr"), buf, 64, 2.0f), 0);
		ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
		ckptfs_saver_free(s);
	}
	ck_assert_int_eq(count_entries(pathf("cr")), 2);
	check_w(pathf("cr/model-rank00000.safetensors"), 64, 2.0f);
}
END_TEST

/* Repeated saves of one layout reuse the headers: new data pointers and bytes must be written,
 * and any change of the layout must give new metadata. */
START_TEST(test_repeat_layout)
{
	struct ckptfs_saver *s = saver(1 << 22, CKPTFS_BP_WAIT, 5000);
	struct ckptfs_save_args a;
	struct ckptfs_tensor t[2];
	struct ckptfs_blob bl = { "extra.bin", NULL, 8 };
	static float b1[64], b2[64];
	int64_t sh[1] = { 64 }, g[1] = { 128 }, off[1] = { 64 };
	struct stfile f;
	size_t len;
	const char *d;
	char *x;

	args_init(&a, pathf("r1"), 0, 1);
	tensor_init(&t[0], NULL, "w", "F32", 1, sh, b1);
	t[0].global_ndim = 1;
	t[0].global_shape = g;
	t[0].offsets = off;
	tensor_init(&t[1], "optim", "m", "F32", 1, sh, b1);
	a.tensors = t;
	a.n_tensors = 2;
	a.blobs = &bl;
	a.n_blobs = 1;
	fill(b1, 64, 1.0f);
	bl.data = "11111111";
	ck_assert_int_eq(ckptfs_save_async(s, &a), 0);
	ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
	/* Same layout, other buffers. */
	fill(b2, 64, 50.0f);
	t[0].data = b2;
	t[1].data = b2;
	bl.data = "22222222";
	a.path = pathf("r2");
	a.seq = 2;
	ck_assert_int_eq(ckptfs_save_async(s, &a), 0);
	ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
	st_open(&f, pathf("r2/model-rank00000.safetensors"));
	d = st_tensor(&f, "w", "F32", sh, 1, &len);
	ck_assert_int_eq(memcmp(d, b2, sizeof(b2)), 0);
	st_close(&f);
	st_open(&f, pathf("r2/optim-rank00000.safetensors"));
	d = st_tensor(&f, "m", "F32", sh, 1, &len);
	ck_assert_int_eq(memcmp(d, b2, sizeof(b2)), 0);
	st_close(&f);
	x = read_all(pathf("r2/extra.bin"), &len);
	ck_assert_int_eq(memcmp(x, "22222222", 8), 0);
	free(x);
	/* Same names and shapes, another offset: the metadata follows. */
	off[0] = 0;
	a.path = pathf("r3");
	ck_assert_int_eq(ckptfs_save_async(s, &a), 0);
	ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
	st_open(&f, pathf("r3/model-rank00000.safetensors"));
	ck_assert_ptr_null(json_object_get(json_object_get(json_object_get(f.meta, "tensors"), "w"),
					   "offsets"));
	st_close(&f);
	/* A NULL data pointer is still refused on a reused layout. */
	t[1].data = NULL;
	a.path = pathf("r4");
	ck_assert_int_eq(ckptfs_save_async(s, &a), -EINVAL);
	ckptfs_saver_free(s);
}
END_TEST

/* The snapshot's host copies split across threads (CKPTFS_COPY_THREADS): big tensors cut into
 * units, small ones merged, every byte where it belongs. */
START_TEST(test_copy_threads)
{
	struct ckptfs_saver *s;
	struct ckptfs_save_args a;
	struct ckptfs_tensor t[40];
	char names[40][16];
	int64_t sh[40][1];
	uint8_t *buf[40];
	struct stfile f;

	setenv("CKPTFS_COPY_THREADS", "3", 1);
	s = saver((size_t)128 << 20, CKPTFS_BP_WAIT, 5000);
	unsetenv("CKPTFS_COPY_THREADS");
	args_init(&a, pathf("thr"), 0, 1);
	for (int i = 0; i < 40; i++) {
		/* Two of 20 MiB + a few bytes, the rest small and odd. */
		size_t n = i < 2 ? ((size_t)20 << 20) + 13 + (size_t)i : (size_t)(i * 977 + 1);

		buf[i] = malloc(n);
		for (size_t k = 0; k < n; k++)
			buf[i][k] = (uint8_t)(k * 7 + (size_t)i * 13 + (k >> 12));
		snprintf(names[i], sizeof(names[i]), "t%02d", i);
		sh[i][0] = (int64_t)n;
		tensor_init(&t[i], NULL, names[i], "U8", 1, sh[i], buf[i]);
	}
	a.tensors = t;
	a.n_tensors = 40;
	for (int rep = 0; rep < 2; rep++) {
		a.path = pathf("thr%d", rep);
		ck_assert_int_eq(ckptfs_save_async(s, &a), 0);
		ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
		st_open(&f, pathf("thr%d/model-rank00000.safetensors", rep));
		for (int i = 0; i < 40; i++) {
			size_t len;
			const char *d = st_tensor(&f, names[i], "U8", sh[i], 1, &len);

			ck_assert_msg(memcmp(d, buf[i], len) == 0, "tensor %s differs", names[i]);
		}
		st_close(&f);
		for (int i = 0; i < 40; i++)
			buf[i][0] ^= 0xff;
	}
	for (int i = 0; i < 40; i++)
		free(buf[i]);
	ckptfs_saver_free(s);
}
END_TEST

/* Scalars, empty tensors and sub-byte dtypes. */
START_TEST(test_odd_shapes)
{
	struct ckptfs_saver *s = saver(1 << 20, CKPTFS_BP_WAIT, 5000);
	struct ckptfs_save_args a;
	struct ckptfs_tensor t[3];
	double sc = 3.5;
	int64_t zero[2] = { 0, 4 }, four[1] = { 4 }, three[1] = { 3 };
	uint8_t f4[2] = { 0x12, 0x34 };
	struct stfile f;
	size_t len;
	const char *d;

	args_init(&a, pathf("odd"), 0, 1);
	tensor_init(&t[0], NULL, "step", "F64", 0, NULL, &sc);
	tensor_init(&t[1], NULL, "empty", "F32", 2, zero, NULL);
	tensor_init(&t[2], NULL, "packed", "F4", 1, four, f4);
	a.tensors = t;
	a.n_tensors = 3;
	ck_assert_int_eq(ckptfs_save_async(s, &a), 0);
	ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
	st_open(&f, pathf("odd/model-rank00000.safetensors"));
	d = st_tensor(&f, "step", "F64", NULL, 0, &len);
	ck_assert_uint_eq(len, 8);
	ck_assert_int_eq(memcmp(d, &sc, 8), 0);
	st_tensor(&f, "empty", "F32", zero, 2, &len);
	ck_assert_uint_eq(len, 0);
	d = st_tensor(&f, "packed", "F4", four, 1, &len);
	ck_assert_uint_eq(len, 2);
	ck_assert_int_eq(memcmp(d, f4, 2), 0);
	st_close(&f);
	/* 3 elements of 4 bits are not whole bytes. */
	t[2].shape = three;
	a.path = pathf("odd2");
	ck_assert_int_eq(ckptfs_save_async(s, &a), -EINVAL);
	ckptfs_saver_free(s);
}
END_TEST

/* wait_commit: a rank's save is done when the checkpoint is complete (default), or, without
 * it, when its own files and marker are durable; a rank whose rank 0 never commits times out
 * saying so. */
START_TEST(test_wait_commit)
{
	struct rank_ctx r[2] = { { .rank = 0 }, { .rank = 1 } };
	struct rank_ctx lone = { .rank = 1, .world = 2, .job_id = 5, .timeout_ms = 300 };
	pthread_t th[2];

	for (int i = 0; i < 2; i++) {
		r[i].path = pathf("wc");
		r[i].world = 2;
		r[i].job_id = 5;
		r[i].timeout_ms = 10000;
	}
	r[0].delay_ms = 500;
	r[1].no_wait_commit = 1;
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, rank_main, &r[i]), 0);
	pthread_join(th[1], NULL);
	ck_assert_msg(r[1].wait_ret == 0, "%s", r[1].err);
	/* Rank 1 is done, rank 0 is still writing: no checkpoint yet. */
	ck_assert(!exists(pathf("wc")));
	ck_assert(exists(pathf("wc.partial/.rank-00001.done")));
	pthread_join(th[0], NULL);
	ck_assert_msg(r[0].wait_ret == 0, "%s", r[0].err);
	ck_assert(exists(pathf("wc/ckptfs-checkpoint.json")));
	ck_assert(!exists(pathf("wc/.rank-00001.done")));

	lone.path = pathf("lone");
	rank_main(&lone);
	ck_assert_int_eq(lone.wait_ret, -ETIMEDOUT);
	ck_assert_msg(strstr(lone.err, "not complete after 300 ms") != NULL, "%s", lone.err);
	ck_assert(!exists(pathf("lone")));
}
END_TEST

/* The library's threads (writers, host copy workers) block every signal, so that a signal for
 * the process reaches one of the caller's threads (where a trainer's handler runs) and never
 * interrupts a write. */
START_TEST(test_threads_block_signals)
{
	struct ckptfs_saver *s;
	pid_t self = (pid_t)syscall(SYS_gettid);
	DIR *d;
	struct dirent *de;
	int others = 0;

	setenv("CKPTFS_COPY_THREADS", "3", 1);
	s = saver(1 << 20, CKPTFS_BP_WAIT, 5000);
	unsetenv("CKPTFS_COPY_THREADS");
	d = opendir("/proc/self/task");
	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d))) {
		char p[300], line[256];
		unsigned long long blk = 0;
		int found = 0;
		FILE *f;

		if (de->d_name[0] == '.' || atoi(de->d_name) == self)
			continue;
		snprintf(p, sizeof(p), "/proc/self/task/%s/status", de->d_name);
		f = fopen(p, "r");
		if (!f)
			continue; /* a thread that just ended */
		while (fgets(line, sizeof(line), f))
			if (sscanf(line, "SigBlk: %llx", &blk) == 1)
				found = 1;
		fclose(f);
		ck_assert_msg(found, "%s: no SigBlk line", p);
		ck_assert_msg((blk & (1ull << (SIGINT - 1))) && (blk & (1ull << (SIGTERM - 1))) &&
			      (blk & (1ull << (SIGUSR1 - 1))),
			      "thread %s of the library does not block signals (SigBlk %llx)",
			      de->d_name, blk);
		others++;
	}
	closedir(d);
	/* 2 writers and 2 host copy workers. */
	ck_assert_int_ge(others, 4);
	ckptfs_saver_free(s);
}
END_TEST

/* A write_bytes too large to round to 4 KiB without wrapping is capped, not taken as 0. */
START_TEST(test_write_bytes_huge)
{
	struct ckptfs_saver_opts o;
	struct ckptfs_saver *s = NULL;
	float buf[64];

	ckptfs_saver_opts_init(&o);
	o.pool_bytes = 1 << 20;
	o.write_bytes = SIZE_MAX;
	ck_assert_int_eq(ckptfs_saver_new(&o, &s), 0);
	ck_assert_int_eq(save1(s, pathf("wb"), buf, 64, 5.0f), 0);
	ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
	check_w(pathf("wb/model-rank00000.safetensors"), 64, 5.0f);
	ckptfs_saver_free(s);
}
END_TEST

/* Sizes whose sum wraps 64 bits are refused, never laid out over a small pool: sixteen F64
 * tensors of 2^57 elements are 2^64 bytes together; a blob of nearly 2^64 bytes wraps the
 * rounding of the layout to a page. */
START_TEST(test_size_overflow)
{
	struct ckptfs_saver *s = saver(1 << 20, CKPTFS_BP_WAIT, 5000);
	static const int64_t sh[1] = { (int64_t)1 << 57 };
	static double dummy[8];
	struct ckptfs_save_args a;
	struct ckptfs_tensor t[16];
	char names[16][16], err[512];
	struct ckptfs_blob b = { "huge.bin", dummy, SIZE_MAX - 100 };
	int ret;

	args_init(&a, pathf("ovf"), 0, 1);
	for (int i = 0; i < 16; i++) {
		snprintf(names[i], sizeof(names[i]), "t%d", i);
		tensor_init(&t[i], NULL, names[i], "F64", 1, sh, dummy);
	}
	a.tensors = t;
	a.n_tensors = 16;
	ret = ckptfs_save_async(s, &a);
	ck_assert_msg(ret == -EFBIG || ret == -EOVERFLOW, "%d", ret);
	ck_assert_int_eq(ckptfs_saver_error(s, err, sizeof(err)), ret);
	ck_assert_msg(strstr(err, "model-rank00000.safetensors") != NULL, "%s", err);
	a.n_tensors = 0;
	a.blobs = &b;
	a.n_blobs = 1;
	ck_assert_int_eq(ckptfs_save_async(s, &a), -EFBIG);
	ck_assert_int_eq(ckptfs_saver_error(s, err, sizeof(err)), -EFBIG);
	ck_assert_msg(strstr(err, "huge.bin") != NULL, "%s", err);
	ck_assert(!exists(pathf("ovf")));
	ckptfs_saver_free(s);
}
END_TEST

/* A forked child (a DataLoader worker) that never calls the library runs and exits normally
 * while the parent's save is being written; a child that does call it (a trainer's exit
 * handler freeing the saver) gets -ECHILD at once instead of hanging on the parent's threads. */
/*
 * In a sanitizer build the child neither allocates nor runs exit handlers: GCC 12's
 * AddressSanitizer runtime (Debian 12) has no fork handler, so its allocator lock (taken by
 * malloc, free and LeakSanitizer's check at exit) may be held by a parent thread at the fork
 * and never released in the child, whatever the library does.  The library's own calls in
 * the child take no lock and allocate nothing, and are checked in both builds.
 */
#if defined(__SANITIZE_ADDRESS__)
#define CHILD_USES_ALLOCATOR 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CHILD_USES_ALLOCATOR 0
#endif
#endif
#ifndef CHILD_USES_ALLOCATOR
#define CHILD_USES_ALLOCATOR 1
#endif

static int fork_and_wait(struct ckptfs_saver *s, int use_saver)
{
	pid_t pid = fork();
	int st = 0, done = 0;

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		char line[600];
		int ok = 1;

		if (CHILD_USES_ALLOCATOR) {
			char *p = malloc(1 << 20);

			ok = p != NULL;
			snprintf(line, sizeof(line), "%p", (void *)p);
			free(p);
		}
		if (use_saver) {
			ok = ok && ckptfs_save_done(s) == 1;
			ok = ok && ckptfs_save_wait(s, -1) == -ECHILD;
			ok = ok && ckptfs_saver_error(s, line, sizeof(line)) == -ECHILD &&
			     strstr(line, "forked child") != NULL;
			ckptfs_saver_free(s);
		}
		if (CHILD_USES_ALLOCATOR)
			exit(ok ? 0 : 1);
		_exit(ok ? 0 : 1);
	}
	/* 20 s: a hang, not a slow exit on a loaded machine or under a sanitizer. */
	for (int i = 0; i < 2000 && !done; i++) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			done = 1;
		else
			usleep(10 * 1000);
	}
	if (!done) {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
		return -1;
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

START_TEST(test_fork_child)
{
	struct ckptfs_saver *s = saver(1 << 20, CKPTFS_BP_WAIT, 5000);
	float buf[64];
	int r;

	ckptfs__test_set_write_delay(s, 300);
	ck_assert_int_eq(save1(s, pathf("fk"), buf, 64, 3.0f), 0);
	r = fork_and_wait(s, 0);
	ck_assert_msg(r == 0, "a child that does not use the saver: %d (-1: hung)", r);
	r = fork_and_wait(s, 1);
	ck_assert_msg(r == 0, "a child that uses the saver: %d (-1: hung)", r);
	ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
	check_w(pathf("fk/model-rank00000.safetensors"), 64, 3.0f);
	/* Also with no save in flight (the writers wait for work). */
	r = fork_and_wait(s, 1);
	ck_assert_msg(r == 0, "a child that uses the idle saver: %d (-1: hung)", r);
	ckptfs_saver_free(s);
}
END_TEST

/* Nothing that no rank listed reaches the checkpoint: an empty directory in PATH.partial is
 * removed by the commit, a non-empty one fails it (naming it) and PATH is not created; the
 * save retried at the same path (a new seq) after the caller removed it completes. */
START_TEST(test_stale_dirs_and_retry)
{
	struct ckptfs_saver *s = saver(1 << 20, CKPTFS_BP_WAIT, 5000);
	float buf[16];
	char err[512];

	ck_assert_int_eq(mkdir(pathf("sd.partial"), 0755), 0);
	ck_assert_int_eq(mkdir(pathf("sd.partial/empty"), 0755), 0);
	ck_assert_int_eq(save1(s, pathf("sd"), buf, 16, 1.0f), 0);
	ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
	ck_assert_int_eq(count_entries(pathf("sd")), 2);

	ck_assert_int_eq(mkdir(pathf("sf.partial"), 0755), 0);
	ck_assert_int_eq(mkdir(pathf("sf.partial/junk"), 0755), 0);
	write_text(pathf("sf.partial/junk/x"), "stale");
	ck_assert_int_eq(save1(s, pathf("sf"), buf, 16, 2.0f), 0);
	ck_assert_int_lt(ckptfs_save_wait(s, -1), 0);
	ck_assert_int_lt(ckptfs_saver_error(s, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, pathf("sf.partial/junk")) != NULL, "%s", err);
	ck_assert(!exists(pathf("sf")));
	rm_rf(pathf("sf.partial/junk"));
	{
		struct ckptfs_save_args a;
		struct ckptfs_tensor t;
		int64_t sh[1] = { 16 };

		fill(buf, 16, 3.0f);
		args_init(&a, pathf("sf"), 0, 1);
		a.seq = 2;
		tensor_init(&t, NULL, "w", "F32", 1, sh, buf);
		a.tensors = &t;
		a.n_tensors = 1;
		ck_assert_int_eq(ckptfs_save_async(s, &a), 0);
	}
	ck_assert_int_eq(ckptfs_save_wait(s, -1), 0);
	ck_assert_int_eq(count_entries(pathf("sf")), 2);
	check_w(pathf("sf/model-rank00000.safetensors"), 16, 3.0f);
	ckptfs_saver_free(s);
}
END_TEST

/* A rank whose save fails tells the others: rank 0 fails at once when rank 1 cannot write its
 * file, and rank 1 (waiting for the commit) fails at once when rank 0 cannot; each names the
 * failed rank and its file, long before the commit timeout. */
START_TEST(test_failure_propagates)
{
	for (int bad = 0; bad < 2; bad++) {
		struct rank_ctx r[2] = { { .rank = 0 }, { .rank = 1 } };
		pthread_t th[2];
		char p[4200], f[4400], want[300];
		uint64_t t0;

		snprintf(p, sizeof(p), "%s", pathf("fp%d", bad));
		snprintf(f, sizeof(f), "%s.partial", p);
		ck_assert_int_eq(mkdir(f, 0755), 0);
		/* A non-empty directory where the failing rank's file must go: its rename fails. */
		snprintf(f, sizeof(f), "%s.partial/model-rank%05d.safetensors", p, bad);
		ck_assert_int_eq(mkdir(f, 0755), 0);
		snprintf(f, sizeof(f), "%s.partial/model-rank%05d.safetensors/x", p, bad);
		ck_assert_int_eq(mkdir(f, 0755), 0);
		for (int i = 0; i < 2; i++) {
			r[i].path = p;
			r[i].world = 2;
			r[i].job_id = 11;
			r[i].timeout_ms = 20000;
		}
		t0 = now_ns();
		for (int i = 0; i < 2; i++)
			ck_assert_int_eq(pthread_create(&th[i], NULL, rank_main, &r[i]), 0);
		for (int i = 0; i < 2; i++)
			pthread_join(th[i], NULL);
		ck_assert_msg(now_ns() - t0 < 10ull * 1000000000, "failure took %llu ms to reach "
			      "the other rank", (unsigned long long)((now_ns() - t0) / 1000000));
		snprintf(want, sizeof(want), "model-rank%05d.safetensors: rename", bad);
		for (int i = 0; i < 2; i++) {
			ck_assert_int_eq(r[i].save_ret, 0);
			ck_assert_int_lt(r[i].wait_ret, 0);
			ck_assert_msg(strstr(r[i].err, want) != NULL, "rank %d: %s", i, r[i].err);
			if (i != bad)
				ck_assert_msg(strstr(r[i].err, bad ? "rank 1 failed" :
						     "rank 0 failed the save") != NULL, "rank %d: %s",
					      i, r[i].err);
		}
		ck_assert(!exists(p));
	}
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("tsave");
	TCase *tc = tcase_create("save");

	tcase_add_unchecked_fixture(tc, base_setup, base_teardown);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_version);
	tcase_add_test(tc, test_world1_files);
	tcase_add_test(tc, test_world2);
	tcase_add_test(tc, test_pool_reuse);
	tcase_add_test(tc, test_efbig);
	tcase_add_test(tc, test_eexist);
	tcase_add_test(tc, test_bp_fail);
	tcase_add_test(tc, test_bp_wait);
	tcase_add_test(tc, test_missing_rank);
	tcase_add_test(tc, test_stale_markers);
	tcase_add_test(tc, test_write_error_names_file);
	tcase_add_test(tc, test_validation);
	tcase_add_test(tc, test_all_replicas);
	tcase_add_test(tc, test_repeated_name_parts);
	tcase_add_test(tc, test_crash_mid_save);
	tcase_add_test(tc, test_repeat_layout);
	tcase_add_test(tc, test_copy_threads);
	tcase_add_test(tc, test_odd_shapes);
	tcase_add_test(tc, test_wait_commit);
	tcase_add_test(tc, test_threads_block_signals);
	tcase_add_test(tc, test_write_bytes_huge);
	tcase_add_test(tc, test_size_overflow);
	tcase_add_test(tc, test_fork_child);
	tcase_add_test(tc, test_stale_dirs_and_retry);
	tcase_add_test(tc, test_failure_propagates);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(suite());
	int nf;

	srunner_run_all(sr, CK_NORMAL);
	nf = srunner_ntests_failed(sr);
	srunner_free(sr);
	return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
