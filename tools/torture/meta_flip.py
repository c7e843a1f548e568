#!/usr/bin/env python3
"""Single-byte damage in the metadata engine's files, then `ckpt repair` (docs/reliability.md,
"Metadata damage").

  tools/torture/meta_flip.py --trials N [--seed S] [--scenario clean|crash|mixed] [--cycle]
                             [--pick file|bytes] [--json FILE]

Each trial, with a random generator drawn from (seed, trial):
  1. builds a store with a known file set through a mount, in two sessions: files, directories,
     symbolic links, a hard link, duplicate and sparse content; between the sessions the store
     is unmounted and `ckpt repair` runs on the intact store (so the metadata log holds two
     snapshots and two logs); the second session renames, deletes, overwrites, truncates and
     adds files, then ends with a clean unmount ("clean") or with kill -9 of the daemon after
     an fsync of the root directory ("crash": the index's write-ahead log holds the session);
  2. flips one byte (XOR with a random non-zero value) at a random offset of one file picked at
     random among the index's files (STORE/index: tables, MANIFEST, write-ahead logs, OPTIONS,
     CURRENT, IDENTITY; not RocksDB's text LOG files, which nothing reads) and the metadata
     log's (STORE/metalog: snapshots and logs); --pick bytes picks the byte uniformly over all
     of them instead, --cycle a file of each kind in turn (the short form in the test suite);
  3. mounts a copy of the damaged store without repair, and reads every file (what a user would
     get without `ckpt repair`);
  4. runs `ckpt repair STORE`, mounts the store and compares every file with the bytes written,
     then unmounts and runs `ckpt fsck STORE`.

A trial reports: mountable before repair (yes/no), mountable after, files recovered exactly,
files listed as lost by repair, files lost but not listed, files served with wrong bytes, and
whether fsck is clean.  The run fails (exit 1) if any trial is unmountable after repair, serves
wrong bytes (before or after repair), loses a file without listing it, or is not fsck-clean.

Needs: the built tree (fs/ckptfs, tools/ckpt; or $CKPTFS, $CKPT), root and /dev/fuse, Python 3.9+
(standard library only).
"""
import argparse
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
CKPTFS = os.environ.get("CKPTFS", os.path.join(TOP, "fs", "ckptfs"))
CKPT = os.environ.get("CKPT", os.path.join(TOP, "tools", "ckpt"))
MiB = 1 << 20


class SetupError(Exception):
    pass


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------- the daemon

def ismount(p):
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                if line.split()[4] == p:
                    return True
    except OSError:
        pass
    return False


def unmount(mnt):
    for _ in range(50):
        if not ismount(mnt):
            return
        subprocess.run(["fusermount3", "-u", mnt], stderr=subprocess.DEVNULL)
        if not ismount(mnt):
            return
        time.sleep(0.1)
    subprocess.run(["fusermount3", "-uz", mnt], stderr=subprocess.DEVNULL)


LIVE = set()  # daemons started and not yet stopped: killed if the run stops on an error


class Daemon:
    """ckptfs STORE MNT -f, as a child process."""

    def __init__(self, store, mnt, logpath):
        os.makedirs(mnt, exist_ok=True)
        self.mnt = mnt
        self.logf = open(logpath, "ab")
        self.p = subprocess.Popen([CKPTFS, store, mnt, "-f"], stdout=self.logf,
                                  stderr=subprocess.STDOUT)
        LIVE.add(self)
        t0 = time.monotonic()
        while not ismount(mnt):
            if self.p.poll() is not None:
                self.logf.close()
                raise OSError(errno.EIO, f"ckptfs exited {self.p.returncode} before mounting")
            if time.monotonic() - t0 > 20:
                self.kill()
                raise OSError(errno.ETIMEDOUT, "not mounted after 20 s")
            time.sleep(0.02)

    def stop(self):
        LIVE.discard(self)
        unmount(self.mnt)
        try:
            self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self.logf.close()
        return self.p.returncode

    def kill(self):
        LIVE.discard(self)
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()
        unmount(self.mnt)
        self.logf.close()


