#!/bin/bash
# Logs and metrics (docs/user-guide.md section 4): MOUNT/.ckptfs/metrics parsed by a real
# Prometheus text-format parser (prometheus_client, pinned in tools/setup.sh), its counters moving
# by exactly what was written and read, histograms well formed, errors counted by op and errno;
# .ckptfs hidden from readdir and its name reserved; stamped log lines at the default level
# (mount, background summary, unmount summary, errors naming the file); -o log=FILE reopened on
# SIGHUP after a rename (logrotate) without stopping the daemon; -o syslog observed through a
# datagram socket bound over /dev/log in a private mount namespace.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" -eq 0 ] || bail "needs root: the syslog part binds a socket over /dev/log in a private mount namespace"
need unshare mount pgrep

# The interpreter with prometheus_client: PROM_PYTHON, else the tree's .venv (tools/setup.sh makes
# it; a VPATH copy such as tools/sanitize.sh's finds the checkout's), else $PY.
PROM_PY=
for c in "${PROM_PYTHON:-}" "$LIB_DIR/../../.venv/bin/python" \
	"$(git -C "$LIB_DIR" rev-parse --show-toplevel 2>/dev/null)/.venv/bin/python" "$PY"; do
	if [ -n "$c" ] && [ -x "$c" ] && "$c" -c "import prometheus_client" 2>/dev/null; then
		PROM_PY=$c
		break
	fi
done
[ -n "$PROM_PY" ] || bail "no python with prometheus_client (tools/setup.sh installs it into .venv; or set PROM_PYTHON)"
note "parser: $PROM_PY, prometheus_client $("$PROM_PY" -c 'import importlib.metadata as m; print(m.version("prometheus_client"))')"

LOG=$WORK/daemon.log
start_daemon -o log="$LOG" || bail "mount with -o log=$LOG"
PID=$(daemon_pids "$STORE")
note "daemon pid $PID"

# metrics NAME: save a copy of the metrics file as $WORK/NAME.prom
metrics() {
	cat "$MNT/.ckptfs/metrics" >"$WORK/$1.prom"
}

# ---------------------------------------------------------------- .ckptfs: hidden, reserved
ls -a "$MNT" >"$WORK/ls_root"
check ".ckptfs is not listed by ls -a of the root" bash -c "! grep -qx .ckptfs '$WORK/ls_root'"
assert_eq "metrics" "$(ls "$MNT/.ckptfs")" "ls MOUNT/.ckptfs lists the metrics file"
assert_eq "0 444 directory 555" \
	"$(stat -c '%s %a' "$MNT/.ckptfs/metrics") $(stat -c '%F %a' "$MNT/.ckptfs")" \
	"the metrics file has size 0 and mode 0444, the directory 0555"
check_fails "mkdir MOUNT/.ckptfs fails" mkdir "$MNT/.ckptfs"
cp "$T_DIR/check.out" "$WORK/mkdir.out"
check "... with EEXIST" grep -q "File exists" "$WORK/mkdir.out"
check_fails "creating .ckptfs exclusively fails" \
	"$PY" -c "import os, sys; os.open(sys.argv[1], os.O_CREAT | os.O_EXCL | os.O_WRONLY)" "$MNT/.ckptfs"
echo data >"$WORK/small"
cp "$WORK/small" "$MNT/small"
check_fails "renaming a file onto .ckptfs fails" mv -T "$MNT/small" "$MNT/.ckptfs"
check_fails "renaming a file into .ckptfs fails" mv "$MNT/small" "$MNT/.ckptfs/x"
check_fails "removing .ckptfs fails" rmdir "$MNT/.ckptfs"
check_fails "writing the metrics file fails" bash -c "echo x >'$MNT/.ckptfs/metrics'"
cp "$T_DIR/check.out" "$WORK/write.out"
check "... with EROFS" grep -q "Read-only file system" "$WORK/write.out"
check_fails "removing the metrics file fails" rm -f "$MNT/.ckptfs/metrics"
check "the file renamed onto .ckptfs is still in place" cmp "$WORK/small" "$MNT/small"

