//! What a user asks for: build, open and search options as they come from
//! the APIs, where `None` or `Auto` leaves the choice to the preset or to
//! the planner's rules. The planner turns them into typed plans.

use crate::distance::Metric;
use crate::format::{LayoutKind, Preset};
use crate::io::EngineKind;
use crate::layout::shuffle::ShuffleParams;
use crate::util::{vocabulary, Budget};

/// The preset a build asks for: a named preset, or `auto` (the planner
/// chooses). The names are [`Preset`]'s, plus `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PresetChoice {
    /// The planner chooses (today: `diskann`).
    #[default]
    Auto,
    Named(Preset),
}

impl PresetChoice {
    /// Parses `auto` or a preset name.
    pub fn parse(s: &str) -> crate::Result<Self> {
        if s.trim().eq_ignore_ascii_case("auto") {
            return Ok(PresetChoice::Auto);
        }
        Preset::parse(s).map(PresetChoice::Named).map_err(|_| {
            crate::Error::arg(format!(
                "unknown preset {s:?}: expected one of {}",
                Self::names().join(", ")
            ))
        })
    }

    /// `auto` and every preset name.
    pub fn names() -> Vec<&'static str> {
        let mut v = vec!["auto"];
        v.extend(Preset::names());
        v
    }

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            PresetChoice::Auto => "auto",
            PresetChoice::Named(p) => p.name(),
        }
    }
}

vocabulary! {
    /// The executor a search asks for.
    pub enum ExecutorChoice: "executor" {
        /// The preset's executor, else the records-per-page rule.
        Auto = "auto",
        /// DiskANN's synchronous beam.
        Beam = "beam",
        /// PipeANN's pipelined search.
        Pipeline = "pipeline",
    }
}

vocabulary! {
    /// What a search asks to do with an arrived page.
    pub enum PageChoice: "page_search" {
        /// Block search on a shuffled layout, the target records otherwise.
        Auto = "auto",
        /// DiskANN: only the records the page was read for.
        Targets = "targets",
        /// Starling's block search.
        Block = "block",
        /// Gorgeous on a replicated layout: the target records, and the
        /// neighbours' lists they carry kept for expansion without reads.
        Replicas = "replicas",
    }
}

vocabulary! {
    /// What an open asks the cache share of the budget to hold.
    pub enum CacheChoice: "cache" {
        /// The preset's (adjacency lists for gorgeous, whole records
        /// otherwise).
        Auto = "auto",
        /// Whole records, breadth-first from the entry point (DiskANN).
        Bfs = "bfs",
        /// Adjacency lists first, vectors if memory remains (Gorgeous).
        Adjacency = "adjacency",
        /// Whole records of the highest in-degree nodes (AlayaLaser; the
        /// index needs its in-degree section).
        InDegree = "in_degree",
    }
}

vocabulary! {
    /// Where queries start, as an open asks for it.
    pub enum EntryChoice: "entry kind" {
        /// The navigation graph if the index has one, else its centroid
        /// entries, else sampled entries when `entry_points > 0`, else the
        /// medoid.
        Auto = "auto",
        Medoid = "medoid",
        Sampled = "sampled",
        Nav = "nav",
        Centroids = "centroids",
    }
}

/// Names the I/O engines accept (`EngineKind::parse` also takes aliases).
pub const IO_ENGINES: &[&str] = &["auto", "uring", "uring-poll", "pread"];

/// Partition-index options a build may set (`None`: the rule's value).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PartitionOptions {
    /// Heads over vectors, in (0, 0.5].
    pub head_ratio: Option<f64>,
    /// Most postings per vector, 1..=32.
    pub replicas: Option<usize>,
    /// Entries before a split.
    pub posting_limit: Option<usize>,
    /// Live entries below which a posting merges.
    pub merge_threshold: Option<usize>,
    /// RNG factor > 0.
    pub rng_factor: Option<f32>,
    /// SPANN's closure ε ≥ 0: also replicate into every head within
    /// (1 + ε) of the nearest head's distance.
    pub closure: Option<f32>,
    /// Postings LIRE checks around a split.
    pub reassign_k: Option<usize>,
    /// LIRE on (default) or SPANN+ (appends and garbage collection only).
    pub lire: Option<bool>,
    /// The recall@10 the build calibrates the default `nprobe` for, in
    /// (0, 1); `Some(0.0)` never reaches here (refused).
    pub recall_target: Option<f64>,
}

