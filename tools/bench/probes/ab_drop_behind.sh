#!/bin/bash
# A/B of -o drop_behind=0 and =1: saves DIR (a checkpoint directory, e.g.
# /var/tmp/ckptfs-bench/data/c1-4g/step_0001) into a fresh store, waits until
# background compression is done, then for ROUNDS rounds mounts the store
# with each setting in turn, drops the caches and reads every file of the
# tp1_pp1 view with 1 MiB reads (one reader), printing seconds and GB/s.
# Its figures are cited in docs/performance.md.
#
# usage: tools/bench/probes/ab_drop_behind.sh CKPTFS_BIN DIR [ROUNDS]
#   WORK (env, default /var/tmp/ckptfs-ab-read): scratch on the disk to measure
set -eu
[ $# -ge 2 ] || { sed -n '2,10p' "$0"; exit 2; }
bench=$(cd "$(dirname "$0")/.." && pwd)	# bench.py, for parallel_read
bin=$(realpath "$1") dir=$2 rounds=${3:-3}
ckpt=$(dirname "$(dirname "$bin")")/tools/ckpt
work=${WORK:-/var/tmp/ckptfs-ab-read}
store=$work/store mnt=$work/mnt
fusermount3 -u "$mnt" 2>/dev/null || true
rm -rf "$store"
mkdir -p "$mnt"
trap 'fusermount3 -u "$mnt" 2>/dev/null || true' EXIT
"$bin" "$store" "$mnt"
cp -r "$dir" "$mnt/ckpt"
sync
for _ in $(seq 900); do
	"$ckpt" stat "$store" | grep -q "compression_pending: 0" && break
	sleep 1
done
sleep 3
fusermount3 -u "$mnt"
sleep 1
for r in $(seq 1 "$rounds"); do
	for o in drop_behind=0 drop_behind=1; do
		"$bin" "$store" "$mnt" -o "$o"
		sync
		echo 3 >/proc/sys/vm/drop_caches
		sleep 1
		/usr/bin/python3 - "$bench" "$mnt/tp1_pp1/ckpt" "round $r $o" <<'PY'
import os, sys
sys.path.insert(0, sys.argv[1])
import bench
d = sys.argv[2]
dt, n = bench.parallel_read([[os.path.join(d, f) for f in sorted(os.listdir(d))]])
print(f"{sys.argv[3]}: {n / 1e9:.2f} GB in {dt:.3f} s, {n / 1e9 / dt:.2f} GB/s", flush=True)
PY
		fusermount3 -u "$mnt"
		sleep 0.5
	done
done
