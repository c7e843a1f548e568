/* SPDX-License-Identifier: MIT */
/*
 * view_int.h - the data model of a view, shared by the modules of
 * core/views that build and serve it (not a public header; see views.h
 * for the contract and the module map).
 *
 *   sources   one parse per safetensors file (struct srcdata: source.c,
 *             persisted by parsrec.c), shared through a process-wide cache;
 *   model     the layout-independent part of a view (struct vmodel:
 *             model.c): sources, pieces, global tensors, groups;
 *   view      a model seen in one layout (struct ckpt_view: view.c), whose
 *             files are planned on first use (plan.c);
 *   open file the byte runs of each tensor (vcheck.c computes and checks
 *             them; vfile.c serves reads from them).
 *
 * Ownership runs one way: a view holds one reference on its model, a model
 * one reference on the parse of each of its sources, an open file one
 * reference on its view.  Models and parses never change once built (V1 of
 * view.c), so they are read without locks.
 *
 * Functions named vw_* are shared between these files only.
 */
#ifndef CKPT_VIEW_INT_H
#define CKPT_VIEW_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "views/layout.h"
#include "views/safetensors.h"
#include "views/shardmeta.h"
#include "views/vcache.h"
#include "views/view.h"
#include "store/store.h"

/* ------------------------------------------------------------- sources */

/* The ckptfs metadata of one stored tensor: struct ckpt_tensor_meta
 * without its CKPT_MAX_DIMS-entry arrays, since a source may hold tens of
 * thousands of tensors.  gs, off, shape: ndim entries each, in the parse's
 * dims buffer (mdims or blob). */
struct smeta {
	unsigned ndim;
	int tp_dim;
	bool flat, has_pp;
	struct ckpt_pp pp;
	uint64_t flat_begin, flat_end;
	const uint64_t *gs, *off, *shape; /* global shape, box offset and shape */
};

/* The parse of one source file, shared by every view built while the file
 * is unchanged (several layouts of one directory parse each header once).
 * Immutable once in the cache. */
struct srcdata {
	struct vcache_node node;
	uint64_t ino, size;
	int64_t mtime_ns;
	struct ckpt_extent_list *ext;
	ckpt_st_header *hdr;  /* NULL when read from a persisted parse */
	ckpt_shardmeta *meta; /* NULL then too, and when not reshardable */
	uint64_t data_start;  /* 8 + header length */
	bool source;          /* reshardable: consumed by the views */
	bool described;       /* __metadata__ has a "ckptfs" key: the writer
			       * described its tensors (else they are taken
			       * whole, which is all a plain writer can mean) */
	struct smeta *metas;  /* per tensor (parallel to tensors) */
	uint64_t *mdims;      /* their dims (parsed JSON; else in blob) */
	/* The tensor table the views use, in strcmp order of names when memory
	 * allowed (vw_source_load): from hdr/meta (parsed JSON) or from the
	 * persisted parse (then names and shapes live in blob). */
	struct ckpt_st_tensor *tensors;
	size_t ntensors;
	const char *group;
	bool has_nl;
	uint64_t nl;          /* num_layers, when has_nl */
	void *blob;
};

/* A source of a model: a regular file of its directory flagged as
 * safetensors. */
struct src {
	uint64_t ino;
	char *name;
	int64_t mtime_ns;
	struct srcdata *d; /* one reference on the shared parse */
};

/* Parse the source file ino (size and mtime from its inode), or share the
 * parse of an unchanged one; name is for messages.  *ret holds a reference
 * (vw_srcdata_unref).  Errors: -EIO (the header cannot be read or no
 * longer parses), -ENOMEM; err names the file and the reason. */
int vw_source_load(ckpt_store *s, uint64_t ino, uint64_t size, int64_t mtime_ns,
		   const char *name, struct srcdata **ret, char *err, size_t errlen);
void vw_srcdata_unref(struct srcdata *d); /* accepts NULL */
void vw_source_forget_store(ckpt_store *s);
size_t vw_source_kept_bytes(void);
void vw_source_set_budget(size_t bytes);
/* Let go of the cached parses of files deleted or changed since (vcache_sweep). */
void vw_source_sweep(void);
size_t vw_source_count(void);  /* parses alive (vcache_count) */

/* The entries of dir, the attributes of its regular files (ins[i].ino == 0
 * for other entries and files that vanished) and the fingerprint of
 * ckpt_view_signature(), in one pass. */
int vw_scan_dir(ckpt_store *s, uint64_t dir, struct ckpt_dirent **ret_ents, size_t *ret_n,
		struct ckpt_inode **ret_ins, uint64_t *ret_sig);

/* --------------------------------------------------------------- model */

struct piece {
	size_t src;
	const struct ckpt_st_tensor *t;
	const struct smeta *m; /* the source's (cached parse) */
	const char *group;
};

struct gtensor {
	const char *name;
	size_t group;
	size_t p0, p1; /* pieces[p0..p1) */
	enum ckpt_dtype dtype;
	unsigned elem_bytes;
	unsigned ndim;
	uint64_t gshape[CKPT_MAX_DIMS];
	int tp_dim;
	struct ckpt_pp pp;
	char *problem; /* non-NULL: every file holding it fails to open */
	/* problem is the no-sharding-metadata kind (pieces of different shapes,
	 * none described); it then reads "is in N files (...) ..." and follows
	 * "group 'G', tensor 'T' " without a colon */
	bool problem_nometa;
	/* pieces without sharding metadata whose chunk digests prove that
	 * their bytes differ (found at build without I/O; an open reports it
	 * after comparing the bytes itself) */
	bool nometa_bytes;
};

