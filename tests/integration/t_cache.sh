#!/bin/bash
# The kernel's page cache of files read through the mount (fs/ckptfs.c).
# - Direct reads (-o direct_read=views, the default, or all; only where the
#   kernel maps direct_io files shared, Linux 6.6+): read() of a view file
#   (with =all also of a stored file) leaves no pages in the page cache even
#   with a second descriptor open, and shared and private mappings still
#   work and read exactly.  Stored files keep the page cache by default.
# - Drop-behind (-o direct_read=none): the cached pages of a file that one
#   handle reads sequentially are dropped 32 MiB behind the reader, for store
#   files and for files under a view directory; not while a second handle
#   has the file open, and not with -o drop_behind=0.  Also through a
#   mapping whose pages are dropped while mapped (and refaulted).
# Content read is exact in every case.  Residency is measured with mincore()
# on a mapping of the reading descriptor itself (a new open would drop the
# cache: keep_cache=0).
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

SIZE=$((160 * MiB))
rand_file "$WORK/big" "$SIZE"
WANT=$(sha "$WORK/big")

cat >"$WORK/resident.py" <<'PY'
"""resident.py FILE WANT_SHA MODE ORIG: read FILE front to back, check the
content, then print how many of the pages of its first 64 MiB are still in
the kernel's page cache (waiting up to 3 s for them to go where they
should).  MODE alone: 1 MiB reads; shared: the same while a second
descriptor has FILE open; mapped: through a MAP_SHARED mapping of the whole
file (page faults reach the daemon as sequential reads of the mapping's
handle), then its first MiB again (refaulted), compared with ORIG; private:
the same through a MAP_PRIVATE mapping."""
import ctypes, hashlib, mmap, os, sys, time
path, want, mode, orig = sys.argv[1:5]
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
other = os.open(path, os.O_RDONLY) if mode == "shared" else None
fd = os.open(path, os.O_RDONLY)
span = 64 << 20
mapped = mode in ("mapped", "private")
size = os.fstat(fd).st_size if mapped else span
addr = libc.mmap(None, size, mmap.PROT_READ,
                 mmap.MAP_PRIVATE if mode == "private" else mmap.MAP_SHARED, fd, 0)
if addr in (None, ctypes.c_void_p(-1).value):
    sys.exit(f"mmap: {os.strerror(ctypes.get_errno())}")
h = hashlib.sha256()
if mapped:
    for off in range(0, size, 1 << 20):
        h.update(ctypes.string_at(addr + off, min(1 << 20, size - off)))
else:
    while b := os.read(fd, 1 << 20):
        h.update(b)
print(("ok - " if h.hexdigest() == want else "not ok - ") + f"content of {path} read exactly ({mode})")
vec = ctypes.create_string_buffer(span // 4096)
for _ in range(30):
    if libc.mincore(addr, span, vec) != 0:
        sys.exit(f"mincore: {os.strerror(ctypes.get_errno())}")
    resident = sum(v & 1 for v in vec.raw)
    if resident == 0 or mode == "shared":
        break
    time.sleep(0.1)
if mapped:
    with open(orig, "rb") as f:
        first = f.read(1 << 20)
    print(("ok - " if ctypes.string_at(addr, 1 << 20) == first else "not ok - ") +
          "first MiB of the mapping again (refaulted), exactly")
libc.munmap(addr, size)
print(f"resident {resident}")
PY

# resident FILE MODE: the count printed by resident.py (its checks are counted too)
resident() {
	_py_tap "read $1 ($2)" "$PY" "$WORK/resident.py" "$1" "$WANT" "$2" "$WORK/big" >"$T_DIR/res.out"
	grep -v '^# resident' "$T_DIR/res.out" >&2 || true
	sed -n 's/^# resident //p' "$T_DIR/res.out"
}

# Direct reads are on by default where the kernel maps direct_io files
# shared (FUSE_DIRECT_IO_ALLOW_MMAP, Linux 6.6).
kver=$(uname -r)
kmaj=${kver%%.*}
kmin=${kver#*.}
kmin=${kmin%%[!0-9]*}
DIRECT=0
if [ "$kmaj" -gt 6 ] || { [ "$kmaj" -eq 6 ] && [ "$kmin" -ge 6 ]; }; then
	DIRECT=1
fi
if [ $DIRECT = 1 ]; then note "kernel $kver: direct reads expected on"; else note "kernel $kver: direct reads expected off"; fi

start_daemon || bail "mount $STORE"
mkdir -p "$MNT/d"
cp "$WORK/big" "$MNT/big" || bail "copy into the mount"
cp "$WORK/big" "$MNT/d/big" || bail "copy into the mount"
PAGES=$((64 * MiB / 4096))

# direct_file FILE WHAT: FILE is read with direct reads where the kernel
# allows them: read() with a second descriptor open leaves no pages cached
# (without direct reads they are kept), and shared and private mappings
# still read exactly, their pages dropped behind the reader.
direct_file() {
	local n
	n=$(resident "$1" shared)
	if [ $DIRECT = 1 ]; then
		assert_eq 0 "$n" "$2 open twice, read(): no pages cached"
	else
		assert_lt $((PAGES / 2)) "${n:-0}" "$2 open twice (page cache): pages kept ($n of $PAGES)"
	fi
	n=$(resident "$1" mapped)
	assert_eq 0 "$n" "$2 read through a shared mapping, pages behind dropped"
	n=$(resident "$1" private)
	assert_eq 0 "$n" "$2 read through a private mapping, pages behind dropped"
}

# Default options (direct_read=views): view files direct, stored files not.
direct_file "$MNT/tp1_pp1/d/big" "default options: view file"
n=$(resident "$MNT/big" shared)
assert_lt $((PAGES / 2)) "${n:-0}" "default options: store file open twice: pages kept ($n of $PAGES)"

remount -o direct_read=all || bail "remount with -o direct_read=all"
direct_file "$MNT/big" "direct_read=all: store file"

remount -o direct_read=none || bail "remount with -o direct_read=none"
n=$(resident "$MNT/big" alone)
assert_eq 0 "$n" "store file read alone: its first 64 MiB left the page cache"
n=$(resident "$MNT/tp1_pp1/d/big" alone)
assert_eq 0 "$n" "file under a view directory read alone: its first 64 MiB left the page cache"
n=$(resident "$MNT/big" shared)
assert_lt $((PAGES / 2)) "${n:-0}" "store file open twice: pages kept ($n of $PAGES resident)"
n=$(resident "$MNT/tp1_pp1/d/big" shared)
assert_lt $((PAGES / 2)) "${n:-0}" "view-directory file open twice: pages kept ($n of $PAGES resident)"

n=$(resident "$MNT/big" mapped)
assert_eq 0 "$n" "store file read through a mapping: its first 64 MiB left the page cache"

remount -o direct_read=none,drop_behind=0 || bail "remount with -o direct_read=none,drop_behind=0"
n=$(resident "$MNT/big" alone)
assert_lt $((PAGES / 2)) "${n:-0}" "-o drop_behind=0: pages kept ($n of $PAGES resident)"

stop_daemon || fail "unmount"
finish
