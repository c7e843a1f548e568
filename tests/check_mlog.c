/* SPDX-License-Identifier: MIT */
/*
 * check_mlog.c - unit tests of the metadata log (meta/mlog.h) and of what
 * the engine layer does with it (meta/engine.h, "The metadata log"):
 * appends and their numbers, reopening, replay, snapshots, retention,
 * restore and verify with damaged files, and an engine brought together
 * with its log at open (behind: replayed; ahead or without a log: a new
 * snapshot).
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"
#include "meta/engine.h"
#include "meta/mlog.h"
#include "testlib.h"

static char tdir[96];
static char ldir[128], ixdir[128];

static void setup(void)
{
	tl_test_dir(tdir, sizeof(tdir));
	snprintf(ldir, sizeof(ldir), "%s/metalog", tdir);
	snprintf(ixdir, sizeof(ixdir), "%s/ix", tdir);
}

static void teardown(void)
{
	tl_dir_remove(tdir);
}

/* ---- a sink that rebuilds the key space in memory ---- */

#define KV_MAX 256
struct kv {
	char k[32], v[64];
	bool live;
};
struct mem {
	struct kv kv[KV_MAX];
	uint64_t marks[1024];
	size_t nmarks;
};

static struct kv *mem_find(struct mem *m, const uint8_t *k, size_t kl, bool make)
{
	for (size_t i = 0; i < KV_MAX; i++)
		if (m->kv[i].live && strlen(m->kv[i].k) == kl && !memcmp(m->kv[i].k, k, kl))
			return &m->kv[i];
	if (!make)
		return NULL;
	for (size_t i = 0; i < KV_MAX; i++)
		if (!m->kv[i].live) {
			ck_assert_uint_lt(kl, sizeof(m->kv[i].k));
			memcpy(m->kv[i].k, k, kl);
			m->kv[i].k[kl] = '\0';
			m->kv[i].live = true;
			return &m->kv[i];
		}
	ck_abort_msg("sink full");
	return NULL;
}

static int mem_put(void *ud, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl)
{
	struct kv *e = mem_find(ud, k, kl, true);

	ck_assert_uint_lt(vl, sizeof(e->v));
	memcpy(e->v, v, vl);
	e->v[vl] = '\0';
	return 0;
}

static int mem_del(void *ud, const uint8_t *k, size_t kl)
{
	struct kv *e = mem_find(ud, k, kl, false);

	if (e)
		e->live = false;
	return 0;
}

static int mem_mark(void *ud, uint64_t n, uint64_t stamp)
{
	struct mem *m = ud;

	ck_assert_uint_lt(m->nmarks, 1024);
	m->marks[m->nmarks++] = n;
	return 0;
}

static const struct ckpt_mlog_sink mem_sink = { mem_put, mem_del, mem_mark };

static const char *mem_get(struct mem *m, const char *k)
{
	struct kv *e = mem_find(m, (const uint8_t *)k, strlen(k), false);

	return e ? e->v : NULL;
}

/* ---- helpers ---- */

static ckpt_mlog *mlog_open(void)
{
	ckpt_mlog *m = NULL;
	char err[256] = "";

	ck_assert_msg(ckpt_mlog_open(ldir, &m, err, sizeof(err)) == 0, "%s", err);
	return m;
}

/* Append commit "put k=v" (v NULL: delete k); returns its number. */
static uint64_t append1(ckpt_mlog *m, const char *k, const char *v)
{
	uint8_t *buf = NULL;
	size_t len = 0, cap = 0;
	uint64_t n = 0;

	ck_assert_int_eq(ckpt_mlog_op_add(&buf, &len, &cap, v ? CKPT_MLOG_OP_PUT : CKPT_MLOG_OP_DEL,
					  k, strlen(k), v, v ? strlen(v) : 0),
			 0);
	ck_assert_int_eq(ckpt_mlog_append(m, buf, len, 1, 1000 + (uint64_t)len, &n), 0);
	free(buf);
	return n;
}

