#!/bin/bash
# ckpt on a mounted store: the --json output of stat, ls, check and du parsed as JSON and
# checked against the text output and the files on the mount; ckpt du's unique and stored bytes
# of step directories that share a file; ckpt verify while the daemon runs (clean, a sample, a
# byte budget, beside a writer whose data the background work keeps moving, a damaged chunk
# found and named while mounted); ckpt prune through the mount (dry run, the policy, what it
# never touches) and the space then reclaimed by ckpt gc; the progress bar on a pseudo-terminal
# (script(1)) and its absence on a pipe.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

need script python3

# json_of DESC ARGS...: run "ckpt ARGS...", keep stdout in $WORK/json; ok when it exits 0
json_of() {
	local desc=$1
	shift
	if "$CKPT" "$@" >"$WORK/json" 2>"$WORK/json.err"; then
		ok "$desc"
	else
		not_ok "$desc (exit $?)"
		indent "$WORK/json.err"
	fi
}

# field FILE KEY: "KEY: value" of a ckpt text output
field() {
	sed -n "s/^$2:[[:space:]]*//p" "$1" | head -n 1
}

start_daemon -o pack_max=4M || bail "mount $STORE"

# ---------------------------------------------------------------- the data
# run/step_N: a file of its own (random, 1 MiB) and one shared by every step (random, 1 MiB)
rand_file "$WORK/shared" $MiB
mkdir -p "$MNT/run"
for n in 100 200 300; do
	mkdir "$MNT/run/step_$n"
	rand_file "$MNT/run/step_$n/own.bin" $MiB
	cp "$WORK/shared" "$MNT/run/step_$n/shared.bin"
done
# the chunk damaged later: one file smaller than the chunker's minimum is one chunk
mkdir "$MNT/victim"
rand_file "$MNT/victim/v.bin" 100000
py_checks "write a sharded safetensors checkpoint" "$MNT/ckpt/step_1" <<'EOF'
import sys
import views_lib as vl
vl.save_sharded(sys.argv[1], 7, 2, 1, 1)
print("ok - written")
EOF
wait_committed 20 || fail "the files are indexed"
wait_stat "$STORE" compression_pending 0 20 || fail "background compression settles"

# ---------------------------------------------------------------- stat --json
"$CKPT" stat "$STORE" >"$WORK/stat.txt" 2>&1 || fail "ckpt stat"
json_of "ckpt stat --json exits 0 while mounted" stat --json "$STORE"
py_checks "stat --json" "$WORK/json" "$WORK/stat.txt" "$STORE" <<'EOF'
import json, sys
from helpers import tap
doc = json.load(open(sys.argv[1]))
text = dict(l.split(": ", 1) for l in open(sys.argv[2]).read().splitlines())
tap(doc["store"] == sys.argv[3], "stat --json names the store")
ints = [k for k in text if k not in ("store",) and not k.endswith("_ratio")]
tap(all(isinstance(doc[k], int) and doc[k] == int(text[k]) for k in ints),
    f"stat --json has the text's {len(ints)} counts, as integers")
tap(all(abs(doc[k] - float(text[k])) < 0.006 for k in text if k.endswith("_ratio")),
    "stat --json has the ratios as numbers")
tap(set(doc) == set(text), "stat --json has exactly the text's keys")
EOF

# ---------------------------------------------------------------- ls --json, check --json
json_of "ckpt ls --json exits 0 while mounted" ls --json "$STORE" /ckpt
py_checks "ls --json" "$WORK/json" <<'EOF'
import json, sys
from helpers import tap
doc = json.load(open(sys.argv[1]))
dirs = {d["path"]: d for d in doc["directories"]}
tap(doc["path"] == "/ckpt" and "/ckpt" in dirs and "/ckpt/step_1" in dirs,
    "ls --json lists PATH and its subdirectories")
