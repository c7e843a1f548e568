/* save.c: the saver (ckptfs_saver_*, ckptfs_save_*): back-pressure, the snapshot into the
 * pool, and the background writers that write the files, leave the done marker and (rank 0)
 * complete the checkpoint.
 *
 * Threads: the caller's thread runs ckptfs_save_async() and the queries; io_threads writer
 * threads take the files of the save in flight one at a time and write each whole file from
 * its image in the pool; the writer that finds every file finished finishes the save (the
 * directory fsync, the done marker, the commit or the wait for it).  Only one save is in
 * flight: the next one waits or fails before touching the pool (back-pressure), so the
 * writers' source bytes never change under them.
 *
 * Fork: a forked child has none of the saver's threads, and the saver's locks may have been
 * held by them at the fork.  A saver therefore serves only the process that made it (pid):
 * in a child every call returns at once without taking a lock (-ECHILD, or "done"), and
 * ckptfs_saver_free() forgets the saver without joining or freeing anything, so a child that
 * runs its exit handlers (a trainer's atexit) never hangs on the parent's save.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "trainer/commit.h"
#include "trainer/copy.h"
#include "trainer/plan.h"
#include "trainer/pool.h"
#include "trainer/stwrite.h"
#include "trainer/trainer_int.h"

/* One save, from the end of its snapshot to its completion. */
struct tr_job {
	struct tr_ckpt ck;
	struct tr_plan *plan;     /* names, sizes and pool offsets of the files */
	int wait_commit;
	/* Under the saver's lock: */
	size_t next;              /* next file to hand to a writer */
	size_t n_done;            /* files finished (written or skipped after an error) */
	int finishing;            /* a writer has taken the finish */
	int err;                  /* first failure, its message in msg */
	char msg[TR_MSG_MAX];
	/* Timings (ns, monotonic). */
	uint64_t snapshot_ns, t_write0, t_durable, t_complete;
};

#define WRITE_BYTES_MAX ((size_t)1 << 30)

struct ckptfs_saver {
	pid_t pid;                  /* the process that made it (see Fork above); constant */
	struct ckptfs_saver_opts opts;
	struct tr_pool *pool;
	struct tr_copier *copier;   /* the caller's thread only */
	struct tr_errbuf err;
	pthread_t *writers;
	int n_writers;
	pthread_mutex_t lock;       /* protects what follows */
	pthread_cond_t work;        /* a job was queued, or stop */
	pthread_cond_t idle;        /* busy went to 0 */
	struct tr_job *job;         /* the last save (in flight while busy) */
	struct tr_plan *prev_plan;  /* the caller's thread only: a plan that may be reused */
	int busy;
	int stop;
	int write_delay_ms;         /* test hook */
	int have_stats;
	struct ckptfs_save_stats stats;
};

/* Whether s was made by another process (the caller is a forked child). */
static int foreign(const struct ckptfs_saver *s)
{
	return s->pid != getpid();
}

#define FOREIGN_MSG "a saver serves only the process that made it (this is a forked child)"

static size_t phys_half(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), pg = sysconf(_SC_PAGESIZE);

	if (pages <= 0 || pg <= 0)
		return (size_t)1 << 30;
	return (size_t)pages * (size_t)pg / 2;
}

TR_EXPORT void ckptfs_saver_opts_init(struct ckptfs_saver_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->pool_bytes = phys_half();
	o->io_threads = 2;
	o->backpressure = CKPTFS_BP_WAIT;
	o->write_bytes = (size_t)8 << 20;
	o->commit_timeout_ms = 600000;
	o->wait_commit = 1;
}

static void job_free(struct tr_job *j)
{
	if (!j)
		return;
	tr_ckpt_release(&j->ck);
	tr_plan_free(j->plan);
	free(j);
}

/* Host copy threads of a snapshot: CKPTFS_COPY_THREADS, else a share of the CPUs (ranks of
 * one machine snapshot at once, and memory bandwidth, not cores, bounds a copy). */
static int copy_threads(void)
{
	const char *e = getenv("CKPTFS_COPY_THREADS");
	long n;

	if (e && *e) {
		n = strtol(e, NULL, 10);
		return n < 1 ? 1 : n > 64 ? 64 : (int)n;
	}
	n = sysconf(_SC_NPROCESSORS_ONLN);
	n = n / 4;
	return n < 1 ? 1 : n > 4 ? 4 : (int)n;
}

static void set_job_err(struct tr_job *j, int err, const char *msg)
{
	if (j->err)
		return;
	j->err = err;
	snprintf(j->msg, sizeof(j->msg), "%s", msg);
}

