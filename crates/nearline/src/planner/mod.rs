//! The planner: the only place that knows the seed papers' decision rules
//! and the presets. It turns what a user asks for (options), what an index
//! is (its manifest) and what the data is (n, dim, element type) into typed
//! plans — [`BuildPlan`], [`OpenPlan`], [`SearchPlan`](crate::search::SearchPlan) — with no `auto`
//! left in them, and splits the one memory budget among every resident
//! structure ([`memory`]). Each choice carries the rule that made it
//! ([`Decision`]), so `nearline plan` and `info()` can show why.
//!
//! Build and search execute plans; neither consults the planner.

mod auto;
pub use auto::RankingProbe;
pub mod memory;
pub mod options;
pub mod partition;
pub mod preset;
pub mod reader;
pub mod rules;
pub mod schema;
pub mod search;

pub use auto::GORGEOUS_DIMS_PER_PQ_BYTE;
pub use memory::MemoryPlan;
pub use options::{
    BuildOptions, CacheChoice, CodeParams, EntryChoice, ExecutorChoice, OpenOptions, PageChoice,
    PresetChoice, RangeOptions, SearchOptions, IO_ENGINES,
};
pub use preset::PresetDefaults;
pub use schema::{defaults_json, vocabulary};
pub use search::{
    plan_search, plan_search_quietly, PlannedSearch, ScratchRoom, SearchFacts, SearchPlanView,
};

use crate::build::{self, BuildPlan};
use crate::distance::Metric;
use crate::elem::DType;
use crate::format::{LayoutKind, Manifest, PageGeometry, Placement, RecordFormat, Section};
use crate::graph::nav::{check_nav_sample, nav_graph_degree, nav_sample_size};
use crate::layout::shuffle::ShuffleParams;
use crate::search::entry::{MAX_NAV_L, MAX_NAV_SEEDS};
use crate::search::EntryPlan;
use crate::{Error, Result};
use memory::{FixedCosts, QueryShape};
use preset::defaults;
use rules::EntryKind;
use serde::Serialize;

/// Largest `entry_clusters` accepted.
pub const MAX_ENTRY_CLUSTERS: usize = 65_536;

/// A navigation graph that would take more than this share of the budget
/// is dropped when the preset's default asked for it. Per node it costs
/// about what a cached record costs, but as a navigable sample it shortens
/// every query's first hops, where a node cache only saves the hops near the
/// medoid; so it keeps its place until it would crowd the PQ codes and the
/// cache (a quarter of the budget).
pub const NAV_MAX_BUDGET_SHARE: f64 = 0.25;

/// With an adjacency-first cache, the PQ codes take at most this share of
/// what the fixed structures and the workers leave of the budget.
pub const PQ_SHARE_ADJACENCY: f64 = 0.5;

/// Recall loss the build's PQ selection tolerates (see
/// `build::pq::PqSelection`).
pub const PQ_SELECT_TOLERANCE: f32 = 0.03;

/// Vectors the build's PQ selection lets the refine stage read: twice the
/// 10 neighbours whose recall it measures. The selection keeps the smallest
/// PQ size whose ranking holds them there, because every candidate beyond is
/// a read (docs/benchmarks.md, "Gorgeous": the PQ size and the refine reads).
pub const PQ_SELECT_CANDIDATES: usize = 20;
/// A PQ size the selection fills up to (every adjacency list still in
/// memory, see `build::pq::PqSelection`) is at most this many times the
/// smallest passing size: it bounds the table lookups every hop pays for
/// fewer refine reads.
pub const PQ_FILL_MAX_FACTOR: usize = 2;
/// How much better (sample recall) another code shape must rank than the
/// rules' for a coded build to keep it (see `build::codes::CodeSelection`):
/// a point, about twice the probe's standard error (600 records × 10
/// neighbours at recall ~0.85).
pub const CODE_SHAPE_MARGIN: f64 = 0.01;

/// A list may be packed into at most this many records per packed slot a
/// record has (twice the mean: the nearest lists of many nodes fit, while
/// a hub's list cannot take every slot).
pub const REPLICA_CAP_PER_SLOT: usize = 2;

/// One choice of a plan and the rule that made it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// The option decided.
    pub what: &'static str,
    /// Its value, as text.
    pub value: String,
    /// Why: "asked for", the preset's default, or the rule.
    pub rule: String,
}

impl Decision {
    /// A decision of `what` = `value` because of `rule`.
    pub fn new(what: &'static str, value: impl std::fmt::Display, rule: impl Into<String>) -> Self {
        Decision {
            what,
            value: value.to_string(),
            rule: rule.into(),
        }
    }
}

/// Default thread count: the cores available to this process, read once
/// (the standard library reads the cgroup's CPU quota from /proc on every
/// call: tens of microseconds, which a server's per-request path notices).
pub fn default_threads() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

/// What the planner knows of the data before a build.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DataFacts {
    pub n: usize,
    pub dim: usize,
    pub dtype: DType,
}

impl DataFacts {
    /// Bytes of the raw vectors.
    pub fn raw_bytes(&self) -> u64 {
        self.n as u64 * self.dim as u64 * self.dtype.size() as u64
    }
}

/// A planned build: the plan the build runs, the memory split an open
/// with default options gets, the default search, and the decisions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedBuild {
    pub plan: BuildPlan,
    /// The split of the search budget an open with default options gets.
    pub memory: MemoryPlan,
    /// The default search of the index (`k` 10), as planned for one batch.
    pub search: SearchPlanView,
    pub decisions: Vec<Decision>,
    /// What the user should know before the build runs (a graph built in
    /// shards small enough to cost recall).
    pub warnings: Vec<String>,
}

/// Checks the build options that are not the planner's to choose.
/// The workload hint, checked: a share of operations in [0, 1].
pub fn check_write_ratio(w: Option<f64>) -> Result<()> {
    match w {
        Some(w) if !(0.0..=1.0).contains(&w) => Err(Error::arg(format!(
            "write_ratio={w} must be a share of operations in [0, 1]"
        ))),
        _ => Ok(()),
    }
}

