/* SPDX-License-Identifier: MIT */
/*
 * check_backend.c - every registered chunk backend (chunk/backend.h)
 * through its ops table: put, get (with and without the data check), span
 * reads (submitted and not), sync, units, seal, scan, reclaim, statfs,
 * describe, read-only opens; a damaged record gives -EIO, never wrong
 * bytes.
 *
 * Damaging a record needs to know where the backend keeps it: each backend
 * the suite runs has a damage hook in hooks[] below (a new backend adds
 * one, or the suite fails for it).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chunk/backend.h"
#include "chunk/pack.h"
#include "chunk/pack_backend.h"
#include "testlib.h"

static char dir[512];
static int dfd = -1;
static const uint8_t uuid[16] = "check_backend_u";
static uint64_t next_unit;

static int next_id(void *ud, uint64_t *ret_id)
{
	(void)ud;
	*ret_id = next_unit++;
	return 0;
}

/* Damage the stored bytes (header false) or the record header of loc. */
static void pack_damage(const struct ckpt_chunk_loc *loc, bool header)
{
	char path[700];
	uint8_t byte;
	off_t at = (off_t)ckpt_pack_loc_offset(loc) + (header ? 20 : CKPT_PACK_REC_HDR_SIZE + 3);
	int fd;

	snprintf(path, sizeof(path), "%s/packs/pack-%016" PRIx64 ".ckpk", dir, ckpt_pack_loc_id(loc));
	fd = open(path, O_RDWR);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &byte, 1, at), 1);
	byte ^= 0x40;
	ck_assert_int_eq(pwrite(fd, &byte, 1, at), 1);
	ck_assert_int_eq(fsync(fd), 0);
	close(fd);
}

static const struct {
	const char *name;
	void (*damage)(const struct ckpt_chunk_loc *loc, bool header);
} hooks[] = {
	{ "pack", pack_damage },
};

static void damage(const struct ckpt_chunk_backend_ops *ops, const struct ckpt_chunk_loc *loc,
		   bool header)
{
	for (size_t i = 0; i < sizeof(hooks) / sizeof(hooks[0]); i++) {
		if (!strcmp(hooks[i].name, ops->name)) {
			hooks[i].damage(loc, header);
			return;
		}
	}
	ck_abort_msg("backend %s has no damage hook in check_backend.c", ops->name);
}

static void setup(void)
{
	tl_test_dir(dir, sizeof(dir));
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	ck_assert_int_ge(dfd, 0);
	next_unit = 1;
}

static void teardown(void)
{
	if (dfd >= 0)
		close(dfd);
	dfd = -1;
	tl_dir_remove(dir);
}

static ckpt_chunk_backend *be_open(const struct ckpt_chunk_backend_ops *ops, bool writable,
				   bool create, uint64_t unit_max, bool sync_ra)
{
	struct ckpt_chunk_backend_conf conf = {
		.store_path = dir,
		.store_fd = dfd,
		.uuid = uuid,
		.writable = writable,
		.create = create,
		.unit_max = unit_max,
		.sync_readahead = sync_ra,
		.next_id = next_id,
	};
	ckpt_chunk_backend *b = NULL;
	char err[256] = "";
	int r = ops->open(&conf, &b, err, sizeof(err));

	ck_assert_msg(r == 0, "open %s: %d %s", ops->name, r, err);
	ck_assert_ptr_eq(b->ops, ops);
	return b;
}

/* A record of len random bytes (seed k), put as class cls in 1 or 2 pieces. */
static struct ckpt_chunk_loc put_rec(ckpt_chunk_backend *b, uint32_t k, size_t len,
				     enum ckpt_chunk_class cls, uint8_t **ret_data)
{
	uint8_t *data = tl_random_buf(len, k);
	ckpt_digest d = tl_digest(k);
	struct ckpt_chunk_rec rec = { .codec = 0, .stored_len = (uint32_t)len,
				      .raw_len = (uint32_t)len };
	struct iovec iov[2] = { { data, len / 3 }, { data + len / 3, len - len / 3 } };
	struct iovec one = { data, len };
	struct ckpt_chunk_loc loc;

	memcpy(rec.digest, d.bytes, sizeof(rec.digest));
	ck_assert_int_eq(k % 2 ? ckpt_cb_put(b, &rec, iov, 2, cls, &loc) :
				 ckpt_cb_put(b, &rec, &one, 1, cls, &loc),
			 0);
	ck_assert_uint_eq(loc.stored_len, len);
	ck_assert_uint_eq(loc.raw_len, len);
	ck_assert_uint_eq(loc.flags, 0);
	*ret_data = data;
	return loc;
}

