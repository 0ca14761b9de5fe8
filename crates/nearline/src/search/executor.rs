//! The executor: one search loop for every layout, scorer and policy.
//!
//! A worker owns one I/O engine, one buffer pool and up to
//! `queries_in_flight` query slots. Each query is a state machine (a
//! [`Query`]); the worker loop admits queries into free slots, lets each
//! query issue reads and expand cached records (its *step*, run eagerly, so
//! no query is ever left with work pending), reaps completions and hands
//! each arrived page to the layout's page policy, then steps its query again
//! at once. Reaping takes what has already arrived without blocking and
//! blocks only for the fewest completions that could let some query
//! continue: a beam hop's whole hop (one wake-up per hop, as DiskANN), one
//! read for the pipeline.
//!
//! The executor kind is a policy of the step:
//!
//! * **Beam** (DiskANN): take up to W unexpanded candidates, read their
//!   blocks (one read per block), expand cached ones at once, and issue the
//!   next hop when the hop's reads are processed. With *adaptive beam* the
//!   width is min(2^i, W) at hop i; with *early dispatch* f the next hop
//!   goes out once ceil(f·reads) of the current hop's pages are processed
//!   and late pages fold in when they arrive (AlayaLaser).
//! * **Pipeline** (PipeANN): keep up to `width` reads in flight, each for the
//!   best candidate neither read nor in flight; process pages one at a time
//!   and refill at once. The width starts at min(4, W) and grows by one per
//!   arrival (up to W) once the first five list positions have been visited
//!   and at most 10% of the recent arrivals were for nodes that had already
//!   dropped out of the list. The query ends when every list entry is
//!   expanded; reads still in flight for nodes that dropped out are
//!   abandoned (the worker reaps them later, before their buffers are reused).
//!
//! Tokens are `slot << 48 | generation << 16 | read`: a completion that comes
//! back after its query ended (or errored) carries an old generation and is
//! dropped, never attributed to the slot's next query.
//!
//! The layout, the scorer and the page policy are generic parameters, matched
//! once per batch: the loop itself has no dynamic dispatch.

use super::candidates::{Candidate, CandidateList};
use super::entry::EntryPoints;
use super::params::{ExecutorKind, PageSearch, SearchParams, MAX_BEAM_WIDTH};
use super::policy::{BlockSearch, PagePolicy, TargetRecords};
use super::scorer::{AnyScorer, Scorer};
use super::stats::QueryStats;
use crate::cache::{IdMap, NodeCache};
use crate::data::dtype::Element;
use crate::distance::Metric;
use crate::io::{BufferPool, Completion, EngineKind, IoEngine};
use crate::layout::page::{ids, verify_block, PageGeometry};
use crate::layout::{AnyLayout, Layout};
use crate::{Error, Result};
use std::fs::File;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Reads one query may have in flight at once (read ids are 16 bits).
pub const MAX_READS_PER_QUERY: usize = 4096;

/// Largest I/O queue depth a worker opens its engine with.
pub const MAX_ENGINE_DEPTH: usize = 1024;

/// Width the pipeline starts with (PipeANN).
const PIPELINE_START_WIDTH: usize = 4;
/// List positions that must be visited before the pipeline widens.
const PIPELINE_WARM_POSITIONS: usize = 5;
/// Arrivals the pipeline remembers to judge its waste.
const PIPELINE_WINDOW: u32 = 16;

/// The read-only, shared part of an open index that searches need.
pub struct IndexData<T: Element> {
    /// Geometry of the page file (also `layout.geometry()`).
    pub geo: PageGeometry,
    /// Where records live.
    pub layout: AnyLayout,
    /// How neighbours are scored.
    pub scorer: AnyScorer,
    pub metric: Metric,
    pub dim: usize,
    pub n: usize,
    pub medoid: u32,
    pub cache: NodeCache,
    pub pages_path: PathBuf,
    pub file: Arc<File>,
    pub io_kind: EngineKind,
    /// Where each query's search starts.
    pub entries: EntryPoints<T>,
    pub _elem: PhantomData<T>,
}

/// What one search loop runs with: the index and the concrete components.
pub struct Env<'a, T: Element, L: Layout, S: Scorer> {
    pub data: &'a IndexData<T>,
    pub layout: &'a L,
    pub scorer: &'a S,
    pub p: &'a SearchParams,
    /// `Beam` or `Pipeline` (resolved by the planner).
    pub kind: ExecutorKind,
}

/// One read of a query in flight.
#[derive(Debug, Clone, Copy)]
struct Read {
    block: u64,
    /// The beam hop that issued it.
    hop: u32,
    live: bool,
}

/// A node waiting for its block: routed distance and read id.
#[derive(Debug, Clone, Copy)]
struct Target {
    node: u32,
    dist: f32,
    read: u16,
}

