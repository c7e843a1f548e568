/* SPDX-License-Identifier: MIT */
/*
 * check_verify.c - unit tests for core/store/verify.c: ckpt_store_verify
 * reading every chunk, a sample, a byte budget; damage named with its
 * chunk and files; a stale read-only view (chunks moved and dropped by gc
 * after the view was opened) reporting no damage; and the progress reports
 * of verify and fsck.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chunk/pack_backend.h"
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

static ckpt_store *open_mode(enum ckpt_store_mode mode)
{
	struct ckpt_store_opts o;

	ckpt_store_opts_init(&o);
	o.mode = mode;
	o.cache_size = 0;
	return tl_store_open(spath, &o);
}

struct reports {
	int chunks, files;
	char all[8192];
};

static void report_cb(void *ud, const char *path, const char *what)
{
	struct reports *r = ud;
	size_t used = strlen(r->all);

	if (path)
		r->files++;
	else
		r->chunks++;
	snprintf(r->all + used, sizeof(r->all) - used, "%s: %s\n", path ? path : "-", what);
}

/* One file per buffer in dir, each buffer one chunk; the index flushed. */
static void put_files(ckpt_store *s, uint64_t dir, const char *prefix, size_t n, size_t len,
		      uint64_t seed)
{
	for (size_t i = 0; i < n; i++) {
		struct ckpt_extent_list *l = ckpt_extent_list_new();
		uint8_t *buf = tl_random_buf(len, seed + i);
		char name[64];
		ckpt_digest d;
		uint64_t ino;

		snprintf(name, sizeof(name), "%s%zu", prefix, i);
		ino = tl_mknode(s, dir, name, S_IFREG | 0644);
		ck_assert_ptr_nonnull(l);
		ck_assert_int_eq(ckpt_store_put_chunk(s, buf, len, 0, &d), 0);
		ck_assert_int_eq(ckpt_extent_list_append(l, (uint32_t)len, CKPT_EXT_CHUNK, &d), 0);
		ck_assert_int_eq(ckpt_store_commit_file(s, ino, l, 0, 1000, true), 0);
		ckpt_extent_list_free(l);
		free(buf);
	}
	ck_assert_int_eq(ckpt_store_flush(s), 0);
}

static int verify(ckpt_store *s, const struct ckpt_verify_opts *o, struct reports *rep,
		  struct ckpt_verify_stats *st)
{
	memset(rep, 0, sizeof(*rep));
	return ckpt_store_verify(s, o, report_cb, rep, st);
}

START_TEST(test_verify_all_sample_budget)
{
	ckpt_store *s = tl_store_create(spath);
	struct ckpt_verify_opts o = { 0 };
	struct ckpt_verify_stats st;
	struct reports rep;

	put_files(s, CKPT_ROOT_INO, "f", 20, 100000, 1);
	ckpt_store_free(s);
	s = open_mode(CKPT_STORE_RO_SHARED);

	ck_assert_int_eq(verify(s, &o, &rep, &st), 0);
	ck_assert_uint_eq(st.chunks, 20);
	ck_assert_uint_eq(st.selected, 20);
	ck_assert_uint_eq(st.checked, 20);
	ck_assert_uint_eq(st.raw_bytes, 20 * 100000);
	ck_assert_uint_eq(st.checked_bytes, st.bytes);
	ck_assert_uint_eq(st.damaged + st.moved + st.vanished + st.unsettled + st.views, 0);
	ck_assert_int_eq(rep.chunks + rep.files, 0);

	o.sample_ppm = 250000; /* 25%: 5 chunks */
	ck_assert_int_eq(verify(s, &o, &rep, &st), 0);
	ck_assert_uint_eq(st.selected, 5);
	ck_assert_uint_eq(st.checked, 5);
	o.sample_ppm = 1; /* rounds up to one chunk */
	ck_assert_int_eq(verify(s, &o, &rep, &st), 0);
	ck_assert_uint_eq(st.selected, 1);

	o.sample_ppm = 0;
	o.sample_count = 7;
	ck_assert_int_eq(verify(s, &o, &rep, &st), 0);
	ck_assert_uint_eq(st.selected, 7);
	o.sample_count = 1000; /* more than there are */
	ck_assert_int_eq(verify(s, &o, &rep, &st), 0);
	ck_assert_uint_eq(st.selected, 20);

	/* a budget: chunks until their stored bytes reach it, no more */
	o.sample_count = 0;
	o.byte_budget = 250000;
	ck_assert_int_eq(verify(s, &o, &rep, &st), 0);
	ck_assert_uint_ge(st.selected_bytes, 250000);
	ck_assert_uint_lt(st.selected_bytes, 250000 + st.bytes / st.chunks + 4096);
	ck_assert_uint_eq(st.checked_bytes, st.selected_bytes);
	/* with a count, whichever ends first */
	o.sample_count = 2;
	ck_assert_int_eq(verify(s, &o, &rep, &st), 0);
	ck_assert_uint_eq(st.selected, 2);

	o.sample_ppm = 1000001;
	ck_assert_int_eq(verify(s, &o, &rep, &st), -EINVAL);
	ckpt_store_free(s);
}
END_TEST

