/* SPDX-License-Identifier: MIT */
/*
 * file.c - writers (see file.h).
 *
 * Invariants (under w->lock):
 *  W1. STREAM: the content is cs.list (extents for [0, cs.start)) followed
 *      by cs.buf[cs.head .. cs.head + cs.len) (bytes not yet cut).
 *      Extents whose chunk job is still queued have a zero digest; jobs
 *      fill them in and decrement w->inflight.  No reader of cs.list looks
 *      at an extent while w->inflight > 0 (they wait first).
 *  W2. STAGED: the content is the scratch file w->fd, size w->size.
 *  W3. w->err != 0 => every write and commit fails with it.
 *  W4. STREAM: w->zero_to is 0 or past cs.start + cs.len, and the content
 *      ends in zeros up to it (a file extended by truncate or fallocate
 *      while it streams: writes at the stream's end keep streaming).
 *  W5. STREAM: w->park holds writes that arrived past the stream's end,
 *      sorted by offset, not overlapping, all past cs.start + cs.len, at
 *      most PARK_MAX bytes; they are fed in order once the stream reaches
 *      them.  The content is W1's, then W4's zeros, with the parked bytes
 *      written over them.
 *
 * Why parking and re-sent bytes: the kernel's writeback cache sends a file
 * written in small pieces as page-aligned writes of up to 1 MiB, several in
 * flight at once, which the daemon's threads may handle out of order, and
 * a partial last page is sent again once the rest of it is written.  A
 * write past the stream's end is parked until the gap is filled, and a
 * write over bytes the stream already has is accepted when it carries the
 * same bytes; only a real overwrite goes to STAGED.
 */
#include "store/file.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chunk/chunker.h"
#include "views/safetensors.h"
#include "base/util.h"

/* ------------------------------------------------------------------ pool */

struct job {
	struct ckpt_writer *w;
	struct ckpt_extent_list *list; /* list whose slot receives the digest */
	size_t slot;
	uint8_t *data;
	size_t len;
	unsigned elem_size;
	struct job *next;
};

struct ckpt_pool {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	/* Protected by lock: */
	struct job *head, *tail;
	bool stop;
	/* Immutable after new: */
	pthread_t *threads;
	unsigned nthreads;
};

static void job_run(struct job *j);

static void *pool_main(void *arg)
{
	struct ckpt_pool *p = arg;

	for (;;) {
		struct job *j;

		pthread_mutex_lock(&p->lock);
		while (!p->head && !p->stop)
			pthread_cond_wait(&p->cond, &p->lock);
		j = p->head;
		if (j) {
			p->head = j->next;
			if (!p->head)
				p->tail = NULL;
		}
		pthread_mutex_unlock(&p->lock);
		if (!j)
			return NULL;
		job_run(j);
	}
}

int ckpt_pool_new(unsigned nthreads, ckpt_pool **ret_pool)
{
	struct ckpt_pool *p = calloc(1, sizeof(*p));
	int r;

	if (!p)
		return -ENOMEM;
	if (nthreads == 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		nthreads = n > 0 ? (unsigned)n : 2;
	}
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	p->threads = calloc(nthreads, sizeof(*p->threads));
	if (!p->threads) {
		free(p);
		return -ENOMEM;
	}
	r = ckpt_threads_start(p->threads, nthreads, pool_main, p);
	if (r < 0) {
		ckpt_pool_free(p);
		return r;
	}
	p->nthreads = (unsigned)r;
	*ret_pool = p;
	return 0;
}

void ckpt_pool_free(ckpt_pool *p)
{
	if (!p)
		return;
	ckpt_threads_stop(&p->lock, &p->cond, &p->stop, p->threads, p->nthreads);
	free(p->threads);
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->cond);
	free(p);
}

static void pool_submit(ckpt_pool *p, struct job *j)
{
	j->next = NULL;
	pthread_mutex_lock(&p->lock);
	if (p->tail)
		p->tail->next = j;
	else
		p->head = j;
	p->tail = j;
	pthread_cond_signal(&p->cond);
	pthread_mutex_unlock(&p->lock);
}

/* --------------------------------------------------------------- writer */

enum st_state { ST_UNKNOWN, ST_NO, ST_YES };

/* Cutting state of one pass over a file's bytes. */
struct cutter {
	struct ckpt_extent_list *list; /* extents of [0, start) */
	uint8_t *buf;
	size_t head, len, cap; /* uncut bytes: buf[head .. head+len) at file offset start */
	uint64_t start;
	enum st_state st_state;
	ckpt_st_header *st;
	uint64_t data_start; /* 8 + N */
	size_t tensor;       /* cursor into the sorted tensor list */
	struct ckpt_cdc_state cdc; /* content-defined cutting: the first
				    * cdc.seen uncut bytes are scanned, with no
				    * cut (ckpt_cdc_feed); zero after a cut */
};

enum wmode { W_STREAM, W_STAGED };

/* A write parked past the stream's end (W5). */
struct parked {
	uint64_t off;
	size_t len;
	uint8_t *data;
};

/* Parked bytes of one writer.  A page still being written back when the
 * rest of it is written is skipped by the next writeback pass and sent by
 * a later one, so a gap can stay open while a pass sends what follows it
 * (the kernel's dirty limit of a FUSE mount bounds that). */
#define PARK_MAX (128u << 20)
/* Re-sent bytes compared against the stream's content, at most. */
#define RESEND_MAX (4u << 20)
/* With PARK_MAX bytes parked, up to PARK_WAITERS writes ahead of the
 * stream wait up to PARK_WAIT_NS for it to catch up (FUSE has a few
 * threads: waiting writes must not hold them all), then go STAGED. */
#define PARK_FULL 2
#define PARK_WAITERS 3
#define PARK_WAIT_NS 1000000000ll

/* Writes inside ckpt_writer_write, registered before they take the lock
 * (arrival_add): a write that arrives ahead of the stream while the write
 * that continues the stream is already in the daemon (another FUSE thread
 * read it first but lost the race for the lock) waits for it instead of
 * being parked, which would copy it (ORDER_WAIT).  At most ORDER_WAITERS
 * writes wait, each at most ORDER_WAIT_NS without the stream moving: the
 * write they wait for holds a thread of its own and needs only the lock. */
