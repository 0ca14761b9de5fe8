//! Per-query statistics, with the definitions pinned in ARCHITECTURE.md:
//! reads = page reads submitted; bytes = bytes read; hops = nodes expanded;
//! cache hits = expansions served from memory; `io_wait_us` = time the
//! worker waited with nothing of this query to compute; `cpu_us` = time
//! computing for this query; I/O utilisation = bytes of records the search
//! used / bytes read (seed 002 §4.3.2); vertex utilisation ξ = records
//! used / records in the blocks read and path length ℓ = hops − co-located
//! expansions (Starling's Table 2).

/// Statistics of one query.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueryStats {
    pub hops: u32,
    pub reads: u32,
    pub bytes_read: u64,
    pub cache_hits: u32,
    pub pq_distances: u32,
    pub exact_distances: u32,
    pub io_wait_us: f64,
    pub cpu_us: f64,
    /// Time spent computing distances for this query: exact distances of
    /// expanded records and the routing estimates of their neighbours (PQ
    /// lookups or in-record codes), in nanoseconds (part of `cpu_us`).
    pub dist_ns: u64,
    pub total_us: f64,
    /// Bytes of the records this query used out of the blocks it read.
    pub used_bytes: u64,
    /// Records in the blocks this query read.
    pub page_records: u32,
    /// Records of those blocks the search used: the targets it read them
    /// for and, with block search, the co-located records it expanded.
    pub used_records: u32,
    /// Nodes expanded from a page read for another node (block search).
    pub colocated: u32,
    /// Times a range search doubled its candidate list.
    pub doublings: u32,
    /// Exact distances the refine stage computed (two-stage search).
    pub refined: u32,
    /// Page reads the refine stage issued (`reads` less these: the
    /// traversal's).
    pub refine_reads: u32,
    /// Cache hits that held the node's adjacency list only (its exact
    /// distance is the refine stage's).
    pub adjacency_hits: u32,
    /// Nodes expanded without a read from a list a replicated page carried.
    pub replica_hits: u32,
    /// Partition index: posting entries skipped as stale (an older version
    /// of a moved vector) or deleted.
    pub stale: u32,
}

impl QueryStats {
    /// Starling's vertex utilisation ratio ξ: used records / records in
    /// the blocks read (0 when nothing was read).
    pub fn vertex_utilisation(&self) -> f64 {
        if self.page_records == 0 {
            0.0
        } else {
            self.used_records as f64 / self.page_records as f64
        }
    }

    /// Starling's search path length ℓ: nodes the search took from its
    /// candidate list and expanded (hops less co-located expansions).
    pub fn path_length(&self) -> u32 {
        self.hops.saturating_sub(self.colocated)
    }

    /// Used bytes / bytes read (1.0 when nothing was read).
    pub fn io_utilisation(&self) -> f64 {
        if self.bytes_read == 0 {
            1.0
        } else {
            self.used_bytes as f64 / self.bytes_read as f64
        }
    }
}
