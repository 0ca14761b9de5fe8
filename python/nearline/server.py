"""``nearline serve``: indexes served over HTTP/JSON, with bearer-token auth, limits and metrics.

The transport is Rust (``crates/nearline-http``: hyper on tokio, started through the
bindings): it accepts connections, routes, checks tokens and limits, and answers ``search``
and ``range_search`` itself, without Python or the GIL, on blocking threads that call the
engine directly. The other endpoints (info, ids, plan, insert, delete, checkpoint, the
collection list, the metrics) come back here, to :meth:`Server._delegate`, after the same
routing, auth and limits. ``docs/serving.md`` has the measured cost against searching
in-process.

Endpoints (``/openapi.json`` describes them, with every search option and its type):

- ``GET /health`` (no token): ``{"status": "ok", "collections": [...]}``.
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
batch, values per array, a deadline, requests at once); a malformed request gets a 4xx
with the reason and never reaches the index. SIGTERM (or SIGINT) drains: new requests get
503, requests in flight finish (an acknowledged write is in the index's log), then the
indexes close.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import signal
import stat
import sys
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import parse_qs

import numpy as np

import nearline

from . import _nearline, server_metrics
from .server_wire import WireError, decode_array, dumps, encode_array, loads, option_schema

log = logging.getLogger("nearline.server")

SCOPES = ("read", "write")
#: The environment variable holding tokens (``SCOPE:TOKEN`` entries, as in a token file).
TOKENS_ENV = "NEARLINE_TOKENS"
MIN_TOKEN_CHARS = 16
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass
class Limits:
    """What one request may ask: body bytes, rows (queries or vectors) per batch, values per
    array, and the longest a search may run (seconds) before it is answered 504 (also the
    longest a request waits for one of the ``max_concurrent`` request slots before a 503);
    ``idle_timeout``: a connection that sends nothing for this long is closed; ``grace``: how
    long a drain waits for requests in flight."""

    max_body: int = 64 << 20
    max_batch: int = 10_000
    max_values: int = 16 << 20
    deadline: float = 30.0
    max_concurrent: int = 64
    idle_timeout: float = 120.0
    grace: float = 30.0

    def check(self) -> "Limits":
        for name in ("max_body", "max_batch", "max_values", "max_concurrent"):
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
    """Collections (opened indexes) served over HTTP. The server listens from construction;
    ``start()`` begins collecting its metrics in a background thread (tests, embedding);
    ``serve_forever()`` serves until SIGTERM/SIGINT or :meth:`stop`. Use :func:`serve` for
    the CLI's behaviour."""

    def __init__(self, indexes: Dict[str, "nearline.Index"], *, host: str = "127.0.0.1", port: int = 8080,
                 tokens: Optional[Tokens] = None, limits: Optional[Limits] = None,
                 allow_no_auth: bool = False, io_threads: int = 2) -> None:
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
        if isinstance(io_threads, bool) or not isinstance(io_threads, int) or io_threads < 1:
            raise ValueError(f"io_threads={io_threads!r} must be a positive integer")
        self.indexes = dict(indexes)
        self.metrics = server_metrics.Metrics(self.indexes)
        self._ops: Dict[str, Callable[..., Any]] = {
            "collections": self._list, "info": self._info, "ids": self._ids, "plan": self._plan,
            "insert": self._insert, "delete": self._delete, "checkpoint": self._checkpoint,
        }
        self.openapi = _openapi(self)
        self._front = _nearline.HttpServer(
            "127.0.0.1" if host == "localhost" else host, port,
            {name: ix._raw for name, ix in self.indexes.items()},
            list(self.tokens.read), list(self.tokens.write), asdict(self.limits), dumps(self.openapi),
            self._delegate, f"nearline/{nearline.__version__}", io_threads)
        self._stopped = threading.Event()
        self._pump_thread: Optional[threading.Thread] = None
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def address(self) -> Tuple[str, int]:
        host, port = self._front.address
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    @property
    def draining(self) -> bool:
        return bool(self._front.draining)

    def start(self) -> "Server":
        """Collects the front end's request events into the metrics every 0.2 s (a scrape of
        ``/metrics`` collects them first too)."""
        if self._pump_thread is None:
            self._pump_thread = threading.Thread(target=self._pump_loop, name="nearline-metrics", daemon=True)
            self._pump_thread.start()
        return self

    def _pump_loop(self) -> None:
        while not self._stopped.wait(0.2):
            self._pump()

    def _pump(self) -> None:
        """Moves the requests the front end answered since the last call into the metrics."""
        events, dropped = self._front.take_events()
        self.metrics.answered(events, dropped)
        self.metrics.in_flight.set(self._front.in_flight)

    def stop(self, close_indexes: bool = True) -> None:
        """Drains and stops: new requests get 503, requests in flight finish (up to the
        grace period), idle connections close, then (by default) the indexes close."""
        if self._closed:
            return
        self._closed = True
        self._front.stop()
        self._stopped.set()
        if self._pump_thread is not None:
            self._pump_thread.join()
            self._pump_thread = None
        self._pump()
        if close_indexes:
            for ix in self.indexes.values():
                try:
                    ix.close()
                except Exception as e:  # noqa: BLE001 - report and go on closing the others
                    log.warning("closing %s: %s", ix.path, e)

    def serve_forever(self) -> None:
        """Serves until SIGTERM or SIGINT (main thread only), then drains and closes."""
        signalled = threading.Event()

        def on_signal(signum: int, _frame: Any) -> None:
            log.warning("signal %d: draining", signum)
            self._front.begin_drain()
            signalled.set()

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            while not signalled.wait(0.2) and not self._closed:
                self._pump()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            self.stop(close_indexes=True)

    # -- the endpoints the Rust front end hands over ------------------------------------------
    def _delegate(self, op: str, name: Optional[str], body: bytes, query: str) -> Tuple[int, str, bytes]:
        """Answers ``op`` (routed, authorised and within the body limit already):
        ``(status, content type, body)``; never raises."""
        try:
            if op == "metrics":
                self._pump()
                return 200, server_metrics.CONTENT_TYPE, self.metrics.exposition()
            fn = self._ops[op]
            return 200, "application/json", dumps(fn(name, loads(body) if body else {}, parse_qs(query)))
        except WireError as e:
            return e.status, "application/json", _error(e.status, str(e), e.kind)
        except TypeError as e:
            return 400, "application/json", _error(400, str(e), "TypeError")
        except (ValueError, OverflowError) as e:
            return 400, "application/json", _error(400, str(e), "ValueError")
        except Exception as e:  # noqa: BLE001 - a request never takes the server down
            log.exception("%s %s", op, name)
            return 500, "application/json", _error(500, f"{type(e).__name__}: {e}", type(e).__name__)

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
        """The float32 rows under ``key``: one row or a matrix, within the server's value and
        batch limits."""
        if key not in body:
            raise WireError(400, f"the body needs '{key}' (a list, a list of lists or a base64 array)")
        a = decode_array(body[key], key, "float32", ndim=(1, 2), max_items=self.limits.max_values)
        rows = a.shape[0] if a.ndim == 2 else 1
        if rows > self.limits.max_batch:
            raise WireError(413, f"{rows} {key} exceed this server's batch limit of {self.limits.max_batch}")
        return a

    def _plan(self, name: str, body: Dict[str, Any], _query: Dict[str, List[str]]) -> Any:
        nq = body.get("nq", 1)
        opts = {k: v for k, v in body.items() if k != "nq"}
        allowed = set(nearline.VOCABULARY["options"]["search"])
        unknown = sorted(set(opts) - allowed)
        if unknown:
            raise WireError(400, f"unknown search option(s) {', '.join(unknown)}; "
                            f"accepted: {', '.join(sorted(allowed))}")
        return self.indexes[name].plan_search(nq, **opts)

    def _insert(self, name: str, body: Dict[str, Any], _query: Dict[str, List[str]]) -> Any:
        ix = self.indexes[name]
        unknown = sorted(set(body) - {"vectors", "ids", "encoding"})
        if unknown:
            raise WireError(400, f"unknown insert key(s) {', '.join(unknown)}; accepted: encoding, ids, vectors")
        enc = body.get("encoding", "json")
        if enc not in ("json", "b64"):
            raise WireError(400, f"encoding must be 'json' or 'b64', got {enc!r}")
        v = self._rows(body, "vectors")
        ids = None
        if body.get("ids") is not None:
            ids = decode_array(body["ids"], "ids", "int64", ndim=(1,), max_items=self.limits.max_batch)
        out = ix.insert(v, ids)
        self.metrics.updated(name, inserted=len(out))
        return {"ids": encode_array(out, enc == "b64")}

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


def _error(status: int, message: str, kind: str) -> bytes:
    return dumps({"error": message, "type": kind, "status": status})


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
          io_threads: int = 2, **open_options: Any) -> int:
    """Opens each index (``NAME=PATH`` or ``PATH``) and serves them until SIGTERM/SIGINT."""
    collections = parse_collections(specs)
    tokens = Tokens.load(token_file)
    indexes: Dict[str, nearline.Index] = {}
    try:
        for name, path in collections:
            indexes[name] = nearline.open(path, **{k: v for k, v in open_options.items() if v is not None})
        server = Server(indexes, host=host, port=port, tokens=tokens, limits=limits, allow_no_auth=allow_no_auth,
                        io_threads=io_threads)
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
