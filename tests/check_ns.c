/* SPDX-License-Identifier: MIT */
/*
 * check_ns.c - unit tests for core/meta/ns.c and core/meta/commit.c, the
 * namespace and content commits over a metadata engine, without a store:
 * the operations and their errors, orphans and their release hook, commits
 * and their reference counts, and two writers with separate locks sharing
 * one engine (as two daemons sharing a PostgreSQL engine would): their
 * concurrent creates in one directory lose nothing and never hand out an
 * inode number twice, and their concurrent commits lose no reference,
 * because each transaction conflicts with the other's and is run again.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "meta/commit.h"
#include "meta/engine.h"
#include "meta/ns.h"
#include "meta/records.h"
#include "testlib.h"

static char tdir[96]; /* per test, inside the test case's base directory */
static char ixdir[128];
static ckpt_engine *eng;
static pthread_mutex_t lock_a = PTHREAD_MUTEX_INITIALIZER, lock_b = PTHREAD_MUTEX_INITIALIZER;

/* A fresh engine holding what a new store's namespace starts from. */
static int init_txn(ckpt_txn *t, void *arg)
{
	struct ckpt_inode root = { .ino = CKPT_ROOT_INO, .mode = S_IFDIR | 0755, .nlink = 2,
				   .parent = CKPT_ROOT_INO, .generation = 1 };

	(void)arg;
	ckpt_meta_put_u64(t, "next_ino", CKPT_ROOT_INO + 1);
	ckpt_meta_put_inode(t, &root);
	return 0;
}

static void setup(void)
{
	tl_test_dir(tdir, sizeof(tdir));
	snprintf(ixdir, sizeof(ixdir), "%s/ix", tdir);
	eng = tl_engine_open(NULL, ixdir);
	ck_assert_int_eq(ckpt_txn_run(eng, init_txn, NULL, true), 0);
}

static void teardown(void)
{
	ckpt_engine_close(eng);
	eng = NULL;
	tl_dir_remove(tdir);
}

static ckpt_ns *ns_new(pthread_mutex_t *lock, bool writable)
{
	ckpt_ns *ns = NULL;

	ck_assert_int_eq(ckpt_ns_new(eng, lock, writable, "test", &ns), 0);
	return ns;
}

static struct ckpt_inode attr(uint64_t ino)
{
	struct ckpt_inode in;

	ck_assert_int_eq(ckpt_meta_get_inode(eng, NULL, ino, &in), 0);
	return in;
}

