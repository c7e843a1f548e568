/* SPDX-License-Identifier: MIT */
/*
 * pack.c - append-only pack files.  Format and contracts: see pack.h.
 *
 * Concurrency: p->lock protects the reservation state (size, the list of
 * appends in flight, synced, sync_err) and the write-behind marks (kicked,
 * kick_prev, dropped).  Data is written and read with positional I/O
 * outside any lock.  p->sync_lock serialises fdatasync calls so that
 * concurrent ckpt_pack_sync() callers can share one fdatasync.
 *
 * Write-behind: every CKPT_PACK_KICK bytes of completed appends, the appender
 * that crosses the mark starts writeback of that range with
 * sync_file_range(SYNC_FILE_RANGE_WRITE).  The disk then writes while more
 * data arrives, and a later fdatasync waits only for the tail.  It is a
 * hint: durability still comes only from ckpt_pack_sync().
 *
 * Page recycling: the same appender then waits for the writeback of the
 * range kicked before the previous one (it has had a whole kick's time to
 * reach the disk) and drops it from the page cache with
 * POSIX_FADV_DONTNEED.  A pack's share of the page cache thus stays at
 * about three kicks, and the pages it frees are the ones the next appends
 * get.  On a VM whose host reclaims guest memory that the guest has freed
 * (free page reporting), first touches of memory cost host page faults: a
 * large save appending into fresh page-cache pages took far more CPU and
 * time than one recycling them (docs/performance.md), and it is what made
 * the cost per GB of a save grow with its size.
 * Chunk reads use O_DIRECT (ckpt_pack_read_direct), so the dropped pages
 * are not missed.
 */
#include "chunk/pack.h"
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include "base/xxh.h"

/* File header field offsets (format version 1). */
#define HDR_OFF_MAGIC		0
#define HDR_OFF_VERSION		8
#define HDR_OFF_HDR_SIZE	12
#define HDR_OFF_ID		16
#define HDR_OFF_UUID		24
#define HDR_OFF_CTIME		40
#define HDR_OFF_CSUM		48
#define HDR_OFF_RESERVED	56
#define HDR_CSUM_LEN		48	/* checksum covers bytes 0..47 */

/* Record header field offsets. */
#define REC_OFF_MAGIC		0
#define REC_OFF_CODEC		4
#define REC_OFF_FLAGS		5
#define REC_OFF_HDR_SIZE	6
#define REC_OFF_STORED_LEN	8
#define REC_OFF_RAW_LEN		12
#define REC_OFF_DIGEST		16
#define REC_OFF_DATA_CSUM	32
#define REC_OFF_HDR_CSUM	40
#define REC_CSUM_LEN		40	/* checksum covers bytes 0..39 */

#define SCAN_WINDOW		(64 * 1024)	/* multiple of 8, > record header */
#define MAX_FILE_OFF		((uint64_t)INT64_MAX)
#define CKPT_PACK_PAGE		4096u	/* page-cache drops are rounded to this */

_Static_assert(SCAN_WINDOW % CKPT_PACK_ALIGN == 0, "scan window alignment");
_Static_assert(CKPT_PACK_HDR_SIZE % CKPT_PACK_ALIGN == 0, "header alignment");

/* One append in flight; lives on the appender's stack. */
struct inflight {
	uint64_t off;
	struct inflight *prev, *next;
};

struct ckpt_pack {
	int fd;
	_Atomic int dfd;		/* O_DIRECT fd for reads: -1 not opened yet, -2 unsupported */
	bool writable;
	uint64_t id;
	uint8_t uuid[16];
	pthread_mutex_t lock;
	pthread_mutex_t sync_lock;
	_Atomic uint64_t size;		/* end of reserved space; written under lock */
	/* In-flight appends in reservation order, hence sorted by offset:
	 * if_head is the oldest one. */
	struct inflight *if_head, *if_tail;
	uint64_t synced;		/* [0, synced) is durable */
	uint64_t kicked;		/* writeback started for [0, kicked) */
	uint64_t kick_prev;		/* where the latest kicked range starts */
	uint64_t dropped;		/* [0, dropped) was dropped from the page cache */
	int sync_err;			/* latched fdatasync error, or 0 */
};

static uint64_t round_up8(uint64_t v)
{
	return (v + (CKPT_PACK_ALIGN - 1)) & ~(uint64_t)(CKPT_PACK_ALIGN - 1);
}

