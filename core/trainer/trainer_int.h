/* trainer_int.h: what the save half of libckptfs shares between its modules (internal).
 *
 * Modules: errbuf (a locked "what failed" message), pool.c (the snapshot pool), plan.c
 * (descriptor validation and the safetensors image of each output file), stwrite.c (writing
 * one image from the pool to its final name durably), commit.c (done markers, the completion
 * marker and the directory rename), save.c (the saver object and its threads), copy_host.c /
 * copy_cuda.cu (the copy engine, copy.h).
 *
 * On-disk names inside PATH.partial/ (and PATH/ once complete):
 *   GROUP-rankRRRRR.safetensors   one file per (group, rank) holding written tensors
 *   BLOB                          each blob under its own name
 *   .tmp-rRRRRR-NAME              a file being written (never published under this name)
 *   .rank-RRRRR.done              rank R's done marker (JSON, see commit.h)
 *   .rank-RRRRR.failed            rank R's save of this job and seq failed (JSON, commit.h)
 *   ckptfs-checkpoint.json        the completion marker, written last by rank 0
 * RRRRR is the rank in decimal, at least 5 digits, zero-padded.
 */
#ifndef CKPTFS_TRAINER_INT_H
#define CKPTFS_TRAINER_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "trainer/ckptfs.h"

#define TR_EXPORT __attribute__((visibility("default")))

#define TR_MARKER_NAME "ckptfs-checkpoint.json"
#define TR_MARKER_FORMAT "ckptfs-checkpoint"
#define TR_MARKER_VERSION 1
#define TR_PARTIAL_SUFFIX ".partial"
#define TR_MSG_MAX 1024

/* --- errbuf: the last error of an object, set by any of its threads ---------------------- */
struct tr_errbuf {
	pthread_mutex_t lock; /* protects err and msg */
	int err;              /* negative errno or 0 */
	char msg[TR_MSG_MAX];
};
void tr_errbuf_init(struct tr_errbuf *e);
void tr_errbuf_destroy(struct tr_errbuf *e);
/* Sets err and the message (printf format; made one line).  Returns err. */
int tr_errbuf_set(struct tr_errbuf *e, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void tr_errbuf_clear(struct tr_errbuf *e);
int tr_errbuf_get(struct tr_errbuf *e, char *buf, size_t len);

/* printf into a fixed buffer (truncating, one line). */
void tr_fmt(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Frees a string made by json_dumps(). */
void tr_json_free(void *p);

/* Monotonic clock in nanoseconds. */
uint64_t tr_now_ns(void);

/* pthread_create() for the library's own threads: they start with every signal blocked, so
 * that a signal meant for the process (a trainer's SIGINT, a profiler's SIGPROF) is delivered
 * to one of the caller's threads, where its handler expects to run, and never interrupts a
 * writer's system call.  Returns 0 or a positive errno, as pthread_create(). */
int tr_thread_start(pthread_t *t, void *(*fn)(void *), void *arg);

/* --- test hooks (exported for the unit tests only; not part of ckptfs.h) ------------------- */
/* Each background writer sleeps ms before writing each file of the next saves. */
TR_EXPORT void ckptfs__test_set_write_delay(struct ckptfs_saver *s, int ms);
/* The pool's base address (to check that it is reused). */
TR_EXPORT const void *ckptfs__test_pool_base(const struct ckptfs_saver *s);

#endif /* CKPTFS_TRAINER_INT_H */
