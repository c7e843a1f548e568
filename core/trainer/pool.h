/* pool.h: the snapshot pool of a saver (internal).
 *
 * One anonymous mapping of `bound` bytes reserved at creation without committing memory
 * (MAP_NORESERVE); a save lays its file images from offset 0 and touches what it needs, so
 * memory is populated by the first save and reused by every later one.  The mapping never
 * moves, grows or shrinks.  When a save copies from a GPU, the populated part is registered
 * with CUDA (pinned) once; later saves of the same size register nothing.
 *
 * Threads: owned by one saver; tr_pool_use() runs on the caller's thread while no writer reads
 * the pool (the saver's back-pressure guarantees it); writers only read the bytes.
 */
#ifndef CKPTFS_TRAINER_POOL_H
#define CKPTFS_TRAINER_POOL_H

#include <stddef.h>

struct tr_pool;

/* Reserves bound bytes (rounded up to pages).  -ENOMEM if the address space is refused. */
int tr_pool_new(size_t bound, struct tr_pool **ret_pool);
/* Unregisters and unmaps.  Accepts NULL. */
void tr_pool_free(struct tr_pool *p);

char *tr_pool_base(const struct tr_pool *p);
size_t tr_pool_bound(const struct tr_pool *p);
/* Bytes populated so far (the high-water mark of tr_pool_use). */
size_t tr_pool_populated(const struct tr_pool *p);

/* Declares that the next save uses [0, bytes).  -EFBIG if bytes > bound.  pin != 0: the range
 * must be pinned for device copies; the part not yet registered is registered now (0 or the
 * copy engine's error, reason in tr_copy_error()). */
int tr_pool_use(struct tr_pool *p, size_t bytes, int pin);

#endif /* CKPTFS_TRAINER_POOL_H */
