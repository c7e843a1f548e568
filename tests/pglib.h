/* SPDX-License-Identifier: MIT */
/*
 * pglib.h - a PostgreSQL server of a Check suite's own, for the tests of the
 * PostgreSQL metadata engine (core/meta/postgres.c).
 *
 * tl_pg_start() makes a cluster in a new temporary directory (initdb as
 * the user "postgres" when the suite runs as root: PostgreSQL refuses to
 * run as root) and starts it on a Unix socket in that directory, with no
 * TCP listener.  A watchdog process holds the read end of a pipe whose
 * write end only the suite holds: when the suite closes it (tl_pg_stop) or
 * dies, however it dies, the watchdog stops the server (immediate mode) and
 * removes the directory.  So no server outlives its suite, also when a test
 * fails.  Use it as an unchecked fixture (it runs in the suite's parent
 * process); the forked tests inherit the server.
 *
 * The server's binaries come from $CKPT_PG_BINDIR, else `pg_config
 * --bindir` (Debian: /usr/lib/postgresql/N/bin), else $PATH.  A missing
 * server is a failure that names what is missing, never a skip.
 *
 * Errors: every function fails the running test (ck_assert) or, in a
 * fixture, exits the suite with a message.
 */
#ifndef CKPT_TEST_PGLIB_H
#define CKPT_TEST_PGLIB_H

#include <stddef.h>

/* Start the suite's server (once; later calls do nothing). */
void tl_pg_start(void);
/* Stop it and remove its directory (NULL-safe: nothing started, nothing done). */
void tl_pg_stop(void);
/* Make a new, empty database on the server and write its connection
 * string ("host=SOCKETDIR user=ckpt dbname=NAME") into buf. */
void tl_pg_new_db(char *buf, size_t len);
/* The server's directory (socket and data), "" when not started. */
const char *tl_pg_dir(void);
/* Stop the running server (fast shutdown: connections are closed) or
 * start it again on the same directory; for tests of a database restart.
 * tl_pg_server_start does nothing when the server answers (call it from
 * the set-up of such tests: a failed test may have left it stopped); both
 * fail the test on error. */
void tl_pg_server_stop(void);
void tl_pg_server_start(void);

#endif
