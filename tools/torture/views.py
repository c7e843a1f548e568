"""Views rounds: 16 writers of safetensors shards and 16 readers of their resharded views for
a given time, with a deadlock watchdog.

Writer w saves step after step into w<w>/step_<k>/: the shards of a small Llama-like model
(embedding, per-layer q_proj split on dim 0, down_proj split on dim 1, replicated norms; F32
or BF16; 2 to 5 layers) as a job with 1, 2 or 4 tensor-parallel ranks would write them, with
the "ckptfs" sharding metadata of docs/views.md section 3 (written by plain Python, as its
section 3.1 shows).  A step is written into step_<k>.tmp/ and renamed into place, then
published to the readers; a writer keeps its last three steps and deletes older ones that no
reader is using.

Reader r takes a published step and a layout (tp1_pp1, tp2_pp1, tp4_pp1, tp2_pp2, tp1_pp2,
tp3_pp1), lists MNT/tpT_ppP/w<w>/step_<k>/ (exactly the view files of that layout must be
there) and reads every view file whole: each tensor of the stage, cut to the rank's part
(torch.chunk, docs/views.md section 5), must hold exactly the bytes of the global tensor.

The watchdog: every worker notes when its current operation started; one that has run for
longer than the watchdog time (default 60 s), or no operation finishing in all workers for
that long, is a deadlock: the daemon's thread stacks (gdb, else /proc/PID/task/*/stack) and
the suite's own are printed, and the round fails.
"""
import json
import os
import shutil
import struct
import threading
import time

from tlib import Daemon, Failure, log, python_stacks, thread_stacks

LAYOUTS = [(1, 1), (2, 1), (4, 1), (2, 2), (1, 2), (3, 1)]
ESIZE = {"F32": 4, "BF16": 2}


def chunk_bounds(size, parts, t):
    c = -(-size // parts)
    return min(t * c, size), min((t + 1) * c, size)


def part_bytes(raw, shape, esize, dim, parts, t):
    """The bytes of TP part t of a row-major tensor (1-D or 2-D) cut along dim."""
    if dim < 0:
        return raw, list(shape)
    a, b = chunk_bounds(shape[dim], parts, t)
    if len(shape) == 1:
        return raw[a * esize:b * esize], [b - a]
    rows, cols = shape
    if dim == 0:
        return raw[a * cols * esize:b * cols * esize], [b - a, cols]
    out = bytearray()
    for r in range(rows):
        out += raw[(r * cols + a) * esize:(r * cols + b) * esize]
    return bytes(out), [rows, b - a]


def stage_of(pp, n, P):
    if pp == "first":
        return [0]
    if pp == "last":
        return [P - 1]
    for p in range(P):
        if (p * n) // P <= pp < ((p + 1) * n) // P:
            return [p]
    return [P - 1]


def st_bytes(tensors, meta):
    header = {"__metadata__": {"format": "pt", "ckptfs": json.dumps(meta)}}
    off = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-(8 + len(head)) % 8)
    return struct.pack("<Q", len(head)) + head + b"".join(t[3] for t in tensors)


class Step:
    """One saved step: its global tensors (name -> (dtype, shape, bytes, tp_dim, pp))."""

    def __init__(self, rng):
        self.layers = rng.randint(2, 5)
        h = rng.choice([32, 48, 64])
        inter = 2 * h
        vocab = rng.choice([250, 256])
        dt = rng.choice(["F32", "BF16"])
        self.tp = rng.choice([1, 2, 2, 4])
        self.t = {}

        def add(name, shape, dim, pp):
            n = 1
            for s in shape:
                n *= s
            self.t[name] = (dt, shape, rng.randbytes(n * ESIZE[dt]), dim, pp)
        add("model.embed_tokens.weight", [vocab, h], 0, "first")
        for i in range(self.layers):
            add(f"model.layers.{i}.self_attn.q_proj.weight", [h, h], 0, i)
            add(f"model.layers.{i}.mlp.down_proj.weight", [h, inter], 1, i)
            add(f"model.layers.{i}.input_layernorm.weight", [h], -1, i)
        add("model.norm.weight", [h], -1, "last")

    def shards(self):
        """{file name: bytes} of the shards a job with self.tp ranks writes."""
        out = {}
        for r in range(self.tp):
            tensors, meta = [], {}
            for name, (dt, shape, raw, dim, pp) in sorted(self.t.items()):
                data, pshape = part_bytes(raw, shape, ESIZE[dt], dim, self.tp, r)
                offs = [0] * len(shape)
                if dim >= 0:
                    offs[dim] = chunk_bounds(shape[dim], self.tp, r)[0]
                tensors.append((name, dt, pshape, data))
                meta[name] = {"global_shape": shape, "offsets": offs, "tp_dim": dim, "pp": pp}
            out[f"model-tp{r}.safetensors"] = st_bytes(
                tensors, {"version": 1, "group": "model", "num_layers": self.layers,
                          "tensors": meta})
        return out

    def expected(self, T, P, t, p):
        """{name: (dtype, shape, bytes)} of view file (t, p) of layout tpT_ppP."""
        out = {}
        for name, (dt, shape, raw, dim, pp) in self.t.items():
            if p not in stage_of(pp, self.layers, P):
                continue
            data, pshape = part_bytes(raw, shape, ESIZE[dt], dim, T, t)
            out[name] = (dt, pshape, data)
        return out


