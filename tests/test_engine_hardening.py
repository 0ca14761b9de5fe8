"""Engine-side hardening: repeatable pipelined searches, build-budget messages and
warnings, vectors beyond float32 distances, float64 .npy files."""

from __future__ import annotations

import re
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import nearline  # noqa: E402
from conftest import clustered, exact_knn  # noqa: E402


@pytest.fixture(scope="module")
def data_20k():
    """The report's shape: 20,000 × 64."""
    return clustered(20_000, 64, seed=3, queries=200)


# --------------------------------------------------------------------------- repeatable searches


@pytest.mark.parametrize("options", [
    {"executor": "pipeline", "W": 8},
    {"executor": "pipeline", "W": 32, "queries_in_flight": 8},
    {"executor": "beam", "W": 8, "early_dispatch": 0.5},
])
def test_pipelined_searches_repeat_exactly_under_load(small_index, small_data, options):
    """4 threads × repeats of a batch, the threads competing for the cores and the
    I/O queues, return exactly what one single-threaded search returns: ids,
    distances and the per-query reads and hops."""
    _, queries = small_data
    with nearline.open(small_index) as idx:
        ids0, d0, st0 = idx.search(queries, 10, L=40, threads=1, return_stats=True, **options)

        def once(_):
            return idx.search(queries, 10, L=40, threads=2, return_stats=True, **options)

        for _ in range(2):
            with ThreadPoolExecutor(4) as pool:
                runs = list(pool.map(once, range(4)))
            for ids, d, st in runs:
                np.testing.assert_array_equal(ids, ids0)
                np.testing.assert_array_equal(d, d0)
                np.testing.assert_array_equal(st["reads"], st0["reads"])
                np.testing.assert_array_equal(st["hops"], st0["hops"])


def test_repeatable_can_be_turned_off(small_index, small_data):
    """``repeatable=False`` processes pages as they arrive: still exact with a
    list as large as the data; the option is typed and shown in the plan."""
    base, queries = small_data
    with nearline.open(small_index) as idx:
        ids, _ = idx.search(queries[:20], 10, L=len(base), executor="pipeline", repeatable=False)
        assert nearline.recall(ids, exact_knn(base, queries[:20], 10), 10) == 1.0
        lims, _, _ = idx.range_search(queries[:5], 1.0, executor="pipeline", repeatable=False)
        assert len(lims) == 6
        assert idx.plan_search(10, executor="pipeline")["repeatable"] is True
        assert idx.plan_search(10, executor="pipeline", repeatable=False)["repeatable"] is False
        with pytest.raises(TypeError, match="repeatable"):
            idx.search(queries[:2], 10, repeatable="no")


# --------------------------------------------------------------------------- build budgets


def _need(message: str) -> int:
    m = re.search(r"needs at least (\d+) bytes", message)
    assert m, message
    return int(m.group(1))


@pytest.mark.parametrize("budget, stated", [("8MB", 8_000_000), ("1KB", 1_000), (5000, 5_000)])
def test_too_small_build_budget_states_the_real_need(tmp_path, data_20k, budget, stated):
    """The message repeats the budget as given (never the graph's share of it,
    never 0) and states a need above it; that need builds."""
    base, _ = data_20k
    with pytest.raises(ValueError, match=f"build_memory_budget={stated} bytes is too small") as e:
        nearline.build(base, tmp_path / "x", build_memory_budget=budget, threads=2)
    need = _need(str(e.value))
    assert need > max(stated, 8_000_000)
    # Nothing was built, not even the PQ stage's files.
    assert not (tmp_path / "x").exists()
    plan = nearline.plan(base, build_memory_budget=need, threads=2)
    assert any(d["what"] == "graph_shards" for d in plan["decisions"])


