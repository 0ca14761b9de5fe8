//! Python bindings of the nearline engine: conversions and the GIL only;
//! every piece of logic lives in the engine crate.

mod http;
mod options;

use nearline::data::files;
use nearline::data::groundtruth::{compute_ground_truth, compute_range_ground_truth};
use nearline::data::matrix::Matrix;
use nearline::index::Index;
use nearline::io::{measure_read_ceiling, CeilingOptions, EngineKind};
use nearline::planner::DataFacts;
use nearline::search::QueryStats;
use nearline::util::Budget;
use nearline::{with_dtype, DType, Element, Error, Metric};
use numpy::{
    Element as NpElement, IntoPyArray, PyArray1, PyArrayMethods, PyReadonlyArray1,
    PyReadonlyArray2, PyUntypedArrayMethods,
};
use pyo3::create_exception;
use pyo3::exceptions::{
    PyFileNotFoundError, PyKeyboardInterrupt, PyOSError, PyPermissionError, PyRuntimeError,
    PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, RwLock};
use std::time::Duration;

create_exception!(
    _nearline,
    FormatError,
    PyValueError,
    "A file does not have the expected format or version."
);
create_exception!(
    _nearline,
    CorruptIndexError,
    FormatError,
    "Index data failed a checksum or structural check."
);

fn to_py(e: Error) -> PyErr {
    match e {
        Error::InvalidArgument(m) => PyValueError::new_err(m),
        Error::Io { ref source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(e.to_string())
        }
        Error::Io { ref source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
            PyPermissionError::new_err(e.to_string())
        }
        Error::Io { .. } => PyOSError::new_err(e.to_string()),
        Error::Format { .. } | Error::Version { .. } => FormatError::new_err(e.to_string()),
        Error::Corrupt { .. } => CorruptIndexError::new_err(e.to_string()),
        Error::Cancelled => PyKeyboardInterrupt::new_err("operation cancelled"),
        Error::Engine(m) => PyRuntimeError::new_err(m),
    }
}

/// Extracts a 2-D C-contiguous numpy array of T as an owned matrix.
fn matrix_from<T: Element + NpElement>(obj: &Bound<'_, PyAny>) -> PyResult<Option<Matrix<T>>> {
    let Ok(arr) = obj.extract::<PyReadonlyArray2<T>>() else {
        return Ok(None);
    };
    let shape = arr.shape();
    let (n, d) = (shape[0], shape[1]);
    let v = arr
        .as_slice()
        .map_err(|_| PyValueError::new_err("array must be C-contiguous"))?
        .to_vec();
    Ok(Some(Matrix::from_vec(v, n, d).map_err(to_py)?))
}

enum AnyMatrix {
    F32(Matrix<f32>),
    F16(Matrix<half::f16>),
    U8(Matrix<u8>),
    I8(Matrix<i8>),
}

fn any_matrix(obj: &Bound<'_, PyAny>) -> PyResult<AnyMatrix> {
    if let Some(m) = matrix_from::<f32>(obj)? {
        return Ok(AnyMatrix::F32(m));
    }
    if let Some(m) = matrix_from::<half::f16>(obj)? {
        return Ok(AnyMatrix::F16(m));
    }
    if let Some(m) = matrix_from::<u8>(obj)? {
        return Ok(AnyMatrix::U8(m));
    }
    if let Some(m) = matrix_from::<i8>(obj)? {
        return Ok(AnyMatrix::I8(m));
    }
    Err(PyValueError::new_err(
        "data must be a 2-D numpy array of float32, float16, uint8 or int8 (or a path to a vector file)",
    ))
}

