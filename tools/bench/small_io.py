#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Ordinary tools on a ckptfs mount, side by side with a plain directory on the same disk.

Cases (docs/performance.md, section "Small I/O and ordinary tools"):
  write4k   head -c SIZE INPUT > FILE            (4 KiB writes), then `sync FILE`
  write10k  dd if=INPUT of=FILE bs=10k           (10 KiB writes), then `sync FILE`
  tar       tar xf TREE.tar                      (a generated tree of mixed file sizes)
  meta      create N 1 KiB files (1000 per directory), then with caches dropped a stat of
            every file, then with caches dropped ls -lR

Every repetition runs ckptfs and the plain directory once per case, alternating which goes
first; the table gives medians and ratios (ckptfs / plain: times, so below 1 is faster).  A
ckptfs phase gets a fresh store and daemon, a plain phase a fresh directory, both under --out
(put it on the disk being measured).  Before each phase: sync, and as root drop_caches; the
input file is read back into the page cache.  Every phase checks its result (content, sizes,
counts) outside the timed part; a wrong result fails the run.  --quick runs tiny sizes once,
without dropping caches: it checks correctness, not speed (tests/integration/t_smallio.sh
runs it beside other tests).

--reference NAME=COMMAND (repeatable) adds another FUSE file system as a column, run the same
way, to show what FUSE itself costs on the machine: COMMAND mounts a fresh backing directory
{src} on {mnt} and stays in the foreground, e.g. libfuse's example/passthrough_ll, built by
hand from libfuse's repository (docs/performance.md section 10):
    --reference 'passthrough_ll=/path/passthrough_ll -f -o source={src} {mnt}'
    --reference 'passthrough_ll wb=/path/passthrough_ll -f -o source={src},writeback {mnt}'
