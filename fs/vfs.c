/* SPDX-License-Identifier: MIT */
/*
 * vfs.c - the VFS layer (see vfs.h).
 *
 * Dispatch: a request on an inode goes to the tree of that inode, one on a
 * name to the tree of (parent, name) (a view root under the store root is
 * in the view trees), one on an open file to the tree that opened it.  A
 * change touching two places (link, rename) goes to the view trees if
 * either place is theirs: they refuse it.
 */
#include "vfs.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/metrics.h"
#include "base/util.h"
#include "ctltree.h"
#include "stree.h"

/* A kernel cache invalidation (see vfs_inval_fn). */
struct inval {
	uint64_t ino;
	uint64_t off, len;
};

struct vfs {
	struct vfs_config c;
	struct tree *store;  /* the store tree */
	struct vtree *vt;    /* the view trees */
	struct tree *views;  /* vtree_tree(vt) */
	struct tree *ctl;    /* the control tree, /.ckptfs */
	/* Set by vfs_set_direct before the first open. */
	bool direct_views, direct_files;
	unsigned ra_streams; /* open direct_io read-only files (atomic) */
	/* Kernel cache invalidations, sent by their own thread. */
	vfs_inval_fn *inval_fn; /* set before the thread starts */
	void *inval_ctx;
	pthread_mutex_t inval_lock;
	pthread_cond_t inval_cond;
	struct inval *inval;    /* protected by inval_lock */
	size_t ninval, cap_inval;
	bool inval_stop;
	pthread_t inval_thread;
	bool inval_started;
};

/* ------------------------------------------------------- invalidations */

static void queue_inval_range(struct vfs *v, uint64_t ino, uint64_t off, uint64_t len)
{
	pthread_mutex_lock(&v->inval_lock);
	if (!v->inval_started)
		goto out; /* nothing would send it */
	if (v->ninval == v->cap_inval) {
		size_t nc = v->cap_inval ? v->cap_inval * 2 : 64;
		struct inval *q = realloc(v->inval, nc * sizeof(*q));
		if (!q)
			goto out; /* best effort: attributes expire, pages are dropped at open */
		v->inval = q;
		v->cap_inval = nc;
	}
	v->inval[v->ninval++] = (struct inval){ ino, off, len };
	pthread_cond_signal(&v->inval_cond);
out:
	pthread_mutex_unlock(&v->inval_lock);
}

static void *inval_main(void *arg)
{
	struct vfs *v = arg;

	pthread_mutex_lock(&v->inval_lock);
	while (!v->inval_stop) {
		while (v->ninval > 0) {
			struct inval iv = v->inval[--v->ninval];
			pthread_mutex_unlock(&v->inval_lock);
			v->inval_fn(v->inval_ctx, iv.ino, iv.off, iv.len);
			pthread_mutex_lock(&v->inval_lock);
		}
		pthread_cond_wait(&v->inval_cond, &v->inval_lock);
	}
	pthread_mutex_unlock(&v->inval_lock);
	return NULL;
}

void vfs_start_inval(struct vfs *v, vfs_inval_fn *fn, void *ctx)
{
	v->inval_fn = fn;
	v->inval_ctx = ctx;
	if (pthread_create(&v->inval_thread, NULL, inval_main, v) == 0)
		v->inval_started = true;
	else
		ckpt_warn("cannot start the kernel cache invalidation thread: no drop-behind");
}

void vfs_stop_inval(struct vfs *v)
{
	if (!v->inval_started)
		return;
	pthread_mutex_lock(&v->inval_lock);
	v->inval_stop = true;
	v->ninval = 0;
	pthread_cond_signal(&v->inval_cond);
	pthread_mutex_unlock(&v->inval_lock);
	pthread_join(v->inval_thread, NULL);
	v->inval_started = false;
}

/* ------------------------------------------------ store tree's changes */

static void store_changed(void *ctx)
{
	struct vfs *v = ctx;

	vtree_changed(v->vt);
}

