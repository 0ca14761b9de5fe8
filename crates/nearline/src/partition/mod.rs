//! The partition index (SPANN, updated in place by SPFresh's LIRE): vectors
//! in postings on disk, the postings' heads in an in-memory graph.
//!
//! * [`build`] clusters the vectors, replicates boundary vectors by the RNG
//!   rule and writes the postings; [`store`] owns the postings file and its
//!   free blocks; [`posting`] is the block format; [`crate::graph::dynamic`] the head graph;
//!   [`state`] the manifest and the checkpoint state.
//! * A search (`search.rs`) finds the nearest heads in memory, reads all
//!   their postings through the I/O engine at once, and scores the live
//!   entries exactly.
//! * [`PartitionIndex::insert`] and [`PartitionIndex::delete`]
//!   (`update.rs`) log to the write-ahead log ([`crate::update::wal`]) and
//!   return once the record is durable, then apply: an insert appends to
//!   its postings copy-on-write; a delete sets the deleted flag of the id's
//!   version word, so search skips it at once. [`lire`] splits, merges and
//!   reassigns in a background worker.
//! * [`PartitionIndex::checkpoint`] (`recovery.rs`) writes the in-memory
//!   maps and advances the manifest's log sequence atomically; opening
//!   replays the log after it. [`PartitionIndex::check`] (`check.rs`)
//!   verifies the index against its maps.

pub mod build;
pub mod calibrate;
mod check;
pub mod lire;
mod loaded;
pub mod posting;
mod reader;
#[cfg(test)]
mod reader_tests;
mod recovery;
mod search;
#[cfg(test)]
mod spann_tests;
pub mod state;
pub mod store;
#[cfg(test)]
mod stress_tests;
#[cfg(test)]
mod tests;
mod update;

use crate::distance::{check_rows, normalize, Metric};
use crate::elem::DType;
use crate::format::{IndexKind, Preset, FORMAT_MAJOR, FORMAT_MINOR, FORMAT_NAME, MANIFEST_FILE};
use crate::graph::dynamic::DynamicGraph as Heads;
use crate::io::files::write_durable;
use crate::io::staging::Staging;
use crate::io::{EngineKind, IoEngine};
use crate::search::QueryStats;
use crate::update::ids::IdTracker;
use crate::update::wal::{Durability, Wal};
use crate::{Error, Result};
use lire::Jobs;
use posting::BLOCK;
use recovery::{snapshot_state, state_name, write_manifest};
use state::{PartitionBuildStats, PartitionManifest, PartitionParams};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
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

/// Bytes of the I/O buffers `threads` search workers hold (each keeps
/// [`DEPTH`] reads in flight).
pub fn io_bytes(threads: usize) -> u64 {
    threads as u64 * IoEngine::bytes_for_depth(DEPTH as usize)
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
    /// Open for reading only (see `reader.rs`): no write permission needed,
    /// beside one writer in another process, whose acknowledged updates
    /// every search sees; inserts, deletes and checkpoints are refused.
    pub read_only: bool,
    /// The memory budget the open index must keep (bytes); `None`: the
    /// one it was built with. An index that holds more refuses to open.
    pub memory_budget: Option<u64>,
}

