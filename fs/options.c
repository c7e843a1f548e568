/* SPDX-License-Identifier: MIT */
/*
 * options.c - the daemon's command line (see options.h).
 */
#include "config.h"

#include "options.h"

#include "views/view.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "vtree.h"

/* -o options as fuse_opt_parse fills them in (strings malloc'd). */
struct raw_opts {
	const char *store;
	int compress;
	char *cache_size;
	char *buf_reserve;
	char *pack_max;
	int verify_dedup;
	int inline_compress;
	int nobackground;
	int keep_unreferenced;
	unsigned compact_live;
	char *log_level;
	char *log_file;
	int syslog;
	char *tp_rules;
	unsigned workers;
	unsigned readahead_kb;
	unsigned ra_workers;
	unsigned drop_behind;
	unsigned writeback_cache;
	char *direct_read;
	unsigned view_cache;
	char *view_mem;
	char *meta;
	char *node;
	unsigned session_timeout;
	int fsname_given;            /* -o fsname=... is on the command line */
	int subtype_given;           /* -o subtype=... */
};

/* opt_proc keys of the libfuse options that options_parse looks at (and keeps). */
enum { KEY_FSNAME = 1, KEY_SUBTYPE };

#define OPT(t, p) { t, offsetof(struct raw_opts, p), 1 }
static const struct fuse_opt opt_spec[] = {
	OPT("compress=%d", compress),
	OPT("cache_size=%s", cache_size),
	OPT("buf_reserve=%s", buf_reserve),
	OPT("pack_max=%s", pack_max),
	OPT("verify_dedup", verify_dedup),
	OPT("inline_compress", inline_compress),
	OPT("nobackground", nobackground),
	OPT("keep_unreferenced", keep_unreferenced),
	OPT("compact_live=%u", compact_live),
	OPT("log_level=%s", log_level),
	OPT("log=%s", log_file),
	OPT("syslog", syslog),
	OPT("workers=%u", workers),
	OPT("tp_rules=%s", tp_rules),
	OPT("readahead_kb=%u", readahead_kb),
	OPT("ra_workers=%u", ra_workers),
	OPT("view_cache=%u", view_cache),
	OPT("view_mem=%s", view_mem),
	OPT("drop_behind=%u", drop_behind),
	OPT("writeback_cache=%u", writeback_cache),
	OPT("direct_read=%s", direct_read),
	OPT("meta=%s", meta),
	OPT("node=%s", node),
	OPT("session_timeout=%u", session_timeout),
	FUSE_OPT_KEY("fsname=", KEY_FSNAME),
	FUSE_OPT_KEY("subtype=", KEY_SUBTYPE),
	FUSE_OPT_END
};

