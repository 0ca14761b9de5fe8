//! Entry-point selection: where a query's best-first search starts.
//!
//! DiskANN starts from the medoid (or, for partitioned builds, from the
//! medoid of the nearest partition). A set of sampled nodes held in memory
//! generalises that: each query starts from the sampled node nearest to it,
//! skipping the first hops from the medoid towards its region.

use super::stats::QueryStats;
use crate::data::dtype::Element;
use crate::distance::Metric;
use crate::layout::page::{PageGeometry, RecordReader};
use crate::Result;
use rand::SeedableRng;
use std::path::Path;

/// Reads the vectors of `count` nodes sampled uniformly (deterministically
/// for `seed`) from the page file. Returns their ids and row-major vectors.
pub fn load_sampled_entries<T: Element>(
    path: &Path,
    geo: &PageGeometry,
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
    let mut reader = RecordReader::open(path, geo)?;
    let dim = geo.vector_bytes / std::mem::size_of::<T>();
    let mut vecs: Vec<T> = Vec::with_capacity(count * dim);
    for &v in &ids {
        let rec = reader.record(v)?;
        let bytes = &rec[..geo.vector_bytes];
        vecs.extend(
            bytes
                .chunks_exact(std::mem::size_of::<T>())
                .map(bytemuck::pod_read_unaligned::<T>),
        );
    }
    Ok((ids, vecs))
}

/// The entry points of an open index: where each query's search starts.
/// Executors ask only for `seeds`; how they are chosen stays here.
#[derive(Debug, Clone)]
pub enum EntryPoints<T: Element> {
    /// DiskANN: every query starts from the medoid.
    Medoid(u32),
    /// Sampled nodes held in memory: a query starts from the nearest one
    /// (exact distance), which skips the first hops from the medoid.
    Sampled {
        medoid: u32,
        dim: usize,
        ids: Vec<u32>,
        vecs: Vec<T>,
    },
}

impl<T: Element> EntryPoints<T> {
    /// Appends the nodes the search of `q` (already converted to the
    /// index's element type) starts from to `out`, best first.
    pub fn seeds(&self, metric: Metric, q: &[T], out: &mut Vec<u32>, st: &mut QueryStats) {
        match self {
            EntryPoints::Medoid(m) => out.push(*m),
            EntryPoints::Sampled {
                medoid,
                dim,
                ids,
                vecs,
            } => {
                let mut best = (f32::INFINITY, *medoid);
                for (i, v) in vecs.chunks_exact(*dim).enumerate() {
                    let d = metric.distance(q, v);
                    if d < best.0 {
                        best = (d, ids[i]);
                    }
                }
                st.exact_distances += ids.len() as u32;
                out.push(best.1);
            }
        }
    }

    /// Bytes held in memory.
    pub fn memory_bytes(&self) -> usize {
        match self {
            EntryPoints::Medoid(_) => 0,
            EntryPoints::Sampled { ids, vecs, .. } => {
                ids.capacity() * 4 + vecs.capacity() * std::mem::size_of::<T>()
            }
        }
    }
}
