//! Principal component analysis and random orthogonal rotations.
//!
//! [`Pca`] is fitted on a sample: the mean, the covariance (f64, divided by
//! the sample size) and its full eigen-decomposition by Householder
//! tridiagonalisation and the implicit QL algorithm with Wilkinson shifts
//! (EISPACK `tred2`/`tql2`, in f64), `O(d³)`. The basis rows are the
//! eigenvectors sorted by decreasing eigenvalue (variance); each sign is
//! fixed so that its largest-magnitude entry is positive.
//!
//! [`Pca::transform`] maps `x` to `y = B (x − mean)` with all `d` dimensions:
//! `y[..principal]` are the principal dimensions, `y[principal..]` the
//! residual. `B` is orthonormal, so `‖x − q‖² = ‖y_x − y_q‖²` = principal
//! part + residual part, and a re-rank from both parts is exact up to float
//! rounding.
//!
//! [`Rotation`] is a Haar-random orthogonal matrix for RaBitQ: the rows of a
//! matrix of independent standard normal entries (ChaCha8 from the seed,
//! Box–Muller), orthonormalised by Gram–Schmidt with one re-orthogonalisation
//! pass, in f64. This is the Q factor of the Gaussian matrix's QR
//! decomposition with a positive diagonal in R, which is Haar distributed.
//! Deterministic for a seed. Applying it costs `d²` per vector.
//!
//! Both are at most [`PCA_MAX_DIM`] dimensions. Their matrices are stored
//! row-major in f32. Serialised forms (sections, little-endian):
//!
//! | section  | magic   | fields after the version                                    |
//! |----------|---------|-------------------------------------------------------------|
//! | PCA      | `NLPC`  | u32 dim, u32 principal, f32 mean[dim], f32 variances[dim], f32 basis[dim²] |
//! | rotation | `NLRT`  | u32 dim, f32 matrix[dim²]                                   |

use crate::kernels::dot_f32;
use crate::{Error, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

/// Largest dimension [`Pca::fit`] and [`Rotation::random`] accept.
pub const PCA_MAX_DIM: usize = 4096;

/// Largest `|‖M u‖² − 1|` (and row-norm deviation) [`Pca::from_parts`] and
/// [`Rotation::from_parts`] accept for their matrices.
pub const ORTHONORMAL_TOLERANCE: f64 = 1e-3;
/// Magic of a serialised PCA (see [`crate::format::quant`]).
pub const PCA_MAGIC: &[u8; 4] = b"NLPC";
/// Version written by [`crate::format::quant`].
pub const PCA_VERSION: u32 = 1;
/// Magic of a serialised rotation.
pub const ROTATION_MAGIC: &[u8; 4] = b"NLRT";
/// Version written by [`crate::format::quant`].
pub const ROTATION_VERSION: u32 = 1;

/// QL iterations allowed per eigenvalue before giving up (30 in EISPACK;
/// well-conditioned input needs 1 to 3).
const QL_MAX_ITERS: usize = 60;

/// Rows per parallel work item when transforming batches.
const TRANSFORM_CHUNK: usize = 256;

/// Sample rows summed together in the covariance (one f64 column-major tile).
const COV_BLOCK: usize = 256;

/// A fitted PCA: mean, orthonormal basis sorted by decreasing variance, and
/// the number of principal dimensions.
#[derive(Debug, Clone, PartialEq)]
pub struct Pca {
    dim: usize,
    principal: usize,
    mean: Vec<f32>,
    /// `dim × dim` row-major: row k is the k-th principal axis.
    basis: Vec<f32>,
    /// Variance along each axis (eigenvalues), non-increasing, ≥ 0.
    variances: Vec<f32>,
}

fn check_dim(dim: usize, what: &str) -> Result<()> {
    if dim == 0 || dim > PCA_MAX_DIM {
        return Err(Error::arg(format!(
            "{what}: dim = {dim}, expected 1..={PCA_MAX_DIM}"
        )));
    }
    Ok(())
}

fn check_finite(v: &[f32], what: &str, field: &str) -> Result<()> {
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        return Err(Error::arg(format!(
            "{what}: {field}[{i}] is {} (expected a finite number)",
            v[i]
        )));
    }
    Ok(())
}

fn check_len(len: usize, want: usize, what: &str, field: &str) -> Result<()> {
    if len != want {
        return Err(Error::arg(format!(
            "{what}: {field} has {len} values, expected {want}"
        )));
    }
    Ok(())
}

/// Checks that a row-major `dim × dim` matrix is orthonormal: every row has
/// unit norm, and `‖M u‖ = ‖u‖` for a few fixed pseudo-random probes `u`
/// (together `O(d²)`; [`orthonormality_error`] is the full `O(d³)` check).
fn check_orthonormal(m: &[f32], dim: usize, what: &str, field: &str) -> Result<()> {
    for (i, row) in m.chunks_exact(dim).enumerate() {
        let n2: f64 = row.iter().map(|&x| x as f64 * x as f64).sum();
        if (n2 - 1.0).abs() > ORTHONORMAL_TOLERANCE {
            return Err(Error::arg(format!(
                "{what}: {field} row {i} has squared norm {n2}, expected 1 (orthonormal rows)"
            )));
        }
    }
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0f0e);
    for probe in 0..3 {
        let u: Vec<f64> = (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect();
        let un2: f64 = u.iter().map(|x| x * x).sum();
        if un2 == 0.0 {
            continue;
        }
        let mut mn2 = 0.0;
        for row in m.chunks_exact(dim) {
            let y: f64 = row.iter().zip(&u).map(|(&a, &b)| a as f64 * b).sum();
            mn2 += y * y;
        }
        let dev = (mn2 / un2 - 1.0).abs();
        if dev > ORTHONORMAL_TOLERANCE {
            return Err(Error::arg(format!(
                "{what}: {field} changes the squared norm of probe {probe} by a factor {} (expected an orthonormal matrix)",
                mn2 / un2
            )));
        }
    }
    Ok(())
}

