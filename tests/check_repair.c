/* SPDX-License-Identifier: MIT */
/*
 * check_repair.c - unit tests of ckpt_store_repair (store.h): an intact
 * store is left as it is; a damaged or missing index is rebuilt from the
 * metadata log with every file back; without a log, the engine's salvage
 * rebuilds a damaged MANIFEST; and the record-level rules of the second
 * step (repair_ns.c): chunk entries missing or pointing at the wrong
 * record re-pointed from the packs, files without their content removed
 * and listed by path, unreachable inodes linked into /lost+found, counts
 * set right.  Every repaired store must then pass fsck.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"
#include "meta/engine.h"
#include "meta/records.h"
#include "store/file.h"
#include "store/store.h"
#include "testlib.h"

static char tdir[96];
static char spath[128];

static void setup(void)
{
	tl_test_dir(tdir, sizeof(tdir));
	snprintf(spath, sizeof(spath), "%s/store", tdir);
}

static void teardown(void)
{
	tl_dir_remove(tdir);
}

/* What a repair reported. */
struct seen {
	int notes, fixed, lost;
	char lost_paths[8][128];
	char last[1024];
};

static void record(void *ud, enum ckpt_repair_kind kind, const char *path, const char *what)
{
	struct seen *s = ud;

	snprintf(s->last, sizeof(s->last), "%s: %s", path ? path : "", what);
	if (kind == CKPT_REPAIR_NOTE)
		s->notes++;
	else if (kind == CKPT_REPAIR_FIXED)
		s->fixed++;
	else {
		if (s->lost < 8)
			snprintf(s->lost_paths[s->lost], sizeof(s->lost_paths[0]), "%s", path);
		s->lost++;
	}
}

static bool was_lost(const struct seen *s, const char *path)
{
	for (int i = 0; i < s->lost && i < 8; i++)
		if (!strcmp(s->lost_paths[i], path))
			return true;
	return false;
}

static struct ckpt_repair_stats repair(struct seen *seen)
{
	struct ckpt_repair_stats st;
	char err[1024] = "";

	memset(seen, 0, sizeof(*seen));
	ck_assert_msg(ckpt_store_repair(spath, record, seen, &st, err, sizeof(err)) == 0, "%s",
		      err);
	return st;
}

static void fsck_report(void *ud, const char *path, const char *what)
{
	fprintf(stderr, "fsck: %s: %s\n", path ? path : "-", what);
}

static void assert_fsck_clean(void)
{
	struct ckpt_store_opts o;
	ckpt_store *s;

	ckpt_store_opts_init(&o);
	o.mode = CKPT_STORE_RO;
	s = tl_store_open(spath, &o);
	ck_assert_int_eq(ckpt_store_fsck(s, fsck_report, NULL), 0);
	ckpt_store_free(s);
}

/* The file set: /a (1 MiB + 13 random bytes), /d/b (300 KiB), /d/e/c (5
 * bytes), /z (the same bytes as /a), /l -> d. */
#define A_LEN ((1u << 20) + 13)
#define B_LEN (300u << 10)

struct fileset {
	uint64_t a, b, c, z, d, e;
};

static struct fileset make_files(void)
{
	ckpt_store *s = tl_store_create(spath);
	uint8_t *a = tl_random_buf(A_LEN, 1), *b = tl_random_buf(B_LEN, 2);
	struct fileset f;
	struct ckpt_inode in;
	ckpt_pool *pool;

	ck_assert_int_eq(ckpt_pool_new(1, &pool), 0);
	f.d = tl_mknode(s, CKPT_ROOT_INO, "d", S_IFDIR | 0755);
	f.e = tl_mknode(s, f.d, "e", S_IFDIR | 0755);
	f.a = tl_write_file(s, pool, CKPT_ROOT_INO, "a", a, A_LEN);
	f.b = tl_write_file(s, pool, f.d, "b", b, B_LEN);
	f.c = tl_write_file(s, pool, f.e, "c", (const uint8_t *)"hello", 5);
	f.z = tl_write_file(s, pool, CKPT_ROOT_INO, "z", a, A_LEN);
	ck_assert_int_eq(ckpt_store_mknode(s, CKPT_ROOT_INO, "l", S_IFLNK | 0777, 0, 0, "d", &in),
			 0);
	ckpt_pool_free(pool);
	ckpt_store_free(s);
	free(a);
	free(b);
	return f;
}

static ckpt_store *open_rw(void)
{
	struct ckpt_store_opts o;

	ckpt_store_opts_init(&o);
	o.mode = CKPT_STORE_RW;
	return tl_store_open(spath, &o);
}

static uint64_t lookup(ckpt_store *s, uint64_t dir, const char *name)
{
	struct ckpt_inode in;
	int r = ckpt_store_lookup(s, dir, name, &in);

	return r == 0 ? in.ino : 0;
}

