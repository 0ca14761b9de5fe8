//! The partition index (SPANN, updated in place by SPFresh's LIRE): vectors
//! in postings on disk, the postings' heads in an in-memory graph.
//!
//! * [`build`] clusters the vectors, replicates boundary vectors by the RNG
//!   rule and writes the postings; [`store`] owns the postings file and its
//!   free blocks; [`posting`] is the block format; [`heads`] the head graph;
//!   [`state`] the manifest and the checkpoint state.
//! * A search finds the nearest heads in memory, reads all their postings
//!   through the I/O engine at once, and scores the live entries exactly.
//! * [`PartitionIndex::insert`] and [`PartitionIndex::delete`] log to the
//!   write-ahead log ([`crate::update::wal`]) and return once the record is
//!   durable, then apply: an insert appends to its postings copy-on-write;
//!   a delete flips the id's byte in the version map, so search skips it at
//!   once. [`lire`] splits, merges and reassigns in a background worker.
//! * [`PartitionIndex::checkpoint`] writes the in-memory maps and advances
//!   the manifest's log sequence atomically; opening replays the log after
//!   it.

pub mod build;
pub mod heads;
pub mod lire;
pub mod posting;
pub mod state;
pub mod store;
#[cfg(test)]
mod tests;

use crate::distance::{normalize, Metric};
use crate::elem::DType;
use crate::format::{IndexKind, Preset, FORMAT_MAJOR, FORMAT_MINOR, FORMAT_NAME, MANIFEST_FILE};
use crate::graph::vamana::SearchScratch;
use crate::io::files::{sync_dir, write_durable};
use crate::io::staging::Staging;
use crate::io::{open_direct, AlignedBuf, Completion, EngineKind, IoEngine};
use crate::search::QueryStats;
use crate::update::wal::{Durability, Op, Wal};
use crate::{Error, Result};
use heads::Heads;
use lire::Jobs;
use posting::{entry_bytes, entry_head, read_entry, BLOCK, PAYLOAD};
use state::{PartitionBuildStats, PartitionManifest, PartitionParams, State};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Instant;
use store::{runs, PostingRef, Store, POSTINGS_FILE};

/// Name of the write-ahead log inside a partition index directory.
pub const WAL_FILE: &str = "wal.log";
pub use state::{DELETED, MAX_VERSION, VERSION_MASK};
/// Posting write locks (a posting's is `p % STRIPES`).
const STRIPES: usize = 1024;
/// Postings a search reads by default.
pub const DEFAULT_NPROBE: usize = 32;
/// Queries a search worker interleaves by default.
pub const QUERIES_IN_FLIGHT: usize = 4;
/// Reads one search worker keeps in flight.
const DEPTH: u32 = 64;
/// Bytes the id maps of `n` vectors hold: a version word and an external
/// id per vector, and the external → internal hash map's buckets (a
/// control byte and a 16-byte pair each; the map rounds its buckets up to
/// a power of two at 8/7 of its capacity, so at 1M ids it holds 2²¹
/// buckets, 35.7 MB, not the 1M × 8/7 a per-vector figure gives).
pub fn id_map_bytes(n: usize) -> u64 {
    let buckets = if n < 4 {
        4
    } else if n < 8 {
        8
    } else {
        (n.saturating_mul(8) / 7).next_power_of_two()
    };
    n as u64 * 12 + buckets as u64 * 17
}

/// Requests beyond a contiguous posting's (one per [`store::MAX_RUN`]
/// blocks) past which an appended posting is rewritten contiguously: none.
/// An append moves the posting's tail to a free block elsewhere, and a
/// query pays a request per run: allowing one extra run (two requests for
/// most appended postings) took the 1M shifted workload's queries from 33
/// to 55 requests and its median latency 1.34× up by epoch 100.
pub const EXTRA_RUNS: usize = 0;

/// Whether `blocks` take more reads than a contiguous posting's plus
/// [`EXTRA_RUNS`].
pub fn scattered(blocks: &[u32]) -> bool {
    runs(blocks).len() > blocks.len().div_ceil(store::MAX_RUN).max(1) + EXTRA_RUNS
}
/// Stale entries (at least as many as live ones) past which a search has
/// its posting garbage-collected.
pub const COLLECT_STALE: usize = 8;

/// A query answered by a search worker: index, results, statistics.
type Answered = (usize, Vec<(f32, i64)>, QueryStats);
/// A query's results (internal ids) and statistics.
type Found = (Vec<(f32, i64)>, QueryStats);

/// Everything a partition build needs besides the data.
#[derive(Debug, Clone)]
pub struct PartitionBuild {
    pub metric: Metric,
    pub params: PartitionParams,
    pub ids: Option<Vec<u64>>,
    pub overwrite: bool,
    pub threads: Option<usize>,
}

