#!/usr/bin/env bash
# Several nodes, one store (docs/cluster.md): three ckptfs daemons stand in for three nodes on
# this machine, each with its own mount point, sharing one PostgreSQL database (a server this
# test starts in a temporary directory, pg_lib.sh) and one chunk directory ($STORE).
#   1. close-to-open across nodes: a file fsynced, or only closed, on one node reads back
#      byte-exact on the others right after, also where their kernels had cached the old version
#   2. the shards of one checkpoint written by ranks spread over the nodes: every node reads
#      the tp1_pp1 and tp2_pp2 views element-exact
#   3. dedup across nodes: a file another node already stored adds (almost) no pack bytes
#   4. the same path written from two nodes at once: one whole version wins
#   5. kill -9 of a node mid-save: no partial file is visible on the others; the node mounts
#      again; the chunks it left unindexed are reclaimed by ckpt gc (step 7)
#   6. a database restart: a save started while the server is down waits for it (it neither
#      fails nor hangs) and completes once it is back; every daemon reconnects
#   7. ckpt ls, check, verify and du reach the store through --meta with the nodes mounted;
#      stat, gc and fsck once they are unmounted (no
#      session is live, so gc is the whole offline one)
# gc while nodes are mounted, and its fence: t_cluster_gc.sh
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
# shellcheck source=pg_lib.sh
. "$(dirname "$0")/pg_lib.sh"
need fusermount3 findmnt mountpoint cmp sha256sum
need_py numpy

VL=$LIB_DIR/views_lib.py
pg_start
META=$(pg_new_db cluster)
ok "PostgreSQL server started in $PG_DIR"

# nodes n1..n3: node_start and node_stop (pg_lib.sh)

# ---------------------------------------------------------------- 1. close-to-open
node_start 1 || bail "node 1 did not mount"
node_start 2 || bail "node 2 did not mount"
node_start 3 || bail "node 3 did not mount"
ok "three daemons mounted one store"

rand_file "$WORK/a" $((3 * MiB + 12345))
cp "$WORK/a" "$T_DIR/n1/a" && sync "$T_DIR/n1/a"
check "a file fsynced on node 1 reads back on node 2" cmp -s "$WORK/a" "$T_DIR/n2/a"
check "... and on node 3" cmp -s "$WORK/a" "$T_DIR/n3/a"

rand_file "$WORK/b" $((MiB + 7))
cp "$WORK/b" "$T_DIR/n2/b" # closed, not fsynced: a node indexes at close
check "a file closed on node 2 reads back on node 3 at once" cmp -s "$WORK/b" "$T_DIR/n3/b"
bad=0
for i in 1 2 3 4 5; do
	rand_file "$WORK/b$i" $((64 * 1024 * i + i))
	cp "$WORK/b$i" "$T_DIR/n$((i % 3 + 1))/b$i"
	cmp -s "$WORK/b$i" "$T_DIR/n$(((i + 1) % 3 + 1))/b$i" || bad=$((bad + 1))
done
check "five more files closed on one node read back at once on another ($bad differ)" \
	test $bad -eq 0
# A file node 3 has looked at (its kernel holds the name, the size and pages), then rewritten
# longer on node 1, in place and by a rename into place (as savers do): node 3's next open sees
# the new version whole, not the size or the inode it had cached.
bad=0
for i in 1 2 3 4 5; do
	rand_file "$WORK/s$i" $((40 * 1024 * i + i))
	rand_file "$WORK/t$i" $((300 * 1024 * i + 3 * i))
	cp "$WORK/s$i" "$T_DIR/n1/s$i"
	cp "$WORK/s$i" "$T_DIR/n1/r$i"
	cmp -s "$WORK/s$i" "$T_DIR/n3/s$i" || bad=$((bad + 1))
	cmp -s "$WORK/s$i" "$T_DIR/n3/r$i" || bad=$((bad + 1))
	cp "$WORK/t$i" "$T_DIR/n1/s$i"
	cp "$WORK/t$i" "$T_DIR/n1/r$i.tmp" && mv "$T_DIR/n1/r$i.tmp" "$T_DIR/n1/r$i"
	cmp -s "$WORK/t$i" "$T_DIR/n3/s$i" || bad=$((bad + 1))
	cmp -s "$WORK/t$i" "$T_DIR/n3/r$i" || bad=$((bad + 1))
done
check "files node 3 had read, rewritten longer on node 1 (in place, by rename), read back whole at once on node 3 ($bad differ)" \
	test $bad -eq 0

