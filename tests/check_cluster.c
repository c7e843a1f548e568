/* SPDX-License-Identifier: MIT */
/*
 * check_cluster.c - the pieces of several nodes on one store that the
 * store itself holds (docs/cluster.md section 7; core/store/session.c),
 * on the PostgreSQL engine of the suite's own server (pglib.h): the codecs
 * of the session, refcount-0 and unit records; a node's session row from
 * open to free and the refusal of a second live daemon with its id; the gc
 * fence (a node whose session gc declared dead cannot commit content put
 * before, and commits again with a new session); the pin (gc drops a chunk
 * that fell to refcount 0 only when no live node's save in flight can
 * still reference it); a dead session's row removed by gc; and the
 * refcount-0 entry that is no dedup hit on a node.
 */
#include <check.h>
#include <errno.h>
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
#include "pglib.h"
#include "testlib.h"

static char tdir[96];
static char spath[128];
static char where[256];

static void setup(void)
{
	tl_test_dir(tdir, sizeof(tdir));
	snprintf(spath, sizeof(spath), "%s/store", tdir);
	tl_pg_new_db(where, sizeof(where));
}

static void teardown(void)
{
	tl_dir_remove(tdir);
}

static struct ckpt_store_opts node_opts(const char *node, uint32_t timeout_ms)
{
	struct ckpt_store_opts o;

	ckpt_store_opts_init(&o);
	o.mode = CKPT_STORE_RW;
	o.create = true;
	o.meta_engine = "postgresql";
	o.meta_where = where;
	o.node = true;
	o.node_name = node;
	o.session_timeout_ms = timeout_ms;
	return o;
}

static ckpt_store *open_node(const char *node, uint32_t timeout_ms)
{
	struct ckpt_store_opts o = node_opts(node, timeout_ms);

	return tl_store_open(spath, &o);
}

/* ckpt gc beside mounted nodes */
static ckpt_store *open_gc(void)
{
	struct ckpt_store_opts o;

	ckpt_store_opts_init(&o);
	o.mode = CKPT_STORE_RW;
	o.meta_engine = "postgresql";
	o.meta_where = where;
	o.gc_online = true;
	return tl_store_open(spath, &o);
}

static struct ckpt_gc_stats gc(ckpt_store *g)
{
	struct ckpt_gc_stats st;

	ck_assert_int_eq(ckpt_store_gc(g, &st), 0);
	ck_assert(st.online);
	return st;
}

/* The session row of node, read below the store: 0, or -ENOENT. */
static int get_session(ckpt_store *s, const char *node, struct ckpt_session *ret)
{
	uint8_t key[1 + CKPT_NODE_MAX], *v = NULL;
	size_t vl = 0;
	int r = ckpt_engine_get(ckpt_store_engine(s), key, ckpt_key_session(key, node), &v, &vl);

	if (r == 0) {
		ck_assert_int_eq(ckpt_session_decode(v, vl, ret), 0);
		free(v);
	}
	return r;
}

static int del_key_txn(ckpt_txn *t, void *arg)
{
	const uint8_t *key = arg;

	return ckpt_txn_delete(t, key + 1, key[0]);
}

/* What gc's declaration of a dead session does to its row. */
static void delete_session(ckpt_store *s, const char *node)
{
	uint8_t key[2 + CKPT_NODE_MAX];

	key[0] = (uint8_t)ckpt_key_session(key + 1, node);
	ck_assert_int_eq(ckpt_txn_run(ckpt_store_engine(s), del_key_txn, key, true), 0);
}

/* The 'Z' mark of d: its epoch, or -1 when there is none. */
static int64_t zero_mark(ckpt_store *s, const ckpt_digest *d)
{
	uint8_t key[32], buf[CKPT_ZERO_REC_LEN];
	uint64_t e;
	int r = ckpt_engine_get_fixed(ckpt_store_engine(s), key, ckpt_key_zero(key, d), buf,
				      sizeof(buf));

	if (r == -ENOENT)
		return -1;
	ck_assert_int_eq(r, 0);
	ck_assert_int_eq(ckpt_zero_decode(buf, sizeof(buf), &e), 0);
	return (int64_t)e;
}

/* Give file ino the content: the chunks d[0..n), each len bytes. */
static int commit_chunks(ckpt_store *s, uint64_t ino, const ckpt_digest *d, size_t n, size_t len,
			 bool durable)
{
	struct ckpt_extent_list *l = ckpt_extent_list_new();
	int r;

	ck_assert_ptr_nonnull(l);
	for (size_t i = 0; i < n; i++)
		ck_assert_int_eq(ckpt_extent_list_append(l, (uint32_t)len, CKPT_EXT_CHUNK, &d[i]), 0);
	r = ckpt_store_commit_file(s, ino, l, 0, ckpt_now_ns(), durable);
	ckpt_extent_list_free(l);
	return r;
}

