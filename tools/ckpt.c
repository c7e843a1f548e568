/* SPDX-License-Identifier: MIT */
/*
 * ckpt - offline and inspection commands for a ckptfs store.
 *
 *   ckpt stat STORE   usage summary (works while the store is mounted)
 *   ckpt fsck STORE   verify every chunk and reference; exit 1 on damage
 *   ckpt gc STORE     reclaim space held by unreferenced chunks
 *   ckpt ls STORE [PATH]            checkpoint directories, groups, saved layouts
 *   ckpt check STORE PATH           can every view of PATH be served?
 *   ckpt export STORE PATH --layout tpT_ppP OUTDIR
 *                                   write the tpT_ppP view of PATH into OUTDIR
 *
 * Exit status: 0 success, 1 damage found / operation failed, 2 usage error.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <fcntl.h>
#include <sys/stat.h>

#include "views/layout.h"
#include "views/shardmeta.h"
#include "store/store.h"
#include "base/util.h"
#include "views/view.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: ckpt COMMAND STORE\n"
		   "\n"
		   "commands:\n"
		   "  stat STORE   files, logical and stored bytes, dedup and compression ratios\n"
		   "  fsck STORE   read and verify every chunk and reference (store unmounted)\n"
		   "  gc STORE     reclaim space of unreferenced chunks (store unmounted)\n"
		   "  ls STORE [PATH]\n"
		   "               checkpoint directories with their groups, tensor counts and\n"
		   "               the layout they were saved in (works while mounted)\n"
		   "  check STORE PATH [--tp-rules FILE]\n"
		   "               report tensors of PATH that no view can serve (missing or\n"
		   "               inconsistent pieces); exit 1 if any\n"
		   "  export STORE PATH --layout tpT_ppP OUTDIR [--tp-rules FILE]\n"
		   "               write the tpT_ppP view of PATH (and its subdirectories) into\n"
		   "               the directory OUTDIR (store unmounted)\n");
}

static double ratio(uint64_t a, uint64_t b)
{
	return b ? (double)a / (double)b : 1.0;
}

static int open_store(const char *path, enum ckpt_store_mode mode, ckpt_store **ret)
{
	struct ckpt_store_opts o;
	char err[512];
	int r;

	ckpt_store_opts_init(&o);
	o.mode = mode;
	o.cache_size = 0;
	/* A daemon that was just unmounted may still be flushing: give it a
	 * few seconds to let go of the store before calling it busy. */
	for (int tries = 0;; tries++) {
		r = ckpt_store_open(path, &o, ret, err, sizeof(err));
		if (r != -EBUSY || tries >= 30)
			break;
		usleep(100 * 1000);
	}
	if (r < 0) {
		if (r == -EBUSY)
			fprintf(stderr, "ckpt: %s: store is mounted or in use by another process; "
					"unmount it first\n", path);
		else
			fprintf(stderr, "ckpt: %s\n", err);
	}
	return r;
}

static int cmd_stat(const char *path)
{
	struct ckpt_store_stats st;
	ckpt_store *s;
	int r = open_store(path, CKPT_STORE_RO_SHARED, &s);

	if (r < 0)
		return 1;
	r = ckpt_store_stats(s, &st);
	ckpt_store_free(s);
	if (r < 0) {
		fprintf(stderr, "ckpt: %s: cannot read statistics: %s\n", path, strerror(-r));
		return 1;
	}
	printf("store: %s\n", path);
	printf("files: %" PRIu64 "\n", st.files);
	printf("directories: %" PRIu64 "\n", st.dirs);
	printf("symlinks: %" PRIu64 "\n", st.symlinks);
	printf("logical_bytes: %" PRIu64 "\n", st.logical_bytes);
	printf("unique_bytes: %" PRIu64 "\n", st.unique_bytes);
	printf("stored_bytes: %" PRIu64 "\n", st.stored_bytes);
	printf("chunks: %" PRIu64 "\n", st.chunks);
	printf("dedup_ratio: %.2f\n", ratio(st.logical_bytes, st.unique_bytes));
	printf("compression_ratio: %.2f\n", ratio(st.unique_bytes, st.stored_bytes));
	printf("total_ratio: %.2f\n", ratio(st.logical_bytes, st.stored_bytes));
	printf("unreferenced_chunks: %" PRIu64 "\n", st.dead_chunks);
	printf("unreferenced_bytes: %" PRIu64 "\n", st.dead_bytes);
	printf("unindexed_bytes: %" PRIu64 "\n", st.unindexed_bytes);
	printf("compression_pending: %" PRIu64 "\n", st.deferred_chunks);
	printf("pack_files: %" PRIu64 "\n", st.pack_files);
	printf("pack_bytes: %" PRIu64 "\n", st.pack_bytes);
	return 0;
}

