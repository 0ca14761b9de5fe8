//! Out-of-place updates of a graph index (FreshDiskANN).
//!
//! The disk graph is never written in place. An insert goes to an
//! in-memory **delta** graph ([`DynamicGraph`], Vamana insertion); a delete
//! of a vector on disk sets its bit in a **delete set**, a delete of a
//! delta vector tombstones it there. A search runs on the disk graph with
//! its list widened by the deleted share, drops deleted ids, searches the
//! delta and merges both by distance. Every update is logged durably in
//! the index's write-ahead log ([`crate::update::wal`]) before it is
//! applied, and opening the index replays the log after the manifest's
//! `wal_sequence`.
//!
//! A **merge** (`merge.rs`, FreshDiskANN's StreamingMerge) writes a new
//! index: the disk graph with the deletes consolidated and the delta's
//! vectors inserted, re-laid as a build lays it. It runs when the delta
//! reaches its share of the memory budget, on `checkpoint()` and on
//! `maintain()`; the new index takes the old one's place atomically, with
//! a fresh log that starts after the merged sequence.
//!
//! What the delta, the delete set and the id index hold is counted in the
//! open index's memory ledger: the cache yields what they take.

use super::graph::GraphIndex;
use crate::distance::{normalize, Metric};
use crate::elem::DType;
use crate::graph::dynamic::DynamicGraph;
use crate::graph::vamana::SearchScratch;
use crate::update::ids::{check_insert_rows, IdTracker};
use crate::update::recovery::{self, Recover};
use crate::update::wal::Record;
use crate::{with_dtype, Error, Result};
use std::path::Path;

/// Name of the write-ahead log inside a graph index directory.
pub const WAL_FILE: &str = "wal.log";
/// Candidate list of a delta search (at least k).
const DELTA_L: usize = 64;

/// The updates applied since the index's last merge.
pub struct Delta {
    dim: usize,
    metric: Metric,
    dtype: DType,
    /// The inserted vectors (as the index stores them, widened to f32;
    /// normalised for cosine) and their graph.
    graph: DynamicGraph,
    /// Slot → external id (`u64::MAX`: deleted).
    slot_ext: Vec<u64>,
    /// Live delta vectors: external id → slot, and the next automatic id.
    ids: IdTracker,
    /// One bit per disk node: deleted.
    disk_deleted: Vec<u64>,
    disk_deleted_count: usize,
    n_disk: usize,
    /// Disk nodes sorted by external id (built on the first update of an
    /// index with an id section; `None` otherwise).
    perm: Option<Vec<u32>>,
    /// The last log sequence applied.
    pub applied: u64,
    /// Bytes the ledger counts for this delta now.
    pub counted: u64,
}

/// A delta search's results for one query: `(internal distance, external id)`.
pub type Found = Vec<(f32, u64)>;

impl Delta {
    /// An empty delta over the disk graph `g` whose log is applied up to
    /// `applied`.
    pub fn new(g: &GraphIndex, dim: usize, metric: Metric, dtype: DType, applied: u64) -> Delta {
        let n = g.manifest_n();
        let largest = match g.ids() {
            Some(ids) => ids.iter().copied().max().map_or(0, |m| m.saturating_add(1)),
            None => n as u64,
        };
        let next_auto = largest.max(g.next_auto_id());
        Delta {
            dim,
            metric,
            dtype,
            graph: DynamicGraph::new(dim, metric, 16),
            slot_ext: Vec::new(),
            ids: IdTracker::empty(next_auto),
            disk_deleted: Vec::new(),
            disk_deleted_count: 0,
            n_disk: n,
            perm: None,
            applied,
            counted: 0,
        }
    }

