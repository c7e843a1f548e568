/* SPDX-License-Identifier: MIT */
/*
 * util.h - small helpers shared by every core module: little-endian
 * encoding for on-disk structures, logging, and allocation helpers.
 *
 * Contract: nothing here calls abort() or exit().  Encoding helpers never
 * depend on host byte order; every on-disk integer is little-endian unless
 * a format says otherwise (RocksDB keys use big-endian so that they sort).
 */
#ifndef CKPT_UTIL_H
#define CKPT_UTIL_H

#include <dirent.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CKPT_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define CKPT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CKPT_MAX(a, b) ((a) > (b) ? (a) : (b))

static inline void ckpt_put_le16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static inline void ckpt_put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline void ckpt_put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint16_t ckpt_get_le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t ckpt_get_le32(const uint8_t *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static inline uint64_t ckpt_get_le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static inline void ckpt_put_be64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static inline uint64_t ckpt_get_be64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = (v << 8) | p[i];
	return v;
}

/* A directory stream over a duplicate of directory descriptor dfd, at its
 * first entry; dfd stays open and usable.  0 and *ret_dir (closedir() it),
 * or -errno. */
int ckpt_opendir_dup(int dfd, DIR **ret_dir);

/* Clocks, in nanoseconds: CLOCK_REALTIME (file times) and CLOCK_MONOTONIC
 * (intervals). */
int64_t ckpt_now_ns(void);
int64_t ckpt_mono_ns(void);

/*
 * Logging.  One line per message, written with one write() (lines of
 * concurrent threads never interleave), to one sink:
 *   - stderr, plain (the default, for command-line tools):
 *       ckptfs: LEVEL: MESSAGE
 *   - stderr, stamped, or a file (ckpt_log_to_file, appended), stamped:
 *       2026-12-02T06:30:01.123Z ckptfs[PID/TID] LEVEL: MESSAGE
 *     (UTC, milliseconds; PID the process, TID the thread as gettid(2))
 *   - syslog(3) (ckpt_log_to_syslog: facility LOG_DAEMON, LOG_PID), with
 *     the level as its priority (LOG_ERR, LOG_WARNING, LOG_INFO,
 *     LOG_DEBUG) and the message "[TID] LEVEL: MESSAGE".
 * LEVEL is error, warning, info or debug.  Messages longer than about 2
 * KiB are cut.  Choose the sink and the level once at start, before other
 * threads log (the sink is not switched atomically); ckpt_log() and
 * ckpt_log_reopen() may then be called from any thread.
 */
enum ckpt_log_level {
	CKPT_LOG_ERR = 0,
	CKPT_LOG_WARN = 1,
	CKPT_LOG_INFO = 2,
	CKPT_LOG_DEBUG = 3,
};

/* Messages at or below this level are written.  Default: CKPT_LOG_WARN
 * (the daemon sets its own, options.c). */
void ckpt_log_set_level(enum ckpt_log_level level);
enum ckpt_log_level ckpt_log_get_level(void);
/* The name of a level as lines show it ("error" .. "debug"). */
const char *ckpt_log_level_name(enum ckpt_log_level level);

/* Sinks.  ckpt_log_to_stderr: stamped or plain lines on stderr.
 * ckpt_log_to_file: path (absolute, kept for reopening) opened for
 * appending (created 0600), stamped lines; 0, or -errno with the sink
 * unchanged.  ckpt_log_capture_stderr: the file sink's file also becomes
 * stderr (fd 2), now and at every reopen, so that what libraries print
 * there lands in it (a detached daemon); 0 or -errno.
 * ckpt_log_to_syslog: openlog(ident, LOG_PID, LOG_DAEMON). */
void ckpt_log_to_stderr(bool stamped);
int ckpt_log_to_file(const char *path);
int ckpt_log_capture_stderr(void);
void ckpt_log_to_syslog(const char *ident);

/* Reopen the file sink's path (logrotate renamed or removed the file):
 * the next lines go to a file by that name, created if needed.  Only
 * async-signal-safe calls (open, dup2, close): callable from a signal
 * handler.  0 (also when the sink is not a file) or -errno (the old file
 * stays in use). */
int ckpt_log_reopen(void);

/* The stamped line of a message as the stderr and file sinks write it,
 * with its newline, into buf (len bytes, cut to fit, NUL-terminated):
 * now_ns wall-clock time.  Returns the line's length without the NUL. */
