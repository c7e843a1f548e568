#!/bin/bash
# POSIX surface of a mounted ckptfs, driven by real tools (coreutils, dd, rsync, python os.*,
# numpy, torch). Every result is compared with the same operations done on the local disk.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
need rsync
need_py numpy torch

start_daemon || bail "mount $STORE on $MNT"
M=$MNT
ok "daemon mounted"

# ---------------------------------------------------------------- basic create/read/append
echo hello >"$M/hello.txt"
assert_eq hello "$(cat "$M/hello.txt")" "create + write + read a small file"
assert_eq 6 "$(stat -c %s "$M/hello.txt")" "stat size of a small file"
assert_eq "regular file" "$(stat -c %F "$M/hello.txt")" "stat type of a regular file"
printf 'abc' >>"$M/hello.txt"
assert_eq "$(printf 'hello\nabc')" "$(cat "$M/hello.txt")" "O_APPEND write"
: >"$M/empty"
assert_eq 0 "$(stat -c %s "$M/empty")" "empty file has size 0"
assert_eq "" "$(cat "$M/empty")" "empty file reads empty"
echo replaced >"$M/hello.txt"
assert_eq replaced "$(cat "$M/hello.txt")" "O_TRUNC rewrite"

# touch opens the file O_WRONLY, then sets the times (utimensat) and closes it
echo stamp >"$M/stamp.txt"
touch -d @1500000000.25 "$M/stamp.txt"
assert_eq 1500000000.250000000 "$(stat -c %.9Y "$M/stamp.txt")" "touch -d: mtime right away"
touch -d @1400000000 "$M/stamp.txt"
assert_eq "1400000000 1400000000" "$(stat -c '%X %Y' "$M/stamp.txt")" "touch -d again: atime+mtime"

# ---------------------------------------------------------------- dd overwrite in the middle
rand_file "$WORK/base" $((3 * MiB + 123))
rand_file "$WORK/patch" 100000
cp "$WORK/base" "$M/dd.bin"
cp "$WORK/base" "$WORK/dd.ref"
assert_cmp "$WORK/base" "$M/dd.bin" "cp of a 3 MiB file"
for spec in "bs=4096 seek=100 count=3" "bs=1 seek=1048575 count=777" \
	"bs=1M seek=2 count=1" "bs=1000 seek=5000 count=30" "bs=512 seek=1 count=1"; do
	# shellcheck disable=SC2086
	dd if="$WORK/patch" of="$M/dd.bin" conv=notrunc $spec status=none
	# shellcheck disable=SC2086
	dd if="$WORK/patch" of="$WORK/dd.ref" conv=notrunc $spec status=none
	assert_cmp "$WORK/dd.ref" "$M/dd.bin" "dd conv=notrunc $spec"
done
dd if="$WORK/patch" of="$M/dd.bin" bs=4096 seek=10 count=1 status=none
dd if="$WORK/patch" of="$WORK/dd.ref" bs=4096 seek=10 count=1 status=none
assert_cmp "$WORK/dd.ref" "$M/dd.bin" "dd without notrunc truncates after the written block"
assert_eq $((11 * 4096)) "$(stat -c %s "$M/dd.bin")" "size after dd seek=10 without notrunc"
dd if="$M/dd.bin" of="$WORK/dd.back" bs=3000 skip=3 status=none
dd if="$WORK/dd.ref" of="$WORK/dd.refback" bs=3000 skip=3 status=none
assert_cmp "$WORK/dd.refback" "$WORK/dd.back" "dd read with skip="

# ---------------------------------------------------------------- truncate (shrink and grow)
cp "$WORK/base" "$M/tr.bin"
cp "$WORK/base" "$WORK/tr.ref"
for size in 1000000 $((5 * MiB + 7)) 4096 0 1 $((2 * MiB)); do
	truncate -s "$size" "$M/tr.bin"
	truncate -s "$size" "$WORK/tr.ref"
	assert_eq "$size" "$(stat -c %s "$M/tr.bin")" "truncate -s $size: size"
	assert_cmp "$WORK/tr.ref" "$M/tr.bin" "truncate -s $size: content"
done
dd if="$WORK/patch" of="$M/tr.bin" bs=1 seek=1500000 count=1000 conv=notrunc status=none
dd if="$WORK/patch" of="$WORK/tr.ref" bs=1 seek=1500000 count=1000 conv=notrunc status=none
assert_cmp "$WORK/tr.ref" "$M/tr.bin" "write into a hole created by growing truncate"

