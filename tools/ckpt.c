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
 *   ckpt verify STORE [--sample N%|N] [--bytes SIZE]
 *                                   read back chunks, mounted or not (ckpt_verify.c)
 *   ckpt du STORE [PATH]            logical, unique and stored bytes per
 *                                   directory (ckpt_du.c)
 *   ckpt prune DIR --keep-last N --keep-every K
 *                                   delete old step directories (ckpt_prune.c)
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

#include <jansson.h>

#include "ckpt_cmd.h"
#include "views/layout.h"
#include "views/shardmeta.h"
#include "store/store.h"
#include "base/util.h"
#include "views/view.h"

static double ratio(uint64_t a, uint64_t b)
{
	return b ? (double)a / (double)b : 1.0;
}

static int cmd_stat(const char *path, bool json)
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
	if (json)
		return print_json_doc(json_pack(
			"{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:I, s:I, s:I, s:I, "
			"s:I, s:I}",
			"store", path, "files", (json_int_t)st.files, "directories",
			(json_int_t)st.dirs, "symlinks", (json_int_t)st.symlinks, "logical_bytes",
			(json_int_t)st.logical_bytes, "unique_bytes", (json_int_t)st.unique_bytes,
			"stored_bytes", (json_int_t)st.stored_bytes, "chunks", (json_int_t)st.chunks,
			"dedup_ratio", ratio(st.logical_bytes, st.unique_bytes), "compression_ratio",
			ratio(st.unique_bytes, st.stored_bytes), "total_ratio",
			ratio(st.logical_bytes, st.stored_bytes), "unreferenced_chunks",
			(json_int_t)st.dead_chunks, "unreferenced_bytes", (json_int_t)st.dead_bytes,
			"unindexed_bytes", (json_int_t)st.unindexed_bytes, "compression_pending",
			(json_int_t)st.deferred_chunks, "pack_files", (json_int_t)st.pack_files,
			"pack_bytes", (json_int_t)st.pack_bytes));
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
	if (ud) /* a bar on stderr: the report starts on a line of its own */
		fputs("\r\033[K", stderr);
	if (path)
		printf("damaged: %s: %s\n", path, what);
	else
		printf("problem: %s\n", what);
}

