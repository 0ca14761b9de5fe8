//! Entry-point selection: where a query's best-first search starts.
//!
//! Executors only call [`EntryPoints::seeds`]; the kinds behind it:
//!
//! * **medoid** (DiskANN): every query starts from the medoid.
//! * **sampled**: the vectors of N nodes sampled at open time are held in
//!   memory; a query starts from the nearest one (exact distance).
//! * **nav** (Starling §4.2, PipeANN): a small Vamana graph over a ~1%
//!   sample, built with the index ([`crate::graph::nav`]); a best-first
//!   search in it (exact distances, no I/O) gives the `n` nearest sample
//!   nodes as seeds, nearest first.
//! * **centroids** (AlayaLaser): k-means over a sample at build time; the
//!   node nearest to each centroid is kept with its vector. A query scans
//!   them all and starts from the nearest plus the medoid (the global entry).

use super::stats::QueryStats;
use crate::distance::Metric;
use crate::elem::Element;
use crate::graph::nav::NavGraph;
use crate::graph::SearchScratch;
use crate::layout::{AnyLayout, RecordReader};
use crate::Result;
use rand::SeedableRng;
use std::cell::RefCell;
use std::path::Path;

/// Largest number of navigation-graph seeds accepted.
pub const MAX_NAV_SEEDS: usize = 256;
/// Largest navigation-graph list size accepted.
pub const MAX_NAV_L: usize = 4096;

/// The entry points an open index uses (resolved by the planner; no
/// `auto` here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryPlan {
    /// Every query starts from the medoid.
    Medoid,
    /// `count` sampled nodes held in memory.
    Sampled { count: usize },
    /// The navigation graph, searched with list size `l` for `seeds` seeds.
    Nav { l: usize, seeds: usize },
    /// The centroid entries.
    Centroids,
}

impl EntryPlan {
    /// `"medoid"`, `"sampled"`, `"nav"` or `"centroids"`.
    pub fn name(&self) -> &'static str {
        match self {
            EntryPlan::Medoid => "medoid",
            EntryPlan::Sampled { .. } => "sampled",
            EntryPlan::Nav { .. } => "nav",
            EntryPlan::Centroids => "centroids",
        }
    }
}

/// Reads the vectors of `count` nodes sampled uniformly (deterministically
/// for `seed`) from the page file. Returns their ids and row-major vectors.
pub fn load_sampled_entries<T: Element>(
    path: &Path,
    layout: &AnyLayout,
    n: usize,
    count: usize,
    seed: u64,
) -> Result<(Vec<u32>, Vec<T>)> {
    let count = count.min(n);
    if count == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x454e_5452_5950_5453);
    let mut ids: Vec<u32> = rand::seq::index::sample(&mut rng, n, count)
        .into_iter()
        .map(|i| i as u32)
        .collect();
    ids.sort_unstable();
    let geo = layout.geometry();
    let mut reader = RecordReader::open(path, layout)?;
    let dim = geo.stored_vector_bytes() / std::mem::size_of::<T>();
    let mut vecs: Vec<T> = Vec::with_capacity(count * dim);
    for &v in &ids {
        let x = reader.vector(v)?;
        vecs.extend(
            x.chunks_exact(std::mem::size_of::<T>())
                .map(bytemuck::pod_read_unaligned::<T>),
        );
    }
    Ok((ids, vecs))
}

/// Nodes held in memory with their vectors; a query starts from the
/// nearest (exact distance).
#[derive(Debug, Clone, PartialEq)]
pub struct EntrySet<T: Element> {
    pub dim: usize,
    pub ids: Vec<u32>,
    /// Row-major `ids.len() × dim`.
    pub vecs: Vec<T>,
}

