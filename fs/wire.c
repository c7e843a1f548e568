/* SPDX-License-Identifier: MIT */
/*
 * wire.c - what ckptfs reads and amends on the FUSE wire, because libfuse
 * does not do it.
 *
 * 1. FUSE_DIRECT_IO_ALLOW_MMAP.  Read-only handles of view files (and with
 * -o direct_read=all of stored files) are opened with direct_io so that
 * read() moves data from the daemon straight into the reader's buffer (one
 * copy instead of two, no page-cache pages to allocate and reclaim), while
 * mmap keeps working for loaders that map files (safetensors).  The kernel
 * lets shared mappings of direct_io files go through the page cache only
 * when the INIT reply carries FUSE_DIRECT_IO_ALLOW_MMAP (Linux 6.6);
 * without it such a mapping fails with ENODEV, so direct reads are then off
 * whatever the option says.  libfuse 3.16 negotiates the flag
 * (FUSE_CAP_DIRECT_IO_ALLOW_MMAP); older libfuse (Debian 12 ships 3.14)
 * neither knows nor forwards it, so the daemon sets it in the INIT reply.
 *
 * 2. Clearing S_ISUID/S_ISGID (fuse_ops.c has the rules).  Files open for
 * writing use direct_io, and on a direct_io write the kernel does not clear
 * the bits itself: it sets FUSE_WRITE_KILL_SUIDGID in the request when the
 * writer lacks CAP_FSETID and leaves the clearing to the daemon.  With
 * FUSE_HANDLE_KILLPRIV_V2 (Linux 5.11) the kernel also flags an open with
 * O_TRUNC (FUSE_OPEN_KILL_SUIDGID), a truncate and a chown
 * (FATTR_KILL_SUIDGID, which libfuse passes on as FUSE_SET_ATTR_KILL_SUID)
 * instead of clearing the bits itself, which it cannot do for an open with
 * O_TRUNC that the daemon truncates (FUSE_ATOMIC_O_TRUNC).  libfuse passes
 * on neither request flag (fuse_file_info has no field for them) and knows
 * FUSE_HANDLE_KILLPRIV_V2 only from 3.17 on: wire_read notes the flag of
 * each write and open request for the thread that handles it (libfuse reads
 * a request and handles it on the same thread), and wire_writev sets
 * FUSE_HANDLE_KILLPRIV_V2 in the INIT reply where libfuse cannot.
 *
 * Both go through fuse_session_custom_io: wire_read notes what it needs
 * from requests (the INIT request's offers, the kill flags), wire_writev
 * amends the reply to INIT.  Every other message passes through untouched.
 * libfuse does not splice requests through a custom io without splice
 * hooks, so every request comes through wire_read.
 *
 * Wire layouts (include/uapi/linux/fuse.h, protocol 7.36+): fuse_in_header
 * is 40 bytes with the opcode at byte 4 and the unique id at byte 8;
 * fuse_init_in has flags at byte 12 and flags2 at byte 16; fuse_open_in
 * has open_flags at byte 4; fuse_write_in has write_flags at byte 20;
 * fuse_out_header is 16 bytes with the error at byte 4 and the unique id at
 * byte 8; fuse_init_out has flags at byte 12 and flags2 at byte 32.
 */
#include "config.h"

#include "wire.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/util.h"

#define WIRE_FUSE_OPEN 14u
#define WIRE_FUSE_WRITE 16u
#define WIRE_FUSE_INIT 26u
#define WIRE_INIT_EXT (1u << 30)           /* flags: flags2 is valid */
#define WIRE_KILLPRIV_V2 (1u << 28)        /* flags: FUSE_HANDLE_KILLPRIV_V2 */
#define WIRE_ALLOW_MMAP_FLAGS2 (1u << 4)   /* FUSE_DIRECT_IO_ALLOW_MMAP, 1ULL << 36 */
#define WIRE_OPEN_KILL_SUIDGID (1u << 0)   /* fuse_open_in.open_flags */
#define WIRE_WRITE_KILL_SUIDGID (1u << 2)  /* fuse_write_in.write_flags */
#define WIRE_IN_HEADER 40u
#define WIRE_OUT_HEADER 16u

static struct {
	/* Written by the thread that reads INIT, read by the one replying to
	 * it; the kernel sends nothing else until INIT is answered. */
	atomic_bool init_pending;     /* an INIT request is being answered */
	_Atomic uint64_t init_unique; /* its unique id */
	atomic_bool offered_mmap;     /* the kernel's INIT offers ALLOW_MMAP */
	atomic_bool offered_killpriv; /* ... and HANDLE_KILLPRIV_V2 */
	atomic_bool want_mmap;        /* set them in the reply */
	atomic_bool want_killpriv;
	atomic_bool granted;          /* ALLOW_MMAP was set (by libfuse or here) */
} wire;

/* The kill flag of the request being handled by this thread (wire_read sets
 * it for every request it reads). */
static _Thread_local bool wire_kill;

static uint32_t wire_u32(const void *p, size_t off)
{
	uint32_t v;

	memcpy(&v, (const uint8_t *)p + off, sizeof(v));
	return v;
}

