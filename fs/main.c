/* SPDX-License-Identifier: MIT */
/*
 * main.c - the ckptfs daemon: options, detaching, and the FUSE session
 * over the VFS layer.
 *
 * Usage: ckptfs STORE MOUNTPOINT [-f] [-d] [-o opt[,opt...]]  (options.c)
 *
 * Module map of fs/: options.c parses the command line; fuse_ops.c adapts
 * FUSE requests to vfs.c, which dispatches them to the store tree
 * (stree.c) and the view trees (vtree.c) through the tree ops (tree.h);
 * wire.c negotiates FUSE_DIRECT_IO_ALLOW_MMAP and FUSE_HANDLE_KILLPRIV_V2
 * where libfuse cannot and reads the kill-suid/sgid flags of requests.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "base/metrics.h"
#include "base/util.h"
#include "store/readahead.h"
#include "fuse_ops.h"
#include "opstats.h"
#include "options.h"
#include "store/file.h"
#include "store/store.h"
#include "vfs.h"
#include "views/view.h"
#include "wire.h"

/*
 * Page-cache reads reach the daemon in read-ahead sized requests, 128 KiB by
 * default for a FUSE mount.  Raising the mount's read-ahead to 1 MiB (the
 * largest request libfuse 3.14 accepts) means fewer, larger round trips
 * for sequential reads of stored files.  The knob is the mount's backing
 * device in sysfs, reachable once the mount serves requests; without
 * permission it is skipped.
 */
struct ra_arg {
	char *mountpoint;
	unsigned kb;
};

static void detach_release(void);

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
	detach_release();
	return NULL;
}

static void start_raise_readahead(const char *mountpoint, unsigned kb)
{
	struct ra_arg *a = calloc(1, sizeof(*a));
	pthread_t t;

	if (!a || !(a->mountpoint = realpath(mountpoint, NULL))) {
		free(a);
		detach_release();
		return;
	}
	a->kb = kb;
	if (pthread_create(&t, NULL, raise_readahead, a) != 0) {
		free(a->mountpoint);
		free(a);
		detach_release();
		return;
	}
	pthread_detach(t);
}

/* ------------------------------------------------------------ detaching */

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

/* A failure before the mount is ready: to the waiting parent, or stderr. */
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

/*
 * The mount is ready: the log's final place (the -o log file, syslog, or
 * by default STORE/ckptfs.log), stdout and stderr into the log file (what
 * libfuse prints lands there) or /dev/null with syslog.  detach_release()
 * then lets the parent exit.
 */
static void detach_done(const struct ckptfs_opts *o)
{
	char *path;
	int fd;

	if (chdir("/") < 0) {
		/* not fatal */
	}
	if (!o->log_file && !o->syslog && asprintf(&path, "%s/ckptfs.log", o->store) >= 0) {
		if (ckpt_log_to_file(path) < 0)
			ckpt_log_to_syslog("ckptfs"); /* stderr is about to go */
		free(path);
	}
	if (ckpt_log_capture_stderr() == 0) {
		dup2(STDERR_FILENO, STDOUT_FILENO);
	} else {
		fd = open("/dev/null", O_WRONLY);
		if (fd >= 0) {
			dup2(fd, STDOUT_FILENO);
			dup2(fd, STDERR_FILENO);
			close(fd);
		}
	}
	fd = open("/dev/null", O_RDONLY);
	if (fd >= 0) {
		dup2(fd, STDIN_FILENO);
		close(fd);
	}
}

/* Let the waiting parent exit: the mount is ready, its read-ahead set (so
 * that what mount(8) returns to is the mount as configured).  Called once,
 * by the main thread or the read-ahead thread; nothing without a parent. */
static void detach_release(void)
{
	int fd = status_fd;

	status_fd = -1;
	if (fd < 0)
		return;
	if (write(fd, "0", 1) < 0) {
		/* parent gone */
	}
	close(fd);
}

/* ------------------------------------------------------------- logging */

