/* commit.c: done markers, the completion marker and the rename of PATH.partial (commit.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "trainer/commit.h"
#include "trainer/stwrite.h"
#include "trainer/trainer_int.h"

#define MARKER_MAX ((size_t)64 << 20)

void tr_done_marker_name(char *buf, size_t len, int rank)
{
	snprintf(buf, len, ".rank-%05d.done", rank);
}

void tr_failed_marker_name(char *buf, size_t len, int rank)
{
	snprintf(buf, len, ".rank-%05d.failed", rank);
}

int tr_ckpt_init(struct tr_ckpt *c, const char *path, char *err, size_t errlen)
{
	size_t n;
	char *slash;

	memset(c, 0, sizeof(*c));
	c->dirfd = -1;
	if (!path || !path[0]) {
		tr_fmt(err, errlen, "empty checkpoint path");
		return -EINVAL;
	}
	c->path = strdup(path);
	if (!c->path)
		goto nomem;
	n = strlen(c->path);
	while (n > 1 && c->path[n - 1] == '/')
		c->path[--n] = '\0';
	if (!strcmp(c->path, "/") || !strcmp(c->path, ".") || !strcmp(c->path, "..") ||
	    (n >= 2 && !strcmp(c->path + n - 2, "/.")) ||
	    (n >= 3 && !strcmp(c->path + n - 3, "/.."))) {
		tr_fmt(err, errlen, "%s: not a name for a new checkpoint directory", path);
		tr_ckpt_release(c);
		return -EINVAL;
	}
	c->partial = malloc(n + sizeof(TR_PARTIAL_SUFFIX));
	if (!c->partial)
		goto nomem;
	memcpy(c->partial, c->path, n);
	memcpy(c->partial + n, TR_PARTIAL_SUFFIX, sizeof(TR_PARTIAL_SUFFIX));
	slash = strrchr(c->path, '/');
	if (!slash)
		c->parent = strdup(".");
	else if (slash == c->path)
		c->parent = strdup("/");
	else
		c->parent = strndup(c->path, (size_t)(slash - c->path));
	if (!c->parent)
		goto nomem;
	return 0;
nomem:
	tr_fmt(err, errlen, "%s: out of memory", path);
	tr_ckpt_release(c);
	return -ENOMEM;
}

void tr_ckpt_release(struct tr_ckpt *c)
{
	if (c->dirfd >= 0)
		close(c->dirfd);
	for (size_t i = 0; i < c->n_files; i++)
		free(c->files[i].name);
	for (size_t i = 0; i < c->n_groups; i++)
		free(c->groups[i]);
	free(c->files);
	free(c->groups);
	free(c->extra);
	free(c->path);
	free(c->partial);
	free(c->parent);
	memset(c, 0, sizeof(*c));
	c->dirfd = -1;
}

int tr_ckpt_prepare(struct tr_ckpt *c, char *err, size_t errlen)
{
	struct stat st;
	char name[64];
	int ret = 0;

	if (lstat(c->path, &st) == 0) {
		ret = -EEXIST;
		tr_fmt(err, errlen, "%s: checkpoint already exists", c->path);
		goto out;
	}
	/* errno is saved before the message is formatted (strerror or vsnprintf may set it). */
	if (errno != ENOENT) {
		ret = -errno;
		tr_fmt(err, errlen, "%s: %s", c->path, strerror(-ret));
		goto out;
	}
	if (mkdir(c->partial, 0755) < 0 && errno != EEXIST) {
		ret = -errno;
		tr_fmt(err, errlen, "%s: mkdir: %s", c->partial, strerror(-ret));
		goto out;
	}
	c->dirfd = open(c->partial, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (c->dirfd < 0) {
		ret = -errno;
		tr_fmt(err, errlen, "%s: open: %s", c->partial, strerror(-ret));
		goto out;
	}
	for (int k = 0; k < 2; k++) {
		if (k == 0)
			tr_done_marker_name(name, sizeof(name), c->rank);
		else
			tr_failed_marker_name(name, sizeof(name), c->rank);
		if (unlinkat(c->dirfd, name, 0) < 0 && errno != ENOENT) {
			ret = -errno;
			tr_fmt(err, errlen, "%s/%s: removing a stale marker: %s", c->partial, name,
			       strerror(-ret));
			goto out;
		}
	}
out:
	return ret;
}

