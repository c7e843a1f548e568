/* SPDX-License-Identifier: MIT */
/*
 * open.c - opening, creating and recovering a store, and closing it.
 */
#include "store/store_int.h"

int st_read_marker(int dfd, const char *path, char *err, size_t errlen)
{
	char buf[64];
	ssize_t n;
	unsigned ver;
	int fd = openat(dfd, MARKER_NAME, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0)
		return -EIO;
	buf[n] = '\0';
	if (sscanf(buf, MARKER_MAGIC " %u", &ver) != 1) {
		snprintf(err, errlen, "%s: not a ckptfs store (bad %s marker)", path, MARKER_NAME);
		return -EINVAL;
	}
	if (ver > CKPT_STORE_FORMAT) {
		snprintf(err, errlen,
			 "%s: store format %u is newer than this ckptfs supports (%d); upgrade ckptfs",
			 path, ver, CKPT_STORE_FORMAT);
		return -EPROTONOSUPPORT;
	}
	if (ver < 1) {
		snprintf(err, errlen, "%s: invalid store format %u", path, ver);
		return -EINVAL;
	}
	return 0;
}

/* A store holds every user's file data (the packs), the index with the
 * chunk hash secret, and a log that names files: only its owner may enter
 * it (docs/threat-model.md).  Called at read-write opens: a new store's
 * directory, and one that lets others in (made by an earlier version, or
 * changed by hand), get their group and other bits cleared. */
static void make_private(int dfd, const char *path)
{
	struct stat st;
	mode_t mode;

	if (fstat(dfd, &st) < 0 || !(st.st_mode & 077))
		return;
	mode = st.st_mode & 07700;
	if (fchmod(dfd, mode) < 0)
		ckpt_warn("%s: cannot make the store directory private (mode %04o): %s; local users "
			  "who can enter it can read every file's data and the chunk hash secret",
			  path, (unsigned)(st.st_mode & 07777), strerror(errno));
	else
		ckpt_info("%s: store directory mode %04o -> %04o: it holds every user's data and "
			  "the chunk hash secret", path, (unsigned)(st.st_mode & 07777),
			  (unsigned)mode);
}

static int dir_is_empty_fs(int dfd)
{
	DIR *d;
	struct dirent *de;
	int empty = 1, r = ckpt_opendir_dup(dfd, &d);

	if (r < 0)
		return r;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
		    strcmp(de->d_name, "lost+found"))
			empty = 0;
	closedir(d);
	return empty;
}

