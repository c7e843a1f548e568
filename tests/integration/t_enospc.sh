#!/bin/bash
# ENOSPC: the store lives on a 64 MiB tmpfs; writing a file larger than that fails with ENOSPC
# at write() or close(); the mount stays usable. Then the store is filled with committed data
# and metadata-heavy operations (symlinks with long targets, directories, empty files,
# renames, a view whose parse record cannot be stored) run until the index refuses them: they
# fail with ENOSPC, the daemon stays up, deleting files still works; then another program
# fills the filesystem to the last byte: metadata changes fail with ENOSPC, deleting a file
# works (the index's reserve), and once the space is freed everything works again. After
# remounting the store is consistent (fsck), earlier files are intact, and after gc new data
# fits again. docs/reliability.md, "ENOSPC".
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
need mount

TM=$T_DIR/tm
mkdir -p "$TM"
mount -t tmpfs -o size=64m tmpfs "$TM" || bail "mount a 64 MiB tmpfs on $TM (needs root)"
on_exit "umount '$TM' 2>/dev/null || umount -l '$TM'"
STORE=$TM/store

start_daemon || bail "mount $STORE"
ok "daemon mounted on a store in a 64 MiB tmpfs"

for i in 1 2 3; do
	rand_file "$WORK/early$i" $((2 * MiB + i))
	cp "$WORK/early$i" "$MNT/early$i.bin"
done
echo "note" >"$MNT/note.txt"
sync "$MNT"/early*.bin "$MNT/note.txt"

PY_TIMEOUT=90 py_checks "fill the store" "$MNT/big.bin" <<'EOF'
import errno, os, random, sys
from helpers import tap
path = sys.argv[1]
rnd = random.Random(1)
err = where = None
written = 0
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
try:
    for i in range(256):
        os.write(fd, rnd.randbytes(1 << 20))
        written += 1
except OSError as e:
    err, where = e.errno, "write"
try:
    os.close(fd)
except OSError as e:
    if err is None:
        err, where = e.errno, "close"
name = errno.errorcode.get(err, str(err)) if err is not None else "no error"
print(f"wrote {written} MiB; first error: {name} at {where}")
tap(err == errno.ENOSPC,
    f"writing 256 MiB into a 64 MiB store fails with ENOSPC ({name} at {where})")
EOF

check "mount still answers after ENOSPC (ls)" ls "$MNT"
# the failure is in the log at the default level, stamped, naming the file and the reason
check "the log names the file and the reason (ENOSPC)" grep -qE \
	'^[0-9T:.-]+Z ckptfs\[[0-9]+/[0-9]+\] (warning|error): /big\.bin: .*No space left on device' \
	"$STORE/ckptfs.log"
for i in 1 2 3; do
	assert_cmp "$WORK/early$i" "$MNT/early$i.bin" "earlier file $i readable while the store is full"
done
check "delete the big file" rm -f "$MNT/big.bin"

# the chunks of the big file, never committed, are reclaimed online once writes pause
reclaimed() { [ "$(df --output=avail "$TM" | tail -n 1)" -gt $((40 * 1024)) ]; }
for _ in $(seq 150); do reclaimed && break; sleep 0.2; done
check "the big file's uncommitted chunks are reclaimed online (>40 MiB free)" reclaimed

# ---------------------------------------------------------------- the index's own ENOSPC
# a safetensors file whose view is read only once the index is full (its parse record, a
# metadata write, cannot be stored then; the view must still work)
mkdir -p "$MNT/v"
"$PY" "$LIB_DIR/helpers.py" safetensors "$MNT/v/model.safetensors" 3 2 65536 0 >/dev/null
PY_TIMEOUT=240 py_checks "metadata until the index is full" "$MNT" <<'EOF'
import errno, os, random, sys, time
from helpers import tap
mnt = sys.argv[1]
rnd = random.Random(2)
name = lambda e: errno.errorcode.get(e, str(e))

# committed data until the chunk space is used up (the store keeps the rest for its index)
n, err = 0, None
while err is None and n < 200:
    path = f"{mnt}/fill{n:03d}.bin"
    try:
        with open(path, "wb") as f:
            f.write(rnd.randbytes(1 << 20))
        n += 1
    except OSError as e:
        err = e.errno
        try:
            os.unlink(path)
        except OSError:
            pass
