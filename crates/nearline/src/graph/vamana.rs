//! Vamana graph construction (DiskANN): greedy search + robust prune with α,
//! two passes, back-edges; batched parallel insertion so the result depends
//! only on the data, the parameters and the seed, never on the thread count.

use super::{Graph, PointDistance};
use crate::data::dtype::Element;
use crate::data::matrix::MatrixView;
use crate::{Error, Result};
use std::sync::atomic::AtomicBool;

/// Vamana build parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct VamanaParams {
    /// Maximum out-degree.
    pub r: usize,
    /// Candidate list size of the insertion search.
    pub l: usize,
    /// Pruning parameter of the last pass (first pass uses 1.0).
    pub alpha: f32,
    /// Number of passes over the points (DiskANN: 2).
    pub passes: usize,
    /// Maximum candidates considered by robust prune.
    pub max_candidates: usize,
    /// Seed of the insertion order.
    pub seed: u64,
}

impl Default for VamanaParams {
    fn default() -> Self {
        VamanaParams {
            r: 64,
            l: 100,
            alpha: 1.2,
            passes: 2,
            max_candidates: 750,
            seed: 0,
        }
    }
}

/// Builds a Vamana graph over `space` starting from `start` (the medoid).
/// `progress(done, total)` is called from the calling thread between batches;
/// when `cancel` becomes true the build stops with [`Error::Cancelled`].
/// Runs on the caller's current rayon pool.
pub fn build_vamana<D: PointDistance>(
    space: &D,
    start: u32,
    params: &VamanaParams,
    progress: &(dyn Fn(u64, u64) + Sync),
    cancel: &AtomicBool,
) -> Result<Graph> {
    let _ = (space, start, params, progress, cancel);
    Err(Error::arg("build_vamana: not implemented yet"))
}

/// The point nearest to the mean of `data` (parallel).
pub fn medoid<T: Element>(data: MatrixView<'_, T>) -> u32 {
    let _ = data;
    0
}
