/* SPDX-License-Identifier: MIT */
/*
 * namespace.c - namespace operations.
 */
#include "store/store_int.h"

int ckpt_store_getattr(ckpt_store *s, uint64_t ino, struct ckpt_inode *ret)
{
	struct commit *c;
	int r = st_db_getattr(s, ino, ret);

	if (r < 0 || !S_ISREG(ret->mode))
		return r;
	pthread_mutex_lock(&s->overlay_lock);
	c = st_overlay_find_locked(s, ino);
	if (c) {
		ret->size = c->list->size;
		ret->flags = c->flags;
		ret->mtime_ns = c->mtime_ns;
		if (ret->ctime_ns < c->mtime_ns)
			ret->ctime_ns = c->mtime_ns;
	}
	pthread_mutex_unlock(&s->overlay_lock);
	return 0;
}

static int check_name(const char *name)
{
	size_t n = strlen(name);

	if (n == 0 || strchr(name, '/'))
		return -EINVAL;
	if (n > CKPT_NAME_MAX)
		return -ENAMETOOLONG;
	return 0;
}

static int get_dentry(ckpt_store *s, uint64_t parent, const char *name, uint64_t *ret_ino,
		      uint32_t *ret_mode)
{
	uint8_t key[CKPT_KEY_MAX], val[CKPT_DENTRY_REC_LEN];
	size_t klen = ckpt_key_dentry(key, parent, name, strlen(name));
	int r = ckpt_index_get_fixed(s->ix, key, klen, val, sizeof(val));

	if (r < 0)
		return r;
	return ckpt_dentry_decode(val, sizeof(val), ret_ino, ret_mode);
}

int ckpt_store_lookup(ckpt_store *s, uint64_t parent, const char *name, struct ckpt_inode *ret)
{
	uint64_t ino;
	uint32_t mode;
	int r = check_name(name);

	if (r < 0)
		return r;
	r = get_dentry(s, parent, name, &ino, &mode);
	if (r < 0)
		return r;
	return ckpt_store_getattr(s, ino, ret);
}

static void batch_dentry(ckpt_batch *b, uint64_t parent, const char *name, uint64_t ino,
			 uint32_t mode)
{
	uint8_t key[CKPT_KEY_MAX], val[CKPT_DENTRY_REC_LEN];

	ckpt_dentry_encode(ino, mode & S_IFMT, val);
	ckpt_batch_put(b, key, ckpt_key_dentry(key, parent, name, strlen(name)), val, sizeof(val));
}

static void batch_dentry_delete(ckpt_batch *b, uint64_t parent, const char *name)
{
	uint8_t key[CKPT_KEY_MAX];

	ckpt_batch_delete(b, key, ckpt_key_dentry(key, parent, name, strlen(name)));
}

static void batch_orphan(ckpt_batch *b, uint64_t ino, bool set)
{
	uint8_t key[16];

	ckpt_key_ino(key, CKPT_KEY_ORPHAN, ino);
	if (set)
		ckpt_batch_put(b, key, 9, "", 0);
	else
		ckpt_batch_delete(b, key, 9);
}

static int get_dir(ckpt_store *s, uint64_t ino, struct ckpt_inode *ret)
{
	int r = st_db_getattr(s, ino, ret);

	if (r < 0)
		return r;
	if (!S_ISDIR(ret->mode))
		return -ENOTDIR;
	if (ret->nlink == 0)
		return -ENOENT;
	return 0;
}

int ckpt_store_mknode(ckpt_store *s, uint64_t parent, const char *name, uint32_t mode,
		      uint32_t uid, uint32_t gid, const char *symlink_target,
		      struct ckpt_inode *ret)
{
	struct ckpt_inode dir, in;
	ckpt_batch *b = NULL;
	uint64_t ino;
	uint32_t m;
	int r = check_name(name);

