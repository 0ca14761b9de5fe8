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
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple, Union

import numpy as np

from . import _nearline
from ._nearline import CorruptIndexError, FormatError

__all__ = [
    "build",
    "open",
    "Index",
    "Client",
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
    "plan",
    "kind_of",
    "measure_read_ceiling",
    "FormatError",
    "CorruptIndexError",
    "PRESETS",
    "EXECUTORS",
    "ENTRY_KINDS",
    "LAYOUTS",
    "SHUFFLES",
    "PAGE_SEARCHES",
    "METRICS",
    "IO_ENGINES",
    "VOCABULARY",
    "DEFAULTS",
    "__version__",
]

__version__: str = _nearline.__version__
log = logging.getLogger("nearline")

#: The API's description of itself, from the engine (the one place an option is declared):
#: ``options`` (each with its name, the calls that take it — ``stages`` —, its type, its
#: default in words, what it does, its CLI flag), ``stats`` (each per-query statistic with
#: its dtype and meaning), ``vocabulary`` and ``defaults``. The keyword checks, the
#: docstrings below, the CLI's flags, the bench's variant keys and ``nearline serve``'s
#: JSON schema are generated from it.
SCHEMA: Dict[str, Any] = json.loads(_nearline.schema())
#: Every name the engine accepts, from the engine itself (one source for the
#: API, the CLI's choice lists and the docs); ``VOCABULARY["options"][call]`` lists
#: the options of ``build``, ``open``, ``search`` and ``range_search``.
VOCABULARY: Dict[str, Any] = SCHEMA["vocabulary"]
#: The engine's defaults for options left open (per preset, and search's).
DEFAULTS: Dict[str, Any] = SCHEMA["defaults"]

#: Presets this version knows; ``"auto"`` resolves to one of the others.
PRESETS = tuple(VOCABULARY["presets"])
#: Record placements ``build(layout=...)`` accepts.
LAYOUTS = tuple(VOCABULARY["layouts"])
#: Block-shuffling algorithms ``build(shuffle=...)`` accepts (Starling).
SHUFFLES = tuple(VOCABULARY["shuffles"])
#: What a search does with an arrived page (``page_search=``).
PAGE_SEARCHES = tuple(VOCABULARY["page_searches"])
#: Search executors accepted by :meth:`Index.search` (``executor=``).
EXECUTORS = tuple(VOCABULARY["executors"])
#: I/O engines ``open`` and ``measure_read_ceiling`` accept.
IO_ENGINES = tuple(VOCABULARY["io_engines"])
#: Metrics.
METRICS = tuple(VOCABULARY["metrics"])
#: Entry-point kinds ``open(entry=...)`` accepts.
ENTRY_KINDS = tuple(VOCABULARY["entry_kinds"])

Budget = Union[int, float, str]
PathLike = Union[str, "os.PathLike[str]"]
_DTYPES = {np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.uint8), np.dtype(np.int8)}


def _document(stage: str) -> Callable[[Any], Any]:
    """Fills a docstring's ``{options}`` line with the engine's description of ``stage``'s
    options (and a ``{stats}`` line with its statistics), so the docs never restate them."""

    def render(marker: str, entries: Any, doc: str) -> str:
        lines = doc.split("\n")
        at = next((i for i, line in enumerate(lines) if line.strip() == marker), None)
        if at is None:
            return doc
        indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
        out = [textwrap.fill(text, width=96, initial_indent=indent, subsequent_indent=indent + "    ")
               for text in entries]
        return "\n".join(lines[:at] + out + lines[at + 1:])

    def deco(func: Any) -> Any:
        doc = func.__doc__ or ""
        opts = [f"{o['name']}: {o['doc']}. Default: {o['default']}."
                for o in SCHEMA["options"] if stage in o["stages"]]
        doc = render("{options}", opts, doc)
        doc = render("{stats}", [f"{x['name']}: {x['doc']}" for x in SCHEMA["stats"]], doc)
        func.__doc__ = doc
        return func

    return deco