static void fsck_report(void *ud, const char *path, const char *what)
{
	(void)ud;
	if (path)
		printf("damaged: %s: %s\n", path, what);
	else
		printf("problem: %s\n", what);
}

static int cmd_fsck(const char *path)
{
	ckpt_store *s;
	int r = open_store(path, CKPT_STORE_RO, &s);

	if (r < 0)
		return 1;
	r = ckpt_store_fsck(s, fsck_report, NULL);
	ckpt_store_free(s);
	if (r < 0) {
		fprintf(stderr, "ckpt: %s: fsck failed: %s\n", path, strerror(-r));
		return 1;
	}
	if (r > 0) {
		printf("%s: %d problem(s) found\n", path, r);
		return 1;
	}
	printf("%s: ok\n", path);
	return 0;
}

static int cmd_gc(const char *path)
{
	struct ckpt_gc_stats g;
	ckpt_store *s;
	int r = open_store(path, CKPT_STORE_RW, &s);

	if (r < 0)
		return 1;
	r = ckpt_store_gc(s, &g);
	ckpt_store_free(s);
	if (r < 0) {
		fprintf(stderr, "ckpt: %s: gc failed: %s (the store is unchanged or consistent; "
				"it is safe to run gc again)\n", path, strerror(-r));
		return 1;
	}
	printf("chunks_dropped: %" PRIu64 "\n", g.chunks_dropped);
	printf("bytes_dropped: %" PRIu64 "\n", g.bytes_dropped);
	printf("packs_rewritten: %" PRIu64 "\n", g.packs_rewritten);
	printf("packs_deleted: %" PRIu64 "\n", g.packs_deleted);
	printf("pack_bytes_before: %" PRIu64 "\n", g.bytes_before);
	printf("pack_bytes_after: %" PRIu64 "\n", g.bytes_after);
	return 0;
}

/* Resolve "/a/b" (relative to the store root) to an inode. */
static int resolve(ckpt_store *s, const char *path, struct ckpt_inode *ret)
{
	char *copy = strdup(path), *save = NULL, *tok;
	int r = ckpt_store_getattr(s, CKPT_ROOT_INO, ret);

	if (!copy)
		return -ENOMEM;
	for (tok = strtok_r(copy, "/", &save); tok && r == 0; tok = strtok_r(NULL, "/", &save)) {
		if (!strcmp(tok, "."))
			continue;
		if (!S_ISDIR(ret->mode)) {
			r = -ENOTDIR;
			break;
		}
		r = ckpt_store_lookup(s, ret->ino, tok, ret);
	}
	free(copy);
	return r;
}

static char *join(const char *a, const char *b)
{
	char *p;

	if (asprintf(&p, "%s%s%s", a, a[strlen(a) - 1] == '/' ? "" : "/", b) < 0)
		return NULL;
	return p;
}

static int ls_dir(ckpt_store *s, uint64_t dir, const char *path)
{
	static const struct ckpt_layout l11 = { 1, 1 };
	struct ckpt_dirent *ents = NULL;
	ckpt_view *v = NULL;
	char err[512];
	size_t n = 0;
	int r = ckpt_view_build(s, dir, &l11, NULL, &v, err, sizeof(err));

	if (r < 0) {
		fprintf(stderr, "ckpt: %s: %s\n", path, err);
		return 1;
	}
	for (size_t g = 0; g < ckpt_view_ngroups(v); g++) {
		struct ckpt_view_group_info gi;
		ckpt_view_group_info(v, g, &gi);
		printf("%s  group %s: %zu tensors in %zu files, saved as tp%u_pp%u, %" PRIu64
		       " layers%s\n",
		       path, gi.name, gi.tensors, gi.files, gi.saved_tp, gi.saved_pp, gi.num_layers,
		       gi.problems ? "  (INCOMPLETE: run ckpt check)" : "");
	}
	ckpt_view_unref(v);
	r = ckpt_store_readdir(s, dir, &ents, &n);
	if (r < 0)
		return 1;
	for (size_t i = 0; i < n; i++) {
		char *sub;
		if (!S_ISDIR(ents[i].mode))
			continue;
		sub = join(path, ents[i].name);
		if (sub && ls_dir(s, ents[i].ino, sub))
			r = 1;
		free(sub);
	}
	ckpt_dirents_free(ents, n);
	return r ? 1 : 0;
}

static int cmd_ls(const char *store, const char *path)
{
	struct ckpt_inode in;
	ckpt_store *s;
	int r = open_store(store, CKPT_STORE_RO_SHARED, &s);

	if (r < 0)
		return 1;
	r = resolve(s, path, &in);
	if (r == 0 && !S_ISDIR(in.mode))
		r = -ENOTDIR;
	if (r < 0) {
		fprintf(stderr, "ckpt: %s: %s: %s\n", store, path, strerror(-r));
		ckpt_store_free(s);
		return 1;
	}
	r = ls_dir(s, in.ino, path);
	ckpt_view_forget_store(s);
	ckpt_store_free(s);
	return r;
}

