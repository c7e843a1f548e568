/* SPDX-License-Identifier: MIT */
/*
 * ckptfs.c - the FUSE daemon: a thin low-level-API layer over core/.
 *
 * Usage: ckptfs STORE MOUNTPOINT [-f] [-d] [-o opt[,opt...]]
 *
 * Inode lifecycle (modelled on libfuse's passthrough_ll): a struct node
 * exists while the kernel holds lookups on the inode (nlookup > 0) or files
 * are open on it (nopen > 0).  When both drop to zero the node is freed and
 * the store is asked to reap the inode (which deletes it if it was
 * unlinked).  Store inode numbers are used directly as FUSE inode numbers.
 *
 * Open files: a handle opened for writing shares the node's ckpt_writer
 * (all writers of one inode see one content); flush/fsync commit it, the
 * last writable release frees it.  A read-only handle reads the committed
 * content as of its open (a snapshot of the extent list), so readers never
 * observe a half-written file.
 *
 * Every request gets exactly one reply.  Core functions return negative
 * errno values; reply_err() is the one place they become FUSE replies.
 */
#define FUSE_USE_VERSION 312

#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include "store/file.h"
#include "chunk/readahead.h"
#include "views/shardmeta.h"
#include "store/store.h"
#include "base/util.h"
#include "views/view.h"
#include "vtree.h"

#define ATTR_TIMEOUT 1.0
#define ENTRY_TIMEOUT 1.0
#define NODE_BUCKETS 4096

struct node {
	uint64_t ino;
	struct node *next;
	/* Protected by fs.nodes_lock: */
	uint64_t nlookup;
	unsigned nopen;
	unsigned nwriters;
	uint64_t version;    /* bumped by every commit of new content */
	ckpt_writer *writer; /* non-NULL while nwriters > 0 */
	uint64_t parent;     /* last name the kernel looked this inode up by, */
	char *name;          /* for messages only (may be stale after rename) */
};

/*
 * Read-only handles of store files read the latest committed content
 * (close-to-open consistency): when a writer commits, open readers switch
 * to the new version at their next read, as the kernel's page cache and
 * file size (shared by all handles of an inode) do.  snap is the extent
 * list of version `version`; snap_lock guards the swap.
 */
struct handle {
	struct node *node; /* NULL for files of the virtual view trees */
	bool writable;
	pthread_rwlock_t snap_lock;
	struct ckpt_extent_list *snap; /* read-only handles */
	uint64_t version;
	struct vtree_file *vf;         /* files of the virtual view trees */
	struct ckpt_ra_window ra;      /* read-only handles: read-ahead state */
	bool direct;                   /* opened with direct_io (set at open); read-only
					* ones count in fs.ra_streams until release */
	uint64_t dropped;              /* drop-behind: kernel pages below this offset
					* were queued for dropping (atomic) */
};

struct dir_handle {
	struct ckpt_dirent *ents;
	size_t n;
};

/* A kernel cache invalidation: pages of [off, off+len) of ino, or with
 * len 0 its attributes and all its pages. */
struct inval {
	uint64_t ino;
	uint64_t off, len;
};

static struct {
	ckpt_store *store;
	ckpt_readahead *ra; /* NULL: read-ahead off */
	uint64_t stream_cap;  /* the chunk cache's stream budget (set at mount) */
	unsigned ra_streams;  /* open direct_io read handles (atomic) */
	ckpt_pool *pool;
	struct fuse_session *se;
	bool drop_behind;   /* -o drop_behind (set before the session starts) */
	/* Read-only handles of view files / of stored files bypass the page
	 * cache (direct_io).  Set in op_init, before any open, from -o
	 * direct_read and what the kernel grants. */
	bool direct_views, direct_files;
	int direct_read_opt;     /* -o direct_read: DIRECT_READ_* */
	bool direct_read_given;  /* -o direct_read was given */
	/* Kernel cache invalidations, sent from their own thread (sending
	 * them from a request handler can deadlock on the inode). */
	pthread_mutex_t inval_lock;
	pthread_cond_t inval_cond;
	struct inval *inval;   /* protected by inval_lock */
	size_t ninval, cap_inval;
	bool inval_stop;
	pthread_t inval_thread;
	bool inval_started;
	pthread_mutex_t nodes_lock;
	struct node *nodes[NODE_BUCKETS]; /* protected by nodes_lock */
} fs;

/* ------------------------------------------------------------- replies */

/* The one place where a negative errno from core becomes a FUSE reply. */
static void reply_err(fuse_req_t req, int r)
{
	fuse_reply_err(req, r < 0 ? -r : r);
}

static void inode_to_stat(const struct ckpt_inode *in, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = in->ino;
	st->st_mode = in->mode;
	st->st_nlink = in->nlink;
	st->st_uid = in->uid;
	st->st_gid = in->gid;
	st->st_size = (off_t)in->size;
	st->st_blksize = 1 << 20;
	st->st_blocks = (blkcnt_t)((in->size + 511) / 512);
	st->st_atim.tv_sec = in->atime_ns / 1000000000;
	st->st_atim.tv_nsec = in->atime_ns % 1000000000;
	st->st_mtim.tv_sec = in->mtime_ns / 1000000000;
	st->st_mtim.tv_nsec = in->mtime_ns % 1000000000;
	st->st_ctim.tv_sec = in->ctime_ns / 1000000000;
	st->st_ctim.tv_nsec = in->ctime_ns % 1000000000;
}

/* -------------------------------------------------------- invalidation */

/* After new content of ino was committed: drop the kernel's cached
 * attributes and pages of ino.  A read-only handle that read past its
 * snapshot's end made the kernel shrink its idea of the size; without this,
 * a reopen within the attribute timeout would see that stale size. */
static void queue_inval_range(uint64_t ino, uint64_t off, uint64_t len)
{
	pthread_mutex_lock(&fs.inval_lock);
	if (fs.ninval == fs.cap_inval) {
		size_t nc = fs.cap_inval ? fs.cap_inval * 2 : 64;
		struct inval *v = realloc(fs.inval, nc * sizeof(*v));
		if (!v) {
			pthread_mutex_unlock(&fs.inval_lock);
			return; /* best effort: attributes expire after ATTR_TIMEOUT */
		}
		fs.inval = v;
		fs.cap_inval = nc;
	}
	fs.inval[fs.ninval++] = (struct inval){ ino, off, len };
	pthread_cond_signal(&fs.inval_cond);
	pthread_mutex_unlock(&fs.inval_lock);
}

static void queue_inval(uint64_t ino)
{
	queue_inval_range(ino, 0, 0);
}

static void *inval_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&fs.inval_lock);
	while (!fs.inval_stop) {
		while (fs.ninval > 0) {
			struct inval iv = fs.inval[--fs.ninval];
			pthread_mutex_unlock(&fs.inval_lock);
			/* -ENOENT: the kernel has forgotten the inode: nothing cached */
			(void)fuse_lowlevel_notify_inval_inode(fs.se, iv.ino, (off_t)iv.off,
							       (off_t)iv.len);
			pthread_mutex_lock(&fs.inval_lock);
		}
		pthread_cond_wait(&fs.inval_cond, &fs.inval_lock);
	}
	pthread_mutex_unlock(&fs.inval_lock);
	return NULL;
}

/* Commit a writer; on a change, invalidate the kernel's caches of ino. */
static void bump_version(uint64_t ino);

/* Commit a writer; on a change, make open readers switch to the new
 * content.  sync_inval: drop the kernel's caches of ino before returning
 * (only from handlers the kernel sends without holding the inode's lock or
 * page locks: FLUSH, FSYNC, RELEASE); else queue it. */
static int commit_writer(uint64_t ino, ckpt_writer *w, bool durable, bool sync_inval)
{
	bool dirty = ckpt_writer_dirty(w);
	int r = ckpt_writer_commit(w, durable);

	if (r == 0 && dirty) {
		vtree_changed();
		vtree_prefetch(ino);
		bump_version(ino);
		if (sync_inval)
			fuse_lowlevel_notify_inval_inode(fs.se, ino, 0, 0);
		else
			queue_inval(ino);
	}
	return r;
}

/* --------------------------------------------------------------- nodes */

static struct node **node_slot(uint64_t ino)
{
	return &fs.nodes[ino % NODE_BUCKETS];
}

/* Caller holds nodes_lock. */
static struct node *node_find_locked(uint64_t ino)
{
	struct node *n = *node_slot(ino);

	while (n && n->ino != ino)
		n = n->next;
	return n;
}

