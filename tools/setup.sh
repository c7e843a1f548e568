#!/usr/bin/env bash
# Install the Debian packages ckptfs needs (if missing) and build it in-tree.
# Idempotent: a second run installs nothing and rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential autoconf automake libtool pkg-config
      libfuse3-dev fuse3 librocksdb-dev libzstd-dev libxxhash-dev libjansson-dev check
      python3-numpy python3-torch rsync)

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
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x configure ] || [ configure.ac -nt configure ] || [ Makefile.am -nt configure ]; then
	autoreconf -fi >/dev/null
fi
if [ ! -f Makefile ] || [ configure -nt Makefile ]; then
	./configure --enable-werror >/dev/null
fi
make -j"$(nproc)" >/dev/null
echo "setup: built fs/ckptfs and tools/ckpt"
