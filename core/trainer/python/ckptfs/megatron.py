"""Megatron-core sharded state dicts (ShardedTensor, ShardedTensorFactory) as ckptfs pieces.

megatron-core describes every rank's tensors itself: ``model.sharded_state_dict()`` maps each
local tensor to a ShardedTensor (key, data, global_shape, global_offset, axis_fragmentations,
replica_id, prepend_axis_num) or to a ShardedTensorFactory that builds them
(SwiGLU's linear_fc1 is one: its gate rows and up rows are sharded separately).  ``pieces``
turns that description into Piece objects (pieces.py) that sharding metadata v1 can carry:

- Stacked layers (``prepend_axis_num`` = 1 on a ``layers.`` key: mcore's global tensor is
  [num_layers, ...]) become one global tensor per layer, ``...layers.<i>....``, so that views
  place layers on pipeline stages by name.  Other prepended axes stay in the global shape.
- Fused tensors are split into the global tensors they concatenate, each rank's part of each
  being its own piece whose tensor is a view of a contiguous row range of the fused local
  tensor (no copy; several pieces share one local tensor, and a load fills each its rows):
  * linear_qkv (weight and bias): mcore's global tensor is, per query group g, the group's
    heads_per_group * head_dim query rows, then head_dim key rows, then head_dim value rows.
    Group g's query rows are rows [g*hpg*d, (g+1)*hpg*d) of the global q tensor, its key and
    value rows rows [g*d, (g+1)*d) of the global k and v tensors (heads de-interleaved);
  * linear_fc1 of a gated MLP (SwiGLU): mcore's global tensor is [gate (ffn rows); up (ffn
    rows)]; the rank's gate rows and up rows are ranges of the global gate and up tensors.
  A TP partition need not align with groups: every intersection of the local row range with
  a part becomes a piece.  A rank holding several query groups thus has several pieces of
  q, k and v: libckptfs writes the k-th piece of a name into the rank's k-th part file
  (GROUP-rankRRRRR-K.safetensors), so a save copies nothing but the snapshot, and a load
  fills each piece in place.
- ``flattened_range`` is refused: megatron-core 0.16.1's ShardedTensor refuses it too (its
  distributed optimizer no longer describes flat shards that way).
- Names: ``names="llama"`` (default) renames the GPT layout to Hugging Face Llama names
  (model.embed_tokens, model.layers.<i>.self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj,
  input_layernorm, post_attention_layernorm, model.norm, lm_head), so that the tp1_pp1 view of
  the model group is a Llama-style safetensors file.  ``names="mcore"`` keeps mcore's keys
  (unstacked) and names the fused parts ``<prefix>.q_proj.weight``, ``.k_proj``, ``.v_proj``,
  ``<prefix>.gate_proj.weight``, ``.up_proj``.  Keys of optimizer state
  (``optimizer.state.<key>.<param key>``) become ``state.<param name>.<key>``, the naming the
  other adapters use.
- Optimizer state: megatron-core's own optimizers need CUDA (its DDP allocates its grad
  buffers with torch.cuda.current_device()), so ``optimizer_state(model_state, optimizer)``
  describes a torch optimizer (Adam) over the model's parameters as a sharded state of the
  same layout: each moment is sharded like its parameter (fused ones de-interleaved the same
  way), ``step`` is whole, one per parameter (a fused parameter's under its first part's name,
  e.g. ``state.<...>.q_proj.weight.step``).  param_groups are not tensors: keep them in
  extra_state.
- ``tp_dim`` is explicit: 0 for column-parallel tensors (embedding, output layer, q/k/v,
  gate/up, fc1), 1 for row-parallel weights (linear_proj, linear_fc2), -1 for replicated ones;
  other keys take the axis mcore fragments, if any.
- Replicas: mcore's ``replica_id`` is (pipeline-tie, tensor-parallel, data-parallel) ranks;
  the main replica is all zeros.  With parallel_state initialized, ``replica_count`` /
  ``replica_index`` are derived from the TP and DP(+CP) group sizes; otherwise only the main
  replica writes (``write`` False elsewhere).
- ShardedObjects (e.g. transformer_engine's ``_extra_state``) are not tensors: ``objects``
  returns them for the caller's extra_state.

The head layout comes from ``config`` (a megatron TransformerConfig or any object with
num_attention_heads, num_query_groups, kv_channels, hidden_size, gated_linear_unit,
ffn_hidden_size); it is required when the state holds a linear_qkv or a gated linear_fc1.
No collective is issued.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterator, List, Tuple

import torch

from .pieces import Piece
from . import _state

# Llama (Hugging Face) names of megatron-core's GPT layout, after layer unstacking.
_LLAMA = [
    (r"^embedding\.word_embeddings\.", "model.embed_tokens."),
    (r"^decoder\.layers\.(\d+)\.self_attention\.linear_qkv\.layer_norm_", r"model.layers.\1.input_layernorm."),
    (r"^decoder\.layers\.(\d+)\.input_layernorm\.", r"model.layers.\1.input_layernorm."),
    (r"^decoder\.layers\.(\d+)\.self_attention\.linear_qkv\.", r"model.layers.\1.self_attn.QKV."),
    (r"^decoder\.layers\.(\d+)\.self_attention\.linear_proj\.", r"model.layers.\1.self_attn.o_proj."),
    (r"^decoder\.layers\.(\d+)\.self_attention\.q_layernorm\.", r"model.layers.\1.self_attn.q_norm."),
    (r"^decoder\.layers\.(\d+)\.self_attention\.k_layernorm\.", r"model.layers.\1.self_attn.k_norm."),
    (r"^decoder\.layers\.(\d+)\.mlp\.linear_fc1\.layer_norm_", r"model.layers.\1.post_attention_layernorm."),
    (r"^decoder\.layers\.(\d+)\.pre_mlp_layernorm\.", r"model.layers.\1.post_attention_layernorm."),
    (r"^decoder\.layers\.(\d+)\.mlp\.linear_fc1\.", r"model.layers.\1.mlp.FC1."),
    (r"^decoder\.layers\.(\d+)\.mlp\.linear_fc2\.", r"model.layers.\1.mlp.down_proj."),
    (r"^decoder\.final_layernorm\.", "model.norm."),
    (r"^output_layer\.", "lm_head."),
]
_LLAMA = [(re.compile(a), b) for a, b in _LLAMA]

_QKV = re.compile(r"(^|\.)linear_qkv\.(weight|bias)$")
_FC1 = re.compile(r"(^|\.)linear_fc1\.(weight|bias)$")
_COLUMN = re.compile(r"(^|\.)(word_embeddings\.weight|output_layer\.weight|linear_qkv\.(weight|bias)"
                     r"|linear_fc1\.(weight|bias))$")
_ROW = re.compile(r"(^|\.)(linear_proj|linear_fc2)\.weight$")
_REPLICATED = re.compile(r"(^|\.)((linear_proj|linear_fc2)\.bias|layer_norm_(weight|bias)"
                         r"|[a-z_]*layernorm\.(weight|bias)|[a-z_]*norm\.(weight|bias))$")
_OPT = re.compile(r"^optimizer\.state\.([A-Za-z0-9_]+)\.(.+)$")
_LAYERS = re.compile(r"(^|\.)layers\.")


def _mapping():
    try:
        from megatron.core.dist_checkpointing import mapping
    except ImportError as e:
        raise RuntimeError(f"ckptfs.megatron: megatron-core is not importable: {e}") from e
    return mapping


def _walk(x) -> Iterator[Any]:
    if isinstance(x, dict):
        for v in x.values():
            yield from _walk(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _walk(v)
    else:
        yield x


def _leaves(sharded_state_dict):
    """ShardedTensors (factories built, the input left unchanged) and ShardedObjects."""
    m = _mapping()
    for x in _walk(sharded_state_dict):
        if isinstance(x, m.ShardedTensorFactory):
            for y in _walk(x.build()):
                if isinstance(y, m.ShardedTensorFactory):
                    raise ValueError(f"ckptfs.megatron: {x.key}: factory builds a factory")
                yield y
        else:
            yield x


def objects(sharded_state_dict) -> dict:
    """key -> ShardedObject of the state (non-tensor entries, for the caller's extra_state)."""
    m = _mapping()
    return {x.key: x for x in _leaves(sharded_state_dict) if isinstance(x, m.ShardedObject)}


def _is_main(replica_id) -> bool:
    if isinstance(replica_id, int):
        return replica_id == 0
    return all(r == 0 for r in replica_id)


def _replicas(st, tp_fragmented: bool):
    """(replica_count, replica_index, write, replica_group) from mcore's replica_id and
    parallel_state.  The group names the holders for the writer rule (ckptfs._state.
    assign_writers: one class must hold pieces with the same holders): the TP-replicated
    pieces of a pipeline stage, or the DP replicas of one TP rank's pieces."""
    rid = st.replica_id
    main = _is_main(rid)
    try:
        from megatron.core import parallel_state as ps
        ready = ps.model_parallel_is_initialized()
    except Exception:
        ready = False
    if not ready or isinstance(rid, int) or len(rid) != 3:
        return 1, 0, main, None
    tie, tp_r, dp_r = rid
    tp = 1 if tp_fragmented else ps.get_tensor_model_parallel_world_size()
    dp = ps.get_data_parallel_world_size(with_context_parallel=True)
    if tie != 0:
        # A copy of a tensor another pipeline stage holds (tied embeddings): never written.
        return 1, 0, False, None
    stage = ps.get_pipeline_model_parallel_rank()
    holders = ("megatron", "tp-replicated" if tp > 1 else "dp", stage,
               None if tp > 1 else ps.get_tensor_model_parallel_rank())
    return tp * dp, tp_r * dp + dp_r, True, holders


class ShardedState(dict):
    """A megatron sharded state dict that carries its model's TransformerConfig (so that
    ckptfs.save / ckptfs.load split fused tensors without a config argument)."""
    config = None


def state_dict(model, **kwargs) -> ShardedState:
    """model.sharded_state_dict(**kwargs) with model.config attached: pass it as
    state["model"] to ckptfs.save / ckptfs.load."""
    sd = ShardedState(model.sharded_state_dict(**kwargs))
    sd.config = getattr(model, "config", None)
    return sd


def _head_layout(config):
    if config is None:
        raise ValueError("ckptfs.megatron: the state holds a fused linear_qkv: pass config "
                         "(num_attention_heads, num_query_groups, kv_channels)")
    heads = int(config.num_attention_heads)
    groups = int(getattr(config, "num_query_groups", None) or heads)
    d = getattr(config, "kv_channels", None) or int(config.hidden_size) // heads
    if heads % groups:
        raise ValueError(f"ckptfs.megatron: {heads} heads are not divisible into {groups} "
                         f"query groups")
    return heads, groups, int(d)


def _qkv_parts(key, gshape, config, names):
    """[(fused_start, rows, name, target_start, target_global_shape)] of a linear_qkv."""
    heads, groups, d = _head_layout(config)
    hpg = heads // groups
    rows = groups * (hpg + 2) * d
    if gshape[0] != rows:
        raise ValueError(f"ckptfs.megatron: {key}: global shape {tuple(gshape)} is not "
                         f"{groups} query groups x ({hpg} + 2) heads x {d} rows")
    rest = tuple(gshape[1:])
    q, k, v = (names(key, p) for p in ("q_proj", "k_proj", "v_proj"))
    out = []
    for g in range(groups):
        base = g * (hpg + 2) * d
        out.append((base, hpg * d, q, g * hpg * d, (heads * d,) + rest))
        out.append((base + hpg * d, d, k, g * d, (groups * d,) + rest))
        out.append((base + (hpg + 1) * d, d, v, g * d, (groups * d,) + rest))
    return out


def _fc1_parts(key, gshape, config, names):
    if gshape[0] % 2:
        raise ValueError(f"ckptfs.megatron: {key}: gated linear_fc1 with an odd row count "
                         f"{gshape[0]}")
    ffn = gshape[0] // 2
    want = getattr(config, "ffn_hidden_size", None)
    if want is not None and int(want) != ffn:
        raise ValueError(f"ckptfs.megatron: {key}: global rows {gshape[0]} != 2 x "
                         f"ffn_hidden_size {want}")
    rest = tuple(gshape[1:])
    return [(0, ffn, names(key, "gate_proj"), 0, (ffn,) + rest),
            (ffn, ffn, names(key, "up_proj"), 0, (ffn,) + rest)]


def _unstack(st) -> Tuple[str, torch.Tensor, Tuple[int, ...], Tuple[int, ...], Tuple[int, ...]]:
    """(key, data, global_shape, offsets, local_shape) with a stacked layer axis removed."""
    key, p = st.key, st.prepend_axis_num
    gshape, off = tuple(st.global_shape), tuple(st.global_offset)
    local = tuple(st.local_shape)
    data = st.data
    if p == 0:
        return key, data, gshape, off, local
    if p == 1 and _LAYERS.search(key):
        m = _LAYERS.search(key)
        key = f"{key[:m.end()]}{off[0]}.{key[m.end():]}"
        return key, data, gshape[1:], off[1:], local
    # Any other prepended axis (e.g. experts) stays part of the global tensor.
    local = (1,) * p + local
    return key, data.reshape(local), gshape, off, local


def _rename(key: str, scheme: str) -> str:
    if scheme == "mcore":
        return key
    for pat, rep in _LLAMA:
        if pat.search(key):
            return pat.sub(rep, key, count=1)
    return key


def pieces(sharded_state_dict, group: str = "model", *, config=None,
           names: str = "llama") -> List[Piece]:
    """The pieces of a megatron-core sharded state dict (see the module docstring).

    A rank that holds several query groups has several pieces of each of q, k and v (one per
    group, each a view of the fused local tensor): a save writes each from the model's memory
    and a load fills each in place.
    """
    if names not in ("llama", "mcore"):
        raise ValueError(f"ckptfs.megatron: names={names!r}: expected 'llama' or 'mcore'")
    m = _mapping()
    if config is None:
        config = getattr(sharded_state_dict, "config", None)
    gated = getattr(config, "gated_linear_unit", None)
    out: List[Piece] = []
    for st in _leaves(sharded_state_dict):
        if isinstance(st, m.ShardedObject):
            continue
        if isinstance(st, torch.Tensor):
            raise ValueError("ckptfs.megatron: a plain tensor in a sharded state dict has no "
                             "key: wrap it in a ShardedTensor or save it as a plain state")
        if not isinstance(st, m.ShardedTensor):
            continue
        if st.data is None:
            raise ValueError(f"ckptfs.megatron: {st.key}: ShardedTensor without data")
        if getattr(st, "flattened_range", None) is not None:
            raise NotImplementedError(f"ckptfs.megatron: {st.key}: flattened_range "
                                      f"ShardedTensors are not supported")
        out.extend(_tensor_pieces(st, group, config, gated, names))
    return out



def _tensor_pieces(st, group, config, gated, scheme) -> List[Piece]:
    key, data, gshape, off, local = _unstack(st)
    opt = _OPT.match(key)
    param_key = opt.group(2) if opt else key
    frags = tuple(st.axis_fragmentations or ())[st.prepend_axis_num:]
    tp_fragmented = any(f > 1 for f in frags)
    rc, ri, write, holders = _replicas(st, tp_fragmented)

    def final(name: str) -> str:
        return f"state.{name}.{opt.group(1)}" if opt else name

    def part_name(k: str, part: str) -> str:
        # The fused tensor's name with linear_qkv / linear_fc1 replaced by the part's name
        # (a key outside the Llama layout keeps its mcore prefix).
        base = _rename(k, scheme)
        if re.search(r"\.(QKV|FC1)\.", base):
            return re.sub(r"\.(QKV|FC1)\.", f".{part}.", base)
        return re.sub(r"(^|\.)linear_(qkv|fc1)\.", rf"\1{part}.", base)

    if _COLUMN.search(param_key):
        tp_dim = 0
    elif _ROW.search(param_key):
        tp_dim = 1
    elif _REPLICATED.search(param_key):
        tp_dim = -1
    else:
        tp_dim = next((i for i, f in enumerate(frags) if f > 1), None)
        if tp_dim is not None and len(gshape) != len(frags):
            tp_dim += len(gshape) - len(frags)

    parts = None
    if not gshape:
        # A scalar (an optimizer step of a fused parameter): whole, under the first part's
        # name so that it sits next to that part's moments.
        if _QKV.search(param_key):
            param_key = part_name(param_key, "q_proj")
        elif _FC1.search(param_key) and (gated if gated is not None
                                         else _fused_fc1_guess(st, config)):
            param_key = part_name(param_key, "gate_proj")
        return _finish([Piece(name=final(_rename(param_key, scheme)), tensor=data,
                              global_shape=(), offsets=(), group=group, tp_dim=-1,
                              replica_count=rc, replica_index=ri, write=write)], holders)
    if _QKV.search(param_key):
        parts = _qkv_parts(param_key, gshape, config, part_name)
    elif _FC1.search(param_key) and (gated if gated is not None
                                     else _fused_fc1_guess(st, config)):
        parts = _fc1_parts(param_key, gshape, config, part_name)

    common = dict(group=group, tp_dim=tp_dim, replica_count=rc, replica_index=ri, write=write)
    if parts is None:
        return _finish([Piece(name=final(_rename(param_key, scheme)), tensor=data,
                              global_shape=gshape, offsets=off, **common)], holders)
    if len(gshape) != len(local):
        raise ValueError(f"ckptfs.megatron: {st.key}: fused tensor with extra prepended axes")
    o0, n0 = off[0], local[0]
    out = []
    for fstart, rows, tname, tstart, tshape in parts:
        lo, hi = max(o0, fstart), min(o0 + n0, fstart + rows)
        if lo < hi:
            out.append(Piece(name=final(tname), tensor=data[lo - o0:hi - o0],
                             global_shape=tshape,
                             offsets=(tstart + lo - fstart,) + tuple(off[1:]), **common))
    return _finish(out, holders)


def _finish(out: List[Piece], holders) -> List[Piece]:
    for p in out:
        p.replica_group = holders
    return out


def _fused_fc1_guess(st, config) -> bool:
    """Without gated_linear_unit in config: fc1 is fused when it has 2 x ffn rows."""
    ffn = getattr(config, "ffn_hidden_size", None)
    g = tuple(st.global_shape)[st.prepend_axis_num:]
    return ffn is not None and len(g) >= 1 and g[0] == 2 * int(ffn)


def optimizer_state(model_state, optimizer) -> ShardedState:
    """The per-parameter state of a torch optimizer over a megatron model, as a sharded state
    of the model's layout (see the module docstring): pass it as its own key, e.g.
    ckptfs.save(path, {"model": state_dict(model), "optim": optimizer_state(sd, opt)}); its
    pieces are named ``state.<param name>.<key>`` in group "optim".

    model_state: the model's sharded state dict (state_dict(model) or
    model.sharded_state_dict()).  A moment shaped like its parameter is described by views of
    the same rows as the parameter's pieces (so a load fills the optimizer's own tensors);
    a scalar (``step``) whole, replicated on every rank of the stage.  An optimizer without
    state yet (a fresh one, before a load) first gets it from a zero-gradient step with lr 0
    (ckptfs._state.init_optim_state), leaving the parameters unchanged.
    """
    m = _mapping()
    if not optimizer.state:
        _state.init_optim_state(optimizer)
    by_storage = {}
    for g in optimizer.param_groups:
        for prm in g["params"]:
            by_storage[prm.untyped_storage().data_ptr()] = prm
    try:
        from megatron.core import parallel_state as ps
        tp_rank = ps.get_tensor_model_parallel_rank()
        dp_rank = ps.get_data_parallel_rank(with_context_parallel=True)
    except Exception:
        tp_rank = dp_rank = 0
    out = ShardedState()
    out.config = getattr(model_state, "config", None)
    scalars_done = set()
    for st in _leaves(model_state):
        if not isinstance(st, m.ShardedTensor) or st.data is None:
            continue
        prm = by_storage.get(st.data.untyped_storage().data_ptr())
        if prm is None:
            continue
        for k, v in optimizer.state.get(prm, {}).items():
            if not isinstance(v, torch.Tensor):
                continue
            key = f"optimizer.state.{k}.{st.key}"
            if v.shape == prm.shape and v.stride() == prm.stride():
                view = v.as_strided(st.data.size(), st.data.stride(),
                                    v.storage_offset() + st.data.storage_offset()
                                    - prm.storage_offset())
                out[f"{key}@{tuple(st.global_offset)}"] = dataclasses.replace(
                    st, key=key, data=view, dtype=v.dtype)
            elif v.dim() == 0:
                if (id(prm), k) in scalars_done:
                    continue
                scalars_done.add((id(prm), k))
                p = st.prepend_axis_num
                frags = tuple(st.axis_fragmentations or (1,) * len(st.global_shape))[:p]
                out[f"{key}@{tuple(st.global_offset[:p])}"] = m.ShardedTensor(
                    key=key, data=v, dtype=v.dtype, local_shape=(),
                    global_shape=tuple(st.global_shape[:p]),
                    global_offset=tuple(st.global_offset[:p]), axis_fragmentations=frags,
                    replica_id=(0, tp_rank, dp_rank), prepend_axis_num=p)
            else:
                raise ValueError(f"ckptfs.megatron: {key}: optimizer state of shape "
                                 f"{tuple(v.shape)} for a parameter of shape "
                                 f"{tuple(prm.shape)}")
    return out