/* Caller holds nodes_lock. */
static struct node *node_get_locked(uint64_t ino)
{
	struct node *n = node_find_locked(ino);

	if (n)
		return n;
	n = calloc(1, sizeof(*n));
	if (!n)
		return NULL;
	n->ino = ino;
	n->next = *node_slot(ino);
	*node_slot(ino) = n;
	return n;
}

/* Free an unused node; returns true if it was freed.  Caller holds lock. */
static bool node_put_locked(struct node *n)
{
	struct node **pp;

	if (n->nlookup > 0 || n->nopen > 0)
		return false;
	for (pp = node_slot(n->ino); *pp != n; pp = &(*pp)->next)
		;
	*pp = n->next;
	free(n->name);
	free(n);
	return true;
}

static void node_release_maybe_reap(uint64_t ino, bool freed)
{
	if (freed) {
		int r = ckpt_store_reap(fs.store, ino);
		if (r < 0)
			ckpt_err("cannot delete unlinked inode %" PRIu64 ": %s", ino, strerror(-r));
	}
}

/* "DIR/NAME" of ino for messages (malloc'd). */
static char *node_path(uint64_t ino)
{
	struct node *n;
	uint64_t parent = 0;
	char *name = NULL, *dir, *path = NULL;

	pthread_mutex_lock(&fs.nodes_lock);
	n = node_find_locked(ino);
	if (n && n->name) {
		parent = n->parent;
		name = strdup(n->name);
	}
	pthread_mutex_unlock(&fs.nodes_lock);
	if (!name) {
		if (asprintf(&path, "<inode %" PRIu64 ">", ino) < 0)
			path = NULL;
		return path;
	}
	dir = ckpt_store_path_of(fs.store, parent);
	if (asprintf(&path, "%s%s%s", dir ? dir : "?", dir && !strcmp(dir, "/") ? "" : "/",
		     name) < 0)
		path = NULL;
	free(dir);
	free(name);
	return path;
}

static void bump_version(uint64_t ino)
{
	struct node *n;

	pthread_mutex_lock(&fs.nodes_lock);
	n = node_find_locked(ino);
	if (n)
		n->version++;
	pthread_mutex_unlock(&fs.nodes_lock);
}

/* Attributes with the live size/mtime of an open writer applied. */
static int get_attr(uint64_t ino, struct ckpt_inode *in)
{
	struct node *n;
	int r = ckpt_store_getattr(fs.store, ino, in);

	if (r < 0)
		return r;
	pthread_mutex_lock(&fs.nodes_lock);
	n = node_find_locked(ino);
	if (n && n->writer) {
		in->size = ckpt_writer_size(n->writer);
		in->mtime_ns = ckpt_writer_mtime(n->writer);
		if (in->ctime_ns < in->mtime_ns)
			in->ctime_ns = in->mtime_ns;
	}
	pthread_mutex_unlock(&fs.nodes_lock);
	return 0;
}

static int make_entry(fuse_ino_t parent, const char *name, const struct ckpt_inode *in,
		      struct fuse_entry_param *e)
{
	struct node *n;
	struct ckpt_inode live = *in;

	memset(e, 0, sizeof(*e));
	pthread_mutex_lock(&fs.nodes_lock);
	n = node_get_locked(in->ino);
	if (n) {
		n->nlookup++;
		if (!n->name || n->parent != parent || strcmp(n->name, name)) {
			free(n->name);
			n->name = strdup(name);
			n->parent = parent;
		}
		if (n->writer) {
			live.size = ckpt_writer_size(n->writer);
			live.mtime_ns = ckpt_writer_mtime(n->writer);
		}
	}
	pthread_mutex_unlock(&fs.nodes_lock);
	if (!n)
		return -ENOMEM;
	e->ino = in->ino;
	e->generation = in->generation;
	e->attr_timeout = ATTR_TIMEOUT;
	e->entry_timeout = ENTRY_TIMEOUT;
	inode_to_stat(&live, &e->attr);
	return 0;
}

/* ------------------------------------------------- direct reads, shared mmap
 *
 * Read-only handles of view files (and with -o direct_read=all of stored
 * files) are opened with direct_io when the kernel lets shared mappings of
 * such files go through the page cache (FUSE_DIRECT_IO_ALLOW_MMAP, Linux
 * 6.6): read() then moves data from the daemon straight into the reader's
 * buffer (one copy instead of two, no page-cache pages to allocate and
 * reclaim), while mmap keeps working for loaders that map files
 * (safetensors).  Without that flag a shared mapping of a direct_io file
 * fails with ENODEV, so direct reads are then off whatever the option says.
 * The price of direct_io is per request: without the kernel's read-ahead
 * every read() is a round trip to the daemon, so small reads are slower
 * (docs/performance.md 6d: 4 KiB reads 5x, 32 KiB 1.5x).  Views are read
 * by checkpoint loaders (large reads or mmap), so they get it by default;
 * stored files, which any tool may read, keep the page cache.
 *
 * libfuse 3.16 negotiates the flag (FUSE_CAP_DIRECT_IO_ALLOW_MMAP).  Older
 * libfuse (Debian 12 ships 3.14) does not know it, so the daemon does it on
 * the wire, through fuse_session_custom_io: wire_read notes whether the
 * kernel's INIT request offers the flag, op_init decides, and wire_writev
 * sets the flag in the reply to that INIT.  Every other message passes
 * through untouched.
 *
 * Wire layouts (include/uapi/linux/fuse.h, protocol 7.36+): fuse_in_header
 * is 40 bytes with the opcode at byte 4 and the unique id at byte 8;
 * fuse_init_in has flags at byte 12 and flags2 at byte 16; fuse_out_header
 * is 16 bytes with the error at byte 4 and the unique id at byte 8;
 * fuse_init_out has flags at byte 12 and flags2 at byte 32.
 */
#define DIRECT_READ_NONE 0
#define DIRECT_READ_VIEWS 1
#define DIRECT_READ_ALL 2
#define WIRE_FUSE_INIT 26u
#define WIRE_INIT_EXT (1u << 30)           /* flags: flags2 is valid */
#define WIRE_ALLOW_MMAP_FLAGS2 (1u << 4)   /* FUSE_DIRECT_IO_ALLOW_MMAP, 1ULL << 36 */
#define WIRE_IN_HEADER 40u
#define WIRE_OUT_HEADER 16u

static struct {
	/* Written by the thread that reads INIT, read by the one replying to
	 * it; the kernel sends nothing else until INIT is answered. */
	atomic_bool init_pending;     /* an INIT request is being answered */
	_Atomic uint64_t init_unique; /* its unique id */
	atomic_bool offered;          /* the kernel's INIT offers ALLOW_MMAP */
	atomic_bool want;             /* op_init: set it in the reply */
	atomic_bool granted;          /* set in the reply */
} wire;

static uint32_t wire_u32(const void *p, size_t off)
{
	uint32_t v;

	memcpy(&v, (const uint8_t *)p + off, sizeof(v));
	return v;
}

static ssize_t wire_read(int fd, void *buf, size_t len, void *userdata)
{
	ssize_t r = read(fd, buf, len);

	(void)userdata;
	if (r >= (ssize_t)(WIRE_IN_HEADER + 20) && wire_u32(buf, 4) == WIRE_FUSE_INIT) {
		uint64_t unique;
		uint32_t flags = wire_u32(buf, WIRE_IN_HEADER + 12);
		uint32_t flags2 = wire_u32(buf, WIRE_IN_HEADER + 16);

		memcpy(&unique, (uint8_t *)buf + 8, sizeof(unique));
		atomic_store(&wire.offered,
			     (flags & WIRE_INIT_EXT) && (flags2 & WIRE_ALLOW_MMAP_FLAGS2));
		atomic_store(&wire.init_unique, unique);
		atomic_store(&wire.init_pending, true);
	}
	return r;
}

