//! The top of the engine: build, open and search an index. Each call asks
//! the planner for a typed plan and runs it; an index is a kind (today the
//! static graph index, [`graph`]) above the element-type dispatch, so a
//! partition index or a mutable graph index is another kind beside it.

pub mod budget;
mod check;
pub mod fresh;
pub mod graph;
pub mod inplace;
pub mod merge;
pub mod mutable;

use crate::build::{BuildJob, Progress};
use crate::data::files;
use crate::data::matrix::Matrix;
use crate::distance::Metric;
use crate::elem::{DType, Element};
use crate::format::Preset;
use crate::format::{IndexKind, Manifest};
use crate::io::files::read_manifest;
use crate::partition::state::PartitionManifest;
use crate::partition::{
    CheckReport, PartitionBuild, PartitionIndex, PartitionOpen, PartitionSearch,
};
use crate::planner::PresetChoice;
use crate::planner::{
    self, BuildOptions, DataFacts, OpenOptions, OpenPlan, PlannedBuild, PlannedSearch,
    RangeOptions, ScratchRoom, SearchFacts, SearchOptions, SearchPlanView,
};
use crate::search::{EntryPlan, QueryStats};
use crate::{with_dtype, Error, Result};
use mutable::GraphSlot;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

pub use graph::MemoryAccount;
pub use mutable::GraphOpen;

/// Plans a build over data described by `facts` (what `build` would do).
pub fn plan_build(opts: &BuildOptions, facts: &DataFacts) -> Result<PlannedBuild> {
    planner::plan_build(opts, facts)
}

/// Builds an index from a vector file (memory-mapped when possible).
pub fn build_from_file(
    input: &Path,
    dtype_hint: Option<DType>,
    dir: &Path,
    opts: &BuildOptions,
    progress: Progress<'_>,
    cancel: &AtomicBool,
) -> Result<Manifest> {
    let info = files::probe(input, dtype_hint)?;
    with_dtype!(info.dtype, T, {
        let m = files::open_vectors::<T>(input)?;
        build_inner(m, dir, opts, &[input], progress, cancel)
    })
}

/// Builds an index over `data` into the directory `dir`.
pub fn build<T: Element>(
    data: Matrix<T>,
    dir: &Path,
    opts: &BuildOptions,
    progress: Progress<'_>,
    cancel: &AtomicBool,
) -> Result<Manifest> {
    build_inner(data, dir, opts, &[], progress, cancel)
}

fn build_inner<T: Element>(
    data: Matrix<T>,
    dir: &Path,
    opts: &BuildOptions,
    inputs: &[&Path],
    progress: Progress<'_>,
    cancel: &AtomicBool,
) -> Result<Manifest> {
    let facts = DataFacts {
        n: data.n(),
        dim: data.dim(),
        dtype: T::DTYPE,
    };
    // `auto` asks how well PQ codes rank this data before it keeps them
    // in RAM (measured once per size on a sample that holds at most half
    // the build budget, as the PQ training sample does).
    let raw = data.n() as u64 * data.dim() as u64 * T::DTYPE.size() as u64;
    let probe_bytes = opts
        .build_memory_budget
        .map_or(u64::MAX, |b| b.resolve(raw) / 2);
    let memo = std::cell::RefCell::new(std::collections::HashMap::new());
    let probe = |m: usize| -> Result<Option<f64>> {
        if let Some(r) = memo.borrow().get(&m) {
            return Ok(*r);
        }
        let r = crate::build::pq::ranking_recall(
            &data,
            m,
            opts.metric,
            opts.seed,
            probe_bytes,
            cancel,
        )?;
        memo.borrow_mut().insert(m, r);
        Ok(r)
    };
    let probe: planner::RankingProbe<'_> = &probe;
    let planned = planner::plan_build_probed(
        opts,
        &facts,
        (opts.preset == crate::planner::PresetChoice::Auto).then_some(probe),
    )?;
    crate::build::run(
        data,
        dir,
        &planned.plan,
        &BuildJob {
            ids: opts.ids.as_deref(),
            overwrite: opts.overwrite,
            inputs,
            progress,
            cancel,
        },
    )
}

