"""What runs on the Ray workers of :mod:`nearline.distributed`: a segment's build (a task) and its
server (an actor that holds the segment's index open). Plain Python: ``nearline.distributed``
wraps them with ``ray.remote``, so this module imports no Ray and its classes can be tested in
one process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from typing import Any, Dict, Iterator, Optional

import numpy as np

import nearline


class SegmentOpenError(RuntimeError):
    """A segment's index could not be opened by its actor (the message names the segment and the
    engine's error; ``kind`` is the engine error's class name). The segment is unavailable."""

    def __init__(self, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self) -> Any:
        return (type(self), (str(self), self.kind))


class SegmentEngineError(RuntimeError):
    """An engine error (``FormatError``, ``CorruptIndexError``: their classes do not pickle) carried
    from an actor to the driver, which raises it again as its class ``kind``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self) -> Any:
        return (type(self), (self.kind, str(self)))


@contextlib.contextmanager
def _portable() -> Iterator[None]:
    try:
        yield
    except nearline.FormatError as e:
        raise SegmentEngineError(type(e).__name__, str(e)) from None


def build_segment(data: np.ndarray, path: str, ids: np.ndarray, options: Dict[str, Any]) -> Dict[str, Any]:
    """Builds one segment's index at ``path`` (a directory inside the collection being built;
    whatever an earlier, interrupted try left there is removed first, so a retry is safe)."""
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    with _portable():
        idx = nearline.build(data, path, ids=ids, progress=False, **options)
        with idx:
            info = idx.info()
    memory = info.get("memory") or {}
    return {"n": int(info.get("n", len(data))), "kind": info.get("kind", "graph"), "preset": info.get("preset"),
            "memory_budget": memory.get("budget"), "seconds": time.perf_counter() - t0,
            "host": os.uname().nodename}


class _LiveIds:
    """The segment's live ids, for membership tests: a sorted array from the index plus the ids
    inserted and deleted since (folded in when they grow past an eighth of it)."""

    def __init__(self, base: np.ndarray) -> None:
        self.base = np.asarray(base, dtype=np.int64)
        self.added: set = set()
        self.removed: set = set()

    def contains(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        pos = np.searchsorted(self.base, ids)
        hit = (pos < self.base.size) & (self.base[np.minimum(pos, max(self.base.size - 1, 0))] == ids) \
            if self.base.size else np.zeros(ids.shape, dtype=bool)
        if self.added or self.removed:
            for j, v in enumerate(ids.tolist()):
                if v in self.added:
                    hit[j] = True
                elif v in self.removed:
                    hit[j] = False
        return hit

    def insert(self, ids: np.ndarray) -> None:
        for v in np.asarray(ids, dtype=np.int64).tolist():
            self.removed.discard(v)
            self.added.add(v)
        self._fold()

    def delete(self, ids: np.ndarray) -> None:
        for v in np.asarray(ids, dtype=np.int64).tolist():
            self.added.discard(v)
            self.removed.add(v)
        self._fold()

    def _fold(self) -> None:
        if len(self.added) + len(self.removed) > max(4096, self.base.size // 8):
            keep = self.base[~np.isin(self.base, np.fromiter(self.removed, np.int64, len(self.removed)))]
            self.base = np.union1d(keep, np.fromiter(self.added, np.int64, len(self.added)))
            self.added.clear()
            self.removed.clear()


class SegmentServer:
    """Serves one segment: opens its index in the constructor (so a restarted actor replays the
    segment's write-ahead log before it answers) and runs searches and updates on it.

    An open that fails does not kill the actor (Ray would restart it in a loop): every call then
    raises :class:`SegmentOpenError` naming the cause."""

    def __init__(self, path: str, name: str, options: Dict[str, Any]) -> None:
        self.path, self.name = path, name
        self.started = time.time()
        self._lock = threading.Lock()
        self._live: Optional[_LiveIds] = None
        self.index: Optional[nearline.Index] = None
        self.error: Optional[SegmentOpenError] = None
        try:
            self.index = nearline.open(path, **options)
        except Exception as e:  # reported by every call
            self.error = SegmentOpenError(f"segment {name} ({path}) cannot be opened: {type(e).__name__}: {e}",
                                          type(e).__name__)
        self.opened = time.time()

    def _idx(self) -> nearline.Index:
        if self.index is None:
            raise self.error or SegmentOpenError(f"segment {self.name} is closed")
        return self.index

    def status(self) -> Dict[str, Any]:
        """The segment's state: pid, host, live count, when it (re)started and how long the open (with
        its log replay) took."""
        with _portable():
            n = self._idx().n
        return {"name": self.name, "pid": os.getpid(), "host": os.uname().nodename, "n": int(n),
                "started": self.started, "open_seconds": self.opened - self.started}

    def max_id(self) -> int:
        """The largest live id (-1 when none)."""
        with _portable():
            ids = self._idx().ids()
        return int(ids[-1]) if ids.size else -1

    def pid(self) -> int:
        return os.getpid()

    def search(self, queries: np.ndarray, k: int, options: Dict[str, Any]) -> Any:
        with _portable():
            ids, dists = self._idx().search(queries, k, **options)
        return ids, dists

    def _live_ids(self) -> _LiveIds:
        if self._live is None:
            with _portable():
                self._live = _LiveIds(self._idx().ids())
        return self._live

    def contains(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` are live in this segment (bool array)."""
        with self._lock:
            return self._live_ids().contains(ids)

    def validate_insert(self, vectors: Optional[np.ndarray], ids: Optional[np.ndarray],
                        elsewhere: Optional[np.ndarray]) -> np.ndarray:
        """Checks an insert of ``vectors``/``ids`` here (raises what ``insert`` would) and returns which of
        ``elsewhere`` (ids bound for other segments) are live here."""
        idx = self._idx()
        if vectors is not None and len(vectors):
            with _portable():
                idx.validate_insert(vectors, ids)
        if elsewhere is None or not len(elsewhere):
            return np.zeros(0, dtype=np.int64)
        with self._lock:
            e = np.asarray(elsewhere, dtype=np.int64)
            return e[self._live_ids().contains(e)]

    def insert(self, vectors: np.ndarray, ids: np.ndarray) -> int:
        """Inserts with explicit ids; returns when the insert is in the segment's log."""
        idx = self._idx()
        with self._lock, _portable():
            got = idx.insert(vectors, ids)
            if self._live is not None:
                self._live.insert(got)
        return int(len(got))

    def delete(self, ids: np.ndarray) -> int:
        idx = self._idx()
        with self._lock, _portable():
            gone = idx.delete(ids)
            if self._live is not None:
                self._live.delete(ids)
        return int(gone)

    def live_ids(self) -> np.ndarray:
        with _portable():
            return self._idx().ids()

    def info(self) -> Dict[str, Any]:
        with _portable():
            return self._idx().info()

    def checkpoint(self) -> int:
        with self._lock, _portable():
            return self._idx().checkpoint()

    def close(self) -> None:
        with self._lock:
            if self.index is not None:
                self.index.close()
            self.index = None
            self.error = SegmentOpenError(f"segment {self.name} is closed")
