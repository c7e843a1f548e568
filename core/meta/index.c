/* SPDX-License-Identifier: MIT */
#include "meta/index.h"

#include <dirent.h>
#include <errno.h>
#include <rocksdb/c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

struct ckpt_index {
	rocksdb_t *db;
	rocksdb_options_t *opts;
	rocksdb_block_based_table_options_t *topts;
	rocksdb_cache_t *cache;
	rocksdb_filterpolicy_t *filter; /* owned by topts once set */
	rocksdb_readoptions_t *ropts;
	rocksdb_writeoptions_t *wopts_sync;
	rocksdb_writeoptions_t *wopts_nosync;
	rocksdb_flushoptions_t *fopts;
};

struct ckpt_batch {
	rocksdb_writebatch_t *wb;
};

struct ckpt_iter {
	rocksdb_iterator_t *it;
	rocksdb_readoptions_t *ropts;
	const rocksdb_snapshot_t *snap;
	ckpt_index *ix;
	uint8_t prefix[CKPT_KEY_MAX];
	size_t plen;
	int started;
};

/* RocksDB reports errors as strings; map the ones callers act on. */
static int rocks_errno(char *err)
{
	int r = -EIO;

	if (!err)
		return 0;
	if (strstr(err, "No space left") || strstr(err, "NoSpace"))
		r = -ENOSPC;
	ckpt_err("index: %s", err);
	rocksdb_free(err);
	return r;
}

/* The number of write-ahead logs (NNNNNN.log) in dir, or -errno. */
static int count_wals(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	size_t len;
	int n = 0;

	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		len = strlen(de->d_name);
		if (len > 4 && strcmp(de->d_name + len - 4, ".log") == 0)
			n++;
	}
	closedir(d);
	return n;
}

/*
 * RocksDB 7.x (Debian 12 ships 7.8) creates a write-ahead log at every
 * read-write open and lets a log go only once a memtable flush has moved
 * the oldest log to keep past it.  An open that writes nothing flushes
 * nothing, so every mount that only reads left one more empty log behind:
 * a store mounted 2,191 times had 2,191 of them, and each open lists them
 * all again (fixed upstream in RocksDB 8.3, "Delete empty WAL files on
 * reopen").  When more than CKPT_INDEX_WALS_MAX logs are there, write one
 * tombstone of a key that never exists ('M' "wal-trim") and flush it: the
 * flush records the newer log number and RocksDB deletes the old logs.
 * The tombstone's tiny table is merged away by compaction.
 */
#define CKPT_INDEX_WALS_MAX 4

static int trim_wals(ckpt_index *ix, const char *dir)
{
	static const char key[] = { CKPT_KEY_META, 'w', 'a', 'l', '-', 't', 'r', 'i', 'm' };
	ckpt_batch *b;
	int r = count_wals(dir);

	if (r <= CKPT_INDEX_WALS_MAX)
		return r < 0 ? r : 0;
	b = ckpt_batch_new();
	if (!b)
		return -ENOMEM;
	ckpt_batch_delete(b, key, sizeof(key));
	r = ckpt_index_write(ix, b, false);
	ckpt_batch_free(b);
	if (r == 0)
		r = ckpt_index_flush(ix);
	return r;
}

