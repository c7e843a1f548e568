#!/usr/bin/python3
"""Synthetic sharded checkpoints of a GPT-style model, for tools/bench/run.

Model (Model): a decoder-only transformer with a 32,000-token vocabulary,
hidden size H and L layers, each layer holding a fused qkv_proj (3H x H,
column-parallel), o_proj (H x H, row-parallel), up_proj (4H x H, column),
down_proj (H x 4H, row) and two layer norms (H, replicated), plus
embed_tokens (V x H, first stage), a final norm and lm_head (V x H, last
stage).  H and L are chosen so that weights + Adam moments come close to the
requested size: bf16 weights (2 bytes per parameter) and fp32 exp_avg and
exp_avg_sq (8 bytes), 10 bytes per parameter.  The MoE variant (case 5) has
many small bf16 tensors and no optimizer state.

Values: bf16 weights ~ N(0, 0.02); exp_avg ~ N(0, 1e-3) and
exp_avg_sq ~ N(0, 1e-3)^2 in fp32.  Sampling goes through 65,536-entry
quantile tables (one random 16-bit index per bf16 value; fp32 values take
sign, exponent and 7 mantissa bits from the table and 16 uniformly random
low mantissa bits), so the byte statistics (and hence compressibility) are
those of the real distributions, at a fraction of numpy's normal sampler's
cost.  Every tensor's values depend only on (seed, name, kind, version):
step 1 has version 1 everywhere; in later steps the frozen half of the model
(embed_tokens and the first L/2 layers) keeps version 1 (identical bytes,
weights and moments) and every other tensor is redrawn.

Layout (Layout): T-way tensor parallel x P pipeline stages x D data-parallel
replicas = 16 ranks by default, saved like Megatron-LM's distributed
optimizer: rank (t, p, d=0) writes the bf16 weights of its TP part and stage
to model_tp{t}_pp{p}.safetensors (group "model"); every rank (t, p, d)
writes the fp32 moments of its 1/D flat slice of that TP part to
optim_tp{t}_pp{p}_dp{d}.safetensors (group "optim").  No byte is written by
two ranks.  Every file carries ckptfs sharding metadata (global_shape,
offsets, tp_dim, pp, num_layers; box_shape and flat_range for the optimizer
slices), see core/views/shardmeta.h.
"""
import json
import multiprocessing
import os
import struct
import sys
import zlib

import numpy as np

GEN_VERSION = 1
VOCAB = 32000
NTAB = 65536
# GPT-style (hidden size, typical depth) pairs; the model takes the hidden size
# whose depth for the requested size is closest to the typical one.
FAMILY = ((256, 4), (512, 8), (768, 12), (1024, 24), (1536, 24), (2048, 24), (2560, 32),
          (4096, 32), (5120, 40), (8192, 80))

# dtype name -> bytes per element
ESIZE = {"BF16": 2, "F32": 4}


# ------------------------------------------------------------------ values