# ---------------------------------------------------------------- counters move by the work done
metrics m0
# 5 MiB + 12345 bytes of random data (incompressible), a copy of it (every chunk a dedup hit),
# and 4 MiB of text that compresses; each read back once
SIZE=$((5 * MiB + 12345))
rand_file "$WORK/rand" $SIZE
"$PY" -c "import sys; sys.stdout.write(''.join(f'line {i} of a log that compresses well\n' for i in range(110000)))" >"$WORK/text"
TSIZE=$(stat -c %s "$WORK/text")
cp "$WORK/rand" "$MNT/rand"
cp "$WORK/rand" "$MNT/rand.copy"
cp "$WORK/text" "$MNT/text"
cat "$MNT/rand" "$MNT/text" >/dev/null
stat "$MNT/missing-1" "$MNT/missing-2" >/dev/null 2>&1
"$PY" -c "import os, sys
try:
    os.open(sys.argv[1], os.O_WRONLY)
except OSError:
    pass" "$MNT/.ckptfs/metrics"
metrics m1
# background compression runs once writes pause for a second: wait (up to 30 s) for its queue
# to drain and for every stored byte to have been through compression (the queue is empty
# while a batch taken from it is still being compressed)
for ((i = 0; i < 150; i++)); do
	metrics m2
	cin=$(awk '/^ckptfs_compress_input_bytes_total\{/ { s += $2 } END { printf "%d", s }' "$WORK/m2.prom")
	grep -qx 'ckptfs_background_queued_chunks 0' "$WORK/m2.prom" &&
		grep -q '^ckptfs_background_chunks_total{result="compressed"} [1-9]' "$WORK/m2.prom" &&
		[ "${cin:-0}" -ge $((SIZE + TSIZE)) ] && break
	sleep 0.2
done

PY=$PROM_PY py_checks "metrics parsed with prometheus_client" "$WORK" "$SIZE" "$TSIZE" <<'EOF'
import re, sys
from prometheus_client.parser import text_string_to_metric_families

work, size, tsize = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def tap(cond, desc, detail=""):
    print(("ok - " if cond else "not ok - ") + desc)
    if not cond and detail:
        print(detail)

def load(name):
    text = open(f"{work}/{name}.prom").read()
    fams = list(text_string_to_metric_families(text))  # raises on malformed text
    return text, {f.name: f for f in fams}

def val(fams, fam, **labels):
    """the value of fam's sample (its name: fam, or fam_total for counters) with exactly labels"""
    f = fams[fam]
    for s in f.samples:
        if s.labels == labels and s.name in (fam, fam + "_total"):
            return s.value
    raise KeyError(f"{fam}{labels}")

t0, m0 = load("m0")
t1, m1 = load("m1")
t2, m2 = load("m2")
tap(True, "three renderings parse (prometheus_client text_string_to_metric_families)")
types = {n: f.type for n, f in m1.items()}
want = {"ckptfs_written_bytes": "counter", "ckptfs_read_bytes": "counter",
        "ckptfs_chunks": "counter", "ckptfs_chunk_bytes": "counter",
        "ckptfs_stored_bytes": "counter", "ckptfs_files_committed": "counter",
        "ckptfs_compress_input_bytes": "counter", "ckptfs_compress_output_bytes": "counter",
        "ckptfs_chunk_cache_hits": "counter", "ckptfs_chunk_cache_misses": "counter",
        "ckptfs_background_queued_chunks": "gauge", "ckptfs_unindexed_files": "gauge",
        "ckptfs_start_time_seconds": "gauge",
        "ckptfs_fuse_request_duration_seconds": "histogram", "ckptfs_fuse_errors": "counter"}
bad = {n: (t, types.get(n)) for n, t in want.items() if types.get(n) != t}
tap(not bad, f"the {len(want)} families are there with their types", f"wrong: {bad}")
# each family is declared once (a family split in two would be invalid)
decl = re.findall(r"^# TYPE (\S+) ", t1, re.M)
tap(len(decl) == len(set(decl)), f"every family has one TYPE line ({len(decl)})")

d = lambda fam, **l: val(m1, fam, **l) - val(m0, fam, **l)
tap(d("ckptfs_written_bytes") == 2 * size + tsize,
    f"written bytes moved by exactly what was written ({2 * size + tsize})",
    f"moved by {d('ckptfs_written_bytes')}")
