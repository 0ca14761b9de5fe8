//! In-place updates of a graph index (OdinANN's insert, IP-DiskANN's
//! delete): the disk graph itself changes, so a search never merges a
//! delta and never waits for a merge.
//!
//! - **Insert**: a search for the new vector (the index's own search, list
//!   size the build's L) gives candidates; their records are read, robust
//!   prune picks the new node's out-list, and each chosen neighbour takes
//!   a back edge (pruned again, with PQ reconstructions standing in for the
//!   vectors not read, when its list is full). The new node takes the next
//!   internal id; the page file grows at its end.
//! - **Delete**: the id is a tombstone at once (searches drop it); a search
//!   towards the deleted vector finds its in-neighbours among the nearest
//!   nodes, and each drops its edge and takes a few replacements (the
//!   search's nearest and the deleted node's own nearest neighbours),
//!   pruned. The deleted record stays as a routing node: an edge the repair
//!   did not find still leads somewhere. `maintain()` compacts the
//!   tombstones away with the out-of-place merge.
//!
//! **Crash safety.** Each update is one log record ([`Patch`]) holding the
//! full images of the blocks it rewrites, made durable before any block is
//! written: replaying the log after a crash writes them again, so a torn
//! or lost page write is repaired (physical redo). A checkpoint syncs the
//! page file, writes the ids and the PQ codes as new section files, moves
//! the manifest forward and drops the log before it; the BFS node cache is
//! then loaded anew over the graph as it stands
//! (`GraphIndex::reload_cache`).
//!
//! **Concurrency.** An update computes its patch while searches run (under
//! the state's read hold, the writer lock keeping other updates out), and
//! writes its blocks and changes the in-memory tables under the state's
//! write hold: a search sees an index before or after an update, never
//! between. Only plain records (the ID layout without replicated lists or
//! codes of other nodes) are updated in place; the planner updates every
//! other layout out of place.

use super::graph::{GraphIndex, GraphOpen};
use crate::distance::{normalize, Metric};
use crate::elem::{DType, Element};
use crate::format::page::{seal_block, PageGeometry};
use crate::graph::space::PointDistance;
use crate::graph::vamana::robust_prune;
use crate::io::DurableFile;
use crate::layout::RecordReader;
use crate::planner::{self, SearchFacts, SearchOptions};
use crate::update::ids::{check_insert_rows, IdTracker};
use crate::update::wal::{Patch, PatchAction};
use crate::{with_dtype, Error, Result};
use live::LiveIds;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

mod live;
pub mod sweep;

/// Replacement edges a delete gives each in-neighbour from the search's
/// nearest nodes (IP-DiskANN's c) and from the deleted node's own list.
const REPLACEMENTS: usize = 3;

/// The id bookkeeping of an index updated in place.
pub struct InPlace {
    dim: usize,
    metric: Metric,
    dtype: DType,
    /// Live external id → internal id.
    ids: LiveIds,
    /// Tombstones: deleted nodes whose records still route searches.
    deleted: usize,
    /// Tombstones an insert may take (every one but the medoid, where
    /// searches start), the latest last: a sweep round found no live
    /// node's edge to them.
    free: Vec<u32>,
    /// Tombstones deleted since the sweep round that runs began (or all
    /// of them after an open): their slots wait for the next round.
    pending: Vec<u32>,
    /// Tombstones the running sweep round covers (empty: none runs).
    round: Vec<u32>,
    /// The next block the running round looks at.
    sweep_at: u64,
    medoid: u32,
    /// The last log sequence applied.
    pub applied: u64,
    /// Bytes the ledger counts for the update layer now (only grows: a
    /// release would let the cache regrow, reading from disk, before the
    /// next update takes the room back).
    counted: AtomicU64,
    /// Bytes held beside `counted` while a table grows by a copy (from
    /// [`InPlace::reserve`] until the update's [`InPlace::recount`]).
    moving: AtomicU64,
    /// Bytes of page images logged since the last checkpoint.
    pub logged: u64,
    /// A checkpoint follows the update that logs this many bytes of page
    /// images since the last one.
    pub log_limit: u64,
    /// The page file's writes (opened at the first update; tests put a
    /// file that fails or tears them here).
    out: Option<Arc<dyn DurableFile>>,
}

/// Page-image bytes an index updated in place logs before a checkpoint
/// drops them (a checkpoint writes the ids and the PQ codes: a few bytes a
/// node, where one insert logs up to R + 1 blocks).
pub const LOG_LIMIT: u64 = 256 << 20;

