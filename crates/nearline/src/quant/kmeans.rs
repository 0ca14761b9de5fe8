//! k-means with k-means++ initialisation and Elkan-accelerated iterations.
//!
//! * **Seeding**: k-means++ (D² sampling) over the full data with a
//!   `ChaCha8Rng` seeded from [`KMeansParams::seed`]. Each new centre updates
//!   every point's distance to its nearest centre in parallel; the triangle
//!   inequality skips points that the new centre provably cannot improve
//!   (`d(c_new, c_best(x)) ≥ 2·d(x, c_best(x))`). Seeding also yields the exact
//!   initial assignment for free.
//! * **Iterations**: Elkan's algorithm. Every point keeps an upper bound on the
//!   distance to its centre; a point is skipped when that bound is at most
//!   `s(c) = ½·min_{c'≠c} d(c, c')`. Otherwise the other centres are visited
//!   in increasing `d(c, c')` order and the scan stops as soon as
//!   `d(c, c') ≥ 2·d(x, c)`. When the `n × k` matrix of per-centre lower bounds
//!   fits [`LOWER_BOUNDS_MAX_ENTRIES`] and the dimension is large enough for a
//!   distance to be expensive ([`LOWER_BOUNDS_MIN_DIM`]), the lower bounds of
//!   Elkan's paper also prune individual centres.
//! * **Empty clusters** are re-seeded with the points farthest from their
//!   centres (ties: lowest index), taken from clusters that keep at least one
//!   point.
//!
//! Every reduction runs over fixed-size row chunks combined in chunk order, so
//! results depend on the data, the parameters and the seed only, never on the
//! number of threads of the caller's rayon pool.

