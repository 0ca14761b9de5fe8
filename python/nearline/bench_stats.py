"""The benchmark's pure helpers: the alternation schedule, perturbed queries and closed-loop latency runs,
interpolation at a target recall and same-run ratios, medians over repetitions, the roofline, range search by
doubling k, and the key that lets variants share a build. ``nearline.bench`` re-exports every name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from nearline import peers

log = logging.getLogger("nearline.bench")

TARGET_RECALLS = (0.90, 0.95, 0.99)
#: APs at which range-mode ratios are interpolated.
TARGET_APS = (0.80, 0.90, 0.95)
#: Default relative size of the latency-run perturbation (see :func:`perturbed_queries`).
DEFAULT_PERTURB = 0.01
#: Point metrics aggregated (median over repetitions).
POINT_METRICS = (
    "recall", "qps", "wall_s", "lat_mean_ms", "lat_p50_ms", "lat_p99_ms", "lat_p999_ms", "lat_queries",
    "lat_concurrency", "lat_run_qps", "mean_reads", "mean_hops", "io_util", "proc_reads_per_query",
    "proc_read_bytes", "mean_cache_hits", "mean_bytes_read", "mean_pq_distances", "mean_exact_distances",
    "mean_io_wait_us", "mean_cpu_us", "vertex_util", "mean_path_length", "mean_dist_us", "mean_total_us",
    "roofline_dist_us", "roofline_io_wait_us", "roofline_total_us", "mean_refine_reads", "mean_adjacency_hits",
    "mean_replica_hits", "cache_borrows", "cache_borrowed_peak_bytes", "cache_planned_bytes",
)


def _ms(us: Optional[float]) -> Optional[float]:
    return None if us is None else us / 1e3


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return (a / b) if (a is not None and b) else None


def alternation_schedule(systems: Sequence[str], reps: int) -> list[list[str]]:
    """Search order per repetition: rep ``r`` runs ``systems`` rotated left by ``r``.

    ``[A, B, C]`` over 3 reps gives ``[A, B, C], [B, C, A], [C, A, B]``, so each
    system runs first (on a cold-ish machine) equally often.
    """
    s = list(systems)
    if not s:
        return [[] for _ in range(reps)]
    return [s[r % len(s):] + s[: r % len(s)] for r in range(reps)]


def perturbed_queries(queries: np.ndarray, n: int, scale: float = DEFAULT_PERTURB, seed: int = 0) -> np.ndarray:
    """``n`` latency-run queries built from ``queries`` (same dtype and dimension).

    Row ``i`` is query ``i mod nq``; the first copy of the set is unchanged, every
    later copy adds Gaussian noise whose standard deviation in dimension ``d`` is
    ``scale`` times the standard deviation of the query set in that dimension
    (so repeats do not retrace identical searches, while staying in the query
    distribution). Integer types are rounded and clipped to their range.
    """
    q = np.asarray(queries)
    if q.ndim != 2 or q.shape[0] == 0:
        raise ValueError(f"queries must be a non-empty 2-D array, got shape {q.shape}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not (np.isfinite(scale) and scale >= 0):
        raise ValueError(f"scale must be a finite number >= 0, got {scale}")
    nq = q.shape[0]
    idx = np.arange(n) % nq
    base = q[idx].astype(np.float64)
    if n > nq and scale > 0:
        sigma = q.astype(np.float64).std(axis=0) * scale
        rng = np.random.default_rng(seed)
        noise = rng.standard_normal((n - nq, q.shape[1])) * sigma
        base[nq:] += noise
    if np.issubdtype(q.dtype, np.integer):
        info = np.iinfo(q.dtype)
        base = np.clip(np.rint(base), info.min, info.max)
    return np.ascontiguousarray(base.astype(q.dtype))


def latency_summary(lat_ms: Optional[np.ndarray]) -> dict[str, Optional[float]]:
    """Mean and p50/p99/p99.9 (numpy's linear interpolation) of per-query latencies in ms."""
    if lat_ms is None or np.asarray(lat_ms).size == 0:
        return {"lat_mean_ms": None, "lat_p50_ms": None, "lat_p99_ms": None, "lat_p999_ms": None}
    lat = np.asarray(lat_ms, dtype=np.float64)
    p50, p99, p999 = np.percentile(lat, [50, 99, 99.9])
    return {"lat_mean_ms": float(lat.mean()), "lat_p50_ms": float(p50), "lat_p99_ms": float(p99),
            "lat_p999_ms": float(p999)}


def closed_loop_latency(
    search_one: Callable[[np.ndarray], Any], queries: np.ndarray, threads: int
) -> tuple[np.ndarray, float]:
    """Runs ``search_one(query)`` for every row on ``threads`` Python threads, closed loop.

    Each thread takes the next unclaimed query as soon as its previous call
    returns. Returns ``(latency_ms per query, wall seconds)``; a latency is the
    time around the call. Calls that hold the GIL run one at a time whatever
    ``threads`` is; ``sum(latency) / wall`` (reported as ``lat_concurrency``)
    shows the concurrency actually reached. The first error is re-raised.
    """
    n = int(queries.shape[0])
    lat = np.zeros(n, dtype=np.float64)
    lock = threading.Lock()
    state = {"next": 0}
    errors: list[BaseException] = []

    def loop() -> None:
        while True:
            with lock:
                i = state["next"]
                if i >= n or errors:
                    return
                state["next"] = i + 1
            q = queries[i]
            t0 = time.perf_counter()
            try:
                search_one(q)
            except BaseException as e:  # re-raised in the caller's thread
                with lock:
                    errors.append(e)
                return
            lat[i] = (time.perf_counter() - t0) * 1000.0

    t = time.perf_counter()
    workers = [threading.Thread(target=loop, daemon=True) for _ in range(max(1, int(threads)))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t
    if errors:
        raise errors[0]
    return lat, wall


def _closed_loop_child(system: str, index_dir: str, params: dict[str, Any], variant: Optional[dict[str, Any]],
                       queries: np.ndarray, k: int, L: int, counter: Any, lat: Any, span: Any, slot: int,
                       barrier: Any, errors: Any) -> None:
    """One process of :func:`process_closed_loop_latency`: open, warm up, wait at the barrier, then loop."""
    try:
        p = peers.Params.from_dict(params)
        h = peers.open_system(system, Path(index_dir), p, queries.shape[1], queries.dtype.itemsize, variant)
        for q in queries[: min(10, len(queries))]:
            h.single(q, k, L)
    except BaseException as e:
        errors.put(f"{type(e).__name__}: {e}")
        barrier.abort()
        return
    barrier.wait()
    try:
        n = len(queries)
        span[2 * slot] = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
        while True:
            with counter.get_lock():
                i = counter.value
                counter.value = i + 1
            if i >= n:
                break
            t0 = time.perf_counter()
            h.single(queries[i], k, L)
            lat[i] = (time.perf_counter() - t0) * 1000.0
        span[2 * slot + 1] = time.perf_counter()
        h.close()
    except BaseException as e:
        errors.put(f"{type(e).__name__}: {e}")


def process_closed_loop_latency(
    system: str, index_dir: str, params: dict[str, Any], variant: Optional[dict[str, Any]], queries: np.ndarray,
    k: int, L: int, processes: int, timeout_s: float = 3600.0,
) -> tuple[np.ndarray, float]:
    """:func:`closed_loop_latency` with one *process* per client, for peers whose search holds the GIL.

    Each process opens the index itself (``params["threads"]`` should be 1),
    searches 10 queries to warm up, and waits at a barrier; then every process
    takes the next unclaimed query (a shared counter) as soon as its previous
    one returns, timing each call. Returns ``(latency_ms, wall seconds from the
    first process's start to the last one's final query)``; raises
    ``RuntimeError`` with a child's error.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # never fork a process that holds an index and threads
    n = int(queries.shape[0])
    counter = ctx.Value("q", 0)
    lat = ctx.Array("d", max(n, 1), lock=False)
    span = ctx.Array("d", 2 * processes, lock=False)
    barrier = ctx.Barrier(processes + 1)
    errors = ctx.Queue()
    procs = [ctx.Process(target=_closed_loop_child, daemon=True,
                         args=(system, index_dir, params, variant, queries, k, L, counter, lat, span, slot, barrier,
                               errors))
             for slot in range(processes)]
    for pr in procs:
        pr.start()
    try:
        barrier.wait(timeout=timeout_s)
    except threading.BrokenBarrierError:
        pass
    for pr in procs:
        pr.join(timeout=timeout_s)
    for pr in procs:
        if pr.is_alive():
            pr.kill()
            pr.join()
    msgs = []
    while True:
        try:
            msgs.append(errors.get(timeout=0.1))
        except Exception:
            break
    if msgs or any(pr.exitcode != 0 for pr in procs):
        codes = [pr.exitcode for pr in procs]
        raise RuntimeError(f"{system} latency processes failed (exit codes {codes}): {'; '.join(msgs) or 'no message'}")
    times = np.frombuffer(span, dtype=np.float64)
    wall = float(times[1::2].max() - times[0::2].min())
    return np.frombuffer(lat, dtype=np.float64)[:n].copy(), wall


def interpolate_at_recall(
    recalls: Sequence[float], values: Sequence[Optional[float]], target: float, *, log_scale: bool = False
) -> Optional[float]:
    """The value a curve reaches at recall ``target``, by linear interpolation.

    The points are taken in the given order (increasing L). The first point with
    recall >= target and its predecessor bracket the target; ``None`` when the
    curve never reaches ``target`` or already starts above it (no bracket).
    With ``log_scale`` the interpolation is linear in ``log(value)`` (for QPS).
    """
    pts = [(float(r), float(v)) for r, v in zip(recalls, values) if r is not None and v is not None]
    for i, (r, v) in enumerate(pts):
        if r >= target:
            if r == target:
                return v
            if i == 0:
                return None
            r0, v0 = pts[i - 1]
            if r <= r0:
                return v
            t = (target - r0) / (r - r0)
            if log_scale and v0 > 0 and v > 0:
                return float(np.exp(np.log(v0) + t * (np.log(v) - np.log(v0))))
            return v0 + t * (v - v0)
    return None


#: (name in the ratios, point key, interpolate in log space) of the matched-recall comparisons.
_MATCHED = (("reads", "mean_reads", False), ("lat_mean", "lat_mean_ms", False), ("lat_p999", "lat_p999_ms", False),
            ("disk_util", "disk_util", False))


def matched_ratios(
    a: dict[str, Any], b: dict[str, Any], targets: Sequence[float] = TARGET_RECALLS, *, accuracy: str = "recall"
) -> dict[str, dict[str, Optional[float]]]:
    """Ratios ``a/b`` at each target recall (or other ``accuracy`` key, e.g. ``"ap"``) both curves reach.

    ``a`` and ``b`` are summaries with ``points`` (lists of dicts with ``recall``,
    ``qps``, ``mean_reads``, ``lat_mean_ms``, ``lat_p999_ms``, ``disk_util``).
    Returns ``{"0.95": {"qps_a", "qps_b", "qps_ratio", "reads_a", "reads_b",
    "reads_ratio", "lat_mean_*", "lat_p999_*", "disk_util_*"}}`` for the targets
    reached by both (QPS interpolated in log space, the rest linearly; a value
    is None where a curve lacks it).
    """
    out: dict[str, dict[str, Optional[float]]] = {}

    def curve(s: dict[str, Any], key: str) -> tuple[list[float], list[Optional[float]]]:
        pts = s.get("points", [])
        return [p.get(accuracy) for p in pts], [p.get(key) for p in pts]

    for t in targets:
        qa = interpolate_at_recall(*curve(a, "qps"), t, log_scale=True)
        qb = interpolate_at_recall(*curve(b, "qps"), t, log_scale=True)
        if qa is None or qb is None:
            continue
        row: dict[str, Optional[float]] = {"qps_a": qa, "qps_b": qb, "qps_ratio": qa / qb if qb else None}
        for name, key, log_scale in _MATCHED:
            va = interpolate_at_recall(*curve(a, key), t, log_scale=log_scale)
            vb = interpolate_at_recall(*curve(b, key), t, log_scale=log_scale)
            row[f"{name}_a"], row[f"{name}_b"] = va, vb
            row[f"{name}_ratio"] = (va / vb) if (va is not None and vb) else None
        out[f"{t:.2f}"] = row
    return out


def best_peer_ratios(summary: dict[str, dict[str, Any]], systems: Sequence[str], configs: Sequence[str],
                     threads: int, targets: Sequence[float] = TARGET_RECALLS) -> dict[str, Any]:
    """Each nearline configuration against a thread-scalable peer at its best thread count.

    ``systems`` are the run's names; the members of a peer's family are the peer
    (at the bench's ``threads``) and its ``NAME@T`` runs. For every family with two
    or more members and every target recall: each member's QPS there (interpolated
    in log space as in :func:`matched_ratios`; None where its curve does not
    bracket the target), the best member, and for each of ``configs`` (nearline's)
    its QPS, ``qps_ratio_best`` (against the best member) and
    ``qps_ratio_equal_threads`` (against the member at ``threads``). Returns
    ``{peer: {"threads": {member: T}, "at_recall": {"0.95": {...}}}}``.
    """
    families: dict[str, dict[str, int]] = {}
    for s in systems:
        try:
            base, n = peers.split_system(s)
        except ValueError:
            continue  # a nearline variant's name
        if base in peers.THREADED_PEERS and s in summary:
            families.setdefault(base, {})[s] = n if n is not None else int(threads)
    out: dict[str, Any] = {}
    for base, members in families.items():
        if len(members) < 2:
            continue
        at: dict[str, Any] = {}
        equal = next((m for m, n in members.items() if n == threads), None)
        for t in targets:
            qps = {m: _qps_at(summary[m], t) for m in members}
            reached = {m: q for m, q in qps.items() if q is not None}
            if not reached:
                continue
            best = max(reached, key=lambda m: reached[m])
            row: dict[str, Any] = {"best": best, "best_threads": members[best], "qps": qps,
                                   "equal_threads": equal, "ratios": {}}
            for c in configs:
                qc = _qps_at(summary.get(c, {}), t)
                q_eq = qps.get(equal) if equal is not None else None
                row["ratios"][c] = {"qps": qc, "qps_ratio_best": _ratio(qc, reached[best]),
                                    "qps_ratio_equal_threads": _ratio(qc, q_eq)}
            at[f"{t:.2f}"] = row
        out[base] = {"threads": members, "at_recall": at}
    return out


def _qps_at(s: dict[str, Any], target: float) -> Optional[float]:
    pts = s.get("points", [])
    return interpolate_at_recall([p.get("recall") for p in pts], [p.get("qps") for p in pts], target,
                                 log_scale=True)


def median_points(runs: Sequence[Sequence[dict[str, Any]]],
                  metrics: Sequence[str] = POINT_METRICS) -> list[dict[str, Any]]:
    """Per-L medians over repetitions of each numeric metric (``None`` where no rep has it)."""
    by_L: dict[int, list[dict[str, Any]]] = {}
    order: list[int] = []
    for pts in runs:
        for p in pts:
            if p["L"] not in by_L:
                by_L[p["L"]] = []
                order.append(p["L"])
            by_L[p["L"]].append(p)
    out = []
    for L in order:
        group = by_L[L]
        m: dict[str, Any] = {"L": L, "reps": len(group)}
        for key in metrics:
            vals = [g[key] for g in group if g.get(key) is not None]
            m[key] = float(np.median(vals)) if vals else None
        for key in ("latency_source", "roofline_source"):
            sources = {g.get(key) for g in group if g.get(key)}
            if sources:
                m[key] = "; ".join(sorted(sources))
        out.append(m)
    return out


def single_target(targets: Sequence[float]) -> float:
    """The one target recall of a single-point view (the budget sweep's plot, the roofline):
    the only target given, else 0.95."""
    return float(targets[0]) if len(targets) == 1 else 0.95


def _roofline_point(points: Sequence[dict[str, Any]], target: float
                    ) -> tuple[Optional[dict[str, Any]], dict[str, Optional[float]]]:
    """The operating point of one curve at recall ``target`` and its roofline inputs there.

    Over the points that have a recall and a ``roofline_total_us``, in order of L:
    where the curve brackets ``target`` (the first point reaching it and its
    predecessor, as :func:`interpolate_at_recall` takes them) each input is
    interpolated linearly in recall, as :func:`matched_ratios` does; otherwise
    (the curve starts above the target or never reaches it) the point whose
    recall is nearest the target (the smaller L on a tie) gives them. Returns
    ``(where, values)``: ``where`` is ``{"how": "interpolated" | "nearest L",
    "L": [L0, L1] or [L], "recall": ...}`` (None without such a point);
    ``values`` maps ``dist_us``, ``io_wait_us``, ``total_us`` to a number, or
    None where a point used lacks it.
    """
    keys = ("dist_us", "io_wait_us", "total_us")
    pts = [p for p in points if p.get("recall") is not None and p.get("roofline_total_us") is not None]
    if not pts:
        return None, {key: None for key in keys}

    def at(p: dict[str, Any]) -> dict[str, Optional[float]]:
        return {key: None if p.get(f"roofline_{key}") is None else float(p[f"roofline_{key}"]) for key in keys}

    for i, p in enumerate(pts):
        r = float(p["recall"])
        if r < target:
            continue
        if r == target or (i > 0 and r <= float(pts[i - 1]["recall"])):
            return {"how": "interpolated", "L": [p["L"]], "recall": float(target)}, at(p)
        if i == 0:
            break  # the curve starts above the target: no bracket
        p0 = pts[i - 1]
        t = (target - float(p0["recall"])) / (r - float(p0["recall"]))
        v0, v1 = at(p0), at(p)
        values = {key: None if v0[key] is None or v1[key] is None else v0[key] + t * (v1[key] - v0[key])
                  for key in keys}
        return {"how": "interpolated", "L": [p0["L"], p["L"]], "recall": float(target)}, values
    best = min(pts, key=lambda q: (abs(float(q["recall"]) - target), q["L"]))
    return {"how": "nearest L", "L": [best["L"]], "recall": float(best["recall"])}, at(best)


def roofline_summary(summary: dict[str, dict[str, Any]], target: float) -> dict[str, dict[str, Any]]:
    """Per query: time computing distances, waiting on I/O, and the rest, per system at recall ``target``.

    The inputs are nearline's per-query statistics (the points' ``roofline_*``
    means, taken by the worker from the closed-loop latency run when it gives a
    worker one query at a time, else from the recall batch: ``source`` says which).
    ``dist_us`` is the engine's time in distance computation (exact distances and
    the routing estimates); ``other_us`` = ``total_us - dist_us - io_wait_us``,
    clamped at 0; ``non_io_us`` = ``total_us - io_wait_us`` (clamped), which is
    all there is when the engine reports no ``dist_us``: distance time, ``other_us``
    and the shares are then None, never guessed. A system without the statistics
    (the peers) has ``available`` False and None everywhere. Returns
    ``{system: {"available", "target_recall", "at", "dist_us", "io_wait_us",
    "other_us", "non_io_us", "total_us", "dist_share", "io_share", "other_share",
    "source", "note"}}``.
    """
    out: dict[str, dict[str, Any]] = {}
    for system, s in summary.items():
        pts = s.get("points", [])
        row: dict[str, Any] = {"available": False, "target_recall": float(target), "at": None, "dist_us": None,
                               "io_wait_us": None, "other_us": None, "non_io_us": None, "total_us": None,
                               "dist_share": None, "io_share": None, "other_share": None, "source": None,
                               "note": None}
        if not any(p.get("roofline_total_us") is not None for p in pts):
            row["note"] = "no per-query time split (the system reports no distance or I/O-wait times)"
            out[system] = row
            continue
        where, v = _roofline_point(pts, target)
        dist, io, total = v["dist_us"], v["io_wait_us"], v["total_us"]
        row.update(at=where, dist_us=dist, io_wait_us=io, total_us=total)
        sources = sorted({p["roofline_source"] for p in pts if p.get("roofline_source")})
        row["source"] = "; ".join(sources) if sources else None
        if total is not None and io is not None:
            row["available"] = True
            row["non_io_us"] = max(0.0, total - io)
            row["io_share"] = io / total if total > 0 else None
            if dist is not None:
                row["other_us"] = max(0.0, total - dist - io)
                if total > 0:
                    row["dist_share"] = dist / total
                    row["other_share"] = row["other_us"] / total
            else:
                row["note"] = "the engine reports no dist_us: distance time unavailable"
        else:
            row["note"] = "the engine reports no io_wait_us or total_us at this operating point"
        out[system] = row
    return out


#: Per-query statistics that add up over the rounds of the doubling baseline.
_SUMMED_STATS = ("hops", "reads", "bytes_read", "cache_hits", "pq_distances", "exact_distances", "io_wait_us",
                 "cpu_us", "total_us", "used_bytes", "page_records", "used_records", "colocated", "path_length",
                 "dist_us", "refine_reads", "adjacency_hits", "replica_hits")


def knn_doubling_range(
    search: Callable[[np.ndarray, int, int], tuple[np.ndarray, np.ndarray, Optional[dict[str, np.ndarray]]]],
    queries: np.ndarray,
    radius: float,
    L: int,
    k0: int,
    n: int,
    higher_is_closer: bool,
) -> dict[str, Any]:
    """Range search by repeated k-NN with doubling k (the baseline Starling §5.3 improves on).

    Every query is searched with ``k = min(k0, n)`` and list size ``max(L, k)``;
    each query whose ``k`` results are all within ``radius`` (squared distance
    ``<= radius``, or score ``>= radius`` when ``higher_is_closer``) and ``k < n``
    is searched again with ``k`` doubled (at most ``n``), from scratch, until
    some result falls outside the radius. Its answer is its last round's results
    within the radius (ids < 0 are padding, never results). Each round is one
    batch over the queries still going.

    ``search(queries, k, L)`` returns ``(ids (m, k), values (m, k), stats or None)``
    with user-facing values, best first. Returns ``lims``, ``ids``, ``distances``
    (CSR), ``rounds`` per query and ``stats``: per-query sums over all rounds of
    the additive statistics (reads, hops, ``total_us``, ...; ``io_utilisation``
    recomputed from the sums), or None when ``search`` gives none.
    """
    q = np.asarray(queries)
    nq = q.shape[0]
    if k0 < 1 or n < 1:
        raise ValueError(f"k0={k0} and n={n} must be at least 1")
    k = min(int(k0), int(n))
    active = np.arange(nq)
    rounds = np.zeros(nq, dtype=np.int64)
    kept_ids: list[Optional[np.ndarray]] = [None] * nq
    kept_d: list[Optional[np.ndarray]] = [None] * nq
    sums: Optional[dict[str, np.ndarray]] = None
    while active.size:
        ids, d, st = search(np.ascontiguousarray(q[active]), k, max(int(L), k))
        ids = np.asarray(ids).reshape(active.size, -1)
        d = np.asarray(d).reshape(active.size, -1)
        within = (ids >= 0) & ((d >= radius) if higher_is_closer else (d <= radius))
        rounds[active] += 1
        if st is not None:
            if sums is None:
                sums = {key: np.zeros(nq) for key in _SUMMED_STATS if key in st}
            for key in sums:
                sums[key][active] += np.asarray(st[key], dtype=np.float64)
        again = within.all(axis=1) & (k < n)
        for row in np.flatnonzero(~again):
            qi = active[row]
            kept_ids[qi] = ids[row][within[row]].astype(np.int64)
            kept_d[qi] = d[row][within[row]].astype(np.float32)
        active = active[again]
        k = min(2 * k, int(n))
    counts = np.array([0 if x is None else x.size for x in kept_ids], dtype=np.int64)
    lims = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    ids_out = np.concatenate([x for x in kept_ids if x is not None] or [np.zeros(0, np.int64)])
    d_out = np.concatenate([x for x in kept_d if x is not None] or [np.zeros(0, np.float32)])
    if sums is not None and "used_bytes" in sums and "bytes_read" in sums:
        sums["io_utilisation"] = np.where(sums["bytes_read"] > 0, sums["used_bytes"] / np.maximum(sums["bytes_read"], 1),
                                          0.0)
    return {"lims": lims, "ids": ids_out.astype(np.int64), "distances": d_out.astype(np.float32), "rounds": rounds,
            "stats": sums}


def tile_csr(lims: np.ndarray, ids: np.ndarray, reps: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR ``(lims, ids)`` of ``reps`` copies of the same queries one after another."""
    lims = np.asarray(lims, dtype=np.int64)
    ids = np.asarray(ids)
    if reps <= 1:
        return lims, ids
    total = int(lims[-1])
    out = np.concatenate([lims[:1]] + [lims[1:] + r * total for r in range(reps)])
    return out, np.tile(ids, reps)


def add_disk_utilisation(points: list[dict[str, Any]], ceiling_reads_per_s: Optional[float]) -> None:
    """Adds ``achieved_reads_per_s`` (QPS × mean reads) and ``disk_util`` (÷ the ceiling) to each point."""
    for p in points:
        qps, reads = p.get("qps"), p.get("mean_reads")
        achieved = qps * reads if (qps is not None and reads is not None) else None
        p["achieved_reads_per_s"] = achieved
        p["disk_util"] = (achieved / ceiling_reads_per_s) if (achieved is not None and ceiling_reads_per_s) else None


def params_key(system: str, dataset: str, p: peers.Params, pq_bytes: Optional[int],
               overrides: Optional[dict[str, Any]] = None) -> str:
    """Cache directory name for an index: system, dataset, hash of the build parameters.

    ``overrides`` (a nearline variant's build keys) are merged into the hashed
    parameters, so variants with the same build keys share one directory.
    """
    build: dict[str, Any] = {"R": p.R, "build_L": p.build_L, "metric": p.metric, "seed": p.seed}
    if system in ("nearline", "diskannpy"):
        build["pq_bytes"] = pq_bytes
    if system == "nearline":
        build.update(alpha=p.alpha, memory_budget=str(p.memory_budget), build_memory_budget=str(p.build_memory_budget))
        # Only when set, so indexes cached before these options keep their names.
        if p.nav_sample:
            build["nav_sample"] = float(p.nav_sample)
        if p.entry_clusters:
            build["entry_clusters"] = int(p.entry_clusters)
        build.update(overrides or {})
    h = hashlib.sha1(json.dumps(build, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{system}-{dataset}-{h}"
