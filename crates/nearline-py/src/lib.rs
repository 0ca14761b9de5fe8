//! Python bindings of the nearline engine (no logic the engine lacks).
use pyo3::prelude::*;

#[pymodule]
fn _nearline(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
