"""AlayaLaser's coded records: what the code shape buys, and what the cache policy buys.

``variants``: for each ``P:B`` (principal dimensions, bits per dimension), build an
``alayalaser`` index of BASE at the given memory budget and search QUERIES at each L,
printing recall@10 against GT, mean reads, mean distance time, QPS and the block size
(records that fill more pages cost more per read).

``caches``: open one coded index twice at the same budget, with the in-degree cache and
with the BFS cache, and search QUERIES at each L: recall, mean reads and cache hits.
Recall and reads are deterministic; QPS is one batch, indicative only.

    python benches/analysis/alayalaser_codes.py variants --base B.fbin --queries Q.fbin --gt GT.bin \
        --workdir DIR --variants 256:1,256:2,320:2 [--memory-budget 0.2] [--L 30,50,100] [--out F.json]
    python benches/analysis/alayalaser_codes.py caches --index DIR/INDEX --queries Q.fbin --gt GT.bin \
        [--memory-budget 0.2] [--L 50,100,200] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import nearline


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _truth(path: str):
    gt = nearline.read_ground_truth(path)
    return gt[0] if isinstance(gt, tuple) else gt


def _search(idx: nearline.Index, queries, gt, L: int) -> dict[str, Any]:
    t = time.perf_counter()
    ids, _, st = idx.search(queries, k=10, L=L, return_stats=True)
    seconds = time.perf_counter() - t
    return {
        "L": L,
        "recall": float(nearline.recall(ids, gt[: len(queries)], 10)),
        "reads": float(st["reads"].mean()),
        "cache_hits": float(st["cache_hits"].mean()),
        "dist_us": float(st["dist_us"].mean()),
        "qps": len(queries) / seconds,
    }


def variants(args: argparse.Namespace) -> list[dict[str, Any]]:
    queries, gt = nearline.read_vectors(args.queries), _truth(args.gt)
    rows = []
    for spec in args.variants.split(","):
        p, b = (int(x) for x in spec.split(":"))
        path = Path(args.workdir) / f"alayalaser-p{p}-b{b}"
        t = time.perf_counter()
        idx = nearline.build(args.base, path, preset="alayalaser", memory_budget=args.memory_budget,
                             principal_dims=p, code_bits=b, overwrite=True, progress=False)
        build_s = time.perf_counter() - t
        info = idx.info()
        for L in _ints(args.L):
            row = {"p": p, "b": b, "block": info["layout"]["block_size"],
                   "cache_nodes": info["memory"]["cache_nodes"], "build_s": build_s, **_search(idx, queries, gt, L)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        idx.close()
    return rows


def caches(args: argparse.Namespace) -> list[dict[str, Any]]:
    queries, gt = nearline.read_vectors(args.queries), _truth(args.gt)
    rows = []
    for cache in ("in_degree", "bfs"):
        with nearline.open(args.index, cache=cache, memory_budget=args.memory_budget) as idx:
            mem = idx.info()["memory"]
            for L in _ints(args.L):
                row = {"cache": cache, "budget": mem["budget"], "cache_bytes": mem["cache"],
                       "cache_nodes": mem["cache_nodes"], "within_budget": mem["within_budget"],
                       **_search(idx, queries, gt, L)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    v = sub.add_parser("variants")
    v.add_argument("--base", required=True)
    v.add_argument("--workdir", required=True)
    v.add_argument("--variants", default="256:1,256:2")
    v.add_argument("--L", default="30,50,70,100,150")
    c = sub.add_parser("caches")
    c.add_argument("--index", required=True)
    c.add_argument("--L", default="50,100,200")
    for p in (v, c):
        p.add_argument("--queries", required=True)
        p.add_argument("--gt", required=True)
        p.add_argument("--memory-budget", type=float, default=0.2)
        p.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = variants(args) if args.what == "variants" else caches(args)
    if args.out:
        Path(args.out).write_text(json.dumps({"command": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
