#!/bin/bash
# A/B of daemon binaries on a save and the background work after it: for
# two rounds, each binary in turn mounts a fresh store, saves DATA/step_0001
# with 2 writers (write + fsync + close per file, as case 1), then waits
# until `ckpt stat` reports no compression pending; prints the save and
# settle seconds, the daemon's CPU seconds for both and its peak RSS.
# Its figures are cited in docs/performance.md.
#
# usage: tools/bench/probes/ab_settle.sh DATA BIN_A BIN_B [BIN...]
#   DATA: a generated series, e.g. /var/tmp/ckptfs-bench/data/c1-4g
#   WORK (env, default /var/tmp/ckptfs-ab-settle): scratch on the disk to measure
set -eu
[ $# -ge 3 ] || { sed -n '2,12p' "$0"; exit 2; }
bench=$(cd "$(dirname "$0")/.." && pwd)	# bench.py, for its writers
ckpt=$bench/../ckpt
data=$1
shift
W=${WORK:-/var/tmp/ckptfs-ab-settle}
mkdir -p "$W/mnt"
trap 'fusermount3 -u "$W/mnt" 2>/dev/null || true' EXIT
for r in 1 2; do
	for b in "$@"; do
		b=$(realpath "$b")
		rm -rf "$W/store"
		sync
		echo 3 >/proc/sys/vm/drop_caches
		sleep 2
		"$b" "$W/store" "$W/mnt"
		pid=$(pgrep -f "^$b $W/store")
		t0=$(date +%s.%N)
		/usr/bin/python3 - "$bench" "$data/step_0001" "$W/mnt/ckpt" <<'PY'
import os, sys
sys.path.insert(0, sys.argv[1])
import bench
d = sys.argv[2]
bench.parallel_save([(i, n, os.path.join(d, n)) for i, n in enumerate(sorted(os.listdir(d)))],
                    sys.argv[3], 2, True)
PY
		t1=$(date +%s.%N)
		until "$ckpt" stat "$W/store" 2>/dev/null | grep -q "compression_pending: 0"; do
			sleep 0.2
		done
		t2=$(date +%s.%N)
		cpu=$(awk '{print ($14 + $15) / 100}' "/proc/$pid/stat")
		hwm=$(awk '/VmHWM/ {print $2 / 1024}' "/proc/$pid/status")
		printf 'round %d %s: save %.2f s, settle %.2f s, daemon CPU %s s, peak RSS %.1f MiB\n' \
			"$r" "$b" "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)" "$cpu" "$hwm"
		fusermount3 -u "$W/mnt"
		while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
	done
done
