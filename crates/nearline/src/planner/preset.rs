//! The presets: one composition of components per seed paper, with the
//! defaults each paper uses. Explicit options always win over a preset's.

use crate::format::{LayoutKind, Preset};

crate::util::vocabulary! {
    /// What the cache share of the memory budget holds.
    pub enum CacheKind: "cache" {
        /// DiskANN's static cache: whole records, breadth-first from the
        /// entry point.
        Bfs = "bfs",
        /// Gorgeous' adjacency-first cache: adjacency lists, then vectors
        /// if memory remains.
        Adjacency = "adjacency",
        /// AlayaLaser's in-degree cache: whole records of the nodes most
        /// often listed as neighbours.
        InDegree = "in_degree",
    }
}

/// Which executor a preset runs when a search leaves it open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PresetExecutor {
    /// Seed 002's records-per-page rule decides.
    ByRule,
    /// DiskANN's synchronous beam.
    Beam,
    /// PipeANN's pipeline.
    Pipeline,
}

/// What a preset sets when the caller leaves it open.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PresetDefaults {
    /// Maximum graph degree R.
    pub r: usize,
    /// Build candidate list size.
    pub build_l: usize,
    /// Pruning parameter α.
    pub alpha: f32,
    /// Vamana passes.
    pub passes: usize,
    /// Page size in bytes.
    pub page_size: usize,
    /// Record placement.
    pub layout: LayoutKind,
    /// Navigation-graph sample rate (0: none).
    pub nav_sample: f64,
    /// Centroid entries (0: none).
    pub entry_clusters: usize,
    /// Executor a search with `executor = auto` runs.
    pub executor: PresetExecutor,
    /// Beam / pipeline width when the search gives none.
    pub width: usize,
    /// Navigation-graph search list size.
    pub nav_l: usize,
    /// Navigation-graph seeds per query.
    pub nav_seeds: usize,
    /// Block search's σ.
    pub sigma: f32,
    /// Default search memory budget as a fraction of the raw vector bytes.
    pub budget_fraction: f64,
    /// Search list size when the search gives none (`max(k, l)`).
    pub l: usize,
    /// What the cache share holds.
    pub cache: CacheKind,
    /// Write the adjacency section (what an adjacency cache loads).
    pub adjacency: bool,
    /// Two-stage search: the fraction of L whose exact distances the refine
    /// stage reads (when memory expansions leave nodes without one).
    pub refine_ratio: f32,
    /// Gorgeous' filter on expanding a loaded list without a read.
    pub filter_ratio: f32,
    /// AlayaLaser's adaptive beam when the search runs the beam and gives
    /// no choice.
    pub adaptive_beam: bool,
    /// AlayaLaser's early dispatch when the search runs the beam and gives
    /// none.
    pub early_dispatch: Option<f32>,
    /// Neighbour codes in the records (AlayaLaser): principal dimensions
    /// the codes cover when the build gives none (`None`: plain records).
    pub principal_dims: Option<PrincipalDims>,
}

/// How many principal dimensions a coded layout's codes cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrincipalDims {
    /// AlayaLaser's rule: 256 when d ≥ 256, else d.
    ByDimension,
}

/// Default search list size: `max(k, DEFAULT_L)`.
pub const DEFAULT_L: usize = 100;
/// Most queries a worker interleaves when the planner chooses.
pub const AUTO_QUERIES_IN_FLIGHT: usize = 4;
/// Width a pipelined query starts with (PipeANN: min(4, W)).
pub const PIPELINE_START_WIDTH: usize = 4;
/// Default φ of Starling's range search (0.5 in the paper).
pub use crate::search::DEFAULT_RANGE_RATIO;

const BASE: PresetDefaults = PresetDefaults {
    r: 64,
    build_l: 100,
    alpha: 1.2,
    passes: 2,
    page_size: 4096,
    layout: LayoutKind::ID,
    nav_sample: 0.0,
    entry_clusters: 0,
    executor: PresetExecutor::ByRule,
    width: 4,
    // Chosen on a 50k × 128 clustered set (docs/benchmarks.md, entry points).
    nav_l: 32,
    nav_seeds: 1,
    sigma: crate::search::DEFAULT_SIGMA,
    budget_fraction: 0.125,
    l: DEFAULT_L,
    cache: CacheKind::Bfs,
    adjacency: false,
    refine_ratio: DEFAULT_REFINE_RATIO,
    filter_ratio: DEFAULT_FILTER_RATIO,
    adaptive_beam: false,
    early_dispatch: None,
    principal_dims: None,
};