static ssize_t wire_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	uint8_t out[256];
	struct iovec v[2];
	uint64_t unique;
	uint32_t flags2;
	ssize_t n;

	(void)userdata;
	if (!atomic_load(&wire.init_pending) || count != 2 || iov[0].iov_len != WIRE_OUT_HEADER ||
	    iov[1].iov_len < 36 || iov[1].iov_len > sizeof(out))
		return writev(fd, iov, count);
	memcpy(&unique, (uint8_t *)iov[0].iov_base + 8, sizeof(unique));
	if (unique != atomic_load(&wire.init_unique))
		return writev(fd, iov, count);
	atomic_store(&wire.init_pending, false);
	if (!atomic_load(&wire.want))
		return writev(fd, iov, count);
	if (wire_u32(iov[0].iov_base, 4) != 0 || !(wire_u32(iov[1].iov_base, 12) & WIRE_INIT_EXT)) {
		ckpt_warn("INIT reply without flags2: read-only files use the page cache");
		return writev(fd, iov, count);
	}
	memcpy(out, iov[1].iov_base, iov[1].iov_len);
	flags2 = wire_u32(out, 32) | WIRE_ALLOW_MMAP_FLAGS2;
	memcpy(out + 32, &flags2, sizeof(flags2));
	v[0] = iov[0];
	v[1].iov_base = out;
	v[1].iov_len = iov[1].iov_len;
	n = writev(fd, v, 2);
	if (n >= 0) {
		atomic_store(&wire.granted, true);
		ckpt_info("INIT reply: FUSE_DIRECT_IO_ALLOW_MMAP set");
	}
	return n;
}

static const struct fuse_custom_io wire_io = {
	.read = wire_read,
	.writev = wire_writev,
};

/* After fuse_session_mount: route the session's messages through wire_io. */
static void direct_read_install(struct fuse_session *se)
{
#ifndef FUSE_CAP_DIRECT_IO_ALLOW_MMAP
	if (fs.direct_read_opt != DIRECT_READ_NONE &&
	    fuse_session_custom_io(se, &wire_io, fuse_session_fd(se)) != 0)
		ckpt_warn("cannot hook the FUSE channel: read-only files use the page cache");
#else
	(void)se;
#endif
}

/* Whether the kernel was told FUSE_DIRECT_IO_ALLOW_MMAP: direct_io is used
 * for read-only handles only then (a shared mapping would fail otherwise,
 * also if the INIT reply could not be amended as wire_writev expects). */
static bool direct_granted(void)
{
#ifdef FUSE_CAP_DIRECT_IO_ALLOW_MMAP
	return true; /* fs.direct_views / direct_files are set only when wanted */
#else
	return atomic_load(&wire.granted);
#endif
}

/* From op_init, before the INIT reply is sent. */
static void direct_read_init(struct fuse_conn_info *conn)
{
	bool offered, on;

#ifdef FUSE_CAP_DIRECT_IO_ALLOW_MMAP
	offered = conn->capable & FUSE_CAP_DIRECT_IO_ALLOW_MMAP;
	on = offered && fs.direct_read_opt != DIRECT_READ_NONE;
	if (on)
		conn->want |= FUSE_CAP_DIRECT_IO_ALLOW_MMAP;
#else
	(void)conn;
	offered = atomic_load(&wire.offered);
	on = offered && fs.direct_read_opt != DIRECT_READ_NONE;
	atomic_store(&wire.want, on);
#endif
	fs.direct_views = on;
	fs.direct_files = on && fs.direct_read_opt == DIRECT_READ_ALL;
	if (!offered && fs.direct_read_given && fs.direct_read_opt != DIRECT_READ_NONE)
		ckpt_warn("direct_read: this kernel cannot map direct_io files shared "
			  "(no FUSE_DIRECT_IO_ALLOW_MMAP, Linux < 6.6): read-only files use the "
			  "page cache");
	ckpt_info("read-only view files: %s; stored files: %s",
		  fs.direct_views ? "direct_io (once the INIT reply allows mmap)" : "page cache",
		  fs.direct_files ? "direct_io (once the INIT reply allows mmap)" : "page cache");
}

/* ------------------------------------------------------------ requests */

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
	(void)userdata;
	if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC)
		conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
	if (conn->capable & FUSE_CAP_ASYNC_READ)
		conn->want |= FUSE_CAP_ASYNC_READ;
	conn->want &= ~(unsigned)FUSE_CAP_WRITEBACK_CACHE;
	/* libfuse 3.14 sizes its request buffers for at most 1 MiB. */
	conn->max_write = 1u << 20;
	conn->max_readahead = 1u << 20;
	conn->max_background = 64;
	direct_read_init(conn);
}

