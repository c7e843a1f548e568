/* SPDX-License-Identifier: MIT */
/*
 * check_util.c - unit tests for core/base/util.c: byte-order helpers,
 * clocks, the pread/pwrite loops, decimal formatting, the duplicate-name
 * check, one-line strings, error messages and the log, worker threads, and
 * huge/populated mappings.
 *
 * Test-only instrumentation: this suite is linked with --wrap for
 * pread64, pwrite64, malloc, pthread_create, mmap64 and madvise (see
 * Makefile.am; the 64 names because the tree builds with
 * _FILE_OFFSET_BITS=64), so every call util.c makes to them goes through
 * the __wrap_ functions below.  They pass through to the real ones unless a
 * test arms an injection: short transfers, EINTR, an errno, end of file,
 * failing allocations or thread creations, a kernel without
 * MADV_POPULATE_WRITE.  Each test runs in its own forked process (Check's
 * default), and the checked setup disarms everything.
 */
#include <check.h>
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
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/util.h"
#include "testlib.h"

/* ---- wrapped libc functions -------------------------------------------- */

ssize_t __real_pread64(int fd, void *buf, size_t len, off_t off);
ssize_t __real_pwrite64(int fd, const void *buf, size_t len, off_t off);
void *__real_malloc(size_t n);
int __real_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *),
			  void *arg);
void *__real_mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off);
int __real_madvise(void *addr, size_t len, int advice);

ssize_t __wrap_pread64(int fd, void *buf, size_t len, off_t off);
ssize_t __wrap_pwrite64(int fd, const void *buf, size_t len, off_t off);
void *__wrap_malloc(size_t n);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *),
			  void *arg);
void *__wrap_mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off);
int __wrap_madvise(void *addr, size_t len, int advice);

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* The I/O injection, shared by pread64 and pwrite64. */
static struct {
	bool on;
	size_t max;      /* transfer at most this many bytes per call (0: no limit) */
	int eintr_every; /* every k-th call fails with EINTR first (0: never) */
	int fail_at;     /* this call (1-based) fails with fail_errno ... */
	int fail_errno;  /* ... or returns 0 if fail_errno is 0 */
	int calls;       /* calls seen, EINTR ones included */
	int eintrs;      /* EINTRs returned */
	uint64_t last_off, next_off; /* offsets seen: each call must continue the last */
	bool off_ok;
} io;

static ssize_t io_inject(size_t *len, off_t off)
{
	if (!io.on)
		return 1;
	io.calls++;
	if (io.eintr_every && io.calls % io.eintr_every == 0) {
		io.eintrs++;
		errno = EINTR;
		return -1;
	}
	if (io.calls - io.eintrs > 1 && (uint64_t)off != io.next_off)
		io.off_ok = false;
	io.last_off = (uint64_t)off;
	if (io.fail_at && io.calls - io.eintrs == io.fail_at) {
		if (!io.fail_errno)
			return 0;
		errno = io.fail_errno;
		return -1;
	}
	if (io.max && *len > io.max)
		*len = io.max;
	return 1;
}

/* After a real transfer r at off: where the next one must start. */
static ssize_t io_done(ssize_t r, off_t off)
{
	if (r > 0)
		io.next_off = (uint64_t)off + (uint64_t)r;
	return r;
}

ssize_t __wrap_pread64(int fd, void *buf, size_t len, off_t off)
{
	ssize_t r = io_inject(&len, off);

	return r <= 0 ? r : io_done(__real_pread64(fd, buf, len, off), off);
}

ssize_t __wrap_pwrite64(int fd, const void *buf, size_t len, off_t off)
{
	ssize_t r = io_inject(&len, off);

	return r <= 0 ? r : io_done(__real_pwrite64(fd, buf, len, off), off);
}

static atomic_int malloc_fail; /* fail every malloc while set */

void *__wrap_malloc(size_t n)
{
	if (atomic_load(&malloc_fail)) {
		errno = ENOMEM;
		return NULL;
	}
	return __real_malloc(n);
}

static int create_fail_at;    /* this pthread_create (1-based) fails ... */
static int create_fail_errno; /* ... with this error */
static int create_calls;

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *),
			  void *arg)
{
	if (create_fail_at && ++create_calls >= create_fail_at)
		return create_fail_errno;
	return __real_pthread_create(t, attr, fn, arg);
}

static bool mmap_fail;

void *__wrap_mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	if (mmap_fail) {
		errno = ENOMEM;
		return MAP_FAILED;
	}
	return __real_mmap64(addr, len, prot, flags, fd, off);
}

static bool no_populate; /* a kernel before 5.14: MADV_POPULATE_WRITE is EINVAL */
static struct {
	void *addr;
	size_t len;
	int advice;
} madv[8];
static int nmadv;

int __wrap_madvise(void *addr, size_t len, int advice)
{
	if (nmadv < (int)CKPT_ARRAY_SIZE(madv)) {
		madv[nmadv].addr = addr;
		madv[nmadv].len = len;
		madv[nmadv].advice = advice;
	}
	nmadv++;
	if (no_populate && advice == MADV_POPULATE_WRITE) {
		errno = EINVAL;
		return -1;
	}
	return __real_madvise(addr, len, advice);
}

