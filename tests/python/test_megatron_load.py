"""Megatron-core TP2 -> TP1 and TP4 through ckptfs, and the Llama-style consolidated view.

A TP2 GPTModel (4 query groups of 2 heads, QKV bias, SwiGLU) is saved with ckptfs.save from
ckptfs.megatron.state_dict(model) into a ckptfs mount; the test writes its own reference (the
ranks' raw local parameters, de-interleaved by _h2_mcore.reference_global, independent of
ckptfs.megatron).  TP1 (1 process) and TP4 (4 ranks) jobs load it with ckptfs.load and their
raw local parameters must equal the reference re-interleaved for their layout, bit for bit.
MOUNT/tp1_pp1/<dir>/model.safetensors must hold the de-interleaved global q/k/v and gate/up
tensors, and load strictly into a transformers LlamaForCausalLM of the same shape.
"""
from __future__ import annotations

import torch

from conftest import run_ranks
from _h2_common import diff_report
import _h2_mcore as job


def _save(rank, world, path, ref_file):
    import ckptfs
    import ckptfs.megatron as mg
    import torch.distributed as dist
    model, _ = job.build(world, seed=5)
    local = job.local_params(model)
    # A TP2 rank holds 2 query groups, i.e. 2 pieces of each of q, k, v: libckptfs writes
    # the second into the rank's part file model-rankRRRRR-1.safetensors.
    ckptfs.save(path, {"model": mg.state_dict(model)}, async_=False)
    locals_ = [None] * world
    dist.all_gather_object(locals_, local)
    if rank == 0:
        torch.save(job.reference_global(locals_), ref_file)
    job.finish()
    return True


def _load(rank, world, path, ref_file, view):
    import ckptfs
    import ckptfs.megatron as mg
    model, _ = job.build(world, seed=21)
    glob = torch.load(ref_file)
    want = job.reference_local(glob, world, rank)
    assert diff_report(job.local_params(model), want) != []
    # Per query group pieces (views of the fused local tensors), filled in place.
    ckptfs.load(path, {"model": mg.state_dict(model)}, view=view)
    problems = diff_report(job.local_params(model), want)
    job.finish()
    assert problems == [], problems
    return True


def test_megatron_tp2_to_tp1_tp4_and_llama_view(ckptfs_mount, tmp_path):
    path = ckptfs_mount.mnt / "mcore_tp2"
    ref = str(tmp_path / "ref.pt")
    run_ranks(2, _save, str(path), ref, timeout=240)
    # "source": the TP2 ranks' own files; "auto": on the mount, the consolidated view (the
    # Adam test below covers the other two combinations).
    run_ranks(1, _load, str(path), ref, "source", timeout=240)
    run_ranks(4, _load, str(path), ref, "auto", timeout=300)

    from safetensors import safe_open
    glob = torch.load(ref)
    view = ckptfs_mount.mnt / "tp1_pp1" / "mcore_tp2" / "model.safetensors"
    with safe_open(str(view), "pt") as f:
        got = {k: f.get_tensor(k) for k in f.keys()}
    assert diff_report(got, glob) == []
    q = got["model.layers.1.self_attn.q_proj.weight"]
    assert q.shape == (job.HEADS * job.HEAD_DIM, job.HIDDEN)

    # The view is a Llama checkpoint: every name and shape fits LlamaForCausalLM exactly.
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=job.HIDDEN, intermediate_size=job.FFN,
                      num_attention_heads=job.HEADS, num_key_value_heads=job.GROUPS,
                      head_dim=job.HEAD_DIM, num_hidden_layers=job.LAYERS,
                      vocab_size=job.VOCAB, attention_bias=True, tie_word_embeddings=False)
    llama = LlamaForCausalLM(cfg)
    # attention_bias also gives o_proj a bias, which Megatron's row-parallel linear_proj
    # (add_bias_linear=False) does not have: those are the only keys allowed to be missing.
    res = llama.load_state_dict(got, strict=False)
    assert res.unexpected_keys == []
    assert all(k.endswith("o_proj.bias") for k in res.missing_keys), res.missing_keys


def _save_pp(rank, world, path, ref_file):
    import ckptfs
    import ckptfs.megatron as mg
    import torch.distributed as dist
    model, _ = job.build(1, seed=9, pp=2)
    local = job.local_params(model)
    ckptfs.save(path, {"model": mg.state_dict(model)}, async_=False)
    stages = [None] * world
    dist.all_gather_object(stages, local)
    if rank == 0:
        torch.save(job.reference_global([job.merge_stages(stages)]), ref_file)
    job.finish()
    return True