int ckpt_index_open(const char *dir, bool create, bool read_only, uint64_t cache_bytes,
		    ckpt_index **ret_index, char *errbuf, size_t errlen)
{
	ckpt_index *ix = calloc(1, sizeof(*ix));
	char *err = NULL;
	int r = -ENOMEM;

	if (!ix)
		goto fail;
	ix->opts = rocksdb_options_create();
	rocksdb_options_set_create_if_missing(ix->opts, create);
	rocksdb_options_increase_parallelism(ix->opts, 2);
	rocksdb_options_set_compression(ix->opts, rocksdb_lz4_compression);
	rocksdb_options_set_max_open_files(ix->opts, 512);
	rocksdb_options_set_keep_log_file_num(ix->opts, 4);
	rocksdb_options_set_recycle_log_file_num(ix->opts, 0);
	ix->topts = rocksdb_block_based_options_create();
	ix->cache = rocksdb_cache_create_lru(cache_bytes ? cache_bytes : 64u << 20);
	rocksdb_block_based_options_set_block_cache(ix->topts, ix->cache);
	ix->filter = rocksdb_filterpolicy_create_bloom_full(10);
	rocksdb_block_based_options_set_filter_policy(ix->topts, ix->filter);
	rocksdb_options_set_block_based_table_factory(ix->opts, ix->topts);
	if (read_only)
		ix->db = rocksdb_open_for_read_only(ix->opts, dir, 0, &err);
	else
		ix->db = rocksdb_open(ix->opts, dir, &err);
	if (err) {
		snprintf(errbuf, errlen, "cannot open index %s: %s", dir, err);
		r = strstr(err, "lock") ? -EBUSY : -EIO;
		rocksdb_free(err);
		goto fail;
	}
	ix->ropts = rocksdb_readoptions_create();
	ix->wopts_sync = rocksdb_writeoptions_create();
	rocksdb_writeoptions_set_sync(ix->wopts_sync, 1);
	ix->wopts_nosync = rocksdb_writeoptions_create();
	rocksdb_writeoptions_set_sync(ix->wopts_nosync, 0);
	ix->fopts = rocksdb_flushoptions_create();
	rocksdb_flushoptions_set_wait(ix->fopts, 1);
	if (!read_only) {
		r = trim_wals(ix, dir);
		if (r < 0) /* harmless: the logs stay for the next open to try */
			ckpt_warn("index %s: cannot drop old write-ahead logs: %s", dir,
				  strerror(-r));
	}
	*ret_index = ix;
	return 0;
fail:
	if (r == -ENOMEM)
		snprintf(errbuf, errlen, "out of memory");
	ckpt_index_free(ix);
	return r;
}

void ckpt_index_free(ckpt_index *ix)
{
	if (!ix)
		return;
	if (ix->db)
		rocksdb_close(ix->db);
	if (ix->opts)
		rocksdb_options_destroy(ix->opts);
	if (ix->topts)
		rocksdb_block_based_options_destroy(ix->topts);
	if (ix->cache)
		rocksdb_cache_destroy(ix->cache);
	if (ix->ropts)
		rocksdb_readoptions_destroy(ix->ropts);
	if (ix->wopts_sync)
		rocksdb_writeoptions_destroy(ix->wopts_sync);
	if (ix->wopts_nosync)
		rocksdb_writeoptions_destroy(ix->wopts_nosync);
	if (ix->fopts)
		rocksdb_flushoptions_destroy(ix->fopts);
	free(ix);
}

int ckpt_index_get(ckpt_index *ix, const void *key, size_t klen, uint8_t **ret_val,
		   size_t *ret_len)
{
	char *err = NULL;
	size_t vlen = 0;
	char *v = rocksdb_get(ix->db, ix->ropts, key, klen, &vlen, &err);
	uint8_t *copy;

	if (err)
		return rocks_errno(err);
	if (!v)
		return -ENOENT;
	copy = malloc(vlen ? vlen : 1);
	if (!copy) {
		rocksdb_free(v);
		return -ENOMEM;
	}
	memcpy(copy, v, vlen);
	rocksdb_free(v);
	*ret_val = copy;
	*ret_len = vlen;
	return 0;
}

int ckpt_index_get_fixed(ckpt_index *ix, const void *key, size_t klen, void *buf, size_t len)
{
	char *err = NULL;
	size_t vlen = 0;
	char *v = rocksdb_get(ix->db, ix->ropts, key, klen, &vlen, &err);
	int r = 0;

	if (err)
		return rocks_errno(err);
	if (!v)
		return -ENOENT;
	if (vlen != len)
		r = -EIO;
	else
		memcpy(buf, v, len);
	rocksdb_free(v);
	return r;
}

ckpt_batch *ckpt_batch_new(void)
{
	ckpt_batch *b = calloc(1, sizeof(*b));

	if (!b)
		return NULL;
	b->wb = rocksdb_writebatch_create();
	return b;
}

void ckpt_batch_free(ckpt_batch *b)
{
	if (!b)
		return;
	rocksdb_writebatch_destroy(b->wb);
	free(b);
}

void ckpt_batch_put(ckpt_batch *b, const void *key, size_t klen, const void *val, size_t vlen)
{
	rocksdb_writebatch_put(b->wb, key, klen, val, vlen);
}

void ckpt_batch_delete(ckpt_batch *b, const void *key, size_t klen)
{
	rocksdb_writebatch_delete(b->wb, key, klen);
}

int ckpt_batch_count(ckpt_batch *b)
{
	return rocksdb_writebatch_count(b->wb);
}

int ckpt_index_write(ckpt_index *ix, ckpt_batch *b, bool sync)
{
	char *err = NULL;

	rocksdb_write(ix->db, sync ? ix->wopts_sync : ix->wopts_nosync, b->wb, &err);
	return rocks_errno(err);
}

