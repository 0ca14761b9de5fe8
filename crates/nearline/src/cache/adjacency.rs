//! Gorgeous' adjacency-first cache: the memory the budget leaves holds
//! adjacency lists (the graph) rather than whole records, so a hop whose
//! list is in memory costs no read; the node's exact distance is left to
//! the refine stage. Lists are taken in the priority order the build wrote
//! into the `adjacency` section (breadth-first from the entry points: the
//! navigation graph's nodes and their neighbourhoods first). Only when every
//! list fits does the rest of the share hold whole vectors, for the nodes
//! first in that order, which then need no refine read either.
//!
//! Lists are held bit-packed (`⌈log2 n⌉` bits an id, see
//! [`crate::util::bitpack`]): at 100k nodes a list of 64 takes 136 bytes
//! instead of 256, so the same share holds nearly twice the graph, and a
//! hop unpacks its list (64 shifts and masks) where it would otherwise
//! wait for a read.
//!
//! Every byte is allocated exactly once at its final size: the section is
//! streamed twice, once to find how many lists the share holds and once to
//! load them, so loading never holds more than the share.
//!
//! When a search borrows memory the cache gives up the least valuable
//! first: vectors from the last slot back, then lists from the end of the
//! priority order (their pages go back to the kernel at once); afterwards
//! it streams the section again and takes them back in the same order. The
//! node → slot index goes last, with the final list.

use super::{Cache, CacheSource, CachedNode, Neighbours};
use crate::format::adjacency::Parser;
use crate::format::{Manifest, Section};
use crate::io::files::{read_section_stream, section_path};
use crate::layout::{AnyLayout, RecordReader};
use crate::util::{bitpack, BigBuf, BigVec};
use crate::{Error, Result};
use std::path::Path;

/// Marks a node whose list is not held.
const ABSENT: u32 = u32::MAX;

/// Adjacency lists (and, when memory remains, vectors) of selected nodes.
pub struct AdjacencyCache {
    /// Node → slot (`ABSENT` when not held; a slot at or past the lists
    /// held was given up); empty when nothing is held.
    slot: BigBuf<u32>,
    /// Slot → byte offset of its list in `packed` (one more entry than
    /// slots held).
    start: BigVec<u32>,
    /// The lists, `bits` bits an id, each from a byte boundary, followed
    /// by `bitpack::PAD` bytes.
    packed: BigVec<u8>,
    bits: u32,
    /// Neighbour ids held.
    edges: usize,
    /// Vectors of slots `0..nv`, each `vec_words` words.
    vectors: BigVec<u32>,
    vec_words: usize,
    vec_bytes: usize,
    nv: usize,
    /// Lists and vectors loaded at open: the most it takes back.
    loaded_lists: usize,
    loaded_vectors: usize,
}

/// What an adjacency cache holds, for `info()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct AdjacencyContents {
    /// Adjacency lists held.
    pub lists: usize,
    /// Whole vectors held (only once every list is).
    pub vectors: usize,
    /// Neighbour ids held.
    pub edges: usize,
    /// Resident bytes.
    pub bytes: usize,
}

impl AdjacencyCache {
    /// An empty cache.
    pub fn empty() -> Self {
        AdjacencyCache {
            slot: BigBuf::zeroed(0),
            start: BigVec::new(),
            packed: BigVec::new(),
            bits: 8,
            edges: 0,
            vectors: BigVec::new(),
            vec_words: 0,
            vec_bytes: 0,
            nv: 0,
            loaded_lists: 0,
            loaded_vectors: 0,
        }
    }

    /// Bytes of the node → slot index, paid once any list is held (and
    /// the packed lists' padding).
    pub fn index_bytes(n: usize) -> u64 {
        4 * n as u64 + 4 + bitpack::PAD as u64
    }

    /// Bytes one held list of `degree` ids costs in an index of `n` nodes:
    /// its packed ids and its offset.
    pub fn list_bytes(n: usize, degree: usize) -> u64 {
        4 + bitpack::packed_len(degree, bitpack::bits_for(n)) as u64
    }