/// Whether a build asks for a partition index (preset `spfresh`).
pub fn is_partition_build(opts: &BuildOptions) -> bool {
    opts.preset == PresetChoice::Named(Preset::Spfresh)
}

/// Plans a partition build (preset `spfresh`) over data described by
/// `facts`: the parameters and why, as JSON.
pub fn plan_partition_build(opts: &BuildOptions, facts: &DataFacts) -> Result<serde_json::Value> {
    let p = planner::partition::plan(opts, facts.n, facts.dim, facts.dtype)?;
    Ok(serde_json::json!({
        "kind": "partition",
        "preset": "spfresh",
        "params": p.params,
        "expected_resident_bytes": p.expected_bytes,
        "decisions": p.decisions,
    }))
}

/// Plans an open of the partition index in `dir` (`nearline plan INDEX`):
/// what it would hold and the default search, without loading it.
pub fn plan_partition_open(dir: &Path, opts: &OpenOptions) -> Result<serde_json::Value> {
    let m = crate::partition::read_manifest(dir)?;
    let p = planner::partition::plan_open(&m, opts)?;
    let nprobe = m.params.nprobe.unwrap_or(crate::partition::DEFAULT_NPROBE);
    Ok(serde_json::json!({
        "index": dir.display().to_string(),
        "kind": "partition",
        "preset": m.preset.name(),
        "n": m.n, "dim": m.dim, "dtype": m.dtype.name(), "metric": m.metric.name(),
        "params": m.params,
        "threads": p.threads,
        "open": p.decisions,
        "memory": {
            "budget": p.budget,
            "expected_resident": p.expected_bytes,
            "heads": p.heads_bytes,
            "id_maps": p.id_map_bytes,
            "io_buffers": p.io_bytes,
        },
        "search": {
            "nprobe": nprobe,
            "L": (8 * nprobe).max(128),
            "queries_in_flight": crate::partition::QUERIES_IN_FLIGHT,
            "calibration": m.build_stats.calibration,
        },
    }))
}

/// Builds a partition index (preset `spfresh`) over float32 rows.
pub fn build_partition(
    data: &[f32],
    dim: usize,
    dir: &Path,
    opts: &BuildOptions,
    progress: Progress<'_>,
    cancel: &AtomicBool,
) -> Result<PartitionManifest> {
    if dim == 0 || !data.len().is_multiple_of(dim) {
        return Err(Error::arg(format!(
            "data holds {} values, not a whole number of {dim}-dimensional rows",
            data.len()
        )));
    }
    let planned = planner::partition::plan(opts, data.len() / dim, dim, DType::F32)?;
    crate::partition::build_index(
        data,
        dim,
        dir,
        &PartitionBuild {
            metric: opts.metric,
            params: planned.params,
            ids: opts.ids.clone(),
            overwrite: opts.overwrite,
            threads: opts.threads,
        },
        progress,
        cancel,
    )
}

/// Builds a partition index from a float32 vector file.
pub fn build_partition_from_file(
    input: &Path,
    dtype_hint: Option<DType>,
    dir: &Path,
    opts: &BuildOptions,
    progress: Progress<'_>,
    cancel: &AtomicBool,
) -> Result<PartitionManifest> {
    let info = files::probe(input, dtype_hint)?;
    planner::partition::plan(opts, info.n, info.dim, info.dtype)?;
    let m = files::open_vectors::<f32>(input)?;
    build_partition(m.as_slice(), m.dim(), dir, opts, progress, cancel)
}

/// Whether `dir` holds an index of any kind.
pub fn is_any_index(dir: &Path) -> bool {
    crate::io::files::is_index(dir) || crate::partition::is_partition_index(dir)
}

