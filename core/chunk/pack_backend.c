/* SPDX-License-Identifier: MIT */
/*
 * pack_backend.c - the "pack" chunk backend: the set of pack files in
 * STORE/packs, appends to the current write packs, group syncs, verified
 * record reads, and the units (packs) compaction works on.  Span reads
 * (read-ahead) are in pack_span.c.
 */
#define CKPT_PACK_BACKEND_PRIVATE
#include "chunk/pack_backend.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PB(cb) ((struct pack_be *)(cb))

/* Caller holds b->lock. */
static ckpt_pack *find_pack_locked(struct pack_be *b, uint64_t id)
{
	for (size_t i = 0; i < b->npacks; i++)
		if (ckpt_pack_id(b->packs[i]) == id)
			return b->packs[i];
	return NULL;
}

static int add_pack_locked(struct pack_be *b, ckpt_pack *p)
{
	if (b->npacks == b->cap_packs) {
		size_t cap = b->cap_packs ? b->cap_packs * 2 : 16;
		ckpt_pack **v = realloc(b->packs, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		b->packs = v;
		b->cap_packs = cap;
	}
	b->packs[b->npacks++] = p;
	return 0;
}

/* Pack id, opened read-only on first use.  The object stays valid while the
 * caller holds b->rw (read) or is the only one who may reclaim it. */
int pb_get_pack(struct pack_be *b, uint64_t id, ckpt_pack **ret)
{
	ckpt_pack *p;
	int r = 0;

	pthread_mutex_lock(&b->lock);
	p = find_pack_locked(b, id);
	if (!p) {
		r = ckpt_pack_open(b->dirfd, id, b->uuid, false, &p);
		if (r == 0) {
			r = add_pack_locked(b, p);
			if (r < 0)
				ckpt_pack_free(p);
		} else {
			ckpt_err("%s: cannot open pack %" PRIu64 ": %s", b->path, id, strerror(-r));
		}
	}
	pthread_mutex_unlock(&b->lock);
	if (r == 0)
		*ret = p;
	return r;
}

/* Create and register a new pack.  Caller holds b->lock. */
static int new_pack_locked(struct pack_be *b, ckpt_pack **ret)
{
	ckpt_pack *p = NULL;
	uint64_t id;
	int r = b->next_id(b->ud, &id);

	if (r < 0)
		return r;
	r = ckpt_pack_create(b->dirfd, id, b->uuid, &p);
	if (r < 0) {
		ckpt_err("%s: cannot create pack %" PRIu64 ": %s", b->path, id, strerror(-r));
		return r;
	}
	r = add_pack_locked(b, p);
	if (r < 0) {
		ckpt_pack_free(p);
		return r;
	}
	*ret = p;
	return 0;
}

static int pb_put(ckpt_chunk_backend *cb, const struct ckpt_chunk_rec *rec,
		  const struct iovec *iov, int cnt, enum ckpt_chunk_class cls,
		  struct ckpt_chunk_loc *ret_loc)
{
	struct pack_be *b = PB(cb);
	ckpt_pack **target = cls == CKPT_CHUNK_FRESH ? &b->wpack : &b->bgpack;
	struct ckpt_pack_rec pr;
	uint64_t offset;
	ckpt_pack *p;
	int r = 0;

	if (!b->writable)
		return -EROFS;
	pthread_mutex_lock(&b->lock);
	if (!*target || ckpt_pack_size(*target) >= b->unit_max)
		r = new_pack_locked(b, target);
	p = *target;
	pthread_mutex_unlock(&b->lock);
	if (r < 0)
		return r;
	/* the pack stays: an append target is never reclaimed (seal first) */
	pr.codec = rec->codec;
	pr.stored_len = rec->stored_len;
	pr.raw_len = rec->raw_len;
	memcpy(pr.digest, rec->digest, sizeof(pr.digest));
	r = ckpt_pack_appendv(p, &pr, iov, cnt, &offset);
	if (r < 0)
		return r;
	memset(ret_loc, 0, sizeof(*ret_loc));
	ckpt_pack_loc_set(ret_loc, ckpt_pack_id(p), offset);
	ret_loc->stored_len = rec->stored_len;
	ret_loc->raw_len = rec->raw_len;
	ret_loc->codec = rec->codec;
	return 0;
}

static int sync_pack(struct pack_be *b, uint64_t id, uint64_t end)
{
	ckpt_pack *p;
	int r = pb_get_pack(b, id, &p);

	return r < 0 ? r : ckpt_pack_sync(p, end);
}

/* One fdatasync per pack, up to the last record given in it. */
static int pb_sync(ckpt_chunk_backend *cb, const struct ckpt_chunk_loc *locs, size_t n)
{
	struct pack_be *b = PB(cb);
	struct {
		uint64_t id, end;
	} need[8];
	size_t nneed = 0;
	int r;

	for (size_t i = 0; i < n; i++) {
		uint64_t id = ckpt_pack_loc_id(&locs[i]);
		uint64_t end = ckpt_pack_loc_offset(&locs[i]) + ckpt_pack_rec_span(locs[i].stored_len);
		size_t j;

		for (j = 0; j < nneed; j++)
			if (need[j].id == id)
				break;
		if (j == nneed) {
			if (nneed == CKPT_ARRAY_SIZE(need)) {
				/* records in many packs: sync those so far */
				for (size_t k = 0; k < nneed; k++)
					if ((r = sync_pack(b, need[k].id, need[k].end)) < 0)
						return r;
				nneed = 0;
				j = 0;
			}
			need[j].id = id;
			need[j].end = 0;
			nneed++;
		}
		if (end > need[j].end)
			need[j].end = end;
	}
	for (size_t k = 0; k < nneed; k++)
		if ((r = sync_pack(b, need[k].id, need[k].end)) < 0)
			return r;
	return 0;
}

static int pb_sync_all(ckpt_chunk_backend *cb)
{
	struct pack_be *b = PB(cb);
	int r = 0;

	pthread_mutex_lock(&b->lock);
	for (size_t i = 0; i < b->npacks; i++) {
		int e = ckpt_pack_sync(b->packs[i], UINT64_MAX);

		if (e < 0 && r == 0)
			r = e;
	}
	pthread_mutex_unlock(&b->lock);
	return r;
}

static size_t pb_get_len(ckpt_chunk_backend *cb, const struct ckpt_chunk_loc *loc)
{
	(void)cb;
	return ckpt_pack_direct_len(ckpt_pack_loc_offset(loc), loc->stored_len);
}

static size_t pb_get_len_max(ckpt_chunk_backend *cb, uint32_t stored_len)
{
	(void)cb;
	return ckpt_pack_direct_len(CKPT_PACK_DIRECT_ALIGN - 1, stored_len);
}

/* O_DIRECT: no copy out of the page cache, and packs do not fill it with
 * what the chunk cache and the mount's page cache hold decoded anyway. */
static int pb_get(ckpt_chunk_backend *cb, const struct ckpt_chunk_loc *loc, bool check_data,
		  uint8_t *buf, size_t cap, struct ckpt_chunk_rec *ret_rec,
		  const uint8_t **ret_stored, const char **ret_why)
{
	struct pack_be *b = PB(cb);
	uint64_t offset = ckpt_pack_loc_offset(loc);
	struct ckpt_pack_rec rec;
	ckpt_pack *p;
	int r;

	pthread_rwlock_rdlock(&b->rw);
	r = pb_get_pack(b, ckpt_pack_loc_id(loc), &p);
	if (r == 0) {
		r = ckpt_pack_read_direct(p, offset, loc->stored_len, check_data, buf, cap, &rec,
					  ret_stored);
		if (r == -EOPNOTSUPP) {
			/* no O_DIRECT here (tmpfs): through the page cache, into
			 * the same buffer (it holds at least the stored bytes) */
			if (check_data)
				r = ckpt_pack_read(p, offset, loc->stored_len, &rec, buf);
			else
				r = ckpt_pack_read_trusting(p, offset, loc->stored_len, &rec, buf);
			*ret_stored = buf;
		}
	}
	pthread_rwlock_unlock(&b->rw);
	if (r == -ENOENT) {
		*ret_why = "pack file missing";
		return -EIO;
	}
	if (r == -EPROTONOSUPPORT) {
		/* A version this build does not know in the header of a pack of
		 * this store: a damaged header (pack.h), so EIO as for any damage
		 * (the open's message names the version). */
		*ret_why = "pack header: unsupported format version (damaged?)";
		return -EIO;
	}
	if (r < 0) {
		*ret_why = "record header or stored-bytes checksum mismatch";
		return r;
	}
	pb_rec_from_pack(ret_rec, &rec);
	return 0;
}

static uint64_t pb_unit_of(ckpt_chunk_backend *cb, const struct ckpt_chunk_loc *loc)
{
	(void)cb;
	return ckpt_pack_loc_id(loc);
}

static uint64_t pb_rec_bytes(ckpt_chunk_backend *cb, const struct ckpt_chunk_loc *loc)
{
	(void)cb;
	return ckpt_pack_rec_span(loc->stored_len);
}

static int unit_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct ckpt_chunk_unit *)a)->id, y = ((const struct ckpt_chunk_unit *)b)->id;

	return x < y ? -1 : x > y;
}

