/* SPDX-License-Identifier: MIT */
/*
 * backend.h - chunk backends: where the stored bytes of chunks live.
 *
 * The store (core/store/) decides what a chunk is: its digest, codec,
 * compression, reference count and where its index entry says it lives.
 * A chunk backend keeps the stored bytes of chunk records and says where
 * each one is: put() appends a record and returns its location, an opaque
 * CKPT_CHUNK_WHERE_LEN-byte blob (struct ckpt_chunk_loc.where) that the
 * store keeps in its metadata and hands back to get().  Nothing above a
 * backend interprets the blob: no caller outside core/chunk/ knows pack
 * ids or offsets.  Space is organised in reclaimable units (a pack file,
 * an object): records are never changed in place, space is reclaimed by
 * copying a unit's live records elsewhere and then deleting the whole
 * unit.  In the spirit of JuiceFS's object.ObjectStorage and casync's
 * castore, but with locations chosen by the backend, not derived from the
 * digest, so that records of one save lie together and are read together.
 *
 * A backend is an ops table (struct ckpt_chunk_backend_ops) and an object
 * whose first member is struct ckpt_chunk_backend (its ops).  Backends are
 * registered by name in ckpt_chunk_backends[]; the store opens the one its
 * options name ("pack" by default).  The ckpt_cb_*() inline functions
 * below are the calls: one indirect call each, no copy of the data.
 *
 * The backends, and what each implements:
 *  - "pack" (pack_backend.c, the first one): append-only pack files
 *    (pack.h) in STORE/packs.  where = le64 pack id, le64 record offset
 *    (bytes 16..31 of the index's chunk entry, docs/format.md 5.2).  A unit
 *    is a pack.  put appends to the current write pack (one for fresh
 *    chunks, one for chunks moved by background work) and starts a new one
 *    past unit_max; sync fdatasyncs the packs up to the records given
 *    (group commit); get reads one record with O_DIRECT into the caller's
 *    huge-page buffer; the span reads group nearby records of a batch into
 *    one O_DIRECT request each and submit them through a per-thread kernel
 *    AIO context; reclaim unlinks the pack and frees its object once no
 *    reader holds it.
 *  - a shared pack directory (several nodes mount one store): the same
 *    pack files in a directory every node sees.  Each node appends only to
 *    packs it created (unit ids carry the node's id, from next_id), reads
 *    any node's packs, and opens a pack another node is still appending to
 *    read-only, re-reading its size when a location lies past the end it
 *    knows.  sync is unchanged (fdatasync of the node's own packs; the
 *    shared file system must make that durable for every node).  reclaim
 *    deletes only units no node appends to any more and no node's metadata
 *    names: the decision is the metadata engine's (issue 9), the backend
 *    only unlinks.
 *  - an object store (S3, RADOS): objects are immutable and cannot be
 *    appended to.  put buffers records in memory into the next object (a
 *    unit) and uploads it when it reaches unit_max or at sync, which is the
 *    upload (a PUT whose success is the durability barrier); get is a range
 *    GET of the record; the span reads are range GETs of neighbouring
 *    records, in parallel instead of kernel AIO; reclaim is a DELETE;
 *    units lists the objects (LIST with the store's prefix); statfs reports
 *    the local staging space only.  where = object number + offset, as for
 *    packs.
 *
 * Ownership: the backend owns its units, its open descriptors and its
 * per-thread span state; the caller owns every buffer it passes (get and
 * the span reads write into buffers the caller provides or the backend
 * lends until span_end).  Locations are plain values: copy them freely.
 *
 * Thread-safety: every op may be called concurrently from any thread,
 * except free (no other call may run) and the span ops (a span batch
 * belongs to the thread that began it, which must end it).  reclaim may run
 * while readers use other units and waits for readers of the unit itself.
 *
 * Errors: 0 (or a count) on success, negative errno on failure.  Damaged
 * or missing data is always -EIO, never wrong bytes: a record that does
 * not check out (header, stored length, and when asked the stored bytes'
 * checksum) is refused; the caller then also verifies the decoded bytes
 * against the chunk's keyed digest.  Ops that have a reason to give
 * (get) return it as a static string for the caller's message.
 *
 * Durability: a put record is not durable until sync() covers it.  The
 * store syncs the records a metadata commit references before that commit
 * (data before the metadata that names it), and reclaims a unit only after
 * its metadata no longer names it (durably).
 */
