//! The navigation-graph section (`nav_graph.bin`), little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `NLNV` |
//! | 4..8 | version (1) |
//! | 8..12 | element size in bytes |
//! | 12..16 | dim |
//! | 16..20 | count: sample nodes |
//! | 20..24 | R: degree bound |
//! | 24..28 | start: the sample node searches begin at (its medoid) |
//! | 28..32 | reserved (0) |
//! | | count × u32: base id of each sample node, strictly increasing |
//! | | count × u32: out-degree of each sample node (≤ R) |
//! | | count × R × u32: neighbour lists (sample-node indices; unused slots 0) |
//! | | count × dim elements: the sample's vectors (normalised for cosine) |

use super::section::{check_finite_elems, SectionReader, SectionWriter};
use crate::elem::Element;
use crate::graph::{Graph, NavGraph};
use crate::Result;
use std::path::Path;

/// Magic of the navigation-graph section.
pub const NAV_MAGIC: &[u8; 4] = b"NLNV";
/// Version of the navigation-graph section this code writes and reads.
pub const NAV_VERSION: u32 = 1;
/// Largest degree bound a section may declare.
const NAV_MAX_R: usize = 1024;

/// The section bytes of `g` (see the module documentation).
pub fn encode<T: Element>(g: &NavGraph<T>) -> Vec<u8> {
    let count = g.len();
    let r = g.r();
    let mut w = SectionWriter::new(NAV_MAGIC, NAV_VERSION);
    w.u32(std::mem::size_of::<T>() as u32);
    w.u32(g.dim() as u32);
    w.u32(count as u32);
    w.u32(r as u32);
    w.u32(g.start());
    w.u32(0);
    w.u32s(g.ids());
    for v in 0..count as u32 {
        w.u32(g.graph().degree(v) as u32);
    }
    let mut row = vec![0u32; r];
    for v in 0..count as u32 {
        let nb = g.graph().neighbors(v);
        row.iter_mut().for_each(|x| *x = 0);
        row[..nb.len()].copy_from_slice(nb);
        w.u32s(&row);
    }
    w.elems(g.vecs());
    w.bytes
}

