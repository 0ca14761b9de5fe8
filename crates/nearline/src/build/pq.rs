//! Build phase 1: train the PQ codebook on a sample and encode every
//! vector, in streaming chunks (a mapped input is released behind us).

use super::{check_cancel, BuildPlan, Progress};
use crate::data::matrix::{Matrix, MatrixView};
use crate::distance::Metric;
use crate::elem::Element;
use crate::quant::pq::PqCodebook;
use crate::util::BigBuf;
use crate::Result;
use rand::seq::index::sample;
use rand::SeedableRng;
use std::sync::atomic::AtomicBool;

/// Rows sampled to train PQ (DiskANN samples up to 256K points).
pub const PQ_TRAIN_SAMPLE: usize = 256_000;

/// Rows encoded per chunk.
const CHUNK: usize = 65_536;

/// Trains the codebook and encodes `data`: the codebook and `n × m` codes.
pub fn run<T: Element>(
    data: &Matrix<T>,
    plan: &BuildPlan,
    build_budget: u64,
    progress: Progress<'_>,
    cancel: &AtomicBool,
) -> Result<(PqCodebook, BigBuf<u8>)> {
    let (n, dim, m) = (data.n(), data.dim(), plan.pq_bytes);
    progress("pq", 0, n as u64);
    let sample_rows = sample_rows(n, dim, build_budget);
    let codebook = train(data, m, plan.metric, plan.seed, sample_rows, cancel)?;
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
    Ok((codebook, codes))
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
