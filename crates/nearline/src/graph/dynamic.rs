//! A dynamic in-memory Vamana graph: points come and go one at a time.
//! It is the partition index's head graph (a head's slot is its posting's
//! id; it grows and shrinks with splits and merges) and the delta graph of
//! a graph index updated out of place (FreshDiskANN's in-memory index).
//!
//! Inserting a point searches the graph for its neighbourhood, prunes it
//! with the α rule and adds back edges (pruning a neighbour's list when it
//! overflows). Removing a point leaves a tombstone that searches still
//! route through but never return; [`DynamicGraph::consolidate`] later
//! rewires the lists that point at tombstones (FreshDiskANN's delete phase)
//! and frees their slots for new points.

use crate::distance::Metric;
use crate::graph::space::PointDistance;
use crate::graph::vamana::{robust_prune, search_graph_with, SearchScratch};
use crate::graph::Graph;
use crate::kernels::l2_f32;

/// Maximum out-degree of the head graph.
pub const HEAD_R: usize = 32;
/// Candidate list size of a head insertion.
const INSERT_L: usize = 64;
/// Most heads a search compares the query with to pick its start.
pub const ENTRY_SEEDS: usize = 256;
/// α of the head graph's pruning.
const ALPHA: f32 = 1.2;

/// The points and their graph.
pub struct DynamicGraph {
    dim: usize,
    metric: Metric,
    vecs: Vec<f32>,
    alive: Vec<bool>,
    graph: Graph,
    /// Slots handed out (alive or tombstones).
    len: usize,
    /// Slots freed by [`DynamicGraph::consolidate`], reused first.
    free: Vec<u32>,
    start: u32,
    live: usize,
}

/// Build distance between two heads (squared L2, whatever the metric: the
/// pruning rule needs a distance).
struct Space<'a> {
    vecs: &'a [f32],
    dim: usize,
    n: usize,
}

impl PointDistance for Space<'_> {
    fn n(&self) -> usize {
        self.n
    }
    fn dist(&self, a: u32, b: u32) -> f32 {
        let d = self.dim;
        let (a, b) = (a as usize * d, b as usize * d);
        l2_f32(&self.vecs[a..a + d], &self.vecs[b..b + d])
    }
}

impl DynamicGraph {
    /// An empty graph for `dim`-dimensional heads, room for `capacity`.
    pub fn new(dim: usize, metric: Metric, capacity: usize) -> DynamicGraph {
        let cap = capacity.max(16);
        DynamicGraph {
            dim,
            metric,
            vecs: vec![0.0; cap * dim],
            alive: vec![false; cap],
            graph: Graph::new(cap, HEAD_R),
            len: 0,
            free: Vec::new(),
            start: 0,
            live: 0,
        }
    }

    /// Rebuilds the structure from its parts (a checkpoint): `alive`,
    /// `vecs` (len × dim), lists, start node and freed slots.
    pub fn from_parts(
        dim: usize,
        metric: Metric,
        alive: Vec<bool>,
        vecs: Vec<f32>,
        lists: &[Vec<u32>],
        start: u32,
        free: Vec<u32>,
    ) -> DynamicGraph {
        let len = alive.len();
        let mut h = DynamicGraph::new(dim, metric, len);
        h.vecs[..len * dim].copy_from_slice(&vecs[..len * dim]);
        h.alive[..len].copy_from_slice(&alive);
        for (v, l) in lists.iter().enumerate() {
            h.graph.set_neighbors(v as u32, l);
        }
        h.len = len;
        h.free = free;
        h.start = start;
        h.live = alive.iter().filter(|&&a| a).count();
        h
    }

    pub fn dim(&self) -> usize {
        self.dim
    }
    /// Slots handed out (alive heads and tombstones).
    pub fn slots(&self) -> usize {
        self.len
    }
    /// Alive heads.
    pub fn live(&self) -> usize {
        self.live
    }
    pub fn is_alive(&self, s: u32) -> bool {
        self.alive.get(s as usize).copied().unwrap_or(false)
    }
    pub fn start(&self) -> u32 {
        self.start
    }
    pub fn free_slots(&self) -> &[u32] {
        &self.free
    }
    /// Head `s`'s vector.
    pub fn vector(&self, s: u32) -> &[f32] {
        let i = s as usize * self.dim;
        &self.vecs[i..i + self.dim]
    }
    /// Head `s`'s out-neighbours.
    pub fn neighbors(&self, s: u32) -> &[u32] {
        self.graph.neighbors(s)
    }
    /// Bytes held: vectors, lists, flags.
    pub fn memory_bytes(&self) -> usize {
        self.vecs.capacity() * 4
            + self.graph.memory_bytes()
            + self.alive.capacity()
            + self.free.capacity() * 4
    }

