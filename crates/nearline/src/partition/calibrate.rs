//! The default `nprobe` of a partition index, chosen at build from the
//! data: the fewest postings a query reads for sample queries to reach the
//! build's recall target.
//!
//! A build has no user queries, so the samples are data vectors: each one
//! is searched for `k + 1` neighbours, its own id is dropped, and the other
//! `k` are compared with its exact `k` nearest (itself excluded). A data
//! vector sits in its own posting, which a query from outside the set does
//! not: the estimate leans high, so the rule aims at the target plus half
//! of what it leaves (`1 − target`), measured on wordnet's own queries
//! (docs/benchmarks.md).

use super::{PartitionIndex, PartitionOpen, PartitionSearch};
use crate::distance::Metric;
use crate::io::EngineKind;
use crate::update::wal::Durability;
use crate::Result;
use rand::seq::index::sample;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Instant;

/// Sample queries a calibration searches (fewer on small sets).
pub const CALIBRATION_QUERIES: usize = 200;
/// Neighbours a calibration scores (recall@10).
const K: usize = 10;
/// The `nprobe` values tried, smallest first.
const LADDER: &[usize] = &[
    1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512,
];

/// One `nprobe` a calibration tried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalibrationPoint {
    pub nprobe: usize,
    /// Mean recall@10 of the sample queries.
    pub recall: f64,
    /// Mean vectors scored per query.
    pub scored: f64,
}

/// What a calibration measured and chose.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// The recall@10 asked for.
    pub target: f64,
    /// The recall the sample must show (target plus half of the rest).
    pub aim: f64,
    pub queries: usize,
    /// The `nprobe` chosen: the first that reached `aim`, else the last
    /// tried.
    pub nprobe: usize,
    pub reached: bool,
    pub points: Vec<CalibrationPoint>,
    pub seconds: f64,
}

/// What the sample must show for `target` (see the module's note).
pub fn aim(target: f64) -> f64 {
    target + (1.0 - target) / 2.0
}

/// Calibrates the index just built in `dir` over `data` (the rows as the
/// index stores them: normalised for cosine) with external ids `ids`.
/// `None` when the set is too small to leave a query neighbours.
#[allow(clippy::too_many_arguments)]
pub fn calibrate(
    dir: &Path,
    data: &[f32],
    ids: &[u64],
    dim: usize,
    metric: Metric,
    target: f64,
    heads: usize,
    head_rows: &[u32],
    seed: u64,
    threads: Option<usize>,
) -> Result<Option<Calibration>> {
    let t = Instant::now();
    let n = ids.len();
    let k = K.min(n.saturating_sub(1));
    if k == 0 || dim == 0 {
        return Ok(None);
    }
    // Heads are not sampled: a head query finds itself in the head search
    // and its own posting first, which a query from outside never does.
    let is_head: std::collections::HashSet<u32> = head_rows.iter().copied().collect();
    let others: Vec<usize> = (0..n).filter(|&i| !is_head.contains(&(i as u32))).collect();
    let pool = if others.is_empty() {
        (0..n).collect()
    } else {
        others
    };
    let nq = CALIBRATION_QUERIES.min(pool.len());
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6361_6c69_6272_6174);
    let rows: Vec<usize> = sample(&mut rng, pool.len(), nq)
        .into_iter()
        .map(|j| pool[j])
        .collect();
    let truth: Vec<Vec<u64>> = rows
        .par_iter()
        .map(|&i| exact_others(data, dim, metric, i, k, ids))
        .collect();
    let mut queries = Vec::with_capacity(nq * dim);
    for &i in &rows {
        queries.extend_from_slice(&data[i * dim..(i + 1) * dim]);
    }
    let idx = PartitionIndex::open(
        dir,
        &PartitionOpen {
            threads,
            io: EngineKind::Auto,
            durability: Durability::Buffered,
            background: false,
            read_only: true,
            memory_budget: None,
        },
    )?;
    let mut points = Vec::new();
    let goal = aim(target);
    let mut chosen = None;
    for &p in LADDER {
        let p = p.min(heads.max(1));
        if points
            .last()
            .is_some_and(|x: &CalibrationPoint| x.nprobe == p)
        {
            break;
        }
        let r = idx.search(
            &queries,
            nq,
            &PartitionSearch {
                k: k + 1,
                nprobe: p,
                l: None,
                probe_cut: None,
                threads,
                queries_in_flight: None,
            },
        )?;
        let mut hits = 0usize;
        for (q, want) in truth.iter().enumerate() {
            let own = ids[rows[q]] as i64;
            let got: Vec<i64> = r.ids[q * (k + 1)..(q + 1) * (k + 1)]
                .iter()
                .copied()
                .filter(|&id| id != own && id >= 0)
                .take(k)
                .collect();
            hits += want.iter().filter(|&&w| got.contains(&(w as i64))).count();
        }
        let recall = hits as f64 / (nq * k) as f64;
        let scored = r
            .stats
            .iter()
            .map(|s| s.exact_distances as f64)
            .sum::<f64>()
            / nq as f64;
        points.push(CalibrationPoint {
            nprobe: p,
            recall,
            scored,
        });
        if recall >= goal {
            chosen = Some(p);
            break;
        }
    }
    let last = points.last().map_or(1, |x| x.nprobe);
    Ok(Some(Calibration {
        target,
        aim: goal,
        queries: nq,
        nprobe: chosen.unwrap_or(last),
        reached: chosen.is_some(),
        points,
        seconds: t.elapsed().as_secs_f64(),
    }))
}