# ---------------------------------------------------------------- random pwrite/pread/ftruncate
py_helper "iofuzz 1" iofuzz "$WORK/fuzz1.ref" "$M/fuzz1.bin" 1 150
py_helper "iofuzz 2" iofuzz "$WORK/fuzz2.ref" "$M/fuzz2.bin" 2 150
assert_cmp "$WORK/fuzz1.ref" "$M/fuzz1.bin" "iofuzz 1 content after close"

# ---------------------------------------------------------------- python os.* semantics
cat >"$WORK/posix.py" <<'EOF'
import ctypes, errno, os, platform, stat, sys, time
from helpers import tap, expect_errno, MiB
M = sys.argv[1]
ONLY = sys.argv[2:]  # section names; all when empty
WB = os.environ.get("CKPT_WRITEBACK", "0") == "1"  # the mount's -o writeback_cache
j = lambda *p: os.path.join(M, *p)

def wfile(p, data, mode=0o644):
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.write(fd, data)
    os.close(fd)

def rfile(p):
    with open(p, "rb") as f:
        return f.read()


def sec_0():
    """sparse writes past the end"""
    fd = os.open(j("sparse"), os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"head")
    os.pwrite(fd, b"tail", 10 * MiB + 5)
    tap(os.fstat(fd).st_size == 10 * MiB + 9, "pwrite past EOF extends the size")
    tap(os.pread(fd, 8192, 5 * MiB) == bytes(8192), "hole reads as zeros (same fd)")
    os.close(fd)
    d = rfile(j("sparse"))
    tap(d[:4] == b"head" and d[-4:] == b"tail" and d[4:-4] == bytes(len(d) - 8),
        "sparse file content after close: head + zeros + tail")
    tap(os.stat(j("sparse")).st_size == 10 * MiB + 9, "sparse file size after close")