START_TEST(test_ns_operations)
{
	ckpt_ns *ns = ns_new(&lock_a, true), *ro = ns_new(&lock_b, false);
	struct ckpt_inode d, f, l, in;
	struct ckpt_dirent *ents;
	uint64_t ino;
	size_t n;
	char *target, *path;

	ck_assert_int_eq(ckpt_ns_mknode(ns, CKPT_ROOT_INO, "d", S_IFDIR | 0755, 1, 2, NULL, &d), 0);
	ck_assert_uint_eq(d.ino, CKPT_ROOT_INO + 1);
	ck_assert_uint_eq(attr(CKPT_ROOT_INO).nlink, 3);
	ck_assert_int_eq(ckpt_ns_mknode(ns, d.ino, "f", S_IFREG | 0644, 1, 2, NULL, &f), 0);
	ck_assert_uint_eq(f.ino, d.ino + 1); /* from the range reserved by the first create */
	ck_assert_int_eq(ckpt_ns_mknode(ns, d.ino, "l", S_IFLNK | 0777, 0, 0, "../t", &l), 0);
	ck_assert_int_eq(ckpt_ns_mknode(ns, d.ino, "f", S_IFREG | 0644, 0, 0, NULL, &in), -EEXIST);
	ck_assert_int_eq(ckpt_ns_mknode(ns, f.ino, "x", S_IFREG | 0644, 0, 0, NULL, &in), -ENOTDIR);
	ck_assert_int_eq(ckpt_ns_mknode(ns, d.ino, "a/b", S_IFREG | 0644, 0, 0, NULL, &in), -EINVAL);
	ck_assert_int_eq(ckpt_ns_mknode(ro, d.ino, "y", S_IFREG | 0644, 0, 0, NULL, &in), -EROFS);
	{
		uint64_t next;
		ck_assert_int_eq(ckpt_meta_get_u64(eng, NULL, "next_ino", &next), 0);
		ck_assert_uint_eq(next, CKPT_ROOT_INO + 1 + CKPT_NS_INO_BATCH);
	}
	ck_assert_int_eq(ckpt_ns_lookup(ro, d.ino, "f", &ino), 0);
	ck_assert_uint_eq(ino, f.ino);
	ck_assert_int_eq(ckpt_ns_readlink(ro, l.ino, &target), 0);
	ck_assert_str_eq(target, "../t");
	free(target);
	ck_assert_int_eq(ckpt_ns_readlink(ro, f.ino, &target), -EINVAL);

	ck_assert_int_eq(ckpt_ns_link(ns, f.ino, CKPT_ROOT_INO, "f2", &in), 0);
	ck_assert_uint_eq(in.nlink, 2);
	ck_assert_int_eq(ckpt_ns_rename(ns, d.ino, "l", CKPT_ROOT_INO, "l2", 0), 0);
	ck_assert_int_eq(ckpt_ns_rename(ns, CKPT_ROOT_INO, "d", d.ino, "below", 0), -EINVAL);
	ck_assert_int_eq(ckpt_ns_readdir(ro, CKPT_ROOT_INO, &ents, &n), 0);
	ck_assert_uint_eq(n, 3); /* d, f2, l2 in name order */
	ck_assert_str_eq(ents[0].name, "d");
	ck_assert_str_eq(ents[1].name, "f2");
	ck_assert_str_eq(ents[2].name, "l2");
	ckpt_dirents_free(ents, n);
	path = ckpt_ns_path_of(ro, d.ino);
	ck_assert_str_eq(path, "/d");
	free(path);

	in.mode = 0600;
	in.mtime_ns = 12345;
	ck_assert_int_eq(ckpt_ns_setattr(ns, f.ino, CKPT_SET_MODE | CKPT_SET_MTIME, &in, &in), 0);
	ck_assert_uint_eq(attr(f.ino).mode, S_IFREG | 0600);
	ck_assert_int_eq(attr(f.ino).mtime_ns, 12345);

	ck_assert_int_eq(ckpt_ns_unlink(ns, CKPT_ROOT_INO, "d", true), -ENOTEMPTY);
	ck_assert_int_eq(ckpt_ns_unlink(ns, d.ino, "f", true), -ENOTDIR);
	ck_assert_int_eq(ckpt_ns_unlink(ns, d.ino, "f", false), 0);
	ck_assert_uint_eq(attr(f.ino).nlink, 1);
	ck_assert_int_eq(ckpt_ns_unlink(ns, CKPT_ROOT_INO, "d", true), 0);
	ck_assert_uint_eq(attr(CKPT_ROOT_INO).nlink, 2);
	ck_assert_int_eq(ckpt_ns_lookup(ro, CKPT_ROOT_INO, "d", &ino), -ENOENT);
	ckpt_ns_free(ro);
	ckpt_ns_free(ns);
	ckpt_ns_free(NULL);
}
END_TEST

/* readdir refuses (EIO) a directory holding a damaged entry key, one that
 * would be listed as a name with a '/' in it, instead of listing it. */
