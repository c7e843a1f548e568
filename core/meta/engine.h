/* SPDX-License-Identifier: MIT */
/*
 * engine.h - the metadata engine: an ordered key-value store with
 * transactions, behind an ops table of drivers registered by name (the
 * table in engine.c; "rocksdb" is the first and the default).  Keys and
 * values are byte strings; what they mean is meta/records.h's business,
 * never the engine's.
 *
 * Transactions.  ckpt_txn_begin() starts one; ckpt_txn_get/put/delete work
 * in it (a get sees the transaction's own writes); ckpt_txn_commit() applies
 * all of its writes atomically or none of them.  A read made with
 * CKPT_TXN_FOR_UPDATE is tracked: if any other writer (another transaction
 * of this process, or of another process sharing the engine) commits a
 * change to that key after the read, or to a key this transaction writes
 * after it first wrote or tracked it, the commit fails with -EAGAIN and
 * changes nothing.  The caller then starts again from a new transaction,
 * reading again (ckpt_txn_retry()).  Reads made without the flag, and
 * scans, are not tracked: a read-modify-write must read for update what
 * its decision depends on (a namespace operation reads the parent
 * directory's inode for update, which every change of that directory's
 * entries also writes, so a concurrent create or remove of a name conflicts
 * through it).
 *
 * Durability.  A commit with durable=false survives the crash of the
 * process once it returned (the engine has the change) but may be lost in a
 * power loss; ckpt_engine_sync() makes every commit made so far durable.  A
 * commit with durable=true is durable when it returns.
 *
 * Reads outside a transaction (ckpt_engine_get, a scan with t == NULL) see
 * committed state only; a scan works on a consistent snapshot taken when it
 * starts.  They are the cheap path for lookups that change nothing.
 *
 * Ownership.  ckpt_engine_open() returns an engine the caller closes with
 * ckpt_engine_close() after every transaction and scan of it has ended.
 * Commit and abort both end (free) the transaction, whatever their result;
 * abort accepts NULL.  A scan of a transaction must be freed before the
 * transaction ends.  Values returned by ckpt_*_get are malloc'd and the
 * caller's; a scan's key/value pointers are valid until its next call.
 *
 * Thread-safety.  An engine may be used from any number of threads at once.
 * A transaction or a scan belongs to one thread at a time.
 *
 * Errors: 0 (or 1 / 0 for a scan step) on success, else a negative errno:
 * -ENOENT absent key, -EAGAIN conflict (retry), -EROFS write on a read-only
 * engine, -EBUSY the engine is held by another writer (open), -ENOSPC,
 * -ENOMEM, -EIO anything else.  open() writes a reason to err.
 *
 * A second engine, "postgresql" (postgres.c), lets daemons on several nodes
 * share one store's metadata (docs/cluster.md section 2): "where" is a libpq
 * connection string; the keys and values are rows of one table; a
 * transaction buffers its writes in the daemon and commits them in one SQL
 * transaction that first locks and checks the rows of every key it read for
 * update or wrote (optimistic, as this contract requires); durable commits
 * run with synchronous_commit on.  Its calls wait for the server with a
 * deadline and fail with -EIO past it, never hang.
 *
 * The metadata log (meta/mlog.h).  An engine opened read-write with
 * opts.log_dir keeps a second copy of its contents there: every commit's
 * writes are appended to a log before the engine applies them, and
 * snapshots of the whole key space are taken as the log grows
 * (ckpt_engine_backup), so that damaged engine files can be rebuilt
 * (`ckpt repair`, docs/design.md section 15).  Each logged commit has a
 * number, and its record the engine's stamp once it is applied (ops
 * stamp); the engine records at each open which commit it holds
 * (CKPT_ENGINE_MARK_KEY), and open finds by its stamp where it stands in
 * the log: commits the engine lacks (its write-ahead log lost them) are
 * replayed from the log, and an engine ahead of its log (or one without a
 * log yet) gets a new snapshot.  A log that cannot be written fails the
 * commit (nothing applied).  A
 * PostgreSQL engine would not use it: its own WAL archiving and base
 * backups are the same thing, server-side.
 */
