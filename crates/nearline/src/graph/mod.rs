//! Graph construction: Vamana (batched, parallel, deterministic), the
//! memory-budgeted sharded build, and the point spaces builds run over.

pub mod sharded;
pub mod space;
pub mod vamana;

pub use sharded::{build_with_budget, estimate_build_bytes};
pub use space::{MatrixSpace, PointDistance};
pub use vamana::{build_vamana, medoid, VamanaParams};

/// A directed graph with out-degree at most `r`, stored flat.
#[derive(Debug, Clone, PartialEq)]
pub struct Graph {
    r: usize,
    counts: Vec<u32>,
    adj: Vec<u32>,
}

impl Graph {
    /// An empty graph over `n` nodes with degree bound `r`.
    pub fn new(n: usize, r: usize) -> Self {
        Graph {
            r,
            counts: vec![0; n],
            adj: vec![0; n * r],
        }
    }
    /// Number of nodes.
    #[inline]
    pub fn n(&self) -> usize {
        self.counts.len()
    }
    /// Degree bound.
    #[inline]
    pub fn r(&self) -> usize {
        self.r
    }
    /// Out-neighbours of `v`.
    #[inline]
    pub fn neighbors(&self, v: u32) -> &[u32] {
        let v = v as usize;
        &self.adj[v * self.r..v * self.r + self.counts[v] as usize]
    }
    /// Replaces the out-neighbours of `v` (at most `r`; extra ones are dropped).
    pub fn set_neighbors(&mut self, v: u32, nbrs: &[u32]) {
        let v = v as usize;
        let c = nbrs.len().min(self.r);
        self.adj[v * self.r..v * self.r + c].copy_from_slice(&nbrs[..c]);
        self.counts[v] = c as u32;
    }
    /// Mean out-degree.
    pub fn mean_degree(&self) -> f64 {
        if self.counts.is_empty() {
            return 0.0;
        }
        self.counts.iter().map(|&c| c as f64).sum::<f64>() / self.counts.len() as f64
    }
    /// Bytes this graph holds in memory.
    pub fn memory_bytes(&self) -> usize {
        (self.counts.len() + self.adj.len()) * 4
    }
}