/* The file at ino holds the expected bytes. */
static void assert_content(ckpt_store *s, uint64_t ino, size_t len, uint64_t seed,
			   const char *literal)
{
	size_t n = 0;
	uint8_t *got = tl_read_file(s, ino, &n), *want;

	ck_assert_uint_eq(n, len);
	want = literal ? (uint8_t *)strdup(literal) : tl_random_buf(len, seed);
	ck_assert(memcmp(got, want, len) == 0);
	free(got);
	free(want);
}

static void assert_all(ckpt_store *s, const struct fileset *f)
{
	char *t = NULL;

	ck_assert_uint_eq(lookup(s, CKPT_ROOT_INO, "a"), f->a);
	assert_content(s, f->a, A_LEN, 1, NULL);
	assert_content(s, f->z, A_LEN, 1, NULL);
	assert_content(s, f->b, B_LEN, 2, NULL);
	assert_content(s, f->c, 5, 0, "hello");
	ck_assert_int_eq(ckpt_store_readlink(s, lookup(s, CKPT_ROOT_INO, "l"), &t), 0);
	ck_assert_str_eq(t, "d");
	free(t);
}

/* Flip a byte in the middle of every non-empty file of STORE/index whose
 * name contains part; how many. */
static int damage_index(const char *part)
{
	char dir[160], p[512];
	struct dirent *de;
	DIR *d;
	int n = 0;

	snprintf(dir, sizeof(dir), "%s/index", spath);
	d = opendir(dir);
	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d))) {
		struct stat st;
		uint8_t b;
		int fd;

		if (!strstr(de->d_name, part))
			continue;
		snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
		ck_assert_int_eq(stat(p, &st), 0);
		if (st.st_size == 0)
			continue;
		fd = open(p, O_RDWR);
		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(pread(fd, &b, 1, st.st_size / 2), 1);
		b ^= 0x20;
		ck_assert_int_eq(pwrite(fd, &b, 1, st.st_size / 2), 1);
		close(fd);
		n++;
	}
	closedir(d);
	return n;
}

START_TEST(test_intact)
{
	struct fileset f = make_files();
	struct ckpt_repair_stats st;
	struct seen seen;
	ckpt_store *s;

	st = repair(&seen);
	ck_assert(!st.index_damaged && !st.index_replaced && !st.log_damaged);
	ck_assert_uint_eq(st.files_lost, 0);
	ck_assert_uint_eq(st.fixed, 0);
	ck_assert_int_eq(seen.fixed + seen.lost, 0);
	s = open_rw();
	assert_all(s, &f);
	ckpt_store_free(s);
	assert_fsck_clean();
	/* and it refuses a store in use */
	{
		char err[512];
		s = open_rw();
		ck_assert_int_eq(ckpt_store_repair(spath, NULL, NULL, &st, err, sizeof(err)), -EBUSY);
		ck_assert_ptr_nonnull(strstr(err, spath));
		ckpt_store_free(s);
	}
}
END_TEST

/* _i: 0 every table damaged, 1 the MANIFEST damaged, 2 the index gone */
START_TEST(test_index_rebuilt)
{
	struct fileset f = make_files();
	struct ckpt_repair_stats st;
	struct ckpt_store_opts o;
	struct seen seen;
	char err[1024] = "", p[256];
	ckpt_store *s = NULL;

	if (_i == 0) {
		ck_assert_int_gt(damage_index(".sst"), 0);
	} else if (_i == 1) {
		ck_assert_int_eq(damage_index("MANIFEST"), 1);
	} else {
		char cmd[512];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s/index'", spath);
		ck_assert_int_eq(system(cmd), 0);
	}
	/* the store does not open (or not whole) until repaired */
	ckpt_store_opts_init(&o);
	o.mode = CKPT_STORE_RW;
	if (ckpt_store_open(spath, &o, &s, err, sizeof(err)) == 0) {
		ck_assert_int_eq(_i, 0); /* tables are read on demand */
		ckpt_store_free(s);
	} else if (_i != 2) {
		ck_assert_msg(strstr(err, "ckpt repair"), "%s", err);
	}
	st = repair(&seen);
	ck_assert(st.index_damaged && st.index_replaced && !st.salvaged);
	ck_assert_uint_eq(st.files_lost, 0);
	if (_i != 2) {
		snprintf(p, sizeof(p), "%s/index.damaged.1", spath);
		ck_assert_int_eq(access(p, F_OK), 0);
	}
	s = open_rw();
	assert_all(s, &f);
	ckpt_store_free(s);
	assert_fsck_clean();
	/* repaired again: nothing left to do */
	st = repair(&seen);
	ck_assert(!st.index_damaged && !st.log_damaged && st.fixed == 0);
}
END_TEST

START_TEST(test_salvage_without_log)
{
	struct fileset f = make_files();
	struct ckpt_repair_stats st;
	struct seen seen;
	char cmd[512];
	ckpt_store *s;

	snprintf(cmd, sizeof(cmd), "rm -rf '%s/metalog'", spath);
	ck_assert_int_eq(system(cmd), 0);
	ck_assert_int_eq(damage_index("MANIFEST"), 1);
	st = repair(&seen);
	ck_assert(st.index_damaged && st.index_replaced && st.salvaged && st.log_damaged);
	ck_assert_uint_eq(st.files_lost, 0);
	s = open_rw();
	assert_all(s, &f);
	ckpt_store_free(s);
	assert_fsck_clean();
}
END_TEST

