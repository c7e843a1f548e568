/* SPDX-License-Identifier: MIT */
/*
 * pack_span.c - span reads of the "pack" backend (read-ahead): the records
 * of a batch that lie close together in one pack are read with one
 * O_DIRECT request each, into the calling thread's huge-page span buffer,
 * through the thread's kernel AIO context when asked to submit early.
 */
#define CKPT_PACK_BACKEND_PRIVATE
#include "chunk/pack_backend.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PB(cb) ((struct pack_be *)(cb))
#define SPAN_UNREAD INT64_MIN /* pb_span.res: no result yet */

/* One request: the records of items o[i..j), which lie close together in
 * one pack, read as the aligned range [start, start + len) into buf. */
struct pb_span {
	ckpt_chunk_span *batch;
	size_t i, j;
	uint64_t pack_id, start;
	size_t len;   /* bytes requested: a multiple of CKPT_PACK_DIRECT_ALIGN */
	size_t need;  /* bytes that must come back: up to the last record's end */
	uint8_t *buf; /* inside the batch's span buffer */
	int64_t res;  /* bytes read, -errno, or SPAN_UNREAD; until span_wait
		       * reads the span itself only an AIO completion sets it */
	struct iocb cb;
};

/* A batch between span_begin and span_end, owned by the thread that began
 * it; its reads are in flight in that thread's AIO context and land in one
 * of that thread's span buffers (slot). */
struct ckpt_chunk_span {
	struct pb_tls *t;
	struct ckpt_chunk_span_item **o; /* the caller's, sorted by pack and offset */
	size_t m;
	int slot; /* the thread's span buffer in use, or -1 */
	size_t nspans, inflight;
	struct pb_span sp[SPAN_N];
};

void pb_tls_free(void *p)
{
	struct pb_tls *t = p;

	if (!t)
		return;
	/* every batch was ended: no read is in flight */
	if (t->aio_state == 1)
		(void)syscall(SYS_io_destroy, t->aio);
	for (int i = 0; i < SPAN_INFLIGHT; i++)
		if (t->span_map[i])
			munmap(t->span_map[i], SPAN_BUF + CKPT_HUGE_ALIGN);
	free(t);
}

static struct pb_tls *tls_get(struct pack_be *b)
{
	struct pb_tls *t = pthread_getspecific(b->tls_key);

	if (t)
		return t;
	t = calloc(1, sizeof(*t));
	if (t && pthread_setspecific(b->tls_key, t) != 0) {
		free(t);
		t = NULL;
	}
	return t;
}

/* The thread's span buffer i, mapped on first use; NULL without memory. */
static uint8_t *tls_span(struct pb_tls *t, int i)
{
	if (!t->span[i])
		t->span[i] = ckpt_map_huge(SPAN_BUF, &t->span_map[i]);
	return t->span[i];
}

/* A free span buffer of the thread, marked busy: its index, or -1 when
 * all are held or there is no memory. */
static int tls_span_take(struct pb_tls *t)
{
	for (int i = 0; i < SPAN_INFLIGHT; i++) {
		if (t->span_busy[i])
			continue;
		if (!tls_span(t, i))
			return -1;
		t->span_busy[i] = true;
		return i;
	}
	return -1;
}

/*
 * The thread's AIO context, set up on first use: true when it has one.
 * Without one (the kernel lacks AIO, or fs.aio-max-nr is reached) the
 * thread reads its spans with pread; that is logged once per thread.
 */
static bool tls_aio(struct pack_be *b, struct pb_tls *t)
{
	if (t->aio_state == 0) {
		t->aio = 0;
		if (b->sync_readahead) {
			t->aio_state = -1;
		} else if (syscall(SYS_io_setup, SPAN_INFLIGHT * SPAN_N, &t->aio) == 0) {
			t->aio_state = 1;
		} else {
			ckpt_warn("%s: no kernel AIO (%s): read-ahead reads with pread", b->path,
				  strerror(errno));
			t->aio_state = -1;
		}
	}
	return t->aio_state == 1;
}

static int item_cmp(const void *a, const void *b)
{
	const struct ckpt_chunk_loc *x = &(*(struct ckpt_chunk_span_item *const *)a)->loc;
	const struct ckpt_chunk_loc *y = &(*(struct ckpt_chunk_span_item *const *)b)->loc;
	uint64_t xi = ckpt_pack_loc_id(x), yi = ckpt_pack_loc_id(y);
	uint64_t xo = ckpt_pack_loc_offset(x), yo = ckpt_pack_loc_offset(y);

	if (xi != yi)
		return xi < yi ? -1 : 1;
	return xo < yo ? -1 : xo > yo;
}

