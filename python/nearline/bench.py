"""``nearline bench``: nearline (and named variants of it) against diskannpy and in-memory references.

Every system builds and searches in its own subprocess (``nearline._bench_worker``):

1. **build** per system (timed, peak RSS of the worker); index directories are
   cached under ``workdir/indexes/`` keyed by the dataset and the parameters,
   and reused unless ``rebuild``. nearline builds first (variants that share
   their build keys share one build); diskannpy then gets the same in-RAM PQ
   bytes per vector.
2. **search** ``reps`` repetitions; each repetition runs every system once, in
   a rotating order (:func:`alternation_schedule`), each in a fresh process that
   opens the index, warms up and, at every L, runs the query batch (recall and
   QPS) and then a closed-loop latency run of ``latency_queries`` perturbed
   copies of the queries (:func:`perturbed_queries`). The disk ceiling
   (:func:`nearline.measure_read_ceiling` on nearline's ``pages.bin``) is one
   more entry of the rotation, so it is measured once per repetition.
3. **report** medians over repetitions, a table, ratios against the baseline
   at matched recall (:func:`interpolate_at_recall`), the disk utilisation of
   each system, the roofline (time per query in distance computation, I/O
   wait and the rest, :func:`roofline_summary`), JSON and optional plots.

**A fair peer.** nearline's batch search interleaves several queries per thread
(``queries_in_flight="auto"``: 4), diskannpy runs one query per thread. So with
``diskannpy`` in ``systems`` the bench also runs ``diskannpy@T``, the same index
searched on ``T`` threads, for ``T`` in ``peer_threads`` (default 2x and 4x the
bench's threads: 4 and 8 on a 2-core machine), in the same alternation; their
runs skip the latency run (the comparison is one of throughput). The report and
the JSON (``best_peer``) then give each nearline configuration's QPS ratio
against diskannpy at its best thread count, at each target recall, beside the
ratio at equal threads (:func:`best_peer_ratios`).

**Range mode** (``BenchConfig.radius`` or ``range_neighbors``; ``nearline bench
--radius R`` / ``--range-neighbors N``): the same builds, alternation and
medians, but every system answers the queries' range search at each L and is
scored by Starling's average precision (:func:`nearline.average_precision`)
against the exact range ground truth (computed once, cached under
``workdir/data/``). Methods: ``native`` (``Index.range_search``, nearline only)
and ``doubling`` (repeated k-NN with doubling k, :func:`knn_doubling_range`,
for nearline and diskannpy), reported as ``NAME`` and ``NAME+doubling``; ratios
are taken at matched AP (``target_aps``).
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import inspect
import json
import logging
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from nearline import datasets, peers
from nearline.bench_report import format_range_report, format_report  # noqa: F401 - re-exported
from nearline.bench_stats import (  # noqa: F401 - re-exported: nearline.bench is the bench's API
    DEFAULT_PERTURB,
    POINT_METRICS,
    TARGET_APS,
    TARGET_RECALLS,
    _ms,
    _ratio,
    _closed_loop_child,
    _qps_at,
    _roofline_point,
    add_disk_utilisation,
    alternation_schedule,
    best_peer_ratios,
    closed_loop_latency,
    interpolate_at_recall,
    knn_doubling_range,
    latency_summary,
    matched_ratios,
    median_points,
    params_key,
    perturbed_queries,
    process_closed_loop_latency,
    roofline_summary,
    single_target,
    tile_csr,
)

log = logging.getLogger(__name__)

DEFAULT_LS = (10, 20, 30, 50, 70, 100, 150, 200)
#: Range-search methods: the engine's own, and repeated k-NN with doubling k.
RANGE_METHODS = ("native", "doubling")
#: What the sweep values set for native range search (see ``BenchConfig.range_sweep``).
RANGE_SWEEPS = ("L", "max_L")
#: Suffix of a system's name in the report when it runs the doubling baseline.
DOUBLING_SUFFIX = "+doubling"
#: Peers that can answer range queries (by doubling k).
RANGE_PEERS = ("diskannpy",)
#: Name of the disk-ceiling measurement in the alternation schedule.
CEILING = "disk-ceiling"

#: Point metrics of range mode (median over repetitions).
RANGE_POINT_METRICS = (
    "ap", "qps", "wall_s", "mean_results", "mean_rounds", "max_rounds", "lat_mean_ms", "lat_p50_ms", "lat_p99_ms",
    "lat_p999_ms", "mean_reads", "mean_hops", "io_util", "proc_reads_per_query", "proc_read_bytes",
    "mean_cache_hits", "mean_bytes_read", "mean_pq_distances", "mean_exact_distances", "mean_io_wait_us",
    "mean_cpu_us", "vertex_util", "mean_path_length", "mean_doublings", "mean_dist_us", "mean_total_us",
)

#: Options the bench gives every system itself, so a variant cannot: the data's metric and
#: ids, the run's threads and seed, the budgets (``--memory-budget`` reaches the open, and the
#: build through it), the reuse of cached builds, ``k`` and the swept ``L``/``nprobe``, and the
#: update options of an index it only searches.
_BENCH_OWNS = {
    "build": {"metric", "ids", "overwrite", "threads", "seed", "memory_budget", "build_memory_budget"},
    "open": {"threads", "durability", "background_updates", "read_only", "update"},
    "search": {"k", "L", "threads", "nprobe"},
}


def _variant_keys() -> dict[str, tuple[str, ...]]:
    from . import VOCABULARY

    opts = VOCABULARY["options"]
    keys = {stage: tuple(n for n in opts[stage] if n not in _BENCH_OWNS[stage]) for stage in _BENCH_OWNS}
    keys["range"] = tuple(n for n in opts["range_search"] if n not in opts["search"])
    # The Python interpreter that runs the variant's build and searches: one with another
    # version of nearline installed (the previous release, say), so that two versions are
    # compared in the same run.
    keys["runner"] = ("python",)
    return keys


#: Which call each ``--variant`` key goes to: ``nearline.build``, ``nearline.open``, ``Index.search``
#: (and ``Index.range_search``), or ``Index.range_search`` only (``range``: range mode).
#: Keys not listed here are refused. Options the installed engine lacks are refused
#: before anything runs (:func:`check_variant_supported`).
#: Derived from the engine's schema: every option of a stage but those in ``_BENCH_OWNS``.
VARIANT_KEYS: dict[str, tuple[str, ...]] = _variant_keys()
_KEY_STAGE = {key: stage for stage, keys in VARIANT_KEYS.items() for key in keys}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_NUMBER_RE = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")


class BenchError(RuntimeError):
    """A benchmark step failed (the message names the system and the step)."""


# --------------------------------------------------------------------------- variants


@dataclasses.dataclass
class Variant:
    """A named nearline configuration: keyword overrides for build, open and search (and range search)."""

    name: str
    build: dict[str, Any] = dataclasses.field(default_factory=dict)
    open: dict[str, Any] = dataclasses.field(default_factory=dict)
    search: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: ``Index.range_search``-only keys (range mode).
    range: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: ``python``: the interpreter running this variant (another nearline version).
    runner: dict[str, Any] = dataclasses.field(default_factory=dict)

    def spec(self) -> dict[str, Any]:
        """The JSON form the worker receives (``range`` only when set)."""
        out = {"name": self.name, "build": dict(self.build), "open": dict(self.open), "search": dict(self.search)}
        if self.range:
            out["range"] = dict(self.range)
        return out


def parse_variant_value(text: str) -> Any:
    """A variant value: int, float, bool (true/false, yes/no, on/off), None (none/null) or the string itself."""
    t = text.strip()
    low = t.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("none", "null"):
        return None
    if _NUMBER_RE.match(t):
        if re.match(r"^[+-]?\d+$", t):
            return int(t)
        return float(t)
    return t


def parse_variant(text: str, reserved: Sequence[str] = ()) -> Variant:
    """Parses ``NAME:key=value[,key=value...]`` (``NAME`` alone = nearline's defaults).

    Each key is routed to build, open or search by :data:`VARIANT_KEYS`; values
    go through :func:`parse_variant_value`. Raises ``ValueError`` naming the
    problem: a bad or reserved name, a missing ``=``, an empty value, a repeated
    or unknown key (with the close matches and every accepted key).
    """
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not _NAME_RE.match(name):
        raise ValueError(f"variant {text!r}: expected NAME:key=value[,key=value...] with NAME made of letters, "
                         "digits and _.+- (starting with a letter or digit)")
    if name in reserved:
        raise ValueError(f"variant name {name!r} is taken (reserved: {', '.join(reserved)})")
    v = Variant(name)
    seen: set[str] = set()
    for item in rest.split(",") if sep else []:
        item = item.strip()
        if not item:
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq:
            raise ValueError(f"variant {name!r}: {item!r} is not key=value")
        if not value.strip():
            raise ValueError(f"variant {name!r}: key {key!r} has an empty value")
        if key in seen:
            raise ValueError(f"variant {name!r}: key {key!r} given twice")
        stage = _KEY_STAGE.get(key)
        if stage is None:
            close = difflib.get_close_matches(key, list(_KEY_STAGE), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            accepted = "; ".join(f"{st}: {', '.join(keys)}" for st, keys in VARIANT_KEYS.items())
            raise ValueError(f"variant {name!r}: unknown key {key!r}{hint}; accepted keys are {accepted}")
        seen.add(key)
        getattr(v, stage)[key] = parse_variant_value(value)
    return v


def _accepted_params(fn: Callable[..., Any]) -> Optional[set[str]]:
    """Keyword names ``fn`` accepts, or None when it takes ``**kwargs`` (anything goes)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return {n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def check_variant_supported(variant: Variant, api: Any = None) -> None:
    """Raises ``ValueError`` when the installed engine lacks one of ``variant``'s options.

    ``api`` is the ``nearline`` module (imported when None). Checked against the
    signatures of ``nearline.build``, ``nearline.open`` and ``Index.search`` so a
    run fails before its builds, not after them.
    """
    if api is None:
        import nearline as api
    index_cls = getattr(api, "Index", None)
    fns = {"build": getattr(api, "build", None), "open": getattr(api, "open", None),
           "search": getattr(index_cls, "search", None), "range": getattr(index_cls, "range_search", None)}
    where = {"build": "nearline.build", "open": "nearline.open", "search": "Index.search",
             "range": "Index.range_search"}
    for stage in ("build", "open", "search", "range"):
        fn = fns[stage]
        accepted = _accepted_params(fn) if fn is not None else None
        if accepted is None:
            continue
        missing = [k for k in getattr(variant, stage) if k not in accepted]
        if missing:
            raise ValueError(f"variant {variant.name!r}: {where[stage]} of this nearline build does not take "
                             f"{', '.join(repr(m) for m in missing)}")


@dataclasses.dataclass
class BenchConfig:
    """Everything ``nearline bench`` needs; mirrors the CLI options."""

    data: str
    systems: list[str] = dataclasses.field(default_factory=lambda: ["nearline", "diskannpy"])
    variants: list[Variant] = dataclasses.field(default_factory=list)
    baseline: Optional[str] = None
    target_recalls: list[float] = dataclasses.field(default_factory=lambda: list(TARGET_RECALLS))
    Ls: list[int] = dataclasses.field(default_factory=lambda: list(DEFAULT_LS))
    #: The sweep of partition-index variants (preset spfresh): postings read
    #: per query; empty: the L sweep's values.
    nprobes: list[int] = dataclasses.field(default_factory=list)
    k: int = 10
    R: int = 64
    build_L: int = 100
    alpha: float = 1.2
    pq_bytes: Optional[int] = None
    memory_budget: Any = None
    #: Give every system ``memory_budget`` (see :class:`peers.Params`).
    equal_budget: bool = False
    build_memory_budget: Any = None
    cache_budget: Any = 0
    entry_points: int = 0
    entry: str = "auto"
    nav_L: Optional[int] = None
    nav_seeds: Optional[int] = None
    nav_sample: float = 0.0
    entry_clusters: int = 0
    threads: Optional[int] = None
    W: int = 4
    reps: int = 3
    seed: int = 0
    workdir: Path = dataclasses.field(default_factory=datasets.default_workdir)
    out: Optional[Path] = None
    plot: Optional[Path] = None
    queries_repeat: int = 1
    rebuild: bool = False
    warmup: int = 100
    latency_queries: int = 10000
    perturb: float = DEFAULT_PERTURB
    ceiling: bool = True
    ceiling_depth: int = 32
    ceiling_seconds: float = 3.0
    timeout_s: Optional[float] = None
    #: Extra thread counts at which each peer of ``peers.THREADED_PEERS`` in
    #: ``systems`` also runs (as ``NAME@T``); None: 2x and 4x the bench's threads;
    #: [] : none. k-NN mode only.
    peer_threads: Optional[list[int]] = None
    #: Range mode: the radius (squared L2 distance, or inner product / cosine similarity score).
    radius: Optional[float] = None
    #: Range mode: pick the radius giving this mean number of exact neighbours per query.
    range_neighbors: Optional[float] = None
    target_aps: list[float] = dataclasses.field(default_factory=lambda: list(TARGET_APS))
    range_methods: list[str] = dataclasses.field(default_factory=lambda: list(RANGE_METHODS))
    #: First k of the doubling baseline (each round searches with L = max(L, k)); None: k0 = the sweep's L.
    doubling_k0: Optional[int] = 10
    #: What the sweep's values set for native range search: ``"L"`` (the list
    #: size it starts with; the doubling may go to ``max_L``, default 1024 L) or
    #: ``"max_L"`` (how far the doubling may go, starting from
    #: ``min(range_start_L, value)``): the native search's cost knob. The
    #: doubling baseline always sweeps its k-NN list size L.
    range_sweep: str = "L"
    #: The native search's first list size when ``range_sweep == "max_L"``.
    range_start_L: int = 10

    @property
    def range_mode(self) -> bool:
        """Whether this is a range-search benchmark."""
        return self.radius is not None or self.range_neighbors is not None

    def range_entries(self) -> list[tuple[str, str, str, Optional[Variant]]]:
        """Range mode's systems in run order: ``(name, system, method, variant)``.

        Each nearline configuration runs ``native`` as ``NAME`` and ``doubling``
        as ``NAME+doubling`` (as ``range_methods`` asks); each peer runs doubling.
        """
        out: list[tuple[str, str, str, Optional[Variant]]] = []
        for v in self.nearline_variants():
            if "native" in self.range_methods:
                out.append((v.name, "nearline", "native", v))
            if "doubling" in self.range_methods:
                out.append((v.name + DOUBLING_SUFFIX, "nearline", "doubling", v))
        for s in self.systems:
            if s != "nearline":
                out.append((s + DOUBLING_SUFFIX, s, "doubling", None))
        return out

    def params(self) -> peers.Params:
        """The shared build/search parameters."""
        return peers.Params(
            metric="l2", R=self.R, build_L=self.build_L, alpha=self.alpha, pq_bytes=self.pq_bytes,
            memory_budget=self.memory_budget, build_memory_budget=self.build_memory_budget,
            cache_budget=self.cache_budget, threads=peers.env_threads(self.threads), seed=self.seed, W=self.W,
            # Explicit values, not None: a python=PATH variant's earlier
            # nearline may not take None for "the default".
            entry_points=self.entry_points or 0, entry=self.entry or "auto", nav_L=self.nav_L,
            nav_seeds=self.nav_seeds, nav_sample=self.nav_sample or 0.0,
            entry_clusters=self.entry_clusters or 0, equal_budget=self.equal_budget,
        )

    def nearline_variants(self) -> list[Variant]:
        """Every nearline configuration to run: the plain ``nearline`` system (if listed) then the variants."""
        plain = [Variant("nearline")] if "nearline" in self.systems else []
        return plain + [v if isinstance(v, Variant) else parse_variant(str(v)) for v in self.variants]

    def all_systems(self) -> list[str]:
        """System names in run order: nearline configurations first, then the peers as listed, then the
        extra thread counts of thread-scalable peers (:meth:`peer_thread_systems`)."""
        return ([v.name for v in self.nearline_variants()] + [s for s in self.systems if s != "nearline"]
                + self.peer_thread_systems())

    def peer_thread_counts(self) -> list[int]:
        """``peer_threads``, or by default 2x and 4x the bench's threads."""
        if self.peer_threads is not None:
            return [int(x) for x in self.peer_threads]
        base = peers.env_threads(self.threads)
        return [2 * base, 4 * base]

    def peer_thread_systems(self) -> list[str]:
        """``NAME@T`` for each listed peer of ``peers.THREADED_PEERS`` and each extra thread count
        (not the bench's own, not one listed already); none in range mode."""
        if self.range_mode:
            return []
        base = peers.env_threads(self.threads)
        out: list[str] = []
        for s in self.systems:
            if s not in peers.THREADED_PEERS:
                continue
            for n in self.peer_thread_counts():
                name = f"{s}@{n}"
                if n != base and name not in self.systems and name not in out:
                    out.append(name)
        return out

    def baseline_system(self) -> str:
        """``baseline`` if set, else the first peer, else the first system.

        In range mode: else the first peer's doubling run, else the first
        doubling run, else the first entry.
        """
        if self.baseline is not None:
            return self.baseline
        if self.range_mode:
            names = [e[0] for e in self.range_entries()]
            peer = next((e[0] for e in self.range_entries() if e[1] in peers.PEERS), None)
            doubling = next((e[0] for e in self.range_entries() if e[2] == "doubling"), None)
            return peer or doubling or names[0]
        names = self.all_systems()
        peer = next((s for s in names if s in peers.PEERS), None)
        return peer if peer is not None else names[0]

    def validate(self) -> None:
        """Checks the options that do not need the data; raises ``ValueError`` naming the option."""
        if self.k <= 0:
            raise ValueError(f"--k must be positive, got {self.k}")
        for s in self.systems:
            peers.split_system(s)  # ValueError naming an unknown system or a bad NAME@THREADS
        if self.peer_threads is not None and any(
                isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.peer_threads):
            raise ValueError(f"--peer-threads {self.peer_threads}: expected positive integers")
        names = self.all_systems()
        if not names:
            raise ValueError("nothing to benchmark: no nearline system, variant or peer")
        reserved = set(peers.SYSTEMS) | {CEILING}
        seen: set[str] = set()
        for v in self.nearline_variants():
            if v.name in seen:
                raise ValueError(f"system name {v.name!r} given twice")
            if v.name != "nearline" and v.name in reserved:
                raise ValueError(f"variant name {v.name!r} is taken (reserved: {', '.join(sorted(reserved))})")
            if v.range and not self.range_mode:
                raise ValueError(f"variant {v.name!r}: {', '.join(v.range)} apply to range search only "
                                 "(--radius or --range-neighbors)")
            seen.add(v.name)
        if self.range_mode:
            self._validate_range(reserved)
            names = [e[0] for e in self.range_entries()]
        if self.baseline is not None and self.baseline not in names:
            raise ValueError(f"--baseline {self.baseline!r} is not one of the systems: {', '.join(names)}")
        for t in self.target_recalls:
            if not 0.0 < float(t) <= 1.0:
                raise ValueError(f"--target-recall {t}: expected a recall in (0, 1]")
        if self.reps < 1:
            raise ValueError(f"--reps must be at least 1, got {self.reps}")
        if self.latency_queries < 0:
            raise ValueError(f"--latency-queries must be >= 0, got {self.latency_queries}")
        if not (np.isfinite(self.perturb) and self.perturb >= 0):
            raise ValueError(f"--perturb must be a finite number >= 0, got {self.perturb}")
        if not 1 <= self.ceiling_depth <= 256:
            raise ValueError(f"--ceiling-depth must be in 1..256, got {self.ceiling_depth}")
        if not (np.isfinite(self.ceiling_seconds) and 0 < self.ceiling_seconds <= 3600):
            raise ValueError(f"--ceiling-seconds must be in (0, 3600], got {self.ceiling_seconds}")

    def _validate_range(self, reserved: set[str]) -> None:
        if self.radius is not None and self.range_neighbors is not None:
            raise ValueError("--radius and --range-neighbors are exclusive: give the radius or how to pick it")
        if self.radius is not None:
            if isinstance(self.radius, bool) or not np.isfinite(float(self.radius)):
                raise ValueError(f"--radius must be a finite number, got {self.radius}")
        if self.range_neighbors is not None:
            if not (np.isfinite(float(self.range_neighbors)) and float(self.range_neighbors) > 0):
                raise ValueError(f"--range-neighbors must be a positive number, got {self.range_neighbors}")
        if not self.range_methods or any(m not in RANGE_METHODS for m in self.range_methods):
            raise ValueError(f"--range-methods {','.join(self.range_methods)}: expected some of "
                             f"{', '.join(RANGE_METHODS)}")
        if len(set(self.range_methods)) != len(self.range_methods):
            raise ValueError(f"--range-methods {','.join(self.range_methods)}: a method is given twice")
        if self.doubling_k0 is not None and self.doubling_k0 < 1:
            raise ValueError(f"--doubling-k0 must be at least 1 (or L), got {self.doubling_k0}")
        if self.range_sweep not in RANGE_SWEEPS:
            raise ValueError(f"--range-sweep {self.range_sweep!r}: expected one of {', '.join(RANGE_SWEEPS)}")
        if isinstance(self.range_start_L, bool) or not isinstance(self.range_start_L, int) or self.range_start_L < 1:
            raise ValueError(f"--range-start-L must be a positive integer, got {self.range_start_L!r}")
        if self.range_sweep == "max_L":
            fixed = [v.name for v in self.nearline_variants() if "max_L" in v.range]
            if fixed:
                raise ValueError(f"--range-sweep max_L sweeps max_L, but variant(s) {', '.join(fixed)} fix it")
        for t in self.target_aps:
            if not 0.0 < float(t) <= 1.0:
                raise ValueError(f"--target-ap {t}: expected an AP in (0, 1]")
        bad = [s for s in self.systems if s != "nearline" and s not in RANGE_PEERS]
        if bad:
            raise ValueError(f"range mode: {', '.join(bad)} cannot answer range queries (peers with range search "
                             f"by doubling k: {', '.join(RANGE_PEERS)})")
        entries = self.range_entries()
        if not entries:
            raise ValueError("range mode: nothing to run (no nearline configuration with these --range-methods, "
                             "no peer)")
        names = [e[0] for e in entries]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"range mode: system name(s) {', '.join(dup)} would be used twice (a variant named "
                             f"like another's {DOUBLING_SUFFIX} run)")
        clash = [n for n in names if n in reserved and n != "nearline"]
        if clash:
            raise ValueError(f"range mode: system name(s) {', '.join(clash)} are reserved")


# --------------------------------------------------------------------------- subprocess


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    pkg_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # numpy's OpenBLAS threads spin after each BLAS call and took 2-3% of the
    # samples of a search worker on this 2-core machine, whichever system it
    # ran. The workers do no heavy linear algebra; the systems under test
    # set their own thread counts.
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


def run_worker(
    spec: dict[str, Any], log_path: Optional[Path] = None, timeout_s: Optional[float] = None
) -> dict[str, Any]:
    """Runs ``python -m nearline._bench_worker`` with ``spec`` on stdin; returns its JSON result.

    The worker's stderr goes to ``log_path`` (or is inherited). Raises
    :class:`BenchError` naming the system and action when the worker fails.
    """
    spec = dict(spec)
    python = spec.pop("python", None)
    cmd = [python or sys.executable, "-m", "nearline._bench_worker"]
    what = f"{spec.get('name') or spec.get('variant', {}).get('name') or spec.get('system')} {spec.get('action')}"
    env = _worker_env()
    if python:
        # Another interpreter imports its own nearline, not this one.
        env.pop("PYTHONPATH", None)
    err_f = open(log_path, "a") if log_path else None
    try:
        proc = subprocess.run(
            cmd, input=json.dumps(peers.jsonable(spec)), stdout=subprocess.PIPE, stderr=err_f, text=True,
            env=env, timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise BenchError(f"{what}: worker ran past {timeout_s} s") from None
    finally:
        if err_f:
            err_f.close()
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    try:
        result = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        result = None
    if not isinstance(result, dict):
        hint = f" (see {log_path})" if log_path else ""
        raise BenchError(f"{what}: worker exited {proc.returncode} without a result{hint}")
    if "error" in result:
        hint = f" (log: {log_path})" if log_path else ""
        raise BenchError(f"{what}: {result['error']}{hint}")
    return result


# --------------------------------------------------------------------------- orchestration


def _environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    env["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import nearline

        env["nearline_version"] = getattr(nearline, "__version__", None)
        for mod in (nearline, getattr(nearline, "_nearline", None)):
            fn = getattr(mod, "simd_level", None)
            if fn is not None:
                env["simd_level"] = fn() if callable(fn) else fn
                break
    except Exception:  # the bindings may be missing; the peers still run
        log.debug("nearline bindings unavailable for the environment record", exc_info=True)
    from importlib import metadata

    for dist in ("diskannpy", "faiss-cpu", "hnswlib"):
        try:
            env[f"{dist}_version"] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            env[f"{dist}_version"] = None
    return env


def _check_variants(variants: Sequence[Variant]) -> None:
    """Refuses options the installed engine lacks (skipped when the bindings cannot be imported)."""
    if not any(v.build or v.open or v.search or v.range for v in variants):
        return
    try:
        import nearline
    except ImportError:
        log.warning("nearline cannot be imported here; variant options are checked by the workers")
        return
    for v in variants:
        if v.runner.get("python"):
            continue  # another interpreter, another version: its worker checks
        check_variant_supported(v, nearline)


def _build_one(cfg: BenchConfig, system: str, key: str, work: Path, logs: Path, ds: Any, p: peers.Params,
               pq_bytes: Optional[int], variant: Optional[Variant]) -> dict[str, Any]:
    """Builds (or reuses) one index directory; returns the build record."""
    idir = work / "indexes" / key
    marker = idir.with_name(key + ".build.json")
    if marker.exists() and not cfg.rebuild:
        res = json.loads(marker.read_text())
        res["cached"] = True
        log.info("%s: reusing %s", system, idir)
        return res
    if idir.exists():
        import shutil

        shutil.rmtree(idir) if idir.is_dir() else idir.unlink()
    if system != "nearline":
        idir.mkdir(parents=True, exist_ok=True)
    log.info("building %s into %s", system, idir)
    spec: dict[str, Any] = {"action": "build", "system": system, "base": str(ds.base_path), "index_dir": str(idir),
                            "params": dataclasses.asdict(p), "pq_bytes": pq_bytes}
    if variant is not None:
        spec["variant"] = variant.spec()
        spec["name"] = variant.name
        if variant.runner.get("python"):
            spec["python"] = str(variant.runner["python"])
    res = run_worker(spec, logs / f"build-{key}.log", cfg.timeout_s)
    res["cached"] = False
    marker.write_text(json.dumps(res, indent=1))
    return res


def run_bench(cfg: BenchConfig, progress: bool = True) -> dict[str, Any]:
    """Runs the whole benchmark; returns the result dict (also written to ``cfg.out``)."""
    cfg.validate()
    work = Path(cfg.workdir)
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    (work / "indexes").mkdir(exist_ok=True)  # nearline.build wants the parent of the index to exist
    if cfg.range_mode:
        Ls = list(cfg.Ls)  # k plays no part: the doubling baseline searches with L = max(L, k)
    else:
        Ls = [L for L in cfg.Ls if L >= cfg.k]
        if len(Ls) < len(cfg.Ls):
            log.warning("dropping L values below k=%d: %s", cfg.k, [L for L in cfg.Ls if L < cfg.k])
    if not Ls:
        raise ValueError(f"no L value is >= k={cfg.k}")
    variants = cfg.nearline_variants()
    _check_variants(variants)
    systems = cfg.all_systems()
    baseline = cfg.baseline_system()
    p = cfg.params()

    ds = datasets.load_dataset(cfg.data, work)
    ds = datasets.materialize(ds, work, cfg.k, p.threads)
    p.metric = ds.metric
    assert ds.base_path and ds.queries_path and ds.gt_path
    log.info("dataset %s: n=%d dim=%d dtype=%s nq=%d metric=%s", ds.name, ds.n, ds.dim, ds.base.dtype,
             ds.queries.shape[0], ds.metric)
    range_info = prepare_range(cfg, ds, work, p.threads) if cfg.range_mode else None

    # ---- builds: nearline configurations first (variants with equal build keys share one), then the peers
    builds: dict[str, dict[str, Any]] = {}
    index_dirs: dict[str, Path] = {}
    index_keys: dict[str, str] = {}
    by_key: dict[str, dict[str, Any]] = {}
    pq_bytes = cfg.pq_bytes
    for v in variants:
        keys = {**v.build, **v.runner}
        if not v.runner.get("python"):
            # An `auto` build is keyed by the composition the rules pick now.
            planned = peers.planned_auto_preset(ds.base_path, p, v.build)
            if planned is not None:
                keys["auto_plans"] = planned
        key = params_key("nearline", ds.name, p, cfg.pq_bytes, keys)
        if key not in by_key:
            by_key[key] = _build_one(cfg, "nearline", key, work, logs, ds, p, cfg.pq_bytes,
                                     v if (v.build or v.runner) else None)
        res = by_key[key]
        if res.get("pq_bytes") and not pq_bytes:
            pq_bytes = int(res["pq_bytes"])
        builds[v.name] = res
        index_dirs[v.name] = work / "indexes" / key
        index_keys[v.name] = key
    peer_builds: dict[str, dict[str, Any]] = {}
    for system in systems[len(variants):]:
        base, _threads = peers.split_system(system)  # diskannpy@T searches diskannpy's index
        peer_pq = pq_bytes
        if base == "diskannpy" and p.equal_budget and cfg.memory_budget is not None:
            # The same budget, diskannpy's way: its rule picks the PQ bytes.
            peer_pq = peers.diskann_pq_for_budget(cfg.memory_budget, ds.n, ds.dim, ds.base.dtype.itemsize)
        elif base == "diskannpy" and not pq_bytes:
            peer_pq = pq_bytes = peers.default_pq_bytes(ds.n, ds.dim, ds.base.dtype.itemsize, cfg.memory_budget)
            log.warning("nearline's PQ size unknown; diskannpy uses %d bytes per vector", pq_bytes)
        key = params_key(base, ds.name, p, peer_pq)
        if key not in peer_builds:
            peer_builds[key] = _build_one(cfg, base, key, work, logs, ds, p, peer_pq, None)
        builds[system] = peer_builds[key]
        index_dirs[system] = work / "indexes" / key
        index_keys[system] = key

    # ---- the disk ceiling: on the first nearline index's page file
    ceiling_dir: Optional[Path] = None
    if cfg.ceiling and variants:
        cand = index_dirs[variants[0].name]
        if (cand / "pages.bin").is_file():
            ceiling_dir = cand
        else:
            log.warning("no %s: the disk ceiling is not measured", cand / "pages.bin")

    if range_info is not None:
        return _run_range(cfg, ds, p, logs, range_info, builds, index_dirs, index_keys, ceiling_dir, pq_bytes, Ls,
                          progress)

    # ---- searches (and the ceiling) in alternation
    variant_of = {v.name: v for v in variants}

    def search_spec(system: str) -> dict[str, Any]:
        v = variant_of.get(system)
        base, threads = ("nearline", None) if v else peers.split_system(system)
        params = dataclasses.asdict(p)
        if threads is not None:  # a peer at its own thread count: throughput only
            params["threads"] = threads
        sweep = Ls
        if v is not None and v.build.get("preset") == "spfresh" and cfg.nprobes:
            sweep = list(cfg.nprobes)  # a partition index sweeps nprobe (reported in the L column)
        spec = {"action": "search", "system": base, "name": system,
                "index_dir": str(index_dirs[system]), "queries": str(ds.queries_path), "gt": str(ds.gt_path),
                "k": cfg.k, "Ls": sweep, "params": params, "queries_repeat": cfg.queries_repeat,
                "warmup": cfg.warmup, "latency_queries": cfg.latency_queries if threads is None else 0,
                "perturb": cfg.perturb, "seed": cfg.seed}
        if v is not None and (v.open or v.search):
            spec["variant"] = v.spec()
        if v is not None and v.runner.get("python"):
            spec["python"] = str(v.runner["python"])
        return spec

    runs, ceiling_runs = _alternate(cfg, systems, search_spec, ceiling_dir, p, logs, progress)
    ceiling = _ceiling_summary(ceiling_runs, cfg)
    summary: dict[str, dict[str, Any]] = {}
    for system in systems:
        rs = runs[system]
        pts = median_points([r["points"] for r in rs])
        add_disk_utilisation(pts, ceiling.get("median_reads_per_s") if ceiling else None)
        summary[system] = {
            "points": pts,
            "rss_after_open_bytes": _median([r.get("rss_after_open_bytes") for r in rs]),
            "open_s": _median([r.get("open_s") for r in rs]),
            "build": builds[system],
            "index": index_keys[system],
        }
        refused = next((r["refused"] for r in rs if r.get("refused")), None)
        if refused:
            # The L values the memory budget could not serve (the worker's reason).
            summary[system]["refused"] = {"Ls": [x["L"] for x in refused], "reason": refused[0]["reason"]}
        if system in variant_of:
            summary[system]["variant"] = variant_of[system].spec()
    comparisons: dict[str, Any] = {}
    for other in systems:
        if other == baseline:
            continue
        comparisons[f"{other}/{baseline}"] = {
            "at_recall": matched_ratios(summary[other], summary[baseline], cfg.target_recalls),
            "build_time_ratio": _ratio(builds[other].get("build_s"), builds[baseline].get("build_s")),
            "peak_build_rss_ratio": _ratio(builds[other].get("peak_rss_bytes"), builds[baseline].get("peak_rss_bytes")),
        }
    best_peer = best_peer_ratios(summary, systems, [v.name for v in variants], p.threads, cfg.target_recalls)
    result = {
        "params": {**dataclasses.asdict(p), "Ls": Ls, "k": cfg.k, "reps": cfg.reps,
                   "queries_repeat": cfg.queries_repeat, "systems": systems, "baseline": baseline,
                   "variants": [v.spec() for v in variants if v.name != "nearline"],
                   "target_recalls": list(cfg.target_recalls), "latency_queries": cfg.latency_queries,
                   "perturb": cfg.perturb, "pq_bytes_matched": pq_bytes,
                   "peer_threads": cfg.peer_thread_counts()},
        **_result_body(cfg, ds, builds, runs, ceiling, summary, comparisons),
        "best_peer": best_peer,
        "roofline": roofline_summary(summary, single_target(cfg.target_recalls)),
    }
    _save_result(cfg, result)
    if cfg.plot:
        from nearline import plots

        plots.plot_qps_recall(summary, cfg.plot, k=cfg.k, title=f"{ds.name} (k={cfg.k}, W={cfg.W}, T={p.threads})")
        t = single_target(cfg.target_recalls)
        plots.plot_roofline(result["roofline"], _suffixed(cfg.plot, "roofline"),
                            title=f"{ds.name}: time per query at recall@{cfg.k} = {t:.2f} (T={p.threads})")
    return result


def _suffixed(path: Optional[Path], tag: str) -> Optional[Path]:
    return None if path is None else path.with_name(f"{path.stem}-{tag}{path.suffix}")


def budget_fraction(budget: Any, raw_bytes: int) -> float:
    """A budget as a fraction of the raw vector bytes."""
    b = peers._budget_bytes(budget, raw_bytes) or 0
    return b / max(1, raw_bytes)


def run_budget_sweep(cfg: BenchConfig, budgets: Sequence[Any], progress: bool = True) -> dict[str, Any]:
    """One equal-budget benchmark per memory budget (every system at the same budget, each its
    own way; see :class:`peers.Params`), each with its own result and plot (``-b<budget>`` added
    to the names), then QPS at each target recall against the budget, per system, in one plot
    (``-budgets`` added to the plot's name) and one result."""
    per: dict[str, Any] = {}
    given: dict[str, Any] = {}
    for b in budgets:
        tag = f"b{b}"
        sub = dataclasses.replace(cfg, memory_budget=b, equal_budget=True, out=_suffixed(cfg.out, tag),
                                  plot=_suffixed(cfg.plot, tag))
        per[str(b)] = run_bench(sub, progress=progress)
        given[str(b)] = b
    first = next(iter(per.values()))
    ds = first["dataset"]
    raw = int(ds["n"]) * int(ds["dim"]) * np.dtype(ds["dtype"]).itemsize
    curve: dict[str, dict[str, list[Any]]] = {}
    for b, res in per.items():
        frac = budget_fraction(given[b], raw)
        for system, s in res["summary"].items():
            row = curve.setdefault(system, {"budget": [], **{f"{t:.2f}": [] for t in cfg.target_recalls}})
            row["budget"].append(frac)
            for t in cfg.target_recalls:
                row[f"{t:.2f}"].append(_qps_at(s, t))
    result = {"budgets": [str(b) for b in budgets], "raw_bytes": raw, "qps_at_recall": curve,
              "runs": {b: {"out": str(_suffixed(cfg.out, f"b{b}")) if cfg.out else None,
                           "summary": res["summary"], "comparisons": res["comparisons"]}
                       for b, res in per.items()}}
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps(peers.jsonable(result), indent=1))
    if cfg.plot:
        from nearline import plots

        t = single_target(cfg.target_recalls)
        plots.plot_qps_budget(curve, _suffixed(cfg.plot, "budgets"), target=t,
                              title=f"{ds['name']}: QPS at recall@{cfg.k} = {t:.2f} against the memory budget")
    return result


def format_budget_report(result: dict[str, Any]) -> str:
    """QPS at each target recall per system and budget, as text."""
    lines = [f"memory budgets (fraction of the {result['raw_bytes']} raw vector bytes): "
             + ", ".join(result["budgets"])]
    for system, row in result["qps_at_recall"].items():
        for key, vals in row.items():
            if key == "budget":
                continue
            cells = "  ".join(f"{b:.3f}: {('%.0f' % q) if q else '-':>6}" for b, q in zip(row["budget"], vals))
            lines.append(f"{system:<24} QPS@{key}  {cells}")
    return "\n".join(lines)


def _result_body(cfg: BenchConfig, ds: Any, builds: dict[str, Any], runs: dict[str, Any],
                 ceiling: Optional[dict[str, Any]], summary: dict[str, Any], comparisons: dict[str, Any]
                 ) -> dict[str, Any]:
    """The part of a result (k-NN or range mode) after its parameters: dataset, environment, runs, ratios."""
    return {
        "dataset": {"spec": cfg.data, "name": ds.name, "n": ds.n, "dim": ds.dim, "dtype": str(ds.base.dtype),
                    "nq": int(ds.queries.shape[0]), "metric": ds.metric},
        "environment": _environment(),
        "builds": builds,
        "runs": runs,
        "disk_ceiling": ceiling,
        "summary": summary,
        "comparisons": comparisons,
    }


def _save_result(cfg: BenchConfig, result: dict[str, Any]) -> None:
    """Writes the result JSON to ``cfg.out`` (if set)."""
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps(peers.jsonable(result), indent=1))


def _alternate(cfg: BenchConfig, names: Sequence[str], spec_of: Callable[[str], dict[str, Any]],
               ceiling_dir: Optional[Path], p: peers.Params, logs: Path, progress: bool
               ) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Runs every named search (and the disk ceiling) ``cfg.reps`` times in rotating order.

    Returns ``(runs per name, ceiling runs)``; each result carries its ``rep``.
    """
    entries = list(names) + ([CEILING] if ceiling_dir is not None else [])
    schedule = alternation_schedule(entries, cfg.reps)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in names}
    ceiling_runs: list[dict[str, Any]] = []
    total = sum(len(r) for r in schedule)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="search", unit="run", file=sys.stderr)
    for rep, order in enumerate(schedule):
        for name in order:
            if name == CEILING:
                assert ceiling_dir is not None
                spec = {"action": "ceiling", "system": CEILING, "path": str(ceiling_dir),
                        "depth": cfg.ceiling_depth, "seconds": cfg.ceiling_seconds, "io": p.io, "seed": cfg.seed + rep}
                res = run_worker(spec, logs / "ceiling.log", cfg.timeout_s)
                res["rep"] = rep
                ceiling_runs.append(res)
            else:
                res = run_worker(spec_of(name), logs / f"search-{name}.log", cfg.timeout_s)
                res["rep"] = rep
                runs[name].append(res)
            if bar:
                bar.update(1)
    if bar:
        bar.close()
    return runs, ceiling_runs


def check_radius(radius: Any, metric: str) -> float:
    """The radius as the float32 value the engine compares: finite, and >= 0 for ``l2``; else ``ValueError``."""
    try:
        r = float(radius)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"radius {radius!r} is not a number") from None
    if np.isfinite(r):
        with np.errstate(over="ignore"):
            r = float(np.float32(r))
    if not np.isfinite(r):
        raise ValueError(f"radius {radius!r} is not a finite number (as float32)")
    if metric == "l2" and r < 0:
        raise ValueError(f"radius {radius!r} is negative: for l2 the radius is a squared distance (>= 0)")
    return r


def prepare_range(cfg: BenchConfig, ds: Any, workdir: Path, threads: Optional[int]) -> dict[str, Any]:
    """The radius (given, or picked by :func:`nearline.radius_for_mean_neighbors`) and the exact range
    ground truth at it, cached under ``workdir/data/<dataset>/``; returns the facts the report shows."""
    import nearline

    if ds.metric == "ip" and any(e[1] == "diskannpy" for e in cfg.range_entries()):
        raise ValueError("range mode: diskannpy reports no inner products for metric ip (its MIPS transform "
                         "changes the values), so it cannot run the doubling baseline on this data set")
    folder = Path(workdir) / "data" / ds.name
    folder.mkdir(parents=True, exist_ok=True)
    if cfg.range_neighbors is not None:
        cache = folder / f"radius-{ds.metric}-mean{float(cfg.range_neighbors)!r}.json"
        if cache.exists():
            radius = float(json.loads(cache.read_text())["radius"])
        else:
            log.info("picking the radius for %g mean neighbours on %s", cfg.range_neighbors, ds.name)
            radius = nearline.radius_for_mean_neighbors(ds.base, ds.queries, float(cfg.range_neighbors), ds.metric,
                                                        threads)
            cache.write_text(json.dumps({"radius": radius, "mean_neighbors": float(cfg.range_neighbors),
                                         "metric": ds.metric}))
    else:
        radius = check_radius(cfg.radius, ds.metric)
    gt_path = folder / f"range-gt-{ds.metric}-{np.float32(radius).tobytes().hex()}.bin"
    if gt_path.exists():
        lims, _ids, _d = nearline.read_range_ground_truth(gt_path)
    else:
        log.info("computing exact range ground truth at radius %g for %s", radius, ds.name)
        lims, ids, d = nearline.compute_range_ground_truth(ds.base, ds.queries, radius, ds.metric, threads)
        nearline.write_range_ground_truth(gt_path, lims, ids, d)
    counts = np.diff(np.asarray(lims))
    if counts.size and counts.max() == 0:
        log.warning("radius %g: no query has an exact neighbour within it (every AP is 1 for an empty answer)",
                    radius)
    return {"radius": radius, "mean_neighbors": cfg.range_neighbors, "gt_path": str(gt_path),
            "gt_mean_results": float(counts.mean()) if counts.size else 0.0,
            "gt_median_results": float(np.median(counts)) if counts.size else 0.0,
            "gt_max_results": int(counts.max()) if counts.size else 0,
            "gt_empty_queries": int((counts == 0).sum())}


def _run_range(cfg: BenchConfig, ds: Any, p: peers.Params, logs: Path, range_info: dict[str, Any],
               builds: dict[str, dict[str, Any]], index_dirs: dict[str, Path], index_keys: dict[str, str],
               ceiling_dir: Optional[Path], pq_bytes: Optional[int], Ls: list[int], progress: bool
               ) -> dict[str, Any]:
    """Range mode's searches, summary, comparisons and result (see the module doc)."""
    entries = {e[0]: e for e in cfg.range_entries()}
    built_as = {name: (e[3].name if e[3] is not None else e[1]) for name, e in entries.items()}
    baseline = cfg.baseline_system()

    def spec_of(name: str) -> dict[str, Any]:
        _, system, method, v = entries[name]
        spec = {"action": "range_search", "system": system, "name": name, "method": method,
                "index_dir": str(index_dirs[built_as[name]]), "queries": str(ds.queries_path),
                "range_gt": range_info["gt_path"], "radius": range_info["radius"], "metric": ds.metric, "n": ds.n,
                "Ls": Ls, "k0": cfg.doubling_k0, "params": dataclasses.asdict(p),
                "queries_repeat": cfg.queries_repeat, "warmup": cfg.warmup,
                "sweep": cfg.range_sweep, "start_L": cfg.range_start_L}
        if v is not None and (v.open or v.search or v.range):
            spec["variant"] = v.spec()
        if v is not None and v.runner.get("python"):
            spec["python"] = str(v.runner["python"])
        return spec

    runs, ceiling_runs = _alternate(cfg, list(entries), spec_of, ceiling_dir, p, logs, progress)
    ceiling = _ceiling_summary(ceiling_runs, cfg)
    summary: dict[str, dict[str, Any]] = {}
    for name, (_, system, method, v) in entries.items():
        rs = runs[name]
        pts = median_points([r["points"] for r in rs], RANGE_POINT_METRICS)
        add_disk_utilisation(pts, ceiling.get("median_reads_per_s") if ceiling else None)
        summary[name] = {
            "points": pts,
            "method": method,
            "system": system,
            "rss_after_open_bytes": _median([r.get("rss_after_open_bytes") for r in rs]),
            "open_s": _median([r.get("open_s") for r in rs]),
            "build": builds[built_as[name]],
            "index": index_keys[built_as[name]],
        }
        if v is not None and v.name != "nearline":
            summary[name]["variant"] = v.spec()
    comparisons: dict[str, Any] = {}
    for other in entries:
        if other == baseline:
            continue
        ba, bb = builds[built_as[other]], builds[built_as[baseline]]
        comparisons[f"{other}/{baseline}"] = {
            "at_ap": matched_ratios(summary[other], summary[baseline], cfg.target_aps, accuracy="ap"),
            "build_time_ratio": _ratio(ba.get("build_s"), bb.get("build_s")),
            "peak_build_rss_ratio": _ratio(ba.get("peak_rss_bytes"), bb.get("peak_rss_bytes")),
        }
    result = {
        "params": {**dataclasses.asdict(p), "mode": "range", "radius": range_info["radius"],
                   "range_neighbors": cfg.range_neighbors, "range_methods": list(cfg.range_methods),
                   "doubling_k0": cfg.doubling_k0, "range_sweep": cfg.range_sweep,
                   "range_start_L": cfg.range_start_L, "Ls": Ls, "reps": cfg.reps, "queries_repeat": cfg.queries_repeat,
                   "systems": list(entries), "baseline": baseline,
                   "variants": [v.spec() for v in cfg.nearline_variants() if v.name != "nearline"],
                   "target_aps": list(cfg.target_aps), "pq_bytes_matched": pq_bytes},
        "range": range_info,
        **_result_body(cfg, ds, builds, runs, ceiling, summary, comparisons),
    }
    _save_result(cfg, result)
    if cfg.plot:
        from nearline import plots

        plots.plot_qps_recall(summary, cfg.plot, accuracy="ap",
                              title=f"{ds.name} range search, radius {range_info['radius']:.6g} "
                                    f"(W={cfg.W}, T={p.threads})")
    return result


def _ceiling_summary(runs: list[dict[str, Any]], cfg: BenchConfig) -> Optional[dict[str, Any]]:
    if not runs:
        return None
    rates = [r["reads_per_s"] for r in runs if r.get("reads_per_s") is not None]
    first = runs[0]
    stall_rates = [r["stalls"] / r["elapsed_s"] for r in runs
                   if r.get("stalls") is not None and r.get("elapsed_s")]
    return {
        "median_reads_per_s": _median(rates),
        "reads_per_s": rates,
        # The device's own tail (its CPUs idle while it waits), next to which
        # the searches' percentiles read: a stall is >= 10 ms with reads in
        # flight and none completing.
        "median_latency_p99_us": _median([r.get("latency_p99_us") for r in runs]),
        "median_latency_p999_us": _median([r.get("latency_p999_us") for r in runs]),
        "median_stalls_per_s": _median(stall_rates),
        "runs": runs,
        "depth": cfg.ceiling_depth,
        "seconds": cfg.ceiling_seconds,
        "block_size": first.get("block_size"),
        "engine": first.get("engine"),
        "direct_io": first.get("direct_io"),
        "path": first.get("path"),
    }


def _median(vals: Sequence[Optional[float]]) -> Optional[float]:
    v = [x for x in vals if x is not None]
    return float(np.median(v)) if v else None
