/* dcheck.cu: the GPU check of libckptfs's save and load paths (run by tests/device/run.sh on
 * a machine with a CUDA GPU).
 *
 * 1. The same tensors saved from host memory and from device memory give byte-identical
 *    safetensors files.
 * 2. The stall of a device save (ckptfs_save_async) is about the time of the device-to-host
 *    copy: it is compared with a plain cudaMemcpy of the same tensors into pinned memory
 *    (cudaMallocHost), the physical floor; D2H bandwidth of both, and of pageable memory, is
 *    printed.
 * 3. Loading the device checkpoint back into device memory (ckptfs_load, host-to-device
 *    copies) gives the bytes that were saved.
 * Exit status 0 only if every check held.  Usage: dcheck DIR TOTAL_MIB
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trainer/ckptfs.h"

#define NT 9
#define CK(x)                                                                                \
	do {                                                                                 \
		cudaError_t e_ = (x);                                                        \
		if (e_ != cudaSuccess) {                                                     \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x,           \
				cudaGetErrorString(e_));                                     \
			exit(2);                                                             \
		}                                                                            \
	} while (0)

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static char *read_file(const char *p, size_t *len)
{
	FILE *f = fopen(p, "rb");
	char *b;
	long n;

	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	b = (char *)malloc((size_t)n + 1);
	if (fread(b, 1, (size_t)n, f) != (size_t)n) {
		fclose(f);
		free(b);
		return NULL;
	}
	fclose(f);
	*len = (size_t)n;
	return b;
}

static int save(struct ckptfs_saver *s, const char *path, struct ckptfs_tensor *t, int n,
		uint64_t seq, double *ret_stall)
{
	struct ckptfs_save_args a;
	char err[1024];
	double t0;
	int r;

	memset(&a, 0, sizeof(a));
	a.path = path;
	a.rank = 0;
	a.world = 1;
	a.job_id = 1;
	a.seq = seq;
	a.tensors = t;
	a.n_tensors = (size_t)n;
	a.num_layers = -1;
	t0 = now();
	r = ckptfs_save_async(s, &a);
	*ret_stall = now() - t0;
	if (r == 0)
		r = ckptfs_save_wait(s, -1);
	if (r < 0) {
		ckptfs_saver_error(s, err, sizeof(err));
		fprintf(stderr, "save %s: %s (%d)\n", path, err, r);
	}
	return r;
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : "/tmp/ckptfs-dcheck";
	size_t total = (size_t)(argc > 2 ? atol(argv[2]) : 1024) << 20;
	/* Sizes: a few large tensors, odd sizes, a tiny one; they sum to about total. */
	static const double share[NT] = { 0.30, 0.20, 0.15, 0.12, 0.10, 0.08, 0.04, 0.01, 0.0 };
	size_t bytes[NT], sum = 0;
	char *host[NT], *pinned_all;
	void *dev[NT];
	char names[NT][32];
	int64_t shape[NT][1];
	struct ckptfs_tensor th[NT], td[NT];
	struct ckptfs_saver *s;
	struct ckptfs_saver_opts o;
	char p_host[512], p_dev[512], f_host[600], f_dev[600], cmd[1200];
	double stall, best_stall = 1e9, first_stall = 0, t0, memcpy_pinned = 1e9, memcpy_page = 1e9;
	int fails = 0;
	size_t lh, ld;
	char *bh, *bd;

	if (!ckptfs_cuda_available()) {
		fprintf(stderr, "FAIL: ckptfs_cuda_available() is 0 (library built without CUDA, or "
			"no GPU)\n");
		return 1;
	}
	snprintf(cmd, sizeof(cmd), "rm -rf '%s' && mkdir -p '%s'", dir, dir);
	if (system(cmd) != 0)
		return 2;
	srand(7);
	for (int i = 0; i < NT; i++) {
		bytes[i] = i == NT - 1 ? 6 : ((size_t)(share[i] * (double)total) / 2 * 2 + (size_t)i * 2);
		sum += bytes[i];
		host[i] = (char *)malloc(bytes[i]);
		for (size_t k = 0; k < bytes[i]; k += 4096)
			host[i][k] = (char)rand();
		for (size_t k = 0; k < bytes[i]; k++)
			if (k % 4096)
				host[i][k] = (char)(k * 31 + (size_t)i);
		CK(cudaMalloc(&dev[i], bytes[i]));
		CK(cudaMemcpy(dev[i], host[i], bytes[i], cudaMemcpyHostToDevice));
		snprintf(names[i], sizeof(names[i]), "layers.%d.w", i);
		shape[i][0] = (int64_t)(bytes[i] / 2);
		memset(&th[i], 0, sizeof(th[i]));
		th[i].name = names[i];
		th[i].dtype = "BF16";
		th[i].ndim = 1;
		th[i].shape = shape[i];
		th[i].data = host[i];
		th[i].device = -1;
		th[i].tp_dim = CKPTFS_TP_DIM_UNSET;
		th[i].pp = CKPTFS_PP_UNSET;
		td[i] = th[i];
		td[i].data = dev[i];
		td[i].device = 0;
	}
	printf("tensors: %d, %.1f MiB\n", NT, (double)sum / (1 << 20));

	/* The floors: plain cudaMemcpy of the same tensors into pinned and pageable memory. */
	CK(cudaMallocHost((void **)&pinned_all, sum));
	{
		char *page = (char *)malloc(sum);

		memset(page, 0, sum);
		memset(pinned_all, 0, sum);
		for (int rep = 0; rep < 3; rep++) {
			size_t off = 0;

			t0 = now();
			for (int i = 0; i < NT; i++) {
				CK(cudaMemcpy(pinned_all + off, dev[i], bytes[i], cudaMemcpyDeviceToHost));
				off += bytes[i];
			}
			if (now() - t0 < memcpy_pinned)
				memcpy_pinned = now() - t0;
			off = 0;
			t0 = now();
			for (int i = 0; i < NT; i++) {
				CK(cudaMemcpy(page + off, dev[i], bytes[i], cudaMemcpyDeviceToHost));
				off += bytes[i];
			}
			if (now() - t0 < memcpy_page)
				memcpy_page = now() - t0;
		}
		free(page);
	}

	ckptfs_saver_opts_init(&o);
	o.pool_bytes = sum + ((size_t)256 << 20);
	if (ckptfs_saver_new(&o, &s) < 0) {
		fprintf(stderr, "FAIL: ckptfs_saver_new\n");
		return 1;
	}
	snprintf(p_host, sizeof(p_host), "%s/host", dir);
	if (save(s, p_host, th, NT, 1, &stall) < 0)
		return 1;
	printf("host save: stall %.2f ms\n", stall * 1e3);
	/* Device saves: the first pins the pool; the later ones show the steady stall. */
	for (int rep = 0; rep < 4; rep++) {
		snprintf(p_dev, sizeof(p_dev), "%s/dev%d", dir, rep);
		if (save(s, p_dev, td, NT, 2 + (uint64_t)rep, &stall) < 0)
			return 1;
		if (rep == 0)
			first_stall = stall;
		else if (stall < best_stall)
			best_stall = stall;
		printf("device save %d: stall %.2f ms (%.1f GB/s)\n", rep, stall * 1e3,
		       (double)sum / stall / 1e9);
	}
	{
		struct ckptfs_save_stats st;

		if (ckptfs_saver_stats(s, &st) == 0)
			printf("last device save: snapshot %.2f ms, write %.1f ms, commit %.1f ms, "
			       "%.1f MiB\n", (double)st.snapshot_ns / 1e6, (double)st.write_ns / 1e6,
			       (double)st.commit_ns / 1e6, (double)st.bytes / (1 << 20));
	}
	printf("pinned cudaMemcpy D2H: %.2f ms (%.1f GB/s); pageable: %.2f ms (%.1f GB/s)\n",
	       memcpy_pinned * 1e3, (double)sum / memcpy_pinned / 1e9, memcpy_page * 1e3,
	       (double)sum / memcpy_page / 1e9);
	printf("first device save (pins the pool): stall %.2f ms\n", first_stall * 1e3);
	printf("steady device save stall / pinned cudaMemcpy = %.2f\n", best_stall / memcpy_pinned);
	if (best_stall > 1.5 * memcpy_pinned + 0.002) {
		printf("FAIL: the device save's stall is not about the D2H copy time\n");
		fails++;
	}

	/* Byte identity of the device path with the host path. */
	snprintf(f_host, sizeof(f_host), "%s/model-rank00000.safetensors", p_host);
	snprintf(f_dev, sizeof(f_dev), "%s/dev3/model-rank00000.safetensors", dir);
	bh = read_file(f_host, &lh);
	bd = read_file(f_dev, &ld);
	if (!bh || !bd || lh != ld || memcmp(bh, bd, lh) != 0) {
		printf("FAIL: %s and %s differ\n", f_host, f_dev);
		fails++;
	} else {
		printf("OK: device save is byte-identical to the host save (%zu bytes)\n", lh);
	}
	free(bh);
	free(bd);

	/* Load back into device memory (host-to-device copies) and compare. */
	{
		struct ckptfs_loader *l = NULL;
		struct ckptfs_load_req rq[NT];
		void *back[NT];
		char err[1024];
		int r;

		snprintf(p_dev, sizeof(p_dev), "%s/dev3", dir);
		r = ckptfs_loader_open(p_dev, NULL, &l);
		if (r < 0) {
			printf("FAIL: ckptfs_loader_open %s: %d\n", p_dev, r);
			fails++;
		} else {
			memset(rq, 0, sizeof(rq));
			for (int i = 0; i < NT; i++) {
				CK(cudaMalloc(&back[i], bytes[i]));
				CK(cudaMemset(back[i], 0xab, bytes[i]));
				rq[i].name = names[i];
				rq[i].dtype = "BF16";
				rq[i].dst = back[i];
				rq[i].device = 0;
				rq[i].ndim = 1;
			}
			t0 = now();
			r = ckptfs_load(l, rq, NT);
			t0 = now() - t0;
			if (r < 0) {
				ckptfs_loader_error(l, err, sizeof(err));
				printf("FAIL: ckptfs_load to the device: %s\n", err);
				fails++;
			} else {
				int bad = 0;

				for (int i = 0; i < NT; i++) {
					char *chk = (char *)malloc(bytes[i]);

					CK(cudaMemcpy(chk, back[i], bytes[i], cudaMemcpyDeviceToHost));
					bad |= memcmp(chk, host[i], bytes[i]) != 0;
					free(chk);
				}
				printf("%s: load into device memory %.1f ms (%.1f GB/s)\n",
				       bad ? "FAIL" : "OK", t0 * 1e3, (double)sum / t0 / 1e9);
				fails += bad;
			}
			for (int i = 0; i < NT; i++)
				cudaFree(back[i]);
			ckptfs_loader_free(l);
		}
	}
	ckptfs_saver_free(s);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", dir);
	printf(fails ? "RESULT: FAIL (%d)\n" : "RESULT: OK\n", fails);
	return fails ? 1 : 0;
}