    /// Whether nothing was inserted or deleted since the last merge.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty() && self.disk_deleted_count == 0 && self.slot_ext.is_empty()
    }

    /// The next automatic id.
    pub fn next_auto(&self) -> u64 {
        self.ids.next_auto()
    }

    /// Live vectors in the delta.
    pub fn inserted(&self) -> usize {
        self.ids.len()
    }

    /// Disk nodes deleted.
    pub fn deleted_on_disk(&self) -> usize {
        self.disk_deleted_count
    }

    /// Whether disk node `i` is deleted.
    #[inline]
    pub fn is_deleted(&self, i: u32) -> bool {
        let i = i as usize;
        self.disk_deleted
            .get(i / 64)
            .is_some_and(|w| w >> (i % 64) & 1 == 1)
    }

    /// The delete flags of the disk nodes.
    pub fn deleted_flags(&self) -> Vec<bool> {
        (0..self.n_disk as u32)
            .map(|i| self.is_deleted(i))
            .collect()
    }

    /// The live delta vectors and their external ids, in slot order.
    pub fn live_rows(&self) -> (Vec<f32>, Vec<u64>) {
        let mut rows = Vec::with_capacity(self.ids.len() * self.dim);
        let mut ids = Vec::with_capacity(self.ids.len());
        for (s, &e) in self.slot_ext.iter().enumerate() {
            if e != u64::MAX {
                rows.extend_from_slice(self.graph.vector(s as u32));
                ids.push(e);
            }
        }
        (rows, ids)
    }

    /// Bytes held: the delta graph and its maps, the delete set, the id
    /// index.
    pub fn memory_bytes(&self) -> u64 {
        (self.graph.memory_bytes()
            + self.slot_ext.capacity() * 8
            + self.disk_deleted.capacity() * 8
            + self.perm.as_ref().map_or(0, |p| p.capacity() * 4)) as u64
            + self.ids.memory_bytes()
    }

    /// The bytes [`Delta::memory_bytes`] would hold with `more` vectors
    /// inserted (the graph grows by an eighth at a time).
    pub fn bytes_after(&self, more: usize) -> u64 {
        // A vector, its list and flag, its slot's id, its place in the map.
        let per = (self.dim * 4 + (crate::graph::dynamic::HEAD_R + 1) * 4 + 1 + 8) as u64
            + IdTracker::bytes_for(1).max(1);
        let bits = if self.disk_deleted.is_empty() {
            self.n_disk.div_ceil(64) as u64 * 8
        } else {
            0
        };
        self.memory_bytes() + bits + (more + more / 8 + 64) as u64 * per
    }

    fn ensure_perm(&mut self, g: &GraphIndex) {
        if self.perm.is_none() {
            if let Some(ids) = g.ids() {
                let mut p: Vec<u32> = (0..ids.len() as u32).collect();
                p.sort_unstable_by_key(|&i| ids[i as usize]);
                self.perm = Some(p);
            }
        }
    }

    /// The disk nodes whose external id is `ext` (deleted or not).
    fn disk_nodes(&self, g: &GraphIndex, ext: u64) -> Vec<u32> {
        match (g.ids(), &self.perm) {
            (Some(ids), Some(p)) => {
                let lo = p.partition_point(|&i| ids[i as usize] < ext);
                let hi = p.partition_point(|&i| ids[i as usize] <= ext);
                p[lo..hi].to_vec()
            }
            (Some(ids), None) => (0..ids.len() as u32)
                .filter(|&i| ids[i as usize] == ext)
                .collect(),
            (None, _) => {
                if ext < self.n_disk as u64 {
                    vec![ext as u32]
                } else {
                    Vec::new()
                }
            }
        }
    }

    /// Whether `ext` names a live vector.
    pub fn is_live(&self, g: &GraphIndex, ext: u64) -> bool {
        self.ids.contains(ext) || self.disk_live(g, ext)
    }

    /// Whether `ext` names a live disk node.
    fn disk_live(&self, g: &GraphIndex, ext: u64) -> bool {
        self.disk_nodes(g, ext)
            .into_iter()
            .any(|i| !self.is_deleted(i))
    }

    /// Every live external id (disk ones first, in internal order).
    pub fn live_ids(&self, g: &GraphIndex) -> Vec<u64> {
        let mut out: Vec<u64> = (0..self.n_disk as u32)
            .filter(|&i| !self.is_deleted(i))
            .map(|i| g.external(i) as u64)
            .collect();
        out.extend(self.slot_ext.iter().copied().filter(|&e| e != u64::MAX));
        out
    }

    /// Checks an insert of `vectors` (row-major) with `ids` (or automatic
    /// ones) and returns the rows as the index will store them (converted
    /// to its element type, normalised for cosine) and the ids.
    pub fn prepare_insert(
        &mut self,
        g: &GraphIndex,
        vectors: &[f32],
        ids: Option<&[u64]>,
    ) -> Result<(Vec<f32>, Vec<u64>)> {
        let dim = self.dim;
        let n = check_insert_rows(vectors, dim)?;
        let mut rows = vectors.to_vec();
        with_dtype!(self.dtype, T, {
            for (i, x) in rows.iter_mut().enumerate() {
                match <T as crate::elem::Element>::from_f32(*x) {
                    Some(t) => *x = crate::elem::Element::to_f32(t),
                    None => {
                        return Err(Error::arg(format!(
                            "row {} holds {} , which a {} index cannot store",
                            i / dim,
                            x,
                            self.dtype
                        )))
                    }
                }
            }
        });
        if self.metric == Metric::Cosine {
            for (i, r) in rows.chunks_mut(dim).enumerate() {
                if r.iter().all(|&x| x == 0.0) {
                    return Err(Error::arg(format!(
                        "row {i} is all zeros: it has no direction for the cosine metric"
                    )));
                }
                normalize(r);
            }
        }
        self.ensure_perm(g);
        let ids = self.ids.resolve_insert(ids, n, |e| self.disk_live(g, e))?;
        Ok((rows, ids))
    }

    /// Applies an insert of prepared `rows` with `ids`.
    pub fn apply_insert(&mut self, g: &GraphIndex, rows: &[f32], ids: &[u64]) {
        let mut scratch = SearchScratch::new();
        for (r, &e) in rows.chunks(self.dim).zip(ids) {
            // A replayed insert of an id that is live (never logged by a
            // writer that validated it) replaces the old vector.
            if self.is_live(g, e) {
                self.apply_delete(g, &[e]);
            }
            let slot = self.graph.insert(r, &mut scratch);
            let s = slot as usize;
            if s >= self.slot_ext.len() {
                self.slot_ext.resize(s + 1, u64::MAX);
            }
            self.slot_ext[s] = e;
            self.ids.insert(e, slot);
        }
        self.ids.shrink_if_sparse();
    }

    /// Applies a delete; returns how many of `ids` were live.
    pub fn apply_delete(&mut self, g: &GraphIndex, ids: &[u64]) -> usize {
        self.ensure_perm(g);
        let mut live = 0;
        for &e in ids {
            if let Some(slot) = self.ids.remove(e) {
                self.slot_ext[slot as usize] = u64::MAX;
                self.graph.remove(slot);
                live += 1;
                continue;
            }
            let mut hit = false;
            if self.disk_deleted.is_empty() {
                self.disk_deleted = vec![0; self.n_disk.div_ceil(64)];
            }
            for i in self.disk_nodes(g, e) {
                if !self.is_deleted(i) {
                    self.disk_deleted[i as usize / 64] |= 1 << (i % 64);
                    self.disk_deleted_count += 1;
                    hit = true;
                }
            }
            live += hit as usize;
        }
        live
    }

    /// Applies one logged record (replay; see [`crate::update::recovery`]).
    pub fn apply_record(&mut self, g: &GraphIndex, rec: &Record, path: &Path) -> Result<()> {
        recovery::replay(&mut Replaying { delta: self, g }, rec, path)
    }

    /// A query as the delta's vectors are stored: normalised for cosine.
    fn as_stored<'a>(&self, q: &'a [f32]) -> std::borrow::Cow<'a, [f32]> {
        if self.metric == Metric::Cosine {
            let mut qn = q.to_vec();
            normalize(&mut qn);
            std::borrow::Cow::Owned(qn)
        } else {
            std::borrow::Cow::Borrowed(q)
        }
    }

    /// The delta's `k` nearest live vectors to `q` (metric distance).
    pub fn search(&self, q: &[f32], k: usize, l: usize) -> Found {
        if self.ids.is_empty() {
            return Vec::new();
        }
        let mut scratch = SearchScratch::new();
        let q = self.as_stored(q);
        let q = &q[..];
        self.graph
            .search(&mut scratch, q, k, l.max(k).max(DELTA_L))
            .into_iter()
            .filter_map(|(d, s)| {
                let e = *self.slot_ext.get(s as usize)?;
                (e != u64::MAX).then_some((d, e))
            })
            .collect()
    }

    /// Every live delta vector within `radius` (internal distance) of `q`,
    /// by an exact scan (the delta is small).
    pub fn range(&self, q: &[f32], radius: f32) -> Found {
        let q = self.as_stored(q);
        let q = &q[..];
        self.slot_ext
            .iter()
            .enumerate()
            .filter(|(_, &e)| e != u64::MAX)
            .map(|(s, &e)| (self.graph.distance(q, s as u32), e))
            .filter(|&(d, _)| d <= radius)
            .collect()
    }

    /// Consistency problems between the delta's maps (empty: none).
    pub fn problems(&self, g: &GraphIndex) -> Vec<String> {
        let mut out = Vec::new();
        for (e, s) in self.ids.iter() {
            if self.slot_ext.get(s as usize) != Some(&e) {
                out.push(format!(
                    "delta id {e} maps to slot {s}, which holds another id"
                ));
            }
            if !self.graph.is_alive(s) && self.ids.len() > 1 {
                out.push(format!(
                    "delta id {e}'s slot {s} is a tombstone in the delta graph"
                ));
            }
            if self
                .disk_nodes(g, e)
                .into_iter()
                .any(|i| !self.is_deleted(i))
            {
                out.push(format!("id {e} is live both on disk and in the delta"));
            }
        }
        let live_slots = self.slot_ext.iter().filter(|&&e| e != u64::MAX).count();
        if live_slots != self.ids.len() {
            out.push(format!(
                "the delta holds {live_slots} live slots but maps {} ids",
                self.ids.len()
            ));
        }
        let bits: usize = self
            .disk_deleted
            .iter()
            .map(|w| w.count_ones() as usize)
            .sum();
        if bits != self.disk_deleted_count {
            out.push(format!(
                "the delete set holds {bits} disk nodes but counts {}",
                self.disk_deleted_count
            ));
        }
        out
    }
}