/// The kind of index `dir` holds, from its manifest's `kind` field.
pub fn kind_of(dir: &Path) -> Result<IndexKind> {
    let path = dir.join(crate::format::MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        if !dir.exists() {
            Error::io(
                dir,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "index directory does not exist",
                ),
            )
        } else {
            Error::io(&path, e)
        }
    })?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::corrupt(&path, format!("manifest is not valid JSON: {e}")))?;
    match v.get("kind").and_then(|k| k.as_str()) {
        None => Ok(IndexKind::Graph),
        Some(k) => IndexKind::parse(k).map_err(|_| Error::Version {
            path: path.clone(),
            msg: format!("index kind {k:?} is unknown to this version; upgrade nearline"),
        }),
    }
}

/// Search output: external ids (−1 pads), user-facing distances, statistics;
/// for a range search, `lims` (nq + 1 offsets into `ids`/`distances`).
#[derive(Debug, Default)]
pub struct SearchOutput {
    pub ids: Vec<i64>,
    pub distances: Vec<f32>,
    /// Range search only: query i's results are `lims[i]..lims[i + 1]`.
    pub lims: Vec<u64>,
    pub stats: Vec<QueryStats>,
}

enum Kind {
    Graph(Arc<GraphSlot>),
    Partition(PartitionIndex),
}

/// An open index; safe to share between threads.
pub struct Index {
    dir: PathBuf,
    kind: Kind,
}

impl Drop for Index {
    /// A graph index's background merge is cancelled and its thread joined
    /// (the thread holds the index while it puts a merge in place).
    fn drop(&mut self) {
        if let Kind::Graph(s) = &self.kind {
            s.shutdown();
        }
    }
}

impl Index {
    /// Opens the index directory `dir` (either kind).
    pub fn open(dir: &Path, opts: &OpenOptions) -> Result<Index> {
        let kind = match kind_of(dir)? {
            IndexKind::Graph => {
                let m = read_manifest(dir)?;
                Kind::Graph(GraphSlot::open(dir, m, opts)?)
            }
            IndexKind::Partition => {
                let graph_only = [
                    (opts.cache_nodes.is_some(), "cache_nodes"),
                    (opts.cache != crate::planner::CacheChoice::Auto, "cache"),
                    (opts.entry_points != 0, "entry_points"),
                    (opts.entry != crate::planner::EntryChoice::Auto, "entry"),
                    (opts.nav_l.is_some(), "nav_L"),
                    (opts.nav_seeds.is_some(), "nav_seeds"),
                ];
                if let Some((_, what)) = graph_only.iter().find(|x| x.0) {
                    return Err(Error::arg(format!(
                        "{what} applies to graph indexes; {} holds a partition index",
                        dir.display()
                    )));
                }
                let memory_budget = match opts.memory_budget {
                    None => None,
                    Some(b) => {
                        let m = crate::partition::read_manifest(dir)?;
                        Some(b.resolve((m.n * m.dim * 4) as u64))
                    }
                };
                Kind::Partition(PartitionIndex::open(
                    dir,
                    &PartitionOpen {
                        threads: opts.threads,
                        io: opts.io,
                        durability: opts.durability,
                        background: opts.background_updates,
                        read_only: opts.read_only,
                        memory_budget,
                    },
                )?)
            }
        };
        Ok(Index {
            dir: dir.to_path_buf(),
            kind,
        })
    }

    /// The graph index now (a merge may replace it: hold the `Arc` only
    /// for one operation).
    fn g(&self) -> Option<Arc<GraphOpen>> {
        self.slot().and_then(|s| s.current().ok())
    }

    fn slot(&self) -> Option<&GraphSlot> {
        match &self.kind {
            Kind::Graph(s) => Some(s),
            Kind::Partition(_) => None,
        }
    }

    fn graph_or_err(&self) -> Result<Arc<GraphOpen>> {
        self.g().ok_or_else(|| {
            Error::arg(format!(
                "{} holds a partition index; this operation needs a graph index",
                self.dir.display()
            ))
        })
    }