impl Default for PartitionOpen {
    fn default() -> Self {
        PartitionOpen {
            threads: None,
            io: EngineKind::Auto,
            durability: Durability::Sync,
            background: true,
            read_only: false,
            memory_budget: None,
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
    /// Postings per live id (its current entries).
    pub replicas: state::Histogram,
    /// Live ids the posting of their nearest head (as the head search of
    /// an insert or a query finds it) does not hold: a query that probes
    /// that head alone misses them (SPFresh's nearest-partition
    /// assignment; 0 after a build and after LIRE's splits and merges,
    /// see `lire`).
    pub outside_nearest: u64,
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
    tracker: IdTracker,
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
    /// The log this writer appends to (`None`: opened read-only).
    wal: Option<Wal>,
    /// What a read-only open follows of the writer (`None`: the writer).
    reader: Option<reader::Reader>,
    /// The budget given at open, if any (else the build's).
    budget: Option<u64>,
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
    /// The loaded index. A read-only open swaps in a newly loaded one when
    /// the writer has taken a checkpoint since (`reader.rs`).
    inner: RwLock<Arc<Inner>>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
    dir: PathBuf,
    opts: PartitionOpen,
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
    check_rows(data, "data", dim)?;
    // The same rules as an insert's ids (as many as the rows, unique,
    // within the signed 64-bit range); without ids, rows are numbered.
    let ids: Vec<u64> = IdTracker::empty(0).resolve_insert(opts.ids.as_deref(), n, |_| false)?;
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
    let mut m = m;
    if let Some(target) = m.params.recall_target {
        let heads = built.heads.live();
        let cal = pool.install(|| {
            calibrate::calibrate(
                &sdir,
                data,
                &ids,
                dim,
                opts.metric,
                target,
                heads,
                &built.head_rows,
                opts.params.seed,
                opts.threads,
            )
        })?;
        if let Some(cal) = cal {
            m.params.nprobe = Some(cal.nprobe);
            m.build_stats.calibration = Some(cal);
            write_manifest(&sdir, &m)?;
        }
    }
    staging.commit()?;
    Ok(m)
}

impl PartitionIndex {
    /// The loaded index (a writer's; a reader's brought up to date first).
    fn now(&self) -> Result<Arc<Inner>> {
        self.current()
    }

    /// The loaded index as it is (no catching up): for what cannot fail.
    fn loaded(&self) -> Arc<Inner> {
        Arc::clone(&read(&self.inner))
    }

    pub fn dim(&self) -> usize {
        self.loaded().dim
    }
    pub fn metric(&self) -> Metric {
        self.loaded().metric
    }
    pub fn params(&self) -> PartitionParams {
        self.loaded().params.clone()
    }
    /// Whether it was opened read-only.
    pub fn read_only(&self) -> bool {
        self.opts.read_only
    }
    /// The manifest of the last checkpoint (loaded).
    pub fn manifest(&self) -> PartitionManifest {
        lock(&self.loaded().manifest).clone()
    }
    /// Live vectors (a reader: as of its last look at the writer's log).
    pub fn len(&self) -> usize {
        self.now().unwrap_or_else(|_| self.loaded()).live_count()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The live external ids, ascending.
    pub fn live_ids(&self) -> Vec<u64> {
        let inner = self.now().unwrap_or_else(|_| self.loaded());
        let mut v: Vec<u64> = lock(&inner.ids).tracker.iter().map(|(e, _)| e).collect();
        if let Some(r) = &inner.reader {
            v.extend(r.delta_ids());
        }
        v.sort_unstable();
        v
    }
    /// Whether `id` is live.
    pub fn contains(&self, id: u64) -> bool {
        let inner = self.now().unwrap_or_else(|_| self.loaded());
        lock(&inner.ids).tracker.contains(id)
            || inner.reader.as_ref().is_some_and(|r| r.delta_has(id))
    }

    /// Writes a checkpoint: the maps to a new state file, the manifest
    /// naming it with the log sequence it holds, then trims the log.
    /// Returns that sequence.
    pub fn checkpoint(&self) -> Result<u64> {
        self.loaded().checkpoint()
    }

    /// Runs the queued splits, merges and reassignments now (and waits for
    /// the background worker to finish what it holds).
    pub fn maintain(&self) -> Result<()> {
        let inner = self.loaded();
        inner.writer()?;
        inner.run_all_jobs()?;
        inner.check_failed()
    }

    /// k-NN search of `nq` row-major queries.
    pub fn search(
        &self,
        queries: &[f32],
        nq: usize,
        opts: &PartitionSearch,
    ) -> Result<PartitionResults> {
        self.now()?.search(queries, nq, opts)
    }

    /// Verifies the index: every posting's blocks decode, entries name
    /// known ids, every live id has a current entry in some posting, the
    /// free blocks are unused.
    pub fn check(&self) -> Result<CheckReport> {
        self.now()?.check()
    }

    /// Resident bytes now: heads, posting map, id maps, I/O buffers (and a
    /// reader's vectors from the log).
    pub fn memory_bytes(&self) -> u64 {
        self.loaded().memory_bytes()
    }

    /// A JSON description.
    pub fn info(&self) -> serde_json::Value {
        self.now().unwrap_or_else(|_| self.loaded()).info()
    }

    /// A reader: catches up with the writer now (its log, or its newest
    /// checkpoint). Every search, `check`, `info`, `len` and `live_ids`
    /// does this first; a writer has nothing to do.
    pub fn refresh(&self) -> Result<()> {
        self.now().map(|_| ())
    }
}

impl Drop for PartitionIndex {
    fn drop(&mut self) {
        let inner = self.loaded();
        inner.closing.store(true, Ordering::SeqCst);
        {
            let mut j = lock(&inner.jobs);
            j.stop = true;
        }
        inner.jobs_cv.notify_all();
        if let Some(h) = lock(&self.worker).take() {
            let _ = h.join();
        }
    }
}

/// The options a partition build took, under `build`'s names.
fn build_options(m: &PartitionManifest) -> serde_json::Value {
    let mut v = serde_json::to_value(&m.params).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("preset".into(), m.preset.name().into());
        o.insert("metric".into(), m.metric.name().into());
        o.insert("lire".into(), m.params.lire.into());
    }
    v
}

impl PartitionIndex {
    /// Tests: the writer's log writes through `wrap` from now on.
    #[cfg(test)]
    pub(crate) fn inject_log_faults(
        &self,
        wrap: impl FnOnce(Arc<std::fs::File>, u64) -> Arc<dyn crate::io::DurableFile>,
    ) -> Result<()> {
        self.current()?.writer()?.inject(wrap)
    }
}

impl Inner {
    /// The writer's log; a read-only open refuses what needs it.
    fn writer(&self) -> Result<&Wal> {
        self.wal.as_ref().ok_or_else(|| {
            Error::arg(format!(
                "{} is open read-only: inserts, deletes, checkpoints and maintenance need a \
                 writable open (one process at a time)",
                self.dir.display()
            ))
        })
    }

    /// Live vectors: the id map's, and a reader's from the log.
    fn live_count(&self) -> usize {
        lock(&self.ids).tracker.len() + self.reader.as_ref().map_or(0, |r| r.delta_live())
    }

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
            g.tracker.memory_bytes() + (g.free.capacity() + g.retired.capacity()) as u64 * 4
        };
        let ids = slots + ids;
        let io = io_bytes(self.threads);
        let delta = self.reader.as_ref().map_or(0, |r| r.delta_bytes());
        heads + map + ids + io + delta
    }

