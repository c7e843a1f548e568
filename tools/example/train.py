"""A small GPT-style (Llama) model trained with FSDP2 x tensor parallelism, checkpointed with
ckptfs.save, resumable on another number of processes with ckptfs.load.

Run with torchrun on the CPU (gloo), for example:

    torchrun --nproc-per-node 4 tools/example/train.py --ckpt-dir MNT/run --steps 8 --save-every 4 \
        --losses losses_4.json
    torchrun --nproc-per-node 2 tools/example/train.py --ckpt-dir MNT/run --resume-from 4 --steps 8 \
        --losses losses_2.json

The mesh is (dp, tp) with tp = 2: 4 processes are 2-way FSDP x 2-way TP, 2 processes are 1 x 2.
The global batch of every step is the same whatever the process count: it is cut into 2 halves;
with dp = 2 each data-parallel rank takes one half, with dp = 1 the rank runs both halves as two
micro-batches and accumulates their gradients.  Each half's loss is scaled by 1/2 before backward
and two addends sum the same in either order, so the gradients, the optimizer steps and the
losses are bit-identical to the 4-process run: a job resumed on 2 processes continues exactly
where the 4-process job would have gone.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from transformers import LlamaConfig, LlamaForCausalLM

import ckptfs

HALVES = 2          # the global batch is always cut into this many halves
HALF_BATCH = 4      # sequences per half
SEQ = 32


def model_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=SEQ, tie_word_embeddings=False,
                       torch_dtype="float32", attn_implementation="eager")


def batch(step: int, half: int) -> torch.Tensor:
    """The tokens of one half of the global batch of a step: the same on every layout."""
    g = torch.Generator().manual_seed(1000 * step + half)
    # A learnable pattern: each sequence counts up from a random start, modulo the vocabulary.
    start = torch.randint(0, 256, (HALF_BATCH, 1), generator=g)
    return (start + torch.arange(SEQ)) % 256


def build(world: int):
    tp = 2
    dp = world // tp
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = LlamaForCausalLM(model_config())
    plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel()}
    for layer in model.model.layers:
        parallelize_module(layer, mesh["tp"], plan)
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, foreach=False)
    return mesh, model, opt


def eval_batch() -> torch.Tensor:
    return batch(0, 99)


@torch.no_grad()
def eval_loss(model) -> float:
    tokens = eval_batch()
    return model(input_ids=tokens, labels=tokens).loss.item()


def train_step(step: int, mesh, model, opt) -> float:
    dp_rank, dp = mesh["dp"].get_local_rank(), mesh["dp"].size()
    halves = [h for h in range(HALVES) if h % dp == dp_rank]
    total = torch.zeros(())
    for i, h in enumerate(halves):
        if dp == 1:
            model.set_requires_gradient_sync(i == len(halves) - 1)
        tokens = batch(step, h)
        loss = model(input_ids=tokens, labels=tokens).loss
        (loss / HALVES * dp).backward()  # dp = 2: FSDP averages two halves; dp = 1: sum halves/2
        total += loss.detach()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if dp > 1:
        dist.all_reduce(total, group=mesh["dp"].get_group())
    return (total / HALVES).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt-dir", required=True, help="checkpoints go to DIR/step_N")
    ap.add_argument("--steps", type=int, default=8, help="train until this step")
    ap.add_argument("--save-every", type=int, default=4)
    ap.add_argument("--resume-from", type=int, default=0, help="load DIR/step_N first")
    ap.add_argument("--losses", help="rank 0 writes {step: loss} here, and the evaluation loss "
                    "of every saved step under 'eval'")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True)
    mesh, model, opt = build(world)
    state = {"model": model, "optimizer": opt, "extra_state": {"step": 0}}
    first = 1
    if args.resume_from:
        t = time.perf_counter()
        ckptfs.load(f"{args.ckpt_dir}/step_{args.resume_from}", state)
        first = state["extra_state"]["step"] + 1
        random.setstate(state["extra_state"]["python_rng"])
        if rank == 0:
            print(f"resumed from step {first - 1} on {world} processes "
                  f"in {time.perf_counter() - t:.2f} s", flush=True)
    losses, evals = {}, {}
    pending = None
    for step in range(first, args.steps + 1):
        loss = train_step(step, mesh, model, opt)
        losses[step] = loss
        if rank == 0:
            print(f"step {step}: loss {loss:.6f}", flush=True)
        if step % args.save_every == 0:
            if pending is not None:
                pending.wait()
            evals[step] = eval_loss(model)
            state["extra_state"] = {"step": step, "python_rng": random.getstate()}
            t = time.perf_counter()
            pending = ckptfs.save(f"{args.ckpt_dir}/step_{step}", state)
            if rank == 0:
                print(f"step {step}: checkpoint queued, training blocked "
                      f"{(time.perf_counter() - t) * 1e3:.1f} ms", flush=True)
    if pending is not None:
        pending.wait()
    if rank == 0 and args.losses:
        with open(args.losses, "w") as f:
            out = {str(k): v for k, v in losses.items()}
            out["eval"] = {str(k): v for k, v in evals.items()}
            json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