/* The end of a save, on a writer thread, without the lock. */
static void finish_job(struct ckptfs_saver *s, struct tr_job *j)
{
	char msg[TR_MSG_MAX] = "";
	int ret = j->err;

	if (ret == 0)
		ret = tr_fsync_dir(j->ck.dirfd, j->ck.partial, msg, sizeof(msg));
	if (ret == 0 && j->ck.rank != 0)
		ret = tr_done_marker_write(&j->ck, msg, sizeof(msg));
	j->t_durable = tr_now_ns();
	if (ret == 0 && j->ck.rank == 0)
		ret = tr_commit(&j->ck, msg, sizeof(msg));
	else if (ret == 0 && j->wait_commit)
		ret = tr_wait_complete(&j->ck, msg, sizeof(msg));
	j->t_complete = tr_now_ns();
	pthread_mutex_lock(&s->lock);
	if (ret < 0)
		set_job_err(j, ret, msg);
	/* Tell the other ranks at once (best effort; they time out otherwise).  err and msg are
	 * final here: no other thread touches this job any more. */
	if (j->err) {
		pthread_mutex_unlock(&s->lock);
		(void)tr_failed_marker_write(&j->ck, j->err, j->msg);
		pthread_mutex_lock(&s->lock);
	}
	if (j->err) {
		tr_errbuf_set(&s->err, j->err, "%s", j->msg);
	} else {
		s->stats.snapshot_ns = j->snapshot_ns;
		s->stats.write_ns = j->t_durable - j->t_write0;
		s->stats.commit_ns = j->t_complete - j->t_durable;
		s->stats.bytes = j->plan->bytes;
		s->have_stats = 1;
	}
	/* The directory is no longer needed by this save. */
	if (j->ck.dirfd >= 0) {
		close(j->ck.dirfd);
		j->ck.dirfd = -1;
	}
	s->busy = 0;
	pthread_cond_broadcast(&s->idle);
	pthread_mutex_unlock(&s->lock);
}

static void *writer_main(void *arg)
{
	struct ckptfs_saver *s = arg;

	pthread_mutex_lock(&s->lock);
	for (;;) {
		struct tr_job *j = s->job;

		if (s->stop)
			break;
		if (s->busy && j && j->next < j->plan->n_outs) {
			struct tr_out *o = &j->plan->outs[j->next++];
			int delay = s->write_delay_ms, ret = 0;
			char msg[TR_MSG_MAX], tmp[300];

			if (j->t_write0 == 0)
				j->t_write0 = tr_now_ns();
			if (!j->err) {
				pthread_mutex_unlock(&s->lock);
				if (delay > 0) {
					struct timespec ts = { delay / 1000, (long)(delay % 1000) * 1000000L };

					nanosleep(&ts, NULL);
				}
				snprintf(tmp, sizeof(tmp), ".tmp-r%05d-%s", j->ck.rank, o->name);
				ret = tr_write_file(j->ck.dirfd, j->ck.partial, o->name, tmp,
						    tr_pool_base(s->pool) + o->pool_off, o->size,
						    s->opts.write_bytes, msg, sizeof(msg));
				pthread_mutex_lock(&s->lock);
				if (ret < 0)
					set_job_err(j, ret, msg);
			}
			j->n_done++;
			continue;
		}
		if (s->busy && j && j->n_done == j->plan->n_outs && !j->finishing) {
			j->finishing = 1;
			if (j->t_write0 == 0)
				j->t_write0 = tr_now_ns();
			pthread_mutex_unlock(&s->lock);
			finish_job(s, j);
			pthread_mutex_lock(&s->lock);
			continue;
		}
		pthread_cond_wait(&s->work, &s->lock);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

TR_EXPORT int ckptfs_saver_new(const struct ckptfs_saver_opts *opts, struct ckptfs_saver **ret)
{
	struct ckptfs_saver *s;
	int r = -ENOMEM;

	if (!ret)
		return -EINVAL;
	*ret = NULL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->pid = getpid();
	ckptfs_saver_opts_init(&s->opts);
	if (opts) {
		s->opts = *opts;
		if (!s->opts.pool_bytes)
			s->opts.pool_bytes = phys_half();
		if (s->opts.io_threads <= 0)
			s->opts.io_threads = 2;
		if (!s->opts.write_bytes)
			s->opts.write_bytes = (size_t)8 << 20;
		if (s->opts.commit_timeout_ms <= 0)
			s->opts.commit_timeout_ms = 600000;
	}
	/* At most 1 GiB per write (Linux moves at most 2 GiB - 4 KiB per call anyway), which also
	 * keeps the rounding from wrapping to 0 for a huge value. */
	if (s->opts.write_bytes > WRITE_BYTES_MAX)
		s->opts.write_bytes = WRITE_BYTES_MAX;
	s->opts.write_bytes = (s->opts.write_bytes + 4095) / 4096 * 4096;
	if (s->opts.backpressure != CKPTFS_BP_WAIT && s->opts.backpressure != CKPTFS_BP_FAIL) {
		free(s);
		return -EINVAL;
	}
	if (s->opts.io_threads > 256)
		s->opts.io_threads = 256;
	tr_errbuf_init(&s->err);
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->work, NULL);
	{
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&s->idle, &ca);
		pthread_condattr_destroy(&ca);
	}
	r = tr_pool_new(s->opts.pool_bytes, &s->pool);
	if (r < 0)
		goto out;
	r = tr_copier_new(copy_threads(), &s->copier);
	if (r < 0)
		goto out;
	s->writers = calloc((size_t)s->opts.io_threads, sizeof(*s->writers));
	if (!s->writers) {
		r = -ENOMEM;
		goto out;
	}
	for (; s->n_writers < s->opts.io_threads; s->n_writers++) {
		int e = tr_thread_start(&s->writers[s->n_writers], writer_main, s);

		if (e) {
			r = -e;
			goto out;
		}
	}
	*ret = s;
	r = 0;
out:
	if (r < 0)
		ckptfs_saver_free(s);
	return r;
}

