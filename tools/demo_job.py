#!/usr/bin/python3
"""The ckptfs main job: a training run saving sharded checkpoints with plain
file writes, then an evaluator reading them back.

Model: a small GPT-style stack (bf16 weights, fp32 Adam moments) sharded
over TP ranks, saved by every data-parallel replica (replicas write the same
bytes, as DDP ranks often do), for several steps in which the first half of
the layers is frozen.  Every step is written to a temporary directory and
renamed into place, like torch.distributed.checkpoint and Megatron do.
Files are safetensors with plain headers; nothing here knows about ckptfs.
"""
import argparse, hashlib, json, os, shutil, struct, sys, time
import numpy as np

def bf16(a):
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)

def load_safetensors(path):
    """A strict reader: header rules of the safetensors reference."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    assert data[8:9] == b"{" and (8 + n) % 8 == 0, path
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    dt = {"BF16": np.uint16, "F32": np.float32}
    out, end = {}, 0
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        a, b = info["data_offsets"]
        assert a == end, (path, name)
        end = b
        out[name] = np.frombuffer(data[8 + n + a:8 + n + b], dtype=dt[info["dtype"]]).reshape(info["shape"])
    assert 8 + n + end == len(data), path
    return out, meta

def tp_part(a, dim, parts, t):
    """torch.chunk semantics."""
    if dim < 0:
        return a
    c = -(-a.shape[dim] // parts)
    return np.take(a, range(min(t * c, a.shape[dim]), min((t + 1) * c, a.shape[dim])), axis=dim)

def save_safetensors(path, tensors, meta):
    header, off, blobs = {}, 0, []
    for name, (dtype, arr) in sorted(tensors.items()):
        b = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for piece in [struct.pack("<Q", len(h)), h] + blobs:
            f.write(piece)
            digest.update(piece)
    return digest.hexdigest()

def tp_dim_of(name, w):
    """How this toy model is split across TP ranks (Megatron-style)."""
    if w.ndim == 1:
        return -1  # norms: replicated
    if "o_proj" in name or "down_proj" in name:
        return 1   # row-parallel
    return 0       # column-parallel (qkv, up) and the embedding

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(1234)
    H, L, T = args.hidden, args.layers, args.tp
    shapes = {"embed_tokens.weight": (4 * H, H)}
    for i in range(L):
        shapes[f"layers.{i}.self_attn.qkv_proj.weight"] = (3 * H, H)
        shapes[f"layers.{i}.self_attn.o_proj.weight"] = (H, H)
        shapes[f"layers.{i}.mlp.up_proj.weight"] = (4 * H, H)
        shapes[f"layers.{i}.mlp.down_proj.weight"] = (H, 4 * H)
        shapes[f"layers.{i}.input_layernorm.weight"] = (H,)
    weights = {n: rng.standard_normal(s).astype(np.float32) * 0.02 for n, s in shapes.items()}
    m1 = {n: np.zeros(s, np.float32) for n, s in shapes.items()}
    m2 = {n: np.zeros(s, np.float32) for n, s in shapes.items()}
    frozen = {n for n in shapes if n.startswith("embed") or
              (n.startswith("layers.") and int(n.split(".")[1]) < L // 2)}
    expected = {}
    written = 0
    t0 = time.time()
    for step in range(1, args.steps + 1):
        for n in shapes:
            if n in frozen:
                continue
            g = rng.standard_normal(shapes[n]).astype(np.float32) * 1e-3
            m1[n] = 0.9 * m1[n] + 0.1 * g
            m2[n] = 0.999 * m2[n] + 0.001 * g * g
            weights[n] = weights[n] - 1e-2 * m1[n] / (np.sqrt(m2[n]) + 1e-8) * 1e-2
        final = os.path.join(args.root, f"step_{step:04d}")
        tmp = final + ".tmp"
        os.makedirs(tmp, exist_ok=True)
        for dp in range(args.dp):
            for tp in range(T):
                shard, pieces = {}, {}
                for n, w in weights.items():
                    dim = tp_dim_of(n, w)
                    off = [0] * w.ndim
                    if dim >= 0:
                        off[dim] = -(-w.shape[dim] // T) * tp
                    for suffix, arr, dtype in (("", bf16(w), "BF16"), (".exp_avg", m1[n], "F32"),
                                               (".exp_avg_sq", m2[n], "F32")):
                        shard[n + suffix] = (dtype, tp_part(arr, dim, T, tp))
                        pieces[n + suffix] = {"global_shape": list(w.shape), "offsets": off, "tp_dim": dim}
                name = f"model_tp{tp}_dp{dp}.safetensors"
                # ckptfs sharding metadata (docs/views.md): where each piece lies
                meta = {"step": str(step), "tp_rank": str(tp), "dp_rank": str(dp),
                        "saved_at": str(time.time()),
                        "ckptfs": json.dumps({"version": 1, "num_layers": L, "tensors": pieces})}
                expected[f"step_{step:04d}/{name}"] = save_safetensors(os.path.join(tmp, name), shard, meta)
                written += os.path.getsize(os.path.join(tmp, name))
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump({"hidden": H, "layers": L, "tp": T, "dp": args.dp, "step": step}, f)
        expected[f"step_{step:04d}/config.json"] = hashlib.sha256(open(os.path.join(tmp, "config.json"), "rb").read()).hexdigest()
        os.rename(tmp, final)
        print(f"  saved step {step}: {args.dp * T} shards")
    dt = time.time() - t0
    print(f"  wrote {written / 1e6:.1f} MB in {dt:.2f} s ({written / 1e6 / dt:.0f} MB/s)")
    # The evaluator: read every file back and compare.
    t0 = time.time()
    bad = 0
    for rel, want in sorted(expected.items()):
        got = hashlib.sha256(open(os.path.join(args.root, rel), "rb").read()).hexdigest()
        if got != want:
            print(f"  MISMATCH {rel}")
            bad += 1
    print(f"  read back {len(expected)} files in {time.time() - t0:.2f} s: "
          f"{'all identical' if not bad else f'{bad} differ'}")
    # The same checkpoint through resharded views: an evaluator wants one
    # consolidated file, a restarted job wants 4-way TP x 2 pipeline stages.
    last = f"step_{args.steps:04d}"
    ref = {}
    for n, w in weights.items():
        ref[n], ref[n + ".exp_avg"], ref[n + ".exp_avg_sq"] = bf16(w), m1[n], m2[n]
    for layout, files in (("tp1_pp1", {(0, 0): "model.safetensors"}),
                          ("tp4_pp2", {(t, p): f"model_tp{t}_pp{p}.safetensors"
                                       for t in range(4) for p in range(2)})):
        t0 = time.time()
        seen, nbytes = set(), 0
        for (t, p), fname in files.items():
            path = os.path.join(args.root, layout, last, fname)
            got, meta = load_safetensors(path)
            nbytes += os.path.getsize(path)
            assert json.loads(meta["ckptfs"])["version"] == 1
            for name, arr in got.items():
                base = name.split(".exp_avg")[0]
                layer = int(base.split(".")[1]) if base.startswith("layers.") else None
                stages = 2 if layout == "tp4_pp2" else 1
                if layer is not None:
                    want_p = next(q for q in range(stages) if q * L // stages <= layer < (q + 1) * L // stages)
                else:
                    want_p = 0  # embed -> first stage
                if p != want_p:
                    bad += 1
                    print(f"  {layout}/{fname}: {name} on the wrong stage")
                want = tp_part(ref[name], tp_dim_of(base, weights[base]), 4 if layout == "tp4_pp2" else 1, t)
                if not np.array_equal(arr, want):
                    bad += 1
                    print(f"  {layout}/{fname}: {name} differs")
                seen.add(name)
        missing = set(ref) - seen
        bad += len(missing)
        print(f"  view {layout}: {len(files)} file(s), {nbytes / 1e6:.1f} MB, {len(seen)} tensors "
              f"checked element-exact in {time.time() - t0:.2f} s"
              f"{'' if not missing else f', {len(missing)} MISSING'}")
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())