def run(cmd, timeout=300):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace")


# ---------------------------------------------------------------- the file set

def content(rng, kind, size):
    if size == 0:
        return b""
    if kind == "zero":  # stored as zero extents
        return bytes(size)
    if kind == "holes":  # data, a long zero run, data
        a = size // 3
        return rng.randbytes(a) + bytes(size - 2 * a) + rng.randbytes(a)
    if kind == "text":
        line = b"a compressible line of text %d\n" % rng.randrange(1000)
        return (line * (size // len(line) + 1))[:size]
    return rng.randbytes(size)


SIZES = [0, 1, 100, 4095, 4096, 65537, 300_000, 1_200_000, 2_500_000]
KINDS = ["rand", "rand", "rand", "text", "holes", "zero"]


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


class Model:
    """What the mount must show: path -> ("f", bytes) | ("l", target) | ("d", None)."""

    def __init__(self):
        self.e = {"": ("d", None)}

    def files(self):
        return [p for p, (t, _) in self.e.items() if t == "f"]


def session1(rng, mnt, m, nfiles):
    for d in ["a", "a/b", "c", "c/d", "empty"]:
        os.mkdir(os.path.join(mnt, d))
        m.e[d] = ("d", None)
    dirs = ["", "a", "a/b", "c", "c/d"]
    shared = content(rng, "rand", 300_000)
    for i in range(nfiles):
        p = f"{rng.choice(dirs)}/f{i:03d}".lstrip("/")
        if rng.random() < 0.15:
            data = shared  # deduplicated
        else:
            data = content(rng, rng.choice(KINDS), rng.choice(SIZES))
        write(os.path.join(mnt, p), data)
        m.e[p] = ("f", data)
    os.symlink("a/b", os.path.join(mnt, "link_dir"))
    m.e["link_dir"] = ("l", "a/b")
    os.symlink("/nonexistent/target", os.path.join(mnt, "c/dangling"))
    m.e["c/dangling"] = ("l", "/nonexistent/target")
    f = rng.choice(m.files())
    os.link(os.path.join(mnt, f), os.path.join(mnt, "hardlink"))
    m.e["hardlink"] = m.e[f]
    return f


def session2(rng, mnt, m, nfiles, linked):
    files = [p for p in m.files() if p not in (linked, "hardlink")]
    rng.shuffle(files)
    # rename, delete, overwrite, append, truncate
    src = files.pop()
    os.rename(os.path.join(mnt, src), os.path.join(mnt, "c/renamed"))
    m.e["c/renamed"] = m.e.pop(src)
    gone = files.pop()
    os.unlink(os.path.join(mnt, gone))
    del m.e[gone]
    for p in files[:3]:
        data = content(rng, rng.choice(KINDS), rng.choice(SIZES))
        write(os.path.join(mnt, p), data)
        m.e[p] = ("f", data)
    for p in files[3:5]:
        more = content(rng, "rand", rng.choice([1, 5000, 200_000]))
        with open(os.path.join(mnt, p), "ab") as f:
            f.write(more)
        m.e[p] = ("f", m.e[p][1] + more)
    if len(files) > 5:
        p = files[5]
        n = len(m.e[p][1]) // 2
        os.truncate(os.path.join(mnt, p), n)
        m.e[p] = ("f", m.e[p][1][:n])
    os.mkdir(os.path.join(mnt, "new"))
    m.e["new"] = ("d", None)
    for i in range(nfiles // 2):
        p = f"new/g{i:03d}"
        data = content(rng, rng.choice(KINDS), rng.choice(SIZES))
        write(os.path.join(mnt, p), data)
        m.e[p] = ("f", data)


def fsync_root(mnt):
    fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- checking a mount

def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def compare(mnt, m, lost_paths):
    """Counts of the model's files on the mount: exact, listed lost (and absent), lost and not
    listed, wrong bytes; plus extra entries and problem lines."""
    exact = listed = unlisted = wrong = 0
    problems = []
    for p, (t, want) in sorted(m.e.items()):
        if t == "d":
            continue
        full = os.path.join(mnt, p)
        try:
            if t == "l":
                got = os.readlink(full)
            else:
                got = read_file(full)
        except OSError as e:
            if "/" + p in lost_paths:
                listed += 1
            else:
                unlisted += 1
                problems.append(f"/{p}: {os.strerror(e.errno)}")
            continue
        if got == want:
            exact += 1
            if "/" + p in lost_paths:
                problems.append(f"/{p}: listed as lost but reads back exactly")
        else:
            wrong += 1
            problems.append(f"/{p}: WRONG BYTES ({len(got)} bytes read, {len(want)} written)")
    extra = []
    for root, dirs, files in os.walk(mnt):
        rel = os.path.relpath(root, mnt)
        rel = "" if rel == "." else rel
        if rel.startswith("lost+found"):
            continue
        for n in dirs + files:
            p = os.path.join(rel, n) if rel else n
            if p not in m.e and p != "lost+found":
                extra.append(p)
    return exact, listed, unlisted, wrong, extra, problems


# ---------------------------------------------------------------- a trial

def index_files(store, pick_log):
    out = []
    for sub in ["index", "metalog"]:
        d = os.path.join(store, sub)
        for n in sorted(os.listdir(d)):
            full = os.path.join(d, n)
            if not os.path.isfile(full) or n == "LOCK" or n.startswith("LOG"):
                continue
            if os.path.getsize(full) == 0:
                continue
            out.append(full)
    return out


def file_kind(path):
    n = os.path.basename(path)
    if "/metalog/" in path:
        return "metalog snapshot" if n.startswith("snap-") else "metalog log"
    for pre, k in [("MANIFEST", "MANIFEST"), ("OPTIONS", "OPTIONS"), ("CURRENT", "CURRENT"),
                   ("IDENTITY", "IDENTITY")]:
        if n.startswith(pre):
            return k
    if n.endswith(".sst"):
        return "SST"
    if n.endswith(".log"):
        return "WAL"
    return "other"


# --cycle: trial n damages a file of kind CYCLE[n % len(CYCLE)] when the store has one
CYCLE = ["SST", "MANIFEST", "WAL", "CURRENT", "metalog snapshot", "metalog log", "OPTIONS",
         "IDENTITY"]


def flip(rng, files, pick, want_kind=None):
    if want_kind and any(file_kind(f) == want_kind for f in files):
        files = [f for f in files if file_kind(f) == want_kind]
    if pick == "bytes":
        sizes = [os.path.getsize(f) for f in files]
        x = rng.randrange(sum(sizes))
        for f, s in zip(files, sizes):
            if x < s:
                break
            x -= s
        off = x
    else:
        f = rng.choice(files)
        off = rng.randrange(os.path.getsize(f))
    with open(f, "r+b") as fh:
        fh.seek(off)
        b = fh.read(1)[0]
        x = rng.randrange(1, 256)
        fh.seek(off)
        fh.write(bytes([b ^ x]))
    return f, off, b, b ^ x


def probe_unrepaired(work, store, m):
    """Mount a copy of the damaged store, unrepaired: (mountable, exact, unreadable, wrong)."""
    copy = os.path.join(work, "copy")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(store, copy, symlinks=True)
    mnt = os.path.join(work, "mnt_copy")
    try:
        d = Daemon(copy, mnt, os.path.join(work, "copy.log"))
    except OSError:
        shutil.rmtree(copy, ignore_errors=True)
        return False, 0, 0, 0
    try:
        exact, _, unread, wrong, _, _ = compare(mnt, m, set())
    finally:
        try:
            d.stop()
        except Exception:
            d.kill()
    shutil.rmtree(copy, ignore_errors=True)
    return True, exact, unread, wrong


def trial(args, n, work):
    rng = random.Random(f"{args.seed}/{n}")
    scenario = args.scenario if args.scenario != "mixed" else rng.choice(["clean", "crash"])
    if args.cycle and args.scenario == "mixed" and CYCLE[(n - 1) % len(CYCLE)] == "WAL":
        scenario = "crash"  # a clean unmount leaves the write-ahead log empty
    store = os.path.join(work, "store")
    mnt = os.path.join(work, "mnt")
    dlog = os.path.join(work, "daemon.log")
    shutil.rmtree(store, ignore_errors=True)
    m = Model()
    res = {"trial": n, "scenario": scenario}

    d = Daemon(store, mnt, dlog)
    linked = session1(rng, mnt, m, args.files)
    d.stop()
    rc, out = run([CKPT, "repair", store])
    if rc != 0:
        raise SetupError(f"trial {n}: ckpt repair of the intact store failed:\n{out}")
    d = Daemon(store, mnt, dlog)
    session2(rng, mnt, m, args.files, linked)
    if scenario == "crash":
        fsync_root(mnt)
        d.kill()
    else:
        d.stop()

    files = index_files(store, True)
    f, off, old, new = flip(rng, files, args.pick,
                            CYCLE[(n - 1) % len(CYCLE)] if args.cycle else None)
    res.update(file=os.path.relpath(f, store), kind=file_kind(f), offset=off,
               size=os.path.getsize(f), byte=f"{old:02x}->{new:02x}")

    if not args.no_probe:
        mb, ex_b, unread_b, wrong_b = probe_unrepaired(work, store, m)
        res.update(mountable_before=mb, exact_before=ex_b, unreadable_before=unread_b,
                   wrong_before=wrong_b)

    rc, out = run([CKPT, "repair", store])
    lost = set()
    for line in out.splitlines():
        if line.startswith("lost: "):
            lost.add(line[6:].split(": ", 1)[0])
    res.update(repair_rc=rc, listed_lost=len(lost),
               fixed=sum(1 for x in out.splitlines() if x.startswith("fixed: ")),
               rebuilt="index rebuilt" in out or "index salvaged" in out)
    try:
        d = Daemon(store, mnt, dlog)
        res["mountable"] = True
    except OSError as e:
        res.update(mountable=False, files=len(m.files()), exact=0, lost=0, unlisted=0,
                   wrong=0, fsck_clean=False, problems=[f"mount: {e}"], repair_out=out)
        return res
    try:
        exact, listed, unlisted, wrong, extra, problems = compare(mnt, m, lost)
    finally:
        d.stop()
    rcf, fout = run([CKPT, "fsck", store])
    res.update(files=sum(1 for t, _ in m.e.values() if t != "d"), exact=exact, lost=listed,
               unlisted=unlisted, wrong=wrong, extra=len(extra), fsck_clean=rcf == 0,
               problems=problems + [f"extra entry: {x}" for x in extra])
    if rcf != 0:
        res["problems"].append("fsck: " + fout.strip().replace("\n", " | "))
    if problems or rcf != 0 or rc not in (0, 1):
        res["repair_out"] = out
    return res


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--files", type=int, default=24, help="files of the first session")
    ap.add_argument("--scenario", choices=["clean", "crash", "mixed"], default="mixed")
    ap.add_argument("--pick", choices=["file", "bytes"], default="file",
                    help="file: a file at random, then a byte in it (default); bytes: a byte "
                    "uniformly over all the files")
    ap.add_argument("--cycle", action="store_true",
                    help="trial n damages a file of the n-th kind of " + ", ".join(CYCLE) +
                    " (in turn), instead of any file")
    ap.add_argument("--no-probe", action="store_true",
                    help="do not mount an unrepaired copy of each damaged store")
    ap.add_argument("--json", help="write every trial's result to this file")
    ap.add_argument("--tmp", help="scratch directory (default: a new one under $TMPDIR)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    for b in (CKPTFS, CKPT):
        if not os.access(b, os.X_OK):
            raise SetupError(f"{b} is missing (build the tree, or set CKPTFS / CKPT)")
    if not os.path.exists("/dev/fuse") or os.geteuid() != 0:
        raise SetupError("needs root and /dev/fuse")
    work = args.tmp or tempfile.mkdtemp(prefix="ckptfs-metaflip.")
    os.makedirs(work, exist_ok=True)
    log(f"# meta_flip: seed {args.seed}, {args.trials} trials, scenario {args.scenario}, "
        f"pick {args.pick}, scratch {work}")
    results = []
    t0 = time.monotonic()
    try:
        for n in range(1, args.trials + 1):
            r = trial(args, n, work)
            results.append(r)
            bad = (not r["mountable"] or r["wrong"] or r["unlisted"] or not r["fsck_clean"] or
                   r.get("wrong_before"))
            log(f"trial {n:4d} {r['scenario']:5s} {r['kind']:16s} {r['file']:40s} "
                f"@{r['offset']:<8d} before: "
                f"{'-' if 'mountable_before' not in r else ('mount' if r['mountable_before'] else 'NO MOUNT')}"
                f" | repair rc {r['repair_rc']}{' rebuilt' if r['rebuilt'] else ''}"
                f" | mountable {'yes' if r['mountable'] else 'NO'}, {r['exact']}/{r['files']} "
                f"exact, {r['lost']} listed lost, {r['unlisted']} unlisted, {r['wrong']} wrong, "
                f"fsck {'clean' if r['fsck_clean'] else 'NOT CLEAN'}{'  FAIL' if bad else ''}")
            if bad or args.verbose:
                for p in r.get("problems", []):
                    log(f"#   {p}")
                if "repair_out" in r:
                    for line in r["repair_out"].splitlines()[:30]:
                        log(f"#   repair: {line}")
    finally:
        for d in list(LIVE):
            d.kill()
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"seed": args.seed, "scenario": args.scenario, "pick": args.pick,
                           "trials": results}, f, indent=1)
        if not args.keep and not args.tmp:
            shutil.rmtree(work, ignore_errors=True)
    summarize(results, time.monotonic() - t0)
    fails = [r for r in results if not r["mountable"] or r["wrong"] or r["unlisted"] or
             not r["fsck_clean"] or r.get("wrong_before")]
    return 1 if fails else 0


def summarize(results, secs):
    tot = lambda k: sum(r.get(k, 0) or 0 for r in results)  # noqa: E731
    n = len(results)
    log(f"# {n} trials in {secs:.0f} s")
    if "mountable_before" in (results[0] if results else {}):
        log(f"# before repair: {sum(1 for r in results if r['mountable_before'])} of {n} "
            f"mountable; files read back exactly {tot('exact_before')}, unreadable "
            f"{tot('unreadable_before')}, wrong {tot('wrong_before')}")
    log(f"# after repair: {sum(1 for r in results if r['mountable'])} of {n} mountable, "
        f"{sum(1 for r in results if r['fsck_clean'])} fsck-clean, "
        f"{sum(1 for r in results if r['rebuilt'])} with the index rebuilt; files: "
        f"{tot('files')} expected, {tot('exact')} recovered exactly, {tot('lost')} listed "
        f"as lost, {tot('unlisted')} lost unlisted, {tot('wrong')} wrong")
    kinds = sorted({r["kind"] for r in results})
    for k in kinds:
        rs = [r for r in results if r["kind"] == k]
        log(f"#   {k:16s} {len(rs):4d} trials: unmountable before repair "
            f"{sum(1 for r in rs if not r.get('mountable_before', True))}, rebuilt "
            f"{sum(1 for r in rs if r['rebuilt'])}, after repair: mountable "
            f"{sum(1 for r in rs if r['mountable'])}, exact {sum(r['exact'] for r in rs)}/"
            f"{sum(r['files'] for r in rs)}, lost {sum(r['lost'] for r in rs)}, wrong "
            f"{sum(r['wrong'] for r in rs)}")


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except SetupError as e:
        print(f"meta_flip: {e}", file=sys.stderr)
        sys.exit(2)
