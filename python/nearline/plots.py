"""QPS-recall (and tail latency-recall) plots for ``nearline bench`` (matplotlib, Agg backend)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Optional, Union

log = logging.getLogger(__name__)


def plot_qps_recall(
    summary: dict[str, dict[str, Any]],
    path: Union[str, os.PathLike],
    *,
    k: int = 10,
    title: Optional[str] = None,
    accuracy: str = "recall",
) -> Path:
    """Writes a PNG with one QPS-vs-recall curve per system (log QPS axis).

    ``summary`` maps a system name (a peer, ``nearline`` or a variant) to
    ``{"points": [{"L", "recall", "qps", "lat_p999_ms"?}, ...]}``. When any point
    has ``lat_p999_ms`` a second panel shows p99.9 latency against recall.
    ``accuracy="ap"`` plots range search's average precision instead of recall.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_tail = any(p.get("lat_p999_ms") for s in summary.values() for p in s.get("points", []))
    fig, axes = plt.subplots(1, 2 if has_tail else 1, figsize=(13 if has_tail else 7, 5), dpi=120, squeeze=False)
    ax, tail = axes[0][0], (axes[0][1] if has_tail else None)
    acc = accuracy
    xlabel = f"recall@{k}" if acc == "recall" else ("average precision" if acc == "ap" else acc)
    markers = "osD^v<>p*"
    for i, (system, s) in enumerate(summary.items()):
        marker = markers[i % len(markers)]
        pts = [p for p in s.get("points", []) if p.get(acc) is not None and p.get("qps")]
        if pts:
            ax.plot([p[acc] for p in pts], [p["qps"] for p in pts], marker=marker, label=system)
            for p in pts:
                ax.annotate(str(p["L"]), (p[acc], p["qps"]), fontsize=6, xytext=(2, 2),
                            textcoords="offset points")
        lat = [p for p in s.get("points", []) if p.get(acc) is not None and p.get("lat_p999_ms")]
        if tail is not None and lat:
            tail.plot([p[acc] for p in lat], [p["lat_p999_ms"] for p in lat], marker=marker, label=system)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("queries per second (log)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    if tail is not None:
        tail.set_yscale("log")
        tail.set_xlabel(xlabel)
        tail.set_ylabel("p99.9 latency, ms (log)")
        tail.grid(True, which="both", alpha=0.3)
        tail.legend()
    if title:
        fig.suptitle(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    log.info("wrote %s", path)
    return path


def plot_qps_budget(
    curve: dict[str, dict[str, list[Any]]],
    path: Union[str, os.PathLike, None],
    *,
    target: float = 0.95,
    title: Optional[str] = None,
) -> Optional[Path]:
    """Writes a PNG of QPS at recall ``target`` against the memory budget (fraction of the raw
    vectors), one line per system; ``curve`` maps a system to ``{"budget": [...], "0.95": [...]}``.
    Budgets where a system never reached the recall are left out of its line."""
    if path is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5), dpi=120)
    key = f"{target:.2f}"
    markers = "osD^v<>p*"
    for i, (system, row) in enumerate(curve.items()):
        pts = [(b, q) for b, q in zip(row.get("budget", []), row.get(key, [])) if q]
        if pts:
            ax.plot([b * 100 for b, _ in pts], [q for _, q in pts], marker=markers[i % len(markers)], label=system)
    ax.set_xlabel("memory budget, % of the raw vector bytes")
    ax.set_ylabel(f"QPS at recall {target:.2f} (log)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title, fontsize=9)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    log.info("wrote %s", path)
    return path