/// Merges a disk search's results for one query (`(distance, external
/// id)`, deleted ones already dropped) with the delta's, nearest first,
/// `k` at most.
pub fn merge_found(mut disk: Found, delta: Found, k: usize) -> Found {
    disk.extend(delta);
    disk.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    disk.dedup_by_key(|x| x.1);
    disk.truncate(k);
    disk
}

/// A delta rebuilt from the log over its disk graph.
struct Replaying<'a> {
    delta: &'a mut Delta,
    g: &'a GraphIndex,
}

impl Recover for Replaying<'_> {
    fn dim(&self) -> usize {
        self.delta.dim
    }

    fn applied(&self) -> u64 {
        self.delta.applied
    }

    fn set_applied(&mut self, seq: u64) {
        self.delta.applied = seq;
    }

    fn replay_insert(&mut self, ids: &[u64], rows: &[f32]) -> Result<()> {
        // What `prepare_insert` did before logging: conversion to the
        // element type was logged; normalisation is idempotent.
        let mut rows = rows.to_vec();
        if self.delta.metric == Metric::Cosine {
            rows.chunks_mut(self.delta.dim).for_each(normalize);
        }
        self.delta.apply_insert(self.g, &rows, ids);
        Ok(())
    }

    fn replay_delete(&mut self, ids: &[u64]) -> Result<()> {
        self.delta.apply_delete(self.g, ids);
        Ok(())
    }
}