    /// The partition index, if this is one.
    pub fn partition(&self) -> Option<&PartitionIndex> {
        match &self.kind {
            Kind::Partition(p) => Some(p),
            Kind::Graph(_) => None,
        }
    }

    /// The kind of index.
    pub fn kind(&self) -> IndexKind {
        match &self.kind {
            Kind::Graph(_) => IndexKind::Graph,
            Kind::Partition(_) => IndexKind::Partition,
        }
    }

    /// The vectors' dimension.
    pub fn dim(&self) -> usize {
        match (&self.kind, self.g()) {
            (Kind::Partition(p), _) => p.dim(),
            (_, Some(g)) => g.manifest.dim,
            _ => 0,
        }
    }

    /// The metric.
    pub fn metric(&self) -> Metric {
        match (&self.kind, self.g()) {
            (Kind::Partition(p), _) => p.metric(),
            (_, Some(g)) => g.manifest.metric,
            _ => Metric::L2,
        }
    }

    /// A graph index's manifest (`None` for a partition index).
    pub fn manifest(&self) -> Option<Manifest> {
        self.g().map(|g| g.manifest.clone())
    }

    /// How a graph index was opened.
    pub fn open_plan(&self) -> Option<OpenPlan> {
        self.g().map(|g| g.plan.clone())
    }

    /// What a graph index holds resident now, measured.
    pub fn memory(&self) -> Option<MemoryAccount> {
        self.g().map(|g| g.g.account())
    }

    /// The entry points a graph index uses.
    pub fn entry(&self) -> Option<EntryPlan> {
        self.g().map(|g| g.plan.entry)
    }

    /// The graph index now (tests drive its workers directly; it derefs
    /// to [`graph::GraphIndex`]).
    pub fn graph(&self) -> Option<Arc<GraphOpen>> {
        self.g()
    }

    /// Inserts `vectors` (row-major, the index's dimension) with `ids` (or
    /// new ones); durable and searchable on return. Returns the ids.
    pub fn insert(&self, vectors: &[f32], ids: Option<&[u64]>) -> Result<Vec<u64>> {
        match &self.kind {
            Kind::Partition(p) => p.insert(vectors, ids),
            Kind::Graph(s) => s.insert(vectors, ids),
        }
    }

    /// Checks an insert without doing it.
    pub fn validate_insert(&self, vectors: &[f32], ids: Option<&[u64]>) -> Result<()> {
        match &self.kind {
            Kind::Partition(p) => p.validate_insert(vectors, ids),
            Kind::Graph(s) => s.validate_insert(vectors, ids),
        }
    }

    /// Deletes `ids` (unknown ones are ignored); returns how many were
    /// live.
    pub fn delete(&self, ids: &[u64]) -> Result<usize> {
        match &self.kind {
            Kind::Partition(p) => p.delete(ids),
            Kind::Graph(s) => s.delete(ids),
        }
    }

    /// Writes a checkpoint (a graph index: merges its updates into a new
    /// disk graph); returns the log sequence it holds.
    pub fn checkpoint(&self) -> Result<u64> {
        match &self.kind {
            Kind::Partition(p) => p.checkpoint(),
            Kind::Graph(s) => s.checkpoint(),
        }
    }

    /// Verifies a partition index's internal consistency.
    pub fn check(&self) -> Result<CheckReport> {
        match &self.kind {
            Kind::Partition(p) => p.check(),
            Kind::Graph(_) => Err(Error::arg(
                "check() returns a partition index's report; use check_json() on any index",
            )),
        }
    }

    /// Verifies the index's internal consistency (either kind), as JSON
    /// with a `problems` list (empty: consistent).
    pub fn check_json(&self) -> Result<serde_json::Value> {
        match &self.kind {
            Kind::Partition(p) => Ok(serde_json::to_value(p.check()?).unwrap_or_default()),
            Kind::Graph(s) => check::graph(s),
        }
    }

    /// Runs queued background work now (a graph index: its merge).
    pub fn maintain(&self) -> Result<()> {
        match &self.kind {
            Kind::Partition(p) => p.maintain(),
            Kind::Graph(s) => s.maintain(),
        }
    }

