#!/bin/bash
# Space under rewrites: with background work on (the default), 1 MiB ranges of a set of live
# files are rewritten at random (open, pwrite, close); once the writes pause, the pack files
# hold at most 2x the live stored bytes plus 16 MiB, without `ckpt gc` (docs/reliability.md,
# "Space under rewrites"). Meanwhile a read-only descriptor follows each new version, and a
# passthrough file of the tp1_pp1 view opened before the rewrites keeps reading the content it
# had (its hold keeps those chunks) until it is closed. Every file reads back exactly, and the
# store is fsck-clean.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

start_daemon || bail "mount $STORE"

PY_TIMEOUT=300 py_checks "rewrites" "$MNT" "$STORE" "$CKPT" <<'EOF'
import os, random, subprocess, sys, time
from helpers import tap
mnt, store, ckpt = sys.argv[1:4]
MiB = 1 << 20
NFILES, FSIZE, BURSTS, PER_BURST = 6, 4 * MiB, 3, 40
FIXED = 16 * MiB

def stat():
    out = subprocess.run([ckpt, "stat", store], capture_output=True, text=True, check=True).stdout
    return {k.strip(): v.strip() for k, v in (l.split(":", 1) for l in out.splitlines() if ":" in l)}

def packs_and_stored():
    st = stat()
    return int(st["pack_bytes"]), int(st["stored_bytes"])

def wait_bound(limit_s):
    """After a pause: poll until pack bytes <= 2 x stored + FIXED; (ok, packs, stored, seconds)."""
    t0 = time.monotonic()
    while True:
        packs, stored = packs_and_stored()
        if packs <= 2 * stored + FIXED or time.monotonic() - t0 > limit_s:
            return packs <= 2 * stored + FIXED, packs, stored, time.monotonic() - t0
        time.sleep(0.2)

rng = random.Random(22)
model = []
for i in range(NFILES):
    data = rng.randbytes(FSIZE)
    with open(f"{mnt}/f{i}", "wb") as f:
        f.write(data)
    model.append(bytearray(data))

# a read-only descriptor of f0 (follows the latest version) and a passthrough file of f1 in
# the tp1_pp1 view (reads the version it opened)
ro = os.open(f"{mnt}/f0", os.O_RDONLY)
pt = os.open(f"{mnt}/tp1_pp1/f1", os.O_RDONLY)
pt_old = bytes(model[1])
tap(os.pread(pt, FSIZE, 0) == pt_old, "the passthrough file reads f1")

follow_ok = True
for burst in range(BURSTS):
    t0 = time.monotonic()
    for k in range(PER_BURST):
        i = rng.randrange(NFILES)
        off = rng.randrange(FSIZE - MiB)
        buf = rng.randbytes(MiB)
        fd = os.open(f"{mnt}/f{i}", os.O_WRONLY)
        os.pwrite(fd, buf, off)
        os.close(fd)
        model[i][off:off + MiB] = buf
        if i == 0:
            follow_ok &= os.pread(ro, FSIZE, 0) == bytes(model[0])
    wrote_s = time.monotonic() - t0
    ok, packs, stored, waited = wait_bound(60)
    print(f"burst {burst}: {PER_BURST} MiB rewritten in {wrote_s:.1f} s; after the pause "
          f"{packs} pack bytes for {stored} stored ({waited:.1f} s)")
    tap(ok, f"burst {burst}: pack bytes {packs} <= 2 x {stored} stored + {FIXED >> 20} MiB")
    tap(os.pread(ro, FSIZE, 0) == bytes(model[0]),
        f"burst {burst}: the read-only descriptor reads f0's latest version after the pause")
    tap(os.pread(pt, FSIZE, 0) == pt_old,
        f"burst {burst}: the passthrough file still reads the version of f1 it opened")

tap(follow_ok, "the read-only descriptor read each new version of f0 right after its close")
os.close(ro)
os.close(pt)
ok, packs, stored, waited = wait_bound(60)
tap(ok, f"passthrough closed: pack bytes {packs} <= 2 x {stored} stored + {FIXED >> 20} MiB")
for i in range(NFILES):
    with open(f"{mnt}/f{i}", "rb") as f:
        tap(f.read() == bytes(model[i]), f"f{i} reads back exactly")
with open(f"{store}.model", "wb") as f:
    for m in model:
        f.write(m)
EOF

remount || bail "remount"
check "every file reads back exactly after a remount" \
	"$PY" -c 'import sys
mnt, ref = sys.argv[1], open(sys.argv[2], "rb").read()
n = 4 << 20
sys.exit(any(open(f"{mnt}/f{i}", "rb").read() != ref[i * n:(i + 1) * n] for i in range(6)))' \
	"$MNT" "$STORE.model"
stop_daemon || fail "unmount"
check "ckpt fsck" "$CKPT" fsck "$STORE"
finish
