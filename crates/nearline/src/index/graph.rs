//! The static graph index kind (the DiskANN family): a Vamana graph in a
//! page file, PQ codes in RAM, a cache and entry structures, searched by
//! the executor. The element type is dispatched below this level.

use super::budget::{Claim, Holdings, Ledger, LedgerView};
use crate::cache::{AdjacencyCache, AnyCache, CacheSource, NodeCache, SharedCache};
use crate::elem::Element;
use crate::format::{Manifest, PageGeometry, Placement, RecordFormat, Section};
use crate::graph::nav::NavGraph;
use crate::io::files::{read_section, read_section_growable, section_path};
use crate::io::{open_direct, EngineKind};
use crate::layout::{AnyLayout, IdLayout, ShuffledLayout};
use crate::planner::preset::CacheKind;
use crate::planner::{MemoryPlan, OpenPlan};
use crate::search::entry::load_sampled_entries;
use crate::search::{
    AnyScorer, BatchResult, CodedScorer, EntryPlan, EntryPoints, EntrySet, IndexData,
    PqRecordScorer, PqScorer, Scratch, SearchPlan, WorkerPool,
};
use crate::{with_dtype, Error, Result};
use serde::Serialize;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The search side of one element type.
struct Engine<T: Element> {
    data: IndexData<T>,
    workers: WorkerPool<T>,
}

enum AnyEngine {
    F32(Engine<f32>),
    F16(Engine<half::f16>),
    U8(Engine<u8>),
    I8(Engine<i8>),
}

macro_rules! with_engine {
    ($e:expr, $x:ident, $body:expr) => {
        match $e {
            AnyEngine::F32($x) => $body,
            AnyEngine::F16($x) => $body,
            AnyEngine::U8($x) => $body,
            AnyEngine::I8($x) => $body,
        }
    };
}

trait Wrap {
    fn wrap(self) -> AnyEngine;
}
impl Wrap for Engine<f32> {
    fn wrap(self) -> AnyEngine {
        AnyEngine::F32(self)
    }
}
impl Wrap for Engine<half::f16> {
    fn wrap(self) -> AnyEngine {
        AnyEngine::F16(self)
    }
}
impl Wrap for Engine<u8> {
    fn wrap(self) -> AnyEngine {
        AnyEngine::U8(self)
    }
}
impl Wrap for Engine<i8> {
    fn wrap(self) -> AnyEngine {
        AnyEngine::I8(self)
    }
}

/// What an open graph index holds resident, measured, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MemoryAccount {
    pub pq_codes: u64,
    pub pq_codebook: u64,
    pub ids: u64,
    pub layout_map: u64,
    /// The entry structure in use.
    pub entry: u64,
    /// A coded layout's transform.
    pub quantizer: u64,
    /// What the cache holds now (less than at open while a search
    /// borrows from it).
    pub cache: u64,
    pub cache_nodes: u64,
    /// What the search workers hold now: idle ones (buffers, query slots,
    /// rings) and the scratch of the searches running.
    pub worker_scratch: u64,
    /// What the update layer holds now (the delta graph, the delete set,
    /// the id index; 0 before the first update).
    pub updates: u64,
}

impl MemoryAccount {
    /// Everything but the cache and the workers' scratch.
    pub fn fixed(&self) -> u64 {
        self.pq_codes
            + self.pq_codebook
            + self.ids
            + self.layout_map
            + self.entry
            + self.quantizer
            + self.updates
    }

    /// Everything but the workers' scratch.
    pub fn static_total(&self) -> u64 {
        self.fixed() + self.cache
    }
}

/// An open graph index: its manifest, open plan and structures.
pub struct GraphOpen {
    pub manifest: Manifest,
    pub plan: OpenPlan,
    pub g: GraphIndex,
}

impl std::ops::Deref for GraphOpen {
    type Target = GraphIndex;
    fn deref(&self) -> &GraphIndex {
        &self.g
    }
}

/// An open static graph index.
pub struct GraphIndex {
    ids: Option<Vec<u64>>,
    engine: AnyEngine,
    /// What it holds besides the workers, measured at open.
    account: MemoryAccount,
    direct_io: bool,
    /// The budget at run time: fixed structures, cache, workers.
    ledger: Ledger,
    /// Where the cache reads back what it lends: the directory, manifest.
    dir: PathBuf,
    manifest: Manifest,
    /// The I/O engine a worker opens (found at open with a worker that is
    /// not kept: idle workers are the ledger's to count).
    engine_name: &'static str,
    /// A merge is swapping a new index into this one's directory: the cache
    /// never reads the directory again (its files are the new index's).
    retired: AtomicBool,
}

