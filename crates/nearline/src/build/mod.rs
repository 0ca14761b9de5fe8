//! Building a graph index: runs a [`BuildPlan`] (made by the planner) as
//! phases — PQ codes ([`pq`]), the graph ([`graph`]), the placement and
//! page file ([`pages`]), the entry structures ([`entries`]) — into a hidden
//! staging directory, then the manifest, then an atomic, durable swap into
//! place ([`crate::io::staging`]). A cancelled or failed build leaves no
//! directory that looks like an index, and never touches anything but the
//! index it replaces.

pub mod codes;
pub mod entries;
pub mod graph;
pub mod pages;
pub mod pq;

use crate::data::files::check_finite;
use crate::data::matrix::{Matrix, MatrixView};
use crate::distance::Metric;
use crate::elem::Element;
use crate::format::{
    BuildSpec, BuildStats, IndexKind, LayoutInfo, LayoutKind, Manifest, Preset, RecordFormat,
    Section, SectionInfo, FORMAT_MAJOR, FORMAT_MINOR, FORMAT_NAME,
};
use crate::io::files::{write_manifest, write_section};
use crate::io::staging::Staging;
use crate::layout::shuffle::ShuffleParams;
use crate::{Error, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Progress callback: `(stage, done, total)`.
pub type Progress<'a> = &'a (dyn Fn(&str, u64, u64) + Sync);

/// How a build runs, resolved (no option left to a default).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BuildPlan {
    pub preset: Preset,
    pub metric: Metric,
    /// Maximum graph degree.
    #[serde(rename = "R")]
    pub r: usize,
    #[serde(rename = "build_L")]
    pub build_l: usize,
    pub alpha: f32,
    pub passes: usize,
    /// Fill pruned adjacency lists up to R.
    pub saturate: bool,
    /// PQ bytes per vector (with `pq_selection`: the most the build may
    /// choose).
    pub pq_bytes: usize,
    /// The build chooses the PQ bytes on a sample (Gorgeous).
    pub pq_selection: Option<pq::PqSelection>,
    /// With `preset="auto"`: the rule that chose the preset (recorded in
    /// the manifest).
    pub auto_rule: Option<String>,
    pub page_size: usize,
    pub threads: usize,
    pub seed: u64,
    pub layout: LayoutKind,
    /// Packed adjacency lists per record of a replicated layout (0
    /// otherwise).
    pub packed: usize,
    /// Most other records one list is packed into.
    pub replica_cap: usize,
    /// Write the `adjacency` section (what an adjacency-first cache loads).
    pub adjacency: bool,
    /// Bytes the page file may take (`None`: no limit).
    pub disk_budget: Option<u64>,
    /// How the index takes updates.
    pub update: crate::format::UpdateMode,
    /// Principal dimensions of the neighbour codes a coded layout's
    /// records carry (0: no codes).
    pub code_dims: usize,
    /// Bits per dimension of those codes (1, 2 or 4; 0: no codes).
    pub code_bits: usize,
    /// The build chooses the code shape on a sample (`code_dims` and
    /// `code_bits` are then the planner's rule, one of the candidates).
    pub code_selection: Option<codes::CodeSelection>,
    /// Write the in-degree section (what an in-degree cache loads).
    pub in_degree: bool,
    /// How a shuffled layout is made.
    #[serde(skip)]
    pub shuffle: ShuffleParams,
    /// Page size of the PQ selection's alternative layout, if it has one.
    #[serde(skip)]
    pub alternative_page_size: usize,
    /// Navigation-graph sample rate (0: none).
    pub nav_sample: f64,
    /// Centroid entries (0: none).
    pub entry_clusters: usize,
    /// The search budget the index records (an open's default).
    pub memory_budget: u64,
    /// Whether nearline sized the budget (none was given).
    pub memory_budget_auto: bool,
    /// Bytes the build may use (`None`: unlimited).
    pub build_memory_budget: Option<u64>,
}

impl BuildPlan {
    /// This plan writing a `layout` of plain records instead (the PQ
    /// selection's alternative, see `pq::PqSelection`): no packed lists,
    /// the preset's page size for it, no further selection.
    pub fn with_layout(&self, layout: LayoutKind) -> BuildPlan {
        BuildPlan {
            layout,
            packed: 0,
            replica_cap: 0,
            page_size: self.alternative_page_size,
            pq_selection: None,
            ..self.clone()
        }
    }
}