g = {x["name"]: x for x in dirs["/ckpt/step_1"]["groups"]}
tap(set(g) == {"model", "optim"}, f"ls --json: the groups of step_1 ({sorted(g)})")
m = g.get("model", {})
tap(m.get("saved_layout") == "tp2_pp1" and m.get("saved_tp") == 2 and m.get("saved_pp") == 1,
    "ls --json: the saved layout")
tap(m.get("files") == 2 and m.get("tensors", 0) > 0 and m.get("incomplete") is False,
    "ls --json: files, tensors, incomplete")
EOF
json_of "ckpt check --json exits 0 on a complete checkpoint" check --json "$STORE" /ckpt/step_1
py_checks "check --json, complete" "$WORK/json" <<'EOF'
import json, sys
from helpers import tap
doc = json.load(open(sys.argv[1]))
tap(doc["ok"] is True and doc["problems"] == [] and doc["unservable_tensors"] == 0
    and doc["groups"] == 2, "check --json: ok, no problems, 2 groups")
EOF
mkdir "$MNT/ckpt/broken"
cp "$MNT/ckpt/step_1/model-tp0-pp0-dp0.safetensors" "$MNT/ckpt/broken/"
sleep 1.5
"$CKPT" check --json "$STORE" /ckpt/broken >"$WORK/json" 2>"$WORK/json.err"
assert_eq 1 "$?" "ckpt check --json exits 1 when tensors cannot be served"
py_checks "check --json, a missing shard" "$WORK/json" <<'EOF'
import json, sys
from helpers import tap
doc = json.load(open(sys.argv[1]))
p = doc["problems"]
tap(doc["ok"] is False and doc["unservable_tensors"] > 0 and len(p) > 0,
    f"check --json: not ok, {len(p)} problems")
tap(all(set(x) == {"file", "reason"} and x["file"] and x["reason"] for x in p),
    "check --json: each problem has a file and a reason")
EOF

# ---------------------------------------------------------------- du
json_of "ckpt du --json exits 0 while mounted" du --json "$STORE" /run
"$CKPT" du "$STORE" /run >"$WORK/du.txt" 2>&1 || fail "ckpt du (text)"
indent "$WORK/du.txt"
py_checks "du --json" "$WORK/json" "$MNT" <<'EOF'
import json, os, sys
from helpers import tap
doc = json.load(open(sys.argv[1]))
mnt = sys.argv[2]
rows = {d["path"]: d for d in doc["directories"]}
tap(sorted(rows) == ["/run/step_100", "/run/step_200", "/run/step_300"],
    f"du --json: one row per step ({sorted(rows)})")
MiB = 1 << 20
for p, d in sorted(rows.items()):
    want = sum(os.path.getsize(os.path.join(r, f))
               for r, _, fs in os.walk(mnt + p) for f in fs)
    tap(d["logical_bytes"] == want == 2 * MiB, f"{p}: logical bytes {d['logical_bytes']}")
    # random data is stored as it is: 2 MiB stored, of which only its own file is unique
    tap(d["stored_bytes"] == 2 * MiB, f"{p}: stored bytes {d['stored_bytes']}")
    tap(d["unique_bytes"] == MiB, f"{p}: unique bytes {d['unique_bytes']} (its own file)")
    tap(d["files"] == 2, f"{p}: 2 files")
t = doc["total"]
tap(t["path"] == "/run" and t["logical_bytes"] == 6 * MiB and t["stored_bytes"] == 4 * MiB
    and t["unique_bytes"] == 4 * MiB, f"du --json: the total of /run ({t})")
EOF
check "ckpt du prints a header and one line per step and the total" \
	bash -c '[ "$(wc -l <"$1")" -eq 5 ] && grep -q "^ *LOGICAL *UNIQUE *STORED *PATH$" "$1" &&
		 grep -q " /run$" "$1" && grep -q "1.0 MiB .* /run/step_200$" "$1"' _ "$WORK/du.txt"
"$CKPT" du "$STORE" /nonexistent >"$WORK/out" 2>&1
assert_eq 1 "$?" "ckpt du of a missing path exits 1"
check "ckpt du names the store, the path and the reason" \
	grep -qF "ckpt: $STORE: /nonexistent: No such file or directory" "$WORK/out"

