#!/bin/bash
# verify_cost.sh: how long does `ckpt verify` take to read a whole store, against `ckpt fsck`
# (its baseline: the same chunk reads plus the index checks), unmounted, and while mounted with
# the daemon idle; and what do a 10% sample and `ckpt du` cost?
#
# usage: tools/bench/probes/verify_cost.sh DIR [SIZE_MIB] [RUNS]
#   DIR       scratch directory on the disk to measure (a store and a mount are made in it)
#   SIZE_MIB  data written: half random, half compressible text (default 1024)
#   RUNS      runs of each command, interleaved (default 3)
# Prints one line per run and the median of each command, with the stored MB/s read.
# Run from the repository root after make (uses fs/ckptfs and tools/ckpt); drops no caches:
# verify and fsck read packs with O_DIRECT, so the page cache does not serve them.
set -eu
DIR=$1
SIZE=${2:-1024}
RUNS=${3:-3}
CKPTFS=${CKPTFS:-fs/ckptfs}
CKPT=${CKPT:-tools/ckpt}
S=$DIR/store
M=$DIR/mnt
mkdir -p "$S" "$M"
"$CKPTFS" "$S" "$M"
trap 'fusermount3 -u "$M" 2>/dev/null || true' EXIT
half=$((SIZE / 2))
mkdir -p "$M/run/step_1"
head -c $((half << 20)) /dev/urandom >"$M/run/step_1/random.bin"
python3 -c "import sys
n = $half << 20
line = b'step 123456 loss=0.4321 lr=3.0e-04 grad_norm=1.2345 tokens=987654321\n'
sys.stdout.buffer.write((line * (n // len(line) + 1))[:n])" >"$M/run/step_1/text.log"
# settle: indexed and compressed
for _ in $(seq 1 600); do
	[ "$("$CKPT" stat "$S" | sed -n 's/^compression_pending: //p')" = 0 ] &&
		[ "$("$CKPT" stat "$S" | sed -n 's/^logical_bytes: //p')" = $((SIZE << 20)) ] && break
	sleep 0.5
done
stored=$("$CKPT" stat "$S" | sed -n 's/^stored_bytes: //p')
echo "store: $((SIZE << 20)) logical bytes, $stored stored bytes"

# t CMD...: seconds CMD took (its output discarded; a failure stops the probe)
t() {
	local a b
	a=$(date +%s.%N)
	"$@" >/dev/null 2>&1
	b=$(date +%s.%N)
	echo "$b - $a" | bc
}
declare -A R
for i in $(seq 1 "$RUNS"); do
	R[verify_mounted]+="$(t "$CKPT" verify "$S" --no-progress) "
	R[verify_10pct_mounted]+="$(t "$CKPT" verify "$S" --sample 10% --no-progress) "
	R[du_mounted]+="$(t "$CKPT" du "$S" /run) "
done
fusermount3 -u "$M"
sleep 2
for i in $(seq 1 "$RUNS"); do
	R[fsck]+="$(t "$CKPT" fsck "$S" --no-progress) "
	R[verify]+="$(t "$CKPT" verify "$S" --no-progress) "
done
for k in fsck verify verify_mounted verify_10pct_mounted du_mounted; do
	med=$(tr ' ' '\n' <<<"${R[$k]}" | grep . | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
	printf "%-22s runs: %s median %.2f s" "$k" "${R[$k]}" "$med"
	case $k in
	du_mounted | verify_10pct_mounted) echo ;;
	*) printf ", %.0f MB/s stored\n" "$(echo "$stored / $med / 1000000" | bc -l)" ;;
	esac
done