static int pb_units(ckpt_chunk_backend *cb, struct ckpt_chunk_unit **ret, size_t *ret_n)
{
	struct pack_be *b = PB(cb);
	struct ckpt_chunk_unit *v = NULL;
	size_t n = 0, cap = 0;
	uint64_t wid = 0, bid = 0;
	struct dirent *de;
	DIR *d;
	int r = ckpt_opendir_dup(b->dirfd, &d);

	if (r < 0)
		return r;
	pthread_mutex_lock(&b->lock);
	wid = ckpt_pack_id(b->wpack); /* 0 (never a pack id) for none */
	bid = ckpt_pack_id(b->bgpack);
	pthread_mutex_unlock(&b->lock);
	while ((de = readdir(d))) {
		uint64_t id;
		char tail[8];
		struct stat st;

		if (sscanf(de->d_name, "pack-%16" SCNx64 ".%7s", &id, tail) != 2 ||
		    strcmp(tail, "ckpk") != 0)
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 16;
			struct ckpt_chunk_unit *nv = realloc(v, nc * sizeof(*nv));

			if (!nv) {
				closedir(d);
				free(v);
				return -ENOMEM;
			}
			v = nv;
			cap = nc;
		}
		memset(&v[n], 0, sizeof(v[n]));
		v[n].id = id;
		v[n].active = id == wid || id == bid;
		if (fstatat(b->dirfd, de->d_name, &st, 0) == 0) {
			v[n].bytes = (uint64_t)st.st_size;
			v[n].payload = v[n].bytes > CKPT_PACK_HDR_SIZE ? v[n].bytes - CKPT_PACK_HDR_SIZE : 0;
		}
		n++;
	}
	closedir(d);
	if (n)
		qsort(v, n, sizeof(*v), unit_cmp);
	*ret = v;
	*ret_n = n;
	return 0;
}

