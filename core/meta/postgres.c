/* SPDX-License-Identifier: MIT */
/*
 * postgres.c - the PostgreSQL metadata engine (engine.h), the only file that
 * calls libpq.  Daemons on several nodes share one store's metadata through
 * it (docs/cluster.md section 2).
 *
 * Where: a libpq connection string or URI ("host=/run/postgresql
 * dbname=ckpt", "postgresql://node1/ckpt?sslmode=verify-full"); the schema
 * it selects (search_path) holds two tables, created at an open with
 * create set (docs/format.md section 11):
 *   ckptfs_format (id, version, syncs)  one row: FORMAT_ID, FORMAT_VERSION
 *   ckptfs_kv (k bytea primary key, v bytea, ver bigint)
 * k and v are the records of meta/records.h as they are; bytea compares
 * like memcmp with the shorter first at a tie, RocksDB's bytewise order.
 * ver is the id of the transaction that last wrote the row.
 *
 * Transactions are optimistic, as engine.h requires (two transactions of one
 * thread may read one key for update; a lock held until commit would
 * deadlock them).  A transaction keeps, in the daemon, a table of the keys
 * it read for update (with the ver it saw, 0 for absent) and of its
 * buffered writes; gets look in it first.  The first write of a key that
 * was not read for update takes the server's snapshot
 * (pg_current_snapshot()).  Commit is one server transaction in READ
 * COMMITTED: lock the rows of every key of the table in key order (SELECT
 * ... FOR UPDATE), check that each tracked key still has the ver it was
 * read with and that no other key was written by a transaction the
 * snapshot does not see, then DELETE, UPDATE (rows that exist, locked) and
 * INSERT (rows that did not; one inserted meanwhile by another commit is a
 * unique violation) and COMMIT.  Any check failing, a unique violation, a
 * serialization failure or a deadlock is -EAGAIN and applies nothing.  Keys
 * and values travel as binary bytea[] arrays: a commit is five statements
 * whatever its size.
 *
 * Durability: a durable commit runs with synchronous_commit on; a
 * non-durable one with it off (the server has it when commit returns; a
 * crash of the server may lose the last fraction of a second).  sync
 * commits one durable update of the format row, whose WAL flush covers every
 * earlier commit.  flush is sync.
 *
 * Connections: a pool (lock); every call takes one for its duration, a
 * scan outside a transaction keeps one (in a REPEATABLE READ READ ONLY
 * transaction: its snapshot) until it is freed.  Every wait on the server
 * has a deadline (ckpt_engine_opts.timeout_ms per call, 30 s by default):
 * results are awaited with poll(2)
 * on the connection's socket.  A connection that breaks is dropped; the
 * call is retried on a new one, with a growing pause, until the deadline,
 * unless the failure came after a COMMIT was sent (its outcome is unknown:
 * -EIO).  Then -EIO.
 *
 * Thread-safety: as engine.h; the pool is the only shared state.
 */
#include "meta/engine.h"

#include <errno.h>
#include <libpq-fe.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/util.h"
#include "base/xxh.h"

#define FORMAT_ID "ckptfs-pg-kv"
/* 2: the store's shared-engine records ('S' sessions, 'Z' refcount-0
 * marks, 'U' unit owners; docs/format.md section 11.1) are kept by every
 * writer.  A version-1 table (no writer kept them) is upgraded by the first
 * read-write open; a version-1 ckptfs refuses version 2, so no daemon that
 * ignores the gc fence can join. */
#define FORMAT_VERSION 2
#define FORMAT_VERSION_STR "2"
#define PREFIX_MAX 512
#define POOL_KEEP 8          /* idle connections kept */
#define POOL_WARM 4          /* connections made at open */
#define PG_TIMEOUT_MS 30000  /* default deadline of one engine call */
#define SCAN_PAGE 512        /* rows per scan query */
#define BYTEA_OID 17
#define BYTEA_ARRAY_OID 1001

struct pge {
	struct ckpt_engine base;
	char *conninfo; /* as given */
	char *name;     /* for messages: conninfo, or its host and dbname when it holds a password */
	bool read_only;
	int64_t timeout_ms; /* deadline of one call */
	pthread_mutex_t lock;
	/* Protected by lock: */
	PGconn *idle[POOL_KEEP];
	unsigned nidle;
};

#define E_TRACKED 0x1u /* read for update: ver is what it saw */
#define E_PUT 0x2u     /* written: val */
#define E_DEL 0x4u     /* deleted */

struct pent {
	uint8_t *key;
	size_t klen;
	uint8_t *val; /* E_PUT */
	size_t vlen;
	uint64_t ver; /* E_TRACKED: the row's ver when read, 0 absent */
	unsigned flags;
	/* at commit: */
	bool present, visible;
	uint64_t cur_ver;
};

struct ptxn {
	struct ckpt_txn base;
	struct pent *v;
	size_t n, cap;
	uint32_t *slots; /* open addressing: index + 1 into v, 0 empty */
	size_t nslots;
	char *snap; /* pg_current_snapshot() at the first untracked write */
};

struct pscan {
	struct ckpt_scan base;
	PGconn *c; /* outside a transaction: the snapshot's connection */
	uint8_t lo[PREFIX_MAX];
	size_t lolen;
	bool lo_incl; /* lo itself may be returned (first page) */
	uint8_t hi[PREFIX_MAX];
	size_t hilen;
	bool has_hi;
	PGresult *page;
	int row, nrows;
	bool server_done;
	uint8_t *last; /* last server key seen (next page starts after it) */
	size_t lastlen;
	/* in a transaction: its writes in range, sorted, copied at scan_new */
	struct pent *bv;
	size_t bn, bi;
};

/* ---- small helpers ---- */

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int key_cmp(const void *a, size_t alen, const void *b, size_t blen)
{
	int c = memcmp(a, b, alen < blen ? alen : blen);

	if (c)
		return c;
	return alen < blen ? -1 : alen > blen;
}

static uint64_t get_be64(const char *p)
{
	return ckpt_get_be64((const uint8_t *)p);
}

/* ---- connections ---- */

