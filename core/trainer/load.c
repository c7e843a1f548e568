/* load.c: opening a checkpoint for loading: the completion check, the headers of every
 * *.safetensors file of the directory (never their data), and the index of global tensors by
 * (group, name) with their stored pieces.  ckptfs_load() itself is in load_io.c. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "base/util.h"
#include "trainer/load.h"
#include "trainer/trainer_int.h"
#include "views/shardmeta.h"

#define LD_FUSE_MAGIC 0x65735546 /* statfs f_type of FUSE file systems */

/* The message of the last failed ckptfs_loader_open() of this thread (there is no loader to
 * keep it in): ckptfs_loader_error(NULL, ...) returns it. */
static _Thread_local char open_errmsg[LD_ERR_MAX];
static _Thread_local int open_err;

int ld_fail(struct ckptfs_loader *l, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(l->errmsg, sizeof(l->errmsg), fmt, ap);
	va_end(ap);
	ckpt_str_one_line(l->errmsg);
	l->err = err;
	return err;
}

CKPTFS_EXPORT void ckptfs_loader_opts_init(struct ckptfs_loader_opts *opts)
{
	if (!opts)
		return;
	memset(opts, 0, sizeof(*opts));
	opts->io_threads = 4;
	opts->require_complete = 0;
}

CKPTFS_EXPORT void ckptfs_loader_free(struct ckptfs_loader *l)
{
	if (!l)
		return;
	for (size_t i = 0; i < l->n_files; i++)
		free(l->files[i].path);
	for (size_t i = 0; i < l->n_tensors; i++) {
		free(l->tensors[i].group);
		free(l->tensors[i].name);
	}
	free(l->files);
	free(l->tensors);
	free(l->pieces);
	free(l->dir);
	free(l);
}

/* require_complete: DIR holds the completion marker.  A save that did not finish leaves
 * DIR.partial and no DIR. */
