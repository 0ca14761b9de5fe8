//! The front end end to end on loopback, without Python: a small index
//! built here, a delegate that records what it is handed, and raw HTTP/1.1
//! requests. Searches must equal the engine's own answers; every refusal
//! must carry its status and never reach the index or the delegate.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use nearline::data::matrix::Matrix;
use nearline::format::Preset;
use nearline::index::Index;
use nearline::planner::{BuildOptions, OpenOptions, PresetChoice, SearchOptions};
use nearline::util::Budget;
use nearline_http::{Config, Delegate, Limits, Reply, Server, Tokens};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DIM: usize = 8;
const READ: &str = "read-token-0123456789";
const WRITE: &str = "write-token-0123456789";

/// One delegated call: op, collection, body, query string.
type Call = (String, Option<String>, Vec<u8>, String);

/// Records each call and answers 201 with the op's name.
#[derive(Default)]
struct Recorder(Mutex<Vec<Call>>);

impl Delegate for Recorder {
    fn call(&self, op: &str, collection: Option<&str>, body: &[u8], query: &str) -> Reply {
        if let Ok(mut g) = self.0.lock() {
            g.push((
                op.into(),
                collection.map(String::from),
                body.to_vec(),
                query.into(),
            ));
        }
        Reply {
            status: 201,
            content_type: "application/json".into(),
            body: json!({"op": op}).to_string().into_bytes(),
        }
    }
}

/// `n` deterministic vectors (a linear congruential sequence in [-1, 1)).
fn vectors(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n * DIM)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect()
}

fn index(dir: &std::path::Path) -> Arc<Index> {
    let opts = BuildOptions {
        preset: PresetChoice::Named(Preset::Diskann),
        r: Some(12),
        build_l: Some(24),
        pq_bytes: Some(4),
        threads: Some(2),
        memory_budget: Some(Budget::Bytes(64 << 20)),
        ..Default::default()
    };
    let m = Matrix::from_vec(vectors(600, 7), 600, DIM).expect("matrix");
    nearline::index::build(m, dir, &opts, &|_, _, _| {}, &AtomicBool::new(false)).expect("build");
    Arc::new(Index::open(dir, &OpenOptions::default()).expect("open"))
}

fn start(idx: Arc<Index>, rec: Arc<Recorder>) -> Server {
    let cfg = Config {
        host: "127.0.0.1".into(),
        port: 0,
        limits: Limits {
            max_body: 1 << 16,
            max_batch: 50,
            max_values: 50 * DIM,
            deadline: Duration::from_secs(10),
            max_concurrent: 8,
            idle_timeout: Duration::from_secs(10),
            grace: Duration::from_secs(5),
        },
        tokens: Tokens {
            read: vec![READ.into()],
            write: vec![WRITE.into()],
        },
        openapi: b"{\"openapi\":\"3.1.0\"}".to_vec(),
        server_name: "nearline/test".into(),
        io_threads: 2,
    };
    let mut c = BTreeMap::new();
    c.insert("g".to_string(), idx);
    Server::start(cfg, c, rec).expect("start")
}

/// One request on its own connection: (status, head, body).
fn send(addr: SocketAddr, raw: &[u8]) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(raw).expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a reply head");
    let head = String::from_utf8_lossy(&out[..end]).to_string();
    let status = head[9..12].parse().expect("a status");
    (status, head, out[end + 4..].to_vec())
}

fn post(addr: SocketAddr, path: &str, token: Option<&str>, body: &Value) -> (u16, Value) {
    let b = body.to_string();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let raw = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    );
    let (status, _, body) = send(addr, raw.as_bytes());
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn b64_rows(q: &[f32], rows: usize) -> Value {
    let bytes: Vec<u8> = q.iter().flat_map(|x| x.to_le_bytes()).collect();
    json!({"dtype": "float32", "shape": [rows, DIM], "b64": STANDARD.encode(bytes)})
}

