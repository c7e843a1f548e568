/* load_io.c: ckptfs_load(): from requests to copy runs to parallel reads.
 *
 * Every request is checked first (tensor, dtype, global shape, bounds); nothing is read
 * before all are valid.  Planning, per request (the caller's thread):
 *   1. The target is a box of the global tensor, or a flat range of a box; a flat range is
 *      cut into at most 2*ndim boxes that are each contiguous in the flattening and whose own
 *      row-major order is the flattening's (a partial slice at the head, whole slices, a
 *      partial slice at the tail), so both kinds are boxes with a base in the destination.
 *   2. Every stored piece whose box meets a target box yields its copy runs (ckpt_box_runs:
 *      destination offset, source offset, length, merged maximally; no per-element work).
 *   3. When the tensor's pieces are disjoint (decided at open) and the runs add up to the
 *      request, they are taken as they are.  Otherwise they are ordered by (destination,
 *      piece) and swept once: a run covers what lies past the part already covered, so of
 *      overlapping pieces the one starting first, then the one in the first file by name, is
 *      read, and each destination byte is read once.  A hole is an error naming the tensor
 *      and the first uncovered element's global index.
 * Then for all requests together (one phase): the runs are ordered by (file, offset) (per file,
 * ascending stretches are concatenated; only interleaved ones are sorted), runs adjacent in
 * both file and memory are merged, and runs of one file separated by gaps of at most the file
 * system's gap limit (gap_limit) are gathered into one read: preadv() calls whose vectors
 * point into the destinations, the gaps into a scratch buffer.  Reads are cut at `chunk`
 * bytes so that io_threads threads, which take reads in file order from a shared counter, all
 * work.  Descriptors are opened once per file per load.
 *
 * Device destinations (and, for the tests, host ones with stage_host) are read through two
 * host staging buffers of LD_STAGE_BYTES / 2 each: the requests are cut into element ranges
 * that fill one, each fill is one phase as above, and its parts are copied to their devices
 * with the copy engine while a helper thread reads the next fill into the other buffer.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "trainer/copy.h"
#include "trainer/load.h"
#include "trainer/trainer_int.h"
#include "views/shardmeta.h"


static bool have_device_copy(void)
{
	return tr_cuda_usable();
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A copy run of one request: dst relative to the request's destination. */
struct run {
	uint64_t dst, src, len;
	uint32_t file, prio;
};

/* A chosen run of the load: dst absolute. */
struct grun {
	uint8_t *dst;
	uint64_t src, len;
	uint32_t file;
};

/* A part of a read: len bytes into dst, or a skipped gap (dst NULL). */
struct seg {
	uint8_t *dst;
	uint64_t len;
};

struct rd {
	uint32_t file;
	uint64_t off, len;
	size_t seg, nseg;
};

/* A part of a device destination, staged in host memory. */
struct stage {
	uint8_t *dev;
	int device;
	uint64_t host_off, len;
	size_t req;
};

/* Growable arrays of the plan; freed by plan_free. */
struct plan {
	struct ckptfs_loader *l;
	struct run *r;
	size_t nr, capr;
	struct grun *g;
	size_t ng, capg;
	/* while enumerating the runs of one piece into one target box */
	uint64_t base, poff;
	uint32_t file, prio;
	bool sorted;
};

static int grow(void **p, size_t *cap, size_t need, size_t size)
{
	size_t nc;
	void *np;

	if (need <= *cap)
		return 0;
	nc = *cap ? *cap : 64;
	while (nc < need)
		nc *= 2;
	np = realloc(*p, nc * size);
	if (!np)
		return -ENOMEM;
	*p = np;
	*cap = nc;
	return 0;
}

static int run_cb(void *ud, uint64_t dst_off, uint64_t src_off, uint64_t len)
{
	struct plan *p = ud;
	struct run *r;

	if (grow((void **)&p->r, &p->capr, p->nr + 1, sizeof(*p->r)))
		return -ENOMEM;
	r = &p->r[p->nr];
	r->dst = p->base + dst_off;
	r->src = p->poff + src_off;
	r->len = len;
	r->file = p->file;
	r->prio = p->prio;
	if (p->nr) {
		const struct run *q = r - 1;

		if (q->dst > r->dst || (q->dst == r->dst && q->prio > r->prio))
			p->sorted = false;
	}
	p->nr++;
	return 0;
}

static int cmp_run(const void *a, const void *b)
{
	const struct run *x = a, *y = b;

	if (x->dst != y->dst)
		return x->dst < y->dst ? -1 : 1;
	return x->prio < y->prio ? -1 : x->prio > y->prio;
}

static int cmp_grun(const void *a, const void *b)
{
	const struct grun *x = a, *y = b;

	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	if (x->src != y->src)
		return x->src < y->src ? -1 : 1;
	return x->dst < y->dst ? -1 : x->dst > y->dst;
}

/* The request, resolved: the box B (global coordinates), the flat range of its flattening
 * the destination holds ([0, elems(B)) for a box request), the element size. */
struct target {
	const struct ld_tensor *t;
	struct ckpt_box box;
	uint64_t a, b;
	unsigned eb;
	uint64_t bytes;
};

static void fmt_u64s(char *buf, size_t len, const uint64_t *v, unsigned n)
{
	ckpt_st_fmt_shape(buf, len, v, n);
}

