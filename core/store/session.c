/* SPDX-License-Identifier: MIT */
/*
 * session.c - several nodes on one shared store (docs/cluster.md section
 * 7): node sessions, the gc fence, and the gc that runs beside mounted
 * nodes.
 *
 * Records (docs/format.md section 11.1): 'S' node -> session (id,
 * heartbeat time, pin epoch, timeout, host, pid); 'Z' digest -> the gc
 * epoch that first saw the chunk at refcount 0 (0: none yet; written by
 * every content commit and reap that brings a refcount to 0, deleted by
 * one that raises it from 0, meta/commit.c); 'U' unit -> the session that
 * appends to it; 'M' "gc_epoch" -> le64, the current gc epoch (absent: 1).
 *
 * The protocol:
 *  - A node's in-flight references (dedup hits on chunk entries its
 *    writers have not committed yet) are covered by its holds (reclaim.c),
 *    each taken at the node's epoch, s->epoch: the gc epoch read at the
 *    last heartbeat.  The heartbeat publishes pin = min(that epoch, the
 *    oldest live hold's epoch); a node's pin never decreases.
 *  - A dedup hit on an entry at refcount 0 is not a hit on a node: the put
 *    stores its own copy (put.c), so an in-flight reference to an indexed
 *    chunk was made while its refcount was above 0.
 *  - gc, in one transaction: reads the epoch E for update, declares dead
 *    (deletes) the sessions whose heartbeat is older than their timeout
 *    and that an earlier pass, at least a timeout ago, already found so
 *    (it marks them suspect; their pins count until they are dead),
 *    stamps the unstamped 'Z' records with E, drops the chunk entries whose
 *    'Z' stamp is below the smallest pin of the live sessions (and whose
 *    refcount, read for update, is still 0), and writes E + 1.  A chunk
 *    that fell to 0 after a node's hit is stamped with an epoch >= that
 *    node's pin, so it stays while the node lives.
 *  - The fence: every content commit of a node reads its session for
 *    update (st_session_fence) and fails with -EIO when the row is gone or
 *    names another session: once gc declared it dead, the node's pending
 *    chunks may lie in units gc deleted and its dedup hits may name dropped
 *    chunks.  The node then registers a new session under commit_lock:
 *    its append targets are sealed, puts in flight are waited for, and the
 *    pending table's generation moves on, so nothing put before is ever
 *    committed (st_pending_* ignore older generations).
 *  - Units: a node's new unit gets a 'U' record in the transaction that
 *    takes its id; the heartbeat deletes it once the unit takes no appends
 *    and no pending chunk lies in it; clean unmount deletes them all.  gc
 *    deletes a unit that no chunk entry names and no live session's 'U'
 *    record claims.
 *
 * Clocks: heartbeat times are the nodes' wall clocks, compared with gc's:
 * the nodes and gc's host must keep their clocks within a small fraction
 * of the session timeout (NTP), as JuiceFS's session expiry assumes.
 */
#include "store/store_int.h"

#include <signal.h>
#include <sys/random.h>

#define SESS_BEAT_MAX_MS 5000u

static void *session_main(void *arg);

static uint32_t beat_interval_ms(const ckpt_store *s)
{
	return CKPT_MAX(CKPT_MIN(s->sess_timeout_ms / 6, SESS_BEAT_MAX_MS), 50u);
}

static uint64_t new_session_id(void)
{
	uint64_t id = 0;

	while (id == 0) {
		if (getrandom(&id, sizeof(id), 0) != (ssize_t)sizeof(id))
			id = (uint64_t)ckpt_now_ns() ^ ((uint64_t)getpid() << 32);
	}
	return id;
}

/* The gc epoch in t (untracked unless for_update); absent: 1. */
static int read_epoch(ckpt_store *s, ckpt_txn *t, bool for_update, uint64_t *ret)
{
	uint8_t key[32], buf[8];
	int r = ckpt_txn_get_fixed(t, key, ckpt_key_meta(key, "gc_epoch"),
				   for_update ? CKPT_TXN_FOR_UPDATE : 0, buf, 8);

	(void)s;
	if (r == -ENOENT) {
		*ret = 1;
		return 0;
	}
	if (r == 0)
		*ret = ckpt_get_le64(buf);
	return r;
}

