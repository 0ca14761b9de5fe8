//! The HTTP/1.1 front end of `nearline serve`: connections, routing,
//! bearer-token scopes, request limits, the search endpoints (answered
//! here, in Rust, on blocking threads that never take a Python lock), and a
//! drain that finishes requests in flight. Every other endpoint (info, ids,
//! plan, insert, delete, checkpoint, the collection list and the metrics)
//! goes to a [`Delegate`] — the Python server — after the same routing,
//! auth and limits.

use crate::search::{self, SearchLimits, Searched};
use crate::wire::{parse_object, HttpError};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{
    HeaderValue, AUTHORIZATION, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, SERVER,
    TRANSFER_ENCODING, WWW_AUTHENTICATE,
};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use nearline::index::Index;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{watch, Semaphore};

/// What one request may ask and how long the server waits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Body bytes.
    pub max_body: usize,
    /// Rows (queries or vectors) per request.
    pub max_batch: usize,
    /// Values per array.
    pub max_values: usize,
    /// The longest a search may run, and the longest a request waits for a
    /// slot.
    pub deadline: Duration,
    /// Requests answered at once (the rest wait for a slot).
    pub max_concurrent: usize,
    /// A connection that sends no request head for this long is closed.
    pub idle_timeout: Duration,
    /// How long a drain waits for requests in flight.
    pub grace: Duration,
}

/// Bearer tokens by scope; a `write` token may also read.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    pub read: Vec<String>,
    pub write: Vec<String>,
}

/// What a request may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Read,
    Write,
}

/// Equality that takes the same time wherever the first difference is.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    std::hint::black_box(a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y))) == 0
}

impl Tokens {
    fn enabled(&self) -> bool {
        !self.read.is_empty() || !self.write.is_empty()
    }

    /// The scope an `Authorization` header grants (every token is compared,
    /// so the time taken tells nothing about which matched).
    fn scope(&self, header: Option<&HeaderValue>) -> Option<Scope> {
        let given = header?
            .to_str()
            .ok()?
            .strip_prefix("Bearer ")?
            .trim()
            .as_bytes();
        let mut found = None;
        for (scope, list) in [(Scope::Write, &self.write), (Scope::Read, &self.read)] {
            for t in list {
                if same_secret(given, t.as_bytes()) && found.is_none() {
                    found = Some(scope);
                }
            }
        }
        found
    }
}

/// A reply from the delegate.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
}

/// The endpoints the front end does not answer itself. Called on a
/// blocking thread after routing, auth and the body limits; must not
/// panic (a panic is answered 500).
pub trait Delegate: Send + Sync + 'static {
    /// `op` is one of `metrics`, `collections`, `info`, `ids`, `plan`,
    /// `insert`, `delete`, `checkpoint`; `collection` is `None` for the
    /// first two; `body` is the raw request body, `query` the URL's query
    /// string.
    fn call(&self, op: &str, collection: Option<&str>, body: &[u8], query: &str) -> Reply;
}

/// One answered request, for the metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The collection (empty when none).
    pub collection: String,
    pub op: &'static str,
    pub status: u16,
    pub seconds: f64,
    /// A search's queries, reads and cache hits (zero for other requests).
    pub searched: Searched,
}

/// Events kept between two collections by the metrics (beyond this they
/// are counted as dropped).
const MAX_EVENTS: usize = 1 << 20;

/// Where to listen and what to serve.
pub struct Config {
    pub host: String,
    pub port: u16,
    pub limits: Limits,
    pub tokens: Tokens,
    /// The OpenAPI document served at `/openapi.json`.
    pub openapi: Vec<u8>,
    /// The `Server` header.
    pub server_name: String,
    /// Threads that run connections (searches run on blocking threads).
    pub io_threads: usize,
}

