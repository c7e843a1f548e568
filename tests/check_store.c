/* SPDX-License-Identifier: MIT */
/*
 * check_store.c - unit tests for core/store.c: open/create/refusal, the
 * namespace (inodes, dentries, link counts, rename, orphans), chunks
 * (put/read/dedup/refcounts) and maintenance (stats, fsck, gc).
 *
 * Every test gets a fresh mkdtemp directory under /tmp (checked fixture);
 * the teardown removes it whatever the outcome.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/aio_abi.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "chunk/pack.h"
#include "chunk/pack_backend.h"
#include "store/store.h"
#include "testlib.h"
#include "base/util.h"

static char tdir[96]; /* per test, inside the test case's base directory */
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

/* ---- helpers ---------------------------------------------------------- */

static ckpt_store *open_opts(const struct ckpt_store_opts *o)
{
	return tl_store_open(spath, o);
}

static ckpt_store *open_rw(void)
{
	return tl_store_create(spath);
}

static int try_open(enum ckpt_store_mode mode, bool create, ckpt_store **ret, char *err,
		    size_t errlen)
{
	struct ckpt_store_opts o;

	ckpt_store_opts_init(&o);
	o.mode = mode;
	o.create = create;
	*ret = NULL;
	return ckpt_store_open(spath, &o, ret, err, errlen);
}

static uint64_t mkfile(ckpt_store *s, uint64_t parent, const char *name)
{
	return tl_mknode(s, parent, name, S_IFREG | 0644);
}

static uint64_t mkdir_(ckpt_store *s, uint64_t parent, const char *name)
{
	return tl_mknode(s, parent, name, S_IFDIR | 0755);
}

static struct ckpt_inode attr(ckpt_store *s, uint64_t ino)
{
	struct ckpt_inode in;

	memset(&in, 0, sizeof(in));
	ck_assert_int_eq(ckpt_store_getattr(s, ino, &in), 0);
	return in;
}

static uint32_t nlink_of(ckpt_store *s, uint64_t ino)
{
	return attr(s, ino).nlink;
}

static uint64_t lookup_ino(ckpt_store *s, uint64_t parent, const char *name)
{
	struct ckpt_inode in;
	int r = ckpt_store_lookup(s, parent, name, &in);

	ck_assert_msg(r == 0, "lookup %s: %d", name, r);
	return in.ino;
}

static uint64_t refs_of(ckpt_store *s, const ckpt_digest *d)
{
	struct ckpt_chunk_loc loc;
	uint64_t refs = 12345;

	ck_assert_int_eq(ckpt_store_chunk_loc(s, d, &loc, &refs), 0);
	return refs;
}

static struct ckpt_store_stats sstats(ckpt_store *s)
{
	struct ckpt_store_stats st;

	ck_assert_int_eq(ckpt_store_stats(s, &st), 0);
	return st;
}

struct problems {
	int n;
	char all[8192]; /* every report, one per line */
};

static void fsck_cb(void *ud, const char *path, const char *what)
{
	struct problems *p = ud;
	size_t used = strlen(p->all);

	p->n++;
	snprintf(p->all + used, sizeof(p->all) - used, "%s: %s\n", path ? path : "-", what);
}

static int fsck(ckpt_store *s, struct problems *p)
{
	memset(p, 0, sizeof(*p));
	return ckpt_store_fsck(s, fsck_cb, p);
}

/* Put each buffer as one chunk, commit them in order as ino's content and
 * flush the overlay. */
static void commit_chunks(ckpt_store *s, uint64_t ino, uint8_t *const *bufs, const size_t *lens,
			  size_t n, ckpt_digest *ret_digests)
{
	struct ckpt_extent_list *l = ckpt_extent_list_new();

	ck_assert_ptr_nonnull(l);
	for (size_t i = 0; i < n; i++) {
		ckpt_digest d;
		ck_assert_int_eq(ckpt_store_put_chunk(s, bufs[i], lens[i], 0, &d), 0);
		ck_assert_int_eq(ckpt_extent_list_append(l, (uint32_t)lens[i], CKPT_EXT_CHUNK, &d),
				 0);
		if (ret_digests)
			ret_digests[i] = d;
	}
	ck_assert_int_eq(ckpt_store_commit_file(s, ino, l, 0, 1000, false), 0);
	/* index it now, so that refcounts, stats and fsck see it */
	ck_assert_int_eq(ckpt_store_flush(s), 0);
	ckpt_extent_list_free(l);
}

/* Name of the only (or first) pack file; returns its full path. */
static void first_pack(char *out, size_t outlen)
{
	char dir[256];
	DIR *d;
	struct dirent *de;
	char best[NAME_MAX + 1] = "";

	snprintf(dir, sizeof(dir), "%s/packs", spath);
	d = opendir(dir);
	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d)))
		if (strncmp(de->d_name, "pack-", 5) == 0 && strstr(de->d_name, ".ckpk") &&
		    (!best[0] || strcmp(de->d_name, best) < 0))
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

static uint64_t file_size(const char *path)
{
	struct stat st;

	ck_assert_int_eq(stat(path, &st), 0);
	return (uint64_t)st.st_size;
}

/* ---- open / create ---------------------------------------------------- */

