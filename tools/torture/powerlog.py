"""The power-loss log written by libtorture.so (tools/torture/shim.c) and its replay.

A power round copies the store (the base), runs the daemon with the shim logging every change
to the store's files, then builds the store a power loss at a chosen record (the cut) would
leave behind: the base with the logged changes applied as follows.

Data (writes, truncations, holes punched): a change to a file is kept when an fsync or
fdatasync of that file (or a syncfs/sync) began after it was logged and ended before the cut;
"drop" mode drops every other change; "torn" mode keeps each of the others whole, not at all,
or only some of its 4 KiB pages, at random, as a disk's write-back may.

Names (creates, renames, links, unlinks, mkdir, rmdir): they are applied in log order up to a
point J: at least up to the start of the last directory fsync that ended before the cut (the
ordered-journal behaviour of ext4 and xfs: a directory fsync makes every earlier name change
durable; an fsync of a file alone does not), in "drop" mode exactly there, in "torn" mode at a
random point between there and the cut.

Records are listed in shim.c.  Everything is Python's standard library.
"""
import mmap
import os
import struct

from tlib import Failure, copy_tree

MAGIC = 0x4C545254
VERSION = 1
HDR = struct.Struct("<IHHIIQQQ")
(R_OPEN, R_WRITE, R_TRUNC, R_SYNC_BEGIN, R_SYNC_END, R_RENAME, R_UNLINK, R_RMDIR, R_MKDIR,
 R_LINK, R_CLIENT, R_KILL, R_HELLO, R_ZERO) = range(1, 15)
SK_DIR, SK_ALL = 2, 3
NAMES = {R_RENAME, R_UNLINK, R_RMDIR, R_MKDIR, R_LINK}


class Rec:
    __slots__ = ("type", "tid", "ino", "a", "b", "off", "len")

    def __init__(self, t, tid, ino, a, b, off, n):
        self.type, self.tid, self.ino, self.a, self.b, self.off, self.len = t, tid, ino, a, b, off, n


