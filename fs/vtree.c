/* SPDX-License-Identifier: MIT */
/*
 * vtree.c - virtual /tpT_ppP/ trees (see vtree.h).
 *
 * Invariants (under vt->lock):
 *  T1. Every vnode is in both hash tables (by key and by ino) and is never
 *      freed before vtree_free(); a vino handed to the kernel stays valid.
 *  T2. A cache entry's view was built for (layout, dir); it is trusted
 *      while the daemon-wide change generation is what it was when the
 *      entry was last checked, else its sources' signature is recomputed.
 *      The cache holds at most vt->cache_max entries, most recently used
 *      first; the last one is dropped for a new one (open files keep their
 *      own reference to its view).
 *  T3. A V_FILE vnode names one version of a view file: its key includes
 *      the view's signature, its size never changes.  When the sources
 *      change, the same name maps to a new vnode (a new inode for the
 *      kernel, with its own page cache), so a file opened earlier keeps
 *      reading its version (snapshot), and opening a stale vnode gives
 *      ESTALE (the kernel then looks the name up again).
 */
#include "vtree.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "views/layout.h"
#include "base/util.h"
#include "views/view.h"

enum vkind {
	V_DIR = 1,  /* mirror of store directory ino */
	V_PASS = 2, /* store file or symlink ino, read-only */
	V_FILE = 3, /* view file `name` of store directory ino */
};

struct vnode {
	uint64_t vino;
	enum vkind kind;
	struct ckpt_layout layout;
	uint64_t ino;
	char *name;     /* V_FILE only */
	uint64_t sig;   /* V_FILE: signature of the view version */
	uint64_t size;  /* V_FILE: size in that version */
	int64_t mtime_ns;
	unsigned nopen; /* open vtree_files; protected by vt->lock */
	/* V_FILE, protected by vt->lock: its read bits (file_perm), computed
	 * at change generation perm_gen if perm_known. */
	uint32_t perm;
	uint64_t perm_gen;
	bool perm_known;
	struct vnode *next_key, *next_ino;
};

struct vcache {
	struct ckpt_layout layout;
	uint64_t dir;
	ckpt_view *view;
	uint64_t gen; /* change generation when last checked */
	struct vcache *next;
};

#define VT_BUCKETS 4096

struct vtree {
	struct tree tree; /* first: the tree ops get &tree */
	ckpt_store *s;
	const ckpt_tp_rules *rules;
	pthread_mutex_t lock;
	/* Protected by lock: */
	struct vnode *by_key[VT_BUCKETS], *by_ino[VT_BUCKETS];
	uint64_t next_vino;
	struct vcache *cache;   /* most recently used first */
	size_t cache_max;
	uint64_t builds, evictions;
	uint64_t gen; /* bumped by vtree_changed() */
	/* files to parse ahead of the first view (vtree_prefetch) */
	pthread_cond_t pf_cond;
	uint64_t *pf;
	size_t npf, cap_pf;
	bool pf_stop, pf_started;
	pthread_t pf_thread;
};

struct vtree_file {
	struct tree_file f;            /* first: the tree ops get &f */
	struct vnode *n;               /* lives until vtree_free() */
	ckpt_vfile *vf;                /* view file, or */
	struct ckpt_extent_list *snap; /* passthrough file */
	ckpt_hold *hold; /* keeps the chunks of the version it reads (store.h):
			  * taken before them, then narrowed to their pins;
			  * freed at release */
};

void vtree_changed(struct vtree *vt)
{
	pthread_mutex_lock(&vt->lock);
	vt->gen++;
	pthread_mutex_unlock(&vt->lock);
}

static void *pf_main(void *arg)
{
	struct vtree *vt = arg;

	pthread_mutex_lock(&vt->lock);
	while (!vt->pf_stop) {
		if (vt->npf == 0) {
			pthread_cond_wait(&vt->pf_cond, &vt->lock);
			continue;
		}
		{
			uint64_t ino = vt->pf[--vt->npf];
			ckpt_hold *h = NULL;

			pthread_mutex_unlock(&vt->lock);
			/* best effort; the hold keeps the chunks it reads (store.h) */
			if (ckpt_hold_new(vt->s, &h) == 0)
				ckpt_view_prefetch(vt->s, ino);
			ckpt_hold_free(h);
			pthread_mutex_lock(&vt->lock);
		}
	}
	pthread_mutex_unlock(&vt->lock);
	return NULL;
}

