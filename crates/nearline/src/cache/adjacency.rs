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

use super::{Cache, CachedNode, Neighbours};
use crate::format::adjacency::Parser;
use crate::format::{Manifest, Section};
use crate::io::files::{read_section_stream, section_path};
use crate::layout::{AnyLayout, RecordReader};
use crate::util::bitpack;
use crate::{Error, Result};
use std::path::Path;

/// Marks a node whose list is not held.
const ABSENT: u32 = u32::MAX;

/// Adjacency lists (and, when memory remains, vectors) of selected nodes.
pub struct AdjacencyCache {
    /// Node → slot (`ABSENT` when not held); empty when nothing is held.
    slot: Vec<u32>,
    /// Slot → byte offset of its list in `packed` (one more entry than
    /// slots).
    start: Vec<u32>,
    /// The lists, `bits` bits an id, each from a byte boundary, followed
    /// by `bitpack::PAD` bytes.
    packed: Vec<u8>,
    bits: u32,
    /// Neighbour ids held.
    edges: usize,
    /// Vectors of slots `0..nv`, each `vec_words` words.
    vectors: Vec<u32>,
    vec_words: usize,
    vec_bytes: usize,
    nv: usize,
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
            slot: Vec::new(),
            start: Vec::new(),
            packed: Vec::new(),
            bits: 8,
            edges: 0,
            vectors: Vec::new(),
            vec_words: 0,
            vec_bytes: 0,
            nv: 0,
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
        let (mut count, mut edges, mut used, mut full) = (0usize, 0usize, 0u64, false);
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
                    edges += list.len();
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
        cache.edges = edges;
        cache.slot = vec![ABSENT; n];
        cache.start = Vec::with_capacity(count + 1);
        cache.start.push(0);
        cache.packed = Vec::with_capacity(list_bytes + bitpack::PAD);
        let mut parser = Parser::new(&path, n, r);
        {
            let c = &mut cache;
            read_section_stream(dir, m, Section::Adjacency, &mut |chunk| {
                parser.feed(chunk, &mut |v, list| {
                    let i = c.start.len() - 1;
                    if i < count {
                        c.slot[v as usize] = i as u32;
                        bitpack::pack(list, bits, &mut c.packed);
                        c.start.push(c.packed.len() as u32);
                    }
                })
            })?;
        }
        parser.finish()?;
        cache.packed.extend_from_slice(&[0u8; bitpack::PAD]);
        // Vectors, only once the whole graph is held.
        let vec_bytes = m.dim * m.dtype.size();
        let vec_words = vec_bytes.div_ceil(4);
        let left = avail - used;
        if count == n && vec_words > 0 {
            let nv = ((left / (4 * vec_words as u64)) as usize).min(n);
            if nv > 0 {
                cache.load_vectors(pages, layout, nv, vec_bytes, vec_words)?;
            }
        }
        Ok(cache)
    }

    /// Reads the vectors of slots `0..nv` from the page file (in node
    /// order, so the reads run through the file once).
    fn load_vectors(
        &mut self,
        pages: &Path,
        layout: &AnyLayout,
        nv: usize,
        vec_bytes: usize,
        vec_words: usize,
    ) -> Result<()> {
        self.vectors = vec![0u32; nv * vec_words];
        let mut reader = RecordReader::open(pages, layout)?;
        for v in 0..self.slot.len() {
            let i = self.slot[v] as usize;
            if i >= nv {
                continue;
            }
            let rec = reader.record(v as u32)?;
            let dst: &mut [u8] =
                bytemuck::cast_slice_mut(&mut self.vectors[i * vec_words..(i + 1) * vec_words]);
            dst[..vec_bytes].copy_from_slice(rec.vector);
        }
        self.nv = nv;
        self.vec_bytes = vec_bytes;
        self.vec_words = vec_words;
        Ok(())
    }

    /// What the cache holds.
    pub fn contents(&self) -> AdjacencyContents {
        AdjacencyContents {
            lists: self.start.len().saturating_sub(1),
            vectors: self.nv,
            edges: self.edges,
            bytes: Cache::memory_bytes(self),
        }
    }
}

impl Cache for AdjacencyCache {
    #[inline]
    fn get(&self, v: u32) -> Option<CachedNode<'_>> {
        let i = *self.slot.get(v as usize)?;
        if i == ABSENT {
            return None;
        }
        let i = i as usize;
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
        self.slot.get(v as usize).is_some_and(|&i| i != ABSENT)
    }

    fn len(&self) -> usize {
        self.start.len().saturating_sub(1)
    }

    fn memory_bytes(&self) -> usize {
        4 * (self.slot.capacity() + self.start.capacity() + self.vectors.capacity())
            + self.packed.capacity()
    }
}
