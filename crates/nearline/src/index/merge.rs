//! StreamingMerge of a graph index updated out of place (FreshDiskANN):
//! the page file is read back in block order, the graph edit of
//! [`crate::graph::merge`] removes the deleted nodes and places the
//! delta's vectors, and every other phase of a build (PQ, placement and
//! page file, entry structures, ids) writes the result as a new index
//! directory, which takes the old one's place atomically
//! ([`crate::io::staging`]). The layout is the old index's: a shuffled,
//! replicated or coded layout is re-laid as a build lays it.

use super::graph::GraphIndex;
use crate::build::{codes::Coding, graph::BuiltGraph, BuildJob, Progress};
use crate::data::matrix::{Matrix, MatrixView};
use crate::elem::Element;
use crate::format::page::verify_block;
use crate::format::{Manifest, RecordFormat, Section};
use crate::graph::merge::merge;
use crate::graph::vamana::slack_degree;
use crate::graph::{Graph, MatrixSpace, VamanaParams};
use crate::io::files::{read_section, section_path, write_manifest};
use crate::io::staging::Staging;
use crate::io::BlockReader;
use crate::planner::{BuildOptions, DataFacts, PresetChoice};
use crate::util::{BigBuf, Budget};
use crate::{with_dtype, Error, Result};
use rayon::prelude::*;
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// What a merge is given besides the index.
pub struct MergeJob<'a> {
    /// One flag per disk node: deleted.
    pub deleted: &'a [bool],
    /// The delta's live vectors (row-major, f32, normalised for cosine)
    /// and their external ids.
    pub inserts: &'a [f32],
    pub insert_ids: &'a [u64],
    /// The log sequence the merged index holds.
    pub wal_sequence: u64,
    /// The next automatic id after it.
    pub next_auto_id: u64,
    pub progress: Progress<'a>,
    pub cancel: &'a AtomicBool,
}

/// What a merge did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MergeReport {
    pub seconds: f64,
    /// Reading the page file back.
    pub read_seconds: f64,
    /// The graph edit, and its three steps.
    pub graph_seconds: f64,
    pub consolidate_seconds: f64,
    pub insert_seconds: f64,
    pub compact_seconds: f64,
    /// The old PQ codebook was kept (the inserts encoded with it).
    pub pq_kept: bool,
    /// Writing the new index (PQ, pages, entry structures).
    pub write_seconds: f64,
    pub deleted: usize,
    pub inserted: usize,
    /// Live nodes whose lists consolidation rewrote.
    pub consolidated: usize,
    /// Nodes none of whose two nearest out-neighbours listed them, given
    /// an edge from one (`graph::merge::link_back`).
    pub linked_back: usize,
    /// Vectors in the merged index.
    pub n: usize,
}

/// The build options that reproduce the index of manifest `m` (its
/// preset, graph parameters, layout and budgets).
pub fn options_of(m: &Manifest) -> BuildOptions {
    let s = &m.spec;
    BuildOptions {
        metric: m.metric,
        preset: PresetChoice::Named(s.preset),
        r: Some(s.r),
        build_l: Some(s.build_l),
        alpha: Some(s.alpha),
        passes: Some(s.passes),
        saturate: Some(s.saturate),
        pq_bytes: (s.pq_bytes > 0).then_some(s.pq_bytes),
        memory_budget: (!s.memory_budget_auto).then_some(Budget::Bytes(s.memory_budget)),
        build_memory_budget: (s.build_memory_budget > 0)
            .then_some(Budget::Bytes(s.build_memory_budget)),
        page_size: Some(m.layout.page_size),
        threads: (s.threads > 0).then_some(s.threads),
        seed: s.seed,
        nav_sample: Some(s.nav_sample),
        entry_clusters: Some(s.entry_clusters),
        layout: Some(m.layout.kind),
        disk_budget: (s.disk_budget > 0).then_some(s.disk_budget),
        update: Some(s.update),
        adjacency: Some(m.has(Section::Adjacency)),
        codes: crate::planner::CodeParams {
            principal_dims: m.layout.codes.map(|c| c.principal_dims),
            bits: m.layout.codes.map(|c| c.bits),
        },
        overwrite: true,
        ..BuildOptions::default()
    }
}

