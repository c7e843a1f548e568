/* SPDX-License-Identifier: MIT */
/*
 * put.c - storing a chunk: dedup, compression or deferral, append.
 */
#include "store/store_int.h"

static int verify_same(ckpt_store *s, const ckpt_digest *d, const struct iovec *iov, int cnt,
		       size_t len)
{
	struct ckpt_chunk_loc loc;
	uint8_t *buf;
	int r = ckpt_store_chunk_loc(s, d, &loc, NULL);
	size_t at = 0;

	if (r < 0)
		return r;
	if (loc.raw_len != len)
		return -EIO;
	buf = malloc(len ? len : 1);
	if (!buf)
		return -ENOMEM;
	r = st_verify_chunk(s, d, &loc, buf, true);
	for (int i = 0; r == 0 && i < cnt; i++) {
		if (memcmp(buf + at, iov[i].iov_base, iov[i].iov_len) != 0)
			r = -EIO;
		at += iov[i].iov_len;
	}
	free(buf);
	if (r == -EIO) {
		char hex[33];
		ckpt_digest_to_hex(d, hex);
		ckpt_err("%s: verify_dedup: different bytes under digest %s; write refused", s->path,
			 hex);
	}
	return r;
}

/* Keep free space for the metadata: chunk puts of files fail with ENOSPC
 * while the backend's free space is below the reserve, min(CKPT_RESERVE_MAX,
 * 1/8 of the filesystem), so that namespace changes (deleting files above
 * all) keep working once data fills the disk; the index keeps its own
 * allowance below that (meta/engine.h, ckpt_txn_releases_space).
 * ST_SPACE_MOVE, the records of background compression and compaction,
 * which make room: half the reserve.  ST_SPACE_NONE: only the space the
 * record takes (`ckpt gc`, which has the store to itself and frees more
 * than it copies). */
#define CKPT_RESERVE_MAX (256ull << 20)
int st_check_space(ckpt_store *s, size_t need, enum st_space keep_for)
{
	struct statvfs st;
	uint64_t avail, total, keep;

	if (ckpt_cb_statfs(s->cb, &st) < 0)
		return 0; /* cannot tell: let the write itself fail */
	avail = (uint64_t)st.f_bavail * st.f_frsize;
	total = (uint64_t)st.f_blocks * st.f_frsize;
	keep = keep_for == ST_SPACE_NONE ? 0 : CKPT_MIN(CKPT_RESERVE_MAX, total / 8);
	if (keep_for == ST_SPACE_MOVE)
		keep /= 2;
	/* the record's header and padding: at most one block */
	if (avail < keep + need + CKPT_CHUNK_BUF_ALIGN) {
		if (!atomic_exchange(&s->space_short, true))
			ckpt_warn("%s: backing filesystem nearly full (%" PRIu64 " bytes free, %" PRIu64
				  " kept for the metadata): chunk writes fail with ENOSPC", s->path,
				  avail, keep);
		return -ENOSPC;
	}
	if (keep_for == ST_SPACE_FILE && atomic_exchange(&s->space_short, false))
		ckpt_warn("%s: %" PRIu64 " bytes free again: chunk writes work again", s->path, avail);
	return 0;
}

/* Append for background work (kept apart from fresh chunks). */
int st_append_record_bg(ckpt_store *s, const struct ckpt_chunk_rec *rec, const void *data,
			struct ckpt_chunk_loc *ret_loc)
{
	struct iovec one = { (void *)data, rec->stored_len };

	return ckpt_cb_put(s->cb, rec, &one, 1, CKPT_CHUNK_MOVED, ret_loc);
}

void st_bg_enqueue(ckpt_store *s, const ckpt_digest *d, uint8_t elem)
{
	pthread_mutex_lock(&s->bg_lock);
	if (s->bgq_head > 0 && s->bgq_head == s->bgq_n) {
		s->bgq_head = s->bgq_n = 0;
	}
	if (s->bgq_n == s->bgq_cap) {
		size_t nc = s->bgq_cap ? s->bgq_cap * 2 : 1024;
		struct bg_item *nq;
		if (s->bgq_head > 0) { /* compact before growing */
			memmove(s->bgq, s->bgq + s->bgq_head,
				(s->bgq_n - s->bgq_head) * sizeof(*s->bgq));
			s->bgq_n -= s->bgq_head;
			s->bgq_head = 0;
		}
		if (s->bgq_n == s->bgq_cap) {
			nq = realloc(s->bgq, nc * sizeof(*nq));
			if (!nq) {
				/* stays raw until the next open re-queues it */
				pthread_mutex_unlock(&s->bg_lock);
				return;
			}
			s->bgq = nq;
			s->bgq_cap = nc;
		}
	}
	s->bgq[s->bgq_n].d = *d;
	s->bgq[s->bgq_n].elem = elem;
	s->bgq_n++;
	s->bg_compact_clean = false;
	s->bg_kicks++;
	pthread_cond_broadcast(&s->bg_cond);
	pthread_mutex_unlock(&s->bg_lock);
}

int ckpt_store_put_chunk(ckpt_store *s, const void *data, size_t len, unsigned elem_size,
			 ckpt_digest *ret_digest)
{
	struct iovec one = { (void *)data, len };

	if (!data)
		return -EINVAL;
	return ckpt_store_put_chunkv(s, &one, 1, elem_size, ret_digest);
}

