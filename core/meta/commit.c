/* SPDX-License-Identifier: MIT */
/*
 * commit.c - commits of file content to the metadata (commit.h).
 */
#include "meta/commit.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "meta/ns.h"
#include "base/util.h"

static int delta_cmp(const void *a, const void *b)
{
	return memcmp(((const struct ckpt_refdelta *)a)->d.bytes,
		      ((const struct ckpt_refdelta *)b)->d.bytes, CKPT_DIGEST_LEN);
}

/* Add +sign for every chunk extent of l to the delta vector. */
static int delta_add(struct ckpt_refdelta **v, size_t *n, size_t *cap,
		     const struct ckpt_extent_list *l, int sign)
{
	for (size_t i = 0; l && i < l->n; i++) {
		if (l->v[i].kind != CKPT_EXT_CHUNK)
			continue;
		if (*n == *cap) {
			size_t nc = *cap ? *cap * 2 : 256;
			struct ckpt_refdelta *nv = realloc(*v, nc * sizeof(*nv));
			if (!nv)
				return -ENOMEM;
			*v = nv;
			*cap = nc;
		}
		(*v)[(*n)++] = (struct ckpt_refdelta){ l->v[i].digest, sign };
	}
	return 0;
}

/* Sort and merge per digest, dropping zero sums. */
static size_t delta_merge(struct ckpt_refdelta *v, size_t n)
{
	size_t out = 0, k = 0;

	if (n == 0)
		return 0;
	qsort(v, n, sizeof(*v), delta_cmp);
	for (size_t i = 0; i < n; i++) {
		if (out > 0 && memcmp(v[out - 1].d.bytes, v[i].d.bytes, CKPT_DIGEST_LEN) == 0)
			v[out - 1].n += v[i].n;
		else
			v[out++] = v[i];
	}
	for (size_t i = 0; i < out; i++)
		if (v[i].n != 0)
			v[k++] = v[i];
	return k;
}

int ckpt_refdelta_build(const struct ckpt_extent_list *add, const struct ckpt_extent_list *sub,
			struct ckpt_refdelta **ret, size_t *ret_n)
{
	struct ckpt_refdelta *v = NULL;
	size_t n = 0, cap = 0;
	int r = delta_add(&v, &n, &cap, add, 1);

	if (r == 0)
		r = delta_add(&v, &n, &cap, sub, -1);
	if (r < 0) {
		free(v);
		return r;
	}
	*ret_n = delta_merge(v, n);
	*ret = v;
	return 0;
}

int ckpt_refdelta_apply(const struct ckpt_commit_env *env, ckpt_txn *t,
			const struct ckpt_refdelta *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct ckpt_chunk_loc loc;
		uint64_t refs = 0;
		int r = ckpt_meta_get_chunk(env->eng, t, &v[i].d, &loc, &refs);

		if (r == -ENOENT) {
			if (v[i].n < 0 || !env->unindexed ||
			    !env->unindexed(env->arg, &v[i].d, &loc)) {
				char hex[33];
				ckpt_digest_to_hex(&v[i].d, hex);
				ckpt_err("%s: chunk %s referenced but unknown", env->name, hex);
				return -EIO;
			}
		} else if (r < 0) {
			return r;
		}
		uint64_t was = r == -ENOENT ? UINT64_MAX : refs;

		if (v[i].n < 0 && refs < (uint64_t)-v[i].n) {
			char hex[33];
			ckpt_digest_to_hex(&v[i].d, hex);
			ckpt_warn("%s: refcount underflow on chunk %s (fsck will report)", env->name,
				  hex);
			refs = 0;
		} else {
			refs = (uint64_t)((int64_t)refs + v[i].n);
		}
		ckpt_meta_put_chunk(t, &v[i].d, &loc, refs);
		if (env->zero_marks && was != UINT64_MAX && (was == 0) != (refs == 0)) {
			uint8_t key[32], val[CKPT_ZERO_REC_LEN];
			size_t kl = ckpt_key_zero(key, &v[i].d);

			if (refs == 0) {
				ckpt_zero_encode(0, val);
				ckpt_txn_put(t, key, kl, val, sizeof(val));
			} else {
				ckpt_txn_delete(t, key, kl);
			}
		}
	}
	return 0;
}

struct commit_arg {
	const struct ckpt_commit_env *env;
	const struct ckpt_content *v;
	size_t n;
	struct ckpt_refdelta *dv; /* the merged delta of the last attempt */
	size_t ndv, cap;
};

/* In one transaction, replace the extent lists of the files and apply the
 * refcount changes, reading every record the result depends on (inode,
 * old extent list, chunk records) for update. */
static int commit_txn(ckpt_txn *t, void *arg)
{
	struct commit_arg *a = arg;
	const struct ckpt_commit_env *env = a->env;
	int r = env->fence ? env->fence(env->arg, t) : 0;

	if (r < 0)
		return r;
	a->ndv = 0;
	for (size_t i = 0; i < a->n; i++) {
		const struct ckpt_content *c = &a->v[i];
		struct ckpt_extent_list *old = NULL;
		struct ckpt_inode in;
		uint8_t key[16], *enc = NULL;
		size_t enclen;

		r = ckpt_meta_get_inode(env->eng, t, c->ino, &in);
		if (r == -ENOENT || (r == 0 && !S_ISREG(in.mode))) {
			r = 0; /* deleted meanwhile */
			continue;
		}
		if (r == 0) {
			r = ckpt_meta_get_extents(env->eng, t, c->ino, &old);
			if (r == -EIO)
				ckpt_err("%s: extent list of inode %" PRIu64 " is damaged", env->name,
					 c->ino);
		}
		if (r == 0)
			r = delta_add(&a->dv, &a->ndv, &a->cap, c->list, 1);
		if (r == 0)
			r = delta_add(&a->dv, &a->ndv, &a->cap, old, -1);
		ckpt_extent_list_free(old);
		if (r < 0)
			return r;
		ckpt_key_ino(key, CKPT_KEY_FILE, c->ino);
		if (c->list->n > 0) {
			r = ckpt_extent_list_encode(c->list, &enc, &enclen);
			if (r < 0)
				return r;
			ckpt_txn_put(t, key, 9, enc, enclen);
			free(enc);
		} else {
			ckpt_txn_delete(t, key, 9);
		}
		in.size = c->list->size;
		in.flags = c->flags;
		in.mtime_ns = c->mtime_ns;
		in.ctime_ns = c->mtime_ns;
		ckpt_meta_put_inode(t, &in);
	}
	a->ndv = delta_merge(a->dv, a->ndv);
	return ckpt_refdelta_apply(env, t, a->dv, a->ndv);
}

int ckpt_content_commit(const struct ckpt_commit_env *env, const struct ckpt_content *v, size_t n,
			bool durable, ckpt_digest **ret_added, size_t *ret_nadded)
{
	struct commit_arg a = { .env = env, .v = v, .n = n };
	int r = ckpt_txn_run(env->eng, commit_txn, &a, durable);

	if (r == 0 && ret_added) {
		ckpt_digest *added = malloc((a.ndv ? a.ndv : 1) * sizeof(*added));
		size_t k = 0;

		if (!added) {
			r = -ENOMEM; /* committed: the caller keeps its unindexed entries */
		} else {
			for (size_t i = 0; i < a.ndv; i++)
				if (a.dv[i].n > 0)
					added[k++] = a.dv[i].d;
			*ret_added = added;
			*ret_nadded = k;
		}
	}
	free(a.dv);
	return r;
}
