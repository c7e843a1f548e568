/* SPDX-License-Identifier: MIT */
/*
 * shim.c - the torture suite's LD_PRELOAD library (libtorture.so).
 *
 * The torture driver (tools/torture/run) preloads it into the daemon and into
 * `ckpt gc`; nothing in ckptfs links or loads it, so it is never active in
 * normal use.  It interposes the C library's calls that change files (open
 * with O_CREAT/O_TRUNC, write/pwrite/writev/pwritev, ftruncate, fallocate,
 * fsync/fdatasync/syncfs/sync, rename, unlink, link, mkdir, rmdir) and, for
 * the files under one directory (the store), does two things:
 *
 *   - the power-loss log (TORTURE_LOG=FILE): one record per successful
 *     change, appended with O_APPEND in the order the calls completed, with
 *     the bytes written.  A sync is two records: SYNC_BEGIN before the call
 *     and SYNC_END after it, so that the records before SYNC_BEGIN are the
 *     writes the sync is known to cover.  tools/torture/powerlog.py replays
 *     the log onto a copy of the store taken before it started, keeping only
 *     what a power loss at a chosen point must keep (docs/reliability.md,
 *     "Torture suite").  The driver appends its own CLIENT records to the
 *     same file, so the client's operations and the daemon's I/O are in one
 *     order.
 *   - kill points (TORTURE_KILL=OP@AREA:N:WHEN): once armed, the N-th call of
 *     kind OP on a file of AREA raises SIGKILL in the calling process, just
 *     before the real call (WHEN=before) or just after it returned and was
 *     logged (WHEN=after).  OP: write, sync, dirsync, create, rename, unlink,
 *     trunc, mkdir, any.  AREA: pack, wal, sst, manifest, current, index
 *     (every file of the metadata engine), marker, staging, other, any.
 *
 * TORTURE_CTL=FILE names a control file (struct ctl below) that the shim maps
 * shared: the driver sets `armed` in it to start counting towards the kill
 * point, and reads the per-kind counters (how many calls of each kind the
 * process made, armed or not) to choose N for later rounds.  TORTURE_ARMED=1
 * arms at start.  Without TORTURE_ROOT the shim only forwards calls.
 *
 * Log record (little-endian): struct rec, then `len - sizeof(struct rec)`
 * payload bytes.  Paths in payloads are relative to the root ("" is the
 * root itself); two paths are separated by a NUL.  Format id: magic "TRTL",
 * version 1 (REC_VERSION): powerlog.py refuses other versions.
 *
 * Limits, on purpose: writes through shared mmaps of watched files and
 * writes by direct system calls (syscall(2), io_uring) are not seen; ckptfs
 * and RocksDB (with its default options) make neither.  Descriptors opened
 * with O_TMPFILE (the store's scratch files) are not logged: their content
 * never becomes a file of the store.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define REC_MAGIC 0x4c545254u /* "TRTL" */
#define REC_VERSION 1

enum rec_type {
	R_OPEN = 1,	  /* ino, a = open flags, b = 1 if the call created the file; path */
	R_WRITE = 2,	  /* ino, a = offset, b = length; the bytes */
	R_TRUNC = 3,	  /* ino, a = new size */
	R_SYNC_BEGIN = 4, /* ino (0: every file), a = sync id, b = kind (enum sync_kind); path */
	R_SYNC_END = 5,	  /* a = sync id, b = 0 on success, else errno */
	R_RENAME = 6,	  /* a = renameat2 flags; old path NUL new path */
	R_UNLINK = 7,	  /* path */
	R_RMDIR = 8,	  /* path */
	R_MKDIR = 9,	  /* path */
	R_LINK = 10,	  /* old path NUL new path */
	R_CLIENT = 11,	  /* written by the driver, never by the shim */
	R_KILL = 12,	  /* a = op kind, b = area: the process kills itself now */
	R_HELLO = 13,	  /* a = REC_VERSION, b = pid: first record of each process */
	R_ZERO = 14,	  /* ino, a = offset, b = length: a hole punched (reads as zeros) */
};

enum sync_kind { SK_FSYNC = 0, SK_FDATASYNC = 1, SK_DIR = 2, SK_ALL = 3 };

struct rec {
	uint32_t magic;
	uint16_t type;
	uint16_t flags;
	uint32_t len; /* header and payload */
	uint32_t tid;
	uint64_t ino;
	uint64_t a;
	uint64_t b;
};

