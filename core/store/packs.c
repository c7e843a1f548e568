/* SPDX-License-Identifier: MIT */
/*
 * packs.c - the pack set and the pending table.
 */
#include "store/store_int.h"

/* Caller holds pack_lock. */
static ckpt_pack *find_pack_locked(ckpt_store *s, uint64_t id)
{
	for (size_t i = 0; i < s->npacks; i++)
		if (ckpt_pack_id(s->packs[i]) == id)
			return s->packs[i];
	return NULL;
}

static int add_pack_locked(ckpt_store *s, ckpt_pack *p)
{
	if (s->npacks == s->cap_packs) {
		size_t cap = s->cap_packs ? s->cap_packs * 2 : 16;
		ckpt_pack **v = realloc(s->packs, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		s->packs = v;
		s->cap_packs = cap;
	}
	s->packs[s->npacks++] = p;
	return 0;
}

int st_get_pack(ckpt_store *s, uint64_t id, ckpt_pack **ret)
{
	ckpt_pack *p;
	int r = 0;

	pthread_mutex_lock(&s->pack_lock);
	p = find_pack_locked(s, id);
	if (!p) {
		r = ckpt_pack_open(s->packs_fd, id, s->uuid, false, &p);
		if (r == 0) {
			r = add_pack_locked(s, p);
			if (r < 0)
				ckpt_pack_free(p);
		} else {
			ckpt_err("%s: cannot open pack %" PRIu64 ": %s", s->path, id, strerror(-r));
		}
	}
	pthread_mutex_unlock(&s->pack_lock);
	if (r == 0)
		*ret = p;
	return r;
}

int st_new_pack_locked(ckpt_store *s, ckpt_pack **ret);

/* Start a new write pack.  Caller holds pack_lock. */
int st_roll_pack_locked(ckpt_store *s)
{
	ckpt_pack *p;
	int r = st_new_pack_locked(s, &p);

	if (r == 0)
		s->wpack = p;
	return r;
}

/* Create and register a new pack.  Caller holds pack_lock. */
int st_new_pack_locked(ckpt_store *s, ckpt_pack **ret)
{
	ckpt_batch *b;
	ckpt_pack *p = NULL;
	uint64_t id = s->next_pack;
	int r;

	/* Persist the counter first so an id is never reused after a crash. */
	b = ckpt_batch_new();
	if (!b)
		return -ENOMEM;
	st_batch_meta_u64(b, "next_pack", id + 1);
	r = ckpt_index_write(s->ix, b, true);
	ckpt_batch_free(b);
	if (r < 0)
		return r;
	s->next_pack = id + 1;
	r = ckpt_pack_create(s->packs_fd, id, s->uuid, &p);
	if (r < 0) {
		ckpt_err("%s: cannot create pack %" PRIu64 ": %s", s->path, id, strerror(-r));
		return r;
	}
	r = add_pack_locked(s, p);
	if (r < 0) {
		ckpt_pack_free(p);
		return r;
	}
	*ret = p;
	return 0;
}


unsigned st_pending_bucket(const ckpt_digest *d)
{
	uint32_t h;

	memcpy(&h, d->bytes + 4, sizeof(h));
	return h % PENDING_BUCKETS;
}

bool st_pending_find(ckpt_store *s, const ckpt_digest *d, struct ckpt_chunk_loc *ret)
{
	struct pending *p;
	bool found = false;

	pthread_mutex_lock(&s->pending_lock);
	for (p = s->pending[st_pending_bucket(d)]; p; p = p->next) {
		if (memcmp(p->digest.bytes, d->bytes, CKPT_DIGEST_LEN) == 0) {
			if (ret)
				*ret = p->loc;
			found = true;
			break;
		}
	}
	pthread_mutex_unlock(&s->pending_lock);
	return found;
}

/* Insert unless present; returns true if it was inserted. */
bool st_pending_add(ckpt_store *s, const ckpt_digest *d, const struct ckpt_chunk_loc *loc)
{
	struct pending *p, *n = malloc(sizeof(*n));
	unsigned b = st_pending_bucket(d);
	bool added = false;

	pthread_mutex_lock(&s->pending_lock);
	for (p = s->pending[b]; p; p = p->next)
		if (memcmp(p->digest.bytes, d->bytes, CKPT_DIGEST_LEN) == 0)
			break;
	if (!p && n) {
		n->digest = *d;
		n->loc = *loc;
		n->next = s->pending[b];
		s->pending[b] = n;
		n = NULL;
		added = true;
	}
	pthread_mutex_unlock(&s->pending_lock);
	free(n);
	return added;
}

void st_pending_remove(ckpt_store *s, const ckpt_digest *d)
{
	struct pending **pp, *p;

	pthread_mutex_lock(&s->pending_lock);
	for (pp = &s->pending[st_pending_bucket(d)]; (p = *pp); pp = &p->next) {
		if (memcmp(p->digest.bytes, d->bytes, CKPT_DIGEST_LEN) == 0) {
			*pp = p->next;
			free(p);
			break;
		}
	}
	pthread_mutex_unlock(&s->pending_lock);
}

