"""The savers and loaders the trainer benchmark compares, each through its own public API.

Every saver is a class with
    save(path, step) -> None        returns when the training loop may modify parameters again
    wait() -> None                  returns when the checkpoint is durable and marked complete
and every loader a function load(path, model, opt) that returns when this rank holds its
tensors.  What "durable" adds for each peer is written beside it.  The driver
(tools/bench/trainer_bench.py) times these calls; nothing here times itself."""

import glob
import os
import threading

import torch
import torch.distributed as dist


def fsync_tree(path):
    """fsync every file under path, then every directory (bottom-up), so that names are durable."""
    for root, dirs, files in os.walk(path, topdown=False):
        for n in files:
            fd = os.open(os.path.join(root, n), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _model_opt_sd(model, opt):
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


# ------------------------------------------------------------------------------------- DCP


class DcpSave:
    """torch.distributed.checkpoint.save: blocking.  FileSystemWriter fsyncs every data file and
    .metadata before renaming .metadata.tmp into place (sync_files=True, its default); it does not
    fsync the directory, which wait() adds (rank 0, after the save's own final barrier)."""

    def __init__(self, model, opt):
        self.model, self.opt, self.path = model, opt, None

    def save(self, path, step):
        import torch.distributed.checkpoint as dcp
        dcp.save(_model_opt_sd(self.model, self.opt), checkpoint_id=path)
        self.path = path

    def wait(self):
        if dist.get_rank() == 0:
            fsync_dir(self.path)
        dist.barrier()


def _dcp_stager():
    """The staging DCP offers: a DefaultStager kept across saves, so that its CPU buffers are
    cached and reused.  Pinned memory is asked for; this torch's StateDictStager ignores it
    without CUDA (it warns and stages into plain CPU memory).  Returns (stager, note)."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    st = DefaultStager(StagingOptions(use_pinned_memory=True, use_shared_memory=False,
                                      use_async_staging=False, use_non_blocking_copy=False))
    pinned = getattr(getattr(st, "_state_dict_stager", None), "pin_memory", None)
    note = ("staging into pinned memory" if pinned else
            "staging into plain CPU memory: DCP's StateDictStager ignores pin_memory without "
            "CUDA ('Ignoring pin_memory flag for checkpoint staging as pinning memory requires "
            "CUDA, but CUDA is not available.')")
    return st, note


class DcpAsyncSave:
    """torch.distributed.checkpoint.async_save: returns once the state is staged into CPU
    buffers (a reused DefaultStager); a background thread then plans, writes and fsyncs as
    dcp.save does.  Durable: the future's result, then the directory fsync that DCP omits."""

    def __init__(self, model, opt):
        self.model, self.opt = model, opt
        self.stager, self.note = _dcp_stager()
        self.fut, self.path = None, None

    def save(self, path, step):
        import torch.distributed.checkpoint as dcp
        r = dcp.async_save(_model_opt_sd(self.model, self.opt), checkpoint_id=path,
                           async_stager=self.stager)
        self.fut = getattr(r, "upload_completion", r)
        self.path = path

    def wait(self):
        self.fut.result()
        dist.barrier()
        if dist.get_rank() == 0:
            fsync_dir(self.path)
        dist.barrier()


def dcp_load(path, model, opt):
    """dcp.load into the live tensors: get_state_dict returns the model's DTensor parameters
    and the optimizer's own state tensors, so the load fills them in place (set_state_dict
    would then run Optimizer.load_state_dict, which casts the fp32 moments to the bf16
    parameter dtype)."""
    import torch.distributed.checkpoint as dcp
    dcp.load(_model_opt_sd(model, opt), checkpoint_id=path)


# ---------------------------------------------------------------------------- ByteCheckpoint


class BcpSave:
    """bytecheckpoint.save(..., fast_saving=True): returns after its own staging; writer threads
    then write and fsync each file (use_fsync) and rank 0 writes the step's tracker file
    (latest_checkpointed_iteration.txt) once every rank reported success.  Durable: that tracker
    written (polled), then a directory fsync."""

    def __init__(self, model, opt, framework):
        self.model, self.opt, self.framework = model, opt, framework
        self.path, self.step, self.done = None, None, threading.Event()

    def save(self, path, step):
        import bytecheckpoint as bcp
        self.path, self.step = path, step
        self.done.clear()
        bcp.save(path, {"model": self.model, "optimizer": self.opt}, framework=self.framework,
                 fast_saving=True, global_steps=step, callback=lambda *a, **k: self.done.set())

    def wait(self):
        # the callback runs on the coordinator (rank 0) only, after the tracker is written
        if dist.get_rank() == 0:
            if not self.done.wait(timeout=1800):
                raise TimeoutError(f"bytecheckpoint: no completion callback for {self.path}")
            fsync_tree(self.path)
        dist.barrier()


def bcp_load(framework):
    def load(path, model, opt):
        import bytecheckpoint as bcp
        steps = sorted(glob.glob(os.path.join(path, "global_step_*")))
        src = steps[-1] if steps else path
        bcp.load(src, {"model": model, "optimizer": opt}, framework=framework,
                 fast_loading=True)
    return load


# ------------------------------------------------------------------------------ torch.save


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


class TorchSave:
    """torch.save of this rank's local tensors (FSDP2: its shards, with each tensor's global
    shape and dim-0 offset; DDP: rank 0 alone, the others hold the same bytes).  Blocking.
    Durable: fsync of the file and the directory, then a barrier and a marker file by rank 0."""

    def __init__(self, model, opt, kind):
        self.model, self.opt, self.kind, self.path = model, opt, kind, None

    def _state(self):
        out, meta = {}, {}
        names = {p: n for n, p in self.model.named_parameters()}
        for p, n in names.items():
            for key, t in [(n, p)] + [(f"{n}.{k}", self.opt.state[p][k])
                                      for k in ("exp_avg", "exp_avg_sq") if p in self.opt.state]:
                out[key] = _local(t).detach()
                if hasattr(t, "to_local"):
                    # fully_shard: Shard(0) with torch.chunk semantics
                    rows = t.shape[0]
                    per = -(-rows // dist.get_world_size())
                    meta[key] = (tuple(t.shape), min(rows, per * dist.get_rank()))
                else:
                    meta[key] = (tuple(t.shape), 0)
        return {"tensors": out, "meta": meta,
                "steps": {n: self.opt.state[p]["step"] for p, n in names.items()
                          if p in self.opt.state}}

    def save(self, path, step):
        self.path = path
        if dist.get_rank() == 0:
            os.makedirs(path, exist_ok=True)
        dist.barrier()
        if self.kind == "ddp" and dist.get_rank() != 0:
            return
        f = os.path.join(path, f"rank{dist.get_rank()}.pt")
        torch.save(self._state(), f)
        self._file = f

    def wait(self):
        if not (self.kind == "ddp" and dist.get_rank() != 0):
            fd = os.open(self._file, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        dist.barrier()
        if dist.get_rank() == 0:
            with open(os.path.join(self.path, "COMPLETE"), "w") as f:
                f.flush()
                os.fsync(f.fileno())
            fsync_dir(self.path)
        dist.barrier()


def torch_load(path, model, opt):
    """The hand-written reshard a torch.save user needs: every rank maps every old rank's file
    (mmap) and copies the rows of its new shard from the pieces that hold them."""
    files = sorted(glob.glob(os.path.join(path, "rank*.pt")))
    olds = [torch.load(f, mmap=True, weights_only=True) for f in files]
    names = {p: n for n, p in model.named_parameters()}
    ws, rank = dist.get_world_size(), dist.get_rank()
    with torch.no_grad():
        for p, n in names.items():
            for key, t in [(n, p)] + [(f"{n}.{k}", opt.state[p][k])
                                      for k in ("exp_avg", "exp_avg_sq") if p in opt.state]:
                dst = _local(t)
                if hasattr(t, "to_local"):
                    rows = t.shape[0]
                    per = -(-rows // ws)
                    lo = min(rows, per * rank)
                else:
                    lo = 0
                hi = lo + dst.shape[0]
                for o in olds:
                    src = o["tensors"][key]
                    _, off = o["meta"][key]
                    a, b = max(lo, off), min(hi, off + src.shape[0])
                    if a < b:
                        dst[a - lo:b - lo].copy_(src[a - off:b - off])
            if p in opt.state:
                opt.state[p]["step"].copy_(olds[0]["steps"][n])