/// Everything a build needs besides the data; `None` takes the preset's
/// value or the planner's rule.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub metric: Metric,
    pub preset: PresetChoice,
    /// Maximum graph degree (default 64).
    pub r: Option<usize>,
    /// Build candidate list size (default 100).
    pub build_l: Option<usize>,
    /// Pruning parameter ≥ 1 (default 1.2).
    pub alpha: Option<f32>,
    /// Vamana passes (default 2).
    pub passes: Option<usize>,
    /// Fill pruned adjacency lists up to R (DiskANN's disk builds do).
    pub saturate: Option<bool>,
    /// PQ bytes per vector; `None`: DiskANN's rule on what the budget leaves.
    pub pq_bytes: Option<usize>,
    /// Search memory budget; `None`: 1/8 of the raw vectors, raised to the
    /// preset's minimum when that is more.
    pub memory_budget: Option<Budget>,
    /// `None`: unlimited (a one-shot build).
    pub build_memory_budget: Option<Budget>,
    /// Page size (default 4096).
    pub page_size: Option<usize>,
    /// Build threads (default: all cores).
    pub threads: Option<usize>,
    pub seed: u64,
    /// External ids, one per row (default 0..n).
    pub ids: Option<Vec<u64>>,
    pub overwrite: bool,
    /// Sampling rate of the in-memory navigation graph in `[0, 0.5]`
    /// (0: none); `None`: the preset's.
    pub nav_sample: Option<f64>,
    /// k-means centroids whose nearest nodes become entry points (0: none);
    /// `None`: the preset's.
    pub entry_clusters: Option<usize>,
    /// Record placement; `None`: the preset's.
    pub layout: Option<LayoutKind>,
    /// How a shuffled layout is made (the seed is the build's).
    pub shuffle: ShuffleParams,
    /// Bytes the page file may take: a replicated layout packs fewer lists
    /// to stay within it. `None`: no limit.
    pub disk_budget: Option<u64>,
    /// How the graph index takes updates; `None` (`"auto"`): out of place
    /// (in place measured no faster here, even query-heavy: see the
    /// planner's `update_strategy` decision).
    pub update: Option<crate::format::UpdateMode>,
    /// Write the adjacency section an adjacency cache loads; `None`: the
    /// preset's.
    pub adjacency: Option<bool>,
    /// The coded record format's parameters (refused for any other).
    pub codes: CodeParams,
    /// Options of a partition index (preset `spfresh`).
    pub partition: PartitionOptions,
    /// Workload hint: the expected share of operations that are inserts or
    /// deletes, in [0, 1] (`None`: 0). A graph index then leaves part of
    /// the memory budget to its update delta ([`super::rules::update_reserve`]).
    pub write_ratio: Option<f64>,
}

/// Parameters of the coded record format (AlayaLaser's neighbour codes);
/// each `None` leaves the choice to the planner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CodeParams {
    /// Principal dimensions the neighbour codes cover (the rest are
    /// residual dimensions, used for exact distances only); `None`:
    /// AlayaLaser's rule (256 when d ≥ 256, else d).
    pub principal_dims: Option<usize>,
    /// Bits per dimension of the neighbour codes (1, 2 or 4); `None`: the
    /// most whose records fit the block 1-bit codes need.
    pub bits: Option<usize>,
}

impl CodeParams {
    /// The options given, by their API names.
    pub fn given(&self) -> Vec<&'static str> {
        let mut g = Vec::new();
        if self.principal_dims.is_some() {
            g.push("principal_dims");
        }
        if self.bits.is_some() {
            g.push("code_bits");
        }
        g
    }
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            metric: Metric::L2,
            preset: PresetChoice::Auto,
            r: None,
            build_l: None,
            alpha: None,
            passes: None,
            saturate: None,
            pq_bytes: None,
            memory_budget: None,
            build_memory_budget: None,
            page_size: None,
            threads: None,
            seed: 0,
            ids: None,
            overwrite: false,
            nav_sample: None,
            entry_clusters: None,
            layout: None,
            shuffle: ShuffleParams::default(),
            disk_budget: None,
            update: None,
            adjacency: None,
            codes: CodeParams::default(),
            partition: Default::default(),
            write_ratio: None,
        }
    }
}

