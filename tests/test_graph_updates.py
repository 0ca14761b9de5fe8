"""Out-of-place updates of a graph index (FreshDiskANN): every graph preset takes
inserts and deletes from Python and the CLI, finds what it inserted, never returns a
deleted id, merges at checkpoint into a new disk graph with the recall of a fresh build,
replays its log after a reopen, and refuses bad updates without changing anything."""

from __future__ import annotations

import json

import numpy as np
import pytest

import nearline
from conftest import clustered, recall_on_live, run_cli

DIM = 16
BUILD = dict(R=24, build_L=48, threads=2, memory_budget="4MB")


@pytest.mark.parametrize("preset", ["diskann", "starling", "gorgeous", "alayalaser", "aisaq", "dgai"])
def test_graph_presets_take_inserts_and_deletes(tmp_path, preset):
    base, queries = clustered(2500, DIM, seed=21, queries=60)
    n0 = 2000
    with nearline.build(base[:n0], tmp_path / "g.index", preset=preset, **BUILD) as idx:
        assert idx.kind == "graph"
        new_ids = idx.insert(base[n0:])
        assert new_ids.tolist() == list(range(n0, 2500))
        gone = np.arange(0, n0, 10)
        assert idx.delete(gone) == len(gone)
        assert idx.delete(gone) == 0
        live_mask = np.ones(2500, bool)
        live_mask[gone] = False
        live_ids = np.flatnonzero(live_mask)
        assert len(idx) == len(live_ids)
        assert idx.ids().tolist() == live_ids.tolist()
        # Every inserted vector finds itself; no deleted id comes back.
        got, _ = idx.search(base[n0:n0 + 50], k=3)
        assert all(new_ids[i] in got[i] for i in range(50))
        during = recall_on_live(idx, live_ids, base[live_ids], queries)
        assert during >= 0.9, during
        info = idx.info()
        assert info["updates"]["strategy"] == "out_of_place"
        assert info["updates"]["inserted_since_merge"] == 500
        assert info["memory"]["within_budget"] and info["memory"]["updates"] > 0
        assert idx.check()["problems"] == []
        seq = idx.checkpoint()
        assert seq >= 2
        info = idx.info()
        assert info["n"] == len(live_ids) and info["updates"]["inserted_since_merge"] == 0
        assert info["updates"]["since_open"]["last_merge"]["inserted"] == 500
        after = recall_on_live(idx, live_ids, base[live_ids], queries)
        assert idx.check()["problems"] == []
    with nearline.build(base[live_ids], tmp_path / "fresh.index", preset=preset, ids=live_ids, **BUILD) as fresh:
        fresh_recall = recall_on_live(fresh, live_ids, base[live_ids], queries)
    assert after >= fresh_recall - 0.03, (after, fresh_recall)
    # A reopen replays the updates logged after the merge.
    with nearline.open(tmp_path / "g.index") as idx:
        idx.delete([5, 6])
        extra = idx.insert(base[:3] + 0.01)
    with nearline.open(tmp_path / "g.index") as idx:
        ids = idx.ids()
        assert 5 not in ids and 6 not in ids and set(extra.tolist()) <= set(ids.tolist())
        assert idx.check()["problems"] == []


def test_read_only_open_follows_the_writer_through_a_merge(tmp_path):
    base, queries = clustered(1500, DIM, seed=22, queries=20)
    nearline.build(base[:1000], tmp_path / "g.index", preset="diskann", **BUILD).close()
    with nearline.open(tmp_path / "g.index") as w, nearline.open(tmp_path / "g.index", read_only=True) as r:
        w.insert(base[1000:1200])
        w.delete([1, 2, 3])
        assert len(r) == 1197
        got, _ = r.search(base[1000:1010], k=1)
        assert got[:, 0].tolist() == list(range(1000, 1010))
        w.checkpoint()
        w.insert(base[1200:1300])
        got, _ = r.search(base[1200:1210], k=1)
        assert got[:, 0].tolist() == list(range(1200, 1210))
        assert len(r) == 1297
        with pytest.raises(ValueError, match="read-only"):
            r.insert(base[:1])


