//! Point spaces: what a graph build needs to know about the points.

use crate::data::dtype::Element;
use crate::data::matrix::MatrixView;
use crate::distance::Metric;
use rayon::prelude::*;

/// Distances between the points of a build, by internal id.
pub trait PointDistance: Sync {
    /// Number of points.
    fn n(&self) -> usize;
    /// Build distance between points `a` and `b` (smaller is closer, >= 0
    /// up to rounding, suitable for the robust-prune rule).
    fn dist(&self, a: u32, b: u32) -> f32;
}

/// A [`PointDistance`] over the rows of a matrix.
///
/// L2 and cosine (normalised data) use squared L2. Inner product uses the
/// MIPS-to-L2 reduction: each point gets an extra coordinate
/// `sqrt(M² − |x|²)` (M the largest norm), computed on the fly from the
/// precomputed norms, so build distances are metric and prunable while their
/// order for a query (extra coordinate 0) is the inner-product order.
pub struct MatrixSpace<'a, T: Element> {
    data: MatrixView<'a, T>,
    /// Extra coordinate per point (inner product only).
    extra: Option<Vec<f32>>,
}

impl<'a, T: Element> MatrixSpace<'a, T> {
    /// A space over `data` for `metric`; runs on the caller's rayon pool.
    pub fn new(data: MatrixView<'a, T>, metric: Metric) -> Self {
        let extra = match metric {
            Metric::L2 | Metric::Cosine => None,
            Metric::InnerProduct => {
                let norms: Vec<f32> = (0..data.n())
                    .into_par_iter()
                    .map(|i| {
                        let x = data.row(i);
                        T::dot(x, x)
                    })
                    .collect();
                let max = norms.iter().copied().fold(0f32, f32::max);
                Some(
                    norms
                        .into_par_iter()
                        .map(|q| (max - q).max(0.0).sqrt())
                        .collect(),
                )
            }
        };
        MatrixSpace { data, extra }
    }
    /// A space over `data` with a given extra coordinate per point (the MIPS
    /// reduction computed elsewhere, e.g. streamed over a larger matrix);
    /// `None` for plain squared L2.
    pub fn with_extra(data: MatrixView<'a, T>, extra: Option<Vec<f32>>) -> crate::Result<Self> {
        if let Some(e) = &extra {
            if e.len() != data.n() {
                return Err(crate::Error::arg(format!(
                    "MatrixSpace extra coordinates: {} values for {} points",
                    e.len(),
                    data.n()
                )));
            }
        }
        Ok(MatrixSpace { data, extra })
    }
    /// The extra MIPS coordinate of every point (inner product only).
    pub fn extra(&self) -> Option<&[f32]> {
        self.extra.as_deref()
    }
    /// The underlying rows.
    pub fn data(&self) -> MatrixView<'a, T> {
        self.data
    }
}

impl<T: Element> PointDistance for MatrixSpace<'_, T> {
    fn n(&self) -> usize {
        self.data.n()
    }
    #[inline]
    fn dist(&self, a: u32, b: u32) -> f32 {
        let d = T::l2_sq(self.data.row(a as usize), self.data.row(b as usize));
        match &self.extra {
            Some(e) => {
                let x = e[a as usize] - e[b as usize];
                d + x * x
            }
            None => d,
        }
    }
}
