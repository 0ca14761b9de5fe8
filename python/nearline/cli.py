"""The ``nearline`` command line: demo, build, search, gt, info, bench, disk-ceiling.

Engine errors (``ValueError``/``OSError`` from nearline) print one line
``nearline: error: ...`` on stderr and exit 2 (``--debug`` shows the traceback);
Ctrl-C exits 130 (``build cancelled`` during a build).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from nearline import cli_options
from nearline.cli_format import _flatten, _human_bytes, _short, format_info, format_plan  # noqa: F401
from nearline.cli_types import (  # noqa: F401 - argparse types of the parser below
    _block_size,
    _budget,
    _budget_list,
    _depth,
    _disk_budget,
    _finite_float,
    _fraction,
    _int_list,
    _k0,
    _nonneg_float,
    _nonneg_int,
    _positive_float,
    _positive_int,
    _queries_in_flight,
    _range_methods,
    _recalls,
    _systems,
    _thread_counts,
    _variant,
)

log = logging.getLogger("nearline.cli")

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


# --------------------------------------------------------------------------- helpers


class _Progress:
    """A ``progress(stage, done, total)`` callback drawing one tqdm bar per stage."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.stage: Optional[str] = None
        self.bar: Any = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if stage != self.stage:
            self.close()
            from tqdm import tqdm

            self.stage = stage
            self.bar = tqdm(total=max(int(total), 0) or None, desc=stage, file=sys.stderr, leave=True,
                            dynamic_ncols=True)
        if self.bar is not None:
            if total and self.bar.total != total:
                self.bar.total = total
            step = int(done) - self.bar.n
            if step > 0:
                self.bar.update(step)  # tqdm rate-limits redraws

    def close(self) -> None:
        """Closes the current bar."""
        if self.bar is not None:
            self.bar.close()
        self.bar = None
        self.stage = None


def _vocab() -> dict[str, Any]:
    """The engine's names (presets, executors, ...): the CLI's choice lists."""
    import nearline

    return nearline.VOCABULARY


def _defaults() -> dict[str, Any]:
    """The engine's defaults, for help texts."""
    import nearline

    return nearline.DEFAULTS


def _add_entry_options(p: argparse.ArgumentParser, *, bench: bool = False) -> None:
    """``--entry``, ``--entry-points``, ``--nav-L``, ``--nav-seeds`` (search/bench)."""
    cli_options.add(p, "open", only=("entry", "entry_points", "nav_L", "nav_seeds"), prefix="nearline: " if bench else "")


def _engine() -> Any:
    import nearline

    return nearline


def _recall(ids: np.ndarray, gt: np.ndarray, k: int) -> float:
    from nearline.datasets import recall_at_k

    return recall_at_k(ids, gt, k)


def _stats_means(stats: Optional[dict[str, Any]]) -> dict[str, float]:
    if not stats:
        return {}
    return {key: float(np.mean(np.asarray(v))) for key, v in stats.items() if np.asarray(v).size}


