/* SPDX-License-Identifier: MIT */
/*
 * repair_ns.c - the second step of ckpt_store_repair (store.h): every
 * record of the kept index checked against the others and against the
 * chunk backend's record headers, and set right.  The rules, in order:
 *
 *  1. a record that does not decode is deleted (a chunk entry, a name, an
 *     inode: what depended on it is handled below);
 *  2. a chunk entry is valid when its unit holds, at its location, a record
 *     header with its digest, lengths and codec; a chunk a file needs whose
 *     entry is missing or invalid is looked up among every unit's record
 *     headers, and the first record that verifies whole (checksums,
 *     decoding, the keyed digest) becomes its entry;
 *  3. a regular file is lost when its extent list is damaged or missing
 *     (with a size above 0), covers another size than its inode, or needs
 *     a chunk no unit holds whole; a symbolic link when its target is
 *     missing or of another length.  A lost file's records are deleted and
 *     every name it had is reported;
 *  4. names of missing or lost inodes, names in what is not a directory,
 *     and second names of a directory are deleted;
 *  5. inodes no name reaches from the root are linked into /lost+found
 *     as "#INO" (directories first, so that their trees come along);
 *  6. link counts, the parents of directories, the type bits of names,
 *     reference counts and the next_ino / next_pack counters are set to
 *     what the records say.
 * Nothing is ever guessed: a file keeps its content only when every
 * record of it agrees and every chunk it names verifies.
 */
#include "store/store_int.h"

#include <stdarg.h>

struct rino {
	struct ckpt_inode in;
	struct ckpt_extent_list *ext; /* its F record, decoded */
	uint64_t l_len;               /* its L record's length */
	bool has_f, f_bad, has_l, has_o, has_p;
	bool lost, reached;
	uint32_t links, subdirs;
	uint64_t dparent; /* a directory: the directory its kept name is in */
};

struct rdent {
	uint64_t parent, child;
	uint32_t type; /* as stored */
	char *name;
	bool drop;
	bool retype; /* the type bits differ from the inode's */
};

struct rchunk {
	ckpt_digest d;
	struct ckpt_chunk_loc loc;
	uint64_t refs, counted;
	bool valid;   /* its location holds its record */
	bool moved;   /* re-pointed at another record */
	bool created; /* no entry existed */
};

struct rrec {
	struct ckpt_chunk_loc loc;
	struct ckpt_chunk_rec rec;
};

struct rctx {
	ckpt_store *s;
	ckpt_repair_fn cb;
	void *ud;
	struct ckpt_repair_stats *st;
	struct rino *inos;
	size_t ninos;
	struct rdent *dents; /* in key order: grouped by parent */
	size_t ndents;
	size_t *by_child; /* indexes into dents, sorted by child */
	struct rchunk *chunks;
	size_t nchunks;
	struct rrec *recs; /* every unit's records, sorted by location */
	size_t nrecs;
	uint64_t max_unit;
	size_t icap, dcap, ccap, rcap; /* capacities of the arrays above */
	/* the writes, in batches */
	ckpt_txn *t;
	size_t tops;
};

/* ---- reporting ---- */

static int rdent_child_cmp(const void *a, const void *b, void *arg)
{
	const struct rdent *d = arg;
	uint64_t x = d[*(const size_t *)a].child, y = d[*(const size_t *)b].child;

	return x < y ? -1 : x > y;
}

/* A name of ino: the path of its first name, or "<inode N>". */
static char *path_of(struct rctx *c, uint64_t ino)
{
	char *path = strdup(""), *np;

	for (int depth = 0; path && ino != CKPT_ROOT_INO && depth < 4096; depth++) {
		size_t lo = 0, hi = c->ndents;
		const struct rdent *e = NULL;

		while (lo < hi) {
			size_t mid = (lo + hi) / 2;
			if (c->dents[c->by_child[mid]].child < ino)
				lo = mid + 1;
			else
				hi = mid;
		}
		if (lo < c->ndents && c->dents[c->by_child[lo]].child == ino)
			e = &c->dents[c->by_child[lo]];
		if (!e) {
			if (asprintf(&np, "<inode %" PRIu64 ">%s", ino, path) < 0)
				np = NULL;
			free(path);
			return np;
		}
		if (asprintf(&np, "/%s%s", e->name, path) < 0)
			np = NULL;
		free(path);
		path = np;
		ino = e->parent;
	}
	if (path && !*path) {
		free(path);
		path = strdup("/");
	}
	return path;
}

