/* SPDX-License-Identifier: MIT */
/*
 * check_file.c - unit tests for core/file.c: writers (STREAM and STAGED
 * modes, chunking plan, commit) and the chunk worker pool.
 *
 * Every test gets a fresh store under a mkdtemp directory in /tmp (checked
 * fixture) and a pool of 2 workers; the teardown removes the directory
 * whatever the outcome.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chunk/chunker.h"
#include "store/file.h"
#include "store/store.h"
#include "testlib.h"
#include "base/util.h"

#define MiB (1u << 20)

static char tdir[96]; /* per test, inside the test case's base directory */
static char spath[128];
static ckpt_store *st;
static ckpt_pool *pool;

static void setup(void)
{
	tl_test_dir(tdir, sizeof(tdir));
	snprintf(spath, sizeof(spath), "%s/store", tdir);
	st = tl_store_create(spath);
	ck_assert_int_eq(ckpt_pool_new(2, &pool), 0);
}

static void teardown(void)
{
	ckpt_pool_free(pool);
	pool = NULL;
	ckpt_store_free(st);
	st = NULL;
	tl_dir_remove(tdir);
}

/* ---- helpers ---------------------------------------------------------- */

static uint64_t mkfile(const char *name)
{
	return tl_mknode(st, CKPT_ROOT_INO, name, S_IFREG | 0644);
}

static ckpt_writer *writer(uint64_t ino, bool truncate)
{
	ckpt_writer *w = NULL;

	ck_assert_int_eq(ckpt_writer_new(st, pool, ino, truncate, &w), 0);
	ck_assert_ptr_nonnull(w);
	return w;
}

/* Sequential write of len bytes from off in pieces of `piece` bytes. */
static void write_pieces(ckpt_writer *w, const uint8_t *buf, size_t len, uint64_t off,
			 size_t piece)
{
	for (size_t done = 0; done < len;) {
		size_t n = CKPT_MIN(piece, len - done);
		ck_assert_int_eq(ckpt_writer_write(w, buf + done, n, off + done), 0);
		done += n;
	}
}

/* The committed content of ino equals expect[0..len). */
static void check_committed(uint64_t ino, const uint8_t *expect, size_t len)
{
	struct ckpt_extent_list *l = NULL;
	struct ckpt_inode in;
	uint8_t *buf = malloc(len + 16);
	uint64_t off = 0;

	ck_assert_ptr_nonnull(buf);
	ck_assert_int_eq(ckpt_store_getattr(st, ino, &in), 0);
	ck_assert_uint_eq(in.size, len);
	ck_assert_int_eq(ckpt_store_load_extents(st, ino, &l), 0);
	ck_assert_uint_eq(l->size, len);
	/* extents are consecutive and non-empty */
	for (size_t i = 0; i < l->n; i++) {
		ck_assert_uint_eq(l->v[i].off, off);
		ck_assert_uint_gt(l->v[i].len, 0);
		off += l->v[i].len;
	}
	ck_assert_uint_eq(off, len);
	ck_assert_int_eq(ckpt_store_read_extents(st, l, buf, len + 16, 0), (ssize_t)len);
	ck_assert_int_eq(memcmp(buf, expect, len), 0);
	ckpt_extent_list_free(l);
	free(buf);
}

/* The writer's current content equals expect[0..len), read in pieces. */
static void check_writer(ckpt_writer *w, const uint8_t *expect, size_t len, size_t piece)
{
	uint8_t *buf = malloc(piece + 16);

	ck_assert_ptr_nonnull(buf);
	ck_assert_uint_eq(ckpt_writer_size(w), len);
	for (size_t off = 0; off < len; off += piece) {
		size_t want = CKPT_MIN(piece, len - off);
		ssize_t n = ckpt_writer_read(w, buf, piece + 16, off);
		ck_assert_int_eq(n, (ssize_t)CKPT_MIN(piece + 16, len - off));
		ck_assert_msg(memcmp(buf, expect + off, want) == 0, "mismatch in [%zu, +%zu)", off,
			      want);
	}
	ck_assert_int_eq(ckpt_writer_read(w, buf, 10, len), 0);
	ck_assert_int_eq(ckpt_writer_read(w, buf, 10, len + 12345), 0);
	free(buf);
}

static struct ckpt_store_stats flushed_stats(void)
{
	return tl_flushed_stats(st);
}

static void fsck_cb(void *ud, const char *path, const char *what)
{
	(void)ud;
	fprintf(stderr, "fsck: %s: %s\n", path ? path : "-", what);
}

static int fsck(void)
{
	ck_assert_int_eq(ckpt_store_flush(st), 0);
	return ckpt_store_fsck(st, fsck_cb, NULL);
}

/* ---- pool ------------------------------------------------------------- */

START_TEST(test_pool_lifecycle)
{
	ckpt_pool *p = NULL;

	ckpt_pool_free(NULL);
	ckpt_writer_free(NULL);
	ck_assert_int_eq(ckpt_pool_new(0, &p), 0); /* one per CPU */
	ck_assert_ptr_nonnull(p);
	ckpt_pool_free(p);
	ck_assert_int_eq(ckpt_pool_new(1, &p), 0);
	ckpt_pool_free(p);
}
END_TEST

/* ---- STREAM ----------------------------------------------------------- */