def _api_names(spec: Dict[str, Any], call: str) -> Dict[str, Any]:
    """``spec`` with its keys spelled as the options of ``call`` (the engine's vocabulary): the
    manifest stores a few in lower case (``r``, ``build_l``)."""
    names = {o.lower(): o for o in VOCABULARY["options"][call]}
    return {names.get(k.lower(), k): v for k, v in spec.items()}


def _given(**kw: Any) -> Dict[str, Any]:
    """The options the caller gave (``None`` leaves an option to the engine's default)."""
    return {k: v for k, v in kw.items() if v is not None}


def parse_budget(value: Budget, raw_bytes: int) -> int:
    """Resolves a budget (bytes, ``"512MB"``/``"2GiB"``, or a fraction in (0, 1]) to bytes for
    data whose raw vectors take ``raw_bytes``."""
    if isinstance(value, bool):
        raise TypeError("budget must be bytes (int), a size string or a fraction, not bool")
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if not (0.0 < v <= 1.0):
            raise ValueError(
                f"budget={v} is out of range: a float budget is a fraction of the raw vector bytes in (0, 1]; "
                "give bytes as an int or a string such as '512MB'"
            )
        return int(np.floor(raw_bytes * v))
    if isinstance(value, (int, np.integer)):
        if value < 0:
            raise ValueError(f"budget={value} must not be negative")
        return int(value)
    if isinstance(value, str):
        return int(_nearline.parse_budget(value, int(raw_bytes)))
    raise TypeError(f"budget must be an int, float or str, not {type(value).__name__}")


