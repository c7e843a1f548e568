"""ckptfs.megatron's descriptors of a real megatron-core GPTModel, without the library.

A TP2 job describes its model (megatron-core's own sharded_state_dict, factories included)
as pieces; the test lays all ranks' pieces into global tensors and compares them with the
Llama-named global tensors it derives itself from the raw local parameters (fused QKV with 4
query groups of 2 heads de-interleaved, SwiGLU fc1 split into gate and up).  Loads into TP1
and TP4 through the library are in test_megatron_load.py.
"""
from __future__ import annotations

import torch

from conftest import run_ranks
from _h2_common import assemble, diff_report, piece_record, written_once
import _h2_mcore as job


def _describe(rank, world, names):
    import ckptfs.megatron as mg
    model, cfg = job.build(world, seed=3)
    if names == "llama":
        # The config travels with the state dict (what ckptfs.save's dispatch passes on).
        ps = mg.pieces(mg.state_dict(model), "model")
    else:
        ps = mg.pieces(model.sharded_state_dict(), "model", config=cfg, names=names)
    # Fused parts are views of the fused local parameter: no copy.
    from ckptfs._state import assign_writers
    assign_writers(ps, "one")
    ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    for p in ps:
        assert p.tensor.untyped_storage().data_ptr() in ptrs, p.name
    out = {"pieces": [piece_record(p) for p in ps], "local": job.local_params(model)}
    job.finish()
    return out


def _tp2_global():
    res = run_ranks(2, _describe, "llama", timeout=240)
    records = [r for rr in res for r in rr["pieces"]]
    got = assemble(records, "model")
    want = job.reference_global([rr["local"] for rr in res])
    return records, got, want


def test_megatron_tp2_pieces_are_llama_global_tensors():
    records, got, want = _tp2_global()
    assert diff_report(got, want) == []
    assert written_once(records) == []
    # Every layer's q has heads*head_dim rows, k and v num_query_groups*head_dim rows.
    assert got["model.layers.0.self_attn.q_proj.weight"].shape == (job.HEADS * job.HEAD_DIM, job.HIDDEN)
    assert got["model.layers.0.self_attn.k_proj.weight"].shape == (job.GROUPS * job.HEAD_DIM, job.HIDDEN)
    # One piece per query group and part on each rank (2 groups per TP2 rank), tp_dim explicit.
    q = [r for r in records if r["name"] == "model.layers.1.self_attn.q_proj.weight"]
    assert len(q) == job.GROUPS and all(r["tp_dim"] == 0 for r in q)
    o = [r for r in records if r["name"] == "model.layers.1.self_attn.o_proj.weight"]
    assert len(o) == 2 and all(r["tp_dim"] == 1 for r in o)
    # Replicated norms: written by one TP rank.
    n = [r for r in records if r["name"] == "model.norm.weight"]
    assert sorted((r["replica_count"], r["replica_index"]) for r in n) == [(2, 0), (2, 1)]


def test_megatron_mcore_names():
    res = run_ranks(2, _describe, "mcore", timeout=240)
    got = assemble([r for rr in res for r in rr["pieces"]], "model")
    assert "decoder.layers.1.self_attention.q_proj.bias" in got
    assert "decoder.layers.0.mlp.gate_proj.weight" in got
    want = job.reference_global([rr["local"] for rr in res])
    assert torch.equal(got["decoder.layers.1.self_attention.v_proj.weight"],
                       want["model.layers.1.self_attn.v_proj.weight"])