static char tdir[96]; /* per test, inside the test case's base directory */

static void setup(void)
{
	memset(&io, 0, sizeof(io));
	io.off_ok = true;
	atomic_store(&malloc_fail, 0);
	create_fail_at = create_fail_errno = create_calls = 0;
	mmap_fail = false;
	no_populate = false;
	nmadv = 0;
	tl_test_dir(tdir, sizeof(tdir));
}

static void teardown(void)
{
	tl_dir_remove(tdir);
}

/* ---- byte order ------------------------------------------------------- */

START_TEST(test_le_be_layout)
{
	uint8_t b[8];

	memset(b, 0xee, sizeof(b));
	ckpt_put_le16(b, 0x0102);
	ck_assert_mem_eq(b, "\x02\x01\xee", 3);
	ckpt_put_le32(b, 0x01020304u);
	ck_assert_mem_eq(b, "\x04\x03\x02\x01\xee", 5);
	ckpt_put_le64(b, 0x0102030405060708ull);
	ck_assert_mem_eq(b, "\x08\x07\x06\x05\x04\x03\x02\x01", 8);
	ck_assert_uint_eq(ckpt_get_le64(b), 0x0102030405060708ull);
	ck_assert_uint_eq(ckpt_get_le32(b), 0x05060708u);
	ck_assert_uint_eq(ckpt_get_le16(b), 0x0708);
	ckpt_put_be64(b, 0x0102030405060708ull);
	ck_assert_mem_eq(b, "\x01\x02\x03\x04\x05\x06\x07\x08", 8);
	ck_assert_uint_eq(ckpt_get_be64(b), 0x0102030405060708ull);

	/* high bits set in every byte: no sign extension anywhere */
	memset(b, 0xff, sizeof(b));
	ck_assert_uint_eq(ckpt_get_le16(b), 0xffff);
	ck_assert_uint_eq(ckpt_get_le32(b), 0xffffffffu);
	ck_assert_uint_eq(ckpt_get_le64(b), UINT64_MAX);
	ck_assert_uint_eq(ckpt_get_be64(b), UINT64_MAX);
	memcpy(b, "\x80\x00\x00\x00\x00\x00\x00\x81", 8);
	ck_assert_uint_eq(ckpt_get_le16(b), 0x0080);
	ck_assert_uint_eq(ckpt_get_le32(b), 0x00000080u);
	ck_assert_uint_eq(ckpt_get_le64(b), 0x8100000000000080ull);
	ck_assert_uint_eq(ckpt_get_be64(b), 0x8000000000000081ull);
}
END_TEST

START_TEST(test_le_be_roundtrip)
{
	uint64_t st = 42;
	uint8_t b[8];

	for (int i = 0; i < 10000; i++) {
		uint64_t v = tl_splitmix64(&st) >> (i % 64);

		ckpt_put_le16(b, (uint16_t)v);
		ck_assert_uint_eq(ckpt_get_le16(b), (uint16_t)v);
		ckpt_put_le32(b, (uint32_t)v);
		ck_assert_uint_eq(ckpt_get_le32(b), (uint32_t)v);
		ckpt_put_le64(b, v);
		ck_assert_uint_eq(ckpt_get_le64(b), v);
		ckpt_put_be64(b, v);
		ck_assert_uint_eq(ckpt_get_be64(b), v);
		/* big-endian keys sort as their values */
		if (i > 0) {
			uint8_t c[8];
			uint64_t w = tl_splitmix64(&st);

			ckpt_put_be64(c, w);
			ck_assert_int_eq(memcmp(b, c, 8) < 0, v < w);
		}
	}
}
END_TEST

/* ---- clocks ----------------------------------------------------------- */

static int64_t clock_ns(clockid_t id)
{
	struct timespec ts;

	ck_assert_int_eq(clock_gettime(id, &ts), 0);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

START_TEST(test_clocks)
{
	int64_t a, x, b, prev;
	struct timespec d = { 0, 2000000 };

	a = clock_ns(CLOCK_REALTIME);
	x = ckpt_now_ns();
	b = clock_ns(CLOCK_REALTIME);
	ck_assert_int_le(a, x);
	ck_assert_int_le(x, b);
	/* nanoseconds since the epoch, not some other unit */
	ck_assert_int_le(llabs(x / 1000000000 - (int64_t)time(NULL)), 1);

	a = clock_ns(CLOCK_MONOTONIC);
	x = ckpt_mono_ns();
	b = clock_ns(CLOCK_MONOTONIC);
	ck_assert_int_le(a, x);
	ck_assert_int_le(x, b);

	prev = ckpt_mono_ns();
	for (int i = 0; i < 100000; i++) {
		int64_t t = ckpt_mono_ns();

		ck_assert_int_ge(t, prev);
		prev = t;
	}
	x = ckpt_mono_ns();
	ck_assert_int_eq(nanosleep(&d, NULL), 0);
	ck_assert_int_ge(ckpt_mono_ns() - x, 2000000);
}
END_TEST

/* ---- pread/pwrite loops ----------------------------------------------- */

/* A file of n bytes of tl_fill_random(seed) in the test's directory, open
 * read-write; its content in *ret_data (malloc'd). */
static int data_file(size_t n, uint64_t seed, uint8_t **ret_data)
{
	char path[128];
	uint8_t *d = tl_random_buf(n, seed);
	int fd;

	snprintf(path, sizeof(path), "%s/data", tdir);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, d, n), (ssize_t)n);
	*ret_data = d;
	return fd;
}