void vtree_prefetch(struct vtree *vt, uint64_t ino)
{
	pthread_mutex_lock(&vt->lock);
	for (size_t i = 0; i < vt->npf; i++)
		if (vt->pf[i] == ino)
			goto out;
	if (vt->npf == vt->cap_pf) {
		size_t nc = vt->cap_pf ? vt->cap_pf * 2 : 64;
		uint64_t *v = realloc(vt->pf, nc * sizeof(*v));
		if (!v)
			goto out;
		vt->pf = v;
		vt->cap_pf = nc;
	}
	vt->pf[vt->npf++] = ino;
	pthread_cond_signal(&vt->pf_cond);
out:
	pthread_mutex_unlock(&vt->lock);
}

static const struct tree_ops vtree_ops;

int vtree_new(ckpt_store *s, const ckpt_tp_rules *rules, unsigned view_cache,
	      struct vtree **ret)
{
	struct vtree *vt = calloc(1, sizeof(*vt));

	if (!vt)
		return -ENOMEM;
	vt->tree.ops = &vtree_ops;
	vt->s = s;
	vt->rules = rules;
	vt->cache_max = view_cache ? view_cache : 1;
	vt->next_vino = VTREE_INO_BASE;
	pthread_mutex_init(&vt->lock, NULL);
	pthread_cond_init(&vt->pf_cond, NULL);
	if (pthread_create(&vt->pf_thread, NULL, pf_main, vt) == 0)
		vt->pf_started = true;
	*ret = vt;
	return 0;
}

struct tree *vtree_tree(struct vtree *vt)
{
	return &vt->tree;
}

void vtree_get_stats(struct vtree *vt, struct vtree_stats *ret)
{
	pthread_mutex_lock(&vt->lock);
	ret->views = 0;
	for (struct vcache *c = vt->cache; c; c = c->next)
		ret->views++;
	ret->builds = vt->builds;
	ret->evictions = vt->evictions;
	pthread_mutex_unlock(&vt->lock);
}

void vtree_free(struct vtree *vt)
{
	if (!vt)
		return;
	if (vt->pf_started)
		ckpt_threads_stop(&vt->lock, &vt->pf_cond, &vt->pf_stop, &vt->pf_thread, 1);
	free(vt->pf);
	pthread_cond_destroy(&vt->pf_cond);
	for (size_t i = 0; i < VT_BUCKETS; i++) {
		struct vnode *n = vt->by_ino[i], *next;
		for (; n; n = next) {
			next = n->next_ino;
			free(n->name);
			free(n);
		}
	}
	while (vt->cache) {
		struct vcache *c = vt->cache;
		vt->cache = c->next;
		ckpt_view_unref(c->view);
		free(c);
	}
	pthread_mutex_destroy(&vt->lock);
	free(vt);
}

static uint64_t key_hash(enum vkind kind, const struct ckpt_layout *l, uint64_t ino,
			 const char *name, uint64_t sig)
{
	uint64_t h = (uint64_t)kind * 0x9e3779b97f4a7c15ull ^ ((uint64_t)l->tp << 32 | l->pp);

	h = (h ^ ino ^ sig) * 0xbf58476d1ce4e5b9ull;
	for (; name && *name; name++)
		h = (h ^ (uint8_t)*name) * 0x100000001b3ull;
	return h ^ (h >> 31);
}

/* Find or create the vnode for a key (for V_FILE: name, view version sig
 * and the size/mtime of the file in that version).  NULL only on ENOMEM. */