/// A node's record as an update reads it.
struct Node {
    vector: Vec<f32>,
    list: Vec<u32>,
}

/// Points of one prune: row-major f32 vectors, squared L2 (the build's
/// distance for l2 and cosine; for ip an approximation of the build's
/// augmented space).
struct Local {
    dim: usize,
    rows: Vec<f32>,
}

impl Local {
    fn row(&self, i: u32) -> &[f32] {
        &self.rows[i as usize * self.dim..(i as usize + 1) * self.dim]
    }
}

impl PointDistance for Local {
    fn n(&self) -> usize {
        self.rows.len() / self.dim.max(1)
    }
    fn dist(&self, a: u32, b: u32) -> f32 {
        l2(self.row(a), self.row(b))
    }
}

/// Robust prune of point 0's `pool` (distance, local index) by the build's
/// rule (its α, R and saturation): the local indexes kept.
fn prune(local: &Local, pool: &mut Vec<(f32, u32)>, spec: &crate::format::BuildSpec) -> Vec<u32> {
    let mut out = Vec::new();
    let max_c = pool.len();
    robust_prune(
        local,
        0,
        pool,
        spec.alpha,
        spec.r,
        max_c,
        spec.saturate,
        &mut out,
    );
    out
}

fn l2(a: &[f32], b: &[f32]) -> f32 {
    <f32 as Element>::l2_sq(a, b)
}

impl InPlace {
    /// The bookkeeping of `g` (its tombstones are the nodes whose external
    /// id is `u64::MAX`) with the log applied up to `applied`.
    pub fn new(g: &mut GraphIndex, applied: u64) -> InPlace {
        // The lookups of live ids go through the id array.
        g.ids_mut();
        let g = &*g;
        let m = g.manifest();
        let n = g.nodes();
        let mut deleted = 0;
        // Whether a tombstone's in-edges were swept is not on disk: each
        // waits for a round after the open.
        let mut pending = Vec::new();
        for i in 0..n as u32 {
            let e = g.external(i) as u64;
            if e == u64::MAX {
                deleted += 1;
                if i != m.medoid {
                    pending.push(i);
                }
            }
        }
        InPlace {
            dim: m.dim,
            metric: m.metric,
            dtype: m.dtype,
            ids: LiveIds::new(g.ids().unwrap_or(&[]), g.next_auto_id()),
            deleted,
            free: Vec::new(),
            pending,
            round: Vec::new(),
            sweep_at: 0,
            medoid: m.medoid,
            applied,
            counted: AtomicU64::new(0),
            moving: AtomicU64::new(0),
            logged: 0,
            log_limit: LOG_LIMIT,
            out: None,
        }
    }

    /// Tombstones in the page file.
    pub fn deleted(&self) -> usize {
        self.deleted
    }

    /// Live vectors.
    pub fn live(&self) -> usize {
        self.ids.len()
    }

    /// The next automatic id.
    pub fn next_auto(&self) -> u64 {
        self.ids.next_auto()
    }

    /// Every live external id, ascending.
    pub fn live_ids(&self, g: &GraphIndex) -> Result<Vec<u64>> {
        Ok(self.ids.ids(ext_of(g)?))
    }

    /// Bytes the bookkeeping holds beyond what the index held at open
    /// (the id map; the grown tables are `g.grown_bytes()`).
    pub fn memory_bytes(&self) -> u64 {
        self.ids.memory_bytes()
            + (self.free.capacity() + self.pending.capacity() + self.round.capacity()) as u64 * 4
    }

    /// Checks an insert and returns its rows as the index stores them and
    /// its ids.
    pub fn prepare_insert(
        &self,
        g: &GraphIndex,
        vectors: &[f32],
        ids: Option<&[u64]>,
    ) -> Result<(Vec<f32>, Vec<u64>)> {
        let n = check_insert_rows(vectors, self.dim)?;
        let rows = stored_rows(vectors, self.dim, self.dtype, self.metric)?;
        let ext = ext_of(g)?;
        let ids = IdTracker::empty(self.ids.next_auto())
            .resolve_insert(ids, n, |e| self.ids.get(ext, e).is_some())?;
        Ok((rows, ids))
    }

