//! RaBitQ (Gao & Long, SIGMOD 2024): 1-bit codes of vectors relative to a
//! centre, with an unbiased distance estimator and its error bound, scored
//! in batches of 32 by [`super::fastscan`].
//!
//! # Codes
//!
//! Let `P` be a random rotation of `D` dimensions ([`Rotation`]), `c` the
//! centre (AlayaLaser: the record's own node) and `o` a vector. With
//! `o' = P o`, `c' = P c`, `r = o' − c'` and `r_o = ‖r‖ = ‖o − c‖`, the code is
//! the sign pattern `x_b[i] = [r[i] > 0]` (bit `i` of byte `i / 8`, least
//! significant first), standing for the unit vector `x̄ = (2 x_b − 1)/√D`.
//! `γ = ⟨x̄, r / r_o⟩ = Σ|r[i]| / (√D r_o)` (about 0.8) measures how well the
//! code fits.
//!
//! # Estimator
//!
//! For a query `q` with `q' = P q`, RaBitQ estimates the unit inner product
//! `⟨(o − c)/r_o, q − c⟩` by `⟨x̄, q' − c'⟩ / γ`, which is unbiased over the
//! rotation. Hence
//!
//! ```text
//! ‖o − q‖² ≈ r_o² + ‖q − c‖² − 2 r_o (⟨x̄, q'⟩ − ⟨x̄, c'⟩) / γ
//!          = add + ‖q − c‖² + rescale · ⟨x̄, q'⟩
//! add     = r_o² + 2 r_o ⟨x̄, c'⟩ / γ
//! rescale = −2 r_o / γ
//! ```
//!
//! so each code carries three floats ([`RabitqFactors`]: `add`, `rescale`,
//! `error`), the query is rotated once (not once per centre), and the caller
//! supplies `‖q − c‖²` (for AlayaLaser a by-product of the centre's exact
//! distance). `o = c` gives zero factors and the exact `‖q − c‖²`.
//!
//! `⟨x̄, q'⟩ = (2⟨x_b, q'⟩ − Σ q')/√D`; `⟨x_b, q'⟩` comes from FastScan with
//! the subset-sum tables of `q'` (entry `c` of group `g` = `Σ q'[4g+k]` over
//! the bits `k` of `c`) quantized to u8 with one step `Δ` for all groups and a
//! per-group offset ([`super::fastscan::quantize_luts`]): `⟨x_b, q'⟩ = Δ·S +
//! bias` within `n_groups·Δ/2`. So `⟨x̄, q'⟩ = ip_scale·S + ip_offset` with
//! `ip_scale = 2Δ/√D`, `ip_offset = (2·bias − Σq')/√D`, within `ip_error =
//! n_groups·Δ/√D`. The query therefore needs no per-vector popcount.
//! (The paper quantizes each query coordinate to 4 bits instead; quantizing
//! the 4-dimension subset sums to 8 bits, as Faiss and the RaBitQ library's
//! FastScan do, is about 30× finer for the same kernel.)
//!
//! # Error bound
//!
//! The paper's bound: with `ε0` a confidence parameter,
//! `|⟨x̄, q_n⟩/γ − ⟨o_n, q_n⟩| ≤ ε0 · sqrt((1 − γ²)/γ²) / sqrt(D − 1)` for unit
//! `o_n`, `q_n`. Scaled to distances, plus the table quantization error
//! (deterministic), the estimate is within
//!
//! ```text
//! bound = ε0 · error · ‖q − c‖ + |rescale| · ip_error,
//! error = 2 r_o · sqrt(1 − γ²) / (γ · sqrt(D − 1)).
//! ```
//!
//! The estimator's error is `sqrt(1 − γ²)/γ · sqrt(1 − ⟨o_n, q_n⟩²) · u` where
//! `u` is one coordinate of a uniform point on the unit sphere of `R^{D−1}`
//! (the paper's Lemma), so the first term fails with probability at most
//! `P(|u|·sqrt(D−1) > ε0)`, computed exactly by
//! [`bound_failure_probability`] (close to `P(|N(0,1)| > ε0)`):
//! 5.71% for the paper's default ε0 = 1.9 at D = 128 (5.74% as D grows),
//! 0.24% for ε0 = 3 (0.27%).
//! The probability is over the random rotation, per (vector, query) pair.
//!
//! Serialised form: section `NLRQ`, version 1, u32 dim, u32 bits (= 1), then
//! the rotation matrix (f32, `dim²`, row-major).

use crate::quant::fastscan::{self, QuantizedLuts, LUT_ENTRIES};
use crate::quant::pca::{Rotation, PCA_MAX_DIM};
use crate::{Error, Result};

/// The paper's default confidence parameter ε0.
pub const RABITQ_DEFAULT_EPS0: f32 = 1.9;

/// Magic of a serialised [`RaBitQ`].
pub const RABITQ_MAGIC: &[u8; 4] = b"NLRQ";
/// Version written by [`RaBitQ::to_bytes`].
pub const RABITQ_VERSION: u32 = 1;

/// Per-code floats of the estimator (see the module documentation).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RabitqFactors {
    /// `r_o² + 2 r_o ⟨x̄, c'⟩ / γ`.
    pub add: f32,
    /// `−2 r_o / γ`.
    pub rescale: f32,
    /// `2 r_o sqrt(1 − γ²) / (γ sqrt(D − 1))`, multiplied by `ε0 ‖q − c‖`.
    pub error: f32,
}

/// A RaBitQ quantizer of `dim` dimensions: its random rotation.
#[derive(Debug, Clone, PartialEq)]
pub struct RaBitQ {
    rotation: Rotation,
}

