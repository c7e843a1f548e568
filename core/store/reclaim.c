/* SPDX-License-Identifier: MIT */
/*
 * reclaim.c - online reclaiming of garbage chunks (docs/design.md section
 * 8.2): holds, the grace period, and the background thread's drops of
 * index entries at refcount 0 and of pending chunks that no closed file
 * names.  Compaction (compact.c) then reclaims the space they took.
 *
 * Garbage is found by a scan: the index entries at refcount 0 (a drop set)
 * and, implicitly, every pending entry whose epoch is not after the scan.
 * Right after the scan the epoch advances from k to k + 1.  The set is
 * dropped once
 *  1. no hold of epoch <= k is live (the grace period: whatever obtained
 *     digests before the scan has committed them, renewed or gone),
 *  2. the overlay is empty (every closed file's content is in the index),
 *     checked under commit_lock, which is then held through the drop, so
 *     no commit and no durable commit runs meanwhile,
 * and then only the members that nothing obtained again since the scan:
 * an index entry still at refcount 0 when read for update in the drop's
 * transaction and not marked CAND_REVIVED, a pending entry whose epoch is
 * still <= k.  Digests are obtained again (st_revive) by dedup hits of
 * puts, by commits (their new references), and when a closed file's
 * content leaves the overlay without reaching the index (replaced by a
 * newer close, or its file deleted): a holder that copied that content
 * after the scan may still read it.  A digest obtained again becomes
 * garbage only in a later scan, whose grace period covers its holders.
 *
 * A put racing with the drop: st_revive marks a member CAND_REVIVED before
 * the drop collects it, or finds it CAND_DROPPING and the put then stores
 * its own record instead of counting on the index entry.
 */
#include "store/store_int.h"

struct ckpt_hold {
	ckpt_store *s;
	/* Protected by s->hold_lock: */
	uint64_t epoch;
	bool listed; /* in the epoch list (not narrowed) */
	struct ckpt_hold *prev, *next;
	/* The digests it pinned, one entry per pin (owner only; the counts
	 * they stand for are in s->pins): */
	ckpt_digest *pinned;
	size_t npinned, cap;
};

void st_reclaim_init(ckpt_store *s)
{
	pthread_mutex_init(&s->hold_lock, NULL);
	pthread_mutex_init(&s->cand_lock, NULL);
	pthread_mutex_init(&s->pin_lock, NULL);
	atomic_store(&s->epoch, 1);
}

static void drop_set_free(struct drop_set *c)
{
	if (!c)
		return;
	free(c->d);
	free(c->state);
	free(c);
}

void st_reclaim_free(ckpt_store *s)
{
	drop_set_free(s->cand);
	s->cand = NULL;
	pthread_mutex_destroy(&s->hold_lock);
	pthread_mutex_destroy(&s->cand_lock);
	for (size_t b = 0; b < PIN_BUCKETS; b++) {
		struct pin *p, *n;

		for (p = s->pins[b]; p; p = n) { /* only holds not freed */
			n = p->next;
			free(p);
		}
	}
	pthread_mutex_destroy(&s->pin_lock);
}

void st_bg_kick(ckpt_store *s)
{
	if (!s->bg_started)
		return;
	pthread_mutex_lock(&s->bg_lock);
	s->bg_compact_clean = false;
	s->bg_kicks++;
	pthread_cond_broadcast(&s->bg_cond);
	pthread_mutex_unlock(&s->bg_lock);
}

/* ------------------------------------------------------------------ holds */

/* Append h at the current epoch.  Caller holds hold_lock. */
static void hold_append_locked(ckpt_store *s, struct ckpt_hold *h)
{
	h->listed = true;
	h->epoch = atomic_load(&s->epoch);
	h->next = NULL;
	h->prev = s->hold_tail;
	if (s->hold_tail)
		s->hold_tail->next = h;
	else
		s->hold_head = h;
	s->hold_tail = h;
}

static void hold_unlink_locked(ckpt_store *s, struct ckpt_hold *h)
{
	if (!h->listed)
		return;
	h->listed = false;
	if (h->prev)
		h->prev->next = h->next;
	else
		s->hold_head = h->next;
	if (h->next)
		h->next->prev = h->prev;
	else
		s->hold_tail = h->prev;
	h->prev = h->next = NULL;
}