/* A snapshot of the pairs k0..k(n-1) = v. */
static uint64_t snapshot(ckpt_mlog *m, int n, const char *v)
{
	ckpt_msnap *w = NULL;
	uint64_t base = 0;

	ck_assert_int_eq(ckpt_mlog_switch(m, &base), 0);
	ck_assert_int_eq(ckpt_msnap_begin(m, base, &w), 0);
	for (int i = 0; i < n; i++) {
		char k[16];
		snprintf(k, sizeof(k), "k%d", i);
		ck_assert_int_eq(ckpt_msnap_add(w, (const uint8_t *)k, strlen(k), (const uint8_t *)v,
						strlen(v)),
				 0);
	}
	ck_assert_int_eq(ckpt_msnap_end(w, true), 0);
	return base;
}

static char *path_in(const char *dir, const char *name)
{
	static char p[256];

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return p;
}

static void flip(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	uint8_t b;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &b, 1, off), 1);
	b ^= 0x5a;
	ck_assert_int_eq(pwrite(fd, &b, 1, off), 1);
	close(fd);
}

static off_t fsize(const char *path)
{
	struct stat st;

	ck_assert_int_eq(stat(path, &st), 0);
	return st.st_size;
}

static int count_files(const char *dir, const char *prefix)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d)))
		if (!strncmp(de->d_name, prefix, strlen(prefix)))
			n++;
	closedir(d);
	return n;
}

/* ---- tests ---- */

START_TEST(test_append_reopen_replay)
{
	ckpt_mlog *m = mlog_open();
	uint64_t last = 99;
	struct mem mem;

	ck_assert_int_eq(ckpt_mlog_last(m, &last), -ENOENT);
	ck_assert(ckpt_mlog_due(m)); /* no snapshot yet */
	ck_assert_int_eq(ckpt_mlog_start(m, 10), 0);
	ck_assert_uint_eq(append1(m, "a", "1"), 11);
	ck_assert_uint_eq(append1(m, "b", "2"), 12);
	ck_assert_uint_eq(append1(m, "a", NULL), 13);
	/* a record taken back is gone: the next append gets its number */
	ck_assert_uint_eq(append1(m, "x", "y"), 14);
	ckpt_mlog_unappend(m);
	ck_assert_uint_eq(append1(m, "c", "3"), 14);
	ck_assert_int_eq(ckpt_mlog_sync(m), 0);
	ckpt_mlog_close(m);

	m = mlog_open();
	ck_assert_int_eq(ckpt_mlog_last(m, &last), 0);
	ck_assert_uint_eq(last, 14);
	memset(&mem, 0, sizeof(mem));
	ck_assert_int_eq(ckpt_mlog_replay_after(m, 11, &mem_sink, &mem), 0);
	ck_assert_uint_eq(mem.nmarks, 3);
	ck_assert_uint_eq(mem.marks[0], 12);
	ck_assert_uint_eq(mem.marks[2], 14);
	ck_assert_str_eq(mem_get(&mem, "b"), "2");
	ck_assert_str_eq(mem_get(&mem, "c"), "3");
	ck_assert_ptr_null(mem_get(&mem, "x"));
	/* nothing to replay; and commits the log does not hold */
	ck_assert_int_eq(ckpt_mlog_replay_after(m, 14, &mem_sink, &mem), 0);
	ck_assert_int_eq(ckpt_mlog_replay_after(m, 9, &mem_sink, &mem), -ENOENT);
	ck_assert_int_eq(ckpt_mlog_replay_after(m, 15, &mem_sink, &mem), -ENOENT);
	/* continuing the log after its last record */
	ck_assert_int_eq(ckpt_mlog_start(m, 14), 0);
	ck_assert_uint_eq(append1(m, "d", "4"), 15);
	ckpt_mlog_close(m);
	ck_assert_int_eq(count_files(ldir, "log-"), 1);
}
END_TEST

