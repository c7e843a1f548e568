/* SPDX-License-Identifier: MIT */
/*
 * meta.c - helpers that read and write the store's meta records.
 */
#include "store/store_int.h"

int st_meta_get_u64(ckpt_store *s, const char *name, uint64_t *ret)
{
	uint8_t key[64], buf[8];
	int r = ckpt_index_get_fixed(s->ix, key, ckpt_key_meta(key, name), buf, 8);

	if (r < 0)
		return r;
	*ret = ckpt_get_le64(buf);
	return 0;
}

void st_batch_meta_u64(ckpt_batch *b, const char *name, uint64_t v)
{
	uint8_t key[64], buf[8];

	ckpt_put_le64(buf, v);
	ckpt_batch_put(b, key, ckpt_key_meta(key, name), buf, 8);
}

void st_batch_meta_bytes(ckpt_batch *b, const char *name, const void *v, size_t len)
{
	uint8_t key[64];

	ckpt_batch_put(b, key, ckpt_key_meta(key, name), v, len);
}

void st_batch_inode(ckpt_batch *b, const struct ckpt_inode *in)
{
	uint8_t key[16], val[CKPT_INODE_REC_LEN];

	ckpt_inode_encode(in, val);
	ckpt_batch_put(b, key, ckpt_key_ino(key, CKPT_KEY_INODE, in->ino), val, sizeof(val));
}


int ckpt_store_sync_meta(ckpt_store *s)
{
	return ckpt_index_sync_wal(s->ix);
}

int ckpt_store_parsed_get(ckpt_store *s, uint64_t ino, uint8_t **ret_val, size_t *ret_len)
{
	uint8_t key[16];

	return ckpt_index_get(s->ix, key, ckpt_key_ino(key, CKPT_KEY_PARSED, ino), ret_val, ret_len);
}

int ckpt_store_parsed_put(ckpt_store *s, uint64_t ino, const void *val, size_t len)
{
	uint8_t key[16];
	ckpt_batch *b;
	int r;

	if (!ckpt_store_writable(s))
		return -EROFS;
	b = ckpt_batch_new();
	if (!b)
		return -ENOMEM;
	ckpt_batch_put(b, key, ckpt_key_ino(key, CKPT_KEY_PARSED, ino), val, len);
	r = ckpt_index_write(s->ix, b, false);
	ckpt_batch_free(b);
	return r;
}
