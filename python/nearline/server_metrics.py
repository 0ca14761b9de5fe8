"""Prometheus metrics of ``nearline serve``, on their own registry (never the process's
global one, so two servers in one process count apart)."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
    from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE  # noqa: F401 - the server's reply type
    from prometheus_client.core import GaugeMetricFamily
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError("nearline serve needs prometheus-client: pip install 'nearline[serve]'") from e

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class _IndexCollector:
    """Per-collection gauges read from each index's ``info()`` at scrape time."""

    def __init__(self, indexes: Dict[str, Any]) -> None:
        self.indexes = indexes

    def describe(self) -> list:
        return []

    def collect(self) -> Any:
        held = GaugeMetricFamily("nearline_memory_held_bytes", "bytes the index holds now", labels=["collection"])
        budget = GaugeMetricFamily("nearline_memory_budget_bytes", "the index's memory budget", labels=["collection"])
        peak = GaugeMetricFamily("nearline_memory_peak_bytes", "the most the index has held", labels=["collection"])
        within = GaugeMetricFamily("nearline_memory_within_budget", "1 while held <= budget", labels=["collection"])
        vectors = GaugeMetricFamily("nearline_vectors", "live vectors", labels=["collection"])
        queue = GaugeMetricFamily("nearline_update_queue", "updates waiting: a graph index's inserts and deletes "
                                  "not yet merged, a partition index's queued splits/merges/reassigns",
                                  labels=["collection"])
        for name, ix in self.indexes.items():
            if ix.closed:
                continue
            try:
                info = ix.info()
            except ValueError:  # closed between the check and the call
                continue
            mem = info.get("memory", {})
            held.add_metric([name], float(mem.get("total", 0)))
            budget.add_metric([name], float(mem.get("budget", 0)))
            peak.add_metric([name], float(mem.get("peak_total", mem.get("total", 0))))
            within.add_metric([name], 1.0 if mem.get("within_budget", True) else 0.0)
            vectors.add_metric([name], float(info.get("n", 0)))
            upd = info.get("updates") or {}
            waiting = upd.get("queued_jobs")
            if waiting is None:
                waiting = int(upd.get("inserted_since_merge", 0)) + int(upd.get("deleted_since_merge", 0))
            queue.add_metric([name], float(waiting))
        yield from (held, budget, peak, within, vectors, queue)


class Metrics:
    """Counters and histograms the server updates per request."""

    def __init__(self, indexes: Dict[str, Any]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter("nearline_requests", "requests answered", ["collection", "op", "status"], registry=r)
        self.latency = Histogram("nearline_request_seconds", "time to answer a request", ["collection", "op"],
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.queries = Counter("nearline_queries", "queries searched", ["collection"], registry=r)
        self.reads = Counter("nearline_reads", "disk reads of searches", ["collection"], registry=r)
        self.cache_hits = Counter("nearline_cache_hits", "searches' cache hits", ["collection"], registry=r)
        self.inserted = Counter("nearline_inserted", "vectors inserted", ["collection"], registry=r)
        self.deleted = Counter("nearline_deleted", "ids deleted (that were live)", ["collection"], registry=r)
        self.in_flight = Gauge("nearline_requests_in_flight", "requests being answered", registry=r)
        self.dropped = Counter("nearline_events_dropped", "answered requests left out of these metrics "
                               "(more than 2^20 between two collections)", registry=r)
        r.register(_IndexCollector(indexes))

    def answered(self, events: List[Tuple[str, str, int, float, int, int, int]], dropped: int = 0) -> None:
        """Requests the HTTP front end answered: ``(collection, op, status, seconds, queries,
        reads, cache_hits)`` each (the last three are a search's)."""
        for collection, op, status, seconds, queries, reads, hits in events:
            self.requests.labels(collection, op, str(status)).inc()
            if status < 400:
                self.latency.labels(collection, op).observe(seconds)
            if queries:
                self.queries.labels(collection).inc(queries)
                self.reads.labels(collection).inc(reads)
                self.cache_hits.labels(collection).inc(hits)
        if dropped:
            self.dropped.inc(dropped)

    def updated(self, collection: str, inserted: int = 0, deleted: int = 0) -> None:
        if inserted:
            self.inserted.labels(collection).inc(inserted)
        if deleted:
            self.deleted.labels(collection).inc(deleted)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
