/* SPDX-License-Identifier: MIT */
/*
 * ctltree.c - the control tree, MOUNT/.ckptfs/ (see ctltree.h).
 */
#include "config.h"

#include "ctltree.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/metrics.h"
#include "base/util.h"

struct ctltree {
	struct tree t;   /* first */
	ckpt_store *s;
	int64_t made_ns; /* the files' times */
};

/* An open metrics file: the text rendered at open. */
struct ctl_file {
	struct tree_file f; /* first */
	char *text;
	size_t len;
};

static struct ctltree *ct_of(struct tree *t)
{
	return (struct ctltree *)t;
}

static int ct_getattr(struct tree *t, uint64_t ino, struct ckpt_inode *ret, double *ret_timeout)
{
	struct ctltree *c = ct_of(t);
	struct ckpt_inode root;
	int r;

	if (ino != CTL_INO_DIR && ino != CTL_INO_METRICS)
		return -ENOENT;
	r = ckpt_store_getattr(c->s, CKPT_ROOT_INO, &root);
	if (r < 0)
		return r;
	memset(ret, 0, sizeof(*ret));
	ret->ino = ino;
	ret->mode = ino == CTL_INO_DIR ? S_IFDIR | 0555 : S_IFREG | 0444;
	ret->nlink = ino == CTL_INO_DIR ? 2 : 1;
	ret->uid = root.uid;
	ret->gid = root.gid;
	ret->atime_ns = ret->mtime_ns = ret->ctime_ns = c->made_ns;
	ret->parent = ino == CTL_INO_DIR ? CKPT_ROOT_INO : 0;
	ret->generation = 1;
	if (ret_timeout)
		*ret_timeout = 1.0;
	return 0;
}

static int ct_lookup(struct tree *t, uint64_t parent, const char *name, struct tree_entry *ret)
{
	uint64_t ino;
	int r;

	if (parent == CKPT_ROOT_INO && !strcmp(name, CTL_DIR_NAME))
		ino = CTL_INO_DIR;
	else if (parent == CTL_INO_DIR && !strcmp(name, "metrics"))
		ino = CTL_INO_METRICS;
	else if (parent == CTL_INO_DIR)
		return -ENOENT;
	else
		return -ENOTDIR;
	memset(ret, 0, sizeof(*ret));
	r = ct_getattr(t, ino, &ret->attr, &ret->attr_timeout);
	ret->entry_timeout = 1.0;
	ret->generation = 1;
	return r;
}

static void ct_forget(struct tree *t, uint64_t ino, uint64_t nlookup)
{
	(void)t;
	(void)ino;
	(void)nlookup; /* the inodes live as long as the tree */
}

static int ct_setattr(struct tree *t, uint64_t ino, unsigned what, const struct ckpt_inode *in)
{
	(void)t;
	(void)ino;
	(void)in;
	/* clearing bits the files do not have changes nothing (tree.h) */
	return (what & ~(unsigned)(CKPT_SET_KILL_SUIDGID | CKPT_SET_KILL_SGID)) ? -EROFS : 0;
}

static int ct_readlink(struct tree *t, uint64_t ino, char **ret_target)
{
	(void)t;
	(void)ino;
	(void)ret_target;
	return -EINVAL;
}

static int ct_readdir(struct tree *t, uint64_t ino, struct ckpt_dirent **ret_ents, size_t *ret_n)
{
	struct ckpt_dirent *e;

	(void)t;
	if (ino != CTL_INO_DIR)
		return ino == CTL_INO_METRICS ? -ENOTDIR : -ENOENT;
	e = calloc(1, sizeof(*e));
	if (!e || !(e->name = strdup("metrics"))) {
		free(e);
		return -ENOMEM;
	}
	e->ino = CTL_INO_METRICS;
	e->mode = S_IFREG | 0444;
	*ret_ents = e;
	*ret_n = 1;
	return 0;
}

static int ct_mknode(struct tree *t, uint64_t parent, const char *name, uint32_t mode,
		     uint32_t uid, uint32_t gid, const char *target, uint64_t rdev,
		     struct tree_entry *ret)
{
	struct tree_entry e;

	(void)mode, (void)uid, (void)gid, (void)target, (void)rdev, (void)ret;
	return ct_lookup(t, parent, name, &e) == 0 ? -EEXIST : -EROFS;
}