# ---------------------------------------------------------------- verify while mounted
"$CKPT" verify "$STORE" >"$WORK/v.out" 2>"$WORK/v.err"
assert_eq 0 "$?" "ckpt verify exits 0 on a clean mounted store"
assert_eq "$(field "$WORK/v.out" chunks)" "$(field "$WORK/v.out" checked_chunks)" \
	"ckpt verify reads every chunk"
check "ckpt verify ends with 'STORE: ok'" grep -qx "$STORE: ok" "$WORK/v.out"
check "ckpt verify writes nothing on stderr when all is well" test ! -s "$WORK/v.err"
nchunks=$(field "$WORK/v.out" chunks)

"$CKPT" verify "$STORE" --sample 50% >"$WORK/v.out" 2>&1
assert_eq 0 "$?" "ckpt verify --sample 50% exits 0"
assert_eq $(((nchunks + 1) / 2)) "$(field "$WORK/v.out" selected_chunks)" \
	"--sample 50% reads half the chunks (rounded up)"
"$CKPT" verify "$STORE" --sample 3 >"$WORK/v.out" 2>&1
assert_eq 3 "$(field "$WORK/v.out" checked_chunks)" "--sample 3 reads 3 chunks"
"$CKPT" verify "$STORE" --bytes 1M --seed 5 >"$WORK/v.out" 2>&1
assert_eq 0 "$?" "ckpt verify --bytes 1M exits 0"
sel=$(field "$WORK/v.out" selected_bytes)
assert_le $MiB "$sel" "--bytes 1M reads at least 1 MiB ($sel)"
assert_lt "$sel" "$(field "$WORK/v.out" stored_bytes)" "--bytes 1M reads less than the store"
"$CKPT" verify "$STORE" --bytes 1M --seed 5 >"$WORK/v2.out" 2>&1
assert_eq "$sel" "$(field "$WORK/v2.out" selected_bytes)" "the same --seed reads the same chunks"
"$CKPT" verify "$STORE" --sample 0% >"$WORK/out" 2>&1
assert_eq 2 "$?" "ckpt verify --sample 0% is a usage error"
"$CKPT" verify "$STORE" --bytes 12Q >"$WORK/out" 2>&1
assert_eq 2 "$?" "ckpt verify --bytes 12Q is a usage error"

# beside a writer: the daemon compresses its data in the background and compacts the packs
# of the raw copies (pack_max=4M: several packs, deleted while verify reads)
for i in 1 2 3 4; do
	"$PY" -c "import sys
sys.stdout.write(''.join(f'round $i line {j}: loss={(j * 7919) % 1000}\n' for j in range(80000)))" \
		>"$WORK/log_$i.txt"
done
(
	for i in 1 2 3 4; do
		cp "$WORK/log_$i.txt" "$MNT/run/log_$i.txt"
		sleep 1.2 # writes pause: the daemon compresses, then compacts
	done
) &
writer=$!
bad=0 runs=0 moved=0 vanished=0
while kill -0 $writer 2>/dev/null || [ $runs -lt 3 ]; do
	"$CKPT" verify "$STORE" --no-progress >"$WORK/v.out" 2>"$WORK/v.err"
	rc=$?
	runs=$((runs + 1))
	moved=$((moved + $(field "$WORK/v.out" moved_chunks)))
	vanished=$((vanished + $(field "$WORK/v.out" vanished_chunks)))
	if [ $rc -ne 0 ]; then
		bad=$((bad + 1))
		indent "$WORK/v.out"
		indent "$WORK/v.err"
	fi
	[ $runs -ge 12 ] && break
done
wait $writer
note "verify beside a writer: $runs runs, $moved chunks found moved, $vanished vanished"
assert_eq 0 "$bad" "ckpt verify reports no damage while the daemon writes, compresses and compacts ($runs runs)"
wait_stat "$STORE" compression_pending 0 30 || fail "background compression settles again"
sleep 2

