/* SPDX-License-Identifier: MIT */
/*
 * check_engine.c - unit tests of the metadata engine ops table (meta/engine.h),
 * run over every registered engine (loop tests: _i is the engine's index in
 * the table): get/put/delete, transactions and their conflicts, durable and
 * non-durable commits, scans (committed snapshot and in a transaction),
 * read-only opens.  Two test cases hold what only one engine promises:
 * PostgreSQL (processes committing at once, a server that stops and comes
 * back, what it refuses to open) and RocksDB (its write-ahead logs, its
 * single-writer lock).
 *
 * Each test opens its engine at ixdir: a directory for RocksDB, the
 * connection string of a new database for PostgreSQL, on a server this
 * suite starts (pglib.h) and stops.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <libpq-fe.h>

#include "meta/engine.h"
#include "meta/records.h"
#include "pglib.h"
#include "testlib.h"
#include "base/util.h"

static char tdir[96]; /* per test, inside the test case's base directory */
static char ixdir[256];  /* where the test's engine lives (see the top) */

static bool pg_where_made; /* ixdir names this test's PostgreSQL database */

static void setup(void)
{
	tl_test_dir(tdir, sizeof(tdir));
	snprintf(ixdir, sizeof(ixdir), "%s/ix", tdir);
	pg_where_made = false;
}

static void teardown(void)
{
	tl_dir_remove(tdir);
}

static size_t n_engines(void)
{
	size_t n = 0;

	while (ckpt_engine_at(n))
		n++;
	return n;
}

/* The name of engine i; for PostgreSQL, the first call of a test also
 * makes the test's database and points ixdir at it. */
static const char *engine_name(int i)
{
	ck_assert_ptr_nonnull(ckpt_engine_at((size_t)i));
	if (ckpt_engine_at((size_t)i) == &ckpt_engine_postgres && !pg_where_made) {
		tl_pg_new_db(ixdir, sizeof(ixdir));
		pg_where_made = true;
	}
	return ckpt_engine_at((size_t)i)->name;
}

static ckpt_engine *open_as(int i, bool create, bool read_only)
{
	struct ckpt_engine_opts o = { .create = create, .read_only = read_only };
	ckpt_engine *e = NULL;
	char err[256] = "";

	ck_assert_msg(ckpt_engine_open(engine_name(i), ixdir, &o, &e, err, sizeof(err)) == 0,
		      "%s", err);
	ck_assert_ptr_nonnull(e);
	ck_assert_str_eq(ckpt_engine_name(e), engine_name(i));
	return e;
}

static ckpt_engine *open_e(int i)
{
	ckpt_engine *e = tl_engine_open(engine_name(i), ixdir);

	ck_assert_str_eq(ckpt_engine_name(e), engine_name(i));
	return e;
}


static void del1(ckpt_engine *e, const void *k, size_t kl)
{
	ckpt_txn *t;

	ck_assert_int_eq(ckpt_txn_begin(e, &t), 0);
	ck_assert_int_eq(ckpt_txn_delete(t, k, kl), 0);
	ck_assert_int_eq(ckpt_txn_commit(t, false), 0);
}

/* The committed value of k as a string ("" when absent). */
static void expect_val(ckpt_engine *e, const char *k, const char *want)
{
	uint8_t *v = NULL;
	size_t vl = 0;
	int r = ckpt_engine_get(e, k, strlen(k), &v, &vl);

	if (!want) {
		ck_assert_int_eq(r, -ENOENT);
		return;
	}
	ck_assert_int_eq(r, 0);
	ck_assert_uint_eq(vl, strlen(want));
	ck_assert_mem_eq(v, want, vl);
	free(v);
}

/* ------------------------------------------------------------ registry */

START_TEST(test_registry)
{
	ck_assert_uint_ge(n_engines(), 1);
	ck_assert_str_eq(ckpt_engine_at(0)->name, CKPT_ENGINE_DEFAULT);
	ck_assert_ptr_eq(ckpt_engine_find("rocksdb"), &ckpt_engine_rocksdb);
	ck_assert_ptr_eq(ckpt_engine_find("postgresql"), &ckpt_engine_postgres);
	ck_assert_ptr_null(ckpt_engine_find("nosuch"));
	ck_assert_ptr_null(ckpt_engine_at(n_engines()));
	for (size_t i = 0; i < n_engines(); i++)
		ck_assert_ptr_eq(ckpt_engine_find(ckpt_engine_at(i)->name), ckpt_engine_at(i));
}
END_TEST

