//! DiskANN's static cache of whole records (and AlayaLaser's in-degree
//! cache, the same records loaded in another order).
//!
//! Records are held in the order the policy took them (breadth-first from
//! the medoid, or by decreasing in-degree): that order is the cache's value
//! ranking. When a search borrows memory the cache gives up records from
//! the end of that order (the least valuable first), handing their pages
//! back to the kernel at once, and reads them back afterwards; the id map
//! stays, so a record given up is only a miss. A cache that must give up
//! everything drops its map too and reloads as at open.

use super::{CacheSource, CachedNode, Neighbours, CACHE_ENTRY_OVERHEAD};
use crate::format::page::{PageGeometry, RecordView};
use crate::format::{Manifest, Section};
use crate::io::files::{read_section, section_path};
use crate::layout::{AnyLayout, RecordReader};
use crate::util::{BigVec, IdMap};
use crate::Result;
use std::collections::VecDeque;
use std::path::Path;

/// Whole records of selected nodes, held in memory.
pub struct NodeCache {
    /// Which nodes it took: `"bfs"` or `"in_degree"`.
    pub(super) policy: &'static str,
    geo: Option<PageGeometry>,
    /// Node → position in the policy's order. Positions at or past `live`
    /// were given up.
    slots: IdMap<u32>,
    /// Records of positions `0..live`, as u32 words so every record is
    /// 4-byte aligned.
    words: BigVec<u32>,
    record_words: usize,
    live: usize,
}

impl NodeCache {
    /// An empty cache.
    pub fn empty() -> Self {
        NodeCache {
            policy: "bfs",
            geo: None,
            slots: IdMap::default(),
            words: BigVec::new(),
            record_words: 0,
            live: 0,
        }
    }

    /// How many nodes of this geometry fit in `bytes`, as
    /// [`NodeCache::memory_bytes`] counts them (the id map's table grows in
    /// powers of two, so a flat per-node overhead can overshoot).
    pub fn capacity_for(geo: &PageGeometry, bytes: u64) -> usize {
        let mut c = (bytes / (geo.record_size + CACHE_ENTRY_OVERHEAD) as u64) as usize;
        while c > 0 && Self::bytes_for(geo, c) > bytes {
            // At most a few steps: the table's share is under 3 × 9 B a node.
            c -= 1 + c / 64;
        }
        c
    }

    /// Bytes [`NodeCache::memory_bytes`] reports for `nodes` cached nodes
    /// (saturating: [`NodeCache::capacity_for`] asks about as many nodes
    /// as a budget of up to `u64::MAX` bytes could name).
    pub fn bytes_for(geo: &PageGeometry, nodes: usize) -> u64 {
        if nodes == 0 {
            return 0;
        }
        let nodes = nodes as u64;
        // hashbrown: buckets = next power of two of 8/7 × capacity (at
        // least 4); usable capacity = 7/8 of the buckets (buckets − 1 below 8).
        let buckets = if nodes < 4 {
            4
        } else if nodes < 8 {
            8
        } else {
            (nodes.saturating_mul(8) / 7)
                .checked_next_power_of_two()
                .unwrap_or(u64::MAX)
        };
        let table = if buckets < 8 {
            buckets - 1
        } else {
            buckets / 8 * 7
        };
        nodes
            .saturating_mul((geo.record_size / 4 * 4) as u64)
            .saturating_add(table.saturating_mul(4 + 4 + 1))
            .saturating_add(64)
    }

    /// The most nodes, at most `cap`, a cache loaded afresh holds in
    /// `bytes` (exactly: [`NodeCache::capacity_for`] may stop short).
    fn most_within(geo: &PageGeometry, bytes: u64, cap: usize) -> usize {
        let (mut good, mut bad) = (0usize, cap + 1);
        while bad - good > 1 {
            let mid = good + (bad - good) / 2;
            if Self::bytes_for(geo, mid) <= bytes {
                good = mid;
            } else {
                bad = mid;
            }
        }
        good
    }

    /// Loads the records of up to `max_nodes` nodes in BFS order from
    /// `start`, reading the page file at `path` (blocks are CRC-checked).
    pub fn load_bfs(
        path: &Path,
        layout: &AnyLayout,
        n: usize,
        start: u32,
        max_nodes: usize,
    ) -> Result<Self> {
        let max_nodes = max_nodes.min(n);
        let mut cache = NodeCache::sized(layout.geometry(), max_nodes, "bfs");
        if max_nodes == 0 {
            return Ok(cache);
        }
        let mut reader = RecordReader::open(path, layout)?;
        let mut queue = VecDeque::from([start]);
        let mut seen = IdMap::<()>::default();
        seen.insert(start, ());
        while let Some(v) = queue.pop_front() {
            if cache.slots.len() >= max_nodes {
                break;
            }
            let rec: RecordView<'_> = reader.record(v)?;
            for &u in rec.neighbours {
                // Nodes queued past the first `max_nodes` are never taken:
                // the queue and the seen set stay within the cache's size
                // (see [`NodeCache::bfs_scratch_bytes`]).
                if seen.len() >= max_nodes {
                    break;
                }
                if (u as usize) < n && seen.insert(u, ()).is_none() {
                    queue.push_back(u);
                }
            }
            cache.push(v, reader.raw_record(v)?);
        }
        Ok(cache)
    }

