//! The in-place update path of an open graph index (`update="in_place"`):
//! each update computed under the state's read hold, logged with its page
//! images, then applied under the write hold; checkpoints and compaction.

use super::merging::Snapshot;
use super::{poisoned, GraphSlot, GraphState};
use crate::index::graph::GraphOpen;
use crate::index::inplace::sweep::SWEEP_BLOCKS;
use crate::index::inplace::InPlace;
use crate::update::wal::{Op, Wal};
use crate::{Error, Result};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, MutexGuard};
/// How long an in-place update waits for other holders of the open index
/// (an `info()` or a plan that took it for a moment) to let go.
const EXCLUSIVE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

#[cfg(test)]
impl GraphSlot {
    /// Tests: an index updated in place checkpoints after this many bytes
    /// of page images.
    pub(in crate::index) fn set_in_place_log_limit(&self, bytes: u64) {
        if let Ok(mut st) = self.state.write() {
            if let Some(ip) = st.inplace.as_mut() {
                ip.log_limit = bytes;
            }
        }
    }

    /// Tests: the page file's writes go through `wrap` from now on.
    pub(in crate::index) fn inject_page_faults(
        &self,
        wrap: impl FnOnce(Arc<std::fs::File>, u64) -> Arc<dyn crate::io::DurableFile>,
    ) -> Result<()> {
        self.exclusive(|o, ip| ip.inject_page_faults(&o.g.pages_path(), wrap))
    }
}

/// `err`, saying which of a call's ids were `done` before it (an in-place
/// call updates one vector at a time; those before a failure stay).
fn partly(err: Error, done: &[u64], what: &str) -> Error {
    if done.is_empty() {
        return err;
    }
    let note = format!(
        " ({} id(s) of this call were {what} before the failure, the first {} and the last {})",
        done.len(),
        done[0],
        done[done.len() - 1]
    );
    match err {
        Error::InvalidArgument(m) => Error::InvalidArgument(m + &note),
        Error::Engine(m) => Error::Engine(m + &note),
        other => Error::Engine(format!("{other}{note}")),
    }
}

impl GraphSlot {
    /// Marks the index broken by `e` (a write the log holds may be missing
    /// from the page file: updates are refused until a reopen replays the
    /// log) and returns `e`.
    fn break_with(&self, e: Error) -> Error {
        if let Ok(mut b) = self.broken.lock() {
            *b = Some(e.to_string());
        }
        e
    }

    /// In-place inserts, one vector at a time: each computed while
    /// searches run, logged with its page images, then applied.
    pub(super) fn insert_in_place(
        &self,
        w: &MutexGuard<'_, Option<Wal>>,
        vectors: &[f32],
        ids: Option<&[u64]>,
    ) -> Result<Vec<u64>> {
        let wal = w.as_ref().ok_or_else(poisoned)?;
        let (rows, ids, dim) = {
            let st = self.state.read().map_err(|_| poisoned())?;
            let ip = st.inplace.as_ref().ok_or_else(poisoned)?;
            let (r, i) = ip.prepare_insert(&st.open.g, vectors, ids)?;
            (r, i, st.open.manifest.dim)
        };
        for (i, (row, &e)) in rows.chunks(dim).zip(&ids).enumerate() {
            let one = || {
                let patch = {
                    let st = self.state.read().map_err(|_| poisoned())?;
                    let ip = st.inplace.as_ref().ok_or_else(poisoned)?;
                    ip.reserve(&st.open.g, 1)?;
                    ip.plan_insert(&st.open, row, e)?
                };
                self.log_and_apply(wal, patch)
            };
            one()
                .and_then(|()| self.sweep_step(wal))
                .map_err(|err| partly(err, &ids[..i], "inserted"))?;
            if let Ok(mut c) = self.counters.lock() {
                c.inserted += 1;
            }
        }
        Ok(ids)
    }

