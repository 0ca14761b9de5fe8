//! Exact k-nearest-neighbour and range ground truth, multi-threaded and SIMD.
//!
//! The computation is blocked: a group of queries (small enough to stay in
//! L1/L2) is compared against a block of base rows (small enough to stay in
//! L2) before moving on, so each base block is read from memory once per query
//! group rather than once per query. Every query keeps a bounded top-`k` as a
//! max-heap of packed `(distance, id)` keys; the keys are totally ordered, so
//! the result does not depend on how the work was split across threads.
//!
//! Range ground truth runs the same blocked scan with a different per-query
//! sink ([`InRange`]): every pair within the radius is kept, then each query's
//! hits are sorted by the same packed keys.

use crate::data::files::{GroundTruth, RangeGroundTruth};
use crate::data::matrix::MatrixView;
use crate::distance::Metric;
use crate::elem::Element;
use crate::{Error, Result};
use rayon::prelude::*;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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
}

/// What the blocked scan does with the pairs of one query: `offer` sees every
/// internal distance of that query against the scanned base rows.
trait Sink: Send {
    fn offer(&mut self, d: f32, id: u32);
    /// Folds in the sink of the same query over another base chunk.
    fn merge(&mut self, other: Self);
    /// Pairs held (bounds the memory of range scans).
    fn held(&self) -> usize;
}

impl Sink for TopK {
    #[inline]
    fn offer(&mut self, d: f32, id: u32) {
        self.push(pack(d, id));
    }
    fn merge(&mut self, other: TopK) {
        for key in other.heap {
            self.push(key);
        }
    }
    fn held(&self) -> usize {
        self.heap.len()
    }
}

/// Every pair whose user-facing value is within the radius: squared L2
/// distance `<= radius`, inner product or cosine similarity `>= radius`.
///
/// The test is on [`Metric::to_user`] of the internal distance, the value the
/// ground truth reports, so a reported distance and its membership agree.
struct InRange {
    metric: Metric,
    radius: f32,
    keys: Vec<u64>,
}

impl InRange {
    #[inline]
    fn within(&self, d: f32) -> bool {
        let u = self.metric.to_user(d);
        match self.metric {
            Metric::L2 => u <= self.radius,
            Metric::InnerProduct | Metric::Cosine => u >= self.radius,
        }
    }
}

