/* SPDX-License-Identifier: MIT */
/*
 * fuse_ops.c - the FUSE low-level op adapters (see fuse_ops.h).
 *
 * Every request gets exactly one reply.  The layers below return negative
 * errno values; reply_err() is the one place they become FUSE replies.
 *
 * Permissions.  The mount always has the kernel's default_permissions
 * (options.c adds it): the kernel checks permission bits and ownership of
 * every access, chmod, chown, utimens, truncate and deletion in a sticky
 * directory against the caller's full credentials (supplementary groups,
 * capabilities, user namespaces) before a request reaches the daemon, so
 * no request handler checks permissions.  The daemon sees only the uid,
 * gid and pid of a request, would have to read the others from /proc, and
 * would decide on attributes the kernel has cached anyway.
 *
 * S_ISUID and S_ISGID.  As on ext4, a write or a truncate (also by an open
 * with O_TRUNC) by a caller without CAP_FSETID clears S_ISUID, and S_ISGID
 * if S_IXGRP is set or the caller is not in the file's group; a chown of
 * anything but a directory clears S_ISUID, and S_ISGID if S_IXGRP is set.
 * The kernel knows the caller's capabilities and flags those requests
 * (wire.c: FUSE_HANDLE_KILLPRIV_V2); the daemon clears the bits before it
 * handles them (vfs_kill_suidgid, CKPT_SET_KILL_SUIDGID).  The daemon does
 * not know whether a chown's caller has CAP_FSETID: ext4 keeps S_ISGID
 * without S_IXGRP for a chown by a caller who has it or is in the file's
 * group, and clears it for others; ckptfs keeps it on every chown.
 */
#include "config.h"

#include "fuse_ops.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/util.h"
#include "opstats.h"
#include "wire.h"

static struct vfs *vfs_of(fuse_req_t req)
{
	return ((struct fuse_ops_data *)fuse_req_userdata(req))->vfs;
}

static struct tree_file *file_of(struct fuse_file_info *fi)
{
	return (struct tree_file *)(uintptr_t)fi->fh;
}

/* A vfs_in_group_fn: whether the caller of request ctx is in group gid (its
 * fsgid, or one of its supplementary groups, which libfuse reads from
 * /proc).  Asked only about S_ISGID files without S_IXGRP; if the groups
 * cannot be read the caller counts as outside (the bit is cleared). */
static bool caller_in_group(void *ctx, uint32_t gid)
{
	fuse_req_t req = ctx;
	gid_t small[64], *list = small;
	int n, cap = 64;
	bool in = false;

	if (fuse_req_ctx(req)->gid == gid)
		return true;
	n = fuse_req_getgroups(req, cap, list);
	if (n > cap) {
		cap = n;
		list = malloc((size_t)cap * sizeof(*list));
		n = list ? fuse_req_getgroups(req, cap, list) : -ENOMEM;
	}
	for (int i = 0; i < n && i < cap; i++)
		in = in || list[i] == gid;
	if (list != small)
		free(list);
	return in;
}

/* The request carries the kernel's kill flag (wire.c): clear the bits. */
static int kill_suidgid(fuse_req_t req, fuse_ino_t ino)
{
	return vfs_kill_suidgid(vfs_of(req), ino, caller_in_group, req);
}

/* The entries of an open directory, read at opendir. */
struct dir_handle {
	struct ckpt_dirent *ents;
	size_t n;
};

static void dir_handle_free(struct dir_handle *d)
{
	if (!d)
		return;
	ckpt_dirents_free(d->ents, d->n);
	free(d);
}

/* ------------------------------------------------------------- replies */

