/* SPDX-License-Identifier: MIT */
/*
 * check_tsave.c - unit tests for the save half of libckptfs (core/trainer): the pool (reuse,
 * bound), the files written (header, sharding metadata, bytes; blobs; replicas skipped), the
 * checkpoint directory protocol (world 1 and 2, a missing rank, stale markers, EEXIST) and
 * back-pressure.  Every test works in its own temporary directory under $TMPDIR (or /tmp)
 * and, like every Check test, in its own forked process.
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
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "trainer/ckptfs.h"
#include "trainer/trainer_int.h"

/* ---- helpers ----------------------------------------------------------------------------- */

static char tmp_root[1024];

static void rm_rf(const char *p)
{
	char cmd[8300];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", p);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", p);
}

static void setup(void)
{
	const char *t = getenv("TMPDIR");

	snprintf(tmp_root, sizeof(tmp_root), "%s/tsave-XXXXXX", t && *t ? t : "/tmp");
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
	uint64_t job_id;
	int save_ret, wait_ret;
	char err[512];
};

static void *rank_main(void *arg)
{
	struct rank_ctx *r = arg;
	struct ckptfs_saver *s = saver(1 << 22, CKPTFS_BP_WAIT, r->timeout_ms);
	struct ckptfs_save_args a;
	struct ckptfs_tensor t[2];
	float w[8];
	int64_t sh[1] = { 8 }, g[1] = { 16 }, off[1];

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
	const char *p = pathf("w2");
	struct stfile f;
	json_t *mk;
	size_t len;

	for (int i = 0; i < 2; i++) {
		r[i].path = p;
		r[i].world = 2;
		r[i].job_id = 5;
		r[i].timeout_ms = 10000;
	}
	/* Rank 1 is slow: rank 0 must wait for its marker. */
	r[1].delay_ms = 400;
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, rank_main, &r[i]), 0);
	usleep(200 * 1000);
	ck_assert(!exists(p));
	ck_assert(exists(pathf("w2.partial/model-rank00000.safetensors")));
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

static Suite *suite(void)
{
	Suite *s = suite_create("tsave");
	TCase *tc = tcase_create("save");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_version);
	tcase_add_test(tc, test_world1_files);
	tcase_add_test(tc, test_world2);
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