/* The session row of node in t, read for update. */
static int read_session(ckpt_txn *t, const char *node, struct ckpt_session *ret)
{
	uint8_t key[1 + CKPT_NODE_MAX], *v = NULL;
	size_t vl = 0;
	int r = ckpt_txn_get(t, key, ckpt_key_session(key, node), CKPT_TXN_FOR_UPDATE, &v, &vl);

	if (r == 0) {
		r = ckpt_session_decode(v, vl, ret);
		free(v);
	}
	return r;
}

static void put_session(ckpt_store *s, ckpt_txn *t, uint64_t id, uint64_t pin)
{
	uint8_t key[1 + CKPT_NODE_MAX], val[CKPT_SESSION_REC_MAX];
	struct ckpt_session ss = {
		.id = id,
		.heartbeat_ns = ckpt_now_ns(),
		.pin = pin,
		.timeout_ms = s->sess_timeout_ms,
		.pid = (uint32_t)getpid(),
	};

	memcpy(ss.host, s->host, sizeof(ss.host));
	ckpt_txn_put(t, key, ckpt_key_session(key, s->node), val, ckpt_session_encode(&ss, val));
}

/* The pin to publish now: the epoch e just read, or the epoch of the
 * oldest live hold if older.  Sets the node's epoch to e (new holds take
 * it): hits made from now on happen at an epoch >= e. */
static uint64_t take_pin(ckpt_store *s, uint64_t e)
{
	return st_hold_take_pin(s, e);
}

static bool session_alive(const struct ckpt_session *ss, int64_t now)
{
	return now - ss->heartbeat_ns <= (int64_t)ss->timeout_ms * 1000000;
}

struct reg_arg {
	uint64_t id;
	bool takeover; /* out: a dead session of this node was replaced */
	struct ckpt_session old;
	char *err;
	size_t errlen;
};

/* Register s->node with session a->id, unless another live daemon has it. */
static int register_txn(ckpt_store *s, ckpt_txn *t, void *arg)
{
	struct reg_arg *a = arg;
	struct ckpt_session old;
	uint64_t e;
	int r = read_session(t, s->node, &old);

	a->takeover = false;
	if (r == 0) {
		int64_t now = ckpt_now_ns();
		bool alive = session_alive(&old, now);

		/* a daemon of this host that no longer runs is dead whatever its
		 * last heartbeat says (a node restarted after a crash) */
		if (alive && strcmp(old.host, s->host) == 0 && old.pid != (uint32_t)getpid() &&
		    kill((pid_t)old.pid, 0) < 0 && errno == ESRCH)
			alive = false;
		if (alive && old.id != atomic_load(&s->sess_id)) {
			snprintf(a->err, a->errlen,
				 "%s: node id '%s' has a live session (host %s, pid %" PRIu32
				 ", last heartbeat %" PRId64 " ms ago): give each daemon its own "
				 "node id (-o node=)", s->path, s->node, old.host, old.pid,
				 (now - old.heartbeat_ns) / 1000000);
			return -EBUSY;
		}
		a->takeover = true;
		a->old = old;
	} else if (r != -ENOENT) {
		return r;
	}
	r = read_epoch(s, t, false, &e);
	if (r < 0)
		return r;
	put_session(s, t, a->id, take_pin(s, e));
	return 0;
}

