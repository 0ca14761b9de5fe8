//! k-NN search of a partition index: the nearest heads in memory, every
//! posting read of a group of queries in flight at once, exact scoring of
//! the live entries.

use super::posting::{self, entry_head, read_entry, BLOCK};
use super::store::{runs, PostingRef};
use super::{
    check_rows, lire, lock, read, Answered, Found, Inner, PartitionResults, PartitionSearch,
    COLLECT_STALE, DELETED, DEPTH, QUERIES_IN_FLIGHT,
};
use crate::distance::{normalize, Metric};
use crate::graph::vamana::SearchScratch;
use crate::io::{AlignedBuf, Completion, IoEngine};
use crate::search::QueryStats;
use crate::{Error, Result};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

impl Inner {
    pub(super) fn engine(&self) -> Result<IoEngine> {
        if let Some(e) = lock(&self.engines).pop() {
            return Ok(e);
        }
        IoEngine::open(self.io, Arc::clone(&self.read_file), DEPTH)
    }

    pub(super) fn search(
        &self,
        queries: &[f32],
        nq: usize,
        opts: &PartitionSearch,
    ) -> Result<PartitionResults> {
        let dim = self.dim;
        if queries.len() != nq * dim {
            return Err(Error::arg(format!(
                "queries hold {} values, expected {nq} × {dim} (the index's dimension)",
                queries.len()
            )));
        }
        if opts.k == 0 {
            return Err(Error::arg("k must be at least 1"));
        }
        if opts.nprobe == 0 {
            return Err(Error::arg("nprobe must be at least 1"));
        }
        if let Some(c) = opts.probe_cut {
            if !(c.is_finite() && c >= 0.0) {
                return Err(Error::arg(format!(
                    "probe_cut={c} must be a finite number ≥ 0"
                )));
            }
            if self.metric == Metric::InnerProduct {
                return Err(Error::arg(
                    "probe_cut needs distances that are not negative (l2 or cosine); inner-product \
                     scores have no scale to multiply",
                ));
            }
        }
        if let Some(l) = opts.l {
            if l == 0 {
                return Err(Error::arg("L must be at least 1"));
            }
        }
        check_rows(queries, "queries", dim)?;
        let k = opts.k;
        let threads = opts
            .threads
            .filter(|&t| t > 0)
            .unwrap_or(self.threads)
            .min(nq.max(1));
        // Queries a worker interleaves: enough to keep the disk busy, never
        // fewer queries than workers.
        let group = opts
            .queries_in_flight
            .unwrap_or(QUERIES_IN_FLIGHT)
            .clamp(1, 64)
            .min(nq.div_ceil(threads.max(1)).max(1));
        let mut ids = vec![-1i64; nq * k];
        let mut dists = vec![f32::INFINITY; nq * k];
        let mut stats = vec![QueryStats::default(); nq];
        let next = std::sync::atomic::AtomicUsize::new(0);
        let chunks: Vec<Result<Vec<Answered>>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads.max(1))
                .map(|_| {
                    s.spawn(|| -> Result<Vec<Answered>> {
                        let mut eng = self.engine()?;
                        let mut sc = SearchScratch::new();
                        let mut out = Vec::new();
                        let res = (|| {
                            loop {
                                let i = next.fetch_add(group, Ordering::Relaxed);
                                if i >= nq {
                                    break;
                                }
                                let end = (i + group).min(nq);
                                let qs: Vec<Vec<f32>> = (i..end)
                                    .map(|j| {
                                        let mut q = queries[j * dim..(j + 1) * dim].to_vec();
                                        if self.metric == Metric::Cosine {
                                            normalize(&mut q);
                                        }
                                        q
                                    })
                                    .collect();
                                let r = self.search_group(&qs, opts, &mut eng, &mut sc)?;
                                for (j, (ids, st)) in r.into_iter().enumerate() {
                                    out.push((i + j, ids, st));
                                }
                            }
                            Ok(())
                        })();
                        lock(&self.engines).push(eng);
                        res.map(|_| out)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::arg("a search thread panicked")))
                })
                .collect()
        });
        for c in chunks {
            for (i, r, st) in c? {
                for (j, (d, id)) in r.into_iter().enumerate() {
                    ids[i * k + j] = id;
                    dists[i * k + j] = d;
                }
                stats[i] = st;
            }
        }
        // A reader: the vectors the writer inserted since its checkpoint.
        self.merge_delta(queries, k, &mut ids, &mut dists);
        Ok(PartitionResults {
            ids,
            distances: dists,
            stats,
        })
    }

    /// A group of queries on one worker: each query's nearest heads, then
    /// every posting read of the group in flight at once; a query is scored
    /// as soon as its own reads have arrived, while the others' are still
    /// in flight. Returns per query `(distance, external id)`, nearest
    /// first, and its statistics.
    pub(super) fn search_group(
        &self,
        qs: &[Vec<f32>],
        opts: &PartitionSearch,
        eng: &mut IoEngine,
        sc: &mut SearchScratch,
    ) -> Result<Vec<Found>> {
        let dim = self.dim;
        let nq = qs.len();
        // A head graph that splits have grown needs a longer list than the
        // built one for the same heads: on a shifted 100k workload, by epoch
        // 50 a list of 64 found the true 32 nearest heads for 0.92 recall,
        // 128 for 0.98 (the built graph: 0.98 at 64); on the 1M shifted
        // workload at epoch 100 (92k heads grown to ~107k), nprobe 32 gave
        // recall 0.978 with a list of 128, 0.990 with 256, 0.990 with 4,096
        // (a fresh build of the same live set: 0.991). The list costs
        // memory reads only.
        let l = opts
            .l
            .unwrap_or((8 * opts.nprobe).max(128))
            .max(opts.nprobe);
        let t0 = Instant::now();
        let mut stats = vec![QueryStats::default(); nq];
        let mut nears = Vec::with_capacity(nq);
        // The gate from before the routing to the last version check (see
        // `lire`'s moves); the heads' lock from the routing to the copy of
        // the posting map, so the two agree: a split or merge that retired
        // a routed head cannot empty its posting in between (its entries
        // would then be in postings this query never routed to).
        let _gate = read(&self.gate);
        let refs: Vec<Vec<(u32, Arc<PostingRef>)>> = {
            let heads = read(&self.heads);
            for (qi, q) in qs.iter().enumerate() {
                let mut near = heads.search(sc, q, opts.nprobe, l);
                stats[qi].pq_distances = near.len() as u32;
                if let (Some(cut), Some(&(d0, _))) = (opts.probe_cut, near.first()) {
                    let f = match self.metric {
                        Metric::L2 => (1.0 + cut) * (1.0 + cut),
                        _ => 1.0 + cut,
                    };
                    let lim = d0.max(0.0) * f;
                    near.retain(|&(d, _)| d <= lim);
                }
                nears.push(near);
            }
            let map = read(&self.postings);
            nears
                .iter()
                .map(|near| {
                    near.iter()
                        .filter_map(|&(_, p)| {
                            map.get(p as usize).cloned().flatten().map(|r| (p, r))
                        })
                        .collect()
                })
                .collect()
        };
        // (query, posting of the query, first block, its index, blocks)
        let mut reads: Vec<(usize, usize, u32, u32, u32)> = Vec::new();
        let mut pending = vec![0usize; nq];
        for (qi, rs) in refs.iter().enumerate() {
            stats[qi].hops = rs.len() as u32;
            for (pi, (_, r)) in rs.iter().enumerate() {
                let need = posting::blocks_for(r.count as usize, dim);
                for (b0, i0, len) in runs(&r.blocks[..need.min(r.blocks.len())]) {
                    reads.push((qi, pi, b0, i0, len));
                    pending[qi] += 1;
                }
            }
        }
        let mut streams: Vec<Vec<Vec<u8>>> =
            refs.iter().map(|rs| vec![Vec::new(); rs.len()]).collect();
        // A query's completions wait here until all of its reads arrived
        // (its stream is assembled in block order).
        let mut arrived: Vec<Option<Completion>> = (0..reads.len()).map(|_| None).collect();
        let mut out: Vec<Option<Vec<(f32, i64)>>> = vec![None; nq];
        let versions = read(&self.versions);
        let external = read(&self.external);
        for qi in 0..nq {
            if pending[qi] == 0 {
                out[qi] = Some(self.score(
                    &qs[qi],
                    &refs[qi],
                    &mut streams[qi],
                    opts.k,
                    (&versions, &external),
                    &mut stats[qi],
                ));
                stats[qi].total_us = t0.elapsed().as_secs_f64() * 1e6;
            }
        }
        let mut comp = Vec::new();
        let mut issued = 0;
        let mut done = 0;
        let mut wait_ns = 0u128;
        while done < reads.len() {
            while issued < reads.len() && eng.in_flight() < DEPTH as usize {
                let (qi, _, b0, _, len) = reads[issued];
                eng.submit(
                    issued as u64,
                    b0 as u64 * BLOCK as u64,
                    AlignedBuf::new(len as usize * BLOCK),
                )?;
                stats[qi].reads += 1;
                stats[qi].bytes_read += len as u64 * BLOCK as u64;
                issued += 1;
            }
            eng.flush()?;
            comp.clear();
            let tw = Instant::now();
            eng.wait(1, &mut comp)?;
            wait_ns += tw.elapsed().as_nanos();
            for c in comp.drain(..) {
                let t = c.token as usize;
                let qi = reads[t].0;
                arrived[t] = Some(c);
                done += 1;
                pending[qi] -= 1;
                if pending[qi] > 0 {
                    continue;
                }
                // All of query qi's reads are in: check and assemble them in order.
                stats[qi].io_wait_us = wait_ns as f64 / 1e3;
                for (t2, &(q2, pi, b0, i0, len)) in reads.iter().enumerate() {
                    if q2 != qi {
                        continue;
                    }
                    let c = arrived[t2]
                        .take()
                        .ok_or_else(|| Error::Engine("a read never completed".into()))?;
                    let data = match &c.result {
                        Ok(_) => c.filled().unwrap_or(&[]),
                        Err(e) => {
                            return Err(Error::io(
                                self.store.path(),
                                std::io::Error::new(e.kind(), e.to_string()),
                            ))
                        }
                    };
                    let p = refs[qi][pi].0;
                    posting::decode_run(
                        self.store.path(),
                        p,
                        (b0, i0, len),
                        data,
                        &mut streams[qi][pi],
                    )?;
                }
                out[qi] = Some(self.score(
                    &qs[qi],
                    &refs[qi],
                    &mut streams[qi],
                    opts.k,
                    (&versions, &external),
                    &mut stats[qi],
                ));
                stats[qi].total_us = t0.elapsed().as_secs_f64() * 1e6;
            }
        }
        Ok(out
            .into_iter()
            .map(|o| o.unwrap_or_default())
            .zip(stats)
            .collect())
    }

    /// Scores a query's assembled postings: live entries, once per id,
    /// exact distances; queues a merge of any posting found under the
    /// merge threshold.
    pub(super) fn score(
        &self,
        q: &[f32],
        refs: &[(u32, Arc<PostingRef>)],
        streams: &mut [Vec<u8>],
        k: usize,
        (versions, external): (&[AtomicU32], &[u64]),
        st: &mut QueryStats,
    ) -> Vec<(f32, i64)> {
        let dim = self.dim;
        let tc = Instant::now();
        let mut best: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
        let mut seen: HashSet<u32> = HashSet::with_capacity(refs.len() * 16);
        let mut v = vec![0f32; dim];
        for (pi, (p, r)) in refs.iter().enumerate() {
            let s = &streams[pi];
            let mut live = 0usize;
            for i in 0..r.count as usize {
                let h = entry_head(s, dim, i);
                match Self::version_of(versions, h.id) {
                    Some(c) if c & DELETED == 0 && c == h.version => {}
                    _ => {
                        st.stale += 1;
                        continue;
                    }
                }
                live += 1;
                if !seen.insert(h.id) {
                    continue;
                }
                read_entry(s, dim, i, &mut v);
                let d = self.metric.distance(q, &v);
                st.exact_distances += 1;
                if best.len() < k || d < best[best.len() - 1].0 {
                    let pos = best.partition_point(|x| (x.0, x.1) < (d, h.id));
                    best.insert(pos, (d, h.id));
                    best.truncate(k);
                }
            }
            st.page_records += r.count;
            let stale = r.count as usize - live;
            if stale >= live.max(COLLECT_STALE) {
                // More dead entries than live ones: every query through this
                // posting reads them; the worker rewrites it.
                self.enqueue(lire::Job::Collect(*p));
            }
            if self.params.lire && live < self.params.merge_threshold {
                self.enqueue(lire::Job::Merge(*p));
            }
            streams[pi] = Vec::new();
        }
        st.dist_ns = tc.elapsed().as_nanos() as u64;
        st.cpu_us = tc.elapsed().as_secs_f64() * 1e6;
        // Mapped while the search still holds the gate: an id deleted
        // meanwhile is not reused before this search ends.
        best.into_iter()
            .map(|(d, id)| (d, external.get(id as usize).map_or(-1, |&e| e as i64)))
            .collect()
    }
}