START_TEST(test_pread_full_short)
{
	uint8_t *d, *buf = malloc(10000);
	int fd = data_file(10000, 1, &d);

	ck_assert_ptr_nonnull(buf);
	/* 7 bytes at a time, every third call interrupted */
	io.on = true;
	io.max = 7;
	io.eintr_every = 3;
	memset(buf, 0, 10000);
	ck_assert_int_eq(ckpt_pread_full(fd, buf, 9000, 1000), 0);
	ck_assert_mem_eq(buf, d + 1000, 9000);
	ck_assert_int_eq(io.calls - io.eintrs, (9000 + 6) / 7);
	ck_assert_int_gt(io.eintrs, 0);
	ck_assert(io.off_ok);
	ck_assert_uint_eq(io.last_off, 1000 + (9000 - 1) / 7 * 7);

	/* nothing to read: no call */
	io.calls = 0;
	ck_assert_int_eq(ckpt_pread_full(fd, buf, 0, 0), 0);
	ck_assert_int_eq(io.calls, 0);

	/* up to the end exactly, then one byte past it */
	io.on = false;
	ck_assert_int_eq(ckpt_pread_full(fd, buf, 10000, 0), 0);
	ck_assert_mem_eq(buf, d, 10000);
	ck_assert_int_eq(ckpt_pread_full(fd, buf, 101, 9900), -EIO);
	ck_assert_int_eq(ckpt_pread_full(fd, buf, 1, 10000), -EIO);
	close(fd);
	free(d);
	free(buf);
}
END_TEST

START_TEST(test_pread_full_errors)
{
	uint8_t *d, buf[100];
	int fd = data_file(100, 2, &d);

	/* an error on the third transfer is returned as -errno */
	io.on = true;
	io.max = 10;
	io.fail_at = 3;
	io.fail_errno = EIO;
	ck_assert_int_eq(ckpt_pread_full(fd, buf, 100, 0), -EIO);
	ck_assert_int_eq(io.calls, 3);
	memset(&io, 0, sizeof(io));
	io.on = true;
	io.fail_at = 1;
	io.fail_errno = ENOMEM;
	ck_assert_int_eq(ckpt_pread_full(fd, buf, 100, 0), -ENOMEM);
	/* a zero-byte read before len: end of file */
	memset(&io, 0, sizeof(io));
	io.on = true;
	io.max = 30;
	io.fail_at = 2;
	ck_assert_int_eq(ckpt_pread_full(fd, buf, 100, 0), -EIO);
	io.on = false;
	/* real errors */
	ck_assert_int_eq(ckpt_pread_full(-1, buf, 10, 0), -EBADF);
	ck_assert_int_eq(ckpt_pread_full(fd, NULL, 10, 0), -EFAULT);
	close(fd);
	free(d);
}
END_TEST

START_TEST(test_pwrite_full)
{
	uint8_t *d, *src = tl_random_buf(5000, 3), back[6000];
	int fd = data_file(6000, 4, &d);

	/* 11 bytes at a time, every other call interrupted */
	io.on = true;
	io.max = 11;
	io.eintr_every = 2;
	ck_assert_int_eq(ckpt_pwrite_full(fd, src, 5000, 500), 0);
	ck_assert_int_eq(io.calls - io.eintrs, (5000 + 10) / 11);
	ck_assert(io.off_ok);
	io.on = false;
	ck_assert_int_eq(pread(fd, back, 6000, 0), 6000);
	ck_assert_mem_eq(back, d, 500);
	ck_assert_mem_eq(back + 500, src, 5000);
	ck_assert_mem_eq(back + 5500, d + 5500, 500);
	/* past the end: the file grows */
	ck_assert_int_eq(ckpt_pwrite_full(fd, src, 100, 8000), 0);
	ck_assert_int_eq(lseek(fd, 0, SEEK_END), 8100);

	/* a write of 0 bytes before len: no space */
	memset(&io, 0, sizeof(io));
	io.on = true;
	io.max = 1000;
	io.fail_at = 3;
	ck_assert_int_eq(ckpt_pwrite_full(fd, src, 5000, 0), -ENOSPC);
	ck_assert_int_eq(io.calls, 3);
	memset(&io, 0, sizeof(io));
	io.on = true;
	io.fail_at = 2;
	io.max = 10;
	io.fail_errno = EDQUOT;
	ck_assert_int_eq(ckpt_pwrite_full(fd, src, 100, 0), -EDQUOT);
	io.on = false;
	ck_assert_int_eq(ckpt_pwrite_full(fd, src, 0, 0), 0);
	ck_assert_int_eq(ckpt_pwrite_full(-1, src, 10, 0), -EBADF);
	close(fd);
	fd = open(tdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ckpt_pwrite_full(fd, src, 10, 0), -EBADF);
	ck_assert_int_eq(ckpt_pread_full(fd, back, 10, 0), -EISDIR);
	close(fd);
	free(src);
	free(d);
}
END_TEST

