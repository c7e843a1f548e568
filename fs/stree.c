/* SPDX-License-Identifier: MIT */
/*
 * stree.c - the store tree (see stree.h).
 *
 * Page cache and writers.  The kernel keeps one page cache per inode.
 * Read-only files read the committed snapshot (close-to-open: a reader
 * never sees bytes a writer has not committed), and with the writeback
 * cache a writable file's pages hold its uncommitted bytes, which the
 * kernel writes back later; if both used the page cache at once, a reader
 * would see the writer's pages, and the writer pages a reader filled from
 * the older snapshot.  So per inode, under nodes_lock: a writable file may
 * use the page cache (tree_file.cached_write) only while no read-only file
 * counts as a page-cache reader and no writable file bypasses it; a
 * read-only file opened while any file is open for writing bypasses it
 * (tree_file.uncached_read, direct_io, served from the snapshot).  With the
 * writeback cache the kernel keeps a regular file's size itself (it no
 * longer takes a short read as the end of the file): so a reader that was
 * already open when a writer changed the size reads the committed bytes
 * with zeros up to the writer's size until the writer commits, and a
 * shared mapping of a direct_io reader (FUSE_DIRECT_IO_ALLOW_MMAP) still
 * goes through the page cache.  -o writeback_cache=0 keeps readers to the
 * committed size and bytes in every case.
 */
#include "stree.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/util.h"

/* How long the kernel may keep a store name or attributes without asking:
 * CACHE_TIMEOUT, or 0 on a node of a shared store, where another node's
 * commit changes them (close-to-open across nodes: an open revalidates the
 * path and the size, docs/cluster.md section 3). */
#define CACHE_TIMEOUT 1.0
#define NODE_BUCKETS 4096

struct node {
	uint64_t ino;
	struct node *next;
	/* Protected by stree.nodes_lock: */
	uint64_t nlookup;
	unsigned nopen;
	unsigned nwriters;
	uint64_t version;    /* bumped by every commit of new content */
	unsigned ncached_readers; /* read-only files that may use the page cache */
	unsigned ncached_writers; /* writable files that use it */
	unsigned ndirect_writers; /* writable files that bypass it */
	ckpt_writer *writer; /* non-NULL while nwriters > 0 */
	/* The writer the last release detached, while st_release commits it
	 * (outside the lock): getattr reads its size, opens wait until it is
	 * committed (closed_cond), so that nothing sees or builds on the
	 * content from before that commit. */
	ckpt_writer *closing;
	uint64_t parent;     /* last name the kernel looked this inode up by, */
	char *name;          /* for messages only (may be stale after rename) */
};

/* An open file.  snap is the extent list of version `version` (read-only
 * files); snap_lock guards its swap. */
struct sfile {
	struct tree_file f; /* first: the tree ops get &f */
	struct node *node;
	pthread_rwlock_t snap_lock;
	struct ckpt_extent_list *snap;
	uint64_t version;
	/* Read-only files of a node of a shared store: what the file read is
	 * kept from gc beside other nodes while it is open (docs/cluster.md
	 * section 7.1); NULL otherwise. */
	ckpt_hold *hold;
};

struct stree {
	struct tree tree; /* first */
	ckpt_store *s;
	ckpt_pool *pool;
	struct stree_hooks hooks;
	pthread_mutex_t nodes_lock;
	struct node *nodes[NODE_BUCKETS]; /* protected by nodes_lock */
	pthread_cond_t closed_cond;       /* a node's `closing` went (nodes_lock) */
	bool writeback; /* the kernel's writeback cache is on (set before opens) */
	double timeout; /* entry and attribute timeout (CACHE_TIMEOUT or 0), fixed */
};

static const struct tree_ops stree_ops;

static struct stree *stree_of(struct tree *t)
{
	return (struct stree *)t;
}

static struct sfile *sfile_of(struct tree_file *f)
{
	return (struct sfile *)f;
}

/* --------------------------------------------------------------- nodes */

static struct node **node_slot(struct stree *st, uint64_t ino)
{
	return &st->nodes[ino % NODE_BUCKETS];
}

