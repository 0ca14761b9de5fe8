//! A read-only open of a partition index: needs no write permission, and
//! runs beside the index's one writer (another process), seeing every
//! update the writer has acknowledged before a search begins.
//!
//! * **Loading**: the reader loads the checkpoint the manifest names and
//!   holds a shared `flock` on its state file for as long as it uses it.
//!   The writer, at its next checkpoint, frees the blocks released since a
//!   state only when no reader holds that state (or an older one), so the
//!   blocks a reader's posting map names are never rewritten under it. The
//!   reader takes the lock, then reads the manifest again: a checkpoint in
//!   between makes it start over with the new one.
//! * **Following the log**: before each search (and `len`, `live_ids`,
//!   `check`, `info`) the reader reads the writer's log from the last
//!   record it applied ([`crate::update::tail`]): a delete marks the id
//!   deleted in the reader's own version map (or drops it from the vectors
//!   below); an insert's vectors are kept in memory (the *delta*) and
//!   scored exhaustively by every search beside the postings — the reader
//!   writes nothing. An acknowledged update is in the log before the
//!   writer's call returned, so a search begun afterwards sees it.
//! * **Catching up with a checkpoint**: when the manifest names a newer
//!   checkpoint (or the log was reset past what the reader read), the
//!   reader loads that checkpoint and swaps it in; searches under way keep
//!   the one they started with.
//!
//! A writer that crashes and restarts frees the blocks its last checkpoint
//! listed as free at once, whatever a reader holds: a search of a reader
//! that is under way at that moment may then miss entries (versions only
//! grow, so it never takes a stale vector for a live one), and the reader's
//! next search loads the newer checkpoint.

use super::loaded::load_state;
use super::state::PartitionManifest;
use super::store::{Store, POSTINGS_FILE};
use super::{lock, read, read_manifest, write, Inner, PartitionIndex, PartitionOpen};
use super::{DELETED, WAL_FILE};
use crate::distance::{normalize, Metric};
use crate::elem::DType;
use crate::update::recovery::{replay, Recover};
use crate::update::tail::{TailStatus, WalTail};
use crate::update::wal::Record;
use crate::{Error, Result};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};

/// Attempts at loading a checkpoint that the writer keeps replacing.
const LOAD_ATTEMPTS: usize = 100;

/// Identity of a file as the directory names it: a rename over it (how
/// manifests are replaced) gives another inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    ino: u64,
    mtime_ns: i64,
    len: u64,
}

fn file_id(path: &Path) -> Result<FileId> {
    let m = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    Ok(FileId {
        ino: m.ino(),
        mtime_ns: m.mtime().saturating_mul(1_000_000_000) + m.mtime_nsec(),
        len: m.len(),
    })
}

/// Vectors the writer inserted after the reader's checkpoint.
#[derive(Debug, Default)]
struct Delta {
    ids: Vec<u64>,
    vectors: Vec<f32>,
    alive: Vec<bool>,
    /// External id → row.
    rows: HashMap<u64, usize>,
}

/// Where the reader is in the writer's log.
#[derive(Debug)]
struct Follow {
    log: WalTail,
    /// The last sequence applied.
    applied: u64,
}

/// What a read-only open keeps besides the loaded checkpoint.
pub(super) struct Reader {
    /// The shared lock on the loaded state file.
    _pin: File,
    /// The manifest file that named it.
    manifest: FileId,
    follow: Mutex<Follow>,
    delta: RwLock<Delta>,
}

impl Reader {
    /// External ids of the live vectors from the log.
    pub(super) fn delta_ids(&self) -> Vec<u64> {
        read(&self.delta).rows.keys().copied().collect()
    }

    pub(super) fn delta_has(&self, id: u64) -> bool {
        read(&self.delta).rows.contains_key(&id)
    }

    pub(super) fn delta_live(&self) -> usize {
        read(&self.delta).rows.len()
    }

