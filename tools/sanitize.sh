#!/usr/bin/env bash
# make check of a sanitizer build (configure --enable-sanitizers: AddressSanitizer,
# LeakSanitizer, UndefinedBehaviorSanitizer; any report fails a test), apart from the in-tree
# build, which it leaves as it is.  build-san/src is the source as `make distdir` copies it
# (automake refuses a VPATH build of a source directory that is configured in place, as the
# in-tree build is); build-san/obj is the build, kept between runs so that only what changed
# is rebuilt.  Run by tools/test.sh after the main suite; needs the in-tree build configured
# (tools/setup.sh).  Arguments go to make check, e.g. TESTS='tests/check_jalloc'.
set -euo pipefail
cd "$(dirname "$0")/.."
# The copy in build-san/src has no .venv: tests that need the project's Python packages
# (t_metrics.sh: prometheus_client) are pointed at this tree's.
if [ -z "${PROM_PYTHON:-}" ] && [ -x .venv/bin/python ]; then
	export PROM_PYTHON=$PWD/.venv/bin/python
fi
mkdir -p build-san
make -s distdir distdir=build-san/src >/dev/null
mkdir -p build-san/obj
cd build-san/obj
if [ ! -f Makefile ] || [ ../src/configure -nt Makefile ]; then
	../src/configure --enable-sanitizers >/dev/null
fi
# Results of an earlier run are not counted again (tools/test.sh counts every .trs here, and a
# test the build no longer runs would keep its old one).
rm -f tests/*.trs tests/*.log tests/integration/*.trs tests/integration/*.log test-suite.log
exec make -j"$(nproc)" check "$@"
