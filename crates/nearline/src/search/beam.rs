//! DiskANN's beam search over the page file: PQ routing from codes in RAM,
//! W reads per hop through the worker's I/O engine, exact re-ranking from
//! the vectors in the fetched records, served from the node cache when held.

use super::candidates::CandidateList;
use super::entry::EntryPoints;
use super::stats::QueryStats;
use crate::cache::{IdMap, NodeCache};
use crate::data::dtype::Element;
use crate::distance::Metric;
use crate::io::{BufferPool, Completion, EngineKind, IoEngine};
use crate::layout::page::{ids, verify_block, PageGeometry};
use crate::quant::pq::{adc, PqCodebook, PQ_CENTROIDS};
use crate::{Error, Result};
use std::fs::File;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Largest beam width accepted (reads in flight per query).
pub const MAX_BEAM_WIDTH: usize = 64;

/// Largest candidate list accepted (and so the largest k).
pub const MAX_LIST_SIZE: usize = 1 << 22;

/// Search parameters of one batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchParams {
    /// Results per query.
    pub k: usize,
    /// Candidate list size (≥ k).
    pub l: usize,
    /// Beam width: reads issued per hop.
    pub w: usize,
}

impl SearchParams {
    /// Validates the parameters.
    pub fn check(&self) -> Result<()> {
        if self.k == 0 {
            return Err(Error::arg("k must be at least 1"));
        }
        if self.l < self.k {
            return Err(Error::arg(format!(
                "L={} must be at least k={}",
                self.l, self.k
            )));
        }
        if self.l > MAX_LIST_SIZE {
            return Err(Error::arg(format!(
                "L={} exceeds the maximum list size {MAX_LIST_SIZE}",
                self.l
            )));
        }
        if self.w == 0 || self.w > MAX_BEAM_WIDTH {
            return Err(Error::arg(format!(
                "W={} must be in 1..={MAX_BEAM_WIDTH}",
                self.w
            )));
        }
        Ok(())
    }
}

/// The read-only, shared part of an open index that searches need.
pub struct IndexData<T: Element> {
    pub geo: PageGeometry,
    pub metric: Metric,
    pub dim: usize,
    pub n: usize,
    pub medoid: u32,
    pub codebook: PqCodebook,
    /// Row-major `n × m` PQ codes.
    pub codes: Vec<u8>,
    pub cache: NodeCache,
    pub pages_path: PathBuf,
    pub file: Arc<File>,
    pub io_kind: EngineKind,
    /// Where each query's search starts.
    pub entries: EntryPoints<T>,
    pub _elem: PhantomData<T>,
}

/// One worker's state: its I/O engine, buffers and scratch space.
pub struct Scratch<T: Element> {
    engine: IoEngine,
    pool: BufferPool,
    table: Vec<f32>,
    cand: CandidateList,
    visited: IdMap<()>,
    exact: Vec<(f32, u32)>,
    frontier: Vec<u32>,
    /// Blocks read in the current hop (token = index).
    pending: Vec<u64>,
    /// Uncached nodes of the current hop and the read (token) serving each.
    node_reads: Vec<(u32, u32)>,
    completions: Vec<Completion>,
    qf: Vec<f32>,
    qt: Vec<T>,
    /// Best results of the last query: (internal distance, id).
    pub results: Vec<(f32, u32)>,
}

impl<T: Element> Scratch<T> {
    /// A worker for `data`, opening its own I/O engine.
    pub fn new(data: &IndexData<T>) -> Result<Self> {
        let engine = IoEngine::open(data.io_kind, data.file.clone(), MAX_BEAM_WIDTH as u32)?;
        Ok(Self::with_engine(data, engine))
    }

    /// A worker using the given engine (tests pass a fake one).
    pub fn with_engine(data: &IndexData<T>, engine: IoEngine) -> Self {
        Scratch {
            engine,
            pool: BufferPool::new(data.geo.block_size),
            table: vec![0.0; data.codebook.m() * PQ_CENTROIDS],
            cand: CandidateList::default(),
            visited: IdMap::default(),
            exact: Vec::new(),
            frontier: Vec::new(),
            pending: Vec::new(),
            node_reads: Vec::new(),
            completions: Vec::new(),
            qf: Vec::with_capacity(data.dim),
            qt: Vec::with_capacity(data.dim),
            results: Vec::new(),
        }
    }

    /// Name of this worker's I/O engine.
    pub fn engine_name(&self) -> &'static str {
        self.engine.name()
    }

    /// Bytes of scratch memory this worker holds.
    pub fn memory_bytes(&self) -> usize {
        self.pool.allocated() * self.pool.buf_len()
            + self.table.capacity() * 4
            + self.visited.capacity() * 9
            + self.exact.capacity() * 8
    }

    /// Reaps every read still in flight (used before returning on an error),
    /// so no buffer is reused while the kernel may still write into it.
    fn drain(&mut self) {
        self.completions.clear();
        let _ = self.engine.drain(&mut self.completions);
        for c in self.completions.drain(..) {
            self.pool.put(c.buf);
        }
    }

    /// Reads this worker's engine has in flight (0 between queries).
    pub fn in_flight(&self) -> usize {
        self.engine.in_flight()
    }
}

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

/// Searches one query; the best `k` land in `s.results`.
pub fn search_one<T: Element>(
    data: &IndexData<T>,
    s: &mut Scratch<T>,
    query: &[f32],
    p: &SearchParams,
    st: &mut QueryStats,
) -> Result<()> {
    let t0 = Instant::now();
    let r = search_inner(data, s, query, p, st);
    if r.is_err() {
        s.drain();
    }
    st.total_us = t0.elapsed().as_secs_f64() * 1e6;
    st.cpu_us = (st.total_us - st.io_wait_us).max(0.0);
    r
}

