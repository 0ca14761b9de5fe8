"""``nearline segments``: build, search and describe a collection of segments served on Ray
(:mod:`nearline.distributed`). ``register(sub)`` adds the command to the ``nearline`` parser.

Ray is imported only when a ``segments`` action runs: without it the action exits 2 with a line
saying how to install it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict

import numpy as np

from nearline.cli_types import _budget, _positive_float, _positive_int

EXIT_ERROR = 2
#: ``segments search --allow-partial`` exits with this when some segment did not answer.
EXIT_PARTIAL = 1


def register(sub: Any) -> None:
    """Adds ``nearline segments build|search|info`` to the subparsers ``sub`` of the ``nearline`` parser."""
    p = sub.add_parser("segments", help="a collection split into segments served by Ray actors (nearline.distributed): "
                                        "build, search, info; needs Ray (pip install 'nearline[distributed]')")
    actions = p.add_subparsers(dest="segments_action", metavar="ACTION", required=True)
    fmt = getattr(p, "formatter_class", argparse.HelpFormatter)

    def action(name: str, help: str) -> argparse.ArgumentParser:
        a = actions.add_parser(name, help=help, formatter_class=fmt)
        try:  # --debug/-v/-q after the action too, as after every other command
            from nearline.cli import _global_flags

            _global_flags(a, top=False)
        except ImportError:  # pragma: no cover - register() used outside the nearline CLI
            pass
        a.add_argument("--address", default=None,
                       help="Ray cluster to join (default: $RAY_ADDRESS, else a local one started for the command)")
        a.add_argument("--timeout", type=_positive_float, default=60.0,
                       help="seconds to wait for segments that are starting or restarting")
        return a

    b = action("build", "build a collection: route the vectors to segments, build each segment as a Ray task")
    b.add_argument("data", help="vector file (.fbin/.u8bin/.i8bin/.f16bin/.bin/.fvecs/.bvecs/.npy)")
    b.add_argument("out", help="collection directory")
    b.add_argument("--segments", type=_positive_int, default=4, help="number of segments")
    b.add_argument("--routing", choices=("auto", "hash", "kmeans"), default="auto",
                   help="hash (scatter-gather over every segment), kmeans (a query visits its nearest segments) or "
                   "auto (hash below 9 segments or for ip, else kmeans)")
    b.add_argument("--ids", default=None, metavar="IDS_FILE",
                   help="external ids, one per row: .npy, .txt, .csv or .bin (default: row numbers)")
    b.add_argument("--dtype", default=None, help="element type of a bare .bin file (default float32)")
    _build_options(b)
    if "--overwrite" not in b._option_string_actions:
        b.add_argument("--overwrite", action="store_true", help="replace an existing collection at OUT")
    b.set_defaults(func=cmd_segments_build)

    s = action("search", "search a collection (read-only, beside its writer); recall and QPS with --gt")
    s.add_argument("collection", help="collection directory")
    s.add_argument("queries", help="query vector file")
    s.add_argument("--k", type=_positive_int, default=10, help="neighbours per query")
    s.add_argument("--L", type=_positive_int, default=None, help="each segment's search list size "
                   "(default: the segments' own, max(k, 100) or the preset's)")
    s.add_argument("--W", type=_positive_int, default=None, help="beam/pipeline width (default: the preset's)")
    s.add_argument("--nprobe", type=_positive_int, default=None,
                   help="partition-index segments: postings read per query (default 32)")
    s.add_argument("--nprobe-segments", type=_positive_int, default=None,
                   help="k-means routing: segments each query visits (default: the collection's, calibrated at build)")
    s.add_argument("--threads", type=_positive_int, default=None, help="search threads per segment (default: all cores)")
    s.add_argument("--memory-budget", type=_budget, default=None,
                   help="the collection's memory budget, split across segments (default: each segment's own)")
    s.add_argument("--gt", default=None, help="ground-truth file: recall@k is reported (default: none)")
    s.add_argument("--allow-partial", action="store_true",
                   help="when a segment does not answer, print what the others found and name it (exit status 1) "
                   "instead of failing")
    s.add_argument("--out", default=None, help="write ids and distances to OUT.npz or OUT.json (default: none)")
    s.add_argument("--json", action="store_true", help="print the summary as JSON")
    s.set_defaults(func=cmd_segments_search)

    i = action("info", "describe a collection: routing, segments, memory budget (opens it read-only)")
    i.add_argument("collection", help="collection directory")
    i.add_argument("--json", action="store_true", help="print the info as JSON")
    i.set_defaults(func=cmd_segments_info)


def _build_options(p: argparse.ArgumentParser) -> None:
    """The build options of ``nearline build`` (the same flags, for every segment)."""
    try:
        from nearline.cli import _add_build_options
    except ImportError:  # pragma: no cover - register() used outside the nearline CLI
        p.add_argument("--preset", default=None, help="preset (default auto)")
        p.add_argument("--memory-budget", type=_budget, default=None, help="memory budget (default: the engine's)")
        return
    _add_build_options(p)


def _nd() -> Any:
    import nearline.distributed as nd

    return nd


def _fail(e: BaseException) -> int:
    print(f"nearline: error: {' '.join(str(e).split()) or type(e).__name__}", file=sys.stderr)
    return EXIT_ERROR


def _errors() -> tuple:
    errs = [ImportError]
    try:
        nd = _nd()
        errs += [nd.PartialResultError, nd.WriteError, nd.SegmentOpenError, TimeoutError]
    except ImportError:
        pass
    return tuple(errs)


def _guard(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except _errors() as e:
            if getattr(args, "debug", False):
                raise
            return _fail(e)

    run.__doc__ = fn.__doc__
    return run


#: Build flags this command handles itself (the rest go to every segment's build).
_OWN = ("overwrite", "ids", "dtype", "progress")


def _given_build_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The build options given on the command line, as ``nearline build`` collects them."""
    try:
        from nearline.cli import _build_options as given
    except ImportError:  # pragma: no cover
        opts = {k: getattr(args, k, None) for k in ("preset", "memory_budget")}
    else:
        opts = dict(given(args))
    return {k: v for k, v in opts.items() if v is not None and k not in _OWN}