START_TEST(test_create_layout)
{
	ckpt_store *s;
	struct ckpt_inode root;
	char p[256], buf[64];
	struct stat st;
	int fd;
	ssize_t n;

	/* spath does not exist yet: create makes it */
	s = open_rw();
	root = attr(s, CKPT_ROOT_INO);
	ck_assert(S_ISDIR(root.mode));
	ck_assert_uint_eq(root.nlink, 2);
	ck_assert_uint_eq(root.parent, CKPT_ROOT_INO);
	ck_assert_uint_eq(root.size, 0);
	ck_assert_str_eq(ckpt_store_path(s), spath);
	ck_assert_int_eq(ckpt_store_compress_level(s), 1);
	ck_assert_ptr_nonnull(ckpt_store_engine(s));
	ckpt_store_free(s);
	ckpt_store_free(NULL);

	snprintf(p, sizeof(p), "%s/ckptfs-store", spath);
	fd = open(p, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	ck_assert_int_eq(n, 15);
	buf[n] = '\0';
	ck_assert_str_eq(buf, "ckptfs-store 1\n");
	snprintf(p, sizeof(p), "%s/packs", spath);
	ck_assert_int_eq(stat(p, &st), 0);
	ck_assert(S_ISDIR(st.st_mode));
	snprintf(p, sizeof(p), "%s/staging", spath);
	ck_assert_int_eq(stat(p, &st), 0);
	ck_assert(S_ISDIR(st.st_mode));
	snprintf(p, sizeof(p), "%s/index", spath);
	ck_assert_int_eq(stat(p, &st), 0);
	ck_assert(S_ISDIR(st.st_mode));
}
END_TEST

START_TEST(test_create_in_empty_dir_and_reopen)
{
	ckpt_store *s;
	char err[512];
	uint64_t f, d;
	struct ckpt_inode in;

	ck_assert_int_eq(mkdir(spath, 0755), 0);
	s = open_rw();
	f = mkfile(s, CKPT_ROOT_INO, "file");
	d = mkdir_(s, CKPT_ROOT_INO, "dir");
	ck_assert_uint_ne(f, d);
	ckpt_store_free(s);

	/* reopen without create: the namespace is still there */
	ck_assert_int_eq(try_open(CKPT_STORE_RW, false, &s, err, sizeof(err)), 0);
	ck_assert_uint_eq(lookup_ino(s, CKPT_ROOT_INO, "file"), f);
	ck_assert_uint_eq(lookup_ino(s, CKPT_ROOT_INO, "dir"), d);
	ck_assert_uint_eq(nlink_of(s, CKPT_ROOT_INO), 3);
	/* inode numbers are never reused after a reopen */
	ck_assert_int_eq(ckpt_store_mknode(s, CKPT_ROOT_INO, "new", S_IFREG | 0600, 0, 0, NULL,
					   &in),
			 0);
	ck_assert_uint_gt(in.ino, d);
	ck_assert_uint_gt(in.ino, f);
	ckpt_store_free(s);
	/* a create on an existing store opens it */
	s = open_rw();
	ck_assert_uint_eq(lookup_ino(s, CKPT_ROOT_INO, "new"), in.ino);
	ckpt_store_free(s);
}
END_TEST

static unsigned mode_of(const char *rel)
{
	char path[256];
	struct stat st;

	snprintf(path, sizeof(path), "%s%s%s", spath, rel[0] ? "/" : "", rel);
	ck_assert_int_eq(stat(path, &st), 0);
	return st.st_mode & 07777;
}

/* Only the store's owner may enter it: it holds every user's data and the
 * chunk hash secret (in the index).  A new store is made private whatever
 * the umask, also in an empty directory given to it; a store that lets
 * others in is made private by a read-write open, not by a shared one. */
START_TEST(test_store_dir_private)
{
	ckpt_store *s;
	char err[512];
	mode_t old = umask(022);

	s = open_rw();
	ckpt_store_free(s);
	ck_assert_uint_eq(mode_of(""), 0700);
	ck_assert_uint_eq(mode_of("index"), 0700);
	ck_assert_uint_eq(mode_of("packs"), 0700);
	ck_assert_uint_eq(mode_of("staging"), 0700);

	ck_assert_int_eq(chmod(spath, 0755), 0);
	ck_assert_int_eq(try_open(CKPT_STORE_RO_SHARED, false, &s, err, sizeof(err)), 0);
	ckpt_store_free(s);
	ck_assert_uint_eq(mode_of(""), 0755);
	ck_assert_int_eq(try_open(CKPT_STORE_RW, false, &s, err, sizeof(err)), 0);
	ckpt_store_free(s);
	ck_assert_uint_eq(mode_of(""), 0700);

	/* an empty directory someone made for the store */
	{
		char copy[sizeof(spath)];
		memcpy(copy, spath, sizeof(copy));
		tl_dir_remove(copy); /* (clears its argument) */
	}
	ck_assert_int_eq(mkdir(spath, 0775), 0);
	ck_assert_int_eq(try_open(CKPT_STORE_RW, true, &s, err, sizeof(err)), 0);
	ckpt_store_free(s);
	ck_assert_uint_eq(mode_of(""), 0700);
	umask(old);
}
END_TEST

START_TEST(test_open_refusals)
{
	ckpt_store *s;
	char err[512], p[256];
	struct ckpt_store_opts o;
	FILE *f;

	/* missing, no create */
	err[0] = '\0';
	ck_assert_int_eq(try_open(CKPT_STORE_RW, false, &s, err, sizeof(err)), -ENOENT);
	ck_assert_ptr_null(s);
	ck_assert_ptr_nonnull(strstr(err, spath));
	ck_assert_int_eq(try_open(CKPT_STORE_RO_SHARED, false, &s, err, sizeof(err)), -ENOENT);
	/* empty directory without create: not a store */
	ck_assert_int_eq(mkdir(spath, 0755), 0);
	ck_assert_int_eq(try_open(CKPT_STORE_RW, false, &s, err, sizeof(err)), -EINVAL);
	/* ... nor with create in a read-only mode */
	ck_assert_int_eq(try_open(CKPT_STORE_RO, true, &s, err, sizeof(err)), -EINVAL);
	/* non-empty directory that is not a store, with and without create */
	snprintf(p, sizeof(p), "%s/precious.txt", spath);
	f = fopen(p, "w");
	ck_assert_ptr_nonnull(f);
	fputs("data", f);
	fclose(f);
	err[0] = '\0';
	ck_assert_int_eq(try_open(CKPT_STORE_RW, true, &s, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_null(s);
	ck_assert_ptr_nonnull(strstr(err, spath));
	ck_assert_int_eq(try_open(CKPT_STORE_RW, false, &s, err, sizeof(err)), -EINVAL);
	/* nothing was created in it */
	snprintf(p, sizeof(p), "%s/index", spath);
	ck_assert_int_eq(access(p, F_OK), -1);
	snprintf(p, sizeof(p), "%s/ckptfs-store", spath);
	ck_assert_int_eq(access(p, F_OK), -1);

	/* a newer format marker */
	f = fopen(p, "w");
	ck_assert_ptr_nonnull(f);
	fputs("ckptfs-store 99\n", f);
	fclose(f);
	err[0] = '\0';
	ck_assert_int_eq(try_open(CKPT_STORE_RW, false, &s, err, sizeof(err)), -EPROTONOSUPPORT);
	ck_assert_ptr_nonnull(strstr(err, "99"));
	ck_assert_int_eq(try_open(CKPT_STORE_RO_SHARED, false, &s, err, sizeof(err)),
			 -EPROTONOSUPPORT);
	ck_assert_int_eq(try_open(CKPT_STORE_RW, true, &s, err, sizeof(err)), -EPROTONOSUPPORT);
	/* a garbage marker, format 0 */
	f = fopen(p, "w");
	fputs("something else\n", f);
	fclose(f);
	ck_assert_int_eq(try_open(CKPT_STORE_RW, false, &s, err, sizeof(err)), -EINVAL);
	f = fopen(p, "w");
	fputs("ckptfs-store 0\n", f);
	fclose(f);
	ck_assert_int_eq(try_open(CKPT_STORE_RW, false, &s, err, sizeof(err)), -EINVAL);

	/* bad compression level */
	ckpt_store_opts_init(&o);
	o.compress_level = 20;
	ck_assert_int_eq(ckpt_store_open(spath, &o, &s, err, sizeof(err)), -EINVAL);
	o.compress_level = -1;
	ck_assert_int_eq(ckpt_store_open(spath, &o, &s, err, sizeof(err)), -EINVAL);
}
END_TEST

/* The 'M' "hash_algo" record (value in *ret_id); 0 or -ENOENT. */
static int hash_algo_of(ckpt_store *s, uint32_t *ret_id)
{
	uint8_t key[32], buf[4];
	int r = ckpt_engine_get_fixed(ckpt_store_engine(s), key, ckpt_key_meta(key, "hash_algo"),
				      buf, 4);

	if (r == 0)
		*ret_id = ckpt_get_le32(buf);
	return r;
}

static void set_hash_algo(ckpt_store *s, bool present, uint32_t id)
{
	uint8_t key[32], buf[4];
	ckpt_txn *t;

	ckpt_put_le32(buf, id);
	ck_assert_int_eq(ckpt_txn_begin(ckpt_store_engine(s), &t), 0);
	if (present)
		ckpt_txn_put(t, key, ckpt_key_meta(key, "hash_algo"), buf, 4);
	else
		ckpt_txn_delete(t, key, ckpt_key_meta(key, "hash_algo"));
	ck_assert_int_eq(ckpt_txn_commit(t, true), 0);
}

/* Chunk identity is versioned: a new store records algorithm 1; a store
 * from before the record reads as algorithm 1 and gets the record at its
 * first read-write open (not at a read-only one); an unknown id is refused
 * with a message naming the store and the id. */
START_TEST(test_hash_algo_record)
{
	ckpt_store *s = open_rw();
	uint32_t id = 0;
	uint64_t f = mkfile(s, CKPT_ROOT_INO, "f");
	char err[512];
	struct ckpt_inode in;

	ck_assert_int_eq(hash_algo_of(s, &id), 0);
	ck_assert_uint_eq(id, CKPT_HASH_XXH3_128_KEYED);
	/* as a store made before the record */
	set_hash_algo(s, false, 0);
	ckpt_store_free(s);
	ck_assert_int_eq(try_open(CKPT_STORE_RO_SHARED, false, &s, err, sizeof(err)), 0);
	ck_assert_int_eq(hash_algo_of(s, &id), -ENOENT);
	ck_assert_int_eq(ckpt_store_getattr(s, f, &in), 0);
	ckpt_store_free(s);
	ck_assert_int_eq(try_open(CKPT_STORE_RW, false, &s, err, sizeof(err)), 0);
	id = 0;
	ck_assert_int_eq(hash_algo_of(s, &id), 0);
	ck_assert_uint_eq(id, CKPT_HASH_XXH3_128_KEYED);
	/* an id this ckptfs does not know */
	set_hash_algo(s, true, 77);
	ckpt_store_free(s);
	for (int mode = 0; mode < 3; mode++) {
		err[0] = '\0';
		ck_assert_int_eq(try_open((enum ckpt_store_mode)mode, false, &s, err, sizeof(err)),
				 -EPROTONOSUPPORT);
		ck_assert_ptr_null(s);
		ck_assert_msg(strstr(err, spath) && strstr(err, "hash algorithm id 77"), "%s", err);
	}
}
END_TEST

START_TEST(test_open_busy_and_shared)
{
	ckpt_store *s, *s2 = NULL, *ro = NULL;
	char err[512];
	uint64_t f;
	ckpt_digest d;
	struct ckpt_inode in;
	struct ckpt_store_stats st;

	s = open_rw();
	f = mkfile(s, CKPT_ROOT_INO, "f");
	err[0] = '\0';
	ck_assert_int_eq(try_open(CKPT_STORE_RW, false, &s2, err, sizeof(err)), -EBUSY);
	ck_assert_ptr_null(s2);
	ck_assert_ptr_nonnull(strstr(err, spath));
	ck_assert_int_eq(try_open(CKPT_STORE_RW, true, &s2, err, sizeof(err)), -EBUSY);
	ck_assert_int_eq(try_open(CKPT_STORE_RO, false, &s2, err, sizeof(err)), -EBUSY);

	/* RO_SHARED works next to the RW owner and sees its namespace */
	ck_assert_int_eq(try_open(CKPT_STORE_RO_SHARED, false, &ro, err, sizeof(err)), 0);
	ck_assert_uint_eq(lookup_ino(ro, CKPT_ROOT_INO, "f"), f);
	ck_assert_int_eq(ckpt_store_stats(ro, &st), 0);
	ck_assert_uint_eq(st.files, 1);
	/* and refuses to change anything */
	ck_assert_int_eq(ckpt_store_put_chunk(ro, "abc", 3, 0, &d), -EROFS);
	ck_assert_int_eq(ckpt_store_mknode(ro, CKPT_ROOT_INO, "g", S_IFREG | 0644, 0, 0, NULL,
					   &in),
			 -EROFS);
	ck_assert_int_eq(ckpt_store_unlink(ro, CKPT_ROOT_INO, "f", false), -EROFS);
	{
		struct ckpt_gc_stats gs;
		ck_assert_int_eq(ckpt_store_gc(ro, &gs), -EROFS);
	}
	ckpt_store_free(ro);
	/* the owner is unaffected */
	ck_assert_uint_eq(lookup_ino(s, CKPT_ROOT_INO, "f"), f);
	ckpt_store_free(s);

	/* once closed, the store can be opened exclusively again */
	ck_assert_int_eq(try_open(CKPT_STORE_RO, false, &s2, err, sizeof(err)), 0);
	ck_assert_uint_eq(lookup_ino(s2, CKPT_ROOT_INO, "f"), f);
	ckpt_store_free(s2);
	ck_assert_int_eq(try_open(CKPT_STORE_RW, false, &s2, err, sizeof(err)), 0);
	ckpt_store_free(s2);
}
END_TEST

/* ---- namespace -------------------------------------------------------- */

START_TEST(test_mknode_lookup)
{
	ckpt_store *s = open_rw();
	struct ckpt_inode in, l, root;
	char *target = NULL, name[CKPT_NAME_MAX + 2];
	uint64_t f, d, sl;

	ck_assert_int_eq(ckpt_store_mknode(s, CKPT_ROOT_INO, "file", S_IFREG | 0640, 11, 22, NULL,
					   &in),
			 0);
	f = in.ino;
	ck_assert_uint_eq(in.mode, S_IFREG | 0640);
	ck_assert_uint_eq(in.uid, 11);
	ck_assert_uint_eq(in.gid, 22);
	ck_assert_uint_eq(in.nlink, 1);
	ck_assert_uint_eq(in.size, 0);
	ck_assert_uint_eq(in.parent, 0);
	ck_assert_int_eq(ckpt_store_lookup(s, CKPT_ROOT_INO, "file", &l), 0);
	ck_assert_uint_eq(l.ino, f);
	ck_assert_uint_eq(l.mode, S_IFREG | 0640);
	ck_assert_uint_eq(l.uid, 11);
	ck_assert_uint_eq(l.mtime_ns, in.mtime_ns);

	d = mkdir_(s, CKPT_ROOT_INO, "dir");
	l = attr(s, d);
	ck_assert(S_ISDIR(l.mode));
	ck_assert_uint_eq(l.nlink, 2);
	ck_assert_uint_eq(l.parent, CKPT_ROOT_INO);

	ck_assert_int_eq(ckpt_store_mknode(s, d, "link", S_IFLNK | 0777, 0, 0, "../file/x", &in),
			 0);
	sl = in.ino;
	ck_assert_uint_eq(in.size, 9);
	ck_assert_int_eq(ckpt_store_readlink(s, sl, &target), 0);
	ck_assert_str_eq(target, "../file/x");
	free(target);
	ck_assert_int_eq(ckpt_store_readlink(s, f, &target), -EINVAL);
	ck_assert_uint_eq(lookup_ino(s, d, "link"), sl);

	/* errors */
	ck_assert_int_eq(ckpt_store_mknode(s, CKPT_ROOT_INO, "file", S_IFREG | 0644, 0, 0, NULL,
					   &in),
			 -EEXIST);
	ck_assert_int_eq(ckpt_store_mknode(s, CKPT_ROOT_INO, "dir", S_IFDIR | 0755, 0, 0, NULL,
					   &in),
			 -EEXIST);
	ck_assert_int_eq(ckpt_store_mknode(s, f, "x", S_IFREG | 0644, 0, 0, NULL, &in), -ENOTDIR);
	ck_assert_int_eq(ckpt_store_mknode(s, 9999, "x", S_IFREG | 0644, 0, 0, NULL, &in),
			 -ENOENT);
	ck_assert_int_eq(ckpt_store_mknode(s, CKPT_ROOT_INO, "", S_IFREG | 0644, 0, 0, NULL, &in),
			 -EINVAL);
	ck_assert_int_eq(ckpt_store_mknode(s, CKPT_ROOT_INO, "a/b", S_IFREG | 0644, 0, 0, NULL,
					   &in),
			 -EINVAL);
	ck_assert_int_eq(ckpt_store_mknode(s, CKPT_ROOT_INO, "fifo", S_IFIFO | 0644, 0, 0, NULL,
					   &in),
			 -EINVAL);
	ck_assert_int_eq(ckpt_store_mknod(s, CKPT_ROOT_INO, "reg", S_IFREG | 0644, 0, 0, 0, &in),
			 -EINVAL);
	memset(name, 'n', CKPT_NAME_MAX + 1);
	name[CKPT_NAME_MAX + 1] = '\0';
	ck_assert_int_eq(ckpt_store_mknode(s, CKPT_ROOT_INO, name, S_IFREG | 0644, 0, 0, NULL,
					   &in),
			 -ENAMETOOLONG);
	ck_assert_int_eq(ckpt_store_lookup(s, CKPT_ROOT_INO, name, &l), -ENAMETOOLONG);
	name[CKPT_NAME_MAX] = '\0'; /* exactly the maximum is fine */
	ck_assert_int_eq(ckpt_store_mknode(s, CKPT_ROOT_INO, name, S_IFREG | 0644, 0, 0, NULL,
					   &in),
			 0);
	ck_assert_uint_eq(lookup_ino(s, CKPT_ROOT_INO, name), in.ino);
	ck_assert_int_eq(ckpt_store_lookup(s, CKPT_ROOT_INO, "nope", &l), -ENOENT);
	ck_assert_int_eq(ckpt_store_lookup(s, d, "file", &l), -ENOENT);
	ck_assert_int_eq(ckpt_store_getattr(s, 9999, &l), -ENOENT);

	/* a regular file and a symlink do not change the parent's nlink */
	root = attr(s, CKPT_ROOT_INO);
	ck_assert_uint_eq(root.nlink, 3);
	ck_assert_uint_eq(nlink_of(s, d), 2);
	ckpt_store_free(s);
}
END_TEST

/* Fifos, sockets and devices survive a reopen with their type and device
 * number, hold no content, and leave fsck clean; an unlinked one is reaped. */
START_TEST(test_special_files_reopen)
{
	ckpt_store *s = open_rw();
	struct ckpt_store_stats st;
	struct ckpt_inode in;
	struct problems p;
	uint64_t fifo, chr, blk, sock;

	ck_assert_int_eq(ckpt_store_mknod(s, CKPT_ROOT_INO, "fifo", S_IFIFO | 0600, 1, 2, 0, &in),
			 0);
	fifo = in.ino;
	ck_assert_int_eq(ckpt_store_mknod(s, CKPT_ROOT_INO, "null", S_IFCHR | 0666, 0, 0,
					  makedev(1, 3), &in),
			 0);
	chr = in.ino;
	ck_assert_int_eq(ckpt_store_mknod(s, CKPT_ROOT_INO, "disk", S_IFBLK | 0660, 0, 6,
					  makedev(259, 300), &in),
			 0);
	blk = in.ino;
	ck_assert_int_eq(ckpt_store_mknod(s, CKPT_ROOT_INO, "sock", S_IFSOCK | 0755, 0, 0, 0, &in),
			 0);
	sock = in.ino;
	ckpt_store_free(s);

	s = open_rw();
	in = attr(s, fifo);
	ck_assert_uint_eq(in.mode, S_IFIFO | 0600);
	ck_assert_uint_eq(in.uid, 1);
	ck_assert_uint_eq(in.gid, 2);
	ck_assert_uint_eq(in.rdev, 0);
	in = attr(s, chr);
	ck_assert_uint_eq(in.mode, S_IFCHR | 0666);
	ck_assert_uint_eq(in.rdev, makedev(1, 3));
	in = attr(s, blk);
	ck_assert_uint_eq(in.mode, S_IFBLK | 0660);
	ck_assert_uint_eq(in.rdev, makedev(259, 300));
	ck_assert_uint_eq(attr(s, sock).mode, S_IFSOCK | 0755);
	ck_assert_uint_eq(lookup_ino(s, CKPT_ROOT_INO, "null"), chr);
	memset(&p, 0, sizeof(p));
	ck_assert_int_eq(fsck(s, &p), 0);
	ck_assert_int_eq(p.n, 0);
	ck_assert_int_eq(ckpt_store_stats(s, &st), 0);
	ck_assert_uint_eq(st.files, 0);
	ck_assert_uint_eq(st.logical_bytes, 0);
	/* unlinked and no longer used: its records go */
	ck_assert_int_eq(ckpt_store_unlink(s, CKPT_ROOT_INO, "null", false), 0);
	ck_assert_int_eq(ckpt_store_reap(s, chr), 0);
	ck_assert_int_eq(ckpt_store_getattr(s, chr, &in), -ENOENT);
	ckpt_store_free(s);
}
END_TEST

START_TEST(test_readdir_order)
{
	ckpt_store *s = open_rw();
	struct ckpt_dirent *ents = NULL;
	size_t n = 99;
	static const char *names[] = { "b", "a", "c", "aa", "B", "a.b" };
	static const char *sorted[] = { "B", "a", "a.b", "aa", "b", "c" };
	uint64_t inos[6], d, d2;

	d = mkdir_(s, CKPT_ROOT_INO, "d");
	d2 = mkdir_(s, CKPT_ROOT_INO, "e"); /* sibling directory: its entries stay out */
	mkfile(s, d2, "zzz");
	mkfile(s, CKPT_ROOT_INO, "rootfile");
	for (int i = 0; i < 6; i++)
		inos[i] = tl_mknode(s, d, names[i], i == 3 ? S_IFDIR | 0755 : S_IFREG | 0644);
	ck_assert_int_eq(ckpt_store_readdir(s, d, &ents, &n), 0);
	ck_assert_uint_eq(n, 6);
	for (int i = 0; i < 6; i++) {
		int j;
		ck_assert_str_eq(ents[i].name, sorted[i]);
		for (j = 0; j < 6; j++)
			if (strcmp(names[j], sorted[i]) == 0)
				break;
		ck_assert_uint_eq(ents[i].ino, inos[j]);
		ck_assert_uint_eq(ents[i].mode & S_IFMT, j == 3 ? S_IFDIR : S_IFREG);
	}
	ckpt_dirents_free(ents, n);
	/* an empty directory */
	ents = NULL;
	ck_assert_int_eq(ckpt_store_readdir(s, inos[3], &ents, &n), 0);
	ck_assert_uint_eq(n, 0);
	ckpt_dirents_free(ents, n);
	ckpt_dirents_free(NULL, 0);
	/* root: d, e, rootfile */
	ck_assert_int_eq(ckpt_store_readdir(s, CKPT_ROOT_INO, &ents, &n), 0);
	ck_assert_uint_eq(n, 3);
	ck_assert_str_eq(ents[0].name, "d");
	ck_assert_str_eq(ents[1].name, "e");
	ck_assert_str_eq(ents[2].name, "rootfile");
	ckpt_dirents_free(ents, n);
	ckpt_store_free(s);
}
END_TEST

START_TEST(test_unlink_rmdir)
{
	ckpt_store *s = open_rw();
	uint64_t f, d, sub;
	struct ckpt_inode in;

	f = mkfile(s, CKPT_ROOT_INO, "f");
	d = mkdir_(s, CKPT_ROOT_INO, "d");
	sub = mkfile(s, d, "x");
	ck_assert_uint_eq(nlink_of(s, CKPT_ROOT_INO), 3);

	ck_assert_int_eq(ckpt_store_unlink(s, CKPT_ROOT_INO, "d", false), -EISDIR);
	ck_assert_int_eq(ckpt_store_unlink(s, CKPT_ROOT_INO, "f", true), -ENOTDIR);
	ck_assert_int_eq(ckpt_store_unlink(s, CKPT_ROOT_INO, "d", true), -ENOTEMPTY);
	ck_assert_int_eq(ckpt_store_unlink(s, CKPT_ROOT_INO, "nope", false), -ENOENT);
	ck_assert_int_eq(ckpt_store_unlink(s, f, "x", false), -ENOTDIR);
	ck_assert_int_eq(ckpt_store_unlink(s, CKPT_ROOT_INO, "", false), -EINVAL);
	/* nothing changed */
	ck_assert_uint_eq(nlink_of(s, CKPT_ROOT_INO), 3);
	ck_assert_uint_eq(nlink_of(s, d), 2);

	ck_assert_int_eq(ckpt_store_unlink(s, d, "x", false), 0);
	ck_assert_int_eq(ckpt_store_lookup(s, d, "x", &in), -ENOENT);
	/* the inode lingers as an orphan until reaped */
	in = attr(s, sub);
	ck_assert_uint_eq(in.nlink, 0);
	ck_assert_int_eq(ckpt_store_unlink(s, CKPT_ROOT_INO, "d", true), 0);
	ck_assert_uint_eq(nlink_of(s, CKPT_ROOT_INO), 2);
	ck_assert_uint_eq(nlink_of(s, d), 0);
	/* a removed directory accepts no new entries */
	ck_assert_int_eq(ckpt_store_mknode(s, d, "y", S_IFREG | 0644, 0, 0, NULL, &in), -ENOENT);
	ck_assert_int_eq(ckpt_store_unlink(s, CKPT_ROOT_INO, "f", false), 0);
	ck_assert_uint_eq(nlink_of(s, f), 0);
	ck_assert_uint_eq(sstats(s).files, 0);
	ck_assert_uint_eq(sstats(s).dirs, 1);

	/* reaping deletes the inodes */
	ck_assert_int_eq(ckpt_store_reap(s, sub), 0);
	ck_assert_int_eq(ckpt_store_reap(s, d), 0);
	ck_assert_int_eq(ckpt_store_getattr(s, sub, &in), -ENOENT);
	ck_assert_int_eq(ckpt_store_getattr(s, d, &in), -ENOENT);
	/* f is reaped by the next open */
	ckpt_store_free(s);
	s = open_rw();
	ck_assert_int_eq(ckpt_store_getattr(s, f, &in), -ENOENT);
	ckpt_store_free(s);
}
END_TEST

/* I4: directory nlink = 2 + number of subdirectories, through every
 * operation that adds, removes or moves a directory. */
START_TEST(test_dir_nlink)
{
	ckpt_store *s = open_rw();
	uint64_t a, b, c;

	a = mkdir_(s, CKPT_ROOT_INO, "a");
	b = mkdir_(s, CKPT_ROOT_INO, "b");
	ck_assert_uint_eq(nlink_of(s, CKPT_ROOT_INO), 4);
	c = mkdir_(s, a, "c");
	ck_assert_uint_eq(nlink_of(s, a), 3);
	ck_assert_uint_eq(nlink_of(s, CKPT_ROOT_INO), 4);
	mkfile(s, a, "file");
	ck_assert_uint_eq(nlink_of(s, a), 3);

	/* move c from a to b */
	ck_assert_int_eq(ckpt_store_rename(s, a, "c", b, "c", 0), 0);
	ck_assert_uint_eq(nlink_of(s, a), 2);
	ck_assert_uint_eq(nlink_of(s, b), 3);
	ck_assert_uint_eq(attr(s, c).parent, b);
	ck_assert_uint_eq(nlink_of(s, CKPT_ROOT_INO), 4);

	/* rmdir c */
	ck_assert_int_eq(ckpt_store_unlink(s, b, "c", true), 0);
	ck_assert_uint_eq(nlink_of(s, b), 2);
	ck_assert_uint_eq(nlink_of(s, CKPT_ROOT_INO), 4);
	ck_assert_int_eq(ckpt_store_unlink(s, CKPT_ROOT_INO, "b", true), 0);
	ck_assert_uint_eq(nlink_of(s, CKPT_ROOT_INO), 3);
	(void)a;
	ckpt_store_free(s);
}
END_TEST

/* Renaming a directory within its parent keeps the parent's nlink. */
START_TEST(test_dir_nlink_rename_same_parent)
{
	ckpt_store *s = open_rw();
	uint64_t a;

	a = mkdir_(s, CKPT_ROOT_INO, "a");
	ck_assert_uint_eq(nlink_of(s, CKPT_ROOT_INO), 3);
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "a", CKPT_ROOT_INO, "a2", 0), 0);
	ck_assert_uint_eq(lookup_ino(s, CKPT_ROOT_INO, "a2"), a);
	ck_assert_uint_eq(attr(s, a).parent, CKPT_ROOT_INO);
	/* still one subdirectory: 2 + 1 */
	ck_assert_uint_eq(nlink_of(s, CKPT_ROOT_INO), 3);
	ckpt_store_free(s);
}
END_TEST

/* Renaming a directory over an empty sibling directory: one subdirectory
 * fewer. */
START_TEST(test_dir_nlink_rename_replace_same_parent)
{
	ckpt_store *s = open_rw();
	uint64_t a, b;
	struct ckpt_inode in;

	a = mkdir_(s, CKPT_ROOT_INO, "a");
	b = mkdir_(s, CKPT_ROOT_INO, "b");
	ck_assert_uint_eq(nlink_of(s, CKPT_ROOT_INO), 4);
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "a", CKPT_ROOT_INO, "b", 0), 0);
	ck_assert_uint_eq(lookup_ino(s, CKPT_ROOT_INO, "b"), a);
	ck_assert_int_eq(ckpt_store_lookup(s, CKPT_ROOT_INO, "a", &in), -ENOENT);
	ck_assert_uint_eq(nlink_of(s, b), 0);
	ck_assert_uint_eq(nlink_of(s, CKPT_ROOT_INO), 3);
	ckpt_store_free(s);
}
END_TEST