TR_EXPORT void ckptfs_saver_free(struct ckptfs_saver *s)
{
	if (!s || foreign(s))
		return;
	pthread_mutex_lock(&s->lock);
	while (s->busy)
		pthread_cond_wait(&s->idle, &s->lock);
	s->stop = 1;
	pthread_cond_broadcast(&s->work);
	pthread_mutex_unlock(&s->lock);
	for (int i = 0; i < s->n_writers; i++)
		pthread_join(s->writers[i], NULL);
	job_free(s->job);
	tr_plan_free(s->prev_plan);
	tr_copier_free(s->copier);
	tr_pool_free(s->pool);
	free(s->writers);
	pthread_cond_destroy(&s->work);
	pthread_cond_destroy(&s->idle);
	pthread_mutex_destroy(&s->lock);
	tr_errbuf_destroy(&s->err);
	free(s);
}

static int fail(struct ckptfs_saver *s, int err, const char *msg)
{
	return tr_errbuf_set(&s->err, err, "%s", msg);
}

/* Copies every image into the pool; returns when the copies have landed. */
static int snapshot(struct ckptfs_saver *s, const struct ckptfs_save_args *a,
		    struct tr_plan *p, char *msg, size_t len)
{
	char *base = tr_pool_base(s->pool);
	const char **what = NULL;
	size_t n = 0, cap = 0;
	long failed = -1;
	int ret = 0;

	for (size_t k = 0; k < p->n_outs; k++)
		cap += p->outs[k].blob ? 1 : p->outs[k].n_items;
	what = calloc(cap + 1, sizeof(*what));
	if (!what) {
		tr_fmt(msg, len, "%s: out of memory", a->path);
		return -ENOMEM;
	}
	for (size_t k = 0; k < p->n_outs; k++) {
		struct tr_out *o = &p->outs[k];
		char *img = base + o->pool_off;

		if (o->blob) {
			what[n++] = o->name;
			tr_copier_add(s->copier, img, o->blob->data, o->blob->len, -1);
			continue;
		}
		memcpy(img, o->header, o->header_len);
		for (size_t i = 0; i < o->n_items; i++) {
			const struct tr_item *it = &o->items[i];

			what[n++] = it->tensor->name;
			tr_copier_add(s->copier, img + it->data_off, it->tensor->data, it->bytes,
				      it->tensor->device);
		}
	}
	ret = tr_copier_wait(s->copier, &failed);
	if (ret < 0) {
		if (failed >= 0 && (size_t)failed < n)
			tr_fmt(msg, len, "tensor '%s': snapshot copy failed: %s", what[failed],
			       tr_copy_error());
		else
			tr_fmt(msg, len, "%s: snapshot copy failed: %s", a->path, tr_copy_error());
	}
	free(what);
	return ret;
}

