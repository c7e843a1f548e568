/* SPDX-License-Identifier: MIT */
/*
 * mlog.c - the metadata log (mlog.h): its files' layouts, the directory's
 * listing, the writer (appends, log switches, snapshots, retention) and the
 * readers (replay, restore, verify).
 */
#include "meta/mlog.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/hash.h"
#include "base/util.h"

#define NAME_MAX_LEN 40 /* "snap-" + 16 hex + ".ckms.tmp" */

/* ------------------------------------------------------------ layouts */

/*
 * File header, 64 bytes, both kinds:
 *    0  8  magic "CKPTMSNP" (snapshot) / "CKPTMLOG" (log)
 *    8  4  version 1
 *   12  4  header size 64
 *   16  8  base: the commit the snapshot holds / the log follows
 *   24  8  creation time, ns since the epoch
 *   32 16  reserved, zero
 *   48  8  XXH3-64 of bytes 0..47
 *   56  8  reserved, zero
 */
static void hdr_encode(uint8_t out[CKPT_MLOG_HDR_SIZE], const char *magic, uint64_t base)
{
	memset(out, 0, CKPT_MLOG_HDR_SIZE);
	memcpy(out, magic, 8);
	ckpt_put_le32(out + 8, CKPT_MLOG_VERSION);
	ckpt_put_le32(out + 12, CKPT_MLOG_HDR_SIZE);
	ckpt_put_le64(out + 16, base);
	ckpt_put_le64(out + 24, (uint64_t)ckpt_now_ns());
	ckpt_put_le64(out + 48, ckpt_checksum(out, 48));
}

static const char *hdr_check(const uint8_t *h, const char *magic, uint64_t *ret_base)
{
	if (memcmp(h, magic, 8) != 0)
		return "bad magic";
	if (ckpt_get_le32(h + 8) > CKPT_MLOG_VERSION)
		return "newer format version";
	if (ckpt_get_le32(h + 8) != CKPT_MLOG_VERSION ||
	    ckpt_get_le32(h + 12) != CKPT_MLOG_HDR_SIZE)
		return "bad version or header size";
	if (ckpt_get_le64(h + 48) != ckpt_checksum(h, 48))
		return "header checksum mismatch";
	*ret_base = ckpt_get_le64(h + 16);
	return NULL;
}

/*
 * Snapshot block header, 40 bytes, then the payload:
 *    0  4  magic "CKSB"
 *    4  4  payload length
 *    8  4  records in the payload
 *   12  4  flags: 1 = the last block (its payload: le64 record total)
 *   16  8  block index, 0, 1, ...
 *   24  8  XXH3-64 of the payload
 *   32  8  XXH3-64 of bytes 0..31
 * Log record header, 48 bytes, then the payload:
 *    0  4  magic "CKLR"
 *    4  4  payload length
 *    8  8  commit number
 *   16  4  operations in the payload
 *   20  4  reserved, zero
 *   24  8  the engine's stamp once the commit is applied
 *   32  8  XXH3-64 of the payload
 *   40  8  XXH3-64 of bytes 0..39
 * Payloads are sequences of LEB128 lengths and bytes (format.md 10).
 */
#define BLOCK_F_LAST 1u

static void block_hdr_encode(uint8_t out[CKPT_MLOG_BLOCK_HDR_SIZE], uint32_t plen,
			     uint32_t nrec, uint32_t flags, uint64_t idx, uint64_t pcsum)
{
	memcpy(out, CKPT_MLOG_BLOCK_MAGIC, 4);
	ckpt_put_le32(out + 4, plen);
	ckpt_put_le32(out + 8, nrec);
	ckpt_put_le32(out + 12, flags);
	ckpt_put_le64(out + 16, idx);
	ckpt_put_le64(out + 24, pcsum);
	ckpt_put_le64(out + 32, ckpt_checksum(out, 32));
}

static void rec_hdr_encode(uint8_t out[CKPT_MLOG_REC_HDR_SIZE], uint32_t plen, uint64_t num,
			   uint32_t nops, uint64_t stamp, uint64_t pcsum)
{
	memcpy(out, CKPT_MLOG_REC_MAGIC, 4);
	ckpt_put_le32(out + 4, plen);
	ckpt_put_le64(out + 8, num);
	ckpt_put_le32(out + 16, nops);
	ckpt_put_le32(out + 20, 0);
	ckpt_put_le64(out + 24, stamp);
	ckpt_put_le64(out + 32, pcsum);
	ckpt_put_le64(out + 40, ckpt_checksum(out, 40));
}

static size_t leb_put(uint8_t *p, uint64_t v)
{
	size_t n = 0;

	do {
		uint8_t b = v & 0x7f;
		v >>= 7;
		p[n++] = b | (v ? 0x80 : 0);
	} while (v);
	return n;
}

/* 0 and the value, or -1 past end or over 10 bytes. */
static int leb_get(const uint8_t *p, size_t len, size_t *pos, uint64_t *ret)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < 10; i++) {
		uint8_t b;
		if (*pos >= len)
			return -1;
		b = p[(*pos)++];
		v |= (uint64_t)(b & 0x7f) << (7 * i);
		if (!(b & 0x80)) {
			*ret = v;
			return 0;
		}
	}
	return -1;
}

/* A length and that many bytes at p[*pos]. */
static int bytes_get(const uint8_t *p, size_t len, size_t *pos, const uint8_t **ret,
		     size_t *ret_len)
{
	uint64_t n;

	if (leb_get(p, len, pos, &n) < 0 || n > len - *pos)
		return -1;
	*ret = p + *pos;
	*ret_len = (size_t)n;
	*pos += (size_t)n;
	return 0;
}

static int grow(uint8_t **buf, size_t *cap, size_t need)
{
	size_t nc = *cap ? *cap : 256;
	uint8_t *nb;

	if (need <= *cap)
		return 0;
	while (nc < need)
		nc *= 2;
	nb = realloc(*buf, nc);
	if (!nb)
		return -ENOMEM;
	*buf = nb;
	*cap = nc;
	return 0;
}