#define ARRIVALS 32
#define ORDER_WAIT 3
#define ORDER_WAITERS 16
#define ORDER_WAIT_NS 200000000ll

struct ckpt_writer {
	ckpt_store *s;
	ckpt_pool *pool;
	uint64_t ino;
	/* Keeps the chunks of the content readable and committable (store.h,
	 * holds); renewed by a commit that leaves the writer clean.  Used
	 * under lock, freed with the writer. */
	ckpt_hold *hold;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	/* Protected by lock (see invariants): */
	enum wmode mode;
	struct cutter cs; /* STREAM */
	int fd;           /* STAGED scratch file */
	uint64_t size;    /* STAGED */
	uint64_t zero_to; /* STREAM: zeros up to here (W4) */
	struct parked *park; /* STREAM: writes ahead of the stream (W5) */
	size_t npark, cap_park, park_bytes;
	unsigned park_waiters; /* writes waiting in park_wait() */
	unsigned order_waiters; /* writes waiting in order_wait() */
	/* Writes in ckpt_writer_write (end 0: a free slot).  Guarded by
	 * arr_lock, which is taken alone or inside lock, never around it. */
	pthread_mutex_t arr_lock;
	struct {
		uint64_t off, end;
	} arr[ARRIVALS];
	unsigned inflight;
	size_t inflight_bytes;
	int err;
	bool dirty;
	uint64_t gen; /* bumped by every change: a commit that ran while more
		       * changes came in leaves the writer dirty */
	int64_t mtime_ns;
	uint32_t flags; /* CKPT_INODE_F_* of the last cut pass */
};

static void park_clear(struct ckpt_writer *w);

static const struct ckpt_cdc_params cdc_params = {
	CKPT_CDC_DEFAULT_MIN, CKPT_CDC_DEFAULT_AVG, CKPT_CDC_DEFAULT_MAX
};

static void job_run(struct job *j)
{
	struct ckpt_writer *w = j->w;
	ckpt_digest d;
	int r = ckpt_store_put_chunk(w->s, j->data, j->len, j->elem_size, &d);

	pthread_mutex_lock(&w->lock);
	if (r < 0) {
		if (!w->err)
			w->err = r;
	} else {
		j->list->v[j->slot].digest = d;
	}
	w->inflight--;
	w->inflight_bytes -= j->len;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	free(j->data);
	free(j);
}

static void wait_idle(struct ckpt_writer *w)
{
	while (w->inflight > 0)
		pthread_cond_wait(&w->cond, &w->lock);
}

/* Backpressure: wait until the queued chunks of this writer fall under
 * CKPT_WRITER_INFLIGHT.  Releases w->lock while waiting: callers decide
 * what to do with the writer's state only after this returns. */
static void wait_room(struct ckpt_writer *w)
{
	while (w->inflight_bytes > CKPT_WRITER_INFLIGHT && !w->err)
		pthread_cond_wait(&w->cond, &w->lock);
}

static void cutter_reset(struct cutter *c)
{
	ckpt_extent_list_free(c->list);
	ckpt_st_header_free(c->st);
	free(c->buf);
	memset(c, 0, sizeof(*c));
}