def _tables(seed=20240611):
    """uint16 quantile tables: 'w' bf16 bits of N(0, 0.02) (rounded), 'm1'/'m2' upper halves
    (truncated) of fp32 N(0, 1e-3) and N(0, 1e-3)^2."""
    rng = np.random.default_rng(seed)
    per = 64
    z = np.sort(rng.standard_normal(NTAB * per))
    q = z[per // 2::per][:NTAB]
    out = {}
    w = (q * 0.02).astype(np.float32).view(np.uint32).astype(np.uint64)
    out["w"] = ((w + 0x7FFF + ((w >> 16) & 1)) >> 16).astype(np.uint16)
    out["m1"] = ((q * 1e-3).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    sq = np.sort((z * 1e-3) ** 2)[per // 2::per][:NTAB]
    out["m2"] = (sq.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return out


_TAB = None


def tables():
    global _TAB
    if _TAB is None:
        _TAB = _tables()
    return _TAB


def values(seed, name, kind, version, n):
    """n values of tensor `name` (flattened): kind 'w' -> uint16 bf16 bits, 'm1'/'m2' ->
    float32 (as uint32 bits)."""
    ss = np.random.SeedSequence([seed, zlib.crc32(name.encode()), {"w": 1, "m1": 2, "m2": 3}[kind],
                                 version])
    rng = np.random.Generator(np.random.SFC64(ss))
    tab = tables()[kind]
    hi = tab[rng.integers(0, NTAB, size=n, dtype=np.uint16)]
    if kind == "w":
        return hi
    lo = rng.integers(0, NTAB, size=n, dtype=np.uint16)
    out = hi.astype(np.uint32)
    out <<= 16
    out |= lo
    return out


# ------------------------------------------------------------------ model and layout


class Tensor:
    __slots__ = ("name", "shape", "tp_dim", "pp", "frozen")

    def __init__(self, name, shape, tp_dim, pp, frozen):
        self.name, self.shape, self.tp_dim, self.pp, self.frozen = name, shape, tp_dim, pp, frozen

    @property
    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n


class Model:
    """arch 'gpt': dense GPT-style model with Adam moments, about nbytes in total.
    arch 'moe': ~n_tensors small bf16 tensors (64 x 64 experts), no moments."""

    def __init__(self, nbytes=None, arch="gpt", seed=1, n_tensors=20000, pp_multiple=2):
        self.arch, self.seed = arch, seed
        if arch == "gpt":
            self.moments = True
            nparams = nbytes / 10.0
            best = None
            for h, lref in FAMILY:
                per_layer = 12 * h * h + 2 * h
                lf = (nparams - 2 * VOCAB * h - h) / per_layer
                if lf < 1:
                    continue
                L = max(1, int(round(lf / pp_multiple))) * pp_multiple
                score = abs(np.log(L / lref))
                if best is None or score < best[0]:
                    best = (score, h, L)
            if best is None:
                best = (0, FAMILY[0][0], pp_multiple)
            _, H, L = best
            self.H, self.L = H, L
            t = [Tensor("model.embed_tokens.weight", (VOCAB, H), 0, "first", True)]
            for i in range(L):
                fr = i < L // 2
                p = f"model.layers.{i}."
                t += [Tensor(p + "input_layernorm.weight", (H,), -1, i, fr),
                      Tensor(p + "self_attn.qkv_proj.weight", (3 * H, H), 0, i, fr),
                      Tensor(p + "self_attn.o_proj.weight", (H, H), 1, i, fr),
                      Tensor(p + "post_attention_layernorm.weight", (H,), -1, i, fr),
                      Tensor(p + "mlp.up_proj.weight", (4 * H, H), 0, i, fr),
                      Tensor(p + "mlp.down_proj.weight", (H, 4 * H), 1, i, fr)]
            t += [Tensor("model.norm.weight", (H,), -1, "last", False),
                  Tensor("lm_head.weight", (VOCAB, H), 0, "last", False)]
        elif arch == "moe":
            self.moments = False
            H, L = 64, 64
            E = max(1, -(-(-(-(n_tensors - 3) // L) - 6) // 3))
            self.H, self.L = H, L
            t = [Tensor("model.embed_tokens.weight", (4096, H), 0, "first", True)]
            for i in range(L):
                p = f"model.layers.{i}."
                t += [Tensor(p + "input_layernorm.weight", (H,), -1, i, True),
                      Tensor(p + "self_attn.qkv_proj.weight", (3 * H, H), 0, i, True),
                      Tensor(p + "self_attn.o_proj.weight", (H, H), 1, i, True),
                      Tensor(p + "post_attention_layernorm.weight", (H,), -1, i, True),
                      Tensor(p + "mlp.router.weight", (E, H), -1, i, True)]
                for e in range(E):
                    q = f"{p}mlp.experts.{e}."
                    t += [Tensor(q + "gate_proj.weight", (H, H), 0, i, True),
                          Tensor(q + "up_proj.weight", (H, H), 0, i, True),
                          Tensor(q + "down_proj.weight", (H, H), 1, i, True)]
                t.append(Tensor(p + "mlp.shared_norm.weight", (H,), -1, i, True))
            t += [Tensor("model.norm.weight", (H,), -1, "last", True),
                  Tensor("lm_head.weight", (4096, H), 0, "last", True)]
        else:
            raise ValueError(arch)
        self.tensors = t
        self.nparams = sum(x.numel for x in t)

    @property
    def nbytes(self):
        return self.nparams * (10 if self.moments else 2)

    def describe(self):
        return {"arch": self.arch, "hidden": self.H, "layers": self.L, "vocab": VOCAB,
                "tensors": len(self.tensors), "params": self.nparams, "bytes": self.nbytes,
                "moments": self.moments, "seed": self.seed}

    def version(self, t, step):
        return 1 if (step == 1 or t.frozen) else step


def stage_of_layer(layer, n, P):
    for p in range(P):
        if p * n // P <= layer < (p + 1) * n // P:
            return p
    return P - 1


def on_stage(pp, n, P, p):
    if isinstance(pp, int):
        return stage_of_layer(pp, n, P) == p
    return {"first": p == 0, "last": p == P - 1}[pp]


def tp_bounds(size, parts, t):
    c = -(-size // parts)
    return min(t * c, size), min((t + 1) * c, size)


class Layout:
    def __init__(self, T, P, D):
        self.T, self.P, self.D = T, P, D

    @property
    def ranks(self):
        return self.T * self.P * self.D

    def name(self):
        return f"tp{self.T}_pp{self.P}_dp{self.D}"

    def rank(self, t, p, d):
        return (p * self.D + d) * self.T + t


def tp_part(t_spec, T, t):
    """(offsets, shape) of TP part t of tensor t_spec."""
    offs = [0] * len(t_spec.shape)
    shape = list(t_spec.shape)
    if t_spec.tp_dim >= 0:
        a, b = tp_bounds(t_spec.shape[t_spec.tp_dim], T, t)
        offs[t_spec.tp_dim] = a
        shape[t_spec.tp_dim] = b - a
    return offs, shape


def file_plan(model, lay):
    """List of files: dict(name, rank, group, entries=[(tensor index, kind, stored name, meta,
    slicer)]) where slicer describes the piece: ('tp', offs, shape) or
    ('flat', offs, shape, a, b)."""
    files = []
    L = model.L
    for p in range(lay.P):
        for t in range(lay.T):
            ents = []
            for i, ts in enumerate(model.tensors):
                if not on_stage(ts.pp, L, lay.P, p):
                    continue
                offs, shape = tp_part(ts, lay.T, t)
                meta = {"global_shape": list(ts.shape), "offsets": offs, "tp_dim": ts.tp_dim,
                        "pp": ts.pp}
                ents.append((i, "w", ts.name, "BF16", shape, meta, ("tp", offs, shape)))
            files.append({"name": f"model_tp{t}_pp{p}.safetensors", "rank": lay.rank(t, p, 0),
                          "group": "model", "entries": ents})
            if not model.moments:
                continue
            for d in range(lay.D):
                ents = []
                for i, ts in enumerate(model.tensors):
                    if not on_stage(ts.pp, L, lay.P, p):
                        continue
                    offs, shape = tp_part(ts, lay.T, t)
                    n = 1
                    for s in shape:
                        n *= s
                    a, b = tp_bounds(n, lay.D, d)
                    for kind, suffix in (("m1", ".exp_avg"), ("m2", ".exp_avg_sq")):
                        meta = {"global_shape": list(ts.shape), "offsets": offs,
                                "box_shape": shape, "flat_range": [a, b], "tp_dim": ts.tp_dim,
                                "pp": ts.pp}
                        ents.append((i, kind, ts.name + suffix, "F32", [b - a], meta,
                                     ("flat", offs, shape, a, b)))
                files.append({"name": f"optim_tp{t}_pp{p}_dp{d}.safetensors",
                              "rank": lay.rank(t, p, d), "group": "optim", "entries": ents})
    return files


def header_bytes(group, num_layers, entries, step):
    hdr = {}
    off = 0
    layout = []
    for (_, _, sname, dt, shape, _, _) in entries:
        n = ESIZE[dt]
        for s in shape:
            n *= s
        hdr[sname] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        layout.append(off)
        off += n
    ck = {"version": 1, "group": group, "num_layers": num_layers,
          "tensors": {sname: meta for (_, _, sname, _, _, meta, _) in entries}}
    hdr["__metadata__"] = {"format": "pt", "step": str(step), "ckptfs": json.dumps(ck)}
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h, layout, off


def piece_of(arr_flat, ts, slicer):
    """Bytes of a piece of global tensor ts (flattened values arr_flat)."""
    a = arr_flat.reshape(ts.shape)
    offs, shape = slicer[1], slicer[2]
    sl = tuple(slice(o, o + s) for o, s in zip(offs, shape))
    part = np.ascontiguousarray(a[sl])
    if slicer[0] == "flat":
        part = part.reshape(-1)[slicer[3]:slicer[4]]
    return part.tobytes()


def _worker_init():
    """Workers die on SIGTERM/SIGINT like plain processes, whatever handlers the parent
    installed (a Python handler in a worker can deadlock on an inherited lock)."""
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _write_tensors(args):
    """Worker: generate tensors idx (list) and pwrite their pieces into the files."""
    model_args, step, outdir, jobs = args
    model = Model(**model_args)
    fds = {}
    try:
        for i, places in jobs:
            ts = model.tensors[i]
            ver = model.version(ts, step)
            cache = {}
            for fname, kind, pos, slicer in places:
                if kind not in cache:
                    cache[kind] = values(model.seed, ts.name, kind, ver, ts.numel)
                if fname not in fds:
                    fds[fname] = os.open(os.path.join(outdir, fname), os.O_WRONLY)
                data = piece_of(cache[kind], ts, slicer)
                done = 0
                while done < len(data):
                    done += os.pwrite(fds[fname], memoryview(data)[done:], pos + done)
    finally:
        for fd in fds.values():
            os.close(fd)
    return len(jobs)


def write_step(outdir, model, model_args, lay, step, workers=2):
    """Write the files of one step into outdir (created).  Returns the manifest dict."""
    os.makedirs(outdir, exist_ok=True)
    plan = file_plan(model, lay)
    per_tensor = {}
    files = []
    for f in plan:
        hb, offs, dlen = header_bytes(f["group"], model.L, f["entries"], step)
        path = os.path.join(outdir, f["name"])
        with open(path, "wb") as fh:
            fh.write(hb)
            fh.truncate(len(hb) + dlen)
        for (i, kind, _, _, _, _, slicer), o in zip(f["entries"], offs):
            per_tensor.setdefault(i, []).append((f["name"], kind, len(hb) + o, slicer))
        files.append({"name": f["name"], "rank": f["rank"], "group": f["group"],
                      "size": len(hb) + dlen, "tensors": len(f["entries"])})
    # Balance the generation work: big tensors first, round robin.
    order = sorted(per_tensor, key=lambda i: -model.tensors[i].numel)
    jobs = [[] for _ in range(max(1, workers))]
    for k, i in enumerate(order):
        jobs[k % len(jobs)].append((i, per_tensor[i]))
    args = [(model_args, step, outdir, j) for j in jobs if j]
    if len(args) > 1:
        ctx = multiprocessing.get_context("fork")
        pool = ctx.Pool(len(args), initializer=_worker_init)
        try:
            pool.map(_write_tensors, args)
            pool.close()
        except BaseException:
            pool.terminate()
            raise
        finally:
            pool.join()
    else:
        for a in args:
            _write_tensors(a)
    return {"files": files, "layout": lay.name(), "step": step,
            "bytes": sum(f["size"] for f in files)}


def ensure_series(root, model_args, lay, steps, workers=2, log=print):
    """Generate (or reuse) at least steps 1..steps of model/layout under root/step_NNNN.
    Returns (manifest, seconds spent generating).  Steps already present with the same
    generator version, model and layout are kept."""
    import time
    model = Model(**model_args)
    key = {"gen_version": GEN_VERSION, "model": model_args, "layout": lay.name()}
    mpath = os.path.join(root, "manifest.json")
    out = None
    try:
        with open(mpath) as f:
            m = json.load(f)
        if m.get("key") == key and all(
                os.path.getsize(os.path.join(root, s["dir"], fi["name"])) == fi["size"]
                for s in m["steps"] for fi in s["files"]):
            out = m
    except (OSError, ValueError, KeyError):
        pass
    if out is not None and len(out["steps"]) >= steps:
        return out, 0.0
    if out is None:
        out = {"key": key, "model": model.describe(), "steps": []}
    t0 = time.time()
    if os.path.exists(mpath):
        os.unlink(mpath)
    for s in range(len(out["steps"]) + 1, steps + 1):
        d = f"step_{s:04d}"
        log(f"  generating {root}/{d} ({model.nbytes / 2**30:.2f} GiB, {lay.name()})")
        man = write_step(os.path.join(root, d), model, model_args, lay, s, workers)
        man["dir"] = d
        out["steps"].append(man)
    with open(mpath + ".tmp", "w") as f:
        json.dump(out, f, indent=1)
    os.rename(mpath + ".tmp", mpath)
    return out, time.time() - t0


def main(argv):
    import argparse
    ap = argparse.ArgumentParser(description="write a synthetic sharded checkpoint series")
    ap.add_argument("outdir")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--arch", default="gpt", choices=("gpt", "moe"))
    ap.add_argument("--layout", default="4,2,2", help="T,P,D")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    T, P, D = (int(x) for x in a.layout.split(","))
    margs = {"nbytes": int(a.gib * 2**30), "arch": a.arch, "seed": a.seed}
    m, dt = ensure_series(a.outdir, margs, Layout(T, P, D), a.steps)
    print(json.dumps(m["model"]), f"{dt:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