static void drop_conn(PGconn *c)
{
	if (c)
		PQfinish(c);
}

/* Wait until c's socket is ready for ev or the deadline passes: 1 ready,
 * 0 timed out, -errno. */
static int wait_sock(PGconn *c, short ev, int64_t deadline)
{
	struct pollfd p = { .fd = PQsocket(c), .events = ev };
	int64_t left = deadline - now_ms();
	int r;

	if (p.fd < 0)
		return -EIO;
	if (left <= 0)
		return 0;
	do {
		r = poll(&p, 1, left > 1000000 ? 1000000 : (int)left);
	} while (r < 0 && errno == EINTR);
	return r < 0 ? -errno : r > 0;
}

/* A new connection, made within the deadline (libpq's connect_timeout
 * bounds each attempt; the user's settings win over these defaults). */
static PGconn *new_conn(struct pge *x, int64_t deadline, char *err, size_t errlen)
{
	static const char *const keys[] = { "connect_timeout", "keepalives_idle",
					    "keepalives_interval", "keepalives_count",
					    "application_name", "dbname", NULL };
	char tmo[16];
	const char *vals[7];
	PGconn *c;
	int64_t left = deadline - now_ms();

	snprintf(tmo, sizeof(tmo), "%d", (int)(left < 2000 ? 2 : left > 10000 ? 10 : left / 1000));
	vals[0] = tmo;
	vals[1] = "10";
	vals[2] = "5";
	vals[3] = "3";
	vals[4] = "ckptfs";
	vals[5] = x->conninfo;
	vals[6] = NULL;
	c = PQconnectdbParams(keys, vals, 1);
	if (!c || PQstatus(c) != CONNECTION_OK) {
		if (err)
			snprintf(err, errlen, "%s: cannot connect: %s", x->name,
				 c ? PQerrorMessage(c) : "out of memory");
		drop_conn(c);
		return NULL;
	}
	return c;
}

/* Take a connection from the pool, or make one, retrying until the
 * deadline.  NULL: -EIO, err says why (when given). */
static PGconn *take_conn(struct pge *x, int64_t deadline, char *err, size_t errlen)
{
	PGconn *c = NULL;
	unsigned pause_ms = 50;
	char why[512] = "";

	pthread_mutex_lock(&x->lock);
	if (x->nidle)
		c = x->idle[--x->nidle];
	pthread_mutex_unlock(&x->lock);
	if (c)
		return c;
	for (;;) {
		c = new_conn(x, deadline, why, sizeof(why));
		if (c || now_ms() + pause_ms >= deadline)
			break;
		{
			struct timespec ts = { pause_ms / 1000, (long)(pause_ms % 1000) * 1000000L };
			nanosleep(&ts, NULL);
		}
		if (pause_ms < 1000)
			pause_ms *= 2;
	}
	if (!c) {
		/* strip libpq's newline */
		size_t l = strlen(why);
		while (l && (why[l - 1] == '\n' || why[l - 1] == ' '))
			why[--l] = 0;
		if (err)
			snprintf(err, errlen, "%s", why);
		else
			ckpt_err("metadata: %s", why);
	}
	return c;
}

/* Give c back: kept when healthy and idle, else closed. */
static void put_conn(struct pge *x, PGconn *c)
{
	if (!c)
		return;
	if (PQstatus(c) != CONNECTION_OK || PQtransactionStatus(c) != PQTRANS_IDLE) {
		drop_conn(c);
		return;
	}
	pthread_mutex_lock(&x->lock);
	if (x->nidle < POOL_KEEP) {
		x->idle[x->nidle++] = c;
		c = NULL;
	}
	pthread_mutex_unlock(&x->lock);
	drop_conn(c);
}

/* ---- running statements ---- */

/* Errors of exec(): a broken connection is -ENOTCONN (retry on a new one
 * unless a COMMIT was in flight); the rest as mapped by res_errno. */
static int res_errno(struct pge *x, PGresult *res, PGconn *c, const char *what)
{
	const char *st = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

	if (PQstatus(c) != CONNECTION_OK)
		return -ENOTCONN;
	if (st) {
		if (!strcmp(st, "40001") || !strcmp(st, "40P01") || !strcmp(st, "23505"))
			return -EAGAIN;
		if (!strcmp(st, "42P01"))
			return -ENOENT;
		if (!strcmp(st, "53100"))
			return -ENOSPC;
		if (!strcmp(st, "25006"))
			return -EROFS;
		if (!strncmp(st, "08", 2) || !strcmp(st, "57P01") || !strcmp(st, "57P02") ||
		    !strcmp(st, "57P03"))
			return -ENOTCONN;
	}
	ckpt_err("metadata %s: %s: %s", x->name, what,
		 res ? PQresultErrorMessage(res) : PQerrorMessage(c));
	return -EIO;
}

/* Send a statement (params: binary unless fmts says otherwise; NULL sql
 * params: a simple query of possibly several statements) and wait for its
 * results until the deadline.  Returns the last result (caller clears) in
 * *ret, or a negative errno (-ENOTCONN: the connection broke, c is
 * unusable).  A timeout breaks the connection too (it may still be
 * running the statement): -ENOTCONN after the deadline reads as -EIO to
 * callers, because they retry only before it. */
static int exec(struct pge *x, PGconn *c, const char *sql, int n, const Oid *types,
		const char *const *vals, const int *lens, const int *fmts, int64_t deadline,
		PGresult **ret)
{
	PGresult *res, *last = NULL;
	int r = 0, ok, w;

	*ret = NULL;
	if (n < 0)
		ok = PQsendQuery(c, sql);
	else
		ok = PQsendQueryParams(c, sql, n, types, vals, lens, fmts, 1);
	if (!ok)
		return res_errno(x, NULL, c, "send");
	while ((ok = PQflush(c)) == 1) {
		w = wait_sock(c, POLLOUT | POLLIN, deadline);
		if (w <= 0)
			goto timeout;
		if (!PQconsumeInput(c))
			return res_errno(x, NULL, c, "send");
	}
	if (ok < 0)
		return res_errno(x, NULL, c, "send");
	for (;;) {
		while (PQisBusy(c)) {
			w = wait_sock(c, POLLIN, deadline);
			if (w <= 0)
				goto timeout;
			if (!PQconsumeInput(c))
				return res_errno(x, NULL, c, "receive");
		}
		res = PQgetResult(c);
		if (!res)
			break;
		if (r == 0) {
			ExecStatusType s = PQresultStatus(res);
			if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK)
				r = res_errno(x, res, c, sql);
		}
		PQclear(last);
		last = r == 0 ? res : NULL;
		if (r < 0)
			PQclear(res);
	}
	if (r < 0) {
		PQclear(last);
		return r;
	}
	*ret = last;
	return 0;
