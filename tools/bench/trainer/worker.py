"""One rank of one trainer-benchmark run, started by tools/bench/trainer_bench.py with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set and one JSON argument:
    {"phase": "save" | "load" | "stored" | "floor", "method": NAME, "kind": "fsdp2" | "ddp",
     "hidden": H, "layers": L, "dir": PATH, "out": FILE_PREFIX, ...}
It writes FILE_PREFIX.r<rank>.json with its timings (seconds), its memory (bytes) and, on
failure, the exact error.  Phases:
    save    build the state, untimed warm-up saves (allocations, plan caches) each followed by a
            training step, then the timed save: stall = the save call, durable = until wait() returns
    load    build the target state (other values), drop the page cache, time the load
    stored  a state with half the layers frozen, saved at 3 steps with a training step between
    floor   one memcpy of the rank's bytes into warm memory, all ranks at once"""

import datetime
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import state as st  # noqa: E402


def now():
    return time.perf_counter()


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def _row_offset(t):
    """Global index of the first dim-0 row this rank holds of tensor t (a DTensor or plain)."""
    if not hasattr(t, "to_local"):
        return 0
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    _, off = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    return off[0] if off else 0


def checksums(model, opt, kind):
    """Per tensor, a fingerprint of the whole (global) tensor that a load must reproduce: the
    float64 sum over rows of (global row + 1) * sum |row| (a value at another row or missing
    changes it; zero-mean values do not cancel out)."""
    out = {}
    for n, p in model.named_parameters():
        ts = [("", p)]
        if p in opt.state:
            ts += [(".exp_avg", opt.state[p]["exp_avg"]), (".exp_avg_sq", opt.state[p]["exp_avg_sq"])]
        for suf, t in ts:
            loc = t.to_local() if hasattr(t, "to_local") else t
            loc = loc.detach().to(torch.float64).abs()
            rows = loc.reshape(loc.shape[0], -1).sum(dim=1) if loc.dim() else loc.reshape(1)
            w = torch.arange(1, rows.numel() + 1, dtype=torch.float64) + _row_offset(t)
            s = (rows * w).sum().reshape(1)
            if kind == "fsdp2":
                dist.all_reduce(s)
            out[n.replace("module.", "") + suf] = s.item()
    return out


def make_saver(method, model, opt, cfg):
    import peers
    kind = cfg["kind"]
    if method == "dcp":
        return peers.DcpSave(model, opt)
    if method == "dcp_async":
        return peers.DcpAsyncSave(model, opt)
    if method == "bcp":
        return peers.BcpSave(model, opt, kind)
    if method == "torch_save":
        return peers.TorchSave(model, opt, kind)
    if method.startswith("ckptfs"):
        import ckptfs_adapter
        return ckptfs_adapter.Saver(model, opt, cfg)
    raise ValueError(f"unknown method {method}")


def make_loader(method, cfg):
    import peers
    if method in ("dcp", "dcp_async"):
        return peers.dcp_load
    if method == "bcp":
        return peers.bcp_load(cfg["kind"])
    if method == "torch_save":
        return peers.torch_load
    if method.startswith("ckptfs"):
        import ckptfs_adapter
        return ckptfs_adapter.loader(cfg)
    raise ValueError(f"unknown method {method}")