	if (r < 0)
		return r;
	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	if (!S_ISREG(mode) && !S_ISDIR(mode) && !S_ISLNK(mode))
		return -EPERM;
	if (symlink_target && strlen(symlink_target) >= PATH_MAX)
		return -ENAMETOOLONG;
	pthread_mutex_lock(&s->ns_lock);
	r = get_dir(s, parent, &dir);
	if (r < 0)
		goto out;
	r = get_dentry(s, parent, name, &ino, &m);
	if (r == 0) {
		r = -EEXIST;
		goto out;
	}
	if (r != -ENOENT)
		goto out;
	b = ckpt_batch_new();
	if (!b) {
		r = -ENOMEM;
		goto out;
	}
	memset(&in, 0, sizeof(in));
	in.ino = s->next_ino;
	in.mode = mode;
	in.uid = uid;
	in.gid = gid;
	in.nlink = S_ISDIR(mode) ? 2 : 1;
	in.atime_ns = in.mtime_ns = in.ctime_ns = ckpt_now_ns();
	in.parent = S_ISDIR(mode) ? parent : 0;
	in.generation = 1;
	if (S_ISLNK(mode)) {
		uint8_t key[16];
		in.size = strlen(symlink_target);
		ckpt_batch_put(b, key, ckpt_key_ino(key, CKPT_KEY_LINK, in.ino), symlink_target,
			       in.size);
	}
	st_batch_inode(b, &in);
	batch_dentry(b, parent, name, in.ino, mode);
	dir.mtime_ns = dir.ctime_ns = in.ctime_ns;
	if (S_ISDIR(mode))
		dir.nlink++;
	st_batch_inode(b, &dir);
	st_batch_meta_u64(b, "next_ino", in.ino + 1);
	r = ckpt_index_write(s->ix, b, false);
	if (r < 0)
		goto out;
	s->next_ino++;
	*ret = in;
out:
	pthread_mutex_unlock(&s->ns_lock);
	ckpt_batch_free(b);
	return r;
}

int ckpt_store_link(ckpt_store *s, uint64_t ino, uint64_t newparent, const char *newname,
		    struct ckpt_inode *ret)
{
	struct ckpt_inode dir, in;
	ckpt_batch *b = NULL;
	uint64_t x;
	uint32_t m;
	int r = check_name(newname);

	if (r < 0)
		return r;
	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	pthread_mutex_lock(&s->ns_lock);
	r = get_dir(s, newparent, &dir);
	if (r < 0)
		goto out;
	r = st_db_getattr(s, ino, &in);
	if (r < 0)
		goto out;
	if (S_ISDIR(in.mode)) {
		r = -EPERM;
		goto out;
	}
	r = get_dentry(s, newparent, newname, &x, &m);
	if (r == 0) {
		r = -EEXIST;
		goto out;
	}
	if (r != -ENOENT)
		goto out;
	b = ckpt_batch_new();
	if (!b) {
		r = -ENOMEM;
		goto out;
	}
	if (in.nlink == 0)
		batch_orphan(b, ino, false);
	in.nlink++;
	in.ctime_ns = ckpt_now_ns();
	st_batch_inode(b, &in);
	batch_dentry(b, newparent, newname, ino, in.mode);
	dir.mtime_ns = dir.ctime_ns = in.ctime_ns;
	st_batch_inode(b, &dir);
	r = ckpt_index_write(s->ix, b, false);
	if (r == 0)
		*ret = in;
out:
	pthread_mutex_unlock(&s->ns_lock);
	ckpt_batch_free(b);
	return r;
}

int ckpt_store_readlink(ckpt_store *s, uint64_t ino, char **ret_target)
{
	uint8_t key[16];
	uint8_t *val;
	size_t vlen;
	char *t;
	int r = ckpt_index_get(s->ix, key, ckpt_key_ino(key, CKPT_KEY_LINK, ino), &val, &vlen);

	if (r == -ENOENT)
		return -EINVAL;
	if (r < 0)
		return r;
	t = malloc(vlen + 1);
	if (!t) {
		free(val);
		return -ENOMEM;
	}
	memcpy(t, val, vlen);
	t[vlen] = '\0';
	free(val);
	*ret_target = t;
	return 0;
}