static int write_marker(int dfd)
{
	char buf[64];
	int n = snprintf(buf, sizeof(buf), MARKER_MAGIC " %d\n", CKPT_STORE_FORMAT);
	int fd = openat(dfd, MARKER_NAME ".tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	int r = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, buf, (size_t)n) != n || fsync(fd) < 0)
		r = -errno ? -errno : -EIO;
	close(fd);
	if (r == 0 && renameat(dfd, MARKER_NAME ".tmp", dfd, MARKER_NAME) < 0)
		r = -errno;
	if (r == 0 && fsync(dfd) < 0)
		r = -errno;
	return r;
}

/* Initialize meta and the root directory of a fresh index. */
static int init_index(ckpt_store *s)
{
	uint8_t secret[CKPT_SECRET_LEN], buf[4];
	struct ckpt_inode root;
	ckpt_txn *t;
	int r;

	r = ckpt_secret_generate(secret, sizeof(secret));
	if (r < 0)
		return r;
	r = ckpt_secret_generate(s->uuid, sizeof(s->uuid));
	if (r < 0)
		return r;
	r = ckpt_txn_begin(s->eng, &t);
	if (r < 0)
		return r;
	ckpt_put_le32(buf, CKPT_STORE_FORMAT);
	ckpt_meta_put_bytes(t, "format", buf, 4);
	ckpt_meta_put_bytes(t, "secret", secret, sizeof(secret));
	ckpt_meta_put_bytes(t, "uuid", s->uuid, sizeof(s->uuid));
	ckpt_meta_put_u64(t, "next_ino", CKPT_ROOT_INO + 1);
	ckpt_meta_put_u64(t, "next_pack", 1);
	ckpt_put_le32(buf, CKPT_HASH_ALGO_DEFAULT);
	ckpt_meta_put_bytes(t, "hash_algo", buf, 4);
	memset(&root, 0, sizeof(root));
	root.ino = CKPT_ROOT_INO;
	root.mode = S_IFDIR | 0755;
	root.nlink = 2;
	root.uid = getuid();
	root.gid = getgid();
	root.atime_ns = root.mtime_ns = root.ctime_ns = ckpt_now_ns();
	root.parent = CKPT_ROOT_INO;
	root.generation = 1;
	ckpt_meta_put_inode(t, &root);
	return ckpt_txn_commit(t, true); /* a fresh engine: no one to conflict with */
}

/* Stores made before the "hash_algo" record existed name their chunks
 * with algorithm 1; the first read-write open records it. */
static int put_hash_algo(ckpt_store *s, ckpt_txn *t, void *arg)
{
	uint8_t buf[4];

	ckpt_put_le32(buf, *(const uint32_t *)arg);
	ckpt_meta_put_bytes(t, "hash_algo", buf, 4);
	return 0;
}

/* Refuse a store whose chunk names come from an algorithm this ckptfs does
 * not know (chunk identity is versioned, base/hash.h). */
static int check_hash_algo(ckpt_store *s, char *err, size_t errlen)
{
	const struct ckpt_hash_algo *a;
	uint8_t key[32], buf[4];
	uint32_t id = CKPT_HASH_XXH3_128_KEYED;
	int r = ckpt_engine_get_fixed(s->eng, key, ckpt_key_meta(key, "hash_algo"), buf, 4);

	if (r == 0)
		id = ckpt_get_le32(buf);
	else if (r != -ENOENT)
		goto fail;
	a = ckpt_hash_algo_by_id(id);
	if (!a || a->digest_len != CKPT_DIGEST_LEN) {
		snprintf(err, errlen,
			 "%s: chunk hash algorithm id %u is unknown to this ckptfs (it knows id %u, "
			 "%s); upgrade ckptfs",
			 s->path, id, CKPT_HASH_ALGO_DEFAULT,
			 ckpt_hash_algo_by_id(CKPT_HASH_ALGO_DEFAULT)->name);
		return -EPROTONOSUPPORT;
	}
	if (r == 0 || s->opts.mode != CKPT_STORE_RW)
		return 0;
	r = st_txn_run(s, put_hash_algo, &id, true);
	if (r == 0)
		return 0;
fail:
	snprintf(err, errlen, "%s: cannot read or record the chunk hash algorithm: %s", s->path,
		 strerror(-r));
	return r;
}

static int load_meta(ckpt_store *s, char *err, size_t errlen)
{
	uint8_t key[64], secret[CKPT_SECRET_LEN], buf[4];
	uint64_t next_ino, next_pack;
	int r;

	r = ckpt_engine_get_fixed(s->eng, key, ckpt_key_meta(key, "format"), buf, 4);
	if (r == 0 && ckpt_get_le32(buf) > CKPT_STORE_FORMAT) {
		snprintf(err, errlen, "%s: index format %u is newer than supported (%d)", s->path,
			 ckpt_get_le32(buf), CKPT_STORE_FORMAT);
		return -EPROTONOSUPPORT;
	}
	if (r == 0)
		r = ckpt_engine_get_fixed(s->eng, key, ckpt_key_meta(key, "secret"), secret,
					  sizeof(secret));
	if (r == 0)
		r = ckpt_engine_get_fixed(s->eng, key, ckpt_key_meta(key, "uuid"), s->uuid,
					  sizeof(s->uuid));
	/* the counters are read where they are used, in its transaction */
	if (r == 0)
		r = ckpt_meta_get_u64(s->eng, NULL, "next_ino", &next_ino);
	if (r == 0)
		r = ckpt_meta_get_u64(s->eng, NULL, "next_pack", &next_pack);
	if (r < 0) {
		snprintf(err, errlen, "%s: index metadata missing or damaged (%s)", s->path,
			 strerror(-r));
		return r == -ENOENT ? -EIO : r;
	}
	r = check_hash_algo(s, err, errlen);
	if (r < 0)
		return r;
	return ckpt_hasher_new(secret, sizeof(secret), &s->hasher);
}

/* Remove leftovers of files being rewritten when the last process died. */
static void clean_staging(ckpt_store *s, int dfd)
{
	int fd = openat(dfd, "staging", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d;
	struct dirent *de;

	if (fd < 0)
		return;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return;
	}
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			unlinkat(fd, de->d_name, 0);
	closedir(d);
	(void)s;
}

/* Whether this open reaps an orphan whose marker holds v[0..vl): a marker
 * without a node id (one node, or written before node ids), this node's
 * own (left by its previous mount), or one of a node without a live
 * session (gone, or past its timeout); never one a live node still holds
 * open (docs/cluster.md section 8). */
static bool orphan_ours(ckpt_store *s, const uint8_t *v, size_t vl)
{
	uint8_t key[1 + CKPT_NODE_MAX], *sv = NULL;
	char node[CKPT_NODE_MAX + 1];
	struct ckpt_session ss;
	size_t svl = 0;
	bool dead;

	if (vl == 0 || !s->opts.meta_where)
		return true;
	if (vl > CKPT_NODE_MAX)
		return true; /* not a node id: damaged, reap it */
	memcpy(node, v, vl);
	node[vl] = '\0';
	if (s->opts.node && strcmp(node, s->node) == 0)
		return true;
	if (!ckpt_node_name_ok(node))
		return true;
	if (ckpt_engine_get(s->eng, key, ckpt_key_session(key, node), &sv, &svl) < 0)
		return true; /* no session (or it cannot be read: the reap's own reads fail too) */
	dead = ckpt_session_decode(sv, svl, &ss) < 0 ||
	       ckpt_now_ns() - ss.heartbeat_ns > (int64_t)ss.timeout_ms * 1000000;
	free(sv);
	return dead;
}

static int reap_orphans(ckpt_store *s)
{
	uint8_t prefix[1] = { CKPT_KEY_ORPHAN };
	const uint8_t *k, *v;
	size_t kl, vl;
	uint64_t *inos = NULL;
	size_t n = 0, cap = 0;
	ckpt_scan *it;
	int r = ckpt_scan_new(s->eng, NULL, prefix, 1, NULL, 0, &it);

	if (r < 0)
		return r;
	while ((r = ckpt_scan_next(it, &k, &kl, &v, &vl)) > 0) {
		if (kl != 9 || !orphan_ours(s, v, vl))
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 16;
			uint64_t *ni = realloc(inos, nc * sizeof(*ni));
			if (!ni) {
				r = -ENOMEM;
				break;
			}
			inos = ni;
			cap = nc;
		}
		inos[n++] = ckpt_get_be64(k + 1);
	}
	ckpt_scan_free(it);
	for (size_t i = 0; r >= 0 && i < n; i++)
		r = ckpt_store_reap(s, inos[i]);
	free(inos);
	return r < 0 ? r : 0;
}