fn check_build(opts: &BuildOptions, f: &DataFacts) -> Result<()> {
    if opts.preset == PresetChoice::Named(crate::format::Preset::Spfresh) {
        return Err(Error::arg(
            "preset \"spfresh\" builds a partition index: plan it with planner::partition",
        ));
    }
    if opts.partition != options::PartitionOptions::default() {
        return Err(Error::arg(
            "head_ratio, replicas, posting_limit, merge_threshold, rng_factor, closure, \
             reassign_k, lire and recall_target apply to partition indexes (preset \"spfresh\")",
        ));
    }
    check_write_ratio(opts.write_ratio)?;
    let n = f.n;
    if n == 0 {
        return Err(Error::arg("cannot build an index over 0 vectors"));
    }
    if n > u32::MAX as usize - 1 {
        return Err(Error::arg(format!(
            "{n} vectors exceed the 2^32 − 1 an index can hold"
        )));
    }
    if let Some(r) = opts.r {
        if r == 0 || r > 1024 {
            return Err(Error::arg(format!("R={r} must be in 1..=1024")));
        }
    }
    if opts.build_l == Some(0) {
        return Err(Error::arg("build_L must be at least 1"));
    }
    if let Some(a) = opts.alpha {
        if !a.is_finite() || a < 1.0 {
            return Err(Error::arg(format!(
                "alpha={a} must be a finite number ≥ 1.0"
            )));
        }
    }
    if let Some(p) = opts.passes {
        if p == 0 || p > 4 {
            return Err(Error::arg(format!("passes={p} must be in 1..=4")));
        }
    }
    if let Some(p) = opts.page_size {
        if ![4096, 8192, 16384].contains(&p) {
            return Err(Error::arg(format!(
                "page_size={p} is not supported: expected 4096, 8192 or 16384"
            )));
        }
    }
    if let Some(b) = opts.pq_bytes {
        if b == 0 || b > f.dim {
            return Err(Error::arg(format!(
                "pq_bytes={b} must be in 1..={} (the dimension)",
                f.dim
            )));
        }
    }
    if matches!(opts.threads, Some(0)) {
        return Err(Error::arg("threads must be at least 1"));
    }
    if opts.metric == Metric::Cosine && !f.dtype.is_float() {
        return Err(Error::arg(format!(
            "the cosine metric needs float32 or float16 vectors (got {}); normalise the data and use \"ip\" instead",
            f.dtype
        )));
    }
    if let Some(ids) = &opts.ids {
        if ids.len() != n {
            return Err(Error::arg(format!(
                "ids has {} entries, but there are {n} vectors",
                ids.len()
            )));
        }
        if let Some(&bad) = ids.iter().find(|&&x| x > i64::MAX as u64) {
            return Err(Error::arg(format!(
                "id {bad} does not fit in a signed 64-bit integer (ids must be in 0..2^63)"
            )));
        }
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::arg(format!(
                "ids must be unique: {} appears more than once",
                w[0]
            )));
        }
    }
    if let Some(s) = opts.nav_sample {
        check_nav_sample(s)?;
    }
    if let Some(c) = opts.entry_clusters {
        if c > n || c > MAX_ENTRY_CLUSTERS {
            return Err(Error::arg(format!(
                "entry_clusters={c} must be at most the number of vectors ({n}) and at most {MAX_ENTRY_CLUSTERS} (0 = none; AlayaLaser uses 300-500)"
            )));
        }
    }
    opts.shuffle.check()
}

/// Plans a build of `opts` over data described by `f`.
pub fn plan_build(opts: &BuildOptions, f: &DataFacts) -> Result<PlannedBuild> {
    plan_build_probed(opts, f, None)
}

/// [`plan_build`] where the build can measure how well PQ codes rank its
/// data (`preset="auto"` asks before it keeps PQ codes in RAM; see
/// `auto::RankingProbe`).
pub fn plan_build_probed(
    opts: &BuildOptions,
    f: &DataFacts,
    probe: Option<auto::RankingProbe<'_>>,
) -> Result<PlannedBuild> {
    check_build(opts, f)?;
    match opts.preset {
        PresetChoice::Auto => auto::plan_auto(opts, f, probe),
        PresetChoice::Named(_) => plan_named(opts, f),
    }
}

