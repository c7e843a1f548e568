#!/bin/bash
# Persistence across unmount/remount: content, sizes, modes, mtimes (ns), symlinks, dirs;
# remounting with other options (compress, cache_size, log_level); foreground mode (-f, -d).
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
need rsync

manifest() {
	(cd "$1" && "$PY" "$LIB_DIR/helpers.py" manifest .)
}

start_daemon -o compress=3 || bail "mount $STORE"
ok "daemon mounted (compress=3)"
assert_eq 1 "$MOUNTED_AT_RETURN" "the mount is ready when ckptfs returns (daemonizes after it)"
check "store marker created" test -e "$STORE/ckptfs-store"

make_tree "$WORK/tree"
check "rsync -a a tree in" rsync -a "$WORK/tree/" "$MNT/tree/"
mkdir -p "$MNT/a/b/c/d/e/f" "$MNT/empty"
chmod 750 "$MNT/a/b"
rand_file "$MNT/a/b/c/d/e/f/deep.bin" 123457
echo "top" >"$MNT/top.txt"
ln -s "a/b/c/d/e/f/deep.bin" "$MNT/deep_link"
touch -d @1700000000.123456789 "$MNT/top.txt"
touch -h -d @1650000000 "$MNT/deep_link"
rand_file "$WORK/big" $((9 * MiB + 17))
cp "$WORK/big" "$MNT/big.bin"
chmod 604 "$MNT/big.bin"
touch -d @1690000000 "$MNT/a/b"
if ln "$MNT/a/b/c/d/e/f/deep.bin" "$MNT/deep.hard" 2>/dev/null; then
	HARD=1
else
	HARD=0
	note "hard links unsupported (allowed)"
fi
manifest "$WORK/tree" >"$WORK/m.ref"
manifest "$MNT" >"$WORK/m0"
check "mounted tree manifest matches the local tree" diff "$WORK/m.ref" <(grep '^tree/' \
	"$WORK/m0" | sed 's|^tree/||')

# ---------------------------------------------------------------- plain remount
remount || bail "remount"
ok "remounted"
manifest "$MNT" >"$WORK/m1"
check "manifest identical after remount (content, modes, sizes, mtimes, links, dirs)" \
	diff "$WORK/m0" "$WORK/m1"
assert_eq "1700000000.123456789" "$(stat -c %.9Y "$MNT/top.txt")" "mtime nanoseconds persisted"
assert_eq 1650000000 "$(stat -c %Y "$MNT/deep_link")" "symlink mtime persisted"
assert_eq "a/b/c/d/e/f/deep.bin" "$(readlink "$MNT/deep_link")" "symlink target persisted"
assert_eq 750 "$(stat -c %a "$MNT/a/b")" "dir mode persisted"
assert_eq 1690000000 "$(stat -c %Y "$MNT/a/b")" "dir mtime persisted"
assert_eq 604 "$(stat -c %a "$MNT/big.bin")" "file mode persisted"
assert_eq "$(sha "$WORK/big")" "$(sha "$MNT/big.bin")" "9 MiB file content persisted"
assert_eq "$(stat -c %s "$WORK/big")" "$(stat -c %s "$MNT/big.bin")" "9 MiB file size persisted"
assert_eq "" "$(ls -A "$MNT/empty")" "empty dir persisted empty"
if [ "$HARD" -eq 1 ]; then
	assert_eq "2 2" "$(stat -c %h "$MNT/deep.hard" "$MNT/a/b/c/d/e/f/deep.bin" | tr '\n' ' ' |
		sed 's/ $//')" "hard link count persisted"
	assert_eq "$(stat -c %i "$MNT/a/b/c/d/e/f/deep.bin")" "$(stat -c %i "$MNT/deep.hard")" \
		"hard links share an inode after remount"
fi
assert_eq 1 "$(find "$MNT" -name deep.bin | wc -l)" "find walks into the deep dir"