START_TEST(test_torn_tail_cut)
{
	ckpt_mlog *m = mlog_open();
	char *lp;
	uint64_t last = 0;
	off_t sz;
	int fd;

	ck_assert_int_eq(ckpt_mlog_start(m, 0), 0);
	append1(m, "a", "1");
	append1(m, "b", "2");
	ckpt_mlog_close(m);
	lp = path_in(ldir, "log-0000000000000000.ckml");
	sz = fsize(lp);
	/* half a record at the end, as a power loss leaves it */
	fd = open(lp, O_WRONLY | O_APPEND);
	ck_assert_int_eq(write(fd, "CKLR\x05\x00\x00\x00", 8), 8);
	close(fd);
	m = mlog_open();
	ck_assert_int_eq(ckpt_mlog_last(m, &last), 0);
	ck_assert_uint_eq(last, 2);
	ck_assert_int_eq(ckpt_mlog_start(m, 2), 0);
	ck_assert_int_eq(fsize(lp), sz); /* cut off */
	ck_assert_uint_eq(append1(m, "c", "3"), 3);
	ckpt_mlog_close(m);
}
END_TEST

START_TEST(test_snapshots_restore_retention)
{
	ckpt_mlog *m = mlog_open();
	struct ckpt_mlog_report rep;
	struct mem mem;
	uint64_t b1, b2, b3;

	ck_assert_int_eq(ckpt_mlog_start(m, 0), 0);
	b1 = snapshot(m, 0, "");
	ck_assert_uint_eq(b1, 0); /* the empty log is kept */
	ck_assert(!ckpt_mlog_due(m));
	append1(m, "a", "1");
	append1(m, "k3", "changed");
	b2 = snapshot(m, 5, "s2");
	ck_assert_uint_eq(b2, 2);
	append1(m, "b", "2");
	append1(m, "k0", NULL);
	b3 = snapshot(m, 5, "s3");
	ck_assert_uint_eq(b3, 4);
	append1(m, "c", "3");
	ck_assert_int_eq(ckpt_mlog_sync(m), 0);
	/* the two newest snapshots and the logs from the older one */
	ck_assert_int_eq(count_files(ldir, "snap-"), 2);
	ck_assert_int_eq(count_files(ldir, "log-"), 2);
	ck_assert(access(path_in(ldir, "snap-0000000000000000.ckms"), F_OK) < 0);
	ckpt_mlog_close(m);

	memset(&mem, 0, sizeof(mem));
	ck_assert_int_eq(ckpt_mlog_restore(ldir, &mem_sink, &mem, &rep), 0);
	ck_assert(rep.found && rep.complete);
	ck_assert_uint_eq(rep.snap_base, 4);
	ck_assert_uint_eq(rep.last, 5);
	ck_assert_uint_eq(rep.records, 5);
	ck_assert_uint_eq(rep.commits, 1);
	ck_assert_str_eq(mem_get(&mem, "k0"), "s3");
	ck_assert_str_eq(mem_get(&mem, "c"), "3");
	ck_assert_ptr_null(mem_get(&mem, "a")); /* not in snapshot 4 as written here */
	ck_assert_uint_eq(mem.marks[0], 4);
	ck_assert_uint_eq(mem.marks[mem.nmarks - 1], 5);

	/* the newest snapshot damaged: the older one and its logs */
	flip(path_in(ldir, "snap-0000000000000004.ckms"), 70);
	memset(&mem, 0, sizeof(mem));
	ck_assert_int_eq(ckpt_mlog_restore(ldir, &mem_sink, &mem, &rep), 0);
	ck_assert(rep.found && !rep.complete);
	ck_assert_uint_eq(rep.snaps_damaged, 1);
	ck_assert_uint_eq(rep.snap_base, 2);
	ck_assert_uint_eq(rep.last, 5);
	ck_assert_ptr_nonnull(strstr(rep.problem, "snap-0000000000000004.ckms"));
	ck_assert_str_eq(mem_get(&mem, "k1"), "s2");
	ck_assert_ptr_null(mem_get(&mem, "k0")); /* deleted by commit 4 */
	ck_assert_str_eq(mem_get(&mem, "b"), "2");
	ck_assert_str_eq(mem_get(&mem, "c"), "3");
	ck_assert_int_eq(ckpt_mlog_verify(ldir, &rep), 0);
	ck_assert(!rep.complete);
}
END_TEST