uint64_t ckpt_pack_rec_span(uint32_t stored_len)
{
	return round_up8((uint64_t)CKPT_PACK_REC_HDR_SIZE + stored_len);
}

int ckpt_pack_name(uint64_t id, char *buf, size_t len)
{
	int n;

	if (!buf)
		return -EINVAL;
	if (len == 0)
		return -ENAMETOOLONG;
	n = snprintf(buf, len, "pack-%016" PRIx64 ".ckpk", id);
	if (n < 0 || (size_t)n >= len) {
		buf[0] = '\0';
		return -ENAMETOOLONG;
	}
	return 0;
}

/* preadv/pwritev until done; retries EINTR and short transfers.  Modifies
 * iov.  A read that hits end of file returns -EIO.  *ret_done (optional) gets
 * the number of bytes transferred, also on failure. */
static int rw_full(int fd, struct iovec *iov, int cnt, uint64_t off, bool write,
		   uint64_t *ret_done)
{
	uint64_t start = off;
	int r = 0;

	while (cnt > 0 && iov->iov_len == 0) {
		iov++;
		cnt--;
	}
	while (cnt > 0) {
		ssize_t n = write ? pwritev(fd, iov, cnt, (off_t)off) :
				    preadv(fd, iov, cnt, (off_t)off);
		size_t done;

		if (n < 0) {
			if (errno == EINTR)
				continue;
			r = -errno;
			break;
		}
		if (n == 0) {
			r = write ? -ENOSPC : -EIO;
			break;
		}
		off += (uint64_t)n;
		done = (size_t)n;
		while (cnt > 0 && done >= iov->iov_len) {
			done -= iov->iov_len;
			iov++;
			cnt--;
		}
		if (cnt > 0) {
			iov->iov_base = (uint8_t *)iov->iov_base + done;
			iov->iov_len -= done;
		}
	}
	if (ret_done)
		*ret_done = off - start;
	return r;
}

static void encode_file_hdr(uint8_t hdr[CKPT_PACK_HDR_SIZE], uint64_t id, const uint8_t uuid[16],
			    uint64_t ctime_s)
{
	memset(hdr, 0, CKPT_PACK_HDR_SIZE);
	memcpy(hdr + HDR_OFF_MAGIC, CKPT_PACK_MAGIC, CKPT_PACK_MAGIC_LEN);
	ckpt_put_le32(hdr + HDR_OFF_VERSION, CKPT_PACK_VERSION);
	ckpt_put_le32(hdr + HDR_OFF_HDR_SIZE, CKPT_PACK_HDR_SIZE);
	ckpt_put_le64(hdr + HDR_OFF_ID, id);
	memcpy(hdr + HDR_OFF_UUID, uuid, 16);
	ckpt_put_le64(hdr + HDR_OFF_CTIME, ctime_s);
	ckpt_put_le64(hdr + HDR_OFF_CSUM, XXH3_64bits(hdr, HDR_CSUM_LEN));
}

static int check_file_hdr(const uint8_t hdr[CKPT_PACK_HDR_SIZE], uint64_t id,
			  const uint8_t uuid[16])
{
	uint32_t version;
	const char *why;

	if (memcmp(hdr + HDR_OFF_MAGIC, CKPT_PACK_MAGIC, CKPT_PACK_MAGIC_LEN) != 0) {
		why = "bad magic";
		goto corrupt;
	}
	version = ckpt_get_le32(hdr + HDR_OFF_VERSION);
	if (version > CKPT_PACK_VERSION) {
		ckpt_warn("pack %016" PRIx64 ": format version %" PRIu32 " not supported",
			  id, version);
		return -EPROTONOSUPPORT;
	}
	if (version != CKPT_PACK_VERSION) {
		why = "bad version";
		goto corrupt;
	}
	if (ckpt_get_le32(hdr + HDR_OFF_HDR_SIZE) != CKPT_PACK_HDR_SIZE) {
		why = "bad header size";
		goto corrupt;
	}
	if (ckpt_get_le64(hdr + HDR_OFF_CSUM) != XXH3_64bits(hdr, HDR_CSUM_LEN)) {
		why = "header checksum mismatch";
		goto corrupt;
	}
	if (ckpt_get_le64(hdr + HDR_OFF_RESERVED) != 0) {
		why = "reserved bytes not zero";
		goto corrupt;
	}
	if (ckpt_get_le64(hdr + HDR_OFF_ID) != id) {
		why = "pack id mismatch";
		goto corrupt;
	}
	if (memcmp(hdr + HDR_OFF_UUID, uuid, 16) != 0) {
		why = "store uuid mismatch";
		goto corrupt;
	}
	return 0;
corrupt:
	ckpt_warn("pack %016" PRIx64 ": %s", id, why);
	return -EIO;
}

