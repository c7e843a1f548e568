#!/usr/bin/env bash
# Build the libFuzzer harnesses of tests/fuzz (`make fuzzers`) and run them
# (docs/reliability.md, "Fuzzing").
#
#   tools/fuzz.sh [HARNESS|all] [SECONDS]      each harness for SECONDS (default 600)
#   FUZZ_JOBS=N tools/fuzz.sh ...              N harnesses at a time (default 1)
#
# HARNESS is one of safetensors, shardmeta, layout, pack, compress, records (the NAME of
# tests/fuzz/fuzz_NAME.c).  Each run starts from the seeds in tests/fuzz/corpus/HARNESS (so every
# regression input there is replayed first) and from the corpus it grew before, kept in
# fuzz-build/run/HARNESS/corpus; a crash, a hang (one input over 10 s), a sanitizer report or a
# broken check of the harness leaves the input in fuzz-build/run/HARNESS/ and fails the run.
# Replay one input with fuzz-build/fuzz_HARNESS FILE.  Prints one line per harness and then
# "fuzz: P passed, F failed"; exits non-zero when any failed.  The tree must be configured
# (tools/setup.sh, or ./configure) with a clang that links libFuzzer.
set -euo pipefail
cd "$(dirname "$0")/.."

ALL=(safetensors shardmeta layout pack compress records)
which=${1:-all}
secs=${2:-600}
jobs=${FUZZ_JOBS:-1}
case $which in
all) harnesses=("${ALL[@]}") ;;
*)
	if [[ " ${ALL[*]} " != *" $which "* ]]; then
		echo "fuzz.sh: unknown harness '$which' (one of: ${ALL[*]}, all)" >&2
		exit 2
	fi
	harnesses=("$which")
	;;
esac
if ! [[ $secs =~ ^[1-9][0-9]*$ ]] || ! [[ $jobs =~ ^[1-9][0-9]*$ ]]; then
	echo "fuzz.sh: SECONDS and FUZZ_JOBS must be positive integers" >&2
	exit 2
fi
if [ ! -f Makefile ]; then
	echo "fuzz.sh: the tree is not configured (run tools/setup.sh or ./configure)" >&2
	exit 2
fi
make -s fuzzers

run=fuzz-build/run
mkdir -p "$run/tmp"

# One harness: libFuzzer's output goes to its log; the summary line to stdout.
fuzz_one() {
	local h=$1 dir=$run/$1 rc=0
	mkdir -p "$dir/corpus"
	rm -f "$dir"/crash-* "$dir"/timeout-* "$dir"/leak-* "$dir"/oom-* "$dir/log"
	TMPDIR=$PWD/$run/tmp "fuzz-build/fuzz_$h" -max_total_time="$secs" -timeout=10 \
		-rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$dir/" \
		"$dir/corpus" "tests/fuzz/corpus/$h" >"$dir/log" 2>&1 || rc=$?
	local runs eps cov corp
	runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
	eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log" | tail -1)
	cov=$(grep -o 'cov: [0-9]*' "$dir/log" | tail -1 | cut -d' ' -f2)
	corp=$(find "$dir/corpus" -type f | wc -l)
	local art
	art=$(find "$dir" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'timeout-*' \
		-o -name 'leak-*' -o -name 'oom-*' \) | head -1)
	if [ "$rc" -ne 0 ] || [ -n "$art" ]; then
		echo "fuzz: $h: FAILED (exit $rc; input ${art:-none}; log $dir/log):"
		# the report and the frames of the code under test
		grep -E "ERROR|fuzz check failed|SUMMARY|runtime error|^ *#[0-9]+ 0x[0-9a-f]+ in .* ($PWD/)?(core|tests)/" \
			"$dir/log" | head -20 | sed 's/^/    /'
		return 1
	fi
	echo "fuzz: $h: ok, ${runs:-?} runs in ${secs} s (${eps:-?}/s), coverage ${cov:-?}," \
		"corpus $corp inputs"
}

pass=0 fail=0
status_dir=$(mktemp -d "${TMPDIR:-/tmp}/ckptfs-fuzz.XXXXXX")
trap 'rm -rf "$status_dir"' EXIT
running=0
for h in "${harnesses[@]}"; do
	( if fuzz_one "$h" >"$status_dir/$h.out"; then echo 0 >"$status_dir/$h.rc"
	  else echo 1 >"$status_dir/$h.rc"; fi ) &
	running=$((running + 1))
	if [ "$running" -ge "$jobs" ]; then
		wait -n || true
		running=$((running - 1))
	fi
done
wait
for h in "${harnesses[@]}"; do
	cat "$status_dir/$h.out" 2>/dev/null || true
	if [ "$(cat "$status_dir/$h.rc" 2>/dev/null)" = 0 ]; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
	fi
done
rm -rf "$run/tmp"
echo "fuzz: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
