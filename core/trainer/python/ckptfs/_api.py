"""ckptfs.save and ckptfs.load over libckptfs.

One saver per process (its pinned pool is allocated once and reused by every save); a save
snapshots this rank's pieces into the pool and returns a SaveHandle while the library writes in
the background.  A load builds one request per local piece of the target state and calls the
library once per group.  See the package docstring for the state's keys.
"""
from __future__ import annotations

import atexit
import ctypes
import errno
import json
import os
import pickle
import random
import threading
import time
import warnings
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from . import _lib, _mount, _state
from ._lib import CheckpointError
from .pieces import Piece

MARKER = "ckptfs-checkpoint.json"

_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}
for _n, _s in (("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64"),
               ("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"),
               ("complex64", "C64")):
    if hasattr(torch, _n):
        _DTYPES[getattr(torch, _n)] = _s


def dtype_name(name: str, t: torch.Tensor) -> str:
    try:
        return _DTYPES[t.dtype]
    except KeyError:
        raise TypeError(f"{name}: dtype {t.dtype} has no safetensors name") from None


def _group_of(key: str) -> str:
    return "optim" if key == "optimizer" else key


# ------------------------------------------------------------------------------------ saver

_DEFAULTS = dict(pool_bytes=None, io_threads=None, backpressure="wait", write_bytes=None,
                 commit_timeout_ms=None, wait_commit=True)


class _Saver:
    """The process's libckptfs saver and its options.  _lock serialises calls into it (the
    library allows one thread per saver at a time)."""

    def __init__(self, opts: dict):
        self.opts = dict(opts)
        o = _lib.SaverOpts()
        _lib.fn("ckptfs_saver_opts_init")(ctypes.byref(o))
        if opts["pool_bytes"] is not None:
            o.pool_bytes = int(opts["pool_bytes"])
        if opts["io_threads"] is not None:
            o.io_threads = int(opts["io_threads"])
        bp = opts["backpressure"]
        if bp not in ("wait", "fail"):
            raise ValueError(f"backpressure={bp!r}: expected 'wait' or 'fail'")
        o.backpressure = _lib.CKPTFS_BP_WAIT if bp == "wait" else _lib.CKPTFS_BP_FAIL
        if opts["write_bytes"] is not None:
            o.write_bytes = int(opts["write_bytes"])
        if opts["commit_timeout_ms"] is not None:
            o.commit_timeout_ms = int(opts["commit_timeout_ms"])
        o.wait_commit = 1 if opts["wait_commit"] else 0
        h = ctypes.c_void_p()
        rc = _lib.fn("ckptfs_saver_new")(ctypes.byref(o), ctypes.byref(h))
        if rc < 0:
            raise CheckpointError(-rc, f"ckptfs_saver_new: {os.strerror(-rc)}")
        self.h = h
        self.lock = threading.Lock()
        self.current: Optional[SaveHandle] = None    # the save the library tracks now

    def error(self, rc: int, what: str) -> CheckpointError:
        return _lib.error_of("ckptfs_saver_error", self.h, rc, what)

    def stats(self) -> dict:
        st = _lib.SaveStats()
        with self.lock:
            rc = _lib.fn("ckptfs_saver_stats")(self.h, ctypes.byref(st))
        if rc < 0:
            raise self.error(rc, "ckptfs_saver_stats")
        return {"snapshot_s": st.snapshot_ns / 1e9, "write_s": st.write_ns / 1e9,
                "commit_s": st.commit_ns / 1e9, "bytes": st.bytes}

    def pool_bytes(self) -> int:
        with self.lock:
            return int(_lib.fn("ckptfs_saver_pool_bytes")(self.h))

    def free(self):
        if self.h:
            if self.current is not None:
                try:
                    self.current.wait()
                except Exception:
                    pass
            _lib.fn("ckptfs_saver_free")(self.h)
            self.h = None


_saver: Optional[_Saver] = None
_saver_lock = threading.Lock()
_job_ids: Dict[object, int] = {}
_seq = 0