int st_session_open(ckpt_store *s, char *err, size_t errlen)
{
	struct reg_arg a = { .id = new_session_id(), .err = err, .errlen = errlen };
	int r;

	if (gethostname(s->host, sizeof(s->host)) < 0 || !s->host[0])
		snprintf(s->host, sizeof(s->host), "unknown");
	s->host[CKPT_HOST_MAX] = '\0';
	if (s->opts.node_name) {
		snprintf(s->node, sizeof(s->node), "%s", s->opts.node_name);
	} else {
		char h[CKPT_HOST_MAX + 1];

		/* HOSTNAME-PID: the host name up to its first dot, its other
		 * characters outside the node id's set made '_', cut to fit */
		snprintf(h, sizeof(h), "%s", s->host);
		h[strcspn(h, ".")] = '\0';
		for (char *c = h; *c; c++)
			if (!ckpt_node_name_ok((char[]){ *c, '\0' }))
				*c = '_';
		snprintf(s->node, sizeof(s->node), "%.*s-%ld", CKPT_NODE_MAX - 12, h,
			 (long)getpid());
	}
	s->sess_timeout_ms = s->opts.session_timeout_ms ? s->opts.session_timeout_ms :
							  CKPT_SESSION_TIMEOUT_DEFAULT_MS;
	err[0] = '\0';
	r = st_txn_run(s, register_txn, &a, true);
	if (r < 0) {
		if (!err[0])
			snprintf(err, errlen, "%s: cannot register node '%s': %s", s->path, s->node,
				 strerror(-r));
		return r;
	}
	if (a.takeover)
		ckpt_info("%s: node '%s': replacing its dead session (host %s, pid %" PRIu32 ")",
			  s->path, s->node, a.old.host, a.old.pid);
	atomic_store(&s->sess_id, a.id);
	s->sess_registered = 1;
	ckpt_info("%s: node '%s': session %016" PRIx64 " registered (timeout %" PRIu32 " ms)",
		  s->path, s->node, a.id, s->sess_timeout_ms);
	r = -pthread_create(&s->sess_thread, NULL, session_main, s);
	if (r < 0) {
		snprintf(err, errlen, "%s: cannot start the session thread: %s", s->path,
			 strerror(-r));
		return r;
	}
	s->sess_started = true;
	return 0;
}

int st_session_fence(void *store, ckpt_txn *t)
{
	ckpt_store *s = store;
	struct ckpt_session ss;
	uint64_t id = atomic_load(&s->sess_id);
	int r = read_session(t, s->node, &ss);

	if (r == 0 && ss.id == id)
		return 0;
	if (r < 0 && r != -ENOENT)
		return r;
	if (!atomic_exchange(&s->sess_dead, true)) {
		ckpt_err("%s: node '%s': session %016" PRIx64 " was declared dead by gc (no "
			 "heartbeat within %" PRIu32 " ms): content written in it is not committed "
			 "(EIO); the node registers a new session", s->path, s->node, id,
			 s->sess_timeout_ms);
		pthread_mutex_lock(&s->sess_lock);
		pthread_cond_broadcast(&s->sess_cond);
		pthread_mutex_unlock(&s->sess_lock);
	}
	return -ESTALE; /* commit.c returns EIO for it */
}

void st_session_unit_put(ckpt_store *s, ckpt_txn *t, uint64_t unit)
{
	uint8_t key[16], val[CKPT_UNIT_REC_LEN];

	ckpt_unit_encode(atomic_load(&s->sess_id), val);
	ckpt_txn_put(t, key, ckpt_key_unit(key, unit), val, sizeof(val));
}

void st_session_unit_add(ckpt_store *s, uint64_t unit)
{
	pthread_mutex_lock(&s->sess_lock);
	if (s->nsess_units == s->sess_units_cap) {
		size_t nc = s->sess_units_cap ? s->sess_units_cap * 2 : 16;
		uint64_t *nv = realloc(s->sess_units, nc * sizeof(*nv));

		if (!nv) { /* the record stays until gc sees the session gone */
			pthread_mutex_unlock(&s->sess_lock);
			return;
		}
		s->sess_units = nv;
		s->sess_units_cap = nc;
	}
	s->sess_units[s->nsess_units++] = unit;
	pthread_mutex_unlock(&s->sess_lock);
}

/* Wait (at most max_ms) until no put is appending; true if none is. */
static bool puts_quiet(ckpt_store *s, unsigned max_ms)
{
	for (unsigned i = 0; atomic_load(&s->puts_inflight) > 0; i++) {
		if (i >= max_ms)
			return false;
		usleep(1000);
	}
	return true;
}

/* A new session after gc declared this one dead.  Caller holds
 * commit_lock (no content commit runs meanwhile). */