static struct vnode *vnode_get_v(struct vtree *vt, enum vkind kind, const struct ckpt_layout *l, uint64_t ino,
				 const char *name, uint64_t sig, uint64_t size, int64_t mtime_ns)
{
	size_t b = key_hash(kind, l, ino, name, sig) % VT_BUCKETS;
	struct vnode *n;

	pthread_mutex_lock(&vt->lock);
	for (n = vt->by_key[b]; n; n = n->next_key) {
		if (n->kind == kind && n->ino == ino && n->layout.tp == l->tp &&
		    n->layout.pp == l->pp && n->sig == sig &&
		    (!name ? !n->name : (n->name && !strcmp(n->name, name))))
			goto out;
	}
	n = calloc(1, sizeof(*n));
	if (!n)
		goto out;
	if (name && !(n->name = strdup(name))) {
		free(n);
		n = NULL;
		goto out;
	}
	n->kind = kind;
	n->layout = *l;
	n->ino = ino;
	n->sig = sig;
	n->size = size;
	n->mtime_ns = mtime_ns;
	n->vino = vt->next_vino++;
	n->next_key = vt->by_key[b];
	vt->by_key[b] = n;
	n->next_ino = vt->by_ino[n->vino % VT_BUCKETS];
	vt->by_ino[n->vino % VT_BUCKETS] = n;
out:
	pthread_mutex_unlock(&vt->lock);
	return n;
}

static struct vnode *vnode_get(struct vtree *vt, enum vkind kind, const struct ckpt_layout *l,
			       uint64_t ino)
{
	return vnode_get_v(vt, kind, l, ino, NULL, 0, 0, 0);
}

#define SIZE_UNKNOWN UINT64_MAX

/* The vnode of view file i of v (its size is filled in on first getattr:
 * listing a view directory does not build every file's header). */
static struct vnode *vnode_of_file(struct vtree *vt, const struct ckpt_layout *l, uint64_t dir, ckpt_view *v,
				   size_t i)
{
	return vnode_get_v(vt, V_FILE, l, dir, ckpt_view_file_name(v, i), ckpt_view_sig(v),
			   SIZE_UNKNOWN, ckpt_view_mtime(v));
}

static int get_view(struct vtree *vt, const struct ckpt_layout *l, uint64_t dir,
		    ckpt_view **ret);

/* Size of a V_FILE vnode's version of its file. */
static int vfile_size(struct vtree *vt, struct vnode *n, uint64_t *ret)
{
	ckpt_view *v;
	uint64_t size;
	int r, i;

	pthread_mutex_lock(&vt->lock);
	size = n->size;
	pthread_mutex_unlock(&vt->lock);
	if (size != SIZE_UNKNOWN) {
		*ret = size;
		return 0;
	}
	r = get_view(vt, &n->layout, n->ino, &v);
	if (r < 0)
		return r;
	i = ckpt_view_find(v, n->name);
	if (i < 0 || ckpt_view_sig(v) != n->sig) {
		ckpt_view_unref(v);
		return -ESTALE; /* that version is gone (T3) */
	}
	size = ckpt_view_file_size(v, (size_t)i);
	ckpt_view_unref(v);
	pthread_mutex_lock(&vt->lock);
	n->size = size;
	pthread_mutex_unlock(&vt->lock);
	*ret = size;
	return 0;
}

/* Copy of the vnode with vino (name not copied: vnodes are immutable and
 * never freed while mounted, T1). */
static int vnode_find(struct vtree *vt, uint64_t vino, struct vnode **ret)
{
	struct vnode *n;

	pthread_mutex_lock(&vt->lock);
	for (n = vt->by_ino[vino % VT_BUCKETS]; n && n->vino != vino; n = n->next_ino)
		;
	pthread_mutex_unlock(&vt->lock);
	if (!n)
		return -ESTALE;
	*ret = n;
	return 0;
}

/* The cache entry of (layout, dir), moved to the front, or NULL.  Caller
 * holds vt->lock. */
static struct vcache *vcache_find_locked(struct vtree *vt, const struct ckpt_layout *l,
					 uint64_t dir)
{
	struct vcache **pp, *c;

	for (pp = &vt->cache; (c = *pp); pp = &c->next)
		if (c->dir == dir && c->layout.tp == l->tp && c->layout.pp == l->pp)
			break;
	if (c && pp != &vt->cache) {
		*pp = c->next;
		c->next = vt->cache;
		vt->cache = c;
	}
	return c;
}

/* Drop the least recently used entries beyond vt->cache_max; whether any
 * was.  Caller holds vt->lock. */
static bool vcache_trim_locked(struct vtree *vt)
{
	struct vcache **pp = &vt->cache, *c;
	bool any = false;
	size_t i = 0;

	while (*pp && ++i <= vt->cache_max)
		pp = &(*pp)->next;
	while ((c = *pp)) {
		*pp = c->next;
		ckpt_view_unref(c->view);
		free(c);
		vt->evictions++;
		any = true;
	}
	return any;
}

