"""Segments on Ray: a collection larger than one machine, split into segments.

A *collection* is a directory: ``collection.json`` (the manifest), ``centroids.npy`` (k-means
routing only), ``ids.json`` (the automatic-id high-water mark) and one nearline index
directory per segment. Segments are built as Ray tasks and served by Ray actors, each holding
its segment's index open::

    import nearline.distributed as nd
    coll = nd.build(x, "my.collection", segments=4)     # routing="auto": the planner's choice
    ids, dists = coll.search(q, k=10, L=100)             # fans out, merges the top-k
    new = coll.insert(more)                              # to the owning segments, durably
    coll.delete(new[:5])
    coll.close()
    coll = nd.open("my.collection", memory_budget="2GiB")  # split across the segments

Routing (``routing=``): ``"hash"`` puts id ``i`` in segment ``splitmix64(i) % segments`` and
sends every query to every segment (scatter-gather: recall at least one index's over all
vectors at the same per-segment L); ``"kmeans"`` makes each segment a k-means cell and sends a query to
its ``nprobe_segments`` nearest cells only; ``"auto"`` (default) picks hash below 9 segments
(a small fan-out costs little and keeps recall) and for inner product, k-means from 9 segments
on (fanning every query out to many segments multiplies the work). See ``docs/distributed.md``.

Failures: an actor that dies is restarted by Ray (``max_restarts=-1``) and reopens its segment,
replaying the segment's write-ahead log, so every acknowledged write survives. A search waits
for restarting segments up to ``timeout`` seconds; a segment that still does not answer raises
:class:`PartialResultError` (default) or, with ``allow_partial=True``, is named in the result's
``missing`` list: results are never silently incomplete. Writes are never retried blindly: after
a failure the collection waits for the segment and checks which ids it holds before resending.

Needs Ray (``pip install 'nearline[distributed]'``). Calls ``ray.init`` only when Ray is not
initialised yet (``address=`` or ``RAY_ADDRESS`` names an existing cluster).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Union

import numpy as np

try:
    import ray
    import ray.exceptions as _rx
except ImportError as _e:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "nearline.distributed needs Ray, which is not installed: pip install 'nearline[distributed]'"
    ) from _e

import nearline
from nearline.distributed_build import DEFAULT_TIMEOUT, ERROR_TYPES, build, ensure_ray, task_error
from nearline.distributed_common import (FORMAT_VERSION, ID_LIMIT, IDS_FILE, MANIFEST, check_ids, check_int,
                                         check_options, check_timeout, duplicates, load_centroids, read_json,
                                         read_manifest, write_json)
from nearline.distributed_routing import (HASH, KMEANS, ROUTINGS, assign, hash_segments, merge_topk, route_queries,
                                          split_budget)
from nearline.distributed_segment import SegmentOpenError, SegmentServer

__all__ = ["build", "open", "Collection", "SearchResult", "PartialResultError", "WriteError", "SegmentOpenError",
           "read_manifest", "ROUTINGS", "MANIFEST", "FORMAT_VERSION", "DEFAULT_TIMEOUT"]

log = logging.getLogger("nearline.distributed")

_OPEN_OPTIONS = frozenset(nearline.VOCABULARY["options"]["open"]) - {"memory_budget"}
_SEARCH_OPTIONS = frozenset(nearline.VOCABULARY["options"]["search"]) - {"k", "L"}
_TEMPORARY = (_rx.ActorUnavailableError, _rx.ObjectLostError, _rx.WorkerCrashedError, _rx.NodeDiedError)
_OPEN_ERRORS = {**ERROR_TYPES, "ValueError": ValueError, "TypeError": TypeError,
                "FileNotFoundError": FileNotFoundError, "PermissionError": PermissionError, "OSError": OSError}

_SegmentActor = ray.remote(SegmentServer)


# --------------------------------------------------------------------------- errors and results


class PartialResultError(RuntimeError):
    """Some segments did not answer within the deadline (``missing``: their numbers; ``causes``:
    segment -> what went wrong). Search with ``allow_partial=True`` to get the other segments'
    results with the missing ones named instead."""

    def __init__(self, message: str, missing: Sequence[int] = (), causes: Optional[Dict[int, str]] = None):
        super().__init__(message)
        self.missing = sorted(int(s) for s in missing)
        self.causes = dict(causes or {})


class WriteError(RuntimeError):
    """An insert or delete that not every segment acknowledged within the deadline.

    ``ids``: the ids of the call, in row order (an insert's automatic ids too). ``acknowledged``:
    ids whose write is durable. ``unacknowledged``: ids in doubt (written or not:
    :meth:`Collection.contains` tells, once the segment is back). ``missing``: the segments that
    did not answer; ``causes``: segment -> error."""

    def __init__(self, message: str, acknowledged: np.ndarray, unacknowledged: np.ndarray,
                 missing: Sequence[int] = (), causes: Optional[Dict[int, str]] = None,
                 ids: Optional[np.ndarray] = None):
        super().__init__(message)
        self.ids = np.asarray(np.concatenate([acknowledged, unacknowledged]) if ids is None else ids,
                              dtype=np.int64)
        self.acknowledged = np.asarray(acknowledged, dtype=np.int64)
        self.unacknowledged = np.asarray(unacknowledged, dtype=np.int64)
        self.missing = sorted(int(s) for s in missing)
        self.causes = dict(causes or {})


class SearchResult(NamedTuple):
    """A search with ``allow_partial=True``: ``(ids, distances, missing)``; ``missing`` lists the
    segments that did not answer (empty when the result is complete)."""

    ids: np.ndarray
    distances: np.ndarray
    missing: List[int]

    @property
    def partial(self) -> bool:
        """True when some segment's results are missing."""
        return bool(self.missing)


# --------------------------------------------------------------------------- helpers


# --------------------------------------------------------------------------- open


def open(  # noqa: A001 - mirrors nearline.open
    path: Union[str, "os.PathLike[str]"],
    *,
    memory_budget: Any = None,
    nprobe_segments: Optional[int] = None,
    timeout: float = DEFAULT_TIMEOUT,
    address: Optional[str] = None,
    actor_options: Optional[Dict[str, Any]] = None,
    **open_options: Any,
) -> "Collection":
    """Opens the collection at ``path``: one Ray actor per segment opens (and so replays) its
    segment's index. The directory must be visible at the same path on every node that may run
    an actor.

    Args:
        memory_budget: the collection's budget, split as at build (a fraction: the same fraction of
            each segment's raw vectors; bytes or a size: in proportion to the segments' sizes at
            build); each share binds its segment. Default: each segment's own.
        nprobe_segments: k-means routing: segments a query visits by default (1..segments; default:
            the value calibrated at build). Hash routing visits every segment and refuses any
            other value.
        timeout: seconds calls wait for segments that are starting or restarting (default 60).
        address: the Ray cluster to join when Ray is not initialised.
        actor_options: extra ``ray.remote`` options of the segment actors (``num_cpus``,
            ``resources``, ``scheduling_strategy``, ...).
        **open_options: options of :func:`nearline.open` for every segment (``threads``,
            ``read_only``, ``durability``, ``io``, ...).

    Raises:
        FileNotFoundError, FormatError, CorruptIndexError: as :func:`read_manifest`, or a segment's
            open error with a note naming the segment. ValueError, TypeError: bad arguments.
        TimeoutError: a segment did not open within ``timeout``.
    """
    p = Path(os.fspath(path)).resolve()
    doc = read_manifest(p)
    centroids = load_centroids(p, doc)
    segs = len(doc["segments"])
    nprobe = _nprobe(doc, nprobe_segments, segs)
    opts = check_options(open_options, _OPEN_OPTIONS, "open")
    timeout = check_timeout(timeout)
    raw = [int(s.get("raw_bytes") or s.get("n", 1)) for s in doc["segments"]]
    shares, rule = split_budget(memory_budget, raw)
    if memory_budget is None:
        built = (doc.get("memory_budget") or {}).get("rule") or ""
        rule = f"each segment's budget from its build (there: {built})"
    ensure_ray(address)
    aopts = {"max_restarts": -1, "max_task_retries": 0, "max_concurrency": 4, **(actor_options or {})}
    actors = []
    for s, share in zip(doc["segments"], shares):
        o = dict(opts)
        if share is not None:
            o["memory_budget"] = share
        actors.append(_SegmentActor.options(**aopts).remote(str(p / s["name"]), s["name"], o))
    coll = Collection(p, doc, centroids, actors, nprobe, timeout, opts, shares, rule, aopts)
    try:
        coll._all("status", "open", strict=True)
    except PartialResultError as e:
        coll.close()
        raise TimeoutError(f"{p}: segment(s) {e.missing} did not open within {timeout:g} s: {e.causes}") from None
    except SegmentOpenError as e:
        coll.close()
        cls = _OPEN_ERRORS.get(e.kind, SegmentOpenError)
        raise (cls(str(e)) if cls is not SegmentOpenError else e) from None
    except BaseException:
        coll.close()
        raise
    return coll


def _drain(refs: List[Any], timeout: float = 2.0) -> None:
    """Collects the other segments' answers to a call that failed (Ray would log each error never
    collected as unhandled)."""
    if refs:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        for ref in ready:
            try:
                ray.get(ref)
            except Exception:  # noqa: BLE001 - the first error is the one raised
                pass


def _nprobe(doc: Dict[str, Any], value: Optional[int], segs: int) -> int:
    kind = doc["routing"]["kind"]
    if value is None:
        return int(doc["routing"].get("nprobe_segments", segs)) if kind == KMEANS else segs
    v = check_int("nprobe_segments", value, 1, segs)
    if kind == HASH and v != segs:
        raise ValueError(f"nprobe_segments={v}: hash routing visits every segment ({segs}); nprobe_segments "
                         "applies to k-means routing")
    return v


# --------------------------------------------------------------------------- the collection


class _Job:
    """One segment's part of a fan-out: the calls to make, retried while the segment is restarting."""

    def __init__(self, method: str, *args: Any) -> None:
        self.method, self.args = method, args
        self.value: Any = None
        self.done = False
        self.error: Optional[BaseException] = None  # an error that retrying cannot fix
        self.cause: Optional[str] = None  # the last reason the segment was unavailable

    def result(self, value: Any) -> bool:
        """Takes a call's value; True when another call (``method``/``args`` reset) should follow."""
        self.value, self.done = value, True
        return False

    def unavailable(self, reason: str) -> None:
        """The call failed because the segment's actor was not there (restarting, dead)."""
        self.cause = reason


class _InsertJob(_Job):
    """Inserts rows into one segment; after a failure, checks which ids arrived before resending the rest."""

    def __init__(self, vectors: np.ndarray, ids: np.ndarray) -> None:
        super().__init__("insert", vectors, ids)
        self.vectors, self.ids = vectors, ids
        self.acked = np.zeros(len(ids), dtype=bool)

    def result(self, value: Any) -> bool:
        if self.method == "insert":
            self.acked[:] = True
            self.done = True
            return False
        self.acked |= np.asarray(value, dtype=bool)  # contains(): what the segment holds now
        rest = ~self.acked
        if not rest.any():
            self.done = True
            return False
        self.method, self.args = "insert", (self.vectors[rest], self.ids[rest])
        return True

    def unavailable(self, reason: str) -> None:
        super().unavailable(reason)
        self.method, self.args = "contains", (self.ids,)


class Collection:
    """An open collection: its segments served by Ray actors. Thread-safe; writes are serialised.

    Use :func:`open` (or :func:`build`) to get one; close it (or use it as a context manager) to
    stop the actors."""

    def __init__(self, path: Path, doc: Dict[str, Any], centroids: Optional[np.ndarray], actors: List[Any],
                 nprobe: int, timeout: float, open_options: Dict[str, Any], shares: List[Any], rule: str,
                 actor_options: Dict[str, Any]) -> None:
        self.path = str(path)
        self.manifest = doc
        self._centroids = centroids
        self._actors = actors
        self._nprobe = nprobe
        self.timeout = timeout
        self._open_options = open_options
        self._shares, self._budget_rule = shares, rule
        self._actor_options = actor_options
        self._write = threading.Lock()
        self._next_id: Optional[int] = None
        self._reserved = -1
        self._closed = False

    # ---- properties

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    @property
    def metric(self) -> str:
        return str(self.manifest["metric"])

    @property
    def routing(self) -> str:
        """``"hash"`` or ``"kmeans"``."""
        return str(self.manifest["routing"]["kind"])

    @property
    def segments(self) -> int:
        return len(self._actors)

    @property
    def nprobe_segments(self) -> int:
        """Segments a query visits by default."""
        return self._nprobe

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def n(self) -> int:
        """Live vectors over all segments."""
        return int(sum(st["n"] for st in self._all("status", "n", strict=True).values()))

    def __len__(self) -> int:
        return self.n

    # ---- the fan-out engine

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"collection {self.path} is closed")

    def _run(self, jobs: Dict[int, _Job], timeout: Optional[float]) -> Dict[int, _Job]:
        """Runs each segment's job on its actor in parallel until all are done or the deadline
        passes. A segment that is restarting is retried (its call waits for the restart); one whose
        actor is dead for good, or whose index cannot open, is given up; any other error is raised."""
        self._check_open()
        deadline = time.monotonic() + (self.timeout if timeout is None else check_timeout(timeout))
        pending: Dict[Any, int] = {}
        retry_at: Dict[int, float] = {}
        backoff = {s: 0.02 for s in jobs}

        def submit(s: int) -> None:
            job = jobs[s]
            pending[getattr(self._actors[s], job.method).remote(*job.args)] = s

        for s in jobs:
            submit(s)
        while pending or retry_at:
            now = time.monotonic()
            for s in [s for s, t in retry_at.items() if t <= now]:
                del retry_at[s]
                submit(s)
            left = deadline - now
            if left <= 0:
                break
            if not pending:
                time.sleep(max(0.0, min(left, min(retry_at.values()) - now)))
                continue
            wait = min([left] + [t - now for t in retry_at.values()])
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(wait, 0.001))
            for ref in ready:
                s = pending.pop(ref)
                job = jobs[s]
                try:
                    value = ray.get(ref)
                except _rx.ActorDiedError as e:
                    if self._actor_state(s) in ("ALIVE", "RESTARTING", "PENDING_CREATION", None):
                        job.unavailable(f"restarting: {type(e).__name__}")
                        retry_at[s] = time.monotonic() + backoff[s]
                        backoff[s] = min(1.0, backoff[s] * 2)
                    else:
                        job.unavailable("its actor is dead and will not restart (Collection.revive() starts "
                                        "a new one)")
                    continue
                except _TEMPORARY as e:
                    job.unavailable(f"restarting: {type(e).__name__}")
                    retry_at[s] = time.monotonic() + backoff[s]
                    backoff[s] = min(1.0, backoff[s] * 2)
                    continue
                except Exception as e:
                    err = task_error(e)
                    if isinstance(err, SegmentOpenError):
                        job.unavailable(str(err))
                        job.error = err
                        continue
                    err.add_note(f"from segment {s} ({self.manifest['segments'][s]['name']})")
                    _drain(list(pending))
                    raise err from None
                if job.result(value):
                    submit(s)
        for s, job in jobs.items():
            if not job.done and job.cause is None:
                job.cause = "no answer before the deadline"
        return jobs

    def _actor_state(self, s: int) -> Optional[str]:
        try:
            from ray._private import state

            return str(state.actors(actor_id=self._actors[s]._actor_id.hex())["State"])
        except Exception:  # internal API: unknown state means "retry"
            return None

    def _all(self, method: str, what: str, *args: Any, strict: bool = True,
             timeout: Optional[float] = None, segments: Optional[Sequence[int]] = None) -> Dict[int, Any]:
        """Calls ``method(*args)`` on every segment (or on ``segments``); raises PartialResultError when
        some segment did not answer (``strict``), else leaves it out of the result."""
        jobs = self._run({s: _Job(method, *args) for s in (range(self.segments) if segments is None else segments)},
                         timeout)
        missing = {s: j.cause or "" for s, j in jobs.items() if not j.done}
        if missing and strict:
            errs = [j.error for j in jobs.values() if isinstance(j.error, SegmentOpenError)]
            if method == "status" and errs:
                raise errs[0]
            raise PartialResultError(f"{what}: segment(s) {sorted(missing)} did not answer: "
                                     + "; ".join(f"{s}: {c}" for s, c in sorted(missing.items())),
                                     list(missing), missing)
        return {s: j.value for s, j in jobs.items() if j.done}

    # ---- search

    def search(self, queries: np.ndarray, k: int = 10, *, L: Optional[int] = None,
               nprobe_segments: Optional[int] = None, allow_partial: bool = False,
               timeout: Optional[float] = None, **search_options: Any) -> Any:
        """k-nearest-neighbour search over the collection.

        Each query goes to its routed segments (hash: all; k-means: the ``nprobe_segments`` with the
        nearest centroids), in parallel; each segment searches with ``k``, ``L`` and
        ``search_options`` (any option of :meth:`nearline.Index.search` but ``return_stats``), and
        the answers are merged by distance in the metric's order.

        Args:
            queries: ``(nq, dim)`` or ``(dim,)``.
            k: neighbours per query (>= 1). L: each segment's candidate list size.
            nprobe_segments: k-means routing: segments per query (1..segments; default: the
                collection's).
            allow_partial: when a segment does not answer within ``timeout``, return what the others
                found as a :class:`SearchResult` naming it, instead of raising
                :class:`PartialResultError`.
            timeout: seconds to wait for restarting segments (default: the collection's).

        Returns:
            ``(ids, distances)`` as :meth:`nearline.Index.search` returns them (missing slots: id
            -1); with ``allow_partial=True`` a :class:`SearchResult` ``(ids, distances, missing)``.
        """
        self._check_open()
        k = check_int("k", k, 1)
        if L is not None:
            L = check_int("L", L, 1)
        if "return_stats" in search_options:
            raise TypeError("search() of a collection does not take return_stats (per-segment statistics "
                            "are not merged); search a segment's index for them")
        opts = check_options(search_options, _SEARCH_OPTIONS, "search")
        if L is not None:
            opts["L"] = L
        nprobe = self._nprobe if nprobe_segments is None else _nprobe(self.manifest, nprobe_segments, self.segments)
        q = np.asarray(queries)
        single = q.ndim == 1
        if single:
            q = q[None, :]
        if q.ndim != 2:
            raise ValueError(f"queries must be 1-D or 2-D, got shape {np.asarray(queries).shape}")
        if q.shape[1] != self.dim:
            raise ValueError(f"queries have dimension {q.shape[1]}, the collection has {self.dim}")
        if q.dtype == np.bool_ or not (np.issubdtype(q.dtype, np.floating) or np.issubdtype(q.dtype, np.integer)):
            raise ValueError(f"queries have dtype {q.dtype}; expected a numeric array")
        q = np.ascontiguousarray(q, dtype=np.float32)
        nq = q.shape[0]
        if nq == 0:
            empty = (np.zeros((0, k), dtype=np.int64), np.zeros((0, k), dtype=np.float32))
            return SearchResult(*empty, []) if allow_partial else empty
        if nprobe >= self.segments:
            ref = ray.put(q)
            plan = {s: np.arange(nq) for s in range(self.segments)}
            jobs = {s: _Job("search", ref, k, opts) for s in range(self.segments)}
            slot = {s: np.full(nq, s) for s in range(self.segments)}
            width = self.segments
        else:
            routed = route_queries(q, self._centroids, self.metric, nprobe)  # (nq, nprobe)
            plan, slot, jobs = {}, {}, {}
            for s in range(self.segments):
                rows, cols = np.nonzero(routed == s)
                if rows.size:
                    plan[s], slot[s] = rows, cols
                    jobs[s] = _Job("search", q[rows], k, opts)
            width = nprobe
        self._run(jobs, timeout)
        fill = np.float32(np.inf if self.metric == "l2" else -np.inf)
        cand_i = np.full((nq, width, k), -1, dtype=np.int64)
        cand_d = np.full((nq, width, k), fill, dtype=np.float32)
        missing = sorted(s for s, j in jobs.items() if not j.done)
        for s, job in jobs.items():
            if job.done:
                ids, dists = job.value
                cand_i[plan[s], slot[s]] = ids
                cand_d[plan[s], slot[s]] = dists
        if missing and not allow_partial:
            causes = {s: jobs[s].cause or "" for s in missing}
            raise PartialResultError(
                f"search: segment(s) {missing} did not answer within the deadline ("
                + "; ".join(f"{s}: {c}" for s, c in causes.items())
                + "): the result would be incomplete; pass allow_partial=True to get it with the missing "
                  "segments named", missing, causes)
        ids, dists = merge_topk(cand_i.reshape(nq, -1), cand_d.reshape(nq, -1), k, self.metric)
        if single:
            ids, dists = ids[0], dists[0]
        if allow_partial:
            return SearchResult(ids, dists, missing)
        return ids, dists

    # ---- writes

    def _owners(self, vectors: Optional[np.ndarray], ids: np.ndarray) -> np.ndarray:
        if self.routing == HASH:
            return hash_segments(ids, self.segments)
        return assign(vectors, self._centroids, self.metric)

    def _writable(self) -> None:
        self._check_open()
        if self._open_options.get("read_only"):
            raise ValueError(f"collection {self.path} is open read_only: inserts, deletes and checkpoints are "
                             "refused")

    def _allocate(self, count: int, explicit: Optional[np.ndarray]) -> np.ndarray:
        """Ids for an insert (under the write lock): explicit ones raise the high-water mark; automatic
        ones continue above every id the collection has given or seen. The mark is persisted in
        ``ids.json`` before a segment sees an id above it."""
        if self._next_id is None:
            mark = 0
            try:
                mark = int(read_json(Path(self.path) / IDS_FILE).get("next_id", 0))
            except FileNotFoundError:
                pass
            try:
                top = self._all("max_id", "allocate ids", strict=True)
            except PartialResultError as e:
                raise WriteError(f"insert: {e}; nothing was written", np.zeros(0, np.int64),
                                 np.zeros(0, np.int64), e.missing, e.causes) from None
            self._next_id = max([mark] + [int(m) + 1 for m in top.values()])
            self._reserved = mark
        if explicit is not None:
            out = explicit
            end = int(explicit.max()) + 1 if explicit.size else self._next_id
        else:
            if self._next_id + count > ID_LIMIT:
                raise ValueError(f"an insert of {count} automatic ids would pass 2**63 - 1 (next id "
                                 f"{self._next_id}): give ids explicitly")
            out = np.arange(self._next_id, self._next_id + count, dtype=np.int64)
            end = self._next_id + count
        if end > self._reserved:  # persisted before any segment sees the ids
            self._reserved = end
            write_json(Path(self.path) / IDS_FILE, {"next_id": end})
        self._next_id = max(self._next_id, end)
        return out

    def insert(self, vectors: np.ndarray, ids: Optional[np.ndarray] = None, *,
               timeout: Optional[float] = None) -> np.ndarray:
        """Inserts vectors, each into its owning segment (hash: by id; k-means: nearest centroid).

        Returns the int64 ids once every segment has written its rows to its log (durable: a
        segment restarted after a crash replays them). Bad input (shape, values, ids that are live
        anywhere in the collection) is refused before any segment writes. A segment that dies
        mid-insert is waited for (up to ``timeout``) and asked which ids it holds; the rest are
        sent again, so nothing is written twice.

        Args:
            vectors: ``(n, dim)`` or ``(dim,)``.
            ids: unique integers in 0..2**63, none live; default: new ids above every id the
                collection has given (unique across segments, also after restarts).

        Raises:
            ValueError: bad input (nothing is written). WriteError: some segment did not acknowledge
                in time (``acknowledged``/``unacknowledged`` say which ids are durable / in doubt).
        """
        self._writable()
        v = np.asarray(vectors)
        if v.ndim == 1:
            v = v[None, :]
        if v.ndim != 2 or v.shape[1] != self.dim:
            raise ValueError(f"vectors must have shape (n, {self.dim}), got {np.asarray(vectors).shape}")
        if v.dtype == np.bool_ or not (np.issubdtype(v.dtype, np.floating) or np.issubdtype(v.dtype, np.integer)):
            raise ValueError(f"vectors have dtype {v.dtype}; expected a float or integer array")
        v = np.ascontiguousarray(v, dtype=np.float32)
        if not np.isfinite(v).all():
            r, c = np.argwhere(~np.isfinite(v))[0]
            raise ValueError(f"vectors[{r}, {c}] = {v[r, c]} is not finite")
        explicit = None if ids is None else check_ids(ids, len(v), "ids")
        if explicit is not None:
            dup = duplicates(explicit)
            if dup.size:
                raise ValueError(f"ids repeat within the insert: {dup[:5].tolist()}")
        if len(v) == 0:
            return np.zeros(0, dtype=np.int64)
        with self._write:
            new = self._allocate(len(v), explicit)
            owner = self._owners(v, new)
            parts = {s: np.flatnonzero(owner == s) for s in range(self.segments)}
            parts = {s: r for s, r in parts.items() if r.size}
            # Check first: each owner validates its rows; under k-means an id may only be live elsewhere.
            elsewhere = explicit if (explicit is not None and self.routing == KMEANS) else None
            checks = {s: _Job("validate_insert", v[parts[s]] if s in parts else None,
                              new[parts[s]] if s in parts else None, elsewhere)
                      for s in (range(self.segments) if elsewhere is not None else parts)}
            found = self._all_jobs(checks, timeout, "insert (validation)", new)
            live = np.unique(np.concatenate([np.asarray(x, dtype=np.int64) for x in found.values()] or
                                            [np.zeros(0, np.int64)]))
            if live.size:
                raise ValueError(f"ids {live[:5].tolist()} are live in the collection: delete them first "
                                 "to replace their vectors")
            jobs = {s: _InsertJob(v[r], new[r]) for s, r in parts.items()}
            self._run(jobs, timeout)
        acked = np.concatenate([j.ids[j.acked] for j in jobs.values()])
        if all(j.done for j in jobs.values()):
            return new
        missing = sorted(s for s, j in jobs.items() if not j.done)
        causes = {s: jobs[s].cause or "" for s in missing}
        doubt = np.concatenate([j.ids[~j.acked] for j in jobs.values()])
        raise WriteError(f"insert: segment(s) {missing} did not acknowledge {doubt.size} of {new.size} rows "
                         f"within the deadline ({causes}); {acked.size} are durable, the rest may or may not "
                         "be (Collection.contains tells once the segments are back)", acked, doubt, missing, causes,
                         new)

    def _all_jobs(self, jobs: Dict[int, _Job], timeout: Optional[float], what: str,
                  ids: np.ndarray) -> Dict[int, Any]:
        self._run(jobs, timeout)
        missing = {s: j.cause or "" for s, j in jobs.items() if not j.done}
        if missing:
            raise WriteError(f"{what}: segment(s) {sorted(missing)} did not answer ({missing}); nothing was "
                             "written", np.zeros(0, np.int64), ids, list(missing), missing, ids)
        return {s: j.value for s, j in jobs.items()}

    def delete(self, ids: Any, *, timeout: Optional[float] = None) -> int:
        """Deletes ids (unknown ones are ignored); returns how many were live. Hash routing asks
        each id's owner; k-means asks every segment. Returns once every segment holding one of
        the ids has logged the delete."""
        self._writable()
        a = check_ids(ids, -1, "ids")
        if a.size == 0:
            return 0
        with self._write:
            targets = (range(self.segments) if self.routing == KMEANS else
                       np.unique(hash_segments(a, self.segments)).tolist())
            owner = hash_segments(a, self.segments) if self.routing == HASH else None
            sub = {s: (a if owner is None else a[owner == s]) for s in targets}
            masks = self._all_jobs({s: _Job("contains", sub[s]) for s in sub}, timeout, "delete (lookup)", a)
            live = {s: np.unique(sub[s][np.asarray(m, dtype=bool)]) for s, m in masks.items()}
            live = {s: x for s, x in live.items() if x.size}
            jobs = {s: _Job("delete", x) for s, x in live.items()}
            self._run(jobs, timeout)  # a delete is idempotent: resent as is after a restart
        missing = sorted(s for s, j in jobs.items() if not j.done)
        if missing:
            done = np.concatenate([live[s] for s in live if s not in missing] or [np.zeros(0, np.int64)])
            doubt = np.concatenate([live[s] for s in missing])
            raise WriteError(f"delete: segment(s) {missing} did not acknowledge within the deadline",
                             done, doubt, missing, {s: jobs[s].cause or "" for s in missing}, a)
        return int(sum(x.size for x in live.values()))

    def contains(self, ids: Any, *, timeout: Optional[float] = None) -> np.ndarray:
        """Which of ``ids`` are live in the collection (bool array)."""
        a = check_ids(ids, -1, "ids")
        out = np.zeros(a.size, dtype=bool)
        for m in self._all("contains", "contains", a, strict=True, timeout=timeout).values():
            out |= np.asarray(m, dtype=bool)
        return out

    def checkpoint(self, *, timeout: Optional[float] = None) -> List[int]:
        """Checkpoints every segment (:meth:`nearline.Index.checkpoint`); returns their log sequences."""
        self._writable()
        with self._write:
            got = self._all("checkpoint", "checkpoint", strict=True, timeout=timeout)
        return [int(got[s]) for s in range(self.segments)]

    # ---- reads

    def ids(self, *, timeout: Optional[float] = None) -> np.ndarray:
        """Every live id (int64, ascending)."""
        got = self._all("live_ids", "ids", strict=True, timeout=timeout)
        return np.sort(np.concatenate([np.asarray(got[s], dtype=np.int64) for s in range(self.segments)]))

    def info(self, *, timeout: Optional[float] = None) -> Dict[str, Any]:
        """The collection: routing (kind, rule, nprobe), the memory budget's split (``memory``: total,
        per segment, ``within_budget``), and per segment its live count, actor and index info
        (``segments[i]["index"]``). A segment that does not answer is listed with
        ``available: False`` and the reason."""
        jobs = self._run({s: _Job("info") for s in range(self.segments)}, timeout)
        status = self._run({s: _Job("status") for s in range(self.segments)}, timeout)
        segs, budgets, totals = [], [], []
        for s, entry in enumerate(self.manifest["segments"]):
            d: Dict[str, Any] = {"segment": s, "name": entry["name"], "path": str(Path(self.path) / entry["name"]),
                                 "built_n": entry.get("n"), "available": jobs[s].done and status[s].done}
            if d["available"]:
                info, st = jobs[s].value, status[s].value
                mem = info.get("memory") or {}
                d.update(n=st["n"], pid=st["pid"], host=st["host"], started=st["started"],
                         open_seconds=st["open_seconds"], memory_budget=mem.get("budget"),
                         within_budget=mem.get("within_budget"), index=info)
                budgets.append(mem.get("budget") or 0)
                totals.append(mem.get("total") or 0)
            else:
                d["error"] = jobs[s].cause or status[s].cause
            segs.append(d)
        up = [d for d in segs if d["available"]]
        routing = {k: v for k, v in self.manifest["routing"].items() if k != "centroids_sha256"}
        routing["nprobe_segments"] = self._nprobe
        return {
            "path": self.path, "format_version": self.manifest["format_version"], "dim": self.dim,
            "metric": self.metric, "dtype": self.manifest.get("dtype"), "segments": segs,
            "n": int(sum(d["n"] for d in up)) if len(up) == len(segs) else None, "routing": routing,
            "memory": {"budget": int(sum(budgets)), "per_segment": [d.get("memory_budget") for d in segs],
                       "total": int(sum(totals)), "rule": self._budget_rule,
                       "within_budget": len(up) == len(segs) and all(bool(d.get("within_budget")) for d in up)},
            "available": len(up) == len(segs), "build": self.manifest.get("build"),
            "open_options": dict(self._open_options), "timeout": self.timeout,
        }

    # ---- lifecycle

    def pids(self, *, timeout: Optional[float] = None) -> List[int]:
        """The process id of each segment's actor (for monitoring, or a failure test's SIGKILL)."""
        got = self._all("pid", "pids", strict=True, timeout=timeout)
        return [int(got[s]) for s in range(self.segments)]

    def actor(self, segment: int) -> Any:
        """The Ray actor handle serving ``segment``."""
        return self._actors[check_int("segment", segment, 0, self.segments - 1)]

    def revive(self, *, timeout: Optional[float] = None) -> List[int]:
        """Starts a new actor for every segment whose actor is dead for good (killed with
        ``no_restart``, or out of restarts); it reopens the segment, replaying its log. Returns the
        segments revived."""
        self._check_open()
        dead = [s for s in range(self.segments) if self._actor_state(s) == "DEAD"]
        for s in dead:
            entry = self.manifest["segments"][s]
            o = dict(self._open_options)
            if self._shares[s] is not None:
                o["memory_budget"] = self._shares[s]
            self._actors[s] = _SegmentActor.options(**self._actor_options).remote(
                str(Path(self.path) / entry["name"]), entry["name"], o)
        if dead:
            self._all("status", "revive", strict=True, timeout=timeout, segments=dead)
        return dead

    def close(self) -> None:
        """Closes every segment's index and stops the actors. Idempotent."""
        if self._closed:
            return
        self._closed = True
        refs = []
        for a in self._actors:
            try:
                refs.append(a.close.remote())
            except Exception:  # a dead actor
                pass
        try:
            ray.wait(refs, num_returns=len(refs), timeout=10)
        except Exception:
            pass
        for a in self._actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass

    def __enter__(self) -> "Collection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.segments} segments, {self.routing} routing, dim={self.dim}"
        return f"<nearline.distributed.Collection {self.path} {state}>"
