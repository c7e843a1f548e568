#!/bin/bash
# ENOSPC: the store lives on a 64 MiB tmpfs; writing a file larger than that fails with ENOSPC
# at write() or close(); the mount stays usable; after deleting the big file and remounting
# the store is consistent (fsck), earlier files are intact, and after gc new data fits again.
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
