#!/usr/bin/env python3
"""The demo's last words: what the store's numbers mean, in sentences.

  tools/demo_summary.py [--ckpt CKPT] [--views tp1_pp1,tp4_pp2 --dir step_0003] MOUNTPOINT STORE

Reads `ckpt stat STORE` (CKPT, default tools/ckpt of this tree) and walks the saved files
under MOUNTPOINT (not the virtual /tpT_ppP/ views) to tell where the savings came from:
whole files that repeat another file byte for byte (data-parallel replicas), the rest of the
deduplication (chunks repeated inside and across files and steps), and compression. --views
names the resharded views the demo read, with the size of what they serve for the last
checkpoint directory: their files are built on read and take no space in the store.
"""
import argparse
import hashlib
import os
import re
import struct
import subprocess
import sys

VIEW = re.compile(r"^tp\d+_pp\d+$")


def mb(n):
    return f"{n / 1e6:,.1f} MB"


def stat(ckpt, store):
    out = subprocess.run([ckpt, "stat", store], check=True, capture_output=True,
                         text=True).stdout
    kv = {}
    for line in out.splitlines():
        k, _, v = line.partition(": ")
        kv[k] = v
    return kv


def walk(mnt):
    """Saved regular files (path, size), views left out."""
    for root, dirs, files in os.walk(mnt):
        if root == mnt:
            dirs[:] = [d for d in dirs if not VIEW.match(d)]
        for f in files:
            p = os.path.join(root, f)
            if os.path.isfile(p) and not os.path.islink(p):
                yield p, os.path.getsize(p)


def digest(path):
    """SHA-256 of the file's tensor data: after the header for a safetensors file (so that
    replicas saved with their own metadata count as the same), else of the whole file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if path.endswith(".safetensors"):
            head = f.read(8)
            if len(head) == 8:
                f.seek(8 + struct.unpack("<Q", head)[0])
            else:
                f.seek(0)
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mnt")
    ap.add_argument("store")
    ap.add_argument("--ckpt", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "ckpt"))
    ap.add_argument("--views", default="", help="comma-separated view names, e.g. tp1_pp1")
    ap.add_argument("--dir", default="", help="the checkpoint directory shown through --views")
    a = ap.parse_args(argv)
    mnt = a.mnt
    st = stat(a.ckpt, a.store)
    logical, unique, stored = (int(st[k]) for k in ("logical_bytes", "unique_bytes",
                                                    "stored_bytes"))
    files = int(st["files"])
    seen, replica_bytes, replica_files = {}, 0, 0
    for path, size in walk(mnt):
        if size == 0:
            continue
        d = digest(path)
        if d in seen:
            replica_bytes += size
            replica_files += 1
        else:
            seen[d] = path
    other_dedup = max(logical - unique - replica_bytes, 0)
    views = []
    for v in filter(None, a.views.split(",")):
        vdir = os.path.join(mnt, v, a.dir)
        if os.path.isdir(vdir):
            names = [n for n in os.listdir(vdir) if os.path.isfile(os.path.join(vdir, n))]
            views.append((v, len(names), sum(os.path.getsize(os.path.join(vdir, n))
                                             for n in names)))

    print(f"The store holds {files} files: {mb(logical)} as the jobs wrote them (logical "
          f"bytes), kept on disk in {mb(stored)} of pack files (stored bytes), "
          f"{logical / stored if stored else 0:.2f}x less.")
    print(f"- Deduplication: {mb(logical - unique)} of what was written repeated chunks the store "
          f"already held, so only {mb(unique)} of distinct chunks were kept "
          f"(dedup ratio {st['dedup_ratio']}).")
    if replica_files:
        print(f"  {mb(replica_bytes)} of that are {replica_files} files whose tensor data repeat "
              f"another file's: data-parallel replicas, which save the same shard with their "
              f"own metadata.")
    if other_dedup:
        lead = f"The other {mb(other_dedup)} are" if replica_files else "They are"
        print(f"  {lead} chunks repeated inside and across files and "
              f"steps (unchanged tensors, zero runs, the same bytes saved again).")
    print(f"- Compression: zstd stored those {mb(unique)} of chunks in {mb(stored)} "
          f"(compression ratio {st['compression_ratio']}); bf16 weights and fp32 optimizer "
          f"state compress little, because most of their bits are random mantissa bits.")
    for v, n, size in views:
        print(f"- View /{v}/{a.dir}/: {n} file(s), {mb(size)}, the same tensors resharded "
              f"for {v.replace('_', ' x ').replace('tp', 'TP ').replace('pp', 'PP ')}; "
              f"built on read from the saved shards, they take no space in the store.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
