/* SPDX-License-Identifier: MIT */
#include "base/jalloc.h"

#include <jansson.h>
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

static _Thread_local struct {
	unsigned depth;
	struct block *blocks; /* in use, newest first */
	struct block *spare;  /* retained, empty */
	unsigned nspare;
} arena;

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

__attribute__((constructor)) static void jalloc_install(void)
{
	json_set_alloc_funcs(jmalloc, jfree);
}

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