static int cutter_init(struct cutter *c)
{
	memset(c, 0, sizeof(*c));
	c->list = ckpt_extent_list_new();
	return c->list ? 0 : -ENOMEM;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

/* Append the next extent of c->list: the n bytes given as nseg pieces
 * (the uncut buffer's head and/or the caller's write buffer).  The caller
 * then moves the cut position past them.  Caller holds w->lock. */
static int emit_segs(struct ckpt_writer *w, struct cutter *c, const struct iovec *seg, int nseg,
		     size_t n, unsigned elem_size)
{
	bool zero = true;
	struct job *j;
	size_t at = 0;
	int r;

	for (int i = 0; i < nseg && zero; i++)
		zero = all_zero(seg[i].iov_base, seg[i].iov_len);
	if (zero)
		return ckpt_extent_list_append(c->list, (uint32_t)n, CKPT_EXT_ZERO, NULL);
	/* No waiting here: the cut state must not change under us.  Callers
	 * apply backpressure before they feed (wait_room). */
	if (w->err)
		return w->err;
	if (ckpt_store_put_is_cheap(w->s)) {
		/* No compression on the write path: hashing and appending cost
		 * less than handing the chunk to a worker (a copy and two
		 * thread switches); parallelism comes from the FUSE threads. */
		ckpt_digest d;
		r = ckpt_store_put_chunkv(w->s, seg, nseg, elem_size, &d);
		if (r == 0)
			r = ckpt_extent_list_append(c->list, (uint32_t)n, CKPT_EXT_CHUNK, &d);
		if (r < 0)
			w->err = r;
		return r;
	}
	j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->data = malloc(n);
	if (!j->data) {
		free(j);
		return -ENOMEM;
	}
	for (int i = 0; i < nseg; i++) {
		memcpy(j->data + at, seg[i].iov_base, seg[i].iov_len);
		at += seg[i].iov_len;
	}
	r = ckpt_extent_list_append(c->list, (uint32_t)n, CKPT_EXT_CHUNK, NULL);
	if (r < 0) {
		free(j->data);
		free(j);
		return r;
	}
	j->w = w;
	j->list = c->list;
	j->slot = c->list->n - 1;
	j->len = n;
	j->elem_size = elem_size;
	w->inflight++;
	w->inflight_bytes += n;
	pool_submit(w->pool, j);
	return 0;
}

/* Emit the first n uncut bytes as one extent.  Caller holds w->lock. */
static int emit(struct ckpt_writer *w, struct cutter *c, size_t n, unsigned elem_size)
{
	struct iovec seg = { c->buf + c->head, n };
	int r = emit_segs(w, c, &seg, 1, n, elem_size);

	if (r < 0)
		return r;
	c->head += n;
	c->len -= n;
	c->start += n;
	c->cdc = (struct ckpt_cdc_state){ 0, 0 };
	return 0;
}

static void detect_safetensors(struct cutter *c, bool eof)
{
	const uint8_t *p = c->buf + c->head;
	uint64_t n;

	if (c->st_state != ST_UNKNOWN)
		return;
	if (c->start != 0) {
		c->st_state = ST_NO;
		return;
	}
	if (c->len < 9) {
		if (eof)
			c->st_state = ST_NO;
		return;
	}
	if (ckpt_st_header_len(p, &n) < 0 || p[8] != '{') {
		c->st_state = ST_NO;
		return;
	}
	if (c->len < 8 + n) {
		if (eof)
			c->st_state = ST_NO;
		return;
	}
	if (ckpt_st_parse(p + 8, n, &c->st, NULL, 0) < 0) {
		c->st_state = ST_NO;
		return;
	}
	c->st_state = ST_YES;
	c->data_start = 8 + n;
}

static unsigned elem_hint(enum ckpt_dtype dt)
{
	unsigned bits = ckpt_dtype_bits(dt);

	return bits == 16 || bits == 32 ? bits / 8 : 0;
}

/* End (file offset) of the chunk starting at the cut position when it is
 * fixed by the safetensors layout (header pieces, tensor-aligned pieces),
 * with its compression hint; 0 when the bytes decide (content-defined
 * chunking) or the layout is not known yet.  Caller holds w->lock. */
static uint64_t fixed_bound(struct cutter *c, unsigned *ret_elem)
{
	uint64_t pos = c->start, bound = 0;

	*ret_elem = 0;
	if (c->st_state == ST_YES) {
		uint64_t data_end = c->data_start + ckpt_st_data_len(c->st);
		size_t nt = ckpt_st_tensor_count(c->st);

		if (pos < c->data_start) {
			bound = CKPT_MIN(c->data_start, pos + CKPT_HEADER_PIECE);
		} else if (pos < data_end) {
			const struct ckpt_st_tensor *t = NULL;
			while (c->tensor < nt) {
				t = ckpt_st_tensor_at(c->st, c->tensor);
				if (c->data_start + t->end > pos)
					break;
				c->tensor++;
			}
			if (c->tensor < nt && t) {
				uint64_t ts = c->data_start + t->begin, te = c->data_start + t->end;
				uint64_t piece = (pos - ts) / CKPT_TENSOR_PIECE + 1;
				bound = CKPT_MIN(te, ts + piece * CKPT_TENSOR_PIECE);
				*ret_elem = elem_hint(t->dtype);
			}
		}
	}
	return bound;
}

/* Length of the next chunk and its compression hint, or 0 if more bytes are
 * needed.  Caller holds w->lock. */
static size_t next_cut(struct cutter *c, bool eof, unsigned *ret_elem)
{
	uint64_t pos = c->start, bound;

	*ret_elem = 0;
	detect_safetensors(c, eof);
	if (c->st_state == ST_UNKNOWN)
		return 0;
	bound = fixed_bound(c, ret_elem);
	if (bound > pos) {
		uint64_t want = bound - pos;
		if (c->len >= want)
			return (size_t)want;
		return eof ? c->len : 0;
	}
	if (c->len == 0)
		return 0;
	/* small writes offer the same uncut bytes again and again: scan only
	 * what is new */
	if (c->cdc.seen < c->len) {
		size_t seen = c->cdc.seen;
		size_t k = ckpt_cdc_feed(&cdc_params, &c->cdc, c->buf + c->head + seen,
					 c->len - seen);
		if (k > 0)
			return seen + k;
	}
	return eof ? c->len : 0;
}

/* Cut as many chunks as possible.  Caller holds w->lock. */
static int cut(struct ckpt_writer *w, struct cutter *c, bool eof)
{
	for (;;) {
		unsigned elem;
		size_t n = next_cut(c, eof, &elem);
		int r;

		if (n == 0)
			return 0;
		r = emit(w, c, n, elem);
		if (r < 0)
			return r;
	}
}

/* Append n bytes to the uncut buffer, which has room for them after
 * compacting or growing.  Caller holds w->lock. */
static int buf_append(struct cutter *c, const uint8_t *p, size_t n)
{
	if (c->cap - c->head - c->len < n && c->head > 0) {
		memmove(c->buf, c->buf + c->head, c->len);
		c->head = 0;
	}
	if (c->cap - c->len < n) {
		size_t ncap = c->cap ? c->cap : 2 * CKPT_CDC_DEFAULT_MAX;
		uint8_t *nb;

		while (ncap - c->len < n)
			ncap *= 2;
		nb = realloc(c->buf, ncap);
		if (!nb)
			return -ENOMEM;
		c->buf = nb;
		c->cap = ncap;
	}
	memcpy(c->buf + c->head + c->len, p, n);
	c->len += n;
	return 0;
}

/* Append bytes to the uncut buffer and cut.  Caller holds w->lock.
 *
 * Where the layout fixes the next cut and this write completes the chunk,
 * the chunk is emitted from the uncut bytes plus the caller's buffer as
 * they are: only the tail of a write that no chunk completes is copied. */
static int feed(struct ckpt_writer *w, struct cutter *c, const uint8_t *p, size_t n)
{
	while (n > 0) {
		size_t room, take;
		uint64_t bound;
		unsigned elem;
		int r;

		bound = fixed_bound(c, &elem);
		if (bound > c->start + c->len && bound - (c->start + c->len) <= n) {
			struct iovec seg[2];
			int nseg = 0;
			size_t want = (size_t)(bound - c->start);

			take = want - c->len;
			if (c->len > 0)
				seg[nseg++] = (struct iovec){ c->buf + c->head, c->len };
			seg[nseg++] = (struct iovec){ (void *)p, take };
			r = emit_segs(w, c, seg, nseg, want, elem);
			if (r < 0)
				return r;
			c->start += want;
			c->head = 0;
			c->len = 0;
			c->cdc = (struct ckpt_cdc_state){ 0, 0 };
			p += take;
			n -= take;
			continue;
		}
		if (bound == 0 && c->st_state != ST_UNKNOWN && c->cdc.seen == c->len) {
			/* content-defined: cut straight from the caller's buffer;
			 * only the bytes after the last cut in it are copied */
			size_t k = ckpt_cdc_feed(&cdc_params, &c->cdc, p, n);
			struct iovec seg[2];
			int nseg = 0;

			if (k == 0)
				return buf_append(c, p, n);
			if (c->len > 0)
				seg[nseg++] = (struct iovec){ c->buf + c->head, c->len };
			seg[nseg++] = (struct iovec){ (void *)p, k };
			r = emit_segs(w, c, seg, nseg, c->len + k, 0);
			if (r < 0)
				return r;
			c->start += c->len + k;
			c->head = 0;
			c->len = 0;
			p += k;
			n -= k;
			continue;
		}

		/* compact only when the write does not fit after the uncut bytes:
		 * each byte then moves at most once per buffer's length written */
		if (c->head > 0 && c->cap - c->head - c->len < n) {
			memmove(c->buf, c->buf + c->head, c->len);
			c->head = 0;
		}
		room = c->cap - c->head - c->len;
		if (room == 0) {
			size_t ncap = c->cap ? c->cap * 2 : 2 * CKPT_CDC_DEFAULT_MAX;
			uint8_t *nb = realloc(c->buf, ncap);
			if (!nb)
				return -ENOMEM;
			c->buf = nb;
			c->cap = ncap;
			room = c->cap - c->head - c->len;
		}
		take = CKPT_MIN(room, n);
		memcpy(c->buf + c->head + c->len, p, take);
		c->len += take;
		p += take;
		n -= take;
		r = cut(w, c, false);
		if (r < 0)
			return r;
	}
	return 0;
}

/* size: the file's size (the cut bytes and any zeros after them). */
static uint32_t cutter_flags(const struct cutter *c, uint64_t size)
{
	if (c->st_state == ST_YES && ckpt_st_check_file_size(c->st, size) == 0)
		return CKPT_INODE_F_SAFETENSORS;
	return 0;
}

int ckpt_writer_new(ckpt_store *s, ckpt_pool *pool, uint64_t ino, bool truncate,
		    ckpt_writer **ret_writer)
{
	struct ckpt_writer *w = calloc(1, sizeof(*w));
	struct ckpt_inode in;
	int r;

	if (!w)
		return -ENOMEM;
	w->s = s;
	w->pool = pool;
	w->ino = ino;
	w->fd = -1;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	pthread_mutex_init(&w->arr_lock, NULL);
	r = ckpt_hold_new(s, &w->hold); /* before the committed extents are read */
	if (r < 0)
		goto fail;
	r = cutter_init(&w->cs);
	if (r < 0)
		goto fail;
	w->mode = W_STREAM;
	r = ckpt_store_getattr(s, ino, &in);
	if (r < 0)
		goto fail;
	w->mtime_ns = in.mtime_ns;
	w->flags = in.flags;
	if (truncate) {
		w->dirty = in.size != 0;
		if (w->dirty)
			w->mtime_ns = ckpt_now_ns();
		w->flags = 0;
	} else if (in.size > 0) {
		/* Keep the committed extents: appends stream after them, other
		 * writes go through the staged path, reads are served from them. */
		ckpt_extent_list_free(w->cs.list);
		w->cs.list = NULL;
		r = ckpt_store_load_extents(s, ino, &w->cs.list);
		if (r < 0)
			goto fail;
		w->cs.start = w->cs.list->size;
		w->cs.st_state = ST_NO;
	}
	*ret_writer = w;
	return 0;
fail:
	ckpt_writer_free(w);
	return r;
}

void ckpt_writer_free(ckpt_writer *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->lock);
	wait_idle(w);
	pthread_mutex_unlock(&w->lock);
	cutter_reset(&w->cs);
	park_clear(w);
	free(w->park);
	if (w->fd >= 0)
		close(w->fd);
	ckpt_hold_free(w->hold);
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->cond);
	pthread_mutex_destroy(&w->arr_lock);
	free(w);
}