/// Largest `|(M Mᵀ − I)_{ij}|` of a row-major `dim × dim` matrix, in f64
/// (`O(d³)`): 0 for an exactly orthonormal matrix, about `1e-7` for one
/// rounded to f32. Fails if `m` does not hold `dim²` values.
pub fn orthonormality_error(m: &[f32], dim: usize) -> Result<f64> {
    let want = dim
        .checked_mul(dim)
        .ok_or_else(|| Error::arg(format!("orthonormality_error: dim = {dim} is too large")))?;
    check_len(m.len(), want, "orthonormality_error", "matrix")?;
    let mut worst = 0f64;
    for i in 0..dim {
        let a = &m[i * dim..(i + 1) * dim];
        for j in i..dim {
            let b = &m[j * dim..(j + 1) * dim];
            let d: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
            let want = if i == j { 1.0 } else { 0.0 };
            worst = worst.max((d - want).abs());
        }
    }
    Ok(worst)
}

/// `out = M x` for a row-major `dim × dim` matrix (one SIMD dot per row).
#[inline]
fn mat_vec(m: &[f32], dim: usize, x: &[f32], out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(m.chunks_exact(dim)) {
        *o = dot_f32(row, x);
    }
}

/// `out = Mᵀ y` for a row-major `dim × dim` matrix.
#[inline]
fn mat_t_vec(m: &[f32], dim: usize, y: &[f32], out: &mut [f32]) {
    out.fill(0.0);
    for (&yk, row) in y.iter().zip(m.chunks_exact(dim)) {
        for (o, &r) in out.iter_mut().zip(row) {
            *o += yk * r;
        }
    }
}

/// Rows of a batch multiplied together: each matrix row is read once per
/// tile (from L1) instead of once per vector (from L3 or memory).
const TILE_ROWS: usize = 16;

/// `out_r = M x_r` for the rows of `x` (`n × dim`), in parallel tiles.
fn mat_vec_batch(m: &[f32], dim: usize, x: &[f32], out: &mut [f32]) {
    out.par_chunks_mut(TRANSFORM_CHUNK * dim)
        .zip(x.par_chunks(TRANSFORM_CHUNK * dim))
        .for_each(|(o, x)| {
            for (ot, xt) in o.chunks_mut(TILE_ROWS * dim).zip(x.chunks(TILE_ROWS * dim)) {
                for (k, row) in m.chunks_exact(dim).enumerate() {
                    for (orow, xrow) in ot.chunks_exact_mut(dim).zip(xt.chunks_exact(dim)) {
                        orow[k] = dot_f32(row, xrow);
                    }
                }
            }
        });
}

impl Pca {
    /// Fits on the row-major `sample` (`n × dim`, `n ≥ 1`) keeping
    /// `principal` (`1..=dim`) principal dimensions. Runs on the caller's
    /// rayon pool; the result does not depend on the thread count.
    pub fn fit(sample: &[f32], dim: usize, principal: usize) -> Result<Self> {
        const WHAT: &str = "PCA fit";
        check_dim(dim, WHAT)?;
        if !sample.len().is_multiple_of(dim) || sample.is_empty() {
            return Err(Error::arg(format!(
                "{WHAT}: sample has {} values, expected a positive multiple of dim = {dim}",
                sample.len()
            )));
        }
        if principal == 0 || principal > dim {
            return Err(Error::arg(format!(
                "{WHAT}: principal = {principal}, expected 1..=dim = {dim}"
            )));
        }
        if let Some(pos) = sample.iter().position(|v| !v.is_finite()) {
            return Err(Error::arg(format!(
                "{WHAT}: sample value at row {}, column {} is {} (expected a finite number)",
                pos / dim,
                pos % dim,
                sample[pos]
            )));
        }
        let n = sample.len() / dim;
        let mean = mean_f64(sample, dim);
        let mut cov = covariance(sample, dim, &mean);
        let inv_n = 1.0 / n as f64;
        cov.iter_mut().for_each(|c| *c *= inv_n);
        let (values, vectors) = symmetric_eigen(&mut cov, dim)?;
        Ok(Pca {
            dim,
            principal,
            mean: mean.iter().map(|&m| m as f32).collect(),
            basis: vectors.iter().map(|&v| v as f32).collect(),
            variances: values.iter().map(|&v| v.max(0.0) as f32).collect(),
        })
    }

    /// Rebuilds a PCA from its parts (as returned by the getters), checking
    /// sizes, finiteness, `1 ≤ principal ≤ dim`, non-negative non-increasing
    /// variances and an orthonormal basis (see [`ORTHONORMAL_TOLERANCE`]).
    pub fn from_parts(
        dim: usize,
        principal: usize,
        mean: Vec<f32>,
        basis: Vec<f32>,
        variances: Vec<f32>,
    ) -> Result<Self> {
        const WHAT: &str = "PCA parts";
        check_dim(dim, WHAT)?;
        if principal == 0 || principal > dim {
            return Err(Error::arg(format!(
                "{WHAT}: principal = {principal}, expected 1..=dim = {dim}"
            )));
        }
        check_len(mean.len(), dim, WHAT, "mean")?;
        check_len(variances.len(), dim, WHAT, "variances")?;
        check_len(basis.len(), dim * dim, WHAT, "basis")?;
        check_finite(&mean, WHAT, "mean")?;
        check_finite(&variances, WHAT, "variances")?;
        check_finite(&basis, WHAT, "basis")?;
        if let Some(i) = variances.iter().position(|&v| v < 0.0) {
            return Err(Error::arg(format!(
                "{WHAT}: variances[{i}] = {} is negative",
                variances[i]
            )));
        }
        if let Some(i) = variances.windows(2).position(|w| w[1] > w[0]) {
            return Err(Error::arg(format!(
                "{WHAT}: variances[{}] = {} exceeds variances[{i}] = {} (expected non-increasing)",
                i + 1,
                variances[i + 1],
                variances[i]
            )));
        }
        check_orthonormal(&basis, dim, WHAT, "basis")?;
        Ok(Pca {
            dim,
            principal,
            mean,
            basis,
            variances,
        })
    }

    /// The parts [`Self::from_parts`] takes: `(dim, principal, mean, basis,
    /// variances)`.
    pub fn into_parts(self) -> (usize, usize, Vec<f32>, Vec<f32>, Vec<f32>) {
        (
            self.dim,
            self.principal,
            self.mean,
            self.basis,
            self.variances,
        )
    }

