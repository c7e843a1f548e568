#!/usr/bin/python3
"""Does the daemon's RSS grow over bursts of parallel copies of a safetensors file with a large
header, and does it leak (issue 22's probe)?

A local safetensors file of TENSORS small F32 tensors and no sharding metadata (a header of
about 2 MB for the default 20,000) is copied into the mount by 16 threads at once, into a new
directory per burst; then the burst's directory is listed through the tp1_pp1 view (its 16
identical copies are replicas: the view parses every header) and its view file stat'ed; then
3 s idle.  The daemon's RSS is printed after each burst.  The daemon is started here (CKPTFS,
default fs/ckptfs) in the foreground on a new store and unmounted at the end; its exit status
is printed (a sanitizer build's LeakSanitizer report makes it non-zero; ASAN_OPTIONS=log_path
keeps the report).

  tools/bench/probes/burst_rss.py [--bursts 24] [--tensors 20000] [--idle 3] [-o OPTIONS]
"""
import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from soak import Daemon, MiB, run_threads  # noqa: E402 (tools/soak.py)

COPIES = 16


def write_source(path, ntensors):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for i in range(ntensors):
        header[f"model.layers.{i // 10}.w{i % 10}.weight"] = {
            "dtype": "F32", "shape": [2, 2], "data_offsets": [off, off + 16]}
        off += 16
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-(8 + len(head)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        f.write(os.urandom(off))
    return len(head)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bursts", type=int, default=24)
    ap.add_argument("--tensors", type=int, default=20000)
    ap.add_argument("--idle", type=float, default=3.0)
    ap.add_argument("-o", "--options", default=None,
                    help="the daemon's -o options (default: none, the daemon's defaults)")
    args = ap.parse_args(argv)

    class Opts:  # a daemon of its own, with the default options
        mount = None
        pid = None
        options = args.options
        keep = False

    work = tempfile.mkdtemp(prefix="ckptfs-burst.")
    src = os.path.join(work, "model.safetensors")
    hlen = write_source(src, args.tensors)
    print(f"# source: {args.tensors} tensors, header {hlen / MiB:.2f} MiB", flush=True)
    d = Daemon(Opts())
    rc = None
    try:
        print(f"burst 0: RSS {d.rss() / MiB:.1f} MiB", flush=True)
        for b in range(1, args.bursts + 1):
            bdir = os.path.join(d.mnt, f"burst_{b:03d}")
            os.mkdir(bdir)

            def copy(i):
                return lambda: shutil.copyfile(src, os.path.join(bdir, f"copy_{i:02d}.safetensors"))

            errs = run_threads([copy(i) for i in range(COPIES)])
            if errs:
                raise RuntimeError(f"burst {b}: {errs[0]!r}")
            vdir = os.path.join(d.mnt, "tp1_pp1", f"burst_{b:03d}")
            names = os.listdir(vdir)
            for n in names:
                os.stat(os.path.join(vdir, n))
            time.sleep(args.idle)
            print(f"burst {b}: RSS {d.rss() / MiB:.1f} MiB, view lists {names}", flush=True)
    finally:
        rc = d.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"daemon exit status after unmount: {rc}")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