    /// The most a breadth-first load of `nodes` records holds besides
    /// them: its seen set (a hash table of at most `nodes` ids, grown by
    /// doubling) and its queue (at most `nodes` ids, grown by doubling).
    pub fn bfs_scratch_bytes(nodes: usize) -> u64 {
        if nodes == 0 {
            return 0;
        }
        let cap = (nodes as u64).saturating_mul(2).next_power_of_two();
        // Table: a slot and a control byte per bucket (buckets up to 8/7 ×
        // the capacity, a power of two); queue: 4 bytes per slot.
        cap.saturating_mul(2).saturating_mul(4 + 1) + cap.saturating_mul(4) + 128
    }

    /// Loads the records of the first `max_nodes` nodes of `order` (an
    /// in-degree cache: the highest in-degree first), reading the page file
    /// at `path` (blocks are CRC-checked).
    pub fn load_in_order(
        path: &Path,
        layout: &AnyLayout,
        order: &[u32],
        max_nodes: usize,
    ) -> Result<Self> {
        let take = max_nodes.min(order.len());
        let mut cache = NodeCache::sized(layout.geometry(), take, "in_degree");
        if take == 0 {
            return Ok(cache);
        }
        let mut reader = RecordReader::open(path, layout)?;
        for &v in &order[..take] {
            cache.push(v, reader.raw_record(v)?);
        }
        Ok(cache)
    }

    /// AlayaLaser's in-degree cache: the records of the first `max_nodes`
    /// nodes of the index's `in_degree` section.
    pub fn load_in_degree(
        dir: &Path,
        m: &Manifest,
        pages: &Path,
        layout: &AnyLayout,
        max_nodes: usize,
    ) -> Result<Self> {
        let path = section_path(dir, m, Section::InDegree);
        let order = crate::format::in_degree::decode(
            &path,
            &read_section(dir, m, Section::InDegree)?,
            m.n,
        )?;
        Self::load_in_order(pages, layout, &order, max_nodes)
    }

    /// An empty cache of `policy` with room for `nodes` records of `geo`
    /// (none reserved for 0).
    fn sized(geo: &PageGeometry, nodes: usize, policy: &'static str) -> Self {
        let mut cache = NodeCache {
            policy,
            ..NodeCache::empty()
        };
        if nodes > 0 {
            cache.record_words = geo.record_size / 4;
            cache.geo = Some(*geo);
            cache.words = BigVec::with_capacity(nodes * cache.record_words);
            cache.slots.reserve(nodes);
        }
        cache
    }

