/* plan.h: validation of a save's descriptors and the layout of its output files (internal).
 *
 * tr_plan_build() checks every tensor and blob of a ckptfs_save_args, groups the tensors this
 * rank writes (replica == 0) into one safetensors file per group, GROUP-rankRRRRR.safetensors,
 * (a rank may give several pieces of one global tensor, e.g. one per query group of a fused
 * QKV: a safetensors file holds a name once, so the k-th piece of a name goes to part file
 * k, GROUP-rankRRRRR-K.safetensors for K >= 1; pieces of one name must differ in placement),
 * builds each file's header (with the ckptfs sharding metadata, docs/views.md section 3, and
 * checked by the views' own parsers) and places each file's whole image contiguously in the
 * pool at a page-aligned offset: the header first, then the tensors' data in file order.
 * Blobs are files of their own, also placed in the pool.  Nothing is copied here.
 *
 * A plan refers to the args' tensors and blobs (item.tensor, out.blob) only until the
 * snapshot is taken; names, sizes, offsets and headers are its own.
 *
 * Training saves the same layout again and again: a plan keeps a signature of everything
 * that shapes its files (rank, num_layers, every descriptor but its data pointer and device
 * ordinal, blob names and lengths).  Given the previous plan with an equal signature,
 * tr_plan_build() reuses it (its headers, layout and checks) and only re-points it at the new
 * descriptors and checks their data pointers, so a repeated save costs no header building.
 */
#ifndef CKPTFS_TRAINER_PLAN_H
#define CKPTFS_TRAINER_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "trainer/ckptfs.h"

struct tr_item {
	const struct ckptfs_tensor *tensor;
	size_t index;          /* in args->tensors */
	unsigned bits;         /* per element */
	uint64_t bytes;
	uint64_t data_off;     /* from the start of the file image */
	unsigned part;         /* k: the k-th piece of its (group, name) on this rank, 0-based */
};

struct tr_out {
	char *name;            /* the final file name inside the checkpoint directory */
	char *group;           /* NULL for a blob */
	uint8_t *header;       /* 8-byte length + JSON header; NULL for a blob */
	size_t header_len;
	struct tr_item *items; /* in file order */
	size_t n_items;
	const struct ckptfs_blob *blob;
	uint64_t size;         /* bytes of the whole file */
	size_t pool_off;       /* where the image starts in the pool (page-aligned) */
};

struct tr_plan {
	struct tr_out *outs;   /* tensor files in group order, then blobs in args order */
	size_t n_outs;
	size_t pool_bytes;     /* end of the last image in the pool */
	uint64_t bytes;        /* sum of the file sizes */
	int any_device;        /* some written tensor is a device pointer */
	char *sig;             /* the signature (see above) */
	size_t sig_len;
};

/* Returns 0 and a plan, or -EINVAL (a bad descriptor), -ENODEV (a device tensor without
 * usable CUDA), -EOVERFLOW, -ENOMEM with a reason naming the tensor or blob in err.  *prev (may
 * be NULL, or point to NULL) is the previous save's plan: when it has the same signature it
 * is moved to *ret_plan (and *prev set to NULL); otherwise it is left alone. */
int tr_plan_build(const struct ckptfs_save_args *a, struct tr_plan **prev,
		  struct tr_plan **ret_plan, char *err, size_t errlen);
void tr_plan_free(struct tr_plan *p);

/* "GROUP-rankRRRRR.safetensors" (part 0) or "GROUP-rankRRRRR-K.safetensors" into buf. */
void tr_tensor_file_name(char *buf, size_t len, const char *group, int rank, unsigned part);

#endif /* CKPTFS_TRAINER_PLAN_H */