/* The pack offset of the record of the first chunk of dir/name. */
static uint64_t record_offset(ckpt_store *s, const char *dir, const char *name)
{
	struct ckpt_extent_list *l = NULL;
	struct ckpt_chunk_loc loc;
	struct ckpt_inode in;
	uint64_t off;

	ck_assert_int_eq(ckpt_store_lookup(s, CKPT_ROOT_INO, dir, &in), 0);
	ck_assert_int_eq(ckpt_store_lookup(s, in.ino, name, &in), 0);
	ck_assert_int_eq(ckpt_store_load_extents(s, in.ino, &l), 0);
	ck_assert_int_eq(ckpt_store_chunk_loc(s, &l->v[0].digest, &loc, NULL), 0);
	off = ckpt_pack_loc_offset(&loc);
	ckpt_extent_list_free(l);
	return off;
}

static void first_pack(char *out, size_t outlen)
{
	char dir[256], best[NAME_MAX + 1] = "";
	struct dirent *de;
	DIR *d;

	snprintf(dir, sizeof(dir), "%s/packs", spath);
	d = opendir(dir);
	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d)))
		if (!strncmp(de->d_name, "pack-", 5) && (!best[0] || strcmp(de->d_name, best) < 0))
			snprintf(best, sizeof(best), "%s", de->d_name);
	closedir(d);
	ck_assert_msg(best[0], "no pack file");
	snprintf(out, outlen, "%s/%s", dir, best);
}

static void flip_byte(const char *path, uint64_t off)
{
	int fd = open(path, O_RDWR);
	uint8_t b;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &b, 1, (off_t)off), 1);
	b ^= 0x5a;
	ck_assert_int_eq(pwrite(fd, &b, 1, (off_t)off), 1);
	close(fd);
}

START_TEST(test_verify_damage_named)
{
	ckpt_store *s = tl_store_create(spath);
	struct ckpt_verify_opts o = { 0 };
	struct ckpt_verify_stats st;
	struct reports rep;
	char pack[512];
	uint64_t dir = tl_mknode(s, CKPT_ROOT_INO, "step_1", S_IFDIR | 0755), off;

	put_files(s, dir, "shard", 4, 200000, 10);
	off = record_offset(s, "step_1", "shard2");
	ckpt_store_free(s);
	first_pack(pack, sizeof(pack));
	flip_byte(pack, off + 64 + 1000); /* inside the stored bytes */

	/* both modes: a view beside a daemon, and the store locked */
	for (int mode = 0; mode < 2; mode++) {
		s = open_mode(mode ? CKPT_STORE_RO : CKPT_STORE_RO_SHARED);
		ck_assert_int_eq(verify(s, &o, &rep, &st), 1);
		ck_assert_uint_eq(st.damaged, 1);
		ck_assert_uint_eq(st.checked, 3);
		ck_assert_int_eq(rep.chunks, 1);
		ck_assert_int_eq(rep.files, 1);
		ck_assert_msg(strstr(rep.all, "is damaged") && strstr(rep.all, "offset") &&
				      strstr(rep.all, "/step_1/shard2: damaged data at offset 0"),
			      "%s", rep.all);
		/* the newer view found the same location: one view opened, when live */
		ck_assert_uint_eq(st.views, mode ? 0 : 1);
		ckpt_store_free(s);
	}
}
END_TEST