/* ---- decimal ---------------------------------------------------------- */

static void check_dec(uint64_t v)
{
	char buf[CKPT_U64_DEC_MAX + 2], want[32];
	size_t n;

	memset(buf, '#', sizeof(buf));
	n = ckpt_u64_dec(v, buf + 1);
	snprintf(want, sizeof(want), "%" PRIu64, v);
	ck_assert_uint_eq(n, strlen(want));
	ck_assert_uint_ge(n, 1);
	ck_assert_uint_le(n, CKPT_U64_DEC_MAX);
	ck_assert_msg(memcmp(buf + 1 + CKPT_U64_DEC_MAX - n, want, n) == 0, "%" PRIu64 ": %.*s",
		      v, (int)n, buf + 1 + CKPT_U64_DEC_MAX - n);
	/* nothing written outside the 20 bytes */
	ck_assert_int_eq(buf[0], '#');
	ck_assert_int_eq(buf[CKPT_U64_DEC_MAX + 1], '#');
}

START_TEST(test_u64_dec)
{
	uint64_t p = 1, st = 7;

	check_dec(0);
	check_dec(UINT64_MAX);
	check_dec(UINT64_MAX - 1);
	for (int i = 0; i < 20; i++) {
		check_dec(p);
		check_dec(p - 1);
		check_dec(p + 1);
		if (i < 19)
			p *= 10;
	}
	for (int i = 0; i < 10000; i++)
		check_dec(tl_splitmix64(&st) >> (i % 64));
}
END_TEST

/* ---- unique strings --------------------------------------------------- */

START_TEST(test_unique_strs_small)
{
	const char *none[] = { NULL };
	const char *one[] = { "a" };
	const char *distinct[] = { "a", "b", "ab", "ba", "", "aa", "A" };
	const char *dup_first_last[] = { "x", "y", "z", "x" };
	const char *dup_adjacent[] = { "p", "q", "q", "r" };
	const char *dup_empty[] = { "", "e", "" };

	ck_assert_int_eq(ckpt_check_unique_strs(none, sizeof(char *), 0), 0);
	ck_assert_int_eq(ckpt_check_unique_strs(one, sizeof(char *), 1), 0);
	ck_assert_int_eq(ckpt_check_unique_strs(distinct, sizeof(char *), 7), 0);
	ck_assert_int_eq(ckpt_check_unique_strs(dup_first_last, sizeof(char *), 4), -EINVAL);
	ck_assert_int_eq(ckpt_check_unique_strs(dup_first_last, sizeof(char *), 3), 0);
	ck_assert_int_eq(ckpt_check_unique_strs(dup_adjacent, sizeof(char *), 4), -EINVAL);
	ck_assert_int_eq(ckpt_check_unique_strs(dup_adjacent, sizeof(char *), 2), 0);
	ck_assert_int_eq(ckpt_check_unique_strs(dup_empty, sizeof(char *), 3), -EINVAL);
}
END_TEST

struct named {
	uint64_t pad;
	const char *name;
	char more[24];
};

START_TEST(test_unique_strs_stride)
{
	enum { N = 20000 };
	struct named *v = calloc(N + 1, sizeof(*v));
	char (*names)[32] = calloc(N + 1, sizeof(*names));

	ck_assert_ptr_nonnull(v);
	ck_assert_ptr_nonnull(names);
	for (int i = 0; i < N; i++) {
		snprintf(names[i], sizeof(names[i]), "model.layers.%d.weight", i);
		v[i].name = names[i];
		v[i].pad = UINT64_MAX;
		memset(v[i].more, 'm', sizeof(v[i].more));
	}
	ck_assert_int_eq(ckpt_check_unique_strs(&v[0].name, sizeof(*v), N), 0);
	/* one duplicate anywhere is found */
	for (int k = 0; k < 5; k++) {
		int j = (k * 7919) % N;

		v[N].name = names[j];
		ck_assert_int_eq(ckpt_check_unique_strs(&v[0].name, sizeof(*v), N + 1), -EINVAL);
		/* an equal string at another address is a duplicate too */
		memcpy(names[N], names[j], sizeof(names[N]));
		v[N].name = names[N];
		ck_assert_int_eq(ckpt_check_unique_strs(&v[0].name, sizeof(*v), N + 1), -EINVAL);
	}
	snprintf(names[N], sizeof(names[N]), "model.layers.%d.weigh", 1);
	ck_assert_int_eq(ckpt_check_unique_strs(&v[0].name, sizeof(*v), N + 1), 0);
	free(v);
	free(names);
}
END_TEST

START_TEST(test_unique_strs_nomem)
{
	const char *s[] = { "a", "b", "c" };
	int r3, r1;

	/* (Check is linked statically and allocates in its assertions: none
	 * while allocations fail) */
	atomic_store(&malloc_fail, 1);
	r3 = ckpt_check_unique_strs(s, sizeof(char *), 3);
	r1 = ckpt_check_unique_strs(s, sizeof(char *), 1);
	atomic_store(&malloc_fail, 0);
	ck_assert_int_eq(r3, -ENOMEM);
	/* fewer than two strings need no memory */
	ck_assert_int_eq(r1, 0);
	ck_assert_int_eq(ckpt_check_unique_strs(s, sizeof(char *), 3), 0);
}
END_TEST

