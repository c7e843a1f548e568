#!/bin/bash
# Run every integration test (or the ones named) and summarize:
#   tests/integration/run_all.sh [t_posix.sh ...]
# Logs go to ${LOGDIR:-/tmp/ckptfs-it-logs}/<test>.log. Exits 1 if any test failed.
dir=$(cd "$(dirname "$0")" && pwd)
logdir=${LOGDIR:-/tmp/ckptfs-it-logs}
mkdir -p "$logdir"
if [ $# -eq 0 ]; then
	set -- "$dir"/t_*.sh
fi
status=0
for t in "$@"; do
	[ -e "$t" ] || t=$dir/$t
	name=$(basename "$t" .sh)
	start=$(date +%s)
	"$t" >"$logdir/$name.log" 2>&1
	rc=$?
	secs=$(($(date +%s) - start))
	case $rc in
	0) res=PASS ;;
	77) res=SKIP ;;
	*) res=FAIL status=1 ;;
	esac
	printf '%-4s %-16s %4ss  %s checks failed  (%s)\n' "$res" "$name" "$secs" \
		"$(grep -c '^not ok' "$logdir/$name.log")" "$logdir/$name.log"
done
exit $status
