/* SPDX-License-Identifier: MIT */
/*
 * fence_cost - what do a node's session and the gc fence (docs/cluster.md
 * section 7) cost a content commit on PostgreSQL, and what does a
 * heartbeat cost?
 *
 * usage: tools/bench/probes/fence_cost DIR FILES CONNINFO... (run by
 *        fence_cost.py, which starts a server and makes the databases)
 *
 * One store per CONNINFO (a new database each), in DIR/sN, opened
 * alternately as a node (a session, a heartbeat thread, the fence read in
 * every content commit) and as a plain read-write store on the same
 * engine (none of these).  In each, FILES files get one new 4 KiB chunk
 * each and a durable content commit (an fsync's commit); the commits are
 * timed.  In node mode the heartbeat is then timed 50 times.  Prints per
 * run and the medians: durable commits per second of each mode, their
 * ratio, and the median milliseconds of one heartbeat.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/util.h"
#include "store/store.h"

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int dcmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), dcmp);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One run: commits per second, and in node mode *ret_beat_ms. */
static double run(const char *path, const char *where, bool node, int files, double *ret_beat_ms)
{
	struct ckpt_store_opts o;
	ckpt_store *s = NULL;
	char err[512], name[32];
	uint8_t buf[4096];
	uint64_t seed = (uint64_t)time(NULL) * 2 + node;
	uint64_t *inos = calloc((size_t)files, sizeof(*inos));
	ckpt_digest *ds = calloc((size_t)files, sizeof(*ds));
	double t0, t, beats[50];

	ckpt_store_opts_init(&o);
	o.mode = CKPT_STORE_RW;
	o.create = true;
	o.meta_engine = "postgresql";
	o.meta_where = where;
	o.node = node;
	if (!inos || !ds || ckpt_store_open(path, &o, &s, err, sizeof(err)) < 0) {
		fprintf(stderr, "fence_cost: %s\n", inos && ds ? err : "out of memory");
		exit(1);
	}
	for (int i = 0; i < files; i++) {
		struct ckpt_inode in;

		snprintf(name, sizeof(name), "f%d", i);
		for (size_t k = 0; k < sizeof(buf); k += 8) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			memcpy(buf + k, &seed, 8);
		}
		if (ckpt_store_mknode(s, CKPT_ROOT_INO, name, S_IFREG | 0644, 0, 0, NULL, &in) < 0 ||
		    ckpt_store_put_chunk(s, buf, sizeof(buf), 0, &ds[i]) < 0) {
			fprintf(stderr, "fence_cost: cannot make %s\n", name);
			exit(1);
		}
		inos[i] = in.ino;
	}
	t0 = now_s();
	for (int i = 0; i < files; i++) {
		struct ckpt_extent_list *l = ckpt_extent_list_new();
		int r;

		if (!l || ckpt_extent_list_append(l, sizeof(buf), CKPT_EXT_CHUNK, &ds[i]) < 0)
			exit(1);
		r = ckpt_store_commit_file(s, inos[i], l, 0, ckpt_now_ns(), true);
		ckpt_extent_list_free(l);
		if (r < 0) {
			fprintf(stderr, "fence_cost: commit: %s\n", strerror(-r));
			exit(1);
		}
	}
	t = now_s() - t0;
	if (node) {
		for (int i = 0; i < 50; i++) {
			double b0 = now_s();
			if (ckpt_store_heartbeat(s) < 0) {
				fprintf(stderr, "fence_cost: heartbeat failed\n");
				exit(1);
			}
			beats[i] = (now_s() - b0) * 1e3;
		}
		*ret_beat_ms = median(beats, 50);
	}
	ckpt_store_free(s);
	free(inos);
	free(ds);
	return files / t;
}

int main(int argc, char **argv)
{
	double plain[64], nodes[64], beat[64];
	int np = 0, nn = 0, files;

	if (argc < 4 || argc - 3 > 64 || (files = atoi(argv[2])) < 1) {
		fprintf(stderr, "usage: %s DIR FILES CONNINFO...\n", argv[0]);
		return 2;
	}
	for (int i = 3; i < argc; i++) {
		bool node = (i - 3) % 2 == 1; /* alternate: plain, node, plain, ... */
		char path[4096];
		double b = 0, rate;

		snprintf(path, sizeof(path), "%s/s%d", argv[1], i - 3);
		rate = run(path, argv[i], node, files, &b);
		printf("run %d %-5s %8.1f durable commits/s%s", i - 3, node ? "node" : "plain", rate,
		       node ? "" : "\n");
		if (node) {
			printf("  heartbeat %.3f ms\n", b);
			beat[nn] = b;
			nodes[nn++] = rate;
		} else {
			plain[np++] = rate;
		}
		fflush(stdout);
	}
	if (np && nn) {
		double p = median(plain, np), n = median(nodes, nn);
		printf("median: plain %.1f, node %.1f durable commits/s (node/plain %.3f); "
		       "heartbeat %.3f ms\n", p, n, n / p, median(beat, nn));
	}
	return 0;
}
