"""Issue 34: a search that the memory budget can hold is never refused.

A property test over every graph preset × budgets of 5, 10, 20 and 40% of the raw vectors × L × W × threads ×
queries_in_flight on a small set (one index per preset, built once at 5% so its PQ codes fit every budget): a
search is refused only when even an empty cache could not hold its workers' scratch (and then the message says
what fits); every other search runs (borrowing from the cache when the budget's free room is short) and answers
every query; ``within_budget`` stays true during and after it, the ledger's peak never passes the budget, the
cache is back to its planned size afterwards, and the resident memory the index adds stays within
1.05 × budget + 4 MiB, measured as ``test_index.py::test_rss_delta_within_budget`` measures it.

CI runs a sample of the grid; ``NEARLINE_BUDGET_GRID=full`` runs all of it (7 × 4 × 3 × 3 = 252 searches per
preset and budget, 5,040 in all).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nearline
from conftest import clustered

PRESETS = ("diskann", "pipeann", "starling", "gorgeous", "alayalaser")
BUDGETS = (0.05, 0.10, 0.20, 0.40)
LS = (10, 32, 100, 128, 256, 512, 1024)
WS = (1, 4, 8, 32)
THREADS = (1, 2, 8)
QIFS = (1, 4, 8)
FULL = os.environ.get("NEARLINE_BUDGET_GRID") == "full"
MIB = 1 << 20
CHILD = Path(__file__).with_name("budget_grid_child.py")


def grid_points(preset: str) -> list[list[int]]:
    """Every point of the grid, or (CI) its corners and a sample of 8 more, fixed per preset."""
    every = [list(p) for p in itertools.product(LS, WS, THREADS, QIFS)]
    if FULL:
        return every
    corners = [[1024, 32, 8, 8], [1024, 1, 1, 1], [10, 1, 1, 1], [10, 32, 8, 8], [512, 8, 2, 4], [128, 8, 2, 1]]
    rng = random.Random(preset)
    return corners + rng.sample([p for p in every if p not in corners], 8)


@pytest.fixture(scope="module")
def grid_queries(tmp_path_factory, budget_data):
    """The grid's 64 queries (at most 8 threads × 8 in flight), saved for the child."""
    path = tmp_path_factory.mktemp("grid") / "q.npy"
    np.save(path, budget_data[1][:64])
    return path


