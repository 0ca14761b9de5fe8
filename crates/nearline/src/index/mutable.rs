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

use super::fresh::{merge_found, Delta, Found, WAL_FILE};
use super::graph::GraphIndex;
use super::inplace::InPlace;
use super::merge::{merge_index, MergeJob, MergeReport, StagedMerge};
use crate::elem::DType;
use crate::format::{Manifest, UpdateMode};
use crate::planner::{self, OpenOptions};
use crate::update::recovery::check_continues;
use crate::update::recovery::Recover;
use crate::update::tail::{TailStatus, WalTail};
use crate::update::wal::{Op, Wal};
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};
use std::thread::JoinHandle;

pub use super::graph::GraphOpen;

/// The disk graph and the delta a search sees together.
pub struct GraphState {
    pub open: Arc<GraphOpen>,
    pub delta: Delta,
    /// The id bookkeeping of an index updated in place (`None`: out of
    /// place, through `delta`).
    pub inplace: Option<InPlace>,
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
/// (an `info()` or a plan that took it for a moment) to let go.
const EXCLUSIVE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

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

/// What a merge took: the log up to `seq` and the delta as it stood.
struct Snapshot {
    open: Arc<GraphOpen>,
    seq: u64,
    deleted: Vec<bool>,
    rows: Vec<f32>,
    ids: Vec<u64>,
    next_auto: u64,
}

/// A merged index staged, with what it was merged from.
struct Staged {
    merge: StagedMerge,
    open: Arc<GraphOpen>,
    seq: u64,
}

/// The background merge.
#[derive(Default)]
struct Background {
    /// A merge of the log up to this sequence runs or waits to be put in
    /// place.
    running: Option<u64>,
    /// Its result.
    ready: Option<Result<Staged>>,
    handle: Option<JoinHandle<()>>,
    cancel: Arc<AtomicBool>,
}

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

impl GraphSlot {
    /// Cancels a running merge and waits for its thread, so that the log's
    /// lock is free once the index is closed: a merge not yet in place is
    /// dropped (its staging directory removed; the log keeps every update).
    pub fn shutdown(&self) {
        let handle = match self.bg.lock() {
            Ok(mut bg) => {
                bg.cancel.store(true, Ordering::Relaxed);
                bg.handle.take()
            }
            Err(_) => None,
        };
        if let Some(h) = handle {
            // The merge thread may itself drop the last reference.
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

#[cfg(test)]
impl GraphSlot {
    /// Tests: an index updated in place checkpoints after this many bytes
    /// of page images.
    pub(super) fn set_in_place_log_limit(&self, bytes: u64) {
        if let Ok(mut st) = self.state.write() {
            if let Some(ip) = st.inplace.as_mut() {
                ip.log_limit = bytes;
            }
        }
    }

    /// Whether `shutdown` has asked the running merge to stop.
    pub(super) fn cancel_requested(&self) -> bool {
        self.bg
            .lock()
            .is_ok_and(|b| b.cancel.load(Ordering::Relaxed))
    }
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

/// Opens the graph index in `dir` (manifest `m`) and its delta: the log
/// after the manifest's sequence is replayed into it.
fn open_state(
    dir: &Path,
    m: Manifest,
    opts: &OpenOptions,
) -> Result<(GraphState, Option<WalTail>)> {
    let plan = planner::plan_open(opts, &m)?;
    let mode = opts.update.unwrap_or(m.spec.update);
    if mode == UpdateMode::InPlace {
        if let Some(why) = super::inplace::refusal(&m, plan.cache) {
            return Err(Error::arg(format!(
                "this index cannot be updated in place: {why}; open it with \
                 update=\"out_of_place\""
            )));
        }
    }
    if mode == UpdateMode::InPlace && !opts.read_only {
        // Blocks past the checkpoint come back from the log.
        let geo = planner::geometry(&m)?;
        if let Some(p) = m.sections.get(&crate::format::Section::Pages) {
            let path = dir.join(&p.file);
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|e| Error::io(&path, e))?;
            let len = f.metadata().map_err(|e| Error::io(&path, e))?.len();
            if len > geo.file_bytes() {
                f.set_len(geo.file_bytes())
                    .map_err(|e| Error::io(&path, e))?;
            }
        }
    }
    let g = GraphIndex::open(dir, &m, &plan, opts.io, wal_path(dir).exists())?;
    let mut open = GraphOpen {
        manifest: m,
        plan,
        g,
    };
    if mode == UpdateMode::InPlace {
        let mut ip = InPlace::new(&open.g, open.manifest.wal_sequence);
        let path = wal_path(dir);
        if path.exists() {
            let mut t = WalTail::open(&path)?;
            check_continues(&path, t.first_seq(), open.manifest.wal_sequence)?;
            let after = ip.applied;
            let mut r = Replaying {
                ip: &mut ip,
                open: &mut open,
                write: !opts.read_only,
            };
            t.read_new(after, &mut |rec| {
                crate::update::recovery::replay(&mut r, &rec, &path)
            })?;
        }
        ip.recount(&open.g).map_err(|e| {
            Error::arg(format!(
                "the updates logged since the last checkpoint need more memory than the budget \
                 leaves them ({e}); open with a larger memory_budget"
            ))
        })?;
        let delta = Delta::new(
            &open.g,
            open.manifest.dim,
            open.manifest.metric,
            open.manifest.dtype,
            ip.applied,
        );
        return Ok((
            GraphState {
                open: Arc::new(open),
                delta,
                inplace: Some(ip),
            },
            None,
        ));
    }
    let open = Arc::new(open);
    let m = &open.manifest;
    let mut delta = Delta::new(&open.g, m.dim, m.metric, m.dtype, m.wal_sequence);
    let path = wal_path(dir);
    let tail = if path.exists() {
        let mut t = WalTail::open(&path)?;
        check_continues(&path, t.first_seq(), m.wal_sequence)?;
        let after = delta.applied;
        t.read_new(after, &mut |r| delta.apply_record(&open.g, &r, &path))?;
        Some(t)
    } else {
        None
    };
    let bytes = delta.memory_bytes();
    if !delta.is_empty() {
        open.g.hold_updates(bytes).map_err(|e| {
            Error::arg(format!(
                "the updates logged since the last merge hold {bytes} bytes, more than the \
                 memory budget leaves them ({e}); open with a larger memory_budget and run \
                 checkpoint() to merge them"
            ))
        })?;
        delta.counted = bytes;
    }
    Ok((
        GraphState {
            open,
            delta,
            inplace: None,
        },
        tail,
    ))
}

/// Replays an in-place index's log: page-image records are applied (their
/// blocks written again unless read-only), logical ones (a log written
/// out of place before the index switched) run as in-place updates.
struct Replaying<'a> {
    ip: &'a mut InPlace,
    open: &'a mut GraphOpen,
    write: bool,
}

impl Recover for Replaying<'_> {
    fn dim(&self) -> usize {
        self.open.manifest.dim
    }
    fn applied(&self) -> u64 {
        self.ip.applied
    }
    fn set_applied(&mut self, seq: u64) {
        self.ip.applied = seq;
    }
    fn replay_insert(&mut self, ids: &[u64], rows: &[f32]) -> Result<()> {
        self.need_write()?;
        let dim = self.open.manifest.dim;
        let rows = super::inplace::stored_rows(
            rows,
            dim,
            self.open.manifest.dtype,
            self.open.manifest.metric,
        )?;
        for (r, &e) in rows.chunks(dim).zip(ids) {
            if let Some(p) = self.ip.plan_delete(self.open, e)? {
                self.ip.apply(self.open, &p, true)?;
            }
            let p = self.ip.plan_insert(self.open, r, e)?;
            self.ip.apply(self.open, &p, true)?;
        }
        Ok(())
    }
    fn replay_delete(&mut self, ids: &[u64]) -> Result<()> {
        self.need_write()?;
        for &e in ids {
            if let Some(p) = self.ip.plan_delete(self.open, e)? {
                self.ip.apply(self.open, &p, true)?;
            }
        }
        Ok(())
    }
    fn replay_patch(&mut self, patch: &crate::update::wal::Patch) -> Result<()> {
        if !self.write {
            // A read-only open writes nothing: the blocks must be on disk.
            let pages = self.open.g.pages_path();
            let geo = self.open.g.geometry();
            let mut r = crate::io::BlockReader::open(&pages, geo.block_size)?;
            for (b, img) in &patch.blocks {
                let on_disk = r
                    .read(geo.block_offset(*b))
                    .ok()
                    .map(|x| x[..geo.block_size].to_vec());
                if on_disk.as_deref() != Some(img.as_slice()) {
                    return Err(Error::arg(format!(
                        "block {b} of the page file does not hold what the log says (an update \
                         was cut short): open the index for writing once to recover it"
                    )));
                }
            }
        }
        self.ip.apply(self.open, patch, self.write)
    }
}

impl Replaying<'_> {
    fn need_write(&self) -> Result<()> {
        if self.write {
            Ok(())
        } else {
            Err(Error::arg(
                "the log holds updates this index has not run in place yet: open it for writing \
                 once to apply them",
            ))
        }
    }
}

impl GraphSlot {
    /// Opens the graph index in `dir` (manifest `m`).
    pub fn open(dir: &Path, m: Manifest, opts: &OpenOptions) -> Result<Arc<GraphSlot>> {
        let (state, tail) = open_state(dir, m, opts)?;
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

    /// A merge runs (or its result waits to be put in place).
    pub fn merging(&self) -> bool {
        self.bg.lock().is_ok_and(|b| b.running.is_some())
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

    /// A read-only open: applies the records the writer logged since the
    /// last look; reloads the index when a merge replaced it.
    fn follow(&self) -> Result<()> {
        let mut tail = self.tail.lock().map_err(|_| poisoned())?;
        let path = wal_path(&self.dir);
        if tail.is_none() {
            if !path.exists() {
                return Ok(());
            }
            let t = WalTail::open(&path)?;
            let applied = self.state.read().map_err(|_| poisoned())?.delta.applied;
            if t.first_seq() > applied + 1 {
                // The writer merged before this open saw its log: the
                // directory holds a newer index; load it.
                let m = crate::io::files::read_manifest(&self.dir)?;
                let (fresh, t2) = open_state(&self.dir, m, &self.opts)?;
                *self.write()? = fresh;
                *tail = t2;
                return Ok(());
            }
            *tail = Some(t);
        }
        let Some(t) = tail.as_mut() else {
            return Ok(());
        };
        let mut st = self.write()?;
        let after = st.delta.applied;
        let open = Arc::clone(&st.open);
        let status = t.read_new(after, &mut |r| st.delta.apply_record(&open.g, &r, &path))?;
        if status == TailStatus::Replaced {
            // A merge swapped a new index in: load it.
            let m = crate::io::files::read_manifest(&self.dir)?;
            if m.wal_sequence != open.manifest.wal_sequence || m.n != open.manifest.n {
                drop(st);
                let (fresh, t2) = open_state(&self.dir, m, &self.opts)?;
                *self.write()? = fresh;
                *tail = t2;
            } else {
                *t = WalTail::open(&path)?;
            }
        }
        Ok(())
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
        if let Some(why) = self.broken.lock().map_err(|_| poisoned())?.as_ref() {
            return Err(Error::Engine(format!(
                "an in-place update was logged but could not be applied ({why}); close and reopen \
                 the index, which replays it"
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
        wrap: impl FnOnce(Arc<std::fs::File>, u64) -> Arc<dyn crate::io::AppendFile>,
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
        if let Some(ip) = &self.state.read().map_err(|_| poisoned())?.inplace {
            return ip.prepare_insert(vectors, ids).map(drop);
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

    /// What a merge of the delta as it stands would take: `Err(seq)` when
    /// there is nothing to merge (the log sequence the index holds).
    fn snapshot(
        &self,
        w: &MutexGuard<'_, Option<Wal>>,
    ) -> Result<std::result::Result<Snapshot, u64>> {
        let wal = w.as_ref().ok_or_else(poisoned)?;
        let seq = wal.sync()?.saturating_sub(1);
        let st = self.state.read().map_err(|_| poisoned())?;
        let held = st.open.manifest.wal_sequence;
        if st.delta.is_empty() {
            return Ok(Err(held.max(seq)));
        }
        let (rows, ids) = st.delta.live_rows();
        let deleted = st.delta.deleted_flags();
        if ids.is_empty() && deleted.iter().all(|&d| d) {
            // Nothing would be left: a graph holds at least one vector, so
            // the log keeps the deletes until an insert comes.
            return Ok(Err(held));
        }
        Ok(Ok(Snapshot {
            open: Arc::clone(&st.open),
            seq,
            deleted,
            rows,
            ids,
            next_auto: st.delta.next_auto(),
        }))
    }

    /// Writes the merge of `snap` into a staging directory.
    fn stage(snap: Snapshot, cancel: &AtomicBool) -> Result<Staged> {
        let quiet = |_: &str, _: u64, _: u64| {};
        let dir = snap.open.g.dir().to_path_buf();
        let merge = merge_index(
            &dir,
            &snap.open.manifest,
            &snap.open.g,
            &MergeJob {
                deleted: &snap.deleted,
                inserts: &snap.rows,
                insert_ids: &snap.ids,
                wal_sequence: snap.seq,
                next_auto_id: snap.next_auto,
                progress: &quiet,
                cancel,
            },
        )?;
        Ok(Staged {
            merge,
            open: snap.open,
            seq: snap.seq,
        })
    }

    /// Merges here, holding the writer: `(sequence held, merged)`.
    fn merge_locked(
        &self,
        w: &mut MutexGuard<'_, Option<Wal>>,
        cancel: &AtomicBool,
    ) -> Result<(u64, bool)> {
        match self.snapshot(w)? {
            Err(seq) => Ok((seq, false)),
            Ok(snap) => {
                let staged = Self::stage(snap, cancel)?;
                Ok((self.install(w, staged)?, true))
            }
        }
    }

    /// Starts a background merge of the delta as it stands; false when
    /// there is nothing to merge or one runs already.
    fn start(&self, w: &mut MutexGuard<'_, Option<Wal>>) -> Result<bool> {
        let mut bg = self.bg.lock().map_err(|_| poisoned())?;
        if bg.running.is_some() {
            return Ok(false);
        }
        let snap = match self.snapshot(w)? {
            Ok(s) => s,
            Err(_) => return Ok(false),
        };
        let seq = snap.seq;
        let cancel = Arc::new(AtomicBool::new(false));
        let me = self.me.clone();
        let flag = Arc::clone(&cancel);
        #[cfg(test)]
        let gate = Arc::clone(&self.merge_gate);
        let handle = std::thread::Builder::new()
            .name("nearline-merge".into())
            .spawn(move || {
                #[cfg(test)]
                drop(gate.lock());
                let staged = Self::stage(snap, &flag);
                let Some(slot) = me.upgrade() else {
                    // The index was closed: the staging directory goes.
                    return;
                };
                if let Ok(mut bg) = slot.bg.lock() {
                    bg.ready = Some(staged);
                }
                slot.bg_ready.notify_all();
                // Put it in place, unless a writer waiting for it did, or
                // the index is closing.
                if let Ok(mut w) = slot.writer.lock() {
                    if !flag.load(Ordering::Relaxed) {
                        let _ = slot.finish(&mut w);
                    }
                };
            })
            .map_err(|e| Error::Engine(format!("cannot start the merge thread: {e}")))?;
        // A finished thread's handle is dropped (it detaches; its work is done).
        bg.handle = Some(handle);
        bg.cancel = cancel;
        bg.running = Some(seq);
        Ok(true)
    }

    /// Waits until the background merge's result is ready (or none runs).
    fn wait_ready(&self) -> Result<()> {
        let mut bg = self.bg.lock().map_err(|_| poisoned())?;
        while bg.running.is_some() && bg.ready.is_none() {
            bg = self.bg_ready.wait(bg).map_err(|_| poisoned())?;
        }
        Ok(())
    }

    /// Puts a ready background merge in place (the caller holds the
    /// writer); its error, if it failed.
    fn finish(&self, w: &mut MutexGuard<'_, Option<Wal>>) -> Result<()> {
        let ready = {
            let mut bg = self.bg.lock().map_err(|_| poisoned())?;
            match bg.ready.take() {
                None => return Ok(()),
                Some(r) => {
                    bg.running = None;
                    r
                }
            }
        };
        let done = ready.and_then(|staged| self.install(w, staged));
        if let Err(e) = &done {
            if let Ok(mut c) = self.counters.lock() {
                c.last_merge_error = Some(e.to_string());
            }
        }
        done.map(drop)
    }

    /// Puts a staged merge in place (the caller holds the writer, so no
    /// update is appended meanwhile): the records logged after the merged
    /// sequence go into the new index's log, the directory is swapped,
    /// and the new delta replays them. Returns the merged sequence.
    fn install(&self, w: &mut MutexGuard<'_, Option<Wal>>, staged: Staged) -> Result<u64> {
        let Staged { merge, open, seq } = staged;
        let wal = w.as_ref().ok_or_else(poisoned)?;
        wal.sync()?;
        wal.copy_from(seq + 1, &merge.path().join(WAL_FILE))?;
        // The old index stops reading its directory (its cache's regrowth)
        // before the new one takes the directory's place.
        open.g.retire(true);
        let (m, report) = match merge.commit() {
            Ok(x) => x,
            Err(e) => {
                // The swap did not happen (staging's commit leaves the
                // target as it was on error).
                if crate::io::files::read_manifest(&self.dir)
                    .is_ok_and(|m| m.wal_sequence == open.manifest.wal_sequence)
                {
                    open.g.retire(false);
                }
                return Err(e);
            }
        };
        // The old index's cache goes before the new one loads its own.
        open.g.release_cache();
        drop(open);
        let dur = self.opts.durability;
        let path = wal_path(&self.dir);
        let (new_wal, _) = Wal::open_after(&path, dur, seq, &mut |_| Ok(()))?;
        let (state, _) = open_state(&self.dir, m, &self.opts)?;
        *self.write()? = state;
        **w = Some(new_wal);
        if let Ok(mut c) = self.counters.lock() {
            c.merges += 1;
            c.last_merge = Some(report);
            c.last_merge_error = None;
        }
        Ok(seq)
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

    /// In-place inserts, one vector at a time: each computed while
    /// searches run, logged with its page images, then applied.
    fn insert_in_place(
        &self,
        w: &MutexGuard<'_, Option<Wal>>,
        vectors: &[f32],
        ids: Option<&[u64]>,
    ) -> Result<Vec<u64>> {
        let wal = w.as_ref().ok_or_else(poisoned)?;
        let (rows, ids, dim) = {
            let st = self.state.read().map_err(|_| poisoned())?;
            let ip = st.inplace.as_ref().ok_or_else(poisoned)?;
            let (r, i) = ip.prepare_insert(vectors, ids)?;
            (r, i, st.open.manifest.dim)
        };
        for (row, &e) in rows.chunks(dim).zip(&ids) {
            let patch = {
                let st = self.state.read().map_err(|_| poisoned())?;
                let ip = st.inplace.as_ref().ok_or_else(poisoned)?;
                ip.reserve(&st.open.g, 1)?;
                ip.plan_insert(&st.open, row, e)?
            };
            self.log_and_apply(wal, patch)?;
            if let Ok(mut c) = self.counters.lock() {
                c.inserted += 1;
            }
        }
        Ok(ids)
    }

    /// Runs `f` on the open index and its in-place bookkeeping under the
    /// state's write hold (searches kept out) once no other thread holds the
    /// open index: another holder (an `info()` that may itself wait for the
    /// state) is let go by releasing the hold between tries.
    fn exclusive<R>(&self, f: impl FnOnce(&mut GraphOpen, &mut InPlace) -> Result<R>) -> Result<R> {
        let t0 = std::time::Instant::now();
        loop {
            {
                let mut st = self.write()?;
                let GraphState { open, inplace, .. } = &mut *st;
                if let Some(o) = Arc::get_mut(open) {
                    let ip = inplace.as_mut().ok_or_else(poisoned)?;
                    return f(o, ip);
                }
            }
            if t0.elapsed() > EXCLUSIVE_WAIT {
                return Err(Error::Engine(
                    "an in-place update waited 30 s for other holders of the index to let go"
                        .into(),
                ));
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// Logs `patch` durably, then applies it under the state's write hold.
    fn log_and_apply(&self, wal: &Wal, patch: crate::update::wal::Patch) -> Result<()> {
        let op = Op::Patch(patch);
        let seq = wal.append_op_durable(&op)?;
        let Op::Patch(patch) = op else {
            return Err(poisoned());
        };
        let applied = self.exclusive(|o, ip| {
            ip.apply(o, &patch, true)?;
            ip.applied = seq;
            ip.logged += patch
                .blocks
                .iter()
                .map(|(_, b)| b.len() as u64 + 8)
                .sum::<u64>()
                + patch.vector.len() as u64;
            ip.recount(&o.g)?;
            Ok(ip.logged >= ip.log_limit)
        });
        let full = match applied {
            Ok(f) => f,
            Err(e) => {
                if let Ok(mut b) = self.broken.lock() {
                    *b = Some(e.to_string());
                }
                return Err(e);
            }
        };
        if full {
            // The page images since the last checkpoint fill the log's
            // share: a checkpoint drops them (cheap: the ids and codes).
            self.checkpoint_wal(wal)?;
        }
        Ok(())
    }

    /// In-place deletes: each id a tombstone at once, its in-neighbours
    /// repaired on disk.
    fn delete_in_place(&self, w: &MutexGuard<'_, Option<Wal>>, ids: &[u64]) -> Result<usize> {
        let wal = w.as_ref().ok_or_else(poisoned)?;
        let mut live = 0;
        for &e in ids {
            let patch = {
                let st = self.state.read().map_err(|_| poisoned())?;
                let ip = st.inplace.as_ref().ok_or_else(poisoned)?;
                ip.plan_delete(&st.open, e)?
            };
            if let Some(p) = patch {
                self.log_and_apply(wal, p)?;
                live += 1;
            }
        }
        if let Ok(mut c) = self.counters.lock() {
            c.deleted += live as u64;
        }
        Ok(live)
    }

    /// An in-place checkpoint: the page file synced, the ids and PQ codes
    /// written as new section files, the manifest moved forward, the log
    /// dropped up to it.
    fn checkpoint_in_place(&self, w: &MutexGuard<'_, Option<Wal>>) -> Result<u64> {
        self.checkpoint_wal(w.as_ref().ok_or_else(poisoned)?)
    }

    /// The checkpoint, the caller holding the writer (whose log is `wal`):
    /// the sections are written while searches go on; only the manifest's
    /// swap in memory takes the state's write hold.
    fn checkpoint_wal(&self, wal: &Wal) -> Result<u64> {
        wal.sync()?;
        let (seq, m) = {
            let st = self.state.read().map_err(|_| poisoned())?;
            let ip = st.inplace.as_ref().ok_or_else(poisoned)?;
            let seq = ip.applied;
            if seq == st.open.manifest.wal_sequence {
                return Ok(seq);
            }
            (seq, super::inplace::checkpoint(&self.dir, &st.open, ip)?)
        };
        self.exclusive(|o, ip| {
            o.manifest = m;
            ip.logged = 0;
            Ok(())
        })?;
        wal.truncate_before(seq + 1)?;
        Ok(seq)
    }

    /// Checkpoints, then merges the tombstones away (out of place, as a
    /// build lays the pages) when there are any.
    fn compact_in_place(&self) -> Result<()> {
        let mut w = self.writer()?;
        self.checkpoint_in_place(&w)?;
        let snap = {
            let st = self.state.read().map_err(|_| poisoned())?;
            let ip = st.inplace.as_ref().ok_or_else(poisoned)?;
            if ip.deleted() == 0 || ip.live() == 0 {
                return Ok(());
            }
            let g = &st.open.g;
            Snapshot {
                open: Arc::clone(&st.open),
                seq: st.open.manifest.wal_sequence,
                deleted: (0..g.nodes() as u32).map(|i| g.external(i) < 0).collect(),
                rows: Vec::new(),
                ids: Vec::new(),
                next_auto: ip.next_auto(),
            }
        };
        let staged = Self::stage(snap, &AtomicBool::new(false))?;
        self.install(&mut w, staged).map(drop)
    }

    /// The live external ids.
    pub fn live_ids(&self) -> Result<Vec<u64>> {
        let st = self.read()?;
        if let Some(ip) = &st.inplace {
            let mut ids = ip.live_ids();
            ids.sort_unstable();
            return Ok(ids);
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