/// Plans a build of `opts` with a named preset (`auto` resolved), after
/// [`check_build`].
fn plan_named(opts: &BuildOptions, f: &DataFacts) -> Result<PlannedBuild> {
    let mut d = Vec::new();
    let preset = match opts.preset {
        PresetChoice::Named(p) => p,
        PresetChoice::Auto => {
            return Err(Error::arg(
                "internal: plan_named needs a named preset (auto is planner::auto's)",
            ))
        }
    };
    d.push(Decision::new("preset", preset, "asked for"));
    let pd = defaults(preset);
    let pick = |d: &mut Vec<Decision>, what: &'static str, given: Option<String>, dflt: String| {
        match given {
            Some(v) => d.push(Decision::new(what, v, "asked for")),
            None => d.push(Decision::new(what, dflt, format!("the {preset} preset's"))),
        }
    };
    let r = opts.r.unwrap_or(pd.r);
    pick(&mut d, "R", opts.r.map(|x| x.to_string()), r.to_string());
    let build_l = opts.build_l.unwrap_or(pd.build_l);
    pick(
        &mut d,
        "build_L",
        opts.build_l.map(|x| x.to_string()),
        build_l.to_string(),
    );
    let alpha = opts.alpha.unwrap_or(pd.alpha);
    let passes = opts.passes.unwrap_or(pd.passes);
    let mut layout = opts.layout.unwrap_or(pd.layout);
    pick(
        &mut d,
        "layout",
        opts.layout.map(|x| x.to_string()),
        layout.to_string(),
    );
    let coded = layout.records() == RecordFormat::Coded;
    // AiSAQ's records carry their neighbours' PQ codes: none in RAM.
    let pq_coded = layout.records() == RecordFormat::PqCoded;
    let in_record = coded || pq_coded;
    // A coded layout stores float32 vectors in the PCA's space, whatever
    // the input's element type.
    let esz = if coded { 4 } else { f.dtype.size() };
    let vec_bytes = f.dim * esz;
    let code_dims = if coded {
        if opts.metric != Metric::L2 {
            return Err(Error::arg(format!(
                "a coded layout (preset \"alayalaser\") supports the l2 metric only (got {}): its \
                 vectors are stored after a PCA, which keeps distances but not inner products",
                opts.metric
            )));
        }
        if opts.pq_bytes.is_some() {
            return Err(Error::arg(
                "pq_bytes does not apply to a coded layout: its routing codes live in the records",
            ));
        }
        if f.dim < 2 {
            return Err(Error::arg(
                "a coded layout needs vectors of at least 2 dimensions",
            ));
        }
        let (p, why) = rules::principal_dims(opts.codes.principal_dims, f.dim)?;
        d.push(Decision::new("principal_dims", p, why));
        p
    } else {
        if let Some(name) = opts.codes.given().first() {
            return Err(Error::arg(format!(
                "{name} applies to a coded layout (preset \"alayalaser\" or \
                 layout=\"coded\"); this build's layout is {layout}"
            )));
        }
        0
    };
    let page_size = match opts.page_size {
        Some(p) => {
            d.push(Decision::new("page_size", p, "asked for"));
            p
        }
        None if layout.records() == RecordFormat::Replicated => {
            let (p, why) = rules::replicated_page_size(vec_bytes, r, f.n);
            d.push(Decision::new("page_size", p, why));
            p
        }
        None => {
            d.push(Decision::new(
                "page_size",
                pd.page_size,
                format!("the {preset} preset's"),
            ));
            pd.page_size
        }
    };
    let record_pq = if pq_coded {
        let (m, why) = rules::record_pq_bytes(opts.pq_bytes, page_size, vec_bytes, r, f.dim, f.n)?;
        d.push(Decision::new("pq_bytes", m, why));
        m
    } else {
        0
    };
    let packed = if layout.records() == RecordFormat::Replicated {
        let (p, why) = rules::choose_packed(page_size, vec_bytes, r, f.n, opts.disk_budget)?;
        d.push(Decision::new("packed_lists", p, why));
        if p == 0 {
            layout = LayoutKind::ID;
            d.push(Decision::new(
                "layout",
                layout,
                "no list fits the disk budget besides the node's own: plain records",
            ));
        }
        p
    } else {
        if let Some(budget) = opts.disk_budget {
            // (A coded layout's 1-bit records: the smallest it can write.)
            let plain = if pq_coded {
                PageGeometry::with_pq_codes(page_size, vec_bytes, r, record_pq, f.n)?
            } else if layout.records() == RecordFormat::Decoupled {
                PageGeometry::decoupled(page_size, vec_bytes, r, f.n)?
            } else {
                PageGeometry::with_codes(page_size, vec_bytes, r, code_dims, 1, f.n)?
            }
            .file_bytes();
            if plain > budget {
                return Err(Error::arg(format!(
                    "disk_budget={budget} bytes is below the {plain} bytes the page file takes \
                     (n={}, {vec_bytes} vector bytes, R={r}, {page_size}-byte pages)",
                    f.n
                )));
            }
        }
        0
    };
    let adjacency = opts.adjacency.unwrap_or(pd.adjacency);
    if in_record && adjacency {
        return Err(Error::arg(format!(
            "adjacency does not apply to a {layout} layout: its caches hold whole records (the \
             codes that score a node's neighbours are in its record)"
        )));
    }
    pick(
        &mut d,
        "adjacency",
        opts.adjacency.map(|x| x.to_string()),
        adjacency.to_string(),
    );
    let raw = f.raw_bytes();
    let mut nav_sample = opts.nav_sample.unwrap_or(pd.nav_sample);
    pick(
        &mut d,
        "nav_sample",
        opts.nav_sample.map(|x| x.to_string()),
        nav_sample.to_string(),
    );
    if opts.nav_sample.is_none() && nav_sample > 0.0 {
        // Whether the navigation graph pays: it saves the first hops' reads
        // (about one per hop to its depth) for its memory; when it would
        // take more than NAV_MAX_BUDGET_SHARE of the budget, that memory
        // serves the cache better.
        let count = nav_sample_size(f.n, nav_sample);
        let bytes = memory::nav_bytes_from_section(memory::nav_section_bytes(
            count,
            nav_graph_degree(count),
            f.dim,
            esz,
        ));
        let budget = opts
            .memory_budget
            .map(|b| b.resolve(raw))
            .unwrap_or((raw as f64 * pd.budget_fraction) as u64);
        if bytes as f64 > NAV_MAX_BUDGET_SHARE * budget as f64 {
            nav_sample = 0.0;
            d.push(Decision::new(
                "nav_sample",
                0,
                format!(
                    "the navigation graph ({bytes} bytes) would take over {:.0}% of the {budget}-byte \
                     budget: memory serves the cache better",
                    NAV_MAX_BUDGET_SHARE * 100.0
                ),
            ));
        }
    }
    let entry_clusters = opts.entry_clusters.unwrap_or(pd.entry_clusters);
    let threads = opts.threads.unwrap_or_else(default_threads);
    let code_bits = if coded {
        let (b, why) = rules::code_bits(opts.codes.bits, page_size, vec_bytes, r, code_dims, f.n)?;
        d.push(Decision::new("code_bits", b, why));
        b
    } else {
        0
    };
    // With neither asked for, the build chooses the shape on a sample
    // among those whose records fit the same blocks.
    let code_selection = if coded && opts.codes == CodeParams::default() {
        let candidates =
            rules::code_shapes(page_size, vec_bytes, r, f.dim, f.n, (code_dims, code_bits))?;
        (candidates.len() > 1).then(|| {
            let list = candidates
                .iter()
                .map(|(p, b)| format!("{p}×{b}"))
                .collect::<Vec<_>>()
                .join(", ");
            d.push(Decision::new(
                "code_shape",
                format!("chosen at build among {list} (principal dims × bits)"),
                format!(
                    "the shapes whose records fit the same blocks; the build scores each on a \
                     sample (the share of a record's {k} neighbours nearest a sample query that \
                     its codes rank in their top {k}) and keeps {code_dims}×{code_bits} (the \
                     rules above) unless another ranks {m:.0} point or more better",
                    k = build::codes::SHAPE_K,
                    m = CODE_SHAPE_MARGIN * 100.0
                ),
            ));
            build::codes::CodeSelection {
                candidates,
                margin: CODE_SHAPE_MARGIN,
            }
        })
    } else {
        None
    };
    let geo = if pq_coded {
        PageGeometry::with_pq_codes(page_size, vec_bytes, r, record_pq, f.n)?
    } else if layout.records() == RecordFormat::Decoupled {
        let g = PageGeometry::decoupled(page_size, vec_bytes, r, f.n)?;
        d.push(Decision::new(
            "decoupled",
            format!(
                "{} lists a topology page, {} vectors a vector page",
                g.records_per_block, g.vectors_per_block
            ),
            format!(
                "DGAI: the traversal reads topology pages (adjacency lists only, {} of R={r} \
                 a {}-byte page) and scores neighbours with the PQ codes in memory; the \
                 vectors lie in pages of their own, read only for the final re-rank",
                g.records_per_block, g.block_size
            ),
        ));
        g
    } else if layout.placement() == Placement::PageGraph {
        let g = PageGeometry::page_graph(page_size, vec_bytes, r, f.n)?;
        d.push(Decision::new(
            "page_graph",
            format!(
                "{} records a page, {} out-edges a page",
                g.records_per_block,
                g.page_degree()
            ),
            format!(
                "PageANN: a page is one graph node, so its records share one list of edges to \
                 other pages; the most records a {page_size}-byte page holds while their lists \
                 still give it at least R={r} edges ({} records of {} per record)",
                g.records_per_block, g.max_degree
            ),
        ));
        g
    } else {
        PageGeometry::with_regions(page_size, vec_bytes, r, packed, code_dims, code_bits, f.n)?
    };
    // The entry structure an open with default options loads.
    let nav_count = nav_sample_size(f.n, nav_sample);
    let entry = if nav_count > 0 {
        memory::nav_bytes_from_section(memory::nav_section_bytes(
            nav_count,
            nav_graph_degree(nav_count),
            f.dim,
            esz,
        ))
    } else if entry_clusters > 0 {
        memory::centroid_bytes_from_section(memory::centroid_section_bytes(
            entry_clusters,
            f.dim,
            esz,
        ))
    } else {
        0
    };
    // Scratch for a default search on the default number of threads (the
    // PQ table's size depends on the PQ bytes the split chooses).
    let open_threads = default_threads();
    let search_width = pd.width;
    let shape = |m: usize| QueryShape {
        n: f.n,
        dim: f.dim,
        esz,
        // A record's list bound: R, or a page graph's share of its page's
        // edges (the open plans with the manifest's, the same).
        r: geo.max_degree,
        pq_m: m,
        block_size: geo.block_size,
        records_per_block: geo.records_per_block,
        l: pd.l,
        width: search_width,
        sigma: rules::block_sigma(layout.placement(), pd.sigma),
        packed,
        refine: default_refine(
            pd.cache == preset::CacheKind::Adjacency || packed > 0,
            pd.refine_ratio,
            pd.l,
        ),
        code_groups: geo.code_groups(),
    };
    let worker = |q: usize, m: usize| memory::worker_bytes(&shape(m), q);
    // A PQ-coded index holds no codes but each query its table.
    let record_worker = |q: usize, _: usize| worker(q, record_pq);
    let fixed = FixedCosts {
        ids: if opts.ids.is_some() {
            memory::ids_bytes(f.n)
        } else {
            0
        },
        layout_map: memory::layout_map_bytes(layout, f.n, &geo),
        entry,
        quantizer: memory::coded_quantizer_bytes(f.dim, code_dims),
    };
    let default_budget = (raw as f64 * pd.budget_fraction).floor() as u64;
    // Gorgeous plans memory for the graph: the budget (20% of the raw
    // vectors unless given) is split so the PQ codes take at most half of
    // what the fixed structures leave, and the build picks the smallest
    // PQ size within that cap whose sample recall holds (see
    // `build::pq::PqSelection`); the adjacency cache gets the rest.
    let adjacency_first = pd.cache == preset::CacheKind::Adjacency;
    let select_pq = adjacency_first && opts.pq_bytes.is_none();
    let budget_given = opts.memory_budget.map(|b| b.resolve(raw));
    // The preset's budget, raised to what the index needs with four
    // queries per worker and PQ codes by DiskANN's rule on half of it.
    let preset_budget = {
        let m = rules::pq_bytes_for_budget(f.n, f.dim, default_budget / 2);
        let need = fixed.total()
            + memory::codebook_bytes(f.dim, m)
            + memory::pq_codes_bytes(f.n, m)
            + open_threads as u64 * worker(preset::AUTO_QUERIES_IN_FLIGHT, m);
        default_budget.max(need)
    };
    let in_degree = in_record && pd.cache == preset::CacheKind::InDegree;
    let write_ratio = opts.write_ratio.unwrap_or(0.0);
    let reserve = if in_record || opts.pq_bytes.is_some() || budget_given.is_none() {
        0.0
    } else {
        rules::update_reserve(write_ratio)
    };
    let in_place_refusal = rules::in_place_refusal(layout, pd.cache);
    let static_layout = rules::update_refusal(layout);
    if let (Some(u), Some(why)) = (opts.update, &static_layout) {
        return Err(Error::arg(format!(
            "update=\"{}\" is not possible for this index: {why}",
            u.name()
        )));
    }
    let update = match opts.update {
        Some(crate::format::UpdateMode::InPlace) => {
            if let Some(why) = &in_place_refusal {
                return Err(Error::arg(format!(
                    "update=\"in_place\" is not possible for this index: {why}; use \
                     update=\"out_of_place\" or the diskann or pipeann preset"
                )));
            }
            d.push(Decision::new(
                "update_strategy",
                "in-place",
                "update=\"in_place\" asked: inserts and deletes rewrite the disk graph's records \
                 (OdinANN's insert, IP-DiskANN's delete), logged as page images for crash safety; \
                 searches merge no delta",
            ));
            crate::format::UpdateMode::InPlace
        }
        None if static_layout.is_some() => {
            d.push(Decision::new(
                "update_strategy",
                "none",
                static_layout.clone().unwrap_or_default(),
            ));
            crate::format::UpdateMode::OutOfPlace
        }
        Some(crate::format::UpdateMode::OutOfPlace) | None => {
            d.push(Decision::new(
                "update_strategy",
                "out-of-place",
                format!(
                    "write_ratio {write_ratio}: a graph index takes inserts into an in-memory \
                     delta and deletes into a delete set, merged into a new disk graph \
                     (FreshDiskANN); the evaluation paper prefers in-place updates for \
                     query-heavy workloads, but measured here (wordnet at 20%, 2 cores) in-place \
                     searches stayed below out-of-place ones down to ~0.5% writes, so `auto` keeps \
                     out-of-place (update=\"in_place\" {})",
                    match &in_place_refusal {
                        Some(why) => format!("is not possible here: {why}"),
                        None => "is available for this layout".to_string(),
                    }
                ),
            ));
            crate::format::UpdateMode::OutOfPlace
        }
    };
    d.push(Decision::new(
        "update_reserve",
        format!("{:.0}%", reserve * 100.0),
        if in_record {
            format!("no PQ codes to shrink: the {layout} layout's records carry the routing codes")
        } else if opts.pq_bytes.is_some() {
            "none: pq_bytes was asked for".to_string()
        } else if budget_given.is_none() {
            "none: with no budget given the open plan gives the delta a quarter of the budget"
                .to_string()
        } else {
            format!(
                "of what the budget leaves beyond its minimum (the structures and one query per \
                 worker), kept from the PQ codes and the workers' interleaving for the update \
                 delta: the write ratio, at most {:.0}%",
                rules::MAX_UPDATE_RESERVE * 100.0
            )
        },
    ));
    let (mut pq_bytes, mut mem) = if in_record {
        // No codes in RAM: the budget holds the fixed structures, the
        // transform (AlayaLaser) or the PQ codebook (AiSAQ), the workers
        // and a cache of whole records (in-degree order).
        let codebook = if pq_coded {
            memory::codebook_bytes(f.dim, record_pq)
        } else {
            0
        };
        let worker: &dyn Fn(usize, usize) -> u64 = if pq_coded { &record_worker } else { &worker };
        let budget = match budget_given {
            Some(b) => {
                d.push(Decision::new("memory_budget", b, "asked for"));
                b
            }
            None => {
                let need = fixed.total()
                    + codebook
                    + open_threads as u64 * worker(preset::AUTO_QUERIES_IN_FLIGHT, 0);
                let b = default_budget.max(need);
                d.push(Decision::new(
                    "memory_budget",
                    b,
                    format!(
                        "the {preset} preset's: {:.0}% of the raw vectors ({raw} bytes), at least \
                         what the index needs with four queries per worker",
                        pd.budget_fraction * 100.0
                    ),
                ));
                b
            }
        };
        if coded {
            d.push(Decision::new(
                "pq_bytes",
                0,
                "AlayaLaser: routing distances come from the codes in each record, no PQ in memory",
            ));
        }
        let (_, mem) = memory::split_at_open(
            &format!("the {preset} preset on {} × {} {}", f.n, f.dim, f.dtype),
            budget,
            raw,
            f.n,
            0,
            codebook,
            &fixed,
            Some(open_threads),
            open_threads,
            worker,
            None,
            budget_given.is_none(),
            false,
            None,
            in_degree,
            &geo,
            &mut d,
        )?;
        (record_pq, mem)
    } else {
        memory::split_at_build(
            &format!("the {preset} preset on {} × {} {}", f.n, f.dim, f.dtype),
            f.n,
            f.dim,
            raw,
            &fixed,
            open_threads,
            &worker,
            opts.pq_bytes,
            if adjacency_first {
                budget_given.or(Some(preset_budget))
            } else {
                budget_given
            },
            default_budget,
            if select_pq { PQ_SHARE_ADJACENCY } else { 1.0 },
            reserve,
            update == crate::format::UpdateMode::InPlace,
            &geo,
            &mut d,
        )?
    };
    if adjacency_first && budget_given.is_none() {
        if let Some(x) = d.iter_mut().find(|x| x.what == "memory_budget") {
            x.rule = format!(
                "the {preset} preset's: {:.0}% of the raw vectors ({raw} bytes), at least what \
                 the index needs with four queries per worker",
                pd.budget_fraction * 100.0
            );
        }
    }
    // Gorgeous replicates lists on the pages for the hops the adjacency
    // cache misses. When the budget holds every list, no hop misses: the
    // replicas serve nothing, and plain records serve the refine stage
    // better: shuffled when a page holds several (half the file; a refine
    // read brings a graph neighbour's vector with it, often another
    // candidate's), else in id order (no maps to hold). Whether every list
    // fits depends on the PQ size the build's selection finds, so the build
    // decides, against that layout's own memory (its maps, its workers).
    let alt_page_size = opts.page_size.unwrap_or(pd.page_size);
    let alternative = if select_pq
        && layout.records() == RecordFormat::Replicated
        && opts.layout.is_none()
        && opts.disk_budget.is_none()
    {
        let geo_s = PageGeometry::with_regions(alt_page_size, vec_bytes, r, 0, 0, 0, f.n)?;
        let alt = if geo_s.records_per_block > 1 {
            LayoutKind::SHUFFLED
        } else {
            LayoutKind::ID
        };
        let map = memory::layout_map_bytes(alt, f.n, &geo_s);
        let shape_r = shape(pq_bytes);
        let shape_s = QueryShape {
            block_size: geo_s.block_size,
            records_per_block: geo_s.records_per_block,
            sigma: rules::block_sigma(alt.placement(), pd.sigma),
            packed: 0,
            ..shape_r
        };
        let per = |s: &QueryShape| memory::worker_bytes(s, preset::AUTO_QUERIES_IN_FLIGHT);
        let more_workers = per(&shape_s).saturating_sub(per(&shape_r)) * open_threads as u64;
        let together = mem.pq_codes + mem.cache;
        let fill = together.checked_sub(map + more_workers).and_then(|left| {
            let m = memory::MemoryPlan {
                pq_codes: 0,
                cache: left,
                ..mem.clone()
            };
            memory::pq_bytes_leaving_every_list(&m, f.n, r, pq_bytes)
        });
        fill.map(|fill| {
            let how = if alt.placement() == Placement::Shuffled {
                format!(
                    "a shuffled layout of plain records ({} a {}-byte page; its maps take \
                     {map} bytes): a refine read brings a graph neighbour's vector with it",
                    geo_s.records_per_block, geo_s.block_size
                )
            } else {
                format!(
                    "plain records in id order (one a {}-byte block, so shuffling would \
                     co-locate nothing)",
                    geo_s.block_size
                )
            };
            d.push(Decision::new(
                "layout_if_lists_fit",
                alt,
                format!(
                    "Gorgeous: when every adjacency list (at R) fits in memory beside the PQ \
                     codes the build keeps (here: codes of up to {fill} bytes), no hop reads a \
                     page and the replicas serve nothing; the build then writes {how}, a file \
                     a fraction of the replicated one"
                ),
            ));
            build::pq::LayoutAlternative { layout: alt, fill }
        })
    } else {
        None
    };
    let pq_selection = select_pq.then(|| {
        let candidates = PQ_SELECT_CANDIDATES;
        let fill = memory::pq_bytes_leaving_every_list(&mem, f.n, r, pq_bytes);
        let filled = match fill {
            Some(m) => format!(
                "; every adjacency list (at R) fits beside codes of up to {m} bytes, so it \
                 keeps the larger of that (at most {}× the smallest passing size) and the \
                 smallest: with every list in memory only the refine stage reads, and a finer \
                 ranking needs fewer refine reads",
                PQ_FILL_MAX_FACTOR
            ),
            None => String::new(),
        };
        if let Some(x) = d.iter_mut().find(|x| x.what == "pq_bytes") {
            x.rule = format!(
                "at most {pq_bytes} (half of what the fixed structures and workers leave of the \
                 budget; the rest holds adjacency lists); the build keeps the smallest size \
                 whose ranking of the data holds sample queries' exact 10 nearest within its top \
                 {candidates} at recall ≥ {:.2} (each candidate beyond is a refine read){filled}",
                1.0 - PQ_SELECT_TOLERANCE
            );
        }
        build::pq::PqSelection {
            tolerance: PQ_SELECT_TOLERANCE,
            candidates,
            fill,
            fill_max_factor: PQ_FILL_MAX_FACTOR,
            alternative,
        }
    });
    if adjacency_first {
        mem.cache_policy = preset::CacheKind::Adjacency.name();
        // Lists at most R long: a lower bound on those the share holds.
        mem.cache_nodes = memory::adjacency_lists_for(mem.cache, f.n, r as f64);
    }
    if pq_bytes == 0 && !coded {
        pq_bytes = 1;
    }
    let build_memory_budget = opts.build_memory_budget.map(|b| b.resolve(raw));
    // The graph stage within the build budget (refused here, before the PQ
    // stage, when no plan fits).
    let gb = rules::graph_build(f.n, f.dim, esz, r, pq_bytes, threads, build_memory_budget)?;
    d.push(Decision::new("graph_shards", gb.shards, gb.why));
    note_covered_l(&mut mem, open_threads, &shape(pq_bytes), &pd, &mut d);
    let search = SearchPlanView::of(&plan_search(
        &SearchOptions::new(10),
        None,
        &SearchFacts {
            preset,
            layout,
            geo,
            n: f.n,
            dim: f.dim,
            esz,
            pq_m: pq_bytes,
            code_groups: geo.code_groups(),
            cache: if in_degree {
                preset::CacheKind::InDegree
            } else {
                pd.cache
            },
            threads: open_threads,
            scratch: ScratchRoom::of(mem.budget, mem.fixed() - mem.worker_scratch, mem.cache),
        },
        10_000,
    )?);
    let plan = BuildPlan {
        preset,
        metric: opts.metric,
        r,
        build_l,
        alpha,
        passes,
        saturate: opts.saturate.unwrap_or(false),
        pq_bytes,
        pq_selection,
        auto_rule: None,
        page_size,
        threads,
        seed: opts.seed,
        layout,
        packed,
        replica_cap: REPLICA_CAP_PER_SLOT * packed,
        adjacency,
        disk_budget: opts.disk_budget,
        update,
        code_dims,
        code_bits,
        code_selection,
        in_degree,
        shuffle: ShuffleParams {
            seed: opts.seed,
            ..opts.shuffle.clone()
        },
        alternative_page_size: alt_page_size,
        nav_sample,
        entry_clusters,
        memory_budget: mem.budget,
        memory_budget_auto: opts.memory_budget.is_none(),
        build_memory_budget,
    };
    Ok(PlannedBuild {
        plan,
        memory: mem,
        search,
        decisions: d,
        warnings: gb.warning.into_iter().collect(),
    })
}