/// Runs `work` on a helper thread while this thread forwards progress to
/// Python and turns Ctrl-C into a cancellation.
fn run_cancellable<R: Send>(
    py: Python<'_>,
    progress: Option<Py<PyAny>>,
    work: impl FnOnce(&(dyn Fn(&str, u64, u64) + Sync), &AtomicBool) -> nearline::Result<R> + Send,
) -> PyResult<R> {
    let cancel = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<(String, u64, u64)>();
    let tx = std::sync::Mutex::new(tx);
    let rx = std::sync::Mutex::new(rx);
    let mut interrupted: Option<PyErr> = None;
    let mut cb_error: Option<PyErr> = None;
    let result = std::thread::scope(|sc| {
        let cancel_ref = &cancel;
        let tx_ref = &tx;
        let h = sc.spawn(move || {
            let report = |stage: &str, done: u64, total: u64| {
                if let Ok(t) = tx_ref.lock() {
                    let _ = t.send((stage.to_string(), done, total));
                }
            };
            work(&report, cancel_ref)
        });
        loop {
            let msg = py.detach(|| match rx.lock() {
                Ok(r) => r.recv_timeout(Duration::from_millis(100)),
                Err(_) => Err(mpsc::RecvTimeoutError::Disconnected),
            });
            match msg {
                Ok((stage, done, total)) => {
                    if let (Some(cb), None) = (&progress, &cb_error) {
                        if let Err(e) = cb.call1(py, (stage, done, total)) {
                            cb_error = Some(e);
                            cancel.store(true, Ordering::Relaxed);
                        }
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {}
            }
            if h.is_finished() {
                break;
            }
            if let Err(e) = py.check_signals() {
                interrupted = Some(e);
                cancel.store(true, Ordering::Relaxed);
            }
        }
        h.join()
    });
    if let Some(e) = interrupted {
        return Err(e);
    }
    if let Some(e) = cb_error {
        return Err(e);
    }
    match result {
        Ok(r) => r.map_err(to_py),
        Err(_) => Err(PyRuntimeError::new_err("the worker thread panicked")),
    }
}

fn json_str<T: serde::Serialize>(v: &T) -> PyResult<String> {
    serde_json::to_string(v).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// Builds an index at `path` from an array or a vector file; the options
/// are `options::BUILD_KEYS`. Returns the manifest as JSON.
#[pyfunction]
#[pyo3(signature = (data, path, dtype=None, progress=None, **kwargs))]
fn build_index(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    path: PathBuf,
    dtype: Option<&str>,
    progress: Option<Py<PyAny>>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<String> {
    let opts = options::build_options(kwargs)?;
    let dtype_hint = dtype.map(DType::parse).transpose().map_err(to_py)?;
    if nearline::index::is_partition_build(&opts) {
        let manifest = if let Ok(p) = data.extract::<PathBuf>() {
            run_cancellable(py, progress, |prog, cancel| {
                nearline::index::build_partition_from_file(
                    &p, dtype_hint, &path, &opts, prog, cancel,
                )
            })?
        } else {
            let m = any_matrix(data)?;
            let AnyMatrix::F32(m) = m else {
                return Err(PyValueError::new_err(
                    "a partition index (preset \"spfresh\") stores float32 vectors: pass a \
                     float32 array",
                ));
            };
            run_cancellable(py, progress, move |prog, cancel| {
                nearline::index::build_partition(m.as_slice(), m.dim(), &path, &opts, prog, cancel)
            })?
        };
        return json_str(&manifest);
    }
    let manifest = if let Ok(p) = data.extract::<PathBuf>() {
        run_cancellable(py, progress, |prog, cancel| {
            nearline::index::build_from_file(&p, dtype_hint, &path, &opts, prog, cancel)
        })?
    } else {
        let m = any_matrix(data)?;
        run_cancellable(py, progress, move |prog, cancel| match m {
            AnyMatrix::F32(m) => nearline::index::build(m, &path, &opts, prog, cancel),
            AnyMatrix::F16(m) => nearline::index::build(m, &path, &opts, prog, cancel),
            AnyMatrix::U8(m) => nearline::index::build(m, &path, &opts, prog, cancel),
            AnyMatrix::I8(m) => nearline::index::build(m, &path, &opts, prog, cancel),
        })?
    };
    json_str(&manifest)
}

/// The plan of a build over `n` vectors of `dim` elements of `dtype`
/// (nothing is built): JSON of the planned build.
#[pyfunction]
#[pyo3(signature = (n, dim, dtype, **kwargs))]
fn plan_build(
    n: usize,
    dim: usize,
    dtype: &str,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<String> {
    let opts = options::build_options(kwargs)?;
    let facts = DataFacts {
        n,
        dim,
        dtype: DType::parse(dtype).map_err(to_py)?,
    };
    if nearline::index::is_partition_build(&opts) {
        return json_str(&nearline::index::plan_partition_build(&opts, &facts).map_err(to_py)?);
    }
    json_str(&nearline::index::plan_build(&opts, &facts).map_err(to_py)?)
}

/// What a vector file holds, without reading it: `(n, dim, dtype)`.
#[pyfunction]
#[pyo3(signature = (path, dtype=None))]
fn probe_vectors(path: PathBuf, dtype: Option<&str>) -> PyResult<(usize, usize, &'static str)> {
    let hint = dtype.map(DType::parse).transpose().map_err(to_py)?;
    let info = files::probe(&path, hint).map_err(to_py)?;
    Ok((info.n, info.dim, info.dtype.name()))
}

/// The plan of opening the index at `path` and of a default batch of
/// `nq` queries, without loading it: JSON.
#[pyfunction]
#[pyo3(signature = (path, nq=10_000, **kwargs))]
fn plan_index(path: PathBuf, nq: usize, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<String> {
    let opts = options::open_options(kwargs)?;
    if nearline::index::kind_of(&path).map_err(to_py)? == nearline::format::IndexKind::Partition {
        return json_str(&nearline::index::plan_partition_open(&path, &opts).map_err(to_py)?);
    }
    let m = nearline::io::files::read_manifest(&path).map_err(to_py)?;
    let open = nearline::planner::plan_open(&opts, &m).map_err(to_py)?;
    let facts = nearline::planner::SearchFacts::planned(&m, &open).map_err(to_py)?;
    let search = nearline::planner::plan_search(
        &nearline::planner::SearchOptions::new(10),
        None,
        &facts,
        nq,
    )
    .map_err(to_py)?;
    json_str(&serde_json::json!({
        "index": path.display().to_string(),
        "preset": m.spec.preset.name(),
        "n": m.n, "dim": m.dim, "dtype": m.dtype.name(),
        "entry": open.entry.name(),
        "threads": open.threads,
        "memory": open.memory,
        "open": open.decisions,
        "search": nearline::planner::SearchPlanView::of(&search),
    }))
}

/// Re-seals an index's `manifest.json` after a deliberate edit (tests and
/// tools): recomputes its checksum; nothing else is checked.
#[pyfunction]
fn _reseal_manifest(path: PathBuf) -> PyResult<()> {
    let text = std::fs::read_to_string(&path).map_err(|e| to_py(Error::io(&path, e)))?;
    let sealed = nearline::format::manifest::reseal(&path, &text).map_err(to_py)?;
    std::fs::write(&path, sealed).map_err(|e| to_py(Error::io(&path, e)))
}

/// The names every API accepts (presets, executors, layouts, ...), JSON.
#[pyfunction]
fn vocabulary() -> PyResult<String> {
    json_str(&nearline::planner::vocabulary())
}

/// The API's description of itself (options, statistics, vocabulary,
/// defaults), JSON: what Python's keyword checks, docstrings and CLI, the
/// bench and the server are generated from.
#[pyfunction]
fn schema() -> PyResult<String> {
    json_str(&nearline::planner::schema::schema_json())
}

/// The defaults every API uses when an option is left open, JSON.
#[pyfunction]
fn defaults() -> PyResult<String> {
    json_str(&nearline::planner::defaults_json())
}

/// Per-query statistics as a dict of numpy arrays.
fn stats_dict<'py>(py: Python<'py>, s: &[QueryStats]) -> PyResult<Bound<'py, PyDict>> {
    use nearline::search::stats::{StatGetter, STATS};
    let d = PyDict::new(py);
    for spec in STATS {
        match spec.get {
            StatGetter::U32(f) => {
                d.set_item(spec.name, PyArray1::from_iter(py, s.iter().map(f)))?
            }
            StatGetter::U64(f) => {
                d.set_item(spec.name, PyArray1::from_iter(py, s.iter().map(f)))?
            }
            StatGetter::F64(f) => {
                d.set_item(spec.name, PyArray1::from_iter(py, s.iter().map(f)))?
            }
        }
    }
    Ok(d)
}

/// An open index (the engine side of `nearline.Index`).
#[pyclass(frozen, name = "RawIndex")]
struct RawIndex {
    inner: RwLock<Option<Arc<Index>>>,
}

impl RawIndex {
    fn get(&self) -> PyResult<Arc<Index>> {
        self.inner
            .read()
            .map_err(|_| PyRuntimeError::new_err("index lock poisoned"))?
            .clone()
            .ok_or_else(|| PyValueError::new_err("the index is closed"))
    }
}

/// The row-major values of a C-contiguous query array.
fn contiguous<'a>(queries: &'a PyReadonlyArray2<'_, f32>) -> PyResult<&'a [f32]> {
    queries
        .as_slice()
        .map_err(|_| PyValueError::new_err("queries must be C-contiguous"))
}

#[pymethods]
impl RawIndex {
    #[new]
    #[pyo3(signature = (path, **kwargs))]
    fn new(py: Python<'_>, path: PathBuf, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let opts = options::open_options(kwargs)?;
        let idx = py.detach(|| Index::open(&path, &opts)).map_err(to_py)?;
        Ok(RawIndex {
            inner: RwLock::new(Some(Arc::new(idx))),
        })
    }

    /// k-NN search: `(ids, distances, stats or None)`; options are
    /// `options::SEARCH_KEYS`.
    #[pyo3(signature = (queries, return_stats=false, **kwargs))]
    #[allow(clippy::type_complexity)]
    fn search<'py>(
        &self,
        py: Python<'py>,
        queries: PyReadonlyArray2<'py, f32>,
        return_stats: bool,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<(
        Bound<'py, PyAny>,
        Bound<'py, PyAny>,
        Option<Bound<'py, PyDict>>,
    )> {
        let idx = self.get()?;
        let opts = options::search_options(kwargs)?;
        options::check_queries_dim(&queries, idx.dim())?;
        let nq = queries.shape()[0];
        let q = contiguous(&queries)?;
        let out = py.detach(|| idx.search(q, nq, &opts)).map_err(to_py)?;
        let stats = if return_stats {
            Some(stats_dict(py, &out.stats)?)
        } else {
            None
        };
        let k = opts.k;
        let ids = out.ids.into_pyarray(py).reshape([nq, k])?.into_any();
        let dists = out.distances.into_pyarray(py).reshape([nq, k])?.into_any();
        Ok((ids, dists, stats))
    }

    /// Range search: `(lims, ids, distances, stats or None)` in CSR form;
    /// options are `options::RANGE_KEYS`.
    #[pyo3(signature = (queries, radius, return_stats=false, **kwargs))]
    #[allow(clippy::type_complexity)]
    fn range_search<'py>(
        &self,
        py: Python<'py>,
        queries: PyReadonlyArray2<'py, f32>,
        radius: f32,
        return_stats: bool,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<(
        Bound<'py, PyAny>,
        Bound<'py, PyAny>,
        Bound<'py, PyAny>,
        Option<Bound<'py, PyDict>>,
    )> {
        let idx = self.get()?;
        let (opts, range) = options::range_options(kwargs)?;
        options::check_queries_dim(&queries, idx.dim())?;
        let nq = queries.shape()[0];
        let q = contiguous(&queries)?;
        let out = py
            .detach(|| idx.range_search(q, nq, radius, &range, &opts))
            .map_err(to_py)?;
        let stats = if return_stats {
            Some(stats_dict(py, &out.stats)?)
        } else {
            None
        };
        let lims: Vec<i64> = out.lims.iter().map(|&x| x as i64).collect();
        Ok((
            lims.into_pyarray(py).into_any(),
            out.ids.into_pyarray(py).into_any(),
            out.distances.into_pyarray(py).into_any(),
            stats,
        ))
    }

    /// The plan a batch of `nq` queries with these search options gets
    /// (JSON), without running it.
    #[pyo3(signature = (nq, **kwargs))]
    fn plan_search(&self, nq: usize, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<String> {
        let idx = self.get()?;
        let opts = options::search_options(kwargs)?;
        let p = idx.plan_search(&opts, None, nq).map_err(to_py)?;
        json_str(&nearline::planner::SearchPlanView::of(&p))
    }

    fn info(&self) -> PyResult<String> {
        Ok(self.get()?.info().to_string())
    }

    /// Inserts float32 rows: returns their ids.
    #[pyo3(signature = (vectors, ids=None))]
    fn insert<'py>(
        &self,
        py: Python<'py>,
        vectors: PyReadonlyArray2<'py, f32>,
        ids: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let idx = self.get()?;
        options::check_queries_dim(&vectors, idx.dim())?;
        let v = contiguous(&vectors)?;
        let ids = ids.map(options::ids_of).transpose()?;
        let out = py.detach(|| idx.insert(v, ids.as_deref())).map_err(to_py)?;
        let out: Vec<i64> = out.into_iter().map(|x| x as i64).collect();
        Ok(out.into_pyarray(py).into_any())
    }

    /// Checks an insert without doing it.
    fn validate_insert<'py>(
        &self,
        py: Python<'py>,
        vectors: PyReadonlyArray2<'py, f32>,
        ids: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<()> {
        let idx = self.get()?;
        options::check_queries_dim(&vectors, idx.dim())?;
        let v = contiguous(&vectors)?;
        let ids = ids.map(options::ids_of).transpose()?;
        py.detach(|| idx.validate_insert(v, ids.as_deref()))
            .map_err(to_py)
    }

    /// Deletes ids: returns how many were live.
    fn delete(&self, py: Python<'_>, ids: &Bound<'_, PyAny>) -> PyResult<usize> {
        let idx = self.get()?;
        let ids = options::ids_of(ids)?;
        py.detach(|| idx.delete(&ids)).map_err(to_py)
    }

    /// Writes a checkpoint: returns the log sequence it holds.
    fn checkpoint(&self, py: Python<'_>) -> PyResult<u64> {
        let idx = self.get()?;
        py.detach(|| idx.checkpoint()).map_err(to_py)
    }

    /// Runs queued splits, merges and reassignments now.
    fn maintain(&self, py: Python<'_>) -> PyResult<()> {
        let idx = self.get()?;
        py.detach(|| idx.maintain()).map_err(to_py)
    }

    /// Verifies the index (either kind): JSON report.
    fn check(&self, py: Python<'_>) -> PyResult<String> {
        let idx = self.get()?;
        let r = py.detach(|| idx.check_json()).map_err(to_py)?;
        json_str(&r)
    }

    /// The live ids.
    fn live_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let idx = self.get()?;
        let ids: Vec<i64> = idx
            .live_ids()
            .map_err(to_py)?
            .into_iter()
            .map(|x| x as i64)
            .collect();
        Ok(ids.into_pyarray(py).into_any())
    }

    fn close(&self) -> PyResult<()> {
        let mut g = self
            .inner
            .write()
            .map_err(|_| PyRuntimeError::new_err("index lock poisoned"))?;
        *g = None;
        Ok(())
    }

    #[getter]
    fn closed(&self) -> PyResult<bool> {
        Ok(self
            .inner
            .read()
            .map_err(|_| PyRuntimeError::new_err("index lock poisoned"))?
            .is_none())
    }
}

fn array_of<'py, T: Element + NpElement>(
    py: Python<'py>,
    m: Matrix<T>,
) -> PyResult<Bound<'py, PyAny>> {
    let (n, d) = (m.n(), m.dim());
    Ok(m.into_vec().into_pyarray(py).reshape([n, d])?.into_any())
}

#[pyfunction]
#[pyo3(signature = (path, dtype=None))]
fn read_vectors<'py>(
    py: Python<'py>,
    path: PathBuf,
    dtype: Option<&str>,
) -> PyResult<Bound<'py, PyAny>> {
    let hint = dtype.map(DType::parse).transpose().map_err(to_py)?;
    let info = files::probe(&path, hint).map_err(to_py)?;
    with_dtype!(info.dtype, T, {
        let m = py
            .detach(|| {
                files::open_vectors::<T>(&path)
                    .map(|m| Matrix::from_vec(m.as_slice().to_vec(), m.n(), m.dim()))
            })
            .map_err(to_py)?
            .map_err(to_py)?;
        array_of(py, m)
    })
}

