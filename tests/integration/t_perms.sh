#!/bin/bash
# Permissions on a mount shared with -o allow_other (docs/threat-model.md): the kernel's checks,
# which ckptfs always turns on (default_permissions); S_ISUID/S_ISGID cleared on write, truncate
# and chown as on ext4; fifos, sockets and devices; view files no more readable than their
# sources; the store's own modes. Other users are played by nobody (runuser, util-linux).
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
need runuser mkfifo mknod stat touch truncate chmod chown

[ "$(id -u)" -eq 0 ] || bail "needs root: it acts as other users with runuser"
NOBODY=nobody
id "$NOBODY" >/dev/null 2>&1 || bail "user $NOBODY does not exist"
# nobody must reach the mountpoint (mktemp made the test directory 0700)
chmod 711 "$T_DIR"

# as_nobody CMD...: run CMD as nobody (group nogroup, no supplementary groups)
as_nobody() {
	runuser -u "$NOBODY" -- "$@"
}

# refused DESC CMD...: CMD run as nobody must fail
refused() {
	local desc=$1
	shift
	check_fails "$desc" as_nobody "$@"
}

mode_of() {
	stat -c %a "$1"
}

start_daemon -o allow_other || bail "mount $STORE on $MNT with -o allow_other"
ok "daemon mounted with -o allow_other"
check "default_permissions is on without asking for it" \
	bash -c "findmnt -n -o OPTIONS '$MNT' | tr , '\n' | grep -qx default_permissions"

# ---------------------------------------------------------------- the store's own files
assert_eq 700 "$(mode_of "$STORE")" "the store directory is its owner's only"
assert_eq 700 "$(mode_of "$STORE/index")" "the index directory (hash secret) is its owner's only"
assert_eq 700 "$(mode_of "$STORE/packs")" "the packs directory is its owner's only"
ixfile=$(find "$STORE/index" -maxdepth 1 -type f -name '*.log' | head -n 1)
check "the index has a write-ahead log file" test -f "$ixfile"
assert_eq 600 "$(mode_of "$ixfile")" "index files are created 0600"
refused "nobody cannot list the index" ls "$STORE/index"
refused "nobody cannot read the index's files" cat "$ixfile"

# ---------------------------------------------------------------- another user's files
chmod 755 "$MNT"
mkdir "$MNT/pub" "$MNT/sticky"
chmod 777 "$MNT/pub"
chmod 1777 "$MNT/sticky"
echo secret >"$MNT/pub/private"
chmod 600 "$MNT/pub/private"
echo shared >"$MNT/pub/ro"
chmod 644 "$MNT/pub/ro"
echo any >"$MNT/pub/ww"
chmod 666 "$MNT/pub/ww"
touch -d @1500000000 "$MNT/pub/ww"
echo root >"$MNT/sticky/rootfile"
chmod 666 "$MNT/sticky/rootfile"

refused "nobody cannot read a 0600 file of root's" cat "$MNT/pub/private"
refused "nobody cannot write a 0644 file of root's" sh -c "echo x >>'$MNT/pub/ro'"
refused "nobody cannot truncate a 0644 file of root's" truncate -s 0 "$MNT/pub/ro"
refused "nobody cannot chmod root's file (even a 0666 one)" chmod 777 "$MNT/pub/ww"
refused "nobody cannot chown root's file" chown "$NOBODY" "$MNT/pub/ww"
refused "nobody cannot chgrp root's file" chgrp nogroup "$MNT/pub/ww"
refused "nobody cannot set explicit times on root's 0666 file" touch -d @1600000000 "$MNT/pub/ww"
assert_eq "644 shared" "$(mode_of "$MNT/pub/ro") $(cat "$MNT/pub/ro")" "the refused changes left the files as they were"
assert_eq "666 1500000000" "$(stat -c '%a %Y' "$MNT/pub/ww")" "and their modes and times"
check "nobody may set the current time on a file it can write (POSIX)" \
	as_nobody touch "$MNT/pub/ww"
refused "nobody cannot delete root's file in a sticky directory" rm -f "$MNT/sticky/rootfile"
refused "nobody cannot rename root's file in a sticky directory" \
	mv "$MNT/sticky/rootfile" "$MNT/sticky/mine"
check "root's file in the sticky directory is still there" test -e "$MNT/sticky/rootfile"
check "nobody creates its own file in the sticky directory" as_nobody sh -c "echo n >'$MNT/sticky/nobodys'"
assert_eq "$NOBODY" "$(stat -c %U "$MNT/sticky/nobodys")" "the new file is owned by its creator"
check "nobody deletes its own file in the sticky directory" as_nobody rm "$MNT/sticky/nobodys"
check "nobody deletes root's file in a 0777 directory without the sticky bit" \
	as_nobody rm -f "$MNT/pub/ww"