/* Caller holds nodes_lock. */
static struct node *node_find_locked(struct stree *st, uint64_t ino)
{
	struct node *n = *node_slot(st, ino);

	while (n && n->ino != ino)
		n = n->next;
	return n;
}

/* Caller holds nodes_lock. */
static struct node *node_get_locked(struct stree *st, uint64_t ino)
{
	struct node *n = node_find_locked(st, ino);

	if (n)
		return n;
	n = calloc(1, sizeof(*n));
	if (!n)
		return NULL;
	n->ino = ino;
	n->next = *node_slot(st, ino);
	*node_slot(st, ino) = n;
	return n;
}

/* Free an unused node; returns true if it was freed.  Caller holds lock. */
static bool node_put_locked(struct stree *st, struct node *n)
{
	struct node **pp;

	if (n->nlookup > 0 || n->nopen > 0)
		return false;
	for (pp = node_slot(st, n->ino); *pp != n; pp = &(*pp)->next)
		;
	*pp = n->next;
	free(n->name);
	free(n);
	return true;
}

static void node_release_maybe_reap(struct stree *st, uint64_t ino, bool freed)
{
	if (freed) {
		int r = ckpt_store_reap(st->s, ino);
		if (r < 0)
			ckpt_err("cannot delete unlinked inode %" PRIu64 ": %s", ino, strerror(-r));
	}
}

/* Wait until no release of ino is committing its writer (node.closing), so
 * that a change of ino's attributes or size is not based on, or undone by,
 * the content from before that commit. */
static void wait_closed(struct stree *st, uint64_t ino)
{
	struct node *n;
	bool freed = false;

	pthread_mutex_lock(&st->nodes_lock);
	n = node_find_locked(st, ino);
	if (n && n->closing) {
		n->nopen++; /* keeps n while waiting */
		while (n->closing)
			pthread_cond_wait(&st->closed_cond, &st->nodes_lock);
		n->nopen--;
		freed = node_put_locked(st, n);
	}
	pthread_mutex_unlock(&st->nodes_lock);
	node_release_maybe_reap(st, ino, freed);
}

/* "DIR/NAME" of ino for messages (malloc'd). */
static char *node_path(struct stree *st, uint64_t ino)
{
	struct node *n;
	uint64_t parent = 0;
	char *name = NULL, *dir, *path = NULL;

	pthread_mutex_lock(&st->nodes_lock);
	n = node_find_locked(st, ino);
	if (n && n->name) {
		parent = n->parent;
		name = strdup(n->name);
	}
	pthread_mutex_unlock(&st->nodes_lock);
	if (!name) {
		if (asprintf(&path, "<inode %" PRIu64 ">", ino) < 0)
			path = NULL;
		return path;
	}
	dir = ckpt_store_path_of(st->s, parent);
	if (asprintf(&path, "%s%s%s", dir ? dir : "?", dir && !strcmp(dir, "/") ? "" : "/",
		     name) < 0)
		path = NULL;
	free(dir);
	free(name);
	return path;
}

static char *st_path(struct tree *t, uint64_t ino)
{
	return node_path(stree_of(t), ino);
}

static void bump_version(struct stree *st, uint64_t ino)
{
	struct node *n;

	pthread_mutex_lock(&st->nodes_lock);
	n = node_find_locked(st, ino);
	if (n)
		n->version++;
	pthread_mutex_unlock(&st->nodes_lock);
}

/* Commit a writer; on a change, make open readers switch to the new
 * content and tell the hooks (sync: see stree_hooks.committed). */
static int commit_writer(struct stree *st, uint64_t ino, ckpt_writer *w, bool durable,
			 bool sync)
{
	bool dirty = ckpt_writer_dirty(w);
	int r = ckpt_writer_commit(w, durable);

	if (r == 0 && dirty) {
		bump_version(st, ino);
		st->hooks.committed(st->hooks.ctx, ino, sync);
	}
	return r;
}

