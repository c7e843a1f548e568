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
	ckpt_iter *it;
	int r = ckpt_iter_new(s->ix, prefix, 1, &it);

	if (r < 0)
		return r;
	while ((r = ckpt_iter_next(it, &k, &kl, &v, &vl)) > 0) {
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
	ckpt_iter_free(it);
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
	return bsearch(&key, arr, n, sizeof(*arr), chunk_info_cmp);
}

int st_list_packs(ckpt_store *s, uint64_t **ret_ids, size_t *ret_n, uint64_t *ret_bytes)
{
	int fd = dup(s->packs_fd);
	DIR *d;
	struct dirent *de;
	uint64_t *ids = NULL, bytes = 0;
	size_t n = 0, cap = 0;

	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	rewinddir(d);
	while ((de = readdir(d))) {
		uint64_t id;
		char tail[8];
		struct stat st;

		if (sscanf(de->d_name, "pack-%16" SCNx64 ".%7s", &id, tail) != 2 ||
		    strcmp(tail, "ckpk") != 0)
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 16;
			uint64_t *ni = realloc(ids, nc * sizeof(*ni));
			if (!ni) {
				closedir(d);
				free(ids);
				return -ENOMEM;
			}
			ids = ni;
			cap = nc;
		}
		ids[n++] = id;
		if (fstatat(s->packs_fd, de->d_name, &st, 0) == 0)
			bytes += (uint64_t)st.st_size;
	}
	closedir(d);
	*ret_ids = ids;
	*ret_n = n;
	if (ret_bytes)
		*ret_bytes = bytes;
	return 0;
}

int ckpt_store_stats(ckpt_store *s, struct ckpt_store_stats *ret)
{
	uint8_t prefix[1] = { CKPT_KEY_INODE };
	const uint8_t *k, *v;
	size_t kl, vl, n;
	struct chunk_info *arr = NULL;
	uint64_t *ids = NULL, indexed = 0;
	ckpt_iter *it;
	int r;

	memset(ret, 0, sizeof(*ret));
	r = ckpt_iter_new(s->ix, prefix, 1, &it);
	if (r < 0)
		return r;
	while ((r = ckpt_iter_next(it, &k, &kl, &v, &vl)) > 0) {
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
	ckpt_iter_free(it);
	if (r < 0)
		return r;
	r = st_load_chunks(s, &arr, &n);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n; i++) {
		indexed += ckpt_pack_rec_span(arr[i].loc.stored_len);
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
	r = st_list_packs(s, &ids, &n, &ret->pack_bytes);
	if (r < 0)
		return r;
	ret->pack_files = n;
	indexed += n * CKPT_PACK_HDR_SIZE;
	/* records no index entry names: content of files deleted before it was
	 * indexed, writes abandoned by a crash, failed appends */
	ret->unindexed_bytes = ret->pack_bytes > indexed ? ret->pack_bytes - indexed : 0;
	free(ids);
	return 0;
}

/* ino -> (parent, name) from every dentry, for naming files in reports. */
struct name_ent {
	uint64_t ino, parent;
	char *name;
};

static int name_ent_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct name_ent *)a)->ino, y = ((const struct name_ent *)b)->ino;

	return x < y ? -1 : x > y;
}

static int load_names(ckpt_store *s, struct name_ent **ret, size_t *ret_n)
{
	uint8_t prefix[1] = { CKPT_KEY_DENTRY };
	const uint8_t *k, *v;
	size_t kl, vl, n = 0, cap = 0;
	struct name_ent *arr = NULL;
	ckpt_iter *it;
	int r = ckpt_iter_new(s->ix, prefix, 1, &it);

	if (r < 0)
		return r;
	while ((r = ckpt_iter_next(it, &k, &kl, &v, &vl)) > 0) {
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
		n++;
	}
	ckpt_iter_free(it);
	if (r < 0) {
		for (size_t i = 0; i < n; i++)
			free(arr[i].name);
		free(arr);
		return r;
	}
	qsort(arr, n, sizeof(*arr), name_ent_cmp);
	*ret = arr;
	*ret_n = n;
	return 0;
}

