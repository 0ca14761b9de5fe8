//! Inserts and deletes of a partition index: validation, the log record,
//! then the application (slots, versions, appends to postings).

use super::build;
use super::posting::{self, entry_bytes, PAYLOAD};
use super::store::PostingRef;
use super::{
    lire, lock, read, scattered, write, Ids, Inner, PartitionIndex, DELETED, MAX_VERSION, STRIPES,
    VERSION_MASK,
};
use crate::distance::{normalize, Metric};
use crate::elem::DType;
use crate::graph::dynamic::DynamicGraph as Heads;
use crate::graph::vamana::SearchScratch;
use crate::update::ids::check_insert_rows;
use crate::update::wal::Op;
use crate::{Error, Result};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

impl PartitionIndex {
    /// Checks an insert without doing it: `vectors` (`n × dim` row-major,
    /// finite, within the norm limit) and `ids` (as many, unique, not live,
    /// within the signed 64-bit range), or room for `n` automatic ids. A
    /// caller that inserts a file in batches checks it whole first, so bad
    /// input commits nothing (rows and ids are named by their place in
    /// `vectors`).
    pub fn validate_insert(&self, vectors: &[f32], ids: Option<&[u64]>) -> Result<()> {
        let inner = self.loaded();
        inner.writer()?;
        let g = lock(&inner.ids);
        inner.resolve_insert(&g, vectors, ids).map(|_| ())
    }

    /// Inserts `vectors` (`n × dim` row-major); `ids` gives their external
    /// ids (none may be live), else new ones are assigned above every id
    /// seen. Returns once the insert is logged durably (see
    /// [`PartitionOpen::durability`]) and visible to searches.
    pub fn insert(&self, vectors: &[f32], ids: Option<&[u64]>) -> Result<Vec<u64>> {
        let inner = self.loaded();
        let wal = inner.writer()?;
        inner.check_failed()?;
        let dim = inner.dim;
        let _u = lock(&inner.update);
        let ext = {
            let g = lock(&inner.ids);
            inner.resolve_insert(&g, vectors, ids)?
        };
        let mut v = vectors.to_vec();
        if inner.metric == Metric::Cosine {
            for r in v.chunks_exact_mut(dim) {
                normalize(r);
            }
        }
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        wal.append_op_durable(&Op::Insert {
            ids: ext.clone(),
            dim: dim as u32,
            dtype: DType::F32,
            vectors: bytes,
        })?;
        inner.apply_insert(&ext, &v)?;
        Ok(ext)
    }

    /// Deletes `ids`; unknown ids are ignored. Returns how many were live.
    /// Once it returns, no search returns them.
    pub fn delete(&self, ids: &[u64]) -> Result<usize> {
        let inner = self.loaded();
        let wal = inner.writer()?;
        inner.check_failed()?;
        let _u = lock(&inner.update);
        let live: Vec<u64> = {
            let g = lock(&inner.ids);
            let mut seen = HashSet::new();
            ids.iter()
                .copied()
                .filter(|i| g.tracker.contains(*i) && seen.insert(*i))
                .collect()
        };
        if live.is_empty() {
            return Ok(0);
        }
        wal.append_op_durable(&Op::Delete { ids: live.clone() })?;
        Ok(inner.apply_delete(&live))
    }
}

impl Inner {
    /// The external ids of an insert of `vectors` with `ids` (or automatic
    /// ones), after checking both (see [`PartitionIndex::validate_insert`]).
    fn resolve_insert(&self, g: &Ids, vectors: &[f32], ids: Option<&[u64]>) -> Result<Vec<u64>> {
        let n = check_insert_rows(vectors, self.dim)?;
        g.tracker.resolve_insert(ids, n, |_| false)
    }

    /// Postings for `x` (never `exclude`): the nearest head found, then the
    /// closure's and the RNG rule's (see [`build::select_postings`]).
    pub(super) fn targets(
        &self,
        heads: &Heads,
        sc: &mut SearchScratch,
        x: &[f32],
        exclude: Option<u32>,
    ) -> Vec<u32> {
        let cand: Vec<(f32, u32)> = heads
            .search(sc, x, build::REPLICA_CANDIDATES, build::REPLICA_L)
            .into_iter()
            .filter(|c| Some(c.1) != exclude)
            .collect();
        build::select_postings(heads, x, &cand, build::Replication::of(&self.params))
    }

