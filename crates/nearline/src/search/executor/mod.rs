//! The executor: one search loop for every layout, scorer, cache,
//! executor kind and page policy.
//!
//! A worker owns one I/O engine, one buffer pool and up to
//! `queries_in_flight` query slots. Each query is a state machine (a
//! [`Query`] core plus its executor's and page policy's own state); the
//! worker loop admits queries into free slots, lets each query issue reads
//! and expand cached nodes (its *step*, run eagerly, so no query is ever
//! left with work pending), reaps completions and hands each arrived page
//! to the page policy, then steps its query again at once. Reaping takes
//! what has already arrived without blocking and blocks only for the fewest
//! completions that could let some query continue: a beam hop's whole hop
//! (one wake-up per hop, as DiskANN), one read for the pipeline.
//!
//! With a repeatable plan (the default) each query processes its pages in
//! the order it issued the reads: a page that arrives before an earlier
//! read's waits in the query's reorder buffer (with its buffer) until that
//! read's page is processed. Every state change of a query — what it
//! expands, which reads it issues, the pipeline's width and the moment it
//! ends — then follows one sequence whatever the timing of the reads, so the
//! same query on the same index gives the same results and statistics. A
//! query's `need` counts the pages it must process in that order; the
//! worker blocks for the fewest of them that have not arrived.
//!
//! The executor kind ([`Beam`], [`Pipeline`]) is the policy of the step.
//! When a traversal ends, the range search may widen it
//! ([`super::range::widen`]) and the post-traversal stage may read more
//! pages ([`super::refine`]) before the query's results are emitted.
//!
//! Tokens are `slot << 48 | generation << 16 | read`: a completion that comes
//! back after its query ended (or errored) carries an old generation and is
//! dropped, never attributed to the slot's next query.
//!
//! The layout, scorer, cache, executor and page policy are generic
//! parameters, matched once per batch: the loop itself has no dynamic
//! dispatch.

pub mod beam;
pub mod pipeline;

use super::index_data::IndexData;
use super::plan::{ExecutorPlan, PagePlan, RefinePlan, SearchPlan, MAX_BEAM_WIDTH};
use super::policy::{BlockSearch, PagePolicy, Replicas, TargetRecords};
use super::query::{untoken, Env, Io, Phase, Query, Read, REFINE_TAG};
use super::range::{sort_dedup, widen};
use super::refine;
use super::scorer::{AnyScorer, Scorer};
use super::stats::QueryStats;
use crate::cache::{AnyCache, Cache};
use crate::distance::Metric;
use crate::elem::Element;
use crate::io::{BufferPool, Completion, EngineKind, IoEngine};
use crate::layout::{AnyLayout, Layout};
use crate::{Error, Result};
use std::fs::File;
use std::sync::Arc;
use std::time::Instant;

pub use beam::Beam;
pub use pipeline::Pipeline;

/// Reads one query may have in flight at once (read ids are 16 bits).
pub const MAX_READS_PER_QUERY: usize = 4096;

/// Largest I/O queue depth a worker opens its engine with.
pub const MAX_ENGINE_DEPTH: usize = 1024;

/// An executor kind: how a query issues reads and when it continues.
pub trait Executor: Send + Sync {
    /// What the executor keeps per query slot.
    type State: Default + Send;
    /// Whether reads issued while a page is processed go to the kernel
    /// before the page's deferred work (the beam hands them over as it
    /// issues them).
    const FLUSH_BEFORE_DEFERRED: bool;

    /// Sets up the state of a query just admitted.
    fn start(&self, st: &mut Self::State);

    /// Lets query `q` do whatever it can now: issue reads, expand cached
    /// nodes, or end. Leaves it `Waiting` (with `need` set) or `Done`.
    fn step<T: Element, L: Layout, S: Scorer, C: Cache>(
        &self,
        env: &Env<'_, T, L, S, C>,
        q: &mut Query<T>,
        st: &mut Self::State,
        io: &mut Io,
        slot: usize,
    ) -> Result<()>;

