/* SPDX-License-Identifier: MIT */
/*
 * meta.c - the store calls around its metadata that are not namespace
 * operations (meta/ns.h has the record reads and writes they share).
 */
#include "store/store_int.h"

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

struct txn_tramp {
	ckpt_store *s;
	st_txn_fn fn;
	void *arg;
};

static int txn_tramp(ckpt_txn *t, void *arg)
{
	struct txn_tramp *x = arg;

	return x->fn(x->s, t, x->arg);
}

int st_txn_run(ckpt_store *s, st_txn_fn fn, void *arg, bool durable)
{
	struct txn_tramp x = { s, fn, arg };

	return ckpt_txn_run(s->eng, txn_tramp, &x, durable);
}