/* "[i, j]": the global index of element e (counted from a) of the target. */
static void fmt_index(char *buf, size_t len, const struct target *tg, uint64_t e)
{
	uint64_t idx[CKPT_MAX_DIMS], f = tg->a + e;

	for (unsigned k = tg->box.ndim; k-- > 0;) {
		uint64_t s = tg->box.shape[k];

		idx[k] = tg->box.off[k] + (s ? f % s : 0);
		f = s ? f / s : 0;
	}
	fmt_u64s(buf, len, idx, tg->box.ndim);
}

/* Validates request q against the index; fills *tg. */
static int resolve(struct ckptfs_loader *l, const struct ckptfs_load_req *q, struct target *tg)
{
	const char *group = q->group ? q->group : CKPT_SHARDMETA_GROUP_DEFAULT;
	const struct ld_tensor *t;
	char a[200], b[200];
	unsigned bits;
	uint64_t n;
	long i;

	if (!q->name)
		return ld_fail(l, -EINVAL, "%s: group '%s': a load request without a tensor name",
			       l->dir, group);
	i = ld_find(l, group, q->name);
	if (i < 0)
		return ld_fail(l, -ENOENT, "%s: group '%s', tensor '%s': not in the checkpoint",
			       l->dir, group, q->name);
	t = &l->tensors[i];
	tg->t = t;
	if (!q->dtype || strcmp(q->dtype, ckpt_dtype_name(t->dtype)) != 0)
		return ld_fail(l, -EINVAL,
			       "%s: group '%s', tensor '%s': dtype mismatch: requested %s, stored %s",
			       l->dir, group, q->name, q->dtype ? q->dtype : "(none)",
			       ckpt_dtype_name(t->dtype));
	fmt_u64s(b, sizeof(b), t->shape, t->ndim);
	if (q->ndim != (int)t->ndim)
		return ld_fail(l, -EINVAL,
			       "%s: group '%s', tensor '%s': global shape mismatch: requested %d "
			       "dimensions, stored global shape %s", l->dir, group, q->name, q->ndim,
			       b);
	tg->box.ndim = t->ndim;
	for (unsigned k = 0; k < t->ndim; k++) {
		const int64_t *shp = q->flat ? q->box_shape : q->shape;
		int64_t o = q->offsets ? q->offsets[k] : 0;
		int64_t s = shp ? shp[k] : (int64_t)t->shape[k];

		if (o < 0 || s < 0 || (uint64_t)o > t->shape[k] ||
		    (uint64_t)s > t->shape[k] - (uint64_t)o) {
			uint64_t ov[CKPT_MAX_DIMS], sv[CKPT_MAX_DIMS];

			for (unsigned j = 0; j < t->ndim; j++) {
				ov[j] = q->offsets ? (uint64_t)q->offsets[j] : 0;
				sv[j] = shp ? (uint64_t)shp[j] : t->shape[j];
			}
			fmt_u64s(a, sizeof(a), sv, t->ndim);
			{
				char c[200];

				fmt_u64s(c, sizeof(c), ov, t->ndim);
				return ld_fail(l, -EINVAL,
					       "%s: group '%s', tensor '%s': global shape mismatch: "
					       "the requested box %s at %s does not fit the stored "
					       "global shape %s", l->dir, group, q->name, a, c, b);
			}
		}
		tg->box.off[k] = (uint64_t)o;
		tg->box.shape[k] = (uint64_t)s;
	}
	n = ckpt_box_elems(&tg->box);
	if (q->flat) {
		if (q->flat_start < 0 || q->flat_end < q->flat_start ||
		    (uint64_t)q->flat_end > n)
			return ld_fail(l, -EINVAL,
				       "%s: group '%s', tensor '%s': flat range [%lld, %lld) outside "
				       "the %llu elements of its box", l->dir, group, q->name,
				       (long long)q->flat_start, (long long)q->flat_end,
				       (unsigned long long)n);
		tg->a = (uint64_t)q->flat_start;
		tg->b = (uint64_t)q->flat_end;
	} else {
		tg->a = 0;
		tg->b = n;
	}
	if (q->device >= 0 && !have_device_copy())
		return ld_fail(l, -ENODEV,
			       "%s: group '%s', tensor '%s': a device destination (device %d), but "
			       "no usable GPU (or a library built without CUDA)", l->dir, group,
			       q->name, q->device);
	bits = ckpt_dtype_bits(t->dtype);
	tg->eb = bits / 8;
	if (bits % 8) {
		/* bit-packed: plan_packed() decides */
		tg->eb = 0;
		tg->bytes = 0;
		return 0;
	}
	tg->bytes = (tg->b - tg->a) * tg->eb; /* fits: the global tensor's bytes do */
	if (tg->bytes && !q->dst)
		return ld_fail(l, -EINVAL, "%s: group '%s', tensor '%s': no destination", l->dir,
			       group, q->name);
	return 0;
}

/* Calls emit(p, box, dst element base) for the boxes that tile elements [a, b) of the
 * flattening of B in order (see the top of the file). */
