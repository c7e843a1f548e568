#!/usr/bin/python3
"""ckptfs benchmark driver (tools/bench/run): ckptfs side by side with its
baselines, alternating A/B over repetitions, medians and ratios in one table.

See docs/performance.md for what each case measures.  Needs root (mounts,
drop_caches), a configured tree with fs/ckptfs and tools/ckpt built
(tools/setup.sh; the null FUSE filesystem tools/bench/nullfs is built with
make), /usr/bin/python3 with numpy; installs borgbackup and restic with
apt-get when case 3 needs them.
"""
import argparse
import atexit
import csv
import ctypes
import hashlib
import mmap
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import gen  # noqa: E402
import offline_reshard  # noqa: E402

GB = 1e9
GiB = 1 << 30
MiB = 1 << 20
IO = 1 << 20
CLK_TCK = os.sysconf("SC_CLK_TCK")
PY = "/usr/bin/python3"

LIVE_MOUNTS = []  # Mount objects to tear down on exit
LOGFILE = []      # the open run.log, once setup() has created OUT
MAIN_PID = os.getpid()  # forked helpers (data generation) must not clean up


def build_nullfs():
    """Path of the null FUSE filesystem tools/bench/nullfs, built (or brought up to date)
    by make in the configured tree, as `make bench` and `make check` build it."""
    r = subprocess.run(["make", "-C", TOP, "-s", "tools/bench/nullfs"], capture_output=True,
                       text=True)
    if r.returncode != 0:
        sys.exit(f"{r.stdout}{r.stderr}tools/bench: `make tools/bench/nullfs` failed; "
                 "configure and build the tree first (tools/setup.sh)")
    return os.path.join(TOP, "tools", "bench", "nullfs")


def now():
    return time.monotonic()


def log(msg):
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    for f in LOGFILE:
        f.write(line + "\n")
        f.flush()


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def spread(xs):
    """Half the min-max range relative to the median, in %."""
    if len(xs) < 2:
        return 0.0
    m = median(xs)
    return 100.0 * (max(xs) - min(xs)) / 2 / m if m else 0.0


def rotate(items, k):
    k %= len(items)
    return items[k:] + items[:k]


# /sys/dev/block/MAJ:MIN/stat of the device under the work directory (set by Bench).
DISK_STAT = None


def _disk_counters():
    with open(DISK_STAT) as f:
        v = [int(x) for x in f.read().split()]
    # writes completed, in flight, discards completed (when the kernel reports them)
    return v[4], v[8], (v[11] if len(v) > 11 else 0)


def wait_disk_idle(quiet=0.3, limit=20.0):
    """Wait until the work directory's disk has had no write, discard or request in
    flight for `quiet` seconds (at most `limit`): writeback of generated data and
    discards of deleted stores then do not land in the next timed phase, whichever
    variant runs first."""
    if not DISK_STAT or not os.path.exists(DISK_STAT):
        return
    t0 = time.monotonic()
    prev = _disk_counters()
    since = t0
    while time.monotonic() - t0 < limit:
        time.sleep(0.05)
        cur = _disk_counters()
        if cur[1] != 0 or cur[0] != prev[0] or cur[2] != prev[2]:
            since = time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
        prev = cur


def drop_caches():
    os.sync()
    wait_disk_idle()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def tree_bytes(path):
    """Apparent size of everything under path (du -sb)."""
    total = 0
    for root, dirs, files in os.walk(path):
        for n in files + dirs:
            try:
                total += os.lstat(os.path.join(root, n)).st_size
            except OSError:
                pass
    return total


def rmtree(path):
    if os.path.lexists(path):
        shutil.rmtree(path, ignore_errors=True)


def mounts_under(path):
    """Mount points at or below path (from /proc/self/mounts)."""
    path = os.path.realpath(path)
    out = []
    with open("/proc/self/mounts") as f:
        for line in f:
            mp = line.split()[1].replace("\\040", " ")
            if mp == path or mp.startswith(path.rstrip("/") + "/"):
                out.append(mp)
    return out


def _proc_stat(pid):
    """The fields of /proc/PID/stat after the command name (field 3 is index 0)."""
    with open(f"/proc/{pid}/stat") as f:
        s = f.read()
    return s[s.rindex(")") + 2:].split()


def proc_cpu(pid):
    """utime + stime of a process (all threads), seconds."""
    try:
        fields = _proc_stat(pid)
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, ValueError, IndexError):
        return float("nan")


def proc_minflt(pid):
    """Minor page faults of a process (all threads)."""
    try:
        return int(_proc_stat(pid)[7])
    except (OSError, ValueError, IndexError):
        return float("nan")


def proc_hwm(pid):
    """Peak resident set size (VmHWM), bytes."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return float("nan")


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def unmount(mnt):
    """Unmounts mnt if it is a mount point: fusermount3 -u, once more after a second (a file
    still open), then a lazy umount."""
    if not os.path.ismount(mnt):
        return
    r = subprocess.run(["fusermount3", "-u", mnt], capture_output=True)
    if r.returncode != 0:
        time.sleep(1)
        r = subprocess.run(["fusermount3", "-u", mnt], capture_output=True)
    if r.returncode != 0:
        subprocess.run(["umount", "-l", mnt], capture_output=True)


class Mount:
    """A FUSE daemon run in the foreground (-f) by us, so its pid is known."""

    def __init__(self, bench, kind, mnt, store=None, opts=None, label=""):
        self.b, self.kind, self.mnt, self.store = bench, kind, mnt, store
        self.opts, self.label = opts or [], label
        self.proc = None

    def start(self):
        os.makedirs(self.mnt, exist_ok=True)
        if os.path.ismount(self.mnt):
            raise RuntimeError(f"{self.mnt} is already a mount point")
        logf = open(os.path.join(self.b.logdir, f"{self.kind}-{self.label}.log"), "ab")
        if self.kind == "ckptfs":
            cmd = [self.b.ckptfs, self.store, self.mnt, "-f"]
        else:
            cmd = [self.b.nullfs, self.mnt, "-f"]
        if self.opts:
            cmd += ["-o", ",".join(self.opts)]
        self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        logf.close()
        LIVE_MOUNTS.append(self)
        t0 = now()
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None:
                LIVE_MOUNTS.remove(self)
                raise RuntimeError(f"{self.kind} exited ({self.proc.returncode}) before "
                                   f"mounting {self.mnt}; see {self.b.logdir}")
            if now() - t0 > 60:
                self.stop()
                raise RuntimeError(f"{self.kind} did not mount {self.mnt} within 60 s")
            time.sleep(0.02)
        return self

    @property
    def pid(self):
        return self.proc.pid

    def cpu(self):
        return proc_cpu(self.pid)

    def hwm(self):
        return proc_hwm(self.pid)

    def stop(self):
        if self.proc is None:
            return
        unmount(self.mnt)
        try:
            self.proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.returncode not in (0, None):
            log(f"  warning: {self.kind} ({self.label}) exited with {self.proc.returncode}")
        if self in LIVE_MOUNTS:
            LIVE_MOUNTS.remove(self)
        self.proc = None


def cleanup_mounts():
    if os.getpid() != MAIN_PID:
        return
    for m in list(LIVE_MOUNTS):
        try:
            m.stop()
        except Exception as e:  # noqa: BLE001 - best effort at exit
            print(f"cleanup of {m.mnt} failed: {e}", file=sys.stderr)


def on_signal(signum, frame):
    if os.getpid() != MAIN_PID:  # a forked helper: die as if no handler were installed
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    cleanup_mounts()
    sys.exit(128 + signum)


# --------------------------------------------------------------------- I/O workers


def _write_file(path, src, sync):
    """Write one file with 1 MiB writes: src is a memoryview (replayed from memory) or a path
    (streamed from disk with 1 MiB reads)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    n = 0
    try:
        if isinstance(src, str):
            buf = bytearray(IO)
            mv = memoryview(buf)
            sfd = os.open(src, os.O_RDONLY)
            try:
                while True:
                    k = os.readv(sfd, [buf])
                    if k <= 0:
                        break
                    off = 0
                    while off < k:
                        off += os.write(fd, mv[off:k])
                    n += k
            finally:
                os.close(sfd)
        else:
            size = len(src)
            while n < size:
                n += os.write(fd, src[n:min(n + IO, size)])
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return n