#ifndef CKPT_CHUNK_BACKEND_H
#define CKPT_CHUNK_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/statvfs.h>
#include <sys/uio.h>

/* Where a chunk's record lives, as the store's metadata keeps it. */
#define CKPT_CHUNK_WHERE_LEN 16
#define CKPT_CHUNK_F_DEFERRED 0x1u /* stored raw; compression not tried yet */
struct ckpt_chunk_loc {
	uint8_t where[CKPT_CHUNK_WHERE_LEN]; /* the backend's: opaque above it */
	uint32_t stored_len, raw_len;
	uint8_t codec;
	uint8_t flags; /* CKPT_CHUNK_F_* (the store's) */
	uint8_t elem;  /* compression hint (element size) for deferred chunks */
};

/* The same record, as the backend keeps it: a backend stores the header
 * fields with the record and checks them on every read. */
struct ckpt_chunk_rec {
	uint8_t codec;
	uint32_t stored_len, raw_len;
	uint8_t digest[16];
};

/* Whether two locations name the same record. */
bool ckpt_chunk_loc_same(const struct ckpt_chunk_loc *a, const struct ckpt_chunk_loc *b);

typedef struct ckpt_chunk_backend ckpt_chunk_backend;
typedef struct ckpt_chunk_span ckpt_chunk_span; /* a batch of span reads */

/* What put() appends for: the write path's fresh chunks, or chunks moved by
 * background work and compaction (kept in other units, so that units of
 * fresh raw chunks later die whole and need no copying). */
enum ckpt_chunk_class {
	CKPT_CHUNK_FRESH,
	CKPT_CHUNK_MOVED,
};

struct ckpt_chunk_backend_conf {
	const char *store_path; /* for messages */
	int store_fd;           /* the store's directory */
	const uint8_t *uuid;    /* 16 bytes: the store's, written into units */
	bool writable;          /* put, sync, seal and reclaim allowed */
	bool create;            /* a new store: create the backend's layout */
	uint64_t unit_max;      /* start a new unit past this many bytes */
	bool sync_readahead;    /* span reads with pread, never kernel AIO */
	/* A new unit id, made durable by the caller before it returns (so that
	 * an id is never reused after a crash).  0 or -errno. */
	int (*next_id)(void *ud, uint64_t *ret_id);
	void *ud;
};

/* A reclaimable unit (a pack file, an object). */
struct ckpt_chunk_unit {
	uint64_t id;
	uint64_t bytes;   /* its size */
	uint64_t payload; /* of that, bytes records may occupy */
	bool active;      /* an append target now: seal it before reclaiming */
};

struct ckpt_chunk_backend_stats {
	uint64_t units, bytes; /* units and their bytes, now */
	/* span requests since open: read asynchronously (kernel AIO), read
	 * with a blocking read in span_wait, and of either, failed (short, an
	 * error, or the unit gone: their chunks were then read with get) */
	uint64_t span_async, span_sync, span_failed;
};

/* One chunk of a span batch. */
struct ckpt_chunk_span_item {
	struct ckpt_chunk_loc loc; /* in */
	const uint8_t *stored;     /* out: its stored bytes, or NULL (read it with get) */
	struct ckpt_chunk_rec rec; /* out: its checked header, when stored != NULL */
};
/* Per thread: span batches begun and not ended (each holds a span buffer). */
#define CKPT_CHUNK_SPAN_INFLIGHT 2

struct ckpt_chunk_backend_ops {
	const char *name;

	/* Open (conf->create: create) the backend of the store conf describes;
	 * *ret owns it.  Errors name the store and the reason in err. */
	int (*open)(const struct ckpt_chunk_backend_conf *conf, ckpt_chunk_backend **ret,
		    char *err, size_t errlen);
	/* Close; does not sync.  Accepts NULL. */
	void (*free)(ckpt_chunk_backend *b);

	/* Append a record (header rec, stored bytes iov[0..cnt), cnt <=
	 * CKPT_CHUNK_PUT_IOV, lengths adding up to rec->stored_len) and set
	 * *ret_loc (where, stored_len, raw_len, codec; flags and elem 0).  Not
	 * durable until sync().  -EROFS when not writable, -ENOSPC, -EIO. */
	int (*put)(ckpt_chunk_backend *b, const struct ckpt_chunk_rec *rec, const struct iovec *iov,
		   int cnt, enum ckpt_chunk_class cls, struct ckpt_chunk_loc *ret_loc);
	/* Durability barrier: every record at locs[0..n) whose put returned is
	 * durable when this returns 0.  Cheap for records already covered;
	 * concurrent callers share one device sync.  A failed sync is sticky:
	 * the unit takes no more appends. */
	int (*sync)(ckpt_chunk_backend *b, const struct ckpt_chunk_loc *locs, size_t n);
	/* Make everything put so far durable (shutdown). */
	int (*sync_all)(ckpt_chunk_backend *b);

