/* SPDX-License-Identifier: MIT */
/*
 * shardmeta.h - ckptfs sharding metadata carried by safetensors shard files,
 * and name-based defaults for tensor-parallel dims and pipeline stages.
 *
 * Format v1: __metadata__["ckptfs"] is a string holding a JSON object:
 *
 *   {"version": 1,                  required integer; > 1: not reshardable
 *    "group": "model",              optional; names the view files
 *    "num_layers": 32,              optional non-negative integer
 *    "tensors": {                   optional object
 *      "<name>": {                  must name a tensor of the same file
 *        "global_shape": [..],      default: the stored shape
 *        "offsets": [..],           default: zeros
 *        "box_shape": [..],         only with flat_range; default global_shape
 *        "flat_range": [a, b],      optional
 *        "tp_dim": 0,               -1 (replicated) .. ndim-1; default unset
 *        "pp": 17 | "first" | "last" | "ends" | "all"   default unset
 *      }}}
 *
 * Without flat_range the stored tensor is the rectangle of the global tensor
 * at "offsets" with the stored tensor's shape.  With flat_range the stored
 * tensor is 1-D of length b - a and holds elements [a, b) of the row-major
 * flattening of the box (offsets, box_shape).  A tensor without an entry is
 * the whole tensor.  Unknown keys are ignored at every level; duplicate keys
 * are rejected.
 *
 * Validation (all -EINVAL, with a one-line reason naming the tensor and the
 * field): version is a positive integer; group is a non-empty string of at
 * most CKPT_SHARDMETA_GROUP_MAX bytes without '/' and not starting with '.';
 * num_layers is a non-negative integer; every entry is an object naming a
 * tensor of the header; global_shape/offsets/box_shape are arrays of
 * non-negative integers with global ndim <= CKPT_MAX_DIMS, offsets and
 * box_shape of the global ndim; without flat_range the stored ndim equals the
 * global ndim and box_shape is absent; with flat_range the stored tensor is
 * 1-D of length b - a and a <= b <= elements(box); the box lies inside
 * global_shape (overflow-checked); elements(global_shape) * bits(dtype) fits
 * in 64 bits; tp_dim is an integer in [-1, ndim); pp is a non-negative
 * integer (< num_layers when num_layers is given) or one of the four strings.
 *
 * Thread-safety: no global mutable state.  A parsed ckpt_shardmeta and a
 * ckpt_tp_rules are immutable after construction; any number of threads may
 * call the accessors on one object concurrently (regexec() is thread-safe).
 */
#ifndef CKPT_SHARDMETA_H
#define CKPT_SHARDMETA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "views/layout.h"
#include "views/safetensors.h"

/* __metadata__ key holding the JSON object. */
#define CKPT_SHARDMETA_KEY "ckptfs"
/* Format version written by ckpt_shardmeta_serialize(); parse accepts only it. */
#define CKPT_SHARDMETA_VERSION 1
/* Default group name and the longest accepted group name (bytes). */
#define CKPT_SHARDMETA_GROUP_DEFAULT "model"
#define CKPT_SHARDMETA_GROUP_MAX 200

#define CKPT_TP_DIM_UNSET (-2)	/* no tp_dim given: resolved later by the view builder */

struct ckpt_tensor_meta {
	/*
	 * Box in global coordinates (+ flat range).  box.ndim == ndim; entries
	 * past ndim are 0.  Not flat: box.shape is the stored shape and
	 * flat_begin == flat_end == 0.  Flat: the stored tensor is 1-D of
	 * length flat_end - flat_begin.
	 */
	struct ckpt_piece_geom geom;
	unsigned ndim;				/* of the global tensor */
	uint64_t global_shape[CKPT_MAX_DIMS];	/* entries past ndim are 0 */
	int tp_dim;		/* -1, 0..ndim-1, or CKPT_TP_DIM_UNSET */
	bool has_pp;		/* explicit pp, else false and pp zeroed */
	struct ckpt_pp pp;
};

typedef struct ckpt_shardmeta ckpt_shardmeta; /* opaque */