static int opt_proc(void *data, const char *arg, int key, struct fuse_args *outargs)
{
	struct raw_opts *o = data;

	(void)outargs;
	if (key == FUSE_OPT_KEY_NONOPT && !o->store) {
		o->store = strdup(arg);
		return 0; /* consumed: STORE */
	}
	if (key == KEY_FSNAME)
		o->fsname_given = 1;
	if (key == KEY_SUBTYPE)
		o->subtype_given = 1;
	return 1; /* kept for libfuse */
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
	       "  -o compact_live=N    background compaction rewrites packs whose live\n"
	       "                       chunks fill less than N%% of them (1-100, default\n"
	       "                       80, as `ckpt gc`)\n"
	       "  -o pack_max=SIZE     start a new pack file once the current one is\n"
	       "                       past SIZE (at least 1M; default 1G)\n"
	       "  -o keep_unreferenced background work keeps the chunks of deleted and\n"
	       "                       rewritten data (only `ckpt gc` reclaims them)\n"
	       "  -o log_level=LEVEL   error|warn|info|debug (default info: mount, unmount\n"
	       "                       with a session summary, background work, errors)\n"
	       "  -o log=FILE          log to FILE (appended; reopened on SIGHUP)\n"
	       "  -o syslog            log to syslog (journald), facility daemon\n"
	       "  -o workers=N         chunk worker threads (default: one per CPU)\n"
	       "  -o tp_rules=FILE     extra tensor-parallel rules for views: lines \"REGEX DIM\"\n"
	       "  -o readahead_kb=N    read-ahead of the mount in KiB (default 1024; 0 keeps\n"
	       "                       the kernel's)\n"
	       "  -o ra_workers=N      threads loading chunks ahead of sequential readers\n"
	       "                       (default: two per CPU; 0, or cache_size=0, turns\n"
	       "                       chunk read-ahead off)\n"
	       "  -o view_cache=N      resharded views kept built, most recently used\n"
	       "                       (1-4096, default 8)\n"
	       "  -o view_mem=SIZE     memory for the parsed headers and view models that\n"
	       "                       view builds share (default 256M; 0: 16 models,\n"
	       "                       64 headers, whatever their size)\n"
	       "  -o drop_behind=0|1   drop the kernel's cached pages of a file 32 MiB\n"
	       "                       behind a sequential reader that has it open alone\n"
	       "                       (default 1)\n"
	       "  -o writeback_cache=0|1\n"
	       "                       1: files open for writing go through the kernel's\n"
	       "                       page cache, which gathers small writes into\n"
	       "                       large ones (faster small writes, slower 1 MiB\n"
	       "                       saves); default 0: they use direct_io.\n"
	       "                       Not with meta=\n"
	       "  -o direct_read=views|all|none\n"
	       "                       read-only files that bypass the kernel's page\n"
	       "                       cache (direct_io): view files (default), also\n"
	       "                       stored files, or none; only where the kernel can\n"
	       "                       still map such files shared (Linux 6.6 and later)\n"
	       "  -o meta=CONNINFO     keep the metadata in PostgreSQL (a libpq connection\n"
	       "                       string or URI, no password: use ~/.pgpass) so that\n"
	       "                       daemons on several nodes share the store; STORE is\n"
	       "                       then the chunk directory they share.  Implies\n"
	       "                       nobackground (docs/cluster.md)\n"
	       "  -o node=NAME         with meta=: this daemon's node id in the shared\n"
	       "                       store, 1-64 of [A-Za-z0-9._:-] (default:\n"
	       "                       HOSTNAME-PID); one live daemon per id\n"
	       "  -o session_timeout=S with meta=: seconds without a heartbeat after which\n"
	       "                       `ckpt gc` suspects this node's session (a gc S s\n"
	       "                       later declares it dead if it is still silent)\n"
	       "                       (default 60; heartbeat every S/6, at most 5 s)\n"
	       "  -f                   stay in the foreground, log to stderr\n"
	       "  -d                   foreground with debug logging (FUSE and ckptfs)\n"
	       "\n"
	       "Without -f the daemon detaches once the mount is ready and logs to\n"
	       "STORE/ckptfs.log unless -o log or -o syslog is given.  Metrics:\n"
	       "MOUNTPOINT/.ckptfs/metrics (Prometheus text format).\n"
	       "Unmount with: fusermount3 -u MOUNTPOINT\n\n",
	       prog);
	fuse_cmdline_help();
	fuse_lowlevel_help();
}

/* A path made absolute (the store's, the log's): the daemon changes to /
 * once detached. */
static int absolute_path(const char *what, const char *path, char **ret)
{
	char cwd[PATH_MAX];

	if (path[0] == '/') {
		*ret = strdup(path);
	} else if (!getcwd(cwd, sizeof(cwd)) || asprintf(ret, "%s/%s", cwd, path) < 0) {
		fprintf(stderr, "ckptfs: cannot resolve %s %s: %s\n", what, path, strerror(errno));
		*ret = NULL;
		return -1;
	}
	if (!*ret)
		fprintf(stderr, "ckptfs: out of memory\n");
	return *ret ? 0 : -1;
}

/*
 * The mount's source and type as /proc/mounts, findmnt and df show them: the store's path and
 * fuse.ckptfs, unless -o fsname= or -o subtype= is given (libfuse would use the program's name
 * for both, and with fsname= alone the type would be plain "fuse").  mount -a recognises an
 * fstab line as mounted by its source (and its mountpoint).  Added before
 * fuse_parse_cmdline, which then adds no default subtype of its own.
 */
static int add_mount_names(struct fuse_args *args, const struct raw_opts *raw, const char *store)
{
	char *opt = NULL, *esc = NULL;
	int r = -1;

	if (!raw->fsname_given) {
		/* fuse_opt_add_opt_escaped: a ',' or '\\' in the path must not split the option */
		if (asprintf(&opt, "fsname=%s", store) < 0) {
			opt = NULL;
			goto out;
		}
		if (fuse_opt_add_opt_escaped(&esc, opt) < 0 || fuse_opt_add_arg(args, "-o") < 0 ||
		    fuse_opt_add_arg(args, esc) < 0)
			goto out;
	}
	if (!raw->subtype_given && fuse_opt_add_arg(args, "-osubtype=ckptfs") < 0)
		goto out;
	r = 0;
out:
	if (r < 0)
		fprintf(stderr, "ckptfs: out of memory\n");
	free(opt);
	free(esc);
	return r;
}

/* Whether a libpq connection string or URI holds a password (a command line
 * is readable by every local user). */
static bool conninfo_has_password(const char *s)
{
	const char *a, *at, *slash;

	if (strcasestr(s, "password="))
		return true;
	if (strncmp(s, "postgresql://", 13) && strncmp(s, "postgres://", 11))
		return false;
	a = strstr(s, "://") + 3; /* [user[:password]@]host... */
	at = strchr(a, '@');
	slash = strchr(a, '/');
	if (!at || (slash && slash < at))
		return false;
	return memchr(a, ':', (size_t)(at - a)) != NULL;
}

