#!/usr/bin/python3
"""Python helpers for the resharded-view integration tests (t_views.sh, t_views_errors.sh).

Importable (py_checks snippets) or run as a command: views_lib.py CMD ARGS...

Commands (TAP output where they check something):
  make-sharded DIR SPEC SEED TP PP DP [--extras]
        write a checkpoint saved with TP x PP ranks and DP data-parallel replicas into DIR:
        group "model" (explicit ckptfs metadata, DP replicas write identical files) and group
        "optim" (FSDP-flat exp_avg pieces: box = TP part, flat_range split across DP ranks; no
        tp_dim/pp/num_layers: defaults). --extras adds passthrough files and subdirectories.
        SPEC (a local JSON file) records what was written, for "verify".
  make-plain DIR SPEC SEED [--extras]
        write a plain Llama-named model.safetensors (no ckptfs metadata, whole tensors)
  make-naive DIR OUT SEED TP DP
        write what per-rank saves with plain safetensors give: every TP rank's slice of each
        split tensor under the global name, no ckptfs metadata, DP replicas identical.  OUT
        (JSON) gets {"files": [...], "shape": [names whose slices differ in shape], "bytes":
        [names whose slices have one shape and different bytes]}.
  verify MNT LAYOUTS SPEC... [--tp-rules FILE]
        for every layout (comma-separated, e.g. tp2_pp3,tp1_pp1) and every SPEC, read
        MNT/LAYOUT/RELDIR and compare with the reference computed from the seeds: file sets,
        strict safetensors header rules, tensor sets and order, element-exact data, metadata,
        stat sizes, passthrough files and subdirectories.
  oracle MNT LAYOUTS RELDIR
        compute the expected view of MNT/RELDIR from the stored pieces themselves (coverage,
        conflicting overlaps, dtype/global-shape conflicts) and check every view file of every
        layout: broken ones must fail to open with EIO, the others must match.

Model geometry: hidden 64, intermediate 128, 16 k/v rows, vocab 250, 6 layers.
"""
import errno
import hashlib
import json
import os
import re
import struct
import sys

import numpy as np

H, I, KV, V, N_LAYERS = 64, 128, 16, 250, 6
MAX_REPORT = 8

# safetensors dtype -> (numpy dtype of the stored elements, bytes per element)
DTYPES = {
    "BOOL": ("?", 1), "U8": ("u1", 1), "I8": ("i1", 1),
    "I16": ("<i2", 2), "U16": ("<u2", 2), "F16": ("<f2", 2), "BF16": ("<u2", 2),
    "I32": ("<i4", 4), "U32": ("<u4", 4), "F32": ("<f4", 4),
    "I64": ("<i8", 8), "U64": ("<u8", 8), "F64": ("<f8", 8),
}
PP_STRINGS = ("first", "last", "ends", "all")


def tap(cond, desc):
    print(("ok - " if cond else "not ok - ") + desc, flush=True)
    return bool(cond)


def note(msg):
    print("# " + msg, flush=True)


def esize(dt):
    return DTYPES[dt][1]


def sha256(b):
    return hashlib.sha256(b).hexdigest()


# ---------------------------------------------------------------- safetensors writer/reader