/// Parses and checks a section for an index of `n` points of dimension
/// `dim`; `path` is named in errors.
pub fn decode<T: Element>(path: &Path, bytes: &[u8], dim: usize, n: usize) -> Result<NavGraph<T>> {
    let (mut r, _version) =
        SectionReader::open(path, "navigation graph", bytes, NAV_MAGIC, NAV_VERSION)?;
    let count = r.vector_header::<T>(dim, n)?;
    let deg = r.u32("R")? as usize;
    let start = r.u32("start")?;
    let _reserved = r.u32("reserved")?;
    if deg == 0 || deg > NAV_MAX_R {
        return Err(r.err(format!("R is {deg}, expected 1..={NAV_MAX_R}")));
    }
    if start as usize >= count {
        return Err(r.err(format!(
            "start node {start} is out of range (count {count})"
        )));
    }
    let expected = count
        .checked_mul(4 * (2 + deg))
        .and_then(|a| {
            count
                .checked_mul(dim * std::mem::size_of::<T>())
                .and_then(|b| a.checked_add(b))
        })
        .and_then(|a| a.checked_add(32));
    r.expect_len(expected)?;
    let ids = r.u32s(count, "ids")?;
    if let Some(i) = ids.iter().position(|&v| v as usize >= n) {
        return Err(r.err(format!("sample node {i} has base id {} ≥ n = {n}", ids[i])));
    }
    if let Some(i) = ids.windows(2).position(|w| w[0] >= w[1]) {
        return Err(r.err(format!(
            "base ids are not strictly increasing at sample node {}",
            i + 1
        )));
    }
    let degrees = r.u32s(count, "degrees")?;
    let adj = r.u32s(count * deg, "neighbours")?;
    let mut graph = Graph::new(count, deg);
    for v in 0..count {
        let dv = degrees[v] as usize;
        if dv > deg {
            return Err(r.err(format!("sample node {v} has degree {dv} > R = {deg}")));
        }
        let list = &adj[v * deg..v * deg + dv];
        if let Some(&bad) = list.iter().find(|&&u| u as usize >= count) {
            return Err(r.err(format!(
                "sample node {v} has neighbour {bad} ≥ count = {count}"
            )));
        }
        graph.set_neighbors(v as u32, list);
    }
    let vecs: Vec<T> = r.elems(count * dim, "vectors")?;
    check_finite_elems(&r, &vecs, dim)?;
    r.finish()?;
    NavGraph::from_parts(dim, ids, vecs, graph, start).map_err(|m| r.err(m))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::matrix::Matrix;
    use crate::distance::Metric;
    use crate::graph::vamana::tests::clustered;
    use crate::Error;
    use std::sync::atomic::AtomicBool;

    fn nav(n: usize, dim: usize, rate: f64, seed: u64) -> (Vec<f32>, NavGraph<f32>) {
        let data = clustered(n, dim, 8, 3);
        let m = Matrix::from_vec(data.clone(), n, dim).unwrap();
        let never = AtomicBool::new(false);
        let g = NavGraph::build(&m, Metric::L2, rate, seed, &never)
            .unwrap()
            .unwrap();
        (data, g)
    }

    #[test]
    fn deterministic_and_round_trips() {
        let (_, a) = nav(2000, 8, 0.02, 5);
        let (_, b) = nav(2000, 8, 0.02, 5);
        assert!(a == b, "same seed, same navigation graph");
        assert!(encode(&a) == encode(&b));
        let (_, c) = nav(2000, 8, 0.02, 6);
        assert_ne!(a.ids(), c.ids());
        let bytes = encode(&a);
        let back = decode::<f32>(Path::new("nav.bin"), &bytes, 8, 2000).unwrap();
        assert!(back == a, "round trip");
        assert!(a.memory_bytes() >= a.len() * (8 * 4 + 4));
    }

    #[test]
    fn damaged_sections_are_refused() {
        let (_, g) = nav(1000, 8, 0.05, 2);
        let bytes = encode(&g);
        let p = Path::new("nav.bin");
        let check = |b: &[u8], what: &str| {
            let e = decode::<f32>(p, b, 8, 1000).unwrap_err();
            assert!(matches!(e, Error::Corrupt { .. }), "{what}: {e}");
            e.to_string()
        };
        let e = check(&bytes[..bytes.len() - 7], "truncated");
        assert!(e.contains("truncated") || e.contains("implies"), "{e}");
        check(&bytes[..20], "header only");
        let mut b = bytes.clone();
        b[0] = b'X';
        assert!(check(&b, "magic").contains("magic"));
        // Wrong dimension for this index.
        assert!(decode::<f32>(p, &bytes, 9, 1000).is_err());
        // Wrong element type.
        assert!(decode::<u8>(p, &bytes, 8, 1000).is_err());
        // A base id past n.
        assert!(decode::<f32>(p, &bytes, 8, 10).is_err());
        // A neighbour index past the count.
        let mut b = bytes.clone();
        let count = g.len();
        let adj0 = 32 + count * 8;
        b[adj0..adj0 + 4].copy_from_slice(&(count as u32 + 5).to_le_bytes());
        let deg0 = 32 + count * 4;
        b[deg0..deg0 + 4].copy_from_slice(&1u32.to_le_bytes());
        assert!(check(&b, "neighbour").contains("neighbour"));
        // A degree over R.
        let mut b = bytes.clone();
        b[deg0..deg0 + 4].copy_from_slice(&999u32.to_le_bytes());
        assert!(check(&b, "degree").contains("degree"));
        // A NaN vector value.
        let mut b = bytes.clone();
        let last = b.len() - 4;
        b[last..].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(check(&b, "nan").contains("non-finite"));
        // A newer section version is a version error.
        let mut b = bytes.clone();
        b[4..8].copy_from_slice(&2u32.to_le_bytes());
        let e = decode::<f32>(p, &b, 8, 1000).unwrap_err();
        assert!(matches!(e, Error::Version { .. }), "{e}");
    }
}
