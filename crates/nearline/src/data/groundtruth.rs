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