/// How a partition index is opened.
#[derive(Debug, Clone)]
pub struct PartitionOpen {
    /// Search threads by default; `None`: all cores.
    pub threads: Option<usize>,
    pub io: EngineKind,
    /// When `insert` and `delete` return: after `fdatasync` of their log
    /// record (`Sync`, the default) or after its write (`Buffered`: a
    /// killed process loses nothing, an OS crash may lose the latest).
    pub durability: Durability,
    /// Run splits, merges and reassignments in a background worker (the
    /// default); `false`: only when [`PartitionIndex::maintain`] is called.
    pub background: bool,
}

impl Default for PartitionOpen {
    fn default() -> Self {
        PartitionOpen {
            threads: None,
            io: EngineKind::Auto,
            durability: Durability::Sync,
            background: true,
        }
    }
}

/// A search over a partition index.
#[derive(Debug, Clone)]
pub struct PartitionSearch {
    pub k: usize,
    /// Postings read per query (default 32).
    pub nprobe: usize,
    /// List size of the head-graph search (default max(8·nprobe, 128)).
    pub l: Option<usize>,
    /// SPANN's latency cut: a posting is read only when its head lies
    /// within (1 + cut) of the nearest head's distance (l2 and cosine).
    pub probe_cut: Option<f32>,
    pub threads: Option<usize>,
    /// Queries each worker interleaves (their reads in flight together);
    /// `None`: 4.
    pub queries_in_flight: Option<usize>,
}

/// Search output of a partition index: ids (−1 pads), internal distances
/// (smaller is closer), statistics.
pub struct PartitionResults {
    pub ids: Vec<i64>,
    pub distances: Vec<f32>,
    pub stats: Vec<QueryStats>,
}

/// What [`PartitionIndex::check`] found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CheckReport {
    pub postings: usize,
    pub blocks: usize,
    pub entries: u64,
    pub live_entries: u64,
    pub stale_entries: u64,
    pub live_ids: u64,
    /// Problems found (empty: consistent).
    pub problems: Vec<String>,
}

/// Counters of the updates and of the background work.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub inserted: AtomicU64,
    pub deleted: AtomicU64,
    pub splits: AtomicU64,
    pub merges: AtomicU64,
    pub reassigned: AtomicU64,
    pub collected: AtomicU64,
    pub checkpoints: AtomicU64,
}

/// External ids, the next automatic one, and the internal ids of deleted
/// vectors: `retired` since their delete, `free` (reusable) once every
/// search that began before the delete has finished.
struct Ids {
    by_ext: HashMap<u64, u32>,
    next_auto: u64,
    retired: Vec<u32>,
    free: Vec<u32>,
}

pub(crate) struct Inner {
    dir: PathBuf,
    dim: usize,
    metric: Metric,
    params: PartitionParams,
    manifest: Mutex<PartitionManifest>,
    heads: RwLock<Heads>,
    postings: RwLock<Vec<Option<Arc<PostingRef>>>>,
    stripes: Vec<Mutex<()>>,
    versions: RwLock<Vec<AtomicU32>>,
    external: RwLock<Vec<u64>>,
    ids: Mutex<Ids>,
    store: Store,
    read_file: Arc<File>,
    direct_reads: bool,
    io: EngineKind,
    engines: Mutex<Vec<IoEngine>>,
    wal: Wal,
    /// Serialises inserts and deletes: log order is apply order.
    update: Mutex<()>,
    /// Held by each background job and by a checkpoint.
    maint: Mutex<()>,
    /// Searches hold it shared; reclaiming blocks takes it exclusively.
    gate: RwLock<()>,
    /// Held (read) by a placement from its routes to its last append; the
    /// worker takes it (write) before reusing retired head slots.
    placing: RwLock<()>,
    jobs: Mutex<Jobs>,
    jobs_cv: Condvar,
    counters: Counters,
    threads: usize,
    /// A background job failed: the message (updates refuse from then on).
    failed: Mutex<Option<String>>,
    closing: AtomicBool,
}

/// An open partition index; share it between threads.
pub struct PartitionIndex {
    inner: Arc<Inner>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
}
fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|p| p.into_inner())
}

fn threads_or_cores(t: Option<usize>) -> usize {
    t.filter(|&t| t > 0).unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

/// Checks that every value is finite.
fn check_finite(v: &[f32], what: &str, dim: usize) -> Result<()> {
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        return Err(Error::arg(format!(
            "{what} row {} holds a non-finite value ({}) at dimension {}",
            i / dim,
            v[i],
            i % dim
        )));
    }
    Ok(())
}

/// Whether `dir` holds a partition index manifest (any valid one).
pub fn is_partition_index(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join(MANIFEST_FILE))
        .ok()
        .and_then(|t| PartitionManifest::parse(&dir.join(MANIFEST_FILE), &t).ok())
        .is_some()
}

