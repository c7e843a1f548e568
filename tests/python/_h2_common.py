"""Helpers of the FSDP1 / Megatron / transformers tests: rebuild global tensors from pieces.

The tests check an adapter's descriptors without ckptfs itself: every rank returns its pieces
(placement plus a copy of the data), and ``assemble`` lays them into global tensors the way
docs/views.md section 3 defines a box, a flat range of a box and replicas, refusing gaps,
overlaps that disagree and pieces that disagree on dtype or global shape.
"""
from __future__ import annotations

import math
from typing import Dict, Iterable, List, Tuple

import torch


def piece_record(p) -> dict:
    """A picklable copy of one Piece (data cloned to a plain contiguous tensor)."""
    return {"group": p.group, "name": p.name, "data": p.tensor.detach().clone().contiguous(),
            "global_shape": None if p.global_shape is None else tuple(p.global_shape),
            "offsets": None if p.offsets is None else tuple(p.offsets),
            "flat_range": None if p.flat_range is None else tuple(p.flat_range),
            "box_shape": None if p.box_shape is None else tuple(p.box_shape),
            "tp_dim": p.tp_dim, "pp": p.pp, "replica_count": p.replica_count,
            "replica_index": p.replica_index, "write": p.write, "storage": p.tensor.untyped_storage().data_ptr(),
            "storage_offset": p.tensor.storage_offset(),
            "is_view": p.tensor._base is not None}


def _box_index(offsets, box_shape):
    return tuple(slice(o, o + s) for o, s in zip(offsets, box_shape))


def assemble(records: Iterable[dict], group: str) -> Dict[str, torch.Tensor]:
    """Global tensors of one group from all ranks' piece records; raises on any gap/conflict."""
    out: Dict[str, torch.Tensor] = {}
    cover: Dict[str, torch.Tensor] = {}
    for r in records:
        if r["group"] != group:
            continue
        data = r["data"]
        gshape = r["global_shape"] if r["global_shape"] is not None else tuple(data.shape)
        name = r["name"]
        if name not in out:
            out[name] = torch.zeros(gshape, dtype=data.dtype)
            cover[name] = torch.zeros(gshape, dtype=torch.bool)
        g, c = out[name], cover[name]
        if tuple(g.shape) != tuple(gshape) or g.dtype != data.dtype:
            raise AssertionError(f"{name}: pieces disagree: {tuple(g.shape)}/{g.dtype} vs "
                                 f"{tuple(gshape)}/{data.dtype}")
        offsets = r["offsets"] or (0,) * len(gshape)
        if r["flat_range"] is None:
            if data.dim() != len(gshape):
                raise AssertionError(f"{name}: stored ndim {data.dim()} != global {len(gshape)}")
            idx = _box_index(offsets, data.shape)
            gv, cv = g[idx], c[idx]
            src = data
        else:
            box = r["box_shape"] or tuple(gshape)
            a, b = r["flat_range"]
            if data.dim() != 1 or data.numel() != b - a or not (0 <= a <= b <= math.prod(box)):
                raise AssertionError(f"{name}: bad flat range {a, b} for data {tuple(data.shape)}")
            idx = _box_index(offsets, box)
            gv = g[idx].reshape(-1)[a:b] if g[idx].is_contiguous() else None
            if gv is None:      # non-contiguous box: go through a copy and write back
                boxv = g[idx].clone().reshape(-1)
                cb = c[idx].clone().reshape(-1)
                _put(name, boxv[a:b], cb[a:b], data)
                g[idx] = boxv.reshape(box)
                c[idx] = cb.reshape(box)
                continue
            cv = c[idx].reshape(-1)[a:b]
            src = data
        _put(name, gv, cv, src)
    for name, c in cover.items():
        if not bool(c.all()):
            miss = (~c).nonzero()[0].tolist()
            raise AssertionError(f"{name}: not covered by any piece from index {miss}")
    return out


def _put(name, gv, cv, src):
    both = cv
    if bool(both.any()):
        if not torch.equal(gv[both], src[both]):
            raise AssertionError(f"{name}: overlapping pieces disagree")
    gv.copy_(src)
    cv.fill_(True)


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (NaN-safe, -0.0 distinct from 0.0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    a, b = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
    return bytes(a.view(torch.uint8).numpy()) == bytes(b.view(torch.uint8).numpy())


def diff_report(got: Dict[str, torch.Tensor], want: Dict[str, torch.Tensor]) -> List[str]:
    """Every difference between two name -> tensor dicts, as readable lines."""
    lines = []
    for k in sorted(set(got) | set(want)):
        if k not in got:
            lines.append(f"missing {k}")
        elif k not in want:
            lines.append(f"unexpected {k}")
        elif not bit_equal(got[k], want[k]):
            lines.append(f"{k}: got {tuple(got[k].shape)} {got[k].dtype}, want "
                         f"{tuple(want[k].shape)} {want[k].dtype}")
    return lines


def written_once(records) -> list:
    """Problems with the writer choice: every distinct piece (group, name, offsets, flat
    range) must be written by exactly one rank."""
    count = {}
    for r in records:
        k = (r["group"], r["name"], r["offsets"], r["flat_range"],
             tuple(r["data"].shape))
        count.setdefault(k, 0)
        count[k] += 1 if r["write"] else 0
    return [f"{k}: written {n} times" for k, n in count.items() if n != 1]
