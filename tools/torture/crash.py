"""Crash rounds: kill -9 of the daemon (or of `ckpt gc`) at random points, then recovery and a
check of every file against what the crash model allows (workload.py).

Each round runs the crash workload in a new directory rN/ of one store and ends in a crash of
one of four variants:

timer       kill -9 after a random time while the workload runs;
point       the shim (libtorture.so) kills the daemon at the N-th call of one kind on one part
            of the store, just before or just after it: an fsync of a pack or of the
            write-ahead log, a pack's creation (pack rotation: the daemon runs with a small
            pack_max), a rename of RocksDB's CURRENT, an unlink, ...;
background  the workload stops, and the shim kills the daemon inside the background thread's
            compression or compaction (pack writes, syncs, unlinks once nothing else writes);
gc          the store is unmounted cleanly and `ckpt gc` is killed by the shim at one of its
            writes, syncs, renames or unlinks (then `ckpt fsck` must pass).

The next mount then checks rN/ against the events (kill model; for gc, after the clean
unmount, exactly the final state), and every earlier round's directory against the state it
was found in (nothing may change later).  Round directories older than KEEP rounds are
deleted (and the deletion fsynced) before a new round starts.
"""
import errno
import os
import shutil
import time

import workload
from tlib import Ctl, Daemon, Failure, fsync_dir, log, preload, tree_state, unmount

KEEP = 3
GC_ABOVE = 1 << 30


def dir_bytes(path):
    n = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                n += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return n

POINT_MENU = ["sync@pack", "sync@wal", "write@pack", "write@wal", "dirsync@any", "create@pack",
              "create@sst", "create@wal", "rename@current", "unlink@pack", "unlink@wal",
              "trunc@any", "write@sst", "write@manifest", "sync@manifest", "any@any"]
BG_MENU = ["write@pack", "sync@pack", "unlink@pack", "create@pack", "write@wal", "sync@any",
           "any@any"]
# inflight: a client operation during which the daemon is killed at the first call of a kind
INFLIGHT_MENU = [("rename", ["write@wal", "write@any", "any@any"]),
                 ("unlink", ["write@wal", "any@any"]),
                 ("fsync", ["sync@pack", "sync@wal", "write@wal", "write@pack", "any@any"]),
                 ("dirfsync", ["sync@wal", "write@wal", "sync@pack", "any@any"]),
                 ("create", ["write@wal", "any@any"])]
UNMOUNT_MENU = ["create@sst", "write@sst", "sync@sst", "write@manifest", "sync@manifest",
                "rename@current", "sync@pack", "write@wal", "sync@wal", "dirsync@any", "any@any"]
GC_MENU = ["write@pack", "sync@pack", "unlink@pack", "create@pack", "write@wal", "sync@wal",
           "create@sst", "write@sst", "rename@current", "unlink@any", "any@any"]


def class_count(counts, cls):
    """How many of counts ({"op@area": n}) match the kill class cls ("op@area", "any")."""
    op, area = cls.split("@")
    return sum(v for k, v in counts.items()
               if (op == "any" or k.startswith(op + "@")) and
               (area == "any" or k.endswith("@" + area) or
                (area == "index" and k.split("@")[1] in ("wal", "sst", "manifest", "current",
                                                          "index"))))


def compare_refs(mnt, refs, kind, stats):
    """Every earlier round's directory must hold exactly what it held when it was checked."""
    for rel, want in sorted(refs.items()):
        got = tree_state(os.path.join(mnt, rel))
        lost = wrong = 0
        for p in sorted(set(want) | set(got)):
            w, g = want.get(p), got.get(p)
            if w == g:
                continue
            if g is None or g[0] == "err":
                lost += 1
            else:
                wrong += 1
            stats.fail(kind, f"{rel}/{p}: was {w}, now {g}")
        stats.add(kind, files_verified=len(want), lost=lost, wrong=wrong)


def final_state(wl):
    """{relpath: sha} of what the workload's threads last left (for checks after a clean
    unmount, when everything must have survived)."""
    out = {}
    for w in wl.workers:
        for name, ino in w.bound.items():
            out[os.path.join(w.rel, name)] = workload.sha(bytes(w.content[ino]))
    return out


