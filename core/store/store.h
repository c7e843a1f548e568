/* SPDX-License-Identifier: MIT */
/*
 * store.h - a ckptfs store, the contract of core/store: content-addressed
 * chunks in a chunk backend (chunk/backend.h; pack files by default), the
 * namespace, extent lists and chunk index in a metadata engine
 * (meta/engine.h; RocksDB by default).  The store wires the two: open,
 * create and recovery, the put path, background compression and the one
 * compactor, reads of extent lists, stat/fsck/gc.
 *
 * On-disk layout of a store directory STORE (docs/format.md):
 *   STORE/ckptfs-store   format marker: "ckptfs-store <format-version>\n"
 *   STORE/lock           flock()ed by the process that owns the store
 *   STORE/index/         the metadata engine's files: RocksDB (meta/engine.h;
 *                        meta/records.h for the key space)
 *   STORE/metalog/       the metadata log: snapshots of the index and every
 *                        commit since, for ckpt_store_repair (meta/mlog.h)
 *   STORE/packs/         pack-<id>.ckpk chunk data (see pack.h)
 *   STORE/staging/       scratch files of files being rewritten at random
 *                        offsets; emptied at every open
 *
 * Ownership and durability contract:
 *  - A chunk is appended to a pack by ckpt_store_put_chunk() and is then
 *    "pending": readable by this process, unknown to the index.
 *  - A file's new extent list reaches the index in one metadata transaction
 *    (chunk refcounts, extent list, inode) committed after the pack data of every
 *    pending chunk it references was fdatasync'ed.  ckpt_store_commit_file()
 *    with durable=true does this before returning and fsyncs the batch, so
 *    the file survives a crash of the machine.  With durable=false the new
 *    content goes to the overlay (below) and is indexed within ~1 s.
 *  - Refcount of a chunk = number of extents naming it across all committed
 *    extent lists.  Chunks at refcount 0, and pending chunks that no closed
 *    file names, are garbage: `ckpt gc` drops them, and so does the
 *    background thread (unless opts.keep_unreferenced), subject to holds.
 *  - Holds (ckpt_hold_new): whoever keeps chunk digests that the index does
 *    not count (a writer's uncommitted content, an open file's copy of an
 *    extent list) keeps a hold, taken before it obtains them, for as long
 *    as it may read or commit them.  While a hold lives, every chunk that
 *    was referenced, pending or named by a closed file when the hold was
 *    taken (or last renewed), and every chunk put since, stays readable
 *    and committable.  The background thread drops garbage only once every
 *    hold that was live when it was found to be garbage has been freed or
 *    renewed (a grace period, section 8.2 of docs/design.md).
 *  - Background work (RW stores): by default chunks are written raw and
 *    compressed later by a background thread once writes pause, which then
 *    moves each chunk to its compressed record (same digest, new location).
 *    The same thread compacts sealed packs that are mostly garbage (moving
 *    their chunks, then deleting the pack).  A location is only published
 *    after the record it names was fdatasync'ed, and a pack is only deleted
 *    after the index no longer names it (fsync'ed), so every step is
 *    crash-safe.  ckpt_store_settle() waits until nothing is left to do.
 *  - Overlay: a non-durable commit (a plain close) is published at once to
 *    this process (getattr/lookup/load_extents see it) and written to the
 *    index by a background flusher within about a second, in one batch with
 *    other closed files (one pack fdatasync for all of them).  A rename, an
 *    fsync of the file, ckpt_store_flush() and ckpt_store_free() index it
 *    immediately.  A daemon crash loses closed-but-unindexed content only;
 *    the store stays consistent (the old content remains).  Invariant: an
 *    entry leaves the overlay only after the index holds its content or
 *    newer (a durable commit also goes through the overlay), so a reader
 *    that looks in the overlay first and then in the index never sees
 *    content older than the last close or fsync that returned.
 *
 * Thread-safety: every function may be called from any thread.  Every
 * change of the index is one transaction of the metadata engine, which
 * makes it atomic and detects a conflicting writer (then it is retried).
 * Within this process namespace mutations are also serialized by ns_lock,
 * index writes of file content by commit_lock (taken before ns_lock), so
 * that its own writers do not conflict; reads take neither.
 */
#ifndef CKPT_STORE_H
#define CKPT_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "chunk/cache.h"
#include "base/hash.h"
#include "base/progress.h"
#include "meta/ns.h"
#include "meta/records.h"