    /// Resident bytes of the vectors from the log and their map.
    pub(super) fn delta_bytes(&self) -> u64 {
        let d = read(&self.delta);
        (d.vectors.capacity() * 4 + d.ids.capacity() * 8 + d.alive.capacity()) as u64
            + d.rows.capacity() as u64 * 17 * 8 / 7
    }
}

/// Loads the checkpoint the manifest names, holding its state file's
/// shared lock; starts over when a checkpoint replaces it meanwhile.
fn pin_checkpoint(dir: &Path) -> Result<(PartitionManifest, File, FileId)> {
    let mpath = dir.join(crate::format::MANIFEST_FILE);
    for _ in 0..LOAD_ATTEMPTS {
        let id = file_id(&mpath)?;
        let m = read_manifest(dir)?;
        let spath = dir.join(&m.state_file);
        let f = match File::open(&spath) {
            Ok(f) => f,
            // Replaced by a checkpoint since the manifest was read.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(&spath, e)),
        };
        match f.lock_shared() {
            Ok(()) => {}
            // A file system without locks: nothing to hold.
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {}
            Err(e) => return Err(Error::io(&spath, e)),
        }
        // Held: the writer keeps its blocks from now on, if it still is the
        // checkpoint the manifest names.
        if file_id(&mpath)? == id {
            return Ok((m, f, id));
        }
    }
    Err(Error::arg(format!(
        "{}: the writer replaced its checkpoint {LOAD_ATTEMPTS} times while it was being \
         loaded; try again",
        dir.display()
    )))
}

impl Inner {
    /// Opens the index for reading: its checkpoint (held, see above), then
    /// the writer's log after it.
    pub(super) fn open_reader(dir: &Path, opts: &PartitionOpen) -> Result<Inner> {
        for _ in 0..LOAD_ATTEMPTS {
            let (m, pin, manifest) = pin_checkpoint(dir)?;
            let wpath = dir.join(WAL_FILE);
            let log = WalTail::open(&wpath)?;
            if log.first_seq() > m.wal_sequence + 1 {
                // The log was reset past this checkpoint: a newer one exists.
                continue;
            }
            let applied = m.wal_sequence;
            let l = load_state(dir, m)?;
            let store = Store::open_read_only(&dir.join(POSTINGS_FILE), l.st.blocks_end, opts.io)?;
            let reader = Reader {
                _pin: pin,
                manifest,
                follow: Mutex::new(Follow { log, applied }),
                delta: RwLock::new(Delta::default()),
            };
            let inner = Inner::from_loaded(dir, opts, l, store, None, Some(reader))?;
            if inner.follow_log()? {
                return Ok(inner);
            }
        }
        Err(Error::arg(format!(
            "{}: the writer replaced its checkpoint {LOAD_ATTEMPTS} times while it was being \
             loaded; try again",
            dir.display()
        )))
    }

    /// Applies the writer's log records after the last applied one.
    /// `false`: the log was reset past them (a newer checkpoint holds
    /// them): load that one instead.
    fn follow_log(&self) -> Result<bool> {
        let Some(r) = &self.reader else {
            return Ok(true);
        };
        let wpath = self.dir.join(WAL_FILE);
        let mut f = lock(&r.follow);
        loop {
            let after = f.applied;
            let mut recs = Vec::new();
            let status = f.log.read_new(after, &mut |rec: Record| {
                recs.push(rec);
                Ok(())
            })?;
            let mut target = Following {
                inner: self,
                r,
                applied: &mut f.applied,
            };
            for rec in &recs {
                replay(&mut target, rec, &wpath)?;
            }
            if status == TailStatus::Current {
                return Ok(true);
            }
            // Reset at a checkpoint: go on in the new file if it starts
            // right after what was applied.
            let log = WalTail::open(&wpath)?;
            if log.first_seq() > f.applied + 1 {
                return Ok(false);
            }
            f.log = log;
        }
    }

