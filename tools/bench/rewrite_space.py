#!/usr/bin/python3
"""Space under rewrites (docs/performance.md, "Space under rewrites"): 1 MiB ranges of a set of
live files are rewritten at random (open, pwrite, close), in bursts separated by pauses, on a
mounted store with background work on.  Two configurations run side by side, both mounted at
once on fresh stores and fed the same files and rewrites, their bursts alternating:

  reclaim   the default: the background thread drops unreferenced and forgotten chunks and
            compaction reclaims their space (core/store/reclaim.c)
  keep      -o keep_unreferenced: background work keeps them (only `ckpt gc` reclaims them)

Per burst it measures the write throughput (rewritten MB/s, wall time from the first open to
the last close) and, during the pause that follows, the pack bytes against the live stored
bytes (`ckpt stat`) over time: at 1, 2 and 5 s into the pause and once they stop changing
(5 s unchanged, at most --pause s; "settle s" is when they reached that final value).  It prints medians over bursts and repetitions and writes
every sample to OUT/rewrite_space.csv.

    tools/bench/rewrite_space.py [--files N] [--file-mib M] [--bursts B] [--per-burst K]
                                 [--reps R] [--pause S] [--out DIR]

Needs fs/ckptfs and tools/ckpt built, /dev/fuse and fusermount3; no root.
"""
import argparse
import csv
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
MiB = 1 << 20
CONFIGS = {"reclaim": [], "keep": ["keep_unreferenced"]}
FIXED = 16 * MiB  # the fixed allowance of the bound: packs <= 2 x stored + FIXED


def stat(ckpt, store):
    out = subprocess.run([ckpt, "stat", store], capture_output=True, text=True, check=True).stdout
    return {k.strip(): v.strip() for k, v in (l.split(":", 1) for l in out.splitlines() if ":" in l)}


def packs_stored(ckpt, store):
    st = stat(ckpt, store)
    return int(st["pack_bytes"]), int(st["stored_bytes"])


class Mount:
    def __init__(self, ckptfs, store, mnt, opts, log):
        self.mnt = mnt
        os.makedirs(mnt, exist_ok=True)
        cmd = [ckptfs, store, mnt, "-f"] + (["-o", ",".join(opts)] if opts else [])
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        t0 = time.monotonic()
        while not os.path.ismount(mnt):
            if self.proc.poll() is not None or time.monotonic() - t0 > 60:
                self.stop()
                raise RuntimeError(f"ckptfs did not mount {mnt}")
            time.sleep(0.02)

    def stop(self):
        for _ in range(3):
            if not os.path.ismount(self.mnt):
                break
            if subprocess.run(["fusermount3", "-u", self.mnt], capture_output=True).returncode:
                time.sleep(1)
        if os.path.ismount(self.mnt):
            subprocess.run(["umount", "-l", self.mnt], capture_output=True)
        try:
            self.proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


STABLE_S = 5  # a pause has settled once the pack bytes did not change for this long


def pause_samples(ckpt, store, limit):
    """Samples (seconds into the pause, pack bytes, stored bytes) until the pack bytes stop
    changing for STABLE_S s (or limit s)."""
    t0 = time.monotonic()
    samples, last, since = [], None, t0
    while True:
        packs, stored = packs_stored(ckpt, store)
        now = time.monotonic()
        samples.append((now - t0, packs, stored))
        if packs != last:
            last, since = packs, now
        if now - since >= STABLE_S or now - t0 > limit:
            return samples
        time.sleep(0.25)


def at(samples, sec):
    """The last sample taken at or before sec into the pause."""
    best = samples[0]
    for s in samples:
        if s[0] <= sec:
            best = s
    return best


def burst_and_pause(a, config, mnt, store, rng, fsize):
    """One burst of rewrites on mnt, then its pause: the row of figures."""
    bufs = [(rng.randrange(a.files), rng.randrange(fsize - MiB), rng.randbytes(MiB))
            for _ in range(a.per_burst)]
    t0 = time.monotonic()
    for i, off, buf in bufs:
        fd = os.open(f"{mnt}/f{i}", os.O_WRONLY)
        os.pwrite(fd, buf, off)
        os.close(fd)
    dt = time.monotonic() - t0
    samples = pause_samples(a.ckpt, store, a.pause)
    row = {"config": config, "write_MBps": a.per_burst * MiB / dt / 1e6}
    for sec in (1, 2, 5):
        _, p, s = at(samples, sec)
        row[f"packs_{sec}s"], row[f"stored_{sec}s"] = p, s
    _, p, s = samples[-1]
    k = len(samples) - 1
    while k > 0 and samples[k - 1][1] == p:
        k -= 1
    row.update(packs_settled=p, stored_settled=s, settle_s=round(samples[k][0], 1))
    row["bound_ok"] = int(p <= 2 * s + FIXED)
    return row