/* The one place where a negative errno from below becomes a FUSE reply. */
static void reply_err(fuse_req_t req, int r)
{
	opstats_error(r < 0 ? -r : r);
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
	st->st_rdev = (dev_t)in->rdev;
	st->st_blksize = 1 << 20;
	st->st_blocks = (blkcnt_t)((in->size + 511) / 512);
	st->st_atim.tv_sec = in->atime_ns / 1000000000;
	st->st_atim.tv_nsec = in->atime_ns % 1000000000;
	st->st_mtim.tv_sec = in->mtime_ns / 1000000000;
	st->st_mtim.tv_nsec = in->mtime_ns % 1000000000;
	st->st_ctim.tv_sec = in->ctime_ns / 1000000000;
	st->st_ctim.tv_nsec = in->ctime_ns % 1000000000;
}

static void entry_param(const struct tree_entry *te, struct fuse_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	e->ino = te->attr.ino;
	e->generation = te->generation;
	e->attr_timeout = te->attr_timeout;
	e->entry_timeout = te->entry_timeout;
	inode_to_stat(&te->attr, &e->attr);
}

/* r: the result of the call that filled te. */
static void reply_entry(fuse_req_t req, int r, const struct tree_entry *te)
{
	struct fuse_entry_param e;

	if (r < 0) {
		reply_err(req, r);
		return;
	}
	entry_param(te, &e);
	fuse_reply_entry(req, &e);
}

static void reply_attr(fuse_req_t req, int r, const struct ckpt_inode *in, double timeout)
{
	struct stat st;

	if (r < 0) {
		reply_err(req, r);
		return;
	}
	inode_to_stat(in, &st);
	fuse_reply_attr(req, &st, timeout);
}

/* Opens drop the kernel's cached pages of the file (keep_cache 0): a
 * reopen sees the latest committed content. */
static void set_open(struct fuse_file_info *fi, struct tree_file *f)
{
	fi->fh = (uint64_t)(uintptr_t)f;
	fi->keep_cache = 0;
	fi->direct_io = f->direct;
}

/* An open interrupted before the reply reached the kernel gets no
 * release, so it is released here. */
static void reply_open(fuse_req_t req, struct fuse_file_info *fi, struct tree_file *f)
{
	set_open(fi, f);
	if (fuse_reply_open(req, fi) == -ENOENT)
		vfs_release(vfs_of(req), f);
}

void fuse_ops_inval(void *ctx, uint64_t ino, uint64_t off, uint64_t len)
{
	/* -ENOENT: the kernel has forgotten the inode: nothing cached */
	(void)fuse_lowlevel_notify_inval_inode(ctx, ino, off == VFS_INVAL_ATTR ? -1 : (off_t)off,
					       (off_t)len);
}

/* ------------------------------------------------------------ requests */

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
	struct fuse_ops_data *d = userdata;
	bool views, files;

	if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC)
		conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
	if (conn->capable & FUSE_CAP_ASYNC_READ)
		conn->want |= FUSE_CAP_ASYNC_READ;
	conn->want &= ~(unsigned)FUSE_CAP_WRITEBACK_CACHE;
	/* libfuse 3.14 sizes its request buffers for at most 1 MiB. */
	conn->max_write = 1u << 20;
	conn->max_readahead = 1u << 20;
	conn->max_background = 64;
	wire_negotiate(conn, d->direct_read, d->direct_read_given, &views, &files);
	vfs_set_direct(d->vfs, views, files);
	(void)wire_negotiate_killpriv(conn);
}

static void op_destroy(void *userdata)
{
	vfs_commit_all(((struct fuse_ops_data *)userdata)->vfs);
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct tree_entry e;

	reply_entry(req, vfs_lookup(vfs_of(req), parent, name, &e), &e);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	vfs_forget(vfs_of(req), ino, nlookup);
	fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	for (size_t i = 0; i < count; i++)
		vfs_forget(vfs_of(req), forgets[i].ino, forgets[i].nlookup);
	fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckpt_inode in;
	double timeout = 0;
	int r = vfs_getattr(vfs_of(req), ino, &in, &timeout);

	(void)fi;
	reply_attr(req, r, &in, timeout);
}

