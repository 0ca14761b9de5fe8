"""``nearline serve`` and ``nearline.Client`` end to end on loopback: results equal the
in-process index's, updates are seen at once, auth scopes hold, malformed or fuzzed requests
get a 4xx and the server keeps serving, SIGTERM during an insert stream loses no
acknowledged insert, and the command line refuses unsafe setups."""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import nearline
from conftest import clustered, exact_knn
from nearline.client import Client
from nearline.server import Limits, Server, Tokens

DIM = 16
READ = "r" * 8 + "-read-token-0001"
WRITE = "w" * 8 + "-write-token-001"
BUILD = dict(R=24, build_L=48, threads=2, memory_budget="4MB")


@pytest.fixture(scope="module")
def data():
    return clustered(3000, DIM, seed=41, queries=40)


@pytest.fixture(scope="module")
def built(tmp_path_factory, data):
    """A graph index and a partition index over the same vectors (built once; tests copy them)."""
    base, _ = data
    root = tmp_path_factory.mktemp("served")
    nearline.build(base, root / "graph", preset="diskann", **BUILD).close()
    nearline.build(base, root / "part", preset="spfresh", threads=2).close()
    return root


def _copy(built, tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(built / name, dst)
    return dst


@pytest.fixture()
def served(built, tmp_path):
    """A server on loopback with read and write tokens over copies of both indexes."""
    indexes = {n: nearline.open(_copy(built, tmp_path, n)) for n in ("graph", "part")}
    srv = Server(indexes, port=0, tokens=Tokens(read=[READ], write=[WRITE]),
                 limits=Limits(max_batch=500, max_body=4 << 20)).start()
    yield srv
    srv.stop()


def _raw(srv, method, path, body=None, token=WRITE, headers=None):
    """One request on a fresh connection: (status, parsed JSON or text)."""
    host, port = srv.address
    c = http.client.HTTPConnection(host, port, timeout=30)
    h = {"Content-Type": "application/json"}
    if token:
        h["Authorization"] = f"Bearer {token}"
    h.update(headers or {})
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    c.request(method, path, body=data, headers=h)
    r = c.getresponse()
    raw = r.read()
    c.close()
    try:
        return r.status, json.loads(raw)
    except ValueError:
        return r.status, raw.decode(errors="replace")


@pytest.mark.parametrize("name", ["graph", "part"])
def test_client_search_equals_the_in_process_index(served, data, name):
    _, queries = data
    local = served.indexes[name]
    remote = Client(served.url, READ, collection=name)
    for k, opts in ((10, {"L": 64}), (5, {}), (3000 + 7, {"L": 3100})):
        want = local.search(queries, k=k, **opts)
        got = remote.search(queries, k=k, **opts)
        assert got[0].dtype == np.int64 and got[1].dtype == np.float32
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])  # inf slots included (k > n)
    one_local = local.search(queries[0], k=4)
    one_remote = remote.search(queries[0], k=4)
    np.testing.assert_array_equal(one_remote[0], one_local[0])
    assert one_remote[0].shape == (4,)
    # JSON lists travel too, with the same answer.
    status, body = _raw(served, "POST", f"/v1/collections/{name}/search",
                        {"queries": queries[:3].tolist(), "k": 5}, token=READ)
    assert status == 200
    np.testing.assert_array_equal(np.array(body["ids"]), local.search(queries[:3], k=5)[0])
    if name == "graph":
        lims, ids, dists = remote.range_search(queries[:4], 40.0)
        wl, wi, wd = local.range_search(queries[:4], 40.0)
        np.testing.assert_array_equal(lims, wl)
        np.testing.assert_array_equal(ids, wi)
        np.testing.assert_array_equal(dists, wd)


