#!/usr/bin/python3
"""Python helpers for the ckptfs integration tests (imported by snippets run from lib.sh's
py_checks, or run as a command: helpers.py CMD ARGS...).

Commands:
  flip FILE OFFSET                 xor the byte at OFFSET with 0xff
  manifest ROOT                    one line per entry: path type mode size mtime_s sha256|target
  safetensors OUT SEED NT TBYTES PAD
                                   write a safetensors file with NT float32 tensors of TBYTES bytes
                                   each (content from SEED), header padded by PAD metadata bytes
  malformed OUTDIR                 write malformed safetensors files into OUTDIR
  records PACK                     list the chunk records of a pack: offset codec stored raw
  iofuzz REF FILE SEED NOPS        apply the same random pwrite/truncate/pread sequence to the
                                   local REF and to FILE, checking every read (TAP output)
"""
import errno
import hashlib
import json
import os
import random
import stat
import struct
import sys

MiB = 1024 * 1024


def tap(cond, desc):
    print(("ok - " if cond else "not ok - ") + desc, flush=True)
    return bool(cond)


def expect_errno(errnos, fn, desc):
    """Run fn(); ok if it raises OSError with an errno in errnos (an int or a tuple)."""
    if isinstance(errnos, int):
        errnos = (errnos,)
    try:
        fn()
    except OSError as e:
        want = "/".join(errno.errorcode.get(x, str(x)) for x in errnos)
        got = errno.errorcode.get(e.errno, str(e.errno))
        return tap(e.errno in errnos, f"{desc} (want {want}, got {got})")
    return tap(False, f"{desc} (no error)")


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(4 * MiB)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def rand_bytes(n, seed):
    return random.Random(seed).randbytes(n)