def test_small_shards_warn_with_the_numbers(tmp_path, data_20k):
    """A budget that shards 20k × 64 into 133 parts of ≤ 361 points builds, and
    says so: a UserWarning with the shards, their size and the budgets that
    avoid it; the plan and info() carry it too. A budget that holds the build
    at once does not warn."""
    base, _ = data_20k
    # The DiskANN composition's numbers (another preset's shards differ).
    plan = nearline.plan(base, preset="diskann", build_memory_budget="10MB", threads=2)
    assert len(plan["warnings"]) == 1 and "133 shards" in plan["warnings"][0]
    with pytest.warns(UserWarning, match=r"133 shards of at most 361 points") as rec:
        idx = nearline.build(base, tmp_path / "s", preset="diskann", build_memory_budget="10MB", threads=2)
    text = str(rec[0].message)
    assert "build_memory_budget=10000000 bytes" in text
    budgets = [int(x) for x in re.findall(r"(\d+) bytes (?:gives|builds)", text)]
    assert len(budgets) == 2 and 10_000_000 < budgets[0] < budgets[1], text
    with idx:
        info = idx.info()
    assert info["build_stats"]["shards"] == 133
    assert info["warnings"] == plan["warnings"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        idx = nearline.build(base, tmp_path / "o", preset="diskann", build_memory_budget=budgets[1], threads=2)
    with idx:
        assert idx.info()["build_stats"]["shards"] == 1
        assert idx.info()["warnings"] == []


def test_cli_build_prints_the_shard_warning(tmp_path, data_20k, capsys):
    from nearline import cli

    base, _ = data_20k
    f = tmp_path / "base.npy"
    np.save(f, base)
    rc = cli.main(["-q", "build", str(f), str(tmp_path / "c"), "--build-memory-budget", "10MB",
                   "--threads", "2"])
    assert rc == 0
    err = capsys.readouterr().err
    assert "nearline: warning:" in err and "133 shards" in err, err
    rc = cli.main(["-q", "build", str(f), str(tmp_path / "d"), "--build-memory-budget", "1KB"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "build_memory_budget=1000 bytes is too small" in err, err


# --------------------------------------------------------------------------- values beyond float32 distances


def test_vectors_whose_squares_overflow_are_refused(tmp_path, small_index, small_data):
    base, queries = small_data
    bad = base[:500].copy()
    bad[7, 3] = 1e38
    with pytest.raises(ValueError, match=r"row 7 has squared norm 1\.000e76.*scale the data"):
        nearline.build(bad, tmp_path / "b")
    assert not (tmp_path / "b").exists()
    q = queries[:3].copy()
    q[1, 0] = -3e19
    with nearline.open(small_index) as idx:
        with pytest.raises(ValueError, match=r"query 1 has squared norm 9\.000e38.*scale the data"):
            idx.search(q, 5)
        q[1, 0] = 1e3
        _, d = idx.search(q, 5)
        assert np.isfinite(d).all()


# --------------------------------------------------------------------------- float64 .npy


def test_float64_npy_reads_as_float32(tmp_path, small_data):
    base, queries = small_data
    base64 = base[:2000].astype(np.float64) / 3.0
    f = tmp_path / "b64.npy"
    np.save(f, base64)
    got = nearline.read_vectors(f)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, base64.astype(np.float32))
    # Building from the file equals building from the array (cast the same way).
    a = nearline.build(f, tmp_path / "from_file", R=16, build_L=32, threads=2)
    b = nearline.build(base64, tmp_path / "from_array", R=16, build_L=32, threads=2)
    with a, b:
        ia, da = a.search(queries[:20] / 3.0, 5)
        ib, db = b.search(queries[:20] / 3.0, 5)
    np.testing.assert_array_equal(ia, ib)
    np.testing.assert_array_equal(da, db)
    big = base64[:10].copy()
    big[4, 2] = 1e39
    np.save(f, big)
    with pytest.raises(ValueError, match=r"row 4, column 2 is 1e39, beyond float32's range"):
        nearline.read_vectors(f)