struct Shared {
    collections: BTreeMap<String, Arc<Index>>,
    limits: Limits,
    tokens: Tokens,
    openapi: Bytes,
    server_name: HeaderValue,
    delegate: Arc<dyn Delegate>,
    draining: AtomicBool,
    in_flight: AtomicUsize,
    slots: Arc<Semaphore>,
    events: Mutex<Vec<Event>>,
    dropped: AtomicUsize,
}

/// A running server. [`Server::stop`] drains it; dropping it stops it too.
pub struct Server {
    runtime: Option<tokio::runtime::Runtime>,
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop_tx: watch::Sender<bool>,
    accept: Option<tokio::task::JoinHandle<()>>,
}

impl Server {
    /// Binds (a backlog of 1,024 connections) and starts serving in
    /// background threads.
    pub fn start(
        cfg: Config,
        collections: BTreeMap<String, Arc<Index>>,
        delegate: Arc<dyn Delegate>,
    ) -> std::io::Result<Server> {
        let addr = (cfg.host.as_str(), cfg.port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::AddrNotAvailable,
                    format!("{} resolves to no address", cfg.host),
                )
            })?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cfg.io_threads.max(1))
            .thread_name("nearline-http")
            .enable_all()
            .build()?;
        let listener = runtime.block_on(async {
            let sock = if addr.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            sock.set_reuseaddr(true)?;
            sock.bind(addr)?;
            sock.listen(1024)
        })?;
        let addr = listener.local_addr()?;
        let server_name = HeaderValue::from_str(&cfg.server_name)
            .unwrap_or_else(|_| HeaderValue::from_static("nearline"));
        let shared = Arc::new(Shared {
            collections,
            limits: cfg.limits,
            tokens: cfg.tokens,
            openapi: Bytes::from(cfg.openapi),
            server_name,
            delegate,
            draining: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            slots: Arc::new(Semaphore::new(cfg.limits.max_concurrent.max(1))),
            events: Mutex::new(Vec::new()),
            dropped: AtomicUsize::new(0),
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let accept = runtime.spawn(accept_loop(listener, shared.clone(), stop_rx));
        Ok(Server {
            runtime: Some(runtime),
            shared,
            addr,
            stop_tx,
            accept: Some(accept),
        })
    }

    /// The address it listens on (the port chosen when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests being answered now.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    pub fn draining(&self) -> bool {
        self.shared.draining.load(Ordering::SeqCst)
    }

    /// From now on new requests are answered 503 (and their connections
    /// closed); requests in flight go on. [`Server::stop`] does this first.
    pub fn begin_drain(&self) {
        self.shared.draining.store(true, Ordering::SeqCst);
    }

    /// The requests answered since the last call (and how many were
    /// dropped because nobody collected them).
    pub fn take_events(&self) -> (Vec<Event>, usize) {
        let ev = match self.shared.events.lock() {
            Ok(mut g) => std::mem::take(&mut *g),
            Err(p) => std::mem::take(&mut *p.into_inner()),
        };
        (ev, self.shared.dropped.swap(0, Ordering::SeqCst))
    }

    /// Drains and stops: new requests get 503, the listener closes, idle
    /// connections close, requests in flight finish (up to the grace
    /// period), then the threads stop and the collections are released.
    pub fn stop(&mut self) {
        self.begin_drain();
        let _ = self.stop_tx.send(true);
        if let (Some(rt), Some(accept)) = (self.runtime.as_ref(), self.accept.take()) {
            let _ = rt.block_on(accept);
            let deadline = Instant::now() + self.shared.limits.grace;
            while self.in_flight() > 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn accept_loop(listener: TcpListener, sh: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let graceful = GracefulShutdown::new();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    // A reply's head and body leave at once, not after the
                    // client's delayed ACK.
                    let _ = stream.set_nodelay(true);
                    let s = sh.clone();
                    let conn = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(sh.limits.idle_timeout)
                        .serve_connection(
                            TokioIo::new(stream),
                            service_fn(move |req| handle(s.clone(), req)),
                        );
                    let conn = graceful.watch(conn);
                    tokio::spawn(async move {
                        let _ = conn.await;
                    });
                }
                // Out of file descriptors or a reset before accept: go on.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            _ = stop.changed() => break,
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(sh.limits.grace, graceful.shutdown()).await;
}

/// What a request was, for its event.
struct Answer {
    response: Response<Full<Bytes>>,
    collection: String,
    op: &'static str,
    searched: Searched,
}

type Resp = Response<Full<Bytes>>;

fn reply(sh: &Shared, status: u16, ctype: &str, body: impl Into<Bytes>, close: bool) -> Resp {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_str(ctype).unwrap_or(HeaderValue::from_static("application/json")),
    );
    h.insert(SERVER, sh.server_name.clone());
    if close {
        h.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

fn refuse(sh: &Shared, e: &HttpError, close: bool) -> Resp {
    let mut r = reply(sh, e.status, "application/json", e.body(), close);
    if e.status == 401 {
        r.headers_mut().insert(
            WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"nearline\""),
        );
    }
    r
}

async fn handle(sh: Arc<Shared>, req: Request<Incoming>) -> Result<Resp, Infallible> {
    let started = Instant::now();
    sh.in_flight.fetch_add(1, Ordering::SeqCst);
    let a = answer(&sh, req).await;
    sh.in_flight.fetch_sub(1, Ordering::SeqCst);
    let ev = Event {
        collection: a.collection,
        op: a.op,
        status: a.response.status().as_u16(),
        seconds: started.elapsed().as_secs_f64(),
        searched: a.searched,
    };
    match sh.events.lock() {
        Ok(mut g) if g.len() < MAX_EVENTS => g.push(ev),
        _ => {
            sh.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
    Ok(a.response)
}

/// Which endpoint a request names.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Work {
    Search,
    RangeSearch,
    Delegate,
}

struct Route {
    op: &'static str,
    collection: Option<String>,
    scope: Scope,
    work: Work,
}

/// `(method, op)` → (the op's name, scope, who answers).
const ROUTES: &[(&str, &str, &str, Scope, Work)] = &[
    (
        "GET",
        "collections",
        "collections",
        Scope::Read,
        Work::Delegate,
    ),
    ("GET", "", "info", Scope::Read, Work::Delegate),
    ("GET", "ids", "ids", Scope::Read, Work::Delegate),
    ("POST", "search", "search", Scope::Read, Work::Search),
    (
        "POST",
        "range_search",
        "range_search",
        Scope::Read,
        Work::RangeSearch,
    ),
    ("POST", "plan", "plan", Scope::Read, Work::Delegate),
    ("POST", "insert", "insert", Scope::Write, Work::Delegate),
    ("POST", "delete", "delete", Scope::Write, Work::Delegate),
    (
        "POST",
        "checkpoint",
        "checkpoint",
        Scope::Write,
        Work::Delegate,
    ),
];

fn route(sh: &Shared, method: &Method, path: &str) -> Result<Route, HttpError> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let none = || HttpError::new(404, format!("no endpoint {path} (see /openapi.json)"));
    if parts.len() < 2 || parts.len() > 4 || parts[0] != "v1" || parts[1] != "collections" {
        return Err(none());
    }
    let (op, collection) = if parts.len() == 2 {
        ("collections", None)
    } else {
        let name = parts[2];
        if !sh.collections.contains_key(name) {
            let names: Vec<&str> = sh.collections.keys().map(String::as_str).collect();
            return Err(HttpError::new(
                404,
                format!(
                    "no collection '{name}' (this server has {})",
                    names.join(", ")
                ),
            ));
        }
        (parts.get(3).copied().unwrap_or(""), Some(name.to_string()))
    };
    if let Some(&(_, _, name, scope, work)) = ROUTES
        .iter()
        .find(|(m, o, ..)| *m == method.as_str() && *o == op)
    {
        return Ok(Route {
            op: name,
            collection,
            scope,
            work,
        });
    }
    let mut allowed: Vec<&str> = ROUTES
        .iter()
        .filter(|(_, o, ..)| *o == op)
        .map(|(m, ..)| *m)
        .collect();
    if allowed.is_empty() {
        return Err(none());
    }
    allowed.sort_unstable();
    Err(HttpError::new(
        405,
        format!("{path} takes {}, not {method}", allowed.join(" or ")),
    ))
}

/// The body, within the limits: `Err((refusal, close the connection))`.
async fn body(sh: &Shared, req: Request<Incoming>) -> Result<Bytes, (HttpError, bool)> {
    let h = req.headers();
    if h.contains_key(TRANSFER_ENCODING) {
        return Err((
            HttpError::new(
                411,
                "send the body with a Content-Length (chunked transfer is not accepted)",
            ),
            true,
        ));
    }
    let length = match h.get(CONTENT_LENGTH) {
        None if req.method() == Method::POST => {
            return Err((HttpError::new(411, "a POST needs a Content-Length"), true))
        }
        None => 0,
        Some(v) => {
            let text = v.to_str().unwrap_or("?").trim().to_string();
            text.parse::<usize>().map_err(|_| {
                (
                    HttpError::new(400, format!("Content-Length '{text}' is not an integer")),
                    true,
                )
            })?
        }
    };
    let limit = sh.limits.max_body;
    if length > limit {
        return Err((
            HttpError::new(
                413,
                format!("a body of {length} bytes exceeds this server's limit of {limit}"),
            ),
            true,
        ));
    }
    if req.method() == Method::GET && length == 0 {
        return Ok(Bytes::new());
    }
    let ctype = h
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let data = Limited::new(req.into_body(), limit)
        .collect()
        .await
        .map_err(|e| {
            (
                HttpError::new(400, format!("the body could not be read: {e}")),
                true,
            )
        })?
        .to_bytes();
    if ctype != "application/json" {
        return Err((
            HttpError::new(415, format!("send application/json, not {ctype}")),
            false,
        ));
    }
    Ok(data)
}

/// A refusal sent after reading the request's body (when it is within the
/// limits), so that the client, which may still be sending it, reads the
/// reply and the connection can carry the next request.
async fn refuse_after_body(sh: &Shared, req: Request<Incoming>, e: &HttpError) -> Resp {
    let close = body(sh, req).await.is_err_and(|(_, close)| close);
    refuse(sh, e, close)
}

async fn answer(sh: &Arc<Shared>, req: Request<Incoming>) -> Answer {
    let mut a = Answer {
        response: Response::new(Full::new(Bytes::new())),
        collection: String::new(),
        op: "unknown",
        searched: Searched::default(),
    };
    if sh.draining.load(Ordering::SeqCst) {
        let e = HttpError::new(503, "the server is shutting down");
        a.response = refuse(sh, &e, true);
        return a;
    }
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    if method == Method::GET && path == "/health" {
        let names: Vec<&str> = sh.collections.keys().map(String::as_str).collect();
        let v = serde_json::json!({"status": "ok", "collections": names});
        a.op = "health";
        a.response = reply(sh, 200, "application/json", v.to_string(), false);
        return a;
    }
    if method == Method::GET && path == "/openapi.json" {
        a.op = "openapi";
        a.response = reply(sh, 200, "application/json", sh.openapi.clone(), false);
        return a;
    }
    let r = if path == "/metrics" {
        if method != Method::GET {
            a.op = "metrics";
            a.response =
                refuse_after_body(sh, req, &HttpError::new(405, "/metrics takes GET")).await;
            return a;
        }
        Route {
            op: "metrics",
            collection: None,
            scope: Scope::Read,
            work: Work::Delegate,
        }
    } else {
        match route(sh, &method, &path) {
            Ok(r) => r,
            Err(e) => {
                a.response = refuse_after_body(sh, req, &e).await;
                return a;
            }
        }
    };
    a.op = r.op;
    a.collection = r.collection.clone().unwrap_or_default();
    if sh.tokens.enabled() {
        match sh.tokens.scope(req.headers().get(AUTHORIZATION)) {
            None => {
                let e = HttpError::new(
                    401,
                    "a valid bearer token is needed (Authorization: Bearer TOKEN)",
                )
                .with_kind("PermissionError");
                a.response = refuse_after_body(sh, req, &e).await;
                return a;
            }
            Some(Scope::Read) if r.scope == Scope::Write => {
                let e = HttpError::new(403, format!("a read-only token cannot {}", r.op))
                    .with_kind("PermissionError");
                a.response = refuse_after_body(sh, req, &e).await;
                return a;
            }
            Some(_) => {}
        }
    }
    let data = match body(sh, req).await {
        Ok(d) => d,
        Err((e, close)) => {
            a.response = refuse(sh, &e, close);
            return a;
        }
    };
    let wait = tokio::time::timeout(sh.limits.deadline, sh.slots.clone().acquire_owned()).await;
    let Ok(Ok(slot)) = wait else {
        let e = HttpError::new(
            503,
            "the server is busy: every request slot stayed taken past the deadline",
        );
        a.response = refuse(sh, &e, false);
        return a;
    };
    let op = r.op;
    // The search (or the delegate's Python) runs on this worker thread, which
    // tokio replaces for the other connections meanwhile: no hand-off to a
    // blocking pool and back, two thread wake-ups fewer a request.
    let work = tokio::task::block_in_place(|| {
        let _slot = slot;
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(sh, &r, &data, &query)))
    });
    match work {
        Ok(Ok((status, ctype, bytes, searched))) => {
            a.searched = searched;
            a.response = reply(sh, status, &ctype, bytes, false);
        }
        Ok(Err(e)) => a.response = refuse(sh, &e, false),
        Err(_) => {
            let e = HttpError::new(500, format!("{op} failed: the handler panicked"))
                .with_kind("RuntimeError");
            a.response = refuse(sh, &e, false);
        }
    }
    a
}

