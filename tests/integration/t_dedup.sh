#!/bin/bash
# Dedup and gc: identical content stored once (ckpt stat, pack sizes), safetensors rewritten
# with another header length dedups its tensor bytes, gc reclaims dropped data and keeps the rest.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

BLOB=$((32 * MiB))
NT=8
TBYTES=$((4 * MiB))

# stat_int KEY: integer value of KEY from ckpt stat (or "missing")
stat_int() {
	local v
	v=$(stat_field "$STORE" "$1")
	[[ $v =~ ^[0-9]+$ ]] && echo "$v" || echo "missing($v)"
}

# -o keep_unreferenced: the deleted data is left for `ckpt gc` to reclaim (the daemon's
# own reclaiming is tested by t_space.sh)
start_daemon -o keep_unreferenced || bail "mount $STORE"
ok "daemon mounted"

# ---------------------------------------------------------------- 4 copies of 32 MiB
rand_file "$WORK/blob" $BLOB
for i in 1 2 3 4; do
	cp "$WORK/blob" "$MNT/blob$i.bin"
done
if wait_committed 10; then
	ok "ckpt stat (while mounted) sees the 4 closed files"
else
	fail "ckpt stat (while mounted) sees the 4 closed files"
	"$CKPT" stat "$STORE" 2>&1 | sed 's/^/#   /'
fi
"$CKPT" stat "$STORE" >"$WORK/stat1" 2>&1
indent "$WORK/stat1"
for key in files logical_bytes stored_bytes unique_bytes chunks dedup_ratio compression_ratio; do
	check "ckpt stat prints '$key:'" grep -q "^$key: *[0-9]" "$WORK/stat1"
done
logical=$(stat_int logical_bytes)
unique=$(stat_int unique_bytes)
stored=$(stat_int stored_bytes)
chunks1=$(stat_int chunks)
assert_eq $((4 * BLOB)) "$logical" "logical_bytes = 4 x 32 MiB"
assert_eq $BLOB "$unique" "unique_bytes = 32 MiB (the content is stored once)"
assert_le "$stored" $((BLOB + BLOB / 50)) "stored_bytes <= unique + 2% for random data"
assert_eq "4.00" "$(stat_field "$STORE" dedup_ratio)" "dedup_ratio = 4.00"
if [[ $stored =~ ^[0-9]+$ ]] && [ "$stored" -gt 0 ]; then
	assert_eq "$(awk -v u="$BLOB" -v s="$stored" 'BEGIN {printf "%.2f", u / s}')" \
		"$(stat_field "$STORE" compression_ratio)" "compression_ratio = unique/stored"
fi
assert_lt "$(dir_bytes "$STORE/packs")" $((2 * BLOB)) "pack files hold the 32 MiB once"
assert_le $BLOB "$(dir_bytes "$STORE/packs")" "pack files hold the 32 MiB (random data)"

# the same content written backwards in 1 MiB blocks still dedups
"$PY" - "$WORK/blob" "$MNT/blob5.bin" <<'EOF'
import os, sys
src = open(sys.argv[1], "rb").read()
fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for off in reversed(range(0, len(src), 1 << 20)):
    os.pwrite(fd, src[off:off + (1 << 20)], off)
os.close(fd)
EOF
wait_committed 10 || fail "ckpt stat sees the 5th file"
assert_eq $BLOB "$(stat_int unique_bytes)" "same content written backwards adds no unique bytes"
assert_eq "$chunks1" "$(stat_int chunks)" "... and no chunks"
assert_eq "$(sha "$WORK/blob")" "$(sha "$MNT/blob5.bin")" "backwards-written copy reads back"

# many identical small files
head -c 10000 /dev/urandom >"$WORK/small"
for i in $(seq 1 30); do
	cp "$WORK/small" "$MNT/small$i"
done
wait_committed 10 || fail "ckpt stat sees the 35 files"
u=$(stat_int unique_bytes)
assert_le "$u" $((BLOB + 10000)) "30 identical 10000-byte files add <= 10000 unique bytes"
assert_eq $((5 * BLOB + 30 * 10000)) "$(stat_int logical_bytes)" "logical_bytes counts every copy"

# ---------------------------------------------------------------- safetensors, 2 header lengths
rand_file "$WORK/keep" $((4 * MiB))
cp "$WORK/keep" "$MNT/keep.bin"
h1=$("$PY" "$LIB_DIR/helpers.py" safetensors "$WORK/s1.safetensors" 5 $NT $TBYTES 0)
h2=$("$PY" "$LIB_DIR/helpers.py" safetensors "$WORK/s2.safetensors" 5 $NT $TBYTES 1237)
note "safetensors data offsets: $h1 and $h2"
cmp -s -i "$h1:$h2" "$WORK/s1.safetensors" "$WORK/s2.safetensors" ||
	fail "test bug: the two safetensors files should share their tensor bytes"
