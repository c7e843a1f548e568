"""Which directory ckptfs.load should read on a mount: a timing script (not a test).

    .venv/bin/python tools/bench/probes/load_views.py [--mib 128] [--rounds 3]

A model of --mib MiB (fp32) is saved with FSDP2 on 4 ranks into a fresh ckptfs mount.  Then,
alternating the choices round by round, it is loaded
  * on 1 process into a plain model (target TP1), and
  * on 2 processes into a TP2 model (1-D "tp" mesh),
  * on 2 processes into an FSDP2 model,
from the saved shards themselves (view="source"), the consolidated view (MOUNT/tp1_pp1/PATH)
and, for TP2, the tp2 view (MOUNT/tp2_pp1/PATH).  Each load runs cold (the daemon remounted,
so its chunk cache is empty, and the kernel's page cache of the mount dropped by the remount)
and then warm (the same load again in the same processes).  Prints medians and the ratios to
"source".
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[3] / "tests" / "python"  # conftest: Mount, run_ranks
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from conftest import Mount, run_ranks  # noqa: E402


class Big(torch.nn.Module):
    def __init__(self, mib):
        super().__init__()
        n = max(1, mib // 16)
        rows = 16 * 1024 * 1024 // 4 // 1024        # 16 MiB per layer of 1024 columns
        self.layers = torch.nn.ModuleList(torch.nn.Linear(1024, rows, bias=False)
                                          for _ in range(n))


def save_fsdp2(rank, world, path, mib):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    m = Big(mib)
    for layer in m.layers:
        fully_shard(layer)
    fully_shard(m)
    import ckptfs
    ckptfs.save(path, {"model": m}, async_=False)
    return True


def load_timed(rank, world, path, mib, views, kind="tp"):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
    import ckptfs
    m = Big(mib)
    if world > 1 and kind == "fsdp2":
        for layer in m.layers:
            fully_shard(layer)
        fully_shard(m)
    elif world > 1:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        parallelize_module(m, mesh, {f"layers.{i}": ColwiseParallel()
                                     for i in range(len(m.layers))})
    out = {}
    for view in views:
        times = []
        for _ in range(2):          # cold (first read of this view in this mount), warm
            if world > 1:
                dist.barrier()
            t = time.perf_counter()
            ckptfs.load(path, {"model": m}, view=view)
            if world > 1:
                dist.barrier()
            times.append(time.perf_counter() - t)
        out[view] = times
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ckptfs-bench-views-"))
    mount = Mount(base)
    mount.start()
    results = {}
    try:
        path = str(mount.mnt / "ck")
        run_ranks(4, save_fsdp2, path, a.mib, timeout=600)
        for rnd in range(a.rounds):
            for target, world, views in (("TP1", 1, ["source", "consolidated"]),
                                         ("TP2", 2, ["source", "consolidated", "tp"]),
                                         ("FSDP2x2", 2, ["source", "consolidated"])):
                order = views if rnd % 2 == 0 else list(reversed(views))
                kind = "fsdp2" if target.startswith("FSDP2") else "tp"
                for view in order:
                    # a fresh mount per measured view: cold chunk cache and page cache
                    mount.restart()
                    r = run_ranks(world, load_timed, path, a.mib, [view], kind, timeout=600)
                    cold, warm = r[0][view]
                    results.setdefault((target, view), []).append((cold, warm))
    finally:
        mount.stop()
    print(f"load of {a.mib} MiB saved by FSDP2 on 4 ranks, medians of {a.rounds} rounds "
          f"(rank 0's time, between barriers)")
    for target in ("TP1", "TP2", "FSDP2x2"):
        src = results[(target, "source")]
        sc = statistics.median(c for c, _ in src)
        sw = statistics.median(w for _, w in src)
        for (t, view), rs in sorted(results.items()):
            if t != target:
                continue
            c = statistics.median(x for x, _ in rs)
            wm = statistics.median(y for _, y in rs)
            print(f"  target {target:8s} {view:13s} cold {c:7.3f} s ({c / sc:5.2f}x source)"
                  f"  warm {wm:7.3f} s ({wm / sw:5.2f}x source)")


if __name__ == "__main__":
    # the ranks import the functions from this file by its module name
    import load_views as bench_load_views
    bench_load_views.main()
