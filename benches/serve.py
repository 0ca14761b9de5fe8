"""What serving over HTTP costs: the same index searched in-process and through
``nearline serve`` + ``nearline.Client``, each in its own process, alternating, medians.

Two modes, each with the same calls on both sides:

- ``batch``: the query set in batches of ``--batch`` queries, one caller (throughput).
- ``single``: one query a call from ``--clients`` concurrent callers (an online service).

The server side also checks that every answer equals the in-process one (ids and
distances, bit for bit), so a figure never compares different work.

    python benches/serve.py --index IDX --queries Q.fbin [--gt GT.bin] --L 100 --reps 3 --out serve.json
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


def _calls(queries: np.ndarray, mode: str, batch: int, clients: int):
    """The list of query blocks each caller sends, in order."""
    if mode == "batch":
        return [[queries[i:i + batch] for i in range(0, len(queries), batch)]]
    rows = [queries[i:i + 1] for i in range(len(queries))]
    return [rows[c::clients] for c in range(clients)]


def run_calls(search, plan, k: int, L: int):
    """Runs each caller's blocks in its own thread; returns (seconds, ids per caller)."""
    out = [[] for _ in plan]

    def caller(c):
        for block in plan[c]:
            out[c].append(search(block, k=k, L=L)[0])

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(len(plan))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, out


def child(args) -> None:
    """In-process side (run in a subprocess): prints one JSON line."""
    q = nearline.read_vectors(args.queries)[: args.nq]
    with nearline.open(args.index) as ix:
        res = {}
        for mode in args.modes:
            plan = _calls(q, mode, args.batch, args.clients)
            run_calls(ix.search, plan, args.k, args.L)  # warm the cache as the server's first pass does
            secs, out = run_calls(ix.search, plan, args.k, args.L)
            res[mode] = {"qps": len(q) / secs, "ids": [np.concatenate(o).tolist() for o in out]}
        res["budget"] = ix.info()["memory"]["budget"]
        res["within_budget"] = ix.info()["memory"]["within_budget"]
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
        res = {}
        for mode in args.modes:
            plan = _calls(q, mode, args.batch, args.clients)
            run_calls(client.search, plan, args.k, args.L)
            secs, out = run_calls(client.search, plan, args.k, args.L)
            res[mode] = {"qps": len(q) / secs, "ids": [np.concatenate(o).tolist() for o in out]}
        info = client.info()["memory"]
        res["budget"], res["within_budget"] = info["budget"], info["within_budget"]
        return res
    finally:
        p.terminate()
        p.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--queries", required=True)
    ap.add_argument("--gt", default=None, help="ground truth (recall is printed beside the QPS)")
    ap.add_argument("--nq", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--L", type=int, default=100)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--modes", default="batch,single")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.modes = args.modes.split(",")
    if args.child:
        child(args)
        return
    runs = {"in_process": [], "served": []}
    for rep in range(args.reps):
        for side in (("in_process", "served") if rep % 2 == 0 else ("served", "in_process")):
            if side == "in_process":
                r = subprocess.run([sys.executable, __file__, "--child", *sys.argv[1:]], capture_output=True,
                                   text=True, check=True)
                runs[side].append(json.loads(r.stdout.strip().splitlines()[-1]))
            else:
                runs[side].append(served(args))
    gt = nearline.read_ground_truth(args.gt)[0] if args.gt else None
    summary = {"index": args.index, "L": args.L, "k": args.k, "batch": args.batch, "clients": args.clients,
               "reps": args.reps, "memory_budget": runs["served"][0]["budget"],
               "within_budget": all(r["within_budget"] for s in runs.values() for r in s), "modes": {}}
    for mode in args.modes:
        same = all(a[mode]["ids"] == b[mode]["ids"] for a, b in zip(runs["in_process"], runs["served"]))
        med = {s: statistics.median(r[mode]["qps"] for r in runs[s]) for s in runs}
        row = {"qps_in_process": med["in_process"], "qps_served": med["served"],
               "served_over_in_process": med["served"] / med["in_process"], "identical_results": same,
               "qps_runs": {s: [r[mode]["qps"] for r in runs[s]] for s in runs}}
        if gt is not None:
            # The single mode's callers take rows c::clients: put them back in query order.
            ids = runs["served"][0][mode]["ids"]
            found = np.empty((min(args.nq, len(gt)), args.k), np.int64)
            if mode == "batch":
                found[:] = np.asarray(ids[0])
            else:
                for c, block in enumerate(ids):
                    found[c::args.clients] = np.asarray(block)
            row["recall"] = nearline.recall(found, gt[: len(found)], args.k)
        summary["modes"][mode] = row
        print(f"{mode:>6}: in-process {med['in_process']:8.0f} QPS, served {med['served']:8.0f} QPS "
              f"({row['served_over_in_process']:.2f}x), identical results: {same}"
              + (f", recall@{args.k} {row['recall']:.4f}" if "recall" in row else ""))
    print(f"memory budget {summary['memory_budget']} bytes, within budget: {summary['within_budget']}")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