def _print_table(rows: Sequence[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


# --------------------------------------------------------------------------- commands


def cmd_build(args: argparse.Namespace) -> int:
    """``nearline build DATA OUT``."""
    nl = _engine()
    ids = None
    if args.ids:
        ids = _read_ids(args.ids)
    progress = _Progress(not args.quiet)
    t0 = time.perf_counter()
    # The build's warnings (a graph built in shards small enough to cost recall)
    # go to stderr after the progress bars, whatever the warning filters say.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            idx = nl.build(args.data, args.out, ids=ids, progress=progress, **_build_options(args))
        finally:
            progress.close()
            for w in caught:
                print(f"nearline: warning: {w.message}", file=sys.stderr)
    elapsed = time.perf_counter() - t0
    with idx:
        info = idx.info()
    if info.get("kind") == "partition":
        b = info.get("build") or {}
        print(f"built {args.out}: partition index n={info.get('n')} dim={info.get('dim')} "
              f"metric={info.get('metric')} preset={info.get('preset')} postings={info.get('postings')} "
              f"mean_replicas={b.get('mean_replicas', 0):.2f} in {elapsed:.1f} s")
        return 0
    entry = info.get("entry", {})
    extra = ""
    if entry.get("has_nav"):
        extra += f" nav_sample={entry.get('nav_sample')}"
    if entry.get("has_centroids"):
        extra += f" entry_clusters={entry.get('entry_clusters')}"
    lay = info.get("layout") or {}
    extra += f" layout={lay.get('kind')}"
    if lay.get("shuffle"):
        sh = lay["shuffle"]
        extra += f" ({sh.get('algorithm')}, {sh.get('iterations')} rounds, ID layout OR(G)={sh.get('id_overlap_ratio'):.4f})"
    if info.get("overlap_ratio") is not None:
        extra += f" OR(G)={info['overlap_ratio']:.4f}"
    print(f"built {args.out}: n={info.get('n')} dim={info.get('dim')} metric={info.get('metric')} "
          f"preset={info.get('preset')} R={info.get('R')} pq_bytes={info.get('pq_bytes')}{extra} in {elapsed:.1f} s")
    rule = (info.get("build") or {}).get("auto_rule")
    if rule:
        print(f"preset: {rule}")
    return 0


def _build_options(args: argparse.Namespace) -> dict[str, Any]:
    """The build options given on the command line (the rest are the engine's defaults)."""
    return cli_options.given(args, "build", exclude=("ids",))


def _read_ids(path: str) -> np.ndarray:
    """External ids as stored: the engine checks their type and range (floats and negatives are refused)."""
    p = Path(path)
    if p.suffix.lower() == ".npy":
        arr = np.load(p)
    elif p.suffix.lower() in (".txt", ".csv"):
        arr = np.loadtxt(p, dtype=np.int64, delimiter="," if p.suffix.lower() == ".csv" else None)
    else:
        from nearline.datasets import read_vectors

        arr = read_vectors(p, dtype="<u8" if p.suffix.lower() == ".bin" else None)
    return np.asarray(arr).reshape(-1)


def cmd_search(args: argparse.Namespace) -> int:
    """``nearline search INDEX QUERIES``."""
    nl = _engine()
    queries = nl.read_vectors(args.queries)
    if args.radius is not None:
        return _range_search(nl, args, queries)
    if args.max_L is not None or args.entry_cutoff is not None:
        raise ValueError("--max-L and --entry-cutoff are range-search options: give --radius")
    with nl.open(args.index, **_open_options(args), **_READ) as idx:
        opts = _search_options(args)
        if getattr(idx, "kind", "graph") == "partition":
            default_nprobe = (idx.info().get("params") or {}).get("nprobe") or 32
            planned = {"nprobe": opts.get("nprobe", default_nprobe), "L": opts.get("L"),
                       "probe_cut": opts.get("probe_cut"),
                       "threads": opts.get("threads")}
        else:
            planned = idx.plan_search(max(1, len(queries)), **opts)
        t0 = time.perf_counter()
        ids, dists, stats = idx.search(queries, return_stats=True, **opts)
        wall = time.perf_counter() - t0
        entry_kind = idx.entry if getattr(idx, "kind", "graph") == "partition" else str((idx.info().get("entry") or {}).get(
            "kind", args.entry))
    ids = np.asarray(ids)
    dists = np.asarray(dists)
    nq, k = ids.shape
    args.k = k  # what the engine used (its default when --k was not given)
    shown = ("nprobe", "L", "probe_cut", "threads") if "nprobe" in planned else (
        "L", "W", "executor", "page_search", "queries_in_flight", "threads")
    summary: dict[str, Any] = {"nq": nq, "k": args.k, "entry": entry_kind,
                               **{k: planned[k] for k in shown},
                               "seconds": wall, "qps": nq / wall if wall > 0 else None}
    if args.gt:
        gt_ids, _ = nl.read_ground_truth(args.gt)
        summary[f"recall@{args.k}"] = _recall(ids, np.asarray(gt_ids), args.k)
    means = _stats_means(stats)
    summary["mean"] = means
    if stats is not None and "total_us" in stats:
        lat = np.asarray(stats["total_us"], dtype=np.float64) / 1000.0
        summary["latency_ms"] = {"mean": float(lat.mean()), "p50": float(np.percentile(lat, 50)),
                                 "p99": float(np.percentile(lat, 99)), "p99.9": float(np.percentile(lat, 99.9))}
    if args.out:
        out = Path(args.out)
        if out.suffix.lower() == ".npz":
            np.savez(out, ids=ids, distances=dists, **{f"stats_{k}": np.asarray(v) for k, v in (stats or {}).items()})
        else:
            out.write_text(json.dumps({"summary": summary, "ids": ids.tolist(), "distances": dists.tolist()}))
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        rows = [("queries", str(nq)), ("entry", entry_kind)]
        if args.gt:
            rows.append((f"recall@{args.k}", f"{summary[f'recall@{args.k}']:.4f}"))
        rows.append(("QPS", f"{summary['qps']:.0f}" if summary["qps"] else "-"))
        if "latency_ms" in summary:
            lm = summary["latency_ms"]
            rows.append(("latency ms (mean/p99/p99.9)", f"{lm['mean']:.3f} / {lm['p99']:.3f} / {lm['p99.9']:.3f}"))
        _mean_rows(rows, means)
        _print_table(rows)
    return 0


_MEAN_KEYS = ("reads", "refine_reads", "hops", "cache_hits", "adjacency_hits", "replica_hits", "bytes_read",
              "pq_distances", "exact_distances", "io_utilisation", "vertex_utilisation", "path_length")


def _mean_rows(rows: list, means: dict[str, float]) -> None:
    for key in _MEAN_KEYS:
        if key in means:
            rows.append((f"mean {key}", f"{means[key]:.2f}"))


def _search_options(args: argparse.Namespace, stage: str = "search") -> dict[str, Any]:
    """The search (or range search) options given on the command line."""
    return cli_options.given(args, stage)


#: Opens of commands that only read: the index is then opened read-only, so they run beside
#: its writer (another process) and without write permission, and see every update it
#: acknowledged.
_READ = {"read_only": True}


def _update_options(nl: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The open options of a command that updates: a graph index merges a full delta in the
    insert that fills it (a background merge would be cancelled when this process exits)."""
    opts = _open_options(args)
    if nl.kind_of(args.index) == "graph":
        opts["background_updates"] = False
    return opts


def _open_options(args: argparse.Namespace) -> dict[str, Any]:
    """The open options given on the command line."""
    return cli_options.given(args, "open")


def _range_search(nl: Any, args: argparse.Namespace, queries: np.ndarray) -> int:
    """``nearline search INDEX QUERIES --radius R``: range search (CSR output)."""
    if args.k is not None:
        raise ValueError("--k is a k-NN option: a range search (--radius) returns every vector within the radius")
    with nl.open(args.index, **_open_options(args), **_READ) as idx:
        opts = _search_options(args, "range_search")
        L = opts.get("L", cli_options.default("range_search", "L"))
        planned = idx.plan_search(max(1, len(queries)), **{k: v for k, v in opts.items()
                                                             if k in nl.VOCABULARY["options"]["search"] and k != "L"}, L=L)
        t0 = time.perf_counter()
        lims, ids, dists, stats = idx.range_search(queries, args.radius, return_stats=True, **opts)
        wall = time.perf_counter() - t0
    lims, ids, dists = np.asarray(lims), np.asarray(ids), np.asarray(dists)
    nq = len(lims) - 1
    counts = np.diff(lims)
    summary: dict[str, Any] = {"nq": nq, "radius": args.radius,
                               "L": L,
                               "ratio": opts.get("ratio", cli_options.default("range_search", "ratio")),
                               "max_L": args.max_L, "entry_cutoff": args.entry_cutoff,
                               **{k: planned[k] for k in ("W", "executor", "page_search", "queries_in_flight",
                                                          "threads")},
                               "seconds": wall,
                               "qps": nq / wall if wall > 0 else None,
                               "results": int(lims[-1]), "mean_results": float(counts.mean()) if nq else 0.0}
    if args.gt:
        gt_lims, gt_ids, _ = nl.read_range_ground_truth(args.gt)
        summary["AP"] = nl.average_precision(lims, ids, gt_lims, gt_ids)
    means = _stats_means(stats)
    summary["mean"] = means
    if args.out:
        out = Path(args.out)
        if out.suffix.lower() == ".npz":
            np.savez(out, lims=lims, ids=ids, distances=dists)
        else:
            out.write_text(json.dumps({"summary": summary, "lims": lims.tolist(), "ids": ids.tolist(),
                                       "distances": dists.tolist()}))
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        rows = [("queries", str(nq)), ("radius", f"{args.radius:g}"),
                ("results (total / mean per query)", f"{summary['results']} / {summary['mean_results']:.1f}")]
        if "AP" in summary:
            rows.append(("AP", f"{summary['AP']:.4f}"))
        rows.append(("QPS", f"{summary['qps']:.0f}" if summary["qps"] else "-"))
        _mean_rows(rows, means)
        if "doublings" in means:
            rows.append(("mean doublings", f"{means['doublings']:.2f}"))
        _print_table(rows)
    return 0


def cmd_gt(args: argparse.Namespace) -> int:
    """``nearline gt BASE QUERIES [OUT]``: exact k-NN, or range ground truth with ``--radius``/``--mean-neighbors``."""
    nl = _engine()
    radius = args.radius
    if radius is not None and args.k is not None:
        raise ValueError("--k and --radius are exclusive: --k writes k-NN ground truth, --radius range ground truth")
    if args.mean_neighbors is not None and args.k is not None:
        raise ValueError("--k and --mean-neighbors are exclusive: --mean-neighbors picks a radius for range "
                         "ground truth")
    if args.out is None and args.mean_neighbors is None:
        raise ValueError("OUT is required (only --mean-neighbors without OUT just prints the radius)")
    base = nl.read_vectors(args.base)
    queries = nl.read_vectors(args.queries)
    t0 = time.perf_counter()
    if args.mean_neighbors is not None:
        picked = nl.radius_for_mean_neighbors(base, queries, args.mean_neighbors, metric=args.metric,
                                              threads=args.threads)
        what = "squared L2 distance" if args.metric == "l2" else f"{args.metric} score"
        print(f"radius for {args.mean_neighbors:g} mean neighbours per query ({what}): {picked!r}")
        if radius is None:
            radius = picked
        if args.out is None:
            return 0
    if radius is not None:
        lims, ids, dists = nl.compute_range_ground_truth(base, queries, radius, metric=args.metric,
                                                         threads=args.threads)
        nl.write_range_ground_truth(args.out, lims, ids, dists)
        counts = np.diff(np.asarray(lims))
        nq = counts.size
        print(f"wrote {args.out}: {nq} queries, {int(np.asarray(lims)[-1])} results within radius {radius!r} "
              f"({args.metric}); per query mean {counts.mean() if nq else 0.0:.1f}, "
              f"max {counts.max() if nq else 0}, empty {int((counts == 0).sum())}; "
              f"{time.perf_counter() - t0:.1f} s")
        return 0
    k = 100 if args.k is None else args.k
    ids, dists = nl.compute_ground_truth(base, queries, k, metric=args.metric, threads=args.threads)
    nl.write_ground_truth(args.out, ids, dists)
    print(f"wrote {args.out}: {np.asarray(ids).shape[0]} queries x k={k} ({args.metric}) "
          f"in {time.perf_counter() - t0:.1f} s")
    return 0


def cmd_insert(args: argparse.Namespace) -> int:
    """``nearline insert INDEX VECTORS``."""
    nl = _engine()
    vectors = np.asarray(nl.read_vectors(args.vectors))
    if np.issubdtype(vectors.dtype, np.integer):
        vectors = vectors.astype(np.float32)
    if vectors.dtype != np.float32:
        raise ValueError(f"{args.vectors} holds {vectors.dtype} vectors; an insert takes float32 or integer rows")
    ids = _read_ids(args.ids) if args.ids else None
    if ids is not None and len(ids) != len(vectors):
        raise ValueError(f"{args.ids} holds {len(ids)} ids for {len(vectors)} vectors")
    t0 = time.perf_counter()
    done = 0
    with nl.open(args.index, **_update_options(nl, args)) as idx:
        # The whole file first: bad input (a NaN, a live or repeated id, too few
        # automatic ids) commits nothing, and errors name rows of the file.
        idx.validate_insert(vectors, ids)
        for s in range(0, len(vectors), args.batch):
            e = min(len(vectors), s + args.batch)
            try:
                idx.insert(vectors[s:e], None if ids is None else ids[s:e])
            except Exception as err:
                if done == 0:
                    raise
                raise RuntimeError(f"rows 0..{done - 1} of {args.vectors} are inserted (each batch was "
                                   f"logged when it returned); rows {s}..{len(vectors) - 1} are not: {err}") from err
            done = e
        if args.checkpoint:
            idx.checkpoint()
        n = idx.n
    dt = time.perf_counter() - t0
    print(f"inserted {done} vectors into {args.index} in {dt:.2f} s ({done / dt if dt > 0 else 0:.0f}/s); "
          f"{n} live")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    """``nearline delete INDEX IDS...``."""
    nl = _engine()
    ids = list(args.ids)
    if args.ids_file:
        ids.extend(int(x) for x in _read_ids(args.ids_file))
    if not ids:
        raise ValueError("no ids to delete: give them as arguments or with --ids-file")
    with nl.open(args.index, **_update_options(nl, args)) as idx:
        gone = idx.delete(np.asarray(ids, dtype=np.int64))
        if args.checkpoint:
            idx.checkpoint()
        n = idx.n
    print(f"deleted {gone} of {len(ids)} ids from {args.index} (the rest were not live); {n} live")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """``nearline check INDEX``: exit status 1 when the index is inconsistent."""
    nl = _engine()
    with nl.open(args.index, **_READ) as idx:
        rep = idx.check()
    if args.json:
        print(json.dumps(rep, indent=1))
    else:
        _print_table([(k, str(v)) for k, v in rep.items() if k != "problems"])
        for m in rep["problems"]:
            print(f"problem: {m}")
        print("consistent" if not rep["problems"] else f"{len(rep['problems'])} problem(s)")
    return 0 if not rep["problems"] else 1


def cmd_checkpoint(args: argparse.Namespace) -> int:
    """``nearline checkpoint INDEX``."""
    nl = _engine()
    with nl.open(args.index) as idx:
        seq = idx.checkpoint()
    print(f"checkpoint of {args.index} holds the log up to sequence {seq}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """``nearline info INDEX``."""
    nl = _engine()
    with nl.open(args.index, **_READ) as idx:
        info = idx.info()
    if args.json:
        from nearline.peers import jsonable

        print(json.dumps(jsonable(info), indent=1))
    else:
        print(format_info(info))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """``nearline demo``: synthetic data, build, search, a small table."""
    nl = _engine()
    from nearline import datasets

    tmp = None
    if args.workdir:
        work = Path(args.workdir)
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="nearline-demo-")
        work = Path(tmp.name)
    try:
        print(f"demo: {args.n} x {args.dim} synthetic clustered vectors, 1000 queries, workdir {work}")
        base, queries = datasets.synthetic_clustered(args.n, args.dim, seed=args.seed, queries=1000)
        gt_ids, _ = datasets.compute_ground_truth(base, queries, args.k, "l2", args.threads)
        progress = _Progress(not args.quiet)
        t0 = time.perf_counter()
        try:
            idx = nl.build(base, str(work / "demo.index"), threads=args.threads, seed=args.seed, progress=progress,
                           overwrite=True)
        finally:
            progress.close()
        build_s = time.perf_counter() - t0
        info = idx.info()
        idx.close()
        with nl.open(str(work / "demo.index"), threads=args.threads) as idx:
            idx.search(queries[:50], args.k, L=args.L, threads=args.threads)  # warm-up
            t0 = time.perf_counter()
            ids, _d, stats = idx.search(queries, args.k, L=args.L, threads=args.threads, return_stats=True)
            wall = time.perf_counter() - t0
        means = _stats_means(stats)
        rows = [
            (f"recall@{args.k}", f"{_recall(np.asarray(ids), gt_ids, args.k):.4f}"),
            ("QPS", f"{len(queries) / wall:.0f}"),
            ("mean reads/query", f"{means.get('reads', float('nan')):.2f}"),
            ("mean hops", f"{means.get('hops', float('nan')):.2f}"),
            ("build time", f"{build_s:.1f} s"),
        ]
        # preset="auto" (the default): what the planner's rules chose (`nearline plan` says why).
        if info.get("preset"):
            rows.append(("preset (auto's choice)", f"{info['preset']}, layout {(info.get('layout') or {}).get('kind')}"))
            rule = (info.get("build") or {}).get("auto_rule")
            if rule:
                rows.append(("why", rule))
        mem = info.get("memory") or {}
        if "budget" in mem:
            rows.append(("memory budget", f"{_human_bytes(mem['budget'])} (within budget: {mem.get('within_budget')})"))
        _print_table(rows)
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """``nearline bench``."""
    from nearline import bench

    systems = ([] if args.skip_nearline else ["nearline"]) + list(args.compare)
    variants = list(args.variant or [])
    if not systems and not variants:
        raise ValueError("nothing to benchmark: --skip-nearline with an empty --compare and no --variant")
    if args.radius is not None and args.range_neighbors is not None:
        raise ValueError("--radius and --range-neighbors are exclusive: give the radius or how to pick it")
    range_mode = args.radius is not None or args.range_neighbors is not None
    if not range_mode:
        for flag, given in (("--target-ap", args.target_ap), ("--range-methods", args.range_methods),
                            ("--doubling-k0", args.doubling_k0), ("--range-sweep", args.range_sweep),
                            ("--range-start-L", args.range_start_L)):
            if given is not None:
                raise ValueError(f"{flag} needs range mode (--radius or --range-neighbors)")
    range_kw: dict[str, Any] = {"radius": args.radius, "range_neighbors": args.range_neighbors}
    if args.target_ap is not None:
        range_kw["target_aps"] = args.target_ap
    if args.range_methods is not None:
        range_kw["range_methods"] = args.range_methods
    if args.doubling_k0 is not None:
        range_kw["doubling_k0"] = None if args.doubling_k0 == "L" else args.doubling_k0
    if args.range_sweep is not None:
        range_kw["range_sweep"] = args.range_sweep
    if args.range_start_L is not None:
        range_kw["range_start_L"] = args.range_start_L
    cfg = bench.BenchConfig(
        **range_kw,
        data=args.data, systems=systems, variants=variants, baseline=args.baseline,
        target_recalls=args.target_recall or list(bench.TARGET_RECALLS), latency_queries=args.latency_queries,
        perturb=args.perturb, ceiling=not args.no_ceiling, ceiling_depth=args.ceiling_depth,
        ceiling_seconds=args.ceiling_seconds,
        Ls=args.L, nprobes=args.nprobe or [], k=args.k, R=args.R, build_L=args.build_L, alpha=args.alpha,
        pq_bytes=args.pq_bytes, memory_budget=(args.memory_budget or [None])[0],
        equal_budget=args.memory_budget is not None, build_memory_budget=args.build_memory_budget,
        cache_budget=args.cache_budget, entry_points=args.entry_points, entry=args.entry, nav_L=args.nav_L,
        nav_seeds=args.nav_seeds, nav_sample=args.nav_sample, entry_clusters=args.entry_clusters,
        threads=args.threads, W=args.W,
        reps=args.reps, seed=args.seed,
        workdir=Path(args.workdir) if args.workdir else bench.datasets.default_workdir(),
        out=Path(args.out) if args.out else None, plot=Path(args.plot) if args.plot else None,
        queries_repeat=args.queries_repeat, rebuild=args.rebuild, warmup=args.warmup,
        peer_threads=args.peer_threads,
    )
    if args.memory_budget is not None and len(args.memory_budget) > 1:
        if range_mode:
            raise ValueError("several --memory-budget values need k-NN mode (no --radius)")
        sweep = bench.run_budget_sweep(cfg, args.memory_budget, progress=not args.quiet)
        print(bench.format_budget_report(sweep))
        if args.out:
            print(f"results: {args.out} (and one file per budget)")
        if args.plot:
            print(f"plots: {args.plot} per budget, and QPS against the budget")
        return 0
    result = bench.run_bench(cfg, progress=not args.quiet)
    print(bench.format_report(result))
    if args.out:
        print(f"results: {args.out}")
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def cmd_disk_ceiling(args: argparse.Namespace) -> int:
    """``nearline disk-ceiling PATH``: random aligned block reads/s on a file or an index's pages.bin."""
    nl = _engine()
    r = nl.measure_read_ceiling(args.path, block_size=args.block_size, depth=args.depth, seconds=args.seconds,
                                io=args.io)
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    rows = [
        ("file", str(r["path"])),
        ("reads/s", f"{r['reads_per_s']:.0f}"),
        ("MB/s", f"{r['bytes_per_s'] / 1e6:.1f}"),
        ("mean read latency", f"{r['mean_read_latency_us']:.0f} µs (submission to completion reaped)"),
        ("read latency p50/p99/p99.9/max",
         f"{r['latency_p50_us']:.0f} / {r['latency_p99_us']:.0f} / {r['latency_p999_us']:.0f} / "
         f"{r['latency_max_us']:.0f} µs"),
        ("stalls (≥ 10 ms, reads in flight, none completing)",
         f"{r['stalls']} ({r['stall_s'] * 1e3:.0f} ms in all, {r['stalls'] / max(r['elapsed_s'], 1e-9):.1f}/s)"),
        ("reads", str(r["reads"])),
        ("seconds", f"{r['elapsed_s']:.2f}"),
        ("block size", f"{r['block_size']} B"),
        ("queue depth", str(r["depth"])),
        ("engine", r["engine"]),
        ("O_DIRECT", "yes" if r["direct_io"] else "no (the file system refused it: reads may be cached)"),
    ]
    _print_table(rows)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """``nearline plan DATA_OR_INDEX``: the resolved plan and the rule behind each choice."""
    nl = _engine()
    target = Path(args.target)
    if target.is_dir():
        plan = nl.plan(target, nq=args.nq, **_open_options(args))
    else:
        plan = nl.plan(target, **_build_options(args))
    if args.json:
        print(json.dumps(plan, indent=1))
        return 0
    print(format_plan(plan))
    return 0


def _add_build_options(p: argparse.ArgumentParser, *, plan: bool = False) -> None:
    """The build options, generated from the engine's schema (``--overwrite`` only for a build)."""
    cli_options.add(p, "build", exclude=("overwrite",) if plan else ())


# --------------------------------------------------------------------------- parser


class _HelpFormatter(argparse.HelpFormatter):
    """Appends each option's default to its help (``--flag``: off), unless the help names it already.

    Options whose default is ``None`` are left to the engine: their help states the
    engine's default in words (tests check that every option's help has one).
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default is None or action.default is argparse.SUPPRESS:
            return text
        if isinstance(action, argparse._StoreTrueAction):
            return f"{text} (default: off)"
        d = action.default
        shown = ",".join(str(x) for x in d) if isinstance(d, (list, tuple)) else str(d)
        return f"{text} (default: {shown.replace('%', '%%')})"


def _global_flags(p: argparse.ArgumentParser, *, top: bool) -> None:
    """``--debug``, ``-v``, ``-q``: on the top parser and again on every subcommand (so they work
    after it too); a subcommand's copies default to SUPPRESS so they never undo the top ones."""
    kw: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    p.add_argument("--debug", action="store_true", help="show tracebacks of engine errors (default: off)", **kw)
    p.add_argument("-v", "--verbose", action="store_true", help="log INFO messages (default: off)", **kw)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars (default: off)", **kw)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the ``nearline`` command."""
    import nearline

    parser = argparse.ArgumentParser(prog="nearline", description="nearline: disk-resident vector search",
                                     formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"nearline {nearline.__version__}")
    _global_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_parser = sub.add_parser

    def sub_parser(name: str, **kw: Any) -> argparse.ArgumentParser:
        p = add_parser(name, formatter_class=_HelpFormatter, **kw)
        _global_flags(p, top=False)
        return p

    sub.add_parser = sub_parser  # type: ignore[method-assign]

    p = sub.add_parser("demo", help="build and search a synthetic data set")
    p.add_argument("--n", type=_positive_int, default=20000, help="vectors to generate")
    p.add_argument("--dim", type=_positive_int, default=64, help="their dimension")
    p.add_argument("--k", type=_positive_int, default=10, help="neighbours per query")
    p.add_argument("--L", type=_positive_int, default=None, help="search list size (default: max(k, 100))")
    p.add_argument("--threads", type=_positive_int, default=None, help="threads (default: all cores)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data and the build")
    p.add_argument("--workdir", default=None, help="keep the data and index here (default: a temp dir)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("build", help="build an index")
    p.add_argument("data", help="vector file (.fbin/.u8bin/.i8bin/.f16bin/.bin/.fvecs/.bvecs/.npy)")
    p.add_argument("out", help="index path")
    _add_build_options(p)
    p.add_argument("--ids", default=None, metavar="IDS_FILE",
                   help="external ids, one per row: .npy, .txt (one per line), .csv, or .bin (header: u32 count, "
                        "u32 1; then count x u64 little-endian); default: row numbers")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("plan", help="show what a build or an open would choose, and why, without doing it")
    p.add_argument("target", help="a vector file (the build's plan) or an index directory (the open's plan)")
    _add_build_options(p, plan=True)
    cli_options.add(p, "open", only=("cache_nodes", "cache", "io", "entry", "entry_points", "nav_L", "nav_seeds"),
                    prefix="index: ")
    p.add_argument("--nq", type=_positive_int, default=10000, help="index: queries of the planned batch")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("search", help="search an index")
    p.add_argument("index", help="index directory")
    p.add_argument("queries", help="query vector file")
    p.add_argument("--gt", default=None, help="ground-truth file: recall@k is reported (default: none)")
    p.add_argument("--out", default=None, help="write results to OUT.json or OUT.npz (default: none)")
    p.add_argument("--radius", type=_finite_float, default=None,
                   help="range search: squared L2 distance bound (or ip/cosine score floor); --gt then names a "
                        "range ground-truth file and AP is reported (default: none, k-NN search)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    # The engine's options: the search's, a range search's own, and the open's (the index is
    # opened read-only, so the update options are left out).
    cli_options.add(p, "search")
    cli_options.add(p, "range_search", prefix="range search: ")
    cli_options.add(p, "open", exclude=("durability", "background_updates", "read_only"))
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("insert", help="insert vectors into an index (a graph index: as its build chose: out of place, the insert that fills the delta merges it; in place, the records are rewritten)")
    p.add_argument("index", help="index directory")
    p.add_argument("vectors", help="float32 vector file (.fbin/.fvecs/.npy)")
    p.add_argument("--ids", default=None, metavar="IDS_FILE",
                   help="their ids, one per row: .npy, .txt (one per line), .csv, or .bin (header: u32 count, "
                        "u32 1; then count x u64 little-endian); default: new ids above every id seen")
    p.add_argument("--batch", type=_positive_int, default=10000, help="vectors per logged insert")
    cli_options.add(p, "open", only=("durability",))
    p.add_argument("--checkpoint", action="store_true", help="write a checkpoint afterwards")
    p.set_defaults(func=cmd_insert)

    p = sub.add_parser("delete", help="delete ids from an index")
    p.add_argument("index", help="index directory")
    p.add_argument("ids", nargs="*", type=_nonneg_int, help="ids to delete (default: none; see --ids-file)")
    p.add_argument("--ids-file", default=None,
                   help="ids to delete from a file: .npy, .txt, .csv, or .bin (header: u32 count, u32 1; then "
                        "count x u64 little-endian); default: none")
    cli_options.add(p, "open", only=("durability",))
    p.add_argument("--checkpoint", action="store_true", help="write a checkpoint afterwards")
    p.set_defaults(func=cmd_delete)

    p = sub.add_parser("check", help="verify an index's internal consistency (pages, edges, reachability, update maps)")
    p.add_argument("index", help="index directory")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("checkpoint", help="write an index's checkpoint (a graph index: merge its updates) and trim its log")
    p.add_argument("index", help="index directory")
    p.set_defaults(func=cmd_checkpoint)

    p = sub.add_parser("gt", help="compute exact ground truth (k-NN, or range search with --radius)")
    p.add_argument("base", help="base vector file")
    p.add_argument("queries", help="query vector file")
    p.add_argument("out", nargs="?", default=None,
                   help="output file (k-NN: DiskANN ground truth; range: DiskANN range ground truth + distances)")
    p.add_argument("--k", type=_positive_int, default=None, help="neighbours per query (default 100)")
    p.add_argument("--radius", type=_finite_float, default=None, metavar="R",
                   help="write range ground truth: every vector with squared L2 distance <= R (l2) or score >= R "
                   "(ip, cosine) (default: none, k-NN ground truth)")
    p.add_argument("--mean-neighbors", type=_positive_float, default=None, metavar="N",
                   help="print the radius at which queries have N exact neighbours on average; without --radius, "
                   "write range ground truth at it (if OUT is given; default: none)")
    p.add_argument("--metric", default="l2", choices=_vocab()["metrics"], help="similarity")
    p.add_argument("--threads", type=_positive_int, default=None, help="threads (default: all cores)")
    p.set_defaults(func=cmd_gt)

    p = sub.add_parser("info", help="describe an index")
    p.add_argument("index", help="index directory")
    p.add_argument("--json", action="store_true", help="print the info as JSON")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("bench", help="benchmark against diskannpy and in-memory references")
    p.add_argument("--data", required=True, help="synthetic:N:DIM[:SEED] | wordnet:PATH | hdf5:PATH | "
                   "files:BASE,QUERIES[,GT] (required, no default)")
    p.add_argument("--compare", type=_systems, default=["diskannpy"], help="peers, comma-separated "
                   "(diskannpy,faiss-hnsw,hnswlib; diskannpy@T: diskannpy on T threads)")
    p.add_argument("--peer-threads", type=_thread_counts, default=None, metavar="T[,T...]",
                   help="diskannpy runs one query per thread while nearline interleaves several: diskannpy also "
                   "runs at these thread counts (as diskannpy@T, same index, no latency run) and the report "
                   "gives nearline's QPS ratio against its best one beside the equal-threads ratio (default: "
                   "2x and 4x --threads; 'none' for none)")
    p.add_argument("--skip-nearline", action="store_true",
                   help="leave out the plain nearline system (variants and peers still run)")
    p.add_argument("--variant", type=_variant, action="append", default=[], metavar="NAME:key=value[,...]",
                   help="a named nearline configuration (repeatable); keys go to build (R, build_L, alpha, passes, "
                   "pq_bytes, saturate, page_size, preset, nav_sample, entry_clusters), open (memory_budget, "
                   "cache_nodes, entry, entry_points, io), search (W, executor, adaptive_beam, early_dispatch, "
                   "queries_in_flight) or range search only (ratio, max_L); variants with equal build keys share "
                   "one build")
    p.add_argument("--baseline", default=None, metavar="NAME",
                   help="the system ratios divide by (default: the first --compare peer, else the first system)")
    p.add_argument("--target-recall", type=_recalls, default=None, metavar="R[,R...]",
                   help="recalls at which ratios are interpolated (default 0.90,0.95,0.99)")
    p.add_argument("--radius", type=_finite_float, default=None, metavar="R",
                   help="range mode: every system answers range search at radius R (squared L2 distance, or "
                   "ip/cosine score), scored by average precision (AP) against exact range ground truth "
                   "(default: none, k-NN mode)")
    p.add_argument("--range-neighbors", type=_positive_float, default=None, metavar="N",
                   help="range mode with the radius at which queries have N exact neighbours on average "
                   "(default: none)")
    p.add_argument("--target-ap", type=_recalls, default=None, metavar="AP[,AP...]",
                   help="range mode: APs at which ratios are interpolated (default 0.80,0.90,0.95)")
    p.add_argument("--range-methods", type=_range_methods, default=None, metavar="M[,M...]",
                   help="range mode, nearline: native (Index.range_search, reported as NAME) and/or doubling "
                   "(k-NN with doubling k, reported as NAME+doubling; peers always use it); default both")
    p.add_argument("--doubling-k0", type=_k0, default=None, metavar="K|L",
                   help="range mode: first k of the doubling baseline (default 10; L = the sweep's L)")
    p.add_argument("--range-sweep", choices=("L", "max_L"), default=None,
                   help="range mode: what the --L values set for native range search: L (its first list size; "
                   "default) or max_L (how far its list doubling may go, from --range-start-L); the doubling "
                   "baseline always sweeps its k-NN list size")
    p.add_argument("--range-start-L", type=_positive_int, default=None, metavar="L",
                   help="range mode with --range-sweep max_L: the native search's first list size (default 10)")
    p.add_argument("--latency-queries", type=_nonneg_int, default=10000,
                   help="queries per L in the closed-loop latency run (perturbed copies of the query set; "
                   "0 = no latency run)")
    p.add_argument("--perturb", type=_nonneg_float, default=0.01,
                   help="latency-run noise: this fraction of each dimension's standard deviation over the queries")
    p.add_argument("--ceiling-depth", type=_depth, default=32, help="queue depth of the disk-ceiling measurement")
    p.add_argument("--ceiling-seconds", type=_positive_float, default=3.0,
                   help="duration of each disk-ceiling measurement")
    p.add_argument("--no-ceiling", action="store_true", help="do not measure the disk ceiling")
    p.add_argument("--L", type=_int_list, default=[10, 20, 30, 50, 70, 100, 150, 200],
                   help="search list sizes of the sweep")
    p.add_argument("--nprobe", type=_int_list, default=None,
                   help="the sweep of partition-index variants (preset=spfresh): postings read per query, shown in "
                   "the L column (default: the --L values)")
    p.add_argument("--k", type=_positive_int, default=10, help="neighbours per query")
    p.add_argument("--R", type=_positive_int, default=64, help="maximum degree (every disk system)")
    p.add_argument("--build-L", type=_positive_int, default=100, help="build candidate list size (every disk system)")
    p.add_argument("--alpha", type=float, default=1.2, help="pruning α (every disk system)")
    p.add_argument("--pq-bytes", type=_positive_int, default=None,
                   help="PQ bytes per vector (default: nearline's choice, which diskannpy then gets too)")
    p.add_argument("--memory-budget", type=_budget_list, default=None, metavar="B[,B...]",
                   help="the same search memory budget for every system (fractions of the raw vectors, or "
                   "bytes): nearline builds and opens with it; diskannpy gets it as search_memory_maximum "
                   "(its rule picks the PQ bytes) and a node cache for what its codes leave. Several values "
                   "run one benchmark each and plot QPS against the budget (default: nearline sizes its "
                   "own budget, diskannpy gets nearline's PQ bytes)")
    p.add_argument("--build-memory-budget", type=_budget, default=None,
                   help="memory the builds may use (default: nearline's plan; diskannpy: 4x the raw vectors, "
                   "at least 1 GB)")
    p.add_argument("--cache-budget", type=_budget, default=0, help="node cache at search (both disk systems)")
    _add_entry_options(p, bench=True)
    p.add_argument("--nav-sample", type=_finite_float, default=0.0, metavar="F",
                   help="nearline: build a navigation graph over this fraction of the vectors (e.g. 0.01)")
    p.add_argument("--entry-clusters", type=_nonneg_int, default=0, metavar="C",
                   help="nearline: build k-means centroid entry points (e.g. 300)")
    p.add_argument("--threads", type=_positive_int, default=None, help="search threads of every system "
                   "(default: all cores)")
    p.add_argument("--W", type=_positive_int, default=4, help="beam width of every disk system")
    p.add_argument("--reps", type=_positive_int, default=3, help="alternating repetitions")
    p.add_argument("--seed", type=int, default=0, help="seed of the builds and the perturbations")
    p.add_argument("--workdir", default=None, help="data, indexes and logs (default: $NEARLINE_WORKDIR or "
                   "./bench-out)")
    p.add_argument("--out", default=None, help="results JSON (default: none)")
    p.add_argument("--plot", default=None, help="QPS-recall PNG (default: none)")
    p.add_argument("--queries-repeat", type=_positive_int, default=1,
                   help="times the query set is searched in each recall batch")
    p.add_argument("--warmup", type=int, default=100, help="warm-up queries per search process")
    p.add_argument("--rebuild", action="store_true", help="rebuild cached indexes")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("disk-ceiling", help="measure random block reads/s on a file (the disk's ceiling)")
    p.add_argument("path", help="a file, or an index directory (its pages.bin)")
    p.add_argument("--depth", type=_depth, default=32, help="reads in flight (1..256)")
    p.add_argument("--block-size", type=_block_size, default=None,
                   help="bytes per read, a multiple of 4096 (default: an index's read size, else 4096)")
    p.add_argument("--seconds", type=_positive_float, default=3.0, help="how long to read")
    p.add_argument("--io", default="auto", choices=_vocab()["io_engines"], help="I/O engine")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_disk_ceiling)

    from . import cli_distributed, cli_serve

    cli_serve.register(sub)
    cli_distributed.register(sub)
    return parser


def _engine_errors() -> tuple[type[BaseException], ...]:
    # TypeError: the engine refuses wrongly typed input (float ids, say) with it.
    errs: list[type[BaseException]] = [ValueError, TypeError, OSError]
    try:
        from nearline.bench import BenchError

        errs.append(BenchError)
    except ImportError:  # pragma: no cover
        pass
    nl = sys.modules.get("nearline")
    for name in ("NearlineError", "Error"):
        e = getattr(nl, name, None) if nl is not None else None
        if isinstance(e, type) and issubclass(e, BaseException):
            errs.append(e)
    return tuple(errs)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console entry point; returns the exit status (also used by ``sys.exit``)."""
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    # Subcommands without -q inherit the global flag.
    args.quiet = bool(getattr(args, "quiet", False))
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        msg = "build cancelled" if args.command in ("build", "demo") else "interrupted"
        print(f"nearline: {msg}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except _engine_errors() as e:
        if args.debug:
            raise
        if args.command == "build" and type(e).__name__ in ("Cancelled", "CancelledError"):
            print("nearline: build cancelled", file=sys.stderr)
            return EXIT_INTERRUPTED
        print(f"nearline: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_ERROR


def _one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    if isinstance(e, OSError) and e.filename and str(e.filename) not in text:
        text = f"{e.filename}: {text}"
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
