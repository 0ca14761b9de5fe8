//! Build phase 1: train the PQ codebook on a sample and encode every
//! vector, in streaming chunks (a mapped input is released behind us).

use super::{check_cancel, BuildPlan, Progress};
use crate::data::matrix::{Matrix, MatrixView};
use crate::distance::Metric;
use crate::elem::Element;
use crate::format::{LayoutKind, PqTrial};
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

/// How the build chooses the PQ bytes (Gorgeous' memory planning): the
/// smallest size, up to the plan's `pq_bytes`, whose ranking keeps the exact
/// 10 nearest neighbours of sample queries within its top `candidates` at a
/// mean recall of at least `1 − tolerance`. The ranking is over the whole
/// data (up to `SELECT_RANK_ROWS` rows; beyond, over an even sample with
/// `candidates` scaled to it), so a neighbour's PQ rank is what the search
/// sees; codebooks of the trial sizes are trained on `SELECT_TRAIN_ROWS`.
///
/// When `fill` is given (the largest size whose codes leave every adjacency
/// list its room in the budget) and lies above the smallest passing size,
/// the selection keeps `min(fill, fill_max_factor × smallest)` instead:
/// once every list is in memory the only reads are the refine stage's, and
/// a finer ranking needs fewer of them for the same recall (wordnet at 20%
/// of its raw bytes, every list held: 16 reads at 96 bytes, 14 at 125, for
/// recall 0.95), which the few vectors the same bytes would cache
/// (1–3% of the nodes) cannot match. The factor bounds the table lookups
/// every hop pays for it.
///
/// With an `alternative` layout (the planner's, for a layout it was not
/// asked for), the lists are checked against that layout's memory first:
/// when every list fits beside the smallest passing size there, the build
/// writes that layout and fills up to its `fill`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PqSelection {
    pub tolerance: f32,
    /// Vectors the refine stage should need to read.
    pub candidates: usize,
    /// Largest PQ size whose codes leave every adjacency list room.
    pub fill: Option<usize>,
    /// A filled size is at most this many times the smallest passing one
    /// (the planner's `PQ_FILL_MAX_FACTOR`).
    pub fill_max_factor: usize,
    /// The layout to write instead when every list fits with it.
    pub alternative: Option<LayoutAlternative>,
}

/// A layout the build writes instead of the plan's when every adjacency
/// list fits in memory with it (see [`PqSelection`]).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LayoutAlternative {
    pub layout: LayoutKind,
    /// Largest PQ size whose codes leave every adjacency list room with
    /// that layout's memory.
    pub fill: usize,
}

impl PqSelection {
    /// The PQ size kept given the `smallest` passing one (`cap`: the most
    /// the plan allows), and the layout switched to, if any.
    pub fn keep(&self, smallest: usize, cap: usize) -> (usize, Option<LayoutKind>) {
        let filled = |f: usize| {
            f.min(self.fill_max_factor.max(1) * smallest)
                .min(cap)
                .max(smallest)
        };
        if let Some(a) = self.alternative {
            if smallest <= a.fill {
                return (filled(a.fill), Some(a.layout));
            }
        }
        match self.fill {
            Some(f) if f > smallest => (filled(f), None),
            _ => (smallest, None),
        }
    }
}

/// Rows the trial codebooks are trained on.
const SELECT_TRAIN_ROWS: usize = 20_000;
/// Most rows the trial rankings cover.
const SELECT_RANK_ROWS: usize = 250_000;
/// Sample queries (rows of the data, each left out of its own ranking).
const SELECT_QUERIES: usize = 200;
/// Neighbours whose recall the selection measures.
const SELECT_K: usize = 10;
/// Rows converted and encoded per chunk of the ranking pass.
const SELECT_CHUNK: usize = 8192;
/// Fewest ranked rows a ranking sample measures on (fewer: no measurement).
const MIN_RANK_ROWS: usize = 2_000;
/// Candidates a query's exact-neighbour scan keeps before it trims them to
/// the nearest `SELECT_K`.
const TRUTH_KEEP: usize = 64;

/// Bytes a ranking sample of `rows` ranked rows and `train` training rows
/// of dimension `dim` holds at most while it measures codes of up to `m`
/// bytes on `threads` threads: the training and query rows as f32, a chunk
/// of rows being converted, the ranked rows' ids and codes, the queries'
/// neighbour scans, and each thread's ranking of every row with its lookup
/// table.
fn ranking_bytes(rows: usize, train: usize, dim: usize, m: usize, threads: usize) -> u64 {
    let (rows, train, dim, m) = (rows as u64, train as u64, dim as u64, m as u64);
    let queries = SELECT_QUERIES as u64;
    let f32s = (train + queries + (SELECT_CHUNK as u64).min(rows)) * dim * 4;
    let ranked = rows * (8 + m);
    let scans = queries * TRUTH_KEEP as u64 * 16 * 2;
    let per_thread = threads.max(1) as u64 * (rows * 16 + m * PQ_CENTROIDS as u64 * 4);
    f32s + ranked + scans + per_thread
}

