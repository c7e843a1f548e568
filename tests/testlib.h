/* SPDX-License-Identifier: MIT */
/*
 * testlib.h - the set-up code the Check suites share: temporary
 * directories, stores and indexes opened for a test, files written into a
 * store through the real write path, deterministic pseudo-random data.
 *
 * Contract: these are test helpers, not production code.  Every helper
 * that can fail asserts (ck_assert) with a message naming what failed, so a
 * test that calls one fails at the helper's call, in the forked child, and
 * never gets a half-made object back.  Buffers returned are malloc'd; the
 * caller frees them.  Not thread-safe: call from the test's own thread.
 *
 * Directory pattern of the suites that need a disk: tl_tcase_dirs() gives a
 * test case an unchecked fixture (run in the parent process around the
 * case) that owns a base directory /tmp/<prefix>XXXXXX and removes it
 * afterwards, because a failed test exits its forked child before the
 * checked teardown runs; each test makes its own directory inside it with
 * tl_test_dir() from its checked setup and removes it with tl_dir_remove()
 * from its teardown.
 */
#ifndef CKPT_TESTLIB_H
#define CKPT_TESTLIB_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "meta/engine.h"
#include "store/file.h"
#include "store/store.h"

/* Run suite s with Check's normal output: main()'s exit status. */
int tl_run(Suite *s);

/* ---- directories ------------------------------------------------------- */

/* mkdtemp() of "<parent>/<prefix>XXXXXX" into buf. */
void tl_dir_make(char *buf, size_t len, const char *parent, const char *prefix);

/* Remove dir and everything below it, then clear the name.  NULL-safe;
 * an empty name is a no-op. */
void tl_dir_remove(char *dir);

/* Give tc the base-directory fixture described above; prefix names the
 * suite ("check_store-").  Every test case of a process shares one base
 * directory slot: cases run one after the other. */
void tl_tcase_dirs(TCase *tc, const char *prefix);

/* A fresh directory for one test inside the current base directory. */
void tl_test_dir(char *buf, size_t len);

/* ---- stores and indexes ------------------------------------------------- */

/* ckpt_store_open(path, o): the store, or a failed assertion quoting the
 * error message. */
ckpt_store *tl_store_open(const char *path, const struct ckpt_store_opts *o);

/* A read-write store at path with default options, created if missing. */
ckpt_store *tl_store_create(const char *path);

/* ckpt_engine_open(name, dir, create=true, read_only=false, default
 * cache); name NULL: the default engine. */
ckpt_engine *tl_engine_open(const char *name, const char *dir);

/* Write one record in its own transaction. */
void tl_engine_put(ckpt_engine *e, const void *key, size_t klen, const void *val, size_t vlen);

/* The store's metadata engine, to read and damage records below the
 * store's API: a test-only accessor (core/store/loadctx.c), deliberately
 * not declared in store.h. */
ckpt_engine *ckpt_store_engine(ckpt_store *s);

/* ckpt_store_mknode() in parent: returns the new inode number. */
uint64_t tl_mknode(ckpt_store *s, uint64_t parent, const char *name, uint32_t mode);

/* Write buf[0..len) as file dir/name (created, or truncated if it exists)
 * through a writer of pool, commit (not durable) and flush it to the index.
 * Written in two pieces, the second of 13 bytes, so that writes of odd
 * sizes are exercised.  Returns the inode number. */
uint64_t tl_write_file(ckpt_store *s, ckpt_pool *pool, uint64_t dir, const char *name,
		       const uint8_t *buf, size_t len);

/* The whole committed content of ino (malloc'd; its size in *ret_len). */
uint8_t *tl_read_file(ckpt_store *s, uint64_t ino, size_t *ret_len);

/* Flush the overlay to the index, then the store's statistics. */
struct ckpt_store_stats tl_flushed_stats(ckpt_store *s);

/* ---- pseudo-random data ------------------------------------------------- */

/* Next output of splitmix64 over *state (the state advances). */
uint64_t tl_splitmix64(uint64_t *state);

/* Fill p[0..n) with xorshift bytes determined by seed: equal seeds give
 * equal bytes, different seeds different ones; incompressible. */
void tl_fill_random(uint8_t *p, size_t n, uint64_t seed);

/* malloc'd buffer of n (at least 1) bytes filled by tl_fill_random(). */
uint8_t *tl_random_buf(size_t n, uint64_t seed);

/* A digest whose bytes derive from k: distinct for distinct k, never all
 * zero. */
ckpt_digest tl_digest(uint32_t k);

#endif
