/* SPDX-License-Identifier: MIT */
/*
 * store_int.h - the store's private state, shared by the files of core/store/.
 * Nothing outside core/store/ includes it.  Locking rules are beside the
 * fields they protect.
 */
#ifndef CKPT_STORE_INT_H
#define CKPT_STORE_INT_H

#include "store/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "chunk/chunk.h"
#include "meta/meta.h"



#define MARKER_NAME "ckptfs-store"
#define MARKER_MAGIC "ckptfs-store"
#define ST_INDEX_DIR "index"     /* the metadata engine's files */
#define ST_METALOG_DIR "metalog" /* its metadata log (meta/mlog.h) */

struct pending {
	ckpt_digest digest;
	struct ckpt_chunk_loc loc;
	uint64_t epoch; /* when it was put or last obtained again (reclaim.c) */
	uint32_t gen;   /* sess_gen when put: an entry of an older generation
			 * was put in a session gc declared dead (session.c)
			 * and is never found nor committed */
	struct pending *next;
};

#define PENDING_BUCKETS 4096
#define PIN_BUCKETS 4096

/* A closed file's new content, visible through the store but not yet in the
 * index (see "overlay" in the header comment of store.h). */
struct commit {
	uint64_t ino;
	struct ckpt_extent_list *list;
	uint32_t flags;
	int64_t mtime_ns;
	uint64_t seq; /* bumped on every replacement */
	struct commit *next;
};

#define COMMIT_BUCKETS 1024
#define CKPT_OVERLAY_FLUSH_BYTES (256ull << 20)

struct ckpt_store {
	char *path;
	struct ckpt_store_opts opts;
	int lock_fd;
	ckpt_chunk_backend *cb; /* where chunk records live (chunk/backend.h) */
	ckpt_engine *eng; /* the metadata (meta/engine.h); thread-safe */
	ckpt_hasher *hasher;
	ckpt_cache *cache;
	uint8_t uuid[16];
	pthread_key_t tls_key; /* per-thread compressor/decompressor */
	ckpt_loadctx_pool *rctx; /* what chunk loads work in (chunk/loadctx.h) */

	/* ns_lock serializes this process's read-modify-write transactions on
	 * namespace and chunk records.  Atomicity comes from the engine's
	 * transactions (a second writer sharing the engine conflicts and
	 * retries); the lock only keeps this process's own writers from
	 * conflicting with each other needlessly. */
	pthread_mutex_t ns_lock;
	ckpt_ns *ns; /* the namespace (meta/ns.h), its writer lock ns_lock */
	struct ckpt_commit_env cenv; /* content commits (meta/commit.h); set at open */


	pthread_mutex_t pending_lock;
	/* Protected by pending_lock: */
	struct pending *pending[PENDING_BUCKETS];

	/* Lock order: commit_lock -> ns_lock -> {pending,overlay}_lock; the
	 * engine's own locks are innermost (held only inside an engine call). */
	pthread_mutex_t commit_lock; /* serializes writers of file content to the index */
	pthread_mutex_t overlay_lock;
	/* Protected by overlay_lock: */
	struct commit *overlay[COMMIT_BUCKETS];
	size_t overlay_n;
	uint64_t overlay_bytes, overlay_seq;
	bool flusher_stop;
	pthread_cond_t flusher_cond;
	/* Immutable after open: */
	bool flusher_started;
	pthread_t flusher;

	/* Background compression and compaction (store.h, "Background work").
	 * Lock order: bg_lock is never held while taking another lock. */
	pthread_mutex_t bg_lock;
	pthread_cond_t bg_cond;
	/* Protected by bg_lock: */
	struct bg_item *bgq;
	size_t bgq_head, bgq_n, bgq_cap;
	bool bg_stop, bg_busy, bg_compact_clean;
	uint64_t bg_kicks; /* bumped whenever bg_compact_clean is cleared */
	struct ckpt_bg_stats bg;
	/* Atomic: */
	atomic_llong last_put_ns;
	atomic_int puts_inflight;
	atomic_bool space_short; /* st_check_space refused (logged once) */
	/* Held throughout by what moves chunks to new units: st_compact (the
	 * background thread's, or ckpt_store_gc's) and background compression,
	 * so that none reclaims a unit another is appending to.  Taken before
	 * commit_lock and ns_lock. */
	pthread_mutex_t compact_lock;
	uint64_t *bg_skip; /* units compaction leaves alone (compact_lock) */
	const struct ckpt_progress *progress; /* fsck and gc report here (tools; set
					       * before they run, NULL: none) */
	size_t nbg_skip;
	bool bg_started;
	pthread_t bg_thread;

