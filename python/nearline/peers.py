"""The systems the benchmark compares: nearline itself and its peers.

Each system is a :class:`System` with a ``build`` and an ``open`` step; the
opened handle answers ``batch(queries, k, L)`` and ``single(query, k, L)``.
These run inside the benchmark worker subprocess (``nearline._bench_worker``),
one system per process. Imports of the engine and the peers are lazy.

* ``nearline``: ``nearline.build`` / ``nearline.open`` (disk index, per-query stats).
* ``diskannpy``: ``build_disk_index`` / ``StaticDiskIndex`` with the in-RAM PQ
  bytes per vector matched to nearline's (see :func:`diskann_search_memory_gb`).
* ``faiss-hnsw``: ``faiss.IndexHNSWFlat(dim, 32)``, in memory (no reads).
* ``hnswlib``: ``hnswlib.Index`` with ``M = R/2``, in memory (no reads).

``diskannpy@T`` is diskannpy searching on ``T`` threads (same index): nearline's
batch search interleaves several queries per thread while diskannpy runs one
query per thread, so the benchmark also runs diskannpy at more threads than
nearline and compares against the best of them (see :func:`split_system`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

log = logging.getLogger(__name__)

PEERS = ("diskannpy", "faiss-hnsw", "hnswlib")
SYSTEMS = ("nearline",) + PEERS
#: Peers that search one query per thread and so may run at their own thread
#: count, as ``NAME@T`` (nearline interleaves queries within a thread instead).
THREADED_PEERS = ("diskannpy",)


def split_system(name: str) -> tuple[str, Optional[int]]:
    """``"diskannpy@4"`` -> ``("diskannpy", 4)``; ``"diskannpy"`` -> ``("diskannpy", None)``.

    Raises ``ValueError`` for an unknown system, a thread count on a peer not in
    :data:`THREADED_PEERS`, or a thread count that is not a positive integer.
    """
    base, sep, rest = str(name).partition("@")
    if base not in SYSTEMS:
        raise ValueError(f"unknown system {name!r}: expected one of {', '.join(SYSTEMS)} "
                         f"(or {', '.join(t + '@THREADS' for t in THREADED_PEERS)})")
    if not sep:
        return base, None
    if base not in THREADED_PEERS:
        raise ValueError(f"system {name!r}: only {', '.join(THREADED_PEERS)} take a thread count (NAME@THREADS)")
    if not rest.isdigit() or int(rest) < 1:
        raise ValueError(f"system {name!r}: the thread count after '@' must be a positive integer")
    return base, int(rest)

# DiskANN's get_memory_budget(): above THRESHOLD GB it reserves SPACE GB for cached nodes.
_DISKANN_CACHE_SPACE_GB = 0.25
_DISKANN_CACHE_THRESHOLD_GB = 1.0
_DISKANN_MAX_PQ_CHUNKS = 512


def diskann_pq_chunks(search_memory_gb: float, n: int, dim: int) -> int:
    """How many PQ chunks (bytes per vector) DiskANN derives from ``search_memory_maximum``.

    Mirrors DiskANN's ``build_disk_index``: the budget is passed as text with six
    decimals (``std::to_string``), 0.25 GB is reserved for cached nodes when the
    budget exceeds 1.25 GB, and ``floor(bytes / n)`` is clamped to ``[1, min(dim, 512)]``.
    """
    gb = float(f"{search_memory_gb:.6f}")
    if gb - _DISKANN_CACHE_SPACE_GB > _DISKANN_CACHE_THRESHOLD_GB:
        gb -= _DISKANN_CACHE_SPACE_GB
    chunks = int(math.floor(int(gb * 1024**3) / n))
    return max(1, min(chunks, dim, _DISKANN_MAX_PQ_CHUNKS))


def diskann_search_memory_gb(pq_bytes: int, n: int, dim: int) -> float:
    """The ``search_memory_maximum`` (GB) that makes DiskANN pick ``pq_bytes`` chunks.

    Aims at the middle of the interval ``[pq_bytes, pq_bytes + 1) * n`` bytes and
    checks the result with :func:`diskann_pq_chunks`; raises ``ValueError`` when
    six-decimal GB resolution cannot hit it (tiny ``n``) or ``pq_bytes`` is out of range.
    """
    if not 1 <= pq_bytes <= min(dim, _DISKANN_MAX_PQ_CHUNKS):
        raise ValueError(f"pq_bytes={pq_bytes}: diskannpy supports 1..min(dim={dim}, 512) PQ chunks")
    target_gb = (pq_bytes + 0.5) * n / 1024**3
    if target_gb > _DISKANN_CACHE_THRESHOLD_GB:
        target_gb += _DISKANN_CACHE_SPACE_GB
    for cand in (target_gb, math.ceil(pq_bytes * n / 1024**3 * 1e6) / 1e6):
        gb = round(cand, 6)
        if gb > 0 and diskann_pq_chunks(gb, n, dim) == pq_bytes:
            return gb
    raise ValueError(
        f"cannot express {pq_bytes} PQ bytes for n={n} as a search_memory_maximum with 1e-6 GB resolution"
    )


def pq_bytes_of_diskann_index(index_dir: Path, prefix: str = "ann") -> int:
    """Reads the PQ chunk count from ``{prefix}_pq_compressed.bin`` (int32 n, int32 chunks header)."""
    path = Path(index_dir) / f"{prefix}_pq_compressed.bin"
    hdr = np.fromfile(path, dtype="<i4", count=2)
    if hdr.size != 2:
        raise ValueError(f"{path}: missing its 8-byte header")
    return int(hdr[1])


def read_proc_io(path: str = "/proc/self/io") -> dict[str, int]:
    """Parses ``/proc/self/io`` (``rchar``, ``read_bytes``, ...) into a dict; empty if unavailable."""
    out: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                key, sep, val = line.partition(":")
                if sep:
                    try:
                        out[key.strip()] = int(val.strip())
                    except ValueError:
                        continue
    except OSError:
        return {}
    return out


def rss_bytes() -> Optional[int]:
    """Current resident set size from ``/proc/self/status`` (bytes), or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_rss_bytes() -> Optional[int]:
    """Peak RSS of this process image in bytes: ``VmHWM`` from ``/proc/self/status``.

    Falls back to ``getrusage(RUSAGE_SELF).ru_maxrss``. The latter is *not* the
    primary source because Linux carries ``ru_maxrss`` over from the parent
    across fork and execve, so a worker started by a large parent would report
    the parent's peak; ``VmHWM`` belongs to the address space created by execve.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return ru_maxrss_bytes()


def ru_maxrss_bytes() -> int:
    """``getrusage(RUSAGE_SELF).ru_maxrss`` (KiB on Linux) in bytes (inherited across fork/exec)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def as_float_for_peer(x: np.ndarray, metric: str) -> np.ndarray:
    """float32 copy for in-memory peers; cosine data normalised (so L2 order = cosine order)."""
    y = np.ascontiguousarray(x, dtype=np.float32)
    if metric == "cosine":
        y = y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-30)
    return y


