"""Crash mid-save: a rank SIGKILLed during its background write, and the daemon SIGKILLed
during a save.  The checkpoint being written never looks complete (PATH missing), the loader
refuses it with a clear message, and the previous checkpoint loads with its values."""
import errno
import os
import signal

import torch

import _dist_models as M
import ckptfs
from ckptfs import _api
from conftest import run_ranks


def _plain_state(seed):
    torch.manual_seed(seed)
    return {"w": torch.randn(64, 32), "b": torch.arange(100, dtype=torch.int64)}


def rank_dies(rank, world, base):
    model = M.make_net(3)
    ckptfs.save(os.path.join(base, "ck1"), {"model": model}, async_=False,
                commit_timeout_ms=4000)
    if rank == 0:
        torch.save(model.state_dict(), os.path.join(base, "ref1.pt"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    if rank == 1:
        _api._test_set_write_delay(5000)
    h = ckptfs.save(os.path.join(base, "ck2"), {"model": model}, commit_timeout_ms=4000)
    if rank == 1:
        # the snapshot is taken, the background writer has not written yet: die now
        os.kill(os.getpid(), signal.SIGKILL)
    err = h.exception()
    return None if err is None else (err.errno, str(err))


def _refused(path):
    try:
        ckptfs.load(path, {"model": M.make_net(9)})
    except ckptfs.CheckpointError as e:
        return e
    raise AssertionError(f"{path}: an incomplete checkpoint loaded")


def test_rank_killed_mid_save(tmp_path):
    res = run_ranks(2, rank_dies, str(tmp_path), expect_exit={1: -signal.SIGKILL}, timeout=120)
    err = res[0]
    assert err is not None, "rank 0's save succeeded although rank 1 died before its files"
    assert "ck2" in err[1], err
    assert not (tmp_path / "ck2").exists()
    assert (tmp_path / "ck2.partial").is_dir()
    e = _refused(tmp_path / "ck2")
    assert e.errno == errno.ENOENT and "ck2.partial" in str(e), str(e)
    model = M.make_net(9)
    ckptfs.load(tmp_path / "ck1", {"model": model})
    ref = torch.load(tmp_path / "ref1.pt")
    for k, v in model.state_dict().items():
        assert torch.equal(v, ref[k]), k


def daemon_dies(rank, world, mnt, pid, ref):
    sd = _plain_state(1)
    ckptfs.save(os.path.join(mnt, "ck1"), {"model": sd}, async_=False)
    torch.save(sd, ref)
    _api._test_set_write_delay(1500)
    h = ckptfs.save(os.path.join(mnt, "ck2"), {"model": _plain_state(2)})
    os.kill(pid, signal.SIGKILL)
    err = h.exception()
    return None if err is None else (err.errno, str(err))


def test_daemon_killed_mid_save(ckptfs_mount, tmp_path):
    m = ckptfs_mount
    ref = tmp_path / "ref.pt"
    res = run_ranks(1, daemon_dies, str(m.mnt), m.proc.pid, str(ref), timeout=120)
    assert res[0] is not None, "the save succeeded although the daemon was killed"
    assert "ck2" in res[0][1], res[0]
    m.kill()
    m.start()
    assert not (m.mnt / "ck2").exists()
    e = _refused(m.mnt / "ck2")
    assert "ck2" in str(e) and e.errno in (errno.ENOENT, errno.EBADMSG), str(e)
    assert (m.mnt / "ck2.partial").is_dir()
    assert e.errno == errno.ENOENT and "ck2.partial" in str(e), str(e)
    out = {k: torch.zeros_like(v) for k, v in torch.load(ref).items()}
    ckptfs.load(m.mnt / "ck1", {"model": out})
    for k, v in torch.load(ref).items():
        assert torch.equal(out[k], v), k