/* Renaming a directory over an empty directory in another parent. */
START_TEST(test_dir_nlink_rename_replace_other_parent)
{
	ckpt_store *s = open_rw();
	uint64_t p, q, x, y;

	p = mkdir_(s, CKPT_ROOT_INO, "p");
	q = mkdir_(s, CKPT_ROOT_INO, "q");
	x = mkdir_(s, p, "x");
	y = mkdir_(s, q, "y");
	ck_assert_uint_eq(nlink_of(s, p), 3);
	ck_assert_uint_eq(nlink_of(s, q), 3);
	ck_assert_int_eq(ckpt_store_rename(s, p, "x", q, "y", 0), 0);
	ck_assert_uint_eq(nlink_of(s, p), 2);
	ck_assert_uint_eq(nlink_of(s, q), 3);
	ck_assert_uint_eq(nlink_of(s, y), 0);
	ck_assert_uint_eq(attr(s, x).parent, q);
	ck_assert_uint_eq(lookup_ino(s, q, "y"), x);
	/* exchange a directory and a file across parents */
	mkfile(s, p, "f");
	ck_assert_int_eq(ckpt_store_rename(s, p, "f", q, "y", RENAME_EXCHANGE), 0);
	ck_assert_uint_eq(nlink_of(s, p), 3);
	ck_assert_uint_eq(nlink_of(s, q), 2);
	ck_assert_uint_eq(attr(s, x).parent, p);
	ck_assert_uint_eq(lookup_ino(s, p, "f"), x);
	ckpt_store_free(s);
}
END_TEST

START_TEST(test_rename)
{
	ckpt_store *s = open_rw();
	uint64_t f, g, d, e, sub;
	struct ckpt_inode in;

	f = mkfile(s, CKPT_ROOT_INO, "f");
	g = mkfile(s, CKPT_ROOT_INO, "g");
	d = mkdir_(s, CKPT_ROOT_INO, "d");
	e = mkdir_(s, CKPT_ROOT_INO, "e");
	sub = mkdir_(s, d, "sub");
	mkfile(s, e, "inside");

	/* plain move into another directory */
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "f", d, "f2", 0), 0);
	ck_assert_int_eq(ckpt_store_lookup(s, CKPT_ROOT_INO, "f", &in), -ENOENT);
	ck_assert_uint_eq(lookup_ino(s, d, "f2"), f);
	ck_assert_uint_eq(nlink_of(s, f), 1);
	ck_assert_int_eq(ckpt_store_rename(s, d, "f2", CKPT_ROOT_INO, "f", 0), 0);

	/* NOREPLACE */
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "f", CKPT_ROOT_INO, "g",
					   RENAME_NOREPLACE),
			 -EEXIST);
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "f", CKPT_ROOT_INO, "h",
					   RENAME_NOREPLACE),
			 0);
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "h", CKPT_ROOT_INO, "f", 0), 0);

	/* EXCHANGE */
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "f", CKPT_ROOT_INO, "g",
					   RENAME_EXCHANGE),
			 0);
	ck_assert_uint_eq(lookup_ino(s, CKPT_ROOT_INO, "f"), g);
	ck_assert_uint_eq(lookup_ino(s, CKPT_ROOT_INO, "g"), f);
	ck_assert_uint_eq(nlink_of(s, f), 1);
	ck_assert_uint_eq(nlink_of(s, g), 1);
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "f", CKPT_ROOT_INO, "nope",
					   RENAME_EXCHANGE),
			 -ENOENT);
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "f", CKPT_ROOT_INO, "g",
					   RENAME_EXCHANGE | RENAME_NOREPLACE),
			 -EINVAL);
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "f", CKPT_ROOT_INO, "g", 0x80),
			 -EINVAL);
	ck_assert_uint_eq(nlink_of(s, CKPT_ROOT_INO), 4);

	/* replace: the old target becomes an orphan */
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "f", CKPT_ROOT_INO, "g", 0), 0);
	ck_assert_uint_eq(lookup_ino(s, CKPT_ROOT_INO, "g"), g);
	ck_assert_int_eq(ckpt_store_lookup(s, CKPT_ROOT_INO, "f", &in), -ENOENT);
	ck_assert_uint_eq(nlink_of(s, f), 0);

	/* type mismatches and non-empty targets */
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "d", CKPT_ROOT_INO, "g", 0), -ENOTDIR);
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "g", CKPT_ROOT_INO, "d", 0), -EISDIR);
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "d", CKPT_ROOT_INO, "e", 0),
			 -ENOTEMPTY);
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "nope", CKPT_ROOT_INO, "x", 0),
			 -ENOENT);
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "g", 9999, "x", 0), -ENOENT);
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "g", g, "x", 0), -ENOTDIR);

	/* into its own subtree */
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "d", sub, "x", 0), -EINVAL);
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "d", d, "x", 0), -EINVAL);
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "d", d, "sub", RENAME_EXCHANGE),
			 -EINVAL);
	ck_assert_int_eq(ckpt_store_rename(s, d, "sub", CKPT_ROOT_INO, "d", RENAME_EXCHANGE),
			 -EINVAL);
	ck_assert_uint_eq(lookup_ino(s, d, "sub"), sub);
	ck_assert_uint_eq(attr(s, d).parent, CKPT_ROOT_INO);

	/* renaming one name of an inode onto another name of it: no-op */
	ck_assert_int_eq(ckpt_store_link(s, g, d, "g-link", &in), 0);
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "g", d, "g-link", 0), 0);
	ck_assert_uint_eq(lookup_ino(s, CKPT_ROOT_INO, "g"), g);
	ck_assert_uint_eq(lookup_ino(s, d, "g-link"), g);
	ck_assert_uint_eq(nlink_of(s, g), 2);
	/* after all this: root holds d and e, d holds sub */
	ck_assert_uint_eq(nlink_of(s, CKPT_ROOT_INO), 4);
	ck_assert_uint_eq(nlink_of(s, d), 3);
	ck_assert_uint_eq(nlink_of(s, e), 2);
	ckpt_store_free(s);
}
END_TEST

START_TEST(test_link)
{
	ckpt_store *s = open_rw();
	uint64_t f, d;
	struct ckpt_inode in;

	f = mkfile(s, CKPT_ROOT_INO, "f");
	d = mkdir_(s, CKPT_ROOT_INO, "d");
	ck_assert_int_eq(ckpt_store_link(s, f, d, "f2", &in), 0);
	ck_assert_uint_eq(in.ino, f);
	ck_assert_uint_eq(in.nlink, 2);
	ck_assert_uint_eq(nlink_of(s, f), 2);
	ck_assert_uint_eq(lookup_ino(s, d, "f2"), f);
	ck_assert_uint_eq(nlink_of(s, d), 2); /* a file link is no subdirectory */
	ck_assert_int_eq(ckpt_store_link(s, f, d, "f2", &in), -EEXIST);
	ck_assert_int_eq(ckpt_store_link(s, d, CKPT_ROOT_INO, "d2", &in), -EPERM);
	ck_assert_int_eq(ckpt_store_link(s, f, f, "x", &in), -ENOTDIR);
	ck_assert_int_eq(ckpt_store_link(s, 9999, d, "x", &in), -ENOENT);
	ck_assert_int_eq(ckpt_store_link(s, f, d, "a/b", &in), -EINVAL);

	/* one name gone: still linked, not an orphan */
	ck_assert_int_eq(ckpt_store_unlink(s, CKPT_ROOT_INO, "f", false), 0);
	ck_assert_uint_eq(nlink_of(s, f), 1);
	ck_assert_int_eq(ckpt_store_reap(s, f), 0);
	ck_assert_uint_eq(nlink_of(s, f), 1);
	/* last name gone: orphan; linking it back revives it */
	ck_assert_int_eq(ckpt_store_unlink(s, d, "f2", false), 0);
	ck_assert_uint_eq(nlink_of(s, f), 0);
	ck_assert_int_eq(ckpt_store_link(s, f, CKPT_ROOT_INO, "back", &in), 0);
	ck_assert_uint_eq(in.nlink, 1);
	ck_assert_int_eq(ckpt_store_reap(s, f), 0); /* no longer an orphan: no-op */
	ck_assert_uint_eq(lookup_ino(s, CKPT_ROOT_INO, "back"), f);
	ckpt_store_free(s);
	/* and the reopen does not reap it either */
	s = open_rw();
	ck_assert_uint_eq(nlink_of(s, f), 1);
	ckpt_store_free(s);
}
END_TEST