/* A reference to the cached view of (l, dir) if it is current, else NULL.
 * Without sig: current if last checked at the change generation, which is
 * returned in *gen.  With sig: current if it has that signature; it is then
 * marked checked at *gen.  *ret_cached (optional): whether (l, dir) has an
 * entry at all. */
static ckpt_view *cache_get(struct vtree *vt, const struct ckpt_layout *l, uint64_t dir,
			    uint64_t *gen, const uint64_t *sig, bool *ret_cached)
{
	struct vcache *c;
	ckpt_view *v = NULL;

	pthread_mutex_lock(&vt->lock);
	if (!sig)
		*gen = vt->gen;
	c = vcache_find_locked(vt, l, dir);
	if (c && (sig ? ckpt_view_sig(c->view) == *sig : c->gen == *gen)) {
		c->gen = *gen;
		v = c->view;
		ckpt_view_ref(v);
	}
	if (ret_cached)
		*ret_cached = c != NULL;
	pthread_mutex_unlock(&vt->lock);
	return v;
}

/* The view of (layout, dir), rebuilt if its sources changed.  Returns a
 * reference. */
static int get_view(struct vtree *vt, const struct ckpt_layout *l, uint64_t dir,
		    ckpt_view **ret)
{
	struct vcache *c;
	ckpt_view *v = NULL;
	uint64_t sig = 0, gen;
	char err[512];
	bool cached, evicted = false;
	int r;

	v = cache_get(vt, l, dir, &gen, NULL, &cached);
	/* A cached view is revalidated by the fingerprint of its directory;
	 * without one, the build computes that fingerprint itself. */
	if (!v && cached) {
		r = ckpt_view_signature(vt->s, dir, &sig);
		if (r < 0)
			return r;
		v = cache_get(vt, l, dir, &gen, &sig, NULL);
	}
	if (v) {
		*ret = v;
		return 0;
	}
	{
		/* the build reads the headers of the extent lists it loads */
		ckpt_hold *h;

		r = ckpt_hold_new(vt->s, &h);
		if (r < 0)
			return r;
		r = ckpt_view_build(vt->s, dir, l, vt->rules, &v, err, sizeof(err));
		ckpt_hold_free(h);
	}
	if (r < 0) {
		char lname[CKPT_LAYOUT_NAME_MAX + 1];
		char *path = ckpt_store_path_of(vt->s, dir);
		ckpt_layout_name(l, lname, sizeof(lname));
		ckpt_err("view %s of %s: %s", lname, path ? path : "?", err);
		free(path);
		return r;
	}
	pthread_mutex_lock(&vt->lock);
	vt->builds++;
	c = vcache_find_locked(vt, l, dir);
	if (!c && (c = calloc(1, sizeof(*c)))) {
		c->dir = dir;
		c->layout = *l;
		c->next = vt->cache;
		vt->cache = c;
	}
	if (c) {
		ckpt_view_unref(c->view); /* open files keep their own reference */
		c->view = v;
		c->gen = gen;
		ckpt_view_ref(v);
		evicted = vcache_trim_locked(vt);
	}
	pthread_mutex_unlock(&vt->lock);
	/* A dropped view's memory is spread over the heaps of the threads
	 * that built it, which keep what M_TRIM_THRESHOLD allows (set in
	 * fs/main.c): give it back, or the next views grow the daemon. */
	if (evicted)
		malloc_trim(0);
	*ret = v;
	return 0;
}

bool vtree_is_view_name(uint64_t parent, const char *name)
{
	struct ckpt_layout l;

	return parent == CKPT_ROOT_INO && ckpt_layout_parse(name, &l) == 0;
}

static void make_readonly(struct ckpt_inode *in, uint64_t vino)
{
	in->ino = vino;
	in->mode &= ~(uint32_t)0222;
}