def run_rep(a, rep, work, writer):
    """Both configurations mounted at once, on their own stores, fed the same rewrites; their
    bursts alternate (the order flips every burst), so that a change in the machine's load
    hits both alike."""
    shutil.rmtree(work, ignore_errors=True)
    fsize = a.file_mib * MiB
    mounts, rngs, rows = {}, {}, []
    try:
        for c in CONFIGS:
            store, mnt = os.path.join(work, c, "store"), os.path.join(work, c, "mnt")
            os.makedirs(os.path.dirname(store), exist_ok=True)
            with open(os.path.join(a.out, f"daemon-{c}-{rep}.log"), "ab") as log:
                mounts[c] = (Mount(a.ckptfs, store, mnt, CONFIGS[c], log), store, mnt)
            rngs[c] = random.Random(1000 + rep)  # the same files and rewrites
            for i in range(a.files):
                with open(f"{mnt}/f{i}", "wb") as f:
                    f.write(rngs[c].randbytes(fsize))
        for c in CONFIGS:
            pause_samples(a.ckpt, mounts[c][1], a.pause)
        for b in range(a.bursts):
            order = list(CONFIGS) if (rep + b) % 2 == 0 else list(reversed(CONFIGS))
            for c in order:
                _, store, mnt = mounts[c]
                row = burst_and_pause(a, c, mnt, store, rngs[c], fsize)
                row.update(rep=rep, burst=b)
                writer.writerow(row)
                rows.append(row)
                p, s = row["packs_settled"], row["stored_settled"]
                print(f"  {c:8} rep {rep} burst {b}: {row['write_MBps']:6.1f} MB/s; pause: "
                      f"packs/stored {p / max(s, 1):.2f} ({p / MiB:.0f}/{s / MiB:.0f} MiB) "
                      f"after {row['settle_s']:.1f} s", flush=True)
    finally:
        for m, _, _ in mounts.values():
            m.stop()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--file-mib", type=int, default=8)
    ap.add_argument("--bursts", type=int, default=6)
    ap.add_argument("--per-burst", type=int, default=96, help="1 MiB rewrites per burst")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pause", type=float, default=60, help="longest wait per pause (s)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--ckptfs", default=os.path.join(TOP, "fs/ckptfs"))
    ap.add_argument("--ckpt", default=os.path.join(TOP, "tools/ckpt"))
    a = ap.parse_args()
    a.out = a.out or tempfile.mkdtemp(prefix="rewrite_space-")
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="rewrite_space-work-")
    print(f"{a.files} files of {a.file_mib} MiB; {a.bursts} bursts of {a.per_burst} rewrites "
          f"of 1 MiB; {a.reps} reps; results in {a.out}", flush=True)
    rows = {c: [] for c in CONFIGS}
    with open(os.path.join(a.out, "rewrite_space.csv"), "w", newline="") as f:
        cols = ["config", "rep", "burst", "write_MBps", "packs_1s", "stored_1s", "packs_2s",
                "stored_2s", "packs_5s", "stored_5s", "packs_settled", "stored_settled",
                "settle_s", "bound_ok"]
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        try:
            for rep in range(a.reps):
                for row in run_rep(a, rep, work, w):
                    rows[row["config"]].append(row)
                f.flush()
        finally:
            shutil.rmtree(work, ignore_errors=True)

    med = statistics.median
    print(f"\nmedians over {a.reps} reps x {a.bursts} bursts (packs/stored = pack bytes / live "
          f"stored bytes; bound: packs <= 2 x stored + {FIXED >> 20} MiB)")
    print(f"{'config':8} {'write MB/s':>10} {'1 s':>6} {'2 s':>6} {'5 s':>6} {'settled':>8} "
          f"{'settle s':>9} {'bound held':>11}")
    for c, rs in rows.items():
        ratio = lambda k: med(r[f"packs_{k}"] / max(r[f"stored_{k}"], 1) for r in rs)  # noqa
        print(f"{c:8} {med(r['write_MBps'] for r in rs):10.1f} {ratio('1s'):6.2f} "
              f"{ratio('2s'):6.2f} {ratio('5s'):6.2f} {ratio('settled'):8.2f} "
              f"{med(r['settle_s'] for r in rs):9.1f} "
              f"{sum(r['bound_ok'] for r in rs):>5}/{len(rs)}")
    print("\nsettled pack MiB after each burst (median over reps; live stored MiB in brackets)")
    for c, rs in rows.items():
        line = []
        for b in range(a.bursts):
            rb = [r for r in rs if r["burst"] == b]
            line.append(f"{med(r['packs_settled'] for r in rb) / MiB:.0f} "
                        f"[{med(r['stored_settled'] for r in rb) / MiB:.0f}]")
        print(f"{c:8} " + "  ".join(line))
    if rows["reclaim"]:
        r = med(x["write_MBps"] for x in rows["reclaim"])
        k = med(x["write_MBps"] for x in rows["keep"])
        pairs = [x["write_MBps"] / y["write_MBps"] for x, y in zip(rows["reclaim"], rows["keep"])]
        print(f"\nwrite throughput reclaim/keep: {r / k:.3f} (ratio of medians); median of the "
              f"{len(pairs)} paired bursts' ratios {med(pairs):.3f}, quartiles "
              f"{statistics.quantiles(pairs, n=4)[0]:.3f}-{statistics.quantiles(pairs, n=4)[2]:.3f}")
    return 0 if all(r["bound_ok"] for r in rows["reclaim"]) else 1


if __name__ == "__main__":
    sys.exit(main())
