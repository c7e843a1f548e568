/* SPDX-License-Identifier: MIT */
/*
 * commit.c - the overlay of closed files and its flusher, and commits of
 * their content: the chunks they reference are synced through the chunk
 * backend first, then meta/commit.h writes the index transaction.
 */
#include "store/store_int.h"


/* Make the records of the pending chunks that l references durable (I1):
 * the backend syncs each of their units once, up to the last of them. */
static int sync_pending_of(ckpt_store *s, const struct ckpt_extent_list *l)
{
	struct ckpt_chunk_loc locs[64];
	size_t n = 0;
	int r;

	for (size_t i = 0; i < l->n; i++) {
		if (l->v[i].kind != CKPT_EXT_CHUNK || !st_pending_find(s, &l->v[i].digest, &locs[n]))
			continue;
		if (++n == CKPT_ARRAY_SIZE(locs)) {
			r = ckpt_cb_sync(s->cb, locs, n);
			if (r < 0)
				return r;
			n = 0;
		}
	}
	return n ? ckpt_cb_sync(s->cb, locs, n) : 0;
}


int st_db_load_extents(ckpt_store *s, ckpt_txn *t, uint64_t ino,
		       struct ckpt_extent_list **ret_list)
{
	int r = ckpt_meta_get_extents(s->eng, t, ino, ret_list);

	if (r == -EIO)
		ckpt_err("%s: extent list of inode %" PRIu64 " is damaged", s->path, ino);
	return r;
}

/* Write the content of n files into the index in one transaction.  Caller
 * holds commit_lock.  Files that no longer exist are skipped.  -ESTALE (a
 * node whose session gc declared dead: the gc fence, session.c): the
 * content can never be committed; callers return -EIO for it. */
static int commit_many(ckpt_store *s, struct commit *const *v, size_t n, bool durable)
{
	struct ckpt_content *cv = calloc(n ? n : 1, sizeof(*cv));
	ckpt_digest *added = NULL;
	size_t nadded = 0;
	int r = cv ? 0 : -ENOMEM;

	for (size_t i = 0; i < n && r == 0; i++) {
		r = sync_pending_of(s, v[i]->list);
		cv[i] = (struct ckpt_content){ v[i]->ino, v[i]->list, v[i]->flags, v[i]->mtime_ns };
	}
	if (r == 0) {
		pthread_mutex_lock(&s->ns_lock);
		r = ckpt_content_commit(&s->cenv, cv, n, durable, &added, &nadded);
		for (size_t i = 0; r == 0 && i < nadded; i++) {
			st_pending_remove(s, &added[i]); /* the index names it now */
			st_revive(s, &added[i]);   /* referenced again (reclaim.c) */
		}
		pthread_mutex_unlock(&s->ns_lock);
		for (size_t i = 0; r == -EIO && s->opts.node && i < n; i++) {
			if (st_pending_stale_in(s, v[i]->list)) {
				ckpt_err("%s: inode %" PRIu64 ": content written in a session of node '%s' "
					 "that gc declared dead: not committed (EIO)", s->path,
					 v[i]->ino, s->node);
				r = -ESTALE;
				break;
			}
		}
		if (r == 0)
			st_bg_kick(s); /* old content may be garbage now */
		if (r == 0)
			ckpt_metric_add(CKPT_M_FILES_COMMITTED, n);
	}
	free(added);
	free(cv);
	return r;
}

void st_commit_free(struct commit *c)
{
	if (!c)
		return;
	ckpt_extent_list_free(c->list);
	free(c);
}

/* Remove and return the overlay entry of ino.  Caller holds overlay_lock. */
static struct commit *overlay_take_locked(ckpt_store *s, uint64_t ino)
{
	struct commit **pp = &s->overlay[ino % COMMIT_BUCKETS], *c;

	for (; (c = *pp); pp = &c->next) {
		if (c->ino == ino) {
			*pp = c->next;
			s->overlay_n--;
			s->overlay_bytes -= c->list->size;
			return c;
		}
	}
	return NULL;
}

struct commit *st_overlay_find_locked(ckpt_store *s, uint64_t ino)
{
	struct commit *c = s->overlay[ino % COMMIT_BUCKETS];

	while (c && c->ino != ino)
		c = c->next;
	return c;
}

/* Free an overlay entry whose content never reached the index (replaced
 * by a newer close, or its file deleted): whoever copied it may still read
 * its chunks (reclaim.c).  Caller holds overlay_lock or commit_lock. */
void st_commit_discard(ckpt_store *s, struct commit *c)
{
	if (!c)
		return;
	st_revive_list(s, c->list);
	st_commit_free(c);
}

struct commit *st_overlay_take(ckpt_store *s, uint64_t ino)
{
	struct commit *c;

