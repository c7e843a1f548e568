"""The FSDP1 job of the tests: a small model with nested FSDP units, trained a few steps.

Sizes are chosen so that chunks are uneven: with 3 or 4 ranks some parameters lie in no part
of some rank's chunk, others are split across ranks, and the flat parameters are padded.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.lin1 = nn.Linear(d, h)
        self.lin2 = nn.Linear(h, d, bias=False)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x + self.lin2(torch.tanh(self.lin1(x))))


class Net(nn.Module):
    VOCAB = 11

    def __init__(self, d: int = 6, h: int = 5):
        super().__init__()
        self.emb = nn.Embedding(self.VOCAB, d)
        self.blocks = nn.ModuleList([Block(d, h) for _ in range(2)])
        self.head = nn.Linear(d, self.VOCAB)
        self.register_buffer("scale", torch.tensor([1.0, 0.5, 0.25]))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)

    def forward(self, tok):
        x = self.emb(tok)
        for b in self.blocks:
            x = b(x)
        return self.head(x) * self.scale[0]


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    tok = torch.randint(0, Net.VOCAB, (4, 5), generator=g)
    return tok, torch.roll(tok, 1, dims=1)


def build_fsdp1(seed: int, strategy: str = "FULL_SHARD", ignore_head: bool = False,
                mixed_ckpt: bool = False):
    """mixed_ckpt: bf16 compute (MixedPrecision) and activation checkpointing of every
    Block (its wrapper puts _checkpoint_wrapped_module. into the parameter names)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    torch.manual_seed(seed)
    net = Net()
    kw = {}
    if ignore_head:
        kw["ignored_modules"] = [net.head]     # stays whole (and replicated) on every rank
    if mixed_ckpt:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            apply_activation_checkpointing)
        from torch.distributed.fsdp import MixedPrecision
        kw["mixed_precision"] = MixedPrecision(param_dtype=torch.bfloat16,
                                               reduce_dtype=torch.bfloat16)
        apply_activation_checkpointing(net, check_fn=lambda m: isinstance(m, Block))
    if strategy == "HYBRID_SHARD":
        from torch.distributed.device_mesh import init_device_mesh
        world = dist.get_world_size()
        kw["device_mesh"] = init_device_mesh("cpu", (world // 2, 2),
                                             mesh_dim_names=("replicate", "shard"))
    return FSDP(net, auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=True,
                device_id=torch.device("cpu"), sync_module_states=False,
                sharding_strategy=getattr(ShardingStrategy, strategy), **kw)


def train(model, steps: int, rank: int):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for s in range(steps):
        tok, tgt = batch(s, rank)
        logits = model(tok)
        loss = nn.functional.cross_entropy(logits.reshape(-1, Net.VOCAB), tgt.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return opt


def full_state(model, opt):
    """FSDP1's own consolidated model and optimizer state, on every rank (the reference)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import (FullOptimStateDictConfig, FullStateDictConfig,
                                        StateDictType)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=False, rank0_only=False),
                              FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=False)):
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        osd = FSDP.optim_state_dict(model, opt) if opt is not None else None
    optim = {}
    if osd is not None:
        for fqn, st in osd["state"].items():
            for k, v in st.items():
                if isinstance(v, torch.Tensor):
                    optim[f"state.{fqn}.{k}"] = v.detach().clone()
    dist.barrier()
    return sd, optim


def build_fsdp2(seed: int, world: int):
    """The same Net under FSDP2 (fully_shard per Block, then the root); world 1: plain."""
    torch.manual_seed(seed)
    net = Net()
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for b in net.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(net, mesh=mesh)
    return net


def gathered(model, opt):
    """Whole tensors of an FSDP2 (or plain) model and its Adam state, named like
    full_state's (every rank must call it: full_tensor is a collective)."""
    def whole(t):
        return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()
    sd = {k: whole(v) for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    optim = {}
    for g in opt.param_groups:
        for p in g["params"]:
            for k, v in opt.state.get(p, {}).items():
                if isinstance(v, torch.Tensor):
                    optim[f"state.{names[id(p)]}.{k}"] = whole(v)
    return sd, optim