int ckpt_hold_new(ckpt_store *s, ckpt_hold **ret_hold)
{
	struct ckpt_hold *h = calloc(1, sizeof(*h));

	if (!h)
		return -ENOMEM;
	h->s = s;
	pthread_mutex_lock(&s->hold_lock);
	hold_append_locked(s, h);
	pthread_mutex_unlock(&s->hold_lock);
	*ret_hold = h;
	return 0;
}

/* A drop set waits for the grace period that the hold of epoch e was part
 * of: the background thread should look again. */
static void kick_if_waited_for(ckpt_store *s, uint64_t e)
{
	bool waits;

	pthread_mutex_lock(&s->cand_lock);
	waits = s->cand && e <= s->cand->epoch;
	pthread_mutex_unlock(&s->cand_lock);
	if (waits)
		st_bg_kick(s);
}

void ckpt_hold_renew(ckpt_hold *h)
{
	ckpt_store *s = h->s;
	uint64_t was;
	bool listed;

	pthread_mutex_lock(&s->hold_lock);
	was = h->epoch;
	listed = h->listed;
	hold_unlink_locked(s, h);
	hold_append_locked(s, h);
	pthread_mutex_unlock(&s->hold_lock);
	if (listed && was != h->epoch)
		kick_if_waited_for(s, was);
}

uint64_t st_hold_take_pin(ckpt_store *s, uint64_t e)
{
	uint64_t pin = e;

	pthread_mutex_lock(&s->hold_lock);
	if (atomic_load(&s->epoch) < e)
		atomic_store(&s->epoch, e);
	if (s->hold_head && s->hold_head->epoch < pin) /* the oldest first */
		pin = s->hold_head->epoch;
	pthread_mutex_unlock(&s->hold_lock);
	return pin;
}

void ckpt_hold_narrow(ckpt_hold *h)
{
	ckpt_store *s = h->s;
	uint64_t was;
	bool listed;

	/* A node's pins are its own: gc on another host sees only the pin
	 * epoch of its session, which a hold holds back only while listed. */
	if (s->opts.node)
		return;

	pthread_mutex_lock(&s->hold_lock);
	was = h->epoch;
	listed = h->listed;
	hold_unlink_locked(s, h);
	pthread_mutex_unlock(&s->hold_lock);
	if (listed)
		kick_if_waited_for(s, was);
}

static unsigned pin_bucket(const ckpt_digest *d)
{
	uint32_t x;

	memcpy(&x, d->bytes + 8, sizeof(x));
	return x % PIN_BUCKETS;
}

bool st_pinned(ckpt_store *s, const ckpt_digest *d)
{
	struct pin *p;

	pthread_mutex_lock(&s->pin_lock);
	for (p = s->pins[pin_bucket(d)]; p; p = p->next)
		if (!memcmp(p->d.bytes, d->bytes, CKPT_DIGEST_LEN))
			break;
	pthread_mutex_unlock(&s->pin_lock);
	return p != NULL;
}

int ckpt_hold_pin(ckpt_hold *h, const struct ckpt_extent_list *l)
{
	ckpt_store *s = h->s;
	size_t need = 0;
	int r = 0;

	for (size_t i = 0; l && i < l->n; i++)
		need += l->v[i].kind == CKPT_EXT_CHUNK;
	if (h->npinned + need > h->cap) {
		size_t nc = CKPT_MAX(h->cap * 2, h->npinned + need);
		ckpt_digest *v = realloc(h->pinned, nc * sizeof(*v));

		if (!v)
			return -ENOMEM;
		h->pinned = v;
		h->cap = nc;
	}
	pthread_mutex_lock(&s->pin_lock);
	for (size_t i = 0; l && i < l->n && r == 0; i++) {
		const ckpt_digest *d = &l->v[i].digest;
		unsigned b = pin_bucket(d);
		struct pin *p;

		if (l->v[i].kind != CKPT_EXT_CHUNK)
			continue;
		for (p = s->pins[b]; p; p = p->next)
			if (!memcmp(p->d.bytes, d->bytes, CKPT_DIGEST_LEN))
				break;
		if (!p) {
			p = calloc(1, sizeof(*p));
			if (!p) {
				r = -ENOMEM;
				break;
			}
			p->d = *d;
			p->next = s->pins[b];
			s->pins[b] = p;
		}
		p->n++;
		h->pinned[h->npinned++] = *d;
	}
	pthread_mutex_unlock(&s->pin_lock);
	return r;
}