static int dir_is_empty(ckpt_store *s, uint64_t ino)
{
	uint8_t prefix[9];
	const uint8_t *k, *v;
	size_t kl, vl;
	ckpt_iter *it;
	int r;

	prefix[0] = CKPT_KEY_DENTRY;
	ckpt_put_be64(prefix + 1, ino);
	r = ckpt_iter_new(s->ix, prefix, sizeof(prefix), &it);
	if (r < 0)
		return r;
	r = ckpt_iter_next(it, &k, &kl, &v, &vl);
	ckpt_iter_free(it);
	if (r < 0)
		return r;
	return r == 0 ? 1 : 0;
}

/* Drop one name of victim (already removed from its directory by the
 * caller's batch).  Caller holds ns_lock. */
static void drop_link(ckpt_batch *b, struct ckpt_inode *victim, int64_t now)
{
	if (S_ISDIR(victim->mode))
		victim->nlink = 0;
	else if (victim->nlink > 0)
		victim->nlink--;
	victim->ctime_ns = now;
	if (victim->nlink == 0)
		batch_orphan(b, victim->ino, true);
	st_batch_inode(b, victim);
}

int ckpt_store_unlink(ckpt_store *s, uint64_t parent, const char *name, bool rmdir)
{
	struct ckpt_inode dir, victim;
	ckpt_batch *b = NULL;
	uint64_t ino;
	uint32_t m;
	int64_t now = ckpt_now_ns();
	int r = check_name(name);

	if (r < 0)
		return r;
	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	pthread_mutex_lock(&s->ns_lock);
	r = get_dir(s, parent, &dir);
	if (r < 0)
		goto out;
	r = get_dentry(s, parent, name, &ino, &m);
	if (r < 0)
		goto out;
	r = st_db_getattr(s, ino, &victim);
	if (r < 0)
		goto out;
	if (rmdir && !S_ISDIR(victim.mode)) {
		r = -ENOTDIR;
		goto out;
	}
	if (!rmdir && S_ISDIR(victim.mode)) {
		r = -EISDIR;
		goto out;
	}
	if (rmdir) {
		r = dir_is_empty(s, ino);
		if (r < 0)
			goto out;
		if (r == 0) {
			r = -ENOTEMPTY;
			goto out;
		}
		dir.nlink--;
	}
	b = ckpt_batch_new();
	if (!b) {
		r = -ENOMEM;
		goto out;
	}
	batch_dentry_delete(b, parent, name);
	drop_link(b, &victim, now);
	dir.mtime_ns = dir.ctime_ns = now;
	st_batch_inode(b, &dir);
	r = ckpt_index_write(s->ix, b, false);
out:
	pthread_mutex_unlock(&s->ns_lock);
	ckpt_batch_free(b);
	return r;
}

/* Is `anc` an ancestor of (or equal to) dir `ino`?  Caller holds ns_lock. */
static int is_ancestor(ckpt_store *s, uint64_t anc, uint64_t ino)
{
	for (int depth = 0; depth < 4096; depth++) {
		struct ckpt_inode in;
		int r;

		if (ino == anc)
			return 1;
		if (ino == CKPT_ROOT_INO)
			return 0;
		r = st_db_getattr(s, ino, &in);
		if (r < 0)
			return r;
		ino = in.parent;
	}
	return -ELOOP;
}

