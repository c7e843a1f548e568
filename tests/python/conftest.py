"""Shared fixtures of the ckptfs Python tests (tests/python).

Two helpers are shared by every test module:

``ckptfs_mount`` (pytest fixture) -> Mount
    Starts the daemon built in this repository (``<repo>/fs/ckptfs``, found relative to this
    file; ``$CKPTFS`` overrides it) in the foreground as ``ckptfs STORE MNT -f`` with STORE and
    MNT in the test's tmp dir, waits until MNT is a ckptfs mount and yields a ``Mount`` with
    ``.store`` and ``.mnt`` (pathlib.Path), ``.log`` (the daemon's output file), ``.proc``
    (its Popen), ``.kill()`` (SIGKILL the daemon and detach the dead mount, for crash tests)
    and ``.restart()`` (mount the same store again).  It builds nothing: run ``make`` first.
    On teardown, even when the test failed, it unmounts (``fusermount3 -u`` retried, then
    ``fusermount3 -uz`` as the last resort) and stops the daemon (SIGTERM, then SIGKILL).

``run_ranks(world, fn, *args, timeout=120, expect_exit=None, env=None) -> list``
    A plain function: ``from conftest import run_ranks``.  Runs ``fn(rank, world, *args)`` in
    ``world`` fresh Python processes, each with torch.distributed initialized on gloo
    (MASTER_ADDR 127.0.0.1, a free port; RANK, WORLD_SIZE, LOCAL_RANK set; OMP_NUM_THREADS=1),
    and returns the ranks' return values (pickled back) in rank order.  ``fn`` must be
    importable: a module-level function of a test module (or any importable module); ``args``
    and the return values must be picklable.  A rank that raises, or exits without a result,
    fails the test with that rank's traceback and the tail of its output; the other ranks are
    then given a few seconds and killed.  After ``timeout`` seconds every rank still running
    is killed (SIGKILL to its process group) and the test fails naming them.
    ``expect_exit={rank: code}`` declares ranks that are meant to die (e.g. ``{1: -9}`` for a
    rank that SIGKILLs itself); their value in the result list is None.
    ``env``: extra environment variables for every rank.
"""
from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CKPTFS = Path(os.environ.get("CKPTFS", REPO / "fs" / "ckptfs"))
PYPKG = REPO / "core" / "trainer" / "python"

# The package is importable in the tests and in every rank without an install.
if str(PYPKG) not in sys.path:
    sys.path.insert(0, str(PYPKG))


# ------------------------------------------------------------------------------------ mounts

def _mount_fstype(mnt: Path):
    """The fstype of the mount at exactly mnt (from /proc/self/mountinfo), or None."""
    from ckptfs._mount import fstype_at   # here, not at collection: it loads libckptfs
    return fstype_at(os.path.realpath(mnt))


