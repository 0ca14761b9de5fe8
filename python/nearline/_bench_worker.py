"""One benchmark step in a fresh process: ``python -m nearline._bench_worker [SPEC_JSON]``.

The JSON spec comes from argv[1] or, if absent, stdin; the result JSON is the
only thing written to the real stdout. Anything the systems print (DiskANN's
C++ logging goes to stdout) is redirected to stderr at the file-descriptor level.

Spec keys: ``action`` ("build", "search", "range_search" or "ceiling"), ``system``, ``name``
(the system's name in the report, e.g. a nearline variant), ``base`` (vector
file), ``index_dir``, ``params`` (see :class:`nearline.peers.Params`),
``pq_bytes``, ``variant`` (nearline only: ``{"build", "open", "search"}``
keyword overrides); for search also ``queries``, ``gt``, ``k``, ``Ls``,
``queries_repeat``, ``warmup`` (queries), ``latency_queries`` (size of the
closed-loop latency run per L; 0 = none: nearline's percentiles then come from
the recall batch), ``perturb`` and ``seed`` (see
:func:`nearline.bench.perturbed_queries`); for ceiling ``path``, ``depth``,
``seconds``, ``io``, ``seed`` (see :func:`nearline.measure_read_ceiling`);
for range_search ``method`` ("native" or "doubling"), ``range_gt`` (a range
ground-truth file), ``radius``, ``metric``, ``n`` (base vectors: the most k
the doubling baseline asks for), ``Ls``, ``k0`` (the doubling baseline's first k;
None = each L), ``queries_repeat``, ``warmup``.
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
from nearline.bench import (
    DEFAULT_PERTURB,
    closed_loop_latency,
    knn_doubling_range,
    latency_summary,
    perturbed_queries,
    process_closed_loop_latency,
    tile_csr,
)

log = logging.getLogger("nearline.bench.worker")


def run_build(spec: dict[str, Any]) -> dict[str, Any]:
    """Builds one system's index, timing it; reports peak RSS of this process."""
    p = peers.Params.from_dict(spec.get("params", {}))
    base_path = Path(spec["base"])
    rss_before = peers.rss_bytes()
    index_dir = Path(spec["index_dir"])
    t0 = time.perf_counter()
    extra = peers.build_system(spec["system"], base_path, index_dir, p, spec.get("pq_bytes"), spec.get("variant"))
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


def _stats_means(stats: dict[str, np.ndarray]) -> dict[str, float]:
    point: dict[str, float] = {}
    for key, name in (("reads", "mean_reads"), ("hops", "mean_hops"), ("io_utilisation", "io_util"),
                      ("cache_hits", "mean_cache_hits"), ("bytes_read", "mean_bytes_read"),
                      ("pq_distances", "mean_pq_distances"), ("exact_distances", "mean_exact_distances"),
                      ("io_wait_us", "mean_io_wait_us"), ("cpu_us", "mean_cpu_us"), ("dist_us", "mean_dist_us"),
                      ("total_us", "mean_total_us"), ("refine_reads", "mean_refine_reads"),
                      ("adjacency_hits", "mean_adjacency_hits"), ("replica_hits", "mean_replica_hits")):
        if key in stats:
            point[name] = float(np.mean(stats[key]))
    # Starling's Table 2: ξ averaged over every block read (records used /
    # records held), and the search path length ℓ.
    if "used_records" in stats and "page_records" in stats:
        held = float(np.sum(stats["page_records"]))
        point["vertex_util"] = float(np.sum(stats["used_records"])) / held if held > 0 else 0.0
    if "path_length" in stats:
        point["mean_path_length"] = float(np.mean(stats["path_length"]))
    return point


def _roofline_means(stats: dict[str, np.ndarray], source: str) -> dict[str, Any]:
    """The roofline's inputs from one run: mean per-query ``dist_us``, ``io_wait_us``, ``total_us``.

    Keys ``roofline_dist_us``, ``roofline_io_wait_us``, ``roofline_total_us`` (each
    only where the engine reports that statistic: an engine without ``dist_us``
    leaves distance time unknown, not zero) and ``roofline_source``, the run they
    come from. Empty without ``total_us``.
    """
    if "total_us" not in stats:
        return {}
    out: dict[str, Any] = {"roofline_source": source}
    for key in ("dist_us", "io_wait_us", "total_us"):
        if key in stats:
            out[f"roofline_{key}"] = float(np.mean(stats[key]))
    return out


