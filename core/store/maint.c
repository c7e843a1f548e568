/* SPDX-License-Identifier: MIT */
/*
 * maint.c - stats, fsck and gc.
 */
#include "store/store_int.h"

static int chunk_info_cmp(const void *a, const void *b)
{
	return memcmp(((const struct chunk_info *)a)->d.bytes, ((const struct chunk_info *)b)->d.bytes,
		      CKPT_DIGEST_LEN);
}

int st_load_chunks(ckpt_store *s, struct chunk_info **ret, size_t *ret_n)
{
	uint8_t prefix[1] = { CKPT_KEY_CHUNK };
	const uint8_t *k, *v;
	size_t kl, vl, n = 0, cap = 0;
	struct chunk_info *arr = NULL;
	ckpt_scan *it;
	int r = ckpt_scan_new(s->eng, NULL, prefix, 1, NULL, 0, &it);

	if (r < 0)
		return r;
	while ((r = ckpt_scan_next(it, &k, &kl, &v, &vl)) > 0) {
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 1024;
			struct chunk_info *na = realloc(arr, nc * sizeof(*na));
			if (!na) {
				r = -ENOMEM;
				break;
			}
			arr = na;
			cap = nc;
		}
		memset(&arr[n], 0, sizeof(arr[n]));
		if (kl != 1 + CKPT_DIGEST_LEN ||
		    ckpt_chunk_rec_decode(v, vl, &arr[n].loc, &arr[n].refs) < 0) {
			r = -EIO;
			break;
		}
		memcpy(arr[n].d.bytes, k + 1, CKPT_DIGEST_LEN);
		n++;
	}
	ckpt_scan_free(it);
	if (r < 0) {
		free(arr);
		return r;
	}
	*ret = arr; /* already sorted: keys are 'C' + digest */
	*ret_n = n;
	return 0;
}

static struct chunk_info *find_chunk(struct chunk_info *arr, size_t n, const ckpt_digest *d)
{
	struct chunk_info key;

	key.d = *d;
	/* arr is NULL in a store without chunks: bsearch must not get it */
	return n ? bsearch(&key, arr, n, sizeof(*arr), chunk_info_cmp) : NULL;
}

/* The backend's units: how many, and their bytes. */
static int units_size(ckpt_store *s, uint64_t *ret_n, uint64_t *ret_bytes, uint64_t *ret_payload)
{
	struct ckpt_chunk_unit *u;
	size_t n;
	int r = ckpt_cb_units(s->cb, &u, &n);

	if (r < 0)
		return r;
	*ret_n = n;
	*ret_bytes = 0;
	if (ret_payload)
		*ret_payload = 0;
	for (size_t i = 0; i < n; i++) {
		*ret_bytes += u[i].bytes;
		if (ret_payload)
			*ret_payload += u[i].payload;
	}
	free(u);
	return 0;
}

int ckpt_store_stats(ckpt_store *s, struct ckpt_store_stats *ret)
{
	uint8_t prefix[1] = { CKPT_KEY_INODE };
	const uint8_t *k, *v;
	size_t kl, vl, n;
	struct chunk_info *arr = NULL;
	uint64_t indexed = 0, payload = 0;
	ckpt_scan *it;
	int r;

	memset(ret, 0, sizeof(*ret));
	r = ckpt_scan_new(s->eng, NULL, prefix, 1, NULL, 0, &it);
	if (r < 0)
		return r;
	while ((r = ckpt_scan_next(it, &k, &kl, &v, &vl)) > 0) {
		struct ckpt_inode in;
		if (kl != 9 || ckpt_inode_decode(ckpt_get_be64(k + 1), v, vl, &in) < 0) {
			r = -EIO;
			break;
		}
		if (in.nlink == 0)
			continue;
		if (S_ISREG(in.mode)) {
			ret->files++;
			ret->logical_bytes += in.size;
		} else if (S_ISDIR(in.mode)) {
			ret->dirs++;
		} else if (S_ISLNK(in.mode)) {
			ret->symlinks++;
		}
	}
	ckpt_scan_free(it);
	if (r < 0)
		return r;
	r = st_load_chunks(s, &arr, &n);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n; i++) {
		indexed += ckpt_cb_rec_bytes(s->cb, &arr[i].loc);
		if (arr[i].loc.flags & CKPT_CHUNK_F_DEFERRED)
			ret->deferred_chunks++;
		if (arr[i].refs > 0) {
			ret->chunks++;
			ret->unique_bytes += arr[i].loc.raw_len;
			ret->stored_bytes += arr[i].loc.stored_len;
		} else {
			ret->dead_chunks++;
			ret->dead_bytes += arr[i].loc.stored_len;
		}
	}
	free(arr);
	r = units_size(s, &ret->pack_files, &ret->pack_bytes, &payload);
	if (r < 0)
		return r;
	/* records no index entry names: content of files deleted before it was
	 * indexed, writes abandoned by a crash, failed appends */
	ret->unindexed_bytes = payload > indexed ? payload - indexed : 0;
	return 0;
}

