#!/bin/bash
# Resharded views (MOUNT/tpT_ppP/PATH): a Llama-style model + FSDP-flat optimizer state saved
# in every tp{1,2,4} x pp{1,2,3} layout with 2 DP replicas, read back through tp{1,2,3,4,8} x
# pp{1,2,4} views and compared element-exact with the reference (torch.chunk split + stage
# placement computed in numpy); strict safetensors header rules; name-based defaults on a
# plain model.safetensors (and -o tp_rules=FILE); passthrough files and subdirectories; mmap;
# snapshot semantics of open view files; a view file copied back is reshardable again;
# `ckpt export` byte-identical to the mounted views; `ckpt ls`, `ckpt check`; EROFS.
#
# VIEWS_SAVED="tp,pp ..." limits the saved layouts that are read through every view layout
# (default: all nine).
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"
need_py numpy

VL=$LIB_DIR/views_lib.py
SAVED=${VIEWS_SAVED:-"1,1 1,2 1,3 2,1 2,2 2,3 4,1 4,2 4,3"}
LAYOUTS=
for _t in 1 2 3 4 8; do
	for _p in 1 2 4; do
		LAYOUTS=$LAYOUTS${LAYOUTS:+,}tp${_t}_pp${_p}
	done
done
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

# ---------------------------------------------------------------- 1, 2: save sharded checkpoints
SPECS=()
for tp in 1 2 4; do
	for pp in 1 2 3; do
		d=ckpt_tp${tp}_pp${pp}
		extras=
		[ "$d" == ckpt_tp2_pp2 ] && extras=--extras
		if ! vl make-sharded "$MNT/$d" "$WORK/spec_$d.json" 1 "$tp" "$pp" 2 $extras \
			>"$WORK/make.out" 2>&1; then
			indent "$WORK/make.out"
			bail "save $d through the mount"
		fi
		case " $SAVED " in *" $tp,$pp "*) SPECS+=("$WORK/spec_$d.json") ;; esac
	done
done
ok "saved tp{1,2,4} x pp{1,2,3} checkpoints with 2 DP replicas (model + flat optimizer state)"
vl make-plain "$MNT/plain" "$WORK/spec_plain.json" 5 --extras >"$WORK/make.out" 2>&1 ||
	bail "save plain/model.safetensors"
ok "saved a plain model.safetensors without ckptfs metadata"
check "the DP replica files read back identical" test "$(sha "$MNT/ckpt_tp2_pp2/model-tp1-pp1-dp0.safetensors")" \
	== "$(sha "$MNT/ckpt_tp2_pp2/model-tp1-pp1-dp1.safetensors")"

# ---------------------------------------------------------------- layout directories
py_checks "layout directories" "$MNT" <<'EOF'
import errno, os, stat, sys
from helpers import tap, expect_errno
mnt = sys.argv[1]
for name in ("tp1_pp1", "tp2_pp2", "tp3_pp4", "tp8_pp1", "tp16_pp7"):
    try:
        st = os.stat(os.path.join(mnt, name))
        tap(stat.S_ISDIR(st.st_mode), f"{name} exists on lookup and is a directory")
    except OSError as e:
        tap(False, f"{name} exists on lookup ({e})")
root = set(os.listdir(mnt))
want = {"plain"} | {f"ckpt_tp{t}_pp{p}" for t in (1, 2, 4) for p in (1, 2, 3)}
tap(want <= root, f"the root lists the checkpoint dirs (got {sorted(root)})")
v = set(os.listdir(os.path.join(mnt, "tp2_pp2")))
tap(want <= v, f"tp2_pp2 mirrors the root's directories (got {sorted(v)})")
expect_errno(errno.ENOENT, lambda: os.stat(os.path.join(mnt, "tp2_pp2/no_such_dir")),
             "a missing path inside a view")
expect_errno(errno.ENOENT, lambda: os.stat(os.path.join(mnt, "tp2_pp2/ckpt_tp1_pp1/model.safetensors")),
             "tp1_pp1 names do not exist in tp2_pp2")
EOF

