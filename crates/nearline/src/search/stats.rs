//! Per-query statistics, with the definitions pinned in ARCHITECTURE.md:
//! reads = page reads submitted; bytes = bytes read; hops = nodes expanded;
//! cache hits = expansions served from memory; `io_wait_us` = time the
//! worker waited with nothing of this query to compute; `cpu_us` = time
//! computing for this query; I/O utilisation = bytes of records the search
//! used / bytes read (seed 002 §4.3.2).

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
    pub total_us: f64,
    /// Bytes of the records this query used out of the blocks it read.
    pub used_bytes: u64,
}

impl QueryStats {
    /// Used bytes / bytes read (1.0 when nothing was read).
    pub fn io_utilisation(&self) -> f64 {
        if self.bytes_read == 0 {
            1.0
        } else {
            self.used_bytes as f64 / self.bytes_read as f64
        }
    }
}