#define CKPT_STORE_FORMAT 1

typedef struct ckpt_store ckpt_store;

enum ckpt_store_mode {
	CKPT_STORE_RW,       /* exclusive: flock + RocksDB lock; daemon, gc (shared
			      * with other nodes with ckpt_store_opts.node) */
	CKPT_STORE_RO,       /* exclusive lock, read-only use; fsck */
	CKPT_STORE_RO_SHARED /* no lock, RocksDB read-only: `ckpt stat` while mounted */
};

/* What a background thread does in a RW store. */
enum ckpt_bg_mode {
	CKPT_BG_OFF,     /* no thread: chunks are compressed on the write path and
			  * space is reclaimed by ckpt_store_gc (tools, tests) */
	CKPT_BG_COMPACT, /* compress on the write path; compact in the background */
	CKPT_BG_ALL,     /* write chunks raw; compress and compact in the
			  * background once writes pause (the daemon) */
};

struct ckpt_store_opts {
	enum ckpt_store_mode mode;
	bool create;          /* create the store if STORE is missing or empty */
	int compress_level;   /* 0 (off) .. 19; default 1 */
	uint64_t cache_size;  /* decompressed chunk cache, bytes; default 256 MiB */
	bool verify_dedup;    /* compare bytes on a dedup hit */
	uint64_t pack_max;    /* start a new pack past this size; default 0: 1/32 of
			       * the filesystem, between 4 MiB and 1 GiB (a small
			       * disk gets small packs, which compaction can
			       * rewrite when little space is left) */
	enum ckpt_bg_mode bg; /* background work (RW stores); default CKPT_BG_OFF */
	const char *chunk_backend; /* registered name (chunk/backend.h); NULL: "pack" */
	unsigned compact_live; /* compaction (background and gc) reclaims units
				* whose live records fill less than this % of
				* them (1..100); 0: CKPT_COMPACT_LIVE_DEFAULT */
	bool sync_readahead;  /* read-ahead reads with pread, not kernel AIO (tests,
			       * A/B runs; AIO missing from the kernel does the same) */
	uint64_t buf_reserve; /* chunk buffers mapped and touched at open and kept
			       * (ckpt_cache_reserve_bufs), at most cache_size;
			       * CKPT_BUF_RESERVE_AUTO: the cache's stream budget
			       * plus 32 MiB; default 0: none.  Not 0: also
			       * four chunk loads' buffers made and touched
			       * (24 MiB: verify_chunk's read contexts) */
	const char *meta_engine; /* metadata engine by name (meta/engine.h);
				  * NULL: the default, "rocksdb", in STORE/index */
	bool keep_unreferenced; /* background work never drops garbage chunks
				 * (refcount 0, or pending and named by no closed
				 * file): only `ckpt gc` reclaims them */
	const char *meta_where;  /* where that engine keeps the metadata (its
				  * connection string); NULL: STORE/index.  A
				  * shared engine (ckpt_engine_ops.shared) needs it */
	bool node;               /* CKPT_STORE_RW on a shared engine: one of several
				  * daemons (nodes) that use the store at once.  The
				  * store lock is taken shared (a RW open without it,
				  * gc, and RO opens take it exclusively, so they wait
				  * for every node to unmount); bg must be
				  * CKPT_BG_OFF, because compaction would delete packs
				  * holding other nodes' chunks not yet indexed
				  * (docs/cluster.md section 11).  A non-durable
				  * ckpt_store_commit_file indexes the file at once
				  * (close-to-open across nodes).  The node keeps a
				  * session in the metadata (docs/cluster.md section
				  * 7): registered at open, refreshed by a heartbeat
				  * thread, removed by ckpt_store_free; a content
				  * commit fails with -EIO once gc declared the
				  * session dead, and the node registers a new one */
	const char *node_name;   /* node: its id (ckpt_node_name_ok); NULL:
				  * HOSTNAME-PID */
	uint32_t session_timeout_ms; /* node: how long without a heartbeat
				      * makes the session dead; 0:
				      * CKPT_SESSION_TIMEOUT_DEFAULT_MS */
	bool gc_online;          /* CKPT_STORE_RW on a shared engine for
				  * ckpt_store_gc beside mounted nodes: the store
				  * lock is taken shared, no orphans are reaped, no
				  * session is kept; gc then does only what is safe
				  * online (docs/cluster.md section 7) */
};
#define CKPT_SESSION_TIMEOUT_DEFAULT_MS 60000u
#define CKPT_BUF_RESERVE_AUTO UINT64_MAX
#define CKPT_COMPACT_LIVE_DEFAULT 80
void ckpt_store_opts_init(struct ckpt_store_opts *o);