static int open_scratch(struct ckpt_writer *w)
{
	char *dir;
	int fd;

	if (asprintf(&dir, "%s/staging", ckpt_store_path(w->s)) < 0)
		return -ENOMEM;
	fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
		char *tmpl;
		if (asprintf(&tmpl, "%s/scratch-XXXXXX", dir) >= 0) {
			fd = mkostemp(tmpl, O_CLOEXEC);
			if (fd >= 0)
				unlink(tmpl);
			free(tmpl);
		}
	}
	free(dir);
	return fd < 0 ? -errno : fd;
}

static void park_clear(struct ckpt_writer *w)
{
	for (size_t i = 0; i < w->npark; i++)
		free(w->park[i].data);
	w->npark = 0;
	w->park_bytes = 0;
}

/* The end of the STREAM content: cut and uncut bytes, zeros, parked bytes. */
static uint64_t stream_size(const struct ckpt_writer *w)
{
	uint64_t sz = CKPT_MAX(w->cs.start + w->cs.len, w->zero_to);

	if (w->npark > 0)
		sz = CKPT_MAX(sz, w->park[w->npark - 1].off + w->park[w->npark - 1].len);
	return sz;
}

/* Insert [off, off + len) of buf at index i of the park (no overlap).
 * Caller holds lock. */
static int park_insert(struct ckpt_writer *w, size_t i, const uint8_t *buf, size_t len,
		       uint64_t off)
{
	uint8_t *copy;

	if (w->npark == w->cap_park) {
		size_t nc = w->cap_park ? w->cap_park * 2 : 16;
		struct parked *np = realloc(w->park, nc * sizeof(*np));
		if (!np)
			return -ENOMEM;
		w->park = np;
		w->cap_park = nc;
	}
	copy = malloc(len);
	if (!copy)
		return -ENOMEM;
	memcpy(copy, buf, len);
	memmove(&w->park[i + 1], &w->park[i], (w->npark - i) * sizeof(*w->park));
	w->park[i] = (struct parked){ off, len, copy };
	w->npark++;
	w->park_bytes += len;
	return 0;
}

/* Park a write past the stream's end (W5).  Bytes that parked writes
 * already hold must be the same (a page sent again); the rest is parked.
 * Returns 1 if parked, PARK_FULL (see park_wait), 0 if it cannot be (full,
 * or different bytes over a parked write), or -errno.  Caller holds lock. */