static int64_t ts_ns(const struct timespec *ts)
{
	return (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec;
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		       struct fuse_file_info *fi)
{
	struct ckpt_inode in, cur;
	unsigned what = 0;
	double timeout = 0;
	int r;

	(void)fi;
	memset(&in, 0, sizeof(in));
	if (to_set & FUSE_SET_ATTR_SIZE) {
		what |= TREE_SET_SIZE;
		in.size = (uint64_t)attr->st_size;
	}
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
	/* FATTR_KILL_SUIDGID, which libfuse passes on as FUSE_SET_ATTR_KILL_SUID:
	 * a chown (always), or a truncate by a caller without CAP_FSETID */
	r = 0;
	if (to_set & (FUSE_SET_ATTR_KILL_SUID | FUSE_SET_ATTR_KILL_SGID)) {
		if (what & (CKPT_SET_UID | CKPT_SET_GID))
			what |= CKPT_SET_KILL_SUIDGID;
		else
			r = kill_suidgid(req, ino);
	}
	if (r == 0)
		r = vfs_setattr(vfs_of(req), ino, what, &in, &cur, &timeout);
	reply_attr(req, r, &cur, timeout);
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
	char *target = NULL;
	int r = vfs_readlink(vfs_of(req), ino, &target);

	if (r < 0)
		reply_err(req, r);
	else
		fuse_reply_readlink(req, target);
	free(target);
}

/* mknod, mkdir and symlink: mode with the type, the umask already applied. */
static void make_node(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		      const char *target, dev_t rdev)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct tree_entry e;
	int r = vfs_mknode(vfs_of(req), parent, name, mode, ctx->uid, ctx->gid, target,
			   (uint64_t)rdev, &e);

	reply_entry(req, r, &e);
}

/* Regular files, fifos, sockets and devices (the kernel checked that the
 * caller may create a device: CAP_MKNOD). */
static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		     dev_t rdev)
{
	mode_t type = mode & S_IFMT;

	if (type != S_IFREG && type != S_IFIFO && type != S_IFSOCK && type != S_IFCHR &&
	    type != S_IFBLK) {
		reply_err(req, -EINVAL);
		return;
	}
	make_node(req, parent, name, type | (mode & ~fuse_req_ctx(req)->umask & 07777), NULL,
		  type == S_IFCHR || type == S_IFBLK ? rdev : 0);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	make_node(req, parent, name, S_IFDIR | (mode & ~fuse_req_ctx(req)->umask & 07777), NULL,
		  0);
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	make_node(req, parent, name, S_IFLNK | 0777, link, 0);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	struct tree_entry e;

	reply_entry(req, vfs_link(vfs_of(req), ino, newparent, newname, &e), &e);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	reply_err(req, vfs_unlink(vfs_of(req), parent, name, false));
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	reply_err(req, vfs_unlink(vfs_of(req), parent, name, true));
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		      const char *newname, unsigned int flags)
{
	reply_err(req, vfs_rename(vfs_of(req), parent, name, newparent, newname, flags));
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct tree_file *f;
	/* O_TRUNC by a caller without CAP_FSETID */
	int r = wire_kill_suidgid() ? kill_suidgid(req, ino) : 0;

	if (r == 0)
		r = vfs_open(vfs_of(req), ino, fi->flags, &f);

	if (r < 0)
		reply_err(req, r);
	else
		reply_open(req, fi, f);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		      struct fuse_file_info *fi)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct fuse_entry_param e;
	struct tree_entry te;
	struct tree_file *f;
	int r = vfs_create(vfs_of(req), parent, name, mode & ~ctx->umask & 07777, ctx->uid,
			   ctx->gid, fi->flags, &te, &f);

	if (r < 0) {
		reply_err(req, r);
		return;
	}
	entry_param(&te, &e);
	set_open(fi, f);
	if (fuse_reply_create(req, &e, fi) == -ENOENT) {
		/* interrupted: the kernel got neither the entry nor the file */
		vfs_release(vfs_of(req), f);
		vfs_forget(vfs_of(req), te.attr.ino, 1);
	}
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct vfs *v = vfs_of(req);
	uint8_t *buf = vfs_buf_alloc(v, size);
	struct ckpt_gather g;
	bool gathered;
	ssize_t r;

	(void)ino;
	if (!buf) {
		reply_err(req, -ENOMEM);
		return;
	}
	ckpt_gather_init(&g);
	r = vfs_read(v, file_of(fi), buf, size, (uint64_t)off, &g, &gathered);
	if (r < 0)
		reply_err(req, (int)r);
	else if (gathered)
		fuse_reply_iov(req, g.iov, (int)g.niov);
	else
		fuse_reply_buf(req, (const char *)buf, (size_t)r);
	vfs_read_done(v, &g, gathered, buf, size);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	/* a writer without CAP_FSETID: the bits go before the data changes */
	int r = wire_kill_suidgid() ? kill_suidgid(req, ino) : 0;

	if (r == 0)
		r = vfs_write(vfs_of(req), file_of(fi), buf, size, (uint64_t)off);
	if (r < 0)
		reply_err(req, r);
	else
		fuse_reply_write(req, size);
}