@dataclasses.dataclass
class Params:
    """Build and search parameters shared by every system."""

    metric: str = "l2"
    R: int = 64
    build_L: int = 100
    alpha: float = 1.2
    pq_bytes: Optional[int] = None
    memory_budget: Any = None
    build_memory_budget: Any = None
    cache_budget: Any = 0
    threads: int = 1
    seed: int = 0
    W: int = 4
    io: str = "auto"
    #: nearline only: sampled in-memory entry points (0 = medoid, as DiskANN).
    entry_points: int = 0
    #: nearline only: entry-point kind at open (auto | medoid | sampled | nav | centroids).
    entry: str = "auto"
    #: nearline only: navigation-graph search list size and seeds (None = engine defaults).
    nav_L: Optional[int] = None
    nav_seeds: Optional[int] = None
    #: nearline only: build a navigation graph over this fraction of the vectors (0 = none).
    nav_sample: float = 0.0
    #: nearline only: build k-means centroid entry points (0 = none).
    entry_clusters: int = 0
    #: every system gets ``memory_budget`` its own way: nearline builds and
    #: opens with it; diskannpy gets it as ``search_memory_maximum`` at build
    #: (its rule turns it into PQ bytes) and a node cache for what its PQ
    #: codes and codebook leave of it at search.
    equal_budget: bool = False

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Params":
        """Builds from a dict, ignoring unknown keys."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class Handle:
    """An opened index: ``batch`` runs a whole query batch, ``single`` one query."""

    has_stats = False
    #: Whether ``single`` keeps the GIL for the whole search (Python threads then
    #: cannot overlap its calls; the latency run uses one process per client).
    holds_gil = False

    def batch(self, queries: np.ndarray, k: int, L: int) -> tuple[np.ndarray, Optional[dict[str, np.ndarray]]]:
        """Returns ``(ids (nq, k), stats or None)``."""
        raise NotImplementedError

    def single(self, query: np.ndarray, k: int, L: int) -> np.ndarray:
        """Searches one query (for latency timing); returns its ids."""
        return self.batch(query[None, :], k, L)[0][0]

    def closed_loop_batch(self, queries: np.ndarray, k: int, L: int) -> tuple[np.ndarray, Optional[dict[str, np.ndarray]]]:
        """A batch searched as ``threads`` closed-loop clients of one query each (the latency run)."""
        return self.batch(queries, k, L)

    def batch_with_distances(
        self, queries: np.ndarray, k: int, L: int
    ) -> tuple[np.ndarray, np.ndarray, Optional[dict[str, np.ndarray]]]:
        """k-NN with user-facing values (squared L2, inner product or cosine similarity):
        ``(ids (nq, k), values (nq, k), stats or None)``. Used by range search by doubling k."""
        raise ValueError(f"{type(self).__name__} does not report distances: no range search by doubling k")

    def range_batch(
        self, queries: np.ndarray, radius: float, L: int, max_L: Optional[int] = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Optional[dict[str, np.ndarray]]]:
        """Native range search: ``(lims, ids, values, stats or None)`` in CSR form; ``max_L``
        (when given) bounds the list doubling, overriding a variant's."""
        raise ValueError(f"{type(self).__name__} has no native range search")

    def memory(self) -> Optional[dict[str, Any]]:
        """The index's memory account (nearline's ``info()["memory"]``), if the system has one."""
        return None

    def close(self) -> None:
        """Releases the index."""


