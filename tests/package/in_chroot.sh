#!/bin/bash
# tests/package/in_chroot.sh: the checks that tests/package/run.sh runs as root inside a fresh
# Debian chroot, with the packages in /debs (the -dbgsym ones are not installed).  Not meant to be run elsewhere: it installs
# packages and writes /etc/fstab.
set -u
export DEBIAN_FRONTEND=noninteractive LC_ALL=C
fails=0
ok() { echo "ok - $*"; }
not_ok() { echo "not ok - $*"; fails=$((fails + 1)); }
# check DESC CMD...: ok when CMD exits 0 (its output shown on failure)
check() {
	local desc=$1 out
	shift
	if out=$("$@" 2>&1); then ok "$desc"; else not_ok "$desc"; printf '%s\n' "$out" | sed 's/^/#   /' | head -n 20; fi
}
# daemon_pids: the ckptfs daemons serving /srv/ckpt-store (from /proc: minbase has no pgrep)
daemon_pids() {
	local d
	for d in /proc/[0-9]*; do
		[ "$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null | cut -d' ' -f1-2)" = "ckptfs /srv/ckpt-store" ] &&
			echo "${d#/proc/}"
	done
}
# umount_wait MNT: umount, then wait for the daemon to let go of the store (it flushes first)
umount_wait() {
	local p
	p=$(daemon_pids)
	[ -n "$p" ] || { echo "no ckptfs daemon serves /srv/ckpt-store"; return 1; }
	# again while "target is busy": right after a mount, the daemon's read-ahead set-up may
	# still be looking up its mountpoint (docs/reliability.md)
	for _ in $(seq 100); do
		umount "$1" 2>/tmp/umount.err && break
		grep -q "target is busy" /tmp/umount.err || { cat /tmp/umount.err; return 1; }
		sleep 0.1
	done
	findmnt "$1" >/dev/null && { cat /tmp/umount.err; return 1; }
	for _ in $(seq 100); do
		kill -0 $p 2>/dev/null || return 0
		sleep 0.1
	done
	echo "daemon $p still running 10 s after umount"
	return 1
}

echo "# $(. /etc/os-release; echo "$PRETTY_NAME"), packages before: $(dpkg-query -W | wc -l)"
check "apt-get update" apt-get update -qq
t0=$(date +%s)
if apt-get install -y -qq --no-install-recommends /debs/ckptfs_*.deb /debs/libckptfs0_*.deb \
	/debs/libckptfs-dev_*.deb >/tmp/install.log 2>&1; then
	ok "apt-get install ./ckptfs_*.deb ./libckptfs0_*.deb ./libckptfs-dev_*.deb ($(( $(date +%s) - t0 )) s)"
else
	not_ok "apt-get install of the packages"
	tail -n 20 /tmp/install.log | sed 's/^/#   /'
	exit 1
fi
echo "# installed with them: $(grep -o '^Setting up [^ ]*' /tmp/install.log | cut -d' ' -f3 | tr '\n' ' ')"
for f in /usr/bin/ckptfs /usr/bin/ckpt /sbin/mount.fuse.ckptfs /usr/share/man/man8/ckptfs.8.gz \
	/usr/share/man/man1/ckpt.1.gz /usr/share/bash-completion/completions/ckpt /usr/include/ckptfs.h \
	/usr/lib/x86_64-linux-gnu/pkgconfig/ckptfs.pc /usr/share/doc/ckptfs/user-guide.md.gz \
	/usr/share/doc/libckptfs-dev/trainer.md.gz; do
	check "installed: $f" test -e "$f"
done
lib=$(dpkg -L libckptfs0 | grep 'libckptfs\.so\.0$')
check "libckptfs0 ships libckptfs.so.0 ($lib)" test -e "$lib"
check "libckptfs.so.0: every library it needs is installed" bash -c "! ldd '$lib' | grep -q 'not found'"
check "ckptfs: every library it needs is installed" bash -c "! ldd /usr/bin/ckptfs | grep -q 'not found'"
check "ckptfs --version" ckptfs --version
check "ckpt --version" ckpt --version
check "man pages: ckptfs(8) has the .TH line" bash -c "zcat /usr/share/man/man8/ckptfs.8.gz | grep -q '^.TH CKPTFS 8'"
check "the bash completion completes 'ckpt g' to gc" bash -c \
	'. /usr/share/bash-completion/completions/ckpt; COMP_WORDS=(ckpt g); COMP_CWORD=1; _ckpt; [ "${COMPREPLY[*]}" = gc ]'

# ---------------------------------------------------------------- mount -t fuse.ckptfs
mkdir -p /srv/ckpt-store /mnt/ckpt
check "mount -t fuse.ckptfs /srv/ckpt-store /mnt/ckpt -o compress=3" \
	mount -t fuse.ckptfs /srv/ckpt-store /mnt/ckpt -o compress=3
