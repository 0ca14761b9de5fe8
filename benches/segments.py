"""A collection of N segments on Ray (``nearline.distributed``) against one index over the same
vectors, on one machine: recall@k and QPS at the same per-segment L, each side at the same total
memory budget.

Both sides are built with the same build options; the single index gets the budget ``B`` and
the collection the same ``B`` in all, split across its segments in proportion to their sizes
(``info()["memory"]`` of each side is reported). Each side is opened with the same search
threads per index (``--threads``; the collection's segments share the machine's cores). For
every L of the sweep the query set is searched ``--reps`` times per side, alternating; the
median run's QPS is reported, with every run's (the recall is the same on every run). The collection's QPS includes
its fan-out through Ray and the merge of the per-segment top-k.

``--data`` is a dataset directory (the WordNet-MiniLM folder: ``base.sq8.npz``,
``query.sq8.npz``, ``gt.ibin``) or any spec ``nearline.datasets.load_dataset`` takes
(``synthetic:N:DIM[:SEED]``, ``wordnet:PATH``, ``hdf5:PATH``, ``files:BASE,QUERIES[,GT]``).

Usage (the figures in docs/distributed.md)::

    .venv/bin/python benches/segments.py --data /work/shared/data/wordnet-minilm/ --segments 4 \\
        --workdir /tmp/segwn --out /tmp/segwn/segments-wordnet-4.json

Tiny smoke run::

    .venv/bin/python benches/segments.py --data synthetic:20000:32 --segments 4 --L 10,50 \\
        --workdir /tmp/segments-smoke
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv: Any = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", required=True, help="dataset directory (WordNet-MiniLM) or a load_dataset spec")
    p.add_argument("--segments", type=int, default=4, help="segments of the collection")
    p.add_argument("--routing", default="auto", choices=("auto", "hash", "kmeans"), help="the collection's routing")
    p.add_argument("--nprobe-segments", type=int, default=None,
                   help="k-means routing: segments per query (default: the collection's calibrated value)")
    p.add_argument("--memory-budget", default="0.125",
                   help="total search memory budget of each side: a fraction of the raw vectors or bytes/size")
    p.add_argument("--L", default="10,20,30,50,70,100,150,200", help="per-segment search list sizes")
    p.add_argument("--k", type=int, default=10, help="neighbours per query")
    p.add_argument("--threads", type=int, default=None, help="search threads per index (default: all cores)")
    p.add_argument("--build-threads", type=int, default=None, help="build threads (default: all cores; "
                   "each segment's build task: the cores over the segments)")
    p.add_argument("--preset", default=None, help="preset of every index (default: auto, the planner's)")
    p.add_argument("--R", type=int, default=None, help="maximum degree (default: the preset's)")
    p.add_argument("--build-L", type=int, default=None, help="build list size (default: the preset's)")
    p.add_argument("--queries", type=int, default=None, help="use the first N queries (default: all)")
    p.add_argument("--reps", type=int, default=3, help="timed runs per side and L (the median is reported)")
    p.add_argument("--workdir", default="bench-out/segments", help="indexes and the collection")
    p.add_argument("--rebuild", action="store_true", help="rebuild even when the workdir holds the builds")
    p.add_argument("--out", default=None, help="results JSON")
    p.add_argument("--ray-address", default=None, help="Ray cluster to join (default: a local one)")
    return p.parse_args(argv)


def load(spec: str) -> Any:
    from nearline import datasets

    if Path(spec).is_dir():
        return datasets.load_wordnet(spec)
    return datasets.load_dataset(spec)


def main(argv: Any = None) -> int:
    args = parse_args(argv)
    import nearline
    import ray

    import nearline.distributed as nd
    from nearline.cli_types import _budget

    ds = load(args.data)
    base, queries = np.ascontiguousarray(ds.base, dtype=np.float32), np.ascontiguousarray(ds.queries, dtype=np.float32)
    if args.queries:
        queries = queries[: args.queries]
    n, dim = base.shape
    gt = ds.gt_ids
    if gt is None or gt.shape[1] < args.k:
        log(f"computing exact ground truth (k={args.k}) for {ds.name}")
        gt, _ = nearline.compute_ground_truth(base, queries, args.k, ds.metric)
    gt = np.asarray(gt)[: len(queries)]
    budget = nearline.parse_budget(_budget(args.memory_budget), base.nbytes)
    build_opts: Dict[str, Any] = {k: v for k, v in (("preset", args.preset), ("R", args.R),
                                                    ("build_L", args.build_L)) if v is not None}
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    key = f"{ds.name}-n{n}-B{budget}-" + "-".join(f"{k}{v}" for k, v in sorted(build_opts.items()))
    single_path = work / f"single-{key}"
    coll_path = work / f"coll{args.segments}-{args.routing}-{key}"
    if not ray.is_initialized():
        ray.init(address=args.ray_address, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    cores = os.cpu_count() or 1

    builds: Dict[str, float] = {}
    if args.rebuild or not (single_path / "manifest.json").is_file():
        log(f"building one index over {n} x {dim} ({ds.name}), budget {budget} bytes")
        t0 = time.perf_counter()
        nearline.build(base, single_path, metric=ds.metric, memory_budget=budget, overwrite=True, progress=False,
                       threads=args.build_threads, **build_opts).close()
        builds["single_seconds"] = time.perf_counter() - t0
    if args.rebuild or not (coll_path / nd.MANIFEST).is_file():
        log(f"building {args.segments} segments ({args.routing} routing) as Ray tasks, budget {budget} bytes in all")
        t0 = time.perf_counter()
        nd.build(base, coll_path, segments=args.segments, routing=args.routing, metric=ds.metric,
                 memory_budget=budget, overwrite=True, progress=False,
                 threads=None if args.build_threads is None else max(1, args.build_threads // args.segments),
                 **build_opts).close()
        builds["collection_seconds"] = time.perf_counter() - t0

    threads = args.threads or cores
    single = nearline.open(single_path, memory_budget=budget, threads=threads)
    coll = nd.open(coll_path, memory_budget=budget, threads=threads, nprobe_segments=args.nprobe_segments)
    s_info, c_info = single.info(), coll.info()
    sides = {
        "single": {"preset": s_info.get("preset"), "memory_budget": s_info["memory"]["budget"],
                   "memory_held": s_info["memory"]["total"], "within_budget": s_info["memory"]["within_budget"]},
        "collection": {"segments": coll.segments, "routing": c_info["routing"]["kind"],
                       "routing_reason": c_info["routing"]["reason"], "nprobe_segments": coll.nprobe_segments,
                       "presets": [d["index"].get("preset") for d in c_info["segments"]],
                       "segment_sizes": [d["n"] for d in c_info["segments"]],
                       "memory_budget": c_info["memory"]["budget"], "memory_per_segment": c_info["memory"]["per_segment"],
                       "memory_held": c_info["memory"]["total"], "within_budget": c_info["memory"]["within_budget"]},
    }
    log(json.dumps(sides, indent=1))
    rows: List[Dict[str, Any]] = []
    Ls = [int(x) for x in args.L.split(",") if x.strip()]
    for L in Ls:
        runs: Dict[str, List[float]] = {"single": [], "collection": []}
        found: Dict[str, np.ndarray] = {}
        refused: Dict[str, str] = {}
        sides_fn = {"single": single.search, "collection": coll.search}
        for side, fn in sides_fn.items():
            try:
                fn(queries[:50], args.k, L=L)  # warm-up
            except ValueError as e:  # an L the side's memory budget cannot serve: reported, not fatal
                refused[side] = " ".join(str(e).split())
        for _ in range(args.reps):
            for side, fn in sides_fn.items():
                if side in refused:
                    continue
                t0 = time.perf_counter()
                ids, _d = fn(queries, args.k, L=L)
                wall = time.perf_counter() - t0
                runs[side].append(len(queries) / wall)
                found[side] = np.asarray(ids)
        med = {side: float(np.median(r)) if r else 0.0 for side, r in runs.items()}
        row: Dict[str, Any] = {"L": L, "refused": refused, "qps_runs": runs}
        for side in sides_fn:
            row[f"recall_{side}"] = nearline.recall(found[side], gt, args.k) if side in found else None
            row[f"qps_{side}"] = med[side] if side in found else None
        if len(found) == 2:
            row["delta_points"] = 100 * (row["recall_collection"] - row["recall_single"])
            row["qps_ratio"] = med["collection"] / med["single"]
            row["top_k_overlap"] = float(np.mean([len(np.intersect1d(a, b)) / args.k
                                                  for a, b in zip(found["single"], found["collection"])]))
        rows.append(row)
        log(f"L={L}: " + "; ".join(
            f"{side} recall@{args.k} {row[f'recall_{side}']:.4f} QPS {row[f'qps_{side}']:.0f}"
            if side in found else f"{side} refused: {refused[side]}" for side in sides_fn))
    single.close()
    coll.close()

    print(f"{ds.name}: n={n} dim={dim} queries={len(queries)} k={args.k}; {args.segments} segments "
          f"({sides['collection']['routing']}, {sides['collection']['nprobe_segments']} per query) vs one index; "
          f"total memory budget {budget} bytes each; {threads} search threads per index on {cores} cores")
    print(f"{'L':>5} {'recall 1 index':>15} {'recall segments':>16} {'Δ points':>9} {'QPS 1 index':>12} "
          f"{'QPS segments':>13} {'ratio':>6} {'top-k overlap':>14}")
    def cell(v: Any, fmt: str, width: int) -> str:
        return f"{'refused':>{width}}" if v is None else f"{format(v, fmt):>{width}}"

    for r in rows:
        print(f"{r['L']:>5} {cell(r['recall_single'], '.4f', 15)} {cell(r['recall_collection'], '.4f', 16)} "
              f"{cell(r.get('delta_points'), '+.2f', 9)} {cell(r['qps_single'], '.0f', 12)} "
              f"{cell(r['qps_collection'], '.0f', 13)} {cell(r.get('qps_ratio'), '.2f', 6)} "
              f"{cell(r.get('top_k_overlap'), '.4f', 14)}")
    for r in rows:
        for side, why in r["refused"].items():
            print(f"L={r['L']}: {side} refused: {why}")
    if args.out:
        out = {"dataset": ds.name, "n": int(n), "dim": int(dim), "queries": int(len(queries)), "k": args.k,
               "segments": args.segments, "routing": args.routing, "memory_budget": budget, "threads": threads,
               "build_options": build_opts, "builds": builds, "sides": sides, "rows": rows,
               "machine": {"cores": cores, "platform": platform.platform(), "python": platform.python_version(),
                           "nearline": nearline.__version__, "ray": ray.__version__},
               "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
               "date": time.strftime("%Y-%m-%d")}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