def test_megatron_pp2_to_tp2(ckptfs_mount, tmp_path):
    """Pipeline stages number their layers locally; mcore's global offsets place them.  TP1 x
    PP2 saved, loaded as TP2 x PP1; the tp1_pp2 view puts layer 0 and the embedding on stage
    0, layer 1, the final norm and the output layer on stage 1."""
    path = ckptfs_mount.mnt / "mcore_pp2"
    ref = str(tmp_path / "ref.pt")
    run_ranks(2, _save_pp, str(path), ref, timeout=240)
    run_ranks(2, _load, str(path), ref, "source", timeout=240)
    from safetensors import safe_open
    view = ckptfs_mount.mnt / "tp1_pp2" / "mcore_pp2"
    names = []
    for stage in (0, 1):
        with safe_open(str(view / f"model_tp0_pp{stage}.safetensors"), "pt") as f:
            names.append(set(f.keys()))
    assert "model.embed_tokens.weight" in names[0] and "lm_head.weight" in names[1]
    assert "model.layers.0.self_attn.q_proj.weight" in names[0]
    assert "model.layers.1.mlp.up_proj.weight" in names[1] and "model.norm.weight" in names[1]
    assert not any(".layers.1." in n for n in names[0])


def _save_optim(rank, world, path, ref_file):
    import ckptfs
    import ckptfs.megatron as mg
    import torch.distributed as dist
    model, _ = job.build(world, seed=5)
    opt = job.adam_steps(model, 2, seed=1)
    sd = mg.state_dict(model)
    ckptfs.save(path, {"model": sd, "optim": mg.optimizer_state(sd, opt)}, async_=False)
    local = (job.local_params(model), job.optim_locals(model, opt))
    all_ = [None] * world
    dist.all_gather_object(all_, local)
    if rank == 0:
        ref = {"model": job.reference_global([a[0] for a in all_])}
        for key in ("exp_avg", "exp_avg_sq"):
            ref[key] = job.reference_global([a[1][key] for a in all_])
        steps = {a[1]["step"][n].item() for a in all_ for n in a[1]["step"]}
        assert steps == {2.0}, steps
        torch.save(ref, ref_file)
    job.finish()
    return True


def _load_optim(rank, world, path, ref_file, view):
    import ckptfs
    import ckptfs.megatron as mg
    model, _ = job.build(world, seed=23)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sd = mg.state_dict(model)
    ckptfs.load(path, {"model": sd, "optim": mg.optimizer_state(sd, opt)}, view=view)
    ref = torch.load(ref_file)
    got = job.optim_locals(model, opt)
    problems = diff_report(job.local_params(model), job.reference_local(ref["model"], world, rank))
    for key in ("exp_avg", "exp_avg_sq"):
        problems += [f"{key}: {x}" for x in
                     diff_report(got[key], job.reference_local(ref[key], world, rank))]
    problems += [f"step {n}: {v}" for n, v in got["step"].items() if v.item() != 2.0]
    job.finish()
    assert problems == [], problems
    return True


def test_megatron_adam_tp2_to_tp1_tp4(ckptfs_mount, tmp_path):
    """torch Adam over a TP2 megatron model: moments sharded like their (fused) parameters,
    steps whole; loaded by TP1 and TP4 with a fresh Adam, bit-identical."""
    path = ckptfs_mount.mnt / "mcore_adam"
    ref = str(tmp_path / "ref.pt")
    run_ranks(2, _save_optim, str(path), ref, timeout=240)
    run_ranks(1, _load_optim, str(path), ref, "auto", timeout=240)
    run_ranks(4, _load_optim, str(path), ref, "source", timeout=300)
    from safetensors import safe_open
    view = ckptfs_mount.mnt / "tp1_pp1" / "mcore_adam" / "optim.safetensors"
    with safe_open(str(view), "pt") as f:
        keys = set(f.keys())
        got = f.get_tensor("state.model.layers.1.self_attn.k_proj.weight.exp_avg")
    assert "state.model.layers.0.self_attn.q_proj.weight.step" in keys
    assert "state.model.layers.0.self_attn.k_proj.weight.step" not in keys
    assert torch.equal(got, torch.load(ref)["exp_avg"]["model.layers.1.self_attn.k_proj.weight"])
