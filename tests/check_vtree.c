/* SPDX-License-Identifier: MIT */
/*
 * check_vtree.c - unit tests for fs/vtree.[ch]: the read-only /tpT_ppP/
 * view trees, driven through their tree ops (fs/tree.h) the way the
 * daemon's VFS layer drives them, without FUSE.
 *
 * Every test gets a fresh store (checked fixture, in a directory the test
 * case's unchecked fixture owns) holding
 *   /top.txt                          "top level\n"
 *   /ck/model-rank0.safetensors       w [10, 6] F32, rows 0-4 (tp_dim 0)
 *   /ck/model-rank1.safetensors       w rows 5-9
 *   /ck/notes.txt                     "notes\n"
 *   /ck/link -> notes.txt
 *   /ck/sub/                          empty directory
 * and a view tree over it.  The store, the pool and the sources' writing
 * are viewlib's (tests/viewlib.h); w's element i is the float i, so every
 * expected byte is computed here.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/util.h"
#include "store/store.h"
#include "testlib.h"
#include "viewlib.h"
#include "vtree.h"

#define ROWS 10
#define COLS 6

static struct vtree *vt;
static struct tree *t;
static uint64_t ck_ino, rank_ino[2];

/* ---- the store ---------------------------------------------------------- */

/* Rank r's safetensors file: rows [5r, 5r + 5) of w, element i of the
 * global w being i, plus hi in rank 1's rows. */
static uint64_t put_rank(unsigned r, float hi)
{
	const unsigned rows = ROWS / 2;
	float *w = fgen(rows * COLS, (float)(rows * COLS * r) + (r ? hi : 0));
	struct tdef td = { "w", CKPT_DT_F32, 2, { rows, COLS }, w };
	char meta[256], name[64];
	uint64_t ino;

	snprintf(meta, sizeof(meta),
		 "{\"version\": 1, \"tensors\": {\"w\": {\"global_shape\": [%u, %u], "
		 "\"offsets\": [%u, 0], \"tp_dim\": 0}}}",
		 ROWS, COLS, rows * r);
	snprintf(name, sizeof(name), "model-rank%u.safetensors", r);
	ino = put_st(ck_ino, name, meta, &td, 1);
	free(w);
	return ino;
}

/* viewlib's store and pool, the files above, a view tree keeping 2 views. */
static void vt_setup(void)
{
	struct ckpt_inode in;

	setup();
	put_raw(CKPT_ROOT_INO, "top.txt", (const uint8_t *)"top level\n", 10);
	ck_ino = mkdir_in(CKPT_ROOT_INO, "ck");
	rank_ino[0] = put_rank(0, 0);
	rank_ino[1] = put_rank(1, 0);
	put_raw(ck_ino, "notes.txt", (const uint8_t *)"notes\n", 6);
	ck_assert_int_eq(ckpt_store_mknode(st, ck_ino, "link", S_IFLNK | 0777, 0, 0, "notes.txt",
					   &in), 0);
	mkdir_in(ck_ino, "sub");
	ck_assert_int_eq(vtree_new(st, NULL, 2, &vt), 0);
	t = vtree_tree(vt);
}

/* The tree first: its prefetch thread uses the store. */
static void vt_teardown(void)
{
	vtree_free(vt);
	vt = NULL;
	t = NULL;
	teardown();
}

/* ---- helpers ------------------------------------------------------------ */

static struct tree_entry lookup_ok(uint64_t parent, const char *name)
{
	struct tree_entry e;
	int r = t->ops->lookup(t, parent, name, &e);

	ck_assert_msg(r == 0, "lookup %s: %d", name, r);
	ck_assert(vtree_is_virtual(e.attr.ino));
	ck_assert_uint_eq(e.generation, 1);
	return e;
}

static int lookup_err(uint64_t parent, const char *name)
{
	struct tree_entry e;

	return t->ops->lookup(t, parent, name, &e);
}

