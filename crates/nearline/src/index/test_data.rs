//! Data the index tests share: clustered vectors and exact neighbours, and
//! the helpers that open an index at a budget and measure its recall.

use super::{Index, SearchOptions};
use crate::planner::OpenOptions;
use crate::util::Budget;
use rand::{Rng, SeedableRng};
use std::path::Path;

/// `n` row-major vectors of `dim` values around 16 centres in [-8, 8)^dim,
/// each coordinate within ±1 of its centre's (deterministic for `seed`).
pub fn clustered(n: usize, dim: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let centers: Vec<f32> = (0..16 * dim).map(|_| rng.random_range(-8.0..8.0)).collect();
    let mut v = Vec::with_capacity(n * dim);
    for _ in 0..n {
        let c = rng.random_range(0..16);
        for j in 0..dim {
            v.push(centers[c * dim + j] + rng.random_range(-1.0f32..1.0));
        }
    }
    v
}

/// Squared L2 distance (scalar reference).
pub fn l2(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

/// Ids of the `k` rows of `data` (`dim` columns) nearest `q`, ties by id.
pub fn exact_knn(data: &[f32], dim: usize, q: &[f32], k: usize) -> Vec<i64> {
    let mut d: Vec<(f32, usize)> = data
        .chunks_exact(dim)
        .enumerate()
        .map(|(i, x)| (l2(q, x), i))
        .collect();
    d.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    d[..k].iter().map(|x| x.1 as i64).collect()
}

/// The error a build of `data` (`dim` columns) into `dir` with `opts`
/// fails with (a panic if it succeeds).
pub fn build_error(data: &[f32], dim: usize, dir: &Path, opts: &super::BuildOptions) -> String {
    let m = crate::data::matrix::Matrix::from_vec(data.to_vec(), data.len() / dim, dim).unwrap();
    super::build(
        m,
        dir,
        opts,
        &|_, _, _| {},
        &std::sync::atomic::AtomicBool::new(false),
    )
    .unwrap_err()
    .to_string()
}

/// Opens `dir` with a budget of `bytes`.
pub fn open_with_budget(dir: &Path, bytes: u64) -> Index {
    Index::open(
        dir,
        &OpenOptions {
            memory_budget: Some(Budget::Bytes(bytes)),
            ..Default::default()
        },
    )
    .unwrap()
}

/// `dir` opened with no node cache (every record a search uses is read).
pub fn open_uncached(dir: &Path) -> Index {
    Index::open(
        dir,
        &super::OpenOptions {
            cache_nodes: Some(0),
            ..Default::default()
        },
    )
    .unwrap()
}

/// The manifest of the index at `dir`.
pub fn manifest_of(dir: &Path) -> crate::format::Manifest {
    crate::io::files::read_manifest(dir).unwrap()
}

/// Recall@k of a search of `queries` (`dim` columns) against the exact
/// neighbours in `data`.
pub fn recall_of(
    idx: &Index,
    data: &[f32],
    dim: usize,
    queries: &[f32],
    opts: &SearchOptions,
) -> f64 {
    let nq = queries.len() / dim;
    let out = idx.search(queries, nq, opts).unwrap();
    recall_against(&out.ids, data, dim, queries, opts.k)
}

/// Recall@k of `ids` (`k` a query, row numbers of `data`) against the
/// exact neighbours of `queries` in `data`.
pub fn recall_against(ids: &[i64], data: &[f32], dim: usize, queries: &[f32], k: usize) -> f64 {
    let nq = queries.len() / dim;
    let mut hit = 0;
    for (i, q) in queries.chunks_exact(dim).enumerate() {
        let truth = exact_knn(data, dim, q, k);
        hit += ids[i * k..(i + 1) * k]
            .iter()
            .filter(|x| truth.contains(x))
            .count();
    }
    hit as f64 / (nq * k) as f64
}

/// `n` row-major vectors in `clusters` anisotropic clusters whose centres
/// lie closer to each other than the points to their own centre (as
/// sentence embeddings do): centres within ±0.5 per coordinate, each point
/// its centre plus Gaussian noise of std 0.6, stretched ×4 along 3 random
/// directions of its cluster (deterministic for `seed`).
pub fn anisotropic(n: usize, dim: usize, clusters: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let gauss = move |r: &mut rand_chacha::ChaCha8Rng| -> f32 {
        // Box-Muller.
        let u: f32 = r.random_range(f32::EPSILON..1.0);
        let v: f32 = r.random_range(0.0..std::f32::consts::TAU);
        (-2.0 * u.ln()).sqrt() * v.cos()
    };
    let centres: Vec<f32> = (0..clusters * dim)
        .map(|_| rng.random_range(-0.5..0.5))
        .collect();
    let dirs: Vec<Vec<f32>> = (0..clusters * 3)
        .map(|_| {
            let mut d: Vec<f32> = (0..dim).map(|_| gauss(&mut rng)).collect();
            let norm = d.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
            d.iter_mut().for_each(|x| *x /= norm);
            d
        })
        .collect();
    let mut v = Vec::with_capacity(n * dim);
    for _ in 0..n {
        let c = rng.random_range(0..clusters);
        let mut x: Vec<f32> = (0..dim)
            .map(|j| centres[c * dim + j] + 0.6 * gauss(&mut rng))
            .collect();
        for d in &dirs[c * 3..c * 3 + 3] {
            let s = 4.0 * 0.6 * gauss(&mut rng);
            x.iter_mut().zip(d).for_each(|(a, b)| *a += s * b);
        }
        v.extend(x);
    }
    v
}

/// Inserts batches of 10 rows of `data` under ids 1000, 1010, … (at most 8
/// batches) through `insert` until one fails with an injected log fault
/// (`io::faulty`); `live` gains every acknowledged batch. Returns the failed
/// batch's ids; panics when no fault fired or an error is not the injected
/// one. `case` names the fault case in messages.
pub fn insert_until_injected_fault<E: std::fmt::Display>(
    data: &[f32],
    dim: usize,
    live: &mut Vec<u64>,
    case: impl std::fmt::Display,
    mut insert: impl FnMut(&[f32], &[u64]) -> Result<(), E>,
) -> Vec<u64> {
    for b in 0..8u64 {
        let ids: Vec<u64> = (1000 + b * 10..1010 + b * 10).collect();
        let rows = &data[ids[0] as usize * dim..(ids[0] as usize + 10) * dim];
        match insert(rows, &ids) {
            Ok(()) => live.extend(&ids),
            Err(e) => {
                assert!(e.to_string().contains("injected"), "case {case}: {e}");
                return ids;
            }
        }
    }
    panic!("case {case}: no fault fired")
}

/// Recall@10 at L 64 of `idx` against the exact neighbours among the live
/// vectors `live` (external id → vector of `dim` values); panics on a
/// returned id that is not live, and (`full`) on a query answered with
/// fewer than 10 ids.
pub fn recall_on_live(
    idx: &Index,
    live: &std::collections::BTreeMap<u64, Vec<f32>>,
    queries: &[f32],
    dim: usize,
    full: bool,
) -> f64 {
    let k = 10;
    let nq = queries.len() / dim;
    let out = idx
        .search(
            queries,
            nq,
            &SearchOptions {
                l: Some(64),
                ..SearchOptions::new(k)
            },
        )
        .unwrap();
    let mut hit = 0;
    for (qi, q) in queries.chunks_exact(dim).enumerate() {
        let mut d: Vec<(f32, u64)> = live.iter().map(|(&i, v)| (l2(q, v), i)).collect();
        d.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let truth: Vec<i64> = d[..k].iter().map(|x| x.1 as i64).collect();
        for &id in &out.ids[qi * k..(qi + 1) * k] {
            assert!(!full || id >= 0, "query {qi} got fewer than {k} results");
            if id >= 0 {
                assert!(
                    live.contains_key(&(id as u64)),
                    "returned id {id} is not live"
                );
            }
        }
        hit += out.ids[qi * k..(qi + 1) * k]
            .iter()
            .filter(|x| truth.contains(x))
            .count();
    }
    hit as f64 / (nq * k) as f64
}

/// Panics unless each of `ids` is among the 5 results of its own vector.
pub fn finds_itself(idx: &Index, live: &std::collections::BTreeMap<u64, Vec<f32>>, ids: &[u64]) {
    let qs: Vec<f32> = ids.iter().flat_map(|i| live[i].clone()).collect();
    let out = idx.search(&qs, ids.len(), &SearchOptions::new(5)).unwrap();
    for (j, &i) in ids.iter().enumerate() {
        assert!(
            out.ids[j * 5..(j + 1) * 5].contains(&(i as i64)),
            "id {i} is not found by its own vector"
        );
    }
}

/// Panics unless `check` finds no problem.
pub fn check_ok(idx: &Index) {
    let rep = idx.check_json().unwrap();
    assert_eq!(rep["problems"], serde_json::json!([]), "check: {rep}");
}