    /// The live ids.
    pub fn live_ids(&self) -> Result<Vec<u64>> {
        match &self.kind {
            Kind::Partition(p) => Ok(p.live_ids()),
            Kind::Graph(s) => s.live_ids(),
        }
    }

    /// Plans a batch of `nq` queries (a range search with `range`), with
    /// the rule behind each choice.
    pub fn plan_search(
        &self,
        opts: &SearchOptions,
        range: Option<(f32, RangeOptions)>,
        nq: usize,
    ) -> Result<PlannedSearch> {
        let g = self.graph_or_err()?;
        let facts = SearchFacts::of(&g.manifest, g.plan.cache, g.plan.threads, scratch_room(&g))?;
        planner::plan_search(opts, range, &facts, nq)
    }

    /// Searches `nq` row-major float queries.
    pub fn search(&self, queries: &[f32], nq: usize, opts: &SearchOptions) -> Result<SearchOutput> {
        if let Some(p) = self.partition() {
            return self.search_partition(p, queries, nq, opts);
        }
        if opts.nprobe.is_some() || opts.probe_cut.is_some() {
            return Err(Error::arg(
                "nprobe and probe_cut apply to partition indexes (preset \"spfresh\")",
            ));
        }
        self.run(queries, nq, opts, None)
    }

    fn search_partition(
        &self,
        p: &PartitionIndex,
        queries: &[f32],
        nq: usize,
        opts: &SearchOptions,
    ) -> Result<SearchOutput> {
        let graph_only = [
            (opts.w.is_some(), "W"),
            (
                opts.executor != crate::planner::ExecutorChoice::Auto,
                "executor",
            ),
            (opts.adaptive_beam, "adaptive_beam"),
            (opts.early_dispatch.is_some(), "early_dispatch"),
            (
                opts.page_search != crate::planner::PageChoice::Auto,
                "page_search",
            ),
            (opts.sigma.is_some(), "sigma"),
            (opts.refine_ratio.is_some(), "refine_ratio"),
            (opts.filter_ratio.is_some(), "filter_ratio"),
        ];
        if let Some((_, what)) = graph_only.iter().find(|x| x.0) {
            return Err(Error::arg(format!(
                "{what} applies to graph indexes; a partition index searches with k, nprobe, L, \
                 probe_cut, queries_in_flight and threads"
            )));
        }
        let r = p.search(
            queries,
            nq,
            &PartitionSearch {
                k: opts.k,
                nprobe: opts
                    .nprobe
                    .or(p.params().nprobe)
                    .unwrap_or(crate::partition::DEFAULT_NPROBE),
                l: opts.l,
                probe_cut: opts.probe_cut,
                threads: opts.threads,
                queries_in_flight: opts.queries_in_flight,
            },
        )?;
        let metric = p.metric();
        let distances = r
            .distances
            .iter()
            .map(|&d| user_distance(metric, d))
            .collect();
        Ok(SearchOutput {
            ids: r.ids,
            distances,
            lims: Vec::new(),
            stats: r.stats,
        })
    }

