"""Evaluators read a ckptfs checkpoint through its tp1_pp1 view with the real readers.

A tiny Llama (local LlamaConfig: hidden 64, 2 layers, 4 heads, 2 KV heads, vocab 128) is
trained 3 steps with FSDP2 on 2 gloo ranks and saved with ckptfs.save into a ckptfs mount.
Then, in the test process (HF_HUB_OFFLINE=1):
  * safetensors.safe_open(MNT/tp1_pp1/<step>/model.safetensors, "pt") -- the strict reference
    reader -- lists exactly the trainer's tensors, with the trainer's bytes;
  * transformers.AutoModelForCausalLM.from_pretrained(MNT/tp1_pp1/<step>) loads it, and its
    logits on a fixed input equal, exactly, the logits of a plain model holding the trainer's
    full state (same class, same dtype).
Untied and tied embeddings, float32 and bfloat16, and the same model under FSDP1
(use_orig_params, through ckptfs.fsdp1).
"""
from __future__ import annotations

import json
import os

import pytest
import torch

from conftest import run_ranks
from _h2_common import diff_report
import _h2_llama as L


def _train_and_save(rank, world, path, tie, dtype_name, wrap="fsdp2"):
    import ckptfs
    dtype = getattr(torch, dtype_name)
    cfg = L.config(tie=tie, dtype=dtype)
    if wrap == "fsdp2":
        m = L.fsdp2(L.model(cfg, seed=4), world)
    else:
        m = L.fsdp1(L.model(cfg, seed=4))
    opt = L.train(m, 3, rank)
    full = L.full_state(m) if wrap == "fsdp2" else L.fsdp1_full_state(m)
    h = ckptfs.save(path, {"model": m, "optimizer": opt, "extra_state": {"step": 3}})
    logits = L.logits_of(cfg, full) if rank == 0 else None
    h.wait()
    return {"full": full, "logits": logits} if rank == 0 else None


@pytest.mark.parametrize("tie,dtype_name,wrap", [(False, "float32", "fsdp2"),
                                                 (True, "float32", "fsdp2"),
                                                 (False, "bfloat16", "fsdp2"),
                                                 (False, "float32", "fsdp1")])
def test_tp1_view_loads_in_transformers_and_safe_open(ckptfs_mount, tie, dtype_name, wrap):
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    step = ckptfs_mount.mnt / "run" / "step3"
    step.parent.mkdir()
    res = run_ranks(2, _train_and_save, str(step), tie, dtype_name, wrap, timeout=300)[0]
    full, want_logits = res["full"], res["logits"]
    view = ckptfs_mount.mnt / "tp1_pp1" / "run" / "step3"

    # config.json is in the view, and names the model's own class.
    cfg = json.loads((view / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    assert cfg.get("architectures") == ["LlamaForCausalLM"], cfg.get("architectures")

    # The strict reference reader: exactly the trainer's tensors and bytes.
    from safetensors import safe_open
    with safe_open(str(view / "model.safetensors"), "pt") as f:
        got = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata()
    assert meta.get("format") == "pt"
    assert diff_report(got, full) == []

    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(str(view), local_files_only=True)
    assert type(m).__name__ == "LlamaForCausalLM"
    assert m.dtype == getattr(torch, dtype_name)
    m.eval()
    with torch.no_grad():
        logits = m(input_ids=L.fixed_input()).logits
    assert logits.dtype == want_logits.dtype
    assert torch.equal(logits, want_logits), (logits - want_logits).abs().max()
    # Every parameter from_pretrained built is the trainer's (nothing left at its init).
    sd = m.state_dict()
    assert diff_report({k: sd[k] for k in full}, full) == []