#ifndef CKPT_ENGINE_H
#define CKPT_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ckpt_engine ckpt_engine;
typedef struct ckpt_txn ckpt_txn;
typedef struct ckpt_scan ckpt_scan;

#define CKPT_ENGINE_DEFAULT "rocksdb"

struct ckpt_engine_opts {
	bool create;          /* create it if missing */
	bool read_only;       /* no writes; do not take the writer's lock */
	uint64_t cache_bytes; /* read cache, 0 for the engine's default */
	const char *log_dir;  /* the metadata log's directory (created if
			       * missing); NULL: none.  Not with read_only. */
	uint32_t timeout_ms;  /* a server engine: how long one call waits for the
			       * server (reconnecting) before it fails with -EIO;
			       * 0 for the engine's default (30 s) */
};

/* The logged commit the engine held at its last read-write open: key 'M'
 * "mlog_at", le64 (docs/format.md section 5.1).  Written by engine.c at
 * open (not logged, left out of snapshots). */
#define CKPT_ENGINE_MARK_KEY "Mmlog_at"
#define CKPT_ENGINE_MARK_KEY_LEN 8

/* ---- registry ---- */

/* The registered engines, in table order (first is the default); NULL
 * past the end. */
const struct ckpt_engine_ops *ckpt_engine_at(size_t i);
/* The engine named name, or NULL. */
const struct ckpt_engine_ops *ckpt_engine_find(const char *name);

/* Open engine `name` (NULL: CKPT_ENGINE_DEFAULT) at where (a directory for
 * local engines). */
int ckpt_engine_open(const char *name, const char *where, const struct ckpt_engine_opts *o,
		     ckpt_engine **ret, char *err, size_t errlen);
void ckpt_engine_close(ckpt_engine *e);
const char *ckpt_engine_name(const ckpt_engine *e);

/* ---- committed state ---- */

/* A malloc'd copy of the value (caller frees) and its length. */
int ckpt_engine_get(ckpt_engine *e, const void *key, size_t klen, uint8_t **ret_val,
		    size_t *ret_len);
/* Copy the value into buf of exactly len bytes; -EIO if it has another
 * length. */
int ckpt_engine_get_fixed(ckpt_engine *e, const void *key, size_t klen, void *buf, size_t len);
/* 1 if key exists, 0 if not, or -errno. */
int ckpt_engine_has(ckpt_engine *e, const void *key, size_t klen);
/* Called by ckpt_engine_get_many for key i found, with its value (valid
 * during the call only); a negative return stops the call with it. */
typedef int (*ckpt_engine_many_fn)(void *arg, size_t i, const uint8_t *val, size_t len);
/* The committed values of n keys (distinct) in one request where the
 * engine can (a server engine: one round trip instead of n): fn for each
 * key found, in any order; keys absent are not reported.  0 or -errno. */
int ckpt_engine_get_many(ckpt_engine *e, const uint8_t *const *keys, const size_t *klens,
			 size_t n, ckpt_engine_many_fn fn, void *arg);
/* True when ckpt_engine_get_many is one request (a server engine), not a
 * get per key. */
bool ckpt_engine_batches(const ckpt_engine *e);
/* Every commit made so far becomes durable. */
int ckpt_engine_sync(ckpt_engine *e);
/* Write buffered state to the engine's files and sync (before a close
 * that should leave little to replay). */
int ckpt_engine_flush(ckpt_engine *e);
/* Take a snapshot of the engine into its metadata log now (a consistent
 * copy at one commit; commits go on meanwhile).  -EOPNOTSUPP without a
 * log. */
int ckpt_engine_backup(ckpt_engine *e);
/* True when the engine has a metadata log that wants a new snapshot
 * (ckpt_mlog_due). */
bool ckpt_engine_backup_due(ckpt_engine *e);
/* The metadata log's directory, NULL without one. */
const char *ckpt_engine_log_dir(const ckpt_engine *e);