static int name_ent_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct name_ent *)a)->ino, y = ((const struct name_ent *)b)->ino;

	return x < y ? -1 : x > y;
}

int st_load_names(ckpt_store *s, struct name_ent **ret, size_t *ret_n)
{
	uint8_t prefix[1] = { CKPT_KEY_DENTRY };
	const uint8_t *k, *v;
	size_t kl, vl, n = 0, cap = 0;
	struct name_ent *arr = NULL;
	ckpt_scan *it;
	int r = ckpt_scan_new(s->eng, NULL, prefix, 1, NULL, 0, &it);

	if (r < 0)
		return r;
	while ((r = ckpt_scan_next(it, &k, &kl, &v, &vl)) > 0) {
		uint32_t mode;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 1024;
			struct name_ent *na = realloc(arr, nc * sizeof(*na));
			if (!na) {
				r = -ENOMEM;
				break;
			}
			arr = na;
			cap = nc;
		}
		if (kl < 10 || ckpt_dentry_decode(v, vl, &arr[n].ino, &mode) < 0) {
			r = -EIO;
			break;
		}
		arr[n].parent = ckpt_get_be64(k + 1);
		arr[n].name = strndup((const char *)k + 9, kl - 9);
		if (!arr[n].name) {
			r = -ENOMEM;
			break;
		}
		n++;
	}
	ckpt_scan_free(it);
	if (r < 0) {
		for (size_t i = 0; i < n; i++)
			free(arr[i].name);
		free(arr);
		return r;
	}
	if (n > 1) /* arr is NULL when the store has no names: qsort must not get it */
		qsort(arr, n, sizeof(*arr), name_ent_cmp);
	*ret = arr;
	*ret_n = n;
	return 0;
}

char *st_name_path(struct name_ent *names, size_t n, uint64_t ino)
{
	char *path = strdup(""), *np;

	for (int depth = 0; path && ino != CKPT_ROOT_INO && depth < 4096; depth++) {
		struct name_ent key = { .ino = ino }, *e;

		e = n ? bsearch(&key, names, n, sizeof(*names), name_ent_cmp) : NULL;
		if (!e) {
			if (asprintf(&np, "<inode %" PRIu64 ">%s", ino, path) < 0)
				np = NULL;
			free(path);
			return np;
		}
		if (asprintf(&np, "/%s%s", e->name ? e->name : "?", path) < 0)
			np = NULL;
		free(path);
		path = np;
		ino = e->parent;
	}
	if (path && !*path) {
		free(path);
		path = strdup("/");
	}
	return path;
}

