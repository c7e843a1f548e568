/* SPDX-License-Identifier: MIT */
/*
 * mlog.h - the metadata log: a second, self-checksummed copy of everything
 * a metadata engine holds, kept in a directory of its own beside it (the
 * store's STORE/metalog), from which the engine's files can be rebuilt
 * when they are damaged (docs/design.md section 15; the byte layouts are
 * in docs/format.md section 10).  It is PostgreSQL's base backup plus
 * archived WAL, for engines that have no such thing of their own:
 *
 *   snap-B.ckms   a snapshot: every key and value of the engine as they
 *                 were after commit number B, in checksummed blocks
 *   log-B.ckml    the log: every commit after number B, in commit order,
 *                 one checksummed record each (the keys it put, with their
 *                 values, and the keys it deleted)
 *
 * Commits are numbered 1, 2, ... over the life of the store; each record
 * also holds the engine's stamp once it is applied (a number that grows
 * with every write: RocksDB's sequence number), so that the engine and its
 * log can be compared after a crash (ckpt_mlog_locate; the engine records
 * at each open which commit it holds, CKPT_ENGINE_MARK_KEY in engine.h).
 * A log file starts where a snapshot or the log file before it ended: the
 * chain snapshot B, log B (commits B+1..C), log C (C+1..D), ... restores
 * every commit.  A new snapshot is taken once the logs since the newest one
 * outgrow it (ckpt_mlog_due); the two newest snapshots are kept, with the
 * logs that follow the older one, so that one damaged snapshot leaves the
 * older one and its logs to restore from.
 *
 * Writer.  The engine that owns the metadata opens the log (ckpt_mlog_open)
 * after its own files, finds which commit it holds (ckpt_mlog_locate) and
 * replays what it lacks (ckpt_mlog_replay_after) or starts a new snapshot;
 * ckpt_mlog_start() then opens the log for appends.
 * Every commit appends its record (ckpt_mlog_append) before the engine
 * applies it, while no other commit of the engine is applied, and takes it
 * back (ckpt_mlog_unappend) if the engine then fails to apply it.  A
 * snapshot is a switch to a new log file at the commit it is taken at
 * (ckpt_mlog_switch, while no commit is applied), then its records written
 * from the engine's state at that commit (ckpt_msnap_*), while commits go
 * on into the new log.
 *
 * Readers.  ckpt_mlog_restore() hands the newest intact snapshot and every
 * commit after it to a sink (`ckpt repair`); ckpt_mlog_verify() reads every
 * file a restore would use and reports the first damage (`ckpt fsck`).
 * They open the directory read-only and need no writer.
 *
 * Thread-safety: a writer may be used from any thread; append and unappend
 * must be serialized by the caller (the engine's commit exclusion), switch
 * must run under that same exclusion; sync, due and the snapshot calls may
 * run concurrently with appends.  One snapshot at a time (ckpt_msnap_begin
 * waits for one in progress).
 *
 * Errors: 0 or a negative errno; -EIO for damaged or foreign files, with a
 * message naming the file.  Readers report damage in their report rather
 * than failing, as long as something could be restored.
 */
#ifndef CKPT_MLOG_H
#define CKPT_MLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CKPT_MLOG_SNAP_MAGIC "CKPTMSNP" /* 8 bytes, no NUL on disk */
#define CKPT_MLOG_LOG_MAGIC "CKPTMLOG"
#define CKPT_MLOG_VERSION 1
#define CKPT_MLOG_HDR_SIZE 64
#define CKPT_MLOG_BLOCK_MAGIC "CKSB" /* snapshot block */
#define CKPT_MLOG_REC_MAGIC "CKLR"   /* log record */
#define CKPT_MLOG_BLOCK_HDR_SIZE 40
#define CKPT_MLOG_REC_HDR_SIZE 48
#define CKPT_MLOG_BLOCK_TARGET (1u << 20) /* a snapshot block's payload, about */
#define CKPT_MLOG_PAYLOAD_MAX (1u << 30)  /* sanity bound of one block or record */
/* A new snapshot is due once the logs since the newest one hold more than
 * this many bytes and more than twice the snapshot's size. */
#define CKPT_MLOG_SNAP_MIN_LOG (64ull << 20)

/* Operations in a log record's payload. */
#define CKPT_MLOG_OP_PUT 1
#define CKPT_MLOG_OP_DEL 2

typedef struct ckpt_mlog ckpt_mlog;
typedef struct ckpt_msnap ckpt_msnap;

/* Where a replay or a restore hands what it reads, in order: the records
 * of a snapshot (puts), then per logged commit its puts and deletes,
 * each group followed by mark() with its number and the engine's stamp it
 * was logged with (a snapshot's: its base, stamp 0).  Pointers are valid
 * during the call.  A callback's error stops the replay and is returned. */
struct ckpt_mlog_sink {
	int (*put)(void *ud, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl);
	int (*del)(void *ud, const uint8_t *k, size_t kl);
	int (*mark)(void *ud, uint64_t number, uint64_t stamp);
};

/* Append one operation to a commit's payload (buf, *len, *cap; realloc'd).
 * v is NULL for CKPT_MLOG_OP_DEL. */
int ckpt_mlog_op_add(uint8_t **buf, size_t *len, size_t *cap, uint8_t op, const void *k,
		     size_t kl, const void *v, size_t vl);

