#!/usr/bin/env python3
"""What does the metadata log cost?  A/B of daemon binaries on metadata-bound work.

usage: tools/bench/probes/ab_meta.py ROUNDS BIN_A BIN_B [BIN...] [--files N] [--work DIR]

For each round, each binary in turn mounts a fresh store in WORK (default /var/tmp/ckptfs-ab-meta,
on the disk to measure) and times, through the mount:
  create   N files of 4 KiB written and closed, in 16 directories, then a directory fsync
           (the overlay indexed, the index's WAL synced)
  meta     a rename, a chmod and a utime of each, an unlink of every other one, a directory fsync
  fsync    N/4 files of 4 KiB, each written and fsynced (a durable commit each)
  big      one 1 GiB file written with 1 MiB writes and fsynced
then unmounts (timed too: its flush and, when due, a snapshot).  Prints each binary's median
over the rounds of each phase's seconds and the daemon's CPU seconds in it (cpu_PHASE: user +
system, from /proc/PID/stat; less disturbed than wall time by other work on the machine), and
the store's metadata bytes (index and metalog).
"""
import os
import shutil
import statistics
import subprocess
import sys
import time

MiB = 1 << 20


def ismount(p):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == p for line in f)


def mount(binary, store, mnt):
    os.makedirs(mnt, exist_ok=True)
    p = subprocess.Popen([binary, store, mnt, "-f"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    while not ismount(mnt):
        if p.poll() is not None:
            sys.exit(f"{binary}: exited {p.returncode}")
        time.sleep(0.01)
    return p


def umount(p, mnt):
    subprocess.run(["fusermount3", "-u", mnt], check=True)
    p.wait()


def dsync(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)


def du(path):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


class Phase:
    def __init__(self, t, name, pid):
        self.t, self.name, self.pid = t, name, pid

    def __enter__(self):
        self.w, self.c = time.monotonic(), cpu(self.pid)

    def __exit__(self, *a):
        self.t[self.name] = time.monotonic() - self.w
        self.t["cpu_" + self.name] = cpu(self.pid) - self.c


def one(binary, work, n):
    store, mnt = os.path.join(work, "store"), os.path.join(work, "mnt")
    shutil.rmtree(store, ignore_errors=True)
    p = mount(binary, store, mnt)
    t = {}
    blk = os.urandom(4096)
    with Phase(t, "create", p.pid):
        for d in range(16):
            os.mkdir(f"{mnt}/d{d}")
        for i in range(n):
            with open(f"{mnt}/d{i % 16}/f{i}", "wb") as f:
                f.write(blk)
        dsync(mnt)
    with Phase(t, "meta", p.pid):
        for i in range(n):
            a, b = f"{mnt}/d{i % 16}/f{i}", f"{mnt}/d{i % 16}/g{i}"
            os.rename(a, b)
            os.chmod(b, 0o600)
            os.utime(b, (1, 1))
            if i % 2:
                os.unlink(b)
        dsync(mnt)
    with Phase(t, "fsync", p.pid):
        for i in range(n // 4):
            with open(f"{mnt}/h{i}", "wb") as f:
                f.write(blk)
                f.flush()
                os.fsync(f.fileno())
    buf = os.urandom(MiB)
    with Phase(t, "big", p.pid):
        with open(f"{mnt}/big", "wb") as f:
            for _ in range(1024):
                f.write(buf)
            f.flush()
            os.fsync(f.fileno())
    t0 = time.monotonic()
    umount(p, mnt)
    t["umount"] = time.monotonic() - t0
    t["index_mb"] = du(os.path.join(store, "index")) / MiB
    t["metalog_mb"] = du(os.path.join(store, "metalog")) / MiB if os.path.isdir(
        os.path.join(store, "metalog")) else 0.0
    return t


def main(argv):
    n, work, bins, rest = 20000, "/var/tmp/ckptfs-ab-meta", [], []
    i = 0
    while i < len(argv):
        if argv[i] == "--files":
            n = int(argv[i + 1])
            i += 2
        elif argv[i] == "--work":
            work = argv[i + 1]
            i += 2
        else:
            rest.append(argv[i])
            i += 1
    if len(rest) < 3:
        sys.exit(__doc__)
    rounds, bins = int(rest[0]), rest[1:]
    os.makedirs(work, exist_ok=True)
    res = {b: [] for b in bins}
    for r in range(rounds):
        for b in bins:
            t = one(b, work, n)
            res[b].append(t)
            print(f"round {r + 1} {b}: " + " ".join(f"{k} {v:.2f}" for k, v in t.items()),
                  flush=True)
    print(f"median of {rounds} rounds, {n} files:")
    for b in bins:
        keys = res[b][0].keys()
        print(f"  {b}: " + " ".join(
            f"{k} {statistics.median(t[k] for t in res[b]):.2f}" for k in keys))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
