"""A short update workload on a real dataset for nearline's partition index (preset ``spfresh``).

SPFresh's workload A (``benches/updates.py``) runs on a seeded Gaussian mixture; this one runs the
same kind of stream on a real set (e.g. the wordnet sentence embeddings) to check that LIRE keeps
what the SPANN build made: recall, and the replication (entries per live vector).

The index is built on ``1 - --holdout`` of the set (seeded permutation); then, for ``--epochs``
epochs, each epoch deletes ``--rate``·n random live vectors and inserts ``--rate``·n vectors of the
held-out part (new ids), then drains the background work (``maintain()``). At epoch 0, every
``--measure-every`` epochs and at the end:

* recall@k at ``--nprobe`` against the exact k nearest neighbours of the live set (NumPy);
* mean reads, bytes read and vectors scored (``exact_distances``) per query;
* entries per live vector (``check()["replicas"]["mean"]``), postings, and ``check()``'s problems;
* the engine's resident memory against its budget.

At the end the final live set is built from scratch with the same options and measured the same
way: the bars are recall within 1 point of the fresh build and the replica mean within 10% of it.

Usage::

    .venv/bin/python benches/partition_workload.py --data wordnet:../shared/data/wordnet-minilm \\
        --memory-budget 0.2 --epochs 20 --rate 0.01 --workdir /work/bench/pw --out pw.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import nearline  # noqa: E402
from graph_updates import exact_knn, log, recall  # noqa: E402
from nearline.datasets import load_dataset  # noqa: E402



def stream_setup(args: argparse.Namespace, n: int) -> Tuple[np.random.Generator, np.ndarray, List[int], int]:
    """The stream's seeded split of ``n`` rows: the generator (it goes on to pick the deletes), the
    rows built, the held-out rows inserted later, and the inserts (= deletes) per epoch."""
    rng = np.random.default_rng(args.seed)
    perm = rng.permutation(n)
    n0 = int(n * (1 - args.holdout))
    live, held = perm[:n0].copy(), list(perm[n0:])
    per = max(1, int(n * args.rate))
    if per * args.epochs > len(held):
        raise SystemExit(f"{args.epochs} epochs of {per} inserts need {per * args.epochs} held-out vectors; "
                         f"--holdout {args.holdout} leaves {len(held)}")
    return rng, live, held, per


def measure(idx: Any, base: np.ndarray, live: np.ndarray, q: np.ndarray, args: argparse.Namespace,
            metric: str, epoch: int) -> Dict[str, Any]:
    """One measurement of the index over the live rows ``live`` of ``base``."""
    truth = exact_knn(base, np.sort(live), q, args.k, metric)
    ids, _, st = idx.search(q, k=args.k, nprobe=args.nprobe, return_stats=True)
    chk = idx.check()
    mem = idx.info()["memory"]
    p = {"epoch": epoch, "live": int(len(live)), "recall": recall(ids, truth),
         "mean_reads": float(np.mean(st["reads"])), "mean_bytes_read": float(np.mean(st["bytes_read"])),
         "mean_scored": float(np.mean(st["exact_distances"])),
         "replicas_mean": float(chk["replicas"]["mean"]), "postings": int(chk["postings"]),
         "outside_nearest": int(chk["outside_nearest"]),
         "live_ids": int(chk["live_ids"]), "problems": chk["problems"][:5],
         "resident": int(mem["resident"]), "budget": int(mem["budget"]),
         "within_budget": bool(mem["within_budget"]), "updates": idx.info()["updates"]}
    log(f"epoch {epoch}: recall {p['recall']:.4f}, replicas {p['replicas_mean']:.3f}, "
        f"scored {p['mean_scored']:.0f}, reads {p['mean_reads']:.1f}, postings {p['postings']}, "
        f"outside nearest {p['outside_nearest']}, "
        f"resident {p['resident']} of {p['budget']} B")
    return p


def run(args: argparse.Namespace) -> Dict[str, Any]:
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ds = load_dataset(args.data, workdir)
    base, metric = ds.base.astype(np.float32), ds.metric
    q = ds.queries[: args.queries].astype(np.float32)
    n = len(base)
    rng, live, held, per = stream_setup(args, n)
    n0 = len(live)
    opts = dict(preset="spfresh", memory_budget=args.memory_budget, threads=args.threads, metric=metric)
    if args.reassign_k is not None:
        opts["reassign_k"] = args.reassign_k
    path = workdir / "workload.index"
    shutil.rmtree(path, ignore_errors=True)
    t = time.perf_counter()
    nearline.build(base[live], path, ids=live.astype(np.int64), **opts).close()
    build_s = time.perf_counter() - t
    log(f"built {n0} of {n} vectors in {build_s:.1f} s")
    points: List[Dict[str, Any]] = []
    epochs: List[Dict[str, Any]] = []
    with nearline.open(path, threads=args.threads) as idx:
        points.append(measure(idx, base, live, q, args, metric, 0))
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
            idx.maintain()
            t3 = time.perf_counter()
            live = np.concatenate([np.delete(live, gone_at), new])
            epochs.append({"epoch": e, "delete_s": t1 - t0, "insert_s": t2 - t1, "maintain_s": t3 - t2})
            if e % args.measure_every == 0 or e == args.epochs:
                points.append(measure(idx, base, live, q, args, metric, e))
    fresh_path = workdir / "fresh.index"
    shutil.rmtree(fresh_path, ignore_errors=True)
    t = time.perf_counter()
    nearline.build(base[np.sort(live)], fresh_path, ids=np.sort(live).astype(np.int64), **opts).close()
    fresh_build_s = time.perf_counter() - t
    with nearline.open(fresh_path, threads=args.threads) as idx:
        fresh = measure(idx, base, live, q, args, metric, -1)
    end = points[-1]
    return {
        "benchmark": "partition workload on a real set", "data": ds.name, "n": n, "dim": int(base.shape[1]),
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "build_seconds": build_s, "fresh_build_seconds": fresh_build_s,
        "points": points, "epochs": epochs, "fresh": fresh,
        "summary": {
            "recall_epoch0": points[0]["recall"], "recall_end": end["recall"], "recall_fresh": fresh["recall"],
            "recall_vs_fresh_points": 100 * (end["recall"] - fresh["recall"]),
            "within_1pt_of_fresh": end["recall"] >= fresh["recall"] - 0.01,
            "replicas_epoch0": points[0]["replicas_mean"], "replicas_end": end["replicas_mean"],
            "replicas_fresh": fresh["replicas_mean"],
            "replicas_ratio_end_vs_fresh": end["replicas_mean"] / fresh["replicas_mean"],
            "replicas_within_10pct_of_fresh": abs(end["replicas_mean"] / fresh["replicas_mean"] - 1) <= 0.10,
            "scored_ratio_end_vs_fresh": end["mean_scored"] / max(fresh["mean_scored"], 1e-9),
            "reads_ratio_end_vs_fresh": end["mean_reads"] / max(fresh["mean_reads"], 1e-9),
            "within_budget_always": all(p["within_budget"] for p in points),
            "problems": [p["problems"] for p in points if p["problems"]],
        },
    }


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="dataset spec, as nearline bench takes it")
    ap.add_argument("--memory-budget", default="0.2", help="bytes, '512MB' or a fraction of the raw vectors")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--rate", type=float, default=0.01, help="deletes and inserts per epoch, fraction of the set")
    ap.add_argument("--holdout", type=float, default=0.25, help="share of the set held out for the inserts")
    ap.add_argument("--measure-every", type=int, default=5)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--nprobe", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reassign-k", type=int, default=None,
                    help="postings around a split LIRE reads for reassignment (default: the planner's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not 0 < args.rate < 1 or not 0 < args.holdout < 1:
        ap.error("--rate and --holdout must lie in (0, 1)")
    if args.epochs < 1 or args.measure_every < 1 or args.nprobe < 1:
        ap.error("--epochs, --measure-every and --nprobe must be at least 1")
    args.memory_budget = float(args.memory_budget) if "." in args.memory_budget else args.memory_budget
    result = run(args)
    Path(args.out).write_text(json.dumps(result, indent=1))
    s = result["summary"]
    log(f"recall end {s['recall_end']:.4f} vs fresh {s['recall_fresh']:.4f} ({s['recall_vs_fresh_points']:+.2f} pt); "
        f"replicas end {s['replicas_end']:.3f} vs fresh {s['replicas_fresh']:.3f} "
        f"({s['replicas_ratio_end_vs_fresh']:.3f}x); wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