/// What a build is given besides the data and the plan.
pub struct BuildJob<'a> {
    /// External ids, one per row.
    pub ids: Option<&'a [u64]>,
    /// Replace an existing index at the target.
    pub overwrite: bool,
    /// Files the build reads, which must not lie inside what it replaces.
    pub inputs: &'a [&'a Path],
    pub progress: Progress<'a>,
    pub cancel: &'a AtomicBool,
}

/// Fails with [`Error::Cancelled`] once `cancel` is set.
#[inline]
pub fn check_cancel(cancel: &AtomicBool) -> Result<()> {
    if cancel.load(Ordering::Relaxed) {
        Err(Error::Cancelled)
    } else {
        Ok(())
    }
}

/// Builds an index over `data` into the directory `dir` following `plan`.
pub fn run<T: Element>(
    data: Matrix<T>,
    dir: &Path,
    plan: &BuildPlan,
    job: &BuildJob<'_>,
) -> Result<Manifest> {
    let staging = Staging::begin(dir, job.overwrite, &crate::io::files::is_index, job.inputs)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(plan.threads)
        .build()
        .map_err(|e| Error::Engine(format!("cannot start {} build threads: {e}", plan.threads)))?;
    let tmp = staging.path().to_path_buf();
    let progress = job.progress;
    let cancel = job.cancel;
    let manifest = pool.install(|| -> Result<Manifest> {
        let t0 = Instant::now();
        check_finite_streaming(&data, cancel)?;
        if plan.code_dims > 0 {
            // A coded layout: every phase runs on the transformed float32
            // vectors (distances are the original ones).
            let tc = Instant::now();
            let (coding, transformed) = codes::fit(&data, plan, progress, cancel)?;
            drop(data);
            let pq_seconds = tc.elapsed().as_secs_f64();
            // The shape the build kept (the plan's, or the probe's choice).
            let chosen = BuildPlan {
                code_dims: coding.pca.principal(),
                code_bits: coding.bits,
                code_selection: None,
                ..plan.clone()
            };
            return phases(
                transformed,
                Some(coding),
                pq_seconds,
                None,
                None,
                &tmp,
                &chosen,
                job,
                t0,
            );
        }
        let data = if plan.metric == Metric::Cosine {
            normalized(&data, cancel)?
        } else {
            data
        };
        phases(data, None, 0.0, None, None, &tmp, plan, job, t0)
    })?;
    // What the phases freed in the allocator's arenas goes back now, not
    // when the process ends.
    crate::util::return_freed_memory();
    staging.commit()?;
    Ok(manifest)
}

/// PQ codes a merge carries over: the old index's codebook and the codes of
/// the merged index's rows (kept rows copied, inserted rows encoded with
/// the same codebook), so the build's costliest phase after the graph,
/// training, is skipped (FreshDiskANN keeps its codebook the same way).
pub struct GivenPq {
    pub codebook: crate::quant::pq::PqCodebook,
    /// `n × m` codes, row-major, in the merged index's order.
    pub codes: crate::util::BigBuf<u8>,
}