/* Drop h's pins; true if a drop round left pinned garbage behind. */
static bool unpin_all(ckpt_hold *h)
{
	ckpt_store *s = h->s;
	bool skipped;

	pthread_mutex_lock(&s->pin_lock);
	for (size_t i = 0; i < h->npinned; i++) {
		struct pin **pp = &s->pins[pin_bucket(&h->pinned[i])], *p;

		for (; (p = *pp); pp = &p->next) {
			if (memcmp(p->d.bytes, h->pinned[i].bytes, CKPT_DIGEST_LEN))
				continue;
			if (--p->n == 0) {
				*pp = p->next;
				free(p);
			}
			break;
		}
	}
	skipped = h->npinned > 0 && s->pins_skipped;
	if (skipped)
		s->pins_skipped = false;
	pthread_mutex_unlock(&s->pin_lock);
	return skipped;
}

void ckpt_hold_free(ckpt_hold *h)
{
	ckpt_store *s;
	uint64_t was;
	bool listed;

	if (!h)
		return;
	s = h->s;
	pthread_mutex_lock(&s->hold_lock);
	was = h->epoch;
	listed = h->listed;
	hold_unlink_locked(s, h);
	pthread_mutex_unlock(&s->hold_lock);
	if (unpin_all(h))
		st_bg_kick(s); /* garbage it pinned can go now */
	else if (listed)
		kick_if_waited_for(s, was);
	free(h->pinned);
	free(h);
}

/* Whether no hold of epoch <= e is live. */
static bool grace_over(ckpt_store *s, uint64_t e)
{
	uint64_t oldest = 0;
	bool over;

	pthread_mutex_lock(&s->hold_lock);
	over = !s->hold_head || s->hold_head->epoch > e;
	if (!over)
		oldest = s->hold_head->epoch;
	pthread_mutex_unlock(&s->hold_lock);
	if (!over)
		ckpt_debug("%s: garbage found at epoch %" PRIu64 " waits for a hold of epoch %" PRIu64,
			   s->path, e, oldest);
	return over;
}

/* ---------------------------------------------------------------- revival */

static int digest_cmp(const void *a, const void *b)
{
	return memcmp(a, b, CKPT_DIGEST_LEN);
}

/* Mark d obtained again in the drop set.  Caller holds cand_lock.  True if
 * it is being dropped now. */
static bool cand_revive_locked(ckpt_store *s, const ckpt_digest *d)
{
	const ckpt_digest *hit;
	size_t i;

	if (!s->cand || s->cand->n == 0)
		return false;
	hit = bsearch(d, s->cand->d, s->cand->n, sizeof(*hit), digest_cmp);
	if (!hit)
		return false;
	i = (size_t)(hit - s->cand->d);
	if (s->cand->state[i] == CAND_DROPPING)
		return true;
	s->cand->state[i] = CAND_REVIVED;
	return false;
}

bool st_revive(ckpt_store *s, const ckpt_digest *d)
{
	bool dropping;

	st_pending_obtain(s, d);
	pthread_mutex_lock(&s->cand_lock);
	dropping = cand_revive_locked(s, d);
	pthread_mutex_unlock(&s->cand_lock);
	return dropping;
}

void st_revive_list(ckpt_store *s, const struct ckpt_extent_list *l)
{
	if (!l)
		return;
	for (size_t i = 0; i < l->n; i++)
		if (l->v[i].kind == CKPT_EXT_CHUNK)
			st_pending_obtain(s, &l->v[i].digest);
	pthread_mutex_lock(&s->cand_lock);
	for (size_t i = 0; i < l->n; i++)
		if (l->v[i].kind == CKPT_EXT_CHUNK)
			(void)cand_revive_locked(s, &l->v[i].digest);
	pthread_mutex_unlock(&s->cand_lock);
}