/// The external ids of the `k` rows nearest row `i` (itself excluded).
fn exact_others(
    data: &[f32],
    dim: usize,
    metric: Metric,
    i: usize,
    k: usize,
    ids: &[u64],
) -> Vec<u64> {
    let q = &data[i * dim..(i + 1) * dim];
    let mut best: Vec<(f32, usize)> = Vec::with_capacity(k + 1);
    for (j, x) in data.chunks_exact(dim).enumerate() {
        if j == i {
            continue;
        }
        let d = metric.distance::<f32>(q, x);
        if best.len() < k || d < best[best.len() - 1].0 {
            let at = best.partition_point(|e| e.0 <= d);
            best.insert(at, (d, j));
            best.truncate(k);
        }
    }
    best.into_iter().map(|(_, j)| ids[j]).collect()
}

#[cfg(test)]
mod tests {
    use super::super::tests::{build_at, params, quiet, search};
    use super::*;
    use crate::elem::DType;
    use crate::index::test_data::{clustered, recall_against};
    use crate::planner::partition::plan;
    use crate::planner::BuildOptions;

    #[test]
    fn the_build_keeps_the_first_nprobe_whose_sample_reaches_the_aim() {
        let (n, dim) = (6000, 24);
        // Queries from the same clusters, not in the index.
        let all = clustered(n + 200, dim, 7);
        let (data, queries) = all.split_at(n * dim);
        let dir = tempfile::tempdir().unwrap();
        let mut chosen = Vec::new();
        for target in [0.8, 0.9, 0.99] {
            let path = dir.path().join(format!("t{target}"));
            let p = params(n, dim, |o| o.recall_target = Some(target));
            build_at(&path, data, dim, None, p);
            let idx = PartitionIndex::open(&path, &quiet()).unwrap();
            let m = crate::partition::read_manifest(&path).unwrap();
            let cal = m.build_stats.calibration.clone().unwrap();
            assert_eq!(m.params.recall_target, Some(target));
            assert_eq!(idx.params().nprobe, Some(cal.nprobe));
            assert_eq!(cal.queries, CALIBRATION_QUERIES);
            assert!(cal.reached, "{cal:?}");
            // The ladder rises, stops at the first point that reached the
            // aim, and no earlier point reached it.
            let (last, before) = cal.points.split_last().unwrap();
            assert_eq!(last.nprobe, cal.nprobe);
            assert!(last.recall >= aim(target), "{cal:?}");
            assert!(before.iter().all(|p| p.recall < aim(target)), "{cal:?}");
            assert!(cal.points.windows(2).all(|w| w[0].nprobe < w[1].nprobe));
            assert!(cal.points.windows(2).all(|w| w[0].scored <= w[1].scored));
            // Queries from outside the set reach the target at that nprobe.
            let found = search(&idx, queries, 10, cal.nprobe);
            let r = recall_against(&found, data, dim, queries, 10);
            assert!(
                r >= target,
                "target {target}: recall {r} at nprobe {}",
                cal.nprobe
            );
            chosen.push(cal.nprobe);
        }
        assert!(chosen.windows(2).all(|w| w[0] <= w[1]), "{chosen:?}");
        assert!(chosen[0] < chosen[2], "{chosen:?}");
    }

    #[test]
    fn a_recall_target_outside_zero_to_one_is_refused() {
        for bad in [0.0, 1.0, 1.5, -0.2, f64::NAN, f64::INFINITY] {
            let mut o = BuildOptions::default();
            o.partition.recall_target = Some(bad);
            let e = plan(&o, 1000, 8, DType::F32).unwrap_err().to_string();
            assert!(e.contains("recall_target"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_tiny_set_still_gets_an_nprobe() {
        let dim = 4;
        let data = clustered(3, dim, 1);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny");
        build_at(&path, &data, dim, None, params(3, dim, |_| {}));
        let m = crate::partition::read_manifest(&path).unwrap();
        let cal = m.build_stats.calibration.unwrap();
        // One of the three is the one head, which is not sampled.
        assert_eq!(cal.queries, 2);
        assert!(cal.nprobe >= 1 && m.params.nprobe == Some(cal.nprobe));
    }
}