    /// Loads the lists that fit in `share` bytes (at most `max_lists` when
    /// given) from the index's `adjacency` section, then, if every list
    /// fits, the vectors the rest holds, read from the page file `pages`.
    pub fn load(
        dir: &Path,
        m: &Manifest,
        layout: &AnyLayout,
        pages: &Path,
        share: u64,
        max_lists: Option<usize>,
    ) -> Result<Self> {
        let n = m.n;
        let r = m.layout.max_degree;
        let mut cache = AdjacencyCache::empty();
        let fixed = Self::index_bytes(n);
        let max_lists = max_lists.unwrap_or(n).min(n);
        if share <= fixed || max_lists == 0 {
            return Ok(cache);
        }
        if !m.has(Section::Adjacency) {
            return Err(Error::arg(
                "cache=\"adjacency\": this index has no adjacency section; rebuild it with \
                 preset=\"gorgeous\" (or adjacency=True; CLI: --adjacency)",
            ));
        }
        let path = section_path(dir, m, Section::Adjacency);
        // Pass 1: how many lists (a prefix of the priority order) fit.
        let avail = share - fixed;
        let (mut count, mut used, mut full) = (0usize, 0u64, false);
        let mut parser = Parser::new(&path, n, r);
        read_section_stream(dir, m, Section::Adjacency, &mut |chunk| {
            parser.feed(chunk, &mut |_, list| {
                if full {
                    return;
                }
                let cost = Self::list_bytes(n, list.len());
                if count < max_lists && used + cost <= avail {
                    used += cost;
                    count += 1;
                } else {
                    full = true;
                }
            })
        })?;
        parser.finish()?;
        if count == 0 {
            return Ok(cache);
        }
        // Pass 2: load them into arrays of their final sizes.
        let bits = bitpack::bits_for(n);
        let list_bytes = (used - 4 * count as u64) as usize;
        if u32::try_from(list_bytes).is_err() {
            return Err(Error::arg(format!(
                "cache=\"adjacency\": {list_bytes} bytes of packed lists exceed what one \
                 cache indexes (4 GiB); give the cache a smaller share"
            )));
        }
        cache.bits = bits;
        cache.slot = Self::absent_index(n);
        cache.start = BigVec::with_capacity(count + 1);
        cache.start.extend_from_slice(&[0]);
        cache.packed = BigVec::with_capacity(list_bytes + bitpack::PAD);
        cache.stream_lists(dir, m, count, u64::MAX)?;
        cache.loaded_lists = count;
        // Vectors, only once the whole graph is held.
        let vec_bytes = m.dim * m.dtype.size();
        let vec_words = vec_bytes.div_ceil(4);
        let left = avail - used;
        if count == n && vec_words > 0 {
            let nv = ((left / (4 * vec_words as u64)) as usize).min(n);
            if nv > 0 {
                cache.vec_bytes = vec_bytes;
                cache.vec_words = vec_words;
                cache.vectors = BigVec::with_capacity(nv * vec_words);
                cache.load_vectors(pages, layout, nv)?;
                cache.loaded_vectors = nv;
            }
        }
        Ok(cache)
    }

    /// A node → slot index of `n` nodes, none held.
    fn absent_index(n: usize) -> BigBuf<u32> {
        let mut slot = BigBuf::zeroed(n);
        slot.fill(ABSENT);
        slot
    }

