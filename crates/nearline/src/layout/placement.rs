//! Record placement: which block holds node v, and which nodes a block holds.
//!
//! Executors never compute locations themselves; they ask a [`Layout`]. The
//! ID layout (DiskANN) places node v at block `v / records_per_block`; later
//! layouts (Starling's shuffled pages, Gorgeous' replicated adjacency) answer
//! through a node→block map behind the same trait. The search loop is
//! generic over the layout, so each layout gets its own monomorphic loop.

use crate::format::page::{
    block_records, verify_block, Packed, PageGeometry, RecordView, LAYOUT_PAGE_GRAPH,
    LAYOUT_SHUFFLED, PAGE_HEADER_BYTES,
};
use crate::format::{LayoutKind, Placement};
use crate::{Error, Result};
use std::path::Path;
use std::sync::Arc;

/// Marks an empty slot in a shuffled layout's position → node map.
const EMPTY: u32 = u32::MAX;

/// Where records live in the page file, and how a record of a verified
/// block decodes: every reader of records (executor steps, page policies,
/// caches, entry loads) goes through this trait, so a layout that stores
/// more than a vector and an adjacency list (Gorgeous' replicated lists,
/// AlayaLaser's neighbour codes) only adds an implementation.
pub trait Layout: Send + Sync {
    /// Geometry of the page file (block size, record size, records per block).
    fn geometry(&self) -> &PageGeometry;

    /// Block and slot of node `v`.
    fn locate(&self, v: u32) -> (u64, usize);

    /// Appends the ids of the nodes block `b` holds to `out`, in slot order.
    fn block_nodes(&self, b: u64, out: &mut Vec<u32>);

    /// Checks a block read from disk (header, block number, CRC32C); the
    /// error says which check failed.
    #[inline]
    fn verify(&self, block: &[u8], b: u64) -> std::result::Result<(), String> {
        verify_block(block, b, self.geometry())
    }

    /// Records a verified block holds.
    #[inline]
    fn block_records(&self, block: &[u8]) -> usize {
        block_records(block)
    }

    /// The record at `slot` of a verified block (in a 4-byte aligned buffer).
    #[inline]
    fn record<'a>(
        &self,
        block: &'a [u8],
        slot: usize,
    ) -> std::result::Result<RecordView<'a>, String> {
        self.geometry().decode(block, slot)
    }

    /// Block and slot of node `v`'s vector: its record's, or (a decoupled
    /// layout, DGAI) its place in the vector pages.
    #[inline]
    fn locate_vector(&self, v: u32) -> (u64, usize) {
        let geo = self.geometry();
        if geo.decoupled_vectors() {
            geo.vector_location(v)
        } else {
            self.locate(v)
        }
    }

    /// The vector at `slot` of a verified block read for
    /// [`Layout::locate_vector`].
    #[inline]
    fn vector<'a>(&self, block: &'a [u8], slot: usize) -> std::result::Result<&'a [u8], String> {
        let geo = self.geometry();
        if geo.decoupled_vectors() {
            geo.vector_at(block, slot)
        } else {
            self.record(block, slot).map(|r| r.vector)
        }
    }

    /// The neighbours' adjacency lists the record at `slot` of a verified
    /// block carries (graph-replicated layouts; none otherwise).
    #[inline]
    fn packed<'a>(&self, block: &'a [u8], slot: usize) -> std::result::Result<Packed<'a>, String> {
        let geo = self.geometry();
        if geo.packed == 0 {
            return Ok(Packed::EMPTY);
        }
        let off = PAGE_HEADER_BYTES + slot * geo.record_size;
        let rec = block
            .get(off..off + geo.record_size)
            .ok_or_else(|| format!("record slot {slot} lies outside the block"))?;
        geo.decode_packed(rec)
    }
}

/// DiskANN's ID layout: node v at block `v / records_per_block`, slot
/// `v % records_per_block`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdLayout {
    pub geo: PageGeometry,
    /// Nodes in the index (the last block may be partly filled).
    pub n: u32,
}

impl IdLayout {
    /// The ID layout of `n` nodes on `geo`.
    pub fn new(geo: PageGeometry, n: usize) -> Self {
        IdLayout {
            geo,
            n: n.min(u32::MAX as usize) as u32,
        }
    }
}