fn search_inner<T: Element>(
    data: &IndexData<T>,
    s: &mut Scratch<T>,
    query: &[f32],
    p: &SearchParams,
    st: &mut QueryStats,
) -> Result<()> {
    if query.len() != data.dim {
        return Err(Error::arg(format!(
            "query has dimension {}, the index has {}",
            query.len(),
            data.dim
        )));
    }
    prepare_query(data.metric, query, &mut s.qf, &mut s.qt)?;
    data.codebook.lookup_table(&s.qf, data.metric, &mut s.table);
    s.cand.reset(p.l);
    s.visited.clear();
    s.exact.clear();
    s.results.clear();
    if data.n == 0 {
        return Ok(());
    }
    let m = data.codebook.m();
    let geo = &data.geo;
    let codes = &data.codes;
    let pq = |table: &[f32], v: u32| adc(table, &codes[v as usize * m..(v as usize + 1) * m]);

    s.frontier.clear();
    data.entries.seeds(data.metric, &s.qt, &mut s.frontier, st);
    for i in 0..s.frontier.len() {
        let start = s.frontier[i];
        if s.visited.insert(start, ()).is_none() {
            s.cand.insert(pq(&s.table, start), start);
            st.pq_distances += 1;
        }
    }

    loop {
        s.frontier.clear();
        s.cand.take_unexpanded(p.w, &mut s.frontier);
        if s.frontier.is_empty() {
            break;
        }
        st.hops += s.frontier.len() as u32;
        // Submit the reads of uncached nodes (one read per block), then work
        // on cached nodes while they are in flight.
        s.pending.clear();
        s.node_reads.clear();
        for i in 0..s.frontier.len() {
            let v = s.frontier[i];
            if data.cache.get(v).is_some() {
                continue;
            }
            let (b, _) = geo.location(v);
            if let Some(t) = s.pending.iter().position(|&pb| pb == b) {
                s.node_reads.push((v, t as u32));
                continue;
            }
            let token = s.pending.len() as u64;
            s.pending.push(b);
            s.node_reads.push((v, token as u32));
            let buf = s.pool.get();
            s.engine.submit(token, geo.block_offset(b), buf)?;
            st.reads += 1;
            st.bytes_read += geo.block_size as u64;
        }
        if !s.pending.is_empty() {
            s.engine.flush()?;
        }
        for i in 0..s.frontier.len() {
            let v = s.frontier[i];
            if let Some(rec) = data.cache.get(v) {
                st.cache_hits += 1;
                expand(data, s, v, rec, st)?;
            }
        }
        // Reap every read of this hop.
        while s.engine.in_flight() > 0 {
            s.completions.clear();
            let tw = Instant::now();
            // One wait for the whole hop: a wake-up per completion costs a
            // system call and a context switch each (measured: ~10% QPS).
            let want = s.engine.in_flight();
            s.engine.wait(want, &mut s.completions)?;
            st.io_wait_us += tw.elapsed().as_secs_f64() * 1e6;
            let mut comps = std::mem::take(&mut s.completions);
            let mut result = Ok(());
            for c in comps.drain(..) {
                if result.is_ok() {
                    result = process_completion(data, s, &c, st);
                }
                s.pool.put(c.buf);
            }
            s.completions = comps;
            result?;
        }
    }
    s.exact
        .sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    s.exact.dedup_by_key(|e| e.1);
    s.results.extend(s.exact.iter().take(p.k).copied());
    Ok(())
}

fn process_completion<T: Element>(
    data: &IndexData<T>,
    s: &mut Scratch<T>,
    c: &Completion,
    st: &mut QueryStats,
) -> Result<()> {
    let geo = &data.geo;
    let b = *s
        .pending
        .get(c.token as usize)
        .ok_or_else(|| Error::Engine(format!("completion with unknown token {}", c.token)))?;
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
    let block = &c.buf.as_slice()[..geo.block_size];
    verify_block(block, b, geo).map_err(|m| Error::corrupt(&data.pages_path, m))?;
    for i in 0..s.node_reads.len() {
        let (v, t) = s.node_reads[i];
        if t as u64 != c.token {
            continue;
        }
        let (_, slot) = geo.location(v);
        let rec = geo.record(block, slot);
        st.used_bytes += geo.record_size as u64;
        expand(data, s, v, rec, st)?;
    }
    Ok(())
}

#[inline]
fn expand<T: Element>(
    data: &IndexData<T>,
    s: &mut Scratch<T>,
    v: u32,
    rec: &[u8],
    st: &mut QueryStats,
) -> Result<()> {
    let geo = &data.geo;
    let (vec_bytes, nbrs) = geo.split_record(rec).ok_or_else(|| {
        Error::corrupt(
            &data.pages_path,
            format!("record of node {v} has a degree above R"),
        )
    })?;
    let x: &[T] = bytemuck::try_cast_slice(vec_bytes).map_err(|_| {
        Error::corrupt(
            &data.pages_path,
            format!("record of node {v} is misaligned"),
        )
    })?;
    let d = data.metric.distance(&s.qt, x);
    st.exact_distances += 1;
    s.exact.push((d, v));
    let m = data.codebook.m();
    for u in ids(nbrs) {
        if u as usize >= data.n {
            return Err(Error::corrupt(
                &data.pages_path,
                format!(
                    "node {v} lists neighbour {u}, but the index has {} nodes",
                    data.n
                ),
            ));
        }
        if s.visited.insert(u, ()).is_none() {
            let du = adc(&s.table, &data.codes[u as usize * m..(u as usize + 1) * m]);
            st.pq_distances += 1;
            s.cand.insert(du, u);
        }
    }
    Ok(())
}