    /// Streams the adjacency section and appends the lists after those
    /// held, in priority order, up to `upto` lists held in all and while
    /// the cache holds at most `max_bytes` (the packed lists end with
    /// `bitpack::PAD` bytes either way). Returns the lists held.
    fn stream_lists(
        &mut self,
        dir: &Path,
        m: &Manifest,
        upto: usize,
        max_bytes: u64,
    ) -> Result<usize> {
        let (n, r, bits) = (m.n, m.layout.max_degree, self.bits);
        let path = section_path(dir, m, Section::Adjacency);
        // Drop the padding; it goes back after the last list.
        let held = self.lists();
        self.packed.truncate(self.start[held] as usize);
        let fixed = 4 * self.slot.len() as u64 + bitpack::PAD as u64;
        let mut used = fixed + 4 * (held as u64 + 1) + self.packed.len() as u64;
        let mut seen = 0usize;
        let mut full = false;
        let mut buf = Vec::new();
        let mut parser = Parser::new(&path, n, r);
        {
            let c = &mut *self;
            read_section_stream(dir, m, Section::Adjacency, &mut |chunk| {
                parser.feed(chunk, &mut |v, list| {
                    let i = seen;
                    seen += 1;
                    if full || i < held {
                        return;
                    }
                    let cost = Self::list_bytes(n, list.len());
                    if i >= upto || used + cost > max_bytes {
                        full = true;
                        return;
                    }
                    used += cost;
                    c.slot[v as usize] = i as u32;
                    buf.clear();
                    bitpack::pack(list, bits, &mut buf);
                    c.packed.extend_from_slice(&buf);
                    c.start.extend_from_slice(&[c.packed.len() as u32]);
                    c.edges += list.len();
                })
            })?;
        }
        parser.finish()?;
        self.packed.extend_from_slice(&[0u8; bitpack::PAD]);
        Ok(self.lists())
    }

    /// Lists held.
    fn lists(&self) -> usize {
        self.start.len().saturating_sub(1)
    }

    /// Gives up what it holds, the least valuable first (vectors from the
    /// last slot back, then lists from the end of the priority order, then
    /// the node index), until it holds at most `max_bytes`. Returns the
    /// bytes held.
    pub fn evict_to(&mut self, max_bytes: u64) -> u64 {
        let held = Cache::memory_bytes(self) as u64;
        if held <= max_bytes {
            return held;
        }
        // Vectors first.
        if self.nv > 0 {
            let over = held - max_bytes;
            let each = 4 * self.vec_words as u64;
            let drop = over.div_ceil(each.max(1)) as usize;
            self.nv = self.nv.saturating_sub(drop);
            self.vectors.truncate(self.nv * self.vec_words);
            self.vectors.shrink_to_fit();
        }
        if Cache::memory_bytes(self) as u64 <= max_bytes {
            return Cache::memory_bytes(self) as u64;
        }
        // Then lists: the most that fit (the bytes grow with the lists).
        let fixed = 4 * self.slot.len() as u64 + bitpack::PAD as u64;
        let bytes_with = |c: &Self, k: usize| fixed + 4 * (k as u64 + 1) + c.start[k] as u64;
        let mut keep = self.lists();
        while keep > 0 && bytes_with(self, keep) > max_bytes {
            keep -= 1;
        }
        for i in keep..self.lists() {
            let len = (self.start[i + 1] - self.start[i]) as usize;
            self.edges -= bitpack::ids_in(len, self.bits);
        }
        if keep == 0 && fixed + 4 > max_bytes {
            // Nothing at all: the index goes too.
            *self = AdjacencyCache {
                bits: self.bits,
                vec_words: self.vec_words,
                vec_bytes: self.vec_bytes,
                loaded_lists: self.loaded_lists,
                loaded_vectors: self.loaded_vectors,
                ..AdjacencyCache::empty()
            };
            return 0;
        }
        let end = self.start[keep] as usize;
        self.start.truncate(keep + 1);
        self.start.shrink_to_fit();
        self.packed.truncate(end + bitpack::PAD);
        self.packed.shrink_to_fit();
        Cache::memory_bytes(self) as u64
    }

