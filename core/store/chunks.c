/* SPDX-License-Identifier: MIT */
/*
 * chunks.c - chunk location, load, verification and cached reads.
 */
#include "store/store_int.h"

int ckpt_store_chunk_loc(ckpt_store *s, const ckpt_digest *d, struct ckpt_chunk_loc *ret_loc,
			 uint64_t *ret_refcount)
{
	if (st_pending_find(s, d, ret_loc)) {
		if (ret_refcount)
			*ret_refcount = 0;
		return 0;
	}
	return ckpt_meta_get_chunk(s->eng, NULL, d, ret_loc, ret_refcount);
}

/* Decode the record rec (stored bytes at src) of chunk d into dst (loc->raw_len
 * bytes) and check it against the index entry and the keyed digest.  NULL,
 * or what is wrong. */
const char *st_decode_chunk(ckpt_store *s, ckpt_decompressor *dc, const ckpt_digest *d,
			    const struct ckpt_chunk_loc *loc, const struct ckpt_chunk_rec *rec,
			    const uint8_t *src, void *dst)
{
	ckpt_digest check;

	if (memcmp(rec->digest, d->bytes, CKPT_DIGEST_LEN) != 0 || rec->raw_len != loc->raw_len ||
	    rec->codec != loc->codec)
		return "record does not match its index entry";
	if (ckpt_decompress(dc, rec->codec, src, rec->stored_len, dst, rec->raw_len) < 0)
		return "decompression failed";
	ckpt_hash_chunk(s->hasher, dst, rec->raw_len, &check);
	if (memcmp(check.bytes, d->bytes, CKPT_DIGEST_LEN) != 0)
		return "content does not match its digest";
	return NULL;
}

/*
 * Read chunk d at loc, check its record, decompress into dst and check the
 * digest: 0, or -EIO with *ret_why set (damage), or another -errno (from
 * the chunk backend, *ret_why maybe set; -ENOMEM: no verdict).  Quiet.
 * rec_csum false (reads through the mount): skip the record's checksum of
 * the stored bytes.  The decoded bytes are still checked against the keyed
 * digest, which detects any damage the checksum would; only the message
 * differs ("decompression failed" or "content does not match").  fsck and
 * background work keep the full check for precise diagnostics.
 */
int st_check_chunk(ckpt_store *s, const ckpt_digest *d, const struct ckpt_chunk_loc *loc,
		   void *dst, bool rec_csum, const char **ret_why)
{
	ckpt_loadctx *x = ckpt_loadctx_get(s->rctx);
	struct ckpt_chunk_rec rec;
	uint8_t *buf;
	const uint8_t *src = NULL;
	void *mem = NULL;
	const char *why = NULL;
	size_t need;
	int r;

	if (!x)
		return -ENOMEM;
	need = ckpt_cb_get_len(s->cb, loc);
	buf = ckpt_loadctx_buf(x, need, &mem);
	if (!buf) {
		r = -ENOMEM;
		goto out;
	}
	r = ckpt_cb_get(s->cb, loc, rec_csum, buf, need, &rec, &src, &why);
	if (r == 0) {
		why = st_decode_chunk(s, ckpt_loadctx_dc(x), d, loc, &rec, src, dst);
		if (why)
			r = -EIO;
	}
out:
	free(mem);
	ckpt_loadctx_put(s->rctx, x);
	*ret_why = why;
	return r;
}

/* st_check_chunk, logging the damage it finds. */
int st_verify_chunk(ckpt_store *s, const ckpt_digest *d, const struct ckpt_chunk_loc *loc,
		    void *dst, bool rec_csum)
{
	const char *why = NULL;
	int r = st_check_chunk(s, d, loc, dst, rec_csum, &why);

	if (r < 0 && why) {
		char hex[2 * CKPT_DIGEST_LEN + 1], at[CKPT_CHUNK_DESC_MAX];

		ckpt_digest_to_hex(d, hex);
		ckpt_cb_describe(s->cb, loc, at, sizeof(at));
		ckpt_err("%s: chunk %s (%s) is damaged: %s", s->path, hex, at, why);
	}
	return r;
}

