//! Graph construction: Vamana (batched, parallel, deterministic), the
//! memory-budgeted sharded build, and the point spaces builds run over.

pub mod dynamic;
pub mod merge;
pub mod nav;
pub mod sharded;
pub mod space;
pub mod vamana;

use crate::util::BigBuf;
pub use nav::NavGraph;
pub use sharded::{build_with_budget, estimate_build_bytes, plan_graph_build, GraphBuild};
pub use space::{MatrixSpace, PointDistance};
pub use vamana::{
    build_vamana, medoid, search_graph, search_graph_with, SearchScratch, VamanaParams,
};

/// A directed graph with out-degree at most `r`, stored flat (a large graph
/// in its own mapping, returned to the kernel when it drops: see
/// [`BigBuf`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Graph {
    r: usize,
    counts: BigBuf<u32>,
    adj: BigBuf<u32>,
}

impl Graph {
    /// An empty graph over `n` nodes with degree bound `r`.
    pub fn new(n: usize, r: usize) -> Self {
        Graph {
            r,
            counts: BigBuf::zeroed(n),
            adj: BigBuf::zeroed(n * r),
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
    /// Appends `u` to the out-neighbours of `v`; returns `false` (and changes
    /// nothing) when the list is already full.
    #[inline]
    pub fn push_neighbor(&mut self, v: u32, u: u32) -> bool {
        let vi = v as usize;
        let c = self.counts[vi] as usize;
        if c >= self.r {
            return false;
        }
        self.adj[vi * self.r + c] = u;
        self.counts[vi] += 1;
        true
    }
    /// Out-degree of `v`.
    #[inline]
    pub fn degree(&self, v: u32) -> usize {
        self.counts[v as usize] as usize
    }
    /// Largest out-degree.
    pub fn max_degree(&self) -> usize {
        self.counts.iter().copied().max().unwrap_or(0) as usize
    }
    /// Lowers the degree bound to `r` in place (no second allocation; the
    /// freed tail of a mapped adjacency goes back to the kernel). Lists longer than `r` are truncated, so
    /// callers prune them first.
    pub fn shrink_degree(&mut self, r: usize) {
        if r >= self.r {
            return;
        }
        let old = self.r;
        for v in 0..self.counts.len() {
            let c = (self.counts[v] as usize).min(r);
            // Destination starts at or before the source: a forward copy is safe.
            self.adj.copy_within(v * old..v * old + c, v * r);
            self.counts[v] = c as u32;
        }
        let len = self.counts.len() * r;
        self.adj.truncate(len);
        self.r = r;
    }
    /// Number of edges.
    pub fn num_edges(&self) -> usize {
        self.counts.iter().map(|&c| c as usize).sum()
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

    /// Every node once, breadth-first from `seeds` (in their order), then
    /// the nodes they do not reach in id order: the order in which a
    /// search starting at the seeds is likely to need nodes.
    pub fn bfs_order(&self, seeds: &[u32]) -> Vec<u32> {
        let n = self.n();
        let mut seen = vec![false; n];
        let mut order = Vec::with_capacity(n);
        for &s in seeds {
            if (s as usize) < n && !seen[s as usize] {
                seen[s as usize] = true;
                order.push(s);
            }
        }
        let mut head = 0;
        while head < order.len() {
            let v = order[head];
            head += 1;
            for &u in self.neighbors(v) {
                if (u as usize) < n && !seen[u as usize] {
                    seen[u as usize] = true;
                    order.push(u);
                }
            }
        }
        order.extend((0..n as u32).filter(|&v| !seen[v as usize]));
        order
    }
}
