//! Caches: what the memory budget's cache share holds, behind one
//! [`Cache`] trait the executor is generic over (chosen once per batch
//! through [`AnyCache`]).
//!
//! [`NodeCache`] is DiskANN's static cache: whole records (vector and
//! adjacency list) of the nodes nearest the entry point in BFS order, loaded
//! at open time and served without I/O. [`AdjacencyCache`] is Gorgeous'
//! adjacency-first cache (lists, then vectors if memory remains).

pub mod adjacency;

pub use adjacency::{AdjacencyCache, AdjacencyContents};

use crate::format::page::{PageGeometry, RecordView};
use crate::layout::{AnyLayout, RecordReader};
use crate::util::IdMap;
use crate::Result;
use std::collections::VecDeque;
use std::path::Path;

/// A cached node's neighbour ids: as a record stores them, or bit-packed
/// (the adjacency cache, see [`crate::util::bitpack`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Neighbours<'a> {
    /// Plain ids.
    Ids(&'a [u32]),
    /// `len` ids of `bits` bits each, packed from the start of `bytes`
    /// (which extends past the list as `bitpack::get` needs).
    Packed {
        bytes: &'a [u8],
        bits: u32,
        len: usize,
    },
}

impl<'a> Neighbours<'a> {
    /// How many neighbours.
    pub fn len(&self) -> usize {
        match self {
            Neighbours::Ids(s) => s.len(),
            Neighbours::Packed { len, .. } => *len,
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids as a slice: the stored one, or `buf` filled with them.
    #[inline]
    pub fn as_slice<'b>(&self, buf: &'b mut Vec<u32>) -> &'b [u32]
    where
        'a: 'b,
    {
        match *self {
            Neighbours::Ids(s) => s,
            Neighbours::Packed { bytes, bits, len } => {
                crate::util::bitpack::unpack_into(bytes, bits, len, buf);
                buf
            }
        }
    }

    /// The ids, copied.
    pub fn to_vec(&self) -> Vec<u32> {
        let mut buf = Vec::new();
        self.as_slice(&mut buf).to_vec()
    }
}

/// What a cache holds of one node: its adjacency list and, when the cache
/// keeps it, its vector (an adjacency-only cache leaves the exact distance
/// to a later stage).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedNode<'a> {
    /// The stored vector's bytes, when cached.
    pub vector: Option<&'a [u8]>,
    /// The node's neighbours.
    pub neighbours: Neighbours<'a>,
    /// Their codes, when the cache keeps a coded record (empty otherwise).
    pub codes: &'a [u8],
}

/// A memory cache of nodes, consulted before a node is read from disk.
pub trait Cache: Send + Sync {
    /// What the cache holds of node `v`, if anything.
    fn get(&self, v: u32) -> Option<CachedNode<'_>>;
    /// Whether the cache holds node `v` (cheaper than [`Cache::get`]).
    fn contains(&self, v: u32) -> bool;
    /// Nodes held.
    fn len(&self) -> usize;
    /// Whether nothing is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Resident bytes held.
    fn memory_bytes(&self) -> usize;
}

/// The caches an index can have; matched once per batch.
pub enum AnyCache {
    /// DiskANN's static BFS cache of whole records (possibly empty).
    Bfs(NodeCache),
    /// Gorgeous' adjacency-first cache.
    Adjacency(AdjacencyCache),
}

impl AnyCache {
    /// What the cache holds of node `v` (tools and tests; the executor
    /// goes through the concrete cache).
    pub fn get(&self, v: u32) -> Option<CachedNode<'_>> {
        match self {
            AnyCache::Bfs(c) => c.get(v),
            AnyCache::Adjacency(c) => c.get(v),
        }
    }

    /// Nodes held.
    pub fn len(&self) -> usize {
        match self {
            AnyCache::Bfs(c) => c.len(),
            AnyCache::Adjacency(c) => Cache::len(c),
        }
    }
    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Resident bytes held.
    pub fn memory_bytes(&self) -> usize {
        match self {
            AnyCache::Bfs(c) => Cache::memory_bytes(c),
            AnyCache::Adjacency(c) => Cache::memory_bytes(c),
        }
    }
    /// The policy's name (`info()`).
    pub fn name(&self) -> &'static str {
        match self {
            AnyCache::Bfs(c) => c.policy,
            AnyCache::Adjacency(_) => "adjacency",
        }
    }
}

/// Estimated bytes of one cached node besides its record (hash slot).
pub const CACHE_ENTRY_OVERHEAD: usize = 16;

/// Whole records of selected nodes, held in memory.
pub struct NodeCache {
    /// Which nodes it took: `"bfs"` or `"in_degree"`.
    policy: &'static str,
    geo: Option<PageGeometry>,
    slots: IdMap<u32>,
    /// Records stored as u32 words so every record is 4-byte aligned.
    words: Vec<u32>,
    record_words: usize,
}

impl NodeCache {
    /// An empty cache.
    pub fn empty() -> Self {
        NodeCache {
            policy: "bfs",
            geo: None,
            slots: IdMap::default(),
            words: Vec::new(),
            record_words: 0,
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
                if (u as usize) < n && seen.insert(u, ()).is_none() {
                    queue.push_back(u);
                }
            }
            cache.push(v, reader.raw_record(v)?);
        }
        Ok(cache)
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
            cache.words.reserve_exact(nodes * cache.record_words);
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
        self.words.resize(base + self.record_words, 0);
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.words[base..]);
        let len = rec.len().min(bytes.len());
        bytes[..len].copy_from_slice(&rec[..len]);
    }

    /// The cached record of `v`, if held.
    #[inline]
    pub fn record(&self, v: u32) -> Option<&[u8]> {
        if self.slots.is_empty() {
            return None;
        }
        self.slots.get(&v).map(|&i| {
            let i = i as usize;
            bytemuck::cast_slice(&self.words[i * self.record_words..(i + 1) * self.record_words])
        })
    }
}

impl Cache for NodeCache {
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
        !self.slots.is_empty() && self.slots.contains_key(&v)
    }

    fn len(&self) -> usize {
        self.slots.len()
    }

    /// Resident bytes held (records plus the id map).
    fn memory_bytes(&self) -> usize {
        self.words.capacity() * 4
            + self.slots.capacity() * (4 + 4 + 1)
            + if self.slots.is_empty() { 0 } else { 64 }
    }
}
