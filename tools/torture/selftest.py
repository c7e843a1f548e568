"""Checks of the torture suite's own checkers, so that a pass means something: the crash
models flag lost and torn files, the shim logs what a program does and the replay drops what
was not synced, and the damage reader flags wrong bytes.  `tools/torture/run --selftest`.
Prints TAP lines; returns the number of failed checks.
"""
import os
import shutil
import subprocess
import sys
import tempfile

import damage
import powerlog
import workload
from tlib import sha

FAILED = []


def tap(cond, desc):
    print(("ok - " if cond else "not ok - ") + "selftest: " + desc, flush=True)
    if not cond:
        FAILED.append(desc)


def events(steps):
    """steps: (kind, op, ok) with op a description tuple (made unique by id)."""
    ev = workload.Events()
    ids = {}
    for kind, key, desc, ok in steps:
        if kind == "S":
            ids[key] = ev.new_op(desc)
        ev.emit(kind, ids[key], ok)
    return ev


def verdict(ev, model, path, got):
    m = workload.check(ev, model)
    ok, old = workload.allowed(m, path)
    if got in ok:
        return "ok"
    if got in old or got == workload.ABSENT:
        return "lost"
    return "wrong"


def models():
    v1, v2, junk = sha(b"one"), sha(b"two"), sha(b"torn")
    E = workload.EMPTY

    def S(k, d):
        return ("S", k, d, True)

    def E_(k, ok=True):
        return ("E", k, None, ok)
    # create, write, close: no fsync
    base = [S(1, ("open", "f", 1, True, True)), E_(1), S(2, ("close", 1, v1)), E_(2)]
    ev = events(base)
    tap(verdict(ev, "kill", "f", E) == "ok", "kill: a closed, unsynced new file may be empty")
    tap(verdict(ev, "kill", "f", v1) == "ok", "kill: ... or hold what was closed")
    tap(verdict(ev, "kill", "f", workload.ABSENT) == "lost",
        "kill: ... but a create that returned survives a kill")
    tap(verdict(ev, "power", "f", workload.ABSENT) == "ok",
        "power: an unsynced create may be lost")
    tap(verdict(ev, "kill", "f", junk) == "wrong", "kill: other bytes are wrong")
    # fsync v1, then rewrite v2 and close
    ev = events(base + [S(3, ("open", "f", 1, False, False)), E_(3), S(4, ("fsync", 1, v1)),
                        E_(4), S(5, ("close", 1, v2)), E_(5)])
    tap(verdict(ev, "power", "f", v1) == "ok", "power: the fsynced version survives")
    tap(verdict(ev, "power", "f", v2) == "ok", "power: ... or the later closed one")
    tap(verdict(ev, "power", "f", E) == "lost", "power: empty after an fsync is lost")
    tap(verdict(ev, "power", "f", workload.ABSENT) == "lost",
        "power: the fsync made the create durable")
    # an fsync in flight (no E) does not make its version durable
    ev = events(base + [S(3, ("fsync", 1, v2))])
    tap(verdict(ev, "kill", "f", v1) == "ok" and verdict(ev, "kill", "f", v2) == "ok",
        "kill: an fsync in flight: old or new")
    # rename after a close indexes the content (kill); a dir fsync makes it durable (power)
    ev = events(base + [S(3, ("rename", "f", "g", 1)), E_(3)])
    tap(verdict(ev, "kill", "g", v1) == "ok" and verdict(ev, "kill", "g", E) == "lost",
        "kill: a rename returned after the close: the content survives")
    tap(verdict(ev, "kill", "f", v1) == "lost", "kill: ... and the old name is gone")
    tap(verdict(ev, "power", "g", workload.ABSENT) == "ok",
        "power: an unsynced rename may be lost")
    ev = events(base + [S(3, ("rename", "f", "g", 1)), E_(3), S(4, ("dirfsync", "")), E_(4)])
    tap(verdict(ev, "power", "g", v1) == "ok" and verdict(ev, "power", "g", E) == "lost" and
        verdict(ev, "power", "f", v1) == "lost",
        "power: rename then directory fsync: new name with the content, old name gone")