	pthread_mutex_lock(&s->overlay_lock);
	c = overlay_take_locked(s, ino);
	pthread_mutex_unlock(&s->overlay_lock);
	return c;
}

int st_overlay_flush_if_any(ckpt_store *s)
{
	bool any;

	pthread_mutex_lock(&s->overlay_lock);
	any = s->overlay_n > 0;
	pthread_mutex_unlock(&s->overlay_lock);
	return any ? ckpt_store_flush(s) : 0;
}

int ckpt_store_flush(ckpt_store *s)
{
	struct commit **v = NULL;
	size_t n = 0;
	int r = 0;

	if (s->opts.mode != CKPT_STORE_RW)
		return 0;
	pthread_mutex_lock(&s->commit_lock);
	/* Copy the entries: they stay visible in the overlay until the batch
	 * that makes them visible in the index is written. */
	pthread_mutex_lock(&s->overlay_lock);
	if (s->overlay_n > 0)
		v = calloc(s->overlay_n, sizeof(*v));
	for (size_t b = 0; v && b < COMMIT_BUCKETS; b++) {
		for (struct commit *c = s->overlay[b]; c; c = c->next) {
			struct commit *copy = calloc(1, sizeof(*copy));
			if (copy)
				copy->list = ckpt_extent_list_dup(c->list);
			if (!copy || !copy->list) {
				st_commit_free(copy);
				r = -ENOMEM;
				break;
			}
			copy->ino = c->ino;
			copy->flags = c->flags;
			copy->mtime_ns = c->mtime_ns;
			copy->seq = c->seq;
			v[n++] = copy;
		}
	}
	if (s->overlay_n > 0 && !v)
		r = -ENOMEM;
	pthread_mutex_unlock(&s->overlay_lock);
	if (r == 0 && n > 0) {
		r = commit_many(s, v, n, false);
		if (r < 0 && n > 1) {
			/* isolate the entry that fails: index the others one by one */
			int first = r;
			r = 0;
			for (size_t i = 0; i < n; i++) {
				int ri = commit_many(s, &v[i], 1, false);
				if (ri == -ESTALE) { /* never committable: the entry goes */
					r = -EIO;
					continue;
				}
				if (ri < 0) {
					ckpt_err("%s: cannot index closed file (inode %" PRIu64
						 "): %s (will retry)", s->path, v[i]->ino, strerror(-ri));
					v[i]->seq = UINT64_MAX; /* keep its overlay entry */
					r = first;
				}
			}
		}
		if (r == -ESTALE)
			r = -EIO; /* n == 1: the entry goes */
		else if (r < 0 && n == 1)
			v[0]->seq = UINT64_MAX; /* keep its overlay entry */
		pthread_mutex_lock(&s->overlay_lock);
		for (size_t i = 0; i < n; i++) {
			struct commit *c = st_overlay_find_locked(s, v[i]->ino);
			if (c && c->seq == v[i]->seq && (r == 0 || v[i]->seq != UINT64_MAX))
				st_commit_free(overlay_take_locked(s, v[i]->ino));
		}
		pthread_mutex_unlock(&s->overlay_lock);
		if (r < 0 && n == 1 && v[0]->seq == UINT64_MAX)
			ckpt_err("%s: cannot index closed file (inode %" PRIu64 "): %s (will retry)",
				 s->path, v[0]->ino, strerror(-r));
	}
	pthread_mutex_unlock(&s->commit_lock);
	for (size_t i = 0; i < n; i++)
		st_commit_free(v[i]);
	free(v);
	return r;
}

void *st_flusher_main(void *arg)
{
	ckpt_store *s = arg;

	pthread_mutex_lock(&s->overlay_lock);
	while (!s->flusher_stop) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&s->flusher_cond, &s->overlay_lock, &ts);
		if (s->overlay_n > 0) {
			pthread_mutex_unlock(&s->overlay_lock);
			ckpt_store_flush(s);
			pthread_mutex_lock(&s->overlay_lock);
		}
	}
	pthread_mutex_unlock(&s->overlay_lock);
	return NULL;
}