static void report(struct rctx *c, enum ckpt_repair_kind kind, const char *path,
		   const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void report(struct rctx *c, enum ckpt_repair_kind kind, const char *path,
		   const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (kind == CKPT_REPAIR_LOST)
		c->st->files_lost++;
	else if (kind == CKPT_REPAIR_FIXED)
		c->st->fixed++;
	if (c->cb)
		c->cb(c->ud, kind, path, msg);
}

/* ---- writes ---- */

static int w_txn(struct rctx *c)
{
	int r;

	if (c->t && c->tops >= 4096) {
		r = ckpt_txn_commit(c->t, false);
		c->t = NULL;
		if (r < 0)
			return r;
	}
	c->tops++;
	if (c->t)
		return 0;
	c->tops = 1;
	return ckpt_txn_begin(c->s->eng, &c->t);
}

static int w_put(struct rctx *c, const void *k, size_t kl, const void *v, size_t vl)
{
	int r = w_txn(c);

	return r < 0 ? r : ckpt_txn_put(c->t, k, kl, v, vl);
}

static int w_del(struct rctx *c, const void *k, size_t kl)
{
	int r = w_txn(c);

	return r < 0 ? r : ckpt_txn_delete(c->t, k, kl);
}

static int w_del_ino(struct rctx *c, char type, uint64_t ino)
{
	uint8_t key[16];

	return w_del(c, key, ckpt_key_ino(key, type, ino));
}

static int w_done(struct rctx *c)
{
	int r = 0;

	if (c->t)
		r = ckpt_txn_commit(c->t, true);
	c->t = NULL;
	return r;
}

/* ---- loading ---- */

static struct rino *find_ino(struct rctx *c, uint64_t ino)
{
	size_t lo = 0, hi = c->ninos;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (c->inos[mid].in.ino < ino)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < c->ninos && c->inos[lo].in.ino == ino ? &c->inos[lo] : NULL;
}

static int grow(void **v, size_t *cap, size_t n, size_t sz)
{
	size_t nc;
	void *nv;

	if (n < *cap)
		return 0;
	nc = *cap ? *cap * 2 : 256;
	nv = realloc(*v, nc * sz);
	if (!nv)
		return -ENOMEM;
	*v = nv;
	*cap = nc;
	return 0;
}

/* Scan every key of type `type`, calling fn with each. */
static int scan_type(struct rctx *c, uint8_t type,
		     int (*fn)(struct rctx *c, const uint8_t *k, size_t kl, const uint8_t *v,
			       size_t vl))
{
	const uint8_t *k, *v;
	size_t kl, vl;
	ckpt_scan *it;
	int r = ckpt_scan_new(c->s->eng, NULL, &type, 1, NULL, 0, &it);

	if (r < 0)
		return r;
	while ((r = ckpt_scan_next(it, &k, &kl, &v, &vl)) > 0) {
		r = fn(c, k, kl, v, vl);
		if (r < 0)
			break;
	}
	ckpt_scan_free(it);
	return r;
}

static int drop_key(struct rctx *c, const uint8_t *k, size_t kl, const char *what)
{
	report(c, CKPT_REPAIR_FIXED, NULL, "%s (key type '%c', %zu bytes) does not decode: "
	       "deleted", what, k[0], kl);
	return w_del(c, k, kl);
}

static int load_inode(struct rctx *c, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl)
{
	struct ckpt_inode in;
	int r;

	if (kl != 9 || ckpt_inode_decode(ckpt_get_be64(k + 1), v, vl, &in) < 0)
		return drop_key(c, k, kl, "an inode record");
	r = grow((void **)&c->inos, &c->icap, c->ninos, sizeof(*c->inos));
	if (r < 0)
		return r;
	memset(&c->inos[c->ninos], 0, sizeof(c->inos[0]));
	c->inos[c->ninos++].in = in;
	return 0;
}

static int load_dent(struct rctx *c, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl)
{
	struct rdent *e;
	uint64_t child;
	uint32_t type;
	int r;

	if (kl < 10 || kl > 9 + CKPT_NAME_MAX || memchr(k + 9, '/', kl - 9) ||
	    memchr(k + 9, '\0', kl - 9) || ckpt_dentry_decode(v, vl, &child, &type) < 0)
		return drop_key(c, k, kl, "a directory entry");
	r = grow((void **)&c->dents, &c->dcap, c->ndents, sizeof(*c->dents));
	if (r < 0)
		return r;
	e = &c->dents[c->ndents];
	memset(e, 0, sizeof(*e));
	e->parent = ckpt_get_be64(k + 1);
	e->child = child;
	e->type = type;
	e->name = strndup((const char *)k + 9, kl - 9);
	if (!e->name)
		return -ENOMEM;
	c->ndents++;
	return 0;
}

/* F, L, O and P records: attached to their inode, deleted without one. */
static int load_attached(struct rctx *c, const uint8_t *k, size_t kl, const uint8_t *v,
			 size_t vl)
{
	struct rino *i = kl == 9 ? find_ino(c, ckpt_get_be64(k + 1)) : NULL;

	if (kl != 9)
		return drop_key(c, k, kl, "a per-inode record");
	if (!i) {
		report(c, CKPT_REPAIR_FIXED, NULL,
		       "a '%c' record of inode %" PRIu64 ", which has no inode record: deleted", k[0],
		       ckpt_get_be64(k + 1));
		return w_del(c, k, kl);
	}
	switch (k[0]) {
	case CKPT_KEY_FILE:
		i->has_f = true;
		if (ckpt_extent_list_decode(v, vl, &i->ext) < 0)
			i->f_bad = true;
		break;
	case CKPT_KEY_LINK:
		i->has_l = true;
		i->l_len = vl;
		break;
	case CKPT_KEY_ORPHAN:
		i->has_o = true;
		break;
	default:
		i->has_p = true;
		break;
	}
	return 0;
}

static int load_chunk(struct rctx *c, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl)
{
	struct rchunk *e;
	int r;

	if (kl != 1 + CKPT_DIGEST_LEN)
		return drop_key(c, k, kl, "a chunk entry");
	r = grow((void **)&c->chunks, &c->ccap, c->nchunks, sizeof(*c->chunks));
	if (r < 0)
		return r;
	e = &c->chunks[c->nchunks];
	memset(e, 0, sizeof(*e));
	if (ckpt_chunk_rec_decode(v, vl, &e->loc, &e->refs) < 0)
		return drop_key(c, k, kl, "a chunk entry");
	memcpy(e->d.bytes, k + 1, CKPT_DIGEST_LEN);
	c->nchunks++;
	return 0;
}

static int scan_rec(void *ud, const struct ckpt_chunk_loc *loc, const struct ckpt_chunk_rec *rec)
{
	struct rctx *c = ud;
	int r = grow((void **)&c->recs, &c->rcap, c->nrecs, sizeof(*c->recs));

	if (r < 0)
		return r;
	c->recs[c->nrecs].loc = *loc;
	c->recs[c->nrecs].rec = *rec;
	c->nrecs++;
	return 0;
}

static int rrec_cmp(const void *a, const void *b)
{
	return memcmp(((const struct rrec *)a)->loc.where, ((const struct rrec *)b)->loc.where,
		      CKPT_CHUNK_WHERE_LEN);
}

static int rchunk_cmp(const void *a, const void *b)
{
	return memcmp(((const struct rchunk *)a)->d.bytes, ((const struct rchunk *)b)->d.bytes,
		      CKPT_DIGEST_LEN);
}

/* Every record header of every unit. */
static int load_units(struct rctx *c)
{
	struct ckpt_chunk_unit *u = NULL;
	size_t n = 0;
	int r = ckpt_cb_units(c->s->cb, &u, &n);

	if (r < 0)
		return r;
	for (size_t i = 0; i < n && r >= 0; i++) {
		if (u[i].id > c->max_unit)
			c->max_unit = u[i].id;
		r = ckpt_cb_scan(c->s->cb, u[i].id, scan_rec, c);
		if (r < 0) { /* a unit that cannot be read holds nothing usable */
			char msg[64];
			snprintf(msg, sizeof(msg), "unit %" PRIu64, u[i].id);
			report(c, CKPT_REPAIR_NOTE, NULL, "%s cannot be read (%s): its records are "
			       "not used", msg, strerror(-r));
			r = 0;
		}
	}
	free(u);
	if (r == 0 && c->nrecs)
		qsort(c->recs, c->nrecs, sizeof(*c->recs), rrec_cmp);
	return r;
}

static const struct rrec *rec_at(struct rctx *c, const struct ckpt_chunk_loc *loc)
{
	struct rrec key;

	memcpy(key.loc.where, loc->where, CKPT_CHUNK_WHERE_LEN);
	return c->nrecs ? bsearch(&key, c->recs, c->nrecs, sizeof(*c->recs), rrec_cmp) : NULL;
}

static bool rec_matches(const struct rrec *x, const ckpt_digest *d, const struct ckpt_chunk_loc *l)
{
	return x && !memcmp(x->rec.digest, d->bytes, CKPT_DIGEST_LEN) &&
	       x->rec.stored_len == l->stored_len && x->rec.raw_len == l->raw_len &&
	       x->rec.codec == l->codec;
}

static struct rchunk *find_chunk(struct rctx *c, const ckpt_digest *d)
{
	struct rchunk key;

	key.d = *d;
	return c->nchunks ? bsearch(&key, c->chunks, c->nchunks, sizeof(*c->chunks), rchunk_cmp) :
			    NULL;
}

/* ---- chunks ---- */

static int digest_cmp(const void *a, const void *b)
{
	return memcmp(a, b, CKPT_DIGEST_LEN);
}

static int rec_digest_cmp(const void *a, const void *b, void *arg)
{
	const struct rrec *r = arg;

	return memcmp(r[*(const size_t *)a].rec.digest, r[*(const size_t *)b].rec.digest,
		      CKPT_DIGEST_LEN);
}

/* A record of digest d that verifies whole, among every unit's records
 * (by_digest: their indexes sorted by digest). */
static bool relocate(struct rctx *c, const size_t *by_digest, const ckpt_digest *d, uint8_t *buf,
		     struct ckpt_chunk_loc *ret)
{
	size_t lo = 0, hi = c->nrecs;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (memcmp(c->recs[by_digest[mid]].rec.digest, d->bytes, CKPT_DIGEST_LEN) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < c->nrecs; lo++) {
		const struct rrec *x = &c->recs[by_digest[lo]];
		struct ckpt_chunk_loc loc;

		if (memcmp(x->rec.digest, d->bytes, CKPT_DIGEST_LEN) != 0)
			break;
		if (x->rec.raw_len > CKPT_CHUNK_MAX)
			continue;
		memset(&loc, 0, sizeof(loc));
		memcpy(loc.where, x->loc.where, CKPT_CHUNK_WHERE_LEN);
		loc.stored_len = x->rec.stored_len;
		loc.raw_len = x->rec.raw_len;
		loc.codec = x->rec.codec;
		if (st_verify_chunk(c->s, d, &loc, buf, true) == 0) {
			*ret = loc;
			return true;
		}
	}
	return false;
}

/* Rule 2: every chunk entry checked, and the chunks files need that have no
 * valid entry looked for. */
static int check_chunks(struct rctx *c)
{
	ckpt_digest *need = NULL;
	size_t nneed = 0, cap = 0, nold = c->nchunks, *by_digest = NULL;
	uint8_t *buf = NULL;
	int r = 0;

	for (size_t i = 0; i < c->nchunks; i++)
		c->chunks[i].valid = rec_matches(rec_at(c, &c->chunks[i].loc), &c->chunks[i].d,
						 &c->chunks[i].loc);
	for (size_t i = 0; i < c->ninos; i++) {
		struct ckpt_extent_list *l = c->inos[i].ext;
		for (size_t j = 0; l && j < l->n; j++) {
			struct rchunk *e;
			if (l->v[j].kind != CKPT_EXT_CHUNK)
				continue;
			e = find_chunk(c, &l->v[j].digest);
			if (e && e->valid)
				continue;
			r = grow((void **)&need, &cap, nneed, sizeof(*need));
			if (r < 0)
				goto out;
			need[nneed++] = l->v[j].digest;
		}
	}
	if (!nneed)
		goto out;
	qsort(need, nneed, sizeof(*need), digest_cmp);
	buf = malloc(CKPT_CHUNK_MAX);
	by_digest = malloc((c->nrecs ? c->nrecs : 1) * sizeof(*by_digest));
	if (!buf || !by_digest) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < c->nrecs; i++)
		by_digest[i] = i;
	qsort_r(by_digest, c->nrecs, sizeof(*by_digest), rec_digest_cmp, c->recs);
	for (size_t i = 0; i < nneed; i++) {
		struct ckpt_chunk_loc loc;
		struct rchunk *e;
		char hex[33];

		if (i && !memcmp(&need[i], &need[i - 1], sizeof(need[i])))
			continue;
		ckpt_digest_to_hex(&need[i], hex);
		if (!relocate(c, by_digest, &need[i], buf, &loc))
			continue; /* the files that need it are lost (check_files) */
		e = find_chunk(c, &need[i]);
		if (e) {
			report(c, CKPT_REPAIR_FIXED, NULL,
			       "chunk %s: its entry named no intact record; it now names one that "
			       "verifies", hex);
		} else {
			r = grow((void **)&c->chunks, &c->ccap, c->nchunks, sizeof(*c->chunks));
			if (r < 0)
				goto out;
			e = &c->chunks[c->nchunks++];
			memset(e, 0, sizeof(*e));
			e->d = need[i];
			e->created = true;
			report(c, CKPT_REPAIR_FIXED, NULL,
			       "chunk %s: no entry; one was made for a record that verifies", hex);
		}
		e->loc = loc;
		e->valid = true;
		e->moved = true;
		c->st->chunks_relocated++;
	}
	if (c->nchunks != nold)
		qsort(c->chunks, c->nchunks, sizeof(*c->chunks), rchunk_cmp);
out:
	free(by_digest);
	free(buf);
	free(need);
	return r;
}

