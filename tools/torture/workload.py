"""The crash workload and its checker: what a file may hold after a crash.

Worker threads, one directory each, create, rewrite, overwrite, append, truncate, rename, link
and unlink files, fsync some of them and fsync their directory now and then, until the daemon
dies.  Every step that can change what survives a crash (an open that creates or truncates, a
close, an fsync, a truncate, a rename, a link, an unlink, a directory fsync) is recorded as two
events, S before the call and E after it returned, in one global order (Events); for power-loss
rounds the same events are also appended to the shim's log, so that they are ordered with the
daemon's own I/O.

check() then computes, from the events that happened before the crash, the states each path
may be in, under one of two models (docs/design.md section 3, "Crash"):

kill   (kill -9 of the daemon) every namespace change that returned survives; a file's content
       survives once an fsync of it returned, or once a rename or a directory fsync that started
       after the close that published it returned (both index every closed file first).
power  (power loss: what was not synced is gone) a namespace change, or content indexed by a
       rename, survives once an fsync of any file or directory started after it and returned
       (the fsync syncs the index's write-ahead log, and with it every earlier change); content
       survives once an fsync of the file, or a directory fsync that started after its close,
       returned.

A path may then be bound to any inode from its last surviving binding on (or absent), and an
inode may hold any version from its last surviving version on.  Anything else is lost (an
older state, or absent) or wrong (bytes that no version ever had).
"""
import errno
import os
import struct
import threading

from tlib import DEAD_ERRNOS, Failure, sha

EMPTY = sha(b"")
ABSENT = "absent"
REC_CLIENT = 11
REC_MAGIC = 0x4C545254


class Events:
    """The ordered S/E events of the client's steps, mirrored into a shim log if given."""

    def __init__(self, logpath=None):
        self.lock = threading.Lock()
        self.list = []  # (kind "S"/"E", op id, ok)
        self.ops = {}   # op id -> step description (a tuple, see Worker)
        self.next_id = 0
        self.fd = os.open(logpath, os.O_WRONLY | os.O_APPEND) if logpath else None

    def new_op(self, desc):
        with self.lock:
            self.next_id += 1
            self.ops[self.next_id] = desc
            return self.next_id

    def emit(self, kind, op_id, ok=True):
        with self.lock:
            self.list.append((kind, op_id, ok))
            if self.fd is not None:
                payload = f"{kind} {op_id} {int(ok)}".encode()
                hdr = struct.pack("<IHHIIQQQ", REC_MAGIC, REC_CLIENT, 0, 40 + len(payload), 0, 0,
                                  len(self.list), 0)
                os.write(self.fd, hdr + payload)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class DaemonGone(Exception):
    pass