static int park_add(struct ckpt_writer *w, const uint8_t *buf, size_t len, uint64_t off)
{
	size_t i = 0;
	int r;

	if (w->park_bytes + len > PARK_MAX)
		return w->park_waiters < PARK_WAITERS ? PARK_FULL : 0;
	/* check first, so that a refused write parks nothing */
	for (size_t k = 0; k < w->npark; k++) {
		const struct parked *pk = &w->park[k];
		uint64_t lo = CKPT_MAX(off, pk->off), hi = CKPT_MIN(off + len, pk->off + pk->len);
		if (lo < hi && memcmp(buf + (lo - off), pk->data + (lo - pk->off), hi - lo) != 0)
			return 0;
	}
	while (len > 0) {
		uint64_t stop;
		size_t n;

		while (i < w->npark && w->park[i].off + w->park[i].len <= off)
			i++;
		if (i < w->npark && w->park[i].off <= off) {
			/* held already: skip it */
			n = (size_t)CKPT_MIN((uint64_t)len, w->park[i].off + w->park[i].len - off);
			buf += n;
			len -= n;
			off += n;
			continue;
		}
		stop = i < w->npark ? CKPT_MIN(off + len, w->park[i].off) : off + len;
		n = (size_t)(stop - off);
		r = park_insert(w, i, buf, n, off);
		if (r < 0)
			return r;
		buf += n;
		len -= n;
		off += n;
	}
	return 1;
}

/* Whether buf holds exactly the STREAM content's bytes at
 * [off, off + len), all below the stream's end (a re-sent page).  Caller
 * holds w->lock. */
static bool same_as_stream(struct ckpt_writer *w, const uint8_t *buf, size_t len, uint64_t off)
{
	struct cutter *c = &w->cs;
	uint8_t *tmp;
	bool same;
	ssize_t r;

	if (len > RESEND_MAX)
		return false;
	if (off >= c->start)
		return memcmp(buf, c->buf + c->head + (off - c->start), len) == 0;
	/* partly in chunks already cut: read them back, unless chunk jobs are
	 * still filling in their digests (waiting would release w->lock under
	 * the caller) */
	if (w->inflight > 0 || w->err)
		return false;
	tmp = malloc(len);
	if (!tmp)
		return false;
	r = ckpt_store_read_extents(w->s, c->list, tmp,
				    (size_t)CKPT_MIN((uint64_t)len, c->start - off), off);
	same = r >= 0 && (size_t)r == CKPT_MIN((uint64_t)len, c->start - off) &&
	       memcmp(buf, tmp, (size_t)r) == 0;
	if (same && off + len > c->start)
		same = memcmp(buf + (c->start - off), c->buf + c->head,
			      (size_t)(off + len - c->start)) == 0;
	free(tmp);
	return same;
}

/* Wait (releasing w->lock) until the stream moves or PARK_WAIT_NS pass.
 * Returns 0 to try again, or -EAGAIN after a wait in which the stream did
 * not move (the caller then takes the STAGED path). */
static int park_wait(struct ckpt_writer *w)
{
	uint64_t end = w->cs.start + w->cs.len;
	struct timespec ts;
	int64_t ns;

	clock_gettime(CLOCK_REALTIME, &ts);
	ns = (int64_t)ts.tv_nsec + PARK_WAIT_NS;
	ts.tv_sec += (time_t)(ns / 1000000000);
	ts.tv_nsec = (long)(ns % 1000000000);
	w->park_waiters++;
	while (w->mode == W_STREAM && w->cs.start + w->cs.len == end && !w->err &&
	       pthread_cond_timedwait(&w->cond, &w->lock, &ts) == 0)
		;
	w->park_waiters--;
	if (w->mode == W_STREAM && w->cs.start + w->cs.len == end && !w->err)
		return -EAGAIN;
	return 0;
}

/* Register a write [off, off + len) that is about to take w->lock.
 * Returns its slot, or -1 when all slots are taken (the write then parks
 * as before when it arrives ahead of the stream).  Caller does not hold
 * w->lock. */
static int arrival_add(struct ckpt_writer *w, uint64_t off, size_t len)
{
	int slot = -1;

	pthread_mutex_lock(&w->arr_lock);
	for (int i = 0; i < ARRIVALS; i++) {
		if (w->arr[i].end == 0) {
			w->arr[i].off = off;
			w->arr[i].end = off + len;
			slot = i;
			break;
		}
	}
	pthread_mutex_unlock(&w->arr_lock);
	return slot;
}

/* Caller holds w->lock: writes waiting for this one re-check. */
static void arrival_del(struct ckpt_writer *w, int slot)
{
	if (slot < 0)
		return;
	pthread_mutex_lock(&w->arr_lock);
	w->arr[slot].end = 0;
	pthread_mutex_unlock(&w->arr_lock);
	if (w->order_waiters > 0)
		pthread_cond_broadcast(&w->cond);
}

/* Whether a registered write other than slot holds the byte at pos (it
 * continues the stream once it gets the lock).  Caller holds w->lock. */
static bool arrival_covers(struct ckpt_writer *w, uint64_t pos, int slot)
{
	bool found = false;

	pthread_mutex_lock(&w->arr_lock);
	for (int i = 0; i < ARRIVALS && !found; i++)
		found = i != slot && w->arr[i].end > pos && w->arr[i].off <= pos;
	pthread_mutex_unlock(&w->arr_lock);
	return found;
}

/* Wait (releasing w->lock) until the stream moves, the writer changes
 * mode, a registered write leaves, or ORDER_WAIT_NS pass.  Returns 0, or
 * -EAGAIN when the time ran out with the stream where it was (the caller
 * then parks the write). */
static int order_wait(struct ckpt_writer *w)
{
	uint64_t end = w->cs.start + w->cs.len;
	struct timespec ts;
	int64_t ns;
	int r = 0;

	clock_gettime(CLOCK_REALTIME, &ts);
	ns = (int64_t)ts.tv_nsec + ORDER_WAIT_NS;
	ts.tv_sec += (time_t)(ns / 1000000000);
	ts.tv_nsec = (long)(ns % 1000000000);
	w->order_waiters++;
	if (pthread_cond_timedwait(&w->cond, &w->lock, &ts) != 0 && w->mode == W_STREAM &&
	    w->cs.start + w->cs.len == end)
		r = -EAGAIN;
	w->order_waiters--;
	return r;
}