    /// Metric distance from `q` to head `s`.
    #[inline]
    pub fn distance(&self, q: &[f32], s: u32) -> f32 {
        self.metric.distance(q, self.vector(s))
    }

    /// The `k` alive heads nearest to `q` (metric distance, nearest first),
    /// from a search with list size `l`.
    pub fn search(
        &self,
        scratch: &mut SearchScratch,
        q: &[f32],
        k: usize,
        l: usize,
    ) -> Vec<(f32, u32)> {
        if self.live == 0 {
            return Vec::new();
        }
        // Tombstones take room in the list: widen it by their share, and
        // again (doubling) while the list holds fewer than k alive heads, so
        // a region crowded with tombstones never leaves a query or a vector
        // without postings.
        let want = k.min(self.live);
        let dead = self.len - self.live;
        let mut l = l.max(k) + (l.max(k) * dead).div_ceil(self.live.max(1)).min(l.max(k));
        let seed = self.seed_for(q);
        loop {
            let found =
                search_graph_with(scratch, &self.graph, seed, l, l, |v| self.distance(q, v));
            let alive: Vec<(f32, u32)> = found
                .into_iter()
                .filter(|&(_, v)| self.alive[v as usize])
                .take(k)
                .collect();
            if alive.len() >= want || l >= self.len {
                return alive;
            }
            l = (l * 2).min(self.len);
        }
    }

    /// Where a search for `q` starts: the nearest of the start head and a
    /// spread of alive heads (every `len / ENTRY_SEEDS`-th slot, at most
    /// [`ENTRY_SEEDS`] distances). DynamicGraph that splits add where the build
    /// had no data form regions a greedy search from one start may not
    /// enter with a short list; a seed near the query puts it inside.
    pub fn seed_for(&self, q: &[f32]) -> u32 {
        let stride = (self.len / ENTRY_SEEDS).max(1);
        let mut best = (self.distance(q, self.start), self.start);
        for s in (0..self.len as u32).step_by(stride) {
            if self.alive[s as usize] {
                let d = self.distance(q, s);
                if d < best.0 {
                    best = (d, s);
                }
            }
        }
        best.1
    }

    fn grow(&mut self) {
        // An eighth more at a time: the capacity is resident memory.
        let cap = self.alive.len() + (self.alive.len() / 8).max(64);
        let mut g = Graph::new(cap, HEAD_R);
        for v in 0..self.len as u32 {
            g.set_neighbors(v, self.graph.neighbors(v));
        }
        self.graph = g;
        // `resize` alone would double the allocation (amortised growth).
        self.vecs.reserve_exact(cap * self.dim - self.vecs.len());
        self.vecs.resize(cap * self.dim, 0.0);
        self.alive.reserve_exact(cap - self.alive.len());
        self.alive.resize(cap, false);
    }

    /// Adds a head; returns its slot (its posting's id).
    pub fn insert(&mut self, v: &[f32], scratch: &mut SearchScratch) -> u32 {
        let slot = self.reserve();
        self.link(slot, v, scratch);
        slot
    }

