//! The search endpoints, answered in Rust: a JSON request in, the engine's
//! search (no Python, no GIL), a JSON reply out. The request's own keys are
//! `queries`, `stats`, `encoding` and `timeout` (`radius` for a range
//! search); every other key is an engine option, read by the engine's
//! option reader.

use crate::options::JsonOptions;
use crate::wire::{encode_f32, encode_i64, f32_rows, HttpError};
use nearline::index::{Index, SearchOutput};
use nearline::planner::reader;
use nearline::planner::schema::{option_names, Stage};
use nearline::search::stats::{QueryStats, StatGetter, STATS};
use serde_json::{Map, Value};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

static SEARCH_NAMES: LazyLock<Vec<&'static str>> = LazyLock::new(|| option_names(Stage::Search));
static RANGE_NAMES: LazyLock<Vec<&'static str>> = LazyLock::new(|| option_names(Stage::Range));
const SEARCH_OWN: &[&str] = &["queries", "stats", "encoding", "timeout"];
const RANGE_OWN: &[&str] = &["queries", "radius", "stats", "encoding", "timeout"];

/// What the server allows a search request.
#[derive(Debug, Clone, Copy)]
pub struct SearchLimits {
    /// Rows per request.
    pub max_batch: usize,
    /// Values per array.
    pub max_values: usize,
    /// The longest a request may run (a request's `timeout` can only
    /// shorten it).
    pub deadline: Duration,
}

/// What a search did, for the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Searched {
    pub queries: u64,
    pub reads: u64,
    pub cache_hits: u64,
}

impl Searched {
    fn of(stats: &[QueryStats]) -> Self {
        let sum = |name: &str| -> u64 {
            STATS
                .iter()
                .find(|s| s.name == name)
                .map_or(0, |spec| match spec.get {
                    StatGetter::U32(f) => stats.iter().map(|s| u64::from(f(s))).sum(),
                    StatGetter::U64(f) => stats.iter().map(f).sum(),
                    StatGetter::F64(f) => stats.iter().map(f).sum::<f64>() as u64,
                })
        };
        Searched {
            queries: stats.len() as u64,
            reads: sum("reads"),
            cache_hits: sum("cache_hits"),
        }
    }
}

/// The request's own keys, checked.
struct Common {
    b64: bool,
    stats: bool,
    deadline: Instant,
}

fn common(body: &Map<String, Value>, limits: &SearchLimits) -> Result<Common, HttpError> {
    let b64 = match body.get("encoding") {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) if s == "json" => false,
        Some(Value::String(s)) if s == "b64" => true,
        Some(other) => {
            return Err(HttpError::new(
                400,
                format!("encoding must be 'json' or 'b64', got {other}"),
            ))
        }
    };
    let stats = match body.get("stats") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(HttpError::new(400, "stats must be true or false")),
    };
    let budget = match body.get("timeout") {
        None | Some(Value::Null) => limits.deadline,
        Some(v) => match v.as_f64() {
            Some(t) if t > 0.0 && t.is_finite() && !v.is_boolean() => {
                limits.deadline.min(Duration::from_secs_f64(t))
            }
            _ => {
                return Err(HttpError::new(
                    400,
                    format!("timeout must be a positive number of seconds, got {v}"),
                ))
            }
        },
    };
    Ok(Common {
        b64,
        stats,
        deadline: Instant::now() + budget,
    })
}

/// The queries of a request: `(values, rows, single)`, checked against the
/// limits and the collection's dimension.
fn queries(
    body: &Map<String, Value>,
    dim: usize,
    limits: &SearchLimits,
) -> Result<(Vec<f32>, usize, bool), HttpError> {
    let Some(v) = body.get("queries") else {
        return Err(HttpError::new(
            400,
            "the body needs 'queries' (a list, a list of lists or a base64 array)",
        ));
    };
    let (data, shape) = f32_rows(v, "queries", limits.max_values)?;
    let (rows, cols, single) = match shape[..] {
        [d] => (1, d, true),
        [n, d] => (n, d, false),
        _ => unreachable!("f32_rows returns 1 or 2 dimensions"),
    };
    if rows > limits.max_batch {
        return Err(HttpError::new(
            413,
            format!(
                "{rows} queries exceed this server's batch limit of {}",
                limits.max_batch
            ),
        ));
    }
    if cols != dim {
        return Err(HttpError::new(
            400,
            format!("queries have dimension {cols}, collection has {dim}"),
        ));
    }
    Ok((data, rows, single))
}

