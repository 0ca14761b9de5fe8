//! Memory-budgeted build: when the data and graph of a one-shot build exceed
//! the build budget, partition with k-means (each point in its 2 nearest
//! parts), build each part, merge, and prune back to R (as DiskANN does).

use super::{Graph, VamanaParams};
use crate::data::dtype::Element;
use crate::data::matrix::Matrix;
use crate::distance::Metric;
use crate::{Error, Result};
use std::sync::atomic::AtomicBool;

/// Estimated peak bytes of a one-shot build of `n` points of `dim` elements
/// of `elem_size` bytes with degree `r` (vectors resident + graph + slack).
pub fn estimate_build_bytes(n: usize, dim: usize, elem_size: usize, r: usize) -> u64 {
    let _ = (n, dim, elem_size, r);
    0
}

/// Builds the graph of `data` within `budget_bytes` of resident memory:
/// one-shot when it fits, sharded otherwise. Returns the graph and its medoid.
/// `progress(done, total)` reports overall progress; `cancel` stops the build.
/// Runs on the caller's current rayon pool.
pub fn build_with_budget<T: Element>(
    data: &Matrix<T>,
    metric: Metric,
    params: &VamanaParams,
    budget_bytes: u64,
    progress: &(dyn Fn(u64, u64) + Sync),
    cancel: &AtomicBool,
) -> Result<(Graph, u32)> {
    let _ = (data, metric, params, budget_bytes, progress, cancel);
    Err(Error::arg("build_with_budget: not implemented yet"))
}
