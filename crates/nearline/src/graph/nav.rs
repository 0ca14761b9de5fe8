//! The in-memory navigation graph (Starling §4.2, PipeANN): a small Vamana
//! graph over a uniform random sample of the base vectors, held in RAM with
//! the sample's full vectors. A query first runs a best-first search in it
//! (exact distances, no I/O) and the disk search starts from the sample
//! nodes it finds, close to the query's region, instead of walking there
//! from the medoid one disk read at a time.
//!
//! Its section's bytes are [`crate::format::nav`]'s.

use super::vamana::{build_vamana, medoid, search_graph_with, SearchScratch, VamanaParams};
use super::{Graph, MatrixSpace};
use crate::data::matrix::{Matrix, MatrixView};
use crate::distance::Metric;
use crate::elem::Element;
use crate::{Error, Result};
use rand::SeedableRng;
use std::cell::Cell;
use std::sync::atomic::AtomicBool;

/// Degree bound of the navigation graph (Starling/PipeANN use a smaller R
/// than the disk graph: the sample is ~100× sparser).
pub const NAV_R: usize = 32;
/// Candidate list size of the navigation graph's build.
pub const NAV_BUILD_L: usize = 64;
/// Largest sampling rate accepted.
pub const NAV_MAX_SAMPLE: f64 = 0.5;

/// Degree bound a navigation graph of `count` nodes is stored with (the
/// build's slack degree above [`NAV_R`]).
pub fn nav_graph_degree(count: usize) -> usize {
    if count <= 1 {
        NAV_R
    } else {
        super::vamana::slack_degree(NAV_R)
    }
}

/// Sample nodes for `n` points at sampling rate `rate` (0 = none; otherwise
/// at least one, at most `n`).
pub fn nav_sample_size(n: usize, rate: f64) -> usize {
    if rate <= 0.0 || !rate.is_finite() || n == 0 {
        return 0;
    }
    ((n as f64 * rate).round() as usize).clamp(1, n)
}

/// The nodes a navigation graph at sampling rate `rate` samples from `n`
/// points (sorted; deterministic for `seed`; empty for rate 0).
pub fn sample_ids(n: usize, rate: f64, seed: u64) -> Vec<u32> {
    let count = nav_sample_size(n, rate);
    if count == 0 {
        return Vec::new();
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x4e41_565f_5341_4d50);
    let mut ids: Vec<u32> = rand::seq::index::sample(&mut rng, n, count)
        .into_iter()
        .map(|i| i as u32)
        .collect();
    ids.sort_unstable();
    ids
}

/// Checks a sampling rate: finite and in `[0, NAV_MAX_SAMPLE]`.
pub fn check_nav_sample(rate: f64) -> Result<()> {
    if !rate.is_finite() || !(0.0..=NAV_MAX_SAMPLE).contains(&rate) {
        return Err(Error::arg(format!(
            "nav_sample={rate} must be a finite fraction in [0, {NAV_MAX_SAMPLE}] (0 = no navigation graph; Starling and PipeANN use ~0.01)"
        )));
    }
    Ok(())
}

/// A navigation graph over sampled base nodes, with their vectors.
#[derive(Debug, Clone)]
pub struct NavGraph<T: Element> {
    dim: usize,
    /// Base id of each sample node, strictly increasing.
    ids: Vec<u32>,
    /// Row-major `count × dim` vectors of the sample.
    vecs: Vec<T>,
    graph: Graph,
    /// Sample node searches begin at.
    start: u32,
}

/// Equal when the nodes, vectors, start and every neighbour list agree
/// (unused adjacency slots are not compared).
impl<T: Element> PartialEq for NavGraph<T> {
    fn eq(&self, o: &Self) -> bool {
        self.dim == o.dim
            && self.ids == o.ids
            && self.vecs == o.vecs
            && self.start == o.start
            && self.graph.r() == o.graph.r()
            && self.graph.n() == o.graph.n()
            && (0..self.graph.n() as u32).all(|v| self.graph.neighbors(v) == o.graph.neighbors(v))
    }
}