START_TEST(test_sequential_10mib)
{
	const size_t len = 10 * MiB;
	uint8_t *data = tl_random_buf(len, 1);
	uint64_t f = mkfile("seq");
	ckpt_writer *w = writer(f, true);
	struct ckpt_extent_list *l = NULL;
	struct ckpt_store_stats s;

	ck_assert(!ckpt_writer_dirty(w));
	write_pieces(w, data, len, 0, MiB);
	ck_assert(ckpt_writer_dirty(w));
	ck_assert_uint_eq(ckpt_writer_size(w), len);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ck_assert(!ckpt_writer_dirty(w));
	check_committed(f, data, len);
	/* FastCDC bounds: every chunk in [min, max], but the last may be short */
	ck_assert_int_eq(ckpt_store_load_extents(st, f, &l), 0);
	ck_assert_uint_ge(l->n, 3);
	for (size_t i = 0; i < l->n; i++) {
		ck_assert_uint_eq(l->v[i].kind, CKPT_EXT_CHUNK);
		ck_assert_uint_le(l->v[i].len, CKPT_CDC_DEFAULT_MAX);
		if (i + 1 < l->n)
			ck_assert_uint_ge(l->v[i].len, CKPT_CDC_DEFAULT_MIN);
	}
	ckpt_extent_list_free(l);
	/* the writer still reads the same content after its commit */
	check_writer(w, data, len, 3 * MiB + 7);
	ckpt_writer_free(w);

	s = flushed_stats();
	ck_assert_uint_eq(s.logical_bytes, len);
	ck_assert_uint_eq(s.unique_bytes, len);
	ck_assert_int_eq(fsck(), 0);
	/* and after a reopen of the store */
	ckpt_pool_free(pool);
	ckpt_store_free(st);
	st = tl_store_create(spath);
	ck_assert_int_eq(ckpt_pool_new(2, &pool), 0);
	check_committed(f, data, len);
	free(data);
}
END_TEST

/* Reads of uncommitted STREAM content: cut chunks (maybe still in flight)
 * plus the uncut tail. */
START_TEST(test_stream_read_uncommitted)
{
	const size_t len = 5 * MiB + 123;
	uint8_t *data = tl_random_buf(len, 2), buf[64];
	uint64_t f = mkfile("s");
	ckpt_writer *w = writer(f, true);

	ck_assert_int_eq(ckpt_writer_read(w, buf, sizeof(buf), 0), 0);
	write_pieces(w, data, len, 0, 100000);
	check_writer(w, data, len, 1000003);
	check_writer(w, data, len, 4096);
	/* a read straddling the end is short */
	ck_assert_int_eq(ckpt_writer_read(w, buf, 64, len - 10), 10);
	ck_assert_mem_eq(buf, data + len - 10, 10);
	/* nothing committed yet */
	{
		struct ckpt_inode in;
		ck_assert_int_eq(ckpt_store_getattr(st, f, &in), 0);
		ck_assert_uint_eq(in.size, 0);
	}
	/* writes continue after reads */
	ck_assert_int_eq(ckpt_writer_write(w, "tail", 4, len), 0);
	ck_assert_uint_eq(ckpt_writer_size(w), len + 4);
	ck_assert_int_eq(ckpt_writer_read(w, buf, 64, len - 2), 6);
	ck_assert_mem_eq(buf, data + len - 2, 2);
	ck_assert_mem_eq(buf + 2, "tail", 4);
	ckpt_writer_free(w);
	free(data);
}
END_TEST

/* Without a commit, the old committed content stays. */
START_TEST(test_free_without_commit)
{
	const size_t len = 2 * MiB + 5;
	uint8_t *a = tl_random_buf(len, 3), *b = tl_random_buf(len, 4);
	uint64_t f = mkfile("f");
	ckpt_writer *w = writer(f, true);

	write_pieces(w, a, len, 0, MiB);
	ck_assert_int_eq(ckpt_writer_commit(w, true), 0);
	ckpt_writer_free(w);
	check_committed(f, a, len);

	/* truncating writer, new content, no commit */
	w = writer(f, true);
	ck_assert(ckpt_writer_dirty(w)); /* will empty the file if committed */
	ck_assert_uint_eq(ckpt_writer_size(w), 0);
	write_pieces(w, b, len, 0, MiB);
	ckpt_writer_free(w);
	check_committed(f, a, len);

	/* non-truncating writer, overwrite in the middle, no commit */
	w = writer(f, false);
	ck_assert(!ckpt_writer_dirty(w));
	ck_assert_uint_eq(ckpt_writer_size(w), len);
	ck_assert_int_eq(ckpt_writer_write(w, b, 1000, MiB), 0);
	ckpt_writer_free(w);
	check_committed(f, a, len);

	/* refcounts and index agree */
	ck_assert_int_eq(fsck(), 0);
	{
		struct ckpt_store_stats s = flushed_stats();
		ck_assert_uint_eq(s.logical_bytes, len);
		ck_assert_uint_eq(s.unique_bytes, len);
	}
	free(a);
	free(b);
}
END_TEST

START_TEST(test_commit_twice_with_appends)
{
	const size_t half = 3 * MiB / 2;
	uint8_t *data = tl_random_buf(2 * half + 77, 5);
	uint64_t f = mkfile("f");
	ckpt_writer *w = writer(f, true);
	struct ckpt_extent_list *l1 = NULL, *l2 = NULL;

	write_pieces(w, data, half, 0, 300000);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	check_committed(f, data, half);
	ck_assert_int_eq(ckpt_store_load_extents(st, f, &l1), 0);
	/* a commit without changes is a no-op */
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	write_pieces(w, data + half, half, half, 300000);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	check_committed(f, data, 2 * half);
	/* the extents of the first commit are kept as they were */
	ck_assert_int_eq(ckpt_store_load_extents(st, f, &l2), 0);
	ck_assert_uint_gt(l2->n, l1->n);
	for (size_t i = 0; i < l1->n; i++) {
		ck_assert_uint_eq(l2->v[i].off, l1->v[i].off);
		ck_assert_uint_eq(l2->v[i].len, l1->v[i].len);
		ck_assert_mem_eq(l2->v[i].digest.bytes, l1->v[i].digest.bytes, 16);
	}
	/* a third commit, durable, with a few more bytes */
	ck_assert_int_eq(ckpt_writer_write(w, data + 2 * half, 77, 2 * half), 0);
	ck_assert_int_eq(ckpt_writer_commit(w, true), 0);
	check_committed(f, data, 2 * half + 77);
	ckpt_writer_free(w);
	ck_assert_int_eq(fsck(), 0);
	ckpt_extent_list_free(l1);
	ckpt_extent_list_free(l2);
	free(data);
}
END_TEST

/* A writer opened without truncate on existing content appends to it. */
START_TEST(test_append_existing)
{
	const size_t len = MiB + 333;
	uint8_t *data = tl_random_buf(2 * len, 6);
	uint64_t f = mkfile("f");
	ckpt_writer *w = writer(f, true);

	write_pieces(w, data, len, 0, MiB);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ckpt_writer_free(w);

	w = writer(f, false);
	check_writer(w, data, len, 100000);
	write_pieces(w, data + len, len, len, 65536);
	check_writer(w, data, 2 * len, 777777);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ckpt_writer_free(w);
	check_committed(f, data, 2 * len);
	ck_assert_int_eq(fsck(), 0);
	free(data);
}
END_TEST