static void op_destroy(void *userdata)
{
	(void)userdata;
	/* Commit anything still open (the kernel normally releases first). */
	pthread_mutex_lock(&fs.nodes_lock);
	for (size_t i = 0; i < NODE_BUCKETS; i++) {
		for (struct node *n = fs.nodes[i]; n; n = n->next) {
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
	pthread_mutex_unlock(&fs.nodes_lock);
}

/* Entry for a virtual inode (no lookup counting: vnodes live until unmount). */
static void reply_ventry(fuse_req_t req, int r, const struct ckpt_inode *in)
{
	struct fuse_entry_param e;

	if (r < 0) {
		reply_err(req, r);
		return;
	}
	memset(&e, 0, sizeof(e));
	e.ino = in->ino;
	e.generation = 1;
	vtree_timeouts(in->ino, &e.entry_timeout, &e.attr_timeout);
	inode_to_stat(in, &e.attr);
	fuse_reply_entry(req, &e);
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e;
	struct ckpt_inode in;
	int r;

	if (vtree_is_virtual(parent) || vtree_is_view_name(parent, name)) {
		r = vtree_lookup(parent, name, &in);
		reply_ventry(req, r, &in);
		return;
	}
	r = ckpt_store_lookup(fs.store, parent, name, &in);

	if (r == 0)
		r = make_entry(parent, name, &in, &e);
	if (r < 0)
		reply_err(req, r);
	else
		fuse_reply_entry(req, &e);
}

static void forget_one(fuse_ino_t ino, uint64_t nlookup)
{
	struct node *n;
	bool freed = false;

	pthread_mutex_lock(&fs.nodes_lock);
	n = node_find_locked(ino);
	if (n) {
		n->nlookup = n->nlookup > nlookup ? n->nlookup - nlookup : 0;
		freed = node_put_locked(n);
	}
	pthread_mutex_unlock(&fs.nodes_lock);
	node_release_maybe_reap(ino, freed);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	forget_one(ino, nlookup);
	fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	for (size_t i = 0; i < count; i++)
		forget_one(forgets[i].ino, forgets[i].nlookup);
	fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckpt_inode in;
	struct stat st;
	int r = vtree_is_virtual(ino) ? vtree_getattr(ino, &in) : get_attr(ino, &in);

	(void)fi;
	if (r < 0) {
		reply_err(req, r);
		return;
	}
	inode_to_stat(&in, &st);
	if (vtree_is_virtual(ino)) {
		double entry, attr;
		vtree_timeouts(ino, &entry, &attr);
		fuse_reply_attr(req, &st, attr);
		return;
	}
	fuse_reply_attr(req, &st, ATTR_TIMEOUT);
}

static int64_t ts_ns(const struct timespec *ts)
{
	return (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec;
}

/* Change the size of ino: through its open writer if any, else by a
 * short-lived writer committed at once. */
static int set_size(fuse_ino_t ino, uint64_t size)
{
	ckpt_writer *w = NULL;
	struct node *n;
	int r;

	pthread_mutex_lock(&fs.nodes_lock);
	n = node_find_locked(ino);
	if (n && n->writer) {
		r = ckpt_writer_truncate(n->writer, size);
		pthread_mutex_unlock(&fs.nodes_lock);
		return r;
	}
	pthread_mutex_unlock(&fs.nodes_lock);
	r = ckpt_writer_new(fs.store, fs.pool, ino, size == 0, &w);
	if (r == 0)
		r = ckpt_writer_truncate(w, size);
	if (r == 0)
		r = commit_writer(ino, w, false, false);
	ckpt_writer_free(w);
	return r;
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		       struct fuse_file_info *fi)
{
	struct ckpt_inode in, cur;
	unsigned what = 0;
	struct stat st;
	int r = 0;

	(void)fi;
	if (vtree_is_virtual(ino)) {
		r = -EROFS;
		goto out;
	}
	if (to_set & FUSE_SET_ATTR_SIZE) {
		r = ckpt_store_getattr(fs.store, ino, &cur);
		if (r == 0 && S_ISDIR(cur.mode))
			r = -EISDIR;
		else if (r == 0 && !S_ISREG(cur.mode))
			r = -EINVAL;
		if (r == 0)
			r = set_size(ino, (uint64_t)attr->st_size);
		if (r < 0)
			goto out;
	}
	memset(&in, 0, sizeof(in));
	if (to_set & FUSE_SET_ATTR_MODE) {
		what |= CKPT_SET_MODE;
		in.mode = attr->st_mode;
	}
	if (to_set & FUSE_SET_ATTR_UID) {
		what |= CKPT_SET_UID;
		in.uid = attr->st_uid;
	}
	if (to_set & FUSE_SET_ATTR_GID) {
		what |= CKPT_SET_GID;
		in.gid = attr->st_gid;
	}
	if (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_ATIME_NOW)) {
		what |= CKPT_SET_ATIME;
		in.atime_ns = (to_set & FUSE_SET_ATTR_ATIME_NOW) ? ckpt_now_ns() : ts_ns(&attr->st_atim);
	}
	if (to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW)) {
		what |= CKPT_SET_MTIME;
		in.mtime_ns = (to_set & FUSE_SET_ATTR_MTIME_NOW) ? ckpt_now_ns() : ts_ns(&attr->st_mtim);
	}
	if (to_set & FUSE_SET_ATTR_CTIME) {
		what |= CKPT_SET_CTIME;
		in.ctime_ns = ts_ns(&attr->st_ctim);
	}
	if (what)
		r = ckpt_store_setattr(fs.store, ino, what, &in, NULL);
	if (r == 0 && what)
		vtree_changed();
	if (r == 0 && (what & CKPT_SET_MTIME)) {
		struct node *n;
		pthread_mutex_lock(&fs.nodes_lock);
		n = node_find_locked(ino);
		if (n && n->writer)
			ckpt_writer_set_mtime(n->writer, in.mtime_ns);
		pthread_mutex_unlock(&fs.nodes_lock);
	}
out:
	if (r == 0)
		r = get_attr(ino, &cur);
	if (r < 0) {
		reply_err(req, r);
		return;
	}
	inode_to_stat(&cur, &st);
	fuse_reply_attr(req, &st, ATTR_TIMEOUT);
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
	char *target = NULL;
	int r = vtree_is_virtual(ino) ? vtree_readlink(ino, &target) :
					ckpt_store_readlink(fs.store, ino, &target);

	if (r < 0)
		reply_err(req, r);
	else
		fuse_reply_readlink(req, target);
	free(target);
}

static void reply_new_node(fuse_req_t req, int r, fuse_ino_t parent, const char *name,
			   const struct ckpt_inode *in)
{
	struct fuse_entry_param e;

	if (r == 0)
		vtree_changed();
	if (r == 0)
		r = make_entry(parent, name, in, &e);
	if (r < 0)
		reply_err(req, r);
	else
		fuse_reply_entry(req, &e);
}

/* Names in the view trees, and the view roots themselves, cannot be made. */
static int check_new_name(fuse_ino_t parent, const char *name)
{
	if (vtree_is_virtual(parent))
		return -EROFS;
	if (vtree_is_view_name(parent, name))
		return -EEXIST;
	return 0;
}

/* Names in the view trees, and the view roots themselves, cannot be removed. */
static int check_old_name(fuse_ino_t parent, const char *name)
{
	if (vtree_is_virtual(parent) || vtree_is_view_name(parent, name))
		return -EROFS;
	return 0;
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		     dev_t rdev)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct ckpt_inode in;
	int r;

	(void)rdev;
	if ((r = check_new_name(parent, name)) < 0) {
		reply_err(req, r);
		return;
	}
	if (!S_ISREG(mode)) {
		reply_err(req, -EPERM); /* devices, fifos and sockets are not stored */
		return;
	}
	r = ckpt_store_mknode(fs.store, parent, name, mode & ~ctx->umask, ctx->uid, ctx->gid,
			      NULL, &in);
	reply_new_node(req, r, parent, name, &in);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct ckpt_inode in;
	int r = check_new_name(parent, name);

	if (r == 0)
		r = ckpt_store_mknode(fs.store, parent, name, S_IFDIR | (mode & ~ctx->umask & 07777),
				      ctx->uid, ctx->gid, NULL, &in);

	reply_new_node(req, r, parent, name, &in);
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct ckpt_inode in;
	int r = check_new_name(parent, name);

	if (r == 0)
		r = ckpt_store_mknode(fs.store, parent, name, S_IFLNK | 0777, ctx->uid, ctx->gid,
				      link, &in);

	reply_new_node(req, r, parent, name, &in);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	struct ckpt_inode in;
	int r = vtree_is_virtual(ino) ? -EROFS : check_new_name(newparent, newname);

	if (r == 0)
		r = ckpt_store_link(fs.store, ino, newparent, newname, &in);

	if (r == 0)
		r = get_attr(ino, &in);
	reply_new_node(req, r, newparent, newname, &in);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	int r = check_old_name(parent, name);

	if (r == 0)
		r = ckpt_store_unlink(fs.store, parent, name, false);
	if (r == 0)
		vtree_changed();
	reply_err(req, r);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	int r = check_old_name(parent, name);

	if (r == 0)
		r = ckpt_store_unlink(fs.store, parent, name, true);
	if (r == 0)
		vtree_changed();
	reply_err(req, r);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		      const char *newname, unsigned int flags)
{
	int r = check_old_name(parent, name);

	if (r == 0)
		r = check_new_name(newparent, newname);
	if (r == 0)
		r = ckpt_store_rename(fs.store, parent, name, newparent, newname, flags);
	if (r == 0)
		vtree_changed();
	reply_err(req, r);
}

/* Attach a handle to ino; writable handles share the node's writer. */
static int open_handle(fuse_ino_t ino, int flags, struct handle **ret)
{
	bool writable = (flags & O_ACCMODE) != O_RDONLY;
	bool trunc = writable && (flags & O_TRUNC);
	struct handle *h = calloc(1, sizeof(*h));
	struct ckpt_inode in;
	struct node *n;
	int r;

	if (!h)
		return -ENOMEM;
	pthread_rwlock_init(&h->snap_lock, NULL);
	pthread_mutex_lock(&fs.nodes_lock);
	n = node_find_locked(ino);
	h->version = n ? n->version : 0;
	pthread_mutex_unlock(&fs.nodes_lock);
	r = ckpt_store_getattr(fs.store, ino, &in);
	if (r == 0 && S_ISDIR(in.mode))
		r = -EISDIR;
	if (r == 0 && !writable)
		r = ckpt_store_load_extents(fs.store, ino, &h->snap);
	if (r < 0) {
		free(h);
		return r;
	}
	h->writable = writable;
	pthread_mutex_lock(&fs.nodes_lock);
	n = node_get_locked(ino);
	if (!n) {
		r = -ENOMEM;
	} else if (writable && !n->writer) {
		r = ckpt_writer_new(fs.store, fs.pool, ino, trunc, &n->writer);
	} else if (trunc) {
		r = ckpt_writer_truncate(n->writer, 0);
	}
	if (r == 0) {
		n->nopen++;
		if (writable)
			n->nwriters++;
		h->node = n;
	} else if (n) {
		node_put_locked(n);
	}
	pthread_mutex_unlock(&fs.nodes_lock);
	if (r < 0) {
		ckpt_extent_list_free(h->snap);
		free(h);
		return r;
	}
	*ret = h;
	return 0;
}

static void handle_close(fuse_ino_t ino, struct handle *h);

/*
 * Writable handles bypass the page cache (direct_io): uncommitted bytes never
 * enter the kernel's cache, where readers of the committed snapshot would
 * see them, and large writes reach the daemon without page-cache copies.
 * The price: shared writable mmap of a file open for writing is refused by
 * the kernel (ENODEV).  Read-only handles of view files (h->vf) bypass it
 * by default and those of stored files with -o direct_read=all, once the
 * kernel maps such files shared (fs.direct_views / direct_files, see
 * direct_read_init); otherwise they use the page cache, dropped at open and
 * after every commit.
 */
static void set_open_flags(struct fuse_file_info *fi, struct handle *h)
{
	fi->fh = (uint64_t)(uintptr_t)h;
	fi->keep_cache = 0;
	fi->direct_io = h->writable ||
			((h->vf ? fs.direct_views : fs.direct_files) && direct_granted());
	h->direct = fi->direct_io;
	if (h->direct && !h->writable)
		__atomic_fetch_add(&fs.ra_streams, 1, __ATOMIC_RELAXED);
}

/* A handle leaves the streams counted at open (set_open_flags): once, at
 * its release or its interrupted open. */
