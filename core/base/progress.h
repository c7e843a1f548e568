/* SPDX-License-Identifier: MIT */
/*
 * progress.h - how a long core operation (fsck, gc, verify) tells its
 * caller how far it has come: a callback the caller passes in.  Core code
 * never prints progress; the caller decides what to show (tools/progress.h
 * draws a bar on a terminal).
 *
 * fn(ud, done, total) is called from the thread running the operation,
 * with done <= total, both in the unit the operation documents (bytes for
 * every operation of core/store), done never decreasing between calls of one
 * phase, and once with done == total when the work is complete.  total may
 * grow between calls (work found on the way).  It must return quickly: the
 * operation calls it as often as once per chunk, and the callee rate-limits
 * any output itself.
 */
#ifndef CKPT_PROGRESS_H
#define CKPT_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

struct ckpt_progress {
	void (*fn)(void *ud, uint64_t done, uint64_t total);
	void *ud;
};

/* Report through p (NULL or p->fn NULL: nothing). */
static inline void ckpt_progress_report(const struct ckpt_progress *p, uint64_t done,
					uint64_t total)
{
	if (p && p->fn)
		p->fn(p->ud, done > total ? total : done, total);
}

#endif
