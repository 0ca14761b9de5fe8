//! The core state of one query, shared by every executor and page policy:
//! the candidate list, the visited set, the exact results, the reads in
//! flight and their target nodes, and the operations on them (exact
//! distance, expansion, issuing a read). What a particular executor or page
//! policy keeps per query lives in that executor's or policy's own state.

use super::candidates::{CandidateList, KickedSet};
use super::index_data::IndexData;
use super::plan::{PagePlan, SearchPlan};
use super::scorer::{CodeScratch, Scorer};
use super::stats::QueryStats;
use crate::cache::Cache;
use crate::elem::Element;
use crate::format::page::RecordView;
use crate::io::{BufferPool, Completion, IoEngine};
use crate::layout::Layout;
use crate::util::IdMap;
use crate::{Error, Result};
use std::collections::VecDeque;
use std::time::Instant;

/// What one search loop runs with: the index and its concrete components
/// (chosen once per batch, so the loop is monomorphic) and the plan.
pub struct Env<'a, T: Element, L: Layout, S: Scorer, C: Cache> {
    pub data: &'a IndexData<T>,
    pub layout: &'a L,
    pub scorer: &'a S,
    pub cache: &'a C,
    pub plan: &'a SearchPlan,
}

/// A worker's engine and buffers.
pub struct Io {
    pub engine: IoEngine,
    pub pool: BufferPool,
}

/// One read of a query in flight.
#[derive(Debug, Clone, Copy)]
pub struct Read {
    pub block: u64,
    /// What the issuer tagged it with (the beam: its hop).
    pub tag: u32,
    pub live: bool,
}

/// Loaded lists a query keeps at most, per candidate-list entry.
pub const MAX_LOADED_PER_L: usize = 2;

/// Tag of the reads the refine stage issues.
pub const REFINE_TAG: u32 = u32::MAX;

/// A node waiting for its block: routed distance and read id.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub node: u32,
    pub dist: f32,
    pub read: u16,
}

/// Whether a query can continue now, must wait for reads, is refining its
/// results, or has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Idle,
    Waiting,
    /// The post-traversal stage: waiting for its own reads.
    Refining,
    Done,
}

/// One query's core state in a worker slot. Its buffers are reused from
/// query to query, so a search allocates nothing once the slot is warm.
pub struct Query<T: Element> {
    pub gen: u32,
    pub phase: Phase,
    /// Index of the query in the batch.
    pub qi: usize,
    pub qf: Vec<f32>,
    pub qt: Vec<T>,
    /// The scorer's per-query state (for PQ: the lookup table).
    pub table: Vec<f32>,
    /// The query moved into the index's space (in-record scorers).
    pub qtrans: Vec<f32>,
    /// In-record scoring scratch: FastScan sums and neighbour estimates.
    codes: CodeScratch,
    pub cand: CandidateList,
    pub visited: IdMap<()>,
    /// (exact internal distance, node) of every node whose record was used.
    pub exact: Vec<(f32, u32)>,
    pub frontier: Vec<u32>,
    /// Unvisited neighbours of the node being expanded (scratch).
    fresh: Vec<u32>,
    /// A cached node's neighbours, unpacked (scratch).
    list: Vec<u32>,
    pub reads: Vec<Read>,
    free_reads: Vec<u16>,
    /// Reads of this query in flight.
    pub live: usize,
    pub targets: Vec<Target>,
    /// Target nodes of the page being processed (scratch).
    pub page_nodes: Vec<u32>,
    /// Nodes expanded from a page read for another node (block search)
    /// or from memory: never read for themselves.
    pub colocated: IdMap<()>,
    /// Nodes expanded from memory without their vector: their exact
    /// distance is the refine stage's to compute.
    pub unrefined: IdMap<()>,
    /// Neighbours' lists replicated pages carried (node → offset of its
    /// degree in `loaded_lists`).
    pub loaded: IdMap<u32>,
    /// Loaded lists, each a degree then its ids.
    pub loaded_lists: Vec<u32>,
    /// Frontier nodes a beam hop serves from memory (scratch).
    pub memory: Vec<u32>,
    /// Lists loaded so far.
    loads: u32,
    /// Range search: the kicked set and doubling state.
    pub range: KickedSet,
    /// Own completions needed before the query can continue (when waiting).
    pub need: usize,
    /// Refine reads still in flight.
    pub refining: usize,
    /// Repeatable plans: the reads not yet processed, in the order they were
    /// issued (the next page to process is the front one's).
    order: VecDeque<u16>,
    /// Repeatable plans: completions that arrived before an earlier read of
    /// the query, by read id, with their buffers.
    held: Vec<Option<Completion>>,
    /// How many entries of `held` are filled.
    n_held: usize,
    pub started: Instant,
    /// Statistics of the query.
    pub stats: QueryStats,
}