/// Reads and checks a partition index's manifest.
pub fn read_manifest(dir: &Path) -> Result<PartitionManifest> {
    let path = dir.join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    PartitionManifest::parse(&path, &text)
}

fn write_manifest(dir: &Path, m: &PartitionManifest) -> Result<()> {
    let path = dir.join(MANIFEST_FILE);
    let tmp = dir.join(".manifest.json.tmp");
    let text = m.to_text(&path)?;
    write_durable(&tmp, text.as_bytes())?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
    sync_dir(dir)
}

fn state_name(generation: u64) -> String {
    format!("state-{generation}.bin")
}

/// The generation a state file's name carries (`state-G.bin`).
fn state_generation(name: &str) -> Option<u64> {
    name.strip_prefix("state-")?
        .strip_suffix(".bin")?
        .parse()
        .ok()
}

/// Removes the state files of `dir` other than generation `keep`'s: a
/// checkpoint killed before its manifest names its state leaves that state
/// behind (a later generation), and one killed before it removed the
/// previous state leaves that (an earlier one). Only files named like
/// state files are touched.
fn remove_other_states(dir: &Path, keep: u64) -> Result<()> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    for e in rd {
        let e = e.map_err(|e| Error::io(dir, e))?;
        let name = e.file_name();
        let Some(g) = name.to_str().and_then(state_generation) else {
            continue;
        };
        if g != keep {
            let path = e.path();
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
        }
    }
    Ok(())
}

/// Builds a partition index over `data` (`n × dim` float rows) in `dir`.
pub fn build_index(
    data: &[f32],
    dim: usize,
    dir: &Path,
    opts: &PartitionBuild,
    progress: &(dyn Fn(&str, u64, u64) + Sync),
    cancel: &AtomicBool,
) -> Result<PartitionManifest> {
    if dim == 0 || !data.len().is_multiple_of(dim) {
        return Err(Error::arg(format!(
            "data holds {} values, not a whole number of {dim}-dimensional rows",
            data.len()
        )));
    }
    let n = data.len() / dim;
    if n == 0 {
        return Err(Error::arg("cannot build an index over 0 vectors"));
    }
    if n > u32::MAX as usize - 1 {
        return Err(Error::arg(format!(
            "{n} vectors: a partition index holds at most {}",
            u32::MAX - 1
        )));
    }
    check_finite(data, "data", dim)?;
    let ids: Vec<u64> = match &opts.ids {
        Some(ids) => {
            if ids.len() != n {
                return Err(Error::arg(format!(
                    "{} ids given for {n} vectors",
                    ids.len()
                )));
            }
            let mut seen = HashSet::with_capacity(n);
            if let Some(d) = ids.iter().find(|&&i| !seen.insert(i)) {
                return Err(Error::arg(format!("id {d} appears more than once")));
            }
            if let Some(b) = ids.iter().find(|&&i| i > i64::MAX as u64) {
                return Err(Error::arg(format!(
                    "id {b} does not fit a signed 64-bit integer"
                )));
            }
            ids.clone()
        }
        None => (0..n as u64).collect(),
    };
    let mut normalized;
    let data = if opts.metric == Metric::Cosine {
        normalized = data.to_vec();
        for r in normalized.chunks_exact_mut(dim) {
            normalize(r);
        }
        &normalized[..]
    } else {
        data
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads_or_cores(opts.threads))
        .build()
        .map_err(|e| Error::arg(format!("cannot start build threads: {e}")))?;
    let staging = Staging::begin(
        dir,
        opts.overwrite,
        &|d| crate::io::files::is_index(d) || is_partition_index(d),
        &[],
    )?;
    let sdir = staging.path().to_path_buf();
    let store = Store::create(&sdir.join(POSTINGS_FILE))?;
    let built = pool.install(|| {
        build::build(
            data,
            dim,
            opts.metric,
            &opts.params,
            &store,
            progress,
            cancel,
        )
    })?;
    let state = snapshot_state(
        &built.heads,
        &built
            .postings
            .iter()
            .map(|p| p.clone().map(Arc::new))
            .collect::<Vec<_>>(),
        &vec![0u32; n],
        &ids,
        ids.iter().max().map_or(0, |&m| m + 1),
        &store,
    );
    let bytes = state.encode();
    write_durable(&sdir.join(state_name(1)), &bytes)?;
    Wal::create(&sdir.join(WAL_FILE), 1, Durability::Sync)?;
    let m = PartitionManifest {
        format: FORMAT_NAME.into(),
        format_major: FORMAT_MAJOR,
        format_minor: FORMAT_MINOR,
        kind: IndexKind::Partition,
        created_by: format!("nearline {}", env!("CARGO_PKG_VERSION")),
        preset: Preset::Spfresh,
        dtype: DType::F32,
        metric: opts.metric,
        dim,
        params: opts.params.clone(),
        state_file: state_name(1),
        state_bytes: bytes.len() as u64,
        state_crc32c: crc32c::crc32c(&bytes),
        generation: 1,
        wal_sequence: 0,
        n,
        build_stats: PartitionBuildStats { ..built.stats },
        checksum: None,
    };
    write_manifest(&sdir, &m)?;
    staging.commit()?;
    Ok(m)
}