/* XXH3-64 of the concatenation of iov[0..cnt), or -ENOMEM. */
static int checksumv(const struct iovec *iov, int cnt, uint64_t *ret)
{
	XXH3_state_t *st;

	if (cnt == 1) {
		*ret = XXH3_64bits(iov[0].iov_base, iov[0].iov_len);
		return 0;
	}
	st = XXH3_createState(); /* size private to the library */
	if (!st)
		return -ENOMEM;
	(void)XXH3_64bits_reset(st);
	for (int i = 0; i < cnt; i++)
		(void)XXH3_64bits_update(st, iov[i].iov_base, iov[i].iov_len);
	*ret = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	return 0;
}

static void encode_rec_hdr(uint8_t hdr[CKPT_PACK_REC_HDR_SIZE], const struct ckpt_pack_rec *rec,
			   uint64_t data_csum)
{
	memcpy(hdr + REC_OFF_MAGIC, CKPT_PACK_REC_MAGIC, CKPT_PACK_REC_MAGIC_LEN);
	hdr[REC_OFF_CODEC] = rec->codec;
	hdr[REC_OFF_FLAGS] = 0;
	ckpt_put_le16(hdr + REC_OFF_HDR_SIZE, CKPT_PACK_REC_HDR_SIZE);
	ckpt_put_le32(hdr + REC_OFF_STORED_LEN, rec->stored_len);
	ckpt_put_le32(hdr + REC_OFF_RAW_LEN, rec->raw_len);
	memcpy(hdr + REC_OFF_DIGEST, rec->digest, 16);
	ckpt_put_le64(hdr + REC_OFF_DATA_CSUM, data_csum);
	ckpt_put_le64(hdr + REC_OFF_HDR_CSUM, XXH3_64bits(hdr, REC_CSUM_LEN));
}

/* Validate a record header and decode it.  Returns true if valid. */
static bool decode_rec_hdr(const uint8_t *hdr, struct ckpt_pack_rec *rec)
{
	if (memcmp(hdr + REC_OFF_MAGIC, CKPT_PACK_REC_MAGIC, CKPT_PACK_REC_MAGIC_LEN) != 0)
		return false;
	if (ckpt_get_le64(hdr + REC_OFF_HDR_CSUM) != XXH3_64bits(hdr, REC_CSUM_LEN))
		return false;
	if (hdr[REC_OFF_FLAGS] != 0 ||
	    ckpt_get_le16(hdr + REC_OFF_HDR_SIZE) != CKPT_PACK_REC_HDR_SIZE)
		return false;
	rec->stored_len = ckpt_get_le32(hdr + REC_OFF_STORED_LEN);
	if (rec->stored_len > CKPT_PACK_MAX_STORED)
		return false;
	rec->codec = hdr[REC_OFF_CODEC];
	rec->raw_len = ckpt_get_le32(hdr + REC_OFF_RAW_LEN);
	memcpy(rec->digest, hdr + REC_OFF_DIGEST, 16);
	return true;
}

static int fsync_dir(int dirfd)
{
	int fd, r = 0;

	/* Reopen so that O_PATH directory fds work too. */
	fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fsync(fd) < 0)
		r = -errno;
	close(fd);
	return r;
}

static int pack_alloc(int fd, uint64_t id, const uint8_t uuid[16], bool writable, uint64_t size,
		      ckpt_pack **ret_pack)
{
	ckpt_pack *p;

	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	if (pthread_mutex_init(&p->lock, NULL) != 0) {
		free(p);
		return -ENOMEM;
	}
	if (pthread_mutex_init(&p->sync_lock, NULL) != 0) {
		pthread_mutex_destroy(&p->lock);
		free(p);
		return -ENOMEM;
	}
	p->fd = fd;
	atomic_init(&p->dfd, -1);
	p->writable = writable;
	p->id = id;
	memcpy(p->uuid, uuid, 16);
	atomic_init(&p->size, size);
	*ret_pack = p;
	return 0;
}