static void txn_del(ckpt_engine *e, const uint8_t *k, size_t kl)
{
	ckpt_txn *t;

	ck_assert_int_eq(ckpt_txn_begin(e, &t), 0);
	ck_assert_int_eq(ckpt_txn_delete(t, k, kl), 0);
	ck_assert_int_eq(ckpt_txn_commit(t, true), 0);
}

/* The first chunk of file ino. */
static ckpt_digest first_chunk(ckpt_store *s, uint64_t ino)
{
	struct ckpt_extent_list *l = NULL;
	ckpt_digest d;

	ck_assert_int_eq(ckpt_store_load_extents(s, ino, &l), 0);
	ck_assert_uint_gt(l->n, 0);
	d = l->v[0].digest;
	ckpt_extent_list_free(l);
	return d;
}

START_TEST(test_records_checked)
{
	struct fileset f = make_files();
	struct ckpt_repair_stats st;
	struct seen seen;
	uint8_t key[CKPT_KEY_MAX], val[CKPT_CHUNK_REC_LEN];
	struct ckpt_chunk_loc la, lb;
	uint64_t ra, rb, lf;
	ckpt_digest da, db;
	ckpt_engine *e;
	ckpt_store *s = open_rw();

	e = ckpt_store_engine(s);
	/* /a's first chunk entry deleted (the packs still hold it); /d/b's
	 * first chunk entry pointed at /a's record */
	da = first_chunk(s, f.a);
	db = first_chunk(s, f.b);
	ck_assert_int_eq(ckpt_store_chunk_loc(s, &da, &la, &ra), 0);
	ck_assert_int_eq(ckpt_store_chunk_loc(s, &db, &lb, &rb), 0);
	txn_del(e, key, ckpt_key_chunk(key, &da));
	ckpt_chunk_rec_encode(&la, rb, val);
	tl_engine_put(e, key, ckpt_key_chunk(key, &db), val, sizeof(val));
	/* /d/e/c's extent list deleted: lost */
	txn_del(e, key, ckpt_key_ino(key, CKPT_KEY_FILE, f.c));
	/* /d/e's name deleted: /d/e and what is under it have no name */
	txn_del(e, key, ckpt_key_dentry(key, f.d, "e", 1));
	/* /z's inode deleted: its name points at nothing */
	txn_del(e, key, ckpt_key_ino(key, CKPT_KEY_INODE, f.z));
	ckpt_store_free(s);

	st = repair(&seen);
	ck_assert(!st.index_damaged && !st.index_replaced);
	ck_assert_uint_eq(st.chunks_relocated, 2);
	ck_assert_uint_eq(st.files_lost, 2);
	ck_assert_msg(was_lost(&seen, "/z"), "%s", seen.lost_paths[0]);
	{
		char c_path[64];
		snprintf(c_path, sizeof(c_path), "<inode %" PRIu64 ">/c", f.e);
		ck_assert_msg(was_lost(&seen, c_path), "%s %s", seen.lost_paths[0], seen.lost_paths[1]);
	}
	ck_assert_uint_gt(st.fixed, 0);

	s = open_rw();
	assert_content(s, f.a, A_LEN, 1, NULL);
	assert_content(s, f.b, B_LEN, 2, NULL);
	ck_assert_uint_eq(lookup(s, CKPT_ROOT_INO, "z"), 0);
	/* /d/e is /lost+found/#E now, without c */
	lf = lookup(s, CKPT_ROOT_INO, "lost+found");
	ck_assert_uint_ne(lf, 0);
	{
		char name[32];
		struct ckpt_inode in;
		snprintf(name, sizeof(name), "#%" PRIu64, f.e);
		ck_assert_uint_eq(lookup(s, lf, name), f.e);
		ck_assert_uint_eq(lookup(s, f.e, "c"), 0);
		ck_assert_int_eq(ckpt_store_getattr(s, f.d, &in), 0);
		ck_assert_uint_eq(in.nlink, 2);
		ck_assert_int_eq(ckpt_store_getattr(s, lf, &in), 0);
		ck_assert_uint_eq(in.nlink, 3);
	}
	ckpt_store_free(s);
	assert_fsck_clean();
}
END_TEST

static Suite *repair_suite(void)
{
	Suite *s = suite_create("repair");
	TCase *tc = tcase_create("repair");

	tl_tcase_dirs(tc, "check_repair-");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	suite_add_tcase(s, tc);
	tcase_add_test(tc, test_intact);
	tcase_add_loop_test(tc, test_index_rebuilt, 0, 3);
	tcase_add_test(tc, test_salvage_without_log);
	tcase_add_test(tc, test_records_checked);
	return s;
}

int main(void)
{
	return tl_run(repair_suite());
}
