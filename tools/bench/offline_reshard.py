#!/usr/bin/python3
"""The offline reshard path users take today without ckptfs, as a baseline for
tools/bench/run (case 4).

    offline_reshard.py SRC_DIR OUT_DIR --tp T --pp P [--read]

Loads every safetensors shard of SRC_DIR (memory-mapped), reassembles each
global tensor from its pieces using the shards' ckptfs sharding metadata
(global_shape, offsets, box_shape/flat_range, tp_dim, pp, num_layers; see
core/views/shardmeta.h), cuts it for the target layout (torch.chunk along tp_dim,
pipeline stages by layer as in ckptfs views) and writes new safetensors
files OUT_DIR/{group}_tp{t}_pp{p}.safetensors ({group}.safetensors for
tp1_pp1).  With --read, every target rank then reads its files with 1 MiB
reads, all ranks in parallel, as a restarted job would.  Files are not
fsynced (the conversion is as fast as the page cache lets it be).

Also importable: parse_header(path) and compare_dirs(a, b) (used by the
benchmark to check that ckptfs views and this script agree byte for byte).
"""
import argparse
import json
import mmap
import os
import struct
import sys
import threading

import numpy as np

DT = {"BF16": ("<u2", 2), "F16": ("<f2", 2), "F32": ("<f4", 4), "I64": ("<i8", 8),
      "I32": ("<i4", 4), "U8": ("u1", 1), "BOOL": ("?", 1), "F64": ("<f8", 8)}
IO = 1 << 20


