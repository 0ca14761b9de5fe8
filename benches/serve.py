"""What serving over HTTP costs: the same index searched in-process and through
``nearline serve`` + ``nearline.Client``, each side in its own process, alternating, medians.

Modes, each with the same calls on both sides:

- ``batch``: the query set in batches of ``--batch`` queries, one caller (throughput).
- ``cN`` (for each N of ``--clients``): a closed-loop load generator, N concurrent callers
  each sending one query a call (an online service); QPS and each call's latency (p50, p99).

The in-process side runs the same callers as threads calling ``Index.search`` on one open
index; the served side runs them as client threads, one kept-alive connection each, against
a server holding the same index with the same search threads. Every answer of the served
side must equal the in-process one (ids, bit for bit), so a figure never compares different
work. ``--target-recall`` picks the first L of ``--L`` whose recall@k reaches it.

``--generator`` picks the served side's callers: ``client`` (``nearline.Client`` in one
thread a caller, what a Python user gets) or ``raw`` (a minimal event-driven HTTP/1.1
generator, as wrk-style tools are: one thread drives every caller's kept-alive connection
with a selector, one request outstanding on each, the request bytes built before the clock
starts and the replies' ids decoded after it stops), which measures the server rather than
a Python client; ``both`` runs each. The batch mode always uses the client.

    python benches/serve.py --index IDX --queries Q.fbin --gt GT.bin --L 20,30,50,100 \\
        --target-recall 0.95 --clients 1,2,4,8,16,32,64 --reps 3 --out serve.json --plot serve.png
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import nearline
from nearline.client import Client


def _calls(queries: np.ndarray, mode: str, batch: int):
    """The list of query blocks each caller sends, in order."""
    if mode == "batch":
        return [[queries[i:i + batch] for i in range(0, len(queries), batch)]]
    clients = int(mode[1:])
    rows = [queries[i:i + 1] for i in range(len(queries))]
    return [rows[c::clients] for c in range(clients)]


def run_calls(search, plan, k: int, L: int):
    """Runs each caller's blocks in its own thread: (seconds, ids per caller, call latencies in ms)."""
    out = [[] for _ in plan]
    lat = [[] for _ in plan]

    def caller(c):
        for block in plan[c]:
            t = time.perf_counter()
            ids = search(block, k=k, L=L)[0]
            lat[c].append((time.perf_counter() - t) * 1e3)
            out[c].append(ids)

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(len(plan))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, out, [x for c in lat for x in c]