/* Where lines go from the start: the -o log file, syslog, or stderr (a
 * detached daemon moves to STORE/ckptfs.log in detach_done). */
static int log_setup(const struct ckptfs_opts *o)
{
	int r;

	if (o->log_file) {
		r = ckpt_log_to_file(o->log_file);
		if (r < 0) {
			fprintf(stderr, "ckptfs: cannot open log file %s: %s\n", o->log_file,
				strerror(-r));
			return r;
		}
	} else if (o->syslog) {
		ckpt_log_to_syslog("ckptfs");
	} else {
		ckpt_log_to_stderr(true);
	}
	return 0;
}

/* SIGHUP reopens the log file (logrotate renamed it); it does not end the
 * session, as libfuse's handler (installed before this one) would. */
static void on_sighup(int sig)
{
	(void)sig;
	(void)ckpt_log_reopen(); /* async-signal-safe */
}

static int install_sighup(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_sighup;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART;
	return sigaction(SIGHUP, &sa, NULL);
}

static const char *bg_mode(enum ckpt_bg_mode m)
{
	return m == CKPT_BG_OFF ? "off" : m == CKPT_BG_COMPACT ? "compaction only" :
	       "compression and compaction";
}

static void log_mount(const struct ckptfs_opts *o, const char *mountpoint)
{
	ckpt_info("mounted %s on %s: ckptfs %s, pid %ld, zstd level %d, chunk cache %" PRIu64
		  " MiB, background work: %s; metrics in %s/.ckptfs/metrics",
		  o->store, mountpoint, PACKAGE_VERSION, (long)getpid(),
		  o->sopts.compress_level, o->sopts.cache_size >> 20, bg_mode(o->sopts.bg),
		  mountpoint);
}

static double ratio(uint64_t a, uint64_t b)
{
	return b ? (double)a / (double)b : 1.0;
}

/* The session summary at unmount: the process's counters since start. */
static void log_unmount(ckpt_store *s, const char *store, const char *mountpoint,
			int64_t start_ns)
{
	struct ckpt_bg_stats bg;
	uint64_t bn = ckpt_metric_get(CKPT_M_CHUNK_BYTES_NEW);
	uint64_t bd = ckpt_metric_get(CKPT_M_CHUNK_BYTES_DEDUP);
	uint64_t cin, cout;

	ckpt_store_bg_stats(s, &bg);
	cin = ckpt_metric_get(CKPT_M_COMPRESS_IN_INLINE) + bg.compressed_in;
	cout = ckpt_metric_get(CKPT_M_COMPRESS_OUT_INLINE) + bg.compressed_out;
	ckpt_info("unmounted %s from %s after %.1f s: wrote %" PRIu64 " bytes, read %" PRIu64
		  " bytes, %" PRIu64 " files committed; chunks: %" PRIu64 " stored (%" PRIu64
		  " bytes), %" PRIu64 " deduplicated (%" PRIu64
		  " bytes not stored again; dedup ratio %.2f); compressed %" PRIu64 " bytes to %"
		  PRIu64 " (ratio %.2f); %" PRIu64 " chunks still wait for compression",
		  store, mountpoint, (double)(ckpt_mono_ns() - start_ns) / 1e9,
		  ckpt_metric_get(CKPT_M_WRITE_BYTES), ckpt_metric_get(CKPT_M_READ_BYTES),
		  ckpt_metric_get(CKPT_M_FILES_COMMITTED), ckpt_metric_get(CKPT_M_CHUNKS_NEW), bn,
		  ckpt_metric_get(CKPT_M_CHUNKS_DEDUP), bd, ratio(bn + bd, bn), cin, cout,
		  ratio(cin, cout), bg.queued);
}

/* ---------------------------------------------------------------- stats */