/// The workers and cache of one element type, as the ledger moves them.
struct Held<'a, T: Element> {
    e: &'a Engine<T>,
    src: CacheSource<'a>,
    /// Entries the cache held at open.
    loaded: usize,
    /// The directory holds another index now: no regrowth from it.
    retired: bool,
}

/// The idle workers a batch takes: up to `n`, each holding at most
/// `max_each` bytes (what the batch's plan counts a worker at).
struct Claimer<'a, T: Element> {
    pool: &'a WorkerPool<T>,
    n: usize,
    max_each: u64,
    taken: Vec<Scratch<T>>,
}

impl<T: Element> Claim for Claimer<'_, T> {
    fn available(&self) -> u64 {
        self.pool.claimable(self.n, self.max_each)
    }

    fn take(&mut self) -> u64 {
        self.taken = self.pool.claim(self.n, self.max_each);
        self.taken.iter().map(WorkerPool::held_by).sum()
    }
}

impl<T: Element> Held<'_, T> {
    /// Whether the page file's path names another file than the one this
    /// index reads (another process's merge swapped a new index in).
    fn replaced(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let ours = self.e.data.file.metadata().map(|m| (m.dev(), m.ino()));
        let now = std::fs::metadata(&self.e.data.pages_path).map(|m| (m.dev(), m.ino()));
        match (ours, now) {
            (Ok(a), Ok(b)) => a != b,
            _ => true,
        }
    }
}

impl<T: Element> Holdings for Held<'_, T> {
    fn idle_bytes(&self) -> u64 {
        self.e.workers.memory_bytes() as u64
    }

    fn trim_idle(&self, bytes: u64) {
        self.e.workers.trim(bytes);
    }

    fn evict_cache(&self, max_bytes: u64) -> Result<u64> {
        Ok(self.e.data.cache.write()?.evict_to(max_bytes))
    }

    fn regrow_cache(&self, max_bytes: u64) -> Result<u64> {
        let mut c = self.e.data.cache.write()?;
        if self.retired || self.replaced() {
            return Ok(c.memory_bytes() as u64);
        }
        c.regrow(max_bytes, self.loaded, &self.src)
    }

    fn reload_cache(&self, max_bytes: u64) -> Result<u64> {
        let mut c = self.e.data.cache.write()?;
        if self.retired || self.replaced() {
            return Ok(c.memory_bytes() as u64);
        }
        c.reload(max_bytes, self.loaded, &self.src, self.e.data.n)
    }

    fn reload_scratch(&self, max_bytes: u64) -> u64 {
        match self.e.data.cache.read() {
            Ok(c) => c.reload_scratch(max_bytes, &self.e.data.geo),
            Err(_) => 0,
        }
    }
}