size_t ckpt_log_format(char *buf, size_t len, int64_t now_ns, long pid, long tid,
		       enum ckpt_log_level level, const char *msg);

/* The calling thread's id (gettid(2)). */
long ckpt_gettid(void);

void ckpt_log(enum ckpt_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/*
 * Rate limiting for summary lines of busy work: ckpt_ratelimit_ok() is true
 * when at least interval_ns passed since the last time it was true (and the
 * first time); the caller then logs what it accumulated meanwhile.  Not
 * thread-safe: one limiter per thread of work.
 */
struct ckpt_ratelimit {
	int64_t interval_ns;
	int64_t last_ns; /* 0: never */
};
bool ckpt_ratelimit_ok(struct ckpt_ratelimit *rl, int64_t now_mono_ns);

#define ckpt_err(...) ckpt_log(CKPT_LOG_ERR, __VA_ARGS__)
#define ckpt_warn(...) ckpt_log(CKPT_LOG_WARN, __VA_ARGS__)
#define ckpt_info(...) ckpt_log(CKPT_LOG_INFO, __VA_ARGS__)
#define ckpt_debug(...) ckpt_log(CKPT_LOG_DEBUG, __VA_ARGS__)

/* Make the NUL-terminated s one printable line, in place, for an error
 * message that quotes names from files: control characters (below 0x20,
 * and DEL) become '?'; other bytes, UTF-8 included, stay. */
void ckpt_str_one_line(char *s);

/* Format an error message into err (errlen bytes, truncated to fit) and make
 * it one printable line with ckpt_str_one_line: the one formatter behind the
 * err/errlen messages that core/ functions hand to their callers.  err NULL
 * or errlen 0: nothing is written. */
void ckpt_errf(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* pread/pwrite loops that retry on EINTR and short transfers.
 * Return 0 on success, -errno on failure; pread_full returns -EIO when the
 * file ends before len bytes were read. */
int ckpt_pread_full(int fd, void *buf, size_t len, uint64_t off);
int ckpt_pwrite_full(int fd, const void *buf, size_t len, uint64_t off);

/*
 * 0 if the n NUL-terminated strings are pairwise different, -EINVAL if two
 * are equal, -ENOMEM.  String i is *(const char **)((char *)strs + i *
 * stride): an array of pointers (stride sizeof(char *)) or the name field
 * of an array of structs.  Expected O(n) (a hash set; a sort of 20,000
 * names cost more than writing them out).
 */
int ckpt_check_unique_strs(const char *const *strs, size_t stride, size_t n);

/* Decimal digits of v, written to end of buf (CKPT_U64_DEC_MAX bytes, no
 * NUL); returns the number of digits, which start at buf + CKPT_U64_DEC_MAX -
 * the result.  For the JSON writers, which must not depend on the locale. */
#define CKPT_U64_DEC_MAX 20
size_t ckpt_u64_dec(uint64_t v, char buf[CKPT_U64_DEC_MAX]);

/*
 * Worker threads of a pool that waits on one mutex and condition variable.
 * ckpt_threads_start() starts up to n threads running fn(arg) into t[0..n)
 * and returns how many started (0: the errno of the first failure, as a
 * negative value).  ckpt_threads_stop() sets *stop under lock, wakes every
 * waiter on cond and joins t[0..n); the workers must return once they see
 * *stop (read under lock).
 */
int ckpt_threads_start(pthread_t *t, unsigned n, void *(*fn)(void *), void *arg);
void ckpt_threads_stop(pthread_mutex_t *lock, pthread_cond_t *cond, bool *stop, pthread_t *t,
		       unsigned n);

/*
 * Memory for large buffers.  ckpt_map_huge(): a private anonymous mapping
 * with len bytes at a 2 MiB aligned start,
 * advised MADV_HUGEPAGE (a hint: 4 KiB pages work too); returns the aligned
 * start and in *ret_map what to pass to munmap() with len +
 * CKPT_HUGE_ALIGN bytes; NULL without memory.  ckpt_mem_populate(): fault
 * p[0..len) in for writing now (MADV_POPULATE_WRITE, or a write per 4 KiB
 * page where the kernel lacks it), so that later use takes no page fault
 * and no zeroing; p and len page aligned; the contents do not change.
 */
#define CKPT_HUGE_ALIGN (2u << 20)
uint8_t *ckpt_map_huge(size_t len, void **ret_map);
void ckpt_mem_populate(void *p, size_t len);

#endif