#[pyfunction]
fn write_vectors(py: Python<'_>, path: PathBuf, data: &Bound<'_, PyAny>) -> PyResult<()> {
    let m = any_matrix(data)?;
    py.detach(|| match &m {
        AnyMatrix::F32(m) => files::write_vectors(&path, m.view()),
        AnyMatrix::F16(m) => files::write_vectors(&path, m.view()),
        AnyMatrix::U8(m) => files::write_vectors(&path, m.view()),
        AnyMatrix::I8(m) => files::write_vectors(&path, m.view()),
    })
    .map_err(to_py)
}

fn gt_typed<T: Element>(
    base: &Matrix<T>,
    queries: &Matrix<T>,
    k: usize,
    metric: Metric,
    threads: usize,
) -> nearline::Result<files::GroundTruth> {
    if base.dim() != queries.dim() {
        return Err(Error::arg(format!(
            "base has dimension {}, queries {}",
            base.dim(),
            queries.dim()
        )));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Error::Engine(e.to_string()))?;
    pool.install(|| compute_ground_truth(base.view(), queries.view(), k, metric))
}

#[pyfunction]
#[pyo3(signature = (base, queries, k, metric="l2", threads=None))]
fn ground_truth<'py>(
    py: Python<'py>,
    base: &Bound<'py, PyAny>,
    queries: &Bound<'py, PyAny>,
    k: usize,
    metric: &str,
    threads: Option<usize>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let metric = Metric::parse(metric).map_err(to_py)?;
    let threads = threads
        .unwrap_or_else(nearline::planner::default_threads)
        .max(1);
    let b = any_matrix(base)?;
    let q = any_matrix(queries)?;
    let gt = py
        .detach(|| match (&b, &q) {
            (AnyMatrix::F32(b), AnyMatrix::F32(q)) => gt_typed(b, q, k, metric, threads),
            (AnyMatrix::F16(b), AnyMatrix::F16(q)) => gt_typed(b, q, k, metric, threads),
            (AnyMatrix::U8(b), AnyMatrix::U8(q)) => gt_typed(b, q, k, metric, threads),
            (AnyMatrix::I8(b), AnyMatrix::I8(q)) => gt_typed(b, q, k, metric, threads),
            _ => Err(Error::arg("base and queries must have the same dtype")),
        })
        .map_err(to_py)?;
    gt_to_py(py, gt)
}

