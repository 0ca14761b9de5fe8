"""``nearline.Client``: an index served by ``nearline serve``, with the local index's methods.

``Client(url, token).search(q, k=10, L=100)`` returns what ``nearline.open(path).search(q,
k=10, L=100)`` returns (the same arrays, bit for bit), and raises what it raises (``ValueError``
for bad input, ``TypeError`` for a wrongly typed option), so code moves between a local and
a remote index without change. Arrays travel as base64 (exact); connections are kept alive,
one per thread. Only the standard library is used.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any, Dict, List, Optional, Tuple, Union
from urllib.parse import quote, urlsplit

import numpy as np

from .server_wire import decode_array, encode_array

#: The environment variable a client reads its token from when none is given.
TOKEN_ENV = "NEARLINE_TOKEN"
_UNLIMITED = 1 << 62
# A connection idle longer than this is reopened before a write, so a write is never sent
# on a connection the server may have closed meanwhile (which would leave its fate unknown).
_FRESH_FOR_WRITE = 20.0


class ServerError(RuntimeError):
    """The server failed or refused for a reason of its own (5xx: busy, shutting down,
    deadline passed, an internal error). ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def _raise(status: int, payload: Dict[str, Any]) -> None:
    msg = str(payload.get("error", payload))
    kind = payload.get("type")
    if status in (401, 403):
        raise PermissionError(msg)
    if status == 404:
        raise LookupError(msg)
    if status < 500:
        if kind == "TypeError":
            raise TypeError(msg)
        raise ValueError(msg)
    if status == 504:
        raise TimeoutError(msg)
    raise ServerError(status, msg)


class _ProtocolError(Exception):
    """A reply that is cut short or is not HTTP/1.1."""


class _Connection:
    """One kept-alive HTTP/1.1 connection: a request goes out in one send, the reply is read
    by its Content-Length (or chunks, or to the end). Lean on purpose: ``http.client`` costs
    several hundred Python calls a request (its header parser), which the two cores a search
    runs on pay for."""

    def __init__(self, scheme: str, host: str, port: int, timeout: float) -> None:
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if scheme == "https":
            import ssl

            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        self.sock = sock
        self.buf = bytearray()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise _ProtocolError("the server closed the connection")
        self.buf += chunk

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def _line(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) < 0:
            self._fill()
        return self._take(end + 2)[:-2]

    def exchange(self, request: bytes) -> Tuple[int, Dict[str, str], bytes]:
        """Sends one request; returns the reply's status, headers (lower-case names) and body."""
        self.sock.sendall(request)
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            if len(self.buf) > 1 << 20:
                raise _ProtocolError("the reply's head exceeds 1 MiB")
            self._fill()
        lines = self._take(end + 4)[:-4].decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise _ProtocolError(f"not an HTTP/1.1 reply: {lines[0][:80]!r}")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while (size := int(self._line().split(b";")[0], 16)) > 0:
                parts.append(self._take(size))
                self._line()
            while self._line():  # trailers, then the blank line
                pass
            body = b"".join(parts)
        elif "content-length" in headers:
            body = self._take(int(headers["content-length"]))
        else:
            try:
                while True:
                    self._fill()
            except _ProtocolError:
                pass
            body, self.buf = bytes(self.buf), bytearray()
            headers["connection"] = "close"
        return int(code), headers, body


class _Transport:
    """HTTP/1.1 with keep-alive, one connection per thread."""

    def __init__(self, url: str, token: Optional[str], timeout: float) -> None:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"url must be http://HOST:PORT or https://HOST:PORT, got {url!r}")
        self.scheme, self.host = u.scheme, u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._local = threading.local()
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._host_header = host if u.port is None else f"{host}:{u.port}"

    def _conn(self, fresh: bool) -> _Connection:
        c = getattr(self._local, "conn", None)
        if c is not None and (fresh and time.monotonic() - self._local.used > _FRESH_FOR_WRITE):
            c.close()
            c = None
        if c is None:
            c = _Connection(self.scheme, self.host, self.port, self.timeout)
            self._local.conn = c
        return c

    def _drop(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
        self._local.conn = None

    def request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None, *, idempotent: bool,
                text: bool = False) -> Any:
        data = b"" if body is None else json.dumps(body, allow_nan=False).encode()
        head = [f"{method} {self.prefix + path} HTTP/1.1", f"Host: {self._host_header}", "Accept: application/json"]
        if body is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
        if self.token:
            head.append(f"Authorization: Bearer {self.token}")
        request = ("\r\n".join(head) + "\r\n\r\n").encode() + data
        for attempt in (0, 1):
            conn = self._conn(fresh=not idempotent)
            try:
                status, headers, raw = conn.exchange(request)
            except (_ProtocolError, ConnectionResetError, BrokenPipeError, ValueError) as e:
                # A reply cut short, a connection the server closed, a garbled reply...
                self._drop()
                if idempotent and attempt == 0:
                    continue  # a kept-alive connection the server had closed: retry once
                raise ConnectionError(f"{method} {path}: the connection failed ({e}); "
                                      + ("" if idempotent else "the write may or may not have been applied")) from e
            except OSError:
                self._drop()
                raise
            self._local.used = time.monotonic()
            if headers.get("connection", "").lower() == "close":
                self._drop()
            if text and status < 400:
                return raw.decode()
            try:
                payload = json.loads(raw.decode()) if raw else {}
            except ValueError:
                payload = {"error": raw[:200].decode(errors="replace")}
            if status >= 400:
                _raise(status, payload if isinstance(payload, dict) else {"error": payload})
            return payload
        raise AssertionError("unreachable")