# a damaged chunk, found while mounted: a byte of the stored bytes of victim/v.bin (one chunk
# stored as it is).  Every copy of its record is damaged: the one the index names, and any the
# compactor left behind in a pack it has not deleted yet.
"$CKPT" verify "$STORE" >/dev/null 2>&1 || fail "the store is clean before the damage"
"$PY" - "$MNT/victim/v.bin" "$STORE/packs" >"$WORK/victims" <<'EOF'
# every record (format: docs/format.md) whose stored bytes are v.bin's: "PACK OFFSET" of a byte
# 4096 bytes into them
import glob, os, struct, sys
want = open(sys.argv[1], "rb").read()
for p in sorted(glob.glob(os.path.join(sys.argv[2], "pack-*.ckpk"))):
    data = open(p, "rb").read()
    i = data.find(b"CKRC", 64)
    while i >= 0:
        stored, raw = struct.unpack_from("<II", data, i + 8)
        if stored == raw == len(want) and data[i + 48:i + 48 + stored] == want:
            print(p, i + 48 + 4096)
        i = data.find(b"CKRC", i + 4)
EOF
if [ ! -s "$WORK/victims" ]; then
	fail "found the record of victim/v.bin in a pack"
else
	while read -r p off; do
		flip_byte "$p" "$off" || fail "flip a byte of victim/v.bin in $p"
	done <"$WORK/victims"
	"$CKPT" verify "$STORE" >"$WORK/v.out" 2>"$WORK/v.err"
	assert_eq 1 "$?" "ckpt verify exits 1 on a damaged chunk while mounted"
	indent "$WORK/v.out"
	assert_eq 1 "$(field "$WORK/v.out" damaged_chunks)" "ckpt verify finds one damaged chunk"
	check "ckpt verify names the chunk, where it lies and why" \
		grep -qE "^problem: chunk [0-9a-f]{32} \(pack [0-9]+, offset [0-9]+\) is damaged: " "$WORK/v.out"
	check "ckpt verify names the damaged file" \
		grep -q "^damaged: /victim/v.bin: damaged data at offset 0 (100000 bytes" "$WORK/v.out"
	check "ckpt verify's last line counts the damage" grep -qx "$STORE: 1 damaged chunk(s)" "$WORK/v.out"
	"$CKPT" verify "$STORE" --sample 1 --seed 3 >/dev/null 2>&1
	rc=$?
	[ $rc -le 1 ] && ok "a sample of a damaged store exits 0 or 1" || fail "a sample of a damaged store (exit $rc)"
	while read -r p off; do
		[ -e "$p" ] && flip_byte "$p" "$off"
	done <"$WORK/victims"
	check "ckpt verify passes again once the byte is restored" "$CKPT" verify "$STORE"
fi
is_mounted "$MNT" && ok "the daemon kept serving throughout" || fail "the daemon kept serving"

# ---------------------------------------------------------------- progress on a terminal
script -qec "'$CKPT' verify '$STORE' --sample 5" /dev/null >"$WORK/tty.out" 2>&1
check "on a terminal verify draws a progress bar" grep -qa "verify  \[.*\] .* / .* 100%" "$WORK/tty.out"
"$CKPT" verify "$STORE" --sample 5 2>"$WORK/pipe.err" | cat >/dev/null
check "on a pipe verify draws no bar" test ! -s "$WORK/pipe.err"
"$CKPT" verify "$STORE" --sample 5 --progress 2>"$WORK/pipe.err" >/dev/null
check "--progress forces the bar on a pipe" grep -qa "verify  \[" "$WORK/pipe.err"
script -qec "'$CKPT' verify '$STORE' --sample 5 --no-progress" /dev/null >"$WORK/tty.out" 2>&1
check "--no-progress: no bar on a terminal" bash -c '! grep -qa "verify  \[" "$1"' _ "$WORK/tty.out"