impl<T: Element> Default for Query<T> {
    fn default() -> Self {
        Query {
            gen: 0,
            phase: Phase::Done,
            qi: 0,
            qf: Vec::new(),
            qt: Vec::new(),
            table: Vec::new(),
            qtrans: Vec::new(),
            codes: CodeScratch::default(),
            cand: CandidateList::default(),
            visited: IdMap::default(),
            exact: Vec::new(),
            frontier: Vec::new(),
            fresh: Vec::new(),
            list: Vec::new(),
            reads: Vec::new(),
            free_reads: Vec::new(),
            live: 0,
            targets: Vec::new(),
            page_nodes: Vec::new(),
            colocated: IdMap::default(),
            unrefined: IdMap::default(),
            loaded: IdMap::default(),
            loaded_lists: Vec::new(),
            memory: Vec::new(),
            loads: 0,
            range: KickedSet::default(),
            need: 0,
            refining: 0,
            order: VecDeque::new(),
            held: Vec::new(),
            n_held: 0,
            started: Instant::now(),
            stats: QueryStats::default(),
        }
    }
}

impl<T: Element> Query<T> {
    /// Whether the query is running (not ended).
    #[inline]
    pub fn active(&self) -> bool {
        self.phase != Phase::Done
    }

    /// Clears the state for a new query with list size `l`.
    pub fn reset(&mut self, l: usize) {
        self.gen = self.gen.wrapping_add(1);
        self.phase = Phase::Idle;
        self.started = Instant::now();
        self.stats = QueryStats::default();
        self.cand.reset(l);
        self.visited.clear();
        self.exact.clear();
        self.reads.clear();
        self.free_reads.clear();
        self.live = 0;
        self.targets.clear();
        self.colocated.clear();
        self.unrefined.clear();
        self.loaded.clear();
        self.loaded_lists.clear();
        self.memory.clear();
        self.loads = 0;
        self.range.clear();
        self.need = 0;
        self.refining = 0;
        self.frontier.clear();
        // (Held completions went back to the pool when the last query of
        // the slot ended: `release_held`.)
        debug_assert_eq!(self.n_held, 0);
        self.order.clear();
    }

    /// Bytes of scratch this slot holds.
    pub fn memory_bytes(&self) -> usize {
        self.qf.capacity() * 4
            + self.qt.capacity() * std::mem::size_of::<T>()
            + self.table.capacity() * 4
            + self.qtrans.capacity() * 4
            + self.codes.memory_bytes()
            + std::mem::size_of_val(self.cand.items())
            + self.visited.capacity() * 5
            + self.exact.capacity() * 8
            + self.frontier.capacity() * 4
            + self.fresh.capacity() * 4
            + self.list.capacity() * 4
            + self.reads.capacity() * std::mem::size_of::<Read>()
            + self.targets.capacity() * std::mem::size_of::<Target>()
            + self.page_nodes.capacity() * 4
            + self.colocated.capacity() * 5
            + self.unrefined.capacity() * 5
            + self.loaded.capacity() * 9
            + self.loaded_lists.capacity() * 4
            + self.memory.capacity() * 4
            + self.range.memory_bytes()
            + self.order.capacity() * 2
            + self.held.capacity() * std::mem::size_of::<Option<Completion>>()
    }