def _arr(value: Any, name: str, dtype: str, missing: Optional[float] = None) -> np.ndarray:
    return decode_array(value, name, dtype, ndim=(1, 2), max_items=_UNLIMITED, missing=missing)


class RemoteIndex:
    """One served collection, with :class:`nearline.Index`'s methods."""

    def __init__(self, transport: _Transport, name: str) -> None:
        self._t = transport
        self.name = name
        self._summary: Optional[Dict[str, Any]] = None

    def _url(self, suffix: str = "") -> str:
        return f"/v1/collections/{quote(self.name, safe='')}{suffix}"

    def _meta(self) -> Dict[str, Any]:
        if self._summary is None:
            info = self.info()
            self._summary = {k: info[k] for k in ("kind", "dim", "metric", "dtype")}
        return self._summary

    @property
    def kind(self) -> str:
        return str(self._meta()["kind"])

    @property
    def dim(self) -> int:
        return int(self._meta()["dim"])

    @property
    def metric(self) -> str:
        return str(self._meta()["metric"])

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._meta()["dtype"])

    @property
    def n(self) -> int:
        return int(self.info()["live"])

    def __len__(self) -> int:
        return self.n

    def _missing(self) -> float:
        return float("inf") if self.metric == "l2" else float("-inf")

    def search(self, queries: Any, k: Optional[int] = None, *, return_stats: bool = False, timeout: Optional[float] = None,
               **options: Any) -> Union[Tuple[np.ndarray, np.ndarray], Tuple[np.ndarray, np.ndarray, Dict[str, np.ndarray]]]:
        """:meth:`nearline.Index.search` on the server (``timeout``: seconds, at most the server's deadline)."""
        body = {"queries": _queries(queries), "stats": bool(return_stats), "encoding": "b64",
                **{key: v for key, v in {"k": k, **options}.items() if v is not None}}
        if timeout is not None:
            body["timeout"] = timeout
        r = self._t.request("POST", self._url("/search"), body, idempotent=True)
        ids = _arr(r["ids"], "ids", "int64")
        dists = _arr(r["distances"], "distances", "float32", missing=self._missing())
        if return_stats:
            return ids, dists, {key: _stat(v) for key, v in r.get("stats", {}).items()}
        return ids, dists

    def range_search(self, queries: Any, radius: float, *, return_stats: bool = False,
                     timeout: Optional[float] = None, **options: Any) -> Any:
        """:meth:`nearline.Index.range_search` on the server."""
        body = {"queries": _queries(queries), "radius": radius, "stats": bool(return_stats), "encoding": "b64",
                **{key: v for key, v in options.items() if v is not None}}
        if timeout is not None:
            body["timeout"] = timeout
        r = self._t.request("POST", self._url("/range_search"), body, idempotent=True)
        out = (_arr(r["lims"], "lims", "int64"), _arr(r["ids"], "ids", "int64"),
               _arr(r["distances"], "distances", "float32"))
        if return_stats:
            return (*out, {key: _stat(v) for key, v in r.get("stats", {}).items()})
        return out

    def plan_search(self, nq: int = 1, **options: Any) -> Dict[str, Any]:
        return self._t.request("POST", self._url("/plan"), {"nq": nq, **options}, idempotent=True)

    def insert(self, vectors: Any, ids: Any = None) -> np.ndarray:
        """:meth:`nearline.Index.insert` on the server: when it returns, the insert is in the
        server's write-ahead log. A failed connection raises ``ConnectionError`` and the
        write is not retried (it may or may not have been applied)."""
        body: Dict[str, Any] = {"vectors": _matrix(vectors, "vectors"), "encoding": "b64"}
        if ids is not None:
            body["ids"] = _ids(ids)
        r = self._t.request("POST", self._url("/insert"), body, idempotent=False)
        return _arr(r["ids"], "ids", "int64")

    def delete(self, ids: Any) -> int:
        r = self._t.request("POST", self._url("/delete"), {"ids": _ids(ids)}, idempotent=False)
        return int(r["deleted"])

    def checkpoint(self) -> int:
        return int(self._t.request("POST", self._url("/checkpoint"), {}, idempotent=False)["sequence"])

    def info(self) -> Dict[str, Any]:
        return self._t.request("GET", self._url(), idempotent=True)

    def ids(self) -> np.ndarray:
        r = self._t.request("GET", self._url("/ids?encoding=b64"), idempotent=True)
        return _arr(r["ids"], "ids", "int64")

    def close(self) -> None:
        """Closes this thread's connection (the served index stays open)."""
        self._t.close()

    def __enter__(self) -> "RemoteIndex":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<nearline.RemoteIndex {self.name!r}>"


