/* SPDX-License-Identifier: MIT */
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

static enum ckpt_log_level log_level = CKPT_LOG_WARN;
static int log_syslog;

void ckpt_log_set_level(enum ckpt_log_level level)
{
	log_level = level;
}

void ckpt_log_use_syslog(const char *ident)
{
	openlog(ident, LOG_PID, LOG_DAEMON);
	log_syslog = 1;
}

void ckpt_log(enum ckpt_log_level level, const char *fmt, ...)
{
	static const char *const names[] = { "error", "warning", "info", "debug" };
	static const int prio[] = { LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG };
	va_list ap;

	if (level > log_level)
		return;
	va_start(ap, fmt);
	if (log_syslog) {
		vsyslog(prio[level], fmt, ap);
	} else {
		char buf[2048];
		vsnprintf(buf, sizeof(buf), fmt, ap);
		fprintf(stderr, "ckptfs: %s: %s\n", names[level], buf);
	}
	va_end(ap);
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
