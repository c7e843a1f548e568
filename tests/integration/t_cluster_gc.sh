#!/usr/bin/env bash
# gc beside mounted nodes, and its fence (docs/cluster.md section 7): ckptfs daemons stand in for
# nodes on this machine, sharing one PostgreSQL database (a server this test starts, pg_lib.sh)
# and one chunk directory ($STORE).
#   1. gc while saves run: three nodes keep writing, overwriting and deleting files whose
#      content is drawn from a shared pool (so a save's chunks are often dedup hits on chunks
#      another node's files hold, and those files' refcounts fall to 0 while the save is in
#      flight), while `ckpt gc --meta` runs again and again. Every save succeeds, every
#      surviving file reads back exact through another node, no deleted file comes back, and
#      gc reclaims space online (the pack bytes fall once the files are deleted).
#   1b. node 2 keeps reading a file that node 1 overwrites meanwhile, while gc runs: the open
#      file keeps the chunks of the version it opened (a node's read-only open holds its pin),
#      and gc drops them once it closes
#   1c. node 1 deletes a file it has open; node 3's mount meanwhile does not reap it (orphan
#      markers name their node) and node 1 reads it to the end
#   2. the fence: a fourth node with a short session timeout has a save in flight (new chunks
#      and dedup hits on a chunk whose last file another node then deletes) when it is stopped
#      (SIGSTOP) past its timeout; gc suspects it, then (a timeout later) declares it dead,
#      drops that chunk and deletes its packs;
#      after SIGCONT its fsync fails with EIO (the log names the reason), no node serves the
#      file with wrong bytes, and the node saves again with a new session.
#   3. with every node unmounted, fsck finds the store consistent.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=pg_lib.sh
. "$(dirname "$0")/pg_lib.sh"
need fusermount3 findmnt mountpoint cmp sha256sum
need_py

pg_start
META=$(pg_new_db clustergc)
ok "PostgreSQL server started in $PG_DIR"

# gc_node_start N TIMEOUT_S [OPTS]: node N (node_start, pg_lib.sh) with a session timeout of
# TIMEOUT_S and packs of 1 MiB, so that gc can delete whole packs online
gc_node_start() {
	node_start "$1" "session_timeout=$2,pack_max=1M${3:+,$3}"
}

# gc_run OUT: one `ckpt gc --meta`; its output in OUT, its status returned
gc_run() {
	"$CKPT" gc "$STORE" --meta "$META" >"$1" 2>&1
}

pack_bytes() {
	dir_bytes "$STORE/packs"
}

# A session timeout of 12 s for the savers (a heartbeat every 2 s): the machine is shared and
# loaded, and a saver whose heartbeat stalled past its timeout would be fenced (step 2 shows that
# on purpose)
# (node 2 without a chunk cache: its reads in step 1b come from the packs)
gc_node_start 1 12 || bail "node 1 did not mount"
gc_node_start 2 12 cache_size=0 || bail "node 2 did not mount"
gc_node_start 3 12 || bail "node 3 did not mount"
ok "three nodes mounted one store"

# ---------------------------------------------------------------- 1. gc while saves run
mkdir -p "$WORK/pool" "$WORK/expect"
for p in 0 1 2 3 4 5; do
	rand_file "$WORK/pool/p$p" $((3 * MiB + 4096 * p + 17)) # about 6 chunks each
done
mkdir "$T_DIR/n1/s"

# saver N ROUNDS: node N saves files s/N.K (K = 0..3) again and again, each one a pool blob
# (a dedup hit when another file holds it), a pool blob with a new random tail, or new random
# bytes, and deletes one now and then; what each file must hold is kept in $WORK/expect
saver() {
	local n=$1 rounds=$2 i k f p e=0
	for ((i = 0; i < rounds; i++)); do
		k=$((RANDOM % 4))
		f=s/$n.$k
		p=$WORK/pool/p$((RANDOM % 6))
		case $((RANDOM % 5)) in
		0)
			rm -f "$T_DIR/n$n/$f" || e=$((e + 1))
			rm -f "$WORK/expect/$n.$k"
			continue
			;;
		1)
			{ cat "$p" && head -c $((RANDOM * 8)) /dev/urandom; } >"$WORK/tmp.$n"
			;;
		2)
			head -c $((256 * 1024 + RANDOM)) /dev/urandom >"$WORK/tmp.$n"
			;;
		*)
			cp "$p" "$WORK/tmp.$n"
			;;
		esac
		# overwrite in place (O_TRUNC) and fsync, as a save does
		if cat "$WORK/tmp.$n" >"$T_DIR/n$n/$f" && sync "$T_DIR/n$n/$f"; then
			cp "$WORK/tmp.$n" "$WORK/expect/$n.$k"
		else
			echo "node $n: saving $f failed" >>"$WORK/errors"
			e=$((e + 1))
		fi
	done
	return $e
}

