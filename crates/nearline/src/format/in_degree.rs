//! The `in_degree` section of a coded layout (AlayaLaser), little-endian:
//! magic `NLIN`, version (1), node count, count of ids stored, then the ids
//! of the nodes by decreasing in-degree (ties by id), the order an
//! in-degree cache takes whole records in. Only the first
//! [`IN_DEGREE_STORED_SHARE`] of the nodes are stored: no cache holds more.

use super::section::{SectionReader, SectionWriter};
use crate::{Error, Result};
use std::path::Path;

/// Magic of the in-degree section.
pub const IN_DEGREE_MAGIC: &[u8; 4] = b"NLIN";
/// Version this build writes and reads.
pub const IN_DEGREE_VERSION: u32 = 1;
/// Share of the nodes the section lists (an in-degree cache takes at most
/// 15% of them; the rest would never be read).
pub const IN_DEGREE_STORED_SHARE: f64 = 0.25;

/// Ids of the nodes with the highest in-degree, most listed first (ties by
/// id), at most `limit` of them, from each node's adjacency list.
pub fn order<'a>(n: usize, lists: impl Iterator<Item = &'a [u32]>, limit: usize) -> Vec<u32> {
    let mut deg = vec![0u32; n];
    for list in lists {
        for &u in list {
            if let Some(d) = deg.get_mut(u as usize) {
                *d += 1;
            }
        }
    }
    let mut ids: Vec<u32> = (0..n as u32).collect();
    ids.sort_unstable_by(|&a, &b| deg[b as usize].cmp(&deg[a as usize]).then(a.cmp(&b)));
    ids.truncate(limit.min(n));
    ids
}

/// The section bytes for the order `ids` of an index of `n` nodes.
pub fn encode(n: usize, ids: &[u32]) -> Vec<u8> {
    let mut w = SectionWriter::new(IN_DEGREE_MAGIC, IN_DEGREE_VERSION);
    w.u32(n as u32);
    w.u32(ids.len() as u32);
    w.u32s(ids);
    w.bytes
}

/// The order stored in a section of an index of `n` nodes: every id below
/// `n`, none twice.
pub fn decode(path: &Path, bytes: &[u8], n: usize) -> Result<Vec<u32>> {
    let (mut r, _) =
        SectionReader::open(path, "in-degree", bytes, IN_DEGREE_MAGIC, IN_DEGREE_VERSION)?;
    let nodes = r.u32("node count")? as usize;
    let count = r.u32("count")? as usize;
    if nodes != n || count > n {
        return Err(Error::corrupt(
            path,
            format!("in-degree section lists {count} of {nodes} nodes; the index has {n} nodes"),
        ));
    }
    r.expect_len(count.checked_mul(4).and_then(|b| b.checked_add(16)))?;
    let ids = r.u32s(count, "ids")?;
    r.finish()?;
    // Checked on a sorted copy: memory in the ids' count, not in n.
    if let Some(&v) = ids.iter().find(|&&v| v as usize >= n) {
        return Err(Error::corrupt(
            path,
            format!("in-degree section lists node {v}, but the index has {n} nodes"),
        ));
    }
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::corrupt(
            path,
            format!("in-degree section lists node {} twice", w[0]),
        ));
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_round_trips_and_bad_sections_are_refused() {
        let lists: Vec<Vec<u32>> = vec![vec![1, 2], vec![2], vec![1, 3], vec![2]];
        let o = order(4, lists.iter().map(|l| l.as_slice()), 3);
        // In-degrees: 0 → 0, 1 → 2, 2 → 3, 3 → 1.
        assert_eq!(o, vec![2, 1, 3]);
        let path = Path::new("in_degree.bin");
        let b = encode(4, &o);
        assert_eq!(decode(path, &b, 4).unwrap(), o);
        assert!(decode(path, &b, 5).is_err());
        assert!(decode(path, &b[..b.len() - 1], 4).is_err());
        let mut dup = b.clone();
        dup[16..20].copy_from_slice(&1u32.to_le_bytes());
        let e = decode(path, &dup, 4).unwrap_err().to_string();
        assert!(e.contains("twice"), "{e}");
        let mut out = b.clone();
        out[16..20].copy_from_slice(&9u32.to_le_bytes());
        let e = decode(path, &out, 4).unwrap_err().to_string();
        assert!(e.contains("has 4 nodes"), "{e}");
    }
}
