"""One update stream against several updatable compositions: the partition index (LIRE) and the graph
index in place and out of place, under any graph preset (e.g. ``dgai``).

SPFresh's workload A shape, at a size this machine runs: the index is built on ``1 - --holdout``
of the set (seeded permutation); then, for ``--epochs`` epochs, each epoch deletes ``--rate``·n
random live vectors and inserts ``--rate``·n held-out vectors (new ids), then ``maintain()``. Every
system sees the same stream and the same memory budget (built at ``--memory-budget``, opened at
``--open-budget``), each in its own subprocess, one after the other. At epoch 0, every ``--measure-every`` epochs and at the end it measures recall@k against
the exact neighbours of the live set (graph: at ``--L``; partition: at ``--nprobe``), mean reads,
the P99.9 search latency of the batch, resident memory against the budget, the index's bytes on
disk and ``check()``'s problems; each epoch's delete, insert and maintain seconds give the insert
throughput. The partition index runs ``maintain()`` each epoch (its splits and reassignments); a
graph index merges or compacts when its own rules say, and ``maintain()`` runs once, at the end. At the end the live set is built from scratch with the same options and measured.

Systems: ``spfresh`` (the partition index), or ``PRESET:STRATEGY`` for a graph index
(``diskann:in_place``, ``diskann:out_of_place``, ``dgai:out_of_place``).

Usage::

    .venv/bin/python benches/update_workload.py --data files:BASE.fbin,QUERIES.fbin \\
        --systems spfresh,diskann:in_place,diskann:out_of_place,dgai:out_of_place \\
        --memory-budget 0.2 --epochs 20 --rate 0.01 --workdir W --out F.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import nearline  # noqa: E402
from graph_updates import exact_knn, log, recall  # noqa: E402
from partition_workload import stream_setup  # noqa: E402
from nearline.datasets import load_dataset  # noqa: E402

STRATEGIES = ("in_place", "out_of_place")


def parse_system(s: str) -> Dict[str, str]:
    """``spfresh`` or ``PRESET:STRATEGY``; a bad name is an error that says what is expected."""
    if s == "spfresh":
        return {"name": s, "kind": "partition", "preset": "spfresh"}
    preset, _, strategy = s.partition(":")
    if strategy not in STRATEGIES or not preset or preset in ("spfresh", "auto"):
        raise ValueError(f"system {s!r}: expected spfresh or PRESET:STRATEGY with a graph preset and "
                         f"a strategy of {', '.join(STRATEGIES)}")
    return {"name": s, "kind": "graph", "preset": preset, "strategy": strategy}


def build_opts(system: Dict[str, str], args: argparse.Namespace, metric: str) -> Dict[str, Any]:
    opts: Dict[str, Any] = dict(preset=system["preset"], memory_budget=args.memory_budget,
                                threads=args.threads, metric=metric)
    if system["kind"] == "graph":
        opts["update"] = system["strategy"]
        opts["write_ratio"] = args.write_ratio
    return opts


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure(idx: Any, path: Path, system: Dict[str, str], base: np.ndarray, live: np.ndarray,
            q: np.ndarray, args: argparse.Namespace, metric: str, epoch: int) -> Dict[str, Any]:
    truth = exact_knn(base, np.sort(live), q, args.k, metric)
    knob = {"nprobe": args.nprobe} if system["kind"] == "partition" else {"L": args.L}
    ids, _, st = idx.search(q, k=args.k, return_stats=True, **knob)
    chk = idx.check()
    info = idx.info()
    mem = info["memory"]
    # A graph index reports what it holds as "peak_total" (the ledger's peak since open), a
    # partition index as "resident".
    held = mem["resident"] if "resident" in mem else mem["peak_total"]
    p = {"epoch": epoch, "live": int(len(live)), "recall": recall(ids, truth),
         "mean_reads": float(np.mean(st["reads"])),
         "latency_p999_us": float(np.percentile(st["total_us"], 99.9)),
         "latency_mean_us": float(np.mean(st["total_us"])),
         "resident": int(held), "budget": int(mem["budget"]),
         "within_budget": bool(mem["within_budget"]), "disk_bytes": disk_bytes(path),
         "problems": chk["problems"][:5]}
    log(f"{system['name']} epoch {epoch}: recall {p['recall']:.4f}, reads {p['mean_reads']:.1f}, "
        f"p99.9 {p['latency_p999_us'] / 1000:.2f} ms, resident {p['resident']} of {p['budget']} B, "
        f"disk {p['disk_bytes']} B, problems {len(chk['problems'])}")
    return p


def run_system(system: Dict[str, str], args: argparse.Namespace) -> Dict[str, Any]:
    """The whole stream against one system (in this process)."""
    workdir = Path(args.workdir)
    ds = load_dataset(args.data, workdir)
    base, metric = ds.base.astype(np.float32), ds.metric
    q = ds.queries[: args.queries].astype(np.float32)
    n = len(base)
    rng, live, held, per = stream_setup(args, n)
    n0 = len(live)
    opts = build_opts(system, args, metric)
    tag = system["name"].replace(":", "-")
    path = workdir / f"{tag}.index"
    shutil.rmtree(path, ignore_errors=True)
    t = time.perf_counter()
    nearline.build(base[live], path, ids=live.astype(np.int64), progress=False, **opts).close()
    build_s = time.perf_counter() - t
    log(f"{system['name']}: built {n0} of {n} vectors in {build_s:.1f} s")
    points: List[Dict[str, Any]] = []
    epochs: List[Dict[str, Any]] = []
    with nearline.open(path, threads=args.threads, memory_budget=args.open_budget) as idx:
        points.append(measure(idx, path, system, base, live, q, args, metric, 0))
        for e in range(1, args.epochs + 1):
            gone_at = rng.choice(len(live), size=per, replace=False)
            gone = live[gone_at]
            new = np.array(held[:per], dtype=np.int64)
            del held[:per]
            t0 = time.perf_counter()
            idx.delete(gone)
            t1 = time.perf_counter()
            idx.insert(base[new], ids=new)
            t2 = time.perf_counter()
            # The partition index drains its splits and reassignments each epoch (workload
            # A's shape); a graph index merges when its delta fills its share (out of
            # place) or compacts tombstones when asked (in place), so it is asked once, at
            # the end, and that time counts in the last epoch.
            if system["kind"] == "partition" or e == args.epochs:
                idx.maintain()
            t3 = time.perf_counter()
            live = np.concatenate([np.delete(live, gone_at), new])
            epochs.append({"epoch": e, "delete_s": t1 - t0, "insert_s": t2 - t1, "maintain_s": t3 - t2})
            if e % args.measure_every == 0 or e == args.epochs:
                points.append(measure(idx, path, system, base, live, q, args, metric, e))
    fresh_path = workdir / f"{tag}-fresh.index"
    shutil.rmtree(fresh_path, ignore_errors=True)
    t = time.perf_counter()
    nearline.build(base[np.sort(live)], fresh_path, ids=np.sort(live).astype(np.int64), progress=False,
                   **opts).close()
    fresh_build_s = time.perf_counter() - t
    with nearline.open(fresh_path, threads=args.threads, memory_budget=args.open_budget) as idx:
        fresh = measure(idx, fresh_path, system, base, live, q, args, metric, -1)
    shutil.rmtree(fresh_path, ignore_errors=True)
    ins = sum(x["insert_s"] for x in epochs)
    total = sum(x["delete_s"] + x["insert_s"] + x["maintain_s"] for x in epochs)
    end = points[-1]
    return {
        "system": system, "build_options": {k: str(v) for k, v in opts.items()},
        "build_seconds": build_s, "fresh_build_seconds": fresh_build_s,
        "points": points, "epochs": epochs, "fresh": fresh,
        "summary": {
            "recall_epoch0": points[0]["recall"], "recall_end": end["recall"], "recall_fresh": fresh["recall"],
            "recall_vs_fresh_points": 100 * (end["recall"] - fresh["recall"]),
            "inserts_per_s": per * args.epochs / ins if ins > 0 else None,
            "updates_per_s_with_maintain": 2 * per * args.epochs / total if total > 0 else None,
            "latency_p999_us_end": end["latency_p999_us"], "mean_reads_end": end["mean_reads"],
            "resident_max": max(p["resident"] for p in points), "budget": end["budget"],
            "within_budget_always": all(p["within_budget"] for p in points),
            "disk_bytes_end": end["disk_bytes"],
            "problems": [p["problems"] for p in points if p["problems"]],
        },
    }


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="dataset spec, as nearline bench takes it")
    ap.add_argument("--systems", default="spfresh,diskann:in_place,diskann:out_of_place",
                    help="comma list: spfresh or PRESET:STRATEGY")
    ap.add_argument("--memory-budget", default="0.2", help="bytes or a fraction of the raw vectors, for every system")
    ap.add_argument("--open-budget", default=None,
                    help="the budget every system is opened with (default --memory-budget): a build's PQ "
                    "codes fill the build budget, so a larger open budget leaves the update layer room")
    ap.add_argument("--write-ratio", type=float, default=0.2,
                    help="the graph builds' workload hint (keeps a share of the budget for the delta)")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--rate", type=float, default=0.01, help="deletes and inserts per epoch, fraction of the set")
    ap.add_argument("--holdout", type=float, default=0.25, help="share of the set held out for the inserts")
    ap.add_argument("--measure-every", type=int, default=5)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--L", type=int, default=64, help="graph search list size")
    ap.add_argument("--nprobe", type=int, default=32, help="partition postings probed")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not 0 < args.rate < 1 or not 0 < args.holdout < 1:
        ap.error("--rate and --holdout must lie in (0, 1)")
    if args.epochs < 1 or args.measure_every < 1 or args.nprobe < 1 or args.L < args.k:
        ap.error("--epochs, --measure-every and --nprobe must be at least 1, and --L at least --k")
    try:
        systems = [parse_system(s.strip()) for s in args.systems.split(",") if s.strip()]
    except ValueError as e:
        ap.error(str(e))
    if not systems:
        ap.error("--systems names no system")
    args.memory_budget = float(args.memory_budget) if "." in args.memory_budget else args.memory_budget
    if args.open_budget is None:
        args.open_budget = args.memory_budget
    elif "." in args.open_budget:
        args.open_budget = float(args.open_budget)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    if args.one is not None:
        # A child: one system, its result to --out.
        Path(args.out).write_text(json.dumps(run_system(parse_system(args.one), args), indent=1))
        return 0
    results = []
    for s in systems:
        part = Path(args.workdir) / f"{s['name'].replace(':', '-')}.json"
        cmd = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--one", s["name"],
               "--out", str(part)]
        r = subprocess.run(cmd, check=False)
        if r.returncode != 0:
            raise SystemExit(f"{s['name']} failed (exit {r.returncode})")
        results.append(json.loads(part.read_text()))
    ref = results[0]["summary"]
    ratios = {}
    for res in results[1:]:
        s = res["summary"]
        ratios[f"{res['system']['name']}/{results[0]['system']['name']}"] = {
            k: (s[k] / ref[k] if s.get(k) and ref.get(k) else None)
            for k in ("inserts_per_s", "updates_per_s_with_maintain", "latency_p999_us_end", "mean_reads_end",
                      "resident_max", "disk_bytes_end")
        }
    out = {"benchmark": "update workload", "data": args.data,
           "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "one"},
           "systems": results, "ratios": ratios}
    Path(args.out).write_text(json.dumps(out, indent=1))
    for res in results:
        s = res["summary"]
        log(f"{res['system']['name']}: recall end {s['recall_end']:.4f} (fresh {s['recall_fresh']:.4f}), "
            f"{s['inserts_per_s']:.0f} inserts/s, p99.9 {s['latency_p999_us_end'] / 1000:.2f} ms, "
            f"resident max {s['resident_max']} of {s['budget']} B, disk {s['disk_bytes_end']} B")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
