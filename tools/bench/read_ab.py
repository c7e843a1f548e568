#!/usr/bin/python3
"""A/B of ckptfs binaries reading one store through the mount, caches dropped.

    tools/bench/read_ab.py STORE BIN_A BIN_B [BIN_C ...] [--reps 5] [--opts -o,x=y]
                           [--small 4096,65536] [--only tp4_pp1]

A binary may carry options of its own: fs/ckptfs@-o,direct_read=0, and a
store of its own: fs/ckptfs#/var/tmp/other-store (read instead of STORE; the
same checkpoint stored differently, e.g. by another build).

STORE must hold the case 4 checkpoint under /ckpt (any safetensors saved
tp2 x pp2 works).  Per repetition every binary (in rotating order) gets a
fresh daemon for each of: the tp1_pp1 view with 1 reader, the tp4_pp1 view
with 4 readers, the stored sources with 1 reader; 1 MiB reads as in
tools/bench/run case 4.  Prints median wall seconds, GB/s and daemon CPU
seconds per GB (less sensitive to other load on the machine than wall time),
the daemon's minor page faults during the read (thousands, median), and the
largest daemon peak RSS (VmHWM) of the samples.  --small adds cases
that read the first 128 MiB of the first tp1_pp1 view file with reads of
each given size (one reader).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402


def mount(binary, store, mnt, opts):
    binary, _, other = binary.partition("#")
    store = other or store
    binary, _, own = binary.partition("@")
    opts = opts + [o for o in own.split(",") if o]
    p = subprocess.Popen([binary, store, mnt, "-f"] + opts, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    for _ in range(400):
        if os.path.ismount(mnt) and os.path.exists(os.path.join(mnt, "ckpt")):
            break
        time.sleep(0.025)
    time.sleep(0.3)  # let the read-ahead knob be set
    return p


def umount(p, mnt):
    subprocess.run(["fusermount3", "-u", mnt], check=False)
    p.wait()


def groups(mnt, what):
    if what == "tp1_pp1 view, 1 reader":
        d = os.path.join(mnt, "tp1_pp1", "ckpt")
        return [[os.path.join(d, n) for n in sorted(os.listdir(d))]]
    if what == "tp4_pp1 view, 4 readers":
        d = os.path.join(mnt, "tp4_pp1", "ckpt")
        names = sorted(os.listdir(d))
        return [[os.path.join(d, n) for n in names if n.endswith(f"_tp{t}_pp0.safetensors")]
                for t in range(4)]
    if what.startswith("tp1_pp1 view, "):  # reads of a given size
        d = os.path.join(mnt, "tp1_pp1", "ckpt")
        return [[os.path.join(d, sorted(os.listdir(d))[0])]]
    d = os.path.join(mnt, "ckpt")
    return [[os.path.join(d, n) for n in sorted(os.listdir(d))]]


SMALL_SPAN = 128 << 20


def read_small(paths, size):
    """(seconds, bytes) of reading the first SMALL_SPAN bytes of paths[0] with reads of
    SIZE bytes."""
    buf = bytearray(size)
    n = 0
    fd = os.open(paths[0], os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        while n < SMALL_SPAN:
            k = os.readv(fd, [buf])
            if k <= 0:
                break
            n += k
        return time.perf_counter() - t0, n
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("bins", nargs="+")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--opts", default="", help="extra daemon options, e.g. -o,ra_workers=0")
    ap.add_argument("--small", default="", help="read sizes in bytes for the small-read cases")
    ap.add_argument("--only", default="", help="run only the cases whose name contains this, "
                    "e.g. tp4_pp1")
    a = ap.parse_args()
    opts = [o for o in a.opts.split(",") if o]
    mnt = tempfile.mkdtemp(prefix="read-ab-", dir="/var/tmp")
    whats = ["tp1_pp1 view, 1 reader", "tp4_pp1 view, 4 readers", "sources, 1 reader"]
    small = {f"tp1_pp1 view, {int(x)}-byte reads": int(x) for x in a.small.split(",") if x}
    whats += list(small)
    whats = [w for w in whats if a.only in w]
    res = {}
    print(f"load average at start {os.getloadavg()[0]:.2f}", flush=True)
    for rep in range(a.reps):
        for b in bench.rotate(list(range(len(a.bins))), rep):
            for what in whats:
                p = mount(a.bins[b], a.store, mnt, opts)
                try:
                    g = groups(mnt, what)
                    bench.drop_caches()
                    c0, f0 = bench.proc_cpu(p.pid), bench.proc_minflt(p.pid)
                    if what in small:
                        dt, n = read_small(g[0], small[what])
                    else:
                        dt, n = bench.parallel_read(g)
                    cpu = bench.proc_cpu(p.pid) - c0
                    flt = bench.proc_minflt(p.pid) - f0
                    rss = bench.proc_hwm(p.pid) / bench.MiB
                finally:
                    umount(p, mnt)
                res.setdefault((what, b), []).append((dt, n / 1e9 / dt, cpu / (n / 1e9), rss,
                                                      flt / 1000))
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    print(f"{'case':34s} {'binary':34s} {'s':>6s} {'GB/s':>6s} {'CPU s/GB':>8s} "
          f"{'kfaults':>7s} {'RSS MiB':>7s}  samples (s)")
    for what in whats:
        for b, path in enumerate(a.bins):
            v = res[(what, b)]
            print(f"{what:34s} {path[-34:]:34s} {statistics.median(x[0] for x in v):6.3f} "
                  f"{statistics.median(x[1] for x in v):6.2f} "
                  f"{statistics.median(x[2] for x in v):8.2f} "
                  f"{statistics.median(x[4] for x in v):7.1f} "
                  f"{max(x[3] for x in v):7.0f}  "
                  + " ".join(f"{x[0]:.2f}" for x in v))
    os.rmdir(mnt)


if __name__ == "__main__":
    main()
