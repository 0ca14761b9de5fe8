//! SPANN's build: balanced hierarchical k-means into small clusters, each
//! cluster's member nearest its centroid as its head (heads are data
//! vectors, as SPTAG's), the heads into the head graph; then every vector
//! searches the head graph and goes into the nearest head's posting and up
//! to `replicas − 1` more, those within SPANN's closure of the nearest and
//! those the RNG rule lets through; postings written contiguously.

use super::posting::{blocks_for, push_entry};
use super::state::{Histogram, PartitionBuildStats, PartitionParams};
use super::store::{PostingRef, Store};
use crate::distance::Metric;
use crate::graph::dynamic::DynamicGraph as Heads;
use crate::graph::vamana::SearchScratch;
use crate::kernels::l2_f32;
use crate::quant::kmeans::{kmeans, nearest_centroids, KMeansParams};
use crate::{Error, Result};
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Most clusters one k-means step splits a set into.
const BRANCH: usize = 16;
/// Rows a k-means step fits on (the rest are assigned to the nearest
/// centroid).
const FIT_ROWS: usize = 20_000;
/// k-means iterations per step.
const ITERS: usize = 10;
/// Heads a vector's replicas are chosen among.
pub const REPLICA_CANDIDATES: usize = 32;
/// List size of the head search that finds them.
pub const REPLICA_L: usize = 64;

/// Clusters of about `target` rows: `(centroids, members)`.
pub fn cluster(
    data: &[f32],
    dim: usize,
    target: usize,
    seed: u64,
    cancel: &AtomicBool,
) -> Result<(Vec<f32>, Vec<Vec<u32>>)> {
    let n = data.len() / dim;
    let target = target.max(1);
    let leaf_max = target + target / 2;
    let mut stack: Vec<Vec<u32>> = vec![(0..n as u32).collect()];
    let mut leaves: Vec<Vec<u32>> = Vec::new();
    let mut step = 0u64;
    while let Some(set) = stack.pop() {
        if cancel.load(Ordering::Relaxed) {
            return Err(Error::Cancelled);
        }
        if set.len() <= leaf_max {
            leaves.push(set);
            continue;
        }
        let b = (set.len() as f64 / target as f64)
            .round()
            .clamp(2.0, BRANCH as f64) as usize;
        step += 1;
        let parts = split(data, dim, &set, b, seed.wrapping_add(step))?;
        stack.extend(parts);
    }
    // Deterministic order: by first member.
    leaves.sort_by_key(|l| l[0]);
    let mut centroids = vec![0f32; leaves.len() * dim];
    for (c, l) in centroids.chunks_exact_mut(dim).zip(&leaves) {
        let mut acc = vec![0f64; dim];
        for &i in l {
            let r = &data[i as usize * dim..(i as usize + 1) * dim];
            for (a, &x) in acc.iter_mut().zip(r) {
                *a += x as f64;
            }
        }
        for (o, a) in c.iter_mut().zip(acc) {
            *o = (a / l.len() as f64) as f32;
        }
    }
    Ok((centroids, leaves))
}

/// Folds the smallest clusters into the cluster with the nearest centroid
/// until `max` remain; centroids are recomputed.
fn fold_smallest(
    data: &[f32],
    dim: usize,
    centroids: Vec<f32>,
    mut leaves: Vec<Vec<u32>>,
    max: usize,
) -> (Vec<f32>, Vec<Vec<u32>>) {
    let k = leaves.len();
    let mut order: Vec<usize> = (0..k).collect();
    order.sort_by_key(|&i| (leaves[i].len(), i));
    let excess = k - max;
    let gone: Vec<bool> = {
        let mut g = vec![false; k];
        for &i in &order[..excess] {
            g[i] = true;
        }
        g
    };
    for &i in &order[..excess] {
        let c = &centroids[i * dim..(i + 1) * dim];
        let into = (0..k)
            .filter(|&j| !gone[j])
            .map(|j| (l2_f32(c, &centroids[j * dim..(j + 1) * dim]), j))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|x| x.1)
            .unwrap_or(0);
        let moved = std::mem::take(&mut leaves[i]);
        leaves[into].extend(moved);
    }
    let leaves: Vec<Vec<u32>> = leaves.into_iter().filter(|l| !l.is_empty()).collect();
    let mut out = vec![0f32; leaves.len() * dim];
    for (c, l) in out.chunks_exact_mut(dim).zip(&leaves) {
        let mut acc = vec![0f64; dim];
        for &i in l {
            for (a, &x) in acc
                .iter_mut()
                .zip(&data[i as usize * dim..(i as usize + 1) * dim])
            {
                *a += x as f64;
            }
        }
        for (o, a) in c.iter_mut().zip(acc) {
            *o = (a / l.len() as f64) as f32;
        }
    }
    (out, leaves)
}

