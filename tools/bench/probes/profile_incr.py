#!/usr/bin/python3
"""Case 2 of the benchmark on its own, for profiling: save step 1 of a
generated series into a fresh store, wait until it has settled, then time the
2-writer save of step 2 (write + fsync + close per file) and print the
daemon's and the writers' CPU seconds.

usage: profile_incr.py CKPTFS_BIN DATA_DIR WORK_DIR [--perf | --strace | --full] [-- DAEMON_OPTS...]

DATA_DIR is a generated series (e.g. /var/tmp/ckptfs-bench/data/c1-2g from
tools/bench/run); WORK_DIR is scratch space on the filesystem to measure.
--perf records the daemon during the save into WORK_DIR/perf.data;
--strace writes the daemon's fdatasync/fsync calls with their durations
to WORK_DIR/strace.txt.  --full times the 2-writer save of step 1 into a
fresh store instead, twice (case 1's save alone).  Needs root (drop_caches,
FUSE)."""
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tools/bench: bench.py
import bench  # noqa: E402


def main():
    args = sys.argv[1:]
    extra = []
    if "--" in args:
        extra = args[args.index("--") + 1:]
        args = args[:args.index("--")]
    if len(args) < 3:
        sys.exit(__doc__)
    binp, data, work = args[:3]
    mode = args[3] if len(args) > 3 else ""
    ckpt = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(binp))), "tools", "ckpt")
    if not os.access(ckpt, os.X_OK):
        ckpt = os.path.join(HERE, "..", "..", "ckpt")

    def jobs_of(step):
        d = f"{data}/step_{step:04d}"
        return [(i, n, memoryview(open(os.path.join(d, n), "rb").read()))
                for i, n in enumerate(sorted(os.listdir(d)))]

    store, mnt = os.path.join(work, "store"), os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    dev = os.stat(work).st_dev  # drop_caches() then also waits for an idle disk
    bench.DISK_STAT = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat"

    def mount():
        """A daemon on a fresh store."""
        subprocess.run(["rm", "-rf", store], check=True)
        d = subprocess.Popen([binp, store, mnt, "-f"] + extra,
                             stderr=open(os.path.join(work, "daemon.log"), "a"))
        for _ in range(400):
            if os.path.ismount(mnt):
                return d
            time.sleep(0.05)
        d.kill()
        sys.exit("the daemon did not mount")

    p = mount()
    tracer = None
    try:
        def cpu():
            f = open(f"/proc/{p.pid}/stat").read().split(")")[1].split()
            return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

        if mode == "--full":
            jobs = jobs_of(1)
            for rep in range(2):
                if rep:
                    subprocess.run(["fusermount3", "-u", mnt], check=True)
                    p.wait()
                    p = mount()
                bench.drop_caches()
                c0 = cpu()
                dt, n = bench.parallel_save(jobs, os.path.join(mnt, "step_0001"), 2, True)
                c1 = cpu()
                print(f"full save {dt:.3f} s, {n / 1e9 / dt:.2f} GB/s, daemon CPU "
                      f"{c1 - c0:.2f} s = {(c1 - c0) / (n / 1e9):.2f} s/GB", flush=True)
            return
        bench.parallel_save(jobs_of(1), os.path.join(mnt, "step_0001"), 2, True)
        while True:
            st = subprocess.run([ckpt, "stat", store], capture_output=True, text=True).stdout
            if "compression_pending: 0" in st and "unindexed_bytes: 0" in st:
                break
            time.sleep(0.5)
        time.sleep(1.5)
        jobs = jobs_of(2)
        bench.drop_caches()
        if mode == "--perf":
            tracer = subprocess.Popen(["perf", "record", "-g", "-o",
                                       os.path.join(work, "perf.data"), "-p", str(p.pid)],
                                      stderr=subprocess.DEVNULL)
            time.sleep(0.5)
        elif mode == "--strace":
            tracer = subprocess.Popen(["strace", "-f", "-T", "-y", "-o",
                                       os.path.join(work, "strace.txt"), "-e",
                                       "trace=fdatasync,fsync", "-p", str(p.pid)],
                                      stderr=subprocess.DEVNULL)
            time.sleep(1)
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        c0 = cpu()
        dt, n = bench.parallel_save(jobs, os.path.join(mnt, "step_0002"), 2, True)
        c1 = cpu()
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        if tracer:
            tracer.send_signal(2)
            tracer.wait()
        wcpu = ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime
        print(f"incremental save {dt:.3f} s, {n / 1e9:.2f} GB, daemon CPU {c1 - c0:.2f} s, "
              f"writers' CPU {wcpu:.2f} s")
    finally:
        subprocess.run(["fusermount3", "-u", mnt])
        p.wait()


if __name__ == "__main__":
    main()