use crate::kernels::l2_f32 as l2_simd;
use crate::{Error, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

/// k-means parameters.
#[derive(Debug, Clone)]
pub struct KMeansParams {
    /// Number of clusters.
    pub k: usize,
    /// Maximum Elkan iterations after seeding.
    pub max_iters: usize,
    /// Seed: results depend only on the data, the parameters and this seed,
    /// never on the number of threads.
    pub seed: u64,
}

/// k-means output.
#[derive(Debug, Clone)]
pub struct KMeansResult {
    /// Row-major `k × dim` centroids.
    pub centroids: Vec<f32>,
    /// Cluster of every input row.
    pub assignment: Vec<u32>,
    /// Iterations run.
    pub iters: usize,
    /// Sum of squared distances to the assigned centroid.
    pub inertia: f64,
}

/// Rows per parallel work item. Fixed (never derived from the thread count) so
/// that chunked reductions are reproducible.
const CHUNK: usize = 1024;
/// Points per centre from which an assignment pass sorts each centre's
/// neighbour centres (see `assign_step`).
const SORTED_MIN_POINTS_PER_CENTRE: usize = 64;

/// Largest `n × k` matrix of per-centre lower bounds (f32 entries, 256 MiB)
/// that [`kmeans`] allocates; above it only the upper bounds and the
/// centre–centre distances prune.
pub const LOWER_BOUNDS_MAX_ENTRIES: usize = 1 << 26;

/// Below this dimension a distance costs about as much as reading and
/// maintaining a lower bound, so the `n × k` lower bounds are not kept.
pub const LOWER_BOUNDS_MIN_DIM: usize = 16;

/// From this dimension on, k-means++ seeding skips distance computations
/// that the triangle inequality proves useless.
const SEED_PRUNE_MIN_DIM: usize = 12;

/// Relative slack applied to every bound so that float rounding can never
/// prune a centre that is in fact closer.
const SLACK: f32 = 1e-5;

/// Clusters the row-major `data` (`n × dim`) into `params.k` clusters.
/// Runs on the caller's current rayon pool.
pub fn kmeans(data: &[f32], dim: usize, params: &KMeansParams) -> Result<KMeansResult> {
    kmeans_with_lb_budget(data, dim, params, LOWER_BOUNDS_MAX_ENTRIES)
}

/// [`kmeans`] keeping per-centre lower bounds only if `n × k ≤ lb_max_entries`
/// (callers running several k-means at once split the budget between them).
/// The budget changes the speed, not the result.
pub(crate) fn kmeans_with_lb_budget(
    data: &[f32],
    dim: usize,
    params: &KMeansParams,
    lb_max_entries: usize,
) -> Result<KMeansResult> {
    kmeans_cancellable(data, dim, params, lb_max_entries, None)
}

/// [`kmeans_with_lb_budget`] that stops with [`Error::Cancelled`] soon
/// after `cancel` is set (checked at every seed and every iteration).
pub(crate) fn kmeans_cancellable(
    data: &[f32],
    dim: usize,
    params: &KMeansParams,
    lb_max_entries: usize,
    cancel: Option<&std::sync::atomic::AtomicBool>,
) -> Result<KMeansResult> {
    let n = validate(data, dim, params.k)?;
    let use_lb =
        dim >= LOWER_BOUNDS_MIN_DIM && n.checked_mul(params.k).is_some_and(|e| e <= lb_max_entries);
    run(data, dim, n, params, use_lb, cancel)
}

#[cfg(test)]
thread_local! {
    /// Cancel checks made on this thread (each follows at most one seed or
    /// one iteration of work): the tests count the work a cancelled run did.
    pub(crate) static CHECKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Fails with [`Error::Cancelled`] once `cancel` is set.
#[inline]
fn check(cancel: Option<&std::sync::atomic::AtomicBool>) -> Result<()> {
    #[cfg(test)]
    CHECKS.with(|c| c.set(c.get() + 1));
    match cancel {
        Some(c) if c.load(std::sync::atomic::Ordering::Relaxed) => Err(Error::Cancelled),
        _ => Ok(()),
    }
}

/// Checks the arguments; returns the number of rows.
fn validate(data: &[f32], dim: usize, k: usize) -> Result<usize> {
    if dim == 0 {
        return Err(Error::arg("kmeans: dim must be at least 1"));
    }
    if !data.len().is_multiple_of(dim) {
        return Err(Error::arg(format!(
            "kmeans: data has {} values, not a multiple of dim = {dim}",
            data.len()
        )));
    }
    let n = data.len() / dim;
    if k == 0 {
        return Err(Error::arg("kmeans: k must be at least 1"));
    }
    if k > n {
        return Err(Error::arg(format!(
            "kmeans: k = {k} exceeds the number of points n = {n}"
        )));
    }
    if k > u32::MAX as usize {
        return Err(Error::arg(format!("kmeans: k = {k} exceeds {}", u32::MAX)));
    }
    if let Some(pos) = data.iter().position(|v| !v.is_finite()) {
        return Err(Error::arg(format!(
            "kmeans: data value at row {}, column {} is {} (expected a finite number)",
            pos / dim,
            pos % dim,
            data[pos]
        )));
    }
    Ok(n)
}

#[inline]
fn row(data: &[f32], dim: usize, i: usize) -> &[f32] {
    &data[i * dim..(i + 1) * dim]
}

/// Squared L2 distance: a plain loop for rows shorter than a SIMD register
/// (PQ chunks of a few dimensions, where the dispatched kernel's set-up
/// cost more than the arithmetic), the dispatched kernel otherwise.
#[inline]
fn l2(a: &[f32], b: &[f32]) -> f32 {
    if a.len() < 8 {
        a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
    } else {
        l2_simd(a, b)
    }
}

#[inline]
fn dist(a: &[f32], b: &[f32]) -> f32 {
    l2(a, b).sqrt()
}

fn run(
    data: &[f32],
    dim: usize,
    n: usize,
    params: &KMeansParams,
    use_lb: bool,
    cancel: Option<&std::sync::atomic::AtomicBool>,
) -> Result<KMeansResult> {
    let k = params.k;
    let mut rng = ChaCha8Rng::seed_from_u64(params.seed);
    let (mut centroids, mut assign, d2) = seed_plusplus(data, dim, n, k, &mut rng, cancel)?;
    let mut upper: Vec<f32> = d2.iter().map(|d| d.sqrt()).collect();
    drop(d2);
    let mut lower: Vec<f32> = if use_lb { vec![0.0; n * k] } else { Vec::new() };
    if use_lb {
        lower
            .par_chunks_mut(k)
            .zip(assign.par_iter().zip(upper.par_iter()))
            .with_min_len(CHUNK)
            .for_each(|(l, (&a, &u))| l[a as usize] = u);
    }

    let mut iters = 0;
    let mut old = vec![0.0f32; k * dim];
    while iters < params.max_iters {
        check(cancel)?;
        old.copy_from_slice(&centroids);
        let moved = update_centroids(data, dim, n, k, &mut assign, &mut centroids);
        iters += 1;
        // Centre drift.
        let drift: Vec<f32> = (0..k)
            .into_par_iter()
            .map(|c| dist(row(&old, dim, c), row(&centroids, dim, c)))
            .collect();
        upper
            .par_iter_mut()
            .zip(assign.par_iter())
            .with_min_len(CHUNK)
            .for_each(|(u, &a)| {
                let d = drift[a as usize];
                if d > 0.0 {
                    *u = (*u + d) * (1.0 + SLACK);
                }
            });
        for &i in &moved {
            upper[i] = dist(row(data, dim, i), row(&centroids, dim, assign[i] as usize));
        }
        if use_lb {
            lower.par_chunks_mut(k * CHUNK).for_each(|block| {
                for l in block.chunks_exact_mut(k) {
                    for (lc, &dc) in l.iter_mut().zip(&drift) {
                        if dc > 0.0 {
                            *lc = ((*lc - dc) * (1.0 - SLACK)).max(0.0);
                        }
                    }
                }
            });
        }
        let changed = assign_step(
            data,
            dim,
            k,
            &centroids,
            &mut assign,
            &mut upper,
            &mut lower,
        );
        if changed == 0 {
            break;
        }
    }

    let inertia = chunked_sum(n, |i| {
        l2(row(data, dim, i), row(&centroids, dim, assign[i] as usize)) as f64
    });
    Ok(KMeansResult {
        centroids,
        assignment: assign,
        iters,
        inertia,
    })
}

/// Sum of `f(i)` over `0..n`, each fixed-size chunk summed in order and the
/// chunk sums added in chunk order: the same bits for any thread count.
fn chunked_sum(n: usize, f: impl Fn(usize) -> f64 + Sync) -> f64 {
    let parts: Vec<f64> = (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .map(|ci| (ci * CHUNK..((ci + 1) * CHUNK).min(n)).map(&f).sum())
        .collect();
    parts.iter().sum()
}

/// k-means++ seeding. Returns the `k × dim` seeds, the index of each point's
/// nearest seed and the squared distance to it.
fn seed_plusplus(
    data: &[f32],
    dim: usize,
    n: usize,
    k: usize,
    rng: &mut ChaCha8Rng,
    cancel: Option<&std::sync::atomic::AtomicBool>,
) -> Result<(Vec<f32>, Vec<u32>, Vec<f32>)> {
    let mut cent = Vec::with_capacity(k * dim);
    let first = rng.random_range(0..n);
    cent.extend_from_slice(row(data, dim, first));
    let mut d2 = vec![0.0f32; n];
    let mut best = vec![0u32; n];
    let mut sums = vec![0.0f64; n.div_ceil(CHUNK)];
    {
        let c0 = &cent[..dim];
        d2.par_chunks_mut(CHUNK)
            .zip(sums.par_iter_mut())
            .enumerate()
            .for_each(|(ci, (d, s))| {
                let mut acc = 0.0f64;
                for (j, dj) in d.iter_mut().enumerate() {
                    *dj = l2(row(data, dim, ci * CHUNK + j), c0);
                    acc += *dj as f64;
                }
                *s = acc;
            });
    }
    // Squared half distances (with slack) from the newest seed to the earlier
    // ones. In low dimension a distance is cheaper than an unpredictable
    // branch, so the pruning test is only used from `SEED_PRUNE_MIN_DIM` on.
    let prune = dim >= SEED_PRUNE_MIN_DIM;
    let mut hsq = vec![0.0f32; k];
    for t in 1..k {
        check(cancel)?;
        let total: f64 = sums.iter().sum();
        let pick = if total > 0.0 && total.is_finite() {
            sample_d2(rng, &d2, &sums, total)
        } else {
            // Every point coincides with a seed: duplicates are unavoidable.
            rng.random_range(0..n)
        };
        cent.extend_from_slice(row(data, dim, pick));
        let (prev, newest) = cent.split_at(t * dim);
        if prune {
            hsq[..t]
                .par_iter_mut()
                .enumerate()
                .with_min_len(64)
                .for_each(|(j, h)| {
                    let half = 0.5 * dist(row(prev, dim, j), newest) * (1.0 - SLACK);
                    *h = half * half;
                });
        }
        let hsq = &hsq;
        d2.par_chunks_mut(CHUNK)
            .zip(best.par_chunks_mut(CHUNK))
            .zip(sums.par_iter_mut())
            .enumerate()
            .for_each(|(ci, ((d, b), s))| {
                let mut acc = [0.0f64; 4];
                for (j, (dj, bj)) in d.iter_mut().zip(b.iter_mut()).enumerate() {
                    // d(x, new) ≥ d(new, best) − d(x, best) ≥ d(x, best) when
                    // d(new, best) ≥ 2·d(x, best).
                    if !prune || hsq[*bj as usize] < *dj {
                        let dn = l2(row(data, dim, ci * CHUNK + j), newest);
                        if dn < *dj {
                            *dj = dn;
                            *bj = t as u32;
                        }
                    }
                    acc[j & 3] += *dj as f64;
                }
                *s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
            });
    }
    Ok((cent, best, d2))
}

/// Draws an index with probability proportional to `d2`.
fn sample_d2(rng: &mut ChaCha8Rng, d2: &[f32], sums: &[f64], total: f64) -> usize {
    let r = rng.random::<f64>() * total;
    let mut cum = 0.0f64;
    let mut chunk = None;
    for (c, &s) in sums.iter().enumerate() {
        if s > 0.0 {
            if cum + s > r {
                chunk = Some(c);
                break;
            }
            cum += s;
        }
    }
    let c = match chunk {
        Some(c) => c,
        None => {
            // Rounding: fall back to the last chunk with mass.
            let c = sums.iter().rposition(|&s| s > 0.0).unwrap_or(0);
            cum = sums[..c].iter().sum();
            c
        }
    };
    let start = c * CHUNK;
    let end = (start + CHUNK).min(d2.len());
    let mut last = start;
    for (i, &v) in d2[start..end].iter().enumerate() {
        if v > 0.0 {
            last = start + i;
            cum += v as f64;
            if cum > r {
                return start + i;
            }
        }
    }
    last
}

/// Recomputes the centroids as the means of their clusters, first moving the
/// points farthest from their centres into empty clusters. Returns the moved
/// points.
fn update_centroids(
    data: &[f32],
    dim: usize,
    n: usize,
    k: usize,
    assign: &mut [u32],
    centroids: &mut [f32],
) -> Vec<usize> {
    let mut counts = vec![0usize; k];
    for &a in assign.iter() {
        counts[a as usize] += 1;
    }
    let mut moved = Vec::new();
    let empties: Vec<usize> = (0..k).filter(|&c| counts[c] == 0).collect();
    if !empties.is_empty() {
        let cents: &[f32] = centroids;
        let assign_ro: &[u32] = assign;
        let d: Vec<f32> = (0..n)
            .into_par_iter()
            .with_min_len(CHUNK)
            .map(|i| l2(row(data, dim, i), row(cents, dim, assign_ro[i] as usize)))
            .collect();
        let mut order: Vec<usize> = (0..n).filter(|&i| d[i] > 0.0).collect();
        order.par_sort_unstable_by(|&a, &b| d[b].total_cmp(&d[a]).then(a.cmp(&b)));
        let mut next = order.into_iter();
        for &e in &empties {
            // Take the farthest remaining point whose cluster keeps a member.
            for i in next.by_ref() {
                let src = assign[i] as usize;
                if counts[src] > 1 {
                    counts[src] -= 1;
                    counts[e] = 1;
                    assign[i] = e as u32;
                    moved.push(i);
                    break;
                }
            }
        }
    }
    // Group the points by cluster (counting sort), then sum each cluster in
    // index order: deterministic whatever the thread count.
    let mut start = vec![0usize; k + 1];
    for c in 0..k {
        start[c + 1] = start[c] + counts[c];
    }
    let mut fill = start.clone();
    let mut members = vec![0u32; n];
    for (i, &a) in assign.iter().enumerate() {
        members[fill[a as usize]] = i as u32;
        fill[a as usize] += 1;
    }
    centroids
        .par_chunks_mut(dim)
        .enumerate()
        .for_each(|(c, cent)| {
            let ms = &members[start[c]..start[c + 1]];
            if ms.is_empty() {
                return;
            }
            let mut acc = vec![0.0f64; dim];
            for &i in ms {
                for (a, &x) in acc.iter_mut().zip(row(data, dim, i as usize)) {
                    *a += x as f64;
                }
            }
            let inv = 1.0 / ms.len() as f64;
            for (c, a) in cent.iter_mut().zip(&acc) {
                *c = (a * inv) as f32;
            }
        });
    moved
}

/// One Elkan assignment pass. Returns the number of points that changed cluster.
fn assign_step(
    data: &[f32],
    dim: usize,
    k: usize,
    centroids: &[f32],
    assign: &mut [u32],
    upper: &mut [f32],
    lower: &mut [f32],
) -> usize {
    // For every centre, the other centres as (½·distance with slack,
    // index): sorted by distance when there are enough points per centre
    // for the early exit to pay for the k² log k sort, in index order
    // otherwise (PQ chunks of one or two dimensions train 256 centres on
    // a few thousand points, where the sort took half the time).
    let n = assign.len();
    let sorted = n >= SORTED_MIN_POINTS_PER_CENTRE * k;
    let per = k - 1;
    let mut nbr = vec![(0.0f32, 0u32); k * per];
    if per > 0 {
        nbr.par_chunks_mut(per).enumerate().for_each(|(a, v)| {
            let ca = row(centroids, dim, a);
            let others = (0..k).filter(|&c| c != a);
            for (e, c) in v.iter_mut().zip(others) {
                *e = (
                    0.5 * dist(ca, row(centroids, dim, c)) * (1.0 - SLACK),
                    c as u32,
                );
            }
            if sorted {
                v.sort_unstable_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
            }
        });
    }
    let s: Vec<f32> = (0..k)
        .map(|a| {
            nbr[a * per..(a + 1) * per]
                .iter()
                .map(|e| e.0)
                .fold(f32::INFINITY, f32::min)
        })
        .collect();
    let ctx = Ctx {
        data,
        dim,
        k,
        centroids,
        nbr: &nbr,
        s: &s,
        sorted,
    };
    let chunks = assign
        .par_chunks_mut(CHUNK)
        .zip(upper.par_chunks_mut(CHUNK));
    if lower.is_empty() {
        chunks
            .enumerate()
            .map(|(ci, (a, u))| ctx.assign_chunk::<false>(ci * CHUNK, a, u, &mut []))
            .sum()
    } else {
        chunks
            .zip(lower.par_chunks_mut(CHUNK * k))
            .enumerate()
            .map(|(ci, ((a, u), l))| ctx.assign_chunk::<true>(ci * CHUNK, a, u, l))
            .sum()
    }
}

struct Ctx<'a> {
    data: &'a [f32],
    dim: usize,
    k: usize,
    centroids: &'a [f32],
    nbr: &'a [(f32, u32)],
    s: &'a [f32],
    /// Whether each centre's `nbr` row is sorted by distance (the scan
    /// stops at the first centre too far to matter).
    sorted: bool,
}

impl Ctx<'_> {
    fn assign_chunk<const LB: bool>(
        &self,
        first: usize,
        assign: &mut [u32],
        upper: &mut [f32],
        lower: &mut [f32],
    ) -> usize {
        let (dim, k) = (self.dim, self.k);
        let per = k - 1;
        let mut changed = 0;
        for (j, (a, u)) in assign.iter_mut().zip(upper.iter_mut()).enumerate() {
            let a0 = *a as usize;
            if *u <= self.s[a0] {
                continue;
            }
            let x = row(self.data, dim, first + j);
            let r = dist(x, row(self.centroids, dim, a0));
            let lb: &mut [f32] = if LB {
                &mut lower[j * k..(j + 1) * k]
            } else {
                &mut []
            };
            if LB {
                lb[a0] = r;
            }
            let (mut best, mut bd) = (a0, r);
            if r > self.s[a0] {
                for &(h, c) in &self.nbr[a0 * per..(a0 + 1) * per] {
                    // d(a0, c) ≥ 2·d(x, a0) ⇒ d(x, c) ≥ d(x, a0) ≥ bd.
                    if r <= h {
                        if self.sorted {
                            break;
                        }
                        continue;
                    }
                    let c = c as usize;
                    if LB && bd <= lb[c] {
                        continue;
                    }
                    let d = dist(x, row(self.centroids, dim, c));
                    if LB {
                        lb[c] = d;
                    }
                    if d < bd {
                        bd = d;
                        best = c;
                    }
                }
            }
            *u = bd;
            if best != a0 {
                *a = best as u32;
                changed += 1;
            }
        }
        changed
    }
}

/// Indices of the `m` centroids nearest to `x` (squared L2), nearest first.
/// Ties go to the lower index; `m` is capped at the number of centroids. An
/// empty result means `dim` is 0 or `x` does not have `dim` values.
pub fn nearest_centroids(centroids: &[f32], dim: usize, x: &[f32], m: usize) -> Vec<u32> {
    if dim == 0 || x.len() != dim || m == 0 {
        return Vec::new();
    }
    let k = centroids.len() / dim;
    let mut d: Vec<(f32, u32)> = (0..k)
        .map(|c| (l2(x, row(centroids, dim, c)), c as u32))
        .collect();
    let cmp = |a: &(f32, u32), b: &(f32, u32)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
    let m = m.min(k);
    if m < k {
        d.select_nth_unstable_by(m - 1, cmp);
        d.truncate(m);
    }
    d.sort_unstable_by(cmp);
    d.into_iter().map(|(_, c)| c).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::l2_f32;
    use rand::Rng;
    use std::sync::atomic::AtomicBool;

    /// Runs `f` and returns its result with the cancel checks it made on
    /// this thread.
    fn counting<R>(f: impl FnOnce() -> R) -> (R, usize) {
        CHECKS.with(|c| c.set(0));
        let r = f();
        (r, CHECKS.with(|c| c.get()))
    }

    /// A cancelled k-means stops at its first check: after the first seed's
    /// distances, before any other seed or iteration. Not cancelled, the
    /// same run checks once per further seed and per iteration.
    #[test]
    fn cancelled_kmeans_stops_after_one_seed() {
        let (data, _) = blobs(8, 200, 16, 4.0, 3);
        let params = KMeansParams {
            k: 64,
            max_iters: 10,
            seed: 1,
        };
        let set = AtomicBool::new(true);
        for lb in [0, LOWER_BOUNDS_MAX_ENTRIES] {
            let (r, checks) = counting(|| kmeans_cancellable(&data, 16, &params, lb, Some(&set)));
            assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
            assert_eq!(checks, 1, "work done after the flag was seen");
        }
        let unset = AtomicBool::new(false);
        let (r, checks) = counting(|| {
            kmeans_cancellable(&data, 16, &params, LOWER_BOUNDS_MAX_ENTRIES, Some(&unset))
        });
        let r = r.unwrap();
        // k - 1 further seeds, then one check per iteration begun.
        assert_eq!(checks, params.k - 1 + r.iters, "{} iterations", r.iters);
        assert!(r.iters >= 1);
    }

    /// `k` well-separated Gaussian-ish blobs of `per` points each.
    fn blobs(k: usize, per: usize, dim: usize, spread: f32, seed: u64) -> (Vec<f32>, Vec<usize>) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let centres: Vec<f32> = (0..k * dim)
            .map(|_| rng.random_range(-100.0..100.0))
            .collect();
        let mut data = Vec::with_capacity(k * per * dim);
        let mut label = Vec::with_capacity(k * per);
        for i in 0..k * per {
            let c = i % k;
            label.push(c);
            for d in 0..dim {
                data.push(centres[c * dim + d] + spread * (rng.random::<f32>() - 0.5));
            }
        }
        (data, label)
    }

    fn uniform(n: usize, dim: usize, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n * dim).map(|_| rng.random::<f32>()).collect()
    }

    fn params(k: usize, max_iters: usize, seed: u64) -> KMeansParams {
        KMeansParams { k, max_iters, seed }
    }

    fn brute_nearest(c: &[f32], dim: usize, x: &[f32]) -> (usize, f32) {
        let mut best = (0, f32::INFINITY);
        for (i, cr) in c.chunks_exact(dim).enumerate() {
            let d = l2_f32(x, cr);
            if d < best.1 {
                best = (i, d);
            }
        }
        best
    }

    /// Plain Lloyd from given centroids: the test oracle.
    fn lloyd(data: &[f32], dim: usize, mut c: Vec<f32>, iters: usize) -> (Vec<f32>, Vec<u32>, f64) {
        let k = c.len() / dim;
        let assign_all = |c: &[f32]| -> Vec<u32> {
            data.chunks_exact(dim)
                .map(|x| brute_nearest(c, dim, x).0 as u32)
                .collect()
        };
        let mut a = assign_all(&c);
        for _ in 0..iters {
            let mut sum = vec![0.0f64; k * dim];
            let mut cnt = vec![0usize; k];
            for (x, &ai) in data.chunks_exact(dim).zip(&a) {
                cnt[ai as usize] += 1;
                for d in 0..dim {
                    sum[ai as usize * dim + d] += x[d] as f64;
                }
            }
            for j in 0..k {
                if cnt[j] > 0 {
                    for d in 0..dim {
                        c[j * dim + d] = (sum[j * dim + d] / cnt[j] as f64) as f32;
                    }
                }
            }
            a = assign_all(&c);
        }
        let inertia = data
            .chunks_exact(dim)
            .zip(&a)
            .map(|(x, &ai)| l2_f32(x, &c[ai as usize * dim..(ai as usize + 1) * dim]) as f64)
            .sum();
        (c, a, inertia)
    }

    #[test]
    fn recovers_separated_clusters() {
        for dim in [3, 24] {
            let (data, label) = blobs(6, 150, dim, 1.0, 7);
            let r = kmeans(&data, dim, &params(6, 50, 1)).unwrap();
            assert_eq!(r.centroids.len(), 6 * dim);
            // Each true blob maps to exactly one cluster and vice versa.
            let mut map = [usize::MAX; 6];
            for (&l, &a) in label.iter().zip(&r.assignment) {
                if map[l] == usize::MAX {
                    map[l] = a as usize;
                }
                assert_eq!(map[l], a as usize, "blob {l} split (dim {dim})");
            }
            let mut seen = map.to_vec();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), 6, "blobs merged (dim {dim})");
            assert!(
                r.inertia / (data.len() as f64) < 0.1,
                "inertia {}",
                r.inertia
            );
        }
    }

    #[test]
    fn inertia_never_increases_and_matches_lloyd() {
        // k = 12 sorts each centre's neighbours (125 points a centre);
        // k = 64 scans them in index order (23 points a centre).
        for (dim, k) in [(4, 12), (20, 12), (1, 64), (4, 64)] {
            assert_eq!(1500 >= SORTED_MIN_POINTS_PER_CENTRE * k, k == 12);
            let data = uniform(1500, dim, 3);
            let seeds = kmeans(&data, dim, &params(k, 0, 5)).unwrap();
            assert_eq!(seeds.iters, 0);
            let mut prev = f64::INFINITY;
            for t in 0..8 {
                let r = kmeans(&data, dim, &params(k, t, 5)).unwrap();
                assert!(
                    r.inertia <= prev * (1.0 + 1e-9),
                    "iter {t}: {} > {prev}",
                    r.inertia
                );
                prev = r.inertia;
                let (c, a, inertia) = lloyd(&data, dim, seeds.centroids.clone(), t);
                assert_eq!(r.assignment, a, "dim {dim} k {k} iters {t}");
                assert!(
                    (r.inertia - inertia).abs() <= 1e-6 * inertia,
                    "{} vs {inertia}",
                    r.inertia
                );
                for (x, y) in r.centroids.iter().zip(&c) {
                    assert!((x - y).abs() <= 1e-5, "centroid {x} vs {y}");
                }
            }
        }
    }

    #[test]
    fn deterministic_across_thread_counts() {
        for dim in [3, 32] {
            let (data, _) = blobs(9, 600, dim, 60.0, 11);
            let run_in = |threads: usize| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap()
                    .install(|| kmeans(&data, dim, &params(17, 15, 42)).unwrap())
            };
            let a = run_in(1);
            let b = run_in(3);
            assert_eq!(a.assignment, b.assignment);
            assert_eq!(a.iters, b.iters);
            assert_eq!(a.inertia.to_bits(), b.inertia.to_bits());
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a.centroids), bits(&b.centroids));
        }
    }

    #[test]
    fn converged_assignment_matches_brute_force() {
        for dim in [2, 8, 16, 40] {
            let data = uniform(3000, dim, dim as u64);
            let r = kmeans(&data, dim, &params(25, 500, 9)).unwrap();
            assert!(r.iters < 500, "did not converge");
            for (x, &a) in data.chunks_exact(dim).zip(&r.assignment) {
                let (_, bd) = brute_nearest(&r.centroids, dim, x);
                let da = l2_f32(x, &r.centroids[a as usize * dim..(a as usize + 1) * dim]);
                assert!(da <= bd * (1.0 + 1e-6), "dim {dim}: {da} vs brute {bd}");
            }
        }
    }

    #[test]
    fn lower_bounds_do_not_change_the_result() {
        let dim = 24;
        let data = uniform(2500, dim, 5);
        let p = params(30, 20, 3);
        let with = kmeans_with_lb_budget(&data, dim, &p, usize::MAX).unwrap();
        let without = kmeans_with_lb_budget(&data, dim, &p, 0).unwrap();
        assert_eq!(with.assignment, without.assignment);
        assert_eq!(with.centroids, without.centroids);
        assert_eq!(with.iters, without.iters);
    }

    #[test]
    fn duplicates_and_k_equal_n() {
        // 3 distinct points, k = 5: duplicated seeds, clusters may stay empty.
        let pts = [[0.0f32, 0.0], [1.0, 1.0], [5.0, -2.0]];
        let data: Vec<f32> = (0..12).flat_map(|i| pts[i % 3]).collect();
        let r = kmeans(&data, 2, &params(5, 10, 0)).unwrap();
        assert_eq!(r.centroids.len(), 10);
        assert_eq!(r.inertia, 0.0);
        assert!(r.assignment.iter().all(|&a| a < 5));
        // k = n: every point alone.
        let data = uniform(40, 3, 1);
        let r = kmeans(&data, 3, &params(40, 10, 2)).unwrap();
        assert_eq!(r.inertia, 0.0);
        let mut a = r.assignment.clone();
        a.sort_unstable();
        a.dedup();
        assert_eq!(a.len(), 40);
    }

    #[test]
    fn empty_clusters_are_reseeded() {
        // Seeds chosen by hand through max_iters = 0 are not reachable, so
        // exercise the update directly: cluster 2 is empty.
        let data = vec![0.0f32, 1.0, 2.0, 10.0, 11.0];
        let mut assign = vec![0u32, 0, 0, 1, 1];
        let mut cent = vec![0.0f32, 10.0, 100.0];
        let moved = update_centroids(&data, 1, 5, 3, &mut assign, &mut cent);
        // Farthest from its centre: point 2 (d = 4) beats 4 (d = 1).
        assert_eq!(moved, vec![2]);
        assert_eq!(assign, vec![0, 0, 2, 1, 1]);
        assert_eq!(cent, vec![0.5, 10.5, 2.0]);
    }

    #[test]
    fn bad_arguments() {
        let data = uniform(10, 2, 0);
        assert!(kmeans(&data, 2, &params(0, 5, 0)).is_err());
        assert!(kmeans(&data, 2, &params(11, 5, 0)).is_err());
        assert!(kmeans(&data, 0, &params(1, 5, 0)).is_err());
        assert!(kmeans(&data[..19], 2, &params(1, 5, 0)).is_err());
        let mut bad = data.clone();
        bad[7] = f32::NAN;
        let e = kmeans(&bad, 2, &params(2, 5, 0)).unwrap_err().to_string();
        assert!(e.contains("row 3"), "{e}");
        bad[7] = f32::INFINITY;
        assert!(kmeans(&bad, 2, &params(2, 5, 0)).is_err());
    }

    #[test]
    fn nearest_centroids_sorted() {
        let c = uniform(50, 5, 4);
        let x = uniform(1, 5, 8);
        let got = nearest_centroids(&c, 5, &x, 7);
        let mut all: Vec<(f32, u32)> = (0..50)
            .map(|i| (l2_f32(&x, &c[i * 5..(i + 1) * 5]), i as u32))
            .collect();
        all.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert_eq!(got, all[..7].iter().map(|p| p.1).collect::<Vec<_>>());
        assert_eq!(nearest_centroids(&c, 5, &x, 100).len(), 50);
        assert!(nearest_centroids(&c, 5, &x[..3], 3).is_empty());
        assert!(nearest_centroids(&c, 0, &x, 3).is_empty());
    }
}

