//! Checkpoints and recovery of a partition index: the state files, opening
//! (the last checkpoint, then the log after it) and writing a checkpoint.

use super::lire::Jobs;
use super::loaded::{load_state, Loaded};
use super::reader::Reader;
use super::state::{PartitionManifest, State};
use super::store::{PostingRef, Store, POSTINGS_FILE};
use super::{
    lock, read, read_manifest, threads_or_cores, write, Counters, Ids, Inner, PartitionIndex,
    PartitionOpen, DELETED, STRIPES, WAL_FILE,
};
use crate::elem::DType;
use crate::format::MANIFEST_FILE;
use crate::graph::dynamic::DynamicGraph as Heads;
use crate::io::files::{sync_dir, write_durable};
use crate::io::open_direct;
use crate::update::ids::IdTracker;
use crate::update::recovery::{replay, Recover};
use crate::update::wal::Wal;
use crate::{Error, Result};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};

pub(super) fn write_manifest(dir: &Path, m: &PartitionManifest) -> Result<()> {
    let path = dir.join(MANIFEST_FILE);
    let tmp = dir.join(".manifest.json.tmp");
    let text = m.to_text(&path)?;
    write_durable(&tmp, text.as_bytes())?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
    sync_dir(dir)
}

pub(super) fn state_name(generation: u64) -> String {
    format!("state-{generation}.bin")
}

/// The generation a state file's name carries (`state-G.bin`).
pub(super) fn state_generation(name: &str) -> Option<u64> {
    name.strip_prefix("state-")?
        .strip_suffix(".bin")?
        .parse()
        .ok()
}

/// Removes the state files of `dir` other than generation `keep`'s that
/// no reader holds: a checkpoint killed before its manifest names its state
/// leaves that state behind (a later generation), one killed before it
/// removed the previous state leaves that (an earlier one), and a reader
/// (`reader.rs`) keeps a shared lock on the state it loaded until it moves
/// on. Only files named like state files are touched. Returns the oldest
/// earlier generation a reader holds, if any: blocks released under it or
/// later may still be named by that reader's map.
pub(super) fn remove_other_states(dir: &Path, keep: u64) -> Result<Option<u64>> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut held: Option<u64> = None;
    for e in rd {
        let e = e.map_err(|e| Error::io(dir, e))?;
        let name = e.file_name();
        let Some(g) = name.to_str().and_then(state_generation) else {
            continue;
        };
        if g == keep {
            continue;
        }
        let path = e.path();
        let f = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(&path, e)),
        };
        match f.try_lock() {
            // Held exclusively while it goes: a reader that opened it just
            // now waits, then finds the manifest moved on.
            Ok(()) => std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?,
            Err(std::fs::TryLockError::WouldBlock) if g < keep => {
                held = Some(held.map_or(g, |h| h.min(g)));
            }
            Err(std::fs::TryLockError::WouldBlock) => {}
            // A file system without locks: no reader can pin it either.
            Err(std::fs::TryLockError::Error(_)) => {
                std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?
            }
        }
    }
    Ok(held)
}

pub(super) fn snapshot_state(
    heads: &Heads,
    postings: &[Option<Arc<PostingRef>>],
    versions: &[u32],
    external: &[u64],
    next_auto_id: u64,
    store: &Store,
) -> State {
    let slots = heads.slots();
    let (blocks_end, free_blocks) = store.snapshot();
    State {
        dim: heads.dim(),
        head_alive: (0..slots as u32).map(|s| heads.is_alive(s)).collect(),
        head_vecs: (0..slots as u32)
            .flat_map(|s| heads.vector(s).to_vec())
            .collect(),
        head_lists: (0..slots as u32)
            .map(|s| heads.neighbors(s).to_vec())
            .collect(),
        head_start: heads.start(),
        head_free: heads.free_slots().to_vec(),
        postings: (0..slots)
            .map(|s| postings.get(s).cloned().flatten().map(|p| (*p).clone()))
            .collect(),
        versions: versions.to_vec(),
        external: external.to_vec(),
        next_auto_id,
        blocks_end,
        free_blocks,
    }
}

