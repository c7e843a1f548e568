#!/bin/bash
# Resharded views with broken sources: an incomplete checkpoint (one TP shard deleted), DP
# replicas that disagree, a dtype conflict and a global-shape conflict: the affected view files
# fail to open with EIO while the others open and match (expected state computed from the
# stored pieces by views_lib.py oracle); `ckpt check` names group, tensor and range and exits
# non-zero (0 on a healthy checkpoint); invalid layout names are ENOENT; files with a newer
# ckptfs version or invalid ckptfs metadata are not reshardable and do not break other groups.
# Per-rank shards written without sharding metadata (each TP rank's slice under the global
# name) are reported as such in the daemon log (at build and on open), by `ckpt check` and
# flagged by `ckpt ls`.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
need_py numpy

VL=$LIB_DIR/views_lib.py
LAYOUTS=tp1_pp1,tp2_pp2,tp4_pp1,tp3_pp2,tp2_pp4,tp8_pp1
export MNT WORK

vl() {
	"$PY" "$VL" "$@"
}

# vl_checks DESC CMD ARGS...: run "views_lib.py CMD ARGS..." and count its TAP lines as checks
vl_checks() {
	local desc=$1
	shift
	_py_tap "$desc" "$PY" "$VL" "$@" </dev/null
}

start_daemon || bail "mount $STORE"
ok "daemon mounted"

make() {
	vl make-sharded "$MNT/$1" "$WORK/spec_$1.json" "${@:2}" >"$WORK/make.out" 2>&1 ||
		{ indent "$WORK/make.out"; bail "save $1"; }
}
make healthy 1 2 2 2
make incomplete 1 2 2 2
rm -f "$MNT"/incomplete/model-tp1-pp0-dp[01].safetensors
make disagree 1 2 1 2
make dtype 1 2 2 1
make gshape 1 2 1 1
make future 1 1 1 1
make mixed 1 2 1 1
make mixedbad 1 2 1 1
vl make-naive "$MNT/naive" "$WORK/naive.json" 1 2 2 >"$WORK/make.out" 2>&1 ||
	{ indent "$WORK/make.out"; bail "save naive"; }
ok "saved the checkpoints"

py_checks "break the checkpoints" "$MNT" <<'EOF'
import json, os, sys
import numpy as np
import views_lib as vl
from helpers import malformed
mnt = sys.argv[1]
DIRS = ("healthy", "incomplete", "disagree", "dtype", "gshape", "future", "mixed", "mixedbad",
        "naive")

def flip_q(tensors, meta):
    for t in tensors:
        if t[0] == "model.layers.2.self_attn.q_proj.weight":
            a = np.frombuffer(t[3], np.uint16).reshape(t[2]).copy()
            a[3, 5] ^= 0x0101
            t[3] = a.tobytes()
vl.rewrite_file(os.path.join(mnt, "disagree/model-tp0-pp0-dp1.safetensors"), flip_q)

def to_bf16(tensors, meta):
    for t in tensors:
        if t[0] == "model.layers.4.mlp.gate_proj.weight":
            t[1] = "BF16"
vl.rewrite_file(os.path.join(mnt, "dtype/model-tp1-pp1-dp0.safetensors"), to_bf16)

def gshape(tensors, meta):
    meta["ckptfs"]["tensors"]["lm_head.weight"]["global_shape"] = [251, 64]
vl.rewrite_file(os.path.join(mnt, "gshape/model-tp1-pp0-dp0.safetensors"), gshape)

# the same tensors also saved as tp4 (other file names): overlapping pieces of different boxes
# (and different flat ranges) that agree, and in mixedbad disagree in one element each
for d in ("mixed", "mixedbad"):
    vl.save_sharded(os.path.join(mnt, d), 1, 4, 1, 2, group_prefix="b-")
def flip_k(tensors, meta):
    for t in tensors:
        if t[0] == "model.layers.3.self_attn.k_proj.weight":      # rows [4, 8) of 16
            a = np.frombuffer(t[3], np.uint16).reshape(t[2]).copy()
            a[1, 7] ^= 0x0001
            t[3] = a.tobytes()
vl.rewrite_file(os.path.join(mnt, "mixedbad/b-model-tp1-pp0-dp1.safetensors"), flip_k)
def flip_opt(tensors, meta):
    for t in tensors:
        if t[0] == "lm_head.weight.exp_avg":                     # flat half of rows [189, 250)
            a = np.frombuffer(t[3], np.float32).copy()
            a[5] = -a[5]
            t[3] = a.tobytes()