static ssize_t wire_read(int fd, void *buf, size_t len, void *userdata)
{
	ssize_t r = read(fd, buf, len);
	uint32_t op;

	(void)userdata;
	wire_kill = false;
	if (r < (ssize_t)WIRE_IN_HEADER)
		return r;
	op = wire_u32(buf, 4);
	if (op == WIRE_FUSE_WRITE && r >= (ssize_t)(WIRE_IN_HEADER + 24)) {
		wire_kill = wire_u32(buf, WIRE_IN_HEADER + 20) & WIRE_WRITE_KILL_SUIDGID;
	} else if (op == WIRE_FUSE_OPEN && r >= (ssize_t)(WIRE_IN_HEADER + 8)) {
		wire_kill = wire_u32(buf, WIRE_IN_HEADER + 4) & WIRE_OPEN_KILL_SUIDGID;
	} else if (op == WIRE_FUSE_INIT && r >= (ssize_t)(WIRE_IN_HEADER + 20)) {
		uint64_t unique;
		uint32_t flags = wire_u32(buf, WIRE_IN_HEADER + 12);
		uint32_t flags2 = wire_u32(buf, WIRE_IN_HEADER + 16);

		memcpy(&unique, (uint8_t *)buf + 8, sizeof(unique));
		atomic_store(&wire.offered_mmap,
			     (flags & WIRE_INIT_EXT) && (flags2 & WIRE_ALLOW_MMAP_FLAGS2));
		atomic_store(&wire.offered_killpriv, flags & WIRE_KILLPRIV_V2);
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
	uint32_t flags, flags2;
	bool mmap_set = false;
	ssize_t n;

	(void)userdata;
	if (!atomic_load(&wire.init_pending) || count != 2 || iov[0].iov_len != WIRE_OUT_HEADER ||
	    iov[1].iov_len < 36 || iov[1].iov_len > sizeof(out))
		return writev(fd, iov, count);
	memcpy(&unique, (uint8_t *)iov[0].iov_base + 8, sizeof(unique));
	if (unique != atomic_load(&wire.init_unique))
		return writev(fd, iov, count);
	atomic_store(&wire.init_pending, false);
	if ((!atomic_load(&wire.want_mmap) && !atomic_load(&wire.want_killpriv)) ||
	    wire_u32(iov[0].iov_base, 4) != 0)
		return writev(fd, iov, count);
	memcpy(out, iov[1].iov_base, iov[1].iov_len);
	flags = wire_u32(out, 12);
	flags2 = wire_u32(out, 32);
	if (atomic_load(&wire.want_killpriv))
		flags |= WIRE_KILLPRIV_V2;
	if (atomic_load(&wire.want_mmap)) {
		if (flags & WIRE_INIT_EXT) {
			flags2 |= WIRE_ALLOW_MMAP_FLAGS2;
			mmap_set = true;
		} else {
			ckpt_warn("INIT reply without flags2: read-only files use the page cache");
		}
	}
	memcpy(out + 12, &flags, sizeof(flags));
	memcpy(out + 32, &flags2, sizeof(flags2));
	v[0] = iov[0];
	v[1].iov_base = out;
	v[1].iov_len = iov[1].iov_len;
	n = writev(fd, v, 2);
	if (n >= 0 && mmap_set) {
		atomic_store(&wire.granted, true);
		ckpt_debug("INIT reply: FUSE_DIRECT_IO_ALLOW_MMAP set");
	}
	if (n >= 0 && atomic_load(&wire.want_killpriv))
		ckpt_debug("INIT reply: FUSE_HANDLE_KILLPRIV_V2 set");
	return n;
}

static const struct fuse_custom_io wire_io = {
	.read = wire_read,
	.writev = wire_writev,
};

int wire_install(struct fuse_session *se)
{
	if (fuse_session_custom_io(se, &wire_io, fuse_session_fd(se)) != 0) {
		ckpt_err("cannot hook the FUSE channel: S_ISUID/S_ISGID could not be cleared "
			 "on writes by other users");
		return -1;
	}
	return 0;
}

/* direct_io is used for read-only handles only once granted: a shared
 * mapping would fail otherwise, also if the INIT reply could not be amended
 * as wire_writev expects. */
bool wire_granted(void)
{
	return atomic_load(&wire.granted);
}

void wire_negotiate(struct fuse_conn_info *conn, enum direct_read mode, bool given,
		    bool *ret_views, bool *ret_files)
{
	bool offered, on;

#ifdef FUSE_CAP_DIRECT_IO_ALLOW_MMAP
	offered = conn->capable & FUSE_CAP_DIRECT_IO_ALLOW_MMAP;
	on = offered && mode != DIRECT_READ_NONE;
	if (on) {
		conn->want |= FUSE_CAP_DIRECT_IO_ALLOW_MMAP;
		atomic_store(&wire.granted, true); /* libfuse sets it in the reply */
	}
#else
	(void)conn;
	offered = atomic_load(&wire.offered_mmap);
	on = offered && mode != DIRECT_READ_NONE;
	atomic_store(&wire.want_mmap, on);
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

bool wire_negotiate_killpriv(struct fuse_conn_info *conn)
{
	bool on;

	/* Version 1 (libfuse 3.14's default) leaves truncate and chown to the
	 * daemon without saying whether the caller has CAP_FSETID. */
	conn->want &= ~(unsigned)FUSE_CAP_HANDLE_KILLPRIV;
#ifdef FUSE_CAP_HANDLE_KILLPRIV_V2
	on = conn->capable & FUSE_CAP_HANDLE_KILLPRIV_V2;
	if (on)
		conn->want |= FUSE_CAP_HANDLE_KILLPRIV_V2;
#else
	on = atomic_load(&wire.offered_killpriv);
	atomic_store(&wire.want_killpriv, on);
#endif
	if (!on)
		ckpt_warn("this kernel has no FUSE_HANDLE_KILLPRIV_V2 (Linux < 5.11): an open "
			  "with O_TRUNC by another user does not clear S_ISUID/S_ISGID");
	return on;
}

bool wire_kill_suidgid(void)
{
	return wire_kill;
}
