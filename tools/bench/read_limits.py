#!/usr/bin/python3
"""Physical limits of reading a ckptfs store on this machine (docs/performance.md
section 6, "Limits of this machine").  Needs root; run from the repository root after `make bench`.

    tools/bench/read_limits.py STORE [--reps 3] [--files 20] [--file-mib 24.6]

1. null FUSE read throughput (tools/bench/nullfs, data never touched by the
   daemon beyond a zero buffer): 1 MiB reads by 1 and 4 readers, the mount's
   read-ahead at 1 MiB as ckptfs sets it, in page-cache mode and in direct_io
   mode (-o direct_read);
2. cold sequential read of STORE's pack files (page cache dropped), 1 MiB
   reads, 1 and 2 readers;
3. CPU cost of each step of the chunk read path on STORE's chunks
   (tools/bench/read_limits, 1 and 2 threads).

Prints medians of --reps repetitions (alternating the variants).
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

GB = 1e9


def mount_nullfs(binary, mnt, direct):
    args = [binary, mnt, "-f"] + (["-o", "direct_read"] if direct else [])
    p = subprocess.Popen(args)
    for _ in range(200):
        if os.path.ismount(mnt):
            break
        time.sleep(0.02)
    st = os.stat(mnt)
    with open(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb",
              "w") as f:
        f.write("1024\n")
    return p


def self_cpu():
    t = os.times()
    return t.user + t.system


def children_cpu():
    t = os.times()
    return t.children_user + t.children_system


def umount(p, mnt):
    subprocess.run(["fusermount3", "-u", mnt], check=False)
    p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--file-mib", type=float, default=24.64)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="read-limits-", dir="/var/tmp")
    mnt = os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    nb = bench.build_nullfs()
    size = int(a.file_mib * (1 << 20))
    res = {}
    cpu = {}  # key: [(reader CPU s/GB, daemon CPU s/GB)]
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    for rep in range(a.reps):
        for direct in bench.rotate([False, True], rep):
            p = mount_nullfs(nb, mnt, direct)
            try:
                names = [os.path.join(mnt, f"f{i:02d}") for i in range(a.files)]
                for n in names:
                    with open(n, "wb") as f:
                        f.truncate(size)
                for nread in (1, 4):
                    bench.drop_caches()
                    c0, d0 = self_cpu(), bench.proc_cpu(p.pid)
                    dt, nbytes = bench.parallel_read([names[i::nread] for i in range(nread)])
                    c1, d1 = self_cpu(), bench.proc_cpu(p.pid)
                    key = f"null FUSE, {'direct_io' if direct else 'page cache'}, {nread} reader(s)"
                    res.setdefault(key, []).append(nbytes / GB / dt)
                    cpu.setdefault(key, []).append(((c1 - c0) / (nbytes / GB),
                                                    (d1 - d0) / (nbytes / GB)))
            finally:
                umount(p, mnt)
        packs = sorted(os.path.join(a.store, "packs", n) for n in os.listdir(
            os.path.join(a.store, "packs")))
        for nread in (1, 2):
            bench.drop_caches()
            groups = [[] for _ in range(nread)]
            # readers split the packs by byte range (one big pack is typical)
            t0 = time.monotonic()
            c0 = children_cpu()
            procs = []
            total = 0
            for pk in packs:
                sz = os.path.getsize(pk)
                total += sz
                step = (sz + nread - 1) // nread
                step = (step + (1 << 20) - 1) >> 20
                for i in range(nread):
                    procs.append(subprocess.Popen(
                        ["dd", f"if={pk}", "of=/dev/null", "bs=1M", f"skip={i * step}",
                         f"count={step}", "status=none"]))
            for pr in procs:
                pr.wait()
            dt = time.monotonic() - t0
            del groups
            key = f"dd packs cold, {nread} reader(s)"
            res.setdefault(key, []).append(total / GB / dt)
            cpu.setdefault(key, []).append(((children_cpu() - c0) / (total / GB), 0.0))
    print(f"{'':42s} {'GB/s':>6s}   {'reader':>6s} {'daemon':>6s} CPU s/GB   samples (GB/s)")
    for k, v in res.items():
        rc = statistics.median(x[0] for x in cpu[k])
        dc = statistics.median(x[1] for x in cpu[k])
        print(f"{k:42s} {statistics.median(v):6.2f}   {rc:6.3f} {dc:6.3f}            "
              + " ".join(f"{x:.2f}" for x in v))
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    rl = os.path.join(bench.TOP, "tools", "bench", "read_limits")
    if os.path.exists(rl):
        subprocess.run([rl, a.store, "1"], check=False)
    else:
        print("(build tools/bench/read_limits with `make bench` for the CPU part)")
    subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