START_TEST(test_ns_readdir_damaged_key)
{
	ckpt_ns *ns = ns_new(&lock_a, true);
	struct ckpt_inode f;
	struct ckpt_dirent *ents = NULL;
	uint8_t key[CKPT_KEY_MAX], val[CKPT_DENTRY_REC_LEN];
	size_t n = 0;
	ckpt_txn *t;

	ck_assert_int_eq(ckpt_ns_mknode(ns, CKPT_ROOT_INO, "f", S_IFREG | 0644, 0, 0, NULL, &f), 0);
	ck_assert_int_eq(ckpt_ns_readdir(ns, CKPT_ROOT_INO, &ents, &n), 0);
	ck_assert_uint_eq(n, 1);
	ckpt_dirents_free(ents, n);
	ckpt_dentry_encode(f.ino, S_IFREG, val);
	ck_assert_int_eq(ckpt_txn_begin(eng, &t), 0);
	ckpt_txn_put(t, key, ckpt_key_dentry(key, CKPT_ROOT_INO, "../x", 4), val, sizeof(val));
	ck_assert_int_eq(ckpt_txn_commit(t, false), 0);
	ck_assert_int_eq(ckpt_ns_readdir(ns, CKPT_ROOT_INO, &ents, &n), -EIO);
	ckpt_ns_free(ns);
}
END_TEST

struct released {
	int calls;
	uint64_t size;
};

static int release(void *arg, ckpt_txn *t, const struct ckpt_extent_list *old)
{
	struct released *r = arg;

	ck_assert_ptr_nonnull(t);
	r->calls++;
	r->size = old->size;
	return 0;
}

/* Fifos, sockets and devices: inodes with their type, permission bits and
 * (devices only) device number, no content, listed with their type; the
 * other calls refuse them and the other types. */
START_TEST(test_ns_special_files)
{
	ckpt_ns *ns = ns_new(&lock_a, true);
	static const uint32_t types[] = { S_IFIFO, S_IFSOCK, S_IFCHR, S_IFBLK };
	static const char *const names[] = { "fifo", "sock", "chr", "blk" };
	struct ckpt_inode in, d;
	struct ckpt_dirent *ents;
	size_t n;

	ck_assert_int_eq(ckpt_ns_mknode(ns, CKPT_ROOT_INO, "d", S_IFDIR | 0755, 0, 0, NULL, &d), 0);
	for (size_t i = 0; i < 4; i++) {
		ck_assert_int_eq(ckpt_ns_mknod(ns, d.ino, names[i], types[i] | 0640, 7, 8,
					       makedev(8, 17), &in),
				 0);
		ck_assert_uint_eq(attr(in.ino).mode, types[i] | 0640);
		ck_assert_uint_eq(attr(in.ino).uid, 7);
		ck_assert_uint_eq(attr(in.ino).gid, 8);
		ck_assert_uint_eq(attr(in.ino).nlink, 1);
		ck_assert_uint_eq(attr(in.ino).size, 0);
		/* the device number is kept for devices only */
		ck_assert_uint_eq(attr(in.ino).rdev,
				  types[i] == S_IFCHR || types[i] == S_IFBLK ? makedev(8, 17) : 0);
	}
	ck_assert_int_eq(ckpt_ns_readdir(ns, d.ino, &ents, &n), 0);
	ck_assert_uint_eq(n, 4); /* blk, chr, fifo, sock */
	ck_assert_uint_eq(ents[0].mode & S_IFMT, S_IFBLK);
	ck_assert_uint_eq(ents[1].mode & S_IFMT, S_IFCHR);
	ck_assert_uint_eq(ents[2].mode & S_IFMT, S_IFIFO);
	ck_assert_uint_eq(ents[3].mode & S_IFMT, S_IFSOCK);
	ckpt_dirents_free(ents, n);
	ck_assert_int_eq(ckpt_ns_mknod(ns, d.ino, "fifo", S_IFIFO | 0644, 0, 0, 0, &in), -EEXIST);
	ck_assert_int_eq(ckpt_ns_mknod(ns, d.ino, "r", S_IFREG | 0644, 0, 0, 0, &in), -EINVAL);
	ck_assert_int_eq(ckpt_ns_mknod(ns, d.ino, "x", S_IFDIR | 0755, 0, 0, 0, &in), -EINVAL);
	ck_assert_int_eq(ckpt_ns_mknode(ns, d.ino, "y", S_IFIFO | 0644, 0, 0, NULL, &in), -EINVAL);
	/* hard links, renames and removal work as for any inode */
	ck_assert_int_eq(ckpt_ns_lookup(ns, d.ino, "chr", &in.ino), 0);
	ck_assert_int_eq(ckpt_ns_link(ns, in.ino, CKPT_ROOT_INO, "chr2", &in), 0);
	ck_assert_uint_eq(in.nlink, 2);
	ck_assert_uint_eq(in.rdev, makedev(8, 17));
	ck_assert_int_eq(ckpt_ns_rename(ns, d.ino, "sock", CKPT_ROOT_INO, "sock2", 0), 0);
	ck_assert_int_eq(ckpt_ns_unlink(ns, d.ino, "fifo", false), 0);
	ckpt_ns_free(ns);
}
END_TEST

