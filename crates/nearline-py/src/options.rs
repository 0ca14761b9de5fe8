//! Options as keyword arguments: every name, type check and range check is
//! made here (against the engine's types), so Python and the CLI only pass
//! what the user gave.

use crate::to_py;
use nearline::distance::Metric;
use nearline::format::LayoutKind;
use nearline::io::EngineKind;
use nearline::layout::shuffle::ShuffleAlgo;
use nearline::planner::reader::{self, OptionReader};
use nearline::planner::schema::{self, Stage};
use nearline::planner::{
    BuildOptions, CacheChoice, CodeParams, EntryChoice, OpenOptions, PresetChoice, RangeOptions,
    SearchOptions,
};
use nearline::util::Budget;
use numpy::{PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyString};
use std::collections::BTreeSet;
use std::sync::LazyLock;

/// Keyword arguments being read: each option is taken once; what is left
/// at the end is an unknown option.
pub struct Kw<'a, 'py> {
    dict: Option<&'a Bound<'py, PyDict>>,
    what: &'static str,
    taken: BTreeSet<String>,
    accepted: &'static [&'static str],
}

impl<'a, 'py> Kw<'a, 'py> {
    /// Options of `what` (named in errors) that accept `accepted` names.
    pub fn new(
        dict: Option<&'a Bound<'py, PyDict>>,
        what: &'static str,
        accepted: &'static [&'static str],
    ) -> Self {
        Kw {
            dict,
            what,
            taken: BTreeSet::new(),
            accepted,
        }
    }

    /// Whether this call accepts `key`.
    pub fn accepts(&self, key: &str) -> bool {
        self.accepted.contains(&key)
    }

    /// The value of `key`, or `None` when absent or Python `None`.
    pub fn get(&mut self, key: &'static str) -> PyResult<Option<Bound<'py, PyAny>>> {
        debug_assert!(self.accepted.contains(&key), "{key} not declared");
        self.taken.insert(key.to_string());
        let Some(d) = self.dict else {
            return Ok(None);
        };
        match d.get_item(key)? {
            Some(v) if !v.is_none() => Ok(Some(v)),
            _ => Ok(None),
        }
    }

    fn type_error(key: &str, want: &str, v: &Bound<'_, PyAny>) -> PyErr {
        let got = v
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "?".into());
        PyTypeError::new_err(format!("{key} must be {want}, not {got}"))
    }

    /// An integer option (a Python or numpy integer; not a bool or float).
    pub fn int(&mut self, key: &'static str) -> PyResult<Option<i64>> {
        let Some(v) = self.get(key)? else {
            return Ok(None);
        };
        if v.is_instance_of::<PyBool>() || v.is_instance_of::<PyFloat>() {
            return Err(Self::type_error(key, "an integer", &v));
        }
        v.extract::<i64>()
            .map(Some)
            .map_err(|_| Self::type_error(key, "an integer", &v))
    }

    /// A non-negative integer option.
    pub fn usize(&mut self, key: &'static str) -> PyResult<Option<usize>> {
        match self.int(key)? {
            Some(i) if i < 0 => Err(PyValueError::new_err(format!("{key}={i} must be >= 0"))),
            Some(i) => Ok(Some(i as usize)),
            None => Ok(None),
        }
    }

    /// A non-negative integer option that fits 64 bits unsigned.
    pub fn u64(&mut self, key: &'static str) -> PyResult<Option<u64>> {
        let Some(v) = self.get(key)? else {
            return Ok(None);
        };
        if v.is_instance_of::<PyBool>() || v.is_instance_of::<PyFloat>() {
            return Err(Self::type_error(key, "an integer", &v));
        }
        v.extract::<u64>().map(Some).map_err(|_| {
            if v.extract::<i64>().is_ok() {
                PyValueError::new_err(format!("{key} must be >= 0"))
            } else {
                Self::type_error(key, "an integer in 0..2**64", &v)
            }
        })
    }

    /// A float option (an int is accepted; a bool is not); finite.
    pub fn f64(&mut self, key: &'static str) -> PyResult<Option<f64>> {
        let Some(v) = self.get(key)? else {
            return Ok(None);
        };
        if v.is_instance_of::<PyBool>() || v.is_instance_of::<PyString>() {
            return Err(Self::type_error(key, "a number", &v));
        }
        let x = v
            .extract::<f64>()
            .map_err(|_| Self::type_error(key, "a number", &v))?;
        if !x.is_finite() {
            return Err(PyValueError::new_err(format!(
                "{key}={x} must be a finite number"
            )));
        }
        Ok(Some(x))
    }

    /// A boolean option.
    pub fn bool(&mut self, key: &'static str) -> PyResult<Option<bool>> {
        let Some(v) = self.get(key)? else {
            return Ok(None);
        };
        if !v.is_instance_of::<PyBool>() && v.extract::<numpy::PyReadonlyArray0<bool>>().is_err() {
            return Err(Self::type_error(key, "a bool", &v));
        }
        v.extract::<bool>()
            .map(Some)
            .map_err(|_| Self::type_error(key, "a bool", &v))
    }

    /// A string option.
    pub fn str(&mut self, key: &'static str) -> PyResult<Option<String>> {
        let Some(v) = self.get(key)? else {
            return Ok(None);
        };
        v.extract::<String>()
            .map(Some)
            .map_err(|_| Self::type_error(key, "a string", &v))
    }

    /// A name option parsed by the engine's vocabulary.
    pub fn name<T>(
        &mut self,
        key: &'static str,
        parse: impl Fn(&str) -> nearline::Result<T>,
    ) -> PyResult<Option<T>> {
        self.str(key)?.map(|s| parse(&s).map_err(to_py)).transpose()
    }

    /// A budget: bytes (int ≥ 0), a fraction of the raw vectors (float in
    /// (0, 1]) or a size string (`"512MB"`, `"2GiB"`, `"0.25"`).
    pub fn budget(&mut self, key: &'static str) -> PyResult<Option<Budget>> {
        let Some(v) = self.get(key)? else {
            return Ok(None);
        };
        if v.is_instance_of::<PyBool>() {
            return Err(Self::type_error(
                key,
                "bytes (int), a size string or a fraction",
                &v,
            ));
        }
        if let Ok(s) = v.extract::<String>() {
            return Budget::parse(&s).map(Some).map_err(to_py);
        }
        if v.is_instance_of::<PyFloat>() {
            let f: f64 = v.extract()?;
            return Budget::fraction(f).map(Some).map_err(|_| {
                PyValueError::new_err(format!(
                    "{key}={f} is out of range: a float budget is a fraction of the raw vector \
                     bytes in (0, 1]; give bytes as an int or a string such as '512MB'"
                ))
            });
        }
        match v.extract::<i64>() {
            Ok(b) if b < 0 => Err(PyValueError::new_err(format!(
                "{key}={b} must not be negative"
            ))),
            Ok(b) => Ok(Some(Budget::Bytes(b as u64))),
            Err(_) => Err(Self::type_error(
                key,
                "bytes (int), a size string or a fraction",
                &v,
            )),
        }
    }

    /// Fails on options nobody took.
    pub fn finish(self) -> PyResult<()> {
        let Some(d) = self.dict else {
            return Ok(());
        };
        for k in d.keys() {
            let k: String = k.extract()?;
            if !self.taken.contains(&k) {
                return Err(PyTypeError::new_err(format!(
                    "{}: unexpected option {k:?}; accepted: {}",
                    self.what,
                    self.accepted.join(", ")
                )));
            }
        }
        Ok(())
    }
}