    /// The budget the open index keeps: the one given at open, else the
    /// build's (`None`: sized by nearline at build, nothing to keep).
    fn budget(&self, m: &PartitionManifest) -> Option<u64> {
        self.budget
            .or((!m.params.memory_budget_auto).then_some(m.params.memory_budget))
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
            "n": self.live_count(),
            "read_only": self.reader.is_some(),
            "dim": self.dim,
            "dtype": "float32",
            "metric": self.metric.name(),
            "params": m.params,
            "postings": live_postings,
            "heads": {"live": heads.live(), "slots": heads.slots(), "tombstones": heads.tombstones()},
            "blocks": {"file": end, "free": free, "pending": pending, "block_size": BLOCK},
            "disk_bytes": disk,
            "memory": {
                "budget": self.budget(&m).unwrap_or(m.params.memory_budget),
                "budget_auto": self.budget(&m).is_none(),
                "resident": mem,
                "heads": heads.memory_bytes(),
                "log_vectors": self.reader.as_ref().map_or(0, |r| r.delta_bytes()),
                "within_budget": self.budget(&m).is_none_or(|b| mem <= b),
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
            // As a graph index's: the options the build took, then its
            // statistics (timings, replication).
            "build": build_options(&m),
            "build_stats": m.build_stats,
            "simd": crate::kernels::simd_level(),
        })
    }

    fn checkpoint(&self) -> Result<u64> {
        self.checkpoint_when(false).map(|s| s.unwrap_or(0))
    }
}