# --------------------------------------------------------------------------- nearline


class _NearlineHandle(Handle):
    has_stats = True

    def __init__(self, index_dir: Path, p: Params, dim: int, elem_size: int, variant: Optional[dict[str, Any]] = None):
        import nearline

        variant = variant or {}
        self.p = p
        # The same node count diskannpy caches (0 unless a cache budget is given).
        self.cache_nodes = cache_nodes_for(p.cache_budget, dim, elem_size, p.R)
        open_kw: dict[str, Any] = {"cache_nodes": self.cache_nodes, "threads": p.threads, "io": p.io,
                                   "entry_points": p.entry_points, "entry": p.entry,
                                   "nav_L": p.nav_L, "nav_seeds": p.nav_seeds}
        over = dict(variant.get("open") or {})
        if p.equal_budget and p.memory_budget is not None:
            # The budget sizes every structure, the cache included.
            open_kw["memory_budget"] = p.memory_budget
            open_kw["cache_nodes"] = None
        if "memory_budget" in over and "cache_nodes" not in over:
            open_kw["cache_nodes"] = None  # the variant's budget sizes the cache, not --cache-budget
        open_kw.update(over)
        self.cache_nodes = open_kw["cache_nodes"]
        # A variant's search options; W falls back to the shared one.
        self.search_kw: dict[str, Any] = {"W": p.W, **(variant.get("search") or {})}
        # A partition index (preset spfresh) is sized at build and searched
        # by nprobe: the sweep's values are its nprobe, graph options drop.
        self.partition = (Path(index_dir) / "manifest.json").exists() and \
            nearline.kind_of(str(index_dir)) == "partition"
        if self.partition:
            open_kw = {k: open_kw.get(k) for k in ("threads", "io", "durability")}
            self.cache_nodes = 0
            self.search_kw = {k: v for k, v in self.search_kw.items() if k in ("probe_cut", "queries_in_flight")}
        # Options of Index.range_search only (ratio, max_L).
        self.range_kw: dict[str, Any] = dict(variant.get("range") or {})
        # Options left at None take the engine's defaults (and an earlier
        # nearline, run by a python=PATH variant, may not accept None).
        self.idx = nearline.open(str(index_dir), **{k: v for k, v in open_kw.items() if v is not None})

    def _sweep(self, L: int) -> dict[str, Any]:
        """The sweep value as a search option: ``L``, or ``nprobe`` for a partition index."""
        return {"nprobe": L} if self.partition else {"L": L}

    def batch(self, queries, k, L):
        ids, _d, stats = self.idx.search(queries, k, threads=self.p.threads, return_stats=True,
                                         **self._sweep(L), **self.search_kw)
        return np.asarray(ids), {key: np.asarray(v) for key, v in stats.items()}

    def closed_loop_batch(self, queries, k, L):
        """:meth:`batch` as ``threads`` closed-loop clients with one query each: a query
        has its worker to itself (``queries_in_flight=1``) unless the variant sets it."""
        kw = {"queries_in_flight": 1, **self.search_kw}
        ids, _d, stats = self.idx.search(queries, k, threads=self.p.threads, return_stats=True,
                                         **self._sweep(L), **kw)
        return np.asarray(ids), {key: np.asarray(v) for key, v in stats.items()}

    def queries_in_flight(self) -> Any:
        """The ``queries_in_flight`` the recall batch runs with (``"auto"`` unless the variant sets it)."""
        if self.partition:
            return self.search_kw.get("queries_in_flight", 4)
        return self.search_kw.get("queries_in_flight", "auto")

    def single(self, query, k, L):
        ids, _d = self.idx.search(query[None, :], k, threads=1, **self._sweep(L), **self.search_kw)
        return np.asarray(ids)[0]

    def batch_with_distances(self, queries, k, L):
        ids, d, stats = self.idx.search(queries, k, threads=self.p.threads, return_stats=True,
                                        **self._sweep(L), **self.search_kw)
        return np.asarray(ids), np.asarray(d), {key: np.asarray(v) for key, v in stats.items()}

    def range_batch(self, queries, radius, L, max_L=None):
        fn = getattr(self.idx, "range_search", None)
        if fn is None:
            raise ValueError("this nearline build has no Index.range_search; run the k-NN doubling baseline only "
                             "(--range-methods doubling)")
        range_kw = dict(self.range_kw)
        if max_L is not None:
            range_kw["max_L"] = max_L
        lims, ids, d, stats = fn(queries, radius, L=L, threads=self.p.threads, return_stats=True, **self.search_kw,
                                 **range_kw)
        return (np.asarray(lims, dtype=np.int64), np.asarray(ids, dtype=np.int64), np.asarray(d),
                {key: np.asarray(v) for key, v in stats.items()})

    def memory(self):
        if self.partition or not hasattr(self.idx, "info"):
            return None
        return self.idx.info().get("memory")

    def close(self):
        self.idx.close()


