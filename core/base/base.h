/* SPDX-License-Identifier: MIT */
/*
 * base.h - the contract of the base helpers (core/base), which every other
 * subsystem uses and which use nothing of theirs.  Including this header
 * gives the whole API.
 *
 * Modules, each with its own header:
 *   util.h    little-endian (on-disk) and big-endian (sortable key)
 *             integers, logging, clocks, one-line error messages
 *             (ckpt_errf), full preads/pwrites, worker threads, memory
 *             mappings in huge pages
 *   hash.h    chunk identity: the table of hash algorithms (a store records
 *             the id of its own) and keyed XXH3-128 digests; XXH3-64
 *             checksums of stored bytes
 *   metrics.h the process's counters and histograms, collectors, and their
 *             rendering in the Prometheus text format
 *   jalloc.h  scoped arena allocation for jansson's objects (safetensors
 *             headers), per thread
 *   progress.h  the progress callback of long operations (fsck, gc,
 *             verify): core reports, its caller draws
 *
 * Ownership: objects come from _new and go with _free (NULL-safe);
 * everything else works on memory the caller owns.
 *
 * Thread-safety: every call may be made from any thread; a hasher may be
 * shared, an arena scope belongs to the thread that opened it.
 *
 * Errors: 0 (or a count) or a negative errno; nothing here calls abort()
 * or exit().  Values written to disk never depend on the host's byte
 * order.
 */
#ifndef CKPT_BASE_H
#define CKPT_BASE_H

#include "base/hash.h"
#include "base/jalloc.h"
#include "base/metrics.h"
#include "base/progress.h"
#include "base/util.h"

#endif