START_TEST(test_all_zero)
{
	const size_t len = 8 * MiB + 100;
	uint8_t *zero = calloc(1, len);
	uint64_t f = mkfile("z");
	ckpt_writer *w = writer(f, true);
	struct ckpt_extent_list *l = NULL;
	struct ckpt_store_stats s;

	ck_assert_ptr_nonnull(zero);
	write_pieces(w, zero, len, 0, MiB);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ckpt_writer_free(w);
	check_committed(f, zero, len);
	ck_assert_int_eq(ckpt_store_load_extents(st, f, &l), 0);
	ck_assert_uint_ge(l->n, 1);
	for (size_t i = 0; i < l->n; i++)
		ck_assert_uint_eq(l->v[i].kind, CKPT_EXT_ZERO);
	ck_assert_uint_eq(l->n, 1); /* adjacent zero runs merge */
	ckpt_extent_list_free(l);
	/* nothing stored */
	s = flushed_stats();
	ck_assert_uint_eq(s.logical_bytes, len);
	ck_assert_uint_eq(s.chunks, 0);
	ck_assert_uint_eq(s.dead_chunks, 0);
	ck_assert_uint_eq(s.unique_bytes, 0);
	ck_assert_uint_eq(s.pack_files, 0);
	ck_assert_uint_eq(s.pack_bytes, 0);
	free(zero);
}
END_TEST

START_TEST(test_errors)
{
	uint64_t f = mkfile("f");
	ckpt_writer *w = writer(f, true), *w2 = NULL;
	uint8_t b = 1;

	ck_assert_int_eq(ckpt_writer_write(w, &b, 0, 5), 0); /* empty write: nothing */
	ck_assert_uint_eq(ckpt_writer_size(w), 0);
	ck_assert(!ckpt_writer_dirty(w));
	ck_assert_int_eq(ckpt_writer_write(w, &b, 1, 1ull << 50), -EFBIG);
	ck_assert_int_eq(ckpt_writer_write(w, &b, 1, UINT64_MAX), -EFBIG);
	ck_assert_int_eq(ckpt_writer_truncate(w, (1ull << 50) + 1), -EFBIG);
	/* EFBIG is not sticky */
	ck_assert_int_eq(ckpt_writer_write(w, &b, 1, 0), 0);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ckpt_writer_free(w);
	/* no such inode */
	ck_assert_int_eq(ckpt_writer_new(st, pool, 9999, true, &w2), -ENOENT);
	ck_assert_ptr_null(w2);
}
END_TEST

START_TEST(test_mtime)
{
	uint64_t f = mkfile("f");
	ckpt_writer *w = writer(f, true);
	struct ckpt_inode in;
	int64_t m;

	ck_assert_int_eq(ckpt_writer_write(w, "abc", 3, 0), 0);
	m = ckpt_writer_mtime(w);
	ck_assert_int_gt(m, 0);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ck_assert_int_eq(ckpt_store_getattr(st, f, &in), 0);
	ck_assert_int_eq(in.mtime_ns, m);
	ck_assert_int_eq(ckpt_writer_write(w, "d", 1, 3), 0);
	ckpt_writer_set_mtime(w, 123456789);
	ck_assert_int_eq(ckpt_writer_mtime(w), 123456789);
	ck_assert_int_eq(ckpt_writer_commit(w, true), 0);
	ck_assert_int_eq(ckpt_store_getattr(st, f, &in), 0);
	ck_assert_int_eq(in.mtime_ns, 123456789);
	ck_assert_uint_eq(in.size, 4);
	ckpt_writer_free(w);
}
END_TEST

/* ---- STAGED ----------------------------------------------------------- */

START_TEST(test_overwrite_middle)
{
	const size_t len = 12 * MiB;
	const uint64_t at = 10 * MiB + 17;
	uint8_t *data = tl_random_buf(len, 7), *patch = tl_random_buf(1000, 8);
	uint64_t f = mkfile("f");
	ckpt_writer *w = writer(f, true);
	struct ckpt_extent_list *l1 = NULL, *l2 = NULL;
	size_t same = 0;

	write_pieces(w, data, len, 0, MiB);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ck_assert_int_eq(ckpt_store_load_extents(st, f, &l1), 0);
	/* overwrite in the middle: goes STAGED */
	ck_assert_int_eq(ckpt_writer_write(w, patch, 1000, at), 0);
	memcpy(data + at, patch, 1000);
	ck_assert(ckpt_writer_dirty(w));
	ck_assert_uint_eq(ckpt_writer_size(w), len);
	check_writer(w, data, len, 2 * MiB + 1);
	/* and more writes in STAGED mode, including at the end */
	ck_assert_int_eq(ckpt_writer_write(w, patch, 10, 0), 0);
	memcpy(data, patch, 10);
	ck_assert_int_eq(ckpt_writer_write(w, patch + 10, 20, len - 20), 0);
	memcpy(data + len - 20, patch + 10, 20);
	check_writer(w, data, len, MiB);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	check_committed(f, data, len);
	/* after the commit the writer stays usable and consistent */
	check_writer(w, data, len, 4 * MiB);
	ckpt_writer_free(w);

	/* content-defined chunks before the first change are unchanged... */
	ck_assert_int_eq(ckpt_store_load_extents(st, f, &l2), 0);
	for (size_t i = 0; i < l1->n && i < l2->n; i++) {
		if (l1->v[i].off + l1->v[i].len > at)
			break;
		if (i == 0)
			continue; /* bytes 0..9 changed too */
		ck_assert_uint_eq(l2->v[i].len, l1->v[i].len);
		ck_assert_mem_eq(l2->v[i].digest.bytes, l1->v[i].digest.bytes, 16);
		same++;
	}
	ck_assert_uint_ge(same, 1);
	ckpt_extent_list_free(l1);
	ckpt_extent_list_free(l2);
	ck_assert_int_eq(fsck(), 0);
	free(data);
	free(patch);
}
END_TEST