/*
 * Parse and validate the "ckptfs" metadata of header h.  An absent key gives
 * the defaults: group "model", no num_layers, every tensor whole.  h is not
 * retained (the result stays valid after ckpt_st_header_free(h)).
 * On success returns 0, *ret is a new object (free with
 * ckpt_shardmeta_free()) and err (if non-NULL and errlen > 0) is "".
 * Errors (*ret = NULL, err gets a one-line reason, truncated to errlen):
 *   -EINVAL           NULL h or ret; the value is not valid JSON or not an
 *                     object; any rule of the format above broken;
 *   -EPROTONOSUPPORT  version > 1: the file is not reshardable by this build;
 *   -ENOMEM           allocation failure.
 * Cost: O(S + E log E) for an S-byte value with E tensor entries.
 */
int ckpt_shardmeta_parse(const ckpt_st_header *h, ckpt_shardmeta **ret, char *err,
			 size_t errlen);

/* Free m and everything it owns.  Accepts NULL. */
void ckpt_shardmeta_free(ckpt_shardmeta *m);

/* The group name ("model" by default), owned by m; NULL if m is NULL. */
const char *ckpt_shardmeta_group(const ckpt_shardmeta *m);

/* Sets *ret (if non-NULL) and returns true when num_layers was given; false
 * when absent or m is NULL. */
bool ckpt_shardmeta_num_layers(const ckpt_shardmeta *m, uint64_t *ret);

/*
 * Geometry/placement of stored tensor t of the header m was parsed from
 * (looked up by name, O(log E)).  A tensor without an entry is whole: box at
 * zeros with the stored shape, global_shape = stored shape, tp_dim
 * CKPT_TP_DIM_UNSET, has_pp false.  Returns 0 and fills *ret, or -EINVAL for
 * NULL arguments, a whole tensor with more than CKPT_MAX_DIMS dims, or a t
 * whose shape does not match its entry (t is from another header).
 */
int ckpt_shardmeta_tensor(const ckpt_shardmeta *m, const struct ckpt_st_tensor *t,
			  struct ckpt_tensor_meta *ret);

/*
 * Whether m is a geometry that ckpt_shardmeta_parse() can give stored tensor
 * t (its dtype and shape) in a file whose num_layers is nl when has_nl: every
 * rule of the format above holds (box inside global_shape, flat range within
 * the box and the stored length, sizes that fit, tp_dim and pp in range,
 * numbers a JSON integer holds) and entries past m->ndim are 0.  For the
 * decoder of a persisted parse (views/parsrec.c), which must not take a
 * damaged record for a parse.  Returns 0 or -EINVAL (also for NULL).
 * Thread-safe.
 */
int ckpt_shardmeta_check(const struct ckpt_st_tensor *t, const struct ckpt_tensor_meta *m,
			 bool has_nl, uint64_t nl);
/* 0 when group is a valid group name (the rule above), else -EINVAL. */
int ckpt_shardmeta_check_group(const char *group);

/*
 * Serialize metadata for a synthesized view file: on success returns 0 and
 * *ret_json is a malloc'd (free()) NUL-terminated compact JSON object, the
 * *value* of the "ckptfs" key, describing the n pieces of v in the order
 * given.  group NULL means "model".  Every entry writes global_shape and
 * offsets, flat pieces also box_shape and flat_range; tp_dim and pp only when
 * set.  The result parses with ckpt_shardmeta_parse() back to the same
 * ckpt_tensor_meta values provided the header holds each named tensor with
 * the stored shape the meta implies (box.shape, or [flat_end - flat_begin])
 * and elements(global_shape) * bits(dtype) fits in 64 bits.  Inputs are not
 * retained.
 * Errors (*ret_json = NULL):
 *   -EINVAL     NULL ret_json, v NULL with n > 0, a NULL name or meta, a name
 *               that is not valid UTF-8, duplicate names, an invalid group, or
 *               a meta that breaks the format rules (ndim > CKPT_MAX_DIMS,
 *               box.ndim != ndim, box outside global_shape, bad flat range,
 *               tp_dim out of range, unknown pp kind, pp layer >= num_layers);
 *   -EOVERFLOW  a number > INT64_MAX (not representable in the JSON);
 *   -ENOMEM     allocation failure.
 * Thread-safe (no shared state).
 */