enum op_kind { OP_WRITE, OP_SYNC, OP_DIRSYNC, OP_CREATE, OP_RENAME, OP_UNLINK, OP_TRUNC, OP_MKDIR,
	       OP_N, OP_ANY = OP_N };
static const char *const op_names[] = { "write", "sync", "dirsync", "create", "rename", "unlink",
					"trunc", "mkdir" };
enum area { A_PACK, A_WAL, A_SST, A_MANIFEST, A_CURRENT, A_INDEX, A_MARKER, A_STAGING, A_OTHER,
	    A_N, A_ANY = A_N, A_INDEX_ANY };
static const char *const area_names[] = { "pack", "wal", "sst", "manifest", "current", "index",
					  "marker", "staging", "other" };

/* The control file, shared with the driver (tools/torture/tlib.py reads it). */
#define CTL_MAGIC 0x4c544354u /* "TCTL" */
struct ctl {
	uint32_t magic;
	_Atomic uint32_t armed;	   /* set by the driver */
	_Atomic uint32_t fired;	   /* set by the shim right before it kills */
	uint32_t pad;
	_Atomic uint64_t hits;	   /* matching calls since armed */
	_Atomic uint64_t counts[OP_N][A_N];
};

/* One descriptor's state.  Written by open/close of that descriptor (the
 * program does not use a descriptor while it opens or closes it), read by
 * the calls on it. */
struct fdent {
	_Atomic int tracked; /* 1: a file or directory under the root */
	int is_dir;
	int nolog;	     /* O_TMPFILE: written but never part of the store */
	uint64_t dev;
	uint64_t ino;
	char *rel;	     /* path relative to the root (malloc'ed), "" for the root */
};

#define MAX_FD 65536
static struct fdent fds[MAX_FD];
static char root[PATH_MAX];
static size_t root_len;
static int log_fd = -1;
static struct ctl *ctl;
static int kill_op = -1, kill_area = -1, kill_after;
static uint64_t kill_n;
static _Atomic uint64_t sync_ids;

static int (*real_open)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_close)(int);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t (*real_pwritev)(int, const struct iovec *, int, off_t);
static int (*real_ftruncate)(int, off_t);
static int (*real_fallocate)(int, int, off_t, off_t);
static int (*real_posix_fallocate)(int, off_t, off_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_syncfs)(int);
static void (*real_sync)(void);
static int (*real_rename)(const char *, const char *);
static int (*real_renameat)(int, const char *, int, const char *);
static int (*real_renameat2)(int, const char *, int, const char *, unsigned);
static int (*real_unlink)(const char *);
static int (*real_unlinkat)(int, const char *, int);
static int (*real_rmdir)(const char *);
static int (*real_mkdir)(const char *, mode_t);
static int (*real_mkdirat)(int, const char *, mode_t);
static int (*real_link)(const char *, const char *);
static int (*real_linkat)(int, const char *, int, const char *, int);
static int (*real_dup)(int);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);
static int (*real_closedir)(DIR *);
static int (*real_fclose)(FILE *);

#define RESOLVE(name) real_##name = dlsym(RTLD_NEXT, #name)

static void resolve_all(void)
{
	RESOLVE(open);
	RESOLVE(openat);
	RESOLVE(close);
	RESOLVE(write);
	RESOLVE(pwrite);
	RESOLVE(writev);
	RESOLVE(pwritev);
	RESOLVE(ftruncate);
	RESOLVE(fallocate);
	RESOLVE(posix_fallocate);
	RESOLVE(fsync);
	RESOLVE(fdatasync);
	RESOLVE(syncfs);
	RESOLVE(sync);
	RESOLVE(rename);
	RESOLVE(renameat);
	RESOLVE(renameat2);
	RESOLVE(unlink);
	RESOLVE(unlinkat);
	RESOLVE(rmdir);
	RESOLVE(mkdir);
	RESOLVE(mkdirat);
	RESOLVE(link);
	RESOLVE(linkat);
	RESOLVE(dup);
	RESOLVE(dup2);
	RESOLVE(dup3);
	RESOLVE(closedir);
	RESOLVE(fclose);
}