fn check_vec(v: &[f32], dim: usize, what: &str, field: &str) -> Result<()> {
    if v.len() != dim {
        return Err(Error::arg(format!(
            "RaBitQ {what}: {field} has {} values, expected dim = {dim}",
            v.len()
        )));
    }
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        return Err(Error::arg(format!(
            "RaBitQ {what}: {field}[{i}] is {} (expected a finite number)",
            v[i]
        )));
    }
    Ok(())
}

fn check_dim(dim: usize, what: &str) -> Result<()> {
    if !(2..=PCA_MAX_DIM).contains(&dim) {
        return Err(Error::arg(format!(
            "RaBitQ {what}: dim = {dim}, expected 2..={PCA_MAX_DIM}"
        )));
    }
    Ok(())
}

impl RaBitQ {
    /// A quantizer with a Haar-random rotation drawn from `seed`
    /// (`dim` in `2..=`[`PCA_MAX_DIM`]).
    pub fn new(dim: usize, seed: u64) -> Result<Self> {
        check_dim(dim, "new")?;
        Ok(RaBitQ {
            rotation: Rotation::random(dim, seed)?,
        })
    }

    /// A quantizer using `rotation` (checked when it was built).
    pub fn from_parts(rotation: Rotation) -> Result<Self> {
        check_dim(rotation.dim(), "from_parts")?;
        Ok(RaBitQ { rotation })
    }

    /// The part [`Self::from_parts`] takes.
    pub fn into_parts(self) -> Rotation {
        self.rotation
    }

    /// The rotation `P`.
    pub fn rotation(&self) -> &Rotation {
        &self.rotation
    }
    /// Dimension `D`.
    pub fn dim(&self) -> usize {
        self.rotation.dim()
    }
    /// Bytes of one code, `ceil(D / 8)`.
    pub fn code_bytes(&self) -> usize {
        self.dim().div_ceil(8)
    }
    /// FastScan groups of one code, `ceil(D / 4)`.
    pub fn n_groups(&self) -> usize {
        self.dim().div_ceil(4)
    }

    /// `out = P x`: vectors, centres and queries rotated once can be given
    /// to the `*_rotated` functions.
    pub fn rotate(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        self.rotation.apply(x, out)
    }

    /// Encodes `o` relative to `centre` into `code` ([`Self::code_bytes`]
    /// bytes) and returns its factors.
    pub fn encode(&self, o: &[f32], centre: &[f32], code: &mut [u8]) -> Result<RabitqFactors> {
        let dim = self.dim();
        check_vec(o, dim, "encode", "vector")?;
        check_vec(centre, dim, "encode", "centre")?;
        let (mut or, mut cr) = (vec![0f32; dim], vec![0f32; dim]);
        self.rotate(o, &mut or)?;
        self.rotate(centre, &mut cr)?;
        self.encode_rotated(&or, &cr, code)
    }

    /// [`Self::encode`] from the rotated vector `P o` and centre `P c`.
    pub fn encode_rotated(
        &self,
        o_rot: &[f32],
        centre_rot: &[f32],
        code: &mut [u8],
    ) -> Result<RabitqFactors> {
        let dim = self.dim();
        check_vec(o_rot, dim, "encode", "rotated vector")?;
        check_vec(centre_rot, dim, "encode", "rotated centre")?;
        if code.len() != self.code_bytes() {
            return Err(Error::arg(format!(
                "RaBitQ encode: code has {} bytes, expected ceil(dim / 8) = {}",
                code.len(),
                self.code_bytes()
            )));
        }
        Ok(encode_one(o_rot, centre_rot, code))
    }

    /// Encodes the rows of `vectors_rot` (`n × D`, rotated) relative to
    /// `centre_rot` and packs the codes for FastScan: returns the packed codes
    /// ([`fastscan::packed_len`]`(n, n_groups)` bytes, `n` padded to 32) and
    /// the `n` factors.
    pub fn encode_packed_rotated(
        &self,
        vectors_rot: &[f32],
        centre_rot: &[f32],
    ) -> Result<(Vec<u8>, Vec<RabitqFactors>)> {
        let dim = self.dim();
        check_vec(centre_rot, dim, "encode_packed", "rotated centre")?;
        if !vectors_rot.len().is_multiple_of(dim) {
            return Err(Error::arg(format!(
                "RaBitQ encode_packed: {} values, not a multiple of dim = {dim}",
                vectors_rot.len()
            )));
        }
        if let Some(i) = vectors_rot.iter().position(|x| !x.is_finite()) {
            return Err(Error::arg(format!(
                "RaBitQ encode_packed: vector {} holds {} at column {} (expected finite numbers)",
                i / dim,
                vectors_rot[i],
                i % dim
            )));
        }
        let n = vectors_rot.len() / dim;
        let cb = self.code_bytes();
        let mut codes = vec![0u8; n * cb];
        let factors = vectors_rot
            .chunks_exact(dim)
            .zip(codes.chunks_exact_mut(cb))
            .map(|(o, code)| encode_one(o, centre_rot, code))
            .collect();
        let packed = fastscan::pack(&codes, n, self.n_groups())?;
        Ok((packed, factors))
    }

    /// Rotates `q` and builds its FastScan tables.
    pub fn prepare_query(&self, q: &[f32]) -> Result<RabitqQuery> {
        check_vec(q, self.dim(), "prepare_query", "query")?;
        let mut qr = vec![0f32; self.dim()];
        self.rotate(q, &mut qr)?;
        self.prepare_query_rotated(&qr)
    }

    /// Builds the FastScan tables of the rotated query `P q`.
    pub fn prepare_query_rotated(&self, q_rot: &[f32]) -> Result<RabitqQuery> {
        check_vec(q_rot, self.dim(), "prepare_query", "rotated query")?;
        RabitqQuery::from_rotated(q_rot)
    }
}