    /// The same PCA keeping `principal` (`1..=dim`) principal dimensions.
    pub fn with_principal(mut self, principal: usize) -> Result<Self> {
        if principal == 0 || principal > self.dim {
            return Err(Error::arg(format!(
                "PCA: principal = {principal}, expected 1..=dim = {}",
                self.dim
            )));
        }
        self.principal = principal;
        Ok(self)
    }

    /// Input (and output) dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// Number of principal dimensions (the first ones of the output).
    pub fn principal(&self) -> usize {
        self.principal
    }
    /// Number of residual dimensions, `dim − principal`.
    pub fn residual(&self) -> usize {
        self.dim - self.principal
    }
    /// The sample mean subtracted before projecting.
    pub fn mean(&self) -> &[f32] {
        &self.mean
    }
    /// The orthonormal basis, `dim × dim` row-major, row k = k-th axis.
    pub fn basis(&self) -> &[f32] {
        &self.basis
    }
    /// Variance of the sample along each axis, non-increasing.
    pub fn variances(&self) -> &[f32] {
        &self.variances
    }
    /// Fraction of the total variance in the principal dimensions (1 when
    /// the total is 0).
    pub fn explained_variance_ratio(&self) -> f64 {
        let total: f64 = self.variances.iter().map(|&v| v as f64).sum();
        if total <= 0.0 {
            return 1.0;
        }
        self.variances[..self.principal]
            .iter()
            .map(|&v| v as f64)
            .sum::<f64>()
            / total
    }

    /// `out = basis · (x − mean)`, all `dim` dimensions (principal first).
    pub fn transform(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        check_len(x.len(), self.dim, "PCA transform", "input")?;
        check_len(out.len(), self.dim, "PCA transform", "output")?;
        check_finite(x, "PCA transform", "input")?;
        let mut c = vec![0f32; self.dim];
        self.transform_with(x, &mut c, out);
        Ok(())
    }

    fn transform_with(&self, x: &[f32], centred: &mut [f32], out: &mut [f32]) {
        for ((c, &v), &m) in centred.iter_mut().zip(x).zip(&self.mean) {
            *c = v - m;
        }
        mat_vec(&self.basis, self.dim, centred, out);
    }

    /// Transforms every row of `data` (`n × dim`), in parallel on the
    /// caller's rayon pool; returns `n × dim` values.
    pub fn transform_batch(&self, data: &[f32]) -> Result<Vec<f32>> {
        let dim = self.dim;
        if !data.len().is_multiple_of(dim) {
            return Err(Error::arg(format!(
                "PCA transform_batch: {} values, not a multiple of dim = {dim}",
                data.len()
            )));
        }
        if let Some(pos) = data.iter().position(|v| !v.is_finite()) {
            return Err(Error::arg(format!(
                "PCA transform_batch: value at row {}, column {} is {} (expected a finite number)",
                pos / dim,
                pos % dim,
                data[pos]
            )));
        }
        let mut centred = data.to_vec();
        centred.par_chunks_mut(TRANSFORM_CHUNK * dim).for_each(|c| {
            for row in c.chunks_exact_mut(dim) {
                for (x, &m) in row.iter_mut().zip(&self.mean) {
                    *x -= m;
                }
            }
        });
        let mut out = vec![0f32; data.len()];
        mat_vec_batch(&self.basis, dim, &centred, &mut out);
        Ok(out)
    }

    /// `out = basisᵀ · y + mean`: the inverse of [`Self::transform`].
    pub fn inverse_transform(&self, y: &[f32], out: &mut [f32]) -> Result<()> {
        check_len(y.len(), self.dim, "PCA inverse_transform", "input")?;
        check_len(out.len(), self.dim, "PCA inverse_transform", "output")?;
        check_finite(y, "PCA inverse_transform", "input")?;
        mat_t_vec(&self.basis, self.dim, y, out);
        for (o, &m) in out.iter_mut().zip(&self.mean) {
            *o += m;
        }
        Ok(())
    }
}

/// A random orthogonal `dim × dim` matrix (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct Rotation {
    dim: usize,
    /// Row-major, orthonormal rows.
    matrix: Vec<f32>,
}

impl Rotation {
    /// A Haar-random rotation of `dim` (`1..=`[`PCA_MAX_DIM`]) dimensions,
    /// deterministic for `seed`.
    pub fn random(dim: usize, seed: u64) -> Result<Self> {
        check_dim(dim, "random rotation")?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut m = vec![0f64; dim * dim];
        let mut i = 0;
        while i < m.len() {
            // Box–Muller: two independent standard normals per draw.
            let u1 = 1.0 - rng.random::<f64>(); // (0, 1]
            let u2 = rng.random::<f64>();
            let r = (-2.0 * u1.ln()).sqrt();
            let t = std::f64::consts::TAU * u2;
            m[i] = r * t.cos();
            if i + 1 < m.len() {
                m[i + 1] = r * t.sin();
            }
            i += 2;
        }
        for k in 0..dim {
            let (done, rest) = m.split_at_mut(k * dim);
            let row = &mut rest[..dim];
            // Two Gram–Schmidt passes ("twice is enough") keep the rows
            // orthonormal to f64 rounding.
            for _ in 0..2 {
                for prev in done.chunks_exact(dim) {
                    let p = dot_f64(row, prev);
                    for (x, &y) in row.iter_mut().zip(prev) {
                        *x -= p * y;
                    }
                }
            }
            let norm = dot_f64(row, row).sqrt();
            if norm < 1e-12 {
                // A Gaussian row in the span of the others has probability 0.
                return Err(Error::arg(format!(
                    "random rotation: degenerate Gaussian draw for seed {seed} (row {k})"
                )));
            }
            row.iter_mut().for_each(|x| *x /= norm);
        }
        Ok(Rotation {
            dim,
            matrix: m.iter().map(|&x| x as f32).collect(),
        })
    }