def sec_1():
    """ftruncate on an open fd, then write"""
    fd = os.open(j("ft"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"x" * 100000)
    os.ftruncate(fd, 10)
    tap(os.fstat(fd).st_size == 10, "ftruncate shrink: fstat size")
    os.ftruncate(fd, 20000)
    os.pwrite(fd, b"yy", 15000)
    os.close(fd)
    exp = b"x" * 10 + bytes(14990) + b"yy" + bytes(20000 - 15002)
    tap(rfile(j("ft")) == exp, "ftruncate shrink then grow then write: content")


def sec_2():
    """read-your-writes before close, O_RDWR overwrite in the middle"""
    fd = os.open(j("rw"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"a" * 300000)
    os.pwrite(fd, b"b" * 1000, 123456)
    tap(os.pread(fd, 3000, 122456) == b"a" * 1000 + b"b" * 1000 + b"a" * 1000,
        "read back own overwrite before close")
    os.close(fd)


def sec_3():
    """unlink of an open file"""
    wfile(j("doomed"), b"still here" * 100000)
    fd = os.open(j("doomed"), os.O_RDWR)
    os.unlink(j("doomed"))
    tap(not os.path.exists(j("doomed")), "unlinked file is gone from the namespace")
    tap(os.pread(fd, 10 * 100000, 0) == b"still here" * 100000, "unlinked open file readable by fd")
    os.pwrite(fd, b"WRITE", 0)
    tap(os.pread(fd, 10, 0) == b"WRITE here", "unlinked open file writable by fd")
    wfile(j("doomed"), b"new file")
    tap(os.pread(fd, 10, 0) == b"WRITE here",
        "new file with the same name does not alias the old fd")
    os.close(fd)
    tap(rfile(j("doomed")) == b"new file", "new file with the reused name is intact")
    tap(sorted(x for x in os.listdir(M) if x.startswith("doomed")) == ["doomed"],
        "no leftover of the unlinked file in readdir")


def sec_4():
    """rename of an open file, then write via fd"""
    wfile(j("moving"), b"0123456789")
    fd = os.open(j("moving"), os.O_WRONLY)
    os.rename(j("moving"), j("moved"))
    os.pwrite(fd, b"AB", 3)
    os.close(fd)
    tap(rfile(j("moved")) == b"012AB56789",
        "write through an fd after rename lands in the new name")


def sec_5():
    """mkdir / rmdir"""
    os.mkdir(j("dir1"))
    expect_errno(errno.EEXIST, lambda: os.mkdir(j("dir1")), "mkdir existing dir")
    wfile(j("dir1", "x"), b"x")
    expect_errno(errno.ENOTEMPTY, lambda: os.rmdir(j("dir1")), "rmdir non-empty dir")
    expect_errno(errno.ENOTDIR, lambda: os.rmdir(j("dir1", "x")), "rmdir of a file")
    expect_errno((errno.EISDIR, errno.EPERM), lambda: os.unlink(j("dir1")), "unlink of a dir")
    expect_errno(errno.ENOENT, lambda: os.open(j("nope"), os.O_RDONLY), "open missing file")
    expect_errno(errno.ENOENT, lambda: os.open(j("nodir", "f"), os.O_CREAT | os.O_WRONLY),
                 "create in missing dir")
    expect_errno(errno.EEXIST,
                 lambda: os.open(j("dir1", "x"), os.O_CREAT | os.O_EXCL | os.O_WRONLY),
                 "O_EXCL on existing file")
    expect_errno(errno.EISDIR, lambda: os.open(j("dir1"), os.O_WRONLY), "open dir for write")
    expect_errno(errno.ENOTDIR, lambda: os.open(j("dir1", "x", "y"), os.O_RDONLY),
                 "path through a file")
    os.unlink(j("dir1", "x"))
    os.rmdir(j("dir1"))
    tap(not os.path.exists(j("dir1")), "rmdir of an emptied dir")


def sec_6():
    """rename: files, replace, dirs, across dirs"""
    wfile(j("r_src"), b"source")
    wfile(j("r_dst"), b"destination, longer")
    os.rename(j("r_src"), j("r_dst"))
    tap(rfile(j("r_dst")) == b"source" and not os.path.exists(j("r_src")),
        "rename replaces an existing file")
    os.makedirs(j("rd", "sub"))
    wfile(j("rd", "sub", "f"), b"in sub")
    os.mkdir(j("other"))
    os.rename(j("rd"), j("other", "rd2"))
    tap(rfile(j("other", "rd2", "sub", "f")) == b"in sub" and not os.path.exists(j("rd")),
        "rename a dir tree into another dir")
    os.rename(j("other", "rd2", "sub", "f"), j("f_moved_up"))
    tap(rfile(j("f_moved_up")) == b"in sub", "rename a file across dirs")
    os.mkdir(j("emptydst"))
    os.rename(j("other", "rd2"), j("emptydst"))
    tap(os.path.isdir(j("emptydst", "sub")), "rename a dir over an empty dir")
    os.mkdir(j("fulldst"))
    wfile(j("fulldst", "f"), b"f")
    expect_errno((errno.ENOTEMPTY, errno.EEXIST), lambda: os.rename(j("emptydst"), j("fulldst")),
                 "rename a dir over a non-empty dir")
    expect_errno(errno.EISDIR, lambda: os.rename(j("f_moved_up"), j("fulldst")),
                 "rename a file over a dir")
    expect_errno(errno.ENOTDIR, lambda: os.rename(j("fulldst"), j("f_moved_up")),
                 "rename a dir over a file")
    expect_errno(errno.EINVAL, lambda: os.rename(j("emptydst"), j("emptydst", "sub", "x")),
                 "rename a dir into its own subdir")
    expect_errno(errno.ENOENT, lambda: os.rename(j("nope"), j("nope2")), "rename missing source")


def sec_7():
    """renameat2"""
    libc = ctypes.CDLL(None, use_errno=True)
    AT_FDCWD = -100
    def renameat2(a, b, flags):
        if platform.machine() == "x86_64":
            r = libc.syscall(ctypes.c_long(316), ctypes.c_int(AT_FDCWD), a.encode(),
                             ctypes.c_int(AT_FDCWD), b.encode(), ctypes.c_uint(flags))
        else:
            r = libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), ctypes.c_uint(flags))
        if r != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
    wfile(j("ra"), b"A")
    wfile(j("rb"), b"B")
    expect_errno(errno.EEXIST, lambda: renameat2(j("ra"), j("rb"), 1), "renameat2 RENAME_NOREPLACE")
    tap(rfile(j("ra")) == b"A" and rfile(j("rb")) == b"B", "failed NOREPLACE left both files alone")
    try:
        renameat2(j("ra"), j("rc"), 1)
        tap(rfile(j("rc")) == b"A" and not os.path.exists(j("ra")),
            "renameat2 NOREPLACE to a new name")
    except OSError as e:
        tap(False, f"renameat2 NOREPLACE to a new name: {os.strerror(e.errno)}")
        os.rename(j("ra"), j("rc"))
    try:
        renameat2(j("rb"), j("rc"), 2)
        tap(rfile(j("rb")) == b"A" and rfile(j("rc")) == b"B", "renameat2 RENAME_EXCHANGE swapped")
    except OSError as e:
        tap(e.errno in (errno.EINVAL, errno.ENOTSUP, errno.ENOSYS),
            f"renameat2 RENAME_EXCHANGE unsupported with a sane errno ({e.errno})")
        tap(rfile(j("rb")) == b"B" and rfile(j("rc")) == b"A", "failed EXCHANGE left files alone")


