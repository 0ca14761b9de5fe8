//! The `adjacency` section (Gorgeous): every node's adjacency list, in the
//! order an adjacency cache takes them, so that an open loads the lists
//! its budget holds by reading a prefix instead of one page per node.
//!
//! Little-endian: magic `NLAJ`, version (1), node count n, degree bound R,
//! then n entries `[node id, degree, degree × neighbour id]`, each node
//! exactly once. The order is the build's priority (breadth-first from the
//! entry points). The manifest's CRC32C covers the whole file; a reader
//! streams it ([`Parser`]) and checks the checksum at the end.

use crate::{Error, Result};
use std::io::Write;
use std::path::Path;

/// Magic of the adjacency section.
pub const ADJACENCY_MAGIC: &[u8; 4] = b"NLAJ";
/// Version of the adjacency section this build writes and reads.
pub const ADJACENCY_VERSION: u32 = 1;
/// Bytes before the first entry.
pub const ADJACENCY_HEADER_BYTES: u64 = 16;

/// Section bytes for `n` nodes whose degrees sum to `edges`.
pub fn section_bytes(n: usize, edges: u64) -> u64 {
    ADJACENCY_HEADER_BYTES + 8 * n as u64 + 4 * edges
}

/// Writes the section: node ids in `order` (every node once), each with
/// the list `list(v)` gives.
pub fn write<'a, W: Write + ?Sized>(
    w: &mut W,
    n: usize,
    r: usize,
    order: &[u32],
    list: impl Fn(u32) -> &'a [u32],
) -> std::io::Result<()> {
    w.write_all(ADJACENCY_MAGIC)?;
    for x in [ADJACENCY_VERSION, n as u32, r as u32] {
        w.write_all(&x.to_le_bytes())?;
    }
    for &v in order {
        let l = list(v);
        w.write_all(&v.to_le_bytes())?;
        w.write_all(&(l.len() as u32).to_le_bytes())?;
        w.write_all(bytemuck::cast_slice(l))?;
    }
    Ok(())
}

/// A streaming reader of the section: bytes go in as chunks of any size
/// ([`Parser::feed`]), entries come out through a callback, every field is
/// checked (ids and neighbours below n, degrees at most R, each node once).
pub struct Parser {
    path: std::path::PathBuf,
    n: usize,
    r: usize,
    /// Bytes of an incomplete word or header carried to the next chunk.
    carry: Vec<u8>,
    /// The entry being read: its node, degree, and neighbours so far.
    node: Option<u32>,
    degree: Option<usize>,
    list: Vec<u32>,
    header: bool,
    entries: usize,
    seen: Vec<u64>,
}

impl Parser {
    /// A parser for the section at `path` of an index of `n` nodes with
    /// degree bound `r`.
    pub fn new(path: &Path, n: usize, r: usize) -> Self {
        Parser {
            path: path.to_path_buf(),
            n,
            r,
            carry: Vec::new(),
            node: None,
            degree: None,
            list: Vec::with_capacity(r),
            header: false,
            entries: 0,
            seen: vec![0; n.div_ceil(64)],
        }
    }

    fn corrupt(&self, msg: impl Into<String>) -> Error {
        Error::corrupt(&self.path, format!("adjacency section: {}", msg.into()))
    }

    /// Reads the header from 16 bytes.
    fn read_header(&mut self, b: &[u8]) -> Result<()> {
        if &b[..4] != ADJACENCY_MAGIC {
            return Err(self.corrupt(format!(
                "starts with {:02x?}, expected the magic \"NLAJ\"",
                &b[..4]
            )));
        }
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let (version, n, r) = (word(4), word(8) as usize, word(12) as usize);
        if version == 0 || version > ADJACENCY_VERSION {
            return Err(Error::Version {
                path: self.path.clone(),
                msg: format!(
                    "adjacency section version {version}; this build reads up to {ADJACENCY_VERSION}"
                ),
            });
        }
        if n != self.n || r != self.r {
            return Err(self.corrupt(format!(
                "written for {n} nodes of degree ≤ {r}; the index has {} nodes of degree ≤ {}",
                self.n, self.r
            )));
        }
        self.header = true;
        Ok(())
    }

    /// Feeds the next bytes of the section; `entry(v, list)` receives each
    /// complete entry.
    pub fn feed(&mut self, mut bytes: &[u8], entry: &mut dyn FnMut(u32, &[u32])) -> Result<()> {
        if !self.header {
            let need = ADJACENCY_HEADER_BYTES as usize - self.carry.len();
            let take = need.min(bytes.len());
            self.carry.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.carry.len() < ADJACENCY_HEADER_BYTES as usize {
                return Ok(());
            }
            let h = std::mem::take(&mut self.carry);
            self.read_header(&h)?;
        }
        // Complete a word split across chunks.
        if !self.carry.is_empty() {
            let take = (4 - self.carry.len()).min(bytes.len());
            self.carry.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.carry.len() < 4 {
                return Ok(());
            }
            let w =
                u32::from_le_bytes([self.carry[0], self.carry[1], self.carry[2], self.carry[3]]);
            self.carry.clear();
            self.word(w, entry)?;
        }
        let whole = bytes.len() / 4 * 4;
        for c in bytes[..whole].chunks_exact(4) {
            self.word(u32::from_le_bytes([c[0], c[1], c[2], c[3]]), entry)?;
        }
        self.carry.extend_from_slice(&bytes[whole..]);
        Ok(())
    }