vl.rewrite_file(os.path.join(mnt, "mixedbad/b-optim-tp3-pp0-dp1.safetensors"), flip_opt)

# not reshardable: newer version, metadata that is not JSON, an entry naming no tensor
a = np.arange(12, dtype=np.float32).reshape(3, 4)
def meta(ck):
    return {"format": "pt", "ckptfs": ck if isinstance(ck, str) else json.dumps(ck)}
vl.write_file(os.path.join(mnt, "future/future.safetensors"),
              vl.st_bytes([("w", "F32", a)], meta({"version": 2, "group": "future"})))
vl.write_file(os.path.join(mnt, "future/notjson.safetensors"),
              vl.st_bytes([("w", "F32", a)], meta("{not json")))
vl.write_file(os.path.join(mnt, "future/badentry.safetensors"),
              vl.st_bytes([("w", "F32", a)], meta({"version": 1, "group": "badentry",
                                                    "tensors": {"nosuch": {"tp_dim": 0}}})))
malformed(os.path.join(mnt, "future/malformed"))
os.rename(os.path.join(mnt, "future/malformed/broken_json.safetensors"),
          os.path.join(mnt, "future/broken_json.safetensors"))
# what ckpt check must report, for after the unmount
probs = {d: vl.problems_of(os.path.join(mnt, d)) for d in DIRS}
json.dump(probs, open(os.path.join(os.environ["WORK"], "problems.json"), "w"))
for d, p in probs.items():
    print(f"# {d}: {len(p)} broken tensors {[x[1] + ' ' + x[2] for x in p[:3]]}")
print("ok - broke the checkpoints")
EOF

# ---------------------------------------------------------------- EIO where broken, exact elsewhere
for d in healthy incomplete disagree dtype gshape future mixed mixedbad naive; do
	vl_checks "views of $d" oracle "$MNT" "$LAYOUTS" "$d"
done

py_checks "explicit cases" "$MNT" <<'EOF'
import errno, os, sys
from helpers import tap, expect_errno
mnt = sys.argv[1]
def rd(rel):
    with open(os.path.join(mnt, rel), "rb") as f:
        return f.read()
E = errno.EIO
expect_errno(E, lambda: rd("tp2_pp2/incomplete/model_tp1_pp0.safetensors"), "incomplete: the file whose TP part was deleted")
expect_errno(E, lambda: rd("tp1_pp1/incomplete/model.safetensors"), "incomplete: tp1_pp1 model")
for f in ("model_tp0_pp0", "model_tp0_pp1", "model_tp1_pp1", "optim_tp1_pp0"):
    try:
        tap(len(rd(f"tp2_pp2/incomplete/{f}.safetensors")) > 0, f"incomplete: {f} still opens")
    except OSError as e:
        tap(False, f"incomplete: {f} still opens ({e})")
try:
    st = os.stat(os.path.join(mnt, "tp2_pp2/incomplete/model_tp1_pp0.safetensors"))
    print(f"# stat of a broken view file works (size {st.st_size})")
except OSError as e:
    print(f"# stat of a broken view file: {e}")
expect_errno(E, lambda: rd("tp2_pp1/disagree/model_tp0_pp0.safetensors"), "disagreeing DP replicas")
try:
    rd("tp2_pp1/disagree/model_tp1_pp0.safetensors")
    print("# disagree: the file holding only the consistent TP part of the tensor opens")
except OSError as e:
    print(f"# disagree: the file holding only the consistent TP part of the tensor: {e.strerror}")
tap(len(rd("tp2_pp1/disagree/optim_tp0_pp0.safetensors")) > 0, "disagree: the other group opens")
expect_errno(E, lambda: rd("tp1_pp1/dtype/model.safetensors"), "dtype conflict")
expect_errno(E, lambda: rd("tp1_pp2/dtype/model_tp0_pp1.safetensors"), "dtype conflict, stage of the tensor")
tap(len(rd("tp1_pp2/dtype/model_tp0_pp0.safetensors")) > 0, "dtype conflict: the other stage opens")
expect_errno(E, lambda: rd("tp1_pp1/gshape/model.safetensors"), "global shape conflict")
tap(len(rd("tp1_pp1/gshape/optim.safetensors")) > 0, "global shape conflict: the other group opens")
for name in ("tp0_pp1", "tp2_pp0", "tp01_pp1", "tp1_pp01", "TP2_pp2", "tp2_PP2", "tp2_pp2x", "tp2pp2",
             "tp_pp1", "tp-1_pp1", "tp+2_pp2", "tp2_pp", "xtp2_pp2", "tp2_pp2_"):
    expect_errno(errno.ENOENT, lambda: os.stat(os.path.join(mnt, name)), f"invalid layout name {name}")
