/* SPDX-License-Identifier: MIT */
/*
 * prefetch.c - read-ahead batches: chunks reserved in the cache, their
 * records read by the backend's span reads, decoded into the cache.
 */
#include "store/store_int.h"

struct pf_item {
	const ckpt_digest *d;
	ckpt_cache_entry *e;
	struct ckpt_chunk_span_item ci; /* its location, and its record once read */
};

/*
 * A batch between ckpt_store_prefetch_begin and _finish, owned by the
 * thread that began it.  The backend's span batch reads the records; the
 * store reserves the chunks in the cache, decodes and fills them.
 */
struct ckpt_prefetch {
	struct pf_item *it;                /* the reserved chunks, in the order asked for */
	struct ckpt_chunk_span_item **o;   /* their span items, for the backend to order */
	size_t n, m, lost;                 /* asked for, reserved, not in the index */
	ckpt_chunk_span *sp;               /* the backend's batch, or NULL */
};

/*
 * Reserve in the cache the chunks of d[0..n) that are neither cached nor
 * being loaded, and find their locations: in the pending table, else in
 * the index, all of them in one engine request (ckpt_meta_get_chunks: on
 * a server engine one round trip, not one per chunk).  A chunk found
 * nowhere is abandoned and counted lost.  -ENOMEM leaves nothing reserved.
 */
static int locate(ckpt_store *s, ckpt_prefetch *pf, const ckpt_digest *d, size_t n)
{
	ckpt_digest *ask = malloc((n ? n : 1) * sizeof(*ask));
	struct ckpt_chunk_loc *locs = malloc((n ? n : 1) * sizeof(*locs));
	bool *found = malloc(n ? n : 1);
	size_t *which = malloc((n ? n : 1) * sizeof(*which));
	size_t na = 0, i, keep;
	int r = -ENOMEM;

	if (!ask || !locs || !found || !which)
		goto out;
	for (i = 0; i < n; i++) {
		struct pf_item *x = &pf->it[pf->m];

		x->d = &d[i];
		x->e = ckpt_cache_reserve(s->cache, &d[i]);
		if (!x->e)
			continue; /* cached, being loaded, or no memory */
		if (!st_pending_find(s, &d[i], &x->ci.loc)) {
			which[na] = pf->m;
			ask[na++] = d[i];
		}
		pf->m++;
	}
	if (na && ckpt_meta_get_chunks(s->eng, ask, na, locs, found) < 0)
		memset(found, 0, na); /* each is looked up alone below */
	for (i = 0; i < na; i++) {
		struct pf_item *x = &pf->it[which[i]];

		if (found[i])
			x->ci.loc = locs[i];
		else if (ckpt_store_chunk_loc(s, x->d, &x->ci.loc, NULL) < 0) {
			ckpt_cache_abandon(s->cache, x->e);
			x->e = NULL; /* not in the index: lost */
		}
	}
	/* keep the located ones, in order */
	for (i = 0, keep = 0; i < pf->m; i++) {
		if (!pf->it[i].e) {
			pf->lost++;
			continue;
		}
		pf->it[keep] = pf->it[i];
		pf->o[keep] = &pf->it[keep].ci;
		keep++;
	}
	pf->m = keep;
	r = 0;
out:
	free(ask);
	free(locs);
	free(found);
	free(which);
	return r;
}

int ckpt_store_prefetch_begin(ckpt_store *s, const ckpt_digest *d, size_t n, bool submit,
			      ckpt_prefetch **ret_pf)
{
	struct tls_ctx *t = st_tls_get(s);
	ckpt_prefetch *pf;

	*ret_pf = NULL;
	if (!t || !(pf = calloc(1, sizeof(*pf))))
		return -ENOMEM;
	pf->n = n;
	pf->it = calloc(n ? n : 1, sizeof(*pf->it));
	pf->o = calloc(n ? n : 1, sizeof(*pf->o));
	if (!pf->it || !pf->o) {
		free(pf->it);
		free(pf->o);
		free(pf);
		return -ENOMEM;
	}
	if (locate(s, pf, d, n) < 0) {
		free(pf->o);
		free(pf->it);
		free(pf);
		return -ENOMEM;
	}
	/* without a batch every chunk loads alone in _finish */
	if (ckpt_cb_span_begin(s->cb, pf->o, pf->m, submit, &pf->sp) < 0)
		pf->sp = NULL;
	*ret_pf = pf;
	return 0;
}

bool ckpt_store_batches_loads(const ckpt_store *s)
{
	return ckpt_engine_batches(s->eng);
}

void ckpt_store_load_batch(ckpt_store *s, const ckpt_digest *d, size_t n)
{
	ckpt_prefetch *pf;
	size_t loaded, skipped;

	if (n >= 2 && ckpt_store_batches_loads(s) &&
	    ckpt_store_prefetch_begin(s, d, n, true, &pf) == 0)
		ckpt_store_prefetch_finish(s, pf, &loaded, &skipped);
}

int ckpt_store_prefetch_finish(ckpt_store *s, ckpt_prefetch *pf, size_t *ret_loaded,
			       size_t *ret_skipped)
{
	struct tls_ctx *t = st_tls_get(s); /* the thread's own: begin made it */
	size_t loaded = 0, i;
	int r;

	if (pf->sp)
		ckpt_cb_span_wait(s->cb, pf->sp);
	/* decode in the order the reader will want them */
	for (i = 0; i < pf->m; i++) {
		struct pf_item *x = &pf->it[i];
		const struct ckpt_chunk_loc *loc = &x->ci.loc;
		uint8_t *buf = NULL;
		size_t len;

		if (pf->sp && x->ci.stored && (buf = ckpt_cache_buf_alloc(s->cache, loc->raw_len)) &&
		    !st_decode_chunk(s, t->dc, x->d, loc, &x->ci.rec, x->ci.stored, buf)) {
			len = loc->raw_len;
		} else {
			if (buf)
				ckpt_cache_buf_free(s->cache, buf, loc->raw_len);
			if (st_load_chunk(s, x->d, loc, &buf, &len) < 0) {
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
	ckpt_cb_span_end(s->cb, pf->sp);
	free(pf->o);
	free(pf->it);
	free(pf);
	return r;
}

void ckpt_store_load_ctx_stats(ckpt_store *s, struct ckpt_load_ctx_stats *ret)
{
	struct ckpt_loadctx_stats st;

	ckpt_loadctx_stats(s->rctx, &st);
	ret->made = st.made;
	ret->warm = st.warm;
	ret->free = st.free;
}

void ckpt_store_prefetch_stats(ckpt_store *s, struct ckpt_prefetch_stats *ret)
{
	struct ckpt_chunk_backend_stats bs;

	ckpt_cb_stats(s->cb, &bs);
	ret->aio = bs.span_async;
	ret->sync = bs.span_sync;
	ret->failed = bs.span_failed;
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