static json_t *files_json(const struct tr_file_rec *f, size_t n)
{
	json_t *a = json_array();

	for (size_t i = 0; a && i < n; i++) {
		json_t *o = json_pack("{s:s, s:I}", "name", f[i].name, "size", (json_int_t)f[i].size);

		if (!o || json_array_append_new(a, o) < 0) {
			json_decref(a);
			return NULL;
		}
	}
	return a;
}

static json_t *strs_json(char *const *s, size_t n)
{
	json_t *a = json_array();

	for (size_t i = 0; a && i < n; i++)
		if (json_array_append_new(a, json_string(s[i])) < 0) {
			json_decref(a);
			return NULL;
		}
	return a;
}

/* Writes JSON o durably as NAME in PATH.partial (temporary name, fsync, rename, dir fsync). */
static int write_json(struct tr_ckpt *c, const char *name, json_t *o, char *err, size_t errlen)
{
	char tmp[128];
	char *s;
	int ret;

	if (!o) {
		tr_fmt(err, errlen, "%s/%s: out of memory", c->partial, name);
		return -ENOMEM;
	}
	s = json_dumps(o, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
	if (!s) {
		tr_fmt(err, errlen, "%s/%s: out of memory", c->partial, name);
		return -ENOMEM;
	}
	snprintf(tmp, sizeof(tmp), ".tmp-r%05d-%s", c->rank, name);
	ret = tr_write_file(c->dirfd, c->partial, name, tmp, s, strlen(s), (size_t)1 << 20, err,
			    errlen);
	tr_json_free(s);
	if (ret == 0)
		ret = tr_fsync_dir(c->dirfd, c->partial, err, errlen);
	return ret;
}

static char *job_str(uint64_t job_id, char buf[24])
{
	snprintf(buf, 24, "%" PRIu64, job_id);
	return buf;
}

int tr_done_marker_write(struct tr_ckpt *c, char *err, size_t errlen)
{
	char name[64], job[24];
	json_t *o;
	int ret;

	tr_done_marker_name(name, sizeof(name), c->rank);
	o = json_pack("{s:s, s:i, s:s, s:I, s:i, s:i, s:o*, s:o*}", "format", TR_DONE_FORMAT,
		      "format_version", 1, "job_id", job_str(c->job_id, job),
		      "seq", (json_int_t)c->seq, "world", c->world, "rank", c->rank,
		      "groups", strs_json(c->groups, c->n_groups),
		      "files", files_json(c->files, c->n_files));
	ret = write_json(c, name, o, err, errlen);
	json_decref(o);
	return ret;
}

int tr_failed_marker_write(struct tr_ckpt *c, int error, const char *msg)
{
	char name[64], job[24], err[TR_MSG_MAX];
	json_t *o;
	int ret;

	if (c->dirfd < 0 || c->published)
		return c->published ? 0 : -EBADF; /* a published checkpoint is never written */
	tr_failed_marker_name(name, sizeof(name), c->rank);
	o = json_pack("{s:s, s:i, s:s, s:I, s:i, s:i, s:i, s:s}", "format", TR_FAILED_FORMAT,
		      "format_version", 1, "job_id", job_str(c->job_id, job),
		      "seq", (json_int_t)c->seq, "world", c->world, "rank", c->rank,
		      "errno", -error, "error", msg ? msg : "");
	ret = write_json(c, name, o, err, sizeof(err));
	json_decref(o);
	return ret;
}

/* Whether text s is rank r's failure marker of this save; if so, *ret_err is its negative
 * errno (-EIO if it holds none) and msg its message. */
static int failed_matches(const struct tr_ckpt *c, const char *s, int r, int *ret_err,
			  char *msg, size_t len)
{
	json_t *o = json_loads(s, JSON_REJECT_DUPLICATES, NULL);
	const char *fmt = NULL, *job = NULL, *why = NULL;
	json_int_t seq = -1, world = -1, rank = -1, e = 0;
	char jb[24];
	int ok = 0;

	if (o && json_unpack(o, "{s:s, s:s, s:I, s:I, s:I, s?I, s:s}", "format", &fmt, "job_id",
			     &job, "seq", &seq, "world", &world, "rank", &rank, "errno", &e,
			     "error", &why) == 0 &&
	    !strcmp(fmt, TR_FAILED_FORMAT) && !strcmp(job, job_str(c->job_id, jb)) &&
	    (uint64_t)seq == c->seq && world == c->world && rank == r) {
		ok = 1;
		*ret_err = e > 0 && e < 4096 ? -(int)e : -EIO;
		snprintf(msg, len, "%s", why);
	}
	json_decref(o);
	return ok;
}

/* Sleeps between polls: short at first (a local commit is quick), then up to 50 ms. */
static void poll_sleep(unsigned *us)
{
	struct timespec ts = { 0, (long)*us * 1000 };

	nanosleep(&ts, NULL);
	if (*us < 50000)
		*us *= 2;
}

/* Whether marker text s is rank r's marker of this save; on success *ret_files is its
 * "files" array (a new reference) and *ret_groups its "groups". */
static int marker_matches(const struct tr_ckpt *c, const char *s, int r, json_t **ret_files,
			  json_t **ret_groups)
{
	json_t *o = json_loads(s, JSON_REJECT_DUPLICATES, NULL), *files, *groups;
	const char *fmt = NULL, *job = NULL;
	json_int_t seq = -1, world = -1, rank = -1;
	char jb[24];
	int ok = 0;

	if (!o)
		return 0;
	if (json_unpack(o, "{s:s, s:s, s:I, s:I, s:I, s:o, s:o}", "format", &fmt, "job_id", &job,
			"seq", &seq, "world", &world, "rank", &rank, "files", &files,
			"groups", &groups) == 0 &&
	    !strcmp(fmt, TR_DONE_FORMAT) && !strcmp(job, job_str(c->job_id, jb)) &&
	    (uint64_t)seq == c->seq && world == c->world && rank == r && json_is_array(files) &&
	    json_is_array(groups)) {
		size_t i;
		json_t *f;

		ok = 1;
		json_array_foreach(files, i, f) {
			const char *n = json_string_value(json_object_get(f, "name"));

			if (!n || !json_is_integer(json_object_get(f, "size")) || strchr(n, '/') ||
			    n[0] == '.' || !strcmp(n, TR_MARKER_NAME))
				ok = 0;
		}
		if (ok) {
			*ret_files = json_incref(files);
			*ret_groups = json_incref(groups);
		}
	}
	json_decref(o);
	return ok;
}

/* Lists the names in PATH.partial into *ret (a JSON object name -> true). */
static int list_dir(struct tr_ckpt *c, json_t **ret, char *err, size_t errlen)
{
	int fd = openat(c->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	json_t *names = json_object();
	struct dirent *de;
	DIR *d;

	*ret = NULL;
	if (fd < 0 || !names) {
		int e = fd < 0 ? errno : ENOMEM;

		tr_fmt(err, errlen, "%s: opendir: %s", c->partial, strerror(e));
		if (fd >= 0)
			close(fd);
		json_decref(names);
		return -e;
	}
	d = fdopendir(fd);
	if (!d) {
		int e = errno;

		close(fd);
		json_decref(names);
		tr_fmt(err, errlen, "%s: opendir: %s", c->partial, strerror(e));
		return -e;
	}
	/* A short listing would let a stale file through the commit: a readdir error fails. */
	for (;;) {
		errno = 0;
		de = readdir(d);
		if (!de)
			break;
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (json_object_set_new(names, de->d_name, json_true()) < 0) {
			errno = ENOMEM;
			break;
		}
	}
	if (errno) {
		int e = errno;

		closedir(d);
		json_decref(names);
		tr_fmt(err, errlen, "%s: readdir: %s", c->partial, strerror(e));
		return -e;
	}
	closedir(d);
	*ret = names;
	return 0;
}

static void now_iso(char *buf, size_t len)
{
	time_t t = time(NULL);
	struct tm tm;

	gmtime_r(&t, &tm);
	strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static int cmp_cstr(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int tr_commit(struct tr_ckpt *c, char *err, size_t errlen)
{
	json_t *ranks = json_array(), *listed = json_object(), *groups = json_object();
	json_t *names = NULL, *marker = NULL, *extra = NULL, *garr = NULL;
	char *found = calloc((size_t)c->world, 1);
	uint64_t deadline = tr_now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
	unsigned us = 1000;
	int missing, ret = -ENOMEM, pfd = -1;
	char name[64], job[24], when[32];
	const char *k;
	json_t *v;

	if (!ranks || !listed || !groups || !found)
		goto nomem;
	/* ranks[r]: rank r's entry, filled as its marker is found. */
	for (int r = 0; r < c->world; r++)
		if (json_array_append_new(ranks, json_null()) < 0)
			goto nomem;
	/* Rank 0's own files. */
	if (json_array_set_new(ranks, 0, json_pack("{s:i, s:o}", "rank", 0, "files",
						  files_json(c->files, c->n_files))) < 0)
		goto nomem;
	for (size_t i = 0; i < c->n_files; i++)
		json_object_set_new(listed, c->files[i].name, json_integer((json_int_t)c->files[i].size));
	for (size_t i = 0; i < c->n_groups; i++)
		json_object_set_new(groups, c->groups[i], json_true());
	found[0] = 1;
	missing = c->world - 1;
	/* The markers are the barrier.  Poll by listing the directory, then open what is listed:
	 * on a FUSE mount a name looked up before it existed may stay negative in the kernel's
	 * cache for a while, so keep polling until the deadline. */
	while (missing > 0) {
		ret = list_dir(c, &names, err, errlen);
		if (ret < 0)
			goto out;
		for (int r = 1; r < c->world; r++) {
			json_t *files = NULL, *gs = NULL, *f;
			char *s = NULL;
			size_t i;

			if (found[r])
				continue;
			/* A rank that failed says so: the save fails now, not at the timeout. */
			tr_failed_marker_name(name, sizeof(name), r);
			if (json_object_get(names, name) &&
			    tr_read_small(c->dirfd, name, MARKER_MAX, &s, NULL) == 0) {
				char why[TR_MSG_MAX];
				int fe;

				if (failed_matches(c, s, r, &fe, why, sizeof(why))) {
					free(s);
					tr_fmt(err, errlen, "%s: rank %d failed: %s", c->partial, r, why);
					ret = fe;
					goto out;
				}
				free(s);
				s = NULL;
			}
			tr_done_marker_name(name, sizeof(name), r);
			if (!json_object_get(names, name))
				continue;
			if (tr_read_small(c->dirfd, name, MARKER_MAX, &s, NULL) < 0)
				continue;
			if (!marker_matches(c, s, r, &files, &gs)) {
				free(s);
				continue; /* another job's or save's marker: not this save's */
			}
			free(s);
			json_array_foreach(files, i, f) {
				const char *fn = json_string_value(json_object_get(f, "name"));

				if (json_object_get(listed, fn)) {
					tr_fmt(err, errlen, "%s/%s: listed by rank %d and another rank",
					       c->partial, fn, r);
					json_decref(files);
					json_decref(gs);
					ret = -EINVAL;
					goto out;
				}
				json_object_set(listed, fn, json_object_get(f, "size"));
			}
			json_array_foreach(gs, i, f)
				if (json_is_string(f))
					json_object_set_new(groups, json_string_value(f), json_true());
			json_array_set_new(ranks, (size_t)r, json_pack("{s:i, s:o}", "rank", r, "files",
								       files));
			json_decref(gs);
			found[r] = 1;
			missing--;
		}
		json_decref(names);
		names = NULL;
		if (missing == 0)
			break;
		if (tr_now_ns() >= deadline) {
			char list[256];
			size_t used = 0;

			list[0] = '\0';
			for (int r = 1; r < c->world && used < sizeof(list) - 16; r++)
				if (!found[r])
					used += (size_t)snprintf(list + used, sizeof(list) - used, "%s%d",
								used ? ", " : "", r);
			tr_fmt(err, errlen, "%s: commit timed out after %d ms: no done marker of job %s "
			       "seq %" PRIu64 " from rank%s %s (%d of %d missing)", c->partial,
			       c->timeout_ms, job_str(c->job_id, job), c->seq, missing > 1 ? "s" : "",
			       list, missing, c->world);
			ret = -ETIMEDOUT;
			goto out;
		}
		poll_sleep(&us);
	}
	/* Every listed file must be there with its size; everything else is stale. */
	json_object_foreach(listed, k, v) {
		struct stat st;

		if (fstatat(c->dirfd, k, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			ret = -errno;
			tr_fmt(err, errlen, "%s/%s: %s", c->partial, k, strerror(-ret));
			goto out;
		}
		if ((uint64_t)st.st_size != (uint64_t)json_integer_value(v)) {
			tr_fmt(err, errlen, "%s/%s: size %" PRIu64 ", its marker says %" PRId64,
			       c->partial, k, (uint64_t)st.st_size, (int64_t)json_integer_value(v));
			ret = -EIO;
			goto out;
		}
	}
	ret = list_dir(c, &names, err, errlen);
	if (ret < 0)
		goto out;
	json_object_foreach(names, k, v) {
		struct stat st;

		if (json_object_get(listed, k))
			continue;
		/* Nothing unlisted may reach PATH: an entry that cannot be examined or removed
		 * (a non-empty directory no rank wrote) fails the commit, naming it. */
		if (fstatat(c->dirfd, k, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno == ENOENT)
				continue;
			ret = -errno;
			tr_fmt(err, errlen, "%s/%s: %s", c->partial, k, strerror(-ret));
			goto out;
		}
		if (unlinkat(c->dirfd, k, S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) < 0 &&
		    errno != ENOENT) {
			ret = -errno;
			tr_fmt(err, errlen, "%s/%s: removing a stale %s: %s", c->partial, k,
			       S_ISDIR(st.st_mode) ? "directory" : "file", strerror(-ret));
			goto out;
		}
	}
	/* The completion marker, last. */
	if (c->extra) {
		json_error_t je;

		extra = json_loads(c->extra, JSON_REJECT_DUPLICATES, &je);
		if (!json_is_object(extra)) {
			tr_fmt(err, errlen, "%s: manifest_extra is not a JSON object", c->path);
			ret = -EINVAL;
			goto out;
		}
	} else {
		extra = json_object();
	}
	{
		size_t ng = json_object_size(groups), i = 0;
		const char **gl = calloc(ng + 1, sizeof(*gl));

		if (!gl)
			goto nomem;
		json_object_foreach(groups, k, v)
			gl[i++] = k;
		qsort(gl, ng, sizeof(*gl), cmp_cstr);
		garr = json_array();
		for (i = 0; garr && i < ng; i++)
			json_array_append_new(garr, json_string(gl[i]));
		free(gl);
	}
	now_iso(when, sizeof(when));
	marker = json_pack("{s:s, s:i, s:s, s:I, s:i, s:s, s:O*, s:O, s:O}", "format",
			   TR_MARKER_FORMAT, "format_version", TR_MARKER_VERSION, "job_id",
			   job_str(c->job_id, job), "seq", (json_int_t)c->seq, "world", c->world,
			   "time", when, "groups", garr, "ranks", ranks, "extra", extra);
	ret = write_json(c, TR_MARKER_NAME, marker, err, errlen);
	if (ret < 0)
		goto out;
	/* Publish: never over an existing PATH (rename(2) would replace an empty directory). */
	if (syscall(SYS_renameat2, AT_FDCWD, c->partial, AT_FDCWD, c->path, 1 /* NOREPLACE */) < 0) {
		if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
			struct stat st;

			if (lstat(c->path, &st) == 0)
				errno = EEXIST;
			else if (rename(c->partial, c->path) == 0)
				errno = 0;
		}
		if (errno) {
			ret = -errno;
			tr_fmt(err, errlen, "%s: rename to %s: %s", c->partial, c->path,
			       strerror(-ret));
			goto out;
		}
	}
	c->published = 1;
	pfd = open(c->parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (pfd < 0) {
		ret = -errno;
		tr_fmt(err, errlen, "%s: open: %s", c->parent, strerror(-ret));
		goto out;
	}
	ret = tr_fsync_dir(pfd, c->parent, err, errlen);
	goto out;
nomem:
	ret = -ENOMEM;
	tr_fmt(err, errlen, "%s: out of memory", c->partial);
out:
	if (pfd >= 0)
		close(pfd);
	json_decref(marker);
	json_decref(garr);
	json_decref(extra);
	json_decref(names);
	json_decref(groups);
	json_decref(listed);
	json_decref(ranks);
	free(found);
	return ret;
}

int tr_wait_complete(struct tr_ckpt *c, char *err, size_t errlen)
{
	uint64_t deadline = tr_now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
	size_t n = strlen(c->path) + sizeof(TR_MARKER_NAME) + 2;
	char *mp = malloc(n), job[24], f0[64];
	const char *other = NULL;
	unsigned us = 1000;
	char seen[96] = "";
	int ret;

	if (!mp) {
		tr_fmt(err, errlen, "%s: out of memory", c->path);
		return -ENOMEM;
	}
	snprintf(mp, n, "%s/%s", c->path, TR_MARKER_NAME);
	tr_failed_marker_name(f0, sizeof(f0), 0);
	for (;;) {
		char *s = NULL;

		/* Rank 0 failed this save (its own error or another rank's): stop waiting. */
		if (tr_read_small(c->dirfd, f0, MARKER_MAX, &s, NULL) == 0) {
			char why[TR_MSG_MAX];
			int fe, hit = failed_matches(c, s, 0, &fe, why, sizeof(why));

			free(s);
			s = NULL;
			if (hit) {
				tr_fmt(err, errlen, "%s: rank 0 failed the save: %s", c->path, why);
				ret = fe;
				break;
			}
		}

		if (tr_read_small(AT_FDCWD, mp, MARKER_MAX, &s, NULL) == 0) {
			json_t *o = json_loads(s, 0, NULL);
			const char *j = json_string_value(json_object_get(o, "job_id"));
			json_t *sq = json_object_get(o, "seq");

			free(s);
			if (j && !strcmp(j, job_str(c->job_id, job)) && json_is_integer(sq) &&
			    (uint64_t)json_integer_value(sq) == c->seq) {
				json_decref(o);
				ret = 0;
				break;
			}
			snprintf(seen, sizeof(seen), "job %s seq %" PRId64, j ? j : "?",
				 json_is_integer(sq) ? (int64_t)json_integer_value(sq) : -1);
			other = seen;
			json_decref(o);
		}
		if (tr_now_ns() >= deadline) {
			if (other)
				tr_fmt(err, errlen, "%s: completed by another save (%s), not job %s seq "
				       "%" PRIu64, c->path, other, job_str(c->job_id, job), c->seq);
			else
				tr_fmt(err, errlen, "%s: not complete after %d ms (rank 0 has not "
				       "committed; see its error)", c->path, c->timeout_ms);
			ret = -ETIMEDOUT;
			break;
		}
		poll_sleep(&us);
	}
	free(mp);
	return ret;
}