int ckpt_index_flush(ckpt_index *ix)
{
	char *err = NULL;

	rocksdb_flush(ix->db, ix->fopts, &err);
	if (err)
		return rocks_errno(err);
	rocksdb_flush_wal(ix->db, 1, &err);
	return rocks_errno(err);
}

int ckpt_index_sync_wal(ckpt_index *ix)
{
	char *err = NULL;

	rocksdb_flush_wal(ix->db, 1, &err);
	return rocks_errno(err);
}

int ckpt_iter_new(ckpt_index *ix, const void *prefix, size_t plen, ckpt_iter **ret_iter)
{
	ckpt_iter *it;

	if (plen > sizeof(it->prefix))
		return -EINVAL;
	it = calloc(1, sizeof(*it));
	if (!it)
		return -ENOMEM;
	it->ix = ix;
	it->ropts = rocksdb_readoptions_create();
	it->snap = rocksdb_create_snapshot(ix->db);
	rocksdb_readoptions_set_snapshot(it->ropts, it->snap);
	rocksdb_readoptions_set_fill_cache(it->ropts, 0);
	it->it = rocksdb_create_iterator(ix->db, it->ropts);
	memcpy(it->prefix, prefix, plen);
	it->plen = plen;
	*ret_iter = it;
	return 0;
}

int ckpt_iter_next(ckpt_iter *it, const uint8_t **ret_key, size_t *ret_klen,
		   const uint8_t **ret_val, size_t *ret_vlen)
{
	char *err = NULL;
	const char *k;
	size_t klen;

	if (!it->started) {
		rocksdb_iter_seek(it->it, (const char *)it->prefix, it->plen);
		it->started = 1;
	} else {
		rocksdb_iter_next(it->it);
	}
	if (!rocksdb_iter_valid(it->it)) {
		rocksdb_iter_get_error(it->it, &err);
		return rocks_errno(err);
	}
	k = rocksdb_iter_key(it->it, &klen);
	if (klen < it->plen || memcmp(k, it->prefix, it->plen) != 0)
		return 0;
	*ret_key = (const uint8_t *)k;
	*ret_klen = klen;
	*ret_val = (const uint8_t *)rocksdb_iter_value(it->it, ret_vlen);
	return 1;
}

void ckpt_iter_free(ckpt_iter *it)
{
	if (!it)
		return;
	rocksdb_iter_destroy(it->it);
	rocksdb_release_snapshot(it->ix->db, it->snap);
	rocksdb_readoptions_destroy(it->ropts);
	free(it);
}

/* ---- records ---- */

size_t ckpt_key_ino(uint8_t *key, char type, uint64_t ino)
{
	key[0] = (uint8_t)type;
	ckpt_put_be64(key + 1, ino);
	return 9;
}

size_t ckpt_key_dentry(uint8_t *key, uint64_t parent, const char *name, size_t namelen)
{
	key[0] = CKPT_KEY_DENTRY;
	ckpt_put_be64(key + 1, parent);
	memcpy(key + 9, name, namelen);
	return 9 + namelen;
}

size_t ckpt_key_chunk(uint8_t *key, const ckpt_digest *d)
{
	key[0] = CKPT_KEY_CHUNK;
	memcpy(key + 1, d->bytes, CKPT_DIGEST_LEN);
	return 1 + CKPT_DIGEST_LEN;
}

size_t ckpt_key_meta(uint8_t *key, const char *name)
{
	size_t n = strlen(name);

	key[0] = CKPT_KEY_META;
	memcpy(key + 1, name, n);
	return 1 + n;
}

void ckpt_inode_encode(const struct ckpt_inode *in, uint8_t out[CKPT_INODE_REC_LEN])
{
	memset(out, 0, CKPT_INODE_REC_LEN);
	out[0] = CKPT_REC_VERSION;
	ckpt_put_le32(out + 4, in->mode);
	ckpt_put_le32(out + 8, in->uid);
	ckpt_put_le32(out + 12, in->gid);
	ckpt_put_le32(out + 16, in->nlink);
	ckpt_put_le32(out + 20, in->flags);
	ckpt_put_le64(out + 24, in->size);
	ckpt_put_le64(out + 32, (uint64_t)in->atime_ns);
	ckpt_put_le64(out + 40, (uint64_t)in->mtime_ns);
	ckpt_put_le64(out + 48, (uint64_t)in->ctime_ns);
	ckpt_put_le64(out + 56, in->parent);
	ckpt_put_le64(out + 64, in->generation);
	/* 72..79 reserved, zero */
}

