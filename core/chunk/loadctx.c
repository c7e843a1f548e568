/* SPDX-License-Identifier: MIT */
/*
 * loadctx.c - the pool of read contexts (loadctx.h).
 */
#include "chunk/loadctx.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "base/util.h"

struct ckpt_loadctx {
	ckpt_decompressor *dc;
	void *rec_map;  /* rec_cap + CKPT_HUGE_ALIGN bytes, or NULL */
	uint8_t *rec;   /* rec_cap bytes, huge-page aligned */
	size_t rec_cap; /* a multiple of CKPT_HUGE_ALIGN, at most CKPT_LOADCTX_BUF_MAX */
	struct ckpt_loadctx *next; /* on the free list */
};

struct ckpt_loadctx_pool {
	unsigned keep; /* immutable */
	pthread_mutex_t lock;
	/* Protected by lock: */
	struct ckpt_loadctx *free_list;
	unsigned nfree;
	uint64_t made, warm;
};

static void ctx_free(struct ckpt_loadctx *x)
{
	if (!x)
		return;
	ckpt_decompressor_free(x->dc);
	if (x->rec_map)
		munmap(x->rec_map, x->rec_cap + CKPT_HUGE_ALIGN);
	free(x);
}

int ckpt_loadctx_pool_new(unsigned keep, ckpt_loadctx_pool **ret)
{
	ckpt_loadctx_pool *p = calloc(1, sizeof(*p));

	if (!p)
		return -ENOMEM;
	p->keep = keep;
	pthread_mutex_init(&p->lock, NULL);
	*ret = p;
	return 0;
}

void ckpt_loadctx_pool_free(ckpt_loadctx_pool *p)
{
	if (!p)
		return;
	while (p->free_list) {
		struct ckpt_loadctx *x = p->free_list;

		p->free_list = x->next;
		ctx_free(x);
	}
	pthread_mutex_destroy(&p->lock);
	free(p);
}

/* A new context, counted in p->made; NULL without memory. */
static struct ckpt_loadctx *ctx_new(ckpt_loadctx_pool *p)
{
	struct ckpt_loadctx *x = calloc(1, sizeof(*x));

	if (!x)
		return NULL;
	if (ckpt_decompressor_new(&x->dc) < 0) {
		free(x);
		return NULL;
	}
	/* every decoded chunk is checked against its keyed digest */
	ckpt_decompressor_skip_checksum(x->dc);
	pthread_mutex_lock(&p->lock);
	p->made++;
	pthread_mutex_unlock(&p->lock);
	return x;
}

/* x's record buffer, at least need bytes (need <= CKPT_LOADCTX_BUF_MAX);
 * NULL without memory (x keeps its old buffer). */
static uint8_t *ctx_rec(struct ckpt_loadctx *x, size_t need)
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

uint8_t *ckpt_loadctx_buf(ckpt_loadctx *x, size_t need, void **ret_own)
{
	*ret_own = NULL;
	if (need <= CKPT_LOADCTX_BUF_MAX)
		return ctx_rec(x, need);
	if (posix_memalign(ret_own, CKPT_CHUNK_BUF_ALIGN, need) != 0)
		*ret_own = NULL;
	return *ret_own;
}

ckpt_decompressor *ckpt_loadctx_dc(ckpt_loadctx *x)
{
	return x->dc;
}

ckpt_loadctx *ckpt_loadctx_get(ckpt_loadctx_pool *p)
{
	struct ckpt_loadctx *x;

	pthread_mutex_lock(&p->lock);
	x = p->free_list;
	if (x) {
		p->free_list = x->next;
		p->nfree--;
	}
	pthread_mutex_unlock(&p->lock);
	return x ? x : ctx_new(p);
}

void ckpt_loadctx_put(ckpt_loadctx_pool *p, ckpt_loadctx *x)
{
	pthread_mutex_lock(&p->lock);
	if (p->nfree < p->keep) {
		x->next = p->free_list;
		p->free_list = x;
		p->nfree++;
		x = NULL;
	}
	pthread_mutex_unlock(&p->lock);
	ctx_free(x);
}

void ckpt_loadctx_warm(ckpt_loadctx_pool *p, unsigned n, size_t buf, size_t raw)
{
	if (buf > CKPT_LOADCTX_BUF_MAX)
		return;
	for (unsigned i = 0; i < n; i++) {
		struct ckpt_loadctx *x = ctx_new(p);

		if (!x)
			return;
		if (!ctx_rec(x, buf) || ckpt_decompressor_reserve(x->dc, raw) < 0) {
			ctx_free(x);
			return;
		}
		ckpt_mem_populate(x->rec, x->rec_cap);
		pthread_mutex_lock(&p->lock);
		p->warm++;
		pthread_mutex_unlock(&p->lock);
		ckpt_loadctx_put(p, x);
	}
}

void ckpt_loadctx_stats(ckpt_loadctx_pool *p, struct ckpt_loadctx_stats *ret)
{
	pthread_mutex_lock(&p->lock);
	ret->made = p->made;
	ret->warm = p->warm;
	ret->free = p->nfree;
	pthread_mutex_unlock(&p->lock);
}
