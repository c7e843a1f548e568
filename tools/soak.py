#!/usr/bin/python3
"""Memory soak of the ckptfs daemon: is its memory bounded over a long uptime?

Rounds, each:
  save    16 threads write the 16 TP shards of one checkpoint step at once (plain writes of
          safetensors files with sharding metadata, docs/views.md section 3), into a temporary
          directory renamed into place, as training jobs save;
  views   list and read the step through two resharded views (tp1_pp1: one consolidated file,
          read whole and checked against the shards; tp4_pp1: one file's header), and list the
          previous step's view again;
  churn   16 threads read the shards back at once: with the save, a burst of requests that
          makes libfuse start worker threads up to the daemon's max_threads (16), after which
          it ends those beyond max_idle_threads (8) again (the daemon's defaults, fs/main.c);
  prune   steps older than the last 3 are deleted, so the store stays the same size;
then one second idle, and the daemon's RSS (VmRSS: the lowest of three samples 0.5 s apart)
and threads are sampled.

Each shard holds the same tensor bytes every round (the headers differ): the chunks of a
deleted step then stay referenced by the later steps.  With --fresh-data every round's bytes are
new, and the chunk records of the deleted steps stay in the store's index until `ckpt gc`
(docs/reliability.md, "Memory over uptime"): the index, and the daemon's memory that grows with
it, then grow round after round whatever the daemon does with its own memory.

The headers are large in JSON values rather than in tensors: 100 tensors whose metadata entries
carry 1,280 integers each (an unknown key, which readers ignore) make headers of 0.64 MiB that
the daemon parses into several MiB of JSON values, as it does a header of many thousand
tensors, while each file has 100 chunks, not thousands: the metadata the store writes per round stays
small, so that its index's write buffer (RocksDB memtables of 64 MiB, filled and flushed as a
saw tooth) does not hide what the rounds leave behind.  --tensors 11000 --pad 0 gives headers
of 2 MiB made of tensors, as issue 22's probe had.

Its own daemon runs with -o cache_size=32M unless told otherwise: the chunk cache, a cache of
decompressed chunks bounded by cache_size, fills at the rate the rounds read chunks it does
not hold (some MiB a round); at the default 256 MiB it is still filling after 20 rounds, which
looks like growth, at 32 MiB it is full within the warm-up.

It passes when the RSS after the last round is at most the level after the warm-up rounds (the
highest sample of rounds WARMUP-2 .. WARMUP) plus MARGIN MiB, and every round's checks passed.
The output is TAP-like ("ok - ..." / "not ok - ..."; "#" lines are notes); exit status 0 when
it passed.

Without --mount it starts its own daemon (CKPTFS, default fs/ckptfs of this tree) in the
foreground on a new store in a temporary directory, and unmounts and removes it at the end;
a daemon that then exits with a non-zero status fails the run (a sanitizer build's
LeakSanitizer report does that).  With --mount MNT --pid PID it soaks a daemon already serving
MNT (tests/integration/t_soak.sh).

  tools/soak.py                             the short form: 20 rounds, 10 of warm-up
  tools/soak.py --minutes 15 --warmup 30    the long form (docs/reliability.md,
                                            "Memory over uptime")
"""
import argparse
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

MiB = 1024 * 1024
SHARDS = 16           # TP ranks: files per step, written at once
COLS = 8              # each tensor is [SHARDS, COLS] F32; shard t holds row t
ROW = COLS * 4        # bytes of one shard's piece of a tensor
KEEP_STEPS = 3
TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tap(cond, desc):
    print(("ok - " if cond else "not ok - ") + desc, flush=True)
    return bool(cond)


def note(msg):
    print("# " + msg, flush=True)


def tensor_name(i):
    return f"model.layers.{i // 8}.mlp.w{i % 8}"


def shard_bytes(step, t, ntensors, pad, data):
    """The safetensors file of TP rank t: row t of every tensor, data the rows' bytes; each
    sharding metadata entry carries a list of pad integers under a key readers ignore."""
    header = {}
    ents = {}
    extra = list(range(pad))
    for i in range(ntensors):
        name = tensor_name(i)
        header[name] = {"dtype": "F32", "shape": [1, COLS],
                        "data_offsets": [i * ROW, (i + 1) * ROW]}
        ents[name] = {"global_shape": [SHARDS, COLS], "offsets": [t, 0], "tp_dim": 0}
        if pad:
            ents[name]["soak_pad"] = extra
    meta = {"version": 1, "group": "model", "num_layers": (ntensors + 7) // 8,
            "tensors": ents}
    header["__metadata__"] = {"format": "pt", "step": str(step), "ckptfs": json.dumps(meta)}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-(8 + len(head)) % 8)
    return struct.pack("<Q", len(head)) + head, data