timeout:
	PQclear(last);
	ckpt_err("metadata %s: no answer within the deadline: giving up on the connection",
		 x->name);
	{ /* the connection is dropped by the caller (put_conn sees it busy) */
		PGcancel *cn = PQgetCancel(c);
		char buf[64];
		if (cn) {
			PQcancel(cn, buf, sizeof(buf));
			PQfreeCancel(cn);
		}
	}
	return -ETIMEDOUT;
}

/* Simple statement(s) without results. */
static int exec_simple(struct pge *x, PGconn *c, const char *sql, int64_t deadline)
{
	PGresult *res;
	int r = exec(x, c, sql, -1, NULL, NULL, NULL, NULL, deadline, &res);

	PQclear(res);
	return r;
}

/* Binary one-dimensional bytea[] of n elements (ptrs/lens), malloc'd. */
static char *bytea_array(size_t n, uint8_t *const *ptrs, const size_t *lens, int *ret_len)
{
	size_t len = 20, off = 0;
	char *b;

	for (size_t i = 0; i < n; i++)
		len += 4 + lens[i];
	if (len > INT32_MAX)
		return NULL;
	b = malloc(len);
	if (!b)
		return NULL;
#define PUT32(v)                                                                       \
	do {                                                                           \
		uint32_t v_ = (uint32_t)(v);                                           \
		b[off] = (char)(v_ >> 24);                                             \
		b[off + 1] = (char)(v_ >> 16);                                         \
		b[off + 2] = (char)(v_ >> 8);                                          \
		b[off + 3] = (char)v_;                                                 \
		off += 4;                                                              \
	} while (0)
	PUT32(1); /* dimensions */
	PUT32(0); /* no NULLs */
	PUT32(BYTEA_OID);
	PUT32(n);
	PUT32(1); /* lower bound */
	for (size_t i = 0; i < n; i++) {
		PUT32(lens[i]);
		memcpy(b + off, ptrs[i], lens[i]);
		off += lens[i];
	}
#undef PUT32
	*ret_len = (int)len;
	return b;
}

static int to_errno_final(int r)
{
	/* a broken connection or a timeout, once the deadline is past */
	return r == -ENOTCONN || r == -ETIMEDOUT ? -EIO : r;
}