	/* The buffer get() needs for loc: bytes, a multiple of
	 * CKPT_CHUNK_BUF_ALIGN. */
	size_t (*get_len)(ckpt_chunk_backend *b, const struct ckpt_chunk_loc *loc);
	/* The most get_len() returns for a record of stored_len bytes. */
	size_t (*get_len_max)(ckpt_chunk_backend *b, uint32_t stored_len);
	/* Read loc's record into buf (aligned to CKPT_CHUNK_BUF_ALIGN, cap >=
	 * get_len bytes) and check it (header, stored length, with check_data
	 * the stored bytes' checksum).  0 with *ret_rec and *ret_stored (inside
	 * buf); -EIO with *ret_why when the record is damaged or missing. */
	int (*get)(ckpt_chunk_backend *b, const struct ckpt_chunk_loc *loc, bool check_data,
		   uint8_t *buf, size_t cap, struct ckpt_chunk_rec *ret_rec,
		   const uint8_t **ret_stored, const char **ret_why);

	/* Span reads (read-ahead) on the calling thread: plan reads of the
	 * records of items[0..n) (the backend may reorder the pointer array)
	 * into the thread's span buffer and with submit start them; items the
	 * plan leaves out keep stored == NULL.  -ENOMEM. */
	int (*span_begin)(ckpt_chunk_backend *b, struct ckpt_chunk_span_item **items, size_t n,
			  bool submit, ckpt_chunk_span **ret);
	/* Wait for (or make) the batch's reads and check each record (header
	 * and stored length, not the data checksum: the caller checks the
	 * decoded bytes).  Sets stored/rec of the items that came back whole. */
	void (*span_wait)(ckpt_chunk_backend *b, ckpt_chunk_span *sp);
	/* Give back the span buffer (the items' stored pointers die). */
	void (*span_end)(ckpt_chunk_backend *b, ckpt_chunk_span *sp);
	/* Map and touch the calling thread's span buffers now.  0 or -ENOMEM. */
	int (*span_warm)(ckpt_chunk_backend *b);

	/* The unit holding loc's record, and the bytes the record takes in it. */
	uint64_t (*unit_of)(ckpt_chunk_backend *b, const struct ckpt_chunk_loc *loc);
	uint64_t (*rec_bytes)(ckpt_chunk_backend *b, const struct ckpt_chunk_loc *loc);
	/* Every unit, sorted by id (caller frees *ret). */
	int (*units)(ckpt_chunk_backend *b, struct ckpt_chunk_unit **ret, size_t *ret_n);
	/* Stop appending to unit id (later puts go to a new unit). */
	int (*seal)(ckpt_chunk_backend *b, uint64_t id);
	/* Delete unit id and release its space.  The caller guarantees that no
	 * metadata names it any more; readers still in it finish first. */
	int (*reclaim)(ckpt_chunk_backend *b, uint64_t id);
	/* Every record that unit id holds as far as its headers tell (records no
	 * metadata names included): cb(ud, loc, rec) until it returns non-zero. */
	int (*scan)(ckpt_chunk_backend *b, uint64_t id,
		    int (*cb)(void *ud, const struct ckpt_chunk_loc *loc,
			      const struct ckpt_chunk_rec *rec),
		    void *ud);

	/* Free space where puts go (statvfs). */
	int (*statfs)(ckpt_chunk_backend *b, struct statvfs *ret);
	void (*stats)(ckpt_chunk_backend *b, struct ckpt_chunk_backend_stats *ret);
	/* loc for messages ("pack 3, offset 4096"), NUL-terminated in buf. */
	void (*describe)(ckpt_chunk_backend *b, const struct ckpt_chunk_loc *loc, char *buf,
			 size_t len);
};

#define CKPT_CHUNK_PUT_IOV 4
#define CKPT_CHUNK_BUF_ALIGN 4096u
#define CKPT_CHUNK_DESC_MAX 64 /* enough for describe() */

/* Every backend object starts with this. */
struct ckpt_chunk_backend {
	const struct ckpt_chunk_backend_ops *ops;
};