def nearline_build_kwargs(p: Params, overrides: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The keyword arguments of ``nearline.build`` for the shared parameters ``p`` and a
    variant's build keys ``overrides``."""
    kw: dict[str, Any] = {
        "metric": p.metric, "R": p.R, "build_L": p.build_L, "alpha": p.alpha, "pq_bytes": p.pq_bytes,
        "memory_budget": p.memory_budget,
        "build_memory_budget": p.build_memory_budget, "threads": p.threads, "seed": p.seed,
        "nav_sample": p.nav_sample, "entry_clusters": p.entry_clusters,
    }
    # A navigation graph or centroid entries only when asked for: 0 leaves
    # the preset's choice (pipeann and starling build a navigation graph).
    for key in ("nav_sample", "entry_clusters"):
        if not kw.get(key):
            kw.pop(key, None)
    kw.update(overrides or {})  # a variant's build keys (R, saturate, preset, ...)
    if kw.get("preset") == "spfresh":
        # A partition index: the graph's shared build parameters do not apply
        # (the budget sizes its heads).
        for key in ("R", "build_L", "alpha", "pq_bytes", "build_memory_budget", "nav_sample", "entry_clusters"):
            if key not in (overrides or {}):
                kw.pop(key, None)
    # Options left at None take the engine's defaults (no memory budget:
    # nearline sizes one).
    return {k: v for k, v in kw.items() if v is not None}


def planned_auto_preset(base_path: Path, p: Params, overrides: Optional[dict[str, Any]] = None
                        ) -> Optional[str]:
    """The composition ``preset="auto"`` plans for this build (by the data's shape, as
    ``nearline plan`` does), or None when the build names another preset. A cached build
    is keyed by it, so one made before a change of the rules is not reused as if it were
    what ``auto`` picks now."""
    import nearline

    kw = nearline_build_kwargs(p, overrides)
    if kw.get("preset", "auto") != "auto":
        return None
    try:
        return str(nearline.plan(str(base_path), **kw)["plan"]["preset"])
    except (ValueError, TypeError):
        return None  # options the engine refuses: the build reports them


def _build_nearline(base_path: Path, index_dir: Path, p: Params, overrides: Optional[dict[str, Any]] = None
                    ) -> dict[str, Any]:
    import nearline

    kw = nearline_build_kwargs(p, overrides)
    idx = nearline.build(str(base_path), str(index_dir), overwrite=True, **kw)
    try:
        info = idx.info()
    finally:
        idx.close()
    return {"pq_bytes": int(info.get("pq_bytes") or 0) or None, "info": _jsonable(info)}


# --------------------------------------------------------------------------- diskannpy


def _diskann_metric(metric: str) -> str:
    # StaticDiskIndex does not support cosine: cosine data is normalised and searched with L2.
    return {"l2": "l2", "cosine": "l2", "ip": "mips"}[metric]


def _diskann_data(x: np.ndarray, metric: str) -> np.ndarray:
    if metric == "cosine" or x.dtype not in (np.float32, np.uint8, np.int8):
        return as_float_for_peer(x, metric)
    return np.ascontiguousarray(x)


def _diskann_input(base_path: Path, index_dir: Path, metric: str) -> tuple[str, np.dtype, int, int]:
    """A DiskANN bin file diskannpy can build from, without loading the data in this process.

    The benchmark's own ``.fbin/.u8bin/.i8bin`` files are used as they are; other
    formats, float16 and cosine data (normalised) are converted chunk by chunk
    into ``index_dir/input.fbin`` (removed after the build).
    """
    from nearline import datasets

    x = datasets.read_vectors(base_path, mmap=True)
    n, dim = x.shape
    ext = Path(base_path).suffix.lower()
    if metric != "cosine" and ext in (".fbin", ".u8bin", ".i8bin") and x.dtype in (np.float32, np.uint8, np.int8):
        return str(base_path), x.dtype, n, dim
    out = index_dir / "input.fbin"
    with open(out, "wb") as f:
        np.array([n, dim], dtype="<i4").tofile(f)
        for s in range(0, n, 65536):
            as_float_for_peer(np.asarray(x[s : s + 65536]), metric).tofile(f)
    return str(out), np.dtype(np.float32), n, dim


def _build_diskannpy(base_path: Path, index_dir: Path, p: Params, pq_bytes: int) -> dict[str, Any]:
    import diskannpy

    index_dir.mkdir(parents=True, exist_ok=True)
    path, dtype, n, dim = _diskann_input(base_path, index_dir, p.metric)
    raw = n * dim * dtype.itemsize
    search_gb = diskann_search_memory_gb(pq_bytes, n, dim)
    build_gb = _budget_gb(p.build_memory_budget, raw) or max(1.0, 4 * raw / 1024**3)
    try:
        diskannpy.build_disk_index(
            data=path,
            distance_metric=_diskann_metric(p.metric),
            index_directory=str(index_dir),
            complexity=p.build_L,
            graph_degree=p.R,
            search_memory_maximum=search_gb,
            build_memory_maximum=build_gb,
            num_threads=p.threads,
            pq_disk_bytes=0,
            vector_dtype=dtype.type,
        )
    finally:
        if path == str(index_dir / "input.fbin"):
            os.unlink(path)
    got = pq_bytes_of_diskann_index(index_dir)
    if got != pq_bytes:
        log.warning("diskannpy built %d PQ bytes per vector, wanted %d", got, pq_bytes)
    return {"pq_bytes": got, "search_memory_maximum_gb": search_gb, "build_memory_maximum_gb": build_gb}


class _DiskannHandle(Handle):
    # diskannpy 0.7.0 binds StaticDiskIndex.search without releasing the GIL.
    holds_gil = True

    def __init__(self, index_dir: Path, p: Params, dim: int, elem_size: int):
        import diskannpy

        self.p = p
        self.num_nodes_to_cache = cache_nodes_for(p.cache_budget, dim, elem_size, p.R)
        if p.equal_budget and p.memory_budget is not None:
            self.num_nodes_to_cache = diskann_cache_nodes(index_dir, p.memory_budget, dim, elem_size, p.R)
        # DiskANN's constructor hangs with num_threads=1 (loading the medoid data
        # waits for a second I/O context), so its context pool gets at least 2;
        # batch_search still runs on p.threads threads.
        self.idx = diskannpy.StaticDiskIndex(
            str(index_dir), num_threads=max(2, p.threads), num_nodes_to_cache=self.num_nodes_to_cache
        )
        self.metric = p.metric

    def _q(self, q: np.ndarray) -> np.ndarray:
        return _diskann_data(q, self.metric)

    def batch(self, queries, k, L):
        ids, _d = self.idx.batch_search(
            self._q(queries), k_neighbors=k, complexity=max(L, k), num_threads=self.p.threads, beam_width=self.p.W
        )
        return np.asarray(ids, dtype=np.int64), None

    def single(self, query, k, L):
        q = self._q(query[None, :])[0]
        ids, _d = self.idx.search(q, k_neighbors=k, complexity=max(L, k), beam_width=self.p.W)
        return np.asarray(ids, dtype=np.int64)

    def batch_with_distances(self, queries, k, L):
        if self.metric == "ip":
            # DiskANN's disk index searches ip through a rescaled MIPS-to-L2 transform
            # and reports transformed values, not inner products.
            raise ValueError("diskannpy reports no inner products for metric ip: no range search by doubling k")
        ids, d = self.idx.batch_search(
            self._q(queries), k_neighbors=k, complexity=max(L, k), num_threads=self.p.threads, beam_width=self.p.W
        )
        d = np.asarray(d, dtype=np.float32)
        if self.metric == "cosine":  # normalised vectors searched with squared L2 = 2 - 2 cos
            d = (1.0 - d / 2.0).astype(np.float32)
        return np.asarray(ids, dtype=np.int64), d, None

    def close(self):
        # DiskANN keeps per-thread I/O contexts; the worker process ends right after.
        self.idx = None


# --------------------------------------------------------------------------- faiss / hnswlib


def _build_faiss(base: np.ndarray, index_dir: Path, p: Params) -> dict[str, Any]:
    import faiss

    data = as_float_for_peer(base, p.metric)
    metric = faiss.METRIC_INNER_PRODUCT if p.metric == "ip" else faiss.METRIC_L2
    faiss.omp_set_num_threads(p.threads)
    index = faiss.IndexHNSWFlat(data.shape[1], 32, metric)
    index.hnsw.efConstruction = p.build_L
    index.add(data)
    index_dir.mkdir(parents=True, exist_ok=True)
    faiss.write_index(index, str(index_dir / "hnsw.faiss"))
    return {"M": 32}


class _FaissHandle(Handle):
    def __init__(self, index_dir: Path, p: Params):
        import faiss

        self.faiss = faiss
        self.p = p
        faiss.omp_set_num_threads(p.threads)
        self.idx = faiss.read_index(str(index_dir / "hnsw.faiss"))

    def batch(self, queries, k, L):
        self.idx.hnsw.efSearch = max(L, k)
        _d, ids = self.idx.search(as_float_for_peer(queries, self.p.metric), k)
        return ids.astype(np.int64), None

    def single(self, query, k, L):
        return self.batch(query[None, :], k, L)[0][0]


def _build_hnswlib(base: np.ndarray, index_dir: Path, p: Params) -> dict[str, Any]:
    import hnswlib

    data = as_float_for_peer(base, p.metric)
    space = {"l2": "l2", "ip": "ip", "cosine": "l2"}[p.metric]
    index = hnswlib.Index(space=space, dim=data.shape[1])
    M = max(2, p.R // 2)
    index.init_index(max_elements=data.shape[0], M=M, ef_construction=p.build_L, random_seed=p.seed)
    index.add_items(data, np.arange(data.shape[0]), num_threads=p.threads)
    index_dir.mkdir(parents=True, exist_ok=True)
    index.save_index(str(index_dir / "hnsw.bin"))
    (index_dir / "hnswlib.json").write_text(json.dumps({"space": space, "dim": int(data.shape[1])}))
    return {"M": M}


class _HnswlibHandle(Handle):
    def __init__(self, index_dir: Path, p: Params):
        import hnswlib

        meta = json.loads((index_dir / "hnswlib.json").read_text())
        self.p = p
        self.idx = hnswlib.Index(space=meta["space"], dim=meta["dim"])
        self.idx.load_index(str(index_dir / "hnsw.bin"))
        self.idx.set_num_threads(p.threads)

    def batch(self, queries, k, L):
        self.idx.set_ef(max(L, k))
        ids, _d = self.idx.knn_query(as_float_for_peer(queries, self.p.metric), k=k, num_threads=self.p.threads)
        return ids.astype(np.int64), None

    def single(self, query, k, L):
        self.idx.set_ef(max(L, k))
        ids, _d = self.idx.knn_query(as_float_for_peer(query[None, :], self.p.metric), k=k, num_threads=1)
        return ids[0].astype(np.int64)


# --------------------------------------------------------------------------- dispatch


def build_system(system: str, base_path: Path, index_dir: Path, p: Params, pq_bytes: Optional[int],
                 variant: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Builds ``system``'s index from the vector file ``base_path`` into ``index_dir``.

    Only the in-memory peers load the vectors into this process; nearline and
    diskannpy build from the file, so their peak RSS is their own. ``variant``
    (nearline only) is ``{"build": {...}}``: keyword arguments of ``nearline.build``
    that override the shared parameters.
    Returns system-specific facts (e.g. ``pq_bytes``).
    """
    from nearline import datasets

    if system == "nearline":
        return _build_nearline(Path(base_path), index_dir, p, (variant or {}).get("build"))
    if system == "diskannpy":
        if not pq_bytes:
            raise ValueError("diskannpy build needs pq_bytes (from nearline's build or --pq-bytes)")
        return _build_diskannpy(Path(base_path), index_dir, p, int(pq_bytes))
    if system == "faiss-hnsw":
        return _build_faiss(datasets.read_vectors(base_path, mmap=True), index_dir, p)
    if system == "hnswlib":
        return _build_hnswlib(datasets.read_vectors(base_path, mmap=True), index_dir, p)
    raise ValueError(f"unknown system {system!r}: expected one of {', '.join(SYSTEMS)}")


def open_system(system: str, index_dir: Path, p: Params, dim: int, elem_size: int,
                variant: Optional[dict[str, Any]] = None) -> Handle:
    """Opens ``system``'s index for searching.

    ``variant`` (nearline only) is ``{"open": {...}, "search": {...}}``: keyword
    arguments of ``nearline.open`` and ``Index.search`` that override the shared ones.
    """
    openers: dict[str, Callable[[], Handle]] = {
        "nearline": lambda: _NearlineHandle(index_dir, p, dim, elem_size, variant),
        "diskannpy": lambda: _DiskannHandle(index_dir, p, dim, elem_size),
        "faiss-hnsw": lambda: _FaissHandle(index_dir, p),
        "hnswlib": lambda: _HnswlibHandle(index_dir, p),
    }
    if system not in openers:
        raise ValueError(f"unknown system {system!r}: expected one of {', '.join(SYSTEMS)}")
    return openers[system]()


# --------------------------------------------------------------------------- helpers

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4, "tb": 1000**4, "tib": 1024**4}


def _budget_bytes(value: Any, raw_bytes: Optional[int] = None) -> Optional[int]:
    """Parses a budget like ``nearline.parse_budget`` (int bytes, "512MB", "2GiB", fraction of raw)."""
    if value is None:
        return None
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        if 0 < value <= 1 and raw_bytes is not None:
            return int(value * raw_bytes)
        return int(value)
    s = str(value).strip().lower().replace(" ", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num):]
    if unit not in _UNITS or not num:
        raise ValueError(f"budget {value!r}: expected bytes, a size like '512MB'/'2GiB', or a fraction in (0, 1]")
    x = float(num)
    if not unit and "." in num and 0 < x <= 1 and raw_bytes is not None:
        return int(x * raw_bytes)
    return int(x * _UNITS[unit])


def _budget_gb(value: Any, raw_bytes: int) -> Optional[float]:
    b = _budget_bytes(value, raw_bytes)
    return None if b is None else b / 1024**3


def diskann_pq_for_budget(budget: Any, n: int, dim: int, elem_size: int) -> int:
    """The PQ bytes diskannpy chooses for a memory budget given as its ``search_memory_maximum``."""
    b = _budget_bytes(budget, n * dim * elem_size) or 0
    return diskann_pq_chunks(b / 1024**3, n, dim)


def diskann_cache_nodes(index_dir: Path, budget: Any, dim: int, elem_size: int, R: int) -> int:
    """Nodes diskannpy's cache gets of ``budget``: what its PQ codes (n × chunks) and its
    codebook (256 centroids and the centre, float32) leave, in DiskANN's node size
    (vector + degree + R neighbour ids)."""
    path = Path(index_dir) / "ann_pq_compressed.bin"
    hdr = np.fromfile(path, dtype="<i4", count=2)
    if hdr.size != 2:
        raise ValueError(f"{path}: missing its 8-byte header")
    n, chunks = int(hdr[0]), int(hdr[1])
    b = _budget_bytes(budget, n * dim * elem_size) or 0
    left = b - n * chunks - (256 + 1) * dim * 4
    return max(0, left // (dim * elem_size + 4 + 4 * R))


def cache_nodes_for(cache_budget: Any, dim: int, elem_size: int, R: int) -> int:
    """Nodes a cache budget holds, with DiskANN's node size (vector + degree + R neighbour ids).

    Both disk systems get this same node count, so neither gets more cache.
    """
    cache = _budget_bytes(cache_budget) or 0
    return int(cache // (dim * elem_size + 4 + 4 * R)) if cache > 0 else 0


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def jsonable(x: Any) -> Any:
    """Converts NumPy values (recursively) into JSON-serialisable Python values."""
    return _jsonable(x)


def default_pq_bytes(n: int, dim: int, elem_size: int, memory_budget: Any) -> int:
    """Fallback PQ bytes when nearline's own choice is unknown: budget / n, clamped to [1, dim]."""
    raw = n * dim * elem_size
    b = _budget_bytes(memory_budget if memory_budget is not None else 0.125, raw) or raw // 8
    return max(1, min(dim, b // max(1, n)))


def env_threads(threads: Optional[int]) -> int:
    """``threads`` or the CPU count."""
    return int(threads) if threads else (os.cpu_count() or 1)
