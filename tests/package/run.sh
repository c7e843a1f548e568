#!/bin/bash
# tests/package/run.sh: build the Debian packages from this tree, install them on a fresh Debian
# machine (a minimal chroot), and mount a store from the installed files.  By hand, as root, from
# the repository root (a few minutes; not part of make check):
#
#     tests/package/run.sh [OUTDIR]        # OUTDIR (default /tmp/ckptfs-deb) keeps the .debs
#
# 1. Build: the tree (its tracked files, and untracked ones that git does not ignore) is copied
#    to OUTDIR/src and built there with "dpkg-buildpackage -us -uc -b".  Its build dependencies
#    (debian/control: debhelper, go-md2man and the libraries' -dev packages) must be installed:
#    the script says which are missing ("apt-get build-dep ./" in the tree installs them).
# 2. A fresh machine: a Debian minbase chroot (debootstrap --variant=minbase SUITE, SUITE from
#    this machine's /etc/os-release), cached as /var/tmp/SUITE-minbase.tgz and unpacked anew
#    for every run, with this machine's apt sources.  Everything runs in a mount namespace of
#    its own (unshare -m), so the chroot's mounts go away with it.
# 3. In the chroot: "apt-get install ./*.deb" of the three packages (apt brings fuse3 and the
#    libraries from the mirror), then checks: mount -t fuse.ckptfs, a file written and read
#    back, ckpt stat and fsck; an /etc/fstab line mounted with "mount MOUNTPOINT" and
#    "mount -a" (once); the man pages and the bash completion; libckptfs's dependencies resolve;
#    the documented systemd mount unit passes "systemd-analyze verify" (systemd installed in the
#    chroot; systemd itself does not run there, so the unit is checked, not started).
# Prints "ok - ..." / "not ok - ..." lines; exit status 0 when every check passed.
set -u
OUT=${1:-/tmp/ckptfs-deb}
TOP=$(git rev-parse --show-toplevel 2>/dev/null) || { echo "run from the ckptfs repository" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "tests/package/run.sh: run as root (chroot, mounts)" >&2; exit 2; }
for c in dpkg-buildpackage dpkg-checkbuilddeps unshare chroot; do
	command -v "$c" >/dev/null || { echo "tests/package/run.sh: $c is missing (Debian package dpkg-dev or util-linux)" >&2; exit 2; }
done
. /etc/os-release
SUITE=${SUITE:-$VERSION_CODENAME}

# ---------------------------------------------------------------- 1. build
echo "== build: dpkg-buildpackage -us -uc -b in $OUT/src"
rm -rf "$OUT" && mkdir -p "$OUT/src"
(cd "$TOP" && git ls-files -z -co --exclude-standard | xargs -0 -I{} find {} -maxdepth 0 -type f -print0 |
	tar --null -T - -cf -) | tar -xf - -C "$OUT/src"
if ! (cd "$OUT/src" && dpkg-checkbuilddeps); then
	echo "tests/package/run.sh: build dependencies missing (above); install them with: apt-get build-dep -y ./" >&2
	exit 2
fi
t0=$(date +%s)
if ! (cd "$OUT/src" && dpkg-buildpackage -us -uc -b) >"$OUT/build.log" 2>&1; then
	tail -n 30 "$OUT/build.log"
	echo "not ok - dpkg-buildpackage -us -uc -b (log: $OUT/build.log)"
	exit 1
fi
echo "ok - dpkg-buildpackage -us -uc -b ($(( $(date +%s) - t0 )) s; log: $OUT/build.log)"
ls "$OUT"/*.deb
for d in "$OUT"/*.deb; do
	echo "# $(basename "$d"): $(dpkg-deb -f "$d" Depends)"
done

# ---------------------------------------------------------------- 2. a fresh machine
BASE_TGZ=/var/tmp/$SUITE-minbase.tgz
if [ ! -f "$BASE_TGZ" ]; then
	command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
	mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null)
	[ -n "$mirror" ] || mirror=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null)
	echo "== debootstrap --variant=minbase $SUITE ($mirror), cached in $BASE_TGZ"
	debootstrap --variant=minbase "$SUITE" "$OUT/base" "$mirror" >"$OUT/debootstrap.log" 2>&1 ||
		{ echo "not ok - debootstrap (log: $OUT/debootstrap.log)"; exit 1; }
	tar -C "$OUT/base" -czf "$BASE_TGZ" . && rm -rf "$OUT/base"
fi
ROOT=$OUT/chroot
mkdir -p "$ROOT" && tar -C "$ROOT" -xzf "$BASE_TGZ"
# this machine's apt sources (how it reaches Debian's mirror)
if ls /etc/apt/sources.list.d/*.sources >/dev/null 2>&1; then
	rm -f "$ROOT/etc/apt/sources.list"
	cp /etc/apt/sources.list.d/*.sources "$ROOT/etc/apt/sources.list.d/"
fi
cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null
mkdir -p "$ROOT/debs" && cp "$OUT"/*.deb "$ROOT/debs/"
cp "$TOP/tests/package/in_chroot.sh" "$ROOT/in_chroot.sh"

# ---------------------------------------------------------------- 3. install and mount there
echo "== fresh $SUITE chroot in $ROOT: install the packages, mount a store"
unshare --mount --propagation private -- bash -c '
	root=$1
	for m in proc sys dev dev/pts; do mkdir -p "$root/$m"; mount --bind "/$m" "$root/$m"; done
	chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin bash /in_chroot.sh
	rc=$?
	# a daemon the checks left running would keep this namespace (and its mounts) alive
	for p in $(pgrep -x ckptfs); do
		[ "$(readlink "/proc/$p/root")" = "$root" ] && kill -9 "$p"
	done
	exit $rc
' _ "$ROOT"
rc=$?
[ "${KEEP:-0}" = 1 ] || rm -rf --one-file-system "$ROOT"
exit $rc