static uint64_t refs_of(ckpt_store *s, const ckpt_digest *d)
{
	struct ckpt_chunk_loc loc;
	uint64_t refs = 0;

	ck_assert_int_eq(ckpt_store_chunk_loc(s, d, &loc, &refs), 0);
	return refs;
}

START_TEST(test_records)
{
	struct ckpt_session a = { .id = 0x1122334455667788ull, .heartbeat_ns = 1700000000123456789,
				  .pin = 42, .timeout_ms = 60000, .pid = 4242 }, b;
	uint8_t buf[CKPT_SESSION_REC_MAX], key[1 + CKPT_NODE_MAX], z[CKPT_ZERO_REC_LEN];
	ckpt_digest d = tl_digest(7);
	uint64_t v;
	size_t n;

	snprintf(a.host, sizeof(a.host), "node-17.cluster");
	n = ckpt_session_encode(&a, buf);
	a.suspect_ns = 5;
	n = ckpt_session_encode(&a, buf);
	ck_assert_uint_eq(n, 42 + strlen(a.host));
	ck_assert_uint_eq(buf[0], 1); /* version */
	ck_assert_int_eq(ckpt_session_decode(buf, n, &b), 0);
	ck_assert_uint_eq(b.id, a.id);
	ck_assert_int_eq(b.heartbeat_ns, a.heartbeat_ns);
	ck_assert_uint_eq(b.pin, 42);
	ck_assert_uint_eq(b.timeout_ms, 60000);
	ck_assert_uint_eq(b.pid, 4242);
	ck_assert_str_eq(b.host, a.host);
	ck_assert_int_eq(b.suspect_ns, 5);
	ck_assert_int_eq(ckpt_session_decode(buf, n - 1, &b), -EIO);
	buf[0] = 2;
	ck_assert_int_eq(ckpt_session_decode(buf, n, &b), -EIO);
	ck_assert_uint_eq(ckpt_key_session(key, "n1"), 3);
	ck_assert_uint_eq(key[0], 'S');

	ckpt_zero_encode(9, z);
	ck_assert_int_eq(ckpt_zero_decode(z, sizeof(z), &v), 0);
	ck_assert_uint_eq(v, 9);
	ck_assert_int_eq(ckpt_zero_decode(z, sizeof(z) - 1, &v), -EIO);
	ck_assert_uint_eq(ckpt_key_zero(key, &d), 17);
	ck_assert_uint_eq(key[0], 'Z');
	ckpt_unit_encode(77, z);
	ck_assert_int_eq(ckpt_unit_decode(z, sizeof(z), &v), 0);
	ck_assert_uint_eq(v, 77);
	ck_assert_uint_eq(ckpt_key_unit(key, 5), 9);
	ck_assert_uint_eq(key[0], 'U');

	ck_assert(ckpt_node_name_ok("n1"));
	ck_assert(ckpt_node_name_ok("gpu-17.rack_3:a"));
	ck_assert(!ckpt_node_name_ok(""));
	ck_assert(!ckpt_node_name_ok("a/b"));
	ck_assert(!ckpt_node_name_ok("a b"));
	ck_assert(!ckpt_node_name_ok(
		"0123456789012345678901234567890123456789012345678901234567890123456789"));
}
END_TEST

