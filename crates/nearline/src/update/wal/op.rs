//! The operations the index updaters log, and their payloads.

use super::file::{u32_at, u64_at};
use super::{kind, Record, MAX_PAYLOAD};
use crate::elem::DType;
use crate::error::{Error, Result};
use std::path::Path;

/// The on-disk tag of an element type in an insert record.
pub fn dtype_tag(dtype: DType) -> u8 {
    match dtype {
        DType::F32 => 1,
        DType::F16 => 2,
        DType::U8 => 3,
        DType::I8 => 4,
    }
}

/// The element type of an on-disk tag.
pub fn dtype_from_tag(tag: u8) -> Option<DType> {
    match tag {
        1 => Some(DType::F32),
        2 => Some(DType::F16),
        3 => Some(DType::U8),
        4 => Some(DType::I8),
        _ => None,
    }
}

/// The operations the index updaters log.
///
/// The rows of an insert's payload widened to f32, in the element type
/// the record logged (its dtype tag); `vectors` holds whole elements (the
/// decoder checked its length).
pub fn decode_vectors(dtype: DType, vectors: &[u8]) -> Vec<f32> {
    crate::with_dtype!(dtype, T, {
        vectors
            .chunks_exact(std::mem::size_of::<T>())
            .map(|c| crate::elem::Element::to_f32(bytemuck::pod_read_unaligned::<T>(c)))
            .collect()
    })
}

/// The rows of a logged insert widened to f32, checked against the index
/// that replays it: the record's dimension must be the index's, and its
/// element type the one the index logs when it logs only one (`only`: a
/// partition index logs float32). Every replay of an insert (a graph
/// index's delta, a partition index's open and its read-only follower)
/// reads its rows here.
pub fn insert_rows(
    path: &Path,
    index_dim: usize,
    logged_dim: u32,
    dtype: DType,
    vectors: &[u8],
    only: Option<DType>,
) -> Result<Vec<f32>> {
    if logged_dim as usize != index_dim {
        return Err(Error::corrupt(
            path,
            format!("a logged insert has dimension {logged_dim}; the index has {index_dim}"),
        ));
    }
    if let Some(want) = only {
        if dtype != want {
            return Err(Error::corrupt(
                path,
                format!(
                    "a logged insert holds {} vectors; this index logs {}",
                    dtype.name(),
                    want.name()
                ),
            ));
        }
    }
    Ok(decode_vectors(dtype, vectors))
}

/// Payload of [`kind::INSERT`]:
///
/// | bytes | field |
/// |---|---|
/// | 0..4 | n, the number of vectors (u32) |
/// | 4..8 | dim (u32, at least 1) |
/// | 8 | dtype tag ([`dtype_tag`]: 1 f32, 2 f16, 3 u8, 4 i8) |
/// | 9..12 | zero |
/// | 12..12+8n | external ids (u64 each) |
/// | 12+8n.. | n × dim elements, row-major, exactly |
///
/// Payload of [`kind::DELETE`]: `[u32 n][n × u64 external ids]`, exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Insert {
        ids: Vec<u64>,
        dim: u32,
        dtype: DType,
        /// `ids.len() × dim` elements of `dtype`, little-endian bytes.
        vectors: Vec<u8>,
    },
    Delete {
        ids: Vec<u64>,
    },
    /// One in-place update of a graph index: what it did to the id
    /// tracker and the full images of the page-file blocks it rewrites
    /// (redo: replaying it writes them again, so a torn page write is
    /// repaired from the log).
    Patch(Patch),
}

/// What an in-place insert or delete did ([`Op::Patch`]).
///
/// Payload of [`kind::PATCH`]:
///
/// | bytes | field |
/// |---|---|
/// | 0 | action (u8): 1 insert, 2 delete, 3 repair (blocks only) |
/// | 1..4 | zero |
/// | 4..8 | internal id (u32) |
/// | 8..16 | external id (u64) |
/// | 16..20 | dim (u32; 0 unless an insert) |
/// | 20 | dtype tag of the vector ([`dtype_tag`]; 0 unless an insert) |
/// | 21..24 | zero |
/// | 24..24+V | the inserted vector: dim elements of dtype |
/// | +0..+4 | block count B (u32) |
/// | +4..+8 | block size S (u32) |
/// | then | B × (block number u64, S bytes) |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patch {
    pub action: PatchAction,
    pub internal: u32,
    pub external: u64,
    pub dim: u32,
    pub dtype: DType,
    /// The inserted vector's bytes (empty unless an insert).
    pub vector: Vec<u8>,
    pub block_size: u32,
    /// Block number and full image of each block written.
    pub blocks: Vec<(u64, Vec<u8>)>,
}

/// What an [`Op::Patch`] did to the ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchAction {
    /// A vector took internal id `internal` under `external`.
    Insert,
    /// `external` (at `internal`) was deleted.
    Delete,
    /// Only blocks were rewritten (a sweep of edges to deleted nodes).
    Repair,
}