def shim_replay(shim, tmp):
    """A child process writes files through the shim; the replay must drop what it did not
    sync."""
    root = os.path.join(tmp, "root")
    os.makedirs(root)
    with open(os.path.join(root, "old"), "wb") as f:
        f.write(b"old content")
    base = os.path.join(tmp, "base")
    shutil.copytree(root, base)
    inos = powerlog.base_inodes(root)
    logp = os.path.join(tmp, "log")
    prog = r"""
import os, sys
r = sys.argv[1]
def put(name, data, sync):
    fd = os.open(os.path.join(r, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, data)
    if sync:
        os.fsync(fd)
    os.close(fd)
def dsync():
    fd = os.open(r, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
put("synced", b"A" * 10000, True)
dsync()
put("unsynced", b"B" * 10000, False)
fd = os.open(os.path.join(r, "old"), os.O_WRONLY)
os.pwrite(fd, b"XYZ", 0)
os.close(fd)
put("tmp", b"C" * 5000, True)
os.rename(os.path.join(r, "tmp"), os.path.join(r, "renamed"))
dsync()
put("tmp2", b"D" * 5000, True)
os.rename(os.path.join(r, "tmp2"), os.path.join(r, "renamed2"))
"""
    env = dict(os.environ, LD_PRELOAD=shim, TORTURE_ROOT=root, TORTURE_LOG=logp)
    p = subprocess.run([sys.executable, "-c", prog, root], env=env)
    tap(p.returncode == 0, "a program runs under the shim")
    lg = powerlog.Log(logp)
    types = [r.type for r in lg.recs]
    tap(types.count(powerlog.R_WRITE) == 5 and types.count(powerlog.R_RENAME) == 2,
        "the shim logs every write and rename")
    out = os.path.join(tmp, "out")

    def state():
        return {n: open(os.path.join(out, n), "rb").read() for n in sorted(os.listdir(out))}
    import random
    powerlog.replay(lg, base, inos, out, len(lg.recs), "drop", random.Random(1))
    st = state()
    tap(st.get("synced") == b"A" * 10000, "replay: an fsynced file survives")
    tap(st.get("unsynced") in (None, b""), "replay: an unsynced write is dropped")
    tap(st.get("old") == b"old content", "replay: an unsynced overwrite is dropped")
    tap(st.get("renamed") == b"C" * 5000 and "tmp" not in st,
        "replay: a rename followed by a directory fsync survives")
    tap("renamed2" not in st and st.get("tmp2") in (None, b"D" * 5000),
        "replay (drop): a rename without a directory fsync is dropped")
    shutil.rmtree(out)
    first_rename = types.index(powerlog.R_RENAME)
    powerlog.replay(lg, base, inos, out, first_rename, "drop", random.Random(1))
    st = state()
    tap("renamed" not in st and st.get("synced") == b"A" * 10000,
        "replay at an earlier cut: later changes are not there")
    lg.close()


def reader(tmp):
    d = damage.DamageSuite.__new__(damage.DamageSuite)
    p = os.path.join(tmp, "f")
    want = os.urandom(300000)
    with open(p, "wb") as f:
        f.write(want)
    tap(d.read_check(p, want) == "ok", "damage reader: right bytes pass")
    bad = bytearray(want)
    bad[150000] ^= 1
    with open(p, "wb") as f:
        f.write(bad)
    tap(d.read_check(p, want) not in ("ok", "eio", "missing"),
        "damage reader: one wrong byte is caught")


def main(shim):
    tmp = tempfile.mkdtemp(prefix="ckptfs-torture-selftest.")
    try:
        models()
        shim_replay(shim, tmp)
        reader(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return len(FAILED)