impl Sink for InRange {
    #[inline]
    fn offer(&mut self, d: f32, id: u32) {
        if self.within(d) {
            self.keys.push(pack(d, id));
        }
    }
    fn merge(&mut self, mut other: InRange) {
        self.keys.append(&mut other.keys);
    }
    fn held(&self) -> usize {
        self.keys.len()
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
    check_shapes("ground truth", base, queries)?;
    if k == 0 {
        return Err(Error::arg("ground truth: k must be at least 1"));
    }
    if k > base.n() {
        return Err(Error::arg(format!(
            "ground truth: k={k} is larger than the number of base vectors ({})",
            base.n()
        )));
    }
    let nq = queries.n();
    let tops = scan_all(base, queries, metric, usize::MAX, || TopK::new(k))?;
    let mut ids = Vec::with_capacity(nq * k);
    let mut distances = Vec::with_capacity(nq * k);
    for top in tops {
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

/// Most pairs a range ground truth may hold: its file stores the total as a u32.
pub const MAX_RANGE_RESULTS: usize = u32::MAX as usize;

/// Every base vector within `radius` of each query, exactly: squared L2
/// distance `<= radius` for [`Metric::L2`], inner product or cosine similarity
/// `>= radius` for [`Metric::InnerProduct`] and [`Metric::Cosine`] (the values
/// [`compute_ground_truth`] reports, computed by the same kernels).
///
/// Results of query `i` are `ids[lims[i]..lims[i + 1]]`, sorted closest first,
/// ties by smaller id; `distances` are user-facing. Runs on the caller's rayon
/// pool; the result is independent of the number of threads.
///
/// Errors: a radius that is NaN or infinite, a negative L2 radius, mismatched
/// dimensions, or more than [`MAX_RANGE_RESULTS`] pairs in total (the scan
/// stops once the total passes it, so a radius far too large fails rather than
/// exhausting memory).
pub fn compute_range_ground_truth<T: Element>(
    base: MatrixView<'_, T>,
    queries: MatrixView<'_, T>,
    radius: f32,
    metric: Metric,
) -> Result<RangeGroundTruth> {
    range_ground_truth_limited(base, queries, radius, metric, MAX_RANGE_RESULTS)
}

/// Checks a range-search radius: finite, and not negative for L2 (a squared
/// distance). Inner-product and cosine radii are scores and may be negative.
pub fn check_radius(radius: f32, metric: Metric) -> Result<()> {
    if !radius.is_finite() {
        return Err(Error::arg(format!(
            "radius {radius} is not a finite number (as float32)"
        )));
    }
    if metric == Metric::L2 && radius < 0.0 {
        return Err(Error::arg(format!(
            "radius {radius} is negative: for l2 the radius is a squared distance (>= 0)"
        )));
    }
    Ok(())
}

fn range_ground_truth_limited<T: Element>(
    base: MatrixView<'_, T>,
    queries: MatrixView<'_, T>,
    radius: f32,
    metric: Metric,
    limit: usize,
) -> Result<RangeGroundTruth> {
    check_shapes("range ground truth", base, queries)?;
    check_radius(radius, metric)?;
    let hits = scan_all(base, queries, metric, limit, || InRange {
        metric,
        radius,
        keys: Vec::new(),
    })
    .map_err(|e| match e {
        Error::InvalidArgument(m) => Error::arg(format!(
            "range ground truth at radius {radius} ({metric}): {m}; choose a {} radius",
            if metric == Metric::L2 {
                "smaller"
            } else {
                "larger"
            }
        )),
        e => e,
    })?;
    let total: usize = hits.iter().map(|h| h.keys.len()).sum();
    let mut lims = Vec::with_capacity(hits.len() + 1);
    let mut ids = Vec::with_capacity(total);
    let mut distances = Vec::with_capacity(total);
    lims.push(0u64);
    for mut h in hits {
        h.keys.sort_unstable();
        for key in h.keys {
            ids.push(key as u32);
            distances.push(metric.to_user(key_f32((key >> 32) as u32)));
        }
        lims.push(ids.len() as u64);
    }
    Ok(RangeGroundTruth {
        lims,
        ids,
        distances,
    })
}

fn check_shapes<T: Element>(
    what: &str,
    base: MatrixView<'_, T>,
    queries: MatrixView<'_, T>,
) -> Result<()> {
    if base.dim() != queries.dim() {
        return Err(Error::arg(format!(
            "{what}: queries have dimension {}, base vectors have dimension {}",
            queries.dim(),
            base.dim()
        )));
    }
    if base.n() > u32::MAX as usize + 1 {
        return Err(Error::arg(format!(
            "{what}: {} base vectors do not fit 32-bit ids",
            base.n()
        )));
    }
    Ok(())
}

/// The blocked, multi-threaded scan shared by the k-NN and range ground truth:
/// one sink per query (made by `make`), in query order. Fails once the sinks
/// together hold more than `limit` pairs.
fn scan_all<T: Element, S: Sink>(
    base: MatrixView<'_, T>,
    queries: MatrixView<'_, T>,
    metric: Metric,
    limit: usize,
    make: impl Fn() -> S + Sync,
) -> Result<Vec<S>> {
    let nq = queries.n();
    if nq == 0 {
        return Ok(Vec::new());
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

    let group = (QUERY_GROUP_BYTES / row_bytes.max(1)).clamp(4, 256).min(nq);
    let block = (BASE_BLOCK_BYTES / row_bytes.max(1)).clamp(64, 16384);
    let n_groups = nq.div_ceil(group);
    // Split the base too when there are too few query groups to feed every
    // thread; the merge is exact because the order of the keys is total.
    let want_tasks = 4 * rayon::current_num_threads();
    let n_chunks = if n_groups >= want_tasks {
        1
    } else {
        want_tasks
            .div_ceil(n_groups)
            .min(base.n().div_ceil(MIN_BASE_CHUNK_ROWS))
            .max(1)
    };
    let chunk_rows = base.n().div_ceil(n_chunks).max(1);
    let n_chunks = base.n().div_ceil(chunk_rows);

    let ctx = Ctx {
        base,
        queries,
        metric,
        base_norms: &base_norms,
        query_norms: &query_norms,
        block,
        limit,
        held: AtomicUsize::new(0),
        over: AtomicBool::new(false),
    };

    let per_group: Vec<Vec<S>> = (0..n_groups)
        .into_par_iter()
        .map(|g| {
            let q0 = g * group;
            let q1 = (q0 + group).min(nq);
            (0..n_chunks)
                .into_par_iter()
                .map(|c| {
                    let b0 = c * chunk_rows;
                    let b1 = (b0 + chunk_rows).min(base.n());
                    ctx.scan(q0, q1, b0, b1, &make)
                })
                .reduce_with(|mut a, b| {
                    for (x, y) in a.iter_mut().zip(b) {
                        x.merge(y);
                    }
                    a
                })
                .unwrap_or_else(|| (q0..q1).map(|_| make()).collect())
        })
        .collect();
    if ctx.over.load(Ordering::Relaxed) {
        return Err(Error::arg(format!(
            "more than {limit} (query, vector) pairs in total"
        )));
    }
    Ok(per_group.into_iter().flatten().collect())
}

struct Ctx<'a, T: Element> {
    base: MatrixView<'a, T>,
    queries: MatrixView<'a, T>,
    metric: Metric,
    base_norms: &'a [f32],
    query_norms: &'a [f32],
    block: usize,
    /// Most pairs all sinks together may hold.
    limit: usize,
    /// Pairs held by every scan so far (counted per base block).
    held: AtomicUsize,
    /// Set once `held` passed `limit`: every scan stops at its next block.
    over: AtomicBool,
}

impl<T: Element> Ctx<'_, T> {
    /// The sinks of queries `q0..q1` over base rows `b0..b1`.
    fn scan<S: Sink>(
        &self,
        q0: usize,
        q1: usize,
        b0: usize,
        b1: usize,
        make: &impl Fn() -> S,
    ) -> Vec<S> {
        let mut sinks: Vec<S> = (q0..q1).map(|_| make()).collect();
        let mut held = 0usize;
        let mut start = b0;
        while start < b1 {
            if self.over.load(Ordering::Relaxed) {
                break;
            }
            let end = (start + self.block).min(b1);
            for (qi, sink) in (q0..q1).zip(sinks.iter_mut()) {
                let q = self.queries.row(qi);
                match self.metric {
                    Metric::L2 => {
                        for i in start..end {
                            sink.offer(T::l2_sq(q, self.base.row(i)), i as u32);
                        }
                    }
                    Metric::InnerProduct => {
                        for i in start..end {
                            sink.offer(-T::dot(q, self.base.row(i)), i as u32);
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
                            sink.offer(1.0 - sim, i as u32);
                        }
                    }
                }
            }
            if self.limit != usize::MAX {
                let now: usize = sinks.iter().map(Sink::held).sum();
                let total = self.held.fetch_add(now - held, Ordering::Relaxed) + (now - held);
                held = now;
                if total > self.limit {
                    self.over.store(true, Ordering::Relaxed);
                }
            }
            start = end;
        }
        sinks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elem::DType;
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

    /// Every user-facing value of every (query, base) pair, row-major.
    fn all_user<T: Element>(
        base: MatrixView<'_, T>,
        queries: MatrixView<'_, T>,
        metric: Metric,
    ) -> Vec<Vec<f32>> {
        let n = base.n();
        let (ids, d) = naive(base, queries, n, metric);
        (0..queries.n())
            .map(|q| {
                let mut row = vec![0.0f32; n];
                for j in 0..n {
                    row[ids[q * n + j] as usize] = d[q * n + j];
                }
                row
            })
            .collect()
    }

    /// The scalar reference: every pair, filtered by the radius, sorted by
    /// (distance, id), closest first.
    fn naive_range<T: Element>(
        base: MatrixView<'_, T>,
        queries: MatrixView<'_, T>,
        radius: f32,
        metric: Metric,
    ) -> RangeGroundTruth {
        let mut lims = vec![0u64];
        let (mut ids, mut distances) = (Vec::new(), Vec::new());
        for row in all_user(base, queries, metric) {
            let mut hits: Vec<(f32, u32)> = row
                .iter()
                .enumerate()
                .filter(|(_, &u)| {
                    if metric.higher_is_closer() {
                        u >= radius
                    } else {
                        u <= radius
                    }
                })
                .map(|(i, &u)| (u, i as u32))
                .collect();
            hits.sort_by(|a, b| {
                let c = a.0.total_cmp(&b.0);
                let c = if metric.higher_is_closer() {
                    c.reverse()
                } else {
                    c
                };
                c.then(a.1.cmp(&b.1))
            });
            for (u, i) in hits {
                ids.push(i);
                distances.push(u);
            }
            lims.push(ids.len() as u64);
        }
        RangeGroundTruth {
            lims,
            ids,
            distances,
        }
    }

    /// Radii at a few quantiles of the pair values, each an actual pair's value
    /// (so the boundary pair ties the radius exactly).
    fn quantile_radii<T: Element>(
        base: MatrixView<'_, T>,
        queries: MatrixView<'_, T>,
        metric: Metric,
    ) -> Vec<f32> {
        let mut all: Vec<f32> = all_user(base, queries, metric).concat();
        all.sort_by(|a, b| a.total_cmp(b));
        if metric.higher_is_closer() {
            all.reverse();
        }
        [0usize, 1, 20, 200, 1000]
            .iter()
            .map(|&per_mille| all[(all.len() - 1) * per_mille / 1000])
            .collect()
    }

    fn check_range<T: Element>(n: usize, nq: usize, d: usize, spread: f32, seed: u64) {
        let base = random::<T>(n, d, seed, spread);
        let queries = random::<T>(nq, d, seed ^ 0x5eed, spread);
        let bv = MatrixView::new(&base, n, d).unwrap();
        let qv = MatrixView::new(&queries, nq, d).unwrap();
        for metric in [Metric::L2, Metric::InnerProduct, Metric::Cosine] {
            for radius in quantile_radii(bv, qv, metric) {
                let gt = compute_range_ground_truth(bv, qv, radius, metric).unwrap();
                gt.validate().unwrap();
                assert_eq!(gt.n(), nq);
                let want = naive_range(bv, qv, radius, metric);
                assert_eq!(gt, want, "{:?} {metric} radius {radius}", T::DTYPE);
            }
        }
    }

    #[test]
    fn range_matches_naive_every_dtype_and_metric() {
        check_range::<f32>(700, 13, 16, 1.0, 31);
        check_range::<f16>(400, 7, 12, 2.0, 32);
        check_range::<u8>(600, 9, 8, 255.0, 33);
        check_range::<i8>(600, 9, 8, 127.0, 34);
    }

    #[test]
    fn range_ties_at_the_radius_are_included_in_id_order() {
        // Values in {0, 1, 2} on 3 dimensions: many pairs tie the radius.
        check_range::<u8>(1500, 20, 3, 2.0, 35);
        // Every base vector identical: all or nothing, ids ascending.
        let base = vec![1.0f32; 50 * 2];
        let q = vec![0.0f32, 0.0];
        let (bv, qv) = (
            MatrixView::new(&base, 50, 2).unwrap(),
            MatrixView::new(&q, 1, 2).unwrap(),
        );
        let gt = compute_range_ground_truth(bv, qv, 2.0, Metric::L2).unwrap();
        assert_eq!(gt.ids, (0..50).collect::<Vec<u32>>());
        assert_eq!(gt.distances, vec![2.0; 50]);
        assert_eq!(gt.lims, vec![0, 50]);
        let gt = compute_range_ground_truth(bv, qv, 1.999, Metric::L2).unwrap();
        assert_eq!(gt.lims, vec![0, 0]);
        assert!(gt.ids.is_empty() && gt.distances.is_empty());
    }

    #[test]
    fn range_empty_answers_and_empty_inputs() {
        let (n, nq, d) = (300, 6, 5);
        let base = random::<f32>(n, d, 36, 1.0);
        let queries = random::<f32>(nq, d, 37, 1.0);
        let (bv, qv) = (
            MatrixView::new(&base, n, d).unwrap(),
            MatrixView::new(&queries, nq, d).unwrap(),
        );
        // No base vector coincides with a query: nothing at squared distance 0.
        let gt = compute_range_ground_truth(bv, qv, 0.0, Metric::L2).unwrap();
        assert_eq!(gt.lims, vec![0; nq + 1]);
        // Scores above any attainable one: nothing.
        let gt = compute_range_ground_truth(bv, qv, 1e6, Metric::InnerProduct).unwrap();
        assert_eq!(gt.lims, vec![0; nq + 1]);
        let gt = compute_range_ground_truth(bv, qv, 1.5, Metric::Cosine).unwrap();
        assert_eq!(gt.lims, vec![0; nq + 1]);
        // Everything: every query gets all n, closest first.
        let gt = compute_range_ground_truth(bv, qv, -2.0, Metric::Cosine).unwrap();
        assert_eq!(*gt.lims.last().unwrap(), (nq * n) as u64);
        for q in 0..nq {
            let row = &gt.distances[q * n..(q + 1) * n];
            assert!(row.windows(2).all(|w| w[0] >= w[1]));
        }
        // A base vector equal to a query is found at distance 0.
        let mut base2 = base.clone();
        base2[7 * d..8 * d].copy_from_slice(&queries[..d]);
        let gt =
            compute_range_ground_truth(MatrixView::new(&base2, n, d).unwrap(), qv, 0.0, Metric::L2)
                .unwrap();
        assert_eq!((gt.lims[1], gt.ids.clone()), (1, vec![7]));
        // No queries, or no base vectors.
        let gt =
            compute_range_ground_truth(bv, MatrixView::new(&[], 0, d).unwrap(), 1.0, Metric::L2)
                .unwrap();
        assert_eq!((gt.n(), gt.lims), (0, vec![0]));
        let gt =
            compute_range_ground_truth(MatrixView::new(&[], 0, d).unwrap(), qv, 1.0, Metric::L2)
                .unwrap();
        assert_eq!(gt.lims, vec![0; nq + 1]);
    }

    #[test]
    fn range_radius_and_shape_errors() {
        let base = vec![0.0f32; 10 * 4];
        let bv = MatrixView::new(&base, 10, 4).unwrap();
        let q = vec![0.0f32; 4];
        let qv = MatrixView::new(&q, 1, 4).unwrap();
        let err = |r: f32, m: Metric| {
            compute_range_ground_truth(bv, qv, r, m)
                .unwrap_err()
                .to_string()
        };
        for m in [Metric::L2, Metric::InnerProduct, Metric::Cosine] {
            assert!(err(f32::NAN, m).contains("not a finite number"), "{m}");
            assert!(err(f32::INFINITY, m).contains("not a finite number"), "{m}");
            assert!(
                err(f32::NEG_INFINITY, m).contains("not a finite number"),
                "{m}"
            );
        }
        let e = err(-0.5, Metric::L2);
        assert!(e.contains("-0.5") && e.contains("negative"), "{e}");
        // Scores may be negative.
        assert!(compute_range_ground_truth(bv, qv, -0.5, Metric::InnerProduct).is_ok());
        assert!(compute_range_ground_truth(bv, qv, -0.5, Metric::Cosine).is_ok());
        let q3 = vec![0.0f32; 3];
        let e =
            compute_range_ground_truth(bv, MatrixView::new(&q3, 1, 3).unwrap(), 1.0, Metric::L2)
                .unwrap_err()
                .to_string();
        assert!(
            e.contains("dimension 3") && e.contains("dimension 4"),
            "{e}"
        );
    }

    #[test]
    fn range_stops_past_the_result_limit() {
        let (n, nq, d) = (5000, 40, 4);
        let base = random::<f32>(n, d, 38, 1.0);
        let queries = random::<f32>(nq, d, 39, 1.0);
        let (bv, qv) = (
            MatrixView::new(&base, n, d).unwrap(),
            MatrixView::new(&queries, nq, d).unwrap(),
        );
        let e = range_ground_truth_limited(bv, qv, 100.0, Metric::L2, 1000)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("more than 1000") && e.contains("smaller radius"),
            "{e}"
        );
        let e = range_ground_truth_limited(bv, qv, -100.0, Metric::InnerProduct, 1000)
            .unwrap_err()
            .to_string();
        assert!(e.contains("larger radius"), "{e}");
        // Exactly at the limit is fine.
        let gt = range_ground_truth_limited(bv, qv, 100.0, Metric::L2, n * nq).unwrap();
        assert_eq!(gt.ids.len(), n * nq);
    }

    #[test]
    fn range_independent_of_threads_and_agrees_with_knn() {
        let (n, d, k) = (20_000, 8, 25);
        let base = random::<f32>(n, d, 40, 1.0);
        let bv = MatrixView::new(&base, n, d).unwrap();
        for nq in [1usize, 3, 300] {
            let queries = random::<f32>(nq, d, 41 + nq as u64, 1.0);
            let qv = MatrixView::new(&queries, nq, d).unwrap();
            let knn = compute_ground_truth(bv, qv, k, Metric::L2).unwrap();
            // The k-th distance of query 0 as the radius: query 0's answer is
            // its top-k (random floats: no ties), every other query's answer
            // is a prefix of its own sorted neighbours.
            let radius = knn.distances[k - 1];
            let mut results = Vec::new();
            for threads in [1, 2, 5] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                results.push(
                    pool.install(|| {
                        compute_range_ground_truth(bv, qv, radius, Metric::L2).unwrap()
                    }),
                );
            }
            assert_eq!(results[0], results[1]);
            assert_eq!(results[0], results[2]);
            let gt = &results[0];
            assert_eq!(&gt.ids[..k], &knn.ids[..k]);
            assert_eq!(&gt.distances[..k], &knn.distances[..k]);
            assert_eq!(gt.lims[1], k as u64);
            for q in 0..nq {
                let (a, b) = (gt.lims[q] as usize, gt.lims[q + 1] as usize);
                let m = (b - a).min(k);
                assert_eq!(&gt.ids[a..a + m], &knn.ids[q * k..q * k + m], "query {q}");
                assert!(gt.distances[a..b].iter().all(|&x| x <= radius));
            }
        }
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