    /// The identity rotation (no mixing), for tests and ablations.
    pub fn identity(dim: usize) -> Result<Self> {
        check_dim(dim, "identity rotation")?;
        let mut matrix = vec![0f32; dim * dim];
        for i in 0..dim {
            matrix[i * dim + i] = 1.0;
        }
        Ok(Rotation { dim, matrix })
    }

    /// Rebuilds a rotation from its row-major matrix, checking the size,
    /// finiteness and orthonormality (see [`ORTHONORMAL_TOLERANCE`]).
    pub fn from_parts(dim: usize, matrix: Vec<f32>) -> Result<Self> {
        const WHAT: &str = "rotation parts";
        check_dim(dim, WHAT)?;
        check_len(matrix.len(), dim * dim, WHAT, "matrix")?;
        check_finite(&matrix, WHAT, "matrix")?;
        check_orthonormal(&matrix, dim, WHAT, "matrix")?;
        Ok(Rotation { dim, matrix })
    }

    /// The parts [`Self::from_parts`] takes: `(dim, matrix)`.
    pub fn into_parts(self) -> (usize, Vec<f32>) {
        (self.dim, self.matrix)
    }

    /// Dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// The orthogonal matrix, `dim × dim` row-major.
    pub fn matrix(&self) -> &[f32] {
        &self.matrix
    }

    /// `out = M x`.
    pub fn apply(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        check_len(x.len(), self.dim, "rotation apply", "input")?;
        check_len(out.len(), self.dim, "rotation apply", "output")?;
        check_finite(x, "rotation apply", "input")?;
        mat_vec(&self.matrix, self.dim, x, out);
        Ok(())
    }

    /// `out = Mᵀ y` (the inverse rotation).
    pub fn apply_inverse(&self, y: &[f32], out: &mut [f32]) -> Result<()> {
        check_len(y.len(), self.dim, "rotation apply_inverse", "input")?;
        check_len(out.len(), self.dim, "rotation apply_inverse", "output")?;
        check_finite(y, "rotation apply_inverse", "input")?;
        mat_t_vec(&self.matrix, self.dim, y, out);
        Ok(())
    }

    /// `M x` for every row of `data` (`n × dim`), in parallel on the
    /// caller's rayon pool.
    pub fn apply_batch(&self, data: &[f32]) -> Result<Vec<f32>> {
        let dim = self.dim;
        if !data.len().is_multiple_of(dim) {
            return Err(Error::arg(format!(
                "rotation apply_batch: {} values, not a multiple of dim = {dim}",
                data.len()
            )));
        }
        check_finite(data, "rotation apply_batch", "input")?;
        let mut out = vec![0f32; data.len()];
        mat_vec_batch(&self.matrix, dim, data, &mut out);
        Ok(out)
    }
}

/// f64 dot product with eight lanes (vectorises; fixed summation order).
#[inline]
fn dot_f64(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0f64; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// Column means in f64, summed over fixed row blocks combined in order
/// (independent of the thread count).
fn mean_f64(sample: &[f32], dim: usize) -> Vec<f64> {
    let n = sample.len() / dim;
    let parts: Vec<Vec<f64>> = sample
        .par_chunks(1024 * dim)
        .map(|block| {
            let mut acc = vec![0f64; dim];
            for r in block.chunks_exact(dim) {
                for (a, &x) in acc.iter_mut().zip(r) {
                    *a += x as f64;
                }
            }
            acc
        })
        .collect();
    let mut total = vec![0f64; dim];
    for p in &parts {
        for (t, &x) in total.iter_mut().zip(p) {
            *t += x;
        }
    }
    total.iter_mut().for_each(|t| *t /= n as f64);
    total
}

/// `Σ_r (x_r − mean)(x_r − mean)ᵀ` in f64 (full symmetric `dim × dim`).
/// Rows are taken [`COV_BLOCK`] at a time into a column-major centred tile;
/// entry `(i, j ≥ i)` adds the dot product of tile columns `i` and `j`. Work
/// is split over covariance rows, so every entry is summed in the same order
/// whatever the thread count.
fn covariance(sample: &[f32], dim: usize, mean: &[f64]) -> Vec<f64> {
    let mut cov = vec![0f64; dim * dim];
    let mut tile = vec![0f64; dim * COV_BLOCK];
    for block in sample.chunks(COV_BLOCK * dim) {
        let rows = block.len() / dim;
        for (r, x) in block.chunks_exact(dim).enumerate() {
            for (i, (&v, &m)) in x.iter().zip(mean).enumerate() {
                tile[i * COV_BLOCK + r] = v as f64 - m;
            }
        }
        let tile = &tile;
        cov.par_chunks_mut(dim).enumerate().for_each(|(i, out)| {
            let a = &tile[i * COV_BLOCK..i * COV_BLOCK + rows];
            for (j, o) in out.iter_mut().enumerate().skip(i) {
                *o += dot_f64(a, &tile[j * COV_BLOCK..j * COV_BLOCK + rows]);
            }
        });
    }
    for i in 0..dim {
        for j in 0..i {
            cov[i * dim + j] = cov[j * dim + i];
        }
    }
    cov
}

/// Eigen-decomposition of the symmetric `n × n` matrix `a` (overwritten):
/// eigenvalues sorted in decreasing order and the matching unit
/// eigenvectors as the rows of a row-major `n × n` matrix, each with its
/// largest-magnitude entry positive.
pub(crate) fn symmetric_eigen(a: &mut [f64], n: usize) -> Result<(Vec<f64>, Vec<f64>)> {
    let mut d = vec![0f64; n];
    let mut e = vec![0f64; n];
    // `a` plays the role of Vᵀ in EISPACK/JAMA's tred2/tql2 (V's columns
    // are eigenvectors), so every inner loop runs along a row of `a`.
    tred2(n, a, &mut d, &mut e);
    tql2(n, a, &mut d, &mut e)?;
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&x, &y| d[y].total_cmp(&d[x]).then(x.cmp(&y)));
    let mut vecs = Vec::with_capacity(n * n);
    for &k in &order {
        let row = &a[k * n..(k + 1) * n];
        let mut big = 0;
        for (i, v) in row.iter().enumerate() {
            if v.abs() > row[big].abs() {
                big = i;
            }
        }
        let sign = if row[big] < 0.0 { -1.0 } else { 1.0 };
        vecs.extend(row.iter().map(|&v| v * sign));
    }
    Ok((order.iter().map(|&k| d[k]).collect(), vecs))
}

