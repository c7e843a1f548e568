#!/usr/bin/python3
"""Does the kernel's dirty-page throttling of a FUSE mount slow writes through the writeback
cache?  One write on a fresh store and daemon, with the mount's bdi limits as the kernel sets
them or changed after the mount, optionally with the daemon held to part of a CPU and with the
writeback tracepoints recorded.  Prints the time, GB/s, the daemon's CPU seconds and the bdi's
settings; with --trace also the writers' total balance_dirty_pages pause and the bdi's
dirty_ratelimit updates.

usage: wb_bdi.py BIN CASE WORK [--bdi k=v,...] [--cpu-quota US] [--trace] [-- DAEMON_OPTS...]
  CASE: save  (profile_incr.py's 2-writer save of DATA/step_0001, 1 MiB writes + fsync;
               DATA from --data, default /var/tmp/ckptfs-bench/data/c1-1g)
        dd1m  (dd bs=1M conv=fsync of a 1 GiB random file)
        head4k (head -c 1G of that file: 4 KiB writes)
  --bdi: files of /sys/class/bdi/MAJ:MIN/ to write after the mount (max_ratio, max_bytes,
         strict_limit, min_bytes); MAJ:MIN is the mount's, from /proc/self/mountinfo
  --cpu-quota: cgroup v1 cpu.cfs_quota_us (per 100,000) for the daemon
  --trace: writeback:balance_dirty_pages and writeback:bdi_dirty_ratelimit, in a tracing
           instance of its own
Needs root.  docs/performance.md section 10.1 cites it."""
import argparse
import collections
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tools/bench: bench.py
import bench  # noqa: E402

TRACE = "/sys/kernel/tracing/instances/ckptfs-wb-bdi"
EVENTS = ("writeback/balance_dirty_pages", "writeback/bdi_dirty_ratelimit")


def wr(path, val):
    with open(path, "w") as f:
        f.write(val)


def main():
    args = sys.argv[1:]
    extra = []
    if "--" in args:
        extra = args[args.index("--") + 1:]
        args = args[:args.index("--")]
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("bin")
    ap.add_argument("case", choices=["save", "dd1m", "head4k"])
    ap.add_argument("work")
    ap.add_argument("--bdi", default="")
    ap.add_argument("--cpu-quota", type=int, default=0)
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--data", default="/var/tmp/ckptfs-bench/data/c1-1g")
    a = ap.parse_args(args)
    store, mnt = os.path.join(a.work, "store"), os.path.join(a.work, "mnt")
    subprocess.run(["rm", "-rf", store], check=True)
    os.makedirs(mnt, exist_ok=True)
    jobs = None
    if a.case == "save":
        src = os.path.join(a.data, "step_0001")
        jobs = [(i, n, memoryview(open(os.path.join(src, n), "rb").read()))
                for i, n in enumerate(sorted(os.listdir(src)))]
    else:
        inp = os.path.join(a.work, "input-1g")
        if not os.path.exists(inp) or os.path.getsize(inp) != 1 << 30:
            subprocess.run(f"head -c 1G /dev/urandom > {inp}", shell=True, check=True)
    d = subprocess.Popen([a.bin, store, mnt, "-f"] + extra,
                         stderr=open(os.path.join(a.work, "daemon.log"), "a"))
    try:
        for _ in range(400):
            if os.path.ismount(mnt):
                break
            time.sleep(0.05)
        else:
            sys.exit("the daemon did not mount")
        if a.cpu_quota:
            cg = "/sys/fs/cgroup/cpu/ckptfs-wb-bdi"
            os.makedirs(cg, exist_ok=True)
            wr(cg + "/cpu.cfs_period_us", "100000")
            wr(cg + "/cpu.cfs_quota_us", str(a.cpu_quota))
            wr(cg + "/cgroup.procs", str(d.pid))
        dev = None
        for line in open("/proc/self/mountinfo"):
            f = line.split()
            if f[4] == mnt:
                dev = f[2]
        bdi = f"/sys/class/bdi/{dev}"
        for kv in filter(None, a.bdi.split(",")):
            k, v = kv.split("=")
            wr(f"{bdi}/{k}", v)
        cur = {k: open(f"{bdi}/{k}").read().strip()
               for k in ("max_ratio", "max_bytes", "strict_limit", "min_bytes")}

        def cpu():
            f = open(f"/proc/{d.pid}/stat").read().split(")")[1].split()
            return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

        bench.drop_caches()
        if a.case != "save":
            subprocess.run(["cat", inp], stdout=subprocess.DEVNULL, check=True)
        if a.trace:
            os.makedirs(TRACE, exist_ok=True)
            wr(TRACE + "/tracing_on", "0")
            wr(TRACE + "/trace", "")
            wr(TRACE + "/buffer_size_kb", "16384")
            for e in EVENTS:
                wr(f"{TRACE}/events/{e}/enable", "1")
            wr(TRACE + "/tracing_on", "1")
        c0 = cpu()
        t0 = time.time()
        if a.case == "save":
            dt, n = bench.parallel_save(jobs, os.path.join(mnt, "step_0001"), 2, True)
        else:
            cmd = {"dd1m": f"dd if={inp} of={mnt}/f bs=1M conv=fsync status=none",
                   "head4k": f"head -c 1G {inp} > {mnt}/f"}[a.case]
            subprocess.run(cmd, shell=True, check=True)
            dt, n = time.time() - t0, 1 << 30
        c1 = cpu()
        print(f"{a.case} {' '.join(extra)}: {dt:.2f} s, {n / 1e9 / dt:.2f} GB/s, daemon CPU "
              f"{c1 - c0:.2f} s; bdi {dev} {cur}; load {os.getloadavg()[0]:.2f}", flush=True)
        if a.trace:
            wr(TRACE + "/tracing_on", "0")
            text = open(TRACE + "/trace").read()
            for e in EVENTS:
                wr(f"{TRACE}/events/{e}/enable", "0")
            pause, npause, rl = collections.Counter(), collections.Counter(), []
            for line in text.splitlines():
                if f"bdi {dev}:" not in line:
                    continue
                task = line.split()[0]
                if "balance_dirty_pages:" in line:
                    p = int(re.search(r" pause=(-?\d+)", line).group(1))
                    if p > 0:
                        pause[task] += p
                        npause[task] += 1
                elif "bdi_dirty_ratelimit:" in line:
                    rl.append(line.split("bdi_dirty_ratelimit:")[1].strip())
            for task in pause:
                print(f"  {task}: paused {pause[task]} ms in {npause[task]} pauses")
            for r in rl:
                print(f"  {r}")
    finally:
        subprocess.run(["fusermount3", "-u", mnt])
        d.wait()
        for path in (TRACE, "/sys/fs/cgroup/cpu/ckptfs-wb-bdi"):  # empty now
            try:
                os.rmdir(path)
            except OSError:
                pass


if __name__ == "__main__":
    main()