START_TEST(test_open_unknown_engine)
{
	struct ckpt_engine_opts o = { .create = true };
	ckpt_engine *e = NULL;
	char err[256] = "";

	ck_assert_int_eq(ckpt_engine_open("nosuch", ixdir, &o, &e, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_null(e);
	ck_assert_ptr_nonnull(strstr(err, "nosuch"));
	ck_assert_ptr_nonnull(strstr(err, ixdir));
	/* NULL names the default */
	ck_assert_int_eq(ckpt_engine_open(NULL, ixdir, &o, &e, err, sizeof(err)), 0);
	ck_assert_str_eq(ckpt_engine_name(e), CKPT_ENGINE_DEFAULT);
	ckpt_engine_close(e);
}
END_TEST

/* ------------------------------------------------------ each engine */

START_TEST(test_open_missing_no_create)
{
	struct ckpt_engine_opts o = { .create = false };
	ckpt_engine *e = NULL;
	char err[256] = "";

	ck_assert_int_lt(ckpt_engine_open(engine_name(_i), ixdir, &o, &e, err, sizeof(err)), 0);
	ck_assert_ptr_null(e);
	ck_assert_ptr_nonnull(strstr(err, ixdir));
	ckpt_engine_close(NULL);
}
END_TEST

START_TEST(test_get_put_delete)
{
	ckpt_engine *e = open_e(_i);
	uint8_t *v = NULL;
	size_t vl = 0;
	uint8_t fixed[5];
	ckpt_txn *t;

	ck_assert_int_eq(ckpt_engine_get(e, "k1", 2, &v, &vl), -ENOENT);
	ck_assert_int_eq(ckpt_engine_get_fixed(e, "k1", 2, fixed, 5), -ENOENT);
	ck_assert_int_eq(ckpt_engine_has(e, "k1", 2), 0);

	ck_assert_int_eq(ckpt_txn_begin(e, &t), 0);
	ck_assert_int_eq(ckpt_txn_put(t, "k1", 2, "hello", 5), 0);
	ck_assert_int_eq(ckpt_txn_put(t, "k2", 2, "", 0), 0);
	ck_assert_int_eq(ckpt_txn_put(t, "k3", 2, "x", 1), 0);
	ck_assert_int_eq(ckpt_txn_delete(t, "k3", 2), 0); /* later op wins */
	ck_assert_int_eq(ckpt_txn_commit(t, true), 0);

	expect_val(e, "k1", "hello");
	ck_assert_int_eq(ckpt_engine_has(e, "k1", 2), 1);
	/* an empty value exists and has length 0 */
	v = NULL;
	ck_assert_int_eq(ckpt_engine_get(e, "k2", 2, &v, &vl), 0);
	ck_assert_uint_eq(vl, 0);
	ck_assert_ptr_nonnull(v);
	free(v);
	ck_assert_int_eq(ckpt_engine_has(e, "k2", 2), 1);
	expect_val(e, "k3", NULL);
	/* keys are binary: a prefix of a key is another key */
	ck_assert_int_eq(ckpt_engine_get(e, "k", 1, &v, &vl), -ENOENT);

	memset(fixed, 0, sizeof(fixed));
	ck_assert_int_eq(ckpt_engine_get_fixed(e, "k1", 2, fixed, 5), 0);
	ck_assert_mem_eq(fixed, "hello", 5);
	/* length mismatch either way: -EIO, buffer untouched */
	memset(fixed, 0xee, sizeof(fixed));
	ck_assert_int_eq(ckpt_engine_get_fixed(e, "k1", 2, fixed, 4), -EIO);
	ck_assert_int_eq(ckpt_engine_get_fixed(e, "k2", 2, fixed, 1), -EIO);
	ck_assert_mem_eq(fixed, "\xee\xee\xee\xee\xee", 5);
	{
		uint8_t big[6];
		ck_assert_int_eq(ckpt_engine_get_fixed(e, "k1", 2, big, 6), -EIO);
	}

	/* overwrite, then delete */
	tl_engine_put(e, "k1", 2, "bye", 3);
	expect_val(e, "k1", "bye");
	del1(e, "k1", 2);
	expect_val(e, "k1", NULL);
	/* deleting an absent key is fine, and so is an empty transaction */
	del1(e, "nope", 4);
	ck_assert_int_eq(ckpt_txn_begin(e, &t), 0);
	ck_assert_int_eq(ckpt_txn_commit(t, false), 0);
	ckpt_txn_abort(NULL);
	ck_assert_int_eq(ckpt_engine_sync(e), 0);
	ck_assert_int_eq(ckpt_engine_flush(e), 0);
	ckpt_engine_close(e);
}
END_TEST

/* ckpt_engine_get_many: every key found is reported once with its own
 * value, whatever the order and lengths of the keys; absent ones are not;
 * keys are binary (a prefix is another key); empty values count. */
struct many_seen {
	int calls[300];
	char vals[300][16];
	size_t lens[300];
};

static int many_cb(void *arg, size_t i, const uint8_t *val, size_t len)
{
	struct many_seen *m = arg;

	ck_assert_uint_lt(i, 300);
	ck_assert_uint_le(len, sizeof(m->vals[0]));
	m->calls[i]++;
	memcpy(m->vals[i], val, len);
	m->lens[i] = len;
	return 0;
}

static int many_stop(void *arg, size_t i, const uint8_t *val, size_t len)
{
	(void)arg;
	(void)i;
	(void)val;
	(void)len;
	return -EUCLEAN;
}

START_TEST(test_get_many)
{
	ckpt_engine *e = open_e(_i);
	static char kbuf[300][16];
	const uint8_t *keys[300];
	size_t klens[300];
	struct many_seen *m = calloc(1, sizeof(*m));
	ckpt_txn *t;

	ck_assert_ptr_nonnull(m);
	ck_assert_int_eq(ckpt_txn_begin(e, &t), 0);
	for (int i = 0; i < 200; i++) { /* keys m0..m199 stored; value v<i> (m7: empty) */
		char k[16], v[16];
		snprintf(k, sizeof(k), "m%d", i);
		snprintf(v, sizeof(v), "v%d", i);
		ck_assert_int_eq(ckpt_txn_put(t, k, strlen(k), v, i == 7 ? 0 : strlen(v)), 0);
	}
	ck_assert_int_eq(ckpt_txn_commit(t, false), 0);
	/* ask for m299..m0 (100 absent), and "m" (a prefix of stored keys) */
	for (int i = 0; i < 300; i++) {
		if (i == 299)
			snprintf(kbuf[i], sizeof(kbuf[i]), "m");
		else
			snprintf(kbuf[i], sizeof(kbuf[i]), "m%d", 298 - i);
		keys[i] = (const uint8_t *)kbuf[i];
		klens[i] = strlen(kbuf[i]);
	}
	ck_assert_int_eq(ckpt_engine_get_many(e, keys, klens, 300, many_cb, m), 0);
	for (int i = 0; i < 300; i++) {
		int k = i == 299 ? -1 : 298 - i;
		char want[16];

		if (k < 0 || k >= 200) {
			ck_assert_msg(m->calls[i] == 0, "absent key %s reported", kbuf[i]);
			continue;
		}
		ck_assert_msg(m->calls[i] == 1, "key %s reported %d times", kbuf[i], m->calls[i]);
		snprintf(want, sizeof(want), "v%d", k);
		if (k == 7)
			want[0] = 0;
		ck_assert_uint_eq(m->lens[i], strlen(want));
		ck_assert_mem_eq(m->vals[i], want, m->lens[i]);
	}
	ck_assert_int_eq(ckpt_engine_get_many(e, keys, klens, 0, many_cb, m), 0);
	ck_assert_int_eq(ckpt_engine_get_many(e, keys, klens, 300, many_stop, NULL), -EUCLEAN);
	free(m);
	ckpt_engine_close(e);
}
END_TEST

/* A transaction sees its own writes; nobody else does until it commits;
 * an abort leaves nothing. */
START_TEST(test_txn_isolation)
{
	ckpt_engine *e = open_e(_i);
	uint8_t *v, buf[3];
	size_t vl;
	ckpt_txn *t;

	tl_engine_put(e, "a", 1, "old", 3);
	ck_assert_int_eq(ckpt_txn_begin(e, &t), 0);
	ck_assert_int_eq(ckpt_txn_put(t, "a", 1, "new", 3), 0);
	ck_assert_int_eq(ckpt_txn_put(t, "b", 1, "bb", 2), 0);
	ck_assert_int_eq(ckpt_txn_get_fixed(t, "a", 1, 0, buf, 3), 0);
	ck_assert_mem_eq(buf, "new", 3);
	ck_assert_int_eq(ckpt_txn_get(t, "b", 1, CKPT_TXN_FOR_UPDATE, &v, &vl), 0);
	ck_assert_uint_eq(vl, 2);
	free(v);
	ck_assert_int_eq(ckpt_txn_has(t, "b", 1, 0), 1);
	ck_assert_int_eq(ckpt_txn_delete(t, "b", 1), 0);
	ck_assert_int_eq(ckpt_txn_has(t, "b", 1, 0), 0);
	ck_assert_int_eq(ckpt_txn_get(t, "b", 1, 0, &v, &vl), -ENOENT);
	ck_assert_int_eq(ckpt_txn_put(t, "b", 1, "b2", 2), 0);
	/* outside: still the committed state */
	expect_val(e, "a", "old");
	expect_val(e, "b", NULL);
	ckpt_txn_abort(t);
	expect_val(e, "a", "old");
	expect_val(e, "b", NULL);

	ck_assert_int_eq(ckpt_txn_begin(e, &t), 0);
	ck_assert_int_eq(ckpt_txn_put(t, "a", 1, "new", 3), 0);
	ck_assert_int_eq(ckpt_txn_put(t, "b", 1, "b2", 2), 0);
	ck_assert_int_eq(ckpt_txn_commit(t, false), 0);
	expect_val(e, "a", "new");
	expect_val(e, "b", "b2");
	ckpt_engine_close(e);
}
END_TEST

/* Two transactions read the same key for update and both write it: the
 * second to commit fails with -EAGAIN and applies nothing, and a retry
 * from a new transaction succeeds. */
START_TEST(test_txn_conflict_read_for_update)
{
	ckpt_engine *e = open_e(_i);
	ckpt_txn *t1, *t2;
	uint8_t buf[8];
	uint64_t n1, n2;

	ckpt_put_le64(buf, 10);
	tl_engine_put(e, "ctr", 3, buf, 8);
	ck_assert_int_eq(ckpt_txn_begin(e, &t1), 0);
	ck_assert_int_eq(ckpt_txn_begin(e, &t2), 0);
	ck_assert_int_eq(ckpt_txn_get_fixed(t1, "ctr", 3, CKPT_TXN_FOR_UPDATE, buf, 8), 0);
	n1 = ckpt_get_le64(buf);
	ck_assert_int_eq(ckpt_txn_get_fixed(t2, "ctr", 3, CKPT_TXN_FOR_UPDATE, buf, 8), 0);
	n2 = ckpt_get_le64(buf);
	ck_assert_uint_eq(n1, 10);
	ck_assert_uint_eq(n2, 10);
	ckpt_put_le64(buf, n1 + 1);
	ck_assert_int_eq(ckpt_txn_put(t1, "ctr", 3, buf, 8), 0);
	ck_assert_int_eq(ckpt_txn_put(t1, "side1", 5, "x", 1), 0);
	ckpt_put_le64(buf, n2 + 1);
	ck_assert_int_eq(ckpt_txn_put(t2, "ctr", 3, buf, 8), 0);
	ck_assert_int_eq(ckpt_txn_put(t2, "side2", 5, "y", 1), 0);
	ck_assert_int_eq(ckpt_txn_commit(t1, false), 0);
	ck_assert_int_eq(ckpt_txn_commit(t2, false), -EAGAIN);
	/* the loser changed nothing */
	expect_val(e, "side2", NULL);
	expect_val(e, "side1", "x");
	ck_assert_int_eq(ckpt_engine_get_fixed(e, "ctr", 3, buf, 8), 0);
	ck_assert_uint_eq(ckpt_get_le64(buf), 11);
	/* the retry reads the winner's value */
	{
		unsigned attempt = 0;
		ck_assert(ckpt_txn_retry(-EAGAIN, &attempt));
		ck_assert_uint_eq(attempt, 1);
		ck_assert(!ckpt_txn_retry(0, &attempt));
		ck_assert(!ckpt_txn_retry(-EIO, &attempt));
		attempt = CKPT_TXN_TRIES - 1;
		ck_assert(!ckpt_txn_retry(-EAGAIN, &attempt));
	}
	ck_assert_int_eq(ckpt_txn_begin(e, &t2), 0);
	ck_assert_int_eq(ckpt_txn_get_fixed(t2, "ctr", 3, CKPT_TXN_FOR_UPDATE, buf, 8), 0);
	ckpt_put_le64(buf, ckpt_get_le64(buf) + 1);
	ck_assert_int_eq(ckpt_txn_put(t2, "ctr", 3, buf, 8), 0);
	ck_assert_int_eq(ckpt_txn_commit(t2, false), 0);
	ck_assert_int_eq(ckpt_engine_get_fixed(e, "ctr", 3, buf, 8), 0);
	ck_assert_uint_eq(ckpt_get_le64(buf), 12);
	ckpt_engine_close(e);
}
END_TEST

/* A key read for update that did not exist (a name being created) and that
 * another transaction creates meanwhile is a conflict too; so is a key
 * read for update and changed by another, even if this one only writes
 * elsewhere; disjoint keys do not conflict. */
START_TEST(test_txn_conflict_absent_and_disjoint)
{
	ckpt_engine *e = open_e(_i);
	ckpt_txn *t1, *t2;

	ck_assert_int_eq(ckpt_txn_begin(e, &t1), 0);
	ck_assert_int_eq(ckpt_txn_begin(e, &t2), 0);
	ck_assert_int_eq(ckpt_txn_has(t1, "name", 4, CKPT_TXN_FOR_UPDATE), 0);
	ck_assert_int_eq(ckpt_txn_has(t2, "name", 4, CKPT_TXN_FOR_UPDATE), 0);
	ck_assert_int_eq(ckpt_txn_put(t1, "name", 4, "1", 1), 0);
	ck_assert_int_eq(ckpt_txn_put(t2, "name", 4, "2", 1), 0);
	ck_assert_int_eq(ckpt_txn_commit(t2, false), 0);
	ck_assert_int_eq(ckpt_txn_commit(t1, false), -EAGAIN);
	expect_val(e, "name", "2");

	/* read-only dependency: t1 decides from "dir" and writes "other" */
	tl_engine_put(e, "dir", 3, "v1", 2);
	ck_assert_int_eq(ckpt_txn_begin(e, &t1), 0);
	ck_assert_int_eq(ckpt_txn_has(t1, "dir", 3, CKPT_TXN_FOR_UPDATE), 1);
	ck_assert_int_eq(ckpt_txn_put(t1, "other", 5, "o", 1), 0);
	tl_engine_put(e, "dir", 3, "v2", 2);
	ck_assert_int_eq(ckpt_txn_commit(t1, false), -EAGAIN);
	expect_val(e, "other", NULL);

	/* disjoint keys: both commit */
	ck_assert_int_eq(ckpt_txn_begin(e, &t1), 0);
	ck_assert_int_eq(ckpt_txn_begin(e, &t2), 0);
	ck_assert_int_eq(ckpt_txn_has(t1, "x1", 2, CKPT_TXN_FOR_UPDATE), 0);
	ck_assert_int_eq(ckpt_txn_has(t2, "x2", 2, CKPT_TXN_FOR_UPDATE), 0);
	ck_assert_int_eq(ckpt_txn_put(t1, "x1", 2, "1", 1), 0);
	ck_assert_int_eq(ckpt_txn_put(t2, "x2", 2, "2", 1), 0);
	ck_assert_int_eq(ckpt_txn_commit(t1, true), 0);
	ck_assert_int_eq(ckpt_txn_commit(t2, true), 0);
	expect_val(e, "x1", "1");
	expect_val(e, "x2", "2");
	ckpt_engine_close(e);
}
END_TEST

/* Commits survive the writer's death without a close: a durable one by
 * contract, a non-durable one because the engine has it once commit
 * returned (only a power loss may take it).  The child commits and exits
 * without closing; the parent reopens. */
START_TEST(test_commit_survives_crash)
{
	pid_t pid;
	int status;
	ckpt_engine *e;

	(void)engine_name(_i); /* ixdir before the fork: the child's is the parent's */
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct ckpt_engine_opts o = { .create = true };
		ckpt_txn *t;
		char err[256];

		if (ckpt_engine_open(engine_name(_i), ixdir, &o, &e, err, sizeof(err)) < 0 ||
		    ckpt_txn_begin(e, &t) < 0 || ckpt_txn_put(t, "durable", 7, "d", 1) < 0 ||
		    ckpt_txn_commit(t, true) < 0 || ckpt_txn_begin(e, &t) < 0 ||
		    ckpt_txn_put(t, "lazy", 4, "l", 1) < 0 || ckpt_txn_commit(t, false) < 0 ||
		    ckpt_txn_begin(e, &t) < 0 || ckpt_txn_put(t, "aborted", 7, "a", 1) < 0)
			_exit(1);
		ckpt_txn_abort(t);
		_exit(0); /* no close, no flush */
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFEXITED(status));
	ck_assert_int_eq(WEXITSTATUS(status), 0);
	e = open_as(_i, false, false);
	expect_val(e, "durable", "d");
	expect_val(e, "lazy", "l");
	expect_val(e, "aborted", NULL);
	ckpt_engine_close(e);
}
END_TEST

START_TEST(test_reopen_and_read_only)
{
	ckpt_engine *e = open_e(_i), *ro;
	ckpt_txn *t = NULL;
	ckpt_scan *sc;
	const uint8_t *k, *v;
	size_t kl, vl;

	tl_engine_put(e, "kept", 4, "yes", 3);
	ck_assert_int_eq(ckpt_engine_sync(e), 0);
	ckpt_engine_close(e);
	e = open_as(_i, false, false);
	expect_val(e, "kept", "yes");
	ckpt_engine_close(e);
	/* read-only: reads and scans work, transactions are refused */
	ro = open_as(_i, false, true);
	expect_val(ro, "kept", "yes");
	ck_assert_int_eq(ckpt_txn_begin(ro, &t), -EROFS);
	ck_assert_ptr_null(t);
	ck_assert_int_eq(ckpt_scan_new(ro, NULL, "k", 1, NULL, 0, &sc), 0);
	ck_assert_int_eq(ckpt_scan_next(sc, &k, &kl, &v, &vl), 1);
	ck_assert_uint_eq(kl, 4);
	ck_assert_mem_eq(k, "kept", 4);
	ck_assert_int_eq(ckpt_scan_next(sc, &k, &kl, &v, &vl), 0);
	ckpt_scan_free(sc);
	ckpt_engine_close(ro);
}
END_TEST

START_TEST(test_scan_prefix_bounds)
{
	ckpt_engine *e = open_e(_i);
	uint8_t key[CKPT_KEY_MAX], prefix[9];
	const uint8_t *k, *v;
	size_t kl, vl, klen;
	ckpt_scan *it = NULL;
	int r, n;
	/* dentries of directories 4, 5, 6 and 0x105 (shares 7 bytes with 5)
	 * plus other record types around them */
	static const struct {
		uint64_t parent;
		const char *name;
	} ents[] = {
		{ 5, "b" }, { 4, "z" }, { 5, "a" }, { 6, "a" }, { 0x105, "a" }, { 5, "ab" },
		{ 5, "\xff" },
	};

	for (size_t i = 0; i < CKPT_ARRAY_SIZE(ents); i++) {
		klen = ckpt_key_dentry(key, ents[i].parent, ents[i].name, strlen(ents[i].name));
		tl_engine_put(e, key, klen, ents[i].name, strlen(ents[i].name));
	}
	klen = ckpt_key_ino(key, CKPT_KEY_INODE, 5);
	tl_engine_put(e, key, klen, "inode", 5);
	klen = ckpt_key_ino(key, CKPT_KEY_FILE, 5);
	tl_engine_put(e, key, klen, "file", 4);

	prefix[0] = CKPT_KEY_DENTRY;
	ckpt_put_be64(prefix + 1, 5);
	ck_assert_int_eq(ckpt_scan_new(e, NULL, prefix, sizeof(prefix), NULL, 0, &it), 0);
	{
		static const char *want[] = { "a", "ab", "b", "\xff" };
		n = 0;
		while ((r = ckpt_scan_next(it, &k, &kl, &v, &vl)) == 1) {
			ck_assert_int_lt(n, 4);
			ck_assert_uint_eq(kl, 9 + strlen(want[n]));
			ck_assert_mem_eq(k, prefix, 9);
			ck_assert_mem_eq(k + 9, want[n], strlen(want[n]));
			ck_assert_uint_eq(vl, strlen(want[n]));
			ck_assert_mem_eq(v, want[n], vl);
			n++;
		}
		ck_assert_int_eq(r, 0);
		ck_assert_int_eq(n, 4);
		/* stays at the end */
		ck_assert_int_eq(ckpt_scan_next(it, &k, &kl, &v, &vl), 0);
	}
	ckpt_scan_free(it);

	/* a range: the same prefix from "ab" on */
	klen = ckpt_key_dentry(key, 5, "ab", 2);
	ck_assert_int_eq(ckpt_scan_new(e, NULL, prefix, sizeof(prefix), key, klen, &it), 0);
	ck_assert_int_eq(ckpt_scan_next(it, &k, &kl, &v, &vl), 1);
	ck_assert_mem_eq(k + 9, "ab", 2);
	ck_assert_int_eq(ckpt_scan_next(it, &k, &kl, &v, &vl), 1);
	ck_assert_mem_eq(k + 9, "b", 1);
	ck_assert_int_eq(ckpt_scan_next(it, &k, &kl, &v, &vl), 1);
	ck_assert_int_eq(ckpt_scan_next(it, &k, &kl, &v, &vl), 0);
	ckpt_scan_free(it);
	/* a start before the prefix changes nothing; one past it finds none */
	ck_assert_int_eq(ckpt_scan_new(e, NULL, prefix, sizeof(prefix), "A", 1, &it), 0);
	ck_assert_int_eq(ckpt_scan_next(it, &k, &kl, &v, &vl), 1);
	ck_assert_mem_eq(k + 9, "a", 1);
	ckpt_scan_free(it);
	ck_assert_int_eq(ckpt_scan_new(e, NULL, prefix, sizeof(prefix), "E", 1, &it), 0);
	ck_assert_int_eq(ckpt_scan_next(it, &k, &kl, &v, &vl), 0);
	ckpt_scan_free(it);

	/* one-byte prefix: all 7 dentries, ordered by big-endian parent */
	prefix[0] = CKPT_KEY_DENTRY;
	ck_assert_int_eq(ckpt_scan_new(e, NULL, prefix, 1, NULL, 0, &it), 0);
	{
		uint64_t last = 0;
		n = 0;
		while ((r = ckpt_scan_next(it, &k, &kl, &v, &vl)) == 1) {
			uint64_t p = ckpt_get_be64(k + 1);
			ck_assert_uint_eq(k[0], CKPT_KEY_DENTRY);
			ck_assert_uint_ge(p, last);
			last = p;
			n++;
		}
		ck_assert_int_eq(r, 0);
		ck_assert_int_eq(n, 7);
		ck_assert_uint_eq(last, 0x105);
	}
	ckpt_scan_free(it);

	/* a prefix nothing has, and one past every key */
	ck_assert_int_eq(ckpt_scan_new(e, NULL, "E", 1, NULL, 0, &it), 0);
	ck_assert_int_eq(ckpt_scan_next(it, &k, &kl, &v, &vl), 0);
	ckpt_scan_free(it);
	ck_assert_int_eq(ckpt_scan_new(e, NULL, "\xff\xff", 2, NULL, 0, &it), 0);
	ck_assert_int_eq(ckpt_scan_next(it, &k, &kl, &v, &vl), 0);
	ckpt_scan_free(it);
	/* empty prefix: everything (7 + 2 keys) */
	ck_assert_int_eq(ckpt_scan_new(e, NULL, "", 0, NULL, 0, &it), 0);
	n = 0;
	while (ckpt_scan_next(it, &k, &kl, &v, &vl) == 1)
		n++;
	ck_assert_int_eq(n, 9);
	ckpt_scan_free(it);
	/* the longest key is a valid prefix */
	{
		uint8_t big[CKPT_KEY_MAX];
		memset(big, 'D', sizeof(big));
		ck_assert_int_eq(ckpt_scan_new(e, NULL, big, CKPT_KEY_MAX, NULL, 0, &it), 0);
		ck_assert_int_eq(ckpt_scan_next(it, &k, &kl, &v, &vl), 0);
		ckpt_scan_free(it);
	}
	ckpt_scan_free(NULL);
	ckpt_engine_close(e);
}
END_TEST

START_TEST(test_scan_snapshot)
{
	ckpt_engine *e = open_e(_i);
	const uint8_t *k, *v;
	size_t kl, vl;
	ckpt_scan *it;
	ckpt_txn *t;
	int n = 0;

	tl_engine_put(e, "Pa", 2, "1", 1);
	tl_engine_put(e, "Pb", 2, "2", 1);
	tl_engine_put(e, "Pc", 2, "3", 1);
	ck_assert_int_eq(ckpt_scan_new(e, NULL, "P", 1, NULL, 0, &it), 0);
	/* changes after the scan was created are invisible to it */
	ck_assert_int_eq(ckpt_txn_begin(e, &t), 0);
	ckpt_txn_delete(t, "Pb", 2);
	ckpt_txn_put(t, "Pa", 2, "changed", 7);
	ckpt_txn_put(t, "Pab", 3, "new", 3);
	ckpt_txn_put(t, "Pd", 2, "new", 3);
	ck_assert_int_eq(ckpt_txn_commit(t, false), 0);
	{
		static const char *keys[] = { "Pa", "Pb", "Pc" };
		static const char *vals[] = { "1", "2", "3" };
		while (ckpt_scan_next(it, &k, &kl, &v, &vl) == 1) {
			ck_assert_int_lt(n, 3);
			ck_assert_uint_eq(kl, 2);
			ck_assert_mem_eq(k, keys[n], 2);
			ck_assert_uint_eq(vl, 1);
			ck_assert_mem_eq(v, vals[n], 1);
			n++;
			if (n == 2) /* and after it started */
				del1(e, "Pc", 2);
		}
	}
	ck_assert_int_eq(n, 3);
	ckpt_scan_free(it);
	/* a new scan sees the new state: Pa(changed), Pab, Pd */
	ck_assert_int_eq(ckpt_scan_new(e, NULL, "P", 1, NULL, 0, &it), 0);
	n = 0;
	while (ckpt_scan_next(it, &k, &kl, &v, &vl) == 1) {
		if (n == 0) {
			ck_assert_uint_eq(vl, 7);
			ck_assert_mem_eq(v, "changed", 7);
		}
		if (n == 1) {
			ck_assert_uint_eq(kl, 3);
			ck_assert_mem_eq(k, "Pab", 3);
		}
		n++;
	}
	ck_assert_int_eq(n, 3);
	ckpt_scan_free(it);
	ckpt_engine_close(e);
}
END_TEST

/* A scan in a transaction sees the transaction's own writes over the
 * committed state. */
START_TEST(test_scan_in_txn)
{
	ckpt_engine *e = open_e(_i);
	const uint8_t *k, *v;
	size_t kl, vl;
	ckpt_scan *it;
	ckpt_txn *t;
	static const char *want[] = { "Qa", "Qb", "Qd" };
	int n = 0;

	tl_engine_put(e, "Qa", 2, "1", 1);
	tl_engine_put(e, "Qc", 2, "3", 1);
	ck_assert_int_eq(ckpt_txn_begin(e, &t), 0);
	ckpt_txn_put(t, "Qb", 2, "2", 1);
	ckpt_txn_put(t, "Qd", 2, "4", 1);
	ckpt_txn_delete(t, "Qc", 2);
	ck_assert_int_eq(ckpt_scan_new(e, t, "Q", 1, NULL, 0, &it), 0);
	while (ckpt_scan_next(it, &k, &kl, &v, &vl) == 1) {
		ck_assert_int_lt(n, 3);
		ck_assert_uint_eq(kl, 2);
		ck_assert_mem_eq(k, want[n], 2);
		n++;
	}
	ck_assert_int_eq(n, 3);
	ckpt_scan_free(it);
	ckpt_txn_abort(t);
	/* committed state unchanged: Qa, Qc */
	ck_assert_int_eq(ckpt_scan_new(e, NULL, "Q", 1, NULL, 0, &it), 0);
	n = 0;
	while (ckpt_scan_next(it, &k, &kl, &v, &vl) == 1)
		n++;
	ck_assert_int_eq(n, 2);
	ckpt_scan_free(it);
	ckpt_engine_close(e);
}
END_TEST

static struct ckpt_extent_list *list3(void)
{
	struct ckpt_extent_list *l = ckpt_extent_list_new();
	ckpt_digest d;

	memset(&d, 7, sizeof(d));
	ck_assert_int_eq(ckpt_extent_list_append(l, 100, CKPT_EXT_CHUNK, &d), 0);
	ck_assert_int_eq(ckpt_extent_list_append(l, 200, CKPT_EXT_ZERO, NULL), 0);
	ck_assert_int_eq(ckpt_extent_list_append(l, 50, CKPT_EXT_CHUNK, &d), 0);
	return l;
}

/* Records written through an engine come back byte-identical. */
START_TEST(test_records_through_engine)
{
	ckpt_engine *e = open_e(_i);
	struct ckpt_extent_list *l = list3(), *out = NULL;
	uint8_t key[16], *enc, *v;
	size_t enclen, vl;
	struct ckpt_inode in = { .ino = 5, .mode = 0100600, .nlink = 1, .size = 350 }, in2;
	uint8_t rec[CKPT_INODE_REC_LEN];

	ck_assert_int_eq(ckpt_extent_list_encode(l, &enc, &enclen), 0);
	tl_engine_put(e, key, ckpt_key_ino(key, CKPT_KEY_FILE, 5), enc, enclen);
	ckpt_inode_encode(&in, rec);
	tl_engine_put(e, key, ckpt_key_ino(key, CKPT_KEY_INODE, 5), rec, sizeof(rec));

	ck_assert_int_eq(ckpt_engine_get(e, key, ckpt_key_ino(key, CKPT_KEY_FILE, 5), &v, &vl), 0);
	ck_assert_uint_eq(vl, enclen);
	ck_assert_mem_eq(v, enc, enclen);
	ck_assert_int_eq(ckpt_extent_list_decode(v, vl, &out), 0);
	ck_assert_uint_eq(out->size, 350);
	free(v);
	ck_assert_int_eq(ckpt_engine_get_fixed(e, key, ckpt_key_ino(key, CKPT_KEY_INODE, 5), rec,
					       sizeof(rec)),
			 0);
	ck_assert_int_eq(ckpt_inode_decode(5, rec, sizeof(rec), &in2), 0);
	ck_assert_uint_eq(in2.size, 350);
	ck_assert_uint_eq(in2.mode, 0100600);
	ckpt_extent_list_free(out);
	ckpt_extent_list_free(l);
	free(enc);
	ckpt_engine_close(e);
}
END_TEST

/* ------------------------------------------------------ PostgreSQL only */

static int pg_index(void)
{
	for (int i = 0; ckpt_engine_at((size_t)i); i++)
		if (ckpt_engine_at((size_t)i) == &ckpt_engine_postgres)
			return i;
	ck_abort_msg("postgresql engine not registered");
	return -1;
}

struct incr_arg {
	int child, n;
};

/* Increment "ctr" and add a "log" key naming this increment, in one
 * transaction. */
static int incr_txn(ckpt_txn *t, void *arg)
{
	struct incr_arg *a = arg;
	uint8_t buf[8];
	char key[32];
	int r = ckpt_txn_get_fixed(t, "ctr", 3, CKPT_TXN_FOR_UPDATE, buf, 8);

	if (r < 0)
		return r;
	ckpt_put_le64(buf, ckpt_get_le64(buf) + 1);
	ckpt_txn_put(t, "ctr", 3, buf, 8);
	snprintf(key, sizeof(key), "log-%d-%04d", a->child, a->n);
	return ckpt_txn_put(t, key, strlen(key), "", 0);
}

/* Processes sharing the engine (as daemons on several nodes do) increment
 * one counter at once: conflicts are retried, none is lost and every
 * commit is whole (the counter equals the number of log keys). */
START_TEST(test_pg_processes_conflict)
{
	enum { PROCS = 4, EACH = 60 };
	int pi = pg_index();
	ckpt_engine *e = open_e(pi);
	pid_t pids[PROCS];
	uint8_t buf[8];
	const uint8_t *k, *v;
	size_t kl, vl;
	ckpt_scan *sc;
	int status, nlog = 0;

	ckpt_put_le64(buf, 0);
	tl_engine_put(e, "ctr", 3, buf, 8);
	for (int c = 0; c < PROCS; c++) {
		pids[c] = fork();
		ck_assert_int_ge(pids[c], 0);
		if (pids[c] == 0) {
			ckpt_engine *ce = NULL;
			struct ckpt_engine_opts o = { 0 };
			char err[256];
			if (ckpt_engine_open("postgresql", ixdir, &o, &ce, err, sizeof(err)) < 0)
				_exit(2);
			for (int n = 0; n < EACH; n++) {
				struct incr_arg a = { c, n };
				if (ckpt_txn_run(ce, incr_txn, &a, false) < 0)
					_exit(3);
			}
			ckpt_engine_close(ce);
			_exit(0);
		}
	}
	for (int c = 0; c < PROCS; c++) {
		ck_assert_int_eq(waitpid(pids[c], &status, 0), pids[c]);
		ck_assert(WIFEXITED(status));
		ck_assert_int_eq(WEXITSTATUS(status), 0);
	}
	ck_assert_int_eq(ckpt_engine_get_fixed(e, "ctr", 3, buf, 8), 0);
	ck_assert_uint_eq(ckpt_get_le64(buf), PROCS * EACH);
	ck_assert_int_eq(ckpt_scan_new(e, NULL, "log-", 4, NULL, 0, &sc), 0);
	while (ckpt_scan_next(sc, &k, &kl, &v, &vl) == 1)
		nlog++;
	ckpt_scan_free(sc);
	ck_assert_int_eq(nlog, PROCS * EACH);
	ckpt_engine_close(e);
}
END_TEST

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The server stops: calls fail with -EIO once their deadline has passed
 * (they do not hang); it starts again: the same engine reconnects by
 * itself and sees what was committed before. */
START_TEST(test_pg_server_down_then_back)
{
	struct ckpt_engine_opts o = { .create = true, .timeout_ms = 1500 };
	ckpt_engine *e = NULL;
	ckpt_txn *t;
	uint8_t *v = NULL;
	size_t vl;
	char err[256];
	double t0, dt;

	ck_assert_msg(ckpt_engine_open(engine_name(pg_index()), ixdir, &o, &e, err, sizeof(err)) ==
			      0,
		      "%s", err);
	tl_engine_put(e, "before", 6, "b", 1);
	tl_pg_server_stop();
	t0 = now_s();
	ck_assert_int_eq(ckpt_engine_get(e, "before", 6, &v, &vl), -EIO);
	dt = now_s() - t0;
	/* it retried for most of its deadline, and gave up well before a hang */
	ck_assert_msg(dt >= 0.5 && dt < 10.0, "a get with the server down took %.2f s", dt);
	ck_assert_int_eq(ckpt_txn_begin(e, &t), 0);
	t0 = now_s();
	{ /* a write of a key not read first asks the server for its snapshot */
		int r = ckpt_txn_put(t, "during", 6, "d", 1);
		ck_assert_msg(r == 0 || r == -EIO, "put: %d", r);
	}
	ck_assert_int_eq(ckpt_txn_commit(t, true), -EIO);
	ck_assert_double_lt(now_s() - t0, 10.0);
	tl_pg_server_start();
	expect_val(e, "before", "b");
	expect_val(e, "during", NULL);
	tl_engine_put(e, "after", 5, "a", 1);
	expect_val(e, "after", "a");
	ckpt_engine_close(e);
}
END_TEST

/* What the engine refuses to open: metadata of another format version
 * (named), and a connection string's password never appears in a
 * message. */
START_TEST(test_pg_refusals)
{
	struct ckpt_engine_opts o = { .create = false };
	ckpt_engine *e = open_e(pg_index()), *e2 = NULL;
	char err[512] = "", where[400];
	PGconn *c;
	PGresult *res;

	ckpt_engine_close(e);
	c = PQconnectdb(ixdir);
	ck_assert_int_eq(PQstatus(c), CONNECTION_OK);
	res = PQexec(c, "UPDATE ckptfs_format SET version = 7");
	ck_assert_int_eq(PQresultStatus(res), PGRES_COMMAND_OK);
	PQclear(res);
	PQfinish(c);
	ck_assert_int_eq(ckpt_engine_open("postgresql", ixdir, &o, &e2, err, sizeof(err)),
			 -EPROTONOSUPPORT);
	ck_assert_ptr_null(e2);
	ck_assert_msg(strstr(err, "version 7") != NULL, "%s", err);
	/* trust authentication ignores the password; the message must not show it */
	snprintf(where, sizeof(where), "%s password=sekrit-word", ixdir);
	ck_assert_int_lt(ckpt_engine_open("postgresql", where, &o, &e2, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "sekrit") == NULL, "%s", err);
	ck_assert_msg(strstr(err, "password not shown") != NULL, "%s", err);
	ck_assert_int_eq(ckpt_engine_open("postgresql", "host=/nonexistent dbname=x connect_timeout=2",
					  &(struct ckpt_engine_opts){ .timeout_ms = 500 }, &e2,
					  err, sizeof(err)),
			 -EIO);
	ck_assert_msg(strstr(err, "cannot connect") != NULL, "%s", err);
	/* version 1 (before the records of several nodes): read as it is,
	 * upgraded to 2 by a read-write open */
	c = PQconnectdb(ixdir);
	res = PQexec(c, "UPDATE ckptfs_format SET version = 1");
	ck_assert_int_eq(PQresultStatus(res), PGRES_COMMAND_OK);
	PQclear(res);
	ck_assert_int_eq(ckpt_engine_open("postgresql", ixdir,
					  &(struct ckpt_engine_opts){ .read_only = true }, &e2, err,
					  sizeof(err)),
			 0);
	ckpt_engine_close(e2);
	res = PQexec(c, "SELECT version FROM ckptfs_format");
	ck_assert_str_eq(PQgetvalue(res, 0, 0), "1");
	PQclear(res);
	ck_assert_int_eq(ckpt_engine_open("postgresql", ixdir, &o, &e2, err, sizeof(err)), 0);
	ckpt_engine_close(e2);
	e2 = NULL;
	res = PQexec(c, "SELECT version FROM ckptfs_format");
	ck_assert_str_eq(PQgetvalue(res, 0, 0), "2");
	PQclear(res);
	PQfinish(c);
}
END_TEST

static void pg_setup(void)
{
	tl_pg_server_start(); /* if a failed test left it stopped */
	setup();
}

/* ------------------------------------------------------ RocksDB only */

/* Write-ahead logs in ixdir. */
static int wal_count(void)
{
	DIR *d = opendir(ixdir);
	struct dirent *de;
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d))) {
		size_t len = strlen(de->d_name);
		if (len > 4 && strcmp(de->d_name + len - 4, ".log") == 0)
			n++;
	}
	closedir(d);
	return n;
}