/// What the user of an index built as `m` should know about its build (a
/// graph built in shards small enough to cost recall).
pub fn build_warnings(m: &Manifest) -> Vec<String> {
    let s = &m.spec;
    rules::sharding_warning(
        m.n,
        m.dim,
        m.dtype.size(),
        s.r,
        s.pq_bytes,
        s.threads,
        s.build_memory_budget,
        m.build_stats.shards,
    )
    .into_iter()
    .collect()
}

/// How an index is opened, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenPlan {
    pub entry: EntryPlan,
    /// What the cache share holds.
    pub cache: preset::CacheKind,
    /// Most nodes (lists) the cache may take, when asked (`cache_nodes`).
    pub cache_limit: Option<usize>,
    /// No budget was given at build or open: nearline sized it, and a
    /// search that needs more worker scratch than it reserves takes it.
    pub budget_auto: bool,
    pub memory: MemoryPlan,
    /// Search threads by default (the workers whose scratch is reserved).
    pub threads: usize,
    pub decisions: Vec<Decision>,
}

/// The geometry of an index's page file, from its manifest.
pub fn geometry(m: &Manifest) -> Result<PageGeometry> {
    if m.layout.kind.records() == RecordFormat::Decoupled {
        return PageGeometry::decoupled(
            m.layout.page_size,
            m.dim * m.dtype.size(),
            m.layout.max_degree,
            m.n,
        );
    }
    if m.layout.kind.records() == RecordFormat::PqCoded {
        return PageGeometry::with_pq_codes(
            m.layout.page_size,
            m.dim * m.dtype.size(),
            m.layout.max_degree,
            m.spec.pq_bytes,
            m.n,
        );
    }
    PageGeometry::with_regions(
        m.layout.page_size,
        m.dim * m.dtype.size(),
        m.layout.max_degree,
        m.layout.packed,
        code_dims(m),
        m.layout.codes.map_or(0, |c| c.bits),
        m.n,
    )
}