"$PY" "$LIB_DIR/helpers.py" safetensors "$MNT/s1.safetensors" 5 $NT $TBYTES 0 >/dev/null
wait_committed 10 || fail "ckpt stat sees s1.safetensors"
u1=$(stat_int unique_bytes)
"$PY" "$LIB_DIR/helpers.py" safetensors "$MNT/s2.safetensors" 5 $NT $TBYTES 1237 >/dev/null
wait_committed 10 || fail "ckpt stat sees s2.safetensors"
u2=$(stat_int unique_bytes)
note "unique_bytes: before s1 $u, after s1 $u1, after s2 $u2 (tensor bytes $((NT * TBYTES)))"
assert_le $((NT * TBYTES)) $((u1 - u)) "s1.safetensors adds its tensor bytes as unique"
# tensor data is chunked from each tensor's first byte, so only the header is new (a design
# without tensor alignment would re-store at least a couple of MiB here)
assert_le $((u2 - u1)) $((2 * MiB)) \
	"s2 (header $((h2 - h1)) bytes longer, same $((NT * TBYTES / MiB)) MiB of tensors) adds <= 2 MiB"
assert_cmp "$WORK/s1.safetensors" "$MNT/s1.safetensors" "s1.safetensors reads back"
assert_cmp "$WORK/s2.safetensors" "$MNT/s2.safetensors" "s2.safetensors reads back"

# content deleted and then written again before gc must survive gc (dedup against a chunk
# whose refcount dropped to 0)
rand_file "$WORK/revive" $((8 * MiB))
cp "$WORK/revive" "$MNT/revive.bin"
wait_committed 10 || fail "ckpt stat sees revive.bin"
rm "$MNT/revive.bin"
wait_committed 10 || fail "ckpt stat sees revive.bin deleted"
cp "$WORK/revive" "$MNT/revive_again.bin"

# ---------------------------------------------------------------- delete, gc, verify
rm -f "$MNT"/blob*.bin "$MNT/s2.safetensors" "$MNT"/small*
wait_committed 10 || fail "ckpt stat sees the deletions"
stop_daemon || fail "unmount"
"$CKPT" stat "$STORE" >"$WORK/stat2" 2>&1
check "ckpt stat works unmounted" grep -q '^files: *3$' "$WORK/stat2"
before=$(dir_bytes "$STORE/packs")
# a gc killed midway leaves a consistent store
"$CKPT" gc "$STORE" >/dev/null 2>&1 &
gcpid=$!
sleep 0.03
{
	kill -9 "$gcpid"
	wait "$gcpid"
} 2>/dev/null
"$CKPT" fsck "$STORE" >"$WORK/fsck0.out" 2>&1
assert_eq 0 "$?" "ckpt fsck passes after a gc killed with SIGKILL"
indent "$WORK/fsck0.out"
check "ckpt gc" "$CKPT" gc "$STORE"
indent "$T_DIR/check.out"
after=$(dir_bytes "$STORE/packs")
note "pack bytes before gc $before, after $after"
assert_le "$after" $((before - BLOB / 2)) "gc reclaimed at least 16 MiB of pack space"
assert_le $((NT * TBYTES + 12 * MiB)) "$after" "gc kept the referenced data"
"$CKPT" fsck "$STORE" >"$WORK/fsck.out" 2>&1
assert_eq 0 "$?" "ckpt fsck after gc"
check "ckpt fsck says ok" grep -qiw ok "$WORK/fsck.out"
check "second ckpt gc" "$CKPT" gc "$STORE"
assert_le "$(dir_bytes "$STORE/packs")" "$after" "second gc does not grow the packs"
assert_eq 3 "$(stat_int files)" "ckpt stat files after gc"
assert_eq $((NT * TBYTES + h1 + 12 * MiB)) "$(stat_int logical_bytes)" "logical_bytes after gc"

start_daemon -o verify_dedup || bail "remount after gc"
assert_cmp "$WORK/s1.safetensors" "$MNT/s1.safetensors" "s1.safetensors intact after gc"
assert_cmp "$WORK/keep" "$MNT/keep.bin" "keep.bin intact after gc"
assert_cmp "$WORK/revive" "$MNT/revive_again.bin" \
	"content deleted and re-written before gc survives gc"
# content whose chunks gc dropped must be stored again, not deduped against dropped chunks
cp "$WORK/blob" "$MNT/blob_again.bin"
cp "$WORK/s2.safetensors" "$MNT/s2_again.safetensors"
remount || bail "remount"
assert_eq "$(sha "$WORK/blob")" "$(sha "$MNT/blob_again.bin")" \
	"content re-added after gc dropped it reads back"
assert_cmp "$WORK/s2.safetensors" "$MNT/s2_again.safetensors" "s2 re-added after gc reads back"

# compressible data: stored_bytes grows much less than unique_bytes (default compression)
u0=$(stat_int unique_bytes)
s0=$(stat_int stored_bytes)
"$PY" -c 'import sys
text = "".join(f"step {i} loss {(i * 7919) % 10007} lr 0.0003 grad_norm {i % 97}\n"
               for i in range(200000))
sys.stdout.write(text[:8 << 20])' >"$MNT/log.txt"
wait_committed 10 || fail "ckpt stat sees log.txt"
# chunks are written raw and compressed once writes pause (docs/design.md)
wait_stat "$STORE" compression_pending 0 20 || fail "background compression finishes"
u1=$(stat_int unique_bytes)
s1=$(stat_int stored_bytes)
note "8 MiB of text: unique +$((u1 - u0)), stored +$((s1 - s0))"
assert_eq $((8 * MiB)) $((u1 - u0)) "8 MiB of text adds 8 MiB of unique bytes"
assert_le $((s1 - s0)) $((3 * MiB)) "... and at most 3 MiB of stored bytes (compressed)"
stop_daemon || fail "unmount"
check "ckpt fsck at the end" "$CKPT" fsck "$STORE"
finish
