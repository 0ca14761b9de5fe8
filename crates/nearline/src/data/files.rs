//! Vector and ground-truth files.
//!
//! Formats: `.fbin/.u8bin/.i8bin/.f16bin` (int32 n, int32 d, row-major data),
//! `.fvecs/.bvecs/.ivecs` (each row: int32 d, then d values), `.npy` (2-D,
//! C order, dtype <f4, <f2, |u1, |i1). Ground truth: DiskANN format
//! (int32 n, int32 k, n·k u32 ids, n·k f32 distances) or `.ivecs` (ids only).

use crate::data::dtype::{DType, Element};
use crate::data::matrix::{Matrix, MatrixView};
use crate::{Error, Result};
use std::path::Path;

/// On-disk container of a vector file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VectorFileFormat {
    /// int32 n, int32 d, then n·d elements.
    Bin,
    /// Per row: int32 d, then d elements.
    Vecs,
    /// NumPy `.npy`.
    Npy,
}

/// What [`probe`] learned about a vector file without reading its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VectorFileInfo {
    pub format: VectorFileFormat,
    pub dtype: DType,
    pub n: usize,
    pub dim: usize,
    /// Byte offset of row 0 when the rows are contiguous (Bin, Npy).
    pub data_offset: usize,
    /// Whether rows are contiguous (memory-mappable as a matrix).
    pub contiguous: bool,
}

/// Reads the header of a vector file. The format comes from the extension;
/// `dtype_hint` is needed for a bare `.bin` (defaults to float32) and, if
/// given, must agree with what the file says.
pub fn probe(path: &Path, dtype_hint: Option<DType>) -> Result<VectorFileInfo> {
    let _ = (path, dtype_hint);
    Err(Error::arg("probe: not implemented yet"))
}

/// Opens a vector file as a matrix of `T`: memory-mapped when its rows are
/// contiguous, read into memory otherwise. Errors if the file's dtype is not `T`.
pub fn open_vectors<T: Element>(path: &Path) -> Result<Matrix<T>> {
    let _ = path;
    Err(Error::arg("open_vectors: not implemented yet"))
}

/// Writes vectors; the format comes from the extension and must match `T`.
pub fn write_vectors<T: Element>(path: &Path, data: MatrixView<'_, T>) -> Result<()> {
    let _ = (path, data);
    Err(Error::arg("write_vectors: not implemented yet"))
}

/// Checks that every element is finite (float types); the error names the
/// file (`what`) and the first offending row and column.
pub fn check_finite<T: Element>(what: &str, data: MatrixView<'_, T>) -> Result<()> {
    let _ = (what, data);
    Ok(())
}

/// Exact nearest neighbours of a query set.
#[derive(Debug, Clone, PartialEq)]
pub struct GroundTruth {
    pub n: usize,
    pub k: usize,
    /// Row-major `n × k` internal ids (row order of the base file).
    pub ids: Vec<u32>,
    /// Row-major `n × k` user-facing distances (squared L2, inner product or
    /// cosine similarity), best first.
    pub distances: Vec<f32>,
}

/// Reads a ground-truth file (DiskANN binary format or `.ivecs`).
pub fn read_ground_truth(path: &Path) -> Result<GroundTruth> {
    let _ = path;
    Err(Error::arg("read_ground_truth: not implemented yet"))
}

/// Writes a ground-truth file in DiskANN's binary format.
pub fn write_ground_truth(path: &Path, gt: &GroundTruth) -> Result<()> {
    let _ = (path, gt);
    Err(Error::arg("write_ground_truth: not implemented yet"))
}