impl PatchAction {
    fn tag(self) -> u8 {
        match self {
            PatchAction::Insert => 1,
            PatchAction::Delete => 2,
            PatchAction::Repair => 3,
        }
    }

    fn from_tag(t: u8) -> Option<Self> {
        match t {
            1 => Some(PatchAction::Insert),
            2 => Some(PatchAction::Delete),
            3 => Some(PatchAction::Repair),
            _ => None,
        }
    }
}

impl Patch {
    fn encode(&self) -> Result<Vec<u8>> {
        let insert = self.action == PatchAction::Insert;
        let want = if insert {
            insert_vector_bytes(1, self.dim, self.dtype)
        } else {
            Some(0)
        };
        if want != Some(self.vector.len()) || (insert && self.dim == 0) {
            return Err(Error::arg(format!(
                "a patch's vector holds {} bytes for dimension {} ({})",
                self.vector.len(),
                self.dim,
                self.dtype
            )));
        }
        let bs = self.block_size as usize;
        if self.blocks.iter().any(|(_, b)| b.len() != bs) {
            return Err(Error::arg(format!(
                "a patch's block images must each hold {bs} bytes"
            )));
        }
        let count = u32::try_from(self.blocks.len())
            .map_err(|_| Error::arg("a patch holds too many blocks"))?;
        let mut out = Vec::with_capacity(32 + self.vector.len() + self.blocks.len() * (8 + bs));
        out.extend_from_slice(&[self.action.tag(), 0, 0, 0]);
        out.extend_from_slice(&self.internal.to_le_bytes());
        out.extend_from_slice(&self.external.to_le_bytes());
        let (dim, tag) = if insert {
            (self.dim, dtype_tag(self.dtype))
        } else {
            (0, 0)
        };
        out.extend_from_slice(&dim.to_le_bytes());
        out.extend_from_slice(&[tag, 0, 0, 0]);
        out.extend_from_slice(&self.vector);
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&self.block_size.to_le_bytes());
        for (b, img) in &self.blocks {
            out.extend_from_slice(&b.to_le_bytes());
            out.extend_from_slice(img);
        }
        Ok(out)
    }

    fn decode(p: &[u8]) -> std::result::Result<Patch, String> {
        if p.len() < 24 {
            return Err(format!(
                "a patch payload is {} bytes, shorter than its 24-byte head",
                p.len()
            ));
        }
        let action =
            PatchAction::from_tag(p[0]).ok_or_else(|| format!("unknown patch action {}", p[0]))?;
        if p[1..4] != [0, 0, 0] || p[21..24] != [0, 0, 0] {
            return Err("a patch's reserved bytes are not zero".into());
        }
        let internal = u32_at(p, 4);
        let external = u64_at(p, 8);
        let dim = u32_at(p, 16);
        let (dtype, vbytes) = if action == PatchAction::Insert {
            let dtype = dtype_from_tag(p[20])
                .ok_or_else(|| format!("unknown dtype tag {} in a patch", p[20]))?;
            if dim == 0 {
                return Err("an inserting patch has dimension 0".into());
            }
            let v = insert_vector_bytes(1, dim, dtype)
                .ok_or("an inserting patch's vector does not fit memory")?;
            (dtype, v)
        } else {
            if dim != 0 || p[20] != 0 {
                return Err("a patch that inserts nothing carries a vector".into());
            }
            (DType::F32, 0)
        };
        let at = 24usize
            .checked_add(vbytes)
            .filter(|&a| a + 8 <= p.len())
            .ok_or_else(|| format!("a patch of {} bytes is short for its vector", p.len()))?;
        let vector = p[24..at].to_vec();
        let count = u32_at(p, at) as usize;
        let bs = u32_at(p, at + 4) as usize;
        let body = &p[at + 8..];
        let each = bs.checked_add(8).ok_or("a patch's block size overflows")?;
        if bs == 0 || count.checked_mul(each) != Some(body.len()) {
            return Err(format!(
                "a patch of {count} blocks of {bs} bytes does not fit its {}-byte body",
                body.len()
            ));
        }
        let blocks = body
            .chunks_exact(each)
            .map(|c| (u64_at(c, 0), c[8..].to_vec()))
            .collect();
        Ok(Patch {
            action,
            internal,
            external,
            dim,
            dtype,
            vector,
            block_size: bs as u32,
            blocks,
        })
    }
}

impl Op {
    /// The record kind of this operation.
    pub fn kind(&self) -> u8 {
        match self {
            Op::Insert { .. } => kind::INSERT,
            Op::Delete { .. } => kind::DELETE,
            Op::Patch(_) => kind::PATCH,
        }
    }