def parallel_save(jobs, dest, nwriters, sync):
    """jobs: list of (rank, file name, src).  Rank r's files are written by writer
    r % nwriters, in order.  Returns (seconds, bytes)."""
    os.makedirs(dest, exist_ok=True)
    per = [[] for _ in range(nwriters)]
    for rank, name, src in sorted(jobs, key=lambda j: (j[0], j[1])):
        per[rank % nwriters].append((name, src))

    def work(items):
        n = 0
        for name, src in items:
            n += _write_file(os.path.join(dest, name), src, sync)
        return n

    return _timed_threads(work, per)


def parallel_read(groups):
    """groups: list of path lists, one reader thread each, 1 MiB reads (the offline
    reshard's reader).  (seconds, bytes)."""
    return _timed_threads(offline_reshard.read_files, groups)


DIRECT_IO = 4 << 20


HUGE_PAGE = 2 << 20


def _read_ranges(ranges, direct):
    """Read (path, offset, length) ranges with 4 MiB requests into one buffer, with
    O_DIRECT or through the page cache; returns bytes read.  The buffer is 2 MiB aligned
    and advised MADV_HUGEPAGE, as the daemon's pack-read buffers: this disk serves
    O_DIRECT reads into 4 KiB pages at about half the speed (docs/performance.md section 6).  It
    is private memory: Python's default MAP_SHARED anonymous mapping is shmem, which
    gets no huge pages here."""
    region = mmap.mmap(-1, DIRECT_IO + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(region))
    at = -addr % HUGE_PAGE
    region.madvise(mmap.MADV_HUGEPAGE, at, DIRECT_IO)
    buf = memoryview(region)[at:at + DIRECT_IO]
    n = 0
    try:
        for path, off, length in ranges:
            fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
            try:
                end = off + length
                while off < end:
                    k = os.preadv(fd, [buf], off)
                    if k <= 0:
                        break
                    k = min(k, end - off)
                    n += k
                    off += k
            finally:
                os.close(fd)
    finally:
        buf.release()
        region.close()
    return n