START_TEST(test_sparse_write)
{
	const uint64_t at = 2 * MiB + 3;
	const size_t len = at + 500;
	uint8_t *expect = calloc(1, len), *a = tl_random_buf(1000, 9), *b = tl_random_buf(500, 10);
	uint64_t f = mkfile("f");
	ckpt_writer *w = writer(f, true);

	ck_assert_int_eq(ckpt_writer_write(w, a, 1000, 0), 0);
	ck_assert_int_eq(ckpt_writer_write(w, b, 500, at), 0);
	memcpy(expect, a, 1000);
	memcpy(expect + at, b, 500);
	ck_assert_uint_eq(ckpt_writer_size(w), len);
	check_writer(w, expect, len, 300000);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	check_committed(f, expect, len);
	ckpt_writer_free(w);

	/* a sparse write on a fresh writer, far from any data */
	{
		uint64_t g = mkfile("g");
		uint8_t *e2 = calloc(1, 6 * MiB + 1);
		w = writer(g, true);
		ck_assert_int_eq(ckpt_writer_write(w, "x", 1, 6 * MiB), 0);
		e2[6 * MiB] = 'x';
		ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
		ckpt_writer_free(w);
		check_committed(g, e2, 6 * MiB + 1);
		free(e2);
	}
	ck_assert_int_eq(fsck(), 0);
	free(expect);
	free(a);
	free(b);
}
END_TEST

START_TEST(test_truncate)
{
	const size_t len = 2 * MiB;
	const size_t shrink = MiB + 5, grow = 3 * MiB;
	uint8_t *data = tl_random_buf(len, 11), *expect = calloc(1, grow);
	uint64_t f = mkfile("f");
	ckpt_writer *w = writer(f, true);

	write_pieces(w, data, len, 0, 500000);
	/* to the current size: no change */
	ck_assert_int_eq(ckpt_writer_truncate(w, len), 0);
	ck_assert_uint_eq(ckpt_writer_size(w), len);
	/* shrink */
	ck_assert_int_eq(ckpt_writer_truncate(w, shrink), 0);
	ck_assert_uint_eq(ckpt_writer_size(w), shrink);
	check_writer(w, data, shrink, MiB);
	/* grow: zeros */
	ck_assert_int_eq(ckpt_writer_truncate(w, grow), 0);
	memcpy(expect, data, shrink);
	check_writer(w, expect, grow, MiB);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	check_committed(f, expect, grow);
	/* shrink of committed content, then commit again */
	ck_assert_int_eq(ckpt_writer_truncate(w, 100), 0);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	check_committed(f, data, 100);
	/* truncate to 0 restarts a STREAM writer */
	ck_assert_int_eq(ckpt_writer_truncate(w, 0), 0);
	ck_assert_uint_eq(ckpt_writer_size(w), 0);
	write_pieces(w, data + 7, MiB, 0, 100000);
	check_writer(w, data + 7, MiB, 333333);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	check_committed(f, data + 7, MiB);
	ckpt_writer_free(w);

	/* a truncating writer on a non-empty file empties it on commit */
	w = writer(f, true);
	ck_assert(ckpt_writer_dirty(w));
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ckpt_writer_free(w);
	check_committed(f, data, 0);
	/* a non-truncating writer on an existing file: truncate shrinks it */
	w = writer(f, true);
	write_pieces(w, data, len, 0, MiB);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ckpt_writer_free(w);
	w = writer(f, false);
	ck_assert_int_eq(ckpt_writer_truncate(w, 12345), 0);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ckpt_writer_free(w);
	check_committed(f, data, 12345);
	ck_assert_int_eq(fsck(), 0);
	free(data);
	free(expect);
}
END_TEST

/* ---- safetensors ------------------------------------------------------ */

/* Three tensors: a F32[300000] (1,200,000 bytes), b BF16[1000,700]
 * (1,400,000 bytes), c F32[1000] (4,000 bytes).  The header is padded with
 * `pad` extra spaces and may carry a metadata entry. */
#define ST_A 1200000u
#define ST_B 1400000u
#define ST_C 4000u
#define ST_DATA (ST_A + ST_B + ST_C)

static uint8_t *st_file(const uint8_t *tensors, size_t pad, bool meta, size_t *ret_len,
			size_t *ret_data_start)
{
	char json[1024];
	int n = snprintf(json, sizeof(json),
			 "{%s\"a\":{\"dtype\":\"F32\",\"shape\":[300000],\"data_offsets\":[0,%u]},"
			 "\"b\":{\"dtype\":\"BF16\",\"shape\":[1000,700],\"data_offsets\":[%u,%u]},"
			 "\"c\":{\"dtype\":\"F32\",\"shape\":[1000],\"data_offsets\":[%u,%u]}}",
			 meta ? "\"__metadata__\":{\"format\":\"pt\",\"step\":\"1000\"}," : "", ST_A,
			 ST_A, ST_A + ST_B, ST_A + ST_B, ST_DATA);
	size_t hlen = (size_t)n + pad, total = 8 + hlen + ST_DATA;
	uint8_t *buf = malloc(total);

	ck_assert_int_lt(n, (int)sizeof(json));
	ck_assert_ptr_nonnull(buf);
	ckpt_put_le64(buf, hlen);
	memcpy(buf + 8, json, (size_t)n);
	memset(buf + 8 + n, ' ', pad);
	memcpy(buf + 8 + hlen, tensors, ST_DATA);
	*ret_len = total;
	*ret_data_start = 8 + hlen;
	return buf;
}

static void expect_extent(const struct ckpt_extent_list *l, size_t i, uint64_t off, uint32_t len)
{
	ck_assert_uint_lt(i, l->n);
	ck_assert_msg(l->v[i].off == off && l->v[i].len == len,
		      "extent %zu: [%" PRIu64 ", +%" PRIu32 "), expected [%" PRIu64 ", +%" PRIu32 ")",
		      i, l->v[i].off, l->v[i].len, off, len);
	ck_assert_uint_eq(l->v[i].kind, CKPT_EXT_CHUNK);
}

