/* SPDX-License-Identifier: MIT */
/*
 * compact.c - the one compactor: background compaction (background.c) and
 * `ckpt gc` (maint.c) both reclaim the backend's mostly-dead units here,
 * under one liveness threshold (opts.compact_live).
 */
#include "store/store_int.h"

/* The pending (not yet indexed) chunks that live in unit id: *ret (NULL
 * when none) and their count, or -ENOMEM. */
static int pending_of_unit(ckpt_store *s, uint64_t id, struct chunk_info **ret, size_t *ret_n)
{
	struct chunk_info *v = NULL;
	size_t n = 0, cap = 0;
	int r = 0;

	pthread_mutex_lock(&s->pending_lock);
	for (size_t b = 0; b < PENDING_BUCKETS && r == 0; b++) {
		for (struct pending *p = s->pending[b]; p; p = p->next) {
			if (ckpt_cb_unit_of(s->cb, &p->loc) != id)
				continue;
			if (n == cap) {
				size_t nc = cap ? cap * 2 : 64;
				struct chunk_info *nv = realloc(v, nc * sizeof(*nv));

				if (!nv) {
					r = -ENOMEM;
					break;
				}
				v = nv;
				cap = nc;
			}
			memset(&v[n], 0, sizeof(v[n]));
			v[n].d = p->digest;
			v[n].loc = p->loc;
			n++;
		}
	}
	pthread_mutex_unlock(&s->pending_lock);
	if (r < 0) {
		free(v);
		return r;
	}
	*ret = v;
	*ret_n = n;
	return 0;
}

/* Whether a pending (not yet indexed) chunk lives in unit id. */
static bool pending_in_unit(ckpt_store *s, uint64_t id)
{
	bool found = false;

	pthread_mutex_lock(&s->pending_lock);
	for (size_t b = 0; b < PENDING_BUCKETS && !found; b++)
		for (struct pending *p = s->pending[b]; p && !found; p = p->next)
			found = ckpt_cb_unit_of(s->cb, &p->loc) == id;
	pthread_mutex_unlock(&s->pending_lock);
	return found;
}

static bool compact_skipped(const ckpt_store *s, uint64_t id)
{
	for (size_t i = 0; i < s->nbg_skip; i++)
		if (s->bg_skip[i] == id)
			return true;
	return false;
}

/* A unit holding a damaged record: compaction leaves it alone from now on
 * (fsck reports the damage; copying it would spread it). */
static void skip_unit(ckpt_store *s, uint64_t id)
{
	uint64_t *v;

	if (compact_skipped(s, id))
		return;
	v = realloc(s->bg_skip, (s->nbg_skip + 1) * sizeof(*v));
	if (!v)
		return;
	v[s->nbg_skip++] = id;
	s->bg_skip = v;
}

struct victim {
	uint64_t id;
	uint64_t live; /* record bytes of indexed chunks in it */
	bool active;   /* an append target when listed */
	uint64_t payload; /* its record bytes when listed (progress of gc) */
};