int ckpt_pack_create(int dirfd, uint64_t id, const uint8_t uuid[16], ckpt_pack **ret_pack)
{
	char name[CKPT_PACK_NAME_MAX];
	uint8_t hdr[CKPT_PACK_HDR_SIZE];
	ckpt_pack *p = NULL;
	int fd, r;

	if (!uuid || !ret_pack)
		return -EINVAL;
	r = ckpt_pack_name(id, name, sizeof(name));
	if (r)
		return r;
	fd = openat(dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, CKPT_PACK_FILE_MODE);
	if (fd < 0)
		return -errno;

	encode_file_hdr(hdr, id, uuid, (uint64_t)time(NULL));
	r = ckpt_pwrite_full(fd, hdr, sizeof(hdr), 0);
	if (r)
		goto fail;
	if (fsync(fd) < 0) {
		r = -errno;
		goto fail;
	}
	r = fsync_dir(dirfd);
	if (r)
		goto fail;
	r = pack_alloc(fd, id, uuid, true, CKPT_PACK_HDR_SIZE, &p);
	if (r)
		goto fail;
	p->synced = CKPT_PACK_HDR_SIZE;
	*ret_pack = p;
	return 0;
fail:
	ckpt_err("pack %016" PRIx64 ": create failed: %s", id, strerror(-r));
	close(fd);
	unlinkat(dirfd, name, 0);
	return r;
}

/*
 * Search [from, fsize) for the next 8-aligned offset holding a valid record
 * header.  win is a SCAN_WINDOW buffer.  Returns 1 and sets *ret_off if
 * found, 0 if not, or -errno.
 */
static int find_next_hdr(int fd, uint8_t *win, uint64_t from, uint64_t fsize, uint64_t *ret_off)
{
	struct ckpt_pack_rec rec;
	uint64_t pos = from;
	int r;

	while (pos + CKPT_PACK_REC_HDR_SIZE <= fsize) {
		size_t len = (size_t)CKPT_MIN((uint64_t)SCAN_WINDOW, fsize - pos);
		size_t i;

		r = ckpt_pread_full(fd, win, len, pos);
		if (r == -EIO)
			return 0;	/* file shrank under us */
		if (r)
			return r;
		for (i = 0; i + CKPT_PACK_REC_HDR_SIZE <= len; i += CKPT_PACK_ALIGN) {
			if (decode_rec_hdr(win + i, &rec)) {
				*ret_off = pos + i;
				return 1;
			}
		}
		pos += i;	/* first position not checked yet */
	}
	return 0;
}

typedef int (*scan_cb)(void *ud, uint64_t offset, const struct ckpt_pack_rec *rec);

/*
 * The record walk behind ckpt_pack_scan() and the writable open.
 * fix_torn: zero every valid record header whose data extends past the end
 * of the file; *ret_fixed counts them.
 */
static int walk(ckpt_pack *p, scan_cb cb, void *ud, bool fix_torn, unsigned int *ret_fixed)
{
	static const uint8_t zero_hdr[CKPT_PACK_REC_HDR_SIZE];
	uint8_t hdr[CKPT_PACK_REC_HDR_SIZE];
	struct ckpt_pack_rec rec;
	uint8_t *win = NULL;
	uint64_t fsize, off = CKPT_PACK_HDR_SIZE;
	struct stat st;
	int r;

	if (fstat(p->fd, &st) < 0)
		return -errno;
	fsize = (uint64_t)st.st_size;

	while (off + CKPT_PACK_REC_HDR_SIZE <= fsize) {
		r = ckpt_pread_full(p->fd, hdr, sizeof(hdr), off);
		if (r == -EIO)
			break;	/* file shrank under us */
		if (r)
			goto out;
		if (decode_rec_hdr(hdr, &rec)) {
			uint64_t span = ckpt_pack_rec_span(rec.stored_len);

			if (off + CKPT_PACK_REC_HDR_SIZE + rec.stored_len <= fsize) {
				if (cb) {
					r = cb(ud, off, &rec);
					if (r)
						goto out;
				}
				off += span;
				continue;
			}
			/* Torn: valid header, data beyond end of file. */
			if (fix_torn) {
				ckpt_warn("pack %016" PRIx64 ": invalidating torn record at %"
					  PRIu64, p->id, off);
				r = ckpt_pwrite_full(p->fd, zero_hdr, sizeof(zero_hdr), off);
				if (r)
					goto out;
				(*ret_fixed)++;
			}
		}
		if (!win) {
			win = malloc(SCAN_WINDOW);
			if (!win) {
				r = -ENOMEM;
				goto out;
			}
		}
		r = find_next_hdr(p->fd, win, off + CKPT_PACK_ALIGN, fsize, &off);
		if (r < 0)
			goto out;
		if (r == 0)
			break;
	}
	r = 0;
out:
	free(win);
	return r;
}

