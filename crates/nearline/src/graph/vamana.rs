//! Vamana graph construction (DiskANN): greedy search + robust prune with α,
//! two passes, back-edges; batched parallel insertion so the result depends
//! only on the data, the parameters and the seed, never on the thread count.
//!
//! # Algorithm
//!
//! Points are inserted in a seeded random order (ChaCha8), in batches whose
//! size doubles from 1 up to [`batch_cap`] (the later passes use full-size
//! batches from the start: the graph is already navigable). Within a batch:
//!
//! 1. every point `p` of the batch, in parallel and against the graph as it
//!    was when the batch started, runs a greedy search for itself from
//!    `start` with list size `L`; the expanded nodes (plus, after the first
//!    pass, `p`'s current out-neighbours) are robust-pruned into `p`'s new
//!    out-list (at most `R`);
//! 2. the new out-lists are written;
//! 3. the back-edges `q ← p` are sorted by `(q, p)` and every target `q` is
//!    updated in parallel: its new sources are appended while the list holds
//!    at most `⌈1.3·R⌉` entries (DiskANN's slack), otherwise the union is
//!    robust-pruned back to `R`.
//!
//! Each step reads only the state at its start and writes disjoint lists, so
//! the graph is bit-identical for any number of threads. A final pass prunes
//! every list longer than `R`. The first pass uses α = 1, the last `params.alpha`.

use super::{Graph, PointDistance};
use crate::data::matrix::MatrixView;
use crate::elem::Element;
use crate::{Error, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rayon::prelude::*;
use std::cmp::Ordering;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Mutex;

/// Vamana build parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct VamanaParams {
    /// Maximum out-degree.
    pub r: usize,
    /// Candidate list size of the insertion search.
    pub l: usize,
    /// Pruning parameter of the last pass (first pass uses 1.0).
    pub alpha: f32,
    /// Number of passes over the points (DiskANN: 2).
    pub passes: usize,
    /// Maximum candidates considered by robust prune.
    pub max_candidates: usize,
    /// Seed of the insertion order.
    pub seed: u64,
    /// Fill pruned lists up to R with the nearest remaining candidates when
    /// α > 1 (DiskANN's disk builds do; their graphs have degree R). Off by
    /// default: on 1M × 128 it did not change recall at a given L.
    pub saturate: bool,
}

impl Default for VamanaParams {
    fn default() -> Self {
        VamanaParams {
            r: 64,
            l: 100,
            alpha: 1.2,
            passes: 2,
            max_candidates: 750,
            seed: 0,
            saturate: false,
        }
    }
}

impl VamanaParams {
    /// Checks the parameters; the message names the offending field.
    pub fn validate(&self) -> Result<()> {
        if self.r == 0 {
            return Err(Error::arg(
                "vamana parameter r (max degree) must be at least 1, got 0",
            ));
        }
        if self.r > u32::MAX as usize / 2 {
            return Err(Error::arg(format!(
                "vamana parameter r = {} is too large",
                self.r
            )));
        }
        if self.l == 0 {
            return Err(Error::arg(
                "vamana parameter l (search list size) must be at least 1, got 0",
            ));
        }
        if !self.alpha.is_finite() || self.alpha < 1.0 {
            return Err(Error::arg(format!(
                "vamana parameter alpha must be a finite number >= 1.0, got {}",
                self.alpha
            )));
        }
        if self.passes == 0 {
            return Err(Error::arg(
                "vamana parameter passes must be at least 1, got 0",
            ));
        }
        if self.max_candidates == 0 {
            return Err(Error::arg(
                "vamana parameter max_candidates must be at least 1, got 0",
            ));
        }
        Ok(())
    }
}

/// Degree a list may reach before back-edges force a prune (DiskANN's 1.3 slack).
#[inline]
pub fn slack_degree(r: usize) -> usize {
    r + (r * 3).div_ceil(10)
}

/// Largest insertion batch for `n` points: 2% of the points, between 64 and
/// 4096. Fixed by `n` alone, so the graph does not depend on the thread count.
#[inline]
pub fn batch_cap(n: usize) -> usize {
    (n / 50).clamp(64, 4096)
}

/// A candidate of the greedy search.
#[derive(Clone, Copy, Debug)]
struct Cand {
    d: f32,
    id: u32,
    expanded: bool,
}

#[inline]
fn cmp_pair(ad: f32, aid: u32, bd: f32, bid: u32) -> Ordering {
    ad.total_cmp(&bd).then(aid.cmp(&bid))
}

/// Reusable state of a greedy search: a generation-stamped visited set (O(1)
/// reset), the sorted candidate list and the expanded nodes.
#[derive(Debug, Default)]
pub struct SearchScratch {
    visited: Vec<u32>,
    generation: u32,
    best: Vec<Cand>,
    expanded: Vec<(f32, u32)>,
    pool: Vec<(f32, u32)>,
    pub(crate) out: Vec<u32>,
}

impl SearchScratch {
    /// Empty scratch; it grows to the graph size on first use.
    pub fn new() -> Self {
        Self::default()
    }

    /// The nodes the last search expanded, in expansion order, with their
    /// distances: Vamana's candidate set for an inserted node's edges.
    pub fn expanded(&self) -> &[(f32, u32)] {
        &self.expanded
    }

    #[inline]
    fn begin(&mut self, n: usize) {
        if self.visited.len() < n {
            self.visited.clear();
            self.visited.resize(n, 0);
            self.generation = 0;
        }
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.visited.iter_mut().for_each(|v| *v = 0);
            self.generation = 1;
        }
        self.best.clear();
        self.expanded.clear();
    }

    /// Marks `v` visited; returns whether it was new.
    #[inline]
    fn visit(&mut self, v: u32) -> bool {
        let slot = &mut self.visited[v as usize];
        if *slot == self.generation {
            false
        } else {
            *slot = self.generation;
            true
        }
    }
}

