//! Build phase 4: the in-memory entry structures — the navigation graph
//! (Starling, PipeANN) and AlayaLaser's centroid entries.

use super::{check_cancel, BuildPlan, Progress, SectionEntry};
use crate::data::matrix::Matrix;
use crate::elem::Element;
use crate::format::Section;
use crate::graph::nav::NavGraph;
use crate::io::files::write_section;
use crate::quant::kmeans::{kmeans_cancellable, KMeansParams, LOWER_BOUNDS_MAX_ENTRIES};
use crate::search::EntrySet;
use crate::{Error, Result};
use rand::SeedableRng;
use std::path::Path;
use std::sync::atomic::AtomicBool;

/// k-means iterations for the centroid entries.
const CENTROID_ITERS: usize = 10;
/// Rows the centroid k-means samples: at least this many (or all)...
const CENTROID_MIN_SAMPLE: usize = 32_768;
/// ...and at least this many per centroid.
const CENTROID_SAMPLE_PER_CLUSTER: usize = 64;

/// Builds the plan's entry structures over `data` and writes their
/// sections into `dir`.
pub fn run<T: Element>(
    data: &Matrix<T>,
    plan: &BuildPlan,
    build_budget: u64,
    dir: &Path,
    progress: Progress<'_>,
    cancel: &AtomicBool,
) -> Result<Vec<SectionEntry>> {
    let mut out = Vec::new();
    if plan.nav_sample > 0.0 {
        progress("nav", 0, 1);
        if let Some(nav) = NavGraph::build(data, plan.metric, plan.nav_sample, plan.seed, cancel)? {
            out.push((
                Section::NavGraph,
                write_section(
                    dir,
                    "nav_graph.bin",
                    "nav_graph",
                    &crate::format::nav::encode(&nav),
                )?,
            ));
        }
        progress("nav", 1, 1);
    }
    check_cancel(cancel)?;
    if plan.entry_clusters > 0 {
        progress("centroids", 0, 1);
        if let Some(set) =
            build_centroid_entries(data, plan.entry_clusters, plan.seed, build_budget, cancel)?
        {
            out.push((
                Section::EntryCentroids,
                write_section(
                    dir,
                    "entry_centroids.bin",
                    "entry_centroids",
                    &crate::format::entries::encode_centroids(set.dim, &set.ids, &set.vecs),
                )?,
            ));
        }
        progress("centroids", 1, 1);
    }
    Ok(out)
}

/// Rows of the centroid k-means sample: `max(64·C, 32768)` (all rows when
/// fewer), fewer when half of `budget` cannot hold them as f32, never fewer
/// than `C`.
fn centroid_sample_rows(n: usize, dim: usize, clusters: usize, budget: u64) -> usize {
    let want = (clusters * CENTROID_SAMPLE_PER_CLUSTER).max(CENTROID_MIN_SAMPLE);
    let by_budget = (budget / 2 / (dim as u64 * 4).max(1)).min(usize::MAX as u64) as usize;
    want.min(by_budget).max(clusters).min(n)
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
    cancel: &AtomicBool,
) -> Result<Option<EntrySet<T>>> {
    let (n, dim) = (data.n(), data.dim());
    if clusters > n {
        return Err(Error::arg(format!(
            "entry_clusters={clusters} must be at most the number of vectors ({n})"
        )));
    }
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
    let km = kmeans_cancellable(
        &sample,
        dim,
        &KMeansParams {
            k: clusters,
            max_iters: CENTROID_ITERS,
            seed: seed ^ 0x4345_4e54_524f_4944,
        },
        lb_entries,
        Some(cancel),
    )?;
    // The member nearest to each centroid (ties: the lower row).
    let mut best: Vec<Option<(f32, usize)>> = vec![None; clusters];
    for (i, &c) in km.assignment.iter().enumerate() {
        let c = c as usize;
        let x = &sample[i * dim..(i + 1) * dim];
        let d = crate::kernels::l2_f32(x, &km.centroids[c * dim..(c + 1) * dim]);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::vamana::tests::clustered;

    #[test]
    fn centroid_entries_are_cluster_representatives() {
        let (n, dim) = (4000, 8);
        let data = clustered(n, dim, 6, 7);
        let m = Matrix::from_vec(data.clone(), n, dim).unwrap();
        let never = AtomicBool::new(false);
        let set = build_centroid_entries(&m, 20, 3, u64::MAX, &never)
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
        let again = build_centroid_entries(&m, 20, 3, u64::MAX, &never)
            .unwrap()
            .unwrap();
        assert!(set == again);
        // Round trip and damage.
        use crate::format::entries::{decode_centroids, encode_centroids};
        let b = encode_centroids(dim, &set.ids, &set.vecs);
        let p = Path::new("c.bin");
        let (ids, vecs) = decode_centroids::<f32>(p, &b, dim, n).unwrap();
        assert!(EntrySet { dim, ids, vecs } == set);
        let e = decode_centroids::<f32>(p, &b[..b.len() - 3], dim, n).unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        assert!(decode_centroids::<f32>(p, &b, dim + 1, n).is_err());
        assert!(decode_centroids::<f32>(p, &b, dim, 10).is_err());
        assert!(build_centroid_entries(&m, 0, 3, u64::MAX, &never)
            .unwrap()
            .is_none());
        let e = build_centroid_entries(&m, n + 1, 3, u64::MAX, &never).unwrap_err();
        assert!(e.to_string().contains("entry_clusters"), "{e}");
    }
}
