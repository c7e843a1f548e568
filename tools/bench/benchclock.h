/* SPDX-License-Identifier: MIT */
/*
 * benchclock.h - the clock of the C measurement tools in tools/bench/.
 */
#ifndef CKPT_BENCHCLOCK_H
#define CKPT_BENCHCLOCK_H

#include <time.h>

/* Seconds on CLOCK_MONOTONIC. */
static inline double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

#endif
