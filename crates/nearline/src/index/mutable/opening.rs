//! How an open comes to its state: the graph index loaded, the log after
//! its checkpoint replayed (into the delta, or as in-place updates), and
//! a read-only open following what a writer logs later.

use super::{poisoned, wal_path, GraphSlot, GraphState};
use crate::format::{Manifest, UpdateMode};
use crate::index::fresh::Delta;
use crate::index::graph::{GraphIndex, GraphOpen};
use crate::index::inplace::InPlace;
use crate::planner::{self, OpenOptions};
use crate::update::recovery::{check_continues, Recover};
use crate::update::tail::{TailStatus, WalTail};
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
/// Opens the graph index in `dir` (manifest `m`) and its delta: the log
/// after the manifest's sequence is replayed into it. An index updated in
/// place is locked first ([`in_place_lock`]), unless `held` is the lock
/// already taken on the directory now at `dir` (a compaction's).
pub(super) fn open_state(
    dir: &Path,
    m: Manifest,
    opts: &OpenOptions,
    held: Option<std::fs::File>,
) -> Result<(GraphState, Option<WalTail>)> {
    let plan = planner::plan_open(opts, &m)?;
    let mode = opts.update.unwrap_or(m.spec.update);
    let lock = match (mode, held) {
        (UpdateMode::InPlace, Some(f)) => Some(f),
        (UpdateMode::InPlace, None) => in_place_lock(dir, !opts.read_only)?,
        (UpdateMode::OutOfPlace, _) => None,
    };
    if mode == UpdateMode::InPlace {
        if let Some(why) = crate::index::inplace::refusal(&m, plan.cache) {
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
        let mut ip = InPlace::new(&mut open.g, open.manifest.wal_sequence);
        let path = wal_path(dir);
        if path.exists() {
            let mut t = WalTail::open(&path)?;
            check_continues(&path, t.first_seq(), open.manifest.wal_sequence)?;
            let after = ip.applied;
            let mut r = Replaying {
                ip: &mut ip,
                open: &mut open,
                write: !opts.read_only,
                expected: BTreeMap::new(),
            };
            t.read_new(after, &mut |rec| {
                crate::update::recovery::replay(&mut r, &rec, &path)
            })?;
            r.check_expected()?;
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
                _lock: lock,
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
            _lock: None,
        },
        tail,
    ))
}

/// Locks the directory of an index updated in place: `exclusive` for a
/// writable open, shared for a read-only one (`None`: the file system has
/// no locks). Its pages are rewritten in place, so another process reading
/// them could see a record change between the log records it has applied:
/// a read-only open cannot follow an in-place writer as it follows an
/// out-of-place one, and the two never overlap.
pub(super) fn in_place_lock(dir: &Path, exclusive: bool) -> Result<Option<std::fs::File>> {
    let f = std::fs::File::open(dir).map_err(|e| Error::io(dir, e))?;
    let r = if exclusive {
        f.try_lock()
    } else {
        f.try_lock_shared()
    };
    match r {
        Ok(()) => Ok(Some(f)),
        Err(std::fs::TryLockError::WouldBlock) => {
            let why = if exclusive {
                "this index is updated in place and is open elsewhere (another writable or \
                 read-only open, in this or another process): its pages are rewritten in \
                 place, so a writable open excludes every other open; close the other one, or \
                 open with update=\"out_of_place\", whose read-only opens follow a writer"
            } else {
                "this index is updated in place and a writable open holds it (in this or \
                 another process): a read-only open cannot follow pages rewritten in place; \
                 close the writer first, or open the writer with update=\"out_of_place\", \
                 whose read-only opens follow it"
            };
            Err(Error::io(
                dir,
                std::io::Error::new(std::io::ErrorKind::WouldBlock, why),
            ))
        }
        // A file system without locks: go on without the guard.
        Err(std::fs::TryLockError::Error(_)) => Ok(None),
    }
}

/// Replays an in-place index's log: page-image records are applied (their
/// blocks written again unless read-only), logical ones (a log written
/// out of place before the index switched) run as in-place updates.
struct Replaying<'a> {
    ip: &'a mut InPlace,
    open: &'a mut GraphOpen,
    write: bool,
    /// A read-only replay writes nothing: the CRC32C of the last image the
    /// log holds for each block, which the page file must hold once every
    /// record is replayed (a later record may rewrite an earlier one's
    /// block, so only the last image is what the disk holds).
    expected: BTreeMap<u64, u32>,
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
        let rows = crate::index::inplace::stored_rows(
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
            for (b, img) in &patch.blocks {
                self.expected.insert(*b, crc32c::crc32c(img));
            }
        }
        self.ip.apply(self.open, patch, self.write)
    }
}

impl Replaying<'_> {
    /// A read-only replay: every block the log rewrote must be on disk as
    /// its last record left it.
    fn check_expected(&self) -> Result<()> {
        if self.expected.is_empty() {
            return Ok(());
        }
        let pages = self.open.g.pages_path();
        let geo = self.open.g.geometry();
        let mut r = crate::io::BlockReader::open(&pages, geo.block_size)?;
        for (&b, &crc) in &self.expected {
            let on_disk = r
                .read(geo.block_offset(b))
                .ok()
                .map(|x| crc32c::crc32c(&x[..geo.block_size]));
            if on_disk != Some(crc) {
                return Err(Error::arg(format!(
                    "block {b} of the page file does not hold what the log says (an update \
                     was cut short): open the index for writing once to recover it"
                )));
            }
        }
        Ok(())
    }

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
    /// A read-only open: applies the records the writer logged since the
    /// last look; reloads the index when a merge replaced it.
    pub(super) fn follow(&self) -> Result<()> {
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
                let (fresh, t2) = open_state(&self.dir, m, &self.opts, None)?;
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
                let (fresh, t2) = open_state(&self.dir, m, &self.opts, None)?;
                *self.write()? = fresh;
                *tail = t2;
            } else {
                *t = WalTail::open(&path)?;
            }
        }
        Ok(())
    }
}