#[cfg(test)]
mod speed {
    use super::*;
    use rand::Rng;

    fn cpu() -> f64 {
        // SAFETY: getrusage only writes the struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `u` is a valid, writable rusage.
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        tv(u.ru_utime) + tv(u.ru_stime)
    }

    /// `cargo test -p nearline --release kmeans_speed -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn kmeans_speed() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        for (n, dim, k) in [(256 << 10, 4, 256), (100_000, 128, 64)] {
            let centres: Vec<f32> = (0..1000 * dim)
                .map(|_| rng.random_range(-10.0..10.0))
                .collect();
            let data: Vec<f32> = (0..n * dim)
                .map(|i| {
                    centres[(i / dim % 1000) * dim + i % dim] + 6.0 * (rng.random::<f32>() - 0.5)
                })
                .collect();
            for iters in [0, 12] {
                let c = cpu();
                let r = pool.install(|| {
                    kmeans(
                        &data,
                        dim,
                        &KMeansParams {
                            k,
                            max_iters: iters,
                            seed: 3,
                        },
                    )
                    .unwrap()
                });
                println!(
                    "n {n} dim {dim} k {k} iters {iters} (ran {}): {:.3}s cpu, inertia {:.4e}",
                    r.iters,
                    cpu() - c,
                    r.inertia
                );
            }
        }
    }
}
