/* SPDX-License-Identifier: MIT */
/*
 * aio_depth.c - how fast this disk serves O_DIRECT reads of a file by the
 * number of requests in flight, with Linux's native AIO as the store's
 * read-ahead uses it (ckpt_store_prefetch_begin).
 *
 * usage: aio_depth FILE SIZE DEPTH [COUNT]
 *
 * Reads COUNT (default 200) pieces of SIZE KiB at random offsets (multiples
 * of SIZE, each piece once) of FILE with O_DIRECT into a buffer aligned to
 * 2 MiB and advised MADV_HUGEPAGE, keeping DEPTH requests in flight
 * (io_submit one, io_getevents as they complete).  Prints GB/s.  Drop the
 * page cache first (echo 3 > /proc/sys/vm/drop_caches).  See
 * Its figures are cited in docs/performance.md.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "benchclock.h"

#define ALIGN (2u << 20)
#define MAX_DEPTH 64

static int submit(aio_context_t ctx, struct iocb *cb, int fd, uint8_t *buf, size_t len,
		  uint64_t off, unsigned slot)
{
	struct iocb *one = cb;

	memset(cb, 0, sizeof(*cb));
	cb->aio_data = slot;
	cb->aio_lio_opcode = IOCB_CMD_PREAD;
	cb->aio_fildes = (uint32_t)fd;
	cb->aio_buf = (uint64_t)(uintptr_t)buf;
	cb->aio_nbytes = len;
	cb->aio_offset = (int64_t)off;
	return syscall(SYS_io_submit, ctx, 1L, &one) == 1 ? 0 : -1;
}

int main(int argc, char **argv)
{
	struct iocb cb[MAX_DEPTH];
	struct io_event ev[MAX_DEPTH];
	aio_context_t ctx = 0;
	struct stat st;
	size_t size, count = 200, n, next = 0, done = 0, *order = NULL;
	unsigned depth, inflight = 0;
	uint8_t *map, *buf;
	double t0, dt;
	int fd, rc = 1;

	if (argc < 4) {
		fprintf(stderr, "usage: aio_depth FILE SIZE_KIB DEPTH [COUNT]\n");
		return 2;
	}
	size = (size_t)strtoul(argv[2], NULL, 10) << 10;
	depth = (unsigned)strtoul(argv[3], NULL, 10);
	if (argc > 4)
		count = (size_t)strtoul(argv[4], NULL, 10);
	if (!size || size % 4096 || !depth || depth > MAX_DEPTH || !count) {
		fprintf(stderr, "aio_depth: SIZE a multiple of 4 KiB, DEPTH 1..%d\n", MAX_DEPTH);
		return 2;
	}
	fd = open(argv[1], O_RDONLY | O_DIRECT);
	if (fd < 0 || fstat(fd, &st) < 0) {
		fprintf(stderr, "aio_depth: %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	n = (size_t)st.st_size / size;
	if (n < count)
		count = n;
	if (!count) {
		fprintf(stderr, "aio_depth: %s: smaller than one piece\n", argv[1]);
		goto out;
	}
	order = malloc(n * sizeof(*order));
	map = mmap(NULL, (size_t)depth * size + ALIGN, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!order || map == MAP_FAILED) {
		fprintf(stderr, "aio_depth: out of memory\n");
		goto out;
	}
	buf = (uint8_t *)(((uintptr_t)map + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1));
	(void)madvise(buf, (size_t)depth * size, MADV_HUGEPAGE);
	memset(buf, 0, (size_t)depth * size); /* fault it in before the clock */
	srand(1);
	for (size_t i = 0; i < n; i++)
		order[i] = i;
	for (size_t i = n - 1; i > 0; i--) {
		size_t j = (size_t)rand() % (i + 1), t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
	if (syscall(SYS_io_setup, (long)depth, &ctx) < 0) {
		fprintf(stderr, "aio_depth: io_setup: %s\n", strerror(errno));
		goto out;
	}
	t0 = now();
	for (unsigned s = 0; s < depth && next < count; s++, next++, inflight++)
		if (submit(ctx, &cb[s], fd, buf + (size_t)s * size, size, order[next] * size, s) < 0)
			goto fail;
	while (inflight) {
		long k = syscall(SYS_io_getevents, ctx, 1L, (long)depth, ev, NULL);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			goto fail;
		for (long e = 0; e < k; e++) {
			unsigned s = (unsigned)ev[e].data;
			if (ev[e].res != (int64_t)size) {
				fprintf(stderr, "aio_depth: short read or error: %lld\n",
					(long long)ev[e].res);
				goto out;
			}
			inflight--;
			done++;
			if (next < count) {
				if (submit(ctx, &cb[s], fd, buf + (size_t)s * size, size,
					   order[next++] * size, s) < 0)
					goto fail;
				inflight++;
			}
		}
	}
	dt = now() - t0;
	printf("%zu KiB x %zu, %u in flight: %.2f GB/s\n", size >> 10, done, depth,
	       (double)done * (double)size / dt / 1e9);
	rc = 0;
	goto out;
fail:
	fprintf(stderr, "aio_depth: %s\n", strerror(errno));
out:
	if (ctx)
		(void)syscall(SYS_io_destroy, ctx);
	free(order);
	close(fd);
	return rc;
}