/* ---- one-line strings ------------------------------------------------- */

START_TEST(test_str_one_line)
{
	char s[256], empty[1] = "";
	char utf8[] = "caf\xc3\xa9 \xe2\x82\xac\tend\n";

	for (int i = 1; i < 256; i++)
		s[i - 1] = (char)i;
	s[255] = '\0';
	ckpt_str_one_line(s);
	for (int i = 1; i < 256; i++) {
		unsigned char want = (i < 0x20 || i == 0x7f) ? '?' : (unsigned char)i;

		ck_assert_msg((unsigned char)s[i - 1] == want, "byte 0x%02x became 0x%02x", i,
			      (unsigned char)s[i - 1]);
	}
	ck_assert_uint_eq(strlen(s), 255);
	ckpt_str_one_line(empty);
	ck_assert_str_eq(empty, "");
	ckpt_str_one_line(utf8);
	ck_assert_str_eq(utf8, "caf\xc3\xa9 \xe2\x82\xac?end?");
}
END_TEST

/* ---- error messages and the log ---------------------------------------- */

START_TEST(test_errf)
{
	char err[32], big[300];

	ckpt_errf(err, sizeof(err), "%s: %d", "file.safetensors", -22);
	ck_assert_str_eq(err, "file.safetensors: -22");
	/* names from files become one printable line */
	ckpt_errf(err, sizeof(err), "bad name '%s'", "a\nb\tc\x7f");
	ck_assert_str_eq(err, "bad name 'a?b?c?'");
	/* truncated to fit, still terminated */
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	ckpt_errf(err, sizeof(err), "%s", big);
	ck_assert_uint_eq(strlen(err), sizeof(err) - 1);
	ckpt_errf(err, 1, "%s", "anything");
	ck_assert_str_eq(err, "");
	/* nowhere to write: nothing written, no crash */
	err[0] = 'k';
	ckpt_errf(err, 0, "%s", "anything");
	ck_assert_int_eq(err[0], 'k');
	ckpt_errf(NULL, 10, "%s", "anything");
}
END_TEST

/* Run the log calls with stderr going to a file; what they wrote. */
static void log_capture(void (*fn)(void), char *out, size_t outlen)
{
	char path[128];
	int fd, saved = dup(2);
	ssize_t n;

	snprintf(path, sizeof(path), "%s/stderr", tdir);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_ge(saved, 0);
	fflush(stderr);
	ck_assert_int_eq(dup2(fd, 2), 2);
	fn();
	fflush(stderr);
	ck_assert_int_eq(dup2(saved, 2), 2);
	close(saved);
	n = pread(fd, out, outlen - 1, 0);
	ck_assert_int_ge(n, 0);
	out[n] = '\0';
	close(fd);
}

static void log_levels(void)
{
	ckpt_err("e%d", 1);
	ckpt_warn("w%d", 2);
	ckpt_info("i%d", 3); /* below the default level */
	ckpt_debug("d%d", 4);
	ckpt_log_set_level(CKPT_LOG_DEBUG);
	ckpt_info("i%d", 5);
	ckpt_debug("d%d", 6);
	ckpt_log_set_level(CKPT_LOG_ERR);
	ckpt_warn("w%d", 7);
	ckpt_err("e%d", 8);
}

static void log_long(void)
{
	static char msg[5000];

	memset(msg, 'y', sizeof(msg) - 1);
	ckpt_err("%s", msg);
}

START_TEST(test_log)
{
	static char out[8192];
	const char *nl;

	log_capture(log_levels, out, sizeof(out));
	ck_assert_str_eq(out, "ckptfs: error: e1\n"
			      "ckptfs: warning: w2\n"
			      "ckptfs: info: i5\n"
			      "ckptfs: debug: d6\n"
			      "ckptfs: error: e8\n");
	/* a long message is cut, still one line */
	log_capture(log_long, out, sizeof(out));
	nl = strchr(out, '\n');
	ck_assert_ptr_nonnull(nl);
	ck_assert_int_eq(nl[1], '\0');
	ck_assert_uint_gt(strlen(out), 1000);
	ck_assert_uint_lt(strlen(out), 5000);
	ck_assert_int_eq(strncmp(out, "ckptfs: error: yyy", 18), 0);
}
END_TEST