/* Attributes with the live size/mtime of an open writer applied. */
static int get_attr(struct stree *st, uint64_t ino, struct ckpt_inode *in)
{
	struct node *n;
	int r = ckpt_store_getattr(st->s, ino, in);

	if (r < 0)
		return r;
	pthread_mutex_lock(&st->nodes_lock);
	n = node_find_locked(st, ino);
	if (n && (n->writer || n->closing)) {
		ckpt_writer *w = n->writer ? n->writer : n->closing;
		in->size = ckpt_writer_size(w);
		in->mtime_ns = ckpt_writer_mtime(w);
		if (in->ctime_ns < in->mtime_ns)
			in->ctime_ns = in->mtime_ns;
	}
	pthread_mutex_unlock(&st->nodes_lock);
	return 0;
}

/* The entry of in as parent/name, counting one kernel lookup. */
static int make_entry(struct stree *st, uint64_t parent, const char *name,
		      const struct ckpt_inode *in, struct tree_entry *e)
{
	struct node *n;

	memset(e, 0, sizeof(*e));
	e->attr = *in;
	pthread_mutex_lock(&st->nodes_lock);
	n = node_get_locked(st, in->ino);
	if (n) {
		n->nlookup++;
		if (!n->name || n->parent != parent || strcmp(n->name, name)) {
			free(n->name);
			n->name = strdup(name);
			n->parent = parent;
		}
		if (n->writer || n->closing) {
			ckpt_writer *w = n->writer ? n->writer : n->closing;
			e->attr.size = ckpt_writer_size(w);
			e->attr.mtime_ns = ckpt_writer_mtime(w);
		}
	}
	pthread_mutex_unlock(&st->nodes_lock);
	if (!n)
		return -ENOMEM;
	e->generation = in->generation;
	e->attr_timeout = st->timeout;
	e->entry_timeout = st->timeout;
	return 0;
}

/* After a namespace call that made parent/name (r its result). */
static int new_entry(struct stree *st, int r, uint64_t parent, const char *name,
		     const struct ckpt_inode *in, struct tree_entry *ret)
{
	if (r < 0)
		return r;
	st->hooks.changed(st->hooks.ctx);
	return make_entry(st, parent, name, in, ret);
}

/* After a namespace call that changed names (r its result). */
static int changed(struct stree *st, int r)
{
	if (r == 0)
		st->hooks.changed(st->hooks.ctx);
	return r;
}

/* ----------------------------------------------------------- namespace */

static int st_lookup(struct tree *t, uint64_t parent, const char *name, struct tree_entry *ret)
{
	struct stree *st = stree_of(t);
	struct ckpt_inode in;
	int r = ckpt_store_lookup(st->s, parent, name, &in);

	return r < 0 ? r : make_entry(st, parent, name, &in, ret);
}

static void st_forget(struct tree *t, uint64_t ino, uint64_t nlookup)
{
	struct stree *st = stree_of(t);
	struct node *n;
	bool freed = false;

	pthread_mutex_lock(&st->nodes_lock);
	n = node_find_locked(st, ino);
	if (n) {
		n->nlookup = n->nlookup > nlookup ? n->nlookup - nlookup : 0;
		freed = node_put_locked(st, n);
	}
	pthread_mutex_unlock(&st->nodes_lock);
	node_release_maybe_reap(st, ino, freed);
}

static int st_getattr(struct tree *t, uint64_t ino, struct ckpt_inode *ret, double *ret_timeout)
{
	*ret_timeout = stree_of(t)->timeout;
	return get_attr(stree_of(t), ino, ret);
}

/* Change the size of ino: through its open writer if any, else by a
 * short-lived writer committed at once. */
static int set_size(struct stree *st, uint64_t ino, uint64_t size)
{
	ckpt_writer *w = NULL;
	struct node *n;
	int r;

	pthread_mutex_lock(&st->nodes_lock);
	n = node_find_locked(st, ino);
	if (n && n->writer) {
		r = ckpt_writer_truncate(n->writer, size);
		pthread_mutex_unlock(&st->nodes_lock);
		return r;
	}
	pthread_mutex_unlock(&st->nodes_lock);
	r = ckpt_writer_new(st->s, st->pool, ino, size == 0, &w);
	if (r == 0)
		r = ckpt_writer_truncate(w, size);
	if (r == 0)
		r = commit_writer(st, ino, w, false, false);
	ckpt_writer_free(w);
	return r;
}