/* Open (and with o->create, create) the store at path.  Errors: -ENOENT
 * missing, -EINVAL not a ckptfs store, -EPROTONOSUPPORT newer format,
 * -EBUSY in use by another process; err receives a message naming path and
 * reason. */
int ckpt_store_open(const char *path, const struct ckpt_store_opts *o, ckpt_store **ret_store,
		    char *err, size_t errlen);
/* Flushes the index and closes everything.  Accepts NULL.  Threads that
 * used s and outlive it (a pool's workers: free the pool first) keep their
 * per-thread state of s: it is freed when such a thread exits, but only
 * while s lives. */
void ckpt_store_free(ckpt_store *s);
const char *ckpt_store_path(const ckpt_store *s);
int ckpt_store_compress_level(const ckpt_store *s);
/* True for a store opened CKPT_STORE_RW. */
bool ckpt_store_writable(const ckpt_store *s);
/* True for a node's store (ckpt_store_opts.node): other daemons change it too. */
bool ckpt_store_is_node(const ckpt_store *s);
/* True when ckpt_store_put_chunk() does not compress (background
 * compression, or level 0): callers may run it inline. */
bool ckpt_store_put_is_cheap(const ckpt_store *s);

/* ---- chunks ---- */

/* Store len bytes (1..CKPT_CHUNK_MAX) as a chunk; elem_size is the
 * compression hint (see compress.h).  Deduplicates against the index and
 * against pending chunks.  Returns the digest. */
#define CKPT_CHUNK_MAX (16u << 20)
int ckpt_store_put_chunk(ckpt_store *s, const void *data, size_t len, unsigned elem_size,
			 ckpt_digest *ret_digest);
/* ckpt_store_put_chunk() of the concatenation of iov[0..cnt) (cnt 1..
 * CKPT_CHUNK_PUT_IOV): hashed and, when compression is deferred, written
 * without joining the pieces. */
int ckpt_store_put_chunkv(ckpt_store *s, const struct iovec *iov, int cnt, unsigned elem_size,
			  ckpt_digest *ret_digest);
/* Copy len bytes at offset off of chunk d into dst.  Goes through the chunk
 * cache.  -EIO if the chunk is damaged (logged with where it lies) or
 * unknown (a file naming a chunk the store lacks is damaged too). */
int ckpt_store_read_chunk(ckpt_store *s, const ckpt_digest *d, uint64_t off, void *dst,
			  size_t len);
/*
 * Read-ahead: load those of chunks d[0..n) that are not cached or being
 * loaded into the chunk cache (as stream entries), in the order given.
 * The chunk backend's span reads fetch records that lie close together
 * with one request (the pack backend: one O_DIRECT request of up to 4 MiB
 * into huge pages per run); what does not fit a batch's span buffer, or
 * cannot be read so, is read alone.  *ret_loaded:
 * chunks loaded, *ret_skipped: cached or being loaded already.  Returns how
 * many could not be loaded (their readers will load them and report the
 * error), or -ENOMEM.
 */
int ckpt_store_prefetch_chunks(ckpt_store *s, const ckpt_digest *d, size_t n,
			       size_t *ret_loaded, size_t *ret_skipped);
/* On a store whose metadata engine is a server (one round trip per
 * request), load chunks d[0..n) that are neither cached nor being loaded
 * as one read-ahead batch (one engine request for their locations) and
 * wait for it, so that the reads that follow find them cached; a chunk it
 * could not load is left to those reads.  Nothing on a local engine,
 * where a location is a function call. */
void ckpt_store_load_batch(ckpt_store *s, const ckpt_digest *d, size_t n);
/* Whether ckpt_store_load_batch does anything (a server engine): callers
 * skip listing chunks for it otherwise. */
bool ckpt_store_batches_loads(const ckpt_store *s);

