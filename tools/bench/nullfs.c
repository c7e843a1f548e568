/* SPDX-License-Identifier: MIT */
/*
 * nullfs - a FUSE filesystem that keeps names and sizes and discards data.
 *
 * The FUSE ceiling of tools/bench/run (case 1): the same request path as
 * ckptfs (libfuse3 low-level API, multi-threaded loop with the same thread
 * limits, max_write and max_readahead of 1 MiB, direct_io on writable
 * handles, no writeback cache) with no work behind it.  A write only moves
 * the file size; a read returns zeros up to the size.
 *
 * usage: nullfs MOUNTPOINT [-f] [-s] [-o opt,...]
 *   -o direct_read   read-only handles bypass the page cache too (direct_io),
 *                    to compare page-cache reads with direct reads
 *
 * All state (the inode table) lives in one struct guarded by one mutex; inodes
 * are never freed before unmount.  Not meant for anything but benchmarks.
 */
#define FUSE_USE_VERSION 312

#include <errno.h>
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NULLFS_TIMEOUT 1.0	/* attribute and entry timeout, as ckptfs */
#define NULLFS_IO_MAX (1u << 20)

struct nnode {
	uint64_t parent;	/* 0: unused slot (unlinked) */
	char *name;
	mode_t mode;
	uint64_t size;
	uint32_t nlink;
	struct timespec mtime;
	struct timespec ctime;
};

/* The filesystem state: the only mutable global, guarded by lock. */
static struct {
	pthread_mutex_t lock;
	struct nnode *nodes;	/* indexed by inode number; [1] is the root */
	size_t n;
	size_t cap;
	uint8_t zeros[NULLFS_IO_MAX];
	int direct_read;	/* -o direct_read; set before the loop starts */
} nfs = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
};

static struct nnode *node_get(fuse_ino_t ino)
{
	if (ino < 1 || ino >= nfs.n || (ino != FUSE_ROOT_ID && !nfs.nodes[ino].parent))
		return NULL;
	return &nfs.nodes[ino];
}

static fuse_ino_t node_find(fuse_ino_t parent, const char *name)
{
	for (size_t i = 2; i < nfs.n; i++)
		if (nfs.nodes[i].parent == parent && strcmp(nfs.nodes[i].name, name) == 0)
			return i;
	return 0;
}