	/* Online reclaiming of garbage chunks (reclaim.c).  hold_lock and
	 * cand_lock are leaf locks: nothing else is taken under them (they
	 * may be taken under any other lock). */
	pthread_mutex_t hold_lock;
	/* Protected by hold_lock (epoch also read atomically without it): */
	atomic_ullong epoch;              /* advanced after each scan for garbage */
	struct ckpt_hold *hold_head, *hold_tail; /* live holds, oldest epoch first */
	pthread_mutex_t cand_lock;
	struct drop_set *cand; /* garbage found by the last scan, protected by
				* cand_lock; made and freed by the background
				* thread under compact_lock */
	/* Digests pinned by holds (ckpt_hold_pin), with counts.  pin_lock is
	 * a leaf lock too (taken under cand_lock and pending_lock). */
	pthread_mutex_t pin_lock;
	struct pin *pins[PIN_BUCKETS]; /* protected by pin_lock */
	bool pins_skipped; /* a drop left pinned garbage (pin_lock) */

	/* Node sessions (session.c; opts.node only).  Lock order: sess_lock
	 * is taken under commit_lock and under the chunk backend's own lock (a
	 * new unit: st_session_unit_add), never the other way; it is held
	 * across no engine or backend call. */
	pthread_mutex_t sess_lock;
	pthread_cond_t sess_cond;
	char node[CKPT_NODE_MAX + 1];  /* immutable after open */
	char host[CKPT_HOST_MAX + 1];  /* immutable after open */
	uint32_t sess_timeout_ms;      /* immutable after open */
	/* The session's id; changed only under commit_lock (a re-registration),
	 * so a content commit (under commit_lock) sees one id throughout. */
	atomic_ullong sess_id;
	atomic_uint sess_gen;          /* bumped by each re-registration */
	atomic_bool sess_dead;         /* the fence found the session dead */
	atomic_bool sess_reg_failed;   /* a new session could not be registered (logged) */
	/* Protected by sess_lock: */
	bool sess_stop;
	uint64_t *sess_units; /* units whose 'U' record names this session */
	size_t nsess_units, sess_units_cap;
	uint64_t sess_registered;
	/* Immutable after open: */
	bool sess_started;
	pthread_t sess_thread;

	/* Summary lines of background work (report.c): the background thread's
	 * own, and ckpt_store_free's once that thread has stopped. */
	struct st_bg_report {
		struct ckpt_ratelimit rl;
		struct ckpt_bg_stats logged, seen; /* at the last line, at the last call */
		unsigned passes;                   /* passes that did work since that line */
		int64_t since_ns;                  /* monotonic time of that line (or open) */
	} bgrep;
};

struct pin {
	ckpt_digest d;
	uint64_t n;
	struct pin *next;
};

/* Index entries found at refcount 0 by one scan, before the epoch moved
 * past `epoch`; state[i] is CAND_* (cand_lock). */
enum { CAND_GARBAGE, CAND_REVIVED, CAND_DROPPING };
struct drop_set {
	ckpt_digest *d; /* sorted */
	uint8_t *state;
	size_t n;
	uint64_t epoch;
};

struct bg_item {
	ckpt_digest d;
	uint8_t elem;
};


/* A thread's compressor and decompressor (put path, background work and
 * read-ahead decoding). */
struct tls_ctx {
	ckpt_compressor *cc;
	ckpt_decompressor *dc;
};


/* Read contexts (chunk/loadctx.h): made and touched at open when
 * st_touch_at_open(), at most RCTX_KEEP kept free. */
#define RCTX_WARM 4
#define RCTX_KEEP 16

struct chunk_info {
	ckpt_digest d;
	struct ckpt_chunk_loc loc;
	uint64_t refs;    /* as stored */
	uint64_t counted; /* as counted from extent lists (fsck) */
	bool damaged;
};