tap(err == errno.ENOSPC, f"{n} files of 1 MiB committed, then ENOSPC ({name(err)})")
# a new mtime: the view's next build parses the file again and tries to store its parse
st = os.stat(f"{mnt}/v/model.safetensors")
os.utime(f"{mnt}/v/model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))

# metadata only: long symlinks, directories, empty files, renames, until the index has
# refused 50 of them (near the limit some get through again as RocksDB compacts its files)
os.makedirs(f"{mnt}/meta")
names = {}  # what exists in meta/: name -> "l", "d" or "e"
made = refused = 0
other, t0 = [], time.monotonic()
for i in range(200000):
    k = i % 4
    try:
        if k == 0:
            os.symlink(rnd.randbytes(1500).hex(), f"{mnt}/meta/l{i}")
            names[f"l{i}"] = "l"
        elif k == 1:
            os.mkdir(f"{mnt}/meta/d{i}")
            names[f"d{i}"] = "d"
        elif k == 2:
            open(f"{mnt}/meta/e{i}", "w").close()
            names[f"e{i}"] = "e"
        elif f"e{i - 1}" in names:
            os.rename(f"{mnt}/meta/e{i - 1}", f"{mnt}/meta/r{i}")
            names[f"r{i}"] = names.pop(f"e{i - 1}")
        made += 1
    except OSError as e:
        if e.errno != errno.ENOSPC:
            other.append(name(e.errno))
            break
        refused += 1
        if refused == 50:
            break
print(f"{made} metadata operations done and {refused} refused in {time.monotonic() - t0:.1f} s")
tap(refused == 50 and not other,
    f"the index refuses metadata operations with ENOSPC only ({refused} ENOSPC, other: {other})")
tap(sorted(os.listdir(f"{mnt}/meta")) == sorted(names), "the directory lists what was made")
# the view of a file whose parse cannot be stored now
views = os.listdir(f"{mnt}/tp1_pp1/v")
data = b"".join(open(f"{mnt}/tp1_pp1/v/{v}", "rb").read() for v in views)
tap(len(views) > 0 and len(data) > 2 * 65536, f"its view reads while the index is full ({views})")
# deleting works on a full index; the data files' packs are reclaimed online
for v in sorted(names)[:200]:
    p = f"{mnt}/meta/{v}"
    os.rmdir(p) if names.pop(v) == "d" else os.unlink(p)
for i in range(n):
    os.unlink(f"{mnt}/fill{i:03d}.bin")
tap(True, f"deleting 200 metadata entries and the {n} data files works on a full index")
ok = False
for _ in range(100):  # refused until the deletes are indexed and their packs reclaimed
    try:
        os.symlink("y" * 100, f"{mnt}/meta/after")
        ok = True
        break
    except OSError as e:
        if e.errno != errno.ENOSPC:
            break
        time.sleep(0.2)
tap(ok, "after deleting, metadata changes work again")
EOF
check "daemon still serving after the index's ENOSPC (ls)" ls "$MNT/meta"

# ---------------------------------------------------------------- another program fills the disk
dd if=/dev/zero of="$TM/filler" bs=64k 2>/dev/null
note "filled by another program: $(df --output=avail "$TM" | tail -n 1) KiB free"
mkdir_enospc() {
	local out
	out=$(mkdir "$MNT/full_dir" 2>&1) && return 1
	[[ $out == *"No space left on device"* ]]
}
check "mkdir fails with ENOSPC while the filesystem is full" mkdir_enospc
check "deleting a file works while the filesystem is full (the index's reserve)" \
	rm -f "$MNT/early3.bin"
check "the daemon still answers" ls "$MNT"
rm -f "$TM/filler"
ok_again() { mkdir "$MNT/after_filler" 2>/dev/null; }
for _ in $(seq 50); do ok_again && break; sleep 0.2; done
check "after the other program's file is deleted, mkdir works" test -d "$MNT/after_filler"
check "and a new file can be written" cp "$WORK/early1" "$MNT/after_filler/early1.bin"
assert_cmp "$WORK/early1" "$MNT/after_filler/early1.bin" "the new file reads back"
rm -rf "$MNT/meta" "$MNT/after_filler" "$MNT/v"
cp "$WORK/early3" "$MNT/early3.bin"
check "big file is gone" absent "$MNT/big.bin"
note "tmpfs usage: $(df -h --output=used,avail "$TM" | tail -n 1)"

if remount; then
	ok "remounted after ENOSPC"
else
	fail "remounted after ENOSPC"
	note "trying ckpt fsck and ckpt gc before mounting again:"
	"$CKPT" fsck "$STORE" 2>&1 | sed 's/^/#   fsck: /'
	"$CKPT" gc "$STORE" 2>&1 | sed 's/^/#   gc: /'
	start_daemon || bail "mount after ENOSPC (even after gc)"
fi
for i in 1 2 3; do
	assert_cmp "$WORK/early$i" "$MNT/early$i.bin" "earlier file $i intact after remount"
done
assert_eq note "$(cat "$MNT/note.txt")" "earlier small file intact after remount"
check "big file still gone after remount" absent "$MNT/big.bin"
stop_daemon || fail "unmount"
"$CKPT" fsck "$STORE" >"$WORK/fsck.out" 2>&1
assert_eq 0 "$?" "ckpt fsck passes after ENOSPC"
indent "$WORK/fsck.out"
assert_eq 4 "$(stat_field "$STORE" files)" "ckpt stat: 4 files"

check "ckpt gc after ENOSPC" "$CKPT" gc "$STORE"
note "tmpfs usage after gc: $(df -h --output=used,avail "$TM" | tail -n 1)"
start_daemon || bail "mount after gc"
rand_file "$WORK/late" $((16 * MiB))
check "a 16 MiB file fits again after gc" cp "$WORK/late" "$MNT/late.bin"
remount || bail "remount"
assert_cmp "$WORK/late" "$MNT/late.bin" "file written after gc reads back after remount"
for i in 1 2 3; do
	assert_cmp "$WORK/early$i" "$MNT/early$i.bin" "earlier file $i intact at the end"
done
stop_daemon || fail "unmount"
check "ckpt fsck at the end" "$CKPT" fsck "$STORE"
finish