START_TEST(test_setattr)
{
	ckpt_store *s = open_rw();
	uint64_t f = mkfile(s, CKPT_ROOT_INO, "f");
	struct ckpt_inode in, out;

	memset(&in, 0, sizeof(in));
	in.mode = S_IFDIR | 04711; /* the type bits are ignored */
	in.uid = 7;
	in.mtime_ns = 123;
	in.ctime_ns = 456;
	ck_assert_int_eq(ckpt_store_setattr(s, f, CKPT_SET_MODE | CKPT_SET_UID | CKPT_SET_MTIME |
						 CKPT_SET_CTIME,
					    &in, &out),
			 0);
	out = attr(s, f);
	ck_assert_uint_eq(out.mode, S_IFREG | 04711);
	ck_assert_uint_eq(out.uid, 7);
	ck_assert_uint_eq(out.gid, 0);
	ck_assert_int_eq(out.mtime_ns, 123);
	ck_assert_int_eq(out.ctime_ns, 456);
	ck_assert_int_eq(ckpt_store_setattr(s, 9999, CKPT_SET_UID, &in, &out), -ENOENT);
	ckpt_store_free(s);
}
END_TEST

/* ---- chunks ----------------------------------------------------------- */

START_TEST(test_chunk_roundtrip)
{
	ckpt_store *s = open_rw();
	const size_t n = 300000;
	uint8_t *data = tl_random_buf(n, 1), *out = malloc(n);
	ckpt_digest d, unknown;
	struct ckpt_chunk_loc loc;
	uint64_t refs = 99;

	ck_assert_ptr_nonnull(out);
	ck_assert_int_eq(ckpt_store_put_chunk(s, data, n, 0, &d), 0);
	ck_assert_int_eq(ckpt_store_read_chunk(s, &d, 0, out, n), 0);
	ck_assert_mem_eq(out, data, n);
	ck_assert_int_eq(ckpt_store_read_chunk(s, &d, 1000, out, 10), 0);
	ck_assert_mem_eq(out, data + 1000, 10);
	ck_assert_int_eq(ckpt_store_read_chunk(s, &d, n - 1, out, 1), 0);
	ck_assert_uint_eq(out[0], data[n - 1]);
	ck_assert_int_eq(ckpt_store_read_chunk(s, &d, n, out, 0), 0);
	/* out of range */
	ck_assert_int_eq(ckpt_store_read_chunk(s, &d, n - 1, out, 2), -EIO);
	ck_assert_int_eq(ckpt_store_read_chunk(s, &d, n + 1, out, 0), -EIO);
	/* pending: location known, refcount 0 */
	ck_assert_int_eq(ckpt_store_chunk_loc(s, &d, &loc, &refs), 0);
	ck_assert_uint_eq(refs, 0);
	ck_assert_uint_eq(loc.raw_len, n);
	ck_assert_uint_eq(ckpt_pack_loc_id(&loc), 1);
	ck_assert_uint_eq(ckpt_pack_loc_offset(&loc), CKPT_PACK_HDR_SIZE);
	/* bad lengths */
	ck_assert_int_eq(ckpt_store_put_chunk(s, data, 0, 0, &d), -EINVAL);
	ck_assert_int_eq(ckpt_store_put_chunk(s, data, CKPT_CHUNK_MAX + 1, 0, &d), -EINVAL);
	/* unknown digest */
	memset(&unknown, 0x3c, sizeof(unknown));
	ck_assert_int_eq(ckpt_store_chunk_loc(s, &unknown, &loc, &refs), -ENOENT);
	ckpt_store_free(s);
	/* uncommitted chunks are unknown after a reopen; a re-put stores them */
	s = open_rw();
	ck_assert_int_eq(ckpt_store_chunk_loc(s, &d, &loc, &refs), -ENOENT);
	free(data);
	free(out);
	ckpt_store_free(s);
}
END_TEST

/* Whether read-ahead can use kernel AIO on the test store: the kernel has
 * it and the store's file system takes O_DIRECT (tmpfs does not). */
static bool aio_expected(void)
{
	aio_context_t ctx = 0;
	char path[PATH_MAX + 16];
	int fd;

	if (syscall(SYS_io_setup, 1, &ctx) != 0)
		return false;
	(void)syscall(SYS_io_destroy, ctx);
	snprintf(path, sizeof(path), "%s/odirect", spath);
	fd = open(path, O_RDWR | O_CREAT | O_DIRECT, 0600);
	if (fd < 0)
		return false;
	close(fd);
	unlink(path);
	return true;
}

/* Store count chunks of n random bytes (seeds seed, seed + 1, ...): their
 * bytes in data[i] (the caller frees them), their digests in d[i]. */
static void put_random_chunks(ckpt_store *s, size_t count, size_t n, uint64_t seed,
			      uint8_t **data, ckpt_digest *d)
{
	for (size_t i = 0; i < count; i++) {
		data[i] = tl_random_buf(n, seed + i);
		ck_assert_int_eq(ckpt_store_put_chunk(s, data[i], n, 0, &d[i]), 0);
	}
}

/* A fresh store whose read-ahead uses AIO (sync false) or pread. */
static ckpt_store *open_prefetch(bool sync)
{
	struct ckpt_store_opts o;

	ckpt_store_opts_init(&o);
	o.create = true;
	o.sync_readahead = sync;
	return open_opts(&o);
}

/* Span requests, none failed: n_aio submitted ones by AIO and n_sync by
 * pread, as the store was opened (sync: all by pread) and the machine
 * allows (without AIO or O_DIRECT, all by pread; without O_DIRECT they
 * fail, and their chunks are read alone through the page cache). */
static void check_prefetch_stats(const struct ckpt_prefetch_stats *ps, bool sync, uint64_t n_aio,
				 uint64_t n_sync)
{
	if (!sync && aio_expected()) {
		ck_assert_uint_eq(ps->aio, n_aio);
		ck_assert_uint_eq(ps->sync, n_sync);
		ck_assert_uint_eq(ps->failed, 0);
	} else {
		ck_assert_uint_eq(ps->aio, 0);
		ck_assert_uint_eq(ps->sync, n_aio + n_sync);
	}
}

/* Read-ahead's batch load: chunks whose records lie together are read with
 * one request and cached in full; a repeat and cached chunks are skipped,
 * an unknown one is counted as failed, and a damaged record in the middle
 * of a span is not cached while its neighbours are. */
START_TEST(test_prefetch_chunks)
{
	ckpt_store *s = open_prefetch(_i == 1);
	struct ckpt_prefetch_stats ps;
	const size_t n = 200000;
	ckpt_digest d[8];
	uint8_t *data[6], *out = malloc(n);
	struct ckpt_chunk_loc loc;
	struct ckpt_cache_stats before, after;
	size_t loaded = 9, skipped = 9;
	char path[PATH_MAX + 64];
	uint8_t byte;
	int fd;

	ck_assert_ptr_nonnull(out);
	put_random_chunks(s, 6, n, 100, data, d);
	d[6] = d[2];                   /* a repeat */
	memset(&d[7], 0x3c, sizeof(d[7])); /* unknown */
	/* damage chunk 4's stored bytes on the disk */
	ck_assert_int_eq(ckpt_store_chunk_loc(s, &d[4], &loc, NULL), 0);
	snprintf(path, sizeof(path), "%s/packs/pack-%016" PRIx64 ".ckpk", spath, ckpt_pack_loc_id(&loc));
	fd = open(path, O_RDWR);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &byte, 1, (off_t)(ckpt_pack_loc_offset(&loc) + CKPT_PACK_REC_HDR_SIZE + 777)), 1);
	byte ^= 0x40;
	ck_assert_int_eq(pwrite(fd, &byte, 1, (off_t)(ckpt_pack_loc_offset(&loc) + CKPT_PACK_REC_HDR_SIZE + 777)), 1);
	close(fd);

	ck_assert_int_eq(ckpt_store_prefetch_chunks(s, d, 8, &loaded, &skipped), 2);
	ck_assert_uint_eq(loaded, 5);
	ck_assert_uint_eq(skipped, 1);
	/* the six records lie together: one request, made by pread (the batch
	 * is finished at once) */
	ckpt_store_prefetch_stats(s, &ps);
	check_prefetch_stats(&ps, _i == 1, 0, 1);
	/* the five are cached (reads hit), the damaged one is not (a miss) */
	ckpt_store_cache_stats(s, &before);
	for (int i = 0; i < 6; i++) {
		if (i == 4)
			continue;
		ck_assert_int_eq(ckpt_store_read_chunk(s, &d[i], 0, out, n), 0);
		ck_assert_mem_eq(out, data[i], n);
	}
	ckpt_store_cache_stats(s, &after);
	ck_assert_uint_eq(after.hits - before.hits, 5);
	ck_assert_uint_eq(after.misses, before.misses);
	ck_assert_int_eq(ckpt_store_read_chunk(s, &d[4], 0, out, n), -EIO);
	ckpt_store_cache_stats(s, &after);
	ck_assert_uint_eq(after.misses - before.misses, 1);
	/* everything that could be loaded is cached now */
	ck_assert_int_eq(ckpt_store_prefetch_chunks(s, d, 4, &loaded, &skipped), 0);
	ck_assert_uint_eq(loaded, 0);
	ck_assert_uint_eq(skipped, 4);
	for (int i = 0; i < 6; i++)
		free(data[i]);
	free(out);
	ckpt_store_free(s);
}
END_TEST

/* Batches in flight together on one thread (a read-ahead worker decodes
 * one while the next one's reads are in flight): two get a span buffer
 * each, a third reads its chunks alone; finished in any order, each fills
 * its own chunks, and the completions of the one finished later are kept
 * for it meanwhile (a's reads complete while b and c are finished). */
START_TEST(test_prefetch_pipelined)
{
	ckpt_store *s = open_prefetch(_i == 1);
	const size_t n = 150000;
	ckpt_digest d[12];
	uint8_t *data[12], *out = malloc(n);
	ckpt_prefetch *pa, *pb, *pc;
	struct ckpt_prefetch_stats ps;
	struct ckpt_cache_stats before, after;
	size_t loaded = 9, skipped = 9;

	ck_assert_ptr_nonnull(out);
	put_random_chunks(s, 12, n, 300, data, d);
	ck_assert_int_eq(ckpt_store_prefetch_begin(s, d, 4, true, &pa), 0);
	ck_assert_int_eq(ckpt_store_prefetch_begin(s, d + 4, 4, false, &pb), 0);
	ck_assert_int_eq(ckpt_store_prefetch_begin(s, d + 8, 4, true, &pc), 0);
	ck_assert_int_eq(ckpt_store_prefetch_finish(s, pb, &loaded, &skipped), 0);
	ck_assert_uint_eq(loaded, 4);
	ck_assert_uint_eq(skipped, 0);
	ck_assert_int_eq(ckpt_store_prefetch_finish(s, pc, &loaded, &skipped), 0);
	ck_assert_uint_eq(loaded, 4);
	ck_assert_int_eq(ckpt_store_prefetch_finish(s, pa, &loaded, &skipped), 0);
	ck_assert_uint_eq(loaded, 4);
	/* a and b one request each (a's sent to AIO, b's made by pread in
	 * _finish); c's chunks were read alone */
	ckpt_store_prefetch_stats(s, &ps);
	check_prefetch_stats(&ps, _i == 1, 1, 1);
	ckpt_store_cache_stats(s, &before);
	for (int i = 0; i < 12; i++) {
		ck_assert_int_eq(ckpt_store_read_chunk(s, &d[i], 0, out, n), 0);
		ck_assert_mem_eq(out, data[i], n);
	}
	ckpt_store_cache_stats(s, &after);
	ck_assert_uint_eq(after.hits - before.hits, 12);
	ck_assert_uint_eq(after.misses, before.misses);
	/* all twelve are cached now: a batch of them skips every one */
	ck_assert_int_eq(ckpt_store_prefetch_begin(s, d, 12, true, &pa), 0);
	ck_assert_int_eq(ckpt_store_prefetch_finish(s, pa, &loaded, &skipped), 0);
	ck_assert_uint_eq(loaded, 0);
	ck_assert_uint_eq(skipped, 12);
	for (int i = 0; i < 12; i++)
		free(data[i]);
	free(out);
	ckpt_store_free(s);
}
END_TEST

/* A store opened with a buffer reserve loads read-ahead's chunks into it,
 * and a thread warmed up first (as a read-ahead worker is at mount) sends
 * its batch through its span buffers as before. */
START_TEST(test_prefetch_warm_reserve)
{
	struct ckpt_store_opts o;
	ckpt_store *s;
	const size_t n = 200000; /* two 128 KiB units a chunk */
	ckpt_digest d[6];
	uint8_t *data[6], *out = malloc(n);
	ckpt_prefetch *pf;
	struct ckpt_prefetch_stats ps;
	struct ckpt_cache_stats st;
	size_t loaded = 9, skipped = 9;

	ck_assert_ptr_nonnull(out);
	ckpt_store_opts_init(&o);
	o.create = true;
	o.sync_readahead = _i == 1;
	o.buf_reserve = 16u << 20;
	s = open_opts(&o);
	ck_assert_int_eq(ckpt_store_prefetch_warm(s), 0);
	ck_assert_int_eq(ckpt_store_prefetch_warm(s), 0); /* again: nothing to do */
	put_random_chunks(s, 6, n, 900, data, d);
	ck_assert_int_eq(ckpt_store_prefetch_begin(s, d, 6, true, &pf), 0);
	ck_assert_int_eq(ckpt_store_prefetch_finish(s, pf, &loaded, &skipped), 0);
	ck_assert_uint_eq(loaded, 6);
	ck_assert_uint_eq(skipped, 0);
	ckpt_store_prefetch_stats(s, &ps);
	check_prefetch_stats(&ps, _i == 1, 1, 0);
	ckpt_store_cache_stats(s, &st);
	ck_assert_uint_eq(st.bufs_reserve, 6);
	ck_assert_uint_eq(st.bufs_fresh, 0);
	for (int i = 0; i < 6; i++) {
		ck_assert_int_eq(ckpt_store_read_chunk(s, &d[i], 0, out, n), 0);
		ck_assert_mem_eq(out, data[i], n);
		free(data[i]);
	}
	ckpt_store_cache_stats(s, &st);
	ck_assert_uint_eq(st.hits, 6);
	free(out);
	ckpt_store_free(s);
}
END_TEST

struct load_arg {
	ckpt_store *s;
	const ckpt_digest *d;
	const uint8_t *want;
	size_t n;
	int r;
};

static void *load_thread(void *p)
{
	struct load_arg *a = p;
	uint8_t *out = malloc(a->n);

	a->r = out ? ckpt_store_read_chunk(a->s, a->d, 0, out, a->n) : -ENOMEM;
	if (a->r == 0 && memcmp(out, a->want, a->n) != 0)
		a->r = -EIO;
	free(out);
	return NULL;
}