def _latency_run(h: peers.Handle, lat_queries: np.ndarray, k: int, L: int, threads: int,
                 spec: dict[str, Any]) -> dict[str, Any]:
    """The closed-loop latency run at one L: per-query latencies and how they were taken.

    nearline: one batch search on ``threads`` workers (each takes the next query
    when its previous one finishes); latency = the engine's per-query ``total_us``.
    Peers: ``threads`` Python threads, each calling the single-query search in a
    closed loop; latency = the time around the call. A peer whose search holds
    the GIL (diskannpy) gets ``threads`` processes instead, each with its own
    open index, since Python threads would run its calls one at a time and time
    the wait for the GIL as latency. When nearline's run has one query per worker
    (``queries_in_flight=1``, the default here) its mean distance, I/O-wait and
    total time also go to the point as the roofline's inputs (:func:`_roofline_means`).
    """
    n = int(lat_queries.shape[0])
    roofline: dict[str, Any] = {}
    t = time.perf_counter()
    if h.holds_gil and threads > 1:
        params = dict(spec.get("params", {}), threads=1)
        lat, wall = process_closed_loop_latency(spec["system"], spec["index_dir"], params, spec.get("variant"),
                                                lat_queries, k, L, threads)
        source = f"timed single-query calls in {threads} processes (its search holds the GIL)"
    elif h.has_stats:
        _ids, stats = h.closed_loop_batch(lat_queries, k, L)
        wall = time.perf_counter() - t
        if stats is None or "total_us" not in stats:
            raise ValueError("nearline returned no per-query total_us")
        lat = np.asarray(stats["total_us"], dtype=np.float64) / 1000.0
        qif = h.search_kw.get("queries_in_flight", 1)
        source = f"engine total_us, batch search on {threads} threads, {qif} queries in flight per thread"
        if qif == 1:  # a query has its worker to itself: total_us is that query's own time
            roofline = _roofline_means(stats, "closed-loop latency run, 1 query in flight per worker")
    else:
        lat, wall = closed_loop_latency(lambda q: h.single(q, k, L), lat_queries, threads)
        source = f"timed single-query calls on {threads} Python threads"
    out: dict[str, Any] = {"lat_queries": n, "latency_source": source,
                           "lat_run_qps": n / wall if wall > 0 else None,
                           "lat_concurrency": float(lat.sum() / 1000.0 / wall) if wall > 0 else None}
    out.update(latency_summary(lat))
    out.update(roofline)
    return out


#: What a search's refusal says when the memory budget cannot hold its scratch.
BUDGET_REFUSAL = "even with the cache emptied"