int ckpt_mlog_op_add(uint8_t **buf, size_t *len, size_t *cap, uint8_t op, const void *k,
		     size_t kl, const void *v, size_t vl)
{
	int r = grow(buf, cap, *len + 1 + 20 + kl + vl);

	if (r < 0)
		return r;
	(*buf)[(*len)++] = op;
	*len += leb_put(*buf + *len, kl);
	memcpy(*buf + *len, k, kl);
	*len += kl;
	if (op == CKPT_MLOG_OP_PUT) {
		*len += leb_put(*buf + *len, vl);
		if (vl)
			memcpy(*buf + *len, v, vl);
		*len += vl;
	}
	return 0;
}

/* Check (sink NULL) or hand over the nops operations of a log payload. */
static int ops_apply(const uint8_t *p, size_t len, uint32_t nops, const struct ckpt_mlog_sink *s,
		     void *ud)
{
	size_t pos = 0;

	for (uint32_t i = 0; i < nops; i++) {
		const uint8_t *k, *v = NULL;
		size_t kl, vl = 0;
		uint8_t op;
		int r;

		if (pos >= len)
			return -EIO;
		op = p[pos++];
		if ((op != CKPT_MLOG_OP_PUT && op != CKPT_MLOG_OP_DEL) ||
		    bytes_get(p, len, &pos, &k, &kl) < 0 ||
		    (op == CKPT_MLOG_OP_PUT && bytes_get(p, len, &pos, &v, &vl) < 0))
			return -EIO;
		if (!s)
			continue;
		r = op == CKPT_MLOG_OP_PUT ? s->put(ud, k, kl, v, vl) : s->del(ud, k, kl);
		if (r < 0)
			return r;
	}
	return pos == len ? 0 : -EIO;
}

/* The same for the nrec records of a snapshot block. */
static int recs_apply(const uint8_t *p, size_t len, uint32_t nrec, const struct ckpt_mlog_sink *s,
		      void *ud)
{
	size_t pos = 0;

	for (uint32_t i = 0; i < nrec; i++) {
		const uint8_t *k, *v;
		size_t kl, vl;
		int r;

		if (bytes_get(p, len, &pos, &k, &kl) < 0 || bytes_get(p, len, &pos, &v, &vl) < 0)
			return -EIO;
		if (s && (r = s->put(ud, k, kl, v, vl)) < 0)
			return r;
	}
	return pos == len ? 0 : -EIO;
}

/* ------------------------------------------------------------ the directory */

enum fkind { F_SNAP, F_LOG };

struct fent {
	enum fkind kind;
	uint64_t base;
	uint64_t size;
};

static void fname(char *buf, size_t len, enum fkind kind, uint64_t base, bool tmp)
{
	snprintf(buf, len, "%s-%016" PRIx64 ".%s%s", kind == F_SNAP ? "snap" : "log", base,
		 kind == F_SNAP ? "ckms" : "ckml", tmp ? ".tmp" : "");
}

/* "snap-<16 hex>.ckms" or "log-<16 hex>.ckml": 1 and the entry, else 0. */
static int parse_name(const char *n, struct fent *e)
{
	const char *hex;
	char *end;

	if (!strncmp(n, "snap-", 5) && strlen(n) == 26 && !strcmp(n + 21, ".ckms")) {
		e->kind = F_SNAP;
		hex = n + 5;
	} else if (!strncmp(n, "log-", 4) && strlen(n) == 25 && !strcmp(n + 20, ".ckml")) {
		e->kind = F_LOG;
		hex = n + 4;
	} else {
		return 0;
	}
	for (int i = 0; i < 16; i++)
		if (!((hex[i] >= '0' && hex[i] <= '9') || (hex[i] >= 'a' && hex[i] <= 'f')))
			return 0;
	e->base = strtoull(hex, &end, 16);
	return 1;
}

static int fent_cmp(const void *a, const void *b)
{
	const struct fent *x = a, *y = b;

	if (x->base != y->base)
		return x->base < y->base ? -1 : 1;
	return (int)x->kind - (int)y->kind; /* a snapshot before the log at its base */
}

/* Every snapshot and log of dfd, sorted by base; with drop_tmp, leftover
 * ".tmp" files of unfinished snapshots are deleted. */
static int list_dir(int dfd, bool drop_tmp, struct fent **ret, size_t *ret_n)
{
	struct fent *v = NULL, e;
	size_t n = 0, cap = 0;
	struct dirent *de;
	DIR *d;
	int r = ckpt_opendir_dup(dfd, &d);

	if (r < 0)
		return r;
	while ((de = readdir(d))) {
		struct stat st;
		size_t l = strlen(de->d_name);

		if (drop_tmp && l > 4 && !strcmp(de->d_name + l - 4, ".tmp") &&
		    (!strncmp(de->d_name, "snap-", 5) || !strncmp(de->d_name, "log-", 4))) {
			unlinkat(dfd, de->d_name, 0);
			continue;
		}
		if (!parse_name(de->d_name, &e))
			continue;
		if (fstatat(dfd, de->d_name, &st, 0) < 0 || !S_ISREG(st.st_mode))
			continue;
		e.size = (uint64_t)st.st_size;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 16;
			struct fent *nv = realloc(v, nc * sizeof(*nv));
			if (!nv) {
				r = -ENOMEM;
				break;
			}
			v = nv;
			cap = nc;
		}
		v[n++] = e;
	}
	closedir(d);
	if (r < 0) {
		free(v);
		return r;
	}
	if (n)
		qsort(v, n, sizeof(*v), fent_cmp);
	*ret = v;
	*ret_n = n;
	return 0;
}

/* ------------------------------------------------------------ reading files */

/* How a walk of one file ended. */
struct walk {
	uint64_t base;  /* from the header */
	uint64_t last;  /* log: the last valid record's number (base if none) */
	uint64_t end;   /* offset after the last valid record or block */
	uint64_t count; /* records (snapshot) or commits (log) read */
	bool header_ok;
	bool clean;     /* read to the end of the file (a snapshot: to its last block) */
	char why[200];  /* otherwise: where and why it stopped */
};

