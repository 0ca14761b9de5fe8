//! Record placement: which block holds node v, and which nodes a block holds.
//!
//! Executors never compute locations themselves; they ask a [`Layout`]. The
//! ID layout (DiskANN) places node v at block `v / records_per_block`; later
//! layouts (Starling's shuffled pages, Gorgeous' replicated adjacency) answer
//! through a node→block map behind the same trait. The search loop is
//! generic over the layout, so each layout gets its own monomorphic loop.

use super::page::PageGeometry;

/// Where records live in the page file.
pub trait Layout: Send + Sync {
    /// Geometry of the page file (block size, record size, records per block).
    fn geometry(&self) -> &PageGeometry;

    /// Block and slot of node `v`.
    fn locate(&self, v: u32) -> (u64, usize);

    /// Appends the ids of the nodes block `b` holds to `out`, in slot order.
    fn block_nodes(&self, b: u64, out: &mut Vec<u32>);
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

/// The layouts an index can have; the executor matches once per batch and
/// runs a loop specialised for the variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnyLayout {
    Id(IdLayout),
}

impl AnyLayout {
    /// Geometry of the page file.
    pub fn geometry(&self) -> &PageGeometry {
        match self {
            AnyLayout::Id(l) => l.geometry(),
        }
    }

    /// Records per block: the planner's input for choosing an executor.
    pub fn records_per_block(&self) -> usize {
        self.geometry().records_per_block
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
}
