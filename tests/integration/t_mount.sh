#!/bin/bash
# mount(8) and fstab with the installed files: "mount -t fuse.ckptfs STORE MNT -o OPTS" runs the
# installed helper (/sbin/mount.fuse.ckptfs), which starts the installed daemon with the options;
# the mount shows the store as its source and fuse.ckptfs as its type; umount stops the daemon
# and the store is intact; a bad option fails with the daemon's message; mount -f mounts
# nothing; an fstab line written with mount-only and systemd options mounts by mountpoint
# (mount -T FSTAB MNT), by store, and with mount -a, once; a mount waits up to 3 s for a daemon
# that was just unmounted to let go of the store.
#
# The files come from "make install DESTDIR=..." of the build tree.  mount(8) looks for helpers
# in /sbin only, so the test runs in a mount namespace of its own (unshare -m), where overlay
# mounts add the installed helper to /sbin and the installed daemon to its bindir; nothing of
# the machine's own directories changes, and everything mounted goes away with the namespace.
if [ -z "${CKPTFS_T_MOUNT_NS:-}" ]; then
	command -v unshare >/dev/null 2>&1 ||
		{ echo "not ok - unshare is not installed (Debian package util-linux)"; exit 1; }
	if unshare --mount --propagation private true 2>/dev/null; then
		CKPTFS_T_MOUNT_NS=1 exec unshare --mount --propagation private -- bash "$0" "$@"
	fi
	# In a chroot "/" is not a mount point and unshare cannot make it private ("cannot
	# change root filesystem propagation"): the namespace keeps the propagation it inherits.
	CKPTFS_T_MOUNT_NS=1 exec unshare --mount --propagation unchanged -- bash "$0" "$@"
fi
# The new namespace holds a copy of every FUSE mount that existed when it was made (those of
# tests running beside this one): a copy keeps its daemon's connection alive after that test
# unmounts it, until the namespace ends.  Drop the copies here, at once (only this namespace's).
findmnt -rn -o FSTYPE,TARGET 2>/dev/null | while read -r t m; do
	case $t in fuse | fuse.* | fuseblk) umount -l "$(printf '%b' "$m")" 2>/dev/null || true ;; esac
done
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

need make mount umount flock
BUILDDIR=${BUILDDIR:-$(cd "$(dirname "$CKPTFS")/.." && pwd)}
[ -f "$BUILDDIR/Makefile" ] || bail "no Makefile in $BUILDDIR (set BUILDDIR to the configured build tree)"

DEST=$T_DIR/root
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C "$BUILDDIR" install DESTDIR="$DEST" \
	>"$T_DIR/install.log" 2>&1 || { indent "$T_DIR/install.log"; bail "make install DESTDIR=$DEST failed"; }
HELPER=$(find "$DEST" -name mount.fuse.ckptfs -type f | head -n 1)
DAEMON=$(find "$DEST" -path '*/bin/ckptfs' -type f | head -n 1)
[ -n "$HELPER" ] && [ -n "$DAEMON" ] || bail "make install installed no mount.fuse.ckptfs or no ckptfs"
bindir=$(dirname "${DAEMON#"$DEST"}")

# overlay FROM DIR: DIR shows the files of FROM over its own (in this namespace only)
overlay() {
	local real
	real=$(realpath "$2" 2>/dev/null) && [ -d "$real" ] ||
		bail "$2 does not exist on this machine: cannot lay the installed files over it"
	mount -t overlay overlay -o "lowerdir=$1:$real" "$real" ||
		bail "cannot mount an overlay on $real (overlayfs)"
	on_exit "umount -l '$real'"
}
# the helper goes to /sbin, where mount(8) looks (it is installed there unless configure was
# given another --with-mount-helper-dir); the daemon to the bindir the helper runs it from
mkdir -p "$T_DIR/sbin" && cp -p "$HELPER" "$T_DIR/sbin/"
overlay "$T_DIR/sbin" /sbin
overlay "$DEST$bindir" "$bindir"
check "mount(8)'s helper directory has the installed helper" cmp "$HELPER" "/sbin/mount.fuse.ckptfs"