static int open_ro(int dfd, enum fkind kind, uint64_t base, char *name, size_t nlen)
{
	fname(name, nlen, kind, base, false);
	return openat(dfd, name, O_RDONLY | O_CLOEXEC);
}

/* Start a walk of file fd (named name in messages): *w cleared, the
 * file's stat in *st, its header checked against magic into w->base.
 * Returns 0 with w->header_ok set, 0 with w->why set (no valid header), or
 * -errno (fstat). */
static int walk_header(int fd, const char *name, const char *magic, struct stat *st,
		       struct walk *w)
{
	uint8_t h[CKPT_MLOG_HDR_SIZE];
	const char *why;

	memset(w, 0, sizeof(*w));
	if (fstat(fd, st) < 0)
		return -errno;
	if ((uint64_t)st->st_size < CKPT_MLOG_HDR_SIZE ||
	    ckpt_pread_full(fd, h, sizeof(h), 0) < 0) {
		snprintf(w->why, sizeof(w->why), "%s: shorter than its header", name);
		return 0;
	}
	why = hdr_check(h, magic, &w->base);
	if (why) {
		snprintf(w->why, sizeof(w->why), "%s: %s", name, why);
		return 0;
	}
	w->header_ok = true;
	return 0;
}

/*
 * Walk log fd (named name): the records numbered after `from` are handed to
 * sink (NULL: checked only), and the walk stops before the first record
 * that is not valid, whose number is not the next one, or for which
 * stop_at says so (a record numbered after stop_at is left alone, 0: none).
 * Returns 0 with *w filled, or the sink's error.
 */
static int log_walk(int fd, const char *name, uint64_t from, uint64_t stop_at,
		    const struct ckpt_mlog_sink *sink, void *ud, struct walk *w)
{
	uint8_t *buf = NULL;
	size_t cap = 0;
	struct stat st;
	uint64_t off;
	int r = walk_header(fd, name, CKPT_MLOG_LOG_MAGIC, &st, w);

	if (r < 0 || !w->header_ok)
		return r;
	w->last = w->base;
	off = w->end = CKPT_MLOG_HDR_SIZE;
	for (;;) {
		uint8_t rh[CKPT_MLOG_REC_HDR_SIZE];
		uint64_t num;
		uint32_t plen, nops;

		if (off == (uint64_t)st.st_size) {
			w->clean = true;
			break;
		}
		if ((uint64_t)st.st_size - off < sizeof(rh) ||
		    ckpt_pread_full(fd, rh, sizeof(rh), off) < 0) {
			snprintf(w->why, sizeof(w->why), "%s: offset %" PRIu64 ": torn record header",
				 name, off);
			break;
		}
		plen = ckpt_get_le32(rh + 4);
		num = ckpt_get_le64(rh + 8);
		nops = ckpt_get_le32(rh + 16);
		if (memcmp(rh, CKPT_MLOG_REC_MAGIC, 4) != 0 ||
		    ckpt_get_le64(rh + 40) != ckpt_checksum(rh, 40) || plen > CKPT_MLOG_PAYLOAD_MAX) {
			snprintf(w->why, sizeof(w->why), "%s: offset %" PRIu64 ": bad record header",
				 name, off);
			break;
		}
		if (num != w->last + 1) {
			snprintf(w->why, sizeof(w->why),
				 "%s: offset %" PRIu64 ": record %" PRIu64 " where %" PRIu64
				 " should follow",
				 name, off, num, w->last + 1);
			break;
		}
		if (stop_at && num > stop_at)
			break;
		if ((uint64_t)st.st_size - off - sizeof(rh) < plen) {
			snprintf(w->why, sizeof(w->why), "%s: offset %" PRIu64 ": torn record %" PRIu64,
				 name, off, num);
			break;
		}
		r = grow(&buf, &cap, plen ? plen : 1);
		if (r < 0)
			break;
		if (ckpt_pread_full(fd, buf, plen, off + sizeof(rh)) < 0 ||
		    ckpt_get_le64(rh + 32) != ckpt_checksum(buf, plen) ||
		    ops_apply(buf, plen, nops, NULL, NULL) < 0) {
			snprintf(w->why, sizeof(w->why),
				 "%s: offset %" PRIu64 ": record %" PRIu64 " is damaged", name, off, num);
			break;
		}
		if (sink && num > from) {
			r = ops_apply(buf, plen, nops, sink, ud);
			if (r == 0)
				r = sink->mark(ud, num, ckpt_get_le64(rh + 24));
			if (r < 0)
				break;
		}
		w->last = num;
		w->count++;
		off += sizeof(rh) + plen;
		w->end = off;
	}
	free(buf);
	return r;
}

/* Walk snapshot fd: check every block (sink NULL) or hand its records to
 * sink, then mark(base).  Returns 0 with *w (clean: intact to its last
 * block), or the sink's error. */
static int snap_walk(int fd, const char *name, const struct ckpt_mlog_sink *sink, void *ud,
		     struct walk *w)
{
	uint8_t *buf = NULL;
	size_t cap = 0;
	uint64_t off = CKPT_MLOG_HDR_SIZE, idx = 0;
	struct stat st;
	int r = walk_header(fd, name, CKPT_MLOG_SNAP_MAGIC, &st, w);

