/* SPDX-License-Identifier: MIT */
/*
 * ckpt_du.c - `ckpt du STORE [PATH]`: for PATH and each directory directly
 * in it (a checkpoint step), its logical bytes, its unique bytes (the
 * stored bytes of the chunks nothing outside it uses: what deleting it
 * would free once the space is reclaimed) and its stored bytes (every chunk
 * it uses, compressed, each counted once).
 *
 * How: a read-only view of the index (CKPT_STORE_RO_SHARED: works while
 * mounted, and is one consistent state of the index).  Each subtree's files
 * are walked; every extent naming a chunk is counted per chunk.  A chunk's
 * reference count in the index is the number of extents naming it in all
 * files (store.h), so a chunk is unique to a subtree exactly when the
 * subtree's count equals the index's.  A file with hard links counts once
 * per subtree; one linked from inside and outside a subtree counts as
 * inside it (its chunks would not be freed by deleting the subtree alone).
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "ckpt_cmd.h"

/* ---- an open-addressing table of digests (or inode numbers) ---- */

struct dent {
	ckpt_digest d;
	uint64_t a, b; /* counts: extents, or stored bytes and refs */
	bool used;
};

struct dtab {
	struct dent *v;
	size_t cap, n; /* cap: a power of two */
};

static uint64_t dhash(const ckpt_digest *d)
{
	uint64_t h;

	memcpy(&h, d->bytes, sizeof(h)); /* a keyed digest: its bytes are uniform */
	return h;
}

static int dtab_grow(struct dtab *t)
{
	size_t cap = t->cap ? t->cap * 2 : 1024;
	struct dent *v = calloc(cap, sizeof(*v));

	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < t->cap; i++) {
		size_t j;

		if (!t->v[i].used)
			continue;
		for (j = dhash(&t->v[i].d) & (cap - 1); v[j].used; j = (j + 1) & (cap - 1))
			;
		v[j] = t->v[i];
	}
	free(t->v);
	t->v = v;
	t->cap = cap;
	return 0;
}

/* The entry of d, added (zeroed) if missing; NULL when out of memory.
 * *ret_new tells whether it was added. */
static struct dent *dtab_get(struct dtab *t, const ckpt_digest *d, bool *ret_new)
{
	size_t j;

	if ((t->n + 1) * 4 > t->cap * 3 && dtab_grow(t) < 0)
		return NULL;
	for (j = dhash(d) & (t->cap - 1); t->v[j].used; j = (j + 1) & (t->cap - 1))
		if (!memcmp(t->v[j].d.bytes, d->bytes, CKPT_DIGEST_LEN)) {
			*ret_new = false;
			return &t->v[j];
		}
	memset(&t->v[j], 0, sizeof(t->v[j]));
	t->v[j].d = *d;
	t->v[j].used = true;
	t->n++;
	*ret_new = true;
	return &t->v[j];
}

static void dtab_free(struct dtab *t)
{
	free(t->v);
	memset(t, 0, sizeof(*t));
}

/* An inode number as a table key (for files seen in a subtree). */
static ckpt_digest ino_key(uint64_t ino)
{
	ckpt_digest d;

	memset(&d, 0, sizeof(d));
	/* spread the bits for dhash: numbers are dense */
	ino *= 0x9e3779b97f4a7c15ull;
	memcpy(d.bytes, &ino, sizeof(ino));
	return d;
}

/* ---- one subtree ---- */

struct usage {
	uint64_t logical, unique, stored, files, chunks;
};

struct du {
	ckpt_store *s;
	const char *store;
	struct dtab info; /* digest -> stored bytes (a), refcount (b): the index's */
	bool failed;      /* an error was printed */
};

/* Count the extents of file ino in tab (each chunk: its extents). */
static int count_file(struct du *du, uint64_t ino, const char *path, struct dtab *tab)
{
	struct ckpt_extent_list *l = NULL;
	int r = ckpt_store_load_extents(du->s, ino, &l);

	if (r < 0) {
		fprintf(stderr, "ckpt: %s: %s: cannot read its extents: %s\n", du->store, path,
			strerror(-r));
		du->failed = true;
		return 0;
	}
	for (size_t i = 0; i < l->n; i++) {
		struct dent *e;
		bool fresh;

		if (l->v[i].kind != CKPT_EXT_CHUNK)
			continue;
		e = dtab_get(tab, &l->v[i].digest, &fresh);
		if (!e) {
			r = -ENOMEM;
			break;
		}
		e->a++;
	}
	ckpt_extent_list_free(l);
	return r;
}

/* Walk directory dir (at path) into tab (chunk extents) and seen (inodes),
 * adding its files' sizes to *u. */
static int walk(struct du *du, uint64_t dir, const char *path, struct dtab *tab,
		struct dtab *seen, struct usage *u)
{
	struct ckpt_dirent *ents = NULL;
	size_t n = 0;
	int r = ckpt_store_readdir(du->s, dir, &ents, &n);

	if (r < 0) {
		fprintf(stderr, "ckpt: %s: %s: cannot list: %s\n", du->store, path, strerror(-r));
		du->failed = true;
		return 0;
	}
	for (size_t i = 0; i < n && r == 0; i++) {
		char *sub = join(path, ents[i].name);
		struct ckpt_inode in;
		ckpt_digest k;
		struct dent *e;
		bool fresh;

		if (!sub) {
			r = -ENOMEM;
			break;
		}
		if (S_ISDIR(ents[i].mode)) {
			r = walk(du, ents[i].ino, sub, tab, seen, u);
		} else if (S_ISREG(ents[i].mode)) {
			k = ino_key(ents[i].ino);
			e = dtab_get(seen, &k, &fresh);
			if (!e) {
				r = -ENOMEM;
			} else if (fresh) {
				r = ckpt_store_getattr(du->s, ents[i].ino, &in);
				if (r < 0) {
					fprintf(stderr, "ckpt: %s: %s: %s\n", du->store, sub,
						strerror(-r));
					du->failed = true;
					r = 0;
				} else {
					u->files++;
					u->logical += in.size;
					r = count_file(du, ents[i].ino, sub, tab);
				}
			}
		}
		free(sub);
	}
	ckpt_dirents_free(ents, n);
	return r;
}

