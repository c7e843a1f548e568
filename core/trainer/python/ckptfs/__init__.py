"""ckptfs: asynchronous, resharding checkpoints for PyTorch jobs, over libckptfs (ctypes).

    handle = ckptfs.save(path, {"model": model, "optimizer": optim, "extra_state": {...}})
    ...                      # training continues: the tensors were snapshotted
    handle.wait()            # files durable and the checkpoint complete
    ckptfs.load(path, {"model": model, "optimizer": optim, "extra_state": {}})

The state's keys:
  "model"        an nn.Module (plain, DDP, FSDP2 fully_shard, tensor parallel
                 parallelize_module, FSDP1 through ckptfs.fsdp1) or a dict of tensors /
                 DTensors (a Megatron sharded_state_dict through ckptfs.megatron): group "model".
  "optimizer"    a torch.optim.Optimizer over the model's parameters: group "optim", tensors
                 "state.<param fqn>.<key>" sharded like their parameter (scalar step whole);
                 param_groups (parameters named by fqn) go in the completion marker's extra.
  "extra_state"  any picklable object, pickled per rank (extra_state-rankRRRRR.pkl).
  other keys     modules or tensor dicts, each its own group named by the key.
A Hugging Face PreTrainedModel as "model" also gets its config.json (written by rank 0), so
the checkpoint's tp1_pp1 view loads with transformers' from_pretrained.

Names are the unwrapped model's state_dict names (no `module.`, `_fsdp_wrapped_module.`,
`_checkpoint_wrapped_module.`, `_orig_mod.`).  Sharding is taken from the objects (see
ckptfs._state).  A save needs no collective planning: the only collective is one broadcast of
a random job id from rank 0 at the first save of each process group (cached after); the
ranks' done markers and rank 0's completion marker are the barrier.  Checkpoints load on any
layout: each rank reads only the boxes its target tensors cover.
"""
from ._lib import CheckpointError
from ._api import (Loader, SaveHandle, configure, describe, load, save, saver_pool_bytes,
                   saver_stats, shutdown)
from .pieces import Piece

__all__ = ["save", "load", "configure", "shutdown", "describe", "saver_stats",
           "saver_pool_bytes", "SaveHandle", "Loader", "CheckpointError", "Piece"]
__version__ = "0.1.0"
