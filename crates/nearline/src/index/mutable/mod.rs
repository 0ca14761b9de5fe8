//! An open graph index with its updates: the disk graph that serves, the
//! delta of the updates since its last merge ([`super::fresh`]), the
//! writer's log, and the merge that swaps a new disk graph in.
//!
//! Locks: `writer` serialises updates and merges (and holds the writer's
//! log, opened at the first update: a process that only searches never
//! takes the log's lock); `state` holds the disk graph and the delta
//! together, so a search sees one consistent pair: it reads both under one
//! read hold, an update applies under a write hold after its log record is
//! durable, and a merge swaps both at once.
//!
//! A merge runs in the background (with `background_updates`, the
//! default): once the delta fills its share of the budget, a thread merges
//! a snapshot of it (the log up to sequence `s`) while updates go on into
//! the same delta, up to half a share more; searches see the old disk graph
//! and the whole delta. The staged result is put in place under `writer`:
//! the records after `s` are copied into the new index's log, the directory
//! swapped, and the new delta rebuilt by replaying them. A writer that runs
//! out of room waits for the merge; `checkpoint()` waits for it and merges
//! the rest.
//!
//! An index updated in place (`update="in_place"`) has no delta: its
//! updates patch the page file ([`super::inplace`]).
//!
//! Here: the slot, its locks and the update entry points. `opening`: the
//! open and its log replay, and a read-only open following a writer.
//! `merging`: the out-of-place merge. `patching`: the in-place path.

mod merging;
mod opening;
mod patching;

use merging::Background;
use opening::open_state;

use super::fresh::{merge_found, Delta, Found, WAL_FILE};
use super::inplace::InPlace;
use super::merge::MergeReport;
use crate::elem::DType;
use crate::format::Manifest;
use crate::planner::{self, OpenOptions};
use crate::update::tail::WalTail;
use crate::update::wal::{Op, Wal};
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

pub use super::graph::GraphOpen;

/// The disk graph and the delta a search sees together.
pub struct GraphState {
    pub open: Arc<GraphOpen>,
    pub delta: Delta,
    /// The id bookkeeping of an index updated in place (`None`: out of
    /// place, through `delta`).
    pub inplace: Option<InPlace>,
    /// An index updated in place: the lock on its directory this open holds
    /// (see `opening::in_place_lock`); held, never read, until the state
    /// is dropped.
    _lock: Option<std::fs::File>,
}

impl GraphState {
    /// Disk nodes a search must skip: deleted out of place or tombstones.
    pub fn deleted_on_disk(&self) -> usize {
        self.delta.deleted_on_disk() + self.inplace.as_ref().map_or(0, |p| p.deleted())
    }

    /// Whether disk node `i` is deleted (either way).
    pub fn is_deleted(&self, i: u32) -> bool {
        self.delta.is_deleted(i) || (self.inplace.is_some() && self.open.g.external(i) < 0)
    }
}

/// How long an in-place update waits for other holders of the open index
/// What the index's updates did since it was opened.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct UpdateCounters {
    pub inserted: u64,
    pub deleted: u64,
    pub merges: u64,
    pub last_merge: Option<MergeReport>,
    /// Why the last background merge failed (the delta and the log keep
    /// every update; the next one that needs room tries again).
    pub last_merge_error: Option<String>,
}

/// While the delta is being merged, updates go on into it up to this many
/// shares (the budget leaves two: see `planner::update_share`).
const SHARES_WHILE_MERGING: f64 = 1.5;

/// A graph index open for search and updates.
pub struct GraphSlot {
    dir: PathBuf,
    opts: OpenOptions,
    state: RwLock<GraphState>,
    /// The writer's log (opened at the first update).
    writer: Mutex<Option<Wal>>,
    /// A read-only open follows the writer's log.
    tail: Mutex<Option<WalTail>>,
    counters: Mutex<UpdateCounters>,
    /// An in-place update was logged but not applied: the log and memory
    /// disagree until a reopen replays it, so updates are refused.
    broken: Mutex<Option<String>>,
    bg: Mutex<Background>,
    /// Signalled when a background merge's result is ready.
    bg_ready: Condvar,
    /// This slot, for the merge thread (which must not keep it alive).
    pub(super) me: Weak<GraphSlot>,
    /// Tests hold this to keep a background merge from staging.
    #[cfg(test)]
    pub(super) merge_gate: Arc<Mutex<()>>,
}

