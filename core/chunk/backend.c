/* SPDX-License-Identifier: MIT */
/*
 * backend.c - the registry of chunk backends (backend.h).
 */
#include "chunk/backend.h"

#include <string.h>

const struct ckpt_chunk_backend_ops *const ckpt_chunk_backends[] = {
	&ckpt_pack_backend_ops,
	NULL,
};

const struct ckpt_chunk_backend_ops *ckpt_chunk_backend_find(const char *name)
{
	if (!name)
		return ckpt_chunk_backends[0];
	for (size_t i = 0; ckpt_chunk_backends[i]; i++)
		if (strcmp(ckpt_chunk_backends[i]->name, name) == 0)
			return ckpt_chunk_backends[i];
	return NULL;
}

bool ckpt_chunk_loc_same(const struct ckpt_chunk_loc *a, const struct ckpt_chunk_loc *b)
{
	return memcmp(a->where, b->where, CKPT_CHUNK_WHERE_LEN) == 0;
}