/// Greedy best-first search over `graph` from `start` with list size `l`.
/// Leaves the final candidate list (sorted by `(distance, id)`) in
/// `s.best` and the expanded nodes, in expansion order, in `s.expanded`.
fn greedy<F: Fn(u32) -> f32>(
    graph: &Graph,
    start: u32,
    l: usize,
    dist_to: F,
    s: &mut SearchScratch,
) {
    s.begin(graph.n());
    let l = l.max(1);
    s.visit(start);
    s.best.push(Cand {
        d: dist_to(start),
        id: start,
        expanded: false,
    });
    let mut cur = 0usize;
    while cur < s.best.len() {
        let c = &mut s.best[cur];
        c.expanded = true;
        let (cd, u) = (c.d, c.id);
        s.expanded.push((cd, u));
        let mut next = cur + 1;
        for &v in graph.neighbors(u) {
            if !s.visit(v) {
                continue;
            }
            let d = dist_to(v);
            let len = s.best.len();
            if len == l {
                let w = &s.best[len - 1];
                if cmp_pair(d, v, w.d, w.id) != Ordering::Less {
                    continue;
                }
                s.best.pop();
            }
            let pos = s
                .best
                .partition_point(|c| cmp_pair(c.d, c.id, d, v) == Ordering::Less);
            s.best.insert(
                pos,
                Cand {
                    d,
                    id: v,
                    expanded: false,
                },
            );
            if pos < next {
                next = pos;
            }
        }
        cur = next;
        while cur < s.best.len() && s.best[cur].expanded {
            cur += 1;
        }
    }
}

/// Searches an in-memory graph for the `k` nodes nearest to a query given by
/// `dist_to` (distance from the query to a node), with list size `l`
/// (at least `k`). Returns `(distance, id)` pairs, nearest first.
pub fn search_graph(
    graph: &Graph,
    start: u32,
    l: usize,
    k: usize,
    dist_to: impl Fn(u32) -> f32,
) -> Vec<(f32, u32)> {
    let mut s = SearchScratch::new();
    search_graph_with(&mut s, graph, start, l, k, dist_to)
}

/// [`search_graph`] reusing `scratch` across calls (no per-call allocation of
/// the visited set).
pub fn search_graph_with(
    scratch: &mut SearchScratch,
    graph: &Graph,
    start: u32,
    l: usize,
    k: usize,
    dist_to: impl Fn(u32) -> f32,
) -> Vec<(f32, u32)> {
    if graph.n() == 0 || start as usize >= graph.n() || k == 0 {
        return Vec::new();
    }
    greedy(graph, start, l.max(k), dist_to, scratch);
    scratch.best.iter().take(k).map(|c| (c.d, c.id)).collect()
}

/// Robust prune (DiskANN's α rule) of `pool` (pairs `(d(p, x), x)`) for
/// point `p` into `out`, at most `r` kept out of the `max_c` nearest
/// candidates. `pool` is sorted and deduplicated in place; `out` is nearest
/// first.
///
/// The rule is applied in rounds of growing α, as DiskANN's disk builds do:
/// first with α = 1 (the strict relative-neighbourhood rule), then ×1.2 per
/// round up to `alpha` (the last round uses `alpha` itself). A candidate `x`
/// is kept in a round when, for every kept `y` nearer to `p` than `x`,
/// `d(p, x) / d(y, x) ≤` the round's α. When more than `r` candidates pass
/// the final α, the rounds decide which stay: the strict rule's picks, which
/// include the long edges that make the graph navigable, come first. A
/// single pass at the final α would instead keep the `r` nearest passers and
/// drop those long edges (on wordnet-minilm 115k × 384 at R 64 that cost
/// ~0.6% recall@10 at a given list size, and 1.09× instead of 1.02×
/// diskannpy's reads at recall 0.95).
#[allow(clippy::too_many_arguments)]
pub(crate) fn robust_prune<D: PointDistance + ?Sized>(
    space: &D,
    p: u32,
    pool: &mut Vec<(f32, u32)>,
    alpha: f32,
    r: usize,
    max_c: usize,
    saturate: bool,
    out: &mut Vec<u32>,
) {
    out.clear();
    pool.sort_unstable_by(|a, b| cmp_pair(a.0, a.1, b.0, b.1));
    pool.dedup_by_key(|x| x.1);
    pool.retain(|x| x.1 != p);
    pool.truncate(max_c);
    PRUNE.with(|cell| {
        let mut st = cell.borrow_mut();
        occlusion_rounds(space, pool, alpha, r, &mut st);
        let mut kept = st.picks.len();
        let occ = &mut st.occ;
        // Saturation (DiskANN's disk builds): fill the slots the α rule left
        // empty with the nearest remaining candidates, so every pruned list has
        // R entries. Denser lists cost PQ work per hop but raise recall at a
        // given list size, which is what disk reads pay for.
        if saturate && kept < r {
            for f in occ.iter_mut() {
                if kept >= r {
                    break;
                }
                if *f != PICKED {
                    *f = PICKED;
                    kept += 1;
                }
            }
        }
        // The pool is nearest first, so its order is the list's.
        out.extend(
            pool.iter()
                .zip(occ.iter())
                .filter(|&(_, &f)| f == PICKED)
                .map(|(&(_, x), _)| x),
        );
    });
}

/// Occlusion factor of a candidate taken into the list.
const PICKED: f32 = f32::INFINITY;
/// Occlusion factor of a candidate that can never be kept: at distance 0 from
/// a kept one, or with no finite ratio (finite, so distinct from [`PICKED`]).
const EXCLUDED: f32 = f32::MAX;
/// Growth of α between pruning rounds (DiskANN's).
const ALPHA_STEP: f32 = 1.2;

/// Per-thread state of [`robust_prune`] (no allocation per call).
#[derive(Debug, Default)]
struct PruneState {
    /// Per candidate: [`PICKED`], or the largest `d(p, x) / d(y, x)` over the
    /// kept `y` ahead of it checked so far.
    occ: Vec<f32>,
    /// Per candidate: how many entries of `picks` it has been checked against.
    checked: Vec<u32>,
    /// Positions of the kept candidates, in the order they were kept.
    picks: Vec<u32>,
}

thread_local! {
    static PRUNE: std::cell::RefCell<PruneState> = std::cell::RefCell::new(PruneState::default());
}

