#!/bin/bash
# Damaged pack data: a flipped byte inside the first chunk's stored bytes makes reads of the
# affected file fail with EIO (never wrong bytes), other files stay readable, and `ckpt fsck`
# exits non-zero naming the damaged file. Same for a pack cut short at the end.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

PACK_HDR=64
REC_HDR=48

# read_check FILE REF DESC: reading FILE must fail with EIO and never return wrong bytes
read_check() {
	local f=$1 ref=$2 desc=$3 out=$WORK/read.err
	if cat "$f" >/dev/null 2>"$out"; then
		fail "$desc: cat fails"
	else
		ok "$desc: cat fails"
		check "$desc: cat reports an I/O error" grep -q "Input/output error" "$out"
	fi
	if dd if="$f" of=/dev/null bs=1M status=none 2>"$out"; then
		fail "$desc: dd fails"
	else
		ok "$desc: dd fails"
		check "$desc: dd reports an I/O error" grep -q "Input/output error" "$out"
	fi
	py_checks "$desc: python reads" "$f" "$ref" "$desc" <<'EOF'
import errno, os, sys
from helpers import tap
f, ref, desc = sys.argv[1:4]
want = open(ref, "rb").read()
fd = os.open(f, os.O_RDONLY)
step = 64 << 10
eio = wrong = good = short = other = 0
# Every 64 KiB, plus the last 4 KiB alone: a pread that spans good and
# damaged bytes may legitimately return the good ones (a short read), so a
# damaged tail shorter than 64 KiB needs a pread that starts inside it.
offs = list(range(0, len(want), step))
if len(want) > 4096:
    offs.append(len(want) - 4096)
for off in offs:
    try:
        b = os.pread(fd, step, off)
    except OSError as e:
        if e.errno == errno.EIO:
            eio += 1
        else:
            other += 1
            print(f"offset {off}: {e}")
        continue
    if b == want[off:off + step]:
        good += 1
    elif b == want[off:off + len(b)]:
        short += 1
        print(f"offset {off}: short read of {len(b)} bytes (correct bytes)")
    else:
        wrong += 1
        print(f"offset {off}: {len(b)} bytes returned, differ from the written data")
os.close(fd)
print(f"{desc}: 64 KiB reads: {good} good, {eio} EIO, {short} short, {wrong} wrong, "
      f"{other} other errors")
tap(eio > 0, f"{desc}: some 64 KiB pread()s fail with EIO")
tap(wrong == 0, f"{desc}: no pread() returns wrong bytes")
tap(other == 0, f"{desc}: every failing pread() fails with EIO")
size = os.stat(f).st_size
tap(size == len(want), f"{desc}: file size still {len(want)} after the failed reads ({size})")
EOF
}

# No background work: this test flips bytes of records it finds by position,
# so chunks must not move to new records (compression, compaction) meanwhile.
# ---------------------------------------------------------------- flipped byte in chunk data
start_daemon -o nobackground || bail "mount $STORE"
ok "daemon mounted"
rand_file "$WORK/victim" $((4 * MiB))
cp "$WORK/victim" "$MNT/victim.bin"
"$PY" -c 'import sys
for i in range(60000):
    sys.stdout.write(f"line {i}: loss={(i * 7919) % 1000 / 1000:.3f} step={i * 13}\n")' \
	>"$WORK/comp"
cp "$WORK/comp" "$MNT/comp.txt"
stop_daemon || fail "unmount"
start_daemon -o nobackground || bail "remount"
rand_file "$WORK/bystander" $((2 * MiB))
mkdir "$MNT/dir"
cp "$WORK/bystander" "$MNT/dir/bystander.bin"
echo "small" >"$MNT/small.txt"
stop_daemon || fail "unmount"

