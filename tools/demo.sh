#!/usr/bin/env bash
# Install, build, and run the ckptfs main job on a default local store:
# mount ./ckptfs-demo/mnt (store ./ckptfs-demo/store); save a sharded
# checkpoint series with plain writes and read it back through the views;
# run the trainer example (tools/example/run.sh: torchrun, FSDP2 x TP, async
# ckptfs.save, an evaluator on the consolidated view, a resume on fewer
# processes); show the store's accounting, unmount and fsck.
# Idempotent: each run starts a fresh demo.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
top=$PWD
demo=$top/ckptfs-demo
mnt=$demo/mnt
store=$demo/store

cleanup() {
	if mountpoint -q "$mnt" 2>/dev/null; then
		fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
	fi
}
cleanup
for _ in $(seq 50); do pgrep -f "ckptfs $store" >/dev/null || break; sleep 0.1; done
rm -rf "$demo"
mkdir -p "$mnt"
trap cleanup EXIT

echo "== mounting $store on $mnt"
"$top/fs/ckptfs" "$store" "$mnt"
echo "== main job: 3 training steps x (2 TP x 2 DP) safetensors shards, read back as saved"
echo "   and through the resharded views /tp1_pp1 (consolidated) and /tp4_pp2"
/usr/bin/python3 "$top/tools/demo_job.py" "$mnt"
echo "== trainer example (tools/example/run.sh)"
"$top/tools/example/run.sh" "$mnt" "$demo/example"
echo "== files"
ls -l "$mnt" "$mnt/step_0003" "$mnt/tp4_pp2/step_0003"
echo "== checkpoints in the store (ckpt ls)"
"$top/tools/ckpt" ls "$store"
echo "== store accounting (ckpt stat), once background compression has settled"
for _ in $(seq 150); do
	"$top/tools/ckpt" stat "$store" 2>/dev/null | grep -qx "compression_pending: 0" && break
	sleep 0.2
done
"$top/tools/ckpt" stat "$store"
echo "== what these numbers mean"
/usr/bin/python3 "$top/tools/demo_summary.py" --ckpt "$top/tools/ckpt" \
	--views tp1_pp1,tp4_pp2 --dir step_0003 "$mnt" "$store"
echo "== unmount and verify (ckpt fsck)"
fusermount3 -u "$mnt"
trap - EXIT
"$top/tools/ckpt" fsck "$store"
