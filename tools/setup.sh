#!/usr/bin/env bash
# Install the Debian packages ckptfs needs (if missing) and build it in-tree.
# Idempotent: a second run installs nothing and rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

# Everything the build, tools/*.sh, tools/demo_job.py and tests/ call that a minimal Debian 12
# (debootstrap --variant=minbase) lacks: the toolchain and libraries; fuse3 (fusermount3);
# procps (pgrep, used to wait for a daemon to exit); rsync (tests copy trees with it); python3
# with numpy and torch (test helpers, views checks, the demo job).  tests/integration/lib.sh
# checks for each command it calls and names the one that is missing.
PKGS=(build-essential autoconf automake libtool pkg-config
      libfuse3-dev fuse3 librocksdb-dev libzstd-dev libxxhash-dev libjansson-dev check
      procps rsync python3 python3-numpy python3-torch)

missing=()
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "setup: installing ${missing[*]}"
	if [ "$(id -u)" -ne 0 ]; then
		echo "setup: run as root (or install: ${missing[*]})" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	# apt's progress and debconf notices go to a log, shown only when apt fails.
	log=$(mktemp "${TMPDIR:-/tmp}/ckptfs-setup.XXXXXX")
	if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
		>"$log" 2>&1; then
		cat "$log" >&2
		echo "setup: apt-get failed (log above, kept in $log)" >&2
		exit 1
	fi
	rm -f "$log"
fi

if [ ! -x configure ] || [ configure.ac -nt configure ] || [ Makefile.am -nt configure ]; then
	# automake reports each auxiliary file it copies into build-aux/ ("installing ...") on
	# stderr; those are progress notes, so only they are dropped.
	autoreconf -fi 2>&1 >/dev/null | sed "/^[^ ]*: installing 'build-aux\//d" >&2
fi
if [ ! -f Makefile ] || [ configure -nt Makefile ]; then
	./configure --enable-werror >/dev/null
fi
make -j"$(nproc)" >/dev/null
echo "setup: built fs/ckptfs and tools/ckpt"
