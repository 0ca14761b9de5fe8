"""Are a search's tail latencies the disk's? Time every O_DIRECT 4 KiB read.

Runs T threads (optionally next to B busy processes that only burn CPU), each reading random aligned blocks of FILE one at a time
(queue depth T in all) for S seconds, for each T given, and prints:

- the read latency percentiles and the reads that took >= 10 ms ("stalls");
- for T >= 2, how many stalls hit every thread at once (the other threads'
  reads in flight at the same moment also stalled, ending within 1 ms of
  each other): a device-wide pause, not one slow read;
- where in a 100 ms period the stalls ended (a virtual disk throttled by a
  periodic timer releases them at one phase).

    python benches/analysis/disk_stalls.py FILE [SECONDS] [THREADS,THREADS,...] [BURN]

BURN (default 0): CPU-bound processes run during each measurement. With
BURN = 2 on a 2-vCPU VM, a single reader at queue depth 1 shows the pauses
that two search threads show: the pauses come from the host throttling the
whole VM (CPU quota per 100 ms period), not from the disk's queue.

FILE: a large file on the disk under test, e.g. an index's pages.bin (it must
be much larger than the page cache would be for a buffered read; O_DIRECT is
used anyway). Python's os.preadv releases the GIL, so the threads' reads
overlap. An analysis tool, not part of the package.
"""
import mmap
import os
import random
import subprocess
import sys
import threading
import time

import numpy as np

STALL_S = 0.010
BLOCK = 4096


def run(path: str, threads: int, seconds: float) -> None:
    nblocks = os.path.getsize(path) // BLOCK
    if nblocks < 1024:
        sys.exit(f"{path}: {nblocks} blocks; use a file of at least 4 MiB")
    out: list[list[tuple[float, float]]] = [[] for _ in range(threads)]

    def worker(i: int) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT requires
        rng = random.Random(i)
        mine = out[i]
        end = time.perf_counter() + seconds
        try:
            while True:
                t = time.perf_counter()
                if t > end:
                    break
                os.preadv(fd, [buf], rng.randrange(nblocks) * BLOCK)
                mine.append((t, time.perf_counter() - t))
        finally:
            os.close(fd)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    lat = np.array([x[1] for r in out for x in r])
    stalls = sorted((s + d, i, d) for i, r in enumerate(out) for s, d in r if d >= STALL_S)
    # Group stalls whose ends lie within 1 ms: one device-wide pause.
    groups: list[list[tuple[float, int, float]]] = []
    for st in stalls:
        if groups and st[0] - groups[-1][-1][0] < 0.001:
            groups[-1].append(st)
        else:
            groups.append([st])
    shared = sum(1 for g in groups if len({i for _, i, _ in g}) == threads)
    pct = np.percentile(lat * 1e3, [50, 99, 99.9]) if len(lat) else [0, 0, 0]
    print(f"threads={threads} reads/s={len(lat) / seconds:.0f} latency ms p50={pct[0]:.2f} "
          f"p99={pct[1]:.2f} p99.9={pct[2]:.2f} max={lat.max() * 1e3:.1f} "
          f"stalled reads={len(stalls)} pauses={len(groups)} ({len(groups) / seconds:.1f}/s)")
    if threads >= 2 and groups:
        print(f"  pauses that stalled every thread at once: {shared} of {len(groups)}")
    if groups:
        phase = np.array([(g[0][0] % 0.1) * 1e3 for g in groups])
        lengths = np.array([max(d for _, _, d in g) for g in groups])
        print(f"  pause ends, ms into a 100 ms period: median {np.median(phase):.1f}, "
              f"spread (p90 - p10) {np.percentile(phase, 90) - np.percentile(phase, 10):.1f}; "
              f"pause length median {np.median(lengths) * 1e3:.1f} ms")


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 5.0
    threads = [int(t) for t in sys.argv[3].split(",")] if len(sys.argv) > 3 else [1, 2, 4, 8]
    burn = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    if not os.path.isfile(path):
        sys.exit(f"{path}: not a file")
    if seconds <= 0 or any(t < 1 for t in threads) or burn < 0:
        sys.exit("SECONDS must be > 0, THREADS >= 1 and BURN >= 0")
    for t in threads:
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burn)]
        try:
            if burn:
                print(f"(with {burn} CPU-bound processes)")
            run(path, t, seconds)
        finally:
            for b in burners:
                b.kill()
                b.wait()


if __name__ == "__main__":
    main()