tap(d("ckptfs_read_bytes") == size + tsize,
    f"read bytes moved by exactly what was read ({size + tsize}; not the metrics file's own reads)",
    f"moved by {d('ckptfs_read_bytes')}")
tap(d("ckptfs_chunk_bytes", result="dedup") == size,
    f"the copy's {size} bytes are dedup hits", f"dedup bytes moved by {d('ckptfs_chunk_bytes', result='dedup')}")
tap(d("ckptfs_chunk_bytes", result="stored") == size + tsize,
    "the original and the text were stored", f"stored moved by {d('ckptfs_chunk_bytes', result='stored')}")
tap(d("ckptfs_chunks", result="dedup") >= 1 and d("ckptfs_chunks", result="stored") >= 2,
    "chunk counts moved")
tap(d("ckptfs_stored_bytes") >= d("ckptfs_chunk_bytes", result="stored") * 0.5,
    "stored bytes counted for the new chunks")
cin = val(m2, "ckptfs_compress_input_bytes", stage="background") + val(m2, "ckptfs_compress_input_bytes", stage="inline")
cout = val(m2, "ckptfs_compress_output_bytes", stage="background") + val(m2, "ckptfs_compress_output_bytes", stage="inline")
tap(cin >= size + tsize and cout < cin,
    f"compression: {cin:.0f} bytes in, {cout:.0f} out (ratio {cin / max(cout, 1):.2f}) once background work ran")
tap(val(m2, "ckptfs_background_chunks", result="compressed") >= 1 and
    val(m2, "ckptfs_background_chunks", result="incompressible") >= 1,
    "background work compressed the text's chunks and left the random ones raw")
tap(val(m2, "ckptfs_background_queued_chunks") == 0, "the backlog drained to 0")
tap(val(m1, "ckptfs_chunk_cache_hits") + val(m1, "ckptfs_chunk_cache_misses") > 0, "chunk cache counted loads")

# histograms: per op, buckets sorted by le, cumulative, ending at +Inf == _count
h = m1["ckptfs_fuse_request_duration_seconds"]
ops = {}
for s in h.samples:
    ops.setdefault(s.labels["op"], []).append(s)
ok = True
for op, ss in ops.items():
    b = [(float(s.labels["le"]), s.value) for s in ss if s.name.endswith("_bucket")]
    cnt = [s.value for s in ss if s.name.endswith("_count")]
    sm = [s.value for s in ss if s.name.endswith("_sum")]
    les = [x for x, _ in b]
    if (les != sorted(les) or les[-1] != float("inf") or len(b) < 10 or
            any(b[i][1] > b[i + 1][1] for i in range(len(b) - 1)) or cnt != [b[-1][1]] or
            len(sm) != 1 or sm[0] < 0):
        ok = False
        print(f"# op {op}: buckets {b} count {cnt} sum {sm}")
tap(ok and len(ops) >= 20, f"{len(ops)} per-op histograms are well formed")
for op in ("lookup", "getattr", "open", "create", "read", "write", "flush", "release"):
    c1 = [s.value for s in ops[op] if s.name.endswith("_count")][0]
    c0 = [s.value for s in m0["ckptfs_fuse_request_duration_seconds"].samples
          if s.labels.get("op") == op and s.name.endswith("_count")][0]
    tap(c1 > c0, f"op {op} was timed ({c1 - c0:.0f} more)")
w = [s.value for s in ops["write"] if s.name.endswith("_count")][0]
tap(w >= (2 * size + tsize) / (1 << 20), f"at least one write request per MiB written ({w:.0f})")
errs = {(s.labels["op"], s.labels["errno"]): s.value for s in m1["ckptfs_fuse_errors"].samples}
tap(errs.get(("lookup", "ENOENT"), 0) >= 2, "lookups of missing names counted as lookup/ENOENT",
    f"errors: {errs}")
tap(errs.get(("open", "EROFS"), 0) >= 1, "the open of the metrics file for writing counted as open/EROFS",
    f"errors: {errs}")
EOF