def run_search(spec: dict[str, Any]) -> dict[str, Any]:
    """Opens one system's index, warms up, then at each L runs the query batch and the latency run."""
    p = peers.Params.from_dict(spec.get("params", {}))
    system = spec["system"]
    name = spec.get("name") or system
    k = int(spec["k"])
    queries = datasets.read_vectors(spec["queries"])
    gt_ids, _ = datasets.read_ground_truth(spec["gt"])
    if gt_ids.shape[0] != queries.shape[0]:
        raise ValueError(f"{spec['gt']}: {gt_ids.shape[0]} rows but {queries.shape[0]} queries")
    n_lat = max(0, int(spec.get("latency_queries", 0)))
    lat_queries = (np.ascontiguousarray(perturbed_queries(queries, n_lat, float(spec.get("perturb", DEFAULT_PERTURB)),
                                                          int(spec.get("seed", 0))))
                   if n_lat else None)
    reps = max(1, int(spec.get("queries_repeat", 1)))
    if reps > 1:
        queries = np.tile(queries, (reps, 1))
        gt_ids = np.tile(gt_ids, (reps, 1))
    queries = np.ascontiguousarray(queries)
    nq = queries.shape[0]
    elem = queries.dtype.itemsize

    rss0 = peers.rss_bytes()
    t0 = time.perf_counter()
    h = peers.open_system(system, Path(spec["index_dir"]), p, queries.shape[1], elem, spec.get("variant"))
    open_s = time.perf_counter() - t0
    rss_open = peers.rss_bytes()

    Ls = [int(L) for L in spec["Ls"]]
    warm = min(nq, int(spec.get("warmup", 100)))
    if warm:
        h.batch(queries[:warm], k, Ls[0])
    points = []
    refused: list[dict[str, Any]] = []
    for L in Ls:
        io0 = peers.read_proc_io()
        t = time.perf_counter()
        try:
            ids, stats = h.batch(queries, k, L)
        except ValueError as e:
            # The memory budget cannot give this L's scratch to the workers:
            # a point the budget does not serve (every larger L needs more),
            # reported as such rather than ending the whole run.
            if not points or BUDGET_REFUSAL not in str(e):
                raise
            refused = [{"L": x, "reason": str(e)} for x in Ls[Ls.index(L):]]
            log.warning("%s: L >= %d refused by the memory budget: %s", name, L, e)
            break
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
        mem = h.memory()
        if mem and "cache_borrows" in mem:
            # Searches so far that borrowed from the cache (the batch at this L is the last), the most it
            # lent, and its planned size: what a search past the workers' share cost the cache.
            point.update(cache_borrows=mem["cache_borrows"], cache_borrowed_peak_bytes=mem["cache_borrowed_peak"],
                         cache_planned_bytes=mem["cache_planned"])
        if stats is not None:
            point.update(_stats_means(stats))
        elif system == "diskannpy" and read_bytes is not None:
            point["mean_reads"] = read_bytes / 4096.0 / nq
        elif system in ("faiss-hnsw", "hnswlib"):
            point["mean_reads"] = 0.0
        if lat_queries is not None:
            point.update(_latency_run(h, lat_queries, k, L, p.threads, spec))
        elif stats is not None and "total_us" in stats:
            # No separate latency run: the recall batch's own per-query times.
            lat = np.asarray(stats["total_us"], dtype=np.float64) / 1000.0
            point.update(latency_summary(lat), lat_queries=int(lat.size),
                         latency_source=(f"engine total_us of the recall batch on {p.threads} threads, "
                                         f"queries_in_flight={h.queries_in_flight()}"),
                         lat_concurrency=float(lat.sum() / 1000.0 / wall) if wall > 0 else None)
        else:
            point.update(latency_summary(None))
        if stats is not None and "roofline_source" not in point:
            # No latency run with one query per worker: the recall batch's own times.
            qif = h.queries_in_flight() if hasattr(h, "queries_in_flight") else None
            note = ("" if qif == 1 else
                    " (queries interleave on a worker: total_us includes the others' time)" if isinstance(qif, int)
                    else " (queries may interleave on a worker: total_us then includes the others' time)")
            point.update(_roofline_means(stats, f"recall batch, queries_in_flight={qif}{note}"))
        points.append(point)
        log.info("%s L=%d recall@%d=%.4f qps=%.0f p99.9=%s ms", name, L, k, point["recall"], point["qps"] or 0,
                 point.get("lat_p999_ms"))
    h.close()
    return {
        "system": name,
        "kind": system,
        "threads": p.threads,
        "nq": nq,
        "open_s": open_s,
        "rss_before_open_bytes": rss0,
        "rss_after_open_bytes": rss_open,
        "peak_rss_bytes": peers.peak_rss_bytes(),
        "points": points,
        "refused": refused,
    }


