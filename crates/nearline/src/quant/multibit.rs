//! Multi-bit neighbour codes for FastScan: `B` ∈ {2, 4} bits per dimension
//! of a rotated residual, scored by the same kernel and the same estimator
//! form as 1-bit RaBitQ ([`super::rabitq`]), so a coded record can spend
//! the room its block leaves on finer codes.
//!
//! # Codes
//!
//! With `r = o' − c'` (rotated vector less the rotated centre, `D`
//! dimensions), `L = 2^B` levels and a step `Δ > 0`, dimension i gets the
//! level `k_i = clamp(round(r_i / Δ + (L − 1)/2), 0, L − 1)`, standing for
//! `r̂_i = Δ (k_i − (L − 1)/2)`. `Δ` is chosen per vector among multiples of
//! `‖r‖/√D` to minimise `‖r − r̂‖²`.
//!
//! A FastScan group holds `4 / B` consecutive dimensions, their levels
//! packed `B` bits each (dimension `4g/B + j` at bits `B·j`), so the code of
//! a vector is `ceil(D·B / 4)` nibbles, laid out as [`super::fastscan`]
//! expects.
//!
//! # Estimator
//!
//! ```text
//! ‖o − q‖² = ‖r‖² + ‖q − c‖² − 2⟨r, q' − c'⟩,   ⟨r, x⟩ ≈ β ⟨r̂, x⟩, β = ‖r‖² / ⟨r̂, r⟩
//!          ≈ add + ‖q − c‖² + rescale · ⟨k, q'⟩ − rescale · (L − 1)/2 · Σ q'
//! add     = ‖r‖² + 2β⟨r̂, c'⟩,   rescale = −2βΔ
//! ```
//!
//! (β corrects the shrinkage of the clipped levels as RaBitQ's `1/γ` does:
//! `⟨r̂, x⟩ / ⟨r̂, r/‖r‖²⟩` estimates `⟨r, x⟩` without bias over the random
//! rotation.)
//!
//! `⟨k, q'⟩` is a FastScan sum over tables whose entry `s` of group g is
//! `Σ_j level_j(s) · q'[4g/B + j]`, quantized to u8 by
//! [`super::fastscan::quantize_luts`]: `⟨k, q'⟩ = δ·S + bias`. So a query
//! has `ip_scale = δ` and `ip_offset = bias − (L − 1)/2 · Σ q'`, and a code
//! is scored as `add + ‖q − c‖² + rescale · (ip_scale · S + ip_offset)`,
//! exactly RaBitQ's form with other factors. The third factor stores
//! `2‖r − βr̂‖`: `|error| ≤ 2‖r − βr̂‖ · ‖q' − c'‖` plus the tables' rounding.

use super::fastscan::{self, QuantizedLuts, LUT_ENTRIES};
use super::rabitq::RabitqFactors;
use crate::{Error, Result};

/// Bits per dimension a multi-bit code may have.
pub const MULTIBIT_CHOICES: [usize; 2] = [2, 4];

fn check_bits(bits: usize) -> Result<()> {
    if !MULTIBIT_CHOICES.contains(&bits) {
        return Err(Error::arg(format!(
            "multi-bit codes have 2 or 4 bits per dimension, not {bits}"
        )));
    }
    Ok(())
}

/// FastScan groups of a `dim`-dimensional code of `bits` per dimension.
pub fn groups(dim: usize, bits: usize) -> usize {
    (dim * bits).div_ceil(4)
}