/* This rank's files and groups, handed to the commit protocol. */
static int fill_ckpt(struct tr_ckpt *c, const struct tr_plan *p)
{
	c->files = calloc(p->n_outs + 1, sizeof(*c->files));
	c->groups = calloc(p->n_outs + 1, sizeof(*c->groups));
	if (!c->files || !c->groups)
		return -ENOMEM;
	for (size_t k = 0; k < p->n_outs; k++) {
		c->files[k].name = strdup(p->outs[k].name);
		if (!c->files[k].name)
			return -ENOMEM;
		c->files[k].size = p->outs[k].size;
		c->n_files++;
		if (p->outs[k].group) {
			c->groups[c->n_groups] = strdup(p->outs[k].group);
			if (!c->groups[c->n_groups])
				return -ENOMEM;
			c->n_groups++;
		}
	}
	return 0;
}

TR_EXPORT int ckptfs_save_async(struct ckptfs_saver *s, const struct ckptfs_save_args *a)
{
	char msg[TR_MSG_MAX] = "";
	struct tr_job *j = NULL;
	uint64_t t0 = tr_now_ns();
	int ret;

	if (!s)
		return -EINVAL;
	if (foreign(s))
		return -ECHILD;
	if (!a || !a->path) {
		ret = -EINVAL;
		tr_fmt(msg, sizeof(msg), "save: no arguments or no path");
		goto out;
	}
	if (a->world < 1 || a->rank < 0 || a->rank >= a->world || a->world > 99999) {
		ret = -EINVAL;
		tr_fmt(msg, sizeof(msg), "%s: rank %d of world %d out of range", a->path, a->rank,
		       a->world);
		goto out;
	}
	if (a->seq > (uint64_t)INT64_MAX) {
		ret = -EINVAL;
		tr_fmt(msg, sizeof(msg), "%s: seq %" PRIu64 " above 2^63-1", a->path, a->seq);
		goto out;
	}
	if (a->rank == 0 && a->manifest_extra) {
		json_t *x = json_loads(a->manifest_extra, JSON_REJECT_DUPLICATES, NULL);
		int ok = json_is_object(x);

		json_decref(x);
		if (!ok) {
			ret = -EINVAL;
			tr_fmt(msg, sizeof(msg), "%s: manifest_extra is not a JSON object", a->path);
			goto out;
		}
	}
	/* Back-pressure, before anything touches the pool. */
	pthread_mutex_lock(&s->lock);
	if (s->busy && s->opts.backpressure == CKPTFS_BP_FAIL) {
		tr_fmt(msg, sizeof(msg), "%s: the previous save (%s) is still being written",
		       a->path, s->job->ck.path);
		pthread_mutex_unlock(&s->lock);
		ret = -EBUSY;
		goto out;
	}
	while (s->busy)
		pthread_cond_wait(&s->idle, &s->lock);
	/* The last save's plan may serve this one (same layout); the rest of it goes. */
	if (s->job) {
		tr_plan_free(s->prev_plan);
		s->prev_plan = s->job->plan;
		s->job->plan = NULL;
	}
	job_free(s->job);
	s->job = NULL;
	pthread_mutex_unlock(&s->lock);

	j = calloc(1, sizeof(*j));
	if (!j) {
		ret = -ENOMEM;
		tr_fmt(msg, sizeof(msg), "%s: out of memory", a->path);
		goto out;
	}
	j->ck.dirfd = -1;
	j->wait_commit = s->opts.wait_commit;
	ret = tr_ckpt_init(&j->ck, a->path, msg, sizeof(msg));
	if (ret < 0)
		goto out;
	j->ck.rank = a->rank;
	j->ck.world = a->world;
	j->ck.job_id = a->job_id;
	j->ck.seq = a->seq;
	j->ck.timeout_ms = s->opts.commit_timeout_ms;
	if (a->rank == 0 && a->manifest_extra) {
		j->ck.extra = strdup(a->manifest_extra);
		if (!j->ck.extra) {
			ret = -ENOMEM;
			tr_fmt(msg, sizeof(msg), "%s: out of memory", a->path);
			goto out;
		}
	}
	ret = tr_plan_build(a, &s->prev_plan, &j->plan, msg, sizeof(msg));
	if (ret < 0)
		goto out;
	if (j->plan->pool_bytes > tr_pool_bound(s->pool)) {
		ret = -EFBIG;
		tr_fmt(msg, sizeof(msg), "%s: the snapshot needs %zu bytes of pool but pool_bytes "
		       "is %zu", a->path, j->plan->pool_bytes, tr_pool_bound(s->pool));
		goto out;
	}
	ret = fill_ckpt(&j->ck, j->plan);
	if (ret < 0) {
		tr_fmt(msg, sizeof(msg), "%s: out of memory", a->path);
		goto out;
	}
	ret = tr_ckpt_prepare(&j->ck, msg, sizeof(msg));
	if (ret < 0)
		goto out;
	ret = tr_pool_use(s->pool, j->plan->pool_bytes, j->plan->any_device);
	if (ret < 0) {
		tr_fmt(msg, sizeof(msg), "%s: pinning the pool: %s", a->path, tr_copy_error());
		goto out;
	}
	ret = snapshot(s, a, j->plan, msg, sizeof(msg));
	if (ret < 0)
		goto out;
	j->snapshot_ns = tr_now_ns() - t0;
	/* Cleared before the writes are queued: a writer that fails at once sets the error, and
	 * clearing it afterwards would hide that failure from ckptfs_saver_error(). */
	tr_errbuf_clear(&s->err);
	/* Queue the writes. */
	pthread_mutex_lock(&s->lock);
	s->job = j;
	s->busy = 1;
	pthread_cond_broadcast(&s->work);
	pthread_mutex_unlock(&s->lock);
	j = NULL;
	return 0;
out:
	/* A refused save keeps its plan for the next one (no writer ever saw it). */
	if (j && j->plan) {
		tr_plan_free(s->prev_plan);
		s->prev_plan = j->plan;
		j->plan = NULL;
	}
	job_free(j);
	return fail(s, ret, msg);
}