/* After new content of ino was committed: views recheck their sources, and
 * the kernel's cached attributes and pages of ino are dropped.  A read-only
 * file that read past its snapshot's end made the kernel shrink its idea of
 * the size; without this, a reopen within the attribute timeout would see
 * that stale size. */
static void store_committed(void *ctx, uint64_t ino, bool sync)
{
	struct vfs *v = ctx;

	vtree_changed(v->vt);
	vtree_prefetch(v->vt, ino);
	if (!sync)
		queue_inval_range(v, ino, 0, 0);
	else if (v->inval_fn)
		v->inval_fn(v->inval_ctx, ino, 0, 0);
}

/* ----------------------------------------------------------- lifecycle */

int vfs_new(const struct vfs_config *c, struct vfs **ret)
{
	struct vfs *v = calloc(1, sizeof(*v));
	struct stree_hooks hooks = { .changed = store_changed, .committed = store_committed };
	int r;

	if (!v)
		return -ENOMEM;
	v->c = *c;
	hooks.ctx = v;
	pthread_mutex_init(&v->inval_lock, NULL);
	pthread_cond_init(&v->inval_cond, NULL);
	r = vtree_new(c->store, c->rules, c->view_cache, &v->vt);
	if (r == 0)
		r = stree_new(c->store, c->pool, &hooks, &v->store);
	if (r == 0)
		r = ctltree_new(c->store, &v->ctl);
	if (r < 0) {
		vfs_free(v);
		return r;
	}
	v->views = vtree_tree(v->vt);
	*ret = v;
	return 0;
}

void vfs_free(struct vfs *v)
{
	if (!v)
		return;
	vfs_stop_inval(v);
	stree_free(v->store);
	vtree_free(v->vt);
	ctltree_free(v->ctl);
	free(v->inval);
	pthread_cond_destroy(&v->inval_cond);
	pthread_mutex_destroy(&v->inval_lock);
	free(v);
}

void vfs_set_direct(struct vfs *v, bool views, bool files)
{
	v->direct_views = views;
	v->direct_files = files;
}

void vfs_commit_all(struct vfs *v)
{
	stree_commit_all(v->store);
}

void vfs_get_view_stats(struct vfs *v, struct vtree_stats *ret)
{
	vtree_get_stats(v->vt, ret);
}

/* ------------------------------------------------------------ dispatch */

static struct tree *tree_of_ino(struct vfs *v, uint64_t ino)
{
	if (ctl_is_ino(ino))
		return v->ctl;
	return vtree_is_virtual(ino) ? v->views : v->store;
}

static struct tree *tree_of_name(struct vfs *v, uint64_t parent, const char *name)
{
	if (ctl_is_name(parent, name))
		return v->ctl;
	return vtree_is_virtual(parent) || vtree_is_view_name(parent, name) ? v->views : v->store;
}

/* The tree of a change touching two places (see the top of this file). */
static struct tree *tree_of_both(struct vfs *v, struct tree *a, struct tree *b)
{
	if (a == v->ctl || b == v->ctl)
		return v->ctl;
	return a == v->views ? a : b;
}

/*
 * Failures of the store tree are logged here, naming the file and the
 * reason: those of the file system itself (I/O, space, memory, the index).
 * Answers a caller has to expect (no such name, it exists, not empty,
 * read-only, not permitted, ...) are not logged: tools make them by the
 * thousand; the metrics count them (ckptfs_fuse_errors_total).  The view
 * trees log their own failures (vtree.c); reads and writes are logged
 * where they are made (below).
 */
static bool is_failure(int r)
{
	switch (-r) {
	case ENOENT: case EEXIST: case ENOTEMPTY: case ENOTDIR: case EISDIR: case EROFS:
	case EPERM: case EACCES: case EXDEV: case EINVAL: case ENAMETOOLONG: case ELOOP:
	case EBADF: case EMLINK: case ENODATA: case EOPNOTSUPP: case ENOSYS: case EINTR:
		return false;
	default:
		return r < 0;
	}
}