/*
 * Who may read a view file (vtree_view_read_bits).  Its bytes come from the safetensors files of
 * its directory, so a class of users (owner, group, others) may read it
 * only if every one of them could read every such file: with the kernel's
 * default_permissions, a view file readable by more users than its sources
 * would hand their bytes to users the sources refuse.  A view file is owned
 * by the owner (vu) and group (vg) of its directory.  For a source s, the
 * class of a user of the view's class is not always known (group
 * membership), so the bit is granted only if every class the user may have
 * for s allows reading it:
 *  - the view's owner is s's owner if s.uid == vu, else in s's group or not;
 *  - a member of vg (not vu) may be s's owner unless s.uid == vu, is in s's
 *    group, and is other for s unless s.gid == vg;
 *  - anyone else may be s's owner unless s.uid == vu, is in s's group only
 *    if s.gid != vg, and may be other for s.
 */
uint32_t vtree_view_read_bits(uint32_t vu, uint32_t vg, const struct ckpt_inode *s)
{
	bool ou = s->uid == vu, og = s->gid == vg;
	bool ru = s->mode & S_IRUSR, rg = s->mode & S_IRGRP, ro = s->mode & S_IROTH;
	uint32_t bits = 0;

	if (ou ? ru : (rg && ro))
		bits |= S_IRUSR;
	if (rg && (ou || ru) && (og || ro))
		bits |= S_IRGRP;
	if (ro && (ou || ru) && (og || rg))
		bits |= S_IROTH;
	return bits;
}

/* The permission bits of view file n of a directory owned by uid:gid: the
 * read bits every safetensors file of the directory allows (a superset of
 * the file's sources), recomputed after any change through the daemon. */
static int file_perm(struct vtree *vt, struct vnode *n, uint32_t uid, uint32_t gid,
		     uint32_t *ret)
{
	struct ckpt_dirent *ents = NULL;
	uint32_t bits = 0444;
	size_t k = 0;
	uint64_t gen;
	int r;

	pthread_mutex_lock(&vt->lock);
	gen = vt->gen;
	if (n->perm_known && n->perm_gen == gen) {
		*ret = n->perm;
		pthread_mutex_unlock(&vt->lock);
		return 0;
	}
	pthread_mutex_unlock(&vt->lock);
	r = ckpt_store_readdir(vt->s, n->ino, &ents, &k);
	for (size_t i = 0; r == 0 && i < k; i++) {
		struct ckpt_inode in;
		int e;

		if (!S_ISREG(ents[i].mode))
			continue;
		e = ckpt_store_getattr(vt->s, ents[i].ino, &in);
		if (e == -ENOENT)
			continue; /* unlinked meanwhile */
		if (e < 0)
			r = e;
		else if (in.flags & CKPT_INODE_F_SAFETENSORS)
			bits &= vtree_view_read_bits(uid, gid, &in);
	}
	ckpt_dirents_free(ents, k);
	if (r < 0)
		return r == -ENOENT ? -ESTALE : r;
	pthread_mutex_lock(&vt->lock);
	n->perm = bits;
	n->perm_gen = gen;
	n->perm_known = true;
	pthread_mutex_unlock(&vt->lock);
	*ret = bits;
	return 0;
}

static int attr_of(struct vtree *vt, struct vnode *n, struct ckpt_inode *ret)
{
	uint32_t perm;
	int r;

	switch (n->kind) {
	case V_DIR:
	case V_PASS:
		r = ckpt_store_getattr(vt->s, n->ino, ret);
		if (r < 0)
			return r == -ENOENT ? -ESTALE : r;
		if (n->kind == V_DIR && !S_ISDIR(ret->mode))
			return -ESTALE;
		make_readonly(ret, n->vino);
		return 0;
	case V_FILE:
		r = ckpt_store_getattr(vt->s, n->ino, ret);
		if (r < 0)
			return r == -ENOENT ? -ESTALE : r;
		r = vfile_size(vt, n, &ret->size);
		if (r == 0)
			r = file_perm(vt, n, ret->uid, ret->gid, &perm);
		if (r < 0)
			return r;
		ret->ino = n->vino;
		ret->mode = S_IFREG | perm;
		ret->nlink = 1;
		ret->mtime_ns = ret->ctime_ns = n->mtime_ns;
		ret->flags = CKPT_INODE_F_SAFETENSORS;
		return 0;
	}
	return -EINVAL;
}

static struct vtree *vtree_of(struct tree *t)
{
	return (struct vtree *)t;
}

static struct vtree_file *vfile_of(struct tree_file *f)
{
	return (struct vtree_file *)f;
}