: >"$WORK/errors"
declare -a SAVERS=()
for n in 1 2 3; do
	saver $n 30 &
	SAVERS+=($!)
done
gcs=0
gcfail=0
while :; do
	running=0
	for p in "${SAVERS[@]}"; do
		[ -d "/proc/$p" ] && running=1
	done
	[ $running -eq 1 ] || break
	if gc_run "$T_DIR/gc.out"; then
		gcs=$((gcs + 1))
	else
		gcfail=$((gcfail + 1))
		indent "$T_DIR/gc.out"
	fi
	sleep 0.2
done
serr=0
for p in "${SAVERS[@]}"; do
	wait "$p" || serr=$((serr + 1))
done
note "gc ran $gcs times while the nodes saved"
indent "$T_DIR/gc.out"
check "every gc beside the saving nodes succeeded ($gcfail failed)" test $gcfail -eq 0
check "gc ran at least 3 times while the saves ran" test $gcs -ge 3
check "every save and delete of the three nodes succeeded" test $serr -eq 0 -a ! -s "$WORK/errors"
indent "$WORK/errors"
check "gc ran online beside them" grep -q '^mode: online' "$T_DIR/gc.out"

# once more after the saves, so that what they left is stamped and dropped
for i in 1 2 3; do
	gc_run "$T_DIR/gc.out" || not_ok "gc after the saves"
	sleep 3 # a heartbeat of every node (every 2 s) between two gc runs
done
bad=0
nfiles=0
for n in 1 2 3; do
	for k in 0 1 2 3; do
		r=$((n % 3 + 1)) # read through another node
		if [ -e "$WORK/expect/$n.$k" ]; then
			nfiles=$((nfiles + 1))
			cmp -s "$WORK/expect/$n.$k" "$T_DIR/n$r/s/$n.$k" ||
				{ bad=$((bad + 1)); note "s/$n.$k differs on node $r"; }
		elif [ -e "$T_DIR/n$r/s/$n.$k" ]; then
			bad=$((bad + 1))
			note "s/$n.$k was deleted but node $r has it"
		fi
	done
done
check "all $nfiles surviving files read back exact through another node, deleted ones stay gone ($bad wrong)" \
	test $bad -eq 0

# ---------------------------------------------------------------- 1b. a reader on another node
# node 2 reads a file that node 1 overwrites meanwhile (same size, other bytes): the version
# node 2 opened loses its last reference, and its open keeps its chunks from gc
rand_file "$WORK/readme" $((3 * MiB + 99))
rand_file "$WORK/readme2" $((3 * MiB + 99))
cp "$WORK/readme" "$T_DIR/n1/readme" && sync "$T_DIR/n1/readme"
cat >"$WORK/reader.py" <<'EOF'
import os, sys
path, want, want2 = sys.argv[1], open(sys.argv[2], "rb").read(), open(sys.argv[3], "rb").read()
fd = os.open(path, os.O_RDONLY)
first = os.pread(fd, 4096, 0)
print("ready", flush=True)
sys.stdin.readline()
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the rest from the daemon
got, off = [], 0
try:
    while True:
        b = os.pread(fd, 1 << 20, off)
        if not b:
            break
        got.append(b)
        off += len(b)
    # one whole version: the one it opened, or (were it to revalidate) the new one
    print("exact" if b"".join(got) in (want, want2) and first == want[:4096] else
          "differs (%d bytes)" % off, flush=True)
except OSError as e:
    print("error at %d: %s" % (off, os.strerror(e.errno)), flush=True)
EOF
mkfifo "$WORK/rgo"
"$PY" "$WORK/reader.py" "$T_DIR/n2/readme" "$WORK/readme" "$WORK/readme2" <"$WORK/rgo" >"$WORK/reader.out" 2>&1 &
reader=$!
exec 8>"$WORK/rgo"
for ((i = 0; i < 100; i++)); do
	grep -q ready "$WORK/reader.out" && break
	sleep 0.1