/// Whether a query can continue now, must wait for reads, or has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Waiting,
    Done,
}

/// One query's state machine in a worker slot. Its buffers are reused from
/// query to query, so a search allocates nothing once the slot is warm.
pub struct Query<T: Element> {
    gen: u32,
    phase: Phase,
    /// Index of the query in the batch.
    qi: usize,
    qf: Vec<f32>,
    qt: Vec<T>,
    /// The scorer's per-query state (for PQ: the lookup table).
    table: Vec<f32>,
    cand: CandidateList,
    visited: IdMap<()>,
    exact: Vec<(f32, u32)>,
    frontier: Vec<u32>,
    /// Unvisited neighbours of the node being expanded (scratch).
    fresh: Vec<u32>,
    reads: Vec<Read>,
    free_reads: Vec<u16>,
    /// Reads of this query in flight.
    live: usize,
    targets: Vec<Target>,
    /// Target nodes of the page being processed (scratch).
    page_nodes: Vec<u32>,
    /// Block search: the nodes of the page (scratch).
    pub(super) block_nodes: Vec<u32>,
    /// Block search: (exact distance, node, slot) of the page's other
    /// records (scratch).
    pub(super) others: Vec<(f32, u32, u32)>,
    /// Block search: (node, slot) of co-located records to expand once the
    /// next reads are issued.
    pub(super) deferred: Vec<(u32, u32)>,
    /// Block search: nodes expanded from a page read for another node.
    pub(super) colocated: IdMap<()>,
    /// Range search: unexpanded candidates that left (or never entered) the
    /// list — Starling's kicked set P.
    kicked: Vec<Candidate>,
    /// Own completions needed before the query can continue (when waiting).
    need: usize,
    // Beam.
    hop: u32,
    hop_reads: usize,
    hop_done: usize,
    threshold: usize,
    // Pipeline.
    width: usize,
    recent: u32,
    recent_n: u32,
    started: Instant,
    /// Statistics of the query.
    pub stats: QueryStats,
}

impl<T: Element> Query<T> {
    fn new() -> Self {
        Query {
            gen: 0,
            phase: Phase::Done,
            qi: 0,
            qf: Vec::new(),
            qt: Vec::new(),
            table: Vec::new(),
            cand: CandidateList::default(),
            visited: IdMap::default(),
            exact: Vec::new(),
            frontier: Vec::new(),
            fresh: Vec::new(),
            reads: Vec::new(),
            free_reads: Vec::new(),
            live: 0,
            targets: Vec::new(),
            page_nodes: Vec::new(),
            block_nodes: Vec::new(),
            others: Vec::new(),
            deferred: Vec::new(),
            colocated: IdMap::default(),
            kicked: Vec::new(),
            need: 0,
            hop: 0,
            hop_reads: 0,
            hop_done: 0,
            threshold: 0,
            width: 0,
            recent: 0,
            recent_n: 0,
            started: Instant::now(),
            stats: QueryStats::default(),
        }
    }

    fn active(&self) -> bool {
        self.phase != Phase::Done
    }

    fn memory_bytes(&self) -> usize {
        self.qf.capacity() * 4
            + self.qt.capacity() * std::mem::size_of::<T>()
            + self.table.capacity() * 4
            + std::mem::size_of_val(self.cand.items())
            + self.visited.capacity() * 9
            + self.exact.capacity() * 8
            + self.frontier.capacity() * 4
            + self.fresh.capacity() * 4
            + self.reads.capacity() * std::mem::size_of::<Read>()
            + self.targets.capacity() * std::mem::size_of::<Target>()
            + self.others.capacity() * 12
            + self.colocated.capacity() * 9
            + self.kicked.capacity() * std::mem::size_of::<Candidate>()
    }

    /// Marks `v` expanded from a page read for another node: it is never
    /// read for itself, and its list entry (if any) counts as expanded.
    #[inline]
    pub(super) fn mark_colocated<L: Layout, S: Scorer>(&mut self, env: &Env<'_, T, L, S>, v: u32) {
        self.colocated.insert(v, ());
        if self.visited.insert(v, ()).is_some() {
            let d = env.scorer.score(&self.table, v);
            self.cand.mark_expanded(d, v);
        }
    }

