#!/bin/bash
# Error handling: a second daemon on a mounted store, non-store directories, missing stores,
# bad arguments and options, ckpt fsck/gc on a mounted store; malformed safetensors content
# is stored and read back byte-identical.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

MNT2=$T_DIR/mnt2
mkdir -p "$MNT2"

# refused DESC PATTERN CMD...: CMD must exit non-zero within 30 s, with output matching the
# extended regex PATTERN (case-insensitive; "" = any non-empty output), and leave MNT2 unmounted
refused() {
	local desc=$1 pat=$2 rc out=$WORK/refused.out
	shift 2
	timeout -k 5 30 "$@" >"$out" 2>&1
	rc=$?
	if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
		fail "$desc: exits (timed out after 30 s)"
	else
		assert_nonzero "$rc" "$desc: non-zero exit"
	fi
	if [ -z "$pat" ]; then
		check "$desc: prints an error message" test -s "$out"
	else
		check "$desc: message matches /$pat/" grep -Eqi "$pat" "$out"
	fi
	indent "$out"
	if is_mounted "$MNT2"; then
		fail "$desc: nothing left mounted on $MNT2"
		_unmount "$MNT2"
	fi
}

# a daemon started by mistake on MNT2 is cleaned up at exit
_register_mount "$STORE" "$MNT2"

# ---------------------------------------------------------------- bad invocations
refused "ckptfs without arguments" "" "$CKPTFS"
refused "ckptfs with a missing mountpoint" "" "$CKPTFS" "$STORE" "$T_DIR/no/such/dir"
check "failed start on a missing mountpoint did not create a broken store" \
	test ! -e "$STORE" -o -e "$STORE/ckptfs-store"
refused "ckptfs -o compress=99" "" "$CKPTFS" "$STORE" "$MNT2" -o compress=99
refused "ckptfs -o compress=-1" "" "$CKPTFS" "$STORE" "$MNT2" -o compress=-1
refused "ckptfs -o cache_size=lots" "" "$CKPTFS" "$STORE" "$MNT2" -o cache_size=lots
refused "ckptfs -o log_level=loud" "" "$CKPTFS" "$STORE" "$MNT2" -o log_level=loud
refused "ckptfs -o direct_read=some" "" "$CKPTFS" "$STORE" "$MNT2" -o direct_read=some
refused "ckptfs -o view_cache=0" "view_cache" "$CKPTFS" "$STORE" "$MNT2" -o view_cache=0
refused "ckpt without arguments" "" "$CKPT"
refused "ckpt with an unknown command" "" "$CKPT" frobnicate "$STORE"

# ---------------------------------------------------------------- non-store directories
mkdir -p "$T_DIR/notstore/sub"
echo "precious" >"$T_DIR/notstore/readme.txt"
echo "data" >"$T_DIR/notstore/sub/data.bin"
(cd "$T_DIR/notstore" && find . -printf '%p %s %m\n' | sort) >"$WORK/notstore.before"
refused "ckptfs on a non-empty non-store dir" "" "$CKPTFS" "$T_DIR/notstore" "$MNT2"
refused "ckpt stat on a non-store dir" "" "$CKPT" stat "$T_DIR/notstore"
refused "ckpt fsck on a non-store dir" "" "$CKPT" fsck "$T_DIR/notstore"
refused "ckpt gc on a non-store dir" "" "$CKPT" gc "$T_DIR/notstore"
check "the non-store dir is left untouched" diff "$WORK/notstore.before" \
	<(cd "$T_DIR/notstore" && find . -printf '%p %s %m\n' | sort)
echo "not a dir" >"$T_DIR/plainfile"
refused "ckptfs with a regular file as STORE" "" "$CKPTFS" "$T_DIR/plainfile" "$MNT2"
assert_eq "not a dir" "$(cat "$T_DIR/plainfile")" "the regular file is left untouched"
for cmd in stat fsck gc; do
	refused "ckpt $cmd on a missing store" "" "$CKPT" "$cmd" "$T_DIR/missing"
done
check "ckpt did not create the missing store" test ! -e "$T_DIR/missing"

# ---------------------------------------------------------------- the store in use
start_daemon || bail "mount $STORE"
ok "daemon mounted"
echo "first" >"$MNT/first.txt"
refused "second daemon on the same store" "already mounted|in use" "$CKPTFS" "$STORE" "$MNT2"
refused "second daemon on the same store (-f)" "already mounted|in use" \
	"$CKPTFS" "$STORE" "$MNT2" -f
assert_eq first "$(cat "$MNT/first.txt")" "first mount unaffected by the refused second daemon"
refused "ckpt fsck on a mounted store" "" "$CKPT" fsck "$STORE"
refused "ckpt gc on a mounted store" "" "$CKPT" gc "$STORE"
check "ckpt stat works on a mounted store" "$CKPT" stat "$STORE"
echo "second" >"$MNT/second.txt"
assert_eq second "$(cat "$MNT/second.txt")" "mount still writable after the refused commands"

# ---------------------------------------------------------------- malformed safetensors
"$PY" "$LIB_DIR/helpers.py" malformed "$WORK/st" >"$WORK/st.list" || fail "write malformed files"
note "malformed safetensors files: $(tr '\n' ' ' <"$WORK/st.list")"
check "cp malformed safetensors files in" cp -r "$WORK/st" "$MNT/st"
while read -r name; do
	assert_cmp "$WORK/st/$name" "$MNT/st/$name" "malformed $name round trip"
done <"$WORK/st.list"
# header written last (data first, then pwrite of the prefix and header at offset 0)
py_checks "safetensors written out of order" "$MNT/st" "$WORK/st" <<'EOF'
import os, struct, sys
from helpers import tap, write_safetensors, safetensors_tensors
mnt, work = sys.argv[1], sys.argv[2]
ref = os.path.join(work, "ooo.safetensors")
hdr_end = write_safetensors(ref, safetensors_tensors(3, 4, 1 << 20), pad=11)
data = open(ref, "rb").read()
fd = os.open(os.path.join(mnt, "ooo.safetensors"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.pwrite(fd, data[hdr_end:], hdr_end)
os.pwrite(fd, data[:hdr_end], 0)
os.close(fd)
tap(open(os.path.join(mnt, "ooo.safetensors"), "rb").read() == data,
    "valid safetensors written data-first then header: round trip")
# a valid file damaged afterwards: header overwritten in place with garbage, then truncated
p = os.path.join(mnt, "ooo.safetensors")
fd = os.open(p, os.O_WRONLY)
os.pwrite(fd, struct.pack("<Q", 1 << 60) + b"}{garbage", 0)
os.close(fd)
exp = struct.pack("<Q", 1 << 60) + b"}{garbage" + data[17:]
tap(open(p, "rb").read() == exp, "valid safetensors whose header is overwritten with garbage")
os.truncate(p, 1000)
tap(open(p, "rb").read() == exp[:1000], "... then truncated into its header")
EOF
remount || bail "remount"
while read -r name; do
	assert_cmp "$WORK/st/$name" "$MNT/st/$name" "malformed $name after remount"
done <"$WORK/st.list"
stop_daemon || fail "unmount"
"$CKPT" fsck "$STORE" >"$WORK/fsck.out" 2>&1
assert_eq 0 "$?" "ckpt fsck passes once unmounted"
check "ckpt fsck prints ok" grep -qiw ok "$WORK/fsck.out"
finish
