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
 */
#ifndef CKPT_JALLOC_H
#define CKPT_JALLOC_H

void ckpt_json_scope_begin(void);
void ckpt_json_scope_end(void);

#endif