# ---------------------------------------------------------------- S_ISUID / S_ISGID
F=$MNT/pub/suid
: >"$F"
chmod 777 "$F"
chmod 4777 "$F"
as_nobody sh -c "echo x >>'$F'"
assert_eq 777 "$(mode_of "$F")" "a write by another user clears S_ISUID"
chmod 2777 "$F"
as_nobody sh -c "echo x >>'$F'"
assert_eq 777 "$(mode_of "$F")" "a write by another user clears S_ISGID (group-executable file)"
chmod 6777 "$F"
as_nobody truncate -s 1 "$F"
assert_eq 777 "$(mode_of "$F")" "a truncate by another user clears S_ISUID and S_ISGID"
chmod 6777 "$F"
as_nobody sh -c ": >'$F'"
assert_eq 777 "$(mode_of "$F")" "an open with O_TRUNC by another user clears both"
chmod 2767 "$F"
as_nobody sh -c "echo x >>'$F'"
assert_eq 767 "$(mode_of "$F")" "S_ISGID without S_IXGRP goes for a writer outside the file's group"
chmod 2767 "$F"
runuser -u "$NOBODY" -g root -- sh -c "echo x >>'$F'"
assert_eq 2767 "$(mode_of "$F")" "... and stays for a writer in it (as on ext4)"
chmod 6777 "$F"
echo x >>"$F"
truncate -s 0 "$F"
assert_eq 6777 "$(mode_of "$F")" "root (CAP_FSETID) writes and truncates without clearing them"
chown "$NOBODY" "$F"
assert_eq 777 "$(mode_of "$F")" "a chown clears them (even by root)"
chmod 6755 "$F"
chgrp nogroup "$F"
assert_eq 755 "$(mode_of "$F")" "a chgrp clears them"

# ---------------------------------------------------------------- fifos, sockets, devices
mkfifo -m 640 "$MNT/pub/fifo"
mknod -m 600 "$MNT/pub/null" c 1 3
mknod -m 660 "$MNT/pub/loop" b 7 200
"$PY" -c "import socket, sys; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])" \
	"$MNT/pub/sock" || fail "bind a Unix socket on the mount"
chmod 755 "$MNT/pub/sock" # (bind's mode depends on the umask)
special_stat() {
	stat -c '%n %F %a %t:%T %s' "$MNT/pub/fifo" "$MNT/pub/null" "$MNT/pub/loop" \
		"$MNT/pub/sock" | sed "s|$MNT/||"
}
want="pub/fifo fifo 640 0:0 0
pub/null character special file 600 1:3 0
pub/loop block special file 660 7:c8 0
pub/sock socket 755 0:0 0"
assert_eq "$want" "$(special_stat)" "mkfifo, mknod c/b and bind: type, mode, device number, size 0"
check "ls lists the types" bash -c "ls -l '$MNT/pub' | grep -q '^prw-r-----'"
( echo "through the fifo" >"$MNT/pub/fifo" ) &
assert_eq "through the fifo" "$(timeout 10 cat "$MNT/pub/fifo")" "a fifo on the mount passes data"
wait
# libfuse mounts nosuid,nodev unless -o suid / -o dev is given (root only)
check "the mount is nosuid and nodev" bash -c \
	"findmnt -n -o OPTIONS '$MNT' | tr , '\n' | grep -qx nosuid &&
	 findmnt -n -o OPTIONS '$MNT' | tr , '\n' | grep -qx nodev"
check_fails "a device node does not open on a nodev mount (even for root)" head -c 1 "$MNT/pub/null"
remount || bail "remount"
assert_eq "$want" "$(special_stat)" "fifo, devices and socket after a remount"
check "after a remount the old fifo still passes data" bash -c \
	"( echo again >'$MNT/pub/fifo' ) & timeout 10 cat '$MNT/pub/fifo' | grep -qx again; wait"
assert_eq "777 root" "$(stat -c '%a %U' "$MNT/pub")" "directory mode and owner after a remount"
assert_eq 600 "$(mode_of "$MNT/pub/private")" "file mode after a remount"
refused "after a remount nobody still cannot read the 0600 file" cat "$MNT/pub/private"

# ---------------------------------------------------------------- views
mkdir "$MNT/ck"
"$PY" "$LIB_DIR/helpers.py" safetensors "$MNT/ck/model.safetensors" 1 4 4096 0 >/dev/null ||
	fail "write a safetensors file"
V=$MNT/tp1_pp1/ck/model.safetensors
check "the view file exists" test -f "$V"
check "nobody reads the view file of a world-readable source" as_nobody cat "$V"
chmod 600 "$MNT/ck/model.safetensors"
sleep 1.1 # the kernel caches a view file's attributes for 1 s
assert_eq 400 "$(mode_of "$V")" "the view file of a 0600 source is 0400"
refused "nobody cannot read the view file of a 0600 source" cat "$V"
chmod 640 "$MNT/ck/model.safetensors"
sleep 1.1
assert_eq 440 "$(mode_of "$V")" "... of a 0640 source 0440"
refused "view files refuse writes" sh -c "echo x >>'$V'"

# ---------------------------------------------------------------- fsck, and without allow_other
stop_daemon || bail "unmount"
check "ckpt fsck: the store is clean" "$CKPT" fsck "$STORE"
chmod 755 "$STORE"
start_daemon || bail "mount without allow_other"
assert_eq 700 "$(mode_of "$STORE")" "a mount makes a store directory opened to others private again"
refused "without allow_other, nobody cannot even stat the mount" stat "$MNT/pub"
check "without allow_other, the mounting user still can" stat "$MNT/pub"

finish
