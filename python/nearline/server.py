"""``nearline serve``: indexes served over HTTP/JSON, with bearer-token auth, limits and metrics.

The stack is the standard library's threaded HTTP server: one thread per connection, and
every engine call (search, insert, ...) releases the GIL, so searches and updates from many
connections run in parallel in the engine while Python only parses and writes JSON. It adds
no dependency beyond ``prometheus-client`` for the metrics; ``docs/serving.md`` has the
measured cost against searching in-process.

Endpoints (``/openapi.json`` describes them, with every search option and its type):

- ``GET /health`` (no token): ``{"status": "ok" | "draining", "collections": [...]}``.
- ``GET /metrics``: Prometheus text (requests, latency histograms, queries, reads, cache
  hits, memory held vs budget, updates waiting, vectors).
- ``GET /v1/collections``; ``GET /v1/collections/NAME`` (the index's ``info()``);
  ``GET /v1/collections/NAME/ids``.
- ``POST /v1/collections/NAME/search``, ``.../range_search``, ``.../plan`` (read scope);
  ``.../insert``, ``.../delete``, ``.../checkpoint`` (write scope).

Security: the server binds to 127.0.0.1 unless told otherwise; with tokens configured every
endpoint but ``/health`` and ``/openapi.json`` needs ``Authorization: Bearer TOKEN`` (a
``read`` token may search, a ``write`` token may also update); without tokens it refuses
to bind to anything but a loopback address. Requests are bounded (body bytes, rows per
batch, a deadline); a malformed request gets a 4xx with the reason and never reaches the
index. SIGTERM (or SIGINT) drains: new requests get 503, requests in flight finish (an
acknowledged write is in the index's log), then the indexes close.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import re
import signal
import socket
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import parse_qs, urlsplit

import numpy as np

import nearline

from . import server_metrics
from .server_batch import Batcher
from .server_wire import WireError, decode_array, dumps, encode_array, loads, option_schema

log = logging.getLogger("nearline.server")

SCOPES = ("read", "write")
#: The environment variable holding tokens (``SCOPE:TOKEN`` entries, as in a token file).
TOKENS_ENV = "NEARLINE_TOKENS"
MIN_TOKEN_CHARS = 16
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# Request keys that are not search options.
_SEARCH_KEYS = ("queries", "stats", "encoding", "timeout")
_RANGE_KEYS = ("queries", "radius", "stats", "encoding", "timeout")


@dataclass
class Limits:
    """What one request may ask: body bytes, rows (queries or vectors) per batch, values per
    array, and the longest a search may run (seconds) before it is answered 504; and how the
    server runs searches: ``engine_calls`` engine calls per collection at once, searches that
    arrive while they are all busy batched into the next one (:mod:`nearline.server_batch`)."""

    max_body: int = 64 << 20
    max_batch: int = 10_000
    max_values: int = 16 << 20
    deadline: float = 30.0
    max_concurrent: int = 64
    engine_calls: int = 2
    idle_timeout: float = 120.0
    grace: float = 30.0

    def check(self) -> "Limits":
        for name in ("max_body", "max_batch", "max_values", "max_concurrent", "engine_calls"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be a positive integer")
        for name in ("deadline", "idle_timeout", "grace"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0) or v == float("inf"):
                raise ValueError(f"{name}={v!r} must be a positive number of seconds")
        return self


@dataclass
class Tokens:
    """Bearer tokens by scope. ``write`` implies ``read``."""

    read: List[str] = field(default_factory=list)
    write: List[str] = field(default_factory=list)

    @property
    def enabled(self) -> bool:
        return bool(self.read or self.write)

    def scope(self, header: Optional[str]) -> Optional[str]:
        """The scope a request's ``Authorization`` header grants, or None."""
        if not header or not header.startswith("Bearer "):
            return None
        given = header[len("Bearer "):].strip().encode()
        # Compare against every token (constant time each) so timing tells nothing.
        found = None
        for scope in ("write", "read"):
            for t in getattr(self, scope):
                if hmac.compare_digest(given, t.encode()) and found is None:
                    found = scope
        return found

    @classmethod
    def parse(cls, text: str, source: str) -> "Tokens":
        """``SCOPE:TOKEN`` entries separated by whitespace or commas; ``#`` starts a comment."""
        out = cls()
        for lineno, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0]
            for entry in re.split(r"[\s,]+", line.strip()):
                if not entry:
                    continue
                scope, sep, token = entry.partition(":")
                if not sep or scope not in SCOPES:
                    raise ValueError(f"{source}:{lineno}: an entry must be 'read:TOKEN' or 'write:TOKEN', got {entry[:12]!r}...")
                if len(token) < MIN_TOKEN_CHARS:
                    raise ValueError(f"{source}:{lineno}: a token must have at least {MIN_TOKEN_CHARS} characters")
                getattr(out, scope).append(token)
        return out

    @classmethod
    def load(cls, token_file: Optional[str], environ: Optional[Dict[str, str]] = None) -> "Tokens":
        """Tokens from ``token_file`` (which must not be readable by other users) and from
        the ``NEARLINE_TOKENS`` environment variable."""
        env = os.environ if environ is None else environ
        out = cls()
        if token_file:
            st = os.stat(token_file)
            if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise ValueError(f"{token_file}: a token file must be private to its owner (chmod 600), "
                                 f"it has mode {stat.S_IMODE(st.st_mode):o}")
            with open(token_file, encoding="utf-8") as f:
                t = cls.parse(f.read(), token_file)
            out.read += t.read
            out.write += t.write
        if env.get(TOKENS_ENV):
            t = cls.parse(env[TOKENS_ENV], TOKENS_ENV)
            out.read += t.read
            out.write += t.write
        return out


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_collections(specs: Sequence[str]) -> List[Tuple[str, str]]:
    """``NAME=PATH`` or ``PATH`` (named after its directory) → ``[(name, path)]``."""
    out: List[Tuple[str, str]] = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            path, name = spec, os.path.basename(os.path.normpath(spec))
        if not _NAME.match(name):
            raise ValueError(f"collection name {name!r} must be 1-64 letters, digits, '_', '.' or '-' (give NAME=PATH)")
        if any(n == name for n, _ in out):
            raise ValueError(f"collection name {name!r} is given twice")
        out.append((name, path))
    if not out:
        raise ValueError("give at least one index to serve")
    return out