def st_bytes(tensors, metadata=None):
    """tensors: list of (name, dtype, ndarray) in data order. Returns the file's bytes (header
    padded with spaces to a multiple of 8, like the reference writer)."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    blobs = []
    for name, dt, arr in tensors:
        raw = np.ascontiguousarray(arr, dtype=np.dtype(DTYPES[dt][0])).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((-(8 + len(hb))) % 8)
    return struct.pack("<Q", len(hb)) + hb + b"".join(blobs)


def write_file(path, data):
    with open(path, "wb") as f:
        f.write(data)


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def _no_dups(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"duplicate key {k!r}")
        d[k] = v
    return d


class StError(Exception):
    pass


def parse_st(buf, strict=True):
    """Parse safetensors bytes. Returns (tensors, meta, key_order) where tensors is a list, in
    data order, of (name, dtype, shape, raw bytes). strict: also the rules a synthesized view
    file must follow (space padding to a multiple of 8, data ordered by descending element
    size then name). Raises StError naming the first broken rule."""
    if len(buf) < 8:
        raise StError(f"file of {len(buf)} bytes")
    n = struct.unpack_from("<Q", buf)[0]
    if n < 2 or 8 + n > len(buf):
        raise StError(f"header length {n} (file {len(buf)} bytes)")
    hb = buf[8:8 + n]
    if hb[:1] != b"{":
        raise StError(f"header starts with {hb[:1]!r}, not '{{'")
    if strict:
        if (8 + n) % 8:
            raise StError(f"8 + header length {n} is not a multiple of 8")
        body = hb.rstrip(b" ")
        if not body.endswith(b"}"):
            raise StError(f"header padding is not spaces (ends {hb[-12:]!r})")
    try:
        hdr = json.loads(hb.decode("utf-8"), object_pairs_hook=_no_dups)
    except (ValueError, UnicodeDecodeError) as e:
        raise StError(f"header JSON: {e}") from None
    if not isinstance(hdr, dict):
        raise StError("header is not an object")
    key_order = [k for k in hdr if k != "__metadata__"]
    meta = hdr.pop("__metadata__", None)
    if meta is not None:
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise StError("__metadata__ is not a string->string map")
    ents = []
    for name, e in hdr.items():
        if not isinstance(e, dict) or e.get("dtype") not in DTYPES:
            raise StError(f"tensor {name}: bad entry {e!r}")
        shape, offs = e.get("shape"), e.get("data_offsets")
        if (not isinstance(shape, list) or not all(isinstance(x, int) and x >= 0 for x in shape)
                or not isinstance(offs, list) or len(offs) != 2):
            raise StError(f"tensor {name}: bad shape/data_offsets {e!r}")
        want = int(np.prod(shape, dtype=object)) * esize(e["dtype"])
        if offs[1] - offs[0] != want:
            raise StError(f"tensor {name}: data_offsets {offs} for {want} bytes")
        ents.append((offs[0], offs[1], name, e["dtype"], tuple(shape)))
    ents.sort()
    pos = 0
    for b, e, name, _, _ in ents:
        if b != pos:
            raise StError(f"tensor {name}: data begins at {b}, expected {pos} (hole/overlap)")
        pos = e
    if 8 + n + pos != len(buf):
        raise StError(f"data ends at {8 + n + pos}, file has {len(buf)} bytes")
    if strict:
        order = [x[2] for x in ents]
        canon = [x[2] for x in sorted(ents, key=lambda x: (-esize(x[3]), x[2]))]
        if order != canon:
            raise StError(f"data order {order[:6]}... is not by descending element size then "
                          f"name ({canon[:6]}...)")
    base = 8 + n
    tensors = [(name, dt, shape, bytes(buf[base + b:base + e])) for b, e, name, dt, shape in ents]
    return tensors, meta, key_order


def st_array(dt, shape, raw):
    return np.frombuffer(raw, dtype=np.dtype(DTYPES[dt][0])).reshape(shape)


# ---------------------------------------------------------------- layout arithmetic


def tp_bounds(size, parts, t):
    c = -(-size // parts)
    return min(t * c, size), min((t + 1) * c, size)


def chunk(arr, dim, parts, t):
    """torch.chunk(arr, parts, dim)[t], with empty trailing parts (0 along dim)."""
    lo, hi = tp_bounds(arr.shape[dim], parts, t)
    sl = [slice(None)] * arr.ndim
    sl[dim] = slice(lo, hi)
    return arr[tuple(sl)], lo


def stage_of_layer(layer, n, P):
    if n == 0:
        return 0
    if layer >= n:
        return P - 1
    for p in range(P):
        if p * n // P <= layer < (p + 1) * n // P:
            return p
    raise AssertionError("unreachable")


def on_stage(pp, n, P, p):
    if isinstance(pp, int):
        return stage_of_layer(pp, n, P) == p
    return {"first": p == 0, "last": p == P - 1, "ends": p in (0, P - 1), "all": True}[pp]


_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")


def pp_rule(name):
    m = _LAYER_RE.search(name)
    if m:
        return int(m.group(1))
    if any(s in name for s in ("embed", "wte", "wpe", "tok_embeddings")):
        return "first"
    return "last"


def tp_rule(name, ndim, extra_rules=()):
    """extra_rules: list of (compiled regex, dim) tried first (-o tp_rules=FILE)."""
    d = None
    for rx, dim in extra_rules:
        if rx.search(name):
            d = dim
            break
    if d is None:
        if any(s in name for s in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj",
                                   "embed_tokens", "lm_head")):
            d = 0
        elif "o_proj.weight" in name or "down_proj.weight" in name:
            d = 1
        else:
            d = -1
    return d if d < ndim else -1


def load_tp_rules(path):
    rules = []
    with open(path) as f:
        for line in f:
            s = line.strip()
            if not s or s.startswith("#"):
                continue
            rx, dim = s.rsplit(None, 1)
            rules.append((re.compile(rx.strip()), int(dim)))
    return rules


def view_file_name(group, T, P, t, p):
    if T == 1 and P == 1:
        return f"{group}.safetensors"
    return f"{group}_tp{t}_pp{p}.safetensors"


def parse_layout(s):
    m = re.fullmatch(r"tp([1-9][0-9]*)_pp([1-9][0-9]*)", s)
    if not m:
        raise ValueError(s)
    return int(m.group(1)), int(m.group(2))


# ---------------------------------------------------------------- the test model


def build_model(seed):
    """Global tensors of the test model: list of (name, dtype, array, tp_dim, pp); BF16 arrays
    hold the raw uint16 bit patterns."""
    rng = np.random.default_rng(seed)

    def bf16(shape):
        f = rng.standard_normal(shape, dtype=np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16)

    def f16(shape):
        return rng.standard_normal(shape).astype(np.float16)

    def f32(shape):
        return rng.standard_normal(shape).astype(np.float32)

    out = [("model.embed_tokens.weight", "BF16", bf16((V, H)), 0, "first")]
    for L in range(N_LAYERS):
        p = f"model.layers.{L}."
        out += [
            (p + "self_attn.q_proj.weight", "BF16", bf16((H, H)), 0, L),
            (p + "self_attn.k_proj.weight", "BF16", bf16((KV, H)), 0, L),
            (p + "self_attn.v_proj.weight", "BF16", bf16((KV, H)), 0, L),
            (p + "self_attn.o_proj.weight", "BF16", bf16((H, H)), 1, L),
            (p + "mlp.gate_proj.weight", "F16", f16((I, H)), 0, L),
            (p + "mlp.up_proj.weight", "F16", f16((I, H)), 0, L),
            (p + "mlp.down_proj.weight", "F16", f16((H, I)), 1, L),
            (p + "input_layernorm.weight", "F32", f32((H,)), -1, L),
            (p + "post_attention_layernorm.weight", "F32", f32((H,)), -1, L),
        ]
    out += [
        ("model.norm.weight", "F32", f32((H,)), -1, "last"),
        ("lm_head.weight", "F32", f32((V, H)), 0, "last"),
        # I64 scalar on every stage, BOOL mask on the first and last stage
        ("step", "I64", np.array(1000 + seed, dtype=np.int64), -1, "all"),
        ("attention_mask", "BOOL", rng.random((16, 16)) < 0.5, -1, "ends"),
        # 5 rows split along dim 0: some TP parts are empty for tp4 (saving) and tp8 (views)
        ("model.rope.inv_freq_shard", "F32", f32((5,)), 0, "all"),
    ]
    return out


def build_optim(seed):
    """exp_avg (F32) of every 2-D weight, placed like the weight (the same rules resolve from
    the names), plus a whole I64 "step" (no metadata entry: replicated, last stage)."""
    rng = np.random.default_rng(seed + 7777)
    out = []
    for name, _, arr, d, pp in build_model(seed):
        if arr.ndim == 2 and name.endswith(".weight"):
            out.append((name + ".exp_avg", "F32", rng.standard_normal(arr.shape)
                        .astype(np.float32), d, pp))
    out.append(("step", "I64", np.array(2000 + seed, dtype=np.int64), -1, "last"))
    return out


def build_plain(seed, extra_rules=()):
    """The model with placement from the name rules only (what a plain file resolves to)."""
    return [(n, dt, a, tp_rule(n, a.ndim, extra_rules), pp_rule(n))
            for n, dt, a, _, _ in build_model(seed)]


def num_layers_of(tensors):
    return 1 + max((pp for *_, pp in tensors if isinstance(pp, int)), default=-1)


def expected_view(tensors, n, T, P):
    """{(t, p): [(name, dtype, part, offsets), ...]} of a layout."""
    files = {}
    for p in range(P):
        for t in range(T):
            sel = []
            for name, dt, arr, d, pp in tensors:
                if not on_stage(pp, n, P, p):
                    continue
                offs = [0] * arr.ndim
                part = arr
                if d >= 0:
                    part, offs[d] = chunk(arr, d, T, t)
                sel.append((name, dt, part, offs))
            files[(t, p)] = sel
    return files


# ---------------------------------------------------------------- writing checkpoints


def _extras(root, seed, spec):
    """Passthrough files and subdirectories."""
    rng = np.random.default_rng(seed + 99)
    files = {
        "config.json": json.dumps({"hidden_size": H, "num_hidden_layers": N_LAYERS,
                                   "seed": seed}, indent=1).encode(),
        "tokenizer.json": json.dumps({"vocab": {f"tok{i}": i for i in range(V)}}).encode(),
        "rng_state.pt": rng.bytes(70001),
        "extra/notes.txt": b"notes\n" * 100,
        "extra/deeper/blob.bin": rng.bytes(5000),
        "extra/empty.txt": b"",
    }
    for rel, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        write_file(os.path.join(root, rel), data)
    os.makedirs(os.path.join(root, "extra/emptydir"), exist_ok=True)
    d = spec["dirs"]
    d[""]["files"].update({k: sha256(v) for k, v in files.items() if "/" not in k})
    d[""]["subdirs"].append("extra")
    d["extra"] = {"groups": {}, "files": {"notes.txt": sha256(files["extra/notes.txt"]),
                                          "empty.txt": sha256(b"")},
                  "subdirs": ["deeper", "emptydir"]}
    # a nested group with an explicit name and no tensor entries (whole tensors, name rules)
    write_file(os.path.join(root, "extra/deeper/ema.safetensors"),
               st_bytes([(n, dt, a) for n, dt, a, _, _ in build_model(seed + 1)],
                        {"format": "pt", "ckptfs": json.dumps({"version": 1, "group": "ema"})}))
    d["extra/deeper"] = {"groups": {"ema": ["plain", seed + 1]},
                         "files": {"blob.bin": sha256(files["extra/deeper/blob.bin"])},
                         "subdirs": []}
    d["extra/emptydir"] = {"groups": {}, "files": {}, "subdirs": []}


def new_spec(reldir):
    return {"reldir": reldir, "dirs": {"": {"groups": {}, "files": {}, "subdirs": []}}}


def save_sharded(root, seed, T, P, DP, spec=None, group_prefix=""):
    """Write the model and optimizer saved with T x P x DP ranks into root."""
    os.makedirs(root, exist_ok=True)
    model = build_model(seed)
    optim = build_optim(seed)
    n = N_LAYERS
    for p in range(P):
        for t in range(T):
            pieces, ents = [], {}
            for name, dt, arr, d, pp in model:
                if not on_stage(pp, n, P, p):
                    continue
                offs = [0] * arr.ndim
                part = arr
                if d >= 0:
                    part, offs[d] = chunk(arr, d, T, t)
                ents[name] = {"global_shape": list(arr.shape), "offsets": offs, "tp_dim": d,
                              "pp": pp}
                pieces.append((name, dt, part))
            ck = {"version": 1, "group": "model", "num_layers": n, "tensors": ents}
            data = st_bytes(pieces, {"format": "pt", "ckptfs": json.dumps(ck)})
            for r in range(DP):
                write_file(os.path.join(root, f"{group_prefix}model-tp{t}-pp{p}-dp{r}.safetensors"),
                           data)
            for r in range(DP):
                pieces, ents = [], {}
                for name, dt, arr, d, pp in optim:
                    if name == "step":
                        pieces.append((name, dt, arr))  # no entry: whole
                        continue
                    if not on_stage(pp, n, P, p):
                        continue
                    offs = [0] * arr.ndim
                    part = arr
                    if d >= 0:
                        part, offs[d] = chunk(arr, d, T, t)
                    flat = np.ascontiguousarray(part).reshape(-1)
                    a, b = tp_bounds(flat.size, DP, r)
                    ents[name] = {"global_shape": list(arr.shape), "offsets": offs,
                                  "box_shape": list(part.shape), "flat_range": [a, b]}
                    pieces.append((name, dt, flat[a:b]))
                ck = {"version": 1, "group": "optim", "tensors": ents}
                data = st_bytes(pieces[::-1], {"format": "pt", "ckptfs": json.dumps(ck)})
                write_file(os.path.join(root, f"{group_prefix}optim-tp{t}-pp{p}-dp{r}.safetensors"),
                           data)
    if spec is not None:
        spec["dirs"][""]["groups"].update({"model": ["model", seed], "optim": ["optim", seed]})


def save_plain(root, seed, spec=None):
    os.makedirs(root, exist_ok=True)
    data = st_bytes([(n, dt, a) for n, dt, a, _, _ in build_model(seed)], {"format": "pt"})
    write_file(os.path.join(root, "model.safetensors"), data)
    if spec is not None:
        spec["dirs"][""]["groups"]["model"] = ["plain", seed]


def save_naive(root, seed, T, DP):
    """Per-rank files as plain safetensors writers produce them (see make-naive)."""
    os.makedirs(root, exist_ok=True)
    model = build_model(seed)
    files, shape, same = [], [], []
    for name, dt, arr, d, pp in model:
        if d < 0:
            continue
        shapes = {chunk(arr, d, T, t)[0].shape for t in range(T)}
        (shape if len(shapes) > 1 else same).append(name)
    for t in range(T):
        pieces = []
        for name, dt, arr, d, pp in model:
            part = chunk(arr, d, T, t)[0] if d >= 0 else arr
            pieces.append((name, dt, part))
        data = st_bytes(pieces, {"format": "pt"})
        for r in range(DP):
            fn = f"model-rank{t}-dp{r}.safetensors"
            write_file(os.path.join(root, fn), data)
            files.append(fn)
    return {"files": sorted(files), "shape": sorted(shape), "bytes": sorted(same)}


# ---------------------------------------------------------------- verifying views


_CACHE = {}


def group_tensors(kind, seed, extra_rules=()):
    key = (kind, seed, id(extra_rules))
    if key not in _CACHE:
        t = {"model": build_model, "optim": build_optim}.get(kind)
        t = t(seed) if t else build_plain(seed, extra_rules)
        _CACHE[key] = t
    return _CACHE[key]


def check_meta(meta, group, n, exp, names):
    """Problems with the __metadata__ of a view file; exp: {name: (gshape, offs, part shape,
    tp_dim, pp)}."""
    probs = []
    if not isinstance(meta, dict):
        return ["no __metadata__"]
    if meta.get("format") != "pt":
        probs.append(f'__metadata__ "format" is {meta.get("format")!r}, want "pt"')
    if "ckptfs" not in meta:
        return probs + ['no "ckptfs" in __metadata__']
    try:
        ck = json.loads(meta["ckptfs"], object_pairs_hook=_no_dups)
    except ValueError as e:
        return probs + [f"ckptfs metadata does not parse: {e}"]
    if not isinstance(ck, dict):
        return probs + ["ckptfs metadata is not an object"]
    if ck.get("version") != 1:
        probs.append(f"ckptfs version {ck.get('version')!r}")
    if ck.get("group", "model") != group:
        probs.append(f"ckptfs group {ck.get('group')!r}, want {group!r}")
    if "num_layers" in ck and ck["num_layers"] != n:
        probs.append(f"ckptfs num_layers {ck['num_layers']!r}, want {n}")
    ents = ck.get("tensors", {})
    if not isinstance(ents, dict):
        return probs + ["ckptfs tensors is not an object"]
    for k in ents:
        if k not in names:
            probs.append(f"ckptfs entry {k} names no tensor of the file")
    for name, (gshape, offs, pshape, d, pp) in exp.items():
        e = ents.get(name)
        if e is None:
            if list(pshape) != list(gshape):
                probs.append(f"{name}: no ckptfs entry, but the part {list(pshape)} is not "
                             f"the whole {list(gshape)}")
            continue
        if e.get("global_shape", list(pshape)) != list(gshape):
            probs.append(f"{name}: global_shape {e.get('global_shape')} want {list(gshape)}")
        if e.get("offsets", [0] * len(gshape)) != list(offs):
            probs.append(f"{name}: offsets {e.get('offsets')} want {list(offs)}")
        fr = e.get("flat_range")
        if fr is not None and (fr != [0, int(np.prod(pshape))]
                               or e.get("box_shape") != list(pshape)):
            probs.append(f"{name}: flat_range {fr} box_shape {e.get('box_shape')} in a view file")
        if "tp_dim" in e and e["tp_dim"] != d and not (d < 0 and e["tp_dim"] < 0):
            probs.append(f"{name}: tp_dim {e['tp_dim']} want {d}")
        if "pp" in e and e["pp"] != pp:
            probs.append(f"{name}: pp {e['pp']!r} want {pp!r}")
    return probs


def diff_arrays(dt, want, got_raw, got_shape):
    if tuple(got_shape) != tuple(want.shape):
        return f"shape {list(got_shape)} want {list(want.shape)}"
    wb = np.ascontiguousarray(want, dtype=np.dtype(DTYPES[dt][0])).tobytes()
    if wb == got_raw:
        return None
    w = np.frombuffer(wb, np.uint8).reshape(-1, esize(dt))
    g = np.frombuffer(got_raw, np.uint8).reshape(-1, esize(dt))
    bad = np.nonzero((w != g).any(axis=1))[0]
    return (f"{len(bad)} of {len(w)} elements differ, first at flat index {bad[0]} "
            f"(multi-index {np.unravel_index(bad[0], want.shape) if want.ndim else ()})")


def verify_file(path, group, n, exp_list, probs, label):
    """Read one view file (stat size before reading) and check_buf() it. Returns what
    check_buf returns, or 0 when the file cannot be read."""
    try:
        size = os.stat(path).st_size
        buf = read_file(path)
    except OSError as e:
        probs.append(f"{label}: {e}")
        return 0
    return check_buf(buf, size, exp_list, probs, label)


def check_buf(buf, size, exp_list, probs, label):
    """Check the bytes of a view file: size == stat size, strict header, tensor set, dtypes,
    element-exact data. exp_list: [(name, dtype, part, offsets)]. Appends problems; returns
    (tensor count, __metadata__, {name: (None, offsets, part shape, None, None)}) or 0."""
    if size != len(buf):
        probs.append(f"{label}: stat size {size} but {len(buf)} bytes read")
    try:
        tensors, meta, key_order = parse_st(buf)
    except StError as e:
        probs.append(f"{label}: {e}")
        return 0
    got = {name: (dt, shape, raw) for name, dt, shape, raw in tensors}
    want_names = sorted(x[0] for x in exp_list)
    if sorted(got) != want_names:
        probs.append(f"{label}: tensors extra {sorted(set(got) - set(want_names))[:4]} "
                     f"missing {sorted(set(want_names) - set(got))[:4]} "
                     f"(got {len(got)}, want {len(want_names)})")
    exp = {}
    for name, dt, part, offs in exp_list:
        exp[name] = (None, offs, part.shape, None, None)
        if name not in got:
            continue
        gdt, gshape, raw = got[name]
        if gdt != dt:
            probs.append(f"{label}: {name} dtype {gdt} want {dt}")
            continue
        d = diff_arrays(dt, part, raw, gshape)
        if d:
            probs.append(f"{label}: {name}: {d}")
    return len(got), meta, exp


def verify_dir(mnt, layout, spec, probs, extra_rules=()):
    """Check MNT/LAYOUT/RELDIR against spec (recursively). Returns (files, tensors) checked."""
    T, P = parse_layout(layout)
    nfiles = ntensors = 0
    for rel, d in spec["dirs"].items():
        vdir = os.path.join(mnt, layout, spec["reldir"], rel)
        label = os.path.join(layout, spec["reldir"], rel).rstrip("/")
        want = set(d["files"]) | set(d["subdirs"])
        for group in d["groups"]:
            want |= {view_file_name(group, T, P, t, p) for t in range(T) for p in range(P)}
        try:
            names = set(os.listdir(vdir))
        except OSError as e:
            probs.append(f"{label}: listdir: {e}")
            continue
        if names != want:
            probs.append(f"{label}: entries extra {sorted(names - want)[:6]} missing "
                         f"{sorted(want - names)[:6]}")
        for sd in d["subdirs"]:
            if not os.path.isdir(os.path.join(vdir, sd)):
                probs.append(f"{label}/{sd}: not a directory")
        for fn, h in d["files"].items():
            p = os.path.join(vdir, fn)
            try:
                st = os.stat(p)
                b = read_file(p)
            except OSError as e:
                probs.append(f"{label}/{fn}: {e}")
                continue
            nfiles += 1
            if sha256(b) != h or st.st_size != len(b):
                probs.append(f"{label}/{fn}: passthrough content differs (size {st.st_size}, "
                             f"read {len(b)})")
        for group, (kind, seed) in d["groups"].items():
            tensors = group_tensors(kind, seed, extra_rules)
            n = num_layers_of(tensors)
            files = expected_view(tensors, n, T, P)
            placement = {name: (a.shape, d_, pp) for name, _, a, d_, pp in tensors}
            for (t, p), exp_list in files.items():
                fn = view_file_name(group, T, P, t, p)
                r = verify_file(os.path.join(vdir, fn), group, n, exp_list, probs,
                                f"{label}/{fn}")
                if not isinstance(r, tuple):
                    continue
                cnt, meta, exp = r
                nfiles += 1
                ntensors += cnt
                full = {name: (placement[name][0], offs, pshape, placement[name][1],
                               placement[name][2])
                        for name, (_, offs, pshape, _, _) in exp.items()}
                for m in check_meta(meta, group, n, full, set(exp)):
                    probs.append(f"{label}/{fn}: {m}")
    return nfiles, ntensors


def report(desc, probs):
    tap(not probs, desc + (f" ({len(probs)} problems)" if probs else ""))
    for m in probs[:MAX_REPORT]:
        note("  " + m)
    if len(probs) > MAX_REPORT:
        note(f"  ... and {len(probs) - MAX_REPORT} more")


def cmd_verify(mnt, layouts, specs, extra_rules=()):
    for sp in specs:
        for layout in layouts:
            probs = []
            nf, nt = verify_dir(mnt, layout, sp, probs, extra_rules)
            report(f"view {layout}/{sp['reldir']}: {nf} files, {nt} tensors as expected", probs)


# ---------------------------------------------------------------- oracle from stored pieces


def _global_index(gshape, offs, box, flat=None):
    """Flat row-major indices in the global tensor of the elements of a box (or of elements
    [a, b) of its flattening)."""
    if len(gshape) == 0:
        idx = np.zeros(1, dtype=np.int64)
    else:
        grids = np.indices(box).reshape(len(box), -1) + np.array(offs).reshape(-1, 1)
        idx = np.ravel_multi_index(tuple(grids), gshape) if grids.size else \
            np.zeros(0, dtype=np.int64)
    if flat is not None:
        idx = idx[flat[0]:flat[1]]
    return idx


def oracle(srcdir, extra_rules=()):
    """Expected content of the groups in srcdir from the stored pieces:
    {group: {"n": num_layers, "tensors": {name: info}}}, info has dtype, gshape, data (uint8
    array [elements, esize]), covered/conflict bool arrays, bad (reason or None), tp_dim, pp.
    Files that are not safetensors or carry unusable ckptfs metadata are skipped (listed in
    the "skipped" key)."""
    groups, skipped = {}, []
    for fn in sorted(os.listdir(srcdir)):
        p = os.path.join(srcdir, fn)
        if not os.path.isfile(p):
            continue
        try:
            tensors, meta, _ = parse_st(read_file(p), strict=False)
        except StError:
            skipped.append(fn)
            continue
        ck = {}
        if meta and "ckptfs" in meta:
            try:
                ck = json.loads(meta["ckptfs"])
                if ck.get("version") != 1:
                    raise ValueError("version")
                ents = ck.get("tensors", {})
                if not isinstance(ents, dict) or not set(ents) <= {x[0] for x in tensors}:
                    raise ValueError("entries")
            except (ValueError, AttributeError):
                skipped.append(fn)
                continue
        g = groups.setdefault(ck.get("group", "model"), {"n": None, "pieces": {}})
        if "num_layers" in ck:
            g["n"] = ck["num_layers"]
        ents = ck.get("tensors", {})
        for name, dt, shape, raw in tensors:
            e = ents.get(name, {})
            g["pieces"].setdefault(name, []).append((fn, dt, shape, raw, e))
    out = {}
    for gname, g in groups.items():
        res = {}
        for name, pieces in g["pieces"].items():
            dts = {x[1] for x in pieces}
            gshapes = {tuple(x[4].get("global_shape", x[2])) for x in pieces}
            info = {"bad": None, "dtype": pieces[0][1], "gshape": list(gshapes)[0]}
            if len(dts) > 1:
                info["bad"] = f"dtypes disagree: {sorted(dts)}"
            elif len(gshapes) > 1:
                info["bad"] = f"global shapes disagree: {sorted(gshapes)}"
            gshape = info["gshape"]
            es = esize(info["dtype"])
            nel = int(np.prod(gshape, dtype=np.int64))
            data = np.zeros((nel, es), np.uint8)
            cov = np.zeros(nel, bool)
            conf = np.zeros(nel, bool)
            tp_dims, pps, split = set(), set(), set()
            if not info["bad"]:
                for fn, dt, shape, raw, e in pieces:
                    offs = e.get("offsets", [0] * len(gshape))
                    fr = e.get("flat_range")
                    box = e.get("box_shape", gshape) if fr else list(shape)
                    idx = _global_index(gshape, offs, box, fr)
                    vals = np.frombuffer(raw, np.uint8).reshape(-1, es)
                    old = cov[idx]
                    conf[idx[old]] |= (data[idx[old]] != vals[old]).any(axis=1)
                    data[idx] = vals
                    cov[idx] = True
                    if "tp_dim" in e:
                        tp_dims.add(e["tp_dim"])
                    if "pp" in e:
                        pps.add(e["pp"] if isinstance(e["pp"], int) else str(e["pp"]))
                    for k in range(len(gshape)):
                        if offs[k] != 0 or box[k] != gshape[k]:
                            split.add(k)
            if tp_dims:
                info["tp_dim"] = tp_dims.pop()
            elif len(split) == 1:
                info["tp_dim"] = split.pop()
            else:
                info["tp_dim"] = tp_rule(name, len(gshape), extra_rules)
            info["pp"] = pps.pop() if pps else pp_rule(name)
            info.update(data=data, covered=cov, conflict=conf)
            res[name] = info
        n = g["n"]
        if n is None:
            n = 1 + max((i["pp"] for i in res.values() if isinstance(i["pp"], int)), default=-1)
        out[gname] = {"n": n, "tensors": res}
    return out, skipped


def oracle_view(og, T, P):
    """{(t, p): (broken, maybe, [(name, dtype, part, offs)])} for one oracle group: broken is
    the reason the file cannot be served (a tensor part not covered or overlapping a region
    where pieces disagree, a tensor whose pieces disagree on dtype or global shape); maybe
    (only when not broken) names a tensor of the file whose pieces disagree elsewhere: the
    file may then be served or fail with EIO."""
    n = og["n"]
    files = {}
    for p in range(P):
        for t in range(T):
            sel, broken, maybe = [], None, None
            for name in sorted(og["tensors"]):
                info = og["tensors"][name]
                if not on_stage(info["pp"], n, P, p):
                    continue
                if info["bad"]:
                    broken = broken or f"{name}: {info['bad']}"
                    continue
                gshape = info["gshape"]
                es = esize(info["dtype"])
                full = info["data"].reshape(tuple(gshape) + (es,))
                cov = info["covered"].reshape(gshape)
                conf = info["conflict"].reshape(gshape)
                offs = [0] * len(gshape)
                sl = [slice(None)] * len(gshape)
                d = info["tp_dim"]
                if d >= 0:
                    lo, hi = tp_bounds(gshape[d], T, t)
                    sl[d] = slice(lo, hi)
                    offs[d] = lo
                sl = tuple(sl)
                if not cov[sl].all():
                    broken = broken or f"{name}: elements not covered"
                if conf[sl].any():
                    broken = broken or f"{name}: overlapping pieces disagree"
                elif conf.any():
                    maybe = maybe or f"{name}: pieces disagree in another part"
                part = np.ascontiguousarray(full[sl]).view(np.dtype(DTYPES[info["dtype"]][0]))
                part = part.reshape(part.shape[:-1])
                sel.append((name, info["dtype"], part, offs))
            files[(t, p)] = (broken, None if broken else maybe, sel)
    return files


def cmd_oracle(mnt, layouts, reldir):
    og, skipped = oracle(os.path.join(mnt, reldir))
    if skipped:
        note(f"oracle: {reldir}: not reshardable (skipped): {skipped}")
    for layout in layouts:
        T, P = parse_layout(layout)
        probs = []
        nbroken = nok = nmaybe = 0
        want = {view_file_name(g, T, P, t, p) for g in og for t in range(T) for p in range(P)}
        try:
            names = set(os.listdir(os.path.join(mnt, layout, reldir)))
            if want - names:
                probs.append(f"{layout}/{reldir}: readdir misses {sorted(want - names)[:6]}")
            if names - want:
                note(f"{layout}/{reldir}: other entries: {sorted(names - want)}")
        except OSError as e:
            probs.append(f"{layout}/{reldir}: listdir: {e}")
        for group, g in sorted(og.items()):
            for (t, p), (broken, maybe, sel) in oracle_view(g, T, P).items():
                fn = view_file_name(group, T, P, t, p)
                path = os.path.join(mnt, layout, reldir, fn)
                label = f"{layout}/{reldir}/{fn}"
                if maybe:
                    try:
                        with open(path, "rb"):
                            pass
                    except OSError as e:
                        if e.errno == errno.EIO:
                            nbroken += 1
                            nmaybe += 1
                            continue
                if broken:
                    nbroken += 1
                    try:
                        with open(path, "rb") as f:
                            f.read()
                        probs.append(f"{label}: opened and read although {broken} "
                                     f"(want EIO)")
                    except OSError as e:
                        if e.errno != errno.EIO:
                            probs.append(f"{label}: {errno.errorcode.get(e.errno, e.errno)}, "
                                         f"want EIO ({broken})")
                    continue
                nok += 1
                r = verify_file(path, group, g["n"], sel, probs, label)
                if isinstance(r, tuple):
                    for m in check_meta(r[1], group, g["n"], {}, set(r[2])):
                        probs.append(f"{label}: {m}")
        if nmaybe:
            note(f"{layout}/{reldir}: {nmaybe} files holding only consistent parts of a tensor "
                 f"whose pieces disagree elsewhere fail with EIO too (allowed)")
        report(f"view {layout}/{reldir}: {nbroken} files fail with EIO, {nok} files exact",
               probs)


def rewrite_file(path, fn):
    """Rewrite a safetensors file in place: fn(tensors, meta) gets the parsed tensors (list of
    [name, dtype, shape, raw]) and __metadata__ (dict; "ckptfs" decoded to a dict) and edits
    them in place. Data order is kept."""
    tensors, meta, _ = parse_st(read_file(path), strict=False)
    tensors = [list(x) for x in tensors]
    meta = dict(meta or {})
    if "ckptfs" in meta:
        meta["ckptfs"] = json.loads(meta["ckptfs"])
    fn(tensors, meta)
    if isinstance(meta.get("ckptfs"), dict):
        meta["ckptfs"] = json.dumps(meta["ckptfs"])
    arrs = [(name, dt, np.frombuffer(raw, np.uint8).view(np.dtype(DTYPES[dt][0])).reshape(shape))
            for name, dt, shape, raw in tensors]
    write_file(path, st_bytes(arrs, meta))


def problems_of(srcdir):
    """[(group, name, kind, ranges)] of the tensors of srcdir that cannot be served: kind is
    "missing" (ranges: [lo, hi) per dim of the bounding box of the uncovered elements),
    "conflict" (same, of the disagreeing elements) or "bad" (dtype/global shape)."""
    og, _ = oracle(srcdir)
    out = []
    for g, grp in sorted(og.items()):
        for name, info in sorted(grp["tensors"].items()):
            if info["bad"]:
                out.append((g, name, "bad", info["bad"]))
                continue
            for kind, mask in (("missing", ~info["covered"]), ("conflict", info["conflict"])):
                if mask.any():
                    idx = np.array(np.unravel_index(np.nonzero(mask)[0], info["gshape"]))
                    ranges = [[int(idx[k].min()), int(idx[k].max()) + 1]
                              for k in range(len(info["gshape"]))]
                    out.append((g, name, kind, ranges))
    return out


# ---------------------------------------------------------------- command line


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    args = argv[2:]
    if cmd in ("make-sharded", "make-plain"):
        extras = "--extras" in args
        args = [a for a in args if a != "--extras"]
        root, specfile, seed = args[0], args[1], int(args[2])
        spec = new_spec(os.path.basename(root.rstrip("/")))
        if cmd == "make-sharded":
            save_sharded(root, seed, int(args[3]), int(args[4]), int(args[5]), spec)
        else:
            save_plain(root, seed, spec)
        if extras:
            _extras(root, seed, spec)
        with open(specfile, "w") as f:
            json.dump(spec, f)
        return 0
    if cmd == "make-naive":
        out = save_naive(args[0], int(args[2]), int(args[3]), int(args[4]))
        with open(args[1], "w") as f:
            json.dump(out, f)
        return 0
    if cmd == "verify":
        rules = ()
        if "--tp-rules" in args:
            i = args.index("--tp-rules")
            rules = load_tp_rules(args[i + 1])
            del args[i:i + 2]
        specs = []
        for sf in args[2:]:
            with open(sf) as f:
                specs.append(json.load(f))
        cmd_verify(args[0], args[1].split(","), specs, rules)
        return 0
    if cmd == "oracle":
        cmd_oracle(args[0], args[1].split(","), args[2])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