static int cmd_fsck(const char *path, enum ckpt_bar_mode progress)
{
	struct ckpt_progress p;
	ckpt_bar *bar;
	ckpt_store *s;
	int r = open_store(path, CKPT_STORE_RO, &s);

	if (r < 0)
		return 1;
	bar = ckpt_bar_new("fsck", progress, 0, stderr);
	ckpt_bar_callback(bar, &p);
	ckpt_store_set_progress(s, &p);
	r = ckpt_store_fsck(s, fsck_report, bar);
	ckpt_bar_finish(bar);
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

static int cmd_gc(const char *path, unsigned live, enum ckpt_bar_mode progress)
{
	struct ckpt_store_opts o;
	struct ckpt_gc_stats g;
	struct ckpt_progress p;
	ckpt_bar *bar;
	ckpt_store *s;
	int r;

	ckpt_store_opts_init(&o);
	o.mode = CKPT_STORE_RW;
	o.compact_live = live;
	if (meta_where) {
		/* a shared store: the whole gc when nothing is mounted here, else
		 * (nodes hold the store lock shared) the part that is safe beside
		 * them (docs/cluster.md section 7) */
		char err[512];

		o.meta_engine = "postgresql";
		o.meta_where = meta_where;
		o.cache_size = 0;
		r = ckpt_store_open(path, &o, &s, err, sizeof(err));
		if (r == -EBUSY) {
			o.gc_online = true;
			r = ckpt_store_open(path, &o, &s, err, sizeof(err));
		}
		if (r < 0) {
			fprintf(stderr, "ckpt: %s\n", err);
			return 1;
		}
	} else if (open_store_opts(path, &o, &s) < 0) {
		return 1;
	}
	bar = ckpt_bar_new("gc", progress, 0, stderr);
	ckpt_bar_callback(bar, &p);
	ckpt_store_set_progress(s, &p);
	r = ckpt_store_gc(s, &g);
	ckpt_bar_finish(bar);
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
	if (meta_where) {
		printf("gc_epoch: %" PRIu64 "\n", g.epoch);
		printf("sessions_live: %" PRIu64 "\n", g.sessions_live);
		printf("sessions_suspected: %" PRIu64 "\n", g.sessions_suspected);
		printf("sessions_declared_dead: %" PRIu64 "\n", g.sessions_dead);
		printf("mode: %s\n", g.online ? "online (beside live nodes: partly live packs "
						 "are rewritten only when none is mounted)" :
						 "offline");
	}
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

/* List dir (at path) and its subdirectories: as text, or with out not NULL
 * as one object per directory appended to out (docs/user-guide.md 5.1). */
static int ls_dir(ckpt_store *s, uint64_t dir, const char *path, json_t *out)
{
	json_t *groups = NULL;
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
	if (out) {
		groups = json_array();
		if (!groups || json_array_append_new(out, json_pack("{s:s, s:o}", "path", path,
								     "groups", groups))) {
			fprintf(stderr, "ckpt: %s: %s: %s\n", ckpt_store_path(s), path,
				strerror(ENOMEM));
			ckpt_view_unref(v);
			return 1;
		}
	}
	for (size_t g = 0; g < ckpt_view_ngroups(v); g++) {
		struct ckpt_view_group_info gi;
		char nometa[160] = "";
		ckpt_view_group_info(v, g, &gi);
		if (groups) {
			char lay[48];

			snprintf(lay, sizeof(lay), "tp%u_pp%u", gi.saved_tp, gi.saved_pp);
			json_array_append_new(
				groups,
				json_pack("{s:s, s:I, s:I, s:s, s:I, s:I, s:I, s:b, s:I, s:I}", "name",
					  gi.name, "tensors", (json_int_t)gi.tensors, "files",
					  (json_int_t)gi.files, "saved_layout", lay, "saved_tp",
					  (json_int_t)gi.saved_tp, "saved_pp", (json_int_t)gi.saved_pp,
					  "layers", (json_int_t)gi.num_layers, "incomplete",
					  gi.problems != 0, "conflicting_tensors",
					  (json_int_t)gi.problems, "nometa_tensors",
					  (json_int_t)gi.nometa));
			continue;
		}
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
		} else if (ls_dir(s, ents[i].ino, sub, out)) {
			r = 1;
		}
		free(sub);
	}
	ckpt_dirents_free(ents, n);
	return r ? 1 : 0;
}

static int cmd_ls(const char *store, const char *path, bool json)
{
	json_t *dirs = NULL;
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
	if (json && !(dirs = json_array())) {
		fprintf(stderr, "ckpt: %s: %s\n", store, strerror(ENOMEM));
		r = 1;
	} else {
		r = ls_dir(s, in.ino, path, dirs);
	}
	ckpt_view_forget_store(s);
	ckpt_store_free(s);
	if (dirs && print_json_doc(json_pack("{s:s, s:s, s:o}", "store", store, "path", path,
					 "directories", dirs)))
		r = 1;
	return r;
}

struct check_ctx {
	const char *path;
	json_t *problems; /* --json: the problems, else NULL */
};

static void check_report(void *ud, const char *file, const char *why)
{
	struct check_ctx *c = ud;

	if (c->problems)
		json_array_append_new(c->problems,
				      json_pack("{s:s, s:s}", "file", file, "reason", why));
	else
		printf("%s/%s: %s\n", c->path, file, why);
}

static int load_rules(const char *path, ckpt_tp_rules **ret)
{
	char err[512];
	int r = ckpt_tp_rules_new(path, ret, err, sizeof(err));

	if (r < 0)
		fprintf(stderr, "ckpt: tp rules: %s\n", err);
	return r;
}

static int cmd_check(const char *store, const char *path, const char *rules_path, bool json)
{
	static const struct ckpt_layout l11 = { 1, 1 };
	struct check_ctx ctx = { path, NULL };
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
	if (json && !(ctx.problems = json_array())) {
		fprintf(stderr, "ckpt: %s: %s: %s\n", store, path, strerror(ENOMEM));
		goto out;
	}
	r = ckpt_view_check(v, check_report, &ctx);
	if (r < 0) {
		fprintf(stderr, "ckpt: %s: %s: %s\n", store, path, strerror(-r));
	} else if (json) {
		ret = r > 0;
		if (print_json_doc(json_pack("{s:s, s:s, s:b, s:I, s:I, s:O}", "store", store, "path",
					 path, "ok", r == 0, "groups",
					 (json_int_t)ckpt_view_ngroups(v), "unservable_tensors",
					 (json_int_t)r, "problems", ctx.problems)))
			ret = 1;
	} else if (r > 0) {
		printf("%s: %d tensor(s) cannot be served\n", path, r);
	} else {
		printf("%s: ok (%zu group(s))\n", path, ckpt_view_ngroups(v));
		ret = 0;
	}
out:
	json_decref(ctx.problems);
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

/* The bar of ckpt export (NULL: none): bytes written; its total grows by
 * each directory's files as export_dir reaches it. */
static ckpt_bar *export_bar;

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
		ckpt_bar_add(export_bar, (uint64_t)n);
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
	if (export_bar) { /* what this directory adds to the bar's total */
		struct ckpt_inode in;
		uint64_t more = 0;

		for (size_t i = 0; i < n; i++)
			if (S_ISREG(ents[i].mode) && !ckpt_view_is_source(v, ents[i].ino) &&
			    ckpt_store_getattr(s, ents[i].ino, &in) == 0)
				more += in.size;
		for (size_t i = 0; i < ckpt_view_nfiles(v); i++)
			more += ckpt_view_file_size(v, i);
		ckpt_bar_grow(export_bar, more);
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
		      const char *layout, const char *out, const char *rules_path,
		      enum ckpt_bar_mode progress)
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
	export_bar = ckpt_bar_new("export", progress, 0, stderr);
	ret = export_dir(s, in.ino, l, rules, path, out);
	ckpt_bar_finish(export_bar);
	export_bar = NULL;
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

enum {
	OPT_LAYOUT = 1u << 0,
	OPT_TP_RULES = 1u << 1,
	OPT_LIVE = 1u << 2,
	OPT_JSON = 1u << 3,
	OPT_PROGRESS = 1u << 4, /* --progress and --no-progress */
	OPT_SAMPLE = 1u << 5,
	OPT_BYTES = 1u << 6,
	OPT_SEED = 1u << 7,
	OPT_KEEP_LAST = 1u << 8,
	OPT_KEEP_EVERY = 1u << 9,
	OPT_DRY_RUN = 1u << 10,
};

/* The options: "--name VALUE" (or --name=VALUE) stores VALUE in the const
 * char * at off in struct args; a flag without a value stores setval in
 * the int there. */
static const struct option_def {
	unsigned opt; /* OPT_* */
	const char *name;
	bool has_value;
	size_t off;
	int setval;
} options[] = {
	{ OPT_LAYOUT, "--layout", true, offsetof(struct args, layout), 0 },
	{ OPT_TP_RULES, "--tp-rules", true, offsetof(struct args, tp_rules), 0 },
	{ OPT_LIVE, "--live", true, offsetof(struct args, live), 0 },
	{ OPT_JSON, "--json", false, offsetof(struct args, json), 1 },
	{ OPT_PROGRESS, "--progress", false, offsetof(struct args, progress), CKPT_BAR_ON },
	{ OPT_PROGRESS, "--no-progress", false, offsetof(struct args, progress), CKPT_BAR_OFF },
	{ OPT_SAMPLE, "--sample", true, offsetof(struct args, sample), 0 },
	{ OPT_BYTES, "--bytes", true, offsetof(struct args, bytes), 0 },
	{ OPT_SEED, "--seed", true, offsetof(struct args, seed), 0 },
	{ OPT_KEEP_LAST, "--keep-last", true, offsetof(struct args, keep_last), 0 },
	{ OPT_KEEP_EVERY, "--keep-every", true, offsetof(struct args, keep_every), 0 },
	{ OPT_DRY_RUN, "--dry-run", false, offsetof(struct args, dry_run), 1 },
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
	return cmd_stat(a->pos[0], a->json);
}

static int run_fsck(const struct command *c, const struct args *a)
{
	return cmd_fsck(a->pos[0], a->progress);
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
	return cmd_gc(a->pos[0], (unsigned)live, a->progress);
}

static int run_repair(const struct command *c, const struct args *a)
{
	return cmd_repair(a->pos[0]);
}

static int run_ls(const struct command *c, const struct args *a)
{
	return cmd_ls(a->pos[0], a->npos > 1 ? a->pos[1] : "/", a->json);
}

static int run_check(const struct command *c, const struct args *a)
{
	return cmd_check(a->pos[0], a->pos[1], a->tp_rules, a->json);
}

static int run_verify(const struct command *c, const struct args *a)
{
	struct ckpt_verify_opts vo = { 0 };

	if (a->sample) {
		size_t n = strlen(a->sample);
		uint64_t v;

		if (n > 1 && a->sample[n - 1] == '%') {
			/* a percentage with up to 4 decimals: 0.01%, 5%, 100% */
			char *end;
			double pct;

			errno = 0;
			pct = strtod(a->sample, &end);
			if (errno || end != a->sample + n - 1 || !(pct > 0) || pct > 100)
				return usage_error(c, "invalid --sample '%s' (N%%, 0 < N <= 100, or a "
						   "number of chunks)", a->sample);
			vo.sample_ppm = (uint32_t)(pct * 10000.0 + 0.5);
			if (vo.sample_ppm == 0)
				vo.sample_ppm = 1;
		} else if (parse_u64(a->sample, &v) < 0 || v == 0) {
			return usage_error(c, "invalid --sample '%s' (N%%, 0 < N <= 100, or a "
					   "number of chunks)", a->sample);
		} else {
			vo.sample_count = v;
		}
	}
	if (a->bytes && (parse_size(a->bytes, &vo.byte_budget) < 0 || vo.byte_budget == 0))
		return usage_error(c, "invalid --bytes '%s' (a size such as 500M or 2G)", a->bytes);
	if (a->seed && (parse_u64(a->seed, &vo.seed) < 0 || vo.seed == 0))
		return usage_error(c, "invalid --seed '%s' (a positive integer)", a->seed);
	return cmd_verify(a->pos[0], &vo, a->progress);
}

static int run_du(const struct command *c, const struct args *a)
{
	return cmd_du(a->pos[0], a->npos > 1 ? a->pos[1] : "/", a->json);
}

static int run_prune(const struct command *c, const struct args *a)
{
	uint64_t last = 0, every = 0;

	if (a->keep_last && (parse_u64(a->keep_last, &last) < 0 || last == 0))
		return usage_error(c, "invalid --keep-last '%s' (a positive integer)", a->keep_last);
	if (a->keep_every && (parse_u64(a->keep_every, &every) < 0 || every == 0))
		return usage_error(c, "invalid --keep-every '%s' (a positive integer)",
				   a->keep_every);
	if (!last && !every)
		return usage_error(c, "give --keep-last N or --keep-every K (or both): prune "
				      "never deletes every step");
	return cmd_prune(a->pos[0], last, every, a->dry_run);
}

static int run_export(const struct command *c, const struct args *a)
{
	struct ckpt_layout l;

	if (ckpt_layout_parse(a->layout, &l) < 0)
		return usage_error(c, "invalid layout '%s' (expected tpT_ppP, e.g. tp4_pp2)",
				   a->layout);
	return cmd_export(a->pos[0], a->pos[1], &l, a->layout, a->pos[2], a->tp_rules,
			  a->progress);
}

#define TP_RULES_HELP                                                              \
	"  --tp-rules FILE   extra tensor-parallel rules, one 'REGEX DIM' per line, for\n" \
	"                    tensors whose split is neither stated nor inferable\n"      \
	"                    (docs/views.md)\n"

#define PROGRESS_HELP                                                              \
	"  --progress        show a progress bar on stderr even when it is not a\n"   \
	"                    terminal\n"                                               \
	"  --no-progress     no progress bar (default: shown when stderr is a terminal)\n"
#define META_HELP                                                                  \
	"  --meta CONNINFO   the store's metadata is in PostgreSQL: the connection\n"     \
	"                    string its daemons were given (ckptfs -o meta=)\n"
#define JSON_HELP "  --json            print one JSON object (docs/user-guide.md, 5.1)\n"

static const struct command commands[] = {
	{ "stat", "STORE [--json]", { "STORE" },
	  "files, logical and stored bytes, dedup and compression ratios",
	  "Print the store's files, logical and stored bytes, dedup and compression\n"
	  "ratios.  Works while the store is mounted.\n"
	  "\n" JSON_HELP META_HELP,
	  1, 1, OPT_JSON, 0, run_stat },
	{ "fsck", "STORE [--progress|--no-progress]", { "STORE" },
	  "verify every chunk and reference (store unmounted)",
	  "Read and verify every chunk and reference; name each damaged file.  The\n"
	  "store must be unmounted (ckpt verify reads chunks while it is mounted).\n"
	  "Exit status 1 if anything is damaged.\n"
	  "\n" PROGRESS_HELP META_HELP,
	  1, 1, OPT_PROGRESS, 0, run_fsck },
	{ "gc", "STORE [--live N] [--progress|--no-progress]", { "STORE" },
	  "reclaim the space of unreferenced chunks (store unmounted, or beside\n      mounted nodes with --meta)",
	  "Reclaim the space of unreferenced chunks (deleted or overwritten data).\n"
	  "The store must be unmounted.  Safe to run again after a failure.  With\n"
	  "--meta it also runs while nodes are mounted: it then drops the chunks no\n"
	  "live node can still reference and deletes the packs no chunk and no live\n"
	  "node uses, and declares dead the nodes without a heartbeat within their\n"
	  "session timeout (docs/cluster.md section 7).\n"
	  "\n"
	  "  --live N          rewrite the packs whose live chunks fill less than N% of\n"
	  "                    them (1-100, default 80; packs with none are deleted)\n"
	  PROGRESS_HELP META_HELP,
	  1, 1, OPT_LIVE | OPT_PROGRESS, 0, run_gc },
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
	{ "ls", "STORE [PATH] [--json]", { "STORE", "PATH" },
	  "checkpoint directories, their groups and saved layouts",
	  "List the checkpoint directories under PATH (default /) with their groups,\n"
	  "tensor counts and the layout they were saved in.  Flags what it finds\n"
	  "without reading tensor data: INCOMPLETE (pieces disagree on dtype, global\n"
	  "shape or tp_dim) and NO SHARDING METADATA (files without ckptfs metadata\n"
	  "hold one tensor with different shapes or bytes).  Works while mounted.\n"
	  "\n" JSON_HELP META_HELP,
	  1, 2, OPT_JSON, 0, run_ls },
	{ "check", "STORE PATH [--tp-rules FILE] [--json]", { "STORE", "PATH" },
	  "can every resharded view of PATH be served?",
	  "Report the tensors of the files directly in PATH that no resharded view can\n"
	  "serve (missing or inconsistent pieces, tensors that files without sharding\n"
	  "metadata hold with different contents).  Works while mounted.  Exit status 1\n"
	  "if there are any.\n"
	  "\n" TP_RULES_HELP JSON_HELP META_HELP,
	  2, 2, OPT_TP_RULES | OPT_JSON, 0, run_check },
	{ "export",
	  "STORE PATH --layout tpT_ppP OUTDIR [--tp-rules FILE] [--progress|--no-progress]",
	  { "STORE", "PATH", "OUTDIR" },
	  "write the tpT_ppP view of PATH as plain files (store unmounted)",
	  "Write the tpT_ppP view of PATH (and of its subdirectories) as plain files\n"
	  "into the directory OUTDIR.  The store must be unmounted.\n"
	  "\n"
	  "  --layout tpT_ppP  the tensor- and pipeline-parallel layout, e.g. tp4_pp2\n" TP_RULES_HELP
	  PROGRESS_HELP META_HELP,
	  3, 3, OPT_LAYOUT | OPT_TP_RULES | OPT_PROGRESS, OPT_LAYOUT, run_export },
	{ "verify", "STORE [--sample N%|N] [--bytes SIZE] [--seed N] [--progress|--no-progress]",
	  { "STORE" },
	  "read back and check stored chunks, all or a sample (works mounted)",
	  "Read every chunk of the store back, or a random sample of them, and check\n"
	  "each record's checksum, its decompression and its digest.  Works while the\n"
	  "store is mounted, without stopping the daemon: a chunk that the daemon\n"
	  "moves or drops meanwhile is looked up again, never reported as damaged.\n"
	  "Names each damaged chunk and the files that use it.  Exit status 1 if\n"
	  "anything is damaged.\n"
	  "\n"
	  "  --sample N%|N     read N percent of the chunks (0.0001-100), or N chunks,\n"
	  "                    chosen at random\n"
	  "  --bytes SIZE      read random chunks until SIZE stored bytes are read\n"
	  "                    (e.g. 500M, 20G); with --sample, whichever ends first\n"
	  "  --seed N          the random choice of chunks (default: a new one each run)\n"
	  PROGRESS_HELP META_HELP,
	  1, 1, OPT_SAMPLE | OPT_BYTES | OPT_SEED | OPT_PROGRESS, 0, run_verify },
	{ "du", "STORE [PATH] [--json]", { "STORE", "PATH" },
	  "logical, unique and stored bytes of each directory under PATH (works mounted)",
	  "For PATH (default /) and each directory directly in it (a checkpoint step):\n"
	  "logical bytes (the sizes of its files), unique bytes (the stored bytes of\n"
	  "the chunks that nothing outside it uses: what deleting it would free), and\n"
	  "stored bytes (of every chunk it uses, compressed, each counted once).\n"
	  "PATH is a path inside the store.  Works while the store is mounted (files\n"
	  "closed in the last second may not be counted yet).\n"
	  "\n" JSON_HELP META_HELP,
	  1, 2, OPT_JSON, 0, run_du },
	{ "prune", "DIR [--keep-last N] [--keep-every K] [--dry-run]", { "DIR" },
	  "delete old checkpoint step directories by a retention policy",
	  "Delete the step directories in DIR that no rule keeps.  A step directory's\n"
	  "name ends in its step number (step_100, global_step100, checkpoint-500,\n"
	  "iter_0000100); steps are grouped by the name before the number, and in\n"
	  "each group the newest step is always kept.  DIR is normally a directory on\n"
	  "the mount: the daemon deletes the files, and the space of the chunks only\n"
	  "they used is reclaimed as for any deleted file.  At least one rule is\n"
	  "needed.\n"
	  "\n"
	  "  --keep-last N     keep the N newest steps of each group\n"
	  "  --keep-every K    keep the steps whose number is a multiple of K\n"
	  "  --dry-run         print what would be deleted; delete nothing\n",
	  1, 1, OPT_KEEP_LAST | OPT_KEEP_EVERY | OPT_DRY_RUN, 0, run_prune },
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
	struct args a = { .npos = 0, .progress = CKPT_BAR_AUTO };
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
			const struct option_def *od = NULL;

			for (size_t k = 0; k < sizeof(options) / sizeof(options[0]) && !od; k++) {
				if (!(c->opts & options[k].opt))
					continue;
				if (!options[k].has_value) {
					if (!strcmp(arg, options[k].name)) {
						od = &options[k];
						*(int *)((char *)&a + od->off) = od->setval;
					}
				} else if ((v = option_value(argc, argv, &i, options[k].name,
							     &missing)) || missing) {
					od = &options[k];
					if (missing)
						return usage_error(c, "option '%s' needs a value",
								   od->name);
					*(const char **)((char *)&a + od->off) = v;
				}
			}
			/* every command takes --meta (the store's metadata engine) */
			if (!od && ((v = option_value(argc, argv, &i, "--meta", &missing)) ||
				    missing)) {
				if (missing)
					return usage_error(c, "option '--meta' needs a value");
				meta_where = v;
				continue;
			}
			if (!od)
				return usage_error(c, "unknown option '%s'", arg);
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
