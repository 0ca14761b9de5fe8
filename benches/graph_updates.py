"""The evaluation paper's update experiment on nearline's graph index, at this machine's scale.

Its setup (seed 002, §5 update mechanism): an index built on 80% of the set, then 20% of
operations with inserts : deletes = 9 : 1, applied while searches run; here one update thread
and one search thread, in one process (both release the GIL in the engine).

For each of ``--strategies`` (``out_of_place``: FreshDiskANN's delta, delete set and merge;
``in_place``: OdinANN's insert and IP-DiskANN's delete rewriting the disk graph's records):

* recall@k at L before the updates, during them (the live set at the moment of each measure),
  and after (every update applied, the last merge done), against the exact k nearest
  neighbours of the live set (NumPy);
* the search thread's QPS over time (one-second windows) while updates run, and its mean;
* insert and delete latency per call (one vector per insert, one id per delete): mean, P99, max;
* the merges: how many, seconds each (read, graph edit, write), from ``info()["updates"]``;
* ``within_budget`` sampled every second.

``--update-rates`` runs the experiment at each given rate (updates a second, paced; 0: each update as
soon as the last returned) for every strategy, from one build per strategy: a query-heavy workload
is a low rate.

With ``--merge-check`` (default on) it also measures the merge-time bar of the issue: an index
built on 90% of the set takes 10% inserts and deletes of 10% of its vectors, then one merge
(``checkpoint()``), timed against a fresh build of the resulting live set with the same threads.

With ``--churn C`` (default 0: off) it runs C cycles on an index built on the whole set: each
deletes ``--churn-rate`` (5%) of the vectors, inserts the same vectors again under the same ids,
and merges; the live set is then the built set again, so the index as built is a fresh build of
it. Per cycle: recall@k at L, mean reads per query, merge seconds, ``within_budget``. The churn
runs once per strategy of ``--strategies``; in place, a cycle's checkpoint writes no new graph.

Usage::

    .venv/bin/python benches/graph_updates.py --data wordnet:../shared/data/wordnet-minilm \\
        --memory-budget 0.2 --workdir /work/bench/gu --out gu.json --plot gu
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import nearline  # noqa: E402
from nearline.datasets import load_dataset  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_opts(args: argparse.Namespace, metric: str, strategy: str = "out_of_place") -> Dict[str, Any]:
    """The options of every build of this bench (the index's and the fresh builds it is compared with)."""
    opts: Dict[str, Any] = dict(preset=args.preset, memory_budget=args.memory_budget, threads=args.threads,
                                metric=metric, update=strategy)
    if args.write_ratio is not None:
        opts["write_ratio"] = args.write_ratio
    return opts


def exact_knn(base: np.ndarray, live: np.ndarray, queries: np.ndarray, k: int, metric: str) -> np.ndarray:
    """Ids (rows of ``base``) of the k nearest live rows of each query, in chunks."""
    b = base[live].astype(np.float32)
    out = np.empty((len(queries), k), np.int64)
    if metric == "l2":
        bn = (b * b).sum(1)
    for s in range(0, len(queries), 256):
        q = queries[s:s + 256].astype(np.float32)
        if metric == "l2":
            d = bn[None, :] - 2 * q @ b.T
        else:
            d = -(q @ b.T)
        part = np.argpartition(d, k, axis=1)[:, :k]
        order = np.take_along_axis(d, part, 1).argsort(1)
        out[s:s + 256] = live[np.take_along_axis(part, order, 1)]
    return out


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    k = truth.shape[1]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(found[:, :k].tolist(), truth.tolist())]))


def pct(a: List[float], q: float) -> float:
    return float(np.percentile(np.asarray(a), q)) if a else float("nan")