/* ---- files ---- */

static void lose(struct rctx *c, struct rino *i, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void lose(struct rctx *c, struct rino *i, const char *fmt, ...)
{
	char why[512];
	va_list ap;
	bool named = false;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	i->lost = true;
	/* every name of it */
	for (size_t j = 0; j < c->ndents; j++) {
		char *p;
		if (c->dents[j].child != i->in.ino)
			continue;
		p = path_of(c, c->dents[j].parent);
		if (p) {
			char *full = NULL;
			if (asprintf(&full, "%s%s%s", p, strcmp(p, "/") ? "/" : "",
				     c->dents[j].name) >= 0)
				report(c, CKPT_REPAIR_LOST, full, "%s", why);
			free(full);
		}
		free(p);
		named = true;
	}
	if (!named) {
		char p[64];
		snprintf(p, sizeof(p), "<inode %" PRIu64 ">", i->in.ino);
		report(c, CKPT_REPAIR_LOST, p, "%s", why);
	}
}

/* Rule 3. */
static void check_files(struct rctx *c)
{
	for (size_t n = 0; n < c->ninos; n++) {
		struct rino *i = &c->inos[n];
		struct ckpt_extent_list *l = i->ext;

		if (S_ISLNK(i->in.mode)) {
			if (!i->has_l)
				lose(c, i, "symbolic link without its target");
			else if (i->l_len != i->in.size)
				lose(c, i, "symbolic link target of %" PRIu64 " bytes, its inode says %"
				     PRIu64, i->l_len, i->in.size);
			continue;
		}
		if (!S_ISREG(i->in.mode))
			continue;
		if (i->f_bad) {
			lose(c, i, "its extent list is damaged");
			continue;
		}
		if (!i->has_f) {
			if (i->in.size)
				lose(c, i, "its extent list is missing (size %" PRIu64 ")", i->in.size);
			continue;
		}
		if (l->size != i->in.size) {
			lose(c, i, "its extents cover %" PRIu64 " bytes, its inode says %" PRIu64,
			     l->size, i->in.size);
			continue;
		}
		for (size_t j = 0; j < l->n; j++) {
			struct rchunk *e;
			char hex[33];

			if (l->v[j].kind != CKPT_EXT_CHUNK)
				continue;
			e = find_chunk(c, &l->v[j].digest);
			ckpt_digest_to_hex(&l->v[j].digest, hex);
			if (!e || !e->valid) {
				lose(c, i, "chunk %s (offset %" PRIu64 ", %" PRIu32
				     " bytes) is in no unit of the chunk backend", hex, l->v[j].off,
				     l->v[j].len);
				break;
			}
			if (l->v[j].len > e->loc.raw_len) {
				lose(c, i, "extent at offset %" PRIu64 " is longer than chunk %s",
				     l->v[j].off, hex);
				break;
			}
		}
	}
}

/* ---- names ---- */

/* Rule 4 (the part that needs no walk). */
static void check_names(struct rctx *c)
{
	for (size_t j = 0; j < c->ndents; j++) {
		struct rdent *e = &c->dents[j];
		struct rino *p = find_ino(c, e->parent), *ch = find_ino(c, e->child);

		if (!ch) {
			char *pp = path_of(c, e->parent), *full = NULL;
			if (pp && asprintf(&full, "%s%s%s", pp, strcmp(pp, "/") ? "/" : "",
					   e->name) >= 0)
				report(c, CKPT_REPAIR_LOST, full, "its inode record is missing or "
				       "damaged");
			free(full);
			free(pp);
			e->drop = true;
		} else if (ch->lost) {
			e->drop = true; /* reported by lose() */
		} else if (!p || !S_ISDIR(p->in.mode) || p->lost) {
			e->drop = true; /* its child may still be reached: rule 5 */
		} else if ((e->type & S_IFMT) != (ch->in.mode & S_IFMT)) {
			e->retype = true;
		}
	}
}

/* The range of dents in directory dir (dents are grouped by parent). */
static void dents_of(struct rctx *c, uint64_t dir, size_t *ret_lo, size_t *ret_hi)
{
	size_t lo = 0, hi = c->ndents, end;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (c->dents[mid].parent < dir)
			lo = mid + 1;
		else
			hi = mid;
	}
	end = lo;
	while (end < c->ndents && c->dents[end].parent == dir)
		end++;
	*ret_lo = lo;
	*ret_hi = end;
}

