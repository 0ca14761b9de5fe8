//! Gorgeous' graph replication: which neighbours' adjacency lists each
//! record of a replicated layout carries.
//!
//! A record of node v has room for `per` packed lists (what its page leaves
//! after v's vector and list). The useful ones are those of the neighbours
//! the search is likely to expand right after v, its nearest. Each node's
//! neighbours are ranked by exact distance to it; slots are then filled in
//! rounds — every node's nearest neighbour first, then every node's second
//! — and a list already packed `cap` times is skipped, so no list (a hub's
//! above all) is replicated beyond a bound and the space goes to the many.

use crate::data::matrix::Matrix;
use crate::distance::Metric;
use crate::elem::Element;
use crate::format::ReplicationInfo;
use crate::graph::Graph;
use crate::{Error, Result};
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

fn check_cancel(cancel: &AtomicBool) -> Result<()> {
    if cancel.load(Ordering::Relaxed) {
        Err(Error::Cancelled)
    } else {
        Ok(())
    }
}

/// Marks an empty packed slot.
pub const NO_LIST: u32 = u32::MAX;

/// The lists each record packs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packing {
    /// Packed slots per record.
    pub per: usize,
    /// Most records any one list is packed into.
    pub cap: usize,
    /// `per` ids per node (`NO_LIST` for an empty slot).
    ids: Vec<u32>,
}

impl Packing {
    /// The ids packed into node `v`'s record, nearest first.
    pub fn of(&self, v: u32) -> impl Iterator<Item = u32> + '_ {
        let a = v as usize * self.per;
        self.ids[a..a + self.per]
            .iter()
            .copied()
            .take_while(|&u| u != NO_LIST)
    }

    /// Resident bytes.
    pub fn memory_bytes(&self) -> usize {
        self.ids.capacity() * 4
    }

    /// How the lists were spread (`plain_bytes`: the page file without
    /// packed lists).
    pub fn stats(&self, n: usize, plain_bytes: u64) -> ReplicationInfo {
        let mut count = vec![0u32; n];
        let mut packed = 0u64;
        for &u in &self.ids {
            if u != NO_LIST {
                count[u as usize] += 1;
                packed += 1;
            }
        }
        ReplicationInfo {
            packed: self.per,
            cap: self.cap,
            packed_lists: packed,
            mean_replicas: packed as f64 / n.max(1) as f64,
            max_replicas: count.iter().copied().max().unwrap_or(0),
            replicated_nodes: count.iter().filter(|&&c| c > 0).count() as u64,
            plain_bytes,
        }
    }
}

/// Nodes ranked per chunk of work (bounded so cancellation is prompt).
const CHUNK: usize = 16_384;