/* A STREAM write at off (W5): feed what continues the stream, accept bytes
 * re-sent unchanged, park what lies ahead, feed parked writes the stream
 * has reached.  Returns 1 when done, 0 when the write needs the STAGED
 * path, or -errno.  Caller holds w->lock. */
static int stream_write(struct ckpt_writer *w, const uint8_t *buf, size_t len, uint64_t off,
			int slot, bool may_wait)
{
	struct cutter *c = &w->cs;
	uint64_t end;
	int r;

	/* bytes sent again over chunks already cut are compared with those
	 * chunks, whose digests queued jobs still fill in: wait for them
	 * first, before looking at the state */
	if (off < w->cs.start && w->inflight > 0)
		wait_idle(w);
	if (w->mode != W_STREAM || w->err)
		return 0;
	end = c->start + c->len;
	if (off > end) {
		if (may_wait && w->order_waiters < ORDER_WAITERS &&
		    arrival_covers(w, end, slot))
			return ORDER_WAIT;
		return park_add(w, buf, len, off);
	}
	if (off < end) {
		size_t old = (size_t)CKPT_MIN((uint64_t)len, end - off);
		if (!same_as_stream(w, buf, old, off))
			return 0;
		buf += old;
		len -= old;
		off += old;
	}
	r = len > 0 ? feed(w, c, buf, len) : 0;
	while (r == 0 && w->npark > 0 && w->park[0].off <= c->start + c->len) {
		struct parked pk = w->park[0];
		uint64_t at = c->start + c->len;
		size_t skip = (size_t)(at - pk.off);

		if (skip > pk.len)
			skip = pk.len;
		if (skip > 0 && !same_as_stream(w, pk.data, skip, pk.off))
			return 0; /* parked bytes differ from what came since */
		memmove(&w->park[0], &w->park[1], (w->npark - 1) * sizeof(*w->park));
		w->npark--;
		w->park_bytes -= pk.len;
		r = feed(w, c, pk.data + skip, pk.len - skip);
		free(pk.data);
	}
	if (r == 0 && w->zero_to <= c->start + c->len)
		w->zero_to = 0;
	if (w->park_waiters > 0 || w->order_waiters > 0)
		pthread_cond_broadcast(&w->cond);
	return r < 0 ? r : 1;
}

/* Switch STREAM -> STAGED: copy the current content into a scratch file.
 * Caller holds w->lock. */
static int to_staged(struct ckpt_writer *w)
{
	struct cutter *c = &w->cs;
	uint8_t *buf = NULL;
	int fd, r = 0;

	wait_idle(w);
	if (w->err)
		return w->err;
	ckpt_debug("%s: inode %lu: non-sequential write or truncate at size %llu: staging",
		   ckpt_store_path(w->s), (unsigned long)w->ino,
		   (unsigned long long)(c->start + c->len));
	fd = open_scratch(w);
	if (fd < 0) {
		ckpt_err("%s: cannot create scratch file for inode %lu: %s",
			 ckpt_store_path(w->s), (unsigned long)w->ino, strerror(-fd));
		return fd;
	}
	buf = malloc(CKPT_CDC_DEFAULT_MAX);
	if (!buf) {
		r = -ENOMEM;
		goto fail;
	}
	for (size_t i = 0; i < c->list->n; i++) {
		const struct ckpt_extent *e = &c->list->v[i];
		for (uint64_t done = 0; e->kind == CKPT_EXT_CHUNK && done < e->len;) {
			size_t n = (size_t)CKPT_MIN((uint64_t)CKPT_CDC_DEFAULT_MAX, e->len - done);
			r = ckpt_store_read_chunk(w->s, &e->digest, done, buf, n);
			if (r == 0)
				r = ckpt_pwrite_full(fd, buf, n, e->off + done);
			if (r < 0)
				goto fail;
			done += n;
		}
	}
	if (c->len > 0) {
		r = ckpt_pwrite_full(fd, c->buf + c->head, c->len, c->start);
		if (r < 0)
			goto fail;
	}
	w->size = CKPT_MAX(c->start + c->len, w->zero_to);
	for (size_t i = 0; i < w->npark; i++) {
		struct parked *pk = &w->park[i];
		r = ckpt_pwrite_full(fd, pk->data, pk->len, pk->off);
		if (r < 0)
			goto fail;
		w->size = CKPT_MAX(w->size, pk->off + pk->len);
	}
	if (ftruncate(fd, (off_t)w->size) < 0) {
		r = -errno;
		goto fail;
	}
	free(buf);
	cutter_reset(c);
	park_clear(w);
	w->fd = fd;
	w->mode = W_STAGED;
	w->zero_to = 0;
	return 0;
fail:
	free(buf);
	close(fd);
	return r;
}

int ckpt_writer_write(ckpt_writer *w, const void *buf, size_t len, uint64_t off)
{
	bool may_wait = true;
	int r = 0, slot;

	if (len == 0)
		return 0;
	if (off + len < off || off + len > (1ull << 50))
		return -EFBIG;
	slot = arrival_add(w, off, len);
	pthread_mutex_lock(&w->lock);
	wait_room(w);
	if (w->err) {
		r = w->err;
		goto out;
	}
	while (w->mode == W_STREAM) {
		/* the common case: chunked as it arrives */
		r = stream_write(w, buf, len, off, slot, may_wait);
		if (r == ORDER_WAIT) {
			if (order_wait(w) == -EAGAIN)
				may_wait = false;
			r = 0; /* if the writer went STAGED meanwhile: write there */
			continue;
		}
		if (r != PARK_FULL)
			break;
		/* the write that fills the gap is late (waiting for this lock,
		 * or for a thread): let it in, for a while */
		r = park_wait(w);
		if (r == -EAGAIN) {
			r = 0; /* the stream did not move: STAGED */
			break;
		}
		if (w->err) {
			r = w->err;
			goto out;
		}
	}
	if (r == 1) {
		r = 0;
	} else if (r == 0) {
		if (w->mode == W_STREAM)
			r = to_staged(w);
		if (r == 0)
			r = ckpt_pwrite_full(w->fd, buf, len, off);
		if (r == 0 && off + len > w->size)
			w->size = off + len;
	}
	if (r == 0) {
		w->dirty = true;
		w->gen++;
		w->mtime_ns = ckpt_now_ns();
	} else if (!w->err && r != -EFBIG) {
		w->err = r;
	}
out:
	arrival_del(w, slot);
	pthread_mutex_unlock(&w->lock);
	return r;
}

