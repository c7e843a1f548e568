/* SPDX-License-Identifier: MIT */
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

/*
 * The sink: chosen once at start (util.h).  log_fd is the file sink's own
 * descriptor; ckpt_log_reopen() replaces the open file behind it with
 * dup2(), so that writers never see it closed.  log_path is copied into a
 * static buffer because the reopen may run in a signal handler.
 */
enum log_sink { SINK_PLAIN, SINK_STDERR, SINK_FILE, SINK_SYSLOG };

static enum ckpt_log_level log_level = CKPT_LOG_WARN;
static enum log_sink log_sink = SINK_PLAIN;
static int log_fd = -1;
static bool log_capture;
static char log_path[PATH_MAX];

static const char *const level_names[] = { "error", "warning", "info", "debug" };

void ckpt_log_set_level(enum ckpt_log_level level)
{
	log_level = level;
}

enum ckpt_log_level ckpt_log_get_level(void)
{
	return log_level;
}

const char *ckpt_log_level_name(enum ckpt_log_level level)
{
	return (unsigned)level < CKPT_ARRAY_SIZE(level_names) ? level_names[level] : "?";
}

long ckpt_gettid(void)
{
	static __thread long tid;

	if (!tid)
		tid = (long)syscall(SYS_gettid);
	return tid;
}

void ckpt_log_to_stderr(bool stamped)
{
	log_sink = stamped ? SINK_STDERR : SINK_PLAIN;
}

int ckpt_log_to_file(const char *path)
{
	int fd;

	if (strlen(path) >= sizeof(log_path))
		return -ENAMETOOLONG;
	fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (log_fd >= 0)
		close(log_fd);
	strcpy(log_path, path);
	log_fd = fd;
	log_capture = false;
	log_sink = SINK_FILE;
	return 0;
}

int ckpt_log_capture_stderr(void)
{
	if (log_sink != SINK_FILE || log_fd < 0)
		return -EINVAL;
	if (dup2(log_fd, STDERR_FILENO) < 0)
		return -errno;
	log_capture = true;
	return 0;
}

void ckpt_log_to_syslog(const char *ident)
{
	openlog(ident, LOG_PID, LOG_DAEMON);
	log_sink = SINK_SYSLOG;
}

int ckpt_log_reopen(void)
{
	int saved = errno, fd, r = 0;

	if (log_sink != SINK_FILE || log_fd < 0)
		return 0;
	fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (fd < 0) {
		r = -errno;
		goto out;
	}
	if (dup3(fd, log_fd, O_CLOEXEC) < 0 ||
	    (log_capture && dup2(fd, STDERR_FILENO) < 0))
		r = -errno;
	close(fd);
out:
	errno = saved;
	return r;
}

size_t ckpt_log_format(char *buf, size_t len, int64_t now_ns, long pid, long tid,
		       enum ckpt_log_level level, const char *msg)
{
	time_t sec = (time_t)(now_ns / 1000000000);
	struct tm tm;
	int n;

	if (len == 0)
		return 0;
	gmtime_r(&sec, &tm);
	n = snprintf(buf, len, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ ckptfs[%ld/%ld] %s: %s\n",
		     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
		     tm.tm_sec, (int)(now_ns / 1000000 % 1000), pid, tid,
		     ckpt_log_level_name(level), msg);
	if (n < 0) {
		buf[0] = '\0';
		return 0;
	}
	if ((size_t)n >= len) { /* cut: still one line */
		n = (int)len - 1;
		if (n > 0)
			buf[n - 1] = '\n';
		buf[n] = '\0';
	}
	return (size_t)n;
}

static void write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return; /* nowhere to report it */
		p += w;
		n -= (size_t)w;
	}
}

void ckpt_log(enum ckpt_log_level level, const char *fmt, ...)
{
	static const int prio[] = { LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG };
	char msg[2048], line[2200];
	int saved = errno;
	size_t n;
	va_list ap;

	if (level > log_level || (unsigned)level >= CKPT_ARRAY_SIZE(prio))
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	switch (log_sink) {
	case SINK_PLAIN:
		n = (size_t)snprintf(line, sizeof(line), "ckptfs: %s: %s\n", level_names[level], msg);
		write_all(STDERR_FILENO, line, CKPT_MIN(n, sizeof(line) - 1));
		break;
	case SINK_STDERR:
	case SINK_FILE:
		n = ckpt_log_format(line, sizeof(line), ckpt_now_ns(), (long)getpid(), ckpt_gettid(),
				    level, msg);
		write_all(log_sink == SINK_FILE ? log_fd : STDERR_FILENO, line, n);
		break;
	case SINK_SYSLOG:
		syslog(prio[level], "[%ld] %s: %s", ckpt_gettid(), level_names[level], msg);
		break;
	}
	errno = saved;
}

bool ckpt_ratelimit_ok(struct ckpt_ratelimit *rl, int64_t now_mono_ns)
{
	if (rl->last_ns != 0 && now_mono_ns - rl->last_ns < rl->interval_ns)
		return false;
	rl->last_ns = now_mono_ns;
	return true;
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
