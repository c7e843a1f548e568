"""FSDP1 -> FSDP2 through ckptfs: saved by an FSDP1 job (use_orig_params=True, nested units,
uneven padded chunks) into a ckptfs mount, loaded by FSDP2 on 2 ranks and by 1 process.

The saving job also gathers FSDP1's own FULL_STATE_DICT and full optimizer state dict and
writes them to a reference file (torch.save); the loading jobs gather their parameters and
Adam state (full_tensor) and must match it byte for byte.  The consolidated view
(MOUNT/tp1_pp1/<dir>/model.safetensors) is read with safetensors and must hold the same
weights.
"""
from __future__ import annotations

import os

import torch

from conftest import run_ranks
from _h2_common import diff_report
import _h2_fsdp1 as job


def _save(rank, world, path, ref_file):
    import ckptfs
    model = job.build_fsdp1(seed=1)
    opt = job.train(model, 2, rank)
    sd, osd = job.full_state(model, opt)
    h = ckptfs.save(path, {"model": model, "optimizer": opt, "extra_state": {"rank": rank}})
    if rank == 0:
        torch.save({"model": sd, "optim": osd}, ref_file)
    h.wait()
    return True


def _load(rank, world, path, ref_file, view):
    import ckptfs
    model = job.build_fsdp2(seed=50 + rank, world=world)
    opt = torch.optim.Adam(model.parameters(), lr=0.5)
    state = {"model": model, "optimizer": opt, "extra_state": {}}
    before, _ = job.gathered(model, opt)
    ckptfs.load(path, state, view=view)
    sd, osd = job.gathered(model, opt)
    ref = torch.load(ref_file)
    assert diff_report(before, ref["model"]) != [], "the fresh model already held the values"
    problems = diff_report(sd, ref["model"]) + diff_report(osd, ref["optim"])
    assert problems == [], problems
    assert opt.param_groups[0]["lr"] == 1e-2       # hyperparameters restored
    assert state["extra_state"] == {"rank": rank if rank < 4 else 0}
    # training goes on from the loaded state
    tok, tgt = job.batch(5, rank)
    torch.nn.functional.cross_entropy(model(tok).reshape(-1, job.Net.VOCAB),
                                      tgt.reshape(-1)).backward()
    opt.step()
    return True


def test_fsdp1_4_ranks_to_fsdp2_2_and_1(ckptfs_mount, tmp_path):
    path = str(ckptfs_mount.mnt / "fsdp1_step2")
    ref = str(tmp_path / "ref.pt")
    run_ranks(4, _save, path, ref, timeout=240)
    assert os.path.isdir(path)
    # On the mount, "auto" reads the consolidated view; "source" the FSDP1 ranks' own files
    # (flat ranges of the saved shards read into FSDP2's row boxes).
    for world, view in ((2, "auto"), (1, "source"), (2, "source")):
        run_ranks(world, _load, path, ref, view, timeout=240)
    # The consolidated view is a clean weights file with FSDP1's full weights.
    from safetensors import safe_open
    want = torch.load(ref)["model"]
    view = ckptfs_mount.mnt / "tp1_pp1" / "fsdp1_step2"
    with safe_open(str(view / "model.safetensors"), "pt") as f:
        got = {k: f.get_tensor(k) for k in f.keys()}
    assert diff_report(got, want) == []
    with safe_open(str(view / "optim.safetensors"), "pt") as f:
        assert any(k.endswith(".exp_avg") for k in f.keys())