int ckpt_store_fsck(ckpt_store *s, void (*cb)(void *ud, const char *path, const char *what),
		    void *ud)
{
	uint8_t prefix[1] = { CKPT_KEY_FILE };
	const uint8_t *k, *v;
	size_t kl, vl, nchunks = 0, nnames = 0;
	struct chunk_info *chunks = NULL;
	struct name_ent *names = NULL;
	uint8_t *buf = NULL;
	ckpt_scan *it = NULL;
	char msg[512];
	uint64_t done = 0, total = 0;
	int problems = 0, r;

	r = st_load_chunks(s, &chunks, &nchunks);
	if (r < 0)
		goto out;
	r = st_load_names(s, &names, &nnames);
	if (r < 0)
		goto out;
	buf = malloc(CKPT_CHUNK_MAX);
	if (!buf) {
		r = -ENOMEM;
		goto out;
	}
	/* 1. every indexed chunk reads back and matches its digest */
	for (size_t i = 0; i < nchunks; i++)
		total += chunks[i].loc.stored_len;
	ckpt_progress_report(s->progress, 0, total);
	for (size_t i = 0; i < nchunks; i++) {
		done += chunks[i].loc.stored_len;
		if (chunks[i].loc.raw_len > CKPT_CHUNK_MAX ||
		    st_verify_chunk(s, &chunks[i].d, &chunks[i].loc, buf, true) < 0) {
			char hex[33], at[CKPT_CHUNK_DESC_MAX];
			chunks[i].damaged = true;
			ckpt_digest_to_hex(&chunks[i].d, hex);
			ckpt_cb_describe(s->cb, &chunks[i].loc, at, sizeof(at));
			snprintf(msg, sizeof(msg), "chunk %s (%s) is damaged", hex, at);
			cb(ud, NULL, msg);
			problems++;
		}
		ckpt_progress_report(s->progress, done, total);
	}
	/* 2. every file's extents name known, intact chunks; count references */
	r = ckpt_scan_new(s->eng, NULL, prefix, 1, NULL, 0, &it);
	if (r < 0)
		goto out;
	while ((r = ckpt_scan_next(it, &k, &kl, &v, &vl)) > 0) {
		struct ckpt_extent_list *l = NULL;
		uint64_t ino = kl == 9 ? ckpt_get_be64(k + 1) : 0;
		char *path = st_name_path(names, nnames, ino);
		struct ckpt_inode in;

		if (ckpt_extent_list_decode(v, vl, &l) < 0) {
			cb(ud, path, "extent list is damaged");
			problems++;
			free(path);
			continue;
		}
		if (ckpt_meta_get_inode(s->eng, NULL, ino, &in) < 0) {
			cb(ud, path, "extent list without inode");
			problems++;
		} else if (in.size != l->size) {
			snprintf(msg, sizeof(msg), "size %" PRIu64 " but extents cover %" PRIu64,
				 in.size, l->size);
			cb(ud, path, msg);
			problems++;
		}
		for (size_t i = 0; i < l->n; i++) {
			struct chunk_info *c;
			if (l->v[i].kind != CKPT_EXT_CHUNK)
				continue;
			c = find_chunk(chunks, nchunks, &l->v[i].digest);
			if (!c) {
				snprintf(msg, sizeof(msg), "offset %" PRIu64 ": chunk missing from index",
					 l->v[i].off);
				cb(ud, path, msg);
				problems++;
				continue;
			}
			c->counted++;
			if (c->damaged) {
				snprintf(msg, sizeof(msg),
					 "damaged data at offset %" PRIu64 " (%" PRIu32 " bytes)",
					 l->v[i].off, l->v[i].len);
				cb(ud, path, msg);
				problems++;
			} else if (l->v[i].len > c->loc.raw_len) {
				snprintf(msg, sizeof(msg), "offset %" PRIu64 ": extent longer than chunk",
					 l->v[i].off);
				cb(ud, path, msg);
				problems++;
			}
		}
		ckpt_extent_list_free(l);
		free(path);
	}
	ckpt_scan_free(it);
	it = NULL;
	if (r < 0)
		goto out;
	/* 3. stored reference counts match */
	for (size_t i = 0; i < nchunks; i++) {
		if (chunks[i].refs != chunks[i].counted) {
			char hex[33];
			ckpt_digest_to_hex(&chunks[i].d, hex);
			snprintf(msg, sizeof(msg),
				 "chunk %s: refcount %" PRIu64 " but %" PRIu64 " references", hex,
				 chunks[i].refs, chunks[i].counted);
			cb(ud, NULL, msg);
			problems++;
		}
	}
	/* 4. every name points at a live inode */
	for (size_t i = 0; i < nnames; i++) {
		struct ckpt_inode in;
		if (ckpt_meta_get_inode(s->eng, NULL, names[i].ino, &in) < 0 || in.nlink == 0) {
			char *path = st_name_path(names, nnames, names[i].ino);
			cb(ud, path, "directory entry points at a missing inode");
			problems++;
			free(path);
		}
	}
	/* 5. the metadata log restores whole */
	if (ckpt_engine_log_dir(s->eng)) {
		struct ckpt_mlog_report rep;
		const char *ld = ckpt_engine_log_dir(s->eng);

		r = ckpt_mlog_verify(ld, &rep);
		if (r < 0) {
			snprintf(msg, sizeof(msg), "metadata log %s cannot be read: %s", ld,
				 strerror(-r));
			cb(ud, NULL, msg);
			problems++;
		} else if (!rep.complete) {
			char lmsg[sizeof(rep.problem) + 64];
			snprintf(lmsg, sizeof(lmsg), "metadata log: %s (`ckpt repair` takes a new "
				 "snapshot)", rep.problem);
			cb(ud, NULL, lmsg);
			problems++;
		}
	}
	r = problems;
out:
	ckpt_scan_free(it);
	for (size_t i = 0; i < nnames; i++)
		free(names[i].name);
	free(names);
	free(chunks);
	free(buf);
	return r;
}