/// Levels of one vector's residual `r` (length D) and their step: the
/// step among nine multiples (0.7–1.3 of a Gaussian's optimum) of
/// `‖r‖/√D` with the least squared error.
fn quantize(r: &[f32], bits: usize, k: &mut [u8]) -> (f32, f64) {
    let levels = (1usize << bits) as f64;
    let half = (levels - 1.0) / 2.0;
    let norm2: f64 = r.iter().map(|&x| x as f64 * x as f64).sum();
    if norm2 == 0.0 {
        k.fill(half.floor() as u8);
        return (0.0, 0.0);
    }
    let sigma = (norm2 / r.len() as f64).sqrt();
    // Around the optimal uniform step of a Gaussian (≈ 1.0σ at 2 bits,
    // ≈ 0.34σ at 4 bits).
    let base = if bits == 2 { 0.996 } else { 0.335 };
    let mut best = (f64::INFINITY, base * sigma);
    for t in 0..=8 {
        let step = base * sigma * (0.7 + 0.075 * t as f64);
        let (inv, s32, h32, top) = (
            (1.0 / step) as f32,
            step as f32,
            half as f32,
            (levels - 1.0) as f32,
        );
        let err: f32 = r
            .iter()
            .map(|&x| {
                let l = (x * inv + h32).round().clamp(0.0, top);
                let e = x - s32 * (l - h32);
                e * e
            })
            .sum();
        let err = err as f64;
        if err < best.0 {
            best = (err, step);
        }
    }
    let step = best.1;
    for (o, &x) in k.iter_mut().zip(r) {
        *o = (x as f64 / step + half).round().clamp(0.0, levels - 1.0) as u8;
    }
    (step as f32, best.0)
}

/// Encodes the rows of `vectors_rot` (`n × D`, rotated) relative to
/// `centre_rot` with `bits` per dimension and packs them for FastScan:
/// returns the packed codes (`n` padded to 32) and the `n` factors.
pub fn encode_packed(
    vectors_rot: &[f32],
    centre_rot: &[f32],
    bits: usize,
) -> Result<(Vec<u8>, Vec<RabitqFactors>)> {
    check_bits(bits)?;
    let dim = centre_rot.len();
    if dim == 0 || !vectors_rot.len().is_multiple_of(dim) {
        return Err(Error::arg(format!(
            "multi-bit encode: {} values, not a multiple of dim = {dim}",
            vectors_rot.len()
        )));
    }
    if let Some(i) = vectors_rot
        .iter()
        .chain(centre_rot)
        .position(|x| !x.is_finite())
    {
        return Err(Error::arg(format!(
            "multi-bit encode: value {i} is not finite"
        )));
    }
    let n = vectors_rot.len() / dim;
    let g = groups(dim, bits);
    let cb = fastscan::code_bytes(g);
    let per = 4 / bits;
    let half = ((1usize << bits) - 1) as f64 / 2.0;
    let mut codes = vec![0u8; n * cb];
    let mut factors = Vec::with_capacity(n);
    let (mut r, mut k) = (vec![0f32; dim], vec![0u8; dim]);
    for (o, code) in vectors_rot
        .chunks_exact(dim)
        .zip(codes.chunks_exact_mut(cb))
    {
        for ((ri, &oi), &ci) in r.iter_mut().zip(o).zip(centre_rot) {
            *ri = oi - ci;
        }
        let (step, _) = quantize(&r, bits, &mut k);
        for (gi, chunk) in k.chunks(per).enumerate() {
            let mut nib = 0u8;
            for (j, &l) in chunk.iter().enumerate() {
                nib |= l << (bits * j);
            }
            code[gi / 2] |= nib << (4 * (gi % 2));
        }
        let norm2: f64 = r.iter().map(|&x| x as f64 * x as f64).sum();
        let level = |l: u8| step as f64 * (l as f64 - half);
        let rc: f64 = k
            .iter()
            .zip(centre_rot)
            .map(|(&l, &c)| level(l) * c as f64)
            .sum();
        let rr: f64 = k.iter().zip(&r).map(|(&l, &x)| level(l) * x as f64).sum();
        // ⟨r, x⟩ ≈ ⟨r̂, x⟩ · ‖r‖² / ⟨r̂, r⟩: unbiased over the rotation (as
        // RaBitQ's γ), where ⟨r̂, x⟩ alone shrinks with the clipped levels.
        let corr = if rr > 0.0 { norm2 / rr } else { 0.0 };
        let hat2: f64 = k.iter().map(|&l| level(l) * level(l)).sum();
        // ‖r − β r̂‖² = β²‖r̂‖² − ‖r‖² (as β⟨r̂, r⟩ = ‖r‖²).
        let resid = (corr * corr * hat2 - norm2).max(0.0);
        factors.push(RabitqFactors {
            add: (norm2 + 2.0 * corr * rc) as f32,
            rescale: (-2.0 * step as f64 * corr) as f32,
            error: (2.0 * resid.sqrt()) as f32,
        });
    }
    let packed = fastscan::pack(&codes, n, g)?;
    Ok((packed, factors))
}