int ckpt_store_rename(ckpt_store *s, uint64_t parent, const char *name, uint64_t newparent,
		      const char *newname, unsigned flags)
{
	struct ckpt_inode pdir, ndir, src, dst;
	bool have_dst = false, same_dir = parent == newparent;
	ckpt_batch *b = NULL;
	uint64_t sino, dino;
	uint32_t m;
	int64_t now = ckpt_now_ns();
	int r;

	if ((r = check_name(name)) < 0 || (r = check_name(newname)) < 0)
		return r;
	if (flags & ~(unsigned)(RENAME_NOREPLACE | RENAME_EXCHANGE))
		return -EINVAL;
	if ((flags & RENAME_NOREPLACE) && (flags & RENAME_EXCHANGE))
		return -EINVAL;
	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	/* Publishing by rename (save under a temporary name, then rename) must
	 * not st_publish a name whose content is only in memory: index the closed
	 * files first, so that a daemon crash after rename() returned cannot
	 * leave the new name pointing at old or empty content. */
	r = st_overlay_flush_if_any(s);
	if (r < 0)
		return r;
	pthread_mutex_lock(&s->ns_lock);
	if ((r = get_dir(s, parent, &pdir)) < 0 || (r = get_dir(s, newparent, &ndir)) < 0)
		goto out;
	if ((r = get_dentry(s, parent, name, &sino, &m)) < 0)
		goto out;
	if ((r = st_db_getattr(s, sino, &src)) < 0)
		goto out;
	r = get_dentry(s, newparent, newname, &dino, &m);
	if (r == 0) {
		have_dst = true;
		if ((r = st_db_getattr(s, dino, &dst)) < 0)
			goto out;
	} else if (r != -ENOENT) {
		goto out;
	}
	if (have_dst && (flags & RENAME_NOREPLACE)) {
		r = -EEXIST;
		goto out;
	}
	if (!have_dst && (flags & RENAME_EXCHANGE)) {
		r = -ENOENT;
		goto out;
	}
	if (have_dst && dino == sino) {
		r = 0; /* same inode: POSIX says do nothing */
		goto out;
	}
	/* A directory may not move below itself. */
	if (S_ISDIR(src.mode) && !same_dir) {
		r = is_ancestor(s, sino, newparent);
		if (r < 0)
			goto out;
		if (r) {
			r = -EINVAL;
			goto out;
		}
	}
	if ((flags & RENAME_EXCHANGE) && S_ISDIR(dst.mode) && !same_dir) {
		r = is_ancestor(s, dino, parent);
		if (r < 0)
			goto out;
		if (r) {
			r = -EINVAL;
			goto out;
		}
	}
	if (have_dst && !(flags & RENAME_EXCHANGE)) {
		if (S_ISDIR(src.mode) && !S_ISDIR(dst.mode)) {
			r = -ENOTDIR;
			goto out;
		}
		if (!S_ISDIR(src.mode) && S_ISDIR(dst.mode)) {
			r = -EISDIR;
			goto out;
		}
		if (S_ISDIR(dst.mode)) {
			r = dir_is_empty(s, dino);
			if (r < 0)
				goto out;
			if (r == 0) {
				r = -ENOTEMPTY;
				goto out;
			}
		}
	}
	b = ckpt_batch_new();
	if (!b) {
		r = -ENOMEM;
		goto out;
	}
	/* Link-count changes of the two parent directories (one inode when
	 * same_dir: then both deltas apply to it). */
	{
		int pdelta = 0, ndelta = 0;

		if (flags & RENAME_EXCHANGE) {
			batch_dentry(b, parent, name, dino, dst.mode);
			batch_dentry(b, newparent, newname, sino, src.mode);
			if (!same_dir) {
				if (S_ISDIR(src.mode)) {
					src.parent = newparent;
					pdelta--;
					ndelta++;
				}
				if (S_ISDIR(dst.mode)) {
					dst.parent = parent;
					ndelta--;
					pdelta++;
				}
			}
			dst.ctime_ns = now;
			st_batch_inode(b, &dst);
		} else {
			batch_dentry_delete(b, parent, name);
			batch_dentry(b, newparent, newname, sino, src.mode);
			if (have_dst) {
				drop_link(b, &dst, now);
				if (S_ISDIR(dst.mode))
					ndelta--;
			}
			if (S_ISDIR(src.mode)) {
				src.parent = newparent;
				pdelta--;
				ndelta++;
			}
		}
		src.ctime_ns = now;
		st_batch_inode(b, &src);
		if (same_dir) {
			pdir.nlink = (uint32_t)((int64_t)pdir.nlink + pdelta + ndelta);
			pdir.mtime_ns = pdir.ctime_ns = now;
			st_batch_inode(b, &pdir);
		} else {
			pdir.nlink = (uint32_t)((int64_t)pdir.nlink + pdelta);
			ndir.nlink = (uint32_t)((int64_t)ndir.nlink + ndelta);
			pdir.mtime_ns = pdir.ctime_ns = now;
			ndir.mtime_ns = ndir.ctime_ns = now;
			st_batch_inode(b, &pdir);
			st_batch_inode(b, &ndir);
		}
	}
	r = ckpt_index_write(s->ix, b, false);
out:
	pthread_mutex_unlock(&s->ns_lock);
	ckpt_batch_free(b);
	return r;
}

