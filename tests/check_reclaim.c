/* SPDX-License-Identifier: MIT */
/*
 * check_reclaim.c - online reclaiming of garbage chunks (core/store/
 * reclaim.c, docs/design.md section 8.2): the background thread drops
 * unreferenced index entries and forgotten pending chunks, so that packs
 * stay near the live data under rewrites, and holds keep whatever a
 * writer or reader may still need.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "store/store.h"
#include "testlib.h"
#include "base/util.h"

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

/* A store with background work (compression inline, so that the only
 * background work is compaction and reclaiming), small packs. */
static ckpt_store *open_bg(bool keep_unreferenced)
{
	struct ckpt_store_opts o;

	ckpt_store_opts_init(&o);
	o.create = true;
	o.bg = CKPT_BG_COMPACT;
	o.pack_max = 4u << 20;
	o.keep_unreferenced = keep_unreferenced;
	return tl_store_open(spath, &o);
}

static ckpt_pool *pool_new(void)
{
	ckpt_pool *p = NULL;

	ck_assert_int_eq(ckpt_pool_new(2, &p), 0);
	return p;
}

static struct ckpt_store_stats settled_stats(ckpt_store *s)
{
	struct ckpt_store_stats st;

	ck_assert_int_eq(ckpt_store_settle(s, 60000), 0);
	ck_assert_int_eq(ckpt_store_stats(s, &st), 0);
	return st;
}

static void report(void *ud, const char *path, const char *what)
{
	(void)ud;
	fprintf(stderr, "fsck: %s: %s\n", path ? path : "-", what);
}

/* Close s and run fsck on the store with nothing else running (as `ckpt
 * fsck` does): it must find no problem. */
static void close_fsck(ckpt_store *s)
{
	struct ckpt_store_opts o;

	ckpt_store_free(s);
	ckpt_store_opts_init(&o);
	o.mode = CKPT_STORE_RO;
	s = tl_store_open(spath, &o);
	ck_assert_int_eq(ckpt_store_fsck(s, report, NULL), 0);
	ckpt_store_free(s);
}

/* Rewrite len bytes at off of file ino through a writer, as a program
 * that opens, writes and closes does; the model follows. */
static void rewrite(ckpt_store *s, ckpt_pool *p, uint64_t ino, uint8_t *model, uint64_t off,
		    size_t len, uint64_t seed)
{
	ckpt_writer *w = NULL;
	uint8_t *buf = tl_random_buf(len, seed);

	ck_assert_int_eq(ckpt_writer_new(s, p, ino, false, &w), 0);
	ck_assert_int_eq(ckpt_writer_write(w, buf, len, off), 0);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ckpt_writer_free(w);
	memcpy(model + off, buf, len);
	free(buf);
}

static bool has_chunk(ckpt_store *s, const ckpt_digest *d)
{
	struct ckpt_chunk_loc loc;

	return ckpt_store_chunk_loc(s, d, &loc, NULL) == 0;
}

/* The digest of the first chunk of ino's committed content. */
static ckpt_digest first_chunk(ckpt_store *s, uint64_t ino)
{
	struct ckpt_extent_list *l = NULL;
	ckpt_digest d;

	ck_assert_int_eq(ckpt_store_load_extents(s, ino, &l), 0);
	ck_assert_uint_gt(l->n, 0);
	ck_assert_int_eq(l->v[0].kind, CKPT_EXT_CHUNK);
	d = l->v[0].digest;
	ckpt_extent_list_free(l);
	return d;
}

#define NFILES 4
#define FSIZE (4u << 20)

/* Rewrites of 1 MiB at random offsets, each by its own writer: once the
 * writes pause, packs hold at most twice the live stored bytes plus a
 * fixed amount, with no gc; with keep_unreferenced they do not (so the
 * bound is what the reclaiming buys). */