    /// Marks `v` expanded from a page read for another node: it is never
    /// read for itself, and its list entry (if any) counts as expanded.
    #[inline]
    pub fn mark_colocated<L: Layout, S: Scorer, C: Cache>(
        &mut self,
        env: &Env<'_, T, L, S, C>,
        v: u32,
    ) {
        self.colocated.insert(v, ());
        if self.visited.insert(v, ()).is_some() {
            let d = env.scorer.score(&self.table, v);
            self.cand.mark_expanded(d, v);
        }
    }

    /// Exact distance of node `v` from its stored vector's bytes (kept for
    /// the result).
    #[inline]
    pub fn exact<L: Layout, S: Scorer, C: Cache>(
        &mut self,
        env: &Env<'_, T, L, S, C>,
        v: u32,
        vector: &[u8],
    ) -> Result<f32> {
        let x: &[T] = bytemuck::try_cast_slice(vector).map_err(|_| {
            Error::corrupt(
                &env.data.pages_path,
                format!("record of node {v} is misaligned"),
            )
        })?;
        let t = Instant::now();
        let d = env.data.metric.distance(&self.qt, x);
        self.stats.dist_ns += t.elapsed().as_nanos() as u64;
        self.found(env, v, d);
        Ok(d)
    }

    /// Keeps the exact distance `d` of node `v` for the result.
    #[inline]
    fn found<L: Layout, S: Scorer, C: Cache>(&mut self, env: &Env<'_, T, L, S, C>, v: u32, d: f32) {
        self.stats.exact_distances += 1;
        // A range search reports only what lies within the radius; keeping
        // nothing else spares sorting the rest at every doubling.
        if env.plan.range.is_none_or(|r| d <= r.radius) {
            self.exact.push((d, v));
        }
    }

    /// Expands node `v` from a whole record (its stored `vector`, its
    /// `neighbours` and their `codes`): the exact distance, then the
    /// neighbours, scored from the codes by an in-record scorer.
    #[inline]
    pub fn expand_whole<L: Layout, S: Scorer, C: Cache>(
        &mut self,
        env: &Env<'_, T, L, S, C>,
        v: u32,
        vector: &[u8],
        neighbours: &[u32],
        codes: &[u8],
    ) -> Result<()> {
        if !S::IN_RECORD {
            if vector.is_empty() {
                // A decoupled layout's topology record (DGAI): the vector
                // lies in a vector page, read by the refine stage.
                self.unrefined.insert(v, ());
                return self.expand(env, v, neighbours);
            }
            self.exact(env, v, vector)?;
            return self.expand(env, v, neighbours);
        }
        let corrupt =
            |m: String| Error::corrupt(&env.data.pages_path, format!("record of node {v}: {m}"));
        if !S::EXACT_IN_RECORD {
            // Vectors stored as given: the exact distance is the search's
            // own; each unvisited neighbour is scored from its code.
            self.exact(env, v, vector)?;
            return self
                .expand_coded(env, v, neighbours, codes)
                .map_err(corrupt);
        }
        let x: &[f32] = bytemuck::try_cast_slice(vector)
            .map_err(|_| corrupt("the vector is misaligned".into()))?;
        let t = Instant::now();
        let mut scratch = std::mem::take(&mut self.codes);
        let r = env.scorer.score_record(
            &self.table,
            &self.qf,
            x,
            codes,
            neighbours.len(),
            &mut scratch,
        );
        self.stats.dist_ns += t.elapsed().as_nanos() as u64;
        let r = r
            .map_err(corrupt)
            .map(|d| self.found(env, v, d))
            .and_then(|_| self.insert_scored(env, v, neighbours, &scratch.est));
        self.codes = scratch;
        r
    }