int ckpt_inode_decode(uint64_t ino, const uint8_t *buf, size_t len, struct ckpt_inode *ret)
{
	if (len != CKPT_INODE_REC_LEN || buf[0] != CKPT_REC_VERSION)
		return -EIO;
	ret->ino = ino;
	ret->mode = ckpt_get_le32(buf + 4);
	ret->uid = ckpt_get_le32(buf + 8);
	ret->gid = ckpt_get_le32(buf + 12);
	ret->nlink = ckpt_get_le32(buf + 16);
	ret->flags = ckpt_get_le32(buf + 20);
	ret->size = ckpt_get_le64(buf + 24);
	ret->atime_ns = (int64_t)ckpt_get_le64(buf + 32);
	ret->mtime_ns = (int64_t)ckpt_get_le64(buf + 40);
	ret->ctime_ns = (int64_t)ckpt_get_le64(buf + 48);
	ret->parent = ckpt_get_le64(buf + 56);
	ret->generation = ckpt_get_le64(buf + 64);
	return 0;
}

void ckpt_dentry_encode(uint64_t ino, uint32_t mode, uint8_t out[CKPT_DENTRY_REC_LEN])
{
	memset(out, 0, CKPT_DENTRY_REC_LEN);
	out[0] = CKPT_REC_VERSION;
	ckpt_put_le32(out + 4, mode);
	ckpt_put_le64(out + 8, ino);
}

int ckpt_dentry_decode(const uint8_t *buf, size_t len, uint64_t *ret_ino, uint32_t *ret_mode)
{
	if (len != CKPT_DENTRY_REC_LEN || buf[0] != CKPT_REC_VERSION)
		return -EIO;
	*ret_mode = ckpt_get_le32(buf + 4);
	*ret_ino = ckpt_get_le64(buf + 8);
	return 0;
}

void ckpt_chunk_rec_encode(const struct ckpt_chunk_loc *loc, uint64_t refcount,
			   uint8_t out[CKPT_CHUNK_REC_LEN])
{
	memset(out, 0, CKPT_CHUNK_REC_LEN);
	out[0] = CKPT_REC_VERSION;
	out[1] = loc->codec;
	out[2] = loc->flags;
	out[3] = loc->elem;
	ckpt_put_le32(out + 4, loc->stored_len);
	ckpt_put_le32(out + 8, loc->raw_len);
	memcpy(out + 16, loc->where, CKPT_CHUNK_WHERE_LEN);
	ckpt_put_le64(out + 32, refcount);
}

int ckpt_chunk_rec_decode(const uint8_t *buf, size_t len, struct ckpt_chunk_loc *ret_loc,
			  uint64_t *ret_refcount)
{
	if (len != CKPT_CHUNK_REC_LEN || buf[0] != CKPT_REC_VERSION)
		return -EIO;
	ret_loc->codec = buf[1];
	ret_loc->flags = buf[2];
	ret_loc->elem = buf[3];
	ret_loc->stored_len = ckpt_get_le32(buf + 4);
	ret_loc->raw_len = ckpt_get_le32(buf + 8);
	memcpy(ret_loc->where, buf + 16, CKPT_CHUNK_WHERE_LEN);
	if (ret_refcount)
		*ret_refcount = ckpt_get_le64(buf + 32);
	return 0;
}

struct ckpt_extent_list *ckpt_extent_list_new(void)
{
	return calloc(1, sizeof(struct ckpt_extent_list));
}

void ckpt_extent_list_free(struct ckpt_extent_list *l)
{
	if (!l)
		return;
	free(l->v);
	free(l);
}

static int reserve(struct ckpt_extent_list *l, size_t n)
{
	struct ckpt_extent *v;
	size_t cap;

	if (n <= l->cap)
		return 0;
	cap = l->cap ? l->cap * 2 : 16;
	while (cap < n)
		cap *= 2;
	v = realloc(l->v, cap * sizeof(*v));
	if (!v)
		return -ENOMEM;
	l->v = v;
	l->cap = cap;
	return 0;
}