/* Walk the tree from dir (reached already), keeping the first name of each
 * directory. */
static int walk(struct rctx *c, uint64_t dir)
{
	uint64_t *q = NULL;
	size_t qn = 0, qcap = 0, qh = 0;
	int r = grow((void **)&q, &qcap, qn, sizeof(*q));

	if (r < 0)
		return r;
	q[qn++] = dir;
	while (qh < qn) {
		uint64_t d = q[qh++];
		struct rino *di = find_ino(c, d);
		size_t lo, hi;

		dents_of(c, d, &lo, &hi);
		for (size_t j = lo; j < hi; j++) {
			struct rdent *e = &c->dents[j];
			struct rino *ch;

			if (e->drop)
				continue;
			ch = find_ino(c, e->child);
			if (!S_ISDIR(ch->in.mode)) {
				ch->links++;
				ch->reached = true;
				continue;
			}
			if (ch->reached) {
				e->drop = true; /* a second name of a directory, or a cycle */
				report(c, CKPT_REPAIR_FIXED, NULL,
				       "directory inode %" PRIu64 " had a second name '%s' in inode %"
				       PRIu64 ": removed", ch->in.ino, e->name, d);
				continue;
			}
			ch->reached = true;
			ch->dparent = d;
			di->subdirs++;
			r = grow((void **)&q, &qcap, qn, sizeof(*q));
			if (r < 0)
				goto out;
			q[qn++] = ch->in.ino;
		}
	}
out:
	free(q);
	return r;
}