def disk_floor_read(store, streams=2):
    """The disk time of a store's data: every pack file of STORE read cold, the bytes split
    into STREAMS contiguous parts read in parallel with 4 MiB requests, once with O_DIRECT
    (as the daemon reads packs) and once through the page cache (the kernel's read-ahead
    keeps more requests in flight), caches dropped before each.  Returns (seconds, bytes)
    of the faster."""
    packs = sorted(os.path.join(store, "packs", n) for n in os.listdir(os.path.join(store, "packs")))
    blocks = [(p, off, min(DIRECT_IO, os.path.getsize(p) - off))
              for p in packs for off in range(0, os.path.getsize(p), DIRECT_IO)]
    per = -(-len(blocks) // streams)
    groups = [blocks[i:i + per] for i in range(0, len(blocks), per)]
    best = None
    for direct in (True, False):
        drop_caches()
        r = _timed_threads(lambda g: _read_ranges(g, direct), groups)
        if best is None or r[0] < best[0]:
            best = r
    return best


def _timed_threads(fn, args):
    """Run fn(a) for every a in args, one thread each, released together; returns (seconds
    from the release until the last thread ends, sum of fn's results).  The first OSError
    of any thread is raised after all have ended."""
    errors = []
    total = [0]
    lock = threading.Lock()
    start = threading.Barrier(len(args) + 1)

    def run(a):
        start.wait()
        n = 0
        try:
            n = fn(a)
        except OSError as e:
            errors.append(e)
        with lock:
            total[0] += n

    th = [threading.Thread(target=run, args=(a,)) for a in args]
    for x in th:
        x.start()
    start.wait()
    t0 = now()
    for x in th:
        x.join()
    dt = now() - t0
    if errors:
        raise errors[0]
    return dt, total[0]


# --------------------------------------------------------------------- results


class Row:
    def __init__(self, case, metric, unit, ck, base_name, base, target=None, note="",
                 better="higher", ratio=True):
        self.case, self.metric, self.unit = case, metric, unit
        self.ck, self.base_name, self.base = list(ck), base_name, list(base or [])
        self.target, self.note, self.better, self.has_ratio = target, note, better, ratio

    @property
    def ck_med(self):
        return median(self.ck)

    @property
    def base_med(self):
        return median(self.base) if self.base else float("nan")

    @property
    def ratio(self):
        if not self.has_ratio or not self.base or not self.base_med:
            return float("nan")
        return self.ck_med / self.base_med

    def verdict(self):
        """target: (what, op, value, text); what 'ratio' or 'value'."""
        if not self.target:
            return ""
        what, op, val, _ = self.target
        x = self.ratio if what == "ratio" else self.ck_med
        if x != x:
            return "n/a"
        ok = x >= val if op == ">=" else x <= val if op == "<=" else x < val
        return "met" if ok else "MISSED"


def fmt(x, unit=""):
    if x != x:
        return "-"
    if unit in ("ms",) or abs(x) < 10:
        return f"{x:.3g}" if abs(x) < 1 else f"{x:.2f}"
    return f"{x:.1f}" if abs(x) < 1000 else f"{x:.0f}"


# --------------------------------------------------------------------- the benchmark


class Bench:
    def __init__(self, a):
        self.a = a
        self.out = os.path.abspath(a.out)
        self.work = os.path.join(self.out, "work")
        global DISK_STAT
        os.makedirs(self.out, exist_ok=True)
        dev = os.stat(self.out).st_dev
        DISK_STAT = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat"
        self.datadir = os.path.abspath(a.data) if a.data else os.path.join(self.out, "data")
        self.logdir = os.path.join(self.out, "logs")
        self.bindir = os.path.join(self.out, "bin")
        self.rows = []
        self.samples = []  # (case, phase, variant, rep, key, value)
        self.notes = []
        self.gen_seconds = 0.0
        self.t_start = now()

    # ---- setup

    def setup(self):
        if os.geteuid() != 0:
            sys.exit("tools/bench/run: must run as root (FUSE mounts, drop_caches)")
        for d in (self.out, self.work, self.datadir, self.logdir, self.bindir):
            os.makedirs(d, exist_ok=True)
        for mp in mounts_under(self.work):  # left by an earlier run that was killed
            subprocess.run(["fusermount3", "-u", "-z", mp], capture_output=True)
        LOGFILE.append(open(os.path.join(self.out, "run.log"), "w"))
        src = os.path.abspath(self.a.ckptfs or os.path.join(TOP, "fs/ckptfs"))
        ck = os.path.abspath(self.a.ckpt or os.path.join(TOP, "tools/ckpt"))
        for p in (src, ck):
            if not os.access(p, os.X_OK):
                sys.exit(f"tools/bench/run: {p} missing; build ckptfs first (tools/setup.sh)")
        # Freeze the binaries under test: a rebuild during the run cannot mix versions.
        self.ckptfs = os.path.join(self.bindir, "ckptfs")
        self.ckpt = os.path.join(self.bindir, "ckpt")
        for a, b in ((src, self.ckptfs), (ck, self.ckpt)):
            if not (os.path.exists(b) and os.path.samefile(a, b)):
                shutil.copy2(a, b)
        with open(self.ckptfs, "rb") as f:
            self.ckptfs_sha = hashlib.sha256(f.read()).hexdigest()[:16]
        self.ckptfs_mtime = time.strftime("%Y-%m-%d %H:%M:%S",
                                          time.localtime(os.stat(src).st_mtime))
        self.nullfs = os.path.join(self.bindir, "nullfs")
        shutil.copy2(build_nullfs(), self.nullfs)
        self.git = self._git()
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        atexit.register(cleanup_mounts)
        self.machine = self._machine()
        log(f"ckptfs under test: {src} (sha256 {self.ckptfs_sha}, built {self.ckptfs_mtime}, "
            f"{self.git})")
        log(f"machine: {self.machine}")

    def _git(self):
        try:
            rev = subprocess.run(["git", "-C", TOP, "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True).stdout.strip()
            dirty = subprocess.run(["git", "-C", TOP, "status", "--porcelain", "--", "core",
                                    "fs"], capture_output=True, text=True).stdout.strip()
            return f"git {rev}{' + uncommitted changes in core/ fs/' if dirty else ''}"
        except OSError:
            return "git unknown"

    def _machine(self):
        cpu = "?"
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
        fs = subprocess.run(["df", "--output=source,fstype", self.work],
                            capture_output=True, text=True).stdout.split("\n")[1].split()
        return (f"{os.cpu_count()} vCPU {cpu}, {mem / GiB:.0f} GiB RAM, kernel "
                f"{platform.release()}, work dir on {fs[1] if len(fs) > 1 else '?'} "
                f"({fs[0] if fs else '?'})")

    # ---- helpers

    def ck_mount(self, store, mnt, label):
        opts = [o for o in (self.a.ckptfs_opts or "").split(",") if o]
        return Mount(self, "ckptfs", mnt, store=store, opts=opts, label=label).start()

    def ck_stat(self, store):
        r = subprocess.run([self.ckpt, "stat", store], capture_output=True, text=True)
        out = {}
        for line in r.stdout.splitlines():
            k, _, v = line.partition(":")
            try:
                out[k.strip()] = int(v.strip())
            except ValueError:
                pass
        return out

    def settle(self, m, expect_logical, timeout=900):
        """Wait until the store has indexed at least expect_logical bytes, has no chunk left
        for background compression and the daemon is idle.  Returns (seconds, settled)."""
        t0 = now()
        last_cpu = m.cpu()
        time.sleep(0.3)
        while now() - t0 < timeout:
            st = self.ck_stat(m.store)
            cpu = m.cpu()
            idle = cpu - last_cpu < 0.05
            last_cpu = cpu
            if (st.get("logical_bytes", 0) >= expect_logical
                    and st.get("compression_pending", 0) == 0 and idle):
                return now() - t0, True
            time.sleep(0.5)
        return now() - t0, False

    def sample(self, case, phase, variant, rep, key, value):
        self.samples.append((case, phase, variant, rep, key, value))

    def load_files(self, step_dir, files):
        """[(rank, name, memoryview)] of a generated step, held in memory so replaying them
        costs no disk reads.  Above 45% of RAM they are read from the page cache (mmap)."""
        total = sum(f["size"] for f in files)
        with open("/proc/meminfo") as f:
            avail = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in f}["MemAvailable"]
        jobs = []
        if total <= 0.45 * avail:
            for f in files:
                buf = bytearray(f["size"])
                with open(os.path.join(step_dir, f["name"]), "rb", buffering=0) as fh:
                    mv = memoryview(buf)
                    got = 0
                    while got < len(buf):
                        k = fh.readinto(mv[got:])
                        if not k:
                            raise RuntimeError(f"short file {f['name']}")
                        got += k
                jobs.append((f["rank"], f["name"], memoryview(buf)))
            self.source_kind = "memory"
        else:
            import mmap
            for f in files:
                with open(os.path.join(step_dir, f["name"]), "rb") as fh:
                    mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                jobs.append((f["rank"], f["name"], memoryview(mm)))
            self.source_kind = "page cache (mmap; may hit disk)"
            self.notes.append(f"{step_dir}: {total / GiB:.1f} GiB does not fit in memory; "
                              "replayed from the page cache")
        return jobs

    def prefault(self, jobs):
        if self.source_kind != "memory":
            for _, _, mv in jobs:
                for off in range(0, len(mv), 4096):
                    mv[off]

    def series(self, name, nbytes, layout, steps, arch="gpt"):
        margs = {"nbytes": int(nbytes), "arch": arch, "seed": 1}
        root = os.path.join(self.datadir, name)
        m, dt = gen.ensure_series(root, margs, layout, steps, workers=max(1, os.cpu_count()),
                                  log=log)
        self.gen_seconds += dt
        if dt:
            log(f"  generated {name} in {dt:.1f} s")
        m["root"] = root
        return m

    def step(self, m, k):
        s = m["steps"][k - 1]
        return os.path.join(m["root"], s["dir"]), s["files"]

    def add(self, row):
        self.rows.append(row)
        tgt = f", target {row.target[3]}: {row.verdict()}" if row.target else ""
        r = row.ratio
        log(f"  => {row.metric}: ckptfs {fmt(row.ck_med)} {row.unit}"
            + (f" vs {row.base_name} {fmt(row.base_med)} (ratio {r:.2f})" if r == r else "")
            + tgt)

    # ---- case 1: save

    def save_ckptfs(self, jobs, nbytes, nwriters, tag, case="1", settle=True, sync=None):
        """One save into a fresh store.  settle: then wait for the background work and
        measure it (else unmount at once: the daemon stops its background work at unmount)."""
        store = os.path.join(self.work, f"store-{tag}")
        mnt = os.path.join(self.work, "mnt")
        rmtree(store)
        m = self.ck_mount(store, mnt, tag)
        nan = float("nan")
        try:
            cpu0 = m.cpu()
            dt, n = parallel_save(jobs, os.path.join(mnt, "step_0001"), nwriters,
                                  self.sync if sync is None else sync)
            cpu1 = m.cpu()
            hwm1 = m.hwm()
            st_s, ok, cpu2, hwm2, stat = nan, True, nan, hwm1, {}
            if settle:
                st_s, ok = self.settle(m, n)
                cpu2 = m.cpu()
                hwm2 = m.hwm()
                stat = self.ck_stat(store)
        finally:
            m.stop()
        stored = tree_bytes(store) if settle else nan
        rmtree(store)
        if not ok:
            self.notes.append(f"case {case} {tag}: store did not settle within the timeout")
        return {"s": dt, "bytes": n, "cpu_save": cpu1 - cpu0, "cpu_all": cpu2 - cpu0,
                "hwm_save": hwm1, "hwm": hwm2, "settle": st_s, "stored": stored,
                "stored_chunks": stat.get("stored_bytes", nan)}

    def save_plain(self, jobs, nwriters, tag, sync=None):
        dest = os.path.join(self.work, f"plain-{tag}")
        rmtree(dest)
        dt, n = parallel_save(jobs, dest, nwriters, self.sync if sync is None else sync)
        rmtree(dest)
        os.sync()
        return {"s": dt, "bytes": n}

    def save_null(self, jobs, nwriters, tag, sync=None):
        mnt = os.path.join(self.work, "nullmnt")
        m = Mount(self, "nullfs", mnt, label=tag).start()
        try:
            cpu0 = m.cpu()
            dt, n = parallel_save(jobs, os.path.join(mnt, "step_0001"), nwriters,
                                  self.sync if sync is None else sync)
            cpu = m.cpu() - cpu0
            hwm = m.hwm()
        finally:
            m.stop()
        return {"s": dt, "bytes": n, "cpu_save": cpu, "hwm": hwm}

    def case1(self, size_gib=None, writers=None, case="1", series=None):
        size = size_gib or self.a.size
        writers = writers or self.writers
        m = series or self.series(f"c1-{size:g}g", size * GiB, gen.Layout(4, 2, 2), 2)
        sdir, files = self.step(m, 1)
        jobs = self.load_files(sdir, files)
        total = sum(f["size"] for f in files)
        log(f"case {case}: save {total / GiB:.2f} GiB ({len(files)} files of 16 ranks, "
            f"tp4 x pp2 x dp2), 1 MiB writes, {self.sync_name}, source in {self.source_kind}")
        res = {}
        # (key, writers, fsync): the main save mode at every writer count; case 1 also runs
        # 2 writers in the other mode (close only vs fsync).
        configs = [(w, w, self.sync) for w in writers]
        if case == "1":
            configs.append(("2alt", 2, not self.sync))
        for key, w, sync in configs:
            for rep in range(self.a.reps):
                for var in rotate(["ckptfs", "plain", "nullfs"], rep):
                    drop_caches()
                    self.prefault(jobs)
                    tag = f"c{case}-w{key}-r{rep}-{var}"
                    if var == "ckptfs":
                        r = self.save_ckptfs(jobs, total, w, tag, case,
                                             settle=(key == 2 or case != "1"), sync=sync)
                    elif var == "plain":
                        r = self.save_plain(jobs, w, tag, sync=sync)
                    else:
                        r = self.save_null(jobs, w, tag, sync=sync)
                    res.setdefault((key, var), []).append(r)
                    for k, v in r.items():
                        self.sample(case, f"save w{key}", var, rep, k, v)
                    log(f"  {tag}: {r['bytes'] / GB / r['s']:.2f} GB/s"
                        + (f", settle {r['settle']:.1f} s" if r.get("settle", 0) > 0 else ""))
        for key, w, sync in configs:
            ck, pl, nu = res[(key, "ckptfs")], res[(key, "plain")], res[(key, "nullfs")]
            gbs = [r["bytes"] / GB / r["s"] for r in ck]
            tgt = (("ratio", ">=", 0.8, ">= 0.8x plain") if key == 2 and case == "1" else None)
            label = f"{w} writer{'s' if w > 1 else ''}"
            if sync != self.sync:
                label += ", fsync" if sync else ", no fsync"
            self.add(Row(case, f"save GB/s, {label}", "GB/s", gbs,
                         "plain dir", [r["bytes"] / GB / r["s"] for r in pl], tgt))
            self.add(Row(case, f"save GB/s, {label}", "GB/s", gbs,
                         "null FUSE", [r["bytes"] / GB / r["s"] for r in nu]))
            if case != "1":
                continue
            self.add(Row(case, f"daemon CPU s/GB during save, {label}", "s/GB",
                         [r["cpu_save"] / (r["bytes"] / GB) for r in ck], "null FUSE",
                         [r["cpu_save"] / (r["bytes"] / GB) for r in nu], better="lower"))
            self.add(Row(case, f"daemon peak RSS during save, {label}", "MiB",
                         [r["hwm_save"] / MiB for r in ck], "null FUSE",
                         [r["hwm"] / MiB for r in nu], better="lower"))
            if key != 2:
                continue
            self.add(Row(case, f"daemon CPU s/GB incl. background, {label}", "s/GB",
                         [r["cpu_all"] / (r["bytes"] / GB) for r in ck], "", None,
                         better="lower", note="save + background work until settled"))
            self.add(Row(case, f"background work after save (settle), {label}", "s",
                         [r["settle"] for r in ck], "", None, better="lower"))
            self.add(Row(case, f"daemon peak RSS incl. background, {label}", "MiB",
                         [r["hwm"] / MiB for r in ck], "", None, better="lower"))
            self.add(Row(case, f"store size / logical bytes (settled), {label}", "x",
                         [r["stored"] / r["bytes"] for r in ck], "plain dir", [1.0],
                         better="lower", note="du -sb of the store after settling"))
        return res

    # ---- case 2: incremental save

    def case2(self):
        size = self.a.size
        m = self.series(f"c1-{size:g}g", size * GiB, gen.Layout(4, 2, 2), 2)
        d1, f1 = self.step(m, 1)
        d2, f2 = self.step(m, 2)
        total = sum(f["size"] for f in f2)
        log(f"case 2: incremental save of step 2 ({total / GiB:.2f} GiB, half the tensors "
            f"unchanged) into a store holding step 1, 2 writers, {self.sync_name}")
        # Step 1 is saved once, settled, and the store copied for every repetition.
        template = os.path.join(self.work, "store-c2-template")
        mnt = os.path.join(self.work, "mnt")
        rmtree(template)
        mt = self.ck_mount(template, mnt, "c2-setup")
        try:
            parallel_save([(f["rank"], f["name"], os.path.join(d1, f["name"])) for f in f1],
                          os.path.join(mnt, "step_0001"), 2, True)
            self.settle(mt, sum(f["size"] for f in f1))
        finally:
            mt.stop()
        jobs = self.load_files(d2, f2)
        ck, pl = [], []
        for rep in range(self.a.reps):
            for var in rotate(["ckptfs", "plain"], rep):
                tag = f"c2-r{rep}-{var}"
                drop_caches()
                if var == "plain":
                    self.prefault(jobs)
                    r = self.save_plain(jobs, 2, tag)
                    pl.append(r)
                else:
                    store = os.path.join(self.work, f"store-{tag}")
                    rmtree(store)
                    subprocess.run(["cp", "-a", template, store], check=True)
                    before = tree_bytes(store)
                    mt = self.ck_mount(store, mnt, tag)
                    try:
                        st1 = self.ck_stat(store)
                        drop_caches()
                        self.prefault(jobs)
                        cpu0 = mt.cpu()
                        dt, n = parallel_save(jobs, os.path.join(mnt, "step_0002"), 2,
                                              self.sync)
                        cpu1 = mt.cpu()
                        s2, _ = self.settle(mt, st1.get("logical_bytes", 0) + n)
                        cpu2 = mt.cpu()
                        st2 = self.ck_stat(store)
                        hwm = mt.hwm()
                    finally:
                        mt.stop()
                    after = tree_bytes(store)
                    rmtree(store)
                    r = {"s": dt, "bytes": n, "step1_stored": before, "added": after - before,
                         "added_chunks": st2.get("stored_bytes", 0) - st1.get("stored_bytes", 0),
                         "step1_chunks": st1.get("stored_bytes", 0) or float("nan"),
                         "settle": s2, "cpu_save": cpu1 - cpu0, "cpu_all": cpu2 - cpu0,
                         "hwm": hwm}
                    ck.append(r)
                for k, v in r.items():
                    self.sample("2", "incremental", var, rep, k, v)
                log(f"  {tag}: {r['s']:.2f} s"
                    + (f", added {r['added'] / GB:.2f} GB to {r['step1_stored'] / GB:.2f} GB"
                       if var == "ckptfs" else ""))
        rmtree(template)
        self.add(Row("2", "incremental save time, 2 writers", "s", [r["s"] for r in ck],
                     "plain dir", [r["s"] for r in pl],
                     ("ratio", "<=", 1 / 1.5, "<= 0.67x plain time (1.5x faster)"),
                     better="lower"))
        self.add(Row("2", "store growth / full checkpoint's store size", "x",
                     [r["added"] / r["step1_stored"] for r in ck], "plain dir",
                     [1.0], ("value", "<=", 0.55, "<= 0.55"), better="lower",
                     note="du -sb of the store before/after step 2 (unmounted, settled)"))
        self.add(Row("2", "stored chunk bytes added / step 1's", "x",
                     [r["added_chunks"] / r["step1_chunks"] for r in ck], "", None,
                     better="lower", note="ckpt stat stored_bytes (referenced chunks): what "
                     "ckpt gc would leave"))
        self.add(Row("2", "background work after save (settle)", "s",
                     [r["settle"] for r in ck], "", None, better="lower"))
        self.add(Row("2", "daemon CPU s/GB incl. background", "s/GB",
                     [r["cpu_all"] / (r["bytes"] / GB) for r in ck], "", None, better="lower"))

    # ---- case 3: store size and ingest vs borg and restic

    def ensure_tools(self):
        missing = [p for p, b in (("borgbackup", "borg"), ("restic", "restic"))
                   if not shutil.which(b)]
        if missing:
            log(f"  installing {' '.join(missing)} (apt-get)")
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            r = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends"]
                               + missing, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
                subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends"]
                               + missing, env=env, check=True, capture_output=True)

    def case3(self):
        self.ensure_tools()
        size = self.a.small_size
        m = self.series(f"c3-{size:g}g", size * GiB, gen.Layout(4, 2, 2), 3)
        nsteps = len(m["steps"])
        total = sum(s["bytes"] for s in m["steps"])
        log(f"case 3: ingest a {nsteps}-step series ({total / GiB:.2f} GiB, half the tensors "
            f"unchanged per step) from disk: ckptfs (2 writers, {self.sync_name}) vs "
            f"borg create --compression zstd,3 vs restic backup (repo v2, compression auto)")
        res = {"ckptfs": [], "borg": [], "restic": []}
        for rep in range(self.a.reps):
            for var in rotate(["ckptfs", "borg", "restic"], rep):
                tag = f"c3-r{rep}-{var}"
                r = getattr(self, f"ingest_{var}")(m, tag)
                res[var].append(r)
                for k, v in r.items():
                    self.sample("3", "ingest", var, rep, k, v)
                log(f"  {tag}: {r['s']:.1f} s, stored {r['stored'] / GB:.3f} GB")
        ck = res["ckptfs"]
        for b in ("borg", "restic"):
            tgt = ("ratio", "<=", 0.85, "<= 0.85x borg") if b == "borg" else None
            self.add(Row("3", "stored bytes (settled)", "GB", [r["stored"] / GB for r in ck], b,
                         [r["stored"] / GB for r in res[b]], tgt, better="lower"))
        for b in ("borg", "restic"):
            tgt = ("ratio", "<=", 1 / 3, "<= 0.33x borg time (3x faster)") if b == "borg" \
                else None
            self.add(Row("3", "ingest time, 3 steps", "s", [r["s"] for r in ck], b,
                         [r["s"] for r in res[b]], tgt, better="lower"))
        self.add(Row("3", "stored bytes after ckpt gc (unmounted)", "GB",
                     [r["stored_gc"] / GB for r in ck], "borg",
                     [r["stored"] / GB for r in res["borg"]],
                     better="lower", note="ckpt gc run once after the ingest"))
        self.add(Row("3", "ckpt gc time", "s", [r["gc_s"] for r in ck], "", None, better="lower"))
        self.add(Row("3", "ingest + background work until settled", "s",
                     [r["s"] + r["settle"] for r in ck], "borg", [r["s"] for r in res["borg"]],
                     better="lower"))
        self.add(Row("3", "logical / stored", "x", [total / r["stored"] for r in ck], "borg",
                     [total / r["stored"] for r in res["borg"]]))

    def ingest_ckptfs(self, m, tag):
        store = os.path.join(self.work, f"store-{tag}")
        mnt = os.path.join(self.work, "mnt")
        rmtree(store)
        mt = self.ck_mount(store, mnt, tag)
        try:
            drop_caches()
            t = 0.0
            n = 0
            for k in range(1, len(m["steps"]) + 1):
                d, files = self.step(m, k)
                dt, b = parallel_save([(f["rank"], f["name"], os.path.join(d, f["name"]))
                                       for f in files], os.path.join(mnt, f"step_{k:04d}"), 2,
                                      self.sync)
                t += dt
                n += b
            st, ok = self.settle(mt, n)
        finally:
            mt.stop()
        stored = tree_bytes(store)
        t0 = now()
        subprocess.run([self.ckpt, "gc", store], check=True, capture_output=True)
        gc_s = now() - t0
        after_gc = tree_bytes(store)
        rmtree(store)
        return {"s": t, "bytes": n, "settle": st, "stored": stored, "gc_s": gc_s,
                "stored_gc": after_gc}

    def _run_timed(self, cmd, env, cwd=None):
        t0 = now()
        r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
        dt = now() - t0
        if r.returncode not in (0, 1) or (r.returncode == 1 and "borg" not in cmd[0]):
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-2000:]}")
        return dt

    def ingest_borg(self, m, tag):
        repo = os.path.join(self.work, f"borg-{tag}")
        base = os.path.join(self.work, f"borgbase-{tag}")
        rmtree(repo)
        rmtree(base)
        env = dict(os.environ, BORG_BASE_DIR=base, BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK="yes",
                   BORG_RELOCATED_REPO_ACCESS_IS_OK="yes", BORG_PASSPHRASE="")
        subprocess.run(["borg", "init", "--encryption=none", repo], env=env, check=True,
                       capture_output=True)
        drop_caches()
        t = 0.0
        for k in range(1, len(m["steps"]) + 1):
            d = m["steps"][k - 1]["dir"]
            t += self._run_timed(["borg", "create", "--compression", "zstd,3", f"{repo}::{d}", d],
                                 env, cwd=m["root"])
        stored = tree_bytes(repo)
        rmtree(repo)
        rmtree(base)
        return {"s": t, "stored": stored}

    def ingest_restic(self, m, tag):
        repo = os.path.join(self.work, f"restic-{tag}")
        cache = os.path.join(self.work, f"resticcache-{tag}")
        rmtree(repo)
        rmtree(cache)
        env = dict(os.environ, RESTIC_PASSWORD="bench", RESTIC_REPOSITORY=repo,
                   RESTIC_CACHE_DIR=cache)
        subprocess.run(["restic", "init", "--repository-version", "2"], env=env, check=True,
                       capture_output=True)
        drop_caches()
        t = 0.0
        for k in range(1, len(m["steps"]) + 1):
            d = m["steps"][k - 1]["dir"]
            t += self._run_timed(["restic", "backup", "--quiet", d], env, cwd=m["root"])
        stored = tree_bytes(repo)
        rmtree(repo)
        rmtree(cache)
        return {"s": t, "stored": stored}

    # ---- case 4: load through a view

    def view_files(self, root, T, P):
        """Reader groups (one per target rank) for view/offline dir root."""
        names = sorted(os.listdir(root))
        groups = []
        for p in range(P):
            for t in range(T):
                suf = ".safetensors" if T == 1 and P == 1 else f"_tp{t}_pp{p}.safetensors"
                groups.append([os.path.join(root, n) for n in names if n.endswith(suf)
                               and (T > 1 or P > 1 or "_tp" not in n)])
        return groups

    def case4(self, size_gib=None, layouts=None, case="4", offline=True, verify=True):
        size = size_gib or self.a.small_size
        layouts = layouts or [(1, 1), (4, 1)]
        m = self.series(f"c4-{size:g}g", size * GiB, gen.Layout(2, 2, 4), 1)
        sdir, files = self.step(m, 1)
        total = sum(f["size"] for f in files)
        log(f"case {case}: load views of a {total / GiB:.2f} GiB checkpoint saved tp2 x pp2 x "
            f"dp4 ({len(files)} files), 1 MiB reads by every target rank in parallel")
        store = os.path.join(self.work, f"store-c{case}")
        mnt = os.path.join(self.work, "mnt")
        rmtree(store)
        mt = self.ck_mount(store, mnt, f"c{case}-setup")
        try:
            parallel_save([(f["rank"], f["name"], os.path.join(sdir, f["name"])) for f in files],
                          os.path.join(mnt, "ckpt"), 2, True)
            self.settle(mt, total)
        finally:
            mt.stop()
        offdir = os.path.join(self.work, "offline")
        res = {}
        for T, P in layouts:
            lay = f"tp{T}_pp{P}"
            nread = T * P
            variants = ["view", "sources", "plain"] + (["offline", "floor"] if offline else [])
            for rep in range(self.a.reps):
                for var in rotate(variants, rep):
                    tag = f"c{case}-{lay}-r{rep}-{var}"
                    drop_caches()
                    if var == "offline":
                        rmtree(offdir)
                        drop_caches()
                        t0 = now()
                        subprocess.run([PY, os.path.join(HERE, "offline_reshard.py"), sdir, offdir,
                                        "--tp", str(T), "--pp", str(P), "--read"], check=True,
                                       capture_output=True)
                        r = {"s": now() - t0, "bytes": tree_bytes(offdir)}
                    elif var == "plain":
                        # the same source files read from the plain directory: the disk
                        src = sorted(os.path.join(sdir, f["name"]) for f in files)
                        drop_caches()
                        dt, n = parallel_read([src[i::nread] for i in range(nread)])
                        r = {"s": dt, "bytes": n}
                    elif var == "floor":
                        # the stored bytes off the disk (drops the caches itself)
                        dt, n = disk_floor_read(store)
                        r = {"s": dt, "bytes": n}
                    else:
                        mt = self.ck_mount(store, mnt, tag)
                        try:
                            if var == "view":
                                groups = self.view_files(os.path.join(mnt, lay, "ckpt"), T, P)
                            else:
                                src = sorted(os.path.join(mnt, "ckpt", f["name"]) for f in files)
                                groups = [src[i::nread] for i in range(nread)]
                            drop_caches()
                            cpu0 = mt.cpu()
                            dt, n = parallel_read(groups)
                            r = {"s": dt, "bytes": n, "cpu": mt.cpu() - cpu0, "hwm": mt.hwm()}
                        finally:
                            mt.stop()
                    res.setdefault((lay, var), []).append(r)
                    for k, v in r.items():
                        self.sample(case, f"load {lay}", var, rep, k, v)
                    log(f"  {tag}: {r['s']:.2f} s, {r['bytes'] / GB / r['s']:.2f} GB/s")
            if offline and verify:
                # Correctness: the view must equal what the offline script wrote.
                mt = self.ck_mount(store, mnt, f"c{case}-verify")
                try:
                    cnt, probs = offline_reshard.compare_dirs(os.path.join(mnt, lay, "ckpt"),
                                                              offdir)
                finally:
                    mt.stop()
                if probs:
                    self.notes.append(f"case {case} {lay}: VIEW DIFFERS from the offline "
                                      f"reshard: {probs[:3]}")
                    log(f"  VERIFY FAILED: {probs[:3]}")
                else:
                    self.notes.append(f"case {case} {lay}: view verified against the offline "
                                      f"reshard, {cnt} tensors byte-identical")
                    log(f"  verified {lay}: {cnt} tensors identical to the offline reshard")
            rmtree(offdir)
            v, s = res[(lay, "view")], res[(lay, "sources")]
            vg = [r["bytes"] / GB / r["s"] for r in v]
            self.add(Row(case, f"read {lay} view GB/s, {nread} reader{'s' if nread > 1 else ''}",
                         "GB/s", vg, "sources via mount", [r["bytes"] / GB / r["s"] for r in s],
                         ("ratio", ">=", 0.8, ">= 0.8x sources") if case == "4" else None))
            self.add(Row(case, f"read {lay} view GB/s, {nread} reader{'s' if nread > 1 else ''}",
                         "GB/s", vg, "sources from plain dir",
                         [r["bytes"] / GB / r["s"] for r in res[(lay, "plain")]],
                         note="the backing disk's cold read speed, same readers"))
            if offline:
                o = res[(lay, "offline")]
                self.add(Row(case, f"{lay}: time to have read the target files", "s",
                             [r["s"] for r in v], "offline numpy reshard", [r["s"] for r in o],
                             ("ratio", "<=", 0.2, "<= 0.2x offline (5x faster)")
                             if case == "4" else None, better="lower"))
                fl = res[(lay, "floor")]
                self.add(Row(case, f"{lay}: disk time of the packs (cold)", "s",
                             [r["s"] for r in fl], "offline numpy reshard", [r["s"] for r in o],
                             better="lower",
                             note=f"{median(r['bytes'] for r in fl) / GB:.3f} GB of packs, the "
                                  "faster of O_DIRECT and buffered reads, 2 streams: a view "
                                  "read cannot be faster than its stored bytes come off the disk"))
                self.add(Row(case, f"{lay}: daemon peak RSS", "MiB",
                             [r["hwm"] / MiB for r in v], "", None, better="lower"))
        rmtree(store)
        return res

    # ---- case 5: metadata scale

    def case5(self):
        log("case 5: metadata scale")
        m = self.series("c5-moe", 0, gen.Layout(2, 2, 1), 1, arch="moe")
        sdir, files = self.step(m, 1)
        ntens = m["model"]["tensors"]
        total = sum(f["size"] for f in files)
        store = os.path.join(self.work, "store-c5")
        mnt = os.path.join(self.work, "mnt")
        plain = os.path.join(self.work, "plain-c5")
        rmtree(store)
        rmtree(plain)
        # Offline consolidated file for the plain baseline (setup, untimed).
        offline_reshard.reshard(sdir, os.path.join(plain, "moe"), 1, 1)
        nfiles = self.a.meta_files
        per_dir = 1000
        log(f"  {ntens} tensors in {len(files)} files ({total / MiB:.0f} MiB); "
            f"{nfiles} small files for ls -lR / stat")
        mt = self.ck_mount(store, mnt, "c5-setup")
        try:
            parallel_save([(f["rank"], f["name"], os.path.join(sdir, f["name"])) for f in files],
                          os.path.join(mnt, "moe"), 1, True)
            ctime = {}
            for var, root in (("ckptfs", os.path.join(mnt, "tree")),
                              ("plain", os.path.join(plain, "tree"))):
                t0 = now()
                self.make_tree(root, nfiles, per_dir)
                ctime[var] = now() - t0
                log(f"  created {nfiles} files in {root}: {ctime[var]:.1f} s")
            self.settle(mt, total)
        finally:
            mt.stop()
        self.sample("5", "create files", "ckptfs", 0, "s", ctime["ckptfs"])
        self.sample("5", "create files", "plain", 0, "s", ctime["plain"])
        paths = [os.path.join("tree", f"d{i // per_dir:04d}", f"f{i:06d}") for i in range(nfiles)]
        vfile = {1: os.path.join("tp1_pp1", "moe", "model.safetensors"),
                 4: os.path.join("tp4_pp1", "moe", "model_tp0_pp0.safetensors")}
        res = {}
        nopen = 50
        for rep in range(self.a.reps):
            for var in rotate(["ckptfs", "plain"], rep):
                tag = f"c5-r{rep}-{var}"
                r = {}
                if var == "plain":
                    r.update(self.open_times(os.path.join(plain, "moe", "model.safetensors"),
                                             "tp1", nopen))
                    r.update(self.tree_times(plain, paths))
                else:
                    # Every measurement that is "after mount" gets a daemon of its own.
                    for T in (1, 4):
                        mt = self.ck_mount(store, mnt, f"{tag}-tp{T}")
                        try:
                            r.update(self.open_times(os.path.join(mnt, vfile[T]), f"tp{T}",
                                                     nopen))
                        finally:
                            mt.stop()
                    mt = self.ck_mount(store, mnt, f"{tag}-src")
                    try:
                        o = self.open_times(os.path.join(mnt, "moe", files[0]["name"]), "src",
                                            nopen)
                        r["ttfb_cold_source"] = o["ttfb_cold_src"]
                        r.update(self.tree_times(mnt, paths))
                        r["hwm"] = mt.hwm()
                    finally:
                        mt.stop()
                res.setdefault(var, []).append(r)
                for k, v in r.items():
                    self.sample("5", "metadata", var, rep, k, v)
                log(f"  {tag}: " + ", ".join(f"{k} {v:.3g}" for k, v in r.items()
                                             if k != "hwm"))
        ck, pl = res["ckptfs"], res["plain"]
        for T in (1, 4):
            self.add(Row("5", f"view tp{T}_pp1 first open after mount ({ntens} tensors)", "ms",
                         [r[f"open_cold_tp{T}"] for r in ck], "plain consolidated file",
                         [r["open_cold_tp1"] for r in pl], ("value", "<", 100, "< 100 ms"),
                         better="lower", note="includes building the view"))
            self.add(Row("5", f"view tp{T}_pp1 time to first MiB after mount", "ms",
                         [r[f"ttfb_cold_tp{T}"] for r in ck], "plain consolidated file",
                         [r["ttfb_cold_tp1"] for r in pl], better="lower"))
            self.add(Row("5", f"view tp{T}_pp1 open latency (median of {nopen})", "ms",
                         [r[f"open_warm_tp{T}"] for r in ck], "plain consolidated file",
                         [r["open_warm_tp1"] for r in pl], ("value", "<", 100, "< 100 ms"),
                         better="lower"))
        self.add(Row("5", "stored source file time to first MiB after mount", "ms",
                     [r["ttfb_cold_source"] for r in ck], "plain consolidated file",
                     [r["ttfb_cold_tp1"] for r in pl], better="lower"))
        self.add(Row("5", f"ls -lR over {nfiles} files (cold)", "s", [r["ls_lR"] for r in ck],
                     "plain dir", [r["ls_lR"] for r in pl], better="lower",
                     note="" if nfiles >= 100000 else "scaled down; --meta-files 100000"))
        self.add(Row("5", f"stat of {nfiles} files (cold)", "s", [r["stat_all"] for r in ck],
                     "plain dir", [r["stat_all"] for r in pl], better="lower"))
        self.add(Row("5", f"create {nfiles} 1 KiB files (once)", "s", [ctime["ckptfs"]],
                     "plain dir", [ctime["plain"]], better="lower"))
        rmtree(store)
        rmtree(plain)

    @staticmethod
    def open_times(path, key, nopen):
        """Cold open and first MiB (page caches dropped), then the median of nopen opens."""
        r = {}
        drop_caches()
        t0 = now()
        fd = os.open(path, os.O_RDONLY)
        t1 = now()
        os.pread(fd, IO, 0)
        t2 = now()
        os.close(fd)
        r[f"open_cold_{key}"] = (t1 - t0) * 1e3
        r[f"ttfb_cold_{key}"] = (t2 - t0) * 1e3
        lat = []
        for _ in range(nopen):
            t0 = now()
            fd = os.open(path, os.O_RDONLY)
            lat.append(now() - t0)
            os.close(fd)
        r[f"open_warm_{key}"] = median(lat) * 1e3
        return r

    @staticmethod
    def tree_times(root, paths):
        r = {}
        drop_caches()
        t0 = now()
        subprocess.run(["ls", "-lR", os.path.join(root, "tree")], check=True,
                       stdout=subprocess.DEVNULL)
        r["ls_lR"] = now() - t0
        drop_caches()
        t0 = now()
        for p in paths:
            os.stat(os.path.join(root, p))
        r["stat_all"] = now() - t0
        return r

    @staticmethod
    def make_tree(root, n, per_dir):
        payload = os.urandom(1024 + n)
        for i in range(n):
            d = os.path.join(root, f"d{i // per_dir:04d}")
            if i % per_dir == 0:
                os.makedirs(d, exist_ok=True)
            fd = os.open(os.path.join(d, f"f{i:06d}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                         0o644)
            os.write(fd, payload[i:i + 1024])
            os.close(fd)

    # ---- case 6: growth

    def case6(self):
        sizes = [float(x) for x in self.a.growth.split(",")]
        log(f"case 6: growth, cases 1 (2 writers) and 4 (tp1_pp1) at "
            f"{', '.join(f'{s:g}' for s in sizes)} GiB")
        per = {}
        for s in sizes:
            free = shutil.disk_usage(self.work).free
            if free < 2.6 * s * GiB:
                raise RuntimeError(f"{free / GiB:.0f} GiB free under {self.work}, case 6 at "
                                   f"{s:g} GiB needs about {2.6 * s:.0f}")
            m = self.series(f"c1-{s:g}g", s * GiB, gen.Layout(4, 2, 2), 1)
            r1 = self.case1(size_gib=s, writers=[2], case=f"6@{s:g}G", series=m)
            del m
            if s != self.a.size:  # data only case 6 uses: free the disk for the next size
                rmtree(os.path.join(self.datadir, f"c1-{s:g}g"))
            r4 = self.case4(size_gib=s, layouts=[(1, 1)], case=f"6@{s:g}G", verify=False)
            if s != self.a.small_size:
                rmtree(os.path.join(self.datadir, f"c4-{s:g}g"))
            per[s] = (r1, r4)

        def spg(rs):
            return [r["s"] / (r["bytes"] / GB) for r in rs]
        for kind, key, base in (("save", (2, "ckptfs"), (2, "plain")),
                                ("view read", ("tp1_pp1", "view"), ("tp1_pp1", "sources"))):
            for s in sizes:
                rs = per[s][0] if kind == "save" else per[s][1]
                self.add(Row("6", f"{kind} s/GB at {s:g} GiB", "s/GB", spg(rs[key]),
                             "plain dir" if kind == "save" else "sources via mount",
                             spg(rs[base]), better="lower"))
            meds = [median(spg((per[s][0] if kind == "save" else per[s][1])[key]))
                    for s in sizes]
            self.add(Row("6", f"{kind} s/GB, largest / smallest size", "x",
                         [max(meds[-1], 1e-9) / max(meds[0], 1e-9)], "", None,
                         ("value", "<=", 1.25, "flat (<= 1.25)"), better="lower"))
        for s in sizes:
            self.add(Row("6", f"daemon peak RSS, save / view read at {s:g} GiB", "MiB",
                         [r["hwm"] / MiB for r in per[s][0][(2, "ckptfs")]], "view read",
                         [r["hwm"] / MiB for r in per[s][1][("tp1_pp1", "view")]],
                         ratio=False, better="lower"))
        hw = [max(median([r["hwm"] for r in per[s][0][(2, "ckptfs")]]),
                  median([r["hwm"] for r in per[s][1][("tp1_pp1", "view")]])) for s in sizes]
        self.add(Row("6", "daemon peak RSS, largest / smallest size", "x",
                     [hw[-1] / hw[0]], "", None, ("value", "<=", 1.25, "independent of size"),
                     better="lower"))

    # ---- report

    def report(self):
        elapsed = now() - self.t_start
        hdr = ["case", "measure", "unit", "ckptfs", "+-%", "baseline", "baseline value",
               "+-%", "ratio ck/base", "target", "verdict"]
        lines = []
        for r in self.rows:
            lines.append([r.case, r.metric, r.unit, fmt(r.ck_med), f"{spread(r.ck):.0f}",
                          r.base_name or "-", fmt(r.base_med) if r.base else "-",
                          f"{spread(r.base):.0f}" if len(r.base) > 1 else "-",
                          f"{r.ratio:.2f}" if r.ratio == r.ratio else "-",
                          r.target[3] if r.target else "-", r.verdict() or "-"])
        widths = [max(len(str(x[i])) for x in lines + [hdr]) for i in range(len(hdr))]
        sep = "  "
        text = []
        text.append(f"ckptfs benchmark  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
        text.append(f"command: tools/bench/run {' '.join(self.argv)}")
        text.append(f"machine: {self.machine}")
        text.append(f"ckptfs: sha256 {self.ckptfs_sha} built {self.ckptfs_mtime} ({self.git}), "
                    f"options: {self.a.ckptfs_opts or 'defaults'}; saves: {self.sync_name}")
        text.append(f"reps {self.a.reps} (medians; +-% = half the min-max range of the samples "
                    f"relative to the median), load average "
                    f"at start {self.load0:.2f}, at end {loadavg():.2f}; total {elapsed:.0f} s "
                    f"(data generation {self.gen_seconds:.0f} s)")
        text.append("")
        text.append(sep.join(h.ljust(widths[i]) for i, h in enumerate(hdr)))
        text.append(sep.join("-" * w for w in widths))
        for ln in lines:
            text.append(sep.join(str(x).ljust(widths[i]) for i, x in enumerate(ln)))
        if self.notes:
            text.append("")
            text += [f"note: {n}" for n in self.notes]
        out = "\n".join(text)
        print("\n" + out, flush=True)
        with open(os.path.join(self.out, "results.txt"), "w") as f:
            f.write(out + "\n")
        with open(os.path.join(self.out, "results.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["case", "measure", "unit", "ckptfs_median", "ckptfs_samples", "baseline",
                        "baseline_median", "baseline_samples", "ratio", "target", "verdict",
                        "note", "better"])
            for r in self.rows:
                w.writerow([r.case, r.metric, r.unit, r.ck_med,
                            " ".join(f"{x:.6g}" for x in r.ck), r.base_name, r.base_med,
                            " ".join(f"{x:.6g}" for x in r.base), r.ratio,
                            r.target[3] if r.target else "", r.verdict(), r.note, r.better])
        with open(os.path.join(self.out, "samples.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["case", "phase", "variant", "rep", "key", "value"])
            w.writerows(self.samples)
        self.chart()
        log(f"results in {self.out}/results.txt, results.csv, samples.csv")

    def chart(self):
        if not shutil.which("gnuplot"):
            log("gnuplot not installed: no chart")
            return
        rows = [r for r in self.rows if r.ratio == r.ratio and r.ratio > 0]  # log axis
        dat = os.path.join(self.out, "chart.dat")
        with open(dat, "w") as f:
            for i, r in enumerate(rows):
                label = f"{r.case}: {r.metric} vs {r.base_name}".replace('"', "'")
                f.write(f'{i} {r.ratio:.4f} "{label}"\n')
        gp = os.path.join(self.out, "chart.gp")
        with open(gp, "w") as f:
            f.write(f"""set terminal pngcairo noenhanced size 1400,{200 + 28 * len(rows)}
set output '{os.path.join(self.out, "chart.png")}'
set title 'ckptfs / baseline (medians)'
set style fill solid 0.6
set logscale x 2
set ytics scale 0 font ',9'
set grid xtics
set xlabel 'ratio ckptfs / baseline (GB/s rows: > 1 is better; time and bytes rows: < 1 is better)'
unset key
set yrange [-1:{len(rows)}]
set arrow from 1, graph 0 to 1, graph 1 nohead lc rgb 'black'
# boxxyerror columns: x y xlow xhigh ylow yhigh; a bar from 1 to the ratio
plot '{dat}' using (1):1:(($2>1)?1:$2):(($2>1)?$2:1):($1-0.35):($1+0.35):ytic(3) with boxxyerror
""")
        r = subprocess.run(["gnuplot", gp], capture_output=True, text=True)
        if r.returncode == 0:
            log(f"chart: {os.path.join(self.out, 'chart.png')}")
        else:
            log(f"gnuplot failed: {r.stderr.strip()[:300]}")

    def run(self, argv):
        self.argv = argv
        self.load0 = loadavg()
        self.sync = self.a.sync == "fsync"
        self.sync_name = ("write + fsync + close per file" if self.sync
                          else "write + close per file (no fsync)")
        self.writers = [int(x) for x in self.a.writers.split(",")]
        cases = [c.strip() for c in self.a.cases.split(",") if c.strip()]
        if "6" not in cases:
            self.notes.append("case 6 (growth at 1, 4, 16 GiB) skipped: run with --cases 6 "
                              "(sizes from --growth)")
        self.failed = []
        try:
            for c in cases:
                t0 = now()
                try:
                    getattr(self, f"case{c}")()
                except (OSError, RuntimeError, subprocess.CalledProcessError, ValueError) as e:
                    import traceback
                    traceback.print_exc()
                    self.failed.append(c)
                    self.notes.append(f"case {c} FAILED: {type(e).__name__}: {e}")
                    log(f"case {c} FAILED: {e}")
                    cleanup_mounts()
                    continue
                log(f"case {c} done in {now() - t0:.0f} s (load average {loadavg():.2f})")
        finally:
            cleanup_mounts()
            left = mounts_under(self.work)
            if left:
                self.notes.append(f"mounts left under {self.work}: {left}; not deleted")
            elif not self.a.keep:
                rmtree(self.work)
        self.report()


def main(argv):
    ap = argparse.ArgumentParser(prog="tools/bench/run", description=(
        "ckptfs vs its baselines: save, incremental save, store size vs borg/restic, views, "
        "metadata scale, growth. Prints a table of medians and ratios, saves results.csv."))
    ap.add_argument("--size", type=float, default=4.0,
                    help="GiB of the checkpoint of cases 1 and 2 (default 4, the issue's case 1)")
    ap.add_argument("--small-size", type=float, default=None,
                    help="GiB per step of cases 3 and 4 (default 0.5, or size/4 when --size "
                         "is below 2)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each A/B pair (3)")
    ap.add_argument("--cases", default="1,2,3,4,5", help="comma-separated cases 1-6 (1,2,3,4,5)")
    ap.add_argument("--writers", default="1,2,8", help="parallel writers of case 1 (1,2,8)")
    ap.add_argument("--sync", choices=("fsync", "close"), default="fsync",
                    help="end every saved file with fsync+close (default, like "
                         "torch.distributed.checkpoint) or close only")
    ap.add_argument("--meta-files", type=int, default=20000,
                    help="stored files for ls -lR/stat of case 5 (20000; the issue's 100000)")
    ap.add_argument("--growth", default="1,4,16", help="GiB sizes of case 6 (1,4,16)")
    ap.add_argument("--out", default="/var/tmp/ckptfs-bench",
                    help="results, logs, binaries, work dir (default /var/tmp/ckptfs-bench)")
    ap.add_argument("--data", default=None,
                    help="generated data cache (default OUT/data; reused when it matches)")
    ap.add_argument("--ckptfs", default=None, help="daemon binary (default fs/ckptfs)")
    ap.add_argument("--ckpt", default=None, help="ckpt binary (default tools/ckpt)")
    ap.add_argument("--ckptfs-opts", default="", help="extra -o options for ckptfs")
    ap.add_argument("--keep", action="store_true", help="keep OUT/work")
    a = ap.parse_args(argv)
    if a.small_size is None:
        a.small_size = 0.5 if a.size >= 2 else max(0.25, a.size / 4)
    if a.reps < 1:
        ap.error("--reps must be >= 1")
    if not all(c.strip() in ("1", "2", "3", "4", "5", "6") for c in a.cases.split(",")):
        ap.error("--cases takes numbers 1-6, e.g. 1,4")
    try:
        ws = [int(x) for x in a.writers.split(",")]
        gs = [float(x) for x in a.growth.split(",")]
    except ValueError:
        ap.error("--writers and --growth take comma-separated numbers")
    if a.size <= 0 or a.small_size <= 0 or min(ws) < 1 or min(gs) <= 0 or a.meta_files < 1:
        ap.error("sizes, writer and file counts must be positive")
    b = Bench(a)
    b.setup()
    b.run(argv)
    return 1 if b.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
