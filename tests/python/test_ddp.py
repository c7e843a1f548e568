"""DDP on 2 ranks: the writer rules "one" (each replicated tensor written by exactly one rank,
both ranks writing) and "all" (every rank writes everything) both round trip, on a plain
directory and on the mount; a DDP checkpoint loads into FSDP2 on 3 ranks (uneven), and the
third rank, which has no extra_state of its own in the checkpoint, gets rank 0's."""
import os

import pytest
import torch
from safetensors import safe_open

import _dist_models as M
import ckptfs
from conftest import Mount, run_ranks

CASES = [("plain", "one"), ("plain", "all"), ("mount", "one"), ("mount", "all")]


def save_ddp(rank, world, dirs, ref_path):
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(M.make_net(5))
    opt = M.make_optim(model.module)
    M.train(model, opt, 2, rank)
    ref = M.full_state(model, opt)
    if rank == 0:
        torch.save(ref, ref_path)
    handles = []
    for where, mode in CASES:
        handles.append(ckptfs.save(dirs[where + "_" + mode],
                                   {"model": model, "optimizer": opt,
                                    "extra_state": {"rank": rank}}, replicas=mode))
    for h in handles:
        h.wait()
    # a DTensor holding partial sums is refused, naming the tensor
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial
    mesh = init_device_mesh("cpu", (world,))
    part = DTensor.from_local(torch.ones(3), mesh, [Partial()])
    try:
        ckptfs.save(dirs["plain_one"] + "_partial", {"model": {"psum": part}})
    except ValueError as e:
        assert "psum" in str(e) and "Partial" in str(e), str(e)
    else:
        raise AssertionError("a Partial DTensor was saved")
    return True


def load_ddp(rank, world, dirs, ref_path):
    from torch.nn.parallel import DistributedDataParallel as DDP
    ref = torch.load(ref_path)
    for name, d in dirs.items():
        model = DDP(M.make_net(50 + rank))
        opt = M.make_optim(model.module, lr=1.0)
        st = {"model": model, "optimizer": opt, "extra_state": {}}
        ckptfs.load(d, st)
        M.assert_same_state(ref, M.full_state(model, opt), f"DDP {name}")
        assert st["extra_state"] == {"rank": rank}
    return True


def load_fsdp2_3(rank, world, d, ref_path):
    ref = torch.load(ref_path)
    model = M.fsdp2(M.make_net(70 + rank))
    opt = M.make_optim(model, lr=1.0)
    st = {"model": model, "optimizer": opt, "extra_state": {"mine": False}}
    ckptfs.load(d, st)
    M.assert_same_state(ref, M.full_state(model, opt), "DDP -> FSDP2 on 3")
    # rank 2 has no pickle of its own: it gets rank 0's
    assert st["extra_state"] == {"rank": rank if rank < 2 else 0}
    M.train(model, opt, 1, rank)
    return True


@pytest.fixture(scope="module")
def ddp_saved(tmp_path_factory):
    base = tmp_path_factory.mktemp("ddp")
    mount = Mount(base / "ckptfs")
    mount.start()
    try:
        dirs = {}
        for where, mode in CASES:
            root = base if where == "plain" else mount.mnt
            dirs[f"{where}_{mode}"] = str(root / f"ddp_{mode}")
        ref = str(base / "ref.pt")
        run_ranks(2, save_ddp, dirs, ref, timeout=120)
        yield dirs, ref
    finally:
        mount.stop()


def _tensors(path):
    with safe_open(path, "pt") as f:
        return {k: f.get_slice(k).get_shape() for k in f.keys()}


def test_writer_rules(ddp_saved):
    dirs, ref = ddp_saved
    names = set(torch.load(ref)["model"])
    for key, d in dirs.items():
        mode = key.split("_")[1]
        files = [_tensors(os.path.join(d, f"model-rank{r:05d}.safetensors")) for r in (0, 1)]
        if mode == "one":
            assert not set(files[0]) & set(files[1]), f"{key}: a tensor written twice"
            assert set(files[0]) | set(files[1]) == names, key
            assert files[0] and files[1], f"{key}: one rank wrote nothing (not balanced)"
        else:
            assert set(files[0]) == set(files[1]) == names, key
        for r in (0, 1):
            assert os.path.exists(os.path.join(d, f"extra_state-rank{r:05d}.pkl"))


def test_ddp_round_trip(ddp_saved):
    dirs, ref = ddp_saved
    run_ranks(2, load_ddp, dirs, ref, timeout=120)


def test_ddp_to_fsdp2_on_3(ddp_saved):
    dirs, ref = ddp_saved
    run_ranks(3, load_fsdp2_3, dirs["mount_one"], ref, timeout=120)