# umount_busy: umount $MNT as root does, again while it answers "target is busy" (for up to
# 10 s: right after a mount the daemon's own start-up may still be looking at its mountpoint)
umount_busy() {
	local i
	for ((i = 0; i < 100; i++)); do
		umount "$MNT" 2>"$T_DIR/umount.err" && return 0
		grep -q "target is busy" "$T_DIR/umount.err" || break
		sleep 0.1
	done
	cat "$T_DIR/umount.err"
	return 1
}
# umount_wait: umount_busy, then wait for the daemon of $STORE to exit (it flushes first)
umount_wait() {
	local pids
	pids=$(daemon_pids "$STORE")
	umount_busy || return 1
	# shellcheck disable=SC2086
	[ -z "$pids" ] || wait_pids_gone 30 $pids || { echo "daemon $pids still running"; return 1; }
}
# mounted_as SOURCE DESC: $MNT is mounted from SOURCE, type fuse.ckptfs
mounted_as() {
	assert_eq "$1|fuse.ckptfs" "$(findmnt -n -o SOURCE,FSTYPE -M "$MNT" 2>/dev/null |
		sed 's/ *\(fuse[^ ]*\) *$/|\1/')" "$2"
}
readahead_kb() {
	cat "/sys/class/bdi/$(findmnt -n -o MAJ:MIN -M "$MNT" | tr -d ' ')/read_ahead_kb" 2>/dev/null
}

# ---------------------------------------------------------------- mount -t fuse.ckptfs
_register_mount "$STORE" "$MNT"
if mount -t fuse.ckptfs "$STORE" "$MNT" -o compress=3,readahead_kb=512 >"$T_DIR/m.out" 2>&1; then
	ok "mount -t fuse.ckptfs STORE MNT -o compress=3,readahead_kb=512"
else
	indent "$T_DIR/m.out"
	bail "mount -t fuse.ckptfs STORE MNT -o compress=3,readahead_kb=512 failed"
fi
mounted_as "$STORE" "findmnt: source STORE, type fuse.ckptfs"
pid=$(daemon_pids "$STORE")
assert_eq "$bindir/ckptfs" "$(readlink "/proc/$pid/exe" 2>/dev/null)" "the daemon is the installed one"
assert_eq 512 "$(readahead_kb)" "the daemon got the mount's options (readahead_kb=512)"
rand_file "$WORK/a.bin" $((3 * MiB))
cp "$WORK/a.bin" "$MNT/a.bin"
assert_cmp "$WORK/a.bin" "$MNT/a.bin" "a file written through the mount reads back"
check "umount MNT; the daemon exits" umount_wait
check "not mounted after umount" bash -c "! findmnt -M '$MNT' >/dev/null"
check "ckpt fsck: the store is intact" "$CKPT" fsck "$STORE"

# ---------------------------------------------------------------- paths, ro, errors, -f
STORE2="$T_DIR/a store, with a comma"
_register_mount "$STORE2" "$MNT"
check "mount -t fuse.ckptfs 'a store, with a comma' MNT -o ro" \
	mount -t fuse.ckptfs "$STORE2" "$MNT" -o ro
(STORE=$STORE2 mounted_as "$STORE2" "findmnt: the source is the store's path with its space and comma")
check "-o ro: the mount is read-only" bash -c "findmnt -n -o OPTIONS -M '$MNT' | grep -qE '(^|,)ro(,|$)'"
if touch "$MNT/x" 2>"$T_DIR/touch.err"; then
	not_ok "-o ro: creating a file fails"
else
	check "-o ro: creating a file fails with EROFS" grep -q "Read-only file system" "$T_DIR/touch.err"
fi
(STORE=$STORE2; check "umount the read-only mount" umount_wait)

mount -t fuse.ckptfs "$STORE" "$MNT" -o compress=99 >"$T_DIR/bad.out" 2>&1
assert_nonzero $? "mount -o compress=99 fails"
check "... with the daemon's reason" grep -qF "compress=99: level must be 0 (off) to 19" "$T_DIR/bad.out"
check "... and nothing is mounted" bash -c "! findmnt -M '$MNT' >/dev/null"
assert_eq "" "$(daemon_pids "$STORE")" "... and no daemon is left"

check "mount -f -t fuse.ckptfs (fake) exits 0" mount -f -t fuse.ckptfs "$STORE" "$MNT" -o compress=1
check "... and mounts nothing" bash -c "! findmnt -M '$MNT' >/dev/null"