/* The view root tpT_ppP's inode. */
static uint64_t root_of(const char *layout)
{
	return lookup_ok(CKPT_ROOT_INO, layout).attr.ino;
}

/* The inode of tpT_ppP/ck. */
static uint64_t ck_of(const char *layout)
{
	return lookup_ok(root_of(layout), "ck").attr.ino;
}

static struct tree_file *open_ok(uint64_t vino)
{
	struct tree_file *f = NULL;
	int r = t->ops->open(t, vino, O_RDONLY, &f);

	ck_assert_msg(r == 0, "open: %d", r);
	ck_assert_ptr_eq(f->ops, t->ops);
	ck_assert_uint_eq(f->ino, vino);
	ck_assert(!f->writable);
	return f;
}

/* Read all of f in pieces of `piece` bytes by plain copies. */
static uint8_t *read_all(struct tree_file *f, size_t piece, uint64_t *ret_size)
{
	uint64_t size = t->ops->size(f), off = 0;
	uint8_t *buf = malloc(size + 1);
	ssize_t r;

	ck_assert_ptr_nonnull(buf);
	while (off < size) {
		r = t->ops->read(f, buf + off, piece, off, NULL);
		ck_assert_msg(r > 0, "read at %llu: %zd", (unsigned long long)off, r);
		off += (uint64_t)r;
	}
	ck_assert_int_eq(t->ops->read(f, buf, piece, size, NULL), 0); /* at the end */
	*ret_size = size;
	return buf;
}

/* Rows [r0, r1) of w as they follow a view file's header: element i of
 * the global w is i, plus hi in rank 1's rows. */
static void expect_rows(const uint8_t *file, uint64_t size, unsigned r0, unsigned r1, float hi)
{
	const size_t n = (size_t)(r1 - r0) * COLS;
	uint64_t hlen;

	ck_assert_uint_ge(size, 8);
	memcpy(&hlen, file, 8);
	ck_assert_uint_eq(size, 8 + hlen + n * sizeof(float));
	ck_assert_msg(memmem(file + 8, hlen, "\"w\"", 3) != NULL, "no tensor w in the header");
	for (size_t i = 0; i < n; i++) {
		float f;
		memcpy(&f, file + 8 + hlen + i * sizeof(f), sizeof(f));
		size_t k = r0 * COLS + i;
		float want = (float)k + (k >= ROWS / 2 * COLS ? hi : 0);
		ck_assert_msg(f == want, "element %zu: %g, not %g", k, (double)f, (double)want);
	}
}

/* Whether ents has name, with *ret_ino its inode. */
static bool has_ent(const struct ckpt_dirent *ents, size_t n, const char *name, uint32_t type,
		    uint64_t *ret_ino)
{
	for (size_t i = 0; i < n; i++) {
		if (strcmp(ents[i].name, name))
			continue;
		ck_assert_msg((ents[i].mode & S_IFMT) == type, "%s: mode %o", name, ents[i].mode);
		if (ret_ino)
			*ret_ino = ents[i].ino;
		return true;
	}
	return false;
}

/* ---- layout directories ------------------------------------------------- */

START_TEST(test_layout_dirs)
{
	struct tree_entry a = lookup_ok(CKPT_ROOT_INO, "tp1_pp1");
	struct tree_entry b = lookup_ok(CKPT_ROOT_INO, "tp2_pp1");
	struct ckpt_inode root;

	ck_assert(vtree_is_view_name(CKPT_ROOT_INO, "tp1_pp1"));
	ck_assert(vtree_is_view_name(CKPT_ROOT_INO, "tp4_pp2"));
	ck_assert(!vtree_is_view_name(ck_ino, "tp1_pp1")); /* only under the root */
	ck_assert(!vtree_is_virtual(CKPT_ROOT_INO));
	ck_assert(S_ISDIR(a.attr.mode));
	ck_assert_uint_eq(a.attr.mode & 0222, 0); /* read-only mirror */
	ck_assert_uint_ne(a.attr.ino, b.attr.ino);
	ck_assert(a.entry_timeout > 0 && a.attr_timeout > 0);
	/* a layout directory mirrors the store root */
	ck_assert_int_eq(ckpt_store_getattr(st, CKPT_ROOT_INO, &root), 0);
	ck_assert_uint_eq(a.attr.uid, root.uid);
	ck_assert_uint_eq(a.attr.mode & 0555, root.mode & 0555);
	/* the same name gives the same inode again */
	ck_assert_uint_eq(lookup_ok(CKPT_ROOT_INO, "tp1_pp1").attr.ino, a.attr.ino);
}
END_TEST