# ---------------------------------------------------------------- 2. one checkpoint, three nodes
"$PY" "$VL" make-sharded "$WORK/ck" "$WORK/ck.spec" 7 2 2 1 || bail "make-sharded"
mkdir "$T_DIR/n1/ck"
k=0
for f in "$WORK"/ck/*.safetensors; do # rank k saves through node k % 3 + 1
	n=$((k % 3 + 1))
	cp "$f" "$T_DIR/n$n/ck/" && sync "$T_DIR/n$n/ck/$(basename "$f")" || not_ok "save $f via node $n"
	k=$((k + 1))
done
ok "8 shard files saved through 3 nodes"
for n in 1 2 3; do
	_py_tap "views on node $n" "$PY" "$VL" verify "$T_DIR/n$n" tp1_pp1,tp2_pp2 "$WORK/ck.spec" </dev/null
done

# ---------------------------------------------------------------- 3. dedup across nodes
before=$(du -sb "$STORE/packs" | cut -f1)
cp "$WORK/a" "$T_DIR/n3/a_again" && sync "$T_DIR/n3/a_again"
after=$(du -sb "$STORE/packs" | cut -f1)
note "packs grew by $((after - before)) bytes for a 3 MiB file node 1 already stored"
check "a file node 1 stored adds less than 64 KiB of packs when node 3 writes it again" \
	[ $((after - before)) -lt 65536 ]
check "... and reads back on node 1" cmp -s "$WORK/a" "$T_DIR/n1/a_again"

# ---------------------------------------------------------------- 4. one path, two writers
rand_file "$WORK/x1" $((6 * MiB))
rand_file "$WORK/x2" $((6 * MiB))
# (open without O_EXCL, as a save does; cp uses O_EXCL when it saw no file, and one of two
# racing cps gets EEXIST on any file system)
(cat "$WORK/x1" >"$T_DIR/n1/same" && sync "$T_DIR/n1/same") &
w1=$!
(cat "$WORK/x2" >"$T_DIR/n2/same" && sync "$T_DIR/n2/same") &
w2=$!
wait $w1
r1=$?
wait $w2
r2=$?
check "both writers of one path finished without error" test $r1 -eq 0 -a $r2 -eq 0
got=$(sha "$T_DIR/n3/same")
check "node 3 reads one whole version of the path both wrote" \
	test "$got" == "$(sha "$WORK/x1")" -o "$got" == "$(sha "$WORK/x2")"

# ---------------------------------------------------------------- 5. kill -9 mid-save
head -c $((400 * MiB)) /dev/urandom >"$T_DIR/n3/big" 2>/dev/null &
writer=$!
for ((i = 0; i < 50; i++)); do
	[ -e "$T_DIR/n1/big" ] && break
	sleep 0.1
done
sleep 0.3
kill -9 "${NODE_PID[3]}"
wait_pids_gone 10 "${NODE_PID[3]}"
wait "$writer" 2>/dev/null
_unmount "$T_DIR/n3"
size=$(stat -c %s "$T_DIR/n1/big" 2>/dev/null || echo absent)
check "after kill -9 of node 3 mid-save, node 1 sees no partial file (size: $size)" \
	test "$size" == absent -o "$size" == 0
node_start 3 || not_ok "node 3 mounts again after kill -9"
check "node 3 reads node 1's file after its restart" cmp -s "$WORK/a" "$T_DIR/n3/a"

# ---------------------------------------------------------------- 6. database restart mid-save
rand_file "$WORK/c" $((24 * MiB))
pg_server_stop fast || not_ok "stop the PostgreSQL server"
(cp "$WORK/c" "$T_DIR/n1/c" && sync "$T_DIR/n1/c") &
writer=$!
sleep 2
check "a save started while the database is down waits for it" test -d "/proc/$writer"
pg_server_start || bail "restart the PostgreSQL server"
wait "$writer"
check "... and completes once the database is back" test $? -eq 0
check "the file saved across the restart reads back on node 2" cmp -s "$WORK/c" "$T_DIR/n2/c"
rand_file "$WORK/d" $((2 * MiB))
cp "$WORK/d" "$T_DIR/n2/d" && sync "$T_DIR/n2/d"
check "node 2, idle during the restart, saves again (reconnected)" cmp -s "$WORK/d" "$T_DIR/n3/d"

# ---------------------------------------------------------------- 7. ckpt with --meta
# while the nodes are mounted: ls, check, verify and du reach the shared store
"$CKPT" ls "$STORE" --meta "$META" --json >"$T_DIR/ls.json" 2>&1
check "ckpt ls --meta lists the checkpoint the three nodes saved" \
	"$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); s=json.dumps(d); sys.exit(0 if '\"ck\"' in s or '/ck' in s else 1)" "$T_DIR/ls.json"
"$CKPT" check "$STORE" ck --meta "$META" >"$T_DIR/check.out" 2>&1
check "ckpt check --meta: every view of ck can be served" test $? -eq 0
indent "$T_DIR/check.out"
"$CKPT" verify "$STORE" --meta "$META" --no-progress >"$T_DIR/verify.out" 2>&1
check "ckpt verify --meta reads back every chunk, nodes mounted" test $? -eq 0
indent "$T_DIR/verify.out"
"$CKPT" du "$STORE" ck --meta "$META" >"$T_DIR/du.out" 2>&1
check "ckpt du --meta ck" test $? -eq 0
indent "$T_DIR/du.out"
for n in 1 2 3; do
	node_stop "$n" || not_ok "unmount node $n"
done
"$CKPT" stat "$STORE" --meta "$META" >"$T_DIR/stat.out" 2>&1
check "ckpt stat --meta reaches the store" grep -q '^files: ' "$T_DIR/stat.out"
indent "$T_DIR/stat.out"
unindexed=$(sed -n 's/^unindexed_bytes: //p' "$T_DIR/stat.out")
check "node 3's kill left unindexed chunks ($unindexed bytes)" test "${unindexed:-0}" -gt $MiB
"$CKPT" gc "$STORE" --live 100 --meta "$META" >"$T_DIR/gc.out" 2>&1
check "ckpt gc --live 100 --meta" test $? -eq 0
indent "$T_DIR/gc.out"
check "... ran offline (every node unmounted, no session left)" grep -q '^mode: offline' "$T_DIR/gc.out"
"$CKPT" stat "$STORE" --meta "$META" >"$T_DIR/stat.out" 2>&1
unindexed=$(sed -n 's/^unindexed_bytes: //p' "$T_DIR/stat.out")
check "gc reclaimed them (unindexed bytes now ${unindexed:-?})" test "${unindexed:-1}" -lt 4096
"$CKPT" fsck "$STORE" --meta "$META" >"$T_DIR/fsck.out" 2>&1
check "ckpt fsck --meta finds the store consistent" grep -q ': ok$' "$T_DIR/fsck.out"
indent "$T_DIR/fsck.out"
finish