/* Kernel cache timeouts (seconds) of n's entry and attributes. */
static double entry_timeout(const struct vnode *n)
{
	return n->kind == V_FILE ? 0.0 : 1.0; /* the name may map to a newer version */
}

/* A version of a view file never changes its size (T3), but its mode
 * follows its sources' (file_perm): as long as the store's files'. */
static double attr_timeout(const struct vnode *n)
{
	(void)n;
	return 1.0;
}

static int vt_getattr(struct tree *t, uint64_t vino, struct ckpt_inode *ret, double *ret_timeout)
{
	struct vtree *vt = vtree_of(t);
	struct vnode *n;
	int r = vnode_find(vt, vino, &n);

	if (r < 0)
		return r;
	*ret_timeout = attr_timeout(n);
	return attr_of(vt, n, ret);
}

/* vnodes are not counted: they live until vtree_free() (T1). */
static void vt_forget(struct tree *t, uint64_t ino, uint64_t nlookup)
{
}

/* In a virtual directory, or of a view root under the store root. */
static int vt_lookup(struct tree *t, uint64_t parent, const char *name, struct tree_entry *ret)
{
	struct vtree *vt = vtree_of(t);
	struct ckpt_layout l;
	struct ckpt_inode in;
	struct vnode *pn, *n = NULL;
	ckpt_view *v = NULL;
	int r;

	if (!vtree_is_virtual(parent)) {
		if (!vtree_is_view_name(parent, name))
			return -ENOENT;
		ckpt_layout_parse(name, &l);
		n = vnode_get(vt, V_DIR, &l, CKPT_ROOT_INO);
		r = n ? 0 : -ENOMEM;
		goto out;
	}
	r = vnode_find(vt, parent, &pn);
	if (r < 0)
		return r;
	if (pn->kind != V_DIR)
		return -ENOTDIR;
	r = get_view(vt, &pn->layout, pn->ino, &v);
	if (r < 0)
		return r;
	r = ckpt_view_find(v, name);
	if (r >= 0) {
		n = vnode_of_file(vt, &pn->layout, pn->ino, v, (size_t)r);
		r = n ? 0 : -ENOMEM;
		goto out;
	}
	r = ckpt_store_lookup(vt->s, pn->ino, name, &in);
	if (r < 0)
		goto out;
	if (S_ISDIR(in.mode)) {
		n = vnode_get(vt, V_DIR, &pn->layout, in.ino);
	} else if (ckpt_view_is_source(v, in.ino)) {
		r = -ENOENT; /* replaced by the view's files */
		goto out;
	} else {
		n = vnode_get(vt, V_PASS, &pn->layout, in.ino);
	}
	r = n ? 0 : -ENOMEM;
out:
	ckpt_view_unref(v);
	if (r < 0)
		return r;
	memset(ret, 0, sizeof(*ret));
	ret->generation = 1;
	ret->entry_timeout = entry_timeout(n);
	ret->attr_timeout = attr_timeout(n);
	return attr_of(vt, n, &ret->attr);
}

static int vt_readlink(struct tree *t, uint64_t vino, char **ret_target)
{
	struct vtree *vt = vtree_of(t);
	struct vnode *n;
	int r = vnode_find(vt, vino, &n);

	if (r < 0)
		return r;
	if (n->kind != V_PASS)
		return -EINVAL;
	return ckpt_store_readlink(vt->s, n->ino, ret_target);
}

static int vt_readdir(struct tree *t, uint64_t vino, struct ckpt_dirent **ret_ents,
		      size_t *ret_n)
{
	struct vtree *vt = vtree_of(t);
	struct ckpt_dirent *ents = NULL, *out = NULL;
	size_t n = 0, k = 0;
	struct vnode *dn;
	ckpt_view *v = NULL;
	int r = vnode_find(vt, vino, &dn);

	if (r < 0)
		return r;
	if (dn->kind != V_DIR)
		return -ENOTDIR;
	r = get_view(vt, &dn->layout, dn->ino, &v);
	if (r == 0)
		r = ckpt_store_readdir(vt->s, dn->ino, &ents, &n);
	if (r < 0)
		goto out;
	out = calloc(n + ckpt_view_nfiles(v) + 1, sizeof(*out));
	if (!out) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		struct vnode *c;
		if (S_ISREG(ents[i].mode) && ckpt_view_is_source(v, ents[i].ino))
			continue;
		c = vnode_get(vt, S_ISDIR(ents[i].mode) ? V_DIR : V_PASS, &dn->layout, ents[i].ino);
		if (!c) {
			r = -ENOMEM;
			goto out;
		}
		out[k].name = ents[i].name;
		ents[i].name = NULL;
		out[k].ino = c->vino;
		out[k].mode = ents[i].mode;
		k++;
	}
	for (size_t i = 0; i < ckpt_view_nfiles(v); i++) {
		struct vnode *c = vnode_of_file(vt, &dn->layout, dn->ino, v, i);
		if (!c || !(out[k].name = strdup(ckpt_view_file_name(v, i)))) {
			r = -ENOMEM;
			goto out;
		}
		out[k].ino = c->vino;
		out[k].mode = S_IFREG;
		k++;
	}
