/* SPDX-License-Identifier: MIT */
/*
 * wire.c - FUSE_DIRECT_IO_ALLOW_MMAP on the wire, for libfuse that does not
 * know the flag.
 *
 * Why this file exists: read-only handles of view files (and with
 * -o direct_read=all of stored files) are opened with direct_io so that
 * read() moves data from the daemon straight into the reader's buffer (one
 * copy instead of two, no page-cache pages to allocate and reclaim), while
 * mmap keeps working for loaders that map files (safetensors).  The kernel
 * lets shared mappings of direct_io files go through the page cache only
 * when the INIT reply carries FUSE_DIRECT_IO_ALLOW_MMAP (Linux 6.6);
 * without it such a mapping fails with ENODEV, so direct reads are then off
 * whatever the option says.  libfuse 3.16 negotiates the flag
 * (FUSE_CAP_DIRECT_IO_ALLOW_MMAP); older libfuse (Debian 12 ships 3.14)
 * neither knows nor forwards it.  There the daemon sets it itself, through
 * fuse_session_custom_io: wire_read notes whether the kernel's INIT request
 * offers the flag, wire_negotiate decides, and wire_writev sets the flag in
 * the reply to that INIT.  Every other message passes through untouched.
 *
 * Wire layouts (include/uapi/linux/fuse.h, protocol 7.36+): fuse_in_header
 * is 40 bytes with the opcode at byte 4 and the unique id at byte 8;
 * fuse_init_in has flags at byte 12 and flags2 at byte 16; fuse_out_header
 * is 16 bytes with the error at byte 4 and the unique id at byte 8;
 * fuse_init_out has flags at byte 12 and flags2 at byte 32.
 */
#include "config.h"

#include "wire.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/util.h"

#ifndef FUSE_CAP_DIRECT_IO_ALLOW_MMAP
#define WIRE_FUSE_INIT 26u
#define WIRE_INIT_EXT (1u << 30)         /* flags: flags2 is valid */
#define WIRE_ALLOW_MMAP_FLAGS2 (1u << 4) /* FUSE_DIRECT_IO_ALLOW_MMAP, 1ULL << 36 */
#define WIRE_IN_HEADER 40u
#define WIRE_OUT_HEADER 16u

static struct {
	/* Written by the thread that reads INIT, read by the one replying to
	 * it; the kernel sends nothing else until INIT is answered. */
	atomic_bool init_pending;     /* an INIT request is being answered */
	_Atomic uint64_t init_unique; /* its unique id */
	atomic_bool offered;          /* the kernel's INIT offers ALLOW_MMAP */
	atomic_bool want;             /* wire_negotiate: set it in the reply */
	atomic_bool granted;          /* set in the reply */
} wire;

static uint32_t wire_u32(const void *p, size_t off)
{
	uint32_t v;

	memcpy(&v, (const uint8_t *)p + off, sizeof(v));
	return v;
}

static ssize_t wire_read(int fd, void *buf, size_t len, void *userdata)
{
	ssize_t r = read(fd, buf, len);

	(void)userdata;
	if (r >= (ssize_t)(WIRE_IN_HEADER + 20) && wire_u32(buf, 4) == WIRE_FUSE_INIT) {
		uint64_t unique;
		uint32_t flags = wire_u32(buf, WIRE_IN_HEADER + 12);
		uint32_t flags2 = wire_u32(buf, WIRE_IN_HEADER + 16);

		memcpy(&unique, (uint8_t *)buf + 8, sizeof(unique));
		atomic_store(&wire.offered,
			     (flags & WIRE_INIT_EXT) && (flags2 & WIRE_ALLOW_MMAP_FLAGS2));
		atomic_store(&wire.init_unique, unique);
		atomic_store(&wire.init_pending, true);
	}
	return r;
}

static ssize_t wire_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	uint8_t out[256];
	struct iovec v[2];
	uint64_t unique;
	uint32_t flags2;
	ssize_t n;

	(void)userdata;
	if (!atomic_load(&wire.init_pending) || count != 2 || iov[0].iov_len != WIRE_OUT_HEADER ||
	    iov[1].iov_len < 36 || iov[1].iov_len > sizeof(out))
		return writev(fd, iov, count);
	memcpy(&unique, (uint8_t *)iov[0].iov_base + 8, sizeof(unique));
	if (unique != atomic_load(&wire.init_unique))
		return writev(fd, iov, count);
	atomic_store(&wire.init_pending, false);
	if (!atomic_load(&wire.want))
		return writev(fd, iov, count);
	if (wire_u32(iov[0].iov_base, 4) != 0 || !(wire_u32(iov[1].iov_base, 12) & WIRE_INIT_EXT)) {
		ckpt_warn("INIT reply without flags2: read-only files use the page cache");
		return writev(fd, iov, count);
	}
	memcpy(out, iov[1].iov_base, iov[1].iov_len);
	flags2 = wire_u32(out, 32) | WIRE_ALLOW_MMAP_FLAGS2;
	memcpy(out + 32, &flags2, sizeof(flags2));
	v[0] = iov[0];
	v[1].iov_base = out;
	v[1].iov_len = iov[1].iov_len;
	n = writev(fd, v, 2);
	if (n >= 0) {
		atomic_store(&wire.granted, true);
		ckpt_info("INIT reply: FUSE_DIRECT_IO_ALLOW_MMAP set");
	}
	return n;
}

static const struct fuse_custom_io wire_io = {
	.read = wire_read,
	.writev = wire_writev,
};
#endif

void wire_install(struct fuse_session *se, enum direct_read mode)
{
#ifndef FUSE_CAP_DIRECT_IO_ALLOW_MMAP
	if (mode != DIRECT_READ_NONE &&
	    fuse_session_custom_io(se, &wire_io, fuse_session_fd(se)) != 0)
		ckpt_warn("cannot hook the FUSE channel: read-only files use the page cache");
#else
	(void)se;
	(void)mode;
#endif
}

/* direct_io is used for read-only handles only once granted: a shared
 * mapping would fail otherwise, also if the INIT reply could not be amended
 * as wire_writev expects. */
bool wire_granted(void)
{
#ifdef FUSE_CAP_DIRECT_IO_ALLOW_MMAP
	return true; /* wire_negotiate turns direct reads on only when wanted */
#else
	return atomic_load(&wire.granted);
#endif
}

void wire_negotiate(struct fuse_conn_info *conn, enum direct_read mode, bool given,
		    bool *ret_views, bool *ret_files)
{
	bool offered, on;

#ifdef FUSE_CAP_DIRECT_IO_ALLOW_MMAP
	offered = conn->capable & FUSE_CAP_DIRECT_IO_ALLOW_MMAP;
	on = offered && mode != DIRECT_READ_NONE;
	if (on)
		conn->want |= FUSE_CAP_DIRECT_IO_ALLOW_MMAP;
#else
	(void)conn;
	offered = atomic_load(&wire.offered);
	on = offered && mode != DIRECT_READ_NONE;
	atomic_store(&wire.want, on);
#endif
	*ret_views = on;
	*ret_files = on && mode == DIRECT_READ_ALL;
	if (!offered && given && mode != DIRECT_READ_NONE)
		ckpt_warn("direct_read: this kernel cannot map direct_io files shared "
			  "(no FUSE_DIRECT_IO_ALLOW_MMAP, Linux < 6.6): read-only files use the "
			  "page cache");
	ckpt_info("read-only view files: %s; stored files: %s",
		  *ret_views ? "direct_io (once the INIT reply allows mmap)" : "page cache",
		  *ret_files ? "direct_io (once the INIT reply allows mmap)" : "page cache");
}
