/* SPDX-License-Identifier: MIT */
/*
 * ckpt - offline and inspection commands for a ckptfs store.
 *
 *   ckpt stat STORE   usage summary (works while the store is mounted)
 *   ckpt fsck STORE   verify every chunk and reference; exit 1 on damage
 *   ckpt gc STORE     reclaim space held by unreferenced chunks
 *
 * Exit status: 0 success, 1 damage found / operation failed, 2 usage error.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store.h"
#include "util.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: ckpt COMMAND STORE\n"
		   "\n"
		   "commands:\n"
		   "  stat STORE   files, logical and stored bytes, dedup and compression ratios\n"
		   "  fsck STORE   read and verify every chunk and reference (store unmounted)\n"
		   "  gc STORE     reclaim space of unreferenced chunks (store unmounted)\n");
}

static double ratio(uint64_t a, uint64_t b)
{
	return b ? (double)a / (double)b : 1.0;
}

static int open_store(const char *path, enum ckpt_store_mode mode, ckpt_store **ret)
{
	struct ckpt_store_opts o;
	char err[512];
	int r;

	ckpt_store_opts_init(&o);
	o.mode = mode;
	o.cache_size = 0;
	/* A daemon that was just unmounted may still be flushing: give it a
	 * few seconds to let go of the store before calling it busy. */
	for (int tries = 0;; tries++) {
		r = ckpt_store_open(path, &o, ret, err, sizeof(err));
		if (r != -EBUSY || tries >= 30)
			break;
		usleep(100 * 1000);
	}
	if (r < 0) {
		if (r == -EBUSY)
			fprintf(stderr, "ckpt: %s: store is mounted or in use by another process; "
					"unmount it first\n", path);
		else
			fprintf(stderr, "ckpt: %s\n", err);
	}
	return r;
}

static int cmd_stat(const char *path)
{
	struct ckpt_store_stats st;
	ckpt_store *s;
	int r = open_store(path, CKPT_STORE_RO_SHARED, &s);

	if (r < 0)
		return 1;
	r = ckpt_store_stats(s, &st);
	ckpt_store_free(s);
	if (r < 0) {
		fprintf(stderr, "ckpt: %s: cannot read statistics: %s\n", path, strerror(-r));
		return 1;
	}
	printf("store: %s\n", path);
	printf("files: %" PRIu64 "\n", st.files);
	printf("directories: %" PRIu64 "\n", st.dirs);
	printf("symlinks: %" PRIu64 "\n", st.symlinks);
	printf("logical_bytes: %" PRIu64 "\n", st.logical_bytes);
	printf("unique_bytes: %" PRIu64 "\n", st.unique_bytes);
	printf("stored_bytes: %" PRIu64 "\n", st.stored_bytes);
	printf("chunks: %" PRIu64 "\n", st.chunks);
	printf("dedup_ratio: %.2f\n", ratio(st.logical_bytes, st.unique_bytes));
	printf("compression_ratio: %.2f\n", ratio(st.unique_bytes, st.stored_bytes));
	printf("total_ratio: %.2f\n", ratio(st.logical_bytes, st.stored_bytes));
	printf("unreferenced_chunks: %" PRIu64 "\n", st.dead_chunks);
	printf("unreferenced_bytes: %" PRIu64 "\n", st.dead_bytes);
	printf("pack_files: %" PRIu64 "\n", st.pack_files);
	printf("pack_bytes: %" PRIu64 "\n", st.pack_bytes);
	return 0;
}

static void fsck_report(void *ud, const char *path, const char *what)
{
	(void)ud;
	if (path)
		printf("damaged: %s: %s\n", path, what);
	else
		printf("problem: %s\n", what);
}

static int cmd_fsck(const char *path)
{
	ckpt_store *s;
	int r = open_store(path, CKPT_STORE_RO, &s);

	if (r < 0)
		return 1;
	r = ckpt_store_fsck(s, fsck_report, NULL);
	ckpt_store_free(s);
	if (r < 0) {
		fprintf(stderr, "ckpt: %s: fsck failed: %s\n", path, strerror(-r));
		return 1;
	}
	if (r > 0) {
		printf("%s: %d problem(s) found\n", path, r);
		return 1;
	}
	printf("%s: ok\n", path);
	return 0;
}

static int cmd_gc(const char *path)
{
	struct ckpt_gc_stats g;
	ckpt_store *s;
	int r = open_store(path, CKPT_STORE_RW, &s);

	if (r < 0)
		return 1;
	r = ckpt_store_gc(s, &g);
	ckpt_store_free(s);
	if (r < 0) {
		fprintf(stderr, "ckpt: %s: gc failed: %s (the store is unchanged or consistent; "
				"it is safe to run gc again)\n", path, strerror(-r));
		return 1;
	}
	printf("chunks_dropped: %" PRIu64 "\n", g.chunks_dropped);
	printf("bytes_dropped: %" PRIu64 "\n", g.bytes_dropped);
	printf("packs_rewritten: %" PRIu64 "\n", g.packs_rewritten);
	printf("packs_deleted: %" PRIu64 "\n", g.packs_deleted);
	printf("pack_bytes_before: %" PRIu64 "\n", g.bytes_before);
	printf("pack_bytes_after: %" PRIu64 "\n", g.bytes_after);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
		usage(stdout);
		return 0;
	}
	if (argc != 3) {
		usage(stderr);
		return 2;
	}
	ckpt_log_set_level(CKPT_LOG_ERR);
	if (!strcmp(argv[1], "stat"))
		return cmd_stat(argv[2]);
	if (!strcmp(argv[1], "fsck"))
		return cmd_fsck(argv[2]);
	if (!strcmp(argv[1], "gc"))
		return cmd_gc(argv[2]);
	fprintf(stderr, "ckpt: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
