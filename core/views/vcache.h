/* SPDX-License-Identifier: MIT */
/*
 * vcache.h - the process-wide caches of the view code (internal to
 * core/views): small lists of reference-counted entries (parsed sources,
 * view models), newest first.
 *
 * Ownership: a cache holds one reference on each of its `keep` newest
 * entries ("kept"), fewer when their sizes (`bytes`) pass the cache's byte
 * budget (the newest entry is kept whatever its size); every user holds its
 * own.  An entry is destroyed, by the
 * cache's destroy callback and outside its lock, when its last reference
 * goes; an entry that was never inserted (refs 1) can be released the same
 * way.  Entries are embedded: a struct vcache_node inside the cached struct,
 * recovered with vcache_entry().
 *
 * Thread-safety: every call takes the cache's mutex; entries themselves are
 * immutable once inserted.  Errors: none (only vcache_sweep allocates).
 */
#ifndef CKPT_VCACHE_H
#define CKPT_VCACHE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "store/store.h"

struct vcache_node {
	ckpt_store *s;     /* the store the entry was parsed from */
	int refs;          /* protected by the cache's lock */
	size_t bytes;      /* memory the entry holds (an estimate), set before
			    * insert, then immutable */
	bool kept;         /* the cache holds one of the refs */
	struct vcache_node *next;
};

struct vcache {
	pthread_mutex_t lock;
	struct vcache_node *head; /* newest first; under lock */
	size_t keep;
	void (*destroy)(struct vcache_node *n);
	/* 0: no byte budget; else the kept entries' bytes stay within it.  Under
	 * lock (vcache_set_budget). */
	size_t max_bytes;
};

/* Static initializer of a cache that keeps its `keep` newest entries, and
 * those within max_bytes. */
#define VCACHE_INIT(keep, destroy, max_bytes) \
	{ PTHREAD_MUTEX_INITIALIZER, NULL, (keep), (destroy), (max_bytes) }

#define vcache_entry(ptr, type) ((type *)(void *)((char *)(ptr) - offsetof(type, node)))

/* Insert n (of store s, n->bytes set) holding two references, the
 * caller's and the cache's; the cache then lets go of the entries past its
 * `keep` newest and of the oldest ones past its byte budget. */
void vcache_insert(struct vcache *c, struct vcache_node *n, ckpt_store *s);
/* The newest entry match() accepts, with a reference taken, or NULL. */
struct vcache_node *vcache_find(struct vcache *c,
				bool (*match)(const struct vcache_node *n, const void *key),
				const void *key);
/* Drop one reference (NULL is a no-op). */
void vcache_unref(struct vcache *c, struct vcache_node *n);
/* Drop the cache's holds on every entry of store s (users' references stay
 * valid). */
void vcache_forget_store(struct vcache *c, ckpt_store *s);
/* Drop the cache's holds on the kept entries that dead() says can never be
 * found again (their file or directory is gone or changed), so that they do
 * not wait to be the oldest.  dead() is called without the cache's lock, on
 * a reference of the sweep's own, and may read the store.  Best effort:
 * without memory for its list the sweep does nothing. */
void vcache_sweep(struct vcache *c, bool (*dead)(const struct vcache_node *n));
/* How many entries are alive: kept by the cache or in use. */
size_t vcache_count(struct vcache *c);
/* The bytes of the entries the cache keeps. */
size_t vcache_kept_bytes(struct vcache *c);
/* Set the byte budget (0: none); kept entries past it are let go of now. */
void vcache_set_budget(struct vcache *c, size_t max_bytes);

#endif