struct drop_arg {
	struct chunk_info *chunks;
	size_t n;
	struct ckpt_gc_stats *st;
};

/* Delete the chunk records that no file references: those with refcount 0
 * when read again in t (a commit since st_load_chunks may have taken one). */
static int drop_unreferenced(ckpt_store *s, ckpt_txn *t, void *arg)
{
	struct drop_arg *a = arg;

	ckpt_txn_releases_space(t); /* works on a full disk (meta/engine.h) */
	a->st->chunks_dropped = a->st->bytes_dropped = 0;
	for (size_t i = 0; i < a->n; i++) {
		struct chunk_info *c = &a->chunks[i];
		uint8_t key[32];
		int r;

		if (c->refs != 0)
			continue;
		r = ckpt_meta_get_chunk(s->eng, t, &c->d, &c->loc, &c->refs);
		if (r == -ENOENT)
			continue;
		if (r < 0)
			return r;
		if (c->refs != 0)
			continue;
		ckpt_txn_delete(t, key, ckpt_key_chunk(key, &c->d));
		if (s->cenv.zero_marks)
			ckpt_txn_delete(t, key, ckpt_key_zero(key, &c->d));
		a->st->chunks_dropped++;
		a->st->bytes_dropped += c->loc.stored_len;
	}
	return 0;
}

/* STORE/gc.lock, taken exclusively for a gc of a shared store. */
static int gc_lock(ckpt_store *s)
{
	char *p = NULL;
	int fd = -1;

	if (asprintf(&p, "%s/gc.lock", s->path) < 0)
		return -ENOMEM;
	fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0) {
		fd = -errno;
	} else if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		int e = errno;
		close(fd);
		fd = e == EWOULDBLOCK ? -EBUSY : -e;
		if (fd == -EBUSY)
			ckpt_err("%s: another gc runs on this store", s->path);
	}
	free(p);
	return fd;
}

int ckpt_store_gc(ckpt_store *s, struct ckpt_gc_stats *ret)
{
	struct st_compact_stats cs = { 0 };
	struct chunk_info *chunks = NULL;
	size_t nchunks = 0;
	int gc_fd = -1;
	uint64_t n;
	int r;

	memset(ret, 0, sizeof(*ret));
	if (s->opts.mode != CKPT_STORE_RW || s->opts.node)
		return -EROFS;
	/* closed files first: their chunks are pending and pin their units */
	r = ckpt_store_flush(s);
	if (r == 0)
		r = units_size(s, &n, &ret->bytes_before, NULL);
	if (r == 0 && s->opts.meta_where) {
		bool offline_ok = false;

		/* one gc at a time on a shared store (the daemons do not take it) */
		if (gc_fd < 0) {
			gc_fd = gc_lock(s);
			if (gc_fd < 0) {
				r = gc_fd;
				goto out;
			}
		}
		r = st_gc_shared(s, ret, &offline_ok);
		if (r == 0 && !offline_ok) {
			ret->online = true;
			r = units_size(s, &n, &ret->bytes_after, NULL);
			goto out;
		}
	}
	if (r == 0)
		r = st_load_chunks(s, &chunks, &nchunks);
	if (r < 0)
		goto out;
	/* 1. drop index entries of unreferenced chunks */
	{
		struct drop_arg a = { chunks, nchunks, ret };
		uint64_t online_chunks = ret->chunks_dropped, online_bytes = ret->bytes_dropped;

		pthread_mutex_lock(&s->ns_lock);
		r = st_txn_run(s, drop_unreferenced, &a, true);
		pthread_mutex_unlock(&s->ns_lock);
		if (r < 0)
			goto out;
		ret->chunks_dropped += online_chunks;
		ret->bytes_dropped += online_bytes;
	}
	/* 2. the units that are now mostly dead: rewritten or deleted */
	r = st_compact(s, SIZE_MAX, false, &cs);
	if (r < 0)
		goto out;
	ret->packs_rewritten = cs.units_rewritten;
	ret->packs_deleted += cs.units_deleted;
	r = units_size(s, &n, &ret->bytes_after, NULL);
out:
	if (gc_fd >= 0)
		close(gc_fd);
	free(chunks);
	return r;
}