static int flat_boxes(struct plan *p, const struct target *tg,
		      int (*emit)(struct plan *, const struct target *, const struct ckpt_box *,
				  uint64_t))
{
	const struct ckpt_box *B = &tg->box;
	uint64_t s[CKPT_MAX_DIMS], pos = tg->a;
	unsigned n = B->ndim;
	int rc;

	if (tg->a >= tg->b)
		return 0;
	if (n == 0 || (tg->a == 0 && tg->b == ckpt_box_elems(B)))
		return emit(p, tg, B, 0);
	s[n - 1] = 1;
	for (unsigned k = n - 1; k-- > 0;)
		s[k] = s[k + 1] * B->shape[k + 1];
	while (pos < tg->b) {
		struct ckpt_box c;
		uint64_t idx[CKPT_MAX_DIMS], f = pos, cnt;
		unsigned d = 0;

		for (unsigned k = n; k-- > 0;) {
			idx[k] = f % B->shape[k];
			f /= B->shape[k];
		}
		while (d + 1 < n && (pos % s[d] != 0 || tg->b - pos < s[d]))
			d++;
		cnt = (tg->b - pos) / s[d];
		if (cnt > B->shape[d] - idx[d])
			cnt = B->shape[d] - idx[d];
		c.ndim = n;
		for (unsigned k = 0; k < n; k++) {
			if (k < d) {
				c.off[k] = B->off[k] + idx[k];
				c.shape[k] = 1;
			} else if (k == d) {
				c.off[k] = B->off[k] + idx[k];
				c.shape[k] = cnt;
			} else {
				c.off[k] = B->off[k];
				c.shape[k] = B->shape[k];
			}
		}
		rc = emit(p, tg, &c, pos - tg->a);
		if (rc)
			return rc;
		pos += cnt * s[d];
	}
	return 0;
}

static bool box_meets(const struct ckpt_box *x, const struct ckpt_box *y)
{
	for (unsigned k = 0; k < x->ndim; k++) {
		if (x->off[k] >= y->off[k] + y->shape[k] || y->off[k] >= x->off[k] + x->shape[k])
			return false;
	}
	return true;
}

/* The runs of every piece of the tensor inside target box c (destination base e0). */
static int emit_box_runs(struct plan *p, const struct target *tg, const struct ckpt_box *c,
			 uint64_t e0)
{
	const struct ld_tensor *t = tg->t;
	struct ckptfs_loader *l = p->l;

	for (size_t i = 0; i < t->n_pieces; i++) {
		const struct ld_piece *pc = &l->pieces[t->first_piece + i];
		int rc;

		if (pc->len == 0 || !box_meets(c, &pc->geom.box))
			continue;
		p->base = e0 * tg->eb;
		p->poff = pc->off;
		p->file = pc->file;
		p->prio = (uint32_t)i;
		rc = ckpt_box_runs(c, &pc->geom, tg->eb, run_cb, p);
		if (rc == -ENOMEM)
			return ld_fail(l, rc, "%s: out of memory planning the load", l->dir);
		if (rc)
			return ld_fail(l, rc, "%s: group '%s', tensor '%s': a piece in %s: %s", l->dir,
				       t->group, t->name, l->files[pc->file].path, strerror(-rc));
	}
	return 0;
}

/* Chooses the runs that fill the request (dst the host destination) and appends them to the
 * load's runs; a hole is an error. */
static int cover(struct plan *p, const struct target *tg, uint8_t *dst)
{
	struct ckptfs_loader *l = p->l;
	uint64_t cur = 0;
	size_t i = 0;

	if (!p->sorted)
		qsort(p->r, p->nr, sizeof(*p->r), cmp_run);
	if (grow((void **)&p->g, &p->capg, p->ng + p->nr, sizeof(*p->g)))
		return ld_fail(l, -ENOMEM, "%s: out of memory planning the load", l->dir);
	for (;;) {
		uint64_t hole_end = tg->bytes;

		for (; i < p->nr; i++) {
			const struct run *r = &p->r[i];
			struct grun *g;
			uint64_t skip;

			if (r->dst + r->len <= cur)
				continue;
			if (r->dst > cur) {
				hole_end = r->dst;
				break;
			}
			skip = cur - r->dst;
			g = &p->g[p->ng];
			if (p->ng > 0 && g[-1].file == r->file && g[-1].src + g[-1].len == r->src + skip &&
			    g[-1].dst + g[-1].len == dst + cur) {
				g[-1].len += r->len - skip;
			} else {
				g->dst = dst + cur;
				g->src = r->src + skip;
				g->len = r->len - skip;
				g->file = r->file;
				p->ng++;
			}
			cur = r->dst + r->len;
		}
		if (cur >= tg->bytes)
			return 0;
		{
			char idx[200];

			fmt_index(idx, sizeof(idx), tg, cur / tg->eb);
			return ld_fail(l, -ENODATA,
				       "%s: group '%s', tensor '%s': no stored piece covers %llu "
				       "elements starting at index %s", l->dir, tg->t->group,
				       tg->t->name, (unsigned long long)((hole_end - cur) / tg->eb),
				       idx);
		}
	}
}

/* Appends every run of the request (known to tile it) to the load's runs. */
static int take_all(struct plan *p, uint8_t *dst)
{
	if (grow((void **)&p->g, &p->capg, p->ng + p->nr, sizeof(*p->g)))
		return ld_fail(p->l, -ENOMEM, "%s: out of memory planning the load", p->l->dir);
	for (size_t i = 0; i < p->nr; i++) {
		const struct run *r = &p->r[i];

		p->g[p->ng++] = (struct grun){dst + r->dst, r->src, r->len, r->file};
	}
	return 0;
}