    /// The patch that inserts `row` (stored form) under `ext`: computed
    /// from the index as it stands, nothing written.
    pub fn plan_insert(&self, open: &GraphOpen, row: &[f32], ext: u64) -> Result<Patch> {
        let g = &open.g;
        let spec = &open.manifest.spec;
        let n = g.nodes();
        // A swept tombstone's slot first (its record is rewritten; no live
        // node's edge leads to it), else a new slot at the page file's end.
        let v = match self.free.last() {
            Some(&s) => s,
            None => u32::try_from(n)
                .map_err(|_| Error::arg("the index holds 2**32 nodes: no internal id is left"))?,
        };
        let mut reader = Reader::open(g)?;
        let cands = self.candidates(open, row, spec.build_l.max(spec.r))?;
        let mut nodes: BTreeMap<u32, Node> = BTreeMap::new();
        for &(_, c) in &cands {
            nodes.insert(c, reader.node(c)?);
        }
        // The new node's list: robust prune over the candidates.
        let mut local = Local {
            dim: self.dim,
            rows: row.to_vec(),
        };
        let order: Vec<u32> = cands.iter().map(|c| c.1).collect();
        let mut pool = Vec::with_capacity(order.len());
        for (i, c) in order.iter().enumerate() {
            let x = &nodes[c].vector;
            local.rows.extend_from_slice(x);
            pool.push((l2(row, x), i as u32 + 1));
        }
        let out = prune(&local, &mut pool, spec);
        let list: Vec<u32> = out.iter().map(|&i| order[i as usize - 1]).collect();
        // Back edges.
        let mut patched: BTreeMap<u32, Node> = BTreeMap::new();
        for &u in &list {
            let Some(node) = nodes.get(&u) else { continue };
            if node.list.contains(&v) {
                continue;
            }
            let mut l = node.list.clone();
            l.push(v);
            let l = if l.len() > spec.r {
                let mut known = nodes
                    .iter()
                    .map(|(k, x)| (*k, x.vector.as_slice()))
                    .collect::<HashMap<_, _>>();
                known.insert(v, row);
                self.prune_list(g, u, &node.vector, &l, &known, spec)?
            } else {
                l
            };
            patched.insert(
                u,
                Node {
                    vector: node.vector.clone(),
                    list: l,
                },
            );
        }
        patched.insert(
            v,
            Node {
                vector: row.to_vec(),
                list,
            },
        );
        let blocks = self.blocks(g, &mut reader, &patched, n.max(v as usize + 1))?;
        Ok(Patch {
            action: PatchAction::Insert,
            internal: v,
            external: ext,
            dim: self.dim as u32,
            dtype: self.dtype,
            vector: to_bytes(row, self.dtype)?,
            block_size: g.geometry().block_size as u32,
            blocks,
        })
    }

    /// The patch that deletes `ext` (`None`: not live).
    pub fn plan_delete(&self, open: &GraphOpen, ext: u64) -> Result<Option<Patch>> {
        let g = &open.g;
        let Some(v) = self.ids.get(ext_of(g)?, ext) else {
            return Ok(None);
        };
        let spec = &open.manifest.spec;
        let mut reader = Reader::open(g)?;
        let dead = reader.node(v)?;
        let cands = self.candidates(open, &dead.vector, spec.build_l.max(spec.r))?;
        let mut nodes: BTreeMap<u32, Node> = BTreeMap::new();
        for &(_, c) in &cands {
            if c != v {
                nodes.insert(c, reader.node(c)?);
            }
        }
        let live = |u: u32| u != v && g.external(u) >= 0;
        let nearest: Vec<u32> = cands
            .iter()
            .map(|c| c.1)
            .filter(|&c| live(c))
            .take(REPLACEMENTS)
            .collect();
        let heirs: Vec<u32> = dead
            .list
            .iter()
            .copied()
            .filter(|&c| live(c))
            .take(REPLACEMENTS)
            .collect();
        let mut known: HashMap<u32, &[f32]> = nodes
            .iter()
            .map(|(k, x)| (*k, x.vector.as_slice()))
            .collect();
        known.insert(v, &dead.vector);
        let mut patched: BTreeMap<u32, Node> = BTreeMap::new();
        for (&p, node) in &nodes {
            if !node.list.contains(&v) {
                continue;
            }
            let mut l: Vec<u32> = node.list.iter().copied().filter(|&u| u != v).collect();
            for &c in nearest.iter().chain(&heirs) {
                if c != p && !l.contains(&c) {
                    l.push(c);
                }
            }
            let l = if l.len() > spec.r {
                self.prune_list(g, p, &node.vector, &l, &known, spec)?
            } else {
                l
            };
            patched.insert(
                p,
                Node {
                    vector: node.vector.clone(),
                    list: l,
                },
            );
        }
        let blocks = self.blocks(g, &mut reader, &patched, g.nodes())?;
        Ok(Some(Patch {
            action: PatchAction::Delete,
            internal: v,
            external: ext,
            dim: 0,
            dtype: DType::F32,
            vector: Vec::new(),
            block_size: g.geometry().block_size as u32,
            blocks,
        }))
    }