# ---------------------------------------------------------------- 3: read back through every layout
start=$(date +%s)
PY_TIMEOUT=600 vl_checks "views of the saved layouts" verify "$MNT" "$LAYOUTS" "${SPECS[@]}"
note "verified ${#SPECS[@]} saved layouts x 15 view layouts in $(($(date +%s) - start)) s"

# ---------------------------------------------------------------- 4: plain file, name-based rules
vl_checks "views of the plain file" verify "$MNT" tp2_pp2,tp1_pp1,tp4_pp4,tp3_pp1 \
	"$WORK/spec_plain.json"
py_checks "built-in rules in tp2_pp2" "$MNT" <<'EOF'
import os, sys
import views_lib as vl
from helpers import tap
v = os.path.join(sys.argv[1], "tp2_pp2/plain")
f = {}
for t in range(2):
    for p in range(2):
        tensors, meta, _ = vl.parse_st(vl.read_file(os.path.join(v, f"model_tp{t}_pp{p}.safetensors")))
        f[t, p] = {name: shape for name, dt, shape, raw in tensors}
tap(f[1, 0].get("model.layers.0.self_attn.q_proj.weight") == (32, 64), "q_proj split along dim 0")
tap(f[1, 1].get("model.layers.5.self_attn.o_proj.weight") == (64, 32), "o_proj split along dim 1")
tap(f[0, 1].get("model.layers.4.mlp.down_proj.weight") == (64, 64), "down_proj split along dim 1")
tap(f[1, 0].get("model.layers.1.mlp.gate_proj.weight") == (64, 64), "gate_proj split along dim 0")
tap(f[1, 0].get("model.layers.2.input_layernorm.weight") == (64,), "input_layernorm replicated")
tap(f[1, 1].get("model.norm.weight") == (64,), "model.norm replicated")
tap(all("model.embed_tokens.weight" in f[t, 0] and "model.embed_tokens.weight" not in f[t, 1]
        for t in range(2)), "embed_tokens on stage 0 only")
tap(f[0, 0]["model.embed_tokens.weight"] == (125, 64), "embed_tokens split along dim 0")
tap(all(n in f[t, 1] and n not in f[t, 0] for t in range(2) for n in ("lm_head.weight", "model.norm.weight")),
    "lm_head and model.norm on the last stage only")
tap("model.layers.2.self_attn.k_proj.weight" in f[0, 0] and "model.layers.3.self_attn.k_proj.weight" in f[0, 1],
    "layers 0-2 on stage 0, 3-5 on stage 1")
EOF

# ---------------------------------------------------------------- defaults without tp_dim/pp/num_layers
# tp_dim from the one split dim beats the name rules (router: no rule, split along dim 1;
# down_proj: rule 1, split along dim 0); a tensor split along no dim falls back to the rules;
# pp and num_layers from the names (layers.0/1 -> 2 layers).
py_checks "write the defaults checkpoint" "$MNT" <<'EOF'
import json, os, sys
import numpy as np
import views_lib as vl
d = os.path.join(sys.argv[1], "defaults")
os.makedirs(d)
rng = np.random.default_rng(42)
g = {"model.layers.0.mlp.router.weight": rng.standard_normal((4, 12)).astype(np.float32),
     "model.layers.1.mlp.down_proj.weight": rng.standard_normal((6, 8)).astype(np.float32),
     "model.layers.1.self_attn.q_proj.weight": rng.standard_normal((6, 8)).astype(np.float32),
     "model.wte.weight": rng.standard_normal((10, 4)).astype(np.float32)}
splits = {"model.layers.0.mlp.router.weight": 1, "model.layers.1.mlp.down_proj.weight": 0,
          "model.layers.1.self_attn.q_proj.weight": None, "model.wte.weight": None}
for t in range(2):
    pieces, ents = [], {}
    for name, a in g.items():
        k = splits[name]
        part, offs = a, [0, 0]
        if k is not None:
            part, offs[k] = vl.chunk(a, k, 2, t)
        ents[name] = {"global_shape": list(a.shape), "offsets": offs}
        pieces.append((name, "F32", part))
    ck = {"version": 1, "group": "dflt", "tensors": ents}
    vl.write_file(os.path.join(d, f"shard{t}.safetensors"),
                  vl.st_bytes(pieces, {"format": "pt", "ckptfs": json.dumps(ck)}))