impl Drop for GraphSlot {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn poisoned() -> Error {
    Error::Engine("a graph index lock was poisoned by a panic".into())
}

/// The log's path in `dir`.
pub fn wal_path(dir: &Path) -> PathBuf {
    dir.join(WAL_FILE)
}

impl GraphSlot {
    /// Opens the graph index in `dir` (manifest `m`).
    pub fn open(dir: &Path, m: Manifest, opts: &OpenOptions) -> Result<Arc<GraphSlot>> {
        let (state, tail) = open_state(dir, m, opts, None)?;
        Ok(Arc::new_cyclic(|me| GraphSlot {
            dir: dir.to_path_buf(),
            opts: opts.clone(),
            state: RwLock::new(state),
            writer: Mutex::new(None),
            tail: Mutex::new(if opts.read_only { tail } else { None }),
            counters: Mutex::new(UpdateCounters::default()),
            broken: Mutex::new(None),
            bg: Mutex::new(Background::default()),
            bg_ready: Condvar::new(),
            me: me.clone(),
            #[cfg(test)]
            merge_gate: Arc::new(Mutex::new(())),
        }))
    }

    /// The disk graph and the delta, for reading (a read-only open first
    /// applies what the writer logged since).
    pub fn read(&self) -> Result<RwLockReadGuard<'_, GraphState>> {
        if self.opts.read_only {
            self.follow()?;
        }
        self.state.read().map_err(|_| poisoned())
    }