static int reregister(ckpt_store *s)
{
	char err[512];
	struct reg_arg a = { .id = new_session_id(), .err = err, .errlen = sizeof(err) };
	struct ckpt_chunk_unit *u = NULL;
	uint64_t *mine;
	size_t n = 0, nmine;
	int r;

	err[0] = '\0';
	r = st_txn_run(s, register_txn, &a, true);
	if (r < 0) {
		/* retried every second by the heartbeat thread: said once */
		if (!atomic_exchange(&s->sess_reg_failed, true))
			ckpt_err("%s: node '%s': cannot register a new session: %s (retrying; "
				 "every commit of content fails with EIO until it works)", s->path,
				 s->node, err[0] ? err : strerror(-r));
		return r;
	}
	atomic_store(&s->sess_reg_failed, false);
	atomic_store(&s->sess_id, a.id); /* new units are the new session's */
	/* No more appends to the units of the dead session: gc may have
	 * deleted them, and a deleted unit is in no listing, so seal every unit
	 * the session made as well as the append targets listed.  Then every
	 * put into them has added its pending entry before the generation
	 * moves on. */
	pthread_mutex_lock(&s->sess_lock);
	mine = s->sess_units; /* their 'U' records name the dead session: gc's */
	nmine = s->nsess_units;
	s->sess_units = NULL;
	s->nsess_units = s->sess_units_cap = 0;
	s->sess_registered++;
	pthread_mutex_unlock(&s->sess_lock);
	/* not under sess_lock: a put takes it under the backend's lock
	 * (st_session_unit_add), and seal takes that lock */
	for (size_t i = 0; i < nmine; i++)
		(void)ckpt_cb_seal(s->cb, mine[i]);
	free(mine);
	if (ckpt_cb_units(s->cb, &u, &n) == 0) {
		for (size_t i = 0; i < n; i++)
			if (u[i].active)
				(void)ckpt_cb_seal(s->cb, u[i].id);
		free(u);
	}
	puts_quiet(s, UINT_MAX);
	atomic_fetch_add(&s->sess_gen, 1);
	atomic_store(&s->sess_dead, false);
	ckpt_warn("%s: node '%s': new session %016" PRIx64 " registered after the last one was "
		  "declared dead", s->path, s->node, a.id);
	return 0;
}

struct beat_arg {
	uint64_t id;
	uint64_t *release; /* units whose 'U' record goes */
	size_t nrelease;
};

static int beat_txn(ckpt_store *s, ckpt_txn *t, void *arg)
{
	struct beat_arg *a = arg;
	struct ckpt_session ss;
	uint64_t e;
	int r = read_session(t, s->node, &ss);

	if (r == -ENOENT || (r == 0 && ss.id != a->id))
		return -ESTALE;
	if (r == 0)
		r = read_epoch(s, t, false, &e);
	if (r < 0)
		return r;
	put_session(s, t, a->id, take_pin(s, e));
	for (size_t i = 0; i < a->nrelease; i++) {
		uint8_t key[16];
		ckpt_txn_delete(t, key, ckpt_key_unit(key, a->release[i]));
	}
	return 0;
}

/* Units of this session that take no appends any more and hold no
 * pending chunk: their 'U' records can go (gc may then delete them once no
 * chunk entry names them).  Returns a malloc'd array (or NULL). */
static uint64_t *units_to_release(ckpt_store *s, size_t *ret_n)
{
	struct ckpt_chunk_unit *u = NULL;
	uint64_t *mine = NULL, *out = NULL;
	size_t n = 0, nmine, k = 0;

	*ret_n = 0;
	pthread_mutex_lock(&s->sess_lock);
	nmine = s->nsess_units;
	if (nmine >= 2)
		mine = malloc(nmine * sizeof(*mine));
	if (mine)
		memcpy(mine, s->sess_units, nmine * sizeof(*mine));
	pthread_mutex_unlock(&s->sess_lock);
	/* with one unit it is the one being filled */
	if (!mine || ckpt_cb_units(s->cb, &u, &n) < 0)
		goto out;
	out = malloc(nmine * sizeof(*out));
	if (!out)
		goto out;
	for (size_t i = 0; i < nmine; i++) {
		bool active = false;
		for (size_t j = 0; j < n; j++)
			if (u[j].id == mine[i])
				active = u[j].active;
		if (!active)
			out[k++] = mine[i];
	}
	/* a put that took one of them before it stopped taking appends has
	 * added its pending entry once no put is in flight */
	if (k == 0 || !puts_quiet(s, 200)) {
		k = 0;
		goto out;
	}
	pthread_mutex_lock(&s->pending_lock);
	for (size_t b = 0; b < PENDING_BUCKETS && k > 0; b++) {
		for (struct pending *p = s->pending[b]; p; p = p->next) {
			uint64_t unit;
			if (p->gen != atomic_load(&s->sess_gen))
				continue;
			unit = ckpt_cb_unit_of(s->cb, &p->loc);
			for (size_t i = 0; i < k; i++) {
				if (out[i] == unit) {
					out[i] = out[--k];
					break;
				}
			}
		}
	}
	pthread_mutex_unlock(&s->pending_lock);
out:
	free(u);
	free(mine);
	if (k == 0) {
		free(out);
		out = NULL;
	}
	*ret_n = k;
	return out;
}

