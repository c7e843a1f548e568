/* SPDX-License-Identifier: MIT */
/*
 * check_pack.c - unit tests for core/pack.c.
 *
 * Test-only instrumentation: this file defines fdatasync(), fsync() and
 * pwritev() (pwritev64 with _FILE_OFFSET_BITS=64) itself.  Definitions in
 * the test executable take precedence over glibc's for the calls made from
 * pack.c, so the tests can count fdatasync calls, inject errors (ENOSPC
 * after a short write, EIO from fsync/fdatasync) and hold an append in
 * flight, without pack.h exposing anything for testing.  The wrappers pass
 * everything else through to the real functions.
 */
#include <check.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "chunk/pack.h"
#include "base/util.h"
#include "testlib.h"

/* ---- interposed libc functions ---------------------------------------- */

#if defined(_FILE_OFFSET_BITS) && _FILE_OFFSET_BITS == 64
#define PWRITEV_SYM pwritev64
#define PWRITEV_NAME "pwritev64"
#else
#define PWRITEV_SYM pwritev
#define PWRITEV_NAME "pwritev"
#endif

static atomic_int n_fdatasync;
static atomic_int inject_fdatasync_err;	/* errno to fail fdatasync with, or 0 */
static atomic_int inject_fsync_err;	/* errno to fail fsync with, or 0 */
/* >= 0: the next pwritev writes at most this many bytes (returning a short
 * count), and the one after fails with ENOSPC.  0: fail at once. */
static atomic_long inject_pwritev_limit = -1;
static atomic_int inject_pwritev_fail_next;
/* Appends of records with this codec block in pwritev until released. */
static atomic_int block_codec = -1;
static pthread_mutex_t blk_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t blk_cond = PTHREAD_COND_INITIALIZER;
static int blk_waiting, blk_release;

typedef ssize_t (*pwritev_fn)(int, const struct iovec *, int, off_t);
static pwritev_fn real_pwritev;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void resolve_real(void)
{
	real_pwritev = (pwritev_fn)dlsym(RTLD_NEXT, PWRITEV_NAME);
}

int fdatasync(int fd)
{
	int e;

	atomic_fetch_add(&n_fdatasync, 1);
	e = atomic_load(&inject_fdatasync_err);
	if (e) {
		errno = e;
		return -1;
	}
	return (int)syscall(SYS_fdatasync, fd);
}

int fsync(int fd)
{
	int e = atomic_load(&inject_fsync_err);

	if (e) {
		errno = e;
		return -1;
	}
	return (int)syscall(SYS_fsync, fd);
}

ssize_t PWRITEV_SYM(int fd, const struct iovec *iov, int cnt, off_t off)
{
	long limit;

	pthread_once(&real_once, resolve_real);
	if (!real_pwritev) {
		errno = ENOSYS;
		return -1;
	}
	if (cnt > 0 && iov[0].iov_len == CKPT_PACK_REC_HDR_SIZE &&
	    memcmp(iov[0].iov_base, CKPT_PACK_REC_MAGIC, 4) == 0 &&
	    ((const uint8_t *)iov[0].iov_base)[4] == atomic_load(&block_codec)) {
		pthread_mutex_lock(&blk_lock);
		blk_waiting++;
		pthread_cond_broadcast(&blk_cond);
		while (!blk_release)
			pthread_cond_wait(&blk_cond, &blk_lock);
		pthread_mutex_unlock(&blk_lock);
	}
	if (atomic_exchange(&inject_pwritev_fail_next, 0)) {
		errno = ENOSPC;
		return -1;
	}
	limit = atomic_exchange(&inject_pwritev_limit, -1);
	if (limit == 0) {
		errno = ENOSPC;
		return -1;
	}
	if (limit > 0) {
		struct iovec cut[8];
		size_t left = (size_t)limit, total = 0;
		int n = 0;

		for (int i = 0; i < cnt; i++)
			total += iov[i].iov_len;
		if (total <= left || cnt > 8)
			return real_pwritev(fd, iov, cnt, off);	/* nothing to cut */
		for (int i = 0; i < cnt && left > 0; i++) {
			cut[n] = iov[i];
			if (cut[n].iov_len > left)
				cut[n].iov_len = left;
			left -= cut[n].iov_len;
			n++;
		}
		atomic_store(&inject_pwritev_fail_next, 1);
		return real_pwritev(fd, cut, n, off);
	}
	return real_pwritev(fd, iov, cnt, off);
}

/* ---- fixture and helpers ------------------------------------------------ */

static const uint8_t UUID[16] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 };
static const uint8_t UUID2[16] = { 0xff, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 };

static char tdir[PATH_MAX]; /* per test, inside the test case's base directory */
static int tdirfd = -1;