int ckpt_store_put_chunkv(ckpt_store *s, const struct iovec *iov, int cnt, unsigned elem_size,
			  ckpt_digest *ret_digest)
{
	struct tls_ctx *t;
	bool deferred;
	struct ckpt_chunk_loc loc;
	struct ckpt_chunk_rec rec;
	struct iovec outv;
	const struct iovec *stored = iov;
	int nstored = cnt;
	uint8_t *joined = NULL;
	size_t len = 0;
	ckpt_digest d;
	uint8_t key[32];
	int r;

	if (!iov || cnt < 1 || cnt > CKPT_CHUNK_PUT_IOV)
		return -EINVAL;
	for (int i = 0; i < cnt; i++) {
		if (!iov[i].iov_base)
			return -EINVAL;
		len += iov[i].iov_len;
	}
	if (len == 0 || len > CKPT_CHUNK_MAX)
		return -EINVAL;
	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	r = ckpt_hash_chunkv(s->hasher, iov, cnt, &d);
	if (r < 0)
		return r;
	*ret_digest = d;
	/* Dedup: pending first, then the index (see I3).  Either way the
	 * digest is obtained again now (reclaim.c): garbage found before is
	 * not dropped; an index entry being dropped right now is not counted
	 * on (this put stores its own record). */
	if (st_pending_obtain(s, &d))
		goto dedup_hit;
	if (s->opts.node) {
		/* On a node an entry at refcount 0 is not a hit: gc on another
		 * host may drop it before this put's file is committed (the gc
		 * fence covers only what fell to 0 after the hit, session.c) */
		struct ckpt_chunk_loc iloc;
		uint64_t refs = 0;

		r = ckpt_meta_get_chunk(s->eng, NULL, &d, &iloc, &refs);
		if (r == 0 && refs > 0)
			goto dedup_hit;
		if (r < 0 && r != -ENOENT)
			return r;
	} else if (!st_revive(s, &d)) {
		r = ckpt_engine_has(s->eng, key, ckpt_key_chunk(key, &d));
		if (r > 0)
			goto dedup_hit;
		if (r < 0)
			return r;
	}

	memset(&rec, 0, sizeof(rec));
	deferred = s->bg_started && s->opts.bg == CKPT_BG_ALL && s->opts.compress_level > 0;
	if (deferred) {
		/* the save path runs at disk speed; st_bg_main compresses later */
		rec.codec = CKPT_CODEC_RAW;
		rec.stored_len = (uint32_t)len;
	} else {
		const void *in = iov[0].iov_base, *out;
		size_t out_len;

		t = st_tls_get(s);
		if (!t)
			return -ENOMEM;
		if (cnt > 1) {
			/* the compressor wants one buffer */
			joined = malloc(len);
			if (!joined)
				return -ENOMEM;
			size_t at = 0;

			for (int i = 0; i < cnt; i++) {
				memcpy(joined + at, iov[i].iov_base, iov[i].iov_len);
				at += iov[i].iov_len;
			}
			in = joined;
		}
		r = ckpt_compress(t->cc, in, len, elem_size, &rec.codec, &out, &out_len);
		if (r < 0)
			goto out;
		ckpt_metric_add(CKPT_M_COMPRESS_IN_INLINE, len);
		ckpt_metric_add(CKPT_M_COMPRESS_OUT_INLINE, out_len);
		outv.iov_base = (void *)out;
		outv.iov_len = out_len;
		stored = &outv;
		nstored = 1;
		rec.stored_len = (uint32_t)out_len;
	}
	r = st_check_space(s, rec.stored_len, ST_SPACE_FILE);
	if (r < 0)
		goto out;
	rec.raw_len = (uint32_t)len;
	memcpy(rec.digest, d.bytes, CKPT_DIGEST_LEN);
	atomic_fetch_add(&s->puts_inflight, 1);
	atomic_store(&s->last_put_ns, ckpt_mono_ns());
	r = ckpt_cb_put(s->cb, &rec, stored, nstored, CKPT_CHUNK_FRESH, &loc);
	if (r == 0) {
		if (deferred) {
			loc.flags = CKPT_CHUNK_F_DEFERRED;
			loc.elem = (uint8_t)elem_size;
		}
		/* a racing twin may have won: harmless duplicate */
		if (st_pending_add(s, &d, &loc) && deferred)
			st_bg_enqueue(s, &d, (uint8_t)elem_size);
		ckpt_metric_add(CKPT_M_CHUNKS_NEW, 1);
		ckpt_metric_add(CKPT_M_CHUNK_BYTES_NEW, len);
		ckpt_metric_add(CKPT_M_STORED_BYTES, rec.stored_len);
	}
	atomic_fetch_sub(&s->puts_inflight, 1);
out:
	free(joined);
	return r;

dedup_hit:
	if (s->opts.verify_dedup && (r = verify_same(s, &d, iov, cnt, len)) < 0)
		return r;
	ckpt_metric_add(CKPT_M_CHUNKS_DEDUP, 1);
	ckpt_metric_add(CKPT_M_CHUNK_BYTES_DEDUP, len);
	return 0;
}


