"""Gorgeous from Python and the CLI: the preset, graph-replicated pages and the disk
budget, the adjacency-first cache, two-stage search, and the equal-budget benchmark."""

from __future__ import annotations

import json

import numpy as np
import pytest

import nearline
from conftest import clustered, exact_knn, recall, run_cli


@pytest.fixture(scope="module")
def data():
    return clustered(6000, 64, seed=5)


@pytest.fixture(scope="module")
def gorgeous(tmp_path_factory, data):
    base, _ = data
    path = tmp_path_factory.mktemp("g") / "g.index"
    # The paper's layout, pinned: with the layout left to the preset, a budget that holds every
    # list gets a shuffled one (test_every_list_in_memory_gets_a_shuffled_layout).
    nearline.build(base, path, preset="gorgeous", layout="replicated", R=24, build_L=48, threads=2,
                   progress=False)
    return path


def test_gorgeous_builds_what_the_paper_describes(gorgeous):
    with nearline.open(gorgeous) as idx:
        info = idx.info()
    assert info["preset"] == "gorgeous"
    lay = info["layout"]
    assert lay["kind"] == "replicated" and lay["records_per_block"] == 1
    assert lay["packed"] == 35  # (4096 − 16 − (256 + 4 + 96) − 4) // (8 + 96)
    rep = lay["replication"]
    assert rep["max_replicas"] <= rep["cap"] == 2 * lay["packed"]
    assert lay["space_amplification"] > 1.0
    assert "adjacency" in info["sections"] and "nav_graph" in info["sections"]
    assert info["build_stats"]["pq_trials"], info["build_stats"]
    assert info["plan"]["search"]["L"] == 128 and info["plan"]["search"]["W"] == 8
    assert info["plan"]["search"]["page_search"] == "replicas"
    assert info["plan"]["search"]["refine"] == "rerank"


def test_two_stage_search_finds_the_neighbours(gorgeous, data):
    base, queries = data
    truth = exact_knn(base, queries, 10)
    # A budget holding every list (and the refine stage's reads, all in flight at once, even at
    # refine_ratio 1): the traversal reads nothing.
    with nearline.open(gorgeous, memory_budget="6MB") as idx:
        assert idx.info()["cache"]["policy"] == "adjacency"
        assert idx.info()["cache"]["lists"] == len(base)
        ids, _, st = idx.search(queries, 10, return_stats=True)
        assert recall(ids, truth, 10) >= 0.9
        assert st["adjacency_hits"].sum() + st["cache_hits"].sum() > 0
        assert np.all(st["reads"] == st["refine_reads"])
        # A larger refine ratio reads more and finds at least as much.
        ids2, _, st2 = idx.search(queries, 10, refine_ratio=1.0, return_stats=True)
        assert st2["refine_reads"].mean() >= st["refine_reads"].mean()
        assert recall(ids2, truth, 10) >= recall(ids, truth, 10) - 0.01
    # Without a cache the replicated pages carry the traversal.
    with nearline.open(gorgeous, cache="bfs", cache_nodes=0) as idx:
        ids, _, st = idx.search(queries, 10, return_stats=True)
        assert recall(ids, truth, 10) >= 0.9
        assert st["replica_hits"].sum() > 0
        assert np.all(st["refine_reads"] <= st["reads"])


def test_bad_gorgeous_options_are_refused(gorgeous, small_index, data):
    base, queries = data
    with nearline.open(gorgeous) as idx:
        for bad in (0.0, 1.5, float("nan")):
            with pytest.raises(ValueError, match="refine_ratio"):
                idx.search(queries[:2], 10, refine_ratio=bad)
        with pytest.raises(ValueError, match="filter_ratio"):
            idx.search(queries[:2], 10, filter_ratio=0.0)
        with pytest.raises(TypeError):
            idx.search(queries[:2], 10, refine_ratio="half")
    with nearline.open(small_index) as idx:
        q = np.zeros((1, idx.info()["dim"]), dtype=np.float32)
        with pytest.raises(ValueError, match="two-stage"):
            idx.search(q, 10, refine_ratio=0.5)
        with pytest.raises(ValueError, match="replicas"):
            idx.search(q, 10, page_search="replicas")
    with pytest.raises(ValueError, match="adjacency section"):
        nearline.open(small_index, cache="adjacency")
    with pytest.raises(ValueError, match="unknown cache"):
        nearline.open(gorgeous, cache="lru")
    with pytest.raises(ValueError, match="disk_budget"):
        nearline.plan(base, preset="gorgeous", disk_budget=1000)
    with pytest.raises(ValueError, match="not a\\s+fraction"):
        nearline.plan(base, preset="gorgeous", disk_budget=0.5)


def test_the_disk_budget_holds(tmp_path, data):
    base, queries = data
    raw = base.nbytes
    for budget in (int(raw * 1.6), int(raw * 3)):
        path = tmp_path / f"d{budget}"
        idx = nearline.build(base, path, preset="gorgeous", R=24, build_L=48, threads=2,
                             disk_budget=budget, progress=False)
        with idx:
            info = idx.info()
            assert info["layout"]["pages_bytes"] <= budget
            ids, _ = idx.search(queries[:20], 10)
            assert ids.shape == (20, 10)
    with pytest.raises(ValueError, match="disk_budget=100 bytes is below"):
        nearline.build(base, tmp_path / "x", preset="gorgeous", disk_budget=100, progress=False)


