"""The automatic planner against every preset, per cell (issue 31).

Reads ``nearline bench`` result files that ran an ``auto`` variant
(``--variant auto:preset=auto,W=none``) beside named presets and diskannpy,
and prints one row per file and target recall: the preset ``auto`` chose,
its QPS against the best named preset and against diskannpy (all from the
same run's ``comparisons``), and which preset was best. A system that never
reaches the target in the run's sweep has no QPS there (``-``).

    python benches/analysis/auto_cells.py FILE.json [FILE.json ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def cells(path: Path) -> list[dict]:
    d = json.loads(path.read_text())
    comps = d.get("comparisons", {})
    if "auto/diskannpy" not in comps:
        raise SystemExit(f"{path}: no auto/diskannpy comparison (run the bench with an 'auto' variant and diskannpy)")
    chosen = d["builds"]["auto"]["info"]["build"]["preset"]
    budget = d["params"].get("memory_budget")
    out = []
    for target, a in comps["auto/diskannpy"]["at_recall"].items():
        presets = {}
        for key, c in comps.items():
            name, _, peer = key.partition("/")
            if peer != "diskannpy" or name == "auto" or name.startswith("diskannpy"):
                continue
            q = c["at_recall"].get(target, {}).get("qps_a")
            if q is not None:
                presets[name] = q
        best = max(presets, key=presets.get) if presets else None
        qa, qp = a.get("qps_a"), a.get("qps_b")
        out.append({
            "file": path.name, "data": d["dataset"]["name"], "budget": budget,
            "budget_bytes": d["builds"]["auto"]["info"]["build"]["memory_budget"],
            "within_budget": d["builds"]["auto"]["info"].get("memory", {}).get("within_budget"),
            "target": float(target), "auto_chose": chosen, "auto_qps": qa, "diskannpy_qps": qp,
            "best_preset": best, "best_qps": presets.get(best) if best else None,
            "auto_vs_best": round(qa / presets[best], 3) if qa and best else None,
            "auto_vs_diskannpy": round(qa / qp, 3) if qa and qp else None,
            "presets": presets,
        })
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    a = p.parse_args(argv)
    rows = [r for f in a.files for r in cells(f)]
    print("| data | budget | recall | auto chose | auto QPS | best preset (QPS) | auto / best | auto / diskannpy |")
    print("|---|---|---|---|---|---|---|---|")
    fmt = lambda x: "-" if x is None else f"{x:,.0f}" if isinstance(x, float) and x > 10 else f"{x}"
    for r in rows:
        print(f"| {r['data']} | {r['budget']} ({r['budget_bytes']:,} B) | {r['target']} | {r['auto_chose']} | "
              f"{fmt(r['auto_qps'])} | {r['best_preset']} ({fmt(r['best_qps'])}) | {fmt(r['auto_vs_best'])} | "
              f"{fmt(r['auto_vs_diskannpy'])} |")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