/*
 * A view opened before gc moved one chunk (its pack rewritten, then
 * deleted) and dropped another: verify through the stale view reports
 * neither as damaged: the moved one is read at its new location, the
 * dropped one is counted as vanished.
 */
START_TEST(test_verify_stale_view)
{
	ckpt_store *rw = tl_store_create(spath), *view;
	struct ckpt_verify_opts o = { 0 };
	struct ckpt_verify_stats st;
	struct ckpt_gc_stats gs;
	struct reports rep;
	struct ckpt_inode in;

	put_files(rw, CKPT_ROOT_INO, "keep", 1, 100000, 30);
	put_files(rw, CKPT_ROOT_INO, "drop", 1, 900000, 40);
	view = open_mode(CKPT_STORE_RO_SHARED);
	ck_assert_int_eq(ckpt_store_lookup(rw, CKPT_ROOT_INO, "drop0", &in), 0);
	ck_assert_int_eq(ckpt_store_unlink(rw, CKPT_ROOT_INO, "drop0", false), 0);
	ck_assert_int_eq(ckpt_store_reap(rw, in.ino), 0);
	ck_assert_int_eq(ckpt_store_gc(rw, &gs), 0);
	ck_assert_uint_eq(gs.chunks_dropped, 1);
	ck_assert_uint_eq(gs.packs_rewritten, 1);
	ck_assert_uint_eq(gs.packs_deleted, 1);

	ck_assert_int_eq(verify(view, &o, &rep, &st), 0);
	ck_assert_msg(rep.chunks + rep.files == 0, "%s", rep.all);
	ck_assert_uint_eq(st.chunks, 2);
	ck_assert_uint_eq(st.damaged, 0);
	ck_assert_uint_eq(st.moved, 1);
	ck_assert_uint_eq(st.vanished, 1);
	ck_assert_uint_eq(st.checked, 1);
	ck_assert_uint_ge(st.views, 1);
	ckpt_store_free(view);
	ckpt_store_free(rw);
}
END_TEST

struct prog {
	uint64_t calls, last_done, last_total;
	bool backwards;
};

static void prog_cb(void *ud, uint64_t done, uint64_t total)
{
	struct prog *p = ud;

	if (done < p->last_done || done > total)
		p->backwards = true;
	p->calls++;
	p->last_done = done;
	p->last_total = total;
}

START_TEST(test_progress_reports)
{
	ckpt_store *s = tl_store_create(spath);
	struct prog p = { 0 };
	struct ckpt_progress cb = { prog_cb, &p };
	struct ckpt_verify_opts o = { .progress = &cb };
	struct ckpt_verify_stats st;
	struct reports rep;

	put_files(s, CKPT_ROOT_INO, "f", 10, 50000, 50);
	ckpt_store_free(s);
	s = open_mode(CKPT_STORE_RO);
	ck_assert_int_eq(verify(s, &o, &rep, &st), 0);
	ck_assert_uint_ge(p.calls, 11);
	ck_assert(!p.backwards);
	ck_assert_uint_eq(p.last_done, st.bytes);
	ck_assert_uint_eq(p.last_total, st.bytes);

	memset(&p, 0, sizeof(p));
	ckpt_store_set_progress(s, &cb);
	memset(&rep, 0, sizeof(rep));
	ck_assert_int_eq(ckpt_store_fsck(s, report_cb, &rep), 0);
	ck_assert_uint_ge(p.calls, 11);
	ck_assert(!p.backwards);
	ck_assert_uint_eq(p.last_done, st.bytes);
	ck_assert_uint_eq(p.last_total, st.bytes);
	ckpt_store_free(s);
}
END_TEST

static Suite *verify_suite(void)
{
	Suite *s = suite_create("verify");
	TCase *tc = tcase_create("verify");

	tl_tcase_dirs(tc, "check_verify-");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);
	tcase_add_test(tc, test_verify_all_sample_budget);
	tcase_add_test(tc, test_verify_damage_named);
	tcase_add_test(tc, test_verify_stale_view);
	tcase_add_test(tc, test_progress_reports);
	return s;
}

int main(void)
{
	return tl_run(verify_suite());
}