impl<T: Element> NavGraph<T> {
    /// Builds the navigation graph over `nav_sample_size(n, rate)` rows of
    /// `data` sampled uniformly (deterministic for `seed`); `None` when the
    /// rate is 0. `data` is what the disk graph was built over (normalised
    /// for cosine). Runs on the caller's rayon pool.
    pub fn build(
        data: &Matrix<T>,
        metric: Metric,
        rate: f64,
        seed: u64,
        cancel: &AtomicBool,
    ) -> Result<Option<Self>> {
        check_nav_sample(rate)?;
        let (n, dim) = (data.n(), data.dim());
        let count = nav_sample_size(n, rate);
        if count == 0 {
            return Ok(None);
        }
        let ids = sample_ids(n, rate, seed);
        let mut vecs: Vec<T> = Vec::with_capacity(count * dim);
        let mut released = 0usize;
        for &v in &ids {
            vecs.extend_from_slice(data.row(v as usize));
            // Rows are visited in order: drop mapped pages behind us.
            if v as usize >= released + 8192 {
                data.release_rows(released, v as usize);
                released = v as usize;
            }
        }
        data.release_rows(0, n);
        let view = MatrixView::new(&vecs, count, dim)?;
        let start = medoid(view);
        let space = MatrixSpace::new(view, metric);
        let params = VamanaParams {
            r: NAV_R,
            l: NAV_BUILD_L,
            alpha: 1.2,
            passes: 2,
            seed: seed ^ 0x4e41_565f_4752_4150,
            ..VamanaParams::default()
        };
        let graph = build_vamana(&space, start, &params, &|_, _| {}, cancel)?;
        drop(space);
        Ok(Some(NavGraph {
            dim,
            ids,
            vecs,
            graph,
            start,
        }))
    }

    /// Number of sample nodes.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the graph has no node (never true for a loaded section).
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Base ids of the sample nodes, increasing.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The in-memory graph over sample-node indices.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Degree bound.
    pub fn r(&self) -> usize {
        self.graph.r()
    }

    /// Bytes held in memory (ids, vectors, adjacency).
    pub fn memory_bytes(&self) -> usize {
        self.ids.capacity() * 4
            + self.vecs.capacity() * std::mem::size_of::<T>()
            + self.graph.memory_bytes()
    }

    /// Best-first search for `q` (in the index's element type) with list
    /// size `l`: appends the base ids of the `k` nearest sample nodes to
    /// `out`, nearest first, and (exact internal distance, base id) of every
    /// node left in the final list (up to `max(l, k)`, nearest first) to
    /// `found`. Returns the number of exact distances computed and the exact
    /// distance of the nearest node found (`None` when none).
    #[allow(clippy::too_many_arguments)]
    pub fn search(
        &self,
        scratch: &mut SearchScratch,
        metric: Metric,
        q: &[T],
        l: usize,
        k: usize,
        out: &mut Vec<u32>,
        found: &mut Vec<(f32, u32)>,
    ) -> (u32, Option<f32>) {
        let computed = Cell::new(0u32);
        let dim = self.dim;
        let best = search_graph_with(scratch, &self.graph, self.start, l, l.max(k), |v| {
            computed.set(computed.get() + 1);
            let i = v as usize * dim;
            metric.distance(q, &self.vecs[i..i + dim])
        });
        out.extend(best.iter().take(k).map(|&(_, v)| self.ids[v as usize]));
        found.extend(best.iter().map(|&(d, v)| (d, self.ids[v as usize])));
        (computed.get(), best.first().map(|b| b.0))
    }

    /// A navigation graph from its parts (what [`crate::format::nav`]
    /// stores): `ids.len()` sample nodes with strictly increasing base ids,
    /// `ids.len() × dim` vectors, a graph over sample indices and the start
    /// node. The error says which part is inconsistent.
    pub fn from_parts(
        dim: usize,
        ids: Vec<u32>,
        vecs: Vec<T>,
        graph: Graph,
        start: u32,
    ) -> std::result::Result<Self, String> {
        let count = ids.len();
        if count == 0 || dim == 0 {
            return Err(format!("{count} sample nodes of dimension {dim}"));
        }
        if vecs.len() != count * dim || graph.n() != count {
            return Err(format!(
                "{} vector values and a {}-node graph for {count} nodes of dimension {dim}",
                vecs.len(),
                graph.n()
            ));
        }
        if start as usize >= count {
            return Err(format!(
                "start node {start} is out of range (count {count})"
            ));
        }
        if let Some(i) = ids.windows(2).position(|w| w[0] >= w[1]) {
            return Err(format!(
                "base ids are not strictly increasing at sample node {}",
                i + 1
            ));
        }
        Ok(NavGraph {
            dim,
            ids,
            vecs,
            graph,
            start,
        })
    }

    /// Vector dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Row-major `len() × dim` vectors of the sample nodes.
    pub fn vecs(&self) -> &[T] {
        &self.vecs
    }

