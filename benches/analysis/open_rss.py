"""Resident memory an open index adds, against its memory budget.

For each index directory, in a fresh subprocess: load the queries, read the
process's resident set (``VmRSS``), open the index (its own budget, or
``--memory-budget``), search the queries in one batch, read ``VmRSS`` again.
Prints one JSON line per index: the budget, ``info()["memory"]`` (the
planned split and what is held), and the RSS the open and the search added,
as bytes and as a fraction of the budget.

    python benches/analysis/open_rss.py --queries Q.fbin [--memory-budget 0.1] INDEX...
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def child(index: str, queries: str, budget: str | None, k: int) -> None:
    import numpy as np

    import nearline

    q = np.ascontiguousarray(nearline.read_vectors(queries), dtype=np.float32)
    before = rss_bytes()
    kw = {} if budget is None else {"memory_budget": float(budget) if "." in budget else budget}
    idx = nearline.open(index, **kw)
    opened = rss_bytes()
    idx.search(q, k)
    searched = rss_bytes()
    mem = idx.info()["memory"]
    b = int(mem["budget"])
    print(json.dumps({
        "index": index, "preset": idx.info()["preset"], "budget": b, "within_budget": mem.get("within_budget"),
        "budget_auto": mem.get("budget_auto"), "held_total": mem.get("total"),
        "rss_open": opened - before, "rss_open_and_search": searched - before,
        "rss_fraction_of_budget": (searched - before) / b if b else None,
    }))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("indexes", nargs="+")
    ap.add_argument("--queries", required=True, help="query vector file (searched in one batch)")
    ap.add_argument("--memory-budget", default=None, help="open with this budget (default: the index's)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.indexes[0], a.queries, a.memory_budget, a.k)
        return 0
    for ix in a.indexes:
        cmd = [sys.executable, __file__, "--child", ix, "--queries", a.queries, "--k", str(a.k)]
        if a.memory_budget is not None:
            cmd += ["--memory-budget", a.memory_budget]
        r = subprocess.run(cmd, capture_output=True, text=True)
        sys.stdout.write(r.stdout)
        if r.returncode != 0:
            sys.stderr.write(r.stderr)
            return r.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
