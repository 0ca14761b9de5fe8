//! Caches: what the search memory budget holds.
//!
//! [`NodeCache`] is DiskANN's static cache: whole records (vector and
//! adjacency list) of the nodes nearest the entry point in BFS order, loaded
//! at open time and served without I/O.

use crate::layout::page::{PageGeometry, RecordReader};
use crate::layout::AnyLayout;
use crate::{Error, Result};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::path::Path;

/// A multiplicative hasher for u32 node ids (SipHash is needlessly slow here).
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        // hashbrown takes its 7-bit tags from the top bits and the bucket from
        // the low bits: both halves must be mixed.
        let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = x ^ (x >> 32);
    }
}

/// A hash map keyed by node id.
pub type IdMap<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

/// Estimated bytes of one cached node besides its record (hash slot).
pub const CACHE_ENTRY_OVERHEAD: usize = 16;

/// Whole records of selected nodes, held in memory.
pub struct NodeCache {
    slots: IdMap<u32>,
    /// Records stored as u32 words so every record is 4-byte aligned.
    words: Vec<u32>,
    record_words: usize,
}

impl NodeCache {
    /// An empty cache.
    pub fn empty() -> Self {
        NodeCache {
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

    /// Bytes [`NodeCache::memory_bytes`] reports for `nodes` cached nodes.
    fn bytes_for(geo: &PageGeometry, nodes: usize) -> u64 {
        if nodes == 0 {
            return 0;
        }
        // hashbrown: buckets = next power of two of 8/7 × capacity (at
        // least 4); usable capacity = 7/8 of the buckets (buckets − 1 below 8).
        let buckets = if nodes < 4 {
            4
        } else if nodes < 8 {
            8
        } else {
            (nodes * 8 / 7).next_power_of_two()
        };
        let table = if buckets < 8 {
            buckets - 1
        } else {
            buckets / 8 * 7
        };
        (nodes * (geo.record_size / 4) * 4 + table * (4 + 4 + 1) + 64) as u64
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
        let geo = layout.geometry();
        let mut cache = NodeCache::empty();
        let max_nodes = max_nodes.min(n);
        if max_nodes == 0 {
            return Ok(cache);
        }
        cache.record_words = geo.record_size / 4;
        cache.words.reserve_exact(max_nodes * cache.record_words);
        cache.slots.reserve(max_nodes);
        let mut reader = RecordReader::open(path, layout)?;
        let mut queue = VecDeque::from([start]);
        let mut seen = IdMap::<()>::default();
        seen.insert(start, ());
        while let Some(v) = queue.pop_front() {
            if cache.slots.len() >= max_nodes {
                break;
            }
            let rec = reader.record(v)?;
            let (_, nbrs) = geo.split_record(rec).ok_or_else(|| {
                Error::corrupt(path, format!("record of node {v} has a degree above R"))
            })?;
            let idx = cache.slots.len() as u32;
            cache.slots.insert(v, idx);
            cache.words.extend(
                rec.chunks_exact(4)
                    .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]])),
            );
            for u in crate::layout::page::ids(nbrs) {
                if (u as usize) < n && seen.insert(u, ()).is_none() {
                    queue.push_back(u);
                }
            }
        }
        Ok(cache)
    }

    /// The cached record of `v`, if held.
    #[inline]
    pub fn get(&self, v: u32) -> Option<&[u8]> {
        if self.slots.is_empty() {
            return None;
        }
        self.slots.get(&v).map(|&i| {
            let i = i as usize;
            bytemuck::cast_slice(&self.words[i * self.record_words..(i + 1) * self.record_words])
        })
    }

    /// Cached nodes.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Resident bytes held (records plus the id map).
    pub fn memory_bytes(&self) -> usize {
        self.words.capacity() * 4
            + self.slots.capacity() * (4 + 4 + 1)
            + if self.slots.is_empty() { 0 } else { 64 }
    }
}

#[cfg(test)]
mod hasher_tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn id_hash_mixes_top_and_low_bits() {
        let b = BuildHasherDefault::<IdHasher>::default();
        let tags: std::collections::HashSet<u64> =
            (0u32..4096).map(|i| b.hash_one(i) >> 57).collect();
        assert!(
            tags.len() > 100,
            "top 7 bits must vary: {} distinct",
            tags.len()
        );
        let lows: std::collections::HashSet<u64> =
            (0u32..4096).map(|i| b.hash_one(i * 1024) & 1023).collect();
        assert!(
            lows.len() > 500,
            "low bits must vary for strided ids: {}",
            lows.len()
        );
    }
}