class Worker(threading.Thread):
    """One client thread of the crash workload, in its own directory rel (under mnt)."""

    NAMES = 8

    def __init__(self, wl, idx, rel, rng):
        super().__init__(name=f"worker{idx}", daemon=True)
        self.wl = wl
        self.rel = rel
        self.dir = os.path.join(wl.mnt, rel)
        self.rng = rng
        self.bound = {}     # name -> inode token (the client's view of its directory)
        self.content = {}   # inode token -> bytearray
        self.ops = 0
        self.verified = 0
        self.error = None
        self.ntmp = 0
        self.hist = []      # the last steps, for messages

    # ------------------------------------------------------------ steps

    def step(self, desc, fn):
        self.hist.append(" ".join(str(x) for x in desc[:4] if not isinstance(x, bytes)))
        del self.hist[:-20]
        ev = self.wl.events
        op = ev.new_op(desc)
        ev.emit("S", op)
        try:
            r = fn()
        except OSError as e:
            ev.emit("E", op, False)
            self.wl.on_error(e, desc)
            raise DaemonGone() from e
        ev.emit("E", op, True)
        return r

    def path(self, name):
        return os.path.join(self.dir, name)

    def relp(self, name):
        return os.path.join(self.rel, name)

    def data(self, n):
        return self.rng.randbytes(n)

    def size(self):
        r = self.rng.random()
        if r < 0.1:
            return self.rng.choice([0, 1, 100, 4095, 4096, 4097])
        if r < 0.7:
            return self.rng.randrange(1, 256 << 10)
        if r < 0.97:
            return self.rng.randrange(256 << 10, 3 << 20)
        return self.rng.randrange(3 << 20, 8 << 20)

    def write_all(self, fd, data, off=None):
        view = memoryview(data)
        pos = off
        while view:
            piece = view[:self.rng.choice([4096, 65536, 1 << 20, len(view)])]
            n = os.pwrite(fd, piece, pos) if pos is not None else os.write(fd, piece)
            view = view[n:]
            if pos is not None:
                pos += n

    def h(self, ino):
        return sha(bytes(self.content[ino]))

    # ------------------------------------------------------------ operations

    def op_write(self, name, sync, trunc=True):
        """Create or rewrite name (O_TRUNC), maybe fsync, close."""
        p = self.path(name)
        created = name not in self.bound
        ino = self.wl.new_inode() if created else self.bound[name]
        fd = self.step(("open", self.relp(name), ino, created, True),
                       lambda: os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        self.bound[name] = ino
        self.content[ino] = bytearray()
        try:
            data = self.data(self.size())
            self.write_all(fd, data)
            self.content[ino] += data
            if sync:
                self.step(("fsync", ino, self.h(ino)), lambda: os.fsync(fd))
        finally:
            self.step(("close", ino, self.h(ino)), lambda: os.close(fd))

    def op_overwrite(self, name, sync):
        """pwrite ranges of an existing file (maybe past its end), maybe fsync between."""
        ino = self.bound[name]
        fd = self.step(("open", self.relp(name), ino, False, False),
                       lambda: os.open(self.path(name), os.O_RDWR))
        try:
            c = self.content[ino]
            for k in range(self.rng.randint(1, 3)):
                off = self.rng.randrange(0, len(c) + 65536)
                data = self.data(self.rng.choice([1, 4096, self.rng.randrange(1, 1 << 20)]))
                self.write_all(fd, data, off)
                if off > len(c):
                    c.extend(bytes(off - len(c)))
                c[off:off + len(data)] = data
                if sync and k == 0:
                    self.step(("fsync", ino, self.h(ino)), lambda: os.fsync(fd))
        finally:
            self.step(("close", ino, self.h(ino)), lambda: os.close(fd))

    def op_append(self, name, sync):
        ino = self.bound[name]
        fd = self.step(("open", self.relp(name), ino, False, False),
                       lambda: os.open(self.path(name), os.O_WRONLY | os.O_APPEND))
        try:
            data = self.data(self.rng.randrange(1, 1 << 20))
            self.write_all(fd, data)
            self.content[ino] += data
            if sync:
                self.step(("fsync", ino, self.h(ino)), lambda: os.fsync(fd))
        finally:
            self.step(("close", ino, self.h(ino)), lambda: os.close(fd))

    def op_truncate(self, name):
        ino = self.bound[name]
        c = self.content[ino]
        n = self.rng.choice([0, len(c) // 2, len(c) + 5000, self.rng.randrange(0, 1 << 20)])
        if n <= len(c):
            del c[n:]
        else:
            c.extend(bytes(n - len(c)))
        self.step(("truncate", ino, self.h(ino)), lambda: os.truncate(self.path(name), n))

    def op_rename(self, src, dst):
        ino = self.bound[src]
        if src == dst or self.bound.get(dst) == ino:
            return  # rename(2) between two links of one inode does nothing
        self.step(("rename", self.relp(src), self.relp(dst), ino),
                  lambda: os.rename(self.path(src), self.path(dst)))
        del self.bound[src]
        self.bound[dst] = ino

    def op_link(self, src, dst):
        ino = self.bound[src]
        self.step(("link", self.relp(src), self.relp(dst), ino),
                  lambda: os.link(self.path(src), self.path(dst)))
        self.bound[dst] = ino

    def op_unlink(self, name):
        self.step(("unlink", self.relp(name)), lambda: os.unlink(self.path(name)))
        del self.bound[name]

    def op_dirfsync(self):
        self.step(("dirfsync", self.rel), lambda: _fsync_dir(self.dir))

    def op_verify(self, name):
        """Reads a file back and compares it with what this thread wrote (no crash yet)."""
        ino = self.bound[name]
        try:
            with open(self.path(name), "rb") as f:
                got = f.read()
        except OSError as e:
            self.wl.on_error(e, ("read", self.relp(name)))
            raise DaemonGone() from e
        if got != bytes(self.content[ino]):
            if self.wl.daemon_dead():
                raise DaemonGone()
            try:
                st = os.stat(self.path(name))
                with open(self.path(name), "rb") as f:
                    again = f.read()
                later = (f"; stat size {st.st_size}, ino {st.st_ino}, nlink {st.st_nlink}; "
                         f"read again: {len(again)} bytes, "
                         f"{'right' if again == bytes(self.content[ino]) else 'wrong'}")
            except OSError as e:
                later = f"; stat/read again: {e}"
            self.wl.live_wrong(f"{self.relp(name)}: read back {len(got)} bytes that differ "
                               f"from the {len(self.content[ino])} written{later}; the "
                               f"thread's last steps: " + " | ".join(self.hist))
        self.verified += 1

    def one(self):
        r = self.rng.random()
        names = [f"f{i}" for i in range(self.NAMES)]
        bound = sorted(self.bound)
        free = [n for n in names if n not in self.bound]
        sync = self.rng.random() < 0.5
        if r < 0.25 or not bound:
            self.op_write(self.rng.choice(names), sync)
        elif r < 0.35:
            self.op_overwrite(self.rng.choice(bound), sync)
        elif r < 0.42:
            self.op_append(self.rng.choice(bound), sync)
        elif r < 0.47:
            self.op_truncate(self.rng.choice(bound))
        elif r < 0.57:
            self.op_rename(self.rng.choice(bound), self.rng.choice(names))
            if self.rng.random() < 0.5:
                self.op_dirfsync()
        elif r < 0.65:
            # write a temporary name, fsync it, rename it over a name, fsync the directory
            self.ntmp += 1
            tmp = f"tmp{self.ntmp}"
            self.op_write(tmp, True)
            self.op_rename(tmp, self.rng.choice(names))
            self.op_dirfsync()
        elif r < 0.72 and free:
            self.op_link(self.rng.choice(bound), self.rng.choice(free))
        elif r < 0.80:
            self.op_unlink(self.rng.choice(bound))
            if self.rng.random() < 0.3:
                self.op_dirfsync()
        elif r < 0.85:
            self.op_dirfsync()
        else:
            self.op_verify(self.rng.choice(bound))
        self.ops += 1

    def run(self):
        try:
            while not self.wl.stop.is_set():
                self.one()
        except DaemonGone:
            pass
        except Exception as e:  # a bug of the suite itself: report it, do not hide it
            self.error = e
            self.wl.stop.set()


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Workload:
    """The crash workload over nthreads directories rel/w<i> of the mount."""

    def __init__(self, mnt, rel, nthreads, rng, events, daemon):
        self.mnt = mnt
        self.rel = rel
        self.events = events
        self.daemon = daemon
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.inodes = 0
        self.killed = threading.Event()  # set by the driver once it killed the daemon
        self.errors = []     # unexpected errors while the daemon was alive
        self.wrong_live = []
        os.makedirs(os.path.join(mnt, rel))
        self.workers = []
        for i in range(nthreads):
            os.mkdir(os.path.join(mnt, rel, f"w{i}"))
            self.workers.append(Worker(self, i, os.path.join(rel, f"w{i}"),
                                       rng.__class__(rng.getrandbits(64))))
        _fsync_dir(os.path.join(mnt, rel))
        _fsync_dir(mnt)

    def new_inode(self):
        with self.lock:
            self.inodes += 1
            return self.inodes

    def daemon_dead(self, wait=2.0):
        """True when the daemon is dead or dies within wait seconds."""
        import time
        t0 = time.monotonic()
        while True:
            if self.killed.is_set() or not self.daemon.alive():
                return True
            if time.monotonic() - t0 > wait:
                return False
            time.sleep(0.05)

    def on_error(self, e, desc):
        if e.errno in DEAD_ERRNOS or self.daemon_dead():
            self.stop.set()
            return
        with self.lock:
            self.errors.append(f"{desc[0]} {desc[1] if len(desc) > 1 else ''}: "
                               f"{errno.errorcode.get(e.errno, e.errno)} ({e})")
        self.stop.set()

    def live_wrong(self, msg):
        with self.lock:
            self.wrong_live.append(msg)

    def start(self):
        for w in self.workers:
            w.start()

    def join(self):
        self.stop.set()
        for w in self.workers:
            w.join(timeout=120)
            if w.is_alive():
                raise Failure(f"{w.name} still running 120 s after the daemon died")
            if w.error:
                raise w.error

    @property
    def ops(self):
        return sum(w.ops for w in self.workers)

    @property
    def live_verified(self):
        return sum(w.verified for w in self.workers)


# ---------------------------------------------------------------- the checker


class _Model:
    def __init__(self):
        self.bind = {}     # path -> [[inode or None, durable]]
        self.vers = {}     # inode -> [[hash, durable]]
        self.closed = []   # (inode, version index) published by a close that returned
        self.pending = []  # power: entries indexed, waiting for a WAL sync

    def bind_to(self, path, ino):
        e = [ino, False]
        self.bind.setdefault(path, [[None, True]]).append(e)
        return e

    def version(self, ino, h):
        e = [h, False]
        self.vers.setdefault(ino, []).append(e)
        return e


def allowed(model, path):
    """(allowed states, older states) of path: sets of content hashes and ABSENT."""
    bl = model.bind.get(path, [[None, True]])
    start = max(i for i, e in enumerate(bl) if e[1])
    ok, old = set(), set()
    for i, (ino, _) in enumerate(bl):
        states = set()
        if ino is None:
            states.add(ABSENT)
        else:
            vl = model.vers.get(ino, [])
            d = [k for k, v in enumerate(vl) if v[1]]
            vs = d[-1] if d else 0
            for k, v in enumerate(vl):
                (ok if i >= start and k >= vs else old).add(v[0])
        (ok if i >= start else old).update(states)
    return ok, old - ok


def check(events, model_kind, upto=None):
    """Replays the events that happened before the crash (the first upto of them; all when
    None); returns the model for allowed()."""
    m = _Model()
    entries = {}   # op id -> entries to mark when the op returns
    xcap = {}      # op id -> closed versions captured at its start (rename, dirfsync)
    wcap = {}      # op id -> pending entries captured at its start (power: a WAL sync)
    power = model_kind == "power"
    for kind, op, ok in (events.list if upto is None else events.list[:upto]):
        d = events.ops[op]
        what = d[0]
        if kind == "S":
            es = []
            if what == "open":
                _, path, ino, created, trunc = d
                if created:
                    es.append(m.bind_to(path, ino))
                if created or trunc:
                    es.append(m.version(ino, EMPTY))
            elif what in ("close", "fsync", "truncate"):
                es.append(m.version(d[1], d[2]))
            elif what == "rename":
                _, src, dst, ino = d
                es.append(m.bind_to(src, None))
                es.append(m.bind_to(dst, ino))
            elif what == "link":
                es.append(m.bind_to(d[2], d[3]))
            elif what == "unlink":
                es.append(m.bind_to(d[1], None))
            entries[op] = es
            if what in ("rename", "dirfsync"):
                xcap[op] = list(m.closed)
            if power and what in ("fsync", "dirfsync"):
                wcap[op] = list(m.pending)
            continue
        if not ok:
            continue
        es = entries.get(op, [])
        if what in ("open", "rename", "link", "unlink"):
            if what == "open" and not d[3]:
                # a truncating open of an existing file publishes nothing by itself
                continue
            if power:
                m.pending.extend(es)
            else:
                for e in es:
                    e[1] = True
        elif what in ("close", "truncate"):
            m.closed.extend(es)
        elif what == "fsync":
            for e in es:
                e[1] = True
        if what in ("rename", "dirfsync"):
            idx = xcap.pop(op, [])
            if power and what == "rename":
                m.pending.extend(idx)
            else:
                for e in idx:
                    e[1] = True
        if power and what in ("fsync", "dirfsync"):
            for e in wcap.pop(op, []):
                e[1] = True
    return m


def paths_of(events):
    out = set()
    for d in events.ops.values():
        if d[0] == "open":
            out.add(d[1])
        elif d[0] in ("rename", "link"):
            out.add(d[1])
            out.add(d[2])
        elif d[0] == "unlink":
            out.add(d[1])
    return out


def verify_tree(mnt, rel, events, model_kind, upto=None):
    """Compares what the mount holds under rel with the states the events (the first upto)
    allow.  Returns (verified, lost, wrong, messages)."""
    m = check(events, model_kind, upto)
    seen = {}
    root = os.path.join(mnt, rel)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            p = os.path.join(dirpath, name)
            r = os.path.relpath(p, mnt)
            try:
                with open(p, "rb") as f:
                    seen[r] = sha(f.read())
            except OSError as e:
                seen[r] = f"error {errno.errorcode.get(e.errno, e.errno)}"
    verified = lost = wrong = 0
    msgs = []
    for path in sorted(paths_of(events) | set(seen)):
        got = seen.get(path, ABSENT)
        ok, old = allowed(m, path)
        verified += 1
        if got in ok:
            continue
        if got in old or got == ABSENT or got.startswith("error"):
            lost += 1
            what = "lost"
        else:
            wrong += 1
            what = "wrong"
        msgs.append(f"{what}: {path}: holds {got}, allowed {sorted(ok)}")
    return verified, lost, wrong, msgs