    /// The sample node searches begin at.
    pub fn start(&self) -> u32 {
        self.start
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::vamana::tests::{brute_topk, clustered};

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
    fn sample_size_and_rate_checks() {
        assert_eq!(nav_sample_size(1000, 0.0), 0);
        assert_eq!(nav_sample_size(1000, 0.01), 10);
        assert_eq!(nav_sample_size(10, 0.01), 1);
        assert_eq!(nav_sample_size(10, 0.5), 5);
        for bad in [-0.1, 0.9, f64::NAN, f64::INFINITY] {
            let e = check_nav_sample(bad).unwrap_err().to_string();
            assert!(e.contains("nav_sample"), "{e}");
        }
        check_nav_sample(0.0).unwrap();
        check_nav_sample(0.5).unwrap();
    }

    #[test]
    fn seeds_are_sample_nodes_in_best_first_order() {
        let (data, g) = nav(3000, 16, 0.05, 1);
        assert_eq!(g.len(), 150);
        assert!(g.ids().windows(2).all(|w| w[0] < w[1]));
        let queries = clustered(20, 16, 8, 9);
        let mut s = SearchScratch::new();
        for q in queries.chunks_exact(16) {
            let mut out = Vec::new();
            let mut found = Vec::new();
            let (computed, nearest) = g.search(&mut s, Metric::L2, q, 64, 8, &mut out, &mut found);
            assert_eq!(out.len(), 8);
            // The whole final list comes back with exact distances, nearest
            // first, and begins with the seeds.
            assert_eq!(found.len(), 64.min(computed as usize));
            assert!(found.windows(2).all(|w| w[0].0 <= w[1].0));
            assert!(found.iter().zip(&out).all(|(f, &o)| f.1 == o));
            for &(fd, v) in &found {
                let i = v as usize * 16;
                assert_eq!(fd, Metric::L2.distance(q, &data[i..i + 16]));
            }
            assert!(computed >= 8);
            assert!(out.iter().all(|v| g.ids().binary_search(v).is_ok()));
            let d: Vec<f32> = out
                .iter()
                .map(|&v| Metric::L2.distance(q, &data[v as usize * 16..(v as usize + 1) * 16]))
                .collect();
            assert!(d.windows(2).all(|w| w[0] <= w[1]), "{d:?}");
            // The reported distance is the first seed's exact distance.
            assert_eq!(nearest, Some(d[0]));
            // With L covering the whole sample, the seeds are the exact
            // nearest sample nodes.
            let mut all = Vec::new();
            g.search(&mut s, Metric::L2, q, g.len(), 8, &mut all, &mut found);
            let exact: Vec<u32> = brute_topk(g.len(), 8, |i| {
                let v = g.ids()[i as usize] as usize;
                Metric::L2.distance(q, &data[v * 16..(v + 1) * 16])
            })
            .into_iter()
            .map(|i| g.ids()[i as usize])
            .collect();
            assert_eq!(all, exact);
        }
    }

    #[test]
    fn deterministic() {
        let (_, a) = nav(2000, 8, 0.02, 5);
        let (_, b) = nav(2000, 8, 0.02, 5);
        assert!(a == b, "same seed, same navigation graph");
        let (_, c) = nav(2000, 8, 0.02, 6);
        assert_ne!(a.ids(), c.ids());
        assert!(a.memory_bytes() >= a.len() * (8 * 4 + 4));
    }

    #[test]
    fn rate_zero_builds_nothing_and_bad_rates_fail() {
        let data = clustered(100, 4, 2, 1);
        let m = Matrix::from_vec(data.clone(), 100, 4).unwrap();
        let never = AtomicBool::new(false);
        assert!(NavGraph::build(&m, Metric::L2, 0.0, 0, &never)
            .unwrap()
            .is_none());
        assert!(NavGraph::build(&m, Metric::L2, 0.9, 0, &never).is_err());
        assert!(NavGraph::build(&m, Metric::L2, f64::NAN, 0, &never).is_err());
        // A single sampled node still makes a usable graph.
        let one = NavGraph::build(&m, Metric::L2, 0.001, 0, &never)
            .unwrap()
            .unwrap();
        assert_eq!(one.len(), 1);
        let mut out = Vec::new();
        let mut found = Vec::new();
        let (_, nearest) = one.search(
            &mut SearchScratch::new(),
            Metric::L2,
            &[0.0; 4],
            8,
            4,
            &mut out,
            &mut found,
        );
        assert_eq!(out, one.ids().to_vec());
        assert_eq!(found.len(), 1);
        let v = one.ids()[0] as usize;
        assert_eq!(
            nearest,
            Some(Metric::L2.distance(&[0.0f32; 4], &data[v * 4..(v + 1) * 4]))
        );
    }
}
