/* ckptfs.h: libckptfs, the trainer-side checkpoint library (public API).
 *
 * A training rank describes its tensors (struct ckptfs_tensor) and calls ckptfs_save_async():
 * it returns once a consistent snapshot of every tensor sits in a pinned host pool that is
 * allocated once, reused by every later save and bounded by ckptfs_saver_opts.pool_bytes.
 * Background threads then write one safetensors file per (rank, group) with the ckptfs
 * sharding metadata (docs/views.md section 3), fsync it under a temporary name and publish it
 * by rename.  The checkpoint directory becomes visible under its final name only when every
 * rank's files are durable (docs/format.md, "Checkpoint directories"): ranks write into
 * PATH.partial/, each rank leaves a done marker after its files are durable, and rank 0 writes
 * the completion marker ckptfs-checkpoint.json last, fsyncs it, renames PATH.partial to PATH and
 * fsyncs the parent.  No collective communication is needed: the markers are the barrier.
 *
 * ckptfs_loader_open() opens a checkpoint directory, a view directory of a ckptfs mount
 * (MOUNT/tpT_ppP/PATH) or any directory of safetensors files with or without ckptfs metadata,
 * and ckptfs_load() fills caller buffers with any box or flat range of any stored tensor,
 * reading only the byte ranges that cover it, in parallel.  It works on a plain directory as
 * well as on the mount.
 *
 * Device memory: a tensor whose device is >= 0 is a CUDA device pointer.  When the library was
 * built with CUDA (ckptfs_cuda_available() says whether a GPU is usable at run time), snapshots
 * copy it with cudaMemcpyAsync on the library's own streams into the pinned pool and
 * ckptfs_save_async() returns after the copies' events completed; loads copy host-to-device.
 * Before its first copy from a device in a save, the library waits for the work already
 * queued on that device (cudaDeviceSynchronize), so kernels still writing a tensor finish
 * before it is copied, whatever stream they run on.
 * Without CUDA, a device tensor is refused with -ENODEV and a message naming it.
 *
 * Errors: every function returns 0 (or a count) on success and a negative errno on failure;
 * the message of the last failure, naming the file or tensor and the reason, is kept per
 * object (ckptfs_saver_error(), ckptfs_loader_error()).
 *
 * Threads: one saver or loader is used by one thread at a time (the caller's training thread);
 * the library's own threads never call back into the caller.  Different objects are
 * independent.  All strings passed in are copied before the call returns; data pointers of a
 * save are read only until ckptfs_save_async() returns (that is the snapshot).  The library's
 * threads block every signal, so signals for the process reach the caller's threads.
 *
 * Fork: a forked child (a DataLoader worker) that never calls the library is unaffected.  A
 * saver serves only the process that made it: in a child, ckptfs_save_async(),
 * ckptfs_save_wait(), ckptfs_saver_error() and ckptfs_saver_stats() return -ECHILD at once,
 * ckptfs_save_done() returns 1 and ckptfs_saver_free() returns without touching the saver
 * (the parent's save goes on in the parent).
 */
#ifndef CKPTFS_H
#define CKPTFS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CKPTFS_API_VERSION 1

/* The version of this library's ABI (CKPTFS_API_VERSION it was built with). */
int ckptfs_api_version(void);

/* 1 when the library was built with CUDA and a GPU is usable now, else 0. */
int ckptfs_cuda_available(void);

/* --- Tensors ------------------------------------------------------------------------------ */

#define CKPTFS_MAX_DIMS 16
/* tp_dim not given: the view infers it (docs/views.md 4.1). */
#define CKPTFS_TP_DIM_UNSET (-1000)
/* pp: a layer index >= 0, or one of these (docs/views.md 4.2). */
#define CKPTFS_PP_UNSET (-1)
#define CKPTFS_PP_FIRST (-2)
#define CKPTFS_PP_LAST (-3)
#define CKPTFS_PP_ENDS (-4)
#define CKPTFS_PP_ALL (-5)

