#!/bin/bash
# Ordinary tools on the mount: fallocate(2) in every mode tools use (util-linux fallocate,
# posix_fallocate then sequential writes, rsync --preallocate), small writes (4 KiB, 10 KiB,
# odd sizes) read back whole after close, tar xf of a generated tree, and the short form of
# tools/bench/small_io.py (tiny sizes: it checks what it measures, not speed).
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

need fallocate rsync tar head

start_daemon || bail "mount $STORE"
ok "daemon mounted"

# ---------------------------------------------------------------- fallocate(1)
check "fallocate -l 10M makes a new 10 MiB file" fallocate -l $((10 * MiB)) "$MNT/pre"
assert_eq $((10 * MiB)) "$(stat -c %s "$MNT/pre")" "fallocate mode 0 sets the size"
head -c $((10 * MiB)) /dev/zero >"$WORK/zero10"
assert_cmp "$WORK/zero10" "$MNT/pre" "the reserved range reads as zeros"
check "fallocate -n (keep size) beyond the end" fallocate -n -l $((20 * MiB)) "$MNT/pre"
assert_eq $((10 * MiB)) "$(stat -c %s "$MNT/pre")" "FALLOC_FL_KEEP_SIZE keeps the size"
check "fallocate inside the file" fallocate -o $MiB -l $MiB "$MNT/pre"
assert_eq $((10 * MiB)) "$(stat -c %s "$MNT/pre")" "a reserve inside the file keeps the size"

rand_file "$WORK/r3" $((3 * MiB))
cp "$WORK/r3" "$MNT/holes"
check "fallocate -p punches a hole" fallocate -p -o $MiB -l $MiB "$MNT/holes"
check "fallocate -z zeroes a range past the end" fallocate -z -o $((2 * MiB)) -l $((2 * MiB)) "$MNT/holes"
"$PY" - "$WORK/r3" "$WORK/holes.want" <<'EOF'
import sys
r = open(sys.argv[1], 'rb').read()
M = 1 << 20
open(sys.argv[2], 'wb').write(r[:M] + bytes(M) + bytes(2 * M))
EOF
assert_cmp "$WORK/holes.want" "$MNT/holes" "punched and zeroed ranges read as zeros, the rest unchanged"
check_fails "fallocate -c (collapse range) is refused" fallocate -c -o 0 -l 4096 "$MNT/holes"
cp "$T_DIR/check.out" "$WORK/collapse.out"
check "... with 'Operation not supported'" grep -q "not supported" "$WORK/collapse.out"
assert_cmp "$WORK/holes.want" "$MNT/holes" "a refused collapse changes nothing"
check_fails "fallocate beyond the free space fails" fallocate -l 100T "$MNT/huge"
cp "$T_DIR/check.out" "$WORK/enospc.out"
check "... with ENOSPC" grep -q "No space left" "$WORK/enospc.out"
assert_eq 0 "$(stat -c %s "$MNT/huge")" "... and does not grow the file"