    /// The nearest live nodes to `q` (stored form) by the index's own
    /// search with list size `l`: (exact distance, internal id).
    fn candidates(&self, open: &GraphOpen, q: &[f32], l: usize) -> Result<Vec<(f32, u32)>> {
        let g = &open.g;
        let opts = SearchOptions {
            k: l,
            l: Some(l),
            threads: Some(1),
            ..SearchOptions::default()
        };
        let facts = SearchFacts::of(
            &open.manifest,
            open.plan.cache,
            1,
            super::scratch_room(open),
        )?;
        let planned = planner::plan_search_quietly(&opts, None, &facts, 1)?;
        let r = g.search(q, 1, &planned.plan, 1, planned.scratch)?;
        Ok(r.ids
            .iter()
            .zip(&r.distances)
            .filter(|(&i, _)| i != u32::MAX && g.external(i) >= 0)
            .map(|(&i, &d)| (d, i))
            .collect())
    }

    /// Robust prune of node `u`'s list `list`: the vectors `known` has are
    /// exact, the others reconstructed from their PQ codes.
    fn prune_list(
        &self,
        g: &GraphIndex,
        u: u32,
        uvec: &[f32],
        list: &[u32],
        known: &HashMap<u32, &[f32]>,
        spec: &crate::format::BuildSpec,
    ) -> Result<Vec<u32>> {
        let pq = g.pq().ok_or_else(|| {
            Error::arg("in-place updates need the PQ codes in memory (a coded layout updates out of place)")
        })?;
        let m = pq.m();
        let mut local = Local {
            dim: self.dim,
            rows: uvec.to_vec(),
        };
        let mut rec = vec![0f32; self.dim];
        let mut pool = Vec::with_capacity(list.len());
        let mut ids = Vec::with_capacity(list.len());
        for &w in list {
            if w == u {
                continue;
            }
            match known.get(&w) {
                Some(x) => local.rows.extend_from_slice(x),
                None => {
                    let code = pq
                        .codes
                        .get(w as usize * m..(w as usize + 1) * m)
                        .ok_or_else(|| Error::Engine(format!("node {w} has no PQ code")))?;
                    pq.codebook.decode(code, &mut rec);
                    local.rows.extend_from_slice(&rec);
                }
            }
            ids.push(w);
            let i = ids.len() as u32;
            pool.push((l2(uvec, local.row(i)), i));
        }
        let out = prune(&local, &mut pool, spec);
        Ok(out.iter().map(|&i| ids[i as usize - 1]).collect())
    }

    /// Full images of the blocks holding the `patched` records, in an index
    /// of `n` nodes (a block past the page file's end starts empty).
    fn blocks(
        &self,
        g: &GraphIndex,
        reader: &mut Reader,
        patched: &BTreeMap<u32, Node>,
        n: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        let geo = g.geometry();
        let rpb = geo.records_per_block as u64;
        let mut out: Vec<(u64, Vec<u8>)> = Vec::new();
        for (&v, node) in patched {
            let (b, slot) = geo.location(v);
            if out.last().map(|x| x.0) != Some(b) {
                let img = if b < geo.n_blocks {
                    reader.block(&geo, b)?
                } else {
                    vec![0u8; geo.block_size]
                };
                out.push((b, img));
            }
            let img = &mut out
                .last_mut()
                .ok_or_else(|| Error::Engine("no block".into()))?
                .1;
            let at = crate::format::page::PAGE_HEADER_BYTES + slot * geo.record_size;
            let bytes = to_bytes(&node.vector, self.dtype)?;
            geo.write_record(&mut img[at..at + geo.record_size], &bytes, &node.list);
        }
        for (b, img) in &mut out {
            let records = (n as u64).saturating_sub(*b * rpb).min(rpb) as usize;
            seal_block(img, *b, records, geo.layout_id);
        }
        Ok(out)
    }