/* One tensor of one rank: the stored (local) piece and where it sits in the whole tensor. */
struct ckptfs_tensor {
	const char *group;   /* file group ("model", "optim"); NULL means "model" */
	const char *name;    /* the global tensor's name, unique within its group */
	const char *dtype;   /* safetensors dtype name: "F64", "F32", "F16", "BF16", "I64", ... */
	int ndim;            /* dimensions of the stored piece, 0..CKPTFS_MAX_DIMS */
	const int64_t *shape;/* stored shape (ndim values) */
	const void *data;    /* C-contiguous elements of the stored piece */
	int device;          /* -1: host memory; >= 0: CUDA device ordinal of a device pointer */
	/* Placement.  global_ndim == 0: the piece is the whole tensor.  Otherwise global_shape
	 * (global_ndim values) is the whole tensor's shape and either
	 *   flat == 0: the piece is the box of the stored shape starting at offsets (NULL: zeros),
	 *              ndim == global_ndim; or
	 *   flat != 0: the piece is 1-D and holds elements [flat_start, flat_end) of the row-major
	 *              flattening of the box of box_shape (NULL: global_shape) at offsets. */
	int global_ndim;
	const int64_t *global_shape;
	const int64_t *offsets;
	int flat;
	int64_t flat_start, flat_end;
	const int64_t *box_shape;
	int tp_dim;          /* CKPTFS_TP_DIM_UNSET, -1 (replicated) or 0..global ndim-1 */
	int pp;              /* CKPTFS_PP_* or a layer index */
	/* Nonzero: another rank holds the same piece and writes it; this rank records nothing for
	 * it.  The caller picks one writer per replicated piece; passing 0 on every rank makes
	 * every rank write its copy (the store deduplicates identical chunks). */
	int replica;
};

/* An opaque extra file a rank saves beside its tensors (pickled RNG state, config.json). */
struct ckptfs_blob {
	const char *name;    /* a plain file name (no '/'), unique within the checkpoint */
	const void *data;
	size_t len;
};

/* --- Save --------------------------------------------------------------------------------- */

enum ckptfs_backpressure {
	CKPTFS_BP_WAIT = 0,  /* a save while the previous one still writes waits for it */
	CKPTFS_BP_FAIL = 1,  /* ... fails with -EBUSY, naming the checkpoint still being written */
};

struct ckptfs_saver_opts {
	size_t pool_bytes;      /* bound on the pinned pool; 0: 1/2 of physical memory */
	int io_threads;         /* background writers; 0: 2 */
	int backpressure;       /* enum ckptfs_backpressure */
	size_t write_bytes;     /* bytes per write(); 0: 8 MiB (rounded to 4 KiB) */
	int commit_timeout_ms;  /* how long the commit waits for the other ranks; 0: 600000 */
	int wait_commit;        /* nonzero: ranks other than 0 also wait for the completion marker
	                           before their save counts as done (default set by Python: 1) */
};

/* Fills *opts with the defaults (every field explicit). */
void ckptfs_saver_opts_init(struct ckptfs_saver_opts *opts);

struct ckptfs_saver;

/* A saver for one rank.  opts NULL: defaults.  The pool is reserved here and populated by the
 * first save; it is never shrunk or reallocated. */
int ckptfs_saver_new(const struct ckptfs_saver_opts *opts, struct ckptfs_saver **ret_saver);
/* Waits for the save in flight (if any), then frees everything.  Accepts NULL. */
void ckptfs_saver_free(struct ckptfs_saver *s);

struct ckptfs_save_args {
	const char *path;        /* the checkpoint directory, final name; its parent must exist */
	int rank, world;         /* 0 <= rank < world */
	uint64_t job_id;         /* the same on every rank of one job (done markers of other jobs'
	                            crashed saves are ignored); 0 allowed for world == 1 */
	uint64_t seq;            /* the save's sequence number within the job, same on every rank;
	                            a save retried at the same PATH after a failure takes a new
	                            seq on every rank (done markers of the failed attempt must not
	                            count), and PATH.partial may stay: stale files are removed */
	const struct ckptfs_tensor *tensors;
	size_t n_tensors;
	const struct ckptfs_blob *blobs;   /* written by this rank as they are */
	size_t n_blobs;
	int num_layers;          /* written as num_layers of every group; < 0: omitted */
	const char *manifest_extra; /* rank 0: a JSON object stored as "extra" in the completion
	                               marker (param groups, framework facts); NULL: none */
};

/* Snapshots every tensor into the pool and queues the writes; returns when the snapshot is
 * complete (device copies finished).  -EBUSY (BP_FAIL) if a save is still writing, -EFBIG if
 * the snapshot needs more than pool_bytes, -EINVAL for a bad descriptor, -EEXIST if PATH
 * already exists. */
int ckptfs_save_async(struct ckptfs_saver *s, const struct ckptfs_save_args *args);
/* Waits for the last save: its files durable (and, on rank 0 or with wait_commit, the
 * checkpoint complete).  timeout_ms < 0: no limit.  0, -ETIMEDOUT, or the save's error.
 * A background save's error is reported here (and by ckptfs_saver_error()) only until the
 * next ckptfs_save_async() starts another save: wait before the next save to learn it. */
