/* SPDX-License-Identifier: MIT */
/*
 * fuzz_pack.c - pack files: the file header, the record walk and record
 * reads (chunk/pack.h), and the decoding of the stored bytes of every record
 * read (chunk/compress.h).
 *
 * Input: MODE BODY.  The pack file is a 64-byte file header and then BODY;
 * MODE's bits:
 *   0x01  the file header is the first 64 bytes of BODY as they are (else a
 *         valid header of the harness's pack id and store uuid);
 *   0x02  every 8-aligned "CKRC" (record magic) after the file header gets
 *         its header checksum made right, so that the fuzzer reaches what
 *         follows the checksum;
 *   0x04  ... and its data checksum too, when its data lies in the file;
 *   0x08  the pack is also opened writable (which invalidates torn records)
 *         and a record appended;
 *   0x10  records are also read with O_DIRECT (ckpt_pack_read_direct), from a
 *         file in $TMPDIR (the others are in /dev/shm when it exists).
 * What must hold: a valid file header opens; the walk (ckpt_pack_scan)
 * reports records in increasing, non-overlapping order, each inside the
 * file; a record read back (ckpt_pack_read, ckpt_pack_rec_at) is the one the
 * walk reported, with the file's bytes, and a read of another length fails;
 * stored bytes decode or fail with -EIO/-EINVAL, never past the buffer;
 * after a writable open, a record appended reads back and the walk finds it
 * (a torn record before it cannot claim its bytes).
 */
#include "fuzz.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "base/hash.h"
#include "chunk/compress.h"
#include "chunk/pack.h"

#define PACK_ID 0x2aull
#define MAX_RECS 256
#define MAX_RAW (256u << 10) /* decode records of at most this raw length (see fuzz_compress.c) */

static const uint8_t store_uuid[16] = { 0xc4, 0x9b, 0x01, 0x77, 0x5e, 0x10, 0x42, 0x3a,
					0x8d, 0x66, 0x2f, 0x90, 0x13, 0xee, 0x05, 0x61 };
/* Where the pack file is written: [0] a memory file system when there is one
 * (/dev/shm: no disk writes, fdatasync is free), [1] $TMPDIR, for the runs
 * that read with O_DIRECT (which tmpfs refuses). */
static char dirs[2][4096];
static int dfds[2] = { -1, -1 };
static char name[CKPT_PACK_NAME_MAX];
static ckpt_decompressor *dec;

static void cleanup(void)
{
	for (int i = 0; i < 2; i++) {
		if (dfds[i] >= 0)
			unlinkat(dfds[i], name, 0);
		if (dirs[i][0])
			rmdir(dirs[i]);
	}
}