int ckpt_pack_open(int dirfd, uint64_t id, const uint8_t uuid[16], bool writable,
		   ckpt_pack **ret_pack)
{
	char name[CKPT_PACK_NAME_MAX];
	uint8_t hdr[CKPT_PACK_HDR_SIZE];
	ckpt_pack *p = NULL;
	unsigned int fixed = 0;
	struct stat st;
	int fd, r;

	if (!uuid || !ret_pack)
		return -EINVAL;
	r = ckpt_pack_name(id, name, sizeof(name));
	if (r)
		return r;
	fd = openat(dirfd, name, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		r = -errno;
		goto fail;
	}
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size < CKPT_PACK_HDR_SIZE) {
		ckpt_warn("pack %016" PRIx64 ": not a regular file or too short", id);
		r = -EIO;
		goto fail;
	}
	r = ckpt_pread_full(fd, hdr, sizeof(hdr), 0);
	if (r)
		goto fail;
	r = check_file_hdr(hdr, id, uuid);
	if (r)
		goto fail;
	if ((uint64_t)st.st_size > MAX_FILE_OFF - CKPT_PACK_ALIGN) {
		r = -EFBIG;
		goto fail;
	}
	r = pack_alloc(fd, id, uuid, writable, round_up8((uint64_t)st.st_size), &p);
	if (r)
		goto fail;
	if (writable) {
		r = walk(p, NULL, NULL, true, &fixed);
		if (!r && fixed && fdatasync(fd) < 0)
			r = -errno;
		if (r)
			goto fail;
	}
	*ret_pack = p;
	return 0;
fail:
	if (p)
		ckpt_pack_free(p);	/* closes fd */
	else
		close(fd);
	return r;
}

void ckpt_pack_free(ckpt_pack *p)
{
	if (!p)
		return;
	close(p->fd);
	if (atomic_load(&p->dfd) >= 0)
		close(atomic_load(&p->dfd));
	pthread_mutex_destroy(&p->sync_lock);
	pthread_mutex_destroy(&p->lock);
	free(p);
}

uint64_t ckpt_pack_id(const ckpt_pack *p)
{
	return p ? p->id : 0;
}

uint64_t ckpt_pack_size(const ckpt_pack *p)
{
	return p ? atomic_load(&p->size) : 0;
}

int ckpt_pack_append(ckpt_pack *p, const struct ckpt_pack_rec *rec, const void *stored,
		     uint64_t *ret_offset)
{
	struct iovec one = { (void *)stored, rec ? rec->stored_len : 0 };

	if (!p || !rec || (!stored && rec->stored_len > 0))
		return -EINVAL;
	return ckpt_pack_appendv(p, rec, &one, 1, ret_offset);
}