int ckpt_store_heartbeat(ckpt_store *s)
{
	struct beat_arg a = { 0 };
	int r;

	if (!s->opts.node)
		return -EINVAL;
	a.id = atomic_load(&s->sess_id);
	if (!atomic_load(&s->sess_dead))
		a.release = units_to_release(s, &a.nrelease);
	r = atomic_load(&s->sess_dead) ? -ESTALE : st_txn_run(s, beat_txn, &a, false);
	if (r == 0 && a.nrelease > 0) {
		pthread_mutex_lock(&s->sess_lock);
		for (size_t i = 0; i < a.nrelease; i++) {
			for (size_t j = 0; j < s->nsess_units; j++) {
				if (s->sess_units[j] == a.release[i]) {
					s->sess_units[j] = s->sess_units[--s->nsess_units];
					break;
				}
			}
		}
		pthread_mutex_unlock(&s->sess_lock);
	}
	free(a.release);
	if (r == -ESTALE) {
		int rr;

		if (!atomic_exchange(&s->sess_dead, true))
			ckpt_err("%s: node '%s': session %016" PRIx64 " was declared dead by gc (no "
				 "heartbeat within %" PRIu32 " ms): content written in it is not "
				 "committed", s->path, s->node, a.id, s->sess_timeout_ms);
		pthread_mutex_lock(&s->commit_lock);
		rr = atomic_load(&s->sess_id) == a.id ? reregister(s) : 0;
		pthread_mutex_unlock(&s->commit_lock);
		return rr < 0 ? rr : -ESTALE;
	}
	return r;
}

void ckpt_store_session_ids(ckpt_store *s, uint64_t *ret_id, uint64_t *ret_registered)
{
	*ret_id = s->opts.node ? atomic_load(&s->sess_id) : 0;
	pthread_mutex_lock(&s->sess_lock);
	*ret_registered = s->sess_registered;
	pthread_mutex_unlock(&s->sess_lock);
}

const char *ckpt_store_node(const ckpt_store *s)
{
	return s->opts.node ? s->node : NULL;
}

static void *session_main(void *arg)
{
	ckpt_store *s = arg;
	bool failing = false;

	pthread_mutex_lock(&s->sess_lock);
	while (!s->sess_stop) {
		struct timespec ts;
		uint64_t at;
		int r;

		clock_gettime(CLOCK_REALTIME, &ts);
		at = (uint64_t)ts.tv_nsec + (uint64_t)beat_interval_ms(s) * 1000000u;
		ts.tv_sec += (time_t)(at / 1000000000u);
		ts.tv_nsec = (long)(at % 1000000000u);
		if (!atomic_load(&s->sess_dead))
			pthread_cond_timedwait(&s->sess_cond, &s->sess_lock, &ts);
		if (s->sess_stop)
			break;
		pthread_mutex_unlock(&s->sess_lock);
		r = ckpt_store_heartbeat(s);
		if (r < 0 && r != -ESTALE && !failing)
			ckpt_warn("%s: node '%s': heartbeat failed: %s (retrying; gc declares the "
				  "session dead after %" PRIu32 " ms without one)", s->path, s->node,
				  strerror(-r), s->sess_timeout_ms);
		else if (r == 0 && failing)
			ckpt_info("%s: node '%s': heartbeat works again", s->path, s->node);
		failing = r < 0 && r != -ESTALE;
		if (r < 0 && atomic_load(&s->sess_dead)) {
			/* registration failed: do not spin */
			pthread_mutex_lock(&s->sess_lock);
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += 1;
			if (!s->sess_stop)
				pthread_cond_timedwait(&s->sess_cond, &s->sess_lock, &ts);
			continue;
		}
		pthread_mutex_lock(&s->sess_lock);
	}
	pthread_mutex_unlock(&s->sess_lock);
	return NULL;
}

struct close_arg {
	uint64_t id;
	const uint64_t *units;
	size_t n;
};