static char *name_path(struct name_ent *names, size_t n, uint64_t ino)
{
	char *path = strdup(""), *np;

	for (int depth = 0; path && ino != CKPT_ROOT_INO && depth < 4096; depth++) {
		struct name_ent key = { .ino = ino }, *e;

		e = bsearch(&key, names, n, sizeof(*names), name_ent_cmp);
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
	ckpt_iter *it = NULL;
	char msg[512];
	int problems = 0, r;

	r = st_load_chunks(s, &chunks, &nchunks);
	if (r < 0)
		goto out;
	r = load_names(s, &names, &nnames);
	if (r < 0)
		goto out;
	buf = malloc(CKPT_CHUNK_MAX);
	if (!buf) {
		r = -ENOMEM;
		goto out;
	}
	/* 1. every indexed chunk reads back and matches its digest */
	for (size_t i = 0; i < nchunks; i++) {
		if (chunks[i].loc.raw_len > CKPT_CHUNK_MAX ||
		    ckpt_store_verify_chunk(s, &chunks[i].d, &chunks[i].loc, buf) < 0) {
			char hex[33];
			chunks[i].damaged = true;
			ckpt_digest_to_hex(&chunks[i].d, hex);
			snprintf(msg, sizeof(msg),
				 "chunk %s (pack %" PRIu64 ", offset %" PRIu64 ") is damaged", hex,
				 chunks[i].loc.pack_id, chunks[i].loc.offset);
			cb(ud, NULL, msg);
			problems++;
		}
	}
	/* 2. every file's extents name known, intact chunks; count references */
	r = ckpt_iter_new(s->ix, prefix, 1, &it);
	if (r < 0)
		goto out;
	while ((r = ckpt_iter_next(it, &k, &kl, &v, &vl)) > 0) {
		struct ckpt_extent_list *l = NULL;
		uint64_t ino = kl == 9 ? ckpt_get_be64(k + 1) : 0;
		char *path = name_path(names, nnames, ino);
		struct ckpt_inode in;

		if (ckpt_extent_list_decode(v, vl, &l) < 0) {
			cb(ud, path, "extent list is damaged");
			problems++;
			free(path);
			continue;
		}
		if (st_db_getattr(s, ino, &in) < 0) {
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
	ckpt_iter_free(it);
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
		if (st_db_getattr(s, names[i].ino, &in) < 0 || in.nlink == 0) {
			char *path = name_path(names, nnames, names[i].ino);
			cb(ud, path, "directory entry points at a missing inode");
			problems++;
			free(path);
		}
	}
	r = problems;
out:
	ckpt_iter_free(it);
	for (size_t i = 0; i < nnames; i++)
		free(names[i].name);
	free(names);
	free(chunks);
	free(buf);
	return r;
}

struct pack_usage {
	uint64_t id;
	uint64_t live_bytes; /* record spans of referenced chunks */
	uint64_t size;
};

static int pack_usage_find(struct pack_usage *u, size_t n, uint64_t id)
{
	for (size_t i = 0; i < n; i++)
		if (u[i].id == id)
			return (int)i;
	return -1;
}

int ckpt_store_gc(ckpt_store *s, struct ckpt_gc_stats *ret)
{
	struct chunk_info *chunks = NULL;
	struct pack_usage *use = NULL;
	uint64_t *ids = NULL;
	size_t nchunks = 0, nids = 0;
	ckpt_batch *b = NULL;
	uint8_t *buf = NULL;
	int r;

	memset(ret, 0, sizeof(*ret));
	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	r = st_load_chunks(s, &chunks, &nchunks);
	if (r < 0)
		goto out;
	r = st_list_packs(s, &ids, &nids, &ret->bytes_before);
	if (r < 0)
		goto out;
	use = calloc(nids ? nids : 1, sizeof(*use));
	buf = malloc(CKPT_CHUNK_MAX + 64);
	if (!use || !buf) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < nids; i++) {
		char name[64];
		struct stat st;
		use[i].id = ids[i];
		ckpt_pack_name(ids[i], name, sizeof(name));
		if (fstatat(s->packs_fd, name, &st, 0) == 0)
			use[i].size = (uint64_t)st.st_size;
	}
	/* 1. drop index entries of unreferenced chunks */
	b = ckpt_batch_new();
	if (!b) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < nchunks; i++) {
		uint8_t key[32];
		int p;
		if (chunks[i].refs == 0) {
			ckpt_batch_delete(b, key, ckpt_key_chunk(key, &chunks[i].d));
			ret->chunks_dropped++;
			ret->bytes_dropped += chunks[i].loc.stored_len;
			continue;
		}
		p = pack_usage_find(use, nids, chunks[i].loc.pack_id);
		if (p >= 0)
			use[p].live_bytes += ckpt_pack_rec_span(chunks[i].loc.stored_len);
	}
	r = ckpt_index_write(s->ix, b, true);
	if (r < 0)
		goto out;
	/* 2. per pack: delete if nothing live, rewrite if mostly dead */
	for (size_t pi = 0; pi < nids; pi++) {
		struct pack_usage *u = &use[pi];
		uint64_t payload = u->size > CKPT_PACK_HDR_SIZE ? u->size - CKPT_PACK_HDR_SIZE : 0;
		char name[64];
		ckpt_pack *src = NULL;
		bool keep = false; /* a damaged chunk stays where it is */

		ckpt_pack_name(u->id, name, sizeof(name));
		if (u->live_bytes > 0 && u->live_bytes * 10 >= payload * 8)
			continue; /* >= 80% live: not worth copying */
		if (u->live_bytes > 0) {
			ckpt_batch_free(b);
			b = ckpt_batch_new();
			if (!b) {
				r = -ENOMEM;
				goto out;
			}
			r = st_get_pack(s, u->id, &src);
			if (r < 0)
				goto out;
			pthread_mutex_lock(&s->pack_lock);
			if (!s->wpack || ckpt_pack_size(s->wpack) >= s->opts.pack_max ||
			    ckpt_pack_id(s->wpack) == u->id)
				r = st_roll_pack_locked(s); /* never copy a pack into itself */
			pthread_mutex_unlock(&s->pack_lock);
			if (r < 0)
				goto out;
			for (size_t i = 0; i < nchunks; i++) {
				struct ckpt_pack_rec rec;
				struct ckpt_chunk_loc nl;
				uint8_t key[32], val[CKPT_CHUNK_REC_LEN];
				if (chunks[i].refs == 0 || chunks[i].loc.pack_id != u->id)
					continue;
				r = ckpt_pack_read(src, chunks[i].loc.offset, chunks[i].loc.stored_len,
						   &rec, buf);
				if (r == -EIO) {
					char hex[33];
					ckpt_digest_to_hex(&chunks[i].d, hex);
					ckpt_err("%s: gc: chunk %s in pack %" PRIu64
						 " is damaged; pack kept, run ckpt fsck",
						 s->path, hex, u->id);
					keep = true;
					r = 0;
					continue;
				}
				if (r < 0)
					break;
				if (ckpt_pack_size(s->wpack) >= s->opts.pack_max) {
					pthread_mutex_lock(&s->pack_lock);
					r = st_roll_pack_locked(s);
					pthread_mutex_unlock(&s->pack_lock);
					if (r < 0)
						break;
				}
				nl = chunks[i].loc;
				r = ckpt_pack_append(s->wpack, &rec, buf, &nl.offset);
				if (r < 0)
					break;
				nl.pack_id = ckpt_pack_id(s->wpack);
				r = ckpt_pack_sync(s->wpack, nl.offset + ckpt_pack_rec_span(nl.stored_len));
				if (r < 0)
					break;
				ckpt_chunk_rec_encode(&nl, chunks[i].refs, val);
				ckpt_batch_put(b, key, ckpt_key_chunk(key, &chunks[i].d), val,
					       sizeof(val));
				chunks[i].loc = nl;
			}
			if (r < 0)
				goto out;
			/* new copies are durable; switch the index, then drop the old pack */
			r = ckpt_index_write(s->ix, b, true);
			if (r < 0)
				goto out;
			ret->packs_rewritten++;
		}
		if (keep || (s->wpack && ckpt_pack_id(s->wpack) == u->id))
			continue;
		pthread_mutex_lock(&s->pack_lock);
		for (size_t i = 0; i < s->npacks; i++) {
			if (ckpt_pack_id(s->packs[i]) == u->id) {
				ckpt_pack_free(s->packs[i]);
				s->packs[i] = s->packs[--s->npacks];
				break;
			}
		}
		pthread_mutex_unlock(&s->pack_lock);
		if (unlinkat(s->packs_fd, name, 0) < 0) {
			r = -errno;
			goto out;
		}
		ret->packs_deleted++;
	}
	fsync(s->packs_fd);
	free(ids);
	ids = NULL;
	r = st_list_packs(s, &ids, &nids, &ret->bytes_after);
out:
	ckpt_batch_free(b);
	free(chunks);
	free(use);
	free(ids);
	free(buf);
	return r;
}