static void make_dir(int i, const char *parent)
{
	snprintf(dirs[i], sizeof(dirs[i]), "%s/ckpt-fuzz-pack.XXXXXX", parent);
	if (!mkdtemp(dirs[i])) {
		perror(dirs[i]);
		abort();
	}
	dfds[i] = open(dirs[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfds[i] < 0) {
		perror(dirs[i]);
		abort();
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *tmp = getenv("TMPDIR");

	fuzz_quiet();
	tmp = tmp && tmp[0] ? tmp : "/tmp";
	atexit(cleanup);
	make_dir(1, tmp);
	if (access("/dev/shm", W_OK) == 0)
		make_dir(0, "/dev/shm");
	else
		make_dir(0, tmp);
	if (ckpt_pack_name(PACK_ID, name, sizeof(name)) < 0 || ckpt_decompressor_new(&dec) < 0)
		abort();
	return 0;
}

static void put_file_hdr(uint8_t *h)
{
	memset(h, 0, CKPT_PACK_HDR_SIZE);
	memcpy(h, CKPT_PACK_MAGIC, CKPT_PACK_MAGIC_LEN);
	ckpt_put_le32(h + 8, CKPT_PACK_VERSION);
	ckpt_put_le32(h + 12, CKPT_PACK_HDR_SIZE);
	ckpt_put_le64(h + 16, PACK_ID);
	memcpy(h + 24, store_uuid, 16);
	ckpt_put_le64(h + 40, 1700000000);
	ckpt_put_le64(h + 48, ckpt_checksum(h, 48));
}

/* Make the checksums of every 8-aligned record magic right, last first (a
 * record's data may hold later record headers). */
static void fix_records(uint8_t *f, size_t fsize, bool data)
{
	if (fsize < CKPT_PACK_HDR_SIZE + CKPT_PACK_REC_HDR_SIZE)
		return;
	for (size_t off = (fsize - CKPT_PACK_REC_HDR_SIZE) / 8 * 8; off >= CKPT_PACK_HDR_SIZE;
	     off -= 8) {
		uint8_t *h = f + off;
		uint32_t len = ckpt_get_le32(h + 8);

		if (memcmp(h, CKPT_PACK_REC_MAGIC, CKPT_PACK_REC_MAGIC_LEN) != 0)
			continue;
		if (data && len <= fsize - off - CKPT_PACK_REC_HDR_SIZE)
			ckpt_put_le64(h + 32, ckpt_checksum(h + CKPT_PACK_REC_HDR_SIZE, len));
		ckpt_put_le64(h + 40, ckpt_checksum(h, 40));
	}
}

struct walk {
	uint64_t fsize, next;
	size_t n;
	uint64_t off[MAX_RECS];
	struct ckpt_pack_rec rec[MAX_RECS];
	uint64_t find; /* an offset that must be reported, or UINT64_MAX */
	bool found;
};

static int walk_cb(void *ud, uint64_t off, const struct ckpt_pack_rec *rec)
{
	struct walk *w = ud;

	FUZZ_CHECK(off >= w->next && off % CKPT_PACK_ALIGN == 0,
		   "record at %llu: after %llu, or unaligned", (unsigned long long)off,
		   (unsigned long long)w->next);
	FUZZ_CHECK(rec->stored_len <= CKPT_PACK_MAX_STORED &&
			   off + CKPT_PACK_REC_HDR_SIZE + rec->stored_len <= w->fsize,
		   "record at %llu of %u bytes past the end %llu", (unsigned long long)off,
		   rec->stored_len, (unsigned long long)w->fsize);
	w->next = off + ckpt_pack_rec_span(rec->stored_len);
	if (off == w->find)
		w->found = true;
	if (w->n < MAX_RECS) {
		w->off[w->n] = off;
		w->rec[w->n++] = *rec;
	}
	return 0;
}

static bool rec_eq(const struct ckpt_pack_rec *a, const struct ckpt_pack_rec *b)
{
	return a->codec == b->codec && a->stored_len == b->stored_len &&
	       a->raw_len == b->raw_len && memcmp(a->digest, b->digest, 16) == 0;
}

static void check_record(ckpt_pack *p, const uint8_t *f, size_t fsize, uint64_t off,
			 const struct ckpt_pack_rec *want, bool direct)
{
	struct ckpt_pack_rec rec, rec2;
	const uint8_t *stored = NULL;
	uint8_t *buf = malloc(want->stored_len ? want->stored_len : 1), *raw;
	int r, r2;

	if (!buf)
		return;
	r = ckpt_pack_read(p, off, want->stored_len, &rec, buf);
	FUZZ_CHECK(r == 0 || r == -EIO, "read at %llu: %d", (unsigned long long)off, r);
	r2 = ckpt_pack_rec_at(p, off, f + off, want->stored_len, true, &rec2, &stored);
	FUZZ_CHECK(r2 == r, "rec_at %d, read %d at %llu", r2, r, (unsigned long long)off);
	/* the header alone is checked when the data is trusted */
	r2 = ckpt_pack_read_trusting(p, off, want->stored_len, &rec2, buf);
	FUZZ_CHECK(r2 == 0, "trusting read of a walked record at %llu: %d",
		   (unsigned long long)off, r2);
	if (r == 0) {
		FUZZ_CHECK(rec_eq(&rec, want) && rec_eq(&rec2, want), "record at %llu differs",
			   (unsigned long long)off);
		FUZZ_CHECK(memcmp(buf, f + off + CKPT_PACK_REC_HDR_SIZE, want->stored_len) == 0 &&
				   stored == f + off + CKPT_PACK_REC_HDR_SIZE,
			   "stored bytes at %llu", (unsigned long long)off);
	}
	/* the O_DIRECT read of the store's chunk loads, where the file system has it
	 * (only with MODE 0x10: it writes the file's dirty pages back first, which
	 * makes a run several times slower) */
	if (direct) {
		size_t cap = ckpt_pack_direct_len(off, want->stored_len);
		uint8_t *al = NULL;

		if (posix_memalign((void **)&al, CKPT_PACK_DIRECT_ALIGN, cap) == 0) {
			r2 = ckpt_pack_read_direct(p, off, want->stored_len, true, al, cap, &rec2,
						   &stored);
			FUZZ_CHECK(r2 == r || r2 == -EOPNOTSUPP, "direct read %d, read %d at %llu", r2,
				   r, (unsigned long long)off);
			if (r2 == 0)
				FUZZ_CHECK(rec_eq(&rec2, want) &&
						   memcmp(stored, f + off + CKPT_PACK_REC_HDR_SIZE,
							  want->stored_len) == 0,
					   "direct read at %llu", (unsigned long long)off);
			free(al);
		}
	}
	/* the index's stored length must match the record's */
	if (want->stored_len >= 8) {
		r2 = ckpt_pack_read(p, off, want->stored_len - 8, NULL, buf);
		FUZZ_CHECK(r2 == -EIO, "read with a shorter length: %d", r2);
	}
	if (r == 0 && want->raw_len <= MAX_RAW) {
		raw = malloc(want->raw_len ? want->raw_len : 1);
		if (raw) {
			r2 = ckpt_decompress(dec, want->codec, buf, want->stored_len, raw,
					     want->raw_len);
			FUZZ_CHECK(r2 == 0 || r2 == -EIO || r2 == -ENOMEM ||
					   (r2 == -EINVAL && want->codec > CKPT_CODEC_ZSTD_SHUF4),
				   "decode of codec %u: %d", want->codec, r2);
			if (r2 == 0 && want->codec == CKPT_CODEC_RAW)
				FUZZ_CHECK(want->raw_len == want->stored_len &&
						   memcmp(raw, buf, want->raw_len) == 0,
					   "raw record");
			free(raw);
		}
	}
	free(buf);
	(void)fsize;
}

/* Open writable, append one record, read it back and find it by a walk. */
static void check_append(int dfd, const uint8_t *tail, size_t tail_len, uint64_t fsize)
{
	struct ckpt_pack_rec rec = { CKPT_CODEC_RAW, 0, 0, { 0 } }, back;
	struct walk *w = NULL;
	ckpt_pack *p = NULL;
	uint8_t buf[64];
	uint64_t off = 0;
	int r;

	r = ckpt_pack_open(dfd, PACK_ID, store_uuid, true, &p);
	FUZZ_CHECK(r == 0 || r == -ENOMEM, "writable open after a read-only one: %d", r);
	if (r < 0)
		return;
	rec.stored_len = rec.raw_len = (uint32_t)(tail_len < sizeof(buf) ? tail_len : sizeof(buf));
	memcpy(rec.digest, "fuzz-appended-rc", 16);
	r = ckpt_pack_append(p, &rec, tail, &off);
	FUZZ_CHECK(r == 0, "append: %d", r);
	FUZZ_CHECK(off >= fsize && off % CKPT_PACK_ALIGN == 0 && off < fsize + CKPT_PACK_ALIGN,
		   "appended at %llu after %llu bytes", (unsigned long long)off,
		   (unsigned long long)fsize);
	r = ckpt_pack_read(p, off, rec.stored_len, &back, buf);
	FUZZ_CHECK(r == 0 && rec_eq(&back, &rec) && memcmp(buf, tail, rec.stored_len) == 0,
		   "appended record reads back: %d", r);
	w = calloc(1, sizeof(*w));
	if (w) {
		w->fsize = off + CKPT_PACK_REC_HDR_SIZE + rec.stored_len;
		w->next = CKPT_PACK_HDR_SIZE;
		w->find = off;
		r = ckpt_pack_scan(p, walk_cb, w);
		FUZZ_CHECK(r == 0 || r == -ENOMEM, "walk after the append: %d", r);
		FUZZ_CHECK(r < 0 || w->found, "the walk does not reach the record appended at %llu",
			   (unsigned long long)off);
	}
	free(w);
	ckpt_pack_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t mode, *f;
	size_t fsize;
	struct walk *w = NULL;
	ckpt_pack *p = NULL;
	int fd, r, dfd;

	if (size < 1 || size > (8u << 20))
		return 0;
	mode = data[0];
	data++;
	size--;
	dfd = dfds[mode & 0x10 ? 1 : 0];
	if (mode & 1) {
		fsize = size;
		f = malloc(fsize ? fsize : 1);
		if (!f)
			return 0;
		memcpy(f, data, size);
	} else {
		fsize = CKPT_PACK_HDR_SIZE + size;
		f = malloc(fsize);
		if (!f)
			return 0;
		put_file_hdr(f);
		memcpy(f + CKPT_PACK_HDR_SIZE, data, size);
	}
	if (mode & 2)
		fix_records(f, fsize, mode & 4);
	fd = openat(dfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	FUZZ_CHECK(fd >= 0 && ckpt_pwrite_full(fd, f, fsize, 0) == 0, "write %s/%s",
		   dirs[mode & 0x10 ? 1 : 0], name);
	close(fd);

	r = ckpt_pack_open(dfd, PACK_ID, store_uuid, false, &p);
	if (!(mode & 1))
		FUZZ_CHECK(r == 0 || r == -ENOMEM, "a valid file header does not open: %d", r);
	FUZZ_CHECK(r == 0 || r == -EIO || r == -EPROTONOSUPPORT || r == -ENOMEM, "open: %d", r);
	if (r < 0)
		goto out;
	FUZZ_CHECK(ckpt_pack_size(p) >= fsize && ckpt_pack_size(p) % CKPT_PACK_ALIGN == 0,
		   "pack size %llu of a %zu-byte file", (unsigned long long)ckpt_pack_size(p),
		   fsize);
	w = calloc(1, sizeof(*w));
	if (!w)
		goto out;
	w->fsize = fsize;
	w->next = CKPT_PACK_HDR_SIZE;
	w->find = UINT64_MAX;
	r = ckpt_pack_scan(p, walk_cb, w);
	FUZZ_CHECK(r == 0 || r == -ENOMEM, "walk: %d", r);
	for (size_t i = 0; i < w->n; i++)
		check_record(p, f, fsize, w->off[i], &w->rec[i], mode & 0x10);
	ckpt_pack_free(p);
	p = NULL;
	if (mode & 8)
		check_append(dfd, data + size / 2, size - size / 2, fsize);
out:
	ckpt_pack_free(p);
	free(w);
	free(f);
	return 0;
}