START_TEST(test_damaged_log_stops_restore)
{
	ckpt_mlog *m = mlog_open();
	struct ckpt_mlog_report rep;
	struct mem mem;
	char *lp;
	off_t mid;

	ck_assert_int_eq(ckpt_mlog_start(m, 0), 0);
	snapshot(m, 1, "v");
	for (int i = 0; i < 10; i++)
		append1(m, "a", i % 2 ? "odd" : "even");
	ckpt_mlog_close(m);
	ck_assert_int_eq(ckpt_mlog_verify(ldir, &rep), 0);
	ck_assert(rep.complete);
	ck_assert_uint_eq(rep.last, 10);
	lp = path_in(ldir, "log-0000000000000000.ckml");
	mid = CKPT_MLOG_HDR_SIZE + (fsize(lp) - CKPT_MLOG_HDR_SIZE) / 2;
	flip(lp, mid);
	memset(&mem, 0, sizeof(mem));
	ck_assert_int_eq(ckpt_mlog_restore(ldir, &mem_sink, &mem, &rep), 0);
	ck_assert(rep.found && !rep.complete);
	ck_assert_uint_gt(rep.last, 0);
	ck_assert_uint_lt(rep.last, 10);
	ck_assert_uint_eq(mem.marks[mem.nmarks - 1], rep.last);
	ck_assert_ptr_nonnull(strstr(rep.problem, "log-0000000000000000.ckml"));
	/* a writer opening it finds the last valid commit */
	m = mlog_open();
	{
		uint64_t last = 0;
		ck_assert_int_eq(ckpt_mlog_last(m, &last), 0);
		ck_assert_uint_eq(last, rep.last);
	}
	ckpt_mlog_close(m);
}
END_TEST

/* ---- the engine and its log ---- */

static ckpt_engine *eopen(bool with_log)
{
	struct ckpt_engine_opts o = { .create = true, .log_dir = with_log ? ldir : NULL };
	ckpt_engine *e = NULL;
	char err[512] = "";

	ck_assert_msg(ckpt_engine_open(NULL, ixdir, &o, &e, err, sizeof(err)) == 0, "%s", err);
	return e;
}

static void eput(ckpt_engine *e, const char *k, const char *v)
{
	tl_engine_put(e, k, strlen(k), v, strlen(v));
}

/* The logged commit the engine recorded holding at its last open. */
static uint64_t emark(ckpt_engine *e)
{
	uint8_t v[8];

	ck_assert_int_eq(ckpt_engine_get_fixed(e, CKPT_ENGINE_MARK_KEY, CKPT_ENGINE_MARK_KEY_LEN, v,
					       8),
			 0);
	return ckpt_get_le64(v);
}

static void copy_dir(const char *from, const char *to)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -a '%s' '%s'", to, from, to);
	ck_assert_int_eq(system(cmd), 0);
}

static char *eget(ckpt_engine *e, const char *k)
{
	uint8_t *v = NULL;
	size_t vl = 0;
	char *s;

	if (ckpt_engine_get(e, k, strlen(k), &v, &vl) < 0)
		return NULL;
	s = strndup((char *)v, vl);
	free(v);
	return s;
}