/*
 * The same in two steps, so that a read-ahead worker decodes one batch
 * while the disk reads the next.  _begin reserves the chunks (readers that
 * want them wait from then on), plans their reads and with submit sends
 * them to the calling thread's kernel AIO context; it returns the batch in
 * *ret_pf (or -ENOMEM).  _finish waits for those reads (or, without
 * submit, makes them with pread), decodes, fills the cache, frees pf and
 * returns as ckpt_store_prefetch_chunks.  Submit only a batch that is not
 * finished at once: waiting for an AIO read at once costs more than a
 * pread.  Both run on the same thread, which must finish
 * every batch it begins, in any order, and before it exits.  A thread has
 * CKPT_PREFETCH_INFLIGHT span buffers: a batch begun while all are held
 * reads its chunks one by one in _finish.  Without kernel AIO (or with
 * opts.sync_readahead) submitted spans are read in _finish too.
 */
typedef struct ckpt_prefetch ckpt_prefetch;
#define CKPT_PREFETCH_INFLIGHT CKPT_CHUNK_SPAN_INFLIGHT /* span buffers per thread */
int ckpt_store_prefetch_begin(ckpt_store *s, const ckpt_digest *d, size_t n, bool submit,
			      ckpt_prefetch **ret_pf);
int ckpt_store_prefetch_finish(ckpt_store *s, ckpt_prefetch *pf, size_t *ret_loaded,
			       size_t *ret_skipped);
/*
 * Set up the calling thread for read-ahead now rather than at its first
 * batch: its decompressor (with its working buffer sized for the default
 * chunker's largest chunk and touched), its AIO context and its span
 * buffers, mapped and touched.  A span buffer is 8 MiB in huge pages;
 * touched first by the disk's read into it, the kernel zeroed those pages
 * during the reader's read, a visible share of the daemon's CPU time in a
 * cold read.  A read-ahead worker calls it when it starts.
 * Does nothing in a store opened without a buffer reserve (opts.buf_reserve
 * or cache_size 0).  Returns 0 or -ENOMEM (the thread then maps what it
 * lacks on first use).
 */
int ckpt_store_prefetch_warm(ckpt_store *s);
/* Read-ahead's span requests since open: read through kernel AIO, read with
 * pread (in _finish), and of either or neither, failed (short, an error, or
 * the pack gone: their chunks were then read alone). */
struct ckpt_prefetch_stats {
	uint64_t aio, sync, failed;
};
void ckpt_store_prefetch_stats(ckpt_store *s, struct ckpt_prefetch_stats *ret);
/*
 * What a chunk load outside read-ahead (a cache miss, fsck, background
 * work) works in: a record buffer and a decompressor, borrowed for the one
 * load from a list the store keeps, so a thread's first load costs no new
 * memory.  made: contexts made since open; warm: of those, made and touched
 * at open (four when the store has a buffer reserve, else none); free: on
 * the list now (at most 16 are kept).
 */
struct ckpt_load_ctx_stats {
	uint64_t made, warm, free;
};
void ckpt_store_load_ctx_stats(ckpt_store *s, struct ckpt_load_ctx_stats *ret);
/* Counters of the chunk cache (misses: chunks loaded by readers). */
void ckpt_store_cache_stats(ckpt_store *s, struct ckpt_cache_stats *ret);
/* A buffer of len bytes from the chunk cache's buffers (its reserve first,
 * see ckpt_store_opts.buf_reserve), for a reply the caller assembles;
 * NULL when out of memory.  Give it back with ckpt_store_buf_free(s, buf,
 * len) (accepts NULL). */
uint8_t *ckpt_store_buf_alloc(ckpt_store *s, size_t len);
void ckpt_store_buf_free(ckpt_store *s, uint8_t *buf, size_t len);
/* Location of a chunk (pending or indexed): its where bytes are the chunk
 * backend's, opaque here (tests of a backend decode them). */
int ckpt_store_chunk_loc(ckpt_store *s, const ckpt_digest *d, struct ckpt_chunk_loc *ret_loc,
			 uint64_t *ret_refcount);

/* ---- files ---- */

/* Read [off, off+len) of the content described by l into dst.  Returns the
 * number of bytes read (short at end of content) or -errno. */
ssize_t ckpt_store_read_extents(ckpt_store *s, const struct ckpt_extent_list *l, void *dst,
				size_t len, uint64_t off);
/* A read position in l for many reads in ascending order (views): keeps
 * the extent index and the last chunk pinned between reads.  Call
 * ckpt_store_cursor_done() to unpin; the cursor can be reused after. */