# tools_block DIR TAG: preallocating writers, rsync, small writes and tar into DIR
tools_block() {
	local D=$1 TAG=$2
	mkdir -p "$D"
	# the downloader's pattern: reserve the whole size, then write it from the start
	py_checks "posix_fallocate then sequential writes ($TAG)" "$D" "$TAG" <<'EOF'
import os, sys
mnt, tag = sys.argv[1], sys.argv[2]
M = 1 << 20
fd = os.open(f"{mnt}/dl", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
os.posix_fallocate(fd, 0, 5 * M)
print(("ok" if os.fstat(fd).st_size == 5 * M else "not ok") + f" - posix_fallocate sets the size while open ({tag})")
for i in range(3):
    os.write(fd, bytes([65 + i]) * M)
os.close(fd)
d = open(f"{mnt}/dl", "rb").read()
want = b"A" * M + b"B" * M + b"C" * M + bytes(2 * M)
print(("ok" if d == want else "not ok") + f" - writes over the reserved range, the rest zeros, after close ({tag})")
fd = os.open(f"{mnt}/dl", os.O_WRONLY | os.O_APPEND)
os.write(fd, b"tail")
os.close(fd)
d = open(f"{mnt}/dl", "rb").read()
print(("ok" if d == want + b"tail" else "not ok") + f" - an append after the reserved zeros ({tag})")
EOF

	check "rsync -a --preallocate into the mount ($TAG)" rsync -a --preallocate "$WORK/src/" "$D/rs/"
	assert_same_tree "$WORK/src" "$D/rs" "rsync --preallocate copy is identical ($TAG)"
	# -I: the change may fall in the second of the first copy, which rsync's size+mtime check misses
	check "rsync -a --preallocate --inplace over a changed file ($TAG)" \
		bash -c "head -c 4096 /dev/urandom | dd of='$WORK/src/big.bin' bs=4096 seek=100 conv=notrunc status=none &&
			 rsync -a -I --preallocate --inplace --no-whole-file '$WORK/src/' '$D/rs/'"
	assert_same_tree "$WORK/src" "$D/rs" "the in-place update is identical ($TAG)"

	head -c $((8 * MiB + 777)) <"$WORK/r8" >"$D/head4k"
	assert_cmp "$WORK/r8" "$D/head4k" "head -c (4 KiB writes) reads back whole after close ($TAG)"
	dd if="$WORK/r8" of="$D/dd10k" bs=10k status=none
	assert_cmp "$WORK/r8" "$D/dd10k" "dd bs=10k reads back whole after close ($TAG)"
	py_checks "writes of odd sizes ($TAG)" "$D" "$WORK/r8" "$TAG" <<'EOF'
import os, random, sys
mnt, src, tag = sys.argv[1], sys.argv[2], sys.argv[3]
data = open(src, "rb").read()
rnd = random.Random(7)
fd = os.open(f"{mnt}/odd", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
at = 0
while at < len(data):
    n = rnd.choice([1, 17, 511, 4095, 4096, 4097, 10240, 65537])
    os.write(fd, data[at:at + n])
    at += n
os.close(fd)
got = open(f"{mnt}/odd", "rb").read()
print(("ok" if got == data else "not ok") + f" - writes of 1 B..64 KiB read back whole after close ({tag})")
EOF

	mkdir -p "$D/tx"
	check "tar xf into the mount ($TAG)" tar xf "$WORK/src.tar" -C "$D/tx"
	assert_same_tree "$WORK/src.orig" "$D/tx/src" "the extracted tree is identical ($TAG)"
}

make_tree "$WORK/src"
rand_file "$WORK/src/big.bin" $((6 * MiB + 123))
rand_file "$WORK/r8" $((8 * MiB + 777))
(cd "$WORK" && tar cf "$WORK/src.tar" src)
cp -a "$WORK/src" "$WORK/src.orig"
tools_block "$MNT" direct_io

# ---------------------------------------------------------------- the bench's short form
BENCH=$LIB_DIR/../../tools/bench/small_io.py
if [ -f "$BENCH" ]; then
	check "tools/bench/small_io.py --quick (checks its results)" \
		timeout -k 5 300 "$PY" "$BENCH" --quick --ckptfs "$CKPTFS" --out "$T_DIR/bench"
	indent "$T_DIR/check.out"
else
	fail "tools/bench/small_io.py is missing"
fi

# ---------------------------------------------------------------- after a remount
remount || bail "remount"
assert_cmp "$WORK/zero10" "$MNT/pre" "the reserved file after a remount"
assert_cmp "$WORK/holes.want" "$MNT/holes" "the punched file after a remount"
assert_same_tree "$WORK/src" "$MNT/rs" "the rsync copy after a remount"
assert_cmp "$WORK/r8" "$MNT/dd10k" "the dd bs=10k file after a remount"

# ---------------------------------------------------------------- with the writeback cache
remount -o writeback_cache=1 || bail "remount -o writeback_cache=1"
tools_block "$MNT/wb" writeback_cache
remount -o writeback_cache=0 || bail "remount"
assert_cmp "$WORK/r8" "$MNT/wb/dd10k" "the dd bs=10k file written through the writeback cache, after a remount"
assert_same_tree "$WORK/src.orig" "$MNT/wb/tx/src" "the tree extracted through the writeback cache, after a remount"

stop_daemon || fail "unmount"

# ---------------------------------------------------------------- not in the cluster mode
# (refused before any connection: no PostgreSQL needed)
mkdir -p "$WORK/cl-store" "$WORK/cl-mnt"
check_fails "-o writeback_cache=1 with -o meta= is refused" \
	timeout -k 5 30 "$CKPTFS" "$WORK/cl-store" "$WORK/cl-mnt" -f -o meta=host=/nonexistent \
	-o writeback_cache=1
cp "$T_DIR/check.out" "$WORK/cluster-wb.out"
fusermount3 -uz "$WORK/cl-mnt" 2>/dev/null
check "... saying why" grep -q "writeback_cache=1 and -o meta= exclude each other" \
	"$WORK/cluster-wb.out"
finish