/* The stamped line: ISO 8601 UTC with milliseconds, pid/tid, level. */
START_TEST(test_log_format)
{
	struct tm tm = { .tm_year = 2026 - 1900, .tm_mon = 11, .tm_mday = 2,
			 .tm_hour = 6, .tm_min = 30, .tm_sec = 1 };
	int64_t ns = (int64_t)timegm(&tm) * 1000000000 + 123456789;
	char line[128], msg[300];
	size_t n;

	n = ckpt_log_format(line, sizeof(line), ns, 1234, 1240, CKPT_LOG_INFO, "mounted x");
	ck_assert_str_eq(line, "2026-12-02T06:30:01.123Z ckptfs[1234/1240] info: mounted x\n");
	ck_assert_uint_eq(n, strlen(line));
	n = ckpt_log_format(line, sizeof(line), ns + 876000000, 1, 2, CKPT_LOG_ERR, "e");
	ck_assert_str_eq(line, "2026-12-02T06:30:01.999Z ckptfs[1/2] error: e\n");
	n = ckpt_log_format(line, sizeof(line), ns, 1, 2, CKPT_LOG_WARN, "w");
	ck_assert_str_eq(line, "2026-12-02T06:30:01.123Z ckptfs[1/2] warning: w\n");
	n = ckpt_log_format(line, sizeof(line), ns, 1, 2, CKPT_LOG_DEBUG, "d");
	ck_assert_str_eq(line, "2026-12-02T06:30:01.123Z ckptfs[1/2] debug: d\n");
	/* cut to fit: still one line with its newline */
	memset(msg, 'z', sizeof(msg) - 1);
	msg[sizeof(msg) - 1] = '\0';
	n = ckpt_log_format(line, sizeof(line), ns, 1, 2, CKPT_LOG_INFO, msg);
	ck_assert_uint_eq(n, sizeof(line) - 1);
	ck_assert_int_eq(line[n - 1], '\n');
	ck_assert_ptr_eq(strchr(line, '\n'), line + n - 1);
	ck_assert_str_eq(ckpt_log_level_name(CKPT_LOG_WARN), "warning");
}
END_TEST

static char *slurp(const char *path)
{
	static char buf[8192];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	ck_assert_msg(fd >= 0, "open %s: %s", path, strerror(errno));
	n = read(fd, buf, sizeof(buf) - 1);
	ck_assert_int_ge(n, 0);
	buf[n] = '\0';
	close(fd);
	return buf;
}

static void *log_from_thread(void *arg)
{
	*(long *)arg = ckpt_gettid();
	ckpt_warn("from a thread");
	return NULL;
}

/* A line of the file sink, parsed: its pid, tid and time. */
static void parse_line(const char *line, const char *want_rest, long *ret_pid, long *ret_tid,
		       time_t *ret_t)
{
	struct tm tm;
	int ms, used = 0;
	char rest[256];

	memset(&tm, 0, sizeof(tm));
	ck_assert_msg(sscanf(line, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ ckptfs[%ld/%ld] %n", &tm.tm_year,
			     &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms,
			     ret_pid, ret_tid, &used) == 9 && used > 0,
		      "not a stamped line: %s", line);
	snprintf(rest, sizeof(rest), "%.*s", (int)strcspn(line + used, "\n"), line + used);
	ck_assert_str_eq(rest, want_rest);
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	*ret_t = timegm(&tm);
}

/* The file sink: stamped lines, the level, lines of other threads, and the
 * reopen after logrotate renamed the file; stderr captured into it. */
START_TEST(test_log_file)
{
	char path[PATH_MAX], old[PATH_MAX + 8], *text, *nl;
	long pid, tid, other = 0;
	time_t t;
	pthread_t th;

	snprintf(path, sizeof(path), "%s/daemon.log", tdir);
	snprintf(old, sizeof(old), "%s.1", path);
	ck_assert_int_eq(ckpt_log_to_file("/nonexistent-dir/x.log"), -ENOENT);
	ck_assert_int_eq(ckpt_log_to_file(path), 0);
	ckpt_log_set_level(CKPT_LOG_INFO);
	ck_assert_int_eq(ckpt_log_get_level(), CKPT_LOG_INFO);
	ckpt_info("first %d", 1);
	ckpt_debug("not written");
	ck_assert_int_eq(__real_pthread_create(&th, NULL, log_from_thread, &other), 0);
	pthread_join(th, NULL);
	text = slurp(path);
	parse_line(text, "info: first 1", &pid, &tid, &t);
	ck_assert_int_eq(pid, getpid());
	ck_assert_int_eq(tid, ckpt_gettid());
	ck_assert_int_le(llabs((long long)(t - time(NULL))), 5);
	nl = strchr(text, '\n');
	ck_assert_ptr_nonnull(nl);
	parse_line(nl + 1, "warning: from a thread", &pid, &tid, &t);
	ck_assert_int_eq(tid, other);
	ck_assert_int_ne(other, ckpt_gettid());
	ck_assert_ptr_null(strchr(strchr(nl + 1, '\n') + 1, '\n'));

	/* stderr captured: what a library prints there lands in the log */
	ck_assert_int_eq(ckpt_log_capture_stderr(), 0);
	ck_assert_int_gt(dprintf(2, "raw stderr line\n"), 0);
	ck_assert_ptr_nonnull(strstr(slurp(path), "raw stderr line\n"));

	/* logrotate: rename, then reopen; the next lines go to a new file */
	ck_assert_int_eq(rename(path, old), 0);
	ckpt_info("still to the renamed file");
	ck_assert_int_eq(ckpt_log_reopen(), 0);
	ck_assert_int_eq(access(path, F_OK), 0);
	ckpt_err("after reopen");
	ck_assert_int_gt(dprintf(2, "stderr after reopen\n"), 0);
	text = slurp(path);
	parse_line(text, "error: after reopen", &pid, &tid, &t);
	ck_assert_ptr_nonnull(strstr(text, "\nstderr after reopen\n"));
	text = slurp(old);
	ck_assert_ptr_nonnull(strstr(text, "] info: still to the renamed file\n"));
	ck_assert_ptr_null(strstr(text, "after reopen"));
	/* a reopen that cannot open the file keeps the one in use */
	ck_assert_int_eq(rename(path, old), 0);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	ck_assert_int_eq(ckpt_log_reopen(), -EISDIR);
	ckpt_err("kept");
	ck_assert_ptr_nonnull(strstr(slurp(old), "] error: kept\n"));
	ck_assert_int_eq(rmdir(path), 0);
}
END_TEST

