"""Model rounds: a random POSIX workload on several threads, every result compared with an
in-memory model (fsx/fsstress style).

Each round mounts a new store and runs, for a number of operations per thread:

- one private tree per thread (t<i>/): create, open (with O_TRUNC, O_APPEND), close, pwrite at
  random offsets (past the end too: holes), append, pread, truncate (by descriptor and by
  path), fsync/fdatasync, rename (files over files, directories), link, unlink (also of open
  files, which stay usable through their descriptors), mkdir, rmdir (of non-empty ones:
  ENOTEMPTY), symlink/readlink, reopen and read back, mmap reads, mmap writes, stat (type,
  size, nlink) and directory listings, and the errors POSIX prescribes (ENOENT, EEXIST,
  ENOTEMPTY).  The model is exact under the store's visibility rules (docs/design.md section
  4): reads go through writable descriptors, which see the writer's current content, and
  read-only opens and mappings are made only while no descriptor of the file is open for
  writing.
- one shared file whose regions the threads write (each its own) and read (all of them) at the
  same time, through writable descriptors; a reader compares a region with its model when the
  region's sequence counter (odd while its owner writes) did not move during the read;
- "frozen" files (never changed once written and renamed into frozen/) read by every thread.

After the threads, everything is compared with the model once more, then again after an
unmount and a mount, then `ckpt fsck` must pass.  Each thread's operations come from its own
generator (seed, round, thread), so a seed reruns the same operations; with --threads 1 the
run is fully deterministic.  A failure names the seed, round, thread and operation, with the
thread's last operations.
"""
import errno
import mmap
import os
import shutil
import stat
import threading

from tlib import Daemon, Failure, log, rng_for

MAXOFF = 3 << 20


class Node:
    __slots__ = ("kind", "data", "target", "nlink", "ino_id")
    _ids = 0

    def __init__(self, kind, target=None):
        Node._ids += 1
        self.ino_id = Node._ids
        self.kind = kind          # "f", "d", "l"
        self.data = bytearray()
        self.target = target
        self.nlink = 0


class Mismatch(Exception):
    pass


class Shared:
    """The shared file: NREG regions, region i written by thread i % threads."""

    def __init__(self, path, nthreads, region):
        self.path = path
        self.region = region
        self.nreg = max(4, nthreads)
        self.seq = [0] * self.nreg
        self.data = [bytes(region) for _ in range(self.nreg)]
        self.lock = threading.Lock()
        self.reads_checked = 0
        self.reads_raced = 0


class Frozen:
    def __init__(self):
        self.lock = threading.Lock()
        self.files = {}  # relpath -> bytes