/// Splits `set` into `b` non-empty parts by k-means (halves of the set when
/// k-means cannot separate it, e.g. duplicates).
fn split(data: &[f32], dim: usize, set: &[u32], b: usize, seed: u64) -> Result<Vec<Vec<u32>>> {
    let stride = set.len().div_ceil(FIT_ROWS).max(1);
    let fit: Vec<u32> = set.iter().copied().step_by(stride).collect();
    let mut rows = Vec::with_capacity(fit.len() * dim);
    for &i in &fit {
        rows.extend_from_slice(&data[i as usize * dim..(i as usize + 1) * dim]);
    }
    let k = b.min(fit.len());
    let km = kmeans(
        &rows,
        dim,
        &KMeansParams {
            k,
            max_iters: ITERS,
            seed,
        },
    )?;
    let assign: Vec<u32> = set
        .par_iter()
        .map(|&i| {
            let r = &data[i as usize * dim..(i as usize + 1) * dim];
            nearest_centroids(&km.centroids, dim, r, 1)
                .first()
                .copied()
                .unwrap_or(0)
        })
        .collect();
    let mut parts = vec![Vec::new(); k];
    for (&i, &a) in set.iter().zip(&assign) {
        parts[a as usize].push(i);
    }
    parts.retain(|p| !p.is_empty());
    if parts.len() < 2 {
        let mid = set.len() / 2;
        return Ok(vec![set[..mid].to_vec(), set[mid..].to_vec()]);
    }
    Ok(parts)
}

/// How a vector picks its postings (SPANN's multi-cluster assignment).
#[derive(Debug, Clone, Copy)]
pub struct Replication {
    /// Most postings a vector goes into.
    pub replicas: usize,
    /// The RNG rule's factor: a candidate head `c` is skipped when a head
    /// `h` already chosen has `factor · d(h, c) <= d(x, c)`.
    pub rng_factor: f32,
    /// The closure ε: a candidate within (1 + ε) of the nearest head's
    /// distance is taken whatever the RNG rule says.
    pub closure: f32,
}

impl Replication {
    pub fn of(p: &PartitionParams) -> Replication {
        Replication {
            replicas: p.replicas,
            rng_factor: p.rng_factor,
            closure: p.closure,
        }
    }
}

/// Postings for `x` among `candidates` (its nearest heads found, nearest
/// first, with their distances): the nearest first, then, nearest first,
/// each candidate within the closure of the nearest and each the RNG rule
/// lets through, at most `r.replicas`. Distances are the metric's internal
/// ones (squared for l2): the closure bound is squared to match.
pub fn select_postings(
    heads: &Heads,
    x: &[f32],
    candidates: &[(f32, u32)],
    r: Replication,
) -> Vec<u32> {
    let mut chosen: Vec<u32> = Vec::with_capacity(r.replicas);
    let Some(&(d0, _)) = candidates.first() else {
        return chosen;
    };
    let reach = d0.max(0.0) * (1.0 + r.closure) * (1.0 + r.closure);
    for &(d, c) in candidates {
        if chosen.len() >= r.replicas {
            break;
        }
        if chosen.contains(&c) {
            continue;
        }
        if chosen.is_empty() || (r.closure > 0.0 && d <= reach) {
            chosen.push(c);
            continue;
        }
        let dx = l2_f32(x, heads.vector(c));
        let occluded = chosen
            .iter()
            .any(|&h| r.rng_factor * l2_f32(heads.vector(h), heads.vector(c)) <= dx);
        if !occluded {
            chosen.push(c);
        }
    }
    chosen
}

/// The member of `members` nearest `centre`: a cluster's head is one of its
/// own vectors, as SPANN's are (SPTAG keeps data vectors as heads).
pub fn nearest_member(data: &[f32], dim: usize, members: &[u32], centre: &[f32]) -> u32 {
    members
        .iter()
        .map(|&i| {
            let v = &data[i as usize * dim..(i as usize + 1) * dim];
            (l2_f32(v, centre), i)
        })
        .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
        .map_or(0, |x| x.1)
}

/// Everything a built index starts from.
pub struct Built {
    pub heads: Heads,
    /// The data rows that became heads.
    pub head_rows: Vec<u32>,
    pub postings: Vec<Option<PostingRef>>,
    pub stats: PartitionBuildStats,
}

/// The most heads a build over `n` vectors at `head_ratio` makes (the
/// planner sizes memory for exactly these).
pub fn max_heads(n: usize, head_ratio: f64) -> usize {
    ((n as f64 * head_ratio).floor() as usize).max(1)
}

