//! Small binary sections (navigation graph, centroid entries): a fixed
//! header of little-endian u32 fields after a 4-byte magic, then arrays.
//!
//! [`SectionReader`] turns every short read, bad magic or unknown version
//! into a [`crate::Error`] naming the file and the field, so a damaged or
//! truncated section never panics.

use crate::elem::Element;
use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// Appends little-endian values to a byte buffer.
#[derive(Debug, Default)]
pub struct SectionWriter {
    pub bytes: Vec<u8>,
}

impl SectionWriter {
    /// A writer starting with `magic` and `version`.
    pub fn new(magic: &[u8; 4], version: u32) -> Self {
        let mut w = SectionWriter { bytes: Vec::new() };
        w.bytes.extend_from_slice(magic);
        w.u32(version);
        w
    }
    /// Appends a u32.
    pub fn u32(&mut self, v: u32) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    /// Appends u32 values.
    pub fn u32s(&mut self, vs: &[u32]) {
        for &v in vs {
            self.u32(v);
        }
    }
    /// Appends elements in their little-endian byte form.
    pub fn elems<T: Element>(&mut self, vs: &[T]) {
        self.bytes.extend_from_slice(bytemuck::cast_slice(vs));
    }
}

/// Reads a section written by [`SectionWriter`], with checked bounds.
pub struct SectionReader<'a> {
    path: PathBuf,
    what: &'static str,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> SectionReader<'a> {
    /// Checks the magic and the version (at most `max_version`); returns the
    /// reader positioned after them and the version found.
    pub fn open(
        path: &Path,
        what: &'static str,
        bytes: &'a [u8],
        magic: &[u8; 4],
        max_version: u32,
    ) -> Result<(Self, u32)> {
        let mut r = SectionReader {
            path: path.to_path_buf(),
            what,
            bytes,
            pos: 0,
        };
        let m = r.take(4, "magic")?;
        if m != magic {
            return Err(Error::corrupt(
                path,
                format!(
                    "{what} section starts with {m:02x?}, expected the magic {:?}",
                    String::from_utf8_lossy(magic)
                ),
            ));
        }
        let version = r.u32("version")?;
        if version == 0 || version > max_version {
            return Err(Error::Version {
                path: path.to_path_buf(),
                msg: format!(
                    "{what} section version {version} is not one this reader knows (1..={max_version}); upgrade nearline to open it"
                ),
            });
        }
        Ok((r, version))
    }

    /// The next `len` bytes, or a corruption error naming `field`.
    pub fn take(&mut self, len: usize, field: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(len).filter(|&e| e <= self.bytes.len());
        match end {
            Some(end) => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(Error::corrupt(
                &self.path,
                format!(
                    "{} section is truncated: field {field:?} needs {len} bytes at offset {}, the section has {}",
                    self.what,
                    self.pos,
                    self.bytes.len()
                ),
            )),
        }
    }

    /// The next u32.
    pub fn u32(&mut self, field: &str) -> Result<u32> {
        let b = self.take(4, field)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The next `count` u32 values.
    pub fn u32s(&mut self, count: usize, field: &str) -> Result<Vec<u32>> {
        let len = count
            .checked_mul(4)
            .ok_or_else(|| self.err(format!("field {field:?}: {count} values overflow")))?;
        let b = self.take(len, field)?;
        Ok(b.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// The next `count` elements of `T`.
    pub fn elems<T: Element>(&mut self, count: usize, field: &str) -> Result<Vec<T>> {
        let esz = std::mem::size_of::<T>();
        let len = count
            .checked_mul(esz)
            .ok_or_else(|| self.err(format!("field {field:?}: {count} values overflow")))?;
        let b = self.take(len, field)?;
        Ok(b.chunks_exact(esz)
            .map(bytemuck::pod_read_unaligned::<T>)
            .collect())
    }

    /// Reads the vector header shared by entry-point sections (element size,
    /// dimension, count) and checks it against an index of `n` points of
    /// dimension `dim` and element type `T`; returns the count.
    pub fn vector_header<T: Element>(&mut self, dim: usize, n: usize) -> Result<usize> {
        let esz = self.u32("element size")? as usize;
        let d = self.u32("dim")? as usize;
        let count = self.u32("count")? as usize;
        if esz != std::mem::size_of::<T>() || d != dim {
            return Err(self.err(format!(
                "holds {d}-d vectors of {esz}-byte elements; the index has {dim}-d {}",
                T::DTYPE
            )));
        }
        if count == 0 || count > n {
            return Err(self.err(format!(
                "count is {count}, expected 1..={n} (the index's points)"
            )));
        }
        Ok(count)
    }

    /// Fails unless the section is exactly `expected` bytes long (`None`: the
    /// size its header implies overflows).
    pub fn expect_len(&self, expected: Option<usize>) -> Result<()> {
        if expected != Some(self.bytes.len()) {
            return Err(self.err(format!(
                "has {} bytes, its header implies {} (truncated or damaged)",
                self.bytes.len(),
                expected.map_or_else(|| "an overflowing size".to_string(), |e| e.to_string())
            )));
        }
        Ok(())
    }

    /// Fails unless every byte was consumed.
    pub fn finish(&self) -> Result<()> {
        if self.pos != self.bytes.len() {
            return Err(self.err(format!(
                "{} trailing bytes after the last field (expected {} bytes in all)",
                self.bytes.len() - self.pos,
                self.pos
            )));
        }
        Ok(())
    }

    /// A corruption error about this section.
    pub fn err(&self, msg: impl Into<String>) -> Error {
        Error::corrupt(&self.path, format!("{} section: {}", self.what, msg.into()))
    }
}

/// Fails when a float element is NaN or infinite (integer types always pass).
pub fn check_finite_elems<T: Element>(r: &SectionReader<'_>, vecs: &[T], dim: usize) -> Result<()> {
    if let Some(i) = vecs.iter().position(|x| !x.to_f32().is_finite()) {
        return Err(r.err(format!(
            "vector {} holds a non-finite value at column {}",
            i / dim.max(1),
            i % dim.max(1)
        )));
    }
    Ok(())
}

/// The external-ids section (`ids.bin`): one u64 little-endian per node.
pub fn encode_ids(ids: &[u64]) -> Vec<u8> {
    ids.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Parses the external-ids section of an index of `n` nodes.
pub fn decode_ids(path: &Path, bytes: &[u8], n: usize) -> Result<Vec<u64>> {
    if Some(bytes.len()) != n.checked_mul(8) {
        return Err(Error::corrupt(
            path,
            format!("{} bytes of ids, expected 8 × n = 8 × {n}", bytes.len()),
        ));
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect())
}

/// Checks a section read whole against its manifest entry: its length and,
/// when it has one, its CRC32C.
pub fn check(
    path: &Path,
    name: &str,
    info: &super::manifest::SectionInfo,
    bytes: &[u8],
) -> Result<()> {
    if bytes.len() as u64 != info.bytes {
        return Err(size_error(path, name, bytes.len() as u64, info.bytes));
    }
    if let Some(crc) = info.crc32c {
        let got = crc32c::crc32c(bytes);
        if got != crc {
            return Err(Error::corrupt(
                path,
                format!("section {name:?} fails its CRC32C check (expected {crc:#010x}, got {got:#010x})"),
            ));
        }
    }
    Ok(())
}

/// The error for a section whose size is not what the manifest says.
pub fn size_error(path: &Path, name: &str, got: u64, want: u64) -> Error {
    Error::corrupt(
        path,
        format!(
            "section {name:?} has {got} bytes, the manifest says {want} (truncated or replaced)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors() {
        let mut w = SectionWriter::new(b"TEST", 1);
        w.u32(7);
        w.u32s(&[1, 2, 3]);
        w.elems(&[1.5f32, -2.0]);
        let p = Path::new("x.bin");
        let (mut r, v) = SectionReader::open(p, "test", &w.bytes, b"TEST", 1).unwrap();
        assert_eq!(v, 1);
        assert_eq!(r.u32("a").unwrap(), 7);
        assert_eq!(r.u32s(3, "b").unwrap(), vec![1, 2, 3]);
        assert_eq!(r.elems::<f32>(2, "c").unwrap(), vec![1.5, -2.0]);
        r.finish().unwrap();
        let e = r.u32("d").unwrap_err().to_string();
        assert!(e.contains("truncated") && e.contains("\"d\""), "{e}");

        let e = SectionReader::open(p, "test", &w.bytes, b"NOPE", 1)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("magic"), "{e}");
        let e = SectionReader::open(p, "test", &w.bytes[..6], b"TEST", 1)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("truncated"), "{e}");
        let w2 = SectionWriter::new(b"TEST", 9);
        let e = SectionReader::open(p, "test", &w2.bytes, b"TEST", 1)
            .err()
            .unwrap();
        assert!(matches!(e, Error::Version { .. }), "{e}");
        let (mut r, _) = SectionReader::open(p, "test", &w.bytes, b"TEST", 1).unwrap();
        r.u32("a").unwrap();
        assert!(r.finish().unwrap_err().to_string().contains("trailing"));
        let (mut r, _) = SectionReader::open(p, "test", &w.bytes, b"TEST", 1).unwrap();
        assert!(r.u32s(usize::MAX / 2, "huge").is_err());
    }
}