def run(cfg, res):
    rank = dist.get_rank()
    kind, phase, method = cfg["kind"], cfg["phase"], cfg.get("method")
    frozen = phase == "stored"
    t = now()
    # a load target starts from zeros: a tensor the load misses keeps a zero fingerprint
    model, opt = st.build(kind, cfg["hidden"], cfg["layers"], frozen_half=frozen, seed=1,
                          zero=phase == "load")
    res["build_s"] = now() - t
    res["rank_bytes"] = st.rank_bytes(model, opt)
    dist.barrier()
    res["rss_base"] = st.peak_rss()
    res["hwm_reset"] = st.reset_peak_rss()
    if res["hwm_reset"]:
        res["rss_base"] = _rss()

    if phase == "floor":
        srcs = [x.detach().reshape(-1).view(torch.uint8) for x in st.local_tensors(model, opt)]
        dst = torch.empty(res["rank_bytes"], dtype=torch.uint8)
        dst.fill_(0)  # warm: every page faulted in before the timed copies
        times = []
        for _ in range(cfg.get("floor_reps", 3)):
            dist.barrier()
            t0 = now()
            off = 0
            for s in srcs:
                dst[off:off + s.numel()].copy_(s)
                off += s.numel()
            times.append(now() - t0)
            dist.barrier()
        res["memcpy"] = sorted(times)[len(times) // 2]
    elif phase == "save":
        # $TRAINER_BENCH_PROFILE=DIR: a cProfile of each rank's timed save call (and of its
        # load, below) in DIR
        saver = make_saver(method, model, opt, cfg)
        # untimed warm-up saves (allocations, plan and metadata caches, RPC set-up), each after
        # a training step as in a job that saves every N steps
        nwarm = cfg.get("warmups", 2)
        for i in range(nwarm):
            saver.save(os.path.join(cfg["dir"], f"warm{i}"), i + 1)
            saver.wait()
            st.train_step(model, opt, i + 1)
        res["sums"] = checksums(model, opt, kind)
        if rank == 0:
            os.sync()  # the warm-up's writeback does not land in the timed save
            if method.startswith("ckptfs"):
                # Nor the daemon's background compression of the warm-up saves (a job saves
                # every N minutes; the peers' equivalent is the writeback synced above).
                import ckptfs_adapter
                ckptfs_adapter.settle(cfg["ckpt"], cfg["store"], 120)
        dist.barrier()
        prof = None
        if os.environ.get("TRAINER_BENCH_PROFILE"):
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        t0 = now()
        saver.save(os.path.join(cfg["dir"], "ckpt"), nwarm + 1)
        t1 = now()
        if prof is not None:
            prof.disable()
            prof.dump_stats(os.path.join(os.environ["TRAINER_BENCH_PROFILE"],
                                         f"save-{method}-r{rank}.prof"))
        saver.wait()
        t2 = now()
        res["stall"], res["durable"] = t1 - t0, t2 - t0
        res["note"] = getattr(saver, "note", None)
    elif phase == "load":
        loader = make_loader(method, cfg)
        if rank == 0:
            drop_caches()
        dist.barrier()
        prof = None
        if os.environ.get("TRAINER_BENCH_PROFILE"):
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        t0 = now()
        loader(os.path.join(cfg["dir"], "ckpt"), model, opt)
        t1 = now()
        if prof is not None:
            prof.disable()
            prof.dump_stats(os.path.join(os.environ["TRAINER_BENCH_PROFILE"],
                                         f"load-{method}-r{rank}.prof"))
        dist.barrier()
        res["load_rank"] = t1 - t0
        res["load"] = now() - t0
        res["sums"] = checksums(model, opt, kind)
    elif phase == "stored":
        saver = make_saver(method, model, opt, cfg)
        for step in (1, 2, 3):
            saver.save(os.path.join(cfg["dir"], f"step{step}"), step)
            saver.wait()
            st.train_step(model, opt, step)
    else:
        raise ValueError(f"unknown phase {phase}")
    res["hwm"] = st.peak_rss()


def _rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    cfg = json.loads(sys.argv[1])
    rank = int(os.environ["RANK"])
    res = {"rank": rank}
    out = f"{cfg['out']}.r{rank}.json"
    ok = True
    try:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=cfg.get("timeout", 1800)))
        run(cfg, res)
    except BaseException as e:  # noqa: BLE001 - reported verbatim, the driver keeps going
        ok = False
        res["error"] = f"{type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()
    with open(out + ".tmp", "w") as f:
        json.dump(res, f)
    os.replace(out + ".tmp", out)
    if ok:
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
    sys.stdout.flush()
    # background writer threads of a failed peer must not keep the rank alive
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main()
