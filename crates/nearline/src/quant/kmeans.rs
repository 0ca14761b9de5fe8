//! k-means with k-means++ initialisation and Elkan-accelerated iterations.

use crate::{Error, Result};

/// k-means parameters.
#[derive(Debug, Clone)]
pub struct KMeansParams {
    /// Number of clusters.
    pub k: usize,
    /// Maximum Elkan iterations after seeding.
    pub max_iters: usize,
    /// Seed: results depend only on the data, the parameters and this seed,
    /// never on the number of threads.
    pub seed: u64,
}

/// k-means output.
#[derive(Debug, Clone)]
pub struct KMeansResult {
    /// Row-major `k × dim` centroids.
    pub centroids: Vec<f32>,
    /// Cluster of every input row.
    pub assignment: Vec<u32>,
    /// Iterations run.
    pub iters: usize,
    /// Sum of squared distances to the assigned centroid.
    pub inertia: f64,
}

/// Clusters the row-major `data` (`n × dim`) into `params.k` clusters.
/// Runs on the caller's current rayon pool.
pub fn kmeans(data: &[f32], dim: usize, params: &KMeansParams) -> Result<KMeansResult> {
    let _ = (data, dim, params);
    Err(Error::arg("kmeans: not implemented yet"))
}

/// Indices of the `m` centroids nearest to `x` (squared L2), nearest first.
pub fn nearest_centroids(centroids: &[f32], dim: usize, x: &[f32], m: usize) -> Vec<u32> {
    let _ = (centroids, dim, x, m);
    Vec::new()
}