out:
	ckpt_dirents_free(ents, n);
	ckpt_view_unref(v);
	if (r < 0) {
		ckpt_dirents_free(out, k);
		return r;
	}
	*ret_ents = out;
	*ret_n = k;
	return 0;
}

/* "/tpT_ppP/DIR[/NAME]" of a vnode, for messages. */
static char *vnode_path(struct vtree *vt, const struct vnode *n)
{
	char lname[CKPT_LAYOUT_NAME_MAX + 1];
	char *dir = ckpt_store_path_of(vt->s, n->ino), *path;

	ckpt_layout_name(&n->layout, lname, sizeof(lname));
	if (asprintf(&path, "/%s%s%s%s", lname, dir && strcmp(dir, "/") ? dir : "",
		     n->name ? "/" : "", n->name ? n->name : "") < 0)
		path = NULL;
	free(dir);
	return path;
}

static char *vt_path(struct tree *t, uint64_t vino)
{
	struct vtree *vt = vtree_of(t);
	struct vnode *n;
	char *path;

	if (vnode_find(vt, vino, &n) == 0)
		return vnode_path(vt, n);
	if (asprintf(&path, "<inode %" PRIu64 ">", vino) < 0)
		path = NULL;
	return path;
}

/* ----------------------------------------------- changes: all refused */

/* parent/name would be made: a view root's name exists, a view tree is
 * read-only. */
static int refuse_new(uint64_t parent)
{
	return vtree_is_virtual(parent) ? -EROFS : -EEXIST;
}

static int vt_setattr(struct tree *t, uint64_t ino, unsigned what, const struct ckpt_inode *in)
{
	return -EROFS;
}

static int vt_mknode(struct tree *t, uint64_t parent, const char *name, uint32_t mode,
		     uint32_t uid, uint32_t gid, const char *target, uint64_t rdev,
		     struct tree_entry *ret)
{
	return refuse_new(parent);
}

static int vt_link(struct tree *t, uint64_t ino, uint64_t newparent, const char *newname,
		   struct tree_entry *ret)
{
	return vtree_is_virtual(ino) ? -EROFS : refuse_new(newparent);
}

static int vt_unlink(struct tree *t, uint64_t parent, const char *name, bool dir)
{
	return -EROFS;
}

static int vt_rename(struct tree *t, uint64_t parent, const char *name, uint64_t newparent,
		     const char *newname, unsigned flags)
{
	if (vtree_is_virtual(parent) || vtree_is_view_name(parent, name))
		return -EROFS; /* the old name is in a view tree */
	return refuse_new(newparent);
}

/* --------------------------------------------------------------- files */

