//! The worker pool: N workers, each owning an I/O engine (one ring each),
//! a buffer pool and scratch space, pulling queries from a shared counter.
//! No rayon task per query: rayon is for builds.

use super::executor::{run, Scratch};
use super::index_data::IndexData;
use super::plan::SearchPlan;
use super::stats::QueryStats;
use crate::elem::Element;
use crate::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Results of a batch: for a top-k search, row-major `nq × k` internal ids
/// (`u32::MAX` pads) and internal distances (`+inf` pads); for a range
/// search, each query's results back to back with `lims` (nq + 1 offsets:
/// query i's results are `lims[i]..lims[i + 1]`). Per-query statistics.
#[derive(Debug, Default)]
pub struct BatchResult {
    pub ids: Vec<u32>,
    pub distances: Vec<f32>,
    /// Range search only (empty for a top-k search).
    pub lims: Vec<u64>,
    pub stats: Vec<QueryStats>,
}

/// Resident bytes a worker costs besides its scratch: the thread's stack
/// (glibc keeps the stacks of exited threads for reuse) and its allocator
/// arena's slack. Measured at 70–90 KB per worker on a 384-d index (RSS
/// growth of a search batch less the workers' counted scratch); rounded up.
pub const WORKER_THREAD_BYTES: usize = 128 * 1024;

/// Idle workers kept between batches (rings and buffers are reused).
pub struct WorkerPool<T: Element> {
    idle: Mutex<Vec<Scratch<T>>>,
}

impl<T: Element> Default for WorkerPool<T> {
    fn default() -> Self {
        WorkerPool {
            idle: Mutex::new(Vec::new()),
        }
    }
}