static uint64_t item_off(const struct ckpt_chunk_span_item *it)
{
	return ckpt_pack_loc_offset(&it->loc);
}

static uint64_t item_end(const struct ckpt_chunk_span_item *it)
{
	return item_off(it) + CKPT_PACK_REC_HDR_SIZE + it->loc.stored_len;
}

/*
 * Group the sorted items into spans (records that lie close together, one
 * request each, a record alone too) in a span buffer of the thread while
 * they fit in it: items left without one are read alone by the caller.
 */
static void plan(ckpt_chunk_span *pf)
{
	struct ckpt_chunk_span_item **o = pf->o;
	const uint64_t blk = CKPT_PACK_DIRECT_ALIGN;
	size_t used = 0, i, j;

	for (i = 0; i < pf->m && pf->nspans < SPAN_N; i = j) {
		uint64_t id = ckpt_pack_loc_id(&o[i]->loc);
		uint64_t a = item_off(o[i]) / blk * blk;
		struct pb_span *sp;
		size_t len;

		for (j = i + 1; j < pf->m; j++)
			if (ckpt_pack_loc_id(&o[j]->loc) != id || item_off(o[j]) < item_end(o[j - 1]) ||
			    item_off(o[j]) - item_end(o[j - 1]) > SPAN_GAP || item_end(o[j]) - a > SPAN_MAX)
				break;
		len = (size_t)((item_end(o[j - 1]) - a + blk - 1) / blk * blk);
		if (len > SPAN_BUF - used)
			break;
		if (pf->slot < 0 && (pf->slot = tls_span_take(pf->t)) < 0)
			break;
		sp = &pf->sp[pf->nspans++];
		sp->batch = pf;
		sp->i = i;
		sp->j = j;
		sp->pack_id = id;
		sp->start = a;
		sp->len = len;
		sp->need = (size_t)(item_end(o[j - 1]) - a);
		sp->buf = pf->t->span[pf->slot] + used;
		sp->res = SPAN_UNREAD;
		used += len;
	}
}

/* Submit the spans' reads to the thread's AIO context; the ones that cannot
 * be (no AIO, no O_DIRECT, a refused submission) are read in span_wait. */
static void submit(struct pack_be *b, ckpt_chunk_span *pf)
{
	struct iocb *cbs[SPAN_N];
	size_t k = 0, done = 0;

	if (!pf->nspans || !tls_aio(b, pf->t))
		return;
	/* rw keeps each descriptor open until its read is submitted */
	pthread_rwlock_rdlock(&b->rw);
	for (size_t i = 0; i < pf->nspans; i++) {
		struct pb_span *sp = &pf->sp[i];
		ckpt_pack *p;
		int fd;

		if (pb_get_pack(b, sp->pack_id, &p) < 0 || (fd = ckpt_pack_direct_fd(p)) < 0)
			continue;
		memset(&sp->cb, 0, sizeof(sp->cb));
		sp->cb.aio_data = (uint64_t)(uintptr_t)sp;
		sp->cb.aio_lio_opcode = IOCB_CMD_PREAD;
		sp->cb.aio_fildes = (uint32_t)fd;
		sp->cb.aio_buf = (uint64_t)(uintptr_t)sp->buf;
		sp->cb.aio_nbytes = sp->len;
		sp->cb.aio_offset = (int64_t)sp->start;
		cbs[k++] = &sp->cb;
	}
	while (done < k) {
		long r = syscall(SYS_io_submit, pf->t->aio, (long)(k - done), cbs + done);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break; /* the rest is read in span_wait */
		done += (size_t)r;
	}
	pthread_rwlock_unlock(&b->rw);
	pf->inflight = done;
}

/*
 * Wait until pf's reads have completed.  Completions of the thread's other
 * batch come in through the same context and are recorded in its spans.
 * Should the context fail, it is destroyed (which waits for its reads) and
 * the thread reads without AIO from then on; spans left without a result
 * are read in span_wait.
 */
