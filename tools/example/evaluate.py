"""An evaluator: loads a checkpoint saved by tools/example/train.py through the consolidated view
of a ckptfs mount with plain transformers (no ckptfs code, no torch.distributed), and checks its
loss on the trainer's evaluation batch against the loss the trainer logged for that step.

    python tools/example/evaluate.py MNT/tp1_pp1/run/step_8 --losses losses_4.json --step 8

The view directory holds config.json (written by ckptfs.save for a Hugging Face model) and one
model.safetensors built on read from the 4 ranks' shards.  The trainer computed its loss with
tensor-parallel matmuls (partial sums added in another order), so the two losses agree to
rounding, not bit for bit; the weights themselves are bit-identical (tests/python checks that).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import eval_batch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("view_dir", help="MOUNT/tp1_pp1/<checkpoint>")
    ap.add_argument("--losses", help="the trainer's losses file (its 'eval' entries)")
    ap.add_argument("--step", type=int, help="the step of view_dir, to compare with the trainer")
    args = ap.parse_args()
    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.view_dir, dtype=torch.float32)
    model.eval()
    load_s = time.perf_counter() - t
    tokens = eval_batch()
    with torch.no_grad():
        loss = model(input_ids=tokens, labels=tokens).loss.item()
    n = sum(p.numel() for p in model.parameters())
    print(f"evaluator: {args.view_dir}: {n} parameters loaded by transformers in {load_s:.2f} s, "
          f"eval loss {loss:.6f}")
    if args.losses and args.step:
        with open(args.losses) as f:
            want = json.load(f)["eval"][str(args.step)]
        diff = abs(loss - want)
        print(f"evaluator: trainer's eval loss at step {args.step}: {want:.6f} (difference {diff:.2e})")
        if diff > 1e-4 * max(1.0, abs(want)):
            print("evaluator: FAIL: the view's weights do not reproduce the trainer's loss",
                  file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
