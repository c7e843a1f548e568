#!/usr/bin/env bash
# The trainer-side example, end to end, on a mounted ckptfs (tools/demo.sh mounts one):
#   tools/example/run.sh MNT [WORKDIR]
# 1. torchrun, 4 CPU processes (gloo), a small Llama trained with 2-way FSDP2 x 2-way TP for
#    8 steps, an asynchronous ckptfs.save into MNT/example/step_N every 4 steps;
# 2. an evaluator loads MNT/tp1_pp1/example/step_8 with transformers.from_pretrained;
# 3. a job resumes from MNT/example/step_4 on 2 processes (1 x 2) and trains steps 5-8: its
#    losses must equal the 4-process run's bit for bit.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
mnt=${1:?usage: tools/example/run.sh MNT [WORKDIR]}
work=${2:-$(mktemp -d "${TMPDIR:-/tmp}/ckptfs-example.XXXXXX")}
py=$top/.venv/bin/python
[ -x "$py" ] || { echo "example: $py missing: run tools/setup.sh first" >&2; exit 1; }
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore
run=$mnt/example
rm -rf "$run" "$run".partial 2>/dev/null || true
mkdir -p "$run" "$work"
# A static rendezvous on the loopback address: --standalone names the host by its hostname,
# which a container or chroot may not resolve.
port() { "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
torchrun() {
	"$py" -m torch.distributed.run --nnodes 1 --master-addr 127.0.0.1 --master-port "$(port)" \
		--log-dir "$work/torchrun" --redirects 0:0 "$@"
}
quiet() { grep -v -E "^(W|I)[0-9]{4} |^\*+$|OMP_NUM_THREADS|^$" || true; }

echo "== example: 4 processes (FSDP2 2 x TP 2) train 8 steps, ckptfs.save every 4 into $run"
torchrun --nproc-per-node 4 "$top/tools/example/train.py" --ckpt-dir "$run" \
	--steps 8 --save-every 4 --losses "$work/losses_4.json" 2>&1 | quiet
ls -l "$run/step_8"
echo "== example: evaluator reads the consolidated view $mnt/tp1_pp1/example/step_8"
ls -l "$mnt/tp1_pp1/example/step_8"
"$py" "$top/tools/example/evaluate.py" "$mnt/tp1_pp1/example/step_8" \
	--losses "$work/losses_4.json" --step 8
echo "== example: resume from step_4 on 2 processes (FSDP2 1 x TP 2), train steps 5-8"
torchrun --nproc-per-node 2 "$top/tools/example/train.py" --ckpt-dir "$run" \
	--steps 8 --save-every 100 --resume-from 4 --losses "$work/losses_2.json" 2>&1 | quiet
"$py" - "$work/losses_4.json" "$work/losses_2.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
steps = sorted(k for k in b if k != "eval")
same = all(a[k] == b[k] for k in steps)
for k in steps:
    print(f"step {k}: 4 processes {a[k]:.9f}  resumed on 2 {b[k]:.9f}  {'same' if a[k] == b[k] else 'DIFFERENT'}")
if not same or not steps:
    sys.exit("example: FAIL: the resumed job's losses differ from the 4-process run's")
print(f"example: the job resumed on 2 processes continued exactly: steps {steps[0]}-{steps[-1]} bit-identical")
PY
