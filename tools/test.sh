#!/usr/bin/env bash
# Run the whole test suite: unit tests (Check) and FUSE integration tests (make check), the same
# again in a sanitizer build (tools/sanitize.sh), the Python suite (tests/python, pytest from
# ./.venv), then a short run of each fuzzing harness (tools/fuzz.sh).  Prints one summary line
# that adds them up and exits non-zero if anything failed.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
status=0
make -j"$(nproc)" check || status=$?
pass=0 fail=0 skip=0
if [ -f test-suite.log ]; then
	count() { cat tests/*.trs tests/integration/*.trs 2>/dev/null | grep -c "^:test-result: $1" || true; }
	pass=$(count PASS)
	fail=$(( $(count FAIL) + $(count ERROR) + $(count XPASS) ))
	skip=$(count SKIP)
	if [ "$status" -ne 0 ]; then
		cat test-suite.log
	fi
	echo "make check: $pass passed, $fail failed, $skip skipped"
elif [ "$status" -ne 0 ]; then
	# make check stopped before any test ran (a build error): no counts, but a failure
	fail=1
fi

# make check again in a sanitizer build (AddressSanitizer, LeakSanitizer, UBSan; any report fails
# a test), made by tools/sanitize.sh in build-san/ beside the in-tree build, which it leaves as
# it is.  Its tests count in the summary line below; it adds about 3 minutes on 2 cores
# (docs/reliability.md, "Sanitizers").
san_status=0
tools/sanitize.sh || san_status=$?
san_dir=build-san/obj
if [ -f "$san_dir/test-suite.log" ]; then
	san_count() { cat "$san_dir"/tests/*.trs "$san_dir"/tests/integration/*.trs 2>/dev/null |
		grep -c "^:test-result: $1" || true; }
	spass=$(san_count PASS)
	sfail=$(( $(san_count FAIL) + $(san_count ERROR) + $(san_count XPASS) ))
	sskip=$(san_count SKIP)
	if [ "$san_status" -ne 0 ]; then
		cat "$san_dir/test-suite.log"
	fi
	echo "make check (sanitizers, $san_dir): $spass passed, $sfail failed, $sskip skipped"
	pass=$((pass + spass)) fail=$((fail + sfail)) skip=$((skip + sskip))
elif [ "$san_status" -ne 0 ]; then
	echo "make check (sanitizers): stopped before any test ran (exit $san_status)" >&2
	fail=$((fail + 1))
fi
[ "$san_status" -eq 0 ] || status=1

# Python suite.  pytest's exit code 5 means it collected no tests: that is a failure once
# tests/python holds test files (a broken import or a renamed folder must not pass silently).
py_files=$(find tests/python -name 'test_*.py' -o -name '*_test.py' 2>/dev/null | head -1)
if [ -n "$py_files" ]; then
	junit=$(mktemp "${TMPDIR:-/tmp}/ckptfs-pytest.XXXXXX")
	trap 'rm -f "$junit"' EXIT
	pyrc=0
	.venv/bin/python -m pytest -p no:cacheprovider -rfEs --junitxml="$junit" tests/python || pyrc=$?
	# passed/failed/skipped from pytest's own JUnit report (tests, failures, errors, skipped)
	read -r ppass pfail pskip < <(.venv/bin/python - "$junit" <<'PY'
import sys
import xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    print(0, 0, 0)
    raise SystemExit
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
t = f = s = 0
for su in suites:
    t += int(su.get("tests", 0))
    f += int(su.get("failures", 0)) + int(su.get("errors", 0))
    s += int(su.get("skipped", 0))
print(t - f - s, f, s)
PY
)
	if [ "$pyrc" -eq 5 ]; then
		echo "pytest: no tests collected from tests/python, which holds test files" >&2
		pfail=$((pfail + 1))
	elif [ "$pyrc" -ne 0 ] && [ "$pfail" -eq 0 ]; then
		# interrupted, internal or usage error: pytest's report may count nothing failed
		echo "pytest: exited with $pyrc" >&2
		pfail=$((pfail + 1))
	fi
	[ "$pyrc" -eq 0 ] || status=1
	echo "pytest: $ppass passed, $pfail failed, $pskip skipped"
	pass=$((pass + ppass)) fail=$((fail + pfail)) skip=$((skip + pskip))
else
	echo "pytest: tests/python holds no test files yet"
fi
# ---- fuzzing (tests/fuzz, tools/fuzz.sh; docs/reliability.md, "Fuzzing") ----
# Each libFuzzer harness for CKPT_FUZZ_SECONDS (default 20) seconds, after replaying its seeds
# and regression inputs; a harness that crashes, hangs or trips a sanitizer is one failure.
fuzz_log=$(mktemp "${TMPDIR:-/tmp}/ckptfs-fuzz.XXXXXX")
frc=0
tools/fuzz.sh all "${CKPT_FUZZ_SECONDS:-20}" 2>&1 | tee "$fuzz_log" || frc=$?
if read -r fpass ffail < <(sed -n 's/^fuzz: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$fuzz_log"); then
	[ "$frc" -eq 0 ] || [ "$ffail" -gt 0 ] || ffail=1
else
	echo "fuzz: tools/fuzz.sh exited with $frc before running the harnesses" >&2
	fpass=0 ffail=1
fi
rm -f "$fuzz_log"
[ "$ffail" -eq 0 ] || status=1
pass=$((pass + fpass)) fail=$((fail + ffail))
# ---- end of fuzzing ----

# One summary line for humans and CI.
echo "$pass passed, $fail failed, $skip skipped"
if [ "$fail" -ne 0 ] && [ "$status" -eq 0 ]; then
	status=1
fi
exit "$status"