static int rocksdb_index(void)
{
	for (int i = 0; ckpt_engine_at((size_t)i); i++)
		if (ckpt_engine_at((size_t)i) == &ckpt_engine_rocksdb)
			return i;
	ck_abort_msg("rocksdb engine not registered");
	return -1;
}

/* Opens that write nothing must not pile up empty write-ahead logs (RocksDB
 * 7.x keeps one per open until a flush), and dropping them must keep the
 * data. */
START_TEST(test_rocksdb_reopen_keeps_few_wals)
{
	int ri = rocksdb_index();
	ckpt_engine *e = open_e(ri);
	int most = 0;

	tl_engine_put(e, "kept", 4, "v", 1);
	ck_assert_int_eq(ckpt_engine_flush(e), 0);
	ckpt_engine_close(e);
	for (int i = 0; i < 20; i++) {
		e = open_e(ri);
		expect_val(e, "kept", "v");
		ckpt_engine_close(e);
		if (wal_count() > most)
			most = wal_count();
	}
	ck_assert_int_le(most, 6);
	ck_assert_int_ge(most, 1);
}
END_TEST

/* One read-write opener at a time (the store's own lock file guards this
 * too); read-only opens take no lock. */
START_TEST(test_rocksdb_second_rw_open_busy)
{
	int ri = rocksdb_index();
	struct ckpt_engine_opts o = { .create = true };
	ckpt_engine *e = open_e(ri), *e2 = NULL, *ro;
	char err[256] = "";

	tl_engine_put(e, "a", 1, "1", 1);
	ck_assert_int_eq(ckpt_engine_open("rocksdb", ixdir, &o, &e2, err, sizeof(err)), -EBUSY);
	ck_assert_ptr_null(e2);
	ck_assert_str_ne(err, "");
	ro = open_as(ri, false, true);
	expect_val(ro, "a", "1");
	ckpt_engine_close(ro);
	ckpt_engine_close(e);
}
END_TEST