fn ids_of(v: &Value) -> Vec<i64> {
    let b = STANDARD
        .decode(v["b64"].as_str().expect("b64 ids"))
        .expect("base64");
    b.chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

#[test]
fn searches_equal_the_engine_and_refusals_never_reach_the_index() {
    let dir = tempfile::tempdir().expect("tempdir");
    let idx = index(&dir.path().join("g"));
    let rec = Arc::new(Recorder::default());
    let mut srv = start(idx.clone(), rec.clone());
    let addr = srv.local_addr();
    let search = "/v1/collections/g/search";

    // Search: base64 and lists give the engine's own answer, bit for bit.
    let q = vectors(5, 99);
    let opts = SearchOptions {
        l: Some(30),
        ..SearchOptions::new(4)
    };
    let want = idx.search(&q, 5, &opts).expect("search");
    let (st, r) = post(
        addr,
        search,
        Some(READ),
        &json!({"queries": b64_rows(&q, 5), "k": 4, "L": 30, "encoding": "b64", "stats": true}),
    );
    assert_eq!(st, 200, "{r}");
    assert_eq!(ids_of(&r["ids"]), want.ids);
    assert_eq!(r["stats"]["reads"].as_array().map(Vec::len), Some(5));
    let lists: Vec<Vec<f32>> = q.chunks(DIM).map(<[f32]>::to_vec).collect();
    let (st, r) = post(
        addr,
        search,
        Some(WRITE),
        &json!({"queries": lists, "k": 4, "L": 30}),
    );
    assert_eq!(st, 200);
    let got: Vec<i64> = r["ids"]
        .as_array()
        .expect("rows")
        .iter()
        .flat_map(|row| {
            row.as_array()
                .expect("row")
                .iter()
                .filter_map(Value::as_i64)
        })
        .collect();
    assert_eq!(got, want.ids);
    let (st, r) = post(
        addr,
        search,
        Some(READ),
        &json!({"queries": lists[0], "k": 4, "L": 30}),
    );
    assert_eq!((st, r["ids"].as_array().map(Vec::len)), (200, Some(4)));

    // Refusals, each with its status; none reaches the delegate.
    let one = json!({"queries": lists[0]});
    let cases: Vec<(&str, Option<&str>, Value, u16)> = vec![
        (search, None, one.clone(), 401),
        (search, Some("not-a-token-at-all"), one.clone(), 401),
        (
            "/v1/collections/g/insert",
            Some(READ),
            json!({"vectors": lists[0]}),
            403,
        ),
        ("/v1/collections/nope/search", Some(READ), one.clone(), 404),
        ("/v2/anything", Some(READ), one.clone(), 404),
        (search, Some(READ), json!({"queries": [1.0, 2.0]}), 400),
        (
            search,
            Some(READ),
            json!({"queries": lists[0], "k": "4"}),
            400,
        ),
        (
            search,
            Some(READ),
            json!({"queries": lists[0], "bogus": 1}),
            400,
        ),
        (
            search,
            Some(READ),
            json!({"queries": lists[0], "executor": "warp"}),
            400,
        ),
        (
            search,
            Some(READ),
            json!({"queries": vec![lists[0].clone(); 51]}),
            413,
        ),
        (search, Some(READ), json!([1, 2]), 400),
        (
            "/v1/collections/g/range_search",
            Some(READ),
            one.clone(),
            400,
        ),
    ];
    for (path, token, body, want) in cases {
        let (st, r) = post(addr, path, token, &body);
        assert_eq!(st, want, "{path} {body}: {r}");
        assert_eq!(r["status"].as_u64(), Some(u64::from(want)), "{r}");
    }
    let framing: &[(&str, u16)] = &[
        ("POST /v1/collections/g/search HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer read-token-0123456789\r\nContent-Length: 999999\r\n\r\n", 413),
        ("POST /v1/collections/g/search HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer read-token-0123456789\r\nConnection: close\r\n\r\n", 411),
        ("POST /v1/collections/g/search HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer read-token-0123456789\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}", 415),
        ("GET /v1/collections/g/search HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer read-token-0123456789\r\nConnection: close\r\n\r\n", 405),
        ("GARBAGE\r\n\r\n", 400),
    ];
    for (raw, want) in framing {
        assert_eq!(send(addr, raw.as_bytes()).0, *want, "{raw}");
    }
    assert!(rec.0.lock().map(|g| g.is_empty()).unwrap_or(false));

    // Open endpoints, and the delegate's share.
    let (st, head, body) = send(
        addr,
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(st, 200);
    assert!(
        head.to_ascii_lowercase().contains("server: nearline/test"),
        "{head}"
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&body).ok(),
        Some(json!({"status": "ok", "collections": ["g"]}))
    );
    let (st, _, body) = send(
        addr,
        b"GET /openapi.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!((st, body), (200, b"{\"openapi\":\"3.1.0\"}".to_vec()));
    let (st, r) = post(
        addr,
        "/v1/collections/g/insert",
        Some(WRITE),
        &json!({"vectors": lists[0]}),
    );
    assert_eq!((st, r["op"].as_str()), (201, Some("insert")));
    let raw = format!("GET /v1/collections/g/ids?encoding=b64 HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {READ}\r\n\r\n");
    assert_eq!(send(addr, raw.as_bytes()).0, 201);
    {
        let calls = rec.0.lock().expect("calls");
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[0].0.as_str(), calls[0].1.as_deref()),
            ("insert", Some("g"))
        );
        assert_eq!(
            serde_json::from_slice::<Value>(&calls[0].2).ok(),
            Some(json!({"vectors": lists[0]}))
        );
        assert_eq!(
            (calls[1].0.as_str(), calls[1].3.as_str()),
            ("ids", "encoding=b64")
        );
    }

    // Every answered request is an event; the searches carry their queries.
    let (events, dropped) = srv.take_events();
    assert_eq!(dropped, 0);
    let searched: u64 = events
        .iter()
        .filter(|e| e.op == "search" && e.status == 200)
        .map(|e| e.searched.queries)
        .sum();
    assert_eq!(searched, 5 + 5 + 1);
    assert!(events.iter().any(|e| e.op == "insert" && e.status == 403));

    // A drain answers 503 and stops.
    srv.begin_drain();
    assert_eq!(post(addr, search, Some(READ), &one).0, 503);
    srv.stop();
    assert!(
        TcpStream::connect(addr).is_err(),
        "still listening after stop"
    );
}
