#!/usr/bin/python3
"""A/B of two ckptfs builds through the maintained suite (tools/bench/run).

    tools/bench/ab_run.py A_DIR B_DIR [--rounds N] [--out DIR] [-- RUN_ARGS...]

A_DIR and B_DIR are build trees (each with fs/ckptfs and tools/ckpt), e.g. a
worktree of the commit before a change and this tree.  Each round runs
tools/bench/run once per build, in alternating order (A B, then B A, ...),
with the same RUN_ARGS and one shared data directory, so both builds see the
same generated checkpoints and the same machine state within minutes of each
other.  Every row of the suite's results (case, measure, baseline) is then
reported per build: the median of all its ckptfs samples over the rounds,
and B/A.  Whether a row is better higher or lower is the suite's (column
"better" below: ratio > 1 is better for "higher" rows, < 1 for "lower").

Results: OUT/ab.txt and OUT/ab.csv; each single run in OUT/rR-{a,b}/.
--report-only reports what the rounds already in OUT hold (a run that was
stopped early: complete runs only).
"""
import argparse
import csv
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_once(build, out, data, run_args, report_only=False):
    cmd = [os.path.join(HERE, "run"), "--ckptfs", os.path.join(build, "fs/ckptfs"),
           "--ckpt", os.path.join(build, "tools/ckpt"), "--out", out, "--data", data] + run_args
    if report_only:
        if not os.path.exists(os.path.join(out, "results.csv")):
            return {}
    else:
        print(f"ab_run: {' '.join(cmd)}", flush=True)
        subprocess.run(cmd, check=True)
    rows = {}
    with open(os.path.join(out, "results.csv"), newline="") as f:
        for r in csv.DictReader(f):
            key = (r["case"], r["measure"], r["baseline"])
            rows[key] = ([float(x) for x in r["ckptfs_samples"].split()],
                         [float(x) for x in r["baseline_samples"].split()],
                         r.get("better") or "higher")
    return rows


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", default="/var/tmp/ckptfs-ab")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: report the rounds' results already in OUT")
    run_args = argv[argv.index("--") + 1:] if "--" in argv else []
    a = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    os.makedirs(a.out, exist_ok=True)
    data = os.path.join(a.out, "data")
    samples = {"a": {}, "b": {}}
    for rnd in range(a.rounds):
        order = ["a", "b"] if rnd % 2 == 0 else ["b", "a"]
        for v in order:
            rows = run_once(getattr(a, v), os.path.join(a.out, f"r{rnd}-{v}"), data, run_args,
                            a.report_only)
            for k, (ck, base, better) in rows.items():
                samples[v].setdefault(k, ([], [], better))
                samples[v][k][0].extend(ck)
                samples[v][k][1].extend(base)
    hdr = ["case", "measure", "A median", "B median", "B/A", "better", "baseline",
           "A vs baseline", "B vs baseline", "samples"]
    lines = []
    for k in samples["b"]:
        if k not in samples["a"] or not samples["a"][k][0] or not samples["b"][k][0]:
            continue
        case, measure, base = k
        ma = statistics.median(samples["a"][k][0])
        mb = statistics.median(samples["b"][k][0])
        ba = samples["a"][k][1]
        bb = samples["b"][k][1]
        ra = ma / statistics.median(ba) if ba and statistics.median(ba) else float("nan")
        rb = mb / statistics.median(bb) if bb and statistics.median(bb) else float("nan")
        lines.append([case, measure, f"{ma:.4g}", f"{mb:.4g}",
                      f"{mb / ma:.3f}" if ma else "-",
                      samples["b"][k][2], base or "-",
                      f"{ra:.3g}" if ra == ra else "-", f"{rb:.3g}" if rb == rb else "-",
                      f"{len(samples['a'][k][0])}/{len(samples['b'][k][0])}"])
    widths = [max(len(str(x[i])) for x in lines + [hdr]) for i in range(len(hdr))]
    text = [f"A = {a.a}", f"B = {a.b}",
            f"rounds {a.rounds}, tools/bench/run {' '.join(run_args) or '(defaults)'}", ""]
    text.append("  ".join(h.ljust(widths[i]) for i, h in enumerate(hdr)))
    text.append("  ".join("-" * w for w in widths))
    for ln in lines:
        text.append("  ".join(str(x).ljust(widths[i]) for i, x in enumerate(ln)))
    out = "\n".join(text)
    print("\n" + out)
    with open(os.path.join(a.out, "ab.txt"), "w") as f:
        f.write(out + "\n")
    with open(os.path.join(a.out, "ab.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(hdr)
        w.writerows(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