def experiment(ds: Any, args: argparse.Namespace, workdir: Path, strategy: str, rate: float = 0.0,
               built_cache: Optional[Dict[str, float]] = None) -> Dict[str, Any]:
    """One run of the paper's experiment; ``rate`` paces the updates (operations a second; 0: each
    as soon as the last returned). ``built_cache`` keeps one build per strategy across rates (the
    build is copied, not redone)."""
    base, queries, metric = ds.base, ds.queries[: args.queries], ds.metric
    n = len(base)
    rng = np.random.default_rng(args.seed)
    perm = rng.permutation(n)
    n0 = int(n * 0.8)
    built, held = perm[:n0], perm[n0:]
    ops = int(n * args.ops)
    n_ins = min(len(held), ops * 9 // 10)
    n_del = ops - n_ins
    dels = rng.choice(built, size=n_del, replace=False)
    path = workdir / f"paper-{strategy}-rate{rate:g}.index"
    shutil.rmtree(path, ignore_errors=True)
    pristine = workdir / f"paper-{strategy}-built.index"
    built_cache = {} if built_cache is None else built_cache
    if strategy not in built_cache:
        shutil.rmtree(pristine, ignore_errors=True)
        log(f"{strategy}: build on {n0} of {n} vectors")
        t0 = time.perf_counter()
        opts = build_opts(args, metric, strategy)
        nearline.build(base[built], pristine, ids=built.astype(np.int64), **opts).close()
        built_cache[strategy] = time.perf_counter() - t0
    build_s = built_cache[strategy]
    shutil.copytree(pristine, path)
    idx = nearline.open(path, threads=args.threads, memory_budget=args.memory_budget)
    live = np.zeros(n, bool)
    live[built] = True

    def search_all() -> np.ndarray:
        ids, _ = idx.search(queries, k=args.k, L=args.L, threads=args.threads)
        return ids

    before = recall(search_all(), exact_knn(base, np.flatnonzero(live), queries, args.k, metric))
    log(f"{strategy}: recall@{args.k} before updates {before:.4f}")

    # The update stream: 9 inserts to 1 delete, interleaved.
    stream: List[tuple] = []
    di = 0
    for i, row in enumerate(held[:n_ins]):
        stream.append(("i", int(row)))
        if (i + 1) % 9 == 0 and di < n_del:
            stream.append(("d", int(dels[di])))
            di += 1
    stream.extend(("d", int(x)) for x in dels[di:])
    ins_lat: List[float] = []
    del_lat: List[float] = []
    done = threading.Event()
    windows: List[Dict[str, float]] = []
    budget_ok = [True]
    errors: List[str] = []
    during_recalls: List[Dict[str, float]] = []
    measure_at = {len(stream) // 2}

    def updater() -> None:
        try:
            t_start = time.perf_counter()
            for j, (op, x) in enumerate(stream):
                if rate > 0:
                    wait = t_start + j / rate - time.perf_counter()
                    if wait > 0:
                        time.sleep(wait)
                t = time.perf_counter()
                if op == "i":
                    idx.insert(base[x:x + 1], ids=[x])
                    ins_lat.append(time.perf_counter() - t)
                    live[x] = True
                else:
                    idx.delete([x])
                    del_lat.append(time.perf_counter() - t)
                    live[x] = False
                if j in measure_at:
                    snap = np.flatnonzero(live)
                    r = recall(search_all(), exact_knn(base, snap, queries, args.k, metric))
                    during_recalls.append({"op": j, "recall": r})
        except Exception as e:  # reported in the result
            errors.append(repr(e))
        finally:
            done.set()

    def searcher() -> None:
        q1 = queries[: args.batch]
        start = time.perf_counter()
        while not done.is_set():
            w0, cnt = time.perf_counter(), 0
            while time.perf_counter() - w0 < 1.0 and not done.is_set():
                idx.search(q1, k=args.k, L=args.L, threads=1)
                cnt += len(q1)
            dt = time.perf_counter() - w0
            windows.append({"t": w0 - start, "qps": cnt / dt if dt > 0 else 0.0})
            if not idx.info()["memory"]["within_budget"]:
                budget_ok[0] = False

    t0 = time.perf_counter()
    th = [threading.Thread(target=updater), threading.Thread(target=searcher)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    update_s = time.perf_counter() - t0
    info = idx.info()
    merges_during = info["updates"]["since_open"]["merges"]
    last_merge_during = info["updates"]["since_open"]["last_merge"]
    t1 = time.perf_counter()
    idx.checkpoint()
    final_merge_s = time.perf_counter() - t1
    last = idx.info()["updates"]["since_open"]["last_merge"]
    after = recall(search_all(), exact_knn(base, np.flatnonzero(live), queries, args.k, metric))
    ok = sorted(idx.ids().tolist()) == np.flatnonzero(live).tolist()
    problems = idx.check()["problems"]
    idx.close()
    qps = [w["qps"] for w in windows]
    res = {
        "strategy": strategy, "update_rate": rate, "n": n, "built": n0, "inserts": n_ins, "deletes": n_del,
        "memory_budget": args.memory_budget, "write_ratio": args.write_ratio, "preset": args.preset,
        "L": args.L, "k": args.k,
        "build_seconds": build_s, "update_seconds": update_s,
        "recall_before": before, "recall_during": during_recalls, "recall_after": after,
        "search_qps_windows": windows, "search_qps_mean": float(np.mean(qps)) if qps else 0.0,
        "insert_latency_ms": {"mean": 1e3 * float(np.mean(ins_lat)), "p99": 1e3 * pct(ins_lat, 99),
                              "max": 1e3 * max(ins_lat, default=0.0)},
        "delete_latency_ms": {"mean": 1e3 * float(np.mean(del_lat)) if del_lat else None,
                              "p99": 1e3 * pct(del_lat, 99), "max": 1e3 * max(del_lat, default=0.0)},
        "merges_during": merges_during, "last_merge_during": last_merge_during,
        "final_merge_seconds": final_merge_s, "final_merge": last,
        "within_budget_always": budget_ok[0], "live_ids_match": ok, "check_problems": problems,
        "errors": errors,
    }
    log(f"{strategy} at {rate:g} updates/s (0: unpaced): recall before {before:.4f} during {[round(d['recall'], 4) for d in during_recalls]} "
        f"after {after:.4f}; search QPS mean {res['search_qps_mean']:.0f} under updates; insert "
        f"mean {res['insert_latency_ms']['mean']:.2f} ms p99 {res['insert_latency_ms']['p99']:.2f} ms; "
        f"merges during {merges_during}; final merge {final_merge_s:.1f} s; within budget {budget_ok[0]}")
    return res


def merge_check(ds: Any, args: argparse.Namespace, workdir: Path) -> Dict[str, Any]:
    """Build on 90%, insert the other 10%, delete 10% of the built, merge: merge seconds vs a
    fresh build of the live set (same threads)."""
    base, metric = ds.base, ds.metric
    n = len(base)
    rng = np.random.default_rng(args.seed + 1)
    perm = rng.permutation(n)
    n0 = int(n * 0.9)
    built, held = perm[:n0], perm[n0:]
    dels = rng.choice(built, size=n // 10, replace=False)
    opts = build_opts(args, metric)
    path = workdir / "merge.index"
    shutil.rmtree(path, ignore_errors=True)
    nearline.build(base[built], path, ids=built.astype(np.int64), **opts).close()
    # A budget that holds the whole delta, so that the one merge timed is the checkpoint's (no
    # background merge: one started by the inserts would overlap them and the timer).
    with nearline.open(path, threads=args.threads, memory_budget=args.merge_open_budget,
                       background_updates=False) as idx:
        t = time.perf_counter()
        idx.insert(base[held], ids=held.astype(np.int64))
        ins_s = time.perf_counter() - t
        idx.delete(dels.astype(np.int64))
        upd = idx.info()["updates"]
        merges_before = upd["since_open"]["merges"]
        if merges_before:
            raise SystemExit(f"merge check: the delta ({len(held)} inserts) passed its share "
                             f"({upd['delta_share']} bytes) and merged before the checkpoint; "
                             f"raise --merge-open-budget")
        t = time.perf_counter()
        idx.checkpoint()
        merge_s = time.perf_counter() - t
        rep = idx.info()["updates"]["since_open"]["last_merge"]
    live = np.ones(n, bool)
    live[dels] = False
    live_ids = np.flatnonzero(live)
    fresh = workdir / "merge-fresh.index"
    shutil.rmtree(fresh, ignore_errors=True)
    t = time.perf_counter()
    nearline.build(base[live_ids], fresh, ids=live_ids.astype(np.int64), **opts).close()
    fresh_s = time.perf_counter() - t
    q = ds.queries[: args.queries]
    truth = exact_knn(base, live_ids, q, args.k, metric)
    with nearline.open(path, threads=args.threads, memory_budget=args.memory_budget) as a, \
            nearline.open(fresh, threads=args.threads, memory_budget=args.memory_budget) as b:
        ra = recall(a.search(q, k=args.k, L=args.L)[0], truth)
        rb = recall(b.search(q, k=args.k, L=args.L)[0], truth)
    res = {"n": n, "built": n0, "inserted": len(held), "deleted": len(dels), "insert_seconds": ins_s,
           "merges_before_checkpoint": merges_before, "merge_seconds": merge_s, "merge": rep,
           "fresh_build_seconds": fresh_s, "ratio": merge_s / fresh_s,
           "recall_merged": ra, "recall_fresh": rb, "threads": args.threads}
    log(f"merge check: merge {merge_s:.1f} s vs fresh build {fresh_s:.1f} s = {merge_s / fresh_s:.2f}x; "
        f"recall@{args.k} at L {args.L}: merged {ra:.4f}, fresh {rb:.4f}")
    return res


def churn(ds: Any, args: argparse.Namespace, workdir: Path, strategy: str = "out_of_place",
          save: Any = lambda partial: None) -> Dict[str, Any]:
    """Delete ``churn_rate`` of the set and re-insert it, merge; ``args.churn`` times. ``save``
    gets the result so far after every cycle."""
    base, metric = ds.base, ds.metric
    n = len(base)
    q = ds.queries[: args.queries]
    path = workdir / f"churn-{strategy}.index"
    shutil.rmtree(path, ignore_errors=True)
    opts = build_opts(args, metric, strategy)
    t = time.perf_counter()
    nearline.build(base, path, ids=np.arange(n, dtype=np.int64), **opts).close()
    build_s = time.perf_counter() - t
    truth = exact_knn(base, np.arange(n), q, args.k, metric)
    rng = np.random.default_rng(args.seed + 2)
    cycles = []
    open_budget = args.churn_open_budget or args.memory_budget
    with nearline.open(path, threads=args.threads, memory_budget=open_budget) as idx:
        def point(c: int, merge_s: float) -> Dict[str, Any]:
            ids, _, st = idx.search(q, k=args.k, L=args.L, return_stats=True)
            info = idx.info()
            p = {"cycle": c, "recall": recall(ids, truth), "mean_reads": float(np.mean(st["reads"])),
                 "merge_seconds": merge_s, "within_budget": bool(info["memory"]["within_budget"]),
                 "memory_total": info["memory"]["total"], "n": info["n"]}
            log(f"churn cycle {c}: recall {p['recall']:.4f}, reads {p['mean_reads']:.1f}, merge {merge_s:.1f} s, "
                f"within budget {p['within_budget']}")
            return p
        cycles.append(point(0, 0.0))
        for c in range(1, args.churn + 1):
            gone = np.sort(rng.choice(n, size=int(n * args.churn_rate), replace=False))
            idx.delete(gone)
            idx.insert(base[gone], ids=gone)
            t = time.perf_counter()
            idx.checkpoint()
            cycles.append(point(c, time.perf_counter() - t))
            save({"cycles": cycles, "build_seconds": build_s, "rate": args.churn_rate, "L": args.L,
                  "open_budget": open_budget, "partial": True})
    first = cycles[0]
    worst_recall = min(x["recall"] for x in cycles[1:]) if len(cycles) > 1 else first["recall"]
    worst_reads = max(x["mean_reads"] for x in cycles[1:]) if len(cycles) > 1 else first["mean_reads"]
    return {"strategy": strategy, "cycles": cycles, "build_seconds": build_s, "rate": args.churn_rate,
            "L": args.L, "open_budget": open_budget,
            "recall_fresh": first["recall"], "reads_fresh": first["mean_reads"],
            "worst_recall_drop_points": 100 * (first["recall"] - worst_recall),
            "worst_reads_ratio": worst_reads / first["mean_reads"] if first["mean_reads"] > 0 else None,
            "within_budget_always": all(x["within_budget"] for x in cycles)}


def plot(result: Dict[str, Any], prefix: str) -> List[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    out = []
    if result.get("experiments"):
        out.extend(plot_qps(result, prefix, plt))
    for ch in result.get("churns", [result["churn"]] if result.get("churn") else []):
        out.extend(plot_churn(ch, f"{prefix}-{ch.get('strategy', 'out_of_place')}", plt))
    return out


def plot_qps(result: Dict[str, Any], prefix: str, plt: Any) -> List[str]:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for r in result["experiments"]:
        w = r["search_qps_windows"]
        paced = f" at {r['update_rate']:g} updates/s" if r.get("update_rate") else ""
        ax.plot([x["t"] for x in w], [x["qps"] for x in w], label=r["strategy"] + paced)
    ax.set_xlabel("seconds since updates began")
    ax.set_ylabel("search QPS (1 thread)")
    ax.set_title(f"{result['data']}: search under updates (budget {result['memory_budget']})")
    ax.legend()
    fig.tight_layout()
    p = f"{prefix}-qps.png"
    fig.savefig(p, dpi=120)
    return [p]


def plot_churn(ch: Dict[str, Any], prefix: str, plt: Any) -> List[str]:
    out = []
    for key, label in (("recall", f"recall@10 at L {ch['L']}"), ("mean_reads", "mean reads per query")):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        xs = [c["cycle"] for c in ch["cycles"]]
        ax.plot(xs, [c[key] for c in ch["cycles"]], marker="o", label="after each merge")
        ax.axhline(ch["cycles"][0][key], color="grey", linestyle="--", label="fresh build (cycle 0)")
        ax.set_xlabel(f"churn cycle (delete and re-insert {100 * ch['rate']:.0f}%)")
        ax.set_ylabel(label)
        ax.legend()
        fig.tight_layout()
        p = f"{prefix}-churn-{key}.png"
        fig.savefig(p, dpi=120)
        out.append(p)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="dataset spec, as nearline bench takes it")
    ap.add_argument("--preset", default="diskann")
    ap.add_argument("--strategies", default="out_of_place")
    ap.add_argument("--memory-budget", default="0.2")
    ap.add_argument("--write-ratio", type=float, default=None,
                    help="the build's workload hint write_ratio (keeps a share of the budget for the delta)")
    ap.add_argument("--merge-open-budget", default="1.0",
                    help="the merge check's open budget (room for the whole delta)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ops", type=float, default=0.2, help="operations, as a fraction of the set")
    ap.add_argument("--update-rates", default="0",
                    help="comma list of update rates (operations a second) the experiment runs at, each "
                    "for every strategy; 0: each update as soon as the last returned")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=100, help="queries per search call of the search thread")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--L", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--merge-check", default=True, action=argparse.BooleanOptionalAction)
    ap.add_argument("--paper", default=True, action=argparse.BooleanOptionalAction,
                    help="run the paper's experiment (updates beside searches)")
    ap.add_argument("--churn", type=int, default=0, help="churn cycles (0: none)")
    ap.add_argument("--churn-rate", type=float, default=0.05)
    ap.add_argument("--churn-open-budget", default=None,
                    help="the churn index's open budget (default --memory-budget): the build's PQ codes "
                    "fill the build budget, so a larger open budget leaves the delta room")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args(argv)
    for s in args.strategies.split(","):
        if s not in ("out_of_place", "in_place"):
            ap.error(f"strategy {s!r}: expected out_of_place or in_place")
    try:
        rates = [float(x) for x in args.update_rates.split(",")]
    except ValueError:
        ap.error(f"--update-rates {args.update_rates!r}: expected numbers separated by commas")
    if any(r < 0 for r in rates):
        ap.error("--update-rates: a rate is at least 0")
    args.memory_budget = float(args.memory_budget) if "." in args.memory_budget else args.memory_budget
    args.merge_open_budget = (float(args.merge_open_budget) if "." in args.merge_open_budget
                              else args.merge_open_budget)
    if args.churn_open_budget is not None and "." in args.churn_open_budget:
        args.churn_open_budget = float(args.churn_open_budget)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ds = load_dataset(args.data, workdir)
    result: Dict[str, Any] = {"data": ds.name, "n": len(ds.base), "dim": ds.base.shape[1],
                              "memory_budget": args.memory_budget, "write_ratio": args.write_ratio,
                              "preset": args.preset,
                              "threads": args.threads, "experiments": []}
    built_cache: Dict[str, float] = {}
    for rate in rates if args.paper else []:
        for s in args.strategies.split(","):
            result["experiments"].append(experiment(ds, args, workdir, s, rate, built_cache))
            Path(args.out).write_text(json.dumps(result, indent=1))
    if args.merge_check:
        result["merge_check"] = merge_check(ds, args, workdir)
        Path(args.out).write_text(json.dumps(result, indent=1))
    if args.churn:
        result["churns"] = []
        for s in args.strategies.split(","):
            def save(partial: Dict[str, Any]) -> None:
                Path(args.out).write_text(json.dumps({**result, "churn_partial": partial}, indent=1))
            result["churns"].append(churn(ds, args, workdir, s, save))
            Path(args.out).write_text(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1))
    if args.plot:
        result["plots"] = plot(result, args.plot)
        Path(args.out).write_text(json.dumps(result, indent=1))
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
