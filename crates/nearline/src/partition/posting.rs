//! The bytes of a posting: entries `[u32 id | u32 version | dim × f32]`
//! streamed over 4 KiB blocks, each block checksummed and naming its posting.
//!
//! # Block (4096 bytes, little-endian)
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `NLPB` |
//! | 4..8 | posting id (u32) |
//! | 8..12 | index of the block within its posting (u32) |
//! | 12..16 | CRC32C of bytes 0..12 and of the payload |
//! | 16..4096 | payload: the next [`PAYLOAD`] bytes of the posting's entry stream |
//!
//! A posting of `count` entries is `count × entry_bytes(dim)` bytes of
//! stream; its last block is zero past the end. The in-memory posting map
//! says which blocks (in order) and how many entries a posting holds; a
//! block that does not name the posting and position the map expects, or
//! fails its checksum, is corruption (blocks are written before the map
//! points at them and never rewritten while it does).
//!
//! An entry's version is the 32-bit little-endian word at bytes 4..8.
//! Indexes of format 1.5 and older wrote a version byte followed by three
//! zero bytes there, which reads as the same number.

use crate::{Error, Result};
use std::path::Path;

/// Bytes of a block.
pub const BLOCK: usize = 4096;
/// Bytes of a block's header.
pub const HEADER: usize = 16;
/// Bytes of entry stream a block carries.
pub const PAYLOAD: usize = BLOCK - HEADER;
/// Block magic.
pub const MAGIC: [u8; 4] = *b"NLPB";
/// Bytes before an entry's vector.
pub const ENTRY_HEAD: usize = 8;

/// Bytes of one entry of a `dim`-dimensional float vector.
#[inline]
pub fn entry_bytes(dim: usize) -> usize {
    ENTRY_HEAD + 4 * dim
}

/// Blocks a posting of `count` entries occupies.
#[inline]
pub fn blocks_for(count: usize, dim: usize) -> usize {
    (count * entry_bytes(dim)).div_ceil(PAYLOAD)
}

/// One decoded entry (the vector stays in the stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryHead {
    pub id: u32,
    pub version: u32,
}

/// Appends one entry to an entry stream.
pub fn push_entry(stream: &mut Vec<u8>, id: u32, version: u32, v: &[f32]) {
    stream.extend_from_slice(&id.to_le_bytes());
    stream.extend_from_slice(&version.to_le_bytes());
    for x in v {
        stream.extend_from_slice(&x.to_le_bytes());
    }
}