/// The build options' names.
pub static BUILD_KEYS: LazyLock<Vec<&'static str>> =
    LazyLock::new(|| schema::option_names(Stage::Build));

/// External ids: a 1-D integer array, every id in `0..2^63`.
pub fn ids_of(v: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    if let Ok(a) = v.extract::<PyReadonlyArray1<'_, u64>>() {
        let ids: Vec<u64> = a.as_array().iter().copied().collect();
        if let Some((i, &x)) = ids.iter().enumerate().find(|(_, &x)| x > i64::MAX as u64) {
            return Err(PyValueError::new_err(format!(
                "ids[{i}] = {x} does not fit in a signed 64-bit integer (ids must be in 0..2**63)"
            )));
        }
        return Ok(ids);
    }
    macro_rules! signed {
        ($t:ty) => {
            if let Ok(a) = v.extract::<PyReadonlyArray1<'_, $t>>() {
                return a
                    .as_array()
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| {
                        u64::try_from(x).map_err(|_| {
                            PyValueError::new_err(format!(
                                "ids[{i}] = {x} is negative: ids must be in 0..2**63"
                            ))
                        })
                    })
                    .collect();
            }
        };
    }
    signed!(i64);
    signed!(i32);
    if let Ok(a) = v.extract::<PyReadonlyArray1<'_, u32>>() {
        return Ok(a.as_array().iter().map(|&x| x as u64).collect());
    }
    let dtype = v
        .getattr("dtype")
        .and_then(|d| d.str().map(|s| s.to_string()))
        .unwrap_or_else(|_| "not an array".into());
    let ndim = v
        .getattr("ndim")
        .and_then(|d| d.extract::<usize>())
        .unwrap_or(0);
    if ndim != 1 && dtype != "not an array" {
        return Err(PyValueError::new_err(format!(
            "ids must be a 1-D integer array, got {ndim} dimensions"
        )));
    }
    Err(PyTypeError::new_err(format!(
        "ids must be a 1-D array of integers (int64, uint64, int32 or uint32), got {dtype}; \
         floats are refused rather than truncated"
    )))
}