@pytest.mark.parametrize("name", ["graph", "part"])
def test_insert_is_found_and_delete_is_never_returned(served, data, name):
    base, queries = data
    c = Client(served.url, WRITE, collection=name)
    rng = np.random.default_rng(3)
    new = (queries[:5] + rng.normal(0, 0.01, size=(5, DIM))).astype(np.float32)
    ids = c.insert(new, ids=np.arange(10_000, 10_005))
    assert ids.tolist() == list(range(10_000, 10_005))
    found, dists = c.search(new, k=1, L=64)
    assert found[:, 0].tolist() == ids.tolist()
    assert np.allclose(dists[:, 0], 0.0, atol=1e-4)
    assert c.n == len(base) + 5
    # Delete each query's true nearest neighbours among the original vectors: none comes back.
    victims = exact_knn(base, queries[5:15], 3).ravel()
    assert c.delete(victims) == len(set(victims.tolist()))
    assert c.delete(victims) == 0
    got, _ = c.search(queries[5:15], k=10, L=64)
    assert not set(got.ravel().tolist()) & set(victims.tolist())
    assert not set(c.ids().tolist()) & set(victims.tolist())
    with pytest.raises(ValueError, match="already in the index"):
        c.insert(new[:1], ids=[10_000])  # a live id: refused as locally
    assert c.checkpoint() >= 0
    got, _ = c.search(queries[5:15], k=10, L=64)
    assert not set(got.ravel().tolist()) & set(victims.tolist())


def test_auth_scopes(served, data):
    _, queries = data
    assert _raw(served, "GET", "/health", token=None)[0] == 200
    assert _raw(served, "GET", "/openapi.json", token=None)[0] == 200
    status, body = _raw(served, "POST", "/v1/collections/graph/search", {"queries": queries[0].tolist()}, token=None)
    assert status == 401 and "token" in body["error"]
    assert _raw(served, "POST", "/v1/collections/graph/search", {"queries": queries[0].tolist()},
                token="x" * 20)[0] == 401
    assert _raw(served, "GET", "/metrics", token=None)[0] == 401
    # Only a bearer token is a token.
    assert _raw(served, "GET", "/v1/collections", token=None, headers={"Authorization": f"Basic {READ}"})[0] == 401
    reader = Client(served.url, READ, collection="graph")
    reader.search(queries[:2])
    n = reader.n
    with pytest.raises(PermissionError, match="read-only"):
        reader.insert(queries[:1])
    with pytest.raises(PermissionError):
        reader.delete([1])
    with pytest.raises(PermissionError):
        reader.checkpoint()
    assert reader.n == n
    with pytest.raises(PermissionError):
        Client(served.url, None, collection="graph").search(queries[:1])
    writer = Client(served.url, WRITE, collection="graph")
    assert writer.delete([1]) == 1


def _still_serving(srv, queries):
    c = Client(srv.url, READ, collection="graph")
    ids, _ = c.search(queries[:2], k=3)
    assert ids.shape == (2, 3)
    assert c.health()["status"] == "ok"


