/* SPDX-License-Identifier: MIT */
/*
 * ckpt_verify.c - `ckpt verify STORE`: read back every chunk, or a random
 * sample, or a byte budget's worth, while the store is mounted or not
 * (ckpt_store_verify in core/store/verify.c; docs/design.md section 9.1).
 *
 * The store is always opened CKPT_STORE_RO_SHARED (no lock, a read-only view
 * of the index), so verify runs beside a daemon, and beside nothing alike.
 *
 * The core logs every failed chunk read at error level on stderr.  In a
 * live store a failed read may be a chunk the daemon's compactor moved,
 * which verify reads again through a newer view and does not report; so
 * while chunks are read, stderr (fd 2) points at a scratch file and those
 * lines are kept back.  They are shown only when verify itself fails (an
 * error other than damage, which they may explain).  Damage verify
 * confirms is printed by verify, with the chunk, where it lies, the reason
 * and the files using it.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ckpt_cmd.h"

struct verify_ctx {
	FILE *err;    /* the real stderr while fd 2 is held back */
	ckpt_bar *bar;
};

static void verify_report(void *ud, const char *path, const char *what)
{
	struct verify_ctx *c = ud;

	if (c->bar) /* the report starts on a line of its own */
		fputs("\r\033[K", c->err);
	if (path)
		printf("damaged: %s: %s\n", path, what);
	else
		printf("problem: %s\n", what);
	fflush(stdout);
}

/* Point fd 2 at a scratch file; *ret_saved: the real stderr, as a new fd.
 * On failure nothing changes and *ret_saved is -1. */
static void hold_stderr(int *ret_saved, int *ret_scratch)
{
	int scratch = memfd_create("ckpt-verify-log", MFD_CLOEXEC), saved = -1;

	*ret_saved = *ret_scratch = -1;
	if (scratch < 0)
		return;
	fflush(stderr);
	saved = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
	if (saved < 0 || dup2(scratch, STDERR_FILENO) < 0) {
		if (saved >= 0)
			close(saved);
		close(scratch);
		return;
	}
	*ret_saved = saved;
	*ret_scratch = scratch;
}

/* Restore fd 2; with show, copy what was held back to it first. */
static void release_stderr(int saved, int scratch, bool show)
{
	char buf[4096];
	ssize_t n;
	off_t off = 0;

	if (saved < 0)
		return;
	fflush(stderr);
	dup2(saved, STDERR_FILENO);
	close(saved);
	while (show && (n = pread(scratch, buf, sizeof(buf), off)) > 0) {
		fwrite(buf, 1, (size_t)n, stderr);
		off += n;
	}
	close(scratch);
}

int cmd_verify(const char *store, struct ckpt_verify_opts *vo, enum ckpt_bar_mode progress)
{
	struct ckpt_verify_stats st;
	struct verify_ctx ctx = { stderr, NULL };
	struct ckpt_progress p;
	ckpt_store *s;
	int saved, scratch, r;

	if (open_store(store, CKPT_STORE_RO_SHARED, &s) < 0)
		return 1;
	hold_stderr(&saved, &scratch);
	if (saved >= 0) { /* the bar's stream: a copy of the real stderr */
		int fd = fcntl(saved, F_DUPFD_CLOEXEC, 3);

		ctx.err = fd >= 0 ? fdopen(fd, "w") : NULL;
		if (!ctx.err) {
			if (fd >= 0)
				close(fd);
			release_stderr(saved, scratch, false);
			saved = -1;
			ctx.err = stderr;
		}
	}
	ctx.bar = ckpt_bar_new("verify", progress, 0, ctx.err);
	ckpt_bar_callback(ctx.bar, &p);
	vo->progress = &p;
	r = ckpt_store_verify(s, vo, verify_report, &ctx, &st);
	ckpt_bar_finish(ctx.bar);
	if (ctx.err != stderr)
		fclose(ctx.err);
	release_stderr(saved, scratch, r < 0);
	ckpt_store_free(s);
	if (r < 0) {
		fprintf(stderr, "ckpt: %s: verify failed: %s\n", store, strerror(-r));
		return 1;
	}
	printf("store: %s\n", store);
	printf("chunks: %" PRIu64 "\n", st.chunks);
	printf("stored_bytes: %" PRIu64 "\n", st.bytes);
	printf("selected_chunks: %" PRIu64 "\n", st.selected);
	printf("selected_bytes: %" PRIu64 "\n", st.selected_bytes);
	printf("checked_chunks: %" PRIu64 "\n", st.checked);
	printf("checked_bytes: %" PRIu64 "\n", st.checked_bytes);
	printf("checked_raw_bytes: %" PRIu64 "\n", st.raw_bytes);
	printf("damaged_chunks: %" PRIu64 "\n", st.damaged);
	printf("moved_chunks: %" PRIu64 "\n", st.moved);
	printf("vanished_chunks: %" PRIu64 "\n", st.vanished);
	printf("unsettled_chunks: %" PRIu64 "\n", st.unsettled);
	if (st.damaged)
		printf("%s: %" PRIu64 " damaged chunk(s)\n", store, st.damaged);
	if (st.unsettled)
		printf("%s: %" PRIu64 " chunk(s) kept moving while read and were not verified; "
		       "run verify again\n", store, st.unsettled);
	if (r > 0)
		return 1;
	printf("%s: ok\n", store);
	return 0;
}