/* Read and verify chunk d (uncached) into a new pooled buffer.  known: its
 * location if the caller has just looked it up, else NULL. */
int st_load_chunk(ckpt_store *s, const ckpt_digest *d, const struct ckpt_chunk_loc *known,
		      uint8_t **ret_buf, size_t *ret_len)
{
	struct ckpt_chunk_loc loc;
	uint8_t *buf;
	int r;

	if (known) {
		loc = *known;
	} else {
		r = ckpt_store_chunk_loc(s, d, &loc, NULL);
		if (r < 0)
			return r == -ENOENT ? -EIO : r;
	}
	buf = ckpt_cache_buf_alloc(s->cache, loc.raw_len);
	if (!buf)
		return -ENOMEM;
	r = st_verify_chunk(s, d, &loc, buf, false);
	if (r == -EIO) {
		/* background work may have moved the chunk (and deleted
		 * its old pack) between the lookup and the read */
		struct ckpt_chunk_loc now;
		if (ckpt_store_chunk_loc(s, d, &now, NULL) == 0 &&
		    !ckpt_chunk_loc_same(&now, &loc) &&
		    now.raw_len == loc.raw_len) {
			loc = now;
			r = st_verify_chunk(s, d, &loc, buf, false);
		}
	}
	if (r < 0) {
		ckpt_cache_buf_free(s->cache, buf, loc.raw_len);
		return r;
	}
	*ret_buf = buf;
	*ret_len = loc.raw_len;
	return 0;
}

/* Pin chunk d in the chunk cache, loading and verifying it on a miss (one
 * load per chunk however many threads ask at once; stream: for a
 * sequential reader, see ckpt_cache_fill_as()); *ret_data holds *ret_len
 * bytes until ckpt_cache_release(s->cache, *ret_entry). */
int st_chunk_get(ckpt_store *s, const ckpt_digest *d, bool stream, ckpt_cache_entry **ret_entry,
		 const uint8_t **ret_data, size_t *ret_len)
{
	ckpt_cache_entry *e;
	const uint8_t *data = NULL;
	size_t dlen = 0;
	uint8_t *buf;
	bool fill;
	int r;

	/* Single flight: a chunk being loaded (by another reader or by
	 * read-ahead) is waited for, not loaded twice. */
	e = ckpt_cache_acquire(s->cache, d, &data, &dlen, &fill);
	if (!e)
		return -ENOMEM;
	if (fill) {
		r = st_load_chunk(s, d, NULL, &buf, &dlen);
		if (r < 0) {
			ckpt_cache_abandon(s->cache, e);
			return r;
		}
		data = ckpt_cache_fill_buf(s->cache, e, buf, dlen, stream, true);
	}
	*ret_entry = e;
	*ret_data = data;
	*ret_len = dlen;
	return 0;
}


void ckpt_store_cache_stats(ckpt_store *s, struct ckpt_cache_stats *ret)
{
	ckpt_cache_get_stats(s->cache, ret);
}

uint8_t *ckpt_store_buf_alloc(ckpt_store *s, size_t len)
{
	return ckpt_cache_buf_alloc(s->cache, len ? len : 1);
}

void ckpt_store_buf_free(ckpt_store *s, uint8_t *buf, size_t len)
{
	ckpt_cache_buf_free(s->cache, buf, len ? len : 1);
}

int ckpt_store_read_chunk(ckpt_store *s, const ckpt_digest *d, uint64_t off, void *dst,
			  size_t len)
{
	ckpt_cache_entry *e;
	const uint8_t *data;
	size_t dlen;
	int r;

	r = st_chunk_get(s, d, false, &e, &data, &dlen);
	if (r < 0)
		return r;
	if (off > dlen || len > dlen - off) {
		r = -EIO;
	} else {
		memcpy(dst, data + off, len);
		r = 0;
	}
	ckpt_cache_release(s->cache, e);
	return r;
}

