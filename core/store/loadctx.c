/* SPDX-License-Identifier: MIT */
/*
 * loadctx.c - the per-thread compressor and decompressor, the read
 * contexts made at open, and the store's simple accessors.
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

/* Make RCTX_WARM read contexts, sized for the default chunker's largest
 * chunk and touched (st_touch_at_open()).  Failing is not an error: loads
 * then make their own. */
void st_rctx_warm(ckpt_store *s)
{
	ckpt_loadctx_warm(s->rctx, RCTX_WARM, ckpt_cb_get_len_max(s->cb, CKPT_CDC_DEFAULT_MAX),
			  CKPT_CDC_DEFAULT_MAX);
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
	o->pack_max = 0; /* auto */
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

bool ckpt_store_is_node(const ckpt_store *s)
{
	return s->opts.node;
}

bool ckpt_store_put_is_cheap(const ckpt_store *s)
{
	return s->opts.compress_level == 0 || (s->bg_started && s->opts.bg == CKPT_BG_ALL);
}

int ckpt_store_compress_level(const ckpt_store *s)
{
	return s->opts.compress_level;
}

