"""The tiny Llama of the evaluator tests and of the view load-time measurement.

Built from a local LlamaConfig (no hub access), trained with FSDP2 (fully_shard per decoder
layer, then the root) on CPU gloo ranks.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

VOCAB = 128


def config(tie: bool = False, dtype=torch.float32, **over):
    from transformers import LlamaConfig
    kw = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
              max_position_embeddings=64, tie_word_embeddings=tie, dtype=dtype)
    kw.update(over)
    return LlamaConfig(**kw)


def model(cfg, seed: int):
    """A fresh model as transformers builds one of cfg.dtype (from_config with dtype keeps
    the rotary inv_freq buffer in float32, as from_pretrained does; .to(bf16) would not)."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=cfg.dtype)


def fsdp2(m, world: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (world,))
    for layer in m.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m


def fsdp1(m):
    """FSDP1 (use_orig_params) with one unit per decoder layer, on CPU."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    return FSDP(m, auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}),
                use_orig_params=True, device_id=torch.device("cpu"))


def fsdp1_full_state(m) -> dict:
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    with FSDP.state_dict_type(m, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=False, rank0_only=False)):
        return {k: v.detach().clone() for k, v in m.state_dict().items()}


def tokens(step: int, rank: int, batch: int = 2, seq: int = 12):
    g = torch.Generator().manual_seed(77 + 1000 * step + rank)
    return torch.randint(0, VOCAB, (batch, seq), generator=g)


def fixed_input():
    return torch.arange(24, dtype=torch.long).reshape(2, 12) * 5 % VOCAB


def train(m, steps: int, rank: int):
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    for s in range(steps):
        ids = tokens(s, rank)
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    return opt


def full_state(m) -> dict:
    """Whole tensors of every state_dict entry (full_tensor is a collective: all ranks)."""
    out = {}
    for k, v in m.state_dict().items():
        out[k] = (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
    return out


def logits_of(cfg, state: dict) -> torch.Tensor:
    """The trainer's logits: a plain (unsharded) model holding the trainer's full state."""
    m = model(cfg, seed=0)
    missing, unexpected = m.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert not [k for k in missing if "rotary" not in k], missing
    m.eval()
    with torch.no_grad():
        return m(input_ids=fixed_input()).logits.detach().clone()