    /// Bookkeeping when read `r` of query `q` arrives, before its page is
    /// processed.
    fn arrived<T: Element>(&self, q: &Query<T>, st: &mut Self::State, read: Read, r: u16);
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
            + self.completions.capacity() * std::mem::size_of::<Completion>()
            + self.io.engine.memory_bytes() as usize
    }

    /// The candidate list (distance, id) the query of `slot` ended with
    /// (tests compare a two-stage search with an exact re-rank of it).
    pub fn candidates(&self, slot: usize) -> Vec<(f32, u32)> {
        self.slots
            .get(slot)
            .map(|q| q.cand.items().iter().map(|c| (c.dist, c.id)).collect())
            .unwrap_or_default()
    }

    /// Reads this worker's engine has in flight (0 between batches).
    pub fn in_flight(&self) -> usize {
        self.io.engine.in_flight()
    }

    /// Makes room for `p`: enough query slots, and an engine deep enough for
    /// `queries_in_flight × W` reads (reopened only when it must grow).
    fn prepare(&mut self, p: &SearchPlan) -> Result<()> {
        while self.slots.len() < p.queries_in_flight {
            self.slots.push(Query::default());
        }
        // Page buffers: the traversal's (W reads a query and one more while
        // a page is processed) carved at once; the pool grows past them, up
        // to what the plan's queries may hold together (the refine stage's
        // reads; the memory model's count), carving as it goes.
        let refine = match p.refine {
            RefinePlan::Rerank { candidates } => candidates,
            RefinePlan::None => 0,
        };
        let width = p.executor.width();
        let qif = p.queries_in_flight;
        self.io
            .pool
            .set_limit(qif.saturating_mul(width.max(refine) + 1));
        self.io.pool.reserve(qif.saturating_mul(width + 1));
        let want = engine_depth(p);
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
            self.stale += q.release_held(&mut self.io.pool);
            // Every read is back: none is in flight for any slot.
            q.live = 0;
        }
        r.map(|_| ())
    }
}

/// I/O queue depth a worker needs for plan `p`.
pub fn engine_depth(p: &SearchPlan) -> usize {
    (p.queries_in_flight * p.executor.width()).clamp(MAX_BEAM_WIDTH, MAX_ENGINE_DEPTH)
}

/// Receives each finished query: its index in the batch, its best `k`
/// (internal distance, id) and its statistics.
pub type Emit<'a> = dyn FnMut(usize, &[(f32, u32)], &QueryStats) + 'a;

/// Converts query `qi` (of its batch) to the index's element type
/// (normalising it for cosine). Errors name the query and the first value
/// that does not fit, or a squared norm beyond what float32 distances hold.
pub fn prepare_query<T: Element>(
    metric: Metric,
    qi: usize,
    q: &[f32],
    qf: &mut Vec<f32>,
    qt: &mut Vec<T>,
) -> Result<()> {
    qf.clear();
    qf.extend_from_slice(q);
    if let Some((i, v)) = qf.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(Error::arg(format!(
            "query {qi}: value at column {i} is {v}: queries must be finite"
        )));
    }
    if let Some(why) = crate::distance::oversized(crate::distance::squared_norm_f64(qf)) {
        return Err(Error::arg(format!("query {qi} {why}")));
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
                    "query {qi}: value {v} at column {i} is not representable as {} (the \
                     index's dtype)",
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
    p: &SearchPlan,
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
        &SearchPlan {
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
    p: &SearchPlan,
    queries: &[f32],
    next: &mut dyn FnMut() -> Option<usize>,
    emit: &mut Emit<'_>,
) -> Result<()> {
    p.check()?;
    // One read guard for the worker's whole run: the cache does not change
    // under a search (a resize waits until no search reads it).
    let cache = data.cache.read()?;
    s.prepare(p)?;
    let mut job = Job {
        s,
        queries,
        next,
        emit,
    };
    let r = match (&data.layout, &data.scorer, &*cache) {
        (AnyLayout::Id(layout), AnyScorer::Pq(scorer), AnyCache::Bfs(cache)) => {
            with_executor(&mut job, &env(data, layout, scorer, cache, p))
        }
        (AnyLayout::Shuffled(layout), AnyScorer::Pq(scorer), AnyCache::Bfs(cache)) => {
            with_executor(&mut job, &env(data, layout, scorer, cache, p))
        }
        (AnyLayout::Id(layout), AnyScorer::Pq(scorer), AnyCache::Adjacency(cache)) => {
            with_executor(&mut job, &env(data, layout, scorer, cache, p))
        }
        (AnyLayout::Shuffled(layout), AnyScorer::Pq(scorer), AnyCache::Adjacency(cache)) => {
            with_executor(&mut job, &env(data, layout, scorer, cache, p))
        }
        // A coded layout places records as the ID layout does, and its
        // caches hold whole records.
        (AnyLayout::Id(layout), AnyScorer::Coded(scorer), AnyCache::Bfs(cache)) => {
            with_executor(&mut job, &env(data, layout, scorer, cache, p))
        }
        (AnyLayout::Id(layout), AnyScorer::PqRecord(scorer), AnyCache::Bfs(cache)) => {
            with_executor(&mut job, &env(data, layout, scorer, cache, p))
        }
        (_, AnyScorer::Coded(_) | AnyScorer::PqRecord(_), _) => Err(Error::arg(
            "an index with codes in its records searches with whole-record caches on its own \
             layout only",
        )),
    };
    // Abandoned reads (and, after an error, every read) are reaped before
    // the worker goes back to its pool.
    let drained = job.s.drain();
    r.and(drained)
}

fn env<'a, T: Element, L: Layout, S: Scorer, C: Cache>(
    data: &'a IndexData<T>,
    layout: &'a L,
    scorer: &'a S,
    cache: &'a C,
    plan: &'a SearchPlan,
) -> Env<'a, T, L, S, C> {
    Env {
        data,
        layout,
        scorer,
        cache,
        plan,
    }
}