START_TEST(test_bad_names)
{
	static const char *const bad[] = {
		"tp0_pp1", "tp1_pp0", "tp1", "tp1_pp1x", "TP1_PP1", "tp_pp", "tp-1_pp1",
		"tp1_pp1 ", "xtp1_pp1", "", "ck", "top.txt",
	};

	for (size_t i = 0; i < CKPT_ARRAY_SIZE(bad); i++) {
		ck_assert_msg(!vtree_is_view_name(CKPT_ROOT_INO, bad[i]), "'%s' taken", bad[i]);
		ck_assert_int_eq(lookup_err(CKPT_ROOT_INO, bad[i]), -ENOENT);
	}
	/* an inode never handed out */
	ck_assert_int_eq(lookup_err(VTREE_INO_BASE + 1000000, "x"), -ESTALE);
}
END_TEST

/* ---- lookups ------------------------------------------------------------ */

START_TEST(test_lookup)
{
	uint64_t root = root_of("tp1_pp1"), ck = ck_of("tp1_pp1");
	struct tree_entry top = lookup_ok(root, "top.txt");
	struct tree_entry notes = lookup_ok(ck, "notes.txt");
	struct tree_entry sub = lookup_ok(ck, "sub");
	struct tree_entry link = lookup_ok(ck, "link");
	struct tree_entry model = lookup_ok(ck, "model.safetensors");

	ck_assert(S_ISREG(top.attr.mode));
	ck_assert_uint_eq(top.attr.size, 10);
	ck_assert_uint_eq(top.attr.mode & 0222, 0);
	ck_assert(S_ISREG(notes.attr.mode));
	ck_assert(S_ISDIR(sub.attr.mode));
	ck_assert(S_ISLNK(link.attr.mode));
	/* a view file: one version, read-only, never cached by name */
	ck_assert(S_ISREG(model.attr.mode));
	ck_assert_uint_eq(model.attr.mode & 07777, 0444);
	ck_assert(model.attr.flags & CKPT_INODE_F_SAFETENSORS);
	ck_assert(model.entry_timeout == 0);
	ck_assert(model.attr_timeout == top.attr_timeout); /* its mode follows the sources' */
	ck_assert_uint_gt(model.attr.size, ROWS * COLS * sizeof(float));
	/* the sources are replaced by the view's files */
	ck_assert_int_eq(lookup_err(ck, "model-rank0.safetensors"), -ENOENT);
	ck_assert_int_eq(lookup_err(ck, "model-rank1.safetensors"), -ENOENT);
	ck_assert_int_eq(lookup_err(ck, "missing"), -ENOENT);
	ck_assert_int_eq(lookup_err(root, "missing"), -ENOENT);
	/* nothing below a file */
	ck_assert_int_eq(lookup_err(notes.attr.ino, "x"), -ENOTDIR);
	ck_assert_int_eq(lookup_err(model.attr.ino, "x"), -ENOTDIR);
	/* each layout has its own inodes; tp2 has one file per rank */
	ck_assert_uint_ne(lookup_ok(ck_of("tp2_pp1"), "notes.txt").attr.ino, notes.attr.ino);
	lookup_ok(ck_of("tp2_pp1"), "model_tp0_pp0.safetensors");
	lookup_ok(ck_of("tp2_pp1"), "model_tp1_pp0.safetensors");
	ck_assert_int_eq(lookup_err(ck_of("tp2_pp1"), "model.safetensors"), -ENOENT);
}
END_TEST

