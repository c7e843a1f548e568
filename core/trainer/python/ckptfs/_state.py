"""Turning a training state into Pieces: models, tensors, DTensors, optimizers; the writer rule.

The same functions describe a state for a save (the pieces' tensors are snapshotted) and for a
load (the pieces' tensors are filled in place), so a piece's tensor always shares storage with
the object it came from (a parameter's data, a DTensor's local shard, an optimizer state
tensor).

Names are the unwrapped model's state_dict names: DDP's `module.` (by unwrapping the DDP
object), `_fsdp_wrapped_module.`, `_checkpoint_wrapped_module.` and `_orig_mod.` are removed,
so a checkpoint saved under any wrapper loads under any other.

Sharding comes from the objects:
  * plain tensors (a plain module, DDP, a tensor dict) are whole and replicated over the
    process group: replica_count = world, replica_index = rank (every rank of the group is
    assumed to hold them: with pipeline stages that hold different plain tensors, save with
    replicas="all");
  * a plain optimizer tensor of a DTensor parameter (Adam's scalar step), and a plain tensor
    of a module or dict that also holds DTensors (a sharded model's buffers), is whole and
    replicated over that DTensor's mesh (pipeline stages hold different plain tensors);
  * a DTensor is the box of its local shard in the global tensor (torch's own offset
    arithmetic, torch.chunk semantics, uneven and empty shards, _StridedShard checked to be a
    box), replicated over its Replicate mesh dimensions; Partial placements are refused;
  * FSDP1 modules and Megatron sharded state dicts are described by ckptfs.fsdp1 and
    ckptfs.megatron.
"""
from __future__ import annotations

import heapq
import math
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from .pieces import Piece

_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - torch without DTensor
    DTensor = None


def is_dtensor(t) -> bool:
    return DTensor is not None and isinstance(t, DTensor)


def clean_fqn(name: str) -> str:
    """The state_dict name without wrapper segments (FSDP1, activation checkpointing,
    torch.compile)."""
    parts = [p for p in name.split(".") if p not in _WRAPPER_SEGMENTS]
    return ".".join(parts)


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The module inside DDP and torch.compile wrappers (FSDP1/FSDP2 stay: they shard)."""
    from torch.nn.parallel import DistributedDataParallel
    while True:
        if isinstance(module, DistributedDataParallel):
            module = module.module
        elif hasattr(module, "_orig_mod") and isinstance(module._orig_mod, torch.nn.Module):
            module = module._orig_mod
        else:
            return module


def is_fsdp1(module: torch.nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover
        return False
    return any(isinstance(m, FullyShardedDataParallel) for m in module.modules())


def _fsdp1():
    try:
        from . import fsdp1
    except ImportError as e:
        raise NotImplementedError(
            f"FSDP1 (FullyShardedDataParallel) models need ckptfs.fsdp1, which is not "
            f"available: {e}") from e
    return fsdp1


def _megatron():
    try:
        from . import megatron
    except ImportError as e:
        raise NotImplementedError(
            f"Megatron sharded state dicts (megatron.core ShardedTensor) need ckptfs.megatron, "
            f"which is not available: {e}") from e
    return megatron


def is_megatron_sharded(sd) -> bool:
    if not isinstance(sd, dict):
        return False
    for v in _iter_leaves(sd):
        cls = type(v)
        if cls.__name__ in ("ShardedTensor", "ShardedTensorFactory", "ShardedObject") and \
                cls.__module__.startswith("megatron"):
            return True
    return False


def _iter_leaves(d):
    for v in d.values():
        if isinstance(v, dict):
            yield from _iter_leaves(v)
        else:
            yield v


def group_info(pg) -> Tuple[int, int]:
    """(rank, world) in the process group; (0, 1) without torch.distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(pg), dist.get_world_size(pg)
    return 0, 1


# ---------------------------------------------------------------------------------- DTensor