impl<T: Element> EntrySet<T> {
    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.ids.len()
    }
    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
    /// The node nearest to `q` (ties: the earlier one) with its exact
    /// internal distance, or `None` when empty.
    pub fn nearest(&self, metric: Metric, q: &[T]) -> Option<(f32, u32)> {
        let mut best: Option<(f32, u32)> = None;
        for (i, v) in self.vecs.chunks_exact(self.dim).enumerate() {
            let d = metric.distance(q, v);
            if best.is_none_or(|b| d < b.0) {
                best = Some((d, self.ids[i]));
            }
        }
        best
    }
    /// Bytes held in memory.
    pub fn memory_bytes(&self) -> usize {
        self.ids.capacity() * 4 + self.vecs.capacity() * std::mem::size_of::<T>()
    }
}

thread_local! {
    /// Per-thread scratch of navigation-graph searches (a visited set sized
    /// to the sample): the search threads are long-lived workers.
    static NAV_SCRATCH: RefCell<SearchScratch> = RefCell::new(SearchScratch::new());
}

/// The entry points of an open index: where each query's search starts.
/// Executors ask only for `seeds`; how they are chosen stays here.
#[derive(Debug, Clone)]
pub enum EntryPoints<T: Element> {
    /// DiskANN: every query starts from the medoid.
    Medoid(u32),
    /// Sampled nodes held in memory: a query starts from the nearest one
    /// (exact distance), which skips the first hops from the medoid.
    Sampled { medoid: u32, set: EntrySet<T> },
    /// The navigation graph: the `seeds` nearest sample nodes found by a
    /// best-first search with list size `l`.
    Nav {
        medoid: u32,
        nav: NavGraph<T>,
        l: usize,
        seeds: usize,
    },
    /// AlayaLaser: the node nearest the query among those nearest each
    /// k-means centroid, plus the medoid.
    Centroids { medoid: u32, set: EntrySet<T> },
}

impl<T: Element> EntryPoints<T> {
    /// Appends the nodes the search of `q` (already converted to the
    /// index's element type) starts from to `out`, best first, and the
    /// nodes whose exact distance the choice computed in memory and found
    /// nearest to `found` as (exact internal distance, node): the entry
    /// point for sampled and centroid entries, the navigation search's final
    /// list for the navigation graph. Those are results the disk search
    /// need not read (Starling starts its result set with its entry points).
    /// Returns the exact internal distance of the nearest entry point when
    /// one was computed (every kind but the medoid computes them in memory).
    pub fn seeds(
        &self,
        metric: Metric,
        q: &[T],
        out: &mut Vec<u32>,
        found: &mut Vec<(f32, u32)>,
        st: &mut QueryStats,
    ) -> Option<f32> {
        match self {
            EntryPoints::Medoid(m) => {
                out.push(*m);
                None
            }
            EntryPoints::Sampled { medoid, set } => {
                st.exact_distances += set.len() as u32;
                match set.nearest(metric, q) {
                    Some((d, v)) => {
                        out.push(v);
                        found.push((d, v));
                        Some(d)
                    }
                    None => {
                        out.push(*medoid);
                        None
                    }
                }
            }
            EntryPoints::Nav {
                medoid,
                nav,
                l,
                seeds,
            } => {
                let before = out.len();
                let (computed, nearest) = NAV_SCRATCH.with(|s| match s.try_borrow_mut() {
                    Ok(mut s) => nav.search(&mut s, metric, q, *l, *seeds, out, found),
                    Err(_) => {
                        nav.search(&mut SearchScratch::new(), metric, q, *l, *seeds, out, found)
                    }
                });
                st.exact_distances += computed;
                if out.len() == before {
                    out.push(*medoid);
                }
                nearest
            }
            EntryPoints::Centroids { medoid, set } => {
                let best = set.nearest(metric, q);
                st.exact_distances += set.len() as u32;
                if let Some((d, b)) = best {
                    out.push(b);
                    found.push((d, b));
                }
                if best.map(|b| b.1) != Some(*medoid) {
                    out.push(*medoid);
                }
                best.map(|b| b.0)
            }
        }
    }