struct reloc {
	ckpt_digest d;
	struct ckpt_chunk_loc old, new;
};


/* loadctx.c */
void st_tls_free(void *p);
void st_rctx_warm(ckpt_store *s);
struct tls_ctx *st_tls_get(ckpt_store *s);
bool st_touch_at_open(const struct ckpt_store_opts *o);

/* meta.c: st_txn_run is ckpt_txn_run (meta/engine.h) for a function of
 * the store. */
/* Run fn in a transaction until it commits or fails otherwise than by a
 * conflict (a conflict runs fn again in a new transaction: fn must read
 * everything it decides on through t and keep no effects outside t before
 * the commit).  fn returns 0 to commit, > 0 to end without writing
 * (st_txn_run then returns 0), < 0 to fail with that error. */
typedef int (*st_txn_fn)(ckpt_store *s, ckpt_txn *t, void *arg);
int st_txn_run(ckpt_store *s, st_txn_fn fn, void *arg, bool durable);

/* reclaim.c */
void st_reclaim_init(ckpt_store *s);
void st_reclaim_free(ckpt_store *s);
/* A digest obtained again (dedup hit, a closed file's content replaced or
 * dropped, a commit's new references): garbage found before now is not
 * garbage any more.  Returns true when the index entry is being dropped
 * right now (the caller must not count on it). */
bool st_revive(ckpt_store *s, const ckpt_digest *d);
/* Node sessions: move the epoch new holds take up to e (the gc epoch the
 * heartbeat just read) and return the pin to publish: e, or the epoch of
 * the oldest hold in the epoch list if older (session.c). */
uint64_t st_hold_take_pin(ckpt_store *s, uint64_t e);
/* Whether a hold pins d (takes pin_lock). */
bool st_pinned(ckpt_store *s, const ckpt_digest *d);
void st_revive_list(ckpt_store *s, const struct ckpt_extent_list *l);
/* One round of dropping garbage: returns the number dropped (>= 0) or
 * -errno.  The background thread, with no lock held. */
int st_reclaim_round(ckpt_store *s);
/* Ask the background thread for another look (something may have become
 * garbage, or a grace period may have ended). */
void st_bg_kick(ckpt_store *s);

/* packs.c */
int st_backend_open(ckpt_store *s, int dfd, bool create, char *err, size_t errlen);
unsigned st_pending_bucket(const ckpt_digest *d);
bool st_pending_find(ckpt_store *s, const ckpt_digest *d, struct ckpt_chunk_loc *ret);
/* st_pending_find that also marks the entry obtained now (its epoch). */
bool st_pending_obtain(ckpt_store *s, const ckpt_digest *d);
/* Forget the pending entries whose epoch is <= epoch and that no hold
 * pins; returns how many. */
size_t st_pending_forget(ckpt_store *s, uint64_t epoch);
bool st_unindexed(void *store, const ckpt_digest *d, struct ckpt_chunk_loc *ret);
bool st_pending_add(ckpt_store *s, const ckpt_digest *d, const struct ckpt_chunk_loc *loc);
void st_pending_remove(ckpt_store *s, const ckpt_digest *d);

/* chunks.c */
const char *st_decode_chunk(ckpt_store *s, ckpt_decompressor *dc, const ckpt_digest *d,
			    const struct ckpt_chunk_loc *loc, const struct ckpt_chunk_rec *rec,
			    const uint8_t *src, void *dst);
int st_check_chunk(ckpt_store *s, const ckpt_digest *d, const struct ckpt_chunk_loc *loc,
		   void *dst, bool rec_csum, const char **ret_why);
int st_verify_chunk(ckpt_store *s, const ckpt_digest *d, const struct ckpt_chunk_loc *loc,
			void *dst, bool rec_csum);
int st_chunk_get(ckpt_store *s, const ckpt_digest *d, bool stream, ckpt_cache_entry **ret_entry,
		 const uint8_t **ret_data, size_t *ret_len);
int st_load_chunk(ckpt_store *s, const ckpt_digest *d, const struct ckpt_chunk_loc *known,
		      uint8_t **ret_buf, size_t *ret_len);

