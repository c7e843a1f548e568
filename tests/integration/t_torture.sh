#!/bin/bash
# The torture suite's short form (tools/torture/run --short; docs/reliability.md, "Torture
# suite"): the checks of its own checkers, then one round of each kind: crashes (kill -9 by
# timer, at a shim kill point, in background work, in `ckpt gc`), two power-loss cuts, the
# model-checked POSIX workload, single-byte damage, ENOSPC on a tmpfs, 16 writers and 16 view
# readers with the deadlock watchdog.  About 40 s.  The seed is random unless TORTURE_SEED is
# set; a failure prints the command that reruns it.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
need mount umount cp

TOP=$(cd "$LIB_DIR/../.." && pwd)
RUN=$TOP/tools/torture/run
export TORTURE_SHIM=${TORTURE_SHIM:-$(dirname "$CKPT")/torture/.libs/libtorture.so}
[ -e "$TORTURE_SHIM" ] || bail "$TORTURE_SHIM is missing (make builds it)"
SEED=${TORTURE_SEED:-$(( (RANDOM << 15) | RANDOM ))}

if "$PY" "$RUN" --selftest >"$T_DIR/selftest.out" 2>&1; then
	ok "torture self-test: the crash models, the shim's log and its replay, the damage reader"
else
	fail "torture self-test"
fi
grep '^not ok' "$T_DIR/selftest.out" | sed 's/^/# /'

note "seed $SEED"
timeout -k 10 300 "$PY" "$RUN" --short --seed "$SEED" \
	--tmp "$T_DIR/torture" >"$T_DIR/torture.out" 2>&1
rc=$?
sed -n '/^torture summary/,$p' "$T_DIR/torture.out" | sed 's/^/# /'
assert_eq 0 "$rc" "tools/torture/run --short --seed $SEED exits 0"
if [ "$rc" -ne 0 ]; then
	grep -E '^(FAIL|torture: .*rerun)' "$T_DIR/torture.out" | head -n 20 | sed 's/^/# /'
fi
total=$(grep '^  TOTAL' "$T_DIR/torture.out")
check "the summary counts operations and verified files" \
	grep -qE 'operations=[1-9][0-9]* +files_verified=[1-9]' <<<"$total"
check "no file lost, none wrong" grep -q 'lost=0  wrong=0$' <<<"$total"
for k in crash power model damage enospc views; do
	check "kind $k ran a round" grep -qE "^  $k +rounds=[1-9]" "$T_DIR/torture.out"
done
finish
