//! The `id_to_location` section of a shuffled layout, little-endian:
//! magic `NLLO`, version (1), records per block, node count, block count,
//! a reserved u32 (0), then one u32 position (`block × records_per_block +
//! slot`) per node. The ID layout stores none (the map is the identity).

use super::page::PageGeometry;
use super::section::{SectionReader, SectionWriter};
use crate::{Error, Result};
use std::path::Path;

/// Magic of the id→location section of a shuffled layout.
pub const LOCATION_MAGIC: &[u8; 4] = b"NLLO";
/// Version of the id→location section this build writes and reads.
pub const LOCATION_VERSION: u32 = 1;

/// The section bytes for node → position map `loc` on `geo`.
pub fn encode(geo: &PageGeometry, loc: &[u32]) -> Vec<u8> {
    let mut w = SectionWriter::new(LOCATION_MAGIC, LOCATION_VERSION);
    w.u32(geo.records_per_block as u32);
    w.u32(loc.len() as u32);
    w.u32(geo.n_blocks as u32);
    w.u32(0);
    w.u32s(loc);
    w.bytes
}

/// The positions stored in a section for an index of `n` nodes on `geo`
/// (header fields checked; whether they form a placement is the layout's
/// check).
pub fn decode(path: &Path, bytes: &[u8], geo: &PageGeometry, n: usize) -> Result<Vec<u32>> {
    let (mut r, _) = SectionReader::open(
        path,
        "id-to-location",
        bytes,
        LOCATION_MAGIC,
        LOCATION_VERSION,
    )?;
    let rpb = r.u32("records per block")? as usize;
    let count = r.u32("count")? as usize;
    let blocks = r.u32("blocks")? as u64;
    let _reserved = r.u32("reserved")?;
    if rpb != geo.records_per_block || count != n || blocks != geo.n_blocks {
        return Err(Error::corrupt(
            path,
            format!(
                "id-to-location section is for {count} nodes in {blocks} blocks of {rpb}; the index has {n} nodes in {} blocks of {}",
                geo.n_blocks, geo.records_per_block
            ),
        ));
    }
    r.expect_len(count.checked_mul(4).and_then(|b| b.checked_add(24)))?;
    let loc = r.u32s(count, "positions")?;
    r.finish()?;
    Ok(loc)
}