/* get loc into an aligned buffer: 0 and the stored bytes compared with
 * want, or the error. */
static int get_cmp(ckpt_chunk_backend *b, const struct ckpt_chunk_loc *loc, bool check,
		   const uint8_t *want, uint32_t k)
{
	size_t need = ckpt_cb_get_len(b, loc);
	struct ckpt_chunk_rec rec;
	const uint8_t *stored = NULL;
	const char *why = NULL;
	void *buf;
	int r;

	ck_assert_uint_eq(need % CKPT_CHUNK_BUF_ALIGN, 0);
	ck_assert_uint_ge(ckpt_cb_get_len_max(b, loc->stored_len), need);
	ck_assert_int_eq(posix_memalign(&buf, CKPT_CHUNK_BUF_ALIGN, need), 0);
	r = ckpt_cb_get(b, loc, check, buf, need, &rec, &stored, &why);
	if (r == 0) {
		ckpt_digest d = tl_digest(k);

		ck_assert_uint_eq(rec.stored_len, loc->stored_len);
		ck_assert_uint_eq(rec.raw_len, loc->raw_len);
		ck_assert_uint_eq(rec.codec, loc->codec);
		ck_assert_mem_eq(rec.digest, d.bytes, 16);
		ck_assert_ptr_nonnull(stored);
		if (memcmp(stored, want, loc->stored_len) != 0)
			r = 1; /* wrong bytes */
	} else {
		ck_assert_ptr_nonnull(why);
	}
	free(buf);
	return r;
}

#define NREC 12

START_TEST(test_registry)
{
	ck_assert_ptr_nonnull(ckpt_chunk_backends[0]);
	ck_assert_ptr_eq(ckpt_chunk_backend_find(NULL), ckpt_chunk_backends[0]);
	ck_assert_ptr_eq(ckpt_chunk_backend_find("pack"), &ckpt_pack_backend_ops);
	ck_assert_ptr_null(ckpt_chunk_backend_find("no-such-backend"));
	for (size_t i = 0; ckpt_chunk_backends[i]; i++) {
		const struct ckpt_chunk_backend_ops *o = ckpt_chunk_backends[i];

		ck_assert_ptr_eq(ckpt_chunk_backend_find(o->name), o);
		ck_assert(o->open && o->free && o->put && o->sync && o->sync_all && o->get_len &&
			  o->get_len_max && o->get && o->span_begin && o->span_wait &&
			  o->span_end && o->span_warm && o->unit_of && o->rec_bytes &&
			  o->units && o->seal && o->reclaim && o->scan && o->statfs &&
			  o->stats && o->describe);
	}
}
END_TEST

/* put, sync, get with and without the data check, after a reopen too. */
START_TEST(test_put_get)
{
	const struct ckpt_chunk_backend_ops *ops = ckpt_chunk_backends[_i];
	ckpt_chunk_backend *b = be_open(ops, true, true, 1u << 30, false);
	struct ckpt_chunk_loc loc[NREC];
	uint8_t *data[NREC];
	char desc[CKPT_CHUNK_DESC_MAX];

	for (uint32_t k = 0; k < NREC; k++)
		loc[k] = put_rec(b, k + 1, 1000 + 7919 * k, k % 3 ? CKPT_CHUNK_FRESH : CKPT_CHUNK_MOVED,
				 &data[k]);
	ck_assert_int_eq(ckpt_cb_sync(b, loc, NREC), 0);
	ck_assert_int_eq(ckpt_cb_sync(b, loc, NREC), 0); /* covered already */
	for (uint32_t k = 0; k < NREC; k++) {
		ck_assert_int_eq(get_cmp(b, &loc[k], true, data[k], k + 1), 0);
		ck_assert_int_eq(get_cmp(b, &loc[k], false, data[k], k + 1), 0);
		ck_assert(ckpt_chunk_loc_same(&loc[k], &loc[k]));
		if (k > 0)
			ck_assert(!ckpt_chunk_loc_same(&loc[k], &loc[k - 1]));
		ck_assert_uint_ge(ckpt_cb_rec_bytes(b, &loc[k]), loc[k].stored_len);
	}
	/* the two classes go to different units */
	ck_assert_uint_ne(ckpt_cb_unit_of(b, &loc[0]), ckpt_cb_unit_of(b, &loc[1]));
	ckpt_cb_describe(b, &loc[3], desc, sizeof(desc));
	ck_assert_uint_gt(strlen(desc), 0);
	ck_assert_int_eq(ckpt_cb_sync_all(b), 0);
	ckpt_cb_free(b);
	/* read-only: the same bytes, and no writes */
	b = be_open(ops, false, false, 1u << 30, false);
	for (uint32_t k = 0; k < NREC; k++)
		ck_assert_int_eq(get_cmp(b, &loc[k], true, data[k], k + 1), 0);
	{
		struct ckpt_chunk_rec rec = { .stored_len = 1, .raw_len = 1 };
		struct iovec one = { data[0], 1 };
		struct ckpt_chunk_loc l;

		ck_assert_int_eq(ckpt_cb_put(b, &rec, &one, 1, CKPT_CHUNK_FRESH, &l), -EROFS);
	}
	ckpt_cb_free(b);
	ckpt_cb_free(NULL);
	for (int k = 0; k < NREC; k++)
		free(data[k]);
}
END_TEST