static void reap(struct pack_be *b, ckpt_chunk_span *pf)
{
	struct pb_tls *t = pf->t;
	struct io_event ev[SPAN_INFLIGHT * SPAN_N];

	while (pf->inflight > 0 && t->aio_state == 1) {
		long r = syscall(SYS_io_getevents, t->aio, 1L, (long)(SPAN_INFLIGHT * SPAN_N), ev,
				 NULL);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			ckpt_warn("%s: io_getevents: %s: read-ahead reads with pread", b->path,
				  strerror(errno));
			(void)syscall(SYS_io_destroy, t->aio);
			t->aio_state = -1;
			break;
		}
		for (long i = 0; i < r; i++) {
			struct pb_span *sp = (struct pb_span *)(uintptr_t)ev[i].data;

			sp->res = ev[i].res;
			sp->batch->inflight--;
		}
	}
	if (t->aio_state != 1)
		pf->inflight = 0; /* its spans without a result are read again */
}

int pb_span_begin(ckpt_chunk_backend *cb, struct ckpt_chunk_span_item **items, size_t n,
		  bool do_submit, ckpt_chunk_span **ret)
{
	struct pack_be *b = PB(cb);
	struct pb_tls *t = tls_get(b);
	ckpt_chunk_span *pf;

	*ret = NULL;
	if (!t || !(pf = calloc(1, sizeof(*pf))))
		return -ENOMEM;
	pf->t = t;
	pf->o = items;
	pf->m = n;
	pf->slot = -1;
	for (size_t i = 0; i < n; i++)
		items[i]->stored = NULL;
	qsort(items, n, sizeof(*items), item_cmp);
	plan(pf);
	if (do_submit)
		submit(b, pf);
	*ret = pf;
	return 0;
}

void pb_span_wait(ckpt_chunk_backend *cb, ckpt_chunk_span *pf)
{
	struct pack_be *b = PB(cb);

	reap(b, pf);
	pthread_rwlock_rdlock(&b->rw);
	for (size_t i = 0; i < pf->nspans; i++) {
		struct pb_span *sp = &pf->sp[i];
		uint64_t start;
		size_t len;
		ckpt_pack *p;
		int r;

		if (pb_get_pack(b, sp->pack_id, &p) < 0) {
			__atomic_fetch_add(&b->span_failed, 1, __ATOMIC_RELAXED);
			continue; /* gone (compacted): its items load alone */
		}
		__atomic_fetch_add(sp->res != SPAN_UNREAD ? &b->span_async : &b->span_sync, 1,
				   __ATOMIC_RELAXED);
		if (sp->res == SPAN_UNREAD) {
			/* not submitted: read it here (through the page cache
			 * where the file system has no O_DIRECT: then alone) */
			r = ckpt_pack_read_window(p, sp->start, sp->need, sp->buf, sp->len, &start,
						  &len);
			sp->res = r < 0 ? r : (int64_t)len;
		}
		if (sp->res < (int64_t)sp->need) {
			__atomic_fetch_add(&b->span_failed, 1, __ATOMIC_RELAXED);
			continue; /* failed or short: its items load alone and report */
		}
		for (size_t k = sp->i; k < sp->j; k++) {
			struct ckpt_chunk_span_item *x = pf->o[k];
			struct ckpt_pack_rec pr;
			uint64_t off = item_off(x);

			if (ckpt_pack_rec_at(p, off, sp->buf + (off - sp->start), x->loc.stored_len,
					     false, &pr, &x->stored) < 0) {
				x->stored = NULL; /* its load reads it alone and reports */
				continue;
			}
			pb_rec_from_pack(&x->rec, &pr);
		}
	}
	pthread_rwlock_unlock(&b->rw);
}

void pb_span_end(ckpt_chunk_backend *cb, ckpt_chunk_span *pf)
{
	(void)cb;
	if (!pf)
		return;
	if (pf->slot >= 0)
		pf->t->span_busy[pf->slot] = false;
	free(pf);
}

int pb_span_warm(ckpt_chunk_backend *cb)
{
	struct pack_be *b = PB(cb);
	struct pb_tls *t = tls_get(b);

	if (!t)
		return -ENOMEM;
	(void)tls_aio(b, t);
	for (int i = 0; i < SPAN_INFLIGHT; i++) {
		if (!tls_span(t, i))
			return -ENOMEM;
		ckpt_mem_populate(t->span[i], SPAN_BUF);
	}
	return 0;
}