static void check_report(void *ud, const char *file, const char *why)
{
	printf("%s/%s: %s\n", (const char *)ud, file, why);
}

static int load_rules(const char *path, ckpt_tp_rules **ret)
{
	char err[512];
	int r = ckpt_tp_rules_new(path, ret, err, sizeof(err));

	if (r < 0)
		fprintf(stderr, "ckpt: tp rules: %s\n", err);
	return r;
}

static int cmd_check(const char *store, const char *path, const char *rules_path)
{
	static const struct ckpt_layout l11 = { 1, 1 };
	ckpt_tp_rules *rules = NULL;
	struct ckpt_inode in;
	ckpt_view *v = NULL;
	ckpt_store *s = NULL;
	char err[512];
	int r, ret = 1;

	if (load_rules(rules_path, &rules) < 0)
		return 1;
	if (open_store(store, CKPT_STORE_RO_SHARED, &s) < 0)
		goto out;
	r = resolve(s, path, &in);
	if (r == 0 && !S_ISDIR(in.mode))
		r = -ENOTDIR;
	if (r == 0)
		r = ckpt_view_build(s, in.ino, &l11, rules, &v, err, sizeof(err));
	else
		snprintf(err, sizeof(err), "%s", strerror(-r));
	if (r < 0) {
		fprintf(stderr, "ckpt: %s: %s: %s\n", store, path, err);
		goto out;
	}
	r = ckpt_view_check(v, check_report, (void *)path);
	if (r < 0) {
		fprintf(stderr, "ckpt: %s: %s: %s\n", store, path, strerror(-r));
	} else if (r > 0) {
		printf("%s: %d tensor(s) cannot be served\n", path, r);
	} else {
		printf("%s: ok (%zu group(s))\n", path, ckpt_view_ngroups(v));
		ret = 0;
	}
out:
	ckpt_view_unref(v);
	if (s)
		ckpt_view_forget_store(s);
	ckpt_store_free(s);
	ckpt_tp_rules_free(rules);
	return ret;
}

static int write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Copy bytes from a reader into a new file at path. */
static int export_file(const char *path, mode_t mode, void *src,
		       ssize_t (*rd)(void *src, void *buf, size_t len, uint64_t off))
{
	const size_t blk = 1u << 20;
	uint8_t *buf = malloc(blk);
	uint64_t off = 0;
	int fd, r = 0;

	if (!buf)
		return -ENOMEM;
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	if (fd < 0) {
		free(buf);
		return -errno;
	}
	for (;;) {
		ssize_t n = rd(src, buf, blk, off);
		if (n < 0) {
			r = (int)n;
			break;
		}
		if (n == 0)
			break;
		r = write_all(fd, buf, (size_t)n);
		if (r < 0)
			break;
		off += (uint64_t)n;
	}
	if (r == 0 && fsync(fd) < 0)
		r = -errno;
	if (close(fd) < 0 && r == 0)
		r = -errno;
	free(buf);
	return r;
}

struct ext_src {
	ckpt_store *s;
	struct ckpt_extent_list *l;
};

static ssize_t read_ext(void *p, void *buf, size_t len, uint64_t off)
{
	struct ext_src *e = p;

	return ckpt_store_read_extents(e->s, e->l, buf, len, off);
}

static ssize_t read_vfile(void *p, void *buf, size_t len, uint64_t off)
{
	return ckpt_vfile_read(p, buf, len, off);
}

