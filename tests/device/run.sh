#!/bin/sh
# tests/device/run.sh: the GPU check of libckptfs, for a machine with a CUDA GPU and nvcc.
#
# Usage, from the repository root:  tests/device/run.sh [TOTAL_MIB]   (default 1024)
#
# It uses the library already built in this tree (core/trainer/.libs/libckptfs.so, configured
# with CUDA), or builds it (autoreconf/configure/make) when the build tools are there.  A
# machine without them can be given a build made elsewhere: build here with CUDA, then bring
# core/trainer/.libs (and, where the machine lacks libjansson, a copy of libjansson.so.4 put
# in that folder: it is added to LD_LIBRARY_PATH for the check).
#
# Then it compiles tests/device/dcheck.cu with nvcc and runs it: device saves must be
# byte-identical to host saves, the device save's stall about the D2H copy time (compared
# with a plain cudaMemcpy into pinned memory, bandwidths printed), and a load into device
# memory must return the saved bytes.  Exit status 0 only if all of that held.
set -eu
total=${1:-1024}
root=$(pwd)
lib=core/trainer/.libs/libckptfs.so
work=${TMPDIR:-/tmp}/ckptfs-device.$$
trap 'rm -rf "$work"' EXIT INT TERM
mkdir -p "$work"

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not available"
command -v nvcc >/dev/null 2>&1 || PATH=$PATH:/usr/local/cuda/bin
nvcc --version | tail -n 1

if [ ! -f "$lib" ]; then
	echo "== build (no $lib in this tree)"
	if ! command -v autoreconf >/dev/null 2>&1; then
		echo "FAIL: no build of libckptfs here and no autotools to make one (see the usage above)"
		exit 1
	fi
	[ -x configure ] || autoreconf -fi
	[ -f Makefile ] || ./configure
	make -j"$(nproc)" core/trainer/libckptfs.la
fi
if ! nm -D "$lib" | grep -q ckptfs_save_async; then
	echo "FAIL: $lib does not export the save API"
	exit 1
fi

# libckptfs links the static CUDA runtime; only libjansson may need the build folder.
export LD_LIBRARY_PATH="$root/core/trainer/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ldd "$lib" | grep -q "not found"; then
	ldd "$lib" | grep "not found"
	echo "FAIL: $lib needs libraries this machine lacks: put them in core/trainer/.libs"
	exit 1
fi

echo "== compile dcheck"
nvcc -O2 -std=c++17 -I"$root/core" -o "$work/dcheck" "$root/tests/device/dcheck.cu" \
	-L"$root/core/trainer/.libs" -lckptfs -Xlinker -rpath -Xlinker "$root/core/trainer/.libs"

echo "== run dcheck ($total MiB)"
"$work/dcheck" "$work/ckpt" "$total"
