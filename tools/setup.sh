#!/usr/bin/env bash
# Install the Debian packages ckptfs needs (if missing), build it in-tree, and make the Python
# environment ./.venv (pinned torch CPU build, the trainer frameworks and peers, pytest, and the
# ckptfs package in editable mode).
# Idempotent: a second run installs nothing and rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

# Everything the build, tools/*.sh, tools/demo_job.py and tests/ call that a minimal Debian 12
# (debootstrap --variant=minbase) lacks: the toolchain and libraries; fuse3 (fusermount3);
# procps (pgrep, used to wait for a daemon to exit); rsync (tests copy trees with it); python3
# with numpy and torch (test helpers, views checks, the demo job); python3-venv (ensurepip, so
# that the Debian python3 can make ./.venv); clang (libFuzzer, for the fuzzing harnesses of
# tests/fuzz, which tools/test.sh runs).  tests/integration/lib.sh checks for each command
# it calls and names the one that is missing.
PKGS=(build-essential autoconf automake libtool pkg-config
      libfuse3-dev fuse3 librocksdb-dev libzstd-dev libxxhash-dev libjansson-dev check
      procps rsync python3 python3-numpy python3-torch python3-venv)
# gdb: the torture suite's deadlock watchdog prints the daemon's backtraces with it
# (tools/torture/views.py; without it, only the kernel stacks).
PKGS+=(gdb)
# go-md2man: make builds the man pages ckptfs(8) and ckpt(1) from docs/man/*.md with it.
PKGS+=(go-md2man)
# clang and its runtime libraries (libFuzzer, the sanitizers' runtimes: libclang-rt-dev, only
# recommended by clang, so not installed with --no-install-recommends): the libFuzzer harnesses
# (tests/fuzz, configure --enable-fuzzers).
PKGS+=(clang libclang-rt-dev)
# libpq-dev: the PostgreSQL metadata engine (core/meta/postgres.c, docs/cluster.md) links libpq;
# postgresql: its tests start a server of their own (initdb, pg_ctl; tests/pglib.c).
PKGS+=(libpq-dev postgresql)

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
	./configure --enable-werror --enable-fuzzers >/dev/null
fi
make -j"$(nproc)" >/dev/null
echo "setup: built fs/ckptfs and tools/ckpt"

# ---------------------------------------------------------------- Python environment (./.venv)
# Made with the python3 on PATH.  Every package is pinned; the whole resolved set is also a
# constraints file, so a transitive dependency cannot move between machines.  torch is pinned to
# its CPU build (the "+cpu" local version): PyPI's torch for Linux is a CUDA build of several GB,
# and the CPU build is not on PyPI, so pip must find it in a local wheel folder (its find-links:
# PIP_FIND_LINKS or pip.conf) or an index that has it (PIP_EXTRA_INDEX_URL).  bytecheckpoint and
# megatron-core declare torch ranges that 2.13 does not satisfy (or that would pull another
# torch), so they go in with --no-deps and their own dependencies are listed here explicitly.
VENV=.venv
TORCH_PIN=torch==2.13.0+cpu
PINS=(safetensors==0.8.0 transformers==5.24.0 pytest==9.2.0 numpy==2.4.6 prometheus_client==0.26.0)
NODEPS_PINS=(bytecheckpoint==0.0.2 megatron-core==0.16.1)
# the dependencies of the --no-deps packages that they import (bytecheckpoint: grpcio, protobuf,
# mmh3, universal-pathlib, cachetools; megatron-core: numpy and packaging, already above)
DEP_PINS=(grpcio==1.69.0 protobuf==3.20.3 mmh3==4.1.0 universal-pathlib==0.2.6 cachetools==5.5.2)
CONSTRAINTS="annotated-doc==0.0.7 annotated-types==0.8.0 anyio==4.16.0 click==8.5.1
filelock==4.3.1 fsspec==2026.9.0 h11==0.16.0 hf-xet==1.8.0 httpcore2==2.16.2 httpx2==2.16.2
huggingface_hub==2.4.0 idna==3.20 iniconfig==2.3.1 Jinja2==3.1.6 markdown-it-py==4.3.0
MarkupSafe==3.0.4 mdurl==0.1.2 mpmath==1.3.0 networkx==3.6.1 packaging==26.4 pluggy==1.7.0
pydantic==2.14.4 pydantic_core==2.50.5 Pygments==2.21.0 PyYAML==6.0.4 regex==2026.11.19
rich==15.0.0 shellingham==1.5.4 sympy==1.14.0 tokenizers==0.23.3 tqdm==4.70.1
typer==0.29.2 typing-inspection==0.4.5 typing_extensions==4.16.0 setuptools==84.2.1"
PKG_DIR=core/trainer/python

