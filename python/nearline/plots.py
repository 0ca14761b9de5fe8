"""QPS-recall (and tail latency), QPS-budget and roofline plots for ``nearline bench`` (matplotlib, Agg)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Optional, Union

log = logging.getLogger(__name__)

#: File formats the plots are written in, by suffix (matplotlib's raster and vector writers).
IMAGE_FORMATS = frozenset({"png", "svg", "pdf", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp"})


def image_path(path: Union[str, os.PathLike]) -> Path:
    """``path`` as an image file name: a name without an image format of its own (``x``, or
    ``x-b0.1`` as a budget sweep names its plots) gets ``.png`` appended, so that the part
    after a dot is never taken for a format."""
    path = Path(path)
    if path.suffix.lower().lstrip(".") not in IMAGE_FORMATS:
        path = path.with_name(path.name + ".png")
    return path


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
    path = image_path(path)
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
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    else:
        ax.text(0.5, 0.5, f"no system reached recall {target:.2f} at any budget", transform=ax.transAxes,
                ha="center", va="center")
    if title:
        ax.set_title(title, fontsize=9)
    path = image_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    log.info("wrote %s", path)
    return path


def plot_roofline(
    roofline: dict[str, dict[str, Any]],
    path: Union[str, os.PathLike, None],
    *,
    title: Optional[str] = None,
) -> Optional[Path]:
    """Writes a PNG with one horizontal stacked bar per system that has a time split: distance,
    I/O wait and other time per query, in µs (AlayaLaser's Figure 1, compute- against I/O-bound).

    ``roofline`` is :func:`nearline.bench.roofline_summary`'s result. Systems
    without the split (``available`` False: the peers) are left out. A system
    whose engine reports no ``dist_us`` gets its I/O wait and one hatched
    segment, "distance + other (not split)", instead of inventing the split.
    Returns None (and writes nothing) when ``path`` is None or no system has a split.
    """
    if path is None:
        return None
    rows = [(system, r) for system, r in roofline.items() if r.get("available")]
    if not rows:
        log.info("no system reports a per-query time split: no roofline plot")
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 1.8 + 0.5 * len(rows)), dpi=120)
    colors = {"distance": "tab:orange", "I/O wait": "tab:blue", "other": "tab:gray"}
    labelled: set[str] = set()

    def bar(y: int, left: float, width: float, label: str, **kw: Any) -> None:
        ax.barh(y, width, left=left, label=None if label in labelled else label, **kw)
        labelled.add(label)

    for y, (_system, r) in enumerate(rows):
        io = float(r.get("io_wait_us") or 0.0)
        if r.get("dist_us") is not None:
            dist = float(r["dist_us"])
            bar(y, 0.0, dist, "distance", color=colors["distance"])
            bar(y, dist, io, "I/O wait", color=colors["I/O wait"])
            bar(y, dist + io, float(r.get("other_us") or 0.0), "other", color=colors["other"])
        else:
            bar(y, 0.0, io, "I/O wait", color=colors["I/O wait"])
            bar(y, io, float(r.get("non_io_us") or 0.0), "distance + other (not split: no dist_us)",
                color="white", edgecolor=colors["other"], hatch="//")
        total = r.get("total_us")
        share = r.get("dist_share")
        if total is not None:
            text = f"{total:.0f} µs" + (f", distance {100 * share:.0f}%" if share is not None else "")
            ax.annotate(text, (float(total), y), xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize=7)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([system for system, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time per query, µs")
    ax.margins(x=0.2)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3 if len(rows) < 4 else -0.15), ncol=4,
              frameon=False)
    if title:
        ax.set_title(title, fontsize=9)
    path = image_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    log.info("wrote %s", path)
    return path