/// What a worker loop works through: its scratch, the batch and the sinks.
struct Job<'a, 'b, T: Element> {
    s: &'a mut Scratch<T>,
    queries: &'a [f32],
    next: &'a mut dyn FnMut() -> Option<usize>,
    emit: &'a mut Emit<'b>,
}

/// Picks the executor of the plan.
fn with_executor<T: Element, L: Layout, S: Scorer, C: Cache>(
    job: &mut Job<'_, '_, T>,
    env: &Env<'_, T, L, S, C>,
) -> Result<()> {
    match env.plan.executor {
        ExecutorPlan::Beam(b) => with_policy(job, env, &Beam(b)),
        ExecutorPlan::Pipeline(p) => with_policy(job, env, &Pipeline(p)),
    }
}

/// Picks the page policy of the plan.
fn with_policy<T: Element, L: Layout, S: Scorer, C: Cache, X: Executor>(
    job: &mut Job<'_, '_, T>,
    env: &Env<'_, T, L, S, C>,
    x: &X,
) -> Result<()> {
    match env.plan.page {
        PagePlan::Targets => worker_loop(job, env, x, &TargetRecords),
        PagePlan::Block { sigma } => worker_loop(job, env, x, &BlockSearch { sigma }),
        PagePlan::Replicas { .. } => worker_loop(job, env, x, &Replicas),
    }
}

/// A query slot's executor and page-policy state.
struct SlotState<X: Executor, P: PagePolicy> {
    x: X::State,
    p: P::State,
}

impl<X: Executor, P: PagePolicy> Default for SlotState<X, P> {
    fn default() -> Self {
        SlotState {
            x: X::State::default(),
            p: P::State::default(),
        }
    }
}

