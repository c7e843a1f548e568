/* SPDX-License-Identifier: MIT */
/*
 * repair.c - ckpt_store_repair (store.h), its first step: which index the
 * store keeps.  The metadata log is restored into a new index beside the
 * one in place (STORE/index.rebuild), the index in place is opened
 * read-only and read whole, key by key against the restored one, and the
 * two are weighed (docs/design.md section 15):
 *
 *   index in place          restored log          kept
 *   cannot be read          found                 the restored one
 *   cannot be read          none usable           the old one, salvaged by
 *                                                 the engine (RocksDB RepairDB)
 *   reads whole, behind     found, ahead          the restored one (the
 *   its log                                       index's own WAL lost commits)
 *   reads whole, otherwise  any                   the index in place
 *
 * A replaced index is kept as STORE/index.damaged.N.  The second step
 * (repair_ns.c) then checks and fixes the kept index on the opened store.
 */
#include "store/store_int.h"

#include <stdarg.h>

#define REBUILD_DIR ST_INDEX_DIR ".rebuild"
#define DAMAGED_DIR ST_INDEX_DIR ".damaged"

static void note(ckpt_repair_fn cb, void *ud, enum ckpt_repair_kind kind, const char *path,
		 const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void note(ckpt_repair_fn cb, void *ud, enum ckpt_repair_kind kind, const char *path,
		 const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (cb)
		cb(ud, kind, path, msg);
}

/* Remove directory name in dfd and the files in it (engine directories are
 * flat). */
static int remove_flat_dir(int dfd, const char *name)
{
	int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct dirent *de;
	DIR *d;

	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			unlinkat(fd, de->d_name, 0);
	closedir(d);
	return unlinkat(dfd, name, AT_REMOVEDIR) < 0 ? -errno : 0;
}

/* Copy the regular files of directory from into a new directory to. */
static int copy_flat_dir(int dfd, const char *from, const char *to)
{
	int sfd = openat(dfd, from, O_RDONLY | O_DIRECTORY | O_CLOEXEC), tfd = -1, r = 0;
	struct dirent *de;
	DIR *d = NULL;
	char *buf = malloc(1u << 20);

	if (sfd < 0 || !buf) {
		r = sfd < 0 ? -errno : -ENOMEM;
		goto out;
	}
	if (mkdirat(dfd, to, 0755) < 0 ||
	    (tfd = openat(dfd, to, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		r = -errno;
		goto out;
	}
	d = fdopendir(sfd);
	if (!d) {
		r = -errno;
		goto out;
	}
	sfd = -1;
	while (r == 0 && (de = readdir(d))) {
		struct stat st;
		uint64_t off = 0;
		int in, outf;
		ssize_t n;

		if (fstatat(dirfd(d), de->d_name, &st, 0) < 0 || !S_ISREG(st.st_mode) ||
		    !strcmp(de->d_name, "LOCK"))
			continue;
		in = openat(dirfd(d), de->d_name, O_RDONLY | O_CLOEXEC);
		outf = openat(tfd, de->d_name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (in < 0 || outf < 0)
			r = -errno;
		while (r == 0 && (n = pread(in, buf, 1u << 20, (off_t)off)) != 0) {
			if (n < 0 && errno == EINTR)
				continue;
			r = n < 0 ? -errno : ckpt_pwrite_full(outf, buf, (size_t)n, off);
			off += n > 0 ? (uint64_t)n : 0;
		}
		if (r == 0 && fsync(outf) < 0)
			r = -errno;
		if (in >= 0)
			close(in);
		if (outf >= 0)
			close(outf);
	}
	if (r == 0 && fsync(tfd) < 0)
		r = -errno;
out:
	if (d)
		closedir(d);
	if (sfd >= 0)
		close(sfd);
	if (tfd >= 0)
		close(tfd);
	free(buf);
	return r;
}

/* ---- the index in place ---- */

struct verdict {
	bool opened, read_whole;
	bool marked;      /* it records which logged commit it held at its last open */
	uint64_t mark;    /* which */
	uint64_t stamp;   /* its stamp now */
	bool located;     /* the restore found which logged commit it holds */
	uint64_t pos;     /* which */
	uint64_t only_live, only_log, differ;
	char why[512];    /* why it is damaged */
};

static int read_mark(ckpt_engine *e, struct verdict *v)
{
	uint8_t b[8];
	int r = ckpt_engine_get_fixed(e, CKPT_ENGINE_MARK_KEY, CKPT_ENGINE_MARK_KEY_LEN, b, 8);

	if (r == -ENOENT)
		return 0;
	if (r < 0)
		return r;
	v->marked = true;
	v->mark = ckpt_get_le64(b);
	return 0;
}

/* ---- restoring the metadata log into a new engine ---- */

struct rebuild {
	ckpt_engine *e;
	ckpt_txn *t;
	size_t ops, bytes;
	struct verdict *live; /* NULL: the index in place could not be opened */
	bool after_any;       /* a commit after live->mark was seen */
	uint64_t after_first; /* the stamp of the first one */
};

static int rb_commit(struct rebuild *b)
{
	int r = 0;

	if (b->t)
		r = ckpt_txn_commit(b->t, false);
	b->t = NULL;
	b->ops = b->bytes = 0;
	return r;
}

static int rb_txn(struct rebuild *b, size_t bytes)
{
	if (b->t && (b->ops >= 4096 || b->bytes >= (16u << 20))) {
		int r = rb_commit(b);
		if (r < 0)
			return r;
	}
	b->ops++;
	b->bytes += bytes;
	return b->t ? 0 : ckpt_txn_begin(b->e, &b->t);
}

static int rb_put(void *ud, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl)
{
	struct rebuild *b = ud;
	int r = rb_txn(b, kl + vl);

	return r < 0 ? r : ckpt_txn_put(b->t, k, kl, v, vl);
}

static int rb_del(void *ud, const uint8_t *k, size_t kl)
{
	struct rebuild *b = ud;
	int r = rb_txn(b, kl);

	return r < 0 ? r : ckpt_txn_delete(b->t, k, kl);
}

/* After each logged commit: is it the one the index in place holds
 * (ckpt_mlog_locate's rule, on the commits after the index's mark)? */
static int rb_mark(void *ud, uint64_t number, uint64_t stamp)
{
	struct rebuild *b = ud;
	struct verdict *v = b->live;

	if (!v || !v->marked || number <= v->mark || stamp == 0)
		return 0;
	if (!b->after_any)
		b->after_first = stamp;
	b->after_any = true;
	if (stamp == v->stamp) {
		v->located = true;
		v->pos = number;
	}
	return 0;
}

static int open_engine(const char *engine, const char *dir, bool create, bool read_only,
		       ckpt_engine **ret, char *err, size_t errlen)
{
	struct ckpt_engine_opts eo = {
		.create = create,
		.read_only = read_only,
		.cache_bytes = 16u << 20,
	};

	return ckpt_engine_open(engine, dir, &eo, ret, err, errlen);
}

/* Restore STORE/metalog into a new engine in STORE/index.rebuild; note in
 * *live (NULL: not opened) which logged commit the index in place holds. */
static int restore_log(const char *path, int dfd, const char *engine, struct verdict *live,
		       ckpt_repair_fn cb, void *ud, struct ckpt_mlog_report *rep, char *err,
		       size_t errlen)
{
	static const struct ckpt_mlog_sink sink = { rb_put, rb_del, rb_mark };
	struct rebuild b = { .live = live };
	char *dir = NULL, *logdir = NULL;
	int r;

	memset(rep, 0, sizeof(*rep));
	r = remove_flat_dir(dfd, REBUILD_DIR); /* an earlier repair's leftover */
	if (r < 0) {
		ckpt_errf(err, errlen, "%s/%s: cannot remove: %s", path, REBUILD_DIR, strerror(-r));
		return r;
	}
	if (asprintf(&dir, "%s/%s", path, REBUILD_DIR) < 0 ||
	    asprintf(&logdir, "%s/%s", path, ST_METALOG_DIR) < 0) {
		r = -ENOMEM;
		goto out;
	}
	r = open_engine(engine, dir, true, false, &b.e, err, errlen);
	if (r < 0)
		goto out;
	r = ckpt_mlog_restore(logdir, &sink, &b, rep);
	if (r == -ENOENT) {
		snprintf(rep->problem, sizeof(rep->problem), "%s: missing", logdir);
		r = 0;
	}
	if (r == 0 && live && live->marked && !live->located &&
	    (!b.after_any || live->stamp < b.after_first) && live->mark <= rep->last) {
		live->located = true; /* it holds none of the commits after its mark */
		live->pos = live->mark;
	}
	if (r == 0 && rep->found) {
		/* the rebuilt index holds the log's last commit */
		uint8_t v[8];
		ckpt_put_le64(v, rep->last);
		r = rb_put(&b, (const uint8_t *)CKPT_ENGINE_MARK_KEY, CKPT_ENGINE_MARK_KEY_LEN, v,
			   sizeof(v));
	}
	if (r == 0)
		r = rb_commit(&b);
	else
		ckpt_txn_abort(b.t);
	if (r == 0)
		r = ckpt_engine_flush(b.e);
	if (r < 0)
		ckpt_errf(err, errlen, "%s: cannot restore the metadata log into %s: %s", path, dir,
			  strerror(-r));
	if (r == 0 && rep->found)
		note(cb, ud, CKPT_REPAIR_NOTE, NULL,
		     "metadata log: snapshot %" PRIu64 " (%" PRIu64 " records) and %" PRIu64
		     " commits after it restored, to commit %" PRIu64 "%s%s",
		     rep->snap_base, rep->records, rep->commits, rep->last,
		     rep->complete ? ", intact" : "; damaged: ",
		     rep->complete ? "" : rep->problem);
	else if (r == 0)
		note(cb, ud, CKPT_REPAIR_NOTE, NULL, "metadata log: nothing to restore (%s)",
		     rep->problem);
out:
	ckpt_engine_close(b.e);
	free(dir);
	free(logdir);
	return r;
}

/* ---- the index in place against the restored one ---- */

static bool is_mark(const uint8_t *k, size_t kl)
{
	return kl == CKPT_ENGINE_MARK_KEY_LEN && !memcmp(k, CKPT_ENGINE_MARK_KEY, kl);
}

/* Read the index in place whole, comparing every key (but the engine's own
 * mark) with the restored index (log: NULL when nothing was restored). */
static int compare(ckpt_engine *live, ckpt_engine *log, struct verdict *v)
{
	ckpt_scan *a = NULL, *b = NULL;
	const uint8_t *ak = NULL, *av = NULL, *bk = NULL, *bv = NULL;
	size_t akl = 0, avl = 0, bkl = 0, bvl = 0;
	int ra, rb = 0, r;

	r = ckpt_scan_new(live, NULL, "", 0, NULL, 0, &a);
	if (r == 0 && log)
		r = ckpt_scan_new(log, NULL, "", 0, NULL, 0, &b);
	if (r < 0)
		goto out;
	ra = ckpt_scan_next(a, &ak, &akl, &av, &avl);
	if (b)
		rb = ckpt_scan_next(b, &bk, &bkl, &bv, &bvl);
	while (ra > 0 || rb > 0) {
		int c;

		if (ra > 0 && is_mark(ak, akl)) {
			ra = ckpt_scan_next(a, &ak, &akl, &av, &avl);
			continue;
		}
		if (rb > 0 && is_mark(bk, bkl)) {
			rb = ckpt_scan_next(b, &bk, &bkl, &bv, &bvl);
			continue;
		}
		if (ra > 0 && rb > 0) {
			c = memcmp(ak, bk, akl < bkl ? akl : bkl);
			if (c == 0)
				c = akl < bkl ? -1 : akl > bkl;
		} else {
			c = ra > 0 ? -1 : 1;
		}
		if (c < 0) {
			v->only_live++;
			ra = ckpt_scan_next(a, &ak, &akl, &av, &avl);
		} else if (c > 0) {
			v->only_log++;
			rb = ckpt_scan_next(b, &bk, &bkl, &bv, &bvl);
		} else {
			if (avl != bvl || memcmp(av, bv, avl) != 0)
				v->differ++;
			ra = ckpt_scan_next(a, &ak, &akl, &av, &avl);
			rb = ckpt_scan_next(b, &bk, &bkl, &bv, &bvl);
		}
		if (ra < 0 || rb < 0)
			break;
	}
	if (ra < 0) {
		snprintf(v->why, sizeof(v->why), "cannot be read whole: %s", strerror(-ra));
	} else if (rb < 0) {
		r = rb; /* the new one: not damage, a failure */
	} else {
		v->read_whole = true;
	}
out:
	ckpt_scan_free(a);
	ckpt_scan_free(b);
	return r;
}

/* Move the index in place aside as index.damaged.N and put the rebuilt one
 * in its place. */
static int swap_in(const char *path, int dfd, const char *from, char *kept, size_t keptlen,
		   char *err, size_t errlen)
{
	char name[64];
	int r = 0;

	for (unsigned n = 1;; n++) {
		snprintf(name, sizeof(name), "%s.%u", DAMAGED_DIR, n);
		if (renameat2(dfd, ST_INDEX_DIR, dfd, name, RENAME_NOREPLACE) == 0)
			break;
		if (errno == ENOENT)
			break; /* no index in place at all */
		if (errno != EEXIST || n >= 1000) {
			r = -errno;
			ckpt_errf(err, errlen, "%s: cannot move the damaged index aside: %s", path,
				  strerror(errno));
			return r;
		}
	}
	if (renameat(dfd, from, dfd, ST_INDEX_DIR) < 0 || fsync(dfd) < 0) {
		r = -errno;
		ckpt_errf(err, errlen, "%s: cannot put the rebuilt index in place: %s", path,
			  strerror(errno));
		return r;
	}
	snprintf(kept, keptlen, "%s/%s", path, name);
	return 0;
}

/* Step 1: which index the store keeps (the table at the top). */
static int repair_index(const char *path, int dfd, const char *engine, ckpt_repair_fn cb,
			void *ud, struct ckpt_repair_stats *st, char *err, size_t errlen)
{
	struct ckpt_mlog_report rep;
	struct verdict v = { 0 };
	ckpt_engine *live = NULL, *log = NULL;
	char *ixdir = NULL, *rbdir = NULL, kept[PATH_MAX + 64], oerr[512] = "";
	bool use_log = false, salvage = false;
	int r;

	if (asprintf(&ixdir, "%s/%s", path, ST_INDEX_DIR) < 0 ||
	    asprintf(&rbdir, "%s/%s", path, REBUILD_DIR) < 0) {
		r = -ENOMEM;
		goto out;
	}
	if (open_engine(engine, ixdir, false, true, &live, oerr, sizeof(oerr)) == 0) {
		v.opened = true;
		v.stamp = ckpt_engine_find(engine ? engine : CKPT_ENGINE_DEFAULT)->stamp(live);
		r = read_mark(live, &v);
		if (r < 0) {
			snprintf(v.why, sizeof(v.why), "cannot be read whole: %s", strerror(-r));
			v.opened = false;
		}
	} else {
		snprintf(v.why, sizeof(v.why), "cannot be opened: %s", oerr);
	}
	r = restore_log(path, dfd, engine, v.opened ? &v : NULL, cb, ud, &rep, err, errlen);
	if (r < 0)
		goto out;
	st->log_damaged = !rep.found || !rep.complete;
	st->log_last = rep.last;
	if (rep.found) {
		r = open_engine(engine, rbdir, false, true, &log, err, errlen);
		if (r < 0)
			goto out;
	}
	if (v.opened) {
		r = compare(live, log, &v);
		if (r < 0) {
			ckpt_errf(err, errlen, "%s: cannot read the restored index: %s", path,
				  strerror(-r));
			goto out;
		}
	}
	ckpt_engine_close(live);
	ckpt_engine_close(log);
	live = log = NULL;

	st->index_damaged = !v.read_whole;
	if (!v.read_whole) {
		note(cb, ud, CKPT_REPAIR_NOTE, NULL, "index: damaged: %s", v.why);
		if (rep.found)
			use_log = true;
		else
			salvage = true;
	} else if (!rep.found) {
		note(cb, ud, CKPT_REPAIR_NOTE, NULL,
		     "index: read whole; no metadata log to compare it with");
	} else if (v.only_live + v.only_log + v.differ == 0) {
		note(cb, ud, CKPT_REPAIR_NOTE, NULL,
		     "index: read whole, the same as its metadata log (commit %" PRIu64 ")",
		     rep.last);
	} else if (v.located && v.pos < rep.last) {
		note(cb, ud, CKPT_REPAIR_NOTE, NULL,
		     "index: read whole but at commit %" PRIu64 ", behind its metadata log (%"
		     PRIu64 "): the index lost commits its log holds", v.pos, rep.last);
		use_log = true;
	} else {
		st->differences = v.only_live + v.only_log + v.differ;
		note(cb, ud, CKPT_REPAIR_NOTE, NULL,
		     "index: read whole%s; its metadata log (commit %" PRIu64 ") differs in %"
		     PRIu64 " keys (%" PRIu64 " only in the index, %" PRIu64 " only in the log, %"
		     PRIu64 " with other values): the index is kept and the log is started "
		     "again from it",
		     v.located ? "" : ", with writes the log does not hold", rep.last,
		     st->differences, v.only_live, v.only_log, v.differ);
		st->log_damaged = true;
	}

	if (salvage) {
		const struct ckpt_engine_ops *ops =
			ckpt_engine_find(engine ? engine : CKPT_ENGINE_DEFAULT);

		r = remove_flat_dir(dfd, REBUILD_DIR);
		if (r == 0)
			r = copy_flat_dir(dfd, ST_INDEX_DIR, REBUILD_DIR);
		if (r < 0) {
			ckpt_errf(err, errlen, "%s: cannot copy the damaged index to %s: %s", path,
				  rbdir, strerror(-r));
			goto out;
		}
		if (!ops || !ops->salvage) {
			r = -EOPNOTSUPP;
			ckpt_errf(err, errlen, "%s: the index is damaged, there is no metadata log "
				  "to restore it from, and the %s engine cannot salvage it", path,
				  engine ? engine : CKPT_ENGINE_DEFAULT);
			goto out;
		}
		r = ops->salvage(rbdir, err, errlen);
		if (r < 0)
			goto out;
		note(cb, ud, CKPT_REPAIR_NOTE, NULL,
		     "index: no intact copy in a metadata log: salvaged what the engine could read "
		     "(every record is checked next)");
		st->salvaged = true;
		use_log = true; /* the salvaged copy takes the place of the old one */
	}
	if (use_log) {
		r = swap_in(path, dfd, REBUILD_DIR, kept, sizeof(kept), err, errlen);
		if (r < 0)
			goto out;
		st->index_replaced = true;
		if (!salvage)
			note(cb, ud, CKPT_REPAIR_FIXED, NULL,
			     "index: rebuilt from the metadata log (commit %" PRIu64
			     "); the old one is kept as %s", rep.last, kept);
		else
			note(cb, ud, CKPT_REPAIR_FIXED, NULL,
			     "index: replaced by the salvaged copy; the old one is kept as %s",
			     kept);
	} else {
		r = remove_flat_dir(dfd, REBUILD_DIR);
		if (r < 0)
			ckpt_warn("%s/%s: cannot remove: %s", path, REBUILD_DIR, strerror(-r));
		r = 0;
	}
out:
	ckpt_engine_close(live);
	ckpt_engine_close(log);
	free(ixdir);
	free(rbdir);
	return r;
}

int ckpt_store_repair(const char *path, ckpt_repair_fn cb, void *ud,
		      struct ckpt_repair_stats *ret, char *err, size_t errlen)
{
	struct ckpt_store_opts o;
	ckpt_store *s = NULL;
	int dfd, lock_fd = -1, r;

	memset(ret, 0, sizeof(*ret));
	err[0] = '\0';
	dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		r = -errno;
		ckpt_errf(err, errlen, "%s: %s", path,
			  errno == ENOENT ? "no such store (directory does not exist)" :
					    strerror(errno));
		return r;
	}
	r = st_read_marker(dfd, path, err, errlen);
	if (r < 0) {
		if (!err[0])
			ckpt_errf(err, errlen, "%s: cannot read store marker: %s", path,
				  strerror(-r));
		goto out;
	}
	lock_fd = openat(dfd, "lock", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (lock_fd < 0 || flock(lock_fd, LOCK_EX | LOCK_NB) < 0) {
		r = errno == EWOULDBLOCK ? -EBUSY : -errno;
		ckpt_errf(err, errlen, "%s: %s", path,
			  r == -EBUSY ? "store is in use (mounted, or a ckpt command is running)" :
					strerror(-r));
		goto out;
	}
	ckpt_store_opts_init(&o);
	r = repair_index(path, dfd, o.meta_engine, cb, ud, ret, err, errlen);
	if (r < 0)
		goto out;

	/* step 2 on the kept index, opened as gc opens it (orphans reaped) */
	o.mode = CKPT_STORE_RW;
	o.cache_size = 0;
	o.bg = CKPT_BG_OFF;
	r = st_open(path, &o, lock_fd, &s, err, errlen);
	lock_fd = -1; /* the store's now, or closed */
	if (r < 0)
		goto out;
	r = st_repair_check(s, cb, ud, ret);
	if (r < 0) {
		ckpt_errf(err, errlen, "%s: cannot check the index: %s", path, strerror(-r));
		goto out;
	}
	r = ckpt_engine_flush(s->eng);
	if (r == 0)
		r = ckpt_engine_backup(s->eng);
	if (r < 0) {
		ckpt_errf(err, errlen, "%s: cannot take a snapshot of the repaired index into %s/%s: "
			  "%s", path, path, ST_METALOG_DIR, strerror(-r));
		goto out;
	}
	note(cb, ud, CKPT_REPAIR_NOTE, NULL, "metadata log: new snapshot of the repaired index");
out:
	ckpt_store_free(s);
	if (lock_fd >= 0)
		close(lock_fd);
	close(dfd);
	return r;
}