/* r, logged if is_failure(r): "PATH[/NAME]: WHAT failed: REASON". */
static int logged(struct vfs *v, struct tree *t, uint64_t ino, const char *name,
		  const char *what, int r)
{
	char *path;
	const char *p;

	if (t != v->store || !is_failure(r))
		return r;
	path = t->ops->path(t, ino);
	p = path ? path : "?";
	if (name)
		ckpt_err("%s/%s: %s failed: %s", strcmp(p, "/") ? p : "", name, what, strerror(-r));
	else
		ckpt_err("%s: %s failed: %s", p, what, strerror(-r));
	free(path);
	return r;
}

int vfs_lookup(struct vfs *v, uint64_t parent, const char *name, struct tree_entry *ret)
{
	struct tree *t = tree_of_name(v, parent, name);

	return logged(v, t, parent, name, "lookup", t->ops->lookup(t, parent, name, ret));
}

void vfs_forget(struct vfs *v, uint64_t ino, uint64_t nlookup)
{
	struct tree *t = tree_of_ino(v, ino);

	t->ops->forget(t, ino, nlookup);
}

int vfs_getattr(struct vfs *v, uint64_t ino, struct ckpt_inode *ret, double *ret_timeout)
{
	struct tree *t = tree_of_ino(v, ino);

	return logged(v, t, ino, NULL, "getattr", t->ops->getattr(t, ino, ret, ret_timeout));
}

int vfs_setattr(struct vfs *v, uint64_t ino, unsigned what, const struct ckpt_inode *in,
		struct ckpt_inode *ret, double *ret_timeout)
{
	struct tree *t = tree_of_ino(v, ino);
	int r = t->ops->setattr(t, ino, what, in);

	if (r == 0)
		r = t->ops->getattr(t, ino, ret, ret_timeout);
	return logged(v, t, ino, NULL, "setattr", r);
}

/* The kernel caches attributes (and refreshes them after a write or a
 * truncate, but not their mode): without the invalidation a stat right
 * after the write would still show the bits.  Only attributes are dropped,
 * which takes no lock a request in flight holds. */
int vfs_kill_suidgid(struct vfs *v, uint64_t ino, vfs_in_group_fn *in_group, void *ctx)
{
	struct tree *t = tree_of_ino(v, ino);
	struct ckpt_inode in;
	unsigned what = CKPT_SET_KILL_SUIDGID;
	double timeout;
	int r = t->ops->getattr(t, ino, &in, &timeout);

	if (r < 0)
		goto out;
	/* S_ISGID without S_IXGRP (no set-group-ID execution) goes only for a
	 * caller outside the file's group, as the kernel decides for local
	 * file systems (setattr_should_drop_sgid) */
	if ((in.mode & (S_ISGID | S_IXGRP)) == S_ISGID && !in_group(ctx, in.gid))
		what |= CKPT_SET_KILL_SGID;
	if (ckpt_mode_kill_suidgid(in.mode) == in.mode && !(what & CKPT_SET_KILL_SGID))
		return 0; /* the common case: nothing to clear */
	r = t->ops->setattr(t, ino, what, &in);
	if (r == 0 && v->inval_fn)
		v->inval_fn(v->inval_ctx, ino, VFS_INVAL_ATTR, 0);
out:
	if (r < 0) {
		char *path = t->ops->path(t, ino);
		ckpt_err("%s: cannot clear the set-user-ID/set-group-ID bits: %s",
			 path ? path : "?", strerror(-r));
		free(path);
	}
	return r;
}

int vfs_readlink(struct vfs *v, uint64_t ino, char **ret_target)
{
	struct tree *t = tree_of_ino(v, ino);

	return logged(v, t, ino, NULL, "readlink", t->ops->readlink(t, ino, ret_target));
}

int vfs_readdir(struct vfs *v, uint64_t ino, struct ckpt_dirent **ret_ents, size_t *ret_n)
{
	struct tree *t = tree_of_ino(v, ino);

	return logged(v, t, ino, NULL, "readdir", t->ops->readdir(t, ino, ret_ents, ret_n));
}

