"""Resharded loads, bit-identical: FSDP2 saved on 4 ranks and loaded on 2, 3 (uneven) and 1
process; FSDP2 x TP2 (2-D mesh) loaded as TP1, TP4 and FSDP2 x TP2 on a transposed mesh;
HSDP (FSDP2 on a replicate x shard mesh) loaded on 1 process.
Adam moments, steps and param_groups survive; extra_state is per rank.  The FSDP2 checkpoint
lives on the ckptfs mount, the FSDP2 x TP2 one in a plain directory.

Every reference is gathered by the saving job itself (full_tensor() of every parameter and
optimizer state) and compared byte for byte with what the loading job gathers."""
import os

import pytest
import torch

import _dist_models as M
import ckptfs
from conftest import Mount, run_ranks


# ------------------------------------------------------------------------------- rank code

def save_4(rank, world, fsdp_dir, tp_dir, ref_dir):
    # FSDP2 on 4 ranks
    model = M.fsdp2(M.make_net(1))
    opt = M.make_optim(model)
    M.train(model, opt, 2, rank)
    ref = M.full_state(model, opt)
    h = ckptfs.save(fsdp_dir, {"model": model, "optimizer": opt,
                               "extra_state": {"rank": rank, "rng": torch.get_rng_state()}})
    if rank == 0:
        torch.save(ref, os.path.join(ref_dir, "fsdp2.pt"))
    h.wait()
    # one more step on the same batch on every rank: what a resumed job must reach
    M.train(model, opt, 1, 0, tp_same_input=True)
    nxt = M.full_state(model, None)["model"]
    if rank == 0:
        torch.save(nxt, os.path.join(ref_dir, "fsdp2_next.pt"))

    # FSDP2 (dp 2) x TP2 on a 2-D mesh
    mesh = M.mesh_2d(2, 2)
    model = M.fsdp2(M.tp(M.make_net(2), mesh["tp"]), mesh["dp"])
    opt = M.make_optim(model)
    M.train(model, opt, 2, mesh.get_coordinate()[0], tp_same_input=False)
    placements = {n: str(p.placements) for n, p in model.named_parameters()}
    ref = M.full_state(model, opt)
    ckptfs.save(tp_dir, {"model": model, "optimizer": opt, "extra_state": {"rank": rank}},
                async_=False)
    if rank == 0:
        torch.save(ref, os.path.join(ref_dir, "tp.pt"))

    # Two pipeline-like stages of 2 ranks, each an FSDP2 module of its own with its own plain
    # buffer: every stage's tensors must be written under replicas="one".
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    stage = mesh.get_coordinate()[0]
    m = torch.nn.Module()
    setattr(m, f"stage{stage}", torch.nn.Linear(4, 6))
    m.register_buffer(f"buf{stage}", torch.full((3,), float(stage)))
    from torch.distributed.fsdp import fully_shard
    fully_shard(m, mesh=mesh["dp"])
    ckptfs.save(os.path.join(ref_dir, "stages"), {"model": m}, async_=False)

    # HSDP: FSDP2 on a (replicate 2, shard 2) mesh: Replicate pieces, one writer each
    hmesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = M.fsdp2(M.make_net(4), hmesh)
    opt = M.make_optim(model)
    M.train(model, opt, 1, hmesh.get_coordinate()[1])
    placements["hsdp"] = str(model.up.weight.placements)
    ref = M.full_state(model, opt)
    ckptfs.save(os.path.join(ref_dir, "hsdp"), {"model": model, "optimizer": opt},
                async_=False)
    if rank == 0:
        torch.save(ref, os.path.join(ref_dir, "hsdp.pt"))
    return placements


def load_fsdp2(rank, world, fsdp_dir, ref_dir):
    """FSDP2 on `world` ranks (world 1: the plain model)."""
    model = M.make_net(100 + rank)
    if world > 1:
        model = M.fsdp2(model)
    opt = M.make_optim(model, lr=0.5)
    state = {"model": model, "optimizer": opt, "extra_state": {}}
    ckptfs.load(fsdp_dir, state)
    got = M.full_state(model, opt)
    ref = torch.load(os.path.join(ref_dir, "fsdp2.pt"))
    M.assert_same_state(ref, got, f"FSDP2 4 -> {world}")
    assert state["extra_state"]["rank"] == rank
    # Training goes on from the loaded values: FSDP's own buffers and Adam's state were
    # filled in place.  (Not bit-identical: the gradient reduction differs with the world.)
    M.train(model, opt, 1, 0, tp_same_input=True)
    nxt = torch.load(os.path.join(ref_dir, "fsdp2_next.pt"))
    got = M.full_state(model, None)["model"]
    for k, v in nxt.items():
        assert torch.allclose(v.float(), got[k].float(), rtol=1e-4, atol=1e-6), \
            f"{k}: the step after the load differs from the saving job's"
    return True