static int close_txn(ckpt_store *s, ckpt_txn *t, void *arg)
{
	struct close_arg *a = arg;
	struct ckpt_session ss;
	uint8_t key[1 + CKPT_NODE_MAX];
	int r = read_session(t, s->node, &ss);

	if (r == -ENOENT || (r == 0 && ss.id != a->id))
		return 1; /* declared dead: gc cleans up after it */
	if (r < 0)
		return r;
	for (size_t i = 0; i < a->n; i++)
		ckpt_txn_delete(t, key, ckpt_key_unit(key, a->units[i]));
	ckpt_txn_delete(t, key, ckpt_key_session(key, s->node));
	return 0;
}

void st_session_close(ckpt_store *s)
{
	struct close_arg a;
	int r;

	if (!s->sess_started)
		return;
	pthread_mutex_lock(&s->sess_lock);
	s->sess_stop = true;
	pthread_cond_broadcast(&s->sess_cond);
	pthread_mutex_unlock(&s->sess_lock);
	pthread_join(s->sess_thread, NULL);
	s->sess_started = false;
	/* every commit is done and every unit synced: nothing of this node is
	 * in flight any more */
	a = (struct close_arg){ atomic_load(&s->sess_id), s->sess_units, s->nsess_units };
	r = st_txn_run(s, close_txn, &a, true);
	if (r < 0)
		ckpt_warn("%s: node '%s': cannot remove its session: %s (gc declares it dead "
			  "after %" PRIu32 " ms)", s->path, s->node, strerror(-r),
			  s->sess_timeout_ms);
}

/* ------------------------------------------------------------------ gc */

struct sess_ent {
	uint8_t key[1 + CKPT_NODE_MAX];
	size_t klen;
	struct ckpt_session ss;
};

struct zero_ent {
	ckpt_digest d;
	uint64_t stamp;
};

struct pass_arg {
	int64_t now;
	/* out */
	uint64_t epoch, min_pin, live, suspected, dead, dropped, bytes;
};

static int grow(void **v, size_t *cap, size_t n, size_t size)
{
	if (n < *cap)
		return 0;
	size_t nc = *cap ? *cap * 2 : 64;
	void *nv = realloc(*v, nc * size);

	if (!nv)
		return -ENOMEM;
	*v = nv;
	*cap = nc;
	return 0;
}