    /// Applies a logged insert (also on replay): assigns internal ids, then
    /// appends every vector to its postings.
    pub(super) fn apply_insert(&self, ext: &[u64], v: &[f32]) -> Result<()> {
        let dim = self.dim;
        let n = ext.len();
        // Deleted ids become reusable once the searches that began before
        // their delete are over (those may still map them to the old
        // external id).
        let retired = {
            let ids = lock(&self.ids);
            if ids.free.len() < n {
                ids.retired.len()
            } else {
                0
            }
        };
        if retired > 0 {
            drop(write(&self.gate));
            let mut ids = lock(&self.ids);
            let r: Vec<u32> = ids.retired.drain(..retired).collect();
            ids.free.extend(r);
        }
        let items: Vec<(u32, u32, usize)> = {
            let mut ids = lock(&self.ids);
            let mut versions = write(&self.versions);
            let mut external = write(&self.external);
            let fresh = n.saturating_sub(ids.free.len());
            // Exact growth: the maps' capacity is resident memory.
            versions.reserve_exact(fresh);
            external.reserve_exact(fresh);
            let mut items = Vec::with_capacity(n);
            for (j, &e) in ext.iter().enumerate() {
                // Two versions on: entries of the deleted vector (its own,
                // or a move of it cut short by the delete, one version on)
                // never match the new one. Versions only grow; a slot
                // without room for two more is never reused.
                let reuse = loop {
                    match ids.free.pop() {
                        Some(i) => {
                            let old = versions[i as usize].load(Ordering::Acquire) & VERSION_MASK;
                            if old + 2 <= MAX_VERSION {
                                break Some((i, old + 2));
                            }
                        }
                        None => break None,
                    }
                };
                let (i, ver) = match reuse {
                    Some((i, ver)) => {
                        versions[i as usize].store(ver, Ordering::Release);
                        external[i as usize] = e;
                        (i, ver)
                    }
                    None => {
                        if versions.len() >= u32::MAX as usize {
                            return Err(Error::arg(format!(
                                "the index holds {} internal slots, the most a partition index has",
                                versions.len()
                            )));
                        }
                        versions.push(AtomicU32::new(0));
                        external.push(e);
                        ((versions.len() - 1) as u32, 0u32)
                    }
                };
                ids.tracker.insert(e, i);
                items.push((i, ver, j));
            }
            // Churn leaves deletion marks in the hash map that make it
            // double although it holds no more ids: rebuild it at its size.
            ids.tracker.shrink_if_sparse();
            items
        };
        self.place(&items, v, None)?;
        self.counters
            .inserted
            .fetch_add(n as u64, Ordering::Relaxed);
        let _ = dim;
        Ok(())
    }

