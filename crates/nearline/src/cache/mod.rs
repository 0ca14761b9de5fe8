//! Caches: what the memory budget's cache share holds, behind one
//! [`Cache`] trait the executor is generic over (chosen once per batch
//! through [`AnyCache`]).
//!
//! [`NodeCache`] is DiskANN's static cache: whole records (vector and
//! adjacency list) of the nodes nearest the entry point in BFS order, loaded
//! at open time and served without I/O. [`AdjacencyCache`] is Gorgeous'
//! adjacency-first cache (lists, then vectors if memory remains).
//!
//! Each cache ranks what it holds by its own policy (the order it loaded
//! it in). While a search needs more of the memory budget than the cache
//! leaves free, the cache gives up its least valuable entries
//! ([`AnyCache::evict_to`]: their memory goes back to the kernel at once)
//! and takes them back once the search is done ([`AnyCache::regrow`]). An
//! index holds its cache in a [`SharedCache`]: searches read it, a resize
//! waits until no search does.

pub mod adjacency;
pub mod node;

pub use adjacency::{AdjacencyCache, AdjacencyContents};
pub use node::NodeCache;

use crate::format::page::PageGeometry;
use crate::format::Manifest;
use crate::layout::AnyLayout;
use crate::{Error, Result};
use std::path::Path;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

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

    /// Replaces the record of `v` if the cache holds it (an in-place
    /// update rewrote it on disk). An adjacency cache's lists are never
    /// updated in place (the planner updates such an index out of place).
    pub fn patch(&mut self, v: u32, record: &[u8]) {
        if let AnyCache::Bfs(c) = self {
            c.patch(v, record);
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

    /// Entries (records or lists) loaded at open: the most a regrowth
    /// takes back.
    pub fn loaded(&self) -> usize {
        match self {
            AnyCache::Bfs(c) => c.loaded(),
            AnyCache::Adjacency(c) => c.loaded(),
        }
    }

    /// Gives up entries, the least valuable by the cache's own policy
    /// first, until it holds at most `max_bytes`; their memory goes back to
    /// the kernel. Returns the bytes held.
    pub fn evict_to(&mut self, max_bytes: u64) -> u64 {
        match self {
            AnyCache::Bfs(c) => c.evict_to(max_bytes),
            AnyCache::Adjacency(c) => c.evict_to(max_bytes),
        }
    }

    /// Loads a BFS cache anew over the graph as it is now (`n` nodes), in
    /// at most `max_bytes` (see [`NodeCache::reload_bfs`]); other caches
    /// keep what they hold. Returns the bytes held.
    pub fn reload(
        &mut self,
        max_bytes: u64,
        loaded: usize,
        src: &CacheSource<'_>,
        n: usize,
    ) -> Result<u64> {
        match self {
            AnyCache::Bfs(c) => c.reload_bfs(max_bytes, loaded, src, n),
            AnyCache::Adjacency(c) => Ok(Cache::memory_bytes(c) as u64),
        }
    }

    /// The most a [`AnyCache::reload`] of `max_bytes` holds besides the
    /// entries it loads.
    pub fn reload_scratch(&self, max_bytes: u64, geo: &PageGeometry) -> u64 {
        match self {
            AnyCache::Bfs(_) => {
                NodeCache::bfs_scratch_bytes(NodeCache::capacity_for(geo, max_bytes))
                    + RESIZE_SCRATCH
            }
            AnyCache::Adjacency(_) => 0,
        }
    }

    /// Reads back what it gave up, the most valuable first, while it holds
    /// at most `max_bytes` and no more than `loaded` entries (what it held
    /// at open). Returns the bytes held; on an error it keeps what it
    /// held.
    pub fn regrow(&mut self, max_bytes: u64, loaded: usize, src: &CacheSource<'_>) -> Result<u64> {
        match self {
            AnyCache::Bfs(c) => c.regrow(max_bytes, loaded, src),
            AnyCache::Adjacency(c) => c.regrow(max_bytes, src),
        }
    }
}

/// Where a cache reads back what it gave up: the index's directory and
/// manifest (its sections), its page file and layout.
pub struct CacheSource<'a> {
    pub dir: &'a Path,
    pub manifest: &'a Manifest,
    pub pages: &'a Path,
    pub layout: &'a AnyLayout,
}

/// An index's cache, shared by its searches: each search reads it through
/// a read guard held while the search runs; a resize takes it whole,
/// waiting until no search reads it.
pub struct SharedCache(RwLock<AnyCache>);

impl SharedCache {
    /// Shares `cache`.
    pub fn new(cache: AnyCache) -> Self {
        SharedCache(RwLock::new(cache))
    }

    /// The cache, for a search (shared with other searches).
    pub fn read(&self) -> Result<RwLockReadGuard<'_, AnyCache>> {
        self.0
            .read()
            .map_err(|_| Error::Engine("cache lock poisoned: a resize panicked".into()))
    }

    /// The cache, for a resize (once no search reads it).
    pub fn write(&self) -> Result<RwLockWriteGuard<'_, AnyCache>> {
        self.0
            .write()
            .map_err(|_| Error::Engine("cache lock poisoned: a resize panicked".into()))
    }
}

/// The most a cache holds besides its entries while it takes them back
/// ([`AnyCache::regrow`]): a chunk of the section it streams, a page buffer,
/// a list being packed. The memory ledger counts it while a regrowth runs.
pub const RESIZE_SCRATCH: u64 = crate::io::files::SECTION_STREAM_CHUNK as u64 + (64 << 10);

/// Estimated bytes of one cached node besides its record (hash slot).
pub const CACHE_ENTRY_OVERHEAD: usize = 16;
