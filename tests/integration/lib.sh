# shellcheck shell=bash
# Shared harness for the ckptfs integration tests (sourced by tests/integration/t_*.sh).
#
# Environment:
#   CKPTFS, CKPT  paths of the daemon and the tool (default: <repo>/fs/ckptfs, <repo>/tools/ckpt)
#   PYTHON        interpreter for the python helpers (default: /usr/bin/python3)
#   TMPDIR        parent of the per-test temporary directory (default: /tmp)
#   KEEP_TMP=1    keep the temporary directory (the store) after the test for post-mortem
#
# Globals set for the test: T_DIR (temp dir), STORE, MNT (used by start_daemon & co; a test may
# point them elsewhere before calling start_daemon), WORK (scratch space on the local disk).
#
# Output is TAP-like: every check prints "ok - desc" or "not ok - desc"; lines starting with
# "#" are diagnostics. The script exits 0 when all checks passed, 1 otherwise, 77 (skip) only
# when /dev/fuse is missing.

set -u
set -o pipefail

LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -z "${CKPTFS:-}" ] || [ -z "${CKPT:-}" ]; then
	TOP=$(git -C "$LIB_DIR" rev-parse --show-toplevel 2>/dev/null) || TOP=$(cd "$LIB_DIR/../.." && pwd)
	CKPTFS=${CKPTFS:-$TOP/fs/ckptfs}
	CKPT=${CKPT:-$TOP/tools/ckpt}