/// The rounds of [`robust_prune`] over a sorted, deduplicated `pool` without
/// `p`: on return `st.occ[i] == PICKED` exactly for the kept candidates (at
/// most `r`), whose positions `st.picks` lists.
///
/// A round walks the candidates nearest first and keeps `x` unless some kept
/// `y` ahead of it has `d(p, x) / d(y, x) >` the round's α (or `d(y, x) = 0`).
/// The ratios are evaluated lazily: a candidate is checked against the picks
/// made since its last check only when a round reaches it, and the check
/// stops at the first `y` that occludes it at this round's α (a later round
/// resumes from there). The kept set is the one of DiskANN's eager rule, which
/// scores every candidate after each pick (see the test twin), at a fraction of
/// the distance computations.
fn occlusion_rounds<D: PointDistance + ?Sized>(
    space: &D,
    pool: &[(f32, u32)],
    alpha: f32,
    r: usize,
    st: &mut PruneState,
) {
    let n = pool.len();
    st.occ.clear();
    st.occ.resize(n, 0.0);
    st.checked.clear();
    st.checked.resize(n, 0);
    st.picks.clear();
    let mut round_alpha = alpha.min(1.0);
    loop {
        for i in 0..n {
            if st.picks.len() >= r {
                return;
            }
            let mut f = st.occ[i];
            if f > round_alpha {
                continue;
            }
            let (dx, x) = pool[i];
            let mut c = st.checked[i] as usize;
            while c < st.picks.len() && f <= round_alpha {
                let at = st.picks[c] as usize;
                c += 1;
                if at >= i {
                    continue;
                }
                let d = space.dist(pool[at].1, x);
                let ratio = dx / d;
                f = if d == 0.0 || !ratio.is_finite() {
                    EXCLUDED
                } else {
                    f.max(ratio)
                };
            }
            st.checked[i] = c as u32;
            if f > round_alpha {
                st.occ[i] = f;
                continue;
            }
            st.occ[i] = PICKED;
            st.picks.push(i as u32);
        }
        if round_alpha >= alpha {
            return;
        }
        round_alpha = (round_alpha * ALPHA_STEP).min(alpha);
    }
}

/// Per-thread scratch slots, indexed by the rayon thread index.
pub(crate) struct Slots(Vec<Mutex<SearchScratch>>);

impl Slots {
    pub(crate) fn new() -> Self {
        let t = rayon::current_num_threads().max(1);
        Slots((0..t).map(|_| Mutex::new(SearchScratch::new())).collect())
    }
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut SearchScratch) -> R) -> R {
        let i = rayon::current_thread_index().unwrap_or(0) % self.0.len();
        // A poisoned slot only means another task panicked mid-search; the
        // scratch is reset at the start of every search, so reuse it.
        let mut g = match self.0[i].lock() {
            Ok(g) => g,
            Err(e) => e.into_inner(),
        };
        f(&mut g)
    }
}

/// Builds a Vamana graph over `space` starting from `start` (the medoid).
/// `progress(done, total)` is called from the calling thread between batches;
/// when `cancel` becomes true the build stops with [`Error::Cancelled`].
/// Runs on the caller's current rayon pool.
pub fn build_vamana<D: PointDistance>(
    space: &D,
    start: u32,
    params: &VamanaParams,
    progress: &(dyn Fn(u64, u64) + Sync),
    cancel: &AtomicBool,
) -> Result<Graph> {
    params.validate()?;
    let n = space.n();
    if n == 0 {
        return Err(Error::arg("cannot build a graph over 0 points"));
    }
    if n > u32::MAX as usize {
        return Err(Error::arg(format!(
            "too many points for a graph: {n} (at most {})",
            u32::MAX
        )));
    }
    if start as usize >= n {
        return Err(Error::arg(format!(
            "graph start node {start} is out of range: expected < n = {n}"
        )));
    }
    let r = params.r;
    let total = (params.passes * n) as u64;
    if n == 1 {
        progress(total, total);
        return Ok(Graph::new(1, r));
    }
    let cap = slack_degree(r);
    let mut g = Graph::new(n, cap);
    let mut order: Vec<u32> = (0..n as u32).collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(params.seed);
    order.shuffle(&mut rng);
    let slots = Slots::new();
    let bcap = batch_cap(n);
    let mut done = 0u64;
    progress(0, total);

    for pass in 0..params.passes {
        let alpha = if pass + 1 == params.passes {
            params.alpha
        } else {
            1.0
        };
        let mut bs = if pass == 0 { 1 } else { bcap };
        let mut i = 0usize;
        while i < n {
            if cancel.load(AtomicOrdering::Relaxed) {
                return Err(Error::Cancelled);
            }
            let end = (i + bs).min(n);
            insert_batch(
                space,
                &mut g,
                start,
                &order[i..end],
                params,
                alpha,
                pass > 0,
                &slots,
            );
            done += (end - i) as u64;
            progress(done, total);
            i = end;
            bs = (bs * 2).min(bcap);
        }
    }
    if cancel.load(AtomicOrdering::Relaxed) {
        return Err(Error::Cancelled);
    }
    // Final cleanup: prune every list over R, a chunk at a time so the pruned
    // lists held before they are written back stay small (a list per node
    // at once cost ~120 bytes per node, outside the build estimate).
    let over: Vec<u32> = (0..n as u32).filter(|&v| g.degree(v) > r).collect();
    for chunk in over.chunks(PRUNE_CHUNK) {
        if cancel.load(AtomicOrdering::Relaxed) {
            return Err(Error::Cancelled);
        }
        let pruned: Vec<Vec<u32>> = chunk
            .par_iter()
            .map(|&v| {
                slots.with(|s| {
                    prune_list(
                        space,
                        &g,
                        v,
                        &[],
                        params.alpha,
                        r,
                        params.max_candidates,
                        params.saturate && params.alpha > 1.0,
                        s,
                    );
                    s.out.clone()
                })
            })
            .collect();
        for (&v, list) in chunk.iter().zip(&pruned) {
            g.set_neighbors(v, list);
        }
    }
    drop(over);
    slots.with(|s| connect_unreachable(space, &mut g, start, r, params.l, s));
    g.shrink_degree(r);
    Ok(g)
}

/// Nodes pruned per parallel step of the final cleanup.
pub(crate) const PRUNE_CHUNK: usize = 4096;