static void stream_end(struct handle *h)
{
	if (h->direct && !h->writable)
		__atomic_fetch_sub(&fs.ra_streams, 1, __ATOMIC_RELAXED);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct handle *h = NULL;
	int r;

	if (vtree_is_virtual(ino)) {
		if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC))
			r = -EROFS;
		else if (!(h = calloc(1, sizeof(*h))))
			r = -ENOMEM;
		else
			r = vtree_open(ino, &h->vf);
		if (r < 0) {
			free(h);
			reply_err(req, r);
			return;
		}
		set_open_flags(fi, h);
		if (fuse_reply_open(req, fi) == -ENOENT) {
			stream_end(h); /* interrupted open: no release will come */
			vtree_close(h->vf);
			free(h);
		}
		return;
	}
	r = open_handle(ino, fi->flags, &h);

	if (r < 0) {
		reply_err(req, r);
		return;
	}
	set_open_flags(fi, h);
	if (fuse_reply_open(req, fi) == -ENOENT) {
		stream_end(h); /* interrupted open: no release will come */
		handle_close(ino, h);
	}
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		      struct fuse_file_info *fi)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct fuse_entry_param e;
	struct ckpt_inode in;
	struct handle *h = NULL;
	int r;

	r = check_new_name(parent, name);
	if (r == 0)
		r = ckpt_store_mknode(fs.store, parent, name,
				      S_IFREG | (mode & ~ctx->umask & 07777), ctx->uid, ctx->gid,
				      NULL, &in);
	if (r == 0)
		r = open_handle(in.ino, fi->flags | O_TRUNC, &h);
	if (r == 0)
		r = make_entry(parent, name, &in, &e);
	if (r < 0) {
		reply_err(req, r);
		return;
	}
	vtree_changed();
	set_open_flags(fi, h);
	fuse_reply_create(req, &e, fi);
}

static struct handle *fh_of(struct fuse_file_info *fi)
{
	return (struct handle *)(uintptr_t)fi->fh;
}

/* Switch a read-only handle to the latest committed content if a commit
 * happened since it was loaded (see struct handle). */
static int refresh_snapshot(fuse_ino_t ino, struct handle *h)
{
	struct ckpt_extent_list *l = NULL;
	uint64_t v;
	int r;

	pthread_mutex_lock(&fs.nodes_lock);
	v = h->node->version;
	pthread_mutex_unlock(&fs.nodes_lock);
	pthread_rwlock_rdlock(&h->snap_lock);
	r = h->version == v;
	pthread_rwlock_unlock(&h->snap_lock);
	if (r)
		return 0;
	r = ckpt_store_load_extents(fs.store, ino, &l);
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

/*
 * Read-ahead (core/readahead.h): a read that continues the handle's previous
 * one queues the chunks of the next window for the workers before this
 * request is served, so they are read and decompressed while this request
 * and the next ones are.  Through the page cache the kernel's own
 * read-ahead (1 MiB requests, see raise_readahead) stays on and keeps
 * several requests in flight; the window is RA_WINDOW.  A direct_io reader
 * has one request in flight, so its window is deeper, sized by how many
 * direct_io read handles are open (fs.ra_streams, ckpt_ra_window_size).
 * They are counted at open, not at their first read: four readers starting
 * together would otherwise all size their first window as if alone.
 */
#define RA_WINDOW (8ull << 20)
#define RA_MAX_CHUNKS 256 /* the read-ahead queue's length */

/* Returns whether the read is sequential (its chunks are then cached as
 * stream entries, see ckpt_cache_fill_as()). */
static bool read_ahead(struct handle *h, size_t size, off_t off)
{
	ckpt_digest d[RA_MAX_CHUNKS];
	uint64_t from, to, fsize, window = RA_WINDOW;
	size_t n = 0;
	bool seq = false;

	if (!fs.ra)
		return false;
	if (h->direct)
		window = ckpt_ra_window_size(fs.stream_cap,
					     __atomic_load_n(&fs.ra_streams, __ATOMIC_RELAXED));
	if (h->vf) {
		fsize = vtree_file_size(h->vf);
		if (ckpt_ra_window_next(&h->ra, (uint64_t)off, size, fsize, window, &from, &to,
					&seq))
			n = vtree_chunks(h->vf, from, to - from, d, RA_MAX_CHUNKS);
	} else {
		pthread_rwlock_rdlock(&h->snap_lock);
		fsize = h->snap->size;
		if (ckpt_ra_window_next(&h->ra, (uint64_t)off, size, fsize, window, &from, &to,
					&seq))
			n = ckpt_store_prefetch_list(h->snap, from, to - from, d, RA_MAX_CHUNKS,
						     NULL);
		pthread_rwlock_unlock(&h->snap_lock);
	}
	ckpt_readahead_submit(fs.ra, d, n);
	return seq;
}

/*
 * Drop-behind: once a sequential reader (read_ahead() says so) is
 * DROP_LAG + DROP_STEP bytes into a file, the kernel's cached pages more
 * than DROP_LAG behind it are dropped, DROP_STEP at a time, by a range
 * invalidation from the invalidation thread.  A checkpoint is read once;
 * keeping every page of a 16 GiB load in the page cache only pushes out
 * what the node needs, and on a VM whose host reclaims memory the guest
 * frees (virtio-balloon free page reporting) each page of fresh page cache
 * costs a host page fault on first touch: a 4 GiB view read that recycles
 * the pages it drops measured 1.25-1.6x faster (docs/performance.md 6c).  Not done
 * while another handle has the file open (concurrent readers share the
 * page cache); a reopen re-reads from the daemon anyway, since opens drop
 * the cache (keep_cache = 0).  Off with -o drop_behind=0.
 */
#define DROP_LAG (32ull << 20)
#define DROP_STEP (32ull << 20)

static bool handle_shared(struct handle *h)
{
	bool shared;

	if (h->vf)
		return vtree_file_shared(h->vf);
	pthread_mutex_lock(&fs.nodes_lock);
	shared = h->node->nopen > 1;
	pthread_mutex_unlock(&fs.nodes_lock);
	return shared;
}

static void drop_behind(fuse_ino_t ino, struct handle *h, size_t size, off_t off)
{
	uint64_t end = (uint64_t)off + size, to, done;

	if (!fs.drop_behind || !fs.inval_started || end < DROP_LAG + DROP_STEP)
		return; /* (without the thread nothing would drain the queue) */
	to = (end - DROP_LAG) & ~(uint64_t)4095;
	done = __atomic_load_n(&h->dropped, __ATOMIC_RELAXED);
	if (to < done + DROP_STEP)
		return;
	if (!__atomic_compare_exchange_n(&h->dropped, &done, to, false, __ATOMIC_RELAXED,
					 __ATOMIC_RELAXED))
		return; /* another thread of this reader took the step */
	if (!handle_shared(h))
		queue_inval_range(ino, done, to - done);
}

/*
 * Committed content is replied from the chunk cache without copying: the
 * reply's iovecs point into the pinned cache entries for pieces of 32 KiB
 * and more (struct ckpt_gather), only short pieces (views interleaving
 * tensor-parallel rows, zeros, headers) are copied into buf.
 */
static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct handle *h = fh_of(fi);
	/* touched memory (the reserve) rather than malloc's: 1 MiB requests
	 * from many threads left a third of a cold view read's remaining page
	 * faults in the copy into this buffer (docs/performance.md 6k) */
	uint8_t *buf = ckpt_store_buf_alloc(fs.store, size);
	struct ckpt_gather g;
	bool gathered = false;
	ssize_t r;

	if (!buf) {
		reply_err(req, -ENOMEM);
		return;
	}
	ckpt_gather_init(&g);
	if (h->vf) {
		g.stream = read_ahead(h, size, off);
		r = vtree_read(h->vf, buf, size, (uint64_t)off, &g);
		gathered = true;
	} else if (h->writable) {
		r = ckpt_writer_read(h->node->writer, buf, size, (uint64_t)off);
	} else {
		r = refresh_snapshot(ino, h);
		if (r == 0) {
			g.stream = read_ahead(h, size, off);
			pthread_rwlock_rdlock(&h->snap_lock);
			r = ckpt_store_read_extents_gather(fs.store, h->snap, buf, size,
							   (uint64_t)off, &g);
			pthread_rwlock_unlock(&h->snap_lock);
			gathered = true;
		}
	}
	if (r < 0) {
		char *path = node_path(ino);
		ckpt_err("%s: read of %zu bytes at offset %lld failed: %s%s", path ? path : "?",
			 size, (long long)off, strerror((int)-r),
			 r == -EIO ? " (damaged chunk, see above; run `ckpt fsck`)" : "");
		free(path);
		reply_err(req, (int)r);
	} else if (gathered) {
		/* Before the reply: once it is out, the reader may close the file
		 * and its release free h on another thread (a daemon read h->node
		 * after a free here and died, reading 4 GiB of stored files). */
		if (g.stream)
			drop_behind(ino, h, size, off);
		fuse_reply_iov(req, g.iov, (int)g.niov);
	} else {
		fuse_reply_buf(req, (const char *)buf, (size_t)r);
	}
	if (gathered)
		ckpt_store_gather_done(fs.store, &g);
	ckpt_store_buf_free(fs.store, buf, size);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	struct handle *h = fh_of(fi);
	int r;

	(void)ino;
	if (!h->writable) {
		reply_err(req, -EBADF);
		return;
	}
	r = ckpt_writer_write(h->node->writer, buf, size, (uint64_t)off);
	if (r < 0) {
		char *path = node_path(ino);
		ckpt_warn("%s: write of %zu bytes at offset %lld failed: %s", path ? path : "?",
			  size, (long long)off, strerror(-r));
		free(path);
		reply_err(req, r);
	} else {
		fuse_reply_write(req, size);
	}
}

