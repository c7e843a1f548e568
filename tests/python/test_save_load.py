"""ckptfs.save / ckptfs.load in one process: round trips on a plain directory and on the mount,
dtypes, the async handle, back-pressure, refused and failed checkpoints, the writer rule."""
import errno
import json
import os
import shutil

import pytest
import torch

import ckptfs
from ckptfs import _api, _state
from ckptfs.pieces import Piece


def _state_dict():
    g = torch.Generator().manual_seed(1)
    return {
        "w32": torch.randn(33, 17, generator=g),
        "bf16": torch.randn(7, 5, 3, generator=g).to(torch.bfloat16),
        "i64": torch.randint(-2**62, 2**62, (11,), generator=g, dtype=torch.int64),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.empty(0, 4),
        "nested": {"a": torch.arange(10, dtype=torch.int32)},
    }


def _zeros_like(sd):
    return {k: _zeros_like(v) if isinstance(v, dict) else torch.zeros_like(v)
            for k, v in sd.items()}


def _assert_identical(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            _assert_identical(a[k], b[k])
            continue
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        # bit-identical: compare raw bytes
        assert torch.equal(a[k].view(-1).view(torch.uint8) if a[k].numel() else a[k],
                           b[k].view(-1).view(torch.uint8) if b[k].numel() else b[k]), k


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.register_buffer("steps", torch.tensor([7], dtype=torch.int64))


@pytest.fixture(autouse=True)
def _fresh_saver():
    ckptfs.configure(pool_bytes=None, io_threads=None, backpressure="wait", write_bytes=None,
                     commit_timeout_ms=None, wait_commit=True)
    yield
    ckptfs.shutdown()


@pytest.fixture(params=["plain", "mount"])
def where(request, tmp_path):
    if request.param == "plain":
        yield tmp_path
    else:
        yield request.getfixturevalue("ckptfs_mount").mnt


def test_round_trip_dtypes(where):
    sd = _state_dict()
    model = Tiny()
    h = ckptfs.save(where / "ck", {"model": sd, "net": model, "extra_state": {"it": 5}})
    h.wait()
    assert h.done() and h.exception() is None
    assert (where / "ck").is_dir() and not (where / "ck.partial").exists()
    names = sorted(os.listdir(where / "ck"))
    assert "ckptfs-checkpoint.json" in names and "extra_state-rank00000.pkl" in names
    assert "model-rank00000.safetensors" in names and "net-rank00000.safetensors" in names

    out = _zeros_like(sd)
    model2 = Tiny()
    with torch.no_grad():
        for p in model2.parameters():
            p.zero_()
        model2.steps.zero_()
    st = {"model": out, "net": model2, "extra_state": {}}
    ckptfs.load(where / "ck", st)
    _assert_identical(sd, out)
    _assert_identical(model.state_dict(), model2.state_dict())
    assert st["extra_state"] == {"it": 5}


def test_tp1_view_and_safetensors(ckptfs_mount):
    """A world-1 save on the mount: the consolidated view holds a clean weights file that the
    reference reader opens, with the saved values; the load through every directory choice
    gives the same bytes."""
    from safetensors import safe_open
    sd = _state_dict()
    del sd["empty"]
    ckptfs.save(ckptfs_mount.mnt / "ck", {"model": sd}, async_=False)
    view = ckptfs_mount.mnt / "tp1_pp1" / "ck"
    assert "model.safetensors" in os.listdir(view)
    with safe_open(str(view / "model.safetensors"), "pt") as f:
        assert sorted(f.keys()) == sorted(["w32", "bf16", "i64", "scalar", "nested.a"])
        assert torch.equal(f.get_tensor("w32"), sd["w32"])
        assert torch.equal(f.get_tensor("nested.a"), sd["nested"]["a"])
    for choice in ("source", "consolidated", "tp", "auto"):
        out = _zeros_like(sd)
        ckptfs.load(ckptfs_mount.mnt / "ck", {"model": out}, view=choice)
        _assert_identical(sd, out)


def test_async_snapshot(tmp_path):
    """save returns once the tensors are snapshotted, before the checkpoint is durable; the
    caller may then modify them and the saved values are the old ones."""
    sd = {"a": torch.arange(1000, dtype=torch.float32), "b": torch.ones(3, 3)}
    ref = {k: v.clone() for k, v in sd.items()}
    _api._test_set_write_delay(400)
    h = ckptfs.save(tmp_path / "ck", {"model": sd})
    assert not h.done()
    assert not (tmp_path / "ck").exists()
    for v in sd.values():
        v.fill_(-1)
    with pytest.raises(TimeoutError):
        h.wait(timeout=0.05)
    h.wait()
    assert h.done() and (tmp_path / "ck").is_dir()
    out = _zeros_like(ref)
    ckptfs.load(tmp_path / "ck", {"model": out})
    _assert_identical(ref, out)
    # the pool was reused: a second save leaves the populated size unchanged
    pool = ckptfs.saver_pool_bytes()
    assert pool > 0
    ckptfs.save(tmp_path / "ck2", {"model": ref}, async_=False)
    assert ckptfs.saver_pool_bytes() == pool


def test_backpressure(tmp_path):
    sd = {"a": torch.arange(100, dtype=torch.float32)}
    ckptfs.configure(backpressure="fail")
    _api._test_set_write_delay(500)
    h1 = ckptfs.save(tmp_path / "ck1", {"model": sd})
    with pytest.raises(ckptfs.CheckpointError) as ei:
        ckptfs.save(tmp_path / "ck2", {"model": sd})
    assert ei.value.errno == errno.EBUSY
    assert "ck1" in str(ei.value), str(ei.value)
    h1.wait()
    assert (tmp_path / "ck1").is_dir() and not (tmp_path / "ck2").exists()
    ckptfs.save(tmp_path / "ck2", {"model": sd}, async_=False)
    assert (tmp_path / "ck2").is_dir()

    # "wait": the second save waits for the first one; both complete
    ckptfs.configure(backpressure="wait")
    _api._test_set_write_delay(300)
    h3 = ckptfs.save(tmp_path / "ck3", {"model": sd})
    h4 = ckptfs.save(tmp_path / "ck4", {"model": sd})
    assert h3.done()
    h4.wait()
    h3.wait()
    for n in ("ck3", "ck4"):
        out = {"a": torch.zeros(100)}
        ckptfs.load(tmp_path / n, {"model": out})
        assert torch.equal(out["a"], sd["a"])


def test_save_errors(tmp_path):
    sd = {"a": torch.ones(4)}
    ckptfs.save(tmp_path / "ck", {"model": sd}, async_=False)
    with pytest.raises(ckptfs.CheckpointError) as ei:
        ckptfs.save(tmp_path / "ck", {"model": sd}, async_=False)
    assert ei.value.errno == errno.EEXIST and "ck" in str(ei.value)
    with pytest.raises(ckptfs.CheckpointError) as ei:
        h = ckptfs.save(tmp_path / "no" / "such" / "ck", {"model": sd})
        h.wait()
    assert "no/such" in str(ei.value), str(ei.value)
    with pytest.raises(ckptfs.CheckpointError) as ei:
        ckptfs.save(tmp_path / "big", {"model": {"a": torch.ones(1 << 18)}}, pool_bytes=65536)
    assert ei.value.errno == errno.EFBIG and "big" in str(ei.value), str(ei.value)
    assert not (tmp_path / "big").exists()
    # the same path again, with a pool that fits (a new saver): the retry completes
    ckptfs.save(tmp_path / "big", {"model": {"a": torch.ones(1 << 18)}}, pool_bytes=1 << 24,
                async_=False)
    out = {"a": torch.zeros(1 << 18)}
    ckptfs.load(tmp_path / "big", {"model": out})
    assert torch.equal(out["a"], torch.ones(1 << 18))
    with pytest.raises(TypeError, match="extra_state"):
        ckptfs.save(tmp_path / "ck3", {"model": {"a": "not a tensor"}})
    with pytest.raises(ValueError, match="replicas"):
        ckptfs.save(tmp_path / "ck4", {"model": sd}, replicas="some")


def test_incomplete_refused(tmp_path):
    sd = {"a": torch.arange(8, dtype=torch.float32)}
    ckptfs.save(tmp_path / "ck", {"model": sd}, async_=False)
    # a directory without the completion marker
    shutil.copytree(tmp_path / "ck", tmp_path / "nomarker")
    os.unlink(tmp_path / "nomarker" / "ckptfs-checkpoint.json")
    with pytest.raises(ckptfs.CheckpointError) as ei:
        ckptfs.load(tmp_path / "nomarker", {"model": {"a": torch.zeros(8)}})
    assert ei.value.errno == errno.EBADMSG
    assert "nomarker" in str(ei.value) and "incomplete" in str(ei.value)
    # PATH missing, PATH.partial present: a save that never finished
    os.rename(tmp_path / "nomarker", tmp_path / "half.partial")
    with pytest.raises(ckptfs.CheckpointError) as ei:
        ckptfs.load(tmp_path / "half", {"model": {"a": torch.zeros(8)}})
    assert ei.value.errno == errno.ENOENT
    assert "half" in str(ei.value) and "incomplete" in str(ei.value)
    # a tensor the checkpoint lacks, and a dtype that differs
    with pytest.raises(ckptfs.CheckpointError, match="'b'"):
        ckptfs.load(tmp_path / "ck", {"model": {"a": torch.zeros(8), "b": torch.zeros(1)}})
    out = {"a": torch.zeros(8), "b": torch.zeros(1)}
    ckptfs.load(tmp_path / "ck", {"model": out}, strict=False)
    assert torch.equal(out["a"], sd["a"]) and torch.equal(out["b"], torch.zeros(1))
    with pytest.raises(ckptfs.CheckpointError, match="a"):
        ckptfs.load(tmp_path / "ck", {"model": {"a": torch.zeros(8, dtype=torch.float64)}})


def test_optimizer_world1(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW([{"params": model[0].parameters(), "lr": 0.01},
                             {"params": model[2].parameters(), "lr": 0.002,
                              "weight_decay": 0.3}], betas=(0.8, 0.95))
    for _ in range(2):
        model(torch.randn(3, 5)).sum().backward()
        opt.step()
        opt.zero_grad()
    ckptfs.save(tmp_path / "ck", {"model": model, "optimizer": opt}, async_=False)
    marker = json.loads((tmp_path / "ck" / "ckptfs-checkpoint.json").read_text())
    groups = marker["extra"]["optimizer"]["param_groups"]
    assert groups[0]["params"] == ["0.weight", "0.bias"] and groups[1]["lr"] == 0.002

    model2 = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    opt2 = torch.optim.AdamW([{"params": model2[0].parameters(), "lr": 1.0},
                              {"params": model2[2].parameters(), "lr": 1.0}])
    assert not opt2.state
    ckptfs.load(tmp_path / "ck", {"model": model2, "optimizer": opt2})
    _assert_identical(model.state_dict(), model2.state_dict())
    s1, s2 = opt.state_dict(), opt2.state_dict()
    for i in s1["state"]:
        for k in s1["state"][i]:
            assert torch.equal(s1["state"][i][k], s2["state"][i][k]), (i, k)
    for g1, g2 in zip(s1["param_groups"], s2["param_groups"]):
        assert g1 == g2
    # both continue identically
    x = torch.randn(3, 5)
    for m, o in ((model, opt), (model2, opt2)):
        m(x).sum().backward()
        o.step()
    _assert_identical(model.state_dict(), model2.state_dict())


def test_optimizer_state_names(tmp_path):
    """Wrapper segments are removed from names: a torch.compile wrapper and a DDP-like prefix
    give the unwrapped model's names."""
    assert _state.clean_fqn("_orig_mod.layers.0._fsdp_wrapped_module.w") == "layers.0.w"
    assert _state.clean_fqn("a._checkpoint_wrapped_module.b") == "a.b"
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    g = _api.describe({"model": model, "optimizer": opt})
    assert [p.name for p in g["model"]] == ["weight", "bias"]
    assert sorted(p.name for p in g["optim"]) == [
        "state.bias.exp_avg", "state.bias.exp_avg_sq", "state.bias.step",
        "state.weight.exp_avg", "state.weight.exp_avg_sq", "state.weight.step"]


def _holders(count, sizes, key=("k",)):
    """The pieces of every holder index of a replicated class."""
    out = []
    for idx in range(count):
        ps = [Piece("model", f"t{i}", torch.empty(n, dtype=torch.uint8), replica_count=count,
                    replica_index=idx, replica_group=key) for i, n in enumerate(sizes)]
        _state.assign_writers(ps, "one")
        out.append(ps)
    return out


def test_writer_rule_one():
    sizes = [100, 7, 300, 5, 5, 64, 1, 0, 250, 90]
    for count in (1, 2, 3, 4):
        holders = _holders(count, sizes)
        for i in range(len(sizes)):
            writers = [h for h in range(count) if holders[h][i].write]
            assert len(writers) == 1, (count, i, writers)
        loads = [sum(p.nbytes() for p in ps if p.write) for ps in holders]
        # LPT: the heaviest holder carries at most the average plus the largest piece
        assert max(loads) <= sum(sizes) / count + max(sizes)
    # "all": every holder writes
    ps = [Piece("model", "x", torch.empty(3), replica_count=2, replica_index=1)]
    _state.assign_writers(ps, "all")
    assert ps[0].write
    # an adapter's own choice on an unreplicated piece is kept
    ps = [Piece("model", "x", torch.empty(3), write=False)]
    _state.assign_writers(ps, "one")
    assert not ps[0].write


def test_hf_config_and_view(ckptfs_mount):
    """A Hugging Face model: rank 0 writes config.json, so the consolidated view of the
    checkpoint loads with from_pretrained and gives the trainer's logits."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    ckptfs.save(ckptfs_mount.mnt / "hf", {"model": model}, async_=False)
    view = ckptfs_mount.mnt / "tp1_pp1" / "hf"
    assert json.loads((view / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    loaded = LlamaForCausalLM.from_pretrained(str(view)).eval()
    x = torch.arange(10).reshape(1, 10)
    with torch.no_grad():
        assert torch.equal(model(x).logits, loaded(x).logits)


def test_library_not_found(tmp_path):
    """$CKPTFS_LIBRARY naming a missing file: ImportError naming it (no silent fallback)."""
    import subprocess
    import sys
    from conftest import PYPKG
    env = dict(os.environ, CKPTFS_LIBRARY=str(tmp_path / "nolib.so"),
               PYTHONPATH=str(PYPKG))
    r = subprocess.run([sys.executable, "-c", "import ckptfs"], env=env, capture_output=True,
                       text=True)
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "nolib.so" in r.stderr and "CKPTFS_LIBRARY" in r.stderr


def test_exit_finishes_save(tmp_path):
    """A process that returns right after save() (still writing) leaves a complete checkpoint:
    the save in flight is finished at interpreter exit."""
    import subprocess
    import sys
    from conftest import PYPKG
    code = ("import ckptfs, torch\nfrom ckptfs import _api\n_api._test_set_write_delay(400)\n"
            f"h = ckptfs.save({str(tmp_path / 'ck')!r}, {{'model': {{'a': torch.arange(5.)}}}})\n"
            "assert not h.done()\n")
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(PYPKG)),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = {"a": torch.zeros(5)}
    ckptfs.load(tmp_path / "ck", {"model": out})
    assert torch.equal(out["a"], torch.arange(5.))