int ckpt_store_commit_file(ckpt_store *s, uint64_t ino, const struct ckpt_extent_list *l,
			   uint32_t flags, int64_t mtime_ns, bool durable)
{
	struct commit *c, *old;
	int r;

	if (s->opts.mode != CKPT_STORE_RW)
		return -EROFS;
	c = calloc(1, sizeof(*c));
	if (c)
		c->list = ckpt_extent_list_dup(l);
	if (!c || !c->list) {
		st_commit_free(c);
		return -ENOMEM;
	}
	c->ino = ino;
	c->flags = flags;
	c->mtime_ns = mtime_ns;
	if (durable) {
		/*
		 * The last close's overlay entry (if any) stays while the index is
		 * written, and goes once the index holds the new content, unless a
		 * newer close replaced it meanwhile: an entry leaves the overlay
		 * only after the index holds its content or newer, so that a reader
		 * that finds no entry finds the content in the index (getattr,
		 * load_extents).  The flusher cannot index the old entry after this
		 * commit: both hold commit_lock.  On failure the last close's
		 * content stays the file's.
		 */
		uint64_t prev_seq = 0;

		pthread_mutex_lock(&s->commit_lock);
		pthread_mutex_lock(&s->overlay_lock);
		old = st_overlay_find_locked(s, ino);
		if (old)
			prev_seq = old->seq;
		pthread_mutex_unlock(&s->overlay_lock);
		r = commit_many(s, &c, 1, true);
		if (r == -ESTALE)
			r = -EIO;
		if (r == 0 && prev_seq) {
			pthread_mutex_lock(&s->overlay_lock);
			old = st_overlay_find_locked(s, ino);
			if (old && old->seq == prev_seq)
				st_commit_discard(s, overlay_take_locked(s, ino)); /* superseded */
			pthread_mutex_unlock(&s->overlay_lock);
		}
		pthread_mutex_unlock(&s->commit_lock);
		st_commit_free(c);
		return r;
	}
	if (s->opts.node) {
		/* A node of a shared store indexes at every close, so that an open
		 * on another node sees the file (close-to-open across nodes,
		 * docs/cluster.md section 3): the chunks are synced and the content
		 * committed, not durably.  If that fails the entry goes to the
		 * overlay as on one node, the flusher retries it, and other nodes
		 * see the previous content until then. */
		struct commit *prev;

		pthread_mutex_lock(&s->commit_lock);
		prev = st_overlay_take(s, ino); /* superseded by c either way */
		r = commit_many(s, &c, 1, false);
		pthread_mutex_unlock(&s->commit_lock);
		st_commit_free(prev);
		if (r == 0 || r == -ESTALE) {
			/* committed, or never committable (the gc fence): close
			 * returns EIO rather than leave it to the flusher */
			st_commit_free(c);
			return r == 0 ? 0 : -EIO;
		}
		ckpt_warn("%s: cannot index closed file (inode %" PRIu64 ") at close: %s (will "
			  "retry)", s->path, ino, strerror(-r));
	}
	pthread_mutex_lock(&s->overlay_lock);
	old = overlay_take_locked(s, ino);
	c->seq = ++s->overlay_seq;
	c->next = s->overlay[ino % COMMIT_BUCKETS];
	s->overlay[ino % COMMIT_BUCKETS] = c;
	s->overlay_n++;
	s->overlay_bytes += l->size;
	if (s->overlay_bytes > CKPT_OVERLAY_FLUSH_BYTES)
		pthread_cond_signal(&s->flusher_cond);
	/* while the overlay is not empty: no drop runs (reclaim.c) */
	st_commit_discard(s, old);
	pthread_mutex_unlock(&s->overlay_lock);
	return 0;
}

int ckpt_store_sync_file(ckpt_store *s, uint64_t ino)
{
	struct commit *c = NULL, *e;
	int r = 0;

	if (s->opts.mode != CKPT_STORE_RW)
		return 0;
	pthread_mutex_lock(&s->commit_lock);
	/* Index a copy; the entry stays in the overlay until the index holds
	 * it (see ckpt_store_commit_file), and for the flusher on failure. */
	pthread_mutex_lock(&s->overlay_lock);
	e = st_overlay_find_locked(s, ino);
	if (e) {
		c = calloc(1, sizeof(*c));
		if (c)
			c->list = ckpt_extent_list_dup(e->list);
		if (!c || !c->list) {
			st_commit_free(c);
			c = NULL;
			r = -ENOMEM;
		} else {
			c->ino = e->ino;
			c->flags = e->flags;
			c->mtime_ns = e->mtime_ns;
			c->seq = e->seq;
		}
	}
	pthread_mutex_unlock(&s->overlay_lock);
	if (c)
		r = commit_many(s, &c, 1, true);
	if (c && r == -ESTALE) {
		r = -EIO; /* never committable: the entry goes */
		pthread_mutex_lock(&s->overlay_lock);
		e = st_overlay_find_locked(s, ino);
		if (e && e->seq == c->seq)
			st_commit_free(overlay_take_locked(s, ino));
		pthread_mutex_unlock(&s->overlay_lock);
	} else if (!c && r == 0)
		r = ckpt_engine_sync(s->eng);
	if (r == 0 && c) {
		pthread_mutex_lock(&s->overlay_lock);
		e = st_overlay_find_locked(s, ino);
		if (e && e->seq == c->seq)
			st_commit_free(overlay_take_locked(s, ino));
		pthread_mutex_unlock(&s->overlay_lock);
	}
	pthread_mutex_unlock(&s->commit_lock);
	st_commit_free(c);
	return r;
}