static int export_dir(ckpt_store *s, uint64_t dir, const struct ckpt_layout *l,
		      const ckpt_tp_rules *rules, const char *src_path, const char *out)
{
	struct ckpt_dirent *ents = NULL;
	ckpt_view *v = NULL;
	char err[1024];
	size_t n = 0;
	int r, bad = 0;

	if (mkdir(out, 0755) < 0 && errno != EEXIST) {
		fprintf(stderr, "ckpt: %s: %s\n", out, strerror(errno));
		return 1;
	}
	r = ckpt_view_build(s, dir, l, rules, &v, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "ckpt: %s: %s\n", src_path, err);
		return 1;
	}
	r = ckpt_store_readdir(s, dir, &ents, &n);
	if (r < 0) {
		fprintf(stderr, "ckpt: %s: %s\n", src_path, strerror(-r));
		ckpt_view_unref(v);
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		char *sp = join(src_path, ents[i].name), *op = join(out, ents[i].name);
		struct ckpt_inode in;

		if (!sp || !op || ckpt_store_getattr(s, ents[i].ino, &in) < 0) {
			bad = 1;
		} else if (S_ISDIR(in.mode)) {
			bad |= export_dir(s, in.ino, l, rules, sp, op);
		} else if (S_ISLNK(in.mode)) {
			char *target = NULL;
			if (ckpt_store_readlink(s, in.ino, &target) < 0 ||
			    (symlink(target, op) < 0 && errno != EEXIST)) {
				fprintf(stderr, "ckpt: %s: cannot copy symlink\n", sp);
				bad = 1;
			}
			free(target);
		} else if (S_ISREG(in.mode) && !ckpt_view_is_source(v, in.ino)) {
			struct ext_src e = { s, NULL };
			r = ckpt_store_load_extents(s, in.ino, &e.l);
			if (r == 0)
				r = export_file(op, in.mode & 07777, &e, read_ext);
			ckpt_extent_list_free(e.l);
			if (r < 0) {
				fprintf(stderr, "ckpt: %s -> %s: %s\n", sp, op, strerror(-r));
				bad = 1;
			}
		}
		free(sp);
		free(op);
	}
	for (size_t i = 0; i < ckpt_view_nfiles(v); i++) {
		char *op = join(out, ckpt_view_file_name(v, i));
		ckpt_vfile *f = NULL;
		err[0] = '\0';
		r = op ? ckpt_vfile_open(v, i, &f, err, sizeof(err)) : -ENOMEM;
		if (r == 0)
			r = export_file(op, 0644, f, read_vfile);
		if (r < 0) {
			fprintf(stderr, "ckpt: %s/%s: %s\n", src_path, ckpt_view_file_name(v, i),
				err[0] ? err : strerror(-r));
			bad = 1;
		}
		ckpt_vfile_free(f);
		free(op);
	}
	ckpt_dirents_free(ents, n);
	ckpt_view_unref(v);
	return bad;
}

static int cmd_export(const char *store, const char *path, const char *layout, const char *out,
		      const char *rules_path)
{
	ckpt_tp_rules *rules = NULL;
	struct ckpt_layout l;
	struct ckpt_inode in;
	ckpt_store *s = NULL;
	int r, ret = 1;

	if (ckpt_layout_parse(layout, &l) < 0) {
		fprintf(stderr, "ckpt: invalid layout '%s' (expected tpT_ppP, e.g. tp4_pp2)\n",
			layout);
		return 2;
	}
	if (load_rules(rules_path, &rules) < 0)
		return 1;
	if (open_store(store, CKPT_STORE_RO, &s) < 0)
		goto out;
	r = resolve(s, path, &in);
	if (r == 0 && !S_ISDIR(in.mode))
		r = -ENOTDIR;
	if (r < 0) {
		fprintf(stderr, "ckpt: %s: %s: %s\n", store, path, strerror(-r));
		goto out;
	}
	ret = export_dir(s, in.ino, &l, rules, path, out);
	if (ret == 0)
		printf("exported %s as %s into %s\n", path, layout, out);
out:
	if (s)
		ckpt_view_forget_store(s);
	ckpt_store_free(s);
	ckpt_tp_rules_free(rules);
	return ret;
}

int main(int argc, char **argv)
{
	if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
		usage(stdout);
		return 0;
	}
	ckpt_log_set_level(CKPT_LOG_ERR);
	if (argc >= 3 && !strcmp(argv[1], "ls")) {
		if (argc > 4) {
			usage(stderr);
			return 2;
		}
		return cmd_ls(argv[2], argc == 4 ? argv[3] : "/");
	}
	if (argc >= 4 && (!strcmp(argv[1], "check") || !strcmp(argv[1], "export"))) {
		const char *layout = NULL, *rules = NULL, *pos[4] = { 0 };
		int npos = 0;
		for (int i = 2; i < argc; i++) {
			if (!strcmp(argv[i], "--layout") && i + 1 < argc)
				layout = argv[++i];
			else if (!strcmp(argv[i], "--tp-rules") && i + 1 < argc)
				rules = argv[++i];
			else if (npos < 4)
				pos[npos++] = argv[i];
			else
				npos = 5;
		}
		if (!strcmp(argv[1], "check") && npos == 2 && !layout)
			return cmd_check(pos[0], pos[1], rules);
		if (!strcmp(argv[1], "export") && npos == 3 && layout)
			return cmd_export(pos[0], pos[1], layout, pos[2], rules);
		usage(stderr);
		return 2;
	}
	if (argc != 3) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "stat"))
		return cmd_stat(argv[2]);
	if (!strcmp(argv[1], "fsck"))
		return cmd_fsck(argv[2]);
	if (!strcmp(argv[1], "gc"))
		return cmd_gc(argv[2]);
	fprintf(stderr, "ckpt: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
