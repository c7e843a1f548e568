#!/bin/bash
# Memory over uptime, the short form of tools/soak.py (docs/reliability.md, "Memory over
# uptime"): rounds of saves (16 writers at once, safetensors shards with sharding metadata),
# view opens, reads by 16 readers at once and deletes of old steps, against a daemon started as
# users start it (detached, libfuse's default thread settings: workers are started for each
# burst and the idle ones beyond max_idle_threads end).  The daemon's RSS after the last round
# must stay within 64 MiB of its level after the 10 warm-up rounds, of 20.  -o cache_size=32M:
# the chunk cache, bounded by cache_size, fills at the rate the rounds read chunks it does not
# hold; at its default 256 MiB it would still be filling when the short form ends.
#
# In a sanitizer build the RSS is reported, not judged (ASan's quarantine and shadow memory are
# part of it) and fewer rounds run; LeakSanitizer checks the daemon at unmount instead (lib.sh).
# SOAK_ROUNDS, SOAK_WARMUP: override the round counts.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

SOAK=$LIB_DIR/../../tools/soak.py
[ -f "$SOAK" ] || bail "$SOAK is missing"
rounds=${SOAK_ROUNDS:-20} warmup=${SOAK_WARMUP:-10} extra=()
if [ "${CKPT_SANITIZERS:-0}" == 1 ]; then
	rounds=${SOAK_ROUNDS:-10} warmup=${SOAK_WARMUP:-3} extra=(--no-rss-check)
fi

start_daemon -o cache_size=32M || bail "mount $STORE"
pid=$(daemon_pids "$STORE")
[ -n "$pid" ] || bail "no daemon process found for $STORE"
PY_TIMEOUT=600 _py_tap "tools/soak.py" "$PY" "$SOAK" --mount "$MNT" --pid "$pid" \
	--rounds "$rounds" --warmup "$warmup" --margin 64 "${extra[@]}" </dev/null
stop_daemon || fail "unmount"
check "fsck after the soak" "$CKPT" fsck "$STORE"
finish