/* Chunk loads by threads that come and go (as libfuse's workers do) borrow
 * the store's load contexts instead of making one per thread: with a
 * buffer reserve the four made at open serve them all, without one a
 * single context is made and reused. */
START_TEST(test_load_ctx_reuse)
{
	struct ckpt_store_opts o;
	struct ckpt_load_ctx_stats ls;
	struct ckpt_cache_stats st;
	const size_t n = 300000;
	ckpt_digest d[6];
	uint8_t *data[6];
	ckpt_store *s;
	const uint64_t warm = _i == 0 ? 4 : 0;

	ckpt_store_opts_init(&o);
	o.create = true;
	o.buf_reserve = _i == 0 ? 16u << 20 : 0;
	s = open_opts(&o);
	ckpt_store_load_ctx_stats(s, &ls);
	ck_assert_uint_eq(ls.warm, warm);
	ck_assert_uint_eq(ls.made, warm);
	ck_assert_uint_eq(ls.free, warm);
	put_random_chunks(s, 6, n, 1300, data, d);
	for (int i = 0; i < 6; i++) {
		struct load_arg a = { s, &d[i], data[i], n, 1 };
		pthread_t th;

		ck_assert_int_eq(pthread_create(&th, NULL, load_thread, &a), 0);
		ck_assert_int_eq(pthread_join(th, NULL), 0);
		ck_assert_int_eq(a.r, 0);
		free(data[i]);
	}
	ckpt_store_cache_stats(s, &st);
	ck_assert_uint_eq(st.misses, 6); /* each thread loaded its chunk */
	ckpt_store_load_ctx_stats(s, &ls);
	ck_assert_uint_eq(ls.warm, warm);
	ck_assert_uint_eq(ls.made, _i == 0 ? 4 : 1);
	ck_assert_uint_eq(ls.free, ls.made);
	ckpt_store_free(s);
}
END_TEST

/* A thread's two span buffers serve batch after batch: each round begins
 * one batch sent to AIO and one left for _finish, finishes both, and the
 * next round's batches get span buffers again (a batch that finds none
 * reads its chunks alone, outside the request counts). */
START_TEST(test_prefetch_span_reuse)
{
	ckpt_store *s = open_prefetch(_i == 1);
	const size_t n = 120000;
	enum { ROUNDS = 3, PER = 3, N = ROUNDS * 2 * PER };
	ckpt_digest d[N];
	uint8_t *data[N], *out = malloc(n);
	struct ckpt_prefetch_stats ps;
	size_t loaded = 9, skipped = 9;

	ck_assert_ptr_nonnull(out);
	put_random_chunks(s, N, n, 700, data, d);
	for (int r = 0; r < ROUNDS; r++) {
		ckpt_prefetch *pa, *pb;
		const ckpt_digest *a = d + r * 2 * PER, *b = a + PER;

		ck_assert_int_eq(ckpt_store_prefetch_begin(s, a, PER, true, &pa), 0);
		ck_assert_int_eq(ckpt_store_prefetch_begin(s, b, PER, false, &pb), 0);
		ck_assert_int_eq(ckpt_store_prefetch_finish(s, pa, &loaded, &skipped), 0);
		ck_assert_uint_eq(loaded, PER);
		ck_assert_uint_eq(skipped, 0);
		ck_assert_int_eq(ckpt_store_prefetch_finish(s, pb, &loaded, &skipped), 0);
		ck_assert_uint_eq(loaded, PER);
		/* one request per batch so far: both buffers were free again */
		ckpt_store_prefetch_stats(s, &ps);
		check_prefetch_stats(&ps, _i == 1, (uint64_t)r + 1, (uint64_t)r + 1);
	}
	for (int i = 0; i < N; i++) {
		ck_assert_int_eq(ckpt_store_read_chunk(s, &d[i], 0, out, n), 0);
		ck_assert_mem_eq(out, data[i], n);
		free(data[i]);
	}
	free(out);
	ckpt_store_free(s);
}
END_TEST

/* store.h: read_chunk returns "-ENOENT if unknown". */
START_TEST(test_read_unknown_chunk)
{
	ckpt_store *s = open_rw();
	ckpt_digest unknown;
	uint8_t out[4];

	memset(&unknown, 0x3c, sizeof(unknown));
	ck_assert_int_eq(ckpt_store_read_chunk(s, &unknown, 0, out, 4), -EIO); /* unknown = damaged (store.h) */
	ckpt_store_free(s);
}
END_TEST

START_TEST(test_chunk_max_size)
{
	ckpt_store *s = open_rw();
	uint8_t *data = tl_random_buf(CKPT_CHUNK_MAX, 2), *out = malloc(CKPT_CHUNK_MAX);
	ckpt_digest d;

	ck_assert_int_eq(ckpt_store_put_chunk(s, data, CKPT_CHUNK_MAX, 0, &d), 0);
	ck_assert_int_eq(ckpt_store_read_chunk(s, &d, 0, out, CKPT_CHUNK_MAX), 0);
	ck_assert_int_eq(memcmp(out, data, CKPT_CHUNK_MAX), 0);
	free(data);
	free(out);
	ckpt_store_free(s);
}
END_TEST

START_TEST(test_dedup)
{
	ckpt_store *s = open_rw();
	const size_t n = 200000;
	uint8_t *a = tl_random_buf(n, 3), *a2 = malloc(n), *b = tl_random_buf(n, 4);
	ckpt_digest da, da2, db;
	struct ckpt_chunk_loc la, la2;
	char pack[512];
	uint64_t size1;
	uint64_t f, g;
	struct ckpt_store_stats st;

	memcpy(a2, a, n);
	ck_assert_int_eq(ckpt_store_put_chunk(s, a, n, 0, &da), 0);
	first_pack(pack, sizeof(pack));
	size1 = file_size(pack);
	/* same bytes (another buffer): same digest, nothing appended */
	ck_assert_int_eq(ckpt_store_put_chunk(s, a2, n, 4, &da2), 0);
	ck_assert_mem_eq(da.bytes, da2.bytes, 16);
	ck_assert_uint_eq(file_size(pack), size1);
	ck_assert_int_eq(ckpt_store_chunk_loc(s, &da, &la, NULL), 0);
	ck_assert_int_eq(ckpt_store_chunk_loc(s, &da2, &la2, NULL), 0);
	ck_assert(ckpt_chunk_loc_same(&la, &la2));
	/* different bytes: different digest */
	ck_assert_int_eq(ckpt_store_put_chunk(s, b, n, 0, &db), 0);
	ck_assert_mem_ne(da.bytes, db.bytes, 16);
	ck_assert_uint_gt(file_size(pack), size1);

	/* two files share a; the first holds it twice */
	f = mkfile(s, CKPT_ROOT_INO, "f");
	g = mkfile(s, CKPT_ROOT_INO, "g");
	{
		uint8_t *bufs[] = { a, a2, b };
		size_t lens[] = { n, n, n };
		commit_chunks(s, f, bufs, lens, 3, NULL);
		commit_chunks(s, g, bufs, lens, 1, NULL);
	}
	/* dedup against the index (committed) as well */
	ck_assert_int_eq(ckpt_store_put_chunk(s, a, n, 0, &da2), 0);
	ck_assert_uint_eq(refs_of(s, &da), 3);
	ck_assert_uint_eq(refs_of(s, &db), 1);
	st = sstats(s);
	ck_assert_uint_eq(st.files, 2);
	ck_assert_uint_eq(st.logical_bytes, 4 * n);
	ck_assert_uint_eq(st.chunks, 2);
	ck_assert_uint_eq(st.unique_bytes, 2 * n);
	ck_assert_uint_gt(st.stored_bytes, 0);
	ck_assert_uint_eq(st.dead_chunks, 0);
	ck_assert_uint_eq(st.pack_files, 1);
	ck_assert_uint_eq(st.pack_bytes, file_size(pack));
	/* exactly two records in the pack: header + two spans */
	{
		struct ckpt_chunk_loc lb;
		ck_assert_int_eq(ckpt_store_chunk_loc(s, &db, &lb, NULL), 0);
		ck_assert_uint_eq(file_size(pack), CKPT_PACK_HDR_SIZE +
							   ckpt_pack_rec_span(la.stored_len) +
							   ckpt_pack_rec_span(lb.stored_len));
		ck_assert_uint_eq(st.stored_bytes, (uint64_t)la.stored_len + lb.stored_len);
	}
	free(a);
	free(a2);
	free(b);
	ckpt_store_free(s);
}
END_TEST

START_TEST(test_commit_load_read)
{
	ckpt_store *s = open_rw();
	uint8_t *a = tl_random_buf(70000, 5), *b = tl_random_buf(1000, 6), *buf;
	ckpt_digest da, db;
	struct ckpt_extent_list *l = ckpt_extent_list_new(), *got = NULL;
	uint64_t f, d;
	struct ckpt_inode in;
	ssize_t n;
	size_t len;

	f = mkfile(s, CKPT_ROOT_INO, "f");
	d = mkdir_(s, CKPT_ROOT_INO, "d");
	ck_assert_int_eq(ckpt_store_put_chunk(s, a, 70000, 0, &da), 0);
	ck_assert_int_eq(ckpt_store_put_chunk(s, b, 1000, 0, &db), 0);
	/* a, 5000 zeros, the first 600 bytes of b */
	ck_assert_int_eq(ckpt_extent_list_append(l, 70000, CKPT_EXT_CHUNK, &da), 0);
	ck_assert_int_eq(ckpt_extent_list_append(l, 5000, CKPT_EXT_ZERO, NULL), 0);
	ck_assert_int_eq(ckpt_extent_list_append(l, 600, CKPT_EXT_CHUNK, &db), 0);
	ck_assert_int_eq(ckpt_store_commit_file(s, f, l, CKPT_INODE_F_SAFETENSORS, 4242, true), 0);
	in = attr(s, f);
	ck_assert_uint_eq(in.size, 75600);
	ck_assert_uint_eq(in.flags, CKPT_INODE_F_SAFETENSORS);
	ck_assert_int_eq(in.mtime_ns, 4242);
	ck_assert_int_eq(in.ctime_ns, 4242);

	ck_assert_int_eq(ckpt_store_load_extents(s, f, &got), 0);
	ck_assert_uint_eq(got->n, 3);
	ck_assert_uint_eq(got->size, 75600);
	for (size_t i = 0; i < 3; i++) {
		ck_assert_uint_eq(got->v[i].off, l->v[i].off);
		ck_assert_uint_eq(got->v[i].len, l->v[i].len);
		ck_assert_uint_eq(got->v[i].kind, l->v[i].kind);
		ck_assert_mem_eq(got->v[i].digest.bytes, l->v[i].digest.bytes, 16);
	}
	buf = malloc(80000);
	memset(buf, 0xee, 80000);
	n = ckpt_store_read_extents(s, got, buf, 80000, 0);
	ck_assert_int_eq(n, 75600);
	ck_assert_mem_eq(buf, a, 70000);
	for (size_t i = 70000; i < 75000; i++)
		ck_assert_uint_eq(buf[i], 0);
	ck_assert_mem_eq(buf + 75000, b, 600);
	/* a read across extent boundaries, one at the end, one past it */
	n = ckpt_store_read_extents(s, got, buf, 6000, 69990);
	ck_assert_int_eq(n, 5610);
	ck_assert_mem_eq(buf, a + 69990, 10);
	ck_assert_uint_eq(buf[10], 0);
	ck_assert_uint_eq(buf[5009], 0);
	ck_assert_mem_eq(buf + 5010, b, 600);
	ck_assert_int_eq(ckpt_store_read_extents(s, got, buf, 10, 75600), 0);
	ck_assert_int_eq(ckpt_store_read_extents(s, got, buf, 10, 1u << 30), 0);
	ckpt_extent_list_free(got);

	/* survives a reopen */
	ckpt_store_free(s);
	s = open_rw();
	{
		uint8_t *all = tl_read_file(s, f, &len);
		ck_assert_uint_eq(len, 75600);
		ck_assert_mem_eq(all, a, 70000);
		ck_assert_mem_eq(all + 75000, b, 600);
		free(all);
	}
	/* empty list: file emptied, no extent record */
	{
		struct ckpt_extent_list *e = ckpt_extent_list_new();
		ck_assert_int_eq(ckpt_store_commit_file(s, f, e, 0, 1, false), 0);
		ck_assert_uint_eq(attr(s, f).size, 0);
		ck_assert_int_eq(ckpt_store_load_extents(s, f, &got), 0);
		ck_assert_uint_eq(got->n, 0);
		ckpt_extent_list_free(got);
		ck_assert_int_eq(ckpt_store_flush(s), 0);
		ck_assert_uint_eq(sstats(s).dead_chunks, 2);
		ck_assert_uint_eq(sstats(s).logical_bytes, 0);
		/* not a regular file / no such inode: nothing is created (the
		 * overlay publishes without checking; the flush skips them) */
		for (int durable = 0; durable < 2; durable++) {
			int r = ckpt_store_commit_file(s, d, l, 0, 1, durable);
			ck_assert_msg(r == 0 || r == -EINVAL, "dir: %d", r);
			r = ckpt_store_commit_file(s, 9999, l, 0, 1, durable);
			ck_assert_msg(r == 0 || r == -ENOENT, "missing: %d", r);
		}
		ck_assert_int_eq(ckpt_store_flush(s), 0);
		ck_assert(S_ISDIR(attr(s, d).mode));
		ck_assert_uint_eq(attr(s, d).size, 0);
		ck_assert_int_eq(ckpt_store_getattr(s, 9999, &in), -ENOENT);
		ckpt_extent_list_free(e);
	}
	/* a durable commit naming a chunk nobody stored fails */
	{
		struct ckpt_extent_list *e = ckpt_extent_list_new();
		ckpt_digest bogus;
		memset(&bogus, 0x77, sizeof(bogus));
		ck_assert_int_eq(ckpt_extent_list_append(e, 10, CKPT_EXT_CHUNK, &bogus), 0);
		ck_assert_int_eq(ckpt_store_commit_file(s, f, e, 0, 1, true), -EIO);
		ckpt_extent_list_free(e);
	}
	ck_assert_uint_eq(attr(s, f).size, 0);
	ck_assert_int_eq(ckpt_store_flush(s), 0);
	/* load_extents of a file never committed: empty list */
	{
		uint64_t g = mkfile(s, CKPT_ROOT_INO, "g");
		ck_assert_int_eq(ckpt_store_load_extents(s, g, &got), 0);
		ck_assert_uint_eq(got->n, 0);
		ck_assert_uint_eq(got->size, 0);
		ckpt_extent_list_free(got);
	}
	ckpt_extent_list_free(l);
	free(a);
	free(b);
	free(buf);
	ckpt_store_free(s);
}
END_TEST

