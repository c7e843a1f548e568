#!/bin/bash
# Concurrency: 8 writers of 16 MiB files (8 MiB shared + 8 MiB distinct) with concurrent
# mkdir/rename, readers running meanwhile, 4 processes pwrite()ing disjoint quarters of one file,
# create/unlink churn in one dir. Everything verified by sha256, also after a remount.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

N=8
HALF=$((8 * MiB))

start_daemon || bail "mount $STORE"
ok "daemon mounted"

rand_file "$WORK/shared" $HALF
for i in $(seq 0 $((N - 1))); do
	rand_file "$WORK/distinct$i" $HALF
	cat "$WORK/shared" "$WORK/distinct$i" >"$WORK/ref$i"
done
rand_file "$WORK/pre" $((20 * MiB))
cp "$WORK/pre" "$MNT/pre.bin"
mkdir "$MNT/shared_dir"

# writer I: 0-3 write into shared_dir, 4-7 each into a new dir; write to a temp name with dd
# (block size varies per writer), then rename to the final name.
writer() {
	local i=$1 bs dir
	bs=$(echo 4K 64K 1M 128K 1M 16K 256K 1M | cut -d' ' -f$((i + 1)))
	if [ "$i" -lt 4 ]; then
		dir=$MNT/shared_dir
	else
		dir=$MNT/w$i
		mkdir "$dir" || return 1
	fi
	dd if="$WORK/ref$i" of="$dir/.tmp$i" bs="$bs" status=none || return 1
	mv "$dir/.tmp$i" "$dir/file$i.bin"
}

reader() {
	local k want
	want=$(sha "$WORK/pre")
	for k in 1 2 3; do
		[ "$(sha "$MNT/pre.bin")" == "$want" ] || return 1
	done
}

# ckpt stat while the writers run (read-only view of a store in use)
statter() {
	local k
	for k in $(seq 1 10); do
		"$CKPT" stat "$STORE" >/dev/null || return 1
	done
}

declare -A PIDS
for i in $(seq 0 $((N - 1))); do
	writer "$i" >"$WORK/writer$i.log" 2>&1 &
	PIDS[w$i]=$!
done
reader >"$WORK/reader0.log" 2>&1 &
PIDS[r0]=$!
reader >"$WORK/reader1.log" 2>&1 &
PIDS[r1]=$!
statter >"$WORK/statter.log" 2>&1 &
PIDS[stat]=$!
for k in "${!PIDS[@]}"; do
	if wait "${PIDS[$k]}"; then
		ok "concurrent job $k succeeded"
	else
		fail "concurrent job $k succeeded"
		case $k in
		w*) indent "$WORK/writer${k#w}.log" ;;
		stat) indent "$WORK/statter.log" ;;
		esac
	fi
done

path_of() {
	if [ "$1" -lt 4 ]; then echo "$MNT/shared_dir/file$1.bin"; else echo "$MNT/w$1/file$1.bin"; fi
}

verify_all() {
	local i
	for i in $(seq 0 $((N - 1))); do
		assert_eq "$(sha "$WORK/ref$i")" "$(sha "$(path_of "$i")")" "$1: writer $i file sha256"
	done
	assert_eq ".tmp: 0" ".tmp: $(find "$MNT" -name '.tmp*' | wc -l)" "$1: no temp files left"
}
verify_all "after concurrent writes"

# ---------------------------------------------------------------- disjoint pwrite on one file
rand_file "$WORK/joint" $((16 * MiB))
: >"$MNT/joint.bin"
truncate -s $((16 * MiB)) "$MNT/joint.bin"
for q in 0 1 2 3; do
	"$PY" - "$WORK/joint" "$MNT/joint.bin" "$q" >"$WORK/joint$q.log" 2>&1 <<'EOF' &
import os, sys
src, dst, q = sys.argv[1], sys.argv[2], int(sys.argv[3])
quarter = 4 << 20
data = open(src, "rb").read()[q * quarter:(q + 1) * quarter]
fd = os.open(dst, os.O_WRONLY)
piece = 256 << 10
for k in range(0, quarter, piece):
    os.pwrite(fd, data[k:k + piece], q * quarter + k)
os.fsync(fd)
os.close(fd)
EOF
	PIDS[q$q]=$!
done
for q in 0 1 2 3; do
	wait "${PIDS[q$q]}" || { fail "pwrite process $q"; indent "$WORK/joint$q.log"; }
done
assert_eq "$(sha "$WORK/joint")" "$(sha "$MNT/joint.bin")" \
	"4 processes pwrite()ing disjoint quarters of one open file: all writes kept"

# ---------------------------------------------------------------- create/unlink churn
mkdir "$MNT/churn"
for p in 0 1 2 3; do
	(
		for n in $(seq 0 59); do
			echo "$p-$n" >"$MNT/churn/p${p}_$n" || exit 1
		done
		for n in $(seq 0 2 59); do
			rm "$MNT/churn/p${p}_$n" || exit 1
		done
	) &
	PIDS[c$p]=$!
done
for p in 0 1 2 3; do
	wait "${PIDS[c$p]}" || fail "churn process $p"
done
expected=$(for p in 0 1 2 3; do for n in $(seq 1 2 59); do echo "p${p}_$n"; done; done | sort)
assert_eq "$expected" "$(ls "$MNT/churn" | sort)" "concurrent create/unlink churn: listing"
assert_eq "2-31" "$(cat "$MNT/churn/p2_31")" "churn: content of a survivor"

# ---------------------------------------------------------------- dedup across writers
if wait_committed 10; then
	ok "ckpt stat sees all $((N + 2 + 120)) files, committed"
else
	fail "ckpt stat sees all $((N + 2 + 120)) files, committed"
fi
assert_eq $((N + 2 + 120)) "$(stat_field "$STORE" files)" "ckpt stat files:"
u=$(stat_field "$STORE" unique_bytes)
note "unique_bytes $u, logical_bytes $(stat_field "$STORE" logical_bytes)"
# Without dedup: N x 16 + 20 + 16 MiB. With content-defined chunks (max 4 MiB) only the chunk
# that straddles the end of the shared 8 MiB differs per file: <= 8 + N x (8 + 4) + 20 + 16 MiB.
assert_le "${u:-missing}" $(((8 + N * (8 + 4) + 20 + 16) * MiB)) \
	"the 8 MiB shared by the $N writers is stored once"

# ---------------------------------------------------------------- after remount
remount || bail "remount"
verify_all "after remount"
assert_eq "$(sha "$WORK/joint")" "$(sha "$MNT/joint.bin")" "after remount: joint file"
assert_eq "$(sha "$WORK/pre")" "$(sha "$MNT/pre.bin")" "after remount: pre-existing file"
assert_eq "$expected" "$(ls "$MNT/churn" | sort)" "after remount: churn listing"
stop_daemon || fail "unmount"
check "ckpt fsck" "$CKPT" fsck "$STORE"
finish