fi
case $CKPTFS in /*) ;; *) CKPTFS=$PWD/$CKPTFS ;; esac
case $CKPT in /*) ;; *) CKPT=$PWD/$CKPT ;; esac
PY=${PYTHON:-/usr/bin/python3}
export PYTHONPATH=$LIB_DIR${PYTHONPATH:+:$PYTHONPATH}
export PYTHONDONTWRITEBYTECODE=1
export LC_ALL=C

MiB=$((1024 * 1024))
_FINISHED=0
_MOUNTS=()		# "store|mnt" pairs that a daemon may have been started on
_CLEANUPS=()		# extra commands run at exit, after all daemons are gone (LIFO)
_FG_PIDS=()		# foreground (-f) daemons started by start_daemon_fg
_DAEMON_SEQ=0
DAEMON_ARGS=()
DAEMON_LOG=
# shellcheck disable=SC2034 # read by the tests
MOUNTED_AT_RETURN=0

if [ ! -c /dev/fuse ]; then
	echo "# SKIP: /dev/fuse is missing"
	exit 77
fi

T_DIR=$(mktemp -d "${TMPDIR:-/tmp}/ckptfs-it.XXXXXXXX") || { echo "not ok - mktemp -d"; exit 1; }
T_DIR=$(realpath "$T_DIR")
STORE=$T_DIR/store
MNT=$T_DIR/mnt
WORK=$T_DIR/work
RESULTS=$T_DIR/results
mkdir -p "$MNT" "$WORK"
: >"$RESULTS"

# A sanitizer build (make check of configure --enable-sanitizers sets CKPT_SANITIZERS=1): every
# process the test starts writes its sanitizer reports to $SAN_DIR/report.PID instead of stderr
# (a detached daemon's stderr is STORE/ckptfs.log); _cleanup shows them and fails the test, after
# every daemon has exited (LeakSanitizer reports at exit).
SAN_DIR=
if [ "${CKPT_SANITIZERS:-0}" == 1 ]; then
	SAN_DIR=$T_DIR/san
	mkdir -p "$SAN_DIR"
	export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}log_path=$SAN_DIR/report"
	export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}log_path=$SAN_DIR/report"
fi

# ---------------------------------------------------------------- reporting

ok() {
	echo "ok - $*"
	echo ok >>"$RESULTS"
}

not_ok() {
	echo "not ok - $*"
	echo "not ok" >>"$RESULTS"
}

# fail MSG: record a failed check (the script goes on; it exits 1 at the end).
fail() {
	not_ok "$@"
}

note() {
	echo "# $*"
}

# bail MSG: record a failure and stop the test now (the EXIT trap still cleans up).
bail() {
	not_ok "$*"
	echo "# Bail out! $*"
	exit 1
}

# indent FILE: print a file as diagnostics (at most 40 lines)
indent() {
	[ -s "$1" ] || return 0
	head -n 40 "$1" | sed 's/^/#   /'
}

# check DESC CMD...: ok when CMD exits 0; its output is shown only on failure.
check() {
	local desc=$1 out=$T_DIR/check.out
	shift
	if "$@" >"$out" 2>&1; then
		ok "$desc"
	else
		not_ok "$desc (exit $?)"
		indent "$out"
	fi
}

# absent PATH: true when PATH does not exist (and its parent dir is readable: a dead mount does
# not count as "absent")
absent() {
	ls -a "$(dirname "$1")" >/dev/null 2>&1 || return 1
	[ ! -e "$1" ] && [ ! -L "$1" ]
}

# check_fails DESC CMD...: ok when CMD exits non-zero. Its output is left in $T_DIR/check.out.
check_fails() {
	local desc=$1 out=$T_DIR/check.out
	shift
	if "$@" >"$out" 2>&1; then
		not_ok "$desc (unexpectedly succeeded)"
		indent "$out"
	else
		ok "$desc"
	fi
}

# assert_eq EXPECTED ACTUAL DESC
assert_eq() {
	if [ "$1" == "$2" ]; then
		ok "$3"
	else
		not_ok "$3"
		note "expected: '$1'"
		note "got:      '$2'"
	fi
}

# assert_same_tree DIR1 DIR2 DESC: same entries, types, modes, sizes, mtimes (s), content,
# link targets (helpers.py manifest); shows only the differing lines on failure
assert_same_tree() {
	(cd "$1" && "$PY" "$LIB_DIR/helpers.py" manifest .) >"$T_DIR/tree1" 2>&1
	(cd "$2" && "$PY" "$LIB_DIR/helpers.py" manifest .) >"$T_DIR/tree2" 2>&1
	if diff "$T_DIR/tree1" "$T_DIR/tree2" >"$T_DIR/tree.diff"; then
		ok "$3"
	else
		not_ok "$3"
		indent "$T_DIR/tree.diff"
	fi
}

# assert_nonzero RC DESC: an exit status that must be a failure
assert_nonzero() {
	if [ "$1" -ne 0 ]; then
		ok "$2"
	else
		not_ok "$2 (exit status 0)"
	fi
}

# assert_cmp FILE1 FILE2 DESC: byte-identical files
assert_cmp() {
	if cmp -- "$1" "$2" >"$T_DIR/cmp.out" 2>&1; then
		ok "$3"
	else
		not_ok "$3"
		indent "$T_DIR/cmp.out"
	fi
}

# assert_le A B DESC (integers)
assert_le() {
	if [[ "$1" =~ ^-?[0-9]+$ && "$2" =~ ^-?[0-9]+$ ]] && [ "$1" -le "$2" ]; then
		ok "$3"
	else
		not_ok "$3 ($1 <= $2)"
	fi
}

# assert_lt A B DESC (integers)
assert_lt() {
	if [[ "$1" =~ ^-?[0-9]+$ && "$2" =~ ^-?[0-9]+$ ]] && [ "$1" -lt "$2" ]; then
		ok "$3"
	else
		not_ok "$3 ($1 < $2)"
	fi
}

# py_checks DESC [ARGS...] <<'EOF' ... EOF
# Runs a python snippet from stdin (with helpers.py importable); its "ok - " / "not ok - "
# lines count as checks, other output is shown as diagnostics. A python crash or non-zero exit
# is a failed check named DESC.
py_checks() {
	local desc=$1
	shift
	_py_tap "$desc" "$PY" - "$@"
}

# py_helper DESC CMD ARGS...: run "helpers.py CMD ARGS..." and count its TAP lines as checks
py_helper() {
	local desc=$1
	shift
	_py_tap "$desc" "$PY" "$LIB_DIR/helpers.py" "$@" </dev/null
}

_py_tap() {
	local desc=$1 line rc
	shift
	timeout -k 5 "${PY_TIMEOUT:-180}" "$@" >"$T_DIR/py.out" 2>&1
	rc=$?
	while IFS= read -r line; do
		case $line in
		"ok - "*) ok "${line#ok - }" ;;
		"not ok - "*) not_ok "${line#not ok - }" ;;
		*) echo "# $line" ;;
		esac
	done <"$T_DIR/py.out"
	if [ "$rc" -ne 0 ]; then
		not_ok "$desc (python exited $rc)"
	fi
	return "$rc"
}

sha() {
	sha256sum <"$1" | cut -d' ' -f1
}

# rand_file FILE SIZE: SIZE bytes of random data (SIZE in bytes)
rand_file() {
	head -c "$2" /dev/urandom >"$1"
}

# make_tree DIR: a small tree exercising sizes around block boundaries, a sparse file, modes,
# explicit mtimes, symlinks (relative, absolute, dangling, to a dir), odd names, empty dirs.
make_tree() {
	local d=$1 sz
	mkdir -p "$d/a/b/c" "$d/empty_dir" "$d/d2"
	for sz in 0 1 4095 4096 4097 65536 1048577 3000000; do
		rand_file "$d/a/f_$sz" "$sz"
	done
	echo deep >"$d/a/b/c/deep.txt"
	yes 'a very compressible line of text' | head -c $((2 * MiB)) >"$d/d2/compressible.txt"
	truncate -s $((5 * MiB)) "$d/d2/sparse"
	printf x | dd of="$d/d2/sparse" bs=1 seek=$((3 * MiB)) conv=notrunc status=none
	echo spaces >"$d/name with spaces.txt"
	echo unicode >"$d/ünïcødé-名前.txt"
	ln -s ../a/f_1 "$d/d2/rel_link"
	ln -s /nonexistent/target "$d/d2/dangling"
	ln -s a "$d/dirlink"
	chmod 600 "$d/a/f_1"
	chmod 755 "$d/a/f_0"
	chmod 444 "$d/a/f_4096"
	chmod 640 "$d/d2/compressible.txt"
	touch -d @1500000000 "$d/a/f_4095"
	touch -d @1234567890 "$d/a/b/c/deep.txt" "$d/a/b/c"
	chmod 700 "$d/a/b"
	touch -d @1600000000 "$d/empty_dir"
}

# ---------------------------------------------------------------- daemon control

is_mounted() {
	findmnt -n -M "$1" >/dev/null 2>&1
}

# daemon_pids [STORE]: pids of ckptfs daemons serving STORE (default $STORE)
daemon_pids() {
	local s=${1:-$STORE} p comm
	for p in $(pgrep -f -- "$s" 2>/dev/null); do
		comm=$(cat "/proc/$p/comm" 2>/dev/null) || continue
		case $comm in
		*ckptfs*) echo "$p" ;;
		esac
	done
}

_register_mount() {
	local pair="$1|$2" m
	for m in "${_MOUNTS[@]+"${_MOUNTS[@]}"}"; do
		[ "$m" == "$pair" ] && return 0
	done
	_MOUNTS+=("$pair")
}

# on_exit CMD: run CMD (with eval) at exit, after all daemons are stopped.
on_exit() {
	_CLEANUPS+=("$1")
}

# wait_mounted MNT [TIMEOUT_S]: poll until MNT is a mountpoint (default 10 s)
wait_mounted() {
	local i n=$(( ${2:-10} * 10 ))
	for ((i = 0; i < n; i++)); do
		mountpoint -q "$1" && return 0
		sleep 0.1
	done
	return 1
}

# wait_pids_gone TIMEOUT_S PID...: poll until no PID is alive
wait_pids_gone() {
	local t=$1 i p alive
	shift
	for ((i = 0; i < t * 10; i++)); do
		alive=0
		for p in "$@"; do
			[ -d "/proc/$p" ] && [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ] &&
				alive=1
		done
		[ $alive -eq 0 ] && return 0
		sleep 0.1
	done
	return 1
}

# start_daemon [ARGS...]: start "$CKPTFS $STORE $MNT ARGS..." (daemonizing) and wait for the
# mount. Returns non-zero (after printing the daemon log) when it does not come up.
# The daemon's output goes to $DAEMON_LOG. MOUNTED_AT_RETURN is 1 if the mount was already in
# place when the command returned (it should daemonize only once the mount is ready).
start_daemon() {
	local rc
	MOUNTED_AT_RETURN=0
	DAEMON_ARGS=("$@")
	DAEMON_LOG=$T_DIR/daemon.$((++_DAEMON_SEQ)).log
	mkdir -p "$MNT"
	_register_mount "$STORE" "$MNT"
	timeout -k 5 30 "$CKPTFS" "$STORE" "$MNT" "$@" >"$DAEMON_LOG" 2>&1
	rc=$?
	if [ $rc -ne 0 ]; then
		note "ckptfs $STORE $MNT $* exited $rc"
		indent "$DAEMON_LOG"
		return 1
	fi
	# shellcheck disable=SC2034 # read by the tests
	mountpoint -q "$MNT" && MOUNTED_AT_RETURN=1
	if ! wait_mounted "$MNT" 10; then
		note "ckptfs $STORE $MNT $*: not mounted after 10 s"
		indent "$DAEMON_LOG"
		return 1
	fi
	return 0
}

# start_daemon_fg [ARGS...]: start the daemon in the foreground (-f is added) as a background
# job; sets FG_PID. Returns non-zero if the mount does not appear within 10 s.
start_daemon_fg() {
	DAEMON_ARGS=("$@")
	DAEMON_LOG=$T_DIR/daemon.$((++_DAEMON_SEQ)).log
	mkdir -p "$MNT"
	_register_mount "$STORE" "$MNT"
	"$CKPTFS" "$STORE" "$MNT" -f "$@" >"$DAEMON_LOG" 2>&1 &
	FG_PID=$!
	_FG_PIDS+=("$FG_PID")
	if ! wait_mounted "$MNT" 10; then
		note "ckptfs -f $*: not mounted after 10 s"
		indent "$DAEMON_LOG"
		return 1
	fi
	return 0
}

# _unmount MNT: unmount, retrying while busy, then lazily. Returns 0 if it is gone.
_unmount() {
	local m=$1 i
	is_mounted "$m" || return 0
	for ((i = 0; i < 20; i++)); do
		fusermount3 -u "$m" 2>/dev/null && return 0
		is_mounted "$m" || return 0
		sleep 0.1
	done
	fusermount3 -uz "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
	! is_mounted "$m"
}

# stop_daemon: unmount $MNT and wait (30 s max) for the daemon to exit, so that it has flushed
# and released the store. Returns non-zero on trouble (the daemon is then killed).
stop_daemon() {
	local pids
	pids=$(daemon_pids "$STORE")
	if ! _unmount "$MNT"; then
		note "could not unmount $MNT"
		return 1
	fi
	# shellcheck disable=SC2086
	if [ -n "$pids" ] && ! wait_pids_gone 30 $pids; then
		note "daemon ($pids) still running 30 s after unmount; killing it"
		# shellcheck disable=SC2086
		kill -9 $pids 2>/dev/null
		return 1
	fi
	return 0
}

# remount [ARGS...]: stop_daemon then start_daemon (with ARGS, or the previous ARGS if none)
remount() {
	if [ $# -eq 0 ]; then
		set -- "${DAEMON_ARGS[@]+"${DAEMON_ARGS[@]}"}"
	fi
	stop_daemon || return 1
	start_daemon "$@"
}

# kill9_daemon: SIGKILL the daemon serving $STORE, wait for it, and detach the dead mount.
kill9_daemon() {
	local pids
	pids=$(daemon_pids "$STORE")
	if [ -z "$pids" ]; then
		note "kill9_daemon: no daemon found for $STORE"
		return 1
	fi
	# shellcheck disable=SC2086
	kill -9 $pids
	# shellcheck disable=SC2086
	wait_pids_gone 10 $pids || { note "daemon $pids survived SIGKILL"; return 1; }
	fusermount3 -u "$MNT" 2>/dev/null || fusermount3 -uz "$MNT" 2>/dev/null ||
		umount -l "$MNT" 2>/dev/null
	! is_mounted "$MNT"
}

# flip_byte FILE OFFSET: xor the byte at OFFSET with 0xff (in place)
flip_byte() {
	"$PY" "$LIB_DIR/helpers.py" flip "$1" "$2"
}

# stat_field STORE KEY: value of "KEY: value" from "ckpt stat STORE" (empty if absent)
stat_field() {
	"$CKPT" stat "$1" 2>/dev/null | sed -n "s/^$2:[[:space:]]*//p" | head -n 1
}