    /// Plans and runs a batch on the disk graph, merged with the updates
    /// since its last merge (deleted ids dropped, the delta searched).
    fn run(
        &self,
        queries: &[f32],
        nq: usize,
        opts: &SearchOptions,
        range: Option<(f32, RangeOptions)>,
    ) -> Result<SearchOutput> {
        let slot = self.slot().ok_or_else(|| Error::arg("not a graph index"))?;
        let st = slot.read()?;
        let go = &st.open;
        if queries.len() != nq * go.manifest.dim {
            return Err(Error::arg(format!(
                "queries hold {} values, expected {nq} × {} (the index's dimension)",
                queries.len(),
                go.manifest.dim
            )));
        }
        let metric = go.manifest.metric;
        let facts = |g: &GraphOpen| {
            SearchFacts::of(&g.manifest, g.plan.cache, g.plan.threads, scratch_room(g))
        };
        let planned = planner::plan_search_quietly(opts, range, &facts(go)?, nq)?;
        let g = &go.g;
        let updated = !st.delta.is_empty() || st.deleted_on_disk() > 0;
        if !updated {
            let r = g.search(queries, nq, &planned.plan, planned.threads, planned.scratch)?;
            let ids = r
                .ids
                .iter()
                .map(|&i| if i == u32::MAX { -1 } else { g.external(i) })
                .collect();
            let distances = r
                .distances
                .iter()
                .map(|&d| user_distance(metric, d))
                .collect();
            return Ok(SearchOutput {
                ids,
                distances,
                lims: r.lims,
                stats: r.stats,
            });
        }
        if let Some((radius, _)) = range {
            // Range: the disk's results less the deleted, and the delta's
            // within the radius.
            let r = g.search(queries, nq, &planned.plan, planned.threads, planned.scratch)?;
            let dim = go.manifest.dim;
            let (mut ids, mut distances, mut lims) = (Vec::new(), Vec::new(), vec![0u64]);
            for q in 0..nq {
                let (a, b) = (r.lims[q] as usize, r.lims[q + 1] as usize);
                let disk: fresh::Found = (a..b)
                    .filter(|&j| !st.is_deleted(r.ids[j]))
                    .map(|j| (r.distances[j], g.external(r.ids[j]) as u64))
                    .collect();
                let delta = st.delta.range(&queries[q * dim..(q + 1) * dim], radius);
                for (d, e) in fresh::merge_found(disk, delta, usize::MAX) {
                    ids.push(e as i64);
                    distances.push(user_distance(metric, d));
                }
                lims.push(ids.len() as u64);
            }
            return Ok(SearchOutput {
                ids,
                distances,
                lims,
                stats: r.stats,
            });
        }
        // k-NN: the disk list widened by the deleted share, so deleted
        // nodes do not crowd out live ones.
        let k = planned.plan.k;
        let l = planned.plan.l;
        let deleted = st.deleted_on_disk();
        let k_disk = (k + deleted).min(l.max(k));
        let planned = if k_disk > k {
            let wide = SearchOptions {
                k: k_disk,
                l: Some(l.max(k_disk)),
                ..*opts
            };
            planner::plan_search_quietly(&wide, None, &facts(go)?, nq)?
        } else {
            planned
        };
        let r = g.search(queries, nq, &planned.plan, planned.threads, planned.scratch)?;
        let delta = GraphSlot::delta_search(&st, queries, nq, k, l);
        let (ids, dist) = GraphSlot::merge_batch(&st, &r.ids, &r.distances, k_disk, delta, k);
        let distances = dist.iter().map(|&d| user_distance(metric, d)).collect();
        Ok(SearchOutput {
            ids,
            distances,
            lims: Vec::new(),
            stats: r.stats,
        })
    }

    /// Range search (Starling §5.3): every point within `radius` of each of
    /// `nq` row-major float queries — squared L2 distance ≤ radius, or
    /// inner-product / cosine score ≥ radius. The list starts at L and
    /// doubles while the results within the radius fill at least φ of it
    /// (up to max L); kicked-out candidates come back when it grows. With
    /// `entry_cutoff = Some(c)`, a query whose nearest entry point lies
    /// beyond `c · radius` ends with no results and no reads (L2 and cosine;
    /// entry points with in-memory vectors). `opts.k` is ignored. Results
    /// are sorted, closest first, in CSR form (`lims`).
    pub fn range_search(
        &self,
        queries: &[f32],
        nq: usize,
        radius: f32,
        range: &RangeOptions,
        opts: &SearchOptions,
    ) -> Result<SearchOutput> {
        if self.partition().is_some() {
            return Err(Error::arg(
                "range search is not supported by partition indexes yet; use search with k",
            ));
        }
        let go = self.graph_or_err()?;
        let metric = go.manifest.metric;
        if !radius.is_finite() {
            return Err(Error::arg(format!("radius={radius} must be finite")));
        }
        if metric == Metric::L2 && radius < 0.0 {
            return Err(Error::arg(format!(
                "radius={radius} must be at least 0 (a squared L2 distance)"
            )));
        }
        if range.entry_cutoff.is_some() {
            if metric == Metric::InnerProduct {
                return Err(Error::arg(
                    "entry_cutoff needs a metric whose distances are not negative (l2 or \
                     cosine); inner-product scores have no scale to multiply",
                ));
            }
            if go.plan.entry == EntryPlan::Medoid {
                return Err(Error::arg(
                    "entry_cutoff needs entry points held in memory (entry \"nav\", \
                     \"sampled\" or \"centroids\"); this index starts every query from \
                     the medoid, whose distance is not known before a read",
                ));
            }
        }
        let internal = match metric {
            Metric::L2 => radius,
            Metric::InnerProduct => -radius,
            Metric::Cosine => 1.0 - radius,
        };
        self.run(queries, nq, opts, Some((internal, *range)))
    }