/* Span reads give the same bytes as get, submitted or not, in any order of
 * the items, and leave out nothing they could read. */
START_TEST(test_span)
{
	const struct ckpt_chunk_backend_ops *ops = ckpt_chunk_backends[_i];

	for (int sync_ra = 0; sync_ra < 2; sync_ra++) {
		ckpt_chunk_backend *b = be_open(ops, true, sync_ra == 0, 1u << 30, sync_ra);
		struct ckpt_chunk_span_item items[NREC], *o[NREC];
		struct ckpt_chunk_backend_stats st;
		uint8_t *data[NREC];

		ck_assert_int_eq(ckpt_cb_span_warm(b), 0);
		for (uint32_t k = 0; k < NREC; k++) {
			memset(&items[k], 0, sizeof(items[k]));
			items[k].loc = put_rec(b, 100 + k, 5000 + 333 * k, CKPT_CHUNK_FRESH, &data[k]);
			/* reverse order: the backend orders them itself */
			o[NREC - 1 - k] = &items[k];
		}
		for (int submit = 0; submit < 2; submit++) {
			ckpt_chunk_span *sp = NULL;

			ck_assert_int_eq(ckpt_cb_span_begin(b, o, NREC, submit, &sp), 0);
			ck_assert_ptr_nonnull(sp);
			ckpt_cb_span_wait(b, sp);
			for (uint32_t k = 0; k < NREC; k++) {
				ckpt_digest d = tl_digest(100 + k);

				ck_assert_ptr_nonnull(items[k].stored);
				ck_assert_mem_eq(items[k].stored, data[k], items[k].loc.stored_len);
				ck_assert_mem_eq(items[k].rec.digest, d.bytes, 16);
				ck_assert_uint_eq(items[k].rec.stored_len, items[k].loc.stored_len);
			}
			ckpt_cb_span_end(b, sp);
		}
		ckpt_cb_stats(b, &st);
		ck_assert_uint_gt(st.span_async + st.span_sync, 0);
		ck_assert_uint_eq(st.span_failed, 0);
		if (sync_ra)
			ck_assert_uint_eq(st.span_async, 0);
		/* every buffer is held: a third batch reads nothing (its items are
		 * read with get), and ending them frees the buffers again */
		{
			ckpt_chunk_span *sp[CKPT_CHUNK_SPAN_INFLIGHT + 1];

			for (int i = 0; i <= CKPT_CHUNK_SPAN_INFLIGHT; i++)
				ck_assert_int_eq(ckpt_cb_span_begin(b, o, 1, false, &sp[i]), 0);
			ckpt_cb_span_wait(b, sp[CKPT_CHUNK_SPAN_INFLIGHT]);
			ck_assert_ptr_null(o[0]->stored);
			for (int i = 0; i <= CKPT_CHUNK_SPAN_INFLIGHT; i++)
				ckpt_cb_span_end(b, sp[i]);
			ck_assert_int_eq(ckpt_cb_span_begin(b, o, 1, false, &sp[0]), 0);
			ckpt_cb_span_wait(b, sp[0]);
			ck_assert_ptr_nonnull(o[0]->stored);
			ckpt_cb_span_end(b, sp[0]);
		}
		ckpt_cb_span_end(b, NULL);
		ckpt_cb_free(b);
		for (int k = 0; k < NREC; k++)
			free(data[k]);
	}
}
END_TEST

/* A damaged record: get with the data check, and span reads of a damaged
 * header, give no bytes; a damaged header fails every read. */
