/* SPDX-License-Identifier: MIT */
/*
 * progress.c - ckpt's progress bar (progress.h).
 */
#include "progress.h"

#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define REDRAW_NS (100 * 1000 * 1000ll) /* at most 10 redraws a second */
#define LINE_MAX_COLS 512

struct ckpt_bar {
	char *label;
	FILE *out;
	uint64_t done, total;
	int64_t start_ns, last_ns; /* monotonic: creation, last redraw */
	bool drawn;
};

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static int term_width(FILE *f)
{
	struct winsize ws;

	if (ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
		return ws.ws_col < LINE_MAX_COLS ? ws.ws_col : LINE_MAX_COLS - 1;
	return 80;
}

/* n bytes in at most 9 columns: "1023 B", "1.50 KiB", "12.3 GiB". */
static void human(char *buf, size_t len, double n)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	unsigned u = 0;

	while (n >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
		n /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%.0f %s", n, units[u]);
	else
		snprintf(buf, len, n < 10 ? "%.2f %s" : n < 100 ? "%.1f %s" : "%.0f %s", n, units[u]);
}

static void clock_str(char *buf, size_t len, double secs)
{
	uint64_t s = secs < 0 ? 0 : (uint64_t)(secs + 0.5);

	if (s >= 3600)
		snprintf(buf, len, "%llu:%02llu:%02llu", (unsigned long long)(s / 3600),
			 (unsigned long long)(s / 60 % 60), (unsigned long long)(s % 60));
	else
		snprintf(buf, len, "%llu:%02llu", (unsigned long long)(s / 60),
			 (unsigned long long)(s % 60));
}

void ckpt_bar_render(char *buf, size_t len, const char *label, uint64_t done, uint64_t total,
		     int64_t elapsed_ns, int width)
{
	char d[16], t[16], rate[24] = "", eta[24] = "", tail[128], bar[LINE_MAX_COLS];
	double secs = (double)elapsed_ns / 1e9, frac;
	int pct, cols;

	if (done > total)
		total = done;
	frac = total ? (double)done / (double)total : 1.0;
	pct = (int)(frac * 100.0);
	human(d, sizeof(d), (double)done);
	human(t, sizeof(t), (double)total);
	if (secs > 0.2 && done > 0) {
		double bps = (double)done / secs;

		human(rate, sizeof(rate) - 2, bps);
		strcat(rate, "/s");
		if (done < total) {
			clock_str(eta + 4, sizeof(eta) - 4, (double)(total - done) / bps);
			memcpy(eta, "ETA ", 4);
		} else {
			clock_str(eta, sizeof(eta), secs);
		}
	}
	snprintf(tail, sizeof(tail), "  %s / %s  %3d%%%s%s%s%s", d, t, pct, rate[0] ? "  " : "",
		 rate, eta[0] ? "  " : "", eta);
	if (width > LINE_MAX_COLS - 1)
		width = LINE_MAX_COLS - 1;
	/* the bar takes what the label and the figures leave, 10 to 40 columns */
	cols = width - (int)strlen(label) - (int)strlen(tail) - 4;
	if (cols > 40)
		cols = 40;
	if (cols >= 10) {
		int fill = (int)(frac * cols);

		for (int i = 0; i < cols; i++)
			bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
		if (fill >= cols)
			bar[cols - 1] = '=';
		bar[cols] = '\0';
		snprintf(buf, len, "%s  [%s]%s", label, bar, tail);
	} else {
		snprintf(buf, len, "%s%s", label, tail);
	}
	if ((int)strlen(buf) > width && width > 0 && (size_t)width < len)
		buf[width] = '\0';
}

ckpt_bar *ckpt_bar_new(const char *label, enum ckpt_bar_mode mode, uint64_t total, FILE *out)
{
	ckpt_bar *b;

	if (mode == CKPT_BAR_OFF || (mode == CKPT_BAR_AUTO && !isatty(fileno(out))))
		return NULL;
	b = calloc(1, sizeof(*b));
	if (!b || !(b->label = strdup(label))) {
		free(b);
		return NULL;
	}
	b->out = out;
	b->total = total;
	b->start_ns = mono_ns();
	return b;
}

static void draw(ckpt_bar *b, int64_t now)
{
	char line[LINE_MAX_COLS + 8];

	ckpt_bar_render(line, sizeof(line), b->label, b->done, b->total, now - b->start_ns,
			term_width(b->out) - 1);
	/* \033[K clears what a longer earlier line left */
	fprintf(b->out, "\r%s\033[K", line);
	fflush(b->out);
	b->last_ns = now;
	b->drawn = true;
}

void ckpt_bar_set(ckpt_bar *b, uint64_t done, uint64_t total)
{
	int64_t now;

	if (!b)
		return;
	if (total)
		b->total = total;
	b->done = done;
	now = mono_ns();
	if (!b->drawn || now - b->last_ns >= REDRAW_NS)
		draw(b, now);
}

void ckpt_bar_add(ckpt_bar *b, uint64_t n)
{
	if (b)
		ckpt_bar_set(b, b->done + n, 0);
}

void ckpt_bar_grow(ckpt_bar *b, uint64_t n)
{
	if (b)
		b->total += n;
}

void ckpt_bar_finish(ckpt_bar *b)
{
	if (!b)
		return;
	draw(b, mono_ns());
	fputc('\n', b->out);
	fflush(b->out);
	free(b->label);
	free(b);
}

static void bar_cb(void *ud, uint64_t done, uint64_t total)
{
	ckpt_bar *b = ud;

	b->total = total; /* may be 0: nothing to do is done */
	ckpt_bar_set(b, done, 0);
}

void ckpt_bar_callback(ckpt_bar *b, struct ckpt_progress *p)
{
	p->fn = b ? bar_cb : NULL;
	p->ud = b;
}