    /// Takes back what it gave up, in its priority order (lists, then, once
    /// every list is held, vectors), while it holds at most `max_bytes` and
    /// no more than it loaded at open. Returns the bytes held.
    pub fn regrow(&mut self, max_bytes: u64, src: &CacheSource<'_>) -> Result<u64> {
        let m = src.manifest;
        if self.loaded_lists == 0 {
            return Ok(Cache::memory_bytes(self) as u64);
        }
        if self.lists() < self.loaded_lists {
            if self.slot.is_empty() {
                let first = Self::index_bytes(m.n) + 4 + Self::list_bytes(m.n, 0);
                if first > max_bytes {
                    return Ok(0);
                }
                self.slot = Self::absent_index(m.n);
                self.start = BigVec::with_capacity(self.loaded_lists + 1);
                self.start.extend_from_slice(&[0]);
                // A mapping reserves address space only: room for what
                // `max_bytes` could hold.
                self.packed = BigVec::with_capacity(max_bytes.saturating_sub(first) as usize);
                self.packed.extend_from_slice(&[0u8; bitpack::PAD]);
            }
            self.stream_lists(src.dir, m, self.loaded_lists, max_bytes)?;
            self.start.shrink_to_fit();
            self.packed.shrink_to_fit();
        }
        if self.lists() == self.loaded_lists && self.nv < self.loaded_vectors {
            let each = 4 * self.vec_words as u64;
            let room = max_bytes.saturating_sub(Cache::memory_bytes(self) as u64);
            let more = ((room / each.max(1)) as usize).min(self.loaded_vectors - self.nv);
            if more > 0 {
                let from = self.nv;
                self.load_vectors_range(src.pages, src.layout, from, from + more)?;
            }
        }
        Ok(Cache::memory_bytes(self) as u64)
    }

    /// Reads the vectors of slots `0..nv` from the page file (in node
    /// order, so the reads run through the file once).
    fn load_vectors(&mut self, pages: &Path, layout: &AnyLayout, nv: usize) -> Result<()> {
        self.load_vectors_range(pages, layout, 0, nv)
    }

    /// Reads the vectors of slots `from..to` (in node order) and holds
    /// those of slots `0..to`; on an error it keeps those it held.
    fn load_vectors_range(
        &mut self,
        pages: &Path,
        layout: &AnyLayout,
        from: usize,
        to: usize,
    ) -> Result<()> {
        let (vec_words, vec_bytes) = (self.vec_words, self.vec_bytes);
        self.vectors.resize(to * vec_words);
        let read = (|| -> Result<()> {
            let mut reader = RecordReader::open(pages, layout)?;
            for v in 0..self.slot.len() {
                let i = self.slot[v] as usize;
                if i < from || i >= to {
                    continue;
                }
                let x = reader.vector(v as u32)?;
                let dst: &mut [u8] =
                    bytemuck::cast_slice_mut(&mut self.vectors[i * vec_words..(i + 1) * vec_words]);
                dst[..vec_bytes].copy_from_slice(x);
            }
            Ok(())
        })();
        match read {
            Ok(()) => {
                self.nv = to;
                Ok(())
            }
            Err(e) => {
                self.vectors.truncate(from * vec_words);
                Err(e)
            }
        }
    }

    /// Lists loaded at open (the most it takes back).
    pub fn loaded(&self) -> usize {
        self.loaded_lists
    }

    /// What the cache holds.
    pub fn contents(&self) -> AdjacencyContents {
        AdjacencyContents {
            lists: self.lists(),
            vectors: self.nv,
            edges: self.edges,
            bytes: Cache::memory_bytes(self),
        }
    }
}

impl Cache for AdjacencyCache {
    #[inline]
    fn get(&self, v: u32) -> Option<CachedNode<'_>> {
        let i = *self.slot.get(v as usize)? as usize;
        if i >= self.lists() {
            return None;
        }
        let (a, b) = (self.start[i] as usize, self.start[i + 1] as usize);
        let neighbours = Neighbours::Packed {
            bytes: &self.packed[a..b + bitpack::PAD - 1],
            bits: self.bits,
            len: bitpack::ids_in(b - a, self.bits),
        };
        let vector = (i < self.nv).then(|| {
            let w = &self.vectors[i * self.vec_words..(i + 1) * self.vec_words];
            &bytemuck::cast_slice::<u32, u8>(w)[..self.vec_bytes]
        });
        Some(CachedNode {
            vector,
            neighbours,
            codes: &[],
        })
    }

    #[inline]
    fn contains(&self, v: u32) -> bool {
        self.slot
            .get(v as usize)
            .is_some_and(|&i| (i as usize) < self.lists())
    }

    fn len(&self) -> usize {
        self.lists()
    }

    fn memory_bytes(&self) -> usize {
        4 * self.slot.len()
            + self.start.memory_bytes()
            + self.vectors.memory_bytes()
            + self.packed.memory_bytes()
    }
}
