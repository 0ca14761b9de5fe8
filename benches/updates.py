"""SPFresh's update benchmark ("workload A") on nearline's partition index, and on its graph index.

A base of ``--n`` vectors is built once; then, for ``--epochs`` epochs, each epoch
deletes ``rate·n`` random live vectors and inserts ``rate·n`` new ones (SPFresh §5,
1% per epoch over 100 epochs). Each system runs in its own subprocess:

* ``lire``   -- ``build(preset="spfresh", lire=True)``: splits, merges and reassigns (SPFresh);
* ``spann+`` -- ``build(preset="spfresh", lire=False)``: appends and garbage collection only
  (the paper's SPANN+ baseline);
* ``graph``  -- ``build(preset=--graph-preset)`` (default ``diskann``): the graph index, updated out
  of place (FreshDiskANN's delta and delete set, merged into a new disk graph when the delta fills
  its share of the budget, and at each checkpoint); searched at ``--L`` instead of ``--nprobe``.

Two data distributions (one Gaussian mixture, seeded):

* ``shifted``   -- ``--shift-clusters`` (20%) of the mixture's clusters are under-represented in
  the base (``--shift-base``: 2% of its vectors come from them) and dominate the insert stream
  (``--shift-stream``: 90% of it), so the live data drifts over the run;
* ``unshifted`` -- base and inserts come from the same mixture.

Both systems see the same base, the same insert stream and the same deletes (the live set is
tracked here, not read from the engine, and every random choice is seeded by ``--seed`` and the
distribution). Inserted vectors take their row of the data pool as their id, so the pool is
the "vectors indexed by id" array the exact ground truth is gathered from.

Queries: a fixed set of ``--queries`` fresh draws (not in the index), half from the base's
mixture and half from the insert stream's (for ``unshifted`` the two coincide), so they cover the
data at epoch 0 and the data the stream brings.

At epoch 0 (before any update), every ``--measure-every`` epochs and at the last epoch, with the
index as the background worker leaves it (no ``maintain()``; the queued jobs are recorded), or
with ``--drain``, after each epoch's background work finished (``maintain()`` at the end of every
epoch, timed as ``maintain_seconds``: an epoch is a day whose rebalancing completes before the
next one):

* recall@k against the exact k nearest neighbours of the current live set (NumPy, chunked);
* per-query latency (``stats["total_us"]``) P50/P99/P99.9 of the query set on one thread, and
  QPS of the same set on ``--threads`` threads;
* mean reads and bytes read per query (one-thread pass);
* the engine's resident memory (``info()["memory"]["resident"]``) and the process's VmRSS /
  RssAnon, disk size (``du`` of the index directory and per file), ``info()["updates"]``;
* whether the engine's live ids equal the tracked live set.

Per epoch: delete and insert times, insert throughput (vectors/s), mean latency per inserted
vector and per insert call (``--batch`` vectors), P99 / max call latency.

With ``--fresh-build`` (default) the final live set is also built from scratch with the same
parameters (in a subprocess) and measured at the same nprobe: the "within 1 point of a fresh
build" bar.

Usage (full scale, the paper's shape)::

    .venv/bin/python benches/updates.py --workdir /work/bench/updates \
        --out updates.json --plot updates

Tiny smoke run::

    .venv/bin/python benches/updates.py --n 5000 --dim 16 --epochs 4 --measure-every 2 \
        --queries 100 --workdir /tmp/upd --out /tmp/upd/updates.json --plot /tmp/upd/updates
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

#: system -> whether it is a partition index built with LIRE (None: the graph index).
SYSTEMS: Dict[str, Optional[bool]] = {"lire": True, "spann+": False, "graph": None}


def search_opts(args: argparse.Namespace, graph: bool) -> Dict[str, int]:
    """The search knob of the system: ``L`` for the graph index, ``nprobe`` for a partition index."""
    return {"L": args.L} if graph else {"nprobe": args.nprobe}
DISTS = ("shifted", "unshifted")
DIST_CODE = {"shifted": 1, "unshifted": 2}
QUERY_MIX = "half base mixture, half insert-stream mixture (fresh draws, not in the index)"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- data


def default_clusters(total: int) -> int:
    return int(min(1024, max(16, round(np.sqrt(total) / 2))))


class Mixture:
    """A Gaussian mixture with unequal cluster sizes and spreads, each cluster varying mostly
    along a few random directions (as ``nearline.datasets.synthetic_clustered`` draws them),
    with a seeded subset of "shift" clusters."""

    def __init__(self, clusters: int, dim: int, seed: int, shift_fraction: float) -> None:
        rng = np.random.default_rng(np.random.SeedSequence([seed, dim, clusters, 4242]))
        self.clusters, self.dim = clusters, dim
        self.weights = rng.dirichlet(np.full(clusters, 0.7))
        self.centres = rng.normal(0.0, 1.0, size=(clusters, dim)).astype(np.float32)
        self.spreads = (0.35 * rng.lognormal(0.0, 0.4, size=clusters)).astype(np.float32)
        self.rank = int(min(dim, 12))
        self.bases = (rng.standard_normal((clusters, self.rank, dim), dtype=np.float32)
                      / np.float32(np.sqrt(self.rank)))
        n_shift = int(min(clusters - 1, max(1, round(shift_fraction * clusters))))
        self.shift = np.zeros(clusters, dtype=bool)
        self.shift[rng.choice(clusters, n_shift, replace=False)] = True

    def weights_with(self, shift_share: Optional[float]) -> np.ndarray:
        """The mixture's weights, with the shift clusters rescaled to hold ``shift_share`` of the
        mass (None: unchanged)."""
        w = self.weights.copy()
        if shift_share is not None:
            s = self.shift
            w[s] *= shift_share / w[s].sum()
            w[~s] *= (1.0 - shift_share) / w[~s].sum()
        return w / w.sum()

    def draw(self, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One point per label, in the labels' order."""
        out = np.empty((labels.size, self.dim), dtype=np.float32)
        order = np.argsort(labels, kind="stable")
        sorted_l = labels[order]
        cuts = np.flatnonzero(np.diff(sorted_l)) + 1
        for rows in np.split(order, cuts):
            if rows.size == 0:
                continue
            c = int(labels[rows[0]])
            pts = rng.standard_normal((rows.size, self.rank), dtype=np.float32) @ self.bases[c]
            pts += np.float32(0.3) * rng.standard_normal((rows.size, self.dim), dtype=np.float32)
            pts *= self.spreads[c]
            pts += self.centres[c]
            out[rows] = pts
        return out