/* The exact tensor-aligned plan for st_file() content. */
static void check_st_plan(uint64_t ino, size_t ds)
{
	struct ckpt_extent_list *l = NULL;
	const uint64_t ta = ds, tb = ds + ST_A, tc = ds + ST_A + ST_B;

	ck_assert_int_eq(ckpt_store_load_extents(st, ino, &l), 0);
	ck_assert_uint_eq(l->n, 6);
	expect_extent(l, 0, 0, (uint32_t)ds);                      /* prefix + header */
	expect_extent(l, 1, ta, MiB);                              /* a: piece 0 */
	expect_extent(l, 2, ta + MiB, ST_A - MiB);                 /* a: piece 1 */
	expect_extent(l, 3, tb, MiB);                              /* b: piece 0 */
	expect_extent(l, 4, tb + MiB, ST_B - MiB);                 /* b: piece 1 */
	expect_extent(l, 5, tc, ST_C);                             /* c */
	ckpt_extent_list_free(l);
}

START_TEST(test_safetensors_aligned)
{
	uint8_t *tensors = tl_random_buf(ST_DATA, 12);
	size_t len1, ds1, len2, ds2;
	uint8_t *f1 = st_file(tensors, 3, false, &len1, &ds1);
	uint8_t *f2 = st_file(tensors, 501, true, &len2, &ds2);
	uint64_t a = mkfile("a.safetensors"), b = mkfile("b.safetensors");
	struct ckpt_store_stats s1, s2;
	struct ckpt_inode in;
	ckpt_writer *w;

	ck_assert_uint_gt(ds2, ds1);
	w = writer(a, true);
	write_pieces(w, f1, len1, 0, 65537); /* the header arrives in pieces */
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ckpt_writer_free(w);
	check_committed(a, f1, len1);
	check_st_plan(a, ds1);
	ck_assert_int_eq(ckpt_store_getattr(st, a, &in), 0);
	ck_assert_uint_eq(in.flags, CKPT_INODE_F_SAFETENSORS);
	s1 = flushed_stats();
	ck_assert_uint_eq(s1.unique_bytes, len1);

	/* same tensors behind a longer header: only the header is new */
	w = writer(b, true);
	write_pieces(w, f2, len2, 0, MiB);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ckpt_writer_free(w);
	check_committed(b, f2, len2);
	check_st_plan(b, ds2);
	ck_assert_int_eq(ckpt_store_getattr(st, b, &in), 0);
	ck_assert_uint_eq(in.flags, CKPT_INODE_F_SAFETENSORS);
	s2 = flushed_stats();
	ck_assert_uint_eq(s2.unique_bytes, s1.unique_bytes + ds2);
	ck_assert_uint_eq(s2.chunks, s1.chunks + 1);
	ck_assert_uint_eq(s2.logical_bytes, len1 + len2);
	ck_assert_int_eq(fsck(), 0);
	free(tensors);
	free(f1);
	free(f2);
}
END_TEST

/* Any write size gives the same tensor-aligned chunks: chunks that a write
 * completes are emitted from the write buffer (plus the buffered head of the
 * chunk) without being joined first.  Both put paths: inline (background
 * compression, _i == 1) and the worker pool (_i == 0). */
START_TEST(test_safetensors_write_sizes)
{
	static const size_t sizes[] = { MiB, MiB + 3, 999983, 4096, 1, SIZE_MAX };
	uint8_t *tensors = tl_random_buf(ST_DATA, 14);
	size_t len, ds;
	uint8_t *f = st_file(tensors, 17, false, &len, &ds);
	struct ckpt_store_stats s0, s1;
	char name[32];

	if (_i == 1) {
		struct ckpt_store_opts o;
		char err[512] = "";

		ckpt_store_free(st);
		ckpt_store_opts_init(&o);
		o.bg = CKPT_BG_ALL;
		ck_assert_int_eq(ckpt_store_open(spath, &o, &st, err, sizeof(err)), 0);
		ck_assert(ckpt_store_put_is_cheap(st));
	}
	for (size_t k = 0; k < CKPT_ARRAY_SIZE(sizes); k++) {
		size_t piece = sizes[k] == SIZE_MAX ? len : sizes[k];
		uint64_t ino;
		ckpt_writer *w;

		if (piece == 1 && len > 3 * MiB)
			continue;
		snprintf(name, sizeof(name), "f%zu", k);
		ino = mkfile(name);
		w = writer(ino, true);
		write_pieces(w, f, len, 0, piece);
		ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
		ckpt_writer_free(w);
		check_committed(ino, f, len);
		check_st_plan(ino, ds);
		if (k == 0)
			s0 = flushed_stats();
	}
	/* every later file deduplicated completely against the first */
	s1 = flushed_stats();
	ck_assert_uint_eq(s1.unique_bytes, s0.unique_bytes);
	ck_assert_uint_eq(s1.chunks, s0.chunks);
	ck_assert_int_eq(fsck(), 0);
	free(tensors);
	free(f);
}
END_TEST

/* Content-defined chunks are cut where ckpt_cdc_cut cuts the whole stream,
 * whatever the write sizes: the writer cuts straight from each write's
 * buffer and copies only what follows the last cut (_i 1: chunks stored
 * inline, 0: by the pool).  A zero run in the second file gives ZERO
 * extents; its extent list is the same for every write size. */