struct vgroup {
	char *name;
	size_t g0, g1; /* gtensors[g0..g1) */
	uint64_t num_layers;
	size_t nfiles;
	unsigned saved_tp, saved_pp;
};

/* The layout-independent part of a view (sources, pieces in (group, name,
 * source) order, global tensors, groups), shared through the model cache
 * by the views of every layout of one unchanged directory.  Immutable once
 * built. */
struct vmodel {
	struct vcache_node node;
	uint64_t dir, sig;
	const ckpt_tp_rules *rules;
	int64_t mtime_ns; /* latest of the directory and its regular files */
	struct src *srcs;
	size_t nsrcs;
	struct piece *pieces;
	size_t npieces;
	struct gtensor *gts;
	size_t ngts;
	struct vgroup *groups;
	size_t ngroups;
};

/* The model of store directory dir (whose mtime is dir_mtime_ns) under
 * rules: the cached one while the directory's signature is unchanged, else
 * built and cached.  *ret holds a reference (vw_model_unref).  Errors as
 * ckpt_view_build(). */
int vw_model_get(ckpt_store *s, uint64_t dir, int64_t dir_mtime_ns, const ckpt_tp_rules *rules,
		 struct vmodel **ret, char *err, size_t errlen);
void vw_model_unref(struct vmodel *m); /* accepts NULL */
void vw_model_forget_store(ckpt_store *s);
size_t vw_model_count(void); /* models alive (vcache_count) */
size_t vw_model_kept_bytes(void);
void vw_model_set_budget(size_t bytes);

/* What a reader must do about a tensor held by several files with
 * different contents and no sharding metadata. */
#define VW_NOMETA_HINT \
	"describe it (docs/views.md section 3) or save with ckptfs.save (docs/trainer.md)"

/* "N files (a, b, ...)" for the sources holding global tensor g: at most 4
 * names, then "and K more". */
void vw_fmt_files(const struct vmodel *m, const struct gtensor *g, char *buf, size_t len);

/* Compare len bytes at oa of extent list la and at ob of lb by chunk
 * digests only: 1 equal, 0 different, -1 undecided (the extents do not
 * start at oa and ob or do not line up, e.g. zero runs merged across a
 * tensor boundary).  Pure: no I/O. */
int vw_same_digests(const struct ckpt_extent_list *la, uint64_t oa,
		    const struct ckpt_extent_list *lb, uint64_t ob, uint64_t len);

/* The part of global tensor g that TP rank t of T holds, in global
 * coordinates (section 5 of docs/views.md). */
void vw_part_box(const struct gtensor *g, unsigned T, unsigned t, struct ckpt_box *b);

/* ---------------------------------------------------------------- view */

struct vtensor {
	size_t g;          /* global tensor; its part: vw_part_box() */
	uint64_t data_off; /* in the file's data area */
	uint64_t nbytes;
};

struct vfile_plan {
	char *name;
	size_t group;
	unsigned tp_rank, pp_rank;
	bool planned; /* header, tensors and size computed (under plan_lock) */
	int plan_err;
	/* every tensor passed the checks of an open once: the view never
	 * changes (V1), so later opens skip them */
	atomic_bool verified;
	uint8_t *hdr;
	size_t hdr_len;
	uint64_t size;
	struct vtensor *t;
	size_t nt;
};

struct ckpt_view {
	atomic_int refs;
	ckpt_store *s;
	struct ckpt_layout layout;
	struct vmodel *m; /* one reference, released when the view goes */
	pthread_mutex_t plan_lock; /* files are planned on first use */
	struct vfile_plan *files; /* names fixed at build; the rest planned */
	size_t nfiles;
};

/* Names of the files of v (their headers: vw_ensure_plan). */
int vw_plan_files(ckpt_view *v);
/* Plan file i of v (header, tensors, size) if not done yet; returns the
 * planning's result (0 or a negative errno, -ENOMEM in practice), the same
 * on every call. */
int vw_ensure_plan(ckpt_view *v, size_t i);
void vw_plans_free(struct vfile_plan *files, size_t n);

/* ------------------------------------------------------ runs and checks */

struct run {
	uint64_t dst;     /* offset in the view file */
	uint64_t len;
	size_t src;       /* index into the model's srcs */
	uint64_t src_off; /* offset in the source file */
};

struct runvec {
	struct run *v;
	size_t n, cap;
};

/* Runs of one tensor of a view file, appended to out (dst: file offsets),
 * sorted and tiling the tensor (V2 of view.c).  Returns -EIO with err set
 * when the tensor cannot be served, -ENOMEM.  check: compare replicas and
 * overlapping pieces (else the tensor is known to have passed, and overlaps
 * are only trimmed). */
int vw_tensor_runs(ckpt_view *v, const struct vfile_plan *f, const struct vtensor *vt,
		   struct runvec *out, bool check, char *err, size_t errlen);
/* What an open checks for one tensor: vw_tensor_runs(check = true) without
 * computing runs where the pieces' geometry alone proves it. */
int vw_tensor_check(ckpt_view *v, const struct vfile_plan *f, const struct vtensor *vt,
		    char *err, size_t errlen);

#endif