impl GraphIndex {
    /// Opens the graph index in `dir` (manifest `m`) as `plan` says.
    /// `logged`: the index has an update log, whose in-place inserts may
    /// have grown the page file past the manifest's blocks.
    pub fn open(
        dir: &Path,
        m: &Manifest,
        plan: &OpenPlan,
        io: EngineKind,
        logged: bool,
    ) -> Result<GraphIndex> {
        // What the workers free must leave the process, or the budget
        // binds only on paper.
        crate::util::keep_large_frees_returned();
        let manifest_path = dir.join(crate::format::MANIFEST_FILE);
        let geo = crate::planner::geometry(m)
            .map_err(|e| Error::corrupt(&manifest_path, e.to_string()))?;
        let pages = m.section(&manifest_path, Section::Pages)?;
        let pages_path = dir.join(&pages.file);
        let meta = std::fs::metadata(&pages_path).map_err(|e| Error::io(&pages_path, e))?;
        // In-place inserts grow the file past its last checkpoint; the log
        // holds those blocks (a writer's open cuts them off and replays).
        let grown = meta.len() > geo.file_bytes() && logged;
        if (meta.len() != geo.file_bytes() && !grown) || pages.bytes != geo.file_bytes() {
            return Err(Error::corrupt(
                &pages_path,
                format!(
                    "page file has {} bytes, expected {} ({} blocks of {} bytes): truncated or replaced",
                    meta.len(),
                    geo.file_bytes(),
                    geo.n_blocks + geo.vector_blocks,
                    geo.block_size
                ),
            ));
        }
        // Routing distances: PQ codes in RAM, or (a coded layout) the codes
        // in the records with the transform that queries go through.
        let scorer = match m.layout.kind.records() {
            RecordFormat::Coded => AnyScorer::Coded(load_coded(dir, m)?),
            RecordFormat::PqCoded => AnyScorer::PqRecord(load_pq_record(dir, m)?),
            RecordFormat::Plain | RecordFormat::Replicated | RecordFormat::Decoupled => {
                AnyScorer::Pq(load_pq(dir, m)?)
            }
        };
        let ids = if m.has(Section::Ids) {
            let path = section_path(dir, m, Section::Ids);
            Some(crate::format::section::decode_ids(
                &path,
                &read_section(dir, m, Section::Ids)?,
                m.n,
            )?)
        } else {
            None
        };
        let layout = match m.layout.kind.placement() {
            // Whatever the records carry (packed lists, codes), the
            // geometry says how big they are; placement is all that decides
            // where they are.
            Placement::Id => AnyLayout::Id(IdLayout::new(geo, m.n)),
            p @ (Placement::Shuffled | Placement::PageGraph) => {
                let b = read_section(dir, m, Section::IdToLocation)?;
                let path = section_path(dir, m, Section::IdToLocation);
                AnyLayout::Shuffled(ShuffledLayout::from_section(&path, &b, geo, m.n, p)?)
            }
        };
        let (pq_codes, pq_codebook, quantizer) = match &scorer {
            AnyScorer::Pq(p) => (p.codes.memory_bytes(), p.codebook.memory_bytes(), 0),
            AnyScorer::Coded(c) => (0, 0, c.memory_bytes()),
            AnyScorer::PqRecord(p) => (0, p.memory_bytes(), 0),
        };
        let mut account = MemoryAccount {
            pq_codes: pq_codes as u64,
            pq_codebook: pq_codebook as u64,
            quantizer: quantizer as u64,
            ids: ids.as_ref().map(|v| v.capacity() as u64 * 8).unwrap_or(0),
            layout_map: layout.memory_bytes() as u64,
            ..Default::default()
        };
        let (engine, direct_io) = with_dtype!(m.dtype, T, {
            let entries = load_entries::<T>(dir, m, plan.entry, &pages_path, &layout)?;
            account.entry = entries.memory_bytes() as u64;
            let cache = match plan.cache {
                CacheKind::Bfs => AnyCache::Bfs(NodeCache::load_bfs(
                    &pages_path,
                    &layout,
                    m.n,
                    m.medoid,
                    plan.memory.cache_nodes as usize,
                )?),
                CacheKind::InDegree => AnyCache::Bfs(NodeCache::load_in_degree(
                    dir,
                    m,
                    &pages_path,
                    &layout,
                    plan.memory.cache_nodes as usize,
                )?),
                CacheKind::Adjacency => AnyCache::Adjacency(AdjacencyCache::load(
                    dir,
                    m,
                    &layout,
                    &pages_path,
                    plan.memory.cache,
                    plan.cache_limit,
                )?),
            };
            account.cache = cache.memory_bytes() as u64;
            account.cache_nodes = cache.len() as u64;
            let (file, direct_io) = open_direct(&pages_path)?;
            let data = IndexData::<T> {
                geo: *layout.geometry(),
                layout,
                scorer,
                cache: SharedCache::new(cache),
                metric: m.metric,
                dim: m.dim,
                n: m.n,
                medoid: m.medoid,
                pages_path: pages_path.clone(),
                file: Arc::new(file),
                io_kind: io,
                entries,
                _elem: PhantomData,
            };
            (
                Engine {
                    data,
                    workers: WorkerPool::default(),
                }
                .wrap(),
                direct_io,
            )
        });
        // Scratch of the load (BFS frontier, section buffers) is freed: give
        // it back so the resident set is what the index holds.
        let engine_name = with_engine!(&engine, e, {
            Scratch::new(&e.data).map_or("unavailable", |s| s.engine_name())
        });
        crate::util::return_freed_memory();
        let ledger = Ledger::new(
            plan.memory.budget,
            !plan.budget_auto,
            account.fixed(),
            account.cache,
            crate::cache::RESIZE_SCRATCH,
        )
        .keeping(plan.memory.worker_scratch);
        Ok(GraphIndex {
            ids,
            engine,
            account,
            direct_io,
            ledger,
            dir: dir.to_path_buf(),
            manifest: m.clone(),
            engine_name,
            retired: AtomicBool::new(false),
        })
    }