/// Marks in `seen` every node reachable from `from`; returns how many were new.
fn mark_reachable(g: &Graph, from: u32, seen: &mut [bool], stack: &mut Vec<u32>) -> usize {
    let mut count = 0;
    if !seen[from as usize] {
        seen[from as usize] = true;
        count += 1;
    }
    stack.clear();
    stack.push(from);
    while let Some(v) = stack.pop() {
        for &u in g.neighbors(v) {
            if !seen[u as usize] {
                seen[u as usize] = true;
                count += 1;
                stack.push(u);
            }
        }
    }
    count
}

/// Makes every node reachable from `start`: a node `u` the build left without
/// a path (its in-edges were all pruned: rare, except among exact duplicates,
/// which occlude one another) gets an in-edge from the nearest reachable node
/// `w` the search for it finds, preferring one with a free slot.
///
/// When every candidate `w` is full, `w` gives up its farthest edge `w → t`
/// for `w → u`, and `u` takes over `u → t` (appended, or in place of its own
/// farthest edge). No reachable node loses its path: a path through `w → t`
/// now runs `w → u → t`, and `u`'s old out-edges lay on no path from `start`
/// because `u` was unreachable. Every repair therefore adds `u` (and what it
/// reaches) to the reachable set and loses nothing, so one sweep connects the
/// whole graph. Sequential and deterministic; costs one traversal when nothing
/// is unreachable.
pub(crate) fn connect_unreachable<D: PointDistance + ?Sized>(
    space: &D,
    g: &mut Graph,
    start: u32,
    r: usize,
    l: usize,
    s: &mut SearchScratch,
) {
    let n = g.n();
    if n == 0 || r == 0 {
        return;
    }
    let mut stack = Vec::new();
    let mut seen = vec![false; n];
    let mut reached = mark_reachable(g, start, &mut seen, &mut stack);
    for u in 0..n as u32 {
        if reached == n {
            return;
        }
        if seen[u as usize] {
            continue;
        }
        greedy(g, start, l.max(8), |x| space.dist(u, x), s);
        let pick = s
            .best
            .iter()
            .find(|c| c.id != u && g.degree(c.id) < r)
            .or_else(|| s.best.iter().find(|c| c.id != u))
            .map(|c| c.id);
        let Some(w) = pick else { continue };
        if g.degree(w) < r {
            g.push_neighbor(w, u);
        } else {
            // Lists are nearest-first: the last entry is the farthest.
            let mut list = g.neighbors(w).to_vec();
            list.truncate(r);
            let t = list.pop();
            list.push(u);
            g.set_neighbors(w, &list);
            if let Some(t) = t.filter(|&t| t != u && !g.neighbors(u).contains(&t)) {
                if g.degree(u) < r {
                    g.push_neighbor(u, t);
                } else {
                    let mut own = g.neighbors(u).to_vec();
                    own.truncate(r - 1);
                    own.push(t);
                    g.set_neighbors(u, &own);
                }
            }
        }
        reached += mark_reachable(g, u, &mut seen, &mut stack);
    }
}

/// Prunes the current list of `v` plus `extra` into `s.out`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn prune_list<D: PointDistance + ?Sized>(
    space: &D,
    g: &Graph,
    v: u32,
    extra: &[u32],
    alpha: f32,
    r: usize,
    max_c: usize,
    saturate: bool,
    s: &mut SearchScratch,
) {
    s.pool.clear();
    for &u in g.neighbors(v).iter().chain(extra) {
        s.pool.push((space.dist(v, u), u));
    }
    let mut pool = std::mem::take(&mut s.pool);
    robust_prune(space, v, &mut pool, alpha, r, max_c, saturate, &mut s.out);
    s.pool = pool;
}

/// Inserts one batch (see the module documentation).
#[allow(clippy::too_many_arguments)]
pub(crate) fn insert_batch<D: PointDistance>(
    space: &D,
    g: &mut Graph,
    start: u32,
    batch: &[u32],
    params: &VamanaParams,
    alpha: f32,
    keep_old: bool,
    slots: &Slots,
) {
    let r = params.r;
    let cap = g.r();
    // 1. Search and prune against the graph at the batch start.
    let outs: Vec<Vec<u32>> = {
        let g: &Graph = g;
        batch
            .par_iter()
            .map(|&p| {
                slots.with(|s| {
                    greedy(g, start, params.l, |x| space.dist(p, x), s);
                    let mut pool = std::mem::take(&mut s.pool);
                    pool.clear();
                    pool.extend_from_slice(&s.expanded);
                    if keep_old {
                        for &u in g.neighbors(p) {
                            pool.push((space.dist(p, u), u));
                        }
                    }
                    robust_prune(
                        space,
                        p,
                        &mut pool,
                        alpha,
                        r,
                        params.max_candidates,
                        params.saturate && alpha > 1.0,
                        &mut s.out,
                    );
                    s.pool = pool;
                    s.out.clone()
                })
            })
            .collect()
    };
    // 2. Write the out-lists.
    let mut pairs: Vec<(u32, u32)> = Vec::with_capacity(outs.iter().map(Vec::len).sum());
    for (&p, out) in batch.iter().zip(&outs) {
        g.set_neighbors(p, out);
        pairs.extend(out.iter().map(|&q| (q, p)));
    }
    drop(outs);
    // 3. Back-edges grouped by target.
    pairs.sort_unstable();
    let mut groups: Vec<(usize, usize)> = Vec::new();
    let mut a = 0usize;
    while a < pairs.len() {
        let q = pairs[a].0;
        let mut b = a + 1;
        while b < pairs.len() && pairs[b].0 == q {
            b += 1;
        }
        groups.push((a, b));
        a = b;
    }
    let updates: Vec<Option<Vec<u32>>> = {
        let g: &Graph = g;
        let pairs = &pairs;
        groups
            .par_iter()
            .map(|&(a, b)| {
                let q = pairs[a].0;
                let list = g.neighbors(q);
                let fresh = pairs[a..b]
                    .iter()
                    .filter(|&&(_, p)| !list.contains(&p))
                    .count();
                if list.len() + fresh <= cap {
                    return None;
                }
                slots.with(|s| {
                    s.out.clear();
                    let extra: Vec<u32> = pairs[a..b].iter().map(|&(_, p)| p).collect();
                    prune_list(
                        space,
                        g,
                        q,
                        &extra,
                        alpha,
                        r,
                        params.max_candidates,
                        params.saturate && alpha > 1.0,
                        s,
                    );
                    Some(s.out.clone())
                })
            })
            .collect()
    };
    for (&(a, b), upd) in groups.iter().zip(updates) {
        let q = pairs[a].0;
        match upd {
            Some(list) => g.set_neighbors(q, &list),
            None => {
                for &(_, p) in &pairs[a..b] {
                    if !g.neighbors(q).contains(&p) {
                        g.push_neighbor(q, p);
                    }
                }
            }
        }
    }
}

