"""One benchmark step in a fresh process: ``python -m nearline._bench_worker [SPEC_JSON]``.

The JSON spec comes from argv[1] or, if absent, stdin; the result JSON is the
only thing written to the real stdout. Anything the systems print (DiskANN's
C++ logging goes to stdout) is redirected to stderr at the file-descriptor level.

Spec keys: ``action`` ("build" or "search"), ``system``, ``base`` (vector file),
``index_dir``, ``params`` (see :class:`nearline.peers.Params`), ``pq_bytes``;
for search also ``queries``, ``gt``, ``k``, ``Ls``, ``queries_repeat``,
``warmup`` (queries), ``latency_queries`` (single-query timings for peers).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional

import numpy as np

from nearline import datasets, peers

log = logging.getLogger("nearline.bench.worker")


def _latency_summary(lat_ms: Optional[np.ndarray]) -> dict[str, Optional[float]]:
    if lat_ms is None or lat_ms.size == 0:
        return {"lat_mean_ms": None, "lat_p50_ms": None, "lat_p99_ms": None, "lat_p999_ms": None}
    return {
        "lat_mean_ms": float(lat_ms.mean()),
        "lat_p50_ms": float(np.percentile(lat_ms, 50)),
        "lat_p99_ms": float(np.percentile(lat_ms, 99)),
        "lat_p999_ms": float(np.percentile(lat_ms, 99.9)),
    }


def run_build(spec: dict[str, Any]) -> dict[str, Any]:
    """Builds one system's index, timing it; reports peak RSS of this process."""
    p = peers.Params.from_dict(spec.get("params", {}))
    base_path = Path(spec["base"])
    rss_before = peers.rss_bytes()
    index_dir = Path(spec["index_dir"])
    t0 = time.perf_counter()
    extra = peers.build_system(spec["system"], base_path, index_dir, p, spec.get("pq_bytes"))
    build_s = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in index_dir.rglob("*") if f.is_file()) if index_dir.exists() else 0
    return {
        "system": spec["system"],
        "build_s": build_s,
        "peak_rss_bytes": peers.peak_rss_bytes(),
        "ru_maxrss_bytes": peers.ru_maxrss_bytes(),
        "rss_before_build_bytes": rss_before,
        "index_bytes": size,
        **extra,
    }


def run_search(spec: dict[str, Any]) -> dict[str, Any]:
    """Opens one system's index, warms up, then runs the query batch at each L."""
    p = peers.Params.from_dict(spec.get("params", {}))
    system = spec["system"]
    k = int(spec["k"])
    queries = datasets.read_vectors(spec["queries"])
    gt_ids, _ = datasets.read_ground_truth(spec["gt"])
    if gt_ids.shape[0] != queries.shape[0]:
        raise ValueError(f"{spec['gt']}: {gt_ids.shape[0]} rows but {queries.shape[0]} queries")
    reps = max(1, int(spec.get("queries_repeat", 1)))
    if reps > 1:
        queries = np.tile(queries, (reps, 1))
        gt_ids = np.tile(gt_ids, (reps, 1))
    queries = np.ascontiguousarray(queries)
    nq = queries.shape[0]
    elem = queries.dtype.itemsize

    rss0 = peers.rss_bytes()
    t0 = time.perf_counter()
    h = peers.open_system(system, Path(spec["index_dir"]), p, queries.shape[1], elem)
    open_s = time.perf_counter() - t0
    rss_open = peers.rss_bytes()

    Ls = [int(L) for L in spec["Ls"]]
    warm = min(nq, int(spec.get("warmup", 100)))
    if warm:
        h.batch(queries[:warm], k, Ls[0])
    n_lat = min(nq, int(spec.get("latency_queries", 200)))
    points = []
    for L in Ls:
        io0 = peers.read_proc_io()
        t = time.perf_counter()
        ids, stats = h.batch(queries, k, L)
        wall = time.perf_counter() - t
        io1 = peers.read_proc_io()
        read_bytes = io1.get("read_bytes", 0) - io0.get("read_bytes", 0) if io0 and io1 else None
        rchar = io1.get("rchar", 0) - io0.get("rchar", 0) if io0 and io1 else None
        point: dict[str, Any] = {
            "L": L,
            "recall": datasets.recall_at_k(ids, gt_ids, k),
            "qps": nq / wall if wall > 0 else None,
            "wall_s": wall,
            "proc_read_bytes": read_bytes,
            "proc_rchar": rchar,
            "proc_reads_per_query": (read_bytes / 4096.0 / nq) if read_bytes is not None else None,
        }
        lat = None
        if stats is not None:
            if "total_us" in stats:
                lat = np.asarray(stats["total_us"], dtype=np.float64) / 1000.0
            for key, name in (("reads", "mean_reads"), ("hops", "mean_hops"), ("io_utilisation", "io_util"),
                              ("cache_hits", "mean_cache_hits"), ("bytes_read", "mean_bytes_read"),
                              ("pq_distances", "mean_pq_distances"), ("exact_distances", "mean_exact_distances"),
                              ("io_wait_us", "mean_io_wait_us"), ("cpu_us", "mean_cpu_us")):
                if key in stats:
                    point[name] = float(np.mean(stats[key]))
        else:
            if system == "diskannpy" and read_bytes is not None:
                point["mean_reads"] = read_bytes / 4096.0 / nq
            elif system in ("faiss-hnsw", "hnswlib"):
                point["mean_reads"] = 0.0
        # Sequential single-query timings on a subset, for every system: the
        # peers' latency figures, and nearline's cross-check of its own stats.
        single = None
        if n_lat:
            single = np.empty(n_lat)
            for i in range(n_lat):
                s = time.perf_counter()
                h.single(queries[i], k, L)
                single[i] = (time.perf_counter() - s) * 1000.0
            point["latency_source"] = "per-query total_us (batch)" if lat is not None else (
                f"single-query timing of {n_lat} queries")
            point.update({"single_" + key: v for key, v in _latency_summary(single).items()})
        if lat is None:
            lat = single
        point.update(_latency_summary(lat))
        points.append(point)
        log.info("%s L=%d recall@%d=%.4f qps=%.0f", system, L, k, point["recall"], point["qps"] or 0)
    h.close()
    return {
        "system": system,
        "nq": nq,
        "open_s": open_s,
        "rss_before_open_bytes": rss0,
        "rss_after_open_bytes": rss_open,
        "peak_rss_bytes": peers.peak_rss_bytes(),
        "points": points,
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Dispatches on ``spec["action"]``."""
    action = spec.get("action")
    if action == "build":
        return run_build(spec)
    if action == "search":
        return run_search(spec)
    raise ValueError(f"unknown action {action!r}: expected 'build' or 'search'")


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point; returns the exit status (0 ok, 1 error reported as JSON ``{"error": ...}``)."""
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s worker %(message)s")
    text = argv[0] if argv else sys.stdin.read()
    # Keep the real stdout for the result; send everything else (C++ logs) to stderr.
    sys.stdout.flush()
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    status = 0
    try:
        result = run(json.loads(text))
    except Exception as e:  # reported to the parent, which decides
        traceback.print_exc(file=sys.stderr)
        result = {"error": f"{type(e).__name__}: {e}"}
        status = 1
    sys.stdout.flush()
    with os.fdopen(real_stdout, "w") as out:
        out.write(json.dumps(peers.jsonable(result)))
        out.write("\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