    /// Runs a planned batch on `threads` workers whose scratch the plan
    /// counted as `scratch` bytes, within the memory budget (the cache
    /// lends what is short while it runs); ids are internal.
    pub fn search(
        &self,
        queries: &[f32],
        nq: usize,
        plan: &SearchPlan,
        threads: usize,
        scratch: u64,
    ) -> Result<BatchResult> {
        with_engine!(
            &self.engine,
            e,
            self.search_on(e, queries, nq, plan, threads, scratch)
        )
    }

    fn search_on<T: Element>(
        &self,
        e: &Engine<T>,
        queries: &[f32],
        nq: usize,
        plan: &SearchPlan,
        threads: usize,
        scratch: u64,
    ) -> Result<BatchResult> {
        let workers = threads.clamp(1, nq.max(1));
        let held = self.held(e);
        let mut claim = Claimer {
            pool: &e.workers,
            n: workers,
            max_each: scratch / workers as u64,
            taken: Vec::new(),
        };
        self.ledger.admit(scratch, &held, &mut claim)?;
        let (r, back) = e
            .workers
            .run_batch(&e.data, claim.taken, queries, nq, plan, threads);
        let mut back = Some(back);
        self.ledger.release(scratch, &held, &mut || {
            if let Some(b) = back.take() {
                e.workers.put_back(b);
            }
        });
        r
    }

    fn held<'a, T: Element>(&'a self, e: &'a Engine<T>) -> Held<'a, T> {
        Held {
            e,
            src: CacheSource {
                dir: &self.dir,
                manifest: &self.manifest,
                pages: &e.data.pages_path,
                layout: &e.data.layout,
            },
            loaded: self.account.cache_nodes as usize,
            retired: self.retired.load(Ordering::Acquire),
        }
    }

    /// Counts `bytes` more held by the index's update layer within the
    /// budget (the cache yields what is short).
    pub fn hold_updates(&self, bytes: u64) -> Result<()> {
        with_engine!(
            &self.engine,
            e,
            self.ledger.grow_fixed(bytes, &self.held(e))
        )
    }

    /// Loads the node cache anew over the graph as it is now, within what
    /// it holds (an in-place checkpoint: the BFS cache loaded at open
    /// drifts from the start's neighbourhood as nodes near it are deleted
    /// and their slots reused). Searches wait for the cache while it loads.
    pub fn reload_cache(&self) {
        with_engine!(&self.engine, e, self.ledger.reload_cache(&self.held(e)))
    }

    /// Gives back `bytes` the update layer held.
    pub fn release_updates(&self, bytes: u64) {
        with_engine!(
            &self.engine,
            e,
            self.ledger.shrink_fixed(bytes, &self.held(e))
        )
    }

    /// The record placement and the page file's path.
    pub fn layout_and_pages(&self) -> (AnyLayout, PathBuf) {
        with_engine!(
            &self.engine,
            e,
            (e.data.layout.clone(), e.data.pages_path.clone())
        )
    }

    /// The manifest's next automatic id (0: none recorded).
    pub fn next_auto_id(&self) -> u64 {
        self.manifest.next_auto_id
    }

    /// Vectors in the page file.
    pub fn manifest_n(&self) -> usize {
        self.manifest.n
    }

    /// Marks the index as being replaced in its directory (a merge's
    /// swap): its cache never reads the directory again, whose files become
    /// the new index's. `false` undoes it (a swap that failed).
    pub fn retire(&self, retired: bool) {
        self.retired.store(retired, Ordering::Release);
    }

    /// Empties the cache of a retired index (before the merged index loads
    /// its own, so the two are never held together).
    pub fn release_cache(&self) {
        with_engine!(&self.engine, e, {
            if let Ok(mut c) = e.data.cache.write() {
                c.evict_to(0);
            }
        })
    }

    /// The manifest the index was opened from (its node count follows
    /// in-place inserts).
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The page file's path.
    pub fn pages_path(&self) -> PathBuf {
        with_engine!(&self.engine, e, e.data.pages_path.clone())
    }