def parse_header(f):
    """(header dict, data start) of an open safetensors file."""
    n = struct.unpack("<Q", f.read(8))[0]
    return json.loads(f.read(n)), 8 + n


def run_threads(fns):
    """Run each fn in its own thread at once; the list of exceptions raised."""
    errs = []
    lock = threading.Lock()
    go = threading.Barrier(len(fns))

    def body(fn):
        try:
            go.wait()
            fn()
        except Exception as e:  # reported by the caller, with the others
            with lock:
                errs.append(e)

    ts = [threading.Thread(target=body, args=(fn,)) for fn in fns]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errs


class Daemon:
    """The daemon soaked: started here (own store) or given (--mount, --pid)."""

    def __init__(self, args):
        self.proc = None
        self.tmp = None
        self.log = None
        if args.mount:
            self.mnt, self.pid = args.mount, args.pid
            return
        exe = os.environ.get("CKPTFS", os.path.join(TOP, "fs", "ckptfs"))
        self.tmp = tempfile.mkdtemp(prefix="ckptfs-soak.")
        self.mnt = os.path.join(self.tmp, "mnt")
        store = os.path.join(self.tmp, "store")
        os.mkdir(self.mnt)
        self.log = os.path.join(self.tmp, "daemon.log")
        cmd = [exe, store, self.mnt, "-f"] + (["-o", args.options] if args.options else [])
        self.keep = args.keep
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.pid = self.proc.pid
        for _ in range(200):
            if os.path.ismount(self.mnt) or self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if not os.path.ismount(self.mnt):
            self.stop()
            raise RuntimeError(f"{' '.join(cmd)} did not mount")
        note(f"daemon {exe} (pid {self.pid}) on {self.mnt}")

    def rss(self):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS for pid {self.pid}")

    def tids(self):
        return set(os.listdir(f"/proc/{self.pid}/task"))

    def stop(self):
        """Unmount and wait for an own daemon; its exit status (None: not ours)."""
        if self.proc is None:
            return None
        rc = None
        for i in range(50):
            if not os.path.ismount(self.mnt):
                break
            subprocess.run(["fusermount3", "-u", self.mnt], stderr=subprocess.DEVNULL)
            if os.path.ismount(self.mnt):
                time.sleep(0.2)
        if os.path.ismount(self.mnt):
            subprocess.run(["fusermount3", "-uz", self.mnt], stderr=subprocess.DEVNULL)
        try:
            rc = self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            note(f"daemon {self.pid} still running 120 s after unmount; its threads:")
            if shutil.which("gdb"):
                bt = subprocess.run(["gdb", "-p", str(self.pid), "-batch", "-ex",
                                     "thread apply all bt"], capture_output=True, text=True,
                                    timeout=120)
                for line in bt.stdout.splitlines():
                    if line.startswith(("Thread", "#")):
                        note("  " + line)
            self.proc.kill()
            rc = self.proc.wait()
            note(f"daemon {self.pid} killed")
        if rc != 0 and self.log and os.path.exists(self.log):
            with open(self.log, errors="replace") as f:
                lines = f.readlines()
            for line in lines[-60:]:
                note("daemon: " + line.rstrip("\n"))
        if self.keep:
            note(f"kept {self.tmp} (store, daemon.log)")
        elif not os.path.ismount(self.mnt):
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            note(f"{self.mnt} is still mounted; {self.tmp} kept")
        return rc