def check_exact(mnt, rel, want, kind, stats):
    got = {}
    root = os.path.join(mnt, rel)
    for dirpath, _, filenames in os.walk(root):
        for n in filenames:
            p = os.path.join(dirpath, n)
            try:
                with open(p, "rb") as f:
                    got[os.path.relpath(p, mnt)] = workload.sha(f.read())
            except OSError as e:
                got[os.path.relpath(p, mnt)] = f"error {errno.errorcode.get(e.errno)}"
    lost = wrong = 0
    for p in sorted(set(want) | set(got)):
        if want.get(p) == got.get(p):
            continue
        if got.get(p) is None or got[p].startswith("error"):
            lost += 1
        else:
            wrong += 1
        stats.fail(kind, f"{p}: holds {got.get(p)}, want {want.get(p)} (after a clean unmount)")
    stats.add(kind, files_verified=len(set(want) | set(got)), lost=lost, wrong=wrong)


class CrashSuite:
    kind = "crash"

    def __init__(self, env, stats, tmp, threads=4, short=False):
        self.short = short
        self.env = env
        self.stats = stats
        self.dir = os.path.join(tmp, "crash")
        os.makedirs(self.dir, exist_ok=True)
        self.store = os.path.join(self.dir, "store")
        self.mnt = os.path.join(self.dir, "mnt")
        self.threads = threads
        self.refs = {}         # round dir -> tree_state when checked
        self.pending = None    # (rel, events or None, final state or None)
        self.seen = {}         # kill class -> most calls of it seen in one armed period
        self.n = 0
        self.daemon = None

    # ------------------------------------------------------------ helpers

    def start(self, rng, spec=None):
        opts = ["pack_max=" + rng.choice(["1M", "4M", "64M"])]
        if rng.random() < 0.25:
            opts.append("inline_compress")
        self.ctl = Ctl(os.path.join(self.dir, "ctl"))
        shim = {"TORTURE_CTL": self.ctl.path}
        if spec:
            shim["TORTURE_KILL"] = spec
        self.daemon = Daemon(self.env, self.store, self.mnt, opts,
                             logfile=os.path.join(self.dir, "daemon.log"), shim=shim)
        self.daemon.start()

    def verify_pending(self):
        if self.pending is None:
            return
        rel, events, exact = self.pending
        self.pending = None
        if exact is not None:
            check_exact(self.mnt, rel, exact, self.kind, self.stats)
        else:
            v, lost, wrong, msgs = workload.verify_tree(self.mnt, rel, events, "kill")
            self.stats.add(self.kind, files_verified=v, lost=lost, wrong=wrong)
            for m in msgs:
                self.stats.fail(self.kind, f"round {rel}: {m}")
        compare_refs(self.mnt, self.refs, self.kind, self.stats)
        self.refs[rel] = tree_state(os.path.join(self.mnt, rel))

    def drop_old(self):
        while len(self.refs) > KEEP:
            rel = min(self.refs, key=lambda r: int(r[1:]))
            shutil.rmtree(os.path.join(self.mnt, rel))
            del self.refs[rel]
        fsync_dir(self.mnt)

    def choose(self, rng, menu, phase):
        """A kill class from menu and N: uniform up to the most calls of that class seen in
        one phase (workload, background) of a round so far (20 until one was seen), so that
        kills land anywhere in it."""
        cls = rng.choice(menu)
        n = rng.randint(1, max(1, self.seen.get((phase, cls), 20)))
        return f"{cls}:{n}:{rng.choice(['before', 'after'])}", cls

    def note_counts(self, phase, menu, before, after):
        """Updates the calls seen per class of one phase with its counts (after - before)."""
        delta = {k: v - before.get(k, 0) for k, v in after.items()}
        for cls in menu:
            self.seen[(phase, cls)] = max(self.seen.get((phase, cls), 0),
                                          class_count(delta, cls))

    # ------------------------------------------------------------ a round

    def round(self, rng, budget_s):
        """Four crashes of random variants; --short: one crash of each variant."""
        if self.short:
            variants = ["point", "inflight", "background", "unmount", "gc", "timer"]
        else:
            variants = [rng.choice(["timer", "point", "point", "inflight", "inflight",
                                    "background", "unmount", "gc"]) for _ in range(4)]
        for v in variants:
            self.crash(rng, budget_s, v)

    def crash(self, rng, budget_s, variant):
        # Deleted rounds' chunks are only reclaimed by `ckpt gc` (the daemon's compaction
        # counts them as live): a plain gc of the crashed store once it holds 1 GiB of packs,
        # which also recovers it from the crash first.
        if dir_bytes(os.path.join(self.store, "packs")) > GC_ABOVE:
            rc, out = self.env.ckpt_run("gc", self.store)
            if rc != 0:
                raise Failure(f"ckpt gc of the crashed store exited {rc}:\n{out[-1500:]}")
            self.stats.add(self.kind, gc_runs=1)
        self.n += 1
        rel = f"r{self.n}"
        spec = cls = None
        if variant == "point":
            spec, cls = self.choose(rng, POINT_MENU, "workload")
        elif variant == "background":
            spec, cls = self.choose(rng, BG_MENU, "background")
        elif variant == "unmount":
            cls = rng.choice(UNMOUNT_MENU)
            spec = (f"{cls}:{rng.randint(1, max(1, self.seen.get('unmount ' + cls, 5)))}:"
                    f"{rng.choice(['before', 'after'])}")
        elif variant == "inflight":
            what, classes = rng.choice(INFLIGHT_MENU)
            cls = rng.choice(classes)
            spec = f"{cls}:1:{rng.choice(['before', 'after'])}"
        self.start(rng, spec)
        self.verify_pending()
        self.drop_old()
        events = workload.Events()
        wl = workload.Workload(self.mnt, rel, self.threads, rng, events, self.daemon)
        base0 = self.ctl.read()["counts"]
        fired = False
        if variant == "point":
            self.ctl.arm()
        wl.start()
        t_run = rng.uniform(0.5, max(0.6, min(1.5 if self.short else 4.0, budget_s)))
        if variant == "timer":
            time.sleep(t_run)
            self.daemon.kill9()
            wl.killed.set()
        elif variant == "point":
            fired = self.daemon.wait_exit(t_run + 2)
            wl.killed.set()
            self.daemon.kill9()
        else:
            time.sleep(t_run)
            wl.stop.set()
            wl.join()
            mid = self.ctl.read()["counts"]
            self.note_counts("workload", POINT_MENU, base0, mid)
            if variant == "background":
                self.ctl.arm()
                fired = self.daemon.wait_exit(rng.uniform(1.5, 4.0))
                if not fired:
                    self.note_counts("background", BG_MENU, mid, self.ctl.read()["counts"])
                wl.killed.set()
                self.daemon.kill9()
            elif variant == "unmount":
                fired = self.unmount_kill()
            elif variant == "inflight":
                fired = self.inflight(wl, what, rng)
                wl.killed.set()
                self.daemon.kill9()
                cls = f"{what}:{cls}"
            else:
                self.daemon.stop()
        wl.join()
        if variant in ("timer", "point"):
            self.note_counts("workload", POINT_MENU, base0, self.ctl.read()["counts"])
        if cls:
            fired = fired and bool(self.ctl.read()["fired"])
            self.stats.kill_point(f"{variant}:{cls}", fired)
        if wl.errors:
            for e in wl.errors:
                self.stats.fail(self.kind, f"round {rel}: error while the daemon ran: {e}")
        for m in wl.wrong_live:
            self.stats.fail(self.kind, f"round {rel}: {m}")
        self.stats.add(self.kind, rounds=1, operations=wl.ops, files_verified=wl.live_verified,
                       wrong=len(wl.wrong_live))
        self.stats.add(self.kind, **{f"variant_{variant}": 1})
        if variant == "gc":
            self.pending = (rel, None, final_state(wl))
            self.gc_round(rng)
        else:
            self.pending = (rel, events, None)
        if self.env.verbose:
            log(f"  crash {rel}: {variant} {spec or ''} fired={fired} ops={wl.ops}")

    def unmount_kill(self):
        """Unmounts with the kill point armed: the daemon dies in its shutdown (the last
        commits, pack syncs, RocksDB's memtable flush).  True when the kill point fired."""
        before = self.ctl.read()["counts"]
        self.ctl.arm()
        if not unmount(self.mnt, lazy_ok=False):
            raise Failure(f"cannot unmount {self.mnt} (busy)")
        self.daemon.wait_exit(60)
        st = self.ctl.read()
        if not st["fired"]:
            rc = self.daemon.proc.returncode
            if rc != 0:
                self.stats.fail(self.kind, f"daemon exited {rc} after unmount:\n"
                                f"{self.daemon.log_tail()}")
            delta = {k: v - before.get(k, 0) for k, v in st["counts"].items()}
            for c in UNMOUNT_MENU:
                self.seen["unmount " + c] = max(self.seen.get("unmount " + c, 0),
                                                class_count(delta, c))
        return bool(st["fired"])

    def inflight(self, wl, what, rng):
        """Runs one client operation with the kill point armed just before the call that
        matters (the rename, unlink, fsync, directory fsync, create), as worker 0.  True when
        the daemon died inside it."""
        w = wl.workers[0]
        names = [f"f{i}" for i in range(w.NAMES)]
        try:
            if what == "fsync":
                name = rng.choice(names)
                created = name not in w.bound
                ino = wl.new_inode() if created else w.bound[name]
                fd = w.step(("open", w.relp(name), ino, created, True),
                            lambda: os.open(w.path(name), os.O_RDWR | os.O_CREAT | os.O_TRUNC,
                                            0o644))
                w.bound[name] = ino
                w.content[ino] = bytearray(w.data(w.size()))
                w.write_all(fd, w.content[ino])
                self.ctl.arm()
                try:
                    w.step(("fsync", ino, w.h(ino)), lambda: os.fsync(fd))
                finally:
                    w.step(("close", ino, w.h(ino)), lambda: os.close(fd))
            else:
                if not w.bound or what == "create":
                    name = rng.choice([n for n in names if n not in w.bound] or names)
                    if what != "create":
                        w.op_write(name, False)
                self.ctl.arm()
                if what == "rename":
                    src = rng.choice(sorted(w.bound))
                    w.op_rename(src, rng.choice([n for n in names if n != src]))
                elif what == "unlink":
                    w.op_unlink(rng.choice(sorted(w.bound)))
                elif what == "dirfsync":
                    w.op_dirfsync()
                else:
                    w.op_write(name, False)
        except workload.DaemonGone:
            pass
        w.ops += 1
        return self.daemon.wait_exit(1.0)

    def gc_round(self, rng):
        """`ckpt gc` killed by the shim at a random call; then fsck must pass."""
        cls = rng.choice(GC_MENU)
        spec = (f"{cls}:{rng.randint(1, max(1, self.seen.get('gc ' + cls, 20)))}:"
                f"{rng.choice(['before', 'after'])}")
        ctl = Ctl(os.path.join(self.dir, "ctl.gc"))
        e = dict(os.environ, LD_PRELOAD=preload(self.env.ckpt, self.env.shim),
                 TORTURE_ROOT=os.path.realpath(self.store),
                 TORTURE_CTL=ctl.path, TORTURE_KILL=spec, TORTURE_ARMED="1")
        live = rng.choice(["80", "100"])
        rc, out = self.env.ckpt_run("gc", self.store, "--live", live, env=e)
        st = ctl.read()
        fired = bool(st["fired"])
        if not fired:
            for c in GC_MENU:
                self.seen["gc " + c] = max(self.seen.get("gc " + c, 0),
                                           class_count(st["counts"], c))
        self.stats.kill_point(f"gc:{cls}", fired)
        if not fired and rc != 0:
            self.stats.fail(self.kind, f"ckpt gc exited {rc} without being killed:\n{out}")
        rc, out = self.env.ckpt_run("fsck", self.store)
        if rc != 0:
            self.stats.fail(self.kind, f"ckpt fsck after ckpt gc was killed ({spec}) exited "
                            f"{rc}:\n{out[-2000:]}")

    def finish(self, rng):
        """Mount once more, check the last round, unmount cleanly, fsck."""
        if self.n == 0:
            return
        self.start(rng)
        self.verify_pending()
        self.daemon.stop()
        rc, out = self.env.ckpt_run("fsck", self.store)
        if rc != 0:
            self.stats.fail(self.kind, f"ckpt fsck at the end exited {rc}:\n{out[-2000:]}")

    def abort(self):
        if self.daemon is not None:
            try:
                self.daemon.kill9()
            except Failure:
                pass