@pytest.mark.parametrize("preset", PRESETS)
def test_no_search_an_empty_cache_could_hold_is_refused(budget_index, grid_queries, preset):
    # One small index per graph preset, built at 5% of the raw vectors (conftest.py's budget_index: the
    # RSS test of test_index.py opens the same diskann, pipeann and starling indexes).
    points = grid_points(preset)
    args = {"index": str(budget_index(preset)), "queries": str(grid_queries),
            "budgets": list(BUDGETS), "points": points}
    out = subprocess.run([sys.executable, str(CHILD), json.dumps(args)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert len(rows) == len(points) * len(BUDGETS)
    borrowed = refused = 0
    prev_borrows = {}
    for r in rows:
        where = f"{preset} {r['budget_fraction']}: L {r['L']} W {r['W']} threads {r['threads']} " \
                f"qif {r['queries_in_flight']}: {r}"
        # The run refuses exactly what the planner refuses, and only what even an empty cache cannot hold.
        assert r["refused"] == (r["planned_scratch"] is None), where
        if r["refused"]:
            refused += 1
            assert r["need"] is not None and r["need"] > r["limit"], where
            assert "even with the cache emptied" in r["error"] and "fits" in r["error"], where
        else:
            assert r["planned_scratch"] <= r["limit"], where
            assert r["found"] == r["nq"] * 10, where
        b = r["budget"]
        assert r["within_during"] and r["within_after"], where
        assert r["peak_total"] <= b, where
        assert r["cache"] == r["cache_planned"], where
        assert r["rss_after"] <= 1.05 * b + 4 * MIB, where
        assert r["rss_during"] <= 1.05 * b + 4 * MIB, where
        before = prev_borrows.get(r["budget_fraction"], 0)
        borrowed += r["borrows"] > before
        prev_borrows[r["budget_fraction"]] = r["borrows"]
    # The grid exercises borrowing and refusals both.
    assert borrowed > 0 and refused > 0, (borrowed, refused)
    worst = max((max(r["rss_during"], r["rss_after"]) - r["budget"]) / MIB for r in rows)
    print(f"{preset}: {len(rows)} searches, {borrowed} borrowed from the cache, {refused} refused "
          f"(needing more than an empty cache leaves); resident at most {worst:+.2f} MiB beyond the budget")


@pytest.fixture(scope="module")
def small_starling(tmp_path_factory):
    base, queries = clustered(3000, 32, seed=5, queries=64)
    path = tmp_path_factory.mktemp("borrow") / "s.index"
    nearline.build(base, path, preset="starling", R=16, build_L=32, memory_budget=1_000_000, threads=2).close()
    return path, queries


def test_a_search_just_past_the_workers_reserve_runs_and_info_shows_the_loan(small_starling):
    """The issue's case: a search a little past what the budget reserves the workers (there 2 KB) while the
    cache holds much more of the budget. It runs, borrowing from the cache, which holds its planned size again
    afterwards; ``info()["memory"]`` shows the loan."""
    path, queries = small_starling
    idx = nearline.open(path, memory_budget=1_000_000)
    mem = idx.info()["memory"]
    reserve = mem["worker_scratch_max"] - mem["cache_planned"]
    scratch = {L: idx.plan_search(64, L=L, threads=2, queries_in_flight=1)["scratch"] for L in range(100, 2000, 4)}
    L = min(L for L, s in scratch.items() if s > reserve)
    short = scratch[L] - reserve  # one step of L (the visited table doubles): tens of KB here
    assert short < mem["cache_planned"] / 4, (L, scratch[L], reserve, mem)
    ids, _ = idx.search(queries, 10, L=L, threads=2, queries_in_flight=1)
    assert (ids >= 0).all()
    after = idx.info()["memory"]
    # The cache lent what was short (whole records: up to one more), no more.
    assert after["cache_borrows"] == 1 and 0 < after["cache_borrowed_peak"] <= short + 4096, (short, after)
    assert after["cache"] == after["cache_planned"] and after["cache_borrowed"] == 0, after
    assert after["within_budget"] and after["peak_total"] <= 1_000_000, after
    # More than an empty cache leaves: refused, naming what fits.
    with pytest.raises(ValueError, match=r"even with the cache emptied.*L ≤ \d+"):
        idx.search(queries, 10, L=100_000, threads=2, queries_in_flight=1)
    idx.close()


def test_cli_plan_says_which_l_the_workers_share_covers(small_starling, capsys):
    from nearline import cli

    path, queries = small_starling
    plan = nearline.plan(path, memory_budget=1_000_000)
    covered = plan["memory"]["search_L_covered"]
    assert covered >= 100 and any(d["what"] == "search_L_covered" for d in plan["open"])
    assert cli.main(["plan", str(path), "--memory-budget", "1000000"]) == 0
    out = capsys.readouterr().out
    assert f"up to L {covered}" in out and "borrows from the cache" in out
    # nearline info shows the loan's counts as numbers, its bytes in units.
    idx = nearline.open(path, memory_budget=1_000_000)
    idx.search(queries, 10, L=4 * covered, threads=2)
    text = cli.format_info(idx.info())
    idx.close()
    assert re.search(r"^memory\.cache_borrows\s+1$", text, re.M), text
    assert re.search(r"^memory\.cache_planned\s+\d.*B \(\d+\)$", text, re.M), text
    assert re.search(r"^memory\.plan\.search_L_covered\s+\d+$", text, re.M), text
