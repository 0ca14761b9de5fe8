//! Metrics: what "distance" means for each similarity (the SIMD kernels
//! they run on live in [`crate::kernels`]).
//!
//! Internally every metric is a *distance* (smaller is closer):
//! * `L2`: squared Euclidean distance;
//! * `InnerProduct`: the negated inner product;
//! * `Cosine`: `1 - cos(a, b)`; vectors are normalised once on ingest (data at
//!   build time, queries before search), so it is computed as `1 - dot`.
//!
//! Users see squared L2 distances, inner products and cosine similarities:
//! [`Metric::to_user`] converts.

use crate::elem::Element;
use crate::kernels;
use serde::{Deserialize, Serialize};

/// A similarity metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    L2,
    #[serde(rename = "ip")]
    InnerProduct,
    Cosine,
}

impl Metric {
    /// Parses `l2`, `ip` (or `mips`, `inner_product`), `cosine`.
    pub fn parse(s: &str) -> crate::Result<Metric> {
        match s.to_ascii_lowercase().as_str() {
            "l2" | "euclidean" | "sqeuclidean" => Ok(Metric::L2),
            "ip" | "mips" | "inner_product" | "dot" => Ok(Metric::InnerProduct),
            "cosine" | "angular" => Ok(Metric::Cosine),
            other => Err(crate::Error::arg(format!(
                "unknown metric {other:?}: expected \"l2\", \"ip\" or \"cosine\""
            ))),
        }
    }
    /// Short name used in manifests and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            Metric::L2 => "l2",
            Metric::InnerProduct => "ip",
            Metric::Cosine => "cosine",
        }
    }
    /// Internal distance (smaller is closer). Cosine expects normalised inputs.
    #[inline]
    pub fn distance<T: Element>(self, a: &[T], b: &[T]) -> f32 {
        match self {
            Metric::L2 => T::l2_sq(a, b),
            Metric::InnerProduct => -T::dot(a, b),
            Metric::Cosine => 1.0 - T::dot(a, b),
        }
    }
    /// Converts an internal distance to what users see: squared L2 distance,
    /// inner product, or cosine similarity.
    #[inline]
    pub fn to_user(self, d: f32) -> f32 {
        match self {
            Metric::L2 => d,
            Metric::InnerProduct => -d,
            Metric::Cosine => 1.0 - d,
        }
    }
    /// Whether larger user-facing values are closer (scores rather than distances).
    pub fn higher_is_closer(self) -> bool {
        !matches!(self, Metric::L2)
    }
}

impl std::fmt::Display for Metric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The largest squared norm a vector may have: `f32::MAX / 4`. A squared
/// L2 distance between two vectors is at most 4 × the larger squared norm,
/// and an inner product at most the larger squared norm, so within it every
/// distance (and every PQ centroid's, a mean of such vectors) stays finite
/// in float32. Finite values can exceed it (1e38 squared overflows).
pub const MAX_SQUARED_NORM: f64 = f32::MAX as f64 / 4.0;

/// The squared norm of `x`, summed in f64 (it never overflows).
#[inline]
pub fn squared_norm_f64<T: Element>(x: &[T]) -> f64 {
    x.iter()
        .map(|v| {
            let f = v.to_f32() as f64;
            f * f
        })
        .sum()
}

/// Why a vector of squared norm `norm2` cannot be used, when it exceeds
/// [`MAX_SQUARED_NORM`] (`None` when it fits).
pub fn oversized(norm2: f64) -> Option<String> {
    (norm2 > MAX_SQUARED_NORM).then(|| {
        format!(
            "has squared norm {norm2:.3e}, more than float32 distances can hold (at most \
             {MAX_SQUARED_NORM:.3e}, so that the squared distance between two vectors stays \
             finite); scale the data and the queries down by one constant factor (neighbours \
             do not change)"
        )
    })
}

/// Checks that every value is finite and every row's squared norm within
/// [`crate::distance::MAX_SQUARED_NORM`] (so every distance stays finite).
pub fn check_rows(v: &[f32], what: &str, dim: usize) -> crate::Result<()> {
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        return Err(crate::Error::arg(format!(
            "{what} row {} holds a non-finite value ({}) at dimension {}",
            i / dim,
            v[i],
            i % dim
        )));
    }
    for (r, row) in v.chunks_exact(dim.max(1)).enumerate() {
        if let Some(why) = oversized(squared_norm_f64(row)) {
            return Err(crate::Error::arg(format!("{what} row {r} {why}")));
        }
    }
    Ok(())
}

/// Normalises `v` to unit length in place; zero vectors stay zero.
pub fn normalize(v: &mut [f32]) {
    let n = kernels::dot_f32(v, v).sqrt();
    if n > 0.0 {
        let inv = 1.0 / n;
        v.iter_mut().for_each(|x| *x *= inv);
    }
}