fn gt_to_py<'py>(
    py: Python<'py>,
    gt: files::GroundTruth,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let (n, k) = (gt.n, gt.k);
    let ids: Vec<i64> = gt.ids.iter().map(|&x| x as i64).collect();
    let ids = ids.into_pyarray(py).reshape([n, k])?.into_any();
    let d = if gt.distances.is_empty() {
        py.None().into_bound(py)
    } else {
        gt.distances.into_pyarray(py).reshape([n, k])?.into_any()
    };
    Ok((ids, d))
}

#[pyfunction]
fn read_ground_truth<'py>(
    py: Python<'py>,
    path: PathBuf,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let gt = py
        .detach(|| files::read_ground_truth(&path))
        .map_err(to_py)?;
    gt_to_py(py, gt)
}

#[pyfunction]
fn write_ground_truth(
    py: Python<'_>,
    path: PathBuf,
    ids: PyReadonlyArray2<'_, i64>,
    distances: PyReadonlyArray2<'_, f32>,
) -> PyResult<()> {
    let (n, k) = (ids.shape()[0], ids.shape()[1]);
    if distances.shape() != [n, k] {
        return Err(PyValueError::new_err(format!(
            "distances has shape {:?}, ids has ({n}, {k})",
            distances.shape()
        )));
    }
    let idv: Vec<u32> = ids
        .as_array()
        .iter()
        .map(|&x| {
            u32::try_from(x).map_err(|_| {
                PyValueError::new_err(format!("ground-truth id {x} is not in 0..2^32"))
            })
        })
        .collect::<PyResult<_>>()?;
    let gt = files::GroundTruth {
        n,
        k,
        ids: idv,
        distances: distances.as_array().iter().copied().collect(),
    };
    py.detach(|| files::write_ground_truth(&path, &gt))
        .map_err(to_py)
}

