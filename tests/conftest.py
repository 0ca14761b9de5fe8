"""Shared fixtures: small clustered datasets with shuffled ids, built indexes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


def clustered(n: int, dim: int, *, clusters: int = 32, seed: int = 0, queries: int = 200):
    """Gaussian mixture with shuffled row order (ids carry no locality) and held-out queries."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 4.0, size=(clusters, dim)).astype(np.float32)
    total = n + queries
    labels = rng.integers(0, clusters, size=total)
    spread = rng.uniform(0.5, 1.5, size=clusters).astype(np.float32)
    x = centers[labels] + rng.normal(0, 1.0, size=(total, dim)).astype(np.float32) * spread[labels, None]
    x = x.astype(np.float32)
    perm = rng.permutation(total)
    x = x[perm]
    return np.ascontiguousarray(x[:n]), np.ascontiguousarray(x[n:])


def anisotropic(n: int, dim: int, *, clusters: int = 24, seed: int = 0, queries: int = 200):
    """Clusters whose centres lie closer together than the points to their own centre, each
    stretched along 3 random directions (as sentence embeddings are), with held-out queries."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-0.5, 0.5, size=(clusters, dim))
    dirs = rng.normal(size=(clusters, 3, dim))
    dirs /= np.linalg.norm(dirs, axis=2, keepdims=True)
    total = n + queries
    labels = rng.integers(0, clusters, size=total)
    x = centres[labels] + 0.6 * rng.normal(size=(total, dim))
    x += np.einsum("nk,nkd->nd", 2.4 * rng.normal(size=(total, 3)), dirs[labels])
    x = x.astype(np.float32)
    return np.ascontiguousarray(x[:n]), np.ascontiguousarray(x[n:])


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m nearline ARGS`` in a subprocess with its output captured (tests read the exit code)."""
    return subprocess.run([sys.executable, "-m", "nearline", *args], capture_output=True, text=True, check=False)


def exact_knn(base: np.ndarray, queries: np.ndarray, k: int, metric: str = "l2") -> np.ndarray:
    """Brute-force reference in numpy (independent of the engine)."""
    b = base.astype(np.float64)
    q = queries.astype(np.float64)
    if metric == "l2":
        d = (q * q).sum(1)[:, None] - 2 * q @ b.T + (b * b).sum(1)[None, :]
    elif metric == "ip":
        d = -(q @ b.T)
    else:
        bn = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-30)
        qn = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-30)
        d = -(qn @ bn.T)
    return np.argsort(d, axis=1, kind="stable")[:, :k]


@pytest.fixture(scope="session")
def small_data():
    return clustered(5000, 24, seed=1)


@pytest.fixture(scope="session")
def small_index(tmp_path_factory, small_data):
    import nearline

    base, _ = small_data
    path = tmp_path_factory.mktemp("idx") / "small.index"
    # The DiskANN composition: the tests that share it add what they test.
    nearline.build(base, path, preset="diskann", R=24, build_L=60, pq_bytes=12, threads=2)
    return path


@pytest.fixture(scope="session")
def budget_data():
    """30.7 MB of raw float32 vectors (30,000 × 256) and 200 held-out queries: the set of the memory
    budget tests (``test_index.py::test_rss_delta_within_budget``, ``test_budget_borrow.py``)."""
    return clustered(30_000, 256, seed=21, queries=200)


@pytest.fixture(scope="session")
def budget_index(tmp_path_factory, budget_data):
    """``budget_index(preset)``: the graph index of ``budget_data`` with that preset, built at 5% of the
    raw vectors (R 24, build L 32) on first use and shared by the budget tests after it (closed).

    With ``NEARLINE_TEST_INDEXES`` set (scripts/test.sh sets it to a directory of its own run), the indexes
    are built there, and a later pytest session of the same run (the pread pass) opens them instead of
    building them again: a build is committed whole or not at all, so an index there is complete."""
    import nearline

    base, _ = budget_data
    shared = os.environ.get("NEARLINE_TEST_INDEXES")
    root = Path(shared) if shared else tmp_path_factory.mktemp("budget")
    built = {}

    def get(preset: str):
        if preset not in built:
            path = root / f"budget-{preset}.index"
            if not (shared and path.is_dir()):
                nearline.build(base, path, preset=preset, R=24, build_L=32, memory_budget=0.05, threads=2,
                               overwrite=True).close()
            built[preset] = path
        return built[preset]

    return get


def recall(ids: np.ndarray, truth: np.ndarray, k: int | None = None) -> float:
    """Mean recall@k of the rows of ``ids`` against the exact neighbours ``truth`` (k: the width of
    ``truth``); the one recall every test measures with."""
    k = truth.shape[1] if k is None else k
    return float(np.mean([len(set(a[:k]) & set(b[:k])) / k for a, b in zip(np.asarray(ids).tolist(),
                                                                          np.asarray(truth).tolist())]))


def build_preset(preset: str, base, path, **kw):
    """``nearline.build`` of ``preset`` at R 32 on 2 threads, overwriting, quietly; ``kw`` overrides."""
    import nearline

    opts = dict(preset=preset, R=32, threads=2, overwrite=True, progress=False)
    opts.update(kw)
    return nearline.build(base, path, **opts)


def recall_on_live(idx, live_ids: np.ndarray, live_vecs: np.ndarray, queries: np.ndarray, k: int = 10,
                   full: bool = False) -> float:
    """Recall@k at L 64 of ``idx`` against the exact neighbours among the live vectors; asserts that
    every returned id is live (and, with ``full``, that every query got k ids)."""
    ids, _ = idx.search(queries, k=k, L=64)
    live = set(int(i) for i in live_ids)
    assert all(int(i) in live for i in ids.ravel() if full or i >= 0), \
        "a search returned an id that is not live" + (" (or too few)" if full else "")
    truth = live_ids[exact_knn(live_vecs, queries, k)]
    return recall(ids, truth, k)