def measure(search, q: np.ndarray, args, only=None) -> dict:
    res = {}
    for mode in (args.modes if only is None else only):
        plan = _calls(q, mode, args.batch)
        run = search.run if hasattr(search, "run") else (lambda p, k, L: run_calls(search, p, k, L))
        run(plan, args.k, args.L)  # warm-up: caches, connections
        secs, out, lat = run(plan, args.k, args.L)
        if hasattr(search, "decode"):
            out = [[search.decode(x) for x in o] for o in out]
        res[mode] = {"qps": len(q) / secs, "ids": [np.concatenate(o).tolist() for o in out],
                     "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99))}
    return res


def child(args) -> None:
    """In-process side (run in a subprocess): prints one JSON line."""
    q = nearline.read_vectors(args.queries)[: args.nq]
    with nearline.open(args.index) as ix:
        res = measure(ix.search, q, args)
        mem = ix.info()["memory"]
        res["budget"], res["within_budget"] = mem["budget"], mem["within_budget"]
    print(json.dumps(res))


class RawSearch:
    """``search(block, k, L)`` over raw keep-alive sockets (one a thread): the request bytes of
    every query are built up front, so the timed loop only sends, reads and decodes the ids."""

    def __init__(self, url: str, collection: str, queries: np.ndarray, k: int, L: int) -> None:
        m = re.match(r"http://([^:/]+):(\d+)", url)
        if not m:
            raise ValueError(f"not an http URL: {url}")
        self.addr = (m.group(1), int(m.group(2)))
        self.local = threading.local()
        self.requests = {}
        for row in queries:
            body = json.dumps({"queries": {"dtype": "float32", "shape": [1, len(row)],
                                           "b64": base64.b64encode(row.astype("<f4").tobytes()).decode()},
                               "k": k, "L": L, "encoding": "b64"}).encode()
            head = (f"POST /v1/collections/{collection}/search HTTP/1.1\r\nHost: b\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
            self.requests[row.tobytes()] = head + body

    def _sock(self) -> Any:
        s = getattr(self.local, "sock", None)
        if s is None:
            s = socket.create_connection(self.addr)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.local.sock, self.local.buf = s, b""
        return s

    def __call__(self, block: np.ndarray, k: int, L: int) -> Any:
        s = self._sock()
        s.sendall(self.requests[block[0].tobytes()])
        buf = self.local.buf
        while (end := buf.find(b"\r\n\r\n")) < 0:
            buf += s.recv(65536)
        head = buf[:end]
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"the server answered {head[:60]!r}")
        at = head.find(b"content-length: ") + 16  # hyper writes header names in lower case
        if at < 16:
            raise RuntimeError(f"a reply without a Content-Length: {head[:200]!r}")
        stop = head.find(b"\r\n", at)
        length = int(head[at:stop if stop > 0 else len(head)])
        while len(buf) < end + 4 + length:
            buf += s.recv(65536)
        body, self.local.buf = buf[end + 4:end + 4 + length], buf[end + 4 + length:]
        return (body,)

    def run(self, plan, k: int, L: int):
        """Drives every caller's connection from this one thread (a selector loop, as event-driven
        load generators do: no thread switch or GIL hand-off a request): each connection has one
        request outstanding and sends its next when the reply is in. ``run_calls``' result."""
        conns = []
        for blocks in plan:
            sock = socket.create_connection(self.addr)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            conns.append({"sock": sock, "blocks": blocks, "next": 0, "buf": b"", "sent": 0.0,
                          "out": [], "lat": []})
        sel = selectors.DefaultSelector()

        def send(c):
            c["sent"] = time.perf_counter()
            c["sock"].sendall(self.requests[c["blocks"][c["next"]][0].tobytes()])

        t0 = time.perf_counter()
        active = 0
        for c in conns:
            if c["blocks"]:
                sel.register(c["sock"], selectors.EVENT_READ, c)
                send(c)
                active += 1
        while active:
            for key, _ in sel.select():
                c = key.data
                c["buf"] += c["sock"].recv(65536)
                buf = c["buf"]
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    continue
                if not buf.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(f"the server answered {buf[:60]!r}")
                at = buf.find(b"content-length: ", 0, end) + 16
                if at < 16:
                    raise RuntimeError(f"a reply without a Content-Length: {buf[:200]!r}")
                length = int(buf[at:buf.find(b"\r\n", at)])
                if len(buf) < end + 4 + length:
                    continue
                c["lat"].append((time.perf_counter() - c["sent"]) * 1e3)
                c["out"].append(buf[end + 4:end + 4 + length])
                c["buf"] = buf[end + 4 + length:]
                c["next"] += 1
                if c["next"] < len(c["blocks"]):
                    send(c)
                else:
                    sel.unregister(c["sock"])
                    active -= 1
        secs = time.perf_counter() - t0
        for c in conns:
            c["sock"].close()
        return secs, [c["out"] for c in conns], [x for c in conns for x in c["lat"]]

    @staticmethod
    def decode(body: bytes) -> np.ndarray:
        """The ids of a reply (after the clock stops: the generator only sends and reads)."""
        ids = json.loads(body)["ids"]
        return np.frombuffer(base64.b64decode(ids["b64"]), "<i8").reshape(ids["shape"])


def served(args, generator: str) -> dict:
    q = nearline.read_vectors(args.queries)[: args.nq]
    p = subprocess.Popen([sys.executable, "-m", "nearline", "serve", "--port", "0", f"b={args.index}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        m = re.search(r"on (http://\S+)", line)
        if not m:
            raise RuntimeError(f"the server did not start: {line!r} {p.stderr.read()}")
        client = Client(m.group(1), collection="b")
        if generator == "raw":
            # The batch mode sends batches: the client builds those; the one-query modes go raw.
            raw = RawSearch(m.group(1), "b", q, args.k, args.L)
            res = measure(client.search, q, args, only=["batch"])
            res.update(measure(raw, q, args, only=[m_ for m_ in args.modes if m_ != "batch"]))
        else:
            res = measure(client.search, q, args)
        mem = client.info()["memory"]
        res["budget"], res["within_budget"] = mem["budget"], mem["within_budget"]
        return res
    finally:
        p.terminate()
        p.wait(timeout=60)


def pick_L(args) -> int:
    """The first L of the grid whose recall@k reaches the target (the last one otherwise)."""
    if args.gt is None or len(args.Ls) == 1:
        return args.Ls[0]
    q = nearline.read_vectors(args.queries)[: args.nq]
    gt = nearline.read_ground_truth(args.gt)[0][: len(q)]
    with nearline.open(args.index) as ix:
        for L in args.Ls:
            if nearline.recall(ix.search(q, k=args.k, L=L)[0], gt, args.k) >= args.target_recall:
                return L
    return args.Ls[-1]


def plot(summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in summary["modes"] if m != "batch"]
    xs = [int(m[1:]) for m in modes]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    sides = ["in_process"] + [k[len("qps_"):] for k in summary["modes"][modes[0]]
                              if k.startswith("qps_served") and not k.startswith("qps_runs")]
    for side, mark in zip(sides, ("o-", "s-", "^-")):
        a.plot(xs, [summary["modes"][m][f"qps_{side}"] for m in modes], mark, label=side.replace("_", "-"))
        b.plot(xs, [summary["modes"][m][f"p50_ms_{side}"] for m in modes], mark, label=f"{side} p50")
        b.plot(xs, [summary["modes"][m][f"p99_ms_{side}"] for m in modes], mark.replace("-", "--"),
               label=f"{side} p99")
    for ax, ylab in ((a, "QPS"), (b, "latency per call (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent connections (one query a call)")
        ax.set_ylabel(ylab)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"nearline serve vs in-process, L {summary['L']}, recall@{summary['k']} "
                 f"{summary.get('recall', float('nan')):.3f}, budget {summary['memory_budget']} B")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--queries", required=True)
    ap.add_argument("--gt", default=None, help="ground truth (recall is printed, and --target-recall picks L)")
    ap.add_argument("--nq", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--L", default="100", help="L, or a grid for --target-recall to pick from")
    ap.add_argument("--target-recall", type=float, default=0.95)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--clients", default="4", help="concurrent callers of the one-query modes, comma-separated")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--generator", choices=("client", "raw", "both"), default="client",
                    help="the served side's callers (see above)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--chosen-L", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.Ls = [int(x) for x in args.L.split(",")]
    args.modes = ["batch"] + [f"c{int(c)}" for c in args.clients.split(",")]
    if args.child:
        args.L = args.chosen_L
        child(args)
        return
    args.L = pick_L(args)
    gens = ["client", "raw"] if args.generator == "both" else [args.generator]
    served_sides = [f"served_{g}" if len(gens) > 1 else "served" for g in gens]
    runs = {"in_process": [], **{s_: [] for s_ in served_sides}}
    for rep in range(args.reps):
        order = ["in_process", *served_sides]
        for side in (order if rep % 2 == 0 else order[::-1]):
            if side == "in_process":
                r = subprocess.run([sys.executable, __file__, "--child", "--chosen-L", str(args.L), *sys.argv[1:]],
                                   capture_output=True, text=True, check=True)
                runs[side].append(json.loads(r.stdout.strip().splitlines()[-1]))
            else:
                runs[side].append(served(args, gens[served_sides.index(side)]))
    gt = nearline.read_ground_truth(args.gt)[0] if args.gt else None
    first = served_sides[0]
    summary = {"index": args.index, "L": args.L, "k": args.k, "batch": args.batch, "reps": args.reps,
               "generators": gens, "memory_budget": runs[first][0]["budget"],
               "within_budget": all(r["within_budget"] for s in runs.values() for r in s), "modes": {}}
    for mode in args.modes:
        same = all(a[mode]["ids"] == b[mode]["ids"]
                   for side in served_sides for a, b in zip(runs["in_process"], runs[side]))
        row = {"identical_results": same}
        for side in runs:
            for key in ("qps", "p50_ms", "p99_ms"):
                row[f"{key}_{side}"] = statistics.median(r[mode][key] for r in runs[side])
            row[f"qps_runs_{side}"] = [r[mode]["qps"] for r in runs[side]]
        text = []
        for side in served_sides:
            ratio = row[f"qps_{side}"] / row["qps_in_process"]
            row[f"{side}_over_in_process"] = ratio
            text.append(f"{side.replace('_', ' ')} {row[f'qps_{side}']:7.0f} QPS (p50 {row[f'p50_ms_{side}']:.2f} ms, "
                        f"p99 {row[f'p99_ms_{side}']:.2f}) = {ratio:.2f}x")
        if gt is not None and mode == "batch":
            found = np.asarray(runs[first][0][mode]["ids"][0])
            summary["recall"] = nearline.recall(found, gt[: len(found)], args.k)
        summary["modes"][mode] = row
        print(f"{mode:>6}: in-process {row['qps_in_process']:7.0f} QPS (p50 {row['p50_ms_in_process']:.2f} ms, "
              f"p99 {row['p99_ms_in_process']:.2f}), {', '.join(text)}, identical results: {same}")
    print(f"L {args.L}, recall@{args.k} {summary.get('recall', float('nan')):.4f}, memory budget "
          f"{summary['memory_budget']} bytes, within budget: {summary['within_budget']}")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))
    if args.plot:
        plot(summary, args.plot)


if __name__ == "__main__":
    main()
