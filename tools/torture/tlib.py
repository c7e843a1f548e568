"""Shared pieces of the torture suite: the environment, the counters, the daemon under test
(started in the foreground, optionally with the LD_PRELOAD shim), mounts, the shim's
control file, thread-stack dumps, and small file helpers.

Python standard library only (the suite runs with Debian's /usr/bin/python3).
"""
import errno
import hashlib
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time

MiB = 1 << 20

# errors that mean "the daemon is gone" on a FUSE mount
DEAD_ERRNOS = (errno.ENOTCONN, errno.ECONNABORTED, errno.ENODEV)


class Failure(Exception):
    """A broken invariant: the round fails, with this message."""


class SetupError(Exception):
    """The suite cannot run here (missing binary, no /dev/fuse, not root for tmpfs)."""


def now():
    return time.monotonic()


def log(msg):
    print(msg, flush=True)


def sha(b):
    return hashlib.sha256(b).hexdigest()[:32]


def file_sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(4 * MiB)
            if not b:
                break
            h.update(b)
    return h.hexdigest()[:32]


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path, data, sync=False, flags=os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
    fd = os.open(path, flags, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- environment


class Env:
    """Paths of the programs under test and of the scratch space, and the options."""

    def __init__(self, top, tmp, keep=False, verbose=False):
        self.top = top
        self.ckptfs = os.environ.get("CKPTFS") or os.path.join(top, "fs", "ckptfs")
        self.ckpt = os.environ.get("CKPT") or os.path.join(top, "tools", "ckpt")
        self.shim = os.environ.get("TORTURE_SHIM") or os.path.join(
            top, "tools", "torture", ".libs", "libtorture.so")
        self.tmp = tmp
        self.keep = keep
        self.verbose = verbose
        for p, what in ((self.ckptfs, "the daemon (fs/ckptfs)"), (self.ckpt, "tools/ckpt")):
            if not os.access(p, os.X_OK):
                raise SetupError(f"{p}: {what} is missing; build with make (or set CKPTFS/CKPT)")
        if not os.path.exists(self.shim):
            raise SetupError(f"{self.shim}: the shim is missing; build it with "
                             f"'make tools/torture/libtorture.la' (or set TORTURE_SHIM)")
        if not os.path.exists("/dev/fuse"):
            raise SetupError("/dev/fuse is missing")
        for tool in ("fusermount3",):
            if not shutil.which(tool):
                raise SetupError(f"{tool} is not installed (Debian package fuse3)")

    def ckpt_run(self, *args, timeout=600, env=None):
        """Runs tools/ckpt; returns (exit status, output)."""
        p = subprocess.run([self.ckpt, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, env=env)
        return p.returncode, p.stdout.decode(errors="replace")


# ---------------------------------------------------------------- counters


class Stats:
    """The suite's counters (printed at the end) and its failures."""

    KEYS = ("rounds", "operations", "files_verified", "lost", "wrong")

    def __init__(self):
        self.lock = threading.Lock()
        self.c = {k: 0 for k in self.KEYS}
        self.by_kind = {}
        self.kills = {}
        self.failures = []
        self.notes = []
        self.full_rounds = 0

    def add(self, kind, **kw):
        with self.lock:
            d = self.by_kind.setdefault(kind, {k: 0 for k in self.KEYS})
            for k, v in kw.items():
                if k in self.c:
                    self.c[k] += v
                d[k] = d.get(k, 0) + v

    def kill_point(self, name, fired):
        with self.lock:
            k = self.kills.setdefault(name, [0, 0])
            k[0] += 1
            k[1] += 1 if fired else 0

    def note(self, msg):
        with self.lock:
            if msg not in self.notes:
                self.notes.append(msg)

    def fail(self, kind, msg):
        with self.lock:
            self.failures.append(f"{kind}: {msg}")
        log(f"FAIL {kind}: {msg}")

    def summary(self):
        lines = ["", f"torture summary ({self.full_rounds} full rounds; rounds below count "
                 f"each kind's rounds):"]
        lines.append("  TOTAL    " + "  ".join(f"{k}={self.c[k]}" for k in self.KEYS))
        for kind in sorted(self.by_kind):
            d = self.by_kind[kind]
            lines.append(f"  {kind:8s} " + "  ".join(f"{k}={d.get(k, 0)}" for k in self.KEYS)
                         + "".join(f"  {k}={v}" for k, v in sorted(d.items())
                                   if k not in self.KEYS))
        if self.kills:
            lines.append("  kill points (tried/fired): " + ", ".join(
                f"{k} {v[0]}/{v[1]}" for k, v in sorted(self.kills.items())))
        for n in self.notes:
            lines.append("  note: " + n)
        if self.failures:
            lines.append(f"  {len(self.failures)} FAILURES:")
            lines.extend("    " + f for f in self.failures[:50])
        return "\n".join(lines)


# ---------------------------------------------------------------- mounts


def mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == path:
                return True
    return False


def unmount(mnt, lazy_ok=True):
    """Unmounts mnt (retrying while busy, then lazily). True when it is gone."""
    for _ in range(50):
        if not mounted(mnt):
            return True
        subprocess.run(["fusermount3", "-u", mnt], stderr=subprocess.DEVNULL)
        if not mounted(mnt):
            return True
        time.sleep(0.1)
    if lazy_ok:
        subprocess.run(["fusermount3", "-uz", mnt], stderr=subprocess.DEVNULL)
        if mounted(mnt):
            subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)
    return not mounted(mnt)


def preload(binary, shim):
    """LD_PRELOAD for running `binary` with the shim: the shim alone, or, for a binary built
    with AddressSanitizer (configure --enable-sanitizers, tools/sanitize.sh), ASan's runtime
    first, which ASan requires of every preloaded library list."""
    import subprocess
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    except OSError:
        out = ""
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0].startswith("libasan.so") and len(parts) >= 3 and parts[1] == "=>":
            return f"{parts[2]}:{shim}"
    return shim