static void setup(void)
{
	ckpt_log_set_level(CKPT_LOG_ERR);
	tl_test_dir(tdir, sizeof(tdir));
	tdirfd = open(tdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	ck_assert_int_ge(tdirfd, 0);
	atomic_store(&n_fdatasync, 0);
	atomic_store(&inject_fdatasync_err, 0);
	atomic_store(&inject_fsync_err, 0);
	atomic_store(&inject_pwritev_limit, -1);
	atomic_store(&inject_pwritev_fail_next, 0);
	atomic_store(&block_codec, -1);
}

static void teardown(void)
{
	if (tdirfd >= 0)
		close(tdirfd);
	tdirfd = -1;
	tl_dir_remove(tdir);
}

static uint64_t rng_next(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545F4914F6CDD1DULL;
}

/* Deterministic content for record `seed`: pseudo-random bytes in
 * 0x00..0x7f, different for every seed. */
static void fill(uint8_t *buf, size_t len, uint64_t seed)
{
	uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
	size_t i = 0;

	for (; i + 8 <= len; i += 8)
		ckpt_put_le64(buf + i, rng_next(&s) & 0x7f7f7f7f7f7f7f7fULL);
	for (; i < len; i++)
		buf[i] = (uint8_t)(rng_next(&s) & 0x7f);
}

static void mkrec(struct ckpt_pack_rec *r, uint32_t len, uint64_t seed)
{
	memset(r, 0, sizeof(*r));
	r->codec = (uint8_t)(seed % 200);
	r->stored_len = len;
	r->raw_len = len * 3 + (uint32_t)seed;
	for (int i = 0; i < 16; i++)
		r->digest[i] = (uint8_t)(seed >> (i % 8 * 8)) ^ (uint8_t)i;
}

static int append_seed(ckpt_pack *p, uint32_t len, uint64_t seed, uint64_t *ret_off)
{
	struct ckpt_pack_rec r;
	uint8_t *buf = malloc(len ? len : 1);
	int ret;

	ck_assert_ptr_nonnull(buf);
	fill(buf, len, seed);
	mkrec(&r, len, seed);
	ret = ckpt_pack_append(p, &r, buf, ret_off);
	free(buf);
	return ret;
}

static uint64_t app(ckpt_pack *p, uint32_t len, uint64_t seed)
{
	uint64_t off = 0;

	ck_assert_int_eq(append_seed(p, len, seed, &off), 0);
	return off;
}

/* got and data[0..len) are record `seed` of length len. */
static void assert_rec(const struct ckpt_pack_rec *got, const uint8_t *data, uint32_t len,
		       uint64_t seed)
{
	struct ckpt_pack_rec want;
	uint8_t *exp = malloc(len ? len : 1);

	ck_assert_ptr_nonnull(exp);
	mkrec(&want, len, seed);
	fill(exp, len, seed);
	ck_assert_uint_eq(got->codec, want.codec);
	ck_assert_uint_eq(got->stored_len, len);
	ck_assert_uint_eq(got->raw_len, want.raw_len);
	ck_assert_mem_eq(got->digest, want.digest, 16);
	if (len)
		ck_assert_mem_eq(data, exp, len);
	free(exp);
}

/* Read the record at off and check it is record `seed` of length len. */
static void chk(ckpt_pack *p, uint64_t off, uint32_t len, uint64_t seed)
{
	struct ckpt_pack_rec got;
	uint8_t *buf = malloc(len ? len : 1);

	ck_assert_ptr_nonnull(buf);
	memset(&got, 0xaa, sizeof(got));
	ck_assert_int_eq(ckpt_pack_read(p, off, len, &got, buf), 0);
	assert_rec(&got, buf, len, seed);
	free(buf);
}

static int read_len(ckpt_pack *p, uint64_t off, uint32_t len)
{
	uint8_t *buf = malloc(len ? len : 1);
	int r;

	ck_assert_ptr_nonnull(buf);
	r = ckpt_pack_read(p, off, len, NULL, buf);
	free(buf);
	return r;
}

static int pack_fd(uint64_t id, int flags)
{
	char name[CKPT_PACK_NAME_MAX];
	int fd;

	ck_assert_int_eq(ckpt_pack_name(id, name, sizeof(name)), 0);
	fd = openat(tdirfd, name, flags | O_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	return fd;
}

static uint64_t file_size(uint64_t id)
{
	struct stat st;
	int fd = pack_fd(id, O_RDONLY);

	ck_assert_int_eq(fstat(fd, &st), 0);
	close(fd);
	return (uint64_t)st.st_size;
}

static void raw_read(uint64_t id, uint64_t off, void *buf, size_t len)
{
	int fd = pack_fd(id, O_RDONLY);

	ck_assert_int_eq(ckpt_pread_full(fd, buf, len, off), 0);
	close(fd);
}

static void raw_write(uint64_t id, uint64_t off, const void *buf, size_t len)
{
	int fd = pack_fd(id, O_RDWR);

	ck_assert_int_eq(ckpt_pwrite_full(fd, buf, len, off), 0);
	close(fd);
}

static void flip(uint64_t id, uint64_t off, uint8_t mask)
{
	uint8_t b;

	raw_read(id, off, &b, 1);
	b ^= mask;
	raw_write(id, off, &b, 1);
}

static void truncate_pack(uint64_t id, uint64_t len)
{
	int fd = pack_fd(id, O_RDWR);

	ck_assert_int_eq(ftruncate(fd, (off_t)len), 0);
	close(fd);
}

static ckpt_pack *create_pack(uint64_t id)
{
	ckpt_pack *p = NULL;

	ck_assert_int_eq(ckpt_pack_create(tdirfd, id, UUID, &p), 0);
	ck_assert_ptr_nonnull(p);
	return p;
}

static ckpt_pack *open_pack(uint64_t id, bool writable)
{
	ckpt_pack *p = NULL;

	ck_assert_int_eq(ckpt_pack_open(tdirfd, id, UUID, writable, &p), 0);
	ck_assert_ptr_nonnull(p);
	return p;
}

static int try_open(uint64_t id, const uint8_t *uuid, bool writable)
{
	ckpt_pack *p = NULL;
	int r = ckpt_pack_open(tdirfd, id, uuid, writable, &p);

	if (r == 0)
		ck_assert_ptr_nonnull(p);
	else
		ck_assert_ptr_null(p);
	ckpt_pack_free(p);
	return r;
}

/* Collects what ckpt_pack_scan() reports. */
struct seen {
	size_t n;
	uint64_t off[4096];
	struct ckpt_pack_rec rec[4096];
	size_t stop_after;	/* return 42 after this many records; 0 = never */
};

static int seen_cb(void *ud, uint64_t off, const struct ckpt_pack_rec *rec)
{
	struct seen *s = ud;

	ck_assert_uint_lt(s->n, 4096);
	s->off[s->n] = off;
	s->rec[s->n] = *rec;
	s->n++;
	if (s->stop_after && s->n == s->stop_after)
		return 42;
	return 0;
}

static struct seen *scan_all(ckpt_pack *p)
{
	struct seen *s = calloc(1, sizeof(*s));

	ck_assert_ptr_nonnull(s);
	ck_assert_int_eq(ckpt_pack_scan(p, seen_cb, s), 0);
	return s;
}

static void assert_scan(ckpt_pack *p, const uint64_t *offs, size_t n)
{
	struct seen *s = scan_all(p);

	ck_assert_uint_eq(s->n, n);
	for (size_t i = 0; i < n; i++)
		ck_assert_uint_eq(s->off[i], offs[i]);
	free(s);
}

/* ---- tests -------------------------------------------------------------- */

START_TEST(test_name_span)
{
	char buf[CKPT_PACK_NAME_MAX];

	ck_assert_int_eq(ckpt_pack_name(0x1234, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "pack-0000000000001234.ckpk");
	ck_assert_int_eq(ckpt_pack_name(UINT64_MAX, buf, 27), 0);
	ck_assert_str_eq(buf, "pack-ffffffffffffffff.ckpk");
	ck_assert_int_eq(ckpt_pack_name(1, buf, 26), -ENAMETOOLONG);
	ck_assert_str_eq(buf, "");
	ck_assert_int_eq(ckpt_pack_name(1, buf, 0), -ENAMETOOLONG);
	ck_assert_int_eq(ckpt_pack_name(1, NULL, 10), -EINVAL);

	ck_assert_uint_eq(ckpt_pack_rec_span(0), 48);
	ck_assert_uint_eq(ckpt_pack_rec_span(1), 56);
	ck_assert_uint_eq(ckpt_pack_rec_span(8), 56);
	ck_assert_uint_eq(ckpt_pack_rec_span(9), 64);
	ck_assert_uint_eq(ckpt_pack_rec_span(CKPT_PACK_MAX_STORED), 48 + (64u << 20));
	ck_assert_uint_eq(ckpt_pack_rec_span(UINT32_MAX), 48 + (uint64_t)UINT32_MAX + 1);

	ck_assert_uint_eq(ckpt_pack_id(NULL), 0);
	ck_assert_uint_eq(ckpt_pack_size(NULL), 0);
	ckpt_pack_free(NULL);
}
END_TEST

START_TEST(test_create_layout)
{
	const uint64_t id = 0x0123456789abcdefULL;
	uint8_t hdr[64];
	ckpt_pack *p = NULL, *q = NULL;
	struct stat st;
	time_t t0 = time(NULL), t1;
	int fd, opath;

	ck_assert_int_eq(ckpt_pack_create(tdirfd, id, NULL, &p), -EINVAL);
	ck_assert_int_eq(ckpt_pack_create(tdirfd, id, UUID, NULL), -EINVAL);
	ck_assert_int_eq(ckpt_pack_create(-1, id, UUID, &p), -EBADF);

	p = create_pack(id);
	t1 = time(NULL);
	ck_assert_uint_eq(ckpt_pack_id(p), id);
	ck_assert_uint_eq(ckpt_pack_size(p), 64);
	ck_assert_uint_eq(file_size(id), 64);

	fd = pack_fd(id, O_RDONLY);
	ck_assert_int_eq(fstat(fd, &st), 0);
	close(fd);
	ck_assert_uint_eq(st.st_mode & 0077, 0);

	/* Exact byte layout of the header. */
	raw_read(id, 0, hdr, sizeof(hdr));
	ck_assert_mem_eq(hdr, "CKPTPACK", 8);
	ck_assert_uint_eq(ckpt_get_le32(hdr + 8), 1);
	ck_assert_uint_eq(ckpt_get_le32(hdr + 12), 64);
	ck_assert_uint_eq(ckpt_get_le64(hdr + 16), id);
	ck_assert_mem_eq(hdr + 24, UUID, 16);
	ck_assert_uint_ge(ckpt_get_le64(hdr + 40), (uint64_t)t0);
	ck_assert_uint_le(ckpt_get_le64(hdr + 40), (uint64_t)t1);
	ck_assert_uint_eq(ckpt_get_le64(hdr + 48), XXH3_64bits(hdr, 48));
	ck_assert_uint_eq(ckpt_get_le64(hdr + 56), 0);

	/* O_EXCL */
	q = NULL;
	ck_assert_int_eq(ckpt_pack_create(tdirfd, id, UUID, &q), -EEXIST);
	ck_assert_ptr_null(q);
	ckpt_pack_free(p);

	p = open_pack(id, false);
	ck_assert_uint_eq(ckpt_pack_size(p), 64);
	ck_assert_uint_eq(ckpt_pack_id(p), id);
	ckpt_pack_free(p);
	p = open_pack(id, true);
	ck_assert_uint_eq(ckpt_pack_size(p), 64);
	ckpt_pack_free(p);

	ck_assert_int_eq(try_open(id + 1, UUID, false), -ENOENT);
	ck_assert_int_eq(ckpt_pack_open(tdirfd, id, NULL, false, &p), -EINVAL);
	ck_assert_int_eq(ckpt_pack_open(tdirfd, id, UUID, false, NULL), -EINVAL);

	/* An O_PATH directory fd works for create (directory fsync reopens). */
	opath = open(tdir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	ck_assert_int_ge(opath, 0);
	ck_assert_int_eq(ckpt_pack_create(opath, 7, UUID, &p), 0);
	ckpt_pack_free(p);
	ck_assert_int_eq(ckpt_pack_open(opath, 7, UUID, true, &p), 0);
	ckpt_pack_free(p);
	close(opath);
}
END_TEST

START_TEST(test_create_fsync_fails)
{
	char name[CKPT_PACK_NAME_MAX];
	ckpt_pack *p = NULL;

	atomic_store(&inject_fsync_err, EIO);
	ck_assert_int_eq(ckpt_pack_create(tdirfd, 3, UUID, &p), -EIO);
	ck_assert_ptr_null(p);
	atomic_store(&inject_fsync_err, 0);
	/* The half-created file was removed, so a retry succeeds. */
	ck_assert_int_eq(ckpt_pack_name(3, name, sizeof(name)), 0);
	ck_assert_int_eq(faccessat(tdirfd, name, F_OK, 0), -1);
	ck_assert_int_eq(errno, ENOENT);
	p = create_pack(3);
	ckpt_pack_free(p);
}
END_TEST

START_TEST(test_append_layout)
{
	struct ckpt_pack_rec r = { .codec = 3, .stored_len = 5, .raw_len = 12345 };
	struct ckpt_pack_rec got;
	uint8_t disk[56], buf[8];
	ckpt_pack *p = create_pack(1);
	uint64_t off = 0;

	for (int i = 0; i < 16; i++)
		r.digest[i] = (uint8_t)(0xa0 + i);
	ck_assert_int_eq(ckpt_pack_append(p, &r, "hello", &off), 0);
	ck_assert_uint_eq(off, 64);
	ck_assert_uint_eq(ckpt_pack_size(p), 120);
	ck_assert_uint_eq(file_size(1), 120);

	raw_read(1, 64, disk, sizeof(disk));
	ck_assert_mem_eq(disk, "CKRC", 4);
	ck_assert_uint_eq(disk[4], 3);
	ck_assert_uint_eq(disk[5], 0);
	ck_assert_uint_eq(ckpt_get_le16(disk + 6), 48);
	ck_assert_uint_eq(ckpt_get_le32(disk + 8), 5);
	ck_assert_uint_eq(ckpt_get_le32(disk + 12), 12345);
	ck_assert_mem_eq(disk + 16, r.digest, 16);
	ck_assert_uint_eq(ckpt_get_le64(disk + 32), XXH3_64bits("hello", 5));
	ck_assert_uint_eq(ckpt_get_le64(disk + 40), XXH3_64bits(disk, 40));
	ck_assert_mem_eq(disk + 48, "hello\0\0\0", 8);

	memset(buf, 0, sizeof(buf));
	ck_assert_int_eq(ckpt_pack_read(p, 64, 5, &got, buf), 0);
	ck_assert_mem_eq(buf, "hello", 5);
	ck_assert_uint_eq(got.codec, 3);
	ck_assert_uint_eq(got.stored_len, 5);
	ck_assert_uint_eq(got.raw_len, 12345);
	ck_assert_mem_eq(got.digest, r.digest, 16);

	/* Zero-length record, NULL data, NULL ret_offset / ret_rec. */
	r.stored_len = 0;
	r.raw_len = 0;
	ck_assert_int_eq(ckpt_pack_append(p, &r, NULL, NULL), 0);
	ck_assert_uint_eq(ckpt_pack_size(p), 168);
	ck_assert_uint_eq(file_size(1), 168);
	ck_assert_int_eq(ckpt_pack_read(p, 120, 0, NULL, NULL), 0);
	ck_assert_int_eq(ckpt_pack_read(p, 64, 5, NULL, buf), 0);

	/* Argument errors leave the pack untouched. */
	r.stored_len = 1;
	ck_assert_int_eq(ckpt_pack_append(p, &r, NULL, &off), -EINVAL);
	r.stored_len = CKPT_PACK_MAX_STORED + 1;
	ck_assert_int_eq(ckpt_pack_append(p, &r, buf, &off), -EINVAL);
	ck_assert_int_eq(ckpt_pack_append(p, NULL, buf, &off), -EINVAL);
	ck_assert_int_eq(ckpt_pack_append(NULL, &r, buf, &off), -EINVAL);
	ck_assert_uint_eq(ckpt_pack_size(p), 168);
	ck_assert_uint_eq(file_size(1), 168);
	ckpt_pack_free(p);
}
END_TEST

/* A record appended from pieces is byte for byte the record of their
 * concatenation. */
START_TEST(test_appendv)
{
	struct ckpt_pack_rec r = { .codec = 0, .stored_len = 11, .raw_len = 11 };
	struct iovec iov[4] = { { "he", 2 }, { "", 0 }, { "llo ", 4 }, { "world", 5 } };
	uint8_t a[64], b[64], buf[16];
	ckpt_pack *p = create_pack(1);
	uint64_t off1 = 0, off2 = 0;

	memset(r.digest, 0x5a, 16);
	ck_assert_int_eq(ckpt_pack_append(p, &r, "hello world", &off1), 0);
	ck_assert_int_eq(ckpt_pack_appendv(p, &r, iov, 4, &off2), 0);
	ck_assert_uint_eq(off2, off1 + ckpt_pack_rec_span(11));
	raw_read(1, off1, a, sizeof(a));
	raw_read(1, off2, b, sizeof(b));
	ck_assert_mem_eq(a, b, sizeof(a));
	ck_assert_int_eq(ckpt_pack_read(p, off2, 11, NULL, buf), 0);
	ck_assert_mem_eq(buf, "hello world", 11);

	/* lengths that do not add up, bad counts, a NULL piece */
	r.stored_len = 12;
	ck_assert_int_eq(ckpt_pack_appendv(p, &r, iov, 4, NULL), -EINVAL);
	r.stored_len = 11;
	ck_assert_int_eq(ckpt_pack_appendv(p, &r, iov, 0, NULL), -EINVAL);
	ck_assert_int_eq(ckpt_pack_appendv(p, &r, iov, CKPT_PACK_MAX_IOV + 1, NULL), -EINVAL);
	iov[2].iov_base = NULL;
	ck_assert_int_eq(ckpt_pack_appendv(p, &r, iov, 4, NULL), -EINVAL);
	ck_assert_uint_eq(ckpt_pack_size(p), off2 + ckpt_pack_rec_span(11));
	ckpt_pack_free(p);
}
END_TEST

START_TEST(test_sizes)
{
	static const uint32_t sizes[] = {
		0, 1, 7, 8, 9, 47, 48, 49, 4095, 4096, 65539, CKPT_PACK_MAX_STORED, 3,
	};
	uint64_t offs[CKPT_ARRAY_SIZE(sizes)], expect = 64;
	ckpt_pack *p = create_pack(2);

	for (size_t i = 0; i < CKPT_ARRAY_SIZE(sizes); i++) {
		offs[i] = app(p, sizes[i], i + 100);
		ck_assert_uint_eq(offs[i], expect);
		expect += ckpt_pack_rec_span(sizes[i]);
		ck_assert_uint_eq(ckpt_pack_size(p), expect);
	}
	ck_assert_uint_eq(file_size(2), expect);
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(sizes); i++)
		chk(p, offs[i], sizes[i], i + 100);
	ckpt_pack_free(p);

	p = open_pack(2, false);
	ck_assert_uint_eq(ckpt_pack_size(p), expect);
	for (size_t i = 0; i < CKPT_ARRAY_SIZE(sizes); i++)
		chk(p, offs[i], sizes[i], i + 100);
	assert_scan(p, offs, CKPT_ARRAY_SIZE(sizes));
	ck_assert_int_eq(read_len(p, 64, CKPT_PACK_MAX_STORED + 1), -EINVAL);
	ckpt_pack_free(p);
}
END_TEST

#define NTHREADS 8
#define PER_THREAD 150

struct worker {
	ckpt_pack *p;
	int idx;
	uint64_t off[PER_THREAD];
	uint32_t len[PER_THREAD];
	int err;
};

static uint64_t wseed(int t, int i)
{
	return (uint64_t)t * 1000 + (uint64_t)i + 1;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	uint64_t s = (uint64_t)w->idx + 77;

	for (int i = 0; i < PER_THREAD && !w->err; i++) {
		uint32_t len = (uint32_t)(rng_next(&s) % 16384);
		uint64_t seed = wseed(w->idx, i);
		uint8_t *buf = malloc(len + 1), *back = malloc(len + 1);
		struct ckpt_pack_rec r, got;

		if (!buf || !back) {
			w->err = -ENOMEM;
		} else {
			fill(buf, len, seed);
			mkrec(&r, len, seed);
			w->len[i] = len;
			w->err = ckpt_pack_append(w->p, &r, buf, &w->off[i]);
			/* Read back at once, while other threads append. */
			if (!w->err)
				w->err = ckpt_pack_read(w->p, w->off[i], len, &got, back);
			if (!w->err && (memcmp(buf, back, len) != 0 || got.raw_len != r.raw_len))
				w->err = -EILSEQ;
			if (!w->err && i % 16 == 15)
				w->err = ckpt_pack_sync(w->p,
							w->off[i] + ckpt_pack_rec_span(len));
		}
		free(buf);
		free(back);
	}
	return NULL;
}

struct offrec {
	uint64_t off;
	uint32_t len;
	uint64_t seed;
};

static int cmp_offrec(const void *a, const void *b)
{
	const struct offrec *x = a, *y = b;

	return x->off < y->off ? -1 : x->off > y->off;
}

START_TEST(test_concurrent)
{
	struct worker *w = calloc(NTHREADS, sizeof(*w));
	struct offrec *all = calloc(NTHREADS * PER_THREAD, sizeof(*all));
	pthread_t th[NTHREADS];
	ckpt_pack *p = create_pack(9);
	uint64_t end = 64;
	struct seen *s;
	size_t n = 0;

	ck_assert_ptr_nonnull(w);
	ck_assert_ptr_nonnull(all);
	for (int t = 0; t < NTHREADS; t++) {
		w[t].p = p;
		w[t].idx = t;
		ck_assert_int_eq(pthread_create(&th[t], NULL, worker_main, &w[t]), 0);
	}
	for (int t = 0; t < NTHREADS; t++) {
		ck_assert_int_eq(pthread_join(th[t], NULL), 0);
		ck_assert_int_eq(w[t].err, 0);
		for (int i = 0; i < PER_THREAD; i++)
			all[n++] = (struct offrec){ w[t].off[i], w[t].len[i], wseed(t, i) };
	}
	ck_assert_int_eq(ckpt_pack_sync(p, UINT64_MAX), 0);

	/* The reserved ranges tile the file exactly: no overlap, no gap. */
	qsort(all, n, sizeof(*all), cmp_offrec);
	for (size_t i = 0; i < n; i++) {
		ck_assert_uint_eq(all[i].off, end);
		end += ckpt_pack_rec_span(all[i].len);
	}
	ck_assert_uint_eq(ckpt_pack_size(p), end);
	ck_assert_uint_eq(file_size(9), end);
	ckpt_pack_free(p);

	p = open_pack(9, false);
	for (size_t i = 0; i < n; i++)
		chk(p, all[i].off, all[i].len, all[i].seed);
	s = scan_all(p);
	ck_assert_uint_eq(s->n, n);
	for (size_t i = 0; i < n; i++) {
		struct ckpt_pack_rec want;

		mkrec(&want, all[i].len, all[i].seed);
		ck_assert_uint_eq(s->off[i], all[i].off);
		ck_assert_uint_eq(s->rec[i].stored_len, want.stored_len);
		ck_assert_uint_eq(s->rec[i].raw_len, want.raw_len);
		ck_assert_uint_eq(s->rec[i].codec, want.codec);
		ck_assert_mem_eq(s->rec[i].digest, want.digest, 16);
	}
	free(s);
	ckpt_pack_free(p);
	free(all);
	free(w);
}
END_TEST

START_TEST(test_file_hdr_corrupt)
{
	uint8_t orig[64];
	ckpt_pack *p = create_pack(4);
	int fd;

	ckpt_pack_free(p);
	raw_read(4, 0, orig, sizeof(orig));
	for (int pos = 0; pos < 64; pos++) {
		/* Version byte 8: 1 -> 0 is corruption; bytes 9..11 make the
		 * version > 1, which reads as a newer format. */
		int want = pos >= 9 && pos <= 11 ? -EPROTONOSUPPORT : -EIO;

		flip(4, (uint64_t)pos, 0x01);
		ck_assert_msg(try_open(4, UUID, false) == want, "byte %d", pos);
		ck_assert_msg(try_open(4, UUID, true) == want, "byte %d", pos);
		raw_write(4, 0, orig, sizeof(orig));
	}
	ck_assert_int_eq(try_open(4, UUID, false), 0);

	/* Short files. */
	truncate_pack(4, 63);
	ck_assert_int_eq(try_open(4, UUID, false), -EIO);
	ck_assert_int_eq(try_open(4, UUID, true), -EIO);
	truncate_pack(4, 0);
	ck_assert_int_eq(try_open(4, UUID, true), -EIO);

	/* A directory with a pack's name. */
	ck_assert_int_eq(mkdirat(tdirfd, "pack-0000000000000005.ckpk", 0700), 0);
	ck_assert_int_eq(try_open(5, UUID, false), -EIO);

	/* Garbage file. */
	fd = openat(tdirfd, "pack-0000000000000006.ckpk", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ckpt_pwrite_full(fd, orig + 1, 63, 0), 0);
	ck_assert_int_eq(ckpt_pwrite_full(fd, orig + 1, 63, 63), 0);
	close(fd);
	ck_assert_int_eq(try_open(6, UUID, false), -EIO);
}
END_TEST

static void rewrite_hdr_field32(uint64_t id, int off, uint32_t v)
{
	uint8_t hdr[64];

	raw_read(id, 0, hdr, sizeof(hdr));
	ckpt_put_le32(hdr + off, v);
	ckpt_put_le64(hdr + 48, XXH3_64bits(hdr, 48));
	raw_write(id, 0, hdr, sizeof(hdr));
}

START_TEST(test_newer_version)
{
	uint8_t hdr[64];
	ckpt_pack *p = create_pack(4);

	app(p, 10, 1);
	ckpt_pack_free(p);

	/* Correctly checksummed version 2 header. */
	rewrite_hdr_field32(4, 8, 2);
	ck_assert_int_eq(try_open(4, UUID, false), -EPROTONOSUPPORT);
	ck_assert_int_eq(try_open(4, UUID, true), -EPROTONOSUPPORT);
	/* Newer version with a different layout (header size, checksum). */
	raw_read(4, 0, hdr, sizeof(hdr));
	ckpt_put_le32(hdr + 8, 0x10000);
	ckpt_put_le32(hdr + 12, 128);
	memset(hdr + 16, 0x5a, 48);
	raw_write(4, 0, hdr, sizeof(hdr));
	ck_assert_int_eq(try_open(4, UUID, false), -EPROTONOSUPPORT);

	/* Version 1 with a wrong header size, correctly checksummed. */
	p = create_pack(8);
	ckpt_pack_free(p);
	rewrite_hdr_field32(8, 12, 128);
	ck_assert_int_eq(try_open(8, UUID, false), -EIO);
	/* Version 0. */
	rewrite_hdr_field32(8, 12, 64);
	ck_assert_int_eq(try_open(8, UUID, false), 0);
	rewrite_hdr_field32(8, 8, 0);
	ck_assert_int_eq(try_open(8, UUID, false), -EIO);
}
END_TEST

START_TEST(test_id_uuid_mismatch)
{
	uint8_t hdr[64];
	ckpt_pack *p = create_pack(5);

	ckpt_pack_free(p);
	ck_assert_int_eq(try_open(5, UUID2, false), -EIO);
	ck_assert_int_eq(try_open(5, UUID2, true), -EIO);
	ck_assert_int_eq(try_open(5, UUID, false), 0);

	/* Pack 5's file under pack 6's name. */
	ck_assert_int_eq(renameat(tdirfd, "pack-0000000000000005.ckpk", tdirfd,
				  "pack-0000000000000006.ckpk"), 0);
	ck_assert_int_eq(try_open(6, UUID, false), -EIO);
	ck_assert_int_eq(try_open(6, UUID, true), -EIO);
	ck_assert_int_eq(try_open(5, UUID, false), -ENOENT);

	/* Reserved bytes are not covered by the checksum but must be zero. */
	raw_read(6, 0, hdr, sizeof(hdr));
	ckpt_put_le64(hdr + 16, 6);
	ckpt_put_le64(hdr + 48, XXH3_64bits(hdr, 48));
	raw_write(6, 0, hdr, sizeof(hdr));
	ck_assert_int_eq(try_open(6, UUID, false), 0);
	hdr[63] = 1;
	raw_write(6, 0, hdr, sizeof(hdr));
	ck_assert_int_eq(try_open(6, UUID, false), -EIO);
}
END_TEST

START_TEST(test_record_corrupt)
{
	ckpt_pack *p = create_pack(1);
	uint64_t o1 = app(p, 100, 1), o2 = app(p, 300, 2), o3 = app(p, 50, 3);
	uint64_t all[3] = { o1, o2, o3 }, skip2[2] = { o1, o3 };

	for (int pos = 0; pos < 48; pos++) {
		uint8_t mask = pos == 5 || pos == 6 ? 0x01 : 0x80;

		flip(1, o2 + (uint64_t)pos, mask);
		ck_assert_msg(read_len(p, o2, 300) == -EIO, "header byte %d", pos);
		/* The scan steps over the broken header and finds record 3. */
		assert_scan(p, skip2, 2);
		chk(p, o1, 100, 1);
		chk(p, o3, 50, 3);
		flip(1, o2 + (uint64_t)pos, mask);
	}
	chk(p, o2, 300, 2);

	/* Data bytes: first, middle, last. */
	for (int i = 0; i < 3; i++) {
		uint64_t pos = o2 + 48 + (i == 0 ? 0 : i == 1 ? 150 : 299);

		flip(1, pos, 0x10);
		ck_assert_int_eq(read_len(p, o2, 300), -EIO);
		assert_scan(p, all, 3);	/* scan does not read data */
		flip(1, pos, 0x10);
	}
	chk(p, o2, 300, 2);

	/* Correctly checksummed headers with invalid fields. */
	for (int c = 0; c < 3; c++) {
		uint8_t hdr[48], orig[48];

		raw_read(1, o2, orig, 48);
		memcpy(hdr, orig, 48);
		if (c == 0)
			hdr[5] = 1;				/* flags */
		else if (c == 1)
			ckpt_put_le16(hdr + 6, 56);		/* header size */
		else
			ckpt_put_le32(hdr + 8, CKPT_PACK_MAX_STORED + 1);	/* stored_len */
		ckpt_put_le64(hdr + 40, XXH3_64bits(hdr, 40));
		raw_write(1, o2, hdr, 48);
		ck_assert_msg(read_len(p, o2, 300) == -EIO, "case %d", c);
		assert_scan(p, skip2, 2);
		raw_write(1, o2, orig, 48);
	}
	chk(p, o2, 300, 2);

	/* Padding is not covered. */
	flip(1, o2 + 48 + 300 + 1, 0xff);
	chk(p, o2, 300, 2);
	assert_scan(p, all, 3);
	ckpt_pack_free(p);
}
END_TEST

START_TEST(test_read_args)
{
	ckpt_pack *p = create_pack(1);
	uint64_t o1 = app(p, 100, 1), o2 = app(p, 0, 2);
	uint8_t buf[128];

	ck_assert_int_eq(read_len(p, o1, 101), -EIO);
	ck_assert_int_eq(read_len(p, o1, 99), -EIO);
	ck_assert_int_eq(read_len(p, o1, 0), -EIO);
	ck_assert_int_eq(read_len(p, o2, 1), -EIO);	/* also runs past EOF */
	ck_assert_int_eq(read_len(p, o1 + 8, 10), -EIO);	/* inside data */
	ck_assert_int_eq(read_len(p, ckpt_pack_size(p), 0), -EIO);	/* at EOF */
	ck_assert_int_eq(read_len(p, 1 << 20, 0), -EIO);	/* past EOF */
	ck_assert_int_eq(read_len(p, o1 + 4, 100), -EINVAL);
	ck_assert_int_eq(read_len(p, 0, 100), -EINVAL);
	ck_assert_int_eq(read_len(p, 56, 100), -EINVAL);
	ck_assert_int_eq(read_len(p, UINT64_MAX - 7, 0), -EINVAL);
	ck_assert_int_eq(ckpt_pack_read(p, o1, 100, NULL, NULL), -EINVAL);
	ck_assert_int_eq(ckpt_pack_read(NULL, o1, 100, NULL, buf), -EINVAL);
	ck_assert_int_eq(ckpt_pack_scan(p, NULL, NULL), -EINVAL);
	ck_assert_int_eq(ckpt_pack_scan(NULL, seen_cb, NULL), -EINVAL);
	chk(p, o1, 100, 1);
	chk(p, o2, 0, 2);
	ckpt_pack_free(p);
}
END_TEST

START_TEST(test_scan_stop)
{
	ckpt_pack *p = create_pack(1);
	struct seen *s = calloc(1, sizeof(*s));

	ck_assert_ptr_nonnull(s);
	for (int i = 0; i < 5; i++)
		app(p, (uint32_t)i * 10, (uint64_t)i);
	s->stop_after = 2;
	ck_assert_int_eq(ckpt_pack_scan(p, seen_cb, s), 42);
	ck_assert_uint_eq(s->n, 2);
	free(s);
	ckpt_pack_free(p);

	/* Empty pack. */
	p = create_pack(2);
	assert_scan(p, NULL, 0);
	ckpt_pack_free(p);
}
END_TEST

/* Truncate record 3 at `cut` bytes past its offset and check recovery. */
static void torn_case(uint64_t id, uint64_t cut, bool hdr_intact)
{
	ckpt_pack *p = create_pack(id);
	uint64_t o1 = app(p, 100, 1), o2 = app(p, 0, 2), o3 = app(p, 5000, 3);
	uint64_t o4, o5, trunc = o3 + cut, size;
	uint8_t hdr[48];

	ck_assert_uint_eq(o3, 264);
	ckpt_pack_free(p);
	truncate_pack(id, trunc);

	/* Read-only: nothing is modified; the torn record is not reported. */
	p = open_pack(id, false);
	{
		uint64_t want[2] = { o1, o2 };

		assert_scan(p, want, 2);
	}
	ckpt_pack_free(p);
	raw_read(id, o3, hdr, hdr_intact ? 48 : 8);
	ck_assert_mem_eq(hdr, "CKRC", 4);

	atomic_store(&n_fdatasync, 0);
	p = open_pack(id, true);
	/* The stale header was invalidated (and synced) by the writable open. */
	ck_assert_int_eq(atomic_load(&n_fdatasync), hdr_intact ? 1 : 0);
	if (hdr_intact) {
		static const uint8_t zero[48];

		raw_read(id, o3, hdr, 48);
		ck_assert_mem_eq(hdr, zero, 48);
	}
	size = (trunc + 7) & ~(uint64_t)7;
	ck_assert_uint_eq(ckpt_pack_size(p), size);
	ck_assert_uint_eq(file_size(id), trunc);	/* garbage left in place */

	o4 = app(p, 10, 4);
	o5 = app(p, 20000, 5);	/* extends past the torn record's claimed end */
	ck_assert_uint_eq(o4, size);
	ck_assert_uint_eq(o5, size + ckpt_pack_rec_span(10));
	chk(p, o1, 100, 1);
	chk(p, o2, 0, 2);
	chk(p, o4, 10, 4);
	chk(p, o5, 20000, 5);
	ck_assert_int_eq(read_len(p, o3, 5000), -EIO);
	{
		uint64_t want[4] = { o1, o2, o4, o5 };

		assert_scan(p, want, 4);
		ckpt_pack_free(p);
		p = open_pack(id, true);	/* clean now: nothing to fix */
		assert_scan(p, want, 4);
		ck_assert_uint_eq(ckpt_pack_size(p), o5 + ckpt_pack_rec_span(20000));
		ckpt_pack_free(p);
	}
}

START_TEST(test_torn_tail)
{
	torn_case(1, 48 + 1000, true);	/* in the data, aligned */
	torn_case(2, 48 + 4999, true);	/* 1 byte short, unaligned */
	torn_case(3, 48, true);		/* header only */
	torn_case(4, 20, false);	/* inside the header, unaligned */
	torn_case(5, 8, false);		/* inside the header, aligned */
}
END_TEST

START_TEST(test_append_enospc)
{
	ckpt_pack *p = create_pack(1);
	uint64_t oa = app(p, 100, 1), ob, oc, off = 12345;
	uint64_t want[2];

	/* Header partly written, then ENOSPC. */
	ob = ckpt_pack_size(p);
	atomic_store(&inject_pwritev_limit, 30);
	ck_assert_int_eq(append_seed(p, 200, 2, &off), -ENOSPC);
	ck_assert_uint_eq(off, 12345);	/* untouched on failure */
	ck_assert_uint_eq(ckpt_pack_size(p), ob + ckpt_pack_rec_span(200));
	oc = app(p, 50, 3);
	ck_assert_uint_eq(oc, ob + ckpt_pack_rec_span(200));
	chk(p, oa, 100, 1);
	chk(p, oc, 50, 3);
	ck_assert_int_eq(read_len(p, ob, 200), -EIO);
	want[0] = oa;
	want[1] = oc;
	assert_scan(p, want, 2);
	ckpt_pack_free(p);

	/* Header complete and data partly written: the header is zeroed
	 * afterwards, so the scan does not report the failed record. */
	p = create_pack(2);
	oa = app(p, 100, 1);
	ob = ckpt_pack_size(p);
	atomic_store(&inject_pwritev_limit, 48 + 120);
	ck_assert_int_eq(append_seed(p, 200, 2, NULL), -ENOSPC);
	oc = app(p, 50, 3);
	ck_assert_int_eq(read_len(p, ob, 200), -EIO);
	want[0] = oa;
	want[1] = oc;
	assert_scan(p, want, 2);
	ckpt_pack_free(p);

	/* Failure with nothing written, at the tail, then reopen. */
	p = create_pack(3);
	oa = app(p, 100, 1);
	atomic_store(&inject_pwritev_limit, 0);
	ck_assert_int_eq(append_seed(p, 200, 2, NULL), -ENOSPC);
	ckpt_pack_free(p);
	p = open_pack(3, true);
	ck_assert_uint_eq(ckpt_pack_size(p), oa + ckpt_pack_rec_span(100));
	oc = app(p, 7, 3);
	chk(p, oa, 100, 1);
	chk(p, oc, 7, 3);
	ckpt_pack_free(p);
}
END_TEST

/* Holes of many sizes around the 64 KiB scan window, zeros or garbage. */
START_TEST(test_scan_holes)
{
	uint64_t id = 100;

	for (uint32_t len = 65536 - 48 - 64; len <= 65536 + 16; len += 8) {
		for (int garbage = 0; garbage < 2; garbage++) {
			ckpt_pack *p = create_pack(id);
			uint64_t want[2];

			want[0] = app(p, 24, 1);
			atomic_store(&inject_pwritev_limit, garbage ? (long)len / 2 : 0);
			ck_assert_int_eq(append_seed(p, len, 2, NULL), -ENOSPC);
			want[1] = app(p, 16, 3);
			assert_scan(p, want, 2);
			ckpt_pack_free(p);
			id++;
		}
	}
	/* A hole spanning several windows. */
	{
		ckpt_pack *p = create_pack(id);
		uint64_t want[2];

		want[0] = app(p, 24, 1);
		atomic_store(&inject_pwritev_limit, 150000);
		ck_assert_int_eq(append_seed(p, 200000, 2, NULL), -ENOSPC);
		want[1] = app(p, 16, 3);
		assert_scan(p, want, 2);
		ckpt_pack_free(p);
	}
}
END_TEST

/* ckpt_pack_read_direct: the same record as ckpt_pack_read (or -EOPNOTSUPP
 * where O_DIRECT is refused), on the pack being appended to (records not yet
 * synced included) and on a read-only one, at unaligned offsets and up to
 * the end of the file; check_data catches a damaged stored byte that a
 * trusting read lets through. */
static int direct_chk(ckpt_pack *p, uint64_t off, uint32_t len, uint64_t seed, bool check)
{
	struct ckpt_pack_rec got;
	const uint8_t *stored;
	size_t cap = ckpt_pack_direct_len(off, len);
	void *mem = NULL;
	int r;

	ck_assert_uint_eq(cap % CKPT_PACK_DIRECT_ALIGN, 0);
	ck_assert_uint_ge(cap, off % CKPT_PACK_DIRECT_ALIGN + CKPT_PACK_REC_HDR_SIZE + len);
	ck_assert_int_eq(posix_memalign(&mem, CKPT_PACK_DIRECT_ALIGN, cap), 0);
	/* one block short of the record is refused before any read */
	ck_assert_int_eq(ckpt_pack_read_direct(p, off, len, check, mem, cap - CKPT_PACK_DIRECT_ALIGN,
					       &got, &stored), -EINVAL);
	r = ckpt_pack_read_direct(p, off, len, check, mem, cap, &got, &stored);
	if (r == 0) {
		ck_assert(stored >= (const uint8_t *)mem + CKPT_PACK_REC_HDR_SIZE);
		ck_assert(stored + len <= (const uint8_t *)mem + cap);
		assert_rec(&got, stored, len, seed);
	}
	free(mem);
	return r;
}

/* Several records with one O_DIRECT read (read-ahead's span reads): every
 * record in the window checks out and holds its bytes; a misplaced record
 * pointer is a damaged record; bad arguments and a read past the end fail. */
START_TEST(test_read_window)
{
	ckpt_pack *p = create_pack(1);
	uint32_t lens[5] = { 5000, 0, 300000, 17, 90000 };
	uint64_t o[5], start = 0, end;
	struct ckpt_pack_rec got;
	const uint8_t *stored;
	size_t len = 0, cap = 1u << 20;
	uint8_t *buf = NULL;
	int r;

	for (int i = 0; i < 5; i++)
		o[i] = app(p, lens[i], (uint64_t)i + 1);
	ckpt_pack_free(p);
	p = open_pack(1, false);
	ck_assert_int_eq(posix_memalign((void **)&buf, CKPT_PACK_DIRECT_ALIGN, cap), 0);
	end = o[3] + CKPT_PACK_REC_HDR_SIZE + lens[3];
	r = ckpt_pack_read_window(p, o[1], end - o[1], buf, cap, &start, &len);
	if (r == -EOPNOTSUPP)
		goto out; /* file system without O_DIRECT */
	ck_assert_int_eq(r, 0);
	ck_assert_uint_le(start, o[1]);
	ck_assert_uint_eq(start % CKPT_PACK_DIRECT_ALIGN, 0);
	ck_assert_uint_ge(start + len, end);
	for (int i = 1; i <= 3; i++) {
		ck_assert_int_eq(ckpt_pack_rec_at(p, o[i], buf + (o[i] - start), lens[i], true, &got,
						  &stored),
				 0);
		assert_rec(&got, stored, lens[i], (uint64_t)i + 1);
	}
	/* the window reads on to fill the buffer: record 4 is there too */
	ck_assert_int_eq(ckpt_pack_rec_at(p, o[4], buf + (o[4] - start), lens[4], false, &got,
					  &stored),
			 0);
	assert_rec(&got, stored, lens[4], 5);
	/* a pointer that is not at a record, or a wrong length: damaged */
	ck_assert_int_eq(ckpt_pack_rec_at(p, o[2], buf + (o[2] - start) + 8, lens[2], false, &got,
					  &stored),
			 -EIO);
	ck_assert_int_eq(ckpt_pack_rec_at(p, o[2], buf + (o[2] - start), lens[2] + 8, false, &got,
					  &stored),
			 -EIO);
	/* bad arguments */
	ck_assert_int_eq(ckpt_pack_read_window(p, o[1], 100, buf + 8, cap - 4096, &start, &len),
			 -EINVAL);
	ck_assert_int_eq(ckpt_pack_read_window(p, o[1], 100, buf, cap - 100, &start, &len), -EINVAL);
	ck_assert_int_eq(ckpt_pack_read_window(p, o[1], cap, buf, cap, &start, &len), -EINVAL);
	/* the file ends before the bytes asked for */
	end = o[4] + CKPT_PACK_REC_HDR_SIZE + lens[4];
	ck_assert_int_eq(ckpt_pack_read_window(p, end - 100, 4096, buf, cap, &start, &len), -EIO);
out:
	free(buf);
	ckpt_pack_free(p);
}
END_TEST

START_TEST(test_read_direct)
{
	ckpt_pack *p = create_pack(1);
	uint64_t o[4];
	uint32_t lens[4] = { 100, 0, 70000, 13 };
	struct ckpt_pack_rec got;
	const uint8_t *stored;
	size_t cap = 128u << 10; /* every record here fits */
	uint8_t *mem = NULL;
	int r;

	ck_assert_int_eq(posix_memalign((void **)&mem, CKPT_PACK_DIRECT_ALIGN, cap), 0);

	for (int i = 0; i < 4; i++) {
		o[i] = app(p, lens[i], (uint64_t)i + 1);
		/* appended, not synced: still in the page cache, dirty */
		r = direct_chk(p, o[i], lens[i], (uint64_t)i + 1, true);
		if (r == -EOPNOTSUPP)
			break; /* file system without O_DIRECT */
		ck_assert_int_eq(r, 0);
	}
	ckpt_pack_free(p);
	p = open_pack(1, false);
	for (int i = 0; i < 4; i++) {
		r = direct_chk(p, o[i], lens[i], (uint64_t)i + 1, i % 2 == 0);
		if (r == -EOPNOTSUPP)
			break;
		ck_assert_int_eq(r, 0);
	}
	/* a wrong length is a damaged record; bad offsets are refused */
	ck_assert_int_ne(ckpt_pack_read_direct(p, o[0], lens[0] + 8, false, mem, cap, &got,
					       &stored), 0);
	ck_assert_int_eq(ckpt_pack_read_direct(p, o[0] + 4, lens[0], false, mem, cap, &got,
					       &stored), -EINVAL);
	ck_assert_int_eq(ckpt_pack_read_direct(p, o[0], lens[0], false, NULL, cap, &got, &stored),
			 -EINVAL);
	ckpt_pack_free(p);

	/* a flipped stored byte: only check_data notices it */
	flip(1, o[2] + CKPT_PACK_REC_HDR_SIZE + 1000, 0x01);
	p = open_pack(1, false);
	r = ckpt_pack_read_direct(p, o[2], lens[2], false, mem, cap, &got, &stored);
	if (r != -EOPNOTSUPP) {
		ck_assert_int_eq(r, 0);
		ck_assert_int_eq(ckpt_pack_read_direct(p, o[2], lens[2], true, mem, cap, &got,
						       &stored), -EIO);
	}
	ckpt_pack_free(p);
	free(mem);
}
END_TEST

START_TEST(test_readonly_append)
{
	ckpt_pack *p = create_pack(1);
	uint64_t o1 = app(p, 100, 1), o2 = app(p, 0, 2), size = ckpt_pack_size(p);
	uint64_t off = 99;

	ckpt_pack_free(p);
	p = open_pack(1, false);
	ck_assert_int_eq(append_seed(p, 10, 3, &off), -EBADF);
	ck_assert_uint_eq(off, 99);
	ck_assert_uint_eq(ckpt_pack_size(p), size);
	ck_assert_uint_eq(file_size(1), size);
	chk(p, o1, 100, 1);
	chk(p, o2, 0, 2);
	ckpt_pack_free(p);
}
END_TEST

START_TEST(test_sync)
{
	ckpt_pack *p = create_pack(1);
	uint64_t o1, o2, e1, e2;

	ck_assert_int_eq(ckpt_pack_sync(NULL, 0), -EINVAL);
	atomic_store(&n_fdatasync, 0);
	/* The header was fsynced by create. */
	ck_assert_int_eq(ckpt_pack_sync(p, 64), 0);
	ck_assert_int_eq(ckpt_pack_sync(p, UINT64_MAX), 0);
	ck_assert_int_eq(atomic_load(&n_fdatasync), 0);

	o1 = app(p, 1000, 1);
	e1 = o1 + ckpt_pack_rec_span(1000);
	ck_assert_int_eq(ckpt_pack_sync(p, e1), 0);
	ck_assert_int_eq(atomic_load(&n_fdatasync), 1);
	ck_assert_int_eq(ckpt_pack_sync(p, e1), 0);
	ck_assert_int_eq(ckpt_pack_sync(p, o1), 0);
	ck_assert_int_eq(ckpt_pack_sync(p, UINT64_MAX), 0);	/* clamped to size */
	ck_assert_int_eq(atomic_load(&n_fdatasync), 1);

	o2 = app(p, 10, 2);
	e2 = o2 + ckpt_pack_rec_span(10);
	ck_assert_int_eq(ckpt_pack_sync(p, e1), 0);
	ck_assert_int_eq(atomic_load(&n_fdatasync), 1);
	ck_assert_int_eq(ckpt_pack_sync(p, UINT64_MAX), 0);
	ck_assert_int_eq(atomic_load(&n_fdatasync), 2);
	ck_assert_int_eq(ckpt_pack_sync(p, e2), 0);
	ck_assert_int_eq(atomic_load(&n_fdatasync), 2);
	ckpt_pack_free(p);

	/* After open nothing is assumed durable. */
	p = open_pack(1, true);
	ck_assert_int_eq(ckpt_pack_sync(p, 64), 0);
	ck_assert_int_eq(atomic_load(&n_fdatasync), 3);
	ck_assert_int_eq(ckpt_pack_sync(p, UINT64_MAX), 0);
	ck_assert_int_eq(atomic_load(&n_fdatasync), 3);

	/* A failed fdatasync is latched. */
	app(p, 5, 3);
	atomic_store(&inject_fdatasync_err, EIO);
	ck_assert_int_eq(ckpt_pack_sync(p, UINT64_MAX), -EIO);
	ck_assert_int_eq(atomic_load(&n_fdatasync), 4);
	atomic_store(&inject_fdatasync_err, 0);
	ck_assert_int_eq(ckpt_pack_sync(p, UINT64_MAX), -EIO);
	ck_assert_int_eq(ckpt_pack_sync(p, 64), -EIO);
	ck_assert_int_eq(atomic_load(&n_fdatasync), 4);
	ck_assert_int_eq(append_seed(p, 5, 4, NULL), -EIO);
	chk(p, o1, 1000, 1);
	chk(p, o2, 10, 2);
	ckpt_pack_free(p);
}
END_TEST

struct blocked_append {
	ckpt_pack *p;
	uint64_t off;
	int err;
};

static void *blocked_main(void *arg)
{
	struct blocked_append *b = arg;
	struct ckpt_pack_rec r;
	uint8_t data[100];

	fill(data, sizeof(data), 50);
	mkrec(&r, sizeof(data), 50);
	r.codec = 0xee;
	b->err = ckpt_pack_append(b->p, &r, data, &b->off);
	return NULL;
}

/* A sync must not claim records that were still being written. */
START_TEST(test_sync_inflight)
{
	struct blocked_append b = { .p = create_pack(1) };
	uint64_t oc, ec, eb;
	pthread_t th;

	app(b.p, 10, 1);
	atomic_store(&block_codec, 0xee);
	ck_assert_int_eq(pthread_create(&th, NULL, blocked_main, &b), 0);
	pthread_mutex_lock(&blk_lock);
	while (blk_waiting == 0)
		pthread_cond_wait(&blk_cond, &blk_lock);
	pthread_mutex_unlock(&blk_lock);

	oc = app(b.p, 20, 3);	/* reserved after the blocked append */
	ec = oc + ckpt_pack_rec_span(20);
	atomic_store(&n_fdatasync, 0);
	ck_assert_int_eq(ckpt_pack_sync(b.p, ec), 0);
	ck_assert_int_eq(atomic_load(&n_fdatasync), 1);

	pthread_mutex_lock(&blk_lock);
	blk_release = 1;
	pthread_cond_broadcast(&blk_cond);
	pthread_mutex_unlock(&blk_lock);
	ck_assert_int_eq(pthread_join(th, NULL), 0);
	ck_assert_int_eq(b.err, 0);
	ck_assert_uint_lt(b.off, oc);
	eb = b.off + ckpt_pack_rec_span(100);

	/* The earlier sync ran while b was in flight: it must not count. */
	ck_assert_int_eq(ckpt_pack_sync(b.p, eb), 0);
	ck_assert_int_eq(atomic_load(&n_fdatasync), 2);
	ck_assert_int_eq(ckpt_pack_sync(b.p, ec), 0);
	ck_assert_int_eq(ckpt_pack_sync(b.p, UINT64_MAX), 0);
	ck_assert_int_eq(atomic_load(&n_fdatasync), 2);
	ckpt_pack_free(b.p);
}
END_TEST

/*
 * Page recycling (pack.c): after appends of many kicks' worth of records,
 * the pack's pages more than three kicks behind the end have left the page
 * cache (mincore on a mapping of the file), and every record still reads
 * back intact.  tmpfs keeps files only in the page cache, so there the
 * residency is not asserted.
 */
START_TEST(test_page_recycling)
{
	const uint32_t len = 1u << 20;
	const int n = (int)(6 * CKPT_PACK_KICK / len);
	ckpt_pack *p = create_pack(1);
	uint64_t *offs = calloc((size_t)n, sizeof(*offs));
	uint64_t size, low;
	unsigned char *vec;
	struct statfs sfs;
	long resident = 0;
	void *map;
	int fd;

	ck_assert_ptr_nonnull(offs);
	for (int i = 0; i < n; i++)
		offs[i] = app(p, len, (uint64_t)i + 1);
	size = ckpt_pack_size(p);
	/* Everything below the start of the range kicked two kicks before
	 * the last one has been dropped; leave slack for the kick points. */
	low = size - 4 * (uint64_t)CKPT_PACK_KICK - ckpt_pack_rec_span(len);
	fd = pack_fd(1, O_RDONLY);
	map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(map, MAP_FAILED);
	vec = malloc(size / 4096 + 1);
	ck_assert_ptr_nonnull(vec);
	ck_assert_int_eq(mincore(map, size, vec), 0);
	for (uint64_t pg = 0; pg < low / 4096; pg++)
		resident += vec[pg] & 1;
	ck_assert_int_eq(fstatfs(fd, &sfs), 0);
	if (sfs.f_type != TMPFS_MAGIC)
		ck_assert_int_eq(resident, 0);
	munmap(map, size);
	close(fd);
	free(vec);
	for (int i = 0; i < n; i++)
		chk(p, offs[i], len, (uint64_t)i + 1);
	ck_assert_int_eq(ckpt_pack_sync(p, UINT64_MAX), 0);
	ckpt_pack_free(p);
	free(offs);
}
END_TEST

#define SYNC_THREADS 4

static void *sync_main(void *arg)
{
	ckpt_pack *p = arg;
	intptr_t err = 0;

	for (int i = 0; i < 50 && !err; i++) {
		uint64_t off;

		err = append_seed(p, 512, (uint64_t)i, &off);
		if (!err)
			err = ckpt_pack_sync(p, off + ckpt_pack_rec_span(512));
	}
	return (void *)err;
}

/* Concurrent syncers share fdatasyncs and never fail. */
START_TEST(test_sync_concurrent)
{
	ckpt_pack *p = create_pack(1);
	pthread_t th[SYNC_THREADS];

	atomic_store(&n_fdatasync, 0);
	for (int t = 0; t < SYNC_THREADS; t++)
		ck_assert_int_eq(pthread_create(&th[t], NULL, sync_main, p), 0);
	for (int t = 0; t < SYNC_THREADS; t++) {
		void *ret;

		ck_assert_int_eq(pthread_join(th[t], &ret), 0);
		ck_assert_int_eq((intptr_t)ret, 0);
	}
	ck_assert_int_le(atomic_load(&n_fdatasync), SYNC_THREADS * 50);
	ck_assert_int_ge(atomic_load(&n_fdatasync), 1);
	ck_assert_int_eq(ckpt_pack_sync(p, UINT64_MAX), 0);
	ck_assert_uint_eq(ckpt_pack_size(p), 64 + SYNC_THREADS * 50 * ckpt_pack_rec_span(512));
	ckpt_pack_free(p);
}
END_TEST

static Suite *pack_suite(void)
{
	Suite *s = suite_create("pack");
	TCase *tc = tcase_create("core");

	tl_tcase_dirs(tc, "check_pack-");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_name_span);
	tcase_add_test(tc, test_create_layout);
	tcase_add_test(tc, test_create_fsync_fails);
	tcase_add_test(tc, test_append_layout);
	tcase_add_test(tc, test_appendv);
	tcase_add_test(tc, test_sizes);
	tcase_add_test(tc, test_concurrent);
	tcase_add_test(tc, test_file_hdr_corrupt);
	tcase_add_test(tc, test_newer_version);
	tcase_add_test(tc, test_id_uuid_mismatch);
	tcase_add_test(tc, test_record_corrupt);
	tcase_add_test(tc, test_read_args);
	tcase_add_test(tc, test_scan_stop);
	tcase_add_test(tc, test_torn_tail);
	tcase_add_test(tc, test_append_enospc);
	tcase_add_test(tc, test_scan_holes);
	tcase_add_test(tc, test_readonly_append);
	tcase_add_test(tc, test_read_direct);
	tcase_add_test(tc, test_read_window);
	tcase_add_test(tc, test_sync);
	tcase_add_test(tc, test_sync_inflight);
	tcase_add_test(tc, test_sync_concurrent);
	tcase_add_test(tc, test_page_recycling);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(pack_suite());
}
