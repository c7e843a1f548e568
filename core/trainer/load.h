/* load.h: the loader's internals, shared by load.c (opening a directory, the tensor index) and
 * load_io.c (planning and executing ckptfs_load), plus the hooks the tests and benchmarks use.
 *
 * A loader holds, after ckptfs_loader_open():
 *   - files[]: every *.safetensors file directly in the directory, in strcmp order of names,
 *     with the absolute byte offset of its data area and its size at open;
 *   - tensors[]: the global tensors in (group, name) strcmp order, each with its pieces in
 *     pieces[first_piece .. first_piece + n_pieces), ordered by (file, order in the file),
 *     exact replicas and empty pieces left out, and whether those pieces are disjoint.
 * The index is immutable after open; ckptfs_load() only reads it (plus the per-loader error
 * message, tune and statistics, which the one caller thread at a time updates, as ckptfs.h
 * requires; the load's own reader threads touch none of them).
 *
 * Errors: every failure is recorded with ld_fail() as "WHAT: reason" naming the directory,
 * file or (group, tensor); ckptfs_loader_error() returns it.  A failed ckptfs_loader_open()
 * has no loader to keep it in: its message is kept per thread and ckptfs_loader_error(NULL)
 * returns it.
 *
 * Internal entry points exported from the shared library for the tests and the benchmark
 * (ckptfs__* names, not part of the public API, may change with the library):
 *   ckptfs__loader_tune()  overrides the I/O planning constants of one loader;
 *   ckptfs__loader_stats() returns the counters of the last ckptfs_load() of one loader.
 */
#ifndef CKPTFS_LOAD_H
#define CKPTFS_LOAD_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trainer/ckptfs.h"
#include "views/layout.h"
#include "views/safetensors.h"

#define CKPTFS_EXPORT __attribute__((visibility("default")))

/* The completion marker a finished save writes last (ckptfs.h). */
#define LD_MARKER "ckptfs-checkpoint.json"
#define LD_ERR_MAX 1024

/* I/O planning defaults (ld_tune).  Gaps up to gap_max bytes between two runs of one file are
 * read (into a scratch buffer) rather than paying another read call: about what a read call
 * costs in copied bytes, measured (a 2 KiB run every 4 KiB gathers faster, a 32 KiB run every
 * 64 KiB does not), and much more on a FUSE file system (ckptfs's views bypass the page
 * cache: every read call is a round trip to the daemon).  Reads are cut at chunk bytes (from
 * the total, between LD_CHUNK_MIN and LD_CHUNK_MAX) so every thread gets work; a read
 * gathers LD_IOV_MAX pieces per call. */
#define LD_GAP_MAX_DEFAULT (16u << 10)
#define LD_GAP_MAX_FUSE (256u << 10)
#define LD_CHUNK_MIN (1u << 20)
#define LD_CHUNK_MAX (16u << 20)
#define LD_IOV_MAX 1024
/* Reads are announced to the kernel (POSIX_FADV_WILLNEED) this many bytes ahead. */
#define LD_AHEAD_BYTES (64u << 20)
#define LD_WILLNEED_DEFAULT 0
/* Device destinations are read into host staging buffers of this many bytes in all (two
 * halves: one is copied to the device while the other is read), refilled. */
#define LD_STAGE_BYTES (256u << 20)

struct ld_file {
	char *path;             /* DIR/NAME, owned */
	uint64_t data_start;    /* 8 + N: file offset of the data area */
	uint64_t size;          /* file size at open */
	bool fuse;              /* on a FUSE file system (read calls cost a round trip) */
};

struct ld_piece {
	uint32_t file;          /* index into files[] */
	uint64_t off;           /* absolute file offset of the stored bytes */
	uint64_t len;           /* stored bytes */
	struct ckpt_piece_geom geom;
};

struct ld_tensor {
	char *group, *name;     /* owned */
	enum ckpt_dtype dtype;
	unsigned ndim;
	uint64_t shape[CKPT_MAX_DIMS];
	int tp_dim;             /* CKPTFS_TP_DIM_UNSET or the first explicit value */
	int pp;                 /* CKPTFS_PP_* or a layer, from the first piece that has one */
	/* pieces[first_piece ..+ n_pieces): one per distinct geometry (of exact replicas only
	 * the first, by file name order, is kept: loads read it) */
	size_t first_piece, n_pieces;
	bool disjoint;          /* no two pieces share an element (loads may skip the sweep) */
};

/* Overrides of the planning constants (0: the default).  mode 0: gather reads (preadv straight
 * into the destinations, gaps into a scratch buffer); mode 1: bounce (read each coalesced
 * range into a thread buffer, then copy out); mode 2: one read call per run, never
 * coalesced.  Modes 1 and 2 are kept for measurements and tests. */
struct ckptfs__load_tune {
	uint64_t gap_max;       /* 0: the default of the file's file system; UINT64_MAX: never
	                           read through a gap */
	uint64_t chunk_bytes;   /* 0: from the total and the thread count */
	int mode;
	int willneed;           /* readahead announcements: 1 on, -1 off, 0 default */
	uint64_t stage_bytes;   /* staging buffer of device destinations; 0: LD_STAGE_BYTES */
	int stage_host;         /* nonzero: host destinations go through staging too (tests) */
};

/* Counters of the last ckptfs_load(). */
struct ckptfs__load_stats {
	uint64_t bytes_needed;  /* bytes of the requests' destinations */
	uint64_t bytes_read;    /* bytes the reads transferred (needed + coalesced gaps) */
	uint64_t gap_bytes;     /* of which gaps */
	uint64_t runs;          /* copy runs after merging */
	uint64_t reads;         /* read requests planned */
	uint64_t syscalls;      /* pread/preadv calls made */
	uint64_t files;         /* files opened */
	uint64_t plan_ns, io_ns;/* planning and reading time */
};

struct ckptfs_loader {
	char *dir;              /* as given, owned */
	int io_threads;
	struct ld_file *files;
	size_t n_files;
	struct ld_tensor *tensors;
	size_t n_tensors;
	struct ld_piece *pieces;
	size_t n_pieces;
	struct ckptfs__load_tune tune;
	struct ckptfs__load_stats stats;
	int err;                /* errno of the last failure (negative) or 0 */
	char errmsg[LD_ERR_MAX];
};

/* Record an error in l (message "..." formatted, one line) and return err. */
int ld_fail(struct ckptfs_loader *l, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Index of (group, name) in l->tensors, or -1. */
long ld_find(const struct ckptfs_loader *l, const char *group, const char *name);

CKPTFS_EXPORT int ckptfs__loader_tune(struct ckptfs_loader *l, const struct ckptfs__load_tune *t);
CKPTFS_EXPORT int ckptfs__loader_stats(const struct ckptfs_loader *l,
				       struct ckptfs__load_stats *ret);

#endif /* CKPTFS_LOAD_H */