int ckpt_extent_list_append(struct ckpt_extent_list *l, uint32_t len, uint8_t kind,
			    const ckpt_digest *d)
{
	struct ckpt_extent *e;
	int r;

	if (len == 0)
		return 0;
	/* Merge adjacent zero runs while they fit in 32 bits. */
	if (kind == CKPT_EXT_ZERO && l->n > 0 && l->v[l->n - 1].kind == CKPT_EXT_ZERO &&
	    (uint64_t)l->v[l->n - 1].len + len <= UINT32_MAX) {
		l->v[l->n - 1].len += len;
		l->size += len;
		return 0;
	}
	r = reserve(l, l->n + 1);
	if (r < 0)
		return r;
	e = &l->v[l->n++];
	memset(e, 0, sizeof(*e));
	e->off = l->size;
	e->len = len;
	e->kind = kind;
	if (kind == CKPT_EXT_CHUNK && d)
		e->digest = *d;
	l->size += len;
	return 0;
}

size_t ckpt_extent_list_find(const struct ckpt_extent_list *l, uint64_t off)
{
	size_t lo = 0, hi = l->n;

	if (off >= l->size)
		return l->n;
	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;
		if (l->v[mid].off <= off)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

void ckpt_extent_list_truncate(struct ckpt_extent_list *l, uint64_t off)
{
	size_t i;

	if (off >= l->size)
		return;
	i = ckpt_extent_list_find(l, off);
	if (l->v[i].off == off) {
		l->n = i;
	} else {
		/* An extent may name a prefix of its chunk: shorten it. */
		l->v[i].len = (uint32_t)(off - l->v[i].off);
		l->n = i + 1;
	}
	l->size = off;
}

struct ckpt_extent_list *ckpt_extent_list_dup(const struct ckpt_extent_list *l)
{
	struct ckpt_extent_list *c = ckpt_extent_list_new();

	if (!c)
		return NULL;
	if (l->n && reserve(c, l->n) < 0) {
		free(c);
		return NULL;
	}
	if (l->n)
		memcpy(c->v, l->v, l->n * sizeof(*l->v));
	c->n = l->n;
	c->size = l->size;
	return c;
}

int ckpt_extent_list_encode(const struct ckpt_extent_list *l, uint8_t **ret_buf, size_t *ret_len)
{
	size_t len = CKPT_FILE_HDR_LEN + l->n * CKPT_FILE_ENT_LEN;
	uint8_t *buf = calloc(1, len), *p;

	if (!buf)
		return -ENOMEM;
	buf[0] = CKPT_REC_VERSION;
	ckpt_put_le32(buf + 4, (uint32_t)l->n);
	ckpt_put_le64(buf + 8, l->size);
	p = buf + CKPT_FILE_HDR_LEN;
	for (size_t i = 0; i < l->n; i++, p += CKPT_FILE_ENT_LEN) {
		ckpt_put_le32(p, l->v[i].len);
		p[4] = l->v[i].kind;
		memcpy(p + 8, l->v[i].digest.bytes, CKPT_DIGEST_LEN);
	}
	*ret_buf = buf;
	*ret_len = len;
	return 0;
}

int ckpt_extent_list_decode(const uint8_t *buf, size_t len, struct ckpt_extent_list **ret)
{
	struct ckpt_extent_list *l;
	uint32_t n;
	uint64_t size;
	const uint8_t *p;
	int r;

	if (len < CKPT_FILE_HDR_LEN || buf[0] != CKPT_REC_VERSION)
		return -EIO;
	n = ckpt_get_le32(buf + 4);
	size = ckpt_get_le64(buf + 8);
	if ((len - CKPT_FILE_HDR_LEN) / CKPT_FILE_ENT_LEN != n ||
	    (len - CKPT_FILE_HDR_LEN) % CKPT_FILE_ENT_LEN != 0)
		return -EIO;
	l = ckpt_extent_list_new();
	if (!l)
		return -ENOMEM;
	r = reserve(l, n);
	if (r < 0)
		goto fail;
	p = buf + CKPT_FILE_HDR_LEN;
	for (uint32_t i = 0; i < n; i++, p += CKPT_FILE_ENT_LEN) {
		struct ckpt_extent *e = &l->v[i];
		e->off = l->size;
		e->len = ckpt_get_le32(p);
		e->kind = p[4];
		memcpy(e->digest.bytes, p + 8, CKPT_DIGEST_LEN);
		if (e->kind > CKPT_EXT_ZERO || e->len == 0) {
			r = -EIO;
			goto fail;
		}
		l->size += e->len;
	}
	l->n = n;
	if (l->size != size) {
		r = -EIO;
		goto fail;
	}
	*ret = l;
	return 0;
fail:
	ckpt_extent_list_free(l);
	return r;
}