def data_paths(args: argparse.Namespace, dist: str) -> Dict[str, Path]:
    key = (f"updates-{dist}-n{args.n}-d{args.dim}-e{args.epochs}-r{args.rate:g}-c{args.clusters}"
           f"-q{args.queries}-s{args.seed}-sh{args.shift_clusters:g}-{args.shift_base:g}-{args.shift_stream:g}")
    folder = Path(args.workdir) / "data" / key
    return {"folder": folder, "pool": folder / "pool.npy", "labels": folder / "labels.npy",
            "queries": folder / "queries.npy", "shift": folder / "shift_clusters.npy"}


def make_data(args: argparse.Namespace, dist: str) -> Dict[str, Path]:
    """Writes the pool (base rows 0..n, then the insert stream in order) and the queries."""
    p = data_paths(args, dist)
    if all(p[k].exists() for k in ("pool", "labels", "queries", "shift")):
        return p
    p["folder"].mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    mix = Mixture(args.clusters, args.dim, args.seed, args.shift_clusters)
    rng = np.random.default_rng(np.random.SeedSequence([args.seed, DIST_CODE[dist], 17]))
    if dist == "shifted":
        w_base, w_stream = mix.weights_with(args.shift_base), mix.weights_with(args.shift_stream)
    else:
        w_base = w_stream = mix.weights_with(None)
    n_stream = args.epochs * per_epoch(args)
    labels = np.concatenate([rng.choice(mix.clusters, args.n, p=w_base),
                             rng.choice(mix.clusters, n_stream, p=w_stream)]).astype(np.int32)
    pool = mix.draw(labels, rng)
    half = args.queries // 2
    q_labels = np.concatenate([rng.choice(mix.clusters, args.queries - half, p=w_base),
                               rng.choice(mix.clusters, half, p=w_stream)]).astype(np.int32)
    queries = mix.draw(q_labels, rng)
    for key, arr in (("pool", pool), ("labels", labels), ("queries", queries), ("shift", mix.shift)):
        tmp = p[key].with_name(p[key].stem + f".tmp{os.getpid()}.npy")
        np.save(tmp, arr)
        os.replace(tmp, p[key])
    log(f"[data] {dist}: pool {pool.shape} + {queries.shape[0]} queries in {time.perf_counter() - t0:.1f} s "
        f"({p['folder']})")
    return p


def per_epoch(args: argparse.Namespace) -> int:
    return max(1, int(round(args.rate * args.n)))


# --------------------------------------------------------------------------- measures


def proc_status() -> Dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[name] = int(rest.split()[0]) * 1024
    return out


def disk_usage(path: Path) -> Dict[str, Any]:
    """``du``: allocated bytes (st_blocks) and apparent bytes, in total and per top-level file."""
    alloc = apparent = 0
    files: Dict[str, int] = {}
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                st = os.stat(os.path.join(root, name))
            except FileNotFoundError:  # a state file replaced under us
                continue
            alloc += st.st_blocks * 512
            apparent += st.st_size
            rel = os.path.relpath(os.path.join(root, name), path)
            files[rel] = st.st_size
    return {"du_bytes": alloc, "apparent_bytes": apparent, "files": files}


