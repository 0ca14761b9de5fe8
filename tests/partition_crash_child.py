"""The writer process of tests/test_partition_crash.py (not a test module).

``python partition_crash_child.py INDEX LOG SEED`` opens the index at INDEX (a partition index,
or a graph index updated out of place; durability "sync") and runs a random stream of insert
batches, delete batches, searches, checkpoints (a graph index: merges) and maintenance until it is
killed. Around every call it appends a line to LOG:

* before the call, ``B <op> I <batch> <id,...>`` / ``B <op> D <id,...>`` / ``B <op> S`` (a
  search) / ``B <op> C`` (checkpoint) / ``B <op> M`` (maintain) (written, not synced: a killed
  process loses nothing it wrote);
* after the call returned, ``A <op> <splits> <merges>``, written and fsynced: the call is
  acknowledged.

``R`` is written once the index is open. The vectors of insert batch ``b`` are
``batch_vectors(SEED, b, n)``, so the parent can rebuild every acknowledged vector.
"""

from __future__ import annotations

import os
import sys

import numpy as np

DIM = 16
CLUSTERS = 24
CENTERS = np.random.default_rng(1234).normal(0, 4.0, size=(CLUSTERS, DIM)).astype(np.float32)
# Ids of the stream's new vectors start here (the template's are 0..N-1).
FIRST_NEW_ID = 1_000_000


def batch_vectors(seed: int, batch: int, n: int) -> np.ndarray:
    """The ``n`` vectors of insert batch ``batch`` of the stream seeded ``seed`` (a Gaussian
    mixture around fixed centres; batch 0 of seed 0 is the template's data)."""
    rng = np.random.default_rng([seed, batch])
    labels = rng.integers(0, CLUSTERS, size=n)
    return np.ascontiguousarray(CENTERS[labels] + rng.normal(0, 1.0, size=(n, DIM)).astype(np.float32))


def main(index: str, log: str, seed: int) -> None:
    import nearline

    rng = np.random.default_rng(seed)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def note(line: str, durable: bool) -> None:
        os.write(fd, (line + "\n").encode())
        if durable:
            os.fsync(fd)

    idx = nearline.open(index, durability="sync")
    graph = idx.kind == "graph"
    live = set(idx.ids().tolist())
    deleted: list = []
    next_id = FIRST_NEW_ID
    note("R", True)
    op = 0
    batch = 0
    while True:
        op += 1
        r = rng.random()
        if r < 0.50:
            batch += 1
            n = int(rng.integers(1, 33))
            # Now and then re-insert ids whose delete returned (with new vectors).
            back = min(n, len(deleted), int(rng.integers(0, 4)) if rng.random() < 0.3 else 0)
            ids = [deleted.pop(int(rng.integers(len(deleted)))) for _ in range(back)]
            ids += list(range(next_id, next_id + n - back))
            next_id += n - back
            note(f"B {op} I {batch} {','.join(map(str, ids))}", False)
            idx.insert(batch_vectors(seed, batch, len(ids)), ids=np.asarray(ids, dtype=np.int64))
            live.update(ids)
        elif r < 0.88:
            pool = sorted(live)
            n = min(len(pool), int(rng.integers(1, 25)))
            ids = [pool[i] for i in rng.choice(len(pool), n, replace=False)]
            if rng.random() < 0.2:
                ids.append(int(next_id + 10**9))  # unknown: ignored
            note(f"B {op} D {','.join(map(str, ids))}", False)
            idx.delete(np.asarray(ids, dtype=np.int64))
            for i in ids:
                if i in live:
                    live.discard(i)
                    deleted.append(i)
        elif r < 0.955:
            # Searches queue merges of postings that deletes thinned out.
            note(f"B {op} S", False)
            if graph:
                idx.search(batch_vectors(seed, 10**7 + op, 8), 5, L=32)
            else:
                idx.search(batch_vectors(seed, 10**7 + op, 8), 5, nprobe=16)
        elif r < 0.995:
            note(f"B {op} C", False)
            idx.checkpoint()
        else:
            note(f"B {op} M", False)
            idx.maintain()
        u = idx.info()["updates"]
        if graph:
            note(f"A {op} 0 {u['since_open']['merges']}", True)
        else:
            note(f"A {op} {u['splits']} {u['merges']}", True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
