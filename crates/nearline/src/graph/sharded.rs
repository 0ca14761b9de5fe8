//! Memory-budgeted build: when the data and graph of a one-shot build exceed
//! the build budget, partition with k-means (each point in its 2 nearest
//! parts), build each part, merge, and prune back to R (as DiskANN does).
//!
//! # Sharded build
//!
//! 1. The medoid of the whole set is found by two streaming passes (mean,
//!    then nearest row); for inner product the norms are streamed too and the
//!    MIPS extra coordinate is computed with the global largest norm.
//! 2. Up to [`MAX_SAMPLE`] rows (seeded) are clustered into `s` centroids, `s`
//!    the smallest count (at least 3) whose shards fit the budget next to the
//!    global state (see [`plan_shards`]).
//! 3. Every point joins its 2 nearest shards that still have room (capacity
//!    `⌈1.2 · 2n / s⌉`), streaming over the data in blocks.
//! 4. Each shard's rows are gathered into an owned buffer, a Vamana graph with
//!    `R' = max(1, 2R/3)` is built over it and its edges are added, in global
//!    ids, to a merged adjacency of degree `2R'`.
//! 5. Merge: every list longer than `R` is robust-pruned (α = `params.alpha`)
//!    with the true distances, block by block; when the data is memory-mapped
//!    the block size is chosen so the rows touched fit the budget, and the
//!    pages are released after each block. A final repair makes every node
//!    reachable from the medoid.
//!
//! Memory-mapped rows are released (`Matrix::release_rows`) after every
//! streaming block, so the resident set stays within the plan's
//! [`ShardPlan::peak_bytes`].

use super::space::{FileRowSpace, GatheredSpace};
use super::vamana::{
    batch_cap, build_vamana, connect_unreachable, medoid, nearest_row_dist, robust_prune,
    slack_degree, sum_f64, SearchScratch,
};
use super::{Graph, MatrixSpace, PointDistance, VamanaParams};
use crate::data::matrix::{Matrix, MatrixView};
use crate::distance::Metric;
use crate::elem::Element;
use crate::quant::kmeans::{
    kmeans_cancellable, nearest_centroids, KMeansParams, LOWER_BOUNDS_MAX_ENTRIES,
};
use crate::util::BigBuf;
use crate::{Error, Result};
use rand::SeedableRng;
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// Largest k-means training sample of the sharded build.
pub const MAX_SAMPLE: usize = 100_000;

/// Per-thread fixed cost of a build: candidate lists and prune pools, and
/// the allocator's per-thread arena, which keeps freed scratch resident
/// between batches (measured ~1.3 MB per thread on a 120k × 64 sharded
/// build; it does not grow with the shard size).
const THREAD_FIXED_BYTES: u64 = 1 << 20;

/// Estimated peak bytes of a one-shot build of `n` points of `dim` elements
/// of `elem_size` bytes with degree `r` (vectors resident + graph + slack).
///
/// Formula (`t` = `rayon::current_num_threads()`, `R⁺ = ⌈1.3·r⌉`):
/// `n·dim·elem_size` (vectors) `+ n·(R⁺ + 1)·4` (adjacency with DiskANN's
/// slack, plus degrees) `+ n·4` (MIPS coordinate / insertion order)
/// `+ t·(n·4 + 1 MiB)` (per-thread visited stamps, lists and allocator arena)
/// `+ B·r·16` (one batch's out-lists and back-edge pairs, `B` the batch cap).
pub fn estimate_build_bytes(n: usize, dim: usize, elem_size: usize, r: usize) -> u64 {
    estimate_build_bytes_on(n, dim, elem_size, r, rayon::current_num_threads())
}

/// [`estimate_build_bytes`] for a build on `threads` threads (the planner's
/// view, outside the build's thread pool).
pub fn estimate_build_bytes_on(
    n: usize,
    dim: usize,
    elem_size: usize,
    r: usize,
    threads: usize,
) -> u64 {
    let n64 = n as u64;
    let t = threads.max(1) as u64;
    let vectors = n64 * dim as u64 * elem_size as u64;
    let graph = n64 * (slack_degree(r) as u64 + 1) * 4;
    let per_point = n64 * 4;
    let scratch = t * (n64 * 4 + THREAD_FIXED_BYTES);
    let batch = batch_cap(n.max(1)) as u64 * r as u64 * 16;
    vectors + graph + per_point + scratch + batch
}