/* ------------------------------------------------------------------ drops */

/* The index entries at refcount 0 now, sorted (keys are 'C' + digest). */
static int scan_garbage(ckpt_store *s, struct drop_set **ret)
{
	uint8_t prefix[1] = { CKPT_KEY_CHUNK };
	struct drop_set *c = calloc(1, sizeof(*c));
	const uint8_t *k, *v;
	size_t kl, vl, cap = 0;
	ckpt_scan *it;
	int r;

	if (!c)
		return -ENOMEM;
	r = ckpt_scan_new(s->eng, NULL, prefix, 1, NULL, 0, &it);
	if (r < 0) {
		free(c);
		return r;
	}
	while ((r = ckpt_scan_next(it, &k, &kl, &v, &vl)) > 0) {
		struct ckpt_chunk_loc loc;
		uint64_t refs;

		if (kl != 1 + CKPT_DIGEST_LEN || ckpt_chunk_rec_decode(v, vl, &loc, &refs) < 0)
			continue; /* damage: fsck reports it; never dropped here */
		if (refs != 0)
			continue;
		if (c->n == cap) {
			size_t nc = cap ? cap * 2 : 256;
			ckpt_digest *nd = realloc(c->d, nc * sizeof(*nd));

			if (!nd) {
				r = -ENOMEM;
				break;
			}
			c->d = nd;
			cap = nc;
		}
		memcpy(c->d[c->n].bytes, k + 1, CKPT_DIGEST_LEN);
		c->n++;
	}
	ckpt_scan_free(it);
	if (r == 0) {
		c->state = calloc(c->n ? c->n : 1, 1); /* CAND_GARBAGE */
		if (!c->state)
			r = -ENOMEM;
	}
	if (r < 0) {
		drop_set_free(c);
		return r;
	}
	*ret = c;
	return 0;
}

struct drop_arg {
	const ckpt_digest *d;
	size_t n;
	uint64_t dropped;
};

/* Delete the entries of a->d that are still at refcount 0, each read for
 * update (a conflicting commit makes the engine run this again). */
static int drop_txn(ckpt_store *s, ckpt_txn *t, void *arg)
{
	struct drop_arg *a = arg;

	ckpt_txn_releases_space(t); /* works on a full disk (meta/engine.h) */
	a->dropped = 0;
	for (size_t i = 0; i < a->n; i++) {
		struct ckpt_chunk_loc loc;
		uint64_t refs;
		uint8_t key[32];
		int r = ckpt_meta_get_chunk(s->eng, t, &a->d[i], &loc, &refs);

		if (r == -ENOENT || (r == 0 && refs != 0))
			continue;
		if (r < 0)
			return r;
		ckpt_txn_delete(t, key, ckpt_key_chunk(key, &a->d[i]));
		a->dropped++;
	}
	return a->dropped ? 0 : 1;
}

/* Whether any pending entry has an epoch <= e. */
static bool pending_any(ckpt_store *s, uint64_t e)
{
	bool any = false;

	pthread_mutex_lock(&s->pending_lock);
	for (size_t b = 0; b < PENDING_BUCKETS && !any; b++)
		for (struct pending *p = s->pending[b]; p && !any; p = p->next)
			any = p->epoch <= e;
	pthread_mutex_unlock(&s->pending_lock);
	return any;
}

/* Drop the set c (s->cand) if its grace period is over and the overlay is
 * empty.  Returns the number dropped, 0 when it must wait (c kept), or
 * -errno (c kept).  Caller holds compact_lock. */