/*
 * Zero-copy reads.  A read with a gather still fills dst, except for chunk
 * pieces of at least CKPT_GATHER_MIN bytes: those are left out of dst and
 * described by an iovec into the (pinned) cache entry instead.  iov[0..niov)
 * then lists the read's bytes in order (pieces in dst are merged), ready for
 * writev / fuse_reply_iov; ckpt_store_gather_done() unpins.  Beyond
 * CKPT_GATHER_MAX iovecs everything is copied into dst.
 */
#define CKPT_GATHER_MAX 64
#define CKPT_GATHER_MIN (32u << 10)
struct ckpt_gather {
	bool stream; /* the reader is sequential: chunks it loads are stream entries */
	struct iovec iov[CKPT_GATHER_MAX];
	size_t niov;
	ckpt_cache_entry *pins[CKPT_GATHER_MAX];
	size_t npins;
};
void ckpt_gather_init(struct ckpt_gather *g);
/* Record that n bytes were written to p (in dst, after the previous piece). */
void ckpt_gather_buf(struct ckpt_gather *g, const uint8_t *p, size_t n);
void ckpt_store_gather_done(ckpt_store *s, struct ckpt_gather *g);
/* ckpt_store_read_extents with a gather (g may be NULL). */
ssize_t ckpt_store_read_extents_gather(ckpt_store *s, const struct ckpt_extent_list *l,
				       void *dst, size_t len, uint64_t off, struct ckpt_gather *g);

struct ckpt_read_cursor {
	const struct ckpt_extent_list *l;
	struct ckpt_gather *g; /* NULL: copy everything into dst */
	size_t hint, ei;
	ckpt_cache_entry *e; /* pinned chunk of extent ei, or NULL */
	const uint8_t *data;
	size_t dlen;
	size_t got; /* bytes of e read through this cursor */
};
void ckpt_read_cursor_init(struct ckpt_read_cursor *c, const struct ckpt_extent_list *l);
ssize_t ckpt_store_cursor_read(ckpt_store *s, struct ckpt_read_cursor *c, void *dst, size_t len,
			       uint64_t off);
void ckpt_store_cursor_done(ckpt_store *s, struct ckpt_read_cursor *c);
/* Digests of the chunks under [off, off+len) of l, in order, at most max,
 * consecutive repeats and a first one equal to skip (may be NULL) left out.
 * Returns how many were written to out. */
size_t ckpt_store_prefetch_list(const struct ckpt_extent_list *l, uint64_t off, uint64_t len,
				ckpt_digest *out, size_t max, const ckpt_digest *skip);
/* Load the committed extent list of regular file ino (empty list if none). */
int ckpt_store_load_extents(ckpt_store *s, uint64_t ino, struct ckpt_extent_list **ret_list);
/* Atomically replace the content of regular file ino with l (see the
 * contract above).  flags: CKPT_INODE_F_*.  mtime_ns: new mtime (and ctime).
 * durable=false publishes through the overlay (returns without I/O);
 * durable=true writes and fsyncs the index before returning. */
int ckpt_store_commit_file(ckpt_store *s, uint64_t ino, const struct ckpt_extent_list *l,
			   uint32_t flags, int64_t mtime_ns, bool durable);
/* Make the committed content of ino durable (fsync semantics). */
int ckpt_store_sync_file(ckpt_store *s, uint64_t ino);
/*
 * A hold (see the contract above).  ckpt_hold_new takes one at the current
 * epoch (-ENOMEM or 0).  ckpt_hold_renew moves it to the current epoch: the
 * holder declares that every digest it keeps is now counted by the index
 * or named by a closed file (a writer right after a commit that left it
 * clean).  ckpt_hold_free ends it (accepts NULL).  Cheap: one mutex and a
 * list update each.
 *
 * A holder that keeps a fixed set of digests for long (an open file of a
 * view) pins them instead of keeping the whole store's garbage: it takes a
 * hold, obtains its extent lists, pins them (ckpt_hold_pin: their chunks
 * are never dropped while pinned; -ENOMEM), then narrows the hold
 * (ckpt_hold_narrow: from then on the hold keeps only what it pinned).
 * ckpt_hold_free unpins.  Pinning costs one hash update per chunk.
 *
 * Thread-safe; one hold is used by one owner at a time.
 */