int vfs_mknode(struct vfs *v, uint64_t parent, const char *name, uint32_t mode, uint32_t uid,
	       uint32_t gid, const char *target, uint64_t rdev, struct tree_entry *ret)
{
	struct tree *t = tree_of_name(v, parent, name);

	return logged(v, t, parent, name, "create",
		      t->ops->mknode(t, parent, name, mode, uid, gid, target, rdev, ret));
}

int vfs_link(struct vfs *v, uint64_t ino, uint64_t newparent, const char *newname,
	     struct tree_entry *ret)
{
	struct tree *t = tree_of_both(v, tree_of_ino(v, ino), tree_of_name(v, newparent, newname));

	return logged(v, t, newparent, newname, "link",
		      t->ops->link(t, ino, newparent, newname, ret));
}

int vfs_unlink(struct vfs *v, uint64_t parent, const char *name, bool dir)
{
	struct tree *t = tree_of_name(v, parent, name);

	return logged(v, t, parent, name, dir ? "rmdir" : "unlink",
		      t->ops->unlink(t, parent, name, dir));
}

int vfs_rename(struct vfs *v, uint64_t parent, const char *name, uint64_t newparent,
	       const char *newname, unsigned flags)
{
	struct tree *t = tree_of_both(v, tree_of_name(v, parent, name),
				      tree_of_name(v, newparent, newname));

	return logged(v, t, parent, name, "rename",
		      t->ops->rename(t, parent, name, newparent, newname, flags));
}

int vfs_sync(struct vfs *v)
{
	int r = ckpt_store_flush(v->c.store);

	if (r == 0)
		r = ckpt_store_sync_meta(v->c.store);
	return logged(v, v->store, CKPT_ROOT_INO, NULL, "sync", r);
}

int vfs_statfs(struct vfs *v, struct statvfs *ret)
{
	return logged(v, v->store, CKPT_ROOT_INO, NULL, "statfs",
		      ckpt_store_statfs(v->c.store, ret));
}

/* --------------------------------------------------------------- files */

/*
 * Files open for writing bypass the page cache (direct_io): uncommitted
 * bytes never enter the kernel's cache, where readers of the committed
 * snapshot would see them, and large writes reach the daemon without
 * page-cache copies.  The price: shared writable mmap of a file open for
 * writing is refused by the kernel (ENODEV).
 *
 * Read-only files of the view trees bypass it by default, those of the
 * store tree with -o direct_read=all, once the kernel maps such files
 * shared (wire.c): read() then moves data from the daemon straight into
 * the reader's buffer.  The price of direct_io is per request: without the
 * kernel's read-ahead every read() is a round trip to the daemon, so small
 * reads are slower.  Views are read by checkpoint loaders (large reads or
 * mmap), so they get it by default; stored files, which any tool may read,
 * keep the page cache, dropped at open and after every commit.
 */
static void set_direct(struct vfs *v, struct tree_file *f)
{
	f->direct = f->writable || f->ops->generated ||
		    ((f->ops->views ? v->direct_views : v->direct_files) && v->c.direct_granted());
	if (f->direct && !f->writable && !f->ops->generated)
		__atomic_fetch_add(&v->ra_streams, 1, __ATOMIC_RELAXED);
}

int vfs_open(struct vfs *v, uint64_t ino, int flags, struct tree_file **ret)
{
	struct tree *t = tree_of_ino(v, ino);
	int r = t->ops->open(t, ino, flags, ret);

	if (r == 0)
		set_direct(v, *ret);
	return logged(v, t, ino, NULL, "open", r);
}

