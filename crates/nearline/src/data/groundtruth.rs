//! Exact k-nearest-neighbour ground truth, multi-threaded and SIMD.

use crate::data::dtype::Element;
use crate::data::files::GroundTruth;
use crate::data::matrix::MatrixView;
use crate::distance::Metric;
use crate::{Error, Result};

/// Exact top-`k` neighbours of every query in `base` under `metric`, ties
/// broken by smaller id. Runs on the caller's current rayon pool.
pub fn compute_ground_truth<T: Element>(
    base: MatrixView<'_, T>,
    queries: MatrixView<'_, T>,
    k: usize,
    metric: Metric,
) -> Result<GroundTruth> {
    let _ = (base, queries, k, metric);
    Err(Error::arg("compute_ground_truth: not implemented yet"))
}