TR_EXPORT int ckptfs_save_wait(struct ckptfs_saver *s, int timeout_ms)
{
	struct timespec dl;
	int ret = 0;

	if (!s)
		return -EINVAL;
	if (foreign(s))
		return -ECHILD;
	clock_gettime(CLOCK_MONOTONIC, &dl);
	if (timeout_ms >= 0) {
		dl.tv_sec += timeout_ms / 1000;
		dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
		if (dl.tv_nsec >= 1000000000L) {
			dl.tv_sec++;
			dl.tv_nsec -= 1000000000L;
		}
	}
	pthread_mutex_lock(&s->lock);
	while (s->busy && ret == 0) {
		if (timeout_ms < 0)
			pthread_cond_wait(&s->idle, &s->lock);
		else if (pthread_cond_timedwait(&s->idle, &s->lock, &dl) == ETIMEDOUT && s->busy)
			ret = -ETIMEDOUT;
	}
	if (ret == 0 && s->job && s->job->err) {
		ret = s->job->err;
		tr_errbuf_set(&s->err, ret, "%s", s->job->msg);
	} else if (ret == 0) {
		tr_errbuf_clear(&s->err);
	} else {
		tr_errbuf_set(&s->err, ret, "%s: save still in progress after %d ms",
			      s->job->ck.path, timeout_ms);
	}
	pthread_mutex_unlock(&s->lock);
	return ret;
}

TR_EXPORT int ckptfs_save_done(struct ckptfs_saver *s)
{
	int busy;

	if (!s || foreign(s))
		return 1; /* no save of this process is in flight */
	pthread_mutex_lock(&s->lock);
	busy = s->busy;
	pthread_mutex_unlock(&s->lock);
	return !busy;
}

TR_EXPORT size_t ckptfs_saver_pool_bytes(const struct ckptfs_saver *s)
{
	/* The populated size changes only on the caller's thread (in ckptfs_save_async). */
	return s ? tr_pool_populated(s->pool) : 0;
}

TR_EXPORT int ckptfs_saver_error(const struct ckptfs_saver *s, char *buf, size_t len)
{
	if (!s || foreign(s)) {
		if (buf && len)
			snprintf(buf, len, "%s", s ? FOREIGN_MSG : "");
		return s ? -ECHILD : -EINVAL;
	}
	return tr_errbuf_get((struct tr_errbuf *)&s->err, buf, len);
}

TR_EXPORT int ckptfs_saver_stats(const struct ckptfs_saver *s, struct ckptfs_save_stats *ret)
{
	struct ckptfs_saver *m = (struct ckptfs_saver *)s;
	int r = 0;

	if (!s || !ret)
		return -EINVAL;
	if (foreign(s)) {
		memset(ret, 0, sizeof(*ret));
		return -ECHILD;
	}
	pthread_mutex_lock(&m->lock);
	if (m->have_stats)
		*ret = m->stats;
	else
		r = -ENOENT;
	pthread_mutex_unlock(&m->lock);
	if (r < 0)
		memset(ret, 0, sizeof(*ret));
	return r;
}

TR_EXPORT void ckptfs__test_set_write_delay(struct ckptfs_saver *s, int ms)
{
	pthread_mutex_lock(&s->lock);
	s->write_delay_ms = ms;
	pthread_mutex_unlock(&s->lock);
}

TR_EXPORT const void *ckptfs__test_pool_base(const struct ckptfs_saver *s)
{
	return tr_pool_base(s->pool);
}