static int victim_cmp_live(const void *a, const void *b)
{
	const struct victim *x = a, *y = b;

	if (x->live != y->live)
		return x->live < y->live ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

static int victim_find(const struct victim *v, size_t n, uint64_t id)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (v[mid].id == id)
			return (int)mid;
		if (v[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

/* Copy chunk c's record out of its unit; 1 when it is damaged (logged).
 * reserve: keep the index's free-space reserve (st_check_space). */
static int move_one(ckpt_store *s, ckpt_loadctx *x, const struct chunk_info *c, bool reserve,
		    struct reloc *ret)
{
	const struct ckpt_chunk_loc *old = &c->loc;
	size_t need = ckpt_cb_get_len(s->cb, old);
	struct ckpt_chunk_rec rec;
	const uint8_t *stored;
	const char *why = NULL;
	void *own;
	uint8_t *buf = ckpt_loadctx_buf(x, need, &own);
	int r;

	if (!buf)
		return -ENOMEM;
	r = ckpt_cb_get(s->cb, old, true, buf, need, &rec, &stored, &why);
	if (r == 0 && memcmp(rec.digest, c->d.bytes, CKPT_DIGEST_LEN) != 0) {
		r = -EIO;
		why = "record does not match its index entry";
	}
	if (r == -EIO) {
		char hex[2 * CKPT_DIGEST_LEN + 1], at[CKPT_CHUNK_DESC_MAX];

		ckpt_digest_to_hex(&c->d, hex);
		ckpt_cb_describe(s->cb, old, at, sizeof(at));
		ckpt_err("%s: compaction: chunk %s (%s) is damaged (%s): its unit is kept; run "
			 "`ckpt fsck`", s->path, hex, at, why ? why : "read failed");
		free(own);
		return 1;
	}
	if (r == 0)
		r = st_check_space(s, rec.stored_len, reserve ? ST_SPACE_MOVE : ST_SPACE_NONE);
	if (r == 0)
		r = st_append_record_bg(s, &rec, stored, &ret->new);
	free(own);
	if (r < 0)
		return r;
	ret->new.flags = old->flags;
	ret->new.elem = old->elem;
	ret->old = *old;
	ret->d = c->d;
	return 0;
}

/* Add the record bytes of the pending chunks in each unit of v (sorted by
 * id) to its live bytes. */
static void pending_live(ckpt_store *s, struct victim *v, size_t nv)
{
	pthread_mutex_lock(&s->pending_lock);
	for (size_t b = 0; b < PENDING_BUCKETS; b++) {
		for (struct pending *p = s->pending[b]; p; p = p->next) {
			int u = victim_find(v, nv, ckpt_cb_unit_of(s->cb, &p->loc));

			if (u >= 0)
				v[u].live += ckpt_cb_rec_bytes(s->cb, &p->loc);
		}
	}
	pthread_mutex_unlock(&s->pending_lock);
}

/* Move the indexed chunks (chunks[0..n)) and the pending chunks of unit v
 * out of it and reclaim it.  1 when reclaimed, 0 when kept (damaged or
 * named again), or -errno. */
static int compact_one(ckpt_store *s, ckpt_loadctx *x, const struct victim *v,
		       const struct chunk_info *chunks, size_t n, bool reserve,
		       struct st_compact_stats *res)
{
	struct chunk_info *pend = NULL;
	struct reloc *rel = NULL;
	size_t nrel = 0, cap = 0, npend = 0;
	bool keep = false;
	int r;

	/* No new pending chunk can appear in v now (st_compact sealed it and
	 * waited for the puts in flight); publishing moves these in the
	 * pending table, or in the index if a commit indexed them meanwhile. */
	r = pending_of_unit(s, v->id, &pend, &npend);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n + npend; i++) {
		const struct chunk_info *c = i < n ? &chunks[i] : &pend[i - n];

		if (ckpt_cb_unit_of(s->cb, &c->loc) != v->id)
			continue;
		if (nrel == cap) {
			size_t nc = cap ? cap * 2 : 256;
			struct reloc *nv = realloc(rel, nc * sizeof(*nv));

			if (!nv) {
				r = -ENOMEM;
				goto out;
			}
			rel = nv;
			cap = nc;
		}
		r = move_one(s, x, c, reserve, &rel[nrel]);
		if (r < 0)
			goto out;
		if (r == 1) {
			keep = true; /* the rest still moves: fewer chunks depend on it */
			r = 0;
			continue;
		}
		nrel++;
	}
	for (size_t i = 0; i < nrel && r == 0; i++)
		r = ckpt_cb_sync(s->cb, &rel[i].new, 1); /* cheap when already covered */
	if (r == 0)
		r = st_publish(s, rel, nrel);
	if (r < 0)
		goto out;
	res->moved += nrel;
	if (keep) {
		skip_unit(s, v->id);
		goto out;
	}
	/* With commits held off, make sure that no pending chunk lives in the
	 * unit (st_compact checked before it loaded the index, this is the
	 * cheap second look), then make the index's log durable: it must no
	 * longer name the unit when the unit goes. */
	pthread_mutex_lock(&s->commit_lock);
	if (pending_in_unit(s, v->id))
		keep = true;
	else
		r = ckpt_engine_sync(s->eng);
	pthread_mutex_unlock(&s->commit_lock);
	if (r < 0 || keep)
		goto out;
	r = ckpt_cb_reclaim(s->cb, v->id);
	if (r < 0)
		goto out;
	res->units_deleted++;
	if (v->live > 0)
		res->units_rewritten++;
	r = 1;
out:
	free(rel);
	free(pend);
	return r;
}

/*
 * Reclaim the units whose live chunks' records (indexed or pending) fill
 * less than opts.compact_live percent of them (and empty units no put
 * appends to), at most max_units of them, the fewest live bytes first.
 *
 * What keeps a reclaimed unit from being named by metadata: each candidate
 * is sealed (no new put goes to it), then puts still in flight are waited
 * for, and only then are the index and the pending table read for the
 * chunks to move.  From then on nothing new can name the unit: puts go to
 * other units (so do background compression's, which holds compact_lock
 * while it appends and publishes); a pending chunk seen there is moved in
 * the pending table, or in the index if a commit indexed it meanwhile (a
 * commit reads the pending location under ns_lock, which st_publish holds
 * to switch it); and a commit that rewrites an index entry reads it under
 * ns_lock too.  Every move is synced before it is published, and the
 * index's log is synced before the unit is reclaimed, so every step is
 * crash-safe.
 *
 * Units with a damaged record are kept (their other chunks still move) and
 * left alone from then on.  reserve: copies keep the index's free-space
 * reserve (the daemon's background work, which shares the disk with the
 * index's writes); without it a copy only needs the space it takes (`ckpt
 * gc`, which has the store to itself and frees each unit right after
 * copying it).  compact_lock is held throughout.  Returns the number of
 * units reclaimed, or -errno; *res (may be NULL) counts what was done.
 */
int st_compact(ckpt_store *s, size_t max_units, bool reserve, struct st_compact_stats *res)
{
	unsigned pct = s->opts.compact_live ? s->opts.compact_live : CKPT_COMPACT_LIVE_DEFAULT;
	struct st_compact_stats dummy = { 0 };
	struct chunk_info *chunks = NULL;
	struct ckpt_chunk_unit *units = NULL;
	struct victim *v = NULL;
	ckpt_loadctx *x = NULL;
	size_t nchunks = 0, nunits = 0, nv = 0, done = 0;
	uint64_t pdone = 0, ptotal = 0; /* payload bytes of the victims, for progress */
	int r;

	if (!res)
		res = &dummy;
	pthread_mutex_lock(&s->compact_lock);
	r = st_load_chunks(s, &chunks, &nchunks);
	if (r == 0)
		r = ckpt_cb_units(s->cb, &units, &nunits);
	if (r < 0)
		goto out;
	v = calloc(nunits ? nunits : 1, sizeof(*v));
	if (!v) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < nunits; i++) {
		v[i].id = units[i].id; /* sorted by id */
		v[i].active = units[i].active;
		v[i].payload = units[i].payload;
	}
	for (size_t i = 0; i < nchunks; i++) {
		int u = victim_find(v, nunits, ckpt_cb_unit_of(s->cb, &chunks[i].loc));

		if (u >= 0)
			v[u].live += ckpt_cb_rec_bytes(s->cb, &chunks[i].loc);
	}
	pending_live(s, v, nunits); /* pending chunks are live until committed or forgotten */
	/* keep the candidates, the fewest live bytes first: a unit with none
	 * goes without a copy, and on a nearly full disk the small copies are
	 * the ones that fit (then their units' space comes back) */
	for (size_t i = 0; i < nunits; i++) {
		const struct ckpt_chunk_unit *u = &units[i];

		if (compact_skipped(s, u->id))
			continue; /* damaged */
		if (v[i].live * 100 < u->payload * pct || (v[i].live == 0 && !u->active))
			v[nv++] = v[i];
	}
	qsort(v, nv, sizeof(*v), victim_cmp_live);
	nv = CKPT_MIN(nv, max_units);
	if (nv == 0)
		goto out;
	for (size_t i = 0; i < nv; i++) {
		if (!v[i].active)
			continue;
		r = ckpt_cb_seal(s->cb, v[i].id); /* never copy a unit into itself */
		if (r < 0)
			goto out;
	}
	while (atomic_load(&s->puts_inflight) > 0)
		usleep(1000);
	free(chunks);
	chunks = NULL;
	r = st_load_chunks(s, &chunks, &nchunks);
	if (r < 0)
		goto out;
	x = ckpt_loadctx_get(s->rctx);
	if (!x) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < nv; i++)
		ptotal += v[i].payload;
	ckpt_progress_report(s->progress, 0, ptotal);
	for (size_t i = 0; i < nv; i++) {
		pdone += v[i].payload;
		if (v[i].id == UINT64_MAX)
			continue;
		r = compact_one(s, x, &v[i], chunks, nchunks, reserve, res);
		if (r < 0)
			goto out;
		done += (size_t)r;
		ckpt_progress_report(s->progress, pdone, ptotal);
	}
	ckpt_progress_report(s->progress, ptotal, ptotal);
	r = (int)CKPT_MIN(done, (size_t)INT32_MAX);
out:
	pthread_mutex_unlock(&s->compact_lock);
	if (x)
		ckpt_loadctx_put(s->rctx, x);
	free(chunks);
	free(units);
	free(v);
	return r;
}