/// Smallest share of a budget nearline sized that the update layer of a
/// graph index gets.
pub const MIN_UPDATE_SHARE: u64 = 1 << 20;

/// The most bytes a graph index's update layer (FreshDiskANN's delta and
/// delete set) may hold before a merge: half of what a given budget leaves
/// beyond its minimum (the structures and one query per worker), so a delta
/// at its limit still leaves every worker a query (a search beside it plans
/// fewer queries in flight: see `ScratchRoom`); with a budget nearline
/// sized, a quarter of it, at least [`MIN_UPDATE_SHARE`].
pub fn update_share(plan: &OpenPlan) -> u64 {
    let m = &plan.memory;
    if plan.budget_auto {
        (m.budget / 4).max(MIN_UPDATE_SHARE)
    } else {
        m.budget.saturating_sub(m.minimum) / 2
    }
}

/// Dimensions of the neighbour codes the index's records carry (0: none).
pub fn code_dims(m: &Manifest) -> usize {
    m.layout.codes.map_or(0, |c| c.principal_dims)
}

/// Plans opening the index of manifest `m` with `opts`. The memory split
/// is computed from the manifest's section sizes: what each structure will
/// hold once loaded.
pub fn plan_open(opts: &OpenOptions, m: &Manifest) -> Result<OpenPlan> {
    let mut d = Vec::new();
    if let Some(l) = opts.nav_l {
        if l == 0 || l > MAX_NAV_L {
            return Err(Error::arg(format!("nav_L={l} must be in 1..={MAX_NAV_L}")));
        }
    }
    if let Some(s) = opts.nav_seeds {
        if s == 0 || s > MAX_NAV_SEEDS {
            return Err(Error::arg(format!(
                "nav_seeds={s} must be in 1..={MAX_NAV_SEEDS}"
            )));
        }
    }
    if matches!(opts.threads, Some(0)) {
        return Err(Error::arg("threads must be at least 1"));
    }
    let pd = defaults(m.spec.preset);
    let nav_l = opts.nav_l.unwrap_or(pd.nav_l);
    let nav_seeds = opts.nav_seeds.unwrap_or(pd.nav_seeds);
    if nav_seeds > nav_l {
        return Err(Error::arg(format!(
            "nav_seeds={nav_seeds} must not exceed nav_L={nav_l}"
        )));
    }
    let (kind, why) = rules::resolve_entry(
        opts.entry,
        m.has(Section::NavGraph),
        m.has(Section::EntryCentroids),
        opts.entry_points,
    )?;
    let esz = m.dtype.size();
    let section = |s: Section| m.sections.get(&s).map_or(0, |i| i.bytes);
    let (entry, entry_bytes) = match kind {
        EntryKind::Medoid => (EntryPlan::Medoid, 0),
        EntryKind::Sampled => {
            let count = opts.entry_points.min(m.n);
            (
                EntryPlan::Sampled { count },
                memory::sampled_bytes(count, m.dim, esz),
            )
        }
        EntryKind::Nav => (
            EntryPlan::Nav {
                l: nav_l,
                seeds: nav_seeds,
            },
            memory::nav_bytes_from_section(section(Section::NavGraph)),
        ),
        EntryKind::Centroids => (
            EntryPlan::Centroids,
            memory::centroid_bytes_from_section(section(Section::EntryCentroids)),
        ),
    };
    d.push(Decision::new("entry", entry.name(), why));
    let geo = geometry(m)?;
    let raw = m.n as u64 * m.dim as u64 * esz as u64;
    let fixed = FixedCosts {
        ids: if m.has(Section::Ids) {
            memory::ids_bytes(m.n)
        } else {
            0
        },
        layout_map: memory::layout_map_bytes(m.layout.kind, m.n, &geo),
        entry: entry_bytes,
        quantizer: memory::coded_quantizer_bytes(m.dim, code_dims(m)),
    };
    let pq_m = m.spec.pq_bytes;
    let codebook = if pq_m == 0 {
        0
    } else {
        memory::codebook_bytes(m.dim, pq_m)
    };
    let shape = |pq: usize| QueryShape {
        pq_m: pq,
        ..query_shape(m, &geo, &pd)
    };
    // A PQ-coded index (AiSAQ) holds its codebook but no codes; each query
    // still holds a lookup table of its PQ size.
    let pq_coded = m.layout.kind.records() == RecordFormat::PqCoded;
    let resident_m = if pq_coded { 0 } else { pq_m };
    let worker =
        |q: usize, pq: usize| memory::worker_bytes(&shape(if pq_coded { pq_m } else { pq }), q);
    let cores = default_threads();
    let budget = match opts.memory_budget {
        Some(b) => {
            let b = b.resolve(raw);
            d.push(Decision::new("memory_budget", b, "asked for"));
            b
        }
        None if m.format_minor < crate::format::manifest::CHECKSUM_MINOR
            || m.spec.memory_budget_auto =>
        {
            // Before format 1.3 the recorded budget sized the PQ codes only.
            let floor = fixed.total()
                + codebook
                + memory::pq_codes_held(
                    m.n,
                    resident_m,
                    m.spec.update == crate::format::UpdateMode::InPlace,
                )
                + opts.threads.unwrap_or(cores) as u64 * worker(1, pq_m);
            let b = m.spec.memory_budget.max(floor);
            let why = if m.format_minor < crate::format::manifest::CHECKSUM_MINOR {
                format!(
                    "auto: a format {}.{} index records a budget for its PQ codes only ({} \
                     bytes); at least what it needs, searches may take more scratch",
                    m.format_major, m.format_minor, m.spec.memory_budget
                )
            } else {
                "auto: the budget nearline sized at build (none was given), at least what \
                 this open needs; searches may take more scratch (give memory_budget to bind it)"
                    .to_string()
            };
            d.push(Decision::new("memory_budget", b, why));
            b
        }
        None => {
            d.push(Decision::new(
                "memory_budget",
                m.spec.memory_budget,
                "the budget the index was built with",
            ));
            m.spec.memory_budget
        }
    };
    let budget_auto = opts.memory_budget.is_none()
        && (m.spec.memory_budget_auto || m.format_minor < crate::format::manifest::CHECKSUM_MINOR);
    let (cache, why) = rules::resolve_cache(
        opts.cache,
        pd.cache,
        m.has(Section::Adjacency),
        m.has(Section::InDegree),
    )?;
    d.push(Decision::new("cache", cache, why));
    if m.layout.kind.records().carries_codes() && cache == preset::CacheKind::Adjacency {
        return Err(Error::arg(format!(
            "cache=\"adjacency\" does not apply to a {} layout: a node's neighbours are \
             scored from the codes in its whole record (use \"in_degree\" or \"bfs\")",
            m.layout.kind
        )));
    }
    let adjacency = (cache == preset::CacheKind::Adjacency).then_some(m.build_stats.mean_degree);
    let (threads, mut mem) = memory::split_at_open(
        &format!("this {} index", m.spec.preset),
        budget,
        raw,
        m.n,
        resident_m,
        codebook,
        &fixed,
        opts.threads,
        cores,
        &worker,
        opts.cache_nodes,
        budget_auto,
        // An index updated in place opens its PQ table to grow (`load_pq`).
        m.spec.update == crate::format::UpdateMode::InPlace,
        adjacency,
        cache == preset::CacheKind::InDegree,
        &geo,
        &mut d,
    )?;
    note_covered_l(&mut mem, threads, &shape(pq_m), &pd, &mut d);
    let mut plan = OpenPlan {
        entry,
        cache,
        cache_limit: opts.cache_nodes,
        budget_auto,
        memory: mem,
        threads,
        decisions: d,
    };
    let updates = update_decisions(&plan, m);
    plan.decisions.extend(updates);
    Ok(plan)
}

