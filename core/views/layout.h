/* SPDX-License-Identifier: MIT */
/*
 * layout.h - pure arithmetic of resharded views (tpT_ppP directories).
 *
 * A view directory "tpT_ppP" shows every checkpoint as if it had been saved
 * with T tensor-parallel and P pipeline-parallel ranks.  This module decides
 * which tensors a pipeline stage holds, which slice of a tensor a TP rank
 * holds (torch.chunk semantics), and how the bytes of a stored piece map onto
 * the bytes of a synthesized tensor.  No I/O, no JSON, no allocation.
 *
 * Coordinates: a box is a rectangle of a global tensor, given by an offset and
 * a shape per dimension (global coordinates).  A tensor's bytes are row-major
 * (C order) over its box, elem_bytes per element.  A box with ndim == 0 is a
 * scalar: one element.  A box with a 0 in its shape is empty.
 *
 * Thread-safety: every function is a pure function of its arguments (no
 * global state); any number of threads may call them concurrently.
 */
#ifndef CKPT_LAYOUT_H
#define CKPT_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CKPT_MAX_DIMS 16
#define CKPT_LAYOUT_MAX 4096 /* bound of T and P */
/* Buffer size that fits any layout name, NUL included ("tp4096_pp4096"). */
#define CKPT_LAYOUT_NAME_MAX 14

struct ckpt_layout {
	unsigned tp, pp;
};

/*
 * Parse a view directory name of exactly the form "tpT_ppP": lower-case
 * prefixes, T and P decimal without sign or leading zero, 1 <= T, P <=
 * CKPT_LAYOUT_MAX, nothing after P.  On success fills *ret and returns 0.
 * Returns -EINVAL for anything else (NULL arguments included; *ret is then
 * untouched), e.g. "tp0_pp1", "tp01_pp1", "tp2_pp2x", "TP2_pp2", "tp+2_pp2",
 * "tp4097_pp1".
 */
int ckpt_layout_parse(const char *name, struct ckpt_layout *ret);

/*
 * Inverse of ckpt_layout_parse: write "tpT_ppP" and a NUL into buf (len
 * bytes; CKPT_LAYOUT_NAME_MAX always suffices).  Returns the name's length
 * (without the NUL, > 0), -EINVAL when l is NULL or out of range or buf is
 * NULL, -ENAMETOOLONG when len is too small (buf then holds a truncated,
 * NUL-terminated string when len > 0).
 */
int ckpt_layout_name(const struct ckpt_layout *l, char *buf, size_t len);

/*
 * torch.chunk semantics along one dimension of size `size` cut in `parts`:
 * c = ceil(size / parts); part t covers [min(t*c, size), min((t+1)*c, size)),
 * which may be empty (e.g. size 5, parts 4: [0,2) [2,4) [4,5) [5,5)).
 * Exact for all inputs (no overflow).  parts == 0 is treated as 1; t >= parts
 * gives the empty range [size, size).  NULL ret_* pointers are skipped.
 */
void ckpt_tp_bounds(uint64_t size, unsigned parts, unsigned t, uint64_t *ret_begin,
		    uint64_t *ret_end);

/* Pipeline placement of a tensor (in-memory values; metadata spells them as a layer
 * number or "first", "last", "ends", "all"). */
#define CKPT_PP_LAYER 0 /* layer index in .layer */
#define CKPT_PP_FIRST 1
#define CKPT_PP_LAST 2
#define CKPT_PP_ENDS 3 /* first and last stage */
#define CKPT_PP_ALL 4

struct ckpt_pp {
	int kind;
	uint64_t layer;
};

/*
 * The stage of layer L out of N layers on P stages: the stage p with
 * floor(p*N/P) <= L < floor((p+1)*N/P) (stages are empty when N < P).
 * Rules beyond that: L >= N goes to the last stage P-1; N == 0 puts every
 * layer on stage 0; P == 0 returns 0.  Exact for all inputs, O(log P).
 */
unsigned ckpt_pp_stage_of_layer(uint64_t layer, uint64_t num_layers, unsigned P);

/*
 * Whether stage p (of P) holds a tensor placed by *pp: LAYER -> the stage of
 * pp->layer (ckpt_pp_stage_of_layer, same rules: layer >= num_layers -> last
 * stage, num_layers == 0 -> stage 0); FIRST -> 0; LAST -> P-1; ENDS -> 0 and
 * P-1; ALL -> every stage.  False when pp is NULL, kind is unknown, or
 * p >= P (so always false for P == 0).
 */
bool ckpt_pp_on_stage(const struct ckpt_pp *pp, uint64_t num_layers, unsigned P, unsigned p);

struct ckpt_box {
	unsigned ndim;
	uint64_t off[CKPT_MAX_DIMS];
	uint64_t shape[CKPT_MAX_DIMS];
};

struct ckpt_piece_geom {
	struct ckpt_box box; /* rectangle covered (for flat pieces: the flattened box) */
	bool flat;	     /* piece stores elements [flat_begin, flat_end) of box's row-major
			      * flattening */
	uint64_t flat_begin, flat_end;
};

/*
 * Number of elements of b: the product of its shape (1 for ndim == 0, 0 when
 * a dimension is 0 even if the others would overflow).  UINT64_MAX when the
 * product overflows, b is NULL or b->ndim > CKPT_MAX_DIMS.
 */
uint64_t ckpt_box_elems(const struct ckpt_box *b);

/*
 * Intersection of a and b.  Returns true and fills *ret (when ret is not
 * NULL; ret may alias a or b) when it is not empty; false when it is empty,
 * when a or b is NULL, ndims differ, ndim > CKPT_MAX_DIMS, or some
 * off + shape overflows (*ret is then untouched).  Two scalars (ndim 0)
 * intersect in a scalar.
 */
bool ckpt_box_intersect(const struct ckpt_box *a, const struct ckpt_box *b, struct ckpt_box *ret);

/*
 * Enumerate the byte runs that copy the part of `piece` lying inside `target`
 * into a buffer laid out row-major over `target`.  cb(ud, dst_off, src_off,
 * len): dst_off = byte offset in the target's row-major bytes, src_off = byte
 * offset in the piece's stored bytes (row-major over piece->box, or for flat
 * pieces (element index in box - flat_begin) * elem_bytes), len > 0 in bytes.
 * Runs come in strictly increasing dst_off order, do not overlap, and are
 * merged maximally: two consecutive runs are never contiguous in both dst and
 * src.  Work is proportional to ndim * (number of runs) + ndim^2: elements of
 * the piece outside the target or outside the flat range are skipped without
 * being visited.  No allocation; the recursion depth is bounded by ndim.
 *
 * Returns 0 after the last run (also when there are none), the first non-zero
 * value returned by cb (enumeration stops there), or before any cb call:
 *   -EINVAL    NULL target/piece/cb, elem_bytes == 0, ndim > CKPT_MAX_DIMS,
 *              target and piece ndims differ, flat_begin > flat_end or
 *              flat_end > elements of piece->box;
 *   -EOVERFLOW some off + shape overflows, the element count of a box, the
 *              target's byte size or the piece's stored byte size does not
 *              fit in uint64.
 */
typedef int (*ckpt_run_cb)(void *ud, uint64_t dst_off, uint64_t src_off, uint64_t len);
int ckpt_box_runs(const struct ckpt_box *target, const struct ckpt_piece_geom *piece,
		  unsigned elem_bytes, ckpt_run_cb cb, void *ud);

#endif