typedef struct ckpt_hold ckpt_hold;
int ckpt_hold_new(ckpt_store *s, ckpt_hold **ret_hold);
void ckpt_hold_renew(ckpt_hold *h);
int ckpt_hold_pin(ckpt_hold *h, const struct ckpt_extent_list *l);
void ckpt_hold_narrow(ckpt_hold *h);
void ckpt_hold_free(ckpt_hold *h);
/* Wait until background compression and compaction have nothing left to
 * do (or timeout_ms passed): for tests and benchmarks.  Returns 0, or
 * -ETIMEDOUT. */
int ckpt_store_settle(ckpt_store *s, unsigned timeout_ms);
/* Statistics of the background work since open. */
struct ckpt_bg_stats {
	uint64_t compressed, compressed_in, compressed_out; /* chunks, raw, stored bytes */
	uint64_t incompressible, moved, packs_deleted;
	uint64_t queued; /* chunks waiting for compression now */
	uint64_t dropped;         /* index entries of unreferenced chunks dropped */
	uint64_t pending_dropped; /* pending chunks no content named, forgotten */
};
void ckpt_store_bg_stats(ckpt_store *s, struct ckpt_bg_stats *ret);
/* Render s's own metrics (chunk cache, compression inline and in the
 * background, background backlog, closed files not yet indexed) with the
 * process's (base/metrics.h) from now until ckpt_store_free(s).  One store
 * per process should: two would render their families twice.  0 or
 * -ENOMEM. */
int ckpt_store_metrics_register(ckpt_store *s);
/* Make every namespace change and commit written so far durable (the
 * metadata engine's log synced): fsyncdir semantics.  0 or -errno. */
int ckpt_store_sync_meta(ckpt_store *s);
/*
 * Parsed-header records of view sources (views/view.c): an opaque value
 * per inode that the store keeps beside the inode and deletes with it.  A
 * cache: _put is best effort (RW stores only; errors are returned, and
 * callers may ignore them); _get returns 0 and a malloc'd copy (caller
 * frees), -ENOENT when there is none, or -errno.
 */
int ckpt_store_parsed_get(ckpt_store *s, uint64_t ino, uint8_t **ret_val, size_t *ret_len);
int ckpt_store_parsed_put(ckpt_store *s, uint64_t ino, const void *val, size_t len);
/* Index every overlay entry now (one batch).  0 or -errno; entries that
 * could not be written stay in the overlay and are retried. */
int ckpt_store_flush(ckpt_store *s);

/* ---- namespace ---- */

int ckpt_store_getattr(ckpt_store *s, uint64_t ino, struct ckpt_inode *ret);
int ckpt_store_lookup(ckpt_store *s, uint64_t parent, const char *name, struct ckpt_inode *ret);
/* Create a regular file, directory or symlink (target != NULL) under
 * parent.  -EEXIST, -ENOENT (parent gone), -ENOTDIR, -ENAMETOOLONG, -EINVAL
 * (another type, or a bad name). */
int ckpt_store_mknode(ckpt_store *s, uint64_t parent, const char *name, uint32_t mode,
		      uint32_t uid, uint32_t gid, const char *symlink_target,
		      struct ckpt_inode *ret);
/* Create a fifo, socket, character or block device (rdev: its device
 * number) under parent: an inode with no content.  Errors as mknode. */
int ckpt_store_mknod(ckpt_store *s, uint64_t parent, const char *name, uint32_t mode,
		     uint32_t uid, uint32_t gid, uint64_t rdev, struct ckpt_inode *ret);
int ckpt_store_link(ckpt_store *s, uint64_t ino, uint64_t newparent, const char *newname,
		    struct ckpt_inode *ret);
int ckpt_store_readlink(ckpt_store *s, uint64_t ino, char **ret_target);
/* Remove a name.  rmdir selects directory semantics (-ENOTDIR, -ENOTEMPTY);
 * otherwise -EISDIR for directories.  An inode whose nlink drops to 0
 * becomes an orphan; ckpt_store_reap() deletes it once unused. */
int ckpt_store_unlink(ckpt_store *s, uint64_t parent, const char *name, bool rmdir);
/* flags: 0, RENAME_NOREPLACE or RENAME_EXCHANGE. */
int ckpt_store_rename(ckpt_store *s, uint64_t parent, const char *name, uint64_t newparent,
		      const char *newname, unsigned flags);
/* Delete an orphan inode (nlink == 0) and release its chunks.  No-op
 * returning 0 if the inode is not an orphan. */