/// How a graph index opened with `plan` takes updates, and why.
fn update_decisions(plan: &OpenPlan, m: &Manifest) -> Vec<Decision> {
    let carries = match m.layout.kind.records() {
        RecordFormat::Replicated => {
            " (its records carry copies of other nodes' lists, which a merge re-lays with the \
             pages)"
        }
        RecordFormat::Coded | RecordFormat::PqCoded => {
            " (its records carry other nodes' codes, which a merge re-encodes with the pages)"
        }
        RecordFormat::Decoupled => {
            " (its vector pages follow the topology pages, and a merge writes both anew)"
        }
        RecordFormat::Plain => "",
    };
    vec![
        Decision::new(
            "update",
            "out_of_place",
            format!(
                "FreshDiskANN: inserts into an in-memory delta graph, deletes into a delete set, \
                 merged into a new disk graph{carries}; in-place graph updates (OdinANN, \
                 IP-DiskANN) are not built yet"
            ),
        ),
        Decision::new(
            "update_share",
            update_share(plan),
            if plan.budget_auto {
                "bytes the delta may hold before a merge: a quarter of the budget nearline sized"
            } else {
                "bytes the delta may hold before a merge: half of what the budget leaves beyond \
                 its minimum (the cache yields what the delta takes; a search beside it plans \
                 fewer queries in flight)"
            },
        ),
    ]
}