/// Options of opening an index.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Search memory budget; `None`: the budget the index was built with.
    /// What the fixed structures and the codes leave of it holds the cache.
    pub memory_budget: Option<Budget>,
    /// Cache exactly this many nodes instead (within the budget; for an
    /// adjacency cache, at most this many lists).
    pub cache_nodes: Option<usize>,
    /// What the cache holds.
    pub cache: CacheChoice,
    /// Search threads by default (and the workers whose scratch the budget
    /// reserves); `None`: all cores.
    pub threads: Option<usize>,
    /// Vectors of this many sampled nodes held in memory as entry points.
    pub entry_points: usize,
    /// Which entry points to use.
    pub entry: EntryChoice,
    /// List size of the navigation-graph search; `None`: the preset's.
    pub nav_l: Option<usize>,
    /// Navigation-graph seeds per query; `None`: the preset's.
    pub nav_seeds: Option<usize>,
    pub io: EngineKind,
    /// Partition index: when inserts and deletes return (after their log
    /// record is synced, or only written).
    pub durability: crate::update::wal::Durability,
    /// Partition index: run splits, merges and reassignments in a
    /// background worker (default); `false`: only when `maintain` is called.
    /// Graph index: merge a full delta in a background thread while updates
    /// go on (default); `false`: the insert that fills it merges.
    pub background_updates: bool,
    /// Open for reading only: the index then needs no write permission and
    /// runs beside its one writer in another process, whose acknowledged
    /// updates every search sees.
    pub read_only: bool,
    /// Graph index: how it takes updates (`None`: as its build chose).
    pub update: Option<crate::format::UpdateMode>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            memory_budget: None,
            cache_nodes: None,
            cache: CacheChoice::Auto,
            threads: None,
            entry_points: 0,
            entry: EntryChoice::Auto,
            nav_l: None,
            nav_seeds: None,
            io: EngineKind::Auto,
            durability: crate::update::wal::Durability::Sync,
            background_updates: true,
            read_only: false,
            update: None,
        }
    }
}

/// Options of one search batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchOptions {
    /// Results per query.
    pub k: usize,
    /// Candidate list size; `None`: max(k, 100).
    pub l: Option<usize>,
    /// Beam width / most reads in flight; `None`: the preset's.
    pub w: Option<usize>,
    pub executor: ExecutorChoice,
    /// Beam only: width min(2^i, W) at hop i.
    pub adaptive_beam: bool,
    /// Beam only: the next hop once this fraction of the current hop's
    /// pages is processed.
    pub early_dispatch: Option<f32>,
    /// Queries each worker interleaves; `None`: the planner's choice.
    pub queries_in_flight: Option<usize>,
    pub page_search: PageChoice,
    /// Block search's σ; `None`: 0.3.
    pub sigma: Option<f32>,
    /// Two-stage search: the fraction of L (at least k entries) whose
    /// exact distances the refine stage reads; `None`: the preset's (0.5).
    pub refine_ratio: Option<f32>,
    /// Replicated pages: a loaded neighbour is expanded without a read when
    /// its distance is within this fraction of the list's worst; `None`:
    /// 0.9.
    pub filter_ratio: Option<f32>,
    /// Search threads; `None`: the index's.
    pub threads: Option<usize>,
    /// Pages processed in the order each query issued its reads, so results
    /// do not depend on the timing of reads (default); `false`: as they
    /// arrive.
    pub repeatable: bool,
    /// Partition index: postings read per query; `None`: 32.
    pub nprobe: Option<usize>,
    /// Partition index: read a posting only when its head lies within
    /// (1 + probe_cut) of the nearest head's distance.
    pub probe_cut: Option<f32>,
}

impl SearchOptions {
    /// Options with `k` results and every other choice left open.
    pub fn new(k: usize) -> Self {
        SearchOptions {
            k,
            l: None,
            w: None,
            executor: ExecutorChoice::Auto,
            adaptive_beam: false,
            early_dispatch: None,
            queries_in_flight: None,
            page_search: PageChoice::Auto,
            sigma: None,
            refine_ratio: None,
            filter_ratio: None,
            threads: None,
            repeatable: true,
            nprobe: None,
            probe_cut: None,
        }
    }
}

impl Default for SearchOptions {
    fn default() -> Self {
        Self::new(10)
    }
}

/// Options of a range search besides the radius and the search options.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RangeOptions {
    /// φ: the list doubles while the results within the radius fill at
    /// least this fraction of it (default 0.5).
    pub ratio: Option<f32>,
    /// Largest list size the doubling may reach (default 1024 × L, capped).
    pub max_l: Option<usize>,
    /// `Some(c)`: end a query unread when its nearest entry point lies
    /// beyond `c · radius` (c ≥ 1).
    pub entry_cutoff: Option<f32>,
}
