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
use crate::data::dtype::Element;
use crate::data::matrix::Matrix;
use crate::distance::Metric;
use crate::graph::nav::NavGraph;
use crate::graph::SearchScratch;
use crate::layout::page::RecordReader;
use crate::layout::section::{check_finite_elems, SectionReader, SectionWriter};
use crate::layout::AnyLayout;
use crate::quant::kmeans::{kmeans_with_lb_budget, KMeansParams, LOWER_BOUNDS_MAX_ENTRIES};
use crate::{Error, Result};
use rand::SeedableRng;
use std::cell::RefCell;
use std::path::Path;

/// Default list size of the navigation-graph search (see docs/architecture.md).
pub const DEFAULT_NAV_L: usize = 32;
/// Default number of navigation-graph seeds per query (see docs/architecture.md).
pub const DEFAULT_NAV_SEEDS: usize = 1;
/// Largest number of navigation-graph seeds accepted.
pub const MAX_NAV_SEEDS: usize = 256;
/// Largest navigation-graph list size accepted.
pub const MAX_NAV_L: usize = 4096;
/// Largest `entry_clusters` accepted.
pub const MAX_ENTRY_CLUSTERS: usize = 65_536;
/// Magic of the centroid-entry section.
pub const CENTROIDS_MAGIC: &[u8; 4] = b"NLEC";
/// Version of the centroid-entry section this code writes and reads.
pub const CENTROIDS_VERSION: u32 = 1;
/// k-means iterations for the centroid entries.
const CENTROID_ITERS: usize = 10;
/// Rows the centroid k-means samples: at least this many (or all)...
const CENTROID_MIN_SAMPLE: usize = 32_768;
/// ...and at least this many per centroid.
const CENTROID_SAMPLE_PER_CLUSTER: usize = 64;

/// Which entry-point kind an open index uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EntryKind {
    /// The navigation graph if the index has one, else the centroid entries
    /// if it has them, else sampled entries when `entry_points > 0`, else
    /// the medoid.
    #[default]
    Auto,
    Medoid,
    Sampled,
    Nav,
    Centroids,
}

impl EntryKind {
    /// Parses `auto | medoid | sampled | nav | centroids`.
    pub fn parse(s: &str) -> Result<EntryKind> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(EntryKind::Auto),
            "medoid" => Ok(EntryKind::Medoid),
            "sampled" => Ok(EntryKind::Sampled),
            "nav" => Ok(EntryKind::Nav),
            "centroids" => Ok(EntryKind::Centroids),
            other => Err(Error::arg(format!(
                "unknown entry kind {other:?}: expected \"auto\", \"medoid\", \"sampled\", \"nav\" or \"centroids\""
            ))),
        }
    }
    /// Name used by the APIs and `info()`.
    pub fn name(self) -> &'static str {
        match self {
            EntryKind::Auto => "auto",
            EntryKind::Medoid => "medoid",
            EntryKind::Sampled => "sampled",
            EntryKind::Nav => "nav",
            EntryKind::Centroids => "centroids",
        }
    }
}

impl std::fmt::Display for EntryKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Resolves `kind` for an index that has (or lacks) a navigation graph and
/// centroid entries; asking for a kind the index lacks is an error naming
/// the option that provides it.
pub fn resolve_kind(
    kind: EntryKind,
    has_nav: bool,
    has_centroids: bool,
    entry_points: usize,
) -> Result<EntryKind> {
    let resolved = match kind {
        EntryKind::Auto if has_nav => EntryKind::Nav,
        EntryKind::Auto if has_centroids => EntryKind::Centroids,
        EntryKind::Auto if entry_points > 0 => EntryKind::Sampled,
        EntryKind::Auto => EntryKind::Medoid,
        EntryKind::Nav if !has_nav => {
            return Err(Error::arg(
                "entry=\"nav\": this index has no navigation graph; rebuild it with nav_sample > 0 (CLI: --nav-sample, e.g. 0.01)",
            ))
        }
        EntryKind::Centroids if !has_centroids => {
            return Err(Error::arg(
                "entry=\"centroids\": this index has no centroid entries; rebuild it with entry_clusters > 0 (CLI: --entry-clusters, e.g. 300)",
            ))
        }
        EntryKind::Sampled if entry_points == 0 => {
            return Err(Error::arg(
                "entry=\"sampled\" needs entry_points > 0 (the number of sampled nodes held in memory)",
            ))
        }
        k => k,
    };
    if entry_points > 0 && resolved != EntryKind::Sampled && kind != EntryKind::Auto {
        return Err(Error::arg(format!(
            "entry_points={entry_points} applies to entry=\"sampled\" only, not entry={:?}",
            kind.name()
        )));
    }
    Ok(resolved)
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

    /// The centroid-entry section bytes: magic `NLEC`, version, element
    /// size, dim, count, a reserved u32, count × u32 base ids, then
    /// count × dim elements.
    pub fn to_centroid_bytes(&self) -> Vec<u8> {
        let mut w = SectionWriter::new(CENTROIDS_MAGIC, CENTROIDS_VERSION);
        w.u32(std::mem::size_of::<T>() as u32);
        w.u32(self.dim as u32);
        w.u32(self.ids.len() as u32);
        w.u32(0);
        w.u32s(&self.ids);
        w.elems(&self.vecs);
        w.bytes
    }

    /// Parses and checks a centroid-entry section for an index of `n`
    /// points of dimension `dim`.
    pub fn from_centroid_bytes(path: &Path, bytes: &[u8], dim: usize, n: usize) -> Result<Self> {
        let (mut r, _version) = SectionReader::open(
            path,
            "centroid entries",
            bytes,
            CENTROIDS_MAGIC,
            CENTROIDS_VERSION,
        )?;
        let count = r.vector_header::<T>(dim, n)?;
        let _reserved = r.u32("reserved")?;
        let expected = count
            .checked_mul(4 + dim * std::mem::size_of::<T>())
            .and_then(|a| a.checked_add(24));
        r.expect_len(expected)?;
        let ids = r.u32s(count, "ids")?;
        if let Some(i) = ids.iter().position(|&v| v as usize >= n) {
            return Err(r.err(format!("entry {i} has base id {} ≥ n = {n}", ids[i])));
        }
        let vecs: Vec<T> = r.elems(count * dim, "vectors")?;
        check_finite_elems(&r, &vecs, dim)?;
        r.finish()?;
        Ok(EntrySet { dim, ids, vecs })
    }
}