    /// Inserts the unvisited `neighbours` of `v`, each scored from its code
    /// in the record's code region `codes` (slot i codes neighbour i).
    #[inline]
    fn expand_coded<L: Layout, S: Scorer, C: Cache>(
        &mut self,
        env: &Env<'_, T, L, S, C>,
        v: u32,
        neighbours: &[u32],
        codes: &[u8],
    ) -> std::result::Result<(), String> {
        let m = env.scorer.code_len();
        let n = env.data.n;
        if m == 0 || neighbours.len() * m > codes.len() {
            return Err(format!(
                "code region of {} bytes is short for {} neighbours of {m} bytes",
                codes.len(),
                neighbours.len()
            ));
        }
        self.stats.hops += 1;
        let range = env.plan.range.is_some();
        let t = Instant::now();
        for (&u, code) in neighbours.iter().zip(codes.chunks_exact(m)) {
            if u as usize >= n {
                return Err(format!(
                    "node {v} lists neighbour {u}, but the index has {n} nodes"
                ));
            }
            if self.visited.insert(u, ()).is_some() {
                continue;
            }
            let du = env.scorer.score_code(&self.table, code);
            self.candidate(range, du, u);
        }
        self.stats.dist_ns += t.elapsed().as_nanos() as u64;
        Ok(())
    }

    /// Inserts the unvisited `neighbours` of `v` with their estimates
    /// `est` (one per neighbour, from an in-record scorer).
    #[inline]
    fn insert_scored<L: Layout, S: Scorer, C: Cache>(
        &mut self,
        env: &Env<'_, T, L, S, C>,
        v: u32,
        neighbours: &[u32],
        est: &[f32],
    ) -> Result<()> {
        let n = env.data.n;
        self.stats.hops += 1;
        let range = env.plan.range.is_some();
        for (&u, &du) in neighbours.iter().zip(est) {
            if u as usize >= n {
                return Err(Error::corrupt(
                    &env.data.pages_path,
                    format!("node {v} lists neighbour {u}, but the index has {n} nodes"),
                ));
            }
            if self.visited.insert(u, ()).is_some() {
                continue;
            }
            self.candidate(range, du, u);
        }
        Ok(())
    }

    /// Inserts neighbour `u` at its estimated distance `du` into the
    /// candidate list (a range search keeps what the list pushes out).
    #[inline]
    fn candidate(&mut self, range: bool, du: f32, u: u32) {
        self.stats.pq_distances += 1;
        if range {
            if let Some(k) = self.cand.insert_kick(du, u) {
                self.range.kicked(k);
            }
        } else {
            self.cand.insert(du, u);
        }
    }

    /// Expands node `v` from its neighbour list: scores its unvisited
    /// neighbours and inserts them into the candidate list.
    #[inline]
    pub fn expand<L: Layout, S: Scorer, C: Cache>(
        &mut self,
        env: &Env<'_, T, L, S, C>,
        v: u32,
        neighbours: &[u32],
    ) -> Result<()> {
        let n = env.data.n;
        self.stats.hops += 1;
        // Two passes: the first finds the unvisited neighbours and starts
        // fetching their codes, so that the memory misses overlap; the
        // second scores them (one miss after another took most of the
        // expansion's time on a 1M-node index).
        self.fresh.clear();
        for &u in neighbours {
            if u as usize >= n {
                return Err(Error::corrupt(
                    &env.data.pages_path,
                    format!("node {v} lists neighbour {u}, but the index has {n} nodes"),
                ));
            }
            if self.visited.insert(u, ()).is_none() {
                env.scorer.prefetch(u);
                self.fresh.push(u);
            }
        }
        let range = env.plan.range.is_some();
        let t = Instant::now();
        for i in 0..self.fresh.len() {
            let u = self.fresh[i];
            let du = env.scorer.score(&self.table, u);
            self.candidate(range, du, u);
        }
        self.stats.dist_ns += t.elapsed().as_nanos() as u64;
        Ok(())
    }