	if (r < 0 || !w->header_ok)
		return r;
	for (;; idx++) {
		uint8_t bh[CKPT_MLOG_BLOCK_HDR_SIZE];
		uint32_t plen, nrec, flags;

		if ((uint64_t)st.st_size - off < sizeof(bh) ||
		    ckpt_pread_full(fd, bh, sizeof(bh), off) < 0) {
			snprintf(w->why, sizeof(w->why), "%s: offset %" PRIu64 ": ends before its last block",
				 name, off);
			break;
		}
		plen = ckpt_get_le32(bh + 4);
		nrec = ckpt_get_le32(bh + 8);
		flags = ckpt_get_le32(bh + 12);
		if (memcmp(bh, CKPT_MLOG_BLOCK_MAGIC, 4) != 0 ||
		    ckpt_get_le64(bh + 32) != ckpt_checksum(bh, 32) || plen > CKPT_MLOG_PAYLOAD_MAX ||
		    ckpt_get_le64(bh + 16) != idx || (flags & ~BLOCK_F_LAST) ||
		    (uint64_t)st.st_size - off - sizeof(bh) < plen) {
			snprintf(w->why, sizeof(w->why), "%s: offset %" PRIu64 ": bad block header",
				 name, off);
			break;
		}
		r = grow(&buf, &cap, plen ? plen : 1);
		if (r < 0)
			break;
		if (ckpt_pread_full(fd, buf, plen, off + sizeof(bh)) < 0 ||
		    ckpt_get_le64(bh + 24) != ckpt_checksum(buf, plen)) {
			snprintf(w->why, sizeof(w->why), "%s: offset %" PRIu64 ": block %" PRIu64
				 " is damaged", name, off, idx);
			break;
		}
		off += sizeof(bh) + plen;
		if (flags & BLOCK_F_LAST) {
			if (plen != 8 || nrec != 0 || ckpt_get_le64(buf) != w->count ||
			    off != (uint64_t)st.st_size) {
				snprintf(w->why, sizeof(w->why), "%s: last block does not match the "
					 "records before it", name);
				break;
			}
			w->clean = true;
			w->end = off;
			if (sink)
				r = sink->mark(ud, w->base, 0);
			break;
		}
		if (recs_apply(buf, plen, nrec, NULL, NULL) < 0) {
			snprintf(w->why, sizeof(w->why), "%s: block %" PRIu64 " is malformed", name,
				 idx);
			break;
		}
		if (sink && (r = recs_apply(buf, plen, nrec, sink, ud)) < 0)
			break;
		w->count += nrec;
		w->end = off;
	}
	free(buf);
	return r;
}

/* ------------------------------------------------------------ the writer */

/* A log file being appended to, shared by appenders and syncs. */
struct lfile {
	int fd;
	unsigned refs; /* under ckpt_mlog.lock */
	uint64_t base;
};

struct ckpt_mlog {
	char *dir;
	int dfd;
	/* Set by open, used until start (single-threaded): */
	struct fent *files;
	size_t nfiles;
	bool have_last;
	uint64_t found_last;  /* last valid commit of the newest log (or newest snapshot) */
	uint64_t found_end;   /* end of the newest log's last valid record */
	uint64_t found_base;  /* base of the newest log */
	bool found_log;       /* a newest log with a valid header exists */
	uint64_t highest;

	pthread_mutex_t lock;
	/* Protected by lock: */
	struct lfile *cur;   /* NULL before start and while broken */
	uint64_t off;        /* the end of cur */
	uint64_t alloc_end;  /* cur's blocks are allocated up to here (>= off; prealloc) */
	uint64_t last;       /* the last commit appended */
	uint64_t undo_off;   /* before the last append */
	bool broken;
	uint64_t log_bytes;  /* bytes of the logs since the newest snapshot */
	uint64_t snap_size;  /* the newest snapshot's bytes */
	bool have_snap;
	/* Serializes snapshots (ckpt_msnap_begin .. _end). */
	pthread_mutex_t snap_lock;
};

struct ckpt_msnap {
	ckpt_mlog *m;
	int fd;
	uint64_t base, off, idx, count;
	uint8_t *buf;
	size_t len, cap;
	uint32_t nrec;
	int err;
};

/* The current log keeps MLOG_PREALLOC bytes allocated past its end (fallocate with
 * FALLOC_FL_KEEP_SIZE: the size, and so every reader, is unchanged), topped up when less than
 * half of it is left.  When the file system fills up, the commits that give space back
 * (unlinks, truncates, gc) still find room for their records; without the allocation each
 * record needs a free block.  A truncation of the log frees the allocation past the new end,
 * so alloc_end is reset to it.  Called with m->lock held. */
#define MLOG_PREALLOC (256u << 10)

static void prealloc(ckpt_mlog *m, uint64_t end)
{
	uint64_t want = end + MLOG_PREALLOC;

	if (m->alloc_end >= end + MLOG_PREALLOC / 2)
		return;
	if (fallocate(m->cur->fd, FALLOC_FL_KEEP_SIZE, (off_t)end, (off_t)(want - end)) == 0)
		m->alloc_end = want;
	/* Otherwise (no space, or a file system without fallocate) the appends go on without;
	 * what is left of the last allocation still serves them. */
}

static void lfile_put(ckpt_mlog *m, struct lfile *f)
{
	bool last;

	if (!f)
		return;
	pthread_mutex_lock(&m->lock);
	last = --f->refs == 0;
	pthread_mutex_unlock(&m->lock);
	if (last) {
		close(f->fd);
		free(f);
	}
}

const char *ckpt_mlog_dir(const ckpt_mlog *m)
{
	return m->dir;
}

