#!/bin/bash
# Metadata damage and `ckpt repair`: one flipped byte in the index's files (tables, MANIFEST,
# write-ahead log, CURRENT, OPTIONS, IDENTITY) or in the metadata log's (snapshots, logs), then
# `ckpt repair`: the store mounts, every file reads back exactly, none is lost, none wrong, and
# fsck is clean. The short form of tools/torture/meta_flip.py (one trial per kind of file, a
# random seed printed for a rerun: META_FLIP_SEED=S), and the command's own behaviour: refused on
# a mounted store, fsck reporting a damaged snapshot until repair takes a new one.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

TOP_DIR=$(cd "$LIB_DIR/../.." && pwd)
seed=${META_FLIP_SEED:-$((RANDOM * 32768 + RANDOM))}
note "meta_flip seed $seed"
if timeout -k 5 600 "$PY" "$TOP_DIR/tools/torture/meta_flip.py" --trials 8 --cycle \
	--seed "$seed" --tmp "$WORK/meta_flip" >"$T_DIR/meta_flip.out" 2>&1; then
	ok "meta_flip: 8 trials (one per kind of file): mountable, exact, fsck-clean"
else
	not_ok "meta_flip --trials 8 --cycle --seed $seed"
fi
grep -E '^(trial|#)' "$T_DIR/meta_flip.out" | sed 's/^/# /' | head -n 40

# the command itself
make_tree "$WORK/src"
start_daemon || bail "mount"
cp -a "$WORK/src/." "$MNT/"
# (check and check_fails leave the command's output in $T_DIR/check.out: kept as $out)
out=$T_DIR/last.out
check_fails "ckpt repair refuses a mounted store" "$CKPT" repair "$STORE"
cp "$T_DIR/check.out" "$out"
check "it says so" grep -q "unmount it first" "$out"
stop_daemon || bail "unmount"
check "ckpt repair on an intact store" "$CKPT" repair "$STORE"
cp "$T_DIR/check.out" "$out"
check "it changed nothing" grep -q "index intact; 0 file(s) lost, 0 record(s) fixed" "$out"
snap=$(ls "$STORE"/metalog/snap-*.ckms | tail -n 1)
flip_byte "$snap" 100
check_fails "ckpt fsck reports a damaged snapshot" "$CKPT" fsck "$STORE"
cp "$T_DIR/check.out" "$out"
check "naming it" grep -q "metadata log: .*$(basename "$snap")" "$out"
check "ckpt repair takes a new one" "$CKPT" repair "$STORE"
check "ckpt fsck is clean again" "$CKPT" fsck "$STORE"
sst=$(ls "$STORE"/index/*.sst | head -n 1)
flip_byte "$sst" $(($(stat -c %s "$sst") / 2))
check "ckpt repair rebuilds the index" "$CKPT" repair "$STORE"
cp "$T_DIR/check.out" "$out"
check "from its metadata log" grep -q "index rebuilt from its metadata log; 0 file(s) lost" "$out"
start_daemon || bail "mount after repair"
assert_same_tree "$WORK/src" "$MNT" "every file, link and directory is back"
stop_daemon
check "ckpt fsck is clean" "$CKPT" fsck "$STORE"
finish
