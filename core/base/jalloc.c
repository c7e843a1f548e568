/* SPDX-License-Identifier: MIT */
#include "base/jalloc.h"

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#define TAG_ARENA UINT64_C(0x61726e6131636b70)  /* "ckp1arna" */
#define TAG_MALLOC UINT64_C(0x6d6c6f6331636b70) /* "ckp1colm" */
#define HDR 16u                                 /* keeps 16-byte alignment */
#define BLOCK CKPT_JSON_BLOCK

struct block {
	struct block *next;
	size_t used, size;
	_Alignas(16) unsigned char data[];
};

#define KEEP_BLOCKS CKPT_JSON_KEEP_BLOCKS

struct arena {
	unsigned depth;
	struct block *blocks; /* in use, newest first */
	struct block *spare;  /* retained, empty */
	unsigned nspare;
	bool at_exit;         /* exit_key set: arena_exit() frees the blocks */
};

static _Thread_local struct arena arena;

/* Its destructor frees a thread's blocks when the thread exits; set for a
 * thread once it makes its first block.  key_ok: created (by the
 * constructor, before main()); without it blocks outlive their thread. */
static pthread_key_t exit_key;
static bool key_ok;

static void free_blocks(struct block *b)
{
	while (b) {
		struct block *next = b->next;
		free(b);
		b = next;
	}
}

static void arena_exit(void *p)
{
	struct arena *a = p;

	free_blocks(a->blocks);
	free_blocks(a->spare);
	*a = (struct arena){ 0 };
}

static void *jmalloc(size_t n)
{
	unsigned char *p;
	size_t need;

	if (n > SIZE_MAX - HDR - 15)
		return NULL; /* the header and the rounding would wrap */
	need = (HDR + n + 15) & ~(size_t)15;

	if (arena.depth > 0) {
		struct block *b = arena.blocks;
		if (!b || b->size - b->used < need) {
			size_t size = need > BLOCK ? need : BLOCK;
			if (size == BLOCK && arena.spare) {
				b = arena.spare;
				arena.spare = b->next;
				arena.nspare--;
			} else {
				if (size > SIZE_MAX - sizeof(*b))
					return NULL;
				b = malloc(sizeof(*b) + size);
				if (!b)
					return NULL;
				b->size = size;
				if (!arena.at_exit && key_ok)
					arena.at_exit = pthread_setspecific(exit_key, &arena) == 0;
			}
			b->used = 0;
			b->next = arena.blocks;
			arena.blocks = b;
		}
		p = b->data + b->used;
		b->used += need;
		*(uint64_t *)p = TAG_ARENA;
		return p + HDR;
	}
	p = malloc(HDR + n);
	if (!p)
		return NULL;
	*(uint64_t *)p = TAG_MALLOC;
	return p + HDR;
}

static void jfree(void *ptr)
{
	unsigned char *p = ptr;

	if (!p)
		return;
	p -= HDR;
	if (*(uint64_t *)p == TAG_MALLOC)
		free(p);
	/* arena memory goes with its scope */
}

#ifndef CKPT_JALLOC_NO_INSTALL
__attribute__((constructor)) static void jalloc_install(void)
{
	key_ok = pthread_key_create(&exit_key, arena_exit) == 0;
	json_set_alloc_funcs(jmalloc, jfree);
}
#else
/* Not installed: the allocator functions stay, unused, so both builds compile one source. */
static void (*const jalloc_unused[])(void) __attribute__((unused)) = {
	(void (*)(void))arena_exit, (void (*)(void))jmalloc, (void (*)(void))jfree,
};
#endif

void ckpt_json_scope_begin(void)
{
	arena.depth++;
}

void ckpt_json_scope_end(void)
{
	if (arena.depth == 0 || --arena.depth > 0)
		return;
	while (arena.blocks) {
		struct block *b = arena.blocks;
		arena.blocks = b->next;
		if (b->size == BLOCK && arena.nspare < KEEP_BLOCKS) {
			b->next = arena.spare;
			arena.spare = b;
			arena.nspare++;
		} else {
			free(b);
		}
	}
}