START_TEST(test_damaged)
{
	const struct ckpt_chunk_backend_ops *ops = ckpt_chunk_backends[_i];
	ckpt_chunk_backend *b = be_open(ops, true, true, 1u << 30, false);
	struct ckpt_chunk_span_item items[3], *o[3];
	struct ckpt_chunk_loc loc[3];
	ckpt_chunk_span *sp;
	uint8_t *data[3];

	for (uint32_t k = 0; k < 3; k++)
		loc[k] = put_rec(b, 200 + k, 20000, CKPT_CHUNK_FRESH, &data[k]);
	ck_assert_int_eq(ckpt_cb_sync_all(b), 0);
	ckpt_cb_free(b);
	damage(ops, &loc[0], false); /* stored bytes */
	damage(ops, &loc[1], true);  /* record header */
	b = be_open(ops, true, false, 1u << 30, false);
	ck_assert_int_eq(get_cmp(b, &loc[0], true, data[0], 200), -EIO);
	/* without the data check the bytes may come back, but never as
	 * intact ones: the caller's digest check sees them differ */
	ck_assert_int_ne(get_cmp(b, &loc[0], false, data[0], 200), 0);
	ck_assert_int_eq(get_cmp(b, &loc[1], true, data[1], 201), -EIO);
	ck_assert_int_eq(get_cmp(b, &loc[1], false, data[1], 201), -EIO);
	ck_assert_int_eq(get_cmp(b, &loc[2], true, data[2], 202), 0);
	for (int k = 0; k < 3; k++) {
		memset(&items[k], 0, sizeof(items[k]));
		items[k].loc = loc[k];
		o[k] = &items[k];
	}
	ck_assert_int_eq(ckpt_cb_span_begin(b, o, 3, true, &sp), 0);
	ckpt_cb_span_wait(b, sp);
	ck_assert_ptr_null(items[1].stored);
	ck_assert_ptr_nonnull(items[2].stored);
	ck_assert_mem_eq(items[2].stored, data[2], 20000);
	if (items[0].stored) /* no data check in span reads: bytes differ */
		ck_assert(memcmp(items[0].stored, data[0], 20000) != 0);
	ckpt_cb_span_end(b, sp);
	ckpt_cb_free(b);
	for (int k = 0; k < 3; k++)
		free(data[k]);
}
END_TEST

/* The pack backend: a pack whose header names a format version this build
 * does not know (a damaged version field; the pack layer says
 * -EPROTONOSUPPORT) gives -EIO to get, as any damage does. */
START_TEST(test_pack_header_version)
{
	ckpt_chunk_backend *b = be_open(&ckpt_pack_backend_ops, true, true, 1u << 30, false);
	struct ckpt_chunk_loc loc;
	uint8_t *data, v[4] = { 2, 0, 0, 0 };
	char path[700];
	int fd;

	loc = put_rec(b, 500, 5000, CKPT_CHUNK_FRESH, &data);
	ck_assert_int_eq(ckpt_cb_sync_all(b), 0);
	ck_assert_int_eq(get_cmp(b, &loc, true, data, 500), 0);
	ckpt_cb_free(b);
	snprintf(path, sizeof(path), "%s/packs/pack-%016" PRIx64 ".ckpk", dir,
		 ckpt_pack_loc_id(&loc));
	fd = open(path, O_RDWR);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, v, 4, 8), 4); /* the version field (format.md 4) */
	close(fd);
	b = be_open(&ckpt_pack_backend_ops, true, false, 1u << 30, false);
	ck_assert_int_eq(get_cmp(b, &loc, true, data, 500), -EIO);
	ck_assert_int_eq(get_cmp(b, &loc, false, data, 500), -EIO);
	ckpt_cb_free(b);
	free(data);
}
END_TEST

struct scan_seen {
	const struct ckpt_chunk_loc *want;
	size_t n, found, other;
};

static int scan_cb(void *ud, const struct ckpt_chunk_loc *loc, const struct ckpt_chunk_rec *rec)
{
	struct scan_seen *s = ud;

	for (size_t i = 0; i < s->n; i++) {
		if (ckpt_chunk_loc_same(loc, &s->want[i])) {
			ck_assert_uint_eq(rec->stored_len, s->want[i].stored_len);
			s->found++;
			return 0;
		}
	}
	s->other++;
	return 0;
}