# wait_stat STORE KEY VALUE [TIMEOUT_S]: poll "ckpt stat" until KEY == VALUE (default 10 s)
wait_stat() {
	local i n=$(( ${4:-10} * 5 ))
	for ((i = 0; i < n; i++)); do
		[ "$(stat_field "$1" "$2")" == "$3" ] && return 0
		sleep 0.2
	done
	return 1
}

# wait_committed [TIMEOUT_S]: poll "ckpt stat $STORE" until its files: and logical_bytes: match
# the regular files visible under $MNT (default 10 s): closed files get committed
wait_committed() {
	local i n=$(( ${1:-10} * 5 )) want got
	want=$(find "$MNT" -type f -printf '%s\n' | awk '{n++; s += $1} END {print n + 0, s + 0}')
	for ((i = 0; i < n; i++)); do
		got="$(stat_field "$STORE" files) $(stat_field "$STORE" logical_bytes)"
		[ "$got" == "$want" ] && return 0
		sleep 0.2
	done
	note "ckpt stat files/logical_bytes: want '$want', got '$got'"
	return 1
}

# dir_bytes DIR: total apparent size of the files under DIR
dir_bytes() {
	find "$1" -type f -printf '%s\n' 2>/dev/null | awk '{s += $1} END {print s + 0}'
}