    /// Nodes the page file holds now (grows with in-place inserts).
    pub fn nodes(&self) -> usize {
        with_engine!(&self.engine, e, e.data.n)
    }

    /// The page file's geometry now.
    pub fn geometry(&self) -> PageGeometry {
        with_engine!(&self.engine, e, e.data.geo)
    }

    /// The PQ codebook and codes in RAM (`None` for a layout whose codes
    /// live in the records).
    pub fn pq(&self) -> Option<&PqScorer> {
        with_engine!(
            &self.engine,
            e,
            match &e.data.scorer {
                AnyScorer::Pq(p) => Some(p),
                _ => None,
            }
        )
    }

    /// In-place updates: the external ids, materialised (identity) at
    /// the first update of an index built without them.
    pub fn ids_mut(&mut self) -> &mut Vec<u64> {
        let n = self.nodes();
        self.ids.get_or_insert_with(|| (0..n as u64).collect())
    }

    /// In-place updates: grows the index to `n` nodes (the page file's
    /// block count, the ID layout, the PQ table to the end of its huge
    /// page, the ids by a sixteenth: growth is amortised). The caller
    /// writes the new blocks.
    pub fn grow_to(&mut self, n: usize) -> Result<()> {
        let old = self.nodes();
        if n <= old {
            return Ok(());
        }
        with_engine!(&mut self.engine, e, {
            let d = &mut e.data;
            let AnyLayout::Id(l) = &mut d.layout else {
                return Err(Error::arg(
                    "in-place updates need the ID layout (a shuffled layout updates out of place)",
                ));
            };
            let rpb = d.geo.records_per_block as u64;
            d.geo.n_blocks = (n as u64).div_ceil(rpb);
            *l = IdLayout::new(d.geo, n);
            if let AnyScorer::Pq(p) = &mut d.scorer {
                let m = p.m();
                if p.codes.len() < n * m {
                    let want = grown_rows(n, m) * m;
                    // In place within the room reserved at open; past it
                    // (the table more than doubled), into a new mapping,
                    // both resident for the copy (`moving_bytes_at` has
                    // the reservation count that).
                    if !p.codes.grow(want) {
                        let mut grown = crate::util::huge::HugeBytes::growable(
                            want,
                            pq_growth_room(want / m, m),
                        )
                        .map_err(|e| Error::Engine(format!("cannot grow the PQ table: {e}")))?;
                        grown[..p.codes.len()].copy_from_slice(&p.codes);
                        p.codes = grown;
                    }
                }
            }
            d.n = n;
        });
        if let Some(ids) = &mut self.ids {
            if ids.capacity() < n {
                // By a sixteenth, not by doubling: the budget counts it.
                ids.reserve_exact(grown_ids(n) - ids.len());
            }
            ids.resize(n, u64::MAX);
        }
        self.manifest.n = n;
        Ok(())
    }

    /// In-place updates: the PQ code of node `v` from its vector as stored
    /// (f32; a layout without PQ codes in RAM keeps nothing).
    pub fn set_code(&mut self, v: u32, vector: &[f32]) {
        with_engine!(&mut self.engine, e, {
            if let AnyScorer::Pq(p) = &mut e.data.scorer {
                let m = p.m();
                let at = v as usize * m;
                if let Some(code) = p.codes.get_mut(at..at + m) {
                    p.codebook.encode(vector, code);
                }
            }
        })
    }

    /// In-place updates: bytes the in-memory tables grew past what the
    /// index held at open (the PQ table's spare rows, the ids).
    pub fn grown_bytes(&self) -> u64 {
        self.grown_bytes_at(self.nodes())
    }

    /// What [`GraphIndex::grown_bytes`] would be with `n` nodes.
    pub fn grown_bytes_at(&self, n: usize) -> u64 {
        let codes = self.pq().map_or(0, |p| {
            let m = p.m();
            if p.codes.len() >= n * m {
                p.codes.memory_bytes() as u64
            } else {
                (grown_rows(n, m) * m).div_ceil(HUGE_PAGE) as u64 * HUGE_PAGE as u64
            }
        });
        let ids = match &self.ids {
            Some(v) if v.capacity() >= n => v.capacity() as u64 * 8,
            _ => grown_ids(n) as u64 * 8,
        };
        (codes + ids).saturating_sub(self.account.pq_codes + self.account.ids)
    }

