/* SPDX-License-Identifier: MIT */
/*
 * verify.c - reading back stored chunks (`ckpt verify`): every indexed
 * chunk, a random sample of them or a byte budget's worth, each read from
 * the chunk backend with its record checksum, decompressed and checked
 * against its digest; and the progress hook of fsck and gc.
 *
 * A live store.  With a store opened CKPT_STORE_RO_SHARED while a daemon
 * runs, the index this process sees is the engine's state when it was
 * opened (a read-only view), and the daemon's background work keeps moving
 * chunks (compression, compaction) and deleting the units they left.  A
 * read of a chunk at the location an older view names can then fail
 * although nothing is damaged.  So a failed read is only a suspicion: the
 * chunk is looked up again in a view opened after the read failed (a new
 * read-only open of the same store).  The daemon deletes a unit only after
 * the index no longer names it, durably; so if the newer view still names
 * the location that failed, the unit existed when it was read, its record
 * (never rewritten in place) was what failed, and the chunk is damaged.  If
 * the newer view names another location, the chunk is read there (and the
 * same rule applies to that read); if it names none, the chunk was dropped
 * meanwhile (gc) and there is nothing to check.  A store opened with the
 * lock (nothing else changes it) takes every failed read as damage.
 */
#include "store/store_int.h"

#include "base/progress.h"

#define VERIFY_ROUNDS 8 /* views opened for chunks that keep moving */

void ckpt_store_set_progress(ckpt_store *s, const struct ckpt_progress *p)
{
	s->progress = p;
}