/* A bit-packed dtype: the whole tensor from a whole (non-flat) piece. */
static int plan_packed(struct plan *p, const struct target *tg, const struct ckptfs_load_req *q,
		       uint8_t *dst, uint64_t *needed)
{
	struct ckptfs_loader *l = p->l;
	const struct ld_tensor *t = tg->t;
	bool whole = !q->flat;

	for (unsigned k = 0; whole && k < t->ndim; k++)
		whole = tg->box.off[k] == 0 && tg->box.shape[k] == t->shape[k];
	if (whole) {
		for (size_t i = 0; i < t->n_pieces; i++) {
			const struct ld_piece *pc = &l->pieces[t->first_piece + i];
			bool pw = !pc->geom.flat;

			for (unsigned k = 0; pw && k < t->ndim; k++)
				pw = pc->geom.box.off[k] == 0 && pc->geom.box.shape[k] == t->shape[k];
			if (!pw)
				continue;
			if (pc->len && !dst)
				return ld_fail(l, -EINVAL, "%s: group '%s', tensor '%s': no destination",
					       l->dir, t->group, t->name);
			if (grow((void **)&p->g, &p->capg, p->ng + 1, sizeof(*p->g)))
				return ld_fail(l, -ENOMEM, "%s: out of memory", l->dir);
			if (pc->len)
				p->g[p->ng++] = (struct grun){dst, pc->off, pc->len, pc->file};
			*needed += pc->len;
			return 0;
		}
	}
	return ld_fail(l, -ENOTSUP,
		       "%s: group '%s', tensor '%s': dtype %s is bit-packed: it loads only whole, "
		       "from a piece that holds the whole tensor", l->dir, t->group, t->name,
		       ckpt_dtype_name(t->dtype));
}

/* Plans the runs that fill target tg (a resolved request, or a part of one) into host
 * memory dst. */
static int plan_target(struct plan *p, const struct target *tg, uint8_t *dst)
{
	int rc;

	p->nr = 0;
	p->sorted = true;
	rc = flat_boxes(p, tg, emit_box_runs);
	if (rc)
		return rc;
	if (tg->t->disjoint) {
		/* disjoint pieces give disjoint runs: they cover the request when their lengths
		 * add up to it, and every run is read as it is */
		uint64_t sum = 0;

		for (size_t i = 0; i < p->nr; i++)
			sum += p->r[i].len;
		if (sum == tg->bytes)
			return take_all(p, dst);
	}
	return cover(p, tg, dst);
}

/* An ascending stretch of one file's runs. */
struct seq {
	size_t start, n;
	uint64_t lo, hi;
};

static int cmp_seq(const void *a, const void *b)
{
	const struct seq *x = a, *y = b;

	return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Orders p->g by (file, offset).  The runs come per request and piece, in long stretches
 * already ascending in the file: they are grouped by file (a counting sort), each file's
 * stretches are ordered by their first offset and, when they do not interleave, concatenated;
 * only interleaving stretches are sorted run by run. */
static int order_runs(struct plan *p)
{
	struct ckptfs_loader *l = p->l;
	size_t nf = l->n_files, *cnt = NULL, nseq = 0, capseq = 0;
	struct grun *out = NULL;
	struct seq *sq = NULL;
	int ret = 0;

	if (p->ng < 2)
		return 0;
	cnt = calloc(nf + 1, sizeof(*cnt));
	out = malloc(p->ng * sizeof(*out));
	if (!cnt || !out) {
		ret = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < p->ng; i++)
		cnt[p->g[i].file + 1]++;
	for (size_t f = 0; f < nf; f++)
		cnt[f + 1] += cnt[f];
	for (size_t i = 0; i < p->ng; i++)
		out[cnt[p->g[i].file]++] = p->g[i];
	/* cnt[f] is now the end of file f's runs in out */
	for (size_t f = 0, s = 0; f < nf; s = cnt[f], f++) {
		size_t e = cnt[f];
		bool apart = true;

		if (e - s < 2)
			continue;
		nseq = 0;
		for (size_t i = s; i < e; i++) {
			if (i == s || out[i].src < out[i - 1].src + out[i - 1].len) {
				if (grow((void **)&sq, &capseq, nseq + 1, sizeof(*sq))) {
					ret = -ENOMEM;
					goto out;
				}
				sq[nseq++] = (struct seq){i, 0, out[i].src, 0};
			}
			sq[nseq - 1].n++;
			sq[nseq - 1].hi = out[i].src + out[i].len;
		}
		if (nseq == 1)
			continue;
		qsort(sq, nseq, sizeof(*sq), cmp_seq);
		for (size_t k = 1; k < nseq && apart; k++)
			apart = sq[k - 1].hi <= sq[k].lo;
		if (!apart) {
			qsort(out + s, e - s, sizeof(*out), cmp_grun);
			continue;
		}
		/* concatenate the stretches in order, through p->g as scratch */
		{
			size_t o = s;

			for (size_t k = 0; k < nseq; k++) {
				memcpy(p->g + o, out + sq[k].start, sq[k].n * sizeof(*out));
				o += sq[k].n;
			}
			memcpy(out + s, p->g + s, (e - s) * sizeof(*out));
		}
	}
	free(p->g);
	p->g = out;
	p->capg = p->ng;
	out = NULL;
out:
	free(cnt);
	free(out);
	free(sq);
	if (ret)
		return ld_fail(l, ret, "%s: out of memory planning the load", l->dir);
	return 0;
}

/* --- execution ----------------------------------------------------------------------------- */

struct exec {
	struct ckptfs_loader *l;
	const struct rd *reads;
	size_t n_reads;
	const struct seg *segs;
	const int *fds;
	uint64_t scratch_len;   /* largest gap (gather) or read (bounce) */
	int mode;
	size_t ahead;           /* reads announced ahead of the one being read (0: none) */
	atomic_size_t next;
	atomic_size_t advised;  /* reads [0, advised) have been announced */
	atomic_int err;
	atomic_ullong syscalls;
	pthread_mutex_t lock;   /* protects errmsg (the first failure's message) */
	char errmsg[LD_ERR_MAX];
};

static void exec_fail(struct exec *x, int err, const struct rd *r, uint64_t at, const char *why)
{
	int expected = 0;

	pthread_mutex_lock(&x->lock);
	if (atomic_compare_exchange_strong(&x->err, &expected, err))
		snprintf(x->errmsg, sizeof(x->errmsg), "%s: reading %llu bytes at offset %llu: %s",
			 x->l->files[r->file].path, (unsigned long long)r->len,
			 (unsigned long long)at, why);
	pthread_mutex_unlock(&x->lock);
}

/* One read as a sequence of preadv calls over the segments (gaps into scratch). */
static int do_gather(struct exec *x, const struct rd *r, uint8_t *scratch)
{
	struct iovec iov[LD_IOV_MAX];
	const struct seg *sg = x->segs + r->seg;
	size_t si = 0;
	uint64_t off = r->off, skip = 0; /* bytes of sg[si] already read */
	unsigned long long calls = 0;
	int ret = 0;

	while (si < r->nseg) {
		size_t n = 0;
		ssize_t got;

		for (size_t k = si; k < r->nseg && n < LD_IOV_MAX; k++, n++) {
			uint64_t o = k == si ? skip : 0;

			iov[n].iov_base = sg[k].dst ? sg[k].dst + o : scratch;
			iov[n].iov_len = sg[k].len - o;
		}
		got = preadv(x->fds[r->file], iov, (int)n, (off_t)off);
		calls++;
		if (got < 0) {
			if (errno == EINTR)
				continue;
			ret = -errno;
			exec_fail(x, ret, r, off, strerror(errno));
			break;
		}
		if (got == 0) {
			ret = -EIO;
			exec_fail(x, ret, r, off,
				  "the file ends there (truncated or replaced since the loader opened "
				  "the directory)");
			break;
		}
		off += (uint64_t)got;
		while (got > 0) {
			uint64_t left = sg[si].len - skip;

			if ((uint64_t)got >= left) {
				got -= (ssize_t)left;
				si++;
				skip = 0;
			} else {
				skip += (uint64_t)got;
				got = 0;
			}
		}
	}
	atomic_fetch_add(&x->syscalls, calls);
	return ret;
}

/* One read into a bounce buffer, then copied out (measurement mode). */
static int do_bounce(struct exec *x, const struct rd *r, uint8_t *buf)
{
	const struct seg *sg = x->segs + r->seg;
	uint64_t done = 0;
	unsigned long long calls = 0;
	uint8_t *p;

	if (r->nseg == 1)
		return do_gather(x, r, buf);
	while (done < r->len) {
		ssize_t got = pread(x->fds[r->file], buf + done, r->len - done,
				    (off_t)(r->off + done));

		calls++;
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0) {
			int e = got < 0 ? -errno : -EIO;

			exec_fail(x, e, r, r->off + done,
				  got < 0 ? strerror(errno) : "the file ends there");
			atomic_fetch_add(&x->syscalls, calls);
			return e;
		}
		done += (uint64_t)got;
	}
	atomic_fetch_add(&x->syscalls, calls);
	p = buf;
	for (size_t k = 0; k < r->nseg; k++) {
		if (sg[k].dst)
			memcpy(sg[k].dst, p, sg[k].len);
		p += sg[k].len;
	}
	return 0;
}

