/* SPDX-License-Identifier: MIT */
/*
 * vcache.c - the reference-counted caches of parsed sources and view
 * models (see vcache.h).
 */
#include "views/vcache.h"

#include <stdlib.h>

void vcache_unref(struct vcache *c, struct vcache_node *n)
{
	struct vcache_node **pp;

	if (!n)
		return;
	pthread_mutex_lock(&c->lock);
	if (--n->refs > 0) {
		pthread_mutex_unlock(&c->lock);
		return;
	}
	for (pp = &c->head; *pp && *pp != n; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = n->next;
	pthread_mutex_unlock(&c->lock);
	c->destroy(n);
}

/* Drop the cache's hold on one kept entry that pred selects (idx: its
 * position in the list).  Returns false when there is none. */
static bool release_one(struct vcache *c,
			bool (*pred)(const struct vcache_node *n, size_t idx, const void *arg),
			const void *arg)
{
	struct vcache_node *n;
	size_t k = 0;

	pthread_mutex_lock(&c->lock);
	for (n = c->head; n; n = n->next, k++)
		if (n->kept && pred(n, k, arg))
			break;
	if (n)
		n->kept = false;
	pthread_mutex_unlock(&c->lock);
	if (!n)
		return false;
	vcache_unref(c, n);
	return true;
}

static bool past_keep(const struct vcache_node *n, size_t idx, const void *arg)
{
	(void)n;
	return idx >= *(const size_t *)arg;
}

/* The oldest kept entry, other than the newest kept one, whose bytes and
 * those of the newer kept entries pass the budget. */
static bool past_budget(struct vcache *c)
{
	struct vcache_node *n;
	size_t sum = 0;
	bool first = true;

	pthread_mutex_lock(&c->lock);
	if (c->max_bytes == 0) {
		pthread_mutex_unlock(&c->lock);
		return false;
	}
	for (n = c->head; n; n = n->next) {
		if (!n->kept)
			continue;
		sum += n->bytes;
		if (!first && sum > c->max_bytes)
			break;
		first = false;
	}
	if (n)
		n->kept = false;
	pthread_mutex_unlock(&c->lock);
	if (!n)
		return false;
	vcache_unref(c, n);
	return true;
}

static bool of_store(const struct vcache_node *n, size_t idx, const void *arg)
{
	(void)idx;
	return n->s == arg;
}

void vcache_insert(struct vcache *c, struct vcache_node *n, ckpt_store *s)
{
	n->s = s;
	n->refs = 2;
	n->kept = true;
	pthread_mutex_lock(&c->lock);
	n->next = c->head;
	c->head = n;
	pthread_mutex_unlock(&c->lock);
	while (release_one(c, past_keep, &c->keep))
		;
	while (past_budget(c))
		;
}

struct vcache_node *vcache_find(struct vcache *c,
				bool (*match)(const struct vcache_node *n, const void *key),
				const void *key)
{
	struct vcache_node *n;

	pthread_mutex_lock(&c->lock);
	for (n = c->head; n; n = n->next)
		if (match(n, key))
			break;
	if (n)
		n->refs++;
	pthread_mutex_unlock(&c->lock);
	return n;
}

void vcache_forget_store(struct vcache *c, ckpt_store *s)
{
	while (release_one(c, of_store, s))
		;
}

void vcache_sweep(struct vcache *c, bool (*dead)(const struct vcache_node *n))
{
	/* at most keep entries are kept, keep + 1 while an insert trims */
	size_t cap = c->keep + 1, nv = 0;
	struct vcache_node **v = malloc(cap * sizeof(*v)), *n;

	if (!v)
		return;
	pthread_mutex_lock(&c->lock);
	for (n = c->head; n && nv < cap; n = n->next)
		if (n->kept) {
			n->refs++;
			v[nv++] = n;
		}
	pthread_mutex_unlock(&c->lock);
	for (size_t i = 0; i < nv; i++) {
		bool drop = false;

		if (dead(v[i])) {
			pthread_mutex_lock(&c->lock);
			drop = v[i]->kept;
			v[i]->kept = false;
			pthread_mutex_unlock(&c->lock);
		}
		if (drop)
			vcache_unref(c, v[i]); /* the cache's hold */
		vcache_unref(c, v[i]);         /* the sweep's */
	}
	free(v);
}

size_t vcache_count(struct vcache *c)
{
	size_t n = 0;

	pthread_mutex_lock(&c->lock);
	for (struct vcache_node *e = c->head; e; e = e->next)
		n++;
	pthread_mutex_unlock(&c->lock);
	return n;
}

size_t vcache_kept_bytes(struct vcache *c)
{
	size_t b = 0;

	pthread_mutex_lock(&c->lock);
	for (struct vcache_node *e = c->head; e; e = e->next)
		if (e->kept)
			b += e->bytes;
	pthread_mutex_unlock(&c->lock);
	return b;
}

void vcache_set_budget(struct vcache *c, size_t max_bytes)
{
	pthread_mutex_lock(&c->lock);
	c->max_bytes = max_bytes;
	pthread_mutex_unlock(&c->lock);
	while (past_budget(c))
		;
}