def load_on_1(rank, world, fsdp_dir, tp_dir, ref_dir):
    """One process, plain model: FSDP2 4 -> 1 and FSDP2 x TP2 -> TP1."""
    load_fsdp2(rank, world, fsdp_dir, ref_dir)
    model = M.make_net(8)
    opt = M.make_optim(model, lr=2.0)
    ckptfs.load(os.path.join(ref_dir, "hsdp"), {"model": model, "optimizer": opt})
    M.assert_same_state(torch.load(os.path.join(ref_dir, "hsdp.pt")), M.full_state(model, opt),
                        "HSDP 2x2 -> 1")
    return load_tp1(rank, world, tp_dir, ref_dir)


def load_tp1(rank, world, tp_dir, ref_dir):
    model = M.make_net(7)
    opt = M.make_optim(model, lr=3.0)
    state = {"model": model, "optimizer": opt, "extra_state": None}
    ckptfs.load(tp_dir, state)
    ref = torch.load(os.path.join(ref_dir, "tp.pt"))
    M.assert_same_state(ref, M.full_state(model, opt), "FSDP2xTP2 -> TP1")
    assert state["extra_state"] == {"rank": 0}
    return True


def load_tp4_and_2d(rank, world, tp_dir, ref_dir, mnt_tp_dir):
    from torch.distributed.device_mesh import init_device_mesh
    ref = torch.load(os.path.join(ref_dir, "tp.pt"))
    # TP4 on a 1-D mesh
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))
    model = M.tp(M.make_net(11), mesh)
    opt = M.make_optim(model, lr=0.1)
    ckptfs.load(tp_dir, {"model": model, "optimizer": opt})
    M.assert_same_state(ref, M.full_state(model, opt), "FSDP2xTP2 -> TP4")
    # FSDP2 x TP2 on a transposed mesh: every rank holds other pieces than the saver's
    mesh = M.mesh_2d(2, 2, transposed=True)
    model = M.fsdp2(M.tp(M.make_net(12), mesh["tp"]), mesh["dp"])
    opt = M.make_optim(model, lr=0.1)
    st = {"model": model, "optimizer": opt, "extra_state": {}}
    ckptfs.load(tp_dir, st)
    M.assert_same_state(ref, M.full_state(model, opt), "FSDP2xTP2 -> FSDP2xTP2 transposed")
    assert st["extra_state"] == {"rank": rank}
    # The same checkpoint copied onto the mount: a TP4 target reads the tp4 view
    model = M.tp(M.make_net(13), init_device_mesh("cpu", (4,), mesh_dim_names=("tp",)))
    from ckptfs import _api
    chosen = _api.source_dir(mnt_tp_dir, _api.describe({"model": model}))
    assert chosen.endswith(os.path.join("tp4_pp1", "tp_copy")), chosen
    ckptfs.load(mnt_tp_dir, {"model": model})
    got = M.full_state(model, None)
    for k, v in ref["model"].items():
        assert torch.equal(v, got["model"][k]), k
    return True


# ----------------------------------------------------------------------------------- tests

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    base = tmp_path_factory.mktemp("reshard")
    mount = Mount(base / "ckptfs")
    mount.start()
    try:
        ref = base / "ref"
        ref.mkdir()
        fsdp_dir = mount.mnt / "fsdp2_step2"
        tp_dir = base / "tp_step2"
        placements = run_ranks(4, save_4, str(fsdp_dir), str(tp_dir), str(ref), timeout=180)
        # the layouts are what the test means to cover
        assert "_StridedShard" in placements[0]["up.weight"]
        assert "Shard(dim=1)" in placements[0]["down.weight"]
        assert placements[0]["hsdp"].startswith("(Replicate(), Shard(dim=0))")
        yield {"mount": mount, "fsdp": str(fsdp_dir), "tp": str(tp_dir), "ref": str(ref)}
    finally:
        mount.stop()