static void pause_retry(unsigned *pause_ms)
{
	struct timespec ts = { *pause_ms / 1000, (long)(*pause_ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
	if (*pause_ms < 1000)
		*pause_ms *= 2;
}

/* Run one read statement with retries on broken connections until the
 * deadline; *ret is its result. */
static int query(struct pge *x, const char *sql, int n, const Oid *types,
		 const char *const *vals, const int *lens, const int *fmts, PGresult **ret)
{
	int64_t deadline = now_ms() + x->timeout_ms;
	unsigned pause_ms = 50;
	PGconn *c;
	int r;

	for (;;) {
		c = take_conn(x, deadline, NULL, 0);
		if (!c)
			return -EIO;
		r = exec(x, c, sql, n, types, vals, lens, fmts, deadline, ret);
		if (r == -ENOTCONN || r == -ETIMEDOUT) {
			drop_conn(c);
			if (r == -ETIMEDOUT || now_ms() + pause_ms >= deadline)
				return -EIO;
			pause_retry(&pause_ms);
			continue;
		}
		put_conn(x, c);
		return r;
	}
}

/* ---- open and close ---- */

static void pg_close(ckpt_engine *e)
{
	struct pge *x = (struct pge *)e;

	for (unsigned i = 0; i < x->nidle; i++)
		drop_conn(x->idle[i]);
	pthread_mutex_destroy(&x->lock);
	free(x->conninfo);
	free(x->name);
	free(x);
}

/* The name of where for messages: where itself unless it holds a
 * password, else its host and dbname. */
static char *display_name(const char *where)
{
	PQconninfoOption *opts = PQconninfoParse(where, NULL);
	const char *host = NULL, *db = NULL;
	bool pw = false;
	char *s = NULL;

	if (!opts)
		return strdup(where);
	for (PQconninfoOption *o = opts; o->keyword; o++) {
		if (!o->val)
			continue;
		if (!strcmp(o->keyword, "password") && o->val[0])
			pw = true;
		else if (!strcmp(o->keyword, "host"))
			host = o->val;
		else if (!strcmp(o->keyword, "dbname"))
			db = o->val;
	}
	if (!pw)
		s = strdup(where);
	else if (asprintf(&s, "host=%s dbname=%s (password not shown)", host ? host : "",
			  db ? db : "") < 0)
		s = NULL;
	PQconninfoFree(opts);
	return s;
}

static const char SQL_CREATE[] =
	"BEGIN;"
	"CREATE TABLE IF NOT EXISTS ckptfs_format (id text PRIMARY KEY, version integer NOT NULL,"
	" syncs bigint NOT NULL DEFAULT 0);"
	"CREATE TABLE IF NOT EXISTS ckptfs_kv (k bytea PRIMARY KEY, v bytea NOT NULL,"
	" ver bigint NOT NULL);"
	"INSERT INTO ckptfs_format (id, version) SELECT '" FORMAT_ID "', " FORMAT_VERSION_STR
	" WHERE NOT EXISTS (SELECT 1 FROM ckptfs_format);"
	"COMMIT";

/* Check (and with create, make) the schema. */
static int check_schema(struct pge *x, PGconn *c, bool create, char *err, size_t errlen)
{
	int64_t deadline = now_ms() + x->timeout_ms;
	PGresult *res = NULL;
	int r;

	r = exec(x, c, "SELECT id, version FROM ckptfs_format", 0, NULL, NULL, NULL, NULL,
		 deadline, &res);
	if (r == -ENOENT && create) {
		r = exec_simple(x, c, SQL_CREATE, deadline);
		if (r == -EAGAIN) /* another node created it at the same moment */
			r = exec_simple(x, c, "ROLLBACK", deadline);
		if (r == 0)
			r = exec(x, c, "SELECT id, version FROM ckptfs_format", 0, NULL, NULL,
				 NULL, NULL, deadline, &res);
	}
	if (r == -ENOENT) {
		snprintf(err, errlen, "%s: no ckptfs metadata there (no table ckptfs_format)",
			 x->name);
		return r;
	}
	if (r < 0) {
		snprintf(err, errlen, "%s: cannot read the metadata format: %s", x->name,
			 strerror(-to_errno_final(r)));
		return to_errno_final(r);
	}
	if (PQntuples(res) != 1 || PQgetlength(res, 0, 1) != 4 ||
	    strcmp(PQgetvalue(res, 0, 0), FORMAT_ID) != 0) {
		snprintf(err, errlen, "%s: ckptfs_format does not hold one '%s' row", x->name,
			 FORMAT_ID);
		r = -EIO;
	} else {
		const uint8_t *v = (const uint8_t *)PQgetvalue(res, 0, 1);
		uint32_t ver = (uint32_t)v[0] << 24 | (uint32_t)v[1] << 16 | (uint32_t)v[2] << 8 | v[3];
		if (ver == 1 && !x->read_only) {
			/* version 2 adds records only: mark the table as kept by
			 * writers that write them */
			r = exec_simple(x, c, "UPDATE ckptfs_format SET version = " FORMAT_VERSION_STR
					" WHERE version = 1", deadline);
			if (r < 0) {
				snprintf(err, errlen, "%s: cannot upgrade the metadata format to "
					 "version %d: %s", x->name, FORMAT_VERSION,
					 strerror(-to_errno_final(r)));
				r = to_errno_final(r);
			}
			ver = r == 0 ? FORMAT_VERSION : ver;
		}
		if (r == 0 && ver != FORMAT_VERSION && !(ver == 1 && x->read_only)) {
			snprintf(err, errlen,
				 "%s: metadata format version %u, this ckptfs knows version %d",
				 x->name, ver, FORMAT_VERSION);
			r = -EPROTONOSUPPORT;
		}
	}
	PQclear(res);
	return r;
}

static int pg_open(const char *where, const struct ckpt_engine_opts *o, ckpt_engine **ret,
		   char *err, size_t errlen)
{
	struct pge *x = calloc(1, sizeof(*x));
	char *perr = NULL;
	PQconninfoOption *opts;
	PGconn *c;
	int r;

	if (!x) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	x->base.ops = &ckpt_engine_postgres;
	x->read_only = o->read_only;
	x->timeout_ms = o->timeout_ms ? o->timeout_ms : PG_TIMEOUT_MS;
	pthread_mutex_init(&x->lock, NULL);
	x->conninfo = strdup(where);
	x->name = display_name(where);
	if (!x->conninfo || !x->name) {
		snprintf(err, errlen, "out of memory");
		pg_close(&x->base);
		return -ENOMEM;
	}
	opts = PQconninfoParse(where, &perr);
	if (!opts) {
		snprintf(err, errlen, "%s: not a PostgreSQL connection string: %s", x->name,
			 perr ? perr : "out of memory");
		PQfreemem(perr);
		pg_close(&x->base);
		return -EINVAL;
	}
	PQconninfoFree(opts);
	c = take_conn(x, now_ms() + x->timeout_ms, err, errlen);
	if (!c) {
		pg_close(&x->base);
		return -EIO;
	}
	r = check_schema(x, c, o->create && !o->read_only, err, errlen);
	put_conn(x, c);
	if (r < 0) {
		pg_close(&x->base);
		return r;
	}
	/* A new connection costs the server a process start and its caches a
	 * warm-up (milliseconds each): have a few ready before the first burst
	 * of requests (a mount's first listing opens several at once). */
	for (unsigned i = 1; i < POOL_WARM; i++) {
		c = new_conn(x, now_ms() + x->timeout_ms, NULL, 0);
		if (!c)
			break;
		put_conn(x, c);
	}
	*ret = &x->base;
	return 0;
}

/* ---- the transaction's table ---- */

static struct pent *tfind(struct ptxn *t, const void *key, size_t klen)
{
	size_t i;

	if (!t->nslots)
		return NULL;
	i = XXH3_64bits(key, klen) & (t->nslots - 1);
	for (;; i = (i + 1) & (t->nslots - 1)) {
		uint32_t s = t->slots[i];
		if (!s)
			return NULL;
		if (t->v[s - 1].klen == klen && memcmp(t->v[s - 1].key, key, klen) == 0)
			return &t->v[s - 1];
	}
}

static int tgrow(struct ptxn *t)
{
	size_t ns = t->nslots ? t->nslots * 2 : 64;
	uint32_t *sl = calloc(ns, sizeof(*sl));

	if (!sl)
		return -ENOMEM;
	for (size_t k = 0; k < t->n; k++) {
		size_t i = XXH3_64bits(t->v[k].key, t->v[k].klen) & (ns - 1);
		while (sl[i])
			i = (i + 1) & (ns - 1);
		sl[i] = (uint32_t)(k + 1);
	}
	free(t->slots);
	t->slots = sl;
	t->nslots = ns;
	return 0;
}

/* The entry of key, added (flags 0) if missing. */
static int tadd(struct ptxn *t, const void *key, size_t klen, struct pent **ret)
{
	struct pent *p = tfind(t, key, klen);
	size_t i;

	if (p) {
		*ret = p;
		return 0;
	}
	if ((t->n + 1) * 2 > t->nslots && tgrow(t) < 0)
		return -ENOMEM;
	if (t->n == t->cap) {
		size_t nc = t->cap ? t->cap * 2 : 16;
		struct pent *nv = realloc(t->v, nc * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		t->v = nv;
		t->cap = nc;
	}
	p = &t->v[t->n];
	memset(p, 0, sizeof(*p));
	p->key = malloc(klen ? klen : 1);
	if (!p->key)
		return -ENOMEM;
	memcpy(p->key, key, klen);
	p->klen = klen;
	i = XXH3_64bits(key, klen) & (t->nslots - 1);
	while (t->slots[i])
		i = (i + 1) & (t->nslots - 1);
	t->slots[i] = (uint32_t)(++t->n);
	*ret = p;
	return 0;
}

/* ---- reads ---- */

/* Committed value and ver of key: 1 found, 0 absent (fn not called). */
static int read_row(struct pge *x, const void *key, size_t klen, ckpt_engine_val_fn fn,
		    void *arg, uint64_t *ret_ver)
{
	static const Oid types[1] = { BYTEA_OID };
	const char *vals[1] = { key };
	int lens[1] = { (int)klen }, fmts[1] = { 1 };
	PGresult *res;
	int r = query(x, "SELECT v, ver FROM ckptfs_kv WHERE k = $1", 1, types, vals, lens, fmts,
		      &res);

	if (r < 0)
		return to_errno_final(r);
	if (PQntuples(res) == 0) {
		PQclear(res);
		*ret_ver = 0;
		return 0;
	}
	*ret_ver = get_be64(PQgetvalue(res, 0, 1));
	r = fn ? fn(arg, (const uint8_t *)PQgetvalue(res, 0, 0), (size_t)PQgetlength(res, 0, 0)) : 0;
	PQclear(res);
	return r < 0 ? r : 1;
}

static int pg_get(ckpt_engine *e, ckpt_txn *t, const void *key, size_t klen, unsigned flags,
		  ckpt_engine_val_fn fn, void *arg)
{
	struct pge *x = (struct pge *)e;
	struct ptxn *tx = (struct ptxn *)t;
	struct pent *p = tx ? tfind(tx, key, klen) : NULL;
	uint64_t ver;
	int r;

	if (p && (p->flags & E_PUT))
		return fn(arg, p->val, p->vlen);
	if (p && (p->flags & E_DEL))
		return -ENOENT;
	r = read_row(x, key, klen, fn, arg, &ver);
	if (r < 0)
		return r;
	if (tx && (flags & CKPT_TXN_FOR_UPDATE) && !(p && (p->flags & E_TRACKED))) {
		int a = tadd(tx, key, klen, &p);
		if (a < 0)
			return a;
		p->flags |= E_TRACKED;
		p->ver = ver;
	}
	return r ? 0 : -ENOENT;
}

/* Keys sorted by bytes, to find each returned row's index. */
struct many_idx {
	const uint8_t *const *keys;
	const size_t *klens;
};

static _Thread_local const struct many_idx *many_sort_ctx;

static int cmp_many(const void *a, const void *b)
{
	const struct many_idx *m = many_sort_ctx;
	size_t i = *(const size_t *)a, j = *(const size_t *)b;

	return key_cmp(m->keys[i], m->klens[i], m->keys[j], m->klens[j]);
}

static int pg_get_many(ckpt_engine *e, const uint8_t *const *keys, const size_t *klens, size_t n,
		       ckpt_engine_many_fn fn, void *arg)
{
	static const Oid types[1] = { BYTEA_ARRAY_OID };
	struct pge *x = (struct pge *)e;
	struct many_idx mi = { keys, klens };
	size_t *order = malloc(n * sizeof(*order));
	int alen = 0, fmts[1] = { 1 }, lens[1];
	char *arr = bytea_array(n, (uint8_t *const *)keys, klens, &alen);
	const char *vals[1] = { arr };
	PGresult *res = NULL;
	int r;

	if (!order || !arr) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		order[i] = i;
	many_sort_ctx = &mi;
	qsort(order, n, sizeof(*order), cmp_many);
	many_sort_ctx = NULL;
	lens[0] = alen;
	r = query(x, "SELECT k, v FROM ckptfs_kv WHERE k = ANY($1::bytea[])", 1, types, vals, lens,
		  fmts, &res);
	if (r < 0) {
		r = to_errno_final(r);
		goto out;
	}
	for (int row = 0; row < PQntuples(res) && r >= 0; row++) {
		const uint8_t *k = (const uint8_t *)PQgetvalue(res, row, 0);
		size_t kl = (size_t)PQgetlength(res, row, 0), lo = 0, hi = n;

		while (lo < hi) { /* the first sorted key not below k */
			size_t mid = lo + (hi - lo) / 2;
			if (key_cmp(keys[order[mid]], klens[order[mid]], k, kl) < 0)
				lo = mid + 1;
			else
				hi = mid;
		}
		if (lo == n || key_cmp(keys[order[lo]], klens[order[lo]], k, kl) != 0) {
			r = -EIO; /* a row for a key not asked for */
			break;
		}
		/* every index that asked for k (callers ask once; be exact anyway) */
		for (; lo < n && r >= 0 && key_cmp(keys[order[lo]], klens[order[lo]], k, kl) == 0;
		     lo++)
			r = fn(arg, order[lo], (const uint8_t *)PQgetvalue(res, row, 1),
			       (size_t)PQgetlength(res, row, 1));
	}
out:
	PQclear(res);
	free(arr);
	free(order);
	return r < 0 ? r : 0;
}

/* ---- transactions ---- */

static int pg_begin(ckpt_engine *e, ckpt_txn **ret)
{
	struct pge *x = (struct pge *)e;
	struct ptxn *t;

	if (x->read_only)
		return -EROFS;
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->base.engine = e;
	*ret = &t->base;
	return 0;
}

/* The snapshot that writes of untracked keys are checked against. */
static int take_snapshot(struct ptxn *t)
{
	struct pge *x = (struct pge *)t->base.engine;
	PGresult *res;
	int r;

	if (t->snap)
		return 0;
	r = query(x, "SELECT pg_current_snapshot()::text", 0, NULL, NULL, NULL, NULL, &res);
	if (r < 0)
		return to_errno_final(r);
	/* text of a binary-format result: pg_snapshot sent as text */
	t->snap = strndup(PQgetvalue(res, 0, 0), (size_t)PQgetlength(res, 0, 0));
	PQclear(res);
	return t->snap ? 0 : -ENOMEM;
}

static int write_ent(ckpt_txn *t, const void *key, size_t klen, const void *val, size_t vlen,
		     bool del)
{
	struct ptxn *tx = (struct ptxn *)t;
	struct pent *p;
	uint8_t *nv = NULL;
	int r = tadd(tx, key, klen, &p);

	if (r < 0)
		return r;
	if (!(p->flags & (E_TRACKED | E_PUT | E_DEL)) && (r = take_snapshot(tx)) < 0)
		return r;
	if (!del) {
		nv = malloc(vlen ? vlen : 1);
		if (!nv)
			return -ENOMEM;
		memcpy(nv, val, vlen);
	}
	free(p->val);
	p->val = nv;
	p->vlen = del ? 0 : vlen;
	p->flags = (p->flags & E_TRACKED) | (del ? E_DEL : E_PUT);
	return 0;
}

static int pg_put(ckpt_txn *t, const void *key, size_t klen, const void *val, size_t vlen)
{
	return write_ent(t, key, klen, val, vlen, false);
}

static int pg_del(ckpt_txn *t, const void *key, size_t klen)
{
	return write_ent(t, key, klen, NULL, 0, true);
}

static void pg_abort(ckpt_txn *t)
{
	struct ptxn *tx = (struct ptxn *)t;

	for (size_t i = 0; i < tx->n; i++) {
		free(tx->v[i].key);
		free(tx->v[i].val);
	}
	free(tx->v);
	free(tx->slots);
	free(tx->snap);
	free(tx);
}

/* Collect the entries with any of flags set (and, when want_present is 0 or
 * 1, with present equal to it) into a bytea[] of keys and, when vals, one
 * of values.  *ret_n = how many. */
static int collect(struct ptxn *t, unsigned flags, int want_present, bool vals, char **ret_k,
		   int *ret_klen, char **ret_v, int *ret_vlen, size_t *ret_n)
{
	uint8_t **kp = malloc((t->n ? t->n : 1) * sizeof(*kp));
	uint8_t **vp = malloc((t->n ? t->n : 1) * sizeof(*vp));
	size_t *kl = malloc((t->n ? t->n : 1) * sizeof(*kl));
	size_t *vl = malloc((t->n ? t->n : 1) * sizeof(*vl));
	size_t n = 0;
	int r = -ENOMEM;

	*ret_k = *ret_v = NULL;
	if (!kp || !vp || !kl || !vl)
		goto out;
	for (size_t i = 0; i < t->n; i++) {
		struct pent *p = &t->v[i];
		if (!(p->flags & flags))
			continue;
		if (want_present >= 0 && p->present != (want_present == 1))
			continue;
		kp[n] = p->key;
		kl[n] = p->klen;
		vp[n] = p->val ? p->val : (uint8_t *)"";
		vl[n] = p->vlen;
		n++;
	}
	*ret_n = n;
	r = 0;
	if (!n)
		goto out;
	*ret_k = bytea_array(n, kp, kl, ret_klen);
	if (vals)
		*ret_v = bytea_array(n, vp, vl, ret_vlen);
	if (!*ret_k || (vals && !*ret_v)) {
		free(*ret_k);
		free(*ret_v);
		*ret_k = *ret_v = NULL;
		r = -ENOMEM;
	}
out:
	free(kp);
	free(vp);
	free(kl);
	free(vl);
	return r;
}

static const char SQL_LOCK[] =
	"SELECT k, ver, CASE WHEN $2::text IS NULL THEN true"
	" ELSE pg_visible_in_snapshot(ver::text::xid8, $2::text::pg_snapshot) END"
	" FROM ckptfs_kv WHERE k = ANY($1::bytea[]) ORDER BY k FOR UPDATE";
static const char SQL_DELETE[] = "DELETE FROM ckptfs_kv WHERE k = ANY($1::bytea[])";
static const char SQL_UPDATE[] =
	"UPDATE ckptfs_kv AS t SET v = d.v, ver = pg_current_xact_id()::text::bigint"
	" FROM unnest($1::bytea[], $2::bytea[]) AS d(k, v) WHERE t.k = d.k";
static const char SQL_INSERT[] =
	"INSERT INTO ckptfs_kv (k, v, ver) SELECT d.k, d.v, pg_current_xact_id()::text::bigint"
	" FROM unnest($1::bytea[], $2::bytea[]) AS d(k, v)";

/* One attempt of the commit on c: 0, -EAGAIN (conflict, rolled back),
 * -ENOTCONN/-ETIMEDOUT before COMMIT was sent (*sent_commit false), or
 * another error. */
static int commit_on(struct pge *x, struct ptxn *t, PGconn *c, bool durable, int64_t deadline,
		     bool *sent_commit)
{
	static const Oid t2[2] = { BYTEA_ARRAY_OID, BYTEA_ARRAY_OID };
	static const Oid tl[2] = { BYTEA_ARRAY_OID, 0 };
	const char *vals[2];
	int lens[2], fmts[2] = { 1, 1 };
	char *ka = NULL, *va = NULL;
	int kal = 0, val = 0;
	size_t n;
	PGresult *res = NULL;
	bool writes = false;
	int r;

	for (size_t i = 0; i < t->n; i++) {
		t->v[i].present = false;
		t->v[i].visible = true;
		writes |= (t->v[i].flags & (E_PUT | E_DEL)) != 0;
	}
	r = exec_simple(x, c,
			durable ? "BEGIN" : "BEGIN; SET LOCAL synchronous_commit TO off",
			deadline);
	if (r < 0)
		return r;
	/* lock and check every key of the table */
	r = collect(t, E_TRACKED | E_PUT | E_DEL, -1, false, &ka, &kal, &va, &val, &n);
	if (r < 0)
		goto rollback;
	vals[0] = ka;
	lens[0] = kal;
	vals[1] = t->snap;
	lens[1] = 0;
	fmts[1] = 0;
	r = exec(x, c, SQL_LOCK, 2, tl, vals, lens, fmts, deadline, &res);
	free(ka);
	ka = NULL;
	if (r < 0)
		goto rollback;
	for (int i = 0; i < PQntuples(res); i++) {
		struct pent *p = tfind(t, PQgetvalue(res, i, 0), (size_t)PQgetlength(res, i, 0));
		if (!p)
			continue;
		p->present = true;
		p->cur_ver = get_be64(PQgetvalue(res, i, 1));
		p->visible = PQgetvalue(res, i, 2)[0] != 0;
	}
	PQclear(res);
	res = NULL;
	for (size_t i = 0; i < t->n && r == 0; i++) {
		struct pent *p = &t->v[i];
		if (p->flags & E_TRACKED) {
			if ((p->ver != 0) != p->present || (p->present && p->ver != p->cur_ver))
				r = -EAGAIN; /* changed since it was read */
		} else if (p->present && !p->visible) {
			r = -EAGAIN; /* written by a commit after our first write */
		}
	}
	if (r < 0 || !writes)
		goto rollback; /* nothing to apply: end the server transaction */
	fmts[1] = 1;
	/* deletes */
	r = collect(t, E_DEL, 1, false, &ka, &kal, &va, &val, &n);
	if (r == 0 && n) {
		vals[0] = ka;
		lens[0] = kal;
		r = exec(x, c, SQL_DELETE, 1, t2, vals, lens, fmts, deadline, &res);
		PQclear(res);
		res = NULL;
	}
	free(ka);
	ka = NULL;
	if (r < 0)
		goto rollback;
	/* updates of rows that exist, inserts of rows that do not */
	for (int present = 1; present >= 0 && r == 0; present--) {
		r = collect(t, E_PUT, present, true, &ka, &kal, &va, &val, &n);
		if (r == 0 && n) {
			vals[0] = ka;
			lens[0] = kal;
			vals[1] = va;
			lens[1] = val;
			r = exec(x, c, present ? SQL_UPDATE : SQL_INSERT, 2, t2, vals, lens, fmts,
				 deadline, &res);
			PQclear(res);
			res = NULL;
		}
		free(ka);
		free(va);
		ka = va = NULL;
	}
	if (r < 0)
		goto rollback;
	*sent_commit = true;
	return exec_simple(x, c, "COMMIT", deadline);
rollback:
	if (r != -ENOTCONN && r != -ETIMEDOUT && PQstatus(c) == CONNECTION_OK) {
		int r2 = exec_simple(x, c, "ROLLBACK", deadline);
		if (r2 < 0 && r == 0)
			r = r2;
	}
	return r;
}

static int pg_commit(ckpt_txn *t, bool durable)
{
	struct ptxn *tx = (struct ptxn *)t;
	struct pge *x = (struct pge *)t->engine;
	int64_t deadline = now_ms() + x->timeout_ms;
	unsigned pause_ms = 50;
	PGconn *c;
	int r = 0;

	while (tx->n) {
		bool sent = false;

		c = take_conn(x, deadline, NULL, 0);
		if (!c) {
			r = -EIO;
			break;
		}
		r = commit_on(x, tx, c, durable, deadline, &sent);
		if (r == -ENOTCONN || r == -ETIMEDOUT) {
			drop_conn(c);
			if (sent) {
				ckpt_err("metadata %s: the connection broke during a commit: its "
					 "outcome is unknown",
					 x->name);
				r = -EIO;
				break;
			}
			if (r == -ETIMEDOUT || now_ms() + pause_ms >= deadline) {
				r = -EIO;
				break;
			}
			pause_retry(&pause_ms);
			continue;
		}
		put_conn(x, c);
		break;
	}
	pg_abort(t);
	return r;
}

static int pg_sync(ckpt_engine *e)
{
	struct pge *x = (struct pge *)e;
	PGresult *res;
	int r;

	if (x->read_only)
		return 0;
	r = query(x, "UPDATE ckptfs_format SET syncs = syncs + 1", 0, NULL, NULL, NULL, NULL, &res);
	PQclear(res);
	return to_errno_final(r);
}

/* ---- scans ---- */

static void pg_scan_free(ckpt_scan *sc)
{
	struct pscan *s = (struct pscan *)sc;
	struct pge *x = (struct pge *)sc->engine;

	PQclear(s->page);
	if (s->c) {
		if (PQstatus(s->c) == CONNECTION_OK &&
		    exec_simple(x, s->c, "COMMIT", now_ms() + x->timeout_ms) == 0)
			put_conn(x, s->c);
		else
			drop_conn(s->c);
	}
	for (size_t i = 0; i < s->bn; i++) {
		free(s->bv[i].key);
		free(s->bv[i].val);
	}
	free(s->bv);
	free(s->last);
	free(s);
}

/* The next page of committed rows in range (after the last one seen). */
static int next_page(struct pscan *s)
{
	struct pge *x = (struct pge *)s->base.engine;
	static const Oid types[2] = { BYTEA_OID, BYTEA_OID };
	const char *vals[2];
	int lens[2], fmts[2] = { 1, 1 };
	char sql[160];
	bool first = !s->last;
	int r;

	PQclear(s->page);
	s->page = NULL;
	s->row = s->nrows = 0;
	vals[0] = first ? (const char *)s->lo : (const char *)s->last;
	lens[0] = first ? (int)s->lolen : (int)s->lastlen;
	vals[1] = (const char *)s->hi;
	lens[1] = (int)s->hilen;
	snprintf(sql, sizeof(sql), "SELECT k, v FROM ckptfs_kv WHERE k %s $1%s ORDER BY k LIMIT %d",
		 first ? ">=" : ">", s->has_hi ? " AND k < $2" : "", SCAN_PAGE);
	if (s->c) {
		r = exec(x, s->c, sql, s->has_hi ? 2 : 1, types, vals, lens, fmts,
			 now_ms() + x->timeout_ms, &s->page);
		r = to_errno_final(r); /* the snapshot cannot move to another connection */
	} else {
		r = query(x, sql, s->has_hi ? 2 : 1, types, vals, lens, fmts, &s->page);
		r = to_errno_final(r);
	}
	if (r < 0)
		return r;
	s->nrows = PQntuples(s->page);
	if (s->nrows < SCAN_PAGE)
		s->server_done = true;
	if (s->nrows) {
		size_t l = (size_t)PQgetlength(s->page, s->nrows - 1, 0);
		uint8_t *nl = realloc(s->last, l ? l : 1);
		if (!nl)
			return -ENOMEM;
		memcpy(nl, PQgetvalue(s->page, s->nrows - 1, 0), l);
		s->last = nl;
		s->lastlen = l;
	}
	return 0;
}

static int cmp_pent(const void *a, const void *b)
{
	const struct pent *x = a, *y = b;

	return key_cmp(x->key, x->klen, y->key, y->klen);
}

static bool in_range(const struct pscan *s, const uint8_t *k, size_t kl)
{
	if (key_cmp(k, kl, s->lo, s->lolen) < 0)
		return false;
	return !s->has_hi || key_cmp(k, kl, s->hi, s->hilen) < 0;
}

static int pg_scan_new(ckpt_engine *e, ckpt_txn *t, const void *prefix, size_t plen,
		       const void *start, size_t slen, ckpt_scan **ret)
{
	struct pge *x = (struct pge *)e;
	struct ptxn *tx = (struct ptxn *)t;
	struct pscan *s;
	int r;

	if (plen > PREFIX_MAX)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->base.engine = e;
	/* lower bound: start if it is past the prefix, else the prefix */
	if (start && key_cmp(start, slen, prefix, plen) > 0) {
		if (slen > sizeof(s->lo)) {
			free(s);
			return -EINVAL;
		}
		memcpy(s->lo, start, slen);
		s->lolen = slen;
	} else {
		memcpy(s->lo, prefix, plen);
		s->lolen = plen;
	}
	/* upper bound: the prefix's successor (none for "" or all 0xff) */
	memcpy(s->hi, prefix, plen);
	s->hilen = plen;
	while (s->hilen && s->hi[s->hilen - 1] == 0xff)
		s->hilen--;
	if (s->hilen) {
		s->hi[s->hilen - 1]++;
		s->has_hi = true;
	}
	if (tx) {
		/* the transaction's writes in range, copied and sorted */
		s->bv = calloc(tx->n ? tx->n : 1, sizeof(*s->bv));
		if (!s->bv) {
			pg_scan_free(&s->base);
			return -ENOMEM;
		}
		for (size_t i = 0; i < tx->n; i++) {
			struct pent *p = &tx->v[i], *q;
			if (!(p->flags & (E_PUT | E_DEL)) || !in_range(s, p->key, p->klen))
				continue;
			q = &s->bv[s->bn++];
			q->flags = p->flags;
			q->klen = p->klen;
			q->vlen = p->vlen;
			q->key = malloc(p->klen ? p->klen : 1);
			q->val = malloc(p->vlen ? p->vlen : 1);
			if (!q->key || !q->val) {
				pg_scan_free(&s->base);
				return -ENOMEM;
			}
			memcpy(q->key, p->key, p->klen);
			if (p->val)
				memcpy(q->val, p->val, p->vlen);
		}
		qsort(s->bv, s->bn, sizeof(*s->bv), cmp_pent);
	} else {
		/* a snapshot of its own: taken by the first query, run now */
		int64_t deadline = now_ms() + x->timeout_ms;
		s->c = take_conn(x, deadline, NULL, 0);
		if (!s->c) {
			free(s);
			return -EIO;
		}
		r = exec_simple(x, s->c, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", deadline);
		if (r < 0) {
			drop_conn(s->c);
			s->c = NULL;
			pg_scan_free(&s->base);
			return to_errno_final(r);
		}
	}
	r = next_page(s);
	if (r < 0) {
		pg_scan_free(&s->base);
		return r;
	}
	*ret = &s->base;
	return 0;
}

static int pg_scan_next(ckpt_scan *sc, const uint8_t **ret_key, size_t *ret_klen,
			const uint8_t **ret_val, size_t *ret_vlen)
{
	struct pscan *s = (struct pscan *)sc;
	int r;

	for (;;) {
		const uint8_t *sk = NULL;
		size_t skl = 0;
		struct pent *b = s->bi < s->bn ? &s->bv[s->bi] : NULL;
		int c;

		if (s->row == s->nrows && !s->server_done) {
			r = next_page(s);
			if (r < 0)
				return r;
		}
		if (s->row < s->nrows) {
			sk = (const uint8_t *)PQgetvalue(s->page, s->row, 0);
			skl = (size_t)PQgetlength(s->page, s->row, 0);
		}
		if (!sk && !b)
			return 0;
		c = !sk ? 1 : !b ? -1 : key_cmp(sk, skl, b->key, b->klen);
		if (c < 0) { /* a committed row the transaction did not touch */
			*ret_key = sk;
			*ret_klen = skl;
			*ret_val = (const uint8_t *)PQgetvalue(s->page, s->row, 1);
			*ret_vlen = (size_t)PQgetlength(s->page, s->row, 1);
			s->row++;
			return 1;
		}
		if (c == 0)
			s->row++; /* the transaction's write replaces it */
		s->bi++;
		if (b->flags & E_PUT) {
			*ret_key = b->key;
			*ret_klen = b->klen;
			*ret_val = b->val;
			*ret_vlen = b->vlen;
			return 1;
		}
	}
}

const struct ckpt_engine_ops ckpt_engine_postgres = {
	.name = "postgresql",
	.shared = true,
	.open = pg_open,
	.close = pg_close,
	.get = pg_get,
	.get_many = pg_get_many,
	.begin = pg_begin,
	.put = pg_put,
	.del = pg_del,
	.commit = pg_commit,
	.abort = pg_abort,
	.scan_new = pg_scan_new,
	.scan_next = pg_scan_next,
	.scan_free = pg_scan_free,
	.sync = pg_sync,
	.flush = pg_sync,
};
