"""Child process of ``test_budget_borrow.py``: opens one index at each budget and runs a grid of searches,
measuring what the budget checks of this project measure (``VmRSS`` against a baseline taken after a warm-up
and ``malloc_trim``), and prints one JSON row per search.

Each search runs in a thread while this one samples the resident set and ``info()["memory"]["within_budget"]``
until it ends (the search releases the GIL); after it, the resident set is measured again once freed memory has
been handed back, as ``test_index.py::test_rss_delta_within_budget`` does.

Usage: ``python budget_grid_child.py JSON`` with keys ``index``, ``queries``, ``budgets`` (fractions) and
``points`` (``[L, W, threads, queries_in_flight]`` lists).
"""

from __future__ import annotations

import ctypes
import json
import re
import sys
import threading
import time

import numpy as np

import nearline

libc = ctypes.CDLL("libc.so.6")


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def main() -> None:
    args = json.loads(sys.argv[1])
    q = np.load(args["queries"])
    # Warm up: the first open and search pull the extension's code pages into RSS; those belong to the library,
    # not to the index.
    with nearline.open(args["index"]) as w:
        w.search(q[:4], k=10)
    rows = []
    for frac in args["budgets"]:
        libc.malloc_trim(0)
        r0 = rss()
        idx = nearline.open(args["index"], memory_budget=frac)
        mem = idx.info()["memory"]
        budget, limit = mem["budget"], mem["worker_scratch_max"]
        for L, W, threads, qif in args["points"]:
            nq = threads * qif
            opts = dict(L=L, W=W, threads=threads, queries_in_flight=qif)
            try:
                planned = idx.plan_search(nq, k=10, **opts)["scratch"]
            except ValueError as e:
                planned = None
                plan_error = str(e)
            out: dict = {}

            def run() -> None:
                try:
                    ids, _ = idx.search(q[:nq], 10, **opts)
                    out["found"] = int((ids >= 0).sum())
                except ValueError as e:
                    out["error"] = str(e)

            th = threading.Thread(target=run)
            th.start()
            peak, within = rss(), True
            while th.is_alive():
                peak = max(peak, rss())
                within = within and idx.info()["memory"]["within_budget"]
                time.sleep(0.0005)
            th.join()
            peak = max(peak, rss())
            m = idx.info()["memory"]
            libc.malloc_trim(0)
            row = {
                "budget_fraction": frac, "budget": budget, "limit": limit, "L": L, "W": W, "threads": threads,
                "queries_in_flight": qif, "nq": nq, "planned_scratch": planned, "refused": "error" in out,
                "error": out.get("error"), "found": out.get("found"), "within_during": within,
                "within_after": m["within_budget"], "peak_total": m["peak_total"], "borrows": m["cache_borrows"],
                "cache": m["cache"], "cache_planned": m["cache_planned"], "rss_during": peak - r0,
                "rss_after": rss() - r0,
            }
            if "error" in out:
                need = re.search(r"needs about (\d+) bytes", out["error"])
                row["need"] = int(need.group(1)) if need else None
            if planned is None:
                row["plan_error"] = plan_error
            rows.append(row)
        idx.close()
        del idx
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
