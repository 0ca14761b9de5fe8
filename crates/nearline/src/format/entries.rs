//! The centroid-entry section (`entry_centroids.bin`), little-endian: magic
//! `NLEC`, version (1), element size, dim, count, a reserved u32 (0), then
//! count × u32 base ids and count × dim elements (the entry nodes'
//! vectors, normalised for cosine).

use super::section::{check_finite_elems, SectionReader, SectionWriter};
use crate::elem::Element;
use crate::Result;
use std::path::Path;

/// Magic of the centroid-entry section.
pub const CENTROIDS_MAGIC: &[u8; 4] = b"NLEC";
/// Version of the centroid-entry section this code writes and reads.
pub const CENTROIDS_VERSION: u32 = 1;

/// The section bytes for entry nodes `ids` with row-major vectors `vecs`.
pub fn encode_centroids<T: Element>(dim: usize, ids: &[u32], vecs: &[T]) -> Vec<u8> {
    let mut w = SectionWriter::new(CENTROIDS_MAGIC, CENTROIDS_VERSION);
    w.u32(std::mem::size_of::<T>() as u32);
    w.u32(dim as u32);
    w.u32(ids.len() as u32);
    w.u32(0);
    w.u32s(ids);
    w.elems(vecs);
    w.bytes
}

/// Parses and checks a centroid-entry section for an index of `n` points
/// of dimension `dim`: the entry ids and their row-major vectors.
pub fn decode_centroids<T: Element>(
    path: &Path,
    bytes: &[u8],
    dim: usize,
    n: usize,
) -> Result<(Vec<u32>, Vec<T>)> {
    let (mut r, _version) = SectionReader::open(
        path,
        "centroid entries",
        bytes,
        CENTROIDS_MAGIC,
        CENTROIDS_VERSION,
    )?;
    let count = r.vector_header::<T>(dim, n)?;
    let _reserved = r.u32("reserved")?;
    let expected = count
        .checked_mul(4 + dim * std::mem::size_of::<T>())
        .and_then(|a| a.checked_add(24));
    r.expect_len(expected)?;
    let ids = r.u32s(count, "ids")?;
    if let Some(i) = ids.iter().position(|&v| v as usize >= n) {
        return Err(r.err(format!("entry {i} has base id {} ≥ n = {n}", ids[i])));
    }
    let vecs: Vec<T> = r.elems(count * dim, "vectors")?;
    check_finite_elems(&r, &vecs, dim)?;
    r.finish()?;
    Ok((ids, vecs))
}