/* The metadata engine options that go together (store.h): a shared engine
 * needs its connection string; node mode needs a shared engine, read-write
 * use and no background work. */
static int check_engine_opts(const char *path, const struct ckpt_store_opts *o, char *err,
			     size_t errlen)
{
	const struct ckpt_engine_ops *ops =
		ckpt_engine_find(o->meta_engine ? o->meta_engine : CKPT_ENGINE_DEFAULT);

	if (!ops)
		return 0; /* the engine's open names it */
	if (ops->shared && !o->meta_where) {
		snprintf(err, errlen, "%s: the metadata engine '%s' needs a connection string "
			 "(--meta)", path, ops->name);
		return -EINVAL;
	}
	if (o->node && (!ops->shared || o->mode != CKPT_STORE_RW)) {
		snprintf(err, errlen, "%s: several nodes can share a store only read-write on a "
			 "shared metadata engine (not '%s')", path, ops->name);
		return -EINVAL;
	}
	if (o->gc_online && (!ops->shared || o->mode != CKPT_STORE_RW || o->node)) {
		snprintf(err, errlen, "%s: online gc needs a read-write open of a shared metadata "
			 "engine (not '%s')", path, ops->name);
		return -EINVAL;
	}
	if (o->node_name && !ckpt_node_name_ok(o->node_name)) {
		snprintf(err, errlen, "%s: node id '%s': 1-%d characters of [A-Za-z0-9._:-]", path,
			 o->node_name, CKPT_NODE_MAX);
		return -EINVAL;
	}
	if (o->node && o->bg != CKPT_BG_OFF) {
		snprintf(err, errlen, "%s: background compaction is not safe with several nodes "
			 "(it would reclaim packs other nodes still fill)", path);
		return -EINVAL;
	}
	return 0;
}