int ckpt_mlog_open(const char *dir, ckpt_mlog **ret, char *err, size_t errlen)
{
	ckpt_mlog *m = calloc(1, sizeof(*m));
	int r;

	if (!m)
		return -ENOMEM;
	m->dfd = -1;
	pthread_mutex_init(&m->lock, NULL);
	pthread_mutex_init(&m->snap_lock, NULL);
	m->dir = strdup(dir);
	if (!m->dir) {
		r = -ENOMEM;
		goto fail;
	}
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		r = -errno;
		ckpt_errf(err, errlen, "%s: cannot create the metadata log directory: %s", dir,
			  strerror(errno));
		goto fail;
	}
	m->dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (m->dfd < 0) {
		r = -errno;
		ckpt_errf(err, errlen, "%s: %s", dir, strerror(errno));
		goto fail;
	}
	r = list_dir(m->dfd, true, &m->files, &m->nfiles);
	if (r < 0) {
		ckpt_errf(err, errlen, "%s: cannot list: %s", dir, strerror(-r));
		goto fail;
	}
	/* the newest log with a valid header, walked to its last valid record */
	for (size_t i = m->nfiles; i-- > 0;) {
		char name[NAME_MAX_LEN];
		struct walk w;
		int fd;

		if (m->files[i].base > m->highest)
			m->highest = m->files[i].base;
		if (m->files[i].kind != F_LOG || m->found_log)
			continue;
		fd = open_ro(m->dfd, F_LOG, m->files[i].base, name, sizeof(name));
		if (fd < 0)
			continue;
		r = log_walk(fd, name, UINT64_MAX, 0, NULL, NULL, &w);
		close(fd);
		if (r < 0)
			goto fail;
		if (!w.header_ok || w.base != m->files[i].base) {
			if (w.why[0])
				ckpt_warn("%s/%s: not a valid log; a new log is started", dir, w.why);
			else
				ckpt_warn("%s/%s: its base differs from its name; a new log is started",
					  dir, name);
			continue;
		}
		if (!w.clean)
			ckpt_warn("%s/%s: the log ends at commit %" PRIu64, dir, w.why, w.last);
		m->found_log = true;
		m->found_base = w.base;
		m->found_last = w.last;
		m->found_end = w.end;
		if (w.last > m->highest)
			m->highest = w.last;
	}
	for (size_t i = 0; i < m->nfiles; i++) {
		if (m->files[i].kind == F_SNAP) {
			m->have_snap = true;
			m->snap_size = m->files[i].size;
			m->log_bytes = 0;
		} else {
			m->log_bytes += m->files[i].size;
		}
	}
	/* a snapshot newer than every log: its base is the last commit */
	for (size_t i = m->nfiles; i-- > 0;) {
		if (m->files[i].kind != F_SNAP)
			continue;
		if (!m->found_log || m->files[i].base > m->found_last) {
			m->found_last = m->files[i].base;
			m->found_log = false;
		}
		break;
	}
	m->have_last = m->found_log || m->have_snap;
	*ret = m;
	return 0;
fail:
	ckpt_mlog_close(m);
	return r;
}

int ckpt_mlog_last(ckpt_mlog *m, uint64_t *ret_last)
{
	if (!m->have_last)
		return -ENOENT;
	*ret_last = m->found_last;
	return 0;
}

uint64_t ckpt_mlog_highest(ckpt_mlog *m)
{
	return m->highest;
}

/* Walk the logged commits numbered after `after`, up to the newest log's
 * last, handing them to sink (NULL: check only).  -ENOENT when the logs do
 * not hold every one of them (a gap, a damaged record), or the sink's
 * error. */
static int chain_walk(ckpt_mlog *m, uint64_t after, const struct ckpt_mlog_sink *sink, void *ud)
{
	size_t first = SIZE_MAX;
	uint64_t next = after;
	int r = 0;

	if (!m->have_last || after > m->found_last)
		return -ENOENT;
	/* the log holding commit after + 1: the last one starting at or
	 * before `after` */
	for (size_t i = m->nfiles; i-- > 0;)
		if (m->files[i].kind == F_LOG && m->files[i].base <= after) {
			first = i;
			break;
		}
	if (first == SIZE_MAX)
		return after == m->found_last ? 0 : -ENOENT;
	for (size_t i = first; i < m->nfiles && next < m->found_last; i++) {
		char name[NAME_MAX_LEN];
		struct walk w;
		int fd;

		if (m->files[i].kind != F_LOG)
			continue;
		if (m->files[i].base > next)
			return -ENOENT; /* a gap */
		fd = open_ro(m->dfd, F_LOG, m->files[i].base, name, sizeof(name));
		if (fd < 0)
			return -ENOENT;
		r = log_walk(fd, name, next, m->found_last, sink, ud, &w);
		close(fd);
		if (r < 0)
			return r;
		if (w.header_ok && w.last > next)
			next = w.last;
	}
	return next < m->found_last ? -ENOENT : 0;
}

int ckpt_mlog_replay_after(ckpt_mlog *m, uint64_t after, const struct ckpt_mlog_sink *sink,
			   void *ud)
{
	/* check the whole chain first: nothing is handed over unless all of
	 * it is there */
	int r = chain_walk(m, after, NULL, NULL);

	return r < 0 ? r : chain_walk(m, after, sink, ud);
}

struct find {
	uint64_t stamp, first_stamp, number;
	bool any, found;
};

static int find_put(void *ud, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl)
{
	return 0;
}

static int find_del(void *ud, const uint8_t *k, size_t kl)
{
	return 0;
}

static int find_mark(void *ud, uint64_t number, uint64_t stamp)
{
	struct find *f = ud;

	if (!f->any)
		f->first_stamp = stamp;
	f->any = true;
	if (stamp == f->stamp) {
		f->number = number;
		f->found = true;
		return -ECANCELED; /* found: stop */
	}
	return 0;
}

int ckpt_mlog_locate(ckpt_mlog *m, uint64_t after, uint64_t stamp, uint64_t *ret_number)
{
	static const struct ckpt_mlog_sink sink = { find_put, find_del, find_mark };
	struct find f = { .stamp = stamp };
	int r;

	if (!m->have_last || after > m->found_last)
		return -ENOENT;
	r = chain_walk(m, after, &sink, &f);
	if (f.found) {
		*ret_number = f.number;
		return 0;
	}
	if (r < 0 && r != -ENOENT)
		return r;
	if (!f.any || stamp < f.first_stamp) {
		*ret_number = after; /* none of the commits after `after` */
		return 0;
	}
	return -ENOENT;
}