def configure(**opts):
    """Sets the process's saver options (pool_bytes, io_threads, backpressure "wait"|"fail",
    write_bytes, commit_timeout_ms, wait_commit; None: the library's default) for later
    saves.  Options given to save() are kept for later saves too.  A saver with other options
    is replaced (after its save in flight finished; its pool is freed and a new one reserved),
    so set them once: the pool is meant to be reused."""
    unknown = set(opts) - set(_DEFAULTS)
    if unknown:
        raise TypeError(f"configure: unknown options {sorted(unknown)}")
    _DEFAULTS.update(opts)


def _get_saver(overrides: dict) -> _Saver:
    global _saver
    _DEFAULTS.update({k: v for k, v in overrides.items() if v is not None})
    want = dict(_DEFAULTS)
    with _saver_lock:
        if _saver is not None and _saver.opts != want:
            _saver.free()
            _saver = None
        if _saver is None:
            _saver = _Saver(want)
        return _saver


def shutdown():
    """Waits for the save in flight and frees the saver and its pool."""
    global _saver
    with _saver_lock:
        if _saver is not None:
            _saver.free()
            _saver = None


# At interpreter exit the save in flight is finished (its files made durable and, on rank 0,
# the checkpoint committed, bounded by commit_timeout_ms) and the saver's threads stopped
# before the process tears down: a job that returns right after save() still leaves a
# complete checkpoint.
atexit.register(shutdown)


def saver_stats() -> dict:
    """Per-phase timings (seconds) and bytes of this process's last completed save."""
    if _saver is None:
        raise RuntimeError("no save has run in this process")
    return _saver.stats()


def _test_set_write_delay(ms: int):
    """Test hook (libckptfs's ckptfs__test_set_write_delay, not public API): the saver's
    background writers sleep ms before each file of the next saves."""
    s = _get_saver({})
    f = getattr(_lib.lib, "ckptfs__test_set_write_delay", None)
    if f is None:
        raise RuntimeError(f"{_lib.path}: no ckptfs__test_set_write_delay test hook")
    f.restype = None
    f.argtypes = [ctypes.c_void_p, ctypes.c_int]
    with s.lock:
        f(s.h, int(ms))


def saver_pool_bytes() -> int:
    """Bytes of the pinned pool now populated (0 before the first save)."""
    return 0 if _saver is None else _saver.pool_bytes()