    /// The resolved plan of these entry points.
    pub fn plan(&self) -> EntryPlan {
        match self {
            EntryPoints::Medoid(_) => EntryPlan::Medoid,
            EntryPoints::Sampled { set, .. } => EntryPlan::Sampled { count: set.len() },
            EntryPoints::Nav { l, seeds, .. } => EntryPlan::Nav {
                l: *l,
                seeds: *seeds,
            },
            EntryPoints::Centroids { .. } => EntryPlan::Centroids,
        }
    }

    /// Bytes held in memory.
    pub fn memory_bytes(&self) -> usize {
        match self {
            EntryPoints::Medoid(_) => 0,
            EntryPoints::Sampled { set, .. } | EntryPoints::Centroids { set, .. } => {
                set.memory_bytes()
            }
            EntryPoints::Nav { nav, .. } => nav.memory_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::matrix::Matrix;
    use crate::graph::vamana::tests::clustered;

    #[test]
    fn seeds_of_each_kind() {
        let (n, dim) = (2000, 8);
        let data = clustered(n, dim, 6, 1);
        let m = Matrix::from_vec(data.clone(), n, dim).unwrap();
        // Twelve entry nodes, one per 166 rows.
        let ids: Vec<u32> = (0..12).map(|i| i * 166 + 3).collect();
        let vecs: Vec<f32> = ids
            .iter()
            .flat_map(|&v| data[v as usize * dim..(v as usize + 1) * dim].to_vec())
            .collect();
        let set = EntrySet { dim, ids, vecs };
        let q = &data[5 * dim..6 * dim];
        let medoid = 17u32;
        let mut st = QueryStats::default();
        let mut out = Vec::new();
        let c = EntryPoints::Centroids {
            medoid,
            set: set.clone(),
        };
        let mut found = Vec::new();
        let d0 = c.seeds(Metric::L2, q, &mut out, &mut found, &mut st);
        let (dn, nearest) = set.nearest(Metric::L2, q).unwrap();
        assert_eq!(out, vec![nearest, medoid]);
        assert_eq!(d0, Some(dn));
        assert_eq!(found, vec![(dn, nearest)]);
        assert_eq!(
            dn,
            Metric::L2.distance(
                q,
                &data[nearest as usize * dim..(nearest as usize + 1) * dim]
            )
        );
        let mut medoid_out = Vec::new();
        let mut medoid_found = Vec::new();
        assert_eq!(
            EntryPoints::<f32>::Medoid(medoid).seeds(
                Metric::L2,
                q,
                &mut medoid_out,
                &mut medoid_found,
                &mut st
            ),
            None,
            "the medoid's distance is not computed in memory"
        );
        assert_eq!(medoid_out, vec![medoid]);
        assert!(medoid_found.is_empty());
        assert_eq!(st.exact_distances, 12);
        assert_eq!(c.plan(), EntryPlan::Centroids);
        let never = std::sync::atomic::AtomicBool::new(false);
        let nav = NavGraph::build(&m, Metric::L2, 0.05, 0, &never)
            .unwrap()
            .unwrap();
        let e = EntryPoints::Nav {
            medoid,
            nav: nav.clone(),
            l: 32,
            seeds: 4,
        };
        let mut out = Vec::new();
        let mut found = Vec::new();
        let mut st = QueryStats::default();
        let d0 = e.seeds(Metric::L2, q, &mut out, &mut found, &mut st);
        assert_eq!(out.len(), 4);
        // The navigation search's final list (l = 32), exact and nearest first.
        assert_eq!(found.len(), 32);
        assert!(found.iter().zip(&out).all(|(f, &o)| f.1 == o));
        for &(fd, v) in &found {
            let i = v as usize * dim;
            assert_eq!(fd, Metric::L2.distance(q, &data[i..i + dim]));
        }
        assert!(out.iter().all(|v| nav.ids().contains(v)));
        assert_eq!(
            d0,
            Some(Metric::L2.distance(q, &data[out[0] as usize * dim..(out[0] as usize + 1) * dim]))
        );
        assert!(st.exact_distances >= 4);
        assert_eq!(e.memory_bytes(), nav.memory_bytes());
    }
}
