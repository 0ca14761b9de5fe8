//! The worker pool: N workers, each owning an I/O engine (one ring each),
//! a buffer pool and scratch space, pulling queries from a shared counter.
//! No rayon task per query: rayon is for builds.

use super::beam::{search_one, IndexData, Scratch, SearchParams};
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
        let dim = data.dim;
        type Rows = Vec<(usize, Vec<(f32, u32)>, QueryStats)>;
        let per_worker: Vec<Result<Rows>> = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    sc.spawn(|| -> Result<Rows> {
                        let mut s = self.take(data)?;
                        let mut rows = Vec::new();
                        let mut res = Ok(());
                        while !failed.load(Ordering::Relaxed) {
                            let qi = next.fetch_add(1, Ordering::Relaxed);
                            if qi >= nq {
                                break;
                            }
                            let mut st = QueryStats::default();
                            let q = &queries[qi * dim..(qi + 1) * dim];
                            if let Err(e) = search_one(data, &mut s, q, p, &mut st) {
                                failed.store(true, Ordering::Relaxed);
                                res = Err(e);
                                break;
                            }
                            rows.push((qi, s.results.clone(), st));
                        }
                        self.give_back(s);
                        res.map(|_| rows)
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
            for (qi, res, st) in r? {
                for (j, (d, id)) in res.into_iter().enumerate().take(k) {
                    out.ids[qi * k + j] = id;
                    out.distances[qi * k + j] = d;
                }
                out.stats[qi] = st;
            }
        }
        Ok(out)
    }
}