/* Create log-base with its header, replacing one there. */
static int log_create(ckpt_mlog *m, uint64_t base, struct lfile **ret)
{
	uint8_t h[CKPT_MLOG_HDR_SIZE];
	char name[NAME_MAX_LEN];
	struct lfile *f = calloc(1, sizeof(*f));
	int r;

	if (!f)
		return -ENOMEM;
	fname(name, sizeof(name), F_LOG, base, false);
	f->fd = openat(m->dfd, name, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (f->fd < 0) {
		r = -errno;
		free(f);
		ckpt_err("%s/%s: cannot create: %s", m->dir, name, strerror(-r));
		return r;
	}
	hdr_encode(h, CKPT_MLOG_LOG_MAGIC, base);
	r = ckpt_pwrite_full(f->fd, h, sizeof(h), 0);
	if (r < 0) {
		ckpt_err("%s/%s: cannot write: %s", m->dir, name, strerror(-r));
		close(f->fd);
		unlinkat(m->dfd, name, 0);
		free(f);
		return r;
	}
	f->refs = 1;
	f->base = base;
	*ret = f;
	return 0;
}

int ckpt_mlog_start(ckpt_mlog *m, uint64_t base)
{
	struct lfile *f = NULL;
	char name[NAME_MAX_LEN];
	int r;

	if (m->found_log && m->found_last == base && m->found_base < base) {
		/* continue the newest log after its last valid record */
		f = calloc(1, sizeof(*f));
		if (!f)
			return -ENOMEM;
		fname(name, sizeof(name), F_LOG, m->found_base, false);
		f->fd = openat(m->dfd, name, O_RDWR | O_CLOEXEC);
		if (f->fd < 0 || ftruncate(f->fd, (off_t)m->found_end) < 0) {
			r = -errno;
			ckpt_err("%s/%s: cannot open for appending: %s", m->dir, name,
				 strerror(-r));
			if (f->fd >= 0)
				close(f->fd);
			free(f);
			return r;
		}
		f->refs = 1;
		f->base = m->found_base;
		m->off = m->found_end;
	} else {
		r = log_create(m, base, &f);
		if (r < 0)
			return r;
		m->off = CKPT_MLOG_HDR_SIZE;
		m->log_bytes += CKPT_MLOG_HDR_SIZE;
		if (fsync(f->fd) < 0 || fsync(m->dfd) < 0) {
			r = -errno;
			ckpt_err("%s: cannot sync the new log: %s", m->dir, strerror(-r));
			close(f->fd);
			free(f);
			return r;
		}
	}
	pthread_mutex_lock(&m->lock);
	m->cur = f;
	m->last = base;
	m->undo_off = m->off;
	m->alloc_end = m->off;
	prealloc(m, m->off);
	pthread_mutex_unlock(&m->lock);
	return 0;
}

int ckpt_mlog_append(ckpt_mlog *m, const uint8_t *ops, size_t len, uint32_t nops,
		     uint64_t stamp, uint64_t *ret_number)
{
	uint8_t h[CKPT_MLOG_REC_HDR_SIZE];
	struct iovec iov[2];
	uint64_t num, off;
	size_t done = 0, total = sizeof(h) + len;
	int r = 0;

	if (len > CKPT_MLOG_PAYLOAD_MAX)
		return -EFBIG;
	pthread_mutex_lock(&m->lock);
	if (m->broken || !m->cur) {
		pthread_mutex_unlock(&m->lock);
		return -ESTALE;
	}
	num = m->last + 1;
	off = m->off;
	prealloc(m, off + total);
	rec_hdr_encode(h, (uint32_t)len, num, nops, stamp, ckpt_checksum(ops, len));
	while (done < total) {
		ssize_t n;
		int cnt = 0;
		if (done < sizeof(h)) {
			iov[cnt++] = (struct iovec){ h + done, sizeof(h) - done };
			iov[cnt++] = (struct iovec){ (void *)ops, len };
		} else {
			iov[cnt++] = (struct iovec){ (void *)(ops + done - sizeof(h)),
						     total - done };
		}
		n = pwritev(m->cur->fd, iov, cnt, (off_t)(off + done));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r = n < 0 ? -errno : -ENOSPC;
			break;
		}
		done += (size_t)n;
	}
	if (r < 0) {
		/* nothing of it may stay: a later record would follow garbage */
		if (done && ftruncate(m->cur->fd, (off_t)off) < 0) {
			ckpt_err("%s: cannot cut off a failed log record (%s); the log is broken "
				 "until the next snapshot", m->dir, strerror(errno));
			m->broken = true;
		} else if (done) {
			m->alloc_end = off;
		}
		pthread_mutex_unlock(&m->lock);
		ckpt_err("%s: cannot append to the metadata log: %s", m->dir, strerror(-r));
		return r;
	}
	m->undo_off = off;
	m->off = off + total;
	m->last = num;
	m->log_bytes += total;
	pthread_mutex_unlock(&m->lock);
	*ret_number = num;
	return 0;
}

void ckpt_mlog_unappend(ckpt_mlog *m)
{
	pthread_mutex_lock(&m->lock);
	if (m->cur && !m->broken && m->off > m->undo_off) {
		if (ftruncate(m->cur->fd, (off_t)m->undo_off) < 0) {
			ckpt_err("%s: cannot take back a log record (%s); the log is broken until "
				 "the next snapshot", m->dir, strerror(errno));
			m->broken = true;
		} else {
			m->log_bytes -= m->off - m->undo_off;
			m->off = m->undo_off;
			m->alloc_end = m->off;
			m->last--;
		}
	}
	pthread_mutex_unlock(&m->lock);
}

void ckpt_mlog_break(ckpt_mlog *m)
{
	pthread_mutex_lock(&m->lock);
	if (!m->broken)
		ckpt_err("%s: the metadata log no longer matches the engine; it is broken until "
			 "the next snapshot", m->dir);
	m->broken = true;
	pthread_mutex_unlock(&m->lock);
}

bool ckpt_mlog_broken(ckpt_mlog *m)
{
	bool b;

	pthread_mutex_lock(&m->lock);
	b = m->broken;
	pthread_mutex_unlock(&m->lock);
	return b;
}

int ckpt_mlog_sync(ckpt_mlog *m)
{
	struct lfile *f;
	int r = 0;

	pthread_mutex_lock(&m->lock);
	f = m->cur;
	if (f)
		f->refs++;
	pthread_mutex_unlock(&m->lock);
	if (f && fdatasync(f->fd) < 0) {
		r = -errno;
		ckpt_err("%s: cannot sync the metadata log: %s", m->dir, strerror(-r));
	}
	lfile_put(m, f);
	return r;
}

bool ckpt_mlog_due(ckpt_mlog *m)
{
	bool due;

	pthread_mutex_lock(&m->lock);
	due = m->broken || !m->have_snap ||
	      (m->log_bytes > CKPT_MLOG_SNAP_MIN_LOG && m->log_bytes > 2 * m->snap_size);
	pthread_mutex_unlock(&m->lock);
	return due;
}