def exact_knn(pool: np.ndarray, live: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Ids (rows of ``pool``) of the exact k nearest live vectors (squared l2), by chunked
    matrix products in NumPy."""
    from nearline.datasets import brute_force_ground_truth

    rows, _ = brute_force_ground_truth(pool[live], queries, k, "l2")
    return live[rows]


def pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else float("nan")


def resident(memory: Dict[str, Any]) -> int:
    """The engine's resident bytes: a partition index reports ``resident``, a graph index ``total``."""
    return int(memory.get("resident", memory.get("total", 0)))


def measure(idx: Any, args: argparse.Namespace, queries: np.ndarray, alive: Optional[np.ndarray],
            index_dir: Path, graph: bool = False) -> Dict[str, Any]:
    """One measurement point of an open index (see the module doc). The ids found are returned
    under ``_found`` (one-thread pass) and ``_found_threads``; the caller scores them."""
    info = idx.info()
    status = proc_status()
    point: Dict[str, Any] = {
        "n": int(info["n"]),
        "postings": info.get("postings"),
        "heads": info.get("heads"),
        "blocks": info.get("blocks"),
        "updates": info.get("updates", {}),
        "queued_jobs": info.get("updates", {}).get("queued_jobs"),
        "memory": info.get("memory", {}),
        "resident_bytes": resident(info.get("memory", {})),
        "engine_disk_bytes": info.get("disk_bytes"),
        "process_rss_bytes": status.get("VmRSS"),
        "process_rss_anon_bytes": status.get("RssAnon"),
        "process_rss_file_bytes": status.get("RssFile"),
        "process_hwm_bytes": status.get("VmHWM"),
        "disk": disk_usage(index_dir),
    }
    if alive is not None:
        engine_ids = np.asarray(idx.ids(), dtype=np.int64)
        tracked = np.flatnonzero(alive)
        point["live_id_mismatch"] = int(np.setxor1d(engine_ids, tracked, assume_unique=True).size)
    nq = queries.shape[0]
    # Warm-up (in-memory structures, the I/O rings), not measured.
    knob = search_opts(args, graph)
    idx.search(queries[: min(100, nq)], args.k, threads=args.threads, **knob)
    lat: List[np.ndarray] = []
    reads: List[np.ndarray] = []
    bytes_read: List[np.ndarray] = []
    hops: List[np.ndarray] = []
    stale: List[np.ndarray] = []
    found = None
    for _ in range(args.latency_repeats):
        ids, _d, st = idx.search(queries, args.k, threads=1, return_stats=True, **knob)
        if found is None:
            found = ids
        lat.append(np.asarray(st["total_us"], dtype=np.float64))
        reads.append(np.asarray(st["reads"], dtype=np.float64))
        bytes_read.append(np.asarray(st["bytes_read"], dtype=np.float64))
        hops.append(np.asarray(st.get("hops", st["reads"]), dtype=np.float64))
        if "stale" in st:
            stale.append(np.asarray(st["stale"], dtype=np.float64))
    lat_a = np.concatenate(lat)
    # P99.9 of each pass, and their median: a stall of the shared virtual
    # disk (tens of ms, several queries in a row) lands in one pass, and the
    # median of passes keeps it from deciding the figure (the pooled
    # percentile counts it).
    p999_passes = [pct(x, 99.9) for x in lat]
    t0 = time.perf_counter()
    ids_mt, _ = idx.search(queries, args.k, threads=args.threads, **knob)
    wall = time.perf_counter() - t0
    # Memory again once the searches ran (their scratch and I/O buffers included).
    after = idx.info().get("memory", {})
    point["resident_after_search_bytes"] = resident(after)
    point["process_rss_after_search_bytes"] = proc_status().get("VmRSS")
    point.update({
        "_found": found,
        "_found_threads": ids_mt,
        "latency_samples": int(lat_a.size),
        "latency_p50_us": pct(lat_a, 50),
        "latency_p99_us": pct(lat_a, 99),
        "latency_p999_us": pct(lat_a, 99.9),
        "latency_p999_passes_us": p999_passes,
        "latency_p999_median_us": float(np.median(p999_passes)),
        "latency_max_us": float(lat_a.max()),
        "latency_mean_us": float(lat_a.mean()),
        "qps": nq / wall if wall > 0 else float("nan"),
        "qps_threads": args.threads,
        "mean_reads": float(np.concatenate(reads).mean()),
        "mean_bytes_read": float(np.concatenate(bytes_read).mean()),
        "mean_hops": float(np.concatenate(hops).mean()),
        "mean_stale": float(np.concatenate(stale).mean()) if stale else None,
    })
    return point


# --------------------------------------------------------------------------- build subprocess


def build_opts(args: argparse.Namespace, graph: bool = False) -> Dict[str, Any]:
    opts: Dict[str, Any] = {"preset": args.graph_preset if graph else "spfresh", "threads": args.threads,
                            "seed": args.seed}
    if args.memory_budget is not None:
        opts["memory_budget"] = parse_value(args.memory_budget)
    for item in args.build_opt:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--build-opt {item!r}: expected KEY=VALUE")
        opts[key.strip()] = parse_value(value.strip())
    return opts


def parse_value(v: str) -> Any:
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def build_worker(spec_path: str) -> None:
    """Builds one index (the base, or the fresh build of the final live set) and exits, so the
    build's memory never counts in the measuring process."""
    import nearline

    spec = json.loads(Path(spec_path).read_text())
    pool = np.load(spec["pool"], mmap_mode="r")
    if spec.get("ids_file"):
        ids = np.load(spec["ids_file"])
        data = np.ascontiguousarray(pool[ids])
    else:
        ids = np.arange(spec["n"], dtype=np.int64)
        data = np.ascontiguousarray(pool[: spec["n"]])
    t0 = time.perf_counter()
    lire = {} if spec["lire"] is None else {"lire": spec["lire"]}
    idx = nearline.build(data, spec["path"], ids=ids, overwrite=True, progress=False, **lire, **spec["opts"])
    seconds = time.perf_counter() - t0
    info = idx.info()
    idx.close()
    Path(spec["out"]).write_text(json.dumps({"seconds": seconds, "n": int(ids.size), "info": info}, default=str))


def run_build(spec: Dict[str, Any], workdir: Path, tag: str) -> Dict[str, Any]:
    spec_path = workdir / f"build-{tag}.json"
    spec["out"] = str(workdir / f"build-{tag}.out.json")
    spec_path.write_text(json.dumps(spec))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, os.path.abspath(__file__), "--build-worker", str(spec_path)], check=True)
    res = json.loads(Path(spec["out"]).read_text())
    res["wall_seconds"] = time.perf_counter() - t0
    return res


