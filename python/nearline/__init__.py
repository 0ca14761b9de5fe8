"""nearline: disk-resident approximate nearest-neighbour search.

Build an index on SSD, search it at in-memory speed::

    import numpy as np, nearline
    x = np.random.rand(10_000, 64).astype(np.float32)
    index = nearline.build(x, "my.index", metric="l2")
    ids, dists = index.search(x[:5], k=10)

See ``README.md`` and ``docs/`` for the full guide.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple, Union

import numpy as np

from . import _nearline
from ._nearline import CorruptIndexError, FormatError

__all__ = [
    "build",
    "open",
    "Index",
    "read_vectors",
    "write_vectors",
    "compute_ground_truth",
    "read_ground_truth",
    "write_ground_truth",
    "recall",
    "compute_range_ground_truth",
    "read_range_ground_truth",
    "write_range_ground_truth",
    "average_precision",
    "radius_for_mean_neighbors",
    "parse_budget",
    "measure_read_ceiling",
    "FormatError",
    "CorruptIndexError",
    "PRESETS",
    "EXECUTORS",
    "ENTRY_KINDS",
    "LAYOUTS",
    "SHUFFLES",
    "PAGE_SEARCHES",
    "__version__",
]

__version__: str = _nearline.__version__
log = logging.getLogger("nearline")

#: Presets this version knows; ``"auto"`` resolves to one of the others.
PRESETS = ("auto", "diskann", "pipeann", "starling")
#: Record placements ``build(layout=...)`` accepts.
LAYOUTS = ("id", "shuffled")
#: Block-shuffling algorithms ``build(shuffle=...)`` accepts (Starling).
SHUFFLES = ("bnp", "bnf", "bns")
#: What a search does with an arrived page (``page_search=``).
PAGE_SEARCHES = ("auto", "targets", "block")
#: Search executors accepted by :meth:`Index.search` (``executor=``).
EXECUTORS = ("auto", "beam", "pipeline")
#: I/O engines ``open`` and ``measure_read_ceiling`` accept (``io_uring`` is ``uring``).
IO_ENGINES = ("auto", "uring", "io_uring", "uring-poll", "pread")
METRICS = ("l2", "ip", "cosine")
#: Entry-point kinds ``open(entry=...)`` accepts.
ENTRY_KINDS = ("auto", "medoid", "sampled", "nav", "centroids")

Budget = Union[int, float, str]
PathLike = Union[str, "os.PathLike[str]"]
_DTYPES = {np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.uint8), np.dtype(np.int8)}


def _budget_str(value: Budget, name: str) -> str:
    """Normalises a budget (bytes, ``"512MB"``/``"2GiB"``, or a fraction in (0, 1]) to the engine's text form."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be bytes (int), a size string or a fraction, not bool")
    if isinstance(value, (int, np.integer)):
        if value < 0:
            raise ValueError(f"{name}={value} must not be negative")
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if not (0.0 < v <= 1.0):
            raise ValueError(
                f"{name}={v} is out of range: a float budget is a fraction of the raw vector bytes in (0, 1]; "
                "give bytes as an int or a string such as '512MB'"
            )
        return repr(v)
    if isinstance(value, str):
        _nearline.parse_budget(value, 0)  # validates, raises ValueError with the accepted forms
        return value
    raise TypeError(f"{name} must be an int, float or str, not {type(value).__name__}")


def parse_budget(value: Budget, raw_bytes: int) -> int:
    """Resolves a budget to bytes for data whose raw vectors take ``raw_bytes``."""
    return int(_nearline.parse_budget(_budget_str(value, "budget"), int(raw_bytes)))