static int st_setattr(struct tree *t, uint64_t ino, unsigned what, const struct ckpt_inode *in)
{
	struct stree *st = stree_of(t);
	struct ckpt_inode cur;
	unsigned set = what & ~TREE_SET_SIZE;
	int r = 0;

	wait_closed(st, ino);
	if (what & TREE_SET_SIZE) {
		r = ckpt_store_getattr(st->s, ino, &cur);
		if (r == 0 && S_ISDIR(cur.mode))
			r = -EISDIR;
		else if (r == 0 && !S_ISREG(cur.mode))
			r = -EINVAL;
		if (r == 0)
			r = set_size(st, ino, in->size);
		if (r < 0)
			return r;
	}
	if (set & (CKPT_SET_KILL_SUIDGID | CKPT_SET_KILL_SGID)) {
		/* the common case, nothing to clear, costs no transaction */
		r = ckpt_store_getattr(st->s, ino, &cur);
		if (r < 0)
			return r;
		if (ckpt_mode_kill_suidgid(cur.mode) == cur.mode)
			set &= ~CKPT_SET_KILL_SUIDGID;
		if (!(cur.mode & S_ISGID))
			set &= ~CKPT_SET_KILL_SGID;
	}
	if (!set)
		return 0;
	if ((set & CKPT_SET_MTIME) && !(set & ~(CKPT_SET_MTIME | CKPT_SET_CTIME))) {
		/* Times alone on a file with uncommitted writes: the writeback
		 * cache sends the kernel's mtime and ctime with the written pages
		 * of every file (before its FLUSH).  The writer's commit records
		 * the mtime (and a ctime not before it): no transaction now. */
		struct node *n;
		bool held = false;
		pthread_mutex_lock(&st->nodes_lock);
		n = node_find_locked(st, ino);
		if (n && n->writer)
			held = ckpt_writer_set_mtime_if_dirty(n->writer, in->mtime_ns);
		pthread_mutex_unlock(&st->nodes_lock);
		if (held)
			return 0;
	}
	r = changed(st, ckpt_store_setattr(st->s, ino, set, in, NULL));
	if (r == 0 && (set & CKPT_SET_MTIME)) {
		struct node *n;
		pthread_mutex_lock(&st->nodes_lock);
		n = node_find_locked(st, ino);
		if (n && n->writer)
			ckpt_writer_set_mtime(n->writer, in->mtime_ns);
		pthread_mutex_unlock(&st->nodes_lock);
	}
	return r;
}

static int st_readlink(struct tree *t, uint64_t ino, char **ret_target)
{
	return ckpt_store_readlink(stree_of(t)->s, ino, ret_target);
}

static int st_readdir(struct tree *t, uint64_t ino, struct ckpt_dirent **ret_ents,
		      size_t *ret_n)
{
	struct stree *st = stree_of(t);
	struct ckpt_inode in;
	int r = ckpt_store_getattr(st->s, ino, &in);

	if (r == 0 && !S_ISDIR(in.mode))
		r = -ENOTDIR;
	if (r == 0)
		r = ckpt_store_readdir(st->s, ino, ret_ents, ret_n);
	return r;
}

/* Fifos, sockets and devices are inodes without content: the kernel serves
 * their opens, reads and writes itself and never asks the daemon. */
static int st_mknode(struct tree *t, uint64_t parent, const char *name, uint32_t mode,
		     uint32_t uid, uint32_t gid, const char *target, uint64_t rdev,
		     struct tree_entry *ret)
{
	struct stree *st = stree_of(t);
	struct ckpt_inode in;
	int r;

	if (S_ISREG(mode) || S_ISDIR(mode) || S_ISLNK(mode))
		r = ckpt_store_mknode(st->s, parent, name, mode, uid, gid, target, &in);
	else
		r = ckpt_store_mknod(st->s, parent, name, mode, uid, gid, rdev, &in);
	return new_entry(st, r, parent, name, &in, ret);
}