/* Announces the reads up to `ahead` past read i to the kernel (POSIX_FADV_WILLNEED), so
 * that the device (or the file system daemon) works on several of them while the threads
 * copy: each read is announced once, by whichever thread claims it. */
static void advise_ahead(struct exec *x, size_t i)
{
	size_t want = i + x->ahead, a;

	if (!x->ahead)
		return;
	if (want > x->n_reads)
		want = x->n_reads;
	a = atomic_load(&x->advised);
	while (a < want) {
		if (atomic_compare_exchange_weak(&x->advised, &a, a + 1)) {
			const struct rd *r = &x->reads[a];

			(void)posix_fadvise(x->fds[r->file], (off_t)r->off, (off_t)r->len,
					    POSIX_FADV_WILLNEED);
			a++;
		}
	}
}

static void *worker(void *arg)
{
	struct exec *x = arg;
	uint8_t *scratch = NULL;

	if (x->scratch_len) {
		scratch = malloc(x->scratch_len);
		if (!scratch) {
			if (x->n_reads)
				exec_fail(x, -ENOMEM, &x->reads[0], x->reads[0].off,
					  "out of memory for a read buffer");
			return NULL;
		}
	}
	for (;;) {
		size_t i = atomic_fetch_add(&x->next, 1);

		if (i >= x->n_reads || atomic_load(&x->err))
			break;
		advise_ahead(x, i);
		if (x->mode == 1)
			do_bounce(x, &x->reads[i], scratch);
		else
			do_gather(x, &x->reads[i], scratch);
	}
	free(scratch);
	return NULL;
}

/* The largest gap read through in file f: tune 0 is the file system's default, UINT64_MAX
 * none. */
static uint64_t gap_limit(const struct ckptfs_loader *l, uint32_t f, uint64_t tune)
{
	if (tune == UINT64_MAX)
		return 0;
	if (tune)
		return tune;
	return l->files[f].fuse ? LD_GAP_MAX_FUSE : LD_GAP_MAX_DEFAULT;
}