/* Rule 5: inodes no name reaches, linked into /lost+found. */
static int adopt(struct rctx *c, uint64_t *next_ino)
{
	struct rino *root = find_ino(c, CKPT_ROOT_INO), *lf = NULL;
	uint8_t key[CKPT_KEY_MAX], val[CKPT_DENTRY_REC_LEN];
	char lfname[32] = "lost+found";
	uint64_t lfino = 0;
	int r = 0;

	for (int pass = 0; pass < 2; pass++) {
		for (size_t n = 0; n < c->ninos; n++) {
			struct rino *i = &c->inos[n];
			char name[32];

			if (i->reached || i->lost || (i->has_o && i->in.nlink == 0) ||
			    (pass == 0) != S_ISDIR(i->in.mode))
				continue;
			if (!lf) { /* find or make /lost+found */
				size_t lo, hi;
				dents_of(c, CKPT_ROOT_INO, &lo, &hi);
				for (unsigned k = 0; !lf && k < 100; k++) {
					bool taken = false;
					if (k)
						snprintf(lfname, sizeof(lfname), "lost+found.%u", k);
					for (size_t j = lo; j < hi; j++) {
						struct rino *ch;
						if (c->dents[j].drop || strcmp(c->dents[j].name, lfname))
							continue;
						taken = true;
						ch = find_ino(c, c->dents[j].child);
						if (ch && S_ISDIR(ch->in.mode))
							lf = ch;
					}
					if (!taken)
						break;
				}
				if (!lf) { /* its inode is written at the end */
					lfino = (*next_ino)++;
					ckpt_dentry_encode(lfino, S_IFDIR, val);
					r = w_put(c, key,
						  ckpt_key_dentry(key, CKPT_ROOT_INO, lfname,
								  strlen(lfname)),
						  val, sizeof(val));
					if (r < 0)
						return r;
					root->subdirs++;
					report(c, CKPT_REPAIR_FIXED, NULL, "/%s made", lfname);
				} else {
					lfino = lf->in.ino;
				}
			}
			snprintf(name, sizeof(name), "#%" PRIu64, i->in.ino);
			ckpt_dentry_encode(i->in.ino, i->in.mode & S_IFMT, val);
			r = w_put(c, key, ckpt_key_dentry(key, lfino, name, strlen(name)), val,
				  sizeof(val));
			if (r < 0)
				return r;
			report(c, CKPT_REPAIR_FIXED, NULL,
			       "inode %" PRIu64 " had no name reached from the root: linked as /%s/%s",
			       i->in.ino, lfname, name);
			i->reached = true;
			if (S_ISDIR(i->in.mode)) {
				i->dparent = lfino;
				if (lf)
					lf->subdirs++;
				r = walk(c, i->in.ino);
				if (r < 0)
					return r;
			} else {
				i->links++;
			}
		}
	}
	if (lfino && !lf) {
		/* the new /lost+found: its link count from what went into it */
		struct ckpt_inode in = { 0 };
		uint32_t sub = 0;

		for (size_t n = 0; n < c->ninos; n++)
			if (S_ISDIR(c->inos[n].in.mode) && c->inos[n].dparent == lfino &&
			    c->inos[n].reached)
				sub++;
		in.ino = lfino;
		in.mode = S_IFDIR | 0700;
		in.nlink = 2 + sub;
		in.parent = CKPT_ROOT_INO;
		in.generation = 1;
		in.atime_ns = in.mtime_ns = in.ctime_ns = ckpt_now_ns();
		r = w_txn(c);
		if (r == 0)
			ckpt_meta_put_inode(c->t, &in);
	}
	return r;
}