    /// In-place updates: bytes that growing to `n` nodes holds twice for a
    /// moment: a table that cannot grow where it is (the PQ table past the
    /// room reserved at open, the id array past its capacity) is copied to
    /// a larger one, and the old copy is freed after.
    pub fn moving_bytes_at(&self, n: usize) -> u64 {
        let codes = self.pq().map_or(0, |p| {
            let m = p.m();
            let want = grown_rows(n, m) * m;
            if p.codes.len() < n * m && p.codes.capacity() < want {
                p.codes.memory_bytes() as u64
            } else {
                0
            }
        });
        let ids = match &self.ids {
            Some(v) if v.capacity() < n => v.capacity() as u64 * 8,
            _ => 0,
        };
        codes + ids
    }

    /// In-place updates: the cache's copy of node `v`'s record, if it
    /// holds one, becomes `record`.
    pub fn patch_cached(&self, v: u32, record: &[u8]) -> Result<()> {
        with_engine!(&self.engine, e, {
            let mut c = e.data.cache.write()?;
            c.patch(v, record);
            Ok(())
        })
    }

    /// The external ids, when they are not the internal ones.
    pub fn ids(&self) -> Option<&[u64]> {
        self.ids.as_deref()
    }

    /// The directory the index was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The external id of internal id `i`.
    #[inline]
    pub fn external(&self, i: u32) -> i64 {
        match &self.ids {
            Some(ext) => ext[i as usize] as i64,
            None => i as i64,
        }
    }

    /// What the index holds besides the cache and its workers' scratch.
    pub fn fixed_total(&self) -> u64 {
        self.account.fixed()
    }

    /// What the cache held at open (it holds less while a search borrows).
    pub fn cache_planned(&self) -> u64 {
        self.account.cache
    }

    /// The memory ledger now.
    pub fn ledger(&self) -> LedgerView {
        self.ledger.view()
    }

    /// What the index holds now (the cache and the workers' scratch
    /// measured), with the ledger at the same moment.
    pub fn account_and_ledger(&self) -> (MemoryAccount, LedgerView) {
        let nodes =
            with_engine!(&self.engine, e, e.data.cache.read().map(|c| c.len())).unwrap_or(0) as u64;
        let (l, idle) = with_engine!(&self.engine, e, {
            self.ledger.snapshot(&|| e.workers.memory_bytes() as u64)
        });
        let held = MemoryAccount {
            cache: l.cache,
            cache_nodes: nodes,
            worker_scratch: idle + l.running,
            updates: l.fixed.saturating_sub(self.account.fixed()),
            ..self.account.clone()
        };
        (held, l)
    }

    /// What the index holds now (the cache and the workers' scratch
    /// measured).
    pub fn account(&self) -> MemoryAccount {
        self.account_and_ledger().0
    }

    /// Whether the page file is read with O_DIRECT.
    pub fn direct_io(&self) -> bool {
        self.direct_io
    }

    /// Name of the I/O engine a worker uses.
    pub fn engine_name(&self) -> &'static str {
        self.engine_name
    }

    /// The entry points in use, as `info()` shows them.
    pub fn entry_info(&self) -> serde_json::Value {
        with_engine!(
            &self.engine,
            x,
            match &x.data.entries {
                EntryPoints::Nav { nav, l, seeds, .. } => serde_json::json!({
                    "kind": "nav", "nav_nodes": nav.len(), "nav_R": nav.r(), "nav_L": l, "nav_seeds": seeds,
                }),
                EntryPoints::Centroids { set, .. } =>
                    serde_json::json!({"kind": "centroids", "centroid_nodes": set.len()}),
                EntryPoints::Sampled { set, .. } =>
                    serde_json::json!({"kind": "sampled", "sampled_nodes": set.len()}),
                EntryPoints::Medoid(_) => serde_json::json!({"kind": "medoid"}),
            }
        )
    }

    /// The cache in use (a read guard: hold it only briefly, a resize
    /// waits for it).
    pub fn cache(&self) -> Result<std::sync::RwLockReadGuard<'_, AnyCache>> {
        with_engine!(&self.engine, e, e.data.cache.read())
    }

    /// The cache in use, as `info()` shows it.
    pub fn cache_info(&self) -> serde_json::Value {
        let Ok(c) = self.cache() else {
            return serde_json::json!({"error": "cache lock poisoned"});
        };
        let loaded = self.account.cache_nodes;
        match &*c {
            AnyCache::Adjacency(a) => {
                let held = a.contents();
                serde_json::json!({
                    "policy": c.name(),
                    "nodes": held.lists,
                    "lists": held.lists,
                    "vectors": held.vectors,
                    "edges": held.edges,
                    "bytes": held.bytes,
                    "nodes_planned": loaded,
                })
            }
            AnyCache::Bfs(_) => serde_json::json!({
                "policy": c.name(),
                "nodes": c.len(),
                "lists": c.len(),
                "vectors": c.len(),
                "bytes": c.memory_bytes(),
                "nodes_planned": loaded,
            }),
        }
    }

    /// The search data of a float32 index (tests drive workers directly).
    pub fn data_f32(&self) -> Option<&IndexData<f32>> {
        match &self.engine {
            AnyEngine::F32(e) => Some(&e.data),
            _ => None,
        }
    }
}

