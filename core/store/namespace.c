/* SPDX-License-Identifier: MIT */
/*
 * namespace.c - the store's namespace calls: the namespace of meta/ns.h,
 * with what only the store knows added: the overlay (content closed but
 * not yet indexed: getattr shows it, rename indexes it first, utimens
 * updates it), the release of an orphan's chunks, and statfs of the chunk
 * backend.
 */
#include "store/store_int.h"

int ckpt_store_getattr(ckpt_store *s, uint64_t ino, struct ckpt_inode *ret)
{
	struct commit *c;
	uint64_t size = 0;
	uint32_t flags = 0;
	int64_t mtime_ns = 0;
	bool pending;
	int r;

	/* The overlay first, then the index: an entry leaves the overlay only
	 * once the index holds its content or newer (commit.c), so a closed
	 * file's size is never read from the index before its commit reached
	 * it (reading in the other order, a flush between the two reads gave
	 * the size before the close) */
	pthread_mutex_lock(&s->overlay_lock);
	c = st_overlay_find_locked(s, ino);
	pending = c != NULL;
	if (c) {
		size = c->list->size;
		flags = c->flags;
		mtime_ns = c->mtime_ns;
	}
	pthread_mutex_unlock(&s->overlay_lock);
	r = ckpt_meta_get_inode(s->eng, NULL, ino, ret);
	if (r < 0 || !S_ISREG(ret->mode) || !pending)
		return r;
	ret->size = size;
	ret->flags = flags;
	ret->mtime_ns = mtime_ns;
	if (ret->ctime_ns < mtime_ns)
		ret->ctime_ns = mtime_ns;
	return 0;
}

int ckpt_store_lookup(ckpt_store *s, uint64_t parent, const char *name, struct ckpt_inode *ret)
{
	uint64_t ino;
	int r = ckpt_ns_lookup(s->ns, parent, name, &ino);

	if (r < 0)
		return r;
	return ckpt_store_getattr(s, ino, ret);
}

int ckpt_store_mknode(ckpt_store *s, uint64_t parent, const char *name, uint32_t mode,
		      uint32_t uid, uint32_t gid, const char *symlink_target,
		      struct ckpt_inode *ret)
{
	return ckpt_ns_mknode(s->ns, parent, name, mode, uid, gid, symlink_target, ret);
}

int ckpt_store_mknod(ckpt_store *s, uint64_t parent, const char *name, uint32_t mode,
		     uint32_t uid, uint32_t gid, uint64_t rdev, struct ckpt_inode *ret)
{
	return ckpt_ns_mknod(s->ns, parent, name, mode, uid, gid, rdev, ret);
}

int ckpt_store_link(ckpt_store *s, uint64_t ino, uint64_t newparent, const char *newname,
		    struct ckpt_inode *ret)
{
	return ckpt_ns_link(s->ns, ino, newparent, newname, ret);
}

int ckpt_store_readlink(ckpt_store *s, uint64_t ino, char **ret_target)
{
	return ckpt_ns_readlink(s->ns, ino, ret_target);
}

int ckpt_store_unlink(ckpt_store *s, uint64_t parent, const char *name, bool rmdir)
{
	return ckpt_ns_unlink(s->ns, parent, name, rmdir);
}

int ckpt_store_rename(ckpt_store *s, uint64_t parent, const char *name, uint64_t newparent,
		      const char *newname, unsigned flags)
{
	/* Publishing by rename (save under a temporary name, then rename) must
	 * not publish a name whose content is only in memory: index the closed
	 * files first, so that a daemon crash after rename() returned cannot
	 * leave the new name pointing at old or empty content. */
	int r = st_overlay_flush_if_any(s);

	if (r < 0)
		return r;
	return ckpt_ns_rename(s->ns, parent, name, newparent, newname, flags);
}

/* An orphan's chunks lose the references of its extent list, in the reap's
 * transaction. */
static int release_extents(void *arg, ckpt_txn *t, const struct ckpt_extent_list *old)
{
	ckpt_store *s = arg;
	struct ckpt_refdelta *dv = NULL;
	size_t ndv = 0;
	int r = ckpt_refdelta_build(NULL, old, &dv, &ndv);

	if (r == 0)
		r = ckpt_refdelta_apply(&s->cenv, t, dv, ndv);
	free(dv);
	return r;
}

int ckpt_store_reap(ckpt_store *s, uint64_t ino)
{
	bool gone = false;
	int r;

	if (s->opts.mode != CKPT_STORE_RW)
		return 0;
	pthread_mutex_lock(&s->commit_lock);
	r = ckpt_ns_reap(s->ns, ino, release_extents, s, &gone);
	if (r == 0 && gone)
		st_commit_discard(s, st_overlay_take(s, ino)); /* content of a deleted file */
	pthread_mutex_unlock(&s->commit_lock);
	if (r == 0 && gone)
		st_bg_kick(s); /* its chunks may be garbage now */
	return r;
}

int ckpt_store_setattr(ckpt_store *s, uint64_t ino, unsigned what, const struct ckpt_inode *in,
		       struct ckpt_inode *ret)
{
	struct ckpt_inode cur;
	int r = ckpt_ns_setattr(s->ns, ino, what, in, &cur);

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
	return r;
}

int ckpt_store_readdir(ckpt_store *s, uint64_t ino, struct ckpt_dirent **ret_ents,
		       size_t *ret_n)
{
	return ckpt_ns_readdir(s->ns, ino, ret_ents, ret_n);
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
	return ckpt_ns_path_of(s->ns, ino);
}
