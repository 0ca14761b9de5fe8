"""``nearline bench``: nearline against diskannpy and in-memory references.

Every system builds and searches in its own subprocess (``nearline._bench_worker``):

1. **build** per system (timed, peak RSS of the worker); index directories are
   cached under ``workdir/indexes/`` keyed by the dataset and the parameters,
   and reused unless ``rebuild``. nearline builds first; diskannpy then gets the
   same in-RAM PQ bytes per vector.
2. **search** ``reps`` repetitions; each repetition runs every system once, in
   a rotating order (:func:`alternation_schedule`), each in a fresh process that
   opens the index, warms up and runs the query batch at every L.
3. **report** medians over repetitions, a table, ratios against the first peer
   at matched recall (:func:`interpolate_at_recall`), JSON and an optional plot.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from nearline import datasets, peers

log = logging.getLogger(__name__)

DEFAULT_LS = (10, 20, 30, 50, 70, 100, 150, 200)
TARGET_RECALLS = (0.90, 0.95, 0.99)

#: Point metrics aggregated (median over repetitions).
POINT_METRICS = (
    "recall", "qps", "wall_s", "lat_mean_ms", "lat_p50_ms", "lat_p99_ms", "lat_p999_ms", "mean_reads",
    "mean_hops", "io_util", "proc_reads_per_query", "proc_read_bytes", "mean_cache_hits", "mean_bytes_read",
    "mean_pq_distances", "mean_exact_distances", "mean_io_wait_us", "mean_cpu_us", "single_lat_mean_ms",
    "single_lat_p50_ms", "single_lat_p99_ms", "single_lat_p999_ms",
)


class BenchError(RuntimeError):
    """A benchmark step failed (the message names the system and the step)."""


@dataclasses.dataclass
class BenchConfig:
    """Everything ``nearline bench`` needs; mirrors the CLI options."""

    data: str
    systems: list[str] = dataclasses.field(default_factory=lambda: ["nearline", "diskannpy"])
    Ls: list[int] = dataclasses.field(default_factory=lambda: list(DEFAULT_LS))
    k: int = 10
    R: int = 64
    build_L: int = 100
    alpha: float = 1.2
    pq_bytes: Optional[int] = None
    memory_budget: Any = None
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
    latency_queries: int = 200
    timeout_s: Optional[float] = None

    def params(self) -> peers.Params:
        """The shared build/search parameters."""
        return peers.Params(
            metric="l2", R=self.R, build_L=self.build_L, alpha=self.alpha, pq_bytes=self.pq_bytes,
            memory_budget=self.memory_budget, build_memory_budget=self.build_memory_budget,
            cache_budget=self.cache_budget, threads=peers.env_threads(self.threads), seed=self.seed, W=self.W,
            entry_points=self.entry_points, entry=self.entry, nav_L=self.nav_L, nav_seeds=self.nav_seeds,
            nav_sample=self.nav_sample, entry_clusters=self.entry_clusters,
        )


# --------------------------------------------------------------------------- pure helpers


def alternation_schedule(systems: Sequence[str], reps: int) -> list[list[str]]:
    """Search order per repetition: rep ``r`` runs ``systems`` rotated left by ``r``.

    ``[A, B, C]`` over 3 reps gives ``[A, B, C], [B, C, A], [C, A, B]``, so each
    system runs first (on a cold-ish machine) equally often.
    """
    s = list(systems)
    if not s:
        return [[] for _ in range(reps)]
    return [s[r % len(s):] + s[: r % len(s)] for r in range(reps)]


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


def matched_ratios(
    a: dict[str, Any], b: dict[str, Any], targets: Sequence[float] = TARGET_RECALLS
) -> dict[str, dict[str, Optional[float]]]:
    """Ratios ``a/b`` of QPS and of mean reads at each target recall both curves reach.

    ``a`` and ``b`` are summaries with ``points`` (lists of dicts with ``recall``,
    ``qps``, ``mean_reads``). Returns ``{"0.95": {"qps_a", "qps_b", "qps_ratio",
    "reads_a", "reads_b", "reads_ratio"}}`` for the targets reached by both.
    """
    out: dict[str, dict[str, Optional[float]]] = {}

    def curve(s: dict[str, Any], key: str) -> tuple[list[float], list[Optional[float]]]:
        pts = s.get("points", [])
        return [p.get("recall") for p in pts], [p.get(key) for p in pts]

    for t in targets:
        qa = interpolate_at_recall(*curve(a, "qps"), t, log_scale=True)
        qb = interpolate_at_recall(*curve(b, "qps"), t, log_scale=True)
        if qa is None or qb is None:
            continue
        ra = interpolate_at_recall(*curve(a, "mean_reads"), t)
        rb = interpolate_at_recall(*curve(b, "mean_reads"), t)
        out[f"{t:.2f}"] = {
            "qps_a": qa, "qps_b": qb, "qps_ratio": qa / qb if qb else None,
            "reads_a": ra, "reads_b": rb, "reads_ratio": (ra / rb) if (ra is not None and rb) else None,
        }
    return out


def median_points(runs: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
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
        for key in POINT_METRICS:
            vals = [g[key] for g in group if g.get(key) is not None]
            m[key] = float(np.median(vals)) if vals else None
        out.append(m)
    return out


def params_key(system: str, dataset: str, p: peers.Params, pq_bytes: Optional[int]) -> str:
    """Cache directory name for an index: system, dataset, hash of the build parameters."""
    build = {"R": p.R, "build_L": p.build_L, "metric": p.metric, "seed": p.seed}
    if system in ("nearline", "diskannpy"):
        build["pq_bytes"] = pq_bytes
    if system == "nearline":
        build.update(alpha=p.alpha, memory_budget=str(p.memory_budget), build_memory_budget=str(p.build_memory_budget))
        # Only when set, so indexes cached before these options keep their names.
        if p.nav_sample:
            build["nav_sample"] = float(p.nav_sample)
        if p.entry_clusters:
            build["entry_clusters"] = int(p.entry_clusters)
    h = hashlib.sha1(json.dumps(build, sort_keys=True).encode()).hexdigest()[:10]
    return f"{system}-{dataset}-{h}"


# --------------------------------------------------------------------------- subprocess


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    pkg_parent = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_worker(
    spec: dict[str, Any], log_path: Optional[Path] = None, timeout_s: Optional[float] = None
) -> dict[str, Any]:
    """Runs ``python -m nearline._bench_worker`` with ``spec`` on stdin; returns its JSON result.

    The worker's stderr goes to ``log_path`` (or is inherited). Raises
    :class:`BenchError` naming the system and action when the worker fails.
    """
    cmd = [sys.executable, "-m", "nearline._bench_worker"]
    what = f"{spec.get('system')} {spec.get('action')}"
    err_f = open(log_path, "a") if log_path else None
    try:
        proc = subprocess.run(
            cmd, input=json.dumps(peers.jsonable(spec)), stdout=subprocess.PIPE, stderr=err_f, text=True,
            env=_worker_env(), timeout=timeout_s,
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


def run_bench(cfg: BenchConfig, progress: bool = True) -> dict[str, Any]:
    """Runs the whole benchmark; returns the result dict (also written to ``cfg.out``)."""
    work = Path(cfg.workdir)
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    (work / "indexes").mkdir(exist_ok=True)  # nearline.build wants the parent of the index to exist
    if cfg.k <= 0:
        raise ValueError(f"--k must be positive, got {cfg.k}")
    Ls = [L for L in cfg.Ls if L >= cfg.k]
    if len(Ls) < len(cfg.Ls):
        log.warning("dropping L values below k=%d: %s", cfg.k, [L for L in cfg.Ls if L < cfg.k])
    if not Ls:
        raise ValueError(f"no L value is >= k={cfg.k}")
    p = cfg.params()

    ds = datasets.load_dataset(cfg.data, work)
    ds = datasets.materialize(ds, work, cfg.k, p.threads)
    p.metric = ds.metric
    assert ds.base_path and ds.queries_path and ds.gt_path
    log.info("dataset %s: n=%d dim=%d dtype=%s nq=%d metric=%s", ds.name, ds.n, ds.dim, ds.base.dtype,
             ds.queries.shape[0], ds.metric)

    # ---- builds
    builds: dict[str, dict[str, Any]] = {}
    index_dirs: dict[str, Path] = {}
    pq_bytes = cfg.pq_bytes
    for system in cfg.systems:
        key = params_key(system, ds.name, p, pq_bytes if system != "nearline" else cfg.pq_bytes)
        idir = work / "indexes" / key
        marker = idir.with_name(key + ".build.json")
        if marker.exists() and not cfg.rebuild:
            res = json.loads(marker.read_text())
            res["cached"] = True
            log.info("%s: reusing %s", system, idir)
        else:
            if idir.exists():
                import shutil

                shutil.rmtree(idir) if idir.is_dir() else idir.unlink()
            if system != "nearline":
                idir.mkdir(parents=True, exist_ok=True)
            if system == "diskannpy" and not pq_bytes:
                pq_bytes = peers.default_pq_bytes(ds.n, ds.dim, ds.base.dtype.itemsize, cfg.memory_budget)
                log.warning("nearline's PQ size unknown; diskannpy uses %d bytes per vector", pq_bytes)
            log.info("building %s into %s", system, idir)
            spec = {"action": "build", "system": system, "base": str(ds.base_path), "index_dir": str(idir),
                    "params": dataclasses.asdict(p), "pq_bytes": pq_bytes}
            res = run_worker(spec, logs / f"build-{key}.log", cfg.timeout_s)
            res["cached"] = False
            marker.write_text(json.dumps(res, indent=1))
        if system == "nearline" and res.get("pq_bytes") and not pq_bytes:
            pq_bytes = int(res["pq_bytes"])
        builds[system] = res
        index_dirs[system] = idir

    # ---- searches
    schedule = alternation_schedule(cfg.systems, cfg.reps)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in cfg.systems}
    total = sum(len(r) for r in schedule)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="search", unit="run", file=sys.stderr)
    for rep, order in enumerate(schedule):
        for system in order:
            spec = {"action": "search", "system": system, "index_dir": str(index_dirs[system]),
                    "queries": str(ds.queries_path), "gt": str(ds.gt_path), "k": cfg.k, "Ls": Ls,
                    "params": dataclasses.asdict(p), "queries_repeat": cfg.queries_repeat,
                    "warmup": cfg.warmup, "latency_queries": cfg.latency_queries}
            res = run_worker(spec, logs / f"search-{system}.log", cfg.timeout_s)
            res["rep"] = rep
            runs[system].append(res)
            if bar:
                bar.update(1)
    if bar:
        bar.close()

    summary: dict[str, dict[str, Any]] = {}
    for system in cfg.systems:
        rs = runs[system]
        summary[system] = {
            "points": median_points([r["points"] for r in rs]),
            "rss_after_open_bytes": _median([r.get("rss_after_open_bytes") for r in rs]),
            "open_s": _median([r.get("open_s") for r in rs]),
            "build": builds[system],
        }
    comparisons: dict[str, Any] = {}
    first = cfg.systems[0]
    for other in cfg.systems[1:]:
        comparisons[f"{first}/{other}"] = {
            "at_recall": matched_ratios(summary[first], summary[other]),
            "build_time_ratio": _ratio(builds[first].get("build_s"), builds[other].get("build_s")),
            "peak_build_rss_ratio": _ratio(builds[first].get("peak_rss_bytes"), builds[other].get("peak_rss_bytes")),
        }
    result = {
        "params": {**dataclasses.asdict(p), "Ls": Ls, "k": cfg.k, "reps": cfg.reps,
                   "queries_repeat": cfg.queries_repeat,
                   "systems": cfg.systems, "pq_bytes_matched": pq_bytes},
        "dataset": {"spec": cfg.data, "name": ds.name, "n": ds.n, "dim": ds.dim, "dtype": str(ds.base.dtype),
                    "nq": int(ds.queries.shape[0]), "metric": ds.metric},
        "environment": _environment(),
        "builds": builds,
        "runs": runs,
        "summary": summary,
        "comparisons": comparisons,
    }
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps(peers.jsonable(result), indent=1))
    if cfg.plot:
        from nearline import plots

        plots.plot_qps_recall(summary, cfg.plot, k=cfg.k, title=f"{ds.name} (k={cfg.k}, W={cfg.W}, T={p.threads})")
    return result


def _median(vals: Sequence[Optional[float]]) -> Optional[float]:
    v = [x for x in vals if x is not None]
    return float(np.median(v)) if v else None


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return (a / b) if (a is not None and b) else None


# --------------------------------------------------------------------------- report


def _fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_report(result: dict[str, Any]) -> str:
    """The text report: per-system table, ratios at matched recall, build comparison."""
    k = result["params"]["k"]
    lines = []
    hdr = (f"{'system':<11} {'L':>4} {'recall@' + str(k):>9} {'QPS':>9} {'mean ms':>8} {'p99 ms':>8} "
           f"{'p99.9 ms':>8} {'reads':>7} {'hops':>6} {'io util':>7}")
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for system, s in result["summary"].items():
        for pt in s["points"]:
            lines.append(
                f"{system:<11} {pt['L']:>4} {_fmt(pt['recall'], '.4f'):>9} {_fmt(pt['qps'], '.0f'):>9} "
                f"{_fmt(pt['lat_mean_ms'], '.3f'):>8} {_fmt(pt['lat_p99_ms'], '.3f'):>8} "
                f"{_fmt(pt['lat_p999_ms'], '.3f'):>8} {_fmt(pt['mean_reads'], '.1f'):>7} "
                f"{_fmt(pt['mean_hops'], '.1f'):>6} {_fmt(pt['io_util'], '.2f'):>7}"
            )
    lines.append("")
    for pair, comp in result["comparisons"].items():
        a, b = pair.split("/")
        if not comp["at_recall"]:
            lines.append(f"{pair}: no target recall ({', '.join(f'{t:.2f}' for t in TARGET_RECALLS)}) reached by both")
        for t, r in comp["at_recall"].items():
            line = f"QPS ratio {a}/{b} @ recall {t} = {_fmt(r['qps_ratio'], '.2f')}"
            if r["reads_ratio"] is not None:
                line += f", mean reads ratio = {r['reads_ratio']:.2f}"
            lines.append(line)
        lines.append(f"build time ratio {a}/{b} = {_fmt(comp['build_time_ratio'], '.2f')}, "
                     f"peak build RSS ratio = {_fmt(comp['peak_build_rss_ratio'], '.2f')}")
    lines.append("")
    for system, b in result["builds"].items():
        rss = b.get("peak_rss_bytes")
        lines.append(
            f"build {system:<11} {_fmt(b.get('build_s'), '.1f')} s, peak RSS "
            f"{'-' if rss is None else f'{rss / 2**20:.0f} MiB'}"
            + (f", PQ {b['pq_bytes']} B/vector" if b.get("pq_bytes") else "")
            + (" (cached)" if b.get("cached") else "")
        )
    return "\n".join(lines)