START_TEST(test_log_reopen_other_sinks)
{
	/* not a file sink: nothing to reopen */
	ckpt_log_to_stderr(true);
	ck_assert_int_eq(ckpt_log_reopen(), 0);
	ck_assert_int_eq(ckpt_log_capture_stderr(), -EINVAL);
}
END_TEST

/* Stamped lines on stderr. */
static void log_stamped(void)
{
	ckpt_log_to_stderr(true);
	ckpt_warn("stamped %s", "line");
	ckpt_log_to_stderr(false);
	ckpt_warn("plain line");
}

START_TEST(test_log_stderr_stamped)
{
	static char out[1024];
	long pid, tid;
	time_t t;

	log_capture(log_stamped, out, sizeof(out));
	parse_line(out, "warning: stamped line", &pid, &tid, &t);
	ck_assert_ptr_nonnull(strstr(out, "\nckptfs: warning: plain line\n"));
}
END_TEST

START_TEST(test_ratelimit)
{
	struct ckpt_ratelimit rl = { .interval_ns = 1000 };

	ck_assert(ckpt_ratelimit_ok(&rl, 5000)); /* the first time */
	ck_assert(!ckpt_ratelimit_ok(&rl, 5001));
	ck_assert(!ckpt_ratelimit_ok(&rl, 5999));
	ck_assert(ckpt_ratelimit_ok(&rl, 6000));
	ck_assert(!ckpt_ratelimit_ok(&rl, 6500));
	ck_assert(ckpt_ratelimit_ok(&rl, 9000));
}
END_TEST

/* ---- worker threads --------------------------------------------------- */

struct workers {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool stop;
	int running;  /* started and waiting */
	int saw_stop; /* returned after seeing stop */
};

static void *worker(void *arg)
{
	struct workers *w = arg;

	pthread_mutex_lock(&w->lock);
	w->running++;
	pthread_cond_broadcast(&w->cond);
	while (!w->stop)
		pthread_cond_wait(&w->cond, &w->lock);
	w->saw_stop++;
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

static void workers_init(struct workers *w)
{
	memset(w, 0, sizeof(*w));
	ck_assert_int_eq(pthread_mutex_init(&w->lock, NULL), 0);
	ck_assert_int_eq(pthread_cond_init(&w->cond, NULL), 0);
}

/* Wait until n workers run (they block on the condition variable). */
static void workers_wait(struct workers *w, int n)
{
	pthread_mutex_lock(&w->lock);
	while (w->running < n)
		pthread_cond_wait(&w->cond, &w->lock);
	pthread_mutex_unlock(&w->lock);
}

START_TEST(test_threads_start_stop)
{
	struct workers w;
	pthread_t t[8];

	workers_init(&w);
	ck_assert_int_eq(ckpt_threads_start(t, 8, worker, &w), 8);
	workers_wait(&w, 8);
	ck_assert_int_eq(w.saw_stop, 0);
	ckpt_threads_stop(&w.lock, &w.cond, &w.stop, t, 8);
	/* every worker was woken and joined before stop returned */
	ck_assert(w.stop);
	ck_assert_int_eq(w.saw_stop, 8);
	ck_assert_int_eq(ckpt_threads_start(t, 0, worker, &w), 0);
}
END_TEST

START_TEST(test_threads_start_fails)
{
	struct workers w;
	pthread_t t[6];

	/* the fourth creation fails: three run, and stop joins those */
	workers_init(&w);
	create_fail_at = 4;
	create_fail_errno = EAGAIN;
	ck_assert_int_eq(ckpt_threads_start(t, 6, worker, &w), 3);
	ck_assert_int_eq(create_calls, 4);
	workers_wait(&w, 3);
	ckpt_threads_stop(&w.lock, &w.cond, &w.stop, t, 3);
	ck_assert_int_eq(w.saw_stop, 3);
	ck_assert_int_eq(w.running, 3);

	/* the first fails: none runs, its error comes back */
	workers_init(&w);
	create_calls = 0;
	create_fail_at = 1;
	create_fail_errno = EPERM;
	ck_assert_int_eq(ckpt_threads_start(t, 6, worker, &w), -EPERM);
	ck_assert_int_eq(create_calls, 1);
	ck_assert_int_eq(w.running, 0);
}
END_TEST

/* ---- huge mappings and populate --------------------------------------- */

/* Pages of [p, p + len) resident now. */
static size_t resident_pages(void *p, size_t len)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = (len + pg - 1) / pg, res = 0;
	unsigned char *vec = malloc(n);

	ck_assert_ptr_nonnull(vec);
	ck_assert_int_eq(mincore(p, len, vec), 0);
	for (size_t i = 0; i < n; i++)
		res += vec[i] & 1;
	free(vec);
	return res;
}