/// Rows of the centroid k-means sample: `max(64·C, 32768)` (all rows when
/// fewer), fewer when half of `budget` cannot hold them as f32, never fewer
/// than `C`.
fn centroid_sample_rows(n: usize, dim: usize, clusters: usize, budget: u64) -> usize {
    let want = (clusters * CENTROID_SAMPLE_PER_CLUSTER).max(CENTROID_MIN_SAMPLE);
    let by_budget = (budget / 2 / (dim as u64 * 4).max(1)).min(usize::MAX as u64) as usize;
    want.min(by_budget).max(clusters).min(n)
}

/// Checks `entry_clusters` against the number of points.
pub fn check_entry_clusters(clusters: usize, n: usize) -> Result<()> {
    if clusters > n || clusters > MAX_ENTRY_CLUSTERS {
        return Err(Error::arg(format!(
            "entry_clusters={clusters} must be at most the number of vectors ({n}) and at most {MAX_ENTRY_CLUSTERS} (0 = none; AlayaLaser uses 300-500)"
        )));
    }
    Ok(())
}

/// AlayaLaser's centroid entries: k-means with `clusters` centroids over a
/// uniform sample of `data` (deterministic for `seed`), then, for each
/// centroid, the sample member nearest to it (squared L2) with its vector.
/// `build_budget` bounds the sample and the k-means scratch. Runs on the
/// caller's rayon pool.
pub fn build_centroid_entries<T: Element>(
    data: &Matrix<T>,
    clusters: usize,
    seed: u64,
    build_budget: u64,
) -> Result<Option<EntrySet<T>>> {
    let (n, dim) = (data.n(), data.dim());
    check_entry_clusters(clusters, n)?;
    if clusters == 0 {
        return Ok(None);
    }
    let rows_n = centroid_sample_rows(n, dim, clusters, build_budget);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x454e_5452_435e_4e54);
    let mut rows: Vec<usize> = if rows_n >= n {
        (0..n).collect()
    } else {
        rand::seq::index::sample(&mut rng, n, rows_n).into_vec()
    };
    rows.sort_unstable();
    let mut sample = Vec::with_capacity(rows.len() * dim);
    let mut released = 0usize;
    for &r in &rows {
        sample.extend(data.row(r).iter().map(|x| x.to_f32()));
        if r >= released + 8192 {
            data.release_rows(released, r);
            released = r;
        }
    }
    data.release_rows(0, n);
    let lb_entries =
        ((build_budget / 2 / 4).min(usize::MAX as u64) as usize).min(LOWER_BOUNDS_MAX_ENTRIES);
    let km = kmeans_with_lb_budget(
        &sample,
        dim,
        &KMeansParams {
            k: clusters,
            max_iters: CENTROID_ITERS,
            seed: seed ^ 0x4345_4e54_524f_4944,
        },
        lb_entries,
    )?;
    // The member nearest to each centroid (ties: the lower row).
    let mut best: Vec<Option<(f32, usize)>> = vec![None; clusters];
    for (i, &c) in km.assignment.iter().enumerate() {
        let c = c as usize;
        let x = &sample[i * dim..(i + 1) * dim];
        let d = crate::distance::kernels::l2_f32(x, &km.centroids[c * dim..(c + 1) * dim]);
        if best[c].is_none_or(|b| d < b.0) {
            best[c] = Some((d, i));
        }
    }
    drop(sample);
    let mut ids = Vec::with_capacity(clusters);
    let mut vecs = Vec::with_capacity(clusters * dim);
    // Clusters left empty (duplicate points) get no entry.
    for (_, i) in best.into_iter().flatten() {
        let v = rows[i];
        ids.push(v as u32);
        vecs.extend_from_slice(data.row(v));
    }
    data.release_rows(0, n);
    Ok(Some(EntrySet { dim, ids, vecs }))
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

    /// The kind of these entry points.
    pub fn kind(&self) -> EntryKind {
        match self {
            EntryPoints::Medoid(_) => EntryKind::Medoid,
            EntryPoints::Sampled { .. } => EntryKind::Sampled,
            EntryPoints::Nav { .. } => EntryKind::Nav,
            EntryPoints::Centroids { .. } => EntryKind::Centroids,
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
    use crate::graph::vamana::tests::clustered;

    #[test]
    fn kinds_parse_and_resolve() {
        for k in ["auto", "medoid", "sampled", "nav", "centroids"] {
            assert_eq!(EntryKind::parse(k).unwrap().name(), k);
        }
        let e = EntryKind::parse("bogus").unwrap_err().to_string();
        assert!(e.contains("bogus") && e.contains("centroids"), "{e}");
        use EntryKind::*;
        assert_eq!(resolve_kind(Auto, true, true, 0).unwrap(), Nav);
        assert_eq!(resolve_kind(Auto, false, true, 0).unwrap(), Centroids);
        assert_eq!(resolve_kind(Auto, false, false, 0).unwrap(), Medoid);
        assert_eq!(resolve_kind(Auto, false, false, 8).unwrap(), Sampled);
        assert_eq!(resolve_kind(Medoid, true, true, 0).unwrap(), Medoid);
        assert_eq!(resolve_kind(Sampled, true, true, 8).unwrap(), Sampled);
        let e = resolve_kind(Nav, false, true, 0).unwrap_err().to_string();
        assert!(e.contains("nav_sample"), "{e}");
        let e = resolve_kind(Centroids, true, false, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("entry_clusters"), "{e}");
        let e = resolve_kind(Sampled, true, true, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("entry_points"), "{e}");
        let e = resolve_kind(Nav, true, true, 5).unwrap_err().to_string();
        assert!(e.contains("entry_points"), "{e}");
    }

    #[test]
    fn centroid_entries_are_cluster_representatives() {
        let (n, dim) = (4000, 8);
        let data = clustered(n, dim, 6, 7);
        let m = Matrix::from_vec(data.clone(), n, dim).unwrap();
        let set = build_centroid_entries(&m, 20, 3, u64::MAX)
            .unwrap()
            .unwrap();
        assert_eq!(set.len(), 20);
        let mut uniq = set.ids.clone();
        uniq.sort_unstable();
        uniq.dedup();
        assert_eq!(uniq.len(), 20, "one distinct node per centroid");
        for (i, &v) in set.ids.iter().enumerate() {
            assert_eq!(
                &set.vecs[i * dim..(i + 1) * dim],
                &data[v as usize * dim..(v as usize + 1) * dim]
            );
        }
        // Deterministic for a seed.
        let again = build_centroid_entries(&m, 20, 3, u64::MAX)
            .unwrap()
            .unwrap();
        assert!(set == again);
        // Round trip and damage.
        let b = set.to_centroid_bytes();
        let p = Path::new("c.bin");
        assert!(EntrySet::<f32>::from_centroid_bytes(p, &b, dim, n).unwrap() == set);
        let e = EntrySet::<f32>::from_centroid_bytes(p, &b[..b.len() - 3], dim, n).unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        assert!(EntrySet::<f32>::from_centroid_bytes(p, &b, dim + 1, n).is_err());
        assert!(EntrySet::<f32>::from_centroid_bytes(p, &b, dim, 10).is_err());
        assert!(build_centroid_entries(&m, 0, 3, u64::MAX)
            .unwrap()
            .is_none());
        let e = build_centroid_entries(&m, n + 1, 3, u64::MAX).unwrap_err();
        assert!(e.to_string().contains("entry_clusters"), "{e}");
    }

    #[test]
    fn seeds_of_each_kind() {
        let (n, dim) = (2000, 8);
        let data = clustered(n, dim, 6, 1);
        let m = Matrix::from_vec(data.clone(), n, dim).unwrap();
        let set = build_centroid_entries(&m, 12, 0, u64::MAX)
            .unwrap()
            .unwrap();
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
        assert_eq!(c.kind(), EntryKind::Centroids);
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
