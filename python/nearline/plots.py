"""QPS-recall plots for ``nearline bench`` (matplotlib, Agg backend)."""

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
) -> Path:
    """Writes a PNG with one QPS-vs-recall curve per system (log QPS axis).

    ``summary`` maps a system name to ``{"points": [{"L", "recall", "qps"}, ...]}``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5), dpi=120)
    markers = "osD^v<>p*"
    for i, (system, s) in enumerate(summary.items()):
        pts = [p for p in s.get("points", []) if p.get("recall") is not None and p.get("qps")]
        if not pts:
            continue
        ax.plot([p["recall"] for p in pts], [p["qps"] for p in pts], marker=markers[i % len(markers)],
                label=system)
        for p in pts:
            ax.annotate(str(p["L"]), (p["recall"], p["qps"]), fontsize=6, xytext=(2, 2),
                        textcoords="offset points")
    ax.set_yscale("log")
    ax.set_xlabel(f"recall@{k}")
    ax.set_ylabel("queries per second (log)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    log.info("wrote %s", path)
    return path
