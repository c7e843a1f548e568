/* SPDX-License-Identifier: MIT */
/*
 * wire.h - FUSE_DIRECT_IO_ALLOW_MMAP, negotiated by libfuse where it knows
 * the flag and on the wire where it does not (see wire.c).
 *
 * Call order: wire_install() once after fuse_session_mount(), before the
 * session loop; wire_negotiate() from the init handler (before the INIT
 * reply goes out); wire_granted() from any thread afterwards.
 */
#ifndef CKPTFS_WIRE_H
#define CKPTFS_WIRE_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <stdbool.h>

#include "options.h"

/* Route the session's messages through the wire patch when libfuse cannot
 * negotiate the flag itself and mode asks for direct reads. */
void wire_install(struct fuse_session *se, enum direct_read mode);

/* From the init handler: ask for the flag if the kernel offers it and mode
 * wants direct reads.  *ret_views / *ret_files: read-only handles of view
 * files / of stored files may use direct_io (once wire_granted()). given:
 * -o direct_read was on the command line (a refusal is then warned about). */
void wire_negotiate(struct fuse_conn_info *conn, enum direct_read mode, bool given,
		    bool *ret_views, bool *ret_files);

/* Whether the kernel was told FUSE_DIRECT_IO_ALLOW_MMAP. */
bool wire_granted(void);

#endif