/// Householder reduction of a symmetric matrix to tridiagonal form (JAMA's
/// `tred2` with `V[x][y]` stored at `a[y·n + x]`): on return `d` is the
/// diagonal, `e[1..]` the sub-diagonal and `a` holds Vᵀ, V being the
/// accumulated orthogonal transformation.
fn tred2(n: usize, a: &mut [f64], d: &mut [f64], e: &mut [f64]) {
    for j in 0..n {
        d[j] = a[j * n + n - 1];
    }
    for i in (1..n).rev() {
        let mut scale = 0.0;
        let mut h = 0.0;
        for &dk in &d[..i] {
            scale += dk.abs();
        }
        if scale == 0.0 {
            e[i] = d[i - 1];
            for j in 0..i {
                d[j] = a[j * n + i - 1];
                a[j * n + i] = 0.0;
                a[i * n + j] = 0.0;
            }
        } else {
            for dk in &mut d[..i] {
                *dk /= scale;
                h += *dk * *dk;
            }
            let mut f = d[i - 1];
            let mut g = h.sqrt();
            if f > 0.0 {
                g = -g;
            }
            e[i] = scale * g;
            h -= f * g;
            d[i - 1] = f - g;
            e[..i].fill(0.0);
            for j in 0..i {
                f = d[j];
                a[i * n + j] = f;
                let row = &a[j * n..j * n + i];
                g = e[j] + row[j] * f;
                for k in j + 1..i {
                    g += row[k] * d[k];
                    e[k] += row[k] * f;
                }
                e[j] = g;
            }
            f = 0.0;
            for j in 0..i {
                e[j] /= h;
                f += e[j] * d[j];
            }
            let hh = f / (h + h);
            for j in 0..i {
                e[j] -= hh * d[j];
            }
            for j in 0..i {
                f = d[j];
                g = e[j];
                let row = &mut a[j * n..j * n + i];
                for k in j..i {
                    row[k] -= f * e[k] + g * d[k];
                }
                d[j] = a[j * n + i - 1];
                a[j * n + i] = 0.0;
            }
        }
        d[i] = h;
    }
    // Accumulate the transformations.
    for i in 0..n.saturating_sub(1) {
        a[i * n + n - 1] = a[i * n + i];
        a[i * n + i] = 1.0;
        let h = d[i + 1];
        if h != 0.0 {
            let (head, tail) = a.split_at_mut((i + 1) * n);
            let v = &tail[..=i];
            for k in 0..=i {
                d[k] = v[k] / h;
            }
            for j in 0..=i {
                let row = &mut head[j * n..j * n + i + 1];
                let g = dot_f64(v, row);
                for (x, &dk) in row.iter_mut().zip(&d[..=i]) {
                    *x -= g * dk;
                }
            }
        }
        a[(i + 1) * n..(i + 1) * n + i + 1].fill(0.0);
    }
    for j in 0..n {
        d[j] = a[j * n + n - 1];
        a[j * n + n - 1] = 0.0;
    }
    a[(n - 1) * n + n - 1] = 1.0;
    e[0] = 0.0;
}

