# shellcheck shell=bash
# A PostgreSQL server of the test's own, for the integration tests of stores whose metadata is in
# PostgreSQL (sourced after lib.sh).
#
# pg_start makes a cluster in a new temporary directory (initdb; as the user "postgres" when the
# test runs as root, since PostgreSQL refuses to run as root) and starts it on a Unix socket in
# that directory, without a TCP listener. It registers with on_exit a command that stops the
# server (immediate mode) and removes the directory, so the server goes when the test ends, also
# when it fails; on_exit commands run after every daemon is gone. The server's binaries come from
# $CKPT_PG_BINDIR, else `pg_config --bindir`, else $PATH. A missing server is a failure that
# names its Debian package, never a skip.
#
# Globals: PG_DIR (socket and data directory), PG_BIN.
#
# node_start N [OPTS] and node_stop N stand in for node N of a store shared through $META:
# a foreground daemon on $STORE mounted at $T_DIR/nN as node id nN (its log appended to
# $T_DIR/nodeN.log, its pid in NODE_PID[N]).

PG_DIR=
PG_BIN=

# _pg CMD ARGS...: run a server program as the user that owns the cluster
_pg() {
	local prog=$1
	shift
	if [ "$(id -u)" -eq 0 ]; then
		runuser -u postgres -- "$PG_BIN/$prog" "$@"
	else
		"$PG_BIN/$prog" "$@"
	fi
}

pg_start() {
	need psql
	[ "$(id -u)" -ne 0 ] || need runuser
	PG_BIN=${CKPT_PG_BINDIR:-$(pg_config --bindir 2>/dev/null)}
	if [ -z "$PG_BIN" ] || [ ! -x "$PG_BIN/initdb" ]; then
		PG_BIN=$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/initdb)")
	fi
	[ -x "$PG_BIN/initdb" ] ||
		bail "no PostgreSQL server programs (initdb): Debian package postgresql; tools/setup.sh installs it"
	PG_DIR=$(mktemp -d /tmp/ckpt-pg.XXXXXX) || bail "mktemp for the PostgreSQL server"
	if [ "$(id -u)" -eq 0 ]; then
		id postgres >/dev/null 2>&1 ||
			bail "running as root and there is no user 'postgres' (Debian package postgresql)"
		chown postgres: "$PG_DIR"
	fi
	on_exit "pg_stop_all"
	_pg initdb -D "$PG_DIR/data" -A trust -U ckpt -E UTF8 --locale=C --no-sync \
		>"$PG_DIR/initdb.log" 2>&1 || { indent "$PG_DIR/initdb.log"; bail "initdb"; }
	pg_server_start || bail "the PostgreSQL server did not start"
}

# pg_server_start / pg_server_stop [MODE]: start or stop the server (MODE: fast, immediate)
pg_server_start() {
	_pg pg_ctl -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w -t 60 \
		-o "-k $PG_DIR -c listen_addresses= -c fsync=off" start >/dev/null 2>&1 || {
		indent "$PG_DIR/server.log"
		return 1
	}
}

pg_server_stop() {
	_pg pg_ctl -D "$PG_DIR/data" -m "${1:-fast}" -w -t 60 stop >/dev/null 2>&1
}

pg_stop_all() {
	[ -n "$PG_DIR" ] || return 0
	pg_server_stop immediate
	rm -rf "$PG_DIR"
	PG_DIR=
}

# pg_new_db NAME: make database NAME; prints its connection string
pg_new_db() {
	psql -X -q -h "$PG_DIR" -U ckpt -d postgres -c "CREATE DATABASE $1" >/dev/null ||
		bail "CREATE DATABASE $1"
	echo "host=$PG_DIR user=ckpt dbname=$1"
}

declare -A NODE_PID

# node_start N [OPTS]: mount $STORE at $T_DIR/nN as node nN with the metadata in $META, plus the
# daemon options OPTS (comma-separated).  A node that restarts after kill -9 takes over its
# dead session (same node id and host, its pid gone).
node_start() {
	local n=$1 m=$T_DIR/n$1
	mkdir -p "$m"
	_register_mount "$STORE" "$m"
	"$CKPTFS" "$STORE" "$m" -f -o "meta=$META,node=n$n${2:+,$2}" >>"$T_DIR/node$n.log" 2>&1 &
	NODE_PID[$n]=$!
	_FG_PIDS+=("${NODE_PID[$n]}")
	if ! wait_mounted "$m" 10; then
		note "node $n: not mounted after 10 s"
		indent "$T_DIR/node$n.log"
		return 1
	fi
}

# node_stop N: unmount node N and wait for its daemon
node_stop() {
	_unmount "$T_DIR/n$1" && wait_pids_gone 30 "${NODE_PID[$1]}"
}