    /// Applies `p` to the open index: its blocks written (when `write`;
    /// a read-only replay only checks the disk holds them), its ids and
    /// codes, the cache's copies. The caller holds the state's write hold.
    pub fn apply(&mut self, open: &mut GraphOpen, p: &Patch, write: bool) -> Result<()> {
        let g = &mut open.g;
        let geo = g.geometry();
        // An insert into a tombstone's slot (not a new slot past the end).
        let reused = (p.internal as usize) < g.nodes() && g.external(p.internal) < 0;
        if p.block_size as usize != geo.block_size {
            return Err(Error::arg(format!(
                "a patch of {}-byte blocks does not fit a page file of {}-byte blocks",
                p.block_size, geo.block_size
            )));
        }
        if p.action == PatchAction::Insert {
            let n = g.nodes().max(p.internal as usize + 1);
            g.grow_to(n)?;
            open.manifest.n = n;
        }
        let geo = g.geometry();
        for (b, img) in &p.blocks {
            if *b >= geo.n_blocks {
                return Err(Error::arg(format!(
                    "a patch writes block {b}; the page file has {}",
                    geo.n_blocks
                )));
            }
            crate::format::page::verify_block(img, *b, &geo).map_err(Error::arg)?;
        }
        if write && !p.blocks.is_empty() {
            let pages = g.pages_path();
            let f = self.page_writer(&pages)?;
            for (b, img) in &p.blocks {
                f.write_all_at(img, geo.block_offset(*b))
                    .map_err(|e| Error::io(&pages, e))?;
            }
        }
        match p.action {
            PatchAction::Insert => {
                let row = crate::update::wal::decode_vectors(p.dtype, &p.vector);
                if row.len() != self.dim {
                    return Err(Error::arg(format!(
                        "a patch inserts a vector of dimension {}; the index has {}",
                        row.len(),
                        self.dim
                    )));
                }
                g.set_code(p.internal, &row);
                // A replayed insert of a live id: the old node goes.
                let old = self.ids.get(ext_of(g)?, p.external);
                if let Some(old) = old.filter(|&o| o != p.internal) {
                    self.ids.remove(ext_of(g)?, p.external);
                    g.ids_mut()[old as usize] = u64::MAX;
                    self.tombstone(old);
                }
                g.ids_mut()[p.internal as usize] = p.external;
                if reused {
                    self.deleted = self.deleted.saturating_sub(1);
                    // (A replayed log may reuse a slot this open has not
                    // swept yet: the writer had.)
                    for list in [&mut self.free, &mut self.pending, &mut self.round] {
                        if let Some(at) = list.iter().rposition(|&x| x == p.internal) {
                            list.remove(at);
                        }
                    }
                }
                if old != Some(p.internal) {
                    self.ids.insert(ext_of(g)?, p.internal);
                }
                self.ids.raise_next_auto(p.external.saturating_add(1));
            }
            PatchAction::Delete => {
                if self.ids.get(ext_of(g)?, p.external) == Some(p.internal) {
                    self.ids.remove(ext_of(g)?, p.external);
                    g.ids_mut()[p.internal as usize] = u64::MAX;
                    self.tombstone(p.internal);
                }
            }
            PatchAction::Repair => {}
        }
        let rpb = geo.records_per_block as u64;
        for (b, img) in &p.blocks {
            for slot in 0..geo.records_per_block {
                let v = b * rpb + slot as u64;
                if v >= g.nodes() as u64 {
                    break;
                }
                g.patch_cached(v as u32, geo.record(img, slot))?;
            }
        }
        Ok(())
    }

    /// The page file's writer, opened at the first use.
    fn page_writer(&mut self, pages: &std::path::Path) -> Result<Arc<dyn DurableFile>> {
        if let Some(f) = &self.out {
            return Ok(Arc::clone(f));
        }
        let f: Arc<dyn DurableFile> = Arc::new(
            std::fs::OpenOptions::new()
                .write(true)
                .open(pages)
                .map_err(|e| Error::io(pages, e))?,
        );
        self.out = Some(Arc::clone(&f));
        Ok(f)
    }

    /// Makes every page write so far durable.
    fn sync_pages(&self, pages: &std::path::Path) -> Result<()> {
        match &self.out {
            Some(f) => f.sync_data().map_err(|e| Error::io(pages, e)),
            None => crate::io::files::sync_file(pages),
        }
    }