int ckpt_mlog_switch(ckpt_mlog *m, uint64_t *ret_base)
{
	struct lfile *f, *old;
	uint64_t base;
	bool broken;
	int r;

	pthread_mutex_lock(&m->lock);
	base = m->last;
	old = m->cur;
	broken = m->broken;
	pthread_mutex_unlock(&m->lock);
	if (old && old->base == base && !broken) {
		*ret_base = base; /* the current log holds nothing yet: keep it */
		return 0;
	}
	/* After a broken log the engine made commits no log holds: skip a
	 * number, so that no restore chains the old log to the new one. */
	if (broken)
		base++;
	r = log_create(m, base, &f);
	if (r < 0)
		return r;
	pthread_mutex_lock(&m->lock);
	m->cur = f;
	m->off = m->undo_off = m->alloc_end = CKPT_MLOG_HDR_SIZE;
	prealloc(m, m->off);
	m->last = base;
	m->broken = false;
	pthread_mutex_unlock(&m->lock);
	if (old) {
		if (fdatasync(old->fd) < 0)
			ckpt_warn("%s: cannot sync the log before %016" PRIx64 ": %s", m->dir, base,
				  strerror(errno));
		lfile_put(m, old);
	}
	*ret_base = base;
	return 0;
}

static int snap_flush(ckpt_msnap *w, bool last)
{
	uint8_t h[CKPT_MLOG_BLOCK_HDR_SIZE], tot[8];
	const uint8_t *p = w->buf;
	size_t len = w->len;
	int r;

	if (last) {
		ckpt_put_le64(tot, w->count);
		p = tot;
		len = sizeof(tot);
	}
	block_hdr_encode(h, (uint32_t)len, last ? 0 : w->nrec, last ? BLOCK_F_LAST : 0, w->idx,
			 ckpt_checksum(p, len));
	r = ckpt_pwrite_full(w->fd, h, sizeof(h), w->off);
	if (r == 0)
		r = ckpt_pwrite_full(w->fd, p, len, w->off + sizeof(h));
	if (r < 0)
		return r;
	w->off += sizeof(h) + len;
	w->idx++;
	w->len = 0;
	w->nrec = 0;
	return 0;
}