def _check_int(name: str, value: Any, lo: int, hi: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ValueError(f"{name}={v} must be {rng}")
    return v


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


def _data_source(data: Any) -> Any:
    """A vector file's path (checked to exist) or a contiguous 2-D array."""
    if isinstance(data, (str, os.PathLike)):
        src = os.fspath(data)
        if not Path(src).exists():
            raise FileNotFoundError(f"data file {src} does not exist")
        return src
    return _as_matrix(data, "data")


def _progress_callback(progress: Any) -> Optional[Callable[[str, int, int], None]]:
    """``progress`` as a callback: a callable is used as is; True draws tqdm bars;
    None draws them when stderr is a terminal; False draws none."""
    if progress is None:
        progress = sys.stderr.isatty()
    if progress is False:
        return None
    if progress is True:
        return _TqdmProgress()
    if not callable(progress):
        raise TypeError("progress must be True, False, None or callable(stage, done, total)")
    return progress


class _TqdmProgress:
    """One tqdm bar per build stage."""

    def __init__(self) -> None:
        self.stage: Optional[str] = None
        self.bar: Any = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage != self.stage:
            self.close()
            from tqdm import tqdm

            self.stage = stage
            self.bar = tqdm(total=max(int(total), 0) or None, desc=stage, file=sys.stderr, leave=False,
                            dynamic_ncols=True)
        if self.bar is not None:
            if total and self.bar.total != total:
                self.bar.total = total
            step = int(done) - self.bar.n
            if step > 0:
                self.bar.update(step)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.bar = None
        self.stage = None

    def __del__(self) -> None:
        self.close()


@_document("build")
def build(
    data: Union[np.ndarray, PathLike],
    path: PathLike,
    *,
    metric: Optional[str] = None,
    preset: Optional[str] = None,
    ids: Optional[np.ndarray] = None,
    R: Optional[int] = None,
    build_L: Optional[int] = None,
    alpha: Optional[float] = None,
    passes: Optional[int] = None,
    saturate: Optional[bool] = None,
    pq_bytes: Optional[int] = None,
    memory_budget: Optional[Budget] = None,
    build_memory_budget: Optional[Budget] = None,
    page_size: Optional[int] = None,
    threads: Optional[int] = None,
    seed: Optional[int] = None,
    dtype: Optional[str] = None,
    progress: Union[None, bool, Callable[[str, int, int], None]] = None,
    overwrite: Optional[bool] = None,
    nav_sample: Optional[float] = None,
    entry_clusters: Optional[int] = None,
    layout: Optional[str] = None,
    shuffle: Optional[str] = None,
    bnf_iters: Optional[int] = None,
    bnf_tau: Optional[float] = None,
    bns_iters: Optional[int] = None,
    disk_budget: Union[None, int, str] = None,
    adjacency: Optional[bool] = None,
    principal_dims: Optional[int] = None,
    code_bits: Optional[int] = None,
    head_ratio: Optional[float] = None,
    replicas: Optional[int] = None,
    posting_limit: Optional[int] = None,
    merge_threshold: Optional[int] = None,
    rng_factor: Optional[float] = None,
    closure: Optional[float] = None,
    reassign_k: Optional[int] = None,
    lire: Optional[bool] = None,
    recall_target: Optional[float] = None,
    write_ratio: Optional[float] = None,
    update: Optional[str] = None,
) -> "Index":
    """Builds a disk index at ``path`` (a directory) and opens it.

    Every option left at ``None`` takes the engine's default (the preset's,
    or the planner's rule); :func:`plan` shows what a build would choose and
    why, without building. The defaults are in ``nearline.DEFAULTS``.

    Args:
        data: a 2-D numpy array (float32, float16, uint8, int8; float64 is cast to
            float32) or a path to a vector file (.fbin/.f16bin/.u8bin/.i8bin/.bin,
            .fvecs/.bvecs, .npy). Arrays are copied; files are memory-mapped and
            streamed, so data larger than memory should be passed as a file (a
            float64 .npy file is read into memory as float32).
        path: the index directory to create.
        dtype: element type of a bare ``.bin`` file.
        progress: ``True`` draws a progress bar per stage (tqdm), ``False`` none,
            ``None`` (default) draws them when stderr is a terminal; or a
            ``callable(stage, done, total)``, called from this thread.

    Options (the engine's, from ``nearline.SCHEMA``):
        {options}

    Raises:
        ValueError: bad arguments or data (NaN/inf, wrong shapes, unknown names,
            a budget below the minimum). TypeError: options of the wrong type or
            unknown options. FormatError: an input file is malformed.
        FileNotFoundError, PermissionError, OSError: file-system errors.
        KeyboardInterrupt: Ctrl-C; the build stops and leaves no index behind.
    """
    src = _data_source(data)
    opts = _given(
        metric=metric, preset=preset, ids=ids, R=R, build_L=build_L, alpha=alpha, passes=passes,
        saturate=saturate, pq_bytes=pq_bytes, memory_budget=memory_budget,
        build_memory_budget=build_memory_budget, page_size=page_size, threads=threads, seed=seed,
        overwrite=overwrite, nav_sample=nav_sample, entry_clusters=entry_clusters, layout=layout,
        shuffle=shuffle, bnf_iters=bnf_iters, bnf_tau=bnf_tau, bns_iters=bns_iters,
        disk_budget=disk_budget, adjacency=adjacency, principal_dims=principal_dims,
        code_bits=code_bits, head_ratio=head_ratio, replicas=replicas, posting_limit=posting_limit,
        merge_threshold=merge_threshold, rng_factor=rng_factor, closure=closure, reassign_k=reassign_k,
        lire=lire, recall_target=recall_target, write_ratio=write_ratio, update=update,
    )
    if ids is not None and not isinstance(ids, np.ndarray):
        opts["ids"] = np.asarray(ids)
    cb = _progress_callback(progress)
    log.info("building %s (%s)", path, ", ".join(f"{k}={v}" for k, v in opts.items() if k != "ids"))
    try:
        _nearline.build_index(src, os.fspath(path), dtype, cb, **opts)
    finally:
        if isinstance(cb, _TqdmProgress):
            cb.close()
    idx = open(path)
    info = idx.info()
    if info.get("kind") == "partition":
        log.info("built %s: partition index, %s postings", path, info["postings"])
        return idx
    lay = info["layout"]
    log.info("built %s: layout %s, OR(G) = %s", path, lay["kind"], lay.get("overlap_ratio"))
    # What the engine says the user should know about this build (a graph built
    # in shards small enough to cost recall, with the budgets that avoid it).
    for message in info.get("warnings", ()):
        warnings.warn(f"nearline.build: {message}", UserWarning, stacklevel=2)
    return idx


def plan(
    data_or_index: Union[np.ndarray, PathLike],
    *,
    dtype: Optional[str] = None,
    nq: int = 10_000,
    **options: Any,
) -> Dict[str, Any]:
    """What nearline would do, and why, without doing it.

    For a vector array or file: the build's plan (the preset and every build
    option, the PQ bytes, the memory budget's split at open, the default search)
    for ``build(data, ..., **options)``. For an index directory: the plan of
    ``open(path, **options)`` (entry points, threads, the budget's split, the
    cache) and of a batch of ``nq`` queries with default search options; the index
    is not loaded. Every choice comes with the rule that made it
    (``decisions``).

    Raises:
        ValueError: options the engine refuses (a budget below the minimum
            names the minimum). TypeError: unknown options.
    """
    if isinstance(data_or_index, (str, os.PathLike)) and Path(os.fspath(data_or_index)).is_dir():
        return json.loads(_nearline.plan_index(os.fspath(data_or_index), _check_int("nq", nq, 1), **options))
    if isinstance(data_or_index, (str, os.PathLike)):
        src = _data_source(data_or_index)
        n, dim, dt = _nearline.probe_vectors(src, dtype)
    else:
        arr = _as_matrix(data_or_index, "data")
        n, dim, dt = arr.shape[0], arr.shape[1], str(arr.dtype)
    return json.loads(_nearline.plan_build(int(n), int(dim), dt, **options))


def kind_of(path: PathLike) -> str:
    """The kind of index a directory holds (``"graph"`` or ``"partition"``), from its manifest."""
    m = Path(os.fspath(path)) / "manifest.json"
    try:
        return str(json.loads(m.read_text()).get("kind", "graph"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{os.fspath(path)}: no index manifest (manifest.json)") from None
    except (OSError, ValueError) as e:
        raise FormatError(f"{m}: not a readable index manifest: {e}") from None


@_document("open")
def open(  # noqa: A001 - mirrors the built-in on purpose: nearline.open(path)
    path: PathLike,
    *,
    memory_budget: Optional[Budget] = None,
    cache_nodes: Optional[int] = None,
    cache: Optional[str] = None,
    threads: Optional[int] = None,
    io: Optional[str] = None,
    entry_points: Optional[int] = None,
    entry: Optional[str] = None,
    nav_L: Optional[int] = None,
    nav_seeds: Optional[int] = None,
    durability: Optional[str] = None,
    read_only: Optional[bool] = None,
    background_updates: Optional[bool] = None,
    update: Optional[str] = None,
) -> "Index":
    """Opens an index directory (a graph index or a partition index).

    A partition index (preset ``"spfresh"``) replays its write-ahead log on
    open (updates acknowledged since its last checkpoint) and takes
    :meth:`Index.insert` and :meth:`Index.delete`; one process at a time may
    hold it open for writing, any number beside it with ``read_only=True``.
    The graph-only options below (cache, entry points, navigation graph) are
    refused.

    Options (the engine's, from ``nearline.SCHEMA``):
        {options}

    Raises:
        FileNotFoundError: no directory at ``path``. ValueError: bad arguments, a
            budget below the minimum, or an entry kind the index lacks (the
            message names the build option that creates it).
        CorruptIndexError: the manifest or a section fails its checksum or
            structural checks. FormatError: not an index, or written by a newer
            version.
    """
    opts = _given(memory_budget=memory_budget, cache_nodes=cache_nodes, cache=cache, threads=threads, io=io,
                  entry_points=entry_points, entry=entry, nav_L=nav_L, nav_seeds=nav_seeds,
                  durability=durability, read_only=read_only, background_updates=background_updates,
                  update=update)
    p = os.fspath(path)
    return Index(_nearline.RawIndex(p, **opts), p)


class Index:
    """An open index. Thread-safe; ``search`` releases the GIL and uses all cores."""

    def __init__(self, raw: Any, path: str) -> None:
        self._raw = raw
        self.path = path
        self._info = json.loads(raw.info())

    @property
    def kind(self) -> str:
        """``"graph"`` (a Vamana graph on disk) or ``"partition"`` (SPANN postings);
        both take inserts and deletes."""
        return str(self._info.get("kind", "graph"))

    @property
    def n(self) -> int:
        """Number of (live) vectors."""
        info = json.loads(self._raw.info())
        if self.kind == "partition":
            return int(info["n"])
        return int(info.get("updates", {}).get("live", info["n"]))

    def __len__(self) -> int:
        return self.n

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
        """The entry-point kind in use: ``"medoid"``, ``"sampled"``, ``"nav"`` or
        ``"centroids"``; ``"heads"`` for a partition index (its in-memory head graph)."""
        if self.kind == "partition":
            return "heads"
        return str(self._info["entry"]["kind"])

    @property
    def closed(self) -> bool:
        return bool(self._raw.closed)

    @_document("search")
    def search(
        self,
        queries: np.ndarray,
        k: Optional[int] = None,
        *,
        L: Optional[int] = None,
        W: Optional[int] = None,
        threads: Optional[int] = None,
        return_stats: bool = False,
        executor: Optional[str] = None,
        adaptive_beam: Optional[bool] = None,
        early_dispatch: Optional[float] = None,
        queries_in_flight: Union[None, int, str] = None,
        page_search: Optional[str] = None,
        sigma: Optional[float] = None,
        repeatable: Optional[bool] = None,
        refine_ratio: Optional[float] = None,
        filter_ratio: Optional[float] = None,
        nprobe: Optional[int] = None,
        probe_cut: Optional[float] = None,
    ) -> Union[Tuple[np.ndarray, np.ndarray], Tuple[np.ndarray, np.ndarray, Dict[str, np.ndarray]]]:
        """k-nearest-neighbour search.

        A partition index takes ``k``, ``nprobe``, ``L``, ``probe_cut``,
        ``queries_in_flight`` (default 4: each thread keeps the reads of that
        many queries in flight together) and ``threads`` (the others belong
        to graph indexes and are refused).

        Options left at ``None`` take the planner's choice (:meth:`plan_search`
        shows it and why).

        Args:
            queries: ``(nq, dim)`` or ``(dim,)`` array (converted to float32; for
                integer indexes the values must be integers in the type's range).
            return_stats: also return per-query statistics, a dict of arrays:
                {stats}

        Options (the engine's, from ``nearline.SCHEMA``):
            {options}

        Returns:
            ``(ids, distances)``: int64 ``(nq, k)`` external ids and float32
            ``(nq, k)`` values: squared L2 distances (ascending) for ``l2``, inner
            products (descending) for ``ip``, cosine similarities (descending) for
            ``cosine``. A 1-D query gives ``(k,)`` arrays.
        """
        q, single = self._queries(queries)
        opts = _given(k=k, L=L, W=W, threads=threads, executor=executor, adaptive_beam=adaptive_beam,
                      early_dispatch=early_dispatch, queries_in_flight=queries_in_flight,
                      page_search=page_search, sigma=sigma, repeatable=repeatable,
                      refine_ratio=refine_ratio, filter_ratio=filter_ratio, nprobe=nprobe,
                      probe_cut=probe_cut)
        ids, dists, stats = self._raw.search(q, bool(return_stats), **opts)
        if single:
            ids, dists = ids[0], dists[0]
        if return_stats:
            return ids, dists, stats
        return ids, dists

    def plan_search(self, nq: int = 1, **options: Any) -> Dict[str, Any]:
        """The plan a batch of ``nq`` queries with these :meth:`search` options gets,
        with the rule behind each choice (nothing is searched)."""
        return json.loads(self._raw.plan_search(_check_int("nq", nq, 1), **options))

    @_document("range_search")
    def range_search(
        self,
        queries: np.ndarray,
        radius: float,
        *,
        L: Optional[int] = None,
        W: Optional[int] = None,
        ratio: Optional[float] = None,
        max_L: Optional[int] = None,
        threads: Optional[int] = None,
        return_stats: bool = False,
        executor: Optional[str] = None,
        adaptive_beam: Optional[bool] = None,
        early_dispatch: Optional[float] = None,
        queries_in_flight: Union[None, int, str] = None,
        page_search: Optional[str] = None,
        sigma: Optional[float] = None,
        entry_cutoff: Optional[float] = None,
        repeatable: Optional[bool] = None,
        refine_ratio: Optional[float] = None,
        filter_ratio: Optional[float] = None,
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
            return_stats: also return the per-query statistics of :meth:`search`.

        Options (the engine's, from ``nearline.SCHEMA``):
            {options}

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
        opts = _given(L=L, W=W, ratio=ratio, max_L=max_L, threads=threads, executor=executor,
                      adaptive_beam=adaptive_beam, early_dispatch=early_dispatch,
                      queries_in_flight=queries_in_flight, page_search=page_search, sigma=sigma,
                      entry_cutoff=entry_cutoff, repeatable=repeatable, refine_ratio=refine_ratio,
                      filter_ratio=filter_ratio)
        lims, ids, dists, stats = self._raw.range_search(q, radius, bool(return_stats), **opts)
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

    def info(self) -> Dict[str, Any]:
        """Sizes, the memory budget's split next to what is held, the plan (with the
        rule behind each choice), I/O engine and build spec (``info()["build"]``,
        under the option names ``build`` takes: ``R``, ``build_L``, ...).

        ``info()["memory"]`` has the cache now (``cache``) and as planned
        (``cache_planned``), what searches borrowed from it (``cache_borrowed`` now,
        ``cache_borrows``, ``cache_borrowed_peak``), the workers' scratch held, reserved
        and at most (``worker_scratch``, ``worker_scratch_running``,
        ``worker_scratch_reserved``, ``worker_scratch_max``), the most the index has held
        (``peak_total``) and ``within_budget``."""
        info = json.loads(self._raw.info())
        if isinstance(info.get("build"), dict):
            info["build"] = _api_names(info["build"], "build")
        return info

    def insert(self, vectors: np.ndarray, ids: Optional[np.ndarray] = None) -> np.ndarray:
        """Inserts vectors. A partition index (preset ``"spfresh"``) places them
        in its postings (SPFresh); a graph index (every other preset) holds them in
        an in-memory delta graph searched beside the disk graph until a merge
        writes them into a new disk graph (FreshDiskANN's out-of-place updates).

        Args:
            vectors: ``(n, dim)`` or ``(dim,)`` array of floats or integers, cast
                to float32 (finite values whose squared norm float32 distances can
                hold; for ``cosine`` they are normalised). Bool, complex and
                non-numeric arrays are refused.
            ids: optional 1-D integer ids in 0..2**63, one per row, none of them
                live in the index (delete an id first to replace its vector);
                default: new ids above every id the index has seen (an insert
                that would need ids past 2**63 - 1 is refused).

        Returns:
            int64 ids of the inserted rows. When this returns, the insert is
            in the write-ahead log (durably, unless opened with
            ``durability="buffered"``) and every search finds the vectors.

        Raises:
            ValueError: a wrong shape, non-finite or oversized values, values an
                integer index cannot store, duplicate or live ids, an index opened
                ``read_only``. Nothing is inserted then.
        """
        v, ids = self._insert_args(vectors, ids)
        return self._raw.insert(v, ids)

    def validate_insert(self, vectors: np.ndarray, ids: Optional[np.ndarray] = None) -> None:
        """Checks an :meth:`insert` of these arguments without doing it: raises what
        ``insert`` would (rows and ids named by their place), returns None when it
        would succeed. Check a large file whole before inserting it in batches, so
        bad input commits nothing."""
        v, ids = self._insert_args(vectors, ids)
        self._raw.validate_insert(v, ids)

    def _insert_args(self, vectors: Any, ids: Any) -> Tuple[np.ndarray, Optional[np.ndarray]]:
        v = np.asarray(vectors)
        if v.dtype == np.bool_ or not (np.issubdtype(v.dtype, np.floating) or np.issubdtype(v.dtype, np.integer)):
            raise ValueError(f"vectors have dtype {v.dtype}; expected a float or integer array")
        if v.ndim == 1:
            v = v[None, :]
        if v.ndim != 2 or v.shape[1] != self.dim:
            raise ValueError(f"vectors must have shape (n, {self.dim}), got {np.asarray(vectors).shape}")
        v = np.ascontiguousarray(v, dtype=np.float32)
        if ids is not None:
            ids = np.asarray(ids)
            if ids.ndim == 0:
                ids = ids[None]
        return v, ids

    def delete(self, ids: Any) -> int:
        """Deletes ids; unknown ids are ignored.

        Returns how many were live. When this returns, the delete is logged and
        no search returns the ids. An empty list deletes nothing (returns 0).
        """
        a = np.asarray(ids)
        if a.ndim == 0:
            a = a[None]
        if a.size == 0 and a.ndim == 1:
            a = a.astype(np.int64)
        return int(self._raw.delete(a))

    def checkpoint(self) -> int:
        """Makes the updates so far part of the index files and trims the
        write-ahead log; returns the log sequence the index then holds. A
        partition index writes its in-memory maps; a graph index merges its
        delta and delete set into a new disk graph (FreshDiskANN's StreamingMerge:
        deletes consolidated, inserts placed, pages re-laid as a build lays them)
        that replaces the old one atomically. Opening replays only what follows."""
        return int(self._raw.checkpoint())

    def maintain(self) -> None:
        """Runs queued background work now: a partition index's splits, merges
        and reassignments (a background worker runs them otherwise); a graph
        index's merge of its updates (it also runs when the delta reaches its
        share of the memory budget)."""
        self._raw.maintain()

    def check(self) -> Dict[str, Any]:
        """Verifies the index. A partition index: every posting block decodes and
        matches its checksum, every entry names a known id, every live id has a
        current entry in some posting, no block is used twice. A graph index: every
        page block matches its checksum and decodes, every edge is in range, every
        node is reachable from the start, ids are distinct, and the updates' maps
        agree with the disk graph. Returns the report; ``report["problems"]`` is
        empty when the index is consistent."""
        return json.loads(self._raw.check())

    def ids(self) -> np.ndarray:
        """The live ids (int64, ascending)."""
        return self._raw.live_ids()

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
    """Reads a vector file (.fbin/.f16bin/.u8bin/.i8bin/.bin, .fvecs/.bvecs, .npy) into memory.

    A float64 ``.npy`` file reads as float32, as float64 arrays are cast everywhere
    else; a value beyond float32's range is a ValueError naming its row and column."""
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


# The client of `nearline serve` (standard library only), beside the local index it mirrors.
from .client import Client  # noqa: E402