int ckpt_store_reap(ckpt_store *s, uint64_t ino)
{
	struct ckpt_extent_list *old = NULL;
	struct delta *dv = NULL;
	size_t ndv = 0;
	struct ckpt_inode in;
	ckpt_batch *b = NULL;
	uint8_t key[16], *val;
	size_t vlen;
	int r;

	if (s->opts.mode != CKPT_STORE_RW)
		return 0;
	pthread_mutex_lock(&s->commit_lock);
	pthread_mutex_lock(&s->ns_lock);
	r = ckpt_index_get(s->ix, key, ckpt_key_ino(key, CKPT_KEY_ORPHAN, ino), &val, &vlen);
	if (r == -ENOENT) {
		r = 0;
		goto out;
	}
	if (r < 0)
		goto out;
	free(val);
	r = st_db_getattr(s, ino, &in);
	b = ckpt_batch_new();
	if (!b) {
		r = -ENOMEM;
		goto out;
	}
	if (r == 0 && in.nlink > 0) {
		batch_orphan(b, ino, false); /* stale marker */
		r = ckpt_index_write(s->ix, b, false);
		goto out;
	}
	if (r == 0 && S_ISREG(in.mode)) {
		r = st_db_load_extents(s, ino, &old);
		if (r < 0)
			goto out;
		r = st_build_delta(NULL, old, &dv, &ndv);
		if (r < 0)
			goto out;
		r = st_apply_delta(s, b, dv, ndv);
		if (r < 0)
			goto out;
	}
	ckpt_batch_delete(b, key, ckpt_key_ino(key, CKPT_KEY_INODE, ino));
	ckpt_batch_delete(b, key, ckpt_key_ino(key, CKPT_KEY_FILE, ino));
	ckpt_batch_delete(b, key, ckpt_key_ino(key, CKPT_KEY_LINK, ino));
	ckpt_batch_delete(b, key, ckpt_key_ino(key, CKPT_KEY_PARSED, ino));
	batch_orphan(b, ino, false);
	r = ckpt_index_write(s->ix, b, false);
	if (r == 0)
		st_commit_free(st_overlay_take(s, ino)); /* content of a deleted file */
out:
	pthread_mutex_unlock(&s->ns_lock);
	pthread_mutex_unlock(&s->commit_lock);
	ckpt_batch_free(b);
	ckpt_extent_list_free(old);
	free(dv);
	return r;
}

int ckpt_store_setattr(ckpt_store *s, uint64_t ino, unsigned what, const struct ckpt_inode *in,
		       struct ckpt_inode *ret)
{
	struct ckpt_inode cur;
	ckpt_batch *b = NULL;
	int r;

	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	pthread_mutex_lock(&s->ns_lock);
	r = st_db_getattr(s, ino, &cur);
	if (r < 0)
		goto out;
	if (what & CKPT_SET_MODE)
		cur.mode = (cur.mode & S_IFMT) | (in->mode & 07777);
	if (what & CKPT_SET_UID)
		cur.uid = in->uid;
	if (what & CKPT_SET_GID)
		cur.gid = in->gid;
	if (what & CKPT_SET_ATIME)
		cur.atime_ns = in->atime_ns;
	if (what & CKPT_SET_MTIME)
		cur.mtime_ns = in->mtime_ns;
	cur.ctime_ns = (what & CKPT_SET_CTIME) ? in->ctime_ns : ckpt_now_ns();
	b = ckpt_batch_new();
	if (!b) {
		r = -ENOMEM;
		goto out;
	}
	st_batch_inode(b, &cur);
	r = ckpt_index_write(s->ix, b, false);
	if (r == 0 && (what & CKPT_SET_MTIME)) {
		/* a closed file's pending content must not undo utimens() */
		struct commit *c;
		pthread_mutex_lock(&s->overlay_lock);
		c = st_overlay_find_locked(s, ino);
		if (c)
			c->mtime_ns = cur.mtime_ns;
		pthread_mutex_unlock(&s->overlay_lock);
	}
	if (r == 0 && ret)
		*ret = cur;
out:
	pthread_mutex_unlock(&s->ns_lock);
	ckpt_batch_free(b);
	return r;
}

