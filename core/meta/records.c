/* SPDX-License-Identifier: MIT */
/*
 * records.c - key builders and record codecs of the metadata (records.h).
 * Pure functions over caller buffers; no engine calls.
 */
#include "meta/records.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>

#include "base/util.h"


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

int ckpt_key_dentry_decode(const uint8_t *key, size_t klen, uint64_t *ret_parent,
			   const char **ret_name, size_t *ret_namelen)
{
	const char *name;
	size_t n;

	if (klen < 10 || klen - 9 > CKPT_NAME_MAX || key[0] != CKPT_KEY_DENTRY)
		return -EIO;
	name = (const char *)key + 9;
	n = klen - 9;
	if (memchr(name, '/', n) || memchr(name, '\0', n) ||
	    (name[0] == '.' && (n == 1 || (n == 2 && name[1] == '.'))))
		return -EIO;
	*ret_parent = ckpt_get_be64(key + 1);
	*ret_name = name;
	*ret_namelen = n;
	return 0;
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

bool ckpt_node_name_ok(const char *name)
{
	size_t n = name ? strlen(name) : 0;

	if (n < 1 || n > CKPT_NODE_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == ':' || c == '-'))
			return false;
	}
	return true;
}

size_t ckpt_key_session(uint8_t *key, const char *node)
{
	size_t n = strlen(node);

	key[0] = CKPT_KEY_SESSION;
	memcpy(key + 1, node, n);
	return 1 + n;
}

size_t ckpt_session_encode(const struct ckpt_session *ss, uint8_t out[CKPT_SESSION_REC_MAX])
{
	size_t hl = strnlen(ss->host, CKPT_HOST_MAX);

	memset(out, 0, 30);
	out[0] = CKPT_REC_VERSION;
	ckpt_put_le64(out + 1, ss->id);
	ckpt_put_le64(out + 9, (uint64_t)ss->heartbeat_ns);
	ckpt_put_le64(out + 17, ss->pin);
	ckpt_put_le32(out + 25, ss->timeout_ms);
	/* out[29]: the host name's length, then the pid after it */
	out[29] = (uint8_t)hl;
	memcpy(out + 30, ss->host, hl);
	ckpt_put_le32(out + 30 + hl, ss->pid);
	ckpt_put_le64(out + 34 + hl, (uint64_t)ss->suspect_ns);
	return 42 + hl;
}

int ckpt_session_decode(const uint8_t *buf, size_t len, struct ckpt_session *ret)
{
	size_t hl;

	if (len < 42 || buf[0] != CKPT_REC_VERSION)
		return -EIO;
	hl = buf[29];
	if (hl > CKPT_HOST_MAX || len != 42 + hl)
		return -EIO;
	memset(ret, 0, sizeof(*ret));
	ret->id = ckpt_get_le64(buf + 1);
	ret->heartbeat_ns = (int64_t)ckpt_get_le64(buf + 9);
	ret->pin = ckpt_get_le64(buf + 17);
	ret->timeout_ms = ckpt_get_le32(buf + 25);
	memcpy(ret->host, buf + 30, hl);
	ret->host[hl] = '\0';
	ret->pid = ckpt_get_le32(buf + 30 + hl);
	ret->suspect_ns = (int64_t)ckpt_get_le64(buf + 34 + hl);
	return 0;
}

size_t ckpt_key_zero(uint8_t *key, const ckpt_digest *d)
{
	key[0] = CKPT_KEY_ZERO;
	memcpy(key + 1, d->bytes, CKPT_DIGEST_LEN);
	return 1 + CKPT_DIGEST_LEN;
}

void ckpt_zero_encode(uint64_t epoch, uint8_t out[CKPT_ZERO_REC_LEN])
{
	out[0] = CKPT_REC_VERSION;
	ckpt_put_le64(out + 1, epoch);
}

int ckpt_zero_decode(const uint8_t *buf, size_t len, uint64_t *ret_epoch)
{
	if (len != CKPT_ZERO_REC_LEN || buf[0] != CKPT_REC_VERSION)
		return -EIO;
	*ret_epoch = ckpt_get_le64(buf + 1);
	return 0;
}

size_t ckpt_key_unit(uint8_t *key, uint64_t unit)
{
	return ckpt_key_ino(key, CKPT_KEY_UNIT, unit);
}

void ckpt_unit_encode(uint64_t session, uint8_t out[CKPT_UNIT_REC_LEN])
{
	out[0] = CKPT_REC_VERSION;
	ckpt_put_le64(out + 1, session);
}

int ckpt_unit_decode(const uint8_t *buf, size_t len, uint64_t *ret_session)
{
	if (len != CKPT_UNIT_REC_LEN || buf[0] != CKPT_REC_VERSION)
		return -EIO;
	*ret_session = ckpt_get_le64(buf + 1);
	return 0;
}

void ckpt_inode_encode(const struct ckpt_inode *in, uint8_t out[CKPT_INODE_REC_LEN])
{
	memset(out, 0, CKPT_INODE_REC_LEN);
	out[0] = in->rdev ? CKPT_INODE_REC_VERSION_RDEV : CKPT_REC_VERSION;
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
	if (in->rdev) {
		ckpt_put_le32(out + 72, major(in->rdev));
		ckpt_put_le32(out + 76, minor(in->rdev));
	} /* else 72..79 reserved, zero (version 1) */
}

int ckpt_inode_decode(uint64_t ino, const uint8_t *buf, size_t len, struct ckpt_inode *ret)
{
	if (len != CKPT_INODE_REC_LEN ||
	    (buf[0] != CKPT_REC_VERSION && buf[0] != CKPT_INODE_REC_VERSION_RDEV))
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
	ret->rdev = buf[0] == CKPT_INODE_REC_VERSION_RDEV ?
			    makedev(ckpt_get_le32(buf + 72), ckpt_get_le32(buf + 76)) : 0;
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