def test_malformed_requests_get_4xx_and_the_server_keeps_serving(served, data):
    base, queries = data
    graph = served.indexes["graph"]
    n0 = graph.n
    search = "/v1/collections/graph/search"
    cases = [
        ("POST", search, b"{not json", 400),
        ("POST", search, b"[1, 2]", 400),
        ("POST", search, b'{"queries": [NaN, 1]}', 400),
        ("POST", search, b'{"queries": [Infinity]}', 400),
        ("POST", search, b"\xff\xfe", 400),
        ("POST", search, {"queries": [1.0] * (DIM + 1)}, 400),
        ("POST", search, {"queries": [[1.0] * DIM, [1.0] * 3]}, 400),
        ("POST", search, {"queries": [["a"] * DIM]}, 400),
        ("POST", search, {"queries": [True] * DIM}, 400),
        ("POST", search, {"queries": [1.0] * DIM, "bogus": 1}, 400),
        ("POST", search, {"queries": [1.0] * DIM, "L": "many"}, 400),
        ("POST", search, {"queries": [1.0] * DIM, "k": 0}, 400),
        ("POST", search, {"queries": [1.0] * DIM, "k": -3}, 400),
        ("POST", search, {"queries": [1.0] * DIM, "timeout": -1}, 400),
        ("POST", search, {"queries": [1.0] * DIM, "encoding": "xml"}, 400),
        ("POST", search, {"k": 10}, 400),
        ("POST", search, {"queries": {"dtype": "float32", "shape": [1, DIM], "b64": "AAAA"}}, 400),
        ("POST", search, {"queries": {"dtype": "float64", "shape": [1, DIM], "b64": ""}}, 400),
        ("POST", search, {"queries": {"dtype": "float32", "shape": [1, DIM], "b64": "%%%"}}, 400),
        ("POST", search, {"queries": [[1.0] * DIM] * 501}, 413),
        ("POST", search, {"queries": [[[1.0] * DIM]]}, 400),
        ("POST", "/v1/collections/graph/insert", {"vectors": [[float("1e39")] * DIM]}, 400),
        ("POST", "/v1/collections/graph/insert", {"vectors": [[1.0] * DIM], "ids": [1.5]}, 400),
        ("POST", "/v1/collections/graph/insert", {"vectors": [[1.0] * DIM], "ids": [2 ** 64]}, 400),
        ("POST", "/v1/collections/graph/insert", {"vectors": [[1.0] * DIM], "ids": [-1]}, 400),
        ("POST", "/v1/collections/graph/insert", {"vectors": [[1.0] * (DIM - 1)]}, 400),
        ("POST", "/v1/collections/graph/insert", {"ids": [5]}, 400),
        ("POST", "/v1/collections/graph/delete", {"ids": "all"}, 400),
        ("POST", "/v1/collections/graph/checkpoint", {"now": True}, 400),
        ("POST", "/v1/collections/nosuch/search", {"queries": [1.0] * DIM}, 404),
        ("GET", "/v2/anything", None, 404),
        ("GET", search, None, 405),
        ("DELETE", "/v1/collections/graph", None, 405),
    ]
    for method, path, body, want in cases:
        status, reply = _raw(served, method, path, body)
        assert status == want, (path, body if not isinstance(body, dict) else list(body), status, reply)
        assert isinstance(reply, dict) and reply["error"], reply
    # Framing problems: an oversized body, no Content-Length, a wrong content type.
    assert _raw(served, "POST", search, {"queries": [1.0] * DIM}, headers={"Content-Type": "text/plain"})[0] == 415
    for headers, want in (("Content-Length: 5242880\r\n", b" 413 "), ("", b" 411 "),
                          ("Transfer-Encoding: chunked\r\n", b" 411 ")):
        # Headers only: the server answers before (and without) reading any body.
        sock = socket.create_connection(served.address)
        sock.sendall(f"POST {search} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {WRITE}\r\n{headers}\r\n".encode())
        assert want in sock.recv(4096).split(b"\r\n")[0] + b" "
        sock.close()
    sock = socket.create_connection(served.address)
    sock.sendall(b"GARBAGE\r\n\r\n")
    reply = b""
    while chunk := sock.recv(4096):  # the server closes after a malformed request
        reply += chunk
    # Bytes that are not HTTP get the HTTP parser's bare 400 (no JSON: no request was read).
    assert b" 400 " in reply.split(b"\r\n")[0] + b" "
    sock.close()
    assert graph.n == n0, "a refused request changed the index"
    _still_serving(served, queries)


def test_fuzzed_requests_never_crash_the_server_or_touch_the_index(served, data):
    _, queries = data
    graph = served.indexes["graph"]
    ids0 = graph.ids()
    rng = random.Random(7)
    valid = [json.dumps({"queries": queries[:2].tolist(), "k": 5, "L": 40}).encode(),
             json.dumps({"vectors": [[0.5] * DIM], "ids": [77_777]}).encode(),
             json.dumps({"ids": [1, 2, 3]}).encode()]
    statuses = []
    for trial in range(300):
        which = rng.randrange(3)
        body = bytearray(valid[which])
        for _ in range(rng.randint(1, 6)):
            op = rng.randrange(4)
            pos = rng.randrange(max(len(body), 1))
            if op == 0 and body:
                body[pos] = rng.randrange(256)
            elif op == 1:
                del body[pos:pos + rng.randint(1, 8)]
            elif op == 2:
                body[pos:pos] = rng.choice([b"[", b"]", b"{", b"}", b",", b":", b'"', b"-", b"e99", b"null", b"1e400"])
            else:
                body = body[:pos]
        # Every mutant goes to the search endpoint with a read token: nothing may change the index.
        status, reply = _raw(served, "POST", "/v1/collections/graph/search", bytes(body), token=READ)
        statuses.append(status)
        assert status < 500, (trial, bytes(body)[:200], reply)
    assert any(s >= 400 for s in statuses)
    np.testing.assert_array_equal(graph.ids(), ids0)
    assert not graph.check()["problems"]
    _still_serving(served, queries)


