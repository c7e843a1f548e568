/* SPDX-License-Identifier: MIT */
/*
 * meta.h - the contract of the metadata subsystem (core/meta): everything a
 * store knows about its files except the bytes of their chunks.  Including
 * this header gives the whole public API.
 *
 * Modules, each with its own header:
 *   engine.h   the metadata engine: an ordered key-value store with
 *              transactions and conflict detection, drivers registered by
 *              name (rocksdb.c, the only code that calls RocksDB, first)
 *   records.h  keys and the byte layout of every record (docs/format.md
 *              section 5): pure codecs, no engine
 *   ns.h       the namespace: inodes, directory entries, symlinks and
 *              orphans, each operation one transaction; record reads and
 *              writes in transactions (ckpt_meta_*)
 *   commit.h   commits of file content: extent lists, inode size and times
 *              and chunk reference counts in one transaction
 *   mlog.h     the metadata log: snapshots of an engine's contents and a log
 *              of every commit after them, in the engine's own directory
 *              beside it, from which a damaged engine is rebuilt; driven by
 *              engine.c, read by the store's repair
 * The store (core/store) owns one engine, one namespace and the in-memory
 * state around them: the overlay of closed files not yet committed, the
 * pending table of chunks written but not yet indexed, and the chunk
 * backend they live in.
 *
 * Atomicity: every change of the metadata is one engine transaction that
 * reads what it decides on for update; a conflicting writer (another thread
 * or, on a shared engine, another daemon) makes it fail with -EAGAIN and it
 * is run again from the start (ckpt_txn_run).  In-process locks only keep a
 * process's own writers from conflicting needlessly.
 *
 * Ownership, thread-safety and errors: as each header states; in short,
 * objects are made by _new/_open and released by _free/_close (NULL-safe),
 * engines and namespaces may be used from any thread, a transaction or a
 * scan by one thread at a time, and every call returns 0 (or a count) or a
 * negative errno.
 */
#ifndef CKPT_META_H
#define CKPT_META_H

#include "meta/commit.h"
#include "meta/engine.h"
#include "meta/mlog.h"
#include "meta/ns.h"
#include "meta/records.h"

#endif