impl Layout for IdLayout {
    #[inline]
    fn geometry(&self) -> &PageGeometry {
        &self.geo
    }

    #[inline]
    fn locate(&self, v: u32) -> (u64, usize) {
        self.geo.location(v)
    }

    fn block_nodes(&self, b: u64, out: &mut Vec<u32>) {
        let rpb = self.geo.records_per_block as u64;
        let start = b.saturating_mul(rpb).min(self.n as u64);
        let end = start.saturating_add(rpb).min(self.n as u64);
        out.extend((start..end).map(|v| v as u32));
    }
}

/// A shuffled layout (Starling's block shuffling): node v sits at position
/// `loc[v] = block * records_per_block + slot`, chosen at build time so that
/// a block holds a node together with its graph neighbours. Both directions
/// of the map stay in memory (8 bytes per node, counted in the budget).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShuffledLayout {
    geo: PageGeometry,
    /// node → position.
    loc: Arc<[u32]>,
    /// position → node (`EMPTY` for a free slot).
    members: Arc<[u32]>,
}

impl ShuffledLayout {
    /// The layout placing node v at position `loc[v]` on `geo` (whose
    /// layout id becomes [`LAYOUT_SHUFFLED`]). Fails unless `loc` is a
    /// placement: every position inside the page file and none used twice.
    pub fn new(geo: PageGeometry, loc: Vec<u32>) -> std::result::Result<Self, String> {
        Self::placed(geo, loc, Placement::Shuffled)
    }

    /// As [`ShuffledLayout::new`], for a placement that stores positions:
    /// shuffled blocks ([`LAYOUT_SHUFFLED`]) or a page graph
    /// ([`LAYOUT_PAGE_GRAPH`]).
    pub fn placed(
        geo: PageGeometry,
        loc: Vec<u32>,
        placement: Placement,
    ) -> std::result::Result<Self, String> {
        let layout_id = match placement {
            Placement::Shuffled => LAYOUT_SHUFFLED,
            Placement::PageGraph => LAYOUT_PAGE_GRAPH,
            Placement::Id => return Err("the ID placement stores no positions".into()),
        };
        let rpb = geo.records_per_block as u64;
        let slots = geo.n_blocks.saturating_mul(rpb);
        if (loc.len() as u64) > slots {
            return Err(format!(
                "{} nodes do not fit {} blocks of {rpb} records",
                loc.len(),
                geo.n_blocks
            ));
        }
        if slots > u32::MAX as u64 {
            return Err(format!("{slots} record slots do not fit 32-bit positions"));
        }
        let mut members = vec![EMPTY; slots as usize];
        for (v, &p) in loc.iter().enumerate() {
            let slot = members.get_mut(p as usize).ok_or_else(|| {
                format!(
                    "node {v} is placed at position {p}, past the last slot {}",
                    slots.saturating_sub(1)
                )
            })?;
            if *slot != EMPTY {
                return Err(format!(
                    "nodes {} and {v} are both placed at position {p}",
                    *slot
                ));
            }
            *slot = v as u32;
        }
        Ok(ShuffledLayout {
            geo: geo.with_layout_id(layout_id),
            loc: loc.into(),
            members: members.into(),
        })
    }

    /// Nodes placed.
    pub fn n(&self) -> usize {
        self.loc.len()
    }

    /// node → position map.
    pub fn positions(&self) -> &[u32] {
        &self.loc
    }

    /// Bytes the two maps hold in memory.
    pub fn memory_bytes(&self) -> usize {
        (self.loc.len() + self.members.len()) * 4
    }

    /// The placement: shuffled blocks or a page graph.
    pub fn placement(&self) -> Placement {
        if self.geo.layout_id == LAYOUT_PAGE_GRAPH {
            Placement::PageGraph
        } else {
            Placement::Shuffled
        }
    }

    /// Reads the `id_to_location` section of an index of `n` nodes on
    /// `geo` ([`crate::format::location`]) laid out by `placement`; every
    /// field and position is checked.
    pub fn from_section(
        path: &Path,
        bytes: &[u8],
        geo: PageGeometry,
        n: usize,
        placement: Placement,
    ) -> Result<Self> {
        let loc = crate::format::location::decode(path, bytes, &geo, n)?;
        ShuffledLayout::placed(geo, loc, placement)
            .map_err(|m| Error::corrupt(path, format!("id-to-location section: {m}")))
    }
}

