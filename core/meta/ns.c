/* SPDX-License-Identifier: MIT */
/*
 * ns.c - the namespace over a metadata engine (ns.h), and the record reads
 * and writes in engine transactions it shares with the store.
 */
#include "meta/ns.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/util.h"

struct ckpt_ns {
	ckpt_engine *eng;
	pthread_mutex_t *lock; /* the process's writer lock (ns.h), borrowed */
	bool writable;
	char *name; /* for messages */
	/* Protected by *lock: inode numbers [ino_next, ino_end) reserved in
	 * the "next_ino" meta record (a create takes the next one; an empty
	 * range reserves CKPT_NS_INO_BATCH more in its transaction), so that
	 * creates do not all read and write that one record. */
	uint64_t ino_next, ino_end;
	/* The node that writes orphan markers (ckpt_ns_set_owner): set
	 * before any change, immutable after; "" on one node. */
	char owner[CKPT_NODE_MAX + 1];
};

/* ---- records through the engine ---- */

int ckpt_meta_get_fixed(ckpt_engine *e, ckpt_txn *t, const void *key, size_t klen, void *buf,
			size_t len)
{
	if (t)
		return ckpt_txn_get_fixed(t, key, klen, CKPT_TXN_FOR_UPDATE, buf, len);
	return ckpt_engine_get_fixed(e, key, klen, buf, len);
}

int ckpt_meta_get(ckpt_engine *e, ckpt_txn *t, const void *key, size_t klen, uint8_t **ret_val,
		  size_t *ret_len)
{
	if (t)
		return ckpt_txn_get(t, key, klen, CKPT_TXN_FOR_UPDATE, ret_val, ret_len);
	return ckpt_engine_get(e, key, klen, ret_val, ret_len);
}

int ckpt_meta_get_u64(ckpt_engine *e, ckpt_txn *t, const char *name, uint64_t *ret)
{
	uint8_t key[64], buf[8];
	int r = ckpt_meta_get_fixed(e, t, key, ckpt_key_meta(key, name), buf, 8);

	if (r < 0)
		return r;
	*ret = ckpt_get_le64(buf);
	return 0;
}

void ckpt_meta_put_u64(ckpt_txn *t, const char *name, uint64_t v)
{
	uint8_t buf[8];

	ckpt_put_le64(buf, v);
	ckpt_meta_put_bytes(t, name, buf, 8);
}

void ckpt_meta_put_bytes(ckpt_txn *t, const char *name, const void *v, size_t len)
{
	uint8_t key[64];

	ckpt_txn_put(t, key, ckpt_key_meta(key, name), v, len);
}

int ckpt_meta_get_inode(ckpt_engine *e, ckpt_txn *t, uint64_t ino, struct ckpt_inode *ret)
{
	uint8_t key[16], val[CKPT_INODE_REC_LEN];
	int r = ckpt_meta_get_fixed(e, t, key, ckpt_key_ino(key, CKPT_KEY_INODE, ino), val,
				    sizeof(val));

	if (r < 0)
		return r;
	return ckpt_inode_decode(ino, val, sizeof(val), ret);
}

void ckpt_meta_put_inode(ckpt_txn *t, const struct ckpt_inode *in)
{
	uint8_t key[16], val[CKPT_INODE_REC_LEN];

	ckpt_inode_encode(in, val);
	ckpt_txn_put(t, key, ckpt_key_ino(key, CKPT_KEY_INODE, in->ino), val, sizeof(val));
}

int ckpt_meta_get_extents(ckpt_engine *e, ckpt_txn *t, uint64_t ino,
			  struct ckpt_extent_list **ret_list)
{
	uint8_t key[16];
	uint8_t *val;
	size_t vlen;
	int r = ckpt_meta_get(e, t, key, ckpt_key_ino(key, CKPT_KEY_FILE, ino), &val, &vlen);

	if (r == -ENOENT) {
		*ret_list = ckpt_extent_list_new();
		return *ret_list ? 0 : -ENOMEM;
	}
	if (r < 0)
		return r;
	r = ckpt_extent_list_decode(val, vlen, ret_list);
	free(val);
	return r;
}