@_guard
def cmd_segments_build(args: argparse.Namespace) -> int:
    """``nearline segments build DATA OUT``."""
    nd = _nd()
    ids = None
    if args.ids:
        from nearline.cli import _read_ids

        ids = _read_ids(args.ids)
    t0 = time.perf_counter()
    coll = nd.build(args.data, args.out, segments=args.segments, routing=args.routing, ids=ids,
                    overwrite=bool(getattr(args, "overwrite", False)), dtype=args.dtype, progress=not args.quiet, address=args.address,
                    timeout=args.timeout, **_given_build_options(args))
    elapsed = time.perf_counter() - t0
    with coll:
        info = coll.info()
    r = info["routing"]
    print(f"built {args.out}: {len(info['segments'])} segments, n={info['n']} dim={info['dim']} "
          f"metric={info['metric']} routing={r['kind']} ({r['reason']}) in {elapsed:.1f} s")
    if r["kind"] == "kmeans":
        print(f"nprobe_segments={r['nprobe_segments']} ({r['calibration']['rule']})")
    print(f"memory budget {info['memory']['budget']} bytes in all ({info['memory']['rule']})")
    for d in info["segments"]:
        print(f"  {d['name']}: n={d.get('n')} preset={(d.get('index') or {}).get('preset')} "
              f"memory_budget={d.get('memory_budget')}")
    return 0


@_guard
def cmd_segments_search(args: argparse.Namespace) -> int:
    """``nearline segments search COLLECTION QUERIES``."""
    import nearline

    nd = _nd()
    queries = nearline.read_vectors(args.queries)
    opts = {k: v for k, v in (("threads", args.threads),) if v is not None}
    search_opts = {k: v for k, v in (("W", args.W), ("nprobe", args.nprobe)) if v is not None}
    with nd.open(args.collection, memory_budget=args.memory_budget, nprobe_segments=args.nprobe_segments,
                 timeout=args.timeout, address=args.address, read_only=True, **opts) as coll:
        t0 = time.perf_counter()
        res = coll.search(queries, args.k, L=args.L, allow_partial=args.allow_partial, **search_opts)
        wall = time.perf_counter() - t0
        segments, nprobe = coll.segments, coll.nprobe_segments if args.nprobe_segments is None else args.nprobe_segments
    ids, dists = res[0], res[1]
    missing = list(res[2]) if args.allow_partial else []
    nq = len(ids)
    summary: Dict[str, Any] = {"nq": nq, "k": args.k, "L": args.L, "segments": segments,
                               "segments_per_query": nprobe, "seconds": wall,
                               "qps": nq / wall if wall > 0 else None, "missing_segments": missing}
    if args.gt:
        from nearline.datasets import recall_at_k

        gt, _ = nearline.read_ground_truth(args.gt)
        summary[f"recall@{args.k}"] = recall_at_k(np.asarray(ids), np.asarray(gt), args.k)
    if args.out:
        out = Path(args.out)
        if out.suffix.lower() == ".npz":
            np.savez(out, ids=ids, distances=dists)
        else:
            out.write_text(json.dumps({"summary": summary, "ids": np.asarray(ids).tolist(),
                                       "distances": np.asarray(dists).tolist()}))
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        rows = [("queries", str(nq)), ("segments visited per query", f"{nprobe} of {segments}")]
        if args.gt:
            rows.append((f"recall@{args.k}", f"{summary[f'recall@{args.k}']:.4f}"))
        rows.append(("QPS", f"{summary['qps']:.0f}" if summary["qps"] else "-"))
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            print(f"{k:<{width}}  {v}")
    if missing:
        print(f"nearline: warning: partial result: segment(s) {missing} did not answer; their vectors are "
              "missing from these results", file=sys.stderr)
        return EXIT_PARTIAL
    return 0


@_guard
def cmd_segments_info(args: argparse.Namespace) -> int:
    """``nearline segments info COLLECTION``."""
    nd = _nd()
    with nd.open(args.collection, timeout=args.timeout, address=args.address, read_only=True) as coll:
        info = coll.info()
    if args.json:
        from nearline.peers import jsonable

        print(json.dumps(jsonable(info), indent=1))
        return 0
    r, m = info["routing"], info["memory"]
    rows = [("path", info["path"]), ("vectors", str(info["n"])), ("dim", str(info["dim"])),
            ("metric", info["metric"]), ("routing", f"{r['kind']}: {r['reason']}"),
            ("segments per query", f"{r['nprobe_segments']} of {len(info['segments'])}"),
            ("memory budget", f"{m['budget']} bytes ({m['rule']}); held {m['total']}; "
                              f"within budget: {m['within_budget']}")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    for d in info["segments"]:
        if d["available"]:
            print(f"  {d['name']}: n={d['n']} preset={d['index'].get('preset')} memory_budget={d['memory_budget']} "
                  f"within_budget={d['within_budget']} pid={d['pid']} host={d['host']}")
        else:
            print(f"  {d['name']}: unavailable: {d.get('error')}")
    return 0