void ckpt_dirents_free(struct ckpt_dirent *ents, size_t n)
{
	for (size_t i = 0; ents && i < n; i++)
		free(ents[i].name);
	free(ents);
}

int ckpt_store_readdir(ckpt_store *s, uint64_t ino, struct ckpt_dirent **ret_ents,
		       size_t *ret_n)
{
	struct ckpt_dirent *v = NULL;
	size_t n = 0, cap = 0;
	uint8_t prefix[9];
	const uint8_t *k, *val;
	size_t kl, vl;
	ckpt_iter *it = NULL;
	int r;

	prefix[0] = CKPT_KEY_DENTRY;
	ckpt_put_be64(prefix + 1, ino);
	r = ckpt_iter_new(s->ix, prefix, sizeof(prefix), &it);
	if (r < 0)
		return r;
	while ((r = ckpt_iter_next(it, &k, &kl, &val, &vl)) > 0) {
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 32;
			struct ckpt_dirent *nv = realloc(v, nc * sizeof(*nv));
			if (!nv) {
				r = -ENOMEM;
				break;
			}
			v = nv;
			cap = nc;
		}
		r = ckpt_dentry_decode(val, vl, &v[n].ino, &v[n].mode);
		if (r < 0)
			break;
		v[n].name = strndup((const char *)k + 9, kl - 9);
		if (!v[n].name) {
			r = -ENOMEM;
			break;
		}
		n++;
	}
	ckpt_iter_free(it);
	if (r < 0) {
		ckpt_dirents_free(v, n);
		return r;
	}
	*ret_ents = v;
	*ret_n = n;
	return 0;
}

int ckpt_store_statfs(ckpt_store *s, struct statvfs *ret)
{
	int r = ckpt_cb_statfs(s->cb, ret);

	if (r < 0)
		return r;
	ret->f_namemax = CKPT_NAME_MAX;
	return 0;
}

char *ckpt_store_path_of(ckpt_store *s, uint64_t ino)
{
	/* Directories know their parent; for files search the parent's
	 * entries is too costly, so callers pass a directory + name where they
	 * can.  Here: walk up for directories, "<inode N>" otherwise. */
	char *path = strdup("");
	uint64_t cur = ino;

	for (int depth = 0; path && cur != CKPT_ROOT_INO && depth < 256; depth++) {
		struct ckpt_inode in, pin;
		struct ckpt_dirent *ents = NULL;
		size_t n = 0;
		const char *nm = NULL;
		char *np;

		if (st_db_getattr(s, cur, &in) < 0 || !S_ISDIR(in.mode) ||
		    st_db_getattr(s, in.parent, &pin) < 0 ||
		    ckpt_store_readdir(s, in.parent, &ents, &n) < 0) {
			if (asprintf(&np, "<inode %" PRIu64 ">%s", cur, path) < 0)
				np = NULL;
			free(path);
			return np;
		}
		for (size_t i = 0; i < n; i++)
			if (ents[i].ino == cur)
				nm = ents[i].name;
		if (asprintf(&np, "/%s%s", nm ? nm : "?", path) < 0)
			np = NULL;
		ckpt_dirents_free(ents, n);
		free(path);
		path = np;
		cur = in.parent;
	}
	if (path && !*path) {
		free(path);
		path = strdup("/");
	}
	return path;
}