/* CKPT_SET_KILL_SUIDGID clears S_ISUID always and S_ISGID only with
 * S_IXGRP, after the other fields of the same call; CKPT_SET_KILL_SGID
 * clears S_ISGID. */
START_TEST(test_ns_kill_suidgid)
{
	ckpt_ns *ns = ns_new(&lock_a, true);
	struct ckpt_inode f, in;

	ck_assert_uint_eq(ckpt_mode_kill_suidgid(S_IFREG | 06777), S_IFREG | 0777);
	ck_assert_uint_eq(ckpt_mode_kill_suidgid(S_IFREG | 06767), S_IFREG | 02767);
	ck_assert_uint_eq(ckpt_mode_kill_suidgid(S_IFREG | 01755), S_IFREG | 01755);
	ck_assert_int_eq(ckpt_ns_mknode(ns, CKPT_ROOT_INO, "f", S_IFREG | 06755, 0, 0, NULL, &f), 0);
	memset(&in, 0, sizeof(in));
	ck_assert_int_eq(ckpt_ns_setattr(ns, f.ino, CKPT_SET_KILL_SUIDGID, &in, &in), 0);
	ck_assert_uint_eq(attr(f.ino).mode, S_IFREG | 0755);
	in.mode = 06745;
	in.uid = 65534;
	ck_assert_int_eq(ckpt_ns_setattr(ns, f.ino, CKPT_SET_MODE | CKPT_SET_UID |
						   CKPT_SET_KILL_SUIDGID, &in, &in), 0);
	ck_assert_uint_eq(attr(f.ino).mode, S_IFREG | 02745);
	ck_assert_uint_eq(attr(f.ino).uid, 65534);
	/* S_ISGID without S_IXGRP: only CKPT_SET_KILL_SGID clears it */
	ck_assert_int_eq(ckpt_ns_setattr(ns, f.ino, CKPT_SET_KILL_SGID, &in, &in), 0);
	ck_assert_uint_eq(attr(f.ino).mode, S_IFREG | 0745);
	ckpt_ns_free(ns);
}
END_TEST

/* An orphan's records go in one transaction with its release; a linked
 * inode is not reaped (its stale marker is dropped). */