struct ckpt_shardmeta_out {
	const char *name;
	const struct ckpt_tensor_meta *meta;
};
int ckpt_shardmeta_serialize(const char *group, bool has_num_layers, uint64_t num_layers,
			     const struct ckpt_shardmeta_out *v, size_t n, char **ret_json);
/*
 * The same, with entry i given by get(ud, i, &name, tmp): it returns the
 * entry's metadata (tmp, room for one, may be used for it) and sets the
 * name; get is called once per entry, in order.  The metadata it returns
 * need only live until the next call, the name until this function
 * returns.  Saves the caller an array of metadata when it computes them
 * (the header of a view file of many tensors).
 */
typedef const struct ckpt_tensor_meta *(*ckpt_shardmeta_get_fn)(void *ud, size_t i,
								 const char **ret_name,
								 struct ckpt_tensor_meta *tmp);
int ckpt_shardmeta_serialize_cb(const char *group, bool has_num_layers, uint64_t num_layers,
				size_t n, ckpt_shardmeta_get_fn get, void *ud, char **ret_json);

/* ---- name-based defaults ------------------------------------------------ */

typedef struct ckpt_tp_rules ckpt_tp_rules; /* opaque */

/*
 * Tensor-parallel dim rules.  Built-ins (Llama/Mistral/Qwen-style names):
 * names containing q_proj, k_proj, v_proj, gate_proj, up_proj, embed_tokens
 * or lm_head -> 0; else names containing o_proj.weight or down_proj.weight
 * -> 1; everything else -> -1.
 * path (may be NULL: built-ins only) names a rules file (mount option
 * -o tp_rules=FILE).  Each line is "REGEX DIM": DIM is the last
 * whitespace-separated token, an integer >= -1; REGEX is the rest of the line
 * with surrounding whitespace removed (it may contain spaces), a POSIX
 * extended regex matched anywhere in the name.  Lines whose first
 * non-whitespace character is '#' and blank lines are ignored.  File rules
 * are tried first, in file order, then the built-ins.
 * On success returns 0 and *ret (free with ckpt_tp_rules_free()); err (if
 * non-NULL and errlen > 0) is "".  Errors (*ret = NULL, err gets a one-line
 * reason naming the file and, for content errors, the 1-based line):
 *   -EINVAL  NULL ret; a line without both REGEX and DIM; a bad DIM; a regex
 *            that does not compile; a NUL byte in a line;
 *   -errno   the file cannot be opened or read (e.g. -ENOENT);
 *   -ENOMEM  allocation failure.
 */
int ckpt_tp_rules_new(const char *path, ckpt_tp_rules **ret, char *err, size_t errlen);

/* Free r.  Accepts NULL. */
void ckpt_tp_rules_free(ckpt_tp_rules *r);

/*
 * TP dim for a tensor named name with ndim dims: the dim of the first rule
 * that matches, or -1 if none matches or the matched dim is >= ndim.  r NULL
 * means built-ins only; name NULL gives -1.  Thread-safe.
 */
int ckpt_tp_rules_dim(const ckpt_tp_rules *r, const char *name, unsigned ndim);

/*
 * Pipeline stage from the name: {CKPT_PP_LAYER, N} when ckpt_layer_from_name()
 * finds N; else CKPT_PP_FIRST for names containing embed, wte, wpe or
 * tok_embeddings; else CKPT_PP_LAST (also for a NULL name).  ret NULL: no-op.
 */
void ckpt_pp_from_name(const char *name, struct ckpt_pp *ret);

/*
 * Layer index from the first name segment "layers.N.", "h.N.", "blocks.N."
 * or "layer.N." (a segment starts at the beginning of the name or after a
 * '.'; N is one or more decimal digits, at most 2^63 - 1 (what the "pp" of
 * a view file can hold), followed by '.').
 * Returns true and sets *ret_layer (if non-NULL) when found; false otherwise
 * or for a NULL name.
 */
bool ckpt_layer_from_name(const char *name, uint64_t *ret_layer);

#endif