START_TEST(test_engine_logs_commits)
{
	ckpt_engine *e = eopen(true);
	struct ckpt_mlog_report rep;
	struct mem mem;
	uint64_t m0 = emark(e);

	/* a new engine: a snapshot at its mark, the open's empty commit, then
	 * two commits */
	eput(e, "a", "1");
	eput(e, "b", "2");
	ck_assert_str_eq(ckpt_engine_log_dir(e), ldir);
	ckpt_engine_close(e);
	memset(&mem, 0, sizeof(mem));
	ck_assert_int_eq(ckpt_mlog_restore(ldir, &mem_sink, &mem, &rep), 0);
	ck_assert(rep.found && rep.complete);
	ck_assert_uint_eq(rep.snap_base, m0);
	ck_assert_uint_eq(rep.last, m0 + 3);
	ck_assert_str_eq(mem_get(&mem, "a"), "1");
	ck_assert_str_eq(mem_get(&mem, "b"), "2");
	ck_assert_ptr_null(mem_get(&mem, CKPT_ENGINE_MARK_KEY)); /* the engine's own */

	/* reopened: the log continues, no new snapshot, the mark moves on */
	e = eopen(true);
	ck_assert_uint_eq(emark(e), m0 + 3);
	eput(e, "c", "3");
	ckpt_engine_close(e);
	ck_assert_int_eq(count_files(ldir, "snap-"), 1);
	ck_assert_int_eq(count_files(ldir, "log-"), 1);
	ck_assert_int_eq(ckpt_mlog_verify(ldir, &rep), 0);
	ck_assert(rep.complete);
	ck_assert_uint_eq(rep.last, m0 + 5);
}
END_TEST

START_TEST(test_engine_behind_replayed)
{
	ckpt_engine *e = eopen(true);
	char bak[160], *x;

	eput(e, "a", "old");
	ckpt_engine_close(e);
	/* the engine will lose what the next session commits, as a damaged
	 * write-ahead log makes RocksDB drop it: its files are put back */
	snprintf(bak, sizeof(bak), "%s.bak", ixdir);
	copy_dir(ixdir, bak);
	e = eopen(true);
	eput(e, "a", "new");
	eput(e, "b", "2");
	ckpt_engine_close(e);
	copy_dir(bak, ixdir);
	e = eopen(true);
	x = eget(e, "a");
	ck_assert_str_eq(x, "new");
	free(x);
	x = eget(e, "b");
	ck_assert_str_eq(x, "2");
	free(x);
	eput(e, "c", "3");
	ckpt_engine_close(e);
	/* and no new snapshot was needed */
	ck_assert_int_eq(count_files(ldir, "snap-"), 1);
}
END_TEST

START_TEST(test_engine_ahead_new_snapshot)
{
	ckpt_engine *e = eopen(true);
	struct ckpt_mlog_report rep;
	struct mem mem;
	uint64_t m1;

	eput(e, "a", "1");
	ckpt_engine_close(e);
	/* a write the log does not see */
	e = eopen(false);
	eput(e, "b", "2");
	ckpt_engine_close(e);
	e = eopen(true);
	m1 = emark(e);
	eput(e, "c", "3");
	ckpt_engine_close(e);
	ck_assert_int_eq(count_files(ldir, "snap-"), 2);
	memset(&mem, 0, sizeof(mem));
	ck_assert_int_eq(ckpt_mlog_restore(ldir, &mem_sink, &mem, &rep), 0);
	ck_assert(rep.found && rep.complete);
	ck_assert_uint_eq(rep.snap_base, m1);
	ck_assert_str_eq(mem_get(&mem, "a"), "1");
	ck_assert_str_eq(mem_get(&mem, "b"), "2");
	ck_assert_str_eq(mem_get(&mem, "c"), "3");
}
END_TEST

START_TEST(test_engine_backup)
{
	ckpt_engine *e = eopen(true);
	struct ckpt_mlog_report rep;
	struct mem mem;

	for (int i = 0; i < 50; i++) {
		char k[16];
		snprintf(k, sizeof(k), "k%02d", i);
		eput(e, k, "v");
	}
	ck_assert_int_eq(ckpt_engine_backup(e), 0);
	eput(e, "k00", "w");
	ck_assert_int_eq(ckpt_engine_backup(e), 0);
	eput(e, "k01", "w");
	ckpt_engine_close(e);
	ck_assert_int_eq(count_files(ldir, "snap-"), 2);
	memset(&mem, 0, sizeof(mem));
	ck_assert_int_eq(ckpt_mlog_restore(ldir, &mem_sink, &mem, &rep), 0);
	ck_assert(rep.found && rep.complete);
	ck_assert_uint_eq(rep.commits, 1);
	ck_assert_str_eq(mem_get(&mem, "k00"), "w");
	ck_assert_str_eq(mem_get(&mem, "k01"), "w");
	ck_assert_str_eq(mem_get(&mem, "k49"), "v");
	/* without a log, backup is refused */
	e = eopen(false);
	ck_assert_int_eq(ckpt_engine_backup(e), -EOPNOTSUPP);
	ck_assert(!ckpt_engine_backup_due(e));
	ckpt_engine_close(e);
}
END_TEST