static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	reply_err(req, vfs_commit(vfs_of(req), file_of(fi), false));
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	(void)ino;
	(void)datasync;
	reply_err(req, vfs_commit(vfs_of(req), file_of(fi), true));
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	vfs_release(vfs_of(req), file_of(fi));
	reply_err(req, 0);
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct dir_handle *d = calloc(1, sizeof(*d));
	int r = d ? vfs_readdir(vfs_of(req), ino, &d->ents, &d->n) : -ENOMEM;

	if (r < 0) {
		free(d);
		reply_err(req, r);
		return;
	}
	fi->fh = (uint64_t)(uintptr_t)d;
	fi->cache_readdir = 0;
	if (fuse_reply_open(req, fi) == -ENOENT)
		dir_handle_free(d); /* interrupted: no releasedir will come */
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
	(void)ino;
	dir_handle_free((struct dir_handle *)(uintptr_t)fi->fh);
	reply_err(req, 0);
}

static void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	(void)ino;
	(void)datasync;
	(void)fi;
	reply_err(req, vfs_sync(vfs_of(req)));
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs st;
	int r = vfs_statfs(vfs_of(req), &st);

	(void)ino;
	if (r < 0)
		reply_err(req, r);
	else
		fuse_reply_statfs(req, &st);
}

