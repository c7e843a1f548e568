#!/usr/bin/env python3
"""Does counting and timing every FUSE request (issue 23's metrics) slow small requests?

Usage: tools/bench/probes/ab_metrics.py DAEMON_A DAEMON_B [--rounds N] [--files N] [--mib N]
       [--dir DIR]

For each round, and for A then B (the order alternates by round), on a fresh store in DIR
(default /var/tmp) mounted with defaults: create N empty files (open+close each), stat them all,
then write MIB MiB with dd bs=4k into one file.  Prints each run and the medians of each daemon
with the ratio B/A.  Run as the user who may mount FUSE; nothing else should load the machine.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def one(daemon, base, nfiles, mib):
    store = os.path.join(base, "store")
    mnt = os.path.join(base, "mnt")
    os.makedirs(mnt, exist_ok=True)
    subprocess.run([daemon, store, mnt], check=True)
    try:
        d = os.path.join(mnt, "d")
        os.mkdir(d)
        t = time.perf_counter()
        for i in range(nfiles):
            os.close(os.open(os.path.join(d, f"f{i}"), os.O_CREAT | os.O_WRONLY, 0o644))
        create = time.perf_counter() - t
        t = time.perf_counter()
        for i in range(nfiles):
            os.stat(os.path.join(d, f"f{i}"))
        stat = time.perf_counter() - t
        t = time.perf_counter()
        subprocess.run(["dd", "if=/dev/zero", f"of={mnt}/w", "bs=4k", f"count={mib * 256}",
                        "status=none"], check=True)
        write = time.perf_counter() - t
    finally:
        subprocess.run(["fusermount3", "-u", mnt], check=True)
        # the daemon lets go of the store shortly after the unmount
        for _ in range(100):
            if subprocess.run(["pgrep", "-f", f"^{daemon} {store} "],
                              stdout=subprocess.DEVNULL).returncode != 0:
                break
            time.sleep(0.1)
        shutil.rmtree(store)
    return create, stat, write


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--files", type=int, default=5000)
    p.add_argument("--mib", type=int, default=128)
    p.add_argument("--dir", default="/var/tmp")
    o = p.parse_args(argv)
    res = {o.a: [], o.b: []}
    with tempfile.TemporaryDirectory(prefix="ckptfs-abm.", dir=o.dir) as base:
        for r in range(o.rounds):
            for daemon in ((o.a, o.b) if r % 2 == 0 else (o.b, o.a)):
                c, s, w = one(os.path.abspath(daemon), base, o.files, o.mib)
                res[daemon].append((c, s, w))
                print(f"round {r} {daemon}: create {c:.3f} s, stat {s:.3f} s, "
                      f"write {o.mib} MiB bs=4k {w:.3f} s", flush=True)
    names = ("create", "stat", "write")
    med = {d: [statistics.median(x[i] for x in v) for i in range(3)] for d, v in res.items()}
    for i, n in enumerate(names):
        print(f"median {n}: A {med[o.a][i]:.3f} s, B {med[o.b][i]:.3f} s, "
              f"B/A {med[o.b][i] / med[o.a][i]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
