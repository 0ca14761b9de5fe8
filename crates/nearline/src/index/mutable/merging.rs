//! The out-of-place merge of the delta: a snapshot staged in the
//! background (or here), then put in place under the writer.

use super::opening::{self, open_state};
use super::{poisoned, wal_path, GraphSlot};
use crate::index::fresh::WAL_FILE;
use crate::index::graph::GraphOpen;
use crate::index::merge::{merge_index, MergeJob, StagedMerge};
use crate::update::wal::Wal;
use crate::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, MutexGuard};
use std::thread::JoinHandle;

/// What a merge took: the log up to `seq` and the delta as it stood.
pub(super) struct Snapshot {
    pub(super) open: Arc<GraphOpen>,
    pub(super) seq: u64,
    pub(super) deleted: Vec<bool>,
    pub(super) rows: Vec<f32>,
    pub(super) ids: Vec<u64>,
    pub(super) next_auto: u64,
}

/// A merged index staged, with what it was merged from.
pub(super) struct Staged {
    merge: StagedMerge,
    open: Arc<GraphOpen>,
    seq: u64,
}

/// The background merge.
#[derive(Default)]
pub(super) struct Background {
    /// A merge of the log up to this sequence runs or waits to be put in
    /// place.
    running: Option<u64>,
    /// Its result.
    ready: Option<Result<Staged>>,
    handle: Option<JoinHandle<()>>,
    cancel: Arc<AtomicBool>,
}

impl GraphSlot {
    /// A merge runs (or its result waits to be put in place).
    pub fn merging(&self) -> bool {
        self.bg.lock().is_ok_and(|b| b.running.is_some())
    }

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
    /// Whether `shutdown` has asked the running merge to stop.
    pub(in crate::index) fn cancel_requested(&self) -> bool {
        self.bg
            .lock()
            .is_ok_and(|b| b.cancel.load(Ordering::Relaxed))
    }
}

impl GraphSlot {
    /// What a merge of the delta as it stands would take: `Err(seq)` when
    /// there is nothing to merge (the log sequence the index holds).
    pub(super) fn snapshot(
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
    pub(super) fn stage(snap: Snapshot, cancel: &AtomicBool) -> Result<Staged> {
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
    pub(super) fn merge_locked(
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
    pub(super) fn start(&self, w: &mut MutexGuard<'_, Option<Wal>>) -> Result<bool> {
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
    pub(super) fn wait_ready(&self) -> Result<()> {
        let mut bg = self.bg.lock().map_err(|_| poisoned())?;
        while bg.running.is_some() && bg.ready.is_none() {
            bg = self.bg_ready.wait(bg).map_err(|_| poisoned())?;
        }
        Ok(())
    }

    /// Puts a ready background merge in place (the caller holds the
    /// writer); its error, if it failed.
    pub(super) fn finish(&self, w: &mut MutexGuard<'_, Option<Wal>>) -> Result<()> {
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
    pub(super) fn install(
        &self,
        w: &mut MutexGuard<'_, Option<Wal>>,
        staged: Staged,
    ) -> Result<u64> {
        let Staged { merge, open, seq } = staged;
        let wal = w.as_ref().ok_or_else(poisoned)?;
        wal.sync()?;
        wal.copy_from(seq + 1, &merge.path().join(WAL_FILE))?;
        // The old index stops reading its directory (its cache's regrowth)
        // before the new one takes the directory's place.
        open.g.retire(true);
        // An index updated in place: the new directory is locked before it
        // takes the old one's place, so no other open slips in between.
        let held = if self.in_place()? {
            opening::in_place_lock(merge.path(), true)?
        } else {
            None
        };
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
        let (state, _) = open_state(&self.dir, m, &self.opts, held)?;
        *self.write()? = state;
        **w = Some(new_wal);
        if let Ok(mut c) = self.counters.lock() {
            c.merges += 1;
            c.last_merge = Some(report);
            c.last_merge_error = None;
        }
        Ok(seq)
    }
}