/// The plan of a sharded build.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardPlan {
    /// Number of shards (k-means clusters).
    pub shards: usize,
    /// Degree of the per-shard graphs.
    pub shard_r: usize,
    /// Maximum points per shard.
    pub shard_capacity: usize,
    /// k-means training sample size.
    pub sample: usize,
    /// Estimated peak bytes: global state plus the larger of the k-means
    /// phase and one shard build.
    pub peak_bytes: u64,
}

/// Bytes held for the whole build of a sharded plan: merged adjacency of
/// degree `2R'` plus degrees, shard assignments (2 × u32), MIPS coordinate.
fn global_bytes(n: usize, shard_r: usize) -> u64 {
    let n = n as u64;
    n * (2 * shard_r as u64 + 1) * 4 + n * 8 + n * 4
}

/// Bytes of one shard of `m` points: its vectors, its ids and its build.
fn shard_bytes(m: usize, dim: usize, elem_size: usize, shard_r: usize, threads: usize) -> u64 {
    estimate_build_bytes_on(m, dim, elem_size, shard_r, threads) + m as u64 * 4
}

/// The most points a shard of a sharded build of `n` points in `shards`
/// shards holds (every point joins 2 shards; 20% slack for uneven parts).
pub fn shard_capacity(n: usize, shards: usize) -> usize {
    (2 * n * 12).div_ceil(10 * shards.max(1)).min(n)
}

/// Degree of the per-shard graphs of a sharded build at degree `r`.
fn shard_degree(r: usize) -> usize {
    (2 * r / 3).max(1)
}

/// Plans a sharded build of `n × dim` elements of `elem_size` bytes at degree
/// `r` within `budget_bytes`: the smallest shard count `s ≥ 3` that fits.
/// `None` when no shard count fits (the budget cannot even hold the graph).
/// Runs on the caller's rayon pool's thread count.
pub fn plan_shards(
    n: usize,
    dim: usize,
    elem_size: usize,
    r: usize,
    budget_bytes: u64,
) -> Option<ShardPlan> {
    plan_shards_on(
        n,
        dim,
        elem_size,
        r,
        budget_bytes,
        rayon::current_num_threads(),
    )
}

/// [`plan_shards`] for a build on `threads` threads.
pub fn plan_shards_on(
    n: usize,
    dim: usize,
    elem_size: usize,
    r: usize,
    budget_bytes: u64,
    threads: usize,
) -> Option<ShardPlan> {
    let shard_r = shard_degree(r);
    let global = global_bytes(n, shard_r);
    if global >= budget_bytes || n < 3 {
        return None;
    }
    let avail = budget_bytes - global;
    // Sample rows are f32; k-means keeps a few words per row besides.
    let sample = n
        .min(MAX_SAMPLE)
        .min((avail / (dim as u64 * 4 + 32)) as usize);
    let max_shards = (n / 2).clamp(3, 4096);
    for s in 3..=max_shards {
        let cap = shard_capacity(n, s);
        let shard = shard_bytes(cap, dim, elem_size, shard_r, threads);
        if shard <= avail && sample >= s {
            let kmeans_bytes = sample as u64 * (dim as u64 * 4 + 32);
            return Some(ShardPlan {
                shards: s,
                shard_r,
                shard_capacity: cap,
                sample,
                peak_bytes: global + shard.max(kmeans_bytes),
            });
        }
    }
    None
}

/// How the graph of a build is made within a budget.
#[derive(Debug, Clone, PartialEq)]
pub enum GraphBuild {
    /// The whole graph at once (the budget holds a one-shot build).
    OneShot,
    /// Partitioned into shards, built one after another, then merged.
    Sharded(ShardPlan),
}

