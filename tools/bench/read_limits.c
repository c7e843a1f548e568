/* SPDX-License-Identifier: MIT */
/*
 * read_limits - CPU cost of every step of ckptfs's chunk read path, measured
 * on the chunks of a real store (the measurement behind docs/performance.md
 * section 6, "Limits of this machine").
 *
 * Loads every record of every pack of STORE into memory (so no disk I/O is
 * timed), then runs each step over all of them with 1 and 2 threads (each
 * thread takes every n-th record) and reports GB/s of raw (decompressed)
 * bytes:
 *
 *   pack-csum   XXH3-64 of the stored bytes (the pack record checksum)
 *   zstd        ZSTD_decompressDCtx with the frame checksum verified
 *   zstd-nocsum the same with ZSTD_d_forceIgnoreChecksum
 *   unshuffle   byte unshuffle of the raw bytes (shuffled codecs only)
 *   digest      keyed XXH3-128 of the raw bytes (the chunk digest)
 *   memcpy      copying the raw bytes once
 *   full-old    ckpt_decompress + pack-csum + digest (the read path before)
 *   full-new    zstd-nocsum + unshuffle + pack-csum + digest
 *
 * usage: read_limits STORE [seconds per measurement, default 1]
 */
#define ZSTD_STATIC_LINKING_ONLY
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include "chunk/compress.h"
#include "base/hash.h"
#include "chunk/pack.h"
#include "benchclock.h"

struct rec {
	uint8_t codec;
	uint32_t stored_len, raw_len;
	uint8_t *stored;
};

static struct rec *recs;
static size_t nrecs, caprecs;
static uint64_t raw_total, stored_total;
static double seconds = 1.0;
static ckpt_hasher *hasher;

struct scan_ctx {
	ckpt_pack *p;
	int err;
};

static int on_rec(void *ud, uint64_t offset, const struct ckpt_pack_rec *rec)
{
	struct scan_ctx *c = ud;
	struct rec *r;

	if (nrecs == caprecs) {
		caprecs = caprecs ? 2 * caprecs : 1024;
		recs = realloc(recs, caprecs * sizeof(*recs));
		if (!recs)
			return -ENOMEM;
	}
	r = &recs[nrecs];
	r->codec = rec->codec;
	r->stored_len = rec->stored_len;
	r->raw_len = rec->raw_len;
	r->stored = malloc(rec->stored_len ? rec->stored_len : 1);
	if (!r->stored)
		return -ENOMEM;
	c->err = ckpt_pack_read(c->p, offset, rec->stored_len, NULL, r->stored);
	if (c->err < 0) {
		free(r->stored);
		return 0; /* skip damaged records */
	}
	nrecs++;
	raw_total += rec->raw_len;
	stored_total += rec->stored_len;
	return 0;
}

static int load_store(const char *store)
{
	char path[4096];
	DIR *d;
	struct dirent *de;
	int dfd;

	snprintf(path, sizeof(path), "%s/packs", store);
	dfd = open(path, O_RDONLY | O_DIRECTORY);
	d = dfd >= 0 ? fdopendir(dup(dfd)) : NULL;
	if (!d) {
		fprintf(stderr, "read_limits: %s: %s\n", path, strerror(errno));
		return -1;
	}
	while ((de = readdir(d))) {
		uint64_t id;
		uint8_t hdr[64];
		struct scan_ctx c = { 0 };
		int fd;

		if (sscanf(de->d_name, "pack-%" SCNx64 ".ckpk", &id) != 1)
			continue;
		fd = openat(dfd, de->d_name, O_RDONLY);
		if (fd < 0 || pread(fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr)) {
			if (fd >= 0)
				close(fd);
			continue;
		}
		close(fd);
		if (ckpt_pack_open(dfd, id, hdr + 24, false, &c.p) < 0)
			continue;
		ckpt_pack_scan(c.p, on_rec, &c);
		ckpt_pack_free(c.p);
	}
	closedir(d);
	close(dfd);
	return 0;
}

enum step { PACK_CSUM, ZSTD, ZSTD_NOCSUM, UNSHUFFLE, DIGEST, MEMCPY, FULL_OLD, FULL_NEW, NSTEPS };
static const char *const step_names[] = { "pack-csum", "zstd", "zstd-nocsum", "unshuffle",
					  "digest", "memcpy", "full-old", "full-new" };

struct worker {
	pthread_t t;
	enum step step;
	unsigned idx, n;
	double t_end;
	uint64_t bytes;
	int err;
};