static int node_add(fuse_ino_t parent, const char *name, mode_t mode, fuse_ino_t *ret_ino)
{
	struct nnode *nn;

	if (nfs.n == nfs.cap) {
		size_t cap = nfs.cap ? nfs.cap * 2 : 1024;
		struct nnode *p = realloc(nfs.nodes, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		nfs.nodes = p;
		nfs.cap = cap;
	}
	nn = &nfs.nodes[nfs.n];
	memset(nn, 0, sizeof(*nn));
	nn->name = strdup(name);
	if (!nn->name)
		return -ENOMEM;
	nn->parent = parent;
	nn->mode = mode;
	nn->nlink = S_ISDIR(mode) ? 2 : 1;
	clock_gettime(CLOCK_REALTIME, &nn->mtime);
	nn->ctime = nn->mtime;
	*ret_ino = nfs.n++;
	return 0;
}

static void fill_stat(fuse_ino_t ino, const struct nnode *nn, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_mode = nn->mode;
	st->st_nlink = nn->nlink;
	st->st_size = (off_t)nn->size;
	st->st_blocks = (blkcnt_t)((nn->size + 511) / 512);
	st->st_blksize = 4096;
	st->st_uid = getuid();
	st->st_gid = getgid();
	st->st_mtim = nn->mtime;
	st->st_ctim = nn->ctime;
	st->st_atim = nn->mtime;
}

static void fill_entry(fuse_ino_t ino, const struct nnode *nn, struct fuse_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	e->ino = ino;
	e->generation = 1;
	e->attr_timeout = NULLFS_TIMEOUT;
	e->entry_timeout = NULLFS_TIMEOUT;
	fill_stat(ino, nn, &e->attr);
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
	(void)userdata;
	if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC)
		conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
	if (conn->capable & FUSE_CAP_ASYNC_READ)
		conn->want |= FUSE_CAP_ASYNC_READ;
	conn->want &= ~(unsigned)FUSE_CAP_WRITEBACK_CACHE;
	conn->max_write = NULLFS_IO_MAX;
	conn->max_readahead = NULLFS_IO_MAX;
	conn->max_background = 64;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e;
	fuse_ino_t ino;

	pthread_mutex_lock(&nfs.lock);
	ino = node_find(parent, name);
	if (ino)
		fill_entry(ino, &nfs.nodes[ino], &e);
	pthread_mutex_unlock(&nfs.lock);
	if (!ino)
		fuse_reply_err(req, ENOENT);
	else
		fuse_reply_entry(req, &e);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct nnode *nn;
	struct stat st;

	(void)fi;
	pthread_mutex_lock(&nfs.lock);
	nn = node_get(ino);
	if (nn)
		fill_stat(ino, nn, &st);
	pthread_mutex_unlock(&nfs.lock);
	if (!nn)
		fuse_reply_err(req, ENOENT);
	else
		fuse_reply_attr(req, &st, NULLFS_TIMEOUT);
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		       struct fuse_file_info *fi)
{
	struct nnode *nn;
	struct stat st;

	(void)fi;
	pthread_mutex_lock(&nfs.lock);
	nn = node_get(ino);
	if (nn) {
		if (to_set & FUSE_SET_ATTR_SIZE)
			nn->size = (uint64_t)attr->st_size;
		if (to_set & FUSE_SET_ATTR_MODE)
			nn->mode = (nn->mode & S_IFMT) | (attr->st_mode & 07777);
		if (to_set & FUSE_SET_ATTR_MTIME)
			nn->mtime = attr->st_mtim;
		if (to_set & FUSE_SET_ATTR_MTIME_NOW)
			clock_gettime(CLOCK_REALTIME, &nn->mtime);
		fill_stat(ino, nn, &st);
	}
	pthread_mutex_unlock(&nfs.lock);
	if (!nn)
		fuse_reply_err(req, ENOENT);
	else
		fuse_reply_attr(req, &st, NULLFS_TIMEOUT);
}

static int make_node(fuse_ino_t parent, const char *name, mode_t mode,
		     struct fuse_entry_param *e)
{
	fuse_ino_t ino;
	int r;

	pthread_mutex_lock(&nfs.lock);
	if (!node_get(parent) || !S_ISDIR(nfs.nodes[parent].mode)) {
		r = -ENOTDIR;
		goto out;
	}
	if (node_find(parent, name)) {
		r = -EEXIST;
		goto out;
	}
	r = node_add(parent, name, mode, &ino);
	if (r < 0)
		goto out;
	if (S_ISDIR(mode))
		nfs.nodes[parent].nlink++;
	fill_entry(ino, &nfs.nodes[ino], e);
out:
	pthread_mutex_unlock(&nfs.lock);
	return r;
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	struct fuse_entry_param e;
	int r = make_node(parent, name, S_IFDIR | (mode & 07777), &e);