impl Layout for ShuffledLayout {
    #[inline]
    fn geometry(&self) -> &PageGeometry {
        &self.geo
    }

    #[inline]
    fn locate(&self, v: u32) -> (u64, usize) {
        let p = self.loc[v as usize] as u64;
        let rpb = self.geo.records_per_block as u64;
        (p / rpb, (p % rpb) as usize)
    }

    fn block_nodes(&self, b: u64, out: &mut Vec<u32>) {
        let rpb = self.geo.records_per_block;
        if b >= self.geo.n_blocks {
            return;
        }
        let start = b as usize * rpb;
        out.extend(
            self.members[start..start + rpb]
                .iter()
                .copied()
                .take_while(|&v| v != EMPTY),
        );
    }
}

/// The layouts an index can have; the executor matches once per batch and
/// runs a loop specialised for the variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnyLayout {
    Id(IdLayout),
    Shuffled(ShuffledLayout),
}

impl AnyLayout {
    /// Geometry of the page file.
    pub fn geometry(&self) -> &PageGeometry {
        match self {
            AnyLayout::Id(l) => l.geometry(),
            AnyLayout::Shuffled(l) => l.geometry(),
        }
    }

    /// Block and slot of node `v`.
    #[inline]
    pub fn locate(&self, v: u32) -> (u64, usize) {
        match self {
            AnyLayout::Id(l) => l.locate(v),
            AnyLayout::Shuffled(l) => l.locate(v),
        }
    }

    /// Appends the nodes of block `b` to `out`, in slot order.
    pub fn block_nodes(&self, b: u64, out: &mut Vec<u32>) {
        match self {
            AnyLayout::Id(l) => l.block_nodes(b, out),
            AnyLayout::Shuffled(l) => l.block_nodes(b, out),
        }
    }

    /// The manifest's layout kind.
    pub fn kind(&self) -> LayoutKind {
        match self {
            AnyLayout::Id(l) if l.geo.packed > 0 => LayoutKind::Replicated,
            AnyLayout::Id(l) if l.geo.pq_code > 0 => LayoutKind::PqCoded,
            AnyLayout::Id(l) if l.geo.codes > 0 => LayoutKind::Coded,
            AnyLayout::Id(l) if l.geo.decoupled_vectors() => LayoutKind::Decoupled,
            AnyLayout::Id(_) => LayoutKind::ID,
            AnyLayout::Shuffled(l) => LayoutKind::Plain(l.placement()),
        }
    }

    /// Bytes of the location maps held in memory (0 for the ID layout).
    pub fn memory_bytes(&self) -> usize {
        match self {
            AnyLayout::Id(_) => 0,
            AnyLayout::Shuffled(l) => l.memory_bytes(),
        }
    }

    /// Records per block: the planner's input for choosing an executor.
    pub fn records_per_block(&self) -> usize {
        self.geometry().records_per_block
    }
}

/// Blocking reads of single records, verified and decoded, for open-time
/// loads (caches, entry points); searches go through the I/O engine.
pub struct RecordReader {
    blocks: crate::io::BlockReader,
    layout: AnyLayout,
}

impl RecordReader {
    /// Opens the page file at `path`, laid out by `layout`.
    pub fn open(path: &Path, layout: &AnyLayout) -> Result<Self> {
        Ok(RecordReader {
            blocks: crate::io::BlockReader::open(path, layout.geometry().block_size)?,
            layout: layout.clone(),
        })
    }