def sec_8():
    """readdir"""
    os.mkdir(j("many"))
    names = {f"file-{i:04d}" for i in range(300)} | {"sub"}
    for n in names - {"sub"}:
        wfile(j("many", n), n.encode())
    os.mkdir(j("many", "sub"))
    tap(set(os.listdir(j("many"))) == names, "readdir lists exactly the 301 entries")
    kinds = {e.name: (e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False))
             for e in os.scandir(j("many"))}
    tap(kinds["sub"] == (True, False) and kinds["file-0007"] == (False, True), "readdir d_type")
    for i in range(0, 300, 2):
        os.unlink(j("many", f"file-{i:04d}"))
    tap(len(os.listdir(j("many"))) == 151, "readdir after deleting half of the entries")
    os.mkdir(j("empty_dir_test"))
    tap(os.listdir(j("empty_dir_test")) == [], "readdir of an empty dir")


def sec_9():
    """symlink / readlink"""
    os.symlink("moved", j("lnk"))
    tap(os.readlink(j("lnk")) == "moved", "readlink")
    tap(stat.S_ISLNK(os.lstat(j("lnk")).st_mode), "lstat of a symlink")
    tap(rfile(j("lnk")) == b"012AB56789", "read through a symlink")
    os.symlink("/definitely/not/here", j("dangling"))
    tap(os.readlink(j("dangling")) == "/definitely/not/here", "dangling symlink readlink")
    expect_errno(errno.ENOENT, lambda: os.stat(j("dangling")), "stat through a dangling symlink")
    expect_errno(errno.EINVAL, lambda: os.readlink(j("moved")), "readlink of a regular file")
    long_target = "t" * 1000 + "/" + "u" * 1000
    os.symlink(long_target, j("longlink"))
    tap(os.readlink(j("longlink")) == long_target, "readlink of a 2001-byte target")
    os.rename(j("lnk"), j("lnk2"))
    tap(os.readlink(j("lnk2")) == "moved", "rename of a symlink")
    os.unlink(j("lnk2"))
    tap(os.path.exists(j("moved")), "unlinking a symlink keeps its target")


def sec_10():
    """hard link (optional)"""
    try:
        os.link(j("moved"), j("hard"))
        tap(rfile(j("hard")) == rfile(j("moved")), "hard link content")
        tap(os.stat(j("moved")).st_nlink == 2, "hard link nlink == 2")
        wfile(j("hard"), b"via hard link")
        tap(rfile(j("moved")) == b"via hard link", "write via one hard link visible via the other")
        os.unlink(j("hard"))
        tap(os.stat(j("moved")).st_nlink == 1, "nlink back to 1")
    except OSError as e:
        print(f"hard links unsupported: {os.strerror(e.errno)} (allowed)")
        tap(e.errno in (errno.EPERM, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP),
            "unsupported hard link gives a sane errno")