START_TEST(test_session_lifecycle)
{
	struct ckpt_store_opts o = node_opts("a", 60000);
	struct ckpt_session ss;
	ckpt_store *a = tl_store_open(spath, &o), *b, *c = NULL;
	uint64_t id, n;
	char err[512];

	ck_assert_str_eq(ckpt_store_node(a), "a");
	ckpt_store_session_ids(a, &id, &n);
	ck_assert_uint_ne(id, 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_int_eq(get_session(a, "a", &ss), 0);
	ck_assert_uint_eq(ss.id, id);
	ck_assert_uint_eq(ss.pid, (uint32_t)getpid());
	ck_assert_uint_eq(ss.timeout_ms, 60000);
	ck_assert_uint_ge(ss.pin, 1);

	/* a second live daemon with the same id is refused, naming why */
	o.create = false;
	ck_assert_int_eq(ckpt_store_open(spath, &o, &c, err, sizeof(err)), -EBUSY);
	ck_assert_ptr_null(c);
	ck_assert_msg(strstr(err, "live session") != NULL, "%s", err);
	/* another id is another node */
	b = open_node(NULL, 60000);
	ck_assert_ptr_nonnull(ckpt_store_node(b));
	ck_assert_msg(strchr(ckpt_store_node(b), '-') != NULL, "default id %s",
		      ckpt_store_node(b));
	ck_assert_int_eq(ckpt_store_heartbeat(b), 0);
	ck_assert_int_eq(get_session(a, ckpt_store_node(b), &ss), 0);

	/* a clean close removes the row */
	ckpt_store_free(a);
	ck_assert_int_eq(get_session(b, "a", &ss), -ENOENT);
	/* gc declares a session dead once its heartbeat is older than its
	 * timeout at two passes a timeout apart: a row of a node that stopped
	 * 10 s ago with a 1 s timeout */
	{
		uint8_t key[1 + CKPT_NODE_MAX], val[CKPT_SESSION_REC_MAX];
		struct ckpt_session ghost = { .id = 99, .heartbeat_ns = ckpt_now_ns() - 10000000000,
					      .pin = 1, .timeout_ms = 1000, .pid = 1 };
		struct ckpt_gc_stats st;
		ckpt_store *g;

		snprintf(ghost.host, sizeof(ghost.host), "elsewhere");
		tl_engine_put(ckpt_store_engine(b), key, ckpt_key_session(key, "ghost"), val,
			      ckpt_session_encode(&ghost, val));
		g = open_gc();
		st = gc(g);
		ck_assert_uint_eq(st.sessions_dead, 0);
		ck_assert_uint_eq(st.sessions_suspected, 1);
		ck_assert_uint_eq(st.sessions_live, 2);
		ck_assert_int_eq(get_session(b, "ghost", &ss), 0);
		ck_assert_int_ne(ss.suspect_ns, 0);
		st = gc(g); /* too soon */
		ck_assert_uint_eq(st.sessions_dead, 0);
		usleep(1100 * 1000);
		st = gc(g);
		ck_assert_uint_eq(st.sessions_dead, 1);
		ck_assert_uint_eq(st.sessions_live, 1); /* b */
		ck_assert_int_eq(get_session(b, "ghost", &ss), -ENOENT);
		ck_assert_int_eq(get_session(b, ckpt_store_node(b), &ss), 0);
		ckpt_store_free(g);
	}
	ckpt_store_free(b);
}
END_TEST

START_TEST(test_fence)
{
	const size_t len = 100000;
	uint8_t *x = tl_random_buf(len, 11), *y = tl_random_buf(len, 12);
	ckpt_store *a = open_node("a", 60000);
	uint64_t id0, id1, n, ino;
	struct ckpt_session ss;
	ckpt_digest dx, dy;
	size_t got;
	uint8_t *back;

	ino = tl_mknode(a, CKPT_ROOT_INO, "f", S_IFREG | 0644);
	ck_assert_int_eq(ckpt_store_put_chunk(a, x, len, 0, &dx), 0); /* pending */
	ckpt_store_session_ids(a, &id0, &n);
	delete_session(a, "a"); /* as gc declares it dead */

	/* the commit reads the session for update: EIO, nothing committed */
	ck_assert_int_eq(commit_chunks(a, ino, &dx, 1, len, true), -EIO);
	ck_assert_int_eq(commit_chunks(a, ino, &dx, 1, len, false), -EIO);
	back = tl_read_file(a, ino, &got);
	ck_assert_uint_eq(got, 0);
	free(back);

	/* the node registers a new session: the fence woke its heartbeat
	 * thread, which may have done it before this call */
	{
		int r = ckpt_store_heartbeat(a);
		ck_assert_msg(r == -ESTALE || r == 0, "heartbeat: %d", r);
	}
	ckpt_store_session_ids(a, &id1, &n);
	ck_assert_uint_ne(id1, id0);
	ck_assert_uint_eq(n, 2);
	ck_assert_int_eq(get_session(a, "a", &ss), 0);
	ck_assert_uint_eq(ss.id, id1);
	ck_assert_int_eq(ckpt_store_heartbeat(a), 0);

	/* what was put in the dead session is never committed ... */
	ck_assert_int_eq(commit_chunks(a, ino, &dx, 1, len, true), -EIO);
	/* ... what is put now is */
	ck_assert_int_eq(ckpt_store_put_chunk(a, y, len, 0, &dy), 0);
	ck_assert_int_eq(ckpt_store_put_chunk(a, x, len, 0, &dx), 0);
	{
		ckpt_digest both[2] = { dy, dx };
		ck_assert_int_eq(commit_chunks(a, ino, both, 2, len, true), 0);
	}
	back = tl_read_file(a, ino, &got);
	ck_assert_uint_eq(got, 2 * len);
	ck_assert_mem_eq(back, y, len);
	ck_assert_mem_eq(back + len, x, len);
	free(back);
	ckpt_store_free(a);
	free(x);
	free(y);
}
END_TEST

START_TEST(test_pin)
{
	const size_t len = 120000;
	uint8_t *w = tl_random_buf(len, 21), *v = tl_random_buf(len, 22);
	ckpt_store *a = open_node("a", 60000), *g;
	struct ckpt_chunk_loc at, at2;
	struct ckpt_gc_stats st;
	ckpt_digest dw, dv, d;
	uint64_t f1, f2, refs;
	ckpt_hold *h;

	f1 = tl_mknode(a, CKPT_ROOT_INO, "f1", S_IFREG | 0644);
	f2 = tl_mknode(a, CKPT_ROOT_INO, "f2", S_IFREG | 0644);
	ck_assert_int_eq(ckpt_store_put_chunk(a, w, len, 0, &dw), 0);
	ck_assert_int_eq(ckpt_store_put_chunk(a, v, len, 0, &dv), 0);
	ck_assert_int_eq(commit_chunks(a, f1, &dw, 1, len, true), 0);
	ck_assert_int_eq(zero_mark(a, &dw), -1);
	g = open_gc();

	/* a save in flight: a hold, then a dedup hit on w (refcount 1) */
	ck_assert_int_eq(ckpt_hold_new(a, &h), 0);
	ck_assert_int_eq(ckpt_store_put_chunk(a, w, len, 0, &d), 0);
	ck_assert_int_eq(ckpt_store_chunk_loc(a, &dw, &at, &refs), 0);
	ck_assert_uint_eq(refs, 1); /* a hit: no pending copy */
	/* another file's rewrite brings w to 0: marked, not yet seen by gc */
	ck_assert_int_eq(commit_chunks(a, f1, &dv, 1, len, true), 0);
	ck_assert_uint_eq(refs_of(a, &dw), 0);
	ck_assert_int_eq(zero_mark(a, &dw), 0);
	/* gc after gc, the node refreshing its session between them: its pin
	 * (the hold's epoch) keeps w */
	for (int i = 0; i < 3; i++) {
		st = gc(g);
		ck_assert_uint_eq(st.chunks_dropped, 0);
		ck_assert_int_eq(ckpt_store_heartbeat(a), 0);
	}
	ck_assert_int_gt(zero_mark(a, &dw), 0); /* stamped */
	/* so the save commits w */
	ck_assert_int_eq(commit_chunks(a, f2, &dw, 1, len, true), 0);
	ck_assert_uint_eq(refs_of(a, &dw), 1);
	ck_assert_int_eq(zero_mark(a, &dw), -1); /* raised from 0: unmarked */
	ckpt_hold_free(h);

	/* without a save in flight, a chunk at 0 goes in two gc runs */
	ck_assert_int_eq(commit_chunks(a, f2, &dv, 1, len, true), 0);
	ck_assert_int_eq(zero_mark(a, &dw), 0);
	st = gc(g); /* stamps */
	ck_assert_uint_eq(st.chunks_dropped, 0);
	ck_assert_int_eq(ckpt_store_heartbeat(a), 0);
	/* on a node an entry at refcount 0 is no dedup hit: a copy is put */
	ck_assert_int_eq(ckpt_store_chunk_loc(a, &dw, &at, &refs), 0);
	ck_assert_uint_eq(refs, 0);
	ck_assert_int_eq(ckpt_store_put_chunk(a, w, len, 0, &d), 0);
	ck_assert_int_eq(ckpt_store_chunk_loc(a, &dw, &at2, &refs), 0);
	ck_assert(!ckpt_chunk_loc_same(&at, &at2));
	st = gc(g); /* drops */
	ck_assert_uint_eq(st.chunks_dropped, 1);
	ck_assert_uint_eq(st.bytes_dropped, at.stored_len);
	{
		struct ckpt_chunk_loc l;
		ck_assert_int_eq(ckpt_meta_get_chunk(ckpt_store_engine(a), NULL, &dw, &l, &refs),
				 -ENOENT);
	}
	ck_assert_int_eq(zero_mark(a, &dw), -1);
	/* the pending copy is still committable after the drop */
	ck_assert_int_eq(commit_chunks(a, f1, &dw, 1, len, true), 0);
	{
		size_t got;
		uint8_t *back = tl_read_file(a, f1, &got);
		ck_assert_uint_eq(got, len);
		ck_assert_mem_eq(back, w, len);
		free(back);
		back = tl_read_file(a, f2, &got);
		ck_assert_mem_eq(back, v, len);
		free(back);
	}
	ckpt_store_free(g);
	ckpt_store_free(a);
	free(w);
	free(v);
}
END_TEST

static Suite *cluster_suite(void)
{
	Suite *s = suite_create("cluster");
	TCase *tc = tcase_create("sessions");

	tl_tcase_dirs(tc, "check_cluster");
	tcase_add_unchecked_fixture(tc, tl_pg_start, tl_pg_stop);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_records);
	tcase_add_test(tc, test_session_lifecycle);
	tcase_add_test(tc, test_fence);
	tcase_add_test(tc, test_pin);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(cluster_suite());
}