pack=$(find "$STORE/packs" -name 'pack-*.ckpk' | sort | head -n 1)
[ -n "$pack" ] || bail "no pack file under $STORE/packs"
note "first pack: $pack ($(stat -c %s "$pack") bytes)"
check "clean store passes fsck before the damage" "$CKPT" fsck "$STORE"
cp "$pack" "$WORK/pack.orig"
check "flip a byte in the first chunk's data" flip_byte "$pack" $((PACK_HDR + REC_HDR + 100))
"$PY" "$LIB_DIR/helpers.py" records "$pack" >"$WORK/records"
# a compressed record (stored < raw): flip a byte in the middle of its stored bytes
crec=$(awk '$3 < $4 {print $1, $3; exit}' "$WORK/records")
if [ -n "$crec" ]; then
	check "flip a byte inside a compressed chunk" flip_byte "$pack" \
		$(( ${crec% *} + REC_HDR + ${crec#* } / 2 ))
else
	fail "comp.txt was stored compressed (records: $(wc -l <"$WORK/records"))"
fi

start_daemon -o nobackground || bail "mount the damaged store"
read_check "$MNT/victim.bin" "$WORK/victim" "flipped byte"
read_check "$MNT/comp.txt" "$WORK/comp" "flipped byte in compressed data"
assert_cmp "$WORK/bystander" "$MNT/dir/bystander.bin" "an undamaged file still reads back"
assert_eq small "$(cat "$MNT/small.txt")" "an undamaged small file still reads back"
check "the damaged file can still be stat'ed and listed" stat "$MNT/victim.bin"
stop_daemon || fail "unmount"

"$CKPT" fsck "$STORE" >"$WORK/fsck.out" 2>&1
rc=$?
indent "$WORK/fsck.out"
assert_nonzero "$rc" "ckpt fsck exits non-zero on a damaged chunk"
check "ckpt fsck names the damaged file" grep -q "victim.bin" "$WORK/fsck.out"
check "ckpt fsck names the damaged compressed file" grep -q "comp.txt" "$WORK/fsck.out"
grep -q "bystander" "$WORK/fsck.out" &&
	note "fsck output mentions the undamaged dir/bystander.bin (check it is not reported damaged)"

# the damage is the only problem: restoring the byte makes everything good again
cp "$WORK/pack.orig" "$pack"
check "fsck passes once the byte is restored" "$CKPT" fsck "$STORE"
start_daemon -o nobackground || bail "mount the repaired store"
assert_cmp "$WORK/victim" "$MNT/victim.bin" "repaired file reads back"
assert_cmp "$WORK/comp" "$MNT/comp.txt" "repaired compressed file reads back"

# ---------------------------------------------------------------- pack cut short
rand_file "$WORK/tail" $((3 * MiB))
cp "$WORK/tail" "$MNT/tail.bin"
stop_daemon || fail "unmount"
last=$(find "$STORE/packs" -name 'pack-*.ckpk' | sort | tail -n 1)
size=$(stat -c %s "$last")
note "last pack: $last ($size bytes)"
check "cut 4096 bytes off the end of the last pack" truncate -s $((size - 4096)) "$last"
start_daemon -o nobackground || bail "mount the store with a short pack"
read_check "$MNT/tail.bin" "$WORK/tail" "short pack"
assert_cmp "$WORK/bystander" "$MNT/dir/bystander.bin" "short pack: earlier file still reads back"
stop_daemon || fail "unmount"
"$CKPT" fsck "$STORE" >"$WORK/fsck2.out" 2>&1
rc=$?
indent "$WORK/fsck2.out"
assert_nonzero "$rc" "ckpt fsck exits non-zero on a short pack"
check "ckpt fsck names the file in the lost tail" grep -q "tail.bin" "$WORK/fsck2.out"

# ---------------------------------------------------------------- damaged record header
check "flip a byte in the first record's header" flip_byte "$pack" $((PACK_HDR + 20))
start_daemon -o nobackground || bail "mount the store with a damaged record header"
read_check "$MNT/victim.bin" "$WORK/victim" "record header"
stop_daemon || fail "unmount"
"$CKPT" fsck "$STORE" >"$WORK/fsck3.out" 2>&1
assert_nonzero "$?" "ckpt fsck exits non-zero on a damaged record header"
check "ckpt fsck names the file with the damaged record header" grep -q "victim.bin" \
	"$WORK/fsck3.out"
cp "$WORK/pack.orig" "$pack"

# ---------------------------------------------------------------- a pack file gone
second=$(find "$STORE/packs" -name 'pack-*.ckpk' | sort | sed -n 2p)
note "removing the second pack: $second"
check "remove the pack holding dir/bystander.bin" rm "$second"
start_daemon -o nobackground || bail "mount the store with a missing pack"
read_check "$MNT/dir/bystander.bin" "$WORK/bystander" "missing pack"
assert_cmp "$WORK/victim" "$MNT/victim.bin" "missing pack: a file in another pack reads back"
stop_daemon || fail "unmount"
"$CKPT" fsck "$STORE" >"$WORK/fsck4.out" 2>&1
assert_nonzero "$?" "ckpt fsck exits non-zero on a missing pack"
check "ckpt fsck names the file in the missing pack" grep -q "bystander.bin" "$WORK/fsck4.out"
finish