static int st_link(struct tree *t, uint64_t ino, uint64_t newparent, const char *newname,
		   struct tree_entry *ret)
{
	struct stree *st = stree_of(t);
	struct ckpt_inode in;
	int r = ckpt_store_link(st->s, ino, newparent, newname, &in);

	if (r == 0)
		r = get_attr(st, ino, &in);
	return new_entry(st, r, newparent, newname, &in, ret);
}

static int st_unlink(struct tree *t, uint64_t parent, const char *name, bool dir)
{
	struct stree *st = stree_of(t);

	return changed(st, ckpt_store_unlink(st->s, parent, name, dir));
}

static int st_rename(struct tree *t, uint64_t parent, const char *name, uint64_t newparent,
		     const char *newname, unsigned flags)
{
	struct stree *st = stree_of(t);

	return changed(st, ckpt_store_rename(st->s, parent, name, newparent, newname, flags));
}

/* --------------------------------------------------------------- files */

static void sfile_free(struct sfile *h)
{
	ckpt_hold_free(h->hold);
	ckpt_extent_list_free(h->snap);
	pthread_rwlock_destroy(&h->snap_lock);
	free(h);
}

/* Writable files share the node's writer. */
static int st_open(struct tree *t, uint64_t ino, int flags, struct tree_file **ret)
{
	struct stree *st = stree_of(t);
	bool writable = (flags & O_ACCMODE) != O_RDONLY;
	bool trunc = writable && (flags & O_TRUNC);
	struct sfile *h = calloc(1, sizeof(*h));
	struct ckpt_inode in;
	struct node *n;
	int r;

	if (!h)
		return -ENOMEM;
	pthread_rwlock_init(&h->snap_lock, NULL);
	pthread_mutex_lock(&st->nodes_lock);
	n = node_get_locked(st, ino);
	if (!n) {
		pthread_mutex_unlock(&st->nodes_lock);
		r = -ENOMEM;
		goto out;
	}
	n->nopen++; /* keeps n while this open waits and reads */
	while (n->closing)
		pthread_cond_wait(&st->closed_cond, &st->nodes_lock);
	h->version = n->version;
	pthread_mutex_unlock(&st->nodes_lock);
	r = ckpt_store_getattr(st->s, ino, &in);
	if (r == 0 && S_ISDIR(in.mode))
		r = -EISDIR;
	if (r == 0 && !writable && ckpt_store_node(st->s))
		r = ckpt_hold_new(st->s, &h->hold); /* before the extents are read */
	if (r == 0 && !writable)
		r = ckpt_store_load_extents(st->s, ino, &h->snap);
	pthread_mutex_lock(&st->nodes_lock);
	while (r == 0 && writable && n->closing)
		pthread_cond_wait(&st->closed_cond, &st->nodes_lock);
	if (r == 0 && writable && !n->writer)
		r = ckpt_writer_new(st->s, st->pool, ino, trunc, &n->writer);
	else if (r == 0 && trunc)
		r = ckpt_writer_truncate(n->writer, 0);
	if (r == 0) {
		if (writable) {
			n->nwriters++;
			h->f.cached_write = st->writeback && n->ncached_readers == 0 &&
					    n->ndirect_writers == 0;
			if (h->f.cached_write)
				n->ncached_writers++;
			else
				n->ndirect_writers++;
		} else {
			h->f.uncached_read = st->writeback && n->nwriters > 0;
			if (!h->f.uncached_read)
				n->ncached_readers++;
		}
		h->node = n;
	} else {
		n->nopen--;
		node_put_locked(st, n);
	}
	pthread_mutex_unlock(&st->nodes_lock);
out:
	if (r < 0) {
		sfile_free(h);
		return r;
	}
	h->f.ops = &stree_ops;
	h->f.tree = t;
	h->f.ino = ino;
	h->f.writable = writable;
	*ret = &h->f;
	return 0;
}

/* Switch a read-only file to the latest committed content if a commit
 * happened since it was loaded. */
