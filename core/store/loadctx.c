/* SPDX-License-Identifier: MIT */
/*
 * loadctx.c - read contexts and the per-thread state of chunk loads and read-ahead.
 */
#include "store/store_int.h"

void st_tls_free(void *p)
{
	struct tls_ctx *t = p;

	if (!t)
		return;
	ckpt_compressor_free(t->cc);
	ckpt_decompressor_free(t->dc);
	free(t);
}

void st_rctx_free(struct rctx *x)
{
	if (!x)
		return;
	ckpt_decompressor_free(x->dc);
	if (x->rec_map)
		munmap(x->rec_map, x->rec_cap + CKPT_HUGE_ALIGN);
	free(x);
}

/* A new read context, counted in s->rctx_made; NULL without memory. */
static struct rctx *rctx_new(ckpt_store *s)
{
	struct rctx *x = calloc(1, sizeof(*x));

	if (!x)
		return NULL;
	if (ckpt_decompressor_new(&x->dc) < 0) {
		free(x);
		return NULL;
	}
	/* every decoded chunk is checked against its keyed digest */
	ckpt_decompressor_skip_checksum(x->dc);
	pthread_mutex_lock(&s->rctx_lock);
	s->rctx_made++;
	pthread_mutex_unlock(&s->rctx_lock);
	return x;
}

/* x's record buffer, at least need bytes (need <= RCTX_REC_MAX); NULL
 * without memory (x keeps its old buffer). */
uint8_t *st_rctx_rec(struct rctx *x, size_t need)
{
	size_t cap = (need + CKPT_HUGE_ALIGN - 1) / CKPT_HUGE_ALIGN * CKPT_HUGE_ALIGN;
	void *m;
	uint8_t *a;

	if (x->rec && x->rec_cap >= need)
		return x->rec;
	a = ckpt_map_huge(cap, &m);
	if (!a)
		return NULL;
	if (x->rec_map)
		munmap(x->rec_map, x->rec_cap + CKPT_HUGE_ALIGN);
	x->rec_map = m;
	x->rec = a;
	x->rec_cap = cap;
	return a;
}

/* A buffer for a record the backend's get needs need bytes for: x's, or
 * for a record larger than any chunker makes by default one of its own
 * (*ret_own, the caller frees it).  NULL without memory. */
uint8_t *st_rec_buf(struct rctx *x, size_t need, void **ret_own)
{
	*ret_own = NULL;
	if (need <= RCTX_REC_MAX)
		return st_rctx_rec(x, need);
	if (posix_memalign(ret_own, CKPT_CHUNK_BUF_ALIGN, need) != 0)
		*ret_own = NULL;
	return *ret_own;
}

/* A read context off the free list, or a new one; NULL without memory. */
struct rctx *st_rctx_get(ckpt_store *s)
{
	struct rctx *x;

	pthread_mutex_lock(&s->rctx_lock);
	x = s->rctx_free;
	if (x) {
		s->rctx_free = x->next;
		s->rctx_nfree--;
	}
	pthread_mutex_unlock(&s->rctx_lock);
	return x ? x : rctx_new(s);
}

void st_rctx_put(ckpt_store *s, struct rctx *x)
{
	pthread_mutex_lock(&s->rctx_lock);
	if (s->rctx_nfree < RCTX_KEEP) {
		x->next = s->rctx_free;
		s->rctx_free = x;
		s->rctx_nfree++;
		x = NULL;
	}
	pthread_mutex_unlock(&s->rctx_lock);
	st_rctx_free(x);
}

/* Make RCTX_WARM read contexts, sized for the default chunker's largest
 * chunk and touched (st_touch_at_open()).  Failing is not an error: loads
 * then make their own. */
void st_rctx_warm(ckpt_store *s)
{
	size_t need = ckpt_cb_get_len_max(s->cb, CKPT_CDC_DEFAULT_MAX);

	if (need > RCTX_REC_MAX)
		return;

	for (int i = 0; i < RCTX_WARM; i++) {
		struct rctx *x = rctx_new(s);

		if (!x)
			return;
		if (!st_rctx_rec(x, need) || ckpt_decompressor_reserve(x->dc, CKPT_CDC_DEFAULT_MAX) < 0) {
			st_rctx_free(x);
			return;
		}
		ckpt_mem_populate(x->rec, x->rec_cap);
		pthread_mutex_lock(&s->rctx_lock);
		s->rctx_warm++;
		pthread_mutex_unlock(&s->rctx_lock);
		st_rctx_put(s, x);
	}
}

struct tls_ctx *st_tls_get(ckpt_store *s)
{
	struct tls_ctx *t = pthread_getspecific(s->tls_key);

	if (t)
		return t;
	t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	if (ckpt_compressor_new(s->opts.compress_level, &t->cc) < 0 ||
	    ckpt_decompressor_new(&t->dc) < 0) {
		st_tls_free(t);
		return NULL;
	}
	/* every decoded chunk is checked against its keyed digest */
	ckpt_decompressor_skip_checksum(t->dc);
	pthread_setspecific(s->tls_key, t);
	return t;
}

/* Whether read memory is touched when the store opens (a buffer reserve
 * for the cache, read-ahead's span buffers): -o buf_reserve, not 0. */
bool st_touch_at_open(const struct ckpt_store_opts *o)
{
	return o->buf_reserve && o->cache_size;
}

int ckpt_store_prefetch_warm(ckpt_store *s)
{
	struct tls_ctx *t;

	if (!st_touch_at_open(&s->opts))
		return 0; /* nothing touched ahead of use (buf_reserve=0) */
	t = st_tls_get(s);
	if (!t || ckpt_cb_span_warm(s->cb) < 0)
		return -ENOMEM;
	/* the planes of a shuffled chunk, before they are interleaved */
	return ckpt_decompressor_reserve(t->dc, CKPT_CDC_DEFAULT_MAX);
}


void ckpt_store_opts_init(struct ckpt_store_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->mode = CKPT_STORE_RW;
	o->compress_level = 1;
	o->cache_size = 256u << 20;
	o->pack_max = 1ull << 30;
}

/* For unit tests only (declared in tests/, not in store.h): the store's
 * metadata engine, to damage records on purpose. */
ckpt_engine *ckpt_store_engine(ckpt_store *s);
ckpt_engine *ckpt_store_engine(ckpt_store *s)
{
	return s->eng;
}

const char *ckpt_store_path(const ckpt_store *s)
{
	return s->path;
}

bool ckpt_store_writable(const ckpt_store *s)
{
	return s->opts.mode == CKPT_STORE_RW;
}

bool ckpt_store_put_is_cheap(const ckpt_store *s)
{
	return s->opts.compress_level == 0 || (s->bg_started && s->opts.bg == CKPT_BG_ALL);
}

int ckpt_store_compress_level(const ckpt_store *s)
{
	return s->opts.compress_level;
}

