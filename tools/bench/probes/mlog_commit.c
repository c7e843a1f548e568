/* SPDX-License-Identifier: MIT */
/*
 * mlog_commit - what does the metadata log add to one commit of the index?
 *
 * usage: tools/bench/probes/mlog_commit DIR [COMMITS] [ROUNDS]
 *
 * Opens a RocksDB engine in DIR/ix twice per round, without and with a
 * metadata log (DIR/metalog), and times COMMITS (default 100000)
 * transactions of the shape of a namespace change: a read for update of
 * one key and three puts (an inode of 80 bytes, a dentry of 16, a parent
 * inode of 80), committed not durably, on one thread.  Prints per round
 * and as the median of ROUNDS (default 5) the microseconds of wall and CPU
 * time per commit of each, and the log's bytes per commit.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/util.h"
#include "meta/engine.h"

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static void rm_rf(const char *dir) /* dir: at most 4095 bytes */
{
	char cmd[4096 + 16];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "mlog_commit: cannot remove %s\n", dir);
}

static uint64_t dir_bytes(const char *dir)
{
	char p[4096 + 260];
	struct dirent *de;
	struct stat st;
	uint64_t n = 0;
	DIR *d = opendir(dir);

	if (!d)
		return 0;
	while ((de = readdir(d))) {
		snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
		if (stat(p, &st) == 0 && S_ISREG(st.st_mode))
			n += (uint64_t)st.st_size;
	}
	closedir(d);
	return n;
}

/* Microseconds of wall and CPU time per commit; *ret_log: log bytes. */
static int run(const char *base, bool with_log, long commits, double *ret_wall, double *ret_cpu,
	       uint64_t *ret_log)
{
	char ix[4000], lg[4000], err[512] = "";
	struct ckpt_engine_opts o = { .create = true };
	uint8_t key[32], val[80];
	ckpt_engine *e = NULL;
	double w0, c0;
	int r;

	snprintf(ix, sizeof(ix), "%s/ix", base);
	snprintf(lg, sizeof(lg), "%s/metalog", base);
	rm_rf(ix);
	rm_rf(lg);
	o.log_dir = with_log ? lg : NULL;
	r = ckpt_engine_open(NULL, ix, &o, &e, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "mlog_commit: %s\n", err);
		return r;
	}
	memset(val, 0xab, sizeof(val));
	w0 = now_s();
	c0 = cpu_s();
	for (long i = 0; i < commits; i++) {
		ckpt_txn *t;
		uint8_t *v = NULL;
		size_t vl = 0;

		r = ckpt_txn_begin(e, &t);
		if (r < 0)
			break;
		key[0] = 'I';
		ckpt_put_be64(key + 1, 1);
		(void)ckpt_txn_get(t, key, 9, CKPT_TXN_FOR_UPDATE, &v, &vl);
		free(v);
		ckpt_txn_put(t, key, 9, val, 80);
		ckpt_put_be64(key + 1, (uint64_t)i + 2);
		ckpt_txn_put(t, key, 9, val, 80);
		key[0] = 'D';
		ckpt_put_be64(key + 1, 1);
		memcpy(key + 9, "name-of-a-file", 14);
		ckpt_put_be64(key + 23 - 8, (uint64_t)i);
		ckpt_txn_put(t, key, 23, val, 16);
		r = ckpt_txn_commit(t, false);
		if (r < 0)
			break;
	}
	*ret_wall = (now_s() - w0) / (double)commits * 1e6;
	*ret_cpu = (cpu_s() - c0) / (double)commits * 1e6;
	ckpt_engine_close(e);
	*ret_log = with_log ? dir_bytes(lg) : 0;
	if (r < 0)
		fprintf(stderr, "mlog_commit: commit failed: %s\n", strerror(-r));
	return r;
}

static int dcmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	long commits = argc > 2 ? atol(argv[2]) : 100000;
	int rounds = argc > 3 ? atoi(argv[3]) : 5;
	double w[2][64], c[2][64];
	uint64_t logb = 0;

	if (argc < 2 || commits <= 0 || rounds <= 0 || rounds > 64) {
		fprintf(stderr, "usage: %s DIR [COMMITS] [ROUNDS]\n", argv[0]);
		return 2;
	}
	if (mkdir(argv[1], 0755) < 0 && errno != EEXIST) {
		perror(argv[1]);
		return 1;
	}
	ckpt_log_set_level(CKPT_LOG_ERR);
	for (int r = 0; r < rounds; r++)
		for (int k = 0; k < 2; k++) {
			if (run(argv[1], k == 1, commits, &w[k][r], &c[k][r], &logb) < 0)
				return 1;
			printf("round %d %-8s %.2f us wall, %.2f us CPU per commit\n", r + 1,
			       k ? "log" : "no log", w[k][r], c[k][r]);
		}
	for (int k = 0; k < 2; k++) {
		qsort(w[k], (size_t)rounds, sizeof(double), dcmp);
		qsort(c[k], (size_t)rounds, sizeof(double), dcmp);
	}
	printf("median of %d rounds of %ld commits: no log %.2f us wall, %.2f us CPU; log %.2f us "
	       "wall, %.2f us CPU; %.0f log bytes per commit\n",
	       rounds, commits, w[0][rounds / 2], c[0][rounds / 2], w[1][rounds / 2],
	       c[1][rounds / 2], (double)logb / (double)commits);
	rm_rf(argv[1]);
	return 0;
}