/// `(status, content type, body, searched)` of a routed request (runs on a
/// blocking thread).
fn run(
    sh: &Shared,
    r: &Route,
    data: &[u8],
    query: &str,
) -> Result<(u16, String, Vec<u8>, Searched), HttpError> {
    let json = "application/json".to_string();
    if r.work == Work::Delegate {
        let d = sh.delegate.call(r.op, r.collection.as_deref(), data, query);
        return Ok((d.status, d.content_type, d.body, Searched::default()));
    }
    let index = r
        .collection
        .as_ref()
        .and_then(|n| sh.collections.get(n))
        .ok_or_else(|| HttpError::new(404, "no such collection"))?;
    let obj = parse_object(data)?;
    let limits = SearchLimits {
        max_batch: sh.limits.max_batch,
        max_values: sh.limits.max_values,
        deadline: sh.limits.deadline,
    };
    let (v, searched) = match r.work {
        Work::Search => search::search(index, &obj, &limits)?,
        _ => search::range_search(index, &obj, &limits)?,
    };
    Ok((200, json, v.to_string().into_bytes(), searched))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_grant_their_scope_and_nothing_else() {
        let t = Tokens {
            read: vec!["r".repeat(16)],
            write: vec!["w".repeat(16)],
        };
        let h = |s: &str| HeaderValue::from_str(s).ok();
        assert_eq!(
            t.scope(h(&format!("Bearer {}", "r".repeat(16))).as_ref()),
            Some(Scope::Read)
        );
        assert_eq!(
            t.scope(h(&format!("Bearer {}", "w".repeat(16))).as_ref()),
            Some(Scope::Write)
        );
        assert_eq!(t.scope(h(&"r".repeat(16)).as_ref()), None);
        assert_eq!(t.scope(h("Bearer rrrr").as_ref()), None);
        assert_eq!(t.scope(None), None);
        assert!(!Tokens::default().enabled());
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
    }
}