/// Records in `mem` (and as a decision) the largest L the workers' share
/// of the budget holds for a search of one query per worker on `threads`
/// workers, shaped as `base` (the preset's default search) but for L. A
/// larger search borrows from the cache while it runs.
fn note_covered_l(
    mem: &mut MemoryPlan,
    threads: usize,
    base: &QueryShape,
    pd: &preset::PresetDefaults,
    d: &mut Vec<Decision>,
) {
    let at = |l: usize| QueryShape {
        l,
        refine: default_refine(base.refine > 0, pd.refine_ratio, l),
        ..*base
    };
    let t = threads as u64;
    let fits = |l: usize| t.saturating_mul(memory::worker_bytes(&at(l), 1)) <= mem.worker_scratch;
    let covered = search::largest(10, crate::search::MAX_LIST_SIZE, fits).unwrap_or(0);
    mem.search_l_covered = covered;
    d.push(Decision::new(
        "search_L_covered",
        covered,
        format!(
            "the workers' share ({} bytes) holds a search of one query per worker on {threads} \
             threads up to L={covered} at W={} (the preset's default search: L={}, several \
             queries per worker); a larger search borrows from the cache while it runs",
            mem.worker_scratch, base.width, pd.l
        ),
    ));
}

/// The refine stage's candidates in a default search (k = 10) of a preset
/// whose search is two-stage.
fn default_refine(two_stage: bool, ratio: f32, l: usize) -> usize {
    if two_stage {
        ((ratio * l as f32).ceil() as usize).clamp(10.min(l), l)
    } else {
        0
    }
}

/// The query shape of a default search on the index of manifest `m`.
fn query_shape(m: &Manifest, geo: &PageGeometry, pd: &preset::PresetDefaults) -> QueryShape {
    let (l, width, sigma) = (pd.l, pd.width, pd.sigma);
    QueryShape {
        n: m.n,
        dim: m.dim,
        esz: m.dtype.size(),
        r: m.layout.max_degree,
        pq_m: m.spec.pq_bytes,
        block_size: geo.block_size,
        records_per_block: geo.records_per_block,
        l,
        width,
        sigma: rules::block_sigma(m.layout.kind.placement(), sigma),
        packed: m.layout.packed,
        refine: default_refine(
            m.layout.packed > 0 || m.has(Section::Adjacency),
            pd.refine_ratio,
            l,
        ),
        code_groups: geo.code_groups(),
    }
}
