/* SPDX-License-Identifier: MIT */
#include "base/util.h"

#include <errno.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static enum ckpt_log_level log_level = CKPT_LOG_WARN;

void ckpt_log_set_level(enum ckpt_log_level level)
{
	log_level = level;
}

void ckpt_log(enum ckpt_log_level level, const char *fmt, ...)
{
	static const char *const names[] = { "error", "warning", "info", "debug" };
	char buf[2048];
	va_list ap;

	if (level > log_level)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	fprintf(stderr, "ckptfs: %s: %s\n", names[level], buf);
}

void ckpt_str_one_line(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = '?';
}

void ckpt_errf(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || errlen == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	ckpt_str_one_line(err);
}

int ckpt_pread_full(int fd, void *buf, size_t len, uint64_t off)
{
	uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = pread(fd, p, len, (off_t)off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

int ckpt_pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
	const uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = pwrite(fd, p, len, (off_t)off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -ENOSPC;
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

int ckpt_check_unique_strs(const char *const *strs, size_t stride, size_t n)
{
	struct slot {
		size_t i; /* SIZE_MAX: empty */
		uint64_t h;
	} *slot;
	size_t cap = 16;
	int r = 0;

	/* an open-addressing hash set, FNV-1a hashes */
	if (n < 2)
		return 0;
	while (cap < 2 * n)
		cap *= 2;
	slot = malloc(cap * sizeof(*slot));
	if (!slot)
		return -ENOMEM;
	for (size_t j = 0; j < cap; j++)
		slot[j].i = SIZE_MAX;
	for (size_t i = 0; i < n && !r; i++) {
		const char *s = *(const char *const *)((const char *)strs + i * stride);
		uint64_t h = 1469598103934665603ull; /* FNV-1a */
		size_t j;
		for (const unsigned char *c = (const unsigned char *)s; *c; c++)
			h = (h ^ *c) * 1099511628211ull;
		for (j = (size_t)(h ^ (h >> 29)) & (cap - 1); slot[j].i != SIZE_MAX;
		     j = (j + 1) & (cap - 1)) {
			const char *o = *(const char *const *)((const char *)strs + slot[j].i * stride);
			if (slot[j].h == h && !strcmp(o, s)) {
				r = -EINVAL;
				break;
			}
		}
		slot[j].i = i;
		slot[j].h = h;
	}
	free(slot);
	return r;
}

int ckpt_threads_start(pthread_t *t, unsigned n, void *(*fn)(void *), void *arg)
{
	unsigned i;
	int r = 0;

	for (i = 0; i < n; i++) {
		r = pthread_create(&t[i], NULL, fn, arg);
		if (r != 0)
			break;
	}
	return i > 0 ? (int)i : -r;
}

void ckpt_threads_stop(pthread_mutex_t *lock, pthread_cond_t *cond, bool *stop, pthread_t *t,
		       unsigned n)
{
	pthread_mutex_lock(lock);
	*stop = true;
	pthread_cond_broadcast(cond);
	pthread_mutex_unlock(lock);
	for (unsigned i = 0; i < n; i++)
		pthread_join(t[i], NULL);
}

size_t ckpt_u64_dec(uint64_t v, char buf[CKPT_U64_DEC_MAX])
{
	size_t i = CKPT_U64_DEC_MAX;

	do {
		buf[--i] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	return CKPT_U64_DEC_MAX - i;
}

uint8_t *ckpt_map_huge(size_t len, void **ret_map)
{
	void *m = mmap(NULL, len + CKPT_HUGE_ALIGN, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint8_t *a;

	if (m == MAP_FAILED)
		return NULL;
	a = (uint8_t *)(((uintptr_t)m + CKPT_HUGE_ALIGN - 1) & ~(uintptr_t)(CKPT_HUGE_ALIGN - 1));
	(void)madvise(a, len, MADV_HUGEPAGE);
	*ret_map = m;
	return a;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

void ckpt_mem_populate(void *p, size_t len)
{
	volatile uint8_t *b = p;

	if (madvise(p, len, MADV_POPULATE_WRITE) == 0)
		return;
	/* a read then a write of the same byte: the write faults the page in
	 * for writing, and the contents stay whatever they were */
	for (size_t i = 0; i < len; i += 4096)
		b[i] = b[i];
}

int64_t ckpt_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t ckpt_mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int ckpt_opendir_dup(int dfd, DIR **ret_dir)
{
	int fd = dup(dfd);
	DIR *d;

	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		int e = errno;

		close(fd);
		return -e;
	}
	rewinddir(d); /* a duplicate shares dfd's offset */
	*ret_dir = d;
	return 0;
}
