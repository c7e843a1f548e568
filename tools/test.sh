#!/usr/bin/env bash
# Run the whole test suite: unit tests (Check) and FUSE integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
status=0
make -j"$(nproc)" check || status=$?
# One summary line for humans and CI.
if [ -f test-suite.log ]; then
	pass=$(grep -h '^:test-result: PASS' tests/*.trs tests/integration/*.trs 2>/dev/null | wc -l)
	fail=$(grep -h '^:test-result: \(FAIL\|ERROR\|XPASS\)' tests/*.trs tests/integration/*.trs 2>/dev/null | wc -l)
	skip=$(grep -h '^:test-result: SKIP' tests/*.trs tests/integration/*.trs 2>/dev/null | wc -l)
	[ "$status" -ne 0 ] && cat test-suite.log
	echo "$pass passed, $fail failed, $skip skipped"
fi
exit "$status"