impl Inner {
    /// The index over a loaded checkpoint: the postings through `store`,
    /// updates logged to `wal` (a writer) or followed by `reader`.
    pub(super) fn from_loaded(
        dir: &Path,
        opts: &PartitionOpen,
        l: Loaded,
        store: Store,
        wal: Option<Wal>,
        reader: Option<Reader>,
    ) -> Result<Inner> {
        let ppath = dir.join(POSTINGS_FILE);
        let (rf, direct) = open_direct(&ppath)?;
        let Loaded {
            m,
            st,
            heads,
            by_ext,
        } = l;
        let jobs = Jobs {
            // A reader runs no background work: what its searches would
            // queue is the writer's to do.
            stop: reader.is_some(),
            ..Jobs::default()
        };
        Ok(Inner {
            dir: dir.to_path_buf(),
            dim: m.dim,
            metric: m.metric,
            params: m.params.clone(),
            heads: RwLock::new(heads),
            postings: RwLock::new(st.postings.into_iter().map(|p| p.map(Arc::new)).collect()),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            versions: RwLock::new(st.versions.iter().map(|&v| AtomicU32::new(v)).collect()),
            external: RwLock::new(st.external),
            ids: Mutex::new(Ids {
                tracker: IdTracker::new(by_ext, st.next_auto_id),
                retired: Vec::new(),
                free: st
                    .versions
                    .iter()
                    .enumerate()
                    .filter(|(_, &v)| v & DELETED != 0)
                    .map(|(i, _)| i as u32)
                    .collect(),
            }),
            store,
            read_file: Arc::new(rf),
            direct_reads: direct,
            io: opts.io,
            engines: Mutex::new(Vec::new()),
            wal,
            reader,
            budget: opts.memory_budget,
            update: Mutex::new(()),
            maint: Mutex::new(()),
            gate: RwLock::new(()),
            placing: RwLock::new(()),
            jobs: Mutex::new(jobs),
            jobs_cv: Condvar::new(),
            counters: Counters::default(),
            threads: threads_or_cores(opts.threads),
            failed: Mutex::new(None),
            closing: AtomicBool::new(false),
            manifest: Mutex::new(m),
        })
    }

    /// Opens the index as its one writer: loads the checkpoint, replays the
    /// log after it.
    fn open_writer(dir: &Path, opts: &PartitionOpen) -> Result<Inner> {
        let m = read_manifest(dir)?;
        let l = load_state(dir, m)?;
        let ppath = dir.join(POSTINGS_FILE);
        let store = Store::open_with_io(&ppath, l.st.blocks_end, l.st.free_blocks.clone(), opts.io)
            .map_err(|e| writable_hint(dir, e))?;
        let wpath = dir.join(WAL_FILE);
        let mut pending = Vec::new();
        let (wal, _) = Wal::open_after(&wpath, opts.durability, l.m.wal_sequence, &mut |r| {
            pending.push(r);
            Ok(())
        })
        .map_err(|e| writable_hint(dir, e))?;
        // The log's lock makes this the one writer: what a killed
        // checkpoint left goes (a state a reader holds stays).
        remove_other_states(dir, l.m.generation)?;
        let applied = l.m.wal_sequence;
        let inner = Inner::from_loaded(dir, opts, l, store, Some(wal), None)?;
        let mut target = Writing {
            inner: &inner,
            applied,
        };
        for r in &pending {
            replay(&mut target, r, &wpath)?;
        }
        Ok(inner)
    }
}

/// A writer's open rebuilding its postings from the log after the
/// checkpoint it loaded.
struct Writing<'a> {
    inner: &'a Inner,
    applied: u64,
}

impl Recover for Writing<'_> {
    fn dim(&self) -> usize {
        self.inner.dim
    }

    fn logged_dtype(&self) -> Option<DType> {
        Some(DType::F32)
    }

    fn applied(&self) -> u64 {
        self.applied
    }

    fn set_applied(&mut self, seq: u64) {
        self.applied = seq;
    }

    fn replay_insert(&mut self, ids: &[u64], rows: &[f32]) -> Result<()> {
        self.inner.apply_insert(ids, rows)
    }

    fn replay_delete(&mut self, ids: &[u64]) -> Result<()> {
        self.inner.apply_delete(ids);
        Ok(())
    }
}