print("ok - wrote defaults/")
EOF
vl_checks "views resolving defaults" oracle "$MNT" tp2_pp1,tp3_pp2,tp1_pp2,tp4_pp4 defaults
py_checks "defaults resolved as specified" "$MNT" <<'EOF'
import os, sys
import views_lib as vl
from helpers import tap
v = os.path.join(sys.argv[1], "tp2_pp2/defaults")
f = {}
for p in range(2):
    tensors, meta, _ = vl.parse_st(vl.read_file(os.path.join(v, f"dflt_tp1_pp{p}.safetensors")))
    f[p] = {name: shape for name, dt, shape, raw in tensors}
tap(f[0].get("model.layers.0.mlp.router.weight") == (4, 6), "router: tp_dim 1 from the split")
tap(f[1].get("model.layers.1.mlp.down_proj.weight") == (3, 8), "down_proj: tp_dim 0 from the split, not the rule")
tap(f[1].get("model.layers.1.self_attn.q_proj.weight") == (3, 8), "q_proj stored whole: tp_dim 0 from the rule")
tap(f[0].get("model.wte.weight") == (10, 4) and "model.wte.weight" not in f[1], "wte: first stage, replicated")
tap("model.layers.0.mlp.router.weight" not in f[1] and "model.layers.1.mlp.down_proj.weight" not in f[0],
    "num_layers 2 from the names: layer 0 on stage 0, layer 1 on stage 1")
EOF

# ---------------------------------------------------------------- 5: passthrough, subdirectories
for f in config.json tokenizer.json rng_state.pt extra/notes.txt extra/deeper/blob.bin; do
	assert_cmp "$MNT/ckpt_tp2_pp2/$f" "$MNT/tp3_pp2/ckpt_tp2_pp2/$f" "passthrough $f in tp3_pp2"
done
check "empty subdirectory mirrored" test -d "$MNT/tp8_pp4/plain/extra/emptydir"
check "source files do not appear in the view" test ! -e "$MNT/tp2_pp2/ckpt_tp2_pp2/model-tp0-pp0-dp0.safetensors"