/* Cuts the sorted runs into reads and segments. */
static int make_reads(struct plan *p, uint64_t gap_max, uint64_t chunk, int mode,
		      struct rd **ret_reads,
		      size_t *ret_nr, struct seg **ret_segs, uint64_t *ret_max_gap,
		      uint64_t *ret_gap_bytes)
{
	struct rd *rd = NULL;
	struct seg *sg = NULL;
	size_t nrd = 0, caprd = 0, nsg = 0, capsg = 0;
	uint64_t max_gap = 0, gap_bytes = 0;
	struct rd *cur = NULL;

	for (size_t i = 0; i < p->ng; i++) {
		const struct grun *g = &p->g[i];
		uint8_t *dst = g->dst;
		uint64_t src = g->src, len = g->len;

		if (cur && mode != 2 && cur->file == g->file && src >= cur->off + cur->len &&
		    src - (cur->off + cur->len) <= gap_limit(p->l, g->file, gap_max) &&
		    cur->len + (src - (cur->off + cur->len)) + len <= chunk &&
		    cur->nseg + 2 <= LD_IOV_MAX * 64) {
			uint64_t gap = src - (cur->off + cur->len);

			if (grow((void **)&sg, &capsg, nsg + 2, sizeof(*sg)))
				goto nomem;
			if (gap) {
				sg[nsg++] = (struct seg){NULL, gap};
				cur->nseg++;
				if (gap > max_gap)
					max_gap = gap;
				gap_bytes += gap;
			}
			sg[nsg++] = (struct seg){dst, len};
			cur->nseg++;
			cur->len += gap + len;
			continue;
		}
		/* new reads: whole chunks of a long run alone, the rest open for more */
		while (len) {
			uint64_t n = len > chunk ? chunk : len;

			if (grow((void **)&rd, &caprd, nrd + 1, sizeof(*rd)) ||
			    grow((void **)&sg, &capsg, nsg + 1, sizeof(*sg)))
				goto nomem;
			cur = &rd[nrd++];
			*cur = (struct rd){g->file, src, n, nsg, 1};
			sg[nsg++] = (struct seg){dst, n};
			dst += n;
			src += n;
			len -= n;
		}
	}
	*ret_reads = rd;
	*ret_nr = nrd;
	*ret_segs = sg;
	*ret_max_gap = max_gap;
	*ret_gap_bytes = gap_bytes;
	return 0;
nomem:
	free(rd);
	free(sg);
	return ld_fail(p->l, -ENOMEM, "%s: out of memory planning the reads", p->l->dir);
}

