//! Exact k-nearest-neighbour ground truth, multi-threaded and SIMD.
//!
//! The computation is blocked: a group of queries (small enough to stay in
//! L1/L2) is compared against a block of base rows (small enough to stay in
//! L2) before moving on, so each base block is read from memory once per query
//! group rather than once per query. Every query keeps a bounded top-`k` as a
//! max-heap of packed `(distance, id)` keys; the keys are totally ordered, so
//! the result does not depend on how the work was split across threads.

use crate::data::dtype::Element;
use crate::data::files::GroundTruth;
use crate::data::matrix::MatrixView;
use crate::distance::Metric;
use crate::{Error, Result};
use rayon::prelude::*;
use std::collections::BinaryHeap;

/// Maps an f32 to a u32 whose unsigned order is `f32::total_cmp`'s order.
#[inline]
fn f32_key(d: f32) -> u32 {
    let b = d.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// Inverse of [`f32_key`].
#[inline]
fn key_f32(k: u32) -> f32 {
    if k & 0x8000_0000 != 0 {
        f32::from_bits(k & 0x7fff_ffff)
    } else {
        f32::from_bits(!k)
    }
}

/// Packs `(distance, id)` so that u64 order is "closer first, then smaller id".
#[inline]
fn pack(d: f32, id: u32) -> u64 {
    ((f32_key(d) as u64) << 32) | id as u64
}

/// A bounded set of the `k` smallest packed keys seen so far.
struct TopK {
    k: usize,
    heap: BinaryHeap<u64>,
    /// The largest kept key once full; `u64::MAX` before.
    worst: u64,
}

impl TopK {
    fn new(k: usize) -> Self {
        TopK {
            k,
            heap: BinaryHeap::with_capacity(k + 1),
            worst: u64::MAX,
        }
    }
    #[inline]
    fn push(&mut self, key: u64) {
        if key >= self.worst {
            return;
        }
        self.heap.push(key);
        if self.heap.len() > self.k {
            self.heap.pop();
        }
        if self.heap.len() == self.k {
            self.worst = self.heap.peek().copied().unwrap_or(u64::MAX);
        }
    }
    fn merge(&mut self, other: TopK) {
        for key in other.heap {
            self.push(key);
        }
    }
}

/// Bytes of base rows per cache block.
const BASE_BLOCK_BYTES: usize = 192 << 10;
/// Bytes of query rows per query group.
const QUERY_GROUP_BYTES: usize = 32 << 10;
/// Fewest base rows a parallel base chunk gets when the base is split.
const MIN_BASE_CHUNK_ROWS: usize = 4096;

/// Exact top-`k` neighbours of every query in `base` under `metric`, ties
/// broken by smaller id. Runs on the caller's current rayon pool; the result
/// is independent of the number of threads.
///
/// Distances are user-facing ([`Metric::to_user`]): squared L2, inner product,
/// or cosine similarity. For cosine the inputs need not be normalised: the
/// similarity is `dot(a, b) / (|a| |b|)`, and 0 when either vector is zero.
pub fn compute_ground_truth<T: Element>(
    base: MatrixView<'_, T>,
    queries: MatrixView<'_, T>,
    k: usize,
    metric: Metric,
) -> Result<GroundTruth> {
    if base.dim() != queries.dim() {
        return Err(Error::arg(format!(
            "ground truth: queries have dimension {}, base vectors have dimension {}",
            queries.dim(),
            base.dim()
        )));
    }
    if k == 0 {
        return Err(Error::arg("ground truth: k must be at least 1"));
    }
    if k > base.n() {
        return Err(Error::arg(format!(
            "ground truth: k={k} is larger than the number of base vectors ({})",
            base.n()
        )));
    }
    if base.n() > u32::MAX as usize + 1 {
        return Err(Error::arg(format!(
            "ground truth: {} base vectors do not fit 32-bit ids",
            base.n()
        )));
    }
    let nq = queries.n();
    if nq == 0 {
        return Ok(GroundTruth {
            n: 0,
            k,
            ids: Vec::new(),
            distances: Vec::new(),
        });
    }
    let dim = base.dim();
    let row_bytes = dim * std::mem::size_of::<T>();

    // Cosine: per-vector norms, so unnormalised data works.
    let norms = |m: MatrixView<'_, T>| -> Vec<f32> {
        (0..m.n())
            .into_par_iter()
            .map(|i| {
                let r = m.row(i);
                T::dot(r, r).sqrt()
            })
            .collect()
    };
    let (base_norms, query_norms) = if metric == Metric::Cosine {
        (norms(base), norms(queries))
    } else {
        (Vec::new(), Vec::new())
    };

    let group = (QUERY_GROUP_BYTES / row_bytes).clamp(4, 256).min(nq);
    let block = (BASE_BLOCK_BYTES / row_bytes).clamp(64, 16384);
    let n_groups = nq.div_ceil(group);
    // Split the base too when there are too few query groups to feed every
    // thread; the merge is exact because the top-k order is total.
    let want_tasks = 4 * rayon::current_num_threads();
    let n_chunks = if n_groups >= want_tasks {
        1
    } else {
        want_tasks
            .div_ceil(n_groups)
            .min(base.n().div_ceil(MIN_BASE_CHUNK_ROWS))
            .max(1)
    };
    let chunk_rows = base.n().div_ceil(n_chunks);
    let n_chunks = base.n().div_ceil(chunk_rows);

    let ctx = Ctx {
        base,
        queries,
        metric,
        base_norms: &base_norms,
        query_norms: &query_norms,
        k,
        block,
    };

    let per_group: Vec<Vec<TopK>> = (0..n_groups)
        .into_par_iter()
        .map(|g| {
            let q0 = g * group;
            let q1 = (q0 + group).min(nq);
            (0..n_chunks)
                .into_par_iter()
                .map(|c| {
                    let b0 = c * chunk_rows;
                    let b1 = (b0 + chunk_rows).min(base.n());
                    ctx.scan(q0, q1, b0, b1)
                })
                .reduce_with(|mut a, b| {
                    for (x, y) in a.iter_mut().zip(b) {
                        x.merge(y);
                    }
                    a
                })
                .unwrap_or_default()
        })
        .collect();

    let mut ids = Vec::with_capacity(nq * k);
    let mut distances = Vec::with_capacity(nq * k);
    for top in per_group.into_iter().flatten() {
        for key in top.heap.into_sorted_vec() {
            ids.push(key as u32);
            distances.push(metric.to_user(key_f32((key >> 32) as u32)));
        }
    }
    debug_assert_eq!(ids.len(), nq * k);
    Ok(GroundTruth {
        n: nq,
        k,
        ids,
        distances,
    })
}