	if (r < 0)
		fuse_reply_err(req, -r);
	else
		fuse_reply_entry(req, &e);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		      struct fuse_file_info *fi)
{
	struct fuse_entry_param e;
	int r = make_node(parent, name, S_IFREG | (mode & 07777), &e);

	if (r < 0) {
		fuse_reply_err(req, -r);
		return;
	}
	fi->direct_io = 1;
	fi->keep_cache = 0;
	fuse_reply_create(req, &e, fi);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct nnode *nn;

	pthread_mutex_lock(&nfs.lock);
	nn = node_get(ino);
	if (nn && (fi->flags & O_TRUNC))
		nn->size = 0;
	pthread_mutex_unlock(&nfs.lock);
	if (!nn) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	fi->direct_io = (fi->flags & O_ACCMODE) != O_RDONLY || nfs.direct_read;
	fi->keep_cache = 0;
	fuse_reply_open(req, fi);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	struct nnode *nn;

	(void)buf;
	(void)fi;
	pthread_mutex_lock(&nfs.lock);
	nn = node_get(ino);
	if (nn && (uint64_t)off + size > nn->size)
		nn->size = (uint64_t)off + size;
	pthread_mutex_unlock(&nfs.lock);
	if (!nn)
		fuse_reply_err(req, ENOENT);
	else
		fuse_reply_write(req, size);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct nnode *nn;
	uint64_t fsize = 0;

	(void)fi;
	pthread_mutex_lock(&nfs.lock);
	nn = node_get(ino);
	if (nn)
		fsize = nn->size;
	pthread_mutex_unlock(&nfs.lock);
	if (!nn) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	if ((uint64_t)off >= fsize)
		size = 0;
	else if (size > fsize - (uint64_t)off)
		size = (size_t)(fsize - (uint64_t)off);
	if (size > NULLFS_IO_MAX)
		size = NULLFS_IO_MAX;
	fuse_reply_buf(req, (const char *)nfs.zeros, size);
}

static void op_ok(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, 0);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	(void)datasync;
	op_ok(req, ino, fi);
}

static int remove_node(fuse_ino_t parent, const char *name, bool dir)
{
	fuse_ino_t ino;
	int r = 0;

	pthread_mutex_lock(&nfs.lock);
	ino = node_find(parent, name);
	if (!ino) {
		r = -ENOENT;
		goto out;
	}
	if (dir != !!S_ISDIR(nfs.nodes[ino].mode)) {
		r = dir ? -ENOTDIR : -EISDIR;
		goto out;
	}
	if (dir) {
		for (size_t i = 2; i < nfs.n; i++) {
			if (nfs.nodes[i].parent == ino) {
				r = -ENOTEMPTY;
				goto out;
			}
		}
		nfs.nodes[parent].nlink--;
	}
	nfs.nodes[ino].parent = 0;
out:
	pthread_mutex_unlock(&nfs.lock);
	return r;
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	fuse_reply_err(req, -remove_node(parent, name, false));
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	fuse_reply_err(req, -remove_node(parent, name, true));
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		      const char *newname, unsigned int flags)
{
	fuse_ino_t ino, old;
	char *dup = NULL;
	int r = 0;

	if (flags) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	pthread_mutex_lock(&nfs.lock);
	ino = node_find(parent, name);
	if (!ino) {
		r = -ENOENT;
		goto out;
	}
	if (!node_get(newparent) || !S_ISDIR(nfs.nodes[newparent].mode)) {
		r = -ENOTDIR;
		goto out;
	}
	dup = strdup(newname);
	if (!dup) {
		r = -ENOMEM;
		goto out;
	}
	old = node_find(newparent, newname);
	if (old && old != ino)
		nfs.nodes[old].parent = 0;
	if (S_ISDIR(nfs.nodes[ino].mode)) {
		nfs.nodes[parent].nlink--;
		nfs.nodes[newparent].nlink++;
	}
	free(nfs.nodes[ino].name);
	nfs.nodes[ino].name = dup;
	nfs.nodes[ino].parent = newparent;
out:
	pthread_mutex_unlock(&nfs.lock);
	fuse_reply_err(req, -r);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	char *buf = malloc(size);
	size_t used = 0;
	off_t pos = 0;
	struct stat st;

	(void)fi;
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	memset(&st, 0, sizeof(st));
	pthread_mutex_lock(&nfs.lock);
	for (size_t i = 1; i < nfs.n; i++) {
		const char *name;
		size_t need;

		if (i == 1) {
			name = ".";
			st.st_ino = ino;
			st.st_mode = S_IFDIR;
		} else if (nfs.nodes[i].parent == ino) {
			name = nfs.nodes[i].name;
			st.st_ino = i;
			st.st_mode = nfs.nodes[i].mode;
		} else {
			continue;
		}
		if (++pos <= off)
			continue;
		need = fuse_add_direntry(req, buf + used, size - used, name, &st, pos);
		if (need > size - used)
			break;
		used += need;
	}
	pthread_mutex_unlock(&nfs.lock);
	fuse_reply_buf(req, buf, used);
	free(buf);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs sv;

	(void)ino;
	memset(&sv, 0, sizeof(sv));
	sv.f_bsize = 4096;
	sv.f_frsize = 4096;
	sv.f_blocks = sv.f_bfree = sv.f_bavail = 1ull << 40;
	sv.f_files = sv.f_ffree = sv.f_favail = 1ull << 30;
	sv.f_namemax = 255;
	fuse_reply_statfs(req, &sv);
}

