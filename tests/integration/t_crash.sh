#!/bin/bash
# Crash safety: kill -9 the daemon while a writer loop runs, after several fsynced files (one of
# them still open, one renamed into place + dir fsync); remount; every fsynced file is intact,
# no unsynced file is torn, `ckpt fsck` passes. Two rounds, the second on the recovered store.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

cat >"$WORK/crashwriter.py" <<'EOF'
import os, random, sys, time
MiB = 1 << 20
mode, mnt, ref, rnd = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
R = random.Random(rnd)

def put(path, data, sync=True, fsync_dir=False):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for k in range(0, len(data), 1 << 20):
        os.write(fd, data[k:k + (1 << 20)])
    if sync:
        os.fsync(fd)
    os.close(fd)

if mode == "fsynced":
    # round-specific files, all fsynced; refs copied to ref/<name with / -> __>
    os.makedirs(os.path.join(mnt, f"r{rnd}", "sub"), exist_ok=True)
    files = {f"r{rnd}/a.bin": R.randbytes(4 * MiB), f"r{rnd}/one": b"1",
             f"r{rnd}/empty": b"", f"r{rnd}/sub/b.bin": R.randbytes(3 * MiB + 5),
             f"r{rnd}/sub/c.txt": b"hello crash\n" * 10000,
             "shared.bin": R.randbytes(2 * MiB + 1)}   # rewritten (fsynced) every round
    for name, data in files.items():
        put(os.path.join(mnt, name), data)
        with open(os.path.join(ref, name.replace("/", "__")), "wb") as f:
            f.write(data)
    # overwrite in the middle of an existing file (staged rewrite), fsync
    base = bytearray(R.randbytes(3 * MiB))
    put(os.path.join(mnt, f"r{rnd}", "staged.bin"), bytes(base))
    fd = os.open(os.path.join(mnt, f"r{rnd}", "staged.bin"), os.O_RDWR)
    patch = R.randbytes(100000)
    os.pwrite(fd, patch, MiB + 12345)
    base[MiB + 12345:MiB + 12345 + len(patch)] = patch
    os.fsync(fd)
    os.close(fd)
    with open(os.path.join(ref, f"r{rnd}__staged.bin"), "wb") as f:
        f.write(base)
    # two fsyncs on one fd: the second one's content counts
    fd = os.open(os.path.join(mnt, f"r{rnd}", "twice.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
    first, second = R.randbytes(MiB), R.randbytes(MiB + 7)
    os.write(fd, first)
    os.fsync(fd)
    os.write(fd, second)
    os.fdatasync(fd)
    os.close(fd)
    with open(os.path.join(ref, f"r{rnd}__twice.bin"), "wb") as f:
        f.write(first + second)
    # write to a temp name, fsync, rename into place, fsync the dir
    data = R.randbytes(MiB + 3)
    d = os.path.join(mnt, f"r{rnd}")
    put(os.path.join(d, "renamed.tmp"), data)
    os.rename(os.path.join(d, "renamed.tmp"), os.path.join(d, "renamed.bin"))
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)
    os.close(dfd)
    with open(os.path.join(ref, f"r{rnd}__renamed.bin"), "wb") as f:
        f.write(data)
elif mode == "held":
    # fsync v1 and keep the file open; then overwrite part of it without fsync (v2)
    v1 = R.randbytes(2 * MiB)
    v2 = bytearray(v1)
    v2[MiB:MiB + 4096] = R.randbytes(4096)
    with open(os.path.join(ref, f"held{rnd}.v1"), "wb") as f:
        f.write(v1)
    with open(os.path.join(ref, f"held{rnd}.v2"), "wb") as f:
        f.write(v2)
    fd = os.open(os.path.join(mnt, f"held{rnd}.bin"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, v1)
    os.fsync(fd)
    os.pwrite(fd, v2[MiB:MiB + 4096], MiB)
    open(os.path.join(ref, f"held{rnd}.ready"), "w").close()
    time.sleep(120)
elif mode == "syncloop":
    # fsynced writes until killed; a file is logged only after its fsync returned
    n = 0
    log = open(os.path.join(ref, f"synced{rnd}"), "a")
    os.makedirs(os.path.join(mnt, f"sync{rnd}"), exist_ok=True)
    while True:
        data = random.Random(1000 + n).randbytes(R.randrange(1, 2 * MiB))
        try:
            put(os.path.join(mnt, f"sync{rnd}", f"s{n}"), data, sync=True)
        except OSError:
            break
        log.write(f"{n} {len(data)}\n")
        log.flush()
        n += 1
elif mode == "loop":
    # unsynced churn until killed: files loop<rnd>_<n> of 1 MiB from a known pattern
    n = 0
    while True:
        data = random.Random(n).randbytes(MiB)
        try:
            put(os.path.join(mnt, f"loop{rnd}_{n}"), data, sync=False)
        except OSError:
            break
        n += 1
        with open(os.path.join(ref, f"progress{rnd}"), "w") as f:
            f.write(str(n))
EOF

mkdir -p "$WORK/ref"

# check_fsynced ROUNDS...: every fsynced file of the given rounds reads back intact
check_fsynced() {
	local r f name
	for r in "$@"; do
		for f in "$WORK/ref/r${r}__"*; do
			name=${f##*/}
			name=${name//__//}
			assert_cmp "$f" "$MNT/$name" "fsynced file $name intact"
		done
		check "r$r/renamed.tmp (renamed away before the crash) is gone" \
			absent "$MNT/r$r/renamed.tmp"
	done
	assert_cmp "$WORK/ref/shared.bin" "$MNT/shared.bin" "fsynced rewrite of shared.bin intact"
}

# check_syncloop ROUND: every file whose fsync returned before the crash is intact
check_syncloop() {
	local r=$1
	if "$PY" - "$MNT" "$WORK/ref/synced$r" "$r" >"$WORK/synccheck" 2>&1 <<'EOF'
import os, random, sys
mnt, log, r = sys.argv[1:4]
good = bad = 0
for line in open(log):
    n, size = map(int, line.split())
    want = random.Random(1000 + n).randbytes(size)
    p = os.path.join(mnt, f"sync{r}", f"s{n}")
    try:
        got = open(p, "rb").read()
    except OSError as e:
        got = e
    if got == want:
        good += 1
    else:
        bad += 1
        what = str(got) if isinstance(got, OSError) else f"{len(got)} bytes, want {size}"
        print(f"s{n}: {what}")
print(f"{good} intact, {bad} damaged")
sys.exit(1 if bad or not good else 0)
EOF
	then
		ok "round $r: every file fsynced by the loop before the crash is intact ($(tail -n 1 \
			"$WORK/synccheck"))"
	else
		fail "round $r: every file fsynced by the loop before the crash is intact"
		indent "$WORK/synccheck"
	fi
}

# check_unsynced ROUND: the held file is v1 (fsynced) or v2; loop files are absent, empty or whole
check_unsynced() {
	local r=$1
	if cmp -s "$WORK/ref/held$r.v1" "$MNT/held$r.bin"; then
		ok "fsynced-then-modified open file: fsynced version"
	elif cmp -s "$WORK/ref/held$r.v2" "$MNT/held$r.bin"; then
		ok "fsynced-then-modified open file: complete later version"
	else
		fail "fsynced-then-modified open file is v1 or v2 (size $(stat -c %s "$MNT/held$r.bin"))"
	fi
	if "$PY" - "$MNT" "$r" >"$WORK/loopcheck" 2>&1 <<'EOF'
import os, random, sys
mnt, r = sys.argv[1], sys.argv[2]
seen = bad = 0
for name in os.listdir(mnt):
    if not name.startswith(f"loop{r}_"):
        continue
    seen += 1
    n = int(name.split("_")[1])
    data = open(os.path.join(mnt, name), "rb").read()
    if data and data != random.Random(n).randbytes(1 << 20):
        bad += 1
        print(f"torn: {name} ({len(data)} bytes)")
print(f"seen={seen} bad={bad}")
sys.exit(1 if bad else 0)
EOF
	then
		ok "unsynced loop files are absent, empty or complete ($(tail -n 1 "$WORK/loopcheck"))"
	else
		fail "unsynced loop files are absent, empty or complete"
		indent "$WORK/loopcheck"
	fi
}

# crash_round R: fsynced files + held file + writer loop, then kill -9
crash_round() {
	local r=$1 i held loop sloop
	check "round $r: write fsynced files" "$PY" "$WORK/crashwriter.py" fsynced "$MNT" "$WORK/ref" "$r"
	"$PY" "$WORK/crashwriter.py" held "$MNT" "$WORK/ref" "$r" >"$WORK/held$r.log" 2>&1 &
	held=$!
	"$PY" "$WORK/crashwriter.py" loop "$MNT" "$WORK/ref" "$r" >"$WORK/loop$r.log" 2>&1 &
	loop=$!
	"$PY" "$WORK/crashwriter.py" syncloop "$MNT" "$WORK/ref" "$r" >"$WORK/sloop$r.log" 2>&1 &
	sloop=$!
	for ((i = 0; i < 300; i++)); do
		[ -e "$WORK/ref/held$r.ready" ] &&
			[ "$(cat "$WORK/ref/progress$r" 2>/dev/null)" -ge 5 ] 2>/dev/null &&
			[ "$(wc -l <"$WORK/ref/synced$r" 2>/dev/null)" -ge 3 ] 2>/dev/null && break
		sleep 0.1
	done
	[ $i -lt 300 ] || fail "round $r: writers did not get going within 30 s"
	check "round $r: kill -9 the daemon and detach the dead mount" kill9_daemon
	note "round $r: before kill -9 the loops wrote $(cat "$WORK/ref/progress$r" 2>/dev/null)" \
		"unsynced and $(wc -l <"$WORK/ref/synced$r") fsynced files"
	{
		kill "$held" "$loop" "$sloop"
		wait_pids_gone 10 "$held" "$loop" "$sloop" || kill -9 "$held" "$loop" "$sloop"
		wait "$held" "$loop" "$sloop"
	} 2>/dev/null
	if "$CKPT" fsck "$STORE" >"$WORK/fsck.crash$r" 2>&1; then
		note "round $r: ckpt fsck passes right after the crash, before any remount"
	else
		note "round $r: ckpt fsck right after the crash (before remount) exited non-zero:"
		indent "$WORK/fsck.crash$r"
	fi
}

start_daemon || bail "mount $STORE"
ok "daemon mounted"
crash_round 1
start_daemon || bail "remount after the first crash"
ok "remounted after kill -9"
check_fsynced 1
check_syncloop 1
check_unsynced 1
echo "after crash 1" >"$MNT/after1.txt"
assert_eq "after crash 1" "$(cat "$MNT/after1.txt")" "store writable after recovery"

crash_round 2
start_daemon || bail "remount after the second crash"
ok "remounted after the second kill -9"
check_fsynced 1 2
check_syncloop 1
check_syncloop 2
check_unsynced 2
assert_cmp "$WORK/ref/r1__a.bin" "$MNT/r1/a.bin" "round 1 data survives the second crash"
stop_daemon || fail "unmount"
"$CKPT" fsck "$STORE" >"$WORK/fsck.out" 2>&1
assert_eq 0 "$?" "ckpt fsck passes after crash + remount"
indent "$WORK/fsck.out"
check "ckpt fsck says ok" grep -qiw ok "$WORK/fsck.out"
finish
