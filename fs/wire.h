/* SPDX-License-Identifier: MIT */
/*
 * wire.h - what ckptfs needs from the FUSE wire that libfuse does not give
 * it (see wire.c): FUSE_DIRECT_IO_ALLOW_MMAP and FUSE_HANDLE_KILLPRIV_V2 in
 * the INIT reply where libfuse cannot negotiate them, and the kernel's
 * "clear S_ISUID/S_ISGID" flags on write and open requests, which libfuse
 * does not pass on.
 *
 * Call order: wire_install() once after fuse_session_mount(), before the
 * session loop; wire_negotiate() and wire_negotiate_killpriv() from the
 * init handler (before the INIT reply goes out); wire_granted() from any
 * thread afterwards; wire_kill_suidgid() from a request handler.
 */
#ifndef CKPTFS_WIRE_H
#define CKPTFS_WIRE_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <stdbool.h>

#include "options.h"

/* Route the session's messages through wire.c.  0, or -1 with a message
 * logged: the daemon must not serve the mount then (writes by other users
 * could not clear S_ISUID/S_ISGID). */
int wire_install(struct fuse_session *se);

/* From the init handler: ask for the flag if the kernel offers it and mode
 * wants direct reads.  *ret_views / *ret_files: read-only handles of view
 * files / of stored files may use direct_io (once wire_granted()). given:
 * -o direct_read was on the command line (a refusal is then warned about). */
void wire_negotiate(struct fuse_conn_info *conn, enum direct_read mode, bool given,
		    bool *ret_views, bool *ret_files);

/* Whether the kernel was told FUSE_DIRECT_IO_ALLOW_MMAP. */
bool wire_granted(void);

/* From the init handler: the daemon, not the kernel, clears S_ISUID and
 * S_ISGID where the kernel says so (FUSE_HANDLE_KILLPRIV_V2) if the kernel
 * offers it; otherwise the kernel clears them on truncate and chown itself
 * (FUSE_HANDLE_KILLPRIV off).  Returns whether V2 was asked for. */
bool wire_negotiate_killpriv(struct fuse_conn_info *conn);

/* Whether the request this thread is handling, a FUSE_WRITE or a FUSE_OPEN,
 * carries the kernel's flag to clear S_ISUID/S_ISGID first (the caller
 * lacks CAP_FSETID). */
bool wire_kill_suidgid(void);

#endif
