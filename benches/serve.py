"""What serving over HTTP costs: the same index searched in-process and through
``nearline serve`` + ``nearline.Client``, each side in its own process, alternating, medians.

Modes, each with the same calls on both sides:

- ``batch``: the query set in batches of ``--batch`` queries, one caller (throughput).
- ``cN`` (for each N of ``--clients``): a closed-loop load generator, N concurrent callers
  each sending one query a call (an online service); QPS and each call's latency (p50, p99).

The in-process side runs the same callers as threads calling ``Index.search`` on one open
index; the served side runs them as client threads, one kept-alive connection each, against
a server holding the same index with the same search threads. Every answer of the served
side must equal the in-process one (ids, bit for bit), so a figure never compares different
work. ``--target-recall`` picks the first L of ``--L`` whose recall@k reaches it.

    python benches/serve.py --index IDX --queries Q.fbin --gt GT.bin --L 20,30,50,100 \\
        --target-recall 0.95 --clients 1,2,4,8,16,32,64 --reps 3 --out serve.json --plot serve.png
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

import nearline
from nearline.client import Client


def _calls(queries: np.ndarray, mode: str, batch: int):
    """The list of query blocks each caller sends, in order."""
    if mode == "batch":
        return [[queries[i:i + batch] for i in range(0, len(queries), batch)]]
    clients = int(mode[1:])
    rows = [queries[i:i + 1] for i in range(len(queries))]
    return [rows[c::clients] for c in range(clients)]


def run_calls(search, plan, k: int, L: int):
    """Runs each caller's blocks in its own thread: (seconds, ids per caller, call latencies in ms)."""
    out = [[] for _ in plan]
    lat = [[] for _ in plan]

    def caller(c):
        for block in plan[c]:
            t = time.perf_counter()
            ids = search(block, k=k, L=L)[0]
            lat[c].append((time.perf_counter() - t) * 1e3)
            out[c].append(ids)

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(len(plan))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, out, [x for c in lat for x in c]