    /// Exact distance of the record `rec` of node `v` (kept for the result).
    #[inline]
    pub fn exact<L: Layout, S: Scorer>(
        &mut self,
        env: &Env<'_, T, L, S>,
        v: u32,
        rec: &[u8],
    ) -> Result<f32> {
        let geo = env.layout.geometry();
        let vec_bytes = &rec[..geo.vector_bytes];
        let x: &[T] = bytemuck::try_cast_slice(vec_bytes).map_err(|_| {
            Error::corrupt(
                &env.data.pages_path,
                format!("record of node {v} is misaligned"),
            )
        })?;
        let d = env.data.metric.distance(&self.qt, x);
        self.stats.exact_distances += 1;
        // A range search reports only what lies within the radius; keeping
        // nothing else spares sorting the rest at every doubling.
        if env.p.range.is_none_or(|r| d <= r.radius) {
            self.exact.push((d, v));
        }
        Ok(d)
    }

    /// Expands node `v` from its record: scores its unvisited neighbours and
    /// inserts them into the candidate list.
    #[inline]
    pub fn expand<L: Layout, S: Scorer>(
        &mut self,
        env: &Env<'_, T, L, S>,
        v: u32,
        rec: &[u8],
    ) -> Result<()> {
        let geo = env.layout.geometry();
        let (_, nbrs) = geo.split_record(rec).ok_or_else(|| {
            Error::corrupt(
                &env.data.pages_path,
                format!("record of node {v} has a degree above R"),
            )
        })?;
        let n = env.data.n;
        self.stats.hops += 1;
        // Two passes: the first finds the unvisited neighbours and starts
        // fetching their codes, so that the memory misses overlap; the
        // second scores them (one miss after another took most of the
        // expansion's time on a 1M-node index).
        self.fresh.clear();
        for u in ids(nbrs) {
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
        for i in 0..self.fresh.len() {
            let u = self.fresh[i];
            let du = env.scorer.score(&self.table, u);
            self.stats.pq_distances += 1;
            if env.p.range.is_some() {
                if let Some(k) = self.cand.insert_kick(du, u) {
                    if !k.expanded {
                        self.kicked.push(k);
                    }
                }
            } else {
                self.cand.insert(du, u);
            }
        }
        Ok(())
    }

    /// Exact distance and expansion of node `v` (what DiskANN does with
    /// every record it reads).
    #[inline]
    pub fn expand_record<L: Layout, S: Scorer>(
        &mut self,
        env: &Env<'_, T, L, S>,
        v: u32,
        rec: &[u8],
    ) -> Result<()> {
        self.exact(env, v, rec)?;
        self.expand(env, v, rec)
    }

    /// A read id for a new read (reusing finished ones).
    #[inline]
    fn alloc_read(&mut self, block: u64) -> u16 {
        let r = Read {
            block,
            hop: self.hop,
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
    /// in flight for the block, or submits a new one. Returns whether a new
    /// read was submitted.
    fn issue<L: Layout, S: Scorer>(
        &mut self,
        env: &Env<'_, T, L, S>,
        io: &mut Io,
        slot: usize,
        v: u32,
        dist: f32,
    ) -> Result<bool> {
        let (b, _) = env.layout.locate(v);
        for t in 0..self.targets.len() {
            let r = self.targets[t].read;
            if self.reads[r as usize].block == b {
                self.targets.push(Target {
                    node: v,
                    dist,
                    read: r,
                });
                return Ok(false);
            }
        }
        let geo = env.layout.geometry();
        let r = self.alloc_read(b);
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
        self.targets.push(Target {
            node: v,
            dist,
            read: r,
        });
        self.stats.reads += 1;
        self.stats.bytes_read += geo.block_size as u64;
        Ok(true)
    }

    /// Moves the targets of read `r` into `page_nodes`.
    #[inline]
    fn take_targets(&mut self, r: u16) {
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
    fn waits_for_listed(&self) -> bool {
        self.targets
            .iter()
            .any(|t| self.cand.contains(t.dist, t.node))
    }
}

/// A worker's engine and buffers.
pub struct Io {
    engine: IoEngine,
    pool: BufferPool,
}

/// One worker's state: its I/O engine, buffers and query slots.
pub struct Scratch<T: Element> {
    io: Io,
    /// How the engine was opened (`None`: given by the caller, never reopened).
    opened: Option<(EngineKind, usize)>,
    file: Arc<File>,
    slots: Vec<Query<T>>,
    completions: Vec<Completion>,
    /// Completions dropped because their query had ended (abandoned reads,
    /// reaped during the batch or when it ends).
    stale: u64,
    /// Best results of the last [`search_one`]: (internal distance, id).
    pub results: Vec<(f32, u32)>,
}

impl<T: Element> Scratch<T> {
    /// A worker for `data`, opening its own I/O engine.
    pub fn new(data: &IndexData<T>) -> Result<Self> {
        let depth = MAX_BEAM_WIDTH;
        let engine = IoEngine::open(data.io_kind, data.file.clone(), depth as u32)?;
        let mut s = Self::with_engine(data, engine);
        s.opened = Some((data.io_kind, depth));
        Ok(s)
    }

    /// A worker using the given engine (tests pass a fake one).
    pub fn with_engine(data: &IndexData<T>, engine: IoEngine) -> Self {
        Scratch {
            io: Io {
                engine,
                pool: BufferPool::new(data.geo.block_size),
            },
            opened: None,
            file: data.file.clone(),
            slots: Vec::new(),
            completions: Vec::new(),
            stale: 0,
            results: Vec::new(),
        }
    }

    /// Name of this worker's I/O engine.
    pub fn engine_name(&self) -> &'static str {
        self.io.engine.name()
    }

    /// The worker's I/O engine (tests inspect the fake engine's counters).
    pub fn engine(&self) -> &IoEngine {
        &self.io.engine
    }

    /// Buffers allocated and buffers back in the pool (equal between batches).
    pub fn buffers(&self) -> (usize, usize) {
        (self.io.pool.allocated(), self.io.pool.available())
    }

    /// Completions dropped because their query had already ended.
    pub fn stale_completions(&self) -> u64 {
        self.stale
    }

    /// Bytes of scratch memory this worker holds.
    pub fn memory_bytes(&self) -> usize {
        self.io.pool.allocated() * self.io.pool.buf_len()
            + self.slots.iter().map(Query::memory_bytes).sum::<usize>()
    }

    /// Reads this worker's engine has in flight (0 between batches).
    pub fn in_flight(&self) -> usize {
        self.io.engine.in_flight()
    }

    /// Makes room for `p`: enough query slots, and an engine deep enough for
    /// `queries_in_flight × W` reads (reopened only when it must grow).
    fn prepare(&mut self, p: &SearchParams) -> Result<()> {
        while self.slots.len() < p.queries_in_flight {
            self.slots.push(Query::new());
        }
        let want = (p.queries_in_flight * p.w).clamp(MAX_BEAM_WIDTH, MAX_ENGINE_DEPTH);
        if let Some((kind, depth)) = self.opened {
            if want > depth && self.io.engine.in_flight() == 0 {
                let depth = want.next_power_of_two().min(MAX_ENGINE_DEPTH);
                self.io.engine = IoEngine::open(kind, self.file.clone(), depth as u32)?;
                self.opened = Some((kind, depth));
            }
        }
        Ok(())
    }

    /// Reaps every read still in flight and returns its buffer, and ends
    /// every query (used when a batch ends, and on errors: no buffer is
    /// reused while the kernel may still write into it, and no completion
    /// can be attributed to a later query).
    fn drain(&mut self) -> Result<()> {
        let mut comps = std::mem::take(&mut self.completions);
        comps.clear();
        let r = self.io.engine.drain(&mut comps);
        self.stale += comps.len() as u64;
        for c in comps.drain(..) {
            self.io.pool.put(c.buf);
        }
        self.completions = comps;
        for q in &mut self.slots {
            q.phase = Phase::Done;
        }
        r.map(|_| ())
    }
}

#[inline]
fn token(slot: usize, gen: u32, read: u16) -> u64 {
    ((slot as u64) << 48) | ((gen as u64) << 16) | read as u64
}

#[inline]
fn untoken(t: u64) -> (usize, u32, u16) {
    ((t >> 48) as usize, (t >> 16) as u32, t as u16)
}

/// Receives each finished query: its index in the batch, its best `k`
/// (internal distance, id) and its statistics.
pub type Emit<'a> = dyn FnMut(usize, &[(f32, u32)], &QueryStats) + 'a;

/// Converts a float query to the index's element type (normalising it for
/// cosine). Errors name the first value that does not fit.
pub fn prepare_query<T: Element>(
    metric: Metric,
    q: &[f32],
    qf: &mut Vec<f32>,
    qt: &mut Vec<T>,
) -> Result<()> {
    qf.clear();
    qf.extend_from_slice(q);
    if let Some((i, v)) = qf.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(Error::arg(format!(
            "query value at column {i} is {v}: queries must be finite"
        )));
    }
    if metric == Metric::Cosine {
        crate::distance::normalize(qf);
    }
    qt.clear();
    for (i, &v) in qf.iter().enumerate() {
        match T::from_f32(v) {
            Some(x) => qt.push(x),
            None => {
                return Err(Error::arg(format!(
                    "query value {v} at column {i} is not representable as {} (the index's dtype)",
                    T::DTYPE
                )))
            }
        }
    }
    Ok(())
}

/// Searches one query on the worker `s`; the best `k` land in `s.results`.
pub fn search_one<T: Element>(
    data: &IndexData<T>,
    s: &mut Scratch<T>,
    query: &[f32],
    p: &SearchParams,
    st: &mut QueryStats,
) -> Result<()> {
    p.check()?;
    if query.len() != data.dim {
        return Err(Error::arg(format!(
            "query has dimension {}, the index has {}",
            query.len(),
            data.dim
        )));
    }
    let mut results = std::mem::take(&mut s.results);
    results.clear();
    let mut given = false;
    let r = run(
        data,
        s,
        &SearchParams {
            queries_in_flight: 1,
            ..*p
        },
        query,
        &mut || {
            let first = !given;
            given = true;
            first.then_some(0)
        },
        &mut |_, res, qs| {
            results.extend_from_slice(res);
            *st = *qs;
        },
    );
    s.results = results;
    r
}

/// Runs queries on the worker `s` until `next` runs dry: `next` hands out
/// query indices (rows of the row-major `queries`), `emit` receives each
/// query's best `k` (internal distance, id) and statistics as it ends.
///
/// On an error the worker stops, reaps every read in flight and returns the
/// error; it is reusable afterwards.
pub fn run<T: Element>(
    data: &IndexData<T>,
    s: &mut Scratch<T>,
    p: &SearchParams,
    queries: &[f32],
    next: &mut dyn FnMut() -> Option<usize>,
    emit: &mut Emit<'_>,
) -> Result<()> {
    p.check()?;
    // A worker run on its own has no batch to size: `auto` is one query.
    let p = &SearchParams {
        queries_in_flight: p.queries_in_flight.max(1),
        ..*p
    };
    let kind = crate::planner::choose_executor(
        p.executor,
        data.layout.records_per_block(),
        p.wants_beam_options(),
    );
    s.prepare(p)?;
    let block = match p.page_search {
        PageSearch::Block => true,
        PageSearch::Targets => false,
        PageSearch::Auto => matches!(data.layout, AnyLayout::Shuffled(_)),
    };
    let r = match (&data.layout, &data.scorer) {
        (AnyLayout::Id(layout), AnyScorer::Pq(scorer)) => {
            let env = Env {
                data,
                layout,
                scorer,
                p,
                kind,
            };
            with_policy(&env, block, s, queries, next, emit)
        }
        (AnyLayout::Shuffled(layout), AnyScorer::Pq(scorer)) => {
            let env = Env {
                data,
                layout,
                scorer,
                p,
                kind,
            };
            with_policy(&env, block, s, queries, next, emit)
        }
    };
    // Abandoned reads (and, after an error, every read) are reaped before
    // the worker goes back to its pool.
    let drained = s.drain();
    r.and(drained)
}

/// Runs the worker loop with the page policy chosen for the batch.
fn with_policy<T: Element, L: Layout, S: Scorer>(
    env: &Env<'_, T, L, S>,
    block: bool,
    s: &mut Scratch<T>,
    queries: &[f32],
    next: &mut dyn FnMut() -> Option<usize>,
    emit: &mut Emit<'_>,
) -> Result<()> {
    if block {
        let policy = BlockSearch { sigma: env.p.sigma };
        worker_loop(env, &policy, s, queries, next, emit)
    } else {
        worker_loop(env, &TargetRecords, s, queries, next, emit)
    }
}

/// The loop of one worker over its query slots.
fn worker_loop<T: Element, L: Layout, S: Scorer, P: PagePolicy>(
    env: &Env<'_, T, L, S>,
    policy: &P,
    s: &mut Scratch<T>,
    queries: &[f32],
    next: &mut dyn FnMut() -> Option<usize>,
    emit: &mut Emit<'_>,
) -> Result<()> {
    let dim = env.data.dim;
    let nslots = env.p.queries_in_flight;
    let mut comps = std::mem::take(&mut s.completions);
    let mut exhausted = false;
    let mut mark = Instant::now();
    let result = (|| -> Result<()> {
        loop {
            // Admit queries into free slots.
            let mut active = 0;
            for i in 0..nslots {
                // A query served entirely from the cache ends at admission:
                // keep admitting until the slot holds a running query.
                while !s.slots[i].active() && !exhausted {
                    match next() {
                        Some(qi) => {
                            let q = queries.get(qi * dim..(qi + 1) * dim).ok_or_else(|| {
                                Error::arg(format!("query {qi} is outside the batch"))
                            })?;
                            let slot = &mut s.slots[i];
                            start(env, slot, &mut s.io, i, qi, q, &mut mark)?;
                            charge(slot, &mut mark);
                            if slot.phase == Phase::Done {
                                finish(env, slot, emit);
                            }
                        }
                        None => exhausted = true,
                    }
                }
                if s.slots[i].active() {
                    active += 1;
                }
            }
            if active == 0 {
                return Ok(());
            }
            // Every active query has stepped as far as it can: block for the
            // fewest completions that could let one of them continue (for a
            // beam hop, its whole hop: one wake-up per hop). Completions that
            // are already there are reaped without blocking.
            let need = s.slots[..nslots]
                .iter()
                .filter(|q| q.active())
                .map(|q| q.need.max(1))
                .min()
                .unwrap_or(1);
            if s.io.engine.in_flight() == 0 {
                return Err(Error::Engine(
                    "executor stalled: queries wait for reads but none is in flight".into(),
                ));
            }
            comps.clear();
            let t0 = Instant::now();
            s.io.engine.wait(need, &mut comps)?;
            mark = Instant::now();
            let waited = (mark - t0).as_secs_f64() * 1e6;
            for q in &mut s.slots[..nslots] {
                if q.active() && q.live > 0 {
                    q.stats.io_wait_us += waited;
                }
            }
            let mut failed = Ok(());
            for c in comps.drain(..) {
                if failed.is_ok() {
                    failed = on_completion(env, policy, s, &c, &mut mark, emit);
                }
                s.io.pool.put(c.buf);
            }
            failed?;
            // Reads queued while processing (pipeline refills, early hops of
            // other queries) go to the kernel before the worker blocks.
            s.io.engine.flush()?;
        }
    })();
    s.completions = comps;
    result
}

/// Charges the time since `mark` to `q` as compute.
#[inline]
fn charge<T: Element>(q: &mut Query<T>, mark: &mut Instant) {
    let now = Instant::now();
    q.stats.cpu_us += (now - *mark).as_secs_f64() * 1e6;
    *mark = now;
}

/// Starts query `qi` in slot `slot`.
fn start<T: Element, L: Layout, S: Scorer>(
    env: &Env<'_, T, L, S>,
    q: &mut Query<T>,
    io: &mut Io,
    slot: usize,
    qi: usize,
    query: &[f32],
    mark: &mut Instant,
) -> Result<()> {
    let data = env.data;
    q.gen = q.gen.wrapping_add(1);
    q.phase = Phase::Idle;
    q.qi = qi;
    q.started = Instant::now();
    *mark = q.started;
    q.stats = QueryStats::default();
    q.cand.reset(env.p.l);
    q.visited.clear();
    q.exact.clear();
    q.reads.clear();
    q.free_reads.clear();
    q.live = 0;
    q.targets.clear();
    q.deferred.clear();
    q.colocated.clear();
    q.kicked.clear();
    q.need = 0;
    q.hop = 0;
    q.hop_reads = 0;
    q.hop_done = 0;
    q.threshold = 0;
    q.width = PIPELINE_START_WIDTH.min(env.p.w);
    q.recent = 0;
    q.recent_n = 0;
    prepare_query(data.metric, query, &mut q.qf, &mut q.qt)?;
    if data.n == 0 {
        q.phase = Phase::Done;
        return Ok(());
    }
    q.frontier.clear();
    // Entry nodes whose exact distance was computed in memory join the
    // results at once (for a range search, those within the radius).
    let nearest_entry = data.entries.seeds(
        data.metric,
        &q.qt,
        &mut q.frontier,
        &mut q.exact,
        &mut q.stats,
    );
    if let Some(r) = env.p.range {
        q.exact.retain(|e| e.0 <= r.radius);
    }
    if let (Some(r), Some(d)) = (env.p.range, nearest_entry) {
        if r.entry_cutoff.is_some_and(|c| d > c * r.radius) {
            // The nearest entry point is far outside the radius: judged to
            // have no answers, without reading a page.
            q.phase = Phase::Done;
            return Ok(());
        }
    }
    env.scorer.prepare(&q.qf, &mut q.table);
    for i in 0..q.frontier.len() {
        let v = q.frontier[i];
        if v as usize >= data.n {
            return Err(Error::corrupt(
                &data.pages_path,
                format!(
                    "entry point {v} is not a node (the index has {} nodes)",
                    data.n
                ),
            ));
        }
        if q.visited.insert(v, ()).is_none() {
            let d = env.scorer.score(&q.table, v);
            q.stats.pq_distances += 1;
            q.cand.insert(d, v);
        }
    }
    step(env, q, io, slot)
}

/// Lets query `q` do whatever it can now: issue reads, expand cached nodes,
/// or end. Leaves it `Waiting` (with `need` set) or `Done`.
#[inline]
fn step<T: Element, L: Layout, S: Scorer>(
    env: &Env<'_, T, L, S>,
    q: &mut Query<T>,
    io: &mut Io,
    slot: usize,
) -> Result<()> {
    loop {
        match env.kind {
            ExecutorKind::Pipeline => pipeline_step(env, q, io, slot)?,
            _ => beam_step(env, q, io, slot)?,
        }
        if q.phase != Phase::Done || !widen(env, q) {
            return Ok(());
        }
        q.phase = Phase::Idle;
    }
}

/// Starling's range search, when the list is exhausted: if the results
/// within the radius fill at least φ of the list, double the list, move the
/// closest kicked candidates back into it and go on. Returns whether the
/// query continues.
fn widen<T: Element, L: Layout, S: Scorer>(env: &Env<'_, T, L, S>, q: &mut Query<T>) -> bool {
    let Some(r) = env.p.range else {
        return false;
    };
    let cap = q.cand.capacity();
    if cap >= r.max_l {
        return false;
    }
    sort_dedup(&mut q.exact);
    let within = q.exact.partition_point(|e| e.0 <= r.radius);
    if (within as f64) < r.ratio as f64 * cap as f64 {
        return false;
    }
    q.cand.grow((cap * 2).min(r.max_l));
    q.stats.doublings += 1;
    // The closest kicked candidates that were not expanded since.
    q.kicked
        .sort_unstable_by(|a, b| b.dist.total_cmp(&a.dist).then(b.id.cmp(&a.id)));
    let mut added = false;
    while let Some(c) = q.kicked.pop() {
        if q.colocated.contains_key(&c.id) {
            continue;
        }
        match q.cand.insert_kick(c.dist, c.id) {
            None => added = true,
            Some(k) => {
                if k.id != c.id {
                    added = true;
                }
                if !k.expanded {
                    q.kicked.push(k);
                }
                break;
            }
        }
    }
    added || q.cand.has_unexpanded()
}

/// Sorts (distance, id) pairs and keeps one per id (they are equal: the
/// exact distance of a node does not depend on the page it came from).
#[inline]
fn sort_dedup(v: &mut Vec<(f32, u32)>) {
    v.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    v.dedup_by_key(|e| e.1);
}

fn beam_step<T: Element, L: Layout, S: Scorer>(
    env: &Env<'_, T, L, S>,
    q: &mut Query<T>,
    io: &mut Io,
    slot: usize,
) -> Result<()> {
    let p = env.p;
    let cache = &env.data.cache;
    loop {
        if q.hop_done < q.threshold {
            q.need = q.threshold - q.hop_done;
            q.phase = Phase::Waiting;
            return Ok(());
        }
        let mut width = if p.adaptive_beam {
            (1usize << q.hop.min(16)).min(p.w)
        } else {
            p.w
        };
        width = width.min(MAX_READS_PER_QUERY - q.live);
        q.frontier.clear();
        if width > 0 {
            q.cand.take_unexpanded(width, &mut q.frontier);
        }
        if q.frontier.is_empty() {
            if q.live == 0 {
                q.phase = Phase::Done;
            } else {
                // Late pages of earlier hops may still bring candidates.
                q.need = 1;
                q.phase = Phase::Waiting;
            }
            return Ok(());
        }
        q.hop += 1;
        q.hop_reads = 0;
        q.hop_done = 0;
        // Submit the reads of uncached nodes (one read per block), then work
        // on cached nodes while they are in flight.
        for i in 0..q.frontier.len() {
            let v = q.frontier[i];
            if cache.get(v).is_some() {
                continue;
            }
            if q.issue(env, io, slot, v, 0.0)? {
                q.hop_reads += 1;
            }
        }
        // Hand the hop's reads to the kernel now, before any compute. (One
        // system call that both submits and waits measured ~15% slower than
        // a separate submit and wait: the kernel gets the reads later.)
        if q.hop_reads > 0 {
            io.engine.flush()?;
        }
        for i in 0..q.frontier.len() {
            let v = q.frontier[i];
            if let Some(rec) = cache.get(v) {
                q.stats.cache_hits += 1;
                q.expand_record(env, v, rec)?;
            }
        }
        q.threshold = match p.early_dispatch {
            Some(f) if q.hop_reads > 0 => {
                ((f as f64 * q.hop_reads as f64).ceil() as usize).clamp(1, q.hop_reads)
            }
            _ => q.hop_reads,
        };
    }
}

fn pipeline_step<T: Element, L: Layout, S: Scorer>(
    env: &Env<'_, T, L, S>,
    q: &mut Query<T>,
    io: &mut Io,
    slot: usize,
) -> Result<()> {
    let cache = &env.data.cache;
    let cap = q.width.min(MAX_READS_PER_QUERY);
    let mut exhausted = false;
    while q.live < cap {
        let Some(c) = q.cand.take_best() else {
            exhausted = true;
            break;
        };
        if let Some(rec) = cache.get(c.id) {
            q.stats.cache_hits += 1;
            q.expand_record(env, c.id, rec)?;
            continue;
        }
        // The routed distance identifies the list entry when the page arrives.
        q.issue(env, io, slot, c.id, c.dist)?;
    }
    if q.live == 0 && (exhausted || !q.cand.has_unexpanded()) {
        q.phase = Phase::Done;
        return Ok(());
    }
    if (exhausted || !q.cand.has_unexpanded()) && !q.waits_for_listed() {
        // Every list entry is expanded; what is still in flight serves nodes
        // that dropped out of the list: abandon it.
        q.phase = Phase::Done;
        return Ok(());
    }
    q.need = 1;
    q.phase = Phase::Waiting;
    Ok(())
}

/// Processes one completion: attribution by token, checks, the page
/// policy, then the owning query's next step.
fn on_completion<T: Element, L: Layout, S: Scorer, P: PagePolicy>(
    env: &Env<'_, T, L, S>,
    policy: &P,
    s: &mut Scratch<T>,
    c: &Completion,
    mark: &mut Instant,
    emit: &mut Emit<'_>,
) -> Result<()> {
    let (slot, gen, r) = untoken(c.token);
    let Some(q) = s.slots.get_mut(slot) else {
        return Err(Error::Engine(format!(
            "completion with unknown token {:#x} (no query slot {slot})",
            c.token
        )));
    };
    if !q.active() || q.gen != gen {
        // A read its query abandoned (or a query that already ended).
        s.stale += 1;
        return Ok(());
    }
    let read = match q.reads.get_mut(r as usize) {
        Some(read) if read.live => {
            read.live = false;
            *read
        }
        _ => {
            return Err(Error::Engine(format!(
                "completion with token {:#x} for a read that is not in flight",
                c.token
            )))
        }
    };
    q.free_reads.push(r);
    q.live -= 1;
    let data = env.data;
    let geo = env.layout.geometry();
    let b = read.block;
    match &c.result {
        Ok(got) if *got >= geo.block_size => {}
        Ok(got) => {
            return Err(Error::corrupt(
                &data.pages_path,
                format!(
                    "page file is truncated: block {b} read {got} of {} bytes",
                    geo.block_size
                ),
            ))
        }
        Err(e) => {
            return Err(Error::io(
                &data.pages_path,
                std::io::Error::new(e.kind(), e.to_string()),
            ))
        }
    }
    let page = &c.buf.as_slice()[..geo.block_size];
    verify_block(page, b, geo).map_err(|m| Error::corrupt(&data.pages_path, m))?;
    if env.kind == ExecutorKind::Pipeline {
        adapt_width(env, q, r);
    } else if read.hop == q.hop {
        q.hop_done += 1;
    }
    q.take_targets(r);
    let targets = std::mem::take(&mut q.page_nodes);
    let res = policy.on_page(env, q, b, page, &targets);
    q.page_nodes = targets;
    res?;
    step(env, q, &mut s.io, slot)?;
    if !q.deferred.is_empty() {
        // The page's remaining work overlaps the reads just issued (the
        // beam hands them to the kernel as it issues them).
        if env.kind == ExecutorKind::Pipeline {
            s.io.engine.flush()?;
        }
        policy.deferred(env, q, page)?;
        // What it found may keep the query going, or let it issue more.
        if q.phase == Phase::Done {
            q.phase = Phase::Idle;
        }
        step(env, q, &mut s.io, slot)?;
    }
    charge(q, mark);
    if q.phase == Phase::Done {
        finish(env, q, emit);
    }
    Ok(())
}

/// PipeANN's width rule, applied as read `r` arrives.
#[inline]
fn adapt_width<T: Element, L: Layout, S: Scorer>(env: &Env<'_, T, L, S>, q: &mut Query<T>, r: u16) {
    let listed = q
        .targets
        .iter()
        .any(|t| t.read == r && q.cand.contains(t.dist, t.node));
    let mask = (1u32 << PIPELINE_WINDOW) - 1;
    q.recent = ((q.recent << 1) | u32::from(!listed)) & mask;
    q.recent_n = (q.recent_n + 1).min(PIPELINE_WINDOW);
    if q.width < env.p.w
        && q.cand.prefix_taken(PIPELINE_WARM_POSITIONS)
        && q.recent.count_ones() * 10 <= q.recent_n
    {
        q.width += 1;
    }
}

/// Ends query `q`: its best `k` and statistics go to `emit`.
fn finish<T: Element, L: Layout, S: Scorer>(
    env: &Env<'_, T, L, S>,
    q: &mut Query<T>,
    emit: &mut Emit<'_>,
) {
    q.phase = Phase::Done;
    sort_dedup(&mut q.exact);
    let k = match env.p.range {
        Some(r) => q.exact.partition_point(|e| e.0 <= r.radius),
        None => env.p.k.min(q.exact.len()),
    };
    q.stats.total_us = q.started.elapsed().as_secs_f64() * 1e6;
    emit(q.qi, &q.exact[..k], &q.stats);
}