/// Implicit QL with shifts on the tridiagonal `(d, e)` from [`tred2`],
/// accumulating the rotations into the rows of `a` (JAMA's `tql2`,
/// transposed): on return `d` holds the eigenvalues (unsorted) and row k of
/// `a` the unit eigenvector of `d[k]`.
fn tql2(n: usize, a: &mut [f64], d: &mut [f64], e: &mut [f64]) -> Result<()> {
    for i in 1..n {
        e[i - 1] = e[i];
    }
    e[n - 1] = 0.0;
    let mut f = 0.0;
    let mut tst1 = 0f64;
    let eps = f64::EPSILON;
    for l in 0..n {
        tst1 = tst1.max(d[l].abs() + e[l].abs());
        let mut m = l;
        while m < n - 1 && e[m].abs() > eps * tst1 {
            m += 1;
        }
        if m > l {
            let mut iter = 0;
            loop {
                iter += 1;
                if iter > QL_MAX_ITERS {
                    return Err(Error::arg(format!(
                        "PCA: the eigen-solver did not converge for eigenvalue {l} of {n} (non-finite or extreme covariance?)"
                    )));
                }
                // Implicit shift.
                let mut g = d[l];
                let mut p = (d[l + 1] - g) / (2.0 * e[l]);
                let mut r = p.hypot(1.0);
                if p < 0.0 {
                    r = -r;
                }
                d[l] = e[l] / (p + r);
                d[l + 1] = e[l] * (p + r);
                let dl1 = d[l + 1];
                let mut h = g - d[l];
                for di in &mut d[l + 2..n] {
                    *di -= h;
                }
                f += h;
                // Implicit QL transformation.
                p = d[m];
                let (mut c, mut c2, mut c3) = (1.0f64, 1.0f64, 1.0f64);
                let el1 = e[l + 1];
                let (mut s, mut s2) = (0.0f64, 0.0f64);
                for i in (l..m).rev() {
                    c3 = c2;
                    c2 = c;
                    s2 = s;
                    g = c * e[i];
                    h = c * p;
                    r = p.hypot(e[i]);
                    e[i + 1] = s * r;
                    s = e[i] / r;
                    c = p / r;
                    p = c * d[i] - s * g;
                    d[i + 1] = h + s * (c * g + s * d[i]);
                    let (lo, hi) = a.split_at_mut((i + 1) * n);
                    let (vi, vi1) = (&mut lo[i * n..], &mut hi[..n]);
                    for (x, y) in vi.iter_mut().zip(vi1.iter_mut()) {
                        let t = *y;
                        *y = s * *x + c * t;
                        *x = c * *x - s * t;
                    }
                }
                p = -s * s2 * c3 * el1 * e[l] / dl1;
                e[l] = s * p;
                d[l] = c * p;
                // Converged, or NaN (reported below).
                if e[l].abs() <= eps * tst1 || e[l].is_nan() {
                    break;
                }
            }
        }
        d[l] += f;
        e[l] = 0.0;
    }
    if let Some(k) = d.iter().position(|x| !x.is_finite()) {
        return Err(Error::arg(format!(
            "PCA: eigenvalue {k} is {} (non-finite covariance?)",
            d[k]
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn l2(a: &[f32], b: &[f32]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
            .sum()
    }

    /// Gaussian data with standard deviations `scales` along the rows of a
    /// random rotation, shifted by `offset`.
    fn anisotropic(n: usize, scales: &[f32], offset: f32, seed: u64) -> (Vec<f32>, Rotation) {
        let dim = scales.len();
        let axes = Rotation::random(dim, seed ^ 0xabc).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut data = Vec::with_capacity(n * dim);
        let mut z = vec![0f32; dim];
        let mut x = vec![0f32; dim];
        for _ in 0..n {
            for (zi, &s) in z.iter_mut().zip(scales) {
                // Sum of 12 uniforms − 6: close enough to a unit normal.
                let u: f32 = (0..12).map(|_| rng.random::<f32>()).sum::<f32>() - 6.0;
                *zi = u * s;
            }
            axes.apply_inverse(&z, &mut x).unwrap();
            data.extend(x.iter().map(|&v| v + offset));
        }
        (data, axes)
    }

    fn random_symmetric(n: usize, seed: u64) -> Vec<f64> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut a = vec![0f64; n * n];
        for i in 0..n {
            for j in i..n {
                let v = rng.random_range(-2.0..2.0);
                a[i * n + j] = v;
                a[j * n + i] = v;
            }
        }
        a
    }

    fn check_eigen(a0: &[f64], n: usize) {
        let mut a = a0.to_vec();
        let (vals, vecs) = symmetric_eigen(&mut a, n).unwrap();
        let scale = a0.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        assert!(vals.windows(2).all(|w| w[0] >= w[1]), "{vals:?}");
        for k in 0..n {
            let v = &vecs[k * n..(k + 1) * n];
            for i in 0..n {
                let av: f64 = (0..n).map(|j| a0[i * n + j] * v[j]).sum();
                assert!(
                    (av - vals[k] * v[i]).abs() < 1e-10 * scale * n as f64,
                    "n={n} k={k} i={i}"
                );
            }
            for l in 0..n {
                let d: f64 = (0..n).map(|i| v[i] * vecs[l * n + i]).sum();
                let want = if k == l { 1.0 } else { 0.0 };
                assert!(
                    (d - want).abs() < 1e-12 * n as f64,
                    "n={n} k={k} l={l}: {d}"
                );
            }
        }
    }

    #[test]
    fn eigen_solver_diagonalises_symmetric_matrices() {
        for (n, seed) in [(1, 1), (2, 2), (3, 3), (5, 4), (17, 5), (40, 6), (73, 7)] {
            check_eigen(&random_symmetric(n, seed), n);
        }
        // Repeated and zero eigenvalues, already-diagonal input.
        check_eigen(&[0.0; 36], 6);
        let mut diag = vec![0.0; 25];
        for (i, v) in [3.0, 1.0, 3.0, -2.0, 1.0].iter().enumerate() {
            diag[i * 5 + i] = *v;
        }
        check_eigen(&diag, 5);
        let mut a = diag.clone();
        let (vals, _) = symmetric_eigen(&mut a, 5).unwrap();
        assert_eq!(vals, vec![3.0, 3.0, 1.0, 1.0, -2.0]);
        // Rank one: x xᵀ has eigenvalue ‖x‖² along x.
        let x = [1.0, -2.0, 0.5, 3.0];
        let r1: Vec<f64> = (0..16).map(|k| x[k / 4] * x[k % 4]).collect();
        check_eigen(&r1, 4);
        let mut a = r1.clone();
        let (vals, vecs) = symmetric_eigen(&mut a, 4).unwrap();
        assert!((vals[0] - 14.25).abs() < 1e-12);
        let nx = 14.25f64.sqrt();
        // Sign convention: largest-magnitude entry positive (x[3] = 3).
        for i in 0..4 {
            assert!((vecs[i] - x[i] / nx).abs() < 1e-12);
        }
    }

    #[test]
    fn pca_splits_distances_exactly_and_sorts_variance() {
        let dim = 48;
        let scales: Vec<f32> = (0..dim).map(|i| 10.0 * 0.85f32.powi(i as i32)).collect();
        let (data, axes) = anisotropic(3000, &scales, 5.0, 1);
        let pca = Pca::fit(&data, dim, 12).unwrap();
        assert_eq!((pca.dim(), pca.principal(), pca.residual()), (48, 12, 36));
        assert!(orthonormality_error(pca.basis(), dim).unwrap() < 1e-6);
        let v = pca.variances();
        assert!(v.windows(2).all(|w| w[0] >= w[1]), "{v:?}");
        assert!(v.iter().all(|&x| x >= 0.0));
        // Variances close to the generating ones, axis 0 close to ±the first
        // generating axis.
        assert!((v[0] / 100.0 - 1.0).abs() < 0.1, "{}", v[0]);
        let cos: f64 = pca.basis()[..dim]
            .iter()
            .zip(&axes.matrix()[..dim])
            .map(|(&a, &b)| a as f64 * b as f64)
            .sum();
        assert!(cos.abs() > 0.99, "{cos}");
        let total: f64 = scales.iter().map(|&s| (s * s) as f64).sum();
        let top: f64 = scales[..12].iter().map(|&s| (s * s) as f64).sum();
        assert!((pca.explained_variance_ratio() - top / total).abs() < 0.02);
        // The variance of the transformed sample along axis k is v[k].
        let y = pca.transform_batch(&data).unwrap();
        for k in [0, 5, 30] {
            let var: f64 = y
                .iter()
                .skip(k)
                .step_by(dim)
                .map(|&t| (t as f64).powi(2))
                .sum::<f64>()
                / 3000.0;
            assert!(
                (var / v[k] as f64 - 1.0).abs() < 1e-3,
                "axis {k}: {var} vs {}",
                v[k]
            );
        }
        // Principal + residual squared distances = full squared distance.
        let p = pca.principal();
        for i in 0..300 {
            let j = (i * 7 + 13) % 3000;
            let (a, b) = (&data[i * dim..][..dim], &data[j * dim..][..dim]);
            let (ya, yb) = (&y[i * dim..][..dim], &y[j * dim..][..dim]);
            let full = l2(a, b);
            let split = l2(&ya[..p], &yb[..p]) + l2(&ya[p..], &yb[p..]);
            assert!((split - full).abs() <= 1e-4 * full, "{split} vs {full}");
        }
        // transform and transform_batch agree; the inverse gets x back.
        let mut one = vec![0f32; dim];
        let mut back = vec![0f32; dim];
        pca.transform(&data[..dim], &mut one).unwrap();
        assert_eq!(one, y[..dim]);
        pca.inverse_transform(&one, &mut back).unwrap();
        for (a, b) in back.iter().zip(&data[..dim]) {
            assert!((a - b).abs() < 1e-4 * (1.0 + b.abs()));
        }
    }

    #[test]
    fn pca_handles_degenerate_samples() {
        // One row, constant columns, rank-deficient data.
        let pca = Pca::fit(&[1.0, 2.0, 3.0], 3, 2).unwrap();
        assert_eq!(pca.variances(), &[0.0, 0.0, 0.0]);
        assert!(orthonormality_error(pca.basis(), 3).unwrap() < 1e-6);
        let rank1: Vec<f32> = (0..200)
            .flat_map(|i| [i as f32, 2.0 * i as f32, 7.0, 0.0])
            .collect();
        let pca = Pca::fit(&rank1, 4, 1).unwrap();
        assert!(pca.variances()[1] < 1e-6 * pca.variances()[0]);
        assert!((pca.explained_variance_ratio() - 1.0).abs() < 1e-6);
        assert!(orthonormality_error(pca.basis(), 4).unwrap() < 1e-6);
    }

    #[test]
    fn pca_fit_is_deterministic_across_thread_counts() {
        let scales: Vec<f32> = (0..20).map(|i| 1.0 + i as f32).collect();
        let (data, _) = anisotropic(1100, &scales, -3.0, 2);
        let fit = |t: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap()
                .install(|| Pca::fit(&data, 20, 5).unwrap())
        };
        assert_eq!(fit(1), fit(3));
    }

    #[test]
    fn rotation_is_orthonormal_deterministic_and_norm_preserving() {
        for dim in [1, 2, 7, 64, 129] {
            let r = Rotation::random(dim, 42).unwrap();
            assert_eq!(r.dim(), dim);
            assert!(
                orthonormality_error(r.matrix(), dim).unwrap() < 1e-6,
                "dim {dim}"
            );
            assert_eq!(r, Rotation::random(dim, 42).unwrap());
            if dim > 1 {
                assert_ne!(r, Rotation::random(dim, 43).unwrap());
            }
            let mut rng = ChaCha8Rng::seed_from_u64(dim as u64);
            let x: Vec<f32> = (0..dim).map(|_| rng.random_range(-5.0..5.0)).collect();
            let q: Vec<f32> = (0..dim).map(|_| rng.random_range(-5.0..5.0)).collect();
            let (mut rx, mut rq, mut back) = (vec![0.0; dim], vec![0.0; dim], vec![0.0; dim]);
            r.apply(&x, &mut rx).unwrap();
            r.apply(&q, &mut rq).unwrap();
            assert!((l2(&rx, &rq) / l2(&x, &q) - 1.0).abs() < 1e-5);
            r.apply_inverse(&rx, &mut back).unwrap();
            for (a, b) in back.iter().zip(&x) {
                assert!((a - b).abs() < 1e-4);
            }
            let batch = r.apply_batch(&[x.clone(), q.clone()].concat()).unwrap();
            assert_eq!(&batch[..dim], &rx[..]);
            assert_eq!(&batch[dim..], &rq[..]);
        }
        // Haar: entries have mean 0 and variance 1/d.
        let dim = 200;
        let r = Rotation::random(dim, 7).unwrap();
        let m = r.matrix();
        let mean: f64 = m.iter().map(|&x| x as f64).sum::<f64>() / m.len() as f64;
        let var: f64 = m.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / m.len() as f64;
        assert!(
            mean.abs() < 3.0 / (dim as f64 * (dim as f64).sqrt()),
            "{mean}"
        );
        assert!((var * dim as f64 - 1.0).abs() < 1e-6);
        let id = Rotation::identity(3).unwrap();
        let mut out = [0.0; 3];
        id.apply(&[1.0, 2.0, 3.0], &mut out).unwrap();
        assert_eq!(out, [1.0, 2.0, 3.0]);
    }

    #[test]
    fn parts_round_trip() {
        let scales: Vec<f32> = (0..10).map(|i| 1.0 + i as f32).collect();
        let (data, _) = anisotropic(500, &scales, 1.0, 3);
        let pca = Pca::fit(&data, 10, 4).unwrap();
        let (d, p, mean, basis, var) = pca.clone().into_parts();
        let back = Pca::from_parts(d, p, mean, basis, var).unwrap();
        assert_eq!(back, pca);
        assert_eq!(pca.clone().with_principal(10).unwrap().principal(), 10);
        assert!(pca.clone().with_principal(0).is_err());
        assert!(pca.clone().with_principal(11).is_err());
        let rot = Rotation::random(9, 5).unwrap();
        let (d, m) = rot.clone().into_parts();
        assert_eq!(Rotation::from_parts(d, m).unwrap(), rot);
    }

    #[test]
    fn bad_parts_and_arguments_are_rejected() {
        let pca = Pca::fit(&[0.0, 1.0, 2.0, 1.0, 4.0, 0.5, 3.0, 3.0], 2, 1).unwrap();
        let (d, p, mean, basis, var) = pca.into_parts();
        let ok = || (mean.clone(), basis.clone(), var.clone());
        let (m, b, v) = ok();
        assert!(Pca::from_parts(d, p, m, b, v).is_ok());
        let (m, b, v) = ok();
        assert!(Pca::from_parts(d, 0, m, b, v).is_err());
        let (m, b, v) = ok();
        assert!(Pca::from_parts(d, 3, m, b, v).is_err());
        let (m, b, v) = ok();
        assert!(Pca::from_parts(3, p, m, b, v).is_err());
        let (m, b, v) = ok();
        assert!(Pca::from_parts(0, p, m, b, v).is_err());
        let (_, b, v) = ok();
        assert!(Pca::from_parts(d, p, vec![0.0], b, v).is_err());
        let (m, _, v) = ok();
        assert!(Pca::from_parts(d, p, m, vec![1.0, 0.0, 0.0], v).is_err());
        let (m, b, _) = ok();
        assert!(Pca::from_parts(d, p, m, b, vec![1.0, 2.0]).is_err());
        let (m, b, _) = ok();
        assert!(Pca::from_parts(d, p, m, b, vec![1.0, -0.5]).is_err());
        let (mut m, b, v) = ok();
        m[0] = f32::NAN;
        assert!(Pca::from_parts(d, p, m, b, v).is_err());
        let (m, _, v) = ok();
        assert!(Pca::from_parts(d, p, m, vec![1.0, 1.0, 0.0, 1.0], v).is_err());
        let (m, _, v) = ok();
        // Unit rows that are not orthogonal.
        let s = std::f32::consts::FRAC_1_SQRT_2;
        assert!(Pca::from_parts(d, p, m, vec![1.0, 0.0, s, s], v).is_err());

        assert!(Pca::fit(&[], 2, 1).is_err());
        assert!(Pca::fit(&[1.0; 5], 2, 1).is_err());
        assert!(Pca::fit(&[1.0; 4], 0, 1).is_err());
        assert!(Pca::fit(&[1.0; 4], 2, 0).is_err());
        assert!(Pca::fit(&[1.0; 4], 2, 3).is_err());
        assert!(Pca::fit(&[1.0, f32::INFINITY, 0.0, 0.0], 2, 1).is_err());
        assert!(Pca::fit(&vec![0.0; PCA_MAX_DIM + 1], PCA_MAX_DIM + 1, 1).is_err());

        let pca = Pca::fit(&[0.0, 1.0, 2.0, 1.0], 2, 1).unwrap();
        let mut out = [0.0; 2];
        assert!(pca.transform(&[1.0], &mut out).is_err());
        assert!(pca.transform(&[1.0, 2.0], &mut out[..1]).is_err());
        assert!(pca.transform(&[1.0, f32::NAN], &mut out).is_err());
        assert!(pca.transform_batch(&[1.0, 2.0, 3.0]).is_err());
        assert!(pca.transform_batch(&[1.0, f32::NAN]).is_err());
        assert!(pca.inverse_transform(&[1.0], &mut out).is_err());

        assert!(orthonormality_error(&[1.0, 0.0, 0.0], 2).is_err());
        assert!(orthonormality_error(&[], usize::MAX).is_err());
        assert_eq!(orthonormality_error(&[0.0, 1.0, 1.0, 0.0], 2).unwrap(), 0.0);
        assert!(Rotation::random(0, 1).is_err());
        assert!(Rotation::random(PCA_MAX_DIM + 1, 1).is_err());
        assert!(Rotation::from_parts(2, vec![1.0, 0.0, 0.0]).is_err());
        assert!(Rotation::from_parts(2, vec![1.0, 0.0, 0.0, 2.0]).is_err());
        assert!(Rotation::from_parts(2, vec![1.0, 0.0, 0.0, f32::NAN]).is_err());
        let r = Rotation::random(3, 1).unwrap();
        assert!(r.apply(&[1.0, 2.0], &mut [0.0; 3]).is_err());
        assert!(r.apply(&[1.0, 2.0, 3.0], &mut [0.0; 2]).is_err());
        assert!(r
            .apply_inverse(&[1.0, 2.0, f32::NAN], &mut [0.0; 3])
            .is_err());
        assert!(r.apply_batch(&[1.0; 4]).is_err());
    }

    /// Speed check, not run by default:
    /// `cargo test -p nearline --lib pca_speed -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn pca_speed() {
        for (dim, n) in [(256usize, 20_000usize), (960, 20_000)] {
            let mut rng = ChaCha8Rng::seed_from_u64(9);
            let data: Vec<f32> = (0..n * dim).map(|_| rng.random_range(-1.0..1.0)).collect();
            let t = std::time::Instant::now();
            let pca = Pca::fit(&data, dim, dim / 4).unwrap();
            let fit = t.elapsed();
            let t = std::time::Instant::now();
            let y = pca.transform_batch(&data).unwrap();
            let tr = t.elapsed();
            let t = std::time::Instant::now();
            let r = Rotation::random(dim, 1).unwrap();
            println!(
                "d = {dim}, n = {n}: fit {fit:.2?}, transform {:.2?} per row, rotation {:.2?} (err {:.1e}) [{}]",
                tr / n as u32,
                t.elapsed(),
                orthonormality_error(r.matrix(), dim).unwrap(),
                y[7]
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn prop_pca_distance_split_is_exact(
            dim in 2usize..24,
            n in 2usize..60,
            principal_frac in 0.0f64..1.0,
            seed in any::<u64>(),
        ) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let data: Vec<f32> = (0..n * dim).map(|_| rng.random_range(-50.0..50.0)).collect();
            let principal = 1 + ((dim - 1) as f64 * principal_frac) as usize;
            let pca = Pca::fit(&data, dim, principal).unwrap();
            prop_assert!(orthonormality_error(pca.basis(), dim).unwrap() < 1e-5);
            prop_assert!(pca.variances().windows(2).all(|w| w[0] >= w[1]));
            let y = pca.transform_batch(&data).unwrap();
            for i in 0..n.min(10) {
                let j = (i + 1) % n;
                let full = l2(&data[i * dim..][..dim], &data[j * dim..][..dim]);
                let (ya, yb) = (&y[i * dim..][..dim], &y[j * dim..][..dim]);
                let split = l2(&ya[..principal], &yb[..principal]) + l2(&ya[principal..], &yb[principal..]);
                prop_assert!((split - full).abs() <= 1e-4 * full + 1e-6, "{} vs {}", split, full);
            }
        }
    }
}