static int pb_seal(ckpt_chunk_backend *cb, uint64_t id)
{
	struct pack_be *b = PB(cb);

	pthread_mutex_lock(&b->lock);
	/* the next put of its class starts a new pack */
	if (b->wpack && ckpt_pack_id(b->wpack) == id)
		b->wpack = NULL;
	if (b->bgpack && ckpt_pack_id(b->bgpack) == id)
		b->bgpack = NULL;
	pthread_mutex_unlock(&b->lock);
	return 0;
}

static int pb_reclaim(ckpt_chunk_backend *cb, uint64_t id)
{
	struct pack_be *b = PB(cb);
	char name[CKPT_PACK_NAME_MAX];

	if (!b->writable)
		return -EROFS;
	ckpt_pack_name(id, name, sizeof(name));
	if (unlinkat(b->dirfd, name, 0) < 0)
		return -errno;
	(void)fsync(b->dirfd);
	/* release the file's space now: no reader uses the object once rw is
	 * held for writing */
	pthread_rwlock_wrlock(&b->rw);
	pthread_mutex_lock(&b->lock);
	for (size_t i = 0; i < b->npacks; i++) {
		if (ckpt_pack_id(b->packs[i]) == id) {
			if (b->packs[i] == b->wpack)
				b->wpack = NULL;
			if (b->packs[i] == b->bgpack)
				b->bgpack = NULL;
			ckpt_pack_free(b->packs[i]);
			b->packs[i] = b->packs[--b->npacks];
			break;
		}
	}
	pthread_mutex_unlock(&b->lock);
	pthread_rwlock_unlock(&b->rw);
	return 0;
}

struct scan_ctx {
	uint64_t id;
	int (*cb)(void *ud, const struct ckpt_chunk_loc *loc, const struct ckpt_chunk_rec *rec);
	void *ud;
};

static int scan_one(void *ud, uint64_t offset, const struct ckpt_pack_rec *pr)
{
	struct scan_ctx *c = ud;
	struct ckpt_chunk_loc loc;
	struct ckpt_chunk_rec rec;

	pb_rec_from_pack(&rec, pr);
	memset(&loc, 0, sizeof(loc));
	ckpt_pack_loc_set(&loc, c->id, offset);
	loc.stored_len = rec.stored_len;
	loc.raw_len = rec.raw_len;
	loc.codec = rec.codec;
	return c->cb(c->ud, &loc, &rec);
}

