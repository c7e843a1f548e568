/* SPDX-License-Identifier: MIT */
/*
 * prefetch.c - read-ahead I/O: span reads planned per batch, kernel AIO.
 */
#include "store/store_int.h"

struct pf_item {
	const ckpt_digest *d;
	ckpt_cache_entry *e;
	struct ckpt_chunk_loc loc;
	const uint8_t *src;       /* its stored bytes in a span, or NULL: it loads alone */
	struct ckpt_pack_rec rec; /* its checked header (src != NULL) */
};

#define PF_UNREAD INT64_MIN /* pf_span.res: no result yet */

/* One request: the records of items o[i..j), which lie close together in
 * one pack, read as the aligned range [start, start + len) into buf. */
struct pf_span {
	ckpt_prefetch *pf;
	size_t i, j;
	uint64_t pack_id, start;
	size_t len;   /* bytes requested: a multiple of CKPT_PACK_DIRECT_ALIGN */
	size_t need;  /* bytes that must come back: up to the last record's end */
	uint8_t *buf; /* inside the batch's span buffer */
	int64_t res;  /* bytes read, -errno, or PF_UNREAD; until _finish reads
		       * the span itself only an AIO completion sets it */
	struct iocb cb;
};

/*
 * A batch between ckpt_store_prefetch_begin and _finish.  Owned by the
 * thread that began it; its spans' reads are in flight in that thread's
 * AIO context and land in one of that thread's span buffers (slot).
 */
struct ckpt_prefetch {
	struct pf_item *it;  /* the reserved chunks, in the order asked for */
	struct pf_item **o;  /* the same sorted by pack and offset */
	size_t n, m, lost;   /* asked for, reserved, not in the index */
	int slot;            /* the thread's span buffer in use, or -1 */
	size_t nspans, inflight;
	struct pf_span sp[PF_SPANS];
};