/// Writes an index over `data` (as its records store it: normalised for
/// cosine; transformed by `coding` for a coded layout) whose graph is
/// `given` (a merge made it) into the directory `tmp`, which the caller
/// stages and commits; runs every phase of a build but the graph's, and
/// PQ's too when `pq` gives its codebook and codes.
pub fn run_merged<T: Element>(
    data: Matrix<T>,
    coding: Option<codes::Coding>,
    given: graph::BuiltGraph,
    pq: Option<GivenPq>,
    tmp: &Path,
    plan: &BuildPlan,
    job: &BuildJob<'_>,
) -> Result<Manifest> {
    if given.graph.n() != data.n() {
        return Err(Error::arg(format!(
            "a merged graph of {} nodes for {} vectors",
            given.graph.n(),
            data.n()
        )));
    }
    if let Some(p) = &pq {
        if p.codebook.dim() != data.dim() || p.codes.len() != data.n() * p.codebook.m() {
            return Err(Error::arg(format!(
                "merged PQ codes: {} bytes of a {}-d codebook with {} chunks for {} × {} vectors",
                p.codes.len(),
                p.codebook.dim(),
                p.codebook.m(),
                data.n(),
                data.dim()
            )));
        }
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(plan.threads)
        .build()
        .map_err(|e| Error::Engine(format!("cannot start {} build threads: {e}", plan.threads)))?;
    let t0 = Instant::now();
    let m = pool.install(|| phases(data, coding, 0.0, Some(given), pq, tmp, plan, job, t0))?;
    crate::util::return_freed_memory();
    Ok(m)
}

/// The phases of a build over `data` (transformed, with its `coding`, for a
/// coded layout) into the staging directory `tmp`, with the graph `given`
/// or built here; returns the manifest written there.
#[allow(clippy::too_many_arguments)]
fn phases<T: Element>(
    data: Matrix<T>,
    coding: Option<codes::Coding>,
    coding_seconds: f64,
    given: Option<graph::BuiltGraph>,
    given_pq: Option<GivenPq>,
    tmp: &Path,
    plan: &BuildPlan,
    job: &BuildJob<'_>,
    t0: Instant,
) -> Result<Manifest> {
    let (n, dim) = (data.n(), data.dim());
    let tmp = tmp.to_path_buf();
    let progress = job.progress;
    let cancel = job.cancel;
    {
        let build_budget = plan.build_memory_budget.unwrap_or(u64::MAX);
        let mut sections = BTreeMap::new();

        // 1. Product quantization: train on a sample, encode in streaming chunks.
        //    (A coded layout has none: its transform took this time.)
        let tq = Instant::now();
        let mut switched = None;
        let (pq_bytes, codes, pq_trials) = if let Some(c) = &coding {
            sections.insert(
                Section::Pca,
                write_section(
                    &tmp,
                    "pca.bin",
                    "pca",
                    &crate::format::quant::encode_pca(&c.pca),
                )?,
            );
            sections.insert(
                Section::Rabitq,
                write_section(
                    &tmp,
                    "rabitq.bin",
                    "rabitq",
                    &crate::format::quant::encode_rabitq(&c.rabitq),
                )?,
            );
            (0, None, Vec::new())
        } else {
            let pq::PqOutput {
                codebook,
                codes,
                trials: pq_trials,
                layout,
            } = match given_pq {
                Some(GivenPq { codebook, codes }) => pq::PqOutput {
                    codebook,
                    codes,
                    trials: Vec::new(),
                    layout: None,
                },
                None => pq::run(&data, plan, build_budget, progress, cancel)?,
            };
            // Every adjacency list fits in memory with the planner's
            // alternative layout: write that one (see `pq::PqSelection`).
            switched = layout.map(|kind| plan.with_layout(kind));
            sections.insert(
                Section::PqCodebook,
                write_section(
                    &tmp,
                    "pq_codebook.bin",
                    "pq_codebook",
                    &crate::format::pq::encode(&codebook),
                )?,
            );
            sections.insert(
                Section::PqCodes,
                write_section(&tmp, "pq_codes.bin", "pq_codes", &codes)?,
            );
            (codebook.m(), Some(codes), pq_trials)
        };
        let pq_seconds = tq.elapsed().as_secs_f64() + coding_seconds;
        let plan = switched.as_ref().unwrap_or(plan);

        // 2. The graph (one-shot or sharded within the build budget; the PQ
        //    codes stay resident through it).
        let tg = Instant::now();
        let g = match given {
            Some(g) => g,
            None => graph::run(
                &data,
                plan,
                build_budget.saturating_sub(codes.as_ref().map_or(0, |c| c.len() as u64)),
                progress,
                cancel,
            )?,
        };
        // A PQ-coded layout writes the neighbours' codes into the records.
        let record_codes = if plan.layout.records() == RecordFormat::PqCoded {
            codes
        } else {
            drop(codes);
            None
        };
        let graph_seconds = tg.elapsed().as_secs_f64();

        // 3. The placement, the page file and the location map.
        let placed = pages::run(
            &data,
            &g.graph,
            g.medoid,
            plan,
            pages::RecordCodes {
                rabitq: coding.as_ref().map(|c| &c.rabitq),
                pq: record_codes.as_deref().map(|c| (c, pq_bytes)),
            },
            &tmp,
            progress,
            cancel,
        )?;
        drop(record_codes);
        for (s, info) in placed.sections {
            sections.insert(s, info);
        }
        let mean_degree = g.graph.mean_degree();
        // The entry structures come last, with the graph freed: only the
        // (streamed) data and their own samples are resident.
        drop(g.graph);
        crate::util::return_freed_memory();

        // 4. Entry structures: the navigation graph and centroid entries.
        let te = Instant::now();
        for (s, info) in entries::run(&data, plan, build_budget, &tmp, progress, cancel)? {
            sections.insert(s, info);
        }
        let entry_seconds = te.elapsed().as_secs_f64();
        if let Some(ids) = job.ids {
            sections.insert(
                Section::Ids,
                write_section(
                    &tmp,
                    "ids.bin",
                    "external_ids_u64",
                    &crate::format::section::encode_ids(ids),
                )?,
            );
        }
        check_cancel(cancel)?;
        let manifest = Manifest {
            format: FORMAT_NAME.into(),
            format_major: FORMAT_MAJOR,
            format_minor: FORMAT_MINOR,
            kind: IndexKind::Graph,
            created_by: format!("nearline {}", env!("CARGO_PKG_VERSION")),
            spec: BuildSpec {
                preset: plan.preset,
                r: plan.r,
                build_l: plan.build_l,
                alpha: plan.alpha,
                passes: plan.passes,
                saturate: plan.saturate,
                pq_bytes,
                memory_budget: plan.memory_budget,
                memory_budget_auto: plan.memory_budget_auto,
                build_memory_budget: plan.build_memory_budget.unwrap_or(0),
                page_size: plan.page_size,
                seed: plan.seed,
                threads: plan.threads,
                nav_sample: plan.nav_sample,
                entry_clusters: plan.entry_clusters,
                disk_budget: plan.disk_budget.unwrap_or(0),
                update: plan.update,
                auto_rule: plan.auto_rule.clone(),
            },
            dtype: T::DTYPE,
            metric: plan.metric,
            dim,
            n,
            medoid: g.medoid,
            layout: LayoutInfo {
                kind: plan.layout,
                page_size: placed.geo.page_size,
                block_size: placed.geo.block_size,
                record_size: placed.geo.record_size,
                records_per_block: placed.geo.records_per_block,
                n_blocks: placed.geo.n_blocks,
                max_degree: placed.geo.max_degree,
                overlap_ratio: Some(placed.overlap_ratio),
                shuffle: placed.shuffle,
                packed: placed.geo.packed,
                replication: placed.replication,
                codes: coding.as_ref().map(|c| crate::format::CodesInfo {
                    principal_dims: c.pca.principal(),
                    bits: plan.code_bits,
                    explained_variance: c.pca.explained_variance_ratio(),
                }),
                page_graph: placed.page_graph,
                vector_blocks: placed.geo.vector_blocks,
            },
            wal_sequence: 0,
            next_auto_id: 0,
            sections,
            build_stats: BuildStats {
                seconds: t0.elapsed().as_secs_f64(),
                graph_seconds,
                pq_seconds,
                mean_degree,
                shards: g.shards,
                entry_seconds,
                pq_trials,
                code_trials: coding
                    .as_ref()
                    .map(|c| c.trials.clone())
                    .unwrap_or_default(),
            },
            checksum: None,
        };
        write_manifest(&tmp, &manifest)?;
        Ok(manifest)
    }
}

/// The entry of a section written by a phase.
pub type SectionEntry = (Section, SectionInfo);

/// Checks every value is finite and that its square does not overflow (a
/// squared distance would be infinite), in chunks whose mapped pages are
/// released afterwards so a streamed input never becomes resident all at
/// once.
fn check_finite_streaming<T: Element>(data: &Matrix<T>, cancel: &AtomicBool) -> Result<()> {
    let (n, dim) = (data.n(), data.dim());
    let chunk = 65_536;
    for start in (0..n).step_by(chunk) {
        check_cancel(cancel)?;
        let end = (start + chunk).min(n);
        let view = MatrixView::new(&data.as_slice()[start * dim..end * dim], end - start, dim)?;
        check_finite("input vectors", view).map_err(|e| match e {
            // Row numbers in the message are relative to the chunk: re-issue with the global row.
            Error::InvalidArgument(m) => Error::InvalidArgument(rebase_row(&m, start)),
            other => other,
        })?;
        data.release_rows(start, end);
    }
    Ok(())
}

/// Rewrites "row R" in a message to "row R+offset".
fn rebase_row(msg: &str, offset: usize) -> String {
    if let Some(i) = msg.find("row ") {
        let rest = &msg[i + 4..];
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        if let Ok(r) = digits.parse::<usize>() {
            return format!("{}row {}{}", &msg[..i], r + offset, &rest[digits.len()..]);
        }
    }
    msg.to_string()
}

fn normalized<T: Element>(data: &Matrix<T>, cancel: &AtomicBool) -> Result<Matrix<T>> {
    let dim = data.dim();
    let mut out: Vec<T> = Vec::with_capacity(data.n() * dim);
    let mut row = vec![0f32; dim];
    for i in 0..data.n() {
        if i % 65_536 == 0 {
            check_cancel(cancel)?;
        }
        for (r, x) in row.iter_mut().zip(data.row(i)) {
            *r = x.to_f32();
        }
        crate::distance::normalize(&mut row);
        for &v in &row {
            out.push(T::from_f32(v).ok_or_else(|| {
                Error::arg(format!("row {i} cannot be normalised in {}", T::DTYPE))
            })?);
        }
    }
    Matrix::from_vec(out, data.n(), dim)
}
