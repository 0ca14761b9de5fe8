"""Routing of a segmented collection (:mod:`nearline.distributed`): which segment owns a row,
which segments a query visits, how their answers merge. NumPy only (no Ray), so it is tested
and used on its own.

* ``hash``: a row belongs to segment ``splitmix64(id) % segments``; every query visits every
  segment (scatter-gather) and the top-k of their answers is the answer.
* ``kmeans``: the segments are the cells of a k-means over the vectors; a row belongs to the
  segment of its nearest centroid and a query visits the ``nprobe_segments`` segments whose
  centroids are nearest to it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

AUTO, HASH, KMEANS = "auto", "hash", "kmeans"
#: Routing names :func:`nearline.distributed.build` accepts.
ROUTINGS = (AUTO, HASH, KMEANS)
#: ``routing="auto"`` picks k-means from this many segments on (and hash below it).
KMEANS_MIN_SEGMENTS = 9
#: The share of a query's true 10 nearest neighbours the default ``nprobe_segments`` of a
#: k-means collection is calibrated to cover (measured on a sample of the data at build).
COVERAGE_TARGET = 0.99

_M1, _M2, _G = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def plan_routing(segments: int, metric: str) -> Tuple[str, str]:
    """``routing="auto"``: the kind the planner picks for ``segments`` segments, and why."""
    if segments < KMEANS_MIN_SEGMENTS:
        return HASH, (f"auto: {segments} segment(s) < {KMEANS_MIN_SEGMENTS}: hash routing with scatter-gather; "
                      "every query visits every segment, so recall matches one index at the same per-segment L "
                      "and the fan-out stays small")
    if metric == "ip":
        return HASH, ("auto: inner product: the nearest centroid does not bound where the largest inner "
                      "products lie, so hash routing with scatter-gather keeps recall")
    return KMEANS, (f"auto: {segments} segments >= {KMEANS_MIN_SEGMENTS}: k-means routing; a query visits only "
                    "its nearest segments (nprobe_segments, calibrated at build) instead of fanning out to all")


def hash_segments(ids: np.ndarray, segments: int) -> np.ndarray:
    """The owning segment of each id under hash routing: ``splitmix64(id) % segments`` (int64)."""
    z = np.asarray(ids, dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        z = z + _G
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(segments)).astype(np.int64)


def prepare(x: np.ndarray, metric: str) -> np.ndarray:
    """Vectors as routing sees them: float32, unit length for ``cosine``."""
    v = np.asarray(x, dtype=np.float32)
    if metric == "cosine":
        v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), np.float32(1e-30))
    return v


def _sq_dists(x: np.ndarray, c: np.ndarray, c_sq: np.ndarray) -> np.ndarray:
    """Squared L2 distances (len(x), len(c)) up to the per-row constant |x|^2 (argmin-safe)."""
    return c_sq[None, :] - 2.0 * (x @ c.T)


def _nearest(x: np.ndarray, c: np.ndarray, chunk: int = 16384) -> Tuple[np.ndarray, np.ndarray]:
    """Nearest centroid of each (prepared) row and its distance less |x|^2, in chunks."""
    c_sq = (c * c).sum(1)
    lab = np.empty(len(x), dtype=np.int64)
    dmin = np.empty(len(x), dtype=np.float32)
    for s in range(0, len(x), chunk):
        d = _sq_dists(x[s:s + chunk], c, c_sq)
        lab[s:s + chunk] = d.argmin(1)
        dmin[s:s + chunk] = d[np.arange(len(d)), lab[s:s + chunk]]
    return lab, dmin


def assign(x: np.ndarray, centroids: np.ndarray, metric: str, *, chunk: int = 65536) -> np.ndarray:
    """The nearest centroid of each row (int64), in chunks of ``chunk`` rows (``x`` may be a memmap)."""
    c = np.asarray(centroids, dtype=np.float32)
    out = np.empty(len(x), dtype=np.int64)
    for s in range(0, len(x), chunk):
        out[s:s + chunk] = _nearest(prepare(x[s:s + chunk], metric), c)[0]
    return out


def route_queries(q: np.ndarray, centroids: np.ndarray, metric: str, nprobe: int) -> np.ndarray:
    """The ``nprobe`` segments each query visits, nearest centroid first: int64 ``(nq, nprobe)``."""
    c = np.asarray(centroids, dtype=np.float32)
    d = _sq_dists(prepare(q, metric), c, (c * c).sum(1))
    if nprobe >= c.shape[0]:
        return np.argsort(d, axis=1, kind="stable").astype(np.int64)
    part = np.argpartition(d, nprobe - 1, axis=1)[:, :nprobe]
    order = np.argsort(np.take_along_axis(d, part, 1), axis=1, kind="stable")
    return np.take_along_axis(part, order, 1).astype(np.int64)


def kmeans(x: np.ndarray, k: int, metric: str, *, seed: int = 0, iters: int = 25,
           sample: int = 100_000) -> Tuple[np.ndarray, np.ndarray]:
    """Lloyd's k-means (k-means++ seeding) on up to ``sample`` rows of ``x``.

    Returns ``(centroids float32 (k, dim), rows)``: ``rows`` are the sampled row numbers. No
    cell is left empty (an empty cell takes the sampled row farthest from its centroid)."""
    rng = np.random.default_rng(seed)
    n = len(x)
    m = min(n, max(sample, 40 * k))
    rows = np.sort(rng.choice(n, size=m, replace=False)) if m < n else np.arange(n)
    s = prepare(x[rows], metric)
    # k-means++ seeding on at most 20 000 of the sampled rows.
    seed_rows = s if m <= 20_000 else s[rng.choice(m, 20_000, replace=False)]
    cent = np.empty((k, s.shape[1]), dtype=np.float32)
    cent[0] = seed_rows[rng.integers(len(seed_rows))]
    best = ((seed_rows - cent[0]) ** 2).sum(1)
    for j in range(1, k):
        total = float(best.sum())
        i = int(rng.choice(len(seed_rows), p=best / total)) if total > 0 else int(rng.integers(len(seed_rows)))
        cent[j] = seed_rows[i]
        best = np.minimum(best, ((seed_rows - cent[j]) ** 2).sum(1))
    s_sq = (s * s).sum(1)
    for _ in range(iters):
        lab, dmin = _nearest(s, cent)
        counts = np.bincount(lab, minlength=k)
        order = np.argsort(lab, kind="stable")
        nz = counts > 0
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))[nz]
        sums = np.add.reduceat(s[order].astype(np.float64), starts, axis=0)
        moved = cent.copy()
        moved[nz] = (sums / counts[nz, None]).astype(np.float32)
        far = np.argsort(-(dmin + s_sq), kind="stable")
        for j, r in zip(np.flatnonzero(~nz), far):
            moved[j] = s[r]
        if metric == "cosine":
            moved /= np.maximum(np.linalg.norm(moved, axis=1, keepdims=True), np.float32(1e-30))
        shift = float(np.abs(moved - cent).max())
        cent = moved
        if shift < 1e-6:
            break
    return cent, rows


def fill_empty(labels: np.ndarray, x: np.ndarray, centroids: np.ndarray, metric: str, rows: np.ndarray) -> None:
    """Gives every empty cell one row (in place): the sampled row nearest to its centroid among those
    whose cell holds more than one."""
    k = len(centroids)
    counts = np.bincount(labels, minlength=k)
    empty = np.flatnonzero(counts == 0)
    if empty.size == 0:
        return
    s = prepare(x[rows], metric)
    for j in empty:
        d = ((s - centroids[j]) ** 2).sum(1)
        for r in np.argsort(d, kind="stable"):
            row = rows[r]
            if counts[labels[row]] > 1:
                counts[labels[row]] -= 1
                labels[row] = j
                counts[j] = 1
                break


def calibrate_nprobe(x: np.ndarray, labels: np.ndarray, centroids: np.ndarray, metric: str, *,
                     target: float = COVERAGE_TARGET, k: int = 10, queries: int = 500,
                     base_sample: int = 200_000, seed: int = 0, threads: Optional[int] = None) -> Dict[str, Any]:
    """The default ``nprobe_segments`` of a k-means collection: the fewest nearest segments that
    hold ``target`` of the exact ``k`` nearest neighbours of sampled data rows (the neighbours are
    found among a sample of at most ``base_sample`` other rows)."""
    import nearline

    n, segs = len(x), len(centroids)
    rng = np.random.default_rng(seed + 1)
    nq = min(queries, max(1, n // 10))
    perm = rng.permutation(n)
    q_rows = np.sort(perm[:nq])
    b_rows = np.sort(perm[nq:nq + base_sample])
    coverage = [1.0] * segs
    if b_rows.size > 0 and segs > 1:
        kk = min(k, b_rows.size)
        gt, _ = nearline.compute_ground_truth(np.asarray(x[b_rows], dtype=np.float32),
                                              np.asarray(x[q_rows], dtype=np.float32), kk, metric, threads)
        owner = labels[b_rows][np.asarray(gt)]  # (nq, kk): the segment of each true neighbour
        rank = route_queries(np.asarray(x[q_rows]), centroids, metric, segs)  # (nq, segs)
        pos = np.empty_like(rank)
        np.put_along_axis(pos, rank, np.arange(segs)[None, :].repeat(len(rank), 0), 1)
        at = np.take_along_axis(pos, owner, 1)  # the probe rank at which each neighbour is reached
        coverage = [float((at < p).mean()) for p in range(1, segs + 1)]
    nprobe = next((p for p, c in enumerate(coverage, 1) if c >= target), segs)
    return {"nprobe_segments": int(nprobe), "target": target, "k": k, "queries": int(nq),
            "base_sample": int(b_rows.size), "coverage": [round(c, 5) for c in coverage],
            "rule": f"the fewest nearest segments holding {target:.0%} of the exact {k} nearest neighbours "
                    f"of {int(nq)} sampled rows (among {int(b_rows.size)} others)"}


def merge_topk(ids: np.ndarray, dists: np.ndarray, k: int, metric: str) -> Tuple[np.ndarray, np.ndarray]:
    """Top-k per row of candidate lists ``(nq, c)`` from several segments, in the metric's order
    (l2: ascending distance; ip/cosine: descending score), ties by smaller id; missing slots are
    id -1 with distance +inf (l2) or -inf (ip, cosine), as :meth:`nearline.Index.search` fills them."""
    ids = np.asarray(ids, dtype=np.int64)
    dists = np.asarray(dists, dtype=np.float32)
    nq, c = ids.shape
    fill = np.float32(np.inf if metric == "l2" else -np.inf)
    out_i = np.full((nq, k), -1, dtype=np.int64)
    out_d = np.full((nq, k), fill, dtype=np.float32)
    if c == 0 or nq == 0:
        return out_i, out_d
    valid = ids >= 0
    key = dists.astype(np.float64) if metric == "l2" else -dists.astype(np.float64)
    key = np.where(valid, key, np.inf)
    tie = np.where(valid, ids, np.iinfo(np.int64).max)
    order = np.lexsort((tie, key), axis=-1)[:, :k]
    take = min(k, c)
    got_i = np.take_along_axis(ids, order, 1)
    got_d = np.take_along_axis(dists, order, 1)
    got_ok = np.take_along_axis(valid, order, 1)
    out_i[:, :take] = np.where(got_ok, got_i, -1)
    out_d[:, :take] = np.where(got_ok, got_d, fill)
    return out_i, out_d


def split_budget(value: Any, raw_bytes: List[int]) -> Tuple[List[Optional[Any]], str]:
    """A collection's memory budget as one budget per segment, and the rule used.

    None: each segment keeps its own default. A fraction: the same fraction of each segment's raw
    vectors (so of the whole). Bytes or a size string: split in proportion to the segments' raw
    vector bytes."""
    import nearline

    if value is None:
        return [None] * len(raw_bytes), "none given: each segment's own (its build's, or 1/8 of its raw vectors)"
    if isinstance(value, (float, np.floating)) and not isinstance(value, bool):
        nearline.parse_budget(value, 1)  # range check
        return [float(value)] * len(raw_bytes), f"fraction {float(value):g} of each segment's raw vectors"
    total_raw = max(1, int(sum(raw_bytes)))
    total = nearline.parse_budget(value, total_raw)
    shares = [int(total * r // total_raw) for r in raw_bytes]
    return shares, f"{total} bytes split in proportion to the segments' raw vector bytes"
