//! The worker pool: N workers, each owning an I/O engine (one ring each),
//! a buffer pool and scratch space, pulling queries from a shared counter.
//! No rayon task per query: rayon is for builds.

use super::executor::{run, IndexData, Scratch};
use super::params::SearchParams;
use super::stats::QueryStats;
use crate::data::dtype::Element;
use crate::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Results of a batch: row-major `nq × k` internal ids (`u32::MAX` pads),
/// internal distances (`+inf` pads) and per-query statistics.
#[derive(Debug, Default)]
pub struct BatchResult {
    pub ids: Vec<u32>,
    pub distances: Vec<f32>,
    pub stats: Vec<QueryStats>,
}

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
    fn take(&self, data: &IndexData<T>) -> Result<Scratch<T>> {
        let popped = self
            .idle
            .lock()
            .map_err(|_| Error::Engine("worker pool lock poisoned".into()))?
            .pop();
        match popped {
            Some(s) => Ok(s),
            None => Scratch::new(data),
        }
    }

    fn give_back(&self, s: Scratch<T>) {
        if let Ok(mut g) = self.idle.lock() {
            g.push(s);
        }
    }

    /// Bytes held by idle workers.
    pub fn memory_bytes(&self) -> usize {
        self.idle
            .lock()
            .map(|g| g.iter().map(|s| s.memory_bytes()).sum())
            .unwrap_or(0)
    }

    /// Name of the I/O engine a worker uses (opening one if none is idle).
    pub fn engine_name(&self, data: &IndexData<T>) -> Result<&'static str> {
        let s = self.take(data)?;
        let name = s.engine_name();
        self.give_back(s);
        Ok(name)
    }

    /// Searches `nq` row-major queries of dimension `data.dim` with `threads` workers.
    pub fn search_batch(
        &self,
        data: &IndexData<T>,
        queries: &[f32],
        nq: usize,
        p: &SearchParams,
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
        let mut out = BatchResult {
            ids: vec![u32::MAX; nq * k],
            distances: vec![f32::INFINITY; nq * k],
            stats: vec![QueryStats::default(); nq],
        };
        if nq == 0 {
            return Ok(out);
        }
        let threads = threads.clamp(1, nq);
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        // Each worker keeps its finished queries: index, statistics, and k
        // (distance, id) pairs per query (padded) in one flat vector.
        type Rows = (Vec<(usize, QueryStats)>, Vec<(f32, u32)>);
        let per_worker: Vec<Result<Rows>> = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    sc.spawn(|| -> Result<Rows> {
                        let mut s = self.take(data)?;
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
                                rows.push((qi, *st));
                                res.extend_from_slice(best);
                                res.resize(rows.len() * k, (f32::INFINITY, u32::MAX));
                            },
                        );
                        if r.is_err() {
                            failed.store(true, Ordering::Relaxed);
                        }
                        self.give_back(s);
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
        for r in per_worker {
            let (rows, res) = r?;
            for (j, (qi, st)) in rows.into_iter().enumerate() {
                for (c, &(d, id)) in res[j * k..(j + 1) * k].iter().enumerate() {
                    out.ids[qi * k + c] = id;
                    out.distances[qi * k + c] = d;
                }
                out.stats[qi] = st;
            }
        }
        Ok(out)
    }
}