int ckpt_pack_appendv(ckpt_pack *p, const struct ckpt_pack_rec *rec, const struct iovec *stored,
		      int nstored, uint64_t *ret_offset)
{
	static const uint8_t zeros[CKPT_PACK_REC_HDR_SIZE];
	uint8_t hdr[CKPT_PACK_REC_HDR_SIZE];
	struct inflight node = { 0 };
	struct iovec iov[CKPT_PACK_MAX_IOV + 2];
	uint64_t off, span, pad, written = 0, total = 0, csum;
	uint64_t stable, kick_from = 0, kick_len = 0, drop_from = 0, drop_len = 0;
	int r, cnt = 0;

	if (!p || !rec || !stored || nstored < 1 || nstored > CKPT_PACK_MAX_IOV)
		return -EINVAL;
	for (int i = 0; i < nstored; i++) {
		if (!stored[i].iov_base && stored[i].iov_len > 0)
			return -EINVAL;
		total += stored[i].iov_len;
	}
	if (rec->stored_len > CKPT_PACK_MAX_STORED || total != rec->stored_len)
		return -EINVAL;
	if (!p->writable)
		return -EBADF;

	r = checksumv(stored, nstored, &csum);
	if (r < 0)
		return r;
	encode_rec_hdr(hdr, rec, csum);
	span = ckpt_pack_rec_span(rec->stored_len);
	pad = span - CKPT_PACK_REC_HDR_SIZE - rec->stored_len;

	pthread_mutex_lock(&p->lock);
	r = p->sync_err;
	off = atomic_load(&p->size);
	if (!r && off > MAX_FILE_OFF - span)
		r = -EFBIG;
	if (r) {
		pthread_mutex_unlock(&p->lock);
		return r;
	}
	atomic_store(&p->size, off + span);
	node.off = off;
	node.prev = p->if_tail;
	if (p->if_tail)
		p->if_tail->next = &node;
	else
		p->if_head = &node;
	p->if_tail = &node;
	pthread_mutex_unlock(&p->lock);

	iov[cnt].iov_base = hdr;
	iov[cnt++].iov_len = sizeof(hdr);
	for (int i = 0; i < nstored; i++)
		if (stored[i].iov_len > 0)
			iov[cnt++] = stored[i];
	if (pad > 0) {
		iov[cnt].iov_base = (void *)zeros;
		iov[cnt++].iov_len = (size_t)pad;
	}
	r = rw_full(p->fd, iov, cnt, off, true, &written);
	if (r) {
		ckpt_err("pack %016" PRIx64 ": append at %" PRIu64 " failed after %" PRIu64
			 " bytes: %s", p->id, off, written, strerror(-r));
		/* A complete header before a failed data write would be valid and
		 * claim the hole; zero it (best effort, rewrites existing bytes). */
		if (written >= CKPT_PACK_REC_HDR_SIZE)
			(void)ckpt_pwrite_full(p->fd, zeros, sizeof(zeros), off);
	}

	pthread_mutex_lock(&p->lock);
	if (node.prev)
		node.prev->next = node.next;
	else
		p->if_head = node.next;
	if (node.next)
		node.next->prev = node.prev;
	else
		p->if_tail = node.prev;
	/* Everything before the oldest append still in flight is written. */
	stable = p->if_head ? p->if_head->off : atomic_load(&p->size);
	if (!r && stable >= p->kicked + CKPT_PACK_KICK) {
		uint64_t drop_to = p->kick_prev / CKPT_PACK_PAGE * CKPT_PACK_PAGE;

		kick_from = p->kicked;
		kick_len = stable - kick_from;
		p->kick_prev = kick_from;
		p->kicked = stable;
		if (drop_to > p->dropped) {
			drop_from = p->dropped;
			drop_len = drop_to - drop_from;
			p->dropped = drop_to;
		}
	}
	pthread_mutex_unlock(&p->lock);

	if (kick_len > 0)
		(void)sync_file_range(p->fd, (off_t)kick_from, (off_t)kick_len,
				      SYNC_FILE_RANGE_WRITE);
	if (drop_len > 0) {
		/* Both calls are hints; errors of the writeback itself surface
		 * in ckpt_pack_sync()'s fdatasync. */
		(void)sync_file_range(p->fd, (off_t)drop_from, (off_t)drop_len,
				      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
				      SYNC_FILE_RANGE_WAIT_AFTER);
		(void)posix_fadvise(p->fd, (off_t)drop_from, (off_t)drop_len,
				    POSIX_FADV_DONTNEED);
	}
	if (!r && ret_offset)
		*ret_offset = off;
	return r;
}

/* Under p->lock: 1 if [0, upto) is already durable, 0 if not, or the latched
 * error. */
static int sync_covered(const ckpt_pack *p, uint64_t upto)
{
	if (p->sync_err)
		return p->sync_err;
	return upto <= p->synced;
}

int ckpt_pack_sync(ckpt_pack *p, uint64_t upto)
{
	uint64_t stable;
	int r;

	if (!p)
		return -EINVAL;

	pthread_mutex_lock(&p->lock);
	upto = CKPT_MIN(upto, atomic_load(&p->size));
	r = sync_covered(p, upto);
	pthread_mutex_unlock(&p->lock);
	if (r)
		return r < 0 ? r : 0;

	pthread_mutex_lock(&p->sync_lock);
	pthread_mutex_lock(&p->lock);
	r = sync_covered(p, upto);	/* another caller may have synced meanwhile */
	/* Everything before the oldest append in flight has been written. */
	stable = p->if_head ? p->if_head->off : atomic_load(&p->size);
	pthread_mutex_unlock(&p->lock);
	if (r) {
		r = r < 0 ? r : 0;
		goto out;
	}

	if (fdatasync(p->fd) < 0) {
		r = -errno;
		ckpt_err("pack %016" PRIx64 ": fdatasync failed: %s", p->id, strerror(-r));
	}

	pthread_mutex_lock(&p->lock);
	if (r)
		p->sync_err = r;
	else if (stable > p->synced)
		p->synced = stable;
	pthread_mutex_unlock(&p->lock);
out:
	pthread_mutex_unlock(&p->sync_lock);
	return r;
}

