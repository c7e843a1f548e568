/* SPDX-License-Identifier: MIT */
/*
 * fresh_mem.c - what first touches of memory cost on this machine.
 *
 * usage: fresh_mem GIB [ROUNDS]
 *
 * Each round maps GIB GiB of anonymous memory, writes one byte per 4 KiB
 * page (so the kernel allocates and zeroes every page) and unmaps it again,
 * printing the time and GB/s.  On bare metal every round runs at memory
 * speed.  On a VM whose host takes back memory the guest has freed
 * (virtio-balloon free page reporting), the pages of the first round after
 * the guest freed memory cost host page faults as well, and later rounds,
 * which get the pages the previous one freed, are faster.  See
 * Its figures are cited in docs/performance.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#include "benchclock.h"

int main(int argc, char **argv)
{
	double gib = argc > 1 ? atof(argv[1]) : 0;
	int rounds = argc > 2 ? atoi(argv[2]) : 3;
	size_t n = (size_t)(gib * (double)(1ull << 30));

	if (n < 4096 || rounds < 1) {
		fprintf(stderr, "usage: %s GIB [ROUNDS]\n", argv[0]);
		return 2;
	}
	for (int r = 0; r < rounds; r++) {
		volatile char *p = mmap(NULL, n, PROT_READ | PROT_WRITE,
					MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		double t, dt;

		if (p == MAP_FAILED) {
			perror("mmap");
			return 1;
		}
		t = now();
		for (size_t i = 0; i < n; i += 4096)
			p[i] = 1;
		dt = now() - t;
		printf("round %d: touched %.2f GiB in %.3f s, %.2f GB/s\n", r + 1, gib, dt,
		       (double)n / dt / 1e9);
		munmap((void *)p, n);
	}
	return 0;
}