START_TEST(test_ns_reap)
{
	ckpt_ns *ns = ns_new(&lock_a, true);
	struct ckpt_extent_list *l = ckpt_extent_list_new();
	struct released rel = { 0 };
	struct ckpt_inode f;
	uint8_t key[16], *enc;
	size_t enclen;
	bool gone = true;
	ckpt_txn *t;

	ck_assert_int_eq(ckpt_ns_mknode(ns, CKPT_ROOT_INO, "f", S_IFREG | 0644, 0, 0, NULL, &f), 0);
	ck_assert_int_eq(ckpt_extent_list_append(l, 300, CKPT_EXT_ZERO, NULL), 0);
	ck_assert_int_eq(ckpt_extent_list_encode(l, &enc, &enclen), 0);
	ck_assert_int_eq(ckpt_txn_begin(eng, &t), 0);
	ckpt_txn_put(t, key, ckpt_key_ino(key, CKPT_KEY_FILE, f.ino), enc, enclen);
	ck_assert_int_eq(ckpt_txn_commit(t, false), 0);
	free(enc);
	ckpt_extent_list_free(l);
	/* not an orphan: nothing happens */
	ck_assert_int_eq(ckpt_ns_reap(ns, f.ino, release, &rel, &gone), 0);
	ck_assert(!gone);
	ck_assert_int_eq(rel.calls, 0);
	ck_assert_int_eq(ckpt_ns_unlink(ns, CKPT_ROOT_INO, "f", false), 0);
	ck_assert_int_eq(ckpt_engine_has(eng, key, ckpt_key_ino(key, CKPT_KEY_ORPHAN, f.ino)), 1);
	ck_assert_int_eq(ckpt_ns_reap(ns, f.ino, release, &rel, &gone), 0);
	ck_assert(gone);
	ck_assert_int_eq(rel.calls, 1);
	ck_assert_uint_eq(rel.size, 300);
	ck_assert_int_eq(ckpt_engine_has(eng, key, ckpt_key_ino(key, CKPT_KEY_ORPHAN, f.ino)), 0);
	ck_assert_int_eq(ckpt_engine_has(eng, key, ckpt_key_ino(key, CKPT_KEY_INODE, f.ino)), 0);
	ck_assert_int_eq(ckpt_engine_has(eng, key, ckpt_key_ino(key, CKPT_KEY_FILE, f.ino)), 0);
	ckpt_ns_free(ns);
}
END_TEST

#define WRITERS 4
#define FILES 150
#define DIRS 10

struct writer {
	ckpt_ns *ns;
	int id;
	uint64_t inos[FILES + DIRS];
	int err;
};

static void *write_names(void *arg)
{
	struct writer *w = arg;

	for (int i = 0; i < FILES + DIRS && !w->err; i++) {
		struct ckpt_inode in;
		char name[32];
		bool dir = i >= FILES;

		snprintf(name, sizeof(name), "%s%d-%d", dir ? "d" : "f", w->id, i);
		w->err = ckpt_ns_mknode(w->ns, CKPT_ROOT_INO, name,
					dir ? S_IFDIR | 0755 : S_IFREG | 0644, 0, 0, NULL, &in);
		w->inos[i] = in.ino;
	}
	return NULL;
}

static int u64_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Two namespaces (own writer locks, two threads each) creating names in
 * one directory at once, as two daemons sharing the engine would. */
START_TEST(test_ns_two_writers_share_engine)
{
	ckpt_ns *ns[2] = { ns_new(&lock_a, true), ns_new(&lock_b, true) };
	static struct writer w[WRITERS];
	pthread_t th[WRITERS];
	uint64_t all[WRITERS * (FILES + DIRS)];
	struct ckpt_dirent *ents;
	size_t n, k = 0;

	for (int i = 0; i < WRITERS; i++) {
		memset(&w[i], 0, sizeof(w[i]));
		w[i].ns = ns[i % 2];
		w[i].id = i;
		ck_assert_int_eq(pthread_create(&th[i], NULL, write_names, &w[i]), 0);
	}
	for (int i = 0; i < WRITERS; i++) {
		pthread_join(th[i], NULL);
		ck_assert_int_eq(w[i].err, 0);
		for (int j = 0; j < FILES + DIRS; j++)
			all[k++] = w[i].inos[j];
	}
	/* every name there, every inode number handed out once */
	ck_assert_int_eq(ckpt_ns_readdir(ns[0], CKPT_ROOT_INO, &ents, &n), 0);
	ck_assert_uint_eq(n, WRITERS * (FILES + DIRS));
	ckpt_dirents_free(ents, n);
	qsort(all, k, sizeof(all[0]), u64_cmp);
	for (size_t i = 1; i < k; i++)
		ck_assert_uint_ne(all[i], all[i - 1]);
	/* no lost update of the directory's link count */
	ck_assert_uint_eq(attr(CKPT_ROOT_INO).nlink, 2 + WRITERS * DIRS);
	for (size_t i = 0; i < k; i++)
		ck_assert_uint_eq(attr(all[i]).ino, all[i]);
	ckpt_ns_free(ns[0]);
	ckpt_ns_free(ns[1]);
}
END_TEST