/*
 * The checks of a record read back: header valid, its stored length the
 * expected one, and (data_csum) the checksum of the stored bytes.  Returns
 * NULL and fills *ret_rec, or the reason for a "corrupt" message.
 */
static const char *check_read_rec(const uint8_t *hdr, const uint8_t *stored,
				  uint32_t expected_stored_len, bool data_csum,
				  struct ckpt_pack_rec *ret_rec)
{
	if (!decode_rec_hdr(hdr, ret_rec))
		return "invalid record header";
	if (ret_rec->stored_len != expected_stored_len)
		return "stored length mismatch";
	if (data_csum &&
	    ckpt_get_le64(hdr + REC_OFF_DATA_CSUM) != XXH3_64bits(stored, expected_stored_len))
		return "data checksum mismatch";
	return NULL;
}

static int pack_read(ckpt_pack *p, uint64_t offset, uint32_t expected_stored_len,
		     struct ckpt_pack_rec *ret_rec, void *buf, bool data_csum);

int ckpt_pack_read(ckpt_pack *p, uint64_t offset, uint32_t expected_stored_len,
		   struct ckpt_pack_rec *ret_rec, void *buf)
{
	return pack_read(p, offset, expected_stored_len, ret_rec, buf, true);
}

int ckpt_pack_read_trusting(ckpt_pack *p, uint64_t offset, uint32_t expected_stored_len,
			    struct ckpt_pack_rec *ret_rec, void *buf)
{
	return pack_read(p, offset, expected_stored_len, ret_rec, buf, false);
}

static int pack_read(ckpt_pack *p, uint64_t offset, uint32_t expected_stored_len,
		     struct ckpt_pack_rec *ret_rec, void *buf, bool data_csum)
{
	uint8_t hdr[CKPT_PACK_REC_HDR_SIZE];
	struct ckpt_pack_rec rec;
	struct iovec iov[2];
	const char *why;
	int r;

	if (!p || (!buf && expected_stored_len > 0) ||
	    expected_stored_len > CKPT_PACK_MAX_STORED)
		return -EINVAL;
	if (offset < CKPT_PACK_HDR_SIZE || offset % CKPT_PACK_ALIGN != 0 ||
	    offset > MAX_FILE_OFF - ckpt_pack_rec_span(expected_stored_len))
		return -EINVAL;

	iov[0].iov_base = hdr;
	iov[0].iov_len = sizeof(hdr);
	iov[1].iov_base = buf;
	iov[1].iov_len = expected_stored_len;
	r = rw_full(p->fd, iov, expected_stored_len > 0 ? 2 : 1, offset, false, NULL);
	if (r == -EIO) {
		why = "file ends inside the record";
		goto corrupt;
	}
	if (r)
		return r;
	why = check_read_rec(hdr, buf, expected_stored_len, data_csum, &rec);
	if (why)
		goto corrupt;
	if (ret_rec)
		*ret_rec = rec;
	return 0;
corrupt:
	ckpt_warn("pack %016" PRIx64 ": record at %" PRIu64 ": %s", p->id, offset, why);
	return -EIO;
}

/* The pack's O_DIRECT descriptor, opened on first use; -1 if the file
 * system refuses O_DIRECT (tmpfs). */
static int direct_fd(ckpt_pack *p)
{
	int fd = atomic_load(&p->dfd), want = -1;
	char path[64];

	if (fd != -1)
		return fd >= 0 ? fd : -1;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", p->fd);
	fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (fd < 0)
		fd = -2;
	if (!atomic_compare_exchange_strong(&p->dfd, &want, fd)) {
		if (fd >= 0)
			close(fd);
		fd = want; /* another thread was first */
	}
	return fd >= 0 ? fd : -1;
}

