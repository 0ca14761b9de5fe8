"""Benchmark data sets: synthetic mixtures, ann-benchmarks HDF5, WordNet-MiniLM, files.

Everything here is pure NumPy (plus h5py for HDF5 files) so it works without the
compiled engine; the benchmark workers load the cached files written here, so
every subprocess sees byte-identical data.

Spec strings understood by :func:`load_dataset`:

* ``synthetic:N:DIM[:SEED]`` -- a Gaussian mixture (see :func:`synthetic_clustered`);
* ``wordnet:PATH`` -- the WordNet-MiniLM folder (``base.sq8.npz``, ``query.sq8.npz``, ``gt.ibin``);
* ``hdf5:PATH`` -- an ann-benchmarks file (``train``, ``test``, ``neighbors``, attr ``distance``);
* ``files:BASE,QUERIES[,GT]`` -- vector files (``.fbin/.u8bin/.i8bin/.f16bin/.bin``,
  ``.fvecs/.bvecs``, ``.npy``) and an optional ground-truth file (DiskANN binary or ``.ivecs``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from pathlib import Path
from typing import Optional, Union

import numpy as np

log = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]

#: Metric names used by nearline for each ann-benchmarks ``distance`` attribute.
HDF5_METRICS = {"euclidean": "l2", "angular": "cosine", "dot": "ip", "ip": "ip", "cosine": "cosine"}

_BIN_DTYPES = {
    ".fbin": np.dtype("<f4"),
    ".f16bin": np.dtype("<f2"),
    ".u8bin": np.dtype("u1"),
    ".i8bin": np.dtype("i1"),
    ".bin": np.dtype("<f4"),
}
_EXT_FOR_DTYPE = {
    np.dtype("float32"): ".fbin",
    np.dtype("float16"): ".f16bin",
    np.dtype("uint8"): ".u8bin",
    np.dtype("int8"): ".i8bin",
}


@dataclasses.dataclass
class Dataset:
    """A base set, a held-out query set and (optionally) ground truth.

    Attributes:
        name: short human-readable name (also used for cache keys).
        base: ``(n, dim)`` base vectors.
        queries: ``(nq, dim)`` query vectors.
        metric: ``"l2"``, ``"ip"`` or ``"cosine"``.
        gt_ids: ``(nq, k_gt)`` int64 exact neighbour ids (row numbers of ``base``), or None.
        gt_dists: matching distances, or None.
        base_path / queries_path / gt_path: files holding the same data, when known.
    """

    name: str
    base: np.ndarray
    queries: np.ndarray
    metric: str = "l2"
    gt_ids: Optional[np.ndarray] = None
    gt_dists: Optional[np.ndarray] = None
    base_path: Optional[Path] = None
    queries_path: Optional[Path] = None
    gt_path: Optional[Path] = None

    @property
    def n(self) -> int:
        """Number of base vectors."""
        return int(self.base.shape[0])

    @property
    def dim(self) -> int:
        """Dimensionality."""
        return int(self.base.shape[1])


# --------------------------------------------------------------------------- files


def vector_ext(dtype: Union[str, np.dtype]) -> str:
    """The DiskANN-style bin extension for a dtype (``float32`` -> ``.fbin``)."""
    dt = np.dtype(dtype)
    try:
        return _EXT_FOR_DTYPE[dt]
    except KeyError:
        raise ValueError(f"unsupported vector dtype {dt}: expected float32, float16, uint8 or int8") from None


def write_bin(path: PathLike, array: np.ndarray) -> Path:
    """Writes ``array`` as a DiskANN bin file (int32 n, int32 d, row-major data).

    The dtype must match the extension (``.fbin`` float32, ``.f16bin`` float16,
    ``.u8bin`` uint8, ``.i8bin`` int8; ``.bin`` takes any of them). Written to a
    temporary name and renamed, so readers never see a partial file.
    """
    path = Path(path)
    arr = np.ascontiguousarray(array)
    if arr.ndim != 2:
        raise ValueError(f"{path}: expected a 2-D array, got shape {arr.shape}")
    ext = path.suffix.lower()
    if ext not in _BIN_DTYPES:
        raise ValueError(f"{path}: unknown extension {ext!r}: expected one of {sorted(_BIN_DTYPES)}")
    if ext != ".bin" and arr.dtype != _BIN_DTYPES[ext]:
        raise ValueError(f"{path}: dtype {arr.dtype} does not match extension {ext} (expected {_BIN_DTYPES[ext]})")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        np.array(arr.shape, dtype="<i4").tofile(f)
        arr.astype(arr.dtype.newbyteorder("<"), copy=False).tofile(f)
    os.replace(tmp, path)
    return path


def read_vectors(path: PathLike, dtype: Optional[Union[str, np.dtype]] = None, *, mmap: bool = False) -> np.ndarray:
    """Reads a vector file with NumPy only (no compiled engine needed).

    Supports ``.fbin/.f16bin/.u8bin/.i8bin/.bin`` (``.bin`` takes ``dtype``,
    default float32), ``.fvecs`` / ``.bvecs`` / ``.ivecs`` and ``.npy``. With
    ``mmap`` the bin and npy formats are memory-mapped read-only instead of read.
    """
    path = Path(path)
    ext = path.suffix.lower()
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such vector file")
    if ext == ".npy":
        arr = np.load(path, mmap_mode="r")
        if arr.ndim != 2:
            raise ValueError(f"{path}: expected a 2-D array, got shape {arr.shape}")
        return arr if mmap else np.array(arr)
    if ext in _BIN_DTYPES:
        dt = np.dtype(dtype) if (dtype is not None and ext == ".bin") else _BIN_DTYPES[ext]
        size = path.stat().st_size
        if size < 8:
            raise ValueError(f"{path}: file is {size} bytes, shorter than the 8-byte header (int32 n, int32 d)")
        header = np.fromfile(path, dtype="<i4", count=2)
        n, d = int(header[0]), int(header[1])
        expected = 8 + n * d * dt.itemsize
        if n < 0 or d <= 0 or size != expected:
            raise ValueError(
                f"{path}: header says n={n}, d={d} ({dt}), so the file should be {expected} bytes, but it is {size}"
            )
        if mmap:
            return np.memmap(path, dtype=dt, mode="r", offset=8, shape=(n, d))
        return np.fromfile(path, dtype=dt, offset=8).reshape(n, d)
    if ext in (".fvecs", ".bvecs", ".ivecs"):
        dt = {".fvecs": np.dtype("<f4"), ".bvecs": np.dtype("u1"), ".ivecs": np.dtype("<i4")}[ext]
        raw = np.fromfile(path, dtype="u1")
        if raw.size < 4:
            raise ValueError(f"{path}: empty vecs file")
        d = int(raw[:4].view("<i4")[0])
        row = 4 + d * dt.itemsize
        if d <= 0 or raw.size % row != 0:
            raise ValueError(f"{path}: first row says d={d}; file size {raw.size} is not a multiple of {row}")
        rows = raw.reshape(-1, row)
        if not np.all(rows[:, :4].copy().view("<i4").ravel() == d):
            raise ValueError(f"{path}: rows have differing dimensions (expected d={d} everywhere)")
        return rows[:, 4:].copy().view(dt).reshape(-1, d)
    raise ValueError(f"{path}: unknown vector file extension {ext!r}")


def write_ground_truth(path: PathLike, ids: np.ndarray, dists: Optional[np.ndarray] = None) -> Path:
    """Writes DiskANN ground truth: int32 n, int32 k, n·k uint32 ids, n·k float32 distances."""
    path = Path(path)
    ids = np.asarray(ids)
    if dists is None:
        dists = np.zeros(ids.shape, dtype=np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        np.array(ids.shape, dtype="<i4").tofile(f)
        ids.astype("<u4").tofile(f)
        np.asarray(dists, dtype="<f4").tofile(f)
    os.replace(tmp, path)
    return path


def read_ground_truth(path: PathLike) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """Reads ground truth (DiskANN binary with or without distances, or ``.ivecs``).

    Returns ``(ids int64 (n, k), dists float32 (n, k) or None)``.
    """
    path = Path(path)
    if path.suffix.lower() == ".ivecs":
        return read_vectors(path).astype(np.int64), None
    size = path.stat().st_size
    if size < 8:
        raise ValueError(f"{path}: ground-truth file is {size} bytes, shorter than the 8-byte header")
    n, k = (int(v) for v in np.fromfile(path, dtype="<i4", count=2))
    body = n * k * 4
    if n <= 0 or k <= 0 or size not in (8 + body, 8 + 2 * body):
        raise ValueError(
            f"{path}: header says n={n}, k={k}, so the file should be {8 + body} (ids only) "
            f"or {8 + 2 * body} bytes (ids and distances), but it is {size}"
        )
    ids = np.fromfile(path, dtype="<i4", count=n * k, offset=8).reshape(n, k).astype(np.int64)
    dists = None
    if size == 8 + 2 * body:
        dists = np.fromfile(path, dtype="<f4", count=n * k, offset=8 + body).reshape(n, k)
    return ids, dists


# --------------------------------------------------------------------------- ground truth


def brute_force_ground_truth(
    base: np.ndarray, queries: np.ndarray, k: int, metric: str = "l2", chunk: Optional[int] = None
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` with NumPy (used when the engine's own is unavailable).

    Distances are squared L2 (ascending), inner product or cosine similarity (descending).
    ``chunk`` queries are scored at a time (default: ~64 Mi scores per chunk).
    """
    if chunk is None:
        chunk = int(max(1, min(256, (1 << 26) // max(1, base.shape[0]))))
    if metric not in ("l2", "ip", "cosine"):
        raise ValueError(f"unknown metric {metric!r}: expected 'l2', 'ip' or 'cosine'")
    k = min(k, base.shape[0])
    b = np.asarray(base, dtype=np.float32)
    q_all = np.asarray(queries, dtype=np.float32)
    if metric == "cosine":
        b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-30)
        q_all = q_all / np.maximum(np.linalg.norm(q_all, axis=1, keepdims=True), 1e-30)
    bn = np.einsum("ij,ij->i", b, b) if metric == "l2" else None
    out_ids = np.empty((q_all.shape[0], k), dtype=np.int64)
    out_d = np.empty((q_all.shape[0], k), dtype=np.float32)
    for s in range(0, q_all.shape[0], chunk):
        q = q_all[s : s + chunk]
        dots = q @ b.T
        if metric == "l2":
            score = bn[None, :] - 2.0 * dots + np.einsum("ij,ij->i", q, q)[:, None]
        else:
            score = -dots
        part = np.argpartition(score, k - 1, axis=1)[:, :k] if k < score.shape[1] else np.tile(
            np.arange(score.shape[1]), (q.shape[0], 1)
        )
        ps = np.take_along_axis(score, part, axis=1)
        order = np.lexsort((part, ps), axis=1)
        ids = np.take_along_axis(part, order, axis=1)
        sc = np.take_along_axis(ps, order, axis=1)
        out_ids[s : s + chunk] = ids
        out_d[s : s + chunk] = np.maximum(sc, 0.0) if metric == "l2" else -sc
    return out_ids, out_d


def compute_ground_truth(
    base: np.ndarray, queries: np.ndarray, k: int, metric: str = "l2", threads: Optional[int] = None
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k``: the engine's ``nearline.compute_ground_truth`` when present, else NumPy."""
    try:
        import nearline

        fn = getattr(nearline, "compute_ground_truth", None)
    except ImportError:
        fn = None
    if fn is not None:
        ids, d = fn(base, queries, k, metric=metric, threads=threads)
        return np.asarray(ids, dtype=np.int64), np.asarray(d, dtype=np.float32)
    log.info("nearline.compute_ground_truth unavailable; using NumPy brute force")
    return brute_force_ground_truth(base, queries, k, metric)


# --------------------------------------------------------------------------- synthetic


def synthetic_clustered(
    n: int,
    dim: int,
    *,
    clusters: Optional[int] = None,
    seed: int = 0,
    dtype: str = "float32",
    shuffle: bool = True,
    queries: int = 1000,
) -> tuple[np.ndarray, np.ndarray]:
    """A Gaussian mixture with unequal cluster sizes and spreads.

    ``n + queries`` points are drawn from one mixture; a random ``queries`` of
    them are held out as the query set. With ``shuffle`` the base rows are in
    random order (no locality in the ids); without it they are grouped by cluster.

    Args:
        n: number of base vectors.
        dim: dimensionality.
        clusters: number of mixture components (default ``clamp(sqrt(n)/2, 4, 1024)``).
        seed: RNG seed; equal arguments give equal arrays.
        dtype: ``float32``, ``float16``, ``uint8`` or ``int8`` (integers are an
            affine rescaling of the float data, clipped to the type's range).
        shuffle: shuffle the base rows.
        queries: size of the held-out query set.

    Returns:
        ``(base (n, dim), queries (queries, dim))`` of ``dtype``.
    """
    if n <= 0 or dim <= 0 or queries < 0:
        raise ValueError(
            f"synthetic_clustered: need n > 0, dim > 0, queries >= 0 (got n={n}, dim={dim}, queries={queries})"
        )
    out_dt = np.dtype(dtype)
    if out_dt not in _EXT_FOR_DTYPE:
        raise ValueError(f"synthetic_clustered: dtype {out_dt} unsupported: expected float32, float16, uint8 or int8")
    total = n + queries
    if clusters is None:
        clusters = int(min(1024, max(4, round(np.sqrt(n) / 2))))
    clusters = max(1, min(int(clusters), total))
    rng = np.random.default_rng(np.random.SeedSequence([seed, n, dim, queries, clusters]))
    # Unequal sizes: Dirichlet weights (alpha < 1 makes some clusters much larger).
    weights = rng.dirichlet(np.full(clusters, 0.7))
    sizes = rng.multinomial(total, weights)
    centres = rng.normal(0.0, 1.0, size=(clusters, dim)).astype(np.float32)
    # Spread per coordinate relative to the centre spacing (centres are N(0, I)).
    spreads = (0.35 * rng.lognormal(0.0, 0.4, size=clusters)).astype(np.float32)
    # Each cluster varies mostly along a few random directions (low intrinsic
    # dimension, like real embeddings) plus a little isotropic noise.
    rank = int(min(dim, 12))
    points = np.empty((total, dim), dtype=np.float32)
    pos = 0
    for c in range(clusters):
        m = int(sizes[c])
        if m == 0:
            continue
        basis = rng.standard_normal((rank, dim), dtype=np.float32) / np.float32(np.sqrt(rank))
        pts = rng.standard_normal((m, rank), dtype=np.float32) @ basis
        pts += np.float32(0.3) * rng.standard_normal((m, dim), dtype=np.float32)
        pts *= spreads[c]
        pts += centres[c]
        points[pos : pos + m] = pts
        pos += m
    perm = rng.permutation(total)
    q_idx = np.sort(perm[:queries])
    b_idx = perm[queries:] if shuffle else np.sort(perm[queries:])
    base = points[b_idx]
    qs = points[q_idx]
    return _convert(base, out_dt, ref=base), _convert(qs, out_dt, ref=base)


def _convert(x: np.ndarray, dt: np.dtype, ref: np.ndarray) -> np.ndarray:
    """Converts float data to ``dt``; integer types use an affine map fitted on ``ref``."""
    if dt == np.float32:
        return np.ascontiguousarray(x, dtype=np.float32)
    if dt == np.float16:
        return np.ascontiguousarray(x.astype(np.float16))
    lo, hi = float(ref.min()), float(ref.max())
    span = hi - lo if hi > lo else 1.0
    if dt == np.uint8:
        y = (x - lo) / span * 255.0
        return np.ascontiguousarray(np.clip(np.rint(y), 0, 255).astype(np.uint8))
    m = max(abs(lo), abs(hi)) or 1.0
    y = x / m * 127.0
    return np.ascontiguousarray(np.clip(np.rint(y), -127, 127).astype(np.int8))


# --------------------------------------------------------------------------- loaders


def load_hdf5(path: PathLike) -> Dataset:
    """Loads an ann-benchmarks HDF5 file (``train``, ``test``, ``neighbors``, ``distances``).

    The ``distance`` attribute (``euclidean``/``angular``/``dot``) sets the metric
    (``l2``/``cosine``/``ip``). ``neighbors``/``distances`` are optional.
    """
    import h5py

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such HDF5 file")
    with h5py.File(path, "r") as f:
        for key in ("train", "test"):
            if key not in f:
                raise ValueError(
                    f"{path}: dataset {key!r} missing: an ann-benchmarks file needs 'train' and 'test' "
                    f"(found {sorted(f.keys())})"
                )
        base = np.ascontiguousarray(f["train"][()])
        queries = np.ascontiguousarray(f["test"][()])
        dist_attr = f.attrs.get("distance", "euclidean")
        if isinstance(dist_attr, bytes):
            dist_attr = dist_attr.decode()
        dist_attr = str(dist_attr).lower()
        if dist_attr not in HDF5_METRICS:
            raise ValueError(f"{path}: attribute 'distance' is {dist_attr!r}: expected one of {sorted(HDF5_METRICS)}")
        gt_ids = np.asarray(f["neighbors"][()], dtype=np.int64) if "neighbors" in f else None
        gt_d = np.asarray(f["distances"][()], dtype=np.float32) if "distances" in f else None
    for what, arr in (("train", base), ("test", queries)):
        if arr.ndim != 2:
            raise ValueError(f"{path}: dataset {what!r} has shape {arr.shape}: expected 2-D")
    if base.shape[1] != queries.shape[1]:
        raise ValueError(f"{path}: 'train' has dim {base.shape[1]} but 'test' has dim {queries.shape[1]}")
    if base.dtype == np.float64:
        base = base.astype(np.float32)
        queries = queries.astype(np.float32)
    if gt_ids is not None and gt_ids.shape[0] != queries.shape[0]:
        raise ValueError(f"{path}: 'neighbors' has {gt_ids.shape[0]} rows but 'test' has {queries.shape[0]}")
    return Dataset(path.stem, base, queries, HDF5_METRICS[dist_attr], gt_ids, gt_d)


def _decode_sq8(path: Path) -> np.ndarray:
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing (expected an sq8 npz with 'lo', 'codes', 'scale')")
    with np.load(path) as z:
        for key in ("lo", "codes", "scale"):
            if key not in z:
                raise ValueError(f"{path}: array {key!r} missing: expected 'lo', 'codes' and 'scale'")
        x = z["lo"] + z["codes"].astype(np.float32) * z["scale"]
    return np.ascontiguousarray(x, dtype=np.float32)


def load_wordnet(folder: PathLike) -> Dataset:
    """Loads the WordNet-MiniLM folder: ``base.sq8.npz``, ``query.sq8.npz``, ``gt.ibin`` [``gt_dist.fbin``]."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: not a directory (expected the wordnet-minilm folder)")
    base = _decode_sq8(folder / "base.sq8.npz")
    queries = _decode_sq8(folder / "query.sq8.npz")
    gt_ids = gt_d = None
    gt_path = folder / "gt.ibin"
    if gt_path.exists():
        raw = np.fromfile(gt_path, dtype="<i4")
        if raw.size < 2:
            raise ValueError(f"{gt_path}: shorter than its 8-byte header (int32 n, int32 k)")
        nq, k = int(raw[0]), int(raw[1])
        if raw.size != 2 + nq * k:
            raise ValueError(
                f"{gt_path}: header says n={nq}, k={k}: expected {8 + 4 * nq * k} bytes, got {4 * raw.size}"
            )
        gt_ids = raw[2:].reshape(nq, k).astype(np.int64)
        dpath = folder / "gt_dist.fbin"
        if dpath.exists():
            gt_d = read_vectors(dpath)
            if gt_d.shape != gt_ids.shape:
                log.warning("%s: shape %s differs from gt.ibin %s; ignored", dpath, gt_d.shape, gt_ids.shape)
                gt_d = None
        if nq != queries.shape[0]:
            raise ValueError(f"{gt_path}: {nq} rows but query.sq8.npz has {queries.shape[0]} queries")
    return Dataset("wordnet-minilm", base, queries, "l2", gt_ids, gt_d)


def _file_key(*paths: Path) -> str:
    h = hashlib.sha1()
    for p in paths:
        st = p.stat()
        h.update(f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:12]


def default_workdir() -> Path:
    """``$NEARLINE_WORKDIR`` or ``./bench-out``."""
    return Path(os.environ.get("NEARLINE_WORKDIR", "bench-out"))


def load_dataset(spec: str, workdir: Optional[PathLike] = None, *, queries: int = 1000) -> Dataset:
    """Resolves a spec string (see the module doc) into a :class:`Dataset`.

    Synthetic sets are cached as ``.fbin`` under ``workdir/data/`` and reloaded
    from there, so every process sees the same bytes; ``base_path`` etc. are set
    whenever the data lives in files.
    """
    kind, _, rest = spec.partition(":")
    kind = kind.lower()
    if not rest:
        raise ValueError(
            f"dataset spec {spec!r}: expected synthetic:N:DIM[:SEED], wordnet:PATH, hdf5:PATH "
            "or files:BASE,QUERIES[,GT]"
        )
    if kind == "synthetic":
        parts = rest.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"dataset spec {spec!r}: expected synthetic:N:DIM[:SEED]")
        try:
            n, dim = int(parts[0]), int(parts[1])
            seed = int(parts[2]) if len(parts) == 3 else 0
        except ValueError:
            raise ValueError(f"dataset spec {spec!r}: N, DIM and SEED must be integers") from None
        name = f"synthetic-{n}x{dim}-s{seed}-q{queries}"
        if workdir is None:
            base, qs = synthetic_clustered(n, dim, seed=seed, queries=queries)
            return Dataset(name, base, qs, "l2")
        folder = Path(workdir) / "data" / name
        bp, qp = folder / "base.fbin", folder / "queries.fbin"
        if not (bp.exists() and qp.exists()):
            log.info("generating %s into %s", name, folder)
            base, qs = synthetic_clustered(n, dim, seed=seed, queries=queries)
            write_bin(bp, base)
            write_bin(qp, qs)
        ds = Dataset(name, read_vectors(bp), read_vectors(qp), "l2", base_path=bp, queries_path=qp)
        gp = folder / "gt.bin"
        if gp.exists():
            ds.gt_ids, ds.gt_dists = read_ground_truth(gp)
            ds.gt_path = gp
        return ds
    if kind == "wordnet":
        return load_wordnet(rest)
    if kind == "hdf5":
        return load_hdf5(rest)
    if kind == "files":
        parts = [p for p in rest.split(",") if p]
        if len(parts) not in (2, 3):
            raise ValueError(f"dataset spec {spec!r}: expected files:BASE,QUERIES[,GT]")
        bp, qp = Path(parts[0]), Path(parts[1])
        base, qs = read_vectors(bp), read_vectors(qp)
        if base.shape[1] != qs.shape[1]:
            raise ValueError(f"{qp}: queries have dim {qs.shape[1]} but {bp} has dim {base.shape[1]}")
        ds = Dataset(bp.stem + "-" + _file_key(bp, qp), base, qs, "l2", base_path=bp, queries_path=qp)
        if len(parts) == 3:
            ds.gt_path = Path(parts[2])
            ds.gt_ids, ds.gt_dists = read_ground_truth(ds.gt_path)
        return ds
    raise ValueError(f"dataset spec {spec!r}: unknown kind {kind!r}: expected synthetic, wordnet, hdf5 or files")


def materialize(ds: Dataset, workdir: PathLike, k: int, threads: Optional[int] = None) -> Dataset:
    """Makes sure ``ds`` has base/query/ground-truth files (written under ``workdir/data/``).

    Ground truth is computed when missing or shallower than ``k``.
    """
    folder = Path(workdir) / "data" / ds.name
    if ds.base_path is None:
        ds.base_path = write_bin(folder / f"base{vector_ext(ds.base.dtype)}", ds.base)
    if ds.queries_path is None:
        ds.queries_path = write_bin(folder / f"queries{vector_ext(ds.queries.dtype)}", ds.queries)
    if ds.gt_ids is None or ds.gt_ids.shape[1] < k:
        gp = folder / "gt.bin"
        if gp.exists():
            ids, d = read_ground_truth(gp)
            if ids.shape[1] >= k and ids.shape[0] == ds.queries.shape[0]:
                ds.gt_ids, ds.gt_dists, ds.gt_path = ids, d, gp
                return ds
        log.info("computing exact ground truth (k=%d) for %s", max(k, 100), ds.name)
        ids, d = compute_ground_truth(ds.base, ds.queries, max(k, 100), ds.metric, threads)
        ds.gt_ids, ds.gt_dists = ids, d
        ds.gt_path = write_ground_truth(gp, ids, d)
    elif ds.gt_path is None:
        ds.gt_path = write_ground_truth(folder / "gt.bin", ds.gt_ids, ds.gt_dists)
    return ds


def recall_at_k(found: np.ndarray, gt: np.ndarray, k: int) -> float:
    """Mean recall@k: ``|found[:, :k] ∩ gt[:, :k]| / k`` averaged over queries (ids < 0 ignored)."""
    found = np.asarray(found)[:, :k]
    gt = np.asarray(gt)[:, :k]
    if found.shape[0] != gt.shape[0]:
        raise ValueError(f"recall: {found.shape[0]} result rows but {gt.shape[0]} ground-truth rows")
    if gt.shape[1] < k:
        raise ValueError(f"recall@{k}: ground truth has only {gt.shape[1]} neighbours per query")
    hits = 0
    for f, g in zip(found, gt):
        hits += np.intersect1d(f[f >= 0], g, assume_unique=False).size
    return hits / float(k * max(1, found.shape[0]))