int ckpt_meta_get_chunk(ckpt_engine *e, ckpt_txn *t, const ckpt_digest *d,
			struct ckpt_chunk_loc *ret_loc, uint64_t *ret_refs)
{
	uint8_t key[32], val[CKPT_CHUNK_REC_LEN];
	int r = ckpt_meta_get_fixed(e, t, key, ckpt_key_chunk(key, d), val, sizeof(val));

	if (r < 0)
		return r;
	return ckpt_chunk_rec_decode(val, sizeof(val), ret_loc, ret_refs);
}

struct chunks_arg {
	struct ckpt_chunk_loc *locs;
	bool *found;
};

static int chunk_found(void *arg, size_t i, const uint8_t *val, size_t len)
{
	struct chunks_arg *a = arg;
	uint64_t refs;
	int r;

	if (len != CKPT_CHUNK_REC_LEN)
		return -EIO;
	r = ckpt_chunk_rec_decode(val, len, &a->locs[i], &refs);
	if (r == 0)
		a->found[i] = true;
	return r;
}

int ckpt_meta_get_chunks(ckpt_engine *e, const ckpt_digest *d, size_t n,
			 struct ckpt_chunk_loc *ret_locs, bool *ret_found)
{
	uint8_t *keys = malloc(n ? n * (1 + CKPT_DIGEST_LEN) : 1);
	const uint8_t **kp = malloc(n ? n * sizeof(*kp) : 1);
	size_t *kl = malloc(n ? n * sizeof(*kl) : 1);
	struct chunks_arg a = { ret_locs, ret_found };
	int r = -ENOMEM;

	if (!keys || !kp || !kl)
		goto out;
	for (size_t i = 0; i < n; i++) {
		kp[i] = keys + i * (1 + CKPT_DIGEST_LEN);
		kl[i] = ckpt_key_chunk((uint8_t *)kp[i], &d[i]);
		ret_found[i] = false;
	}
	r = ckpt_engine_get_many(e, kp, kl, n, chunk_found, &a);
out:
	free(keys);
	free(kp);
	free(kl);
	return r;
}

void ckpt_meta_put_chunk(ckpt_txn *t, const ckpt_digest *d, const struct ckpt_chunk_loc *loc,
			 uint64_t refs)
{
	uint8_t key[32], val[CKPT_CHUNK_REC_LEN];

	ckpt_chunk_rec_encode(loc, refs, val);
	ckpt_txn_put(t, key, ckpt_key_chunk(key, d), val, sizeof(val));
}

/* ---- the namespace ---- */

int ckpt_ns_new(ckpt_engine *e, pthread_mutex_t *writer_lock, bool writable, const char *name,
		ckpt_ns **ret)
{
	ckpt_ns *ns = calloc(1, sizeof(*ns));

	if (!ns)
		return -ENOMEM;
	ns->name = strdup(name ? name : "");
	if (!ns->name) {
		free(ns);
		return -ENOMEM;
	}
	ns->eng = e;
	ns->lock = writer_lock;
	ns->writable = writable;
	*ret = ns;
	return 0;
}