/// Chooses the packed lists of every record: `per` slots per record, each
/// list packed at most `cap` times (see the module docs).
pub fn choose<T: Element>(
    data: &Matrix<T>,
    graph: &Graph,
    metric: Metric,
    per: usize,
    cap: usize,
    cancel: &AtomicBool,
) -> Result<Packing> {
    let n = graph.n();
    let mut ids = vec![NO_LIST; n * per];
    if per == 0 || n == 0 {
        return Ok(Packing { per, cap, ids });
    }
    // Candidates per node: its nearest 2·per neighbours (a node whose
    // nearest lists are capped falls back on farther ones).
    let depth = 2 * per;
    let mut pref = vec![NO_LIST; n * depth];
    for (c, chunk) in pref.chunks_mut(CHUNK * depth).enumerate() {
        check_cancel(cancel)?;
        chunk
            .par_chunks_mut(depth)
            .enumerate()
            .for_each(|(i, out)| {
                let v = (c * CHUNK + i) as u32;
                let row = data.row(v as usize);
                let mut ranked: Vec<(f32, u32)> = graph
                    .neighbors(v)
                    .iter()
                    .filter(|&&u| u != v && (u as usize) < n)
                    .map(|&u| (metric.distance(row, data.row(u as usize)), u))
                    .collect();
                ranked.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                for (o, &(_, u)) in out.iter_mut().zip(&ranked) {
                    *o = u;
                }
            });
    }
    let mut filled = vec![0u32; n];
    let mut count = vec![0u32; n];
    for j in 0..depth {
        check_cancel(cancel)?;
        for v in 0..n {
            if filled[v] as usize >= per {
                continue;
            }
            let u = pref[v * depth + j];
            if u == NO_LIST || count[u as usize] as usize >= cap {
                continue;
            }
            ids[v * per + filled[v] as usize] = u;
            filled[v] += 1;
            count[u as usize] += 1;
        }
    }
    Ok(Packing { per, cap, ids })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_nearest_first_and_respects_the_cap() {
        // Points on a line; node 0 is everyone's neighbour (a hub).
        let n = 6;
        let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let m = Matrix::from_vec(data, n, 1).unwrap();
        let lists: Vec<Vec<u32>> = (0..n as u32)
            .map(|v| (0..n as u32).filter(|&u| u != v).collect())
            .collect();
        let mut g = Graph::new(n, n - 1);
        for (v, l) in lists.iter().enumerate() {
            g.set_neighbors(v as u32, l);
        }
        let p = choose(&m, &g, Metric::L2, 2, 2, &AtomicBool::new(false)).unwrap();
        let mut count = vec![0; n];
        for v in 0..n as u32 {
            let packed: Vec<u32> = p.of(v).collect();
            assert!(packed.len() <= 2);
            for &u in &packed {
                assert_ne!(u, v);
                assert!(g.neighbors(v).contains(&u));
                count[u as usize] += 1;
            }
        }
        assert!(count.iter().all(|&c| c <= 2), "{count:?}");
        // Node 2's nearest are 1 and 3, packed in that order (ties by id).
        assert_eq!(p.of(2).collect::<Vec<_>>(), vec![1, 3]);
        let s = p.stats(n, 0);
        assert_eq!(s.packed_lists as usize, count.iter().sum::<usize>());
        assert!(s.max_replicas <= 2);
    }

    use crate::format::page::PageGeometry;
    use crate::layout::placement::{AnyLayout, IdLayout, Layout};
    use crate::layout::writer::write_pages;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Over random graphs, vectors and page sizes: every record of the
        /// page file decodes to its node's vector and list, and every list it
        /// packs is exactly that neighbour's list in the graph (at most `cap`
        /// copies of each).
        #[test]
        fn replicated_pages_decode_to_the_graphs_lists(
            n in 2usize..120,
            r in 1usize..12,
            dim in 1usize..24,
            page_kib in 1usize..3,
            cap in 1usize..4,
            seed in any::<u64>(),
        ) {
            use rand::{Rng, SeedableRng};
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let data: Vec<f32> = (0..n * dim).map(|_| rng.random_range(-4.0f32..4.0)).collect();
            let m = Matrix::from_vec(data.clone(), n, dim).unwrap();
            let mut g = Graph::new(n, r);
            let mut lists = Vec::with_capacity(n);
            for v in 0..n as u32 {
                let deg = rng.random_range(0..=r.min(n - 1));
                let mut l: Vec<u32> = Vec::with_capacity(deg);
                while l.len() < deg {
                    let u = rng.random_range(0..n as u32);
                    if u != v && !l.contains(&u) {
                        l.push(u);
                    }
                }
                g.set_neighbors(v, &l);
                lists.push(l);
            }
            let page = page_kib * 4096;
            let mut per = 0;
            while PageGeometry::with_packed(page, dim * 4, r, per + 1, n)
                .is_ok_and(|geo| geo.records_per_block >= 1 && geo.block_size == page)
            {
                per += 1;
            }
            let geo = PageGeometry::with_packed(page, dim * 4, r, per, n).unwrap();
            let packing = choose(&m, &g, Metric::L2, per, cap, &AtomicBool::new(false)).unwrap();
            let id = IdLayout::new(geo, n);
            let layout = AnyLayout::Id(id);
            let tmp = tempfile::tempdir().unwrap();
            let path = tmp.path().join("pages.bin");
            write_pages(&path, &layout, &m, &g, Some(&packing), None, &AtomicBool::new(false)).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            prop_assert_eq!(bytes.len() as u64, geo.file_bytes());
            let mut copies = vec![0usize; n];
            for v in 0..n as u32 {
                let (b, slot) = id.locate(v);
                let off = geo.block_offset(b) as usize;
                let block = &bytes[off..off + geo.block_size];
                prop_assert!(id.verify(block, b).is_ok());
                let rec = id.record(block, slot).unwrap();
                prop_assert_eq!(rec.neighbours, lists[v as usize].as_slice());
                let want: Vec<u8> = data[v as usize * dim..(v as usize + 1) * dim]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect();
                prop_assert_eq!(rec.vector, want.as_slice());
                let packed = id.packed(block, slot).unwrap();
                let chosen: Vec<u32> = packing.of(v).collect();
                prop_assert_eq!(packed.len(), chosen.len());
                for (i, &u) in chosen.iter().enumerate() {
                    let (id, list) = packed.get(i).unwrap();
                    prop_assert_eq!(id, u);
                    prop_assert!(lists[v as usize].contains(&u));
                    prop_assert_eq!(list, lists[u as usize].as_slice());
                    copies[u as usize] += 1;
                }
            }
            prop_assert!(copies.iter().all(|&c| c <= cap));
        }
    }
}