static int st_refresh(struct tree_file *f)
{
	struct sfile *h = sfile_of(f);
	struct stree *st = stree_of(f->tree);
	struct ckpt_extent_list *l = NULL;
	uint64_t v;
	int r;

	pthread_mutex_lock(&st->nodes_lock);
	v = h->node->version;
	pthread_mutex_unlock(&st->nodes_lock);
	pthread_rwlock_rdlock(&h->snap_lock);
	r = h->version == v;
	pthread_rwlock_unlock(&h->snap_lock);
	if (r)
		return 0;
	r = ckpt_store_load_extents(st->s, f->ino, &l);
	if (r < 0)
		return r;
	pthread_rwlock_wrlock(&h->snap_lock);
	if (h->version != v) {
		ckpt_extent_list_free(h->snap);
		h->snap = l;
		h->version = v;
		l = NULL;
	}
	pthread_rwlock_unlock(&h->snap_lock);
	ckpt_extent_list_free(l);
	return 0;
}

static ssize_t st_read(struct tree_file *f, void *buf, size_t len, uint64_t off,
		       struct ckpt_gather *g)
{
	struct sfile *h = sfile_of(f);
	ssize_t r;

	if (f->writable)
		return ckpt_writer_read(h->node->writer, buf, len, off);
	for (int tries = 0;; tries++) {
		uint64_t version;

		pthread_rwlock_rdlock(&h->snap_lock);
		version = h->version;
		r = ckpt_store_read_extents_gather(stree_of(f->tree)->s, h->snap, buf, len, off,
						   g);
		pthread_rwlock_unlock(&h->snap_lock);
		/* A read-only file reads the latest committed content and
		 * keeps no hold (store.h): a chunk of a version replaced since
		 * its refresh may be gone (EIO); read the new version then. */
		if (r != -EIO || tries > 0 || st_refresh(f) < 0)
			return r;
		pthread_rwlock_rdlock(&h->snap_lock);
		r = h->version == version;
		pthread_rwlock_unlock(&h->snap_lock);
		if (r)
			return -EIO;
		if (g)
			ckpt_store_gather_done(stree_of(f->tree)->s, g); /* start over */
	}
}

static uint64_t st_size(struct tree_file *f)
{
	struct sfile *h = sfile_of(f);
	uint64_t size;

	pthread_rwlock_rdlock(&h->snap_lock);
	size = h->snap->size;
	pthread_rwlock_unlock(&h->snap_lock);
	return size;
}

static size_t st_chunks(struct tree_file *f, uint64_t off, uint64_t len, ckpt_digest *out,
			size_t max)
{
	struct sfile *h = sfile_of(f);
	size_t n;

	pthread_rwlock_rdlock(&h->snap_lock);
	n = ckpt_store_prefetch_list(h->snap, off, len, out, max, NULL);
	pthread_rwlock_unlock(&h->snap_lock);
	return n;
}

static bool st_shared(struct tree_file *f)
{
	struct stree *st = stree_of(f->tree);
	bool shared;

	pthread_mutex_lock(&st->nodes_lock);
	shared = sfile_of(f)->node->nopen > 1;
	pthread_mutex_unlock(&st->nodes_lock);
	return shared;
}

static int st_write(struct tree_file *f, const void *buf, size_t len, uint64_t off)
{
	return ckpt_writer_write(sfile_of(f)->node->writer, buf, len, off);
}

static int st_fallocate(struct tree_file *f, int mode, uint64_t off, uint64_t len)
{
	return ckpt_writer_fallocate(sfile_of(f)->node->writer, mode, off, len);
}

static int st_commit(struct tree_file *f, bool durable)
{
	struct stree *st = stree_of(f->tree);
	int r;

	if (!f->writable)
		return durable ? ckpt_store_sync_file(st->s, f->ino) : 0;
	r = commit_writer(st, f->ino, sfile_of(f)->node->writer, durable, true);
	if (r < 0) {
		char *path = node_path(st, f->ino);
		ckpt_err("%s: cannot commit file: %s", path ? path : "?", strerror(-r));
		free(path);
	}
	return r;
}