START_TEST(test_rewrites_bounded)
{
	bool keep = _i == 1;
	ckpt_store *s = open_bg(keep);
	ckpt_pool *p = pool_new();
	uint8_t *model[NFILES];
	uint64_t ino[NFILES], rng = 42;
	struct ckpt_store_stats st;
	struct ckpt_bg_stats bg;

	for (int i = 0; i < NFILES; i++) {
		char name[16];

		snprintf(name, sizeof(name), "f%d", i);
		model[i] = tl_random_buf(FSIZE, 1000 + (uint64_t)i);
		ino[i] = tl_write_file(s, p, CKPT_ROOT_INO, name, model[i], FSIZE);
	}
	for (int round = 0; round < 3; round++) {
		for (int k = 0; k < 24; k++) {
			int f = (int)(tl_splitmix64(&rng) % NFILES);
			uint64_t off = tl_splitmix64(&rng) % (FSIZE - (1u << 20));

			rewrite(s, p, ino[f], model[f], off, 1u << 20, tl_splitmix64(&rng));
		}
		st = settled_stats(s);
		if (!keep) {
			ck_assert_msg(st.pack_bytes <= 2 * st.stored_bytes + (8u << 20),
				      "round %d: %llu pack bytes for %llu stored", round,
				      (unsigned long long)st.pack_bytes,
				      (unsigned long long)st.stored_bytes);
			ck_assert_uint_eq(st.dead_chunks, 0);
		}
	}
	ckpt_store_bg_stats(s, &bg);
	if (keep) {
		/* 72 MiB rewritten: without the drops it all stays */
		ck_assert_uint_gt(st.pack_bytes, 2 * st.stored_bytes + (8u << 20));
		ck_assert_uint_eq(bg.dropped + bg.pending_dropped, 0);
	} else {
		ck_assert_uint_gt(bg.dropped + bg.pending_dropped, 0);
	}
	for (int i = 0; i < NFILES; i++) {
		size_t len;
		uint8_t *got = tl_read_file(s, ino[i], &len);

		ck_assert_uint_eq(len, FSIZE);
		ck_assert_mem_eq(got, model[i], FSIZE);
		free(got);
	}
	/* the pool's threads first: a store freed before them leaves their
	 * per-thread state of it behind (store.h, ckpt_store_free) */
	ckpt_pool_free(p);
	p = NULL;
	close_fsck(s);
	/* and after a reopen */
	s = open_bg(false);
	for (int i = 0; i < NFILES; i++) {
		size_t len;
		uint8_t *got = tl_read_file(s, ino[i], &len);

		ck_assert_mem_eq(got, model[i], FSIZE);
		free(got);
		free(model[i]);
	}
	ckpt_pool_free(p);
	close_fsck(s);
}
END_TEST

/* A hold taken before a chunk became garbage keeps it; once freed, the
 * next round drops it. */
START_TEST(test_hold_keeps_garbage)
{
	ckpt_store *s = open_bg(false);
	ckpt_pool *p = pool_new();
	uint8_t *a = tl_random_buf(1u << 20, 1), *b = tl_random_buf(1u << 20, 2);
	uint64_t ino = tl_write_file(s, p, CKPT_ROOT_INO, "f", a, 1u << 20);
	ckpt_digest x = first_chunk(s, ino);
	struct ckpt_chunk_loc loc;
	ckpt_hold *h = NULL;
	uint8_t *got = malloc(1u << 20);

	ck_assert_int_eq(ckpt_hold_new(s, &h), 0);
	tl_write_file(s, p, CKPT_ROOT_INO, "f", b, 1u << 20); /* x: refcount 0 */
	settled_stats(s);
	ck_assert_int_eq(ckpt_store_chunk_loc(s, &x, &loc, NULL), 0);
	ck_assert_int_eq(ckpt_store_read_chunk(s, &x, 0, got, loc.raw_len), 0);
	ck_assert_mem_eq(got, a, loc.raw_len); /* the first chunk of a */
	ckpt_hold_free(h);
	settled_stats(s);
	ck_assert(!has_chunk(s, &x));
	free(got);
	free(a);
	free(b);
	ckpt_pool_free(p);
	close_fsck(s);
}
END_TEST

/* A holder that came after the garbage was found stores the same bytes
 * again (a dedup hit on the index entry waiting to be dropped) and commits
 * them only after the drop round: the dedup hit revived the entry, so it
 * is still there for the commit. */
START_TEST(test_dedup_hit_revives)
{
	ckpt_store *s = open_bg(false);
	ckpt_pool *p = pool_new();
	uint8_t *a = tl_random_buf(1u << 20, 1), *b = tl_random_buf(1u << 20, 2);
	uint64_t ino = tl_write_file(s, p, CKPT_ROOT_INO, "f", a, 1u << 20);
	uint64_t ino2 = tl_mknode(s, CKPT_ROOT_INO, "g", S_IFREG | 0644);
	ckpt_digest x = first_chunk(s, ino), y;
	struct ckpt_extent_list *l = ckpt_extent_list_new();
	struct ckpt_chunk_loc loc;
	ckpt_hold *old = NULL, *h = NULL;
	uint8_t *xb, *got;
	size_t len;

	ck_assert_int_eq(ckpt_store_chunk_loc(s, &x, &loc, NULL), 0);
	xb = malloc(loc.raw_len);
	ck_assert_int_eq(ckpt_store_read_chunk(s, &x, 0, xb, loc.raw_len), 0);
	ck_assert_int_eq(ckpt_hold_new(s, &old), 0);
	tl_write_file(s, p, CKPT_ROOT_INO, "f", b, 1u << 20); /* x: refcount 0 */
	settled_stats(s); /* x found garbage; its drop waits for `old` */
	ck_assert(has_chunk(s, &x));
	ck_assert_int_eq(ckpt_hold_new(s, &h), 0);
	ck_assert_int_eq(ckpt_store_put_chunk(s, xb, loc.raw_len, 0, &y), 0);
	ck_assert_mem_eq(y.bytes, x.bytes, CKPT_DIGEST_LEN);
	ckpt_hold_free(old);
	settled_stats(s); /* the drop round ran: x was obtained again */
	ck_assert(has_chunk(s, &x));
	ck_assert_int_eq(ckpt_extent_list_append(l, loc.raw_len, CKPT_EXT_CHUNK, &x), 0);
	ck_assert_int_eq(ckpt_store_commit_file(s, ino2, l, 0, 1, true), 0);
	ckpt_hold_free(h);
	got = tl_read_file(s, ino2, &len);
	ck_assert_uint_eq(len, loc.raw_len);
	ck_assert_mem_eq(got, xb, len);
	free(got);
	ckpt_extent_list_free(l);
	free(xb);
	free(a);
	free(b);
	ckpt_pool_free(p);
	close_fsck(s);
}
END_TEST

