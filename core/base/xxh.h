/* SPDX-License-Identifier: MIT */
/*
 * xxh.h - xxHash for core/: the library's run-time dispatched XXH3 entry
 * points (SSE2, AVX2 or AVX512, whichever the CPU has) where configure found
 * them, the plain ones otherwise.  Both give the same values, so on-disk
 * digests and checksums do not depend on the machine.
 */
#ifndef CKPT_XXH_H
#define CKPT_XXH_H

#include <xxhash.h>
#ifdef CKPT_XXH_DISPATCH
#include <xxh_x86dispatch.h>
#endif

#endif
