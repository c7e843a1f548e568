"""Measures transformers' from_pretrained on a ckptfs checkpoint's tp1_pp1 view (one
model.safetensors, what the view serves) against Hugging Face-style shards with
model.safetensors.index.json, for a ~230 MB float32 Llama.  Not a test (pytest does not
collect it); run by hand:

    .venv/bin/python tools/bench/probes/hf_load.py [--runs 2] [--shard 50MB]

Layouts, all on the same ckptfs mount:
  view      MOUNT/tp1_pp1/bench/step0: the view of a checkpoint saved with ckptfs.save by 2
            FSDP2 ranks (one model.safetensors assembled from the 2 rank files)
  shards    MOUNT/hf_shards: save_pretrained(max_shard_size=--shard), i.e. the layout a
            synthesized index would serve (N files + model.safetensors.index.json)
  single    MOUNT/hf_single: save_pretrained as one model.safetensors (a plain file)
  local     the same single file on the local disk (no FUSE), the floor
Each run is a fresh process timing only from_pretrained (imports excluded).  "cold": the
daemon is restarted before the run (no daemon cache, kernel page cache of the mount dropped
by the unmount); "warm": the same layout read again right after.  Rounds alternate the
layouts; the report gives every run and the medians.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[3] / "tests" / "python"  # conftest: Mount, run_ranks
sys.path[:0] = [str(HERE), str(HERE.parent.parent / "core" / "trainer" / "python")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from conftest import Mount, run_ranks  # noqa: E402
import _h2_llama as L  # noqa: E402

BIG = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
           num_attention_heads=8, num_key_value_heads=4, vocab_size=32000,
           max_position_embeddings=256)


def _save(rank, world, path):
    import ckptfs
    cfg = L.config(**BIG)
    m = L.fsdp2(L.model(cfg, seed=1), world)
    ckptfs.save(path, {"model": m}, async_=False)
    return sum(p.numel() * p.element_size() for p in m.parameters()) if rank == 0 else None


_TIMER = r"""
import os, resource, sys, time
os.environ["HF_HUB_OFFLINE"] = "1"
from transformers import AutoModelForCausalLM
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
t, c = time.perf_counter(), cpu()
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], local_files_only=True)
print(time.perf_counter() - t, cpu() - c)
"""


def _time_load(path: Path):
    """(wall seconds, CPU seconds of the loading process) of one from_pretrained."""
    out = subprocess.run([sys.executable, "-c", _TIMER, str(path)], check=True,
                         capture_output=True, text=True)
    wall, cpu = out.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--shard", default="50MB")
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="h2-hfload-"))
    mount = Mount(base / "ckptfs")
    mount.start()
    try:
        (mount.mnt / "bench").mkdir()
        import hf_load as me     # run_ranks needs an importable function
        nbytes = run_ranks(2, me._save, str(mount.mnt / "bench" / "step0"), timeout=600)[0]
        cfg = L.config(**BIG)
        m = L.model(cfg, seed=1)
        m.save_pretrained(mount.mnt / "hf_shards", max_shard_size=a.shard)
        m.save_pretrained(mount.mnt / "hf_single", max_shard_size="10GB")
        m.save_pretrained(base / "local", max_shard_size="10GB")
        del m
        layouts = {"view": mount.mnt / "tp1_pp1" / "bench" / "step0",
                   "shards": mount.mnt / "hf_shards", "single": mount.mnt / "hf_single",
                   "local": base / "local"}
        nfiles = {k: len([f for f in os.listdir(p) if f.endswith(".safetensors")])
                  for k, p in layouts.items()}
        times = {(k, w): [] for k in layouts for w in ("cold", "warm")}
        for r in range(a.runs):
            for k, p in layouts.items():
                mount.restart()
                times[(k, "cold")].append(_time_load(p))
                times[(k, "warm")].append(_time_load(p))
        print(f"model: {nbytes / 1e6:.0f} MB float32 parameters; shard size {a.shard}; "
              f"load average {os.getloadavg()[0]:.1f}")
        print(f"{'layout':8} {'files':>5} {'state':5} {'wall runs (s)':>24} {'median':>7} "
              f"{'cpu median (s)':>14}")
        for (k, w), ts in times.items():
            walls = [t[0] for t in ts]
            print(f"{k:8} {nfiles[k]:5d} {w:5} {' '.join(f'{t:6.3f}' for t in walls):>24} "
                  f"{statistics.median(walls):7.3f} "
                  f"{statistics.median(t[1] for t in ts):14.3f}")
    finally:
        mount.stop()
        import shutil
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