    /// A JSON description: sizes, the plan and the memory split, the build
    /// spec.
    pub fn info(&self) -> serde_json::Value {
        let slot = match &self.kind {
            Kind::Graph(s) => s,
            Kind::Partition(p) => return p.info(),
        };
        let (go, updates) = match slot.read() {
            Ok(st) if st.inplace.is_some() => {
                let ip = st.inplace.as_ref();
                (
                    Arc::clone(&st.open),
                    serde_json::json!({
                        "strategy": "in_place",
                        "live": ip.map_or(0, |p| p.live()),
                        "tombstones": ip.map_or(0, |p| p.deleted()),
                        "nodes": st.open.g.nodes(),
                        "update_bytes": ip.map_or(0, |p| p.counted()),
                        "wal_applied": ip.map_or(0, |p| p.applied),
                        "merging": false,
                        "since_open": slot.counters(),
                    }),
                )
            }
            Ok(st) => (
                Arc::clone(&st.open),
                serde_json::json!({
                    "strategy": "out_of_place",
                    "live": st.open.manifest.n - st.delta.deleted_on_disk() + st.delta.inserted(),
                    "inserted_since_merge": st.delta.inserted(),
                    "deleted_since_merge": st.delta.deleted_on_disk(),
                    "delta_bytes": st.delta.memory_bytes(),
                    "delta_share": planner::update_share(&st.open.plan),
                    "wal_applied": st.delta.applied,
                    "merging": slot.merging(),
                    "since_open": slot.counters(),
                }),
            ),
            Err(e) => return serde_json::json!({"error": e.to_string()}),
        };
        let go = &*go;
        let m = &go.manifest;
        let g = &go.g;
        let mut files = serde_json::Map::new();
        let mut disk = 0u64;
        for (k, s) in &m.sections {
            files.insert(
                k.name().into(),
                serde_json::json!({"file": s.file, "bytes": s.bytes, "crc32c": s.crc32c}),
            );
            disk += s.bytes;
        }
        let search = self
            .plan_search(&SearchOptions::new(10), None, 10_000)
            .map(|p| serde_json::to_value(SearchPlanView::of(&p)).unwrap_or_default())
            .unwrap_or_else(|e| serde_json::json!({"error": e.to_string()}));
        let mut entry = g.entry_info();
        if let Some(o) = entry.as_object_mut() {
            o.insert(
                "has_nav".into(),
                m.has(crate::format::Section::NavGraph).into(),
            );
            o.insert(
                "has_centroids".into(),
                m.has(crate::format::Section::EntryCentroids).into(),
            );
            o.insert("nav_sample".into(), m.spec.nav_sample.into());
            o.insert("entry_clusters".into(), m.spec.entry_clusters.into());
        }
        let (held, ledger) = g.account_and_ledger();
        let memory = graph::memory_json(&go.plan.memory, &held, &ledger, go.plan.budget_auto);
        serde_json::json!({
            "path": self.dir.display().to_string(),
            "format_version": format!("{}.{}", m.format_major, m.format_minor),
            "created_by": m.created_by,
            "kind": m.kind.name(),
            "preset": m.spec.preset.name(),
            "n": m.n,
            "dim": m.dim,
            "dtype": m.dtype.name(),
            "metric": m.metric.name(),
            "medoid": m.medoid,
            "R": m.layout.max_degree,
            "build_L": m.spec.build_l,
            "pq_bytes": m.spec.pq_bytes,
            "layout": layout_info(m),
            "overlap_ratio": m.layout.overlap_ratio,
            "page_size": m.layout.page_size,
            "records_per_page": m.layout.records_per_block,
            "disk_bytes": disk,
            "sections": files,
            "memory": memory,
            "plan": {
                "open": go.plan.decisions,
                "threads": go.plan.threads,
                "search": search,
            },
            "cache": g.cache_info(),
            "entry": entry,
            "io_engine": g.engine_name(),
            "direct_io": g.direct_io(),
            "simd": crate::kernels::simd_level(),
            "build": m.spec,
            "build_stats": m.build_stats,
            "warnings": planner::build_warnings(m),
            "wal_sequence": m.wal_sequence,
            "updates": updates,
        })
    }
}