static int commit_handle(fuse_ino_t ino, struct handle *h, bool durable)
{
	int r;

	if (h->vf)
		return 0;
	if (!h->writable)
		return durable ? ckpt_store_sync_file(fs.store, ino) : 0;
	r = commit_writer(ino, h->node->writer, durable, true);
	if (r < 0) {
		char *path = node_path(ino);
		ckpt_err("%s: cannot commit file: %s", path ? path : "?", strerror(-r));
		free(path);
	}
	return r;
}

static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	reply_err(req, commit_handle(ino, fh_of(fi), false));
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	(void)datasync;
	reply_err(req, commit_handle(ino, fh_of(fi), true));
}

/* Drop a handle: the last writable handle commits and frees the writer. */
static void handle_close(fuse_ino_t ino, struct handle *h)
{
	struct node *n = h->node;
	ckpt_writer *w = NULL;
	bool freed;

	pthread_mutex_lock(&fs.nodes_lock);
	if (h->writable && --n->nwriters == 0) {
		w = n->writer;
		n->writer = NULL;
	}
	n->nopen--;
	freed = node_put_locked(n);
	pthread_mutex_unlock(&fs.nodes_lock);
	if (w) {
		/* flush already committed; this catches writes after it */
		int r = commit_writer(ino, w, false, true);
		if (r < 0)
			ckpt_err("inode %" PRIu64 ": changes after close lost: %s", (uint64_t)ino,
				 strerror(-r));
		ckpt_writer_free(w);
	}
	node_release_maybe_reap(ino, freed);
	ckpt_extent_list_free(h->snap);
	pthread_rwlock_destroy(&h->snap_lock);
	free(h);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct handle *h = fh_of(fi);

	stream_end(h);
	if (h->vf) {
		vtree_close(h->vf);
		free(h);
	} else {
		handle_close(ino, h);
	}
	fuse_reply_err(req, 0);
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct dir_handle *d = calloc(1, sizeof(*d));
	struct ckpt_inode in;
	int r = d ? 0 : -ENOMEM;

	if (r == 0 && vtree_is_virtual(ino)) {
		r = vtree_readdir(ino, &d->ents, &d->n);
		goto done;
	}
	if (r == 0)
		r = ckpt_store_getattr(fs.store, ino, &in);
	if (r == 0 && !S_ISDIR(in.mode))
		r = -ENOTDIR;
	if (r == 0)
		r = ckpt_store_readdir(fs.store, ino, &d->ents, &d->n);
done:
	if (r < 0) {
		free(d);
		reply_err(req, r);
		return;
	}
	fi->fh = (uint64_t)(uintptr_t)d;
	fi->cache_readdir = 0;
	fuse_reply_open(req, fi);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	struct dir_handle *d = (struct dir_handle *)(uintptr_t)fi->fh;
	char *buf = malloc(size ? size : 1);
	size_t used = 0;

	if (!buf) {
		reply_err(req, -ENOMEM);
		return;
	}
	/* offsets: 0 "." 1 ".." 2.. entries */
	for (size_t i = (size_t)off; i < d->n + 2; i++) {
		struct stat st;
		const char *name;
		size_t need;

		memset(&st, 0, sizeof(st));
		if (i == 0) {
			name = ".";
			st.st_ino = ino;
			st.st_mode = S_IFDIR;
		} else if (i == 1) {
			name = "..";
			st.st_ino = ino; /* the kernel fills in the real parent */
			st.st_mode = S_IFDIR;
		} else {
			name = d->ents[i - 2].name;
			st.st_ino = d->ents[i - 2].ino;
			st.st_mode = d->ents[i - 2].mode;
		}
		need = fuse_add_direntry(req, buf + used, size - used, name, &st, (off_t)(i + 1));
		if (need > size - used)
			break;
		used += need;
	}
	fuse_reply_buf(req, buf, used);
	free(buf);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct dir_handle *d = (struct dir_handle *)(uintptr_t)fi->fh;

	(void)ino;
	ckpt_dirents_free(d->ents, d->n);
	free(d);
	fuse_reply_err(req, 0);
}

static void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	(void)ino;
	(void)datasync;
	(void)fi;
	int r = ckpt_store_flush(fs.store);

	if (r == 0)
		r = ckpt_store_sync_meta(fs.store);
	reply_err(req, r);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs st;
	int r = ckpt_store_statfs(fs.store, &st);

	(void)ino;
	if (r < 0)
		reply_err(req, r);
	else
		fuse_reply_statfs(req, &st);
}

static const struct fuse_lowlevel_ops ops = {
	.init = op_init,
	.destroy = op_destroy,
	.lookup = op_lookup,
	.forget = op_forget,
	.forget_multi = op_forget_multi,
	.getattr = op_getattr,
	.setattr = op_setattr,
	.readlink = op_readlink,
	.mknod = op_mknod,
	.mkdir = op_mkdir,
	.symlink = op_symlink,
	.link = op_link,
	.unlink = op_unlink,
	.rmdir = op_rmdir,
	.rename = op_rename,
	.open = op_open,
	.create = op_create,
	.read = op_read,
	.write = op_write,
	.flush = op_flush,
	.fsync = op_fsync,
	.release = op_release,
	.opendir = op_opendir,
	.readdir = op_readdir,
	.releasedir = op_releasedir,
	.fsyncdir = op_fsyncdir,
	.statfs = op_statfs,
};

/* ------------------------------------------------------------- options */

struct options {
	const char *store;
	int compress;
	char *cache_size;
	char *buf_reserve;
	int verify_dedup;
	int inline_compress;
	int nobackground;
	char *log_level;
	char *tp_rules;
	unsigned workers;
	unsigned readahead_kb;
	unsigned ra_workers;
	unsigned drop_behind;
	char *direct_read;
	unsigned view_cache;
	int nonopt;
};

#define OPT(t, p) { t, offsetof(struct options, p), 1 }
static const struct fuse_opt opt_spec[] = {
	OPT("compress=%d", compress),
	OPT("cache_size=%s", cache_size),
	OPT("buf_reserve=%s", buf_reserve),
	OPT("verify_dedup", verify_dedup),
	OPT("inline_compress", inline_compress),
	OPT("nobackground", nobackground),
	OPT("log_level=%s", log_level),
	OPT("workers=%u", workers),
	OPT("tp_rules=%s", tp_rules),
	OPT("readahead_kb=%u", readahead_kb),
	OPT("ra_workers=%u", ra_workers),
	OPT("view_cache=%u", view_cache),
	OPT("drop_behind=%u", drop_behind),
	OPT("direct_read=%s", direct_read),
	FUSE_OPT_END
};

static int opt_proc(void *data, const char *arg, int key, struct fuse_args *outargs)
{
	struct options *o = data;

	(void)outargs;
	if (key == FUSE_OPT_KEY_NONOPT && !o->store) {
		o->store = strdup(arg);
		return 0; /* consumed: STORE */
	}
	return 1;
}

static int parse_size(const char *s, uint64_t *ret)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
	case 'k': case 'K': v <<= 10; end++; break;
	case 'm': case 'M': v <<= 20; end++; break;
	case 'g': case 'G': v <<= 30; end++; break;
	default: break;
	}
	if (*end && strcmp(end, "iB") && strcmp(end, "B"))
		return -EINVAL;
	*ret = v;
	return 0;
}