    /// A slot for a head that is not searchable yet (no vector, no edges):
    /// its posting can be written under its id before [`DynamicGraph::link`] makes
    /// it reachable.
    pub fn reserve(&mut self) -> u32 {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                if self.len == self.alive.len() {
                    self.grow();
                }
                self.len += 1;
                (self.len - 1) as u32
            }
        };
        self.graph.set_neighbors(slot, &[]);
        self.alive[slot as usize] = false;
        slot
    }

    /// Gives a reserved slot its vector and its edges: searches reach it
    /// from now on.
    pub fn link(&mut self, slot: u32, v: &[f32], scratch: &mut SearchScratch) {
        let s = if self.live == 0 {
            self.start
        } else {
            self.seed_for(v)
        };
        self.link_from(slot, v, scratch, s)
    }

    /// [`DynamicGraph::link`] with the candidate search started at `seed`. Seeding
    /// it where a query for `v` would start ([`DynamicGraph::seed_for`]) makes the
    /// expanded path, whose far nodes the α rule keeps as long edges, the
    /// path queries take: seeded at the head a split replaces, new heads got
    /// only local edges and queries from the seeds reached them less often.
    fn link_from(&mut self, slot: u32, v: &[f32], scratch: &mut SearchScratch, seed: u32) {
        let d = self.dim;
        self.vecs[slot as usize * d..(slot as usize + 1) * d].copy_from_slice(v);
        if self.live == 0 {
            self.alive[slot as usize] = true;
            self.live = 1;
            self.start = slot;
            return;
        }
        // Candidates by the build distance (L2), tombstones included: they
        // still carry edges.
        let seed = if (seed as usize) < self.len {
            seed
        } else {
            self.start
        };
        let found = search_graph_with(scratch, &self.graph, seed, INSERT_L, INSERT_L, |u| {
            let i = u as usize * d;
            l2_f32(v, &self.vecs[i..i + d])
        });
        // Vamana's candidates: every node the search expanded (the path
        // from the start carries the far nodes the α rule keeps as long
        // edges) and the final list. With the list alone, heads that splits
        // add in a region the build had no data in hang off a few short
        // edges, and a search with the default list size stops reaching
        // them: on a shifted 100k workload recall at nprobe 32 fell from
        // 0.98 to 0.78 by epoch 50 (0.97 with a list twice as long).
        let mut pool: Vec<(f32, u32)> = found
            .into_iter()
            .chain(scratch.expanded().iter().copied())
            .filter(|&(_, u)| self.alive[u as usize])
            .collect();
        let out = self.prune_set(slot, &mut pool);
        self.alive[slot as usize] = true;
        self.live += 1;
        for &u in &out {
            if !self.graph.push_neighbor(u, slot) {
                self.reprune(u, Some(slot));
            }
        }
    }

    /// Prunes `u`'s list (plus `extra`) back to the degree bound.
    fn reprune(&mut self, u: u32, extra: Option<u32>) {
        let cand: Vec<u32> = self
            .graph
            .neighbors(u)
            .iter()
            .copied()
            .chain(extra)
            .filter(|&w| self.alive[w as usize])
            .collect();
        let mut pool = self.pool_around(u, cand);
        self.prune_set(u, &mut pool);
    }

    /// `cand` with their L2 distances to head `u`.
    fn pool_around(&self, u: u32, cand: Vec<u32>) -> Vec<(f32, u32)> {
        let d = self.dim;
        let ui = u as usize * d;
        cand.into_iter()
            .map(|w| {
                let wi = w as usize * d;
                (l2_f32(&self.vecs[ui..ui + d], &self.vecs[wi..wi + d]), w)
            })
            .collect()
    }

    /// Vamana's robust prune of `pool` (candidates with their distances to
    /// `u`) sets `u`'s list; returns it.
    fn prune_set(&mut self, u: u32, pool: &mut Vec<(f32, u32)>) -> Vec<u32> {
        let mut out = Vec::with_capacity(HEAD_R);
        let space = Space {
            vecs: &self.vecs,
            dim: self.dim,
            n: self.len,
        };
        robust_prune(&space, u, pool, ALPHA, HEAD_R, usize::MAX, false, &mut out);
        self.graph.set_neighbors(u, &out);
        out
    }

    /// Makes head `s` a tombstone (searches route through it, never return
    /// it). The last alive head cannot be removed.
    pub fn remove(&mut self, s: u32) -> bool {
        if !self.is_alive(s) || self.live == 1 {
            return false;
        }
        self.alive[s as usize] = false;
        self.live -= 1;
        true
    }

    /// Retires head `s` in favour of `heirs` (the heads a split put in its
    /// place): `s` becomes a tombstone whose list leads to the heirs first,
    /// so the edges that reached `s` (long ones among them) reach them
    /// through it, and consolidation hands those edges on to them.
    pub fn retire_into(&mut self, s: u32, heirs: &[u32]) -> bool {
        if !self.remove(s) {
            return false;
        }
        let mut list: Vec<u32> = heirs
            .iter()
            .copied()
            .filter(|&h| h != s && self.is_alive(h))
            .collect();
        for &w in self.graph.neighbors(s) {
            if list.len() >= HEAD_R {
                break;
            }
            if !list.contains(&w) {
                list.push(w);
            }
        }
        self.graph.set_neighbors(s, &list);
        true
    }

    /// Tombstones among the slots.
    pub fn tombstones(&self) -> usize {
        self.len - self.live - self.free.len()
    }

    /// Rewires every list that points at a tombstone (its alive neighbours
    /// and the tombstones' alive neighbours, pruned) and empties the
    /// tombstones' lists. Returns their slots, which become reusable only
    /// through [`DynamicGraph::reuse`]: the caller first waits out whoever may still
    /// hold a route to them.
    pub fn consolidate(&mut self) -> Vec<u32> {
        let mut freed: Vec<bool> = self.alive[..self.len].iter().map(|&a| !a).collect();
        for &f in &self.free {
            freed[f as usize] = false;
        }
        if !freed.iter().any(|&f| f) {
            return Vec::new();
        }
        for v in 0..self.len as u32 {
            if !self.alive[v as usize] {
                continue;
            }
            let nb = self.graph.neighbors(v).to_vec();
            if !nb.iter().any(|&w| freed[w as usize]) {
                continue;
            }
            let mut cand: Vec<u32> = Vec::new();
            for &w in &nb {
                if freed[w as usize] {
                    cand.extend(
                        self.graph
                            .neighbors(w)
                            .iter()
                            .copied()
                            .filter(|&x| self.alive[x as usize] && x != v),
                    );
                } else if self.alive[w as usize] {
                    cand.push(w);
                }
            }
            let mut pool = self.pool_around(v, cand);
            self.prune_set(v, &mut pool);
        }
        let mut slots = Vec::new();
        for (v, &f) in freed.iter().enumerate() {
            if f {
                self.graph.set_neighbors(v as u32, &[]);
                slots.push(v as u32);
            }
        }
        if !self.alive[self.start as usize] {
            // The alive head nearest to the old start.
            let s = self.start;
            let best = (0..self.len as u32)
                .filter(|&v| self.alive[v as usize])
                .map(|v| (l2_f32(self.vector(s), self.vector(v)), v))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            if let Some((_, v)) = best {
                self.start = v;
            }
        }
        slots
    }

    /// Makes slots returned by [`DynamicGraph::consolidate`] reusable.
    pub fn reuse(&mut self, slots: &[u32]) {
        self.free.reserve_exact(slots.len());
        self.free.extend(
            slots
                .iter()
                .copied()
                .filter(|&s| (s as usize) < self.len && !self.alive[s as usize]),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn points(n: usize, dim: usize, seed: u64) -> Vec<f32> {
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n * dim).map(|_| r.random_range(-1.0f32..1.0)).collect()
    }

    fn exact(h: &DynamicGraph, q: &[f32], k: usize) -> Vec<u32> {
        let mut all: Vec<(f32, u32)> = (0..h.slots() as u32)
            .filter(|&s| h.is_alive(s))
            .map(|s| (h.distance(q, s), s))
            .collect();
        all.sort_by(|a, b| a.0.total_cmp(&b.0));
        all.into_iter().take(k).map(|x| x.1).collect()
    }

    fn recall(h: &DynamicGraph, qs: &[f32], dim: usize) -> f64 {
        let mut sc = SearchScratch::new();
        let mut hit = 0;
        let nq = qs.len() / dim;
        for q in qs.chunks_exact(dim) {
            let got: Vec<u32> = h.search(&mut sc, q, 10, 40).iter().map(|x| x.1).collect();
            hit += exact(h, q, 10).iter().filter(|x| got.contains(x)).count();
        }
        hit as f64 / (nq * 10) as f64
    }

    #[test]
    fn grows_and_finds_neighbours_through_removals() {
        let dim = 16;
        let n = 2000;
        let p = points(n, dim, 1);
        let mut h = DynamicGraph::new(dim, Metric::L2, 10);
        let mut sc = SearchScratch::new();
        for v in p.chunks_exact(dim) {
            h.insert(v, &mut sc);
        }
        assert_eq!(h.live(), n);
        let qs = points(100, dim, 2);
        assert!(recall(&h, &qs, dim) > 0.95);
        // Remove a third: searches never return them and still find the rest.
        for s in (0..n as u32).step_by(3) {
            assert!(h.remove(s));
        }
        let mut sc2 = SearchScratch::new();
        for q in qs.chunks_exact(dim) {
            assert!(h.search(&mut sc2, q, 10, 40).iter().all(|x| x.1 % 3 != 0));
        }
        assert!(recall(&h, &qs, dim) > 0.9);
        let freed = h.consolidate();
        assert_eq!(freed.len(), n.div_ceil(3));
        h.reuse(&freed);
        assert!(recall(&h, &qs, dim) > 0.9);
        // Freed slots are reused.
        let s = h.insert(&qs[..dim], &mut sc);
        assert_eq!(s % 3, 0);
        assert!(h.is_alive(s));
        // Every list names alive heads only after consolidation.
        for v in 0..h.slots() as u32 {
            if h.is_alive(v) && v != s {
                assert!(h.neighbors(v).iter().all(|&w| h.is_alive(w) || w == s));
            }
        }
    }

    #[test]
    fn the_last_head_stays() {
        let mut h = DynamicGraph::new(4, Metric::L2, 1);
        let mut sc = SearchScratch::new();
        let a = h.insert(&[0.0; 4], &mut sc);
        assert!(!h.remove(a));
        assert_eq!(h.search(&mut sc, &[1.0; 4], 3, 10).len(), 1);
    }
}