static int pb_scan(ckpt_chunk_backend *cb, uint64_t id,
		   int (*fn)(void *ud, const struct ckpt_chunk_loc *loc,
			     const struct ckpt_chunk_rec *rec),
		   void *ud)
{
	struct pack_be *b = PB(cb);
	struct scan_ctx c = { id, fn, ud };
	ckpt_pack *p;
	int r;

	pthread_rwlock_rdlock(&b->rw);
	r = pb_get_pack(b, id, &p);
	if (r == 0)
		r = ckpt_pack_scan(p, scan_one, &c);
	pthread_rwlock_unlock(&b->rw);
	return r;
}

static int pb_statfs(ckpt_chunk_backend *cb, struct statvfs *ret)
{
	return fstatvfs(PB(cb)->dirfd, ret) < 0 ? -errno : 0;
}

static void pb_stats(ckpt_chunk_backend *cb, struct ckpt_chunk_backend_stats *ret)
{
	struct pack_be *b = PB(cb);

	ret->span_async = __atomic_load_n(&b->span_async, __ATOMIC_RELAXED);
	ret->span_sync = __atomic_load_n(&b->span_sync, __ATOMIC_RELAXED);
	ret->span_failed = __atomic_load_n(&b->span_failed, __ATOMIC_RELAXED);
}

static void pb_describe(ckpt_chunk_backend *cb, const struct ckpt_chunk_loc *loc, char *buf,
			size_t len)
{
	(void)cb;
	snprintf(buf, len, "pack %" PRIu64 ", offset %" PRIu64, ckpt_pack_loc_id(loc),
		 ckpt_pack_loc_offset(loc));
}

static void pb_free(ckpt_chunk_backend *cb)
{
	struct pack_be *b = PB(cb);

	if (!b)
		return;
	for (size_t i = 0; i < b->npacks; i++)
		ckpt_pack_free(b->packs[i]);
	free(b->packs);
	/* the calling thread's span state; other threads' went with them */
	pb_tls_free(pthread_getspecific(b->tls_key));
	pthread_setspecific(b->tls_key, NULL);
	pthread_key_delete(b->tls_key);
	if (b->dirfd >= 0)
		close(b->dirfd);
	pthread_rwlock_destroy(&b->rw);
	pthread_mutex_destroy(&b->lock);
	free(b->path);
	free(b);
}

static int pb_open(const struct ckpt_chunk_backend_conf *conf, ckpt_chunk_backend **ret,
		   char *err, size_t errlen)
{
	struct pack_be *b = calloc(1, sizeof(*b));
	int r;

	if (!b || !(b->path = strdup(conf->store_path))) {
		free(b);
		return -ENOMEM;
	}
	b->base.ops = &ckpt_pack_backend_ops;
	memcpy(b->uuid, conf->uuid, sizeof(b->uuid));
	b->writable = conf->writable;
	b->sync_readahead = conf->sync_readahead;
	b->unit_max = conf->unit_max;
	b->next_id = conf->next_id;
	b->ud = conf->ud;
	b->dirfd = -1;
	pthread_rwlock_init(&b->rw, NULL);
	pthread_mutex_init(&b->lock, NULL);
	r = -pthread_key_create(&b->tls_key, pb_tls_free);
	if (r < 0) {
		snprintf(err, errlen, "%s: %s", conf->store_path, strerror(-r));
		b->tls_key = 0;
		free(b->path);
		free(b);
		return r;
	}
	if (conf->create && mkdirat(conf->store_fd, "packs", 0700) < 0 && errno != EEXIST) {
		r = -errno;
		snprintf(err, errlen, "%s: cannot create store layout: %s", conf->store_path,
			 strerror(errno));
		goto fail;
	}
	b->dirfd = openat(conf->store_fd, "packs", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (b->dirfd < 0) {
		r = -errno;
		snprintf(err, errlen, "%s: missing packs directory: %s", conf->store_path,
			 strerror(errno));
		goto fail;
	}
	*ret = &b->base;
	return 0;
fail:
	pb_free(&b->base);
	return r;
}

const struct ckpt_chunk_backend_ops ckpt_pack_backend_ops = {
	.name = "pack",
	.open = pb_open,
	.free = pb_free,
	.put = pb_put,
	.sync = pb_sync,
	.sync_all = pb_sync_all,
	.get_len = pb_get_len,
	.get_len_max = pb_get_len_max,
	.get = pb_get,
	.span_begin = pb_span_begin,
	.span_wait = pb_span_wait,
	.span_end = pb_span_end,
	.span_warm = pb_span_warm,
	.unit_of = pb_unit_of,
	.rec_bytes = pb_rec_bytes,
	.units = pb_units,
	.seal = pb_seal,
	.reclaim = pb_reclaim,
	.scan = pb_scan,
	.statfs = pb_statfs,
	.stats = pb_stats,
	.describe = pb_describe,
};