# ---------------------------------------------------------------- the shim's control file

CTL_MAGIC = 0x4C544354
OPS = ("write", "sync", "dirsync", "create", "rename", "unlink", "trunc", "mkdir")
AREAS = ("pack", "wal", "sst", "manifest", "current", "index", "marker", "staging", "other")
CTL_FMT = "<IIII Q" + "Q" * (len(OPS) * len(AREAS))
CTL_SIZE = 4096


class Ctl:
    """The control file shared with libtorture.so (struct ctl in shim.c)."""

    def __init__(self, path):
        self.path = path
        with open(path, "wb") as f:
            f.write(struct.pack("<IIII", CTL_MAGIC, 0, 0, 0).ljust(CTL_SIZE, b"\0"))

    def arm(self):
        fd = os.open(self.path, os.O_RDWR)
        try:
            os.pwrite(fd, struct.pack("<I", 1), 4)
        finally:
            os.close(fd)

    def read(self):
        with open(self.path, "rb") as f:
            v = struct.unpack_from(CTL_FMT, f.read(CTL_SIZE))
        counts = {}
        for i, op in enumerate(OPS):
            for j, area in enumerate(AREAS):
                n = v[5 + i * len(AREAS) + j]
                if n:
                    counts[f"{op}@{area}"] = n
        return {"armed": v[1], "fired": v[2], "hits": v[4], "counts": counts}


# ---------------------------------------------------------------- the daemon