static int pf_cmp(const void *a, const void *b)
{
	const struct ckpt_chunk_loc *x = &(*(struct pf_item *const *)a)->loc;
	const struct ckpt_chunk_loc *y = &(*(struct pf_item *const *)b)->loc;

	if (x->pack_id != y->pack_id)
		return x->pack_id < y->pack_id ? -1 : 1;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static uint64_t pf_end(const struct pf_item *it)
{
	return it->loc.offset + CKPT_PACK_REC_HDR_SIZE + it->loc.stored_len;
}

/*
 * Group the sorted items into spans (records that lie close together, one
 * request each, a record alone too) in a span buffer of the thread while
 * they fit in it: items left without one load alone in _finish.
 */
static void pf_plan(struct tls_ctx *t, ckpt_prefetch *pf)
{
	struct pf_item **o = pf->o;
	const uint64_t blk = CKPT_PACK_DIRECT_ALIGN;
	size_t used = 0, i, j;

	for (i = 0; i < pf->m && pf->nspans < PF_SPANS; i = j) {
		uint64_t a = o[i]->loc.offset / blk * blk;
		struct pf_span *sp;
		size_t len;

		for (j = i + 1; j < pf->m; j++)
			if (o[j]->loc.pack_id != o[i]->loc.pack_id || o[j]->loc.offset < pf_end(o[j - 1]) ||
			    o[j]->loc.offset - pf_end(o[j - 1]) > SPAN_GAP || pf_end(o[j]) - a > SPAN_MAX)
				break;
		len = (size_t)((pf_end(o[j - 1]) - a + blk - 1) / blk * blk);
		if (len > SPAN_BUF - used)
			break;
		if (pf->slot < 0 && (pf->slot = st_tls_span_take(t)) < 0)
			break;
		sp = &pf->sp[pf->nspans++];
		sp->pf = pf;
		sp->i = i;
		sp->j = j;
		sp->pack_id = o[i]->loc.pack_id;
		sp->start = a;
		sp->len = len;
		sp->need = (size_t)(pf_end(o[j - 1]) - a);
		sp->buf = t->span[pf->slot] + used;
		sp->res = PF_UNREAD;
		used += len;
	}
}

/* Submit the spans' reads to the thread's AIO context; the ones that cannot
 * be (no AIO, no O_DIRECT, a refused submission) are read in _finish. */
static void pf_submit(ckpt_store *s, struct tls_ctx *t, ckpt_prefetch *pf)
{
	struct iocb *cbs[PF_SPANS];
	size_t k = 0, done = 0;

	if (!pf->nspans || !st_tls_aio(s, t))
		return;
	/* the pack lock keeps each descriptor open until its read is submitted */
	pthread_rwlock_rdlock(&s->pack_rw);
	for (size_t i = 0; i < pf->nspans; i++) {
		struct pf_span *sp = &pf->sp[i];
		ckpt_pack *p;
		int fd;

		if (st_get_pack(s, sp->pack_id, &p) < 0 || (fd = ckpt_pack_direct_fd(p)) < 0)
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
		long r = syscall(SYS_io_submit, t->aio, (long)(k - done), cbs + done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break; /* the rest is read in _finish */
		done += (size_t)r;
	}
	pthread_rwlock_unlock(&s->pack_rw);
	pf->inflight = done;
}

/*
 * Wait until pf's reads have completed.  Completions of the thread's other
 * batch come in through the same context and are recorded in its spans.
 * Should the context fail, it is destroyed (which waits for its reads) and
 * the thread reads without AIO from then on; spans left without a result
 * are read in _finish.
 */
static void pf_reap(ckpt_store *s, struct tls_ctx *t, ckpt_prefetch *pf)
{
	struct io_event ev[PF_INFLIGHT * PF_SPANS];

	while (pf->inflight > 0 && t->aio_state == 1) {
		long r = syscall(SYS_io_getevents, t->aio, 1L, (long)(PF_INFLIGHT * PF_SPANS), ev,
				 NULL);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			ckpt_warn("%s: io_getevents: %s: read-ahead reads with pread", s->path,
				  strerror(errno));
			(void)syscall(SYS_io_destroy, t->aio);
			t->aio_state = -1;
			break;
		}
		for (long i = 0; i < r; i++) {
			struct pf_span *sp = (struct pf_span *)(uintptr_t)ev[i].data;
			sp->res = ev[i].res;
			sp->pf->inflight--;
		}
	}
	if (t->aio_state != 1)
		pf->inflight = 0; /* its spans without a result are read again */
}

int ckpt_store_prefetch_begin(ckpt_store *s, const ckpt_digest *d, size_t n, bool submit,
			      ckpt_prefetch **ret_pf)
{
	struct tls_ctx *t = st_tls_get(s);
	ckpt_prefetch *pf;
	size_t i;

	*ret_pf = NULL;
	if (!t || !(pf = calloc(1, sizeof(*pf))))
		return -ENOMEM;
	pf->slot = -1;
	pf->n = n;
	pf->it = calloc(n ? n : 1, sizeof(*pf->it));
	pf->o = calloc(n ? n : 1, sizeof(*pf->o));
	if (!pf->it || !pf->o) {
		free(pf->it);
		free(pf->o);
		free(pf);
		return -ENOMEM;
	}
	for (i = 0; i < n; i++) {
		struct pf_item *x = &pf->it[pf->m];

		x->d = &d[i];
		x->e = ckpt_cache_reserve(s->cache, &d[i]);
		if (!x->e)
			continue; /* cached, being loaded, or no memory */
		if (ckpt_store_chunk_loc(s, &d[i], &x->loc, NULL) < 0) {
			ckpt_cache_abandon(s->cache, x->e);
			pf->lost++;
			continue;
		}
		pf->o[pf->m] = x;
		pf->m++;
	}
	qsort(pf->o, pf->m, sizeof(*pf->o), pf_cmp);
	pf_plan(t, pf);
	if (submit)
		pf_submit(s, t, pf);
	*ret_pf = pf;
	return 0;
}

int ckpt_store_prefetch_finish(ckpt_store *s, ckpt_prefetch *pf, size_t *ret_loaded,
			       size_t *ret_skipped)
{
	struct tls_ctx *t = st_tls_get(s); /* the thread's own: begin made it */
	size_t loaded = 0, i;
	int r;

	pf_reap(s, t, pf);
	pthread_rwlock_rdlock(&s->pack_rw);
	for (i = 0; i < pf->nspans; i++) {
		struct pf_span *sp = &pf->sp[i];
		uint64_t start;
		size_t len;
		ckpt_pack *p;

		if (st_get_pack(s, sp->pack_id, &p) < 0) {
			__atomic_fetch_add(&s->pf_stats.failed, 1, __ATOMIC_RELAXED);
			continue; /* gone (compacted): its items load alone */
		}
		__atomic_fetch_add(sp->res != PF_UNREAD ? &s->pf_stats.aio : &s->pf_stats.sync, 1,
				   __ATOMIC_RELAXED);
		if (sp->res == PF_UNREAD) {
			/* not submitted: read it here (through the page cache
			 * where the file system has no O_DIRECT: then alone) */
			r = ckpt_pack_read_window(p, sp->start, sp->need, sp->buf, sp->len, &start,
						  &len);
			sp->res = r < 0 ? r : (int64_t)len;
		}
		if (sp->res < (int64_t)sp->need) {
			__atomic_fetch_add(&s->pf_stats.failed, 1, __ATOMIC_RELAXED);
			continue; /* failed or short: its items load alone and report */
		}
		for (size_t k = sp->i; k < sp->j; k++) {
			struct pf_item *x = pf->o[k];
			if (ckpt_pack_rec_at(p, x->loc.offset, sp->buf + (x->loc.offset - sp->start),
					     x->loc.stored_len, false, &x->rec, &x->src) < 0)
				x->src = NULL; /* its load reads it alone and reports */
		}
	}
	pthread_rwlock_unlock(&s->pack_rw);
	/* decode in the order the reader will want them */
	for (i = 0; i < pf->m; i++) {
		struct pf_item *x = &pf->it[i];
		uint8_t *buf = NULL;
		size_t len;

		if (x->src && (buf = ckpt_cache_buf_alloc(s->cache, x->loc.raw_len)) &&
		    !st_decode_chunk(s, t->dc, x->d, &x->loc, &x->rec, x->src, buf)) {
			len = x->loc.raw_len;
		} else {
			if (buf)
				ckpt_cache_buf_free(s->cache, buf, x->loc.raw_len);
			if (st_load_chunk(s, x->d, &x->loc, &buf, &len) < 0) {
				ckpt_cache_abandon(s->cache, x->e);
				continue;
			}
		}
		ckpt_cache_fill_buf(s->cache, x->e, buf, len, true, true);
		ckpt_cache_release(s->cache, x->e);
		loaded++;
	}
	r = (int)(pf->lost + pf->m - loaded);
	*ret_loaded = loaded;
	*ret_skipped = pf->n - pf->m - pf->lost;
	if (pf->slot >= 0)
		t->span_busy[pf->slot] = false;
	free(pf->o);
	free(pf->it);
	free(pf);
	return r;
}

void ckpt_store_load_ctx_stats(ckpt_store *s, struct ckpt_load_ctx_stats *ret)
{
	pthread_mutex_lock(&s->rctx_lock);
	ret->made = s->rctx_made;
	ret->warm = s->rctx_warm;
	ret->free = s->rctx_nfree;
	pthread_mutex_unlock(&s->rctx_lock);
}

void ckpt_store_prefetch_stats(ckpt_store *s, struct ckpt_prefetch_stats *ret)
{
	ret->aio = __atomic_load_n(&s->pf_stats.aio, __ATOMIC_RELAXED);
	ret->sync = __atomic_load_n(&s->pf_stats.sync, __ATOMIC_RELAXED);
	ret->failed = __atomic_load_n(&s->pf_stats.failed, __ATOMIC_RELAXED);
}

int ckpt_store_prefetch_chunks(ckpt_store *s, const ckpt_digest *d, size_t n,
			       size_t *ret_loaded, size_t *ret_skipped)
{
	ckpt_prefetch *pf;
	int r;

	*ret_loaded = *ret_skipped = 0;
	r = ckpt_store_prefetch_begin(s, d, n, false, &pf);
	if (r < 0)
		return r;
	return ckpt_store_prefetch_finish(s, pf, ret_loaded, ret_skipped);
}