# Prints what is missing or at another version, nothing when the venv matches (fast: reads
# installed metadata, imports nothing).
venv_missing() {
	"$VENV/bin/python" - "$PWD/$PKG_DIR" "$TORCH_PIN" "${PINS[@]}" "${NODEPS_PINS[@]}" \
		"${DEP_PINS[@]}" <<'PY'
import json, os, sys
from importlib import metadata
pkg_dir, pins = sys.argv[1], sys.argv[2:]
for pin in pins:
    name, want = pin.split("==")
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    if have != want:
        print(f"{name} {have or 'missing'} (want {want})")
if os.path.exists(os.path.join(pkg_dir, "pyproject.toml")):
    try:
        d = metadata.distribution("ckptfs")
        url = json.loads(d.read_text("direct_url.json") or "{}")
        ok = url.get("url") == "file://" + pkg_dir and url.get("dir_info", {}).get("editable")
    except metadata.PackageNotFoundError:
        ok = False
    if not ok:
        print(f"ckptfs (editable from {pkg_dir})")
PY
}

if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -c "" 2>/dev/null; then
	# a venv whose interpreter is gone (python upgraded, tree copied): make it again
	echo "setup: $VENV/bin/python does not run; recreating $VENV"
	rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
	echo "setup: creating $VENV with $(command -v python3) ($(python3 -V 2>&1))"
	python3 -m venv "$VENV"
fi
todo=$(venv_missing)
if [ -n "$todo" ]; then
	echo "setup: installing into $VENV: $(echo "$todo" | tr '\n' ';' | sed 's/;$//; s/;/; /g')"
	cons=$(mktemp "${TMPDIR:-/tmp}/ckptfs-constraints.XXXXXX")
	log=$(mktemp "${TMPDIR:-/tmp}/ckptfs-pip.XXXXXX")
	trap 'rm -f "$cons"' EXIT
	printf '%s\n' $CONSTRAINTS "$TORCH_PIN" "${PINS[@]}" "${DEP_PINS[@]}" >"$cons"
	pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
	# torch first and alone, so that nothing later can choose another build of it
	if ! "${pip[@]}" install -q -c "$cons" "$TORCH_PIN" >"$log" 2>&1; then
		cat "$log" >&2
		if grep -q CERTIFICATE_VERIFY_FAILED "$log"; then
			echo "setup: pip cannot verify the certificate of its index (log above): give it" >&2
			echo "setup: the CA bundle of this network (PIP_CERT=FILE or cert= in pip.conf)." >&2
		fi
		echo "setup: cannot install $TORCH_PIN (the CPU build of torch, log above)." >&2
		echo "setup: it is not on PyPI; pip looks for it in its find-links and extra indexes," >&2
		echo "setup: now: $("${pip[@]}" config list 2>/dev/null | grep -E 'find-links|index-url' \
			| tr '\n' ' ')${PIP_FIND_LINKS:+PIP_FIND_LINKS=$PIP_FIND_LINKS}" >&2
		echo "setup: put torch-2.13.0+cpu-cp3XX-*.whl (for $("$VENV/bin/python" -V)) in a folder" >&2
		echo "setup: and run again with PIP_FIND_LINKS=FOLDER, or PIP_EXTRA_INDEX_URL=" >&2
		echo "setup: https://download.pytorch.org/whl/cpu where that is reachable." >&2
		exit 1
	fi
	if ! { "${pip[@]}" install -q -c "$cons" "$TORCH_PIN" "${PINS[@]}" "${DEP_PINS[@]}" &&
		"${pip[@]}" install -q --no-deps "${NODEPS_PINS[@]}"; } >"$log" 2>&1; then
		cat "$log" >&2
		echo "setup: pip install into $VENV failed (log above, kept in $log)" >&2
		exit 1
	fi
	if [ -f "$PKG_DIR/pyproject.toml" ]; then
		# no build isolation: the build backend comes from the venv (setuptools, pinned above)
		# instead of a download at every install
		if ! "${pip[@]}" install -q --no-deps --no-build-isolation -e "$PKG_DIR" >"$log" 2>&1; then
			cat "$log" >&2
			echo "setup: pip install -e $PKG_DIR failed (log above, kept in $log)" >&2
			exit 1
		fi
	fi
	rm -f "$log"
	todo=$(venv_missing)
	if [ -n "$todo" ]; then
		echo "setup: after pip install, $VENV still lacks: $todo" >&2
		exit 1
	fi
fi
echo "setup: $VENV ready ($("$VENV/bin/python" -V), torch ${TORCH_PIN#torch==})"
