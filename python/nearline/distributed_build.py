"""The build of a collection (:func:`nearline.distributed.build`): route the rows, check every
segment's plan, build the segments as Ray tasks, write the manifest, move the collection into
place. Import it through :mod:`nearline.distributed` (which says how to install Ray)."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

import numpy as np
import ray
import ray.exceptions as _rx

import nearline
from nearline import CorruptIndexError, FormatError
from nearline.distributed_common import (CENTROIDS, FORMAT, FORMAT_VERSION, IDS_FILE, MANIFEST, check_ids, check_int,
                                         check_options, check_timeout, duplicates, write_json)
from nearline.distributed_routing import (AUTO, HASH, ROUTINGS, assign, calibrate_nprobe, fill_empty, hash_segments,
                                          kmeans, plan_routing, split_budget)
from nearline.distributed_segment import SegmentEngineError, build_segment

if TYPE_CHECKING:  # the collection this module's build opens (distributed.py imports this module)
    from nearline.distributed import Collection

log = logging.getLogger("nearline.distributed")

#: Seconds a call waits for segments that are restarting (``timeout=`` overrides it).
DEFAULT_TIMEOUT = 60.0
_MANAGED = {"ids", "memory_budget", "overwrite", "metric", "seed", "threads", "dtype"}
_BUILD_OPTIONS = frozenset(nearline.VOCABULARY["options"]["build"]) - _MANAGED
ERROR_TYPES = {"CorruptIndexError": CorruptIndexError, "FormatError": FormatError}

_build_task = ray.remote(build_segment)


def task_error(e: BaseException) -> BaseException:
    """The exception a Ray task raised, as the engine would raise it in this process."""
    c = getattr(e, "cause", None) if isinstance(e, _rx.RayTaskError) else e
    c = c if isinstance(c, BaseException) else e
    if isinstance(c, SegmentEngineError):
        return ERROR_TYPES.get(c.kind, RuntimeError)(str(c))
    return c


def ensure_ray(address: Optional[str]) -> None:
    """``ray.init(address)`` unless Ray is initialised already (an existing session is used as is)."""
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    elif address is not None:
        log.info("Ray is initialised already: address=%s is ignored", address)


def _task_cpus(segments: int, threads: Optional[int]) -> int:
    """CPUs (and build threads) per segment build: the user's ``threads``, else the cluster's CPUs
    over the segments; at most a node's CPUs."""
    nodes = [n.get("Resources", {}).get("CPU", 0) for n in ray.nodes() if n.get("Alive")]
    node_max = max([int(c) for c in nodes] + [1])
    if threads is not None:
        return max(1, min(int(threads), node_max))
    total = int(ray.cluster_resources().get("CPU", 1))
    return max(1, min(node_max, total // max(1, segments)))


def _source(data: Any, dtype: Optional[str]) -> np.ndarray:
    """An array or a memory-mapped vector file (bin and npy formats stream; the rest are read)."""
    if isinstance(data, (str, os.PathLike)):
        from nearline.datasets import read_vectors

        src = os.fspath(data)
        if not Path(src).exists():
            raise FileNotFoundError(f"data file {src} does not exist")
        arr = read_vectors(src, dtype, mmap=True)
        if arr.ndim != 2 or arr.shape[1] == 0:
            raise ValueError(f"{src}: expected (n, dim) vectors, got shape {arr.shape}")
        if arr.dtype not in (np.float32, np.float16, np.uint8, np.int8, np.float64):
            raise ValueError(f"{src} holds {arr.dtype} vectors; expected float32, float16, uint8 or int8")
        return arr
    return nearline._as_matrix(data, "data")


def _rows(data: np.ndarray, rows: np.ndarray) -> np.ndarray:
    part = np.asarray(data[rows])
    return np.ascontiguousarray(part.astype(np.float32) if part.dtype == np.float64 else part)


def build(
    data: Any,
    path: Union[str, "os.PathLike[str]"],
    *,
    segments: int = 4,
    routing: str = AUTO,
    ids: Optional[np.ndarray] = None,
    memory_budget: Any = None,
    metric: Optional[str] = None,
    seed: Optional[int] = None,
    threads: Optional[int] = None,
    dtype: Optional[str] = None,
    overwrite: bool = False,
    progress: Optional[bool] = None,
    address: Optional[str] = None,
    timeout: float = DEFAULT_TIMEOUT,
    **build_options: Any,
) -> "Collection":
    """Builds a collection of ``segments`` segments at ``path`` (a directory), each segment's index
    built by a Ray task, and opens it (:func:`open`).

    Args:
        data: an ``(n, dim)`` array, or a vector file (bin formats and ``.npy`` are memory-mapped:
            the driver reads one segment's rows at a time and hands them to its task through
            Ray's object store).
        segments: number of segments, 1..n.
        routing: ``"hash"``, ``"kmeans"`` or ``"auto"`` (the planner's choice: hash below 9
            segments or for ``ip``, else k-means; the rule and its reason are in the manifest and
            ``info()["routing"]``). k-means routing calibrates the default ``nprobe_segments``:
            the fewest nearest segments that hold 99% of the exact 10 nearest neighbours of
            sampled rows.
        ids: external ids (unique integers in 0..2**63), default 0..n-1.
        memory_budget: the collection's search memory budget: a fraction of the raw vectors (each
            segment gets the same fraction of its own), or bytes / a size string (split in
            proportion to the segments' sizes). Default: each segment's own default.
        metric, seed, threads, dtype: as :func:`nearline.build`; ``threads`` is per segment build
            (default: the cluster's CPUs over the segments), and each task reserves that many CPUs.
        overwrite: replace an existing collection at ``path`` (a directory that is not a collection
            is never replaced).
        address: the Ray cluster to join when Ray is not initialised (default: ``RAY_ADDRESS``, else
            a local one).
        timeout: passed to :func:`open`.
        **build_options: any other option of :func:`nearline.build` (``preset``, ``R``, ``build_L``,
            ...), the same for every segment.

    Raises:
        ValueError, TypeError: bad arguments (checked, with each segment's plan, before any task
            starts). FileExistsError: ``path`` exists and ``overwrite`` is false. Errors of a
            segment's build are raised as the engine raised them, with a note naming the segment.
    """
    segments = check_int("segments", segments, 1)
    if routing not in ROUTINGS:
        raise ValueError(f"unknown routing {routing!r}: expected one of {', '.join(ROUTINGS)}")
    metric = "l2" if metric is None else metric
    if metric not in nearline.METRICS:
        raise ValueError(f"unknown metric {metric!r}: expected one of {', '.join(nearline.METRICS)}")
    opts = check_options(build_options, _BUILD_OPTIONS, "build")
    timeout = check_timeout(timeout)
    seed = 0 if seed is None else check_int("seed", seed, 0)
    p = Path(os.fspath(path))
    if p.exists():
        if not overwrite:
            raise FileExistsError(f"{p} exists: pass overwrite=True to replace the collection there")
        if not (p / MANIFEST).is_file() and (not p.is_dir() or any(p.iterdir())):
            raise ValueError(f"{p} is not a nearline collection: refusing to replace it")
    x = _source(data, dtype)
    n, dim = int(x.shape[0]), int(x.shape[1])
    if n < segments:
        raise ValueError(f"segments={segments} is more than the {n} vectors: each segment needs one at least")
    ext = np.arange(n, dtype=np.int64) if ids is None else check_ids(ids, n, "ids")
    dup = duplicates(ext)
    if dup.size:
        raise ValueError(f"ids must be unique: {dup[:5].tolist()} repeat")
    kind, reason = (routing, f"given: routing={routing!r}") if routing != AUTO else plan_routing(segments, metric)
    route: Dict[str, Any] = {"kind": kind, "reason": reason}
    centroids = None
    if kind == HASH:
        labels = hash_segments(ext, segments)
        route["hash"] = "splitmix64(id) % segments"
    else:
        centroids, sample_rows = kmeans(x, segments, metric, seed=seed)
        labels = assign(x, centroids, metric)
        fill_empty(labels, x, centroids, metric, sample_rows)
        route["calibration"] = calibrate_nprobe(x, labels, centroids, metric, seed=seed, threads=threads)
        route["nprobe_segments"] = route["calibration"]["nprobe_segments"]
    counts = np.bincount(labels, minlength=segments)
    if counts.min() == 0:
        raise ValueError(f"segment {int(np.argmin(counts))} would receive no vectors: {n} vectors are too few "
                         f"for {segments} segments under {kind} routing")
    itemsize = x.dtype.itemsize if x.dtype != np.float64 else 4
    raw = [int(c) * dim * itemsize for c in counts]
    shares, budget_rule = split_budget(memory_budget, raw)
    names = [f"seg-{i:04d}" for i in range(segments)]
    dt = "float32" if x.dtype == np.float64 else str(x.dtype)
    ensure_ray(address)
    cpus = _task_cpus(segments, threads)
    seg_opts = []
    for i in range(segments):
        o = {**opts, "metric": metric, "seed": seed, "threads": cpus}
        if shares[i] is not None:
            o["memory_budget"] = shares[i]
        try:  # the engine's checks (values, budget minimums) before any task starts
            nearline._nearline.plan_build(int(counts[i]), dim, dt, **o)
        except (ValueError, TypeError) as e:
            e.add_note(f"segment {i} ({names[i]}: {int(counts[i])} vectors, memory budget share "
                       f"{shares[i]}; the collection's budget rule: {budget_rule})")
            raise
        seg_opts.append(o)
    tmp = p.parent / f".{p.name}.building-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    t0 = time.perf_counter()
    try:
        order = np.argsort(labels, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(counts)))
        refs = []
        for i in range(segments):
            rows = np.sort(order[bounds[i]:bounds[i + 1]])
            block = ray.put(_rows(x, rows))
            refs.append(_build_task.options(num_cpus=cpus, max_retries=2).remote(
                block, str((tmp / names[i]).resolve()), ext[rows], seg_opts[i]))
            del block
        results = _wait_builds(refs, names, progress)
        if centroids is not None:
            np.save(tmp / CENTROIDS, centroids)
            route["centroids_sha256"] = hashlib.sha256((tmp / CENTROIDS).read_bytes()).hexdigest()
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "created_by": f"nearline {nearline.__version__}",
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "n": n, "dim": dim, "dtype": dt, "metric": metric,
            "routing": route,
            "segments": [{"name": names[i], "n": int(counts[i]), "raw_bytes": raw[i], "preset": r["preset"],
                          "kind": r["kind"], "memory_budget": r["memory_budget"],
                          "build_seconds": round(r["seconds"], 3)} for i, r in enumerate(results)],
            "memory_budget": {"given": memory_budget if not isinstance(memory_budget, np.generic)
                              else memory_budget.item(), "rule": budget_rule},
            "build": {**{k: v for k, v in opts.items()}, "seed": seed, "threads_per_segment": cpus,
                      "seconds": round(time.perf_counter() - t0, 3)},
        }
        write_json(tmp / IDS_FILE, {"next_id": int(ext.max()) + 1})
        write_json(tmp / MANIFEST, manifest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if p.exists():
        old = p.parent / f".{p.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(p, old)
    os.replace(tmp, p)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    log.info("built collection %s: %d segments (%s routing) in %.1f s", p, segments, kind, time.perf_counter() - t0)
    from nearline.distributed import open as open_collection

    return open_collection(p, address=address, timeout=timeout)


def _wait_builds(refs: List[Any], names: List[str], progress: Optional[bool]) -> List[Dict[str, Any]]:
    bar = None
    if progress or (progress is None and sys.stderr.isatty()):
        from tqdm import tqdm

        bar = tqdm(total=len(refs), desc="segments", file=sys.stderr, leave=False)
    index = {ref: i for i, ref in enumerate(refs)}
    results: List[Any] = [None] * len(refs)
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                i = index[ref]
                try:
                    results[i] = ray.get(ref)
                except Exception as e:
                    for other in pending:
                        ray.cancel(other, force=True)
                    err = task_error(e)
                    err.add_note(f"while building segment {i} ({names[i]})")
                    raise err from None
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return results