static int vt_open(struct tree *t, uint64_t vino, int flags, struct tree_file **ret)
{
	struct vtree *vt = vtree_of(t);
	struct vtree_file *f;
	struct vnode *n;
	ckpt_view *v = NULL;
	char err[1024];
	int r, i;

	if ((flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC))
		return -EROFS;
	r = vnode_find(vt, vino, &n);
	if (r < 0)
		return r;
	if (n->kind == V_DIR)
		return -EISDIR;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	r = ckpt_hold_new(vt->s, &f->hold);
	if (r < 0)
		goto out;
	if (n->kind == V_PASS) {
		r = ckpt_store_load_extents(vt->s, n->ino, &f->snap);
		/* keep only its chunks from now on (store.h, holds) */
		if (r == 0 && ckpt_hold_pin(f->hold, f->snap) == 0)
			ckpt_hold_narrow(f->hold);
		goto out;
	}
	r = get_view(vt, &n->layout, n->ino, &v);
	if (r < 0)
		goto out;
	i = ckpt_view_find(v, n->name);
	if (i < 0 || ckpt_view_sig(v) != n->sig) {
		r = -ESTALE; /* this version is gone (T3) */
		goto out;
	}
	err[0] = '\0';
	r = ckpt_vfile_open(v, (size_t)i, &f->vf, err, sizeof(err));
	if (r == 0) {
		/* keep only the chunks of its sources from now on (store.h,
		 * holds); without memory for the pins, the hold keeps more */
		int rp = 0;

		for (size_t k = 0; k < ckpt_view_nsources(v) && rp == 0; k++)
			rp = ckpt_hold_pin(f->hold, ckpt_view_source_extents(v, k));
		if (rp == 0)
			ckpt_hold_narrow(f->hold);
	}
	if (r < 0) {
		char *path = vnode_path(vt, n);
		ckpt_err("%s: cannot be served: %s", path ? path : "?",
			 err[0] ? err : strerror(-r));
		free(path);
	}
out:
	ckpt_view_unref(v);
	if (r < 0) {
		ckpt_extent_list_free(f->snap);
		ckpt_hold_free(f->hold);
		free(f);
		return r;
	}
	f->f.ops = &vtree_ops;
	f->f.tree = t;
	f->f.ino = vino;
	f->n = n;
	pthread_mutex_lock(&vt->lock);
	n->nopen++;
	pthread_mutex_unlock(&vt->lock);
	*ret = &f->f;
	return 0;
}

static ssize_t vt_read(struct tree_file *tf, void *buf, size_t len, uint64_t off,
		       struct ckpt_gather *g)
{
	struct vtree_file *f = vfile_of(tf);

	if (f->vf)
		return ckpt_vfile_read_gather(f->vf, buf, len, off, g);
	return ckpt_store_read_extents_gather(vtree_of(tf->tree)->s, f->snap, buf, len, off, g);
}

static uint64_t vt_size(struct tree_file *tf)
{
	struct vtree_file *f = vfile_of(tf);

	return f->vf ? ckpt_vfile_size(f->vf) : f->snap->size;
}

static size_t vt_chunks(struct tree_file *tf, uint64_t off, uint64_t len, ckpt_digest *out,
			size_t max)
{
	struct vtree_file *f = vfile_of(tf);

	if (f->vf)
		return ckpt_vfile_chunks(f->vf, off, len, out, max);
	return ckpt_store_prefetch_list(f->snap, off, len, out, max, NULL);
}

static bool vt_shared(struct tree_file *tf)
{
	struct vtree *vt = vtree_of(tf->tree);
	bool shared;

	pthread_mutex_lock(&vt->lock);
	shared = vfile_of(tf)->n->nopen > 1;
	pthread_mutex_unlock(&vt->lock);
	return shared;
}

/* Nothing to commit: view files are never open for writing. */
static int vt_commit(struct tree_file *tf, bool durable)
{
	return 0;
}

static void vt_release(struct tree_file *tf)
{
	struct vtree *vt = vtree_of(tf->tree);
	struct vtree_file *f = vfile_of(tf);

	pthread_mutex_lock(&vt->lock);
	f->n->nopen--;
	pthread_mutex_unlock(&vt->lock);
	ckpt_vfile_free(f->vf);
	ckpt_extent_list_free(f->snap);
	ckpt_hold_free(f->hold);
	free(f);
}

/* refresh: a view file is one version of it (T3), a passthrough file one
 * snapshot.  write: never open for writing. */
static const struct tree_ops vtree_ops = {
	.views = true,
	.lookup = vt_lookup,
	.forget = vt_forget,
	.getattr = vt_getattr,
	.setattr = vt_setattr,
	.readlink = vt_readlink,
	.readdir = vt_readdir,
	.mknode = vt_mknode,
	.link = vt_link,
	.unlink = vt_unlink,
	.rename = vt_rename,
	.path = vt_path,
	.open = vt_open,
	.read = vt_read,
	.size = vt_size,
	.chunks = vt_chunks,
	.shared = vt_shared,
	.commit = vt_commit,
	.release = vt_release,
};