def manifest(root):
    """{relpath: (type, mode, size, mtime_s, sha256 or link target)} of everything under root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", 0, 0, 0, os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", mode, 0, st.st_mtime_ns // 10**9, "")
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("f", mode, st.st_size, st.st_mtime_ns // 10**9, sha256_file(p))
            else:
                out[rel] = ("?", mode, 0, 0, "")
    return out


def write_safetensors(path, tensors, pad=0, extra_meta=None):
    """tensors: list of (name, dtype, shape, raw_bytes). Header padded with pad metadata bytes."""
    header = {}
    off = 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    meta = {"format": "pt"}
    if extra_meta:
        meta.update(extra_meta)
    if pad:
        meta["pad"] = "x" * pad
    header["__metadata__"] = meta
    hb = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for _, _, _, raw in tensors:
            f.write(raw)
    return 8 + len(hb)


def safetensors_tensors(seed, ntensors, tbytes):
    return [(f"layer{i}.weight", "F32", [tbytes // 4], rand_bytes(tbytes, seed * 1000 + i))
            for i in range(ntensors)]


def malformed(outdir):
    """Malformed safetensors-like files; returns list of names."""
    os.makedirs(outdir, exist_ok=True)
    rnd = random.Random(7)
    data = rnd.randbytes(MiB + 13)
    files = {}
    broken = b'{"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 2'
    broken = broken + b" " * (100 - len(broken))
    files["broken_json.safetensors"] = struct.pack("<Q", 100) + broken + data
    files["huge_len.safetensors"] = struct.pack("<Q", (1 << 64) - 1) + data
    files["huge_len2.safetensors"] = struct.pack("<Q", 1 << 62) + b'{"x":' + data
    files["len_past_eof.safetensors"] = struct.pack("<Q", 10 * MiB) + b"{}" + data[:1000]
    files["zero_len.safetensors"] = struct.pack("<Q", 0) + data
    files["short.safetensors"] = b"\x05\x00\x00"
    files["empty.safetensors"] = b""
    files["not_object.safetensors"] = struct.pack("<Q", 5) + b"[1,2]" + data[:4096]
    bad_utf8 = b'{"\xff\xfe": 1}'
    files["bad_utf8.safetensors"] = struct.pack("<Q", len(bad_utf8)) + bad_utf8 + data[:5000]
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [1 << 20],
                            "data_offsets": [0, 1 << 40]}}).encode()
    files["offsets_out_of_range.safetensors"] = struct.pack("<Q", len(hdr)) + hdr + data
    hdr = json.dumps({"a": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]},
                      "b": {"dtype": "F32", "shape": [1000], "data_offsets": [2000, 6000]},
                      "c": {"dtype": "F32", "shape": [4], "data_offsets": [9000, 10]}}).encode()
    files["overlapping.safetensors"] = struct.pack("<Q", len(hdr)) + hdr + data
    # a valid file that is cut short in the middle of its tensor data
    good = {"t": {"dtype": "F32", "shape": [MiB], "data_offsets": [0, 4 * MiB]}}
    hdr = json.dumps(good).encode()
    files["truncated_data.safetensors"] = struct.pack("<Q", len(hdr)) + hdr + data[:100000]
    for name, b in files.items():
        with open(os.path.join(outdir, name), "wb") as f:
            f.write(b)
    return sorted(files)


def iofuzz(ref, path, seed, nops, max_off=24 * MiB, max_len=3 * MiB):
    """Same random ops on ref (local) and path (ckptfs); every read compared. Returns #errors."""
    rnd = random.Random(seed)
    bad = 0
    for p in (ref, path):
        with open(p, "wb"):
            pass
    fr = os.open(ref, os.O_RDWR)
    fm = os.open(path, os.O_RDWR)
    try:
        for i in range(nops):
            op = rnd.random()
            size = os.fstat(fr).st_size
            if op < 0.55:
                if rnd.random() < 0.3 and size > 0:
                    off = rnd.randrange(0, size)
                else:
                    off = rnd.randrange(0, max_off)
                n = rnd.choice([1, 7, 4095, 4096, 4097, 65536, rnd.randrange(1, max_len)])
                buf = rnd.randbytes(n)
                a = os.pwrite(fr, buf, off)
                b = os.pwrite(fm, buf, off)
                if a != b:
                    bad += 1
                    tap(False, f"iofuzz op {i}: pwrite({n} @ {off}) returned {b}, want {a}")
            elif op < 0.65:
                n = rnd.randrange(0, max_off)
                os.ftruncate(fr, n)
                os.ftruncate(fm, n)
            elif op < 0.75:
                os.fsync(fm)
            else:
                off = rnd.randrange(0, max(size, 1) + 4096)
                n = rnd.randrange(1, max_len)
                a = os.pread(fr, n, off)
                b = os.pread(fm, n, off)
                if a != b:
                    bad += 1
                    tap(False, f"iofuzz op {i}: pread({n} @ {off}) differs "
                        f"(len {len(b)} vs {len(a)})")
            sa, sb = os.fstat(fr).st_size, os.fstat(fm).st_size
            if sa != sb:
                bad += 1
                tap(False, f"iofuzz op {i}: size {sb}, want {sa}")
                break
    finally:
        os.close(fr)
        os.close(fm)
    return bad


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "flip":
        path, off = argv[2], int(argv[3])
        with open(path, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            if len(b) != 1:
                print(f"flip: {path} has no byte at offset {off}", file=sys.stderr)
                return 1
            f.seek(off)
            f.write(bytes([b[0] ^ 0xFF]))
        return 0
    if cmd == "records":
        # records of a pack file: offset codec stored_len raw_len (format of core/chunk/pack.h)
        with open(argv[2], "rb") as f:
            data = f.read()
        off = 64
        while off + 48 <= len(data):
            if data[off:off + 4] != b"CKRC":
                off += 8
                continue
            codec = data[off + 4]
            stored, raw = struct.unpack_from("<II", data, off + 8)
            print(off, codec, stored, raw)
            off += 48 + (stored + 7) // 8 * 8
        return 0
    if cmd == "manifest":
        for rel, v in sorted(manifest(argv[2]).items()):
            print(rel, *v)
        return 0
    if cmd == "safetensors":
        out, seed, nt, tb, pad = argv[2], int(argv[3]), int(argv[4]), int(argv[5]), int(argv[6])
        print(write_safetensors(out, safetensors_tensors(seed, nt, tb), pad=pad))
        return 0
    if cmd == "malformed":
        print("\n".join(malformed(argv[2])))
        return 0
    if cmd == "iofuzz":
        bad = iofuzz(argv[2], argv[3], int(argv[4]), int(argv[5]))
        same = sha256_file(argv[2]) == sha256_file(argv[3])
        tap(bad == 0, f"iofuzz seed {argv[4]}: {argv[5]} ops, every pread/size matched")
        tap(same, f"iofuzz seed {argv[4]}: final content identical")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