echo "# $(findmnt -n -o SOURCE,TARGET,FSTYPE,OPTIONS /mnt/ckpt)"
check "findmnt: /srv/ckpt-store on /mnt/ckpt, type fuse.ckptfs" \
	bash -c '[ "$(findmnt -n -o SOURCE,FSTYPE /mnt/ckpt | tr -s " ")" = "/srv/ckpt-store fuse.ckptfs" ]'
head -c 8388608 /dev/urandom >/root/a.bin
mkdir -p /mnt/ckpt/run1/step_1 /mnt/ckpt/run1/step_2
cp /root/a.bin /mnt/ckpt/run1/step_1/model.bin
cp /root/a.bin /mnt/ckpt/run1/step_2/model.bin
check "files written through the mount read back" cmp /root/a.bin /mnt/ckpt/run1/step_2/model.bin
sync
sleep 1.5
echo "# ckpt stat (mounted):"
ckpt stat /srv/ckpt-store | sed 's/^/#   /'
check "ckpt stat: two files, 16 MiB logical" bash -c \
	'ckpt stat /srv/ckpt-store | grep -qx "files: 2" && ckpt stat /srv/ckpt-store | grep -qx "logical_bytes: 16777216"'
check "umount /mnt/ckpt; the daemon exits" umount_wait /mnt/ckpt
check "ckpt fsck /srv/ckpt-store" ckpt fsck /srv/ckpt-store

# ---------------------------------------------------------------- /etc/fstab
echo "/srv/ckpt-store  /mnt/ckpt  fuse.ckptfs  compress=3,nofail,x-systemd.requires-mounts-for=/srv  0  0" >>/etc/fstab
check "fstab: mount /mnt/ckpt" mount /mnt/ckpt
check "fstab: the earlier files are there" cmp /root/a.bin /mnt/ckpt/run1/step_1/model.bin
check "fstab: mount -a with it mounted exits 0" mount -a
check "... and one daemon serves the store" test "$(daemon_pids | wc -l)" = 1
check "umount /mnt/ckpt" umount_wait /mnt/ckpt
check "fstab: mount -a mounts it" mount -a
check "umount /mnt/ckpt" umount_wait /mnt/ckpt

# ---------------------------------------------------------------- the documented systemd unit
if apt-get install -y -qq --no-install-recommends systemd >/tmp/systemd.log 2>&1; then
	mkdir -p /etc/systemd/system
	cat >/etc/systemd/system/mnt-ckpt.mount <<'EOF'
[Unit]
Description=ckptfs checkpoint store on /mnt/ckpt
RequiresMountsFor=/srv/ckpt-store

[Mount]
What=/srv/ckpt-store
Where=/mnt/ckpt
Type=fuse.ckptfs
Options=compress=3

[Install]
WantedBy=multi-user.target
EOF
	check "systemd-escape -p --suffix=mount /mnt/ckpt names the unit mnt-ckpt.mount" \
		bash -c '[ "$(systemd-escape -p --suffix=mount /mnt/ckpt)" = mnt-ckpt.mount ]'
	check "systemd-analyze verify mnt-ckpt.mount" \
		systemd-analyze verify --man=no /etc/systemd/system/mnt-ckpt.mount
	# the command systemd runs to start the unit: mount WHAT WHERE -t TYPE -o OPTIONS
	check "the unit's mount command: mount /srv/ckpt-store /mnt/ckpt -t fuse.ckptfs -o compress=3" \
		mount /srv/ckpt-store /mnt/ckpt -t fuse.ckptfs -o compress=3
	check "umount /mnt/ckpt" umount_wait /mnt/ckpt
	rm /etc/systemd/system/mnt-ckpt.mount
	# the unit systemd makes of the fstab line at boot, and its mount command
	mkdir -p /tmp/gen
	check "systemd-fstab-generator turns the fstab line into a unit" \
		/usr/lib/systemd/system-generators/systemd-fstab-generator /tmp/gen /tmp/gen /tmp/gen
	sed 's/^/#   /' /tmp/gen/mnt-ckpt.mount
	check "systemd-analyze verify of the generated mnt-ckpt.mount" \
		systemd-analyze verify --man=no /tmp/gen/mnt-ckpt.mount
	what=$(sed -n 's/^What=//p' /tmp/gen/mnt-ckpt.mount)
	where=$(sed -n 's/^Where=//p' /tmp/gen/mnt-ckpt.mount)
	type=$(sed -n 's/^Type=//p' /tmp/gen/mnt-ckpt.mount)
	opts=$(sed -n 's/^Options=//p' /tmp/gen/mnt-ckpt.mount)
	check "the generated unit's mount command: mount $what $where -t $type -o $opts" \
		mount "$what" "$where" -t "$type" -o "$opts"
	check "umount /mnt/ckpt" umount_wait /mnt/ckpt
else
	not_ok "apt-get install systemd (for systemd-analyze)"
	tail -n 5 /tmp/systemd.log | sed 's/^/#   /'
fi

if [ "$fails" -eq 0 ]; then echo "# all checks passed"; else echo "# $fails checks failed"; fi
[ "$fails" -eq 0 ]
