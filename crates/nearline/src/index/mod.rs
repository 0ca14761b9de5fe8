//! The top of the engine: build, open and search an index. Each call asks
//! the planner for a typed plan and runs it; an index is a kind (today the
//! static graph index, [`graph`]) above the element-type dispatch, so a
//! partition index or a mutable graph index is another kind beside it.

pub mod graph;

use crate::build::{BuildJob, Progress};
use crate::data::files;
use crate::data::matrix::Matrix;
use crate::distance::Metric;
use crate::elem::{DType, Element};
use crate::format::{IndexKind, Manifest};
use crate::io::files::read_manifest;
use crate::planner::{
    self, BuildOptions, DataFacts, OpenOptions, OpenPlan, PlannedBuild, PlannedSearch,
    RangeOptions, SearchFacts, SearchOptions, SearchPlanView,
};
use crate::search::{EntryPlan, QueryStats};
use crate::{with_dtype, Error, Result};
use graph::GraphIndex;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

pub use graph::MemoryAccount;

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
    let planned = planner::plan_build(opts, &facts)?;
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
    Graph(GraphIndex),
}

/// An open index; safe to share between threads.
pub struct Index {
    dir: PathBuf,
    manifest: Manifest,
    plan: OpenPlan,
    kind: Kind,
}

impl Index {
    /// Opens the index directory `dir`.
    pub fn open(dir: &Path, opts: &OpenOptions) -> Result<Index> {
        let m = read_manifest(dir)?;
        let plan = planner::plan_open(opts, &m)?;
        let kind = match m.kind {
            IndexKind::Graph => Kind::Graph(GraphIndex::open(dir, &m, &plan, opts.io)?),
        };
        Ok(Index {
            dir: dir.to_path_buf(),
            manifest: m,
            plan,
            kind,
        })
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// How the index was opened.
    pub fn open_plan(&self) -> &OpenPlan {
        &self.plan
    }

    /// What the index holds resident now, measured.
    pub fn memory(&self) -> MemoryAccount {
        match &self.kind {
            Kind::Graph(g) => g.account(),
        }
    }

    /// The entry points in use.
    pub fn entry(&self) -> EntryPlan {
        self.plan.entry
    }

    /// The graph index (tests drive its workers directly).
    pub fn graph(&self) -> &GraphIndex {
        match &self.kind {
            Kind::Graph(g) => g,
        }
    }

    /// Bytes the search workers may hold: the budget less everything else
    /// (no limit when nearline sized the budget itself).
    fn scratch_allowance(&self) -> u64 {
        if self.plan.budget_auto {
            return u64::MAX;
        }
        self.plan
            .memory
            .budget
            .saturating_sub(self.graph().static_total())
    }

    /// What the planner knows of this index for a search.
    fn search_facts(&self) -> Result<SearchFacts> {
        SearchFacts::of(
            &self.manifest,
            self.plan.cache,
            self.plan.threads,
            self.scratch_allowance(),
        )
    }

    /// Plans a batch of `nq` queries (a range search with `range`), with
    /// the rule behind each choice.
    pub fn plan_search(
        &self,
        opts: &SearchOptions,
        range: Option<(f32, RangeOptions)>,
        nq: usize,
    ) -> Result<PlannedSearch> {
        planner::plan_search(opts, range, &self.search_facts()?, nq)
    }

    /// [`Index::plan_search`] without the decisions' texts (the search path).
    fn plan_quietly(
        &self,
        opts: &SearchOptions,
        range: Option<(f32, RangeOptions)>,
        nq: usize,
    ) -> Result<PlannedSearch> {
        planner::plan_search_quietly(opts, range, &self.search_facts()?, nq)
    }

    /// Searches `nq` row-major float queries.
    pub fn search(&self, queries: &[f32], nq: usize, opts: &SearchOptions) -> Result<SearchOutput> {
        let planned = self.plan_quietly(opts, None, nq)?;
        self.run(queries, nq, &planned)
    }

    /// Runs a planned batch.
    fn run(&self, queries: &[f32], nq: usize, planned: &PlannedSearch) -> Result<SearchOutput> {
        if queries.len() != nq * self.manifest.dim {
            return Err(Error::arg(format!(
                "queries hold {} values, expected {nq} × {} (the index's dimension)",
                queries.len(),
                self.manifest.dim
            )));
        }
        let Kind::Graph(g) = &self.kind;
        let r = g.search(queries, nq, &planned.plan, planned.threads, planned.scratch)?;
        let metric = self.manifest.metric;
        let ids = r
            .ids
            .iter()
            .map(|&i| if i == u32::MAX { -1 } else { g.external(i) })
            .collect();
        let distances = r
            .distances
            .iter()
            .map(|&d| {
                if d.is_finite() {
                    metric.to_user(d)
                } else if metric.higher_is_closer() {
                    f32::NEG_INFINITY
                } else {
                    f32::INFINITY
                }
            })
            .collect();
        Ok(SearchOutput {
            ids,
            distances,
            lims: r.lims,
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
        let metric = self.manifest.metric;
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
            if self.plan.entry == EntryPlan::Medoid {
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
        let planned = self.plan_quietly(opts, Some((internal, *range)), nq)?;
        self.run(queries, nq, &planned)
    }

    /// A JSON description: sizes, the plan and the memory split, the build
    /// spec.
    pub fn info(&self) -> serde_json::Value {
        let m = &self.manifest;
        let Kind::Graph(g) = &self.kind;
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
            "memory": graph::memory_json(&self.plan.memory, &g.account(), self.plan.budget_auto),
            "plan": {
                "open": self.plan.decisions,
                "threads": self.plan.threads,
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
        })
    }
}

/// The manifest's layout for `info()`, with the page file's size against
/// the raw vectors (`disk_amplification`) and, for a replicated layout,
/// against plain records (`space_amplification`).
fn layout_info(m: &Manifest) -> serde_json::Value {
    let mut v = serde_json::to_value(&m.layout).unwrap_or_default();
    let pages = m.layout.n_blocks.saturating_mul(m.layout.block_size as u64);
    let raw = (m.n as u64).saturating_mul((m.dim * m.dtype.size()) as u64);
    if let Some(o) = v.as_object_mut() {
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
mod alayalaser_tests;
#[cfg(test)]
mod gorgeous_tests;
#[cfg(test)]
mod test_data;
#[cfg(test)]
mod tests;