expect_errno(errno.ENOENT, lambda: os.stat(os.path.join(mnt, "tp0_pp1/healthy")), "path under an invalid layout")
# not reshardable files: shown as ordinary files, other groups unaffected
v = os.path.join(mnt, "tp2_pp1/future")
names = sorted(os.listdir(v))
print(f"# tp2_pp1/future lists {names}")
for f in ("future.safetensors", "notjson.safetensors", "badentry.safetensors", "broken_json.safetensors"):
    try:
        tap(rd(f"tp2_pp1/future/{f}") == rd(f"future/{f}"), f"not reshardable {f}: passed through unchanged")
    except OSError as e:
        tap(False, f"not reshardable {f}: passed through unchanged ({e})")
tap("malformed" in names, "a subdirectory of malformed safetensors files is mirrored")
for f in sorted(os.listdir(os.path.join(mnt, "future/malformed"))):
    try:
        ok = rd(f"tp2_pp1/future/malformed/{f}") == rd(f"future/malformed/{f}")
    except OSError as e:
        ok = False
        print(f"# {f}: {e}")
    tap(ok, f"malformed {f} passed through unchanged")
EOF

py_checks "naive shards: daemon log" "$MNT" "$STORE/ckptfs.log" "$WORK/naive.json" <<'EOF'
import errno, json, os, re, sys
from helpers import tap, expect_errno
mnt, log, spec = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
HINT = ("no sharding metadata: describe it (docs/views.md section 3) or save with ckptfs.save "
        "(docs/trainer.md)")
def rd(rel):
    with open(os.path.join(mnt, rel), "rb") as f:
        return f.read()
expect_errno(errno.EIO, lambda: rd("tp1_pp1/naive/model.safetensors"), "naive: tp1_pp1 model")
# the tensor whose slices differ in shape (placed last by its name, like lm_head.weight, which
# sorts before it) fails every file; in tp128 rank 127's part of every other split tensor is
# empty (and not checked), so it is the first tensor that fails
expect_errno(errno.EIO, lambda: rd("tp128_pp1/naive/model_tp127_pp0.safetensors"),
             "naive: tp128_pp1 rank 127")
lines = open(log, errors="replace").read().splitlines()
files = spec["files"]
listed = f"4 files ({', '.join(files)})"
opens = [l for l in lines if "/tp1_pp1/naive/model.safetensors: cannot be served" in l]
for l in opens[-1:]:
    print(f"# {l}")
tap(any(f"tensor '{x}' is in {listed} with different bytes and {HINT}" in l
        for l in opens for x in spec["bytes"]),
    f"naive: open logs 'TENSOR' is in {listed} with different bytes and no sharding metadata")
builds = [l for l in lines if "] warning: " in l and HINT in l]
for l in builds[:1]:
    print(f"# {l}")
n = len(spec["bytes"]) + len(spec["shape"])
tap(any(f"(and {n - 1} more tensor(s) like it)" in l for l in builds),
    f"naive: the build logs a warning for the {n} tensors")
# the tensor whose slices differ in shape (5 rows: 3 and 2)
name = spec["shape"][0]
want = (f"tensor '{name}' is in {listed} with different shapes ([3] in model-rank0-dp0"
        f".safetensors, [2] in model-rank1-dp0.safetensors) and {HINT}")
tap(any(want in l for l in lines), f"naive: the log names the shapes of '{name}'")
# files with metadata keep the replica message
dis = [l for l in lines if "/disagree/" in l and "cannot be served" in l]
tap(dis and all("replicas disagree" in l and "sharding metadata" not in l for l in dis),
    f"disagree (described replicas): still 'replicas disagree' ({len(dis)} lines)")
EOF