"""
import argparse
import hashlib
import io
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
MiB = 1 << 20


def log(msg):
    print(f"# {msg}", flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, shell=isinstance(cmd, str), check=True, **kw)


# --quick (make check) leaves the page cache alone: dropping it would disturb other tests
# running at the same time (t_cache counts resident pages).
DROP_CACHES = True


def settle():
    os.sync()
    if DROP_CACHES and os.geteuid() == 0:
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        except OSError:
            pass


def warm(path):
    with open(path, "rb") as f:
        while f.read(8 * MiB):
            pass


def sha_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(8 * MiB)
            if not b:
                return h.hexdigest()
            h.update(b)


def rand_bytes(rng, n):
    return rng.getrandbits(8 * n).to_bytes(n, "little") if n else b""


def make_input(path, size):
    if os.path.exists(path) and os.path.getsize(path) == size:
        return
    log(f"generating {path} ({size} bytes)")
    with open(path + ".tmp", "wb") as f:
        left = size
        while left:
            n = min(left, 8 * MiB)
            f.write(os.urandom(n))
            left -= n
    os.replace(path + ".tmp", path)


def make_tree_tar(path, total, seed=23):
    """A deterministic tree of mixed file sizes: 60% of the files under 16 KiB, 30% 16 KiB-1
    MiB, 10% 1-16 MiB (most bytes), 50 files per directory, random content."""
    if os.path.exists(path):
        return
    log(f"generating {path} (about {total} bytes of files)")
    rng = random.Random(seed)
    done = 0
    i = 0
    with tarfile.open(path + ".tmp", "w", format=tarfile.GNU_FORMAT) as tf:
        while done < total:
            u = rng.random()
            if u < 0.6:
                n = rng.randrange(0, 16 << 10)
            elif u < 0.9:
                n = rng.randrange(16 << 10, 1 << 20)
            else:
                n = rng.randrange(1 << 20, 16 << 20)
            n = min(n, max(total - done, 0))
            d = f"tree/d{i // 50:04d}"
            if i % 50 == 0:
                ti = tarfile.TarInfo(d)
                ti.type = tarfile.DIRTYPE
                ti.mode = 0o755
                ti.mtime = 1700000000
                tf.addfile(ti)
            ti = tarfile.TarInfo(f"{d}/f{i:06d}.bin")
            ti.size = n
            ti.mode = 0o644
            ti.mtime = 1700000000 + i
            tf.addfile(ti, io.BytesIO(rand_bytes(rng, n)))
            done += n
            i += 1
    os.replace(path + ".tmp", path)


class Mount:
    """A fresh store and a foreground daemon on a fresh mount point (or, with cmd, a
    reference file system's foreground daemon mounting a fresh directory)."""

    def __init__(self, binary, opts, base, cmd=None):
        self.store = base + "-store"
        self.mnt = base + "-mnt"
        os.makedirs(self.mnt)
        if cmd is None:
            cmd = [binary, self.store, self.mnt, "-f"]
            if opts:
                cmd += ["-o", opts]
        else:
            os.makedirs(self.store)
            cmd = [w.replace("{src}", self.store).replace("{mnt}", self.mnt)
                   for w in shlex.split(cmd)]
        self.log = open(base + "-daemon.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{cmd[0]} did not mount (see {base}-daemon.log)")
            time.sleep(0.05)

    def close(self):
        for _ in range(100):
            if subprocess.run(["fusermount3", "-u", self.mnt],
                              stderr=subprocess.DEVNULL).returncode == 0:
                break
            time.sleep(0.1)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        if self.proc.returncode != 0:
            raise RuntimeError(f"{self.proc.args[0]} exited {self.proc.returncode}")


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# ------------------------------------------------------------------ cases
# Each returns {measure: seconds} and raises on a wrong result.

def case_write(target, a, bs):
    out = os.path.join(target, "f")
    if bs == 4096:
        run = lambda: sh(f"head -c {a.write_size} '{a.input}' > '{out}'")
    else:
        run = lambda: sh(["dd", f"if={a.input}", f"of={out}", f"bs={bs}", "status=none"])
    t_close = timed(run)
    t_sync = timed(lambda: sh(["sync", out]))
    if os.path.getsize(out) != a.write_size or sha_file(out) != a.input_sha:
        raise RuntimeError(f"{out}: content differs from {a.input}")
    return {"close": t_close, "close + sync": t_close + t_sync}


def case_tar(target, a):
    t = timed(lambda: sh(["tar", "xf", a.tar, "-C", target]))
    t_sync = timed(lambda: sh(["sync", "-f", target]))
    r = subprocess.run(["tar", "df", a.tar, "-C", target], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"tar df: the extracted tree differs:\n{r.stdout[:2000]}{r.stderr[:2000]}")
    return {"tar xf": t, "tar xf + sync": t + t_sync}


def case_meta(target, a):
    n, per = a.files, 1000
    data = b"m" * 1024
    paths = [os.path.join(target, f"d{i // per:03d}", f"f{i:06d}") for i in range(n)]

    def create():
        for i, p in enumerate(paths):
            if i % per == 0:
                os.mkdir(os.path.dirname(p))
            with open(p, "wb") as f:
                f.write(data)

    res = {"create": timed(create)}
    settle()
    sizes = []
    res["stat"] = timed(lambda: sizes.extend(os.lstat(p).st_size for p in paths))
    if sizes != [1024] * n:
        raise RuntimeError("stat: wrong sizes")
    settle()
    out = []
    res["ls -lR"] = timed(lambda: out.append(subprocess.run(
        ["ls", "-lR", target], stdout=subprocess.PIPE, check=True).stdout))
    nfiles = sum(1 for line in out[0].splitlines() if line.startswith(b"-"))
    if nfiles != n:
        raise RuntimeError(f"ls -lR: {nfiles} files listed, {n} created")
    return res


CASES = {
    "write4k": ("head -c (4 KiB writes)", lambda t, a: case_write(t, a, 4096)),
    "write10k": ("dd bs=10k", lambda t, a: case_write(t, a, 10240)),
    "tar": ("tar xf", case_tar),
    "meta": ("files", case_meta),
}
TARGETS = {"write4k": ("close", ">= 0.8x plain speed"), "write10k": ("close", ">= 0.8x plain speed"),
           "tar": ("tar xf", ">= 0.8x plain speed"), "meta": (None, "<= 2x plain time")}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="/var/tmp/ckptfs-smallio", help="scratch space, on the disk measured")
    p.add_argument("--ckptfs", default=os.path.join(TOP, "fs", "ckptfs"))
    p.add_argument("--ckptfs-opts", default="", help="extra -o options for the daemon")
    p.add_argument("--write-mib", type=int, default=1024, help="size of the sequential writes")
    p.add_argument("--tar-mb", type=int, default=1000, help="bytes of files in the tar tree (MB)")
    p.add_argument("--files", type=int, default=20000, help="files of the metadata case")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--cases", default="write4k,write10k,tar,meta")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one repetition: checks results only")
    p.add_argument("--reference", action="append", default=[], metavar="NAME=COMMAND",
                   help="another FUSE file system as a column: COMMAND mounts {src} on {mnt} "
                        "in the foreground")
    a = p.parse_args()
    refs = {}
    for r in a.reference:
        name, sep, cmd = r.partition("=")
        if not sep or not name or "{mnt}" not in cmd or name in ("ckptfs", "plain"):
            p.error(f"--reference {r}: NAME=COMMAND with {{mnt}} in COMMAND")
        refs[name] = cmd
    if a.quick:
        global DROP_CACHES
        a.write_mib, a.tar_mb, a.files, a.reps = 8, 12, 300, 1
        DROP_CACHES = False
    cases = [c for c in a.cases.split(",") if c]
    for c in cases:
        if c not in CASES:
            p.error(f"unknown case {c}")
    a.write_size = a.write_mib * MiB
    data = os.path.join(a.out, "data")
    work = os.path.join(a.out, "work")
    os.makedirs(data, exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    a.input = os.path.join(data, f"rand-{a.write_mib}m.bin")
    a.tar = os.path.join(data, f"tree-{a.tar_mb}mb.tar")
    if "write4k" in cases or "write10k" in cases:
        make_input(a.input, a.write_size)
        a.input_sha = sha_file(a.input)
    if "tar" in cases:
        make_tree_tar(a.tar, a.tar_mb * 1000 * 1000)

    load0 = os.getloadavg()[0]
    samples = {}  # (case, measure, variant) -> [s]
    seq = 0
    for rep in range(a.reps):
        for ci, case in enumerate(cases):
            order = ["ckptfs", "plain"] if (rep + ci) % 2 == 0 else ["plain", "ckptfs"]
            order += list(refs)
            for variant in order:
                seq += 1
                base = os.path.join(work, f"{case}-{rep}-{variant}-{seq}")
                settle()
                if case.startswith("write"):
                    warm(a.input)
                elif case == "tar":
                    warm(a.tar)
                m = None
                if variant == "ckptfs":
                    m = Mount(a.ckptfs, a.ckptfs_opts, base)
                    target = m.mnt
                elif variant in refs:
                    m = Mount(None, None, base, cmd=refs[variant])
                    target = m.mnt
                else:
                    target = base + "-plain"
                    os.makedirs(target)
                try:
                    res = CASES[case][1](target, a)
                finally:
                    if m:
                        m.close()
                for k, v in res.items():
                    samples.setdefault((case, k, variant), []).append(v)
                log(f"rep {rep + 1} {case} {variant}: " +
                    ", ".join(f"{k} {v:.3f} s" for k, v in res.items()))
                shutil.rmtree(target if not m else m.store, ignore_errors=True)
                if m:
                    shutil.rmtree(m.mnt, ignore_errors=True)

    rows = []
    for case in cases:
        keys = [k for (c, k, v) in samples if c == case and v == "ckptfs"]
        for k in keys:
            ck = statistics.median(samples[(case, k, "ckptfs")])
            pl = statistics.median(samples[(case, k, "plain")])
            tgt_key, tgt = TARGETS[case]
            target = tgt if (tgt_key is None or tgt_key == k) else "-"
            ratio = ck / pl if pl > 0 else float("inf")
            if target == "-" or a.quick:
                verdict = "-"
            elif target.startswith(">="):  # speed >= 0.8x: time ratio <= 1.25
                verdict = "met" if ratio <= 1 / 0.8 else "not met"
            else:
                verdict = "met" if ratio <= 2 else "not met"
            size = {"write4k": f"{a.write_mib} MiB", "write10k": f"{a.write_mib} MiB",
                    "tar": f"{a.tar_mb} MB", "meta": f"{a.files} files"}[case]
            refcols = []
            for name in refs:
                rs = statistics.median(samples[(case, k, name)])
                refcols += [f"{rs:.3f}", f"{rs / pl:.2f}" if pl > 0 else "inf",
                            f"{ck / rs:.2f}" if rs > 0 else "inf"]
            rows.append((CASES[case][0], k, size, f"{ck:.3f}", f"{pl:.3f}", f"{ratio:.2f}",
                         target, verdict, *refcols))
    head = ("case", "measure", "size", "ckptfs s", "plain s", "time ratio ck/plain", "target",
            "verdict")
    for name in refs:
        head += (f"{name} s", f"{name}/plain", f"ckptfs/{name}")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    lines = [f"small I/O benchmark  {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
             "command: " + " ".join(sys.argv),
             f"ckptfs: {a.ckptfs} {a.ckptfs_opts}; reps {a.reps} (medians); load average at start "
             f"{load0:.2f}, at end {os.getloadavg()[0]:.2f}"]
    lines += [f"reference {n}: {c}" for n, c in refs.items()] + [""]
    lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(str(x).ljust(w) for x, w in zip(r, widths)))
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(a.out, "results.txt"), "w") as f:
        f.write(text)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, subprocess.CalledProcessError) as e:
        print(f"small_io: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