int ckpt_store_reap(ckpt_store *s, uint64_t ino);
/* Set mode/uid/gid/times; CKPT_SET_* (meta/ns.h) select fields; size is
 * not handled here (content changes go through commit_file). */
int ckpt_store_setattr(ckpt_store *s, uint64_t ino, unsigned what, const struct ckpt_inode *in,
		       struct ckpt_inode *ret);

/* All entries of directory ino, in name order (no "." / "..").  Caller
 * frees with ckpt_dirents_free (meta/ns.h). */
int ckpt_store_readdir(ckpt_store *s, uint64_t ino, struct ckpt_dirent **ret_ents,
		       size_t *ret_n);
int ckpt_store_statfs(ckpt_store *s, struct statvfs *ret);

/* Full path of ino (for messages), malloc'd; "?" components if unknown. */
char *ckpt_store_path_of(ckpt_store *s, uint64_t ino);

/* ---- maintenance (store.c; used by `ckpt`) ---- */
struct ckpt_store_stats {
	uint64_t files, dirs, symlinks;
	uint64_t logical_bytes; /* sum of regular file sizes */
	uint64_t unique_bytes;  /* raw bytes of referenced chunks */
	uint64_t stored_bytes;  /* stored bytes of referenced chunks */
	uint64_t chunks;        /* referenced chunks */
	uint64_t dead_chunks, dead_bytes; /* refcount 0: dropped by the daemon's
					   * background work (or gc) */
	uint64_t pack_files, pack_bytes;
	uint64_t unindexed_bytes; /* pack space no index entry names (gc reclaims it) */
	uint64_t deferred_chunks; /* stored raw, background compression pending */
};
int ckpt_store_stats(ckpt_store *s, struct ckpt_store_stats *ret);
/* fsck: report each problem through cb (path may be NULL); returns the
 * number of problems (>= 0) or -errno. */
int ckpt_store_fsck(ckpt_store *s, void (*cb)(void *ud, const char *path, const char *what),
		    void *ud);
struct ckpt_gc_stats {
	uint64_t chunks_dropped, bytes_dropped, packs_rewritten, packs_deleted;
	uint64_t bytes_before, bytes_after;
	/* shared engines: the gc epoch this run ended (0: none), the node
	 * sessions it found live and the ones it declared dead */
	uint64_t epoch, sessions_live, sessions_dead;
	uint64_t sessions_suspected; /* of the live: too old, dead at a pass a
				      * timeout later if still so */
	bool online; /* only what is safe beside live nodes was done */
};
/* Reclaim space of unreferenced chunks.  Crash-safe at every step.  On a
 * shared engine first the online pass (docs/cluster.md section 7): the
 * gc epoch advances, sessions past their timeout are declared dead, the
 * chunks whose refcount fell to 0 before every live session's pin epoch
 * are dropped and the units no chunk entry names and no live session
 * appends to are deleted; then, only when the store is opened with the
 * exclusive lock (not gc_online) and no session is live, the offline
 * gc (every refcount-0 chunk, compaction of partly live units).  -EBUSY
 * when another gc runs on the store. */
int ckpt_store_gc(ckpt_store *s, struct ckpt_gc_stats *ret);

/* ---- node sessions (opts.node; session.c) ---- */

/* This node's id, or NULL when the store is not opened as a node. */
const char *ckpt_store_node(const ckpt_store *s);
/* Refresh the session now (the heartbeat thread does it every
 * session_timeout/6, at most 5 s): 0, -ESTALE when gc had declared it dead
 * (a new session is then registered), or -errno. */
int ckpt_store_heartbeat(ckpt_store *s);
/* The current session's id (0: none) and how many sessions this open
 * registered (1 + re-registrations after being declared dead). */
void ckpt_store_session_ids(ckpt_store *s, uint64_t *ret_id, uint64_t *ret_registered);

/* ---- progress and reading back (verify.c; used by `ckpt`) ---- */

/* Report the progress of ckpt_store_fsck (stored bytes of the chunks read)
 * and ckpt_store_gc (payload bytes of the units compacted) through p
 * (base/progress.h; NULL: none).  p must stay valid while they run. */
void ckpt_store_set_progress(ckpt_store *s, const struct ckpt_progress *p);

/* What ckpt_store_verify reads: every indexed chunk when all three limits
 * are 0; otherwise a prefix of a random order of the chunks, as long as
 * every limit given allows. */