/* ---- the whole check ---- */

static void free_ctx(struct rctx *c)
{
	if (c->t)
		ckpt_txn_abort(c->t);
	for (size_t i = 0; i < c->ninos; i++)
		ckpt_extent_list_free(c->inos[i].ext);
	for (size_t i = 0; i < c->ndents; i++)
		free(c->dents[i].name);
	free(c->inos);
	free(c->dents);
	free(c->by_child);
	free(c->chunks);
	free(c->recs);
}

int st_repair_check(ckpt_store *s, ckpt_repair_fn cb, void *ud, struct ckpt_repair_stats *st)
{
	struct rctx c = { .s = s, .cb = cb, .ud = ud, .st = st };
	uint64_t next_ino = 0, next_pack = 0, max_ino = CKPT_ROOT_INO;
	uint8_t key[CKPT_KEY_MAX];
	struct rino *root;
	int r;

	pthread_mutex_lock(&s->ns_lock);
	r = scan_type(&c, CKPT_KEY_INODE, load_inode);
	if (r == 0)
		r = scan_type(&c, CKPT_KEY_DENTRY, load_dent);
	if (r == 0)
		r = scan_type(&c, CKPT_KEY_FILE, load_attached);
	if (r == 0)
		r = scan_type(&c, CKPT_KEY_LINK, load_attached);
	if (r == 0)
		r = scan_type(&c, CKPT_KEY_ORPHAN, load_attached);
	if (r == 0)
		r = scan_type(&c, CKPT_KEY_PARSED, load_attached);
	if (r == 0)
		r = scan_type(&c, CKPT_KEY_CHUNK, load_chunk);
	if (r == 0)
		r = load_units(&c);
	if (r < 0)
		goto out;
	c.by_child = malloc((c.ndents ? c.ndents : 1) * sizeof(*c.by_child));
	if (!c.by_child) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t j = 0; j < c.ndents; j++)
		c.by_child[j] = j;
	qsort_r(c.by_child, c.ndents, sizeof(*c.by_child), rdent_child_cmp, c.dents);
	if (ckpt_meta_get_u64(s->eng, NULL, "next_ino", &next_ino) < 0)
		next_ino = 0;
	if (ckpt_meta_get_u64(s->eng, NULL, "next_pack", &next_pack) < 0)
		next_pack = 0;
	for (size_t i = 0; i < c.ninos; i++)
		if (c.inos[i].in.ino > max_ino)
			max_ino = c.inos[i].in.ino;
	if (next_ino <= max_ino)
		next_ino = max_ino + 1;

	/* the root */
	root = find_ino(&c, CKPT_ROOT_INO);
	if (!root || !S_ISDIR(root->in.mode)) {
		struct ckpt_inode in = { 0 };

		in.ino = CKPT_ROOT_INO;
		in.mode = S_IFDIR | 0755;
		in.nlink = 2;
		in.parent = CKPT_ROOT_INO;
		in.generation = 1;
		in.atime_ns = in.mtime_ns = in.ctime_ns = ckpt_now_ns();
		if (root) {
			root->in = in;
		} else {
			r = grow((void **)&c.inos, &c.icap, c.ninos, sizeof(*c.inos));
			if (r < 0)
				goto out;
			memmove(&c.inos[1], &c.inos[0], c.ninos * sizeof(*c.inos));
			memset(&c.inos[0], 0, sizeof(c.inos[0]));
			c.inos[0].in = in;
			c.ninos++;
			root = &c.inos[0];
		}
		report(&c, CKPT_REPAIR_FIXED, "/", "the root directory's inode was missing or not a "
		       "directory: made again");
		r = w_txn(&c);
		if (r < 0)
			goto out;
		ckpt_meta_put_inode(c.t, &in);
	}

	r = check_chunks(&c);
	if (r < 0)
		goto out;
	check_files(&c);
	check_names(&c);
	root->reached = true;
	root->dparent = CKPT_ROOT_INO;
	r = walk(&c, CKPT_ROOT_INO);
	if (r == 0)
		r = adopt(&c, &next_ino);
	if (r < 0)
		goto out;

	/* rule 6, and the records of lost files deleted */
	for (size_t j = 0; j < c.ndents && r == 0; j++) {
		struct rdent *e = &c.dents[j];
		size_t kl = ckpt_key_dentry(key, e->parent, e->name, strlen(e->name));

		if (e->drop) {
			r = w_del(&c, key, kl);
		} else if (e->retype) {
			uint8_t val[CKPT_DENTRY_REC_LEN];
			struct rino *ch = find_ino(&c, e->child);
			ckpt_dentry_encode(e->child, ch->in.mode & S_IFMT, val);
			report(&c, CKPT_REPAIR_FIXED, NULL, "entry '%s' in inode %" PRIu64
			       ": its type bits now match inode %" PRIu64, e->name, e->parent,
			       e->child);
			r = w_put(&c, key, kl, val, sizeof(val));
		}
	}
	for (size_t n = 0; n < c.ninos && r == 0; n++) {
		struct rino *i = &c.inos[n];
		uint32_t nlink;

		if (i->lost) {
			r = w_del_ino(&c, CKPT_KEY_INODE, i->in.ino);
			if (r == 0 && i->has_f)
				r = w_del_ino(&c, CKPT_KEY_FILE, i->in.ino);
			if (r == 0 && i->has_l)
				r = w_del_ino(&c, CKPT_KEY_LINK, i->in.ino);
			if (r == 0 && i->has_o)
				r = w_del_ino(&c, CKPT_KEY_ORPHAN, i->in.ino);
			if (r == 0 && i->has_p)
				r = w_del_ino(&c, CKPT_KEY_PARSED, i->in.ino);
			continue;
		}
		if (!i->reached) /* an orphan to reap */
			continue;
		if (i->has_f && !S_ISREG(i->in.mode)) {
			report(&c, CKPT_REPAIR_FIXED, NULL,
			       "inode %" PRIu64 " is not a regular file: its extent list deleted",
			       i->in.ino);
			r = w_del_ino(&c, CKPT_KEY_FILE, i->in.ino);
			if (r < 0)
				break;
		}
		if (i->has_l && !S_ISLNK(i->in.mode)) {
			report(&c, CKPT_REPAIR_FIXED, NULL, "inode %" PRIu64
			       " is not a symbolic link: its target deleted", i->in.ino);
			r = w_del_ino(&c, CKPT_KEY_LINK, i->in.ino);
			if (r < 0)
				break;
		}
		if (i->has_o) {
			r = w_del_ino(&c, CKPT_KEY_ORPHAN, i->in.ino);
			if (r < 0)
				break;
		}
		nlink = S_ISDIR(i->in.mode) ? 2 + i->subdirs : i->links;
		if (i->in.nlink != nlink ||
		    (S_ISDIR(i->in.mode) && i->in.parent != i->dparent)) {
			char *p = path_of(&c, i->in.ino);
			report(&c, CKPT_REPAIR_FIXED, p,
			       "link count %" PRIu32 " set to %" PRIu32 "%s", i->in.nlink, nlink,
			       S_ISDIR(i->in.mode) && i->in.parent != i->dparent ?
				       " and its parent set" :
				       "");
			free(p);
			i->in.nlink = nlink;
			if (S_ISDIR(i->in.mode))
				i->in.parent = i->dparent;
			r = w_txn(&c);
			if (r == 0)
				ckpt_meta_put_inode(c.t, &i->in);
		}
	}
	if (r < 0)
		goto out;

	/* reference counts, from the files kept */
	for (size_t n = 0; n < c.ninos; n++) {
		struct ckpt_extent_list *l = c.inos[n].ext;
		if (c.inos[n].lost || !S_ISREG(c.inos[n].in.mode) || !l)
			continue;
		for (size_t j = 0; j < l->n; j++) {
			struct rchunk *e;
			if (l->v[j].kind == CKPT_EXT_CHUNK && (e = find_chunk(&c, &l->v[j].digest)))
				e->counted++;
		}
	}
	for (size_t n = 0; n < c.nchunks && r == 0; n++) {
		struct rchunk *e = &c.chunks[n];
		uint8_t val[CKPT_CHUNK_REC_LEN];
		char hex[33];

		if (!e->valid) {
			ckpt_digest_to_hex(&e->d, hex);
			report(&c, CKPT_REPAIR_FIXED, NULL, "chunk %s: its entry names no intact "
			       "record and no file kept needs it: deleted", hex);
			r = w_del(&c, key, ckpt_key_chunk(key, &e->d));
			continue;
		}
		if (e->refs == e->counted && !e->moved)
			continue;
		if (e->refs != e->counted) {
			ckpt_digest_to_hex(&e->d, hex);
			report(&c, CKPT_REPAIR_FIXED, NULL, "chunk %s: reference count %" PRIu64
			       " set to %" PRIu64, hex, e->refs, e->counted);
		}
		ckpt_chunk_rec_encode(&e->loc, e->counted, val);
		r = w_put(&c, key, ckpt_key_chunk(key, &e->d), val, sizeof(val));
	}
	if (r == 0 && next_pack <= c.max_unit) {
		report(&c, CKPT_REPAIR_FIXED, NULL, "next_pack set to %" PRIu64, c.max_unit + 1);
		r = w_txn(&c);
		if (r == 0)
			ckpt_meta_put_u64(c.t, "next_pack", c.max_unit + 1);
	}
	if (r == 0) {
		uint64_t cur = 0;
		if (ckpt_meta_get_u64(s->eng, NULL, "next_ino", &cur) < 0 || cur < next_ino) {
			report(&c, CKPT_REPAIR_FIXED, NULL, "next_ino set to %" PRIu64, next_ino);
			r = w_txn(&c);
			if (r == 0)
				ckpt_meta_put_u64(c.t, "next_ino", next_ino);
		}
	}
	if (r == 0)
		r = w_done(&c);
out:
	pthread_mutex_unlock(&s->ns_lock);
	free_ctx(&c);
	return r;
}
