"""Models, layouts and reference states shared by the multi-process tests (imported by the
ranks that run_ranks starts).

Sizes are chosen so that 2-, 3- and 4-way shards are uneven and some are empty (head's 5 rows
on 4 ranks: 2, 2, 1, 0).
"""
import torch
import torch.distributed as dist
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 22)
        self.down = nn.Linear(22, 13)
        self.norm = nn.LayerNorm(13)
        self.head = nn.Linear(13, 5)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.calls += 1
        return self.head(self.norm(self.down(torch.relu(self.up(x)))))


def make_net(seed: int) -> Net:
    torch.manual_seed(seed)
    return Net()


def make_optim(model, lr=1e-2):
    return torch.optim.Adam([{"params": [p for n, p in model.named_parameters()
                                         if "norm" not in n], "lr": lr},
                             {"params": [p for n, p in model.named_parameters()
                                         if "norm" in n], "lr": lr / 4,
                              "weight_decay": 0.01}], betas=(0.85, 0.97))


def train(model, optim, steps: int, rank: int, tp_same_input: bool = False):
    """A few Adam steps on per-rank data (the same data on TP peers when tp_same_input)."""
    for s in range(steps):
        g = torch.Generator().manual_seed(1000 * s + (0 if tp_same_input else rank))
        x = torch.randn(4, 16, generator=g)
        out = model(x)
        if hasattr(out, "full_tensor"):
            out = out.full_tensor()
        out.pow(2).mean().backward()
        optim.step()
        optim.zero_grad()


def full(t):
    """The whole value of a tensor or DTensor (a collective for DTensors)."""
    if hasattr(t, "full_tensor"):
        return t.full_tensor().detach().clone()
    return t.detach().clone()


def full_state(model, optim):
    """{"model": {fqn: tensor}, "optim": {fqn: {key: tensor}}, "groups": [...]} with whole
    tensors (every rank must call it: full_tensor is a collective)."""
    from ckptfs._state import module_tensors, param_fqns
    msd = {k: full(v) for k, v in module_tensors(model).items()}
    osd = {}
    fqns = param_fqns(model)
    groups = []
    if optim is not None:
        for g in optim.param_groups:
            groups.append({k: v for k, v in g.items() if k != "params"})
            groups[-1]["params"] = [fqns[id(p)] for p in g["params"]]
            for p in g["params"]:
                osd[fqns[id(p)]] = {k: full(v) for k, v in optim.state.get(p, {}).items()}
    return {"model": msd, "optim": osd, "groups": groups}


def assert_same_state(ref, got, what=""):
    def same(a, b):
        return a.dtype == b.dtype and a.shape == b.shape and \
            torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    assert ref["model"].keys() == got["model"].keys(), what
    for k in ref["model"]:
        assert same(ref["model"][k], got["model"][k]), f"{what}: model tensor {k} differs"
    assert ref["optim"].keys() == got["optim"].keys(), what
    for k in ref["optim"]:
        assert ref["optim"][k].keys() == got["optim"][k].keys(), f"{what}: {k}"
        for key in ref["optim"][k]:
            assert same(ref["optim"][k][key], got["optim"][k][key]), \
                f"{what}: optimizer state {k}.{key} differs"
    assert len(ref["groups"]) == len(got["groups"])
    for a, b in zip(ref["groups"], got["groups"]):
        for k in ("lr", "betas", "weight_decay", "eps", "params"):
            assert a[k] == b[k], f"{what}: param_group {k}: {a[k]} != {b[k]}"


# ------------------------------------------------------------------------------- layouts

def fsdp2(model, mesh=None):
    from torch.distributed.fsdp import fully_shard
    for m in (model.up, model.down, model.head):
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def tp_plan():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    return {"up": ColwiseParallel(), "down": RowwiseParallel()}


def tp(model, mesh):
    from torch.distributed.tensor.parallel import parallelize_module
    parallelize_module(model, mesh, tp_plan())
    return model


def mesh_2d(dp: int, tp_: int, transposed: bool = False):
    """A (dp, tp) CPU mesh; transposed: rank r sits at (r % dp, r // dp) instead of
    (r // tp, r % tp), so each rank holds another rank's pieces than in the plain mesh."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    if not transposed:
        return init_device_mesh("cpu", (dp, tp_), mesh_dim_names=("dp", "tp"))
    ranks = torch.arange(dp * tp_).reshape(tp_, dp).t().contiguous()
    return DeviceMesh("cpu", ranks, mesh_dim_names=("dp", "tp"))


def barrier():
    if dist.is_initialized():
        dist.barrier()
