#!/usr/bin/env python3
"""What do a node's session and the gc fence cost a durable content commit on PostgreSQL, and
what does one heartbeat cost?  (docs/cluster.md section 7; the C half is fence_cost.c)

    tools/bench/probes/fence_cost.py [--files 300] [--runs 6] [--no-fsync]

Starts its own PostgreSQL server (fsync on) as tools/bench/cluster_bench.py does, makes one
database per run and runs tools/bench/probes/fence_cost (built by `make bench`), which
alternates a plain read-write store and a node (session, heartbeat thread, fence) run by run.
--no-fsync turns the server's fsync off (ALTER SYSTEM, reloaded), so that a commit's time is
its round trips and server work rather than the disk's flush, whose variance hides them.
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from cluster_bench import Pg  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=300)
    ap.add_argument("--runs", type=int, default=6, help="runs in all, alternating modes")
    ap.add_argument("--no-fsync", action="store_true")
    a = ap.parse_args()
    pg = Pg()
    try:
        if a.no_fsync:
            for q in ("ALTER SYSTEM SET fsync = off", "SELECT pg_reload_conf()"):
                subprocess.run(["psql", "-X", "-q", "-h", pg.dir, "-U", "ckpt", "-d", "postgres",
                                "-c", q], check=True, stdout=subprocess.DEVNULL)
        with tempfile.TemporaryDirectory(prefix="fence-cost.") as d:
            dbs = [pg.new_db() for _ in range(a.runs)]
            subprocess.run([os.path.join(HERE, "fence_cost"), d, str(a.files)] + dbs, check=True)
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