int vfs_create(struct vfs *v, uint64_t parent, const char *name, uint32_t mode, uint32_t uid,
	       uint32_t gid, int flags, struct tree_entry *ret_entry, struct tree_file **ret)
{
	struct tree *t = tree_of_name(v, parent, name);
	int r = t->ops->mknode(t, parent, name, S_IFREG | mode, uid, gid, NULL, 0, ret_entry);
	int oflags = flags | O_TRUNC; /* a new file: empty anyway */

	if (r == -EEXIST && !(flags & O_EXCL) && t != v->views) {
		/* The name was created since the kernel looked it up, by another
		 * node sharing the store (on one node the kernel holds the
		 * directory's lock from that lookup to this create).  Open that
		 * file, as NFS does, if it is a regular file of the caller's own:
		 * the kernel checked the directory, not that file, so another
		 * user's file stays EEXIST. */
		r = t->ops->lookup(t, parent, name, ret_entry);
		if (r < 0)
			return r == -ENOENT ? -EEXIST : r;
		if (!S_ISREG(ret_entry->attr.mode) || (uid != 0 && ret_entry->attr.uid != uid)) {
			t->ops->forget(t, ret_entry->attr.ino, 1);
			return -EEXIST;
		}
		oflags = flags;
	}
	if (r < 0)
		return logged(v, t, parent, name, "create", r);
	r = t->ops->open(t, ret_entry->attr.ino, oflags, ret);
	if (r < 0) {
		t->ops->forget(t, ret_entry->attr.ino, 1); /* the kernel gets no entry */
		return logged(v, t, parent, name, "open of the new file", r);
	}
	set_direct(v, *ret);
	return 0;
}

void vfs_release(struct vfs *v, struct tree_file *f)
{
	if (f->direct && !f->writable && !f->ops->generated)
		__atomic_fetch_sub(&v->ra_streams, 1, __ATOMIC_RELAXED);
	f->ops->release(f);
}

/*
 * Read-ahead (store/readahead.h): a read that continues the file's previous
 * one queues the chunks of the next window for the workers before this
 * request is served, so they are read and decompressed while this request
 * and the next ones are.  Through the page cache the kernel's own
 * read-ahead (the mount's read_ahead_kb, see main.c) stays on and keeps
 * several requests in flight; the window is RA_WINDOW.  A direct_io reader
 * has one request in flight, so its window is deeper, sized by how many
 * direct_io read-only files are open (ra_streams, ckpt_ra_window_size).
 * They are counted at open, not at their first read: readers starting
 * together would otherwise all size their first window as if alone.
 */
#define RA_WINDOW (8ull << 20)
#define RA_MAX_CHUNKS 256 /* the read-ahead queue's length */

/* Returns whether the read is sequential (its chunks are then cached as
 * stream entries, see ckpt_cache_fill_as()). */
static bool read_ahead(struct vfs *v, struct tree_file *f, size_t size, uint64_t off)
{
	ckpt_digest d[RA_MAX_CHUNKS];
	uint64_t from, to, window = RA_WINDOW;
	size_t n = 0;
	bool seq = false;

	if (!v->c.ra)
		return false;
	if (f->direct)
		window = ckpt_ra_window_size(v->c.stream_cap,
					     __atomic_load_n(&v->ra_streams, __ATOMIC_RELAXED));
	if (ckpt_ra_window_next(&f->ra, off, size, f->ops->size(f), window, &from, &to, &seq))
		n = f->ops->chunks(f, from, to - from, d, RA_MAX_CHUNKS);
	ckpt_readahead_submit(v->c.ra, d, n);
	return seq;
}

/*
 * Drop-behind: once a sequential reader (read_ahead() says so) is
 * DROP_LAG + DROP_STEP bytes into a file, the kernel's cached pages more
 * than DROP_LAG behind it are dropped, DROP_STEP at a time, by a range
 * invalidation from the invalidation thread.  A checkpoint is read once:
 * keeping every page of a large load in the page cache only pushes out what
 * the node needs, and where the host reclaims memory the guest frees
 * (virtio-balloon free page reporting) each page of fresh page cache costs
 * a host page fault on first touch, which a reader that recycles the pages
 * it drops avoids.  Not done
 * while another file of the inode is open (concurrent readers share the
 * page cache); a reopen re-reads from the daemon anyway, since opens drop
 * the cache.  Off with -o drop_behind=0.
 */
