/* SPDX-License-Identifier: MIT */
/*
 * ckpt - offline and inspection commands for a ckptfs store.
 *
 *   ckpt stat STORE   usage summary (works while the store is mounted)
 *   ckpt fsck STORE   verify every chunk and reference; exit 1 on damage
 *   ckpt gc STORE     reclaim space held by unreferenced chunks
 *   ckpt repair STORE rebuild a damaged index (from its metadata log)
 *   ckpt ls STORE [PATH]            checkpoint directories, groups, saved layouts
 *   ckpt check STORE PATH           can every view of PATH be served?
 *   ckpt export STORE PATH --layout tpT_ppP OUTDIR
 *                                   write the tpT_ppP view of PATH into OUTDIR
 *   ckpt help [COMMAND], ckpt COMMAND --help, ckpt --version
 *
 * The commands are a table (commands[] below): each entry's synopsis and
 * description are its help text, and its argument counts and options drive
 * one parser, so every command answers -h/--help and reports a wrong
 * argument with its own usage.
 *
 * Exit status: 0 success, 1 damage found / operation failed, 2 usage error.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
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

static double ratio(uint64_t a, uint64_t b)
{
	return b ? (double)a / (double)b : 1.0;
}

/* --meta CONNINFO: the store's metadata is in PostgreSQL (docs/cluster.md);
 * NULL: RocksDB in STORE/index. */
static const char *meta_where;

/* Open with the options in *o (mode and compaction threshold set by the
 * caller; no chunk cache). */