class Thread(threading.Thread):
    def __init__(self, suite, idx, rng, nops):
        super().__init__(name=f"model{idx}", daemon=True)
        self.s = suite
        self.idx = idx
        self.rng = rng
        self.nops = nops
        self.root = f"t{idx}"
        self.tree = {self.root: Node("d")}  # relpath -> Node
        self.fds = []        # [fd, node, path_at_open, append]
        self.ops = 0
        self.hist = []
        self.error = None
        self.nfrozen = 0
        self.sfd = None

    # ------------------------------------------------------------ helpers

    def P(self, rel):
        return os.path.join(self.s.mnt, rel)

    def expect(self, cond, msg):
        if not cond:
            raise Mismatch(msg)

    def children(self, d):
        pre = d + "/"
        return sorted(p[len(pre):] for p in self.tree if p.startswith(pre) and
                      "/" not in p[len(pre):])

    def files(self):
        return [p for p, n in self.tree.items() if n.kind == "f"]

    def dirs(self):
        return [p for p, n in self.tree.items() if n.kind == "d"]

    def new_name(self, d=None):
        d = d or self.rng.choice(self.dirs())
        return f"{d}/n{self.rng.randrange(40)}"

    def writable_open(self, node):
        return any(e[1] is node for e in self.fds)

    def call(self, what, fn, errnos=()):
        """Runs fn; an OSError with an errno in errnos is returned, others are mismatches."""
        try:
            return fn()
        except OSError as e:
            if e.errno in errnos:
                return e
            raise Mismatch(f"{what}: unexpected {errno.errorcode.get(e.errno, e.errno)}: {e}")

    def data(self):
        n = self.rng.choice([1, 7, 4095, 4096, 4097, 65536, self.rng.randrange(1, 300 << 10)])
        return self.rng.randbytes(n)

    # ------------------------------------------------------------ operations

    def op_create(self):
        path = self.new_name()
        if path in self.tree:
            r = self.call("create O_EXCL of an existing name", lambda: os.open(
                self.P(path), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), (errno.EEXIST,))
            self.expect(isinstance(r, OSError), f"create O_EXCL {path}: succeeded over an "
                        f"existing {self.tree[path].kind}")
            if not isinstance(r, OSError):
                os.close(r)
            return f"create {path}: EEXIST"
        fd = self.call("create", lambda: os.open(self.P(path), os.O_RDWR | os.O_CREAT | os.O_EXCL,
                                                 0o644))
        n = Node("f")
        n.nlink = 1
        self.tree[path] = n
        self.keep_or_close(fd, n, path, False)
        return f"create {path}"

    def keep_or_close(self, fd, node, path, append):
        if len(self.fds) < 4 and self.rng.random() < 0.6:
            self.fds.append([fd, node, path, append])
        else:
            os.close(fd)

    def op_open(self):
        fs = self.files()
        if not fs:
            return self.op_create()
        path = self.rng.choice(fs)
        node = self.tree[path]
        flags = os.O_RDWR
        r = self.rng.random()
        if r < 0.2:
            flags |= os.O_TRUNC
        elif r < 0.35:
            flags |= os.O_APPEND
        fd = self.call(f"open {path}", lambda: os.open(self.P(path), flags))
        if flags & os.O_TRUNC:
            del node.data[:]
        self.keep_or_close(fd, node, path, bool(flags & os.O_APPEND))
        return f"open {path} flags={flags:o}"

    def op_close(self):
        if not self.fds:
            return self.op_open()
        e = self.fds.pop(self.rng.randrange(len(self.fds)))
        self.call("close", lambda: os.close(e[0]))
        return f"close {e[2]}"

    def pick_fd(self):
        if not self.fds:
            self.op_open()
        if not self.fds:
            return None
        return self.rng.choice(self.fds)

    def op_write(self):
        e = self.pick_fd()
        if e is None:
            return "write: no file"
        fd, node, path, append = e
        buf = self.data()
        if append:
            n = self.call(f"append {path}", lambda: os.write(fd, buf))
            self.expect(n == len(buf), f"append {path}: wrote {n} of {len(buf)}")
            node.data += buf
            return f"append {path} {len(buf)}"
        off = self.rng.choice([0, len(node.data), self.rng.randrange(0, len(node.data) + 1),
                               self.rng.randrange(0, MAXOFF)])
        n = self.call(f"pwrite {path}", lambda: os.pwrite(fd, buf, off))
        self.expect(n == len(buf), f"pwrite {path} at {off}: wrote {n} of {len(buf)}")
        if off > len(node.data):
            node.data += bytes(off - len(node.data))
        node.data[off:off + len(buf)] = buf
        self.check_size(fd, node, f"after pwrite {len(buf)} at {off} to {path}")
        return f"pwrite {path} {len(buf)}@{off}"

    def check_size(self, fd, node, what):
        st = os.fstat(fd)
        self.expect(st.st_size == len(node.data), f"{what}: fstat size {st.st_size}, model "
                    f"{len(node.data)}")

    def op_read(self):
        e = self.pick_fd()
        if e is None:
            return "read: no file"
        fd, node, path, _ = e
        size = len(node.data)
        off = self.rng.randrange(0, size + 8192)
        n = self.rng.choice([1, 4096, 65536, self.rng.randrange(1, 1 << 20)])
        got = self.call(f"pread {path}", lambda: os.pread(fd, n, off))
        want = bytes(node.data[off:off + n])
        self.expect(got == want, f"pread {path} {n}@{off}: {len(got)} bytes, want {len(want)}"
                    f"{'' if len(got) != len(want) else ' (content differs)'}")
        return f"pread {path} {n}@{off}"

    def op_truncate(self):
        n = self.rng.choice([0, self.rng.randrange(0, MAXOFF), self.rng.randrange(0, 8192)])
        self.last_size = None
        if self.fds and self.rng.random() < 0.5:
            fd, node, path, _ = self.rng.choice(self.fds)
            self.call(f"ftruncate {path}", lambda: os.ftruncate(fd, n))
            how = "ftruncate"
        else:
            fs = self.files()
            if not fs:
                return "truncate: no file"
            path = self.rng.choice(fs)
            node = self.tree[path]
            self.last_size = len(node.data)
            self.call(f"truncate {path}", lambda: os.truncate(self.P(path), n))
            how = "truncate"
        if n < len(node.data):
            del node.data[n:]
        else:
            node.data += bytes(n - len(node.data))
        st = os.stat(self.P(path)) if path in self.tree and self.tree[path] is node else None
        if st is not None and st.st_size != n:
            import time
            time.sleep(1.5)
            later = os.stat(self.P(path)).st_size
            self.expect(False, f"{how} {path} to {n}: stat size {st.st_size} (1.5 s later: "
                        f"{later}); descriptors of the file open in this thread: "
                        f"{sum(1 for e in self.fds if e[1] is node)}, nlink {node.nlink}, "
                        f"size before {self.last_size}")
        return f"{how} {path} {n}"

    def op_sync(self):
        e = self.pick_fd()
        if e is None:
            return "fsync: no file"
        fn = os.fsync if self.rng.random() < 0.5 else os.fdatasync
        self.call(f"{fn.__name__} {e[2]}", lambda: fn(e[0]))
        return f"{fn.__name__} {e[2]}"

    def op_rename(self):
        cands = [p for p in self.tree if p != self.root]
        if not cands:
            return "rename: nothing"
        src = self.rng.choice(cands)
        node = self.tree[src]
        if node.kind == "d":
            dst = self.new_name(self.rng.choice([d for d in self.dirs()
                                                 if d != src and not d.startswith(src + "/")]))
            if dst == src:
                self.call(f"rename dir {src} onto itself", lambda: os.rename(self.P(src),
                                                                              self.P(dst)))
                return f"rename dir {src} onto itself"
            if dst in self.tree:
                r = self.call(f"rename dir {src} over {dst}", lambda: os.rename(
                    self.P(src), self.P(dst)), (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR,
                                                errno.EISDIR))
                exists = self.tree[dst]
                ok = exists.kind == "d" and not self.children(dst)
                if ok:
                    self.expect(not isinstance(r, OSError), f"rename dir {src} over empty dir "
                                f"{dst}: {r}")
                    del self.tree[dst]
                    self.move(src, dst)
                else:
                    self.expect(isinstance(r, OSError), f"rename dir {src} over {dst} "
                                f"({exists.kind}) succeeded")
                return f"rename dir {src} {dst}"
            self.call(f"rename dir {src} {dst}", lambda: os.rename(self.P(src), self.P(dst)))
            self.move(src, dst)
            return f"rename dir {src} {dst}"
        dst = self.new_name()
        old = self.tree.get(dst)
        if old is not None and old.kind == "d":
            # EISDIR; ENOTEMPTY when the directory is an ancestor of src (Linux's rename
            # checks that first)
            r = self.call(f"rename {src} over dir {dst}", lambda: os.rename(
                self.P(src), self.P(dst)), (errno.EISDIR, errno.ENOTEMPTY))
            self.expect(isinstance(r, OSError), f"rename file {src} over dir {dst} succeeded")
            return f"rename {src} over dir {dst}: EISDIR"
        self.call(f"rename {src} {dst}", lambda: os.rename(self.P(src), self.P(dst)))
        if old is node or src == dst:
            return f"rename {src} {dst} (same inode: nothing)"
        if old is not None:
            old.nlink -= 1
        del self.tree[src]
        self.tree[dst] = node
        return f"rename {src} {dst}"

    def move(self, src, dst):
        pre = src + "/"
        for p in sorted(self.tree):
            if p == src or p.startswith(pre):
                self.tree[dst + p[len(src):]] = self.tree.pop(p)

    def op_link(self):
        fs = self.files()
        if not fs:
            return "link: no file"
        src = self.rng.choice(fs)
        dst = self.new_name()
        if dst in self.tree:
            r = self.call(f"link {src} {dst}", lambda: os.link(self.P(src), self.P(dst)),
                          (errno.EEXIST,))
            self.expect(isinstance(r, OSError), f"link over existing {dst} succeeded")
            return f"link {src} {dst}: EEXIST"
        self.call(f"link {src} {dst}", lambda: os.link(self.P(src), self.P(dst)))
        self.tree[dst] = self.tree[src]
        self.tree[dst].nlink += 1
        return f"link {src} {dst}"

    def op_unlink(self):
        cands = [p for p, n in self.tree.items() if n.kind != "d"]
        if not cands:
            return "unlink: nothing"
        p = self.rng.choice(cands)
        self.call(f"unlink {p}", lambda: os.unlink(self.P(p)))
        self.tree.pop(p).nlink -= 1
        return f"unlink {p}"

    def op_mkdir(self):
        p = self.new_name()
        if p in self.tree:
            r = self.call(f"mkdir {p}", lambda: os.mkdir(self.P(p)), (errno.EEXIST,))
            self.expect(isinstance(r, OSError), f"mkdir over existing {p} succeeded")
            return f"mkdir {p}: EEXIST"
        self.call(f"mkdir {p}", lambda: os.mkdir(self.P(p)))
        self.tree[p] = Node("d")
        return f"mkdir {p}"

    def op_rmdir(self):
        ds = [d for d in self.dirs() if d != self.root]
        if not ds:
            return self.op_mkdir()
        d = self.rng.choice(ds)
        if self.children(d):
            r = self.call(f"rmdir {d}", lambda: os.rmdir(self.P(d)), (errno.ENOTEMPTY,))
            self.expect(isinstance(r, OSError), f"rmdir of non-empty {d} succeeded")
            return f"rmdir {d}: ENOTEMPTY"
        self.call(f"rmdir {d}", lambda: os.rmdir(self.P(d)))
        del self.tree[d]
        return f"rmdir {d}"

    def op_symlink(self):
        p = self.new_name()
        if p in self.tree:
            return self.op_readlink()
        target = self.rng.choice(["../x", "/abs/path", "n3", "a" * self.rng.randrange(1, 300)])
        self.call(f"symlink {p}", lambda: os.symlink(target, self.P(p)))
        n = Node("l", target)
        n.nlink = 1
        self.tree[p] = n
        return f"symlink {p} -> {target[:20]}"

    def op_readlink(self):
        ls = [p for p, n in self.tree.items() if n.kind == "l"]
        if not ls:
            return self.op_symlink()
        p = self.rng.choice(ls)
        got = self.call(f"readlink {p}", lambda: os.readlink(self.P(p)))
        self.expect(got == self.tree[p].target, f"readlink {p}: {got!r}")
        return f"readlink {p}"

    def op_enoent(self):
        p = f"{self.root}/missing{self.rng.randrange(1000)}"
        r = self.call(f"open {p}", lambda: os.open(self.P(p), os.O_RDONLY), (errno.ENOENT,))
        self.expect(isinstance(r, OSError), f"open of missing {p} succeeded")
        return f"open missing {p}: ENOENT"

    def closed_file(self):
        fs = [p for p in self.files() if not self.writable_open(self.tree[p])]
        return self.rng.choice(fs) if fs else None

    def op_reopen_read(self):
        """Read-only open of a file with no writable descriptor: the whole content."""
        p = self.closed_file()
        if p is None:
            return "reopen: no closed file"
        with open(self.P(p), "rb") as f:
            got = f.read()
        want = bytes(self.tree[p].data)
        self.expect(got == want, f"read-only reopen of {p}: {len(got)} bytes, want {len(want)}"
                    f"{' (content differs)' if len(got) == len(want) else ''}")
        return f"reopen+read {p} ({len(got)} bytes)"

    def op_mmap_read(self):
        p = self.closed_file()
        if p is None or not self.tree[p].data:
            return "mmap read: no file"
        want = bytes(self.tree[p].data)
        fd = os.open(self.P(p), os.O_RDONLY)
        try:
            m = mmap.mmap(fd, len(want), mmap.MAP_SHARED, mmap.PROT_READ)
            try:
                off = self.rng.randrange(len(want))
                n = self.rng.randrange(1, 1 << 20)
                got = m[off:off + n]
            finally:
                m.close()
        finally:
            os.close(fd)
        self.expect(got == want[off:off + n], f"mmap read of {p} {n}@{off} differs")
        return f"mmap read {p} {n}@{off}"

    def op_mmap_write(self):
        """A shared writable mapping (a documented ENODEV where the kernel refuses it for a
        direct_io descriptor), else MAP_PRIVATE, which must not change the file."""
        p = self.closed_file()
        if p is None or not self.tree[p].data:
            return "mmap write: no file"
        node = self.tree[p]
        size = len(node.data)
        off = self.rng.randrange(size)
        buf = self.rng.randbytes(min(size - off, self.rng.randrange(1, 200 << 10)))
        fd = os.open(self.P(p), os.O_RDWR)
        how = "shared"
        try:
            try:
                m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            except OSError as e:
                self.expect(e.errno == errno.ENODEV, f"mmap shared of {p}: {e}")
                m = mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
                how = "private"
            try:
                m[off:off + len(buf)] = buf
                if how == "shared":
                    m.flush()
            finally:
                m.close()
        finally:
            os.close(fd)
        if how == "shared":
            node.data[off:off + len(buf)] = buf
        return f"mmap {how} write {p} {len(buf)}@{off}"

    def op_stat(self):
        cands = list(self.tree)
        p = self.rng.choice(cands)
        node = self.tree[p]
        st = self.call(f"lstat {p}", lambda: os.lstat(self.P(p)))
        kind = "d" if stat.S_ISDIR(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else \
            "f" if stat.S_ISREG(st.st_mode) else "?"
        self.expect(kind == node.kind, f"lstat {p}: type {kind}, model {node.kind}")
        if kind == "f":
            self.expect(st.st_size == len(node.data), f"lstat {p}: size {st.st_size}, model "
                        f"{len(node.data)}")
            self.expect(st.st_nlink == node.nlink, f"lstat {p}: nlink {st.st_nlink}, model "
                        f"{node.nlink}")
        if kind == "d":
            got = sorted(os.listdir(self.P(p)))
            self.expect(got == self.children(p), f"listdir {p}: {got}, model "
                        f"{self.children(p)}")
        return f"stat {p}"

    def op_freeze(self):
        """Writes a file that never changes again and lets every thread read it."""
        self.nfrozen += 1
        rel = f"frozen/t{self.idx}_{self.nfrozen}"
        data = self.rng.randbytes(self.rng.randrange(1, 2 << 20))
        tmp = self.P(f"{self.root}/.freeze")
        with open(tmp, "wb") as f:
            f.write(data)
        os.rename(tmp, self.P(rel))
        with self.s.frozen.lock:
            self.s.frozen.files[rel] = data
        return f"freeze {rel}"

    def op_read_frozen(self):
        with self.s.frozen.lock:
            if not self.s.frozen.files:
                return "read frozen: none"
            rel = self.rng.choice(sorted(self.s.frozen.files))
            want = self.s.frozen.files[rel]
        with open(self.P(rel), "rb") as f:
            got = f.read()
        self.expect(got == want, f"frozen {rel}: {len(got)} bytes, want {len(want)}")
        return f"read frozen {rel}"

    def op_shared_write(self):
        sh = self.s.shared
        regs = [i for i in range(sh.nreg) if i % self.s.nthreads == self.idx]
        if not regs:
            return "shared write: no region"
        i = self.rng.choice(regs)
        data = self.rng.randbytes(sh.region)
        with sh.lock:
            sh.seq[i] += 1
        n = os.pwrite(self.sfd, data, i * sh.region)
        self.expect(n == len(data), f"shared pwrite region {i}: {n}")
        with sh.lock:
            sh.data[i] = data
            sh.seq[i] += 1
        return f"shared write region {i}"

    def op_shared_read(self):
        sh = self.s.shared
        i = self.rng.randrange(sh.nreg)
        with sh.lock:
            s1, want = sh.seq[i], sh.data[i]
        got = os.pread(self.sfd, sh.region, i * sh.region)
        with sh.lock:
            s2 = sh.seq[i]
        if s1 % 2 == 0 and s1 == s2:
            self.expect(got == want, f"shared region {i}: a read while nobody wrote it "
                        f"differs (seq {s1})")
            with sh.lock:
                sh.reads_checked += 1
        else:
            with sh.lock:
                sh.reads_raced += 1
        return f"shared read region {i}"

    OPS = [("create", 8), ("open", 8), ("close", 8), ("write", 22), ("read", 12),
           ("truncate", 5), ("sync", 3), ("rename", 6), ("link", 3), ("unlink", 4),
           ("mkdir", 3), ("rmdir", 2), ("symlink", 1), ("readlink", 1), ("enoent", 1),
           ("reopen_read", 5), ("mmap_read", 3), ("mmap_write", 2), ("stat", 6),
           ("freeze", 1), ("read_frozen", 3), ("shared_write", 6), ("shared_read", 8)]

    # ------------------------------------------------------------ checks

    def check_tree(self, what):
        """Every entry of the thread's tree against the model (types, sizes, content)."""
        seen = set()
        for dirpath, dirnames, filenames in os.walk(self.P(self.root)):
            for n in dirnames + filenames:
                rel = os.path.relpath(os.path.join(dirpath, n), self.s.mnt)
                seen.add(rel)
        want = set(p for p in self.tree if p != self.root)
        self.expect(seen == want, f"{what}: entries differ: extra {sorted(seen - want)[:5]}, "
                    f"missing {sorted(want - seen)[:5]}")
        for p, node in self.tree.items():
            if node.kind == "f":
                if self.writable_open(node):
                    continue
                with open(self.P(p), "rb") as f:
                    got = f.read()
                self.expect(got == bytes(node.data), f"{what}: {p}: {len(got)} bytes, model "
                            f"{len(node.data)}{' (content differs)' if len(got) == len(node.data) else ''}")
                self.s.count(verified=1)
            elif node.kind == "l":
                self.expect(os.readlink(self.P(p)) == node.target, f"{what}: {p}: link target")
        # descriptors of files that are open (maybe unlinked): read through them
        for fd, node, path, _ in self.fds:
            got = os.pread(fd, len(node.data) + 1, 0)
            self.expect(got == bytes(node.data), f"{what}: open descriptor of {path}: "
                        f"{len(got)} bytes, model {len(node.data)}")
            self.s.count(verified=1)

    def run(self):
        names = [o for o, w in self.OPS for _ in range(w)]
        try:
            os.mkdir(self.P(self.root))
            self.sfd = os.open(self.P("shared.bin"), os.O_RDWR)
            for k in range(self.nops):
                if self.s.stop.is_set():
                    break
                op = self.rng.choice(names)
                desc = getattr(self, "op_" + op)()
                self.hist.append(f"#{k} {desc}")
                del self.hist[:-25]
                self.ops += 1
                if k % 100 == 99:
                    self.check_tree(f"after op {k}")
            self.check_tree("at the end of the thread")
        except Mismatch as e:
            self.error = f"thread {self.idx} op {self.ops}: {e}"
        except OSError as e:
            self.error = f"thread {self.idx} op {self.ops}: unexpected {e}"
        finally:
            for e in self.fds:
                try:
                    os.close(e[0])
                except OSError:
                    pass
            self.fds = []
            if self.sfd is not None:
                os.close(self.sfd)
        if self.error:
            self.s.stop.set()


class ModelSuite:
    kind = "model"

    def __init__(self, env, stats, tmp, threads=4, short=False):
        self.env = env
        self.stats = stats
        self.dir = os.path.join(tmp, "model")
        os.makedirs(self.dir, exist_ok=True)
        self.mnt = os.path.join(self.dir, "mnt")
        self.nthreads = threads
        self.nops = 300 if short else 1500
        self.daemon = None
        self.lock = threading.Lock()
        self.verified = 0

    def count(self, verified=0):
        with self.lock:
            self.verified += verified

    def round(self, rng, budget_s):
        store = os.path.join(self.dir, "store")
        shutil.rmtree(store, ignore_errors=True)
        opts = []
        if rng.random() < 0.3:
            opts.append("inline_compress")
        if rng.random() < 0.2:
            opts.append("direct_read=all")
        self.daemon = Daemon(self.env, store, self.mnt, opts,
                             logfile=os.path.join(self.dir, "daemon.log"))
        self.daemon.start()
        self.verified = 0
        self.stop = threading.Event()
        self.frozen = Frozen()
        self.shared = Shared(os.path.join(self.mnt, "shared.bin"), self.nthreads, 64 << 10)
        with open(self.shared.path, "wb") as f:
            f.write(bytes(self.shared.region * self.shared.nreg))
        os.mkdir(os.path.join(self.mnt, "frozen"))
        seed_of = rng.getrandbits(64)
        threads = [Thread(self, i, rng_for(seed_of, i), self.nops) for i in range(self.nthreads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        errors = [t for t in threads if t.error]
        ops = sum(t.ops for t in threads)
        for t in errors:
            self.stats.fail(self.kind, t.error + "\n      last operations of the thread:\n"
                            + "\n".join("        " + h for h in t.hist))
        if not errors:
            self.check_all(threads, "after the threads")
            self.daemon.stop()
            self.daemon.start()
            self.check_all(threads, "after unmount and mount")
            self.daemon.stop()
            self.daemon = None
            rc, out = self.env.ckpt_run("fsck", store)
            if rc != 0:
                self.stats.fail(self.kind, f"ckpt fsck exited {rc}:\n{out[-2000:]}")
        else:
            self.abort()
        self.stats.add(self.kind, rounds=1, operations=ops, files_verified=self.verified,
                       wrong=len(errors), shared_reads_checked=self.shared.reads_checked,
                       shared_reads_raced=self.shared.reads_raced)
        if self.env.verbose:
            log(f"  model: {ops} ops, {self.verified} files verified, shared reads checked "
                f"{self.shared.reads_checked} raced {self.shared.reads_raced}")

    def check_all(self, threads, what):
        for t in threads:
            try:
                t.check_tree(what)
            except (Mismatch, OSError) as e:
                self.stats.fail(self.kind, f"thread {t.idx}: {e}")
        with open(self.shared.path, "rb") as f:
            got = f.read()
        want = b"".join(self.shared.data)
        if got != want:
            self.stats.fail(self.kind, f"{what}: shared.bin differs from the model")
        for rel, data in self.frozen.files.items():
            with open(os.path.join(self.mnt, rel), "rb") as f:
                if f.read() != data:
                    self.stats.fail(self.kind, f"{what}: frozen {rel} differs")
        self.count(verified=1 + len(self.frozen.files))

    def finish(self, rng):
        pass

    def abort(self):
        if self.daemon is not None:
            try:
                self.daemon.kill9()
            except Failure:
                pass
            self.daemon = None