# --------------------------------------------------------------------------- one run


def worker(args: argparse.Namespace) -> None:
    """One (distribution, system) run in this process; writes ``--run-out``."""
    import nearline

    dist, system = args.worker.split(",")
    lire = SYSTEMS[system]
    graph = lire is None
    tag = f"{dist}-{system.replace('+', 'plus')}"
    paths = data_paths(args, dist)
    runs_dir = Path(args.workdir) / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    index_dir = Path(args.workdir) / "indexes" / tag
    index_dir.parent.mkdir(parents=True, exist_ok=True)
    pool = np.load(paths["pool"])  # in memory (anonymous): its RSS stays constant over the run
    labels = np.load(paths["labels"])
    shift = np.load(paths["shift"])
    queries = np.ascontiguousarray(np.load(paths["queries"]), dtype=np.float32)
    m = per_epoch(args)
    rss_baseline = proc_status()
    result: Dict[str, Any] = {"dist": dist, "system": system, "lire": lire, "points": [], "epochs": [],
                              "errors": [], "rss_baseline": rss_baseline, "pid": os.getpid()}
    t_run = time.perf_counter()

    def save() -> None:
        result["run_seconds"] = time.perf_counter() - t_run
        tmp = Path(args.run_out).with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1, default=float))
        os.replace(tmp, args.run_out)

    opts = build_opts(args, graph)
    log(f"[{dist}/{system}] building the base: {args.n} × {args.dim}")
    b = run_build({"pool": str(paths["pool"]), "n": args.n, "path": str(index_dir), "lire": lire, "opts": opts},
                  runs_dir, tag)
    result["build"] = {"seconds": b["seconds"], "wall_seconds": b["wall_seconds"], "info": b["info"]}
    log(f"[{dist}/{system}] built in {b['seconds']:.1f} s ({b['info'].get('postings')} postings)")

    alive = np.zeros(pool.shape[0], dtype=bool)
    alive[: args.n] = True
    next_row = args.n
    rng_del = np.random.default_rng(np.random.SeedSequence([args.seed, DIST_CODE[dist], 99]))
    idx = nearline.open(index_dir, threads=args.threads, durability=args.durability)
    t_epochs = 0.0

    last_truth: Dict[str, np.ndarray] = {}

    def point(epoch: int) -> Dict[str, Any]:
        live = np.flatnonzero(alive)
        pt = measure(idx, args, queries, alive, index_dir, graph)
        t0 = time.perf_counter()
        truth = exact_knn(pool, live, queries, args.k)
        gt_s = time.perf_counter() - t0
        # recall against the exact answer, computed after the searches (the ground truth's
        # temporaries would otherwise count in the RSS read above)
        pt["recall"] = float(nearline.recall(pt.pop("_found"), truth, args.k))
        pt["recall_threads"] = float(nearline.recall(pt.pop("_found_threads"), truth, args.k))
        pt["process_rss_over_baseline_bytes"] = (pt["process_rss_bytes"] or 0) - rss_baseline.get("VmRSS", 0)
        pt.update({"epoch": epoch, "ground_truth_seconds": gt_s, "updating_seconds": t_epochs,
                   "live": int(live.size), "live_shift_fraction": float(shift[labels[live]].mean())})
        last_truth["truth"] = truth
        return pt

    checkpoint_every = args.checkpoint_every if args.checkpoint_every is not None else args.measure_every
    try:
        result["points"].append(point(0))
        log_point(dist, system, result["points"][-1])
        save()
        for epoch in range(1, args.epochs + 1):
            t_epoch = time.perf_counter()
            live = np.flatnonzero(alive)
            dels = rng_del.choice(live, size=min(m, live.size), replace=False)
            del_calls = []
            deleted = 0
            for s in range(0, dels.size, args.batch):
                t0 = time.perf_counter()
                deleted += idx.delete(dels[s: s + args.batch])
                del_calls.append(time.perf_counter() - t0)
            alive[dels] = False
            if deleted != dels.size:
                result["errors"].append(f"epoch {epoch}: delete returned {deleted} live of {dels.size}")
            ins_calls = []
            rows = np.arange(next_row, next_row + m, dtype=np.int64)
            for s in range(0, rows.size, args.batch):
                r = rows[s: s + args.batch]
                t0 = time.perf_counter()
                got = idx.insert(pool[r[0]: r[-1] + 1], ids=r)
                ins_calls.append(time.perf_counter() - t0)
                if not np.array_equal(np.asarray(got), r):
                    result["errors"].append(f"epoch {epoch}: insert returned other ids than asked")
            alive[rows] = True
            next_row += m
            maint_s = None
            if args.drain:
                t0 = time.perf_counter()
                idx.maintain()
                maint_s = time.perf_counter() - t0
            ckpt_s = None
            if checkpoint_every and epoch % checkpoint_every == 0:
                t0 = time.perf_counter()
                idx.checkpoint()
                ckpt_s = time.perf_counter() - t0
            t_epochs += time.perf_counter() - t_epoch
            upd = idx.info().get("updates", {})
            ic = np.asarray(ins_calls)
            ins_s, del_s = float(ic.sum()), float(np.sum(del_calls))
            result["epochs"].append({
                "epoch": epoch, "deleted": int(deleted), "inserted": int(rows.size),
                "delete_seconds": del_s, "insert_seconds": ins_s,
                "insert_vectors_per_s": rows.size / ins_s if ins_s > 0 else None,
                "delete_vectors_per_s": deleted / del_s if del_s > 0 else None,
                "insert_us_per_vector": 1e6 * ins_s / rows.size,
                "insert_call_ms_mean": 1e3 * float(ic.mean()),
                "insert_call_ms_p50": 1e3 * pct(ic, 50),
                "insert_call_ms_p99": 1e3 * pct(ic, 99),
                "insert_call_ms_max": 1e3 * float(ic.max()),
                "insert_calls": int(ic.size),
                "checkpoint_seconds": ckpt_s,
                "maintain_seconds": maint_s,
                "epoch_seconds": time.perf_counter() - t_epoch,
                "updates": upd,
            })
            e = result["epochs"][-1]
            log(f"[{dist}/{system}] epoch {epoch}/{args.epochs}: insert {e['insert_vectors_per_s']:.0f} vec/s "
                f"({e['insert_call_ms_mean']:.1f} ms/call), delete {del_s:.2f} s, "
                f"maintain {maint_s if maint_s is None else round(maint_s, 2)} s, queued {upd.get('queued_jobs')}, "
                f"splits {upd.get('splits')} merges {upd.get('merges')} reassigned {upd.get('reassigned')}")
            if epoch % args.measure_every == 0 or epoch == args.epochs:
                result["points"].append(point(epoch))
                log_point(dist, system, result["points"][-1])
                save()
        final_truth = last_truth["truth"]
        idx.close()
        idx = None
        if args.fresh_build:
            live = np.flatnonzero(alive).astype(np.int64)
            ids_file = runs_dir / f"{tag}-live.npy"
            np.save(ids_file, live)
            fresh_dir = Path(args.workdir) / "indexes" / f"{tag}-fresh"
            log(f"[{dist}/{system}] fresh build of the final live set ({live.size})")
            fb = run_build({"pool": str(paths["pool"]), "ids_file": str(ids_file), "path": str(fresh_dir),
                            "lire": lire, "opts": opts}, runs_dir, tag + "-fresh")
            fidx = nearline.open(fresh_dir, threads=args.threads, durability=args.durability)
            try:
                fp = measure(fidx, args, queries, None, fresh_dir, graph)
            finally:
                fidx.close()
            fp["recall"] = float(nearline.recall(fp.pop("_found"), final_truth, args.k))
            fp["recall_threads"] = float(nearline.recall(fp.pop("_found_threads"), final_truth, args.k))
            fp["process_rss_over_baseline_bytes"] = (fp["process_rss_bytes"] or 0) - rss_baseline.get("VmRSS", 0)
            fp.update({"epoch": args.epochs, "build_seconds": fb["seconds"], "build_info": fb["info"]})
            result["fresh"] = fp
            log(f"[{dist}/{system}] fresh build: recall {fp['recall']:.4f}, p99.9 {fp['latency_p999_us']:.0f} µs")
            if not args.keep_indexes:
                shutil.rmtree(fresh_dir, ignore_errors=True)
            ids_file.unlink(missing_ok=True)
    except Exception as e:  # keep what was measured, say what failed
        result["errors"].append(f"{type(e).__name__}: {e}")
        log(f"[{dist}/{system}] FAILED: {type(e).__name__}: {e}")
        save()
        raise
    finally:
        if idx is not None:
            idx.close()
    save()
    if not args.keep_indexes:
        shutil.rmtree(index_dir, ignore_errors=True)