fn range_gt_typed<T: Element>(
    base: &Matrix<T>,
    queries: &Matrix<T>,
    radius: f32,
    metric: Metric,
    threads: usize,
) -> nearline::Result<files::RangeGroundTruth> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Error::Engine(e.to_string()))?;
    pool.install(|| compute_range_ground_truth(base.view(), queries.view(), radius, metric))
}

type RangeArrays<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>);

fn range_gt_to_py<'py>(py: Python<'py>, gt: files::RangeGroundTruth) -> PyResult<RangeArrays<'py>> {
    let lims: Vec<i64> = gt.lims.iter().map(|&x| x as i64).collect();
    let ids: Vec<i64> = gt.ids.iter().map(|&x| x as i64).collect();
    let d = if gt.distances.is_empty() && !gt.ids.is_empty() {
        py.None().into_bound(py)
    } else {
        gt.distances.into_pyarray(py).into_any()
    };
    Ok((
        lims.into_pyarray(py).into_any(),
        ids.into_pyarray(py).into_any(),
        d,
    ))
}

/// Exact range ground truth: `(lims, ids, distances)` in CSR form.
#[pyfunction]
#[pyo3(signature = (base, queries, radius, metric="l2", threads=None))]
fn range_ground_truth<'py>(
    py: Python<'py>,
    base: &Bound<'py, PyAny>,
    queries: &Bound<'py, PyAny>,
    radius: f64,
    metric: &str,
    threads: Option<usize>,
) -> PyResult<RangeArrays<'py>> {
    let metric = Metric::parse(metric).map_err(to_py)?;
    let threads = threads
        .unwrap_or_else(nearline::planner::default_threads)
        .max(1);
    let b = any_matrix(base)?;
    let q = any_matrix(queries)?;
    let r = radius as f32;
    let gt = py
        .detach(|| match (&b, &q) {
            (AnyMatrix::F32(b), AnyMatrix::F32(q)) => range_gt_typed(b, q, r, metric, threads),
            (AnyMatrix::F16(b), AnyMatrix::F16(q)) => range_gt_typed(b, q, r, metric, threads),
            (AnyMatrix::U8(b), AnyMatrix::U8(q)) => range_gt_typed(b, q, r, metric, threads),
            (AnyMatrix::I8(b), AnyMatrix::I8(q)) => range_gt_typed(b, q, r, metric, threads),
            _ => Err(Error::arg("base and queries must have the same dtype")),
        })
        .map_err(to_py)?;
    range_gt_to_py(py, gt)
}