/// Loads the entry structure `plan` names.
fn load_entries<T: Element>(
    dir: &Path,
    m: &Manifest,
    plan: EntryPlan,
    pages_path: &Path,
    layout: &AnyLayout,
) -> Result<EntryPoints<T>> {
    Ok(match plan {
        EntryPlan::Medoid => EntryPoints::Medoid(m.medoid),
        EntryPlan::Sampled { count } => {
            let (ids, vecs) =
                load_sampled_entries::<T>(pages_path, layout, m.n, count, m.spec.seed)?;
            EntryPoints::Sampled {
                medoid: m.medoid,
                set: EntrySet {
                    dim: m.dim,
                    ids,
                    vecs,
                },
            }
        }
        EntryPlan::Nav { l, seeds } => {
            let b = read_section(dir, m, Section::NavGraph)?;
            let path = section_path(dir, m, Section::NavGraph);
            let nav: NavGraph<T> = crate::format::nav::decode(&path, &b, m.dim, m.n)?;
            EntryPoints::Nav {
                medoid: m.medoid,
                nav,
                l,
                seeds,
            }
        }
        EntryPlan::Centroids => {
            let b = read_section(dir, m, Section::EntryCentroids)?;
            let path = section_path(dir, m, Section::EntryCentroids);
            let (ids, vecs) = crate::format::entries::decode_centroids::<T>(&path, &b, m.dim, m.n)?;
            EntryPoints::Centroids {
                medoid: m.medoid,
                set: EntrySet {
                    dim: m.dim,
                    ids,
                    vecs,
                },
            }
        }
    })
}

/// The planned split next to what is held, as `info()["memory"]` shows it:
/// the cache now and as planned (a search that needs more scratch than the
/// budget leaves free borrows from it while it runs), the workers' scratch
/// now (idle workers and searches running), reserved at open, and the most
/// a search may take (the cache emptied).
pub fn memory_json(
    plan: &MemoryPlan,
    held: &MemoryAccount,
    ledger: &LedgerView,
    auto: bool,
) -> serde_json::Value {
    let total = held.static_total() + held.worker_scratch;
    let peak = ledger.peak.max(total);
    serde_json::json!({
        "budget": plan.budget,
        "budget_auto": auto,
        "minimum": plan.minimum,
        "pq_codes": held.pq_codes,
        "pq_codebook": held.pq_codebook,
        "ids": held.ids,
        "layout_map": held.layout_map,
        "entry": held.entry,
        "updates": held.updates,
        "cache": held.cache,
        "cache_planned": ledger.cache_planned,
        "cache_nodes": held.cache_nodes,
        "cache_borrowed": ledger.cache_planned.saturating_sub(held.cache),
        "cache_borrows": ledger.borrows,
        "cache_borrowed_peak": ledger.borrowed_peak,
        "cache_regrow_error": ledger.regrow_error,
        "worker_scratch": held.worker_scratch,
        "worker_scratch_running": ledger.running,
        "worker_scratch_reserved": plan.worker_scratch,
        "worker_scratch_max": plan.budget.saturating_sub(held.fixed()),
        "total": total,
        "peak_total": peak,
        "within_budget": peak <= plan.budget || auto,
        "plan": plan,
    })
}

/// The geometry of the page file (for tools).
pub fn page_geometry(m: &Manifest) -> Result<PageGeometry> {
    crate::planner::geometry(m)
}