/* Check raw and turn it into ret; -1 with a message on a bad value. */
static int convert(const struct raw_opts *raw, struct ckptfs_opts *ret)
{
	struct ckpt_store_opts *so = &ret->sopts;

	ckpt_store_opts_init(so);
	so->create = true;
	if (raw->compress != INT_MIN) {
		if (raw->compress < 0 || raw->compress > 19) {
			fprintf(stderr, "ckptfs: compress=%d: level must be 0 (off) to 19\n",
				raw->compress);
			return -1;
		}
		so->compress_level = raw->compress;
	}
	so->verify_dedup = raw->verify_dedup;
	so->bg = raw->nobackground ? CKPT_BG_OFF :
		 raw->inline_compress ? CKPT_BG_COMPACT : CKPT_BG_ALL;
	if (raw->compact_live > 100) {
		fprintf(stderr, "ckptfs: invalid compact_live %u: a percentage, 1 to 100\n",
			raw->compact_live);
		return -1;
	}
	so->compact_live = raw->compact_live;
	so->keep_unreferenced = raw->keep_unreferenced;
	if (raw->cache_size && parse_size(raw->cache_size, &so->cache_size) < 0) {
		fprintf(stderr, "ckptfs: invalid cache_size '%s'\n", raw->cache_size);
		return -1;
	}
	if (raw->pack_max && (parse_size(raw->pack_max, &so->pack_max) < 0 ||
			      so->pack_max < (1u << 20))) {
		fprintf(stderr, "ckptfs: invalid pack_max '%s': a size of at least 1M\n",
			raw->pack_max);
		return -1;
	}
	so->buf_reserve = CKPT_BUF_RESERVE_AUTO;
	if (raw->buf_reserve && parse_size(raw->buf_reserve, &so->buf_reserve) < 0) {
		fprintf(stderr, "ckptfs: invalid buf_reserve '%s'\n", raw->buf_reserve);
		return -1;
	}
	if (raw->view_cache < 1 || raw->view_cache > 4096) {
		fprintf(stderr, "ckptfs: invalid view_cache %u: between 1 and 4096 views\n",
			raw->view_cache);
		return -1;
	}
	ret->view_cache = raw->view_cache;
	ret->view_mem = CKPT_VIEW_CACHE_MEM_DEFAULT;
	if (raw->view_mem && parse_size(raw->view_mem, &ret->view_mem) < 0) {
		fprintf(stderr, "ckptfs: invalid view_mem '%s'\n", raw->view_mem);
		return -1;
	}
	ret->direct_read = DIRECT_READ_VIEWS;
	if (raw->direct_read) {
		ret->direct_read_given = true;
		if (strcmp(raw->direct_read, "views") == 0) {
			ret->direct_read = DIRECT_READ_VIEWS;
		} else if (strcmp(raw->direct_read, "all") == 0) {
			ret->direct_read = DIRECT_READ_ALL;
		} else if (strcmp(raw->direct_read, "none") == 0) {
			ret->direct_read = DIRECT_READ_NONE;
		} else {
			fprintf(stderr, "ckptfs: invalid direct_read '%s' (views, all or none)\n",
				raw->direct_read);
			return -1;
		}
	}
	if (raw->log_level) {
		static const char *const names[] = { "error", "warn", "info", "debug" };
		size_t i;
		for (i = 0; i < CKPT_ARRAY_SIZE(names); i++)
			if (!strcmp(raw->log_level, names[i]))
				break;
		if (i == CKPT_ARRAY_SIZE(names)) {
			fprintf(stderr, "ckptfs: invalid log_level '%s'\n", raw->log_level);
			return -1;
		}
		ckpt_log_set_level((enum ckpt_log_level)i);
	}
	if (raw->log_file && raw->syslog) {
		fprintf(stderr, "ckptfs: -o log and -o syslog exclude each other\n");
		return -1;
	}
	if (raw->log_file && absolute_path("log", raw->log_file, &ret->log_file) < 0)
		return -1;
	ret->syslog = raw->syslog != 0;
	if (raw->meta && raw->writeback_cache) {
		/* with its writeback cache the kernel keeps a written file's size
		 * itself and ignores the size the daemon reports, so it would
		 * never see another node grow or shrink a file it has cached */
		fprintf(stderr, "ckptfs: -o writeback_cache=1 and -o meta= exclude each other: "
				"the kernel would keep its own size of a file another node "
				"changed\n");
		return -1;
	}
	if (raw->meta) {
		if (conninfo_has_password(raw->meta)) {
			fprintf(stderr, "ckptfs: meta=: a password on the command line is readable "
					"by every local user: put it in ~/.pgpass (or the file "
					"PGPASSFILE names) instead\n");
			return -1;
		}
		ret->meta = strdup(raw->meta);
		if (!ret->meta) {
			fprintf(stderr, "ckptfs: out of memory\n");
			return -1;
		}
		so->meta_engine = "postgresql";
		so->meta_where = ret->meta;
		so->node = true;
		so->bg = CKPT_BG_OFF; /* compaction would reclaim other nodes' packs */
	}
	if ((raw->node || raw->session_timeout) && !raw->meta) {
		fprintf(stderr, "ckptfs: node= and session_timeout= need meta= (a store shared "
				"by several nodes)\n");
		return -1;
	}
	if (raw->node) {
		if (!ckpt_node_name_ok(raw->node)) {
			fprintf(stderr, "ckptfs: node=%s: a node id is 1-64 characters of "
					"[A-Za-z0-9._:-]\n", raw->node);
			return -1;
		}
		ret->node = strdup(raw->node);
		if (!ret->node) {
			fprintf(stderr, "ckptfs: out of memory\n");
			return -1;
		}
		so->node_name = ret->node;
	}
	if (raw->session_timeout) {
		if (raw->session_timeout > 86400) {
			fprintf(stderr, "ckptfs: session_timeout=%u: at most 86400 seconds\n",
				raw->session_timeout);
			return -1;
		}
		so->session_timeout_ms = raw->session_timeout * 1000u;
	}
	ret->workers = raw->workers;
	ret->ra_workers = raw->ra_workers;
	ret->readahead_kb = raw->readahead_kb == UINT_MAX ? 1024 : raw->readahead_kb;
	ret->drop_behind = raw->drop_behind != 0;
	ret->writeback_cache = raw->writeback_cache != 0;
	return 0;
}

