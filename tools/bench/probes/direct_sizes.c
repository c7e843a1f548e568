/* SPDX-License-Identifier: MIT */
/*
 * direct_sizes.c - how fast this disk serves O_DIRECT reads of a file by
 * request size, into 4 KiB pages or into huge pages.
 *
 * usage: direct_sizes FILE SIZE HUGE STREAMS [random]
 *
 * STREAMS threads read contiguous parts of FILE with O_DIRECT preads of SIZE
 * (MiB, or KiB with a K suffix: 512K) each into one buffer per thread,
 * aligned to 2 MiB and advised MADV_HUGEPAGE (HUGE 1) or MADV_NOHUGEPAGE
 * (HUGE 0).  With "random" each thread reads as many bytes at offsets (a
 * multiple of SIZE) drawn at random over the whole file, as read-ahead of
 * a view does in a pack whose records follow the save's order, not the
 * view's (docs/performance.md).  Prints GB/s and the
 * process's AnonHugePages while the buffers are mapped (to show whether huge
 * pages were used).  Drop the
 * page cache first (echo 3 > /proc/sys/vm/drop_caches).  An O_DIRECT read
 * into 4 KiB pages becomes requests of at most max_segments pages (254 on
 * a virtio disk, about 1 MiB); into huge pages it can go out in requests
 * of max_sectors_kb.  See docs/performance.md.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "benchclock.h"

#define ALIGN (2ul << 20)

static const char *path;
static size_t req;
static int huge;
static int nstreams;
static int rnd;
static off_t fsize;
static long anon_huge_kb = -1; /* AnonHugePages seen by stream 0 before it unmaps */

static long read_anon_huge_kb(void)
{
	char line[256];
	long kb = -1;
	FILE *f = fopen("/proc/self/smaps_rollup", "r");

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "AnonHugePages:", 14))
			kb = atol(line + 14);
	if (f)
		fclose(f);
	return kb;
}

static void *stream(void *arg)
{
	long id = (long)arg;
	off_t per = ((fsize / nstreams) + (off_t)req - 1) / (off_t)req * (off_t)req;
	off_t off = id * per, end = off + per;
	/* whole huge pages, also for requests under 2 MiB (as the store's
	 * per-thread record buffer) */
	size_t maplen = (req + ALIGN - 1) / ALIGN * ALIGN;
	uint8_t *map, *buf;
	int fd;

	map = mmap(NULL, maplen + ALIGN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
		   0);
	if (map == MAP_FAILED)
		return (void *)1;
	buf = (uint8_t *)(((uintptr_t)map + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1));
	(void)madvise(buf, maplen, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	memset(buf, 1, req);
	fd = open(path, O_RDONLY | O_DIRECT);
	if (fd < 0) {
		munmap(map, maplen + ALIGN);
		return (void *)1;
	}
	if (end > fsize)
		end = fsize;
	if (rnd) {
		unsigned seed = (unsigned)id * 7919u + 1u;
		off_t slots = fsize / (off_t)req;

		for (; off < end && slots > 0; off += (off_t)req)
			if (pread(fd, buf, req, (off_t)(rand_r(&seed) % slots) * (off_t)req) <= 0)
				break;
	} else {
		for (; off < end; off += (off_t)req)
			if (pread(fd, buf, req, off) <= 0)
				break;
	}
	close(fd);
	if (id == 0)
		anon_huge_kb = read_anon_huge_kb();
	munmap(map, maplen + ALIGN);
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t t[64];
	double t0, dt;
	int fd, ok = 1;

	char *unit = NULL;
	long size = argc >= 3 ? strtol(argv[2], &unit, 10) : 0;

	if ((argc != 5 && !(argc == 6 && !strcmp(argv[5], "random"))) || size <= 0 ||
	    (*unit && strcmp(unit, "K") && strcmp(unit, "k")) || atoi(argv[4]) <= 0 ||
	    atoi(argv[4]) > 64) {
		fprintf(stderr, "usage: direct_sizes FILE SIZE(MiB, or KiB as 512K) HUGE(0|1) "
				"STREAMS(1-64) [random]\n");
		return 2;
	}
	path = argv[1];
	req = (size_t)size << (*unit ? 10 : 20);
	rnd = argc == 6;
	if (req % 4096) {
		fprintf(stderr, "direct_sizes: SIZE must be a multiple of 4 KiB\n");
		return 2;
	}
	huge = atoi(argv[3]) != 0;
	nstreams = atoi(argv[4]);
	fd = open(path, O_RDONLY);
	if (fd < 0) {
		perror(path);
		return 1;
	}
	fsize = lseek(fd, 0, SEEK_END);
	close(fd);
	t0 = now();
	for (long i = 0; i < nstreams; i++)
		pthread_create(&t[i], NULL, stream, (void *)i);
	for (int i = 0; i < nstreams; i++) {
		void *r;
		pthread_join(t[i], &r);
		ok &= r == NULL;
	}
	dt = now() - t0;
	printf("%s: %zu KiB requests%s, %s pages, %d streams: %.2f GB/s (AnonHugePages %ld kB)%s\n",
	       path, req >> 10, rnd ? " at random offsets" : "", huge ? "huge" : "4 KiB", nstreams,
	       (double)fsize / dt / 1e9, anon_huge_kb, ok ? "" : ", some reads failed");
	return ok ? 0 : 1;
}