static void usage(const char *prog)
{
	printf("usage: %s STORE MOUNTPOINT [-f] [-d] [-o opt[,opt...]]\n"
	       "\n"
	       "ckptfs options:\n"
	       "  -o compress=N        zstd level 0..19 (0: store raw), default 1\n"
	       "  -o cache_size=SIZE   decompressed chunk cache, e.g. 512M (default 256M)\n"
	       "  -o buf_reserve=SIZE  chunk buffers mapped and touched at mount and kept,\n"
	       "                       so that reads do not fault memory in (default: the\n"
	       "                       cache's stream budget, a quarter of cache_size up\n"
	       "                       to 64M, plus 32M; at most cache_size; 0: none,\n"
	       "                       and read-ahead's buffers mapped at first use)\n"
	       "  -o verify_dedup      compare bytes on every dedup hit\n"
	       "  -o inline_compress   compress while writing (default: write raw, compress\n"
	       "                       in the background once writes pause)\n"
	       "  -o nobackground      no background work at all: compress inline and\n"
	       "                       leave space reclaiming to `ckpt gc`\n"
	       "  -o log_level=LEVEL   error|warn|info|debug (default warn)\n"
	       "  -o workers=N         chunk worker threads (default: one per CPU)\n"
	       "  -o tp_rules=FILE     extra tensor-parallel rules for views: lines \"REGEX DIM\"\n"
	       "  -o readahead_kb=N    read-ahead of the mount in KiB (default 1024; 0 keeps\n"
	       "                       the kernel's)\n"
	       "  -o ra_workers=N      threads loading chunks ahead of sequential readers\n"
	       "                       (default: two per CPU; 0, or cache_size=0, turns\n"
	       "                       chunk read-ahead off)\n"
	       "  -o view_cache=N      resharded views kept built, most recently used\n"
	       "                       (1-4096, default 8)\n"
	       "  -o drop_behind=0|1   drop the kernel's cached pages of a file 32 MiB\n"
	       "                       behind a sequential reader that has it open alone\n"
	       "                       (default 1)\n"
	       "  -o direct_read=views|all|none\n"
	       "                       read-only files that bypass the kernel's page\n"
	       "                       cache (direct_io): view files (default), also\n"
	       "                       stored files, or none; only where the kernel can\n"
	       "                       still map such files shared (Linux 6.6 and later)\n"
	       "  -f                   stay in the foreground, log to stderr\n"
	       "  -d                   foreground with debug logging (FUSE and ckptfs)\n"
	       "\n"
	       "Without -f the daemon detaches once the mount is ready and logs to\n"
	       "STORE/ckptfs.log.  Unmount with: fusermount3 -u MOUNTPOINT\n\n",
	       prog);
	fuse_cmdline_help();
	fuse_lowlevel_help();
}

/*
 * Page-cache reads reach the daemon in read-ahead sized requests, 128 KiB by
 * default for a FUSE mount.  Raising the mount's read-ahead to 1 MiB (the
 * largest request libfuse 3.14 accepts) read 1 GiB of checkpoint 1.35x faster
 * here (median of 3, caches dropped: 1.43 s vs 1.93 s).  The knob is the
 * mount's backing device in sysfs, reachable once the mount serves requests;
 * without permission it is skipped.
 */
struct ra_arg {
	char *mountpoint;
	unsigned kb;
};

static void *raise_readahead(void *p)
{
	struct ra_arg *a = p;
	struct stat st;
	char path[128], val[32];
	int fd, n;

	if (stat(a->mountpoint, &st) == 0) {
		snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb",
			 major(st.st_dev), minor(st.st_dev));
		fd = open(path, O_WRONLY | O_CLOEXEC);
		n = snprintf(val, sizeof(val), "%u\n", a->kb);
		if (fd < 0 || write(fd, val, (size_t)n) != n)
			ckpt_info("cannot set read-ahead of %s to %u KiB (%s)", a->mountpoint, a->kb,
				  strerror(errno));
		if (fd >= 0)
			close(fd);
	}
	free(a->mountpoint);
	free(a);
	return NULL;
}

static void start_raise_readahead(const char *mountpoint, unsigned kb)
{
	struct ra_arg *a = calloc(1, sizeof(*a));
	pthread_t t;

	if (!a || !(a->mountpoint = realpath(mountpoint, NULL))) {
		free(a);
		return;
	}
	a->kb = kb;
	if (pthread_create(&t, NULL, raise_readahead, a) != 0) {
		free(a->mountpoint);
		free(a);
		return;
	}
	pthread_detach(t);
}

/* Detach before opening anything that starts threads (RocksDB does); the
 * parent waits for the child to report whether the mount came up. */
static int status_fd = -1;

static int detach(void)
{
	int p[2];
	pid_t pid;

	if (pipe(p) < 0)
		return -errno;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid > 0) {
		char msg[1024];
		ssize_t n;
		close(p[1]);
		n = read(p[0], msg, sizeof(msg) - 1);
		if (n > 0 && msg[0] == '0')
			_exit(0);
		if (n > 1) {
			msg[n] = '\0';
			fprintf(stderr, "%s", msg + 1);
		} else {
			fprintf(stderr, "ckptfs: the daemon exited before the mount was ready\n");
		}
		_exit(1);
	}
	close(p[0]);
	status_fd = p[1];
	setsid();
	return 0;
}

static void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void report(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg + 1, sizeof(msg) - 1, fmt, ap);
	va_end(ap);
	if (status_fd >= 0) {
		msg[0] = '1';
		if (write(status_fd, msg, strlen(msg + 1) + 1) < 0) {
			/* parent gone: nothing to report to */
		}
	} else {
		fputs(msg + 1, stderr);
	}
}

static void redirect_output(const char *store)
{
	char *path;
	int fd;

	if (asprintf(&path, "%s/ckptfs.log", store) < 0)
		return;
	fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	free(path);
	if (fd >= 0) {
		dup2(fd, STDOUT_FILENO);
		dup2(fd, STDERR_FILENO);
		close(fd);
	}
	fd = open("/dev/null", O_RDONLY);
	if (fd >= 0) {
		dup2(fd, STDIN_FILENO);
		close(fd);
	}
}

