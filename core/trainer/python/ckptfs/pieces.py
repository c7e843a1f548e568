"""The description of one rank's tensors that ckptfs.save writes and ckptfs.load fills.

Every framework adapter (plain tensors and DDP, DTensor from FSDP2 / tensor parallel, FSDP1 flat
parameters, Megatron-style explicit layouts, optimizer state) turns the objects it is given into
a list of Piece: one stored tensor of this rank and where it sits in a global tensor.  The same
list drives a save (the piece's data is snapshotted and written with its placement, docs/views.md
section 3) and a load (the piece's tensor is filled with exactly that box or flat range of the
global tensor, from whatever layout was saved).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch

Shape = Tuple[int, ...]


@dataclass
class Piece:
    group: str                      # file group: "model" or "optim"
    name: str                       # global tensor name, unique within its group
    tensor: torch.Tensor            # this rank's stored piece (saved from / loaded into)
    global_shape: Optional[Shape] = None   # None: the piece is the whole tensor
    offsets: Optional[Shape] = None        # box start in the global tensor (None: zeros)
    flat_range: Optional[Tuple[int, int]] = None  # piece is elements [a, b) of the flattened box
    box_shape: Optional[Shape] = None      # with flat_range: the box (None: global_shape)
    tp_dim: Optional[int] = None           # None: let the view infer; -1: replicated
    pp: Optional[Union[int, str]] = None   # layer index or "first"/"last"/"ends"/"all"
    replica_count: int = 1          # ranks that hold this same piece (same box / flat range)
    replica_index: int = 0          # this rank's position among them, 0 .. replica_count-1
    write: bool = True              # set by the writer rule: this rank writes the piece
    # Writer-rule class: replicated pieces with equal (replica_group, replica_count) are held
    # by the same holders on every holder (e.g. ("world", W) for DDP, the mesh and its
    # Replicate dims for a DTensor); None: one class per replica_count.
    replica_group: Optional[tuple] = None

    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()
