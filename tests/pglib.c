/* SPDX-License-Identifier: MIT */
/* pglib.c - a PostgreSQL server of a Check suite's own (pglib.h). */
#include "pglib.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char pgdir[64];      /* the server's directory */
static char bindir[512];    /* its binaries */
static int guard_fd = -1;   /* write end of the watchdog's pipe */
static pid_t guard_pid = -1;
static unsigned ndb;        /* databases made by this process */
static int server_up;       /* start_server succeeded (tl_pg_server_stop clears it) */

/* Fail the suite (fixtures cannot use ck_assert outside a test). */
static void die(const char *what)
{
	fprintf(stderr, "pglib: %s\n", what);
	exit(EXIT_FAILURE);
}

static void find_bindir(void)
{
	const char *env = getenv("CKPT_PG_BINDIR");
	FILE *p;

	if (env && env[0]) {
		snprintf(bindir, sizeof(bindir), "%s", env);
		return;
	}
	p = popen("pg_config --bindir 2>/dev/null", "r");
	if (p) {
		if (fgets(bindir, sizeof(bindir), p))
			bindir[strcspn(bindir, "\n")] = 0;
		pclose(p);
	}
	if (bindir[0]) {
		char initdb[600];
		snprintf(initdb, sizeof(initdb), "%s/initdb", bindir);
		if (access(initdb, X_OK) == 0)
			return;
	}
	bindir[0] = 0; /* $PATH */
}

/* Run a server program (as "postgres" when root) with its output in
 * PGDIR/NAME.log; 0 or the exit status.  args: the program's arguments,
 * one shell word each (no quoting needed: our own paths and options). */
static int run_pg(const char *prog, const char *log, const char *args)
{
	char cmd[2048];
	int st;

	snprintf(cmd, sizeof(cmd), "%s%s%s%s %s >%s/%s.log 2>&1",
		 geteuid() == 0 ? "runuser -u postgres -- " : "", bindir, bindir[0] ? "/" : "", prog,
		 args, pgdir, log);
	st = system(cmd);
	return st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void show_log(const char *log)
{
	char cmd[256];

	snprintf(cmd, sizeof(cmd), "cat %s/%s.log >&2", pgdir, log);
	if (system(cmd) != 0)
		fprintf(stderr, "pglib: no %s/%s.log\n", pgdir, log);
}

/* The watchdog: waits for EOF on fd (the suite closed it or died), then
 * stops the server and removes its directory. */
static void watchdog(int fd)
{
	char buf[64], cmd[1200];

	setsid(); /* not killed with the suite's process group */
	signal(SIGINT, SIG_IGN);
	signal(SIGTERM, SIG_IGN);
	while (read(fd, buf, sizeof(buf)) != 0 && errno == EINTR)
		;
	snprintf(cmd, sizeof(cmd),
		 "%s%s%spg_ctl -D %s/data -m immediate -w stop >/dev/null 2>&1; rm -rf %s",
		 geteuid() == 0 ? "runuser -u postgres -- " : "", bindir, bindir[0] ? "/" : "", pgdir,
		 pgdir);
	if (system(cmd) != 0)
		fprintf(stderr, "pglib: stopping the server in %s failed\n", pgdir);
	_exit(0);
}

static int start_server(void)
{
	char args[1024];
	int r;

	snprintf(args, sizeof(args),
		 "-D %s/data -l %s/server.log -w -t 60 -o \"-k %s -c listen_addresses= "
		 "-c fsync=off -c max_connections=200\" start",
		 pgdir, pgdir, pgdir);
	r = run_pg("pg_ctl", "pg_ctl", args);
	server_up = r == 0;
	return r;
}

void tl_pg_start(void)
{
	char args[1024];
	int p[2];

	if (pgdir[0])
		return;
	find_bindir();
	snprintf(pgdir, sizeof(pgdir), "/tmp/ckpt-pg-XXXXXX");
	if (!mkdtemp(pgdir))
		die("cannot make a temporary directory for the server");
	if (geteuid() == 0) {
		struct passwd *pw = getpwnam("postgres");
		if (!pw)
			die("running as root, and there is no user 'postgres' to run the server as "
			    "(install Debian's postgresql: tools/setup.sh)");
		if (chown(pgdir, pw->pw_uid, pw->pw_gid) < 0)
			die("cannot give the server's directory to the user 'postgres'");
	}
	/* the watchdog first, so that a failure below still cleans up */
	if (pipe2(p, O_CLOEXEC) < 0)
		die("pipe");
	fflush(NULL);
	guard_pid = fork();
	if (guard_pid < 0)
		die("fork");
	if (guard_pid == 0) {
		close(p[1]);
		watchdog(p[0]);
	}
	close(p[0]);
	guard_fd = p[1];
	snprintf(args, sizeof(args), "-D %s/data -A trust -U ckpt -E UTF8 --locale=C --no-sync",
		 pgdir);
	if (run_pg("initdb", "initdb", args) != 0) {
		show_log("initdb");
		die("initdb failed (log above); is Debian's postgresql installed? (tools/setup.sh; "
		    "or set CKPT_PG_BINDIR)");
	}
	if (start_server() != 0) {
		show_log("pg_ctl");
		show_log("server");
		die("the PostgreSQL server did not start (logs above)");
	}
}

void tl_pg_server_stop(void)
{
	char args[256];

	ck_assert_msg(pgdir[0], "tl_pg_server_stop without tl_pg_start");
	snprintf(args, sizeof(args), "-D %s/data -m fast -w -t 60 stop", pgdir);
	ck_assert_msg(run_pg("pg_ctl", "pg_ctl", args) == 0, "pg_ctl stop failed");
	server_up = 0;
}

void tl_pg_server_start(void)
{
	char admin[256];

	ck_assert_msg(pgdir[0], "tl_pg_server_start without tl_pg_start");
	snprintf(admin, sizeof(admin), "host=%s user=ckpt dbname=postgres", pgdir);
	if (PQping(admin) != PQPING_OK) /* not server_up: a failed test's child may have stopped it */
		ck_assert_msg(start_server() == 0, "the PostgreSQL server did not start again");
}

void tl_pg_stop(void)
{
	int st;

	if (guard_fd < 0)
		return;
	close(guard_fd);
	guard_fd = -1;
	while (waitpid(guard_pid, &st, 0) < 0 && errno == EINTR)
		;
	guard_pid = -1;
	pgdir[0] = 0;
}

const char *tl_pg_dir(void)
{
	return pgdir;
}

void tl_pg_new_db(char *buf, size_t len)
{
	char admin[256], sql[128], name[64];
	PGconn *c;
	PGresult *res;

	ck_assert_msg(pgdir[0], "tl_pg_new_db without tl_pg_start");
	snprintf(admin, sizeof(admin), "host=%s user=ckpt dbname=postgres", pgdir);
	snprintf(name, sizeof(name), "t%ld_%u", (long)getpid(), ndb++);
	c = PQconnectdb(admin);
	ck_assert_msg(PQstatus(c) == CONNECTION_OK, "connect %s: %s", admin, PQerrorMessage(c));
	snprintf(sql, sizeof(sql), "CREATE DATABASE %s", name);
	res = PQexec(c, sql);
	ck_assert_msg(PQresultStatus(res) == PGRES_COMMAND_OK, "%s: %s", sql,
		      PQresultErrorMessage(res));
	PQclear(res);
	PQfinish(c);
	ck_assert_int_lt(snprintf(buf, len, "host=%s user=ckpt dbname=%s", pgdir, name), (int)len);
}