# ---------------------------------------------------------------- the log: stamped, at info
check "the daemon is still mounted" mountpoint -q "$MNT"
# logrotate: rename the file, SIGHUP; the daemon keeps running and writes a new file
mv "$LOG" "$LOG.1"
kill -HUP "$PID"
for ((i = 0; i < 50; i++)); do [ -e "$LOG" ] && break; sleep 0.1; done
check "SIGHUP made the daemon reopen its log file by name (a new file)" test -e "$LOG"
check "SIGHUP did not stop the daemon" mountpoint -q "$MNT"
check "... which still serves files" cmp "$WORK/text" "$MNT/text"
stop_daemon || fail "unmount"

PY=$PROM_PY py_checks "log lines" "$LOG.1" "$LOG" "$PID" "$STORE" "$MNT" "$((2 * SIZE + TSIZE + 5))" <<'EOF'
import re, sys
old, new, pid, store, mnt, written = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])

def tap(cond, desc, detail=""):
    print(("ok - " if cond else "not ok - ") + desc)
    if not cond and detail:
        print(detail)

line_re = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ckptfs\[(\d+)/(\d+)\] (error|warning|info|debug): ")
a = open(old).read().splitlines()
b = open(new).read().splitlines()
for name, lines in (("the renamed log", a), ("the reopened log", b)):
    bad = [l for l in lines if not line_re.match(l)]
    tap(lines and not bad, f"every line of {name} is stamped: time, ckptfs[pid/tid], level ({len(lines)} lines)",
        "\n".join(bad[:5]))
    tap(all(line_re.match(l).group(1) == pid for l in lines if line_re.match(l)), f"{name}: the daemon's pid")
tids = {line_re.match(l).group(2) for l in a + b if line_re.match(l)}
tap(len(tids) >= 2, f"lines come from several threads, each with its id ({sorted(tids)})")
tap(any(f"info: mounted {store} on {mnt}: " in l for l in a), "the mount is logged at info (before the rename)")
tap(not any("unmounted" in l for l in a), "nothing went to the renamed file after the SIGHUP")
um = [l for l in b if f"info: unmounted {store} from {mnt} after " in l]
tap(len(um) == 1, "the unmount is logged at info in the new file")
tap(um and f"wrote {written} bytes" in um[0] and "files committed" in um[0] and "dedup ratio" in um[0]
    and "compressed" in um[0], f"the unmount line summarizes the session (wrote {written} bytes, ...)",
    um[0] if um else "")
tap(any(re.search(r"info: \S+: background work, \d+ pass(es)? in \d+ s: compressed [1-9]\d* chunks", l)
        for l in a + b), "a background pass is summarized at info")
EOF

# ---------------------------------------------------------------- a failure is logged with the file
# A file whose chunk is damaged in its pack: its read fails with EIO, logged at the default level
# as an error naming the file, and counted as read/EIO.  (t_corrupt.sh checks the damage itself.)
# Random data is stored raw, so its bytes are found in the pack file and one is flipped.
STORE=$T_DIR/store2
LOG2=$WORK/daemon2.log
start_daemon -o log="$LOG2",nobackground || bail "mount with -o log=$LOG2"
rand_file "$WORK/victim" $((1 * MiB))
cp "$WORK/victim" "$MNT/victim"
stop_daemon || fail "unmount"
check "flip a byte of the file's data in its pack" "$PY" - "$WORK/victim" "$STORE/packs" <<'PYEOF'
import glob, sys
want = open(sys.argv[1], "rb").read()[4096:4096 + 64]
for p in glob.glob(sys.argv[2] + "/*.ckpk"):
    data = open(p, "rb").read()
    at = data.find(want)
    if at >= 0:
        with open(p, "r+b") as f:
            f.seek(at + 10)
            f.write(bytes([data[at + 10] ^ 0xFF]))
        sys.exit(0)
sys.exit("the file's bytes are in no pack")
PYEOF
start_daemon -o log="$LOG2" || bail "remount with -o log=$LOG2"
check_fails "reading the damaged file fails" cat "$MNT/victim"
metrics m3
stop_daemon || fail "unmount"
check "the failed read is logged as an error naming the file and the reason" \
	grep -qE '^[0-9T:.-]+Z ckptfs\[[0-9]+/[0-9]+\] error: /victim: read of [0-9]+ bytes at offset [0-9]+ failed: Input/output error' "$LOG2"
