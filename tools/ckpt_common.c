/* SPDX-License-Identifier: MIT */
/*
 * ckpt_common.c - what ckpt's commands share (ckpt_cmd.h): opening a
 * store, paths inside it, parsing numbers and sizes.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "ckpt_cmd.h"

/* Print a JSON document on stdout (one object, indented, keys in the order
 * added) and free it.  0, or 1 when it cannot be written. */
int print_json_doc(json_t *doc)
{
	int r = doc ? json_dumpf(doc, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : -1;

	if (r == 0 && fputc('\n', stdout) == EOF)
		r = -1;
	json_decref(doc);
	if (r < 0) {
		fprintf(stderr, "ckpt: cannot write the JSON output: %s\n",
			doc ? strerror(errno) : "out of memory");
		return 1;
	}
	return 0;
}

const char *meta_where;

int open_store_opts(const char *path, struct ckpt_store_opts *o, ckpt_store **ret)
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

int open_store(const char *path, enum ckpt_store_mode mode, ckpt_store **ret)
{
	struct ckpt_store_opts o;

	ckpt_store_opts_init(&o);
	o.mode = mode;
	return open_store_opts(path, &o, ret);
}

int resolve(ckpt_store *s, const char *path, struct ckpt_inode *ret)
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

char *join(const char *a, const char *b)
{
	char *p;

	if (asprintf(&p, "%s%s%s", a, a[0] && a[strlen(a) - 1] == '/' ? "" : "/", b) < 0)
		return NULL;
	return p;
}

int parse_u64(const char *s, uint64_t *ret)
{
	unsigned long long v;
	char *end;

	if (!s || !isdigit((unsigned char)s[0]))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end)
		return -EINVAL;
	*ret = v;
	return 0;
}

int parse_size(const char *s, uint64_t *ret)
{
	static const char *const sfx = "KMGTP";
	unsigned long long v;
	const char *p;
	char *end;
	int shift = 0;

	if (!s || !isdigit((unsigned char)s[0]))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -EINVAL;
	if (*end) {
		p = strchr(sfx, toupper((unsigned char)*end));
		if (!p)
			return -EINVAL;
		shift = 10 * (int)(p - sfx + 1);
		end++;
		/* K, KB, KiB (and lower case): all powers of 1024 */
		if (*end && strcasecmp(end, "B") && strcasecmp(end, "iB"))
			return -EINVAL;
	}
	if (shift && v > (UINT64_MAX >> shift))
		return -EINVAL;
	*ret = (uint64_t)v << shift;
	return 0;
}
