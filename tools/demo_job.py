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
                shard = {}
                for n, w in weights.items():
                    part = np.array_split(w, T, axis=0)[tp] if w.ndim == 2 else w
                    shard[n] = ("BF16", bf16(part))
                    shard[n + ".exp_avg"] = ("F32", (np.array_split(m1[n], T, axis=0)[tp] if w.ndim == 2 else m1[n]))
                    shard[n + ".exp_avg_sq"] = ("F32", (np.array_split(m2[n], T, axis=0)[tp] if w.ndim == 2 else m2[n]))
                name = f"model_tp{tp}_dp{dp}.safetensors"
                meta = {"step": str(step), "tp_rank": str(tp), "dp_rank": str(dp),
                        "saved_at": str(time.time())}
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
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())