# ---------------------------------------------------------------- prerequisites & cleanup

_cleanup() {
	local rc=$? m st mn i pids nfail
	trap - EXIT INT TERM
	# background jobs of the test first: they may hold files open on the mount
	pids=$(jobs -p)
	if [ -n "$pids" ]; then
		# shellcheck disable=SC2086
		kill $pids 2>/dev/null
		# shellcheck disable=SC2086
		wait_pids_gone 5 $pids || kill -9 $pids 2>/dev/null
	fi
	for m in "${_MOUNTS[@]+"${_MOUNTS[@]}"}"; do
		st=${m%%|*}
		mn=${m#*|}
		if is_mounted "$mn"; then
			_unmount "$mn" || note "cleanup: could not unmount $mn"
		fi
		pids=$(daemon_pids "$st")
		# shellcheck disable=SC2086
		if [ -n "$pids" ] && ! wait_pids_gone 10 $pids; then
			# shellcheck disable=SC2086
			kill -9 $pids 2>/dev/null
			# shellcheck disable=SC2086
			wait_pids_gone 5 $pids
		fi
	done
	for i in "${_FG_PIDS[@]+"${_FG_PIDS[@]}"}"; do
		kill -9 "$i" 2>/dev/null
	done
	if [ -n "$SAN_DIR" ]; then
		for i in "$SAN_DIR"/report.*; do
			[ -e "$i" ] || continue
			not_ok "sanitizer report of process ${i##*.}"
			head -n 80 "$i" | sed 's/^/#   /'
		done
	fi
	nfail=$(grep -c '^not ok' "$RESULTS" 2>/dev/null)
	if [ "${nfail:-0}" -gt 0 ] || [ "$rc" -ne 0 ]; then
		# the detached daemon logs to STORE/ckptfs.log
		for m in "${_MOUNTS[@]+"${_MOUNTS[@]}"}"; do
			st=${m%%|*}
			[ -s "$st/ckptfs.log" ] || continue
			echo "# last lines of $st/ckptfs.log:"
			tail -n 15 "$st/ckptfs.log" | sed 's/^/#   /'
		done | awk '!seen[$0]++'
	fi
	for ((i = ${#_CLEANUPS[@]} - 1; i >= 0; i--)); do
		eval "${_CLEANUPS[i]}" || note "cleanup command failed: ${_CLEANUPS[i]}"
	done
	if [ "$_FINISHED" -eq 0 ] && [ "$rc" -eq 0 ]; then
		echo "# test script ended without calling finish"
		rc=1
	fi
	if [ "${nfail:-0}" -gt 0 ] && [ "$rc" -eq 0 ]; then
		rc=1
	fi
	if findmnt -rn -o TARGET 2>/dev/null | grep -qF "$T_DIR"; then
		echo "# cleanup: something is still mounted under $T_DIR; not removing it"
		rc=1
	elif [ "${KEEP_TMP:-0}" == 1 ]; then
		echo "# KEEP_TMP=1: kept $T_DIR"
	else
		rm -rf --one-file-system "$T_DIR"
	fi
	exit "$rc"
}
trap _cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# finish: print the summary; exit 0 if every check passed, else 1
finish() {
	local n nfail
	_FINISHED=1
	n=$(grep -c . "$RESULTS")
	nfail=$(grep -c '^not ok' "$RESULTS")
	echo "1..$n"
	if [ "$nfail" -gt 0 ]; then
		echo "# $nfail of $n checks failed"
		exit 1
	fi
	echo "# all $n checks passed"
	exit 0
}

# need CMD...: stop the test when a command it calls is not installed, naming the command and its
# Debian package (tools/setup.sh installs them all). Without this a missing tool surfaces later as
# a misleading symptom: with no pgrep, daemon_pids finds no daemon, stop_daemon does not wait for
# it, and the next ckpt command reports "store is in use". A missing tool is a failure, not a skip.
need() {
	local c pkg
	for c in "$@"; do
		command -v "$c" >/dev/null 2>&1 && continue
		case $c in
		pgrep | pkill | ps) pkg=procps ;;
		fusermount3) pkg=fuse3 ;;
		findmnt | mountpoint | runuser) pkg=util-linux ;;
		mount | umount) pkg=mount ;;
		cmp | diff) pkg=diffutils ;;
		*) pkg=$c ;;
		esac
		bail "required command '$c' is not installed (Debian package $pkg; tools/setup.sh installs it)"
	done
}

# need_py MODULE...: the same for a python module the test's python code imports
need_py() {
	local m
	for m in "$@"; do
		"$PY" -c "import $m" >/dev/null 2>&1 ||
			bail "python module '$m' cannot be imported by $PY (Debian package python3-$m; tools/setup.sh installs it)"
	done
}

# require the binaries and the tools every test uses (missing ones are a failure, not a skip)
for _b in "$CKPTFS" "$CKPT"; do
	[ -x "$_b" ] || bail "$_b is missing or not executable (set CKPTFS / CKPT)"
done
[ -x "$PY" ] || bail "python interpreter $PY not found (Debian package python3; tools/setup.sh installs it)"
unset _b
need pgrep findmnt mountpoint fusermount3 umount timeout sha256sum truncate dd awk sed cmp diff
