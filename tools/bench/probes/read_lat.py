#!/usr/bin/python3
"""Where a cold view read waits: the latency of every 1 MiB read.

    tools/bench/probes/read_lat.py STORE BIN [BIN ...] [--reps 3] [--view tp1_pp1|tp4_pp1|sources]

STORE and the readers are those of tools/bench/read_ab.py (a fresh daemon per
read, caches dropped, one thread per target rank, 1 MiB readv).  Every read is
timed on its own.  Prints per binary the medians over the repetitions of: the
read's wall time, the read latency percentiles (ms), and the reads slower than
SLOW_MS with the share of the readers' time they took.  A read slower than
that waited for something (read-ahead's pack reads or decodes, or the chunk
loaded by the reader itself); a read served from the chunk cache is a FUSE round
trip and one copy (docs/performance.md).
"""
import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tools/bench: bench.py, read_ab.py
import bench  # noqa: E402
import read_ab  # noqa: E402

SLOW_MS = 1.0
CASES = {"tp1_pp1": "tp1_pp1 view, 1 reader", "tp4_pp1": "tp4_pp1 view, 4 readers",
         "sources": "sources, 1 reader"}


def timed_reader(paths, out):
    buf = bytearray(1 << 20)
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            while True:
                t0 = time.perf_counter()
                k = os.readv(fd, [buf])
                out.append(time.perf_counter() - t0)
                if k <= 0:
                    break
        finally:
            os.close(fd)


def one(binary, store, what):
    with tempfile.TemporaryDirectory(prefix="read-lat-") as mnt:
        p = read_ab.mount(binary, store, mnt, [])
        try:
            groups = read_ab.groups(mnt, what)
            bench.drop_caches()
            lats = [[] for _ in groups]
            threads = [threading.Thread(target=timed_reader, args=(g, lats[i]))
                       for i, g in enumerate(groups)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
        finally:
            read_ab.umount(p, mnt)
    lat = sorted(x for v in lats for x in v)
    slow = [x for x in lat if x * 1e3 > SLOW_MS]
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3  # noqa: E731
    return {"wall": wall, "reads": len(lat), "p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99),
            "max": lat[-1] * 1e3, "slow": len(slow), "slow_share": sum(slow) / sum(lat)}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store")
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--view", choices=sorted(CASES), default="tp1_pp1")
    a = ap.parse_args()
    res = {b: [] for b in a.binaries}
    for rep in range(a.reps):
        for b in a.binaries[rep % len(a.binaries):] + a.binaries[:rep % len(a.binaries)]:
            res[b].append(one(b, a.store, CASES[a.view]))
    print(f"{CASES[a.view]}, medians of {a.reps}; latencies in ms; slow: reads over "
          f"{SLOW_MS:g} ms and their share of the readers' time")
    print(f"{'binary':40} {'wall s':>7} {'reads':>6} {'p50':>6} {'p90':>6} {'p99':>6} "
          f"{'max':>6} {'slow':>5} {'share':>6}")
    for b, v in res.items():
        m = {k: statistics.median(r[k] for r in v) for k in v[0]}
        print(f"{b:40} {m['wall']:7.3f} {m['reads']:6.0f} {m['p50']:6.2f} {m['p90']:6.2f} "
              f"{m['p99']:6.2f} {m['max']:6.1f} {m['slow']:5.0f} {m['slow_share']:6.0%}")


if __name__ == "__main__":
    main()
