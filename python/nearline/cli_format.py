"""Text output of the ``nearline`` command line: ``nearline info`` and ``nearline plan``."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np


def _human_bytes(n: Any) -> str:
    if not isinstance(n, (int, float)) or isinstance(n, bool):
        return str(n)
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return str(n)


def _flatten(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(d, dict):
        out = []
        for k, v in d.items():
            out.extend(_flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(d, list) and d and all(isinstance(x, dict) and {"what", "value", "rule"} <= set(x) for x in d):
        # A plan's decisions: one row each, the value with the rule that chose it.
        return [(f"{prefix}{x['what']}", f"{x['value']}  ({x['rule']})") for x in d]
    return [(prefix[:-1], d)]


def _short(v: Any) -> str:
    """A value for a table: floats rounded to 4 significant digits (1 decimal from 1000 up), the
    float32 noise of stored options (1.2000000476837158) gone."""
    if isinstance(v, float) and np.isfinite(v):
        if v == int(v) and abs(v) < 1e15:
            return str(int(v))
        return f"{v:.1f}" if abs(v) >= 1000 else f"{v:.4g}"
    return str(v)


def format_info(info: dict[str, Any]) -> str:
    """Two-column table of an ``Index.info()`` dict (nested keys dotted, the API's option names;
    memory in human units; floats rounded)."""
    rows = []
    first = ("path", "n", "dim", "dtype", "metric", "preset", "R", "pq_bytes", "page_size", "records_per_page")
    flat = _flatten(info)
    flat.sort(key=lambda kv: first.index(kv[0]) if kv[0] in first else len(first))  # stable: rest keep order
    for key, val in flat:
        if isinstance(val, (list, tuple)):
            val = ", ".join(_short(v) for v in val)
        elif key.startswith("memory.") and not key.endswith(
            ("nodes", "within_budget", "budget_auto", "borrows", "_covered", "_error")
        ) or (
            key.endswith(("bytes", "budget")) and not key.endswith("pq_bytes")
        ):
            if isinstance(val, (int, float)) and not isinstance(val, bool):
                val = f"{_human_bytes(val)} ({_short(val)})"
        rows.append((key, _short(val)))
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def format_plan(plan: dict[str, Any]) -> str:
    """A plan as text: each decision with its rule, then the memory split."""
    lines: list[str] = []

    def decisions(title: str, ds: list[dict[str, Any]]) -> None:
        lines.append(title)
        width = max((len(d["what"]) for d in ds), default=0)
        for d in ds:
            lines.append(f"  {d['what']:<{width}}  {d['value']:<12}  {d['rule']}")

    if plan.get("kind") == "partition":
        return _format_partition_plan(plan, decisions, lines)
    if "plan" in plan:
        b = plan["plan"]
        lines.append(f"build: preset {b['preset']}, R {b['R']}, build_L {b['build_L']}, PQ {b['pq_bytes']} bytes, "
                     f"layout {b['layout']}, nav_sample {b['nav_sample']}, threads {b['threads']}")
        decisions("build decisions:", plan["decisions"])
    else:
        lines.append(f"index {plan['index']}: {plan['preset']}, n={plan['n']}, dim={plan['dim']} {plan['dtype']}, "
                     f"entry {plan['entry']}, {plan['threads']} threads")
        decisions("open decisions:", plan["open"])
    mem = plan["memory"]
    lines.append("memory (bytes):")
    for k in ("budget", "minimum", "pq_codes", "pq_codebook", "ids", "layout_map", "entry", "worker_scratch",
              "cache", "cache_nodes"):
        lines.append(f"  {k:<15} {_human_bytes(mem[k]) if k != 'cache_nodes' else mem[k]}")
    if "search_L_covered" in mem:
        lines.append(f"  the workers' share holds a search of one query per worker up to L {mem['search_L_covered']}"
                     f" ({plan['search']['threads']} threads); a larger"
                     " search borrows from the cache while it runs")
    s = plan["search"]
    lines.append(f"default search: {s['executor']}, L {s['L']}, W {s['W']}, page {s['page_search']}, "
                 f"{s['queries_in_flight']} queries in flight × {s['threads']} threads")
    decisions("search decisions:", s["decisions"])
    return "\n".join(lines)


def _format_partition_plan(plan: dict[str, Any], decisions: Callable[[str, list], None],
                           lines: list[str]) -> str:
    """A partition index's plan (a build's, or an index's open) as text."""
    p = plan["params"]
    params = (f"posting_limit {p['posting_limit']}, merge_threshold {p['merge_threshold']}, replicas "
              f"{p['replicas']}, head_ratio {p['head_ratio']:.4g}, {'LIRE' if p['lire'] else 'SPANN+'}")
    if "index" not in plan:
        lines.append(f"build: preset {plan['preset']} (partition index), {params}")
        decisions("build decisions:", plan["decisions"])
        lines.append(f"memory (bytes): about {_human_bytes(plan['expected_resident_bytes'])} held open "
                     f"(budget {_human_bytes(p['memory_budget'])})")
        return "\n".join(lines)
    lines.append(f"index {plan['index']}: {plan['preset']} (partition index), n={plan['n']}, dim={plan['dim']} "
                 f"{plan['dtype']}, {plan['metric']}, {plan['threads']} threads")
    lines.append(f"  {params}")
    decisions("open decisions:", plan["open"])
    mem = plan["memory"]
    lines.append("memory (bytes, estimated; the open measures and enforces it):")
    for k in ("budget", "expected_resident", "heads", "id_maps", "io_buffers"):
        v = mem[k]
        lines.append(f"  {k:<17} {'none' if v is None else _human_bytes(v)}")
    s = plan["search"]
    lines.append(f"default search: nprobe {s['nprobe']}, head list L {s['L']}, {s['queries_in_flight']} queries in "
                 f"flight × {plan['threads']} threads")
    cal = s.get("calibration")
    if cal:
        tried = ", ".join(f"{p['nprobe']}: {p['recall']:.3f}" for p in cal["points"])
        how = "reached" if cal["reached"] else "not reached by the largest nprobe tried"
        lines.append(f"  nprobe calibrated at build for recall_target {cal['target']}: the sample's recall@10 must "
                     f"reach {cal['aim']:.3f} ({how}) on {cal['queries']} data vectors; nprobe: recall {tried}")
    else:
        lines.append("  nprobe: the default 32 (the index was built before nprobe was calibrated)")
    return "\n".join(lines)
