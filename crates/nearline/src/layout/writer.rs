//! Writes the page file of the ID layout from vectors and a graph.

use super::page::{seal_block, PageGeometry};
use crate::data::dtype::Element;
use crate::data::matrix::Matrix;
use crate::graph::Graph;
use crate::{Error, Result};
use rayon::prelude::*;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Blocks assembled in memory per write (bounded so memory stays small).
const BLOCKS_PER_CHUNK: usize = 1024;

/// Writes `data` and `graph` to the page file `path` in ID order.
/// Rows of a memory-mapped `data` are released as they are written.
pub fn write_pages<T: Element>(
    path: &Path,
    geo: &PageGeometry,
    data: &Matrix<T>,
    graph: &Graph,
    cancel: &AtomicBool,
) -> Result<()> {
    let n = data.n();
    if graph.n() != n {
        return Err(Error::arg(format!(
            "graph has {} nodes but data has {n} rows",
            graph.n()
        )));
    }
    let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let rpb = geo.records_per_block;
    let mut buf = vec![0u8; BLOCKS_PER_CHUNK * geo.block_size];
    let mut first_block = 0u64;
    while first_block < geo.n_blocks {
        if cancel.load(Ordering::Relaxed) {
            return Err(Error::Cancelled);
        }
        let nb = ((geo.n_blocks - first_block) as usize).min(BLOCKS_PER_CHUNK);
        let chunk = &mut buf[..nb * geo.block_size];
        chunk
            .par_chunks_mut(geo.block_size)
            .enumerate()
            .for_each(|(i, block)| {
                let b = first_block + i as u64;
                block.fill(0);
                let start = b as usize * rpb;
                let end = (start + rpb).min(n);
                for (slot, v) in (start..end).enumerate() {
                    let off = super::page::PAGE_HEADER_BYTES + slot * geo.record_size;
                    let rec = &mut block[off..off + geo.record_size];
                    geo.write_record(
                        rec,
                        bytemuck::cast_slice(data.row(v)),
                        graph.neighbors(v as u32),
                    );
                }
                seal_block(block, b, end - start);
            });
        out.write_all(chunk).map_err(|e| Error::io(path, e))?;
        let row_end = ((first_block as usize + nb) * rpb).min(n);
        data.release_rows(first_block as usize * rpb, row_end);
        first_block += nb as u64;
    }
    let file = out
        .into_inner()
        .map_err(|e| Error::io(path, e.into_error()))?;
    file.sync_all().map_err(|e| Error::io(path, e))?;
    Ok(())
}
