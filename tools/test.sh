#!/usr/bin/env bash
# Run the whole test suite: unit tests (Check) and FUSE integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
status=0
make -j"$(nproc)" check || status=$?
# One summary line for humans and CI.
if [ -f test-suite.log ]; then
	count() { cat tests/*.trs tests/integration/*.trs 2>/dev/null | grep -c "^:test-result: $1" || true; }
	pass=$(count PASS)
	fail=$(( $(count FAIL) + $(count ERROR) + $(count XPASS) ))
	skip=$(count SKIP)
	if [ "$status" -ne 0 ]; then
		cat test-suite.log
	fi
	echo "$pass passed, $fail failed, $skip skipped"
fi
exit "$status"
