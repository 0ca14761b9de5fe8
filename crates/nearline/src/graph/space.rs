//! Point spaces: what a graph build needs to know about the points.

use crate::data::matrix::{Matrix, MatrixView};
use crate::distance::Metric;
use crate::elem::Element;
use rayon::prelude::*;

/// Distances between the points of a build, by internal id.
pub trait PointDistance: Sync {
    /// Number of points.
    fn n(&self) -> usize;
    /// Build distance between points `a` and `b` (smaller is closer, >= 0
    /// up to rounding, suitable for the robust-prune rule).
    fn dist(&self, a: u32, b: u32) -> f32;
}

/// The build distance of points `a` and `b` with rows `x` and `y`: squared
/// L2, plus the squared difference of their extra MIPS coordinates if any.
#[inline]
fn build_distance<T: Element>(x: &[T], y: &[T], extra: Option<&[f32]>, a: u32, b: u32) -> f32 {
    let d = T::l2_sq(x, y);
    match extra {
        Some(e) => {
            let t = e[a as usize] - e[b as usize];
            d + t * t
        }
        None => d,
    }
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
        build_distance(
            self.data.row(a as usize),
            self.data.row(b as usize),
            self.extra.as_deref(),
            a,
            b,
        )
    }
}

/// A [`PointDistance`] over a few rows copied out of a larger matrix, still
/// addressed by their ids in it: `ids` (sorted, distinct) names the rows of
/// `rows` in order. Asking for a point not gathered is a caller bug; it
/// reads as infinitely far (and asserts in debug builds).
pub struct GatheredSpace<'a, T: Element> {
    pub n: usize,
    pub ids: &'a [u32],
    pub rows: MatrixView<'a, T>,
    /// Extra MIPS coordinate of every point of the full matrix (inner product).
    pub extra: Option<&'a [f32]>,
}

impl<T: Element> GatheredSpace<'_, T> {
    #[inline]
    fn row(&self, a: u32) -> Option<&[T]> {
        let i = self.ids.binary_search(&a).ok();
        debug_assert!(i.is_some(), "point {a} was not gathered");
        i.map(|i| self.rows.row(i))
    }
}

impl<T: Element> PointDistance for GatheredSpace<'_, T> {
    fn n(&self) -> usize {
        self.n
    }
    #[inline]
    fn dist(&self, a: u32, b: u32) -> f32 {
        let (Some(x), Some(y)) = (self.row(a), self.row(b)) else {
            return f32::INFINITY;
        };
        build_distance(x, y, self.extra, a, b)
    }
}

/// A [`PointDistance`] that reads both rows of every distance from the
/// matrix's file instead of touching its mapping, for sparse, scattered
/// access (a few searches over a large input) under a memory budget. The
/// first read error is kept and reported by [`FileRowSpace::finish`];
/// distances after it read as infinitely far.
pub struct FileRowSpace<'a, T: Element> {
    data: &'a Matrix<T>,
    extra: Option<&'a [f32]>,
    error: std::sync::Mutex<Option<crate::Error>>,
}

impl<'a, T: Element> FileRowSpace<'a, T> {
    pub fn new(data: &'a Matrix<T>, extra: Option<&'a [f32]>) -> Self {
        FileRowSpace {
            data,
            extra,
            error: std::sync::Mutex::new(None),
        }
    }

    /// The first read error, if any.
    pub fn finish(self) -> crate::Result<()> {
        match self.error.into_inner() {
            Ok(None) => Ok(()),
            Ok(Some(e)) => Err(e),
            Err(_) => Err(crate::Error::Engine("row reader lock poisoned".into())),
        }
    }
}

impl<T: Element> PointDistance for FileRowSpace<'_, T> {
    fn n(&self) -> usize {
        self.data.n()
    }
    fn dist(&self, a: u32, b: u32) -> f32 {
        let dim = self.data.dim();
        let mut rows = vec![T::zeroed(); 2 * dim];
        let (x, y) = rows.split_at_mut(dim);
        let read = self
            .data
            .read_row(a as usize, x)
            .and_then(|_| self.data.read_row(b as usize, y));
        if let Err(e) = read {
            if let Ok(mut g) = self.error.lock() {
                g.get_or_insert(e);
            }
            return f32::INFINITY;
        }
        build_distance(x, y, self.extra, a, b)
    }
}