START_TEST(test_map_huge)
{
	static const size_t lens[] = { 4096, 3u << 20, (5u << 20) + 4096 };

	for (size_t k = 0; k < CKPT_ARRAY_SIZE(lens); k++) {
		size_t len = lens[k];
		void *m = NULL;
		uint8_t *a;

		nmadv = 0;
		a = ckpt_map_huge(len, &m);
		ck_assert_ptr_nonnull(a);
		ck_assert_ptr_nonnull(m);
		ck_assert_uint_eq((uintptr_t)a % CKPT_HUGE_ALIGN, 0);
		/* [a, a + len) lies inside the mapping [m, m + len + align) */
		ck_assert((uintptr_t)a >= (uintptr_t)m);
		ck_assert((uintptr_t)a + len <= (uintptr_t)m + len + CKPT_HUGE_ALIGN);
		/* advised as huge pages, the hint only */
		ck_assert_int_eq(nmadv, 1);
		ck_assert_ptr_eq(madv[0].addr, a);
		ck_assert_uint_eq(madv[0].len, len);
		ck_assert_int_eq(madv[0].advice, MADV_HUGEPAGE);
		/* private, zeroed, writable */
		ck_assert_uint_eq(a[0], 0);
		ck_assert_uint_eq(a[len - 1], 0);
		memset(a, 0x5a, len);
		ck_assert_uint_eq(a[len / 2], 0x5a);
		ck_assert_int_eq(munmap(m, len + CKPT_HUGE_ALIGN), 0);
	}

	/* without memory: NULL, *ret_map untouched */
	{
		void *m = (void *)&mmap_fail;

		mmap_fail = true;
		ck_assert_ptr_null(ckpt_map_huge(1u << 20, &m));
		ck_assert_ptr_eq(m, (void *)&mmap_fail);
		mmap_fail = false;
	}
}
END_TEST

/* ckpt_mem_populate on a fresh mapping with a few bytes written: every page
 * resident afterwards, the written bytes kept, the rest zero. */
static void check_populate(void)
{
	const size_t len = 64 * 4096;
	void *m = NULL;
	uint8_t *a = ckpt_map_huge(len, &m);

	ck_assert_ptr_nonnull(a);
	/* no transparent huge pages here: the count below is of 4 KiB pages */
	ck_assert_int_eq(__real_madvise(a, len, MADV_NOHUGEPAGE), 0);
	a[0] = 0x11;
	a[5 * 4096] = 0x22;
	a[7 * 4096 + 100] = 0x33;
	a[len - 4096] = 0x44;
	ck_assert_uint_le(resident_pages(a, len), 4);
	nmadv = 0;
	ckpt_mem_populate(a, len);
	ck_assert_uint_eq(resident_pages(a, len), len / 4096);
	ck_assert_uint_eq(a[0], 0x11);
	ck_assert_uint_eq(a[5 * 4096], 0x22);
	ck_assert_uint_eq(a[7 * 4096 + 100], 0x33);
	ck_assert_uint_eq(a[len - 4096], 0x44);
	for (size_t i = 0; i < len; i++)
		if (i != 0 && i != 5 * 4096 && i != 7 * 4096 + 100 && i != len - 4096)
			ck_assert_msg(a[i] == 0, "byte %zu is 0x%02x", i, a[i]);
	ck_assert_int_ge(nmadv, 1);
	ck_assert_int_eq(madv[0].advice, MADV_POPULATE_WRITE);
	ck_assert_int_eq(munmap(m, len + CKPT_HUGE_ALIGN), 0);
}

START_TEST(test_mem_populate)
{
	check_populate();
}
END_TEST

START_TEST(test_mem_populate_fallback)
{
	no_populate = true;
	check_populate();
}
END_TEST

static Suite *util_suite(void)
{
	Suite *s = suite_create("util");
	TCase *tc = tcase_create("core");

	tl_tcase_dirs(tc, "check_util-");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_le_be_layout);
	tcase_add_test(tc, test_le_be_roundtrip);
	tcase_add_test(tc, test_clocks);
	tcase_add_test(tc, test_pread_full_short);
	tcase_add_test(tc, test_pread_full_errors);
	tcase_add_test(tc, test_pwrite_full);
	tcase_add_test(tc, test_u64_dec);
	tcase_add_test(tc, test_unique_strs_small);
	tcase_add_test(tc, test_unique_strs_stride);
	tcase_add_test(tc, test_unique_strs_nomem);
	tcase_add_test(tc, test_str_one_line);
	tcase_add_test(tc, test_errf);
	tcase_add_test(tc, test_log);
	tcase_add_test(tc, test_log_format);
	tcase_add_test(tc, test_log_file);
	tcase_add_test(tc, test_log_reopen_other_sinks);
	tcase_add_test(tc, test_log_stderr_stamped);
	tcase_add_test(tc, test_ratelimit);
	tcase_add_test(tc, test_threads_start_stop);
	tcase_add_test(tc, test_threads_start_fails);
	tcase_add_test(tc, test_map_huge);
	tcase_add_test(tc, test_mem_populate);
	tcase_add_test(tc, test_mem_populate_fallback);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(util_suite());
}
