/* SPDX-License-Identifier: MIT */
/*
 * progress.h - the progress bar of ckpt's long commands (fsck, gc, export,
 * verify), drawn on stderr like restic's and borg's --progress:
 *
 *   verify  [=========>          ]  1.20 GiB / 2.50 GiB  48%  310 MiB/s  ETA 0:04
 *
 * Shown only when stderr is a terminal (CKPT_BAR_AUTO), or always or never
 * when forced (--progress / --no-progress).  Redrawn at most 10 times a
 * second, on one line (carriage return), cut to the terminal's width; the
 * last state stays on screen with a newline when the bar ends.  A bar that
 * is not shown is a NULL pointer, which every function accepts.
 *
 * Thread-safety: one bar belongs to one thread.
 */
#ifndef CKPT_TOOLS_PROGRESS_H
#define CKPT_TOOLS_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/progress.h"

enum ckpt_bar_mode {
	CKPT_BAR_AUTO, /* shown when stderr is a terminal */
	CKPT_BAR_ON,   /* --progress */
	CKPT_BAR_OFF,  /* --no-progress */
};

typedef struct ckpt_bar ckpt_bar;

/* A bar labelled label (copied) for total bytes (may be raised later),
 * drawn on out (stderr, or a stream on the same terminal), or NULL when it
 * is not to be shown (mode, or out of memory). */
ckpt_bar *ckpt_bar_new(const char *label, enum ckpt_bar_mode mode, uint64_t total, FILE *out);
/* done bytes of total (total 0: keep the current total). */
void ckpt_bar_set(ckpt_bar *b, uint64_t done, uint64_t total);
void ckpt_bar_add(ckpt_bar *b, uint64_t n);
/* Raise the total by n bytes (work found on the way). */
void ckpt_bar_grow(ckpt_bar *b, uint64_t n);
/* Draw the final state and end the line; then free.  Accepts NULL. */
void ckpt_bar_finish(ckpt_bar *b);
/* The bar as a core progress callback (base/progress.h); p->fn is NULL
 * for a NULL bar. */
void ckpt_bar_callback(ckpt_bar *b, struct ckpt_progress *p);

/* Render into buf (for tests and the bar itself): the line for done of
 * total after elapsed_ns, at most width columns. */
void ckpt_bar_render(char *buf, size_t len, const char *label, uint64_t done, uint64_t total,
		     int64_t elapsed_ns, int width);

#endif