struct ckpt_verify_opts {
	uint32_t sample_ppm;   /* this share of the chunks, in parts per million
				* (rounded up; 0: no limit) */
	uint64_t sample_count; /* at most this many chunks (0: no limit) */
	uint64_t byte_budget;  /* chunks until their stored bytes reach this
				* (0: no limit) */
	uint64_t seed;         /* of the random order; 0: from the clock */
	const struct ckpt_progress *progress; /* stored bytes read (may be NULL) */
};
struct ckpt_verify_stats {
	uint64_t chunks, bytes;           /* indexed chunks and their stored bytes */
	uint64_t selected, selected_bytes; /* chosen for reading */
	uint64_t checked, checked_bytes, raw_bytes; /* read and found intact */
	uint64_t damaged;  /* confirmed damaged */
	uint64_t moved;    /* found intact at a newer location (a live store) */
	uint64_t vanished; /* dropped from the index while verify ran */
	uint64_t unsettled; /* still moving after every view: not verified */
	uint64_t views;    /* newer views of a live store opened */
};
/* cb(ud, NULL, what) for a damaged chunk; cb(ud, path, what) for each file
 * that uses one. */
typedef void (*ckpt_verify_report_fn)(void *ud, const char *path, const char *what);
/*
 * Read back chunks: each record is read with its checksum, decompressed
 * and its digest checked.  Works on a store opened CKPT_STORE_RO_SHARED
 * while a daemon serves it: a read that fails is judged again in a newer
 * view of the index, so a chunk the daemon moved or dropped meanwhile is
 * never reported (verify.c explains why that is sound).  Returns the
 * number of damaged and unsettled chunks (>= 0), or -errno (-EINVAL: bad
 * options); *ret counts what was done.
 */
int ckpt_store_verify(ckpt_store *s, const struct ckpt_verify_opts *o, ckpt_verify_report_fn cb,
		      void *ud, struct ckpt_verify_stats *ret);
/*
 * Repair (`ckpt repair`, docs/design.md section 15): bring the store at
 * path, whose index may be damaged, back to a state that opens and passes
 * fsck, without ever naming bytes a file did not hold.  Takes the store's
 * lock (unmounted store).  Two steps:
 *  1. the index: restored from the metadata log (STORE/metalog) into a new
 *     one and compared with the index in place, read whole; an index that
 *     cannot be opened or read, or that lacks commits its log holds, is
 *     replaced by the restored one (the old one is kept as
 *     STORE/index.damaged.N); without a usable log, the engine's own
 *     salvage rebuilds what it can;
 *  2. the namespace and chunk index, checked against each other and
 *     against the record headers of every unit of the chunk backend:
 *     chunk entries that are missing or name the wrong record are
 *     re-pointed at a record that verifies; a file whose content cannot be
 *     found whole, or whose records disagree, is removed and reported
 *     lost by path; names of missing inodes are removed; inodes no name
 *     reaches are linked into /lost+found; link counts, reference counts
 *     and the id counters are set to what the records say.  Then a new
 *     snapshot of the index is taken into the metadata log.
 * cb reports what it finds as it goes (path NULL when no file is
 * concerned).  Returns 0 (see *ret for what was done) or -errno with err
 * naming the store and the reason.
 */
enum ckpt_repair_kind {
	CKPT_REPAIR_NOTE,  /* what was found */
	CKPT_REPAIR_FIXED, /* a record changed, nothing lost */
	CKPT_REPAIR_LOST,  /* a file removed: its content could not be recovered */
};
typedef void (*ckpt_repair_fn)(void *ud, enum ckpt_repair_kind kind, const char *path,
			       const char *what);
struct ckpt_repair_stats {
	bool index_damaged;   /* the index could not be opened or read whole */
	bool index_replaced;  /* it was replaced (restored from its log, or salvaged) */
	bool salvaged;        /* by the engine's salvage: no intact copy existed */
	bool log_damaged;     /* the metadata log had damage or was missing */
	uint64_t log_last;    /* the last commit the metadata log restored */
	uint64_t differences; /* keys an intact index and its restored log disagree on */
	uint64_t files_lost;  /* removed (reported with CKPT_REPAIR_LOST) */
	uint64_t fixed;       /* records changed otherwise */
	uint64_t chunks_relocated; /* chunk entries pointed at another record */
};
int ckpt_store_repair(const char *path, ckpt_repair_fn cb, void *ud,
		      struct ckpt_repair_stats *ret, char *err, size_t errlen);

#endif