def _strided_box(global_shape, mesh, placements, coord):
    """(local_shape, offsets) of this rank's shard, checking that every sharded dim's global
    indices are contiguous (a box).  Uses the index arithmetic of torch's
    compute_local_shape_and_global_offset, which also handles _StridedShard."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor._utils import _get_shard_size_and_offsets
    local_shape = list(global_shape)
    idx = {}
    for mesh_dim, p in enumerate(placements):
        if not isinstance(p, Shard):       # _StridedShard derives from Shard in some releases
            if type(p).__name__ != "_StridedShard":
                continue
        d = p.dim
        size, ind = _get_shard_size_and_offsets(local_shape[d], mesh.size(mesh_dim),
                                                coord[mesh_dim], p, idx.get(d),
                                                global_shape[d], False)
        local_shape[d] = size
        idx[d] = ind
    offsets = [0] * len(global_shape)
    for d, ind in idx.items():
        if local_shape[d] == 0:
            offsets[d] = global_shape[d]
            continue
        ind = ind.tolist() if isinstance(ind, torch.Tensor) else list(ind)
        if ind != list(range(ind[0], ind[0] + len(ind))):
            return tuple(local_shape), None
        offsets[d] = ind[0]
    return tuple(local_shape), tuple(offsets)


# Per-mesh facts and per-(mesh, placements, shape) boxes, memoized: a training job saves the
# same DTensors again and again, and torch computes a mesh's rank tensor and coordinates on
# every access (about 0.1 ms each, most of a save's Python time for a few hundred tensors).
# Entries keep their mesh alive, so an id() is never reused while its entry exists.
_MESH_MEMO: Dict[int, tuple] = {}
_BOX_MEMO: Dict[tuple, tuple] = {}


def _mesh_ranks(mesh) -> Tuple[int, ...]:
    e = _MESH_MEMO.get(id(mesh))
    if e is None or e[0] is not mesh:
        e = (mesh, tuple(mesh.mesh.flatten().tolist()))
        _MESH_MEMO[id(mesh)] = e
    return e[1]


def local_box(name, t) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """(local shape, global offsets) of a DTensor's local shard."""
    mesh, placements = t.device_mesh, t.placements
    gshape = tuple(t.shape)
    key = (id(mesh), tuple(placements), gshape)
    memo = _BOX_MEMO.get(key)
    if memo is not None and memo[0] is mesh:
        shape, offsets = memo[1], memo[2]
        if tuple(t._local_tensor.shape) == shape:
            return shape, offsets
    shape, offsets = _local_box(name, t, mesh, placements, gshape)
    _BOX_MEMO[key] = (mesh, shape, offsets)
    return shape, offsets


def _local_box(name, t, mesh, placements, gshape):
    coord = mesh.get_coordinate()
    if coord is None:
        raise ValueError(f"{name}: this rank is not part of the DTensor's device mesh")
    strided = any(type(p).__name__ == "_StridedShard" for p in placements)
    try:
        shape, offsets = _strided_box(gshape, mesh, placements, coord)
    except (ImportError, AttributeError, TypeError):
        if strided:
            raise NotImplementedError(
                f"{name}: _StridedShard placements {placements} need torch's "
                f"_get_shard_size_and_offsets to check that the shard is a box")
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
        shape, offsets = compute_local_shape_and_global_offset(gshape, mesh, placements)
    if offsets is None:
        raise NotImplementedError(
            f"{name}: placements {placements} on mesh {tuple(mesh.shape)} give this rank "
            f"rows that are not contiguous in the global tensor (not a box); redistribute "
            f"the tensor before saving")
    local = t._local_tensor
    if tuple(local.shape) != tuple(shape):
        raise ValueError(f"{name}: local shard shape {tuple(local.shape)} differs from the "
                         f"shape {tuple(shape)} its placements {placements} give")
    return tuple(shape), tuple(int(o) for o in offsets)


_REPLICATED_PEER_DIMS = ("tp", "cp")


def _root_mesh(mesh):
    get = getattr(mesh, "_get_root_mesh", None)
    try:
        return get() if get is not None else None
    except Exception:
        return None


def _peer_dims(mesh, root, count: int, index: int):
    """(count, index, names) extended by the root mesh's "tp"/"cp" dimensions that mesh (a
    submesh) does not have: its tensors are replicated over those peers (see dtensor_piece)."""
    extra_dims = []
    if root is not None and root is not mesh and root.mesh_dim_names:
        sub = set(mesh.mesh_dim_names or ())
        rcoord = root.get_coordinate()
        for i, dn in enumerate(root.mesh_dim_names):
            if dn in _REPLICATED_PEER_DIMS and dn not in sub and rcoord is not None:
                n = root.size(i)
                index = index * n + rcoord[i]
                count *= n
                extra_dims.append(dn)
    return count, index, extra_dims