#define DROP_LAG (32ull << 20)
#define DROP_STEP (32ull << 20)

static void drop_behind(struct vfs *v, struct tree_file *f, size_t size, uint64_t off)
{
	uint64_t end = off + size, to, done;

	if (!v->c.drop_behind || !v->inval_started || end < DROP_LAG + DROP_STEP)
		return; /* (without the thread nothing would drain the queue) */
	to = (end - DROP_LAG) & ~(uint64_t)4095;
	done = __atomic_load_n(&f->dropped, __ATOMIC_RELAXED);
	if (to < done + DROP_STEP)
		return;
	if (!__atomic_compare_exchange_n(&f->dropped, &done, to, false, __ATOMIC_RELAXED,
					 __ATOMIC_RELAXED))
		return; /* another thread of this reader took the step */
	if (!f->ops->shared(f))
		queue_inval_range(v, f->ino, done, to - done);
}

/*
 * Committed content is replied from the chunk cache without copying: the
 * reply's iovecs point into the pinned cache entries for long pieces
 * (struct ckpt_gather), only short pieces (views interleaving
 * tensor-parallel rows, zeros, headers) are copied into buf.  buf comes
 * from the store's buffer reserve, memory touched at mount, rather than
 * malloc's: many threads' large requests would otherwise fault fresh pages
 * in for those copies.
 */
ssize_t vfs_read(struct vfs *v, struct tree_file *f, void *buf, size_t len, uint64_t off,
		 struct ckpt_gather *g, bool *ret_gathered)
{
	const struct tree_ops *ops = f->ops;
	ssize_t r;

	*ret_gathered = false;
	if (f->writable) {
		r = ops->read(f, buf, len, off, NULL);
	} else {
		r = ops->refresh ? ops->refresh(f) : 0;
		if (r == 0) {
			g->stream = !ops->generated && read_ahead(v, f, len, off);
			r = ops->read(f, buf, len, off, g);
			*ret_gathered = true;
		}
	}
	if (r < 0) {
		char *path = ops->path(f->tree, f->ino);
		ckpt_err("%s: read of %zu bytes at offset %" PRIu64 " failed: %s%s",
			 path ? path : "?", len, off, strerror((int)-r),
			 r == -EIO ? " (damaged chunk, see above; run `ckpt fsck`)" : "");
		free(path);
	} else if (!ops->generated) {
		ckpt_metric_add(CKPT_M_READ_BYTES, (uint64_t)r);
	}
	if (r >= 0 && *ret_gathered && g->stream) {
		/* Before the reply: once it is out, the reader may close the
		 * file and its release free f on another thread. */
		drop_behind(v, f, len, off);
	}
	return r;
}

uint8_t *vfs_buf_alloc(struct vfs *v, size_t len)
{
	return ckpt_store_buf_alloc(v->c.store, len);
}

void vfs_read_done(struct vfs *v, struct ckpt_gather *g, bool gathered, uint8_t *buf,
		   size_t len)
{
	if (gathered)
		ckpt_store_gather_done(v->c.store, g);
	ckpt_store_buf_free(v->c.store, buf, len);
}

int vfs_write(struct vfs *v, struct tree_file *f, const void *buf, size_t len, uint64_t off)
{
	int r;

	if (!f->writable)
		return -EBADF;
	r = f->ops->write(f, buf, len, off);
	if (r >= 0)
		ckpt_metric_add(CKPT_M_WRITE_BYTES, len);
	if (r < 0) {
		char *path = f->ops->path(f->tree, f->ino);
		ckpt_warn("%s: write of %zu bytes at offset %" PRIu64 " failed: %s",
			  path ? path : "?", len, off, strerror(-r));
		free(path);
	}
	return r;
}

int vfs_commit(struct vfs *v, struct tree_file *f, bool durable)
{
	return f->ops->commit(f, durable);
}