static bool index_has_file(ckpt_store *s, uint64_t ino)
{
	uint8_t key[16], *v;
	size_t vl;
	int r = ckpt_engine_get(ckpt_store_engine(s), key, ckpt_key_ino(key, CKPT_KEY_FILE, ino), &v,
				&vl);

	ck_assert(r == 0 || r == -ENOENT);
	if (r == 0)
		free(v);
	return r == 0;
}

static struct ckpt_extent_list *one_chunk_list(ckpt_store *s, const uint8_t *data, size_t len,
					       ckpt_digest *ret_d)
{
	struct ckpt_extent_list *l = ckpt_extent_list_new();

	ck_assert_ptr_nonnull(l);
	ck_assert_int_eq(ckpt_store_put_chunk(s, data, len, 0, ret_d), 0);
	ck_assert_int_eq(ckpt_extent_list_append(l, (uint32_t)len, CKPT_EXT_CHUNK, ret_d), 0);
	return l;
}

/* A non-durable commit is visible at once through the store, reaches the
 * index at flush / sync_file / rename / close / within seconds. */
START_TEST(test_overlay)
{
	ckpt_store *s = open_rw();
	uint8_t *a = tl_random_buf(20000, 50), *b = tl_random_buf(30000, 51);
	struct ckpt_extent_list *la, *lb, *got;
	ckpt_digest da, db;
	uint64_t f, g;
	struct ckpt_inode in;
	size_t len;
	uint8_t *back;

	f = mkfile(s, CKPT_ROOT_INO, "f");
	g = mkfile(s, CKPT_ROOT_INO, "g");
	la = one_chunk_list(s, a, 20000, &da);
	lb = one_chunk_list(s, b, 30000, &db);

	/* published to this process, not yet indexed */
	ck_assert_int_eq(ckpt_store_commit_file(s, f, la, CKPT_INODE_F_SAFETENSORS, 777, false), 0);
	in = attr(s, f);
	ck_assert_uint_eq(in.size, 20000);
	ck_assert_uint_eq(in.flags, CKPT_INODE_F_SAFETENSORS);
	ck_assert_int_eq(in.mtime_ns, 777);
	{
		struct ckpt_inode l;
		ck_assert_int_eq(ckpt_store_lookup(s, CKPT_ROOT_INO, "f", &l), 0);
		ck_assert_uint_eq(l.size, 20000);
	}
	back = tl_read_file(s, f, &len);
	ck_assert_uint_eq(len, 20000);
	ck_assert_mem_eq(back, a, 20000);
	free(back);
	ck_assert(!index_has_file(s, f));
	ck_assert_uint_eq(refs_of(s, &da), 0);
	ck_assert_uint_eq(sstats(s).logical_bytes, 0);

	/* a later commit replaces the earlier one: only b reaches the index */
	ck_assert_int_eq(ckpt_store_commit_file(s, f, lb, 0, 778, false), 0);
	ck_assert_uint_eq(attr(s, f).size, 30000);
	ck_assert_int_eq(ckpt_store_flush(s), 0);
	ck_assert(index_has_file(s, f));
	ck_assert_uint_eq(refs_of(s, &db), 1);
	ck_assert_uint_eq(refs_of(s, &da), 0);
	ck_assert_uint_eq(sstats(s).logical_bytes, 30000);
	ck_assert_int_eq(ckpt_store_flush(s), 0); /* nothing left: no-op */

	/* setattr(mtime) on a file whose content is in the overlay sticks */
	ck_assert_int_eq(ckpt_store_commit_file(s, g, la, 0, 1000, false), 0);
	memset(&in, 0, sizeof(in));
	in.mtime_ns = 5;
	ck_assert_int_eq(ckpt_store_setattr(s, g, CKPT_SET_MTIME, &in, NULL), 0);
	ck_assert_int_eq(attr(s, g).mtime_ns, 5);
	/* sync_file indexes just that file */
	ck_assert_int_eq(ckpt_store_sync_file(s, g), 0);
	ck_assert(index_has_file(s, g));
	ck_assert_int_eq(attr(s, g).mtime_ns, 5);
	ck_assert_uint_eq(attr(s, g).size, 20000);
	ck_assert_uint_eq(refs_of(s, &da), 1);
	ck_assert_int_eq(ckpt_store_sync_file(s, g), 0); /* nothing pending: fine */

	/* a rename indexes every closed file first */
	ck_assert_int_eq(ckpt_store_commit_file(s, g, lb, 0, 1001, false), 0);
	ck_assert_uint_eq(refs_of(s, &da), 1);
	ck_assert_int_eq(ckpt_store_rename(s, CKPT_ROOT_INO, "f", CKPT_ROOT_INO, "f2", 0), 0);
	ck_assert_uint_eq(refs_of(s, &da), 0);
	ck_assert_uint_eq(refs_of(s, &db), 2);

	/* a durable commit is in the index on return */
	ck_assert_int_eq(ckpt_store_commit_file(s, g, la, 0, 1002, true), 0);
	ck_assert_uint_eq(refs_of(s, &da), 1);
	ck_assert_uint_eq(refs_of(s, &db), 1);

	/* the background flusher indexes within a few seconds */
	ck_assert_int_eq(ckpt_store_commit_file(s, f, la, 0, 1003, false), 0);
	for (int i = 0; i < 100 && refs_of(s, &da) != 2; i++)
		usleep(50000);
	ck_assert_uint_eq(refs_of(s, &da), 2);

	/* and close flushes whatever is left */
	ck_assert_int_eq(ckpt_store_commit_file(s, f, lb, 0, 1004, false), 0);
	ckpt_store_free(s);
	s = open_rw();
	ck_assert_uint_eq(attr(s, f).size, 30000);
	ck_assert_int_eq(attr(s, f).mtime_ns, 1004);
	ck_assert_uint_eq(refs_of(s, &db), 1);
	ck_assert_uint_eq(refs_of(s, &da), 1);
	ck_assert_int_eq(ckpt_store_load_extents(s, f, &got), 0);
	ck_assert_uint_eq(got->n, 1);
	ck_assert_mem_eq(got->v[0].digest.bytes, db.bytes, 16);
	ckpt_extent_list_free(got);
	{
		struct problems p;
		ck_assert_int_eq(fsck(s, &p), 0);
	}
	ckpt_extent_list_free(la);
	ckpt_extent_list_free(lb);
	free(a);
	free(b);
	ckpt_store_free(s);
}
END_TEST

/* getattr and load_extents racing with the flusher and with durable
 * commits never show content older than the last commit that returned:
 * one thread commits growing sizes (non-durable, every 5th durable, and
 * indexes the overlay every 3rd), two threads read the size and the
 * extents and compare them with the last size committed before the read.
 * Reading the index before the overlay failed this (a flush between the
 * two reads gave the size before the close). */
struct race_arg {
	ckpt_store *s;
	uint64_t ino;
	atomic_uint_fast64_t done;  /* the largest size whose commit returned */
	atomic_bool stop;
	atomic_uint_fast64_t stale; /* reads that saw an older size */
	atomic_uint_fast64_t reads;
};

static void *race_reader(void *arg)
{
	struct race_arg *a = arg;

	while (!atomic_load(&a->stop)) {
		uint64_t want = atomic_load(&a->done);
		struct ckpt_inode in;
		struct ckpt_extent_list *l = NULL;

		ck_assert_int_eq(ckpt_store_getattr(a->s, a->ino, &in), 0);
		if (in.size < want)
			atomic_fetch_add(&a->stale, 1);
		ck_assert_int_eq(ckpt_store_load_extents(a->s, a->ino, &l), 0);
		if (l->size < want)
			atomic_fetch_add(&a->stale, 1);
		ckpt_extent_list_free(l);
		atomic_fetch_add(&a->reads, 1);
	}
	return NULL;
}

START_TEST(test_getattr_never_older_than_commit)
{
	ckpt_store *s = open_rw();
	struct race_arg a = { .s = s };
	pthread_t th[2];

	a.ino = mkfile(s, CKPT_ROOT_INO, "f");
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, race_reader, &a), 0);
	for (uint64_t i = 1; i <= 3000; i++) {
		struct ckpt_extent_list *l = ckpt_extent_list_new();

		ck_assert_ptr_nonnull(l);
		ck_assert_int_eq(ckpt_extent_list_append(l, (uint32_t)(i * 10), CKPT_EXT_ZERO,
							 NULL), 0);
		ck_assert_int_eq(ckpt_store_commit_file(s, a.ino, l, 0, (int64_t)i, i % 5 == 0),
				 0);
		atomic_store(&a.done, i * 10);
		if (i % 3 == 0)
			ck_assert_int_eq(ckpt_store_flush(s), 0);
		ckpt_extent_list_free(l);
	}
	atomic_store(&a.stop, true);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	ck_assert_uint_gt(atomic_load(&a.reads), 0);
	ck_assert_msg(atomic_load(&a.stale) == 0, "%" PRIu64 " of %" PRIu64 " reads were stale",
		      (uint64_t)atomic_load(&a.stale), (uint64_t)atomic_load(&a.reads));
	ckpt_store_free(s);
}
END_TEST

/* A durable commit that fails must leave the content published by the
 * previous (successful, non-durable) commit in place. */
START_TEST(test_failed_durable_commit_keeps_overlay)
{
	ckpt_store *s = open_rw();
	uint8_t *a = tl_random_buf(20000, 52);
	struct ckpt_extent_list *la, *bad = ckpt_extent_list_new();
	ckpt_digest da, bogus;
	uint64_t f;

	f = mkfile(s, CKPT_ROOT_INO, "f");
	la = one_chunk_list(s, a, 20000, &da);
	ck_assert_int_eq(ckpt_store_commit_file(s, f, la, 0, 100, false), 0);
	ck_assert_uint_eq(attr(s, f).size, 20000);
	memset(&bogus, 0x77, sizeof(bogus));
	ck_assert_int_eq(ckpt_extent_list_append(bad, 10, CKPT_EXT_CHUNK, &bogus), 0);
	ck_assert_int_eq(ckpt_store_commit_file(s, f, bad, 0, 200, true), -EIO);
	/* the content of the successful commit is still the file's content */
	ck_assert_uint_eq(attr(s, f).size, 20000);
	ck_assert_int_eq(ckpt_store_flush(s), 0);
	ck_assert_uint_eq(refs_of(s, &da), 1);
	ckpt_extent_list_free(la);
	ckpt_extent_list_free(bad);
	free(a);
	ckpt_store_free(s);
}
END_TEST

/* One file whose indexed extent list is damaged must not keep every other
 * closed file out of the index. */
START_TEST(test_flush_isolates_damaged_file)
{
	ckpt_store *s = open_rw();
	uint8_t *a = tl_random_buf(20000, 53), *b = tl_random_buf(20000, 54);
	struct ckpt_extent_list *la, *lb;
	ckpt_digest da, db;
	uint64_t f, g;
	uint8_t key[16];

	f = mkfile(s, CKPT_ROOT_INO, "damaged");
	g = mkfile(s, CKPT_ROOT_INO, "healthy");
	la = one_chunk_list(s, a, 20000, &da);
	lb = one_chunk_list(s, b, 20000, &db);
	ck_assert_int_eq(ckpt_store_commit_file(s, f, la, 0, 1, true), 0);
	/* damage f's extent list in the index */
	tl_engine_put(ckpt_store_engine(s), key, ckpt_key_ino(key, CKPT_KEY_FILE, f), "\x01garbage",
			8);
	/* close both: g's new content must still reach the index */
	ck_assert_int_eq(ckpt_store_commit_file(s, f, lb, 0, 2, false), 0);
	ck_assert_int_eq(ckpt_store_commit_file(s, g, lb, 0, 3, false), 0);
	ckpt_store_flush(s);
	ckpt_store_free(s);
	s = open_rw();
	ck_assert_uint_eq(attr(s, g).size, 20000);
	ck_assert(index_has_file(s, g));
	ckpt_extent_list_free(la);
	ckpt_extent_list_free(lb);
	free(a);
	free(b);
	ckpt_store_free(s);
}
END_TEST

START_TEST(test_refcounts_overwrite_reap)
{
	ckpt_store *s = open_rw();
	uint8_t *a = tl_random_buf(50000, 7), *b = tl_random_buf(50000, 8), *c = tl_random_buf(50000, 9);
	ckpt_digest d[3];
	uint64_t f;
	struct ckpt_store_stats st;
	struct problems p;

	f = mkfile(s, CKPT_ROOT_INO, "f");
	{
		uint8_t *bufs[] = { a, b };
		size_t lens[] = { 50000, 50000 };
		commit_chunks(s, f, bufs, lens, 2, d);
	}
	ck_assert_uint_eq(refs_of(s, &d[0]), 1);
	ck_assert_uint_eq(refs_of(s, &d[1]), 1);
	st = sstats(s);
	ck_assert_uint_eq(st.chunks, 2);
	ck_assert_uint_eq(st.dead_chunks, 0);
	/* overwrite with [b, c] */
	{
		uint8_t *bufs[] = { b, c };
		size_t lens[] = { 50000, 50000 };
		ckpt_digest d2[2];
		commit_chunks(s, f, bufs, lens, 2, d2);
		ck_assert_mem_eq(d2[0].bytes, d[1].bytes, 16);
		d[2] = d2[1];
	}
	ck_assert_uint_eq(refs_of(s, &d[0]), 0);
	ck_assert_uint_eq(refs_of(s, &d[1]), 1);
	ck_assert_uint_eq(refs_of(s, &d[2]), 1);
	st = sstats(s);
	ck_assert_uint_eq(st.chunks, 2);
	ck_assert_uint_eq(st.unique_bytes, 100000);
	ck_assert_uint_eq(st.dead_chunks, 1);
	ck_assert_uint_gt(st.dead_bytes, 0);
	/* a dead chunk stays readable until gc */
	{
		uint8_t out[16];
		ck_assert_int_eq(ckpt_store_read_chunk(s, &d[0], 100, out, 16), 0);
		ck_assert_mem_eq(out, a + 100, 16);
	}
	ck_assert_int_eq(fsck(s, &p), 0);

	/* unlink: orphan keeps its references until reaped */
	ck_assert_int_eq(ckpt_store_unlink(s, CKPT_ROOT_INO, "f", false), 0);
	ck_assert_uint_eq(refs_of(s, &d[1]), 1);
	ck_assert_uint_eq(sstats(s).files, 0);
	ck_assert_int_eq(ckpt_store_reap(s, f), 0);
	ck_assert_uint_eq(refs_of(s, &d[1]), 0);
	ck_assert_uint_eq(refs_of(s, &d[2]), 0);
	st = sstats(s);
	ck_assert_uint_eq(st.chunks, 0);
	ck_assert_uint_eq(st.unique_bytes, 0);
	ck_assert_uint_eq(st.dead_chunks, 3);
	ck_assert_int_eq(ckpt_store_reap(s, f), 0); /* already gone: no-op */
	ck_assert_int_eq(fsck(s, &p), 0);
	free(a);
	free(b);
	free(c);
	ckpt_store_free(s);
}
END_TEST