def dtensor_piece(group: str, name: str, t) -> Piece:
    mesh, placements = t.device_mesh, t.placements
    for p in placements:
        if p.is_partial():
            raise ValueError(f"{name}: DTensor with a Partial placement ({placements}) holds "
                             f"partial sums, not values: redistribute it to Replicate or Shard "
                             f"before saving")
    shape, offsets = local_box(name, t)
    coord = mesh.get_coordinate()
    rep_dims = [i for i, p in enumerate(placements) if p.is_replicate()]
    count, index = 1, 0
    for i in rep_dims:
        n = mesh.size(i)
        index = index * n + coord[i]
        count *= n
    # A DTensor on a submesh (FSDP2 over mesh["dp"] of a (dp, tp) mesh) is also held by the
    # ranks along the root mesh's "tp" and "cp" dimensions when they are not in the submesh:
    # tensor- and context-parallel peers run the same modules, so a tensor not split over them
    # is replicated over them.  Other root dimensions (pipeline stages, ...) are not assumed
    # to hold it: their ranks write their own copy (the store deduplicates identical bytes).
    root = _root_mesh(mesh)
    count, index, extra_dims = _peer_dims(mesh, root, count, index)
    tp_dim = None
    tp_size = None
    names = mesh.mesh_dim_names
    if names and "tp" in names:
        p = placements[names.index("tp")]
        tp_dim = p.dim if hasattr(p, "dim") and not p.is_replicate() else -1
        tp_size = mesh.size(names.index("tp"))
    elif "tp" in extra_dims:
        tp_dim = -1
        tp_size = root.size(root.mesh_dim_names.index("tp"))
    piece = Piece(group=group, name=name, tensor=t._local_tensor.detach(),
                  global_shape=tuple(t.shape), offsets=offsets, tp_dim=tp_dim,
                  replica_count=count, replica_index=index)
    # Holders of this piece hold the same pieces of every tensor with the same mesh and
    # replicated dims: that is the writer rule's class (see assign_writers).
    piece.replica_group = ("mesh", _mesh_ranks(mesh), tuple(mesh.shape),
                           tuple(rep_dims), tuple(extra_dims))
    piece._tp_size = tp_size      # the target's TP degree, for the choice of a view at load
    return piece


def tensor_piece(group: str, name: str, t: torch.Tensor, rank: int, world: int) -> Piece:
    if is_dtensor(t):
        return dtensor_piece(group, name, t)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: {type(t).__name__} is not a tensor (put other objects in "
                        f"extra_state)")
    piece = Piece(group=group, name=name, tensor=t.detach(), replica_count=world,
                  replica_index=rank)
    piece.replica_group = ("world", world)
    return piece


# ----------------------------------------------------------------------------------- models

