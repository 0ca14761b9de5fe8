//! Build phase 1: train the PQ codebook on a sample and encode every
//! vector, in streaming chunks (a mapped input is released behind us).

use super::{check_cancel, BuildPlan, Progress};
use crate::data::matrix::{Matrix, MatrixView};
use crate::distance::Metric;
use crate::elem::Element;
use crate::format::PqTrial;
use crate::quant::pq::{adc, PqCodebook, PQ_CENTROIDS};
use crate::util::BigBuf;
use crate::Result;
use rand::seq::index::sample;
use rand::SeedableRng;
use std::sync::atomic::AtomicBool;

/// Rows sampled to train PQ (DiskANN samples up to 256K points).
pub const PQ_TRAIN_SAMPLE: usize = 256_000;

/// Rows encoded per chunk.
const CHUNK: usize = 65_536;

/// How the build chooses the PQ bytes from a sample (Gorgeous' memory
/// planning): the smallest size, up to the plan's `pq_bytes`, whose
/// ranking keeps the exact 10 nearest neighbours of sample queries within
/// its top `candidates` at a mean recall of at least `1 − tolerance`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PqSelection {
    pub tolerance: f32,
    /// The refine stage's candidates at the default L.
    pub candidates: usize,
}

/// Rows of the selection's sample, and queries among them.
const SELECT_ROWS: usize = 20_000;
const SELECT_QUERIES: usize = 200;
/// Neighbours whose recall the selection measures.
const SELECT_K: usize = 10;

/// Trains the codebook and encodes `data`: the codebook, `n × m` codes
/// and, when the plan asks the build to choose the PQ bytes, the trials.
pub fn run<T: Element>(
    data: &Matrix<T>,
    plan: &BuildPlan,
    build_budget: u64,
    progress: Progress<'_>,
    cancel: &AtomicBool,
) -> Result<(PqCodebook, BigBuf<u8>, Vec<PqTrial>)> {
    let (n, dim) = (data.n(), data.dim());
    progress("pq", 0, n as u64);
    let (m, trials) = match plan.pq_selection {
        Some(sel) => select(data, plan, sel, cancel)?,
        None => (plan.pq_bytes, Vec::new()),
    };
    let sample_rows = sample_rows(n, dim, build_budget);
    let codebook = train(data, m, plan.metric, plan.seed, sample_rows, cancel)?;
    let m = codebook.m();
    crate::util::return_freed_memory();
    let mut codes: BigBuf<u8> = BigBuf::zeroed(n * m);
    for start in (0..n).step_by(CHUNK) {
        check_cancel(cancel)?;
        let end = (start + CHUNK).min(n);
        let view = MatrixView::new(&data.as_slice()[start * dim..end * dim], end - start, dim)?;
        let c = codebook.encode_all(view);
        codes[start * m..end * m].copy_from_slice(&c);
        data.release_rows(start, end);
        progress("pq", end as u64, n as u64);
    }
    Ok((codebook, codes, trials))
}

/// The PQ sizes the selection tries, ascending: dim/32, dim/16, … up to
/// `cap` (and `cap` itself), at least 4 bytes (or `cap`).
fn select_sizes(dim: usize, cap: usize) -> Vec<usize> {
    let mut v: Vec<usize> = [32, 16, 8, 4, 2, 1]
        .iter()
        .map(|d| (dim / d).max(4).min(cap))
        .collect();
    v.push(cap);
    v.sort_unstable();
    v.dedup();
    v
}