static void *work(void *arg)
{
	struct worker *w = arg;
	ckpt_decompressor *dc = NULL;
	ZSTD_DCtx *zc = ZSTD_createDCtx(), *zn = ZSTD_createDCtx();
	uint8_t *a = malloc(CKPT_PACK_MAX_STORED), *b = malloc(CKPT_PACK_MAX_STORED);
	ckpt_digest dg;
	volatile uint64_t sink = 0;

	if (ckpt_decompressor_new(&dc) < 0 || !zc || !zn || !a || !b) {
		w->err = -ENOMEM;
		return NULL;
	}
	ZSTD_DCtx_setParameter(zn, ZSTD_d_forceIgnoreChecksum, ZSTD_d_ignoreChecksum);
	while (now() < w->t_end) {
		for (size_t i = w->idx; i < nrecs; i += w->n) {
			const struct rec *r = &recs[i];
			unsigned e = r->codec == CKPT_CODEC_ZSTD_SHUF2 ? 2 :
				     r->codec == CKPT_CODEC_ZSTD_SHUF4 ? 4 : 1;
			bool z = r->codec != CKPT_CODEC_RAW;

			switch (w->step) {
			case PACK_CSUM:
				sink += XXH3_64bits(r->stored, r->stored_len);
				break;
			case ZSTD:
				if (z)
					ZSTD_decompressDCtx(zc, a, r->raw_len, r->stored, r->stored_len);
				break;
			case ZSTD_NOCSUM:
				if (z)
					ZSTD_decompressDCtx(zn, a, r->raw_len, r->stored, r->stored_len);
				break;
			case UNSHUFFLE:
				if (e > 1)
					ckpt_unshuffle(r->stored, a, r->stored_len, e);
				break;
			case DIGEST:
				ckpt_hash_chunk(hasher, r->stored, r->stored_len, &dg);
				sink += dg.bytes[0];
				break;
			case MEMCPY:
				memcpy(a, r->stored, r->stored_len);
				break;
			case FULL_OLD:
				sink += XXH3_64bits(r->stored, r->stored_len);
				if (ckpt_decompress(dc, r->codec, r->stored, r->stored_len, a,
						    r->raw_len) < 0)
					w->err = -EIO;
				ckpt_hash_chunk(hasher, a, r->raw_len, &dg);
				break;
			case FULL_NEW:
				sink += XXH3_64bits(r->stored, r->stored_len);
				if (z) {
					ZSTD_decompressDCtx(zn, e > 1 ? b : a, r->raw_len, r->stored,
							    r->stored_len);
					if (e > 1)
						ckpt_unshuffle(b, a, r->raw_len, e);
				} else {
					memcpy(a, r->stored, r->raw_len);
				}
				ckpt_hash_chunk(hasher, a, r->raw_len, &dg);
				break;
			default:
				break;
			}
			/* steps that touch stored bytes only count them; the
			 * others count raw bytes */
			w->bytes += (w->step == PACK_CSUM || w->step == UNSHUFFLE ||
				     w->step == DIGEST || w->step == MEMCPY) ?
					    (w->step == UNSHUFFLE && e == 1 ? 0 : r->stored_len) :
					    r->raw_len;
		}
	}
	(void)sink;
	ckpt_decompressor_free(dc);
	ZSTD_freeDCtx(zc);
	ZSTD_freeDCtx(zn);
	free(a);
	free(b);
	return NULL;
}

static double run(enum step s, unsigned nthreads)
{
	struct worker w[16];
	double t0 = now(), dt;
	uint64_t bytes = 0;

	for (unsigned i = 0; i < nthreads; i++) {
		memset(&w[i], 0, sizeof(w[i]));
		w[i].step = s;
		w[i].idx = i;
		w[i].n = nthreads;
		w[i].t_end = t0 + seconds;
		pthread_create(&w[i].t, NULL, work, &w[i]);
	}
	for (unsigned i = 0; i < nthreads; i++) {
		pthread_join(w[i].t, NULL);
		bytes += w[i].bytes;
	}
	dt = now() - t0;
	return (double)bytes / dt / 1e9;
}

int main(int argc, char **argv)
{
	uint8_t secret[CKPT_SECRET_LEN];
	uint64_t nshuf = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: read_limits STORE [seconds]\n");
		return 2;
	}
	if (argc > 2)
		seconds = atof(argv[2]);
	if (load_store(argv[1]) < 0)
		return 1;
	ckpt_secret_generate(secret, sizeof(secret));
	ckpt_hasher_new(secret, sizeof(secret), &hasher);
	/* "unshuffle", "digest", "memcpy" and "pack-csum" run over stored
	 * buffers for simplicity: their cost is per byte, not per content. */
	for (size_t i = 0; i < nrecs; i++)
		nshuf += recs[i].codec >= CKPT_CODEC_ZSTD_SHUF2;
	printf("%zu records, %.1f MB raw, %.1f MB stored (%.2fx), %" PRIu64 " shuffled\n", nrecs,
	       (double)raw_total / 1e6, (double)stored_total / 1e6,
	       (double)raw_total / (double)(stored_total ? stored_total : 1), nshuf);
	printf("%-12s %10s %10s   (GB/s; raw bytes for zstd/full, bytes touched otherwise)\n",
	       "step", "1 thread", "2 threads");
	for (int s = 0; s < NSTEPS; s++)
		printf("%-12s %10.2f %10.2f\n", step_names[s], run((enum step)s, 1),
		       run((enum step)s, 2));
	ckpt_hasher_free(hasher);
	return 0;
}