void ckpt_ns_free(ckpt_ns *ns)
{
	if (!ns)
		return;
	free(ns->name);
	free(ns);
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

/* t == NULL: committed state; otherwise read in t for update (ns.h). */
static int get_dentry(ckpt_ns *ns, ckpt_txn *t, uint64_t parent, const char *name,
		      uint64_t *ret_ino, uint32_t *ret_mode)
{
	uint8_t key[CKPT_KEY_MAX], val[CKPT_DENTRY_REC_LEN];
	size_t klen = ckpt_key_dentry(key, parent, name, strlen(name));
	int r = ckpt_meta_get_fixed(ns->eng, t, key, klen, val, sizeof(val));

	if (r < 0)
		return r;
	return ckpt_dentry_decode(val, sizeof(val), ret_ino, ret_mode);
}

int ckpt_ns_lookup(ckpt_ns *ns, uint64_t parent, const char *name, uint64_t *ret_ino)
{
	uint32_t mode;
	int r = check_name(name);

	if (r < 0)
		return r;
	return get_dentry(ns, NULL, parent, name, ret_ino, &mode);
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

static void put_orphan(ckpt_ns *ns, ckpt_txn *t, uint64_t ino, bool set)
{
	uint8_t key[16];

	ckpt_key_ino(key, CKPT_KEY_ORPHAN, ino);
	if (set)
		ckpt_txn_put(t, key, 9, ns->owner, strlen(ns->owner));
	else
		ckpt_txn_delete(t, key, 9);
}

void ckpt_ns_set_owner(ckpt_ns *ns, const char *node)
{
	snprintf(ns->owner, sizeof(ns->owner), "%s", node ? node : "");
}

/* The directory ino, read in t for update: every operation that adds or
 * removes one of its names also writes it, so two such operations on one
 * directory conflict (engine.h). */
static int get_dir(ckpt_ns *ns, ckpt_txn *t, uint64_t ino, struct ckpt_inode *ret)
{
	int r = ckpt_meta_get_inode(ns->eng, t, ino, ret);

	if (r < 0)
		return r;
	if (!S_ISDIR(ret->mode))
		return -ENOTDIR;
	if (ret->nlink == 0)
		return -ENOENT;
	return 0;
}

/* 0 when directory parent (read in t) has no entry name, -EEXIST when it
 * has, or -errno. */
static int name_free(ckpt_ns *ns, ckpt_txn *t, uint64_t parent, const char *name)
{
	uint64_t ino;
	uint32_t mode;
	int r = get_dentry(ns, t, parent, name, &ino, &mode);

	if (r == 0)
		return -EEXIST;
	return r == -ENOENT ? 0 : r;
}

/* Run fn as one transaction of a namespace change: -EROFS on a read-only
 * namespace; under ns->lock, so that this process's writers never conflict
 * with each other (another process's writers can, and then fn runs again). */
static int ns_write(ckpt_ns *ns, int (*fn)(ckpt_txn *t, void *arg), void *arg)
{
	int r;

	if (!ns->writable)
		return -EROFS;
	pthread_mutex_lock(ns->lock);
	r = ckpt_txn_run(ns->eng, fn, arg, false);
	pthread_mutex_unlock(ns->lock);
	return r;
}

struct mknode_arg {
	ckpt_ns *ns;
	uint64_t parent;
	const char *name, *target;
	uint32_t mode, uid, gid;
	uint64_t rdev;
	struct ckpt_inode *ret;
	uint64_t reserved_end; /* set: the transaction reserved up to here */
};

static int mknode_txn(ckpt_txn *t, void *arg)
{
	struct mknode_arg *a = arg;
	ckpt_ns *ns = a->ns;
	struct ckpt_inode dir, in;
	int r = get_dir(ns, t, a->parent, &dir);

	if (r < 0 || (r = name_free(ns, t, a->parent, a->name)) < 0)
		return r;
	memset(&in, 0, sizeof(in));
	a->reserved_end = 0;
	if (ns->ino_next < ns->ino_end) {
		in.ino = ns->ino_next;
	} else {
		r = ckpt_meta_get_u64(ns->eng, t, "next_ino", &in.ino);
		if (r < 0)
			return r;
		a->reserved_end = in.ino + CKPT_NS_INO_BATCH;
		ckpt_meta_put_u64(t, "next_ino", a->reserved_end);
	}
	in.mode = a->mode;
	in.uid = a->uid;
	in.gid = a->gid;
	in.nlink = S_ISDIR(a->mode) ? 2 : 1;
	in.atime_ns = in.mtime_ns = in.ctime_ns = ckpt_now_ns();
	in.parent = S_ISDIR(a->mode) ? a->parent : 0;
	in.generation = 1;
	in.rdev = S_ISCHR(a->mode) || S_ISBLK(a->mode) ? a->rdev : 0;
	if (S_ISLNK(a->mode)) {
		uint8_t key[16];
		in.size = strlen(a->target);
		ckpt_txn_put(t, key, ckpt_key_ino(key, CKPT_KEY_LINK, in.ino), a->target, in.size);
	}
	ckpt_meta_put_inode(t, &in);
	put_dentry(t, a->parent, a->name, in.ino, a->mode);
	dir.mtime_ns = dir.ctime_ns = in.ctime_ns;
	if (S_ISDIR(a->mode))
		dir.nlink++;
	ckpt_meta_put_inode(t, &dir);
	*a->ret = in;
	return 0;
}

static int make_node(ckpt_ns *ns, uint64_t parent, const char *name, uint32_t mode,
		     uint32_t uid, uint32_t gid, const char *symlink_target, uint64_t rdev,
		     struct ckpt_inode *ret)
{
	struct mknode_arg a = { ns, parent, name, symlink_target, mode, uid, gid, rdev, ret, 0 };
	int r = check_name(name);

	if (r < 0)
		return r;
	if (!ns->writable)
		return -EROFS;
	if (symlink_target && strlen(symlink_target) >= PATH_MAX)
		return -ENAMETOOLONG;
	pthread_mutex_lock(ns->lock);
	r = ckpt_txn_run(ns->eng, mknode_txn, &a, false);
	if (r == 0) {
		if (a.reserved_end)
			ns->ino_end = a.reserved_end;
		ns->ino_next = ret->ino + 1;
	}
	pthread_mutex_unlock(ns->lock);
	return r;
}

int ckpt_ns_mknode(ckpt_ns *ns, uint64_t parent, const char *name, uint32_t mode,
		   uint32_t uid, uint32_t gid, const char *symlink_target, struct ckpt_inode *ret)
{
	if (!S_ISREG(mode) && !S_ISDIR(mode) && !S_ISLNK(mode))
		return -EINVAL;
	if (S_ISLNK(mode) != (symlink_target != NULL))
		return -EINVAL;
	return make_node(ns, parent, name, mode, uid, gid, symlink_target, 0, ret);
}

int ckpt_ns_mknod(ckpt_ns *ns, uint64_t parent, const char *name, uint32_t mode, uint32_t uid,
		  uint32_t gid, uint64_t rdev, struct ckpt_inode *ret)
{
	if (!S_ISFIFO(mode) && !S_ISSOCK(mode) && !S_ISCHR(mode) && !S_ISBLK(mode))
		return -EINVAL;
	return make_node(ns, parent, name, mode, uid, gid, NULL, rdev, ret);
}

struct link_arg {
	ckpt_ns *ns;
	uint64_t ino, newparent;
	const char *newname;
	struct ckpt_inode *ret;
};

static int link_txn(ckpt_txn *t, void *arg)
{
	struct link_arg *a = arg;
	ckpt_ns *ns = a->ns;
	struct ckpt_inode dir, in;
	int r = get_dir(ns, t, a->newparent, &dir);

	if (r < 0 || (r = ckpt_meta_get_inode(ns->eng, t, a->ino, &in)) < 0)
		return r;
	if (S_ISDIR(in.mode))
		return -EPERM;
	if ((r = name_free(ns, t, a->newparent, a->newname)) < 0)
		return r;
	if (in.nlink == 0)
		put_orphan(ns, t, a->ino, false);
	in.nlink++;
	in.ctime_ns = ckpt_now_ns();
	ckpt_meta_put_inode(t, &in);
	put_dentry(t, a->newparent, a->newname, a->ino, in.mode);
	dir.mtime_ns = dir.ctime_ns = in.ctime_ns;
	ckpt_meta_put_inode(t, &dir);
	*a->ret = in;
	return 0;
}

int ckpt_ns_link(ckpt_ns *ns, uint64_t ino, uint64_t newparent, const char *newname,
		    struct ckpt_inode *ret)
{
	struct link_arg a = { ns, ino, newparent, newname, ret };
	int r = check_name(newname);

	if (r < 0)
		return r;
	return ns_write(ns, link_txn, &a);
}

int ckpt_ns_readlink(ckpt_ns *ns, uint64_t ino, char **ret_target)
{
	uint8_t key[16];
	uint8_t *val;
	size_t vlen;
	char *t;
	int r = ckpt_engine_get(ns->eng, key, ckpt_key_ino(key, CKPT_KEY_LINK, ino), &val, &vlen);

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
static int dir_is_empty(ckpt_ns *ns, ckpt_txn *t, uint64_t ino)
{
	uint8_t prefix[9];
	const uint8_t *k, *v;
	size_t kl, vl;
	ckpt_scan *it;
	int r;

	prefix[0] = CKPT_KEY_DENTRY;
	ckpt_put_be64(prefix + 1, ino);
	r = ckpt_scan_new(ns->eng, t, prefix, sizeof(prefix), NULL, 0, &it);
	if (r < 0)
		return r;
	r = ckpt_scan_next(it, &k, &kl, &v, &vl);
	ckpt_scan_free(it);
	if (r < 0)
		return r;
	return r == 0 ? 1 : 0;
}

/* Drop one name of victim (already removed from its directory in t). */
static void drop_link(ckpt_ns *ns, ckpt_txn *t, struct ckpt_inode *victim, int64_t now)
{
	if (S_ISDIR(victim->mode))
		victim->nlink = 0;
	else if (victim->nlink > 0)
		victim->nlink--;
	victim->ctime_ns = now;
	if (victim->nlink == 0)
		put_orphan(ns, t, victim->ino, true);
	ckpt_meta_put_inode(t, victim);
}

struct unlink_arg {
	ckpt_ns *ns;
	uint64_t parent;
	const char *name;
	bool rmdir;
};

static int unlink_txn(ckpt_txn *t, void *arg)
{
	struct unlink_arg *a = arg;
	ckpt_ns *ns = a->ns;
	struct ckpt_inode dir, victim;
	uint64_t ino;
	uint32_t m;
	int64_t now = ckpt_now_ns();
	int r;

	ckpt_txn_releases_space(t); /* works on a full disk (engine.h) */
	r = get_dir(ns, t, a->parent, &dir);
	if (r < 0)
		return r;
	r = get_dentry(ns, t, a->parent, a->name, &ino, &m);
	if (r < 0)
		return r;
	r = ckpt_meta_get_inode(ns->eng, t, ino, &victim);
	if (r < 0)
		return r;
	if (a->rmdir && !S_ISDIR(victim.mode))
		return -ENOTDIR;
	if (!a->rmdir && S_ISDIR(victim.mode))
		return -EISDIR;
	if (a->rmdir) {
		r = dir_is_empty(ns, t, ino);
		if (r < 0)
			return r;
		if (r == 0)
			return -ENOTEMPTY;
		dir.nlink--;
	}
	delete_dentry(t, a->parent, a->name);
	drop_link(ns, t, &victim, now);
	dir.mtime_ns = dir.ctime_ns = now;
	ckpt_meta_put_inode(t, &dir);
	return 0;
}

int ckpt_ns_unlink(ckpt_ns *ns, uint64_t parent, const char *name, bool rmdir)
{
	struct unlink_arg a = { ns, parent, name, rmdir };
	int r = check_name(name);

	if (r < 0)
		return r;
	return ns_write(ns, unlink_txn, &a);
}

/* Is `anc` an ancestor of (or equal to) dir `ino`?  Reads in t. */
static int is_ancestor(ckpt_ns *ns, ckpt_txn *t, uint64_t anc, uint64_t ino)
{
	for (int depth = 0; depth < 4096; depth++) {
		struct ckpt_inode in;
		int r;

		if (ino == anc)
			return 1;
		if (ino == CKPT_ROOT_INO)
			return 0;
		r = ckpt_meta_get_inode(ns->eng, t, ino, &in);
		if (r < 0)
			return r;
		ino = in.parent;
	}
	return -ELOOP;
}

struct rename_arg {
	ckpt_ns *ns;
	uint64_t parent, newparent;
	const char *name, *newname;
	unsigned flags;
};

static int rename_txn(ckpt_txn *t, void *arg)
{
	struct rename_arg *a = arg;
	ckpt_ns *ns = a->ns;
	uint64_t parent = a->parent, newparent = a->newparent;
	const char *name = a->name, *newname = a->newname;
	unsigned flags = a->flags;
	struct ckpt_inode pdir, ndir, src, dst;
	bool have_dst = false, same_dir = parent == newparent;
	uint64_t sino, dino;
	uint32_t m;
	int64_t now = ckpt_now_ns();
	int r;

	if ((r = get_dir(ns, t, parent, &pdir)) < 0 || (r = get_dir(ns, t, newparent, &ndir)) < 0)
		goto out;
	if ((r = get_dentry(ns, t, parent, name, &sino, &m)) < 0)
		goto out;
	if ((r = ckpt_meta_get_inode(ns->eng, t, sino, &src)) < 0)
		goto out;
	r = get_dentry(ns, t, newparent, newname, &dino, &m);
	if (r == 0) {
		have_dst = true;
		if ((r = ckpt_meta_get_inode(ns->eng, t, dino, &dst)) < 0)
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
		r = is_ancestor(ns, t, sino, newparent);
		if (r < 0)
			goto out;
		if (r) {
			r = -EINVAL;
			goto out;
		}
	}
	if ((flags & RENAME_EXCHANGE) && S_ISDIR(dst.mode) && !same_dir) {
		r = is_ancestor(ns, t, dino, parent);
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
			r = dir_is_empty(ns, t, dino);
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
			ckpt_meta_put_inode(t, &dst);
		} else {
			delete_dentry(t, parent, name);
			put_dentry(t, newparent, newname, sino, src.mode);
			if (have_dst) {
				drop_link(ns, t, &dst, now);
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
		ckpt_meta_put_inode(t, &src);
		if (same_dir) {
			pdir.nlink = (uint32_t)((int64_t)pdir.nlink + pdelta + ndelta);
			pdir.mtime_ns = pdir.ctime_ns = now;
			ckpt_meta_put_inode(t, &pdir);
		} else {
			pdir.nlink = (uint32_t)((int64_t)pdir.nlink + pdelta);
			ndir.nlink = (uint32_t)((int64_t)ndir.nlink + ndelta);
			pdir.mtime_ns = pdir.ctime_ns = now;
			ndir.mtime_ns = ndir.ctime_ns = now;
			ckpt_meta_put_inode(t, &pdir);
			ckpt_meta_put_inode(t, &ndir);
		}
	}
	r = 0;
out:
	return r;
}


int ckpt_ns_rename(ckpt_ns *ns, uint64_t parent, const char *name, uint64_t newparent,
		      const char *newname, unsigned flags)
{
	struct rename_arg a = { ns, parent, newparent, name, newname, flags };
	int r;

	if ((r = check_name(name)) < 0 || (r = check_name(newname)) < 0)
		return r;
	if (flags & ~(unsigned)(RENAME_NOREPLACE | RENAME_EXCHANGE))
		return -EINVAL;
	if ((flags & RENAME_NOREPLACE) && (flags & RENAME_EXCHANGE))
		return -EINVAL;
	return ns_write(ns, rename_txn, &a);
}

struct reap_arg {
	ckpt_ns *ns;
	uint64_t ino;
	ckpt_ns_release_fn release;
	void *release_arg;
	bool gone;
};

static int reap_txn(ckpt_txn *t, void *arg)
{
	struct reap_arg *a = arg;
	ckpt_ns *ns = a->ns;
	struct ckpt_extent_list *old = NULL;
	struct ckpt_inode in;
	uint8_t key[16];
	int r;

	ckpt_txn_releases_space(t); /* works on a full disk (engine.h) */
	r = ckpt_txn_has(t, key, ckpt_key_ino(key, CKPT_KEY_ORPHAN, a->ino), CKPT_TXN_FOR_UPDATE);
	a->gone = false;
	if (r <= 0)
		return r < 0 ? r : 1;
	r = ckpt_meta_get_inode(ns->eng, t, a->ino, &in);
	if (r == 0 && in.nlink > 0) {
		put_orphan(ns, t, a->ino, false); /* stale marker */
		return 0;
	}
	if (r == 0 && S_ISREG(in.mode) && a->release) {
		r = ckpt_meta_get_extents(ns->eng, t, a->ino, &old);
		if (r == 0)
			r = a->release(a->release_arg, t, old);
		ckpt_extent_list_free(old);
		if (r < 0)
			return r;
	}
	ckpt_txn_delete(t, key, ckpt_key_ino(key, CKPT_KEY_INODE, a->ino));
	ckpt_txn_delete(t, key, ckpt_key_ino(key, CKPT_KEY_FILE, a->ino));
	ckpt_txn_delete(t, key, ckpt_key_ino(key, CKPT_KEY_LINK, a->ino));
	ckpt_txn_delete(t, key, ckpt_key_ino(key, CKPT_KEY_PARSED, a->ino));
	put_orphan(ns, t, a->ino, false);
	a->gone = true;
	return 0;
}

int ckpt_ns_reap(ckpt_ns *ns, uint64_t ino, ckpt_ns_release_fn release, void *arg,
		 bool *ret_gone)
{
	struct reap_arg a = { ns, ino, release, arg, false };
	int r;

	*ret_gone = false;
	if (!ns->writable)
		return 0;
	pthread_mutex_lock(ns->lock);
	r = ckpt_txn_run(ns->eng, reap_txn, &a, false);
	pthread_mutex_unlock(ns->lock);
	*ret_gone = r == 0 && a.gone;
	return r;
}

uint32_t ckpt_mode_kill_suidgid(uint32_t mode)
{
	mode &= ~(uint32_t)S_ISUID;
	if (mode & S_IXGRP)
		mode &= ~(uint32_t)S_ISGID;
	return mode;
}

struct setattr_arg {
	ckpt_ns *ns;
	uint64_t ino;
	unsigned what;
	const struct ckpt_inode *in;
	struct ckpt_inode cur;
};

static int setattr_txn(ckpt_txn *t, void *arg)
{
	struct setattr_arg *a = arg;
	ckpt_ns *ns = a->ns;
	const struct ckpt_inode *in = a->in;
	unsigned what = a->what;
	int r = ckpt_meta_get_inode(ns->eng, t, a->ino, &a->cur);

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
	if (what & CKPT_SET_KILL_SUIDGID)
		a->cur.mode = ckpt_mode_kill_suidgid(a->cur.mode);
	if (what & CKPT_SET_KILL_SGID)
		a->cur.mode &= ~(uint32_t)S_ISGID;
	a->cur.ctime_ns = (what & CKPT_SET_CTIME) ? in->ctime_ns : ckpt_now_ns();
	ckpt_meta_put_inode(t, &a->cur);
	return 0;
}

int ckpt_ns_setattr(ckpt_ns *ns, uint64_t ino, unsigned what, const struct ckpt_inode *in,
		    struct ckpt_inode *ret)
{
	struct setattr_arg a = { .ns = ns, .ino = ino, .what = what, .in = in };
	int r;

	r = ns_write(ns, setattr_txn, &a);
	if (r == 0 && ret)
		*ret = a.cur;
	return r;
}

void ckpt_dirents_free(struct ckpt_dirent *ents, size_t n)
{
	for (size_t i = 0; ents && i < n; i++)
		free(ents[i].name);
	free(ents);
}

int ckpt_ns_readdir(ckpt_ns *ns, uint64_t ino, struct ckpt_dirent **ret_ents,
		       size_t *ret_n)
{
	struct ckpt_dirent *v = NULL;
	size_t n = 0, cap = 0;
	uint8_t prefix[9];
	const uint8_t *k, *val;
	const char *name;
	size_t kl, vl, namelen;
	uint64_t parent;
	ckpt_scan *it = NULL;
	int r;

	prefix[0] = CKPT_KEY_DENTRY;
	ckpt_put_be64(prefix + 1, ino);
	r = ckpt_scan_new(ns->eng, NULL, prefix, sizeof(prefix), NULL, 0, &it);
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
		if (r == 0)
			r = ckpt_key_dentry_decode(k, kl, &parent, &name, &namelen);
		if (r < 0)
			break;
		v[n].name = strndup(name, namelen);
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

char *ckpt_ns_path_of(ckpt_ns *ns, uint64_t ino)
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

		if (ckpt_meta_get_inode(ns->eng, NULL, cur, &in) < 0 || !S_ISDIR(in.mode) ||
		    ckpt_meta_get_inode(ns->eng, NULL, in.parent, &pin) < 0 ||
		    ckpt_ns_readdir(ns, in.parent, &ents, &n) < 0) {
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