START_TEST(test_cdc_write_sizes)
{
	static const size_t sizes[] = { MiB, 4096, 10240, 999983, 3 * MiB + 1, 64, SIZE_MAX };
	const size_t len = 9 * MiB + 12345;
	uint8_t *data = tl_random_buf(len, 41);
	struct ckpt_extent_list *first[2] = { NULL, NULL };
	const struct ckpt_cdc_params p = { CKPT_CDC_DEFAULT_MIN, CKPT_CDC_DEFAULT_AVG,
					   CKPT_CDC_DEFAULT_MAX };
	char name[32];

	if (_i == 1) {
		struct ckpt_store_opts o;
		char err[512] = "";

		ckpt_store_free(st);
		ckpt_store_opts_init(&o);
		o.bg = CKPT_BG_ALL;
		ck_assert_int_eq(ckpt_store_open(spath, &o, &st, err, sizeof(err)), 0);
		ck_assert(ckpt_store_put_is_cheap(st));
	}
	for (int z = 0; z < 2; z++) {
		if (z == 1)
			memset(data + 3 * MiB + 5, 0, 4 * MiB);
		for (size_t k = 0; k < CKPT_ARRAY_SIZE(sizes); k++) {
			size_t piece = sizes[k] == SIZE_MAX ? len : sizes[k];
			struct ckpt_extent_list *l = NULL;
			uint64_t ino;
			ckpt_writer *w;

			snprintf(name, sizeof(name), "z%d-%zu", z, k);
			ino = mkfile(name);
			w = writer(ino, true);
			write_pieces(w, data, len, 0, piece);
			ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
			ckpt_writer_free(w);
			check_committed(ino, data, len);
			ck_assert_int_eq(ckpt_store_load_extents(st, ino, &l), 0);
			if (z == 0) {
				size_t off = 0, i = 0;

				while (off < len) {
					size_t cut = ckpt_cdc_cut(&p, data + off, len - off, true);

					ck_assert_uint_lt(i, l->n);
					ck_assert_uint_eq(l->v[i].kind, CKPT_EXT_CHUNK);
					ck_assert_uint_eq(l->v[i].off, off);
					ck_assert_uint_eq(l->v[i].len, cut);
					off += cut;
					i++;
				}
				ck_assert_uint_eq(i, l->n);
			}
			if (!first[z]) {
				first[z] = l;
				continue;
			}
			ck_assert_uint_eq(l->n, first[z]->n);
			for (size_t i = 0; i < l->n; i++) {
				ck_assert_uint_eq(l->v[i].kind, first[z]->v[i].kind);
				ck_assert_uint_eq(l->v[i].off, first[z]->v[i].off);
				ck_assert_uint_eq(l->v[i].len, first[z]->v[i].len);
				ck_assert(memcmp(&l->v[i].digest, &first[z]->v[i].digest,
						 sizeof(l->v[i].digest)) == 0);
			}
			ckpt_extent_list_free(l);
		}
	}
	{
		bool zero = false;

		for (size_t i = 0; i < first[1]->n; i++)
			zero |= first[1]->v[i].kind == CKPT_EXT_ZERO;
		ck_assert(zero);
	}
	ckpt_extent_list_free(first[0]);
	ckpt_extent_list_free(first[1]);
	ck_assert_int_eq(fsck(), 0);
	free(data);
}
END_TEST

/* The staged path re-chunks with the same plan. */
START_TEST(test_safetensors_staged)
{
	uint8_t *tensors = tl_random_buf(ST_DATA, 13);
	size_t len, ds;
	uint8_t *f1 = st_file(tensors, 0, false, &len, &ds);
	uint64_t a = mkfile("a");
	struct ckpt_inode in;
	ckpt_writer *w = writer(a, true);

	/* write the data area first, then the header: not sequential */
	ck_assert_int_eq(ckpt_writer_write(w, f1 + ds, len - ds, ds), 0);
	ck_assert_int_eq(ckpt_writer_write(w, f1, ds, 0), 0);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ckpt_writer_free(w);
	check_committed(a, f1, len);
	check_st_plan(a, ds);
	ck_assert_int_eq(ckpt_store_getattr(st, a, &in), 0);
	ck_assert_uint_eq(in.flags, CKPT_INODE_F_SAFETENSORS);
	free(tensors);
	free(f1);
}
END_TEST

/* An incomplete safetensors file is not flagged; a non-safetensors file is
 * chunked with FastCDC. */
START_TEST(test_safetensors_incomplete)
{
	uint8_t *tensors = tl_random_buf(ST_DATA, 14);
	size_t len, ds;
	uint8_t *f1 = st_file(tensors, 0, false, &len, &ds);
	uint64_t a = mkfile("a");
	struct ckpt_inode in;
	struct ckpt_extent_list *l = NULL;
	ckpt_writer *w = writer(a, true);

	write_pieces(w, f1, ds + MiB + 10, 0, MiB);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	check_committed(a, f1, ds + MiB + 10);
	ck_assert_int_eq(ckpt_store_getattr(st, a, &in), 0);
	ck_assert_uint_eq(in.flags, 0);
	ck_assert_int_eq(ckpt_store_load_extents(st, a, &l), 0);
	ck_assert_uint_eq(l->n, 3);
	ck_assert_uint_eq(l->v[0].len, ds);
	ck_assert_uint_eq(l->v[1].len, MiB);
	ck_assert_uint_eq(l->v[2].len, 10);
	ckpt_extent_list_free(l);
	/* completing it in the same writer: flagged */
	write_pieces(w, f1 + ds + MiB + 10, len - (ds + MiB + 10), ds + MiB + 10, MiB);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ckpt_writer_free(w);
	check_committed(a, f1, len);
	ck_assert_int_eq(ckpt_store_getattr(st, a, &in), 0);
	ck_assert_uint_eq(in.flags, CKPT_INODE_F_SAFETENSORS);
	free(tensors);
	free(f1);
}
END_TEST

/* ---- concurrency ------------------------------------------------------ */

struct wjob {
	uint64_t ino;
	uint8_t *data;
	size_t len;
	int r;
};

static void *wjob_main(void *p)
{
	struct wjob *j = p;
	ckpt_writer *w = NULL;

	j->r = ckpt_writer_new(st, pool, j->ino, true, &w);
	for (size_t off = 0; j->r == 0 && off < j->len; off += 200000)
		j->r = ckpt_writer_write(w, j->data + off, CKPT_MIN(200000, j->len - off), off);
	if (j->r == 0)
		j->r = ckpt_writer_commit(w, false);
	ckpt_writer_free(w);
	return NULL;
}

START_TEST(test_concurrent_writers)
{
	enum { N = 3 };
	struct wjob j[N];
	pthread_t th[N];
	char name[16];

	for (int i = 0; i < N; i++) {
		snprintf(name, sizeof(name), "f%d", i);
		j[i].ino = mkfile(name);
		j[i].len = 3 * MiB + (size_t)i;
		j[i].data = tl_random_buf(j[i].len, 20 + (uint64_t)i);
		/* f1 repeats f0's first MiB: dedup across writers */
		if (i == 1)
			memcpy(j[1].data, j[0].data, MiB);
		ck_assert_int_eq(pthread_create(&th[i], NULL, wjob_main, &j[i]), 0);
	}
	for (int i = 0; i < N; i++) {
		ck_assert_int_eq(pthread_join(th[i], NULL), 0);
		ck_assert_int_eq(j[i].r, 0);
	}
	for (int i = 0; i < N; i++) {
		check_committed(j[i].ino, j[i].data, j[i].len);
		free(j[i].data);
	}
	ck_assert_int_eq(fsck(), 0);
}
END_TEST