/* Fill u's chunk figures from tab (the subtree's extents per chunk). */
static int sum_chunks(struct du *du, struct dtab *tab, struct usage *u)
{
	for (size_t i = 0; i < tab->cap; i++) {
		struct dent *c = &tab->v[i], *e;
		bool fresh;

		if (!c->used)
			continue;
		e = dtab_get(&du->info, &c->d, &fresh);
		if (!e)
			return -ENOMEM;
		if (fresh) {
			struct ckpt_chunk_loc loc;
			uint64_t refs = 0;
			int r = ckpt_store_chunk_loc(du->s, &c->d, &loc, &refs);

			if (r < 0) {
				char hex[2 * CKPT_DIGEST_LEN + 1];

				ckpt_digest_to_hex(&c->d, hex);
				fprintf(stderr, "ckpt: %s: chunk %s: cannot look it up: %s (ckpt fsck "
						"names the files)\n", du->store, hex, strerror(-r));
				du->failed = true;
				loc.stored_len = 0;
				refs = UINT64_MAX; /* counted nowhere as unique */
			}
			e->a = loc.stored_len;
			e->b = refs;
		}
		u->chunks++;
		u->stored += e->a;
		if (c->a >= e->b)
			u->unique += e->a;
	}
	return 0;
}

/* The usage of directory dir at path (every file under it). */
static int usage_of(struct du *du, uint64_t dir, const char *path, struct usage *u)
{
	struct dtab tab = { 0 }, seen = { 0 };
	int r;

	memset(u, 0, sizeof(*u));
	r = walk(du, dir, path, &tab, &seen, u);
	if (r == 0)
		r = sum_chunks(du, &tab, u);
	dtab_free(&tab);
	dtab_free(&seen);
	return r;
}

static void human(char *buf, size_t len, uint64_t n)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	double v = (double)n;
	unsigned u = 0;

	while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
		v /= 1024;
		u++;
	}
	snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

static json_t *usage_json(const char *path, const struct usage *u)
{
	return json_pack("{s:s, s:I, s:I, s:I, s:I, s:I}", "path", path, "logical_bytes",
			 (json_int_t)u->logical, "unique_bytes", (json_int_t)u->unique,
			 "stored_bytes", (json_int_t)u->stored, "files", (json_int_t)u->files,
			 "chunks", (json_int_t)u->chunks);
}

static void usage_line(const char *path, const struct usage *u)
{
	char l[32], q[32], st[32];

	human(l, sizeof(l), u->logical);
	human(q, sizeof(q), u->unique);
	human(st, sizeof(st), u->stored);
	printf("%12s %12s %12s  %s\n", l, q, st, path);
}

int cmd_du(const char *store, const char *path, bool json)
{
	struct du du = { .store = store };
	struct ckpt_dirent *ents = NULL;
	json_t *rows = NULL, *doc = NULL;
	struct ckpt_inode in;
	struct usage total;
	size_t n = 0;
	int r, ret = 1;

	if (open_store(store, CKPT_STORE_RO_SHARED, &du.s) < 0)
		return 1;
	r = resolve(du.s, path, &in);
	if (r == 0 && !S_ISDIR(in.mode))
		r = -ENOTDIR;
	if (r == 0)
		r = ckpt_store_readdir(du.s, in.ino, &ents, &n);
	if (r < 0) {
		fprintf(stderr, "ckpt: %s: %s: %s\n", store, path, strerror(-r));
		goto out;
	}
	if (json && !(rows = json_array())) {
		r = -ENOMEM;
		goto fail;
	}
	if (!json)
		printf("%12s %12s %12s  %s\n", "LOGICAL", "UNIQUE", "STORED", "PATH");
	for (size_t i = 0; i < n; i++) {
		struct usage u;
		char *sub;

		if (!S_ISDIR(ents[i].mode))
			continue;
		sub = join(path, ents[i].name);
		if (!sub) {
			r = -ENOMEM;
			goto fail;
		}
		r = usage_of(&du, ents[i].ino, sub, &u);
		if (r == 0) {
			if (rows)
				r = json_array_append_new(rows, usage_json(sub, &u)) ? -ENOMEM : 0;
			else
				usage_line(sub, &u);
		}
		free(sub);
		if (r < 0)
			goto fail;
	}
	r = usage_of(&du, in.ino, path, &total);
	if (r < 0)
		goto fail;
	if (rows) {
		doc = json_pack("{s:s, s:s, s:o, s:o}", "store", store, "path", path,
				"directories", rows, "total", usage_json(path, &total));
		rows = NULL;
		if (print_json_doc(doc))
			goto out;
	} else {
		usage_line(path, &total);
	}
	ret = du.failed ? 1 : 0;
	goto out;
fail:
	fprintf(stderr, "ckpt: %s: %s: %s\n", store, path, strerror(-r));
out:
	json_decref(rows);
	ckpt_dirents_free(ents, n);
	dtab_free(&du.info);
	ckpt_store_free(du.s);
	return ret;
}
