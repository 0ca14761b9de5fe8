"""Dynamic batching of ``nearline serve``'s searches: small searches of one collection that arrive
while the engine is already busy with it wait and go together as one engine call.

A collection runs at most ``concurrency`` engine calls at once. A search that finds fewer
running starts at once, alone (no latency added when the server is idle); one that finds
them all busy joins the open group of searches with the same options (or opens one), and the
group runs as a single engine call as soon as a call finishes. One engine call over many
queries interleaves their reads on each search thread (``queries_in_flight``), where many
concurrent one-query calls would each hold threads of their own and contend for the cores.
Each caller gets its own rows of the group's result, exactly what a search of its queries
alone returns (a query's search never depends on the others of its batch).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import numpy as np


class _Group:
    """Searches with the same options, waiting to run as one engine call."""

    def __init__(self, key: Tuple[Any, ...]) -> None:
        self.key = key
        self.parts: List[np.ndarray] = []
        self.rows = 0
        self.done = threading.Event()
        self.result: Any = None
        self.error: Optional[BaseException] = None


class Batcher:
    """Runs ``search(queries, **options)`` for concurrent callers, batching them while busy."""

    def __init__(self, search: Callable[..., Any], *, concurrency: int = 2, max_rows: int = 256) -> None:
        if concurrency < 1 or max_rows < 1:
            raise ValueError("concurrency and max_rows must be positive")
        self._search = search
        self.concurrency = concurrency
        self.max_rows = max_rows
        self._cv = threading.Condition()
        self._running = 0
        self._open: Dict[Tuple[Any, ...], _Group] = {}
        self._order: Deque[_Group] = deque()
        #: Engine calls made and queries they carried (``info`` for tests and metrics).
        self.calls = 0
        self.batched_queries = 0

    def search(self, queries: np.ndarray, **options: Any) -> Tuple[np.ndarray, np.ndarray, Dict[str, np.ndarray]]:
        key = tuple(sorted(options.items()))
        n = len(queries)
        with self._cv:
            if self._running < self.concurrency and not self._order:
                self._running += 1
                group = None
            else:
                group = self._open.get(key)
                leader = group is None or group.rows + n > self.max_rows
                if leader:
                    group = _Group(key)
                    self._open[key] = group
                    self._order.append(group)
                offset = group.rows
                group.parts.append(queries)
                group.rows += n
        if group is None:
            try:
                return self._run(queries, options, 1)
            finally:
                self._release()
        if leader:
            with self._cv:
                while not (self._running < self.concurrency and self._order[0] is group):
                    self._cv.wait()
                self._order.popleft()
                if self._open.get(key) is group:
                    del self._open[key]  # closed: later searches open a new group
                self._running += 1
                self._cv.notify_all()  # the next group may start too if a slot is still free
            try:
                group.result = self._run(np.concatenate(group.parts), options, len(group.parts))
            except BaseException as e:  # every member gets the engine's error
                group.error = e
            finally:
                self._release()
                group.done.set()
        else:
            group.done.wait()
        if group.error is not None:
            raise group.error
        ids, dists, stats = group.result
        rows = slice(offset, offset + n)
        return ids[rows], dists[rows], {k: v[rows] for k, v in stats.items()}

    def _run(self, queries: np.ndarray, options: Dict[str, Any], members: int) -> Any:
        with self._cv:
            self.calls += 1
            self.batched_queries += len(queries) if members > 1 else 0
        return self._search(queries, **options)

    def _release(self) -> None:
        with self._cv:
            self._running -= 1
            self._cv.notify_all()
