#!/usr/bin/env python3
"""Trainer checkpoint benchmark: ckptfs.save/ckptfs.load against the real peers from PyPI, in
the same run, alternating, medians over repetitions.

    tools/bench/trainer_bench.py [--size GiB] [--ddp-size GiB] [--reps N] [--kinds fsdp2,ddp]
                                 [--methods ckptfs_one,dcp,...] [--ckptfs-view auto|source]
                                 [--no-stored | --no-saves] [--out DIR] [--dir DIR]

One state (GPT-style bf16 weights + fp32 AdamW moments, --size GiB in all, weights and moments
together) on --ranks gloo processes on the CPU, under FSDP2 (fully_shard) and DDP (--ddp-size
GiB, default half of --size: every rank holds it whole), saved by:
    ckptfs_one / ckptfs_all  ckptfs.save into a ckptfs mount (replicas="one" / "all"; the two
                             differ only for DDP, where every tensor is a replica)
    dcp / dcp_async          torch.distributed.checkpoint save / async_save, plain directory
    bcp                      bytecheckpoint.save(..., fast_saving=True), plain directory
    torch_save               torch.save of each rank's local tensors, plain directory
Measured per method (each save in a fresh process group, after one untimed warm-up save):
    stall     the save call: how long the training loop is blocked (slowest rank)
    durable   from the save call until files are fsynced and the checkpoint marked complete
    load      saved on --ranks, loaded on --load-ranks, page cache dropped (and the ckptfs
              mount remounted) first: until every rank holds its tensors
    cold read the floor of that load: page cache dropped, every file of the timed checkpoint
              read whole by --load-ranks threads (ckptfs: through the mount after a remount,
              its saved files and then its view tp1_pp1)
    stored    bytes on disk after 3 saves with half the layers frozen (their weights and Adam
              state unchanged, half of the bytes) (du of the directory; ckptfs: 'ckpt stat'
              stored bytes of a fresh store)
    hwm       peak resident memory of a rank during the save phase (VmHWM), and the part above
              the trained state (VmHWM reset after the build: extra)
    memcpy    the floor: one copy of the rank's bytes into warm memory, all ranks at once
Prints a table with the ratios the targets name, writes OUT/results.csv and OUT/samples.csv.
Needs root (drop_caches, FUSE), fs/ckptfs and tools/ckpt built, and ./.venv (tools/setup.sh)."""

import argparse
import csv
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from bench import unmount  # noqa: E402  (the suite's unmount sequence)
VENV_PY = os.path.join(TOP, ".venv", "bin", "python")
WORKER = os.path.join(HERE, "trainer", "worker.py")
CKPTFS = os.path.join(TOP, "fs", "ckptfs")
CKPT = os.path.join(TOP, "tools", "ckpt")
LIBCKPTFS = os.path.join(TOP, "core", "trainer", ".libs", "libckptfs.so")

