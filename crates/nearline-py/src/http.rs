//! The HTTP front end (`crates/nearline-http`) as a Python object: the
//! Python server (`nearline/server.py`) starts it with its open indexes,
//! its tokens and limits, and a callable that answers the endpoints the
//! front end does not (the delegate, called with the GIL held).

use crate::RawIndex;
use nearline_http::{Config, Delegate, Limits, Reply, Server, Tokens};
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A Python callable `(op, collection, body: bytes, query: str) ->
/// (status, content_type, body: bytes)`.
struct PyDelegate(Py<PyAny>);

impl Delegate for PyDelegate {
    fn call(&self, op: &str, collection: Option<&str>, body: &[u8], query: &str) -> Reply {
        Python::attach(|py| {
            let out = self
                .0
                .call1(py, (op, collection, PyBytes::new(py, body), query))
                .and_then(|v| {
                    let (status, ctype, b): (u16, String, Bound<'_, PyBytes>) = v.extract(py)?;
                    Ok(Reply {
                        status,
                        content_type: ctype,
                        body: b.as_bytes().to_vec(),
                    })
                });
            out.unwrap_or_else(|e| {
                let msg = serde_json::json!({"error": format!("{op}: {e}"),
                                             "type": "RuntimeError", "status": 500});
                Reply {
                    status: 500,
                    content_type: "application/json".into(),
                    body: msg.to_string().into_bytes(),
                }
            })
        })
    }
}

fn seconds(d: &Bound<'_, PyDict>, key: &str) -> PyResult<Duration> {
    let v: f64 = item(d, key)?;
    Duration::try_from_secs_f64(v).map_err(|_| {
        PyValueError::new_err(format!("{key}={v} must be a positive number of seconds"))
    })
}

fn item<'py, T: FromPyObject<'py>>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<T> {
    d.get_item(key)?
        .ok_or_else(|| PyValueError::new_err(format!("limits need {key}")))?
        .extract()
}

/// A running HTTP front end (`nearline.server.Server` owns one).
#[pyclass(frozen, name = "HttpServer")]
pub struct HttpServer {
    inner: Mutex<Option<Server>>,
    addr: (String, u16),
}

impl HttpServer {
    fn with<T>(&self, f: impl FnOnce(&Server) -> T) -> PyResult<Option<T>> {
        let g = self
            .inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("server lock poisoned"))?;
        Ok(g.as_ref().map(f))
    }
}

#[pymethods]
impl HttpServer {
    /// Binds `host:port` and serves `collections` (name → RawIndex) in
    /// background threads. `limits`: max_body, max_batch, max_values,
    /// deadline, max_concurrent, idle_timeout, grace.
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (host, port, collections, read_tokens, write_tokens, limits, openapi, delegate, server_name, io_threads=2))]
    fn new(
        py: Python<'_>,
        host: String,
        port: u16,
        collections: &Bound<'_, PyDict>,
        read_tokens: Vec<String>,
        write_tokens: Vec<String>,
        limits: &Bound<'_, PyDict>,
        openapi: &Bound<'_, PyBytes>,
        delegate: Py<PyAny>,
        server_name: String,
        io_threads: usize,
    ) -> PyResult<Self> {
        let mut indexes = BTreeMap::new();
        for (name, raw) in collections.iter() {
            let raw = raw.cast::<RawIndex>()?;
            indexes.insert(name.extract::<String>()?, raw.get().get()?);
        }
        let cfg = Config {
            host,
            port,
            limits: Limits {
                max_body: item(limits, "max_body")?,
                max_batch: item(limits, "max_batch")?,
                max_values: item(limits, "max_values")?,
                deadline: seconds(limits, "deadline")?,
                max_concurrent: item(limits, "max_concurrent")?,
                idle_timeout: seconds(limits, "idle_timeout")?,
                grace: seconds(limits, "grace")?,
            },
            tokens: Tokens {
                read: read_tokens,
                write: write_tokens,
            },
            openapi: openapi.as_bytes().to_vec(),
            server_name,
            io_threads,
        };
        let server = py
            .detach(|| Server::start(cfg, indexes, Arc::new(PyDelegate(delegate))))
            .map_err(|e| PyOSError::new_err(format!("cannot serve: {e}")))?;
        let a = server.local_addr();
        Ok(HttpServer {
            addr: (a.ip().to_string(), a.port()),
            inner: Mutex::new(Some(server)),
        })
    }

    /// `(host, port)` it listens on.
    #[getter]
    fn address(&self) -> (String, u16) {
        self.addr.clone()
    }

    /// Requests being answered now.
    #[getter]
    fn in_flight(&self) -> PyResult<usize> {
        Ok(self.with(Server::in_flight)?.unwrap_or(0))
    }

    #[getter]
    fn draining(&self) -> PyResult<bool> {
        Ok(self.with(Server::draining)?.unwrap_or(true))
    }

    /// New requests get 503 from now on.
    fn begin_drain(&self) -> PyResult<()> {
        self.with(Server::begin_drain)?;
        Ok(())
    }

    /// The requests answered since the last call, as `(collection, op,
    /// status, seconds, queries, reads, cache_hits)` tuples, and how many
    /// were dropped uncollected.
    #[allow(clippy::type_complexity)]
    fn take_events(
        &self,
    ) -> PyResult<(Vec<(String, &'static str, u16, f64, u64, u64, u64)>, usize)> {
        let Some((ev, dropped)) = self.with(Server::take_events)? else {
            return Ok((vec![], 0));
        };
        let out = ev
            .into_iter()
            .map(|e| {
                (
                    e.collection,
                    e.op,
                    e.status,
                    e.seconds,
                    e.searched.queries,
                    e.searched.reads,
                    e.searched.cache_hits,
                )
            })
            .collect();
        Ok((out, dropped))
    }

    /// Drains (requests in flight finish, up to the grace period) and
    /// stops; the indexes are released. Idempotent.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        let server = self
            .inner
            .lock()
            .map_err(|_| PyRuntimeError::new_err("server lock poisoned"))?
            .take();
        if let Some(mut s) = server {
            // Requests in flight may call back into Python: wait without the GIL.
            py.detach(move || s.stop());
        }
        Ok(())
    }
}