def module_tensors(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """Clean name -> the module's own parameter/buffer objects (state_dict with keep_vars)."""
    m = unwrap(module)
    out = {}
    for k, v in m.state_dict(keep_vars=True).items():
        if v is None or not isinstance(v, torch.Tensor):
            continue
        out.setdefault(clean_fqn(k), v)
    return out


def param_fqns(module: torch.nn.Module) -> Dict[int, str]:
    """id(parameter) -> clean fqn (the first name of a shared parameter)."""
    m = unwrap(module)
    out = {}
    for k, p in m.named_parameters(remove_duplicate=False):
        out.setdefault(id(p), clean_fqn(k))
    return out


def _flatten(d, prefix=""):
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _flatten(v, key + ".")
        else:
            yield key, v


def object_pieces(group: str, obj, pg) -> List[Piece]:
    """Pieces of a module or a (nested) dict of tensors / DTensors / Megatron ShardedTensors."""
    rank, world = group_info(pg)
    if isinstance(obj, torch.nn.Module):
        if is_fsdp1(obj):
            return _fsdp1().model_pieces(unwrap(obj), group)
        items = module_tensors(obj).items()
    elif isinstance(obj, dict):
        if is_megatron_sharded(obj):
            return _megatron().pieces(obj, group)
        items = list(_flatten(obj))
    elif isinstance(obj, torch.Tensor):
        items = [(group, obj)]
    else:
        raise TypeError(f"state['{group}']: {type(obj).__name__} is neither a module nor a "
                        f"dict of tensors")
    items = list(items)
    # Plain tensors beside DTensors (a sharded model's buffers) are held by the ranks of the
    # model's mesh, which under pipeline parallelism is not the whole group: they are
    # replicated over the first DTensor's mesh, like a DTensor parameter's scalar state.
    mesh = next((t.device_mesh for _, t in items if is_dtensor(t)), None)
    out = []
    for name, t in items:
        if mesh is not None and not is_dtensor(t) and isinstance(t, torch.Tensor):
            out.append(_mesh_whole_piece(group, name, t, mesh))
        else:
            out.append(tensor_piece(group, name, t, rank, world))
    return out


def _model_class_name(m) -> str:
    """The model's own class name: FSDP2's fully_shard (and replicate) swap a module's class
    for a dynamic subclass (FSDPModule, cls) named FSDP<cls>; from_pretrained needs <cls>."""
    cls = type(m)
    while True:
        bases = cls.__bases__
        if len(bases) >= 2 and bases[0].__module__.startswith("torch.distributed"):
            cls = bases[-1]
        else:
            return cls.__name__


def hf_config_json(obj) -> Optional[str]:
    """config.json of a Hugging Face PreTrainedModel (as save_pretrained writes it), or None."""
    if not isinstance(obj, torch.nn.Module):
        return None
    m = unwrap(obj)
    # FSDP1 and activation-checkpointing wrappers forward attributes (config, save_pretrained)
    # to the module they wrap: name the wrapped model's class, not the wrapper's.
    while True:
        inner = m._modules.get("_fsdp_wrapped_module") or \
            m._modules.get("_checkpoint_wrapped_module")
        if inner is None:
            break
        m = inner
    cfg = getattr(m, "config", None)
    if cfg is None or not hasattr(cfg, "to_json_string") or not hasattr(cfg, "to_dict") \
            or not hasattr(m, "save_pretrained"):
        return None
    import copy
    cfg = copy.deepcopy(cfg)
    try:
        cfg.architectures = [_model_class_name(m)]
    except Exception:
        pass
    return cfg.to_json_string()


# ------------------------------------------------------------------------------- optimizers

def _json_value(v):
    if isinstance(v, torch.Tensor):
        return {"__tensor__": v.detach().cpu().tolist()}
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return {"__repr__": repr(v)}


def optim_pieces(model, optim, pg, group: str = "optim") -> List[Piece]:
    """Per-parameter optimizer state tensors: `state.<fqn>.<key>`, sharded like the tensor
    (a DTensor moment is the box of its shard; a plain one, and a scalar step, is whole)."""
    if model is None:
        raise ValueError("saving or loading an optimizer needs state['model'] (the module its "
                         "parameters belong to, for their names)")
    if isinstance(model, torch.nn.Module) and is_fsdp1(model):
        return _fsdp1().optim_pieces(unwrap(model), optim, group)
    if not isinstance(model, torch.nn.Module):
        raise TypeError("the optimizer needs state['model'] to be the nn.Module it optimizes")
    rank, world = group_info(pg)
    fqns = param_fqns(model)
    pieces = []
    for pgroup in optim.param_groups:
        for p in pgroup["params"]:
            fqn = fqns.get(id(p))
            if fqn is None:
                raise ValueError("an optimizer parameter is not a parameter of state['model']")
            for key, v in optim.state.get(p, {}).items():
                if not isinstance(v, torch.Tensor):
                    continue
                name = f"state.{fqn}.{key}"
                if is_dtensor(p) and not is_dtensor(v):
                    pieces.append(_mesh_whole_piece(group, name, v, p.device_mesh))
                else:
                    pieces.append(tensor_piece(group, name, v, rank, world))
    return pieces


def _mesh_whole_piece(group: str, name: str, v: torch.Tensor, mesh) -> Piece:
    """A whole tensor (a scalar step) kept for a DTensor parameter: held by every rank of the
    parameter's mesh (and its tp/cp peers), not necessarily by every rank of the process group
    (pipeline stages hold other parameters)."""
    coord = mesh.get_coordinate()
    count, index = 1, 0
    for i in range(mesh.ndim):
        n = mesh.size(i)
        index = index * n + coord[i]
        count *= n
    count, index, extra_dims = _peer_dims(mesh, _root_mesh(mesh), count, index)
    piece = Piece(group=group, name=name, tensor=v.detach(), replica_count=count,
                  replica_index=index)
    piece.replica_group = ("mesh-whole", _mesh_ranks(mesh),
                           tuple(mesh.shape), tuple(extra_dims))
    return piece


def optim_extra(model, optim) -> dict:
    """param_groups with parameters named by fqn, and non-tensor per-parameter state."""
    fqns = param_fqns(model)
    groups = []
    scalars = {}
    for pgroup in optim.param_groups:
        g = {k: _json_value(v) for k, v in pgroup.items() if k != "params"}
        g["params"] = [fqns.get(id(p), "?") for p in pgroup["params"]]
        groups.append(g)
        for p in pgroup["params"]:
            for key, v in optim.state.get(p, {}).items():
                if not isinstance(v, torch.Tensor):
                    scalars.setdefault(fqns.get(id(p), "?"), {})[key] = _json_value(v)
    return {"param_groups": groups, "state_scalars": scalars}


def _from_json(v, like):
    if isinstance(v, dict) and "__tensor__" in v:
        return torch.tensor(v["__tensor__"], dtype=like.dtype if isinstance(like, torch.Tensor)
                            else None)
    if isinstance(like, tuple) and isinstance(v, list):
        return tuple(_from_json(x, y) for x, y in zip(v, like))
    return v


def restore_param_groups(model, optim, extra: dict):
    """Sets the hyperparameters of optim's param_groups from the saved ones, matched by the
    groups' parameter fqns (or by position when the fqn sets differ, e.g. a model whose
    parameters were renamed)."""
    saved = extra.get("param_groups")
    if not saved:
        return
    fqns = param_fqns(model)
    targets = [set(fqns.get(id(p)) for p in g["params"]) for g in optim.param_groups]
    used = set()
    for i, sg in enumerate(saved):
        names = set(sg.get("params", []))
        match = next((j for j, t in enumerate(targets) if t == names and j not in used), None)
        if match is None:
            if len(saved) != len(optim.param_groups):
                raise ValueError(f"optimizer param_groups: saved group {i} (parameters "
                                 f"{sorted(names)[:3]}...) matches no group of the optimizer")
            match = i
        used.add(match)
        tg = optim.param_groups[match]
        for k, v in sg.items():
            if k == "params":
                continue
            cur = tg.get(k)
            if isinstance(v, dict) and "__repr__" in v:
                continue          # not representable in JSON: keep the target's value
            val = _from_json(v, cur)
            if isinstance(cur, torch.Tensor) and isinstance(val, torch.Tensor):
                cur.copy_(val.to(cur.dtype).reshape(cur.shape))
            else:
                tg[k] = val
    scalars = extra.get("state_scalars") or {}
    if scalars:
        by_name = {fqns.get(id(p)): p for g in optim.param_groups for p in g["params"]}
        for fqn, kv in scalars.items():
            p = by_name.get(fqn)
            if p is None:
                continue
            st = optim.state.setdefault(p, {})
            for k, v in kv.items():
                st[k] = _from_json(v, st.get(k))


def init_optim_state(optim):
    """Creates lazy optimizer state (Adam's moments and step) so that load can fill it: one
    step with zero gradients and lr 0, as torch.distributed.checkpoint.state_dict's
    _init_optim_state does (without importing that package: 0.13 s of a load).  Nothing
    happens when the optimizer has state, or when any parameter has a gradient (a stateless
    optimizer such as SGD then needs nothing).  Gradients are left as they were (None)."""
    if optim.state:
        return
    params = [p for g in optim.param_groups for p in g["params"]]
    if any(p.grad is not None for p in params):
        return
    for p in params:
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    lrs = []
    for g in optim.param_groups:
        if "lr" in g:
            lrs.append(g["lr"])
            g["lr"] = torch.tensor(0.0) if isinstance(g["lr"], torch.Tensor) else 0.0
    try:
        with torch.enable_grad():
            optim.step(closure=None)
    finally:
        for g in optim.param_groups:
            if "lr" in g:
                g["lr"] = lrs.pop(0)
        optim.zero_grad(set_to_none=True)


# ------------------------------------------------------------------------------ writer rule

def assign_writers(pieces: List[Piece], replicas: str):
    """Sets Piece.write.  replicas="all": every holder writes its copy (the store
    deduplicates).  replicas="one": each replicated piece is written by exactly one holder,
    chosen without communication by greedy LPT: within a class of pieces that all holders
    share (same replica_group and replica_count), pieces sorted by (bytes desc, group, name,
    offsets) each go to the least-loaded holder index (lowest index on ties).  Holders of a
    piece hold the same class list, so every holder computes the same assignment.  Pieces
    with replica_count 1 keep the write flag their adapter set."""
    if replicas not in ("one", "all"):
        raise ValueError(f"replicas={replicas!r}: expected 'one' or 'all'")
    classes = defaultdict(list)
    for p in pieces:
        if p.replica_count <= 1:
            continue            # not replicated, or an adapter already chose (Piece.write)
        p.write = True
        if replicas == "one":
            key = (getattr(p, "replica_group", None), p.replica_count)
            classes[key].append(p)
    for (_, count), ps in classes.items():
        ps.sort(key=lambda p: (-p.nbytes(), p.group, p.name, tuple(p.offsets or ()),
                               tuple(p.flat_range or ())))
        heap = [(0, j) for j in range(count)]      # (load, holder index): a valid heap
        for p in ps:
            load, i = heapq.heappop(heap)
            heapq.heappush(heap, (load + max(p.nbytes(), 1), i))
            p.write = (i == p.replica_index)


def prod(xs) -> int:
    return math.prod(int(x) for x in xs)