def parse_header(path):
    """(header dict without __metadata__, metadata dict, data start offset)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    meta = h.pop("__metadata__", {}) or {}
    return h, meta, 8 + n


def stage_of_layer(layer, n, P):
    for p in range(P):
        if p * n // P <= layer < (p + 1) * n // P:
            return p
    return P - 1


def on_stage(pp, n, P, p):
    if isinstance(pp, int):
        return stage_of_layer(pp, n, P) == p
    return {"first": p == 0, "last": p == P - 1, "ends": p in (0, P - 1), "all": True}[pp]


def tp_bounds(size, parts, t):
    c = -(-size // parts)
    return min(t * c, size), min((t + 1) * c, size)


def load(src):
    """groups: {group: {"n": num_layers, "tensors": {name: info}}}; info: dtype, gshape,
    tp_dim, pp, pieces [(mm, data offset, nbytes, offsets, box_shape, flat range or None)]."""
    groups = {}
    maps = []
    for fn in sorted(os.listdir(src)):
        if not fn.endswith(".safetensors"):
            continue
        path = os.path.join(src, fn)
        h, meta, start = parse_header(path)
        ck = json.loads(meta["ckptfs"]) if "ckptfs" in meta else {"version": 1}
        f = open(path, "rb")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        f.close()
        maps.append(mm)
        g = groups.setdefault(ck.get("group", "model"), {"n": None, "tensors": {}})
        if "num_layers" in ck:
            g["n"] = ck["num_layers"]
        ents = ck.get("tensors", {})
        for name, info in h.items():
            e = ents.get(name, {})
            shape = info["shape"]
            gshape = e.get("global_shape", shape)
            offs = e.get("offsets", [0] * len(gshape))
            fr = e.get("flat_range")
            box = e.get("box_shape", gshape) if fr else shape
            a, b = info["data_offsets"]
            ti = g["tensors"].setdefault(name, {"dtype": info["dtype"], "gshape": gshape,
                                                "tp_dim": e.get("tp_dim", -1),
                                                "pp": e.get("pp", "last"), "pieces": []})
            ti["pieces"].append((mm, start + a, b - a, offs, box, fr))
    for g in groups.values():
        if g["n"] is None:
            g["n"] = 1 + max((t["pp"] for t in g["tensors"].values()
                              if isinstance(t["pp"], int)), default=-1)
    return groups, maps


def assemble(ti):
    dt = np.dtype(DT[ti["dtype"]][0])
    g = np.empty(ti["gshape"], dtype=dt)
    flat_boxes = {}
    for mm, off, nb, offs, box, fr in ti["pieces"]:
        data = np.frombuffer(mm, dtype=dt, count=nb // dt.itemsize, offset=off)
        if fr is None:
            sl = tuple(slice(o, o + s) for o, s in zip(offs, box))
            g[sl] = data.reshape(box)
        else:
            key = (tuple(offs), tuple(box))
            if key not in flat_boxes:
                flat_boxes[key] = np.empty(int(np.prod(box, dtype=np.int64)), dtype=dt)
            flat_boxes[key][fr[0]:fr[1]] = data
    for (offs, box), buf in flat_boxes.items():
        sl = tuple(slice(o, o + s) for o, s in zip(offs, box))
        g[sl] = buf.reshape(box)
    return g


def file_name(group, T, P, t, p):
    return f"{group}.safetensors" if T == 1 and P == 1 else f"{group}_tp{t}_pp{p}.safetensors"


def reshard(src, out, T, P):
    """Write the target files; returns {(t, p): [paths]}."""
    groups, maps = load(src)
    os.makedirs(out, exist_ok=True)
    ranks = {}
    for gname, g in sorted(groups.items()):
        n = g["n"]
        names = sorted(g["tensors"])
        for p in range(P):
            for t in range(T):
                sel = []
                for name in names:
                    ti = g["tensors"][name]
                    if not on_stage(ti["pp"], n, P, p):
                        continue
                    shape = list(ti["gshape"])
                    offs = [0] * len(shape)
                    if ti["tp_dim"] >= 0:
                        a, b = tp_bounds(shape[ti["tp_dim"]], T, t)
                        offs[ti["tp_dim"]], shape[ti["tp_dim"]] = a, b - a
                    sel.append((name, offs, shape))
                hdr, off, ents = {}, 0, {}
                places = []
                for name, offs, shape in sel:
                    ti = g["tensors"][name]
                    nb = DT[ti["dtype"]][1] * int(np.prod(shape, dtype=np.int64))
                    hdr[name] = {"dtype": ti["dtype"], "shape": shape,
                                 "data_offsets": [off, off + nb]}
                    ents[name] = {"global_shape": ti["gshape"], "offsets": offs,
                                  "tp_dim": ti["tp_dim"], "pp": ti["pp"]}
                    places.append((name, offs, shape, off))
                    off += nb
                hdr["__metadata__"] = {"format": "pt", "ckptfs": json.dumps(
                    {"version": 1, "group": gname, "num_layers": n, "tensors": ents})}
                hb = json.dumps(hdr, separators=(",", ":")).encode()
                hb += b" " * (-len(hb) % 8)
                path = os.path.join(out, file_name(gname, T, P, t, p))
                with open(path, "wb") as f:
                    f.write(struct.pack("<Q", len(hb)) + hb)
                    f.truncate(8 + len(hb) + off)
                ranks.setdefault((t, p), []).append(path)
                for name, offs, shape, o in places:
                    g["tensors"][name].setdefault("out", []).append(
                        (path, 8 + len(hb) + o, offs, shape))
        # one global tensor at a time: assemble, cut, write every part
        for name in names:
            ti = g["tensors"][name]
            arr = assemble(ti)
            for path, pos, offs, shape in ti.get("out", []):
                part = np.ascontiguousarray(arr[tuple(slice(o, o + s)
                                                      for o, s in zip(offs, shape))])
                fd = os.open(path, os.O_WRONLY)
                try:
                    mv = memoryview(part.reshape(-1).view(np.uint8))
                    done = 0
                    while done < len(mv):
                        done += os.pwrite(fd, mv[done:], pos + done)
                finally:
                    os.close(fd)
            del arr
    for mm in maps:
        try:
            mm.close()
        except BufferError:
            pass  # a numpy view still alive; the mapping goes with it
    return ranks


def read_files(paths):
    """Read the files one after the other with 1 MiB reads; returns bytes read.  The
    benchmark's readers through the mount use this too (bench.parallel_read), so both
    sides of case 4 read the same way."""
    buf = bytearray(IO)
    n = 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            while True:
                k = os.readv(fd, [buf])
                if k <= 0:
                    break
                n += k
        finally:
            os.close(fd)
    return n


def read_parallel(groups_of_paths):
    """Each list of paths is read by its own thread (read_files); returns bytes read."""
    total = [0]
    lock = threading.Lock()

    def rd(paths):
        n = read_files(paths)
        with lock:
            total[0] += n

    th = [threading.Thread(target=rd, args=(ps,)) for ps in groups_of_paths]
    for x in th:
        x.start()
    for x in th:
        x.join()
    return total[0]


def tensor_bytes(path):
    """{name: (dtype, shape, bytes)} of a safetensors file."""
    h, _, start = parse_header(path)
    out = {}
    with open(path, "rb") as f:
        for name, info in h.items():
            a, b = info["data_offsets"]
            f.seek(start + a)
            out[name] = (info["dtype"], info["shape"], f.read(b - a))
    return out


def compare_dirs(a, b):
    """Compare the tensors of the safetensors files of directories a and b (same file names,
    same tensor names, dtypes, shapes and bytes).  Returns (tensors compared, problems)."""
    probs = []
    na = sorted(x for x in os.listdir(a) if x.endswith(".safetensors"))
    nb = sorted(x for x in os.listdir(b) if x.endswith(".safetensors"))
    if na != nb:
        return 0, [f"file sets differ: {na} vs {nb}"]
    count = 0
    for fn in na:
        ta, tb = tensor_bytes(os.path.join(a, fn)), tensor_bytes(os.path.join(b, fn))
        if sorted(ta) != sorted(tb):
            probs.append(f"{fn}: tensor sets differ")
            continue
        for k in ta:
            count += 1
            if ta[k] != tb[k]:
                probs.append(f"{fn}: {k} differs")
    return count, probs


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--pp", type=int, required=True)
    ap.add_argument("--read", action="store_true", help="then read the files, one thread per rank")
    a = ap.parse_args(argv)
    ranks = reshard(a.src, a.out, a.tp, a.pp)
    if a.read:
        n = read_parallel([ranks[k] for k in sorted(ranks)])
        print(f"read {n} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
