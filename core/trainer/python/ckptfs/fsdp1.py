"""FSDP1 (``FullyShardedDataParallel`` with ``use_orig_params=True``) as ckptfs pieces.

FSDP1 concatenates the original parameters of each wrapped unit into one FlatParameter and
gives every rank one equal chunk of it (``torch.chunk`` of the padded flat tensor).  With
``use_orig_params=True`` each original parameter of a rank is a 1-D view of the elements of
that parameter that fall in the rank's chunk: a flat range of the row-major flattening of the
original tensor, possibly empty.  This module reads that placement from the FlatParameter's
own shard metadata (``_fqns``, ``_shapes``, ``_shard_param_infos``, ``_numels_with_padding``;
the same fields torch's state-dict code uses) and describes every parameter and its optimizer
state as Piece objects (pieces.py):

- ``global_shape`` is the original shape, ``flat_range`` = (start, end) in its flattening,
  ``box_shape`` None (the box is the whole tensor), ``tensor`` the rank's 1-D local data (the
  original parameter itself, so a load fills the FlatParameter in place);
- a parameter absent from the rank's chunk gives no piece (it has nothing to store or fill);
- names are the clean fully-qualified names (FSDP, activation-checkpoint and torch.compile
  wrapper prefixes removed), the names FSDP's own FULL_STATE_DICT uses; a parameter shared by
  several modules appears once, under its first name;
- parameters and buffers FSDP does not shard (ignored modules, buffers) are whole tensors,
  replicated on every rank (FSDP does not synchronise an ignored module's parameters: a job
  whose copies differ by rank keeps the one its writer rule picks, and views report the
  replicas as disagreeing when every rank writes);
- optimizer state (group "optim", names ``state.<fqn>.<key>``): tensors with the local
  parameter's shape (Adam's exp_avg / exp_avg_sq) get the parameter's placement; other tensors
  (``step``) are whole, replicated on the ranks whose chunk holds part of the parameter (only
  those ranks have state for it).

Only the module's own metadata is read: no collective is issued.  The group argument is the
file group the pieces are written to (``Piece.group``); the process group is FSDP's own.
Call these outside forward/backward, when FSDP holds the sharded parameters (after
``optimizer.step()``); a module caught in its unsharded state is an error, not a silent
full-size save.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch
import torch.distributed as dist

from .pieces import Piece

# Prefixes torch's module wrappers put into parameter names: FSDP1's own, activation
# checkpointing's, torch.compile's.  FSDP's clean_tensor_name removes the first two.
_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def clean_name(name: str) -> str:
    """The parameter name without module-wrapper prefixes (as FSDP's state dicts name it)."""
    for p in _WRAPPER_PREFIXES:
        name = name.replace(p, "")
    return name


class _Placement:
    """Where one FSDP-managed original parameter's local data sits in the global tensor."""

    __slots__ = ("fqn", "shape", "local", "flat_range", "holders", "rank_in_holders",
                 "replica_count", "replica_index", "sharded")

    def __init__(self, fqn, shape, local, flat_range, holders, rank_in_holders,
                 replica_count, replica_index, sharded):
        self.fqn = fqn
        self.shape = shape                  # original shape (torch.Size)
        self.local = local                  # the original parameter (1-D view when sharded)
        self.flat_range = flat_range        # (a, b) or None when the rank holds nothing
        self.holders = holders              # shard-group ranks whose chunk intersects the param
        self.rank_in_holders = rank_in_holders   # index of this rank in holders, or None
        self.replica_count = replica_count  # copies of the same flat range (HYBRID_SHARD)
        self.replica_index = replica_index
        self.sharded = sharded              # False for NO_SHARD: the param is whole


def _fsdp_param_infos(module: torch.nn.Module):
    try:
        from torch.distributed.fsdp._optim_utils import _get_fqn_to_fsdp_param_info
    except ImportError as e:     # pragma: no cover - depends on the torch release
        raise RuntimeError(f"ckptfs.fsdp1: this torch ({torch.__version__}) has no FSDP1 "
                           f"parameter map (torch.distributed.fsdp._optim_utils): {e}") from e
    return _get_fqn_to_fsdp_param_info(module)


def _replication(state) -> Tuple[int, int]:
    """(count, index) of this rank among the copies of its chunk (HYBRID_SHARD: inter-node)."""
    pg = getattr(state, "_inter_node_pg", None)
    strategy = getattr(state, "sharding_strategy", None)
    name = getattr(strategy, "name", "")
    if pg is not None and name in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        return dist.get_world_size(pg), dist.get_rank(pg)
    return 1, 0


def placements(module: torch.nn.Module) -> Dict[str, _Placement]:
    """Clean fqn -> placement of every FSDP-managed original parameter of module."""
    out: Dict[str, _Placement] = {}
    infos = _fsdp_param_infos(module)
    seen_handles = {}
    for raw_fqn, info in infos.items():
        fqn = clean_name(raw_fqn)     # torch's names keep torch.compile's _orig_mod.
        handle = info.handle
        fp = handle.flat_param
        if not getattr(handle, "_use_orig_params", False):
            raise ValueError(f"ckptfs.fsdp1: {fqn}: the FSDP unit was built with "
                             f"use_orig_params=False; wrap with use_orig_params=True")
        idx = info.param_indices[raw_fqn]
        if fp._params is None:
            raise ValueError(f"ckptfs.fsdp1: {fqn}: FlatParameter has no original parameters")
        param = fp._params[idx]
        shape = torch.Size(fp._shapes[idx])
        numel = shape.numel()
        contig = getattr(fp, "_contiguities", None)
        if contig is not None and not contig[idx]:
            # FSDP flattens a non-contiguous parameter in memory order, which is not the
            # row-major order that a flat range of the global tensor means.
            raise ValueError(f"ckptfs.fsdp1: {fqn}: parameter was not contiguous when FSDP "
                             f"flattened it (strides {tuple(fp._strides[idx])}); its flat shard "
                             f"is not a row-major range")
        key = id(handle)
        if key not in seen_handles:
            seen_handles[key] = _handle_layout(handle, info.state)
        layout = seen_handles[key]
        if not handle.uses_sharded_strategy:
            out[fqn] = _Placement(fqn, shape, param, (0, numel) if numel else None,
                                  list(range(layout["world"])), layout["rank"],
                                  1, 0, False)
            continue
        spi = fp._shard_param_infos[idx]
        if spi.in_shard:
            a = spi.intra_param_start_idx
            b = spi.intra_param_end_idx + 1
            if param.dim() != 1 or param.numel() != b - a:
                raise RuntimeError(
                    f"ckptfs.fsdp1: {fqn}: the local parameter has shape {tuple(param.shape)}, "
                    f"not the 1-D shard of {b - a} elements: the FSDP module is not in its "
                    f"sharded state (call outside forward/backward, e.g. after optimizer.step())")
            fr = (a, b)
        else:
            fr = None
        # Which ranks of the shard group hold a part of this parameter: rank r holds
        # [r*c, (r+1)*c) of the padded flat parameter, c = the padded chunk length.
        start, end = layout["offsets"][idx]          # inclusive, in the unpadded flat param
        c = layout["chunk"]
        holders = [r for r in range(layout["world"])
                   if c > 0 and r * c <= end and (r + 1) * c - 1 >= start]
        me = holders.index(layout["rank"]) if layout["rank"] in holders else None
        if (fr is not None) != (me is not None):
            raise RuntimeError(f"ckptfs.fsdp1: {fqn}: shard metadata disagrees with the chunk "
                               f"layout (rank {layout['rank']}, range {fr}, holders {holders})")
        rc, ri = layout["replication"]
        out[fqn] = _Placement(fqn, shape, param, fr, holders, me, rc, ri, True)
    return out


def _handle_layout(handle, state) -> dict:
    fp = handle.flat_param
    offsets_all = handle._get_flat_param_offsets()       # with padding entries
    offsets = [o for o, pad in zip(offsets_all, fp._is_padding_mask) if not pad]
    chunk = fp._sharded_size.numel() if handle.uses_sharded_strategy else 0
    return {"offsets": offsets, "chunk": chunk, "rank": handle.rank,
            "world": handle.world_size, "replication": _replication(state)}


def _unmanaged(module: torch.nn.Module, managed: Dict[str, _Placement]):
    """(name, tensor) of the parameters and persistent buffers FSDP does not shard."""
    managed_ids = {id(p.local) for p in managed.values()}
    seen = set()
    for name, p in module.named_parameters():
        if getattr(p, "_is_flat_param", False) or id(p) in managed_ids or id(p) in seen:
            continue
        seen.add(id(p))
        yield clean_name(name), p
    for mod_name, mod in module.named_modules():
        skip = getattr(mod, "_non_persistent_buffers_set", set())
        for bname, b in mod.named_buffers(recurse=False):
            if b is None or bname in skip or id(b) in seen:
                continue
            seen.add(id(b))
            yield clean_name(f"{mod_name}.{bname}" if mod_name else bname), b


def _whole(group: str, name: str, t: torch.Tensor) -> Piece:
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    return _with_holders(Piece(group=group, name=name, tensor=t.detach(), tp_dim=-1,
                               replica_count=world, replica_index=rank), ("world", world))


def _with_holders(piece: Piece, holders) -> Piece:
    """Sets the piece's replica_group: the writer rule (ckptfs._state.assign_writers) splits
    the replicated pieces of a class among their holders without communication, so a class
    must hold pieces that all have the same holders.  Values: ("world", n) for every rank of
    the job, ("fsdp1", ranks) for the ranks whose chunks hold part of a parameter,
    ("fsdp1-replicas", n) for the copies of one chunk under HYBRID_SHARD."""
    piece.replica_group = holders
    return piece


def model_pieces(module: torch.nn.Module, group: str = "model") -> List[Piece]:
    """The pieces of an FSDP1 module's parameters (flat ranges) and buffers (whole)."""
    pl = placements(module)
    out: List[Piece] = []
    for fqn, p in pl.items():
        t = p.local.detach()
        if not p.sharded:
            out.append(_with_holders(Piece(group=group, name=fqn, tensor=t, tp_dim=-1,
                                           replica_count=len(p.holders),
                                           replica_index=p.rank_in_holders),
                                     ("world", len(p.holders))))
            continue
        if p.flat_range is None:
            if p.shape.numel() == 0 and not p.holders and _global_rank() == 0:
                # A zero-element parameter lies in no rank's chunk; rank 0 records it.
                out.append(Piece(group=group, name=fqn, tensor=t.reshape(p.shape),
                                 global_shape=tuple(p.shape)))
            continue
        out.append(_with_holders(Piece(group=group, name=fqn, tensor=t,
                                       global_shape=tuple(p.shape), flat_range=p.flat_range,
                                       replica_count=p.replica_count,
                                       replica_index=p.replica_index),
                                 ("fsdp1-replicas", p.replica_count)))
    for name, t in _unmanaged(module, pl):
        out.append(_whole(group, name, t))
    return out


def _global_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def optim_pieces(module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 group: str = "optim") -> List[Piece]:
    """The pieces of the optimizer's per-parameter state, named ``state.<fqn>.<key>``.

    A state tensor shaped like the local parameter is placed like it; any other tensor (e.g.
    Adam's ``step``) is whole, one replica per rank that holds part of the parameter.
    Non-tensor state values and parameters without state on this rank give no piece.
    """
    pl = placements(module)
    by_param = {id(p.local): p for p in pl.values()}
    for name, t in _unmanaged(module, pl):
        if isinstance(t, torch.nn.Parameter):
            by_param.setdefault(id(t), _Placement(name, t.shape, t, None, [], None, 1, 0, False))
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    out: List[Piece] = []
    for pg in optimizer.param_groups:
        for param in pg["params"]:
            st = optimizer.state.get(param)
            if not st:
                continue
            p = by_param.get(id(param))
            if p is None:
                raise ValueError(f"ckptfs.fsdp1: the optimizer holds a parameter of shape "
                                 f"{tuple(param.shape)} that is not a parameter of the module")
            for key, v in st.items():
                if not isinstance(v, torch.Tensor):
                    continue
                name = f"state.{p.fqn}.{key}"
                v = v.detach()
                if p.sharded and p.flat_range is not None and v.shape == p.local.shape \
                        and v.dim() == 1:
                    out.append(_with_holders(Piece(group=group, name=name, tensor=v,
                                                   global_shape=tuple(p.shape),
                                                   flat_range=p.flat_range,
                                                   replica_count=p.replica_count,
                                                   replica_index=p.replica_index),
                                             ("fsdp1-replicas", p.replica_count)))
                elif not p.sharded and v.shape == p.shape and v.dim() > 0:
                    # NO_SHARD or a parameter FSDP does not manage: whole on every rank.
                    out.append(_with_holders(Piece(group=group, name=name, tensor=v, tp_dim=-1,
                                                   replica_count=world, replica_index=rank),
                                             ("world", world)))
                elif v.shape == p.local.shape and v.numel() > 1:
                    raise ValueError(f"ckptfs.fsdp1: {name}: state shaped like the local "
                                     f"parameter but the parameter holds no range here")
                else:
                    if p.sharded and p.rank_in_holders is None:
                        raise ValueError(f"ckptfs.fsdp1: {name}: state for a parameter that "
                                         f"holds no range on this rank")
                    if p.sharded:
                        rc = len(p.holders) * p.replica_count
                        ri = p.rank_in_holders * p.replica_count + p.replica_index
                        holders = ("fsdp1", tuple(p.holders), p.replica_count)
                    else:
                        rc, ri = world, rank
                        holders = ("world", world)
                    out.append(_with_holders(Piece(group=group, name=name, tensor=v, tp_dim=-1,
                                                   replica_count=rc, replica_index=ri),
                                             holders))
    return out