/* put.c */
enum st_space { ST_SPACE_FILE, ST_SPACE_MOVE, ST_SPACE_NONE };
int st_check_space(ckpt_store *s, size_t need, enum st_space keep_for);
int st_append_record_bg(ckpt_store *s, const struct ckpt_chunk_rec *rec, const void *data,
			struct ckpt_chunk_loc *ret_loc);
void st_bg_enqueue(ckpt_store *s, const ckpt_digest *d, uint8_t elem);

/* report.c: a summary line of the background work done since the last one,
 * at most one a minute (any time with force); nothing when no work was
 * done.  Called where a pass of background work ends. */
void st_bg_report(ckpt_store *s, bool force);
/* report.c: ckpt_store_metrics_register undone (ckpt_store_free). */
void st_metrics_unregister(ckpt_store *s);

/* background.c */
int st_publish(ckpt_store *s, const struct reloc *v, size_t n);
void *st_bg_main(void *arg);
int st_requeue_deferred(ckpt_store *s);

/* commit.c */
int st_db_load_extents(ckpt_store *s, ckpt_txn *t, uint64_t ino,
		       struct ckpt_extent_list **ret_list);
void st_commit_free(struct commit *c);
void st_commit_discard(ckpt_store *s, struct commit *c);
struct commit *st_overlay_find_locked(ckpt_store *s, uint64_t ino);
struct commit *st_overlay_take(ckpt_store *s, uint64_t ino);
int st_overlay_flush_if_any(ckpt_store *s);
void *st_flusher_main(void *arg);

/* maint.c */
int st_load_chunks(ckpt_store *s, struct chunk_info **ret, size_t *ret_n);
/* ino -> (parent, name) from every dentry, for naming files in reports:
 * st_load_names returns them sorted by ino (free each name, then the
 * array); st_name_path makes the path of ino from them (malloc'd, NULL
 * when out of memory; "<inode N>" for a part it cannot name). */
struct name_ent {
	uint64_t ino, parent;
	char *name;
};
int st_load_names(ckpt_store *s, struct name_ent **ret, size_t *ret_n);
char *st_name_path(struct name_ent *names, size_t n, uint64_t ino);

/* open.c: the marker check of every open; ckpt_store_open() with the
 * store's lock already held on lock_fd (-1: take it), which the store then
 * owns (closed by ckpt_store_free, or on failure). */
int st_read_marker(int dfd, const char *path, char *err, size_t errlen);
int st_open(const char *path, const struct ckpt_store_opts *o, int lock_fd,
	    ckpt_store **ret_store, char *err, size_t errlen);

/* session.c (node sessions, the gc fence, the online gc of shared engines;
 * docs/cluster.md section 7) */
int st_session_open(ckpt_store *s, char *err, size_t errlen);
void st_session_close(ckpt_store *s);
/* The gc fence (ckpt_commit_env.fence): 0, or -ESTALE when gc declared
 * this node's session dead (logged once, the heartbeat thread woken). */
int st_session_fence(void *store, ckpt_txn *t);
/* In take_unit_id's transaction: the new unit is this session's. */
void st_session_unit_put(ckpt_store *s, ckpt_txn *t, uint64_t unit);
void st_session_unit_add(ckpt_store *s, uint64_t unit);
/* Whether l names a chunk put in a session declared dead (for messages). */
bool st_pending_stale_in(ckpt_store *s, const struct ckpt_extent_list *l);
int st_gc_shared(ckpt_store *s, struct ckpt_gc_stats *ret, bool *ret_offline_ok);

/* repair_ns.c: the second step of ckpt_store_repair (store.h) on the
 * opened store. */
int st_repair_check(ckpt_store *s, ckpt_repair_fn cb, void *ud, struct ckpt_repair_stats *st);

/* compact.c */
struct st_compact_stats {
	uint64_t moved;           /* chunks copied out of reclaimed units */
	uint64_t units_rewritten; /* reclaimed units that held indexed chunks */
	uint64_t units_deleted;   /* units reclaimed */
};
int st_compact(ckpt_store *s, size_t max_units, bool reserve, struct st_compact_stats *res);

#endif