#[pyfunction]
fn read_range_ground_truth<'py>(py: Python<'py>, path: PathBuf) -> PyResult<RangeArrays<'py>> {
    let gt = py
        .detach(|| files::read_range_ground_truth(&path))
        .map_err(to_py)?;
    range_gt_to_py(py, gt)
}

#[pyfunction]
#[pyo3(signature = (path, lims, ids, distances=None))]
fn write_range_ground_truth(
    py: Python<'_>,
    path: PathBuf,
    lims: PyReadonlyArray1<'_, i64>,
    ids: PyReadonlyArray1<'_, i64>,
    distances: Option<PyReadonlyArray1<'_, f32>>,
) -> PyResult<()> {
    let limv: Vec<u64> = lims
        .as_array()
        .iter()
        .map(|&x| {
            u64::try_from(x).map_err(|_| {
                PyValueError::new_err(format!("range ground truth: lims has a negative entry {x}"))
            })
        })
        .collect::<PyResult<_>>()?;
    let idv: Vec<u32> = ids
        .as_array()
        .iter()
        .map(|&x| {
            u32::try_from(x).map_err(|_| {
                PyValueError::new_err(format!("range ground-truth id {x} is not in 0..2^32"))
            })
        })
        .collect::<PyResult<_>>()?;
    let gt = files::RangeGroundTruth {
        lims: limv,
        ids: idv,
        distances: distances
            .map(|d| d.as_array().iter().copied().collect())
            .unwrap_or_default(),
    };
    py.detach(|| files::write_range_ground_truth(&path, &gt))
        .map_err(to_py)
}