static void die(const char *msg)
{
	/* A broken setup must not run a torture round that proves nothing. */
	char buf[512];
	int n = snprintf(buf, sizeof(buf), "libtorture: %s\n", msg);

	if (n > 0)
		(void)!real_write(2, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
	_exit(99);
}

static int parse_op(const char *s, size_t n)
{
	if (n == 3 && !strncmp(s, "any", 3))
		return OP_ANY;
	for (int i = 0; i < OP_N; i++)
		if (strlen(op_names[i]) == n && !strncmp(s, op_names[i], n))
			return i;
	return -1;
}

static int parse_area(const char *s, size_t n)
{
	if (n == 3 && !strncmp(s, "any", 3))
		return A_ANY;
	for (int i = 0; i < A_N; i++)
		if (strlen(area_names[i]) == n && !strncmp(s, area_names[i], n))
			return i;
	return -1;
}

/* TORTURE_KILL=OP[@AREA]:N[:before|after] */
static void parse_kill(const char *spec)
{
	const char *at = strchr(spec, '@'), *c1 = strchr(spec, ':'), *c2;
	char *end;

	if (!c1)
		die("TORTURE_KILL: want OP[@AREA]:N[:before|after]");
	if (at && at > c1)
		at = NULL;
	kill_op = parse_op(spec, (size_t)((at ? at : c1) - spec));
	kill_area = at ? parse_area(at + 1, (size_t)(c1 - at - 1)) : A_ANY;
	if (at && !strncmp(at + 1, "index", 5) && c1 - at - 1 == 5)
		kill_area = A_INDEX_ANY;
	if (kill_op < 0 || kill_area < 0)
		die("TORTURE_KILL: unknown operation or area");
	kill_n = strtoull(c1 + 1, &end, 10);
	if (end == c1 + 1 || kill_n == 0)
		die("TORTURE_KILL: N must be a positive integer");
	c2 = *end == ':' ? end + 1 : NULL;
	kill_after = c2 && !strcmp(c2, "after");
	if (c2 && !kill_after && strcmp(c2, "before"))
		die("TORTURE_KILL: WHEN is before or after");
}

__attribute__((constructor)) static void shim_init(void)
{
	const char *r = getenv("TORTURE_ROOT"), *l = getenv("TORTURE_LOG");
	const char *c = getenv("TORTURE_CTL"), *k = getenv("TORTURE_KILL");

	resolve_all();
	if (!real_open || !real_openat || !real_write || !real_close)
		die("cannot find the C library's functions");
	if (!r || !*r)
		return;
	if (r[0] != '/' || strlen(r) >= sizeof(root) - 1)
		die("TORTURE_ROOT must be an absolute path");
	strcpy(root, r);
	root_len = strlen(root);
	while (root_len > 1 && root[root_len - 1] == '/')
		root[--root_len] = 0;
	if (l && *l) {
		struct rec h = { REC_MAGIC, R_HELLO, 0, sizeof(h), 0, 0, REC_VERSION,
				 (uint64_t)getpid() };

		log_fd = real_open(l, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
		if (log_fd < 0)
			die("cannot open TORTURE_LOG");
		/* keep it out of the program's way (it may close low descriptors) */
		if (log_fd < 900) {
			int hi = fcntl(log_fd, F_DUPFD_CLOEXEC, 900);

			if (hi >= 0) {
				real_close(log_fd);
				log_fd = hi;
			}
		}
		if (real_write(log_fd, &h, sizeof(h)) != (ssize_t)sizeof(h))
			die("cannot write TORTURE_LOG");
	}
	if (c && *c) {
		int fd = real_open(c, O_RDWR | O_CLOEXEC);
		void *m;

		if (fd < 0)
			die("cannot open TORTURE_CTL");
		m = mmap(NULL, sizeof(struct ctl), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		real_close(fd);
		if (m == MAP_FAILED)
			die("cannot map TORTURE_CTL");
		ctl = m;
		if (ctl->magic != CTL_MAGIC)
			die("TORTURE_CTL has no control block (magic)");
		if (getenv("TORTURE_ARMED") && !strcmp(getenv("TORTURE_ARMED"), "1"))
			atomic_store(&ctl->armed, 1);
	}
	if (k && *k) {
		if (!ctl)
			die("TORTURE_KILL needs TORTURE_CTL");
		parse_kill(k);
	}
}

/* ------------------------------------------------------------ paths */

/* Normalizes an absolute path in place ("//", ".", ".." removed). */
static void normalize(char *p)
{
	char *out = p, *s = p;

	while (*s) {
		while (*s == '/')
			s++;
		if (!*s)
			break;
		char *e = strchr(s, '/');
		size_t n = e ? (size_t)(e - s) : strlen(s);

		if (n == 1 && s[0] == '.') {
			/* skip */
		} else if (n == 2 && s[0] == '.' && s[1] == '.') {
			while (out > p && *--out != '/')
				;
		} else {
			*out++ = '/';
			memmove(out, s, n);
			out += n;
		}
		s += n;
	}
	if (out == p)
		*out++ = '/';
	*out = 0;
}

static int watched(int fd);

/* The path relative to the root of (dirfd, path), in buf; NULL if it is not
 * under the root or cannot be told. */
static const char *rel_of(int dirfd, const char *path, char *buf, size_t len)
{
	char tmp[PATH_MAX * 2];

	if (!root_len || !path)
		return NULL;
	if (path[0] == '/') {
		if (strlen(path) >= sizeof(tmp))
			return NULL;
		strcpy(tmp, path);
	} else if (dirfd == AT_FDCWD) {
		if (!getcwd(tmp, PATH_MAX))
			return NULL;
		if (strlen(tmp) + 1 + strlen(path) >= sizeof(tmp))
			return NULL;
		strcat(tmp, "/");
		strcat(tmp, path);
	} else {
		if (!watched(dirfd))
			return NULL;
		if (root_len + 2 + strlen(fds[dirfd].rel) + strlen(path) >= sizeof(tmp))
			return NULL;
		snprintf(tmp, sizeof(tmp), "%s/%s/%s", root, fds[dirfd].rel, path);
	}
	normalize(tmp);
	if (strncmp(tmp, root, root_len) || (tmp[root_len] && tmp[root_len] != '/'))
		return NULL;
	snprintf(buf, len, "%s", tmp[root_len] ? tmp + root_len + 1 : "");
	return buf;
}

static int area_of(const char *rel)
{
	const char *base;

	if (!strncmp(rel, "packs/", 6))
		return A_PACK;
	if (!strncmp(rel, "staging/", 8))
		return A_STAGING;
	if (!strncmp(rel, "ckptfs-store", 12))
		return A_MARKER;
	if (strncmp(rel, "index/", 6))
		return A_OTHER;
	base = rel + 6;
	size_t n = strlen(base);

	if (n > 4 && !strcmp(base + n - 4, ".log"))
		return A_WAL;
	if (n > 4 && !strcmp(base + n - 4, ".sst"))
		return A_SST;
	if (!strncmp(base, "MANIFEST", 8))
		return A_MANIFEST;
	if (!strncmp(base, "CURRENT", 7) || strstr(base, ".dbtmp"))
		return A_CURRENT;
	return A_INDEX;
}

static int area_of_fd(int fd)
{
	return area_of(fds[fd].rel);
}

static void fd_forget(int fd);

/* Whether fd is a watched file.  A descriptor closed behind the shim's back
 * (closedir, fclose and the C library's other internal closes are not all
 * interposed) and reused for another file is caught here by its inode. */
static int watched(int fd)
{
	struct stat st;

	if (fd < 0 || fd >= MAX_FD || !atomic_load(&fds[fd].tracked))
		return 0;
	if (fstat(fd, &st) == 0 && (uint64_t)st.st_ino == fds[fd].ino &&
	    (uint64_t)st.st_dev == fds[fd].dev)
		return 1;
	fd_forget(fd);
	return 0;
}

/* ------------------------------------------------------------ log and kill points */

static void put_rec(int type, uint64_t ino, uint64_t a, uint64_t b, const struct iovec *data,
		    int ndata, const char *p1, const char *p2)
{
	struct iovec iov[2 + 1024];
	struct rec h = { REC_MAGIC, (uint16_t)type, 0, sizeof(h), (uint32_t)syscall(SYS_gettid),
			 ino, a, b };
	int n = 1;

	if (log_fd < 0)
		return;
	if (ndata > 1024)
		die("a write of more than 1024 pieces");
	iov[0].iov_base = &h;
	iov[0].iov_len = sizeof(h);
	for (int i = 0; i < ndata; i++) {
		iov[n++] = data[i];
		h.len += (uint32_t)data[i].iov_len;
	}
	if (p1) {
		iov[n].iov_base = (void *)p1;
		iov[n++].iov_len = strlen(p1) + (p2 ? 1 : 0);
		h.len += (uint32_t)(strlen(p1) + (p2 ? 1 : 0));
	}
	if (p2) {
		iov[n].iov_base = (void *)p2;
		iov[n++].iov_len = strlen(p2);
		h.len += (uint32_t)strlen(p2);
	}
	ssize_t w = real_writev(log_fd, iov, n);

	if (w != (ssize_t)h.len)
		die("short write to TORTURE_LOG (disk full?)");
}

static int matches(int op, int area)
{
	if (kill_op < 0 || (kill_op != OP_ANY && kill_op != op))
		return 0;
	if (kill_area == A_ANY)
		return 1;
	if (kill_area == A_INDEX_ANY)
		return area == A_WAL || area == A_SST || area == A_MANIFEST || area == A_CURRENT ||
		       area == A_INDEX;
	return kill_area == area;
}

/* Counts a call and says whether it is the kill point. */
static int kill_point(int op, int area)
{
	if (!ctl)
		return 0;
	atomic_fetch_add(&ctl->counts[op][area], 1);
	if (!atomic_load(&ctl->armed) || !matches(op, area))
		return 0;
	return atomic_fetch_add(&ctl->hits, 1) + 1 == kill_n;
}

static void do_kill(int op, int area)
{
	put_rec(R_KILL, 0, (uint64_t)op, (uint64_t)area, NULL, 0, NULL, NULL);
	atomic_store(&ctl->fired, 1);
	kill(getpid(), SIGKILL);
	for (;;)
		pause();
}

/* BEFORE(op, area) counts a call of kind op (OP_N: not a kind that is counted)
 * and kills before it when it is the kill point; AFTER() kills after it. */
#define BEFORE(op, area)                                                     \
	int ko_ = (op), ka_ = (area);                                        \
	int kp_ = ko_ < OP_N ? kill_point(ko_, ka_) : 0;                     \
	if (kp_ && !kill_after)                                              \
		do_kill(ko_, ka_)
#define AFTER()                                                              \
	do {                                                                 \
		if (kp_ && kill_after)                                       \
			do_kill(ko_, ka_);                                   \
	} while (0)

/* ------------------------------------------------------------ descriptors */

static void fd_forget(int fd)
{
	if (fd < 0 || fd >= MAX_FD || !atomic_load(&fds[fd].tracked))
		return;
	atomic_store(&fds[fd].tracked, 0);
	free(fds[fd].rel);
	fds[fd].rel = NULL;
}

static void fd_track(int fd, const char *rel, int nolog)
{
	struct stat st;

	if (fd < 0 || fd >= MAX_FD)
		return;
	fd_forget(fd);
	if (fstat(fd, &st) < 0)
		return;
	if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
		return;
	fds[fd].rel = strdup(rel);
	if (!fds[fd].rel)
		return;
	fds[fd].is_dir = S_ISDIR(st.st_mode);
	fds[fd].dev = (uint64_t)st.st_dev;
	fds[fd].ino = (uint64_t)st.st_ino;
	fds[fd].nolog = nolog;
	atomic_store(&fds[fd].tracked, 1);
}

static void fd_copy(int from, int to)
{
	if (to < 0 || to >= MAX_FD)
		return;
	fd_forget(to);
	if (!watched(from))
		return;
	fds[to].rel = strdup(fds[from].rel);
	if (!fds[to].rel)
		return;
	fds[to].is_dir = fds[from].is_dir;
	fds[to].dev = fds[from].dev;
	fds[to].ino = fds[from].ino;
	fds[to].nolog = fds[from].nolog;
	atomic_store(&fds[to].tracked, 1);
}

static int do_openat(int dirfd, const char *path, int flags, mode_t mode)
{
	char buf[PATH_MAX];
	const char *rel = rel_of(dirfd, path, buf, sizeof(buf));
	int tmpfile = (flags & O_TMPFILE) == O_TMPFILE, created = 0, fd;
	struct stat st;

	if (!rel)
		return real_openat(dirfd, path, flags, mode);
	if ((flags & O_CREAT) && !tmpfile)
		created = fstatat(dirfd, path, &st, 0) < 0 && errno == ENOENT;
	int area = area_of(rel);
	BEFORE(created ? OP_CREATE : (flags & O_TRUNC) ? OP_TRUNC : OP_N, area);
	fd = real_openat(dirfd, path, flags, mode);
	if (fd < 0)
		return fd;
	int e = errno;

	fd_track(fd, rel, tmpfile);
	if (watched(fd) && !tmpfile && !fds[fd].is_dir &&
	    (created || (flags & (O_CREAT | O_TRUNC))))
		put_rec(R_OPEN, fds[fd].ino, (uint64_t)flags, (uint64_t)created, NULL, 0, rel, NULL);
	AFTER();
	errno = e;
	return fd;
}

static int open_mode_flags(int flags)
{
	return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE;
}

int open(const char *path, int flags, ...)
{
	mode_t mode = 0;

	if (open_mode_flags(flags)) {
		va_list ap;

		va_start(ap, flags);
		mode = va_arg(ap, mode_t);
		va_end(ap);
	}
	if (!real_openat)
		resolve_all();
	return do_openat(AT_FDCWD, path, flags, mode);
}

int open64(const char *path, int flags, ...) __attribute__((alias("open")));

int openat(int dirfd, const char *path, int flags, ...)
{
	mode_t mode = 0;

	if (open_mode_flags(flags)) {
		va_list ap;

		va_start(ap, flags);
		mode = va_arg(ap, mode_t);
		va_end(ap);
	}
	if (!real_openat)
		resolve_all();
	return do_openat(dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...) __attribute__((alias("openat")));

int creat(const char *path, mode_t mode)
{
	return do_openat(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

int creat64(const char *path, mode_t mode) __attribute__((alias("creat")));

int close(int fd)
{
	fd_forget(fd);
	return real_close(fd);
}

int closedir(DIR *d)
{
	fd_forget(dirfd(d));
	return real_closedir(d);
}

int fclose(FILE *f)
{
	fd_forget(fileno(f));
	return real_fclose(f);
}

int dup(int fd)
{
	int r = real_dup(fd);

	if (r >= 0)
		fd_copy(fd, r);
	return r;
}

int dup2(int fd, int fd2)
{
	int r = real_dup2(fd, fd2);

	if (r >= 0 && fd != fd2)
		fd_copy(fd, r);
	return r;
}

int dup3(int fd, int fd2, int flags)
{
	int r = real_dup3(fd, fd2, flags);

	if (r >= 0)
		fd_copy(fd, r);
	return r;
}

/* ------------------------------------------------------------ data */

static ssize_t logged_write(int fd, const struct iovec *iov, int cnt, off_t off, int positional)
{
	ssize_t n;
	int area = area_of_fd(fd);
	BEFORE(OP_WRITE, area);

	n = positional ? real_pwritev(fd, iov, cnt, off) : real_writev(fd, iov, cnt);
	if (n <= 0 || fds[fd].nolog)
		goto out;
	int e = errno;

	if (!positional) {
		off = lseek(fd, 0, SEEK_CUR);
		if (off < 0)
			die("lseek on a watched descriptor failed");
		off -= n;
	}
	/* the part of iov that was written */
	struct iovec part[1024];
	int k = 0;
	size_t left = (size_t)n;

	for (int i = 0; i < cnt && left; i++) {
		if (k == 1024)
			die("a write of more than 1024 pieces");
		part[k].iov_base = iov[i].iov_base;
		part[k].iov_len = iov[i].iov_len < left ? iov[i].iov_len : left;
		left -= part[k].iov_len;
		k++;
	}
	put_rec(R_WRITE, fds[fd].ino, (uint64_t)off, (uint64_t)n, part, k, NULL, NULL);
	errno = e;
out:
	AFTER();
	return n;
}

ssize_t write(int fd, const void *buf, size_t len)
{
	if (!real_write)
		resolve_all();
	if (!watched(fd))
		return real_write(fd, buf, len);
	struct iovec v = { (void *)buf, len };

	return logged_write(fd, &v, 1, 0, 0);
}

ssize_t pwrite(int fd, const void *buf, size_t len, off_t off)
{
	if (!watched(fd))
		return real_pwrite(fd, buf, len, off);
	struct iovec v = { (void *)buf, len };

	return logged_write(fd, &v, 1, off, 1);
}

ssize_t pwrite64(int fd, const void *buf, size_t len, off_t off) __attribute__((alias("pwrite")));

ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
	if (!watched(fd))
		return real_writev(fd, iov, cnt);
	return logged_write(fd, iov, cnt, 0, 0);
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off)
{
	if (!watched(fd))
		return real_pwritev(fd, iov, cnt, off);
	return logged_write(fd, iov, cnt, off, 1);
}

ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off_t off)
	__attribute__((alias("pwritev")));

int ftruncate(int fd, off_t size)
{
	if (!watched(fd))
		return real_ftruncate(fd, size);
	int area = area_of_fd(fd);
	BEFORE(OP_TRUNC, area);
	int r = real_ftruncate(fd, size), e = errno;

	if (r == 0 && !fds[fd].nolog)
		put_rec(R_TRUNC, fds[fd].ino, (uint64_t)size, 0, NULL, 0, NULL, NULL);
	AFTER();
	errno = e;
	return r;
}

int ftruncate64(int fd, off_t size) __attribute__((alias("ftruncate")));

/* A fallocate that may grow the file is logged as a truncation to the new
 * size when it did (the allocated range reads as zeros). */
static void log_grow(int fd)
{
	struct stat st;

	if (!fds[fd].nolog && fstat(fd, &st) == 0)
		put_rec(R_TRUNC, fds[fd].ino, (uint64_t)st.st_size, 1, NULL, 0, NULL, NULL);
}

int fallocate(int fd, int mode, off_t off, off_t len)
{
	if (!watched(fd))
		return real_fallocate(fd, mode, off, len);
	int r = real_fallocate(fd, mode, off, len), e = errno;

	if (r == 0 && (mode & FALLOC_FL_PUNCH_HOLE) && !fds[fd].nolog)
		put_rec(R_ZERO, fds[fd].ino, (uint64_t)off, (uint64_t)len, NULL, 0, NULL, NULL);
	else if (r == 0 && mode == 0)
		log_grow(fd);
	else if (r == 0 && mode != FALLOC_FL_KEEP_SIZE)
		die("fallocate with a mode other than 0, KEEP_SIZE or PUNCH_HOLE on a watched file");
	errno = e;
	return r;
}

int fallocate64(int fd, int mode, off_t off, off_t len) __attribute__((alias("fallocate")));

int posix_fallocate(int fd, off_t off, off_t len)
{
	if (!watched(fd))
		return real_posix_fallocate(fd, off, len);
	int r = real_posix_fallocate(fd, off, len);

	if (r == 0)
		log_grow(fd);
	return r;
}

int posix_fallocate64(int fd, off_t off, off_t len) __attribute__((alias("posix_fallocate")));

/* ------------------------------------------------------------ syncs */

static int logged_sync(int fd, int kind)
{
	int dir = fds[fd].is_dir, r, e;
	int area = area_of_fd(fd);
	uint64_t id = atomic_fetch_add(&sync_ids, 1) + 1;
	BEFORE(dir ? OP_DIRSYNC : OP_SYNC, area);

	put_rec(R_SYNC_BEGIN, fds[fd].ino, id, dir ? SK_DIR : (uint64_t)kind, NULL, 0,
		fds[fd].rel, NULL);
	r = kind == SK_ALL ? real_syncfs(fd) : kind == SK_FDATASYNC ? real_fdatasync(fd) : real_fsync(fd);
	e = errno;
	put_rec(R_SYNC_END, 0, id, r == 0 ? 0 : (uint64_t)e, NULL, 0, NULL, NULL);
	AFTER();
	errno = e;
	return r;
}

int fsync(int fd)
{
	if (!watched(fd))
		return real_fsync(fd);
	return logged_sync(fd, SK_FSYNC);
}

int fdatasync(int fd)
{
	if (!watched(fd))
		return real_fdatasync(fd);
	return logged_sync(fd, SK_FDATASYNC);
}

int syncfs(int fd)
{
	if (!watched(fd))
		return real_syncfs(fd);
	uint64_t id = atomic_fetch_add(&sync_ids, 1) + 1;

	put_rec(R_SYNC_BEGIN, 0, id, SK_ALL, NULL, 0, "", NULL);
	int r = real_syncfs(fd), e = errno;

	put_rec(R_SYNC_END, 0, id, r == 0 ? 0 : (uint64_t)e, NULL, 0, NULL, NULL);
	errno = e;
	return r;
}

void sync(void)
{
	uint64_t id = atomic_fetch_add(&sync_ids, 1) + 1;

	put_rec(R_SYNC_BEGIN, 0, id, SK_ALL, NULL, 0, "", NULL);
	real_sync();
	put_rec(R_SYNC_END, 0, id, 0, NULL, 0, NULL, NULL);
}

/* ------------------------------------------------------------ namespace */

static int do_rename(int od, const char *o, int nd, const char *n, unsigned flags, int plain)
{
	char b1[PATH_MAX], b2[PATH_MAX];
	const char *r1 = rel_of(od, o, b1, sizeof(b1)), *r2 = rel_of(nd, n, b2, sizeof(b2));

	if (!r1 && !r2)
		return plain ? real_renameat(od, o, nd, n) : real_renameat2(od, o, nd, n, flags);
	if (!r1 || !r2)
		die("rename into or out of the watched directory");
	int area = area_of(r2);
	BEFORE(OP_RENAME, area);
	int r = plain ? real_renameat(od, o, nd, n) : real_renameat2(od, o, nd, n, flags), e = errno;

	if (r == 0)
		put_rec(R_RENAME, 0, flags, 0, NULL, 0, r1, r2);
	AFTER();
	errno = e;
	return r;
}

int rename(const char *o, const char *n)
{
	return do_rename(AT_FDCWD, o, AT_FDCWD, n, 0, 1);
}

int renameat(int od, const char *o, int nd, const char *n)
{
	return do_rename(od, o, nd, n, 0, 1);
}

int renameat2(int od, const char *o, int nd, const char *n, unsigned flags)
{
	return do_rename(od, o, nd, n, flags, 0);
}

static int do_unlink(int dfd, const char *path, int flags)
{
	char b[PATH_MAX];
	const char *rel = rel_of(dfd, path, b, sizeof(b));

	if (!rel)
		return real_unlinkat(dfd, path, flags);
	int area = area_of(rel);
	BEFORE(OP_UNLINK, area);
	int r = real_unlinkat(dfd, path, flags), e = errno;

	if (r == 0)
		put_rec((flags & AT_REMOVEDIR) ? R_RMDIR : R_UNLINK, 0, 0, 0, NULL, 0, rel, NULL);
	AFTER();
	errno = e;
	return r;
}

int unlink(const char *path)
{
	return do_unlink(AT_FDCWD, path, 0);
}

int unlinkat(int dfd, const char *path, int flags)
{
	return do_unlink(dfd, path, flags);
}

int rmdir(const char *path)
{
	return do_unlink(AT_FDCWD, path, AT_REMOVEDIR);
}

static int do_mkdir(int dfd, const char *path, mode_t mode)
{
	char b[PATH_MAX];
	const char *rel = rel_of(dfd, path, b, sizeof(b));

	if (!rel)
		return real_mkdirat(dfd, path, mode);
	int area = area_of(rel);
	BEFORE(OP_MKDIR, area);
	int r = real_mkdirat(dfd, path, mode), e = errno;

	if (r == 0)
		put_rec(R_MKDIR, 0, 0, 0, NULL, 0, rel, NULL);
	AFTER();
	errno = e;
	return r;
}

int mkdir(const char *path, mode_t mode)
{
	return do_mkdir(AT_FDCWD, path, mode);
}

int mkdirat(int dfd, const char *path, mode_t mode)
{
	return do_mkdir(dfd, path, mode);
}

static int do_link(int od, const char *o, int nd, const char *n, int flags)
{
	char b1[PATH_MAX], b2[PATH_MAX];
	const char *r2 = rel_of(nd, n, b2, sizeof(b2));

	if (!r2)
		return real_linkat(od, o, nd, n, flags);
	if (flags & AT_EMPTY_PATH)
		die("linkat(AT_EMPTY_PATH) into the watched directory");
	const char *r1 = rel_of(od, o, b1, sizeof(b1));

	if (!r1)
		die("link into the watched directory from outside it");
	int area = area_of(r2);
	BEFORE(OP_CREATE, area);
	int r = real_linkat(od, o, nd, n, flags), e = errno;

	if (r == 0)
		put_rec(R_LINK, 0, 0, 0, NULL, 0, r1, r2);
	AFTER();
	errno = e;
	return r;
}

int link(const char *o, const char *n)
{
	return do_link(AT_FDCWD, o, AT_FDCWD, n, 0);
}

int linkat(int od, const char *o, int nd, const char *n, int flags)
{
	return do_link(od, o, nd, n, flags);
}