static const struct fuse_lowlevel_ops ops = {
	.init = op_init,
	.lookup = op_lookup,
	.getattr = op_getattr,
	.setattr = op_setattr,
	.mkdir = op_mkdir,
	.unlink = op_unlink,
	.rmdir = op_rmdir,
	.rename = op_rename,
	.create = op_create,
	.open = op_open,
	.read = op_read,
	.write = op_write,
	.flush = op_ok,
	.release = op_ok,
	.fsync = op_fsync,
	.readdir = op_readdir,
	.fsyncdir = op_fsync,
	.statfs = op_statfs,
};

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts cmd;
	struct fuse_loop_config *lcfg = NULL;
	struct fuse_session *se = NULL;
	fuse_ino_t root;
	int ret = 1;

	static const struct fuse_opt nopts[] = {
		{ "direct_read", 0, 1 },
		FUSE_OPT_END
	};

	memset(&cmd, 0, sizeof(cmd));
	if (fuse_opt_parse(&args, &nfs.direct_read, nopts, NULL) != 0)
		goto out;
	if (fuse_parse_cmdline(&args, &cmd) != 0)
		goto out;
	if (cmd.show_help || !cmd.mountpoint) {
		printf("usage: %s MOUNTPOINT [-f] [-s] [-o opt,...]\n", argv[0]);
		ret = cmd.show_help ? 0 : 1;
		goto out;
	}
	/* slot 0 is never a valid inode; slot 1 is the root */
	if (node_add(0, "", S_IFDIR | 0755, &root) < 0 ||
	    node_add(0, "/", S_IFDIR | 0755, &root) < 0)
		goto out;
	se = fuse_session_new(&args, &ops, sizeof(ops), NULL);
	if (!se)
		goto out;
	if (fuse_set_signal_handlers(se) != 0)
		goto out;
	if (fuse_session_mount(se, cmd.mountpoint) != 0)
		goto out_signals;
	if (fuse_daemonize(cmd.foreground) != 0)
		goto out_unmount;
	lcfg = fuse_loop_cfg_create();
	if (!lcfg)
		goto out_unmount;
	fuse_loop_cfg_set_clone_fd(lcfg, cmd.clone_fd);
	fuse_loop_cfg_set_max_threads(lcfg, cmd.max_threads && cmd.max_threads <= 1024 ?
						    cmd.max_threads : 16);
	fuse_loop_cfg_set_idle_threads(lcfg, cmd.max_idle_threads && cmd.max_idle_threads <= 1024 ?
						     cmd.max_idle_threads : 8);
	if (cmd.singlethread)
		ret = fuse_session_loop(se) ? 1 : 0;
	else
		ret = fuse_session_loop_mt(se, lcfg) ? 1 : 0;
out_unmount:
	fuse_session_unmount(se);
out_signals:
	fuse_remove_signal_handlers(se);
out:
	if (se)
		fuse_session_destroy(se);
	fuse_loop_cfg_destroy(lcfg);
	for (size_t i = 0; i < nfs.n; i++)
		free(nfs.nodes[i].name);
	free(nfs.nodes);
	free(cmd.mountpoint);
	fuse_opt_free_args(&args);
	return ret;
}