impl RabitqQuery {
    /// The FastScan tables of an already rotated query `P q` (the rotation
    /// itself is not needed: a caller that rotated its queries once need
    /// not keep it).
    pub fn from_rotated(q_rot: &[f32]) -> Result<RabitqQuery> {
        let dim = q_rot.len();
        check_dim(dim, "prepare_query")?;
        check_vec(q_rot, dim, "prepare_query", "rotated query")?;
        let luts = fastscan::quantize_luts(&fastscan::subset_sum_luts(q_rot)?)?;
        let sqrt_d = (dim as f64).sqrt();
        let sum_q: f64 = q_rot.iter().map(|&x| x as f64).sum();
        let (delta, bias) = (luts.delta() as f64, luts.bias() as f64);
        Ok(RabitqQuery {
            dim,
            ip_scale: (2.0 * delta / sqrt_d) as f32,
            ip_offset: ((2.0 * bias - sum_q) / sqrt_d) as f32,
            ip_error: (2.0 * luts.max_error() as f64 / sqrt_d) as f32,
            luts,
        })
    }
}

/// Code and factors of one rotated vector (lengths checked by the caller).
fn encode_one(o: &[f32], c: &[f32], code: &mut [u8]) -> RabitqFactors {
    let dim = o.len();
    code.fill(0);
    let mut r2 = 0f64;
    let mut l1 = 0f64;
    let mut xc = 0f64;
    for (i, (&oi, &ci)) in o.iter().zip(c).enumerate() {
        let r = oi as f64 - ci as f64;
        r2 += r * r;
        l1 += r.abs();
        if r > 0.0 {
            code[i / 8] |= 1 << (i % 8);
            xc += ci as f64;
        } else {
            xc -= ci as f64;
        }
    }
    if r2 == 0.0 {
        return RabitqFactors::default();
    }
    let sqrt_d = (dim as f64).sqrt();
    let r_o = r2.sqrt();
    // γ ≥ 1/√D > 0 since Σ|r| ≥ ‖r‖.
    let gamma = (l1 / (sqrt_d * r_o)).min(1.0);
    let xc = xc / sqrt_d;
    RabitqFactors {
        add: (r2 + 2.0 * r_o * xc / gamma) as f32,
        rescale: (-2.0 * r_o / gamma) as f32,
        error: (2.0 * r_o * (1.0 - gamma * gamma).max(0.0).sqrt()
            / (gamma * ((dim - 1) as f64).sqrt())) as f32,
    }
}

/// A query prepared for one [`RaBitQ`]: its FastScan tables and the scalars
/// turning a FastScan sum into `⟨x̄, P q⟩`.
#[derive(Debug, Clone, PartialEq)]
pub struct RabitqQuery {
    dim: usize,
    luts: QuantizedLuts,
    ip_scale: f32,
    ip_offset: f32,
    ip_error: f32,
}

fn check_qc(qc_sq: f32) -> Result<()> {
    if !(qc_sq.is_finite() && qc_sq >= 0.0) {
        return Err(Error::arg(format!(
            "RaBitQ: ‖q − c‖² = {qc_sq}, expected a finite non-negative number"
        )));
    }
    Ok(())
}

fn check_eps0(eps0: f32) -> Result<()> {
    if !(eps0.is_finite() && eps0 >= 0.0) {
        return Err(Error::arg(format!(
            "RaBitQ: ε0 = {eps0}, expected a finite non-negative number"
        )));
    }
    Ok(())
}

impl RabitqQuery {
    /// Dimension `D`.
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// FastScan groups, `ceil(D / 4)`.
    pub fn n_groups(&self) -> usize {
        self.luts.n_groups()
    }
    /// The u8 FastScan tables (`16 · n_groups` bytes) for [`fastscan::scan`].
    pub fn luts(&self) -> &[u8] {
        self.luts.luts()
    }
    /// The quantized tables with their step, offset and error.
    pub fn quantized_luts(&self) -> &QuantizedLuts {
        &self.luts
    }
    /// `2Δ/√D`.
    pub fn ip_scale(&self) -> f32 {
        self.ip_scale
    }
    /// `(2·bias − Σq')/√D`.
    pub fn ip_offset(&self) -> f32 {
        self.ip_offset
    }
    /// Largest error of [`Self::inner_product`] due to the u8 tables.
    pub fn ip_error(&self) -> f32 {
        self.ip_error
    }

    /// `⟨x̄, P q⟩` of a code from its FastScan sum.
    #[inline]
    pub fn inner_product(&self, sum: u32) -> f32 {
        self.ip_scale * sum as f32 + self.ip_offset
    }

    /// Estimated `‖o − q‖²` of a code from its FastScan sum, its factors and
    /// `qc_sq = ‖q − c‖²` (not checked here: use [`Self::distances`] or
    /// [`Self::estimate`] for checked calls).
    #[inline]
    pub fn distance(&self, sum: u32, f: &RabitqFactors, qc_sq: f32) -> f32 {
        f.add + qc_sq + f.rescale * self.inner_product(sum)
    }

    /// Half-width of the interval around [`Self::distance`] that holds the
    /// true distance except with probability [`bound_failure_probability`]
    /// `(ε0, D)` (unchecked, as [`Self::distance`]).
    #[inline]
    pub fn error_bound(&self, f: &RabitqFactors, qc_sq: f32, eps0: f32) -> f32 {
        eps0 * f.error * qc_sq.sqrt() + f.rescale.abs() * self.ip_error
    }

    /// The FastScan sum of one unpacked code (same value as
    /// [`fastscan::scan`] gives for it).
    pub fn code_sum(&self, code: &[u8]) -> Result<u32> {
        let cb = self.dim.div_ceil(8);
        if code.len() != cb {
            return Err(Error::arg(format!(
                "RaBitQ code_sum: code has {} bytes, expected ceil(dim / 8) = {cb}",
                code.len()
            )));
        }
        let luts = self.luts.luts();
        let mut s = 0u32;
        for (g, lut) in luts.chunks_exact(LUT_ENTRIES).enumerate() {
            let nib = (code[g / 2] >> (4 * (g % 2))) & 0x0f;
            s += lut[nib as usize] as u32;
        }
        Ok(s)
    }