/* splitmix64: the selection order (not security relevant) */
static uint64_t next_rand(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Read chunk d at loc, check its record, decompress into dst and check the
 * digest.  0, or -EIO with *ret_why set, or another -errno (out of memory:
 * no verdict).  Quiet: the caller decides whether a failure is damage. */
static int check_chunk(ckpt_store *s, const ckpt_digest *d, const struct ckpt_chunk_loc *loc,
		       uint8_t *dst, const char **ret_why)
{
	int r;

	if (loc->raw_len > CKPT_CHUNK_MAX || loc->raw_len == 0) {
		*ret_why = "index entry has an impossible length";
		return -EIO;
	}
	r = st_check_chunk(s, d, loc, dst, true, ret_why);
	if (r < 0 && r != -ENOMEM) {
		if (!*ret_why)
			*ret_why = strerror(-r);
		r = -EIO;
	}
	return r;
}

/* A chunk whose read failed, waiting for a newer view. */
struct suspect {
	ckpt_digest d;
	struct ckpt_chunk_loc loc;
	const char *why;
};

static void report_chunk(ckpt_store *s, const struct suspect *c, ckpt_verify_report_fn cb,
			 void *ud)
{
	char hex[2 * CKPT_DIGEST_LEN + 1], at[CKPT_CHUNK_DESC_MAX], msg[512];

	ckpt_digest_to_hex(&c->d, hex);
	ckpt_cb_describe(s->cb, &c->loc, at, sizeof(at));
	snprintf(msg, sizeof(msg), "chunk %s (%s) is damaged: %s", hex, at, c->why);
	cb(ud, NULL, msg);
}

static int suspect_cmp(const void *a, const void *b)
{
	return memcmp(((const struct suspect *)a)->d.bytes, ((const struct suspect *)b)->d.bytes,
		      CKPT_DIGEST_LEN);
}

/* Name the files whose extents use the damaged chunks bad[0..n) (sorted by
 * digest), through cb, from the file records of view s. */
static int report_files(ckpt_store *s, const struct suspect *bad, size_t n,
			ckpt_verify_report_fn cb, void *ud)
{
	uint8_t prefix[1] = { CKPT_KEY_FILE };
	const uint8_t *k, *v;
	size_t kl, vl;
	struct name_ent *names = NULL;
	size_t nnames = 0;
	ckpt_scan *it;
	char msg[512];
	int r = st_load_names(s, &names, &nnames);

	if (r < 0)
		return r;
	r = ckpt_scan_new(s->eng, NULL, prefix, 1, NULL, 0, &it);
	if (r < 0)
		goto out;
	while ((r = ckpt_scan_next(it, &k, &kl, &v, &vl)) > 0) {
		struct ckpt_extent_list *l = NULL;
		char *path = NULL;

		if (kl != 9 || ckpt_extent_list_decode(v, vl, &l) < 0)
			continue; /* fsck's business: verify checks chunks */
		for (size_t i = 0; i < l->n; i++) {
			struct suspect key;
			char hex[2 * CKPT_DIGEST_LEN + 1];

			if (l->v[i].kind != CKPT_EXT_CHUNK)
				continue;
			key.d = l->v[i].digest;
			if (!bsearch(&key, bad, n, sizeof(*bad), suspect_cmp))
				continue;
			if (!path)
				path = st_name_path(names, nnames, ckpt_get_be64(k + 1));
			ckpt_digest_to_hex(&key.d, hex);
			snprintf(msg, sizeof(msg),
				 "damaged data at offset %" PRIu64 " (%" PRIu32 " bytes, chunk %s)",
				 l->v[i].off, l->v[i].len, hex);
			cb(ud, path ? path : "?", msg);
		}
		free(path);
		ckpt_extent_list_free(l);
	}
	ckpt_scan_free(it);
out:
	for (size_t i = 0; i < nnames; i++)
		free(names[i].name);
	free(names);
	return r;
}

/* A new read-only view of s's store (a few tries: an open can fail while
 * the daemon replaces the engine's files under it). */
static int fresh_view(ckpt_store *s, ckpt_store **ret)
{
	struct ckpt_store_opts o;
	char err[512];
	int r = -EIO;

	ckpt_store_opts_init(&o);
	o.mode = CKPT_STORE_RO_SHARED;
	o.cache_size = 0;
	o.chunk_backend = s->opts.chunk_backend;
	o.meta_engine = s->opts.meta_engine;
	o.meta_where = s->opts.meta_where;
	for (int tries = 0; tries < 10; tries++) {
		r = ckpt_store_open(s->path, &o, ret, err, sizeof(err));
		if (r == 0 || r == -ENOMEM)
			break;
		usleep(50 * 1000);
	}
	if (r < 0)
		ckpt_err("%s", err);
	return r;
}

int ckpt_store_verify(ckpt_store *s, const struct ckpt_verify_opts *o, ckpt_verify_report_fn cb,
		      void *ud, struct ckpt_verify_stats *ret)
{
	struct chunk_info *chunks = NULL;
	struct suspect *sus = NULL, *bad = NULL;
	size_t nchunks = 0, *order = NULL, nsel = 0, nsus = 0, nbad = 0;
	uint64_t seed, done = 0, total = 0;
	ckpt_store *view = NULL; /* the newest view opened here (not s) */
	uint8_t *dst = NULL;
	bool live = s->opts.mode == CKPT_STORE_RO_SHARED;
	int r;

	memset(ret, 0, sizeof(*ret));
	if (o->sample_ppm > 1000000)
		return -EINVAL;
	r = st_load_chunks(s, &chunks, &nchunks);
	if (r < 0)
		return r;
	dst = malloc(CKPT_CHUNK_MAX);
	order = malloc((nchunks ? nchunks : 1) * sizeof(*order));
	sus = malloc((nchunks ? nchunks : 1) * sizeof(*sus));
	bad = malloc((nchunks ? nchunks : 1) * sizeof(*bad));
	if (!dst || !order || !sus || !bad) {
		r = -ENOMEM;
		goto out;
	}
	ret->chunks = nchunks;
	for (size_t i = 0; i < nchunks; i++) {
		order[i] = i;
		ret->bytes += chunks[i].loc.stored_len;
	}
	/* the selection: all, or a prefix of a random order */
	nsel = nchunks;
	if (o->sample_ppm || o->sample_count || o->byte_budget) {
		seed = o->seed ? o->seed : (uint64_t)ckpt_now_ns() ^ ((uint64_t)getpid() << 32);
		for (size_t i = nchunks; i > 1; i--) {
			size_t j = (size_t)(next_rand(&seed) % i), t = order[i - 1];
			order[i - 1] = order[j];
			order[j] = t;
		}
		if (o->sample_ppm)
			nsel = (size_t)(((unsigned __int128)nchunks * o->sample_ppm + 999999) / 1000000);
		if (o->sample_count && o->sample_count < nsel)
			nsel = (size_t)o->sample_count;
		if (o->byte_budget) {
			uint64_t sum = 0;
			size_t k = 0;

			while (k < nsel && sum < o->byte_budget)
				sum += chunks[order[k++]].loc.stored_len;
			nsel = k;
		}
	}
	ret->selected = nsel;
	for (size_t k = 0; k < nsel; k++)
		total += chunks[order[k]].loc.stored_len;
	ret->selected_bytes = total;
	ckpt_progress_report(o->progress, 0, total);
	for (size_t k = 0; k < nsel; k++) {
		const struct chunk_info *c = &chunks[order[k]];
		const char *why = NULL;

		r = check_chunk(s, &c->d, &c->loc, dst, &why);
		if (r == -EIO) {
			sus[nsus].d = c->d;
			sus[nsus].loc = c->loc;
			sus[nsus].why = why;
			nsus++;
		} else if (r < 0) {
			goto out;
		} else {
			ret->checked++;
			ret->checked_bytes += c->loc.stored_len;
			ret->raw_bytes += c->loc.raw_len;
		}
		done += c->loc.stored_len;
		ckpt_progress_report(o->progress, done, total);
	}
	/* the suspects, each in a view opened after its read failed */
	for (int round = 0; nsus > 0; round++) {
		ckpt_store *nv = NULL;
		size_t keep = 0;

		if (!live) {
			memcpy(bad + nbad, sus, nsus * sizeof(*sus));
			nbad += nsus;
			nsus = 0;
			break;
		}
		if (round == VERIFY_ROUNDS) {
			ret->unsettled = nsus;
			break;
		}
		r = fresh_view(s, &nv);
		if (r < 0)
			goto out;
		ckpt_store_free(view);
		view = nv;
		ret->views++;
		for (size_t i = 0; i < nsus; i++) {
			struct ckpt_chunk_loc now;
			const char *why = NULL;

			r = ckpt_meta_get_chunk(view->eng, NULL, &sus[i].d, &now, NULL);
			if (r == -ENOENT) {
				ret->vanished++;
				continue;
			}
			if (r < 0)
				goto out;
			if (ckpt_chunk_loc_same(&now, &sus[i].loc)) {
				bad[nbad++] = sus[i];
				continue;
			}
			r = check_chunk(view, &sus[i].d, &now, dst, &why);
			if (r == -EIO) {
				sus[keep].d = sus[i].d;
				sus[keep].loc = now;
				sus[keep].why = why;
				keep++;
			} else if (r < 0) {
				goto out;
			} else {
				ret->checked++;
				ret->moved++;
				ret->checked_bytes += now.stored_len;
				ret->raw_bytes += now.raw_len;
			}
		}
		nsus = keep;
	}
	ret->damaged = nbad;
	r = 0;
	if (nbad > 0) {
		ckpt_store *names = view ? view : s;

		for (size_t i = 0; i < nbad; i++)
			report_chunk(names, &bad[i], cb, ud);
		qsort(bad, nbad, sizeof(*bad), suspect_cmp);
		r = report_files(names, bad, nbad, cb, ud);
	}
	if (r == 0)
		r = (int)CKPT_MIN(nbad + ret->unsettled, (size_t)INT32_MAX);
out:
	ckpt_store_free(view);
	free(chunks);
	free(order);
	free(sus);
	free(bad);
	free(dst);
	return r;
}