int ckptfs_save_wait(struct ckptfs_saver *s, int timeout_ms);
/* -ETIMEDOUT is also the error of a save whose commit timed out: ckptfs_save_done() tells the
 * two apart (0: still running; 1: finished with that error). */
/* 1 if no save is in flight, 0 if one is. */
int ckptfs_save_done(struct ckptfs_saver *s);
/* Bytes of the pool now populated (what the saver holds in host memory). */
size_t ckptfs_saver_pool_bytes(const struct ckptfs_saver *s);
/* Copies the last error message ("PATH: reason") into buf (NUL-terminated, truncated to
 * len); returns its errno (negative) or 0 if the last operation succeeded. */
int ckptfs_saver_error(const struct ckptfs_saver *s, char *buf, size_t len);

/* Per-phase timings of the last completed save, in nanoseconds (for benchmarks). */
struct ckptfs_save_stats {
	uint64_t snapshot_ns;    /* inside ckptfs_save_async */
	uint64_t write_ns;       /* first write to this rank's files durable */
	uint64_t commit_ns;      /* this rank's files durable to the checkpoint complete */
	uint64_t bytes;          /* bytes this rank wrote */
};
int ckptfs_saver_stats(const struct ckptfs_saver *s, struct ckptfs_save_stats *ret_stats);

/* --- Load --------------------------------------------------------------------------------- */

struct ckptfs_loader_opts {
	int io_threads;          /* parallel readers; 0: 4 */
	int require_complete;    /* nonzero: refuse a directory without the completion marker
	                            (-ENOENT for PATH missing with PATH.partial present, -EBADMSG
	                            for a directory without the marker) */
};
void ckptfs_loader_opts_init(struct ckptfs_loader_opts *opts);

struct ckptfs_loader;

/* Opens DIR and parses the headers (not the data) of every *.safetensors file directly in it:
 * files with ckptfs metadata are pieces as described; files without are whole tensors. */
/* On failure *ret_loader is NULL and ckptfs_loader_error(NULL, ...) says why. */
int ckptfs_loader_open(const char *dir, const struct ckptfs_loader_opts *opts,
                       struct ckptfs_loader **ret_loader);
void ckptfs_loader_free(struct ckptfs_loader *l);

/* The global tensors found, in (group, name) order: index 0 .. count-1. */
size_t ckptfs_loader_count(const struct ckptfs_loader *l);
struct ckptfs_tensor_info {
	const char *group;       /* owned by the loader */
	const char *name;
	const char *dtype;
	int ndim;
	int64_t shape[CKPTFS_MAX_DIMS]; /* global shape */
	int tp_dim;              /* explicit tp_dim of the pieces, or CKPTFS_TP_DIM_UNSET */
	int pp;                  /* explicit pp of the first piece, or CKPTFS_PP_UNSET */
};
int ckptfs_loader_info(const struct ckptfs_loader *l, size_t index, struct ckptfs_tensor_info *ret);
/* Index of (group, name), or -ENOENT. */
int ckptfs_loader_find(const struct ckptfs_loader *l, const char *group, const char *name);

/* One destination: the box `shape` at `offsets` of the global tensor (or, flat != 0, elements
 * [flat_start, flat_end) of the row-major flattening of the box box_shape at offsets; box_shape
 * NULL: the global shape), written C-contiguous into dst. */
struct ckptfs_load_req {
	const char *group;       /* NULL: "model" */
	const char *name;
	const char *dtype;       /* must equal the stored dtype (no conversion) */
	void *dst;
	int device;              /* -1 host, >= 0 CUDA device of dst */
	int ndim;                /* the global ndim */
	const int64_t *shape;    /* the box's shape; NULL: the global shape */
	const int64_t *offsets;  /* NULL: zeros */
	int flat;
	int64_t flat_start, flat_end;
	const int64_t *box_shape;
};

/* Fills every request, reading only the byte ranges they cover, with io_threads readers.
 * Fails (and names the tensor) if a request's dtype or global shape disagrees with the stored
 * one, if a part is covered by no stored piece, or on a read error (naming the file).
 * Returns 0 or a negative errno; on failure, destinations may be partly written. */
int ckptfs_load(struct ckptfs_loader *l, const struct ckptfs_load_req *reqs, size_t n);
/* Copies the loader's last error message into buf, as ckptfs_saver_error().  l NULL: the
 * message of the calling thread's last failed ckptfs_loader_open(). */
int ckptfs_loader_error(const struct ckptfs_loader *l, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* CKPTFS_H */
