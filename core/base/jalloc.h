/* SPDX-License-Identifier: MIT */
/*
 * jalloc.h - scoped arena allocation for jansson.
 *
 * Parsing a safetensors header of 20,000 tensors makes jansson allocate
 * and free ~200,000 small objects; in the daemon most of that time went to
 * glibc's malloc/free (malloc_consolidate).  Between ckpt_json_scope_begin()
 * and ckpt_json_scope_end() on a thread, jansson allocates from a per-thread
 * bump arena whose frees are no-ops; the arena is released at the end of the
 * outermost scope.  Outside a scope jansson uses malloc as usual.
 *
 * Contract: jansson values created inside a scope must not be used after
 * it ends.  The allocator is installed (json_set_alloc_funcs) before main()
 * runs, so every jansson allocation of the process carries the small header
 * that tells the two kinds apart.  Thread-safe (the arena is per thread).
 *
 * Built with CKPT_JALLOC_NO_INSTALL (the copy inside libckptfs, a library
 * loaded into other programs' processes, which may use jansson themselves
 * with their own allocations), nothing is installed: jansson keeps its
 * allocator and the scopes have no effect.
 */
#ifndef CKPT_JALLOC_H
#define CKPT_JALLOC_H

/* The arena grows by blocks of CKPT_JSON_BLOCK bytes (an allocation larger
 * than that gets a block of its own).  At the end of the outermost scope up
 * to CKPT_JSON_KEEP_BLOCKS whole blocks stay with the thread for its next
 * scope (no page faults on reuse); the others are freed.  A thread's blocks
 * are freed when it exits (inside a scope too).  A size that cannot be
 * allocated, with its header, gets NULL. */
#define CKPT_JSON_BLOCK (1u << 20)
#define CKPT_JSON_KEEP_BLOCKS 8

void ckpt_json_scope_begin(void);
void ckpt_json_scope_end(void);

#endif