/* ---- readdir ------------------------------------------------------------ */

START_TEST(test_readdir)
{
	uint64_t root = root_of("tp1_pp1"), ck = ck_of("tp1_pp1"), ino = 0;
	struct ckpt_dirent *ents = NULL;
	size_t n = 0;

	ck_assert_int_eq(t->ops->readdir(t, ck, &ents, &n), 0);
	ck_assert_uint_eq(n, 4);
	ck_assert(has_ent(ents, n, "notes.txt", S_IFREG, NULL));
	ck_assert(has_ent(ents, n, "link", S_IFLNK, NULL));
	ck_assert(has_ent(ents, n, "sub", S_IFDIR, NULL));
	ck_assert(has_ent(ents, n, "model.safetensors", S_IFREG, &ino));
	ck_assert(!has_ent(ents, n, "model-rank0.safetensors", S_IFREG, NULL));
	/* listed inodes are the ones lookups give */
	ck_assert_uint_eq(ino, lookup_ok(ck, "model.safetensors").attr.ino);
	ck_assert(has_ent(ents, n, "sub", S_IFDIR, &ino));
	ck_assert_uint_eq(ino, lookup_ok(ck, "sub").attr.ino);
	ckpt_dirents_free(ents, n);

	ck_assert_int_eq(t->ops->readdir(t, root, &ents, &n), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert(has_ent(ents, n, "top.txt", S_IFREG, NULL));
	ck_assert(has_ent(ents, n, "ck", S_IFDIR, &ino));
	ck_assert_uint_eq(ino, ck);
	ckpt_dirents_free(ents, n);

	ck_assert_int_eq(t->ops->readdir(t, ck_of("tp2_pp1"), &ents, &n), 0);
	ck_assert_uint_eq(n, 5);
	ck_assert(has_ent(ents, n, "model_tp0_pp0.safetensors", S_IFREG, NULL));
	ck_assert(has_ent(ents, n, "model_tp1_pp0.safetensors", S_IFREG, NULL));
	ckpt_dirents_free(ents, n);

	ck_assert_int_eq(t->ops->readdir(t, lookup_ok(ck, "notes.txt").attr.ino, &ents, &n),
			 -ENOTDIR);
	ck_assert_int_eq(t->ops->readdir(t, VTREE_INO_BASE + 1000000, &ents, &n), -ESTALE);
}
END_TEST

/* ---- getattr ------------------------------------------------------------ */

START_TEST(test_getattr)
{
	uint64_t ck = ck_of("tp1_pp1");
	struct tree_entry model = lookup_ok(ck, "model.safetensors");
	struct tree_entry notes = lookup_ok(ck, "notes.txt");
	struct ckpt_inode in;
	double timeout = -1;

	ck_assert_int_eq(t->ops->getattr(t, model.attr.ino, &in, &timeout), 0);
	ck_assert_uint_eq(in.ino, model.attr.ino);
	ck_assert_uint_eq(in.size, model.attr.size);
	ck_assert_uint_eq(in.mode, model.attr.mode);
	ck_assert(timeout == model.attr_timeout);
	ck_assert_int_eq(t->ops->getattr(t, notes.attr.ino, &in, &timeout), 0);
	ck_assert_uint_eq(in.size, 6);
	ck_assert(S_ISREG(in.mode) && !(in.mode & 0222));
	ck_assert(timeout == notes.attr_timeout);
	ck_assert_int_eq(t->ops->getattr(t, ck, &in, &timeout), 0);
	ck_assert(S_ISDIR(in.mode));
	ck_assert_int_eq(t->ops->getattr(t, VTREE_INO_BASE + 1000000, &in, &timeout), -ESTALE);
	/* a passthrough file whose store inode is gone */
	ck_assert_int_eq(ckpt_store_lookup(st, ck_ino, "notes.txt", &in), 0);
	ck_assert_int_eq(ckpt_store_unlink(st, ck_ino, "notes.txt", false), 0);
	ck_assert_int_eq(ckpt_store_reap(st, in.ino), 0);
	ck_assert_int_eq(t->ops->getattr(t, notes.attr.ino, &in, &timeout), -ESTALE);
}
END_TEST

static uint32_t view_bits_of(const struct ckpt_inode *s)
{
	return vtree_view_read_bits(1, 2, s);
}

/* A view file is readable by a class of users only if every safetensors
 * file of its directory is (vtree.c, view_read_bits): changing a source's
 * mode or owner changes the view file's mode at the next getattr. */
START_TEST(test_view_file_perm)
{
	uint64_t ck = ck_of("tp1_pp1");
	struct tree_entry model = lookup_ok(ck, "model.safetensors");
	struct ckpt_inode in, set;
	double timeout;

	ck_assert_uint_eq(model.attr.mode, S_IFREG | 0444); /* sources 0644, owner 0:0 */
	memset(&set, 0, sizeof(set));
	set.mode = 0640;
	ck_assert_int_eq(ckpt_store_setattr(st, rank_ino[1], CKPT_SET_MODE, &set, NULL), 0);
	vtree_changed(vt);
	ck_assert_int_eq(t->ops->getattr(t, model.attr.ino, &in, &timeout), 0);
	ck_assert_uint_eq(in.mode, S_IFREG | 0440);
	ck_assert_uint_eq(in.uid, 0); /* the directory's owner */
	/* another owner, world-readable: the view's owner and group still read */
	set.uid = 5;
	ck_assert_int_eq(ckpt_store_setattr(st, rank_ino[0], CKPT_SET_UID, &set, NULL), 0);
	vtree_changed(vt);
	ck_assert_int_eq(t->ops->getattr(t, model.attr.ino, &in, &timeout), 0);
	ck_assert_uint_eq(in.mode, S_IFREG | 0440);
	/* ... owner-only: nobody but root reads the view file */
	set.mode = 0600;
	ck_assert_int_eq(ckpt_store_setattr(st, rank_ino[0], CKPT_SET_MODE, &set, NULL), 0);
	ck_assert_int_eq(t->ops->getattr(t, model.attr.ino, &in, &timeout), 0);
	ck_assert_uint_eq(in.mode, S_IFREG | 0440); /* no change seen: no new generation */
	vtree_changed(vt);
	ck_assert_int_eq(t->ops->getattr(t, model.attr.ino, &in, &timeout), 0);
	ck_assert_uint_eq(in.mode, S_IFREG);

	/* the rule, case by case: view owner 1, group 2 */
	{
		struct ckpt_inode s = { .uid = 1, .gid = 2, .mode = S_IFREG | 0444 };
		ck_assert_uint_eq(view_bits_of(&s), 0444);
		s.mode = S_IFREG | 0440; /* others of the view are others of s */
		ck_assert_uint_eq(view_bits_of(&s), 0440);
		s.mode = S_IFREG | 0044; /* the owner may not read s: owner precedence */
		ck_assert_uint_eq(view_bits_of(&s), 0044);
		s.gid = 3; /* group 2's members may be in group 3 or not */
		s.mode = S_IFREG | 0440;
		ck_assert_uint_eq(view_bits_of(&s), 0400);
		s.mode = S_IFREG | 0404; /* others of the view may be in group 3 */
		ck_assert_uint_eq(view_bits_of(&s), 0400);
		s.uid = 9; /* anyone but the view's owner may be uid 9 */
		s.gid = 2;
		s.mode = S_IFREG | 0044;
		ck_assert_uint_eq(view_bits_of(&s), 0400);
		s.mode = S_IFREG | 0444;
		ck_assert_uint_eq(view_bits_of(&s), 0444);
		s.mode = S_IFREG | 0440; /* the view's owner may be other for s */
		ck_assert_uint_eq(view_bits_of(&s), 0040);
	}
}
END_TEST

/* ---- reads -------------------------------------------------------------- */

START_TEST(test_read_views)
{
	uint64_t ck1 = ck_of("tp1_pp1"), ck2 = ck_of("tp2_pp1"), size;
	struct tree_file *f, *g;
	ckpt_digest d[16];
	uint8_t *b, *b2;

	/* tp1: the whole of w */
	f = open_ok(lookup_ok(ck1, "model.safetensors").attr.ino);
	ck_assert_uint_eq(t->ops->size(f), lookup_ok(ck1, "model.safetensors").attr.size);
	b = read_all(f, 1 << 20, &size);
	expect_rows(b, size, 0, ROWS, 0);
	/* odd piece sizes read the same bytes */
	b2 = read_all(f, 7, &size);
	ck_assert_mem_eq(b, b2, size);
	free(b2);
	/* the chunks behind the data: some, at most max */
	ck_assert_uint_gt(t->ops->chunks(f, 0, size, d, CKPT_ARRAY_SIZE(d)), 0);
	ck_assert_uint_le(t->ops->chunks(f, 0, size, d, 1), 1);
	/* one open file is not shared; two of the same inode are */
	ck_assert(!t->ops->shared(f));
	g = open_ok(f->ino);
	ck_assert(t->ops->shared(f) && t->ops->shared(g));
	ck_assert_int_eq(t->ops->commit(g, true), 0); /* nothing to commit */
	t->ops->release(g);
	ck_assert(!t->ops->shared(f));
	t->ops->release(f);
	free(b);

	/* tp2: rank r's rows */
	for (unsigned r = 0; r < 2; r++) {
		char name[64];
		snprintf(name, sizeof(name), "model_tp%u_pp0.safetensors", r);
		f = open_ok(lookup_ok(ck2, name).attr.ino);
		b = read_all(f, 100, &size);
		expect_rows(b, size, 5 * r, 5 * r + 5, 0);
		free(b);
		t->ops->release(f);
	}
}
END_TEST

START_TEST(test_read_gather)
{
	uint64_t ck = ck_of("tp1_pp1"), size, got = 0;
	struct tree_file *f = open_ok(lookup_ok(ck, "model.safetensors").attr.ino);
	uint8_t *plain = read_all(f, 1 << 20, &size);
	uint8_t *buf = malloc(size), *joined = malloc(size);
	struct ckpt_gather g;
	ssize_t r;

	/* a gathered reply holds the same bytes as a plain copy */
	ck_assert_ptr_nonnull(buf);
	ck_assert_ptr_nonnull(joined);
	ckpt_gather_init(&g);
	r = t->ops->read(f, buf, size, 0, &g);
	ck_assert_int_eq(r, (ssize_t)size);
	for (size_t i = 0; i < g.niov; i++) {
		ck_assert_uint_le(got + g.iov[i].iov_len, size);
		memcpy(joined + got, g.iov[i].iov_base, g.iov[i].iov_len);
		got += g.iov[i].iov_len;
	}
	ck_assert_uint_eq(got, size);
	ck_assert_mem_eq(joined, plain, size);
	ckpt_store_gather_done(st, &g);
	t->ops->release(f);
	free(plain);
	free(buf);
	free(joined);
}
END_TEST

START_TEST(test_read_passthrough)
{
	uint64_t ck = ck_of("tp1_pp1"), size;
	struct tree_file *f = open_ok(lookup_ok(ck, "notes.txt").attr.ino);
	uint8_t *b = read_all(f, 4, &size);
	char *target = NULL;

	ck_assert_uint_eq(size, 6);
	ck_assert_mem_eq(b, "notes\n", 6);
	free(b);
	t->ops->release(f);
	f = open_ok(lookup_ok(root_of("tp1_pp1"), "top.txt").attr.ino);
	b = read_all(f, 1 << 20, &size);
	ck_assert_uint_eq(size, 10);
	ck_assert_mem_eq(b, "top level\n", 10);
	free(b);
	t->ops->release(f);
	ck_assert_int_eq(t->ops->readlink(t, lookup_ok(ck, "link").attr.ino, &target), 0);
	ck_assert_str_eq(target, "notes.txt");
	free(target);
}
END_TEST

/* ---- versions ----------------------------------------------------------- */

START_TEST(test_new_version)
{
	uint64_t ck = ck_of("tp1_pp1"), size, old_ino;
	struct vtree_stats vs;
	struct tree_file *f, *g;
	uint8_t *b;

	old_ino = lookup_ok(ck, "model.safetensors").attr.ino;
	f = open_ok(old_ino);
	/* new content of a source: the name maps to a new inode once told */
	put_rank(1, 1000);
	vtree_changed(vt);
	ck_assert_uint_ne(lookup_ok(ck, "model.safetensors").attr.ino, old_ino);
	/* the file open before reads its version; opening it again fails */
	b = read_all(f, 1 << 20, &size);
	expect_rows(b, size, 0, ROWS, 0);
	free(b);
	t->ops->release(f);
	ck_assert_int_eq(t->ops->open(t, old_ino, O_RDONLY, &g), -ESTALE);
	f = open_ok(lookup_ok(ck, "model.safetensors").attr.ino);
	b = read_all(f, 1 << 20, &size);
	expect_rows(b, size, 0, ROWS, 1000);
	free(b);
	t->ops->release(f);
	vtree_get_stats(vt, &vs);
	ck_assert_uint_ge(vs.builds, 2);
}
END_TEST

/* ---- refusals ----------------------------------------------------------- */

START_TEST(test_refusals)
{
	uint64_t root = root_of("tp1_pp1"), ck = ck_of("tp1_pp1");
	uint64_t notes = lookup_ok(ck, "notes.txt").attr.ino;
	uint64_t model = lookup_ok(ck, "model.safetensors").attr.ino;
	struct tree_entry e;
	struct tree_file *f = NULL;
	struct ckpt_inode in;
	char *target = NULL;

	memset(&in, 0, sizeof(in));
	/* opens for writing or truncating, of directories */
	ck_assert_int_eq(t->ops->open(t, notes, O_WRONLY, &f), -EROFS);
	ck_assert_int_eq(t->ops->open(t, model, O_RDWR, &f), -EROFS);
	ck_assert_int_eq(t->ops->open(t, model, O_RDONLY | O_TRUNC, &f), -EROFS);
	ck_assert_int_eq(t->ops->open(t, ck, O_RDONLY, &f), -EISDIR);
	ck_assert_int_eq(t->ops->open(t, VTREE_INO_BASE + 1000000, O_RDONLY, &f), -ESTALE);
	/* symlinks only */
	ck_assert_int_eq(t->ops->readlink(t, notes, &target), -EINVAL);
	ck_assert_int_eq(t->ops->readlink(t, ck, &target), -EINVAL);
	/* every change */
	ck_assert_int_eq(t->ops->setattr(t, notes, CKPT_SET_MODE, &in), -EROFS);
	ck_assert_int_eq(t->ops->mknode(t, ck, "new", S_IFREG | 0644, 0, 0, NULL, 0, &e), -EROFS);
	ck_assert_int_eq(t->ops->mknode(t, root, "new", S_IFDIR | 0755, 0, 0, NULL, 0, &e), -EROFS);
	ck_assert_int_eq(t->ops->unlink(t, ck, "notes.txt", false), -EROFS);
	ck_assert_int_eq(t->ops->unlink(t, CKPT_ROOT_INO, "tp1_pp1", true), -EROFS);
	ck_assert_int_eq(t->ops->link(t, notes, ck_ino, "again", &e), -EROFS);
	ck_assert_int_eq(t->ops->rename(t, ck, "notes.txt", ck_ino, "moved", 0), -EROFS);
	ck_assert_int_eq(t->ops->rename(t, CKPT_ROOT_INO, "tp1_pp1", CKPT_ROOT_INO, "x", 0),
			 -EROFS);
	/* making a view root's name: it exists */
	ck_assert_int_eq(t->ops->mknode(t, CKPT_ROOT_INO, "tp1_pp1", S_IFDIR | 0755, 0, 0, NULL, 0,
					&e),
			 -EEXIST);
	ck_assert_int_eq(t->ops->link(t, rank_ino[0], CKPT_ROOT_INO, "tp2_pp2", &e), -EEXIST);
	ck_assert_int_eq(t->ops->rename(t, CKPT_ROOT_INO, "top.txt", CKPT_ROOT_INO, "tp1_pp1", 0),
			 -EEXIST);
	/* into a view tree */
	ck_assert_int_eq(t->ops->link(t, rank_ino[0], ck, "again", &e), -EROFS);
	ck_assert_int_eq(t->ops->rename(t, CKPT_ROOT_INO, "top.txt", ck, "top.txt", 0), -EROFS);
	/* nothing changed in the store */
	ck_assert_int_eq(ckpt_store_lookup(st, ck_ino, "notes.txt", &in), 0);
	ck_assert_int_eq(ckpt_store_lookup(st, CKPT_ROOT_INO, "top.txt", &in), 0);
}
END_TEST

/* ---- the view cache ----------------------------------------------------- */

START_TEST(test_view_cache)
{
	struct vtree_stats vs;

	/* view_cache 2; a lookup in tpT_ppP/ck uses the views of the store
	 * root (to find ck) and of ck */
	lookup_ok(ck_of("tp1_pp1"), "model.safetensors");
	vtree_get_stats(vt, &vs);
	ck_assert_uint_eq(vs.builds, 2);
	ck_assert_uint_eq(vs.views, 2);
	ck_assert_uint_eq(vs.evictions, 0);
	lookup_ok(ck_of("tp1_pp1"), "model.safetensors"); /* both cached */
	vtree_get_stats(vt, &vs);
	ck_assert_uint_eq(vs.builds, 2);
	/* another layout drops the least recently used ones */
	lookup_ok(ck_of("tp2_pp1"), "model_tp0_pp0.safetensors");
	vtree_get_stats(vt, &vs);
	ck_assert_uint_eq(vs.builds, 4);
	ck_assert_uint_eq(vs.views, 2);
	ck_assert_uint_eq(vs.evictions, 2);
	/* a change makes a cached view recheck its sources, not rebuild */
	vtree_changed(vt);
	lookup_ok(ck_of("tp2_pp1"), "model_tp0_pp0.safetensors");
	vtree_get_stats(vt, &vs);
	ck_assert_uint_eq(vs.builds, 4);
}
END_TEST

static Suite *vtree_suite(void)
{
	Suite *s = suite_create("vtree");
	TCase *ns = tcase_create("namespace");
	TCase *files = tcase_create("files");
	TCase *all[] = { ns, files };

	for (size_t i = 0; i < CKPT_ARRAY_SIZE(all); i++) {
		tl_tcase_dirs(all[i], "check_vtree-");
		tcase_add_checked_fixture(all[i], vt_setup, vt_teardown);
		tcase_set_timeout(all[i], 30);
		suite_add_tcase(s, all[i]);
	}
	tcase_add_test(ns, test_layout_dirs);
	tcase_add_test(ns, test_bad_names);
	tcase_add_test(ns, test_lookup);
	tcase_add_test(ns, test_readdir);
	tcase_add_test(ns, test_getattr);
	tcase_add_test(ns, test_view_file_perm);
	tcase_add_test(ns, test_refusals);
	tcase_add_test(files, test_read_views);
	tcase_add_test(files, test_read_gather);
	tcase_add_test(files, test_read_passthrough);
	tcase_add_test(files, test_new_version);
	tcase_add_test(files, test_view_cache);
	return s;
}

int main(void)
{
	return tl_run(vtree_suite());
}