def _check_int(name: str, value: Any, lo: int, hi: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ValueError(f"{name}={v} must be {rng}")
    return v


def _check_queries_in_flight(value: Any) -> int:
    """``"auto"`` (0 for the engine: the planner's choice) or an integer in 1..64."""
    if isinstance(value, str):
        if value.strip().lower() == "auto":
            return 0
        raise ValueError(f"queries_in_flight={value!r} must be 'auto' or an integer in 1..64")
    return _check_int("queries_in_flight", value, 1, 64)


def _as_matrix(data: Any, name: str) -> np.ndarray:
    arr = np.asarray(data)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (n, dim), got shape {arr.shape}")
    if arr.shape[1] == 0:
        raise ValueError(f"{name} has dimension 0")
    if arr.dtype not in _DTYPES:
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        else:
            raise ValueError(f"{name} has dtype {arr.dtype}; expected float32, float16, uint8 or int8")
    return np.ascontiguousarray(arr)


def build(
    data: Union[np.ndarray, PathLike],
    path: PathLike,
    *,
    metric: str = "l2",
    preset: str = "auto",
    ids: Optional[np.ndarray] = None,
    R: int = 64,
    build_L: int = 100,
    alpha: float = 1.2,
    passes: int = 2,
    saturate: bool = False,
    pq_bytes: Optional[int] = None,
    memory_budget: Budget = 0.125,
    build_memory_budget: Optional[Budget] = None,
    page_size: int = 4096,
    threads: Optional[int] = None,
    seed: int = 0,
    dtype: Optional[str] = None,
    progress: Optional[Callable[[str, int, int], None]] = None,
    overwrite: bool = False,
    nav_sample: float = 0.0,
    entry_clusters: int = 0,
    layout: Optional[str] = None,
    shuffle: str = "bnf",
    bnf_iters: int = 8,
    bnf_tau: float = 0.01,
    bns_iters: int = 1,
) -> "Index":
    """Builds a disk index at ``path`` (a directory) and opens it.

    Args:
        data: a 2-D numpy array (float32, float16, uint8, int8; float64 is cast to
            float32) or a path to a vector file (.fbin/.f16bin/.u8bin/.i8bin/.bin,
            .fvecs/.bvecs, .npy). Arrays are copied; files are memory-mapped and
            streamed, so data larger than memory should be passed as a file.
        path: the index directory to create.
        metric: ``"l2"`` (squared Euclidean), ``"ip"`` (inner product) or
            ``"cosine"`` (float data only; vectors are normalised).
        preset: ``"diskann"`` (DiskANN: medoid entry, synchronous beam, W 4),
            ``"pipeann"`` (PipeANN: navigation graph over 1% of the points unless
            ``nav_sample`` says otherwise, pipelined executor, width up to 32),
            ``"starling"`` (Starling: block-shuffled layout, navigation graph over
            1%, block search with σ 0.3 under the pipelined executor, width 8) or
            ``"auto"`` (today ``"diskann"``). Explicit arguments win over the
            preset's defaults.
        ids: optional external ids (one per row, unique, non-negative int64); search
            returns them instead of row numbers.
        R: maximum graph degree. build_L: build candidate list size.
        alpha: pruning parameter (≥ 1), applied in rounds as DiskANN does: α = 1
            first, then ×1.2 up to ``alpha``, so the strict rule's picks keep their
            slots. passes: Vamana passes (DiskANN: 2).
        saturate: after α-pruning, fill adjacency lists up to R with the nearest
            remaining candidates, as DiskANN's disk builds do (denser graph; off by
            default: on a 1M × 128 set it did not raise recall at a given L).
        pq_bytes: PQ code bytes per vector; by default derived from
            ``memory_budget`` as DiskANN does (floor(budget / n), at most min(dim, 512)).
        memory_budget: search memory budget: bytes, ``"512MB"`` (10^6·512),
            ``"2GiB"`` (2^31), or a float in (0, 1] = fraction of the raw vector bytes.
        build_memory_budget: memory the build may use (same forms); when data and
            graph do not fit, the build partitions the data and merges the parts.
        page_size: 4096, 8192 or 16384.
        threads: build threads (default: all cores). seed: RNG seed (builds are
            deterministic for a fixed seed and thread count).
        dtype: element type of a bare ``.bin`` file.
        progress: ``callable(stage, done, total)``, called from this thread.
        overwrite: replace an existing index at ``path``.
        nav_sample: build an in-memory navigation graph (Starling, PipeANN) over
            this fraction of the vectors, sampled uniformly, in [0, 0.5]; 0 (default)
            builds none. About 0.01 is typical: queries then start near their
            neighbours and need fewer disk reads. Opening the index holds it in
            memory (counted in the search budget).
        entry_clusters: k-means centroids (AlayaLaser: 300-500) whose nearest
            nodes are kept as entry points; 0 (default) builds none.
        layout: record placement on disk: ``"id"`` (DiskANN: node v in page
            v // records_per_page) or ``"shuffled"`` (Starling's block shuffling:
            pages hold graph neighbours together; the node→page map stays in
            memory, 8 bytes per node, counted in the budget). Default: the
            preset's (``"shuffled"`` for ``starling``). The overlap ratio OR(G) of
            the layout is logged and reported by ``info()["overlap_ratio"]``.
        shuffle: shuffling algorithm of a shuffled layout: ``"bnp"`` (neighbour
            padding, one pass), ``"bnf"`` (neighbour frequency, default) or
            ``"bns"`` (BNF then neighbour swaps; slowest).
        bnf_iters: BNF's round limit β (default 8). bnf_tau: BNF stops when a
            round gains less OR(G) than τ (default 0.01). bns_iters: BNS rounds.

    Raises:
        ValueError: bad arguments or data (NaN/inf, wrong shapes, unknown preset).
        FormatError: an input file is malformed. OSError: file-system errors.
        KeyboardInterrupt: Ctrl-C; the build stops and leaves no index behind.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}: expected one of {', '.join(METRICS)}")
    if not isinstance(preset, str):
        raise TypeError("preset must be a string")
    R = _check_int("R", R, 1, 1024)
    build_L = _check_int("build_L", build_L, 1)
    passes = _check_int("passes", passes, 1, 4)
    page_size = _check_int("page_size", page_size, 4096, 16384)
    if pq_bytes is not None:
        pq_bytes = _check_int("pq_bytes", pq_bytes, 1)
    if threads is not None:
        threads = _check_int("threads", threads, 1)
    seed = _check_int("seed", seed, 0, 2**64 - 1)
    alpha = float(alpha)
    if not np.isfinite(alpha) or alpha < 1.0:
        raise ValueError(f"alpha={alpha} must be a finite number >= 1.0")
    if isinstance(nav_sample, bool) or not isinstance(nav_sample, (int, float, np.integer, np.floating)):
        raise TypeError(f"nav_sample must be a number, not {type(nav_sample).__name__}")
    nav_sample = float(nav_sample)
    if not np.isfinite(nav_sample) or not 0.0 <= nav_sample <= 0.5:
        raise ValueError(f"nav_sample={nav_sample} must be a finite fraction in [0, 0.5] (0 = no navigation graph)")
    entry_clusters = _check_int("entry_clusters", entry_clusters, 0)
    if layout is not None:
        if not isinstance(layout, str) or layout.strip().lower() not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
        layout = layout.strip().lower()
    if not isinstance(shuffle, str) or shuffle.strip().lower() not in SHUFFLES:
        raise ValueError(f"unknown shuffle {shuffle!r}: expected one of {', '.join(SHUFFLES)}")
    shuffle = shuffle.strip().lower()
    bnf_iters = _check_int("bnf_iters", bnf_iters, 1, 1000)
    bns_iters = _check_int("bns_iters", bns_iters, 1, 1000)
    if isinstance(bnf_tau, bool) or not isinstance(bnf_tau, (int, float, np.integer, np.floating)):
        raise TypeError(f"bnf_tau must be a number, not {type(bnf_tau).__name__}")
    bnf_tau = float(bnf_tau)
    if not np.isfinite(bnf_tau) or bnf_tau < 0.0:
        raise ValueError(f"bnf_tau={bnf_tau} must be a finite number >= 0")
    if progress is not None and not callable(progress):
        raise TypeError("progress must be callable(stage, done, total)")
    ids_arr = None
    if ids is not None:
        ids_np = np.asarray(ids)
        if ids_np.ndim != 1 or not np.issubdtype(ids_np.dtype, np.integer):
            raise ValueError("ids must be a 1-D integer array")
        if ids_np.size and ids_np.min() < 0:
            raise ValueError("ids must be non-negative")
        ids_arr = np.ascontiguousarray(ids_np.astype(np.uint64))
    if isinstance(data, (str, os.PathLike)):
        src: Any = os.fspath(data)
        if not Path(src).exists():
            raise FileNotFoundError(f"data file {src} does not exist")
    else:
        src = _as_matrix(data, "data")
    mb = _budget_str(memory_budget, "memory_budget")
    bmb = None if build_memory_budget is None else _budget_str(build_memory_budget, "build_memory_budget")
    log.info("building %s (preset=%s, metric=%s, R=%d, build_L=%d)", path, preset, metric, R, build_L)
    _nearline.build_index(
        src, os.fspath(path), metric, preset, ids_arr, R, build_L, alpha, passes, pq_bytes, mb, bmb,
        page_size, threads, seed, progress, bool(overwrite), dtype, saturate=bool(saturate),
        nav_sample=nav_sample, entry_clusters=entry_clusters, layout=layout, shuffle=shuffle,
        bnf_iters=bnf_iters, bnf_tau=bnf_tau, bns_iters=bns_iters,
    )
    idx = open(path)
    lay = idx.info()["layout"]
    log.info("built %s: layout %s, OR(G) = %s", path, lay["kind"], lay.get("overlap_ratio"))
    return idx


def open(  # noqa: A001 - mirrors the built-in on purpose: nearline.open(path)
    path: PathLike,
    *,
    memory_budget: Optional[Budget] = None,
    cache_nodes: Optional[int] = None,
    threads: Optional[int] = None,
    io: str = "auto",
    entry_points: int = 0,
    entry: str = "auto",
    nav_L: Optional[int] = None,
    nav_seeds: Optional[int] = None,
) -> "Index":
    """Opens an index directory.

    Args:
        memory_budget: search memory budget (bytes, size string or fraction of the
            raw vector bytes); what the PQ codes and maps leave of it holds the
            node cache. Default: the budget the index was built with.
        cache_nodes: cache exactly this many nodes (overrides the budget's share).
        threads: default search threads (default: all cores).
        io: ``"auto"`` (io_uring, falling back to pread), ``"uring"``, ``"uring-poll"``
            or ``"pread"``; the environment variable ``NEARLINE_IO`` overrides ``auto``.
            ``"uring-poll"`` hands reads to a kernel submission thread and spins on
            the completion queue (up to 1 ms) instead of sleeping: the lowest
            per-query latency, for a busy core per search thread plus one kernel
            thread per search thread while reads flow. Never chosen by ``"auto"``.
        entry_points: hold the vectors of this many sampled nodes in memory
            (counted in the budget) and start each query from the one nearest to
            it (``entry="sampled"``, or ``"auto"`` on an index without a
            navigation graph or centroid entries).
        entry: where each query's disk search starts: ``"auto"`` (default: the
            navigation graph if the index has one, else its centroid entries,
            else sampled entries when ``entry_points > 0``, else the medoid),
            ``"medoid"`` (DiskANN), ``"sampled"``, ``"nav"`` (the ``nav_seeds``
            nearest sample nodes found in the in-memory navigation graph; needs
            ``build(nav_sample > 0)``) or ``"centroids"`` (the node nearest the
            query among the k-means centroid entries, plus the medoid; needs
            ``build(entry_clusters > 0)``). The chosen structure is loaded into
            memory and counted in the budget before the node cache is sized.
        nav_L: list size of the navigation-graph search (default 32).
        nav_seeds: navigation-graph seeds per query (default 1, at most ``nav_L``): on a
            50k x 128 set one seed gave the fewest reads and the best recall; more seeds
            make the first hops read several regions.

    Raises:
        ValueError: bad arguments, or an entry kind the index lacks (the message
            names the build option that creates it).
        CorruptIndexError: a section fails its checksum or structural checks.
    """
    mb = None if memory_budget is None else _budget_str(memory_budget, "memory_budget")
    if cache_nodes is not None:
        cache_nodes = _check_int("cache_nodes", cache_nodes, 0)
    if threads is not None:
        threads = _check_int("threads", threads, 1)
    entry_points = _check_int("entry_points", entry_points, 0, 1 << 20)
    if not isinstance(entry, str) or entry not in ENTRY_KINDS:
        raise ValueError(f"unknown entry kind {entry!r}: expected one of {', '.join(ENTRY_KINDS)}")
    if nav_L is not None:
        nav_L = _check_int("nav_L", nav_L, 1, 4096)
    if nav_seeds is not None:
        nav_seeds = _check_int("nav_seeds", nav_seeds, 1, 256)
    if io not in IO_ENGINES:
        raise ValueError(f"unknown io engine {io!r}: expected 'auto', 'uring', 'uring-poll' or 'pread'")
    p = os.fspath(path)
    if not Path(p).exists():
        raise FileNotFoundError(f"index directory {p} does not exist")
    return Index(_nearline.RawIndex(p, mb, cache_nodes, io, entry_points, entry, nav_L, nav_seeds), p, threads)


class Index:
    """An open index. Thread-safe; ``search`` releases the GIL and uses all cores."""

    def __init__(self, raw: Any, path: str, threads: Optional[int]) -> None:
        self._raw = raw
        self.path = path
        self._threads = threads
        self._info = json.loads(raw.info())

    @property
    def n(self) -> int:
        """Number of vectors."""
        return int(self._info["n"])

    @property
    def dim(self) -> int:
        """Vector dimension."""
        return int(self._info["dim"])

    @property
    def metric(self) -> str:
        """``"l2"``, ``"ip"`` or ``"cosine"``."""
        return str(self._info["metric"])

    @property
    def dtype(self) -> np.dtype:
        """Element type of the stored vectors."""
        return np.dtype(self._info["dtype"])

    @property
    def entry(self) -> str:
        """The entry-point kind in use: ``"medoid"``, ``"sampled"``, ``"nav"`` or ``"centroids"``."""
        return str(self._info["entry"]["kind"])

    @property
    def closed(self) -> bool:
        return bool(self._raw.closed)

    def search(
        self,
        queries: np.ndarray,
        k: int = 10,
        *,
        L: Optional[int] = None,
        W: Optional[int] = None,
        threads: Optional[int] = None,
        return_stats: bool = False,
        executor: str = "auto",
        adaptive_beam: bool = False,
        early_dispatch: Optional[float] = None,
        queries_in_flight: Union[int, str] = "auto",
        page_search: str = "auto",
        sigma: float = 0.3,
    ) -> Union[Tuple[np.ndarray, np.ndarray], Tuple[np.ndarray, np.ndarray, Dict[str, np.ndarray]]]:
        """k-nearest-neighbour search.

        Args:
            queries: ``(nq, dim)`` or ``(dim,)`` array (converted to float32; for
                integer indexes the values must be integers in the type's range).
            k: neighbours per query. If ``k`` exceeds the number of vectors, the
                extra columns hold id -1 and distance +inf (-inf for ip/cosine).
            L: candidate list size (default ``max(k, 100)``; larger is more accurate).
            W: beam width (1..64): reads issued per hop for the beam executor, the
                most reads in flight per query for the pipeline. Default: the
                preset's (4 for ``diskann``, 32 for ``pipeann``).
            threads: search threads (default: the index's, else all cores).
            return_stats: also return per-query statistics (a dict of arrays:
                hops, reads, bytes_read, cache_hits, pq_distances,
                exact_distances, io_wait_us, cpu_us, total_us, used_bytes,
                io_utilisation, page_records, used_records, colocated,
                path_length (Starling's ℓ), vertex_utilisation (ξ = used_records /
                page_records), doublings).
            executor: ``"beam"`` (DiskANN: W reads per hop, the next hop once the
                hop's pages are processed), ``"pipeline"`` (PipeANN: reads kept in
                flight and pages processed as they arrive, with an adaptive
                width up to W) or ``"auto"`` (the planner's rule: the pipeline
                when a block holds fewer than two records, else the beam; the
                beam whenever a beam-only option below is set).
            adaptive_beam: beam only: width ``min(2**i, W)`` at hop ``i`` (AlayaLaser).
            early_dispatch: beam only: a fraction in (0, 1]; the next hop is issued
                once this share of the current hop's pages is processed, late pages
                fold in when they arrive (AlayaLaser). ``None`` waits for the whole hop.
            queries_in_flight: queries each search thread interleaves on its I/O
                queue (1..64), or ``"auto"`` (default): 4 per thread when the
                batch has that many, else as many as it has, so a single query
                never shares its thread. Interleaving keeps the device busier and
                raises a batch's throughput; each query inside the batch then
                takes longer (its ``total_us`` includes time spent on the
                others). ``1`` gives every query its thread to itself.
            page_search: what to do with a page when it arrives: ``"targets"``
                (DiskANN: use the records it was read for), ``"block"`` (Starling's
                block search: exact distances for every record of the page, expand
                the targets and the closest ``sigma`` share of the others while the
                next reads are in flight) or ``"auto"`` (block search on a shuffled
                layout, targets on the ID layout).
            sigma: block search's pruning ratio σ in (0, 1] (Starling: 0.3).

        Returns:
            ``(ids, distances)``: int64 ``(nq, k)`` external ids and float32
            ``(nq, k)`` values: squared L2 distances (ascending) for ``l2``, inner
            products (descending) for ``ip``, cosine similarities (descending) for
            ``cosine``. A 1-D query gives ``(k,)`` arrays.
        """
        q, single = self._queries(queries)
        k = _check_int("k", k, 1)
        L = max(k, 100) if L is None else _check_int("L", L, 1)
        if L < k:
            raise ValueError(f"L={L} must be at least k={k}")
        opts = self._options(W, threads, executor, adaptive_beam, early_dispatch, queries_in_flight, page_search, sigma)
        ids, dists, stats = self._raw.search(q, k, L, *opts[:2], bool(return_stats), *opts[2:])
        if single:
            ids, dists = ids[0], dists[0]
        if return_stats:
            return ids, dists, stats
        return ids, dists

    def range_search(
        self,
        queries: np.ndarray,
        radius: float,
        *,
        L: int = 100,
        W: Optional[int] = None,
        ratio: float = 0.5,
        max_L: Optional[int] = None,
        threads: Optional[int] = None,
        return_stats: bool = False,
        executor: str = "auto",
        adaptive_beam: bool = False,
        early_dispatch: Optional[float] = None,
        queries_in_flight: Union[int, str] = "auto",
        page_search: str = "auto",
        sigma: float = 0.3,
        entry_cutoff: Optional[float] = None,
    ) -> Union[Tuple[np.ndarray, np.ndarray, np.ndarray], Tuple[np.ndarray, np.ndarray, np.ndarray, Dict[str, np.ndarray]]]:
        """Range search: every vector within ``radius`` of each query (Starling §5.3).

        The search starts with a candidate list of ``L`` and, whenever the list is
        exhausted while the results within the radius fill at least ``ratio`` (φ)
        of it, doubles the list (up to ``max_L``) and continues from where it was,
        bringing back the closest candidates that had been pushed out. Works with
        every layout, executor and page policy (the options are those of
        :meth:`search`).

        Args:
            queries: ``(nq, dim)`` or ``(dim,)`` array.
            radius: for ``l2`` a squared distance (finite, >= 0): results have
                distance <= radius; for ``ip``/``cosine`` a score (finite): results
                have score >= radius.
            L: initial candidate list size. ratio: φ in (0, 1] (default 0.5).
            max_L: the largest list the doubling may reach (default ``1024 * L``,
                capped at 2**22); a query whose answer is larger than about
                ``ratio * max_L`` is cut short there.
            entry_cutoff: ``None`` (default) or a factor ``c >= 1``: a query whose
                nearest entry point (found in memory, exact distance) lies beyond
                ``c`` times the radius ends with no results and reads no page.
                Queries far from all data are common in range workloads; this
                trades a little AP for skipping them (see docs/range-search.md).
                ``l2`` and ``cosine`` only (for cosine it scales the distance
                ``1 - radius``), and the index must start from in-memory entry
                points (a navigation graph, sampled or centroid entries).

        Returns:
            ``(lims, ids, distances)``: query ``i``'s results are
            ``ids[lims[i]:lims[i + 1]]`` (int64 external ids) with their
            distances/scores (float32), closest first; ``lims`` is int64 of
            length nq + 1. With ``return_stats`` a fourth element, as :meth:`search`.
        """
        q, _ = self._queries(queries)
        if isinstance(radius, bool) or not isinstance(radius, (int, float, np.integer, np.floating)):
            raise TypeError(f"radius must be a number, not {type(radius).__name__}")
        radius = float(radius)
        if not np.isfinite(radius):
            raise ValueError(f"radius={radius} must be finite")
        if self.metric == "l2" and radius < 0:
            raise ValueError(f"radius={radius} must be at least 0 (a squared L2 distance)")
        L = _check_int("L", L, 1)
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float, np.integer, np.floating)):
            raise TypeError(f"ratio must be a number, not {type(ratio).__name__}")
        ratio = float(ratio)
        if not (0.0 < ratio <= 1.0):
            raise ValueError(f"ratio={ratio} must be a finite fraction in (0, 1]")
        if max_L is not None:
            max_L = _check_int("max_L", max_L, L, 1 << 22)
        if entry_cutoff is not None:
            if isinstance(entry_cutoff, bool) or not isinstance(entry_cutoff, (int, float, np.integer, np.floating)):
                raise TypeError(f"entry_cutoff must be a number or None, not {type(entry_cutoff).__name__}")
            entry_cutoff = float(entry_cutoff)
            if not (np.isfinite(entry_cutoff) and entry_cutoff >= 1.0):
                raise ValueError(f"entry_cutoff={entry_cutoff} must be a finite factor of at least 1")
            if self.metric == "ip":
                raise ValueError("entry_cutoff needs a metric whose distances are not negative (l2 or cosine); "
                                 "inner-product scores have no scale to multiply")
        opts = self._options(W, threads, executor, adaptive_beam, early_dispatch, queries_in_flight, page_search, sigma)
        lims, ids, dists, stats = self._raw.range_search(
            q, radius, L, opts[0], ratio, max_L, opts[1], bool(return_stats), *opts[2:], entry_cutoff
        )
        if return_stats:
            return lims, ids, dists, stats
        return lims, ids, dists

    def _queries(self, queries: np.ndarray) -> Tuple[np.ndarray, bool]:
        q = np.asarray(queries)
        single = q.ndim == 1
        if single:
            q = q[None, :]
        if q.ndim != 2:
            raise ValueError(f"queries must be 1-D or 2-D, got shape {q.shape}")
        if q.shape[1] != self.dim:
            raise ValueError(f"queries have dimension {q.shape[1]}, the index has {self.dim}")
        if not (np.issubdtype(q.dtype, np.floating) or np.issubdtype(q.dtype, np.integer)):
            raise ValueError(f"queries have dtype {q.dtype}; expected a numeric array")
        return np.ascontiguousarray(q, dtype=np.float32), single

    def _options(self, W: Optional[int], threads: Optional[int], executor: str, adaptive_beam: bool,
                 early_dispatch: Optional[float], queries_in_flight: Union[int, str], page_search: str,
                 sigma: float) -> Tuple[Any, ...]:
        """Checks the search options shared by :meth:`search` and :meth:`range_search`."""
        W = self._raw_default_width() if W is None else _check_int("W", W, 1, 64)
        th = threads if threads is not None else self._threads
        if th is not None:
            th = _check_int("threads", th, 1)
        if not isinstance(executor, str):
            raise TypeError(f"executor must be a string, not {type(executor).__name__}")
        if executor.strip().lower() not in EXECUTORS:
            raise ValueError(f"unknown executor {executor!r}: expected one of {', '.join(EXECUTORS)}")
        if not isinstance(adaptive_beam, (bool, np.bool_)):
            raise TypeError(f"adaptive_beam must be a bool, not {type(adaptive_beam).__name__}")
        if early_dispatch is not None:
            if isinstance(early_dispatch, bool) or not isinstance(early_dispatch, (int, float, np.integer, np.floating)):
                raise TypeError(f"early_dispatch must be a number or None, not {type(early_dispatch).__name__}")
            early_dispatch = float(early_dispatch)
            if not (0.0 < early_dispatch <= 1.0):
                raise ValueError(f"early_dispatch={early_dispatch} must be a finite fraction in (0, 1]")
        qif = _check_queries_in_flight(queries_in_flight)
        if not isinstance(page_search, str) or page_search.strip().lower() not in PAGE_SEARCHES:
            raise ValueError(f"unknown page_search {page_search!r}: expected one of {', '.join(PAGE_SEARCHES)}")
        if isinstance(sigma, bool) or not isinstance(sigma, (int, float, np.integer, np.floating)):
            raise TypeError(f"sigma must be a number, not {type(sigma).__name__}")
        sigma = float(sigma)
        if not (0.0 < sigma <= 1.0):
            raise ValueError(f"sigma={sigma} must be a finite fraction in (0, 1]")
        return (W, th, executor.strip().lower(), bool(adaptive_beam), early_dispatch, qif,
                page_search.strip().lower(), sigma)

    def _raw_default_width(self) -> int:
        return int(self._raw.default_width())

    def info(self) -> Dict[str, Any]:
        """Sizes, memory accounting (every resident byte the index holds), I/O engine and build spec."""
        return json.loads(self._raw.info())

    def close(self) -> None:
        """Releases the index's memory and files. Further searches raise ValueError."""
        self._raw.close()

    def __enter__(self) -> "Index":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"n={self.n}, dim={self.dim}, metric={self.metric}"
        return f"<nearline.Index {self.path} {state}>"


def read_vectors(path: PathLike, dtype: Optional[str] = None) -> np.ndarray:
    """Reads a vector file (.fbin/.f16bin/.u8bin/.i8bin/.bin, .fvecs/.bvecs, .npy) into memory."""
    return _nearline.read_vectors(os.fspath(path), dtype)


def write_vectors(path: PathLike, data: np.ndarray) -> None:
    """Writes a 2-D array to a vector file; the extension picks the format and must match the dtype."""
    _nearline.write_vectors(os.fspath(path), _as_matrix(data, "data"))


def compute_ground_truth(
    base: np.ndarray, queries: np.ndarray, k: int, metric: str = "l2", threads: Optional[int] = None
) -> Tuple[np.ndarray, np.ndarray]:
    """Exact top-k neighbours (multi-threaded, SIMD): ``(ids int64, values float32)`` as ``search`` returns them."""
    b = _as_matrix(base, "base")
    q = _as_matrix(queries, "queries")
    if q.dtype != b.dtype:
        q = q.astype(b.dtype)
    k = _check_int("k", k, 1)
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}: expected one of {', '.join(METRICS)}")
    return _nearline.ground_truth(b, q, k, metric, threads)


def read_ground_truth(path: PathLike) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """Reads a ground-truth file (DiskANN binary format or .ivecs): ``(ids, distances or None)``."""
    return _nearline.read_ground_truth(os.fspath(path))


def write_ground_truth(path: PathLike, ids: np.ndarray, distances: np.ndarray) -> None:
    """Writes ground truth in DiskANN's binary format (int32 n, int32 k, u32 ids, f32 distances)."""
    _nearline.write_ground_truth(
        os.fspath(path), np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(distances, dtype=np.float32)
    )


def recall(found: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Mean recall@k: |found[:, :k] ∩ truth[:, :k]| / k, averaged over queries."""
    found = np.asarray(found)[:, :k]
    truth = np.asarray(truth)[:, :k]
    if found.shape[0] != truth.shape[0]:
        raise ValueError(f"found has {found.shape[0]} rows, truth has {truth.shape[0]}")
    if truth.shape[1] < k:
        raise ValueError(f"ground truth has only {truth.shape[1]} neighbours per query, k={k}")
    hits = sum(len(np.intersect1d(f[f >= 0], t)) for f, t in zip(found, truth))
    return hits / (k * found.shape[0])


def _check_metric(metric: Any) -> str:
    if not isinstance(metric, str) or metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}: expected one of {', '.join(METRICS)}")
    return metric


def _check_radius(radius: Any, metric: str) -> float:
    """A finite number; for ``l2`` (a squared distance) also >= 0. Returned as the float32 value used."""
    if isinstance(radius, bool) or not isinstance(radius, (int, float, np.integer, np.floating)):
        raise TypeError(f"radius must be a number, not {type(radius).__name__}")
    try:
        r = float(radius)
    except OverflowError:
        r = float("inf")
    if np.isfinite(r):
        with np.errstate(over="ignore"):
            r = float(np.float32(r))
    if not np.isfinite(r):
        raise ValueError(f"radius={radius} is not a finite number (as float32)")
    if metric == "l2" and r < 0:
        raise ValueError(f"radius={radius} is negative: for l2 the radius is a squared distance (>= 0)")
    return r


def compute_range_ground_truth(
    base: np.ndarray, queries: np.ndarray, radius: float, metric: str = "l2", threads: Optional[int] = None
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact range search (multi-threaded, SIMD): every base row within ``radius`` of each query.

    Within means squared L2 distance ``<= radius`` for ``l2``, inner product or
    cosine similarity ``>= radius`` for ``ip`` and ``cosine`` (the values
    :func:`compute_ground_truth` and :meth:`Index.search` report; the radius is
    used as a float32). Uses the same kernels as :func:`compute_ground_truth`.

    Args:
        base: ``(n, dim)`` array (float32, float16, uint8, int8; float64 is cast).
        queries: ``(nq, dim)`` array (cast to the base's dtype).
        radius: a finite number; ``>= 0`` for ``l2``.
        metric: ``"l2"``, ``"ip"`` or ``"cosine"``.
        threads: threads to use (default: all cores).

    Returns:
        ``(lims, ids, distances)`` in CSR form, as :meth:`Index.range_search`
        returns them: the answer of query ``i`` is ``ids[lims[i]:lims[i+1]]``
        (int64 row numbers of ``base``) with float32 ``distances``, closest first,
        ties by smaller id. ``lims`` is int64 of length ``nq + 1``.

    Raises:
        ValueError: a NaN/infinite radius, a negative ``l2`` radius, mismatched
            dimensions, or more than 2^32 - 1 results in total (the range
            ground-truth file's limit: pick a tighter radius).
    """
    metric = _check_metric(metric)
    r = _check_radius(radius, metric)
    b = _as_matrix(base, "base")
    q = _as_matrix(queries, "queries")
    if q.dtype != b.dtype:
        q = q.astype(b.dtype)
    if threads is not None:
        threads = _check_int("threads", threads, 1)
    lims, ids, d = _nearline.range_ground_truth(b, q, r, metric, threads)
    return lims, ids, d


def read_range_ground_truth(path: PathLike) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """Reads a range ground-truth file: ``(lims int64, ids int64, distances float32 or None)``.

    The layout is DiskANN's range ground truth (uint32 n, uint32 total, n uint32
    counts, total uint32 ids) followed by total float32 distances; DiskANN's
    files without distances are read too (``distances`` is then None). See
    ``docs/format.md``. Truncated or inconsistent files raise :class:`FormatError`
    naming the file.
    """
    return _nearline.read_range_ground_truth(os.fspath(path))


def _check_lims(name: str, lims: Any, ids: Any) -> Tuple[np.ndarray, np.ndarray]:
    """1-D integer ``lims`` (n + 1 offsets from 0, non-decreasing, ending at ``len(ids)``) and 1-D ``ids``."""
    lims_a = np.asarray(lims)
    ids_a = np.asarray(ids)
    if lims_a.ndim != 1 or lims_a.size == 0 or not np.issubdtype(lims_a.dtype, np.integer):
        raise ValueError(f"{name} lims must be a non-empty 1-D integer array (n + 1 offsets), got "
                         f"shape {lims_a.shape} dtype {lims_a.dtype}")
    if ids_a.ndim != 1 or not (np.issubdtype(ids_a.dtype, np.integer) or ids_a.size == 0):
        raise ValueError(f"{name} ids must be a 1-D integer array, got shape {ids_a.shape} dtype {ids_a.dtype}")
    lims_a = lims_a.astype(np.int64)
    if lims_a[0] != 0:
        raise ValueError(f"{name} lims[0] is {lims_a[0]}, expected 0")
    steps = np.diff(lims_a)
    if steps.size and steps.min() < 0:
        i = int(np.argmax(steps < 0))
        raise ValueError(f"{name} lims decreases at query {i} ({lims_a[i]} then {lims_a[i + 1]})")
    if lims_a[-1] != ids_a.size:
        raise ValueError(f"{name} lims ends at {lims_a[-1]} but there are {ids_a.size} ids")
    return lims_a, ids_a.astype(np.int64)


def write_range_ground_truth(
    path: PathLike, lims: np.ndarray, ids: np.ndarray, distances: Optional[np.ndarray] = None
) -> None:
    """Writes range ground truth (CSR ``lims``/``ids``/``distances``) in the layout
    :func:`read_range_ground_truth` reads; ``distances=None`` writes DiskANN's ids-only form."""
    lims_a, ids_a = _check_lims("range ground truth", lims, ids)
    d = None
    if distances is not None:
        d = np.ascontiguousarray(np.asarray(distances, dtype=np.float32))
        if d.ndim != 1 or d.size != ids_a.size:
            raise ValueError(f"distances has shape {d.shape}, expected ({ids_a.size},) like ids")
    _nearline.write_range_ground_truth(os.fspath(path), np.ascontiguousarray(lims_a), np.ascontiguousarray(ids_a), d)


def average_precision(lims: np.ndarray, ids: np.ndarray, gt_lims: np.ndarray, gt_ids: np.ndarray) -> float:
    """Starling's average precision (AP) of range-search results against exact ones.

    Per query, ``|R' ∩ R| / |R|`` where ``R'`` is the result (``ids[lims[i]:lims[i+1]]``;
    negative ids and duplicates are ignored) and ``R`` the exact answer
    (``gt_ids[gt_lims[i]:gt_lims[i+1]]``). A query whose exact answer is empty
    scores 1.0 when its result is empty too and 0.0 otherwise. Returns the mean
    over queries.

    Raises:
        ValueError: malformed CSR arrays, different query counts, or no queries.
    """
    lims_a, ids_a = _check_lims("result", lims, ids)
    gl, gi = _check_lims("ground-truth", gt_lims, gt_ids)
    nq = lims_a.size - 1
    if gl.size - 1 != nq:
        raise ValueError(f"results have {nq} queries, the ground truth has {gl.size - 1}")
    if nq == 0:
        raise ValueError("average precision of zero queries is undefined")
    qr = np.repeat(np.arange(nq, dtype=np.int64), np.diff(lims_a))
    qg = np.repeat(np.arange(nq, dtype=np.int64), np.diff(gl))
    keep = ids_a >= 0
    qr, ids_a = qr[keep], ids_a[keep]
    keep = gi >= 0
    qg, gi = qg[keep], gi[keep]
    m = int(max(ids_a.max(initial=0), gi.max(initial=0))) + 1
    if nq * m >= 2**62:  # keys would overflow: per query
        hits = np.zeros(nq)
        found = np.zeros(nq)
        truth = np.zeros(nq)
        for i in range(nq):
            r = np.unique(ids_a[qr == i])
            g = np.unique(gi[qg == i])
            hits[i], found[i], truth[i] = np.intersect1d(r, g, assume_unique=True).size, r.size, g.size
    else:
        kr = np.unique(qr * m + ids_a)
        kg = np.unique(qg * m + gi)
        hit = np.isin(kr, kg, assume_unique=True)
        hits = np.bincount(kr[hit] // m, minlength=nq).astype(np.float64)
        found = np.bincount(kr // m, minlength=nq)
        truth = np.bincount(kg // m, minlength=nq).astype(np.float64)
    per_query = np.where(truth > 0, hits / np.maximum(truth, 1), np.where(found == 0, 1.0, 0.0))
    return float(per_query.mean())


def radius_for_mean_neighbors(
    base: np.ndarray, queries: np.ndarray, mean_neighbors: float, metric: str = "l2", threads: Optional[int] = None
) -> float:
    """The radius at which the queries have ``mean_neighbors`` exact neighbours on average.

    With ``T = round(mean_neighbors × nq)`` (at least 1), the result is the value
    (squared L2 distance, or inner product / cosine similarity) of the ``T``-th
    closest (query, base row) pair over all queries together, found from exact
    k-NN ground truth. ``k`` starts at ``max(32, 2 × mean_neighbors)`` and
    doubles (up to ``n``) while some query's k-th neighbour is still within the
    candidate radius, since that query could have more neighbours within it than
    ``k`` shows; so no query's count is truncated.

    Ties: every pair whose value equals the radius is within it, so the mean
    count at the returned radius is ``T / nq`` exactly when no other pair ties
    the ``T``-th one, and larger by the number of pairs tied with it otherwise
    (integer data ties often). The radius is a float32 value, as the engine
    compares it.

    Raises:
        ValueError: ``mean_neighbors`` not a finite number in (0, n], no queries,
            or mismatched dimensions.
    """
    metric = _check_metric(metric)
    b = _as_matrix(base, "base")
    q = _as_matrix(queries, "queries")
    if q.dtype != b.dtype:
        q = q.astype(b.dtype)
    n, nq = b.shape[0], q.shape[0]
    if isinstance(mean_neighbors, bool) or not isinstance(mean_neighbors, (int, float, np.integer, np.floating)):
        raise TypeError(f"mean_neighbors must be a number, not {type(mean_neighbors).__name__}")
    mn = float(mean_neighbors)
    if not np.isfinite(mn) or not 0.0 < mn <= n:
        raise ValueError(f"mean_neighbors={mean_neighbors} must be a finite number in (0, n={n}]")
    if nq == 0:
        raise ValueError("radius_for_mean_neighbors needs at least one query")
    if threads is not None:
        threads = _check_int("threads", threads, 1)
    higher = metric != "l2"
    target = min(max(1, int(round(mn * nq))), n * nq)
    k = min(n, max(32, int(np.ceil(2 * mn))))
    while True:
        _ids, d = _nearline.ground_truth(b, q, k, metric, threads)
        key = -np.asarray(d, dtype=np.float64) if higher else np.asarray(d, dtype=np.float64)
        r_key = float(np.partition(key.ravel(), target - 1)[target - 1])
        if k >= n or not np.any(key[:, -1] <= r_key):
            break
        log.debug("radius_for_mean_neighbors: k=%d truncates a query at radius %g; doubling", k, r_key)
        k = min(n, 2 * k)
    return -r_key if higher else r_key


def measure_read_ceiling(
    path: PathLike,
    block_size: Optional[int] = None,
    depth: int = 32,
    seconds: float = 3.0,
    *,
    io: str = "auto",
    seed: int = 0,
) -> Dict[str, Any]:
    """Measures the disk's random-read ceiling: aligned block reads per second on ``path``.

    Keeps ``depth`` reads of ``block_size`` bytes in flight at uniformly random
    block offsets for ``seconds``, through the engine searches use (io_uring when
    it can be set up, else pread; ``io`` and ``NEARLINE_IO`` choose as for
    :func:`open`), on the file opened with O_DIRECT. ``nearline bench`` divides
    each system's achieved reads/s by this figure, measured in the same run.

    Args:
        path: a regular file of at least one block, or an index directory (its
            ``pages.bin`` is read).
        block_size: bytes per read, a positive multiple of 4096 (at most 1 MiB).
            Default: for an index directory, the size of one search read (its
            layout's block: a page, or several pages for records larger than
            one), else 4096.
        depth: reads in flight, 1..256.
        seconds: how long to keep submitting (> 0, at most 3600).
        io: ``"auto"``, ``"uring"``, ``"uring-poll"`` or ``"pread"`` (pread performs one read at a
            time, so ``depth`` is not reached; the result names the engine).
        seed: seed of the random block sequence.

    Returns:
        A dict: ``reads_per_s``, ``bytes_per_s``, ``reads``, ``bytes``,
        ``elapsed_s``, ``mean_read_latency_us`` (submission to reaping),
        ``latency_p50_us``, ``latency_p99_us``, ``latency_p999_us``,
        ``latency_max_us`` (same measure, nearest rank), ``stalls`` (spans of
        at least 10 ms with reads in flight and none completing: a stall
        delays every read in flight at once) and ``stall_s`` (their total
        length),
        ``engine`` (``"io_uring"``, ``"io_uring-poll"`` or ``"pread"``), ``direct_io`` (False where the file
        system refuses O_DIRECT: reads may then come from the page cache),
        ``depth``, ``block_size``, ``file_blocks``, ``path``.

    Raises:
        ValueError: bad arguments, or a file smaller than one block.
        OSError: the file cannot be opened or a read fails.
    """
    p = Path(os.fspath(path))
    if p.is_dir():
        manifest = p / "manifest.json"
        if not (p / "pages.bin").is_file():
            raise ValueError(f"{p} is a directory without pages.bin: expected a file or an index directory")
        if block_size is None and manifest.is_file():
            try:
                layout = json.loads(manifest.read_text())["layout"]
                block_size = int(layout.get("block_size") or layout["page_size"])
            except (KeyError, TypeError, ValueError, json.JSONDecodeError):
                block_size = None
        p = p / "pages.bin"
    if block_size is None:
        block_size = 4096
    block_size = _check_int("block_size", block_size, 4096, 1 << 20)
    if block_size % 4096:
        raise ValueError(f"block_size={block_size} must be a multiple of 4096")
    depth = _check_int("depth", depth, 1, 256)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float, np.integer, np.floating)):
        raise TypeError(f"seconds must be a number, not {type(seconds).__name__}")
    seconds = float(seconds)
    if not np.isfinite(seconds) or not 0.0 < seconds <= 3600.0:
        raise ValueError(f"seconds={seconds} must be in (0, 3600]")
    if io not in IO_ENGINES:
        raise ValueError(f"unknown io engine {io!r}: expected 'auto', 'uring', 'uring-poll' or 'pread'")
    seed = _check_int("seed", seed, 0, 2**64 - 1)
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist")
    return dict(_nearline.read_ceiling(os.fspath(p), block_size, depth, seconds, io, seed))