    /// Exact distance and expansion of node `v` from its record (what
    /// DiskANN does with every record it reads).
    #[inline]
    pub fn expand_record<L: Layout, S: Scorer, C: Cache>(
        &mut self,
        env: &Env<'_, T, L, S, C>,
        v: u32,
        rec: RecordView<'_>,
    ) -> Result<()> {
        self.expand_whole(env, v, rec.vector, rec.neighbours, rec.codes)
    }

    /// Keeps the list of neighbour `v` a replicated page carried, unless
    /// one is kept already, `v` was expanded, or the query keeps
    /// [`MAX_LOADED_PER_L`]·L lists already (its scratch stays bounded).
    #[inline]
    pub fn load_list(&mut self, v: u32, list: &[u32]) {
        if self.loaded.contains_key(&v)
            || self.colocated.contains_key(&v)
            || self.loads as usize >= MAX_LOADED_PER_L * self.cand.capacity()
        {
            return;
        }
        self.loads += 1;
        self.loaded.insert(v, self.loaded_lists.len() as u32);
        self.loaded_lists.push(list.len() as u32);
        self.loaded_lists.extend_from_slice(list);
    }

    /// Whether loaded node `v` at (PQ) distance `d` passes the page plan's
    /// filter: `d − b ≤ ratio · (w − b)` with w the list's worst distance
    /// (a list not yet full passes everything) and b 0, or the list's best
    /// for inner product, whose distances may be negative.
    #[inline]
    fn passes_filter<L: Layout, S: Scorer, C: Cache>(
        &self,
        env: &Env<'_, T, L, S, C>,
        d: f32,
    ) -> bool {
        let PagePlan::Replicas { filter_ratio } = env.plan.page else {
            return false;
        };
        let items = self.cand.items();
        if items.len() < self.cand.capacity() {
            return true;
        }
        let (Some(best), Some(worst)) = (items.first(), items.last()) else {
            return true;
        };
        let b = if env.data.metric == crate::distance::Metric::InnerProduct {
            best.dist
        } else {
            0.0
        };
        d - b <= filter_ratio * (worst.dist - b)
    }

    /// Whether node `v` (PQ distance `d` when known) can be expanded from
    /// memory now: the cache holds it, or a replicated page loaded its list
    /// and it passes the filter.
    #[inline]
    pub fn in_memory<L: Layout, S: Scorer, C: Cache>(
        &self,
        env: &Env<'_, T, L, S, C>,
        v: u32,
        d: Option<f32>,
    ) -> bool {
        if env.cache.contains(v) {
            return true;
        }
        if self.loaded.is_empty() || !self.loaded.contains_key(&v) {
            return false;
        }
        let d = d.unwrap_or_else(|| env.scorer.score(&self.table, v));
        self.passes_filter(env, d)
    }

    /// Serves node `v` from the cache if it holds it: expands it (with its
    /// exact distance when the cache keeps its vector; otherwise the node
    /// waits for the refine stage). Returns whether the cache held it.
    #[inline]
    pub fn try_cache<L: Layout, S: Scorer, C: Cache>(
        &mut self,
        env: &Env<'_, T, L, S, C>,
        v: u32,
    ) -> Result<bool> {
        let Some(node) = env.cache.get(v) else {
            return Ok(false);
        };
        self.stats.cache_hits += 1;
        let mut buf = std::mem::take(&mut self.list);
        let neighbours = node.neighbours.as_slice(&mut buf);
        match node.vector {
            Some(vector) => {
                self.expand_whole(env, v, vector, neighbours, node.codes)?;
            }
            None => {
                self.stats.adjacency_hits += 1;
                self.unrefined.insert(v, ());
                self.expand(env, v, neighbours)?;
            }
        }
        self.list = buf;
        Ok(true)
    }

