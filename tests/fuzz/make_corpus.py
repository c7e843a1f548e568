#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write the generated seeds of the libFuzzer harnesses into tests/fuzz/corpus/HARNESS/.

Run from the repository root with the project's Python environment (it needs numpy, torch
and the reference `safetensors` package, which writes the safetensors headers):

    .venv/bin/python tests/fuzz/make_corpus.py

The seeds are small real inputs: safetensors headers written by the reference implementation
and by hand in the layouts ckptfs writes (view files, "ckptfs" sharding metadata of
docs/views.md section 3), and pack files, zstd frames and metadata records encoded here from
docs/format.md (checksums with the system's libxxhash, frames with libzstd), so that a seed
the harness rejects also shows a disagreement between the code and that document.  Every
other file in the corpus folders is a regression input that fuzzing found
(docs/reliability.md, "Fuzzing"): this script overwrites only the files it names.  (The
reference writer orders the keys of __metadata__ as its hash map does, so a rerun may
rewrite a seed with them in another order.)
The input format of each harness is described at the top of tests/fuzz/fuzz_HARNESS.c.
"""
import ctypes
import json
import os
import struct
import sys

import numpy as np
import torch
from safetensors.torch import save as st_save

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

_xxh = ctypes.CDLL("libxxhash.so.0")
_xxh.XXH3_64bits.restype = ctypes.c_uint64
_xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_zstd = ctypes.CDLL("libzstd.so.1")
_zstd.ZSTD_createCCtx.restype = ctypes.c_void_p
_zstd.ZSTD_CCtx_setParameter.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
_zstd.ZSTD_compress2.restype = ctypes.c_size_t
_zstd.ZSTD_compress2.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                 ctypes.c_char_p, ctypes.c_size_t]
_zstd.ZSTD_isError.argtypes = [ctypes.c_size_t]
_zstd.ZSTD_compressBound.restype = ctypes.c_size_t
_zstd.ZSTD_compressBound.argtypes = [ctypes.c_size_t]
ZSTD_C_COMPRESSION_LEVEL = 100
ZSTD_C_CHECKSUM_FLAG = 201


def xxh3(b: bytes) -> int:
    return _xxh.XXH3_64bits(b, len(b))


def zstd_frame(b: bytes) -> bytes:
    """A frame as ckptfs writes it: content size and content checksum (compress.h)."""
    cctx = _zstd.ZSTD_createCCtx()
    _zstd.ZSTD_CCtx_setParameter(cctx, ZSTD_C_COMPRESSION_LEVEL, 3)
    _zstd.ZSTD_CCtx_setParameter(cctx, ZSTD_C_CHECKSUM_FLAG, 1)
    cap = _zstd.ZSTD_compressBound(len(b))
    out = ctypes.create_string_buffer(cap)
    n = _zstd.ZSTD_compress2(cctx, out, cap, b, len(b))
    assert not _zstd.ZSTD_isError(n)
    return out.raw[:n]


def shuffle(b: bytes, e: int) -> bytes:
    """compress.h: byte plane k holds byte k of every element; the tail stays as it is."""
    n = len(b) // e
    planes = np.frombuffer(b[: n * e], dtype=np.uint8).reshape(n, e).T.tobytes()
    return planes + b[n * e:]


def write(harness: str, name: str, data: bytes) -> None:
    d = os.path.join(ROOT, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def le16(v):
    return struct.pack("<H", v)


def le32(v):
    return struct.pack("<I", v)


def le64(v):
    return struct.pack("<Q", v)


def var(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


# ---------------------------------------------------------------- safetensors headers

def st_header(tensors: dict, metadata=None) -> bytes:
    """The N header bytes of a file written by the reference implementation."""
    buf = st_save(tensors, metadata)
    n = struct.unpack("<Q", buf[:8])[0]
    return buf[8:8 + n]


def hand_header(entries, meta=None, meta_first=True, pad=True) -> bytes:
    """A header laid out like ckptfs's serializer: compact JSON, __metadata__ first, spaces so
    that 8 + N is a multiple of 8.  entries: (name, dtype, shape, begin, end)."""
    parts = []
    if meta is not None and meta_first:
        parts.append('"__metadata__":' + json.dumps(meta, separators=(",", ":")))
    for name, dt, shape, b, e in entries:
        parts.append(json.dumps(name) + ":" + json.dumps(
            {"dtype": dt, "shape": shape, "data_offsets": [b, e]}, separators=(",", ":")))
    if meta is not None and not meta_first:
        parts.append('"__metadata__":' + json.dumps(meta, separators=(",", ":")))
    s = ("{" + ",".join(parts) + "}").encode()
    if pad:
        s += b" " * ((-(8 + len(s))) % 8)
    return s


BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
        "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32,
        "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}


def tile(specs):
    """(name, dtype, shape) in data order -> entries with contiguous offsets."""
    out, off = [], 0
    for name, dt, shape in specs:
        n = BITS[dt]
        for d in shape:
            n *= d
        assert n % 8 == 0
        out.append((name, dt, shape, off, off + n // 8))
        off += n // 8
    return out


def ckptfs_meta(v: dict) -> dict:
    return {"format": "pt", "ckptfs": json.dumps(v, separators=(",", ":"))}


LLAMA = {
    "model.embed_tokens.weight": torch.zeros(16, 8, dtype=torch.bfloat16),
    "model.layers.0.self_attn.q_proj.weight": torch.zeros(8, 8, dtype=torch.bfloat16),
    "model.layers.0.self_attn.o_proj.weight": torch.zeros(8, 8, dtype=torch.bfloat16),
    "model.layers.0.mlp.down_proj.weight": torch.zeros(8, 16, dtype=torch.bfloat16),
    "model.layers.0.input_layernorm.weight": torch.zeros(8, dtype=torch.float32),
    "model.norm.weight": torch.zeros(8, dtype=torch.float32),
    "lm_head.weight": torch.zeros(16, 8, dtype=torch.bfloat16),
}

TP_SHARD = {
    "version": 1, "group": "model", "num_layers": 1,
    "tensors": {
        "model.embed_tokens.weight": {"global_shape": [32, 8], "offsets": [16, 0], "tp_dim": 0,
                                      "pp": "first"},
        "model.layers.0.self_attn.q_proj.weight": {"global_shape": [16, 8], "offsets": [8, 0],
                                                   "tp_dim": 0, "pp": 0},
        "model.layers.0.self_attn.o_proj.weight": {"global_shape": [8, 16], "offsets": [0, 8],
                                                   "tp_dim": 1, "pp": 0},
        "model.layers.0.mlp.down_proj.weight": {"global_shape": [8, 32], "offsets": [0, 16],
                                                "tp_dim": 1},
        "model.layers.0.input_layernorm.weight": {"tp_dim": -1},
        "model.norm.weight": {"tp_dim": -1, "pp": "last"},
        "lm_head.weight": {"global_shape": [32, 8], "offsets": [16, 0], "pp": "ends"},
    },
}


def safetensors_seeds():
    write("safetensors", "llama.json", st_header(LLAMA, {"format": "pt"}))
    write("safetensors", "llama_tp_shard.json", st_header(LLAMA, ckptfs_meta(TP_SHARD)))
    flat = {"flat_param": torch.zeros(12, dtype=torch.float32),
            "step": torch.zeros((), dtype=torch.int64)}
    write("safetensors", "fsdp_flat.json", st_header(flat, ckptfs_meta({
        "version": 1, "group": "optim",
        "tensors": {"flat_param": {"global_shape": [4, 6], "offsets": [0, 0],
                                   "box_shape": [4, 6], "flat_range": [6, 18], "pp": "all"},
                    "step": {"pp": "all"}}})))
    write("safetensors", "dtypes.json", hand_header(tile([
        ("c", "C64", [2]), ("d", "F64", []), ("i64", "I64", [1]), ("u64", "U64", [1]),
        ("f", "F32", [2, 2]), ("i32", "I32", [1]), ("u32", "U32", [1]), ("bf", "BF16", [3]),
        ("h", "F16", [1]), ("i16", "I16", [1]), ("u16", "U16", [1]), ("e5", "F8_E5M2", [1]),
        ("e4", "F8_E4M3", [1]), ("e8", "F8_E8M0", [1]), ("b", "BOOL", [1]), ("u8", "U8", [1]),
        ("i8", "I8", [1]), ("f4", "F4", [2, 3]), ("f6a", "F6_E2M3", [4]),
        ("f6b", "F6_E3M2", [4]), ("empty", "F32", [0, 3])]), meta={"step": "7"}))
    write("safetensors", "metadata_null.json",
          hand_header(tile([("w", "F32", [2])]), meta=None, pad=False)
          .replace(b"{", b'{"__metadata__":null,', 1))
    # data offsets out of the order of the keys (the reference sorts by offsets)
    write("safetensors", "offsets_out_of_order.json", hand_header(list(reversed(tile([
        ("a", "U8", [3]), ("b", "U8", [5]), ("c", "F32", [1])])))))
    # names that are not path components: only ever written into headers
    write("safetensors", "odd_names.json", hand_header(tile([
        ("", "U8", [1]), ("/", "U8", [1]), ("../x", "U8", [1]), ("caf\u00e9\n\t\"", "U8", [1]),
        ("layers.18446744073709551615.w", "U8", [1])])))
    # a view file's header (docs/views.md section 6): __metadata__ first, every decision
    # explicit, padded with spaces
    view = {"version": 1, "group": "model", "num_layers": 2, "tensors": {
        "model.layers.0.input_layernorm.weight": {"global_shape": [8], "offsets": [0],
                                                  "tp_dim": -1, "pp": 0},
        "model.embed_tokens.weight": {"global_shape": [10, 8], "offsets": [9, 0],
                                      "tp_dim": 0, "pp": "first"},
        "model.layers.1.self_attn.k_proj.weight": {"global_shape": [6, 8], "offsets": [6, 0],
                                                   "tp_dim": 0, "pp": 1}}}
    write("safetensors", "view_file.json", hand_header(tile([
        ("model.layers.0.input_layernorm.weight", "F32", [8]),
        ("model.embed_tokens.weight", "BF16", [1, 8]),
        ("model.layers.1.self_attn.k_proj.weight", "BF16", [0, 8])]),
        meta={"format": "pt", "ckptfs": json.dumps(view, separators=(",", ":"))}))


# ---------------------------------------------------------------- sharding metadata values

def shardmeta_seeds():
    # alone: the harness's built-in header (fuzz_shardmeta.c)
    write("shardmeta", "default_tensors.json", json.dumps({
        "version": 1, "group": "model", "num_layers": 2, "tensors": {
            "model.embed_tokens.weight": {"global_shape": [32, 8], "offsets": [16, 0],
                                          "tp_dim": 0, "pp": "first"},
            "model.layers.0.self_attn.q_proj.weight": {"global_shape": [16, 8],
                                                       "offsets": [8, 0], "tp_dim": 0, "pp": 0},
            "model.layers.1.mlp.down_proj.weight": {"global_shape": [8, 32],
                                                    "offsets": [0, 16], "tp_dim": 1, "pp": 1},
            "model.norm.weight": {"tp_dim": -1, "pp": "last"},
            "flat": {"global_shape": [4, 6], "offsets": [0, 0], "box_shape": [4, 6],
                     "flat_range": [6, 18]},
            "scalar": {"pp": "all"}}}).encode())
    write("shardmeta", "minimal.json", b'{"version":1}')
    write("shardmeta", "version2.json", b'{"version":2,"group":"future"}')
    write("shardmeta", "flat_box.json", json.dumps({
        "version": 1, "group": "optim", "tensors": {
            "flat": {"global_shape": [2, 3, 4], "offsets": [1, 0, 0], "box_shape": [1, 3, 4],
                     "flat_range": [0, 12], "pp": "ends", "unknown": [1, {"x": None}]}}}).encode())
    write("shardmeta", "num_layers_2e62.json", json.dumps({
        "version": 1, "num_layers": 2 ** 62,
        "tensors": {"model.layers.1.mlp.down_proj.weight": {"pp": 2 ** 62 - 1}}}).encode())
    # with a header of the fuzzer's: HEADER NUL VALUE
    write("shardmeta", "llama_header.bin", st_header(LLAMA) + b"\0" +
          json.dumps(TP_SHARD).encode())


# ---------------------------------------------------------------- view names, layout arithmetic

def layout_seeds():
    for name in ["tp1_pp1", "tp2_pp4", "tp4096_pp4096", "tp4097_pp1", "tp02_pp1", "TP2_pp2",
                 "tp2_pp2x", "model.layers.31.mlp.down_proj.weight",
                 "transformer.h.7.attn.c_attn.weight", "blocks.0.norm", "xlayer.3.w",
                 "layer.18446744073709551615.w", "model.embed_tokens.weight"]:
        write("layout", "name_" + name.replace(".", "_"), name.encode())
    # 0: size, layer, num_layers (u64 each), T, P (u16 each)
    write("layout", "parallel", b"\0" + le64(100) + le64(5) + le64(32) + le16(4) + le16(3))
    write("layout", "parallel_huge", b"\0" + le64(2 ** 64 - 1) + le64(2 ** 62) +
          le64(2 ** 62 + 1) + le16(4096) + le16(4095))
    # 1: ndim, elem bytes - 1, target (off, shape per dim), piece box, flat, flat begin/end
    write("layout", "runs_box", b"\1" + bytes([2, 1, 1, 3, 0, 4, 0, 4, 2, 3, 0]) + le16(0) +
          le16(0))
    write("layout", "runs_flat", b"\1" + bytes([3, 3, 0, 2, 1, 2, 0, 3, 0, 2, 0, 2, 0, 3, 1]) +
          le16(2) + le16(9))
    # 2: ndim of a, (b's), then per dim: width bits, a off/shape, b off/shape
    write("layout", "intersect", b"\2" + bytes([2, 1]) + bytes([0, 1, 4, 3, 4, 0, 2, 1, 6]) +
          bytes(16 * 5))


# ---------------------------------------------------------------- pack files, chunk frames

PACK_ID = 0x2A  # fuzz_pack.c
STORE_UUID = bytes([0xC4, 0x9B, 0x01, 0x77, 0x5E, 0x10, 0x42, 0x3A,
                    0x8D, 0x66, 0x2F, 0x90, 0x13, 0xEE, 0x05, 0x61])


def pack_file_header() -> bytes:
    h = b"CKPTPACK" + le32(1) + le32(64) + le64(PACK_ID) + STORE_UUID + le64(1700000000)
    return h + le64(xxh3(h)) + le64(0)


def pack_record(codec: int, stored: bytes, raw_len: int, digest: bytes) -> bytes:
    h = b"CKRC" + bytes([codec, 0]) + le16(48) + le32(len(stored)) + le32(raw_len) + digest
    h += le64(xxh3(stored))
    h += le64(xxh3(h))
    return h + stored + bytes((-len(stored)) % 8)


def chunks():
    """(codec, stored, raw) of each codec, from tensor-like and text data."""
    text = b"ckptfs stores checkpoints; " * 12
    bf16 = torch.linspace(-2, 2, 96, dtype=torch.float32).to(torch.bfloat16).view(torch.int16)
    bf16 = bf16.numpy().tobytes()
    f32 = np.linspace(-1, 1, 48, dtype=np.float32).tobytes()
    return [(0, bytes(range(100)), bytes(range(100))),
            (1, zstd_frame(text), text),
            (2, zstd_frame(shuffle(bf16, 2)), bf16),
            (3, zstd_frame(shuffle(f32, 4)), f32)]


def pack_seeds():
    recs = b"".join(pack_record(c, s, len(r), bytes([i]) * 16)
                    for i, (c, s, r) in enumerate(chunks()))
    write("pack", "records", b"\0" + recs)
    write("pack", "whole_file", b"\1" + pack_file_header() + recs)
    write("pack", "records_direct", b"\x10" + recs)
    # a hole (a failed append) between records, and a torn record at the end
    torn = pack_record(1, zstd_frame(b"x" * 500), 500, b"t" * 16)
    write("pack", "hole_torn_tail", b"\x08" + recs[:200] + bytes(64) + recs[200:] +
          torn[:len(torn) - 5])
    # checksums left for the harness to make right (mode 0x06)
    write("pack", "fixup", b"\x06" + b"CKRC\1\0" + le16(48) + le32(16) + le32(16) +
          bytes(32) + b"0123456789abcdef")
    for c, s, r in chunks():
        flags = {0: 0, 1: 2, 2: 3, 3: 5}[c]
        write("compress", "codec%d" % c, bytes([c]) + le32(len(r))[:3] + bytes([flags]) + s)
    write("compress", "empty", bytes([1, 0, 0, 0, 0]))


# ---------------------------------------------------------------- metadata records

def records_seeds():
    inode = bytes([1, 0, 0, 0]) + le32(0o100644) + le32(1000) + le32(1000) + le32(1) + \
        le32(1) + le64(1144) + le64(1) + le64(2) + le64(3) + le64(0) + le64(9) + bytes(8)
    assert len(inode) == 80
    write("records", "inode", b"\0" + inode)
    write("records", "dentry", b"\1" + bytes([1, 0, 0, 0]) + le32(0o40755) + le64(12))
    loc = bytes(range(16))
    write("records", "chunk", b"\2" + bytes([1, 1, 0, 2]) + le32(300) + le32(1024) + bytes(4) +
          loc + le64(3))
    ext = bytes([1, 0, 0, 0]) + le32(3) + le64(4096 + 100 + 2048)
    ext += le32(4096) + bytes([0, 0, 0, 0]) + b"a" * 16
    ext += le32(100) + bytes([1, 0, 0, 0]) + bytes(16)
    ext += le32(2048) + bytes([0, 0, 0, 0]) + b"b" * 16
    write("records", "extents", b"\3" + ext)
    write("records", "dentry_key", b"\5" + b"D" + struct.pack(">Q", 1) + b"model.safetensors")

    # 'P' records (docs/format.md 5.8), of a file of SIZE bytes that the harness describes
    # as zero runs: three tensors as in tests/check_parsrec.c
    data_start, size = 1032, 1032 + 112

    def entry(prev, name, dt, shape, begin, nbytes, m, flags, flat, tp, kind, layer):
        pre = 0
        while pre < min(len(prev), len(name)) and prev[pre] == name[pre]:
            pre += 1
        out = var(pre) + var(len(name) - pre) + name[pre:].encode()
        out += bytes([len(dt)]) + dt.encode() + bytes([len(shape)])
        out += b"".join(var(x) for x in shape) + var(begin) + var(nbytes)
        out += bytes([len(m)]) + b"".join(var(g) + var(o) + var(s) for g, o, s in m)
        out += bytes([flags]) + b"".join(var(x) for x in flat)
        return out + bytes([tp + 2, kind]) + var(layer)

    body = entry("", "layers.0.attn.weight", "BF16", [4, 6], 0, 48,
                 [(8, 4, 4), (6, 0, 6)], 0, [], 0, 0, 0)
    body += entry("layers.0.attn.weight", "layers.0.mlp.weight", "F32", [10], 48, 40,
                  [(5, 0, 5), (4, 0, 4)], 3, [7, 17], -2, 2, 0)
    body += entry("layers.0.mlp.weight", "norm", "F64", [3], 88, 24, [(3, 0, 3)], 0, [], -1,
                  0, 0)
    fp = xxh3(le32(size) + bytes([1]) + bytes(16))  # one zero extent from offset 0
    head = bytes([3, 1, 1, 1]) + le32(3) + le64(fp) + le64(data_start) + le64(32) + le16(5)
    write("records", "parsed_source", b"\4" + le64(size) + head + b"model" + body)
    write("records", "parsed_source_fixup", b"\x84" + le64(size) + head + b"model" + body)
    head = bytes([3, 0, 0, 0]) + le32(0) + le64(fp) + le64(data_start) + le64(0) + le16(0)
    write("records", "parsed_not_source", b"\4" + le64(size) + head)


def main():
    if len(sys.argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    safetensors_seeds()
    shardmeta_seeds()
    layout_seeds()
    pack_seeds()
    records_seeds()
    return 0


if __name__ == "__main__":
    sys.exit(main())
