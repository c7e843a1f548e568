/* SPDX-License-Identifier: MIT */
/*
 * chunk.h - the contract of the chunk subsystem (core/chunk): how bytes
 * become chunks, how chunks are compressed and cached, and where their
 * stored bytes live.  Including this header gives the whole public API.
 * (The read-ahead workers load chunks through the store and are the
 * store's: store/readahead.h.)
 *
 * Modules, each with its own header:
 *   chunker.h    FastCDC cut points (pure functions; the boundaries are
 *                part of the on-disk compatibility contract)
 *   compress.h   per-chunk zstd with byte planes; codec ids are on-disk
 *                values
 *   cache.h      the LRU cache of decompressed, verified chunks, with
 *                single-flight loading and a separate budget for
 *                sequential readers' entries
 *   loadctx.h    the pool of read contexts (record buffer, decompressor)
 *                that one chunk load borrows
 *   backend.h    the chunk backend ops table: put, sync, get, span reads,
 *                units, seal, reclaim, scan; locations are opaque blobs;
 *                backends registered by name
 *   pack.h, pack_backend.h
 *                the first backend, "pack": append-only pack files and
 *                their set, AIO span reads (pack_span.c); only these files
 *                know what a location means
 * The store (core/store) decides what a chunk is (digest, codec,
 * reference count, which location its metadata names); this subsystem
 * never reads or writes metadata.
 *
 * Ownership: objects come from _new/_open and go with _free (NULL-safe);
 * buffers passed in belong to the caller; a pinned cache entry's bytes
 * stay valid until it is released.  Locations are plain values.
 *
 * Thread-safety: chunker and compress calls share no state (a compressor
 * or decompressor object is used by one thread at a time); the cache, the
 * read-ahead workers, the read-context pool and every backend op may be
 * called from any thread, except where a header names a per-thread object
 * (a backend's span batch, a borrowed read context).
 *
 * Errors: 0 (or a count) or a negative errno.  Damaged or missing stored
 * data is -EIO, never wrong bytes: records carry a checksum, zstd frames a
 * content checksum, and every decoded chunk is checked against its keyed
 * digest by the store before anyone sees it.  Nothing here aborts on bad
 * input.
 */
#ifndef CKPT_CHUNK_H
#define CKPT_CHUNK_H

#include "chunk/backend.h"
#include "chunk/cache.h"
#include "chunk/chunker.h"
#include "chunk/compress.h"
#include "chunk/loadctx.h"

#endif