/* The registered backends, NULL-terminated; the first is the default. */
extern const struct ckpt_chunk_backend_ops *const ckpt_chunk_backends[];
/* The backend registered as name (NULL: the default), or NULL. */
const struct ckpt_chunk_backend_ops *ckpt_chunk_backend_find(const char *name);

extern const struct ckpt_chunk_backend_ops ckpt_pack_backend_ops; /* "pack" */

static inline int ckpt_cb_put(ckpt_chunk_backend *b, const struct ckpt_chunk_rec *rec,
			      const struct iovec *iov, int cnt, enum ckpt_chunk_class cls,
			      struct ckpt_chunk_loc *ret_loc)
{
	return b->ops->put(b, rec, iov, cnt, cls, ret_loc);
}
static inline int ckpt_cb_sync(ckpt_chunk_backend *b, const struct ckpt_chunk_loc *locs,
			       size_t n)
{
	return b->ops->sync(b, locs, n);
}
static inline int ckpt_cb_sync_all(ckpt_chunk_backend *b)
{
	return b->ops->sync_all(b);
}
static inline size_t ckpt_cb_get_len(ckpt_chunk_backend *b, const struct ckpt_chunk_loc *loc)
{
	return b->ops->get_len(b, loc);
}
static inline size_t ckpt_cb_get_len_max(ckpt_chunk_backend *b, uint32_t stored_len)
{
	return b->ops->get_len_max(b, stored_len);
}
static inline int ckpt_cb_get(ckpt_chunk_backend *b, const struct ckpt_chunk_loc *loc,
			      bool check_data, uint8_t *buf, size_t cap,
			      struct ckpt_chunk_rec *ret_rec, const uint8_t **ret_stored,
			      const char **ret_why)
{
	return b->ops->get(b, loc, check_data, buf, cap, ret_rec, ret_stored, ret_why);
}
static inline int ckpt_cb_span_begin(ckpt_chunk_backend *b, struct ckpt_chunk_span_item **items,
				     size_t n, bool submit, ckpt_chunk_span **ret)
{
	return b->ops->span_begin(b, items, n, submit, ret);
}
static inline void ckpt_cb_span_wait(ckpt_chunk_backend *b, ckpt_chunk_span *sp)
{
	b->ops->span_wait(b, sp);
}
static inline void ckpt_cb_span_end(ckpt_chunk_backend *b, ckpt_chunk_span *sp)
{
	b->ops->span_end(b, sp);
}
static inline int ckpt_cb_span_warm(ckpt_chunk_backend *b)
{
	return b->ops->span_warm(b);
}
static inline uint64_t ckpt_cb_unit_of(ckpt_chunk_backend *b, const struct ckpt_chunk_loc *loc)
{
	return b->ops->unit_of(b, loc);
}
static inline uint64_t ckpt_cb_rec_bytes(ckpt_chunk_backend *b, const struct ckpt_chunk_loc *loc)
{
	return b->ops->rec_bytes(b, loc);
}
static inline int ckpt_cb_units(ckpt_chunk_backend *b, struct ckpt_chunk_unit **ret,
				size_t *ret_n)
{
	return b->ops->units(b, ret, ret_n);
}
static inline int ckpt_cb_seal(ckpt_chunk_backend *b, uint64_t id)
{
	return b->ops->seal(b, id);
}
static inline int ckpt_cb_reclaim(ckpt_chunk_backend *b, uint64_t id)
{
	return b->ops->reclaim(b, id);
}
static inline int ckpt_cb_scan(ckpt_chunk_backend *b, uint64_t id,
			       int (*cb)(void *ud, const struct ckpt_chunk_loc *loc,
					 const struct ckpt_chunk_rec *rec),
			       void *ud)
{
	return b->ops->scan(b, id, cb, ud);
}
static inline int ckpt_cb_statfs(ckpt_chunk_backend *b, struct statvfs *ret)
{
	return b->ops->statfs(b, ret);
}
static inline void ckpt_cb_stats(ckpt_chunk_backend *b, struct ckpt_chunk_backend_stats *ret)
{
	b->ops->stats(b, ret);
}
static inline void ckpt_cb_describe(ckpt_chunk_backend *b, const struct ckpt_chunk_loc *loc,
				    char *buf, size_t len)
{
	b->ops->describe(b, loc, buf, len);
}
/* Close b (accepts NULL). */
static inline void ckpt_cb_free(ckpt_chunk_backend *b)
{
	if (b)
		b->ops->free(b);
}

#endif