def parse_view(buf):
    n = struct.unpack_from("<Q", buf)[0]
    head = json.loads(buf[8:8 + n])
    base = 8 + n
    out = {}
    for name, v in head.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[name] = (v["dtype"], v["shape"], buf[base + a:base + b])
    return out


class Worker(threading.Thread):
    def __init__(self, suite, name, fn, rng):
        super().__init__(name=name, daemon=True)
        self.s = suite
        self.fn = fn
        self.rng = rng
        self.started = None   # monotonic time the current operation started, or None
        self.what = ""
        self.ops = 0
        self.error = None

    def op(self, what):
        self.what = what
        self.started = time.monotonic()

    def done(self):
        self.started = None
        self.ops += 1
        self.s.last_progress = time.monotonic()

    def run(self):
        try:
            self.fn(self)
        except Exception as e:  # a failed check or an OSError: the round fails with it
            if not self.s.stop.is_set() or not self.s.killed:
                self.error = f"{self.name} ({self.what}): {type(e).__name__}: {e}"
            self.s.stop.set()


class ViewsSuite:
    kind = "views"

    def __init__(self, env, stats, tmp, seconds=60, watchdog=60, short=False):
        self.env = env
        self.stats = stats
        self.dir = os.path.join(tmp, "views")
        os.makedirs(self.dir, exist_ok=True)
        self.mnt = os.path.join(self.dir, "mnt")
        self.seconds = seconds
        self.watchdog_s = watchdog
        self.nwriters = self.nreaders = 16
        self.daemon = None

    # ------------------------------------------------------------ workers

    def writer(self, w):
        wi = int(w.name[1:])
        d = os.path.join(self.mnt, f"w{wi}")
        os.mkdir(d)
        k = 0
        mine = []
        while not self.stop.is_set():
            k += 1
            step = Step(w.rng)
            rel = f"w{wi}/step_{k}"
            tmp = os.path.join(self.mnt, rel + ".tmp")
            w.op(f"write {rel}")
            os.mkdir(tmp)
            for name, data in step.shards().items():
                with open(os.path.join(tmp, name), "wb") as f:
                    f.write(data)
                self.count(written=1)
            os.rename(tmp, os.path.join(self.mnt, rel))
            w.done()
            with self.lock:
                self.published[rel] = step
                self.in_use.setdefault(rel, 0)
            mine.append(rel)
            # keep three steps; delete older ones no reader uses
            for old in mine[:-3]:
                with self.lock:
                    if self.in_use.get(old):
                        continue
                    del self.published[old]
                    del self.in_use[old]
                w.op(f"delete {old}")
                shutil.rmtree(os.path.join(self.mnt, old))
                w.done()
                mine.remove(old)

    def reader(self, w):
        while not self.stop.is_set():
            with self.lock:
                if not self.published:
                    rel = None
                else:
                    rel = w.rng.choice(sorted(self.published))
                    step = self.published[rel]
                    self.in_use[rel] += 1
            if rel is None:
                time.sleep(0.05)
                continue
            try:
                T, P = w.rng.choice(LAYOUTS)
                self.read_view(w, rel, step, T, P)
            finally:
                with self.lock:
                    self.in_use[rel] -= 1

    def read_view(self, w, rel, step, T, P):
        lay = f"tp{T}_pp{P}"
        vdir = os.path.join(self.mnt, lay, rel)
        w.op(f"list {lay}/{rel}")
        names = sorted(os.listdir(vdir))
        w.done()
        want_names = ["model.safetensors"] if (T, P) == (1, 1) else sorted(
            f"model_tp{t}_pp{p}.safetensors" for t in range(T) for p in range(P))
        if names != want_names:
            raise Failure(f"{lay}/{rel}: lists {names}, want {want_names}")
        for t in range(T):
            for p in range(P):
                name = want_names[0] if (T, P) == (1, 1) else f"model_tp{t}_pp{p}.safetensors"
                w.op(f"read {lay}/{rel}/{name}")
                with open(os.path.join(vdir, name), "rb") as f:
                    buf = f.read()
                w.done()
                got = parse_view(buf)
                want = step.expected(T, P, t, p)
                if set(got) != set(want):
                    raise Failure(f"{lay}/{rel}/{name}: tensors {sorted(set(got) ^ set(want))} "
                                  f"differ from the expected set")
                for n, (dt, shape, data) in want.items():
                    g = got[n]
                    if g[0] != dt or list(g[1]) != shape or g[2] != data:
                        raise Failure(f"{lay}/{rel}/{name}: tensor {n}: {g[0]} {g[1]}, "
                                      f"{len(g[2])} bytes{'' if g[2] != data else ''}; want {dt} "
                                      f"{shape}, {len(data)} bytes; the bytes "
                                      f"{'differ' if g[2] != data else 'match'}")
                self.count(verified=1)

    def count(self, written=0, verified=0):
        with self.lock:
            self.written += written
            self.verified += verified

    # ------------------------------------------------------------ the watchdog

    def watchdog(self, workers):
        while not self.stop.wait(1.0):
            now = time.monotonic()
            stuck = [w for w in workers if w.started is not None and
                     now - w.started > self.watchdog_s]
            idle = now - self.last_progress > self.watchdog_s
            if not stuck and not idle:
                continue
            what = ", ".join(f"{w.name}: {w.what} for {now - w.started:.0f} s"
                             for w in stuck[:6]) + (f" (and {len(stuck) - 6} more)"
                                                    if len(stuck) > 6 else "")
            msg = (f"deadlock watchdog: " + (what or f"no operation finished for "
                                             f"{now - self.last_progress:.0f} s"))
            stacks = thread_stacks(self.daemon.pid) if self.daemon and self.daemon.alive() else ""
            self.stats.fail(self.kind, f"{msg}\n  daemon threads:\n{stacks}\n  suite threads:\n"
                            f"{python_stacks()}")
            self.deadlocked = True
            self.killed = True
            self.stop.set()
            self.daemon.kill9()
            return

    # ------------------------------------------------------------ a round

    def round(self, rng, budget_s):
        store = os.path.join(self.dir, "store")
        shutil.rmtree(store, ignore_errors=True)
        self.daemon = Daemon(self.env, store, self.mnt, [],
                             logfile=os.path.join(self.dir, "daemon.log"))
        self.daemon.start()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.published = {}
        self.in_use = {}
        self.written = self.verified = 0
        self.killed = self.deadlocked = False
        self.last_progress = time.monotonic()
        workers = [Worker(self, f"w{i}", self.writer, rng.__class__(rng.getrandbits(64)))
                   for i in range(self.nwriters)]
        workers += [Worker(self, f"r{i}", self.reader, rng.__class__(rng.getrandbits(64)))
                    for i in range(self.nreaders)]
        wd = threading.Thread(target=self.watchdog, args=(workers,), daemon=True)
        for w in workers:
            w.start()
        wd.start()
        t_end = time.monotonic() + max(2.0, min(self.seconds, budget_s))
        while time.monotonic() < t_end and not self.stop.is_set():
            time.sleep(0.2)
            if not self.daemon.alive():
                self.stats.fail(self.kind, f"the daemon died:\n{self.daemon.log_tail()}")
                self.killed = True
                self.stop.set()
        self.stop.set()
        for w in workers:
            w.join(timeout=self.watchdog_s + 30)
        hung = [w.name for w in workers if w.is_alive()]
        wd.join(timeout=120)
        if hung and not self.deadlocked:
            stacks = thread_stacks(self.daemon.pid) if self.daemon.alive() else ""
            self.stats.fail(self.kind, f"workers {hung} did not stop; daemon threads:\n{stacks}")
            self.daemon.kill9()
            self.killed = True
        errors = [w.error for w in workers if w.error]
        for e in errors:
            self.stats.fail(self.kind, e)
        ops = sum(w.ops for w in workers)
        if not self.killed and not errors:
            self.final_check(rng)
            self.daemon.stop()
            self.daemon = None
            rc, out = self.env.ckpt_run("fsck", store)
            if rc != 0:
                self.stats.fail(self.kind, f"ckpt fsck exited {rc}:\n{out[-1500:]}")
        else:
            self.abort()
        self.stats.add(self.kind, rounds=1, operations=ops, files_verified=self.verified,
                       wrong=len(errors), shard_files_written=self.written)
        if self.env.verbose:
            log(f"  views: {ops} operations, {self.written} shard files written, "
                f"{self.verified} view files verified")

    def final_check(self, rng):
        """Every published step once more at tp1_pp1 and one other layout."""
        class W:
            def op(self, what):
                pass

            def done(self):
                pass
        for rel, step in sorted(self.published.items()):
            for T, P in ((1, 1), rng.choice(LAYOUTS)):
                try:
                    self.read_view(W(), rel, step, T, P)
                except (Failure, OSError) as e:
                    self.stats.fail(self.kind, f"final check: {e}")

    def finish(self, rng):
        pass

    def abort(self):
        if self.daemon is not None:
            try:
                self.daemon.kill9()
            except Failure:
                pass
            self.daemon = None