def test_deadline_answers_504(built, tmp_path, data):
    _, queries = data
    ix = nearline.open(_copy(built, tmp_path, "graph"))
    srv = Server({"g": ix}, port=0, limits=Limits(deadline=1e-6)).start()
    try:
        many = np.repeat(queries, 20, axis=0)  # 800 queries: several chunks
        with pytest.raises(TimeoutError, match="deadline"):
            Client(srv.url).search(many, k=10)
        Client(srv.url).search(queries[:4], k=10)  # one chunk is always answered
    finally:
        srv.stop()


def test_client_picks_the_collection_and_reports_metrics(served, data):
    _, queries = data
    c = Client(served.url, READ)
    with pytest.raises(ValueError, match="2 collections"):
        c.search(queries[:1])
    assert sorted(x["name"] for x in c.collections()) == ["graph", "part"]
    part = c.collection("part")
    assert part.kind == "partition" and part.dim == DIM and part.metric == "l2"
    with pytest.raises(LookupError):
        c.collection("nope").info()
    part.search(queries[:7], k=3)
    text = c.metrics()
    assert re.search(r'nearline_queries_total\{collection="part"\} 7\.0', text)
    assert 'nearline_memory_budget_bytes{collection="graph"}' in text
    assert re.search(r'nearline_memory_within_budget\{collection="part"\} 1\.0', text)
    assert 'nearline_request_seconds_bucket{collection="part",le="0.001",op="search"}' in text
    api = json.loads(json.dumps(served.openapi))
    props = api["paths"]["/v1/collections/{name}/search"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert props["L"]["type"] == "integer" and props["sigma"]["type"] == "number"
    assert props["queries_in_flight"]["type"] == ["integer", "string"]


def test_concurrent_searches_and_inserts(served, data):
    base, queries = data
    c = Client(served.url, WRITE, collection="part")
    errors = []
    acked = []

    def writer(t):
        try:
            for i in range(10):
                v = (base[(t * 97 + i) % len(base)] + 0.001).astype(np.float32)
                acked.extend(c.insert(v[None, :], ids=[50_000 + t * 100 + i]).tolist())
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def reader():
        try:
            for _ in range(10):
                ids, _ = c.search(queries, k=5)
                assert ids.shape == (len(queries), 5)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(3)] + [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert set(acked) <= set(c.ids().tolist()) and len(acked) == 30


def test_read_only_server_refuses_writes(built, tmp_path, data):
    ix = nearline.open(_copy(built, tmp_path, "graph"), read_only=True)
    srv = Server({"g": ix}, port=0).start()
    try:
        with pytest.raises(ValueError, match="read"):
            Client(srv.url).insert(data[1][:1])
    finally:
        srv.stop()


def test_tokens_and_binding_are_checked(tmp_path, built):
    with pytest.raises(ValueError, match="at least 16"):
        Tokens.parse("read:short", "x")
    with pytest.raises(ValueError, match="read:TOKEN"):
        Tokens.parse("admin:" + "a" * 20, "x")
    t = Tokens.parse(f"# comment\nread:{READ}\nwrite:{WRITE}, read:{'z' * 16}", "x")
    assert t.read == [READ, "z" * 16] and t.write == [WRITE]
    f = tmp_path / "tokens"
    f.write_text(f"read:{READ}\n")
    os.chmod(f, 0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        Tokens.load(str(f), environ={})
    os.chmod(f, 0o600)
    assert Tokens.load(str(f), environ={"NEARLINE_TOKENS": f"write:{WRITE}"}).write == [WRITE]
    ix = nearline.open(built / "graph", read_only=True)
    try:
        with pytest.raises(ValueError, match="without tokens"):
            Server({"g": ix}, host="0.0.0.0", port=0)
        with pytest.raises(ValueError, match="collection name"):
            Server({"a b": ix}, port=0)
    finally:
        ix.close()
    with pytest.raises(ValueError, match="max_batch"):
        Limits(max_batch=0).check()


def _start_cli_server(args, env=None):
    p = subprocess.Popen([sys.executable, "-m", "nearline", "serve", "--port", "0", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()
    m = re.search(r"on (http://\S+)", line)
    if not m:
        p.kill()
        raise AssertionError(f"server did not start: {line!r} {p.stderr.read()}")
    return p, m.group(1)


def test_cli_refuses_an_open_network_bind(built):
    r = subprocess.run([sys.executable, "-m", "nearline", "serve", "--host", "0.0.0.0", "--port", "0",
                        str(built / "graph")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "without tokens" in r.stderr  # EXIT_ERROR
    r = subprocess.run([sys.executable, "-m", "nearline", "serve", "a=" + str(built / "graph"),
                        "a=" + str(built / "part")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "given twice" in r.stderr


def test_sigterm_during_an_insert_stream_loses_no_acknowledged_insert(built, tmp_path, data):
    """20 trials: a client streams inserts, the server gets SIGTERM at a random moment; every
    insert the client saw acknowledged is in the index when it is opened again."""
    base, _ = data
    rng = random.Random(11)
    for trial in range(20):
        name = "graph" if trial % 2 == 0 else "part"
        path = _copy(built, tmp_path, name)
        tmp = tmp_path / f"t{trial}"
        path.rename(tmp)
        proc, url = _start_cli_server([f"c={tmp}"])
        client = Client(url, collection="c")
        acked = []
        stop_after = rng.uniform(0.05, 0.6)
        started = time.monotonic()
        sent_signal = False
        next_id = 100_000
        while True:
            if not sent_signal and time.monotonic() - started > stop_after:
                proc.send_signal(signal.SIGTERM)
                sent_signal = True
            batch = np.arange(next_id, next_id + 4)
            next_id += 4
            try:
                acked.extend(client.insert(base[batch % len(base)] + 0.5, ids=batch).tolist())
            except (ConnectionError, OSError, RuntimeError):
                if sent_signal:
                    break
                raise
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
        assert acked, "no insert was acknowledged before the signal"
        with nearline.open(tmp) as ix:
            live = set(ix.ids().tolist())
            missing = [i for i in acked if i not in live]
            assert not missing, f"trial {trial} ({name}): acknowledged inserts lost: {missing[:10]}"
            assert not ix.check()["problems"]
        shutil.rmtree(tmp)


def test_concurrent_one_query_calls_equal_the_in_process_answers(served, data):
    _, queries = data
    local = served.indexes["graph"]
    want, _ = local.search(queries, k=10, L=48)
    c = Client(served.url, READ, collection="graph")
    got = {}

    def caller(rows):
        for i in rows:
            got[i] = c.search(queries[i], k=10, L=48)[0]

    threads = [threading.Thread(target=caller, args=(range(t, len(queries), 8),)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(got[i].tolist() == want[i].tolist() for i in range(len(queries)))


def test_a_refused_request_leaves_its_connection_usable_and_searches_are_counted(served, data):
    """A 403 or 404 is sent after the request's body is read, so the same kept-alive
    connection carries the next request; searches answered by the Rust front end reach the
    metrics (queries and reads) and leave the index untouched."""
    _, queries = data
    host, port = served.address
    conn = http.client.HTTPConnection(host, port, timeout=30)
    auth = {"Content-Type": "application/json"}
    body = json.dumps({"vectors": queries[:2].tolist()}).encode()
    n0 = served.indexes["graph"].n
    for path, token, want in (("/v1/collections/graph/insert", READ, 403),
                              ("/v1/collections/nope/search", READ, 404),
                              ("/v1/collections/graph/search", READ, 200)):
        conn.request("POST", path, body=body if want != 200 else json.dumps({"queries": queries[:3].tolist()}).encode(),
                     headers={**auth, "Authorization": f"Bearer {token}"})
        r = conn.getresponse()
        r.read()
        assert r.status == want, path
    conn.close()
    assert served.indexes["graph"].n == n0
    text = Client(served.url, READ, collection="graph").metrics()
    queries_counted = [float(line.split()[-1]) for line in text.splitlines()
                       if line.startswith('nearline_queries_total{collection="graph"}')]
    # Each query's nodes come from disk (reads) or the cache (cache hits): one of them counted.
    touched = sum(float(line.split()[-1]) for line in text.splitlines()
                  if line.startswith(('nearline_reads_total{collection="graph"}',
                                      'nearline_cache_hits_total{collection="graph"}')))
    assert queries_counted and queries_counted[0] >= 3 and touched > 0
    assert 'op="insert",status="403"' in text and 'op="search",status="200"' in text