    /// Estimated `‖o − q‖²` of one unpacked code (scalar path).
    pub fn estimate(&self, code: &[u8], f: &RabitqFactors, qc_sq: f32) -> Result<f32> {
        check_qc(qc_sq)?;
        Ok(self.distance(self.code_sum(code)?, f, qc_sq))
    }

    /// Estimated distances of `factors.len()` codes from their FastScan
    /// `sums` (at least as many; padding sums are ignored) into `out`
    /// (`factors.len()` values).
    pub fn distances(
        &self,
        sums: &[u32],
        factors: &[RabitqFactors],
        qc_sq: f32,
        out: &mut [f32],
    ) -> Result<()> {
        check_qc(qc_sq)?;
        self.check_batch(sums, factors, out, "distances")?;
        for ((o, &s), f) in out.iter_mut().zip(sums).zip(factors) {
            *o = self.distance(s, f, qc_sq);
        }
        Ok(())
    }

    /// Scores a record's packed codes in one call: [`fastscan::scan`] into
    /// the caller's `sums` (32 per block of `packed`), then
    /// [`Self::distances`] for the `factors.len()` codes into `out`.
    pub fn estimate_packed(
        &self,
        packed: &[u8],
        factors: &[RabitqFactors],
        qc_sq: f32,
        sums: &mut [u32],
        out: &mut [f32],
    ) -> Result<()> {
        check_qc(qc_sq)?;
        self.check_batch(sums, factors, out, "estimate_packed")?;
        fastscan::scan(packed, self.n_groups(), self.luts(), sums)?;
        for ((o, &s), f) in out.iter_mut().zip(sums.iter()).zip(factors) {
            *o = self.distance(s, f, qc_sq);
        }
        Ok(())
    }

    /// [`Self::error_bound`] of `factors.len()` codes into `out`.
    pub fn error_bounds(
        &self,
        factors: &[RabitqFactors],
        qc_sq: f32,
        eps0: f32,
        out: &mut [f32],
    ) -> Result<()> {
        check_qc(qc_sq)?;
        check_eps0(eps0)?;
        if out.len() != factors.len() {
            return Err(Error::arg(format!(
                "RaBitQ error_bounds: output has {} slots for {} codes",
                out.len(),
                factors.len()
            )));
        }
        for (o, f) in out.iter_mut().zip(factors) {
            *o = self.error_bound(f, qc_sq, eps0);
        }
        Ok(())
    }

    fn check_batch(
        &self,
        sums: &[u32],
        factors: &[RabitqFactors],
        out: &[f32],
        what: &str,
    ) -> Result<()> {
        if sums.len() < factors.len() || out.len() != factors.len() {
            return Err(Error::arg(format!(
                "RaBitQ {what}: {} sums and {} output slots for {} codes (expected ≥ and =)",
                sums.len(),
                out.len(),
                factors.len()
            )));
        }
        Ok(())
    }
}

