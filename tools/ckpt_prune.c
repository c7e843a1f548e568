/* SPDX-License-Identifier: MIT */
/*
 * ckpt_prune.c - `ckpt prune DIR`: delete the checkpoint step directories
 * of DIR that a retention policy does not keep.
 *
 * Step directories: the directories directly in DIR (not symlinks) whose
 * name ends in a run of decimal digits, the step number: step_100,
 * global_step100, checkpoint-500, iter_0000100, 100.  The part before the
 * digits (the prefix) groups them: "global_step" and "checkpoint-" steps
 * are pruned apart.  Names starting with '.' are never steps (writers' and
 * the trainer library's temporary names), nor are names with anything after
 * the digits (step_100.tmp, step_100-partial).
 *
 * Kept in each group: the newest step (highest number) always, the N
 * newest with --keep-last N, those whose number is a multiple of K with
 * --keep-every K.  The rest are deleted with their contents, through the
 * file system: on a ckptfs mount the daemon unlinks the files, and the
 * chunks no other file uses are reclaimed as for any deleted file
 * (docs/user-guide.md section 6.5).
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_cmd.h"

struct step {
	char *name;
	size_t plen;   /* prefix length */
	uint64_t num;
	const char *keep; /* why it is kept, or NULL */
};

/* The step number of name, or -1 when name is not a step directory's. */
static int parse_step(const char *name, size_t *ret_plen, uint64_t *ret_num)
{
	size_t n = strlen(name), i = n;

	if (n == 0 || name[0] == '.')
		return -1;
	while (i > 0 && name[i - 1] >= '0' && name[i - 1] <= '9')
		i--;
	if (i == n || n - i > 19) /* no digits, or more than a uint64_t holds */
		return -1;
	*ret_plen = i;
	*ret_num = strtoull(name + i, NULL, 10);
	return 0;
}

/* By prefix, then newest first. */
static int step_cmp(const void *pa, const void *pb)
{
	const struct step *a = pa, *b = pb;
	size_t m = a->plen < b->plen ? a->plen : b->plen;
	int c = memcmp(a->name, b->name, m);

	if (c)
		return c;
	if (a->plen != b->plen)
		return a->plen < b->plen ? -1 : 1;
	if (a->num != b->num)
		return a->num > b->num ? -1 : 1;
	return strcmp(a->name, b->name);
}

static bool same_group(const struct step *a, const struct step *b)
{
	return a->plen == b->plen && !memcmp(a->name, b->name, a->plen);
}

static int prune_failed; /* nftw's callback cannot take an argument */

static int rm_one(const char *path, const struct stat *st, int type, struct FTW *f)
{
	int r = type == FTW_DP ? rmdir(path) : unlink(path);

	(void)st;
	(void)f;
	if (r < 0) {
		fprintf(stderr, "ckpt: %s: cannot delete: %s\n", path, strerror(errno));
		prune_failed = 1;
	}
	return 0; /* go on: delete what can be deleted */
}

static int load_steps(const char *dir, struct step **ret, size_t *ret_n)
{
	struct step *v = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	DIR *d = opendir(dir);
	int r = 0;

	if (!d)
		return -errno;
	while ((errno = 0, de = readdir(d))) {
		struct stat st;
		size_t plen;
		uint64_t num;

		if (parse_step(de->d_name, &plen, &num) < 0)
			continue;
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISDIR(st.st_mode))
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 64;
			struct step *nv = realloc(v, nc * sizeof(*nv));

			if (!nv) {
				r = -ENOMEM;
				break;
			}
			v = nv;
			cap = nc;
		}
		v[n].name = strdup(de->d_name);
		if (!v[n].name) {
			r = -ENOMEM;
			break;
		}
		v[n].plen = plen;
		v[n].num = num;
		v[n].keep = NULL;
		n++;
	}
	if (r == 0 && errno)
		r = -errno;
	closedir(d);
	if (r < 0) {
		for (size_t i = 0; i < n; i++)
			free(v[i].name);
		free(v);
		return r;
	}
	if (n > 1)
		qsort(v, n, sizeof(*v), step_cmp);
	*ret = v;
	*ret_n = n;
	return 0;
}

int cmd_prune(const char *dir, uint64_t keep_last, uint64_t keep_every, bool dry_run)
{
	struct step *v = NULL;
	size_t n = 0, deleted = 0, kept = 0;
	int r = load_steps(dir, &v, &n);

	if (r < 0) {
		fprintf(stderr, "ckpt: %s: cannot list: %s\n", dir, strerror(-r));
		return 1;
	}
	/* the policy, group by group (v is sorted by prefix, newest first) */
	for (size_t i = 0, rank = 0; i < n; i++) {
		rank = (i > 0 && same_group(&v[i - 1], &v[i])) ? rank + 1 : 0;
		if (rank == 0)
			v[i].keep = "newest";
		else if (keep_last && rank < keep_last)
			v[i].keep = "last";
		else if (keep_every && v[i].num % keep_every == 0)
			v[i].keep = "every";
	}
	prune_failed = 0;
	for (size_t i = 0; i < n; i++) {
		char *path;

		if (v[i].keep) {
			kept++;
			if (!strcmp(v[i].keep, "last"))
				printf("keep    %s  (--keep-last %" PRIu64 ")\n", v[i].name, keep_last);
			else if (!strcmp(v[i].keep, "every"))
				printf("keep    %s  (--keep-every %" PRIu64 ")\n", v[i].name,
				       keep_every);
			else
				printf("keep    %s  (newest)\n", v[i].name);
			continue;
		}
		printf("%s  %s\n", dry_run ? "would delete" : "delete", v[i].name);
		fflush(stdout);
		if (dry_run)
			continue;
		path = join(dir, v[i].name);
		if (!path) {
			fprintf(stderr, "ckpt: %s: %s\n", dir, strerror(ENOMEM));
			prune_failed = 1;
			continue;
		}
		/* depth first, not across mounts, not through symlinks */
		if (nftw(path, rm_one, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) < 0) {
			fprintf(stderr, "ckpt: %s: cannot delete: %s\n", path, strerror(errno));
			prune_failed = 1;
		}
		if (access(path, F_OK) != 0)
			deleted++;
		free(path);
	}
	if (dry_run)
		printf("%s: %zu step(s) kept, %zu would be deleted (dry run)\n", dir, kept, n - kept);
	else
		printf("%s: %zu step(s) kept, %zu deleted%s\n", dir, kept, deleted,
		       deleted ? "; the space of the chunks only they used is reclaimed as "
				 "for any deleted file (user guide, 6.5)" :
				 "");
	for (size_t i = 0; i < n; i++)
		free(v[i].name);
	free(v);
	return prune_failed ? 1 : 0;
}