# ---------------------------------------------------------------- modify, remount, other options
dd if=/dev/urandom of="$MNT/big.bin" bs=4096 seek=1000 count=10 conv=notrunc status=none
truncate -s $((4 * MiB + 3)) "$MNT/tree/a/f_3000000"
mv "$MNT/tree/d2" "$MNT/d2_moved"
rm "$MNT/tree/a/f_4097"
rmdir "$MNT/empty"
mkdir "$MNT/new_dir"
echo "fresh" >"$MNT/new_dir/fresh.txt"
ln -s ../top.txt "$MNT/new_dir/top_link"
chmod 0751 "$MNT/new_dir"
python_sync() {
	"$PY" -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)' "$1"
}
python_sync "$MNT/big.bin"
manifest "$MNT" >"$WORK/m2"
remount -o compress=0,cache_size=1M,log_level=debug || bail "remount with compress=0,cache_size=1M"
ok "remounted with compress=0,cache_size=1M,log_level=debug"
manifest "$MNT" >"$WORK/m3"
check "modifications (overwrite, truncate, rename, unlink, rmdir, mkdir, symlink) persisted" \
	diff "$WORK/m2" "$WORK/m3"
check "removed dir stays removed" absent "$MNT/empty"
check "removed file stays removed" absent "$MNT/tree/a/f_4097"
check "renamed dir is gone from its old name" absent "$MNT/tree/d2"
check "renamed dir is at its new name" test -d "$MNT/d2_moved"

# data written uncompressed, read back under compress=19 with a tiny cache
yes 'compressible' | head -c $((3 * MiB)) >"$MNT/plain.txt"
manifest "$MNT" >"$WORK/m4"
remount -o compress=19,cache_size=64K,verify_dedup || bail "remount compress=19"
ok "remounted with compress=19,cache_size=64K,verify_dedup"
manifest "$MNT" >"$WORK/m5"
check "everything readable with another compression level and a 64 KiB cache" \
	diff "$WORK/m4" "$WORK/m5"
cp "$MNT/big.bin" "$MNT/big_copy.bin"
assert_eq "$(sha "$MNT/big.bin")" "$(sha "$MNT/big_copy.bin")" "copy under verify_dedup"

# ---------------------------------------------------------------- foreground mode
stop_daemon || fail "unmount"
start_daemon_fg || bail "mount with -f"
ok "foreground (-f) daemon mounted"
manifest "$MNT" >"$WORK/m6"
check "content identical under a foreground daemon" diff <(grep -v '^big_copy.bin ' "$WORK/m5") \
	<(grep -v '^big_copy.bin ' "$WORK/m6")
assert_eq "$(grep '^big.bin ' "$WORK/m5" | cut -d' ' -f6)" \
	"$(grep '^big_copy.bin ' "$WORK/m6" | cut -d' ' -f6)" "copy made under verify_dedup persisted"
echo fg >"$MNT/fg.txt"
fusermount3 -u "$MNT"
if wait_pids_gone 30 "$FG_PID"; then
	wait "$FG_PID"
	assert_eq 0 "$?" "foreground daemon exits 0 after fusermount3 -u"
else
	fail "foreground daemon exits after fusermount3 -u"
fi

# debug mode (-d): foreground with a debug log on stderr
"$CKPTFS" "$STORE" "$MNT" -d >"$WORK/debug.log" 2>&1 &
dpid=$!
if wait_mounted "$MNT" 10; then
	ok "debug (-d) daemon mounted"
	assert_eq fg "$(cat "$MNT/fg.txt")" "file written under -f persisted"
	fusermount3 -u "$MNT"
	wait_pids_gone 30 "$dpid" || fail "-d daemon exits after unmount"
	check "-d wrote a log to stderr" test -s "$WORK/debug.log"
else
	fail "debug (-d) daemon mounted"
	indent "$WORK/debug.log"
fi
start_daemon || bail "final mount"
assert_eq fg "$(cat "$MNT/fg.txt")" "file written under -f persisted (daemonized mount)"
check "nothing lost across daemonized/foreground/debug mounts" diff "$WORK/m6" \
	<(manifest "$MNT" | grep -v '^fg.txt ')
stop_daemon || fail "final unmount"
check "ckpt fsck passes after all of this" "$CKPT" fsck "$STORE"
finish