# ---------------------------------------------------------------- 6: mmap
py_checks "mmap of view files" "$MNT" <<'EOF'
import mmap, os, random, sys
from helpers import tap
mnt = sys.argv[1]
rnd = random.Random(3)
for rel in ("tp2_pp3/ckpt_tp2_pp2/model_tp1_pp2.safetensors", "tp1_pp1/ckpt_tp4_pp3/optim.safetensors",
            "tp3_pp1/plain/model_tp2_pp0.safetensors"):
    p = os.path.join(mnt, rel)
    with open(p, "rb") as f:
        data = f.read()
    fd = os.open(p, os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        good = len(mm) == len(data) and mm[:] == data
        for _ in range(50):
            a = rnd.randrange(len(data))
            b = min(len(data), a + rnd.randrange(1, 20000))
            good = good and mm[a:b] == data[a:b]
        mm.close()
        tap(good, f"mmap of {rel} equals read ({len(data)} bytes)")
    except OSError as e:
        tap(False, f"mmap of {rel}: {e}")
    finally:
        os.close(fd)
EOF

# ---------------------------------------------------------------- 7: snapshot semantics
py_checks "snapshot of an open view file" "$MNT" <<'EOF'
import errno, os, sys, time
import views_lib as vl
from helpers import tap, expect_errno
mnt = sys.argv[1]
src = os.path.join(mnt, "snap")
vl.save_sharded(src, 11, 2, 1, 1)
path = os.path.join(mnt, "tp1_pp1/snap/model.safetensors")
exp11 = vl.expected_view(vl.build_model(11), 6, 1, 1)[0, 0]
exp12 = vl.expected_view(vl.build_model(12), 6, 1, 1)[0, 0]

def check(buf, exp, desc):
    probs = []
    vl.check_buf(buf, len(buf), exp, probs, desc)
    tap(not probs, desc)
    for m in probs[:5]:
        print("#  ", m)

fd1 = os.open(path, os.O_RDONLY)
size1 = os.fstat(fd1).st_size
head = os.pread(fd1, 4096, 0)
vl.save_sharded(src, 12, 2, 1, 1)          # rewrite the sources in place, new values
check(head + os.pread(fd1, size1, 4096), exp11,
      "a view file opened before the sources were rewritten keeps the old content")
fd2 = os.open(path, os.O_RDONLY)
check(os.pread(fd2, size1 + 1, 0), exp12, "a new open right after the rewrite returns the new content")
os.close(fd2)
time.sleep(1.2)
fd3 = os.open(path, os.O_RDONLY)
check(os.pread(fd3, size1 + 1, 0), exp12, "a new open 1.2 s after the rewrite returns the new content")
check(os.pread(fd1, size1 + 1, 0), exp11,
      "the first handle still reads the old content after a new open read the new content")
for fn in os.listdir(src):
    os.unlink(os.path.join(src, fn))
check(os.pread(fd1, size1 + 1, 0), exp11, "the first handle still reads the old content after the sources are deleted")
check(os.pread(fd3, size1 + 1, 0), exp12, "the last handle still reads its content after the sources are deleted")
os.close(fd1)
os.close(fd3)
time.sleep(1.2)   # entries are cached for 1 s
tap("model.safetensors" not in os.listdir(os.path.dirname(path)), "the view file is gone with its sources")
expect_errno(errno.ENOENT, lambda: os.stat(path), "stat of the view file after its sources are deleted")
EOF

# ---------------------------------------------------------------- 8: copy a view file back
mkdir -p "$MNT/copied" && cp "$MNT/tp1_pp1/ckpt_tp2_pp3/model.safetensors" \
	"$MNT/tp1_pp1/ckpt_tp2_pp3/optim.safetensors" "$MNT/copied/"
check "copied tp1_pp1 view files back into the store" test -s "$MNT/copied/optim.safetensors"
"$PY" - "$WORK/spec_ckpt_tp2_pp3.json" "$WORK/spec_copied.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
s["reldir"] = "copied"
s["dirs"] = {"": {"groups": s["dirs"][""]["groups"], "files": {}, "subdirs": []}}
json.dump(s, open(sys.argv[2], "w"))
EOF
vl_checks "views of copied view files" verify "$MNT" tp2_pp1,tp1_pp1,tp3_pp4,tp8_pp2 "$WORK/spec_copied.json"
if cmp -s "$MNT/copied/model.safetensors" "$MNT/tp1_pp1/copied/model.safetensors"; then
	note "tp1_pp1 view of a copied tp1_pp1 view file is byte-identical to it"
else
	note "tp1_pp1 view of a copied tp1_pp1 view file differs from it (allowed)"
fi

# ---------------------------------------------------------------- 10: read-only views
py_checks "views are read-only" "$MNT" <<'EOF'
import errno, os, sys
from helpers import tap, expect_errno
mnt = sys.argv[1]
v = os.path.join(mnt, "tp2_pp2/ckpt_tp2_pp2")
src = os.path.join(mnt, "ckpt_tp2_pp2")
before = sorted(os.listdir(src))
vf = os.path.join(v, "model_tp0_pp0.safetensors")
E = errno.EROFS
expect_errno(E, lambda: open(os.path.join(v, "new.txt"), "wb"), "create in a view")
expect_errno(E, lambda: open(os.path.join(mnt, "tp2_pp2/new.txt"), "wb"), "create in a view root")
expect_errno(E, lambda: os.open(vf, os.O_WRONLY), "open a view file for writing")
expect_errno(E, lambda: os.open(vf, os.O_RDWR), "open a view file read-write")
expect_errno(E, lambda: os.open(os.path.join(v, "config.json"), os.O_WRONLY | os.O_APPEND),
             "open a passthrough file for writing")
expect_errno(E, lambda: os.open(vf, os.O_RDONLY | os.O_TRUNC), "O_TRUNC on a view file")
expect_errno(E, lambda: os.truncate(vf, 0), "truncate a view file")
expect_errno(E, lambda: os.unlink(vf), "unlink a view file")
expect_errno(E, lambda: os.unlink(os.path.join(v, "config.json")), "unlink a passthrough file")
expect_errno(E, lambda: os.rename(vf, os.path.join(v, "renamed.safetensors")), "rename in a view")
expect_errno(E, lambda: os.rename(os.path.join(v, "extra"), os.path.join(v, "extra2")),
             "rename a directory in a view")
expect_errno((E, errno.EXDEV), lambda: os.rename(vf, os.path.join(src, "stolen.safetensors")),
             "rename out of a view")
expect_errno((E, errno.EXDEV), lambda: os.rename(os.path.join(src, "config.json"),
             os.path.join(v, "config2.json")), "rename into a view")
expect_errno(E, lambda: os.mkdir(os.path.join(v, "newdir")), "mkdir in a view")
expect_errno(E, lambda: os.mkdir(os.path.join(mnt, "tp2_pp2/newdir")), "mkdir in a view root")
expect_errno(E, lambda: os.rmdir(os.path.join(v, "extra/emptydir")), "rmdir in a view")
expect_errno(E, lambda: os.chmod(vf, 0o600), "chmod a view file")
expect_errno(E, lambda: os.chmod(os.path.join(v, "config.json"), 0o600), "chmod a passthrough file")
expect_errno(E, lambda: os.chmod(v, 0o700), "chmod a view directory")
expect_errno(E, lambda: os.symlink("x", os.path.join(v, "lnk")), "symlink in a view")
expect_errno((E, errno.EXDEV), lambda: os.link(os.path.join(src, "config.json"), os.path.join(v, "hard")),
             "hard link into a view")
try:
    os.utime(vf, (1, 1))
    print("# utime on a view file succeeded")
except OSError as e:
    print(f"# utime on a view file: {errno.errorcode.get(e.errno)}")
tap(sorted(os.listdir(src)) == before, "the sources are unchanged")
tap(not os.path.exists(os.path.join(src, "stolen.safetensors")), "nothing was moved out of the view")
with open(vf, "rb") as f:
    tap(len(f.read()) == os.stat(vf).st_size > 0, "the view file still reads")
EOF

# ---------------------------------------------------------------- 9: export, ls, check (unmounted)
for l in tp2_pp3 tp4_pp1 tp1_pp1; do
	cp -r "$MNT/$l/ckpt_tp2_pp2" "$WORK/mounted_$l" || fail "copy the mounted view $l"
done
cp -r "$MNT/tp3_pp2/plain" "$WORK/mounted_plain_tp3_pp2" || fail "copy the mounted plain view"
stop_daemon || bail "unmount"
ok "unmounted"

for l in tp2_pp3 tp4_pp1 tp1_pp1; do
	mkdir -p "$WORK/export"
	if timeout -k 5 120 "$CKPT" export "$STORE" ckpt_tp2_pp2 --layout "$l" "$WORK/export/$l" \
		>"$WORK/export.out" 2>&1; then
		ok "ckpt export ckpt_tp2_pp2 --layout $l"
		if diff -r "$WORK/mounted_$l" "$WORK/export/$l" >"$WORK/export.diff" 2>&1; then
			ok "export $l: byte-identical to the mounted view (files, subdirs, passthrough)"
		else
			fail "export $l: byte-identical to the mounted view"
			indent "$WORK/export.diff"
		fi
	else
		fail "ckpt export ckpt_tp2_pp2 --layout $l (exit $?)"
		indent "$WORK/export.out"
	fi
done
if timeout -k 5 120 "$CKPT" export "$STORE" plain --layout tp3_pp2 "$WORK/export/plain" \
	>"$WORK/export.out" 2>&1; then
	if diff -r "$WORK/mounted_plain_tp3_pp2" "$WORK/export/plain" >"$WORK/export.diff" 2>&1; then
		ok "export plain tp3_pp2: byte-identical to the mounted view"
	else
		fail "export plain tp3_pp2: byte-identical to the mounted view"
		indent "$WORK/export.diff"
	fi
else
	fail "ckpt export plain --layout tp3_pp2"
	indent "$WORK/export.out"
fi
check_fails "ckpt export with a bad layout fails" "$CKPT" export "$STORE" ckpt_tp2_pp2 \
	--layout tp0_pp1 "$WORK/export/bad"

timeout -k 5 60 "$CKPT" ls "$STORE" >"$WORK/ls.out" 2>&1
assert_eq 0 $? "ckpt ls STORE exits 0"
indent "$WORK/ls.out"
for d in ckpt_tp1_pp1 ckpt_tp2_pp2 ckpt_tp4_pp3 plain copied; do
	check "ckpt ls STORE names $d" grep -qw "$d" "$WORK/ls.out"
done
timeout -k 5 60 "$CKPT" ls "$STORE" ckpt_tp4_pp3 >"$WORK/ls.out" 2>&1
assert_eq 0 $? "ckpt ls STORE ckpt_tp4_pp3 exits 0"
indent "$WORK/ls.out"
check "ckpt ls names the directory and its groups" \
	bash -c "grep -q ckpt_tp4_pp3 '$WORK/ls.out' && grep -qw model '$WORK/ls.out' && grep -qw optim '$WORK/ls.out'"
for d in ckpt_tp2_pp2 ckpt_tp4_pp3 plain copied; do
	timeout -k 5 120 "$CKPT" check "$STORE" "$d" >"$WORK/check.out" 2>&1
	rc=$?
	assert_eq 0 "$rc" "ckpt check on the healthy $d exits 0"
	[ "$rc" -eq 0 ] || indent "$WORK/check.out"
done

# ---------------------------------------------------------------- -o tp_rules=FILE
cat >"$WORK/tp_rules" <<'EOF'
# test rules: the final norm split along dim 0, the mask along dim 1
^model\.norm\.weight$  0
attention_mask 1
EOF
start_daemon -o tp_rules="$WORK/tp_rules" || bail "mount with -o tp_rules"
vl_checks "views with -o tp_rules" verify "$MNT" tp2_pp2,tp3_pp1 --tp-rules "$WORK/tp_rules" \
	"$WORK/spec_plain.json"
vl_checks "explicit tp_dim wins over -o tp_rules" verify "$MNT" tp2_pp2 \
	--tp-rules "$WORK/tp_rules" "$WORK/spec_ckpt_tp1_pp3.json"
stop_daemon || fail "unmount"

# ---------------------------------------------------------------- -o view_cache: dropped views
# With one view kept, every layout read below drops the previous one; the views built again
# must read element-exact, and the daemon says at unmount how many it built and dropped.
start_daemon -o view_cache=1,log_level=info || bail "mount with -o view_cache=1"
for pass in 1 2; do
	vl_checks "view_cache=1, pass $pass" verify "$MNT" tp2_pp1,tp1_pp2,tp4_pp1 \
		"$WORK/spec_ckpt_tp2_pp2.json" "$WORK/spec_ckpt_tp1_pp3.json"
done
stop_daemon || fail "unmount"
vc=$(grep 'view cache:' "$STORE/ckptfs.log" | tail -n 1)
note "$vc"
built=$(sed -n 's/.*view cache: \([0-9]*\) views built, \([0-9]*\) dropped for newer ones, \([0-9]*\) kept.*/\1 \2 \3/p' <<<"$vc")
read -r nb nd nk <<<"$built"
check "view_cache=1: every one of the 2 x 3 x 2 layout reads built its view again" \
	test "${nb:-0}" -ge 12
assert_eq "$((nb - 1))" "${nd:-x}" "view_cache=1: all views but the last were dropped"
assert_eq 1 "${nk:-x}" "view_cache=1: one view kept"
"$CKPT" fsck "$STORE" >"$WORK/fsck.out" 2>&1
assert_eq 0 $? "ckpt fsck after the view tests"

finish