int ckpt_store_open(const char *path, const struct ckpt_store_opts *o, ckpt_store **ret_store,
		    char *err, size_t errlen)
{
	return st_open(path, o, -1, ret_store, err, errlen);
}

int st_open(const char *path, const struct ckpt_store_opts *o, int lock_fd,
	    ckpt_store **ret_store, char *err, size_t errlen)
{
	ckpt_store *s = NULL;
	char *ixdir = NULL, *logdir = NULL;
	bool fresh = false;
	int dfd = -1, r;

	err[0] = '\0';
	if (o->compress_level < 0 || o->compress_level > 19) {
		snprintf(err, errlen, "compression level %d out of range 0..19", o->compress_level);
		r = -EINVAL;
		goto fail;
	}
	r = check_engine_opts(path, o, err, errlen);
	if (r < 0)
		return r;
	if (o->create && mkdir(path, 0700) < 0 && errno != EEXIST) {
		r = -errno;
		snprintf(err, errlen, "%s: cannot create store directory: %s", path, strerror(errno));
		goto fail;
	}
	dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		r = -errno;
		snprintf(err, errlen, "%s: %s", path,
			 errno == ENOENT ? "no such store (directory does not exist)" :
					   strerror(errno));
		goto fail;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		r = -ENOMEM;
		goto fail;
	}
	s->lock_fd = lock_fd; /* an inherited lock is the store's from here */
	lock_fd = -1;
	s->opts = *o;
	s->path = strdup(path);
	pthread_mutex_init(&s->ns_lock, NULL);
	pthread_mutex_init(&s->pending_lock, NULL);
	pthread_mutex_init(&s->commit_lock, NULL);
	pthread_mutex_init(&s->overlay_lock, NULL);
	pthread_mutex_init(&s->bg_lock, NULL);
	pthread_mutex_init(&s->compact_lock, NULL);
	pthread_mutex_init(&s->sess_lock, NULL);
	pthread_cond_init(&s->sess_cond, NULL);
	st_reclaim_init(s);
	pthread_cond_init(&s->bg_cond, NULL);
	pthread_cond_init(&s->flusher_cond, NULL);
	pthread_key_create(&s->tls_key, st_tls_free);

	r = st_read_marker(dfd, path, err, errlen);
	if (r == -ENOENT) {
		r = dir_is_empty_fs(dfd);
		if (r < 0)
			goto fail;
		if (!r) {
			snprintf(err, errlen, "%s: not a ckptfs store (no %s marker, directory not empty)",
				 path, MARKER_NAME);
			r = -EINVAL;
			goto fail;
		}
		if (!o->create || o->mode != CKPT_STORE_RW) {
			snprintf(err, errlen, "%s: not a ckptfs store (empty directory)", path);
			r = -EINVAL;
			goto fail;
		}
		fresh = true;
	} else if (r < 0) {
		if (!err[0])
			snprintf(err, errlen, "%s: cannot read store marker: %s", path, strerror(-r));
		goto fail;
	}

	if (o->mode != CKPT_STORE_RO_SHARED && s->lock_fd < 0) {
		s->lock_fd = openat(dfd, "lock", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
		if (s->lock_fd < 0 ||
		    flock(s->lock_fd, (o->node || o->gc_online ? LOCK_SH : LOCK_EX) | LOCK_NB) < 0) {
			r = errno == EWOULDBLOCK ? -EBUSY : -errno;
			snprintf(err, errlen, "%s: %s", path,
				 r == -EBUSY ? "store is in use (already mounted by another ckptfs "
					       "daemon, or a ckpt command is running)" :
					       strerror(-r));
			goto fail;
		}
	}
	if (o->mode == CKPT_STORE_RW)
		make_private(dfd, path);
	if (fresh && mkdirat(dfd, "staging", 0700) < 0 && errno != EEXIST) {
		r = -errno;
		snprintf(err, errlen, "%s: cannot create store layout: %s", path, strerror(errno));
		goto fail;
	}
	if (asprintf(&ixdir, "%s/" ST_INDEX_DIR, path) < 0 ||
	    asprintf(&logdir, "%s/" ST_METALOG_DIR, path) < 0) {
		r = -ENOMEM;
		goto fail;
	}
	{
		struct ckpt_engine_opts eo = {
			.create = fresh,
			.read_only = o->mode == CKPT_STORE_RO_SHARED,
			.cache_bytes = 64u << 20,
			/* the metadata log is the local index's: a shared engine's
			 * server keeps its own (docs/design.md section 15.5) */
			.log_dir = o->mode == CKPT_STORE_RO_SHARED || o->meta_where ? NULL : logdir,
		};
		r = ckpt_engine_open(o->meta_engine, o->meta_where ? o->meta_where : ixdir, &eo,
				     &s->eng, err, errlen);
		if (r == -EIO && !o->meta_where) {
			size_t l = strlen(err);
			snprintf(err + l, errlen - l,
				 "; the index is damaged: `ckpt repair %s` rebuilds it", path);
		}
	}
	if (r == 0 && fresh && o->meta_where) {
		/* an empty data directory beside metadata that already holds a
		 * store: that store's chunks are elsewhere */
		uint8_t key[64];
		r = ckpt_engine_has(s->eng, key, ckpt_key_meta(key, "format"));
		if (r > 0) {
			snprintf(err, errlen, "%s: the metadata at %s already holds a store, and "
				 "this data directory is empty: give that store's data directory",
				 path, o->meta_where);
			r = -EEXIST;
		}
	}
	if (r == 0)
		r = ckpt_ns_new(s->eng, &s->ns_lock, o->mode == CKPT_STORE_RW, path, &s->ns);
	s->cenv = (struct ckpt_commit_env){
		.eng = s->eng,
		.unindexed = st_unindexed,
		.arg = s,
		.name = s->path,
		/* every writer of a shared store marks refcounts that reach 0 for
		 * the online gc; a node's content commits pass its fence */
		.zero_marks = o->meta_where != NULL,
		.fence = o->node ? st_session_fence : NULL,
	};
	if (r < 0)
		goto fail;
	if (fresh) {
		r = init_index(s);
		if (r < 0) {
			snprintf(err, errlen, "%s: cannot initialize store: %s", path, strerror(-r));
			goto fail;
		}
	}
	r = load_meta(s, err, errlen);
	if (r < 0)
		goto fail;
	r = st_backend_open(s, dfd, fresh, err, errlen);
	if (r < 0)
		goto fail;
	if (fresh) {
		r = write_marker(dfd); /* last: a half-created store has no marker */
		if (r < 0) {
			snprintf(err, errlen, "%s: cannot initialize store: %s", path, strerror(-r));
			goto fail;
		}
	}
	r = ckpt_cache_new(o->cache_size, &s->cache);
	if (r < 0)
		goto fail;
	r = ckpt_loadctx_pool_new(RCTX_KEEP, &s->rctx);
	if (r < 0)
		goto fail;
	if (st_touch_at_open(o)) {
		struct ckpt_cache_stats cs;
		uint64_t want = o->buf_reserve;

		/* the stream entries, the reply buffers and the chunks pinned or
		 * read in part beside them */
		ckpt_cache_get_stats(s->cache, &cs);
		if (want == CKPT_BUF_RESERVE_AUTO)
			want = cs.stream_cap + (32u << 20);
		want = CKPT_MIN(want, o->cache_size);

		/* a knob for speed: without it every buffer is mapped on demand */
		r = ckpt_cache_reserve_bufs(s->cache, want);
		if (r < 0)
			ckpt_warn("%s: cannot reserve %" PRIu64 " MiB of chunk buffers (%s); "
				  "mapping them on demand", path, want >> 20, strerror(-r));
		st_rctx_warm(s);
	}
	if (o->node) {
		r = st_session_open(s, err, errlen);
		if (r < 0)
			goto fail;
		ckpt_ns_set_owner(s->ns, s->node); /* its orphan markers name it */
	}
	if (o->mode == CKPT_STORE_RW && !o->gc_online) {
		clean_staging(s, dfd);
		r = reap_orphans(s);
		if (r < 0) {
			snprintf(err, errlen, "%s: cannot reap orphaned files: %s", path,
				 strerror(-r));
			goto fail;
		}
		r = -pthread_create(&s->flusher, NULL, st_flusher_main, s);
		if (r < 0)
			goto fail;
		s->flusher_started = true;
	}
	if (o->mode == CKPT_STORE_RW && o->bg != CKPT_BG_OFF) {
		r = st_requeue_deferred(s);
		if (r < 0)
			goto fail;
		r = -pthread_create(&s->bg_thread, NULL, st_bg_main, s);
		if (r < 0)
			goto fail;
		s->bg_started = true;
	}
	free(ixdir);
	free(logdir);
	close(dfd);
	*ret_store = s;
	return 0;
fail:
	if (!err[0])
		snprintf(err, errlen, "%s: %s", path, strerror(-r));
	free(ixdir);
	free(logdir);
	if (dfd >= 0)
		close(dfd);
	if (lock_fd >= 0)
		close(lock_fd);
	ckpt_store_free(s);
	return r;
}