/* Read [a, a + e) of fd (both multiples of the O_DIRECT alignment) into mem
 * until need bytes are in or the file ends; the number read, or -errno. */
static ssize_t read_aligned(int fd, uint8_t *mem, uint64_t a, size_t e, size_t need)
{
	size_t got = 0;

	while (got < need) {
		ssize_t n = pread(fd, mem + got, e - got, (off_t)(a + got));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno == EINVAL ? -EOPNOTSUPP : -errno; /* EINVAL: alignment refused */
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return (ssize_t)got;
}

int ckpt_pack_read_window(ckpt_pack *p, uint64_t offset, uint64_t need, uint8_t *buf, size_t cap,
			  uint64_t *ret_start, size_t *ret_len)
{
	const uint64_t blk = CKPT_PACK_DIRECT_ALIGN;
	uint64_t a;
	ssize_t got;
	int fd;

	if (!p || !buf || (uintptr_t)buf % blk != 0 || cap % blk != 0 || need > cap ||
	    offset % blk > cap - need || offset > MAX_FILE_OFF - cap)
		return -EINVAL;
	fd = direct_fd(p);
	if (fd < 0)
		return -EOPNOTSUPP;
	a = offset / blk * blk;
	got = read_aligned(fd, buf, a, cap, offset + need - a);
	if (got < 0)
		return (int)got;
	if ((uint64_t)got < offset + need - a) {
		ckpt_warn("pack %016" PRIx64 ": read at %" PRIu64 " (%" PRIu64 " bytes): %s", p->id,
			  offset, need, "the file ends before");
		return -EIO;
	}
	*ret_start = a;
	*ret_len = (size_t)got;
	return 0;
}

int ckpt_pack_direct_fd(ckpt_pack *p)
{
	int fd;

	if (!p)
		return -EINVAL;
	fd = direct_fd(p);
	return fd >= 0 ? fd : -EOPNOTSUPP;
}

int ckpt_pack_rec_at(ckpt_pack *p, uint64_t offset, const uint8_t *at,
		     uint32_t expected_stored_len, bool check_data, struct ckpt_pack_rec *ret_rec,
		     const uint8_t **ret_stored)
{
	struct ckpt_pack_rec rec;
	const char *why;

	if (!p || !at || expected_stored_len > CKPT_PACK_MAX_STORED)
		return -EINVAL;
	why = check_read_rec(at, at + CKPT_PACK_REC_HDR_SIZE, expected_stored_len, check_data, &rec);
	if (why) {
		ckpt_warn("pack %016" PRIx64 ": record at %" PRIu64 ": %s", p->id, offset, why);
		return -EIO;
	}
	if (ret_rec)
		*ret_rec = rec;
	*ret_stored = at + CKPT_PACK_REC_HDR_SIZE;
	return 0;
}

int ckpt_pack_read_direct(ckpt_pack *p, uint64_t offset, uint32_t expected_stored_len,
			  bool check_data, uint8_t *buf, size_t cap, struct ckpt_pack_rec *ret_rec,
			  const uint8_t **ret_stored)
{
	const uint64_t blk = CKPT_PACK_DIRECT_ALIGN;
	uint64_t start;
	size_t e, len;
	int r;

	if (!p || !buf || expected_stored_len > CKPT_PACK_MAX_STORED ||
	    offset < CKPT_PACK_HDR_SIZE || offset % CKPT_PACK_ALIGN != 0 ||
	    offset > MAX_FILE_OFF - ckpt_pack_rec_span(expected_stored_len) - 2 * blk)
		return -EINVAL;
	/* the record wherever it starts in its first block, and no more */
	e = ckpt_pack_direct_len(offset, expected_stored_len);
	if (cap < e)
		return -EINVAL;
	r = ckpt_pack_read_window(p, offset, CKPT_PACK_REC_HDR_SIZE + (uint64_t)expected_stored_len,
				  buf, e, &start, &len);
	if (r < 0)
		return r;
	return ckpt_pack_rec_at(p, offset, buf + (offset - start), expected_stored_len, check_data,
				ret_rec, ret_stored);
}

int ckpt_pack_scan(ckpt_pack *p, int (*cb)(void *ud, uint64_t offset,
					   const struct ckpt_pack_rec *rec),
		   void *ud)
{
	if (!p || !cb)
		return -EINVAL;
	return walk(p, cb, ud, false, NULL);
}
