#!/bin/bash
# Background compression and compaction: chunks are written raw and
# compressed once writes pause; packs that became mostly garbage are
# compacted online.  Content stays exact throughout, the store shrinks, and
# kill -9 in the middle of the background work leaves a store that remounts,
# passes fsck and finishes the work.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
need_py numpy

# bf16-like data (compressible with a byte shuffle), as a safetensors file
cat >"$WORK/gen.py" <<'PY'
import json, struct, sys
import numpy as np
out, seed, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(seed)
tensors, off, blobs, header = {}, 0, [], {}
for i in range(mib // 4):
    w = (rng.standard_normal(2 * 1024 * 1024).astype(np.float32) * 0.02)
    b = (w.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    header[f"layers.{i}.w"] = {"dtype": "BF16", "shape": [2 * 1024 * 1024],
                               "data_offsets": [off, off + len(b)]}
    off += len(b)
    blobs.append(b)
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(out, "wb") as f:
    f.write(struct.pack("<Q", len(h)))
    f.write(h)
    for b in blobs:
        f.write(b)
PY

wait_field() { # STORE KEY VALUE TIMEOUT_S
	local i
	for ((i = 0; i < $4 * 5; i++)); do
		[ "$(stat_field "$1" "$2")" == "$3" ] && return 0
		sleep 0.2
	done
	return 1
}

"$PY" "$WORK/gen.py" "$WORK/a.safetensors" 1 32
"$PY" "$WORK/gen.py" "$WORK/b.safetensors" 2 32

start_daemon || bail "mount $STORE"
cp "$WORK/a.safetensors" "$MNT/a.safetensors"
cp "$WORK/b.safetensors" "$MNT/b.safetensors"
assert_cmp "$WORK/a.safetensors" "$MNT/a.safetensors" "a.safetensors reads back while compression is pending or running"
total=$(( $(stat -c %s "$WORK/a.safetensors") + $(stat -c %s "$WORK/b.safetensors") ))
check "closed files reach the index" wait_field "$STORE" logical_bytes "$total" 30
check "background compression finishes (compression_pending: 0)" wait_field "$STORE" compression_pending 0 30
stored=$(stat_field "$STORE" stored_bytes)
unique=$(stat_field "$STORE" unique_bytes)
assert_lt "$stored" "$unique" "chunks are stored compressed ($stored < $unique)"
# compaction: the raw records left behind are reclaimed online
packs_ok() { [ "$(stat_field "$STORE" pack_bytes)" -le $((stored + stored / 10 + 1048576)) ]; }
for _ in $(seq 100); do packs_ok && break; sleep 0.2; done
check "pack files shrink to about the stored bytes (compaction)" packs_ok
note "stored_bytes $stored, pack_bytes $(stat_field "$STORE" pack_bytes), unique_bytes $unique"
assert_cmp "$WORK/a.safetensors" "$MNT/a.safetensors" "a.safetensors exact after compression + compaction"
assert_cmp "$WORK/b.safetensors" "$MNT/b.safetensors" "b.safetensors exact after compression + compaction"

# deleting a file: its chunks become garbage, the daemon drops them and compaction reclaims
# their space online (design.md section 8.2); gc afterwards finds nothing more to reclaim
before=$(stat_field "$STORE" pack_bytes)
rm "$MNT/b.safetensors"
shrunk() { [ "$(stat_field "$STORE" pack_bytes)" -lt $((before * 3 / 4)) ]; }
for _ in $(seq 100); do shrunk && break; sleep 0.2; done
check "deleted data is reclaimed online" shrunk
online=$(stat_field "$STORE" pack_bytes)
stop_daemon || fail "unmount"
"$CKPT" gc "$STORE" >/dev/null 2>&1
start_daemon || bail "remount"
assert_le "$(stat_field "$STORE" pack_bytes)" "$online" "gc after the online reclaiming grows nothing"
assert_cmp "$WORK/a.safetensors" "$MNT/a.safetensors" "a.safetensors exact after gc"

# kill -9 while the background work runs, twice, then let it finish
for round in 1 2; do
	"$PY" "$WORK/gen.py" "$WORK/c$round.safetensors" $((10 + round)) 32
	cp "$WORK/c$round.safetensors" "$MNT/c$round.safetensors"
	"$PY" -c "import os; fd = os.open('$MNT/c$round.safetensors', os.O_RDONLY); os.fsync(fd)"
	sleep 0.3 # writes paused: background compression starts
	kill9_daemon || bail "kill -9 (round $round)"
	"$CKPT" fsck "$STORE" >"$WORK/fsck$round.out" 2>&1
	assert_eq 0 "$?" "fsck passes after kill -9 during background work (round $round)"
	indent "$WORK/fsck$round.out"
	start_daemon || bail "remount after kill -9 (round $round)"
	assert_cmp "$WORK/c$round.safetensors" "$MNT/c$round.safetensors" "fsynced file intact after kill -9 (round $round)"
done
check "background work resumes after the crashes (compression_pending: 0)" wait_field "$STORE" compression_pending 0 60
for f in a c1 c2; do
	assert_cmp "$WORK/$f.safetensors" "$MNT/$f.safetensors" "$f.safetensors exact at the end"
done
stop_daemon || fail "unmount"
"$CKPT" fsck "$STORE" >"$WORK/fsck.out" 2>&1
assert_eq 0 "$?" "ckpt fsck passes at the end"
indent "$WORK/fsck.out"
finish