int options_parse(struct fuse_args *args, struct fuse_cmdline_opts *cmd,
		  struct ckptfs_opts *ret)
{
	const char *prog = args->argc > 0 ? args->argv[0] : "ckptfs";
	struct raw_opts raw;
	int r = -1;

	memset(&raw, 0, sizeof(raw));
	memset(ret, 0, sizeof(*ret));
	memset(cmd, 0, sizeof(*cmd));
	raw.compress = INT_MIN;      /* unset */
	raw.readahead_kb = UINT_MAX; /* unset */
	raw.ra_workers = UINT_MAX;   /* unset */
	raw.view_cache = VTREE_VIEW_CACHE_DEFAULT;
	raw.drop_behind = 1;
	raw.writeback_cache = 0;
	if (fuse_opt_parse(args, &raw, opt_spec, opt_proc) < 0)
		goto out;
	if (raw.store && absolute_path("store", raw.store, &ret->store) < 0)
		goto out;
	if (ret->store && add_mount_names(args, &raw, ret->store) < 0)
		goto out;
	if (fuse_parse_cmdline(args, cmd) != 0)
		goto out;
	/* The kernel checks permission bits and ownership on every request:
	 * always, whatever the command line says (see the top of fuse_ops.c). */
	if (fuse_opt_add_arg(args, "-odefault_permissions") != 0) {
		fprintf(stderr, "ckptfs: out of memory\n");
		goto out;
	}
	if (cmd->show_help) {
		usage(prog);
		r = 1;
		goto out;
	}
	if (cmd->show_version) {
		printf("ckptfs %s, libfuse %s\n", PACKAGE_VERSION, fuse_pkgversion());
		r = 1;
		goto out;
	}
	if (!raw.store || !cmd->mountpoint) {
		fprintf(stderr, "usage: %s STORE MOUNTPOINT [-f] [-o opt,...]  (--help for more)\n",
			prog);
		goto out;
	}
	/* the daemon's default: mount, unmount, background summaries, errors */
	ckpt_log_set_level(cmd->debug ? CKPT_LOG_DEBUG : CKPT_LOG_INFO);
	if (convert(&raw, ret) < 0)
		goto out;
	ret->tp_rules = raw.tp_rules;
	raw.tp_rules = NULL;
	r = 0;
out:
	free((char *)raw.store);
	free(raw.cache_size);
	free(raw.view_mem);
	free(raw.buf_reserve);
	free(raw.pack_max);
	free(raw.log_level);
	free(raw.log_file);
	free(raw.tp_rules);
	free(raw.direct_read);
	free(raw.meta);
	free(raw.node);
	return r;
}

void options_free(struct ckptfs_opts *o)
{
	if (!o)
		return;
	free(o->store);
	free(o->tp_rules);
	free(o->log_file);
	o->log_file = NULL;
	free(o->meta);
	free(o->node);
	o->node = NULL;
	o->store = NULL;
	o->tp_rules = NULL;
	o->meta = NULL;
}