    /// Tests: the page file's writes go through `wrap` from now on (given
    /// the file and its length, all of it durable).
    #[cfg(test)]
    pub(crate) fn inject_page_faults(
        &mut self,
        pages: &std::path::Path,
        wrap: impl FnOnce(Arc<std::fs::File>, u64) -> Arc<dyn DurableFile>,
    ) -> Result<()> {
        crate::io::files::sync_file(pages)?;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(pages)
            .map_err(|e| Error::io(pages, e))?;
        let len = f.metadata().map_err(|e| Error::io(pages, e))?.len();
        self.out = Some(wrap(Arc::new(f), len));
        Ok(())
    }

    /// Counts node `v` as a tombstone whose slot an insert may take once
    /// a sweep round has removed the edges to it.
    fn tombstone(&mut self, v: u32) {
        self.deleted += 1;
        if v != self.medoid {
            self.pending.push(v);
        }
    }

    /// Counts, before an update is logged, what the update layer will
    /// hold with `more` nodes added (and one more tombstone): refused
    /// (nothing changed) when the budget cannot hold it. The slot lists
    /// are counted at their most (each holds at most every tombstone, at
    /// up to twice its length), so applying the update never needs more.
    /// The caller holds the writer lock (one update at a time).
    ///
    /// A table that grows by a copy (the PQ table past its reserved room,
    /// the id arrays past their capacity) is resident twice for a moment:
    /// those bytes are held too, until [`InPlace::recount`] after the
    /// update gives them back.
    pub fn reserve(&self, g: &GraphIndex, more: usize) -> Result<()> {
        self.give_back_moving(g);
        let lists = 4 * 3 * 2 * (self.deleted + 1) as u64;
        let held = (self.ids.bytes_with(more) + lists).max(self.memory_bytes())
            + g.grown_bytes_at(g.nodes() + more);
        let moving = self.ids.moving_bytes_with(more) + g.moving_bytes_at(g.nodes() + more);
        let refused = |e: Error| {
            Error::arg(format!(
                "the memory budget cannot hold this update's ids and codes ({held} bytes, \
                 {moving} more while a table is copied to grow): {e}; open with a larger \
                 memory_budget"
            ))
        };
        self.hold(g, held).map_err(refused)?;
        if moving > 0 {
            g.hold_updates(moving).map_err(refused)?;
            self.moving.store(moving, Ordering::Release);
        }
        Ok(())
    }

    /// Counts what the update layer holds now in the index's budget (the
    /// cache yields what is short), and gives back what a copy held.
    pub fn recount(&self, g: &GraphIndex) -> Result<()> {
        self.give_back_moving(g);
        self.hold(g, self.memory_bytes() + g.grown_bytes())
    }

    /// Gives back the bytes [`InPlace::reserve`] held for a copy.
    fn give_back_moving(&self, g: &GraphIndex) {
        let moving = self.moving.swap(0, Ordering::AcqRel);
        if moving > 0 {
            g.release_updates(moving);
        }
    }

    /// Grows what the ledger counts to `held` bytes.
    fn hold(&self, g: &GraphIndex, held: u64) -> Result<()> {
        let counted = self.counted.load(Ordering::Acquire);
        if held > counted {
            g.hold_updates(held - counted)?;
            self.counted.store(held, Ordering::Release);
        }
        Ok(())
    }

    /// Bytes the ledger counts for the update layer.
    pub fn counted(&self) -> u64 {
        self.counted.load(Ordering::Acquire)
    }
}

/// Rows as an index of `dtype` and `metric` stores them (converted to the
/// element type and back, normalised for cosine); refuses a value the type
/// cannot hold and a zero row under cosine.
pub fn stored_rows(vectors: &[f32], dim: usize, dtype: DType, metric: Metric) -> Result<Vec<f32>> {
    let mut rows = vectors.to_vec();
    with_dtype!(dtype, T, {
        for (i, x) in rows.iter_mut().enumerate() {
            match <T as Element>::from_f32(*x) {
                Some(t) => *x = Element::to_f32(t),
                None => {
                    return Err(Error::arg(format!(
                        "row {} holds {} , which a {} index cannot store",
                        i / dim,
                        x,
                        dtype
                    )))
                }
            }
        }
    });
    if metric == Metric::Cosine {
        for (i, r) in rows.chunks_mut(dim).enumerate() {
            if r.iter().all(|&x| x == 0.0) {
                return Err(Error::arg(format!(
                    "row {i} is all zeros: it has no direction for the cosine metric"
                )));
            }
            normalize(r);
        }
    }
    Ok(rows)
}