    /// Serves node `v` (PQ distance `d` when known) from memory if it can:
    /// the cache, or a loaded list that passes the filter (the node then
    /// waits for the refine stage). Returns whether it was served.
    #[inline]
    pub fn try_memory<L: Layout, S: Scorer, C: Cache>(
        &mut self,
        env: &Env<'_, T, L, S, C>,
        v: u32,
        d: Option<f32>,
    ) -> Result<bool> {
        if self.try_cache(env, v)? {
            return Ok(true);
        }
        if !self.in_memory(env, v, d) {
            return Ok(false);
        }
        self.serve_loaded(env, v)
    }

    /// Expands node `v` from the list a replicated page loaded for it (no
    /// filter: the caller decided). Returns whether one was loaded.
    #[inline]
    pub fn serve_loaded<L: Layout, S: Scorer, C: Cache>(
        &mut self,
        env: &Env<'_, T, L, S, C>,
        v: u32,
    ) -> Result<bool> {
        let Some(at) = self.loaded.remove(&v) else {
            return Ok(false);
        };
        let lists = std::mem::take(&mut self.loaded_lists);
        let at = at as usize;
        let deg = lists.get(at).copied().unwrap_or(0) as usize;
        let r = match lists.get(at + 1..at + 1 + deg) {
            Some(list) => {
                self.stats.replica_hits += 1;
                self.unrefined.insert(v, ());
                self.colocated.insert(v, ());
                self.expand(env, v, list)
            }
            None => Ok(()),
        };
        self.loaded_lists = lists;
        r.map(|_| true)
    }