def test_plan_shows_the_gorgeous_split(data):
    base, _ = data
    p = nearline.plan(base, preset="gorgeous", memory_budget=1.0, R=24)
    what = {d["what"]: d for d in p["decisions"]}
    assert "smallest size" in what["pq_bytes"]["rule"]
    assert what["packed_lists"]["value"] == "35"
    assert p["memory"]["cache_policy"] == "adjacency"
    assert p["memory"]["budget"] == base.nbytes
    # The whole raw size holds every list: the build may write a shuffled layout instead.
    assert what["layout_if_lists_fit"]["value"] == "shuffled"
    assert "every adjacency list" in what["layout_if_lists_fit"]["rule"]
    pinned = nearline.plan(base, preset="gorgeous", memory_budget=1.0, R=24, layout="replicated")
    assert "layout_if_lists_fit" not in {d["what"] for d in pinned["decisions"]}


def test_every_list_in_memory_gets_a_shuffled_layout(tmp_path, data):
    base, queries = data
    truth = exact_knn(base, queries, 10)
    # Three times the raw size (this set is small for its workers): every list fits.
    idx = nearline.build(base, tmp_path / "s", preset="gorgeous", memory_budget=3 * base.nbytes, R=24, build_L=48,
                         threads=2, progress=False)
    idx.close()
    # Opened with a budget that holds every list but not every vector.
    with nearline.open(tmp_path / "s", memory_budget="3MiB") as idx:
        info = idx.info()
        assert info["layout"]["kind"] == "shuffled" and "replication" not in info["layout"]
        assert info["cache"]["policy"] == "adjacency" and info["cache"]["lists"] == len(base)
        ids, _, st = idx.search(queries, 10, return_stats=True)
        assert recall(ids, truth, 10) >= 0.9
        # The whole graph is in memory: only the refine stage reads.
        assert st["refine_reads"].sum() > 0
        assert np.array_equal(st["reads"], st["refine_reads"])
    # The CLI plan names the alternative.
    nearline.write_vectors(tmp_path / "b.fbin", base)
    r = _cli("plan", str(tmp_path / "b.fbin"), "--preset", "gorgeous", "--memory-budget", "1.0", "--R", "24")
    assert r.returncode == 0, r.stderr
    assert "layout_if_lists_fit" in r.stdout and "shuffled" in r.stdout


_cli = run_cli


def test_cli_gorgeous(tmp_path, data):
    base, queries = data
    nearline.write_vectors(tmp_path / "b.fbin", base)
    nearline.write_vectors(tmp_path / "q.fbin", queries[:50])
    r = _cli("build", str(tmp_path / "b.fbin"), str(tmp_path / "g"), "--preset", "gorgeous", "--R", "24",
             "--build-L", "48", "--disk-budget", str(base.nbytes * 3), "-q")
    assert r.returncode == 0, r.stderr
    r = _cli("search", str(tmp_path / "g"), str(tmp_path / "q.fbin"), "--refine-ratio", "0.8", "--filter-ratio",
             "0.7", "--cache", "adjacency", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["page_search"] == "replicas"
    assert "refine_reads" in out["mean"]
    r = _cli("build", str(tmp_path / "b.fbin"), str(tmp_path / "h"), "--preset", "gorgeous", "--disk-budget", "0.5")
    assert r.returncode == 2 and "fraction" in r.stderr
    r = _cli("search", str(tmp_path / "g"), str(tmp_path / "q.fbin"), "--refine-ratio", "2")
    assert r.returncode == 2


def test_bench_gives_every_system_the_same_budget(tmp_path):
    """Two budgets on tiny data: nearline variants at each, diskannpy (when installed) at the same
    budget its own way; one result per budget, the QPS-against-budget curve and its plot."""
    from nearline import bench

    systems = []
    try:
        import diskannpy  # noqa: F401

        systems = ["diskannpy"]
    except ImportError:
        pass
    cfg = bench.BenchConfig(data="synthetic:3000:256", systems=systems, Ls=[10, 40], k=10, R=16,
                            build_L=32, threads=1, reps=1, workdir=tmp_path, warmup=10, latency_queries=0,
                            ceiling=False, target_recalls=[0.9], out=tmp_path / "r.json",
                            plot=tmp_path / "p.png", peer_threads=[],
                            variants=[bench.parse_variant("gorgeous:preset=gorgeous"),
                                      bench.parse_variant("diskann:preset=diskann")])
    res = bench.run_budget_sweep(cfg, [0.6, 1.0], progress=False)
    assert res["budgets"] == ["0.6", "1.0"]
    for b in ("0.6", "1.0"):
        saved = json.loads((tmp_path / f"r-b{b}.json").read_text())
        assert saved["params"]["memory_budget"] == float(b) and saved["params"]["equal_budget"]
        info = saved["builds"]["gorgeous"]
        assert info.get("pq_bytes")
        # A two-stage search's reads split into traversal and refine.
        for p in saved["summary"]["gorgeous"]["points"]:
            assert 0 <= p["mean_refine_reads"] <= p["mean_reads"]
    curve = res["qps_at_recall"]
    assert curve["gorgeous"]["budget"] == pytest.approx([0.6, 1.0])
    assert (tmp_path / "p-budgets.png").is_file() and (tmp_path / "p-b0.6.png").is_file()
    assert "memory budgets" in bench.format_budget_report(res)