class Soak:
    def __init__(self, d, ntensors, pad, seed, fresh):
        self.d = d
        self.n = ntensors
        self.pad = pad
        self.rng = random.Random(seed)
        self.fresh = fresh
        self.data = [self.rng.randbytes(self.n * ROW) for _ in range(SHARDS)]
        self.root = os.path.join(d.mnt, "soak")
        os.makedirs(self.root, exist_ok=True)
        self.steps = []   # names of the steps on the mount, oldest first
        self.rows = {}    # step name -> the shards' data (list of SHARDS bytes)

    def save(self, step):
        """Write step's shards from SHARDS threads at once; its directory name."""
        name = f"step_{step:06d}"
        tmp = os.path.join(self.root, name + ".tmp")
        os.mkdir(tmp)
        if self.fresh:
            self.data = [self.rng.randbytes(self.n * ROW) for _ in range(SHARDS)]
        data = self.data
        files = [shard_bytes(step, t, self.n, self.pad, data[t]) for t in range(SHARDS)]
        self.header_bytes = len(files[0][0])

        def write(t):
            def fn():
                head, body = files[t]
                with open(os.path.join(tmp, f"model-tp{t:02d}.safetensors"), "wb") as f:
                    f.write(head)
                    f.write(body)
            return fn

        errs = run_threads([write(t) for t in range(SHARDS)])
        if errs:
            raise RuntimeError(f"saving {name}: {errs[0]!r}")
        os.rename(tmp, os.path.join(self.root, name))
        self.steps.append(name)
        self.rows[name] = data
        return name

    def check_views(self, name, nsample=64):
        """The step read through tp1_pp1 (whole file, sampled tensors compared with the
        shards) and tp4_pp1 (one file's header); a problem's description or None."""
        vdir = os.path.join(self.d.mnt, "tp1_pp1", "soak", name)
        got = sorted(os.listdir(vdir))
        if got != ["model.safetensors"]:
            return f"tp1_pp1/soak/{name} lists {got}"
        with open(os.path.join(vdir, "model.safetensors"), "rb") as f:
            hdr, start = parse_header(f)
            blob = f.read()
        if len(hdr) - ("__metadata__" in hdr) != self.n:
            return f"tp1_pp1/soak/{name}/model.safetensors has {len(hdr)} entries"
        data = self.rows[name]
        for i in self.rng.sample(range(self.n), min(nsample, self.n)):
            e = hdr.get(tensor_name(i))
            if not e or e["shape"] != [SHARDS, COLS] or e["dtype"] != "F32":
                return f"tensor {tensor_name(i)} of {name}: {e}"
            a, b = e["data_offsets"]
            want = b"".join(data[t][i * ROW:(i + 1) * ROW] for t in range(SHARDS))
            if blob[a:b] != want:
                return f"tensor {tensor_name(i)} of {name}: wrong bytes in the tp1_pp1 view"
        vdir4 = os.path.join(self.d.mnt, "tp4_pp1", "soak", name)
        got = sorted(os.listdir(vdir4))
        want = [f"model_tp{t}_pp0.safetensors" for t in range(4)]
        if got != want:
            return f"tp4_pp1/soak/{name} lists {got}, not {want}"
        with open(os.path.join(vdir4, want[2]), "rb") as f:
            hdr, _ = parse_header(f)
        e = hdr.get(tensor_name(0))
        if not e or e["shape"] != [SHARDS // 4, COLS]:
            return f"tp4_pp1/soak/{name}/{want[2]}: tensor 0 is {e}"
        return None

    def churn(self, name):
        """SHARDS threads read the step's shards back at once (passthrough reads)."""
        sdir = os.path.join(self.root, name)

        def read(t):
            def fn():
                with open(os.path.join(sdir, f"model-tp{t:02d}.safetensors"), "rb") as f:
                    while f.read(MiB):
                        pass
            return fn

        errs = run_threads([read(t) for t in range(SHARDS)])
        if errs:
            raise RuntimeError(f"reading {name}: {errs[0]!r}")

    def prune(self):
        while len(self.steps) > KEEP_STEPS:
            old = self.steps.pop(0)
            shutil.rmtree(os.path.join(self.root, old))
            del self.rows[old]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--minutes", type=float, help="run rounds for this long")
    how.add_argument("--rounds", type=int, help="run this many rounds (default 20)")
    ap.add_argument("--warmup", type=int, default=10,
                    help="rounds before the reference level (default 10)")
    ap.add_argument("--margin", type=float, default=64,
                    help="MiB the last RSS may exceed the reference level by (default 64)")
    ap.add_argument("--tensors", type=int, default=100, help="tensors per shard (default 100)")
    ap.add_argument("--pad", type=int, default=1280,
                    help="integers in each tensor's sharding metadata entry, under a key "
                    "readers ignore (default 1280: headers of 0.64 MiB; see above)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fresh-data", action="store_true",
                    help="new tensor bytes every round (default: each shard's bytes are the same "
                    "every round, only the headers change; see below)")
    ap.add_argument("--no-rss-check", action="store_true",
                    help="report the RSS but do not judge it (a sanitizer build: ASan's "
                    "quarantine and shadow memory are part of the RSS)")
    ap.add_argument("-o", "--options", default="cache_size=32M",
                    help="the daemon's -o options (its own daemon only; default cache_size=32M, "
                    "see below)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the temporary directory (store, daemon.log; its own daemon only)")
    ap.add_argument("--mount", help="soak the daemon serving this mount point (with --pid)")
    ap.add_argument("--pid", type=int, help="that daemon's process id")
    args = ap.parse_args(argv)
    if bool(args.mount) != bool(args.pid):
        ap.error("--mount and --pid go together")
    if args.mount and (args.options != ap.get_default("options") or args.keep):
        ap.error("--options and --keep are for a daemon started here, not with --mount")
    if args.minutes is None and args.rounds is None:
        args.rounds = 20
    if args.warmup < 3:
        ap.error("--warmup: at least 3 rounds")
    if args.rounds is not None and args.rounds <= args.warmup:
        ap.error("--rounds: more than the warm-up rounds")

    d = Daemon(args)
    ok = True
    rss = []
    try:
        s = Soak(d, args.tensors, args.pad, args.seed, args.fresh_data)
        seen = d.tids()
        started = 0
        t0 = time.monotonic()
        end = t0 + args.minutes * 60 if args.minutes is not None else None
        r = 0
        while (r < args.rounds) if end is None else (time.monotonic() < end or r <= args.warmup):
            r += 1
            t = time.monotonic()
            name = s.save(r)
            t_save = time.monotonic() - t
            if r == 1:
                note(f"{SHARDS} shards of {args.tensors} tensors a step, headers of "
                     f"{s.header_bytes / MiB:.2f} MiB")
            bad = s.check_views(name)
            if bad is None and len(s.steps) > 1:
                prev = s.steps[-2]
                if os.listdir(os.path.join(d.mnt, "tp1_pp1", "soak", prev)) != [
                        "model.safetensors"]:
                    bad = f"tp1_pp1/soak/{prev} no longer lists its view file"
            if bad is not None:
                ok = tap(False, f"round {r}: {bad}")
                break
            t_views = time.monotonic() - t - t_save
            s.churn(name)
            s.prune()
            # the lowest of three samples after a second idle: background work of the
            # round (compression, compaction) may still hold transient buffers
            samples = []
            for _ in range(3):
                time.sleep(1 if not samples else 0.5)
                samples.append(d.rss())
            now = d.tids()
            started += len(now - seen)
            seen |= now
            rss.append(min(samples))
            note(f"round {r}: {time.monotonic() - t:.1f} s (save {t_save:.1f}, views "
                 f"{t_views:.1f}), RSS {rss[-1] / MiB:.1f} MiB, "
                 f"{len(now)} threads, {started} started since the first round")
        else:
            tap(True, f"{r} rounds in {(time.monotonic() - t0) / 60:.1f} min: every step "
                f"saved by {SHARDS} writers at once read back through its views")
        if ok:
            ok = tap(started > 0, f"libfuse started {started} worker threads over the rounds "
                     "(it ends the idle ones beyond max_idle_threads)") and ok
            ref = max(rss[args.warmup - 3:args.warmup])
            last = rss[-1]
            tail = rss[args.warmup:]
            slope = 0.0
            if len(tail) > 1:
                xs = range(len(tail))
                mx, my = sum(xs) / len(tail), sum(tail) / len(tail)
                slope = (sum((x - mx) * (y - my) for x, y in zip(xs, tail)) /
                         sum((x - mx) ** 2 for x in xs))
            desc = (f"RSS after the last round {last / MiB:.1f} MiB, after the warm-up "
                    f"{ref / MiB:.1f} MiB (max of rounds {args.warmup - 2}-{args.warmup}), "
                    f"margin {args.margin:g} MiB; highest {max(rss) / MiB:.1f} MiB; "
                    f"trend after the warm-up {slope / MiB:+.2f} MiB per round")
            if args.no_rss_check:
                note(desc + " (not judged: --no-rss-check)")
            else:
                ok = tap(last <= ref + args.margin * MiB, desc) and ok
    except Exception as e:
        ok = tap(False, f"soak stopped: {e!r}")
        for line in traceback.format_exc().splitlines():
            note(line)
        if d.log and os.path.exists(d.log):
            with open(d.log, errors="replace") as f:
                for line in f.readlines()[-30:]:
                    note("daemon: " + line.rstrip())
    finally:
        rc = d.stop()
        if rc is not None:
            ok = tap(rc == 0, f"the daemon exited with status {rc} after unmount") and ok
    return 0 if ok else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main(sys.argv[1:]))