def log_point(dist: str, system: str, p: Dict[str, Any]) -> None:
    log(f"[{dist}/{system}] epoch {p['epoch']}: recall {p['recall']:.4f}, p50/p99/p99.9 "
        f"{p['latency_p50_us']:.0f}/{p['latency_p99_us']:.0f}/{p['latency_p999_us']:.0f} µs "
        f"(P99.9 median of passes {p999m(p):.0f}), "
        f"{p['qps']:.0f} QPS, resident {p['resident_bytes'] / 1e6:.1f} MB, disk {p['disk']['du_bytes'] / 1e6:.1f} MB, "
        f"queued {p['queued_jobs']}, id mismatch {p.get('live_id_mismatch')}")


# --------------------------------------------------------------------------- summary, plots, table


def p999m(p: Dict[str, Any]) -> float:
    """The median over passes of each pass's P99.9 (the pooled P99.9 for
    results written before it was recorded)."""
    return p.get("latency_p999_median_us", p["latency_p999_us"])


def summarise(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {"runs": {}, "lire_vs_spann": {}}
    by = {(r["dist"], r["system"]): r for r in runs if r.get("points")}
    for (dist, system), r in by.items():
        p0, pe = r["points"][0], r["points"][-1]
        ep = r["epochs"]
        ins_v = sum(e["inserted"] for e in ep)
        ins_s = sum(e["insert_seconds"] for e in ep)
        s = {
            "epochs_done": pe["epoch"],
            "recall_epoch0": p0["recall"], "recall_end": pe["recall"],
            "recall_change_pts": 100 * (pe["recall"] - p0["recall"]),
            "p999_epoch0_us": p0["latency_p999_us"], "p999_end_us": pe["latency_p999_us"],
            "p999_ratio_end_vs_epoch0": pe["latency_p999_us"] / p0["latency_p999_us"],
            "p99_ratio_end_vs_epoch0": pe["latency_p99_us"] / p0["latency_p99_us"],
            "p999_median_epoch0_us": p999m(p0), "p999_median_end_us": p999m(pe),
            "p999_median_ratio_end_vs_epoch0": p999m(pe) / p999m(p0),
            "p999_median_max_ratio_vs_epoch0": max(p999m(p) for p in r["points"]) / p999m(p0),
            "resident_epoch0_bytes": p0["resident_bytes"], "resident_end_bytes": pe["resident_bytes"],
            "resident_ratio_end_vs_epoch0": pe["resident_bytes"] / max(1, p0["resident_bytes"]),
            # the process's RSS above what it held before opening the index (the data pool, NumPy)
            "rss_over_baseline_epoch0_bytes": p0.get("process_rss_over_baseline_bytes"),
            "rss_over_baseline_end_bytes": pe.get("process_rss_over_baseline_bytes"),
            "rss_over_baseline_ratio_end_vs_epoch0": (pe.get("process_rss_over_baseline_bytes") or 0)
            / max(1, p0.get("process_rss_over_baseline_bytes") or 1),
            "disk_ratio_end_vs_epoch0": pe["disk"]["du_bytes"] / max(1, p0["disk"]["du_bytes"]),
            "mean_reads_ratio_end_vs_epoch0": pe["mean_reads"] / max(1e-9, p0["mean_reads"]),
            "insert_vectors_per_s": ins_v / ins_s if ins_s > 0 else None,
            "insert_us_per_vector": 1e6 * ins_s / ins_v if ins_v else None,
            "insert_call_ms_mean": float(np.mean([e["insert_call_ms_mean"] for e in ep])) if ep else None,
            "insert_call_ms_max": float(np.max([e["insert_call_ms_max"] for e in ep])) if ep else None,
            "live_id_mismatch_max": max(p.get("live_id_mismatch") or 0 for p in r["points"]),
            "updates_end": pe["updates"],
            "errors": r.get("errors", []),
        }
        if r.get("fresh"):
            f = r["fresh"]
            s.update({"recall_fresh": f["recall"], "recall_vs_fresh_pts": 100 * (pe["recall"] - f["recall"]),
                      "within_1pt_of_fresh": pe["recall"] >= f["recall"] - 0.01,
                      "p999_fresh_us": f["latency_p999_us"],
                      "p999_ratio_end_vs_fresh": pe["latency_p999_us"] / f["latency_p999_us"],
                      "p999_median_ratio_end_vs_fresh": p999m(pe) / p999m(f)})
        out["runs"][f"{dist}/{system}"] = s
    for dist in sorted({d for d, _ in by}):
        a, b = by.get((dist, "lire")), by.get((dist, "spann+"))
        if a and b:
            pa, pb = a["points"][-1], b["points"][-1]
            out["lire_vs_spann"][dist] = {
                "recall_lire": pa["recall"], "recall_spann": pb["recall"],
                "recall_diff_pts": 100 * (pa["recall"] - pb["recall"]),
                "p999_lire_us": pa["latency_p999_us"], "p999_spann_us": pb["latency_p999_us"],
                "p999_ratio_lire_vs_spann": pa["latency_p999_us"] / pb["latency_p999_us"],
                "p999_median_ratio_lire_vs_spann": p999m(pa) / p999m(pb),
                "mean_reads_lire": pa["mean_reads"], "mean_reads_spann": pb["mean_reads"],
                "disk_ratio_lire_vs_spann": pa["disk"]["du_bytes"] / max(1, pb["disk"]["du_bytes"]),
            }
    return out


def plot(runs: List[Dict[str, Any]], prefix: str) -> List[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"lire": "tab:blue", "spann+": "tab:red", "graph": "tab:green"}
    styles = {"shifted": "-", "unshifted": "--"}
    measures = [
        ("recall", "recall@k", lambda p: p["recall"], "points"),
        ("p999", "P99.9 latency, 1 thread, median of passes (ms)", lambda p: p999m(p) / 1e3, "points"),
        ("memory", "engine resident memory (MB)", lambda p: p["resident_bytes"] / 1e6, "points"),
        ("disk", "index directory, du (MB)", lambda p: p["disk"]["du_bytes"] / 1e6, "points"),
        ("insert", "insert throughput (vectors/s)", lambda e: e["insert_vectors_per_s"] or np.nan, "epochs"),
    ]
    written = []
    for name, ylabel, fn, source in measures:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for r in runs:
            rows = r.get(source) or []
            if not rows:
                continue
            x = [p["epoch"] for p in rows]
            y = [fn(p) for p in rows]
            ax.plot(x, y, styles.get(r["dist"], ":"), color=colours.get(r["system"]),
                    marker="o" if source == "points" else None, ms=3, label=f"{r['system']} / {r['dist']}")
            if name in ("recall", "p999") and r.get("fresh"):
                ax.plot([r["fresh"]["epoch"]], [fn(r["fresh"])], "x", color=colours.get(r["system"]), ms=8,
                        label=f"fresh build ({r['system']} / {r['dist']})")
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = f"{prefix}-{name}.png"
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def table(runs: List[Dict[str, Any]], summary: Dict[str, Any]) -> str:
    lines = []
    head = (f"{'run':<18} {'epoch':>5} {'recall':>7} {'p50µs':>7} {'p99µs':>7} {'p99.9µs':>8} {'med':>7} {'QPS':>7} "
            f"{'reads':>6} {'KB/q':>6} {'resMB':>7} {'rss+MB':>7} {'diskMB':>8} {'splits':>6} {'merges':>6} "
            f"{'reassn':>7} {'collect':>7} {'queued':>6}")
    lines.append(head)
    lines.append("-" * len(head))
    for r in runs:
        pts = list(r.get("points") or [])
        if r.get("fresh"):
            pts.append(dict(r["fresh"], epoch="fresh"))
        for p in pts:
            u = p.get("updates") or {}
            lines.append(
                f"{r['dist'] + '/' + r['system']:<18} {str(p['epoch']):>5} {p['recall']:>7.4f} "
                f"{p['latency_p50_us']:>7.0f} {p['latency_p99_us']:>7.0f} {p['latency_p999_us']:>8.0f} "
                f"{p999m(p):>7.0f} {p['qps']:>7.0f} {p['mean_reads']:>6.1f} {p['mean_bytes_read'] / 1e3:>6.0f} {p['resident_bytes'] / 1e6:>7.1f} "
                f"{(p.get('process_rss_over_baseline_bytes') or 0) / 1e6:>7.1f} {p['disk']['du_bytes'] / 1e6:>8.1f} "
                f"{u.get('splits', '-'):>6} {u.get('merges', '-'):>6} {u.get('reassigned', '-'):>7} "
                f"{u.get('collected', '-'):>7} {str(p.get('queued_jobs', '-')):>6}")
        if r.get("errors"):
            lines.append(f"  errors: {r['errors']}")
    lines.append("")
    lines.append(f"{'run':<18} {'Δrecall pts':>11} {'vs fresh pts':>12} {'p99.9 end/0':>11} {'med end/0':>9} "
                 f"{'med max/0':>9} {'resident end/0':>14} "
                 f"{'disk end/0':>10} {'ins vec/s':>10} {'µs/vec':>7} {'ms/call':>8}")
    for name, s in summary["runs"].items():
        vf = s.get("recall_vs_fresh_pts")
        lines.append(
            f"{name:<18} {s['recall_change_pts']:>+11.2f} {('%+.2f' % vf) if vf is not None else '-':>12} "
            f"{s['p999_ratio_end_vs_epoch0']:>11.2f} {s['p999_median_ratio_end_vs_epoch0']:>9.2f} "
            f"{s['p999_median_max_ratio_vs_epoch0']:>9.2f} {s['resident_ratio_end_vs_epoch0']:>14.2f} "
            f"{s['disk_ratio_end_vs_epoch0']:>10.2f} {s['insert_vectors_per_s'] or 0:>10.0f} "
            f"{s['insert_us_per_vector'] or 0:>7.0f} {s['insert_call_ms_mean'] or 0:>8.1f}")
    for dist, c in summary["lire_vs_spann"].items():
        lines.append(f"LIRE vs SPANN+ ({dist}): recall {c['recall_lire']:.4f} vs {c['recall_spann']:.4f} "
                     f"({c['recall_diff_pts']:+.2f} pts), P99.9 {c['p999_lire_us']:.0f} vs {c['p999_spann_us']:.0f} µs "
                     f"(×{c['p999_ratio_lire_vs_spann']:.2f}; median of passes ×{c['p999_median_ratio_lire_vs_spann']:.2f}), reads {c['mean_reads_lire']:.1f} vs "
                     f"{c['mean_reads_spann']:.1f}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="base vectors")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--rate", type=float, default=0.01,
                    help="each epoch deletes rate·n random live vectors and inserts rate·n new ones")
    ap.add_argument("--measure-every", type=int, default=10)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--nprobe", type=int, default=32, help="partition systems' search knob")
    ap.add_argument("--L", type=int, default=64, help="the graph system's search list")
    ap.add_argument("--graph-preset", default="diskann", help="preset of the graph system")
    ap.add_argument("--threads", type=int, default=2, help="build threads, index threads and the QPS pass's")
    ap.add_argument("--batch", type=int, default=1000, help="vectors per insert (and ids per delete) call")
    ap.add_argument("--systems", default="lire,spann+", help="comma list of: lire, spann+, graph")
    ap.add_argument("--dists", default="shifted,unshifted", help="comma list of: shifted, unshifted")
    ap.add_argument("--workdir", default=None, help="data, indexes and per-run JSON go here (required)")
    ap.add_argument("--out", default=None, help="result JSON (default WORKDIR/updates.json)")
    ap.add_argument("--plot", default=None, help="PNG prefix: PREFIX-recall.png, -p999, -memory, -disk, -insert")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--durability", default="sync", choices=("sync", "buffered"))
    ap.add_argument("--fresh-build", default=True, action=argparse.BooleanOptionalAction,
                    help="also build the final live set from scratch and measure it")
    ap.add_argument("--clusters", type=int, default=None,
                    help="mixture components (default clamp(sqrt(pool size)/2, 16, 1024))")
    ap.add_argument("--shift-clusters", type=float, default=0.2, help="shifted: fraction of clusters that drift in")
    ap.add_argument("--shift-base", type=float, default=0.02, help="shifted: base share from those clusters")
    ap.add_argument("--shift-stream", type=float, default=0.9, help="shifted: insert-stream share from them")
    ap.add_argument("--latency-repeats", type=int, default=5,
                    help="one-thread passes over the query set pooled for the latency percentiles")
    ap.add_argument("--checkpoint-every", type=int, default=None,
                    help="checkpoint every this many epochs, before measuring (default: --measure-every; 0: never, "
                         "so the write-ahead log grows)")
    ap.add_argument("--memory-budget", default=None, help="build memory budget (bytes, '512MB' or a fraction)")
    ap.add_argument("--build-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="extra nearline.build option (e.g. posting_limit=64), repeatable")
    ap.add_argument("--drain", action="store_true",
                    help="call maintain() after every epoch's updates (timed): measure the index with its "
                         "background work done, not mid-backlog")
    ap.add_argument("--keep-indexes", action="store_true", help="keep the index directories after each run")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--run-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--build-worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.build_worker:
        return args
    if not args.workdir:
        ap.error("--workdir is required")
    if args.n <= 0 or args.dim <= 0 or args.epochs < 0 or not 0 < args.rate < 1 or args.measure_every <= 0:
        ap.error("need --n > 0, --dim > 0, --epochs >= 0, 0 < --rate < 1, --measure-every > 0")
    if args.queries < 2 or args.k <= 0 or args.batch <= 0 or args.latency_repeats <= 0:
        ap.error("need --queries >= 2, --k > 0, --batch > 0, --latency-repeats > 0")
    if args.clusters is None:
        args.clusters = default_clusters(args.n + args.epochs * per_epoch(args))
    args.system_list = [s.strip() for s in args.systems.split(",") if s.strip()]
    args.dist_list = [d.strip() for d in args.dists.split(",") if d.strip()]
    for s in args.system_list:
        if s not in SYSTEMS:
            ap.error(f"unknown system {s!r}: expected {', '.join(SYSTEMS)}")
    for d in args.dist_list:
        if d not in DISTS:
            ap.error(f"unknown distribution {d!r}: expected {', '.join(DISTS)}")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.build_worker:
        build_worker(args.build_worker)
        return 0
    if args.worker:
        worker(args)
        return 0
    import nearline

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if args.out else workdir / "updates.json"
    t_all = time.perf_counter()
    for dist in args.dist_list:
        make_data(args, dist)
    runs: List[Dict[str, Any]] = []
    raw_argv = list(sys.argv[1:] if argv is None else argv)
    for i, dist in enumerate(args.dist_list):
        # alternate the order so neither system always runs first
        systems = args.system_list if i % 2 == 0 else list(reversed(args.system_list))
        for system in systems:
            run_out = workdir / "runs" / f"{dist}-{system.replace('+', 'plus')}.json"
            run_out.parent.mkdir(parents=True, exist_ok=True)
            run_out.unlink(missing_ok=True)
            cmd = [sys.executable, os.path.abspath(__file__), *raw_argv, "--worker", f"{dist},{system}",
                   "--run-out", str(run_out)]
            t0 = time.perf_counter()
            rc = subprocess.run(cmd).returncode
            r = json.loads(run_out.read_text()) if run_out.exists() else {
                "dist": dist, "system": system, "points": [], "epochs": [], "errors": []}
            r["returncode"] = rc
            r["wall_seconds"] = time.perf_counter() - t0
            if rc != 0:
                r.setdefault("errors", []).append(f"worker exited with status {rc}")
            runs.append(r)
    summary = summarise(runs)
    params = {k: v for k, v in vars(args).items() if k not in ("worker", "run_out", "build_worker")}
    params.update({"per_epoch": per_epoch(args), "pool_size": args.n + args.epochs * per_epoch(args),
                   "queries_from": QUERY_MIX, "build_options": build_opts(args),
                   "latency": "stats['total_us'] of the query set on 1 thread; QPS on --threads",
                   "maintain": ("after every epoch (maintain_seconds per epoch)" if args.drain else
                                "never called: measured as the background worker leaves the index")})
    result = {
        "benchmark": "updates (SPFresh workload A)",
        "params": params,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "nearline": nearline.__version__},
        "runs": runs,
        "summary": summary,
        "seconds": time.perf_counter() - t_all,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=float))
    if args.plot:
        for p in plot(runs, args.plot):
            log(f"wrote {p}")
    print(table(runs, summary))
    print(f"\nwrote {out} ({result['seconds']:.0f} s)")
    return 0 if all(r.get("returncode") == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