@pytest.mark.parametrize("background", [True, False])
def test_a_streamed_insert_merges_as_the_delta_fills(tmp_path, background):
    """A delta's share of a small budget fills many times over: the merges run in the
    background while the stream goes on (or, with background_updates=False, in the insert
    that fills it); every acknowledged insert is searchable at once, no deleted id comes
    back, and the budget holds throughout."""
    base, _ = clustered(3000, DIM, seed=24, queries=5)
    nearline.build(base[:1000], tmp_path / "g.index", preset="diskann", **BUILD).close()
    with nearline.open(tmp_path / "g.index", read_only=True) as probe:
        budget = probe.info()["memory"]["minimum"] + (150 << 10)
    live = set(range(1000))
    with nearline.open(tmp_path / "g.index", memory_budget=budget, background_updates=background) as idx:
        for s in range(1000, 3000, 50):
            ids = idx.insert(base[s:s + 50])
            live.update(ids.tolist())
            gone = [s - 1000 + 7, int(ids[0])]
            assert idx.delete(gone) == 2
            live.difference_update(gone)
            got, _ = idx.search(base[s + 1:s + 50], k=1)
            assert got[:, 0].tolist() == list(range(s + 1, s + 50))
            info = idx.info()
            assert isinstance(info["updates"]["merging"], bool)
            assert info["memory"]["within_budget"], info["memory"]
            got, _ = idx.search(base[:20], k=10)
            assert not (set(got.ravel().tolist()) - live - {-1})
        merges = idx.info()["updates"]["since_open"]["merges"]
        if not background:
            assert merges >= 2
        idx.checkpoint()
        info = idx.info()
        assert info["updates"]["since_open"]["merges"] >= 3 and not info["updates"]["merging"]
        assert info["updates"]["since_open"]["last_merge_error"] is None
        assert idx.ids().tolist() == sorted(live)
        assert idx.check()["problems"] == []


def test_closing_during_a_background_merge_frees_the_index_at_once(tmp_path):
    """Closing an index whose background merge runs cancels the merge and waits for its
    thread: the index can be opened for writing again at once, and nothing logged is lost."""
    base, _ = clustered(3000, DIM, seed=25, queries=5)
    nearline.build(base[:1000], tmp_path / "g.index", preset="diskann", **BUILD).close()
    with nearline.open(tmp_path / "g.index", read_only=True) as probe:
        budget = probe.info()["memory"]["minimum"] + (150 << 10)
    idx = nearline.open(tmp_path / "g.index", memory_budget=budget)
    n = 1000
    while not idx.info()["updates"]["merging"] and n < 3000:
        idx.insert(base[n:n + 20])
        n += 20
    idx.close()
    with nearline.open(tmp_path / "g.index", memory_budget=budget) as again:
        assert again.delete([5]) == 1
        assert len(again) == n - 1
        assert again.check()["problems"] == []


def test_bad_updates_are_refused_and_change_nothing(tmp_path):
    base, _ = clustered(600, DIM, seed=23, queries=5)
    with nearline.build(base[:500], tmp_path / "g.index", preset="diskann", **BUILD) as idx:
        with pytest.raises(ValueError, match="shape"):
            idx.insert(np.zeros((2, DIM + 1), np.float32))
        bad = base[500:502].copy()
        bad[1, 3] = np.nan
        with pytest.raises(ValueError, match="row 1"):
            idx.insert(bad)
        with pytest.raises(ValueError, match="already in the index"):
            idx.insert(base[500:502], ids=[7, 900])
        with pytest.raises(ValueError, match="appears more than once"):
            idx.insert(base[500:502], ids=[900, 900])
        with pytest.raises(ValueError, match="dtype"):
            idx.insert(np.zeros((1, DIM), bool))
        assert len(idx) == 500 and idx.info()["updates"]["inserted_since_merge"] == 0
        assert idx.delete([123456]) == 0
        assert idx.check()["problems"] == []


_cli = run_cli