# ---------------------------------------------------------------- prune through the mount
mkdir -p "$MNT/p"
for n in 100 200 300 400 500 600; do
	mkdir "$MNT/p/global_step$n"
	rand_file "$MNT/p/global_step$n/weights.bin" $((256 * 1024))
done
wait_committed 20 || fail "the steps are indexed before prune"
mkdir "$MNT/p/checkpoint-50" "$MNT/p/checkpoint-75" "$MNT/p/.global_step700" \
	"$MNT/p/global_step800.tmp" "$MNT/p/notes"
echo x >"$MNT/p/global_step900"
ln -s global_step600 "$MNT/p/global_step1000"
ls -a "$MNT/p" | sort >"$WORK/before"
"$CKPT" prune "$MNT/p" --keep-last 2 --keep-every 300 --dry-run >"$WORK/prune.out" 2>&1
assert_eq 0 "$?" "ckpt prune --dry-run exits 0"
indent "$WORK/prune.out"
assert_eq "$(cat "$WORK/before")" "$(ls -a "$MNT/p" | sort)" "--dry-run deletes nothing"
assert_eq "global_step100 global_step200 global_step400" \
	"$(sed -n 's/^would delete  //p' "$WORK/prune.out" | sort | xargs)" "--dry-run names what would go"
"$CKPT" prune "$MNT/p" >"$WORK/out" 2>&1
assert_eq 2 "$?" "ckpt prune without a rule is a usage error"
stored0=$(stat_field "$STORE" stored_bytes)
packs0=$(stat_field "$STORE" pack_bytes)
"$CKPT" prune "$MNT/p" --keep-last 2 --keep-every 300 >"$WORK/prune.out" 2>&1
assert_eq 0 "$?" "ckpt prune exits 0"
assert_eq ". .. .global_step700 checkpoint-50 checkpoint-75 global_step1000 global_step300 global_step500 global_step600 global_step800.tmp global_step900 notes" \
	"$(ls -a "$MNT/p" | sort | xargs)" \
	"prune keeps the newest, the last 2, every 300th and everything that is not a step directory"
check "prune's summary counts the steps" grep -q "5 step(s) kept, 3 deleted" "$WORK/prune.out"
sleep 1.5
stored1=$(stat_field "$STORE" stored_bytes)
# (random data: stored as it is, give or take a few bytes the compressor may win)
assert_le $((stored1 + 3 * 256 * 1024 - 4096)) "$stored0" \
	"the pruned steps' chunks are no longer in use ($stored0 -> $stored1 stored bytes in use)"
mkdir -p "$MNT/q/step_1/sub" "$MNT/q/step_2"
echo y >"$MNT/q/step_1/sub/f"
chmod 500 "$MNT/q/step_1/sub"
if [ "$(id -u)" -ne 0 ]; then
	"$CKPT" prune "$MNT/q" --keep-last 1 >"$WORK/out" 2>&1
	assert_eq 1 "$?" "ckpt prune exits 1 when a step cannot be deleted"
	check "ckpt prune names the file and the reason" grep -q "q/step_1/sub/f: cannot delete: Permission denied" "$WORK/out"
else
	note "running as root: the permission case of prune is not exercised"
fi
chmod 755 "$MNT/q/step_1/sub"

stop_daemon || fail "unmount"
# --live 100: every pack with anything dead is rewritten, so the pruned steps' bytes are gone
"$CKPT" gc "$STORE" --live 100 --no-progress >"$WORK/gc.out" 2>&1 || fail "ckpt gc after prune"
packs1=$(stat_field "$STORE" pack_bytes)
assert_le $((packs1 + 3 * 256 * 1024 - 4096)) "$packs0" \
	"the pruned steps' space is reclaimed ($packs0 -> $packs1 pack bytes)"
assert_eq 0 "$(stat_field "$STORE" unreferenced_bytes)" "no unreferenced bytes after gc"
check "ckpt verify passes on the unmounted store after gc" "$CKPT" verify "$STORE"
check "ckpt fsck agrees" "$CKPT" fsck "$STORE" --no-progress

finish