/* The "pending table" of these tests: every chunk is unindexed at a
 * location derived from its digest. */
static bool unindexed(void *arg, const ckpt_digest *d, struct ckpt_chunk_loc *ret)
{
	(void)arg;
	memset(ret, 0, sizeof(*ret));
	memcpy(ret->where, d->bytes, CKPT_DIGEST_LEN < CKPT_CHUNK_WHERE_LEN ?
					     CKPT_DIGEST_LEN : CKPT_CHUNK_WHERE_LEN);
	ret->stored_len = ret->raw_len = 4096;
	return true;
}

static const struct ckpt_commit_env *env(void)
{
	static struct ckpt_commit_env e;

	e = (struct ckpt_commit_env){ .eng = eng, .unindexed = unindexed, .name = "test" };
	return &e;
}

static uint64_t refs_of(uint32_t k)
{
	ckpt_digest d = tl_digest(k);
	struct ckpt_chunk_loc loc;
	uint64_t refs = 0;
	int r = ckpt_meta_get_chunk(eng, NULL, &d, &loc, &refs);

	return r == -ENOENT ? UINT64_MAX : refs;
}

/* An extent list of one 4096-byte extent per digest key in ks. */
static struct ckpt_extent_list *list_of(const uint32_t *ks, size_t n)
{
	struct ckpt_extent_list *l = ckpt_extent_list_new();

	for (size_t i = 0; i < n; i++) {
		ckpt_digest d = tl_digest(ks[i]);
		ck_assert_int_eq(ckpt_extent_list_append(l, 4096, CKPT_EXT_CHUNK, &d), 0);
	}
	return l;
}

START_TEST(test_commit_refcounts)
{
	ckpt_ns *ns = ns_new(&lock_a, true);
	struct ckpt_inode f, g, in;
	static const uint32_t k1[] = { 1, 2, 2 }, k2[] = { 2, 3 };
	struct ckpt_extent_list *l1 = list_of(k1, 3), *l2 = list_of(k2, 2), *got;
	struct ckpt_refdelta *dv;
	ckpt_digest *added;
	size_t ndv, nadded;

	/* the delta: merged per digest, zero sums dropped */
	ck_assert_int_eq(ckpt_refdelta_build(l2, l1, &dv, &ndv), 0);
	ck_assert_uint_eq(ndv, 3); /* 1: -1, 2: -1, 3: +1 */
	for (size_t i = 1; i < ndv; i++)
		ck_assert_int_lt(ckpt_digest_cmp(&dv[i - 1].d, &dv[i].d), 0);
	free(dv);

	ck_assert_int_eq(ckpt_ns_mknode(ns, CKPT_ROOT_INO, "f", S_IFREG | 0644, 0, 0, NULL, &f), 0);
	ck_assert_int_eq(ckpt_ns_mknode(ns, CKPT_ROOT_INO, "g", S_IFREG | 0644, 0, 0, NULL, &g), 0);
	{
		struct ckpt_content c[] = { { f.ino, l1, CKPT_INODE_F_SAFETENSORS, 777 },
					    { g.ino, l2, 0, 778 } };
		ck_assert_int_eq(ckpt_content_commit(env(), c, 2, true, &added, &nadded), 0);
	}
	ck_assert_uint_eq(nadded, 3);
	free(added);
	ck_assert_uint_eq(refs_of(1), 1);
	ck_assert_uint_eq(refs_of(2), 3);
	ck_assert_uint_eq(refs_of(3), 1);
	in = attr(f.ino);
	ck_assert_uint_eq(in.size, 3 * 4096);
	ck_assert_uint_eq(in.flags, CKPT_INODE_F_SAFETENSORS);
	ck_assert_int_eq(in.mtime_ns, 777);
	ck_assert_int_eq(ckpt_meta_get_extents(eng, NULL, f.ino, &got), 0);
	ck_assert_uint_eq(got->n, 3);
	ckpt_extent_list_free(got);

	/* f now holds g's content: 1 drops to 0 (kept for gc), 2 to 2, 3 to 2 */
	{
		struct ckpt_content c = { f.ino, l2, 0, 779 };
		ck_assert_int_eq(ckpt_content_commit(env(), &c, 1, false, NULL, NULL), 0);
	}
	ck_assert_uint_eq(refs_of(1), 0);
	ck_assert_uint_eq(refs_of(2), 2);
	ck_assert_uint_eq(refs_of(3), 2);
	/* a file gone is skipped; a chunk found nowhere is an error */
	ck_assert_int_eq(ckpt_ns_unlink(ns, CKPT_ROOT_INO, "g", false), 0);
	{
		bool gone;
		ck_assert_int_eq(ckpt_ns_reap(ns, g.ino, NULL, NULL, &gone), 0);
		ck_assert(gone);
		struct ckpt_content c = { g.ino, l1, 0, 780 };
		ck_assert_int_eq(ckpt_content_commit(env(), &c, 1, false, NULL, NULL), 0);
		ck_assert_uint_eq(refs_of(1), 0);
	}
	{
		struct ckpt_commit_env none = { .eng = eng, .name = "test" };
		static const uint32_t k9[] = { 9 };
		struct ckpt_extent_list *l9 = list_of(k9, 1);
		struct ckpt_content c = { f.ino, l9, 0, 781 };

		ck_assert_int_eq(ckpt_content_commit(&none, &c, 1, false, NULL, NULL), -EIO);
		ck_assert_uint_eq(refs_of(9), UINT64_MAX);
		ck_assert_uint_eq(attr(f.ino).mtime_ns, 779); /* nothing applied */
		ckpt_extent_list_free(l9);
	}
	ckpt_extent_list_free(l1);
	ckpt_extent_list_free(l2);
	ckpt_ns_free(ns);
}
END_TEST