static int drop_set(ckpt_store *s, struct drop_set *c)
{
	struct drop_arg a = { 0 };
	ckpt_digest *coll = NULL;
	size_t forgot = 0, kept = 0;
	bool empty;
	int r = 0;

	pthread_mutex_lock(&s->commit_lock);
	if (!grace_over(s, c->epoch))
		goto out;
	pthread_mutex_lock(&s->overlay_lock);
	empty = s->overlay_n == 0;
	pthread_mutex_unlock(&s->overlay_lock);
	if (!empty)
		goto out; /* its flush is a commit, which asks for another round */
	forgot = st_pending_forget(s, c->epoch);
	coll = malloc((c->n ? c->n : 1) * sizeof(*coll));
	if (!coll) {
		r = -ENOMEM;
		goto out;
	}
	pthread_mutex_lock(&s->cand_lock);
	for (size_t i = 0; i < c->n; i++) {
		if (c->state[i] != CAND_GARBAGE) {
			kept++;
			continue;
		}
		if (st_pinned(s, &c->d[i])) {
			kept++;
			/* a later scan finds it again; its unpin asks for that */
			c->state[i] = CAND_REVIVED;
			pthread_mutex_lock(&s->pin_lock);
			s->pins_skipped = true;
			pthread_mutex_unlock(&s->pin_lock);
			continue;
		}
		c->state[i] = CAND_DROPPING;
		coll[a.n++] = c->d[i];
	}
	pthread_mutex_unlock(&s->cand_lock);
	a.d = coll;
	if (a.n > 0) {
		pthread_mutex_lock(&s->ns_lock);
		r = st_txn_run(s, drop_txn, &a, false);
		pthread_mutex_unlock(&s->ns_lock);
	}
	if (r == 0) {
		ckpt_debug("%s: garbage found at epoch %" PRIu64 ": %" PRIu64 " index entries "
			   "dropped, %zu pending chunks forgotten, %zu entries kept (obtained "
			   "again or pinned)", s->path, c->epoch, a.dropped, forgot, kept);
		pthread_mutex_lock(&s->cand_lock);
		s->cand = NULL;
		pthread_mutex_unlock(&s->cand_lock);
		drop_set_free(c);
		pthread_mutex_lock(&s->bg_lock);
		s->bg.dropped += a.dropped;
		s->bg.pending_dropped += forgot;
		pthread_mutex_unlock(&s->bg_lock);
		r = (int)CKPT_MIN(a.dropped + forgot, (uint64_t)INT32_MAX);
	} else {
		/* nothing was deleted: let puts count on these entries again */
		pthread_mutex_lock(&s->cand_lock);
		for (size_t i = 0; i < c->n; i++)
			if (c->state[i] == CAND_DROPPING)
				c->state[i] = CAND_GARBAGE;
		pthread_mutex_unlock(&s->cand_lock);
		ckpt_err("%s: dropping unreferenced chunks failed: %s (will retry)", s->path,
			 strerror(-r));
	}
out:
	pthread_mutex_unlock(&s->commit_lock);
	free(coll);
	return r;
}

/*
 * One round: drop the waiting set if it may go; then, with no set left,
 * scan for new garbage, advance the epoch and try to drop that at once
 * (with no older hold live, its grace period is already over).  Returns
 * the number of entries dropped or forgotten, or -errno.
 */
int st_reclaim_round(ckpt_store *s)
{
	struct drop_set *c;
	int r = 0, done = 0;

	if (s->opts.keep_unreferenced || s->opts.mode != CKPT_STORE_RW)
		return 0;
	pthread_mutex_lock(&s->compact_lock);
	c = s->cand; /* only this thread replaces it, under compact_lock */
	if (c) {
		r = drop_set(s, c);
		if (r < 0 || s->cand)
			goto out; /* still waiting */
		done = r;
	}
	r = scan_garbage(s, &c);
	if (r < 0)
		goto out;
	c->epoch = atomic_load(&s->epoch);
	if (c->n == 0 && !pending_any(s, c->epoch)) {
		drop_set_free(c);
		r = done;
		goto out;
	}
	pthread_mutex_lock(&s->hold_lock);
	atomic_store(&s->epoch, c->epoch + 1);
	pthread_mutex_unlock(&s->hold_lock);
	pthread_mutex_lock(&s->cand_lock);
	s->cand = c;
	pthread_mutex_unlock(&s->cand_lock);
	r = drop_set(s, c);
	if (r >= 0)
		r += done;
out:
	pthread_mutex_unlock(&s->compact_lock);
	return r;
}