/// Probability that the ε0 term of the bound fails for one (vector, query)
/// pair: `P(|u| · sqrt(D − 1) > ε0)` for `u` one coordinate of a uniform
/// point on the unit sphere of `R^{D−1}` (density ∝ `(1 − t²)^{(D−4)/2}`),
/// by Simpson integration (absolute error below 1e-6). Tends to
/// `P(|N(0,1)| > ε0)` as `D` grows.
pub fn bound_failure_probability(eps0: f64, dim: usize) -> Result<f64> {
    if !(eps0.is_finite() && eps0 >= 0.0) {
        return Err(Error::arg(format!(
            "bound_failure_probability: ε0 = {eps0}, expected a finite non-negative number"
        )));
    }
    if dim < 2 {
        return Err(Error::arg(format!(
            "bound_failure_probability: dim = {dim}, expected at least 2"
        )));
    }
    let n = (dim - 1) as f64;
    let a = eps0 / n.sqrt();
    if a >= 1.0 {
        return Ok(0.0);
    }
    match dim {
        // u = ±1.
        2 => Ok(1.0),
        // u = cos θ, θ uniform.
        3 => Ok(1.0 - std::f64::consts::FRAC_2_PI * a.asin()),
        _ => {
            // s = t·sqrt(n): density ∝ (1 − s²/n)^k, k = (D − 4)/2.
            let k = (dim as f64 - 4.0) / 2.0;
            let top = n.sqrt().min(40.0);
            let f = |s: f64| {
                let x = 1.0 - s * s / n;
                if x <= 0.0 {
                    if k == 0.0 {
                        1.0
                    } else {
                        0.0
                    }
                } else {
                    (k * x.ln()).exp()
                }
            };
            let simpson = |lo: f64, hi: f64| {
                const N: usize = 20_000;
                let h = (hi - lo) / N as f64;
                let mut s = f(lo) + f(hi);
                for i in 1..N {
                    s += f(lo + i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
                }
                s * h / 3.0
            };
            let split = eps0.min(top);
            let inside = simpson(0.0, split);
            let outside = simpson(split, top);
            Ok((outside / (inside + outside)).clamp(0.0, 1.0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::fastscan::{scan, FASTSCAN_BLOCK};
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn gauss(rng: &mut ChaCha8Rng) -> f32 {
        (0..12).map(|_| rng.random::<f32>()).sum::<f32>() - 6.0
    }

    fn l2(a: &[f32], b: &[f32]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
            .sum()
    }

    fn rotated(q: &RaBitQ, x: &[f32]) -> Vec<f32> {
        let mut out = vec![0f32; q.dim()];
        q.rotate(x, &mut out).unwrap();
        out
    }

    /// Statistics of estimates against true distances.
    #[derive(Debug, Default)]
    struct Stats {
        pairs: usize,
        codes: usize,
        violations_19: usize,
        violations_3: usize,
        /// Violations of the ε0 = 1.9 term alone by the estimator with the
        /// exact rotated query (no table quantization): the paper's setting.
        violations_exact_19: usize,
        sum_err: f64,
        sum_err2: f64,
        sum_true: f64,
    }

    /// Clustered data (10 Gaussian clusters, centres spread 3× the cluster
    /// width): 20 records, each a centre and 32 neighbours (24 from its own
    /// cluster, 8 from others, like a graph's short and long edges), and 16
    /// queries near random clusters: 20 × 32 × 16 = 10,240 pairs.
    ///
    /// `isotropic`: one standard Gaussian and every centre at its mean, so
    /// `o − c` and `q − c` are nearly orthogonal: the hardest case for the
    /// bound, where the failure rate should approach the stated one.
    fn run_pairs(dim: usize, seed: u64, isotropic: bool) -> Stats {
        let q = RaBitQ::new(dim, seed).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed + 1);
        let k = 10;
        let spread = if isotropic { 0.0 } else { 3.0 };
        let mus: Vec<Vec<f32>> = (0..k)
            .map(|_| (0..dim).map(|_| spread * gauss(&mut rng)).collect())
            .collect();
        let point = |c: usize, rng: &mut ChaCha8Rng| -> Vec<f32> {
            mus[c].iter().map(|&m| m + gauss(rng)).collect()
        };
        let queries: Vec<Vec<f32>> = (0..16)
            .map(|_| {
                let c = rng.random_range(0..k);
                point(c, &mut rng)
            })
            .collect();
        let prepared: Vec<RabitqQuery> = queries
            .iter()
            .map(|x| q.prepare_query(x).unwrap())
            .collect();
        let mut st = Stats::default();
        let mut sums = vec![0u32; 32];
        let mut est = vec![0f32; 32];
        let (mut b19, mut b3) = (vec![0f32; 32], vec![0f32; 32]);
        for r in 0..20 {
            let home = r % k;
            let centre = if isotropic {
                vec![0.0; dim]
            } else {
                point(home, &mut rng)
            };
            let nbrs: Vec<Vec<f32>> = (0..32)
                .map(|i| {
                    let c = if i < 24 { home } else { rng.random_range(0..k) };
                    point(c, &mut rng)
                })
                .collect();
            let flat: Vec<f32> = nbrs.iter().flat_map(|x| rotated(&q, x)).collect();
            let c_rot = rotated(&q, &centre);
            let (packed, factors) = q.encode_packed_rotated(&flat, &c_rot).unwrap();
            st.codes += nbrs.len();
            let signs: Vec<Vec<f64>> = flat
                .chunks_exact(dim)
                .map(|o| {
                    o.iter()
                        .zip(&c_rot)
                        .map(|(a, b)| if a > b { 1.0 } else { -1.0 })
                        .collect()
                })
                .collect();
            for (qx, pq) in queries.iter().zip(&prepared) {
                let q_rot = rotated(&q, qx);
                let qc = l2(qx, &centre) as f32;
                if r % 2 == 0 {
                    scan(&packed, q.n_groups(), pq.luts(), &mut sums).unwrap();
                    pq.distances(&sums, &factors, qc, &mut est).unwrap();
                } else {
                    pq.estimate_packed(&packed, &factors, qc, &mut sums, &mut est)
                        .unwrap();
                }
                pq.error_bounds(&factors, qc, 1.9, &mut b19).unwrap();
                pq.error_bounds(&factors, qc, 3.0, &mut b3).unwrap();
                for (i, o) in nbrs.iter().enumerate() {
                    let truth = l2(o, qx);
                    let err = est[i] as f64 - truth;
                    st.pairs += 1;
                    st.violations_19 += usize::from(err.abs() > b19[i] as f64);
                    st.violations_3 += usize::from(err.abs() > b3[i] as f64);
                    let ip: f64 = signs[i]
                        .iter()
                        .zip(&q_rot)
                        .map(|(s, &x)| s * x as f64)
                        .sum::<f64>()
                        / (dim as f64).sqrt();
                    let f = &factors[i];
                    let exact = f.add as f64 + qc as f64 + f.rescale as f64 * ip;
                    let term = 1.9 * f.error as f64 * (qc as f64).sqrt();
                    st.violations_exact_19 += usize::from((exact - truth).abs() > term);
                    st.sum_err += err;
                    st.sum_err2 += err * err;
                    st.sum_true += truth;
                }
            }
        }
        st
    }

    /// Allowed violations: the stated probability plus 3 binomial standard
    /// deviations for the number of pairs.
    fn allowed(p: f64, n: usize) -> f64 {
        p + 3.0 * (p * (1.0 - p) / n as f64).sqrt()
    }

    #[test]
    fn error_bound_fails_no_more_often_than_stated() {
        for (dim, seed, iso) in [
            (128, 11, false),
            (384, 12, false),
            (128, 13, true),
            (384, 14, true),
        ] {
            let st = run_pairs(dim, seed, iso);
            assert!(st.pairs >= 10_000);
            let p19 = bound_failure_probability(1.9, dim).unwrap();
            let p3 = bound_failure_probability(3.0, dim).unwrap();
            let r19 = st.violations_19 as f64 / st.pairs as f64;
            let r3 = st.violations_3 as f64 / st.pairs as f64;
            let rx = st.violations_exact_19 as f64 / st.pairs as f64;
            println!(
                "D = {dim}, isotropic {iso}: {} pairs, ε0 = 1.9 fails {r19:.4} (stated {p19:.4}), ε0 = 3 fails {r3:.4} (stated {p3:.4}); exact query, ε0 term alone: {rx:.4}",
                st.pairs
            );
            assert!(rx <= allowed(p19, st.pairs), "D = {dim}: {rx} > {p19}");
            assert!(r19 <= allowed(p19, st.pairs), "D = {dim}: {r19} > {p19}");
            assert!(r3 <= allowed(p3, st.pairs), "D = {dim}: {r3} > {p3}");
            if iso {
                // The probability is tight: near-orthogonal pairs with the
                // exact query fail at close to the stated rate. (The table
                // term is a worst case, so the full bound fails less often.)
                assert!(rx >= 0.85 * p19, "D = {dim}: {rx} ≪ {p19}");
            }
        }
    }

    #[test]
    fn estimator_is_unbiased_on_average() {
        for (dim, seed, iso) in [(128, 21, false), (384, 22, false), (256, 23, true)] {
            let st = run_pairs(dim, seed, iso);
            let n = st.pairs as f64;
            let mean_err = st.sum_err / n;
            let sd = (st.sum_err2 / n - mean_err * mean_err).sqrt();
            let rel_bias = st.sum_err / st.sum_true;
            let rel_sd = sd / (st.sum_true / n);
            println!(
                "D = {dim}, isotropic {iso}: relative bias {rel_bias:+.5}, relative sd per pair {rel_sd:.4}"
            );
            // Errors of one code are correlated across queries, so count
            // codes, not pairs, as independent samples: |mean| ≤ 4 sd/√codes.
            assert!(
                mean_err.abs() <= 4.0 * sd / (st.codes as f64).sqrt(),
                "D = {dim}: mean error {mean_err}, sd {sd}"
            );
            // Stated tolerance: relative bias below 0.5%.
            assert!(rel_bias.abs() < 0.005, "D = {dim}: {rel_bias}");
        }
    }

    #[test]
    fn estimate_matches_its_definition_and_table_error() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for dim in [2, 3, 13, 64, 100, 128] {
            let q = RaBitQ::new(dim, dim as u64).unwrap();
            let n = 45;
            let vecs: Vec<f32> = (0..n * dim).map(|_| gauss(&mut rng)).collect();
            let c: Vec<f32> = (0..dim).map(|_| 0.5 * gauss(&mut rng)).collect();
            let x: Vec<f32> = (0..dim).map(|_| 2.0 * gauss(&mut rng)).collect();
            let c_rot = rotated(&q, &c);
            let q_rot = rotated(&q, &x);
            let pq = q.prepare_query(&x).unwrap();
            assert_eq!(pq, q.prepare_query_rotated(&q_rot).unwrap());
            let v_rot: Vec<f32> = vecs
                .chunks_exact(dim)
                .flat_map(|v| rotated(&q, v))
                .collect();
            let (packed, factors) = q.encode_packed_rotated(&v_rot, &c_rot).unwrap();
            assert_eq!(packed.len(), 64 * q.n_groups() * 16 / FASTSCAN_BLOCK);
            let mut sums = vec![0u32; 64];
            scan(&packed, q.n_groups(), pq.luts(), &mut sums).unwrap();
            let qc = l2(&x, &c) as f32;
            for (i, o) in vecs.chunks_exact(dim).enumerate() {
                let mut code = vec![0u8; q.code_bytes()];
                let f = q.encode(o, &c, &mut code).unwrap();
                let f2 = q
                    .encode_rotated(&v_rot[i * dim..][..dim], &c_rot, &mut code)
                    .unwrap();
                assert_eq!(f, f2);
                assert_eq!(f, factors[i]);
                // Scalar and FastScan sums agree bit for bit.
                assert_eq!(pq.code_sum(&code).unwrap(), sums[i]);
                assert_eq!(
                    pq.estimate(&code, &f, qc).unwrap(),
                    pq.distance(sums[i], &f, qc)
                );
                // The definition, in f64 with the exact rotated query.
                let r: Vec<f64> = (0..dim)
                    .map(|j| v_rot[i * dim + j] as f64 - c_rot[j] as f64)
                    .collect();
                let r_o = r.iter().map(|x| x * x).sum::<f64>().sqrt();
                let sd = (dim as f64).sqrt();
                let xbar: Vec<f64> = r
                    .iter()
                    .map(|&x| if x > 0.0 { 1.0 / sd } else { -1.0 / sd })
                    .collect();
                for (j, &xb) in xbar.iter().enumerate() {
                    assert_eq!(code[j / 8] >> (j % 8) & 1 == 1, xb > 0.0);
                }
                let gamma: f64 = r.iter().zip(&xbar).map(|(a, b)| a * b).sum::<f64>() / r_o;
                let ip_q: f64 = xbar.iter().zip(&q_rot).map(|(a, &b)| a * b as f64).sum();
                let ip_c: f64 = xbar.iter().zip(&c_rot).map(|(a, &b)| a * b as f64).sum();
                let want = r_o * r_o + qc as f64 - 2.0 * r_o * (ip_q - ip_c) / gamma;
                let ip = pq.inner_product(sums[i]) as f64;
                assert!(
                    (ip - ip_q).abs() <= pq.ip_error() as f64 * 1.001 + 1e-5 * (1.0 + ip_q.abs()),
                    "D = {dim}: ip {ip} vs {ip_q} (table error {})",
                    pq.ip_error()
                );
                let got = pq.distance(sums[i], &f, qc) as f64;
                let slack = f.rescale.abs() as f64 * pq.ip_error() as f64 * 1.001
                    + 1e-4 * (want.abs() + f.add.abs() as f64 + qc as f64);
                assert!((got - want).abs() <= slack, "D = {dim}: {got} vs {want}");
                let e = 2.0 * r_o * (1.0 - gamma * gamma).max(0.0).sqrt()
                    / (gamma * ((dim - 1) as f64).sqrt());
                assert!((f.error as f64 - e).abs() <= 1e-5 * (1.0 + e));
            }
        }
    }

    #[test]
    fn a_vector_equal_to_its_centre_is_exact() {
        let q = RaBitQ::new(20, 1).unwrap();
        let c: Vec<f32> = (0..20).map(|i| i as f32 * 0.3 - 2.0).collect();
        let mut code = vec![0xffu8; 3];
        let f = q.encode(&c, &c, &mut code).unwrap();
        assert_eq!(f, RabitqFactors::default());
        assert_eq!(code, vec![0, 0, 0]);
        let x: Vec<f32> = (0..20).map(|i| (i as f32).sin()).collect();
        let pq = q.prepare_query(&x).unwrap();
        let qc = l2(&x, &c) as f32;
        assert_eq!(pq.estimate(&code, &f, qc).unwrap(), qc);
        assert_eq!(pq.error_bound(&f, qc, 1.9), 0.0);
    }

    #[test]
    fn a_code_that_fits_exactly_has_no_error_term() {
        // With the identity rotation and o − c = ±s in every dimension, the
        // code is exact: γ = 1, error 0; only the table error remains.
        let dim = 16;
        let q = RaBitQ::from_parts(Rotation::identity(dim).unwrap()).unwrap();
        let c = vec![1.0f32; dim];
        let o: Vec<f32> = (0..dim)
            .map(|i| if i % 3 == 0 { 1.5 } else { 0.5 })
            .collect();
        let mut code = vec![0u8; 2];
        let f = q.encode(&o, &c, &mut code).unwrap();
        assert_eq!(f.error, 0.0);
        assert_eq!(code, vec![0b0100_1001, 0b1001_0010]);
        let x: Vec<f32> = (0..dim).map(|i| (i as f32 * 0.7).cos()).collect();
        let pq = q.prepare_query(&x).unwrap();
        let qc = l2(&x, &c) as f32;
        let est = pq.estimate(&code, &f, qc).unwrap() as f64;
        let truth = l2(&o, &x);
        assert!((est - truth).abs() <= pq.error_bound(&f, qc, 0.0) as f64 + 1e-5);
    }

    #[test]
    fn failure_probability_matches_closed_forms() {
        let p = |e: f64, d: usize| bound_failure_probability(e, d).unwrap();
        // D = 4: u uniform on [-1, 1].
        assert!((p(1.0, 4) - (1.0 - 1.0 / 3f64.sqrt())).abs() < 1e-6);
        // D = 3: u = cos θ.
        let a = 0.9 / 2f64.sqrt();
        assert!((p(0.9, 3) - (1.0 - a.asin() * std::f64::consts::FRAC_2_PI)).abs() < 1e-12);
        // D = 5: density ∝ sqrt(1 − t²); D = 6: ∝ 1 − t² (u = t, a = ε0/√(D−1)).
        let a = 1.3f64 / 2.0;
        let want5 = 1.0 - (a * (1.0 - a * a).sqrt() + a.asin()) * std::f64::consts::FRAC_2_PI;
        assert!((p(1.3, 5) - want5).abs() < 1e-6, "{} vs {want5}", p(1.3, 5));
        let a = 1.3 / 5f64.sqrt();
        let want6 = 1.0 - (3.0 * a - a * a * a) / 2.0;
        assert!((p(1.3, 6) - want6).abs() < 1e-9, "{} vs {want6}", p(1.3, 6));
        assert_eq!(p(0.5, 2), 1.0);
        assert_eq!(p(1.0, 2), 0.0);
        assert_eq!(p(0.0, 50), 1.0);
        assert_eq!(p(100.0, 50), 0.0);
        // Large D: the two-sided normal tail, 0.0574 at 1.9, 0.0027 at 3.
        assert!(
            (p(1.9, 100_000) - 0.057_433).abs() < 1e-4,
            "{}",
            p(1.9, 100_000)
        );
        assert!((p(3.0, 100_000) - 0.002_700).abs() < 1e-4);
        // The values quoted in the module documentation.
        assert!((p(1.9, 128) - 0.0571).abs() < 1e-4, "{}", p(1.9, 128));
        assert!((p(3.0, 128) - 0.0024).abs() < 1e-4, "{}", p(3.0, 128));
        let mut last = 1.0;
        for e in [0.5, 1.0, 1.5, 1.9, 2.5, 3.0] {
            let v = p(e, 256);
            assert!(v < last);
            last = v;
        }
        assert!(bound_failure_probability(f64::NAN, 10).is_err());
        assert!(bound_failure_probability(-1.0, 10).is_err());
        assert!(bound_failure_probability(1.0, 1).is_err());
    }

    #[test]
    fn parts_and_bad_input() {
        let q = RaBitQ::new(24, 9).unwrap();
        let back = RaBitQ::from_parts(q.clone().into_parts()).unwrap();
        assert_eq!(back, q);
        assert!(RaBitQ::new(1, 0).is_err());
        assert!(RaBitQ::new(PCA_MAX_DIM + 1, 0).is_err());
        assert!(RaBitQ::from_parts(Rotation::identity(1).unwrap()).is_err());

        let v = vec![0.5f32; 24];
        let mut nan = v.clone();
        nan[3] = f32::NAN;
        let mut code = vec![0u8; 3];
        assert!(q.encode(&v[..23], &v, &mut code).is_err());
        assert!(q.encode(&v, &nan, &mut code).is_err());
        assert!(q.encode(&v, &v, &mut code[..2]).is_err());
        assert!(q.encode_rotated(&nan, &v, &mut code).is_err());
        assert!(q.encode_packed_rotated(&v[..20], &v).is_err());
        assert!(q.encode_packed_rotated(&nan, &v).is_err());
        assert!(q.encode_packed_rotated(&v, &v[..5]).is_err());
        assert!(q.prepare_query(&v[..5]).is_err());
        assert!(q.prepare_query(&nan).is_err());
        assert!(q.prepare_query_rotated(&nan).is_err());
        let pq = q.prepare_query(&v).unwrap();
        let f = [RabitqFactors::default(); 3];
        let mut out = [0f32; 3];
        assert!(pq.code_sum(&code[..2]).is_err());
        assert!(pq.estimate(&code, &f[0], f32::NAN).is_err());
        assert!(pq.estimate(&code, &f[0], -1.0).is_err());
        assert!(pq.distances(&[0; 32], &f, 1.0, &mut out).is_ok());
        assert!(pq.distances(&[0; 2], &f, 1.0, &mut out).is_err());
        assert!(pq.distances(&[0; 32], &f, 1.0, &mut out[..2]).is_err());
        assert!(pq.distances(&[0; 32], &f, f32::INFINITY, &mut out).is_err());
        let packed = vec![0u8; 6 * 16];
        let mut sums = [0u32; 32];
        assert!(pq
            .estimate_packed(&packed, &f, 1.0, &mut sums, &mut out)
            .is_ok());
        assert!(pq
            .estimate_packed(&packed[..16], &f, 1.0, &mut sums, &mut out)
            .is_err());
        assert!(pq
            .estimate_packed(&packed, &f, 1.0, &mut sums[..31], &mut out)
            .is_err());
        assert!(pq
            .estimate_packed(&packed, &f, f32::NAN, &mut sums, &mut out)
            .is_err());
        assert!(pq.error_bounds(&f, 1.0, 1.9, &mut out).is_ok());
        assert!(pq.error_bounds(&f, 1.0, f32::NAN, &mut out).is_err());
        assert!(pq.error_bounds(&f, 1.0, 1.9, &mut out[..1]).is_err());
        // Factors cast from record bytes.
        let raw: Vec<u8> = bytemuck::cast_slice(&[1.0f32, -2.0, 0.5]).to_vec();
        let f: RabitqFactors = bytemuck::pod_read_unaligned(&raw);
        assert_eq!(
            f,
            RabitqFactors {
                add: 1.0,
                rescale: -2.0,
                error: 0.5
            }
        );
    }

    /// Speed check, not run by default:
    /// `cargo test -p nearline --lib rabitq_speed -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn rabitq_speed() {
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        for (r, dim) in [(64usize, 256usize), (128, 256), (64, 128)] {
            let q = RaBitQ::new(dim, 1).unwrap();
            let records = 512;
            let data: Vec<Vec<f32>> = (0..records * (r + 1))
                .map(|_| (0..dim).map(|_| gauss(&mut rng)).collect())
                .collect();
            let recs: Vec<(Vec<u8>, Vec<RabitqFactors>)> = data
                .chunks_exact(r + 1)
                .map(|g| {
                    let flat: Vec<f32> = g[1..].iter().flat_map(|x| rotated(&q, x)).collect();
                    q.encode_packed_rotated(&flat, &rotated(&q, &g[0])).unwrap()
                })
                .collect();
            let queries: Vec<Vec<f32>> = (0..200)
                .map(|_| (0..dim).map(|_| gauss(&mut rng)).collect())
                .collect();
            let t = std::time::Instant::now();
            let prepared: Vec<RabitqQuery> = queries
                .iter()
                .map(|x| q.prepare_query(x).unwrap())
                .collect();
            let prep = t.elapsed() / queries.len() as u32;
            let mut sums = vec![0u32; r];
            let mut out = vec![0f32; r];
            let t = std::time::Instant::now();
            let mut check = 0f64;
            for pq in &prepared {
                for (packed, f) in &recs {
                    pq.estimate_packed(packed, f, 1.0, &mut sums, &mut out)
                        .unwrap();
                    check += out[5] as f64;
                }
            }
            let per = t.elapsed().as_secs_f64() / (prepared.len() * records) as f64;
            println!(
                "R = {r:3}, D = {dim}: prepare_query {prep:.2?}, estimate_packed {:.1} ns per record ({:.2} ns per neighbour) [{check:.0}]",
                per * 1e9,
                per * 1e9 / r as f64
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// With ε0 = sqrt(D − 1) the bound cannot fail (|u| ≤ 1 by
        /// Cauchy–Schwarz), whatever the data.
        #[test]
        fn prop_bound_with_full_eps0_always_holds(
            dim in 2usize..70,
            seed in any::<u64>(),
            scale in 0.01f32..100.0,
        ) {
            let q = RaBitQ::new(dim, seed).unwrap();
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let o: Vec<f32> = (0..dim).map(|_| scale * gauss(&mut rng)).collect();
            let c: Vec<f32> = (0..dim).map(|_| scale * gauss(&mut rng)).collect();
            let x: Vec<f32> = (0..dim).map(|_| scale * gauss(&mut rng)).collect();
            let mut code = vec![0u8; q.code_bytes()];
            let f = q.encode(&o, &c, &mut code).unwrap();
            let pq = q.prepare_query(&x).unwrap();
            let qc = l2(&x, &c) as f32;
            let est = pq.estimate(&code, &f, qc).unwrap() as f64;
            let truth = l2(&o, &x);
            let eps0 = ((dim - 1) as f32).sqrt();
            let bound = pq.error_bound(&f, qc, eps0) as f64;
            let slack = 1e-4 * (truth + qc as f64 + f.add.abs() as f64) + 1e-6;
            prop_assert!((est - truth).abs() <= bound * 1.0001 + slack,
                "D = {}: est {} truth {} bound {}", dim, est, truth, bound);
        }
    }
}