/* ---- transactions ---- */

#define CKPT_TXN_FOR_UPDATE 0x1u /* track the read for conflicts */

int ckpt_txn_begin(ckpt_engine *e, ckpt_txn **ret);
int ckpt_txn_get(ckpt_txn *t, const void *key, size_t klen, unsigned flags, uint8_t **ret_val,
		 size_t *ret_len);
int ckpt_txn_get_fixed(ckpt_txn *t, const void *key, size_t klen, unsigned flags, void *buf,
		       size_t len);
int ckpt_txn_has(ckpt_txn *t, const void *key, size_t klen, unsigned flags);
/* Buffer a write in t.  A failure is also remembered: commit then fails
 * with it and applies nothing, so a caller buffering many writes may check
 * once, at commit. */
int ckpt_txn_put(ckpt_txn *t, const void *key, size_t klen, const void *val, size_t vlen);
int ckpt_txn_delete(ckpt_txn *t, const void *key, size_t klen);
/* Apply the writes atomically and end t.  -EAGAIN: a conflicting commit
 * won, nothing was applied. */
int ckpt_txn_commit(ckpt_txn *t, bool durable);
/* Drop the writes and end t.  NULL-safe. */
void ckpt_txn_abort(ckpt_txn *t);
/* Mark t as a transaction that releases space (it deletes files or chunk
 * records): when the filesystem holding the engine's files is nearly full,
 * an engine that keeps a space allowance (the RocksDB engine) still lets it
 * commit, into that allowance, while it refuses other writes with -ENOSPC,
 * so that deleting files keeps working on a full disk. */
void ckpt_txn_releases_space(ckpt_txn *t);

/* Retry policy for a transaction that failed with r: true (after a short
 * back-off that grows with *attempt) when r is -EAGAIN and fewer than
 * CKPT_TXN_TRIES attempts were made; then the caller begins again. */
#define CKPT_TXN_TRIES 64
bool ckpt_txn_retry(int r, unsigned *attempt);

/* Run fn in a new transaction of e until it commits or fails otherwise
 * than by a conflict (a conflict runs fn again in a new transaction: fn
 * must read what it decides on through t and keep no effects outside t
 * before the commit).  fn returns 0 to commit, > 0 to end without writing
 * (ckpt_txn_run then returns 0), < 0 to fail with that error. */
typedef int (*ckpt_txn_fn)(ckpt_txn *t, void *arg);
int ckpt_txn_run(ckpt_engine *e, ckpt_txn_fn fn, void *arg, bool durable);

/* ---- scans ---- */

/* Iterate, in key order, the keys that start with prefix (and are >= start
 * when start is not NULL).  t == NULL: committed state at a snapshot;
 * otherwise the view of transaction t (its own writes included).  next()
 * returns 1 and the key/value, 0 at the end, or -errno. */
int ckpt_scan_new(ckpt_engine *e, ckpt_txn *t, const void *prefix, size_t plen,
		  const void *start, size_t slen, ckpt_scan **ret);
int ckpt_scan_next(ckpt_scan *sc, const uint8_t **ret_key, size_t *ret_klen,
		   const uint8_t **ret_val, size_t *ret_vlen);
void ckpt_scan_free(ckpt_scan *sc);

/* ---- driver interface ---- */

/* Called with each value read; its pointer is valid during the call only. */
typedef int (*ckpt_engine_val_fn)(void *arg, const uint8_t *val, size_t len);

/* Every driver's engine, transaction and scan objects start with these. */
struct ckpt_engine {
	const struct ckpt_engine_ops *ops;
	struct ckpt_mlog *mlog; /* engine.c's: the metadata log, NULL without;
				 * set at open, then fixed */
};
struct ckpt_txn {
	ckpt_engine *engine;
	int err;            /* first failed put/delete (engine.c); commit returns it */
	bool releases_space; /* ckpt_txn_releases_space() (cleared by begin) */
	/* engine.c's: the writes, serialized for the metadata log (when the
	 * engine has one); emptied at begin, kept with a reused object */
	uint8_t *lbuf;
	size_t llen, lcap;
	uint32_t lops;
};
struct ckpt_scan {
	ckpt_engine *engine;
};