    #[inline]
    fn word(&mut self, w: u32, entry: &mut dyn FnMut(u32, &[u32])) -> Result<()> {
        match (self.node, self.degree) {
            (None, _) => {
                let v = w as usize;
                if v >= self.n {
                    return Err(self.corrupt(format!(
                        "entry {} is for node {v}, but the index has {} nodes",
                        self.entries, self.n
                    )));
                }
                if self.seen[v / 64] & (1 << (v % 64)) != 0 {
                    return Err(self.corrupt(format!("node {v} appears twice")));
                }
                self.seen[v / 64] |= 1 << (v % 64);
                self.node = Some(w);
            }
            (Some(v), None) => {
                let d = w as usize;
                if d > self.r {
                    return Err(self.corrupt(format!(
                        "node {v} has degree {d}, above the index's bound {}",
                        self.r
                    )));
                }
                self.degree = Some(d);
                self.list.clear();
                if d == 0 {
                    self.emit(entry);
                }
            }
            (Some(v), Some(d)) => {
                if w as usize >= self.n {
                    return Err(self.corrupt(format!(
                        "node {v} lists neighbour {w}, but the index has {} nodes",
                        self.n
                    )));
                }
                self.list.push(w);
                if self.list.len() == d {
                    self.emit(entry);
                }
            }
        }
        Ok(())
    }

    fn emit(&mut self, entry: &mut dyn FnMut(u32, &[u32])) {
        if let Some(v) = self.node.take() {
            entry(v, &self.list);
        }
        self.degree = None;
        self.entries += 1;
    }

    /// Checks the section ended after its last entry.
    pub fn finish(&self) -> Result<()> {
        if !self.header {
            return Err(self.corrupt("shorter than its header"));
        }
        if self.node.is_some() || !self.carry.is_empty() {
            return Err(self.corrupt("ends inside an entry"));
        }
        if self.entries != self.n {
            return Err(self.corrupt(format!(
                "holds {} entries, the index has {} nodes",
                self.entries, self.n
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(n: usize, r: usize, lists: &[Vec<u32>], order: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        write(&mut out, n, r, order, |v| &lists[v as usize]).unwrap();
        out
    }

    fn parse(bytes: &[u8], n: usize, r: usize, chunk: usize) -> Result<Vec<(u32, Vec<u32>)>> {
        let mut p = Parser::new(Path::new("adjacency.bin"), n, r);
        let mut got = Vec::new();
        for c in bytes.chunks(chunk.max(1)) {
            p.feed(c, &mut |v, l| got.push((v, l.to_vec())))?;
        }
        p.finish()?;
        Ok(got)
    }

    #[test]
    fn round_trips_in_any_chunking() {
        let lists = vec![vec![1, 2], vec![], vec![0, 1, 3], vec![2]];
        let order = [2u32, 0, 3, 1];
        let b = encode(4, 3, &lists, &order);
        assert_eq!(b.len() as u64, section_bytes(4, 6));
        for chunk in [1, 3, 4, 5, 7, 1000] {
            let got = parse(&b, 4, 3, chunk).unwrap();
            let want: Vec<_> = order
                .iter()
                .map(|&v| (v, lists[v as usize].clone()))
                .collect();
            assert_eq!(got, want, "chunk {chunk}");
        }
    }

    #[test]
    fn damage_is_an_error() {
        let lists = vec![vec![1], vec![0]];
        let b = encode(2, 2, &lists, &[0, 1]);
        // Truncated anywhere.
        for cut in 0..b.len() {
            assert!(parse(&b[..cut], 2, 2, 5).is_err(), "cut {cut}");
        }
        // Wrong node count / degree bound.
        assert!(parse(&b, 3, 2, 8).is_err());
        assert!(parse(&b, 2, 1, 8).is_err());
        // Node out of range, duplicate node, degree above R, bad neighbour.
        let mut bad = b.clone();
        bad[16] = 9;
        assert!(parse(&bad, 2, 2, 8).is_err());
        let dup = encode(2, 2, &lists, &[0, 0]);
        assert!(parse(&dup, 2, 2, 8).is_err());
        let mut bad = b.clone();
        bad[20] = 3;
        assert!(parse(&bad, 2, 2, 8).is_err());
        let mut bad = b.clone();
        bad[24] = 7;
        assert!(parse(&bad, 2, 2, 8).is_err());
        let mut bad = b;
        bad[0] = b'X';
        assert!(parse(&bad, 2, 2, 8).is_err());
    }
}