fn snapshot_state(
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

impl PartitionIndex {
    /// Opens the partition index in `dir`: loads the checkpoint, replays the
    /// log after it, starts the background worker.
    pub fn open(dir: &Path, opts: &PartitionOpen) -> Result<PartitionIndex> {
        let m = read_manifest(dir)?;
        let spath = dir.join(&m.state_file);
        let bytes = std::fs::read(&spath).map_err(|e| Error::io(&spath, e))?;
        if bytes.len() as u64 != m.state_bytes || crc32c::crc32c(&bytes) != m.state_crc32c {
            return Err(Error::corrupt(
                &spath,
                format!(
                    "state file is {} bytes with CRC {:08x}; the manifest expects {} bytes with \
                     CRC {:08x}",
                    bytes.len(),
                    crc32c::crc32c(&bytes),
                    m.state_bytes,
                    m.state_crc32c
                ),
            ));
        }
        let st = State::decode(&spath, &bytes)?;
        if st.dim != m.dim || st.versions.len() != st.external.len() {
            return Err(Error::corrupt(&spath, "state does not match the manifest"));
        }
        let ppath = dir.join(POSTINGS_FILE);
        let store = Store::open_with_io(&ppath, st.blocks_end, st.free_blocks.clone(), opts.io)?;
        for (p, r) in st.postings.iter().enumerate() {
            if let Some(r) = r {
                let need = posting::blocks_for(r.count as usize, m.dim);
                if r.blocks.len() < need || r.blocks.iter().any(|&b| b >= st.blocks_end) {
                    return Err(Error::corrupt(
                        &spath,
                        format!("posting {p} names blocks the postings file does not hold"),
                    ));
                }
            }
        }
        let heads = Heads::from_parts(
            m.dim,
            m.metric,
            st.head_alive.clone(),
            st.head_vecs.clone(),
            &st.head_lists,
            st.head_start,
            st.head_free.clone(),
        );
        let mut by_ext = HashMap::with_capacity(st.versions.len());
        for (i, (&v, &e)) in st.versions.iter().zip(&st.external).enumerate() {
            if v & DELETED == 0 && by_ext.insert(e, i as u32).is_some() {
                return Err(Error::corrupt(&spath, format!("id {e} is live twice")));
            }
        }
        let (rf, direct) = open_direct(&ppath)?;
        let wpath = dir.join(WAL_FILE);
        let mut pending_ops = Vec::new();
        let (wal, report) = Wal::open_after(&wpath, opts.durability, m.wal_sequence, &mut |r| {
            pending_ops.push(Op::decode(&r, &wpath)?);
            Ok(())
        })?;
        let _ = report;
        // The log's lock makes this the one writer: what a killed
        // checkpoint left goes.
        remove_other_states(dir, m.generation)?;
        let inner = Inner {
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
                by_ext,
                next_auto: st.next_auto_id,
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
            update: Mutex::new(()),
            maint: Mutex::new(()),
            gate: RwLock::new(()),
            placing: RwLock::new(()),
            jobs: Mutex::new(Jobs::default()),
            jobs_cv: Condvar::new(),
            counters: Counters::default(),
            threads: threads_or_cores(opts.threads),
            failed: Mutex::new(None),
            closing: AtomicBool::new(false),
            manifest: Mutex::new(m),
        };
        let inner = Arc::new(inner);
        for op in pending_ops {
            match op {
                Op::Insert {
                    ids, dim, vectors, ..
                } => {
                    if dim as usize != inner.dim {
                        return Err(Error::corrupt(
                            &wpath,
                            "a logged insert has another dimension",
                        ));
                    }
                    let v: Vec<f32> = vectors
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    inner.apply_insert(&ids, &v)?;
                }
                Op::Delete { ids } => {
                    inner.apply_delete(&ids);
                }
            }
        }
        let idx = PartitionIndex {
            inner,
            worker: Mutex::new(None),
        };
        if opts.background {
            let w = Arc::clone(&idx.inner);
            let h = std::thread::Builder::new()
                .name("nearline-lire".into())
                .spawn(move || w.worker_loop())
                .map_err(|e| Error::arg(format!("cannot start the update worker: {e}")))?;
            *lock(&idx.worker) = Some(h);
        }
        Ok(idx)
    }

    pub fn dim(&self) -> usize {
        self.inner.dim
    }
    pub fn metric(&self) -> Metric {
        self.inner.metric
    }
    pub fn params(&self) -> &PartitionParams {
        &self.inner.params
    }
    /// The manifest of the last checkpoint.
    pub fn manifest(&self) -> PartitionManifest {
        lock(&self.inner.manifest).clone()
    }
    /// Live vectors.
    pub fn len(&self) -> usize {
        lock(&self.inner.ids).by_ext.len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The live external ids, ascending.
    pub fn live_ids(&self) -> Vec<u64> {
        let mut v: Vec<u64> = lock(&self.inner.ids).by_ext.keys().copied().collect();
        v.sort_unstable();
        v
    }
    /// Whether `id` is live.
    pub fn contains(&self, id: u64) -> bool {
        lock(&self.inner.ids).by_ext.contains_key(&id)
    }

    /// Inserts `vectors` (`n × dim` row-major); `ids` gives their external
    /// ids (none may be live), else new ones are assigned above every id
    /// seen. Returns once the insert is logged durably (see
    /// [`PartitionOpen::durability`]) and visible to searches.
    pub fn insert(&self, vectors: &[f32], ids: Option<&[u64]>) -> Result<Vec<u64>> {
        self.inner.check_failed()?;
        let dim = self.inner.dim;
        if vectors.is_empty() || !vectors.len().is_multiple_of(dim) {
            return Err(Error::arg(format!(
                "vectors hold {} values: expected a positive multiple of the index's dimension {dim}",
                vectors.len()
            )));
        }
        let n = vectors.len() / dim;
        check_finite(vectors, "vectors", dim)?;
        let _u = lock(&self.inner.update);
        let ext: Vec<u64> = {
            let g = lock(&self.inner.ids);
            match ids {
                Some(ids) => {
                    if ids.len() != n {
                        return Err(Error::arg(format!(
                            "{} ids given for {n} vectors",
                            ids.len()
                        )));
                    }
                    let mut seen = HashSet::with_capacity(n);
                    for &i in ids {
                        if i > i64::MAX as u64 {
                            return Err(Error::arg(format!(
                                "id {i} does not fit a signed 64-bit integer"
                            )));
                        }
                        if !seen.insert(i) {
                            return Err(Error::arg(format!(
                                "id {i} appears more than once in this insert"
                            )));
                        }
                        if g.by_ext.contains_key(&i) {
                            return Err(Error::arg(format!(
                                "id {i} is already in the index: delete it first to replace its vector"
                            )));
                        }
                    }
                    ids.to_vec()
                }
                None => {
                    // Automatic ids continue above every id the index has
                    // seen and stay within the signed 64-bit range.
                    let top = i64::MAX as u64;
                    if g.next_auto.saturating_add(n as u64) > top + 1 {
                        return Err(Error::arg(format!(
                            "no automatic ids are left for {n} vectors: they follow the largest \
                             id the index has seen ({}), and ids end at {top}; pass ids explicitly",
                            g.next_auto.saturating_sub(1)
                        )));
                    }
                    (g.next_auto..g.next_auto + n as u64).collect()
                }
            }
        };
        let mut v = vectors.to_vec();
        if self.inner.metric == Metric::Cosine {
            for r in v.chunks_exact_mut(dim) {
                normalize(r);
            }
        }
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.inner.wal.append_op_durable(&Op::Insert {
            ids: ext.clone(),
            dim: dim as u32,
            dtype: DType::F32,
            vectors: bytes,
        })?;
        self.inner.apply_insert(&ext, &v)?;
        Ok(ext)
    }

    /// Deletes `ids`; unknown ids are ignored. Returns how many were live.
    /// Once it returns, no search returns them.
    pub fn delete(&self, ids: &[u64]) -> Result<usize> {
        self.inner.check_failed()?;
        let _u = lock(&self.inner.update);
        let live: Vec<u64> = {
            let g = lock(&self.inner.ids);
            let mut seen = HashSet::new();
            ids.iter()
                .copied()
                .filter(|i| g.by_ext.contains_key(i) && seen.insert(*i))
                .collect()
        };
        if live.is_empty() {
            return Ok(0);
        }
        self.inner
            .wal
            .append_op_durable(&Op::Delete { ids: live.clone() })?;
        Ok(self.inner.apply_delete(&live))
    }

    /// Writes a checkpoint: the maps to a new state file, the manifest
    /// naming it with the log sequence it holds, then trims the log.
    /// Returns that sequence.
    pub fn checkpoint(&self) -> Result<u64> {
        self.inner.checkpoint()
    }

    /// Runs the queued splits, merges and reassignments now (and waits for
    /// the background worker to finish what it holds).
    pub fn maintain(&self) -> Result<()> {
        self.inner.run_all_jobs()?;
        self.inner.check_failed()
    }

    /// k-NN search of `nq` row-major queries.
    pub fn search(
        &self,
        queries: &[f32],
        nq: usize,
        opts: &PartitionSearch,
    ) -> Result<PartitionResults> {
        self.inner.search(queries, nq, opts)
    }

    /// Verifies the index: every posting's blocks decode, entries name
    /// known ids, every live id has a current entry in some posting, the
    /// free blocks are unused.
    pub fn check(&self) -> Result<CheckReport> {
        self.inner.check()
    }

    /// Resident bytes now: heads, posting map, id maps, I/O buffers.
    pub fn memory_bytes(&self) -> u64 {
        self.inner.memory_bytes()
    }

    /// A JSON description.
    pub fn info(&self) -> serde_json::Value {
        self.inner.info()
    }
}

impl Drop for PartitionIndex {
    fn drop(&mut self) {
        self.inner.closing.store(true, Ordering::SeqCst);
        {
            let mut j = lock(&self.inner.jobs);
            j.stop = true;
        }
        self.inner.jobs_cv.notify_all();
        if let Some(h) = lock(&self.worker).take() {
            let _ = h.join();
        }
    }
}

impl Inner {
    fn check_failed(&self) -> Result<()> {
        match &*lock(&self.failed) {
            Some(m) => Err(Error::arg(format!(
                "a background update failed ({m}); reopen the index to recover from its log"
            ))),
            None => Ok(()),
        }
    }

    /// The version word of internal id `i`.
    #[inline]
    fn version_of(v: &[AtomicU32], i: u32) -> Option<u32> {
        v.get(i as usize).map(|b| b.load(Ordering::Acquire))
    }

    /// Postings for `x` by the RNG rule.
    fn targets(
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
        build::rng_select(
            heads,
            x,
            &cand,
            None,
            self.params.replicas,
            self.params.rng_factor,
        )
    }

    /// Applies a logged insert (also on replay): assigns internal ids, then
    /// appends every vector to its postings.
    fn apply_insert(&self, ext: &[u64], v: &[f32]) -> Result<()> {
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
                ids.by_ext.insert(e, i);
                ids.next_auto = ids.next_auto.max(e + 1);
                items.push((i, ver, j));
            }
            // Churn leaves deletion marks in the hash map that make it
            // double although it holds no more ids: rebuild it at its size.
            let live = ids.by_ext.len();
            if ids.by_ext.capacity() > 2 * live + 1024 {
                ids.by_ext.shrink_to(live + live / 8);
            }
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
    fn place(&self, items: &[(u32, u32, usize)], rows: &[f32], exclude: Option<u32>) -> Result<()> {
        use rayon::prelude::*;
        let dim = self.dim;
        let mut todo: Vec<(u32, u32, usize)> = items.to_vec();
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
                        self.targets(&heads, sc, &rows[r * dim..(r + 1) * dim], exclude)
                    })
                    .collect()
            };
            if let Some(t) = routes.iter().position(|r| r.is_empty()) {
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
            let mut retry: Vec<(u32, u32, usize)> = Vec::new();
            let mut keys: Vec<u32> = groups.keys().copied().collect();
            keys.sort_unstable();
            for p in keys {
                let ts = &groups[&p];
                let mut stream = Vec::with_capacity(ts.len() * entry_bytes(dim));
                for &t in ts {
                    let (id, ver, r) = todo[t];
                    posting::push_entry(&mut stream, id, ver, &rows[r * dim..(r + 1) * dim]);
                }
                if !self.append(p, &stream, ts.len() as u32)? {
                    retry.extend(ts.iter().map(|&t| todo[t]));
                }
            }
            drop(placing);
            retry.sort_unstable();
            retry.dedup();
            todo = retry;
        }
        Ok(())
    }

    /// Appends `n` encoded entries to posting `p` copy-on-write. `false`
    /// when `p` no longer exists (split or merged away).
    fn append(&self, p: u32, stream_new: &[u8], n: u32) -> Result<bool> {
        let _g = lock(&self.stripes[p as usize % STRIPES]);
        let cur = match read(&self.postings).get(p as usize).cloned().flatten() {
            Some(c) => c,
            None => return Ok(false),
        };
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

    /// Applies a logged delete (also on replay). Returns how many were live.
    fn apply_delete(&self, ext: &[u64]) -> usize {
        let mut ids = lock(&self.ids);
        let versions = read(&self.versions);
        let mut n = 0;
        for e in ext {
            if let Some(i) = ids.by_ext.remove(e) {
                versions[i as usize].fetch_or(DELETED, Ordering::AcqRel);
                ids.retired.push(i);
                n += 1;
            }
        }
        self.counters.deleted.fetch_add(n as u64, Ordering::Relaxed);
        n
    }

    fn engine(&self) -> Result<IoEngine> {
        if let Some(e) = lock(&self.engines).pop() {
            return Ok(e);
        }
        IoEngine::open(self.io, Arc::clone(&self.read_file), DEPTH)
    }

    fn search(
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
        check_finite(queries, "queries", dim)?;
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
    fn search_group(
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
        {
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
        }
        let _gate = read(&self.gate);
        let refs: Vec<Vec<(u32, Arc<PostingRef>)>> = {
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
    fn score(
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

    fn memory_bytes(&self) -> u64 {
        let heads = read(&self.heads).memory_bytes() as u64;
        let map: u64 = {
            let m = read(&self.postings);
            m.capacity() as u64 * 8
                + m.iter()
                    .flatten()
                    .map(|r| 48 + r.blocks.capacity() as u64 * 4)
                    .sum::<u64>()
        };
        // Version words and external ids per internal slot; the hash map's
        // slots (a control byte and a 16-byte pair per bucket, buckets at
        // 8/7 of its capacity); the lists of reusable ids.
        let slots =
            read(&self.versions).capacity() as u64 * 4 + read(&self.external).capacity() as u64 * 8;
        let ids = {
            let g = lock(&self.ids);
            g.by_ext.capacity() as u64 * 17 * 8 / 7
                + (g.free.capacity() + g.retired.capacity()) as u64 * 4
        };
        let ids = slots + ids;
        let io = self.threads as u64 * IoEngine::bytes_for_depth(DEPTH as usize);
        heads + map + ids + io
    }

    fn info(&self) -> serde_json::Value {
        let m = lock(&self.manifest).clone();
        let (end, free, pending) = self.store.counts();
        let heads = read(&self.heads);
        let live_postings = read(&self.postings).iter().flatten().count();
        let mem = self.memory_bytes();
        let c = &self.counters;
        let disk = std::fs::metadata(self.dir.join(POSTINGS_FILE))
            .map(|x| x.len())
            .unwrap_or(0);
        serde_json::json!({
            "path": self.dir.display().to_string(),
            "format_version": format!("{}.{}", m.format_major, m.format_minor),
            "created_by": m.created_by,
            "kind": "partition",
            "preset": m.preset.name(),
            "n": lock(&self.ids).by_ext.len(),
            "dim": self.dim,
            "dtype": "float32",
            "metric": self.metric.name(),
            "params": m.params,
            "postings": live_postings,
            "heads": {"live": heads.live(), "slots": heads.slots(), "tombstones": heads.tombstones()},
            "blocks": {"file": end, "free": free, "pending": pending, "block_size": BLOCK},
            "disk_bytes": disk,
            "memory": {
                "budget": m.params.memory_budget,
                "budget_auto": m.params.memory_budget_auto,
                "resident": mem,
                "heads": heads.memory_bytes(),
                "within_budget": m.params.memory_budget_auto || mem <= m.params.memory_budget,
            },
            "io_engine": IoEngine::open(self.io, Arc::clone(&self.read_file), 1).map(|e| e.name()).unwrap_or("unavailable"),
            "direct_io": self.direct_reads,
            "wal_sequence": m.wal_sequence,
            "generation": m.generation,
            "updates": {
                "inserted": c.inserted.load(Ordering::Relaxed),
                "deleted": c.deleted.load(Ordering::Relaxed),
                "splits": c.splits.load(Ordering::Relaxed),
                "merges": c.merges.load(Ordering::Relaxed),
                "reassigned": c.reassigned.load(Ordering::Relaxed),
                "collected": c.collected.load(Ordering::Relaxed),
                "checkpoints": c.checkpoints.load(Ordering::Relaxed),
                "queued_jobs": lock(&self.jobs).queue.len(),
            },
            "build": m.build_stats,
            "simd": crate::kernels::simd_level(),
        })
    }

    fn checkpoint(&self) -> Result<u64> {
        self.checkpoint_when(false).map(|s| s.unwrap_or(0))
    }

    /// A checkpoint; with `only_if_needed`, only when released blocks still
    /// wait for one once the locks are held (another checkpoint may have
    /// reclaimed them meanwhile). Returns the sequence it holds, if taken.
    pub(crate) fn checkpoint_when(&self, only_if_needed: bool) -> Result<Option<u64>> {
        self.check_failed()?;
        let _u = lock(&self.update);
        let _m = lock(&self.maint);
        if only_if_needed && !self.store.wants_reclaim() {
            return Ok(None);
        }
        // Everything applied is in the log up to `seq` (appends and their
        // application happen under `update`).
        let seq = self.wal.sync()?.saturating_sub(1);
        let state = {
            let heads = read(&self.heads);
            let postings = read(&self.postings);
            let versions: Vec<u32> = read(&self.versions)
                .iter()
                .map(|v| v.load(Ordering::Acquire))
                .collect();
            let external = read(&self.external).clone();
            let next_auto = lock(&self.ids).next_auto;
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
        let old = m.state_file.clone();
        m.state_file = name;
        m.state_bytes = bytes.len() as u64;
        m.state_crc32c = crc32c::crc32c(&bytes);
        m.generation = generation;
        m.wal_sequence = seq;
        m.n = lock(&self.ids).by_ext.len();
        write_manifest(&self.dir, &m)?;
        *lock(&self.manifest) = m;
        let _ = std::fs::remove_file(self.dir.join(old));
        {
            let _g = write(&self.gate);
            self.store.reclaim();
        }
        self.wal.truncate_before(seq + 1)?;
        self.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(Some(seq))
    }

    fn check(&self) -> Result<CheckReport> {
        let _u = lock(&self.update);
        let _m = lock(&self.maint);
        let mut rep = CheckReport::default();
        let dim = self.dim;
        let postings: Vec<(u32, Arc<PostingRef>)> = read(&self.postings)
            .iter()
            .enumerate()
            .filter_map(|(p, r)| r.clone().map(|r| (p as u32, r)))
            .collect();
        let versions: Vec<u32> = read(&self.versions)
            .iter()
            .map(|v| v.load(Ordering::Acquire))
            .collect();
        let heads = read(&self.heads);
        let (end, _, _) = self.store.counts();
        let (_, free_list) = self.store.snapshot();
        let mut used = vec![false; end as usize];
        let mut found = vec![false; versions.len()];
        let mut current: HashMap<u32, u32> = HashMap::new();
        let external_all = read(&self.external).clone();
        let external_of = |i: u32| external_all.get(i as usize).copied().unwrap_or(u64::MAX);
        for &b in &free_list {
            if let Some(u) = used.get_mut(b as usize) {
                *u = true;
            }
        }
        for (p, r) in &postings {
            rep.postings += 1;
            if !heads.is_alive(*p) {
                rep.problems.push(format!("posting {p} has no live head"));
            }
            for &b in &r.blocks {
                rep.blocks += 1;
                match used.get_mut(b as usize) {
                    Some(u) if !*u => *u = true,
                    Some(_) => rep
                        .problems
                        .push(format!("block {b} is used twice (or also free)")),
                    None => rep
                        .problems
                        .push(format!("block {b} lies past the file's {end} blocks")),
                }
            }
            let s = match self.store.read(*p, r) {
                Ok(s) => s,
                Err(e) => {
                    rep.problems.push(e.to_string());
                    continue;
                }
            };
            if s.len() < r.count as usize * entry_bytes(dim) {
                rep.problems.push(format!(
                    "posting {p} holds fewer bytes than its {} entries",
                    r.count
                ));
                continue;
            }
            let e = entry_bytes(dim);
            for i in 0..r.count as usize {
                let h = entry_head(&s, dim, i);
                rep.entries += 1;
                match versions.get(h.id as usize) {
                    None => rep
                        .problems
                        .push(format!("posting {p} names unknown internal id {}", h.id)),
                    Some(&c) if c & DELETED == 0 && c == h.version => {
                        rep.live_entries += 1;
                        found[h.id as usize] = true;
                        // Every current entry of an id is a copy of one
                        // vector: a second vector at the current version is
                        // a stale entry the version no longer tells apart.
                        let vector = crc32c::crc32c(&s[i * e + posting::ENTRY_HEAD..(i + 1) * e]);
                        if *current.entry(h.id).or_insert(vector) != vector {
                            rep.problems.push(format!(
                                "live id {} has entries of two different vectors at its current \
                                 version {c} (posting {p}): a stale entry reads as current",
                                external_of(h.id)
                            ));
                        }
                    }
                    Some(&c) if c & DELETED == 0 && h.version > c => {
                        rep.problems.push(format!(
                            "posting {p} holds version {} of live id {}, which is at version {c}",
                            h.version,
                            external_of(h.id)
                        ));
                    }
                    Some(_) => rep.stale_entries += 1,
                }
            }
        }
        for s in 0..heads.slots() as u32 {
            if heads.is_alive(s) && postings.iter().all(|(p, _)| *p != s) {
                rep.problems.push(format!("head {s} has no posting"));
            }
        }
        let ids = lock(&self.ids);
        let external = read(&self.external);
        for (i, &v) in versions.iter().enumerate() {
            if v & DELETED == 0 {
                rep.live_ids += 1;
                if !found[i] {
                    rep.problems
                        .push(format!("live id {} is in no posting", external[i]));
                }
                if ids.by_ext.get(&external[i]) != Some(&(i as u32)) {
                    rep.problems.push(format!(
                        "live id {} is missing from the id map",
                        external[i]
                    ));
                }
            }
        }
        if ids.by_ext.len() as u64 != rep.live_ids {
            rep.problems.push(format!(
                "the id map holds {} ids, the version map {} live ones",
                ids.by_ext.len(),
                rep.live_ids
            ));
        }
        rep.problems.truncate(100);
        Ok(rep)
    }
}