/// Rows per block of the parallel mean: fixed, so the sum order (and thus
/// the result) does not depend on the thread count.
const MEAN_BLOCK: usize = 4096;

/// The mean of the rows of `data` in f64, summed in fixed blocks
/// (deterministic for any thread count).
pub fn mean_f64<T: Element>(data: MatrixView<'_, T>) -> Vec<f64> {
    let n = data.n();
    let mut mean = sum_f64(data);
    if n > 0 {
        mean.iter_mut().for_each(|m| *m /= n as f64);
    }
    mean
}

/// The sum of the rows of `data` in f64, summed in fixed blocks
/// (deterministic for any thread count).
pub fn sum_f64<T: Element>(data: MatrixView<'_, T>) -> Vec<f64> {
    let (n, dim) = (data.n(), data.dim());
    let mut mean = vec![0f64; dim];
    if n == 0 {
        return mean;
    }
    let blocks: Vec<Vec<f64>> = (0..n.div_ceil(MEAN_BLOCK))
        .into_par_iter()
        .map(|b| {
            let mut acc = vec![0f64; dim];
            for i in b * MEAN_BLOCK..((b + 1) * MEAN_BLOCK).min(n) {
                for (a, &x) in acc.iter_mut().zip(data.row(i)) {
                    *a += x.to_f32() as f64;
                }
            }
            acc
        })
        .collect();
    for acc in &blocks {
        for (m, a) in mean.iter_mut().zip(acc) {
            *m += a;
        }
    }
    mean
}

/// The row of `data` nearest (squared L2) to `center`; ties go to the
/// smaller id. Parallel and deterministic.
pub fn nearest_row<T: Element>(data: MatrixView<'_, T>, center: &[f32]) -> u32 {
    nearest_row_dist(data, center).map(|x| x.1).unwrap_or(0)
}

/// `(squared distance, row)` of the row of `data` nearest to `center`
/// (ties: smaller row); `None` when `data` is empty.
pub fn nearest_row_dist<T: Element>(data: MatrixView<'_, T>, center: &[f32]) -> Option<(f32, u32)> {
    (0..data.n())
        .into_par_iter()
        .map(|i| {
            let d: f32 = data
                .row(i)
                .iter()
                .zip(center)
                .map(|(&x, &c)| {
                    let t = x.to_f32() - c;
                    t * t
                })
                .sum();
            (d, i as u32)
        })
        .min_by(|a, b| cmp_pair(a.0, a.1, b.0, b.1))
}

/// Total order on `(distance, id)` pairs used for every tie-break.
#[inline]
pub(crate) fn cmp_dist_id(a: (f32, u32), b: (f32, u32)) -> Ordering {
    cmp_pair(a.0, a.1, b.0, b.1)
}

