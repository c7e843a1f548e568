/* SPDX-License-Identifier: MIT */
/*
 * background.c - background compression and compaction.
 */
#include "store/store_int.h"


#define BG_IDLE_NS (1000 * 1000000ll) /* writes paused this long: background may run */
#define BG_BATCH 32
#define BG_COMPACT_LIVE 50 /* compact sealed packs under this % live */


static bool same_loc(const struct ckpt_chunk_loc *a, const struct ckpt_chunk_loc *b)
{
	return a->pack_id == b->pack_id && a->offset == b->offset;
}

/* Point chunks at their new records.  Each new record must already be
 * durable.  A chunk whose location changed meanwhile is left alone. */
int st_publish(ckpt_store *s, const struct reloc *v, size_t n)
{
	ckpt_batch *b = ckpt_batch_new();
	int r = 0;

	if (!b)
		return -ENOMEM;
	pthread_mutex_lock(&s->ns_lock);
	for (size_t i = 0; i < n; i++) {
		uint8_t key[32], val[CKPT_CHUNK_REC_LEN];
		struct ckpt_chunk_loc cur;
		struct pending *p;
		uint64_t refs;
		bool done = false;

		pthread_mutex_lock(&s->pending_lock);
		for (p = s->pending[st_pending_bucket(&v[i].d)]; p; p = p->next) {
			if (!memcmp(p->digest.bytes, v[i].d.bytes, CKPT_DIGEST_LEN)) {
				if (same_loc(&p->loc, &v[i].old))
					p->loc = v[i].new;
				done = true;
				break;
			}
		}
		pthread_mutex_unlock(&s->pending_lock);
		if (done)
			continue;
		r = ckpt_index_get_fixed(s->ix, key, ckpt_key_chunk(key, &v[i].d), val, sizeof(val));
		if (r == -ENOENT) {
			r = 0;
			continue;
		}
		if (r == 0)
			r = ckpt_chunk_rec_decode(val, sizeof(val), &cur, &refs);
		if (r < 0)
			break;
		if (!same_loc(&cur, &v[i].old))
			continue;
		ckpt_chunk_rec_encode(&v[i].new, refs, val);
		ckpt_batch_put(b, key, ckpt_key_chunk(key, &v[i].d), val, sizeof(val));
	}
	if (r == 0 && ckpt_batch_count(b) > 0)
		r = ckpt_index_write(s->ix, b, false);
	pthread_mutex_unlock(&s->ns_lock);
	ckpt_batch_free(b);
	return r;
}

/* Sync the records listed in v (their new locations). */
static int sync_relocs(ckpt_store *s, const struct reloc *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t end = v[i].new.offset + ckpt_pack_rec_span(v[i].new.stored_len);
		ckpt_pack *p;
		int r;

		if (same_loc(&v[i].new, &v[i].old))
			continue; /* flag change only */
		r = st_get_pack(s, v[i].new.pack_id, &p);
		if (r == 0)
			r = ckpt_pack_sync(p, end); /* cheap when already covered */
		if (r < 0)
			return r;
	}
	return 0;
}

/* Compress deferred chunks: new compressed record, or just clear the flag
 * when compression does not pay. */