    /// Whether the manifest names another checkpoint than the loaded one.
    fn checkpoint_moved(&self) -> Result<bool> {
        let Some(r) = &self.reader else {
            return Ok(false);
        };
        Ok(file_id(&self.dir.join(crate::format::MANIFEST_FILE))? != r.manifest)
    }

    /// Merges the vectors from the log into a search's results: each
    /// query's `k` nearest of both, by internal distance (ids −1 pad).
    pub(super) fn merge_delta(
        &self,
        queries: &[f32],
        k: usize,
        ids: &mut [i64],
        dists: &mut [f32],
    ) {
        let Some(r) = &self.reader else {
            return;
        };
        let d = read(&r.delta);
        if d.rows.is_empty() {
            return;
        }
        let dim = self.dim;
        let mut q = vec![0f32; dim];
        for (qi, qv) in queries.chunks_exact(dim).enumerate() {
            q.copy_from_slice(qv);
            if self.metric == Metric::Cosine {
                normalize(&mut q);
            }
            let row_ids = &mut ids[qi * k..(qi + 1) * k];
            let row_ds = &mut dists[qi * k..(qi + 1) * k];
            let mut best: Vec<(f32, i64)> = row_ids
                .iter()
                .zip(row_ds.iter())
                .filter(|(&id, _)| id >= 0)
                .map(|(&id, &dd)| (dd, id))
                .collect();
            for (row, v) in d.vectors.chunks_exact(dim).enumerate() {
                if d.alive[row] {
                    best.push((self.metric.distance(&q, v), d.ids[row] as i64));
                }
            }
            best.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            for j in 0..k {
                let (dd, id) = best.get(j).copied().unwrap_or((f32::INFINITY, -1));
                row_ids[j] = id;
                row_ds[j] = dd;
            }
        }
    }
}

impl PartitionIndex {
    /// The loaded index; a reader first catches up with the writer: loads
    /// its newer checkpoint if there is one, then its log.
    pub(super) fn current(&self) -> Result<Arc<Inner>> {
        let inner = self.loaded();
        if inner.reader.is_none() {
            return Ok(inner);
        }
        if !inner.checkpoint_moved()? && inner.follow_log()? {
            return Ok(inner);
        }
        let fresh = Arc::new(Inner::open_reader(&self.dir, &self.opts)?);
        *write(&self.inner) = Arc::clone(&fresh);
        Ok(fresh)
    }
}

/// A read-only open applying the writer's log the reader's way: an insert's
/// vectors are kept in memory (the delta), a delete marks the id deleted in
/// the reader's own version map or drops it from the delta.
struct Following<'a> {
    inner: &'a Inner,
    r: &'a Reader,
    applied: &'a mut u64,
}

impl Recover for Following<'_> {
    fn dim(&self) -> usize {
        self.inner.dim
    }

    fn logged_dtype(&self) -> Option<DType> {
        Some(DType::F32)
    }

    fn applied(&self) -> u64 {
        *self.applied
    }

    fn set_applied(&mut self, seq: u64) {
        *self.applied = seq;
    }

    fn replay_insert(&mut self, ids: &[u64], rows: &[f32]) -> Result<()> {
        let mut d = write(&self.r.delta);
        for (id, row) in ids.iter().zip(rows.chunks_exact(self.inner.dim)) {
            let at = d.ids.len();
            d.ids.push(*id);
            d.vectors.extend_from_slice(row);
            d.alive.push(true);
            if let Some(old) = d.rows.insert(*id, at) {
                d.alive[old] = false;
            }
        }
        Ok(())
    }

    fn replay_delete(&mut self, ids: &[u64]) -> Result<()> {
        let mut g = lock(&self.inner.ids);
        let versions = read(&self.inner.versions);
        let mut d = write(&self.r.delta);
        for &id in ids {
            if let Some(i) = g.tracker.remove(id) {
                if let Some(v) = versions.get(i as usize) {
                    v.fetch_or(DELETED, Ordering::AcqRel);
                }
            }
            if let Some(row) = d.rows.remove(&id) {
                d.alive[row] = false;
            }
        }
        Ok(())
    }
}
