/* SPDX-License-Identifier: MIT */
/*
 * namespace.c - namespace operations.
 */
#include "store/store_int.h"

int ckpt_store_getattr(ckpt_store *s, uint64_t ino, struct ckpt_inode *ret)
{
	struct commit *c;
	int r = st_db_getattr(s, NULL, ino, ret);

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

/* t == NULL: committed state; otherwise read in t for update (meta.c). */
static int get_dentry(ckpt_store *s, ckpt_txn *t, uint64_t parent, const char *name,
		      uint64_t *ret_ino, uint32_t *ret_mode)
{
	uint8_t key[CKPT_KEY_MAX], val[CKPT_DENTRY_REC_LEN];
	size_t klen = ckpt_key_dentry(key, parent, name, strlen(name));
	int r = st_get_fixed(s, t, key, klen, val, sizeof(val));

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
	r = get_dentry(s, NULL, parent, name, &ino, &mode);
	if (r < 0)
		return r;
	return ckpt_store_getattr(s, ino, ret);
}

static void put_dentry(ckpt_txn *t, uint64_t parent, const char *name, uint64_t ino,
		       uint32_t mode)
{
	uint8_t key[CKPT_KEY_MAX], val[CKPT_DENTRY_REC_LEN];

	ckpt_dentry_encode(ino, mode & S_IFMT, val);
	ckpt_txn_put(t, key, ckpt_key_dentry(key, parent, name, strlen(name)), val, sizeof(val));
}

static void delete_dentry(ckpt_txn *t, uint64_t parent, const char *name)
{
	uint8_t key[CKPT_KEY_MAX];

	ckpt_txn_delete(t, key, ckpt_key_dentry(key, parent, name, strlen(name)));
}

static void put_orphan(ckpt_txn *t, uint64_t ino, bool set)
{
	uint8_t key[16];

	ckpt_key_ino(key, CKPT_KEY_ORPHAN, ino);
	if (set)
		ckpt_txn_put(t, key, 9, "", 0);
	else
		ckpt_txn_delete(t, key, 9);
}

/* The directory ino, read in t for update: every operation that adds or
 * removes one of its names also writes it, so two such operations on one
 * directory conflict (engine.h). */
static int get_dir(ckpt_store *s, ckpt_txn *t, uint64_t ino, struct ckpt_inode *ret)
{
	int r = st_db_getattr(s, t, ino, ret);

	if (r < 0)
		return r;
	if (!S_ISDIR(ret->mode))
		return -ENOTDIR;
	if (ret->nlink == 0)
		return -ENOENT;
	return 0;
}

/* Inode numbers a process reserves at a time (ckpt_store.ino_next). */
#define ST_INO_BATCH 64

struct mknode_arg {
	uint64_t parent;
	const char *name, *target;
	uint32_t mode, uid, gid;
	struct ckpt_inode *ret;
	uint64_t reserved_end; /* set: the transaction reserved up to here */
};

static int mknode_txn(ckpt_store *s, ckpt_txn *t, void *arg)
{
	struct mknode_arg *a = arg;
	struct ckpt_inode dir, in;
	uint64_t ino;
	uint32_t m;
	int r = get_dir(s, t, a->parent, &dir);

	if (r < 0)
		return r;
	r = get_dentry(s, t, a->parent, a->name, &ino, &m);
	if (r == 0)
		return -EEXIST;
	if (r != -ENOENT)
		return r;
	memset(&in, 0, sizeof(in));
	a->reserved_end = 0;
	if (s->ino_next < s->ino_end) {
		in.ino = s->ino_next;
	} else {
		r = st_meta_get_u64(s, t, "next_ino", &in.ino);
		if (r < 0)
			return r;
		a->reserved_end = in.ino + ST_INO_BATCH;
		st_put_meta_u64(t, "next_ino", a->reserved_end);
	}
	in.mode = a->mode;
	in.uid = a->uid;
	in.gid = a->gid;
	in.nlink = S_ISDIR(a->mode) ? 2 : 1;
	in.atime_ns = in.mtime_ns = in.ctime_ns = ckpt_now_ns();
	in.parent = S_ISDIR(a->mode) ? a->parent : 0;
	in.generation = 1;
	if (S_ISLNK(a->mode)) {
		uint8_t key[16];
		in.size = strlen(a->target);
		ckpt_txn_put(t, key, ckpt_key_ino(key, CKPT_KEY_LINK, in.ino), a->target, in.size);
	}
	st_put_inode(t, &in);
	put_dentry(t, a->parent, a->name, in.ino, a->mode);
	dir.mtime_ns = dir.ctime_ns = in.ctime_ns;
	if (S_ISDIR(a->mode))
		dir.nlink++;
	st_put_inode(t, &dir);
	*a->ret = in;
	return 0;
}

int ckpt_store_mknode(ckpt_store *s, uint64_t parent, const char *name, uint32_t mode,
		      uint32_t uid, uint32_t gid, const char *symlink_target,
		      struct ckpt_inode *ret)
{
	struct mknode_arg a = { parent, name, symlink_target, mode, uid, gid, ret, 0 };
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
	r = st_txn_run(s, mknode_txn, &a, false);
	if (r == 0) {
		if (a.reserved_end)
			s->ino_end = a.reserved_end;
		s->ino_next = ret->ino + 1;
	}
	pthread_mutex_unlock(&s->ns_lock);
	return r;
}

struct link_arg {
	uint64_t ino, newparent;
	const char *newname;
	struct ckpt_inode *ret;
};

static int link_txn(ckpt_store *s, ckpt_txn *t, void *arg)
{
	struct link_arg *a = arg;
	struct ckpt_inode dir, in;
	uint64_t x;
	uint32_t m;
	int r = get_dir(s, t, a->newparent, &dir);

	if (r < 0)
		return r;
	r = st_db_getattr(s, t, a->ino, &in);
	if (r < 0)
		return r;
	if (S_ISDIR(in.mode))
		return -EPERM;
	r = get_dentry(s, t, a->newparent, a->newname, &x, &m);
	if (r == 0)
		return -EEXIST;
	if (r != -ENOENT)
		return r;
	if (in.nlink == 0)
		put_orphan(t, a->ino, false);
	in.nlink++;
	in.ctime_ns = ckpt_now_ns();
	st_put_inode(t, &in);
	put_dentry(t, a->newparent, a->newname, a->ino, in.mode);
	dir.mtime_ns = dir.ctime_ns = in.ctime_ns;
	st_put_inode(t, &dir);
	*a->ret = in;
	return 0;
}

int ckpt_store_link(ckpt_store *s, uint64_t ino, uint64_t newparent, const char *newname,
		    struct ckpt_inode *ret)
{
	struct link_arg a = { ino, newparent, newname, ret };
	int r = check_name(newname);

	if (r < 0)
		return r;
	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	pthread_mutex_lock(&s->ns_lock);
	r = st_txn_run(s, link_txn, &a, false);
	pthread_mutex_unlock(&s->ns_lock);
	return r;
}

int ckpt_store_readlink(ckpt_store *s, uint64_t ino, char **ret_target)
{
	uint8_t key[16];
	uint8_t *val;
	size_t vlen;
	char *t;
	int r = ckpt_engine_get(s->eng, key, ckpt_key_ino(key, CKPT_KEY_LINK, ino), &val, &vlen);

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

/* 1 if directory ino has no entries in t's view, 0 if it has, or -errno.
 * A scan is not tracked: the caller has read ino's inode for update, which
 * any change of its entries also writes. */
static int dir_is_empty(ckpt_store *s, ckpt_txn *t, uint64_t ino)
{
	uint8_t prefix[9];
	const uint8_t *k, *v;
	size_t kl, vl;
	ckpt_scan *it;
	int r;

	prefix[0] = CKPT_KEY_DENTRY;
	ckpt_put_be64(prefix + 1, ino);
	r = ckpt_scan_new(s->eng, t, prefix, sizeof(prefix), NULL, 0, &it);
	if (r < 0)
		return r;
	r = ckpt_scan_next(it, &k, &kl, &v, &vl);
	ckpt_scan_free(it);
	if (r < 0)
		return r;
	return r == 0 ? 1 : 0;
}

/* Drop one name of victim (already removed from its directory in t). */
static void drop_link(ckpt_txn *t, struct ckpt_inode *victim, int64_t now)
{
	if (S_ISDIR(victim->mode))
		victim->nlink = 0;
	else if (victim->nlink > 0)
		victim->nlink--;
	victim->ctime_ns = now;
	if (victim->nlink == 0)
		put_orphan(t, victim->ino, true);
	st_put_inode(t, victim);
}

struct unlink_arg {
	uint64_t parent;
	const char *name;
	bool rmdir;
};

static int unlink_txn(ckpt_store *s, ckpt_txn *t, void *arg)
{
	struct unlink_arg *a = arg;
	struct ckpt_inode dir, victim;
	uint64_t ino;
	uint32_t m;
	int64_t now = ckpt_now_ns();
	int r = get_dir(s, t, a->parent, &dir);

	if (r < 0)
		return r;
	r = get_dentry(s, t, a->parent, a->name, &ino, &m);
	if (r < 0)
		return r;
	r = st_db_getattr(s, t, ino, &victim);
	if (r < 0)
		return r;
	if (a->rmdir && !S_ISDIR(victim.mode))
		return -ENOTDIR;
	if (!a->rmdir && S_ISDIR(victim.mode))
		return -EISDIR;
	if (a->rmdir) {
		r = dir_is_empty(s, t, ino);
		if (r < 0)
			return r;
		if (r == 0)
			return -ENOTEMPTY;
		dir.nlink--;
	}
	delete_dentry(t, a->parent, a->name);
	drop_link(t, &victim, now);
	dir.mtime_ns = dir.ctime_ns = now;
	st_put_inode(t, &dir);
	return 0;
}

int ckpt_store_unlink(ckpt_store *s, uint64_t parent, const char *name, bool rmdir)
{
	struct unlink_arg a = { parent, name, rmdir };
	int r = check_name(name);

	if (r < 0)
		return r;
	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	pthread_mutex_lock(&s->ns_lock);
	r = st_txn_run(s, unlink_txn, &a, false);
	pthread_mutex_unlock(&s->ns_lock);
	return r;
}

/* Is `anc` an ancestor of (or equal to) dir `ino`?  Reads in t. */
static int is_ancestor(ckpt_store *s, ckpt_txn *t, uint64_t anc, uint64_t ino)
{
	for (int depth = 0; depth < 4096; depth++) {
		struct ckpt_inode in;
		int r;

		if (ino == anc)
			return 1;
		if (ino == CKPT_ROOT_INO)
			return 0;
		r = st_db_getattr(s, t, ino, &in);
		if (r < 0)
			return r;
		ino = in.parent;
	}
	return -ELOOP;
}

struct rename_arg {
	uint64_t parent, newparent;
	const char *name, *newname;
	unsigned flags;
};

static int rename_txn(ckpt_store *s, ckpt_txn *t, void *arg)
{
	struct rename_arg *a = arg;
	uint64_t parent = a->parent, newparent = a->newparent;
	const char *name = a->name, *newname = a->newname;
	unsigned flags = a->flags;
	struct ckpt_inode pdir, ndir, src, dst;
	bool have_dst = false, same_dir = parent == newparent;
	uint64_t sino, dino;
	uint32_t m;
	int64_t now = ckpt_now_ns();
	int r;

	if ((r = get_dir(s, t, parent, &pdir)) < 0 || (r = get_dir(s, t, newparent, &ndir)) < 0)
		goto out;
	if ((r = get_dentry(s, t, parent, name, &sino, &m)) < 0)
		goto out;
	if ((r = st_db_getattr(s, t, sino, &src)) < 0)
		goto out;
	r = get_dentry(s, t, newparent, newname, &dino, &m);
	if (r == 0) {
		have_dst = true;
		if ((r = st_db_getattr(s, t, dino, &dst)) < 0)
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
		r = 1; /* same inode: POSIX says do nothing */
		goto out;
	}
	/* A directory may not move below itself. */
	if (S_ISDIR(src.mode) && !same_dir) {
		r = is_ancestor(s, t, sino, newparent);
		if (r < 0)
			goto out;
		if (r) {
			r = -EINVAL;
			goto out;
		}
	}
	if ((flags & RENAME_EXCHANGE) && S_ISDIR(dst.mode) && !same_dir) {
		r = is_ancestor(s, t, dino, parent);
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
			r = dir_is_empty(s, t, dino);
			if (r < 0)
				goto out;
			if (r == 0) {
				r = -ENOTEMPTY;
				goto out;
			}
		}
	}
	/* Link-count changes of the two parent directories (one inode when
	 * same_dir: then both deltas apply to it). */
	{
		int pdelta = 0, ndelta = 0;

		if (flags & RENAME_EXCHANGE) {
			put_dentry(t, parent, name, dino, dst.mode);
			put_dentry(t, newparent, newname, sino, src.mode);
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
			st_put_inode(t, &dst);
		} else {
			delete_dentry(t, parent, name);
			put_dentry(t, newparent, newname, sino, src.mode);
			if (have_dst) {
				drop_link(t, &dst, now);
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
		st_put_inode(t, &src);
		if (same_dir) {
			pdir.nlink = (uint32_t)((int64_t)pdir.nlink + pdelta + ndelta);
			pdir.mtime_ns = pdir.ctime_ns = now;
			st_put_inode(t, &pdir);
		} else {
			pdir.nlink = (uint32_t)((int64_t)pdir.nlink + pdelta);
			ndir.nlink = (uint32_t)((int64_t)ndir.nlink + ndelta);
			pdir.mtime_ns = pdir.ctime_ns = now;
			ndir.mtime_ns = ndir.ctime_ns = now;
			st_put_inode(t, &pdir);
			st_put_inode(t, &ndir);
		}
	}
	r = 0;
out:
	return r;
}


int ckpt_store_rename(ckpt_store *s, uint64_t parent, const char *name, uint64_t newparent,
		      const char *newname, unsigned flags)
{
	struct rename_arg a = { parent, newparent, name, newname, flags };
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
	 * not publish a name whose content is only in memory: index the closed
	 * files first, so that a daemon crash after rename() returned cannot
	 * leave the new name pointing at old or empty content. */
	r = st_overlay_flush_if_any(s);
	if (r < 0)
		return r;
	pthread_mutex_lock(&s->ns_lock);
	r = st_txn_run(s, rename_txn, &a, false);
	pthread_mutex_unlock(&s->ns_lock);
	return r;
}

/* Delete the records of orphan a->ino if it is still one; *a->gone tells
 * whether it was. */
struct reap_arg {
	uint64_t ino;
	bool gone;
};

static int reap_txn(ckpt_store *s, ckpt_txn *t, void *arg)
{
	struct reap_arg *a = arg;
	struct ckpt_extent_list *old = NULL;
	struct delta *dv = NULL;
	size_t ndv = 0;
	struct ckpt_inode in;
	uint8_t key[16];
	int r = ckpt_txn_has(t, key, ckpt_key_ino(key, CKPT_KEY_ORPHAN, a->ino),
			     CKPT_TXN_FOR_UPDATE);

	a->gone = false;
	if (r <= 0)
		return r < 0 ? r : 1;
	r = st_db_getattr(s, t, a->ino, &in);
	if (r == 0 && in.nlink > 0) {
		put_orphan(t, a->ino, false); /* stale marker */
		return 0;
	}
	if (r == 0 && S_ISREG(in.mode)) {
		r = st_db_load_extents(s, t, a->ino, &old);
		if (r == 0)
			r = st_build_delta(NULL, old, &dv, &ndv);
		if (r == 0)
			r = st_apply_delta(s, t, dv, ndv);
		ckpt_extent_list_free(old);
		free(dv);
		if (r < 0)
			return r;
	}
	ckpt_txn_delete(t, key, ckpt_key_ino(key, CKPT_KEY_INODE, a->ino));
	ckpt_txn_delete(t, key, ckpt_key_ino(key, CKPT_KEY_FILE, a->ino));
	ckpt_txn_delete(t, key, ckpt_key_ino(key, CKPT_KEY_LINK, a->ino));
	ckpt_txn_delete(t, key, ckpt_key_ino(key, CKPT_KEY_PARSED, a->ino));
	put_orphan(t, a->ino, false);
	a->gone = true;
	return 0;
}

int ckpt_store_reap(ckpt_store *s, uint64_t ino)
{
	struct reap_arg a = { ino, false };
	int r;

	if (s->opts.mode != CKPT_STORE_RW)
		return 0;
	pthread_mutex_lock(&s->commit_lock);
	pthread_mutex_lock(&s->ns_lock);
	r = st_txn_run(s, reap_txn, &a, false);
	if (r == 0 && a.gone)
		st_commit_free(st_overlay_take(s, ino)); /* content of a deleted file */
	pthread_mutex_unlock(&s->ns_lock);
	pthread_mutex_unlock(&s->commit_lock);
	return r;
}

struct setattr_arg {
	uint64_t ino;
	unsigned what;
	const struct ckpt_inode *in;
	struct ckpt_inode cur;
};

static int setattr_txn(ckpt_store *s, ckpt_txn *t, void *arg)
{
	struct setattr_arg *a = arg;
	const struct ckpt_inode *in = a->in;
	unsigned what = a->what;
	int r = st_db_getattr(s, t, a->ino, &a->cur);

	if (r < 0)
		return r;
	if (what & CKPT_SET_MODE)
		a->cur.mode = (a->cur.mode & S_IFMT) | (in->mode & 07777);
	if (what & CKPT_SET_UID)
		a->cur.uid = in->uid;
	if (what & CKPT_SET_GID)
		a->cur.gid = in->gid;
	if (what & CKPT_SET_ATIME)
		a->cur.atime_ns = in->atime_ns;
	if (what & CKPT_SET_MTIME)
		a->cur.mtime_ns = in->mtime_ns;
	a->cur.ctime_ns = (what & CKPT_SET_CTIME) ? in->ctime_ns : ckpt_now_ns();
	st_put_inode(t, &a->cur);
	return 0;
}

int ckpt_store_setattr(ckpt_store *s, uint64_t ino, unsigned what, const struct ckpt_inode *in,
		       struct ckpt_inode *ret)
{
	struct setattr_arg a = { .ino = ino, .what = what, .in = in };
	int r;

	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	pthread_mutex_lock(&s->ns_lock);
	r = st_txn_run(s, setattr_txn, &a, false);
	if (r == 0 && (what & CKPT_SET_MTIME)) {
		/* a closed file's pending content must not undo utimens() */
		struct commit *c;
		pthread_mutex_lock(&s->overlay_lock);
		c = st_overlay_find_locked(s, ino);
		if (c)
			c->mtime_ns = a.cur.mtime_ns;
		pthread_mutex_unlock(&s->overlay_lock);
	}
	if (r == 0 && ret)
		*ret = a.cur;
	pthread_mutex_unlock(&s->ns_lock);
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
	ckpt_scan *it = NULL;
	int r;

	prefix[0] = CKPT_KEY_DENTRY;
	ckpt_put_be64(prefix + 1, ino);
	r = ckpt_scan_new(s->eng, NULL, prefix, sizeof(prefix), NULL, 0, &it);
	if (r < 0)
		return r;
	while ((r = ckpt_scan_next(it, &k, &kl, &val, &vl)) > 0) {
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
	ckpt_scan_free(it);
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

		if (st_db_getattr(s, NULL, cur, &in) < 0 || !S_ISDIR(in.mode) ||
		    st_db_getattr(s, NULL, in.parent, &pin) < 0 ||
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