/* Writes as the kernel's writeback cache sends them: out of order, with a
 * partial page sent again once completed.  The writer stays STREAM and
 * stores exactly the chunks of a sequential write. */
START_TEST(test_writeback_order)
{
	const size_t len = 6 * MiB + 1000;
	uint8_t *data = tl_random_buf(len, 21);
	uint64_t ref = mkfile("ref"), f = mkfile("wb");
	ckpt_writer *w = writer(ref, true);
	struct ckpt_extent_list *a = NULL, *b = NULL;
	/* (off, len): C and D ahead of the stream, A ends inside a page that B
	 * sends again whole */
	const uint64_t req[][2] = { { 3 * MiB, MiB },	       /* C: parked */
				    { 0, MiB + 2000 },	       /* A */
				    { 4 * MiB, len - 4 * MiB }, /* D: parked */
				    { MiB, 2 * MiB },	       /* B: 2000 bytes again */
				    { MiB, 4096 } };	       /* a page again, unchanged */

	write_pieces(w, data, len, 0, MiB);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ckpt_writer_free(w);

	w = writer(f, true);
	for (size_t i = 0; i < sizeof(req) / sizeof(req[0]); i++) {
		ck_assert_int_eq(ckpt_writer_write(w, data + req[i][0], req[i][1], req[i][0]), 0);
		if (i == 0)
			ck_assert_uint_eq(ckpt_writer_size(w), 4 * MiB);
	}
	ck_assert(!ckpt_writer_staged(w));
	check_writer(w, data, len, MiB + 17);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ck_assert(!ckpt_writer_staged(w));
	check_committed(f, data, len);
	ck_assert_int_eq(ckpt_store_load_extents(st, ref, &a), 0);
	ck_assert_int_eq(ckpt_store_load_extents(st, f, &b), 0);
	ck_assert_uint_eq(a->n, b->n);
	for (size_t i = 0; i < a->n; i++) {
		ck_assert_uint_eq(a->v[i].len, b->v[i].len);
		ck_assert(memcmp(&a->v[i].digest, &b->v[i].digest, sizeof(ckpt_digest)) == 0);
	}
	ckpt_extent_list_free(a);
	ckpt_extent_list_free(b);
	ckpt_writer_free(w);
	ck_assert_int_eq(fsck(), 0);
	free(data);
}
END_TEST

/* Threads writing one file's 1 MiB pieces at once, piece i by thread
 * i % NT in order, as FUSE threads handle the writeback cache's requests:
 * writes ahead of the stream wait for the registered write that continues
 * it, or are parked; the file stays streamed and is chunked exactly as a
 * sequential write chunks it. */
enum { NT = 8 };
struct pjob {
	ckpt_writer *w;
	const uint8_t *data;
	size_t len;
	int t, r;
};

static void *pjob_main(void *p)
{
	struct pjob *j = p;

	for (size_t off = (size_t)j->t * MiB; j->r == 0 && off < j->len; off += NT * MiB)
		j->r = ckpt_writer_write(j->w, j->data + off, CKPT_MIN(MiB, j->len - off), off);
	return NULL;
}

START_TEST(test_writeback_threads)
{
	const size_t len = 40 * MiB + 333;
	uint8_t *data = tl_random_buf(len, 23);
	uint64_t ref = mkfile("ref"), f = mkfile("threads");
	ckpt_writer *w = writer(ref, true);
	struct ckpt_extent_list *a = NULL, *b = NULL;
	struct pjob j[NT];
	pthread_t th[NT];

	write_pieces(w, data, len, 0, MiB);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	ckpt_writer_free(w);

	w = writer(f, true);
	for (int t = NT - 1; t >= 0; t--) {
		j[t] = (struct pjob){ w, data, len, t, 0 };
		ck_assert_int_eq(pthread_create(&th[t], NULL, pjob_main, &j[t]), 0);
	}
	for (int t = 0; t < NT; t++) {
		ck_assert_int_eq(pthread_join(th[t], NULL), 0);
		ck_assert_int_eq(j[t].r, 0);
	}
	ck_assert(!ckpt_writer_staged(w));
	ck_assert_uint_eq(ckpt_writer_size(w), len);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	check_committed(f, data, len);
	ck_assert_int_eq(ckpt_store_load_extents(st, ref, &a), 0);
	ck_assert_int_eq(ckpt_store_load_extents(st, f, &b), 0);
	ck_assert_uint_eq(a->n, b->n);
	for (size_t i = 0; i < a->n; i++) {
		ck_assert_uint_eq(a->v[i].len, b->v[i].len);
		ck_assert(memcmp(&a->v[i].digest, &b->v[i].digest, sizeof(ckpt_digest)) == 0);
	}
	ckpt_extent_list_free(a);
	ckpt_extent_list_free(b);
	ckpt_writer_free(w);
	ck_assert_int_eq(fsck(), 0);
	free(data);
}
END_TEST

/* Bytes sent again that differ, or a parked write overwritten: STAGED, and
 * the later write wins. */