/* Orphans left at close are reaped (and release their chunks) at open. */
START_TEST(test_orphan_reaped_at_open)
{
	ckpt_store *s = open_rw();
	uint8_t *a = tl_random_buf(40000, 10);
	ckpt_digest d;
	uint64_t f;
	struct ckpt_inode in;

	f = mkfile(s, CKPT_ROOT_INO, "f");
	{
		uint8_t *bufs[] = { a };
		size_t lens[] = { 40000 };
		commit_chunks(s, f, bufs, lens, 1, &d);
	}
	ck_assert_int_eq(ckpt_store_unlink(s, CKPT_ROOT_INO, "f", false), 0);
	ck_assert_uint_eq(refs_of(s, &d), 1);
	/* an orphan's content stays readable (open file descriptors) */
	{
		size_t len;
		uint8_t *got = tl_read_file(s, f, &len);
		ck_assert_uint_eq(len, 40000);
		ck_assert_mem_eq(got, a, 40000);
		free(got);
	}
	ckpt_store_free(s);
	s = open_rw();
	ck_assert_int_eq(ckpt_store_getattr(s, f, &in), -ENOENT);
	ck_assert_uint_eq(refs_of(s, &d), 0);
	ck_assert_uint_eq(sstats(s).dead_chunks, 1);
	free(a);
	ckpt_store_free(s);
}
END_TEST

START_TEST(test_stats_counts)
{
	ckpt_store *s = open_rw();
	uint8_t *a = tl_random_buf(1000, 11);
	struct ckpt_store_stats st;
	struct ckpt_inode in;
	uint64_t d, f;

	st = sstats(s);
	ck_assert_uint_eq(st.files, 0);
	ck_assert_uint_eq(st.dirs, 1); /* root */
	ck_assert_uint_eq(st.pack_files, 0);
	ck_assert_uint_eq(st.pack_bytes, 0);
	d = mkdir_(s, CKPT_ROOT_INO, "d");
	f = mkfile(s, d, "f");
	mkfile(s, d, "empty");
	ck_assert_int_eq(ckpt_store_mknode(s, d, "l", S_IFLNK | 0777, 0, 0, "f", &in), 0);
	{
		uint8_t *bufs[] = { a, a };
		size_t lens[] = { 1000, 1000 };
		commit_chunks(s, f, bufs, lens, 2, NULL);
	}
	st = sstats(s);
	ck_assert_uint_eq(st.files, 2);
	ck_assert_uint_eq(st.dirs, 2);
	ck_assert_uint_eq(st.symlinks, 1);
	ck_assert_uint_eq(st.logical_bytes, 2000);
	ck_assert_uint_eq(st.unique_bytes, 1000);
	ck_assert_uint_eq(st.chunks, 1);
	ck_assert_uint_eq(st.pack_files, 1);
	free(a);
	ckpt_store_free(s);
}
END_TEST

/* ---- fsck / gc -------------------------------------------------------- */

START_TEST(test_fsck_clean_and_corrupt)
{
	ckpt_store *s = open_rw();
	uint8_t *a = tl_random_buf(60000, 12), *b = tl_random_buf(60000, 13), out[64];
	ckpt_digest d[2];
	uint64_t f;
	struct problems p;
	char pack[512];
	struct ckpt_chunk_loc loc;

	f = mkfile(s, CKPT_ROOT_INO, "f");
	{
		uint8_t *bufs[] = { a, b };
		size_t lens[] = { 60000, 60000 };
		commit_chunks(s, f, bufs, lens, 2, d);
	}
	mkdir_(s, CKPT_ROOT_INO, "d");
	ck_assert_int_eq(fsck(s, &p), 0);
	ck_assert_int_eq(p.n, 0);
	ck_assert_int_eq(ckpt_store_chunk_loc(s, &d[0], &loc, NULL), 0);
	ck_assert_uint_eq(ckpt_pack_loc_offset(&loc), CKPT_PACK_HDR_SIZE); /* a is the first record */
	ckpt_store_free(s);

	/* flip one byte of a's stored data */
	first_pack(pack, sizeof(pack));
	flip_byte(pack, CKPT_PACK_HDR_SIZE + CKPT_PACK_REC_HDR_SIZE + 100);
	s = open_rw();
	ck_assert_int_gt(fsck(s, &p), 0);
	/* at least: the chunk itself and the file referencing it */
	ck_assert_int_ge(p.n, 2);
	ck_assert_int_eq(fsck(s, &p), p.n);
	ck_assert_int_eq(ckpt_store_read_chunk(s, &d[0], 0, out, 64), -EIO);
	{
		struct ckpt_extent_list *l = NULL;
		uint8_t *buf = malloc(120000);
		ck_assert_int_eq(ckpt_store_load_extents(s, f, &l), 0);
		ck_assert_int_eq(ckpt_store_read_extents(s, l, buf, 120000, 0), -EIO);
		/* the intact chunk still reads */
		ck_assert_int_eq(ckpt_store_read_extents(s, l, buf, 60000, 60000), 60000);
		ck_assert_mem_eq(buf, b, 60000);
		ckpt_extent_list_free(l);
		free(buf);
	}
	ck_assert_int_eq(ckpt_store_read_chunk(s, &d[1], 0, out, 64), 0);
	ck_assert_mem_eq(out, b, 64);
	free(a);
	free(b);
	ckpt_store_free(s);
}
END_TEST

/* Damaged record header and a damaged extent list are reported too. */
START_TEST(test_fsck_other_damage)
{
	ckpt_store *s = open_rw();
	uint8_t *a = tl_random_buf(30000, 14);
	uint64_t f;
	struct problems p;
	char pack[512];
	uint8_t key[16];

	f = mkfile(s, CKPT_ROOT_INO, "f");
	{
		uint8_t *bufs[] = { a };
		size_t lens[] = { 30000 };
		commit_chunks(s, f, bufs, lens, 1, NULL);
	}
	ck_assert_int_eq(fsck(s, &p), 0);
	/* an extent list that does not decode */
	tl_engine_put(ckpt_store_engine(s), key, ckpt_key_ino(key, CKPT_KEY_FILE, f), "\x01garbage",
			8);
	ck_assert_int_gt(fsck(s, &p), 0);
	ck_assert_msg(strstr(p.all, "/f: extent list is damaged") != NULL, "%s", p.all);
	ckpt_store_free(s);

	/* record header damage (codec byte of the first record) */
	first_pack(pack, sizeof(pack));
	flip_byte(pack, CKPT_PACK_HDR_SIZE + 4);
	s = open_rw();
	ck_assert_int_ge(fsck(s, &p), 2);
	free(a);
	ckpt_store_free(s);
}
END_TEST

static void write_gc_fixture(ckpt_store *s, uint64_t *ret_keep, uint8_t **ret_keep_data,
			     size_t *ret_keep_len)
{
	uint8_t *big = tl_random_buf(1u << 20, 20), *small = tl_random_buf(100000, 21);
	uint8_t *other = tl_random_buf(600000, 22);
	uint64_t f, g;

	f = mkfile(s, CKPT_ROOT_INO, "keep");
	g = mkfile(s, CKPT_ROOT_INO, "drop");
	{
		uint8_t *bufs[] = { big, small };
		size_t lens[] = { 1u << 20, 100000 };
		commit_chunks(s, f, bufs, lens, 2, NULL);
	}
	{
		uint8_t *bufs[] = { other };
		size_t lens[] = { 600000 };
		commit_chunks(s, g, bufs, lens, 1, NULL);
	}
	/* keep now holds only small: big is dead */
	{
		uint8_t *bufs[] = { small };
		size_t lens[] = { 100000 };
		commit_chunks(s, f, bufs, lens, 1, NULL);
	}
	/* drop goes away: other is dead */
	ck_assert_int_eq(ckpt_store_unlink(s, CKPT_ROOT_INO, "drop", false), 0);
	ck_assert_int_eq(ckpt_store_reap(s, g), 0);
	*ret_keep = f;
	*ret_keep_data = small;
	*ret_keep_len = 100000;
	free(big);
	free(other);
}

static void check_gc_result(ckpt_store *s, const struct ckpt_gc_stats *gs, uint64_t keep,
			    const uint8_t *data, size_t len)
{
	struct ckpt_store_stats st;
	struct problems p;
	uint8_t *got;
	size_t glen;

	ck_assert_uint_eq(gs->chunks_dropped, 2);
	ck_assert_uint_gt(gs->bytes_dropped, 1600000);
	ck_assert_uint_lt(gs->bytes_after, gs->bytes_before);
	ck_assert_uint_lt(gs->bytes_after, 200000);
	st = sstats(s);
	ck_assert_uint_eq(st.dead_chunks, 0);
	ck_assert_uint_eq(st.chunks, 1);
	ck_assert_uint_eq(st.pack_bytes, gs->bytes_after);
	got = tl_read_file(s, keep, &glen);
	ck_assert_uint_eq(glen, len);
	ck_assert_mem_eq(got, data, len);
	free(got);
	ck_assert_int_eq(fsck(s, &p), 0);
}

START_TEST(test_gc_after_reopen)
{
	ckpt_store *s = open_rw();
	struct ckpt_gc_stats gs;
	uint64_t keep;
	uint8_t *data;
	size_t len;

	write_gc_fixture(s, &keep, &data, &len);
	ckpt_store_free(s);
	s = open_rw(); /* like `ckpt gc`: a fresh process */
	ck_assert_int_eq(ckpt_store_gc(s, &gs), 0);
	ck_assert_uint_eq(gs.packs_rewritten, 1);
	ck_assert_uint_eq(gs.packs_deleted, 1);
	check_gc_result(s, &gs, keep, data, len);
	/* and still after a reopen */
	ckpt_store_free(s);
	s = open_rw();
	check_gc_result(s, &gs, keep, data, len);
	/* a second gc finds nothing to do */
	ck_assert_int_eq(ckpt_store_gc(s, &gs), 0);
	ck_assert_uint_eq(gs.chunks_dropped, 0);
	ck_assert_uint_eq(gs.bytes_after, gs.bytes_before);
	free(data);
	ckpt_store_free(s);
}
END_TEST

/* gc in the same session that wrote the data (the pack being appended to
 * is the one with the dead chunks). */
START_TEST(test_gc_same_session)
{
	ckpt_store *s = open_rw();
	struct ckpt_gc_stats gs;
	uint64_t keep;
	uint8_t *data;
	size_t len;

	write_gc_fixture(s, &keep, &data, &len);
	ck_assert_int_eq(ckpt_store_gc(s, &gs), 0);
	check_gc_result(s, &gs, keep, data, len);
	free(data);
	ckpt_store_free(s);
}
END_TEST

/* gc while the background thread compresses and compacts the same store:
 * the two move chunks one after the other, nothing is lost. */
START_TEST(test_gc_with_background)
{
	struct ckpt_store_opts o;
	struct ckpt_gc_stats gs;
	struct problems p;
	ckpt_store *s;
	uint64_t keep;
	uint8_t *data, *got;
	size_t len, glen;

	ckpt_store_opts_init(&o);
	o.create = true;
	o.bg = CKPT_BG_ALL;
	o.pack_max = 1u << 20;
	s = open_opts(&o);
	write_gc_fixture(s, &keep, &data, &len);
	ck_assert_int_eq(ckpt_store_gc(s, &gs), 0);
	ck_assert_uint_eq(gs.chunks_dropped, 2);
	ck_assert_int_eq(ckpt_store_settle(s, 20000), 0);
	ck_assert_int_eq(ckpt_store_gc(s, &gs), 0);
	got = tl_read_file(s, keep, &glen);
	ck_assert_uint_eq(glen, len);
	ck_assert_mem_eq(got, data, len);
	free(got);
	ck_assert_int_eq(fsck(s, &p), 0);
	ckpt_store_free(s);
	s = open_rw();
	got = tl_read_file(s, keep, &glen);
	ck_assert_mem_eq(got, data, len);
	free(got);
	ck_assert_int_eq(fsck(s, &p), 0);
	free(data);
	ckpt_store_free(s);
}
END_TEST

/* A mostly-dead pack holding a damaged live chunk is kept (the damaged
 * chunk is not lost further); its intact live chunks stay readable. */
START_TEST(test_gc_keeps_damaged_pack)
{
	ckpt_store *s = open_rw();
	uint8_t *dmg = tl_random_buf(50000, 60), *ok = tl_random_buf(50000, 61);
	uint8_t *dead = tl_random_buf(1u << 20, 62);
	uint64_t fd, fo, fx;
	ckpt_digest dd;
	struct ckpt_chunk_loc loc;
	struct ckpt_gc_stats gs;
	struct ckpt_store_stats st;
	struct problems p;
	char pack[512];

	fd = mkfile(s, CKPT_ROOT_INO, "damaged");
	fo = mkfile(s, CKPT_ROOT_INO, "ok");
	fx = mkfile(s, CKPT_ROOT_INO, "dead");
	{
		uint8_t *b1[] = { dmg }, *b2[] = { ok }, *b3[] = { dead };
		size_t l1[] = { 50000 }, l3[] = { 1u << 20 };
		commit_chunks(s, fd, b1, l1, 1, &dd);
		commit_chunks(s, fo, b2, l1, 1, NULL);
		commit_chunks(s, fx, b3, l3, 1, NULL);
	}
	ck_assert_int_eq(ckpt_store_chunk_loc(s, &dd, &loc, NULL), 0);
	ck_assert_uint_eq(ckpt_pack_loc_offset(&loc), CKPT_PACK_HDR_SIZE);
	ck_assert_int_eq(ckpt_store_unlink(s, CKPT_ROOT_INO, "dead", false), 0);
	ck_assert_int_eq(ckpt_store_reap(s, fx), 0);
	ckpt_store_free(s);
	first_pack(pack, sizeof(pack));
	flip_byte(pack, CKPT_PACK_HDR_SIZE + CKPT_PACK_REC_HDR_SIZE + 10);

	s = open_rw();
	ck_assert_int_eq(ckpt_store_gc(s, &gs), 0);
	ck_assert_uint_eq(gs.chunks_dropped, 1);
	ck_assert_uint_eq(gs.packs_deleted, 0);
	ck_assert_int_eq(access(pack, F_OK), 0);
	st = sstats(s);
	ck_assert_uint_eq(st.chunks, 2);
	ck_assert_uint_eq(st.dead_chunks, 0);
	{
		size_t len;
		uint8_t *got = tl_read_file(s, fo, &len);
		ck_assert_uint_eq(len, 50000);
		ck_assert_mem_eq(got, ok, 50000);
		free(got);
	}
	{
		struct ckpt_extent_list *l = NULL;
		uint8_t buf[64];
		ck_assert_int_eq(ckpt_store_load_extents(s, fd, &l), 0);
		ck_assert_int_eq(ckpt_store_read_extents(s, l, buf, sizeof(buf), 0), -EIO);
		ckpt_extent_list_free(l);
	}
	/* still reported by fsck: the chunk and the file naming it */
	ck_assert_int_eq(fsck(s, &p), 2);
	free(dmg);
	free(ok);
	free(dead);
	ckpt_store_free(s);
}
END_TEST