/// A merged index written to its staging directory, not yet in place.
pub struct StagedMerge {
    staging: Staging,
    pub manifest: Manifest,
    pub report: MergeReport,
    started: Instant,
}

impl StagedMerge {
    /// The staging directory (the caller writes the new log there).
    pub fn path(&self) -> &Path {
        self.staging.path()
    }

    /// Puts the merged index in the place of the old one, atomically.
    pub fn commit(self) -> Result<(Manifest, MergeReport)> {
        let StagedMerge {
            staging,
            manifest,
            mut report,
            started,
        } = self;
        let tc = Instant::now();
        staging.commit()?;
        report.write_seconds += tc.elapsed().as_secs_f64();
        report.seconds = started.elapsed().as_secs_f64();
        Ok((manifest, report))
    }
}

/// Merges the updates of `job` into the index `g` (manifest `m`) in `dir`:
/// writes the merged index into a staging directory, which
/// [`StagedMerge::commit`] swaps in.
pub fn merge_index(
    dir: &Path,
    m: &Manifest,
    g: &GraphIndex,
    job: &MergeJob<'_>,
) -> Result<StagedMerge> {
    with_dtype!(m.dtype, T, merge_typed::<T>(dir, m, g, job))
}

fn merge_typed<T: Element>(
    dir: &Path,
    m: &Manifest,
    g: &GraphIndex,
    job: &MergeJob<'_>,
) -> Result<StagedMerge> {
    let t0 = Instant::now();
    let (n_old, dim) = (m.n, m.dim);
    let n_ins = job.insert_ids.len();
    if job.deleted.len() != n_old || job.inserts.len() != n_ins * dim {
        return Err(Error::arg(format!(
            "merge: {} delete flags for {n_old} nodes, {} values for {n_ins} inserts",
            job.deleted.len(),
            job.inserts.len()
        )));
    }
    let n_all = n_old + n_ins;
    let coding = if m.layout.kind.records() == RecordFormat::Coded {
        Some(load_coding(dir, m)?)
    } else {
        None
    };

    // 1. The records, in block order.
    let (layout, pages) = g.layout_and_pages();
    let geo = *layout.geometry();
    let mut rows: Vec<T> = Vec::with_capacity(n_all * dim);
    rows.resize(n_all * dim, bytemuck::Zeroable::zeroed());
    let mut graph = Graph::new(n_all, slack_degree(m.spec.r.max(1)));
    let mut reader = BlockReader::open(&pages, geo.block_size)?;
    let mut nodes = Vec::new();
    let mut seen = 0usize;
    for b in 0..geo.n_blocks {
        crate::build::check_cancel(job.cancel)?;
        let block = reader.read(geo.block_offset(b))?;
        verify_block(block, b, &geo).map_err(|e| Error::corrupt(&pages, e))?;
        nodes.clear();
        layout.block_nodes(b, &mut nodes);
        for (slot, &v) in nodes.iter().enumerate() {
            if v as usize >= n_old {
                continue;
            }
            let rec = geo
                .decode(block, slot)
                .map_err(|e| Error::corrupt(&pages, format!("node {v}: {e}")))?;
            let at = v as usize * dim;
            for (k, c) in rec
                .vector
                .chunks_exact(std::mem::size_of::<T>())
                .take(dim)
                .enumerate()
            {
                rows[at + k] = bytemuck::pod_read_unaligned::<T>(c);
            }
            let list: Vec<u32> = rec
                .neighbours
                .iter()
                .copied()
                .filter(|&u| (u as usize) < n_old && u != v)
                .collect();
            graph.set_neighbors(v, &list);
            seen += 1;
        }
    }
    if seen != n_old {
        return Err(Error::corrupt(
            &pages,
            format!("the page file holds {seen} records; the manifest says {n_old}"),
        ));
    }
    // A decoupled layout's vectors lie in the vector pages after them.
    for i in 0..geo.vector_blocks {
        crate::build::check_cancel(job.cancel)?;
        let b = geo.n_blocks + i;
        let block = reader.read(geo.block_offset(b))?;
        verify_block(block, b, &geo).map_err(|e| Error::corrupt(&pages, e))?;
        let first = i as usize * geo.vectors_per_block;
        for slot in 0..geo.vectors_per_block {
            let v = first + slot;
            if v >= n_old {
                break;
            }
            let x = geo
                .vector_at(block, slot)
                .map_err(|e| Error::corrupt(&pages, format!("vector of node {v}: {e}")))?;
            for (k, c) in x
                .chunks_exact(std::mem::size_of::<T>())
                .take(dim)
                .enumerate()
            {
                rows[v * dim + k] = bytemuck::pod_read_unaligned::<T>(c);
            }
        }
    }
    drop(reader);
    // The inserts, as the records store them.
    let mut t = vec![0f32; dim];
    let mut y = vec![0f32; dim];
    for (i, r) in job.inserts.chunks_exact(dim).enumerate() {
        let r: &[f32] = match &coding {
            Some(c) => {
                let p = c.pca.principal();
                c.pca.transform(r, &mut t)?;
                c.rabitq.rotate(&t[..p], &mut y[..p])?;
                y[p..].copy_from_slice(&t[p..]);
                &y
            }
            None => r,
        };
        for (k, &x) in r.iter().enumerate() {
            rows[(n_old + i) * dim + k] = T::from_f32(x).ok_or_else(|| {
                Error::arg(format!(
                    "inserted vector {} holds {x}, which a {} index cannot store",
                    job.insert_ids[i],
                    T::DTYPE
                ))
            })?;
        }
    }
    let read_seconds = t0.elapsed().as_secs_f64();

    // 2. The graph edit, on the build's threads.
    let threads = if m.spec.threads > 0 {
        m.spec.threads
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Error::Engine(format!("cannot start {threads} merge threads: {e}")))?;
    let tg = Instant::now();
    let mut deleted = job.deleted.to_vec();
    deleted.resize(n_all, false);
    let inserted: Vec<u32> = (n_old as u32..n_all as u32).collect();
    let params = VamanaParams {
        r: m.spec.r,
        l: m.spec.build_l,
        alpha: m.spec.alpha,
        passes: 1,
        seed: m.spec.seed,
        saturate: m.spec.saturate,
        ..VamanaParams::default()
    };
    let merged = pool.install(|| {
        let view = MatrixView::new(&rows, n_all, dim)?;
        let space = MatrixSpace::new(view, m.metric);
        let gp = |d: u64, t: u64| (job.progress)("merge", d, t);
        merge(
            &space, graph, m.medoid, &deleted, &inserted, &params, &gp, job.cancel,
        )
    })?;
    let graph_seconds = tg.elapsed().as_secs_f64();
    let steps = merged.seconds;

    // 3. Compaction of the rows and the ids.
    let n_new = merged.kept.len();
    let mut data: Vec<T> = Vec::with_capacity(n_new * dim);
    let mut ids: Vec<u64> = Vec::with_capacity(n_new);
    for &old in &merged.kept {
        let o = old as usize;
        data.extend_from_slice(&rows[o * dim..(o + 1) * dim]);
        ids.push(if o < n_old {
            g.external(old) as u64
        } else {
            job.insert_ids[o - n_old]
        });
    }
    drop(rows);
    let data = Matrix::from_vec(data, n_new, dim)?;
    let pq = match coding {
        Some(_) => None,
        None => pool.install(|| carried_pq(dir, m, &merged.kept, &data))?,
    };

    // 4. Every other phase of a build, into a staging directory.
    let tw = Instant::now();
    let mut opts = options_of(m);
    opts.threads = Some(threads);
    let facts = DataFacts {
        n: n_new,
        dim,
        dtype: T::DTYPE,
    };
    let mut plan = crate::planner::plan_build(&opts, &facts)?.plan;
    plan.pq_selection = None;
    plan.code_selection = None;
    plan.layout = m.layout.kind;
    let staging = Staging::begin(dir, true, &crate::io::files::is_index, &[])?;
    let no_progress = |_: &str, _: u64, _: u64| {};
    let bjob = BuildJob {
        ids: Some(&ids),
        overwrite: true,
        inputs: &[],
        progress: &no_progress,
        cancel: job.cancel,
    };
    let built = BuiltGraph {
        graph: merged.graph,
        medoid: merged.start,
        shards: 1,
    };
    let pq_kept = pq.is_some();
    let mut manifest =
        crate::build::run_merged(data, coding, built, pq, staging.path(), &plan, &bjob)?;
    manifest.wal_sequence = job.wal_sequence;
    manifest.next_auto_id = job.next_auto_id;
    write_manifest(staging.path(), &manifest)?;
    let write_seconds = tw.elapsed().as_secs_f64();
    Ok(StagedMerge {
        staging,
        manifest,
        started: t0,
        report: MergeReport {
            seconds: t0.elapsed().as_secs_f64(),
            read_seconds,
            graph_seconds,
            consolidate_seconds: steps[0],
            insert_seconds: steps[1],
            compact_seconds: steps[2],
            pq_kept,
            write_seconds,
            deleted: job.deleted.iter().filter(|&&d| d).count(),
            inserted: n_ins,
            consolidated: merged.consolidated,
            linked_back: merged.linked_back,
            n: n_new,
        },
    })
}

