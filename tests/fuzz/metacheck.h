/* SPDX-License-Identifier: MIT */
/*
 * metacheck.h - the harnesses' own statement of the rules of a tensor's
 * sharding metadata (docs/views.md section 3, views/shardmeta.h), written
 * apart from the code under test: fuzz_shardmeta.c holds what
 * ckpt_shardmeta_parse() accepts to them, fuzz_records.c what a 'P' record
 * decodes to.
 */
#ifndef CKPT_FUZZ_METACHECK_H
#define CKPT_FUZZ_METACHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "views/safetensors.h"
#include "views/shardmeta.h"

/* Product of n dims (0 when one is 0, even if the others overflow); false on
 * overflow. */
static inline bool fuzz_elems(const uint64_t *dims, unsigned n, uint64_t *ret)
{
	*ret = 1;
	for (unsigned d = 0; d < n; d++)
		if (dims[d] == 0) {
			*ret = 0;
			return true;
		}
	for (unsigned d = 0; d < n; d++)
		if (__builtin_mul_overflow(*ret, dims[d], ret))
			return false;
	return true;
}

/*
 * What is wrong with the geometry tm of stored tensor t (dtype, shape) in a
 * file whose num_layers is nl when has_nl, or NULL: tm must be what a valid
 * "ckptfs" entry (or its absence) of that tensor describes.
 */
static inline const char *fuzz_meta_problem(const struct ckpt_st_tensor *t,
					    const struct ckpt_tensor_meta *tm, bool has_nl,
					    uint64_t nl)
{
	const struct ckpt_piece_geom *g = &tm->geom;
	uint64_t elems, belems, bits;

	if (tm->ndim > CKPT_MAX_DIMS || g->box.ndim != tm->ndim)
		return "ndim";
	for (unsigned d = 0; d < CKPT_MAX_DIMS; d++) {
		uint64_t end;

		if (d >= tm->ndim) {
			if (tm->global_shape[d] || g->box.off[d] || g->box.shape[d])
				return "a dim past ndim is not zero";
			continue;
		}
		if (__builtin_add_overflow(g->box.off[d], g->box.shape[d], &end) ||
		    end > tm->global_shape[d])
			return "box outside global_shape";
		if (tm->global_shape[d] > INT64_MAX)
			return "a global_shape past 2^63 - 1 (not a JSON integer)";
	}
	if (!fuzz_elems(tm->global_shape, tm->ndim, &elems) ||
	    __builtin_mul_overflow(elems, (uint64_t)ckpt_dtype_bits(t->dtype), &bits))
		return "global size in bits overflows";
	fuzz_elems(g->box.shape, tm->ndim, &belems); /* inside global: no overflow */
	if (g->flat) {
		if (t->ndim != 1 || g->flat_begin > g->flat_end || g->flat_end > belems ||
		    t->shape[0] != g->flat_end - g->flat_begin)
			return "flat range";
	} else {
		if (t->ndim != tm->ndim || g->flat_begin || g->flat_end)
			return "stored ndim is not the global ndim";
		for (unsigned d = 0; d < t->ndim; d++)
			if (g->box.shape[d] != t->shape[d])
				return "box shape is not the stored shape";
	}
	if (tm->tp_dim != CKPT_TP_DIM_UNSET && (tm->tp_dim < -1 || tm->tp_dim >= (int)tm->ndim))
		return "tp_dim";
	if (tm->has_pp) {
		if (tm->pp.kind < CKPT_PP_LAYER || tm->pp.kind > CKPT_PP_ALL)
			return "pp kind";
		if (tm->pp.kind == CKPT_PP_LAYER && (tm->pp.layer > INT64_MAX ||
						     (has_nl && tm->pp.layer >= nl)))
			return "pp layer past num_layers";
	}
	return NULL;
}

#endif