/// Per-query statistics as lists, by the engine's declaration.
fn stats_json(stats: &[QueryStats]) -> Value {
    let mut m = Map::new();
    for spec in STATS {
        let col: Vec<Value> = match spec.get {
            StatGetter::U32(f) => stats.iter().map(|s| Value::from(f(s))).collect(),
            StatGetter::U64(f) => stats.iter().map(|s| Value::from(f(s))).collect(),
            StatGetter::F64(f) => stats
                .iter()
                .map(|s| serde_json::Number::from_f64(f(s)).map_or(Value::Null, Value::Number))
                .collect(),
        };
        m.insert(spec.name.to_string(), Value::Array(col));
    }
    Value::Object(m)
}

/// Queries a chunk holds: a batch is searched in chunks so that it can
/// stop at its deadline, each chunk still keeping every search thread busy.
fn chunk_rows(threads: Option<usize>) -> usize {
    let t = threads.unwrap_or_else(nearline::planner::default_threads);
    (16 * t).max(64)
}

/// `POST .../search`: the reply's JSON and what was searched.
pub fn search(
    index: &Index,
    body: &Map<String, Value>,
    limits: &SearchLimits,
) -> Result<(Value, Searched), HttpError> {
    let mut r = JsonOptions::new(body, "search", &SEARCH_NAMES, SEARCH_OWN)?;
    let opts = reader::search_options(&mut r)?;
    let c = common(body, limits)?;
    let dim = index.dim();
    let (q, nq, single) = queries(body, dim, limits)?;
    let k = opts.k;
    let mut out = SearchOutput {
        ids: Vec::with_capacity(nq * k),
        distances: Vec::with_capacity(nq * k),
        lims: Vec::new(),
        stats: Vec::with_capacity(nq),
    };
    let step = chunk_rows(opts.threads);
    let mut lo = 0;
    while lo < nq {
        if lo > 0 && Instant::now() > c.deadline {
            return Err(HttpError::new(
                504,
                format!(
                    "the deadline passed after {lo} of {nq} queries; send smaller batches or a \
                     longer timeout"
                ),
            ));
        }
        let hi = (lo + step).min(nq);
        let part = index.search(&q[lo * dim..hi * dim], hi - lo, &opts)?;
        out.ids.extend_from_slice(&part.ids);
        out.distances.extend_from_slice(&part.distances);
        out.stats.extend_from_slice(&part.stats);
        lo = hi;
    }
    let shape: Vec<usize> = if single { vec![k] } else { vec![nq, k] };
    let mut reply = Map::new();
    reply.insert("ids".into(), encode_i64(&out.ids, &shape, c.b64));
    reply.insert(
        "distances".into(),
        encode_f32(&out.distances, &shape, c.b64),
    );
    if c.stats {
        reply.insert("stats".into(), stats_json(&out.stats));
    }
    Ok((Value::Object(reply), Searched::of(&out.stats)))
}

/// `POST .../range_search`: the reply's JSON (CSR: `lims`, `ids`,
/// `distances`) and what was searched.
pub fn range_search(
    index: &Index,
    body: &Map<String, Value>,
    limits: &SearchLimits,
) -> Result<(Value, Searched), HttpError> {
    let mut r = JsonOptions::new(body, "range_search", &RANGE_NAMES, RANGE_OWN)?;
    let (opts, range) = reader::range_options(&mut r)?;
    let c = common(body, limits)?;
    let (q, nq, _) = queries(body, index.dim(), limits)?;
    let radius = match body.get("radius") {
        None => return Err(HttpError::new(400, "the body needs 'radius'")),
        Some(v) if v.is_number() => v.as_f64().unwrap_or(f64::INFINITY) as f32,
        Some(v) => {
            return Err(HttpError::type_error(format!(
                "radius must be a number, not {}",
                crate::wire::type_name(v)
            )))
        }
    };
    if !radius.is_finite() {
        return Err(HttpError::new(
            400,
            format!("radius={radius} must be finite"),
        ));
    }
    let out = index.range_search(&q, nq, radius, &range, &opts)?;
    if Instant::now() > c.deadline {
        return Err(HttpError::new(
            504,
            "the range search ran past its deadline; send smaller batches",
        ));
    }
    let lims: Vec<i64> = out.lims.iter().map(|&x| x as i64).collect();
    let mut reply = Map::new();
    reply.insert("lims".into(), encode_i64(&lims, &[lims.len()], c.b64));
    reply.insert("ids".into(), encode_i64(&out.ids, &[out.ids.len()], c.b64));
    reply.insert(
        "distances".into(),
        encode_f32(&out.distances, &[out.distances.len()], c.b64),
    );
    if c.stats {
        reply.insert("stats".into(), stats_json(&out.stats));
    }
    Ok((Value::Object(reply), Searched::of(&out.stats)))
}
