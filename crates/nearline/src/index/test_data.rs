//! Data the index tests share: clustered vectors and exact neighbours.

use rand::{Rng, SeedableRng};

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
