"""Tests of nearline.datasets: synthetic data, file formats, HDF5 and WordNet loaders, specs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from nearline import datasets  # noqa: E402


def test_synthetic_shapes_and_dtypes():
    for dt in ("float32", "float16", "uint8", "int8"):
        b, q = datasets.synthetic_clustered(500, 12, queries=50, dtype=dt, seed=1)
        assert b.shape == (500, 12) and q.shape == (50, 12)
        assert b.dtype == np.dtype(dt) and q.dtype == np.dtype(dt)
        assert b.flags.c_contiguous


def test_synthetic_deterministic_and_seed_sensitive():
    b1, q1 = datasets.synthetic_clustered(800, 8, queries=40, seed=3)
    b2, q2 = datasets.synthetic_clustered(800, 8, queries=40, seed=3)
    b3, _ = datasets.synthetic_clustered(800, 8, queries=40, seed=4)
    assert np.array_equal(b1, b2) and np.array_equal(q1, q2)
    assert not np.array_equal(b1, b3)


def test_synthetic_queries_held_out():
    b, q = datasets.synthetic_clustered(1000, 6, queries=100, seed=0)
    base_rows = {row.tobytes() for row in b}
    assert not any(row.tobytes() in base_rows for row in q)


def test_synthetic_shuffle_removes_id_locality():
    grouped, _ = datasets.synthetic_clustered(3000, 16, queries=10, seed=2, shuffle=False, clusters=20)
    shuffled, _ = datasets.synthetic_clustered(3000, 16, queries=10, seed=2, shuffle=True, clusters=20)
    # Same multiset of rows ...
    assert np.allclose(np.sort(grouped, axis=0), np.sort(shuffled, axis=0))

    def neighbour_gap(x):
        return float(np.mean(np.linalg.norm(x[1:] - x[:-1], axis=1)))

    # ... but consecutive ids are near each other only without shuffling.
    assert neighbour_gap(grouped) < 0.6 * neighbour_gap(shuffled)


def test_synthetic_clusters_unequal():
    b, _ = datasets.synthetic_clustered(5000, 8, queries=0, clusters=10, seed=5, shuffle=False)
    # Row-to-row jumps mark cluster boundaries; the segments between them differ in size.
    gaps = np.linalg.norm(b[1:] - b[:-1], axis=1)
    cut = np.sort(np.argsort(gaps)[-9:])
    sizes = np.diff(np.concatenate(([0], cut + 1, [len(b)])))
    assert sizes.max() > 2 * sizes.min()


def test_synthetic_rejects_bad_arguments():
    with pytest.raises(ValueError, match="dtype"):
        datasets.synthetic_clustered(10, 4, dtype="float64")
    with pytest.raises(ValueError, match="n > 0"):
        datasets.synthetic_clustered(0, 4)


@pytest.mark.parametrize("ext,dt", [(".fbin", "float32"), (".f16bin", "float16"), (".u8bin", "uint8"),
                                    (".i8bin", "int8")])
def test_bin_round_trip(tmp_path, ext, dt):
    x = (np.arange(60).reshape(10, 6) % 50).astype(dt)
    p = datasets.write_bin(tmp_path / f"x{ext}", x)
    y = datasets.read_vectors(p)
    assert y.dtype == np.dtype(dt) and np.array_equal(x, y)
    assert p.stat().st_size == 8 + x.nbytes


def test_bin_errors(tmp_path):
    with pytest.raises(ValueError, match="does not match extension"):
        datasets.write_bin(tmp_path / "x.fbin", np.zeros((2, 2), np.uint8))
    p = tmp_path / "bad.fbin"
    np.array([5, 4], dtype="<i4").tofile(p)
    with pytest.raises(ValueError, match="should be 88 bytes"):
        datasets.read_vectors(p)


def test_vecs_and_npy(tmp_path):
    x = np.random.default_rng(0).random((7, 5), dtype=np.float32)
    rows = np.concatenate([np.full((7, 1), 5, "<i4").view("<f4"), x], axis=1)
    rows.tofile(tmp_path / "x.fvecs")
    assert np.array_equal(datasets.read_vectors(tmp_path / "x.fvecs"), x)
    np.save(tmp_path / "x.npy", x)
    assert np.array_equal(datasets.read_vectors(tmp_path / "x.npy"), x)


def test_ground_truth_round_trip(tmp_path):
    ids = np.arange(12).reshape(3, 4)
    d = np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4)
    p = datasets.write_ground_truth(tmp_path / "gt.bin", ids, d)
    ids2, d2 = datasets.read_ground_truth(p)
    assert ids2.dtype == np.int64 and np.array_equal(ids, ids2) and np.array_equal(d, d2)


def test_brute_force_matches_naive():
    rng = np.random.default_rng(1)
    b = rng.standard_normal((300, 10)).astype(np.float32)
    q = rng.standard_normal((20, 10)).astype(np.float32)
    ids, d = datasets.brute_force_ground_truth(b, q, 5, "l2", chunk=7)
    full = ((q[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    assert np.array_equal(ids, np.argsort(full, axis=1, kind="stable")[:, :5])
    assert np.allclose(d, np.sort(full, axis=1)[:, :5], rtol=1e-4, atol=1e-4)
    ids_ip, s = datasets.brute_force_ground_truth(b, q, 3, "ip")
    assert np.array_equal(ids_ip, np.argsort(-(q @ b.T), axis=1, kind="stable")[:, :3])
    assert np.all(np.diff(s, axis=1) <= 0)


def test_recall_at_k():
    gt = np.array([[1, 2, 3], [4, 5, 6]])
    found = np.array([[3, 2, 9], [7, 8, -1]])
    assert datasets.recall_at_k(found, gt, 3) == pytest.approx(2 / 6)
    assert datasets.recall_at_k(found, gt, 1) == pytest.approx(0.0)
    assert datasets.recall_at_k(gt, gt, 3) == 1.0


def _write_hdf5(path, *, drop=None, distance="euclidean"):
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(0)
    train = rng.random((50, 4), dtype=np.float32)
    test = rng.random((5, 4), dtype=np.float32)
    nb, d = datasets.brute_force_ground_truth(train, test, 10)
    with h5py.File(path, "w") as f:
        for key, val in (("train", train), ("test", test), ("neighbors", nb.astype(np.int32)),
                         ("distances", np.sqrt(d))):
            if key != drop:
                f.create_dataset(key, data=val)
        f.attrs["distance"] = distance
    return train, test, nb


def test_hdf5_round_trip(tmp_path):
    train, test, nb = _write_hdf5(tmp_path / "toy.hdf5", distance="angular")
    ds = datasets.load_hdf5(tmp_path / "toy.hdf5")
    assert np.array_equal(ds.base, train) and np.array_equal(ds.queries, test)
    assert np.array_equal(ds.gt_ids, nb) and ds.metric == "cosine"
    ds2 = datasets.load_dataset(f"hdf5:{tmp_path / 'toy.hdf5'}")
    assert ds2.n == 50 and ds2.dim == 4


def test_hdf5_missing_key(tmp_path):
    _write_hdf5(tmp_path / "bad.hdf5", drop="test")
    with pytest.raises(ValueError, match="'test' missing"):
        datasets.load_hdf5(tmp_path / "bad.hdf5")
    _write_hdf5(tmp_path / "nogt.hdf5", drop="neighbors")
    assert datasets.load_hdf5(tmp_path / "nogt.hdf5").gt_ids is None


def _fake_wordnet(folder: Path, n=40, nq=6, dim=8, k=5):
    rng = np.random.default_rng(0)
    folder.mkdir()
    for name, m in (("base", n), ("query", nq)):
        np.savez(folder / f"{name}.sq8.npz", lo=np.float32(-1.0) * np.ones(dim, np.float32),
                 codes=rng.integers(0, 256, (m, dim)).astype(np.uint8),
                 scale=np.full(dim, 2.0 / 255, np.float32))
    gt = rng.integers(0, n, (nq, k)).astype("<i4")
    with open(folder / "gt.ibin", "wb") as f:
        np.array([nq, k], "<i4").tofile(f)
        gt.tofile(f)
    return gt


def test_wordnet_loader(tmp_path):
    gt = _fake_wordnet(tmp_path / "wn")
    ds = datasets.load_dataset(f"wordnet:{tmp_path / 'wn'}")
    assert ds.base.shape == (40, 8) and ds.queries.shape == (6, 8) and ds.base.dtype == np.float32
    assert ds.base.min() >= -1.0 - 1e-6 and ds.base.max() <= 1.0 + 1e-6
    with np.load(tmp_path / "wn" / "base.sq8.npz") as z:
        assert np.allclose(ds.base, z["lo"] + z["codes"].astype(np.float32) * z["scale"])
    assert np.array_equal(ds.gt_ids, gt)


def test_wordnet_bad_gt(tmp_path):
    _fake_wordnet(tmp_path / "wn")
    with open(tmp_path / "wn" / "gt.ibin", "ab") as f:
        f.write(b"\0\0\0\0")
    with pytest.raises(ValueError, match="gt.ibin"):
        datasets.load_wordnet(tmp_path / "wn")


def test_synthetic_spec_cached_as_fbin(tmp_path):
    ds = datasets.load_dataset("synthetic:600:8:7", tmp_path, queries=30)
    assert ds.base_path.suffix == ".fbin" and ds.base_path.exists()
    again = datasets.load_dataset("synthetic:600:8:7", tmp_path, queries=30)
    assert np.array_equal(ds.base, again.base) and np.array_equal(ds.queries, again.queries)
    direct, _ = datasets.synthetic_clustered(600, 8, seed=7, queries=30)
    assert np.array_equal(direct, ds.base)
    ds = datasets.materialize(ds, tmp_path, k=10)
    assert ds.gt_path.exists() and ds.gt_ids.shape == (30, 100)


def test_files_spec(tmp_path):
    b, q = datasets.synthetic_clustered(200, 4, queries=10)
    datasets.write_bin(tmp_path / "b.fbin", b)
    datasets.write_bin(tmp_path / "q.fbin", q)
    ids, d = datasets.brute_force_ground_truth(b, q, 10)
    datasets.write_ground_truth(tmp_path / "gt.bin", ids, d)
    ds = datasets.load_dataset(f"files:{tmp_path / 'b.fbin'},{tmp_path / 'q.fbin'},{tmp_path / 'gt.bin'}")
    assert np.array_equal(ds.base, b) and np.array_equal(ds.gt_ids, ids)


@pytest.mark.parametrize("spec", ["synthetic:10", "nope:x", "synthetic:a:b", "files:only_one", "wordnet"])
def test_bad_specs(spec):
    with pytest.raises(ValueError):
        datasets.load_dataset(spec)