static const struct fuse_lowlevel_ops untimed_ops = {
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

/* ------------------------------------------------------------ op timing */

/* Each handler below runs between opstats_begin and opstats_end (opstats.h);
 * fuse_ops_table() is untimed_ops with these wrappers in place. */
#define TIMED(fn, op, params, args)                                                  \
	static void timed_##fn params                                                \
	{                                                                            \
		int64_t t0 = opstats_begin(op);                                      \
		fn args;                                                             \
		opstats_end(op, t0);                                                 \
	}
#define FI struct fuse_file_info *fi
TIMED(op_lookup, FOP_LOOKUP, (fuse_req_t req, fuse_ino_t p, const char *n), (req, p, n))
TIMED(op_forget, FOP_FORGET, (fuse_req_t req, fuse_ino_t i, uint64_t n), (req, i, n))
TIMED(op_forget_multi, FOP_FORGET, (fuse_req_t req, size_t c, struct fuse_forget_data *f),
      (req, c, f))
TIMED(op_getattr, FOP_GETATTR, (fuse_req_t req, fuse_ino_t i, FI), (req, i, fi))
TIMED(op_setattr, FOP_SETATTR, (fuse_req_t req, fuse_ino_t i, struct stat *a, int s, FI),
      (req, i, a, s, fi))
TIMED(op_readlink, FOP_READLINK, (fuse_req_t req, fuse_ino_t i), (req, i))
TIMED(op_mknod, FOP_MKNOD, (fuse_req_t req, fuse_ino_t p, const char *n, mode_t m, dev_t d),
      (req, p, n, m, d))
TIMED(op_mkdir, FOP_MKDIR, (fuse_req_t req, fuse_ino_t p, const char *n, mode_t m),
      (req, p, n, m))
TIMED(op_symlink, FOP_SYMLINK, (fuse_req_t req, const char *l, fuse_ino_t p, const char *n),
      (req, l, p, n))
TIMED(op_link, FOP_LINK, (fuse_req_t req, fuse_ino_t i, fuse_ino_t np, const char *nn),
      (req, i, np, nn))
TIMED(op_unlink, FOP_UNLINK, (fuse_req_t req, fuse_ino_t p, const char *n), (req, p, n))
TIMED(op_rmdir, FOP_RMDIR, (fuse_req_t req, fuse_ino_t p, const char *n), (req, p, n))
TIMED(op_rename, FOP_RENAME,
      (fuse_req_t req, fuse_ino_t p, const char *n, fuse_ino_t np, const char *nn,
       unsigned int f), (req, p, n, np, nn, f))
TIMED(op_open, FOP_OPEN, (fuse_req_t req, fuse_ino_t i, FI), (req, i, fi))
TIMED(op_create, FOP_CREATE, (fuse_req_t req, fuse_ino_t p, const char *n, mode_t m, FI),
      (req, p, n, m, fi))
TIMED(op_read, FOP_READ, (fuse_req_t req, fuse_ino_t i, size_t z, off_t o, FI),
      (req, i, z, o, fi))
TIMED(op_write, FOP_WRITE,
      (fuse_req_t req, fuse_ino_t i, const char *b, size_t z, off_t o, FI),
      (req, i, b, z, o, fi))
TIMED(op_flush, FOP_FLUSH, (fuse_req_t req, fuse_ino_t i, FI), (req, i, fi))
TIMED(op_fsync, FOP_FSYNC, (fuse_req_t req, fuse_ino_t i, int d, FI), (req, i, d, fi))
TIMED(op_release, FOP_RELEASE, (fuse_req_t req, fuse_ino_t i, FI), (req, i, fi))
TIMED(op_opendir, FOP_OPENDIR, (fuse_req_t req, fuse_ino_t i, FI), (req, i, fi))
TIMED(op_readdir, FOP_READDIR, (fuse_req_t req, fuse_ino_t i, size_t z, off_t o, FI),
      (req, i, z, o, fi))
TIMED(op_releasedir, FOP_RELEASEDIR, (fuse_req_t req, fuse_ino_t i, FI), (req, i, fi))
TIMED(op_fsyncdir, FOP_FSYNCDIR, (fuse_req_t req, fuse_ino_t i, int d, FI), (req, i, d, fi))
TIMED(op_statfs, FOP_STATFS, (fuse_req_t req, fuse_ino_t i), (req, i))
#undef FI
#undef TIMED

const struct fuse_lowlevel_ops *fuse_ops_table(void)
{
	static struct fuse_lowlevel_ops t;

	t = untimed_ops;
	t.lookup = timed_op_lookup;
	t.forget = timed_op_forget;
	t.forget_multi = timed_op_forget_multi;
	t.getattr = timed_op_getattr;
	t.setattr = timed_op_setattr;
	t.readlink = timed_op_readlink;
	t.mknod = timed_op_mknod;
	t.mkdir = timed_op_mkdir;
	t.symlink = timed_op_symlink;
	t.link = timed_op_link;
	t.unlink = timed_op_unlink;
	t.rmdir = timed_op_rmdir;
	t.rename = timed_op_rename;
	t.open = timed_op_open;
	t.create = timed_op_create;
	t.read = timed_op_read;
	t.write = timed_op_write;
	t.flush = timed_op_flush;
	t.fsync = timed_op_fsync;
	t.release = timed_op_release;
	t.opendir = timed_op_opendir;
	t.readdir = timed_op_readdir;
	t.releasedir = timed_op_releasedir;
	t.fsyncdir = timed_op_fsyncdir;
	t.statfs = timed_op_statfs;
	return &t;
}