class Server:
    """Collections (opened indexes) served over HTTP. ``start()`` serves in a background
    thread (tests, embedding); ``serve_forever()`` serves until SIGTERM/SIGINT or
    :meth:`stop`. Use :func:`serve` for the CLI's behaviour."""

    def __init__(self, indexes: Dict[str, "nearline.Index"], *, host: str = "127.0.0.1", port: int = 8080,
                 tokens: Optional[Tokens] = None, limits: Optional[Limits] = None,
                 allow_no_auth: bool = False) -> None:
        if not indexes:
            raise ValueError("a server needs at least one collection")
        for name in indexes:
            if not _NAME.match(name):
                raise ValueError(f"collection name {name!r} must be 1-64 letters, digits, '_', '.' or '-'")
        self.tokens = tokens or Tokens()
        if not self.tokens.enabled and not is_loopback(host) and not allow_no_auth:
            raise ValueError(f"refusing to serve {host} without tokens: give --token-file or {TOKENS_ENV} "
                             "(or --insecure-no-auth to serve an open index on the network on purpose)")
        self.limits = (limits or Limits()).check()
        self.indexes = dict(indexes)
        self.metrics = server_metrics.Metrics(self.indexes)
        self.batchers = {name: Batcher(ix.search, concurrency=self.limits.engine_calls)
                         for name, ix in self.indexes.items()}
        self._slots = threading.BoundedSemaphore(self.limits.max_concurrent)
        self._lock = threading.Condition()
        self._busy = 0
        self._connections: Dict[Any, bool] = {}  # handler -> busy
        self.draining = False
        self._routes = self._route_table()
        self.openapi = _openapi(self)
        self.httpd = _HTTPServer((host, port), _Handler, self)
        self._thread: Optional[threading.Thread] = None

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def address(self) -> Tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def start(self) -> "Server":
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="nearline-serve", daemon=True)
        self._thread.start()
        return self

    def stop(self, close_indexes: bool = True) -> None:
        """Drains and stops: new requests get 503, requests in flight finish (up to the
        grace period), idle connections close, then (by default) the indexes close."""
        with self._lock:
            self.draining = True
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._finish(close_indexes)

    def _finish(self, close_indexes: bool) -> None:
        deadline = time.monotonic() + self.limits.grace
        with self._lock:
            self.draining = True
            for h, busy in list(self._connections.items()):
                if not busy:
                    h.hang_up()
            while self._busy and time.monotonic() < deadline:
                self._lock.wait(0.05)
            for h in list(self._connections):
                h.hang_up()
        self.httpd.server_close()
        if close_indexes:
            for ix in self.indexes.values():
                try:
                    ix.close()
                except Exception as e:  # noqa: BLE001 - report and go on closing the others
                    log.warning("closing %s: %s", ix.path, e)

    def serve_forever(self) -> None:
        """Serves until SIGTERM or SIGINT (main thread only), then drains and closes."""
        def on_signal(signum: int, _frame: Any) -> None:
            log.warning("signal %d: draining", signum)
            with self._lock:
                self.draining = True
            threading.Thread(target=self.httpd.shutdown, daemon=True).start()

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.httpd.serve_forever(poll_interval=0.1)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            self._finish(close_indexes=True)

    # -- request bookkeeping (called by handlers) ------------------------------------------
    def _enter(self, handler: Any) -> bool:
        """Counts a request as in flight (so a drain waits for its reply, a refusal included);
        returns whether it may run (False while draining: it is answered 503)."""
        with self._lock:
            self._busy += 1
            self._connections[handler] = True
            accepted = not self.draining
        self.metrics.in_flight.inc()
        return accepted

    def _leave(self, handler: Any) -> None:
        self.metrics.in_flight.dec()
        with self._lock:
            self._busy -= 1
            if handler in self._connections:
                self._connections[handler] = False
            self._lock.notify_all()

    def _register(self, handler: Any) -> None:
        with self._lock:
            self._connections[handler] = False

    def _unregister(self, handler: Any) -> None:
        with self._lock:
            self._connections.pop(handler, None)

    # -- routing -----------------------------------------------------------------------------
    def _route_table(self) -> Dict[Tuple[str, str], Tuple[Optional[str], Callable[..., Any]]]:
        return {
            ("GET", "collections"): ("read", self._list),
            ("GET", ""): ("read", self._info),
            ("GET", "ids"): ("read", self._ids),
            ("POST", "search"): ("read", self._search),
            ("POST", "range_search"): ("read", self._range_search),
            ("POST", "plan"): ("read", self._plan),
            ("POST", "insert"): ("write", self._insert),
            ("POST", "delete"): ("write", self._delete),
            ("POST", "checkpoint"): ("write", self._checkpoint),
        }

    def route(self, method: str, path: str) -> Tuple[str, Optional[str], Optional[str], Callable[..., Any]]:
        """``(op, collection, scope, handler)`` for a request, or a 404/405 WireError."""
        parts = [p for p in path.split("/") if p]
        if parts[:1] != ["v1"] or len(parts) < 2 or parts[1] != "collections" or len(parts) > 4:
            raise WireError(404, f"no endpoint {path} (see /openapi.json)")
        if len(parts) == 2:
            op, name = "collections", None
        else:
            name, op = parts[2], (parts[3] if len(parts) == 4 else "")
            if name not in self.indexes:
                raise WireError(404, f"no collection {name!r} (this server has {', '.join(sorted(self.indexes))})")
        entry = self._routes.get((method, op))
        if entry is None:
            allowed = sorted(m for (m, o) in self._routes if o == op)
            if allowed:
                raise WireError(405, f"{path} takes {' or '.join(allowed)}, not {method}")
            raise WireError(404, f"no endpoint {path} (see /openapi.json)")
        scope, fn = entry
        return (op or "info"), name, scope, fn

    # -- endpoints ---------------------------------------------------------------------------
    def _list(self, _name: None, _body: Dict[str, Any], _query: Dict[str, List[str]]) -> Any:
        return {"collections": [self._summary(n) for n in sorted(self.indexes)]}

    def _summary(self, name: str) -> Dict[str, Any]:
        ix = self.indexes[name]
        return {"name": name, "kind": ix.kind, "n": ix.n, "dim": ix.dim, "metric": ix.metric,
                "dtype": str(ix.dtype)}

    def _info(self, name: str, _body: Dict[str, Any], _query: Dict[str, List[str]]) -> Any:
        ix = self.indexes[name]
        # "live": the vectors a search can return (a graph index's info()["n"] is its disk graph's).
        return {**ix.info(), "collection": name, "live": ix.n}

    def _ids(self, name: str, body: Dict[str, Any], query: Dict[str, List[str]]) -> Any:
        b64 = query.get("encoding", ["json"])[-1] == "b64"
        return {"ids": encode_array(self.indexes[name].ids(), b64)}

    def _rows(self, body: Dict[str, Any], key: str) -> np.ndarray:
        """The float32 rows under ``key`` (``queries`` or ``vectors``): one row or a matrix,
        within the server's value and batch limits."""
        if key not in body:
            raise WireError(400, f"the body needs '{key}' (a list, a list of lists or a base64 array)")
        a = decode_array(body[key], key, "float32", ndim=(1, 2), max_items=self.limits.max_values)
        rows = a.shape[0] if a.ndim == 2 else 1
        if rows > self.limits.max_batch:
            raise WireError(413, f"{rows} {key} exceed this server's batch limit of {self.limits.max_batch}")
        return a

    def _queries(self, ix: "nearline.Index", body: Dict[str, Any]) -> np.ndarray:
        q = self._rows(body, "queries")
        if q.shape[-1] != ix.dim:
            raise WireError(400, f"queries have dimension {q.shape[-1]}, collection has {ix.dim}")
        return q

    def _options(self, body: Dict[str, Any], call: str, keys: Sequence[str]) -> Dict[str, Any]:
        allowed = set(nearline.VOCABULARY["options"][call]) | set(keys)
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise WireError(400, f"unknown {call} option(s) {', '.join(unknown)}; "
                            f"accepted: {', '.join(sorted(allowed))}")
        enc = body.get("encoding", "json")
        if enc not in ("json", "b64"):
            raise WireError(400, f"encoding must be 'json' or 'b64', got {enc!r}")
        if not isinstance(body.get("stats", False), bool):
            raise WireError(400, "stats must be true or false")
        return {k: v for k, v in body.items() if k not in keys}

    def _deadline(self, body: Dict[str, Any]) -> float:
        t = body.get("timeout")
        if t is None:
            return self.limits.deadline
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
            raise WireError(400, f"timeout must be a positive number of seconds, got {t!r}")
        return min(float(t), self.limits.deadline)

    def _search(self, name: str, body: Dict[str, Any], _query: Dict[str, List[str]]) -> Any:
        ix = self.indexes[name]
        opts = self._options(body, "search", _SEARCH_KEYS)
        q = self._queries(ix, body)
        single = q.ndim == 1
        q2 = q[None, :] if single else q
        deadline = time.monotonic() + self._deadline(body)
        parts = []
        # Chunks bound how far a batch can overrun its deadline; a chunk keeps every
        # search thread busy with several queries in flight.
        step = max(64, 16 * int(opts.get("threads") or os.cpu_count() or 1))
        for lo in range(0, len(q2), step):
            if lo and time.monotonic() > deadline:
                raise WireError(504, f"the deadline passed after {lo} of {len(q2)} queries; "
                                "send smaller batches or a longer timeout")
            parts.append(self.batchers[name].search(q2[lo:lo + step], return_stats=True, **opts))
        ids = np.concatenate([p[0] for p in parts]) if parts else np.empty((0, int(opts.get("k", 10))), np.int64)
        dists = np.concatenate([p[1] for p in parts]) if parts else np.empty(ids.shape, np.float32)
        stats = {k: np.concatenate([p[2][k] for p in parts]) for k in (parts[0][2] if parts else {})}
        self.metrics.searched(name, len(q2), stats)
        b64 = body.get("encoding") == "b64"
        if single:
            ids, dists = ids[0], dists[0]
        out: Dict[str, Any] = {"ids": encode_array(ids, b64), "distances": encode_array(dists, b64)}
        if body.get("stats"):
            out["stats"] = {k: encode_array(v, False) for k, v in stats.items()}
        return out

    def _range_search(self, name: str, body: Dict[str, Any], _query: Dict[str, List[str]]) -> Any:
        ix = self.indexes[name]
        opts = self._options(body, "range_search", _RANGE_KEYS)
        q = self._queries(ix, body)
        if "radius" not in body:
            raise WireError(400, "the body needs 'radius'")
        deadline = time.monotonic() + self._deadline(body)
        lims, ids, dists, stats = ix.range_search(q, body["radius"], return_stats=True, **opts)
        if time.monotonic() > deadline:
            raise WireError(504, "the range search ran past its deadline; send smaller batches")
        self.metrics.searched(name, len(lims) - 1, stats)
        b64 = body.get("encoding") == "b64"
        out = {"lims": encode_array(lims, b64), "ids": encode_array(ids, b64), "distances": encode_array(dists, b64)}
        if body.get("stats"):
            out["stats"] = {k: encode_array(v, False) for k, v in stats.items()}
        return out

    def _plan(self, name: str, body: Dict[str, Any], _query: Dict[str, List[str]]) -> Any:
        nq = body.get("nq", 1)
        opts = self._options({k: v for k, v in body.items() if k != "nq"}, "search", ())
        return self.indexes[name].plan_search(nq, **opts)

    def _insert(self, name: str, body: Dict[str, Any], _query: Dict[str, List[str]]) -> Any:
        ix = self.indexes[name]
        unknown = sorted(set(body) - {"vectors", "ids", "encoding"})
        if unknown:
            raise WireError(400, f"unknown insert key(s) {', '.join(unknown)}; accepted: encoding, ids, vectors")
        v = self._rows(body, "vectors")
        ids = None
        if body.get("ids") is not None:
            ids = decode_array(body["ids"], "ids", "int64", ndim=(1,), max_items=self.limits.max_batch)
        out = ix.insert(v, ids)
        self.metrics.updated(name, inserted=len(out))
        return {"ids": encode_array(out, body.get("encoding") == "b64")}

    def _delete(self, name: str, body: Dict[str, Any], _query: Dict[str, List[str]]) -> Any:
        unknown = sorted(set(body) - {"ids"})
        if unknown or "ids" not in body:
            raise WireError(400, "the body must be {\"ids\": [...]}")
        ids = decode_array(body["ids"], "ids", "int64", ndim=(1,), max_items=self.limits.max_batch)
        n = self.indexes[name].delete(ids)
        self.metrics.updated(name, deleted=n)
        return {"deleted": n}

    def _checkpoint(self, name: str, body: Dict[str, Any], _query: Dict[str, List[str]]) -> Any:
        if body:
            raise WireError(400, "checkpoint takes no options")
        return {"sequence": self.indexes[name].checkpoint()}


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    # Connections the kernel queues before they are accepted (socketserver's default of 5
    # reset clients when 32 or more connected at once).
    request_queue_size = 1024

    def __init__(self, address: Tuple[str, int], handler: Any, app: Server) -> None:
        self.app = app
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.address_family = family
        super().__init__(address, handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"nearline/{nearline.__version__}"
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.app.limits.idle_timeout)
        if self.connection.family in (socket.AF_INET, socket.AF_INET6):
            # A reply is its headers then its body: without this, Nagle's algorithm holds the
            # body until the client's delayed ACK (~40 ms a request).
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.app._register(self)

    def finish(self) -> None:
        self.server.app._unregister(self)
        try:
            super().finish()
        except OSError:
            pass

    def hang_up(self) -> None:
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.info("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._handle("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._handle("DELETE")

    def _reply(self, status: int, body: bytes, ctype: str = "application/json", extra: Sequence[Tuple[str, str]] = ()) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def send_error(self, code: int, message: Optional[str] = None, explain: Optional[str] = None) -> None:
        """http.server's own refusals (a malformed request line or header) as JSON too."""
        self.close_connection = True
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":
            self.request_version = "HTTP/1.1"  # answer with a status line and headers, never HTTP/0.9
        try:
            self._error(code, message or explain or "malformed request")
        except OSError:
            pass

    def _error(self, status: int, message: str, kind: str = "ValueError") -> None:
        if not getattr(self, "_consumed", True):
            # The body was never read: the connection cannot carry another request.
            self.close_connection = True
        extra = [("WWW-Authenticate", 'Bearer realm="nearline"')] if status == 401 else []
        self._reply(status, dumps({"error": message, "type": kind, "status": status}), extra=extra)

    def _handle(self, method: str) -> None:
        app = self.server.app
        accepted = app._enter(self)
        started = time.perf_counter()
        # Whether the request's body (if any) has been read off the connection.
        self._consumed = (self.headers.get("Content-Length", "0").strip() == "0"
                          and not self.headers.get("Transfer-Encoding"))
        op, name, status = "unknown", None, 500
        try:
            if not accepted:
                self.close_connection = True
                status = 503
                self._error(503, "the server is shutting down")
                return
            url = urlsplit(self.path)
            path, query = url.path, parse_qs(url.query)
            if method == "GET" and path == "/health":
                op, status = "health", 200
                self._reply(200, dumps({"status": "draining" if app.draining else "ok",
                                        "collections": sorted(app.indexes)}))
                return
            if method == "GET" and path == "/openapi.json":
                op, status = "openapi", 200
                self._reply(200, dumps(app.openapi))
                return
            scope_needed: Optional[str] = "read"
            fn: Optional[Callable[..., Any]] = None
            if path == "/metrics":
                if method != "GET":
                    raise WireError(405, "/metrics takes GET")
                op = "metrics"
            else:
                op, name, scope_needed, fn = app.route(method, path)
            if app.tokens.enabled:
                got = app.tokens.scope(self.headers.get("Authorization"))
                if got is None:
                    raise WireError(401, "a valid bearer token is needed (Authorization: Bearer TOKEN)", "PermissionError")
                if scope_needed == "write" and got != "write":
                    raise WireError(403, f"a read-only token cannot {op}", "PermissionError")
            if fn is None:
                status = 200
                self._reply(200, app.metrics.exposition(), ctype=server_metrics.CONTENT_TYPE)
                return
            body = self._body(method)
            if not app._slots.acquire(timeout=app.limits.deadline):
                raise WireError(503, "the server is busy: every request slot stayed taken past the deadline")
            try:
                result = fn(name, body, query)
            finally:
                app._slots.release()
            status = 200
            self._reply(200, dumps(result))
        except WireError as e:
            status = e.status
            self._error(e.status, str(e), e.kind)
        except TypeError as e:
            status = 400
            self._error(400, str(e), "TypeError")
        except (ValueError, OverflowError) as e:
            status = 400
            self._error(400, str(e), "ValueError")
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - a request never takes the server down
            status = 500
            log.exception("%s %s", method, self.path)
            self._error(500, f"{type(e).__name__}: {e}", type(e).__name__)
        finally:
            app.metrics.request(name or "", op, status, time.perf_counter() - started)
            app._leave(self)

    def _body(self, method: str) -> Dict[str, Any]:
        if method == "GET" and self._consumed:
            return {}
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise WireError(411, "send the body with a Content-Length (chunked transfer is not accepted)")
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            self.close_connection = True
            raise WireError(411, "a POST needs a Content-Length")
        try:
            length = int(length_text)
        except ValueError:
            self.close_connection = True
            raise WireError(400, f"Content-Length {length_text!r} is not an integer") from None
        if length < 0:
            self.close_connection = True
            raise WireError(400, "Content-Length must not be negative")
        limit = self.server.app.limits.max_body
        if length > limit:
            # The body is left unread, so the connection cannot carry another request.
            self.close_connection = True
            raise WireError(413, f"a body of {length} bytes exceeds this server's limit of {limit}")
        ctype = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip().lower()
        data = self.rfile.read(length)
        self._consumed = True
        if len(data) != length:
            self.close_connection = True
            raise WireError(400, f"the body ended after {len(data)} of {length} bytes")
        if ctype != "application/json":
            raise WireError(415, f"send application/json, not {ctype}")
        if length == 0:
            return {}
        return loads(data)


def _openapi(app: Server) -> Dict[str, Any]:
    """The OpenAPI 3.1 description, each option's JSON schema generated from the engine's
    (``nearline.SCHEMA``)."""
    array = {"oneOf": [{"type": "array"}, {"type": "object", "required": ["dtype", "shape", "b64"],
                                           "properties": {"dtype": {"enum": ["float32", "int64"]},
                                                          "shape": {"type": "array", "items": {"type": "integer"}},
                                                          "b64": {"type": "string"}}}]}

    def options(call: str, extra: Dict[str, Any], required: List[str]) -> Dict[str, Any]:
        props = {o["name"]: option_schema(o, nearline.VOCABULARY)
                 for o in nearline.SCHEMA["options"] if call in o["stages"]}
        props.update(extra)
        return {"type": "object", "properties": props, "required": required, "additionalProperties": False}

    common = {"queries": array, "stats": {"type": "boolean"}, "encoding": {"enum": ["json", "b64"]},
              "timeout": {"type": "number", "exclusiveMinimum": 0}}

    def post(summary: str, schema: Dict[str, Any], scope: str) -> Dict[str, Any]:
        return {"post": {"summary": summary, "x-scope": scope,
                         "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
                         "responses": _responses()}}

    def get(summary: str, scope: Optional[str]) -> Dict[str, Any]:
        return {"get": {"summary": summary, "x-scope": scope, "responses": _responses()}}

    c = "/v1/collections/{name}"
    paths = {
        "/health": get("liveness and the collections served (no token)", None),
        "/metrics": get("Prometheus metrics", "read"),
        "/v1/collections": get("the collections served", "read"),
        c: get("a collection's info(): sizes, memory held vs budget, plan, updates", "read"),
        c + "/ids": get("live ids (?encoding=b64 for base64)", "read"),
        c + "/search": post("k-nearest-neighbour search (a batch)", options("search", common, ["queries"]), "read"),
        c + "/range_search": post("range search", options(
            "range_search", {**common, "radius": {"type": "number"}}, ["queries", "radius"]), "read"),
        c + "/plan": post("the plan a search with these options gets", options(
            "search", {"nq": {"type": "integer", "minimum": 1}}, []), "read"),
        c + "/insert": post("insert vectors (acknowledged once in the write-ahead log)", {
            "type": "object", "required": ["vectors"], "additionalProperties": False,
            "properties": {"vectors": array, "ids": array, "encoding": {"enum": ["json", "b64"]}}}, "write"),
        c + "/delete": post("delete ids", {"type": "object", "required": ["ids"], "additionalProperties": False,
                                           "properties": {"ids": array}}, "write"),
        c + "/checkpoint": post("make updates part of the index files and trim the log",
                                {"type": "object", "additionalProperties": False}, "write"),
    }
    return {"openapi": "3.1.0",
            "info": {"title": "nearline", "version": nearline.__version__,
                     "description": "Disk-resident vector search. Arrays are JSON lists or base64 objects."},
            "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
            "security": [{"bearer": []}] if app.tokens.enabled else [],
            "paths": paths}


def _responses() -> Dict[str, Any]:
    err = {"description": "refused: {error, type, status}"}
    return {"200": {"description": "ok"}, "400": err, "401": err, "403": err, "404": err, "413": err,
            "503": err, "504": err}


def serve(specs: Sequence[str], *, host: str = "127.0.0.1", port: int = 8080, token_file: Optional[str] = None,
          limits: Optional[Limits] = None, allow_no_auth: bool = False, ready: Optional[Callable[[Server], None]] = None,
          **open_options: Any) -> int:
    """Opens each index (``NAME=PATH`` or ``PATH``) and serves them until SIGTERM/SIGINT."""
    collections = parse_collections(specs)
    tokens = Tokens.load(token_file)
    indexes: Dict[str, nearline.Index] = {}
    try:
        for name, path in collections:
            indexes[name] = nearline.open(path, **{k: v for k, v in open_options.items() if v is not None})
        server = Server(indexes, host=host, port=port, tokens=tokens, limits=limits, allow_no_auth=allow_no_auth)
    except BaseException:
        for ix in indexes.values():
            ix.close()
        raise
    auth = f"{len(tokens.read)} read and {len(tokens.write)} write token(s)" if tokens.enabled else "no auth (loopback)"
    print(f"nearline: serving {', '.join(sorted(indexes))} on {server.url} ({auth})", flush=True)
    if ready is not None:
        ready(server)
    server.serve_forever()
    print("nearline: stopped", file=sys.stderr, flush=True)
    return 0
