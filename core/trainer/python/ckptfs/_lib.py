"""ctypes binding of libckptfs (core/trainer/ckptfs.h): the library, its structs, its errors.

Which library: $CKPTFS_LIBRARY when set (a path); else the in-tree build next to this package
(core/trainer/.libs/libckptfs.so, for an editable install from the repository); else the
system library (ctypes.util.find_library("ckptfs"), then libckptfs.so.0, after `make
install`).  If none loads, importing ckptfs raises ImportError naming every place tried.

The structs below mirror ckptfs.h field by field; CKPTFS_API_VERSION must match the loaded
library's ckptfs_api_version().  Every call that fails raises CheckpointError (an OSError whose
errno is the library's and whose message is the library's "FILE: reason" text).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno as _errno
import os
from ctypes import (POINTER, Structure, c_char_p, c_int, c_int64, c_size_t, c_uint64,
                    c_void_p)
from pathlib import Path

CKPTFS_API_VERSION = 1
CKPTFS_MAX_DIMS = 16
CKPTFS_TP_DIM_UNSET = -1000
CKPTFS_PP_UNSET = -1
CKPTFS_PP_FIRST = -2
CKPTFS_PP_LAST = -3
CKPTFS_PP_ENDS = -4
CKPTFS_PP_ALL = -5
CKPTFS_BP_WAIT = 0
CKPTFS_BP_FAIL = 1

PP_NAMES = {"first": CKPTFS_PP_FIRST, "last": CKPTFS_PP_LAST, "ends": CKPTFS_PP_ENDS,
            "all": CKPTFS_PP_ALL}

I64P = POINTER(c_int64)


class CheckpointError(OSError):
    """A libckptfs failure: .errno is the errno, str() the library's message (names the file
    or tensor and the reason)."""

    def __init__(self, err: int, message: str):
        super().__init__(err, message)

    def __str__(self):
        return self.strerror or os.strerror(self.errno)


class Tensor(Structure):
    _fields_ = [
        ("group", c_char_p),
        ("name", c_char_p),
        ("dtype", c_char_p),
        ("ndim", c_int),
        ("shape", I64P),
        ("data", c_void_p),
        ("device", c_int),
        ("global_ndim", c_int),
        ("global_shape", I64P),
        ("offsets", I64P),
        ("flat", c_int),
        ("flat_start", c_int64),
        ("flat_end", c_int64),
        ("box_shape", I64P),
        ("tp_dim", c_int),
        ("pp", c_int),
        ("replica", c_int),
    ]


class Blob(Structure):
    _fields_ = [("name", c_char_p), ("data", c_void_p), ("len", c_size_t)]


class SaverOpts(Structure):
    _fields_ = [
        ("pool_bytes", c_size_t),
        ("io_threads", c_int),
        ("backpressure", c_int),
        ("write_bytes", c_size_t),
        ("commit_timeout_ms", c_int),
        ("wait_commit", c_int),
    ]


class SaveArgs(Structure):
    _fields_ = [
        ("path", c_char_p),
        ("rank", c_int),
        ("world", c_int),
        ("job_id", c_uint64),
        ("seq", c_uint64),
        ("tensors", POINTER(Tensor)),
        ("n_tensors", c_size_t),
        ("blobs", POINTER(Blob)),
        ("n_blobs", c_size_t),
        ("num_layers", c_int),
        ("manifest_extra", c_char_p),
    ]


class SaveStats(Structure):
    _fields_ = [("snapshot_ns", c_uint64), ("write_ns", c_uint64), ("commit_ns", c_uint64),
                ("bytes", c_uint64)]


class LoaderOpts(Structure):
    _fields_ = [("io_threads", c_int), ("require_complete", c_int)]


class TensorInfo(Structure):
    _fields_ = [
        ("group", c_char_p),
        ("name", c_char_p),
        ("dtype", c_char_p),
        ("ndim", c_int),
        ("shape", c_int64 * CKPTFS_MAX_DIMS),
        ("tp_dim", c_int),
        ("pp", c_int),
    ]


class LoadReq(Structure):
    _fields_ = [
        ("group", c_char_p),
        ("name", c_char_p),
        ("dtype", c_char_p),
        ("dst", c_void_p),
        ("device", c_int),
        ("ndim", c_int),
        ("shape", I64P),
        ("offsets", I64P),
        ("flat", c_int),
        ("flat_start", c_int64),
        ("flat_end", c_int64),
        ("box_shape", I64P),
    ]


# (name, restype, argtypes) of every function of ckptfs.h.
_PROTOS = [
    ("ckptfs_api_version", c_int, []),
    ("ckptfs_cuda_available", c_int, []),
    ("ckptfs_saver_opts_init", None, [POINTER(SaverOpts)]),
    ("ckptfs_saver_new", c_int, [POINTER(SaverOpts), POINTER(c_void_p)]),
    ("ckptfs_saver_free", None, [c_void_p]),
    ("ckptfs_save_async", c_int, [c_void_p, POINTER(SaveArgs)]),
    ("ckptfs_save_wait", c_int, [c_void_p, c_int]),
    ("ckptfs_save_done", c_int, [c_void_p]),
    ("ckptfs_saver_pool_bytes", c_size_t, [c_void_p]),
    ("ckptfs_saver_error", c_int, [c_void_p, c_void_p, c_size_t]),
    ("ckptfs_saver_stats", c_int, [c_void_p, POINTER(SaveStats)]),
    ("ckptfs_loader_opts_init", None, [POINTER(LoaderOpts)]),
    ("ckptfs_loader_open", c_int, [c_char_p, POINTER(LoaderOpts), POINTER(c_void_p)]),
    ("ckptfs_loader_free", None, [c_void_p]),
    ("ckptfs_loader_count", c_size_t, [c_void_p]),
    ("ckptfs_loader_info", c_int, [c_void_p, c_size_t, POINTER(TensorInfo)]),
    ("ckptfs_loader_find", c_int, [c_void_p, c_char_p, c_char_p]),
    ("ckptfs_load", c_int, [c_void_p, POINTER(LoadReq), c_size_t]),
    ("ckptfs_loader_error", c_int, [c_void_p, c_void_p, c_size_t]),
]


def _candidates():
    env = os.environ.get("CKPTFS_LIBRARY")
    if env:
        # An explicit choice is the only one tried: a wrong path must not silently fall back.
        return [("$CKPTFS_LIBRARY", env)]
    here = Path(__file__).resolve().parent
    out = [("in-tree build", str(here.parent.parent / ".libs" / "libckptfs.so"))]
    found = ctypes.util.find_library("ckptfs")
    if found:
        out.append(("find_library('ckptfs')", found))
    out.append(("system", "libckptfs.so.0"))
    return out


def _load():
    tried = []
    for what, path in _candidates():
        if what == "in-tree build" and not os.path.exists(path):
            tried.append(f"{path} ({what}): not built")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({what}): {e}")
            continue
        return lib, path
    raise ImportError("ckptfs: cannot load libckptfs; tried: " + "; ".join(tried) +
                      " (build it with `make core/trainer/libckptfs.la`, install it with"
                      " `make install`, or set CKPTFS_LIBRARY to its path)")


lib, path = _load()
_missing = []
for _name, _res, _args in _PROTOS:
    _fn = getattr(lib, _name, None)
    if _fn is None:
        _missing.append(_name)
        continue
    _fn.restype = _res
    _fn.argtypes = _args

if "ckptfs_api_version" not in _missing and lib.ckptfs_api_version() != CKPTFS_API_VERSION:
    raise ImportError(f"ckptfs: {path}: API version {lib.ckptfs_api_version()}, this package "
                      f"speaks version {CKPTFS_API_VERSION}")


def fn(name: str):
    """The library function `name`; a clear error if the loaded library lacks it."""
    f = getattr(lib, name, None)
    if f is None or name in _missing:
        raise CheckpointError(_errno.ENOSYS, f"{path}: libckptfs lacks {name}()")
    return f


def error_of(getter: str, obj, rc: int, what: str = "") -> CheckpointError:
    """A CheckpointError for return code rc with the object's last message."""
    buf = ctypes.create_string_buffer(4096)
    try:
        e = fn(getter)(obj, buf, len(buf))
    except CheckpointError:
        e = rc
    msg = buf.value.decode(errors="replace")
    err = -rc if rc < 0 else (-e if e < 0 else _errno.EIO)
    if not msg:
        msg = f"{what}: {os.strerror(err)}" if what else os.strerror(err)
    return CheckpointError(err, msg)


def i64array(values):
    """A ctypes int64 array (kept alive by the caller) or None for None."""
    if values is None:
        return None
    vals = [int(v) for v in values]
    arr = (c_int64 * max(len(vals), 1))(*vals)
    return arr


def as_i64p(arr):
    return ctypes.cast(arr, I64P) if arr is not None else None


__all__ = ["CheckpointError", "Tensor", "Blob", "SaverOpts", "SaveArgs", "SaveStats",
           "LoaderOpts", "TensorInfo", "LoadReq", "fn", "error_of", "i64array", "as_i64p",
           "lib", "path"]