static int ct_link(struct tree *t, uint64_t ino, uint64_t newparent, const char *newname,
		   struct tree_entry *ret)
{
	(void)t, (void)ino, (void)newparent, (void)newname, (void)ret;
	return -EROFS;
}

static int ct_unlink(struct tree *t, uint64_t parent, const char *name, bool dir)
{
	(void)t, (void)parent, (void)name, (void)dir;
	return -EROFS;
}

static int ct_rename(struct tree *t, uint64_t parent, const char *name, uint64_t newparent,
		     const char *newname, unsigned flags)
{
	(void)t, (void)parent, (void)name, (void)newparent, (void)newname, (void)flags;
	return -EROFS;
}

static char *ct_path(struct tree *t, uint64_t ino)
{
	(void)t;
	return strdup(ino == CTL_INO_METRICS ? "/" CTL_DIR_NAME "/metrics" : "/" CTL_DIR_NAME);
}

static const struct tree_ops ct_ops;

static int ct_open(struct tree *t, uint64_t ino, int flags, struct tree_file **ret)
{
	struct ctl_file *f;
	int r;

	if (ino == CTL_INO_DIR)
		return -EISDIR;
	if (ino != CTL_INO_METRICS)
		return -ENOENT;
	if ((flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC))
		return -EROFS;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	r = ckpt_metrics_render(&f->text, &f->len);
	if (r < 0) {
		free(f);
		return r;
	}
	f->f.ops = &ct_ops;
	f->f.tree = t;
	f->f.ino = ino;
	*ret = &f->f;
	return 0;
}

static ssize_t ct_read(struct tree_file *tf, void *buf, size_t len, uint64_t off,
		       struct ckpt_gather *g)
{
	struct ctl_file *f = (struct ctl_file *)tf;
	size_t n;

	if (off >= f->len)
		return 0;
	n = CKPT_MIN(len, f->len - (size_t)off);
	memcpy(buf, f->text + off, n);
	if (g)
		ckpt_gather_buf(g, buf, n);
	return (ssize_t)n;
}

static uint64_t ct_size(struct tree_file *tf)
{
	return ((struct ctl_file *)tf)->len;
}

static size_t ct_chunks(struct tree_file *f, uint64_t off, uint64_t len, ckpt_digest *out,
			size_t max)
{
	(void)f, (void)off, (void)len, (void)out, (void)max;
	return 0;
}

static bool ct_shared(struct tree_file *f)
{
	(void)f;
	return true; /* never drop pages behind it: it has none */
}

static int ct_write(struct tree_file *f, const void *buf, size_t len, uint64_t off)
{
	(void)f, (void)buf, (void)len, (void)off;
	return -EBADF;
}

static int ct_commit(struct tree_file *f, bool durable)
{
	(void)f, (void)durable;
	return 0;
}

static void ct_release(struct tree_file *tf)
{
	struct ctl_file *f = (struct ctl_file *)tf;

	free(f->text);
	free(f);
}

static const struct tree_ops ct_ops = {
	.views = false,
	.generated = true,
	.lookup = ct_lookup,
	.forget = ct_forget,
	.getattr = ct_getattr,
	.setattr = ct_setattr,
	.readlink = ct_readlink,
	.readdir = ct_readdir,
	.mknode = ct_mknode,
	.link = ct_link,
	.unlink = ct_unlink,
	.rename = ct_rename,
	.path = ct_path,
	.open = ct_open,
	.refresh = NULL,
	.read = ct_read,
	.size = ct_size,
	.chunks = ct_chunks,
	.shared = ct_shared,
	.write = ct_write,
	.commit = ct_commit,
	.release = ct_release,
};

int ctltree_new(ckpt_store *s, struct tree **ret)
{
	struct ctltree *c = calloc(1, sizeof(*c));
	struct ckpt_inode in;

	if (!c)
		return -ENOMEM;
	c->t.ops = &ct_ops;
	c->s = s;
	c->made_ns = ckpt_now_ns();
	if (ckpt_store_lookup(s, CKPT_ROOT_INO, CTL_DIR_NAME, &in) == 0)
		ckpt_warn("%s: the store's own /%s cannot be reached through this mount: "
			  "the name is the mount's control directory (docs/user-guide.md, "
			  "\"Logs and metrics\")", ckpt_store_path(s), CTL_DIR_NAME);
	*ret = &c->t;
	return 0;
}

void ctltree_free(struct tree *t)
{
	free(t);
}