struct Ctx<'a, T: Element> {
    base: MatrixView<'a, T>,
    queries: MatrixView<'a, T>,
    metric: Metric,
    base_norms: &'a [f32],
    query_norms: &'a [f32],
    k: usize,
    block: usize,
}

impl<T: Element> Ctx<'_, T> {
    /// Top-k of queries `q0..q1` over base rows `b0..b1`.
    fn scan(&self, q0: usize, q1: usize, b0: usize, b1: usize) -> Vec<TopK> {
        let mut tops: Vec<TopK> = (q0..q1).map(|_| TopK::new(self.k)).collect();
        let mut start = b0;
        while start < b1 {
            let end = (start + self.block).min(b1);
            for (qi, top) in (q0..q1).zip(tops.iter_mut()) {
                let q = self.queries.row(qi);
                match self.metric {
                    Metric::L2 => {
                        for i in start..end {
                            let d = T::l2_sq(q, self.base.row(i));
                            top.push(pack(d, i as u32));
                        }
                    }
                    Metric::InnerProduct => {
                        for i in start..end {
                            let d = -T::dot(q, self.base.row(i));
                            top.push(pack(d, i as u32));
                        }
                    }
                    Metric::Cosine => {
                        let qn = self.query_norms[qi];
                        for i in start..end {
                            let denom = qn * self.base_norms[i];
                            let sim = if denom > 0.0 {
                                T::dot(q, self.base.row(i)) / denom
                            } else {
                                0.0
                            };
                            top.push(pack(1.0 - sim, i as u32));
                        }
                    }
                }
            }
            start = end;
        }
        tops
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::dtype::DType;
    use half::f16;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Random data; integer types use a narrow range so distances tie often.
    fn random<T: Element>(n: usize, d: usize, seed: u64, spread: f32) -> Vec<T> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n * d)
            .map(|_| {
                let v: f32 = match T::DTYPE {
                    DType::F32 | DType::F16 => rng.random_range(-spread..spread),
                    DType::U8 => rng.random_range(0..=(spread as i32).min(255)) as f32,
                    DType::I8 => rng
                        .random_range(-(spread as i32).min(128)..=(spread as i32).min(127))
                        as f32,
                };
                T::from_f32(v).unwrap()
            })
            .collect()
    }

    /// The obvious algorithm: every distance, full sort by (distance, id).
    fn naive<T: Element>(
        base: MatrixView<'_, T>,
        queries: MatrixView<'_, T>,
        k: usize,
        metric: Metric,
    ) -> (Vec<u32>, Vec<f32>) {
        let norm = |r: &[T]| T::dot(r, r).sqrt();
        let mut ids = Vec::new();
        let mut dists = Vec::new();
        for q in 0..queries.n() {
            let qv = queries.row(q);
            let mut all: Vec<(f32, u32)> = (0..base.n())
                .map(|i| {
                    let b = base.row(i);
                    let d = match metric {
                        Metric::L2 => T::l2_sq(qv, b),
                        Metric::InnerProduct => -T::dot(qv, b),
                        Metric::Cosine => {
                            let den = norm(qv) * norm(b);
                            1.0 - if den > 0.0 { T::dot(qv, b) / den } else { 0.0 }
                        }
                    };
                    (d, i as u32)
                })
                .collect();
            all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            for &(d, i) in &all[..k] {
                ids.push(i);
                dists.push(metric.to_user(d));
            }
        }
        (ids, dists)
    }

    fn check<T: Element>(n: usize, nq: usize, d: usize, k: usize, spread: f32, seed: u64) {
        let base = random::<T>(n, d, seed, spread);
        let queries = random::<T>(nq, d, seed ^ 0xabcdef, spread);
        let bv = MatrixView::new(&base, n, d).unwrap();
        let qv = MatrixView::new(&queries, nq, d).unwrap();
        for metric in [Metric::L2, Metric::InnerProduct, Metric::Cosine] {
            let gt = compute_ground_truth(bv, qv, k, metric).unwrap();
            let (ids, dists) = naive(bv, qv, k, metric);
            assert_eq!((gt.n, gt.k), (nq, k));
            assert_eq!(
                gt.ids,
                ids,
                "{:?} {metric} n={n} nq={nq} d={d} k={k}",
                T::DTYPE
            );
            assert_eq!(gt.distances, dists, "{:?} {metric}", T::DTYPE);
        }
    }

    #[test]
    fn matches_naive_every_dtype_and_metric() {
        check::<f32>(700, 23, 16, 10, 1.0, 1);
        check::<f16>(500, 9, 12, 7, 2.0, 2);
        check::<u8>(900, 17, 8, 25, 255.0, 3);
        check::<i8>(900, 17, 8, 25, 127.0, 4);
    }

    #[test]
    fn ties_broken_by_smaller_id() {
        // Values in {0, 1, 2} on 3 dimensions: massive ties everywhere.
        check::<u8>(2000, 40, 3, 50, 2.0, 5);
        check::<i8>(2000, 40, 3, 50, 1.0, 6);
        // Every base vector identical: ids must be 0..k in order.
        let base = vec![1.5f32; 300 * 4];
        let q = vec![0.0f32, 1.0, 2.0, 3.0];
        for metric in [Metric::L2, Metric::InnerProduct, Metric::Cosine] {
            let gt = compute_ground_truth(
                MatrixView::new(&base, 300, 4).unwrap(),
                MatrixView::new(&q, 1, 4).unwrap(),
                20,
                metric,
            )
            .unwrap();
            assert_eq!(gt.ids, (0..20).collect::<Vec<u32>>(), "{metric}");
        }
    }

    #[test]
    fn independent_of_thread_count_and_splitting() {
        // Few queries (the base is split across tasks) and many queries.
        let (n, d) = (20_000, 8);
        let base = random::<f32>(n, d, 9, 1.0);
        let bv = MatrixView::new(&base, n, d).unwrap();
        for nq in [1usize, 3, 600] {
            let queries = random::<f32>(nq, d, 10 + nq as u64, 1.0);
            let qv = MatrixView::new(&queries, nq, d).unwrap();
            let mut results = Vec::new();
            for threads in [1, 2, 5] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                results
                    .push(pool.install(|| compute_ground_truth(bv, qv, 16, Metric::L2).unwrap()));
            }
            assert_eq!(results[0], results[1]);
            assert_eq!(results[0], results[2]);
            if nq <= 3 {
                let (ids, dists) = naive(bv, qv, 16, Metric::L2);
                assert_eq!(results[0].ids, ids);
                assert_eq!(results[0].distances, dists);
            }
        }
    }

    #[test]
    fn user_facing_distances_sorted_best_first() {
        let (n, nq, d, k) = (400, 5, 6, 30);
        let base = random::<f32>(n, d, 11, 1.0);
        let queries = random::<f32>(nq, d, 12, 1.0);
        let bv = MatrixView::new(&base, n, d).unwrap();
        let qv = MatrixView::new(&queries, nq, d).unwrap();
        for metric in [Metric::L2, Metric::InnerProduct, Metric::Cosine] {
            let gt = compute_ground_truth(bv, qv, k, metric).unwrap();
            for q in 0..nq {
                let row = &gt.distances[q * k..(q + 1) * k];
                for w in row.windows(2) {
                    if metric.higher_is_closer() {
                        assert!(w[0] >= w[1], "{metric}: {row:?}");
                    } else {
                        assert!(w[0] <= w[1], "{metric}: {row:?}");
                    }
                }
                // The reported value is the real one for that id.
                let id = gt.ids[q * k] as usize;
                let (a, b) = (qv.row(q), bv.row(id));
                let want = match metric {
                    Metric::L2 => f32::l2_sq(a, b),
                    Metric::InnerProduct => f32::dot(a, b),
                    Metric::Cosine => {
                        f32::dot(a, b) / (f32::dot(a, a).sqrt() * f32::dot(b, b).sqrt())
                    }
                };
                assert!(
                    (row[0] - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "{metric}"
                );
                if metric == Metric::Cosine {
                    assert!(row.iter().all(|s| (-1.0001..=1.0001).contains(s)));
                }
            }
        }
    }

    #[test]
    fn cosine_does_not_need_normalised_input_and_zero_vectors_score_zero() {
        // Same directions, different lengths; row 2 is zero.
        let base = vec![10.0f32, 0.0, 0.0, 0.1, 0.0, 0.0, -3.0, 0.0];
        let q = vec![2.0f32, 0.0];
        let gt = compute_ground_truth(
            MatrixView::new(&base, 4, 2).unwrap(),
            MatrixView::new(&q, 1, 2).unwrap(),
            4,
            Metric::Cosine,
        )
        .unwrap();
        // Row 0 (parallel) = 1, rows 1 (orthogonal) and 2 (zero) = 0, row 3 = -1.
        assert_eq!(gt.ids, vec![0, 1, 2, 3]);
        assert_eq!(gt.distances, vec![1.0, 0.0, 0.0, -1.0]);
        let zq = vec![0.0f32, 0.0];
        let gt = compute_ground_truth(
            MatrixView::new(&base, 4, 2).unwrap(),
            MatrixView::new(&zq, 1, 2).unwrap(),
            2,
            Metric::Cosine,
        )
        .unwrap();
        assert_eq!(gt.ids, vec![0, 1]);
        assert_eq!(gt.distances, vec![0.0, 0.0]);
    }

    #[test]
    fn argument_errors() {
        let base = vec![0.0f32; 10 * 4];
        let bv = MatrixView::new(&base, 10, 4).unwrap();
        let q3 = vec![0.0f32; 3];
        let q4 = vec![0.0f32; 4];
        let e = compute_ground_truth(bv, MatrixView::new(&q3, 1, 3).unwrap(), 1, Metric::L2)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("dimension 3") && e.contains("dimension 4"),
            "{e}"
        );
        let q = MatrixView::new(&q4, 1, 4).unwrap();
        let e = compute_ground_truth(bv, q, 11, Metric::L2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("k=11") && e.contains("(10)"), "{e}");
        assert!(compute_ground_truth(bv, q, 0, Metric::L2).is_err());
        let gt = compute_ground_truth(bv, q, 10, Metric::L2).unwrap();
        assert_eq!(gt.ids, (0..10).collect::<Vec<u32>>());
        let empty =
            compute_ground_truth(bv, MatrixView::new(&[], 0, 4).unwrap(), 5, Metric::L2).unwrap();
        assert_eq!(
            (empty.n, empty.k, empty.ids.len(), empty.distances.len()),
            (0, 5, 0, 0)
        );
    }

    #[test]
    fn key_packing_orders_like_total_cmp() {
        let vals = [
            f32::NEG_INFINITY,
            -1e30,
            -1.0,
            -1e-30,
            -0.0,
            0.0,
            1e-30,
            0.5,
            1.0,
            1e30,
            f32::INFINITY,
        ];
        for w in vals.windows(2) {
            assert!(f32_key(w[0]) < f32_key(w[1]), "{} {}", w[0], w[1]);
        }
        for v in vals {
            assert_eq!(key_f32(f32_key(v)).to_bits(), v.to_bits());
        }
        assert!(pack(1.0, 5) < pack(1.0, 6));
        assert!(pack(1.0, u32::MAX) < pack(1.5, 0));
    }

    /// Throughput probe, not a correctness test: run with
    /// `cargo test --release -p nearline gt_throughput -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn gt_throughput() {
        let (n, nq, d, k) = (100_000, 400, 128, 100);
        let base = random::<f32>(n, d, 21, 1.0);
        let queries = random::<f32>(nq, d, 22, 1.0);
        let bv = MatrixView::new(&base, n, d).unwrap();
        let qv = MatrixView::new(&queries, nq, d).unwrap();
        for metric in [Metric::L2, Metric::InnerProduct, Metric::Cosine] {
            let t = std::time::Instant::now();
            let gt = compute_ground_truth(bv, qv, k, metric).unwrap();
            let s = t.elapsed().as_secs_f64();
            println!(
                "{metric}: {n} x {nq} x d{d}, k={k}: {s:.2} s, {:.1} M pairs/s on {} threads",
                (n * nq) as f64 / s / 1e6,
                rayon::current_num_threads()
            );
            assert_eq!(gt.ids.len(), nq * k);
        }
        // Baseline: the bare kernel over the same pairs, no blocking, no top-k.
        let t = std::time::Instant::now();
        let total: f64 = (0..nq)
            .into_par_iter()
            .map(|q| {
                (0..n)
                    .map(|i| f32::l2_sq(qv.row(q), bv.row(i)) as f64)
                    .sum::<f64>()
            })
            .sum();
        let s = t.elapsed().as_secs_f64();
        println!(
            "bare l2 kernel, same pairs: {s:.2} s, {:.1} M pairs/s ({total:.0})",
            (n * nq) as f64 / s / 1e6
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn prop_matches_naive(
            n in 1usize..300,
            nq in 0usize..12,
            d in 1usize..20,
            kfrac in 0.0f64..1.0,
            seed in any::<u64>(),
            byte in any::<bool>(),
        ) {
            let k = 1 + ((n - 1) as f64 * kfrac) as usize;
            if byte {
                check::<u8>(n, nq, d, k, 3.0, seed);
            } else {
                check::<f32>(n, nq, d, k, 1.0, seed);
            }
        }
    }
}