/// Build options from keyword arguments.
pub fn build_options(kw: Option<&Bound<'_, PyDict>>) -> PyResult<BuildOptions> {
    let mut k = Kw::new(kw, "build", BUILD_KEYS.as_slice());
    let d = BuildOptions::default();
    let mut shuffle = d.shuffle.clone();
    if let Some(a) = k.name("shuffle", ShuffleAlgo::parse)? {
        shuffle.algo = a;
    }
    if let Some(x) = k.usize("bnf_iters")? {
        shuffle.bnf_iters = x;
    }
    if let Some(x) = k.f64("bnf_tau")? {
        shuffle.bnf_tau = x;
    }
    if let Some(x) = k.usize("bns_iters")? {
        shuffle.bns_iters = x;
    }
    let ids = match k.get("ids")? {
        Some(v) => Some(ids_of(&v)?),
        None => None,
    };
    let o = BuildOptions {
        metric: k.name("metric", Metric::parse)?.unwrap_or(d.metric),
        preset: k.name("preset", PresetChoice::parse)?.unwrap_or(d.preset),
        r: k.usize("R")?,
        build_l: k.usize("build_L")?,
        alpha: k.f64("alpha")?.map(|a| a as f32),
        passes: k.usize("passes")?,
        saturate: k.bool("saturate")?,
        pq_bytes: k.usize("pq_bytes")?,
        memory_budget: k.budget("memory_budget")?,
        build_memory_budget: k.budget("build_memory_budget")?,
        page_size: k.usize("page_size")?,
        threads: k.usize("threads")?,
        seed: k.u64("seed")?.unwrap_or(d.seed),
        ids,
        overwrite: k.bool("overwrite")?.unwrap_or(false),
        nav_sample: k.f64("nav_sample")?,
        entry_clusters: k.usize("entry_clusters")?,
        layout: k.name("layout", LayoutKind::parse)?,
        shuffle,
        disk_budget: match k.budget("disk_budget")? {
            None => None,
            Some(Budget::Bytes(b)) => Some(b),
            Some(Budget::Fraction(f)) => {
                return Err(PyValueError::new_err(format!(
                    "disk_budget={f} must be bytes (an int, or a size such as '2GiB'), not a \
                     fraction: the page file is never smaller than the raw vectors"
                )))
            }
        },
        adjacency: k.bool("adjacency")?,
        codes: CodeParams {
            principal_dims: k.usize("principal_dims")?,
            bits: k.usize("code_bits")?,
        },
        partition: nearline::planner::options::PartitionOptions {
            head_ratio: k.f64("head_ratio")?,
            replicas: k.usize("replicas")?,
            posting_limit: k.usize("posting_limit")?,
            merge_threshold: k.usize("merge_threshold")?,
            rng_factor: k.f64("rng_factor")?.map(|x| x as f32),
            closure: k.f64("closure")?.map(|x| x as f32),
            reassign_k: k.usize("reassign_k")?,
            lire: k.bool("lire")?,
            recall_target: k.f64("recall_target")?,
        },
        write_ratio: k.f64("write_ratio")?,
        update: update_mode(&mut k)?,
    };
    k.finish()?;
    Ok(o)
}

/// The open options' names.
pub static OPEN_KEYS: LazyLock<Vec<&'static str>> =
    LazyLock::new(|| schema::option_names(Stage::Open));