ALL_METHODS = ["ckptfs_one", "ckptfs_all", "dcp", "dcp_async", "bcp", "torch_save"]
PEERS = ["dcp", "dcp_async", "bcp", "torch_save"]
GiB = 1 << 30
# the "fixed amount" of the host-memory target: the library, its threads' stacks and the
# Python-side descriptors, whatever the state's size
FIXED_BYTES = 64 << 20


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def cold_read(d, readers):
    """Drops the page cache, then reads every regular file under `d` with `readers` threads
    (files dealt out largest first to the least loaded reader), 8 MiB at a time into a reused
    buffer.  Returns (seconds, bytes): the plain sequential-read floor of those bytes."""
    import threading
    files = []
    for root, _, names in os.walk(d):
        for n in names:
            fp = os.path.join(root, n)
            if os.path.isfile(fp) and not os.path.islink(fp):
                files.append((os.path.getsize(fp), fp))
    files.sort(reverse=True)
    shares = [[0, []] for _ in range(readers)]
    for sz, fp in files:
        sh = min(shares, key=lambda x: x[0])
        sh[0] += sz
        sh[1].append(fp)
    done = [0] * readers

    def read(i):
        buf = bytearray(8 << 20)
        mv = memoryview(buf)
        for fp in shares[i][1]:
            with open(fp, "rb", buffering=0) as f:
                while True:
                    n = f.readinto(mv)
                    if not n:
                        break
                    done[i] += n
    drop_caches()
    t0 = time.monotonic()
    ts = [threading.Thread(target=read, args=(i,)) for i in range(readers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.monotonic() - t0, sum(done)


def du_bytes(path):
    """Allocated bytes under path (du -sB1): what the directory costs on disk."""
    r = subprocess.run(["du", "-sB1", path], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"du {path}: {r.stderr.strip()}")
    return int(r.stdout.split()[0])


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


class Mount:
    """fs/ckptfs STORE MNT -f, run by us so that its pid is known; stop() unmounts."""

    def __init__(self, store, mnt, logf):
        self.store, self.mnt, self.logf, self.proc = store, mnt, logf, None

    def start(self):
        os.makedirs(self.mnt, exist_ok=True)
        with open(self.logf, "ab") as lf:
            self.proc = subprocess.Popen([CKPTFS, self.store, self.mnt, "-f"], stdout=lf,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        t0 = time.monotonic()
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None:
                raise RuntimeError(f"ckptfs exited ({self.proc.returncode}) before mounting "
                                   f"{self.mnt}; see {self.logf}")
            if time.monotonic() - t0 > 60:
                self.stop()
                raise RuntimeError(f"ckptfs did not mount {self.mnt} within 60 s")
            time.sleep(0.02)
        LIVE.append(self)
        return self

    def stop(self):
        if self.proc is None:
            return
        unmount(self.mnt)
        try:
            self.proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self in LIVE:
            LIVE.remove(self)
        self.proc = None


LIVE = []
GROUPS = []


def cleanup(*_):
    for procs in list(GROUPS):
        for p in procs:
            if p.poll() is None:
                p.kill()
    for m in list(LIVE):
        try:
            m.stop()
        except Exception as e:  # noqa: BLE001 - best effort at exit
            log(f"cleanup of {m.mnt}: {e}")


def run_group(cfg, world, outdir, tag, timeout):
    """Runs the worker on `world` ranks; returns the per-rank result dicts.  When a rank fails,
    the others (stuck in a collective) are ended after a grace period."""
    prefix = os.path.join(outdir, "runs", tag)
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    for r in range(world):
        try:
            os.unlink(f"{prefix}.r{r}.json")
        except FileNotFoundError:
            pass
    cfg = dict(cfg, out=prefix, timeout=timeout)
    port = free_port()
    procs = []
    logf = open(prefix + ".log", "wb")
    for r in range(world):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([VENV_PY, WORKER, json.dumps(cfg)], env=env,
                                      stdout=logf, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL))
    logf.close()
    GROUPS.append(procs)
    t0 = time.monotonic()
    failed_at = None
    while any(p.poll() is None for p in procs):
        if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > 30:
            break
        if time.monotonic() - t0 > timeout:
            break
        time.sleep(0.1)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    GROUPS.remove(procs)
    res = []
    for r in range(world):
        try:
            with open(f"{prefix}.r{r}.json") as f:
                res.append(json.load(f))
        except (OSError, ValueError):
            res.append({"rank": r, "error": f"rank {r} left no result "
                        f"(exit {procs[r].returncode}; log {prefix}.log)"})
    return res


def first_error(res):
    for r in res:
        if r.get("error"):
            return f"rank {r['rank']}: {r['error']}"
    return None


def ckpt_stat_stored(store):
    """'stored bytes' of `tools/ckpt stat STORE` (works while mounted)."""
    r = subprocess.run([CKPT, "stat", store], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ckpt stat {store}: {r.stderr.strip()}")
    for line in r.stdout.splitlines():
        k, _, v = line.partition(":")
        if k.strip() in ("stored_bytes", "stored"):
            return int(v.split()[0])
    raise RuntimeError(f"ckpt stat {store}: no stored_bytes line in:\n{r.stdout}")


def settle_compression(store, limit=300):
    """Waits (at most `limit` s) until the mounted store has no background compression
    pending."""
    import ckptfs_adapter
    if not ckptfs_adapter.settle(CKPT, store, limit):
        log(f"  warning: {store}: compression still pending after {limit} s")


def snapshot_binaries(out):
    """Copies fs/ckptfs, tools/ckpt and libckptfs.so to OUT/bin, so a rebuild during the run
    cannot mix versions; the workers load the copied library ($CKPTFS_LIBRARY).  Returns a line
    naming the copies' SHA-256 prefixes and the git revision."""
    global CKPTFS, CKPT
    import hashlib
    bindir = os.path.join(out, "bin")
    os.makedirs(bindir, exist_ok=True)
    parts = []
    for src in (CKPTFS, CKPT, LIBCKPTFS):
        if not os.path.exists(src):
            continue
        dst = os.path.join(bindir, os.path.basename(src))
        shutil.copy2(os.path.realpath(src), dst)
        with open(dst, "rb") as f:
            parts.append(f"{os.path.basename(src)} {hashlib.sha256(f.read()).hexdigest()[:12]}")
    CKPTFS = os.path.join(bindir, "ckptfs")
    CKPT = os.path.join(bindir, "ckpt")
    if os.path.exists(os.path.join(bindir, "libckptfs.so")):
        os.environ["CKPTFS_LIBRARY"] = os.path.join(bindir, "libckptfs.so")
    rev = subprocess.run(["git", "-C", TOP, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", TOP, "status", "--porcelain", "--", "core", "fs",
                            "tools/ckpt.c", "tools/bench"], capture_output=True,
                           text=True).stdout.strip()
    return (f"binaries: {', '.join(parts)}; git {rev}"
            f"{' (uncommitted changes in core/, fs/ or tools/)' if dirty else ''}")


class Bench:
    def __init__(self, a):
        self.a = a
        self.samples = []  # (kind, method, metric, rep, value)
        self.errors = {}   # (kind, method, phase) -> exact error
        self.notes = {}
        self.extra = {}    # (kind, metric) -> value (floor, rank bytes)
        self.out = a.out
        os.makedirs(self.out, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="trainer-bench-", dir=a.dir)
        from_state = os.path.join(HERE, "trainer")
        sys.path.insert(0, from_state)

    def cfg(self, kind, phase, method, d):
        hidden, layers = self.shapes[kind]
        return {"phase": phase, "method": method, "kind": kind, "hidden": hidden,
                "layers": layers, "dir": d, "top": TOP,
                "replicas": "all" if method == "ckptfs_all" else "one",
                "ckptfs_view": self.a.ckptfs_view, "ckpt": CKPT,
                "store": os.path.join(os.path.dirname(d), "store")}

    def where(self, method, label):
        """(checkpoint dir, mount or None) for one run of `method`."""
        base = os.path.join(self.work, f"{method}-{label}")
        shutil.rmtree(base, ignore_errors=True)
        os.makedirs(base)
        if method.startswith("ckptfs"):
            m = Mount(os.path.join(base, "store"), os.path.join(base, "mnt"),
                      os.path.join(self.out, "ckptfs.log")).start()
            return base, os.path.join(base, "mnt"), m
        return base, os.path.join(base, "dir"), None

    def add(self, kind, method, metric, rep, value):
        self.samples.append((kind, method, metric, rep, value))
        # kept as they come, so an interrupted run leaves what it measured
        with open(os.path.join(self.out, "samples.partial.csv"), "a", newline="") as f:
            csv.writer(f).writerow((kind, method, metric, rep, value))

    def record_error(self, kind, method, phase, err):
        key = (kind, method, phase)
        if key not in self.errors:
            self.errors[key] = err
            log(f"  {kind} {method} {phase}: FAILED: {err}")

    def save_and_load(self, kind, method, rep):
        base, d, m = self.where(method, f"{kind}-r{rep}")
        try:
            os.makedirs(d, exist_ok=True)
            res = run_group(self.cfg(kind, "save", method, d), self.a.ranks, self.out,
                            f"{kind}-{method}-save-r{rep}", self.a.timeout)
            err = first_error(res)
            if err:
                self.record_error(kind, method, "save", err)
                return
            self.add(kind, method, "stall", rep, max(r["stall"] for r in res))
            self.add(kind, method, "durable", rep, max(r["durable"] for r in res))
            self.add(kind, method, "hwm", rep, max(r["hwm"] for r in res))
            self.add(kind, method, "extra", rep, max(r["hwm"] - r["rss_base"] for r in res))
            self.extra[(kind, "rank_bytes")] = max(r["rank_bytes"] for r in res)
            if res[0].get("note"):
                self.notes[(kind, method)] = res[0]["note"]
            self.add(kind, method, "rank_bytes", rep, max(r["rank_bytes"] for r in res))
            sums = res[0]["sums"]
            if m is not None:
                # The load reads the checkpoint at rest: the daemon's background compression of
                # the timed save done (a job reloads minutes after it saved; the peers' files
                # are at rest once their fsync returned).
                settle_compression(m.store)
                m.stop()
                m.start()
            # the floor of any load that reads these bytes: a cold plain read of the saved
            # files by as many readers as load ranks (ckptfs: through the mount)
            secs, nbytes = cold_read(os.path.join(d, "ckpt"), self.a.load_ranks)
            self.add(kind, method, "coldread", rep, secs)
            self.add(kind, method, "coldread_bytes", rep, nbytes)
            if m is not None:
                # and the consolidated view ckptfs.load reads for these targets
                m.stop()
                m.start()
                secs, nbytes = cold_read(os.path.join(d, "tp1_pp1", "ckpt"), self.a.load_ranks)
                self.add(kind, method, "coldview", rep, secs)
                self.add(kind, method, "coldview_bytes", rep, nbytes)
            if m is not None:
                # a cold load: the daemon's own caches go with it
                m.stop()
                m.start()
            res = run_group(self.cfg(kind, "load", method, d), self.a.load_ranks, self.out,
                            f"{kind}-{method}-load-r{rep}", self.a.timeout)
            err = first_error(res)
            if err:
                self.record_error(kind, method, "load", err)
                return
            got = res[0]["sums"]
            # float64 sums over other shard boundaries agree to ~1e-12; a load that missed
            # data (the target starts from other random values) is off by far more than 1e-3
            bad = [k for k, v in sums.items()
                   if not abs(got.get(k, float("nan")) - v) <= 1e-3 * max(1.0, abs(v))]
            inexact = [k for k, v in sums.items() if k not in bad
                       and abs(got[k] - v) > 1e-9 * max(1.0, abs(v))]
            if inexact:
                why = (" (its load goes through torch's Optimizer.load_state_dict, which casts "
                       "the fp32 moments to the parameters' bf16 dtype)" if method == "bcp" else "")
                self.notes[(kind, method + " load")] = (
                    f"loaded values are not bit-identical in {len(inexact)} tensors, e.g. "
                    f"{inexact[0]}: saved sum {sums[inexact[0]]!r}, loaded "
                    f"{got[inexact[0]]!r}{why}")
            if bad:
                self.record_error(kind, method, "load",
                                  f"loaded values differ from the saved ones in {len(bad)} "
                                  f"tensors, e.g. {bad[0]}: saved sum {sums[bad[0]]!r}, "
                                  f"loaded {res[0]['sums'].get(bad[0])!r}")
                return
            self.add(kind, method, "load", rep, res[0]["load"])
        finally:
            if m is not None:
                m.stop()
            shutil.rmtree(base, ignore_errors=True)

    def stored(self, kind, method):
        base, d, m = self.where(method, f"{kind}-stored")
        try:
            os.makedirs(d, exist_ok=True)
            res = run_group(self.cfg(kind, "stored", method, d), self.a.ranks, self.out,
                            f"{kind}-{method}-stored", self.a.timeout)
            err = first_error(res)
            if err:
                self.record_error(kind, method, "stored", err)
                return
            if m is not None:
                store = os.path.join(base, "store")
                settle_compression(store)
                m.stop()  # everything flushed as it would be at rest
                v = ckpt_stat_stored(store)
            else:
                os.sync()
                v = du_bytes(d)
            self.add(kind, method, "stored", 0, v)
            self.extra[(kind, "state_bytes")] = sum(r["rank_bytes"] for r in res)
        finally:
            if m is not None:
                m.stop()
            shutil.rmtree(base, ignore_errors=True)

    def floor(self, kind, rep):
        res = run_group(self.cfg(kind, "floor", "none", self.work), self.a.ranks, self.out,
                        f"{kind}-floor-r{rep}", self.a.timeout)
        err = first_error(res)
        if err:
            self.record_error(kind, "memcpy", "floor", err)
            return
        self.add(kind, "memcpy", "stall", rep, max(r["memcpy"] for r in res))
        self.add(kind, "memcpy", "hwm", rep, max(r["hwm"] for r in res))
        self.add(kind, "memcpy", "extra", rep, max(r["hwm"] - r["rss_base"] for r in res))
        self.extra[(kind, "rank_bytes")] = max(r["rank_bytes"] for r in res)

    def run(self):
        # as torchrun does with several processes per node: one intra-op thread per rank
        # (OMP_NUM_THREADS=1), the same for every method
        import state as st
        a = self.a
        self.shapes = {"fsdp2": st.shape_for(a.size * GiB, a.hidden),
                       "ddp": st.shape_for(a.ddp_size * GiB, a.hidden)}
        desc = "; ".join(f"{k} {sz:g} GiB (hidden {self.shapes[k][0]}, {self.shapes[k][1]} "
                         f"layers)" for k, sz in (("fsdp2", a.size), ("ddp", a.ddp_size))
                         if k in a.kinds)
        log(f"trainer bench: state of bf16 weights + fp32 AdamW moments: {desc}; saved on "
            f"{a.ranks} ranks, loaded on {a.load_ranks}; "
            f"methods {','.join(a.methods)}; kinds {','.join(a.kinds)}; {a.reps} reps; "
            f"work dir {self.work}; load average {loadavg():.2f}")
        self.bins = snapshot_binaries(self.out)
        log(self.bins)
        self.load_before = loadavg()
        t0 = time.monotonic()
        for kind in a.kinds:
            methods = [m for m in a.methods if not (kind == "fsdp2" and m == "ckptfs_all")]
            for rep in range(0 if a.no_saves else a.reps):
                # alternate: each round starts one method later
                order = methods[rep % len(methods):] + methods[:rep % len(methods)]
                self.floor(kind, rep)
                for m in order:
                    log(f"[{time.monotonic() - t0:6.0f} s] {kind} round {rep + 1}/{a.reps}: {m}")
                    self.save_and_load(kind, m, rep)
            if not a.no_stored:
                for m in methods:
                    log(f"[{time.monotonic() - t0:6.0f} s] {kind} stored bytes: {m}")
                    self.stored(kind, m)
        self.load_after = loadavg()
        self.report()

    def med(self, kind, method, metric):
        xs = [v for k, m, me, _, v in self.samples if (k, m, me) == (kind, method, metric)]
        return statistics.median(xs) if xs else None

    def report(self):
        a = self.a
        lines = []
        hdr = (f"{'kind':6} {'method':11} {'stall s':>9} {'durable s':>10} {'load s':>8} "
               f"{'cold read s':>11} "
               f"{'stored GiB':>10} {'hwm GiB':>8} {'extra GiB':>9}")
        lines.append(hdr)
        for kind in a.kinds:
            for m in ["memcpy"] + [x for x in a.methods
                                   if not (kind == "fsdp2" and x == "ckptfs_all")]:
                def f(metric, scale=1.0, w=9, p=3):
                    v = self.med(kind, m, metric)
                    return f"{v / scale:{w}.{p}f}" if v is not None else f"{'-':>{w}}"
                lines.append(f"{kind:6} {m:11} {f('stall')} {f('durable', w=10)} "
                             f"{f('load', w=8)} {f('coldread', w=11)} "
                             f"{f('stored', GiB, 10)} {f('hwm', GiB, 8)} "
                             f"{f('extra', GiB, 9)}")
        lines.append("")
        lines += self.targets()
        if self.notes:
            lines.append("")
            for (kind, m), n in self.notes.items():
                lines.append(f"note {kind} {m}: {n}")
        if self.errors:
            lines.append("")
            for (kind, m, ph), e in self.errors.items():
                lines.append(f"error {kind} {m} {ph}: {e}")
        lines.append("")
        lines.append(f"load average {self.load_before:.2f} at start, {self.load_after:.2f} "
                     f"at end ({os.cpu_count()} CPUs); {self.bins}")
        text = "\n".join(lines)
        print(text)
        with open(os.path.join(self.out, "results.txt"), "w") as f:
            f.write(" ".join(sys.argv) + "\n\n" + text + "\n")
        with open(os.path.join(self.out, "samples.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["kind", "method", "metric", "rep", "value"])
            w.writerows(self.samples)
        with open(os.path.join(self.out, "results.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["kind", "method", "metric", "median", "n"])
            for kind in a.kinds:
                for m in ["memcpy"] + a.methods:
                    for metric in ("stall", "durable", "load", "coldread", "coldread_bytes",
                                   "coldview", "coldview_bytes", "stored", "hwm", "extra"):
                        xs = [v for k, mm, me, _, v in self.samples
                              if (k, mm, me) == (kind, m, metric)]
                        if xs:
                            w.writerow([kind, m, metric, statistics.median(xs), len(xs)])
            for (kind, m, ph), e in self.errors.items():
                w.writerow([kind, m, f"error:{ph}", e, 0])
        try:
            os.unlink(os.path.join(self.out, "samples.partial.csv"))
        except FileNotFoundError:
            pass
        log(f"results in {self.out}/results.txt, results.csv, samples.csv")

    def targets(self):
        """The issue's targets, each as measured/reference = ratio against its bound."""
        out = ["targets (ckptfs = the faster of ckptfs_one/ckptfs_all; best peer = the peer "
               "with the lowest median):"]
        for kind in self.a.kinds:
            cks = [m for m in ("ckptfs_one", "ckptfs_all") if m in self.a.methods]

            def best(metric, methods):
                vals = [(self.med(kind, m, metric), m) for m in methods]
                vals = [x for x in vals if x[0] is not None]
                return min(vals) if vals else (None, None)

            def line(name, metric, bound, ref, refname, cmp="<="):
                v, who = best(metric, cks)
                if v is None or ref is None:
                    out.append(f"  {kind} {name}: not measured "
                               f"({'ckptfs' if v is None else refname} missing)")
                    return
                ratio = v / ref
                ok = ratio <= bound if cmp == "<=" else ratio >= bound
                unit = "s"
                if metric == "stored":
                    v, ref, unit = v / GiB, ref / GiB, "GiB"
                out.append(f"  {kind} {name}: {who} {v:.3f} {unit} / {refname} {ref:.3f} {unit} = "
                           f"{ratio:.3f} (target {cmp} {bound:g}) {'MET' if ok else 'NOT MET'}")

            sp, spn = best("stall", PEERS)
            line("stall vs best peer", "stall", 0.5, sp, f"{spn}")
            line("stall vs memcpy", "stall", 1.2, self.med(kind, "memcpy", "stall"), "memcpy")
            dp, dpn = best("durable", PEERS)
            line("durable vs best peer", "durable", 1.0, dp, f"{dpn}")
            lp, lpn = best("load", PEERS)
            if lp is not None:
                v, who = best("load", cks)
                if v is not None:
                    sp_ = lp / v
                    out.append(f"  {kind} resharded load speed-up: {lpn} {lp:.3f} / {who} "
                               f"{v:.3f} = {sp_:.2f}x (target >= 2) "
                               f"{'MET' if sp_ >= 2 else 'NOT MET'}")
                else:
                    out.append(f"  {kind} resharded load: not measured (ckptfs missing)")
            else:
                out.append(f"  {kind} resharded load: not measured (no peer)")
            for m in [x for x in self.a.methods if not (kind == "fsdp2" and x == "ckptfs_all")]:
                ld, cr = self.med(kind, m, "load"), self.med(kind, m, "coldread")
                nb = self.med(kind, m, "coldread_bytes")
                if ld and cr and nb:
                    out.append(f"  {kind} {m} load / cold read of its files: {ld:.3f} / {cr:.3f} "
                               f"= {ld / cr:.2f} ({nb / GiB:.3f} GiB at "
                               f"{nb / cr / 1e9:.2f} GB/s)")
                cv, vb = self.med(kind, m, "coldview"), self.med(kind, m, "coldview_bytes")
                if ld and cv and vb:
                    out.append(f"  {kind} {m} load / cold read of its view tp1_pp1: {ld:.3f} / "
                               f"{cv:.3f} = {ld / cv:.2f} ({vb / GiB:.3f} GiB at "
                               f"{vb / cv / 1e9:.2f} GB/s)")
            bp, bpn = best("stored", PEERS)
            line("stored bytes vs best peer", "stored", 0.7, bp, f"{bpn}")
            rb = self.extra.get((kind, "rank_bytes"))
            if rb:
                v, who = best("extra", cks)
                if v is not None:
                    # the trained state itself lives in host memory here (CPU training), so the
                    # bound applies to what saving adds on top of it (VmHWM reset after the
                    # build); the fixed amount allowed is FIXED_BYTES
                    bound = 1.2 * rb + FIXED_BYTES
                    out.append(f"  {kind} host memory per rank: {who} adds {v / GiB:.3f} GiB "
                               f"over the trained state = {v / rb:.2f} x rank bytes "
                               f"({rb / GiB:.3f} GiB); bound 1.2 x rank bytes + "
                               f"{FIXED_BYTES >> 20} MiB = {bound / GiB:.3f} GiB "
                               f"{'MET' if v <= bound else 'NOT MET'}")
                else:
                    out.append(f"  {kind} host memory per rank: not measured (ckptfs missing)")
        return out


def main():
    if os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(TOP, ".venv")) \
            and os.access(VENV_PY, os.X_OK) and not os.environ.get("TRAINER_BENCH_REEXEC"):
        # the driver needs torch (the state's shape) and runs with the project's venv
        os.environ["TRAINER_BENCH_REEXEC"] = "1"
        os.execv(VENV_PY, [VENV_PY] + sys.argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=float, default=2.0,
                   help="GiB of state in all, bf16 weights + fp32 moments (default 2)")
    p.add_argument("--ddp-size", type=float, default=None,
                   help="GiB of state for DDP, held whole by every rank (default: half of "
                   "--size, so that 4 replicas and their staging copies fit in memory)")
    p.add_argument("--hidden", type=int, default=None, help="hidden size (default: from --size)")
    p.add_argument("--reps", type=int, default=3, help="rounds per method (default 3)")
    p.add_argument("--ranks", type=int, default=4, help="ranks that save (default 4)")
    p.add_argument("--load-ranks", type=int, default=2, help="ranks that load (default 2)")
    p.add_argument("--kinds", default="fsdp2,ddp", help="fsdp2,ddp (default both)")
    p.add_argument("--methods", default=",".join(ALL_METHODS),
                   help=f"subset of {','.join(ALL_METHODS)}")
    p.add_argument("--ckptfs-view", default="auto", choices=["auto", "source", "consolidated"],
                   help="which directory ckptfs.load reads on the mount (default auto)")
    p.add_argument("--no-stored", action="store_true", help="skip the stored-bytes runs")
    p.add_argument("--no-saves", action="store_true",
                   help="only the stored-bytes runs (no timed saves, loads or memcpy floor)")
    p.add_argument("--out", default=None, help="results folder (default: a new temp folder)")
    p.add_argument("--dir", default=None,
                   help="where checkpoints and stores go (default: $TMPDIR; same disk for all)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per process group")
    a = p.parse_args()
    if a.ddp_size is None:
        a.ddp_size = a.size / 2
    a.kinds = [k for k in a.kinds.split(",") if k]
    a.methods = [m for m in a.methods.split(",") if m]
    for m in a.methods:
        if m not in ALL_METHODS:
            p.error(f"unknown method {m} (known: {','.join(ALL_METHODS)})")
    for k in a.kinds:
        if k not in ("fsdp2", "ddp"):
            p.error(f"unknown kind {k} (fsdp2 or ddp)")
    if os.geteuid() != 0:
        sys.exit("trainer_bench: must run as root (drop_caches, FUSE mounts)")
    if not os.access(VENV_PY, os.X_OK):
        sys.exit(f"trainer_bench: {VENV_PY} missing: run tools/setup.sh")
    if any(m.startswith("ckptfs") for m in a.methods):
        for exe in (CKPTFS, CKPT):
            if not os.access(exe, os.X_OK):
                sys.exit(f"trainer_bench: {exe} missing: run tools/setup.sh (or make)")
    a.out = a.out or tempfile.mkdtemp(prefix="trainer-bench-out-")
    signal.signal(signal.SIGTERM, lambda *_: (cleanup(), sys.exit(143)))
    signal.signal(signal.SIGINT, lambda *_: (cleanup(), sys.exit(130)))
    b = Bench(a)
    try:
        b.run()
    finally:
        cleanup()
        shutil.rmtree(b.work, ignore_errors=True)


if __name__ == "__main__":
    main()