/* ---- writer ---- */

/* Open (creating it if missing) the log directory dir, list it, and read
 * the newest log to its last valid record.  err gets a message naming the
 * file and the reason. */
int ckpt_mlog_open(const char *dir, ckpt_mlog **ret, char *err, size_t errlen);
/* Sync and close.  Accepts NULL. */
void ckpt_mlog_close(ckpt_mlog *m);
const char *ckpt_mlog_dir(const ckpt_mlog *m);
/* The number of the last commit in the newest log, or of the newest
 * snapshot when that is newer; -ENOENT when the directory holds neither. */
int ckpt_mlog_last(ckpt_mlog *m, uint64_t *ret_last);
/* The highest commit number any file of the directory names (0: none). */
uint64_t ckpt_mlog_highest(ckpt_mlog *m);
/* Hand the logged commits numbered after `after`, up to ckpt_mlog_last, to
 * sink.  -ENOENT (nothing handed over) when the logs do not hold every one
 * of them.  Before ckpt_mlog_start only. */
int ckpt_mlog_replay_after(ckpt_mlog *m, uint64_t after, const struct ckpt_mlog_sink *sink,
			   void *ud);
/* Which of the logged commits numbered after `after` an engine whose stamp
 * is `stamp` holds last: the one logged with that stamp, or `after` itself
 * when the stamp is below that of the first commit after it (none of them
 * applied).  -ENOENT when no commit matches (the engine has writes the log
 * does not: it is ahead, or was written without the log).  Stamps grow
 * with every write of one engine, so between `after` (the mark the engine
 * itself records at open) and the log's end they name one commit at most.
 * Before ckpt_mlog_start only. */
int ckpt_mlog_locate(ckpt_mlog *m, uint64_t after, uint64_t stamp, uint64_t *ret_number);
/* Begin appending: commits after number base.  Continues the newest log
 * when it ends (valid) at base, cutting off bytes after its last valid
 * record; otherwise starts log-base (replacing one without records). */
int ckpt_mlog_start(ckpt_mlog *m, uint64_t base);
/* Append the commit of nops operations in ops[0..len) (ckpt_mlog_op_add)
 * as number *ret_number (the last one + 1), with the engine's stamp once
 * it is applied.  -errno (nothing appended) when it cannot be written; the
 * caller then fails the commit.  When the log is broken (below), appends
 * nothing and returns -ESTALE: the caller commits unlogged. */
int ckpt_mlog_append(ckpt_mlog *m, const uint8_t *ops, size_t len, uint32_t nops,
		     uint64_t stamp, uint64_t *ret_number);
/* Take the last append back (the engine did not apply it).  If the bytes
 * cannot be cut off, the log is broken: later appends are refused with
 * -ESTALE until the next snapshot starts a new log. */
void ckpt_mlog_unappend(ckpt_mlog *m);
bool ckpt_mlog_broken(ckpt_mlog *m);
/* The log no longer matches the engine (a commit's stamp was wrong):
 * broken as above. */
void ckpt_mlog_break(ckpt_mlog *m);
/* Make every append so far durable. */
int ckpt_mlog_sync(ckpt_mlog *m);
/* True when a new snapshot should be taken: none exists, the log is
 * broken, or the logs since the newest one have outgrown it. */
bool ckpt_mlog_due(ckpt_mlog *m);

/* ---- snapshots ---- */

/* Start a new log file after the last commit, while no commit is applied;
 * *ret_base is that commit's number, the base of the snapshot to write. */
int ckpt_mlog_switch(ckpt_mlog *m, uint64_t *ret_base);
/* Write snapshot base: begin, add every key and value of the engine at
 * that commit (any order the engine scans in), end.  end(w, true) makes it
 * durable under its final name and drops the files no restore needs any
 * more; end(w, false) (or any failure) discards it.  Waits for a snapshot
 * in progress. */
int ckpt_msnap_begin(ckpt_mlog *m, uint64_t base, ckpt_msnap **ret);
int ckpt_msnap_add(ckpt_msnap *w, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl);
int ckpt_msnap_end(ckpt_msnap *w, bool keep);

/* ---- readers ---- */

struct ckpt_mlog_report {
	bool found;          /* a snapshot was restored */
	uint64_t snap_base;  /* the snapshot restored */
	uint64_t last;       /* the last commit restored */
	uint64_t records;    /* snapshot records restored */
	uint64_t commits;    /* logged commits restored */
	unsigned snaps_damaged; /* newer snapshots passed over as damaged */
	bool complete;       /* every file used was read to its end, intact */
	char problem[512];   /* the first damage met: file, offset, reason */
};

/* Restore from dir: the newest snapshot that verifies whole (an older one
 * when it is damaged), then every logged commit after it, in order, until
 * the chain ends or a damaged record stops it.  0 with the report (found
 * false: no snapshot could be used, nothing handed over), or the sink's
 * error, -ENOENT (no directory), -ENOMEM. */
int ckpt_mlog_restore(const char *dir, const struct ckpt_mlog_sink *sink, void *ud,
		      struct ckpt_mlog_report *rep);
/* Read every file a restore would use and report (rep.complete false and
 * rep.problem when anything is damaged or missing). */
int ckpt_mlog_verify(const char *dir, struct ckpt_mlog_report *rep);

#endif
