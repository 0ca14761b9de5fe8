//! Writes the page file of a layout from vectors and a graph.

use super::placement::AnyLayout;
use super::replicate::Packing;
use crate::data::matrix::Matrix;
use crate::elem::Element;
use crate::format::page::{seal_block, PageGeometry, PAGE_HEADER_BYTES};
use crate::graph::Graph;
use crate::{Error, Result};
use rayon::prelude::*;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Writes the code region of node v's record (a coded layout).
pub type RecordCoder<'a> = &'a (dyn Fn(u32, &mut [u8]) -> Result<()> + Sync);

/// Blocks assembled in memory per write (bounded so memory stays small).
const BLOCKS_PER_CHUNK: usize = 1024;

/// Writes `data` and `graph` to the page file `path`, placing every node
/// where `layout` says. The ID layout streams the rows in order (rows of a
/// memory-mapped `data` are released as they are written); a shuffled
/// layout reads each chunk's rows with positioned reads, so a mapped input
/// is never touched at scattered rows (which would map most of it). With a
/// `packing` (a graph-replicated layout) each record also carries the
/// adjacency lists of the neighbours the packing names.
/// With a `coder` (a coded layout) each record's code region is written
/// by it after the record (node id, the record's bytes). A decoupled
/// layout (DGAI) writes records of adjacency lists only, then the vectors
/// in ID order into the vector pages that follow them.
pub fn write_pages<T: Element>(
    path: &Path,
    layout: &AnyLayout,
    data: &Matrix<T>,
    graph: &Graph,
    packing: Option<&Packing>,
    coder: Option<RecordCoder<'_>>,
    cancel: &AtomicBool,
) -> Result<()> {
    if packing.is_some_and(|p| p.per != layout.geometry().packed) {
        return Err(Error::arg(
            "the packing's slots per record differ from the layout's geometry",
        ));
    }
    let n = data.n();
    let geo: PageGeometry = *layout.geometry();
    if graph.n() != n {
        return Err(Error::arg(format!(
            "graph has {} nodes but data has {n} rows",
            graph.n()
        )));
    }
    let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let rpb = geo.records_per_block;
    let dim = data.dim();
    let mut buf = vec![0u8; BLOCKS_PER_CHUNK * geo.block_size];
    // Nodes of the chunk's blocks (slot order), their block-start offsets,
    // and (shuffled layouts) their gathered rows.
    let mut nodes: Vec<u32> = Vec::new();
    let mut starts: Vec<usize> = Vec::new();
    let mut rows: Vec<T> = Vec::new();
    let shuffled = matches!(layout, AnyLayout::Shuffled(_));
    let decoupled = geo.decoupled_vectors();
    let mut first_block = 0u64;
    while first_block < geo.n_blocks {
        if cancel.load(Ordering::Relaxed) {
            return Err(Error::Cancelled);
        }
        let nb = ((geo.n_blocks - first_block) as usize).min(BLOCKS_PER_CHUNK);
        nodes.clear();
        starts.clear();
        for i in 0..nb {
            starts.push(nodes.len());
            layout.block_nodes(first_block + i as u64, &mut nodes);
        }
        starts.push(nodes.len());
        if shuffled {
            rows.clear();
            data.gather_rows(&nodes, &mut rows)?;
        }
        let chunk = &mut buf[..nb * geo.block_size];
        chunk
            .par_chunks_mut(geo.block_size)
            .enumerate()
            .try_for_each(|(i, block)| -> Result<()> {
                let mut packed: Vec<(u32, &[u32])> = Vec::new();
                block.fill(0);
                let members = starts[i]..starts[i + 1];
                for (slot, j) in members.clone().enumerate() {
                    let v = nodes[j];
                    let vector: &[T] = if decoupled {
                        &[]
                    } else if shuffled {
                        &rows[j * dim..(j + 1) * dim]
                    } else {
                        data.row(v as usize)
                    };
                    let off = PAGE_HEADER_BYTES + slot * geo.record_size;
                    let rec = &mut block[off..off + geo.record_size];
                    geo.write_record(rec, bytemuck::cast_slice(vector), graph.neighbors(v));
                    if let Some(p) = packing {
                        packed.clear();
                        packed.extend(p.of(v).map(|u| (u, graph.neighbors(u))));
                        geo.write_packed(rec, &packed);
                    }
                    if let Some(c) = coder {
                        c(v, rec)?;
                    }
                }
                seal_block(block, first_block + i as u64, members.len(), geo.layout_id);
                Ok(())
            })?;
        out.write_all(chunk).map_err(|e| Error::io(path, e))?;
        if !shuffled && !decoupled {
            let row_end = ((first_block as usize + nb) * rpb).min(n);
            data.release_rows(first_block as usize * rpb, row_end);
        }
        first_block += nb as u64;
    }
    if decoupled {
        write_vector_pages(&mut out, path, &geo, data, cancel)?;
    }
    let file = out
        .into_inner()
        .map_err(|e| Error::io(path, e.into_error()))?;
    file.sync_all().map_err(|e| Error::io(path, e))?;
    Ok(())
}

/// Writes a decoupled layout's vector pages: `data`'s rows in ID order,
/// `vectors_per_block` a page, numbered after the record blocks (rows of a
/// memory-mapped `data` are released as they are written).
fn write_vector_pages<T: Element>(
    out: &mut impl Write,
    path: &Path,
    geo: &PageGeometry,
    data: &Matrix<T>,
    cancel: &AtomicBool,
) -> Result<()> {
    let n = data.n();
    let vpb = geo.vectors_per_block;
    let mut buf = vec![0u8; BLOCKS_PER_CHUNK * geo.block_size];
    let mut first = 0u64;
    while first < geo.vector_blocks {
        if cancel.load(Ordering::Relaxed) {
            return Err(Error::Cancelled);
        }
        let nb = ((geo.vector_blocks - first) as usize).min(BLOCKS_PER_CHUNK);
        let chunk = &mut buf[..nb * geo.block_size];
        chunk
            .par_chunks_mut(geo.block_size)
            .enumerate()
            .try_for_each(|(i, block)| -> Result<()> {
                let start = (first as usize + i) * vpb;
                let end = (start + vpb).min(n);
                let rows = (start..end).map(|v| bytemuck::cast_slice::<T, u8>(data.row(v)));
                geo.write_vector_block(block, geo.n_blocks + first + i as u64, rows)
                    .map_err(|e| Error::Engine(format!("vector page: {e}")))
            })?;
        out.write_all(chunk).map_err(|e| Error::io(path, e))?;
        let row_end = ((first as usize + nb) * vpb).min(n);
        data.release_rows(first as usize * vpb, row_end);
        first += nb as u64;
    }
    Ok(())
}