/* The fence pass: one transaction (see the top of the file). */
static int pass_txn(ckpt_store *s, ckpt_txn *t, void *arg)
{
	struct pass_arg *a = arg;
	uint8_t prefix[1], key[32], val[CKPT_ZERO_REC_LEN];
	struct sess_ent *sv = NULL;
	struct zero_ent *zv = NULL;
	size_t ns = 0, scap = 0, nz = 0, zcap = 0, kl, vl;
	const uint8_t *k, *v;
	ckpt_scan *it = NULL;
	uint64_t e;
	int r;

	a->live = a->dead = a->dropped = a->bytes = 0;
	ckpt_txn_releases_space(t);
	r = read_epoch(s, t, true, &e);
	if (r < 0)
		return r;
	a->epoch = e;
	a->min_pin = UINT64_MAX;
	/* sessions */
	prefix[0] = CKPT_KEY_SESSION;
	r = ckpt_scan_new(s->eng, t, prefix, 1, NULL, 0, &it);
	while (r >= 0 && (r = ckpt_scan_next(it, &k, &kl, &v, &vl)) > 0) {
		r = grow((void **)&sv, &scap, ns, sizeof(*sv));
		if (r < 0)
			break;
		if (kl > sizeof(sv[ns].key) || ckpt_session_decode(v, vl, &sv[ns].ss) < 0) {
			ckpt_warn("%s: a damaged session record: it is removed", s->path);
			memset(&sv[ns].ss, 0, sizeof(sv[ns].ss)); /* dead */
			kl = CKPT_MIN(kl, sizeof(sv[ns].key));
		}
		memcpy(sv[ns].key, k, kl);
		sv[ns].klen = kl;
		ns++;
	}
	ckpt_scan_free(it);
	it = NULL;
	for (size_t i = 0; r >= 0 && i < ns; i++) {
		struct ckpt_session *ss = &sv[i].ss;

		if (session_alive(ss, a->now) ||
		    (ss->id != 0 && (ss->suspect_ns == 0 ||
				     a->now - ss->suspect_ns < (int64_t)ss->timeout_ms * 1000000))) {
			if (!session_alive(ss, a->now)) {
				/* Too old, but dead only once a later pass, a
				 * timeout after this one, still finds it so: after
				 * a database outage the nodes get the time to
				 * reconnect.  Marked (unless already) by a write
				 * that a heartbeat meanwhile makes conflict. */
				uint8_t sval[CKPT_SESSION_REC_MAX];

				if (ss->suspect_ns == 0) {
					ss->suspect_ns = a->now;
					ckpt_txn_put(t, sv[i].key, sv[i].klen, sval,
						     ckpt_session_encode(ss, sval));
				}
				a->suspected++;
			}
			a->live++;
			a->min_pin = CKPT_MIN(a->min_pin, ss->pin);
			continue;
		}
		/* declared dead: read for update, so that a heartbeat that comes
		 * meanwhile makes this pass run again */
		r = ckpt_txn_has(t, sv[i].key, sv[i].klen, CKPT_TXN_FOR_UPDATE);
		if (r >= 0) {
			ckpt_txn_delete(t, sv[i].key, sv[i].klen);
			a->dead++;
			r = 0;
		}
	}
	if (a->min_pin == UINT64_MAX)
		a->min_pin = e + 1; /* no live session: everything stamped before */
	/* chunks at refcount 0 */
	prefix[0] = CKPT_KEY_ZERO;
	if (r >= 0)
		r = ckpt_scan_new(s->eng, t, prefix, 1, NULL, 0, &it);
	while (r >= 0 && (r = ckpt_scan_next(it, &k, &kl, &v, &vl)) > 0) {
		r = grow((void **)&zv, &zcap, nz, sizeof(*zv));
		if (r < 0)
			break;
		if (kl != 1 + CKPT_DIGEST_LEN || ckpt_zero_decode(v, vl, &zv[nz].stamp) < 0) {
			r = -EIO;
			break;
		}
		memcpy(zv[nz].d.bytes, k + 1, CKPT_DIGEST_LEN);
		nz++;
	}
	ckpt_scan_free(it);
	for (size_t i = 0; r >= 0 && i < nz; i++) {
		struct ckpt_chunk_loc loc;
		uint64_t refs;

		kl = ckpt_key_zero(key, &zv[i].d);
		if (zv[i].stamp == 0) { /* first seen now */
			ckpt_zero_encode(e, val);
			ckpt_txn_put(t, key, kl, val, sizeof(val));
			continue;
		}
		if (zv[i].stamp >= a->min_pin)
			continue;
		r = ckpt_meta_get_chunk(s->eng, t, &zv[i].d, &loc, &refs);
		if (r == -ENOENT) {
			r = 0;
			refs = 1; /* no entry: only the mark goes */
		}
		if (r < 0)
			break;
		ckpt_txn_delete(t, key, kl);
		if (refs == 0) {
			ckpt_txn_delete(t, key, ckpt_key_chunk(key, &zv[i].d));
			a->dropped++;
			a->bytes += loc.stored_len;
		}
	}
	free(sv);
	free(zv);
	if (r < 0)
		return r;
	{
		uint8_t buf[8];
		ckpt_put_le64(buf, e + 1);
		ckpt_txn_put(t, key, ckpt_key_meta(key, "gc_epoch"), buf, 8);
	}
	return 0;
}

static int u64_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static bool u64_in(const uint64_t *v, size_t n, uint64_t x)
{
	return n && bsearch(&x, v, n, sizeof(*v), u64_cmp);
}

struct unit_claim {
	uint64_t unit, session;
};

struct uclean_arg {
	const struct unit_claim *claims;
	size_t n;
	const uint64_t *live;
	size_t nlive;
};

/* 'U' records of sessions that are not live any more go. */
static int uclean_txn(ckpt_store *s, ckpt_txn *t, void *arg)
{
	struct uclean_arg *a = arg;
	uint8_t key[16];

	(void)s;
	for (size_t i = 0; i < a->n; i++)
		if (!u64_in(a->live, a->nlive, a->claims[i].session))
			ckpt_txn_delete(t, key, ckpt_key_unit(key, a->claims[i].unit));
	return 0;
}