/* Stamps must be what the engine reaches: a transaction that writes one
 * key twice and deletes one it never wrote, several times, then a reopen
 * that finds the engine at the log's last commit (no new snapshot). */
START_TEST(test_engine_stamps)
{
	ckpt_engine *e = eopen(true);
	char *x;

	for (int i = 0; i < 5; i++) {
		ckpt_txn *t;
		ck_assert_int_eq(ckpt_txn_begin(e, &t), 0);
		ckpt_txn_put(t, "k", 1, "1", 1);
		ckpt_txn_put(t, "k", 1, "2", 1);
		ckpt_txn_delete(t, "never", 5);
		ckpt_txn_put(t, "j", 1, "3", 1);
		ck_assert_int_eq(ckpt_txn_commit(t, i % 2 == 0), 0);
	}
	ckpt_engine_close(e);
	e = eopen(true);
	x = eget(e, "k");
	ck_assert_str_eq(x, "2");
	free(x);
	ckpt_engine_close(e);
	ck_assert_int_eq(count_files(ldir, "snap-"), 1);
	ck_assert_int_eq(count_files(ldir, "log-"), 1);
}
END_TEST

START_TEST(test_engine_without_usable_log)
{
	struct ckpt_mlog_report rep;
	struct mem mem;
	ckpt_engine *e;
	int fd = open(ldir, O_WRONLY | O_CREAT, 0644); /* a file where the directory goes */

	ck_assert_int_ge(fd, 0);
	close(fd);
	/* the index opens and works without its log */
	e = eopen(true);
	ck_assert_ptr_null(ckpt_engine_log_dir(e));
	eput(e, "a", "1");
	ckpt_engine_close(e);
	/* once the log can be written, a snapshot holds what was done without it */
	ck_assert_int_eq(unlink(ldir), 0);
	e = eopen(true);
	ck_assert_ptr_nonnull(ckpt_engine_log_dir(e));
	ckpt_engine_close(e);
	memset(&mem, 0, sizeof(mem));
	ck_assert_int_eq(ckpt_mlog_restore(ldir, &mem_sink, &mem, &rep), 0);
	ck_assert(rep.found && rep.complete);
	ck_assert_str_eq(mem_get(&mem, "a"), "1");
}
END_TEST

static Suite *mlog_suite(void)
{
	Suite *s = suite_create("mlog");
	TCase *f = tcase_create("files"), *en = tcase_create("engine");
	TCase *all[] = { f, en };

	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		tl_tcase_dirs(all[i], "check_mlog-");
		tcase_add_checked_fixture(all[i], setup, teardown);
		tcase_set_timeout(all[i], 60);
		suite_add_tcase(s, all[i]);
	}
	tcase_add_test(f, test_append_reopen_replay);
	tcase_add_test(f, test_torn_tail_cut);
	tcase_add_test(f, test_snapshots_restore_retention);
	tcase_add_test(f, test_damaged_log_stops_restore);
	tcase_add_test(en, test_engine_logs_commits);
	tcase_add_test(en, test_engine_behind_replayed);
	tcase_add_test(en, test_engine_ahead_new_snapshot);
	tcase_add_test(en, test_engine_backup);
	tcase_add_test(en, test_engine_stamps);
	tcase_add_test(en, test_engine_without_usable_log);
	return s;
}

int main(void)
{
	return tl_run(mlog_suite());
}