/// The graph build of `n × dim` elements of `elem_size` bytes at degree `r`
/// on `threads` threads within `budget_bytes`, or — when no plan fits —
/// the least budget that holds one (always above `budget_bytes`).
pub fn plan_graph_build(
    n: usize,
    dim: usize,
    elem_size: usize,
    r: usize,
    budget_bytes: u64,
    threads: usize,
) -> std::result::Result<GraphBuild, u64> {
    if estimate_build_bytes_on(n, dim, elem_size, r, threads) <= budget_bytes {
        return Ok(GraphBuild::OneShot);
    }
    match plan_shards_on(n, dim, elem_size, r, budget_bytes, threads) {
        Some(p) => Ok(GraphBuild::Sharded(p)),
        None => Err(min_graph_budget(n, dim, elem_size, r, threads)),
    }
}

/// The least budget in which the graph of `n × dim` elements of
/// `elem_size` bytes at degree `r` can be built on `threads` threads
/// (sharded, or at once when no sharded plan takes less).
pub fn min_graph_budget(n: usize, dim: usize, elem_size: usize, r: usize, threads: usize) -> u64 {
    let one = estimate_build_bytes_on(n, dim, elem_size, r, threads);
    let fits = |b: u64| plan_shards_on(n, dim, elem_size, r, b, threads).is_some();
    // A larger budget never plans fewer shards' worth of room: the least
    // budget that fits is found by bisection below the one-shot estimate.
    let mut lo = global_bytes(n, shard_degree(r));
    if lo >= one || !fits(one) {
        return one;
    }
    let mut hi = one;
    // Invariant: fits(hi), !fits(lo) (the budget must exceed the global state).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// Builds the graph of `data` within `budget_bytes` of resident memory:
/// one-shot when it fits, sharded otherwise. Returns the graph and its medoid.
/// `progress(done, total)` reports overall progress; `cancel` stops the build.
/// Runs on the caller's current rayon pool.
pub fn build_with_budget<T: Element>(
    data: &Matrix<T>,
    metric: Metric,
    params: &VamanaParams,
    budget_bytes: u64,
    progress: &(dyn Fn(u64, u64) + Sync),
    cancel: &AtomicBool,
) -> Result<(Graph, u32)> {
    params.validate()?;
    let (n, dim) = (data.n(), data.dim());
    if n == 0 {
        return Err(Error::arg("cannot build a graph over 0 points"));
    }
    let esz = std::mem::size_of::<T>();
    let threads = rayon::current_num_threads();
    match plan_graph_build(n, dim, esz, params.r, budget_bytes, threads) {
        Ok(GraphBuild::OneShot) => {
            let view = data.view();
            let space = MatrixSpace::new(view, metric);
            let start = medoid(view);
            let g = build_vamana(&space, start, params, progress, cancel)?;
            Ok((g, start))
        }
        Ok(GraphBuild::Sharded(plan)) => {
            build_sharded(data, metric, params, &plan, budget_bytes, progress, cancel)
        }
        Err(need) => Err(Error::arg(format!(
            "a graph build memory budget of {budget_bytes} bytes is too small for {n} points \
             of dimension {dim} at degree {} on {threads} threads: it needs at least {need} \
             bytes (the merged graph of a sharded build alone takes {}); raise the build budget",
            params.r,
            global_bytes(n, shard_degree(params.r))
        ))),
    }
}

/// Most rows per streaming block: the cancel flag is checked between
/// blocks, so a cancelled build stops within this many rows of work.
const MAX_STREAM_ROWS: usize = 65_536;

/// Rows per streaming block: about 1/16 of the budget, at least 64 rows and
/// at most [`MAX_STREAM_ROWS`].
fn stream_rows(budget: u64, row_bytes: usize, n: usize) -> usize {
    ((budget / 16).min(usize::MAX as u64) as usize / row_bytes.max(1))
        .clamp(64, n.clamp(64, MAX_STREAM_ROWS))
}

fn check_cancel(cancel: &AtomicBool) -> Result<()> {
    if cancel.load(Ordering::Relaxed) {
        Err(Error::Cancelled)
    } else {
        Ok(())
    }
}

/// A view of rows `a..b` of `data`.
fn rows<T: Element>(data: &Matrix<T>, a: usize, b: usize) -> Result<MatrixView<'_, T>> {
    let dim = data.dim();
    MatrixView::new(&data.as_slice()[a * dim..b * dim], b - a, dim)
}

