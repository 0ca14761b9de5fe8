"""Starling in nearline: shuffled layout, block search, range search, the preset (real engine)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import nearline
from nearline import cli, datasets

from conftest import clustered, exact_knn


@pytest.fixture(scope="module")
def data():
    return clustered(6000, 32, seed=7, queries=60)


@pytest.fixture(scope="module")
def indexes(tmp_path_factory, data):
    base, _ = data
    root = tmp_path_factory.mktemp("starling")
    common = dict(R=32, build_L=64, pq_bytes=16, threads=2, seed=3)
    star = nearline.build(base, root / "starling", preset="starling", **common)
    plain = nearline.build(base, root / "diskann", preset="diskann", **common)
    yield star, plain
    star.close()
    plain.close()


def test_starling_preset_builds_a_shuffled_layout(indexes):
    star, plain = indexes
    si, pi = star.info(), plain.info()
    assert si["preset"] == "starling" and si["layout"]["kind"] == "shuffled"
    assert pi["layout"]["kind"] == "id"
    # A layout is a placement x a record format.
    assert (si["layout"]["placement"], si["layout"]["records"]) == ("shuffled", "plain")
    assert (pi["layout"]["placement"], pi["layout"]["records"]) == ("id", "plain")
    sh = si["layout"]["shuffle"]
    assert sh["algorithm"] == "bnf"
    # Shuffling never lowers locality below the ID layout's, and on shuffled
    # ids it raises it far above.
    assert si["overlap_ratio"] >= sh["id_overlap_ratio"]
    assert abs(pi["overlap_ratio"] - sh["id_overlap_ratio"]) < 1e-9
    assert si["overlap_ratio"] > 5 * max(pi["overlap_ratio"], 0.01)
    # node -> position and position -> node (the slots of the last blocks included).
    assert 8 * si["n"] <= si["memory"]["layout_map"] <= 8 * si["n"] + 4 * si["records_per_page"]
    assert si["entry"]["kind"] == "nav"


def test_block_search_recall_and_statistics(indexes, data):
    star, plain = indexes
    base, queries = data
    gt = exact_knn(base, queries, 10)
    ids, _, st = star.search(queries, 10, L=60, return_stats=True)
    assert nearline.recall(ids, gt, 10) >= 0.95
    pids, _, pst = plain.search(queries, 10, L=60, return_stats=True)
    assert nearline.recall(pids, gt, 10) >= 0.9
    xi = st["used_records"].sum() / st["page_records"].sum()
    pxi = pst["used_records"].sum() / pst["page_records"].sum()
    assert xi > 2 * pxi
    assert (st["colocated"] > 0).all()
    assert (pst["colocated"] == 0).all()
    np.testing.assert_array_equal(st["path_length"] + st["colocated"], st["hops"])
    # Every page policy and executor is exact with a full list.
    for kw in (dict(page_search="targets"), dict(page_search="block", sigma=1.0), dict(executor="beam", W=4)):
        ids, d = star.search(queries[:10], 10, L=len(base), **kw)
        np.testing.assert_array_equal(ids, gt[:10], err_msg=str(kw))


def _brute_range(base, queries, radius):
    d = ((queries[:, None, :].astype(np.float64) - base[None, :, :]) ** 2).sum(-1)
    return [np.flatnonzero(row <= radius) for row in d]


def test_range_search_matches_brute_force(indexes, data):
    star, plain = indexes
    base, queries = data
    d = np.sort(((queries[:, None, :].astype(np.float64) - base[None, :, :]) ** 2).sum(-1), axis=1)
    radius = float(np.median(d[:, 50]))
    want = _brute_range(base, queries, radius)
    for idx in (star, plain):
        lims, ids, dist = idx.range_search(queries, radius, L=len(base))
        assert lims.dtype == np.int64 and len(lims) == len(queries) + 1
        for i, w in enumerate(want):
            got = ids[lims[i]:lims[i + 1]]
            assert sorted(got.tolist()) == sorted(w.tolist())
            dd = dist[lims[i]:lims[i + 1]]
            assert (np.diff(dd) >= 0).all() and (dd <= radius * (1 + 1e-5)).all()
        # Starting small, the list doubles: answers stay within the radius
        # and nearly complete.
        lims, ids, dist, st = idx.range_search(queries, radius, L=20, return_stats=True)
        hit = sum(len(set(ids[lims[i]:lims[i + 1]].tolist()) & set(w.tolist())) for i, w in enumerate(want))
        assert hit / sum(len(w) for w in want) >= 0.9
        assert st["doublings"].sum() > 0
    # A 1-D query is one query.
    lims, ids, _ = star.range_search(queries[0], radius)
    assert len(lims) == 2 and lims[1] == len(want[0])


def test_bad_starling_arguments(indexes, data, tmp_path):
    star, _ = indexes
    base, queries = data
    for kw, msg in [(dict(sigma=0), "sigma"), (dict(sigma=1.5), "sigma"), (dict(sigma=float("nan")), "sigma"),
                    (dict(page_search="pages"), "page_search")]:
        with pytest.raises(ValueError, match=msg):
            star.search(queries, 10, **kw)
    for r in (float("nan"), -1.0, float("inf")):
        with pytest.raises(ValueError, match="radius"):
            star.range_search(queries, r)
    with pytest.raises(ValueError, match="ratio"):
        star.range_search(queries, 1.0, ratio=0.0)
    with pytest.raises(ValueError, match="max_L"):
        star.range_search(queries, 1.0, L=50, max_L=10)
    for kw, msg in [(dict(layout="random"), "layout"), (dict(shuffle="metis"), "shuffle"),
                    (dict(bnf_iters=0), "bnf_iters"), (dict(bnf_tau=-1.0), "bnf_tau"), (dict(preset="starlink"), "preset")]:
        with pytest.raises(ValueError, match=msg):
            nearline.build(base[:500], tmp_path / "bad", **kw)


def test_corrupt_location_section_is_refused(data, tmp_path):
    base, _ = data
    path = tmp_path / "s"
    nearline.build(base[:800], path, R=16, build_L=32, pq_bytes=8, layout="shuffled", shuffle="bnp", threads=1).close()
    sec = path / "id_to_location.bin"
    raw = bytearray(sec.read_bytes())
    raw[-1] ^= 0xFF
    sec.write_bytes(bytes(raw))
    with pytest.raises(nearline.CorruptIndexError, match="id_to_location"):
        nearline.open(path)
    sec.write_bytes(bytes(raw[:-4]))
    with pytest.raises(nearline.CorruptIndexError):
        nearline.open(path)


def test_cli_starling_build_and_range_search(tmp_path, data, capsys):
    base, queries = data
    b = datasets.write_bin(tmp_path / "b.fbin", base[:2000])
    q = datasets.write_bin(tmp_path / "q.fbin", queries[:20])
    out = tmp_path / "idx"
    assert cli.main(["build", str(b), str(out), "--layout", "shuffled", "--shuffle", "bnf", "--bnf-iters", "4",
                     "--R", "24", "--build-L", "48", "--pq-bytes", "8", "--threads", "2"]) == 0
    text = capsys.readouterr().out
    assert "layout=shuffled" in text and "OR(G)=" in text
    assert cli.main(["search", str(out), str(q), "--radius", "40", "--L", "40", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    # The summary reports what ran: block search, resolved for the shuffled layout.
    assert summary["nq"] == 20 and summary["page_search"] == "block"
    d = ((queries[:20, None, :].astype(np.float64) - base[None, :2000, :]) ** 2).sum(-1)
    assert summary["results"] <= int((d <= 40).sum())
    assert cli.main(["search", str(out), str(q), "--k", "5", "--page-search", "targets", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["page_search"] == "targets"


def test_range_entry_cutoff_ends_only_far_queries_unread(indexes, data):
    star, _ = indexes
    base, queries = data
    d = np.sort(((queries[:, None, :].astype(np.float64) - base[None, :, :]) ** 2).sum(-1), axis=1)
    radius = float(np.median(d[:, 0]))  # about half the queries have an answer
    want = _brute_range(base, queries, radius)
    # A list as large as the set: every query that is not cut gets its exact answer.
    kw = dict(L=len(base), W=4, executor="beam", return_stats=True)
    cuts = {}
    for c in (1.0, 2.0, 1e9):
        lims, ids, dist, st = star.range_search(queries, radius, entry_cutoff=c, **kw)
        cut = st["reads"] == 0
        cuts[c] = int(cut.sum())
        for i in range(len(queries)):
            got = ids[lims[i]:lims[i + 1]]
            if cut[i]:
                assert got.size == 0, (c, i)
            else:
                # Queries that pass the cutoff search as without it.
                assert sorted(got.tolist()) == sorted(want[i].tolist()), (c, i)
                assert st["reads"][i] > 0
    assert cuts[1.0] > 0 and cuts[1e9] == 0
    assert cuts[1.0] >= cuts[2.0] >= cuts[1e9]


def test_range_entry_cutoff_rejects_bad_values(indexes, data, tmp_path):
    star, plain = indexes
    base, queries = data
    for bad in (0.5, 0.0, -2.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="entry_cutoff"):
            star.range_search(queries, 1.0, entry_cutoff=bad)
    for bad in (True, "2", [2.0]):
        with pytest.raises(TypeError, match="entry_cutoff"):
            star.range_search(queries, 1.0, entry_cutoff=bad)
    # The DiskANN preset starts from the medoid, whose distance is unknown
    # before a read: nothing to cut on.
    with pytest.raises(ValueError, match="medoid"):
        plain.range_search(queries, 1.0, entry_cutoff=2.0)
    with nearline.build(base[:600], tmp_path / "ip", metric="ip", preset="starling", R=16, build_L=32, pq_bytes=8,
                        threads=2) as ip:
        with pytest.raises(ValueError, match="l2 or cosine"):
            ip.range_search(queries, 0.5, entry_cutoff=2.0)
        ip.range_search(queries, 0.5)  # without the cutoff ip range search works


def test_cli_search_entry_cutoff(tmp_path, indexes, data, capsys):
    star, _ = indexes
    base, queries = data
    q = datasets.write_bin(tmp_path / "q.fbin", queries[:20])
    path = star.info()["path"]
    assert cli.main(["search", path, str(q), "--radius", "40", "--L", "20", "--entry-cutoff", "1", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["entry_cutoff"] == 1.0
    # Below the declared range (>= 1): a usage error naming the flag, before the index is opened.
    with pytest.raises(SystemExit) as e:
        cli.main(["search", path, str(q), "--radius", "40", "--entry-cutoff", "0.5"])
    assert e.value.code == cli.EXIT_ERROR
    assert "--entry-cutoff: expected a number >= 1" in capsys.readouterr().err
    assert cli.main(["search", path, str(q), "--k", "5", "--entry-cutoff", "2"]) == cli.EXIT_ERROR
    assert "--radius" in capsys.readouterr().err
