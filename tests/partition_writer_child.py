"""The writer process of tests/test_update_correctness.py (not a test module).

``python partition_writer_child.py INDEX N SEED`` opens the partition index at INDEX for writing,
prints ``ready``, then inserts ``N`` vectors one at a time under ids 1_000_000 + i (the vector of
id ``i`` is ``vector_of(SEED, i)``) and deletes one of them every fifth insert, printing ``I <id>``
once an insert returned and ``D <id>`` once a delete returned, with a checkpoint every 400 inserts
(so the reader also follows checkpoints and log resets). Every line is flushed at once: a line on
the pipe is an acknowledged update. After each line the writer waits for a line on its stdin: the
reader's search that follows the acknowledgement is the *next* search, while the writer's
background work (splits, merges, reassignments) goes on.
"""

from __future__ import annotations

import sys

import numpy as np

DIM = 32
FIRST = 1_000_000


def vector_of(seed: int, i: int) -> np.ndarray:
    """The vector inserted under id ``i`` by the writer seeded ``seed``."""
    return np.random.default_rng([seed, i]).normal(size=DIM).astype(np.float32)


def doomed(i: int) -> bool:
    """Whether the writer deletes id ``i`` (two inserts after inserting it)."""
    return (i - FIRST) % 5 == 2


def main(index: str, n: int, seed: int) -> None:
    import nearline

    idx = nearline.open(index, durability="buffered")

    def said(line: str) -> None:
        print(line, flush=True)
        sys.stdin.readline()

    said("ready")
    for j in range(n):
        i = FIRST + j
        idx.insert(vector_of(seed, i)[None], ids=[i])
        said(f"I {i}")
        if j % 5 == 4:
            gone = i - 2
            assert doomed(gone)
            idx.delete([gone])
            said(f"D {gone}")
        if j % 400 == 399:
            idx.checkpoint()
    idx.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