    /// One slice of the sweep of edges to tombstones, after an update
    /// (see `inplace::sweep`): its repairs logged and applied like an
    /// update's; a round's end frees its tombstones' slots.
    fn sweep_step(&self, wal: &Wal) -> Result<()> {
        let mut step = {
            let st = self.state.read().map_err(|_| poisoned())?;
            let ip = st.inplace.as_ref().ok_or_else(poisoned)?;
            match ip.plan_sweep(&st.open, SWEEP_BLOCKS)? {
                Some(s) => s,
                None => return Ok(()),
            }
        };
        if let Some(p) = step.patch.take() {
            self.log_and_apply(wal, p)?;
        }
        let mut st = self.write()?;
        st.inplace
            .as_mut()
            .ok_or_else(poisoned)?
            .advance_sweep(&step);
        Ok(())
    }

    /// Runs `f` on the open index and its in-place bookkeeping under the
    /// state's write hold (searches kept out) once no other thread holds the
    /// open index: another holder (an `info()` that may itself wait for the
    /// state) is let go by releasing the hold between tries.
    pub(super) fn exclusive<R>(
        &self,
        f: impl FnOnce(&mut GraphOpen, &mut InPlace) -> Result<R>,
    ) -> Result<R> {
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
    pub(super) fn log_and_apply(&self, wal: &Wal, patch: crate::update::wal::Patch) -> Result<()> {
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
        let full = applied.map_err(|e| self.break_with(e))?;
        if full {
            // The page images since the last checkpoint fill the log's
            // share: a checkpoint drops them (cheap: the ids and codes).
            self.checkpoint_wal(wal)?;
        }
        Ok(())
    }

    /// In-place deletes: each id a tombstone at once, its in-neighbours
    /// repaired on disk.
    pub(super) fn delete_in_place(
        &self,
        w: &MutexGuard<'_, Option<Wal>>,
        ids: &[u64],
    ) -> Result<usize> {
        let wal = w.as_ref().ok_or_else(poisoned)?;
        let mut live = 0;
        for (done, &e) in ids.iter().enumerate() {
            let patch = {
                let st = self.state.read().map_err(|_| poisoned())?;
                let ip = st.inplace.as_ref().ok_or_else(poisoned)?;
                ip.reserve(&st.open.g, 0)?;
                ip.plan_delete(&st.open, e)?
            };
            if let Some(p) = patch {
                self.log_and_apply(wal, p)
                    .and_then(|()| self.sweep_step(wal))
                    .map_err(|err| partly(err, &ids[..done], "deleted"))?;
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
    pub(super) fn checkpoint_in_place(&self, w: &MutexGuard<'_, Option<Wal>>) -> Result<u64> {
        self.checkpoint_wal(w.as_ref().ok_or_else(poisoned)?)
    }

    /// The checkpoint, the caller holding the writer (whose log is `wal`):
    /// the sections are written while searches go on; only the manifest's
    /// swap in memory takes the state's write hold.
    pub(super) fn checkpoint_wal(&self, wal: &Wal) -> Result<u64> {
        wal.sync()?;
        let (seq, m) = {
            let st = self.state.read().map_err(|_| poisoned())?;
            let ip = st.inplace.as_ref().ok_or_else(poisoned)?;
            let seq = ip.applied;
            if seq == st.open.manifest.wal_sequence {
                return Ok(seq);
            }
            // A failed sync may have dropped page writes the log still
            // holds: updates stop until a reopen writes them again.
            let m = crate::index::inplace::checkpoint(&self.dir, &st.open, ip)
                .map_err(|e| self.break_with(e))?;
            (seq, m)
        };
        self.exclusive(|o, ip| {
            o.manifest = m;
            ip.logged = 0;
            Ok(())
        })?;
        wal.truncate_before(seq + 1)?;
        // The BFS cache follows the graph: nodes near the start were
        // deleted and their slots taken by vectors from anywhere.
        self.state
            .read()
            .map_err(|_| poisoned())?
            .open
            .g
            .reload_cache();
        Ok(seq)
    }

    /// Checkpoints, then merges the tombstones away (out of place, as a
    /// build lays the pages) when there are any.
    pub(super) fn compact_in_place(&self) -> Result<()> {
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
}
