#!/usr/bin/env python3
"""Several nodes on one store (docs/cluster.md section 12): the PostgreSQL metadata engine
against the RocksDB engine on one node, and aggregate save/read throughput with 1, 2 and 4
daemons ("nodes") sharing one store on this machine.

    tools/bench/cluster_bench.py [--reps 3] [--save-mib 256] [--small 1000] [--nodes 1,2,4]

Starts its own PostgreSQL server in a temporary directory (initdb and pg_ctl, as the user
"postgres" when run as root) on a Unix socket, and stops it at the end.  Every daemon runs
with -o nobackground (chunks compressed while written), which a store on PostgreSQL implies,
so that the two engines differ only in the metadata engine.  Engines alternate run by run
(rocksdb, postgresql, rocksdb, ...); medians and ratios are printed.

Cases:
  save       SAVE_MIB of random data in 4 files, each written and fsynced (MB/s)
  view_open  cold first open + 4 KiB read of a tp1_pp1 view file of a small sharded
             checkpoint (8 shards), after a remount (ms)
  small      SMALL files of 4 KiB each created and closed, then one fsync of the directory
             (files per second: metadata commits)
  small_sync the same with an fsync of each file (durable commits per second)
  nodes      SAVE_MIB split over N daemons writing at once, each its share of files,
             fsynced (aggregate MB/s); then every file read back through another node (MB/s)
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CKPTFS = os.environ.get("CKPTFS", os.path.join(TOP, "fs/ckptfs"))
VL = os.path.join(TOP, "tests/integration/views_lib.py")


def sh(cmd, **kw):
    return subprocess.run(cmd, shell=True, check=True, **kw)


class Pg:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="ckpt-bench-pg.")
        self.bin = subprocess.run("pg_config --bindir", shell=True, capture_output=True,
                                  text=True).stdout.strip()
        self.asuser = "runuser -u postgres -- " if os.geteuid() == 0 else ""
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        sh(f"{self.asuser}{self.bin}/initdb -D {self.dir}/data -A trust -U ckpt -E UTF8 "
           f"--locale=C >{self.dir}/initdb.log 2>&1")
        # durable settings (fsync on): commits are timed as a deployment would run them
        sh(f"{self.asuser}{self.bin}/pg_ctl -D {self.dir}/data -l {self.dir}/log -w "
           f"-o \"-k {self.dir} -c listen_addresses=\" start >/dev/null")
        self.n = 0

    def new_db(self):
        self.n += 1
        name = f"b{self.n}"
        sh(f"psql -X -q -h {self.dir} -U ckpt -d postgres -c 'CREATE DATABASE {name}'")
        return f"host={self.dir} user=ckpt dbname={name}"

    def stop(self):
        subprocess.run(f"{self.asuser}{self.bin}/pg_ctl -D {self.dir}/data -m fast -w stop "
                       ">/dev/null 2>&1", shell=True)
        shutil.rmtree(self.dir, ignore_errors=True)


class Node:
    def __init__(self, store, mnt, meta):
        os.makedirs(mnt, exist_ok=True)
        args = [CKPTFS, store, mnt, "-f", "-o", "nobackground"]
        if meta:
            args += ["-o", "meta=" + meta]
        self.mnt = mnt
        self.p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            if os.path.ismount(mnt):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{mnt}: not mounted")

    def stop(self):
        subprocess.run(["fusermount3", "-u", self.mnt])
        self.p.wait(timeout=60)


def write_fsync(path, data):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        mv = memoryview(data)
        while mv:
            n = os.write(fd, mv[:8 << 20])
            mv = mv[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


def drop_caches():
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def run_engine(engine, pg, work, a, blobs, shards):
    """One round of the single-node cases for engine; returns {case: value}."""
    d = tempfile.mkdtemp(prefix="r.", dir=work)
    store, mnt = os.path.join(d, "store"), os.path.join(d, "mnt")
    meta = pg.new_db() if engine == "postgresql" else None
    out = {}
    n = Node(store, mnt, meta)
    try:
        t0 = time.monotonic()
        for i, b in enumerate(blobs):
            write_fsync(os.path.join(mnt, f"f{i}"), b)
        out["save"] = sum(map(len, blobs)) / (time.monotonic() - t0) / 1e6
        os.mkdir(os.path.join(mnt, "ck"))
        for f in sorted(os.listdir(shards)):
            shutil.copy(os.path.join(shards, f), os.path.join(mnt, "ck", f))
        sd = os.path.join(mnt, "small")
        os.mkdir(sd)
        four = b"s" * 4096
        t0 = time.monotonic()
        for i in range(a.small):
            with open(os.path.join(sd, f"s{i}"), "wb") as f:
                f.write(four)
        dfd = os.open(sd, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
        out["small"] = a.small / (time.monotonic() - t0)
        sd2 = os.path.join(mnt, "small2")
        os.mkdir(sd2)
        m = max(a.small // 4, 50)
        t0 = time.monotonic()
        for i in range(m):
            write_fsync(os.path.join(sd2, f"s{i}"), four)
        out["small_sync"] = m / (time.monotonic() - t0)
    finally:
        n.stop()
    drop_caches()
    n = Node(store, mnt, meta)
    try:
        vdir = os.path.join(mnt, "tp1_pp1", "ck")
        t0 = time.monotonic()
        name = sorted(os.listdir(vdir))[0]
        with open(os.path.join(vdir, name), "rb") as f:
            f.read(4096)
        out["view_open"] = (time.monotonic() - t0) * 1e3
    finally:
        n.stop()
    shutil.rmtree(d, ignore_errors=True)
    return out


def run_nodes(k, pg, work, blobs):
    """k daemons on one store: each saves its share of blobs at once; then each reads the
    files another node saved.  Returns (save MB/s, read MB/s), aggregate."""
    d = tempfile.mkdtemp(prefix="n.", dir=work)
    store = os.path.join(d, "store")
    meta = pg.new_db()
    nodes = []
    try:
        for i in range(k):
            nodes.append(Node(store, os.path.join(d, f"m{i}"), meta))
        total = sum(map(len, blobs))
        pids = []
        t0 = time.monotonic()
        for i, nd in enumerate(nodes):
            pid = os.fork()
            if pid == 0:
                try:
                    for j in range(i, len(blobs), k):
                        write_fsync(os.path.join(nd.mnt, f"f{j}"), blobs[j])
                    os._exit(0)
                except BaseException:
                    os._exit(1)
            pids.append(pid)
        ok = all(os.waitpid(p, 0)[1] == 0 for p in pids)
        save = total / (time.monotonic() - t0) / 1e6
        if not ok:
            raise RuntimeError(f"{k} nodes: a writer failed")
        drop_caches()
        pids = []
        t0 = time.monotonic()
        for i, nd in enumerate(nodes):
            pid = os.fork()
            if pid == 0:
                try:
                    for j in range(i, len(blobs), k):  # written by node (j % k); read by node i+1
                        other = nodes[(i + 1) % k]
                        with open(os.path.join(other.mnt, f"f{j}"), "rb") as f:
                            while f.read(8 << 20):
                                pass
                    os._exit(0)
                except BaseException:
                    os._exit(1)
            pids.append(pid)
        ok = all(os.waitpid(p, 0)[1] == 0 for p in pids)
        read = total / (time.monotonic() - t0) / 1e6
        if not ok:
            raise RuntimeError(f"{k} nodes: a reader failed")
        return save, read
    finally:
        for nd in nodes:
            nd.stop()
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--save-mib", type=int, default=256)
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--nodes", default="1,2,4")
    ap.add_argument("--work", default=None, help="directory for stores (default: a temp dir)")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ckpt-cluster-bench.", dir=a.work)
    pg = Pg()
    try:
        shards = os.path.join(work, "shards")
        subprocess.run([sys.executable, VL, "make-sharded", shards, os.path.join(work, "spec"),
                        "7", "2", "2", "1"], check=True)
        per = a.save_mib * (1 << 20) // 4
        blobs = [os.urandom(per) for _ in range(4)]
        res = {"rocksdb": {}, "postgresql": {}}
        for r in range(a.reps):
            for eng in ("rocksdb", "postgresql"):
                for k, v in run_engine(eng, pg, work, a, blobs, shards).items():
                    res[eng].setdefault(k, []).append(v)
        print(f"# single node, {a.reps} runs each, engines alternating; medians")
        print(f"{'case':12} {'rocksdb':>10} {'postgresql':>11} {'pg/rocksdb':>11}  unit")
        units = {"save": "MB/s", "view_open": "ms", "small": "files/s", "small_sync": "files/s"}
        for case in ("save", "view_open", "small", "small_sync"):
            r_, p_ = (statistics.median(res[e][case]) for e in ("rocksdb", "postgresql"))
            print(f"{case:12} {r_:10.1f} {p_:11.1f} {p_ / r_:11.2f}  {units[case]}  "
                  f"(runs: rocksdb {['%.1f' % x for x in res['rocksdb'][case]]}, "
                  f"postgresql {['%.1f' % x for x in res['postgresql'][case]]})")
        print(f"# {a.save_mib} MiB saved over k nodes at once, then read back through other "
              f"nodes; medians of {a.reps}")
        for k in map(int, a.nodes.split(",")):
            sv, rd = [], []
            for _ in range(a.reps):
                s_, r_ = run_nodes(k, pg, work, blobs)
                sv.append(s_)
                rd.append(r_)
            print(f"nodes={k}  save {statistics.median(sv):8.1f} MB/s  "
                  f"read {statistics.median(rd):8.1f} MB/s  "
                  f"(save runs {['%.1f' % x for x in sv]}, read runs {['%.1f' % x for x in rd]})")
    finally:
        pg.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