    /// The record of node `v` (its block read, checked and decoded).
    pub fn record(&mut self, v: u32) -> Result<RecordView<'_>> {
        let geo = *self.layout.geometry();
        let path = self.blocks.path().to_path_buf();
        let rec = self.raw_record(v)?;
        geo.decode_record(rec)
            .map_err(|m| Error::corrupt(&path, format!("node {v}: {m}")))
    }

    /// The stored vector of node `v`: its record's, or (a decoupled
    /// layout) the one its vector page holds.
    pub fn vector(&mut self, v: u32) -> Result<&[u8]> {
        let geo = *self.layout.geometry();
        if !geo.decoupled_vectors() {
            return self.record(v).map(|r| r.vector);
        }
        let path = self.blocks.path().to_path_buf();
        let (b, slot) = geo.vector_location(v);
        let block = self.blocks.read(geo.block_offset(b))?;
        verify_block(block, b, &geo).map_err(|m| Error::corrupt(&path, m))?;
        geo.vector_at(block, slot)
            .map_err(|m| Error::corrupt(&path, format!("vector of node {v}: {m}")))
    }

    /// The bytes of node `v`'s record as stored (its block read and
    /// checked; the record is decoded, so a bad one is refused here).
    pub fn raw_record(&mut self, v: u32) -> Result<&[u8]> {
        let (b, slot) = self.layout.locate(v);
        let geo = *self.layout.geometry();
        let path = self.blocks.path().to_path_buf();
        let block = self.blocks.read(geo.block_offset(b))?;
        verify_block(block, b, &geo).map_err(|m| Error::corrupt(&path, m))?;
        geo.decode(block, slot)
            .map_err(|m| Error::corrupt(&path, format!("node {v}: {m}")))?;
        Ok(geo.record(block, slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_layout_round_trips() {
        // 16-d f32, R=16: 132-byte records, 30 per 4 KiB block.
        let geo = PageGeometry::new(4096, 64, 16, 100).unwrap();
        let l = IdLayout::new(geo, 100);
        assert_eq!(geo.records_per_block, 30);
        let mut seen = Vec::new();
        for b in 0..geo.n_blocks {
            let mut nodes = Vec::new();
            l.block_nodes(b, &mut nodes);
            for (slot, &v) in nodes.iter().enumerate() {
                assert_eq!(l.locate(v), (b, slot));
            }
            seen.extend(nodes);
        }
        assert_eq!(seen, (0..100).collect::<Vec<u32>>());
        // The last block holds only the 10 remaining nodes; past the end, none.
        let mut last = Vec::new();
        l.block_nodes(3, &mut last);
        assert_eq!(last, (90..100).collect::<Vec<u32>>());
        let mut none = Vec::new();
        l.block_nodes(4, &mut none);
        l.block_nodes(u64::MAX, &mut none);
        assert!(none.is_empty());
    }

    #[test]
    fn shuffled_layout_round_trips_and_rejects_bad_maps() {
        let geo = PageGeometry::new(4096, 64, 16, 7).unwrap();
        // 30 records per block, 1 block: 7 nodes at scattered slots.
        let loc = vec![5, 0, 29, 3, 1, 2, 4];
        let l = ShuffledLayout::new(geo, loc.clone()).unwrap();
        assert_eq!(l.geometry().layout_id, LAYOUT_SHUFFLED);
        for (v, &p) in loc.iter().enumerate() {
            assert_eq!(l.locate(v as u32), (0, p as usize));
        }
        // Slot order up to the first free slot.
        let mut nodes = Vec::new();
        l.block_nodes(0, &mut nodes);
        assert_eq!(nodes, vec![1, 4, 5, 3, 6, 0]);
        let path = Path::new("id_to_location.bin");
        let b = crate::format::location::encode(&geo, l.positions());
        assert_eq!(
            ShuffledLayout::from_section(path, &b, geo, 7, Placement::Shuffled).unwrap(),
            l
        );
        assert!(ShuffledLayout::from_section(path, &b, geo, 8, Placement::Shuffled).is_err());
        assert!(
            ShuffledLayout::from_section(path, &b[..b.len() - 1], geo, 7, Placement::Shuffled)
                .is_err()
        );
        let mut bad = b.clone();
        bad[24..28].copy_from_slice(&30u32.to_le_bytes());
        let e = ShuffledLayout::from_section(path, &bad, geo, 7, Placement::Shuffled)
            .unwrap_err()
            .to_string();
        assert!(e.contains("past the last slot"), "{e}");
        let mut dup = b.clone();
        dup[24..28].copy_from_slice(&3u32.to_le_bytes());
        let e = ShuffledLayout::from_section(path, &dup, geo, 7, Placement::Shuffled)
            .unwrap_err()
            .to_string();
        assert!(e.contains("both placed"), "{e}");
    }
}