static void log_stats(ckpt_store *s, ckpt_readahead *ra, struct vfs *v)
{
	struct ckpt_cache_stats cs;
	struct ckpt_load_ctx_stats ls;
	struct vtree_stats vs;

	if (ra) {
		struct ckpt_ra_stats st;
		struct ckpt_prefetch_stats ps;

		ckpt_readahead_get_stats(ra, &st);
		ckpt_info("read-ahead: %" PRIu64 " chunks queued, %" PRIu64 " loaded, %" PRIu64
			  " found cached, %" PRIu64 " dropped (queue full), %" PRIu64 " failed",
			  st.submitted, st.loaded, st.skipped, st.dropped, st.failed);
		ckpt_store_prefetch_stats(s, &ps);
		ckpt_info("read-ahead requests: %" PRIu64 " by kernel AIO, %" PRIu64
			  " by pread, %" PRIu64 " failed (read again alone)",
			  ps.aio, ps.sync, ps.failed);
	}
	ckpt_store_cache_stats(s, &cs);
	ckpt_info("chunk cache: %" PRIu64 " hits, %" PRIu64 " misses (loaded by readers), %" PRIu64
		  " evictions (%" PRIu64 " of streamed chunks not read to the end), %" PRIu64
		  " bytes held (%" PRIu64 " stream)",
		  cs.hits, cs.misses, cs.evictions, cs.evicted_unread, cs.bytes, cs.stream_bytes);
	ckpt_info("chunk buffers: %" PRIu64 " from the reserve, %" PRIu64 " reused, %" PRIu64
		  " reused resized, %" PRIu64 " newly mapped", cs.bufs_reserve,
		  cs.bufs_pooled, cs.bufs_resized, cs.bufs_fresh);
	ckpt_store_load_ctx_stats(s, &ls);
	ckpt_info("chunk loads' contexts: %" PRIu64 " made (%" PRIu64 " at mount), %" PRIu64
		  " kept", ls.made, ls.warm, ls.free);
	if (v) {
		vfs_get_view_stats(v, &vs);
		ckpt_info("view cache: %" PRIu64 " views built, %" PRIu64
			  " dropped for newer ones, %" PRIu64 " kept",
			  vs.builds, vs.evictions, vs.views);
	}
}