/* A pack that holds only dead chunks is deleted outright. */
START_TEST(test_gc_deletes_dead_pack)
{
	struct ckpt_store_opts o;
	ckpt_store *s;
	uint8_t *a = tl_random_buf(50000, 30), *b = tl_random_buf(50000, 31);
	uint64_t f;
	struct ckpt_gc_stats gs;
	struct ckpt_store_stats st;

	ckpt_store_opts_init(&o);
	o.create = true;
	o.pack_max = 4096; /* every chunk opens a new pack */
	s = open_opts(&o);
	f = mkfile(s, CKPT_ROOT_INO, "f");
	{
		uint8_t *bufs[] = { a, b };
		size_t lens[] = { 50000, 50000 };
		commit_chunks(s, f, bufs, lens, 2, NULL);
		ck_assert_uint_eq(sstats(s).pack_files, 2);
		commit_chunks(s, f, bufs + 1, lens, 1, NULL); /* a dead */
	}
	ckpt_store_free(s);
	s = open_opts(&o);
	ck_assert_int_eq(ckpt_store_gc(s, &gs), 0);
	ck_assert_uint_eq(gs.chunks_dropped, 1);
	ck_assert_uint_eq(gs.packs_deleted, 1);
	ck_assert_uint_eq(gs.packs_rewritten, 0);
	st = sstats(s);
	ck_assert_uint_eq(st.pack_files, 1);
	ck_assert_uint_eq(st.dead_chunks, 0);
	{
		size_t len;
		uint8_t *got = tl_read_file(s, f, &len);
		ck_assert_uint_eq(len, 50000);
		ck_assert_mem_eq(got, b, 50000);
		free(got);
	}
	free(a);
	free(b);
	ckpt_store_free(s);
}
END_TEST

/* Many packs referenced by one commit (the pending-sync table overflows). */
START_TEST(test_many_packs)
{
	struct ckpt_store_opts o;
	ckpt_store *s;
	enum { N = 20, LEN = 3000 };
	uint8_t *bufs[N];
	size_t lens[N];
	uint64_t f;
	struct problems p;

	ckpt_store_opts_init(&o);
	o.create = true;
	o.pack_max = 1;
	s = open_opts(&o);
	f = mkfile(s, CKPT_ROOT_INO, "f");
	for (int i = 0; i < N; i++) {
		bufs[i] = tl_random_buf(LEN, 100 + (uint64_t)i);
		lens[i] = LEN;
	}
	commit_chunks(s, f, bufs, lens, N, NULL);
	ck_assert_uint_eq(sstats(s).pack_files, N);
	ckpt_store_free(s);
	s = open_opts(&o);
	{
		size_t len;
		uint8_t *got = tl_read_file(s, f, &len);
		ck_assert_uint_eq(len, N * LEN);
		for (int i = 0; i < N; i++)
			ck_assert_mem_eq(got + i * LEN, bufs[i], LEN);
		free(got);
	}
	ck_assert_int_eq(fsck(s, &p), 0);
	for (int i = 0; i < N; i++)
		free(bufs[i]);
	ckpt_store_free(s);
}
END_TEST

START_TEST(test_verify_dedup)
{
	struct ckpt_store_opts o;
	ckpt_store *s;
	uint8_t *a = tl_random_buf(40000, 40);
	ckpt_digest d, d2;
	uint64_t f;
	char pack[512];

	ckpt_store_opts_init(&o);
	o.create = true;
	o.verify_dedup = true;
	s = open_opts(&o);
	f = mkfile(s, CKPT_ROOT_INO, "f");
	ck_assert_int_eq(ckpt_store_put_chunk(s, a, 40000, 0, &d), 0);
	/* an intact twin: accepted (pending and committed) */
	ck_assert_int_eq(ckpt_store_put_chunk(s, a, 40000, 0, &d2), 0);
	ck_assert_mem_eq(d.bytes, d2.bytes, 16);
	{
		uint8_t *bufs[] = { a };
		size_t lens[] = { 40000 };
		commit_chunks(s, f, bufs, lens, 1, NULL);
	}
	ck_assert_int_eq(ckpt_store_put_chunk(s, a, 40000, 0, &d2), 0);
	ckpt_store_free(s);

	/* damage the stored copy: a verifying dedup refuses to point at it */
	first_pack(pack, sizeof(pack));
	flip_byte(pack, CKPT_PACK_HDR_SIZE + CKPT_PACK_REC_HDR_SIZE + 7);
	s = open_opts(&o);
	ck_assert_int_eq(ckpt_store_put_chunk(s, a, 40000, 0, &d2), -EIO);
	ckpt_store_free(s);
	/* without verification the (damaged) copy is trusted */
	o.verify_dedup = false;
	s = open_opts(&o);
	ck_assert_int_eq(ckpt_store_put_chunk(s, a, 40000, 0, &d2), 0);
	ck_assert_mem_eq(d.bytes, d2.bytes, 16);
	free(a);
	ckpt_store_free(s);
}
END_TEST

START_TEST(test_path_of)
{
	ckpt_store *s = open_rw();
	uint64_t a = mkdir_(s, CKPT_ROOT_INO, "a"), b = mkdir_(s, a, "b");
	char *p;

	p = ckpt_store_path_of(s, b);
	ck_assert_str_eq(p, "/a/b");
	free(p);
	p = ckpt_store_path_of(s, CKPT_ROOT_INO);
	ck_assert_str_eq(p, "/");
	free(p);
	ckpt_store_free(s);
}
END_TEST

/* bf16-like bytes: compressible with a 2-byte shuffle */
static uint8_t *bf16_buf(size_t n, uint64_t seed)
{
	uint8_t *p = malloc(n);

	ck_assert_ptr_nonnull(p);
	tl_fill_random(p, n, seed);
	for (size_t i = 1; i < n; i += 2)
		p[i] = (uint8_t)(0x3c + (p[i] & 1)); /* narrow exponent byte */
	return p;
}

START_TEST(test_background_compression)
{
	struct ckpt_store_opts o;
	struct ckpt_bg_stats bg;
	struct ckpt_store_stats st;
	struct ckpt_chunk_loc loc;
	uint8_t *bufs[4];
	size_t lens[4];
	ckpt_digest d[4];
	ckpt_store *s;
	uint64_t ino;

	ckpt_store_opts_init(&o);
	o.create = true;
	o.bg = CKPT_BG_ALL;
	o.pack_max = 4u << 20; /* several packs: compaction has sealed packs to work on */
	s = open_opts(&o);
	ino = mkfile(s, CKPT_ROOT_INO, "f");
	for (int i = 0; i < 4; i++) {
		lens[i] = (1u << 20) + (size_t)i;
		bufs[i] = bf16_buf(lens[i], 100 + (uint64_t)i);
	}
	commit_chunks(s, ino, bufs, lens, 4, d);
	/* written raw, flagged for the background */
	ck_assert_int_eq(ckpt_store_chunk_loc(s, &d[0], &loc, NULL), 0);
	ck_assert_int_eq(loc.codec, 0);
	ck_assert(loc.flags & CKPT_CHUNK_F_DEFERRED);
	ck_assert_int_eq(ckpt_store_settle(s, 20000), 0);
	ckpt_store_bg_stats(s, &bg);
	ck_assert_uint_eq(bg.compressed, 4);
	ck_assert_uint_eq(bg.queued, 0);
	for (int i = 0; i < 4; i++) {
		uint8_t *back = malloc(lens[i]);
		ck_assert_int_eq(ckpt_store_chunk_loc(s, &d[i], &loc, NULL), 0);
		ck_assert_int_ne(loc.codec, 0);
		ck_assert_uint_eq(loc.flags & CKPT_CHUNK_F_DEFERRED, 0);
		ck_assert_uint_lt(loc.stored_len, lens[i]);
		ck_assert_int_eq(ckpt_store_read_chunk(s, &d[i], 0, back, lens[i]), 0);
		ck_assert_mem_eq(back, bufs[i], lens[i]);
		free(back);
	}
	/* compaction removed the raw copies: packs hold about what is stored */
	st = sstats(s);
	ck_assert_uint_eq(st.deferred_chunks, 0);
	ck_assert_uint_lt(st.pack_bytes, st.stored_bytes + (1u << 20));
	{ struct problems pr; ck_assert_int_eq(fsck(s, &pr), 0); }
	ckpt_store_free(s);
	/* and all of it survives a reopen */
	s = open_rw();
	{
		size_t len;
		uint8_t *all = tl_read_file(s, ino, &len);
		size_t off = 0;
		for (int i = 0; i < 4; i++) {
			ck_assert_mem_eq(all + off, bufs[i], lens[i]);
			off += lens[i];
		}
		free(all);
	}
	{ struct problems pr; ck_assert_int_eq(fsck(s, &pr), 0); }
	ckpt_store_free(s);
	for (int i = 0; i < 4; i++)
		free(bufs[i]);
}
END_TEST

START_TEST(test_background_requeue_after_reopen)
{
	struct ckpt_store_opts o;
	struct ckpt_chunk_loc loc;
	uint8_t *buf = bf16_buf(1u << 20, 7);
	size_t len = 1u << 20;
	ckpt_digest d;
	ckpt_store *s;
	uint64_t ino;

	/* a store closed before its background work ran: the chunk stays raw
	 * and flagged, and the next background-enabled open compresses it */
	ckpt_store_opts_init(&o);
	o.create = true;
	o.bg = CKPT_BG_ALL;
	s = open_opts(&o);
	ino = mkfile(s, CKPT_ROOT_INO, "f");
	commit_chunks(s, ino, &buf, &len, 1, &d);
	ckpt_store_free(s); /* no settle */
	s = open_rw(); /* no background: nothing happens */
	ck_assert_int_eq(ckpt_store_chunk_loc(s, &d, &loc, NULL), 0);
	if (!(loc.flags & CKPT_CHUNK_F_DEFERRED)) {
		/* the background got to it before the close: still valid */
		ck_assert_int_ne(loc.codec, 0);
	}
	ckpt_store_free(s);
	s = open_opts(&o);
	ck_assert_int_eq(ckpt_store_settle(s, 20000), 0);
	ck_assert_int_eq(ckpt_store_chunk_loc(s, &d, &loc, NULL), 0);
	ck_assert_uint_eq(loc.flags & CKPT_CHUNK_F_DEFERRED, 0);
	ck_assert_int_ne(loc.codec, 0);
	{ struct problems pr; ck_assert_int_eq(fsck(s, &pr), 0); }
	ckpt_store_free(s);
	free(buf);
}
END_TEST

static Suite *store_suite(void)
{
	Suite *s = suite_create("store");
	TCase *open = tcase_create("open");
	TCase *ns = tcase_create("namespace");
	TCase *ch = tcase_create("chunks");
	TCase *mt = tcase_create("maintenance");
	TCase *all[] = { open, ns, ch, mt };

	for (size_t i = 0; i < CKPT_ARRAY_SIZE(all); i++) {
		tl_tcase_dirs(all[i], "check_store-");
		tcase_add_checked_fixture(all[i], setup, teardown);
		tcase_set_timeout(all[i], 60);
		suite_add_tcase(s, all[i]);
	}
	tcase_add_test(open, test_create_layout);
	tcase_add_test(open, test_create_in_empty_dir_and_reopen);
	tcase_add_test(open, test_open_refusals);
	tcase_add_test(open, test_hash_algo_record);
	tcase_add_test(open, test_open_busy_and_shared);

	tcase_add_test(ns, test_mknode_lookup);
	tcase_add_test(ns, test_special_files_reopen);
	tcase_add_test(ns, test_store_dir_private);
	tcase_add_test(ns, test_readdir_order);
	tcase_add_test(ns, test_unlink_rmdir);
	tcase_add_test(ns, test_dir_nlink);
	tcase_add_test(ns, test_dir_nlink_rename_same_parent);
	tcase_add_test(ns, test_dir_nlink_rename_replace_same_parent);
	tcase_add_test(ns, test_dir_nlink_rename_replace_other_parent);
	tcase_add_test(ns, test_rename);
	tcase_add_test(ns, test_link);
	tcase_add_test(ns, test_setattr);
	tcase_add_test(ns, test_path_of);

	tcase_add_test(ch, test_chunk_roundtrip);
	tcase_add_test(ch, test_read_unknown_chunk);
	tcase_add_loop_test(ch, test_prefetch_chunks, 0, 2);
	tcase_add_loop_test(ch, test_prefetch_pipelined, 0, 2);
	tcase_add_loop_test(ch, test_prefetch_span_reuse, 0, 2);
	tcase_add_loop_test(ch, test_prefetch_warm_reserve, 0, 2);
	tcase_add_loop_test(ch, test_load_ctx_reuse, 0, 2);
	tcase_add_test(ch, test_chunk_max_size);
	tcase_add_test(ch, test_dedup);
	tcase_add_test(ch, test_commit_load_read);
	tcase_add_test(ch, test_overlay);
	tcase_add_test(ch, test_failed_durable_commit_keeps_overlay);
	tcase_add_test(ch, test_getattr_never_older_than_commit);
	tcase_add_test(ch, test_flush_isolates_damaged_file);
	tcase_add_test(ch, test_refcounts_overwrite_reap);
	tcase_add_test(ch, test_orphan_reaped_at_open);
	tcase_add_test(ch, test_stats_counts);

	tcase_add_test(mt, test_fsck_clean_and_corrupt);
	tcase_add_test(mt, test_fsck_other_damage);
	tcase_add_test(mt, test_gc_after_reopen);
	tcase_add_test(mt, test_gc_same_session);
	tcase_add_test(mt, test_gc_with_background);
	tcase_add_test(mt, test_gc_deletes_dead_pack);
	tcase_add_test(mt, test_gc_keeps_damaged_pack);
	tcase_add_test(mt, test_many_packs);
	tcase_add_test(mt, test_verify_dedup);
	tcase_add_test(mt, test_background_compression);
	tcase_add_test(mt, test_background_requeue_after_reopen);
	return s;
}

int main(void)
{
	return tl_run(store_suite());
}