static int open_store_opts(const char *path, struct ckpt_store_opts *o, ckpt_store **ret)
{
	char err[512];
	int r;

	o->cache_size = 0;
	if (meta_where) {
		o->meta_engine = "postgresql";
		o->meta_where = meta_where;
		o->create = false;
	}
	/* A daemon that was just unmounted may still be flushing: give it a
	 * few seconds to let go of the store before calling it busy. */
	for (int tries = 0;; tries++) {
		r = ckpt_store_open(path, o, ret, err, sizeof(err));
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

static int open_store(const char *path, enum ckpt_store_mode mode, ckpt_store **ret)
{
	struct ckpt_store_opts o;

	ckpt_store_opts_init(&o);
	o.mode = mode;
	return open_store_opts(path, &o, ret);
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

static int cmd_gc(const char *path, unsigned live)
{
	struct ckpt_store_opts o;
	struct ckpt_gc_stats g;
	ckpt_store *s;
	int r;

	ckpt_store_opts_init(&o);
	o.mode = CKPT_STORE_RW;
	o.compact_live = live;
	r = open_store_opts(path, &o, &s);

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

static void repair_report(void *ud, enum ckpt_repair_kind kind, const char *path,
			  const char *what)
{
	static const char *const tag[] = { "note", "fixed", "lost" };

	(void)ud;
	printf("%s: %s%s%s\n", tag[kind], path ? path : "", path ? ": " : "", what);
	fflush(stdout);
}

static int cmd_repair(const char *path)
{
	struct ckpt_repair_stats st;
	char err[1024];
	int r = ckpt_store_repair(path, repair_report, NULL, &st, err, sizeof(err));

	if (r < 0) {
		if (r == -EBUSY)
			fprintf(stderr, "ckpt: %s: store is mounted or in use by another process; "
					"unmount it first\n", path);
		else
			fprintf(stderr, "ckpt: repair failed: %s\n", err);
		return 1;
	}
	printf("%s: %s; %" PRIu64 " file(s) lost, %" PRIu64 " record(s) fixed, %" PRIu64
	       " chunk entr%s re-pointed\n", path,
	       st.index_replaced ? (st.salvaged ? "index salvaged" : "index rebuilt from its metadata log") :
	       st.index_damaged ? "index damaged" : "index intact",
	       st.files_lost, st.fixed, st.chunks_relocated, st.chunks_relocated == 1 ? "y" : "ies");
	return st.files_lost ? 1 : 0;
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
		fprintf(stderr, "ckpt: %s: %s: %s\n", ckpt_store_path(s), path, err);
		return 1;
	}
	for (size_t g = 0; g < ckpt_view_ngroups(v); g++) {
		struct ckpt_view_group_info gi;
		char nometa[160] = "";
		ckpt_view_group_info(v, g, &gi);
		if (gi.nometa)
			snprintf(nometa, sizeof(nometa),
				 "  (NO SHARDING METADATA: %zu tensors in several files differ; run "
				 "ckpt check)",
				 gi.nometa);
		printf("%s  group %s: %zu tensors in %zu files, saved as tp%u_pp%u, %" PRIu64
		       " layers%s%s\n",
		       path, gi.name, gi.tensors, gi.files, gi.saved_tp, gi.saved_pp, gi.num_layers,
		       gi.problems ? "  (INCOMPLETE: run ckpt check)" : "", nometa);
	}
	ckpt_view_unref(v);
	r = ckpt_store_readdir(s, dir, &ents, &n);
	if (r < 0) {
		fprintf(stderr, "ckpt: %s: %s: cannot list: %s\n", ckpt_store_path(s), path,
			strerror(-r));
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		char *sub;
		if (!S_ISDIR(ents[i].mode))
			continue;
		sub = join(path, ents[i].name);
		if (!sub) {
			fprintf(stderr, "ckpt: %s: %s\n", path, strerror(ENOMEM));
			r = 1;
		} else if (ls_dir(s, ents[i].ino, sub)) {
			r = 1;
		}
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
		fprintf(stderr, "ckpt: %s: %s: %s\n", ckpt_store_path(s), src_path, err);
		return 1;
	}
	r = ckpt_store_readdir(s, dir, &ents, &n);
	if (r < 0) {
		fprintf(stderr, "ckpt: %s: %s: cannot list: %s\n", ckpt_store_path(s), src_path,
			strerror(-r));
		ckpt_view_unref(v);
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		char *sp = join(src_path, ents[i].name), *op = join(out, ents[i].name);
		struct ckpt_inode in;

		if (!sp || !op) {
			fprintf(stderr, "ckpt: %s: %s\n", src_path, strerror(ENOMEM));
			bad = 1;
		} else if ((r = ckpt_store_getattr(s, ents[i].ino, &in)) < 0) {
			fprintf(stderr, "ckpt: %s: %s: %s\n", ckpt_store_path(s), sp, strerror(-r));
			bad = 1;
		} else if (S_ISDIR(in.mode)) {
			bad |= export_dir(s, in.ino, l, rules, sp, op);
		} else if (S_ISLNK(in.mode)) {
			char *target = NULL;
			r = ckpt_store_readlink(s, in.ino, &target);
			if (r == 0 && symlink(target, op) < 0 && errno != EEXIST)
				r = -errno;
			if (r < 0) {
				fprintf(stderr, "ckpt: %s -> %s: cannot copy symlink: %s\n", sp, op,
					strerror(-r));
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

static int cmd_export(const char *store, const char *path, const struct ckpt_layout *l,
		      const char *layout, const char *out, const char *rules_path)
{
	ckpt_tp_rules *rules = NULL;
	struct ckpt_inode in;
	ckpt_store *s = NULL;
	int r, ret = 1;

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
	ret = export_dir(s, in.ino, l, rules, path, out);
	if (ret == 0)
		printf("exported %s as %s into %s\n", path, layout, out);
out:
	if (s)
		ckpt_view_forget_store(s);
	ckpt_store_free(s);
	ckpt_tp_rules_free(rules);
	return ret;
}

/* ------------------------------------------------------------ command line */

enum { OPT_LAYOUT = 1u << 0, OPT_TP_RULES = 1u << 1, OPT_LIVE = 1u << 2 };

/* One command's arguments after parsing: positionals in order, options by name. */
struct args {
	const char *pos[3];
	int npos;
	const char *layout;
	const char *tp_rules;
	const char *live;
};

struct command {
	const char *name;
	const char *synopsis; /* the arguments, after "ckpt NAME " */
	const char *pos_names[3]; /* the positionals, for "missing PATH" */
	const char *summary;  /* one line for the list of commands */
	const char *help;     /* what it does; lines of at most 78 columns */
	int min_pos, max_pos; /* positional arguments (max_pos <= 3) */
	unsigned opts;	      /* OPT_* it accepts */
	unsigned required;    /* OPT_* it needs */
	int (*run)(const struct command *c, const struct args *a);
};

static int usage_error(const struct command *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int run_stat(const struct command *c, const struct args *a)
{
	return cmd_stat(a->pos[0]);
}

static int run_fsck(const struct command *c, const struct args *a)
{
	return cmd_fsck(a->pos[0]);
}

static int run_gc(const struct command *c, const struct args *a)
{
	char *end;
	unsigned long live = 0;

	if (a->live) {
		errno = 0;
		live = strtoul(a->live, &end, 10);
		if (errno || end == a->live || *end || live < 1 || live > 100)
			return usage_error(c, "invalid --live '%s' (a percentage, 1 to 100)",
					   a->live);
	}
	return cmd_gc(a->pos[0], (unsigned)live);
}

static int run_repair(const struct command *c, const struct args *a)
{
	return cmd_repair(a->pos[0]);
}

static int run_ls(const struct command *c, const struct args *a)
{
	return cmd_ls(a->pos[0], a->npos > 1 ? a->pos[1] : "/");
}

static int run_check(const struct command *c, const struct args *a)
{
	return cmd_check(a->pos[0], a->pos[1], a->tp_rules);
}

static int run_export(const struct command *c, const struct args *a)
{
	struct ckpt_layout l;

	if (ckpt_layout_parse(a->layout, &l) < 0)
		return usage_error(c, "invalid layout '%s' (expected tpT_ppP, e.g. tp4_pp2)",
				   a->layout);
	return cmd_export(a->pos[0], a->pos[1], &l, a->layout, a->pos[2], a->tp_rules);
}

#define TP_RULES_HELP                                                              \
	"  --tp-rules FILE   extra tensor-parallel rules, one 'REGEX DIM' per line, for\n" \
	"                    tensors whose split is neither stated nor inferable\n"      \
	"                    (docs/views.md)\n"

#define META_HELP                                                                  \
	"  --meta CONNINFO   the store's metadata is in PostgreSQL: the connection\n"     \
	"                    string its daemons were given (ckptfs -o meta=)\n"

static const struct command commands[] = {
	{ "stat", "STORE", { "STORE" },
	  "files, logical and stored bytes, dedup and compression ratios",
	  "Print the store's files, logical and stored bytes, dedup and compression\n"
	  "ratios.  Works while the store is mounted.\n"
	  "\n" META_HELP,
	  1, 1, 0, 0, run_stat },
	{ "fsck", "STORE", { "STORE" },
	  "verify every chunk and reference (store unmounted)",
	  "Read and verify every chunk and reference; name each damaged file.  The\n"
	  "store must be unmounted.  Exit status 1 if anything is damaged.\n"
	  "\n" META_HELP,
	  1, 1, 0, 0, run_fsck },
	{ "gc", "STORE [--live N]", { "STORE" },
	  "reclaim the space of unreferenced chunks (store unmounted)",
	  "Reclaim the space of unreferenced chunks (deleted or overwritten data).\n"
	  "The store must be unmounted.  Safe to run again after a failure.\n"
	  "\n"
	  "  --live N          rewrite the packs whose live chunks fill less than N% of\n"
	  "                    them (1-100, default 80; packs with none are deleted)\n" META_HELP,
	  1, 1, OPT_LIVE, 0, run_gc },
	{ "repair", "STORE", { "STORE" },
	  "rebuild a damaged index and list what it lost (store unmounted)",
	  "Bring a store whose index is damaged back to one that mounts and passes\n"
	  "fsck.  The index is restored from its metadata log (STORE/metalog) and\n"
	  "compared with the index in place, read whole; a damaged index, or one\n"
	  "that lost commits its log holds, is replaced (the old one is kept as\n"
	  "STORE/index.damaged.N).  Then every record is checked against the others\n"
	  "and against the chunk records in the packs: a file whose content cannot be\n"
	  "found whole is removed and listed ('lost: PATH: why'), nothing is ever\n"
	  "given bytes it did not hold; other fixes are listed as 'fixed:'.  The\n"
	  "store must be unmounted.  Exit status 1 if any file was lost or the repair\n"
	  "failed.  Safe to run again, and on an intact store.\n",
	  1, 1, 0, 0, run_repair },
	{ "ls", "STORE [PATH]", { "STORE", "PATH" },
	  "checkpoint directories, their groups and saved layouts",
	  "List the checkpoint directories under PATH (default /) with their groups,\n"
	  "tensor counts and the layout they were saved in.  Flags what it finds\n"
	  "without reading tensor data: INCOMPLETE (pieces disagree on dtype, global\n"
	  "shape or tp_dim) and NO SHARDING METADATA (files without ckptfs metadata\n"
	  "hold one tensor with different shapes or bytes).  Works while mounted.\n"
	  "\n" META_HELP,
	  1, 2, 0, 0, run_ls },
	{ "check", "STORE PATH [--tp-rules FILE]", { "STORE", "PATH" },
	  "can every resharded view of PATH be served?",
	  "Report the tensors of the files directly in PATH that no resharded view can\n"
	  "serve (missing or inconsistent pieces, tensors that files without sharding\n"
	  "metadata hold with different contents).  Works while mounted.  Exit status 1\n"
	  "if there are any.\n"
	  "\n" TP_RULES_HELP META_HELP,
	  2, 2, OPT_TP_RULES, 0, run_check },
	{ "export", "STORE PATH --layout tpT_ppP OUTDIR [--tp-rules FILE]",
	  { "STORE", "PATH", "OUTDIR" },
	  "write the tpT_ppP view of PATH as plain files (store unmounted)",
	  "Write the tpT_ppP view of PATH (and of its subdirectories) as plain files\n"
	  "into the directory OUTDIR.  The store must be unmounted.\n"
	  "\n"
	  "  --layout tpT_ppP  the tensor- and pipeline-parallel layout, e.g. tp4_pp2\n" TP_RULES_HELP META_HELP,
	  3, 3, OPT_LAYOUT | OPT_TP_RULES, OPT_LAYOUT, run_export },
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static const struct command *find_command(const char *name)
{
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (!strcmp(commands[i].name, name))
			return &commands[i];
	return NULL;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: ckpt COMMAND ARGS...\n"
		   "       ckpt help [COMMAND] | ckpt COMMAND --help | ckpt --version\n"
		   "\n"
		   "commands:\n");
	for (size_t i = 0; i < NCOMMANDS; i++)
		fprintf(f, "  %s %s\n      %s\n", commands[i].name, commands[i].synopsis,
			commands[i].summary);
	fprintf(f, "\n'ckpt help COMMAND' describes one command.  Exit status: 0 success, "
		   "1 failure\nor damage found, 2 usage error.\n");
}

static void command_usage(const struct command *c, FILE *f)
{
	fprintf(f, "usage: ckpt %s %s\n", c->name, c->synopsis);
}

static void command_help(const struct command *c)
{
	command_usage(c, stdout);
	printf("\n%s", c->help);
}

static int usage_error(const struct command *c, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "ckpt %s: ", c->name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	command_usage(c, stderr);
	return 2;
}

static int is_help(const char *arg)
{
	return !strcmp(arg, "-h") || !strcmp(arg, "--help");
}

/* The value of option name at argv[*i] ("--name VALUE" or "--name=VALUE"), or
 * NULL when argv[*i] is not that option.  *missing is set when it is, but
 * without a value. */
static const char *option_value(int argc, char **argv, int *i, const char *name, int *missing)
{
	size_t n = strlen(name);

	if (strncmp(argv[*i], name, n))
		return NULL;
	if (argv[*i][n] == '=')
		return argv[*i] + n + 1;
	if (argv[*i][n] != '\0')
		return NULL;
	if (*i + 1 >= argc) {
		*missing = 1;
		return NULL;
	}
	return argv[++*i];
}

/* Parse argv[0..argc) (the arguments after the command name) into a and run
 * the command.  -h/--help anywhere before "--" prints the help instead. */
static int run_command(const struct command *c, int argc, char **argv)
{
	struct args a = { .npos = 0 };
	int only_pos = 0;

	for (int i = 0; i < argc; i++)
		if (!strcmp(argv[i], "--"))
			break;
		else if (is_help(argv[i])) {
			command_help(c);
			return 0;
		}
	for (int i = 0; i < argc; i++) {
		const char *arg = argv[i], *v;
		int missing = 0;

		if (!only_pos && !strcmp(arg, "--")) {
			only_pos = 1;
			continue;
		}
		if (!only_pos && arg[0] == '-' && arg[1] != '\0') {
			if ((c->opts & OPT_LAYOUT) &&
			    ((v = option_value(argc, argv, &i, "--layout", &missing)) || missing)) {
				if (missing)
					return usage_error(c, "option '--layout' needs a value");
				a.layout = v;
			} else if ((c->opts & OPT_TP_RULES) &&
				   ((v = option_value(argc, argv, &i, "--tp-rules", &missing)) ||
				    missing)) {
				if (missing)
					return usage_error(c, "option '--tp-rules' needs a value");
				a.tp_rules = v;
			} else if ((c->opts & OPT_LIVE) &&
				   ((v = option_value(argc, argv, &i, "--live", &missing)) || missing)) {
				if (missing)
					return usage_error(c, "option '--live' needs a value");
				a.live = v;
			} else if ((v = option_value(argc, argv, &i, "--meta", &missing)) || missing) {
				if (missing)
					return usage_error(c, "option '--meta' needs a value");
				meta_where = v;
			} else {
				return usage_error(c, "unknown option '%s'", arg);
			}
			continue;
		}
		if (a.npos >= c->max_pos)
			return usage_error(c, "unexpected argument '%s'", arg);
		a.pos[a.npos++] = arg;
	}
	if (a.npos < c->min_pos)
		return usage_error(c, "missing %s", c->pos_names[a.npos]);
	if ((c->required & OPT_LAYOUT) && !a.layout)
		return usage_error(c, "option '--layout' is required");
	return c->run(c, &a);
}

int main(int argc, char **argv)
{
	const struct command *c;

	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (is_help(argv[1])) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
		printf("ckpt (%s) %s\n", PACKAGE_NAME, PACKAGE_VERSION);
		return 0;
	}
	if (!strcmp(argv[1], "help")) {
		if (argc == 2) {
			usage(stdout);
			return 0;
		}
		c = argc == 3 ? find_command(argv[2]) : NULL;
		if (!c) {
			if (argc == 3)
				fprintf(stderr, "ckpt help: unknown command '%s'\n", argv[2]);
			else
				fprintf(stderr, "ckpt help: expected one COMMAND\n");
			usage(stderr);
			return 2;
		}
		command_help(c);
		return 0;
	}
	c = find_command(argv[1]);
	if (!c) {
		fprintf(stderr, "ckpt: unknown command '%s'\n", argv[1]);
		usage(stderr);
		return 2;
	}
	ckpt_log_set_level(CKPT_LOG_ERR);
	return run_command(c, argc - 2, argv + 2);
}