# the helper run by hand, as mount runs it: mount-only options are dropped before the daemon
if /sbin/mount.fuse.ckptfs "$STORE" "$MNT" -v -o x-test.opt=1,comment=c,defaults,compress=2 \
	>"$T_DIR/h.out" 2>&1; then
	ok "mount.fuse.ckptfs STORE MNT -o x-...,comment=...,defaults,compress=2 mounts"
	check "... and passes only compress=2 on" grep -qE -- "-o compress=2 \(daemon: " "$T_DIR/h.out"
	check "umount" umount_wait
else
	not_ok "mount.fuse.ckptfs STORE MNT -o x-...,comment=...,defaults,compress=2 mounts"
	indent "$T_DIR/h.out"
fi
/sbin/mount.fuse.ckptfs "$STORE" >"$T_DIR/u.out" 2>&1
assert_eq 1 $? "mount.fuse.ckptfs without a mountpoint exits 1"
check "... with its usage" grep -q "^usage: mount.fuse.ckptfs STORE MOUNTPOINT" "$T_DIR/u.out"

# ---------------------------------------------------------------- fstab
FSTAB=$T_DIR/fstab
# fstab escapes a space as \040; the options are those of a line written for systemd and boot
printf '# a test fstab\n%s %s fuse.ckptfs %s 0 0\n' "$STORE" "$MNT" \
	"defaults,nofail,_netdev,x-systemd.requires-mounts-for=$T_DIR,comment=ckptfs-test,compress=3,readahead_kb=256" \
	>"$FSTAB"
if mount -T "$FSTAB" "$MNT" >"$T_DIR/f.out" 2>&1; then
	ok "mount -T FSTAB MNT (by mountpoint)"
else
	not_ok "mount -T FSTAB MNT (by mountpoint)"
	indent "$T_DIR/f.out"
fi
mounted_as "$STORE" "fstab: source STORE, type fuse.ckptfs"
assert_eq 256 "$(readahead_kb)" "fstab: the daemon got the line's options (readahead_kb=256)"
assert_cmp "$WORK/a.bin" "$MNT/a.bin" "fstab: the earlier file is there"
check "mount -a -T FSTAB with the line mounted exits 0" mount -a -T "$FSTAB"
assert_eq 1 "$(daemon_pids "$STORE" | grep -c .)" "... and mounts nothing more (one daemon)"
assert_eq 1 "$(findmnt -n -M "$MNT" | grep -c .)" "... (one mount on MNT)"
check "umount MNT" umount_wait

check "mount -T FSTAB STORE (by store)" mount -T "$FSTAB" "$STORE"
mounted_as "$STORE" "fstab by store: source STORE, type fuse.ckptfs"
# Right after an umount its daemon may still hold the store (STORE/lock) while it flushes: the
# next mount waits up to 3 s for it.  Here a lock held for 1 s stands for that daemon.
check "umount MNT" umount_wait
# hold_store S: hold STORE/lock for S seconds in the background (sets LOCKER); 0 once it is held
hold_store() {
	rm -f "$T_DIR/held"
	flock -x -w 10 "$STORE/lock" sh -c "touch '$T_DIR/held'; sleep $1" &
	LOCKER=$!
	for ((i = 0; i < 50; i++)); do
		[ -e "$T_DIR/held" ] && return 0
		sleep 0.1
	done
	return 1
}
if hold_store 1; then
	if mount -a -T "$FSTAB" >"$T_DIR/a.out" 2>&1; then
		ok "mount -a -T FSTAB while the store is held for 1 s more mounts"
	else
		not_ok "mount -a -T FSTAB while the store is held for 1 s more mounts"
		indent "$T_DIR/a.out"
	fi
	mounted_as "$STORE" "mount -a: source STORE, type fuse.ckptfs"
	check "umount MNT" umount_wait
else
	not_ok "flock could not take $STORE/lock within 10 s"
fi
wait "$LOCKER"
if hold_store 4; then
	mount -T "$FSTAB" "$MNT" >"$T_DIR/busy.out" 2>&1
	assert_nonzero $? "a mount while the store is held for 4 s fails"
	check "... naming the store and the reason" grep -qF "$STORE: store is in use" "$T_DIR/busy.out"
else
	not_ok "flock could not take $STORE/lock within 10 s"
fi
wait "$LOCKER"
check "ckpt fsck: the store is intact" "$CKPT" fsck "$STORE"

finish