ssize_t ckpt_writer_read(ckpt_writer *w, void *buf, size_t len, uint64_t off)
{
	ssize_t r;

	pthread_mutex_lock(&w->lock);
	if (w->mode == W_STREAM && w->npark > 0) {
		/* a read between out-of-order writes (rare): serve it staged */
		r = to_staged(w);
		if (r < 0)
			goto out;
	}
	if (w->mode == W_STAGED) {
		r = 0;
		if (off < w->size) {
			len = (size_t)CKPT_MIN((uint64_t)len, w->size - off);
			r = ckpt_pread_full(w->fd, buf, len, off);
			r = r < 0 ? r : (ssize_t)len;
		}
	} else {
		struct cutter *c = &w->cs;
		size_t done = 0;

		wait_idle(w);
		if (w->err) {
			r = w->err;
			goto out;
		}
		if (off < c->start) {
			r = ckpt_store_read_extents(w->s, c->list, buf,
						    (size_t)CKPT_MIN((uint64_t)len, c->start - off), off);
			if (r < 0)
				goto out;
			done = (size_t)r;
		}
		if (done < len && off + done >= c->start && off + done < c->start + c->len) {
			size_t in = (size_t)(off + done - c->start);
			size_t n = CKPT_MIN(len - done, c->len - in);
			memcpy((uint8_t *)buf + done, c->buf + c->head + in, n);
			done += n;
		}
		if (done < len && off + done >= c->start + c->len && off + done < w->zero_to) {
			size_t n = (size_t)CKPT_MIN((uint64_t)(len - done), w->zero_to - (off + done));
			memset((uint8_t *)buf + done, 0, n);
			done += n;
		}
		r = (ssize_t)done;
	}
out:
	pthread_mutex_unlock(&w->lock);
	return r;
}

int ckpt_writer_truncate(ckpt_writer *w, uint64_t size)
{
	int r = 0;

	if (size > (1ull << 50))
		return -EFBIG;
	pthread_mutex_lock(&w->lock);
	if (size == 0) {
		/* Start over: drop everything, including a sticky error. */
		wait_idle(w);
		cutter_reset(&w->cs);
		park_clear(w);
		r = cutter_init(&w->cs);
		if (w->fd >= 0)
			close(w->fd);
		w->fd = -1;
		w->size = 0;
		w->zero_to = 0;
		w->mode = W_STREAM;
		w->err = 0;
	} else if (w->err) {
		r = w->err;
	} else if (w->mode == W_STREAM && w->npark == 0 && size >= w->cs.start + w->cs.len) {
		/* growing (or back to the stream's end): zeros after the stream */
		uint64_t zero_to = size == w->cs.start + w->cs.len ? 0 : size;
		if (zero_to == w->zero_to)
			goto out; /* no change */
		w->zero_to = zero_to;
	} else {
		if (w->mode == W_STREAM)
			r = to_staged(w);
		if (r == 0 && ftruncate(w->fd, (off_t)size) < 0)
			r = -errno;
		if (r == 0)
			w->size = size;
	}
	if (r == 0) {
		w->dirty = true;
		w->gen++;
		w->mtime_ns = ckpt_now_ns();
	}
out:
	pthread_mutex_unlock(&w->lock);
	return r;
}

uint64_t ckpt_writer_size(ckpt_writer *w)
{
	uint64_t sz;

	pthread_mutex_lock(&w->lock);
	sz = w->mode == W_STAGED ? w->size : stream_size(w);
	pthread_mutex_unlock(&w->lock);
	return sz;
}

int64_t ckpt_writer_mtime(ckpt_writer *w)
{
	int64_t t;

	pthread_mutex_lock(&w->lock);
	t = w->mtime_ns;
	pthread_mutex_unlock(&w->lock);
	return t;
}

void ckpt_writer_set_mtime(ckpt_writer *w, int64_t mtime_ns)
{
	pthread_mutex_lock(&w->lock);
	w->mtime_ns = mtime_ns;
	pthread_mutex_unlock(&w->lock);
}

bool ckpt_writer_set_mtime_if_dirty(ckpt_writer *w, int64_t mtime_ns)
{
	bool dirty;

	pthread_mutex_lock(&w->lock);
	dirty = w->dirty;
	if (dirty)
		w->mtime_ns = mtime_ns;
	pthread_mutex_unlock(&w->lock);
	return dirty;
}

bool ckpt_writer_staged(ckpt_writer *w)
{
	bool staged;

	pthread_mutex_lock(&w->lock);
	staged = w->mode == W_STAGED;
	pthread_mutex_unlock(&w->lock);
	return staged;
}

bool ckpt_writer_dirty(ckpt_writer *w)
{
	bool d;

	pthread_mutex_lock(&w->lock);
	d = w->dirty;
	pthread_mutex_unlock(&w->lock);
	return d;
}

/* Append a run of zeros (a hole of the scratch file) without reading it.
 * Caller holds w->lock; the uncut buffer must be empty. */
static int skip_hole(struct cutter *c, uint64_t len)
{
	while (len > 0) {
		uint32_t n = (uint32_t)CKPT_MIN(len, (uint64_t)(1u << 30));
		int r = ckpt_extent_list_append(c->list, n, CKPT_EXT_ZERO, NULL);
		if (r < 0)
			return r;
		c->start += n;
		len -= n;
	}
	return 0;
}

/* Chunk the scratch file into a fresh extent list, skipping its holes
 * (SEEK_DATA/SEEK_HOLE) so sparse files cost what they store.  Caller holds
 * w->lock. */