/* The contract of each op is that of the public call of the same name
 * above.  get: t == NULL reads committed state; on a hit calls fn and
 * returns what it returns; -ENOENT when absent (fn not called). */
struct ckpt_engine_ops {
	const char *name;
	/* Several processes, on several nodes, may open it read-write at
	 * once (a server engine); false: one writer process at a time. */
	bool shared;
	int (*open)(const char *where, const struct ckpt_engine_opts *o, ckpt_engine **ret,
		    char *err, size_t errlen);
	void (*close)(ckpt_engine *e);
	int (*get)(ckpt_engine *e, ckpt_txn *t, const void *key, size_t klen, unsigned flags,
		   ckpt_engine_val_fn fn, void *arg);
	/* Optional (NULL: one get per key): committed state only. */
	int (*get_many)(ckpt_engine *e, const uint8_t *const *keys, const size_t *klens, size_t n,
			ckpt_engine_many_fn fn, void *arg);
	int (*begin)(ckpt_engine *e, ckpt_txn **ret);
	int (*put)(ckpt_txn *t, const void *key, size_t klen, const void *val, size_t vlen);
	int (*del)(ckpt_txn *t, const void *key, size_t klen);
	int (*commit)(ckpt_txn *t, bool durable);
	void (*abort)(ckpt_txn *t);
	int (*scan_new)(ckpt_engine *e, ckpt_txn *t, const void *prefix, size_t plen,
			const void *start, size_t slen, ckpt_scan **ret);
	int (*scan_next)(ckpt_scan *sc, const uint8_t **ret_key, size_t *ret_klen,
			 const uint8_t **ret_val, size_t *ret_vlen);
	void (*scan_free)(ckpt_scan *sc);
	int (*sync)(ckpt_engine *e);
	int (*flush)(ckpt_engine *e);
	/* Run fn(arg) while no commit of e is being applied (the commit
	 * exclusion the driver calls ckpt_engine_log_commit under); fn may call
	 * scan_new. */
	int (*quiesce)(ckpt_engine *e, int (*fn)(void *arg), void *arg);
	/* A number that grows with every write applied to the engine and is
	 * the same after a restart (RocksDB: its latest sequence number);
	 * needed by an engine that keeps a metadata log. */
	uint64_t (*stamp)(ckpt_engine *e);
	/* Optional (NULL: none): rebuild the engine's own bookkeeping at where
	 * from whatever of its data files can still be read, in place, for
	 * `ckpt repair` when no intact copy exists (RocksDB: RepairDB).  What
	 * it gives back must be checked record by record. */
	int (*salvage)(const char *where, char *err, size_t errlen);
};

/*
 * For drivers.  A commit that writes calls ckpt_engine_log_commit() under
 * its commit exclusion, after its conflict check and before it applies
 * t's writes, with the stamp the engine will have once they are applied:
 * the writes are appended to the engine's metadata log.  An error fails
 * the commit (nothing written).  If applying then fails,
 * ckpt_engine_log_undo() takes the log record back; if the stamp turns out
 * other than announced, ckpt_engine_log_stale() marks the log broken until
 * the next snapshot.  ckpt_txn_base_free() frees engine.c's part of a
 * transaction object the driver frees; ckpt_txn_base_trim() drops a large
 * buffer of one it keeps for reuse.
 */
int ckpt_engine_log_commit(ckpt_txn *t, uint64_t stamp);
void ckpt_engine_log_undo(ckpt_txn *t);
void ckpt_engine_log_stale(ckpt_engine *e);
void ckpt_txn_base_free(ckpt_txn *t);
void ckpt_txn_base_trim(ckpt_txn *t);

extern const struct ckpt_engine_ops ckpt_engine_rocksdb;
extern const struct ckpt_engine_ops ckpt_engine_postgres;

#endif