class SaveHandle:
    """The save in the background.  wait(timeout=None) returns when this rank's files are
    durable and (with wait_commit, the default) the checkpoint is complete, and raises the
    save's error (CheckpointError naming the file) or TimeoutError; done() says whether it
    finished; exception(timeout=None) waits like wait() and returns the error or None."""

    def __init__(self, saver: _Saver, path: str):
        self._saver = saver
        self.path = path
        self._finished = False
        self._error: Optional[BaseException] = None

    def _finish(self, rc: int):
        self._finished = True
        if rc < 0:
            self._error = self._saver.error(rc, self.path)
        if self._saver.current is self:
            self._saver.current = None

    def _poll(self, timeout_ms: int) -> bool:
        s = self._saver
        with s.lock:
            if self._finished:
                return True
            rc = _lib.fn("ckptfs_save_wait")(s.h, timeout_ms)
            # -ETIMEDOUT is both "still running" and a save that failed with ETIMEDOUT (its
            # commit waited too long for other ranks): the saver being idle tells them apart.
            if rc == -errno.ETIMEDOUT and not _lib.fn("ckptfs_save_done")(s.h):
                return False
            self._finish(rc)
            return True

    def wait(self, timeout: Optional[float] = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 200 if deadline is None else int(max(0.0, deadline - time.monotonic()) * 1000)
            # Slices of at most 200 ms: another thread may save or poll in between.
            if self._poll(min(left, 200)):
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{self.path}: save not finished after {timeout} s")
        if self._error is not None:
            raise self._error

    def done(self) -> bool:
        if self._finished:
            return True
        s = self._saver
        with s.lock:
            if self._finished:
                return True
            if not _lib.fn("ckptfs_save_done")(s.h):
                return False
        return self._poll(0)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        try:
            self.wait(timeout)
        except TimeoutError:
            raise
        except BaseException as e:
            return e
        return None

    def __repr__(self):
        st = "done" if self._finished else "running"
        return f"<ckptfs.SaveHandle {self.path} {st}{' failed' if self._error else ''}>"


def _job_id(pg, world: int) -> int:
    """One random 64-bit id per process group: rank 0 draws it at the group's first save and
    broadcasts it (the only collective of a save, once per group), then it is cached."""
    key = pg if pg is not None else "default"
    jid = _job_ids.get(key)
    if jid is not None:
        return jid
    jid = random.SystemRandom().getrandbits(64) or 1
    if world > 1:
        obj = [jid]
        try:
            dist.broadcast_object_list(obj, group=pg, group_src=0)
        except TypeError:   # torch without group_src
            src = dist.get_global_rank(pg, 0) if pg is not None else 0
            dist.broadcast_object_list(obj, src=src, group=pg)
        jid = int(obj[0])
    _job_ids[key] = jid
    return jid


class _Keep:
    """Objects that must outlive a library call (ctypes arrays, contiguous copies, bytes)."""

    def __init__(self):
        self.items = []

    def __call__(self, x):
        self.items.append(x)
        return x


def _pp_value(pp) -> int:
    if pp is None:
        return _lib.CKPTFS_PP_UNSET
    if isinstance(pp, str):
        try:
            return _lib.PP_NAMES[pp]
        except KeyError:
            raise ValueError(f"pp={pp!r}: expected a layer index or one of "
                             f"{sorted(_lib.PP_NAMES)}") from None
    return int(pp)


def _host_view(name: str, t: torch.Tensor, keep: _Keep, cuda_ok: bool):
    """(tensor whose memory the library reads/writes, device ordinal)."""
    if t.device.type == "cuda":
        if cuda_ok:
            t = t if t.is_contiguous() else keep(t.contiguous())
            return t, t.device.index or 0
        return keep(t.detach().to("cpu").contiguous()), -1
    if t.device.type != "cpu":
        raise TypeError(f"{name}: tensors on {t.device} are not supported (cpu or cuda)")
    if not t.is_contiguous():
        t = keep(t.contiguous())
    return t, -1


def _fill_tensor(ct: _lib.Tensor, p: Piece, keep: _Keep, cuda_ok: bool):
    t, dev = _host_view(p.name, p.tensor, keep, cuda_ok)
    ct.group = p.group.encode()
    ct.name = p.name.encode()
    ct.dtype = dtype_name(p.name, t).encode()
    ct.ndim = t.dim()
    ct.shape = _lib.as_i64p(keep(_lib.i64array(t.shape)))
    ct.data = t.data_ptr() if t.numel() else None
    ct.device = dev
    if p.global_shape is not None:
        ct.global_ndim = len(p.global_shape)
        ct.global_shape = _lib.as_i64p(keep(_lib.i64array(p.global_shape)))
        ct.offsets = _lib.as_i64p(keep(_lib.i64array(p.offsets))) if p.offsets is not None \
            else None
        if p.flat_range is not None:
            ct.flat = 1
            ct.flat_start, ct.flat_end = int(p.flat_range[0]), int(p.flat_range[1])
            ct.box_shape = _lib.as_i64p(keep(_lib.i64array(p.box_shape))) \
                if p.box_shape is not None else None
    ct.tp_dim = _lib.CKPTFS_TP_DIM_UNSET if p.tp_dim is None else int(p.tp_dim)
    ct.pp = _pp_value(p.pp)
    ct.replica = 0 if p.write else 1


def describe(state: dict, process_group=None) -> Dict[str, List[Piece]]:
    """group -> this rank's pieces of the state (as save and load see them), for inspection
    and for tests."""
    out = {}
    model = state.get("model")
    for key, obj in state.items():
        if key == "extra_state":
            continue
        group = _group_of(key)
        if key == "optimizer":
            out[group] = _state.optim_pieces(model, obj, process_group, group)
        else:
            out[group] = _state.object_pieces(group, obj, process_group)
    return out


def save(path, state: dict, *, async_: bool = True, process_group=None, replicas: str = "one",
         pool_bytes: Optional[int] = None, io_threads: Optional[int] = None,
         backpressure: Optional[str] = None, num_layers: Optional[int] = None,
         manifest_extra: Optional[dict] = None, write_bytes: Optional[int] = None,
         commit_timeout_ms: Optional[int] = None, wait_commit: Optional[bool] = None
         ) -> SaveHandle:
    """Saves `state` as checkpoint directory `path` (its parent must exist; PATH must not).

    Every rank of process_group calls it with the same path.  Returns a SaveHandle once this
    rank's tensors are snapshotted into the saver's pool (tensors may be modified right
    after); async_=False waits for the checkpoint to be complete before returning.
    replicas="one": each replicated piece is written by one of its holders (a deterministic
    load-balanced choice, no communication); "all": every holder writes its copy.
    pool_bytes, io_threads, backpressure ("wait": a save while the previous one still writes
    waits for it; "fail": raises CheckpointError EBUSY), write_bytes, commit_timeout_ms and
    wait_commit configure the process's saver for this and later saves (as configure(); None
    keeps the current value; a saver with other options is replaced).
    num_layers: recorded for pipeline views; manifest_extra: a JSON-able dict stored under
    "user" in the completion marker's extra.
    """
    global _seq
    path = os.fspath(path)
    if not isinstance(state, dict):
        raise TypeError("state must be a dict such as {'model': m, 'optimizer': o, "
                        "'extra_state': {...}}")
    # Every call takes the next sequence number, refused or not, so that ranks that all call
    # save() the same number of times agree on it (a save retried after a failure gets a new
    # one, as the library requires).
    _seq += 1
    seq = _seq
    rank, world = _state.group_info(process_group)
    saver = _get_saver(dict(pool_bytes=pool_bytes, io_threads=io_threads,
                            backpressure=backpressure, write_bytes=write_bytes,
                            commit_timeout_ms=commit_timeout_ms, wait_commit=wait_commit))
    job_id = _job_id(process_group, world)
    groups = describe(state, process_group)
    pieces = [p for ps in groups.values() for p in ps]
    _state.assign_writers(pieces, replicas)

    keep = _Keep()
    cuda_ok = bool(_lib.fn("ckptfs_cuda_available")())
    arr = (_lib.Tensor * max(len(pieces), 1))()
    for i, p in enumerate(pieces):
        _fill_tensor(arr[i], p, keep, cuda_ok)

    blobs = []
    if "extra_state" in state:
        blobs.append((f"extra_state-rank{rank:05d}.pkl",
                      pickle.dumps(state["extra_state"], protocol=pickle.HIGHEST_PROTOCOL)))
    extra = None
    if rank == 0:
        cfg = _state.hf_config_json(state.get("model"))
        if cfg is not None:
            blobs.append(("config.json", cfg.encode()))
        ex = {"writer": "ckptfs-python", "world": world, "replicas": replicas,
              "groups": {k: _group_of(k) for k in state if k != "extra_state"}}
        if "optimizer" in state:
            ex["optimizer"] = _state.optim_extra(state.get("model"), state["optimizer"])
        if manifest_extra is not None:
            ex["user"] = manifest_extra
        extra = json.dumps(ex)
    barr = (_lib.Blob * max(len(blobs), 1))()
    for i, (name, data) in enumerate(blobs):
        buf = keep(ctypes.create_string_buffer(data, len(data)))
        barr[i].name = name.encode()
        barr[i].data = ctypes.cast(buf, ctypes.c_void_p)
        barr[i].len = len(data)

    args = _lib.SaveArgs()
    args.path = path.encode()
    args.rank, args.world = rank, world
    args.job_id, args.seq = job_id, seq
    args.tensors, args.n_tensors = arr, len(pieces)
    args.blobs, args.n_blobs = barr, len(blobs)
    args.num_layers = -1 if num_layers is None else int(num_layers)
    args.manifest_extra = extra.encode() if extra is not None else None

    handle = SaveHandle(saver, path)
    with saver.lock:
        prev = saver.current
        if prev is not None and not prev._finished and saver.opts["backpressure"] == "wait":
            # The library waits for it inside save_async; collect its result first so that
            # its handle reports it.
            rc = _lib.fn("ckptfs_save_wait")(saver.h, -1)
            prev._finish(rc)
        elif prev is not None and not prev._finished and \
                _lib.fn("ckptfs_save_done")(saver.h):
            prev._finish(_lib.fn("ckptfs_save_wait")(saver.h, 0))
        rc = _lib.fn("ckptfs_save_async")(saver.h, ctypes.byref(args))
        if rc < 0:
            raise saver.error(rc, path)
        saver.current = handle
    del keep
    if not async_:
        handle.wait()
    return handle


# ----------------------------------------------------------------------------------- loader

class Loader:
    """A libckptfs loader over one directory (the tensors' headers parsed at open)."""

    def __init__(self, directory: str, io_threads: Optional[int] = None,
                 require_complete: bool = True):
        self.dir = directory
        o = _lib.LoaderOpts()
        _lib.fn("ckptfs_loader_opts_init")(ctypes.byref(o))
        if io_threads is not None:
            o.io_threads = int(io_threads)
        o.require_complete = 1 if require_complete else 0
        h = ctypes.c_void_p()
        rc = _lib.fn("ckptfs_loader_open")(directory.encode(), ctypes.byref(o), ctypes.byref(h))
        if rc < 0:
            # No loader exists: the library keeps the message of this thread's last failed
            # open (ckptfs_loader_error(NULL)).
            e = _lib.error_of("ckptfs_loader_error", None, rc, directory)
            if not e.strerror or e.strerror == os.strerror(e.errno):
                e = _open_error(directory, rc, require_complete)
            raise e
        self.h = h

    def close(self):
        if getattr(self, "h", None):
            _lib.fn("ckptfs_loader_free")(self.h)
            self.h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def error(self, rc: int) -> CheckpointError:
        return _lib.error_of("ckptfs_loader_error", self.h, rc, self.dir)

    def find(self, group: str, name: str) -> int:
        return _lib.fn("ckptfs_loader_find")(self.h, group.encode(), name.encode())

    def tensors(self) -> List[dict]:
        out = []
        n = _lib.fn("ckptfs_loader_count")(self.h)
        for i in range(n):
            info = _lib.TensorInfo()
            rc = _lib.fn("ckptfs_loader_info")(self.h, i, ctypes.byref(info))
            if rc < 0:
                raise self.error(rc)
            out.append({"group": info.group.decode(), "name": info.name.decode(),
                        "dtype": info.dtype.decode(), "shape": tuple(info.shape[:info.ndim]),
                        "tp_dim": None if info.tp_dim == _lib.CKPTFS_TP_DIM_UNSET
                        else info.tp_dim})
        return out

    def load(self, pieces: List[Piece]):
        """Fills every piece's tensor with its box / flat range, in one library call."""
        if not pieces:
            return
        keep = _Keep()
        cuda_ok = bool(_lib.fn("ckptfs_cuda_available")())
        reqs = (_lib.LoadReq * len(pieces))()
        copies = []
        for i, p in enumerate(pieces):
            t = p.tensor
            dst = t
            if t.device.type == "cuda" and not cuda_ok or not t.is_contiguous():
                dst = torch.empty(t.shape, dtype=t.dtype, device="cpu"
                                  if t.device.type == "cuda" and not cuda_ok else t.device)
                copies.append((t, dst))
            elif t.device.type not in ("cpu", "cuda"):
                raise TypeError(f"{p.name}: tensors on {t.device} are not supported")
            r = reqs[i]
            r.group = p.group.encode()
            r.name = p.name.encode()
            r.dtype = dtype_name(p.name, dst).encode()
            r.dst = dst.data_ptr() if dst.numel() else None
            r.device = (dst.device.index or 0) if dst.device.type == "cuda" else -1
            if p.global_shape is None:
                r.ndim = dst.dim()
                r.shape = None
                r.offsets = None
            else:
                r.ndim = len(p.global_shape)
                if p.flat_range is not None:
                    r.flat = 1
                    r.flat_start, r.flat_end = int(p.flat_range[0]), int(p.flat_range[1])
                    r.box_shape = _lib.as_i64p(keep(_lib.i64array(p.box_shape))) \
                        if p.box_shape is not None else None
                    r.shape = None
                else:
                    r.shape = _lib.as_i64p(keep(_lib.i64array(dst.shape)))
                r.offsets = _lib.as_i64p(keep(_lib.i64array(p.offsets))) \
                    if p.offsets is not None else None
        rc = _lib.fn("ckptfs_load")(self.h, reqs, len(pieces))
        if rc < 0:
            raise self.error(rc)
        with torch.no_grad():
            for t, tmp in copies:
                t.copy_(tmp)


def _open_error(directory: str, rc: int, require_complete: bool) -> CheckpointError:
    err = -rc
    d = directory.rstrip("/")
    if err == errno.ENOENT and os.path.isdir(d + ".partial"):
        msg = (f"{d}: checkpoint incomplete: {d}.partial exists but the save never finished "
               f"(a rank or the daemon stopped mid-save); load an earlier checkpoint")
    elif err == errno.EBADMSG:
        msg = (f"{d}: checkpoint incomplete: no completion marker {MARKER} (the save did "
               f"not finish, or the directory was not written by ckptfs.save)")
    else:
        msg = f"{d}: {os.strerror(err)}"
    return CheckpointError(err, msg)


def _target_tp(groups: Dict[str, List[Piece]]) -> Optional[int]:
    """T when every piece with an explicit tp_dim >= 0 comes from a mesh whose "tp" dimension
    has size T (the target is a TP=T layout), else None."""
    t = None
    for ps in groups.values():
        for p in ps:
            if p.tp_dim is None or p.tp_dim < 0 or p.global_shape is None:
                continue
            rg = p.replica_group
            if not (isinstance(rg, tuple) and rg and rg[0] == "mesh"):
                return None
            size = getattr(p, "_tp_size", None)
            if size is None:
                return None
            if t is not None and t != size:
                return None
            t = size
    return t


def source_dir(path: str, groups: Dict[str, List[Piece]], view: str = "auto") -> str:
    """The directory a load reads: see load()."""
    root, rel, inview = _mount.split(path)
    if root is None or inview is not None or view == "source":
        return path
    if view == "consolidated":
        return _mount.view_dir(root, rel, 1)
    if view == "tp":
        t = _target_tp(groups) or 1
        return _mount.view_dir(root, rel, t)
    if view != "auto":
        raise ValueError(f"view={view!r}: expected 'auto', 'source', 'consolidated' or 'tp'")
    return _AUTO_VIEW(root, rel, path, groups)


def _auto_view(root, rel, path, groups):
    """On a mount: the tpT view for a target whose tensors are split T ways along a "tp" mesh
    dimension (its files hold exactly the target's TP parts), else the consolidated view.
    Measured with tools/bench/probes/load_views.py (256 MiB saved by FSDP2 on 4 ranks, a
    fresh mount per load, medians of 3 rounds, times relative to reading the saved shards):
    TP1 target: consolidated view 0.64x; TP2 target: tp2 view 0.81x (warm 0.51x),
    consolidated 0.99x; FSDP2 target on 2 ranks: consolidated 0.92x (warm 1.08x)."""
    t = _target_tp(groups)
    return _mount.view_dir(root, rel, t if t and t > 1 else 1)


_AUTO_VIEW = _auto_view


def read_marker(directory: str) -> dict:
    try:
        with open(os.path.join(directory, MARKER)) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise CheckpointError(errno.EBADMSG, f"{os.path.join(directory, MARKER)}: {e}") from e


def _marker_extra(marker: dict) -> dict:
    ex = marker.get("extra")
    if isinstance(ex, str):
        try:
            ex = json.loads(ex)
        except ValueError:
            ex = {}
    return ex if isinstance(ex, dict) else {}


def load(path, state: dict, *, process_group=None, io_threads: Optional[int] = None,
         view: str = "auto", strict: bool = True, require_complete: bool = True) -> dict:
    """Loads checkpoint `path` into `state` in place; returns the state.

    The state (already sharded/wrapped for this job) defines what each rank reads: every local
    piece is filled with its box of the global tensor, whatever layout was saved.
    "model" and other module/tensor-dict keys: parameters, buffers, DTensor local shards are
    written in place.  "optimizer": missing state is created first (Adam's is lazy), then
    filled; param_groups hyperparameters are restored by parameter fqn.  "extra_state": set to
    this rank's pickle (extra_state-rankRRRRR.pkl), or rank 0's when the checkpoint has none
    for this rank (e.g. a job resumed on more ranks); a dict is also updated in place.
    Which directory: a plain directory is read as is.  On a ckptfs mount, view="auto" reads
    the fastest correct choice (see _auto_view), "source" the saved shards, "consolidated"
    MOUNT/tp1_pp1/PATH, "tp" MOUNT/tpT_pp1/PATH for a TP=T target.
    strict=False skips tensors the checkpoint lacks (a model's missing tensors are an error
    otherwise).  require_complete refuses checkpoints without the completion marker.
    """
    path = os.fspath(path).rstrip("/") or "/"
    if not isinstance(state, dict):
        raise TypeError("state must be a dict such as {'model': m, 'optimizer': o}")
    rank, world = _state.group_info(process_group)
    model = state.get("model")
    optim = state.get("optimizer")
    if optim is not None:
        # Before the model's load: the zero-gradient step must not touch loaded weights.
        _state.init_optim_state(optim)
    groups = describe(state, process_group)
    directory = source_dir(path, groups, view)
    try:
        ld = Loader(directory, io_threads, require_complete)
    except CheckpointError as e:
        if directory == path:
            raise
        # The view could not be opened: the saved shards tell why (the message then names
        # PATH itself), or serve the load if only the view failed.
        ld = Loader(path, io_threads, require_complete)
        warnings.warn(f"ckptfs.load: {directory}: {e}; reading {path} instead")
        directory = path
    with ld:
        marker = read_marker(directory)
        wanted = []
        dropped = set()
        for group, pieces in groups.items():
            missing = []
            for p in pieces:
                if ld.find(group, p.name) < 0:
                    missing.append(p.name)
                else:
                    wanted.append(p)
            if missing:
                if group == "optim" and optim is not None:
                    # State the saved optimizer did not have (parameters never stepped):
                    # remove what init_optim_state created for those parameters.
                    dropped = {n.rsplit(".", 1)[0][len("state."):] for n in missing}
                elif strict:
                    raise CheckpointError(errno.ENOENT, f"{directory}: group '{group}' has no "
                                          f"tensor {missing[0]!r} ({len(missing)} missing: "
                                          f"{', '.join(missing[:5])})")
        # Every group in one library call: one read phase, all io_threads busy to the end.
        ld.load(wanted)
        if dropped:
            fqns = _state.param_fqns(model)
            for g in optim.param_groups:
                for prm in g["params"]:
                    if fqns.get(id(prm)) in dropped:
                        optim.state.pop(prm, None)
        if optim is not None:
            ex = _marker_extra(marker).get("optimizer")
            if ex:
                _state.restore_param_groups(model, optim, ex)
    if "extra_state" in state:
        state["extra_state"] = _load_extra(directory, rank, state["extra_state"])
    return state


def _load_extra(directory: str, rank: int, current):
    for r in (rank, 0):
        f = os.path.join(directory, f"extra_state-rank{r:05d}.pkl")
        if os.path.exists(f):
            with open(f, "rb") as fh:
                obj = pickle.load(fh)
            if isinstance(current, dict) and isinstance(obj, dict):
                current.clear()
                current.update(obj)
                return current
            return obj
    return current