/// Entry `i` of a stream: its head and its vector (decoded into `out`).
#[inline]
pub fn read_entry(stream: &[u8], dim: usize, i: usize, out: &mut [f32]) -> EntryHead {
    let e = entry_bytes(dim);
    let b = &stream[i * e..(i + 1) * e];
    let id = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (o, c) in out.iter_mut().zip(b[ENTRY_HEAD..].chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    EntryHead {
        id,
        version: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
    }
}

/// The head of entry `i` alone.
#[inline]
pub fn entry_head(stream: &[u8], dim: usize, i: usize) -> EntryHead {
    let b = &stream[i * entry_bytes(dim)..];
    EntryHead {
        id: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        version: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
    }
}

fn crc(block: &[u8]) -> u32 {
    let c = crc32c::crc32c(&block[..12]);
    crc32c::crc32c_append(c, &block[HEADER..BLOCK])
}

/// Writes block `index` of posting `posting` into `out` (one [`BLOCK`]):
/// the first [`PAYLOAD`] bytes of `payload` (zero-padded).
pub fn encode_block(posting: u32, index: u32, payload: &[u8], out: &mut [u8]) {
    debug_assert_eq!(out.len(), BLOCK);
    out.fill(0);
    out[0..4].copy_from_slice(&MAGIC);
    out[4..8].copy_from_slice(&posting.to_le_bytes());
    out[8..12].copy_from_slice(&index.to_le_bytes());
    let n = payload.len().min(PAYLOAD);
    out[HEADER..HEADER + n].copy_from_slice(&payload[..n]);
    let c = crc(out);
    out[12..16].copy_from_slice(&c.to_le_bytes());
}

/// Decodes a run read from the file: `data` holds blocks `b0, b0+1, …`
/// (`len` of them), blocks `i0, i0+1, …` of posting `posting`; a block the
/// read came back short of is a truncated file.
pub fn decode_run(
    path: &Path,
    posting: u32,
    (b0, i0, len): (u32, u32, u32),
    data: &[u8],
    stream: &mut Vec<u8>,
) -> Result<()> {
    for j in 0..len as usize {
        let end = ((j + 1) * BLOCK).min(data.len());
        let blk = if j * BLOCK < data.len() {
            &data[j * BLOCK..end]
        } else {
            &[][..]
        };
        decode_block(path, b0 + j as u32, posting, i0 + j as u32, blk, stream)?;
    }
    Ok(())
}

/// Checks a block read for block `index` of posting `posting` at file
/// block `at` and appends its payload to `stream`.
pub fn decode_block(
    path: &Path,
    at: u32,
    posting: u32,
    index: u32,
    block: &[u8],
    stream: &mut Vec<u8>,
) -> Result<()> {
    if block.len() < BLOCK {
        return Err(Error::corrupt(
            path,
            format!("postings file is truncated: block {at} is missing"),
        ));
    }
    let block = &block[..BLOCK];
    if block[0..4] != MAGIC {
        return Err(Error::corrupt(
            path,
            format!("block {at} is not a posting block (bad magic)"),
        ));
    }
    let stored = u32::from_le_bytes([block[12], block[13], block[14], block[15]]);
    if stored != crc(block) {
        return Err(Error::corrupt(
            path,
            format!("block {at} fails its checksum"),
        ));
    }
    let p = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
    let i = u32::from_le_bytes([block[8], block[9], block[10], block[11]]);
    if p != posting || i != index {
        return Err(Error::corrupt(
            path,
            format!(
                "block {at} holds block {i} of posting {p}, expected block {index} of posting \
                 {posting}"
            ),
        ));
    }
    stream.extend_from_slice(&block[HEADER..]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_round_trips_over_blocks() {
        let dim = 300; // 1208-byte entries: they straddle block boundaries
        let mut s = Vec::new();
        let vs: Vec<Vec<f32>> = (0..9)
            .map(|i| (0..dim).map(|j| (i * dim + j) as f32 * 0.5).collect())
            .collect();
        for (i, v) in vs.iter().enumerate() {
            push_entry(&mut s, i as u32 * 7, i as u32 * 0x0101_0101, v);
        }
        let nb = blocks_for(vs.len(), dim);
        let mut back = Vec::new();
        let mut blk = vec![0u8; BLOCK];
        for b in 0..nb {
            encode_block(42, b as u32, &s[(b * PAYLOAD).min(s.len())..], &mut blk);
            decode_block(Path::new("x"), 9, 42, b as u32, &blk, &mut back).unwrap();
        }
        let mut out = vec![0f32; dim];
        for (i, v) in vs.iter().enumerate() {
            let h = read_entry(&back, dim, i, &mut out);
            assert_eq!(
                h,
                EntryHead {
                    id: i as u32 * 7,
                    version: i as u32 * 0x0101_0101
                }
            );
            assert_eq!(&out, v);
            assert_eq!(entry_head(&back, dim, i), h);
        }
    }

    #[test]
    fn an_old_entrys_version_byte_reads_as_the_same_version() {
        // Format 1.5: `[u32 id | u8 version | 3 zero | vector]`.
        let mut old = Vec::new();
        old.extend_from_slice(&9u32.to_le_bytes());
        old.extend_from_slice(&[0x7f, 0, 0, 0]);
        old.extend_from_slice(&1.5f32.to_le_bytes());
        let mut v = [0f32];
        assert_eq!(
            read_entry(&old, 1, 0, &mut v),
            EntryHead {
                id: 9,
                version: 0x7f
            }
        );
        assert_eq!(v, [1.5]);
    }

    #[test]
    fn damage_and_misplacement_are_detected() {
        let mut s = Vec::new();
        push_entry(&mut s, 1, 0, &[1.0, 2.0]);
        let mut blk = vec![0u8; BLOCK];
        encode_block(3, 0, &s, &mut blk);
        let mut out = Vec::new();
        let p = Path::new("postings.dat");
        // Wrong posting or position.
        assert!(decode_block(p, 0, 4, 0, &blk, &mut out).is_err());
        assert!(decode_block(p, 0, 3, 1, &blk, &mut out).is_err());
        // Any flipped byte.
        for at in [0, 5, 9, 13, 20, 4095] {
            let mut b = blk.clone();
            b[at] ^= 0x40;
            let e = decode_block(p, 0, 3, 0, &b, &mut out).unwrap_err();
            assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        }
        // Truncated.
        assert!(decode_block(p, 0, 3, 0, &blk[..100], &mut out).is_err());
        assert!(decode_block(p, 0, 3, 0, &blk, &mut out).is_ok());
    }
}