int ckpt_msnap_begin(ckpt_mlog *m, uint64_t base, ckpt_msnap **ret)
{
	uint8_t h[CKPT_MLOG_HDR_SIZE];
	char name[NAME_MAX_LEN];
	ckpt_msnap *w = calloc(1, sizeof(*w));
	int r;

	if (!w)
		return -ENOMEM;
	pthread_mutex_lock(&m->snap_lock);
	w->m = m;
	w->base = base;
	fname(name, sizeof(name), F_SNAP, base, true);
	w->fd = openat(m->dfd, name, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (w->fd < 0) {
		r = -errno;
		goto fail;
	}
	hdr_encode(h, CKPT_MLOG_SNAP_MAGIC, base);
	r = ckpt_pwrite_full(w->fd, h, sizeof(h), 0);
	if (r < 0)
		goto fail;
	w->off = CKPT_MLOG_HDR_SIZE;
	*ret = w;
	return 0;
fail:
	ckpt_err("%s/%s: cannot write a snapshot: %s", m->dir, name, strerror(-r));
	if (w->fd >= 0) {
		close(w->fd);
		unlinkat(m->dfd, name, 0);
	}
	pthread_mutex_unlock(&m->snap_lock);
	free(w);
	return r;
}

int ckpt_msnap_add(ckpt_msnap *w, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl)
{
	int r;

	if (w->err)
		return w->err;
	r = grow(&w->buf, &w->cap, w->len + 20 + kl + vl);
	if (r == 0) {
		w->len += leb_put(w->buf + w->len, kl);
		memcpy(w->buf + w->len, k, kl);
		w->len += kl;
		w->len += leb_put(w->buf + w->len, vl);
		if (vl)
			memcpy(w->buf + w->len, v, vl);
		w->len += vl;
		w->nrec++;
		w->count++;
		if (w->len >= CKPT_MLOG_BLOCK_TARGET)
			r = snap_flush(w, false);
	}
	if (r < 0)
		w->err = r;
	return r;
}

/* Drop the files no restore needs: snapshots older than the two newest,
 * and the logs before the one a restore from the older of them starts
 * with. */
static void retire(ckpt_mlog *m)
{
	struct fent *v = NULL;
	size_t n = 0, nsnap = 0;
	uint64_t keep_from = 0;
	char name[NAME_MAX_LEN];

	if (list_dir(m->dfd, false, &v, &n) < 0)
		return;
	for (size_t i = n; i-- > 0;)
		if (v[i].kind == F_SNAP && ++nsnap == 2) {
			keep_from = v[i].base;
			break;
		}
	if (nsnap < 2) {
		free(v);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		bool drop;
		if (v[i].kind == F_SNAP) {
			drop = v[i].base < keep_from;
		} else {
			/* a log is needed if the next log starts after keep_from */
			size_t j = i + 1;
			while (j < n && v[j].kind != F_LOG)
				j++;
			drop = j < n && v[j].base <= keep_from;
		}
		if (!drop)
			continue;
		fname(name, sizeof(name), v[i].kind, v[i].base, false);
		if (unlinkat(m->dfd, name, 0) < 0)
			ckpt_warn("%s/%s: cannot delete: %s", m->dir, name, strerror(errno));
	}
	free(v);
}

int ckpt_msnap_end(ckpt_msnap *w, bool keep)
{
	ckpt_mlog *m;
	char tmp[NAME_MAX_LEN], name[NAME_MAX_LEN];
	int r;

	if (!w)
		return 0;
	m = w->m;
	r = w->err;
	fname(tmp, sizeof(tmp), F_SNAP, w->base, true);
	fname(name, sizeof(name), F_SNAP, w->base, false);
	if (keep && r == 0 && w->len)
		r = snap_flush(w, false);
	if (keep && r == 0)
		r = snap_flush(w, true);
	if (keep && r == 0 && fdatasync(w->fd) < 0)
		r = -errno;
	if (keep && r == 0 && renameat(m->dfd, tmp, m->dfd, name) < 0)
		r = -errno;
	if (keep && r == 0 && fsync(m->dfd) < 0)
		r = -errno;
	close(w->fd);
	if (!keep || r < 0) {
		unlinkat(m->dfd, tmp, 0);
		if (keep)
			ckpt_err("%s/%s: cannot write a snapshot: %s", m->dir, name, strerror(-r));
	} else {
		/* the logs since this snapshot: the one it starts */
		pthread_mutex_lock(&m->lock);
		m->have_snap = true;
		m->snap_size = w->off;
		m->log_bytes = m->off;
		pthread_mutex_unlock(&m->lock);
		retire(m);
	}
	pthread_mutex_unlock(&m->snap_lock);
	free(w->buf);
	free(w);
	return keep ? r : 0;
}

void ckpt_mlog_close(ckpt_mlog *m)
{
	if (!m)
		return;
	if (m->cur) {
		if (fdatasync(m->cur->fd) < 0)
			ckpt_err("%s: cannot sync the metadata log: %s", m->dir, strerror(errno));
		lfile_put(m, m->cur);
	}
	if (m->dfd >= 0)
		close(m->dfd);
	pthread_mutex_destroy(&m->lock);
	pthread_mutex_destroy(&m->snap_lock);
	free(m->files);
	free(m->dir);
	free(m);
}

/* ------------------------------------------------------------ readers */

/* Restore (sink) or verify (NULL) from the directory's snapshot at index
 * si of v[0..n): the snapshot, then the logs after it.  Fills rep. */
static int restore_from(int dfd, const char *dir, struct fent *v, size_t n, size_t si,
			uint64_t records, const struct ckpt_mlog_sink *sink, void *ud,
			struct ckpt_mlog_report *rep)
{
	char name[NAME_MAX_LEN];
	struct walk w;
	uint64_t next;
	size_t first = SIZE_MAX;
	int fd, r;

	if (sink) {
		fd = open_ro(dfd, F_SNAP, v[si].base, name, sizeof(name));
		if (fd < 0)
			return -errno;
		r = snap_walk(fd, name, sink, ud, &w);
		close(fd);
		if (r < 0)
			return r;
		if (!w.clean) /* changed under us */
			return -EIO;
	}
	rep->found = true;
	rep->snap_base = rep->last = v[si].base;
	rep->records = records;
	rep->complete = true;
	next = v[si].base;
	/* the log that holds the commit after the snapshot: the last one
	 * starting at or before it */
	for (size_t i = 0; i < n; i++)
		if (v[i].kind == F_LOG && v[i].base <= next)
			first = i;
	for (size_t i = first; first != SIZE_MAX && i < n; i++) {
		if (v[i].kind != F_LOG)
			continue;
		if (v[i].base > next) {
			snprintf(rep->problem, sizeof(rep->problem),
				 "%s: no log holds commit %" PRIu64 " (the next log starts after %"
				 PRIu64 ")", dir, next + 1, v[i].base);
			rep->complete = false;
			break;
		}
		fd = open_ro(dfd, F_LOG, v[i].base, name, sizeof(name));
		if (fd < 0) {
			snprintf(rep->problem, sizeof(rep->problem), "%s/%s: %s", dir, name,
				 strerror(errno));
			rep->complete = false;
			break;
		}
		r = log_walk(fd, name, next, 0, sink, ud, &w);
		close(fd);
		if (r < 0)
			return r;
		if (w.header_ok && w.last > next) {
			rep->commits += w.last - next;
			next = w.last;
		}
		if (!w.clean) {
			snprintf(rep->problem, sizeof(rep->problem), "%s/%s", dir, w.why);
			rep->complete = false;
			break;
		}
	}
	rep->last = next;
	return 0;
}

static int restore(const char *dir, const struct ckpt_mlog_sink *sink, void *ud,
		   struct ckpt_mlog_report *rep)
{
	struct fent *v = NULL;
	size_t n = 0;
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), r;

	memset(rep, 0, sizeof(*rep));
	if (dfd < 0)
		return -errno;
	r = list_dir(dfd, false, &v, &n);
	if (r < 0) {
		close(dfd);
		return r;
	}
	for (size_t i = n; i-- > 0;) {
		char name[NAME_MAX_LEN];
		struct walk w;
		int fd;

		if (v[i].kind != F_SNAP)
			continue;
		/* verify the snapshot whole before anything is handed over */
		fd = open_ro(dfd, F_SNAP, v[i].base, name, sizeof(name));
		if (fd < 0)
			continue;
		r = snap_walk(fd, name, NULL, NULL, &w);
		close(fd);
		if (r < 0)
			break;
		if (!w.clean || w.base != v[i].base) {
			if (!rep->problem[0])
				snprintf(rep->problem, sizeof(rep->problem), "%s/%s", dir,
					 w.why[0] ? w.why : "snapshot base differs from its name");
			rep->snaps_damaged++;
			continue;
		}
		{
			char first_problem[sizeof(rep->problem)];
			unsigned damaged = rep->snaps_damaged;

			memcpy(first_problem, rep->problem, sizeof(first_problem));
			r = restore_from(dfd, dir, v, n, i, w.count, sink, ud, rep);
			rep->snaps_damaged = damaged;
			if (damaged) {
				memcpy(rep->problem, first_problem, sizeof(first_problem));
				rep->complete = false;
			}
		}
		break;
	}
	if (r == 0 && !rep->found && !rep->problem[0])
		snprintf(rep->problem, sizeof(rep->problem), "%s: no snapshot", dir);
	free(v);
	close(dfd);
	return r;
}

int ckpt_mlog_restore(const char *dir, const struct ckpt_mlog_sink *sink, void *ud,
		      struct ckpt_mlog_report *rep)
{
	return restore(dir, sink, ud, rep);
}

int ckpt_mlog_verify(const char *dir, struct ckpt_mlog_report *rep)
{
	return restore(dir, NULL, NULL, rep);
}