/// The loop of one worker over its query slots.
fn worker_loop<T: Element, L: Layout, S: Scorer, C: Cache, X: Executor, P: PagePolicy>(
    job: &mut Job<'_, '_, T>,
    env: &Env<'_, T, L, S, C>,
    x: &X,
    policy: &P,
) -> Result<()> {
    let dim = env.data.dim;
    let nslots = env.plan.queries_in_flight;
    let mut states: Vec<SlotState<X, P>> = (0..nslots).map(|_| SlotState::default()).collect();
    let s = &mut *job.s;
    let mut comps = std::mem::take(&mut s.completions);
    let mut exhausted = false;
    let mut mark = Instant::now();
    let result = (|| -> Result<()> {
        loop {
            // Admit queries into free slots.
            let (mut active, mut draining) = (0, 0);
            for (i, st) in states.iter_mut().enumerate() {
                // A query served entirely from memory ends at admission:
                // keep admitting until the slot holds a running query. A
                // slot whose last query abandoned reads waits for them.
                while !s.slots[i].active() && s.slots[i].live == 0 && !exhausted {
                    match (job.next)() {
                        Some(qi) => {
                            let q = job.queries.get(qi * dim..(qi + 1) * dim).ok_or_else(|| {
                                Error::arg(format!("query {qi} is outside the batch"))
                            })?;
                            let slot = &mut s.slots[i];
                            start(env, x, slot, &mut st.x, &mut s.io, i, qi, q, &mut mark)?;
                            charge(slot, &mut mark);
                            if slot.phase == Phase::Done {
                                finish(env, slot, job.emit);
                            }
                        }
                        None => exhausted = true,
                    }
                }
                if s.slots[i].active() {
                    active += 1;
                } else if s.slots[i].live > 0 {
                    draining += 1;
                }
            }
            // With the batch handed out, abandoned reads are the drain's.
            if active == 0 && (draining == 0 || exhausted) {
                return Ok(());
            }
            // Every active query has stepped as far as it can: block for the
            // fewest completions that could let one of them continue (for a
            // beam hop, its whole hop: one wake-up per hop). Completions that
            // are already there are reaped without blocking.
            let repeatable = env.plan.repeatable;
            let need = s.slots[..nslots]
                .iter()
                .filter(|q| q.active())
                .map(|q| q.engine_need(repeatable))
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
                    failed = on_completion(env, x, policy, s, &mut states, c, &mut mark, job.emit);
                } else {
                    s.io.pool.put(c.buf);
                }
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
#[allow(clippy::too_many_arguments)]
fn start<T: Element, L: Layout, S: Scorer, C: Cache, X: Executor>(
    env: &Env<'_, T, L, S, C>,
    x: &X,
    q: &mut Query<T>,
    xs: &mut X::State,
    io: &mut Io,
    slot: usize,
    qi: usize,
    query: &[f32],
    mark: &mut Instant,
) -> Result<()> {
    let data = env.data;
    q.reset(env.plan.l);
    q.qi = qi;
    *mark = q.started;
    x.start(xs);
    // An index that stores its vectors transformed (a coded layout) moves
    // the query into that space first (a non-finite query is refused by
    // `prepare_query` as given).
    let mut moved = std::mem::take(&mut q.qtrans);
    let r = if query.iter().all(|v| v.is_finite()) && env.scorer.transform(query, &mut moved) {
        prepare_query(data.metric, qi, &moved, &mut q.qf, &mut q.qt)
    } else {
        prepare_query(data.metric, qi, query, &mut q.qf, &mut q.qt)
    };
    q.qtrans = moved;
    r?;
    if data.n == 0 {
        q.phase = Phase::Done;
        return Ok(());
    }
    // Entry nodes whose exact distance was computed in memory join the
    // results at once (for a range search, those within the radius).
    let nearest_entry = data.entries.seeds(
        data.metric,
        &q.qt,
        &mut q.frontier,
        &mut q.exact,
        &mut q.stats,
    );
    if let Some(r) = env.plan.range {
        q.exact.retain(|e| e.0 <= r.radius);
    }
    if let (Some(r), Some(d)) = (env.plan.range, nearest_entry) {
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
            // An in-record scorer has no estimate by id: an entry whose
            // exact distance the entry structure found takes it.
            let d = if S::IN_RECORD {
                q.exact
                    .iter()
                    .find(|e| e.1 == v)
                    .map_or_else(|| env.scorer.score(&q.table, v), |e| e.0)
            } else {
                env.scorer.score(&q.table, v)
            };
            q.stats.pq_distances += 1;
            q.cand.insert(d, v);
        }
    }
    step(env, x, q, xs, io, slot)
}

/// Steps query `q` with its executor; when the traversal ends, lets the
/// range search widen it and the refine stage read what it needs.
#[inline]
fn step<T: Element, L: Layout, S: Scorer, C: Cache, X: Executor>(
    env: &Env<'_, T, L, S, C>,
    x: &X,
    q: &mut Query<T>,
    xs: &mut X::State,
    io: &mut Io,
    slot: usize,
) -> Result<()> {
    loop {
        x.step(env, q, xs, io, slot)?;
        if q.phase != Phase::Done {
            return Ok(());
        }
        if widen(env, q) {
            q.phase = Phase::Idle;
            continue;
        }
        refine::begin(env, q, io, slot)?;
        return Ok(());
    }
}

/// Takes one completion: attribution by token, then (for a repeatable
/// plan, through the query's reorder buffer, so that its pages are
/// processed in the order the reads were issued) the processing of the
/// page and the owning query's next steps. Every buffer goes back to the
/// pool once its page is processed or its query has ended.
#[allow(clippy::too_many_arguments)]
fn on_completion<T: Element, L: Layout, S: Scorer, C: Cache, X: Executor, P: PagePolicy>(
    env: &Env<'_, T, L, S, C>,
    x: &X,
    policy: &P,
    s: &mut Scratch<T>,
    states: &mut [SlotState<X, P>],
    c: Completion,
    mark: &mut Instant,
    emit: &mut Emit<'_>,
) -> Result<()> {
    let token = c.token;
    let (slot, gen, r) = untoken(token);
    let (Some(q), Some(st)) = (s.slots.get_mut(slot), states.get_mut(slot)) else {
        s.io.pool.put(c.buf);
        return Err(Error::Engine(format!(
            "completion with unknown token {token:#x} (no query slot {slot})"
        )));
    };
    if !q.active() || q.gen != gen {
        // A read its query abandoned: the slot takes its next query once
        // every such read is back (so a slot never holds more than W reads).
        if q.gen == gen {
            q.arrived(r);
        }
        s.stale += 1;
        s.io.pool.put(c.buf);
        return Ok(());
    }
    if !env.plan.repeatable {
        let res = process(env, x, policy, q, st, &mut s.io, slot, r, &c, mark, emit);
        s.io.pool.put(c.buf);
        return res;
    }
    if let Err(c) = q.hold(r, c) {
        s.io.pool.put(c.buf);
        return Err(Error::Engine(format!(
            "completion with token {token:#x} for a read that is not in flight"
        )));
    }
    // Every page of the query that is next in issue order, as far as they
    // have arrived.
    let mut res = Ok(());
    while let Some((r, c)) = q.next_held() {
        res = process(env, x, policy, q, st, &mut s.io, slot, r, &c, mark, emit);
        s.io.pool.put(c.buf);
        if res.is_err() || !q.active() {
            break;
        }
    }
    if !q.active() {
        // Pages that came early for a query that has ended.
        s.stale += q.release_held(&mut s.io.pool);
    }
    res
}

/// Processes the page of read `r` of query `q` (in slot `slot`): checks,
/// the page policy (or the refine stage), then the query's next step.
#[allow(clippy::too_many_arguments)]
fn process<T: Element, L: Layout, S: Scorer, C: Cache, X: Executor, P: PagePolicy>(
    env: &Env<'_, T, L, S, C>,
    x: &X,
    policy: &P,
    q: &mut Query<T>,
    st: &mut SlotState<X, P>,
    io: &mut Io,
    slot: usize,
    r: u16,
    c: &Completion,
    mark: &mut Instant,
    emit: &mut Emit<'_>,
) -> Result<()> {
    let Some(read) = q.arrived(r) else {
        return Err(Error::Engine(format!(
            "completion with token {:#x} for a read that is not in flight",
            c.token
        )));
    };
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
    env.layout
        .verify(page, b)
        .map_err(|m| Error::corrupt(&data.pages_path, m))?;
    if q.phase == Phase::Refining {
        q.take_targets(r);
        if read.tag == REFINE_TAG {
            let targets = std::mem::take(&mut q.page_nodes);
            let done = refine::on_page(env, q, page, &targets);
            q.page_nodes = targets;
            if done? {
                q.phase = Phase::Done;
            }
        }
        // (A late page of the traversal: its nodes left the list.)
    } else {
        x.arrived(q, &mut st.x, read, r);
        q.take_targets(r);
        let targets = std::mem::take(&mut q.page_nodes);
        let res = policy.on_page(env, q, &mut st.p, b, page, &targets);
        q.page_nodes = targets;
        res?;
        step(env, x, q, &mut st.x, io, slot)?;
        if policy.has_deferred(&st.p) {
            // The page's remaining work overlaps the reads just issued.
            if X::FLUSH_BEFORE_DEFERRED {
                io.engine.flush()?;
            }
            policy.deferred(env, q, &mut st.p, page)?;
            // What it found may keep the query going, or let it issue more.
            if q.phase == Phase::Done {
                q.phase = Phase::Idle;
            }
            if q.phase != Phase::Refining {
                step(env, x, q, &mut st.x, io, slot)?;
            }
        }
    }
    charge(q, mark);
    if q.phase == Phase::Done {
        finish(env, q, emit);
    }
    Ok(())
}

/// Ends query `q`: its best `k` and statistics go to `emit`.
fn finish<T: Element, L: Layout, S: Scorer, C: Cache>(
    env: &Env<'_, T, L, S, C>,
    q: &mut Query<T>,
    emit: &mut Emit<'_>,
) {
    q.phase = Phase::Done;
    sort_dedup(&mut q.exact);
    let k = match env.plan.range {
        Some(r) => q.exact.partition_point(|e| e.0 <= r.radius),
        None => env.plan.k.min(q.exact.len()),
    };
    q.stats.total_us = q.started.elapsed().as_secs_f64() * 1e6;
    emit(q.qi, &q.exact[..k], &q.stats);
}
