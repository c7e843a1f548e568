/* pool.c: the snapshot pool (pool.h). */
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "trainer/copy.h"
#include "trainer/pool.h"

/* Pinned ranges are registered in steps of at least this many bytes, so that a save slightly
 * larger than the last one does not register a sliver each time. */
#define PIN_STEP ((size_t)64 << 20)
#define MAX_PINS 64

struct tr_pool {
	char *base;
	size_t bound;
	size_t populated;
	size_t pinned;              /* [0, pinned) is registered with CUDA */
	char *pins[MAX_PINS];       /* start of each registered range */
	int n_pins;
};

static size_t page_round(size_t n)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);

	return (n + pg - 1) / pg * pg;
}

int tr_pool_new(size_t bound, struct tr_pool **ret_pool)
{
	struct tr_pool *p;

	*ret_pool = NULL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->bound = page_round(bound ? bound : 1);
	p->base = mmap(NULL, p->bound, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p->base == MAP_FAILED) {
		int err = -errno;

		free(p);
		return err;
	}
	/* Huge pages make the first population and every later copy cheaper (fewer faults and
	 * TLB misses); the kernel may refuse, which costs nothing. */
	(void)madvise(p->base, p->bound, MADV_HUGEPAGE);
	*ret_pool = p;
	return 0;
}

void tr_pool_free(struct tr_pool *p)
{
	if (!p)
		return;
	for (int i = 0; i < p->n_pins; i++)
		tr_host_unregister(p->pins[i]);
	munmap(p->base, p->bound);
	free(p);
}

char *tr_pool_base(const struct tr_pool *p)
{
	return p->base;
}

size_t tr_pool_bound(const struct tr_pool *p)
{
	return p->bound;
}

size_t tr_pool_populated(const struct tr_pool *p)
{
	return p->populated;
}

int tr_pool_use(struct tr_pool *p, size_t bytes, int pin)
{
	if (bytes > p->bound)
		return -EFBIG;
	if (bytes > p->populated)
		p->populated = bytes;
	if (pin && bytes > p->pinned && tr_cuda_usable()) {
		size_t end = page_round(bytes);
		int ret;

		if (end - p->pinned < PIN_STEP)
			end = p->pinned + PIN_STEP;
		if (end > p->bound)
			end = p->bound;
		if (p->n_pins == MAX_PINS)
			return 0; /* unpinned copies are slower, never wrong */
		ret = tr_host_register(p->base + p->pinned, end - p->pinned);
		if (ret < 0)
			return ret;
		p->pins[p->n_pins++] = p->base + p->pinned;
		p->pinned = end;
	}
	return 0;
}