/// The (ranked rows, training rows) of a ranking sample over `n` rows that
/// holds at most `max_bytes` measuring codes of up to `m` bytes: up to
/// 250,000 and 20,000, halved together until they fit; `None` when fewer
/// than 2,000 ranked rows would.
fn ranking_shape(n: usize, dim: usize, m: usize, max_bytes: u64) -> Option<(usize, usize)> {
    let threads = rayon::current_num_threads();
    let mut rows = n.min(SELECT_RANK_ROWS);
    let mut train = SELECT_TRAIN_ROWS.min(rows);
    while ranking_bytes(rows, train, dim, m, threads) > max_bytes {
        if rows / 2 < MIN_RANK_ROWS.min(n) {
            return None;
        }
        rows /= 2;
        train = (train / 2).max(1);
    }
    Some((rows, train))
}

/// What the PQ phase produced.
pub struct PqOutput {
    pub codebook: PqCodebook,
    /// `n × m` codes.
    pub codes: BigBuf<u8>,
    /// The sizes tried, when the plan asks the build to choose.
    pub trials: Vec<PqTrial>,
    /// The layout the selection switched to (see
    /// [`PqSelection::alternative`]), if it did.
    pub layout: Option<LayoutKind>,
}

/// Trains the codebook and encodes `data` (choosing the PQ bytes first
/// when the plan asks the build to).
pub fn run<T: Element>(
    data: &Matrix<T>,
    plan: &BuildPlan,
    build_budget: u64,
    progress: Progress<'_>,
    cancel: &AtomicBool,
) -> Result<PqOutput> {
    let (n, dim) = (data.n(), data.dim());
    progress("pq", 0, n as u64);
    let (m, trials, layout) = match plan.pq_selection {
        Some(sel) => {
            let (smallest, trials) = select(data, plan, sel, cancel)?;
            let (m, layout) = sel.keep(smallest, plan.pq_bytes);
            (m, trials, layout)
        }
        None => (plan.pq_bytes, Vec::new(), None),
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
    Ok(PqOutput {
        codebook,
        codes,
        trials,
        layout,
    })
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

/// Rows `start..end` of `data` (or of the rows `ids` names) as f32.
fn rows_f32<T: Element>(
    data: &Matrix<T>,
    ids: Option<&[usize]>,
    start: usize,
    end: usize,
    out: &mut Vec<f32>,
) {
    out.clear();
    for i in start..end {
        let r = ids.map_or(i, |ids| ids[i]);
        out.extend(data.row(r).iter().map(|x| x.to_f32()));
    }
}

/// Sample queries and their exact 10 nearest neighbours among the ranked
/// rows, for measuring how well PQ codes of a given size rank the data.
struct RankingSample {
    /// The ranked rows: all of them (`None`), or an even sample of a large set.
    rank_ids: Option<Vec<usize>>,
    rows: usize,
    /// Rows the trial codebooks are trained on, as f32.
    train: Vec<f32>,
    /// Query rows (indexes among the ranked rows), each left out of its own ranking.
    queries: Vec<usize>,
    qvecs: Vec<f32>,
    truth: Vec<Vec<usize>>,
}

impl RankingSample {
    /// A sample of `rank_rows` ranked rows (all of them when that is the
    /// data's size) and `train_rows` training rows (see [`ranking_shape`]).
    /// `None` when the data is too small to hold one query and its
    /// neighbours.
    fn new<T: Element>(
        data: &Matrix<T>,
        metric: Metric,
        seed: u64,
        (rank_rows, train_rows): (usize, usize),
        cancel: &AtomicBool,
    ) -> Result<Option<Self>> {
        use rayon::prelude::*;
        let (n, dim) = (data.n(), data.dim());
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x5051_5f53_454c_4543);
        let rank_ids: Option<Vec<usize>> = (n > rank_rows).then(|| {
            let mut v = sample(&mut rng, n, rank_rows).into_vec();
            v.sort_unstable();
            v
        });
        let rows = rank_ids.as_ref().map_or(n, Vec::len);
        let nq = SELECT_QUERIES.min(rows.saturating_sub(SELECT_K + 1));
        if nq == 0 {
            return Ok(None);
        }
        let row_of = |i: usize| rank_ids.as_ref().map_or(i, |ids| ids[i]);
        let train_rows = train_rows.clamp(1, rows);
        let mut train_idx: Vec<usize> = sample(&mut rng, rows, train_rows).into_vec();
        train_idx.sort_unstable();
        let train: Vec<f32> = train_idx
            .iter()
            .flat_map(|&i| data.row(row_of(i)).iter().map(|x| x.to_f32()))
            .collect();
        let queries: Vec<usize> = (0..nq).map(|i| i * rows / nq).collect();
        let qvecs: Vec<f32> = queries
            .iter()
            .flat_map(|&i| data.row(row_of(i)).iter().map(|x| x.to_f32()))
            .collect();
        // Exact 10 nearest of each query among the ranked rows, in chunks.
        let mut truth: Vec<Vec<(f32, usize)>> = vec![Vec::new(); nq];
        let mut buf = Vec::with_capacity(SELECT_CHUNK * dim);
        for start in (0..rows).step_by(SELECT_CHUNK) {
            check_cancel(cancel)?;
            let end = (start + SELECT_CHUNK).min(rows);
            rows_f32(data, rank_ids.as_deref(), start, end, &mut buf);
            truth.par_iter_mut().enumerate().for_each(|(qi, best)| {
                let q = &qvecs[qi * dim..(qi + 1) * dim];
                for (j, row) in buf.chunks_exact(dim).enumerate() {
                    if start + j != queries[qi] {
                        best.push((metric.distance(q, row), start + j));
                    }
                    if best.len() >= TRUTH_KEEP {
                        best.select_nth_unstable_by(SELECT_K - 1, |a, b| a.0.total_cmp(&b.0));
                        best.truncate(SELECT_K);
                    }
                }
                if best.len() > SELECT_K {
                    best.select_nth_unstable_by(SELECT_K - 1, |a, b| a.0.total_cmp(&b.0));
                    best.truncate(SELECT_K);
                }
            });
        }
        let truth = truth
            .into_iter()
            .map(|t| t.into_iter().map(|x| x.1).collect())
            .collect();
        Ok(Some(RankingSample {
            rank_ids,
            rows,
            train,
            queries,
            qvecs,
            truth,
        }))
    }

    /// Mean fraction of each query's exact 10 nearest neighbours that PQ
    /// codes of `m` bytes (a codebook trained on the sample) rank within
    /// their top `c` of the ranked rows.
    fn recall<T: Element>(
        &self,
        data: &Matrix<T>,
        m: usize,
        c: usize,
        metric: Metric,
        seed: u64,
        cancel: &AtomicBool,
    ) -> Result<f64> {
        use rayon::prelude::*;
        let (rows, dim) = (self.rows, data.dim());
        let c = c.clamp(1, rows - 1);
        let cb = PqCodebook::train_cancellable(&self.train, dim, m, metric, seed, cancel)?;
        let m = cb.m();
        let mut codes = Vec::with_capacity(rows * m);
        let mut buf = Vec::with_capacity(SELECT_CHUNK * dim);
        for start in (0..rows).step_by(SELECT_CHUNK) {
            check_cancel(cancel)?;
            let end = (start + SELECT_CHUNK).min(rows);
            rows_f32(data, self.rank_ids.as_deref(), start, end, &mut buf);
            codes.extend(cb.encode_all(MatrixView::new(&buf, end - start, dim)?));
        }
        let hits: usize = self
            .queries
            .par_iter()
            .enumerate()
            .map(|(qi, &own)| {
                let mut table = vec![0f32; m * PQ_CENTROIDS];
                cb.lookup_table(&self.qvecs[qi * dim..(qi + 1) * dim], metric, &mut table);
                let mut d: Vec<(f32, usize)> = (0..rows)
                    .filter(|&j| j != own)
                    .map(|j| (adc(&table, &codes[j * m..(j + 1) * m]), j))
                    .collect();
                d.select_nth_unstable_by(c - 1, |a, b| a.0.total_cmp(&b.0));
                let top: std::collections::HashSet<usize> = d[..c].iter().map(|x| x.1).collect();
                self.truth[qi].iter().filter(|j| top.contains(j)).count()
            })
            .sum();
        Ok(hits as f64 / self.truth.iter().map(Vec::len).sum::<usize>().max(1) as f64)
    }
}

/// How well PQ codes of `m` bytes rank `data`: the mean fraction of 200
/// sample rows' exact 10 nearest neighbours that the codes' own ranking
/// puts in its top 10 (PQ recall@10, over the data or an even sample of
/// up to 250,000 rows; the codebook trained on 20,000), holding at most
/// `max_bytes` (a smaller sample where the defaults would hold more; see
/// [`ranking_shape`]). `None` when the data is too small to measure it or
/// `max_bytes` too small to hold a sample of 2,000 rows. What
/// `preset="auto"` asks before it trusts PQ codes in RAM to steer a search
/// (`planner::auto`).
pub fn ranking_recall<T: Element>(
    data: &Matrix<T>,
    m: usize,
    metric: Metric,
    seed: u64,
    max_bytes: u64,
    cancel: &AtomicBool,
) -> Result<Option<f64>> {
    let Some(shape) = ranking_shape(data.n(), data.dim(), m, max_bytes) else {
        return Ok(None);
    };
    let Some(s) = RankingSample::new(data, metric, seed, shape, cancel)? else {
        return Ok(None);
    };
    let r = s.recall(data, m, SELECT_K, metric, seed, cancel)?;
    data.release_rows(0, data.n());
    Ok(Some(r))
}

/// Chooses the PQ bytes (see [`PqSelection`]).
fn select<T: Element>(
    data: &Matrix<T>,
    plan: &BuildPlan,
    sel: PqSelection,
    cancel: &AtomicBool,
) -> Result<(usize, Vec<PqTrial>)> {
    let n = data.n();
    // Half the build budget, as the training sample takes.
    let max_bytes = plan.build_memory_budget.map_or(u64::MAX, |b| b / 2);
    let Some(shape) = ranking_shape(n, data.dim(), plan.pq_bytes, max_bytes) else {
        return Ok((plan.pq_bytes, Vec::new()));
    };
    let Some(s) = RankingSample::new(data, plan.metric, plan.seed, shape, cancel)? else {
        return Ok((plan.pq_bytes, Vec::new()));
    };
    // The candidates at the ranked set's density.
    let c = ((sel.candidates as f64 * s.rows as f64 / n as f64).round() as usize)
        .max(SELECT_K)
        .min(s.rows - 1);
    let mut trials = Vec::new();
    for &m in &select_sizes(data.dim(), plan.pq_bytes) {
        check_cancel(cancel)?;
        let recall = s.recall(data, m, c, plan.metric, plan.seed, cancel)?;
        trials.push(PqTrial {
            pq_bytes: m,
            recall,
            candidates: c,
        });
        if recall >= 1.0 - sel.tolerance as f64 {
            data.release_rows(0, n);
            return Ok((m, trials));
        }
    }
    data.release_rows(0, n);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::test_data::clustered;

    /// PQ recall@10 is a share in [0, 1], finer codes rank better, codes of
    /// one byte a dimension nearly exactly, and data too small to hold a
    /// query and its neighbours gives no measure.
    #[test]
    fn ranking_recall_grows_with_the_code_size() {
        let (n, dim) = (3000, 16);
        let data = Matrix::from_vec(clustered(n, dim, 3), n, dim).unwrap();
        let cancel = AtomicBool::new(false);
        let at = |m: usize| {
            ranking_recall(&data, m, Metric::L2, 7, u64::MAX, &cancel)
                .unwrap()
                .unwrap()
        };
        let (coarse, fine) = (at(1), at(16));
        assert!((0.0..=1.0).contains(&coarse) && (0.0..=1.0).contains(&fine));
        assert!(coarse < 0.5, "{coarse}");
        assert!(fine > 0.9 && fine > coarse, "{coarse} {fine}");
        let tiny = Matrix::from_vec(clustered(8, dim, 3), 8, dim).unwrap();
        assert_eq!(
            ranking_recall(&tiny, 4, Metric::L2, 7, u64::MAX, &cancel).unwrap(),
            None
        );
    }

    /// The ranking sample holds what it is given: the defaults where they
    /// fit, both sizes halved where they do not, no sample where 2,000
    /// ranked rows do not fit.
    #[test]
    fn a_ranking_sample_holds_at_most_its_bytes() {
        let threads = rayon::current_num_threads();
        let (dim, m) = (384, 64);
        let full = ranking_shape(1_000_000, dim, m, u64::MAX).unwrap();
        assert_eq!(full, (SELECT_RANK_ROWS, SELECT_TRAIN_ROWS));
        let need = ranking_bytes(full.0, full.1, dim, m, threads);
        let (rows, train) = ranking_shape(1_000_000, dim, m, need / 3).unwrap();
        assert!(rows < full.0 && train < full.1, "{rows} {train}");
        assert!(ranking_bytes(rows, train, dim, m, threads) <= need / 3);
        assert_eq!(ranking_shape(1_000_000, dim, m, 1 << 20), None);
        // Small data: every row ranked, within the bytes.
        assert_eq!(ranking_shape(3000, 16, 8, 64 << 20), Some((3000, 3000)));
        // A measurement within a small budget still ranks (fewer rows).
        let (n, dim) = (6000, 16);
        let data = Matrix::from_vec(clustered(n, dim, 3), n, dim).unwrap();
        let cancel = AtomicBool::new(false);
        let small = ranking_bytes(3000, 3000, dim, 16, threads);
        let r = ranking_recall(&data, 16, Metric::L2, 7, small, &cancel)
            .unwrap()
            .unwrap();
        assert!(r > 0.9, "{r}");
        assert_eq!(
            ranking_recall(&data, 16, Metric::L2, 7, 4096, &cancel).unwrap(),
            None
        );
    }
}