class Mount:
    def __init__(self, base: Path):
        self.base = base
        self.store = base / "store"
        self.mnt = base / "mnt"
        self.log = base / "daemon.log"
        self.proc = None
        self.mnt.mkdir(parents=True, exist_ok=True)

    def start(self, *opts: str, timeout: float = 15.0):
        if not CKPTFS.exists():
            raise RuntimeError(f"{CKPTFS}: the daemon is not built (run make)")
        logf = open(self.log, "ab")
        cmd = [str(CKPTFS), str(self.store), str(self.mnt), "-f", *opts]
        self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        logf.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _mount_fstype(self.mnt) == "fuse.ckptfs":
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        log = self.log.read_text(errors="replace")
        self.stop()
        raise RuntimeError(f"ckptfs {self.store} {self.mnt}: not mounted "
                           f"(exit {self.proc.returncode}); log:\n{log}")

    def _unmount(self):
        for _ in range(50):
            if _mount_fstype(self.mnt) is None:
                return
            subprocess.run(["fusermount3", "-u", str(self.mnt)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if _mount_fstype(self.mnt) is None:
                return
            time.sleep(0.1)
        subprocess.run(["fusermount3", "-uz", str(self.mnt)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self):
        """Unmounts and waits for the daemon (it flushes the store on exit)."""
        self._unmount()
        p = self.proc
        if p is not None and p.poll() is None:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.terminate()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.proc = None

    def kill(self):
        """SIGKILLs the daemon (a crash) and detaches the dead mount."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        if _mount_fstype(self.mnt) is not None:
            subprocess.run(["fusermount3", "-uz", str(self.mnt)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def restart(self, *opts: str):
        self.stop()
        return self.start(*opts)


@pytest.fixture
def ckptfs_mount(tmp_path):
    m = Mount(tmp_path / "ckptfs")
    try:
        m.start()
        yield m
    finally:
        m.stop()


# ------------------------------------------------------------------------------------- ranks

_CHILD = textwrap.dedent("""
    import importlib, os, pickle, sys, traceback
    job, rank = sys.argv[1], int(sys.argv[2])
    out = os.path.join(job, "result%d.pkl" % rank)
    def put(obj):
        tmp = out + ".tmp"
        with open(tmp, "wb") as f:
            pickle.dump(obj, f)
        os.replace(tmp, out)
    try:
        with open(os.path.join(job, "call.pkl"), "rb") as f:
            paths, mod, qual, world, args = pickle.load(f)
        for p in reversed(paths):
            if p not in sys.path:
                sys.path.insert(0, p)
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world)
        fn = importlib.import_module(mod)
        for part in qual.split("."):
            fn = getattr(fn, part)
        value = fn(rank, world, *args)
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass
        put(("ok", value))
    except BaseException:
        put(("error", traceback.format_exc()))
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(0)
""")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 4000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-n:].decode(errors="replace")


def _killpg(p: subprocess.Popen):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_ranks(world, fn, *args, timeout=120, expect_exit=None, env=None):
    """Runs fn(rank, world, *args) in `world` gloo processes; see the module docstring."""
    expect_exit = dict(expect_exit or {})
    mod, qual = fn.__module__, fn.__qualname__
    if "<locals>" in qual or mod == "__main__":
        raise ValueError(f"run_ranks: {mod}.{qual} is not importable (define it at module level)")
    paths = [str(PYPKG), str(HERE)]
    modfile = getattr(sys.modules.get(mod), "__file__", None)
    if modfile:
        paths.append(str(Path(modfile).resolve().parent))
    paths += [p for p in sys.path if p]
    job = Path(tempfile.mkdtemp(prefix="ckptfs-ranks-"))
    with open(job / "call.pkl", "wb") as f:
        pickle.dump((paths, mod, qual, world, args), f)
    port = _free_port()
    procs = []
    try:
        for r in range(world):
            e = dict(os.environ)
            e.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r),
                      "WORLD_SIZE": str(world), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(world),
                      "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"})
            e.update(env or {})
            log = open(job / f"out{r}.log", "wb")
            procs.append(subprocess.Popen([sys.executable, "-c", _CHILD, str(job), str(r)],
                                          stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True,
                                          env=e))
            log.close()
        deadline = time.monotonic() + timeout
        failed_at = None
        ended_at = {}
        while True:
            codes = [p.poll() for p in procs]
            for r, c in enumerate(codes):
                if c is not None and r not in ended_at:
                    ended_at[r] = time.monotonic()
            if all(c is not None for c in codes):
                break
            bad = [r for r, c in enumerate(codes)
                   if c is not None and c != 0 and expect_exit.get(r) != c]
            now = time.monotonic()
            if bad and failed_at is None:
                failed_at = now
            if failed_at is not None and now - failed_at > 10:
                break      # the others are likely stuck in a collective with the dead rank
            if now > deadline:
                break
            time.sleep(0.05)
        timed_out = [r for r, p in enumerate(procs) if p.poll() is None]
        for p in procs:
            if p.poll() is None:
                _killpg(p)
                p.wait()
        problems, results = [], []     # problems: (order, text)
        for r, p in enumerate(procs):
            res_path = job / f"result{r}.pkl"
            res = None
            if res_path.exists():
                ended_at[r] = res_path.stat().st_mtime_ns / 1e9 - time.time() + time.monotonic()
                with open(res_path, "rb") as f:
                    res = pickle.load(f)
            if r in expect_exit:
                if p.returncode != expect_exit[r] and r not in timed_out:
                    problems.append((ended_at.get(r, float("inf")),
                                     f"rank {r}: exit {p.returncode}, expected {expect_exit[r]}"
                                     f"\n--- rank {r} output ---\n{_tail(job / f'out{r}.log')}"))
                results.append(None)
                continue
            if res is not None and res[0] == "ok" and p.returncode == 0:
                results.append(res[1])
                continue
            results.append(None)
            if r in timed_out:
                why = f"rank {r}: killed after {timeout}s (still running)" if failed_at is None \
                    else f"rank {r}: killed (still running after another rank failed)"
            elif res is not None and res[0] == "error":
                why = f"rank {r}: exception:\n{res[1]}"
            else:
                why = f"rank {r}: exit {p.returncode} without a result"
            problems.append((ended_at.get(r, float("inf")),
                             f"{why}\n--- rank {r} output (tail) ---\n{_tail(job / f'out{r}.log')}"))
        if problems:
            # The rank that ended first (usually the cause) comes first; killed ones last.
            problems.sort(key=lambda x: x[0])
            pytest.fail(f"run_ranks({world}, {mod}.{qual}):\n" + "\n".join(t for _, t in problems),
                        pytrace=False)
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                _killpg(p)
                p.wait()
        for f in job.iterdir():
            try:
                f.unlink()
            except OSError:
                pass
        try:
            job.rmdir()
        except OSError:
            pass


@pytest.fixture
def ranks():
    """The run_ranks function, for tests that prefer a fixture."""
    return run_ranks