static int check_complete(struct ckptfs_loader *l)
{
	const char *dir = l->dir;
	size_t n = strlen(dir);
	struct stat st;
	char *p;
	int ret = 0;

	while (n > 1 && dir[n - 1] == '/')
		n--;
	p = malloc(n + sizeof("/" LD_MARKER) + 8);
	if (!p)
		return ld_fail(l, -ENOMEM, "%s: out of memory", dir);
	if (stat(dir, &st) != 0) {
		int e = errno;

		memcpy(p, dir, n);
		memcpy(p + n, ".partial", sizeof(".partial"));
		if (e == ENOENT && stat(p, &st) == 0)
			ret = ld_fail(l, -ENOENT,
				      "%s: incomplete checkpoint: the save did not finish (%s exists, "
				      "no completion marker)", dir, p);
		else
			ret = ld_fail(l, -e, "%s: %s", dir, strerror(e));
		goto out;
	}
	memcpy(p, dir, n);
	memcpy(p + n, "/" LD_MARKER, sizeof("/" LD_MARKER));
	if (stat(p, &st) != 0) {
		int e = errno;

		if (e == ENOENT)
			ret = ld_fail(l, -EBADMSG, "%s: incomplete checkpoint: no %s", dir, LD_MARKER);
		else
			ret = ld_fail(l, -e, "%s: %s", p, strerror(e));
	}
out:
	free(p);
	return ret;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int has_suffix(const char *s, const char *suf)
{
	size_t n = strlen(s), m = strlen(suf);

	return n > m && memcmp(s + n - m, suf, m) == 0;
}

/* The names of the *.safetensors regular files directly in l->dir, sorted. */
static int list_files(struct ckptfs_loader *l, char ***ret_names, size_t *ret_n)
{
	DIR *d = opendir(l->dir);
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	int ret = 0;

	*ret_names = NULL;
	*ret_n = 0;
	if (!d)
		return ld_fail(l, -errno, "%s: %s", l->dir, strerror(errno));
	for (;;) {
		errno = 0;
		de = readdir(d);
		if (!de) {
			if (errno)
				ret = ld_fail(l, -errno, "%s: readdir: %s", l->dir, strerror(errno));
			break;
		}
		/* dot files are temporaries of a save in progress, never pieces */
		if (de->d_name[0] == '.' || !has_suffix(de->d_name, ".safetensors"))
			continue;
		if (de->d_type != DT_REG && de->d_type != DT_UNKNOWN && de->d_type != DT_LNK)
			continue;
		if (n == cap) {
			size_t nc = cap ? 2 * cap : 16;
			char **nn = realloc(names, nc * sizeof(*nn));

			if (!nn) {
				ret = ld_fail(l, -ENOMEM, "%s: out of memory", l->dir);
				break;
			}
			names = nn;
			cap = nc;
		}
		names[n] = strdup(de->d_name);
		if (!names[n]) {
			ret = ld_fail(l, -ENOMEM, "%s: out of memory", l->dir);
			break;
		}
		n++;
	}
	closedir(d);
	if (ret) {
		for (size_t i = 0; i < n; i++)
			free(names[i]);
		free(names);
		return ret;
	}
	if (n)
		qsort(names, n, sizeof(*names), cmp_str);
	*ret_names = names;
	*ret_n = n;
	return 0;
}

/* The header of one file, read by one of the open's threads. */
struct hslot {
	ckpt_st_header *h;      /* NULL: not a regular file (skipped) or failed */
	ckpt_shardmeta *m;
	int err;                /* 0 or the failure's errno (negative) */
	char msg[LD_ERR_MAX];   /* the failure, "FILE: reason" */
};

static int hfail(struct hslot *s, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int hfail(struct hslot *s, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(s->msg, sizeof(s->msg), fmt, ap);
	va_end(ap);
	ckpt_str_one_line(s->msg);
	s->err = err;
	return err;
}

/* Reads and validates the header of f->path (prefix, JSON, never the data; the size) and
 * parses its ckptfs metadata into s.  Touches only f and s (the open's threads run it). */
static int read_header(struct ld_file *f, struct hslot *s)
{
	char reason[512];
	uint8_t prefix[8];
	uint8_t *json = NULL;
	uint64_t n;
	struct stat st;
	struct statfs sfs;
	int fd, rc, ret = 0;

	fd = open(f->path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return hfail(s, -errno, "%s: %s", f->path, strerror(errno));
	if (fstat(fd, &st) != 0) {
		ret = hfail(s, -errno, "%s: %s", f->path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode))
		goto out; /* a directory named x.safetensors: not a piece */
	f->size = (uint64_t)st.st_size;
	if (fstatfs(fd, &sfs) == 0)
		f->fuse = sfs.f_type == LD_FUSE_MAGIC;
	rc = ckpt_pread_full(fd, prefix, sizeof(prefix), 0);
	if (rc) {
		ret = hfail(s, rc == -EIO ? -EINVAL : rc, "%s: %s", f->path,
			    rc == -EIO ? "not a safetensors file (shorter than 8 bytes)"
				       : strerror(-rc));
		goto out;
	}
	if (ckpt_st_header_len(prefix, &n) != 0 || n > f->size - 8) {
		ret = hfail(s, -EINVAL,
			    "%s: not a safetensors file (header length %llu, file size %llu)",
			    f->path, (unsigned long long)n, (unsigned long long)f->size);
		goto out;
	}
	json = malloc(n);
	if (!json) {
		ret = hfail(s, -ENOMEM, "%s: out of memory for a %llu-byte header", f->path,
			    (unsigned long long)n);
		goto out;
	}
	rc = ckpt_pread_full(fd, json, n, 8);
	if (rc) {
		ret = hfail(s, rc, "%s: reading the header: %s", f->path,
			    rc == -EIO ? "file ends inside it" : strerror(-rc));
		goto out;
	}
	rc = ckpt_st_parse(json, n, &s->h, reason, sizeof(reason));
	if (rc) {
		ret = hfail(s, rc, "%s: invalid safetensors header: %s", f->path, reason);
		goto out;
	}
	if (ckpt_st_check_file_size(s->h, f->size) != 0) {
		ret = hfail(s, -EINVAL,
			    "%s: file size %llu does not match its header (%llu bytes expected): "
			    "truncated or not a safetensors file", f->path,
			    (unsigned long long)f->size,
			    (unsigned long long)(8 + n + ckpt_st_data_len(s->h)));
		goto out;
	}
	f->data_start = 8 + n;
	rc = ckpt_shardmeta_parse(s->h, &s->m, reason, sizeof(reason));
	if (rc)
		ret = hfail(s, rc, "%s: invalid ckptfs metadata (docs/views.md section 3): %s",
			    f->path, reason);
out:
	if (ret) {
		ckpt_shardmeta_free(s->m);
		ckpt_st_header_free(s->h);
		s->m = NULL;
		s->h = NULL;
	}
	free(json);
	close(fd);
	return ret;
}

/* Header readers: each takes the next file. */
struct hread {
	struct ckptfs_loader *l;
	struct hslot *slots;
	atomic_size_t next;
};

static void *hread_worker(void *arg)
{
	struct hread *r = arg;

	for (;;) {
		size_t i = atomic_fetch_add(&r->next, 1);

		if (i >= r->l->n_files)
			return NULL;
		read_header(&r->l->files[i], &r->slots[i]);
	}
}

/* Reads every file's header with up to io_threads threads (on a FUSE mount each open and
 * read is a round trip; headers of many ranks' files add up); the first failure in file
 * order is the open's error, whatever order the threads met them in. */
static int read_headers(struct ckptfs_loader *l, struct hslot *slots)
{
	struct hread r = {.l = l, .slots = slots};
	pthread_t th[256];
	unsigned n = (unsigned)l->io_threads, started = 0;

	if (n > l->n_files / 2)
		n = (unsigned)(l->n_files / 2); /* a thread for fewer than 2 files does not pay */
	atomic_init(&r.next, 0);
	for (unsigned i = 1; i < n; i++) {
		if (tr_thread_start(&th[started], hread_worker, &r) != 0)
			break; /* fewer threads still read every header */
		started++;
	}
	hread_worker(&r);
	for (unsigned i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	for (size_t i = 0; i < l->n_files; i++)
		if (slots[i].err)
			return ld_fail(l, slots[i].err, "%s", slots[i].msg);
	return 0;
}

/* One stored tensor before grouping: names point into its file's header. */
struct entry {
	const char *group, *name;
	uint32_t file, order;
	enum ckpt_dtype dtype;
	struct ckpt_tensor_meta meta;
	uint64_t off, len;
};

static int cmp_entry(const void *a, const void *b)
{
	const struct entry *x = a, *y = b;
	int c = strcmp(x->group, y->group);

	if (c)
		return c;
	c = strcmp(x->name, y->name);
	if (c)
		return c;
	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	return x->order < y->order ? -1 : x->order > y->order;
}

static int pp_public(const struct ckpt_tensor_meta *m)
{
	if (!m->has_pp)
		return CKPTFS_PP_UNSET;
	switch (m->pp.kind) {
	case CKPT_PP_LAYER:
		return m->pp.layer > INT32_MAX ? INT32_MAX : (int)m->pp.layer;
	case CKPT_PP_FIRST:
		return CKPTFS_PP_FIRST;
	case CKPT_PP_LAST:
		return CKPTFS_PP_LAST;
	case CKPT_PP_ENDS:
		return CKPTFS_PP_ENDS;
	default:
		return CKPTFS_PP_ALL;
	}
}

static bool same_geom(const struct ckpt_piece_geom *a, const struct ckpt_piece_geom *b)
{
	unsigned n = a->box.ndim;

	return a->flat == b->flat && a->box.ndim == b->box.ndim &&
	       memcmp(a->box.off, b->box.off, n * sizeof(a->box.off[0])) == 0 &&
	       memcmp(a->box.shape, b->box.shape, n * sizeof(a->box.shape[0])) == 0 &&
	       (!a->flat || (a->flat_begin == b->flat_begin && a->flat_end == b->flat_end));
}

static bool boxes_meet(const struct ckpt_box *x, const struct ckpt_box *y)
{
	for (unsigned k = 0; k < x->ndim; k++) {
		if (x->off[k] >= y->off[k] + y->shape[k] || y->off[k] >= x->off[k] + x->shape[k])
			return false;
	}
	return true;
}

/* Whether two non-empty pieces may share an element: their boxes meet, unless both are
 * flat ranges of the same box that do not overlap. */
static bool may_overlap(const struct ld_piece *a, const struct ld_piece *b)
{
	if (!boxes_meet(&a->geom.box, &b->geom.box))
		return false;
	if (a->geom.flat && b->geom.flat && a->geom.box.ndim == b->geom.box.ndim &&
	    memcmp(a->geom.box.off, b->geom.box.off, sizeof(a->geom.box.off)) == 0 &&
	    memcmp(a->geom.box.shape, b->geom.box.shape, sizeof(a->geom.box.shape)) == 0)
		return a->geom.flat_begin < b->geom.flat_end && b->geom.flat_begin < a->geom.flat_end;
	return true;
}

static int cmp_flat_begin(const void *x, const void *y)
{
	const struct ld_piece *a = x, *b = y;

	return a->geom.flat_begin < b->geom.flat_begin ? -1 : a->geom.flat_begin > b->geom.flat_begin;
}

/* Pairwise tests up to this many pieces; beyond, only flat ranges of one box (FSDP over many
 * ranks) are recognized as disjoint, by a sort. */
#define LD_DISJOINT_PAIRS 64

/* Drops exact replicas (the first by file order stays) and empty pieces, and decides whether
 * the remaining pieces p[0..*n) are disjoint. */
static bool dedup_pieces(struct ld_piece *p, size_t *n)
{
	size_t m = 0;
	bool all_flat_one_box = true;

	for (size_t i = 0; i < *n; i++) {
		bool dup = p[i].len == 0;

		if (!dup && *n <= LD_DISJOINT_PAIRS * 4) {
			for (size_t j = 0; j < m && !dup; j++)
				dup = same_geom(&p[j].geom, &p[i].geom);
		}
		if (!dup)
			p[m++] = p[i];
	}
	*n = m;
	for (size_t i = 0; i < m; i++)
		all_flat_one_box = all_flat_one_box && p[i].geom.flat && p[0].geom.flat &&
				   same_geom(&(struct ckpt_piece_geom){.box = p[i].geom.box},
					     &(struct ckpt_piece_geom){.box = p[0].geom.box});
	if (m <= LD_DISJOINT_PAIRS) {
		for (size_t i = 0; i < m; i++)
			for (size_t j = i + 1; j < m; j++)
				if (may_overlap(&p[i], &p[j]))
					return false;
		return true;
	}
	if (all_flat_one_box) {
		struct ld_piece *s = malloc(m * sizeof(*s));
		bool ok = s != NULL;

		if (ok) {
			memcpy(s, p, m * sizeof(*s));
			qsort(s, m, sizeof(*s), cmp_flat_begin);
			for (size_t i = 1; i < m && ok; i++)
				ok = s[i - 1].geom.flat_end <= s[i].geom.flat_begin;
		}
		free(s);
		return ok;
	}
	return false;
}

/* Groups the sorted entries into global tensors; checks that the pieces of each agree on
 * dtype and global shape (else fails naming the tensor and both files). */
static int build_index(struct ckptfs_loader *l, struct entry *e, size_t n)
{
	size_t nt = 0;
	int ret = 0;

	size_t np = 0;

	l->pieces = calloc(n ? n : 1, sizeof(*l->pieces));
	l->tensors = calloc(n ? n : 1, sizeof(*l->tensors));
	if (!l->pieces || !l->tensors)
		return ld_fail(l, -ENOMEM, "%s: out of memory", l->dir);
	for (size_t i = 0; i < n;) {
		size_t j = i + 1;
		struct ld_tensor *t = &l->tensors[nt];

		while (j < n && strcmp(e[j].group, e[i].group) == 0 &&
		       strcmp(e[j].name, e[i].name) == 0)
			j++;
		t->group = strdup(e[i].group);
		t->name = strdup(e[i].name);
		nt++;
		l->n_tensors = nt;
		if (!t->group || !t->name)
			return ld_fail(l, -ENOMEM, "%s: out of memory", l->dir);
		t->dtype = e[i].dtype;
		t->ndim = e[i].meta.ndim;
		memcpy(t->shape, e[i].meta.global_shape, sizeof(t->shape));
		t->tp_dim = CKPTFS_TP_DIM_UNSET;
		t->pp = CKPTFS_PP_UNSET;
		t->first_piece = np;
		t->n_pieces = j - i;
		for (size_t k = i; k < j; k++) {
			const struct ckpt_tensor_meta *m = &e[k].meta;
			struct ld_piece *p = &l->pieces[np + (k - i)];

			if (e[k].dtype != t->dtype) {
				ret = ld_fail(l, -EINVAL,
					      "group '%s', tensor '%s': pieces disagree on dtype: %s in "
					      "%s, %s in %s", t->group, t->name,
					      ckpt_dtype_name(t->dtype), l->files[e[i].file].path,
					      ckpt_dtype_name(e[k].dtype), l->files[e[k].file].path);
				return ret;
			}
			if (m->ndim != t->ndim ||
			    memcmp(m->global_shape, t->shape, sizeof(t->shape)) != 0) {
				char a[160], b[160];

				ckpt_st_fmt_shape(a, sizeof(a), t->shape, t->ndim);
				ckpt_st_fmt_shape(b, sizeof(b), m->global_shape, m->ndim);
				return ld_fail(l, -EINVAL,
					       "group '%s', tensor '%s': pieces disagree on global "
					       "shape: %s in %s, %s in %s", t->group, t->name, a,
					       l->files[e[i].file].path, b, l->files[e[k].file].path);
			}
			if (t->tp_dim == CKPTFS_TP_DIM_UNSET && m->tp_dim != CKPT_TP_DIM_UNSET)
				t->tp_dim = m->tp_dim;
			if (t->pp == CKPTFS_PP_UNSET && m->has_pp)
				t->pp = pp_public(m);
			p->file = e[k].file;
			p->off = e[k].off;
			p->len = e[k].len;
			p->geom = m->geom;
		}
		t->disjoint = dedup_pieces(&l->pieces[np], &t->n_pieces);
		np += t->n_pieces;
		i = j;
	}
	l->n_pieces = np;
	return 0;
}

/* Parses every file's header and metadata into entries, then builds the index. */
static int index_files(struct ckptfs_loader *l)
{
	struct entry *e = NULL;
	size_t n = 0, cap = 0;
	struct hslot *hs;
	int ret = 0;

	hs = calloc(l->n_files ? l->n_files : 1, sizeof(*hs));
	if (!hs)
		return ld_fail(l, -ENOMEM, "%s: out of memory", l->dir);
	ret = read_headers(l, hs);
	if (ret)
		goto out;
	for (size_t i = 0; i < l->n_files; i++) {
		struct ld_file *f = &l->files[i];
		size_t nt;

		if (!hs[i].h)
			continue;
		nt = ckpt_st_tensor_count(hs[i].h);
		if (n + nt > cap) {
			size_t nc = cap ? 2 * cap : 64;
			struct entry *ne;

			while (nc < n + nt)
				nc *= 2;
			ne = realloc(e, nc * sizeof(*e));
			if (!ne) {
				ret = ld_fail(l, -ENOMEM, "%s: out of memory", l->dir);
				goto out;
			}
			e = ne;
			cap = nc;
		}
		for (size_t k = 0; k < nt; k++) {
			const struct ckpt_st_tensor *st = ckpt_st_tensor_at(hs[i].h, k);
			struct entry *x = &e[n];

			ret = ckpt_shardmeta_tensor(hs[i].m, st, &x->meta);
			if (ret) {
				ld_fail(l, ret, "%s: tensor '%s': cannot be placed (more than %d "
					"dimensions?)", f->path, st->name, CKPT_MAX_DIMS);
				goto out;
			}
			x->group = ckpt_shardmeta_group(hs[i].m);
			x->name = st->name;
			x->file = (uint32_t)i;
			x->order = (uint32_t)k;
			x->dtype = st->dtype;
			x->off = f->data_start + st->begin;
			x->len = st->end - st->begin;
			n++;
		}
	}
	if (n)
		qsort(e, n, sizeof(*e), cmp_entry);
	ret = build_index(l, e, n);
out:
	for (size_t i = 0; i < l->n_files; i++) {
		ckpt_shardmeta_free(hs[i].m);
		ckpt_st_header_free(hs[i].h);
	}
	free(hs);
	free(e);
	return ret;
}

CKPTFS_EXPORT int ckptfs_loader_open(const char *dir, const struct ckptfs_loader_opts *opts,
				     struct ckptfs_loader **ret_loader)
{
	struct ckptfs_loader_opts o;
	struct ckptfs_loader *l = NULL;
	char **names = NULL;
	size_t n_names = 0;
	int ret;

	if (ret_loader)
		*ret_loader = NULL;
	if (!dir || !*dir || !ret_loader) {
		snprintf(open_errmsg, sizeof(open_errmsg), "ckptfs_loader_open: %s",
			 !ret_loader ? "no ret_loader" : "no directory given");
		return open_err = -EINVAL;
	}
	ckptfs_loader_opts_init(&o);
	if (opts)
		o = *opts;
	if (o.io_threads <= 0)
		o.io_threads = 4;
	if (o.io_threads > 256)
		o.io_threads = 256;
	l = calloc(1, sizeof(*l));
	if (!l || !(l->dir = strdup(dir))) {
		snprintf(open_errmsg, sizeof(open_errmsg), "%s: out of memory", dir);
		free(l);
		return open_err = -ENOMEM;
	}
	l->io_threads = o.io_threads;
	if (o.require_complete) {
		ret = check_complete(l);
		if (ret)
			goto out;
	}
	ret = list_files(l, &names, &n_names);
	if (ret)
		goto out;
	l->files = calloc(n_names ? n_names : 1, sizeof(*l->files));
	if (!l->files) {
		ret = ld_fail(l, -ENOMEM, "%s: out of memory", dir);
		goto out;
	}
	for (size_t i = 0; i < n_names; i++) {
		size_t dl = strlen(dir), nl = strlen(names[i]);
		char *p = malloc(dl + nl + 2);

		if (!p) {
			ret = ld_fail(l, -ENOMEM, "%s: out of memory", dir);
			goto out;
		}
		memcpy(p, dir, dl);
		p[dl] = '/';
		memcpy(p + dl + 1, names[i], nl + 1);
		l->files[l->n_files++].path = p;
	}
	ret = index_files(l);
out:
	for (size_t i = 0; i < n_names; i++)
		free(names[i]);
	free(names);
	if (ret) {
		snprintf(open_errmsg, sizeof(open_errmsg), "%s", l->errmsg);
		open_err = ret;
		ckptfs_loader_free(l);
		return ret;
	}
	open_err = 0;
	open_errmsg[0] = '\0';
	l->err = 0;
	*ret_loader = l;
	return 0;
}

CKPTFS_EXPORT size_t ckptfs_loader_count(const struct ckptfs_loader *l)
{
	return l ? l->n_tensors : 0;
}

CKPTFS_EXPORT int ckptfs_loader_info(const struct ckptfs_loader *l, size_t index,
				     struct ckptfs_tensor_info *ret)
{
	const struct ld_tensor *t;

	if (!l || !ret)
		return -EINVAL;
	if (index >= l->n_tensors)
		return -ENOENT;
	t = &l->tensors[index];
	memset(ret, 0, sizeof(*ret));
	ret->group = t->group;
	ret->name = t->name;
	ret->dtype = ckpt_dtype_name(t->dtype);
	ret->ndim = (int)t->ndim;
	for (unsigned k = 0; k < t->ndim; k++)
		ret->shape[k] = (int64_t)t->shape[k];
	ret->tp_dim = t->tp_dim;
	ret->pp = t->pp;
	return 0;
}

static int cmp_key(const char *g, const char *n, const struct ld_tensor *t)
{
	int c = strcmp(g, t->group);

	return c ? c : strcmp(n, t->name);
}

long ld_find(const struct ckptfs_loader *l, const char *group, const char *name)
{
	size_t lo = 0, hi = l->n_tensors;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = cmp_key(group, name, &l->tensors[mid]);

		if (c == 0)
			return (long)mid;
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return -1;
}

CKPTFS_EXPORT int ckptfs_loader_find(const struct ckptfs_loader *l, const char *group,
				     const char *name)
{
	long i;

	if (!l || !name)
		return -EINVAL;
	i = ld_find(l, group ? group : CKPT_SHARDMETA_GROUP_DEFAULT, name);
	if (i < 0)
		return -ENOENT;
	return i > INT32_MAX ? -EOVERFLOW : (int)i;
}

/* l NULL: the last failed ckptfs_loader_open() of the calling thread. */
CKPTFS_EXPORT int ckptfs_loader_error(const struct ckptfs_loader *l, char *buf, size_t len)
{
	const char *msg = l ? l->errmsg : open_errmsg;
	int err = l ? l->err : open_err;

	if (buf && len) {
		snprintf(buf, len, "%s", err ? msg : "");
	}
	return err;
}

CKPTFS_EXPORT int ckptfs__loader_tune(struct ckptfs_loader *l, const struct ckptfs__load_tune *t)
{
	if (!l || !t)
		return -EINVAL;
	l->tune = *t;
	return 0;
}

CKPTFS_EXPORT int ckptfs__loader_stats(const struct ckptfs_loader *l,
				       struct ckptfs__load_stats *ret)
{
	if (!l || !ret)
		return -EINVAL;
	*ret = l->stats;
	return 0;
}