check "errors by kind count it (op read, errno EIO)" grep -qE '^ckptfs_fuse_errors_total\{op="read",errno="EIO"\} [1-9]' "$WORK/m3.prom"

# ---------------------------------------------------------------- -o syslog
# syslog(3) writes datagrams to /dev/log.  In a private mount namespace a socket of this test is
# bound over /dev/log (over a placeholder file when the machine has none, removed afterwards);
# the daemon runs in that namespace and everything it sends is read here.
SOCK=$T_DIR/devlog.sock
"$PY" - "$SOCK" "$WORK/syslog.txt" <<'EOF' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(0.5)
out = open(sys.argv[2], "w")
end = time.time() + 60
while time.time() < end:
    try:
        m = s.recv(65536).decode(errors="replace")
    except socket.timeout:
        continue
    out.write(m.rstrip("\n") + "\n")
    out.flush()
    if "unmounted" in m:
        break
EOF
LISTENER=$!
on_exit "kill $LISTENER 2>/dev/null || true"
for ((i = 0; i < 50; i++)); do [ -S "$SOCK" ] && break; sleep 0.1; done
PLACEHOLDER=0
if [ ! -e /dev/log ] && [ ! -L /dev/log ]; then
	: >/dev/log && PLACEHOLDER=1
	on_exit "if [ -f /dev/log ] && [ ! -s /dev/log ]; then rm -f /dev/log; fi"
fi
STORE3=$T_DIR/store3
MNT3=$T_DIR/mnt3
mkdir -p "$MNT3"
# In a chroot "/" is not a mount point and unshare cannot make it private ("cannot change root
# filesystem propagation"): the namespace then keeps the propagation it inherits, and /dev (a
# mount point there too) is made private in it before anything is bound over /dev/log.
PROPAGATION=private
unshare -m --propagation private true 2>/dev/null || PROPAGATION=unchanged
timeout -k 5 60 unshare -m --propagation "$PROPAGATION" bash -s "$CKPTFS" "$STORE3" "$MNT3" \
	"$SOCK" "$PROPAGATION" >"$WORK/ns.out" 2>&1 <<'EOF'
set -u
ckptfs=$1 store=$2 mnt=$3 sock=$4 propagation=$5
if [ "$propagation" != private ]; then
	mount --make-private /dev || { echo "cannot make /dev private in the namespace"; exit 1; }
fi
mount --bind "$sock" /dev/log || { echo "cannot bind $sock over /dev/log"; exit 1; }
"$ckptfs" "$store" "$mnt" -o syslog || { echo "mount with -o syslog failed"; exit 1; }
pid=$(pgrep -f "^$ckptfs $store ")
echo "pid $pid"
echo hello >"$mnt/hello"
cat "$mnt/hello" >/dev/null
fusermount3 -u "$mnt"
for ((i = 0; i < 100; i++)); do [ -d "/proc/$pid" ] || exit 0; sleep 0.1; done
echo "daemon $pid did not exit"
exit 1
EOF
rc=$?
[ $PLACEHOLDER -eq 1 ] && rm -f /dev/log
indent "$WORK/ns.out"
assert_eq 0 "$rc" "a daemon with -o syslog mounted, served and unmounted in a private namespace"
wait "$LISTENER"
SPID=$(sed -n 's/^pid //p' "$WORK/ns.out")
indent "$WORK/syslog.txt"
# <30> is facility daemon (3) * 8 + priority info (6)
check "syslog got the mount at facility daemon, priority info, from ckptfs[PID]" \
	grep -qE "^<30>.* ckptfs\[$SPID\]: \[[0-9]+\] info: mounted $STORE3 on $MNT3: " "$WORK/syslog.txt"
check "syslog got the unmount summary at daemon.info" \
	grep -qE "^<30>.* ckptfs\[$SPID\]: \[[0-9]+\] info: unmounted $STORE3 from $MNT3 after .* wrote 6 bytes" "$WORK/syslog.txt"
check "nothing was logged to STORE/ckptfs.log with -o syslog" test ! -e "$STORE3/ckptfs.log"

finish
