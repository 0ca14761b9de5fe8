"""DGAI from Python and the CLI: the preset's decoupled layout (topology records of adjacency
lists only, the vectors in pages of their own read for the final re-rank), recall against exact
neighbours, a clean `check`, updates out of place, damage detected, and what the layout refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest

import nearline
from conftest import build_preset, clustered, exact_knn, recall, recall_on_live, run_cli

# Observed on 4000 × 32 (R 32, the preset's budget): recall@10 0.99+ at L 100; the bar
# sits below with room for platform noise.
RECALL_L100 = 0.95


def _build(base, path, **kw):
    return build_preset("dgai", base, path, **kw)


@pytest.fixture(scope="module")
def data32():
    return clustered(4000, 32, seed=13, queries=100)


@pytest.fixture(scope="module")
def index32(tmp_path_factory, data32):
    path = tmp_path_factory.mktemp("dgai") / "d32.index"
    _build(data32[0], path).close()
    return path


def test_recall_and_the_decoupled_pages(index32, data32):
    base, queries = data32
    with nearline.open(index32) as idx:
        info = idx.info()
        lay = info["layout"]
        assert info["preset"] == "dgai" and lay["kind"] == "decoupled"
        assert (lay["placement"], lay["records"]) == ("id", "decoupled")
        # R 32: 132-byte topology records, 30 a page; 32-d float32 vectors, 31 a vector page.
        assert (lay["record_size"], lay["records_per_block"]) == (132, 30)
        assert lay["vector_blocks"] == -(-4000 // 31)
        assert info["memory"]["within_budget"]
        ids, d = idx.search(queries, 10, L=100)
        assert recall(ids, exact_knn(base, queries, 10)) >= RECALL_L100
        assert np.all(np.diff(d, axis=1) >= 0)
        report = idx.check()
        assert report["problems"] == [] and report["unreachable"] == 0


def test_vectors_are_read_only_to_rerank(index32, data32):
    # With no cache the traversal reads topology pages only; every exact distance is the
    # re-rank's, from a vector page, and a smaller refine ratio reads fewer of them.
    _, queries = data32
    with nearline.open(index32, cache_nodes=0) as idx:
        _, _, st = idx.search(queries, 10, L=40, return_stats=True)
        _, _, few = idx.search(queries, 10, L=40, refine_ratio=0.25, return_stats=True)
    assert np.all(st["refine_reads"] > 0)
    assert np.array_equal(st["exact_distances"], st["refined"])
    assert np.all(st["refined"] <= 16)
    assert few["refine_reads"].sum() < st["refine_reads"].sum()


def test_the_plan_names_the_rule(data32):
    base, _ = data32
    plan = nearline.plan(base, preset="dgai", R=32)
    rows = {d["what"]: d for d in plan["decisions"]}
    assert rows["layout"]["value"] == "decoupled"
    assert "30 lists a topology page" in rows["decoupled"]["value"]
    assert "31 vectors a vector page" in rows["decoupled"]["value"]
    assert "DGAI" in rows["decoupled"]["rule"]
    assert rows["update_strategy"]["value"] == "out-of-place"


def test_updates_go_out_of_place(tmp_path, data32):
    base, queries = data32
    path = tmp_path / "u"
    n0 = 3000
    _build(base[:n0], path).close()
    with nearline.open(path) as idx:
        new_ids = idx.insert(base[n0:])
        assert list(new_ids) == list(range(n0, 4000))
        gone = np.arange(0, n0, 10)
        assert idx.delete(gone) == len(gone)
        live = np.setdiff1d(np.arange(4000), gone)
        assert recall_on_live(idx, live, base[live], queries) >= 0.9
        idx.checkpoint()
        assert idx.check()["problems"] == []
        assert recall_on_live(idx, live, base[live], queries) >= 0.9
        assert idx.info()["memory"]["within_budget"]
    with nearline.open(path) as idx:
        assert idx.info()["layout"]["kind"] == "decoupled"
        assert recall_on_live(idx, live, base[live], queries) >= 0.9
    with pytest.raises(ValueError, match="decoupled"):
        _build(base[:300], tmp_path / "ip", update="in_place")


def test_a_decoupled_layout_refuses_block_search(index32, data32):
    _, queries = data32
    with nearline.open(index32) as idx:
        with pytest.raises(ValueError, match="decoupled layout"):
            idx.search(queries, 10, page_search="block")


def test_damage_is_detected(tmp_path, data32):
    base, _ = data32
    path = tmp_path / "d"
    _build(base[:1000], path).close()
    with nearline.open(path) as idx:
        first_vector_block = idx.info()["layout"]["n_blocks"]
    pages = path / "pages.bin"
    good = pages.read_bytes()
    bad = bytearray(good)
    bad[first_vector_block * 4096 + 40] ^= 0x20
    pages.write_bytes(bytes(bad))
    with nearline.open(path, cache_nodes=0) as idx:
        problems = idx.check()["problems"]
        assert len(problems) == 1 and f"vector block {first_vector_block}" in problems[0]
        with pytest.raises(nearline.CorruptIndexError):
            idx.search(base[:1], 10)
    pages.write_bytes(good[:-4096])
    with pytest.raises(nearline.CorruptIndexError, match="truncated"):
        nearline.open(path)


def test_cli_dgai(tmp_path):
    base, queries = clustered(3000, 32, seed=17, queries=50)
    nearline.write_vectors(tmp_path / "b.fbin", base)
    nearline.write_vectors(tmp_path / "q.fbin", queries)
    gt_ids, gt_d = nearline.compute_ground_truth(base, queries, 10)
    nearline.write_ground_truth(tmp_path / "gt.bin", gt_ids, gt_d)
    out = tmp_path / "d"
    r = run_cli("build", str(tmp_path / "b.fbin"), str(out), "--preset", "dgai", "--R", "32", "-q")
    assert r.returncode == 0, r.stderr
    assert "layout=decoupled" in r.stdout
    r = run_cli("info", str(out))
    assert r.returncode == 0, r.stderr
    assert "dgai" in r.stdout and "decoupled" in r.stdout
    r = run_cli("search", str(out), str(tmp_path / "q.fbin"), "--gt", str(tmp_path / "gt.bin"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["recall@10"] >= RECALL_L100
    r = run_cli("insert", str(out), str(tmp_path / "q.fbin"))
    assert r.returncode == 0, r.stderr
    r = run_cli("check", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_cli("search", str(out), str(tmp_path / "q.fbin"), "--k", "1", "--json")
    assert r.returncode == 0, r.stderr