/// A writable open that failed for want of permission or because another
/// process writes: says how to read the index instead.
fn writable_hint(dir: &Path, e: Error) -> Error {
    let refused = match &e {
        Error::Io { source, .. } => matches!(
            source.kind(),
            std::io::ErrorKind::PermissionDenied
                | std::io::ErrorKind::WouldBlock
                | std::io::ErrorKind::ReadOnlyFilesystem
        ),
        _ => false,
    };
    if refused {
        Error::arg(format!(
            "{e}; to search {} beside its writer or without write permission, open it with \
             read_only=True (CLI: --read-only)",
            dir.display()
        ))
    } else {
        e
    }
}

impl PartitionIndex {
    /// Opens the partition index in `dir`: as its one writer (loads the
    /// checkpoint, replays the log after it, starts the background worker)
    /// or, with [`PartitionOpen::read_only`], as a reader (`reader.rs`).
    pub fn open(dir: &Path, opts: &PartitionOpen) -> Result<PartitionIndex> {
        let inner = if opts.read_only {
            Inner::open_reader(dir, opts)?
        } else {
            Inner::open_writer(dir, opts)?
        };
        if let Some(b) = opts.memory_budget {
            let held = inner.memory_bytes();
            if held > b {
                return Err(Error::arg(format!(
                    "memory_budget {b} B is below what this partition index holds open: {held} B \
                     (its heads, id maps and the I/O buffers of {} search threads); open it with \
                     memory_budget of at least {held} B, or fewer threads",
                    inner.threads
                )));
            }
        }
        let inner = Arc::new(inner);
        let idx = PartitionIndex {
            inner: RwLock::new(Arc::clone(&inner)),
            worker: Mutex::new(None),
            dir: dir.to_path_buf(),
            opts: opts.clone(),
        };
        if opts.background && !opts.read_only {
            let h = std::thread::Builder::new()
                .name("nearline-lire".into())
                .spawn(move || inner.worker_loop())
                .map_err(|e| Error::arg(format!("cannot start the update worker: {e}")))?;
            *lock(&idx.worker) = Some(h);
        }
        Ok(idx)
    }
}

impl Inner {
    /// A checkpoint; with `only_if_needed`, only when released blocks still
    /// wait for one once the locks are held (another checkpoint may have
    /// reclaimed them meanwhile). Returns the sequence it holds, if taken.
    pub(crate) fn checkpoint_when(&self, only_if_needed: bool) -> Result<Option<u64>> {
        self.check_failed()?;
        let wal = self.writer()?;
        let _u = lock(&self.update);
        let _m = lock(&self.maint);
        if only_if_needed && !self.store.wants_reclaim() {
            return Ok(None);
        }
        // Everything applied is in the log up to `seq` (appends and their
        // application happen under `update`).
        let seq = wal.sync()?.saturating_sub(1);
        let state = {
            let heads = read(&self.heads);
            let postings = read(&self.postings);
            let versions: Vec<u32> = read(&self.versions)
                .iter()
                .map(|v| v.load(Ordering::Acquire))
                .collect();
            let external = read(&self.external).clone();
            let next_auto = lock(&self.ids).tracker.next_auto();
            snapshot_state(
                &heads,
                &postings,
                &versions,
                &external,
                next_auto,
                &self.store,
            )
        };
        self.store.sync()?;
        let mut m = lock(&self.manifest).clone();
        let generation = m.generation + 1;
        let bytes = state.encode();
        let name = state_name(generation);
        write_durable(&self.dir.join(&name), &bytes)?;
        m.state_file = name;
        m.state_bytes = bytes.len() as u64;
        m.state_crc32c = crc32c::crc32c(&bytes);
        m.generation = generation;
        m.wal_sequence = seq;
        m.n = lock(&self.ids).tracker.len();
        write_manifest(&self.dir, &m)?;
        *lock(&self.manifest) = m;
        // The blocks released since the previous checkpoint become free,
        // unless a reader still holds a state that may name them.
        let held = remove_other_states(&self.dir, generation)?;
        {
            let _g = write(&self.gate);
            self.store.reclaim(generation - 1, held);
        }
        wal.truncate_before(seq + 1)?;
        self.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(Some(seq))
    }
}