    /// Keeps the record `rec` of node `v` as stored (vector, degree,
    /// neighbours, any codes), in whole words so it stays 4-byte aligned.
    fn push(&mut self, v: u32, rec: &[u8]) {
        let idx = self.slots.len() as u32;
        self.slots.insert(v, idx);
        let base = self.words.len();
        self.words.resize(base + self.record_words);
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.words[base..]);
        let len = rec.len().min(bytes.len());
        bytes[..len].copy_from_slice(&rec[..len]);
        self.live += 1;
    }

    /// The cached record of `v`, if held.
    #[inline]
    pub fn record(&self, v: u32) -> Option<&[u8]> {
        if self.live == 0 {
            return None;
        }
        let i = *self.slots.get(&v)? as usize;
        if i >= self.live {
            return None;
        }
        Some(bytemuck::cast_slice(
            &self.words[i * self.record_words..(i + 1) * self.record_words],
        ))
    }

    /// Replaces the held record of `v` (an in-place update rewrote it).
    pub fn patch(&mut self, v: u32, record: &[u8]) {
        let Some(&i) = self.slots.get(&v) else {
            return;
        };
        let i = i as usize;
        if i >= self.live || record.len() > self.record_words * 4 {
            return;
        }
        let words = &mut self.words[i * self.record_words..(i + 1) * self.record_words];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(words);
        bytes[..record.len()].copy_from_slice(record);
    }

    /// Loads anew, breadth-first from `start` over the page file as it is
    /// now (`n` nodes), as many records as fit in `max_bytes` (at most
    /// `loaded`): the BFS cache of a graph updated in place, whose records
    /// near the start changed since the cache was loaded. The old records
    /// are dropped first, so the cache never holds both. A cache of
    /// another policy keeps what it holds. Returns the bytes held; on an
    /// error the cache is left empty.
    pub fn reload_bfs(
        &mut self,
        max_bytes: u64,
        loaded: usize,
        src: &CacheSource<'_>,
        n: usize,
    ) -> Result<u64> {
        if self.policy != "bfs" || self.slots.is_empty() {
            return Ok(self.memory());
        }
        *self = NodeCache::empty();
        let geo = src.layout.geometry();
        let nodes = Self::most_within(geo, max_bytes, loaded);
        if nodes > 0 {
            *self = NodeCache::load_bfs(src.pages, src.layout, n, src.manifest.medoid, nodes)?;
        }
        Ok(self.memory())
    }

    /// The nodes held, in the policy's order (tests and tools).
    pub fn nodes(&self) -> Vec<u32> {
        let mut out = vec![0u32; self.live];
        for (&v, &i) in self.slots.iter() {
            if (i as usize) < self.live {
                out[i as usize] = v;
            }
        }
        out
    }

    /// Bytes of the id map (what the cache holds with every record given up).
    fn map_bytes(&self) -> u64 {
        self.slots.capacity() as u64 * (4 + 4 + 1) + if self.slots.is_empty() { 0 } else { 64 }
    }

    /// Bytes one record takes.
    fn record_bytes(&self) -> u64 {
        self.record_words as u64 * 4
    }

    /// Records loaded at open, the most it takes back.
    pub fn loaded(&self) -> usize {
        self.slots.len()
    }

    /// Gives up records, the last of its order first, until it holds at
    /// most `max_bytes` (the id map goes last, with the final record).
    /// Returns the bytes held.
    pub fn evict_to(&mut self, max_bytes: u64) -> u64 {
        if self.memory() <= max_bytes {
            return self.memory();
        }
        let map = self.map_bytes();
        if max_bytes < map {
            let policy = self.policy;
            *self = NodeCache {
                policy,
                ..NodeCache::empty()
            };
            return 0;
        }
        let keep = ((max_bytes - map) / self.record_bytes().max(1)) as usize;
        self.live = self.live.min(keep);
        self.words.truncate(self.live * self.record_words);
        self.memory()
    }

    /// Reads back records it gave up, in its order, while it holds at most
    /// `max_bytes` and no more than it loaded at open (`loaded`, for a
    /// cache that gave up its map). Returns the bytes held.
    pub fn regrow(&mut self, max_bytes: u64, loaded: usize, src: &CacheSource<'_>) -> Result<u64> {
        if self.slots.is_empty() {
            // Everything was given up: load as at open, as many as fit.
            let geo = src.layout.geometry();
            let nodes = Self::most_within(geo, max_bytes, loaded);
            if nodes == 0 {
                return Ok(0);
            }
            *self = match self.policy {
                "in_degree" => {
                    NodeCache::load_in_degree(src.dir, src.manifest, src.pages, src.layout, nodes)?
                }
                _ => NodeCache::load_bfs(
                    src.pages,
                    src.layout,
                    src.manifest.n,
                    src.manifest.medoid,
                    nodes,
                )?,
            };
            return Ok(self.memory());
        }
        let map = self.map_bytes();
        let fit = (max_bytes.saturating_sub(map) / self.record_bytes().max(1)) as usize;
        let target = fit.min(self.slots.len());
        if target <= self.live {
            return Ok(self.memory());
        }
        // The records of positions live..target, straight from the map (no
        // list of them: a regrowth holds nothing but what it loads and a
        // page buffer, see `RESIZE_SCRATCH`).
        let old = self.live;
        self.words.resize(target * self.record_words);
        let rw = self.record_words;
        let (slots, words) = (&self.slots, &mut self.words);
        let read = (|| -> Result<()> {
            let mut reader = RecordReader::open(src.pages, src.layout)?;
            for (&v, &i) in slots.iter() {
                let i = i as usize;
                if i < old || i >= target {
                    continue;
                }
                let rec = reader.raw_record(v)?;
                let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut words[i * rw..(i + 1) * rw]);
                let len = rec.len().min(bytes.len());
                bytes[..len].copy_from_slice(&rec[..len]);
            }
            Ok(())
        })();
        match read {
            Ok(()) => self.live = target,
            Err(e) => {
                self.words.truncate(old * rw);
                return Err(e);
            }
        }
        Ok(self.memory())
    }

    /// Resident bytes held (records plus the id map).
    fn memory(&self) -> u64 {
        self.words.memory_bytes() as u64 + self.map_bytes()
    }
}

impl super::Cache for NodeCache {
    #[inline]
    fn get(&self, v: u32) -> Option<CachedNode<'_>> {
        let rec = self.record(v)?;
        let view = self.geo.as_ref()?.decode_record(rec).ok()?;
        Some(CachedNode {
            vector: Some(view.vector),
            neighbours: Neighbours::Ids(view.neighbours),
            codes: view.codes,
        })
    }

    #[inline]
    fn contains(&self, v: u32) -> bool {
        self.live > 0
            && self
                .slots
                .get(&v)
                .is_some_and(|&i| (i as usize) < self.live)
    }

    fn len(&self) -> usize {
        self.live
    }

    /// Resident bytes held (records plus the id map).
    fn memory_bytes(&self) -> usize {
        self.memory() as usize
    }
}