    fn write(&self) -> Result<RwLockWriteGuard<'_, GraphState>> {
        self.state.write().map_err(|_| poisoned())
    }

    /// The disk graph now.
    pub fn current(&self) -> Result<Arc<GraphOpen>> {
        Ok(Arc::clone(&self.state.read().map_err(|_| poisoned())?.open))
    }

    /// What the updates did since the open.
    pub fn counters(&self) -> UpdateCounters {
        self.counters.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// The writer's log, opened (and any record another writer left after
    /// what this open applied replayed) at the first update.
    fn writer(&self) -> Result<MutexGuard<'_, Option<Wal>>> {
        if self.opts.read_only {
            return Err(Error::arg(
                "this index is open read-only (read_only=True): open it without read_only to \
                 insert, delete or checkpoint",
            ));
        }
        let kind = self.current()?.manifest.layout.kind;
        if let Some(why) = crate::planner::rules::update_refusal(kind) {
            return Err(Error::arg(format!("this index takes no updates: {why}")));
        }
        if let Some(why) = self.broken.lock().map_err(|_| poisoned())?.as_ref() {
            return Err(Error::Engine(format!(
                "an in-place write failed after its update was logged ({why}); close and reopen \
                 the index, which writes the logged updates again"
            )));
        }
        let mut w = self.writer.lock().map_err(|_| poisoned())?;
        if w.is_none() {
            let path = wal_path(&self.dir);
            let mut st = self.write()?;
            let wal = if path.exists() {
                let open = Arc::clone(&st.open);
                let after = st.delta.applied;
                let delta = &mut st.delta;
                Wal::open_after(&path, self.opts.durability, after, &mut |r| {
                    delta.apply_record(&open.g, &r, &path)
                })?
                .0
            } else {
                Wal::create(
                    &path,
                    st.open.manifest.wal_sequence + 1,
                    self.opts.durability,
                )?
            };
            *w = Some(wal);
        }
        Ok(w)
    }

    /// Tests: the writer's log writes through `wrap` from now on.
    #[cfg(test)]
    pub(super) fn inject_log_faults(
        &self,
        wrap: impl FnOnce(Arc<std::fs::File>, u64) -> Arc<dyn crate::io::DurableFile>,
    ) -> Result<()> {
        let w = self.writer()?;
        w.as_ref().ok_or_else(poisoned)?.inject(wrap)
    }

    /// The most bytes the delta may hold before a merge: the planner's
    /// rule on the open plan.
    fn share(open: &GraphOpen) -> u64 {
        planner::update_share(&open.plan)
    }

    /// Checks an insert without doing it.
    pub fn validate_insert(&self, vectors: &[f32], ids: Option<&[u64]>) -> Result<()> {
        {
            let st = self.state.read().map_err(|_| poisoned())?;
            if let Some(ip) = &st.inplace {
                return ip.prepare_insert(&st.open.g, vectors, ids).map(drop);
            }
        }
        let mut st = self.write()?;
        let open = Arc::clone(&st.open);
        st.delta.prepare_insert(&open.g, vectors, ids).map(drop)
    }

    /// Inserts `vectors` with `ids` (or automatic ones); durable and
    /// searchable on return. Returns the ids.
    pub fn insert(&self, vectors: &[f32], ids: Option<&[u64]>) -> Result<Vec<u64>> {
        let mut w = self.writer()?;
        if self.in_place()? {
            return self.insert_in_place(&w, vectors, ids);
        }
        let (rows, ids, dim) = {
            let mut st = self.write()?;
            let open = Arc::clone(&st.open);
            let (rows, ids) = st.delta.prepare_insert(&open.g, vectors, ids)?;
            (rows, ids, open.manifest.dim)
        };
        // Batches that fit the delta's share, with a merge whenever the
        // next one would pass it: in the background (updates go on, up to
        // half a share more) or here.
        let mut at = 0;
        while at < ids.len() {
            self.finish(&mut w)?;
            let open = self.current()?;
            let share = Self::share(&open);
            let merging = self.merging();
            let limit = if merging {
                (share as f64 * SHARES_WHILE_MERGING) as u64
            } else {
                share
            };
            let (take, fits) = {
                let st = self.state.read().map_err(|_| poisoned())?;
                let mut take = ids.len() - at;
                while take > 1 && st.delta.bytes_after(take) > limit {
                    take = take.div_ceil(2);
                }
                (take, st.delta.bytes_after(take) <= limit)
            };
            if !fits {
                if merging {
                    self.wait_ready()?;
                    continue;
                }
                let empty = self.state.read().map_err(|_| poisoned())?.delta.is_empty();
                let started = !empty && self.opts.background_updates && self.start(&mut w)?;
                if started {
                    continue;
                }
                let merged = !empty && self.merge_locked(&mut w, &AtomicBool::new(false))?.1;
                if !merged {
                    return Err(Error::arg(format!(
                        "the memory budget leaves the update layer {share} bytes, too little \
                         for one vector's insert; open with a larger memory_budget"
                    )));
                }
                continue;
            }
            let (r, i) = (&rows[at * dim..(at + take) * dim], &ids[at..at + take]);
            self.insert_batch(&mut w, r, i)?;
            at += take;
        }
        if let Ok(mut c) = self.counters.lock() {
            c.inserted += ids.len() as u64;
        }
        Ok(ids)
    }

    fn insert_batch(
        &self,
        w: &mut MutexGuard<'_, Option<Wal>>,
        rows: &[f32],
        ids: &[u64],
    ) -> Result<()> {
        let wal = w.as_ref().ok_or_else(poisoned)?;
        let mut st = self.write()?;
        let open = Arc::clone(&st.open);
        // The room first: the cache yields what the budget is short.
        let need = st
            .delta
            .bytes_after(ids.len())
            .saturating_sub(st.delta.counted);
        open.g.hold_updates(need)?;
        st.delta.counted += need;
        let vectors: Vec<u8> = rows.iter().flat_map(|x| x.to_le_bytes()).collect();
        let seq = wal.append_op_durable(&Op::Insert {
            ids: ids.to_vec(),
            dim: open.manifest.dim as u32,
            dtype: DType::F32,
            vectors,
        })?;
        st.delta.apply_insert(&open.g, rows, ids);
        st.delta.applied = seq;
        let held = st.delta.memory_bytes();
        if held < st.delta.counted {
            open.g.release_updates(st.delta.counted - held);
            st.delta.counted = held;
        }
        Ok(())
    }

    /// Deletes `ids` (unknown ones are ignored); returns how many were live.
    pub fn delete(&self, ids: &[u64]) -> Result<usize> {
        let w = self.writer()?;
        if ids.is_empty() {
            return Ok(0);
        }
        if self.in_place()? {
            return self.delete_in_place(&w, ids);
        }
        let wal = w.as_ref().ok_or_else(poisoned)?;
        let mut st = self.write()?;
        let open = Arc::clone(&st.open);
        // The delete set's bits are held from the first delete on.
        let need = st.delta.bytes_after(0).saturating_sub(st.delta.counted);
        open.g.hold_updates(need)?;
        st.delta.counted += need;
        let seq = wal.append_op_durable(&Op::Delete { ids: ids.to_vec() })?;
        let live = st.delta.apply_delete(&open.g, ids);
        st.delta.applied = seq;
        if let Ok(mut c) = self.counters.lock() {
            c.deleted += live as u64;
        }
        Ok(live)
    }

    /// Merges the delta into a new disk graph (when it holds anything),
    /// after the background merge if one runs; returns the log sequence
    /// the index holds.
    pub fn checkpoint(&self) -> Result<u64> {
        let mut w = self.writer()?;
        if self.in_place()? {
            return self.checkpoint_in_place(&w);
        }
        if self.merging() {
            self.wait_ready()?;
            self.finish(&mut w)?;
        }
        Ok(self.merge_locked(&mut w, &AtomicBool::new(false))?.0)
    }

    /// Runs the merge now if the delta holds anything; an index updated
    /// in place checkpoints and compacts its tombstones away by a merge.
    pub fn maintain(&self) -> Result<()> {
        if self.in_place()? {
            return self.compact_in_place();
        }
        self.checkpoint().map(drop)
    }

    /// Whether this index is updated in place.
    pub fn in_place(&self) -> Result<bool> {
        Ok(self.state.read().map_err(|_| poisoned())?.inplace.is_some())
    }

    /// The live external ids.
    pub fn live_ids(&self) -> Result<Vec<u64>> {
        let st = self.read()?;
        if let Some(ip) = &st.inplace {
            return ip.live_ids(&st.open.g);
        }
        let mut ids = st.delta.live_ids(&st.open.g);
        ids.sort_unstable();
        Ok(ids)
    }

    /// Searches the delta for each of `nq` queries: its `k` nearest.
    pub fn delta_search(
        st: &GraphState,
        queries: &[f32],
        nq: usize,
        k: usize,
        l: usize,
    ) -> Vec<Found> {
        let dim = st.open.manifest.dim;
        (0..nq)
            .map(|i| st.delta.search(&queries[i * dim..(i + 1) * dim], k, l))
            .collect()
    }

    /// Merges a disk batch's results (`ids` internal, `k_disk` a query) with
    /// the delta's, dropping deleted disk nodes: `k` external ids and
    /// internal distances a query, padded with −1 and infinity.
    pub fn merge_batch(
        st: &GraphState,
        ids: &[u32],
        dists: &[f32],
        k_disk: usize,
        delta: Vec<Found>,
        k: usize,
    ) -> (Vec<i64>, Vec<f32>) {
        let mut out_ids = Vec::with_capacity(delta.len() * k);
        let mut out_d = Vec::with_capacity(delta.len() * k);
        for (q, dq) in delta.into_iter().enumerate() {
            let disk: Found = (q * k_disk..(q + 1) * k_disk)
                .filter(|&j| ids[j] != u32::MAX && !st.is_deleted(ids[j]))
                .map(|j| (dists[j], st.open.g.external(ids[j]) as u64))
                .collect();
            let merged = merge_found(disk, dq, k);
            for &(d, e) in &merged {
                out_ids.push(e as i64);
                out_d.push(d);
            }
            for _ in merged.len()..k {
                out_ids.push(-1);
                out_d.push(f32::INFINITY);
            }
        }
        (out_ids, out_d)
    }

    /// Consistency problems of the delta (empty: none).
    pub fn problems(&self) -> Result<Vec<String>> {
        let st = self.read()?;
        Ok(st.delta.problems(&st.open.g))
    }
}