static int run_reads(struct ckptfs_loader *l, struct exec *x, unsigned nthreads)
{
	pthread_t th[256];
	unsigned started = 0;

	for (unsigned i = 1; i < nthreads; i++) {
		if (tr_thread_start(&th[started], worker, x) != 0)
			break; /* fewer threads still finish the work */
		started++;
	}
	worker(x);
	for (unsigned i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	if (atomic_load(&x->err))
		return ld_fail(l, atomic_load(&x->err), "%s", x->errmsg);
	return 0;
}

static void plan_free(struct plan *p)
{
	free(p->r);
	free(p->g);
}

/* One ckptfs_load() call: the plan of the phase being built, the descriptors (opened at the
 * first read of each file, closed at the end of the call). */
struct load {
	struct ckptfs_loader *l;
	struct plan p;
	int *fds;
};

/* Reads the runs planned in p (then empties the plan).  Phases never run at the same time
 * (the staged path's reads of one fill overlap only the copy-out of the previous one). */
static int run_phase(struct load *ld, struct plan *p)
{
	struct ckptfs_loader *l = ld->l;
	struct ckptfs__load_stats *st = &l->stats;
	struct rd *reads = NULL;
	struct seg *segs = NULL;
	size_t nreads = 0;
	uint64_t total = 0, max_gap = 0, gap_bytes = 0, gap_max, chunk, t0 = now_ns(), t1;
	unsigned nthreads = (unsigned)l->io_threads;
	struct exec x;
	int ret;

	/* every destination byte is read once: order by place in the files, merge neighbours */
	ret = order_runs(p);
	if (ret)
		goto out;
	if (p->ng) {
		size_t k = 0;

		for (size_t i = 1; i < p->ng; i++) {
			struct grun *a = &p->g[k], *b = &p->g[i];

			if (a->file == b->file && a->src + a->len == b->src && a->dst + a->len == b->dst)
				a->len += b->len;
			else
				p->g[++k] = *b;
		}
		p->ng = k + 1;
	}
	for (size_t i = 0; i < p->ng; i++)
		total += p->g[i].len;
	gap_max = l->tune.gap_max; /* 0: each file system's default; UINT64_MAX: no gap */
	chunk = l->tune.chunk_bytes;
	if (!chunk) {
		chunk = total / ((uint64_t)nthreads * 4);
		if (chunk < LD_CHUNK_MIN)
			chunk = LD_CHUNK_MIN;
		if (chunk > LD_CHUNK_MAX)
			chunk = LD_CHUNK_MAX;
	}
	ret = make_reads(p, gap_max, chunk, l->tune.mode, &reads, &nreads, &segs, &max_gap,
			 &gap_bytes);
	if (ret)
		goto out;
	for (size_t i = 0; i < nreads; i++) {
		uint32_t f = reads[i].file;

		if (ld->fds[f] >= 0)
			continue;
		ld->fds[f] = open(l->files[f].path, O_RDONLY | O_CLOEXEC);
		if (ld->fds[f] < 0) {
			ret = ld_fail(l, -errno, "%s: %s", l->files[f].path, strerror(errno));
			goto out;
		}
		st->files++;
	}
	t1 = now_ns();
	st->plan_ns += t1 - t0;
	memset(&x, 0, sizeof(x));
	x.l = l;
	x.reads = reads;
	x.n_reads = nreads;
	x.segs = segs;
	x.fds = ld->fds;
	x.mode = l->tune.mode;
	x.scratch_len = x.mode == 1 ? chunk : max_gap;
	if (l->tune.willneed > 0 || (l->tune.willneed == 0 && LD_WILLNEED_DEFAULT)) {
		x.ahead = (size_t)(LD_AHEAD_BYTES / chunk);
		if (x.ahead < 2 * (size_t)nthreads)
			x.ahead = 2 * (size_t)nthreads;
	}
	atomic_init(&x.advised, 0);
	atomic_init(&x.next, 0);
	atomic_init(&x.err, 0);
	atomic_init(&x.syscalls, 0);
	pthread_mutex_init(&x.lock, NULL);
	if (nthreads > nreads)
		nthreads = nreads ? (unsigned)nreads : 1;
	ret = run_reads(l, &x, nthreads);
	pthread_mutex_destroy(&x.lock);
	st->syscalls += atomic_load(&x.syscalls);
	st->io_ns += now_ns() - t1;
out:
	st->bytes_read += total + gap_bytes;
	st->gap_bytes += gap_bytes;
	st->runs += p->ng;
	st->reads += nreads;
	free(reads);
	free(segs);
	p->ng = 0;
	return ret;
}

/* Copies a staged part to its destination (device -1: a host destination, as the tests'
 * staging mode uses); on failure returns the errno and the copy engine's reason in why. */
static int stage_copy(const struct stage *s, const uint8_t *staging, char *why, size_t whylen)
{
	const char *e;
	int ret;

	if (s->device < 0) {
		memcpy(s->dev, staging + s->host_off, s->len);
		return 0;
	}
	ret = tr_copy_to_device(s->dev, s->device, staging + s->host_off, s->len);
	if (ret) {
		e = tr_copy_error();
		snprintf(why, whylen, "%s", e && *e ? e : strerror(-ret));
	}
	return ret;
}

/* One fill of a staging buffer: its plan and where its parts go. */
struct fill {
	struct plan p;
	uint8_t *buf;
	struct stage *cp;
	size_t ncp, capcp;
};

/* Where the staged requests have been planned up to: request i, element done of it. */
struct cursor {
	size_t i;
	uint64_t done;
};

/* Plans the next parts of the staged requests into fl (up to cap bytes); *ret_any is false
 * when nothing was left. */
static int plan_fill(struct load *ld, const struct ckptfs_load_req *reqs, const struct target *tg,
		     const bool *staged, size_t n, struct cursor *c, struct fill *fl, uint64_t cap,
		     bool *ret_any)
{
	struct ckptfs_loader *l = ld->l;
	uint64_t used = 0;
	int ret;

	fl->ncp = 0;
	*ret_any = false;
	for (; c->i < n; c->i++, c->done = 0) {
		const struct target *t = &tg[c->i];

		if (!staged[c->i] || !t->bytes)
			continue;
		while (c->done < t->b - t->a) {
			uint64_t room = (cap - used) / t->eb, take = t->b - t->a - c->done;
			struct target sub = *t;

			if (room == 0)
				return 0; /* full */
			if (take > room)
				take = room;
			sub.a = t->a + c->done;
			sub.b = sub.a + take;
			sub.bytes = take * t->eb;
			ret = plan_target(&fl->p, &sub, fl->buf + used);
			if (ret)
				return ret;
			if (grow((void **)&fl->cp, &fl->capcp, fl->ncp + 1, sizeof(*fl->cp)))
				return ld_fail(l, -ENOMEM, "%s: out of memory", l->dir);
			fl->cp[fl->ncp++] = (struct stage){(uint8_t *)reqs[c->i].dst + c->done * t->eb,
							   reqs[c->i].device, used, sub.bytes, c->i};
			used += sub.bytes;
			c->done += take;
			*ret_any = true;
		}
	}
	return 0;
}

/* A phase run by a helper thread while the caller's thread copies the previous fill out. */
struct async_phase {
	struct load *ld;
	struct plan *p;
	int ret;
};

static void *phase_thread(void *arg)
{
	struct async_phase *a = arg;

	a->ret = run_phase(a->ld, a->p);
	return NULL;
}

/* The staged requests (device destinations), through two host buffers of half of at most
 * LD_STAGE_BYTES each: the requests are cut into element ranges that fill a buffer; while one
 * fill is copied out (to the device), the next one is read. */
static int load_staged(struct load *ld, const struct ckptfs_load_req *reqs,
		       const struct target *tg, const bool *staged, size_t n, uint64_t total)
{
	struct ckptfs_loader *l = ld->l;
	uint64_t cap = l->tune.stage_bytes ? l->tune.stage_bytes : LD_STAGE_BYTES, alloc;
	bool pinned[2] = {false, false};
	struct fill fl[2];
	struct cursor c = {0, 0};
	unsigned cur = 0;
	bool any;
	int ret;

	memset(fl, 0, sizeof(fl));
	fl[0].p.l = fl[1].p.l = l;
	cap /= 2;
	if (cap < 16)
		cap = 16; /* room for an element of any dtype */
	if (cap > total)
		cap = total; /* which holds every staged request whole */
	alloc = (cap + 4095) / 4096 * 4096;
	fl[0].buf = aligned_alloc(4096, alloc);
	fl[1].buf = total > cap ? aligned_alloc(4096, alloc) : NULL;
	if (!fl[0].buf || (total > cap && !fl[1].buf)) {
		ret = ld_fail(l, -ENOMEM, "%s: out of memory for a %llu-byte staging buffer",
			      l->dir, (unsigned long long)(total > cap ? 2 * alloc : alloc));
		goto out;
	}
	/* several fills to a device: page-locked buffers copy several times faster, which
	 * outweighs locking them once (a failure leaves them pageable, slower but right) */
	for (size_t i = 0; i < n && total > 2 * cap; i++) {
		if (!staged[i] || reqs[i].device < 0)
			continue;
		for (int k = 0; k < 2; k++)
			pinned[k] = fl[k].buf && tr_host_register(fl[k].buf, alloc) == 0;
		break;
	}
	ret = plan_fill(ld, reqs, tg, staged, n, &c, &fl[0], cap, &any);
	if (!ret)
		ret = run_phase(ld, &fl[0].p);
	while (!ret && any) {
		struct fill *now = &fl[cur], *next = &fl[1 - cur];
		struct async_phase a = {ld, &next->p, 0};
		pthread_t th;
		bool next_any = false, threaded = false;
		char why[512];
		size_t k = 0;
		int cret = 0;

		if (next->buf) {
			ret = plan_fill(ld, reqs, tg, staged, n, &c, next, cap, &next_any);
			if (ret)
				break;
		}
		if (next_any) {
			threaded = tr_thread_start(&th, phase_thread, &a) == 0;
			if (!threaded)
				a.ret = run_phase(ld, &next->p); /* no thread: one after the other */
		}
		for (; k < now->ncp; k++) {
			cret = stage_copy(&now->cp[k], now->buf, why, sizeof(why));
			if (cret)
				break;
		}
		if (threaded)
			pthread_join(th, NULL);
		/* the copy's failure is reported after the reader thread is gone (one writer of
		 * the loader's message at a time); it is the earlier one */
		if (cret) {
			const struct ckptfs_load_req *q = &reqs[now->cp[k].req];

			ret = ld_fail(l, cret, "%s: group '%s', tensor '%s': copy to device %d: %s",
				      l->dir, q->group ? q->group : CKPT_SHARDMETA_GROUP_DEFAULT,
				      q->name, q->device, why);
			break;
		}
		ret = a.ret;
		any = next_any;
		cur = 1 - cur;
	}
out:
	for (int k = 0; k < 2; k++) {
		if (pinned[k])
			tr_host_unregister(fl[k].buf);
		free(fl[k].buf);
		free(fl[k].cp);
		plan_free(&fl[k].p);
	}
	return ret;
}

CKPTFS_EXPORT int ckptfs_load(struct ckptfs_loader *l, const struct ckptfs_load_req *reqs,
			      size_t n)
{
	struct load ld = {.l = l};
	struct target *tg = NULL;
	bool *staged = NULL;
	uint64_t staged_bytes = 0, t0;
	int ret = 0;

	if (!l)
		return -EINVAL;
	if (!reqs && n)
		return ld_fail(l, -EINVAL, "%s: ckptfs_load: no requests array", l->dir);
	l->err = 0;
	l->errmsg[0] = '\0';
	memset(&l->stats, 0, sizeof(l->stats));
	ld.p.l = l;
	tg = malloc((n ? n : 1) * sizeof(*tg));
	staged = calloc(n ? n : 1, sizeof(*staged));
	ld.fds = malloc((l->n_files ? l->n_files : 1) * sizeof(*ld.fds));
	if (!tg || !staged || !ld.fds) {
		ret = ld_fail(l, -ENOMEM, "%s: out of memory", l->dir);
		goto out;
	}
	for (size_t i = 0; i < l->n_files; i++)
		ld.fds[i] = -1;
	/* every request is checked before anything is read */
	t0 = now_ns();
	for (size_t i = 0; i < n; i++) {
		ret = resolve(l, &reqs[i], &tg[i]);
		if (ret)
			goto out;
		if (tg[i].eb == 0 && reqs[i].device >= 0) {
			ret = ld_fail(l, -ENOTSUP,
				      "%s: group '%s', tensor '%s': dtype %s is bit-packed: it loads "
				      "into host memory only", l->dir, tg[i].t->group, tg[i].t->name,
				      ckpt_dtype_name(tg[i].t->dtype));
			goto out;
		}
		staged[i] = tg[i].eb && (reqs[i].device >= 0 || l->tune.stage_host);
	}
	/* host destinations: one phase, read in place */
	for (size_t i = 0; i < n; i++) {
		if (tg[i].eb == 0) {
			ret = plan_packed(&ld.p, &tg[i], &reqs[i], reqs[i].dst,
					  &l->stats.bytes_needed);
		} else {
			l->stats.bytes_needed += tg[i].bytes;
			if (staged[i]) {
				staged_bytes += tg[i].bytes;
				continue;
			}
			if (tg[i].bytes)
				ret = plan_target(&ld.p, &tg[i], reqs[i].dst);
		}
		if (ret)
			goto out;
	}
	l->stats.plan_ns += now_ns() - t0;
	ret = run_phase(&ld, &ld.p);
	if (ret)
		goto out;
	if (staged_bytes)
		ret = load_staged(&ld, reqs, tg, staged, n, staged_bytes);
out:
	if (ld.fds) {
		for (size_t i = 0; i < l->n_files; i++)
			if (ld.fds[i] >= 0)
				close(ld.fds[i]);
	}
	free(ld.fds);
	free(tg);
	free(staged);
	plan_free(&ld.p);
	return ret;
}
