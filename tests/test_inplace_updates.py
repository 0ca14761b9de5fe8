"""In-place updates of a graph index (OdinANN insert, IP-DiskANN delete): ``update="in_place"``
from Python and the CLI rewrites the disk graph's records, finds what it inserted, never returns a
deleted id, survives a reopen without a checkpoint (the log's page images), and refuses the
layouts and values it cannot take with a clear error."""

from __future__ import annotations

import json

import numpy as np
import pytest

import nearline
from conftest import clustered, recall_on_live, run_cli

DIM = 16
BUILD = dict(R=24, build_L=48, threads=2, memory_budget="4MB")


@pytest.mark.parametrize("preset", ["diskann", "pipeann"])
def test_in_place_inserts_and_deletes(tmp_path, preset):
    base, queries = clustered(2500, DIM, seed=23, queries=60)
    n0 = 2000
    path = tmp_path / "g.index"
    with nearline.build(base[:n0], path, preset=preset, update="in_place", **BUILD) as idx:
        size = (path / "pages.bin").stat().st_size
        new_ids = idx.insert(base[n0:])
        assert new_ids.tolist() == list(range(n0, 2500))
        assert (path / "pages.bin").stat().st_size > size, "the page file takes the inserts"
        gone = np.arange(0, n0, 10)
        assert idx.delete(gone) == len(gone)
        assert idx.delete(gone) == 0
        live = np.ones(2500, bool)
        live[gone] = False
        ids = np.flatnonzero(live)
        assert recall_on_live(idx, ids, base[live], queries, full=True) >= 0.9
        own, _ = idx.search(base[n0:n0 + 50], k=5)
        assert all(n0 + j in row for j, row in enumerate(own.tolist()))
    # No checkpoint: the reopen replays the log.
    with nearline.open(path) as idx:
        assert recall_on_live(idx, ids, base[live], queries, full=True) >= 0.9
        assert idx.check()["live_ids"] == len(ids)
        got, _ = idx.search(base[gone[:20]], k=10)
        assert not set(got.ravel().tolist()) & set(gone.tolist())
        idx.checkpoint()
    r = run_cli("check", str(path), "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["problems"] == [] and rep["update"] == "in_place" and rep["tombstones"] == len(gone)


def test_cli_builds_and_updates_in_place(tmp_path):
    base, queries = clustered(1200, DIM, seed=5, queries=10)
    np.save(tmp_path / "base.npy", base[:1000])
    np.save(tmp_path / "more.npy", base[1000:])
    idx = tmp_path / "c.index"
    r = run_cli("build", str(tmp_path / "base.npy"), str(idx), "--update", "in_place", "--R", "24",
                "--build-L", "48", "--threads", "2")
    assert r.returncode == 0, r.stderr
    r = run_cli("plan", str(tmp_path / "base.npy"), "--update", "in_place", "--json")
    assert r.returncode == 0, r.stderr
    decisions = {d["what"]: d for d in json.loads(r.stdout)["decisions"]}
    assert decisions["update_strategy"]["value"] == "in-place"
    r = run_cli("insert", str(idx), str(tmp_path / "more.npy"))
    assert r.returncode == 0, r.stderr
    r = run_cli("delete", str(idx), "3", "4")
    assert r.returncode == 0, r.stderr
    with nearline.open(idx) as ix:
        assert ix.check()["live_ids"] == 1198
        got, _ = ix.search(base[3:5], k=10)
        assert 3 not in got and 4 not in got


def test_in_place_refusals(tmp_path):
    base, _ = clustered(800, DIM, seed=2, queries=1)
    with pytest.raises(ValueError, match="update"):
        nearline.build(base, tmp_path / "x", update="sideways", **BUILD)
    with pytest.raises(ValueError, match="in_place.*layout|layout.*in_place"):
        nearline.build(base, tmp_path / "s", preset="starling", update="in_place", **BUILD)
    r = run_cli("build", "--help")
    assert "--update" in r.stdout


def test_a_writer_in_place_excludes_readers_in_other_processes(tmp_path):
    base, _ = clustered(800, DIM, seed=4, queries=1)
    path = tmp_path / "g.index"
    nearline.build(base, path, update="in_place", **BUILD).close()
    with nearline.open(path) as w:
        w.delete([1, 2])
        # Its pages are rewritten in place: another process may not read them meanwhile.
        r = run_cli("check", str(path), "--json")
        assert r.returncode != 0 and "updated in place" in r.stderr, r.stderr
        with pytest.raises(OSError, match="cannot follow"):
            nearline.open(path, read_only=True)
    # Once the writer has closed, readers share the index and keep writers out.
    r = run_cli("check", str(path), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["live_ids"] == 798
    with nearline.open(path, read_only=True) as a, nearline.open(path, read_only=True) as b:
        assert a.search(base[5:6], k=3)[0].tolist() == b.search(base[5:6], k=3)[0].tolist()
        with pytest.raises(OSError, match="excludes every other open"):
            nearline.open(path)