/// Open options from keyword arguments.
pub fn open_options(kw: Option<&Bound<'_, PyDict>>) -> PyResult<OpenOptions> {
    let mut k = Kw::new(kw, "open", OPEN_KEYS.as_slice());
    let d = OpenOptions::default();
    let o = OpenOptions {
        memory_budget: k.budget("memory_budget")?,
        cache_nodes: k.usize("cache_nodes")?,
        cache: k.name("cache", CacheChoice::parse)?.unwrap_or(d.cache),
        threads: k.usize("threads")?,
        io: k.name("io", EngineKind::parse)?.unwrap_or(d.io),
        entry_points: k.usize("entry_points")?.unwrap_or(0),
        entry: k.name("entry", EntryChoice::parse)?.unwrap_or(d.entry),
        nav_l: k.usize("nav_L")?,
        nav_seeds: k.usize("nav_seeds")?,
        durability: match k.get("durability")? {
            None => d.durability,
            Some(v) => {
                let s: String = v.extract().map_err(|_| {
                    PyTypeError::new_err("durability must be \"sync\" or \"buffered\"")
                })?;
                match s.trim().to_ascii_lowercase().as_str() {
                    "sync" => nearline::update::wal::Durability::Sync,
                    "buffered" => nearline::update::wal::Durability::Buffered,
                    other => {
                        return Err(PyValueError::new_err(format!(
                            "durability={other:?} must be \"sync\" (an acknowledged update \
                             survives power loss) or \"buffered\" (it survives the process \
                             being killed)"
                        )))
                    }
                }
            }
        },
        background_updates: k
            .bool("background_updates")?
            .unwrap_or(d.background_updates),
        read_only: k.bool("read_only")?.unwrap_or(d.read_only),
        update: update_mode(&mut k)?,
    };
    k.finish()?;
    Ok(o)
}

/// The search options' names.
pub static SEARCH_KEYS: LazyLock<Vec<&'static str>> =
    LazyLock::new(|| schema::option_names(Stage::Search));

/// The range options' names besides the search options.
pub static RANGE_KEYS: LazyLock<Vec<&'static str>> =
    LazyLock::new(|| schema::option_names(Stage::Range));

/// Search options from keyword arguments.
pub fn search_options(kw: Option<&Bound<'_, PyDict>>) -> PyResult<SearchOptions> {
    let mut k = Kw::new(kw, "search", SEARCH_KEYS.as_slice());
    let o = reader::search_options(&mut k)?;
    k.finish()?;
    Ok(o)
}

/// Range-search options from keyword arguments.
pub fn range_options(kw: Option<&Bound<'_, PyDict>>) -> PyResult<(SearchOptions, RangeOptions)> {
    let mut k = Kw::new(kw, "range_search", RANGE_KEYS.as_slice());
    let o = reader::range_options(&mut k)?;
    k.finish()?;
    Ok(o)
}

/// Python keyword arguments as the engine's option source: the search
/// options' names and fields are `nearline::planner::reader`'s.
impl OptionReader for Kw<'_, '_> {
    type Error = PyErr;
    fn accepts(&self, key: &str) -> bool {
        Kw::accepts(self, key)
    }
    fn usize(&mut self, key: &'static str) -> PyResult<Option<usize>> {
        Kw::usize(self, key)
    }
    fn f64(&mut self, key: &'static str) -> PyResult<Option<f64>> {
        Kw::f64(self, key)
    }
    fn bool(&mut self, key: &'static str) -> PyResult<Option<bool>> {
        Kw::bool(self, key)
    }
    fn str(&mut self, key: &'static str) -> PyResult<Option<String>> {
        Kw::str(self, key)
    }
    fn int_or_auto(&mut self, key: &'static str) -> PyResult<Option<usize>> {
        let Some(v) = self.get(key)? else {
            return Ok(None);
        };
        if let Ok(s) = v.extract::<String>() {
            if s.trim().eq_ignore_ascii_case("auto") {
                return Ok(None);
            }
            return Err(PyValueError::new_err(format!(
                "{key}={s:?} must be 'auto' or an integer in 1..64"
            )));
        }
        if v.is_instance_of::<PyBool>() || v.is_instance_of::<PyFloat>() {
            return Err(PyTypeError::new_err(format!(
                "{key} must be 'auto' or an integer"
            )));
        }
        match v.extract::<i64>() {
            Ok(q) if q >= 1 => Ok(Some(q as usize)),
            Ok(q) => Err(PyValueError::new_err(format!(
                "{key}={q} must be in 1..64 (or 'auto')"
            ))),
            Err(_) => Err(PyTypeError::new_err(format!(
                "{key} must be 'auto' or an integer"
            ))),
        }
    }
    fn engine_error(&self, e: nearline::Error) -> PyErr {
        to_py(e)
    }
}

/// The shape of an index's queries check: a helper for error messages.
pub fn check_queries_dim(q: &numpy::PyReadonlyArray2<'_, f32>, dim: usize) -> PyResult<()> {
    if q.shape()[1] != dim {
        return Err(PyValueError::new_err(format!(
            "queries have dimension {}, the index has {dim}",
            q.shape()[1]
        )));
    }
    Ok(())
}

/// The `update` option (`None`: "auto").
fn update_mode(k: &mut Kw<'_, '_>) -> PyResult<Option<nearline::format::UpdateMode>> {
    match k.str("update")? {
        None => Ok(None),
        Some(s) => nearline::format::UpdateMode::parse(&s).map_err(PyValueError::new_err),
    }
}