/// Refine ratio when a search gives none: the low end of Gorgeous' 0.4–0.5.
/// With every list in memory each refine candidate is a read: on
/// wordnet-minilm at 20% of the raw bytes 0.4 read 0.47× the `diskann`
/// preset's pages for recall 0.95 where 0.5 read 0.53×, at 1.12× the QPS
/// (docs/benchmarks.md, Gorgeous).
pub const DEFAULT_REFINE_RATIO: f32 = 0.4;
/// Filter ratio when a search gives none (Gorgeous: 0.9).
pub const DEFAULT_FILTER_RATIO: f32 = 0.9;

/// The defaults of `preset`.
pub fn defaults(preset: Preset) -> PresetDefaults {
    match preset {
        // DiskANN: ID layout, medoid entry, beam W 4 (or the pipeline for
        // records that fill a page, by seed 002's rule).
        Preset::Diskann => BASE,
        // PipeANN: in-memory index over a ~1% sample, pipelined search whose
        // width grows to 32.
        Preset::Pipeann => PresetDefaults {
            nav_sample: 0.01,
            executor: PresetExecutor::Pipeline,
            width: 32,
            ..BASE
        },
        // Starling: shuffled blocks, in-memory navigation graph over ~1%,
        // block search overlapped with the next reads, width 8.
        Preset::Starling => PresetDefaults {
            layout: LayoutKind::SHUFFLED,
            nav_sample: 0.01,
            executor: PresetExecutor::Pipeline,
            width: 8,
            ..BASE
        },
        // PageANN: records grouped into pages by proximity and the graph
        // over pages (a page's records share its out-edges), an in-memory
        // entry structure (a navigation graph over ~1%, where PageANN
        // hashes), each page read and expanded as one node. PageANN's own
        // search is a synchronous beam; on 100k × 128 at 20% the pipeline
        // at width 8 served 1.4× its QPS at L 32 for the same reads, so the
        // preset runs the pipeline as Starling does.
        Preset::Pageann => PresetDefaults {
            layout: LayoutKind::PAGE_GRAPH,
            nav_sample: 0.01,
            executor: PresetExecutor::Pipeline,
            width: 8,
            ..BASE
        },
        // Gorgeous: one page per node carrying its nearest neighbours'
        // lists, an adjacency-first cache, a navigation graph over 0.5%,
        // L 128, width 8, refine ratio 0.5, filter ratio 0.9; its memory
        // budget is 20% of the raw vectors (the paper's setting).
        Preset::Gorgeous => PresetDefaults {
            layout: LayoutKind::Replicated,
            nav_sample: 0.005,
            executor: PresetExecutor::Pipeline,
            width: 8,
            l: 128,
            cache: CacheKind::Adjacency,
            adjacency: true,
            budget_fraction: 0.2,
            ..BASE
        },
        // AlayaLaser: neighbour codes in the records (PCA to 256 principal
        // dimensions when d ≥ 256, RaBitQ 1-bit, FastScan), no PQ in RAM,
        // the budget (20% of the raw vectors unless given) for an in-degree
        // cache of whole records, entry from 300 cluster centroids, L 200,
        // the beam with adaptive width 1 → 16 and early dispatch at half
        // a hop.
        // AiSAQ: DiskANN's graph and beam with the PQ codes of each node's
        // neighbours in its record and none in RAM (only the codebook), so
        // the index needs almost no memory; its budget defaults to 5% of
        // the raw vectors, the rest of which holds an in-degree cache of
        // whole records (AlayaLaser's, the whole-record cache nearline
        // has).
        Preset::Aisaq => PresetDefaults {
            layout: LayoutKind::PqCoded,
            cache: CacheKind::InDegree,
            budget_fraction: 0.05,
            ..BASE
        },
        // DGAI: topology records (adjacency lists only, many a page) and
        // the vectors in pages of their own; the traversal reads topology
        // pages and routes by the PQ codes in memory, and the refine stage
        // reads the vectors of the best candidates only (DGAI's pruning of
        // vector-page reads), at the default refine ratio. Memory is
        // planned as Gorgeous plans it (DGAI's cache keeps hot topology in
        // memory): the PQ codes take at most half of what the structures
        // leave, the build keeps the smallest size that ranks well, and an
        // adjacency-first cache holds the lists (then vectors), so the
        // hops it holds read nothing. The search is pipelined at width 8
        // (DGAI is compute-driven): on wordnet at 20% it served 1.16× the
        // beam's QPS at W 4 for the same reads (docs/benchmarks.md, DGAI).
        // Its budget defaults to Gorgeous' 20% of the raw vectors: the
        // lists need the room, and `auto` plans each candidate at its own
        // default, so the two list-cache compositions compete on one.
        Preset::Dgai => PresetDefaults {
            layout: LayoutKind::Decoupled,
            cache: CacheKind::Adjacency,
            adjacency: true,
            executor: PresetExecutor::Pipeline,
            width: 8,
            budget_fraction: 0.2,
            ..BASE
        },
        // SPFresh builds a partition index, planned by `planner::partition`;
        // a graph plan never starts from it (`plan_build` refuses it).
        Preset::Spfresh => BASE,
        Preset::Alayalaser => PresetDefaults {
            layout: LayoutKind::Coded,
            entry_clusters: 300,
            executor: PresetExecutor::Beam,
            width: 16,
            l: 200,
            cache: CacheKind::InDegree,
            budget_fraction: 0.2,
            adaptive_beam: true,
            early_dispatch: Some(0.5),
            principal_dims: Some(PrincipalDims::ByDimension),
            ..BASE
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_follow_their_papers() {
        let d = defaults(Preset::Pipeann);
        assert_eq!(
            (d.nav_sample, d.executor, d.width),
            (0.01, PresetExecutor::Pipeline, 32)
        );
        let d = defaults(Preset::Starling);
        assert_eq!(
            (d.nav_sample, d.executor, d.layout, d.width),
            (0.01, PresetExecutor::Pipeline, LayoutKind::SHUFFLED, 8)
        );
        let d = defaults(Preset::Gorgeous);
        assert_eq!(
            (d.r, d.l, d.nav_sample, d.width, d.layout, d.cache),
            (
                64,
                128,
                0.005,
                8,
                LayoutKind::Replicated,
                CacheKind::Adjacency
            )
        );
        assert_eq!(
            (d.refine_ratio, d.filter_ratio, d.page_size),
            (0.4, 0.9, 4096)
        );
        let d = defaults(Preset::Alayalaser);
        assert_eq!(
            (
                d.r,
                d.l,
                d.alpha,
                d.entry_clusters,
                d.width,
                d.layout,
                d.cache
            ),
            (
                64,
                200,
                1.2,
                300,
                16,
                LayoutKind::Coded,
                CacheKind::InDegree
            )
        );
        assert_eq!(
            (d.adaptive_beam, d.early_dispatch, d.executor),
            (true, Some(0.5), PresetExecutor::Beam)
        );
        let d = defaults(Preset::Dgai);
        assert_eq!(
            (
                d.layout,
                d.cache,
                d.adjacency,
                d.refine_ratio,
                d.executor,
                d.width
            ),
            (
                LayoutKind::Decoupled,
                CacheKind::Adjacency,
                true,
                DEFAULT_REFINE_RATIO,
                PresetExecutor::Pipeline,
                8
            )
        );
        assert_eq!(
            d.budget_fraction,
            defaults(Preset::Gorgeous).budget_fraction
        );
        let d = defaults(Preset::Aisaq);
        assert_eq!(
            (
                d.layout,
                d.cache,
                d.budget_fraction,
                d.entry_clusters,
                d.width
            ),
            (LayoutKind::PqCoded, CacheKind::InDegree, 0.05, 0, 4)
        );
        let d = defaults(Preset::Diskann);
        assert_eq!(
            (d.nav_sample, d.executor, d.width, d.layout),
            (0.0, PresetExecutor::ByRule, 4, LayoutKind::ID)
        );
    }
}