/* Delete the units no chunk entry names and no live session claims. */
static int reclaim_units(ckpt_store *s, struct ckpt_gc_stats *ret)
{
	struct ckpt_chunk_unit *u = NULL;
	struct unit_claim *cl = NULL;
	struct chunk_info *chunks = NULL;
	uint64_t *live = NULL, *named = NULL;
	size_t nu = 0, ncl = 0, clcap = 0, nlive = 0, lcap = 0, nchunks = 0, nnamed = 0;
	uint8_t prefix[1];
	const uint8_t *k, *v;
	size_t kl, vl;
	ckpt_scan *it = NULL;
	int r;

	/* in this order: a unit listed exists, so its 'U' record (written
	 * before the unit was made) is seen by the scan after, and a live
	 * session that claims it by the scan of sessions after that */
	r = ckpt_cb_units(s->cb, &u, &nu);
	prefix[0] = CKPT_KEY_UNIT;
	if (r >= 0)
		r = ckpt_scan_new(s->eng, NULL, prefix, 1, NULL, 0, &it);
	while (r >= 0 && (r = ckpt_scan_next(it, &k, &kl, &v, &vl)) > 0) {
		r = grow((void **)&cl, &clcap, ncl, sizeof(*cl));
		if (r < 0)
			break;
		if (kl != 9 || ckpt_unit_decode(v, vl, &cl[ncl].session) < 0) {
			r = -EIO;
			break;
		}
		cl[ncl++].unit = ckpt_get_be64(k + 1);
	}
	ckpt_scan_free(it);
	it = NULL;
	prefix[0] = CKPT_KEY_SESSION;
	if (r >= 0)
		r = ckpt_scan_new(s->eng, NULL, prefix, 1, NULL, 0, &it);
	while (r >= 0 && (r = ckpt_scan_next(it, &k, &kl, &v, &vl)) > 0) {
		struct ckpt_session ss;
		r = grow((void **)&live, &lcap, nlive, sizeof(*live));
		if (r < 0)
			break;
		if (ckpt_session_decode(v, vl, &ss) == 0)
			live[nlive++] = ss.id;
	}
	ckpt_scan_free(it);
	if (r < 0)
		goto out;
	if (nlive > 1)
		qsort(live, nlive, sizeof(*live), u64_cmp);
	/* units named by chunk entries (refcount 0 included) */
	r = st_load_chunks(s, &chunks, &nchunks);
	if (r < 0)
		goto out;
	named = malloc((nchunks ? nchunks : 1) * sizeof(*named));
	if (!named) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < nchunks; i++)
		named[nnamed++] = ckpt_cb_unit_of(s->cb, &chunks[i].loc);
	if (nnamed > 1)
		qsort(named, nnamed, sizeof(*named), u64_cmp);
	for (size_t i = 0; i < nu; i++) {
		bool claimed = false;

		if (u64_in(named, nnamed, u[i].id))
			continue;
		for (size_t j = 0; j < ncl && !claimed; j++)
			claimed = cl[j].unit == u[i].id && u64_in(live, nlive, cl[j].session);
		if (claimed)
			continue;
		r = ckpt_cb_reclaim(s->cb, u[i].id);
		if (r < 0 && r != -ENOENT) {
			ckpt_err("%s: gc: cannot delete unit %" PRIu64 ": %s", s->path, u[i].id,
				 strerror(-r));
			goto out;
		}
		ret->packs_deleted++;
	}
	{
		struct uclean_arg ua = { cl, ncl, live, nlive };
		r = st_txn_run(s, uclean_txn, &ua, false);
	}
out:
	free(u);
	free(cl);
	free(live);
	free(chunks);
	free(named);
	return r < 0 ? r : 0;
}

int st_gc_shared(ckpt_store *s, struct ckpt_gc_stats *ret, bool *ret_offline_ok)
{
	struct pass_arg a = { .now = ckpt_now_ns() };
	int r;

	*ret_offline_ok = false;
	r = st_txn_run(s, pass_txn, &a, true);
	if (r < 0)
		return r;
	ret->epoch = a.epoch + 1;
	ret->sessions_live = a.live;
	ret->sessions_suspected = a.suspected;
	ret->sessions_dead = a.dead;
	ret->chunks_dropped = a.dropped;
	ret->bytes_dropped = a.bytes;
	r = reclaim_units(s, ret);
	if (r < 0)
		return r;
	*ret_offline_ok = a.live == 0 && !s->opts.gc_online;
	return 0;
}