static void bg_compress(ckpt_store *s, const struct bg_item *items, size_t n)
{
	struct tls_ctx *t = st_tls_get(s);
	struct reloc rel[BG_BATCH];
	size_t nrel = 0;
	uint8_t *raw = NULL;

	if (!t)
		return;
	for (size_t i = 0; i < n; i++) {
		struct ckpt_chunk_loc loc, nl;
		struct ckpt_pack_rec rec;
		const void *out;
		size_t out_len;
		uint8_t codec;

		if (ckpt_store_chunk_loc(s, &items[i].d, &loc, NULL) < 0 ||
		    !(loc.flags & CKPT_CHUNK_F_DEFERRED))
			continue;
		free(raw);
		raw = malloc(loc.raw_len ? loc.raw_len : 1);
		if (!raw || ckpt_store_verify_chunk(s, &items[i].d, &loc, raw) < 0)
			continue;
		if (ckpt_compress(t->cc, raw, loc.raw_len, items[i].elem, &codec, &out, &out_len) < 0)
			continue;
		s->bg.compressed_in += loc.raw_len;
		if (codec == CKPT_CODEC_RAW) {
			nl = loc; /* incompressible: keep the record, clear the flag */
			s->bg.incompressible++;
			s->bg.compressed_out += loc.raw_len;
		} else {
			memset(&rec, 0, sizeof(rec));
			rec.codec = codec;
			rec.stored_len = (uint32_t)out_len;
			rec.raw_len = loc.raw_len;
			memcpy(rec.digest, items[i].d.bytes, CKPT_DIGEST_LEN);
			if (st_check_space(s, out_len) < 0 || st_append_record_bg(s, &rec, out, &nl) < 0)
				continue;
			s->bg.compressed++;
			s->bg.compressed_out += out_len;
		}
		nl.flags = 0;
		nl.elem = 0;
		rel[nrel].d = items[i].d;
		rel[nrel].old = loc;
		rel[nrel].new = nl;
		nrel++;
	}
	free(raw);
	if (nrel && sync_relocs(s, rel, nrel) == 0)
		st_publish(s, rel, nrel);
}

static bool pending_in_pack(ckpt_store *s, uint64_t id)
{
	bool found = false;

	pthread_mutex_lock(&s->pending_lock);
	for (size_t b = 0; b < PENDING_BUCKETS && !found; b++)
		for (struct pending *p = s->pending[b]; p && !found; p = p->next)
			found = p->loc.pack_id == id;
	pthread_mutex_unlock(&s->pending_lock);
	return found;
}

/* Packs compaction must leave alone (a damaged record was found in them).
 * Only the background thread touches these. */
static void bg_skip_pack(ckpt_store *s, uint64_t id)
{
	uint64_t *v = realloc(s->bg_skip, (s->nbg_skip + 1) * sizeof(*v));

	if (!v)
		return;
	v[s->nbg_skip++] = id;
	s->bg_skip = v;
	ckpt_err("%s: pack %" PRIu64 " has a damaged record: background compaction skips it; "
		 "run `ckpt fsck`", s->path, id);
}

static bool bg_skipped(const ckpt_store *s, uint64_t id)
{
	for (size_t i = 0; i < s->nbg_skip; i++)
		if (s->bg_skip[i] == id)
			return true;
	return false;
}

/* 1 if some index entry names pack id, 0 if none, <0 on error. */
static int index_names_pack(ckpt_store *s, uint64_t id)
{
	uint8_t prefix[1] = { CKPT_KEY_CHUNK };
	const uint8_t *k, *v;
	size_t kl, vl;
	ckpt_iter *it;
	int r = ckpt_iter_new(s->ix, prefix, 1, &it), found = 0;

	if (r < 0)
		return r;
	while (!found && (r = ckpt_iter_next(it, &k, &kl, &v, &vl)) > 0) {
		struct ckpt_chunk_loc loc;
		if (ckpt_chunk_rec_decode(v, vl, &loc, NULL) == 0 && loc.pack_id == id)
			found = 1;
	}
	ckpt_iter_free(it);
	return r < 0 ? r : found;
}

/* Move every chunk out of one mostly-dead sealed pack and delete it.
 * Returns 1 if a pack was compacted, 0 if none qualified, <0 on error. */