/// Builds heads and postings over `data` (`n × dim`, already normalised
/// for cosine) with internal ids `0..n`, writing postings into `store`.
pub fn build(
    data: &[f32],
    dim: usize,
    metric: Metric,
    params: &PartitionParams,
    store: &Store,
    progress: &(dyn Fn(&str, u64, u64) + Sync),
    cancel: &AtomicBool,
) -> Result<Built> {
    let t0 = Instant::now();
    let n = data.len() / dim;
    // The planner sized memory for at most n · head_ratio heads: the
    // clusters come out smaller than the target on average, so the target
    // grows until their count fits, and the smallest are folded into their
    // nearest neighbours if a few still remain over.
    let max_heads = max_heads(n, params.head_ratio);
    let mut target = ((1.0 / params.head_ratio).round() as usize).max(1);
    progress("clustering", 0, n as u64);
    let (mut centroids, mut leaves) = cluster(data, dim, target, params.seed, cancel)?;
    for _ in 0..3 {
        if leaves.len() <= max_heads {
            break;
        }
        let grow = leaves.len() as f64 / max_heads as f64 * 1.02;
        target = ((target as f64 * grow).ceil() as usize).max(target + 1);
        (centroids, leaves) = cluster(data, dim, target, params.seed, cancel)?;
    }
    if leaves.len() > max_heads {
        (centroids, leaves) = fold_smallest(data, dim, centroids, leaves, max_heads);
    }
    let k = leaves.len();
    let cluster_seconds = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    // Each cluster's head is its member nearest the centroid.
    let head_rows: Vec<u32> = leaves
        .par_iter()
        .enumerate()
        .map(|(i, l)| nearest_member(data, dim, l, &centroids[i * dim..(i + 1) * dim]))
        .collect();
    let mut heads = Heads::new(dim, metric, k);
    let mut sc = SearchScratch::new();
    for (i, &h) in head_rows.iter().enumerate() {
        if i % 4096 == 0 {
            if cancel.load(Ordering::Relaxed) {
                return Err(Error::Cancelled);
            }
            progress("heads", i as u64, k as u64);
        }
        heads.insert(&data[h as usize * dim..(h as usize + 1) * dim], &mut sc);
    }
    // Every vector searches the head graph: its first posting is the nearest
    // head found, the others pass the closure or the RNG rule.
    progress("assign", 0, n as u64);
    let rep = Replication::of(params);
    let chosen: Vec<Vec<(f32, u32)>> = (0..n)
        .into_par_iter()
        .map_init(SearchScratch::new, |sc, i| {
            let x = &data[i * dim..(i + 1) * dim];
            let cand = heads.search(sc, x, REPLICA_CANDIDATES, REPLICA_L);
            select_postings(&heads, x, &cand, rep)
                .into_iter()
                .map(|p| (l2_f32(x, heads.vector(p)), p))
                .collect()
        })
        .collect();
    if cancel.load(Ordering::Relaxed) {
        return Err(Error::Cancelled);
    }
    // Posting members: primaries first, then replicas nearest first, cut
    // at the build's share of the posting limit (primaries are never cut).
    let cap = params.build_cap();
    let mut members: Vec<Vec<(bool, f32, u32)>> = vec![Vec::new(); k];
    let mut replicas_hist = vec![0u64; params.replicas + 1];
    for (i, c) in chosen.iter().enumerate() {
        replicas_hist[c.len().min(params.replicas)] += 1;
        for (j, &(d, p)) in c.iter().enumerate() {
            members[p as usize].push((j != 0, d, i as u32));
        }
    }
    let mut entries = 0usize;
    let mut cut = 0u64;
    for m in members.iter_mut() {
        m.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
        let primaries = m.iter().filter(|x| !x.0).count();
        let keep = cap.max(primaries);
        cut += m.len().saturating_sub(keep) as u64;
        m.truncate(keep);
        entries += m.len();
    }
    let sizes: Vec<usize> = members.iter().map(|m| m.len()).collect();
    let assign_seconds = t1.elapsed().as_secs_f64();
    let t2 = Instant::now();
    let mut postings = Vec::with_capacity(k);
    let mut stream = Vec::new();
    for (p, m) in members.iter().enumerate() {
        if p % 4096 == 0 {
            if cancel.load(Ordering::Relaxed) {
                return Err(Error::Cancelled);
            }
            progress("write", p as u64, k as u64);
        }
        stream.clear();
        for &(_, _, i) in m {
            push_entry(
                &mut stream,
                i,
                0,
                &data[i as usize * dim..(i as usize + 1) * dim],
            );
        }
        let nb = blocks_for(m.len(), dim).max(1);
        let blocks = store.allocate(nb)?;
        store.write(p as u32, 0, &blocks, &stream)?;
        postings.push(Some(PostingRef {
            blocks,
            count: m.len() as u32,
        }));
    }
    store.sync()?;
    Ok(Built {
        heads,
        head_rows,
        postings,
        stats: PartitionBuildStats {
            seconds: t0.elapsed().as_secs_f64(),
            cluster_seconds,
            assign_seconds,
            write_seconds: t2.elapsed().as_secs_f64(),
            postings: k,
            mean_replicas: entries as f64 / n.max(1) as f64,
            replicas_chosen: replicas_hist,
            replicas_cut: cut,
            posting_sizes: Histogram::of(&sizes),
            calibration: None,
        },
    })
}
