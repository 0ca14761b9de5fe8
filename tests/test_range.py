"""Range-search evaluation: exact range ground truth, its file, AP, the radius picker, the CLI and bench range mode."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import nearline
from nearline import _bench_worker, bench, cli, datasets, peers

METRICS = ("l2", "ip", "cosine")


# --------------------------------------------------------------------------- references


def user_values(base: np.ndarray, queries: np.ndarray, metric: str) -> np.ndarray:
    """Every (query, base) value in float64 numpy: squared L2, inner product or cosine similarity."""
    b = base.astype(np.float64)
    q = queries.astype(np.float64)
    if metric == "l2":
        return ((q[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    if metric == "ip":
        return q @ b.T
    bn = np.linalg.norm(b, axis=1)
    qn = np.linalg.norm(q, axis=1)
    den = qn[:, None] * bn[None, :]
    return np.where(den > 0, (q @ b.T) / np.where(den > 0, den, 1), 0.0)


def brute_range(base, queries, radius, metric):
    """Exact answers in numpy: per query, ids sorted closest first, ties by id."""
    v = user_values(base, queries, metric)
    out = []
    for row in v:
        hit = np.flatnonzero(row >= radius) if metric != "l2" else np.flatnonzero(row <= radius)
        key = -row[hit] if metric != "l2" else row[hit]
        out.append(hit[np.lexsort((hit, key))])
    return out


def rows(lims, ids):
    return [np.asarray(ids[lims[i]:lims[i + 1]]) for i in range(len(lims) - 1)]


@pytest.fixture(scope="module")
def float_data():
    rng = np.random.default_rng(7)
    base = rng.normal(size=(1500, 12)).astype(np.float32)
    queries = rng.normal(size=(40, 12)).astype(np.float32)
    return base, queries


# --------------------------------------------------------------------------- exact range ground truth


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_range_gt_matches_numpy_on_integer_data_exactly(metric):
    # uint8 values: squared L2 and inner products are exact integers in float32,
    # so membership and order must agree with numpy exactly, ties included.
    rng = np.random.default_rng(1)
    base = rng.integers(0, 4, size=(800, 6)).astype(np.uint8)
    queries = rng.integers(0, 4, size=(25, 6)).astype(np.uint8)
    v = user_values(base, queries, metric)
    fracs = (0.0, 0.01, 0.1, 0.5) if metric == "l2" else (1.0, 0.99, 0.9, 0.5)
    for radius in np.quantile(v, fracs, method="nearest"):  # actual pair values: pairs tie the radius
        radius = float(radius)
        lims, ids, d = nearline.compute_range_ground_truth(base, queries, radius, metric)
        assert lims.dtype == np.int64 and ids.dtype == np.int64 and d.dtype == np.float32
        assert lims.shape == (26,) and lims[0] == 0 and lims[-1] == ids.size == d.size
        want = brute_range(base, queries, radius, metric)
        assert sum(w.size for w in want) > 0
        for q, (got, exp) in enumerate(zip(rows(lims, ids), want)):
            np.testing.assert_array_equal(got, exp, err_msg=f"query {q} radius {radius}")
        np.testing.assert_array_equal(d, np.concatenate([v[q, w] for q, w in enumerate(want)]).astype(np.float32))


@pytest.mark.parametrize("metric", METRICS)
def test_range_gt_matches_numpy_on_float_data(float_data, metric):
    base, queries = float_data
    v = user_values(base, queries, metric)
    flat = np.sort(v.ravel())
    for frac in (0.001, 0.02, 0.2):
        radius = float(flat[int(frac * flat.size)] if metric == "l2" else flat[int((1 - frac) * flat.size)])
        lims, ids, d = nearline.compute_range_ground_truth(base, queries, radius, metric, threads=2)
        want = brute_range(base, queries, radius, metric)
        scale = 1e-5 * max(1.0, abs(radius))
        for q, (got, exp) in enumerate(zip(rows(lims, ids), want)):
            # Pairs within float32 rounding of the radius may go either way; all others must agree.
            clear = np.abs(v[q] - radius) > scale
            assert set(got[clear[got]]) == set(exp[clear[exp]]), (metric, q)
            gd = d[lims[q]:lims[q + 1]]
            np.testing.assert_allclose(gd, v[q, got], rtol=1e-4, atol=1e-4)
            # Closest first.
            assert np.all(np.diff(gd) >= 0) if metric == "l2" else np.all(np.diff(gd) <= 0)
            assert np.all(gd <= radius) if metric == "l2" else np.all(gd >= radius)


def test_range_gt_agrees_with_knn_ground_truth(float_data):
    base, queries = float_data
    k = 30
    kids, kd = nearline.compute_ground_truth(base, queries, k)
    # Query 0's k-th distance as radius: its answer is exactly its top k.
    lims, ids, d = nearline.compute_range_ground_truth(base, queries, float(kd[0, -1]))
    np.testing.assert_array_equal(ids[: lims[1]], kids[0])
    np.testing.assert_array_equal(d[: lims[1]], kd[0])
    for q, got in enumerate(rows(lims, ids)):
        m = min(got.size, k)
        np.testing.assert_array_equal(got[:m], kids[q, :m])


def test_range_gt_ties_empty_answers_and_dtypes():
    base = np.ones((40, 3), dtype=np.float32)
    q = np.zeros((2, 3), dtype=np.float32)
    lims, ids, d = nearline.compute_range_ground_truth(base, q, 3.0)
    np.testing.assert_array_equal(lims, [0, 40, 80])
    np.testing.assert_array_equal(ids, np.tile(np.arange(40), 2))  # ties: ascending ids
    assert np.all(d == 3.0)
    lims, ids, d = nearline.compute_range_ground_truth(base, q, 2.9999)
    np.testing.assert_array_equal(lims, [0, 0, 0])
    assert ids.size == 0 and d.size == 0
    # Radius 0 finds exact duplicates only.
    lims, ids, _ = nearline.compute_range_ground_truth(np.vstack([base, q[:1]]), q, 0.0)
    np.testing.assert_array_equal(lims, [0, 1, 2])
    np.testing.assert_array_equal(ids, [40, 40])
    # Other dtypes; queries are cast to the base's dtype; float64 becomes float32.
    for dt in (np.float16, np.int8, np.uint8):
        b = (np.arange(60).reshape(20, 3) % 5).astype(dt)
        lims, ids, _ = nearline.compute_range_ground_truth(b, b[:4].astype(np.float64), 0.0)
        assert all(i in got for i, got in enumerate(rows(lims, ids)))
    # No queries.
    lims, ids, d = nearline.compute_range_ground_truth(base, np.zeros((0, 3), np.float32), 1.0)
    np.testing.assert_array_equal(lims, [0])


def test_range_gt_independent_of_threads(float_data):
    base, queries = float_data
    a = nearline.compute_range_ground_truth(base, queries, 14.0, threads=1)
    b = nearline.compute_range_ground_truth(base, queries, 14.0, threads=3)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("radius, metric, exc, match", [
    (float("nan"), "l2", ValueError, "not a finite"),
    (float("inf"), "ip", ValueError, "not a finite"),
    (-float("inf"), "cosine", ValueError, "not a finite"),
    (1e300, "l2", ValueError, "not a finite"),
    (10**400, "l2", ValueError, "not a finite"),
    (-0.5, "l2", ValueError, "negative"),
    (True, "l2", TypeError, "number"),
    ("1.0", "l2", TypeError, "number"),
    (1.0, "hamming", ValueError, "unknown metric"),
])
def test_range_gt_rejects_bad_arguments(radius, metric, exc, match):
    base = np.zeros((5, 2), np.float32)
    with pytest.raises(exc, match=match):
        nearline.compute_range_ground_truth(base, base, radius, metric)


def test_range_gt_other_argument_errors():
    base = np.zeros((5, 2), np.float32)
    with pytest.raises(ValueError, match="dimension 3"):
        nearline.compute_range_ground_truth(base, np.zeros((1, 3), np.float32), 1.0)
    with pytest.raises(ValueError, match="threads=0"):
        nearline.compute_range_ground_truth(base, base, 1.0, threads=0)
    # Negative scores are fine for ip and cosine.
    lims, _, _ = nearline.compute_range_ground_truth(base, base, -0.5, "ip")
    np.testing.assert_array_equal(lims, np.arange(6) * 5)


# --------------------------------------------------------------------------- the file


def test_range_gt_file_round_trip_and_layout(tmp_path, float_data):
    base, queries = float_data
    lims, ids, d = nearline.compute_range_ground_truth(base, queries, 12.0)
    p = tmp_path / "range.bin"
    nearline.write_range_ground_truth(p, lims, ids, d)
    raw = p.read_bytes()
    nq, total = np.frombuffer(raw[:8], "<u4")
    assert (nq, total) == (40, lims[-1])
    assert len(raw) == 8 + 4 * nq + 8 * total
    np.testing.assert_array_equal(np.frombuffer(raw[8:8 + 4 * nq], "<u4"), np.diff(lims))
    np.testing.assert_array_equal(np.frombuffer(raw[8 + 4 * nq:8 + 4 * (nq + total)], "<u4"), ids)
    l2, i2, d2 = nearline.read_range_ground_truth(p)
    np.testing.assert_array_equal(l2, lims)
    np.testing.assert_array_equal(i2, ids)
    np.testing.assert_array_equal(d2, d)
    # DiskANN's ids-only form.
    nearline.write_range_ground_truth(p, lims, ids)
    assert p.stat().st_size == 8 + 4 * nq + 4 * total
    l3, i3, d3 = nearline.read_range_ground_truth(p)
    np.testing.assert_array_equal(i3, ids)
    assert d3 is None


def test_range_gt_file_refuses_bad_files(tmp_path):
    p = tmp_path / "bad-range.bin"
    nearline.write_range_ground_truth(p, np.array([0, 2, 3]), np.array([5, 6, 7]), np.zeros(3, np.float32))
    good = p.read_bytes()
    for cut in (len(good) - 3, 10, 3, 0):
        p.write_bytes(good[:cut])
        with pytest.raises(nearline.FormatError, match="bad-range.bin"):
            nearline.read_range_ground_truth(p)
    bad = bytearray(good)
    bad[8:12] = (5).to_bytes(4, "little")
    p.write_bytes(bytes(bad))
    with pytest.raises(nearline.FormatError, match="add up to 6"):
        nearline.read_range_ground_truth(p)
    with pytest.raises(OSError):
        nearline.read_range_ground_truth(tmp_path / "missing.bin")


@pytest.mark.parametrize("lims, ids, dists, match", [
    ([1, 2], [0, 1], None, r"lims\[0\] is 1"),
    ([0, 2, 1], [0, 1], None, "decreases at query 1"),
    ([0, 2], [0, 1, 2], None, "ends at 2 but there are 3 ids"),
    ([], [], None, "non-empty 1-D"),
    ([[0, 1]], [0], None, "non-empty 1-D"),
    ([0, 2], [0, 1], [0.5], r"distances has shape \(1,\)"),
    ([0, 1], [-3], None, "not in 0..2"),
])
def test_write_range_gt_rejects_bad_arrays(tmp_path, lims, ids, dists, match):
    with pytest.raises(ValueError, match=match):
        nearline.write_range_ground_truth(tmp_path / "x.bin", np.array(lims, dtype=np.int64),
                                          np.array(ids, dtype=np.int64), dists)
    assert not (tmp_path / "x.bin").exists()


# --------------------------------------------------------------------------- average precision


def test_average_precision_per_query_definition():
    gt_lims, gt_ids = [0, 4, 6, 6, 6], [1, 2, 3, 4, 7, 8]
    # q0: 2 of 4 found (+ one id not in the answer); q1: all; q2: empty and empty -> 1; q3: empty truth, result -> 0.
    lims, ids = [0, 3, 5, 5, 6], [2, 4, 9, 8, 7, 11]
    ap = nearline.average_precision(lims, ids, gt_lims, gt_ids)
    assert ap == pytest.approx((0.5 + 1.0 + 1.0 + 0.0) / 4)
    assert nearline.average_precision(gt_lims, gt_ids, gt_lims, gt_ids) == 1.0
    # Padding ids (< 0) are no results; duplicates count once.
    assert nearline.average_precision([0, 3, 5, 6, 6], [1, 1, -1, 7, 7, -1], gt_lims, gt_ids) == pytest.approx(
        (0.25 + 0.5 + 1.0 + 1.0) / 4)
    # Huge ids take the per-query path and give the same answer.
    big = 2**61
    assert nearline.average_precision([0, 2, 3], [big, 5, big + 1], [0, 1, 3], [big, big + 1, 9]) == pytest.approx(
        (1.0 + 0.5) / 2)


def test_average_precision_matches_a_python_loop():
    rng = np.random.default_rng(3)
    nq = 50
    gt_counts = rng.integers(0, 20, nq)
    gt_lims = np.concatenate([[0], np.cumsum(gt_counts)])
    gt_ids = np.concatenate([rng.choice(500, c, replace=False) for c in gt_counts])
    res = [np.concatenate([g[: rng.integers(0, g.size + 1)], rng.integers(500, 600, rng.integers(0, 3))])
           for g in rows(gt_lims, gt_ids)]
    lims = np.concatenate([[0], np.cumsum([r.size for r in res])])
    ids = np.concatenate(res)
    want = np.mean([len(set(r) & set(g)) / len(g) if len(g) else float(len(r) == 0)
                    for r, g in zip(res, rows(gt_lims, gt_ids))])
    assert nearline.average_precision(lims, ids, gt_lims, gt_ids) == pytest.approx(want)


def test_average_precision_rejects_bad_input():
    with pytest.raises(ValueError, match="2 queries, the ground truth has 1"):
        nearline.average_precision([0, 1, 1], [3], [0, 1], [3])
    with pytest.raises(ValueError, match="zero queries"):
        nearline.average_precision([0], [], [0], [])
    with pytest.raises(ValueError, match="result lims ends at 2"):
        nearline.average_precision([0, 2], [3], [0, 1], [3])
    with pytest.raises(ValueError, match="ground-truth lims"):
        nearline.average_precision([0, 1], [3], [0.0, 1.0], [3])


# --------------------------------------------------------------------------- radius for a mean neighbour count


@pytest.mark.parametrize("metric", METRICS)
def test_radius_for_mean_neighbors_hits_the_mean(float_data, metric):
    base, queries = float_data
    for mean in (1, 7.5, 60):
        r = nearline.radius_for_mean_neighbors(base, queries, mean, metric)
        lims, _, _ = nearline.compute_range_ground_truth(base, queries, r, metric)
        # Random floats: no pair ties the T-th one, so the count is exactly T.
        assert lims[-1] == round(mean * len(queries)), (metric, mean)
        # It is the T-th value in numpy too (to float32 rounding).
        v = np.sort(user_values(base, queries, metric).ravel())
        if metric != "l2":
            v = v[::-1]
        assert r == pytest.approx(v[round(mean * len(queries)) - 1], rel=1e-5, abs=1e-5)


def test_radius_for_mean_neighbors_grows_k_past_a_dense_query():
    # 600 points at the origin and 1400 far away; query 0 sits at the origin and owns
    # most of the closest pairs, far more than the first k (max(32, 2 * mean)) shows.
    rng = np.random.default_rng(5)
    dense = rng.normal(scale=0.01, size=(600, 4))
    far = rng.normal(loc=50.0, scale=5.0, size=(1400, 4))
    base = np.vstack([dense, far]).astype(np.float32)
    queries = np.vstack([np.zeros((1, 4)), rng.normal(loc=50.0, scale=5.0, size=(9, 4))]).astype(np.float32)
    r = nearline.radius_for_mean_neighbors(base, queries, 80)
    lims, _, _ = nearline.compute_range_ground_truth(base, queries, r)
    assert lims[-1] == 800
    assert lims[1] == 600  # query 0 keeps all its dense neighbours
    v = np.sort(user_values(base, queries, "l2").ravel())
    assert r == pytest.approx(v[799], rel=1e-4)


def test_radius_for_mean_neighbors_ties_on_integer_data():
    rng = np.random.default_rng(6)
    base = rng.integers(0, 3, size=(500, 3)).astype(np.uint8)
    queries = rng.integers(0, 3, size=(20, 3)).astype(np.uint8)
    r = nearline.radius_for_mean_neighbors(base, queries, 30)
    lims, _, d = nearline.compute_range_ground_truth(base, queries, r)
    # Every pair tied with the 600th is in: at least the mean, and the next closer radius gives fewer.
    assert lims[-1] >= 600
    below = np.nextafter(np.float32(r), np.float32(-1))
    lims2, _, _ = nearline.compute_range_ground_truth(base, queries, float(below))
    assert lims2[-1] < 600
    assert r in set(d.tolist())


@pytest.mark.parametrize("mean, exc, match", [
    (0, ValueError, r"in \(0, n=20\]"), (-1, ValueError, "in"), (21, ValueError, "n=20"),
    (float("nan"), ValueError, "finite"), (True, TypeError, "number"), ("5", TypeError, "number"),
])
def test_radius_for_mean_neighbors_rejects_bad_arguments(mean, exc, match):
    base = np.zeros((20, 2), np.float32)
    with pytest.raises(exc, match=match):
        nearline.radius_for_mean_neighbors(base, base, mean)


def test_radius_for_mean_neighbors_other_errors():
    base = np.arange(40, dtype=np.float32).reshape(20, 2)
    with pytest.raises(ValueError, match="at least one query"):
        nearline.radius_for_mean_neighbors(base, np.zeros((0, 2), np.float32), 3)
    with pytest.raises(ValueError, match="unknown metric"):
        nearline.radius_for_mean_neighbors(base, base, 3, "manhattan")
    # The whole base: the radius reaches every pair.
    r = nearline.radius_for_mean_neighbors(base, base[:3], 20)
    lims, _, _ = nearline.compute_range_ground_truth(base, base[:3], r)
    assert lims[-1] == 60


# --------------------------------------------------------------------------- CLI


@pytest.fixture()
def files(tmp_path, float_data):
    base, queries = float_data
    bp, qp = tmp_path / "base.fbin", tmp_path / "q.fbin"
    datasets.write_bin(bp, base)
    datasets.write_bin(qp, queries)
    return bp, qp


def test_cli_gt_radius_round_trip(tmp_path, files, float_data, capsys):
    bp, qp = files
    out = tmp_path / "range.bin"
    assert cli.main(["gt", str(bp), str(qp), str(out), "--radius", "12.5", "--threads", "2"]) == 0
    text = capsys.readouterr().out
    lims, ids, d = nearline.read_range_ground_truth(out)
    want = nearline.compute_range_ground_truth(*float_data, 12.5)
    np.testing.assert_array_equal(lims, want[0])
    np.testing.assert_array_equal(ids, want[1])
    np.testing.assert_array_equal(d, want[2])
    assert f"40 queries, {lims[-1]} results within radius 12.5" in text
    # Scores: a negative ip radius is fine.
    assert cli.main(["gt", str(bp), str(qp), str(out), "--radius", "-1", "--metric", "ip"]) == 0
    lims, _, d = nearline.read_range_ground_truth(out)
    assert lims[-1] > 0 and np.all(d >= -1)


def test_cli_gt_mean_neighbors(tmp_path, files, float_data, capsys):
    bp, qp = files
    assert cli.main(["gt", str(bp), str(qp), "--mean-neighbors", "25"]) == 0
    text = capsys.readouterr().out
    r = nearline.radius_for_mean_neighbors(*float_data, 25)
    assert f"radius for 25 mean neighbours per query (squared L2 distance): {r!r}" in text
    out = tmp_path / "range.bin"
    assert cli.main(["gt", str(bp), str(qp), str(out), "--mean-neighbors", "25"]) == 0
    lims, _, _ = nearline.read_range_ground_truth(out)
    assert lims[-1] == 25 * 40
    # With --radius too: prints the picked radius, writes at the given one.
    assert cli.main(["gt", str(bp), str(qp), str(out), "--mean-neighbors", "25", "--radius", "3"]) == 0
    assert "radius for 25 mean" in capsys.readouterr().out
    lims3, _, _ = nearline.read_range_ground_truth(out)
    assert lims3[-1] == nearline.compute_range_ground_truth(*float_data, 3.0)[0][-1]


@pytest.mark.parametrize("args, match", [
    (["--radius", "-1"], "negative"),
    (["--radius", "1", "--k", "5"], "exclusive"),
    (["--mean-neighbors", "5", "--k", "5"], "exclusive"),
    (["--mean-neighbors", "100000"], "n=1500"),
    ([], "OUT is required"),
])
def test_cli_gt_errors(tmp_path, files, capsys, args, match):
    bp, qp = files
    out = [str(tmp_path / "o.bin")] if "--mean-neighbors" not in args and args else []
    assert cli.main(["gt", str(bp), str(qp), *out, *args]) == cli.EXIT_ERROR
    assert match in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--radius", "nan"], ["--radius", "x"], ["--mean-neighbors", "0"],
                                  ["--mean-neighbors", "inf"]])
def test_cli_gt_argument_types(files, args):
    bp, qp = files
    with pytest.raises(SystemExit) as e:
        cli.main(["gt", str(bp), str(qp), "out.bin", *args])
    assert e.value.code == 2


def test_cli_gt_knn_default_k_unchanged(tmp_path, files):
    bp, qp = files
    out = tmp_path / "gt.bin"
    assert cli.main(["gt", str(bp), str(qp), str(out)]) == 0
    ids, _ = nearline.read_ground_truth(out)
    assert ids.shape == (40, 100)


# --------------------------------------------------------------------------- bench: pure helpers


def _fake_knn(base: np.ndarray, metric: str = "l2", calls: list | None = None, reads_per_call: int = 3):
    """Exact k-NN standing in for an index (ids, user values, stats)."""
    def search(q, k, L):
        if calls is not None:
            calls.append((len(q), k, L))
        v = user_values(base, q, metric)
        key = -v if metric != "l2" else v
        order = np.argsort(key, axis=1, kind="stable")[:, :k]
        stats = {"reads": np.full(len(q), reads_per_call), "total_us": np.full(len(q), 10.0),
                 "bytes_read": np.full(len(q), 4096.0), "used_bytes": np.full(len(q), 1024.0)}
        return order, np.take_along_axis(v, order, axis=1).astype(np.float32), stats
    return search


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_knn_doubling_range_with_exact_search_is_exact(float_data, metric):
    base, queries = float_data
    v = np.sort(user_values(base, queries, metric).ravel())
    radius = float(v[40 * 30] if metric == "l2" else v[::-1][40 * 30])
    calls: list = []
    out = bench.knn_doubling_range(_fake_knn(base, metric, calls), queries, radius, L=20, k0=4, n=len(base),
                                   higher_is_closer=metric != "l2")
    want = brute_range(base, queries, radius, metric)
    for got, exp in zip(rows(out["lims"], out["ids"]), want):
        np.testing.assert_array_equal(np.sort(got), np.sort(exp))
    # k doubles from 4, L = max(L, k), and only queries still full go again.
    ks = [c[1] for c in calls]
    assert ks == [4 * 2**i for i in range(len(ks))] and calls[0] == (40, 4, 20)
    assert [c[2] for c in calls] == [max(20, k) for k in ks]
    assert all(a[0] >= b[0] for a, b in zip(calls, calls[1:]))
    # Rounds: k = 4, 8, 16, ... until a query has fewer true neighbours than k.
    for c, r in zip(np.diff(out["lims"]), out["rounds"]):
        k, want_rounds = 4, 1
        while c >= k and k < len(base):
            k, want_rounds = min(2 * k, len(base)), want_rounds + 1
        assert r == want_rounds
    # Stats add up over rounds; io_utilisation is recomputed from the sums.
    np.testing.assert_array_equal(out["stats"]["reads"], 3 * out["rounds"])
    np.testing.assert_allclose(out["stats"]["io_utilisation"], 0.25)


def test_knn_doubling_range_rounds_and_caps():
    base = np.arange(10, dtype=np.float32)[:, None]
    q = np.array([[0.0], [100.0]], np.float32)
    # Radius covers everything for query 0: k doubles 3 -> 6 -> 10 (capped at n) and stops there.
    calls: list = []
    out = bench.knn_doubling_range(_fake_knn(base, "l2", calls), q, 81.0, L=1, k0=3, n=10, higher_is_closer=False)
    np.testing.assert_array_equal(out["lims"], [0, 10, 10])
    np.testing.assert_array_equal(out["rounds"], [3, 1])
    assert [c[:2] for c in calls] == [(2, 3), (1, 6), (1, 10)]
    # Padding ids are never results and stop the doubling.
    def padded(qs, k, L):
        return np.full((len(qs), k), -1), np.zeros((len(qs), k), np.float32), None
    out = bench.knn_doubling_range(padded, q, 1.0, L=5, k0=2, n=10, higher_is_closer=False)
    np.testing.assert_array_equal(out["lims"], [0, 0, 0])
    assert out["stats"] is None
    with pytest.raises(ValueError, match="k0=0"):
        bench.knn_doubling_range(padded, q, 1.0, L=5, k0=0, n=10, higher_is_closer=False)


def test_tile_csr():
    lims, ids = bench.tile_csr(np.array([0, 2, 2, 3]), np.array([5, 6, 7]), 3)
    np.testing.assert_array_equal(lims, [0, 2, 2, 3, 5, 5, 6, 8, 8, 9])
    np.testing.assert_array_equal(ids, [5, 6, 7] * 3)
    lims1, ids1 = bench.tile_csr(np.array([0, 1]), np.array([4]), 1)
    np.testing.assert_array_equal(lims1, [0, 1])


def test_matched_ratios_at_ap():
    a = {"points": [{"L": 10, "ap": 0.8, "qps": 1000.0, "mean_reads": 10.0},
                    {"L": 20, "ap": 0.95, "qps": 500.0, "mean_reads": 20.0}]}
    b = {"points": [{"L": 10, "ap": 0.7, "qps": 400.0, "mean_reads": 30.0},
                    {"L": 20, "ap": 0.9, "qps": 200.0, "mean_reads": 40.0}]}
    r = bench.matched_ratios(a, b, [0.9], accuracy="ap")
    assert r["0.90"]["qps_b"] == 200.0 and r["0.90"]["reads_b"] == 40.0
    assert r["0.90"]["reads_a"] == pytest.approx(10 + (0.1 / 0.15) * 10)
    assert bench.matched_ratios(a, b, [0.9]) == {}  # no recall in these points


def test_range_config_validation_and_entries(tmp_path):
    def cfg(**kw):
        return bench.BenchConfig(**{"data": "x", "systems": ["nearline", "diskannpy"], "workdir": tmp_path, **kw})

    c = cfg(radius=1.0, variants=["w2:W=2"])
    c.validate()
    assert c.range_mode and not cfg().range_mode
    assert [e[0] for e in c.range_entries()] == ["nearline", "nearline+doubling", "w2", "w2+doubling",
                                                 "diskannpy+doubling"]
    assert c.baseline_system() == "diskannpy+doubling"
    c = cfg(radius=1.0, systems=["nearline"], range_methods=["native", "doubling"])
    assert c.baseline_system() == "nearline+doubling"
    cfg(radius=1.0, doubling_k0=None).validate()  # k0 = each L
    c = cfg(radius=1.0, systems=["nearline"], range_methods=["native"])
    assert c.baseline_system() == "nearline" and [e[2] for e in c.range_entries()] == ["native"]
    for kw, match in [
        ({"radius": 1.0, "range_neighbors": 5}, "exclusive"),
        ({"radius": float("nan")}, "finite"),
        ({"range_neighbors": 0}, "positive"),
        ({"radius": 1.0, "range_methods": ["fast"]}, "expected some of native, doubling"),
        ({"radius": 1.0, "range_methods": []}, "expected some of"),
        ({"radius": 1.0, "range_methods": ["native", "native"]}, "twice"),
        ({"radius": 1.0, "doubling_k0": 0}, "doubling-k0"),
        ({"radius": 1.0, "target_aps": [1.5]}, "target-ap"),
        ({"radius": 1.0, "systems": ["nearline", "hnswlib"]}, "hnswlib cannot answer range queries"),
        ({"radius": 1.0, "variants": ["nearline+doubling:W=2"]}, "used twice"),
        ({"radius": 1.0, "baseline": "diskannpy"}, "not one of the systems"),
        ({"radius": 1.0, "systems": [], "range_methods": ["native"]}, "nothing to benchmark"),
        ({"radius": 1.0, "range_sweep": "k"}, "range-sweep"),
        ({"radius": 1.0, "range_start_L": 0}, "range-start-L"),
        ({"radius": 1.0, "range_sweep": "max_L", "variants": ["m:max_L=64"]}, "fix it"),
    ]:
        with pytest.raises(ValueError, match=match):
            cfg(**kw).validate()


def test_check_radius():
    assert bench.check_radius(0.1, "l2") == float(np.float32(0.1))
    assert bench.check_radius(-3, "ip") == -3.0
    for bad, match in [(float("nan"), "finite"), (1e40, "finite"), (-1, "negative"), ("x", "not a number")]:
        with pytest.raises(ValueError, match=match):
            bench.check_radius(bad, "l2")


def test_range_report_format():
    pts = [{"L": 10, "ap": 0.9, "qps": 100.0, "mean_results": 9.0, "mean_rounds": 2.0, "mean_reads": 30.0},
           {"L": 20, "ap": 0.97, "qps": 50.0, "mean_results": 9.8, "mean_rounds": 2.0, "mean_reads": 50.0}]
    result = {
        "params": {"mode": "range", "radius": 1.5, "range_neighbors": 10.0, "doubling_k0": 10,
                   "target_aps": [0.9]},
        "range": {"gt_mean_results": 10.0, "gt_median_results": 8.0, "gt_max_results": 40, "gt_empty_queries": 2},
        "dataset": {"metric": "l2"},
        "summary": {"nearline": {"points": pts}, "nearline+doubling": {"points": pts}},
        "comparisons": {"nearline/nearline+doubling": {"at_ap": bench.matched_ratios(
            {"points": pts}, {"points": pts}, [0.9], accuracy="ap")}},
        "builds": {"nearline": {"build_s": 1.0, "peak_rss_bytes": 2**20}},
    }
    text = bench.format_report(result)
    assert "squared L2 distance <= 1.5 (picked for 10 mean exact neighbours per query)" in text
    assert "max 40, empty 2" in text
    assert "QPS ratio nearline/nearline+doubling @ AP 0.90 = 1.00, mean reads ratio = 1.00" in text
    assert "nearline+doubling   10  0.9000" in text and "doubl" in text


# --------------------------------------------------------------------------- bench: end to end


def test_worker_range_search_doubling_on_a_real_index(tmp_path, small_index, small_data):
    base, queries = small_data
    queries = queries[:60]
    qp = datasets.write_bin(tmp_path / "q.fbin", queries)
    r = nearline.radius_for_mean_neighbors(base, queries, 15)
    gt = tmp_path / "range.bin"
    nearline.write_range_ground_truth(gt, *nearline.compute_range_ground_truth(base, queries, r))
    res = _bench_worker.run({"action": "range_search", "system": "nearline", "name": "nl+doubling",
                             "method": "doubling", "index_dir": str(small_index), "queries": str(qp),
                             "range_gt": str(gt), "radius": r, "metric": "l2", "n": len(base), "Ls": [10, 60],
                             "k0": 5, "params": {"threads": 2, "W": 4}, "queries_repeat": 2, "warmup": 5})
    assert res["nq"] == 120 and res["method"] == "doubling"
    lo, hi = res["points"]
    assert 0.5 < lo["ap"] <= hi["ap"] <= 1.0
    assert hi["mean_results"] == pytest.approx(15 * hi["ap"], rel=0.35)
    assert lo["mean_rounds"] >= 1 and lo["max_rounds"] >= lo["mean_rounds"]
    assert hi["mean_reads"] > lo["mean_reads"] > 0 and lo["qps"] > 0 and lo["lat_mean_ms"] > 0
    # The answer and its AP do not depend on the batch: the AP equals the AP of the same run in process.
    with nearline.open(small_index) as idx:
        def search(q, k, L):
            ids, d, st = idx.search(q, k, L=L, threads=2, return_stats=True)
            return ids, d, st
        out = bench.knn_doubling_range(search, queries, r, 60, 5, len(base), False)
    gl, gi, _ = nearline.read_range_ground_truth(gt)
    assert nearline.average_precision(out["lims"], out["ids"], gl, gi) == pytest.approx(hi["ap"])
    # A native range search needs Index.range_search.
    if not hasattr(nearline.Index, "range_search"):
        with pytest.raises(ValueError, match="no Index.range_search"):
            _bench_worker.run({"action": "range_search", "system": "nearline", "method": "native",
                               "index_dir": str(small_index), "queries": str(qp), "range_gt": str(gt), "radius": r,
                               "n": len(base), "Ls": [10], "params": {"threads": 1}, "warmup": 0})
    with pytest.raises(ValueError, match="unknown range method"):
        _bench_worker.run({"action": "range_search", "system": "nearline", "method": "guess", "radius": r,
                           "n": 1, "index_dir": "x", "queries": str(qp), "range_gt": str(gt), "Ls": [1]})


def test_bench_range_mode_end_to_end_doubling(tmp_path):
    cfg = bench.BenchConfig(
        data="synthetic:2000:16", systems=["nearline"], variants=["w2:W=2"], range_neighbors=12,
        range_methods=["doubling"], Ls=[10, 40], R=16, build_L=32, threads=2, reps=3, workdir=tmp_path,
        warmup=20, ceiling_seconds=0.2, ceiling_depth=8, out=tmp_path / "r.json", plot=tmp_path / "p.png",
        target_aps=[0.5, 0.9],
    )
    res = bench.run_bench(cfg, progress=False)
    saved = json.loads((tmp_path / "r.json").read_text())
    params = saved["params"]
    assert params["mode"] == "range" and params["systems"] == ["nearline+doubling", "w2+doubling"]
    assert params["baseline"] == "nearline+doubling"
    rng = saved["range"]
    assert rng["gt_mean_results"] == pytest.approx(12.0) and Path(rng["gt_path"]).exists()
    assert params["radius"] == rng["radius"] > 0
    for name in ("nearline+doubling", "w2+doubling"):
        s = saved["summary"][name]
        assert s["method"] == "doubling" and len(saved["runs"][name]) == 3
        assert [r["rep"] for r in saved["runs"][name]] == [0, 1, 2]
        pts = s["points"]
        assert [p["L"] for p in pts] == [10, 40]
        for p in pts:
            assert 0 < p["ap"] <= 1 and p["qps"] > 0 and p["mean_reads"] > 0 and p["mean_rounds"] >= 1
            assert p["mean_results"] <= rng["gt_max_results"]
            assert p["disk_util"] is not None
        assert pts[1]["ap"] >= pts[0]["ap"] - 0.02
    # Both share one build (W is a search key).
    assert saved["summary"]["w2+doubling"]["index"] == saved["summary"]["nearline+doubling"]["index"]
    assert "w2+doubling/nearline+doubling" in saved["comparisons"]
    text = bench.format_report(res)
    assert "range search: squared L2 distance <=" in text and "picked for 12 mean" in text
    assert "w2+doubling" in text and "AP" in text
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The radius and the range ground truth are cached for the next run.
    cached = sorted(p.name for p in (tmp_path / "data").rglob("*") if p.name.startswith(("radius-", "range-gt-")))
    assert len(cached) == 2
    ds = datasets.load_dataset(cfg.data, tmp_path)
    gt_file = Path(rng["gt_path"])
    stamp = gt_file.stat().st_mtime_ns
    again = bench.prepare_range(cfg, ds, tmp_path, 2)
    assert again == rng and gt_file.stat().st_mtime_ns == stamp


def test_bench_range_mode_diskannpy_doubling(tmp_path):
    pytest.importorskip("diskannpy")
    cfg = bench.BenchConfig(data="synthetic:2000:16", systems=["nearline", "diskannpy"], radius=2.0,
                            range_methods=["doubling"], Ls=[10, 40], R=16, build_L=32, pq_bytes=8, threads=2,
                            reps=2, workdir=tmp_path, warmup=10, ceiling=False)
    res = bench.run_bench(cfg, progress=False)
    assert res["params"]["baseline"] == "diskannpy+doubling"
    nl_pts = res["summary"]["nearline+doubling"]["points"]
    dk_pts = res["summary"]["diskannpy+doubling"]["points"]
    for a, b in zip(nl_pts, dk_pts):
        assert 0.5 < b["ap"] <= 1 and b["mean_reads"] > 0 and b["mean_rounds"] >= 1
        # Same graph parameters and PQ size: similar accuracy.
        assert abs(a["ap"] - b["ap"]) < 0.1
    assert "QPS ratio" in bench.format_report(res) or "no target AP" in bench.format_report(res)


def test_bench_range_mode_refuses_diskannpy_on_ip(tmp_path, monkeypatch):
    ds = datasets.Dataset("ipset", np.zeros((10, 2), np.float32), np.zeros((2, 2), np.float32), "ip")
    cfg = bench.BenchConfig(data="x", systems=["diskannpy"], radius=0.5, workdir=tmp_path)
    with pytest.raises(ValueError, match="diskannpy reports no inner products"):
        bench.prepare_range(cfg, ds, tmp_path, 1)


def test_cli_bench_range_flags(tmp_path, capsys):
    assert cli.main(["bench", "--data", "synthetic:100:4", "--target-ap", "0.9"]) == cli.EXIT_ERROR
    assert "--target-ap needs range mode" in capsys.readouterr().err
    assert cli.main(["bench", "--data", "synthetic:100:4", "--radius", "1", "--range-neighbors", "3"]) == \
        cli.EXIT_ERROR
    assert "exclusive" in capsys.readouterr().err
    assert cli.main(["bench", "--data", "synthetic:100:4", "--radius", "1", "--compare", "hnswlib"]) == \
        cli.EXIT_ERROR
    assert "hnswlib cannot answer range queries" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bench", "--data", "synthetic:100:4", "--radius", "1", "--range-methods", "magic"])
    with pytest.raises(SystemExit):
        cli.main(["bench", "--data", "synthetic:100:4", "--radius", "1", "--doubling-k0", "0"])


def test_cli_bench_range_end_to_end(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert cli.main(["-q", "bench", "--data", "synthetic:1500:8", "--compare", "", "--range-neighbors", "10",
                     "--range-methods", "doubling", "--doubling-k0", "L", "--L", "4,30", "--R", "12",
                     "--build-L", "24", "--threads", "2", "--reps", "3", "--workdir", str(tmp_path), "--warmup", "5",
                     "--no-ceiling", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["params"]["doubling_k0"] is None and saved["params"]["range_neighbors"] == 10
    assert "nearline+doubling" in text and "k-NN from k = L" in text
    lo, hi = saved["summary"]["nearline+doubling"]["points"]
    assert 0 < lo["ap"] <= hi["ap"]
    # k0 = L: at L 30 most queries (10 neighbours on average) need one round, at L 4 more.
    assert hi["mean_rounds"] < lo["mean_rounds"]


def test_peers_handles_report_distances(small_index, small_data):
    base, queries = small_data
    p = peers.Params(threads=1, W=4)
    h = peers.open_system("nearline", small_index, p, base.shape[1], 4)
    ids, d, st = h.batch_with_distances(queries[:5], 7, 20)
    assert ids.shape == d.shape == (5, 7) and st["reads"].shape == (5,)
    np.testing.assert_allclose(d, user_values(base, queries[:5], "l2")[np.arange(5)[:, None], ids], rtol=1e-4)
    h.close()


class _ExactRangeIndex:
    """Bench plumbing only (not the engine): an exact numpy stand-in for an index with range_search."""

    def __init__(self, base):
        self.base = base
        self.calls = []

    def range_search(self, queries, radius, L=None, threads=None, return_stats=False, **kw):
        self.calls.append(dict(kw, L=L, threads=threads))
        hits = brute_range(self.base, queries, radius, "l2")
        lims = np.concatenate([[0], np.cumsum([h.size for h in hits])])
        ids = np.concatenate(hits) if hits else np.zeros(0, np.int64)
        v = user_values(self.base, queries, "l2")
        d = np.concatenate([v[i, h] for i, h in enumerate(hits)]).astype(np.float32)
        nq = len(queries)
        stats = {"reads": np.full(nq, 7), "total_us": np.full(nq, 100.0)}
        return (lims, ids, d, stats) if return_stats else (lims, ids, d)

    def close(self):
        pass


def test_worker_native_range_plumbing_with_an_exact_stand_in(tmp_path, monkeypatch, float_data):
    base, queries = float_data
    qp = datasets.write_bin(tmp_path / "q.fbin", queries)
    gt = tmp_path / "range.bin"
    nearline.write_range_ground_truth(gt, *nearline.compute_range_ground_truth(base, queries, 14.0))
    fake = _ExactRangeIndex(base)
    monkeypatch.setattr(nearline, "open", lambda path, **kw: fake)
    res = _bench_worker.run({"action": "range_search", "system": "nearline", "method": "native",
                             "index_dir": str(tmp_path), "queries": str(qp), "range_gt": str(gt), "radius": 14.0,
                             "n": len(base), "Ls": [10, 20], "params": {"threads": 2, "W": 4},
                             "variant": {"name": "v", "search": {"W": 2, "executor": "beam"}},
                             "queries_repeat": 2, "warmup": 3})
    assert res["nq"] == 80 and res["method"] == "native"
    for pt in res["points"]:
        assert pt["ap"] == pytest.approx(1.0) and pt["mean_reads"] == 7 and pt["lat_mean_ms"] == pytest.approx(0.1)
        assert "mean_rounds" not in pt
    # The variant's search options and each L reach range_search.
    assert [c["L"] for c in fake.calls] == [10, 10, 20]
    assert all(c["W"] == 2 and c["executor"] == "beam" and c["threads"] == 2 for c in fake.calls)
    # A variant's range-only keys reach range_search too.
    fake.calls.clear()
    v = bench.parse_variant("phi:ratio=0.25,max_L=400,W=3")
    assert v.range == {"ratio": 0.25, "max_L": 400} and v.spec()["range"] == v.range
    _bench_worker.run({"action": "range_search", "system": "nearline", "method": "native",
                       "index_dir": str(tmp_path), "queries": str(qp), "range_gt": str(gt), "radius": 14.0,
                       "n": len(base), "Ls": [10], "params": {"threads": 1}, "variant": v.spec(), "warmup": 0})
    assert fake.calls == [{"ratio": 0.25, "max_L": 400, "W": 3, "L": 10, "threads": 1}]


def test_range_only_variant_keys(tmp_path):
    v = bench.parse_variant("phi:ratio=0.25")
    with pytest.raises(ValueError, match="ratio apply to range search only"):
        bench.BenchConfig(data="x", systems=["nearline"], variants=[v], workdir=tmp_path).validate()
    bench.BenchConfig(data="x", systems=["nearline"], variants=[v], radius=1.0, workdir=tmp_path).validate()

    class Api:
        class Index:
            def search(self, queries, k=10, *, L=None, W=4):
                pass

            def range_search(self, queries, radius, *, L=100, W=None, ratio=0.5):
                pass

    bench.check_variant_supported(bench.parse_variant("ok:ratio=0.3"), Api)
    with pytest.raises(ValueError, match="Index.range_search of this nearline build does not take 'max_L'"):
        bench.check_variant_supported(bench.parse_variant("no:max_L=100"), Api)


# --------------------------------------------------------------------------- the engine's range search


def test_native_range_search_against_exact_ground_truth(small_index, small_data):
    base, queries = small_data
    queries = queries[:100]
    r = nearline.radius_for_mean_neighbors(base, queries, 20)
    gl, gi, _ = nearline.compute_range_ground_truth(base, queries, r)
    with nearline.open(small_index) as idx:
        aps = []
        for L in (10, 200):
            lims, ids, d, st = idx.range_search(queries, r, L=L, threads=2, return_stats=True)
            # Every result is a true one: within the radius and in the exact answer.
            assert np.all(d <= r)
            for got, exp in zip(rows(lims, ids), rows(gl, gi)):
                assert set(got.tolist()) <= set(exp.tolist())
            aps.append(nearline.average_precision(lims, ids, gl, gi))
            assert st["reads"].shape == (100,)
    assert 0.9 <= aps[0] <= aps[1] and aps[1] >= 0.99


def test_worker_native_range_search_on_a_real_index(tmp_path, small_index, small_data):
    base, queries = small_data
    queries = queries[:80]
    qp = datasets.write_bin(tmp_path / "q.fbin", queries)
    r = nearline.radius_for_mean_neighbors(base, queries, 20)
    gt = tmp_path / "range.bin"
    nearline.write_range_ground_truth(gt, *nearline.compute_range_ground_truth(base, queries, r))
    res = _bench_worker.run({"action": "range_search", "system": "nearline", "method": "native",
                             "index_dir": str(small_index), "queries": str(qp), "range_gt": str(gt), "radius": r,
                             "metric": "l2", "n": len(base), "Ls": [10, 100], "params": {"threads": 2, "W": 4},
                             "warmup": 5})
    lo, hi = res["points"]
    assert 0.9 <= lo["ap"] <= hi["ap"] <= 1.0
    assert lo["mean_reads"] > 0 and lo["mean_doublings"] >= hi["mean_doublings"] >= 0
    assert lo["lat_mean_ms"] > 0 and "mean_rounds" not in lo
    with nearline.open(small_index) as idx:
        lims, ids, _ = idx.range_search(queries, r, L=100, W=4, threads=2)
    gl, gi, _ = nearline.read_range_ground_truth(gt)
    assert nearline.average_precision(lims, ids, gl, gi) == pytest.approx(hi["ap"])


def test_cli_search_radius_reports_ap_with_range_gt(tmp_path, small_index, small_data, capsys):
    base, queries = small_data
    bp = datasets.write_bin(tmp_path / "b.fbin", base)
    qp = datasets.write_bin(tmp_path / "q.fbin", queries[:50])
    gt = tmp_path / "range.bin"
    assert cli.main(["gt", str(bp), str(qp), str(gt), "--mean-neighbors", "10"]) == 0
    text = capsys.readouterr().out
    r = float(text.split("squared L2 distance): ")[1].split()[0])
    assert cli.main(["search", str(small_index), str(qp), "--radius", repr(r), "--L", "100", "--gt", str(gt),
                     "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    with nearline.open(small_index) as idx:
        lims, ids, _ = idx.range_search(queries[:50], r, L=100)
    gl, gi, _ = nearline.read_range_ground_truth(gt)
    assert summary["AP"] == pytest.approx(nearline.average_precision(lims, ids, gl, gi))
    assert 0.9 <= summary["AP"] <= 1.0 and summary["mean_results"] <= 10 * 1.01


def test_bench_range_mode_native_against_doubling(tmp_path):
    cfg = bench.BenchConfig(
        data="synthetic:2000:16", systems=["nearline"], variants=["star:preset=starling,ratio=0.5"],
        range_neighbors=15, Ls=[10, 40], R=16, build_L=32, threads=2, reps=3, workdir=tmp_path, warmup=10,
        ceiling=False, target_aps=[0.95], out=tmp_path / "r.json",
    )
    res = bench.run_bench(cfg, progress=False)
    saved = json.loads((tmp_path / "r.json").read_text())
    names = ["nearline", "nearline+doubling", "star", "star+doubling"]
    assert saved["params"]["systems"] == names and saved["params"]["baseline"] == "nearline+doubling"
    assert saved["summary"]["star"]["variant"]["range"] == {"ratio": 0.5}
    assert saved["summary"]["star"]["index"] != saved["summary"]["nearline"]["index"]
    assert saved["builds"]["star"]["info"]["preset"] == "starling"
    for name in names:
        assert len(saved["runs"][name]) == 3
        for p in saved["summary"][name]["points"]:
            assert 0.8 <= p["ap"] <= 1 and p["qps"] > 0 and p["mean_reads"] > 0
            assert (p["mean_rounds"] is None) == (not name.endswith("+doubling"))
            assert (p["mean_doublings"] is None) == name.endswith("+doubling")
    assert set(saved["comparisons"]) == {f"{n}/nearline+doubling" for n in names if n != "nearline+doubling"}
    text = bench.format_report(res)
    assert "star+doubling" in text and "AP" in text


def test_bench_range_sweep_max_l_bounds_the_native_doubling(tmp_path):
    # The sweep values bound the native search's list doubling (first list
    # size min(range_start_L, value)); the doubling baseline still sweeps L.
    cfg = bench.BenchConfig(
        data="synthetic:2000:16", systems=["nearline"], range_neighbors=40, Ls=[8, 64, 512], R=16, build_L=32,
        threads=2, reps=1, workdir=tmp_path, warmup=10, ceiling=False, target_aps=[0.9], out=tmp_path / "r.json",
        range_sweep="max_L", range_start_L=8,
    )
    res = bench.run_bench(cfg, progress=False)
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["params"]["range_sweep"] == "max_L" and saved["params"]["range_start_L"] == 8
    native = {p["L"]: p for p in saved["summary"]["nearline"]["points"]}
    # max_L = the first list size: no doubling at all.
    assert native[8]["mean_doublings"] == 0
    # A larger bound lets the doubling go on, find more and get closer to the exact answers.
    assert native[512]["mean_doublings"] > 0
    assert native[512]["mean_results"] > native[8]["mean_results"]
    assert native[512]["ap"] > native[8]["ap"]
    assert native[512]["ap"] >= 0.9
    assert "native rows: L is max_L" in bench.format_report(res)


def test_cli_bench_range_sweep_flags(capsys):
    assert cli.main(["bench", "--data", "synthetic:100:4", "--range-sweep", "max_L"]) == cli.EXIT_ERROR
    assert "--range-sweep needs range mode" in capsys.readouterr().err
    assert cli.main(["bench", "--data", "synthetic:100:4", "--range-start-L", "5"]) == cli.EXIT_ERROR
    assert "--range-start-L needs range mode" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bench", "--data", "synthetic:100:4", "--radius", "1", "--range-sweep", "k"])
    with pytest.raises(SystemExit):
        cli.main(["bench", "--data", "synthetic:100:4", "--radius", "1", "--range-start-L", "0"])
