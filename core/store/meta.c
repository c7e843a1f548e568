/* SPDX-License-Identifier: MIT */
/*
 * meta.c - the store's reads and writes of its records over the metadata
 * engine (codecs in meta/records.h), and the store calls around meta.
 */
#include "store/store_int.h"

int st_get_fixed(ckpt_store *s, ckpt_txn *t, const void *key, size_t klen, void *buf, size_t len)
{
	if (t)
		return ckpt_txn_get_fixed(t, key, klen, CKPT_TXN_FOR_UPDATE, buf, len);
	return ckpt_engine_get_fixed(s->eng, key, klen, buf, len);
}

int st_get(ckpt_store *s, ckpt_txn *t, const void *key, size_t klen, uint8_t **ret_val,
	   size_t *ret_len)
{
	if (t)
		return ckpt_txn_get(t, key, klen, CKPT_TXN_FOR_UPDATE, ret_val, ret_len);
	return ckpt_engine_get(s->eng, key, klen, ret_val, ret_len);
}

int st_meta_get_u64(ckpt_store *s, ckpt_txn *t, const char *name, uint64_t *ret)
{
	uint8_t key[64], buf[8];
	int r = st_get_fixed(s, t, key, ckpt_key_meta(key, name), buf, 8);

	if (r < 0)
		return r;
	*ret = ckpt_get_le64(buf);
	return 0;
}

void st_put_meta_u64(ckpt_txn *t, const char *name, uint64_t v)
{
	uint8_t key[64], buf[8];

	ckpt_put_le64(buf, v);
	ckpt_txn_put(t, key, ckpt_key_meta(key, name), buf, 8);
}

void st_put_meta_bytes(ckpt_txn *t, const char *name, const void *v, size_t len)
{
	uint8_t key[64];

	ckpt_txn_put(t, key, ckpt_key_meta(key, name), v, len);
}

void st_put_inode(ckpt_txn *t, const struct ckpt_inode *in)
{
	uint8_t key[16], val[CKPT_INODE_REC_LEN];

	ckpt_inode_encode(in, val);
	ckpt_txn_put(t, key, ckpt_key_ino(key, CKPT_KEY_INODE, in->ino), val, sizeof(val));
}

int st_get_chunk(ckpt_store *s, ckpt_txn *t, const ckpt_digest *d, struct ckpt_chunk_loc *ret_loc,
		 uint64_t *ret_refs)
{
	uint8_t key[32], val[CKPT_CHUNK_REC_LEN];
	int r = st_get_fixed(s, t, key, ckpt_key_chunk(key, d), val, sizeof(val));

	if (r < 0)
		return r;
	return ckpt_chunk_rec_decode(val, sizeof(val), ret_loc, ret_refs);
}

void st_put_chunk(ckpt_txn *t, const ckpt_digest *d, const struct ckpt_chunk_loc *loc,
		  uint64_t refs)
{
	uint8_t key[32], val[CKPT_CHUNK_REC_LEN];

	ckpt_chunk_rec_encode(loc, refs, val);
	ckpt_txn_put(t, key, ckpt_key_chunk(key, d), val, sizeof(val));
}

int ckpt_store_sync_meta(ckpt_store *s)
{
	return ckpt_engine_sync(s->eng);
}

int ckpt_store_parsed_get(ckpt_store *s, uint64_t ino, uint8_t **ret_val, size_t *ret_len)
{
	uint8_t key[16];

	return ckpt_engine_get(s->eng, key, ckpt_key_ino(key, CKPT_KEY_PARSED, ino), ret_val,
			       ret_len);
}

int ckpt_store_parsed_put(ckpt_store *s, uint64_t ino, const void *val, size_t len)
{
	uint8_t key[16];
	unsigned attempt = 0;
	ckpt_txn *t;
	int r;

	if (!ckpt_store_writable(s))
		return -EROFS;
	do { /* a blind write; it conflicts only with a reap of the inode */
		r = ckpt_txn_begin(s->eng, &t);
		if (r < 0)
			return r;
		ckpt_txn_put(t, key, ckpt_key_ino(key, CKPT_KEY_PARSED, ino), val, len);
		r = ckpt_txn_commit(t, false);
	} while (ckpt_txn_retry(r, &attempt));
	return r;
}

int st_txn_run(ckpt_store *s, st_txn_fn fn, void *arg, bool durable)
{
	unsigned attempt = 0;
	ckpt_txn *t;
	int r;

	do {
		r = ckpt_txn_begin(s->eng, &t);
		if (r < 0)
			return r;
		r = fn(s, t, arg);
		if (r == 0) {
			r = ckpt_txn_commit(t, durable);
		} else {
			ckpt_txn_abort(t);
			if (r > 0)
				r = 0;
		}
	} while (ckpt_txn_retry(r, &attempt));
	return r;
}
