/* SPDX-License-Identifier: MIT */
/*
 * read.c - reads of extent lists: cursors and gathers.
 */
#include "store/store_int.h"

void ckpt_read_cursor_init(struct ckpt_read_cursor *c, const struct ckpt_extent_list *l)
{
	memset(c, 0, sizeof(*c));
	c->l = l;
}

void ckpt_store_cursor_done(ckpt_store *s, struct ckpt_read_cursor *c)
{
	if (c->e)
		ckpt_cache_release_read(s->cache, c->e, c->got);
	c->e = NULL;
	c->got = 0;
}

/* Before a read of extents i.. up to end on a server engine: their chunks
 * as one batch (ckpt_store_load_batch). */
#define BATCH_CHUNKS 64
static void load_batch(ckpt_store *s, const struct ckpt_extent_list *l, size_t i, uint64_t end)
{
	ckpt_digest d[BATCH_CHUNKS];
	size_t n = 0;

	for (; i < l->n && l->v[i].off < end && n < BATCH_CHUNKS; i++)
		if (l->v[i].kind != CKPT_EXT_ZERO &&
		    (n == 0 || memcmp(&d[n - 1], &l->v[i].digest, sizeof(d[0])) != 0))
			d[n++] = l->v[i].digest;
	ckpt_store_load_batch(s, d, n);
}

ssize_t ckpt_store_cursor_read(ckpt_store *s, struct ckpt_read_cursor *c, void *dst, size_t len,
			       uint64_t off)
{
	const struct ckpt_extent_list *l = c->l;
	uint8_t *p = dst;
	size_t done = 0;
	size_t i = c->hint;

	if (off >= l->size)
		return 0;
	if (len > l->size - off)
		len = (size_t)(l->size - off);
	/* Views read many short runs in order: try the last extent and the
	 * next one before searching. */
	if (!(i < l->n && l->v[i].off <= off && off - l->v[i].off < l->v[i].len)) {
		if (i + 1 < l->n && l->v[i + 1].off <= off && off - l->v[i + 1].off < l->v[i + 1].len)
			i++;
		else
			i = ckpt_extent_list_find(l, off);
	}
	if (ckpt_store_batches_loads(s) && i + 1 < l->n && l->v[i + 1].off < off + len)
		load_batch(s, l, i, off + len);
	while (done < len && i < l->n) {
		const struct ckpt_extent *e = &l->v[i];
		uint64_t in = off + done - e->off;
		size_t n = CKPT_MIN((size_t)(e->len - in), len - done);
		if (e->kind == CKPT_EXT_ZERO) {
			memset(p + done, 0, n);
			if (c->g)
				ckpt_gather_buf(c->g, p + done, n);
		} else {
			if (!c->e || c->ei != i) {
				ckpt_store_cursor_done(s, c);
				int r = st_chunk_get(s, &e->digest, c->g && c->g->stream, &c->e,
						     &c->data, &c->dlen);
				if (r < 0)
					return r;
				c->ei = i;
			}
			if (in > c->dlen || n > c->dlen - in)
				return -EIO;
			c->got += n;
			if (c->g && n >= CKPT_GATHER_MIN && c->g->niov + 2 <= CKPT_GATHER_MAX) {
				/* reference the cached bytes; one slot stays free for
				 * the pieces after the last reference */
				ckpt_cache_ref(s->cache, c->e);
				c->g->pins[c->g->npins++] = c->e;
				c->g->iov[c->g->niov].iov_base = (void *)(c->data + in);
				c->g->iov[c->g->niov].iov_len = n;
				c->g->niov++;
			} else {
				memcpy(p + done, c->data + in, n);
				if (c->g)
					ckpt_gather_buf(c->g, p + done, n);
			}
		}
		c->hint = i;
		done += n;
		i++;
	}
	return (ssize_t)done;
}

void ckpt_gather_init(struct ckpt_gather *g)
{
	g->stream = false;
	g->niov = 0;
	g->npins = 0;
}

void ckpt_gather_buf(struct ckpt_gather *g, const uint8_t *p, size_t n)
{
	struct iovec *last = g->niov ? &g->iov[g->niov - 1] : NULL;

	if (!n)
		return;
	if (last && (const uint8_t *)last->iov_base + last->iov_len == p) {
		last->iov_len += n;
		return;
	}
	/* the cursor keeps a slot free for this (see ckpt_store_cursor_read) */
	g->iov[g->niov].iov_base = (void *)p;
	g->iov[g->niov].iov_len = n;
	g->niov++;
}

void ckpt_store_gather_done(ckpt_store *s, struct ckpt_gather *g)
{
	for (size_t i = 0; i < g->npins; i++)
		ckpt_cache_release(s->cache, g->pins[i]);
	g->npins = 0;
	g->niov = 0;
}

ssize_t ckpt_store_read_extents_gather(ckpt_store *s, const struct ckpt_extent_list *l,
				       void *dst, size_t len, uint64_t off, struct ckpt_gather *g)
{
	struct ckpt_read_cursor c;
	ssize_t r;

	ckpt_read_cursor_init(&c, l);
	c.g = g;
	r = ckpt_store_cursor_read(s, &c, dst, len, off);
	ckpt_store_cursor_done(s, &c);
	return r;
}

ssize_t ckpt_store_read_extents(ckpt_store *s, const struct ckpt_extent_list *l, void *dst,
				size_t len, uint64_t off)
{
	struct ckpt_read_cursor c;
	ssize_t r;

	ckpt_read_cursor_init(&c, l);
	r = ckpt_store_cursor_read(s, &c, dst, len, off);
	ckpt_store_cursor_done(s, &c);
	return r;
}

size_t ckpt_store_prefetch_list(const struct ckpt_extent_list *l, uint64_t off, uint64_t len,
				ckpt_digest *out, size_t max, const ckpt_digest *skip)
{
	size_t n = 0, i;

	if (off >= l->size)
		return 0;
	if (len > l->size - off)
		len = l->size - off;
	for (i = ckpt_extent_list_find(l, off); i < l->n && l->v[i].off < off + len && n < max;
	     i++) {
		const struct ckpt_extent *e = &l->v[i];
		if (e->kind == CKPT_EXT_ZERO)
			continue;
		if (n ? !memcmp(out[n - 1].bytes, e->digest.bytes, CKPT_DIGEST_LEN) :
			(skip && !memcmp(skip->bytes, e->digest.bytes, CKPT_DIGEST_LEN)))
			continue;
		out[n++] = e->digest;
	}
	return n;
}

int ckpt_store_load_extents(ckpt_store *s, uint64_t ino, struct ckpt_extent_list **ret_list)
{
	struct commit *c;
	struct ckpt_extent_list *l = NULL;

	pthread_mutex_lock(&s->overlay_lock);
	c = st_overlay_find_locked(s, ino);
	if (c)
		l = ckpt_extent_list_dup(c->list);
	pthread_mutex_unlock(&s->overlay_lock);
	if (c) {
		*ret_list = l;
		return l ? 0 : -ENOMEM;
	}
	return st_db_load_extents(s, NULL, ino, ret_list);
}

