"""ckptfs.fsdp1's descriptors against FSDP1's own consolidated state, without the library.

Every rank of an FSDP1 job (use_orig_params=True, nested units, uneven padded chunks) returns
its model and optimizer pieces; the test lays them into global tensors (tests/python/
_h2_common.assemble, the placement rules of docs/views.md section 3) and compares them
bit for bit with FSDP1's FULL_STATE_DICT and full optimizer state dict.  A second job fills a
freshly initialised FSDP1 model through its pieces and checks that FSDP1 then holds exactly
the reference: the pieces are the module's own storage, so a load can fill them in place.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from conftest import run_ranks
from _h2_common import assemble, bit_equal, diff_report, piece_record, written_once
import _h2_fsdp1 as job


def _save_side(rank, world, strategy="FULL_SHARD", ignore_head=False, mixed_ckpt=False):
    import ckptfs.fsdp1 as f1
    model = job.build_fsdp1(seed=1, strategy=strategy, ignore_head=ignore_head,
                            mixed_ckpt=mixed_ckpt)
    # FSDP1 does not reduce an ignored module's gradients: with the same data on every rank
    # its copies stay equal, as a job that syncs them itself keeps them.
    opt = job.train(model, 2, 0 if ignore_head else rank)
    mp = f1.model_pieces(model, "model")
    op = f1.optim_pieces(model, opt, "optim")
    # The core's writer rule (no communication) over these pieces' replica classes.
    from ckptfs._state import assign_writers
    assign_writers(mp + op, "one")
    # The model pieces are views of the FlatParameters' storage (no copy).
    flat_ptrs = {h.flat_param.untyped_storage().data_ptr()
                 for h in [m._handle for m in model.modules() if getattr(m, "_handle", None)]}
    for p in mp:
        if p.flat_range is not None:
            assert p.tensor.untyped_storage().data_ptr() in flat_ptrs, p.name
    empty = [p.name for p in mp if p.tensor.numel() == 0]
    sd, osd = job.full_state(model, opt)
    held = {p.name: p.flat_range for p in mp if p.flat_range is not None}
    return {"pieces": [piece_record(p) for p in mp + op], "sd": sd, "osd": osd,
            "held": held, "empty": empty}


def _fill_side(rank, world, ref_sd):
    """A fresh FSDP1 model filled through its pieces from the global reference tensors."""
    import ckptfs.fsdp1 as f1
    model = job.build_fsdp1(seed=7)
    with torch.no_grad():
        for p in f1.model_pieces(model, "model"):
            g = ref_sd[p.name]
            if p.flat_range is not None:
                a, b = p.flat_range
                p.tensor.copy_(g.reshape(-1)[a:b])
            else:
                p.tensor.copy_(g)
    sd, _ = job.full_state(model, None)
    return sd


def _check(world, strategy="FULL_SHARD", ignore_head=False, mixed_ckpt=False):
    res = run_ranks(world, _save_side, strategy, ignore_head, mixed_ckpt, timeout=240)
    records = [r for rr in res for r in rr["pieces"]]
    sd, osd = res[0]["sd"], res[0]["osd"]
    model = assemble(records, "model")
    optim = assemble(records, "optim")
    assert diff_report(model, sd) == []
    assert diff_report(optim, osd) == []
    assert all(bit_equal(model[k], sd[k]) for k in sd)
    assert written_once(records) == []
    # Adam moments are really sharded, the step is whole; buffers are whole and replicated.
    assert (strategy == "NO_SHARD") != any(r["flat_range"] is not None for r in records
                                           if ".exp_avg" in r["name"])
    assert all(r["flat_range"] is None and r["data"].dim() == 0
               for r in records if r["name"].endswith(".step"))
    assert "scale" in model and "scratch" not in model
    return res, sd


def test_fsdp1_pieces_3_ranks_uneven():
    res, sd = _check(3)
    # With 3 ranks some parameter lies in no part of some rank's chunk (then no piece there),
    # and some parameter is split between two ranks.
    names = set(sd) - {"scale"}
    held = [set(r["held"]) for r in res]
    assert any(names - h for h in held), "every rank holds part of every parameter"
    split = [n for n in names if sum(n in h for h in held) > 1]
    assert split, "no parameter is split across ranks"
    # The flat ranges of one parameter tile it exactly, in rank order.
    for n in split:
        ranges = [r["held"][n] for r in res if n in r["held"]]
        assert ranges[0][0] == 0 and ranges[-1][1] == sd[n].numel()
        assert all(x[1] == y[0] for x, y in zip(ranges, ranges[1:]))


def test_fsdp1_pieces_fill_in_place():
    res, sd = _check(2)
    filled = run_ranks(2, _fill_side, sd, timeout=240)
    for got in filled:
        assert diff_report(got, sd) == []


def test_fsdp1_pieces_shard_grad_op_and_no_shard():
    # SHARD_GRAD_OP keeps flat shards between steps; NO_SHARD keeps whole parameters, every
    # rank a replica (the writer rule then picks one writer per tensor).
    res, sd = _check(2, "SHARD_GRAD_OP")
    assert any(r["flat_range"] is not None for rr in res for r in rr["pieces"])
    res, sd = _check(2, "NO_SHARD")
    recs = [r for rr in res for r in rr["pieces"] if r["group"] == "model"]
    assert all(r["flat_range"] is None and r["replica_count"] == 2 for r in recs)


def test_fsdp1_pieces_hybrid_shard_4_ranks():
    # HYBRID_SHARD on 2 x 2: chunks are sharded within a pair of ranks and replicated across
    # pairs; each chunk's two copies are replicas (replica_count 2), written once.
    res, sd = _check(4, "HYBRID_SHARD")
    flat = [r for rr in res for r in rr["pieces"] if r["flat_range"] is not None]
    assert flat and all(r["replica_count"] == 2 for r in flat)


def test_fsdp1_pieces_ignored_module():
    # Parameters of an ignored module are plain whole tensors on every rank (and so is their
    # Adam state), beside the flat-sharded rest: replicas, written once.
    res, sd = _check(2, ignore_head=True)
    recs = [r for rr in res for r in rr["pieces"]]
    head = [r for r in recs if r["name"] in ("head.weight", "state.head.weight.exp_avg")]
    assert len(head) == 4 and all(r["flat_range"] is None and r["replica_count"] == 2
                                  for r in head)


def test_fsdp1_pieces_mixed_precision_and_activation_checkpointing():
    # bf16 compute keeps the sharded fp32 parameters as the state; the checkpoint wrapper's
    # prefix is not part of the names.
    res, sd = _check(2, mixed_ckpt=True)
    recs = [r for rr in res for r in rr["pieces"]]
    assert all("_checkpoint_wrapped_module" not in r["name"] for r in recs)
    assert {r["data"].dtype for r in recs if r["group"] == "model"} == {torch.float32}
    assert "blocks.1.lin1.weight" in sd