void ckpt_store_free(ckpt_store *s)
{
	struct tls_ctx *t;

	if (!s)
		return;
	st_metrics_unregister(s);
	if (s->bg_started) {
		pthread_mutex_lock(&s->bg_lock);
		s->bg_stop = true;
		pthread_cond_broadcast(&s->bg_cond);
		pthread_mutex_unlock(&s->bg_lock);
		pthread_join(s->bg_thread, NULL);
		s->bg_started = false;
		st_bg_report(s, true);
	}
	if (s->flusher_started) {
		pthread_mutex_lock(&s->overlay_lock);
		s->flusher_stop = true;
		pthread_cond_signal(&s->flusher_cond);
		pthread_mutex_unlock(&s->overlay_lock);
		pthread_join(s->flusher, NULL);
	}
	if (s->eng && s->opts.mode == CKPT_STORE_RW) {
		if (ckpt_store_flush(s) < 0)
			ckpt_err("%s: closed files not yet indexed were lost at shutdown", s->path);
		if (s->cb)
			(void)ckpt_cb_sync_all(s->cb);
		st_session_close(s); /* after the last commit */
		ckpt_engine_flush(s->eng);
		if (ckpt_engine_backup_due(s->eng) && ckpt_engine_backup(s->eng) < 0)
			ckpt_warn("%s: cannot take a snapshot of the index into %s (the log since "
				  "the last one is kept)", s->path, ckpt_engine_log_dir(s->eng));
	}
	ckpt_cb_free(s->cb);
	for (size_t i = 0; i < PENDING_BUCKETS; i++) {
		struct pending *p = s->pending[i], *n;
		for (; p; p = n) {
			n = p->next;
			free(p);
		}
	}
	t = pthread_getspecific(s->tls_key);
	st_tls_free(t);
	pthread_setspecific(s->tls_key, NULL);
	pthread_key_delete(s->tls_key);
	ckpt_loadctx_pool_free(s->rctx);
	ckpt_ns_free(s->ns);
	ckpt_engine_close(s->eng);
	ckpt_cache_free(s->cache);
	ckpt_hasher_free(s->hasher);
	if (s->lock_fd >= 0)
		close(s->lock_fd);
	pthread_mutex_destroy(&s->ns_lock);
	pthread_mutex_destroy(&s->pending_lock);
	for (size_t i = 0; i < COMMIT_BUCKETS; i++) {
		struct commit *c = s->overlay[i], *n;
		for (; c; c = n) {
			n = c->next;
			st_commit_free(c);
		}
	}
	pthread_mutex_destroy(&s->commit_lock);
	pthread_mutex_destroy(&s->overlay_lock);
	pthread_mutex_destroy(&s->bg_lock);
	pthread_mutex_destroy(&s->compact_lock);
	pthread_mutex_destroy(&s->sess_lock);
	pthread_cond_destroy(&s->sess_cond);
	free(s->sess_units);
	st_reclaim_free(s);
	pthread_cond_destroy(&s->bg_cond);
	free(s->bgq);
	free(s->bg_skip);
	pthread_cond_destroy(&s->flusher_cond);
	free(s->path);
	free(s);
}