class Log:
    """A parsed log: recs (in order); payload(rec) gives a record's bytes."""

    def __init__(self, path):
        self.path = path
        self.f = open(path, "rb")
        size = os.fstat(self.f.fileno()).st_size
        self.m = mmap.mmap(self.f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        self.recs = []
        self.torn_tail = False
        off = 0
        while off + HDR.size <= size:
            magic, t, _, n, tid, ino, a, b = HDR.unpack_from(self.m, off)
            if magic != MAGIC or n < HDR.size:
                raise Failure(f"{path}: no record at offset {off} (magic {magic:#x})")
            if off + n > size:
                self.torn_tail = True  # the process died in the middle of this record
                break
            if t == R_HELLO and a != VERSION:
                raise Failure(f"{path}: log format version {a}, this reader knows {VERSION}")
            self.recs.append(Rec(t, tid, ino, a, b, off + HDR.size, n - HDR.size))
            off += n
        if off < size and not self.torn_tail:
            self.torn_tail = True

    def payload(self, r):
        return self.m[r.off:r.off + r.len]

    def paths(self, r):
        return [p.decode() for p in bytes(self.payload(r)).split(b"\0")]

    def close(self):
        if isinstance(self.m, mmap.mmap):
            self.m.close()
        self.f.close()

    def clients(self):
        """Positions of the CLIENT records, in order."""
        return [i for i, r in enumerate(self.recs) if r.type == R_CLIENT]


def base_inodes(store):
    """{inode number: [relative paths]} of the regular files of store (before the round)."""
    out = {}
    for dirpath, _, filenames in os.walk(store):
        for name in filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if os.path.isfile(p) and not os.path.islink(p):
                out.setdefault(st.st_ino, []).append(os.path.relpath(p, store))
    return out


def replay(log, base, base_inos, out, cut, mode, rng):
    """Writes into out the store that a power loss at record `cut` leaves (see the module
    docstring); base is the copy of the store from before the log started.  Returns a dict of
    what was kept and dropped."""
    recs = log.recs[:cut]
    # pass 1: incarnations (an inode number may be reused after an unlink), the syncs that
    # completed before the cut, and J's lower bound
    inc_of_ino = {}
    inc_paths0 = {}
    n_inc = 0
    for ino, paths in base_inos.items():
        n_inc += 1
        inc_of_ino[ino] = n_inc
        inc_paths0[n_inc] = set(paths)
    data_inc = {}        # record index -> incarnation
    created_inc = {}     # record index of a creating R_OPEN -> incarnation
    begins = {}
    covered = {}         # incarnation -> index of the latest covering SYNC_BEGIN
    cover_all = -1
    j_min = 0
    for i, r in enumerate(recs):
        t = r.type
        if t == R_OPEN:
            if r.b:
                n_inc += 1
                inc_of_ino[r.ino] = n_inc
                created_inc[i] = n_inc
            elif r.ino not in inc_of_ino:
                raise Failure(f"log record {i}: open of {log.paths(r)[0]}, an inode the base "
                              f"does not have and no logged create made")
            elif r.a & os.O_TRUNC:
                data_inc[i] = inc_of_ino[r.ino]
        elif t in (R_WRITE, R_TRUNC, R_ZERO):
            if r.ino not in inc_of_ino:
                raise Failure(f"log record {i}: change of inode {r.ino}, which no logged open "
                              f"or base file has")
            data_inc[i] = inc_of_ino[r.ino]
        elif t == R_SYNC_BEGIN:
            begins[r.a] = (i, r.b, inc_of_ino.get(r.ino))
        elif t == R_SYNC_END and r.b == 0 and r.a in begins:
            bi, kind, inc = begins.pop(r.a)
            if kind == SK_ALL:
                cover_all = max(cover_all, bi)
                j_min = max(j_min, bi)
            elif kind == SK_DIR:
                j_min = max(j_min, bi)
            elif inc is not None:
                covered[inc] = max(covered.get(inc, -1), bi)
    j = j_min if mode == "drop" else rng.randint(j_min, len(recs))

    # pass 2: apply, in log order, the names before J and the data changes that survive
    copy_tree(base, out)
    path_inc = {}
    inc_paths = {}
    for inc, ps in inc_paths0.items():
        inc_paths[inc] = set(ps)
        for p in ps:
            path_inc[p] = inc
    stats = {"records": len(recs), "j": j, "j_min": j_min, "kept": 0, "dropped": 0, "torn": 0,
             "names": 0, "names_dropped": 0}

    def unbind(p):
        inc = path_inc.pop(p, None)
        if inc is not None:
            inc_paths[inc].discard(p)

    def target(inc):
        ps = inc_paths.get(inc)
        return os.path.join(out, next(iter(ps))) if ps else None

    def P(rel):
        return os.path.join(out, rel)

    for i, r in enumerate(recs):
        t = r.type
        if t == R_OPEN and i in created_inc:
            if i >= j:
                stats["names_dropped"] += 1
                continue
            rel = log.paths(r)[0]
            unbind(rel)
            with open(P(rel), "wb"):
                pass
            inc = created_inc[i]
            path_inc[rel] = inc
            inc_paths.setdefault(inc, set()).add(rel)
            stats["names"] += 1
            continue
        if t in NAMES:
            if i >= j:
                stats["names_dropped"] += 1
                continue
            ps = log.paths(r)
            stats["names"] += 1
            if t == R_RENAME:
                if r.a:
                    raise Failure(f"log record {i}: renameat2 flags {r.a} are not replayed")
                src, dst = ps
                inc = path_inc.get(src)
                if os.path.isdir(P(src)):
                    os.rename(P(src), P(dst))
                    _rename_prefix(path_inc, inc_paths, src, dst)
                    continue
                unbind(dst)
                os.rename(P(src), P(dst))
                unbind(src)
                if inc is not None:
                    path_inc[dst] = inc
                    inc_paths[inc].add(dst)
            elif t == R_UNLINK:
                os.unlink(P(ps[0]))
                unbind(ps[0])
            elif t == R_RMDIR:
                os.rmdir(P(ps[0]))
            elif t == R_MKDIR:
                os.mkdir(P(ps[0]))
            elif t == R_LINK:
                os.link(P(ps[0]), P(ps[1]))
                inc = path_inc.get(ps[0])
                if inc is not None:
                    path_inc[ps[1]] = inc
                    inc_paths[inc].add(ps[1])
            continue
        if i not in data_inc:
            continue
        inc = data_inc[i]
        keep = i < max(covered.get(inc, -1), cover_all)
        part = None
        if not keep:
            if mode == "drop":
                stats["dropped"] += 1
                continue
            x = rng.random()
            if x < 1 / 3:
                stats["dropped"] += 1
                continue
            if x < 2 / 3 and t == R_WRITE and r.b > 4096:
                part = rng
                stats["torn"] += 1
        stats["kept"] += 1
        dst = target(inc)
        if dst is None:
            continue  # the file's name did not survive: its data is unreachable
        fd = os.open(dst, os.O_WRONLY)
        try:
            if t == R_OPEN:
                os.ftruncate(fd, 0)
            elif t == R_TRUNC:
                os.ftruncate(fd, r.a)
            elif t == R_ZERO:
                size = os.fstat(fd).st_size
                end = min(r.a + r.b, size)
                if end > r.a:
                    os.pwrite(fd, bytes(end - r.a), r.a)
            elif part is None:
                os.pwrite(fd, log.payload(r), r.a)
            else:
                data = log.payload(r)
                # the pages of the write that reached the disk: a random subset
                first = r.a - r.a % 4096
                for pg in range(first, r.a + r.b, 4096):
                    if part.random() < 0.5:
                        lo, hi = max(pg, r.a), min(pg + 4096, r.a + r.b)
                        os.pwrite(fd, data[lo - r.a:hi - r.a], lo)
        finally:
            os.close(fd)
    return stats


def _rename_prefix(path_inc, inc_paths, src, dst):
    """A directory src renamed to dst: every path below it moves too."""
    pre = src + "/"
    for p in [p for p in path_inc if p.startswith(pre)]:
        inc = path_inc.pop(p)
        q = dst + "/" + p[len(pre):]
        path_inc[q] = inc
        inc_paths[inc].discard(p)
        inc_paths[inc].add(q)


TYPE_NAMES = {R_OPEN: "open", R_WRITE: "write", R_TRUNC: "trunc", R_SYNC_BEGIN: "sync_begin",
              R_SYNC_END: "sync_end", R_RENAME: "rename", R_UNLINK: "unlink", R_RMDIR: "rmdir",
              R_MKDIR: "mkdir", R_LINK: "link", R_CLIENT: "client", R_KILL: "kill",
              R_HELLO: "hello", R_ZERO: "zero"}


def dump(path, out):
    """Prints a log, one record a line (tools/torture/powerlog.py LOG)."""
    lg = Log(path)
    for i, r in enumerate(lg.recs):
        extra = ""
        if r.type in NAMES or r.type in (R_OPEN, R_SYNC_BEGIN, R_CLIENT):
            extra = " " + " -> ".join(bytes(lg.payload(r)).decode(errors="replace").split("\0"))
        out.write(f"{i} {TYPE_NAMES.get(r.type, r.type)} tid={r.tid} ino={r.ino} a={r.a} "
                  f"b={r.b} len={r.len}{extra}\n")
    if lg.torn_tail:
        out.write("(the last record is cut short)\n")


if __name__ == "__main__":
    import sys
    if len(sys.argv) != 2:
        sys.exit("usage: powerlog.py LOG  (prints the records of a torture power-loss log)")
    dump(sys.argv[1], sys.stdout)
