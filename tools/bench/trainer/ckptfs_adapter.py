"""ckptfs.save / ckptfs.load as the trainer benchmark calls them (the same shape as the peers in
peers.py).  The checkpoint directory lies in a ckptfs mount the driver started.

save() returns once this rank's tensors are in the saver's pool (the library's snapshot), so
the training loop may modify them.  wait() returns when the rank's files are fsynced and rank
0's completion marker is written (SaveHandle.wait with wait_commit, the package's default);
a barrier then makes it the slowest rank's time, as for the peers."""

import os
import sys

import torch.distributed as dist

_TOP = None


def _import():
    # the editable install (tools/setup.sh) makes `import ckptfs` work; a tree without it still
    # runs the benchmark from its own checkout
    try:
        import ckptfs
    except ImportError:
        sys.path.insert(0, os.path.join(_TOP, "core", "trainer", "python"))
        import ckptfs
    return ckptfs


class Saver:
    def __init__(self, model, opt, cfg):
        global _TOP
        _TOP = cfg["top"]
        self.ckptfs = _import()
        self.model, self.opt, self.replicas = model, opt, cfg["replicas"]
        self.h = None
        self.note = f"replicas={self.replicas}"

    def save(self, path, step):
        self.h = self.ckptfs.save(path, {"model": self.model, "optimizer": self.opt},
                                  async_=True, replicas=self.replicas)

    def wait(self):
        self.h.wait()
        try:
            # the library's own split of the save: how much of the stall is its snapshot
            stats = self.ckptfs.saver_stats()
            self.note = (f"replicas={self.replicas}; rank {dist.get_rank()}'s last save: "
                         + ", ".join(f"{k} {v:.3f} s" if isinstance(v, float) else f"{k} {v}"
                                     for k, v in stats.items()))
        except Exception as e:  # noqa: BLE001 - diagnostics only
            self.note = f"replicas={self.replicas}; saver_stats: {e}"
        dist.barrier()


def loader(cfg):
    global _TOP
    _TOP = cfg["top"]

    view = cfg.get("ckptfs_view", "auto")

    def load(path, model, opt):
        _import().load(path, {"model": model, "optimizer": opt}, view=view)
    return load


def settle(ckpt, store, limit):
    """Waits (at most `limit` s) until the mounted store has no background compression pending
    (`ckpt stat`, as tools/demo.sh does before reading its accounting); False on time-out."""
    import subprocess
    import time
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        r = subprocess.run([ckpt, "stat", store], capture_output=True, text=True)
        if r.returncode == 0 and "compression_pending: 0" in r.stdout.splitlines():
            return True
        time.sleep(0.1)
    return False
