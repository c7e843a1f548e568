/* SPDX-License-Identifier: MIT */
/*
 * background.c - background compression and compaction.
 */
#include "store/store_int.h"


#define BG_IDLE_NS (1000 * 1000000ll) /* writes paused this long: background may run */
#define BG_BATCH 32

/* A chunk still in the pending table at v->old is moved there; true if
 * it was.  (A pending entry elsewhere leaves the index entry to be
 * checked: it may name v->old.) */
static bool pending_relocate(ckpt_store *s, const struct reloc *v)
{
	struct pending *p;
	bool found = false;

	pthread_mutex_lock(&s->pending_lock);
	for (p = s->pending[st_pending_bucket(&v->d)]; p; p = p->next) {
		if (!memcmp(p->digest.bytes, v->d.bytes, CKPT_DIGEST_LEN)) {
			if (ckpt_chunk_loc_same(&p->loc, &v->old)) {
				p->loc = v->new;
				found = true;
			}
			break;
		}
	}
	pthread_mutex_unlock(&s->pending_lock);
	return found;
}

struct publish_arg {
	const struct reloc *v;
	size_t n;
};

/* The index part of st_publish: each chunk still at its old location in
 * the index is pointed at its new one, read for update. */
static int publish_txn(ckpt_store *s, ckpt_txn *t, void *arg)
{
	struct publish_arg *a = arg;
	size_t nput = 0;

	ckpt_txn_releases_space(t); /* moves let packs be reclaimed (meta/engine.h) */
	for (size_t i = 0; i < a->n; i++) {
		const struct reloc *v = &a->v[i];
		struct ckpt_chunk_loc cur;
		uint64_t refs;
		int r;

		if (pending_relocate(s, v))
			continue;
		r = ckpt_meta_get_chunk(s->eng, t, &v->d, &cur, &refs);
		if (r == -ENOENT)
			continue;
		if (r < 0)
			return r;
		if (!ckpt_chunk_loc_same(&cur, &v->old))
			continue;
		ckpt_meta_put_chunk(t, &v->d, &v->new, refs);
		nput++;
	}
	return nput > 0 ? 0 : 1;
}

/* Point chunks at their new records.  Each new record must already be
 * durable.  A chunk whose location changed meanwhile is left alone. */
int st_publish(ckpt_store *s, const struct reloc *v, size_t n)
{
	struct publish_arg a = { v, n };
	int r;

	pthread_mutex_lock(&s->ns_lock);
	r = st_txn_run(s, publish_txn, &a, false);
	pthread_mutex_unlock(&s->ns_lock);
	return r;
}

/* Sync the records listed in v (their new locations). */
static int sync_relocs(ckpt_store *s, const struct reloc *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		int r;

		if (ckpt_chunk_loc_same(&v[i].new, &v[i].old))
			continue; /* flag change only */
		r = ckpt_cb_sync(s->cb, &v[i].new, 1); /* cheap when already covered */
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
	/* no compaction meanwhile: it could reclaim the unit these appends go
	 * to before they are published */
	pthread_mutex_lock(&s->compact_lock);
	for (size_t i = 0; i < n; i++) {
		struct ckpt_chunk_loc loc, nl;
		struct ckpt_chunk_rec rec;
		const void *out;
		size_t out_len;
		uint8_t codec;

		if (ckpt_store_chunk_loc(s, &items[i].d, &loc, NULL) < 0 ||
		    !(loc.flags & CKPT_CHUNK_F_DEFERRED))
			continue;
		free(raw);
		raw = malloc(loc.raw_len ? loc.raw_len : 1);
		if (!raw || st_verify_chunk(s, &items[i].d, &loc, raw, true) < 0)
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
			if (st_check_space(s, out_len, ST_SPACE_MOVE) < 0 ||
			    st_append_record_bg(s, &rec, out, &nl) < 0)
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
	pthread_mutex_unlock(&s->compact_lock);
}

/* Compact one mostly-dead unit.  Returns 1 if one was reclaimed, 0 if none
 * qualified, <0 on error. */
static int bg_compact(ckpt_store *s)
{
	struct st_compact_stats cs = { 0 };
	int r = st_compact(s, 1, true, &cs);

	s->bg.moved += cs.moved;
	s->bg.packs_deleted += cs.units_deleted;
	return r;
}

/* A snapshot of the index into its metadata log when one is due (after a
 * failure, not again for a minute). */
static void bg_backup(ckpt_store *s, int64_t *retry_ns)
{
	int r;

	if (!ckpt_engine_backup_due(s->eng) || ckpt_mono_ns() < *retry_ns)
		return;
	r = ckpt_engine_backup(s->eng);
	if (r < 0) {
		ckpt_warn("%s: cannot take a snapshot of the index into %s: %s (retrying in a "
			  "minute)", s->path, ckpt_engine_log_dir(s->eng), strerror(-r));
		*retry_ns = ckpt_mono_ns() + 60 * 1000000000LL;
	}
}

void *st_bg_main(void *arg)
{
	int64_t backup_retry_ns = 0;
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
			/* The queue is empty: index the overlay first (its chunks
			 * are pending and pin their packs), drop garbage chunks
			 * (reclaim.c), then compact. */
			uint64_t kicks;
			int dropped;

			ckpt_store_flush(s);
			/* a kick from now on (a commit, a hold ended) means another
			 * look; the flush's own commit does not */
			pthread_mutex_lock(&s->bg_lock);
			kicks = s->bg_kicks;
			pthread_mutex_unlock(&s->bg_lock);
			bg_backup(s, &backup_retry_ns);
			dropped = st_reclaim_round(s);
			if (bg_compact(s) <= 0 && dropped <= 0) {
				pthread_mutex_lock(&s->bg_lock);
				if (s->bgq_n == s->bgq_head && s->bg_kicks == kicks)
					s->bg_compact_clean = true;
				pthread_mutex_unlock(&s->bg_lock);
				st_bg_report(s, false); /* the pass is over */
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
	ckpt_scan *it;
	int r = ckpt_scan_new(s->eng, NULL, prefix, 1, NULL, 0, &it);

	if (r < 0)
		return r;
	while ((r = ckpt_scan_next(it, &k, &kl, &v, &vl)) > 0) {
		struct ckpt_chunk_loc loc;
		ckpt_digest d;
		if (kl != 1 + CKPT_DIGEST_LEN || ckpt_chunk_rec_decode(v, vl, &loc, NULL) < 0)
			continue;
		if (!(loc.flags & CKPT_CHUNK_F_DEFERRED))
			continue;
		memcpy(d.bytes, k + 1, CKPT_DIGEST_LEN);
		st_bg_enqueue(s, &d, loc.elem);
	}
	ckpt_scan_free(it);
	return r;
}