static int cut_staged(struct ckpt_writer *w, struct cutter *c)
{
	const size_t blk = 8u << 20;
	uint8_t *buf = malloc(blk);
	uint64_t off = 0;
	int r = 0;

	if (!buf)
		return -ENOMEM;
	while (off < w->size && r == 0) {
		off_t data = lseek(w->fd, (off_t)off, SEEK_DATA);
		off_t hole;

		if (data < 0 && errno == ENXIO)
			data = (off_t)w->size; /* a hole up to the end */
		if (data < 0) {
			data = (off_t)off; /* no hole support: read everything */
			hole = (off_t)w->size;
		} else {
			if ((uint64_t)data > w->size)
				data = (off_t)w->size;
			if ((uint64_t)data > off) {
				r = cut(w, c, true);
				if (r == 0)
					r = skip_hole(c, (uint64_t)data - off);
				off = (uint64_t)data;
				continue;
			}
			hole = lseek(w->fd, (off_t)off, SEEK_HOLE);
			if (hole < 0 || (uint64_t)hole > w->size)
				hole = (off_t)w->size;
		}
		while (off < (uint64_t)hole && r == 0) {
			size_t n = (size_t)CKPT_MIN((uint64_t)blk, (uint64_t)hole - off);
			wait_room(w);
			r = ckpt_pread_full(w->fd, buf, n, off);
			if (r == 0)
				r = feed(w, c, buf, n);
			off += n;
		}
	}
	if (r == 0)
		r = cut(w, c, true);
	free(buf);
	return r;
}

int ckpt_writer_commit(ckpt_writer *w, bool durable)
{
	struct cutter tmp;
	struct cutter *c = &w->cs;
	uint64_t gen;
	int r = 0;

	pthread_mutex_lock(&w->lock);
	gen = w->gen;
	if (w->err) {
		r = w->err;
		goto out;
	}
	if (!w->dirty) {
		/* nothing new: make what was committed before durable if asked */
		if (durable)
			r = ckpt_store_sync_file(w->s, w->ino);
		goto out;
	}
	if (w->mode == W_STREAM && w->npark > 0)
		r = to_staged(w); /* a gap never filled: a sparse write */
	if (r < 0) {
		/* nothing */
	} else if (w->mode == W_STAGED) {
		r = cutter_init(&tmp);
		if (r < 0)
			goto out;
		c = &tmp;
		r = cut_staged(w, c);
	} else {
		r = cut(w, c, true);
	}
	wait_idle(w);
	if (r == 0 && w->err)
		r = w->err;
	if (r == 0 && c == &w->cs && w->zero_to > c->start) {
		/* W4: the zeros after the stream, committed as zero extents and
		 * taken off again, so that appends keep streaming */
		uint64_t end = c->start;
		r = skip_hole(c, w->zero_to - end);
		if (r == 0) {
			w->flags = cutter_flags(c, c->start);
			r = ckpt_store_commit_file(w->s, w->ino, c->list, w->flags, w->mtime_ns,
						   durable);
		}
		ckpt_extent_list_truncate(c->list, end);
		c->start = end;
	} else if (r == 0) {
		w->flags = cutter_flags(c, c == &w->cs ? c->start + c->len : w->size);
		r = ckpt_store_commit_file(w->s, w->ino, c->list, w->flags, w->mtime_ns, durable);
	}
	if (r == 0) {
		w->dirty = w->gen != gen; /* changes made while we committed */
		if (!w->dirty)
			ckpt_hold_renew(w->hold); /* all of it is committed now */
	} else if (!w->err) {
		w->err = r;
	}
	if (c == &tmp)
		cutter_reset(&tmp);
out:
	pthread_mutex_unlock(&w->lock);
	return r;
}

/* What ext4 accepts and ckptfs implements: reserving (mode 0, with or
 * without KEEP_SIZE), punching holes and zeroing ranges. */
#define FALLOC_KNOWN (FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)

int ckpt_writer_fallocate(ckpt_writer *w, int mode, uint64_t off, uint64_t len)
{
	uint64_t end = off + len, size;
	bool keep = mode & FALLOC_FL_KEEP_SIZE;
	int r = 0;

	if (mode & ~FALLOC_KNOWN)
		return -EOPNOTSUPP; /* collapse, insert, unshare */
	if (len == 0)
		return -EINVAL;
	if (end < off || end > (1ull << 50))
		return -EFBIG;
	pthread_mutex_lock(&w->lock);
	if (w->err) {
		r = w->err;
		goto out;
	}
	size = w->mode == W_STAGED ? w->size : stream_size(w);
	if (!(mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE))) {
		/* Reserve: chunks are stored as they are written (deduplicated,
		 * compressed), so nothing can be set aside; the range reads as
		 * zeros and stores nothing until written.  Refusing a range the
		 * backend's free space cannot hold at all keeps the promise for
		 * the tools that preallocate to fail early. */
		struct statvfs st;
		if (ckpt_store_statfs(w->s, &st) == 0 &&
		    len / st.f_frsize > (uint64_t)st.f_bavail) {
			r = -ENOSPC;
			goto out;
		}
		if (keep || end <= size)
			goto out; /* no change to the content */
		if (w->mode == W_STREAM) {
			w->zero_to = end;
		} else if (ftruncate(w->fd, (off_t)end) < 0) {
			r = -errno;
			goto out;
		} else {
			w->size = end;
		}
	} else {
		/* Punch a hole / zero a range: in the scratch file, whose holes
		 * become zero extents at commit. */
		if (off >= size && (keep || (mode & FALLOC_FL_PUNCH_HOLE)))
			goto out; /* nothing there */
		if (w->mode == W_STREAM) {
			r = to_staged(w);
			if (r < 0)
				goto out;
		}
		if (fallocate(w->fd, mode, (off_t)off, (off_t)len) < 0) {
			r = -errno;
			goto out;
		}
		if (!keep && end > w->size)
			w->size = end;
	}
	w->dirty = true;
	w->gen++;
	w->mtime_ns = ckpt_now_ns();
out:
	pthread_mutex_unlock(&w->lock);
	return r;
}