/// Chooses the PQ bytes on a sample (see [`PqSelection`]).
fn select<T: Element>(
    data: &Matrix<T>,
    plan: &BuildPlan,
    sel: PqSelection,
    cancel: &AtomicBool,
) -> Result<(usize, Vec<PqTrial>)> {
    use rayon::prelude::*;
    let (n, dim) = (data.n(), data.dim());
    let metric = plan.metric;
    let rows = SELECT_ROWS.min(n);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(plan.seed ^ 0x5051_5f53_454c_4543);
    let mut idx: Vec<usize> = sample(&mut rng, n, rows).into_vec();
    idx.sort_unstable();
    let mut base = vec![0f32; rows * dim];
    for (j, &r) in idx.iter().enumerate() {
        for (o, x) in base[j * dim..(j + 1) * dim].iter_mut().zip(data.row(r)) {
            *o = x.to_f32();
        }
    }
    data.release_rows(0, n);
    let nq = SELECT_QUERIES.min(rows.saturating_sub(SELECT_K + 1));
    if nq == 0 {
        return Ok((plan.pq_bytes, Vec::new()));
    }
    // Queries are sample rows spread over the sample; each is left out of
    // its own ranking.
    let queries: Vec<usize> = (0..nq).map(|i| i * rows / nq).collect();
    let truth: Vec<Vec<usize>> = queries
        .par_iter()
        .map(|&qi| {
            let q = &base[qi * dim..(qi + 1) * dim];
            let mut d: Vec<(f32, usize)> = (0..rows)
                .filter(|&j| j != qi)
                .map(|j| (metric.distance(q, &base[j * dim..(j + 1) * dim]), j))
                .collect();
            let k = SELECT_K.min(d.len());
            d.select_nth_unstable_by(k - 1, |a, b| a.0.total_cmp(&b.0));
            d[..k].iter().map(|x| x.1).collect()
        })
        .collect();
    let view = MatrixView::new(&base, rows, dim)?;
    let mut trials = Vec::new();
    let sizes = select_sizes(dim, plan.pq_bytes);
    for &m in &sizes {
        check_cancel(cancel)?;
        let cb = PqCodebook::train_cancellable(&base, dim, m, metric, plan.seed, cancel)?;
        let codes = cb.encode_all(view);
        let c = sel.candidates.max(SELECT_K).min(rows - 1);
        let hits: usize = queries
            .par_iter()
            .zip(&truth)
            .map(|(&qi, t)| {
                let mut table = vec![0f32; m * PQ_CENTROIDS];
                cb.lookup_table(&base[qi * dim..(qi + 1) * dim], metric, &mut table);
                let mut d: Vec<(f32, usize)> = (0..rows)
                    .filter(|&j| j != qi)
                    .map(|j| (adc(&table, &codes[j * m..(j + 1) * m]), j))
                    .collect();
                d.select_nth_unstable_by(c - 1, |a, b| a.0.total_cmp(&b.0));
                let top: std::collections::HashSet<usize> = d[..c].iter().map(|x| x.1).collect();
                t.iter().filter(|j| top.contains(j)).count()
            })
            .sum();
        let recall = hits as f64 / truth.iter().map(Vec::len).sum::<usize>().max(1) as f64;
        trials.push(PqTrial {
            pq_bytes: m,
            recall,
            candidates: c,
        });
        if recall >= 1.0 - sel.tolerance as f64 {
            return Ok((m, trials));
        }
    }
    // None within tolerance: the largest the budget allows.
    Ok((plan.pq_bytes, trials))
}

/// Rows of the PQ training sample: DiskANN's 256K, fewer when half the build
/// budget cannot hold them as f32 (k-means scratch takes the other half).
fn sample_rows(n: usize, dim: usize, build_budget: u64) -> usize {
    let by_budget = (build_budget / 2 / (dim as u64 * 4).max(1)).min(usize::MAX as u64) as usize;
    n.min(PQ_TRAIN_SAMPLE).min(by_budget.max(1024))
}

fn train<T: Element>(
    data: &Matrix<T>,
    m: usize,
    metric: Metric,
    seed: u64,
    max_rows: usize,
    cancel: &AtomicBool,
) -> Result<PqCodebook> {
    let n = data.n();
    let dim = data.dim();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x5051_5f54_5241_494e);
    let take = max_rows.min(n);
    let mut rows: Vec<usize> = if n <= take {
        (0..n).collect()
    } else {
        sample(&mut rng, n, take).into_vec()
    };
    rows.sort_unstable();
    let mut sample_f: BigBuf<f32> = BigBuf::zeroed(rows.len() * dim);
    let mut released = 0;
    for (j, &r) in rows.iter().enumerate() {
        for (o, x) in sample_f[j * dim..(j + 1) * dim].iter_mut().zip(data.row(r)) {
            *o = x.to_f32();
        }
        // Rows are visited in order: drop mapped pages behind us as we go.
        if r >= released + 8192 {
            data.release_rows(released, r);
            released = r;
            check_cancel(cancel)?;
        }
    }
    data.release_rows(0, n);
    PqCodebook::train_cancellable(&sample_f, dim, m, metric, seed, cancel)
}
