/* SPDX-License-Identifier: MIT */
/*
 * parsrec.h - the persisted parse of a view source ('P' records of the
 * index, docs/format.md section 5.8), internal to core/views.
 *
 * A record holds what a view needs of a parsed safetensors source (its
 * tensor table and ckptfs metadata) so that the first view after a mount
 * does not parse JSON again.  It stays valid while the chunks holding the
 * file's header are the same: it carries the fingerprint of those extents.
 * The codec is pure (no I/O); source.c reads and writes the records through
 * ckpt_store_parsed_get/put.  Thread-safety: no shared state.
 */
#ifndef CKPT_PARSREC_H
#define CKPT_PARSREC_H

#include "views/view_int.h"

/* 1: fixed-width fields, names whole; 2: no flags (byte 3 zero) */
#define CKPT_PARSREC_VERSION 3
/* Byte 3 of a record: flags. */
#define CKPT_PARSREC_F_DESCRIBED 0x01 /* __metadata__ has a "ckptfs" key */

/* Fingerprint of the extents of l that hold bytes [0, data_start), or 0
 * when out of memory (which matches no record). */
uint64_t vw_parsrec_fingerprint(const struct ckpt_extent_list *l, uint64_t data_start);

/* The record of d's parse (source, described, has_nl, nl, data_start, group and its
 * ntensors tensors and metas), for a file whose extents are ext.  *ret is
 * malloc'd.  Errors: -ENOMEM. */
int vw_parsrec_encode(const struct srcdata *d, const struct ckpt_extent_list *ext,
		      uint8_t **ret, size_t *ret_len);

/* Decode record rec of a file whose extents are ext into d: source,
 * described, has_nl, nl, data_start, group, tensors, metas, ntensors and
 * blob (which holds the names and dims); d's other fields are untouched.
 * Errors:
 * -ESTALE (made for other header chunks), -EINVAL (another version,
 * truncated, inconsistent), -ENOMEM; d is then to be discarded (blob,
 * tensors and metas are freed and NULL). */
int vw_parsrec_decode(const uint8_t *rec, size_t len, const struct ckpt_extent_list *ext,
		      struct srcdata *d);

#endif