static Suite *engine_suite(void)
{
	Suite *s = suite_create("engine");
	TCase *reg = tcase_create("registry");
	TCase *each = tcase_create("each engine");
	TCase *pg = tcase_create("postgresql");
	TCase *rdb = tcase_create("rocksdb");
	int n = (int)n_engines();

	tl_tcase_dirs(reg, "check_engine-");
	tcase_add_checked_fixture(reg, setup, teardown);
	tcase_add_test(reg, test_registry);
	tcase_add_test(reg, test_open_unknown_engine);
	suite_add_tcase(s, reg);

	tl_tcase_dirs(each, "check_engine-");
	tcase_add_unchecked_fixture(each, tl_pg_start, tl_pg_stop);
	tcase_add_checked_fixture(each, setup, teardown);
	tcase_set_timeout(each, 60);
	tcase_add_loop_test(each, test_open_missing_no_create, 0, n);
	tcase_add_loop_test(each, test_get_put_delete, 0, n);
	tcase_add_loop_test(each, test_get_many, 0, n);
	tcase_add_loop_test(each, test_txn_isolation, 0, n);
	tcase_add_loop_test(each, test_txn_conflict_read_for_update, 0, n);
	tcase_add_loop_test(each, test_txn_conflict_absent_and_disjoint, 0, n);
	tcase_add_loop_test(each, test_commit_survives_crash, 0, n);
	tcase_add_loop_test(each, test_reopen_and_read_only, 0, n);
	tcase_add_loop_test(each, test_scan_prefix_bounds, 0, n);
	tcase_add_loop_test(each, test_scan_snapshot, 0, n);
	tcase_add_loop_test(each, test_scan_in_txn, 0, n);
	tcase_add_loop_test(each, test_records_through_engine, 0, n);
	suite_add_tcase(s, each);

	tl_tcase_dirs(pg, "check_engine-");
	tcase_add_unchecked_fixture(pg, tl_pg_start, tl_pg_stop);
	tcase_add_checked_fixture(pg, pg_setup, teardown);
	tcase_set_timeout(pg, 60);
	tcase_add_test(pg, test_pg_processes_conflict);
	tcase_add_test(pg, test_pg_server_down_then_back);
	tcase_add_test(pg, test_pg_refusals);
	suite_add_tcase(s, pg);

	tl_tcase_dirs(rdb, "check_engine-");
	tcase_add_checked_fixture(rdb, setup, teardown);
	tcase_set_timeout(rdb, 60);
	tcase_add_test(rdb, test_rocksdb_reopen_keeps_few_wals);
	tcase_add_test(rdb, test_rocksdb_second_rw_open_busy);
	suite_add_tcase(s, rdb);
	return s;
}

int main(void)
{
	return tl_run(engine_suite());
}
