/* SPDX-License-Identifier: MIT */
/*
 * packs.c - opening the chunk backend, and the pending table (chunks put
 * but not yet indexed: their locations, for readers and commits).
 */
#include "store/store_int.h"

/* The backend's next_id: a new unit id from the "next_pack" meta record,
 * read and advanced in one durable transaction before the unit is made, so
 * that an id is never reused after a crash, nor by two writers sharing the
 * engine. */
static int take_unit_id(ckpt_store *s, ckpt_txn *t, void *arg)
{
	uint64_t *id = arg;
	int r = ckpt_meta_get_u64(s->eng, t, "next_pack", id);

	if (r == 0)
		ckpt_meta_put_u64(t, "next_pack", *id + 1);
	if (r == 0 && s->opts.node)
		st_session_unit_put(s, t, *id); /* the unit's 'U' record */
	return r;
}

static int next_unit_id(void *ud, uint64_t *ret_id)
{
	ckpt_store *s = ud;
	int r = st_txn_run(s, take_unit_id, ret_id, true);

	if (r == 0 && s->opts.node)
		st_session_unit_add(s, *ret_id);
	return r;
}

/* Open the chunk backend the options name, in the store directory dfd
 * (create: a new store's layout), once the uuid and counters are loaded. */
int st_backend_open(ckpt_store *s, int dfd, bool create, char *err, size_t errlen)
{
	const struct ckpt_chunk_backend_ops *ops = ckpt_chunk_backend_find(s->opts.chunk_backend);
	struct ckpt_chunk_backend_conf conf = {
		.store_path = s->path,
		.store_fd = dfd,
		.uuid = s->uuid,
		.writable = s->opts.mode == CKPT_STORE_RW,
		.create = create,
		.unit_max = s->opts.pack_max,
		.sync_readahead = s->opts.sync_readahead,
		.next_id = next_unit_id,
		.ud = s,
	};

	if (!ops) {
		snprintf(err, errlen, "%s: unknown chunk backend '%s'", s->path, s->opts.chunk_backend);
		return -EINVAL;
	}
	if (conf.unit_max == 0) {
		struct statvfs st;
		uint64_t total = 32ull << 30;

		if (fstatvfs(dfd, &st) == 0)
			total = (uint64_t)st.f_blocks * st.f_frsize;
		conf.unit_max = CKPT_MIN(CKPT_MAX(total / 32, 4ull << 20), 1ull << 30);
	}
	return ops->open(&conf, &s->cb, err, errlen);
}

unsigned st_pending_bucket(const ckpt_digest *d)
{
	uint32_t h;

	memcpy(&h, d->bytes + 4, sizeof(h));
	return h % PENDING_BUCKETS;
}

/* Whether p is of the current session generation (session.c). */
static bool pending_live(ckpt_store *s, const struct pending *p)
{
	return p->gen == atomic_load(&s->sess_gen);
}

bool st_pending_find(ckpt_store *s, const ckpt_digest *d, struct ckpt_chunk_loc *ret)
{
	struct pending *p;
	bool found = false;

	pthread_mutex_lock(&s->pending_lock);
	for (p = s->pending[st_pending_bucket(d)]; p; p = p->next) {
		if (memcmp(p->digest.bytes, d->bytes, CKPT_DIGEST_LEN) == 0 && pending_live(s, p)) {
			if (ret)
				*ret = p->loc;
			found = true;
			break;
		}
	}
	pthread_mutex_unlock(&s->pending_lock);
	return found;
}

bool st_pending_obtain(ckpt_store *s, const ckpt_digest *d)
{
	struct pending *p;
	bool found = false;

	pthread_mutex_lock(&s->pending_lock);
	for (p = s->pending[st_pending_bucket(d)]; p; p = p->next) {
		if (memcmp(p->digest.bytes, d->bytes, CKPT_DIGEST_LEN) == 0 && pending_live(s, p)) {
			p->epoch = atomic_load(&s->epoch);
			found = true;
			break;
		}
	}
	pthread_mutex_unlock(&s->pending_lock);
	return found;
}

size_t st_pending_forget(ckpt_store *s, uint64_t epoch)
{
	bool skipped = false;
	size_t n = 0;

	pthread_mutex_lock(&s->pending_lock);
	for (size_t b = 0; b < PENDING_BUCKETS; b++) {
		struct pending **pp = &s->pending[b], *p;

		while ((p = *pp)) {
			if (p->epoch <= epoch && st_pinned(s, &p->digest))
				skipped = true; /* its unpin asks for another round */
			else if (p->epoch <= epoch) {
				*pp = p->next;
				free(p);
				n++;
				continue;
			}
			pp = &p->next;
		}
	}
	pthread_mutex_unlock(&s->pending_lock);
	if (skipped) {
		pthread_mutex_lock(&s->pin_lock);
		s->pins_skipped = true;
		pthread_mutex_unlock(&s->pin_lock);
	}
	return n;
}

/* The pending table as meta/commit.h's ckpt_unindexed_fn. */
bool st_unindexed(void *store, const ckpt_digest *d, struct ckpt_chunk_loc *ret)
{
	return st_pending_find(store, d, ret);
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
	if (p && !pending_live(s, p)) {
		/* put again after its session was declared dead: this copy counts */
		p->loc = *loc;
		p->epoch = atomic_load(&s->epoch);
		p->gen = atomic_load(&s->sess_gen);
		added = true;
	} else if (!p && n) {
		n->digest = *d;
		n->loc = *loc;
		n->epoch = atomic_load(&s->epoch);
		n->gen = atomic_load(&s->sess_gen);
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


bool st_pending_stale_in(ckpt_store *s, const struct ckpt_extent_list *l)
{
	bool stale = false;

	pthread_mutex_lock(&s->pending_lock);
	for (size_t i = 0; l && i < l->n && !stale; i++) {
		const ckpt_digest *d = &l->v[i].digest;

		if (l->v[i].kind != CKPT_EXT_CHUNK)
			continue;
		for (struct pending *p = s->pending[st_pending_bucket(d)]; p; p = p->next) {
			if (memcmp(p->digest.bytes, d->bytes, CKPT_DIGEST_LEN) == 0) {
				stale = !pending_live(s, p);
				break;
			}
		}
	}
	pthread_mutex_unlock(&s->pending_lock);
	return stale;
}