#[pyfunction]
#[pyo3(name = "parse_budget")]
fn py_parse_budget(value: &str, raw_bytes: u64) -> PyResult<u64> {
    Ok(Budget::parse(value).map_err(to_py)?.resolve(raw_bytes))
}

#[pyfunction]
fn simd_level() -> &'static str {
    nearline::kernels::simd_level()
}

#[pyfunction]
fn check_dtype(name: &str) -> PyResult<&'static str> {
    Ok(DType::parse(name).map_err(to_py)?.name())
}

/// Random aligned block reads per second on a file (see `nearline::io::ceiling`).
#[pyfunction]
#[pyo3(signature = (path, block_size=4096, depth=32, seconds=3.0, io="auto", seed=0))]
fn read_ceiling<'py>(
    py: Python<'py>,
    path: PathBuf,
    block_size: usize,
    depth: u32,
    seconds: f64,
    io: &str,
    seed: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let opts = CeilingOptions {
        block_size,
        depth,
        seconds,
        io: EngineKind::parse(io).map_err(to_py)?,
        seed,
    };
    opts.validate().map_err(to_py)?;
    let r = run_cancellable(py, None, |_progress, cancel| {
        measure_read_ceiling(&path, &opts, Some(cancel))
    })?;
    let d = PyDict::new(py);
    d.set_item("path", r.path.to_string_lossy().into_owned())?;
    d.set_item("reads", r.reads)?;
    d.set_item("bytes", r.bytes)?;
    d.set_item("elapsed_s", r.elapsed_s)?;
    d.set_item("reads_per_s", r.reads_per_s)?;
    d.set_item("bytes_per_s", r.bytes_per_s)?;
    d.set_item("mean_read_latency_us", r.mean_read_latency_us)?;
    d.set_item("latency_p50_us", r.latency_p50_us)?;
    d.set_item("latency_p99_us", r.latency_p99_us)?;
    d.set_item("latency_p999_us", r.latency_p999_us)?;
    d.set_item("latency_max_us", r.latency_max_us)?;
    d.set_item("stalls", r.stalls)?;
    d.set_item("stall_s", r.stall_s)?;
    d.set_item("engine", r.engine)?;
    d.set_item("direct_io", r.direct_io)?;
    d.set_item("depth", r.depth)?;
    d.set_item("block_size", r.block_size)?;
    d.set_item("file_blocks", r.file_blocks)?;
    Ok(d)
}

