//! Build phase for a coded layout (AlayaLaser): the PCA fitted on a sample,
//! the RaBitQ rotation of its principal dimensions, every vector moved into
//! that space, and the neighbour codes each record carries.
//!
//! A stored vector is `y = [P · B_p (x − μ) | B_r (x − μ)]`: the PCA basis
//! `B` (principal rows `B_p` first, residual rows `B_r` after) rotated on
//! its principal part by RaBitQ's random rotation `P`. Both maps are
//! orthonormal, so `‖x − q‖ = ‖y_x − y_q‖` and every exact distance (the
//! graph's, the entries', the re-rank's) is the original one up to float
//! rounding. A record of node v carries, for neighbour i of its list, the
//! 1-bit RaBitQ code of `y_u[..p]` relative to the centre `y_v[..p]` and its
//! three factors: at search time the principal part of `‖q − u‖²` is
//! estimated from the expanded record alone, in one FastScan pass.

use super::{check_cancel, BuildPlan, Progress};
use crate::data::matrix::Matrix;
use crate::elem::Element;
use crate::format::page::{PageGeometry, CODE_FACTORS};
use crate::quant::fastscan;
use crate::quant::pca::Pca;
use crate::quant::rabitq::RaBitQ;
use crate::{Error, Result};
use rayon::prelude::*;
use std::sync::atomic::AtomicBool;

/// Rows the PCA is fitted on at most (an even stride over the data).
pub const PCA_SAMPLE_ROWS: usize = 50_000;

/// Rows transformed per chunk (cancellation is checked between chunks).
const CHUNK_ROWS: usize = 16_384;

/// The transform of a coded layout.
pub struct Coding {
    pub pca: Pca,
    pub rabitq: RaBitQ,
}

/// Fits the PCA and the rotation and transforms every row of `data`;
/// returns the transform and the `n × dim` transformed vectors.
pub fn fit<T: Element>(
    data: &Matrix<T>,
    plan: &BuildPlan,
    progress: Progress<'_>,
    cancel: &AtomicBool,
) -> Result<(Coding, Matrix<f32>)> {
    let (n, dim) = (data.n(), data.dim());
    let p = plan.code_dims;
    if p < 2 || p > dim {
        return Err(Error::arg(format!(
            "principal_dims={p} must be in 2..={dim} (the dimension)"
        )));
    }
    progress("pca", 0, 1);
    let rows = n.min(PCA_SAMPLE_ROWS);
    let mut sample = Vec::with_capacity(rows * dim);
    for i in 0..rows {
        let r = (i as u64 * n as u64 / rows as u64) as usize;
        sample.extend(data.row(r).iter().map(|x| x.to_f32()));
    }
    let pca = Pca::fit(&sample, dim, p)?;
    drop(sample);
    let rabitq = RaBitQ::new(p, plan.seed ^ 0x5241_4249_5451)?;
    check_cancel(cancel)?;
    progress("pca", 1, 1);
    let mut out = vec![0f32; n * dim];
    progress("transform", 0, n as u64);
    for (c, chunk) in out.chunks_mut(CHUNK_ROWS * dim).enumerate() {
        check_cancel(cancel)?;
        let start = c * CHUNK_ROWS;
        chunk
            .par_chunks_mut(dim)
            .enumerate()
            .try_for_each(|(j, y)| -> Result<()> {
                let x: Vec<f32> = data.row(start + j).iter().map(|v| v.to_f32()).collect();
                let mut t = vec![0f32; dim];
                pca.transform(&x, &mut t)?;
                rabitq.rotate(&t[..p], &mut y[..p])?;
                y[p..].copy_from_slice(&t[p..]);
                Ok(())
            })?;
        let end = (start + CHUNK_ROWS).min(n);
        data.release_rows(start, end);
        progress("transform", end as u64, n as u64);
    }
    Ok((Coding { pca, rabitq }, Matrix::from_vec(out, n, dim)?))
}

/// Writes the code region of a record (see [`PageGeometry::code_region_bytes`]):
/// the codes of `neighbours` (rows of the row-major `data` of `dim`
/// columns, principal part) relative to the record's own vector `centre`,
/// packed for FastScan, then their factors.
pub fn write_region(
    geo: &PageGeometry,
    rabitq: &RaBitQ,
    data: &[f32],
    dim: usize,
    centre: &[f32],
    neighbours: &[u32],
    rec: &mut [u8],
) -> Result<()> {
    let p = geo.code_dims;
    let deg = neighbours.len().min(geo.max_degree);
    let mut rows = Vec::with_capacity(deg * p);
    for &u in &neighbours[..deg] {
        let at = u as usize * dim;
        let row = data
            .get(at..at + p)
            .ok_or_else(|| Error::arg(format!("neighbour {u} is not a row of the data")))?;
        rows.extend_from_slice(row);
    }
    let (packed, factors) = if geo.code_bits == 1 {
        rabitq.encode_packed_rotated(&rows, &centre[..p])?
    } else {
        crate::quant::multibit::encode_packed(&rows, &centre[..p], geo.code_bits)?
    };
    let o = geo.codes_offset();
    let region = &mut rec[o..o + geo.codes];
    region.fill(0);
    let full = fastscan::packed_len(geo.max_degree, geo.code_groups())?;
    // Blocks of 32 codes are laid out one after another, so the packed
    // codes of `deg` neighbours are a prefix of the region's blocks.
    region[..packed.len()].copy_from_slice(&packed);
    let pairs: Vec<[f32; CODE_FACTORS]> = factors.iter().map(|f| [f.add, f.rescale]).collect();
    let fb = &mut region[full..full + deg * 4 * CODE_FACTORS];
    fb.copy_from_slice(bytemuck::cast_slice(&pairs));
    Ok(())
}