/// What the memory budget gives a search's workers on graph index `g`:
/// what it reserves them with the cache as loaded at open, and the most
/// with the cache emptied (no limit when nearline sized the budget itself).
/// The update layer's bytes count with the fixed structures: a search
/// beside a grown delta plans fewer queries in flight instead of being
/// refused.
pub(super) fn scratch_room(g: &GraphOpen) -> ScratchRoom {
    if g.plan.budget_auto {
        return ScratchRoom::UNBOUNDED;
    }
    let fixed = g.g.fixed_total().max(g.g.ledger().fixed);
    ScratchRoom::of(g.plan.memory.budget, fixed, g.g.cache_planned())
}

/// An internal distance as users see it (infinite pads keep their side).
fn user_distance(metric: Metric, d: f32) -> f32 {
    if d.is_finite() {
        metric.to_user(d)
    } else if metric.higher_is_closer() {
        f32::NEG_INFINITY
    } else {
        f32::INFINITY
    }
}

/// The manifest's layout for `info()`, with its placement and record
/// format, and the page file's size against
/// the raw vectors (`disk_amplification`) and, for a replicated layout,
/// against plain records (`space_amplification`).
fn layout_info(m: &Manifest) -> serde_json::Value {
    let mut v = serde_json::to_value(&m.layout).unwrap_or_default();
    let pages = m
        .layout
        .n_blocks
        .saturating_add(m.layout.vector_blocks)
        .saturating_mul(m.layout.block_size as u64);
    let raw = (m.n as u64).saturating_mul((m.dim * m.dtype.size()) as u64);
    if let Some(o) = v.as_object_mut() {
        // The layout's two components (`format::layout_kind`).
        o.insert("placement".into(), m.layout.kind.placement().name().into());
        o.insert("records".into(), m.layout.kind.records().name().into());
        o.insert("pages_bytes".into(), pages.into());
        if raw > 0 {
            o.insert(
                "disk_amplification".into(),
                (pages as f64 / raw as f64).into(),
            );
        }
        if let Some(r) = &m.layout.replication {
            if r.plain_bytes > 0 {
                o.insert(
                    "space_amplification".into(),
                    (pages as f64 / r.plain_bytes as f64).into(),
                );
            }
        }
    }
    v
}

#[cfg(test)]
mod aisaq_tests;
#[cfg(test)]
mod alayalaser_tests;
#[cfg(test)]
mod budget_tests;
#[cfg(test)]
mod dgai_tests;
#[cfg(test)]
mod fresh_tests;
#[cfg(test)]
mod gorgeous_tests;
#[cfg(test)]
mod inplace_tests;
#[cfg(test)]
mod pageann_tests;
#[cfg(test)]
pub(crate) mod test_data;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod update_model_tests;
