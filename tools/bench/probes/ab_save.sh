#!/bin/bash
# A/B of daemon binaries on case 1's save alone: for ROUNDS rounds, each
# binary in turn runs `profile_incr.py BIN DATA WORK --full` (two 2-writer
# saves of DATA/step_0001 into fresh stores, caches dropped, each timed with
# the daemon's CPU seconds).  Its figures are cited in docs/performance.md.
#
# usage: tools/bench/probes/ab_save.sh DATA ROUNDS BIN_A BIN_B [BIN...]
#   DATA: a generated series, e.g. /var/tmp/ckptfs-bench/data/c1-4g
#   WORK (env, default /var/tmp/ckptfs-ab-save): scratch on the disk to measure
set -eu
[ $# -ge 4 ] || { sed -n '2,9p' "$0"; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
data=$1 rounds=$2
shift 2
work=${WORK:-/var/tmp/ckptfs-ab-save}
mkdir -p "$work"
for r in $(seq 1 "$rounds"); do
	for b in "$@"; do
		echo "== round $r $b $(date +%T)"
		/usr/bin/python3 "$here/profile_incr.py" "$b" "$data" "$work" --full | grep "full save"
	done
done