def test_cli_updates_a_graph_index(tmp_path):
    base, queries = clustered(1200, DIM, seed=24, queries=30)
    nearline.write_vectors(tmp_path / "b.fbin", base[:1000])
    nearline.write_vectors(tmp_path / "x.fbin", base[1000:])
    out = tmp_path / "g.index"
    r = _cli("build", str(tmp_path / "b.fbin"), str(out), "--preset", "diskann", "--R", "24", "--build-L", "48",
             "--threads", "2", "-q")
    assert r.returncode == 0, r.stderr
    r = _cli("insert", str(out), str(tmp_path / "x.fbin"), "--batch", "70")
    assert r.returncode == 0, r.stderr
    assert "inserted 200 vectors" in r.stdout and "1200 live" in r.stdout
    r = _cli("delete", str(out), "3", "1100", "999999")
    assert r.returncode == 0, r.stderr
    assert "deleted 2 of 3" in r.stdout and "1198 live" in r.stdout
    r = _cli("check", str(out), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["problems"] == [] and rep["inserted_since_merge"] == 199 and rep["deleted_since_merge"] == 1
    r = _cli("checkpoint", str(out))
    assert r.returncode == 0, r.stderr
    r = _cli("check", str(out), "--json")
    rep = json.loads(r.stdout)
    assert rep["problems"] == [] and rep["nodes"] == 1198 and rep["unreachable"] == 0
    with nearline.open(out, read_only=True) as idx:
        live = idx.ids()
        assert 3 not in live and 1100 not in live and len(live) == 1198


def test_a_write_ratio_leaves_the_delta_room_under_a_tight_budget(tmp_path):
    """A workload hint at build: the PQ codes give up the hinted share of what the budget
    leaves them, so the open index's update delta has room. Under a budget just above the
    minimum, the index built without the hint refuses inserts (the codes took everything);
    built with it, it takes them and finds them. The plan says why; a bad hint is refused."""
    base, queries = clustered(10_100, 32, seed=5, queries=20)
    # A budget a little above the minimum (workers and structures): the PQ codes fill the rest.
    opts = dict(preset="diskann", R=16, build_L=32, threads=2, memory_budget=600_000)
    shares, pq = {}, {}
    for w in (None, 0.4):
        with nearline.build(base[:10_000], tmp_path / f"w{w}", write_ratio=w, **opts) as idx:
            info = idx.info()
            shares[w] = info["updates"]["delta_share"]
            pq[w] = info["pq_bytes"] if "pq_bytes" in info else info["params"]["pq_bytes"]
            if w is None:
                with pytest.raises(ValueError, match="memory budget leaves the update layer"):
                    idx.insert(base[10_000:10_001])
                continue
            # What the share holds (25 vectors of 32-d with their lists and maps, about 32 KB of
            # its 36 KB) goes into the delta without a merge, and is found at once.
            new = idx.insert(base[10_000:10_025])
            upd = idx.info()["updates"]
            assert upd["since_open"]["merges"] == 0 and upd["inserted_since_merge"] == 25
            ids, _ = idx.search(base[10_000:10_010], k=1, L=64)
            assert ids[:, 0].tolist() == new[:10].tolist()
            assert idx.info()["memory"]["within_budget"]
    assert pq[0.4] < pq[None]
    assert shares[0.4] > 20 * max(shares[None], 1)
    decisions = {d["what"]: d for d in nearline.plan(base[:10_000], write_ratio=0.4, **opts)["decisions"]}
    assert decisions["update_reserve"]["value"] == "40%" and decisions["update_strategy"]["value"] == "out-of-place"
    for bad, err in ((1.5, ValueError), (-0.2, ValueError), ("half", TypeError)):
        with pytest.raises(err, match="write_ratio"):
            nearline.plan(base[:10_000], write_ratio=bad, **opts)


def test_update_workload_bench_smoke(tmp_path):
    """benches/update_workload.py end to end at a tiny size: every system sees the same stream,
    each point keeps the live set, and the ratios are the summaries' ratios."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "uw.json"
    cmd = [sys.executable, str(root / "benches" / "update_workload.py"), "--data", "synthetic:3000:16",
           "--systems", "spfresh,dgai:out_of_place", "--memory-budget", "4000000", "--epochs", "2",
           "--rate", "0.02", "--measure-every", "1", "--queries", "50", "--nprobe", "8", "--L", "32",
           "--threads", "1", "--workdir", str(tmp_path / "w"), "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(root / "python"))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert [s["system"]["name"] for s in res["systems"]] == ["spfresh", "dgai:out_of_place"]
    for s in res["systems"]:
        assert [p["epoch"] for p in s["points"]] == [0, 1, 2] and len(s["epochs"]) == 2
        for p in s["points"] + [s["fresh"]]:
            # 75% of the set built; each epoch deletes as many as it inserts.
            assert p["live"] == 2250 and p["problems"] == [] and p["within_budget"], p
            assert p["recall"] > 0.5 and p["disk_bytes"] > 0
    a, b = (s["summary"] for s in res["systems"])
    ratio = res["ratios"]["dgai:out_of_place/spfresh"]
    assert ratio["inserts_per_s"] == pytest.approx(b["inserts_per_s"] / a["inserts_per_s"])
    assert ratio["disk_bytes_end"] == pytest.approx(b["disk_bytes_end"] / a["disk_bytes_end"])
    bad = subprocess.run([*cmd[:2], "--data", "synthetic:3000:16", "--systems", "dgai:sideways",
                          "--workdir", str(tmp_path / "x"), "--out", str(tmp_path / "x.json")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode != 0 and "PRESET:STRATEGY" in bad.stderr