class Client(RemoteIndex):
    """A connection to ``nearline serve``. Used as an index it is the server's only
    collection (or the one named by ``collection``); :meth:`collection` gives the others.

    Args:
        url: ``http://HOST:PORT`` (or ``https://`` behind a TLS proxy).
        token: a bearer token (default: the ``NEARLINE_TOKEN`` environment variable).
        collection: the collection this client's index methods use.
        timeout: socket timeout in seconds.
    """

    def __init__(self, url: str, token: Optional[str] = None, *, collection: Optional[str] = None,
                 timeout: float = 120.0) -> None:
        if token is None:
            token = os.environ.get(TOKEN_ENV) or None
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.url = url
        t = _Transport(url, token, float(timeout))
        super().__init__(t, collection or "")

    def health(self) -> Dict[str, Any]:
        return self._t.request("GET", "/health", idempotent=True)

    def collections(self) -> List[Dict[str, Any]]:
        return list(self._t.request("GET", "/v1/collections", idempotent=True)["collections"])

    def collection(self, name: str) -> RemoteIndex:
        return RemoteIndex(self._t, name)

    def metrics(self) -> str:
        """The Prometheus text the server exports."""
        return str(self._t.request("GET", "/metrics", idempotent=True, text=True))

    def _url(self, suffix: str = "") -> str:
        if not self.name:
            names = [c["name"] for c in self.collections()]
            if len(names) != 1:
                raise ValueError(f"the server has {len(names)} collections ({', '.join(names)}): "
                                 "give Client(..., collection=NAME) or use client.collection(NAME)")
            self.name = names[0]
        return super()._url(suffix)

    def __repr__(self) -> str:
        return f"<nearline.Client {self.url} {self.name or '(collection not chosen yet)'}>"


def _queries(q: Any) -> Dict[str, Any]:
    a = np.asarray(q)
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)) or a.dtype == np.bool_:
        raise ValueError(f"queries have dtype {a.dtype}; expected a numeric array")
    if a.ndim not in (1, 2):
        raise ValueError(f"queries must be 1-D or 2-D, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError("queries hold a non-finite value")
    return encode_array(a.astype(np.float32), True)


def _matrix(v: Any, name: str) -> Dict[str, Any]:
    a = np.asarray(v)
    if a.dtype == np.bool_ or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"{name} have dtype {a.dtype}; expected a float or integer array")
    if a.ndim not in (1, 2):
        raise ValueError(f"{name} must have shape (n, dim) or (dim,), got {a.shape}")
    return encode_array(a.astype(np.float32), True)


def _ids(ids: Any) -> Dict[str, Any]:
    a = np.asarray(ids)
    if a.ndim == 0:
        a = a[None]
    if a.size == 0:
        a = a.astype(np.int64)
    if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"ids must be a 1-D integer array, got dtype {a.dtype} shape {a.shape}")
    if a.dtype == np.uint64 and a.size and int(a.max()) >= 1 << 63:
        raise ValueError("ids must be below 2**63")
    return encode_array(a.astype(np.int64), True)


def _stat(v: Any) -> np.ndarray:
    if isinstance(v, dict):
        return decode_array(v, "stats", v["dtype"], ndim=(1, 2), max_items=_UNLIMITED)
    return np.asarray(v)
