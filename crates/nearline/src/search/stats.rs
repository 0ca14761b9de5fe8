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

/// How a statistic is read off a query's [`QueryStats`] (its numpy dtype).
#[derive(Clone, Copy)]
pub enum StatGetter {
    /// A count that fits 32 bits.
    U32(fn(&QueryStats) -> u32),
    /// A count of bytes.
    U64(fn(&QueryStats) -> u64),
    /// A time or a ratio.
    F64(fn(&QueryStats) -> f64),
}

/// One per-query statistic as the API returns it: its name, what it counts
/// and how to read it. [`STATS`] is the only list: the bindings return
/// exactly these, and the docs are generated from it.
#[derive(Clone, Copy)]
pub struct StatSpec {
    /// Its key in the statistics the search returns.
    pub name: &'static str,
    /// What it counts.
    pub doc: &'static str,
    /// How to read it.
    pub get: StatGetter,
}

impl StatSpec {
    /// The numpy dtype of its array.
    pub fn dtype(&self) -> &'static str {
        match self.get {
            StatGetter::U32(_) => "uint32",
            StatGetter::U64(_) => "uint64",
            StatGetter::F64(_) => "float64",
        }
    }
}

/// Every per-query statistic a search returns.
pub const STATS: &[StatSpec] = &[
    StatSpec {
        name: "hops",
        doc: "nodes expanded (not beam rounds); a partition index: postings read",
        get: StatGetter::U32(|s| s.hops),
    },
    StatSpec {
        name: "reads",
        doc: "page reads submitted",
        get: StatGetter::U32(|s| s.reads),
    },
    StatSpec {
        name: "bytes_read",
        doc: "bytes read from disk",
        get: StatGetter::U64(|s| s.bytes_read),
    },
    StatSpec {
        name: "cache_hits",
        doc: "expansions served from memory",
        get: StatGetter::U32(|s| s.cache_hits),
    },
    StatSpec {
        name: "adjacency_hits",
        doc:
            "cache hits holding the adjacency list only (the exact distance is the refine stage's)",
        get: StatGetter::U32(|s| s.adjacency_hits),
    },
    StatSpec {
        name: "replica_hits",
        doc: "nodes expanded from a list a replicated page carried",
        get: StatGetter::U32(|s| s.replica_hits),
    },
    StatSpec {
        name: "refine_reads",
        doc: "reads of the refine stage (the rest are the traversal's)",
        get: StatGetter::U32(|s| s.refine_reads),
    },
    StatSpec {
        name: "refined",
        doc: "exact distances the refine stage computed (two-stage search)",
        get: StatGetter::U32(|s| s.refined),
    },
    StatSpec {
        name: "stale",
        doc: "partition index: posting entries skipped as stale or deleted",
        get: StatGetter::U32(|s| s.stale),
    },
    StatSpec {
        name: "pq_distances",
        doc: "routing estimates computed (PQ or in-record codes)",
        get: StatGetter::U32(|s| s.pq_distances),
    },
    StatSpec {
        name: "exact_distances",
        doc: "exact distances computed",
        get: StatGetter::U32(|s| s.exact_distances),
    },
    StatSpec {
        name: "io_wait_us",
        doc: "µs the worker waited with nothing of this query to compute",
        get: StatGetter::F64(|s| s.io_wait_us),
    },
    StatSpec {
        name: "cpu_us",
        doc: "µs computing for this query",
        get: StatGetter::F64(|s| s.cpu_us),
    },
    StatSpec {
        name: "total_us",
        doc: "µs from the query's start to its end",
        get: StatGetter::F64(|s| s.total_us),
    },
    StatSpec {
        name: "dist_us",
        doc: "µs in distance computation (part of cpu_us)",
        get: StatGetter::F64(|s| s.dist_ns as f64 / 1000.0),
    },
    StatSpec {
        name: "used_bytes",
        doc: "bytes of the records the search used out of the blocks it read",
        get: StatGetter::U64(|s| s.used_bytes),
    },
    StatSpec {
        name: "io_utilisation",
        doc: "used_bytes / bytes_read (1 when nothing was read)",
        get: StatGetter::F64(QueryStats::io_utilisation),
    },
    StatSpec {
        name: "page_records",
        doc: "records in the blocks read",
        get: StatGetter::U32(|s| s.page_records),
    },
    StatSpec {
        name: "used_records",
        doc: "records of those blocks the search used",
        get: StatGetter::U32(|s| s.used_records),
    },
    StatSpec {
        name: "colocated",
        doc: "nodes expanded from a page read for another node (block search)",
        get: StatGetter::U32(|s| s.colocated),
    },
    StatSpec {
        name: "path_length",
        doc: "Starling's ℓ: hops less co-located expansions",
        get: StatGetter::U32(QueryStats::path_length),
    },
    StatSpec {
        name: "vertex_utilisation",
        doc: "Starling's ξ: used_records / page_records",
        get: StatGetter::F64(QueryStats::vertex_utilisation),
    },
    StatSpec {
        name: "doublings",
        doc: "times a range search doubled its candidate list",
        get: StatGetter::U32(|s| s.doublings),
    },
];