/// A merge keeps the old PQ codebook (and the kept rows' codes) while the
/// vectors it was trained on stay the majority of the merged index:
/// FreshDiskANN never retrains; past half, the data have moved enough that
/// a merge retrains as a build would.
pub const PQ_RETRAIN_FRACTION: f64 = 0.5;

/// The PQ codes of the merged rows `data` (`kept[new] = old`; old rows at
/// or past `m.n` are inserts): the old codebook, the kept rows' codes
/// copied and the inserts' encoded. `None` (retrain) when the inserts are
/// more than [`PQ_RETRAIN_FRACTION`] of the result or the index holds no
/// PQ sections.
fn carried_pq<T: Element>(
    dir: &Path,
    m: &Manifest,
    kept: &[u32],
    data: &Matrix<T>,
) -> Result<Option<crate::build::GivenPq>> {
    let inserted = kept.iter().filter(|&&o| o as usize >= m.n).count();
    if !m.has(Section::PqCodebook)
        || !m.has(Section::PqCodes)
        || m.spec.pq_bytes == 0
        || inserted as f64 > PQ_RETRAIN_FRACTION * kept.len() as f64
    {
        return Ok(None);
    }
    let old = super::graph::load_pq(dir, m)?;
    let pm = old.codebook.m();
    let dim = data.dim();
    let mut codes: BigBuf<u8> = BigBuf::zeroed(kept.len() * pm);
    let rows = data.as_slice();
    codes
        .par_chunks_mut(pm)
        .zip(kept.par_iter().enumerate())
        .for_each_init(
            || vec![0f32; dim],
            |v, (code, (new, &o))| {
                let o = o as usize;
                if o < m.n {
                    code.copy_from_slice(&old.codes[o * pm..(o + 1) * pm]);
                } else {
                    for (x, r) in v.iter_mut().zip(&rows[new * dim..(new + 1) * dim]) {
                        *x = r.to_f32();
                    }
                    old.codebook.encode(v, code);
                }
            },
        );
    Ok(Some(crate::build::GivenPq {
        codebook: old.codebook,
        codes,
    }))
}

/// A coded layout's transform, as its sections hold it.
fn load_coding(dir: &Path, m: &Manifest) -> Result<Coding> {
    let pca = crate::format::quant::decode_pca(
        &section_path(dir, m, Section::Pca),
        &read_section(dir, m, Section::Pca)?,
    )?;
    let rabitq = crate::format::quant::decode_rabitq(
        &section_path(dir, m, Section::Rabitq),
        &read_section(dir, m, Section::Rabitq)?,
    )?;
    Ok(Coding {
        pca,
        rabitq,
        bits: m.layout.codes.map_or(1, |c| c.bits),
        trials: Vec::new(),
    })
}