class Daemon:
    """One ckptfs daemon in the foreground (-f), its output in a log file."""

    def __init__(self, env, store, mnt, opts=(), logfile=None, shim=None):
        self.env = env
        self.store = store
        self.mnt = mnt
        self.opts = list(opts)
        self.logfile = logfile or (store.rstrip("/") + ".daemon.log")
        self.shim = shim  # dict of TORTURE_* variables, or None
        self.proc = None

    def start(self, timeout=30):
        os.makedirs(self.mnt, exist_ok=True)
        if mounted(self.mnt):
            raise Failure(f"{self.mnt} is still mounted before a start")
        args = [self.env.ckptfs, self.store, self.mnt, "-f"]
        if self.opts:
            args += ["-o", ",".join(self.opts)]
        e = dict(os.environ)
        if self.shim is not None:
            e["LD_PRELOAD"] = preload(self.env.ckptfs, self.env.shim)
            e["TORTURE_ROOT"] = os.path.realpath(self.store)
            e.update(self.shim)
        out = open(self.logfile, "ab")
        out.write(f"--- {' '.join(args)} {self.shim or ''}\n".encode())
        out.flush()
        self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=e,
                                     stdin=subprocess.DEVNULL)
        out.close()
        t0 = now()
        while now() - t0 < timeout:
            if mounted(self.mnt):
                return
            if self.proc.poll() is not None:
                raise Failure(f"ckptfs {self.store} exited {self.proc.returncode} before "
                              f"mounting:\n{self.log_tail()}")
            time.sleep(0.05)
        self.kill9()
        raise Failure(f"ckptfs {self.store}: not mounted after {timeout} s:\n{self.log_tail()}")

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def healthy(self):
        """Alive and answering on its mount.  A daemon that is aborting (dumping core) may
        still exist while its mount already fails with ENOTCONN: that is not healthy, and
        this waits (10 s at most) for such a process to end."""
        if not self.alive():
            return False
        try:
            os.statvfs(self.mnt)
            return True
        except OSError as e:
            if e.errno not in DEAD_ERRNOS:
                return True
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        return False

    def log_tail(self, n=15):
        try:
            with open(self.logfile, "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
            return "\n".join("    " + x for x in lines[-n:])
        except OSError:
            return "    (no log)"

    def kill9(self):
        """SIGKILL (if still alive), reap, detach the dead mount."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self.proc = None
        if not unmount(self.mnt):
            raise Failure(f"cannot detach {self.mnt} after kill -9")

    def wait_exit(self, timeout):
        """Waits until the daemon exits (a shim kill point); True when it did."""
        try:
            self.proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def stop(self, timeout=60):
        """Unmounts and waits for the daemon to exit; its exit status must be 0."""
        if self.proc is None:
            return
        if not unmount(self.mnt, lazy_ok=False):
            raise Failure(f"cannot unmount {self.mnt} (busy)")
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stacks = thread_stacks(self.proc.pid)
            held = other_namespaces_with(self.mnt)
            self.kill9()
            raise Failure(f"daemon still running {timeout} s after unmount"
                          + (f" (the mount is still in other mount namespaces, which keeps "
                             f"the connection open: {held})" if held else "")
                          + f"; stacks:\n{stacks}")
        self.proc = None
        if rc != 0:
            raise Failure(f"daemon exited {rc} after unmount:\n{self.log_tail()}")


def other_namespaces_with(mnt):
    """Processes of other mount namespaces that still have mnt mounted ("PID COMM", ...)."""
    mine = os.readlink("/proc/self/ns/mnt")
    seen, out = set(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ns = os.readlink(f"/proc/{pid}/ns/mnt")
            if ns == mine or ns in seen:
                continue
            with open(f"/proc/{pid}/mountinfo") as f:
                if any(line.split()[4] == mnt for line in f):
                    seen.add(ns)
                    with open(f"/proc/{pid}/comm") as c:
                        out.append(f"{pid} {c.read().strip()}")
        except OSError:
            continue
    return ", ".join(out)


def thread_stacks(pid, limit=400):
    """Every thread's stack of process pid: gdb's backtraces when gdb is installed, else the
    kernel stacks from /proc/PID/task/*/stack (root only)."""
    out = []
    if shutil.which("gdb"):
        try:
            p = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex", "set pagination off",
                                "-ex", "thread apply all bt"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=60)
            out = [x for x in p.stdout.decode(errors="replace").splitlines()
                   if x.startswith(("#", "Thread"))]
        except (OSError, subprocess.TimeoutExpired) as e:
            out = [f"gdb failed: {e}"]
    if not out:
        try:
            for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
                try:
                    with open(f"/proc/{pid}/task/{tid}/comm") as f:
                        comm = f.read().strip()
                    with open(f"/proc/{pid}/task/{tid}/stack") as f:
                        st = f.read().strip().replace("\n", " | ")
                except OSError as e:
                    st = str(e)
                out.append(f"task {tid} ({comm}): {st}")
        except OSError as e:
            out.append(f"cannot read /proc/{pid}/task: {e}")
    return "\n".join(out[:limit])


def python_stacks():
    frames = sys._current_frames()
    out = []
    import traceback
    for t in threading.enumerate():
        f = frames.get(t.ident)
        if f is not None:
            out.append(f"python thread {t.name}:")
            out.extend("  " + x.rstrip() for x in traceback.format_stack(f)[-6:])
    return "\n".join(out)


# ---------------------------------------------------------------- trees


def tree_state(root):
    """{relpath: ("f", sha, size) | ("d",) | ("l", target) | ("err", errno)} under root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in dirnames:
            out[os.path.relpath(os.path.join(dirpath, name), root)] = ("d",)
        for name in sorted(filenames):
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            try:
                if os.path.islink(p):
                    out[rel] = ("l", os.readlink(p))
                else:
                    out[rel] = ("f", file_sha(p), os.path.getsize(p))
            except OSError as e:
                out[rel] = ("err", e.errno)
    return out


def copy_tree(src, dst):
    """cp -a (keeps hard links; reflinks where the filesystem can)."""
    if os.path.exists(dst):
        shutil.rmtree(dst)
    subprocess.run(["cp", "-a", "--reflink=auto", src, dst], check=True)


def json_dump(obj, path):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)


def rng_for(seed, *parts):
    """A random.Random seeded from the run's seed and the given parts (reproducible)."""
    h = hashlib.sha256(repr((seed,) + parts).encode()).digest()
    return random.Random(int.from_bytes(h[:8], "little"))