START_TEST(test_writeback_overwrite)
{
	const size_t len = 3 * MiB;
	uint8_t *data = tl_random_buf(len, 22), *want = malloc(len), *other = tl_random_buf(len, 23);
	uint64_t f = mkfile("ow");
	ckpt_writer *w = writer(f, true);

	ck_assert_ptr_nonnull(want);
	memcpy(want, data, len);
	ck_assert_int_eq(ckpt_writer_write(w, data + 2 * MiB, MiB, 2 * MiB), 0); /* parked */
	ck_assert_int_eq(ckpt_writer_write(w, data, MiB, 0), 0);
	ck_assert(!ckpt_writer_staged(w));
	/* different bytes over the stream's last 100 bytes, then up to the park */
	ck_assert_int_eq(ckpt_writer_write(w, other + MiB - 100, MiB + 100, MiB - 100), 0);
	memcpy(want + MiB - 100, other + MiB - 100, MiB + 100);
	ck_assert(ckpt_writer_staged(w));
	check_writer(w, want, len, MiB);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	check_committed(f, want, len);
	ckpt_writer_free(w);

	/* a parked write, then an earlier one running into it with other bytes */
	f = mkfile("ow2");
	w = writer(f, true);
	memcpy(want, data, len);
	ck_assert_int_eq(ckpt_writer_write(w, data + MiB, MiB, MiB), 0); /* parked */
	ck_assert_int_eq(ckpt_writer_write(w, other, MiB + 10, 0), 0);
	memcpy(want, other, MiB + 10);
	ck_assert_int_eq(ckpt_writer_write(w, data + 2 * MiB, MiB, 2 * MiB), 0);
	check_writer(w, want, len, MiB);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	check_committed(f, want, len);
	ckpt_writer_free(w);
	ck_assert_int_eq(fsck(), 0);
	free(data);
	free(other);
	free(want);
}
END_TEST

/* A write past the end that never gets its gap filled: committed STAGED,
 * with zeros in the gap. */
START_TEST(test_writeback_gap)
{
	uint8_t *data = tl_random_buf(MiB, 24), *want = calloc(1, 3 * MiB);
	uint64_t f = mkfile("gap");
	ckpt_writer *w = writer(f, true);

	ck_assert_ptr_nonnull(want);
	ck_assert_int_eq(ckpt_writer_write(w, data, MiB, 2 * MiB), 0);
	memcpy(want + 2 * MiB, data, MiB);
	ck_assert_uint_eq(ckpt_writer_size(w), 3 * MiB);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	check_committed(f, want, 3 * MiB);
	ckpt_writer_free(w);
	free(data);
	free(want);
}
END_TEST

/* fallocate: reserve keeps a writer streaming; punch and zero go STAGED;
 * other modes are refused. */
START_TEST(test_fallocate)
{
	const size_t len = 4 * MiB;
	uint8_t *data = tl_random_buf(len, 25), *want = calloc(1, 8 * MiB);
	uint64_t f = mkfile("fa");
	ckpt_writer *w = writer(f, true);

	ck_assert_ptr_nonnull(want);
	ck_assert_int_eq(ckpt_writer_fallocate(w, 0, 0, 6 * MiB), 0);
	ck_assert_uint_eq(ckpt_writer_size(w), 6 * MiB);
	ck_assert_int_eq(ckpt_writer_fallocate(w, FALLOC_FL_KEEP_SIZE, 0, 8 * MiB), 0);
	ck_assert_uint_eq(ckpt_writer_size(w), 6 * MiB);
	write_pieces(w, data, 2 * MiB, 0, 4096);
	memcpy(want, data, 2 * MiB);
	ck_assert(!ckpt_writer_staged(w));
	check_writer(w, want, 6 * MiB, MiB);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	check_committed(f, want, 6 * MiB);
	/* the stream goes on at its end after the commit */
	write_pieces(w, data + 2 * MiB, 2 * MiB, 2 * MiB, 10240);
	memcpy(want + 2 * MiB, data + 2 * MiB, 2 * MiB);
	ck_assert(!ckpt_writer_staged(w));
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	check_committed(f, want, 6 * MiB);
	/* refused, nothing changed */
	ck_assert_int_eq(ckpt_writer_fallocate(w, FALLOC_FL_COLLAPSE_RANGE, 0, MiB), -EOPNOTSUPP);
	ck_assert_int_eq(ckpt_writer_fallocate(w, 0, 0, 0), -EINVAL);
	ck_assert_int_eq(ckpt_writer_fallocate(w, 0, 0, 1ull << 49), -ENOSPC);
	ck_assert_uint_eq(ckpt_writer_size(w), 6 * MiB);
	ck_assert(!ckpt_writer_staged(w));
	/* punch a hole, zero a range past the end */
	ck_assert_int_eq(ckpt_writer_fallocate(w, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, MiB,
					       MiB),
			 0);
	memset(want + MiB, 0, MiB);
	ck_assert(ckpt_writer_staged(w));
	ck_assert_int_eq(ckpt_writer_fallocate(w, FALLOC_FL_ZERO_RANGE, 5 * MiB, 3 * MiB), 0);
	check_writer(w, want, 8 * MiB, MiB);
	ck_assert_int_eq(ckpt_writer_commit(w, false), 0);
	check_committed(f, want, 8 * MiB);
	ckpt_writer_free(w);
	ck_assert_int_eq(fsck(), 0);
	free(data);
	free(want);
}
END_TEST

static Suite *file_suite(void)
{
	Suite *s = suite_create("file");
	TCase *tc = tcase_create("writer");

	tl_tcase_dirs(tc, "check_file-");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_pool_lifecycle);
	tcase_add_test(tc, test_sequential_10mib);
	tcase_add_test(tc, test_stream_read_uncommitted);
	tcase_add_test(tc, test_free_without_commit);
	tcase_add_test(tc, test_commit_twice_with_appends);
	tcase_add_test(tc, test_append_existing);
	tcase_add_test(tc, test_all_zero);
	tcase_add_test(tc, test_errors);
	tcase_add_test(tc, test_mtime);
	tcase_add_test(tc, test_overwrite_middle);
	tcase_add_test(tc, test_sparse_write);
	tcase_add_test(tc, test_truncate);
	tcase_add_test(tc, test_safetensors_aligned);
	tcase_add_loop_test(tc, test_safetensors_write_sizes, 0, 2);
	tcase_add_loop_test(tc, test_cdc_write_sizes, 0, 2);
	tcase_add_test(tc, test_safetensors_staged);
	tcase_add_test(tc, test_safetensors_incomplete);
	tcase_add_test(tc, test_concurrent_writers);
	tcase_add_test(tc, test_writeback_order);
	tcase_add_test(tc, test_writeback_threads);
	tcase_add_test(tc, test_writeback_overwrite);
	tcase_add_test(tc, test_writeback_gap);
	tcase_add_test(tc, test_fallocate);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(file_suite());
}