int main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts cmd;
	struct options o;
	struct ckpt_store_opts so;
	struct fuse_session *se = NULL;
	struct fuse_loop_config *lcfg = NULL;
	ckpt_tp_rules *rules = NULL;
	char err[512];
	int ret = 1, r;

	memset(&o, 0, sizeof(o));
	memset(&cmd, 0, sizeof(cmd));
	o.compress = INT_MIN; /* unset */
	o.readahead_kb = UINT_MAX; /* unset */
	o.ra_workers = UINT_MAX;   /* unset */
	o.view_cache = VTREE_VIEW_CACHE_DEFAULT;
	o.drop_behind = 1;
	/* Chunk and request buffers are 128 KiB..4 MiB: by default glibc serves
	 * them with fresh mmap()s, and every page of every buffer is faulted in
	 * and zeroed again (clear_page was ~10% of the write path).  Keep them
	 * on the heap and reuse them. */
	mallopt(M_MMAP_THRESHOLD, 8 << 20);
	mallopt(M_TRIM_THRESHOLD, 32 << 20);
	if (fuse_opt_parse(&args, &o, opt_spec, opt_proc) < 0)
		goto out;
	if (fuse_parse_cmdline(&args, &cmd) != 0)
		goto out;
	if (cmd.show_help) {
		usage(argv[0]);
		ret = 0;
		goto out;
	}
	if (cmd.show_version) {
		printf("ckptfs %s, libfuse %s\n", PACKAGE_VERSION, fuse_pkgversion());
		ret = 0;
		goto out;
	}
	if (!o.store || !cmd.mountpoint) {
		fprintf(stderr, "usage: %s STORE MOUNTPOINT [-f] [-o opt,...]  (--help for more)\n",
			argv[0]);
		goto out;
	}
	if (o.store[0] != '/') {
		/* the daemon changes to / once detached */
		char cwd[PATH_MAX], *abs;
		if (!getcwd(cwd, sizeof(cwd)) || asprintf(&abs, "%s/%s", cwd, o.store) < 0) {
			fprintf(stderr, "ckptfs: cannot resolve %s: %s\n", o.store, strerror(errno));
			goto out;
		}
		free((char *)o.store);
		o.store = abs;
	}
	ckpt_store_opts_init(&so);
	so.create = true;
	if (o.compress != INT_MIN) {
		if (o.compress < 0 || o.compress > 19) {
			fprintf(stderr, "ckptfs: compress=%d: level must be 0 (off) to 19\n",
				o.compress);
			goto out;
		}
		so.compress_level = o.compress;
	}
	so.verify_dedup = o.verify_dedup;
	so.inline_compress = o.inline_compress;
	so.background = !o.nobackground;
	if (o.cache_size && parse_size(o.cache_size, &so.cache_size) < 0) {
		fprintf(stderr, "ckptfs: invalid cache_size '%s'\n", o.cache_size);
		goto out;
	}
	so.buf_reserve = CKPT_BUF_RESERVE_AUTO;
	if (o.buf_reserve && parse_size(o.buf_reserve, &so.buf_reserve) < 0) {
		fprintf(stderr, "ckptfs: invalid buf_reserve '%s'\n", o.buf_reserve);
		goto out;
	}
	if (o.view_cache < 1 || o.view_cache > 4096) {
		fprintf(stderr, "ckptfs: invalid view_cache %u: between 1 and 4096 views\n",
			o.view_cache);
		goto out;
	}
	fs.direct_read_opt = DIRECT_READ_VIEWS;
	if (o.direct_read) {
		fs.direct_read_given = true;
		if (strcmp(o.direct_read, "views") == 0) {
			fs.direct_read_opt = DIRECT_READ_VIEWS;
		} else if (strcmp(o.direct_read, "all") == 0) {
			fs.direct_read_opt = DIRECT_READ_ALL;
		} else if (strcmp(o.direct_read, "none") == 0) {
			fs.direct_read_opt = DIRECT_READ_NONE;
		} else {
			fprintf(stderr, "ckptfs: invalid direct_read '%s' (views, all or none)\n",
				o.direct_read);
			goto out;
		}
	}
	if (cmd.debug)
		ckpt_log_set_level(CKPT_LOG_DEBUG);
	if (o.log_level) {
		static const char *const names[] = { "error", "warn", "info", "debug" };
		size_t i;
		for (i = 0; i < CKPT_ARRAY_SIZE(names); i++)
			if (!strcmp(o.log_level, names[i]))
				break;
		if (i == CKPT_ARRAY_SIZE(names)) {
			fprintf(stderr, "ckptfs: invalid log_level '%s'\n", o.log_level);
			goto out;
		}
		ckpt_log_set_level((enum ckpt_log_level)i);
	}
	r = ckpt_tp_rules_new(o.tp_rules, &rules, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "ckptfs: tp_rules: %s\n", err);
		goto out;
	}
	if (!cmd.foreground && detach() < 0) {
		fprintf(stderr, "ckptfs: cannot detach: %s\n", strerror(errno));
		goto out;
	}
	r = ckpt_store_open(o.store, &so, &fs.store, err, sizeof(err));
	if (r < 0) {
		report("ckptfs: %s\n", err);
		goto out;
	}
	r = ckpt_pool_new(o.workers, &fs.pool);
	if (r < 0) {
		report("ckptfs: cannot start workers: %s\n", strerror(-r));
		goto out;
	}
	/* read-ahead loads into the chunk cache: pointless without one */
	if (o.ra_workers != 0 && so.cache_size > 0) {
		struct ckpt_cache_stats cs;

		ckpt_store_cache_stats(fs.store, &cs);
		fs.stream_cap = cs.stream_cap;
		r = ckpt_readahead_new(fs.store, o.ra_workers == UINT_MAX ? 0 : o.ra_workers, 256,
				       &fs.ra);
		if (r < 0) {
			report("ckptfs: cannot start read-ahead workers: %s\n", strerror(-r));
			goto out;
		}
	}
	pthread_mutex_init(&fs.nodes_lock, NULL);
	vtree_init(fs.store, rules, o.view_cache);
	se = fuse_session_new(&args, &ops, sizeof(ops), NULL);
	if (!se) {
		report("ckptfs: cannot create FUSE session (bad -o option?)\n");
		goto out;
	}
	if (fuse_set_signal_handlers(se) != 0) {
		report("ckptfs: cannot install signal handlers\n");
		goto out;
	}
	fs.se = se;
	fs.drop_behind = o.drop_behind != 0;
	pthread_mutex_init(&fs.inval_lock, NULL);
	pthread_cond_init(&fs.inval_cond, NULL);
	if (pthread_create(&fs.inval_thread, NULL, inval_main, NULL) == 0)
		fs.inval_started = true;
	if (fuse_session_mount(se, cmd.mountpoint) != 0) {
		report("ckptfs: cannot mount %s (see messages above)\n", cmd.mountpoint);
		goto out_signals;
	}
	direct_read_install(se);
	if (!cmd.foreground) {
		if (chdir("/") < 0) {
			/* not fatal */
		}
		redirect_output(o.store);
		ckpt_info("mounted %s on %s", o.store, cmd.mountpoint);
		if (write(status_fd, "0", 1) < 0) {
			/* parent gone */
		}
		close(status_fd);
		status_fd = -1;
	}
	if (o.readahead_kb == UINT_MAX)
		o.readahead_kb = 1024; /* not given */
	if (o.readahead_kb)
		start_raise_readahead(cmd.mountpoint, o.readahead_kb);
	lcfg = fuse_loop_cfg_create();
	fuse_loop_cfg_set_clone_fd(lcfg, cmd.clone_fd);
	fuse_loop_cfg_set_max_threads(lcfg, cmd.max_threads && cmd.max_threads <= 1024 ?
						    cmd.max_threads : 16);
	fuse_loop_cfg_set_idle_threads(lcfg, cmd.max_idle_threads && cmd.max_idle_threads <= 1024 ?
						     cmd.max_idle_threads : 8);
	if (cmd.singlethread)
		ret = fuse_session_loop(se) ? 1 : 0;
	else
		ret = fuse_session_loop_mt(se, lcfg) ? 1 : 0;
	fuse_session_unmount(se);
out_signals:
	if (fs.inval_started) {
		pthread_mutex_lock(&fs.inval_lock);
		fs.inval_stop = true;
		fs.ninval = 0;
		pthread_cond_signal(&fs.inval_cond);
		pthread_mutex_unlock(&fs.inval_lock);
		pthread_join(fs.inval_thread, NULL);
		fs.inval_started = false;
	}
	free(fs.inval);
	fuse_remove_signal_handlers(se);
out:
	if (se)
		fuse_session_destroy(se);
	fuse_loop_cfg_destroy(lcfg);
	if (fs.ra) {
		struct ckpt_ra_stats st;
		ckpt_readahead_get_stats(fs.ra, &st);
		ckpt_info("read-ahead: %" PRIu64 " chunks queued, %" PRIu64 " loaded, %" PRIu64
			  " found cached, %" PRIu64 " dropped (queue full), %" PRIu64 " failed",
			  st.submitted, st.loaded, st.skipped, st.dropped, st.failed);
		if (fs.store) {
			struct ckpt_prefetch_stats ps;
			ckpt_store_prefetch_stats(fs.store, &ps);
			ckpt_info("read-ahead requests: %" PRIu64 " by kernel AIO, %" PRIu64
				  " by pread, %" PRIu64 " failed (read again alone)",
				  ps.aio, ps.sync, ps.failed);
		}
	}
	if (fs.store) {
		struct ckpt_cache_stats cs;
		ckpt_store_cache_stats(fs.store, &cs);
		ckpt_info("chunk cache: %" PRIu64 " hits, %" PRIu64 " misses (loaded by readers), %"
			  PRIu64 " evictions (%" PRIu64 " of streamed chunks not read to the end), %"
			  PRIu64 " bytes held (%" PRIu64 " stream)",
			  cs.hits, cs.misses, cs.evictions, cs.evicted_unread, cs.bytes,
			  cs.stream_bytes);
		ckpt_info("chunk buffers: %" PRIu64 " from the reserve, %" PRIu64 " reused, %" PRIu64
			  " reused resized, %" PRIu64 " newly mapped", cs.bufs_reserve,
			  cs.bufs_pooled, cs.bufs_resized, cs.bufs_fresh);
		{
			struct ckpt_load_ctx_stats ls;
			ckpt_store_load_ctx_stats(fs.store, &ls);
			ckpt_info("chunk loads' contexts: %" PRIu64 " made (%" PRIu64
				  " at mount), %" PRIu64 " kept", ls.made, ls.warm, ls.free);
		}
		{
			struct vtree_stats vs;
			vtree_get_stats(&vs);
			ckpt_info("view cache: %" PRIu64 " views built, %" PRIu64
				  " dropped for newer ones, %" PRIu64 " kept",
				  vs.builds, vs.evictions, vs.views);
		}
	}
	ckpt_readahead_free(fs.ra);
	ckpt_pool_free(fs.pool);
	if (fs.store) {
		vtree_fini();
		ckpt_view_forget_store(fs.store);
	}
	ckpt_store_free(fs.store);
	ckpt_tp_rules_free(rules);
	free(o.tp_rules);
	free(cmd.mountpoint);
	free((char *)o.store);
	free(o.cache_size);
	free(o.buf_reserve);
	free(o.direct_read);
	free(o.log_level);
	fuse_opt_free_args(&args);
	return ret;
}