    /// The record payload; refuses inconsistent shapes.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let count = |ids: &[u64]| {
            u32::try_from(ids.len()).map_err(|_| {
                Error::arg(format!(
                    "one log record holds at most {} ids, got {}",
                    u32::MAX,
                    ids.len()
                ))
            })
        };
        let out = match self {
            Op::Insert {
                ids,
                dim,
                dtype,
                vectors,
            } => {
                let n = count(ids)?;
                if *dim == 0 {
                    return Err(Error::arg("an insert's dimension must be at least 1"));
                }
                let want = insert_vector_bytes(ids.len(), *dim, *dtype);
                if want != Some(vectors.len()) {
                    return Err(Error::arg(format!(
                        "an insert of {} vectors of dimension {dim} ({dtype}) needs {} vector \
                         bytes, got {}",
                        ids.len(),
                        want.map_or("too many".to_string(), |w| w.to_string()),
                        vectors.len()
                    )));
                }
                let mut out = Vec::with_capacity(12 + 8 * ids.len() + vectors.len());
                out.extend_from_slice(&n.to_le_bytes());
                out.extend_from_slice(&dim.to_le_bytes());
                out.extend_from_slice(&[dtype_tag(*dtype), 0, 0, 0]);
                for id in ids {
                    out.extend_from_slice(&id.to_le_bytes());
                }
                out.extend_from_slice(vectors);
                out
            }
            Op::Delete { ids } => {
                let n = count(ids)?;
                let mut out = Vec::with_capacity(4 + 8 * ids.len());
                out.extend_from_slice(&n.to_le_bytes());
                for id in ids {
                    out.extend_from_slice(&id.to_le_bytes());
                }
                out
            }
            Op::Patch(p) => p.encode()?,
        };
        if out.len() > MAX_PAYLOAD as usize {
            return Err(Error::arg(format!(
                "the operation needs {} bytes; a log record holds at most {MAX_PAYLOAD}: split it",
                out.len()
            )));
        }
        Ok(out)
    }

    /// Decodes a record read from the log at `path`; a payload of the wrong
    /// shape or an unknown kind is [`Error::Corrupt`] naming the file, the
    /// record and its offset.
    pub fn decode(record: &Record, path: &Path) -> Result<Op> {
        Op::decode_payload(record.kind, &record.payload).map_err(|msg| {
            Error::corrupt(
                path,
                format!("record {} at offset {}: {msg}", record.seq, record.offset),
            )
        })
    }

    fn decode_payload(kind: u8, p: &[u8]) -> std::result::Result<Op, String> {
        let ids_at = |at: usize, n: usize| -> Vec<u64> {
            p[at..at + 8 * n]
                .chunks_exact(8)
                .map(|c| u64_at(c, 0))
                .collect()
        };
        match kind {
            kind::INSERT => {
                if p.len() < 12 {
                    return Err(format!(
                        "an insert payload is {} bytes, shorter than its 12-byte head",
                        p.len()
                    ));
                }
                let n = u32_at(p, 0) as usize;
                let dim = u32_at(p, 4);
                let dtype = dtype_from_tag(p[8])
                    .ok_or_else(|| format!("unknown dtype tag {} in an insert", p[8]))?;
                if p[9..12] != [0, 0, 0] {
                    return Err("an insert's reserved bytes 9..12 are not zero".into());
                }
                if dim == 0 {
                    return Err("an insert has dimension 0".into());
                }
                let want = insert_vector_bytes(n, dim, dtype)
                    .and_then(|v| n.checked_mul(8)?.checked_add(v)?.checked_add(12));
                if want != Some(p.len()) {
                    return Err(format!(
                        "an insert of {n} vectors of dimension {dim} ({dtype}) does not fit its \
                         {}-byte payload",
                        p.len()
                    ));
                }
                Ok(Op::Insert {
                    ids: ids_at(12, n),
                    dim,
                    dtype,
                    vectors: p[12 + 8 * n..].to_vec(),
                })
            }
            kind::DELETE => {
                if p.len() < 4 {
                    return Err(format!(
                        "a delete payload is {} bytes, shorter than its 4-byte count",
                        p.len()
                    ));
                }
                let n = u32_at(p, 0) as usize;
                if n.checked_mul(8).and_then(|b| b.checked_add(4)) != Some(p.len()) {
                    return Err(format!(
                        "a delete of {n} ids does not fit its {}-byte payload",
                        p.len()
                    ));
                }
                Ok(Op::Delete { ids: ids_at(4, n) })
            }
            kind::PATCH => Patch::decode(p).map(Op::Patch),
            other => Err(format!(
                "record kind {other} is neither an insert, a delete nor a patch"
            )),
        }
    }
}

/// Bytes of `n` vectors of `dim` elements of `dtype`, if it fits a usize.
fn insert_vector_bytes(n: usize, dim: u32, dtype: DType) -> Option<usize> {
    n.checked_mul(dim as usize)?.checked_mul(dtype.size())
}