int main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts cmd;
	struct ckptfs_opts o;
	struct fuse_ops_data data;
	struct vfs_config vc;
	struct fuse_session *se = NULL;
	struct fuse_loop_config *lcfg = NULL;
	ckpt_store *store = NULL;
	ckpt_pool *pool = NULL;
	ckpt_readahead *ra = NULL;
	ckpt_tp_rules *rules = NULL;
	struct vfs *v = NULL;
	char err[512];
	int64_t start_ns = ckpt_mono_ns();
	bool mounted = false, opstats = false;
	int ret = 1, r;

	/* Chunk and request buffers are 128 KiB..4 MiB: by default glibc serves
	 * them with fresh mmap()s, and every page of every buffer is faulted in
	 * and zeroed again.  Keep them on the heap and reuse them. */
	mallopt(M_MMAP_THRESHOLD, 8 << 20);
	mallopt(M_TRIM_THRESHOLD, 32 << 20);
	/* Everything the daemon creates on the host (the store's files, its
	 * log) is its owner's only: the store holds every user's data and the
	 * chunk hash secret (docs/threat-model.md).  Files in the mount are
	 * created with the modes their callers ask for. */
	umask(077);
	r = options_parse(&args, &cmd, &o);
	if (r != 0) {
		ret = r > 0 ? 0 : 1;
		goto out;
	}
	if (log_setup(&o) < 0)
		goto out;
	r = ckpt_tp_rules_new(o.tp_rules, &rules, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "ckptfs: tp_rules: %s\n", err);
		goto out;
	}
	if (!cmd.foreground && detach() < 0) {
		fprintf(stderr, "ckptfs: cannot detach: %s\n", strerror(errno));
		goto out;
	}
	/* umount returns before the daemon it stopped has let go of the store: a mount right
	 * after one (a script, mount -a, systemctl restart) gives that daemon up to 3 seconds,
	 * as ckpt does, before calling the store busy. */
	for (int tries = 0;; tries++) {
		r = ckpt_store_open(o.store, &o.sopts, &store, err, sizeof(err));
		if (r != -EBUSY || tries >= 30)
			break;
		usleep(100 * 1000);
	}
	if (r < 0) {
		report("ckptfs: %s\n", err);
		goto out;
	}
	r = ckpt_store_metrics_register(store);
	if (r == 0)
		r = opstats_init();
	if (r < 0) {
		report("ckptfs: cannot set up metrics: %s\n", strerror(-r));
		goto out;
	}
	opstats = true;
	r = ckpt_pool_new(o.workers, &pool);
	if (r < 0) {
		report("ckptfs: cannot start workers: %s\n", strerror(-r));
		goto out;
	}
	memset(&vc, 0, sizeof(vc));
	/* read-ahead loads into the chunk cache: pointless without one */
	if (o.ra_workers != 0 && o.sopts.cache_size > 0) {
		struct ckpt_cache_stats cs;

		ckpt_store_cache_stats(store, &cs);
		vc.stream_cap = cs.stream_cap;
		r = ckpt_readahead_new(store, o.ra_workers == UINT_MAX ? 0 : o.ra_workers, 256, &ra);
		if (r < 0) {
			report("ckptfs: cannot start read-ahead workers: %s\n", strerror(-r));
			goto out;
		}
	}
	vc.store = store;
	vc.pool = pool;
	vc.ra = ra;
	vc.rules = rules;
	vc.view_cache = o.view_cache;
	ckpt_view_cache_set_budget((size_t)o.view_mem);
	vc.drop_behind = o.drop_behind;
	vc.direct_granted = wire_granted;
	r = vfs_new(&vc, &v);
	if (r < 0) {
		report("ckptfs: cannot set up the file system: %s\n", strerror(-r));
		goto out;
	}
	data.vfs = v;
	data.direct_read = o.direct_read;
	data.direct_read_given = o.direct_read_given;
	data.writeback_cache = o.writeback_cache;
	se = fuse_session_new(&args, fuse_ops_table(), sizeof(struct fuse_lowlevel_ops), &data);
	if (!se) {
		report("ckptfs: cannot create FUSE session (bad -o option?)\n");
		goto out;
	}
	if (fuse_set_signal_handlers(se) != 0 || install_sighup() != 0) {
		report("ckptfs: cannot install signal handlers\n");
		goto out;
	}
	vfs_start_inval(v, fuse_ops_inval, se);
	if (fuse_session_mount(se, cmd.mountpoint) != 0) {
		report("ckptfs: cannot mount %s (see messages above)\n", cmd.mountpoint);
		goto out_signals;
	}
	if (wire_install(se) != 0) {
		report("ckptfs: cannot hook the FUSE channel of %s\n", cmd.mountpoint);
		goto out_unmount;
	}
	if (!cmd.foreground)
		detach_done(&o);
	mounted = true;
	log_mount(&o, cmd.mountpoint);
	if (o.readahead_kb)
		start_raise_readahead(cmd.mountpoint, o.readahead_kb); /* releases the parent */
	else
		detach_release();
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
out_unmount:
	fuse_session_unmount(se);
out_signals:
	vfs_stop_inval(v);
	fuse_remove_signal_handlers(se);
out:
	if (se)
		fuse_session_destroy(se);
	fuse_loop_cfg_destroy(lcfg);
	if (store && mounted) {
		/* closed files reach the index before the summary counts them */
		if (ckpt_store_flush(store) < 0)
			ckpt_err("%s: cannot commit closed files to the index at unmount", o.store);
		log_unmount(store, o.store, cmd.mountpoint, start_ns);
	}
	if (store)
		log_stats(store, ra, v);
	ckpt_readahead_free(ra);
	ckpt_pool_free(pool);
	vfs_free(v);
	if (store)
		ckpt_view_forget_store(store);
	ckpt_store_free(store);
	if (opstats)
		opstats_free();
	ckpt_tp_rules_free(rules);
	options_free(&o);
	free(cmd.mountpoint);
	fuse_opt_free_args(&args);
	return ret;
}