# ---------------------------------------------------------------- ckpt check (unmounted)
stop_daemon || bail "unmount"
for d in healthy incomplete disagree dtype gshape future mixed mixedbad naive; do
	timeout -k 5 120 "$CKPT" check "$STORE" "$d" >"$WORK/check_$d.out" 2>&1
	echo $? >"$WORK/check_$d.rc"
	note "ckpt check $d: exit $(cat "$WORK/check_$d.rc")"
	indent "$WORK/check_$d.out"
done
py_checks "ckpt check output" "$WORK" <<'EOF'
import json, os, re, sys
from helpers import tap
work = sys.argv[1]
probs = json.load(open(os.path.join(work, "problems.json")))
for d, plist in sorted(probs.items()):
    rc = int(open(os.path.join(work, f"check_{d}.rc")).read())
    out = open(os.path.join(work, f"check_{d}.out"), errors="replace").read()
    if not plist:
        tap(rc == 0, f"ckpt check {d}: exit 0 on a healthy checkpoint (got {rc})")
        continue
    tap(rc != 0 and rc < 124, f"ckpt check {d}: non-zero exit (got {rc})")
    lines = out.splitlines()
    named = [p for p in plist if any(p[1] in l for l in lines)]
    tap(named, f"ckpt check {d}: names a broken tensor ({plist[0][1]} ...)")
    tap(any(p[0] in l for p in plist for l in lines if p[1] in l) or re.search(r"\bmodel\b", out),
        f"ckpt check {d}: names the group")
    for g, name, kind, rng in [p for p in named if p[2] == "missing"][:1]:
        ls = [l for l in lines if name in l]
        nums = set(int(x) for l in ls for x in re.findall(r"\d+", l.replace(name, " ")))
        split = [k for k, (lo, hi) in enumerate(rng) if lo != 0]
        want = {rng[k][0] for k in split} or {rng[0][1]}
        tap(want <= nums, f"ckpt check {d}: the {kind} range of {name} {rng} appears (bounds {sorted(want)})")
EOF

timeout -k 5 120 "$CKPT" ls "$STORE" >"$WORK/ls.out" 2>&1
echo $? >"$WORK/ls.rc"
note "ckpt ls: exit $(cat "$WORK/ls.rc")"
indent "$WORK/ls.out"
py_checks "naive shards: ckpt check and ckpt ls" "$WORK" <<'EOF'
import json, os, sys
from helpers import tap
work = sys.argv[1]
spec = json.load(open(os.path.join(work, "naive.json")))
HINT = ("no sharding metadata: describe it (docs/views.md section 3) or save with ckptfs.save "
        "(docs/trainer.md)")
listed = f"4 files ({', '.join(spec['files'])})"
out = open(os.path.join(work, "check_naive.out"), errors="replace").read().splitlines()
n = len(spec["bytes"]) + len(spec["shape"])
for kind in ("bytes", "shape"):
    what = "different bytes" if kind == "bytes" else "different shapes"
    got = [name for name in spec[kind]
           if any(f"naive/model.safetensors: group 'model', tensor '{name}' is in {listed} "
                  f"with {what}" in l and l.endswith(HINT) for l in out)]
    tap(got == spec[kind], f"ckpt check naive: {len(got)} of {len(spec[kind])} tensors whose "
                           f"slices have {what} reported as lacking sharding metadata")
tap(f"naive: {n} tensor(s) cannot be served" in out, f"ckpt check naive: {n} tensors summed up")
tap(int(open(os.path.join(work, "ls.rc")).read()) == 0, "ckpt ls: exit 0")
ls = {}
for l in open(os.path.join(work, "ls.out")).read().splitlines():
    if l[:1] == "/":
        ls[l.split()[0]] = ls.get(l.split()[0], "") + l + "\n"
flag = f"(NO SHARDING METADATA: {n} tensors in several files differ; run ckpt check)"
tap(flag in ls.get("/naive", ""), f"ckpt ls flags /naive: {flag}")
tap("INCOMPLETE" not in ls.get("/naive", ""), "ckpt ls /naive: not INCOMPLETE")
for d in ("/healthy", "/disagree", "/gshape", "/mixedbad"):
    tap(d in ls and "NO SHARDING METADATA" not in ls[d], f"ckpt ls {d}: no sharding-metadata flag")
tap("INCOMPLETE" in ls.get("/gshape", ""), "ckpt ls /gshape: still INCOMPLETE")
EOF

finish