/// The PQ scorer of an index: its codebook and codes, checked against the
/// manifest.
pub(crate) fn load_pq(dir: &Path, m: &Manifest) -> Result<PqScorer> {
    let codebook = load_codebook(dir, m)?;
    // An index updated in place grows its table as nodes join: address
    // space for the growth is reserved now, so growing never copies it.
    let room = (m.spec.update == crate::format::UpdateMode::InPlace)
        .then(|| pq_growth_room(m.n, m.spec.pq_bytes));
    let codes = read_section_growable(dir, m, Section::PqCodes, room)?;
    if Some(codes.len()) != m.n.checked_mul(codebook.m()) {
        return Err(Error::corrupt(
            section_path(dir, m, Section::PqCodes),
            format!(
                "{} bytes of codes, expected n × m = {} × {}",
                codes.len(),
                m.n,
                codebook.m()
            ),
        ));
    }
    Ok(PqScorer {
        codebook,
        codes,
        metric: m.metric,
    })
}

/// The PQ codebook, checked against the manifest's dimension and PQ bytes.
fn load_codebook(dir: &Path, m: &Manifest) -> Result<crate::quant::pq::PqCodebook> {
    let cb_path = section_path(dir, m, Section::PqCodebook);
    let codebook =
        crate::format::pq::decode(&cb_path, &read_section(dir, m, Section::PqCodebook)?)?;
    if codebook.dim() != m.dim || codebook.m() != m.spec.pq_bytes {
        return Err(Error::corrupt(
            &cb_path,
            format!(
                "codebook is {}-d with {} chunks; the manifest says {}-d with {} PQ bytes",
                codebook.dim(),
                codebook.m(),
                m.dim,
                m.spec.pq_bytes
            ),
        ));
    }
    Ok(codebook)
}

/// The in-record scorer of a PQ-coded layout (AiSAQ): the codebook alone
/// (the codes are in the records; the `pq_codes` section serves merges).
fn load_pq_record(dir: &Path, m: &Manifest) -> Result<PqRecordScorer> {
    Ok(PqRecordScorer {
        codebook: load_codebook(dir, m)?,
        metric: m.metric,
        max_degree: m.layout.max_degree,
    })
}

/// The in-record scorer of a coded layout: its PCA and RaBitQ rotation,
/// checked against the manifest.
fn load_coded(dir: &Path, m: &Manifest) -> Result<CodedScorer> {
    let pca_path = section_path(dir, m, Section::Pca);
    let pca = crate::format::quant::decode_pca(&pca_path, &read_section(dir, m, Section::Pca)?)?;
    let p = crate::planner::code_dims(m);
    if pca.dim() != m.dim || pca.principal() != p {
        return Err(Error::corrupt(
            &pca_path,
            format!(
                "PCA is {}-d with {} principal dimensions; the manifest says {}-d with {p}",
                pca.dim(),
                pca.principal(),
                m.dim
            ),
        ));
    }
    let rq_path = section_path(dir, m, Section::Rabitq);
    let rabitq =
        crate::format::quant::decode_rabitq(&rq_path, &read_section(dir, m, Section::Rabitq)?)?;
    let bits = m.layout.codes.map_or(1, |c| c.bits);
    CodedScorer::new(&pca, rabitq, m.layout.max_degree, bits)
        .map_err(|e| Error::corrupt(&rq_path, e.to_string()))
}

/// The huge-page granularity of a PQ table's mapping.
const HUGE_PAGE: usize = 1 << 21;

/// Rows of `m`-byte codes a PQ table grown for `n` nodes holds: 64 more,
/// then every row its 2 MiB-rounded mapping has room for. The table at
/// open has spare room in its last huge page, so the first growth costs no
/// memory, and each later one adds a huge page (about 10,000 rows of
/// 200-byte codes): the budget takes the room from the cache 2 MiB at a
/// time, not by a fraction of the index.
fn grown_rows(n: usize, m: usize) -> usize {
    let m = m.max(1);
    ((n + 64) * m).div_ceil(HUGE_PAGE) * HUGE_PAGE / m
}

/// Address space a PQ table of `n` rows of `m` bytes reserves for growing
/// in place: as much again, at least 64 MiB (address space only: it costs
/// no memory until rows are written).
fn pq_growth_room(n: usize, m: usize) -> usize {
    n.saturating_mul(m).max(64 << 20)
}

/// Ids an id array grown for `n` nodes has room for.
fn grown_ids(n: usize) -> usize {
    n + n / 16 + 64
}