/* Units: listed with their bytes, sealed, scanned, reclaimed. */
START_TEST(test_units)
{
	const struct ckpt_chunk_backend_ops *ops = ckpt_chunk_backends[_i];
	ckpt_chunk_backend *b = be_open(ops, true, true, 30000, false);
	struct ckpt_chunk_loc loc[6], after;
	struct ckpt_chunk_unit *u;
	struct statvfs vfs;
	uint8_t *data[7];
	uint64_t first;
	size_t n;

	/* unit_max 30000: two records of 16000 bytes per unit */
	for (uint32_t k = 0; k < 6; k++)
		loc[k] = put_rec(b, 300 + k, 16000, CKPT_CHUNK_FRESH, &data[k]);
	ck_assert_int_eq(ckpt_cb_sync(b, loc, 6), 0);
	first = ckpt_cb_unit_of(b, &loc[0]);
	ck_assert_uint_eq(ckpt_cb_unit_of(b, &loc[1]), first);
	ck_assert_uint_ne(ckpt_cb_unit_of(b, &loc[2]), first);
	ck_assert_int_eq(ckpt_cb_units(b, &u, &n), 0);
	ck_assert_uint_eq(n, 3);
	for (size_t i = 0; i < n; i++) {
		ck_assert_uint_ge(u[i].bytes, u[i].payload);
		ck_assert_uint_ge(u[i].payload, 2 * ckpt_cb_rec_bytes(b, &loc[0]));
		if (i > 0)
			ck_assert_uint_gt(u[i].id, u[i - 1].id);
		ck_assert(u[i].active == (u[i].id == ckpt_cb_unit_of(b, &loc[5])));
	}
	free(u);
	/* scan finds the unit's records */
	{
		struct scan_seen seen = { loc, 6, 0, 0 };

		ck_assert_int_eq(ops->scan(b, first, scan_cb, &seen), 0);
		ck_assert_uint_eq(seen.found, 2);
		ck_assert_uint_eq(seen.other, 0);
	}
	/* seal: the next put starts a new unit */
	ck_assert_int_eq(ckpt_cb_seal(b, ckpt_cb_unit_of(b, &loc[5])), 0);
	after = put_rec(b, 399, 100, CKPT_CHUNK_FRESH, &data[6]);
	ck_assert_uint_gt(ckpt_cb_unit_of(b, &after), ckpt_cb_unit_of(b, &loc[5]));
	/* reclaim: gone from the list, its records unreadable */
	ck_assert_int_eq(ckpt_cb_reclaim(b, first), 0);
	ck_assert_int_eq(ckpt_cb_units(b, &u, &n), 0);
	ck_assert_uint_eq(n, 3);
	for (size_t i = 0; i < n; i++)
		ck_assert_uint_ne(u[i].id, first);
	free(u);
	ck_assert_int_eq(get_cmp(b, &loc[0], true, data[0], 300), -EIO);
	ck_assert_int_eq(get_cmp(b, &loc[2], true, data[2], 302), 0);
	ck_assert_int_eq(ckpt_cb_statfs(b, &vfs), 0);
	ck_assert_uint_gt(vfs.f_blocks, 0);
	ckpt_cb_free(b);
	/* reclaiming needs a writable backend */
	b = be_open(ops, false, false, 30000, false);
	ck_assert_int_eq(ckpt_cb_reclaim(b, ckpt_cb_unit_of(b, &loc[2])), -EROFS);
	ckpt_cb_free(b);
	for (int k = 0; k < 7; k++)
		free(data[k]);
}
END_TEST

/* Opening without the backend's layout fails with a message. */
START_TEST(test_open_missing)
{
	const struct ckpt_chunk_backend_ops *ops = ckpt_chunk_backends[_i];
	struct ckpt_chunk_backend_conf conf = {
		.store_path = dir, .store_fd = dfd, .uuid = uuid, .next_id = next_id,
	};
	ckpt_chunk_backend *b = NULL;
	char err[256] = "";

	ck_assert_int_lt(ops->open(&conf, &b, err, sizeof(err)), 0);
	ck_assert_ptr_null(b);
	ck_assert_ptr_nonnull(strstr(err, dir));
}
END_TEST

static Suite *backend_suite(void)
{
	Suite *s = suite_create("backend");
	TCase *tc = tcase_create("ops");
	int n = 0;

	while (ckpt_chunk_backends[n])
		n++;
	tl_tcase_dirs(tc, "check_backend-");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_registry);
	tcase_add_loop_test(tc, test_put_get, 0, n);
	tcase_add_loop_test(tc, test_span, 0, n);
	tcase_add_loop_test(tc, test_damaged, 0, n);
	tcase_add_test(tc, test_pack_header_version);
	tcase_add_loop_test(tc, test_units, 0, n);
	tcase_add_loop_test(tc, test_open_missing, 0, n);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tl_run(backend_suite());
}