/// A query prepared for multi-bit codes: the u8 tables and the scalars
/// that turn a FastScan sum into `⟨r̂ / Δ, q'⟩` (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct MultibitQuery {
    pub luts: QuantizedLuts,
    pub ip_scale: f32,
    pub ip_offset: f32,
}

/// The FastScan tables of the rotated query `q_rot` for codes of `bits`
/// per dimension.
pub fn prepare_query(q_rot: &[f32], bits: usize) -> Result<MultibitQuery> {
    check_bits(bits)?;
    if q_rot.is_empty() || q_rot.iter().any(|x| !x.is_finite()) {
        return Err(Error::arg(
            "multi-bit prepare_query: the query is empty or not finite",
        ));
    }
    let dim = q_rot.len();
    let per = 4 / bits;
    let mask = (1usize << bits) - 1;
    let g = groups(dim, bits);
    let mut float_luts = vec![0f32; g * LUT_ENTRIES];
    for (gi, lut) in float_luts.chunks_exact_mut(LUT_ENTRIES).enumerate() {
        for (s, e) in lut.iter_mut().enumerate() {
            *e = (0..per)
                .map(|j| {
                    let level = (s >> (bits * j)) & mask;
                    level as f32 * q_rot.get(gi * per + j).copied().unwrap_or(0.0)
                })
                .sum();
        }
    }
    let luts = fastscan::quantize_luts(&float_luts)?;
    let half = mask as f64 / 2.0;
    let sum_q: f64 = q_rot.iter().map(|&x| x as f64).sum();
    Ok(MultibitQuery {
        ip_scale: luts.delta(),
        ip_offset: (luts.bias() as f64 - half * sum_q) as f32,
        luts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn l2(a: &[f32], b: &[f32]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| ((x - y) * (x - y)) as f64)
            .sum()
    }

    /// Scores codes as a coded record does, against the true distances:
    /// more bits, smaller errors; the error stays within its stored scale
    /// (plus the tables' rounding).
    #[test]
    fn estimates_tighten_with_bits_and_stay_within_their_error_scale() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let dim = 96;
        let n = 64;
        let mut mean_err = Vec::new();
        for bits in MULTIBIT_CHOICES {
            let (mut total, mut count) = (0f64, 0usize);
            for _ in 0..20 {
                let c: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect();
                let v: Vec<f32> = (0..n * dim)
                    .map(|i| c[i % dim] + rng.random_range(-0.5..0.5))
                    .collect();
                let q: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect();
                let (packed, f) = encode_packed(&v, &c, bits).unwrap();
                let mq = prepare_query(&q, bits).unwrap();
                let mut sums = vec![0u32; n.div_ceil(32) * 32];
                fastscan::scan(&packed, groups(dim, bits), mq.luts.luts(), &mut sums).unwrap();
                let qc = l2(&q, &c) as f32;
                let qcn = qc.sqrt();
                for (i, row) in v.chunks_exact(dim).enumerate() {
                    let est = f[i].add
                        + qc
                        + f[i].rescale * (mq.ip_scale * sums[i] as f32 + mq.ip_offset);
                    let truth = l2(&q, row);
                    let err = (est as f64 - truth).abs();
                    let bound = (f[i].error * qcn) as f64
                        + (f[i].rescale.abs() * mq.luts.max_error()) as f64
                        + 1e-3 * truth;
                    assert!(err <= bound, "bits {bits}: {est} vs {truth}, bound {bound}");
                    total += err / truth;
                    count += 1;
                }
            }
            mean_err.push(total / count as f64);
        }
        assert!(mean_err[1] < mean_err[0], "{mean_err:?}");
        assert!(mean_err[0] < 0.05, "{mean_err:?}");
    }

    #[test]
    fn bad_arguments_are_refused() {
        assert!(encode_packed(&[0.0; 8], &[0.0; 4], 3).is_err());
        assert!(encode_packed(&[0.0; 7], &[0.0; 4], 2).is_err());
        assert!(encode_packed(&[f32::NAN; 4], &[0.0; 4], 2).is_err());
        assert!(prepare_query(&[], 2).is_err());
        assert!(prepare_query(&[1.0; 4], 1).is_err());
    }
}