#[pymodule]
fn _nearline(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("FormatError", m.py().get_type::<FormatError>())?;
    m.add("CorruptIndexError", m.py().get_type::<CorruptIndexError>())?;
    m.add_class::<RawIndex>()?;
    m.add_class::<http::HttpServer>()?;
    m.add_function(wrap_pyfunction!(build_index, m)?)?;
    m.add_function(wrap_pyfunction!(plan_build, m)?)?;
    m.add_function(wrap_pyfunction!(plan_index, m)?)?;
    m.add_function(wrap_pyfunction!(probe_vectors, m)?)?;
    m.add_function(wrap_pyfunction!(vocabulary, m)?)?;
    m.add_function(wrap_pyfunction!(schema, m)?)?;
    m.add_function(wrap_pyfunction!(_reseal_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(defaults, m)?)?;
    m.add_function(wrap_pyfunction!(read_vectors, m)?)?;
    m.add_function(wrap_pyfunction!(write_vectors, m)?)?;
    m.add_function(wrap_pyfunction!(ground_truth, m)?)?;
    m.add_function(wrap_pyfunction!(read_ground_truth, m)?)?;
    m.add_function(wrap_pyfunction!(write_ground_truth, m)?)?;
    m.add_function(wrap_pyfunction!(range_ground_truth, m)?)?;
    m.add_function(wrap_pyfunction!(read_range_ground_truth, m)?)?;
    m.add_function(wrap_pyfunction!(write_range_ground_truth, m)?)?;
    m.add_function(wrap_pyfunction!(py_parse_budget, m)?)?;
    m.add_function(wrap_pyfunction!(simd_level, m)?)?;
    m.add_function(wrap_pyfunction!(check_dtype, m)?)?;
    m.add_function(wrap_pyfunction!(read_ceiling, m)?)?;
    Ok(())
}