/// A stored row's bytes in the element type.
fn to_bytes(row: &[f32], dtype: DType) -> Result<Vec<u8>> {
    with_dtype!(dtype, T, {
        let mut out = Vec::new();
        for &x in row {
            let t = <T as Element>::from_f32(x)
                .ok_or_else(|| Error::arg(format!("{x} does not fit a {dtype} index")))?;
            out.extend_from_slice(bytemuck::bytes_of(&t));
        }
        Ok(out)
    })
}

/// The external id of each internal id (an index updated in place holds
/// the array: `InPlace::new` makes it).
fn ext_of(g: &GraphIndex) -> Result<&[u64]> {
    g.ids()
        .ok_or_else(|| Error::Engine("an index updated in place has no id array".into()))
}

/// Blocking reads of records and blocks for an update.
struct Reader {
    records: RecordReader,
    blocks: crate::io::BlockReader,
    dtype: DType,
}

impl Reader {
    fn open(g: &GraphIndex) -> Result<Reader> {
        let (layout, pages) = g.layout_and_pages();
        Ok(Reader {
            records: RecordReader::open(&pages, &layout)?,
            blocks: crate::io::BlockReader::open(&pages, layout.geometry().block_size)?,
            dtype: g.manifest().dtype,
        })
    }

    fn node(&mut self, v: u32) -> Result<Node> {
        let rec = self.records.record(v)?;
        let vector = crate::update::wal::decode_vectors(self.dtype, rec.vector);
        Ok(Node {
            vector,
            list: rec.neighbours.to_vec(),
        })
    }

    fn block(&mut self, geo: &PageGeometry, b: u64) -> Result<Vec<u8>> {
        Ok(self.blocks.read(geo.block_offset(b))?[..geo.block_size].to_vec())
    }
}

/// Why a graph index of manifest `m` opened with cache `cache` cannot be
/// updated in place (`None`: it can).
pub fn refusal(
    m: &crate::format::Manifest,
    cache: crate::planner::preset::CacheKind,
) -> Option<String> {
    crate::planner::rules::in_place_refusal(m.layout.kind, cache)
}

/// Writes an in-place checkpoint of `open` into `dir`: the page file
/// synced, the ids and the PQ codes as section files named after the log
/// sequence (the old ones stay until the new manifest is in place), the
/// manifest with the node count, the sequence and the next automatic id.
/// Returns the new manifest.
pub fn checkpoint(
    dir: &std::path::Path,
    open: &GraphOpen,
    ip: &InPlace,
) -> Result<crate::format::Manifest> {
    use crate::format::Section;
    use crate::io::files::{write_manifest, write_section};
    let g = &open.g;
    let seq = ip.applied;
    ip.sync_pages(&g.pages_path())?;
    let mut m = open.manifest.clone();
    let geo = g.geometry();
    let n = g.nodes();
    m.n = n;
    m.layout.n_blocks = geo.n_blocks;
    m.wal_sequence = seq;
    m.next_auto_id = ip.next_auto();
    m.spec.update = crate::format::UpdateMode::InPlace;
    let mut old = Vec::new();
    if let Some(info) = m.sections.get_mut(&Section::Pages) {
        info.bytes = geo.file_bytes();
    }
    let ids: Vec<u64> = (0..n as u32).map(|i| g.external(i) as u64).collect();
    let info = write_section(
        dir,
        &format!("ids.{seq}.bin"),
        "external_ids_u64",
        &crate::format::section::encode_ids(&ids),
    )?;
    if let Some(o) = m.sections.insert(Section::Ids, info) {
        old.push(o.file);
    }
    if let Some(pq) = g.pq() {
        let len = n * pq.m();
        let info = write_section(
            dir,
            &format!("pq_codes.{seq}.bin"),
            "pq_codes",
            &pq.codes[..len],
        )?;
        if let Some(o) = m.sections.insert(Section::PqCodes, info) {
            old.push(o.file);
        }
    }
    write_manifest(dir, &m)?;
    for f in old {
        if !f.is_empty() && m.sections.values().all(|s| s.file != f) {
            let _ = std::fs::remove_file(dir.join(f));
        }
    }
    Ok(m)
}