impl<T: Element> WorkerPool<T> {
    fn idle(&self) -> Result<std::sync::MutexGuard<'_, Vec<Scratch<T>>>> {
        self.idle
            .lock()
            .map_err(|_| Error::Engine("worker pool lock poisoned".into()))
    }

    /// Bytes one worker holds: its scratch and what its thread costs
    /// ([`WORKER_THREAD_BYTES`]).
    pub fn held_by(s: &Scratch<T>) -> u64 {
        (s.memory_bytes() + WORKER_THREAD_BYTES) as u64
    }

    /// Bytes held by idle workers.
    pub fn memory_bytes(&self) -> usize {
        self.idle
            .lock()
            .map(|g| g.iter().map(|s| Self::held_by(s) as usize).sum())
            .unwrap_or(0)
    }

    /// Takes up to `n` idle workers for a batch. A worker holding more than
    /// `max_each` bytes (grown by an earlier, larger search) is dropped
    /// instead, so that what the batch holds is what its plan counted.
    pub fn claim(&self, n: usize, max_each: u64) -> Vec<Scratch<T>> {
        let Ok(mut g) = self.idle() else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let Some(s) = g.pop() else { break };
            if Self::held_by(&s) <= max_each {
                out.push(s);
            }
        }
        out
    }

    /// Bytes of the idle workers [`WorkerPool::claim`] would take now.
    pub fn claimable(&self, n: usize, max_each: u64) -> u64 {
        let Ok(g) = self.idle() else {
            return 0;
        };
        g.iter()
            .rev()
            .map(Self::held_by)
            .filter(|&b| b <= max_each)
            .take(n)
            .sum()
    }

    /// Hands workers back to the idle pool.
    pub fn put_back(&self, workers: Vec<Scratch<T>>) {
        if let Ok(mut g) = self.idle() {
            g.extend(workers);
        }
    }

    /// Drops idle workers, the largest first, until they hold at most
    /// `bytes`; returns what they hold.
    pub fn trim(&self, bytes: u64) -> u64 {
        let Ok(mut g) = self.idle() else {
            return 0;
        };
        g.sort_by_key(|s| Self::held_by(s));
        let mut held: u64 = g.iter().map(Self::held_by).sum();
        while held > bytes {
            match g.pop() {
                Some(s) => held -= Self::held_by(&s),
                None => break,
            }
        }
        held
    }

    /// [`WorkerPool::run_batch`] on idle workers (any size), handing them
    /// back afterwards (tests and callers that keep no memory account).
    pub fn search_batch(
        &self,
        data: &IndexData<T>,
        queries: &[f32],
        nq: usize,
        p: &SearchPlan,
        threads: usize,
    ) -> Result<BatchResult> {
        let workers = self.claim(threads.clamp(1, nq.max(1)), u64::MAX);
        let (r, workers) = self.run_batch(data, workers, queries, nq, p, threads);
        self.put_back(workers);
        r
    }

    /// Searches `nq` row-major queries of dimension `data.dim` with
    /// `threads` workers, each interleaving `p.queries_in_flight` queries:
    /// the `workers` given (claimed from the pool), and new ones when they
    /// are fewer. Returns the workers with the result, for the caller to
    /// hand back.
    pub fn run_batch(
        &self,
        data: &IndexData<T>,
        workers: Vec<Scratch<T>>,
        queries: &[f32],
        nq: usize,
        p: &SearchPlan,
        threads: usize,
    ) -> (Result<BatchResult>, Vec<Scratch<T>>) {
        let given = Mutex::new(workers);
        let done = Mutex::new(Vec::new());
        let r = self.run_on(data, &given, &done, queries, nq, p, threads);
        let mut back = given.into_inner().unwrap_or_default();
        back.extend(done.into_inner().unwrap_or_default());
        (r, back)
    }

    #[allow(clippy::too_many_arguments)]
    fn run_on(
        &self,
        data: &IndexData<T>,
        given: &Mutex<Vec<Scratch<T>>>,
        done: &Mutex<Vec<Scratch<T>>>,
        queries: &[f32],
        nq: usize,
        p: &SearchPlan,
        threads: usize,
    ) -> Result<BatchResult> {
        p.check()?;
        if queries.len() != nq * data.dim {
            return Err(Error::arg(format!(
                "queries hold {} values, expected {nq} × {} (the index's dimension)",
                queries.len(),
                data.dim
            )));
        }
        let k = p.k;
        let range = p.range.is_some();
        let mut out = if range {
            BatchResult {
                lims: vec![0; nq + 1],
                stats: vec![QueryStats::default(); nq],
                ..BatchResult::default()
            }
        } else {
            BatchResult {
                ids: vec![u32::MAX; nq * k],
                distances: vec![f32::INFINITY; nq * k],
                lims: Vec::new(),
                stats: vec![QueryStats::default(); nq],
            }
        };
        if nq == 0 {
            return Ok(out);
        }
        let threads = threads.clamp(1, nq);
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        // Each worker keeps its finished queries (index, statistics, where
        // its results start in the flat vector, how many) and their
        // (distance, id) pairs in one flat vector.
        type Rows = (Vec<(usize, QueryStats, usize, usize)>, Vec<(f32, u32)>);
        let per_worker: Vec<Result<Rows>> = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    sc.spawn(|| -> Result<Rows> {
                        let popped = given
                            .lock()
                            .map_err(|_| Error::Engine("worker pool lock poisoned".into()))?
                            .pop();
                        let mut s = match popped {
                            Some(s) => s,
                            None => Scratch::new(data)?,
                        };
                        let mut rows = Vec::new();
                        let mut res = Vec::new();
                        let mut next_query = || {
                            if failed.load(Ordering::Relaxed) {
                                return None;
                            }
                            let qi = next.fetch_add(1, Ordering::Relaxed);
                            (qi < nq).then_some(qi)
                        };
                        let r = run(
                            data,
                            &mut s,
                            p,
                            queries,
                            &mut next_query,
                            &mut |qi, best, st| {
                                rows.push((qi, *st, res.len(), best.len()));
                                res.extend_from_slice(best);
                            },
                        );
                        if r.is_err() {
                            failed.store(true, Ordering::Relaxed);
                        }
                        if let Ok(mut d) = done.lock() {
                            d.push(s);
                        }
                        r.map(|_| (rows, res))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Engine("a search worker panicked".into())))
                })
                .collect()
        });
        let mut done = Vec::with_capacity(per_worker.len());
        for r in per_worker {
            done.push(r?);
        }
        if range {
            // Offsets first, then each query's results at its offset.
            let mut counts = vec![0u64; nq];
            for (rows, _) in &done {
                for &(qi, _, _, len) in rows {
                    counts[qi] = len as u64;
                }
            }
            for (i, c) in counts.iter().enumerate() {
                out.lims[i + 1] = out.lims[i] + c;
            }
            let total = out.lims[nq] as usize;
            out.ids = vec![u32::MAX; total];
            out.distances = vec![f32::INFINITY; total];
        }
        for (rows, res) in done {
            for (qi, st, start, len) in rows {
                let base = if range { out.lims[qi] as usize } else { qi * k };
                for (c, &(d, id)) in res[start..start + len].iter().enumerate() {
                    out.ids[base + c] = id;
                    out.distances[base + c] = d;
                }
                out.stats[qi] = st;
            }
        }
        Ok(out)
    }
}