struct committer {
	uint64_t ino;
	int err;
};

static void *commit_loop(void *arg)
{
	struct committer *c = arg;
	static const uint32_t shared[] = { 42 };
	struct ckpt_extent_list *l = list_of(shared, 1), *empty = ckpt_extent_list_new();

	for (int i = 0; i <= 200 && !c->err; i++) {
		struct ckpt_content x = { c->ino, i % 2 ? empty : l, 0, i };
		c->err = ckpt_content_commit(env(), &x, 1, false, NULL, NULL);
	}
	ckpt_extent_list_free(l);
	ckpt_extent_list_free(empty);
	return NULL;
}

/* Writers without a common lock commit files sharing one chunk: every
 * increment and decrement of its count survives. */
START_TEST(test_commit_concurrent_refcounts)
{
	ckpt_ns *ns = ns_new(&lock_a, true);
	struct committer c[4];
	pthread_t th[4];

	for (int i = 0; i < 4; i++) {
		struct ckpt_inode in;
		char name[8];
		snprintf(name, sizeof(name), "f%d", i);
		ck_assert_int_eq(ckpt_ns_mknode(ns, CKPT_ROOT_INO, name, S_IFREG | 0644, 0, 0, NULL,
						&in),
				 0);
		c[i] = (struct committer){ in.ino, 0 };
	}
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, commit_loop, &c[i]), 0);
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		ck_assert_int_eq(c[i].err, 0);
	}
	/* each file ends naming the chunk once (i = 200 is even) */
	ck_assert_uint_eq(refs_of(42), 4);
	ckpt_ns_free(ns);
}
END_TEST

static Suite *ns_suite(void)
{
	Suite *s = suite_create("ns");
	TCase *tc = tcase_create("ns");

	tl_tcase_dirs(tc, "check_ns-");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_ns_operations);
	tcase_add_test(tc, test_ns_reap);
	tcase_add_test(tc, test_ns_special_files);
	tcase_add_test(tc, test_ns_kill_suidgid);
	tcase_add_test(tc, test_ns_two_writers_share_engine);
	tcase_add_test(tc, test_ns_readdir_damaged_key);
	tcase_add_test(tc, test_commit_refcounts);
	tcase_add_test(tc, test_commit_concurrent_refcounts);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(ns_suite());
}