static int bg_compact(ckpt_store *s)
{
	struct chunk_info *chunks = NULL;
	uint64_t *ids = NULL, wid = UINT64_MAX, victim = UINT64_MAX;
	size_t nchunks = 0, nids = 0, nrel = 0, cap = 0;
	struct reloc *rel = NULL;
	uint8_t *buf = NULL;
	ckpt_pack *src = NULL;
	char name[64];
	int r;

	pthread_mutex_lock(&s->pack_lock);
	if (s->wpack)
		wid = ckpt_pack_id(s->wpack);
	pthread_mutex_unlock(&s->pack_lock);
	r = st_load_chunks(s, &chunks, &nchunks);
	if (r == 0)
		r = st_list_packs(s, &ids, &nids, NULL);
	if (r < 0)
		goto out;
	for (size_t pi = 0; pi < nids && victim == UINT64_MAX; pi++) {
		uint64_t live = 0, size = 0;
		struct stat st;
		if (bg_skipped(s, ids[pi]) || pending_in_pack(s, ids[pi]))
			continue; /* damaged, or unindexed chunks still live there */
		ckpt_pack_name(ids[pi], name, sizeof(name));
		if (fstatat(s->packs_fd, name, &st, 0) < 0)
			continue;
		size = (uint64_t)st.st_size;
		for (size_t i = 0; i < nchunks; i++)
			if (chunks[i].loc.pack_id == ids[pi])
				live += ckpt_pack_rec_span(chunks[i].loc.stored_len);
		if (size > CKPT_PACK_HDR_SIZE &&
		    live * 100 < (size - CKPT_PACK_HDR_SIZE) * BG_COMPACT_LIVE)
			victim = ids[pi];
	}
	if (victim == UINT64_MAX)
		goto out;
	pthread_mutex_lock(&s->pack_lock);
	if (victim == wid && s->wpack && ckpt_pack_id(s->wpack) == wid)
		r = st_roll_pack_locked(s); /* mostly garbage by now: seal it */
	if (s->bgpack && ckpt_pack_id(s->bgpack) == victim)
		s->bgpack = NULL; /* never copy a pack into itself */
	pthread_mutex_unlock(&s->pack_lock);
	if (r < 0)
		goto out;
	ckpt_pack_name(victim, name, sizeof(name));
	r = st_get_pack(s, victim, &src); /* keeps its fd open for racing readers */
	buf = malloc(CKPT_CHUNK_MAX);
	if (r < 0 || !buf) {
		r = r < 0 ? r : -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < nchunks; i++) {
		struct ckpt_chunk_loc old;
		struct ckpt_pack_rec rec;
		if (chunks[i].loc.pack_id != victim)
			continue;
		old = chunks[i].loc;
		if (ckpt_pack_read(src, old.offset, old.stored_len, &rec, buf) < 0) {
			r = -EIO; /* damaged: leave the pack for fsck */
			goto out;
		}
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
		r = st_check_space(s, rec.stored_len);
		if (r == 0)
			r = st_append_record_bg(s, &rec, buf, &rel[nrel].new);
		if (r < 0)
			goto out;
		rel[nrel].new.flags = old.flags;
		rel[nrel].new.elem = old.elem;
		rel[nrel].old = old;
		memcpy(rel[nrel].d.bytes, rec.digest, CKPT_DIGEST_LEN);
		nrel++;
	}
	r = sync_relocs(s, rel, nrel);
	if (r == 0)
		r = st_publish(s, rel, nrel);
	if (r < 0)
		goto out;
	/* Puts that might still be appending to the pack started before it was
	 * sealed; wait for any in flight now.  Then, with commits held off (a
	 * commit moves chunks from pending to the index), make sure that
	 * neither the pending table nor the index names the pack any more. */
	while (atomic_load(&s->puts_inflight) > 0)
		usleep(1000);
	pthread_mutex_lock(&s->commit_lock);
	if (pending_in_pack(s, victim)) {
		r = 0;
	} else {
		r = index_names_pack(s, victim);
		if (r == 0)
			r = ckpt_index_sync_wal(s->ix); /* the index no longer names it */
		if (r == 0 && unlinkat(s->packs_fd, name, 0) < 0)
			r = -errno;
		if (r == 0)
			r = 2;
	}
	pthread_mutex_unlock(&s->commit_lock);
	if (r != 2) {
		r = r > 0 ? 0 : r; /* still in use: try again later */
		goto out;
	}
	r = 0;
	if (r == 0) {
		fsync(s->packs_fd);
		/* release the file's space now: no reader uses the object once
		 * we hold pack_rw for writing */
		pthread_rwlock_wrlock(&s->pack_rw);
		pthread_mutex_lock(&s->pack_lock);
		for (size_t i = 0; i < s->npacks; i++) {
			if (ckpt_pack_id(s->packs[i]) == victim) {
				ckpt_pack_free(s->packs[i]);
				s->packs[i] = s->packs[--s->npacks];
				break;
			}
		}
		pthread_mutex_unlock(&s->pack_lock);
		pthread_rwlock_unlock(&s->pack_rw);
		s->bg.moved += nrel;
		s->bg.packs_deleted++;
		r = 1;
	}
out:
	if (r == -EIO && victim != UINT64_MAX)
		bg_skip_pack(s, victim); /* damaged: leave it to fsck/gc, don't retry */
	free(chunks);
	free(ids);
	free(rel);
	free(buf);
	return r;
}