/// The point nearest to the mean of `data` (parallel).
pub fn medoid<T: Element>(data: MatrixView<'_, T>) -> u32 {
    let mean: Vec<f32> = mean_f64(data).iter().map(|&m| m as f32).collect();
    nearest_row(data, &mean)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::data::matrix::Matrix;
    use crate::distance::Metric;
    use crate::graph::MatrixSpace;
    use rand::Rng;

    /// `n` points of dimension `dim`: Gaussian-ish clusters around `clusters`
    /// random centres (uniform noise summed), seeded.
    pub(crate) fn clustered(n: usize, dim: usize, clusters: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let centres: Vec<f32> = (0..clusters * dim)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let mut out = Vec::with_capacity(n * dim);
        for _ in 0..n {
            let c = rng.random_range(0..clusters);
            for j in 0..dim {
                let noise: f32 = (0..3).map(|_| rng.random_range(-0.5f32..0.5)).sum();
                out.push(centres[c * dim + j] + 0.5 * noise);
            }
        }
        out
    }

    pub(crate) fn uniform(n: usize, dim: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n * dim)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect()
    }

    /// Exact top-k ids by `dist`.
    pub(crate) fn brute_topk(n: usize, k: usize, dist: impl Fn(u32) -> f32) -> Vec<u32> {
        let mut all: Vec<(f32, u32)> = (0..n as u32).map(|i| (dist(i), i)).collect();
        all.sort_by(|a, b| cmp_pair(a.0, a.1, b.0, b.1));
        all.iter().take(k).map(|x| x.1).collect()
    }

    /// Mean recall@k of graph searches with list size `l` over `queries`.
    pub(crate) fn recall_l2(
        g: &Graph,
        start: u32,
        data: &[f32],
        queries: &[f32],
        dim: usize,
        l: usize,
        k: usize,
    ) -> f64 {
        let n = data.len() / dim;
        let nq = queries.len() / dim;
        let mut hit = 0usize;
        let mut scratch = SearchScratch::new();
        for qi in 0..nq {
            let q = &queries[qi * dim..(qi + 1) * dim];
            let d = |i: u32| f32::l2_sq(q, &data[i as usize * dim..(i as usize + 1) * dim]);
            let truth = brute_topk(n, k, d);
            let got = search_graph_with(&mut scratch, g, start, l, k, d);
            hit += got.iter().filter(|x| truth.contains(&x.1)).count();
        }
        hit as f64 / (nq * k) as f64
    }

    pub(crate) fn check_invariants(g: &Graph, r: usize) {
        assert_eq!(g.r(), r);
        for v in 0..g.n() as u32 {
            let nb = g.neighbors(v);
            assert!(nb.len() <= r, "node {v} has degree {} > {r}", nb.len());
            assert!(!nb.contains(&v), "self loop at {v}");
            let mut s = nb.to_vec();
            s.sort_unstable();
            s.dedup();
            assert_eq!(s.len(), nb.len(), "duplicate neighbours at {v}");
            assert!(nb.iter().all(|&u| (u as usize) < g.n()));
        }
    }

    pub(crate) fn reachable(g: &Graph, start: u32) -> usize {
        let mut seen = vec![false; g.n()];
        let mut stack = vec![start];
        seen[start as usize] = true;
        let mut count = 1;
        while let Some(v) = stack.pop() {
            for &u in g.neighbors(v) {
                if !seen[u as usize] {
                    seen[u as usize] = true;
                    count += 1;
                    stack.push(u);
                }
            }
        }
        count
    }

    fn params(r: usize, l: usize) -> VamanaParams {
        VamanaParams {
            r,
            l,
            ..VamanaParams::default()
        }
    }

    fn build(data: &[f32], dim: usize, metric: Metric, p: &VamanaParams) -> (Graph, u32) {
        let m = Matrix::from_vec(data.to_vec(), data.len() / dim, dim).unwrap();
        let space = MatrixSpace::new(m.view(), metric);
        let start = medoid(m.view());
        let g = build_vamana(&space, start, p, &|_, _| {}, &AtomicBool::new(false)).unwrap();
        (g, start)
    }

    #[test]
    fn vamana_recall_l2_random_32d() {
        let dim = 32;
        let data = uniform(5000, dim, 1);
        let queries = uniform(100, dim, 2);
        let (g, start) = build(&data, dim, Metric::L2, &params(32, 64));
        check_invariants(&g, 32);
        let rec = recall_l2(&g, start, &data, &queries, dim, 100, 10);
        assert!(rec >= 0.95, "recall@10 = {rec}");
        assert_eq!(
            reachable(&g, start),
            5000,
            "every node reachable from the medoid"
        );
        assert!(g.mean_degree() > 8.0);
    }

    #[test]
    fn vamana_recall_clustered_and_reachable() {
        let dim = 16;
        let data = clustered(4000, dim, 20, 3);
        let queries = clustered(100, dim, 20, 3_000);
        let (g, start) = build(&data, dim, Metric::L2, &params(24, 50));
        check_invariants(&g, 24);
        assert_eq!(reachable(&g, start), 4000);
        let rec = recall_l2(&g, start, &data, &queries, dim, 100, 10);
        assert!(rec >= 0.95, "recall@10 = {rec}");
    }

    #[test]
    fn vamana_deterministic_across_thread_counts() {
        let dim = 8;
        let data = clustered(1500, dim, 10, 5);
        let p = VamanaParams {
            seed: 42,
            ..params(16, 32)
        };
        let graphs: Vec<Graph> = [1usize, 2, 3]
            .iter()
            .map(|&t| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(t)
                    .build()
                    .unwrap();
                pool.install(|| build(&data, dim, Metric::L2, &p).0)
            })
            .collect();
        assert_eq!(graphs[0], graphs[1]);
        assert_eq!(graphs[0], graphs[2]);
        // A different seed gives a different (still valid) graph.
        let other = build(
            &data,
            dim,
            Metric::L2,
            &VamanaParams {
                seed: 7,
                ..p.clone()
            },
        )
        .0;
        assert_ne!(graphs[0], other);
        check_invariants(&other, 16);
    }

    #[test]
    fn vamana_progress_and_cancel() {
        let dim = 4;
        let data = uniform(2000, dim, 9);
        let m = Matrix::from_vec(data, 2000, dim).unwrap();
        let space = MatrixSpace::new(m.view(), Metric::L2);
        let p = params(8, 16);
        // Progress is monotone and ends at passes * n.
        let last = std::sync::Mutex::new((0u64, 0u64));
        let g = build_vamana(
            &space,
            0,
            &p,
            &|d, t| {
                let mut l = last.lock().unwrap();
                assert!(d >= l.0);
                *l = (d, t);
            },
            &AtomicBool::new(false),
        )
        .unwrap();
        assert_eq!(*last.lock().unwrap(), (4000, 4000));
        check_invariants(&g, 8);
        // Cancel after the first few batches.
        let cancel = AtomicBool::new(false);
        let res = build_vamana(
            &space,
            0,
            &p,
            &|d, _| {
                if d > 100 {
                    cancel.store(true, AtomicOrdering::Relaxed);
                }
            },
            &cancel,
        );
        assert!(matches!(res, Err(Error::Cancelled)));
    }

    #[test]
    fn vamana_bad_parameters() {
        let data = uniform(10, 2, 1);
        let m = Matrix::from_vec(data, 10, 2).unwrap();
        let space = MatrixSpace::new(m.view(), Metric::L2);
        let no = AtomicBool::new(false);
        let run = |p: VamanaParams, start: u32| build_vamana(&space, start, &p, &|_, _| {}, &no);
        assert!(matches!(
            run(params(0, 10), 0),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            run(params(4, 0), 0),
            Err(Error::InvalidArgument(_))
        ));
        for a in [0.5f32, f32::NAN, f32::INFINITY] {
            let p = VamanaParams {
                alpha: a,
                ..params(4, 10)
            };
            assert!(matches!(run(p, 0), Err(Error::InvalidArgument(_))));
        }
        let p = VamanaParams {
            passes: 0,
            ..params(4, 10)
        };
        assert!(matches!(run(p, 0), Err(Error::InvalidArgument(_))));
        assert!(matches!(
            run(params(4, 10), 10),
            Err(Error::InvalidArgument(_))
        ));
        let empty = Matrix::<f32>::from_vec(Vec::new(), 0, 2).unwrap();
        let es = MatrixSpace::new(empty.view(), Metric::L2);
        assert!(matches!(
            build_vamana(&es, 0, &params(4, 10), &|_, _| {}, &no),
            Err(Error::InvalidArgument(_))
        ));
        // One point: no edges; l < r is allowed.
        let one = Matrix::from_vec(vec![1.0f32, 2.0], 1, 2).unwrap();
        let os = MatrixSpace::new(one.view(), Metric::L2);
        let g = build_vamana(&os, 0, &params(4, 2), &|_, _| {}, &no).unwrap();
        assert_eq!((g.n(), g.num_edges()), (1, 0));
        let g = run(params(4, 2), 3).unwrap();
        check_invariants(&g, 4);
    }

    #[test]
    fn vamana_single_pass_and_duplicates() {
        // Many exact duplicates must not break invariants or connectivity.
        let dim = 3;
        let mut data = uniform(300, dim, 4);
        let copy = data[..dim].to_vec();
        for i in 0..100 {
            data[i * dim..(i + 1) * dim].copy_from_slice(&copy);
        }
        let p = VamanaParams {
            passes: 1,
            ..params(8, 20)
        };
        let (g, start) = build(&data, dim, Metric::L2, &p);
        check_invariants(&g, 8);
        assert_eq!(reachable(&g, start), 300);
    }

    #[test]
    fn vamana_inner_product_recall() {
        let dim = 24;
        let n = 4000;
        let mut data = clustered(n + 100, dim, 16, 11);
        let queries = data.split_off(n * dim);
        // Spread the norms so MIPS differs from L2.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
        for i in 0..n {
            let s = rng.random_range(0.3f32..2.0);
            data[i * dim..(i + 1) * dim]
                .iter_mut()
                .for_each(|x| *x *= s);
        }
        let m = Matrix::from_vec(data.clone(), n, dim).unwrap();
        let space = MatrixSpace::new(m.view(), Metric::InnerProduct);
        let extra = space.extra().unwrap();
        assert!(extra.iter().all(|&e| e >= 0.0 && e.is_finite()));
        assert!(extra.contains(&0.0));
        let start = medoid(m.view());
        let g = build_vamana(
            &space,
            start,
            &params(32, 64),
            &|_, _| {},
            &AtomicBool::new(false),
        )
        .unwrap();
        check_invariants(&g, 32);
        let mut hit = 0;
        for qi in 0..100 {
            let q = &queries[qi * dim..(qi + 1) * dim];
            let d = |i: u32| -f32::dot(q, m.row(i as usize));
            let truth = brute_topk(n, 10, d);
            let got = search_graph(&g, start, 100, 10, d);
            hit += got.iter().filter(|x| truth.contains(&x.1)).count();
        }
        let rec = hit as f64 / 1000.0;
        eprintln!("MIPS recall {rec}");
        assert!(rec >= 0.9, "MIPS recall@10 = {rec}");
    }

    #[test]
    fn medoid_is_nearest_to_mean() {
        let data = vec![0.0f32, 0.0, 10.0, 10.0, 4.0, 5.0, 6.0, 5.0];
        let m = Matrix::from_vec(data, 4, 2).unwrap();
        // mean (5, 5): rows 2 and 3 tie at distance 1: smaller id wins.
        assert_eq!(medoid(m.view()), 2);
        let m = Matrix::from_vec(vec![3u8, 1, 2], 3, 1).unwrap();
        assert_eq!(medoid(m.view()), 2);
    }

    #[test]
    fn search_graph_edge_cases() {
        let g = Graph::new(0, 4);
        assert!(search_graph(&g, 0, 10, 5, |_| 0.0).is_empty());
        let mut g = Graph::new(3, 2);
        g.set_neighbors(0, &[1, 2]);
        let r = search_graph(&g, 0, 1, 2, |i| [5.0, 1.0, 3.0][i as usize]);
        assert_eq!(r, vec![(1.0, 1), (3.0, 2)]);
        assert!(search_graph(&g, 3, 10, 2, |_| 0.0).is_empty());
    }

    #[test]
    fn graph_shrink_degree_keeps_lists() {
        let mut g = Graph::new(3, 5);
        g.set_neighbors(0, &[1, 2]);
        g.set_neighbors(1, &[0]);
        g.set_neighbors(2, &[0, 1, 0]);
        assert!(g.push_neighbor(1, 2));
        g.shrink_degree(3);
        assert_eq!(g.r(), 3);
        assert_eq!(g.neighbors(0), &[1, 2]);
        assert_eq!(g.neighbors(1), &[0, 2]);
        assert_eq!(g.neighbors(2), &[0, 1, 0]);
        assert_eq!(g.memory_bytes(), (3 + 9) * 4);
    }

    /// Build-speed probe: `cargo test --release -p nearline graph_speed -- --ignored --nocapture`.
    /// `NEARLINE_SPEED_N` / `NEARLINE_SPEED_PASSES` override the defaults.
    #[test]
    #[ignore]
    fn graph_speed() {
        let env = |k: &str, d: usize| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        let n = env("NEARLINE_SPEED_N", 100_000);
        let passes = env("NEARLINE_SPEED_PASSES", 2);
        let threads = env("NEARLINE_SPEED_THREADS", 2);
        let dim = 128;
        let mut data = clustered(n + 100, dim, 64, 99);
        let queries = data.split_off(n * dim);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let p = VamanaParams {
            passes,
            ..VamanaParams::default()
        };
        let t = std::time::Instant::now();
        let (g, start) = pool.install(|| build(&data, dim, Metric::L2, &p));
        let secs = t.elapsed().as_secs_f64();
        let rec = recall_l2(&g, start, &data, &queries, dim, 100, 10);
        let rec50 = recall_l2(&g, start, &data, &queries, dim, 50, 10);
        eprintln!(
            "graph_speed: n={n} dim={dim} threads={threads} passes={passes} build {secs:.2}s, mean degree {:.1}, recall@10 L=100 {rec:.4}, L=50 {rec50:.4}",
            g.mean_degree()
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        #[test]
        fn vamana_invariants_small(n in 1usize..80, dim in 1usize..5, r in 1usize..8, l in 1usize..12, seed in 0u64..1000) {
            let data = uniform(n, dim, seed);
            let p = VamanaParams { r, l, seed, ..VamanaParams::default() };
            let (g, start) = build(&data, dim, Metric::L2, &p);
            check_invariants(&g, r);
            proptest::prop_assert_eq!(g.n(), n);
            proptest::prop_assert_eq!(reachable(&g, start), n);
        }

        /// The repair connects any graph, full lists included, and keeps the
        /// degree bound, no self loops and no duplicate edges.
        #[test]
        fn connect_unreachable_connects_any_graph(
            n in 1usize..60,
            r in 1usize..6,
            fill in 0usize..7,
            seed in 0u64..1000,
        ) {
            let dim = 2;
            let data = uniform(n, dim, seed);
            let m = Matrix::from_vec(data, n, dim).unwrap();
            let space = MatrixSpace::new(m.view(), Metric::L2);
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
            let mut g = Graph::new(n, r);
            for v in 0..n as u32 {
                let want = fill.min(r).min(n - 1);
                let mut list: Vec<u32> = Vec::new();
                while list.len() < want {
                    let u = rng.random_range(0..n as u32);
                    if u != v && !list.contains(&u) {
                        list.push(u);
                    }
                }
                g.set_neighbors(v, &list);
            }
            let start = rng.random_range(0..n as u32);
            let before = reachable(&g, start);
            connect_unreachable(&space, &mut g, start, r, 8, &mut SearchScratch::new());
            check_invariants(&g, r);
            proptest::prop_assert_eq!(reachable(&g, start), n, "was {}", before);
        }
    }

    /// DiskANN's eager rule: after each pick, every later candidate's factor
    /// is updated. Returns the kept positions in pool order.
    fn eager_rounds<D: PointDistance + ?Sized>(
        space: &D,
        pool: &[(f32, u32)],
        alpha: f32,
        r: usize,
    ) -> Vec<usize> {
        let mut occ = vec![0.0f32; pool.len()];
        let mut kept = 0usize;
        let mut round_alpha = alpha.min(1.0);
        'rounds: loop {
            for i in 0..pool.len() {
                if kept >= r {
                    break 'rounds;
                }
                if occ[i] > round_alpha {
                    continue;
                }
                occ[i] = PICKED;
                kept += 1;
                for j in i + 1..pool.len() {
                    if occ[j] > alpha {
                        continue;
                    }
                    let d = space.dist(pool[i].1, pool[j].1);
                    let ratio = pool[j].0 / d;
                    occ[j] = if d == 0.0 || !ratio.is_finite() {
                        EXCLUDED
                    } else {
                        occ[j].max(ratio)
                    };
                }
            }
            if round_alpha >= alpha {
                break;
            }
            round_alpha = (round_alpha * ALPHA_STEP).min(alpha);
        }
        (0..pool.len()).filter(|&i| occ[i] == PICKED).collect()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]
        /// The lazy rounds keep exactly what the eager rule keeps, duplicates
        /// and coarse (tie-prone) coordinates included.
        #[test]
        fn lazy_rounds_match_the_eager_rule(
            n in 2usize..70,
            dim in 1usize..6,
            r in 1usize..20,
            alpha in 1.0f32..2.0,
            grid in proptest::bool::ANY,
            seed in 0u64..10_000,
        ) {
            let mut data = uniform(n, dim, seed);
            if grid {
                data.iter_mut().for_each(|x| *x = (*x * 2.0).round());
            }
            let m = Matrix::from_vec(data, n, dim).unwrap();
            let space = MatrixSpace::new(m.view(), Metric::L2);
            let mut pool: Vec<(f32, u32)> = (1..n as u32).map(|x| (space.dist(0, x), x)).collect();
            pool.sort_unstable_by(|a, b| cmp_pair(a.0, a.1, b.0, b.1));
            let want = eager_rounds(&space, &pool, alpha, r);
            let mut st = PruneState::default();
            occlusion_rounds(&space, &pool, alpha, r, &mut st);
            let mut got: Vec<usize> = st.picks.iter().map(|&i| i as usize).collect();
            got.sort_unstable();
            proptest::prop_assert_eq!(&got, &want);
            let marked: Vec<usize> = (0..pool.len()).filter(|&i| st.occ[i] == PICKED).collect();
            proptest::prop_assert_eq!(marked, want);
        }
    }

    #[test]
    fn robust_prune_keeps_strict_picks_before_alpha_ones() {
        // p at the origin; a near it; b about as far from a as from p (its
        // ratio d(p, b) / d(a, b) lies in (1, 1.2]); c far on the other side.
        // A single pass at α = 1.2 with r = 2 keeps {a, b} and loses the long
        // edge to c; the rounds keep the strict rule's picks {a, c} first.
        let pts = [0.0f32, 0.0, 1.0, 0.0, 0.55, 1.0, -2.0, 0.0];
        let m = Matrix::from_vec(pts.to_vec(), 4, 2).unwrap();
        let space = MatrixSpace::new(m.view(), Metric::L2);
        let ratio = space.dist(0, 2) / space.dist(1, 2);
        assert!(ratio > 1.0 && ratio <= 1.2, "test geometry: ratio {ratio}");
        let pool = |space: &MatrixSpace<f32>| -> Vec<(f32, u32)> {
            // Unsorted, with p itself and a duplicate, as callers pass it.
            [3u32, 0, 2, 1, 2]
                .iter()
                .map(|&x| (space.dist(0, x), x))
                .collect()
        };
        let mut out = Vec::new();
        robust_prune(&space, 0, &mut pool(&space), 1.2, 2, 100, false, &mut out);
        assert_eq!(out, vec![1, 3]);
        // With room for all three, α = 1.2 admits b too (nearest first).
        robust_prune(&space, 0, &mut pool(&space), 1.2, 3, 100, false, &mut out);
        assert_eq!(out, vec![1, 2, 3]);
        // α = 1 never admits b; saturation fills the free slot with it.
        robust_prune(&space, 0, &mut pool(&space), 1.0, 3, 100, false, &mut out);
        assert_eq!(out, vec![1, 3]);
        robust_prune(&space, 0, &mut pool(&space), 1.0, 3, 100, true, &mut out);
        assert_eq!(out, vec![1, 2, 3]);
        // max_c bounds the candidates considered: only a and b.
        robust_prune(&space, 0, &mut pool(&space), 1.2, 3, 2, false, &mut out);
        assert_eq!(out, vec![1, 2]);
    }

    #[test]
    fn robust_prune_duplicates_of_a_kept_point_are_excluded() {
        // Three copies of one point: the first is kept, the others sit at
        // distance 0 from it and are never kept by the α rule.
        let pts = [0.0f32, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -1.0, 0.5];
        let m = Matrix::from_vec(pts.to_vec(), 5, 2).unwrap();
        let space = MatrixSpace::new(m.view(), Metric::L2);
        let mut pool: Vec<(f32, u32)> = (1..5).map(|x| (space.dist(0, x), x)).collect();
        let mut out = Vec::new();
        robust_prune(&space, 0, &mut pool, 1.2, 4, 100, false, &mut out);
        assert_eq!(out, vec![4, 1]);
    }
}
