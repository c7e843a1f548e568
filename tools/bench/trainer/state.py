"""The benchmark's training state: a GPT-style stack of bf16 linear layers under FSDP2
(fully_shard) or DDP on a gloo process group, with fp32 Adam moments (exp_avg, exp_avg_sq) in a
real torch.optim.AdamW, so that every peer sees the framework objects it was built for.

The values are random with the distributions of trained state (see _fill), drawn per rank
shard for FSDP2 and identically on every rank for DDP (replicas hold the same bytes)."""

import math
import os

import torch
import torch.distributed as dist
from torch import nn

BYTES_PER_PARAM = 2 + 4 + 4  # bf16 weight, fp32 exp_avg, fp32 exp_avg_sq


def shape_for(total_bytes, hidden=None):
    """(hidden, layers) of a model whose weights plus fp32 Adam come to about total_bytes.
    A layer holds 12 h^2 weights (qkv 3h x h, o h x h, up 4h x h, down h x 4h)."""
    params = total_bytes / BYTES_PER_PARAM
    if hidden is None:
        # 8 layers where the size allows, hidden a multiple of 64 (divisible by every world size)
        hidden = max(64, int(math.sqrt(params / (12 * 8)) // 64 * 64))
    layers = max(2, round(params / (12 * hidden * hidden)))
    layers += layers % 2  # an even count: half of them are frozen in the storage run
    return hidden, layers


class Block(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.qkv = nn.Linear(h, 3 * h, bias=False)
        self.o = nn.Linear(h, h, bias=False)
        self.up = nn.Linear(h, 4 * h, bias=False)
        self.down = nn.Linear(4 * h, h, bias=False)


class Model(nn.Module):
    def __init__(self, h, layers):
        super().__init__()
        self.layers = nn.ModuleList(Block(h) for _ in range(layers))


def _fill(t, gen, kind, zero=False):
    """Values with the byte statistics of trained state (hence its compressibility): weights
    ~ N(0, 0.02), exp_avg ~ N(0, 1e-3), exp_avg_sq ~ N(0, 1e-3)^2."""
    if zero:
        t.zero_()
    elif kind == "weight":
        t.normal_(0.0, 0.02, generator=gen)
    elif kind == "exp_avg":
        t.normal_(0.0, 1e-3, generator=gen)
    else:
        t.normal_(0.0, 1e-3, generator=gen)
        t.mul_(t)


def build(kind, hidden, layers, frozen_half=False, seed=0, zero=False):
    """Returns (model, optimizer).  kind: 'fsdp2' or 'ddp'.  With frozen_half the first half of
    the layers are frozen (requires_grad=False) as in a job that freezes layers after training
    them: they keep their Adam state, which an optimizer step leaves as it is (no gradient), so
    half of the bytes stay bit-identical from step to step.  zero: every value 0 (a load
    target)."""
    rank = dist.get_rank()
    with torch.device("meta"):
        model = Model(hidden, layers).to(torch.bfloat16)
    if frozen_half:
        for blk in model.layers[: layers // 2]:
            for p in blk.parameters():
                p.requires_grad_(False)
    if kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for blk in model.layers:
            fully_shard(blk, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.to_empty(device="cpu")
        gen_seed = seed * 1000 + rank  # each rank fills its own shard
    elif kind == "ddp":
        model.to_empty(device="cpu")
        gen_seed = seed * 1000  # replicas: the same bytes on every rank
    else:
        raise ValueError(f"unknown parallelism {kind!r} (fsdp2 or ddp)")
    gen = torch.Generator().manual_seed(gen_seed)
    params = list(model.parameters())
    with torch.no_grad():
        for p in params:
            _fill(p.to_local() if hasattr(p, "to_local") else p, gen, "weight", zero)
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, init_sync=False)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)
    # fp32 moments next to bf16 weights (mixed-precision training keeps them in fp32), installed
    # as the optimizer's own state so state_dict()/get_optimizer_state_dict see them
    with torch.no_grad():
        for p in params:
            st = opt.state[p]
            st["step"] = torch.tensor(1.0)
            for k in ("exp_avg", "exp_avg_sq"):
                m = torch.empty_like(p, dtype=torch.float32)
                _fill(m.to_local() if hasattr(m, "to_local") else m, gen, k, zero)
                st[k] = m
    return model, opt


def train_step(model, opt, step):
    """Stands in for an optimizer step: changes every value of every trainable weight and its
    moments in place, keeping their distributions (a 1% scaling changes the mantissa of nearly
    every bf16 and fp32 value); frozen weights stay as they are."""
    with torch.no_grad():
        for p in model.parameters():
            if not p.requires_grad:
                continue
            for t, f in ((p, 1.01), (opt.state[p]["exp_avg"], 0.99),
                         (opt.state[p]["exp_avg_sq"], 0.99)):
                loc = t.to_local() if hasattr(t, "to_local") else t
                loc.mul_(f)
            opt.state[p]["step"] += 1


def local_tensors(model, opt):
    """Every local tensor this rank holds (weights and moments), for byte counts and memcpy."""
    out = []
    for p in model.parameters():
        out.append(p.to_local() if hasattr(p, "to_local") else p)
        if p in opt.state:
            for k in ("exp_avg", "exp_avg_sq"):
                t = opt.state[p][k]
                out.append(t.to_local() if hasattr(t, "to_local") else t)
    return out


def rank_bytes(model, opt):
    return sum(t.numel() * t.element_size() for t in local_tensors(model, opt))


def peak_rss():
    """VmHWM of this process, bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak_rss():
    """Resets VmHWM to the current RSS (Linux >= 4.0: write 5 to clear_refs), so a phase's peak
    excludes what came before it.  Returns False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def env_int(name, default):
    return int(os.environ.get(name, default))