done
cat "$WORK/readme2" >"$T_DIR/n1/readme" && sync "$T_DIR/n1/readme"
for i in 1 2 3; do
	sleep 3
	gc_run "$T_DIR/gc.out" || not_ok "gc beside the reader"
done
echo go >&8
exec 8>&-
wait "$reader"
check "node 2 reads a file node 1 overwrote, across 3 gc runs, one version whole ($(tail -n 1 "$WORK/reader.out"))" \
	grep -qx exact "$WORK/reader.out"
dropped=0
for i in 1 2; do
	sleep 3
	gc_run "$T_DIR/gc.out" || not_ok "gc after the reader"
	dropped=$((dropped + $(sed -n 's/^chunks_dropped: //p' "$T_DIR/gc.out")))
done
check "once it closed, gc drops its chunks ($dropped)" test $dropped -ge 3

# ---------------------------------------------------------------- 1c. an orphan of a live node
# node 1 deletes a file it still has open (its orphan marker names node 1); node 3 mounts again
# meanwhile, which reaps only orphans of its own or of dead nodes, and gc runs: node 1 reads on
rand_file "$WORK/held" $((2 * MiB + 7))
cp "$WORK/held" "$T_DIR/n1/held" && sync "$T_DIR/n1/held"
rm -f "$WORK/rgo"
mkfifo "$WORK/rgo"
"$PY" "$WORK/reader.py" "$T_DIR/n1/held" "$WORK/held" "$WORK/held" <"$WORK/rgo" >"$WORK/reader.out" 2>&1 &
reader=$!
exec 8>"$WORK/rgo"
for ((i = 0; i < 100; i++)); do
	grep -q ready "$WORK/reader.out" && break
	sleep 0.1
done
rm -f "$T_DIR/n1/held"
node_stop 3 || not_ok "unmount node 3"
gc_node_start 3 12 || not_ok "node 3 mounts again"
for i in 1 2; do
	sleep 3
	gc_run "$T_DIR/gc.out" || not_ok "gc beside the orphan"
done
echo go >&8
exec 8>&-
wait "$reader"
check "node 1 reads the file it deleted while open, after node 3's mount and 2 gc runs ($(tail -n 1 "$WORK/reader.out"))" \
	grep -qx exact "$WORK/reader.out"