void *st_bg_main(void *arg)
{
	ckpt_store *s = arg;
	struct bg_item items[BG_BATCH];

	pthread_mutex_lock(&s->bg_lock);
	while (!s->bg_stop) {
		int64_t idle = ckpt_mono_ns() - atomic_load(&s->last_put_ns);
		size_t n = 0;
		struct timespec ts;

		if (idle < BG_IDLE_NS || (s->bgq_n == s->bgq_head && s->bg_compact_clean)) {
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 50 * 1000000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&s->bg_cond, &s->bg_lock, &ts);
			continue;
		}
		while (n < BG_BATCH && s->bgq_head < s->bgq_n)
			items[n++] = s->bgq[s->bgq_head++];
		s->bg_busy = true;
		pthread_mutex_unlock(&s->bg_lock);
		if (n > 0) {
			bg_compress(s, items, n);
		} else {
			/* The queue is empty: make the overlay durable first (its
			 * chunks are pending and pin their packs), then compact. */
			ckpt_store_flush(s);
			if (bg_compact(s) <= 0) {
				pthread_mutex_lock(&s->bg_lock);
				if (s->bgq_n == s->bgq_head)
					s->bg_compact_clean = true;
				pthread_mutex_unlock(&s->bg_lock);
			}
		}
		pthread_mutex_lock(&s->bg_lock);
		s->bg_busy = false;
		pthread_cond_broadcast(&s->bg_cond);
	}
	pthread_mutex_unlock(&s->bg_lock);
	return NULL;
}

int ckpt_store_settle(ckpt_store *s, unsigned timeout_ms)
{
	struct timespec ts;
	int r = 0;

	if (!s->bg_started)
		return 0;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&s->bg_lock);
	s->bg_compact_clean = false; /* look once more */
	pthread_cond_broadcast(&s->bg_cond);
	while (r == 0 && (s->bg_busy || s->bgq_head < s->bgq_n || !s->bg_compact_clean))
		r = pthread_cond_timedwait(&s->bg_cond, &s->bg_lock, &ts);
	pthread_mutex_unlock(&s->bg_lock);
	return r ? -ETIMEDOUT : 0;
}

void ckpt_store_bg_stats(ckpt_store *s, struct ckpt_bg_stats *ret)
{
	pthread_mutex_lock(&s->bg_lock);
	*ret = s->bg;
	ret->queued = s->bgq_n - s->bgq_head;
	pthread_mutex_unlock(&s->bg_lock);
}

/* Queue chunks left raw by an earlier run (crash or unmount before the
 * background work finished). */
int st_requeue_deferred(ckpt_store *s)
{
	uint8_t prefix[1] = { CKPT_KEY_CHUNK };
	const uint8_t *k, *v;
	size_t kl, vl;
	ckpt_iter *it;
	int r = ckpt_iter_new(s->ix, prefix, 1, &it);

	if (r < 0)
		return r;
	while ((r = ckpt_iter_next(it, &k, &kl, &v, &vl)) > 0) {
		struct ckpt_chunk_loc loc;
		ckpt_digest d;
		if (kl != 1 + CKPT_DIGEST_LEN || ckpt_chunk_rec_decode(v, vl, &loc, NULL) < 0)
			continue;
		if (!(loc.flags & CKPT_CHUNK_F_DEFERRED))
			continue;
		memcpy(d.bytes, k + 1, CKPT_DIGEST_LEN);
		st_bg_enqueue(s, &d, loc.elem);
	}
	ckpt_iter_free(it);
	return r;
}