def sec_11():
    """stat: mode, nlink, times; chmod; utimens"""
    wfile(j("st"), b"12345", 0o640)
    st = os.stat(j("st"))
    tap(stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640 & ~os.umask(0o022),
        f"create mode honoured ({oct(st.st_mode)})")
    tap(st.st_nlink == 1, "regular file nlink == 1")
    tap(st.st_uid == os.getuid() and st.st_gid == os.getgid(), "owner is the creator")
    now = time.time()
    tap(abs(st.st_mtime - now) < 10 and abs(st.st_ctime - now) < 10, "new file mtime/ctime ~ now")
    os.chmod(j("st"), 0o600)
    tap(stat.S_IMODE(os.stat(j("st")).st_mode) == 0o600, "chmod 600")
    os.chmod(j("st"), 0o4755)
    tap(stat.S_IMODE(os.stat(j("st")).st_mode) in (0o4755, 0o755), "chmod 4755 (setuid may drop)")
    os.utime(j("st"), ns=(1_000_000_000_123_456_789, 1_100_000_000_987_654_321))
    st = os.stat(j("st"))
    tap(st.st_mtime_ns // 10**9 == 1_100_000_000, f"utimens mtime seconds ({st.st_mtime_ns})")
    tap(st.st_mtime_ns % 10**9 == 987_654_321, f"utimens mtime nanoseconds ({st.st_mtime_ns})")
    tap(st.st_atime_ns // 10**9 == 1_000_000_000, f"utimens atime seconds ({st.st_atime_ns})")
    os.utime(j("st"), ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    with open(j("st"), "r+b") as f:
        f.write(b"x")
    st = os.stat(j("st"))
    tap(abs(st.st_mtime - time.time()) < 10, f"write updates mtime ({st.st_mtime})")
    os.utime(j("st"), (1_000_000_000, 1_000_000_000))
    os.truncate(j("st"), 2)
    tap(abs(os.stat(j("st")).st_mtime - time.time()) < 10, "truncate updates mtime")
    fd = os.open(j("fut"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"z" * 100000)
    os.utime(fd, ns=(1_300_000_000 * 10**9, 1_300_000_000 * 10**9 + 5))
    tap(os.fstat(fd).st_mtime_ns == 1_300_000_000 * 10**9 + 5, "write + futimens: fstat mtime")
    os.close(fd)
    tap(os.stat(j("fut")).st_mtime_ns == 1_300_000_000 * 10**9 + 5,
        "write + futimens + close: mtime is the one set, not the write time")
    os.mkdir(j("dm"))
    os.utime(j("dm"), (1_000_000_000, 1_000_000_000))
    wfile(j("dm", "child"), b"c")
    tap(abs(os.stat(j("dm")).st_mtime - time.time()) < 10, "creating an entry updates dir mtime")
    os.utime(j("dm"), (1_000_000_000, 1_000_000_000))
    os.unlink(j("dm", "child"))
    tap(abs(os.stat(j("dm")).st_mtime - time.time()) < 10, "unlinking an entry updates dir mtime")
    os.chmod(j("dm"), 0o711)
    tap(stat.S_IMODE(os.stat(j("dm")).st_mode) == 0o711 and stat.S_ISDIR(os.stat(j("dm")).st_mode),
        "chmod on a dir")
    os.mkdir(j("dm", "s1"))
    os.mkdir(j("dm", "s2"))
    nl = os.stat(j("dm")).st_nlink
    tap(nl in (4, 1), f"dir nlink is 2 + subdirs (or 1) ({nl})")
    tap(os.stat(j("dm", "s1")).st_nlink in (2, 1), "empty dir nlink 2 (or 1)")
    os.symlink("st", j("lnk_t"))
    os.utime(j("lnk_t"), ns=(1_200_000_000 * 10**9, 1_200_000_000 * 10**9), follow_symlinks=False)
    tap(os.lstat(j("lnk_t")).st_mtime_ns == 1_200_000_000 * 10**9,
        "utimens on a symlink (nofollow)")


def sec_vis():
    """visibility: a handle reads one committed version, never a mix or a partial write

    ckptfs semantics (docs/design.md, "Visibility"): close-to-open consistency.
    Read-only handles read the latest committed content; a writer's changes
    are committed atomically at its close or fsync, and from then on every
    handle, also ones opened before, reads the new content.  stat reports the
    live size while a writer is active, so only content is checked for handles
    that overlap a writer."""
    old, new = b"old" * 1000, b"new" * 100000

    def state(data):
        if data in (old, new):
            return "old" if data == old else "new"
        return f"mixed/partial ({len(data)} bytes)"

    # an fd opened (and read) before another fd rewrites and closes the file
    wfile(j("vis0"), old)
    early = os.open(j("vis0"), os.O_RDONLY)
    os.pread(early, 100, 0)
    w = os.open(j("vis0"), os.O_WRONLY | os.O_TRUNC)
    os.write(w, new)
    os.close(w)
    st = state(os.pread(early, 10 * len(new), 0))
    tap(st == "new", f"fd opened before a rewrite reads the new content after the close ({st})")
    tap(os.fstat(early).st_size == len(new), "and fstat on it agrees")
    os.close(early)
    tap((os.stat(j("vis0")).st_size, rfile(j("vis0"))) == (len(new), new),
        "a new open after the writer's close sees the new content and size")
    # same, but a newer handle reads the first 64 KiB of the new content before the old
    # handle reads (the kernel page cache is per inode, the snapshot is per handle)
    wfile(j("vis1"), old)
    early = os.open(j("vis1"), os.O_RDONLY)
    os.pread(early, 100, 0)
    w = os.open(j("vis1"), os.O_WRONLY | os.O_TRUNC)
    os.write(w, new)
    os.close(w)
    f = os.open(j("vis1"), os.O_RDONLY)
    os.pread(f, 65536, 0)
    os.close(f)
    st = state(os.pread(early, 10 * len(new), 0))
    tap(st == "new",
        f"old handle after a newer handle read part of the new content: new version ({st})")
    os.close(early)
    # readers while the writer still has uncommitted data
    wfile(j("vis"), old)
    early = os.open(j("vis"), os.O_RDONLY)
    os.pread(early, 100, 0)
    w = os.open(j("vis"), os.O_WRONLY | os.O_TRUNC)
    os.write(w, new)
    st = state(rfile(j("vis")))
    tap(st == "old",
        f"new reader while a writer has uncommitted data reads the committed content ({st})")
    data = os.pread(early, 10 * len(new), 0)
    st = state(data)
    if WB:
        # the kernel keeps the writer's size: the committed bytes, then zeros (never the
        # writer's bytes)
        zeros = data == old + bytes(len(new) - len(old))
        tap(st == "old" or zeros,
            f"reader opened earlier, while the writer has uncommitted data: the committed "
            f"bytes, zeros up to the writer's size ({st})")
    else:
        tap(st == "old", f"reader opened earlier, while the writer has uncommitted data ({st})")
    os.close(w)
    tap((os.stat(j("vis")).st_size, rfile(j("vis"))) == (len(new), new),
        "new reader after the writer closed sees the new content and size")
    st = state(os.pread(early, 10 * len(new), 0))
    tap(st == "new", f"reader opened before the writer's close, after the close ({st})")
    os.close(early)


def sec_ns():
    """files open for writing across namespace changes"""
    os.makedirs(j("nsd1"))
    w = os.open(j("nsd1", "f"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(w, b"A" * 100000)
    os.rename(j("nsd1"), j("nsd2"))
    os.write(w, b"B" * 10)
    os.close(w)
    tap(rfile(j("nsd2", "f")) == b"A" * 100000 + b"B" * 10 and not os.path.exists(j("nsd1")),
        "file written while its dir is renamed ends up complete at the new path")
    w = os.open(j("nsu"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(w, b"x" * 50000)
    os.unlink(j("nsu"))
    os.write(w, b"y")
    os.close(w)
    tap(not os.path.exists(j("nsu")), "file unlinked while open for writing does not reappear")
    w = os.open(j("nst"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(w, b"old writer" * 1000)
    wfile(j("nsn"), b"renamed in")
    os.rename(j("nsn"), j("nst"))
    os.write(w, b"more")
    os.close(w)
    tap(rfile(j("nst")) == b"renamed in",
        "closing the writer of a replaced file does not clobber the file renamed over it")
    os.makedirs(j("nsp", "q"))
    w = os.open(j("nsp", "q", "f"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(w, b"Q" * 1000)
    os.rename(j("nsp", "q", "f"), j("nsqf"))
    os.rmdir(j("nsp", "q"))
    os.rmdir(j("nsp"))
    os.write(w, b"Z")
    os.close(w)
    tap(rfile(j("nsqf")) == b"Q" * 1000 + b"Z",
        "file moved out of a dir that is then removed, written via its fd")


def sec_12():
    """fsync / fdatasync and visibility at fsync"""
    fd = os.open(j("fs"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"v1" * 50000)
    os.fsync(fd)
    tap(rfile(j("fs")) == b"v1" * 50000, "content visible to a new open after fsync (still open)")
    os.pwrite(fd, b"v2" * 50000, 0)
    os.fdatasync(fd)
    tap(rfile(j("fs")) == b"v2" * 50000, "content visible to a new open after fdatasync")
    os.close(fd)
    dfd = os.open(M, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
        tap(True, "fsync of a directory")
    except OSError as e:
        tap(e.errno == errno.EINVAL, f"fsync of a directory ({e.errno})")
    os.close(dfd)


def sec_13():
    """statfs"""
    sv = os.statvfs(M)
    tap(sv.f_bsize > 0 and sv.f_blocks > 0, f"statfs f_bsize={sv.f_bsize} f_blocks={sv.f_blocks}")
    tap(sv.f_bfree <= sv.f_blocks and sv.f_bavail <= sv.f_blocks, "statfs free <= total")
    tap(sv.f_namemax >= 255, f"statfs namemax {sv.f_namemax}")


def sec_14():
    """names"""
    long_name = "n" * 255
    wfile(j(long_name), b"long name")
    tap(rfile(j(long_name)) == b"long name", "255-byte file name")
    expect_errno(errno.ENAMETOOLONG, lambda: wfile(j("n" * 256), b"x"), "256-byte file name")

for fn in [sec_0, sec_1, sec_2, sec_3, sec_4, sec_5, sec_6, sec_7, sec_8, sec_9, sec_10, sec_11,
           sec_vis, sec_ns, sec_12, sec_13, sec_14]:
    if ONLY and fn.__name__ not in ONLY:
        continue
    try:
        fn()
    except Exception as e:
        tap(False, f"{fn.__doc__}: unexpected {type(e).__name__}: {e}")
EOF
py_checks "posix semantics" "$M" <"$WORK/posix.py"

# ---------------------------------------------------------------- cp -r and rsync -a of a tree
make_tree "$WORK/tree"
check "cp -r a tree in" cp -r "$WORK/tree" "$M/cp"
check "diff -r after cp -r" diff -r --no-dereference "$WORK/tree" "$M/cp"
check "rsync -a a tree in" rsync -a "$WORK/tree/" "$M/rs/"
check "diff -r after rsync -a" diff -r --no-dereference "$WORK/tree" "$M/rs"
rsync -ain --delete "$WORK/tree/" "$M/rs/" >"$WORK/itemize" 2>&1
assert_eq "" "$(grep -v '^\.L' "$WORK/itemize")" \
	"rsync -a again finds no differences (sizes, modes, mtimes, dirs)"
assert_eq "" "$(grep '^\.L' "$WORK/itemize")" "rsync -a again finds no symlink differences"
check "rsync -a the tree back out" rsync -a "$M/rs/" "$WORK/back/"
check "diff -r of the tree copied back" diff -r --no-dereference "$WORK/tree" "$WORK/back"
assert_same_tree "$WORK/tree" "$M/rs" \
	"manifest (types, modes, sizes, mtimes, hashes, link targets) matches after rsync -a"
check "cp -a a tree in" cp -a "$WORK/tree" "$M/cpa"
assert_same_tree "$WORK/tree" "$M/cpa" \
	"manifest matches after cp -a (cp sets the times on the open fd: futimens before close)"
check "rm -rf a tree" rm -rf "$M/cp"
check "tree is gone" absent "$M/cp"

# ---------------------------------------------------------------- write-to-temp-dir-then-rename
rand_file "$WORK/model" $((4 * MiB + 1))
rand_file "$WORK/optim" $((2 * MiB))
mkdir -p "$M/ckpts"
echo step0 >"$M/ckpts/latest"
for step in 100 200; do
	tmp=$M/ckpts/.tmp-step$step
	mkdir "$tmp"
	cp "$WORK/model" "$tmp/model.bin"
	cp "$WORK/optim" "$tmp/optim.bin"
	echo "{\"step\": $step}" >"$tmp/meta.json"
	sync "$tmp/model.bin" "$tmp/optim.bin" "$tmp/meta.json" "$tmp"
	check "rename temp dir to step$step" mv -T "$tmp" "$M/ckpts/step$step"
	echo "step$step" >"$M/ckpts/latest.tmp"
	check "replace 'latest' by rename (step $step)" mv -f "$M/ckpts/latest.tmp" "$M/ckpts/latest"
done
assert_eq step200 "$(cat "$M/ckpts/latest")" "'latest' points to the newest step"
assert_cmp "$WORK/model" "$M/ckpts/step200/model.bin" "renamed checkpoint dir: model"
assert_cmp "$WORK/optim" "$M/ckpts/step100/optim.bin" "renamed checkpoint dir: optimizer"
rm -rf "$M/ckpts/step100"
assert_eq "latest step200" "$(ls "$M/ckpts" | tr '\n' ' ' | sed 's/ $//')" \
	"checkpoint dir listing after pruning the old step"

# ---------------------------------------------------------------- numpy / torch
py_checks "numpy save/load" "$M" <<'EOF'
import os, sys
import numpy as np
from helpers import tap
M = sys.argv[1]
rng = np.random.default_rng(1)
arrs = {"f32": rng.standard_normal((512, 1000), dtype=np.float32),
        "i64": rng.integers(-2**40, 2**40, size=300000),
        "f16": rng.standard_normal(123457).astype(np.float16),
        "zeros": np.zeros((1024, 1024), dtype=np.float32)}
for k, a in arrs.items():
    np.save(os.path.join(M, f"{k}.npy"), a)
    b = np.load(os.path.join(M, f"{k}.npy"))
    tap(a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), f"numpy save/load {k}")
np.savez(os.path.join(M, "all.npz"), **arrs)
with np.load(os.path.join(M, "all.npz")) as z:
    tap(all(np.array_equal(z[k], a) for k, a in arrs.items()), "numpy savez/load")
mm = np.load(os.path.join(M, "f32.npy"), mmap_mode="r")
tap(np.array_equal(mm, arrs["f32"]), "numpy load with mmap_mode='r'")
del mm
EOF

py_checks "torch save/load" "$M" <<'EOF'
import os, sys
import torch
from helpers import tap
M = sys.argv[1]
torch.manual_seed(0)
sd = {"emb.weight": torch.randn(1000, 512), "fc.bias": torch.randn(512, dtype=torch.float64),
      "ids": torch.arange(100000), "half": torch.randn(300, 300).half(), "step": 1234}
p = os.path.join(M, "ckpt.pt")
torch.save(sd, p)
back = torch.load(p)
tap(set(back) == set(sd), "torch.load keys")
tap(all(torch.equal(back[k], v) for k, v in sd.items() if torch.is_tensor(v))
    and back["step"] == 1234,
    "torch.save/load round trip")
torch.save(sd, p + ".tmp")
os.replace(p + ".tmp", p)
tap(torch.equal(torch.load(p)["emb.weight"], sd["emb.weight"]), "torch.save to tmp + os.replace")
EOF

# ---------------------------------------------------------------- 20 MiB random round trip
rand_file "$WORK/big" $((20 * MiB))
check "cp 20 MiB random file in" cp "$WORK/big" "$M/big.bin"
assert_eq "$(sha "$WORK/big")" "$(sha "$M/big.bin")" "20 MiB random file sha256"
assert_eq "$(sha "$WORK/big")" \
	"$(dd if="$M/big.bin" bs=1M status=none | sha256sum | cut -d' ' -f1)" \
	"20 MiB random file sha256 via dd bs=1M"
check "df works on the mount" df "$M"
assert_eq 1 "$(stat -f -c '%S %b' "$M" | awk '{print ($1 > 0 && $2 > 0)}')" \
	"stat -f: bsize, blocks > 0"

# ---------------------------------------------------------------- everything survives a remount
"$PY" "$LIB_DIR/helpers.py" manifest "$M" >"$WORK/manifest.before" 2>&1
remount || bail "remount"
"$PY" "$LIB_DIR/helpers.py" manifest "$M" >"$WORK/manifest.after" 2>&1
check "whole tree identical after remount (page cache dropped)" \
	diff "$WORK/manifest.before" "$WORK/manifest.after"

# ---------------------------------------------------------------- with the writeback cache
remount -o writeback_cache=1 || bail "remount -o writeback_cache=1"
mkdir -p "$M/wb"
CKPT_WRITEBACK=1 py_checks "visibility with -o writeback_cache=1" "$M/wb" sec_vis sec_4 \
	<"$WORK/posix.py"

finish