@pytest.mark.parametrize("world", [2, 3])
def test_fsdp2_4_to_n(saved, world):
    run_ranks(world, load_fsdp2, saved["fsdp"], saved["ref"], timeout=180)


def test_fsdp2_4_to_1_and_tp_to_tp1(saved):
    run_ranks(1, load_on_1, saved["fsdp"], saved["tp"], saved["ref"], timeout=180)


def _names(path):
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        return set(f.keys())


def test_stages_all_written(saved):
    """Stages holding different tensors (pipeline-like): each is written by a rank of its own
    stage, none is lost to a writer that does not hold it."""
    d = os.path.join(saved["ref"], "stages")
    names = set()
    for r in range(4):
        f = os.path.join(d, f"model-rank{r:05d}.safetensors")
        if os.path.exists(f):
            names |= _names(f)
    assert names == {"stage0.weight", "stage0.bias", "buf0", "stage1.weight", "stage1.bias",
                     "buf1"}, names


def _pieces(d, r, group):
    """{name: ckptfs metadata entry} of one rank's file of a group ({} if none)."""
    import json
    import struct
    f = os.path.join(d, f"{group}-rank{r:05d}.safetensors")
    if not os.path.exists(f):
        return {}
    with open(f, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
    meta = json.loads(header["__metadata__"]["ckptfs"])
    return {k: meta["tensors"].get(k, {}) for k in header if k != "__metadata__"}


def test_hsdp_replicas_written_once(saved):
    d = os.path.join(saved["ref"], "hsdp")
    seen = {}
    for r in range(4):
        for group in ("model", "optim"):
            for name, e in _pieces(d, r, group).items():
                key = (group, name, tuple(e.get("offsets", ())))
                assert key not in seen, f"{key} written by ranks {seen[key]} and {r}"
                seen[key] = r
    assert ("model", "up.weight", (11, 0)) in seen
    assert len(set(seen.values())) == 4, "the writer rule left a rank idle"


def test_pieces_written_once(saved):
    """FSDP2 x TP2 with replicas="one": every (tensor, box) is in exactly one rank's file, and
    the tensors' explicit tp_dim is the TP mesh dimension's shard dim (-1 if replicated)."""
    import json
    import struct
    seen = {}
    for r in range(4):
        for group in ("model", "optim"):
            f = os.path.join(saved["tp"], f"{group}-rank{r:05d}.safetensors")
            with open(f, "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                header = json.loads(fh.read(n))
            meta = json.loads(header["__metadata__"]["ckptfs"])
            assert meta["version"] == 1 and meta["group"] == group
            for name in header:
                if name == "__metadata__":
                    continue
                e = meta["tensors"].get(name, {})
                key = (group, name, tuple(e.get("offsets", ())))
                assert key not in seen, f"{key} written by ranks {seen[key]} and {r}"
                seen[key] = r
                if group == "model" and name == "up.weight":
                    assert e["tp_dim"] == 0
                if group == "model" and name == "down.weight":
                    assert e["tp_dim"] == 1
                if group == "model" and name == "down.bias":
                    assert e["tp_dim"] == -1
                if name in ("state.up.weight.exp_avg", "state.up.weight.exp_avg_sq"):
                    assert e["tp_dim"] == 0 and e["global_shape"] == [22, 16], e
                if name == "state.down.weight.exp_avg":
                    assert e["tp_dim"] == 1 and e["global_shape"] == [13, 22], e
                if name.endswith(".step"):
                    assert "global_shape" not in e or e["global_shape"] == [], e
    for n in ("state.up.weight.exp_avg", "state.down.weight.exp_avg", "state.up.weight.step"):
        assert any(k[1] == n for k in seen), n
    # down.bias is replicated over tp (2 holders per dp shard): written once per box
    assert sum(1 for k in seen if k[:2] == ("model", "down.bias")) == 2
    assert len({seen[k] for k in seen}) == 4, "some rank wrote nothing"


def test_fsdp2_tp_to_tp4_and_transposed(saved):
    import shutil
    mnt_tp = saved["mount"].mnt / "tp_copy"
    shutil.copytree(saved["tp"], mnt_tp)
    run_ranks(4, load_tp4_and_2d, saved["tp"], saved["ref"], str(mnt_tp), timeout=180)