    /// The record of node `v` at `slot` of a verified page.
    #[inline]
    pub fn record<'p, L: Layout, S: Scorer, C: Cache>(
        &self,
        env: &Env<'_, T, L, S, C>,
        page: &'p [u8],
        v: u32,
        slot: usize,
    ) -> Result<RecordView<'p>> {
        env.layout
            .record(page, slot)
            .map_err(|m| Error::corrupt(&env.data.pages_path, format!("record of node {v}: {m}")))
    }

    /// A read id for a new read (reusing finished ones).
    #[inline]
    fn alloc_read(&mut self, block: u64, tag: u32) -> u16 {
        let r = Read {
            block,
            tag,
            live: true,
        };
        self.live += 1;
        match self.free_reads.pop() {
            Some(i) => {
                self.reads[i as usize] = r;
                i
            }
            None => {
                self.reads.push(r);
                (self.reads.len() - 1) as u16
            }
        }
    }

    /// Reads node `v`'s block: attaches `v` to a read of this query already
    /// in flight for the block, or submits a new one tagged `tag`. Returns
    /// whether a new read was submitted.
    pub fn issue<L: Layout, S: Scorer, C: Cache>(
        &mut self,
        env: &Env<'_, T, L, S, C>,
        io: &mut Io,
        slot: usize,
        v: u32,
        dist: f32,
        tag: u32,
    ) -> Result<bool> {
        // The refine stage reads vectors: a decoupled layout keeps them
        // apart from the records.
        let (b, _) = if tag == REFINE_TAG {
            env.layout.locate_vector(v)
        } else {
            env.layout.locate(v)
        };
        for t in 0..self.targets.len() {
            let r = self.targets[t].read;
            let read = self.reads[r as usize];
            // Refine reads never share with the traversal's (whose late
            // pages the refine stage ignores).
            if read.block == b && (read.tag == REFINE_TAG) == (tag == REFINE_TAG) {
                self.targets.push(Target {
                    node: v,
                    dist,
                    read: r,
                });
                return Ok(false);
            }
        }
        let geo = env.layout.geometry();
        let r = self.alloc_read(b, tag);
        let buf = io.pool.get();
        if let Err(e) = io
            .engine
            .submit(token(slot, self.gen, r), geo.block_offset(b), buf)
        {
            // Nothing reached the engine: the read id is free again.
            self.reads[r as usize].live = false;
            self.free_reads.push(r);
            self.live -= 1;
            return Err(e);
        }
        if env.plan.repeatable {
            self.order.push_back(r);
        }
        self.targets.push(Target {
            node: v,
            dist,
            read: r,
        });
        self.stats.reads += 1;
        self.stats.bytes_read += geo.block_size as u64;
        Ok(true)
    }

    /// Marks read `r` arrived and returns it (`None` if it is not live: an
    /// engine error the caller reports).
    #[inline]
    pub fn arrived(&mut self, r: u16) -> Option<Read> {
        let read = self.reads.get_mut(r as usize)?;
        if !read.live {
            return None;
        }
        read.live = false;
        let read = *read;
        self.free_reads.push(r);
        self.live -= 1;
        Some(read)
    }

    /// Repeatable plans: keeps the completion of read `r` until the query's
    /// earlier reads are processed. Errors when `r` is not a read in flight
    /// (an engine error the caller reports).
    pub fn hold(&mut self, r: u16, c: Completion) -> std::result::Result<(), Completion> {
        let live = self.reads.get(r as usize).is_some_and(|x| x.live);
        let i = r as usize;
        if !live {
            return Err(c);
        }
        if self.held.len() <= i {
            self.held.resize_with(i + 1, || None);
        }
        if self.held[i].is_some() {
            return Err(c);
        }
        self.held[i] = Some(c);
        self.n_held += 1;
        Ok(())
    }

    /// Repeatable plans: the completion of the next read in issue order, if
    /// it has arrived (taken out of the reorder buffer).
    #[inline]
    pub fn next_held(&mut self) -> Option<(u16, Completion)> {
        let &r = self.order.front()?;
        let c = self.held.get_mut(r as usize)?.take()?;
        self.order.pop_front();
        self.n_held -= 1;
        Some((r, c))
    }

    /// Completions of the engine that must arrive before the query can go
    /// on: of the first `need` reads in issue order (repeatable plans: the
    /// pages it must process next), those not yet arrived; `need` itself
    /// otherwise (pages are processed as they arrive). At least 1.
    #[inline]
    pub fn engine_need(&self, repeatable: bool) -> usize {
        let need = self.need.max(1);
        if !repeatable {
            return need;
        }
        self.order
            .iter()
            .take(need)
            .filter(|&&r| self.held.get(r as usize).is_none_or(Option::is_none))
            .count()
            .max(1)
    }

    /// Returns the buffers of every held completion to `pool` (when the
    /// query ends, or its batch does) and forgets the issue order. Returns
    /// how many completions were dropped.
    pub fn release_held(&mut self, pool: &mut BufferPool) -> u64 {
        self.order.clear();
        if self.n_held == 0 {
            return 0;
        }
        let mut n = 0;
        for (r, h) in self.held.iter_mut().enumerate() {
            if let Some(c) = h.take() {
                pool.put(c.buf);
                n += 1;
                // Its read is back: no longer in flight.
                if let Some(read) = self.reads.get_mut(r) {
                    if read.live {
                        read.live = false;
                        self.live -= 1;
                        self.free_reads.push(r as u16);
                    }
                }
            }
        }
        self.n_held = 0;
        n
    }

    /// Moves the targets of read `r` into `page_nodes`.
    #[inline]
    pub fn take_targets(&mut self, r: u16) {
        self.page_nodes.clear();
        let mut i = 0;
        while i < self.targets.len() {
            if self.targets[i].read == r {
                self.page_nodes.push(self.targets[i].node);
                self.targets.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Whether a read in flight serves a node still in the candidate list.
    pub fn waits_for_listed(&self) -> bool {
        self.targets
            .iter()
            .any(|t| self.cand.contains(t.dist, t.node))
    }
}

/// The token of read `read` of the query in `slot` at generation `gen`.
#[inline]
pub fn token(slot: usize, gen: u32, read: u16) -> u64 {
    ((slot as u64) << 48) | ((gen as u64) << 16) | read as u64
}

/// Slot, generation and read id of a token.
#[inline]
pub fn untoken(t: u64) -> (usize, u32, u16) {
    ((t >> 48) as usize, (t >> 16) as u32, t as u16)
}