/* An uncommitted writer that deduplicated against a chunk which then lost
 * its last reference keeps it through its hold, and commits it later. */
START_TEST(test_writer_keeps_deduped_chunk)
{
	ckpt_store *s = open_bg(false);
	ckpt_pool *p = pool_new();
	uint8_t *a = tl_random_buf(1u << 20, 1), *b = tl_random_buf(1u << 20, 2);
	uint64_t ino = tl_write_file(s, p, CKPT_ROOT_INO, "f", a, 1u << 20);
	uint64_t ino2 = tl_mknode(s, CKPT_ROOT_INO, "g", S_IFREG | 0644);
	ckpt_digest x = first_chunk(s, ino);
	ckpt_writer *w = NULL;
	uint8_t *got;
	size_t len;

	ck_assert_int_eq(ckpt_writer_new(s, p, ino2, true, &w), 0);
	ck_assert_int_eq(ckpt_writer_write(w, a, 1u << 20, 0), 0); /* cut at the commit */
	tl_write_file(s, p, CKPT_ROOT_INO, "f", b, 1u << 20);      /* x: refcount 0 */
	settled_stats(s);
	ck_assert(has_chunk(s, &x));
	ck_assert_int_eq(ckpt_writer_commit(w, true), 0);
	ckpt_writer_free(w);
	settled_stats(s);
	ck_assert(has_chunk(s, &x));
	got = tl_read_file(s, ino2, &len);
	ck_assert_mem_eq(got, a, 1u << 20);
	free(got);
	free(a);
	free(b);
	ckpt_pool_free(p);
	close_fsck(s);
}
END_TEST

/* A narrowed hold keeps only what it pinned: garbage it did not pin goes
 * at once, what it pinned stays until it is freed. */
START_TEST(test_pin_narrow)
{
	ckpt_store *s = open_bg(false);
	ckpt_pool *p = pool_new();
	uint8_t *a = tl_random_buf(1u << 20, 1), *b = tl_random_buf(1u << 20, 2);
	uint8_t *c = tl_random_buf(1u << 20, 3), *e = tl_random_buf(1u << 20, 4);
	uint64_t f = tl_write_file(s, p, CKPT_ROOT_INO, "f", a, 1u << 20);
	uint64_t g = tl_write_file(s, p, CKPT_ROOT_INO, "g", c, 1u << 20);
	ckpt_digest xf = first_chunk(s, f), xg = first_chunk(s, g);
	struct ckpt_extent_list *l = NULL;
	ckpt_hold *h = NULL;

	ck_assert_int_eq(ckpt_hold_new(s, &h), 0);
	ck_assert_int_eq(ckpt_store_load_extents(s, f, &l), 0);
	ck_assert_int_eq(ckpt_hold_pin(h, l), 0);
	ckpt_hold_narrow(h);
	tl_write_file(s, p, CKPT_ROOT_INO, "f", b, 1u << 20); /* xf: garbage, pinned */
	tl_write_file(s, p, CKPT_ROOT_INO, "g", e, 1u << 20); /* xg: garbage */
	settled_stats(s);
	ck_assert(has_chunk(s, &xf));
	ck_assert(!has_chunk(s, &xg));
	{
		size_t n = (size_t)l->size;
		uint8_t *got = malloc(n);

		ck_assert_int_eq(ckpt_store_read_extents(s, l, got, n, 0), (ssize_t)n);
		ck_assert_mem_eq(got, a, n);
		free(got);
	}
	ckpt_hold_free(h);
	settled_stats(s);
	ck_assert(!has_chunk(s, &xf));
	ckpt_extent_list_free(l);
	free(a);
	free(b);
	free(c);
	free(e);
	ckpt_pool_free(p);
	close_fsck(s);
}
END_TEST

static Suite *reclaim_suite(void)
{
	Suite *s = suite_create("reclaim");
	TCase *tc = tcase_create("reclaim");

	tl_tcase_dirs(tc, "check_reclaim-");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	suite_add_tcase(s, tc);
	tcase_add_loop_test(tc, test_rewrites_bounded, 0, 2);
	tcase_add_test(tc, test_hold_keeps_garbage);
	tcase_add_test(tc, test_dedup_hit_revives);
	tcase_add_test(tc, test_writer_keeps_deduped_chunk);
	tcase_add_test(tc, test_pin_narrow);
	return s;
}

int main(void)
{
	return tl_run(reclaim_suite());
}