# space: delete everything saved, then gc until nothing more goes
rand_file "$WORK/extra" $((8 * MiB))
cp "$WORK/extra" "$T_DIR/n2/s/extra" && sync "$T_DIR/n2/s/extra"
before=$(pack_bytes)
rm -f "$T_DIR"/n1/s/*
after=$before
for i in 1 2 3 4; do
	sleep 3
	gc_run "$T_DIR/gc.out" || not_ok "gc after the deletes"
	after=$(pack_bytes)
done
indent "$T_DIR/gc.out"
note "pack bytes $before before the deletes, $after after 4 online gc runs"
check "online gc reclaimed most of the deleted files' packs" test $((after * 2)) -lt "$before"
for n in 1 2 3; do
	grep -q 'declared dead' "$T_DIR/node$n.log" && not_ok "node $n was declared dead"
done

# ---------------------------------------------------------------- 2. the fence
gc_node_start 4 2 || bail "node 4 did not mount"
ok "node 4 mounted with a session timeout of 2 s"
cp "$WORK/pool/p0" "$T_DIR/n1/keep0" && sync "$T_DIR/n1/keep0"
cp "$WORK/pool/p1" "$T_DIR/n1/victim" && sync "$T_DIR/n1/victim"
rand_file "$WORK/fresh" $((3 * MiB))
cat "$WORK/pool/p1" "$WORK/fresh" "$WORK/pool/p0" >"$WORK/fenced.want"
# the writer: writes p1 (dedup hits: at offset 0 it is cut as in its own file), fresh bytes (new
# chunks, pending on node 4) and p0,
# says "ready", waits for a line, then fsyncs and closes and reports what each returned
cat >"$WORK/writer.py" <<'EOF'
import os, sys
path, src = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
data = open(src, "rb").read()
for i in range(0, len(data), 1 << 20):
    os.write(fd, data[i:i + (1 << 20)])
print("ready", flush=True)
sys.stdin.readline()
res = []
for what, call in (("fsync", lambda: os.fsync(fd)), ("close", lambda: os.close(fd))):
    try:
        call()
        res.append(what + "=ok")
    except OSError as e:
        res.append(what + "=" + (os.strerror(e.errno) if e.errno else str(e)))
print(" ".join(res), flush=True)
EOF
mkfifo "$WORK/go"
"$PY" "$WORK/writer.py" "$T_DIR/n4/fenced" "$WORK/fenced.want" <"$WORK/go" >"$WORK/writer.out" 2>&1 &
writer=$!
exec 7>"$WORK/go"
for ((i = 0; i < 100; i++)); do
	grep -q ready "$WORK/writer.out" && break
	sleep 0.1
done
check "node 4's writer has its save in flight" grep -q ready "$WORK/writer.out"
# p1's chunks: node 4's save holds dedup hits on them; now their last file goes
rm -f "$T_DIR/n1/victim"
kill -STOP "${NODE_PID[4]}"
sleep 3
gc_run "$T_DIR/gc1.out" # suspects node 4 (no heartbeat for 2 s)
g1=$?
sleep 3 # more than node 4's timeout; and a heartbeat of every live node
gc_run "$T_DIR/gc2.out" # declares it dead, drops what only it could still reference
g2=$?
kill -CONT "${NODE_PID[4]}"
indent "$T_DIR/gc1.out"
indent "$T_DIR/gc2.out"
check "gc runs while node 4 is stopped" test $g1 -eq 0 -a $g2 -eq 0
check "gc first suspects node 4's session" \
	grep -q '^sessions_suspected: 1' "$T_DIR/gc1.out"
check "... and declares it dead at a pass more than its timeout later" \
	grep -q '^sessions_declared_dead: 1' "$T_DIR/gc2.out"
dropped=$(sed -n 's/^chunks_dropped: //p' "$T_DIR/gc2.out")
check "gc dropped the chunks of the deleted file node 4 had dedup hits on ($dropped)" \
	test "${dropped:-0}" -ge 1
echo go >&7
exec 7>&-
wait "$writer"
note "node 4's writer: $(tail -n 1 "$WORK/writer.out")"
check "node 4's fsync of the save in flight fails with EIO" \
	grep -q 'fsync=Input/output error' "$WORK/writer.out"
check "node 4's log names the reason" grep -q 'declared dead by gc' "$T_DIR/node4.log"
size=$(stat -c %s "$T_DIR/n1/fenced" 2>/dev/null || echo absent)
check "node 1 serves no part of it (size: $size)" test "$size" == absent -o "$size" == 0
if [ -e "$T_DIR/n4/fenced" ] && [ "$(stat -c %s "$T_DIR/n4/fenced")" != 0 ]; then
	cmp -s "$T_DIR/n4/fenced" "$WORK/fenced.want" 2>/dev/null
	check "node 4 serves either nothing or the exact bytes" test $? -eq 0
fi
check "the file that held p0 reads back exact" cmp -s "$WORK/pool/p0" "$T_DIR/n2/keep0"
rand_file "$WORK/after" $((2 * MiB + 5))
cat "$WORK/pool/p0" >>"$WORK/after"
ok=0
for ((i = 0; i < 50; i++)); do # the heartbeat thread registers the new session
	if cp "$WORK/after" "$T_DIR/n4/after" 2>/dev/null && sync "$T_DIR/n4/after" 2>/dev/null; then
		ok=1
		break
	fi
	sleep 0.2
done
check "node 4 saves again" test $ok -eq 1
check "... with a new session" grep -q 'new session [0-9a-f]* registered' "$T_DIR/node4.log"
check "... and node 2 reads that save exact" cmp -s "$WORK/after" "$T_DIR/n2/after"

# ---------------------------------------------------------------- 3. fsck
for n in 1 2 3 4; do
	node_stop "$n" || not_ok "unmount node $n"
done
"$CKPT" fsck "$STORE" --meta "$META" >"$T_DIR/fsck.out" 2>&1
check "ckpt fsck --meta finds the store consistent" grep -q ': ok$' "$T_DIR/fsck.out"
indent "$T_DIR/fsck.out"
gc_run "$T_DIR/gc.out"
check "gc with every node unmounted runs offline" grep -q '^mode: offline' "$T_DIR/gc.out"
check "after it the files read back: ckpt fsck --meta" \
	sh -c "'$CKPT' fsck '$STORE' --meta '$META' | grep -q ': ok\$'"
finish