    /// Appends entries `(internal id, version, row of rows)` to the postings
    /// the RNG rule picks for their vectors (never `exclude`), re-routing
    /// those whose posting disappeared meanwhile.
    pub(super) fn place(
        &self,
        items: &[(u32, u32, usize)],
        rows: &[f32],
        exclude: Option<u32>,
    ) -> Result<()> {
        use rayon::prelude::*;
        let dim = self.dim;
        let mut todo: Vec<(u32, u32, usize)> = items.to_vec();
        // Per row: the postings that already hold it, and how many of its
        // appends must still go somewhere. A posting split or merged away
        // under an append is replaced by the vector's next choice, never by
        // one that holds it already (a whole re-placement would append it
        // twice to the postings whose appends went through).
        let mut held: HashMap<usize, Vec<u32>> = HashMap::new();
        let mut missing: HashMap<usize, usize> = HashMap::new();
        let mut rounds = 0;
        while !todo.is_empty() {
            rounds += 1;
            if rounds > 2 {
                // A posting is being retired under us: let the job finish.
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            if rounds > 100 {
                let dead: Vec<u32> = {
                    let map = read(&self.postings);
                    let heads = read(&self.heads);
                    (0..heads.slots() as u32)
                        .filter(|&h| {
                            heads.is_alive(h) && map.get(h as usize).cloned().flatten().is_none()
                        })
                        .take(5)
                        .collect()
                };
                return Err(Error::arg(format!(
                    "postings kept disappearing while inserting; retry (live heads without a posting: {dead:?}; worker: {:?})",
                    lock(&self.failed).clone()
                )));
            }
            let placing = read(&self.placing);
            let routes: Vec<Vec<u32>> = {
                let heads = read(&self.heads);
                todo.par_iter()
                    .map_init(SearchScratch::new, |sc, &(_, _, r)| {
                        let mut t =
                            self.targets(&heads, sc, &rows[r * dim..(r + 1) * dim], exclude);
                        if let Some(h) = held.get(&r) {
                            t.retain(|p| !h.contains(p));
                            t.truncate(missing.get(&r).copied().unwrap_or(0));
                        }
                        t
                    })
                    .collect()
            };
            if let Some(t) = routes
                .iter()
                .zip(&todo)
                .position(|(ps, &(_, _, r))| ps.is_empty() && !held.contains_key(&r))
            {
                // Never acknowledge a vector stored nowhere.
                return Err(Error::arg(format!(
                    "no posting found for internal id {} (the head graph returned no live head)",
                    todo[t].0
                )));
            }
            let mut groups: HashMap<u32, Vec<usize>> = HashMap::new();
            for (t, r) in routes.iter().enumerate() {
                for &p in r {
                    groups.entry(p).or_default().push(t);
                }
            }
            let mut failed: HashMap<usize, usize> = HashMap::new();
            let mut keys: Vec<u32> = groups.keys().copied().collect();
            keys.sort_unstable();
            for p in keys {
                let ts = &groups[&p];
                let mut stream = Vec::with_capacity(ts.len() * entry_bytes(dim));
                for &t in ts {
                    let (id, ver, r) = todo[t];
                    posting::push_entry(&mut stream, id, ver, &rows[r * dim..(r + 1) * dim]);
                }
                // A retry may meet the vector in a posting a split wrote
                // meanwhile: the split copied it there from a posting this
                // placement had appended it to, before retiring that one.
                let ok = if rounds > 1 {
                    self.append_missing(p, &stream, ts.len() as u32)?
                } else {
                    self.append(p, &stream, ts.len() as u32)?
                };
                for &t in ts {
                    if ok {
                        held.entry(todo[t].2).or_default().push(p);
                    } else {
                        *failed.entry(t).or_default() += 1;
                    }
                }
            }
            drop(placing);
            let mut retry: Vec<(u32, u32, usize)> = Vec::new();
            for (t, n) in failed {
                missing.insert(todo[t].2, n);
                retry.push(todo[t]);
            }
            retry.sort_unstable();
            todo = retry;
        }
        Ok(())
    }

    /// Appends `n` encoded entries to posting `p` copy-on-write. `false`
    /// when `p` no longer exists (split or merged away).
    pub(super) fn append(&self, p: u32, stream_new: &[u8], n: u32) -> Result<bool> {
        let _g = lock(&self.stripes[p as usize % STRIPES]);
        let cur = match read(&self.postings).get(p as usize).cloned().flatten() {
            Some(c) => c,
            None => return Ok(false),
        };
        self.append_locked(p, &cur, stream_new, n)
    }

    /// The append itself, under `p`'s stripe, onto its current `cur`.
    fn append_locked(&self, p: u32, cur: &PostingRef, stream_new: &[u8], n: u32) -> Result<bool> {
        let e = entry_bytes(self.dim);
        let used = cur.count as usize * e;
        let full = used / PAYLOAD;
        let tail = used % PAYLOAD;
        let mut stream = if tail > 0 {
            let mut b = self.store.read_block(p, full as u32, cur.blocks[full])?;
            b.truncate(tail);
            b
        } else {
            Vec::new()
        };
        stream.extend_from_slice(stream_new);
        let nb = stream.len().div_ceil(PAYLOAD);
        let fresh = self.store.allocate(nb)?;
        if let Err(err) = self.store.write(p, full as u32, &fresh, &stream) {
            self.store.give_back(&fresh);
            return Err(err);
        }
        let mut blocks = cur.blocks[..full].to_vec();
        blocks.extend_from_slice(&fresh);
        let count = cur.count + n;
        let old = cur.blocks[full..].to_vec();
        let blocks_now = blocks.clone();
        write(&self.postings)[p as usize] = Some(Arc::new(PostingRef { blocks, count }));
        self.store.release(&old);
        if count as usize > self.params.posting_limit {
            self.enqueue(lire::Job::Split(p));
        } else if scattered(&blocks_now) {
            // Each append moves the posting's tail to a free block: past a
            // few runs a query pays a request per run; the worker rewrites
            // it into one.
            self.enqueue(lire::Job::Collect(p));
        }
        Ok(true)
    }

    /// [`Inner::append`] of those of the `n` entries of `stream_new` that
    /// posting `p` does not hold yet (the same id at the same version);
    /// `false` when `p` no longer exists. Reads the whole posting: for the
    /// rare retries of a placement only.
    pub(super) fn append_missing(&self, p: u32, stream_new: &[u8], n: u32) -> Result<bool> {
        let _g = lock(&self.stripes[p as usize % STRIPES]);
        let cur = match read(&self.postings).get(p as usize).cloned().flatten() {
            Some(c) => c,
            None => return Ok(false),
        };
        let dim = self.dim;
        let held = self.store.read(p, &cur)?;
        let present: HashSet<(u32, u32)> = (0..cur.count as usize)
            .map(|i| {
                let h = posting::entry_head(&held, dim, i);
                (h.id, h.version)
            })
            .collect();
        let e = entry_bytes(dim);
        let mut keep = Vec::with_capacity(stream_new.len());
        let mut m = 0u32;
        for i in 0..n as usize {
            let h = posting::entry_head(stream_new, dim, i);
            if !present.contains(&(h.id, h.version)) {
                keep.extend_from_slice(&stream_new[i * e..(i + 1) * e]);
                m += 1;
            }
        }
        if m == 0 {
            return Ok(true);
        }
        self.append_locked(p, &cur, &keep, m)
    }

    /// Applies a logged delete (also on replay). Returns how many were live.
    pub(super) fn apply_delete(&self, ext: &[u64]) -> usize {
        let mut ids = lock(&self.ids);
        let versions = read(&self.versions);
        let mut n = 0;
        for e in ext {
            if let Some(i) = ids.tracker.remove(*e) {
                versions[i as usize].fetch_or(DELETED, Ordering::AcqRel);
                ids.retired.push(i);
                n += 1;
            }
        }
        self.counters.deleted.fetch_add(n as u64, Ordering::Relaxed);
        n
    }
}