/// Builds along `plan` (see the module documentation).
#[allow(clippy::too_many_arguments)]
pub fn build_sharded<T: Element>(
    data: &Matrix<T>,
    metric: Metric,
    params: &VamanaParams,
    plan: &ShardPlan,
    budget_bytes: u64,
    progress: &(dyn Fn(u64, u64) + Sync),
    cancel: &AtomicBool,
) -> Result<(Graph, u32)> {
    params.validate()?;
    let (n, dim) = (data.n(), data.dim());
    let s = plan.shards;
    if n == 0 || s == 0 || plan.shard_capacity == 0 || plan.sample < s {
        return Err(Error::arg(format!(
            "invalid shard plan {plan:?} for {n} points"
        )));
    }
    let esz = std::mem::size_of::<T>();
    let block = stream_rows(budget_bytes, dim * esz, n);

    // 1. Medoid (streaming mean, then nearest row) and MIPS norms.
    let mut sum = vec![0f64; dim];
    let mut norms: Vec<f32> = if metric == Metric::InnerProduct {
        Vec::with_capacity(n)
    } else {
        Vec::new()
    };
    for a in (0..n).step_by(block) {
        check_cancel(cancel)?;
        let b = (a + block).min(n);
        let v = rows(data, a, b)?;
        for (acc, x) in sum.iter_mut().zip(sum_f64(v)) {
            *acc += x;
        }
        if metric == Metric::InnerProduct {
            let part: Vec<f32> = (0..b - a)
                .into_par_iter()
                .map(|i| T::dot(v.row(i), v.row(i)))
                .collect();
            norms.extend(part);
        }
        data.release_rows(a, b);
    }
    let mean: Vec<f32> = sum.iter().map(|&x| (x / n as f64) as f32).collect();
    let mut best: Option<(f32, u32)> = None;
    for a in (0..n).step_by(block) {
        check_cancel(cancel)?;
        let b = (a + block).min(n);
        if let Some((d, i)) = nearest_row_dist(rows(data, a, b)?, &mean) {
            let cand = (d, i + a as u32);
            if best.is_none_or(|x| super::vamana::cmp_dist_id(cand, x).is_lt()) {
                best = Some(cand);
            }
        }
        data.release_rows(a, b);
    }
    let start = best.map(|x| x.1).unwrap_or(0);
    let extra: Option<Vec<f32>> = if metric == Metric::InnerProduct {
        let max = norms.iter().copied().fold(0f32, f32::max);
        let e = norms.iter().map(|&q| (max - q).max(0.0).sqrt()).collect();
        drop(norms);
        Some(e)
    } else {
        None
    };

    // 2. k-means on a seeded sample.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(params.seed ^ 0x5348_4152_4453);
    let mut sample_ids = rand::seq::index::sample(&mut rng, n, plan.sample.min(n)).into_vec();
    sample_ids.sort_unstable();
    let mut sample: BigBuf<f32> = BigBuf::zeroed(sample_ids.len() * dim);
    let mut released = 0usize;
    for (j, &i) in sample_ids.iter().enumerate() {
        for (o, x) in sample[j * dim..(j + 1) * dim].iter_mut().zip(data.row(i)) {
            *o = x.to_f32();
        }
        if i >= released + block {
            data.release_rows(released, i);
            released = i;
            check_cancel(cancel)?;
        }
    }
    data.release_rows(released, n);
    drop(sample_ids);
    check_cancel(cancel)?;
    // The n × k lower bounds (f32) only where half of what the global state
    // leaves holds them (they change the speed, not the result).
    let lb_entries = ((budget_bytes.saturating_sub(global_bytes(n, plan.shard_r)) / 2 / 4)
        .min(usize::MAX as u64) as usize)
        .min(LOWER_BOUNDS_MAX_ENTRIES);
    let km = kmeans_cancellable(
        &sample,
        dim,
        &KMeansParams {
            k: s,
            max_iters: 12,
            seed: params.seed,
        },
        lb_entries,
        Some(cancel),
    )?;
    drop(sample);
    let centroids = km.centroids;
    crate::util::return_freed_memory();

    // 3. Capacity-bounded assignment to the 2 nearest shards.
    const NONE: u32 = u32::MAX;
    let mut assign: Vec<[u32; 2]> = vec![[NONE; 2]; n];
    let mut counts = vec![0usize; s];
    for a in (0..n).step_by(block) {
        check_cancel(cancel)?;
        let b = (a + block).min(n);
        let v = rows(data, a, b)?;
        let ranked: Vec<Vec<u32>> = (0..b - a)
            .into_par_iter()
            .map(|i| {
                let x: Vec<f32> = v.row(i).iter().map(|e| e.to_f32()).collect();
                nearest_centroids(&centroids, dim, &x, s)
            })
            .collect();
        for (i, rk) in ranked.iter().enumerate() {
            let slot = &mut assign[a + i];
            let mut k = 0;
            for &c in rk {
                let c = c as usize;
                if c < s && counts[c] < plan.shard_capacity {
                    counts[c] += 1;
                    slot[k] = c as u32;
                    k += 1;
                    if k == 2 {
                        break;
                    }
                }
            }
            if k == 0 {
                return Err(Error::Engine(format!(
                    "sharded build: point {} fits no shard (k-means returned {} ranked centroids)",
                    a + i,
                    rk.len()
                )));
            }
        }
        data.release_rows(a, b);
    }

    // 4. Build every shard; collect its edges in global ids.
    let total = params.passes as u64 * counts.iter().sum::<usize>() as u64 + n as u64;
    let mut offset = 0u64;
    let shard_params = VamanaParams {
        r: plan.shard_r,
        ..params.clone()
    };
    let mut merged = Graph::new(n, 2 * plan.shard_r);
    for j in 0..s as u32 {
        check_cancel(cancel)?;
        let ids: Vec<u32> = (0..n as u32)
            .filter(|&i| assign[i as usize].contains(&j))
            .collect();
        if ids.is_empty() {
            continue;
        }
        let mut buf: BigBuf<T> = BigBuf::zeroed(ids.len() * dim);
        let mut p = 0usize;
        for a in (0..n).step_by(block) {
            check_cancel(cancel)?;
            let b = (a + block).min(n);
            while p < ids.len() && (ids[p] as usize) < b {
                buf[p * dim..(p + 1) * dim].copy_from_slice(data.row(ids[p] as usize));
                p += 1;
            }
            data.release_rows(a, b);
        }
        let view = MatrixView::new(&buf, ids.len(), dim)?;
        let local_extra = extra
            .as_ref()
            .map(|e| ids.iter().map(|&i| e[i as usize]).collect());
        let space = MatrixSpace::with_extra(view, local_extra)?;
        let local_start = medoid(view);
        let sp = VamanaParams {
            seed: shard_params.seed.wrapping_add(j as u64),
            ..shard_params.clone()
        };
        let base = offset;
        let g = build_vamana(
            &space,
            local_start,
            &sp,
            &|d, _| progress(base + d, total),
            cancel,
        )?;
        offset += params.passes as u64 * ids.len() as u64;
        drop(space);
        drop(buf);
        crate::util::return_freed_memory();
        for (lv, &gv) in ids.iter().enumerate() {
            for &lu in g.neighbors(lv as u32) {
                let gu = ids[lu as usize];
                if !merged.neighbors(gv).contains(&gu) {
                    merged.push_neighbor(gv, gu);
                }
            }
        }
    }
    drop(assign);
    crate::util::return_freed_memory();

    // 5. Merge: prune lists over R with true distances, block by block. The
    // rows a block needs are copied (`gather_rows` reads them: scattered
    // touches of the mapping would map whole page-cache folios).
    let r = params.r;
    let row_bytes = (dim * esz) as u64;
    let merge_block = {
        let touched = (2 * plan.shard_r + 1) as u64 * (row_bytes + 8);
        let avail = budget_bytes.saturating_sub(global_bytes(n, plan.shard_r));
        ((avail / 2 / touched.max(1)) as usize).clamp(16, 8192)
    };
    let mut need: Vec<u32> = Vec::new();
    let mut rows_buf: Vec<T> = Vec::new();
    for a in (0..n).step_by(merge_block) {
        check_cancel(cancel)?;
        let b = (a + merge_block).min(n);
        let over: Vec<u32> = (a as u32..b as u32)
            .filter(|&v| merged.degree(v) > r)
            .collect();
        need.clear();
        for &v in &over {
            need.push(v);
            need.extend_from_slice(merged.neighbors(v));
        }
        need.sort_unstable();
        need.dedup();
        rows_buf.clear();
        data.gather_rows(&need, &mut rows_buf)?;
        let gathered = GatheredSpace {
            n,
            ids: &need,
            rows: MatrixView::new(&rows_buf, need.len(), dim)?,
            extra: extra.as_deref(),
        };
        let pruned: Vec<Vec<u32>> = {
            let merged = &merged;
            let space = &gathered;
            over.par_iter()
                .map(|&v| {
                    let mut pool: Vec<(f32, u32)> = merged
                        .neighbors(v)
                        .iter()
                        .map(|&u| (space.dist(v, u), u))
                        .collect();
                    let mut out = Vec::with_capacity(r);
                    robust_prune(
                        space,
                        v,
                        &mut pool,
                        params.alpha,
                        r,
                        params.max_candidates,
                        params.saturate && params.alpha > 1.0,
                        &mut out,
                    );
                    out
                })
                .collect()
        };
        for (&v, list) in over.iter().zip(&pruned) {
            merged.set_neighbors(v, list);
        }
        progress(offset + b as u64, total);
    }
    drop(rows_buf);
    drop(need);
    // Reachability repair searches from the entry for the few unreachable
    // nodes: scattered single rows, read rather than mapped.
    let space = FileRowSpace::new(data, extra.as_deref());
    let mut scratch = SearchScratch::new();
    connect_unreachable(&space, &mut merged, start, r, params.l, &mut scratch);
    space.finish()?;
    data.release_rows(0, n);
    merged.shrink_degree(r);
    Ok((merged, start))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::vamana::tests::{check_invariants, clustered, reachable, recall_l2};

    #[test]
    fn estimate_grows_with_inputs() {
        let a = estimate_build_bytes(1000, 32, 4, 32);
        assert!(a >= 1000 * 32 * 4 + 1000 * 32 * 4);
        assert!(estimate_build_bytes(2000, 32, 4, 32) > a);
        assert!(estimate_build_bytes(1000, 64, 4, 32) > a);
        assert!(estimate_build_bytes(1000, 32, 4, 64) > a);
        assert!(estimate_build_bytes(1000, 32, 1, 32) < a);
    }

    #[test]
    fn plan_fits_budget_or_refuses() {
        let (n, dim, r) = (100_000, 128, 64);
        let one = estimate_build_bytes(n, dim, 4, r);
        let plan = plan_shards(n, dim, 4, r, one / 2).unwrap();
        assert!(plan.shards >= 3);
        assert!(plan.peak_bytes <= one / 2);
        assert_eq!(plan.shard_r, 42);
        // A budget below the merged graph is refused.
        assert!(plan_shards(n, dim, 4, r, 1000).is_none());
        let m = Matrix::from_vec(vec![0f32; 10 * 4], 10, 4).unwrap();
        let res = build_with_budget(
            &m,
            Metric::L2,
            &VamanaParams::default(),
            100,
            &|_, _| {},
            &AtomicBool::new(false),
        );
        assert!(matches!(res, Err(Error::InvalidArgument(_))));
    }

    /// The least budget of a graph build is exact (it plans, a byte less
    /// does not) and lies above every budget that is refused; a refused
    /// build states it.
    #[test]
    fn min_graph_budget_is_the_least_that_plans() {
        for (n, dim, r, t) in [(20_000, 64, 64, 2), (5000, 96, 24, 4), (1000, 8, 16, 1)] {
            let need = min_graph_budget(n, dim, 4, r, t);
            assert!(plan_graph_build(n, dim, 4, r, need, t).is_ok());
            assert_eq!(plan_graph_build(n, dim, 4, r, need - 1, t), Err(need));
            assert_eq!(plan_graph_build(n, dim, 4, r, 0, t), Err(need));
            assert!(need > global_bytes(n, shard_degree(r)));
        }
        let m = Matrix::from_vec(vec![0f32; 4000 * 8], 4000, 8).unwrap();
        let t = rayon::current_num_threads();
        let need = min_graph_budget(4000, 8, 4, 16, t);
        let p = VamanaParams {
            r: 16,
            ..VamanaParams::default()
        };
        let e = build_with_budget(
            &m,
            Metric::L2,
            &p,
            1000,
            &|_, _| {},
            &AtomicBool::new(false),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("budget of 1000 bytes is too small")
                && e.contains(&format!("needs at least {need} bytes")),
            "{e}"
        );
    }

    #[test]
    fn one_shot_when_budget_fits() {
        let dim = 8;
        let data = clustered(800, dim, 8, 1);
        let m = Matrix::from_vec(data.clone(), 800, dim).unwrap();
        let p = VamanaParams {
            r: 12,
            l: 30,
            ..VamanaParams::default()
        };
        let no = AtomicBool::new(false);
        let (g, start) = build_with_budget(&m, Metric::L2, &p, u64::MAX, &|_, _| {}, &no).unwrap();
        assert_eq!(start, medoid(m.view()));
        let space = MatrixSpace::new(m.view(), Metric::L2);
        let direct = build_vamana(&space, start, &p, &|_, _| {}, &no).unwrap();
        assert_eq!(g, direct);
    }

    fn sharded_case(metric: Metric, mapped: bool) {
        let (n, dim) = (5000, 96);
        let mut data = clustered(n + 100, dim, 30, 21);
        let queries = data.split_off(n * dim);
        let p = VamanaParams {
            r: 24,
            l: 50,
            ..VamanaParams::default()
        };
        let one = estimate_build_bytes(n, dim, 4, p.r);
        let budget = one * 3 / 4;
        let plan = plan_shards(n, dim, 4, p.r, budget).unwrap();
        assert!(plan.shards >= 3 && plan.peak_bytes <= budget, "{plan:?}");
        let dir = tempfile::tempdir().unwrap();
        let m = if mapped {
            let path = dir.path().join("v.bin");
            std::fs::write(&path, bytemuck::cast_slice::<f32, u8>(&data)).unwrap();
            Matrix::<f32>::map_file(&path, 0, n, dim).unwrap()
        } else {
            Matrix::from_vec(data.clone(), n, dim).unwrap()
        };
        let last = std::sync::Mutex::new((0u64, 0u64));
        let (g, start) = build_with_budget(
            &m,
            metric,
            &p,
            budget,
            &|d, t| {
                let mut l = last.lock().unwrap();
                assert!(d <= t);
                *l = (d, t);
            },
            &AtomicBool::new(false),
        )
        .unwrap();
        let (d, t) = *last.lock().unwrap();
        assert_eq!(d, t);
        check_invariants(&g, p.r);
        assert_eq!(start, medoid(m.view()));
        assert_eq!(reachable(&g, start), n);
        let rec = recall_l2(&g, start, &data, &queries, dim, 100, 10);
        assert!(rec >= 0.9, "sharded recall@10 = {rec}");
    }

    #[test]
    fn sharded_build_recall_owned() {
        sharded_case(Metric::L2, false);
    }

    #[test]
    fn sharded_build_recall_mapped() {
        sharded_case(Metric::L2, true);
    }

    #[test]
    fn sharded_build_cancel() {
        // Large enough that 3/4 of the one-shot estimate still plans shards
        // next to the per-thread fixed cost.
        let (n, dim) = (5000, 96);
        let data = clustered(n, dim, 10, 5);
        let m = Matrix::from_vec(data, n, dim).unwrap();
        let p = VamanaParams {
            r: 16,
            l: 32,
            ..VamanaParams::default()
        };
        let budget = estimate_build_bytes(n, dim, 4, p.r) * 3 / 4;
        assert!(plan_shards(n, dim, 4, p.r, budget).is_some());
        let cancel = AtomicBool::new(false);
        let res = build_with_budget(
            &m,
            Metric::L2,
            &p,
            budget,
            &|d, _| {
                if d > 500 {
                    cancel.store(true, Ordering::Relaxed);
                }
            },
            &cancel,
        );
        assert!(matches!(res, Err(Error::Cancelled)));
    }
}