/* The last writable file commits and frees the writer. */
static void st_release(struct tree_file *f)
{
	struct stree *st = stree_of(f->tree);
	struct sfile *h = sfile_of(f);
	struct node *n = h->node;
	uint64_t ino = f->ino;
	ckpt_writer *w = NULL;
	bool freed;

	pthread_mutex_lock(&st->nodes_lock);
	if (f->writable && f->cached_write)
		n->ncached_writers--;
	else if (f->writable)
		n->ndirect_writers--;
	else if (!f->uncached_read)
		n->ncached_readers--;
	if (f->writable && --n->nwriters == 0) {
		w = n->writer;
		n->writer = NULL;
		n->closing = w;
	}
	pthread_mutex_unlock(&st->nodes_lock);
	if (w) {
		/* flush already committed; this catches writes after it */
		int r = commit_writer(st, ino, w, false, true);
		if (r < 0)
			ckpt_err("inode %" PRIu64 ": changes after close lost: %s", ino,
				 strerror(-r));
	}
	pthread_mutex_lock(&st->nodes_lock);
	if (w) {
		n->closing = NULL;
		pthread_cond_broadcast(&st->closed_cond);
	}
	n->nopen--;
	freed = node_put_locked(st, n);
	pthread_mutex_unlock(&st->nodes_lock);
	ckpt_writer_free(w);
	node_release_maybe_reap(st, ino, freed);
	sfile_free(h);
}

static const struct tree_ops stree_ops = {
	.views = false,
	.lookup = st_lookup,
	.forget = st_forget,
	.getattr = st_getattr,
	.setattr = st_setattr,
	.readlink = st_readlink,
	.readdir = st_readdir,
	.mknode = st_mknode,
	.link = st_link,
	.unlink = st_unlink,
	.rename = st_rename,
	.path = st_path,
	.open = st_open,
	.refresh = st_refresh,
	.read = st_read,
	.size = st_size,
	.chunks = st_chunks,
	.shared = st_shared,
	.write = st_write,
	.fallocate = st_fallocate,
	.commit = st_commit,
	.release = st_release,
};

int stree_new(ckpt_store *s, ckpt_pool *pool, const struct stree_hooks *hooks,
	      struct tree **ret)
{
	struct stree *st = calloc(1, sizeof(*st));

	if (!st)
		return -ENOMEM;
	st->tree.ops = &stree_ops;
	st->s = s;
	st->pool = pool;
	st->hooks = *hooks;
	st->timeout = ckpt_store_is_node(s) ? 0 : CACHE_TIMEOUT;
	pthread_mutex_init(&st->nodes_lock, NULL);
	pthread_cond_init(&st->closed_cond, NULL);
	*ret = &st->tree;
	return 0;
}

void stree_set_writeback(struct tree *t, bool on)
{
	stree_of(t)->writeback = on;
}

void stree_commit_all(struct tree *t)
{
	struct stree *st = stree_of(t);

	pthread_mutex_lock(&st->nodes_lock);
	for (size_t i = 0; i < NODE_BUCKETS; i++) {
		for (struct node *n = st->nodes[i]; n; n = n->next) {
			if (n->writer) {
				int r = ckpt_writer_commit(n->writer, true);
				if (r < 0)
					ckpt_err("inode %" PRIu64 ": commit at unmount failed: %s",
						 n->ino, strerror(-r));
				ckpt_writer_free(n->writer);
				n->writer = NULL;
			}
		}
	}
	pthread_mutex_unlock(&st->nodes_lock);
}

void stree_free(struct tree *t)
{
	struct stree *st;

	if (!t)
		return;
	st = stree_of(t);
	for (size_t i = 0; i < NODE_BUCKETS; i++) {
		struct node *n, *next;
		for (n = st->nodes[i]; n; n = next) {
			next = n->next;
			free(n->name);
			free(n);
		}
	}
	pthread_mutex_destroy(&st->nodes_lock);
	pthread_cond_destroy(&st->closed_cond);
	free(st);
}