def run_range_search(spec: dict[str, Any]) -> dict[str, Any]:
    """Opens one system's index, warms up, then at each L answers every query's range search.

    ``method`` "native" calls the system's own range search (nearline's
    ``Index.range_search``); "doubling" runs :func:`nearline.bench.knn_doubling_range`
    over its k-NN search. Each point has the average precision against
    ``range_gt``, QPS over the whole batch (every round, for doubling), mean
    results per query, mean and max rounds, and the mean per-query statistics
    (summed over rounds) or, without them, reads from ``/proc/self/io``.
    """
    import nearline

    p = peers.Params.from_dict(spec.get("params", {}))
    system = spec["system"]
    name = spec.get("name") or system
    method = spec.get("method", "native")
    if method not in ("native", "doubling"):
        raise ValueError(f"unknown range method {method!r}: expected 'native' or 'doubling'")
    radius = float(spec["radius"])
    metric = str(spec.get("metric", p.metric))
    higher = metric != "l2"
    n = int(spec["n"])
    k0 = spec.get("k0", 10)  # None: the first k is the sweep's L
    sweep = spec.get("sweep", "L")
    if sweep not in ("L", "max_L"):
        raise ValueError(f"unknown range sweep {sweep!r}: expected 'L' or 'max_L'")
    start_L = int(spec.get("start_L", 10))
    queries = datasets.read_vectors(spec["queries"])
    gt_lims, gt_ids, _ = nearline.read_range_ground_truth(spec["range_gt"])
    if gt_lims.size - 1 != queries.shape[0]:
        raise ValueError(f"{spec['range_gt']}: {gt_lims.size - 1} queries but {spec['queries']} has {queries.shape[0]}")
    reps = max(1, int(spec.get("queries_repeat", 1)))
    if reps > 1:
        queries = np.tile(queries, (reps, 1))
        gt_lims, gt_ids = tile_csr(gt_lims, gt_ids, reps)
    queries = np.ascontiguousarray(queries)
    nq = queries.shape[0]

    rss0 = peers.rss_bytes()
    t0 = time.perf_counter()
    h = peers.open_system(system, Path(spec["index_dir"]), p, queries.shape[1], queries.dtype.itemsize,
                          spec.get("variant"))
    open_s = time.perf_counter() - t0
    rss_open = peers.rss_bytes()

    def answer(qs: np.ndarray, L: int) -> dict[str, Any]:
        if method == "native":
            if sweep == "max_L":  # the sweep value bounds the doubling
                lims, ids, d, stats = h.range_batch(qs, radius, min(start_L, L), max_L=L)
            else:
                lims, ids, d, stats = h.range_batch(qs, radius, L)
            return {"lims": lims, "ids": ids, "distances": d, "rounds": None, "stats": stats}
        return knn_doubling_range(h.batch_with_distances, qs, radius, L, L if k0 is None else int(k0), n, higher)

    Ls = [int(L) for L in spec["Ls"]]
    warm = min(nq, int(spec.get("warmup", 100)))
    if warm:
        answer(queries[:warm], Ls[0])
    points = []
    for L in Ls:
        io0 = peers.read_proc_io()
        t = time.perf_counter()
        out = answer(queries, L)
        wall = time.perf_counter() - t
        io1 = peers.read_proc_io()
        read_bytes = io1.get("read_bytes", 0) - io0.get("read_bytes", 0) if io0 and io1 else None
        lims = np.asarray(out["lims"], dtype=np.int64)
        point: dict[str, Any] = {
            "L": L,
            "ap": nearline.average_precision(lims, out["ids"], gt_lims, gt_ids),
            "qps": nq / wall if wall > 0 else None,
            "wall_s": wall,
            "mean_results": float(np.diff(lims).mean()) if nq else 0.0,
            "proc_read_bytes": read_bytes,
            "proc_reads_per_query": (read_bytes / 4096.0 / nq) if read_bytes is not None else None,
        }
        if out["rounds"] is not None:
            point["mean_rounds"] = float(np.mean(out["rounds"]))
            point["max_rounds"] = float(np.max(out["rounds"]))
        stats = out["stats"]
        if stats is not None:
            point.update(_stats_means(stats))
            if "doublings" in stats:  # native: list doublings of the engine's range search
                point["mean_doublings"] = float(np.mean(stats["doublings"]))
            if "total_us" in stats:
                point.update(latency_summary(np.asarray(stats["total_us"], dtype=np.float64) / 1000.0))
        elif read_bytes is not None:
            point["mean_reads"] = read_bytes / 4096.0 / nq
        points.append(point)
        log.info("%s L=%d AP=%.4f qps=%.0f results=%.1f", name, L, point["ap"], point["qps"] or 0,
                 point["mean_results"])
    h.close()
    return {
        "system": name,
        "kind": system,
        "method": method,
        "nq": nq,
        "open_s": open_s,
        "rss_before_open_bytes": rss0,
        "rss_after_open_bytes": rss_open,
        "peak_rss_bytes": peers.peak_rss_bytes(),
        "points": points,
    }


def run_ceiling(spec: dict[str, Any]) -> dict[str, Any]:
    """Measures the disk's random-read ceiling on ``spec["path"]`` (a file or an index directory)."""
    import nearline

    return nearline.measure_read_ceiling(
        spec["path"], spec.get("block_size"), int(spec.get("depth", 32)), float(spec.get("seconds", 3.0)),
        io=str(spec.get("io", "auto")), seed=int(spec.get("seed", 0)),
    )


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Dispatches on ``spec["action"]``."""
    action = spec.get("action")
    if action == "build":
        return run_build(spec)
    if action == "search":
        return run_search(spec)
    if action == "range_search":
        return run_range_search(spec)
    if action == "ceiling":
        return run_ceiling(spec)
    raise ValueError(f"unknown action {action!r}: expected 'build', 'search', 'range_search' or 'ceiling'")


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