def measure(search, q: np.ndarray, args) -> dict:
    res = {}
    for mode in args.modes:
        plan = _calls(q, mode, args.batch)
        run_calls(search, plan, args.k, args.L)  # warm-up: caches, connections
        secs, out, lat = run_calls(search, plan, args.k, args.L)
        res[mode] = {"qps": len(q) / secs, "ids": [np.concatenate(o).tolist() for o in out],
                     "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99))}
    return res


def child(args) -> None:
    """In-process side (run in a subprocess): prints one JSON line."""
    q = nearline.read_vectors(args.queries)[: args.nq]
    with nearline.open(args.index) as ix:
        res = measure(ix.search, q, args)
        mem = ix.info()["memory"]
        res["budget"], res["within_budget"] = mem["budget"], mem["within_budget"]
    print(json.dumps(res))


def served(args) -> dict:
    q = nearline.read_vectors(args.queries)[: args.nq]
    p = subprocess.Popen([sys.executable, "-m", "nearline", "serve", "--port", "0", f"b={args.index}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        m = re.search(r"on (http://\S+)", line)
        if not m:
            raise RuntimeError(f"the server did not start: {line!r} {p.stderr.read()}")
        client = Client(m.group(1), collection="b")
        res = measure(client.search, q, args)
        mem = client.info()["memory"]
        res["budget"], res["within_budget"] = mem["budget"], mem["within_budget"]
        return res
    finally:
        p.terminate()
        p.wait(timeout=60)


def pick_L(args) -> int:
    """The first L of the grid whose recall@k reaches the target (the last one otherwise)."""
    if args.gt is None or len(args.Ls) == 1:
        return args.Ls[0]
    q = nearline.read_vectors(args.queries)[: args.nq]
    gt = nearline.read_ground_truth(args.gt)[0][: len(q)]
    with nearline.open(args.index) as ix:
        for L in args.Ls:
            if nearline.recall(ix.search(q, k=args.k, L=L)[0], gt, args.k) >= args.target_recall:
                return L
    return args.Ls[-1]


def plot(summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in summary["modes"] if m != "batch"]
    xs = [int(m[1:]) for m in modes]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for side, mark in (("in_process", "o-"), ("served", "s-")):
        a.plot(xs, [summary["modes"][m][f"qps_{side}"] for m in modes], mark, label=side.replace("_", "-"))
        b.plot(xs, [summary["modes"][m][f"p50_ms_{side}"] for m in modes], mark, label=f"{side} p50")
        b.plot(xs, [summary["modes"][m][f"p99_ms_{side}"] for m in modes], mark.replace("-", "--"),
               label=f"{side} p99")
    for ax, ylab in ((a, "QPS"), (b, "latency per call (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent connections (one query a call)")
        ax.set_ylabel(ylab)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"nearline serve vs in-process, L {summary['L']}, recall@{summary['k']} "
                 f"{summary.get('recall', float('nan')):.3f}, budget {summary['memory_budget']} B")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--queries", required=True)
    ap.add_argument("--gt", default=None, help="ground truth (recall is printed, and --target-recall picks L)")
    ap.add_argument("--nq", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--L", default="100", help="L, or a grid for --target-recall to pick from")
    ap.add_argument("--target-recall", type=float, default=0.95)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--clients", default="4", help="concurrent callers of the one-query modes, comma-separated")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--chosen-L", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.Ls = [int(x) for x in args.L.split(",")]
    args.modes = ["batch"] + [f"c{int(c)}" for c in args.clients.split(",")]
    if args.child:
        args.L = args.chosen_L
        child(args)
        return
    args.L = pick_L(args)
    runs = {"in_process": [], "served": []}
    for rep in range(args.reps):
        for side in (("in_process", "served") if rep % 2 == 0 else ("served", "in_process")):
            if side == "in_process":
                r = subprocess.run([sys.executable, __file__, "--child", "--chosen-L", str(args.L), *sys.argv[1:]],
                                   capture_output=True, text=True, check=True)
                runs[side].append(json.loads(r.stdout.strip().splitlines()[-1]))
            else:
                runs[side].append(served(args))
    gt = nearline.read_ground_truth(args.gt)[0] if args.gt else None
    summary = {"index": args.index, "L": args.L, "k": args.k, "batch": args.batch, "reps": args.reps,
               "memory_budget": runs["served"][0]["budget"],
               "within_budget": all(r["within_budget"] for s in runs.values() for r in s), "modes": {}}
    for mode in args.modes:
        same = all(a[mode]["ids"] == b[mode]["ids"] for a, b in zip(runs["in_process"], runs["served"]))
        row = {"identical_results": same}
        for side in runs:
            for key in ("qps", "p50_ms", "p99_ms"):
                row[f"{key}_{side}"] = statistics.median(r[mode][key] for r in runs[side])
            row[f"qps_runs_{side}"] = [r[mode]["qps"] for r in runs[side]]
        row["served_over_in_process"] = row["qps_served"] / row["qps_in_process"]
        if gt is not None and mode == "batch":
            found = np.asarray(runs["served"][0][mode]["ids"][0])
            summary["recall"] = nearline.recall(found, gt[: len(found)], args.k)
        summary["modes"][mode] = row
        print(f"{mode:>6}: in-process {row['qps_in_process']:7.0f} QPS (p50 {row['p50_ms_in_process']:.2f} ms, "
              f"p99 {row['p99_ms_in_process']:.2f}), served {row['qps_served']:7.0f} QPS (p50 "
              f"{row['p50_ms_served']:.2f} ms, p99 {row['p99_ms_served']:.2f}) = "
              f"{row['served_over_in_process']:.2f}x, identical results: {same}")
    print(f"L {args.L}, recall@{args.k} {summary.get('recall', float('nan')):.4f}, memory budget "
          f"{summary['memory_budget']} bytes, within budget: {summary['within_budget']}")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))
    if args.plot:
        plot(summary, args.plot)


if __name__ == "__main__":
    main()
