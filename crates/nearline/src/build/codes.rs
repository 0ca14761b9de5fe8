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
use crate::format::CodeTrial;
use crate::kernels::l2_f32;
use crate::quant::fastscan;
use crate::quant::pca::Pca;
use crate::quant::rabitq::RaBitQ;
use crate::search::scorer::{CodeScratch, CodedScorer, Scorer};
use crate::{Error, Result};
use rayon::prelude::*;
use std::sync::atomic::AtomicBool;

/// Rows the PCA is fitted on at most (an even stride over the data).
pub const PCA_SAMPLE_ROWS: usize = 50_000;

/// Rows transformed per chunk (cancellation is checked between chunks).
const CHUNK_ROWS: usize = 16_384;

/// Seed salt of the RaBitQ rotation (the build's seed XOR this).
const ROTATION_SALT: u64 = 0x5241_4249_5451;

/// How the build chooses a coded layout's code shape (principal dimensions
/// and bits per dimension) among `candidates`, all of which fit the same
/// blocks, so a record costs the same read whichever is kept. Each shape
/// encodes the neighbour lists of sample records; sample queries score
/// them through the search's own scorer, and the shape whose estimates
/// rank a record's exact nearest neighbours (to the query) highest wins.
/// Which wins depends on the data: on wordnet-minilm (384-d, variance
/// concentrated in the leading components) 256 dimensions at 2 bits routed
/// better than 384 at 1 bit; on an isotropic 768-d mixture, where what
/// separates near neighbours lies in the trailing components too, 512 at
/// 1 bit did (recall 0.90 against 0.82 at L 10).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CodeSelection {
    /// `(principal dims, bits)`, the planner's rule first: it is kept
    /// unless another shape ranks at least `margin` better.
    pub candidates: Vec<(usize, usize)>,
    /// How much better (recall) another shape must rank than the rule's.
    pub margin: f64,
}

/// Rows of the sample whose neighbour lists the trial records hold.
const SHAPE_BASE_ROWS: usize = 5_000;
/// Sample queries (rows of the sample, left out of the base).
const SHAPE_QUERIES: usize = 200;
/// Records scored per query: its nearest base rows (the nodes a search
/// expands near its end, where routing decides recall).
const SHAPE_CENTRES: usize = 3;
/// Neighbours whose ranking a trial measures.
pub const SHAPE_K: usize = 10;

/// The transform of a coded layout.
pub struct Coding {
    pub pca: Pca,
    pub rabitq: RaBitQ,
    /// Bits per dimension of the codes.
    pub bits: usize,
    /// The shapes tried, when the build chose (see [`CodeSelection`]).
    pub trials: Vec<CodeTrial>,
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
    let (shapes, margin): (Vec<(usize, usize)>, f64) = match &plan.code_selection {
        Some(sel) if !sel.candidates.is_empty() => (sel.candidates.clone(), sel.margin),
        _ => (vec![(plan.code_dims, plan.code_bits)], 0.0),
    };
    for &(p, _) in &shapes {
        if p < 2 || p > dim {
            return Err(Error::arg(format!(
                "principal_dims={p} must be in 2..={dim} (the dimension)"
            )));
        }
    }
    progress("pca", 0, 1);
    let rows = n.min(PCA_SAMPLE_ROWS);
    let mut sample = Vec::with_capacity(rows * dim);
    for i in 0..rows {
        let r = (i as u64 * n as u64 / rows as u64) as usize;
        sample.extend(data.row(r).iter().map(|x| x.to_f32()));
    }
    let widest = shapes.iter().map(|s| s.0).max().unwrap_or(plan.code_dims);
    let pca = Pca::fit(&sample, dim, widest)?;
    check_cancel(cancel)?;
    let ((p, bits), trials) = if shapes.len() > 1 {
        progress("code shape", 0, shapes.len() as u64);
        let t = probe_shapes(&sample, dim, &pca, plan, n, &shapes)?;
        progress("code shape", shapes.len() as u64, shapes.len() as u64);
        (
            if t.is_empty() {
                shapes[0]
            } else {
                choose_shape(&t, margin)
            },
            t,
        )
    } else {
        (shapes[0], Vec::new())
    };
    drop(sample);
    let pca = pca.with_principal(p)?;
    let rabitq = RaBitQ::new(p, plan.seed ^ ROTATION_SALT)?;
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
    Ok((
        Coding {
            pca,
            rabitq,
            bits,
            trials,
        },
        Matrix::from_vec(out, n, dim)?,
    ))
}

/// The shape kept: the first candidate's (the planner's rule) unless
/// another ranks at least `margin` better; among those, the best.
pub fn choose_shape(trials: &[CodeTrial], margin: f64) -> (usize, usize) {
    let Some(first) = trials.first() else {
        return (0, 0);
    };
    let mut best = first;
    for t in &trials[1..] {
        if t.recall >= first.recall + margin && t.recall > best.recall {
            best = t;
        }
    }
    (best.principal_dims, best.bits)
}

/// Scores each of `shapes` on the PCA `sample` rows (`dim` columns,
/// original space; `pca` fitted with at least every shape's principal
/// dimensions): see [`CodeSelection`]. A sample too small for the probe
/// gives no trials (the rule's shape is kept).
pub fn probe_shapes(
    sample: &[f32],
    dim: usize,
    pca: &Pca,
    plan: &BuildPlan,
    n: usize,
    shapes: &[(usize, usize)],
) -> Result<Vec<CodeTrial>> {
    let rows = sample.len() / dim.max(1);
    let r = plan.r;
    let nq = SHAPE_QUERIES.min(rows / 10);
    let nb = SHAPE_BASE_ROWS.min(rows.saturating_sub(nq));
    if nq < 10 || nb < 2 * (r + SHAPE_K) {
        return Ok(Vec::new());
    }
    // Base rows and query rows at an even stride, in the PCA's space.
    let total = nb + nq;
    let step = total / nq;
    let mut base = Vec::with_capacity(nb * dim);
    let mut queries = Vec::with_capacity(nq * dim);
    let mut t = vec![0f32; dim];
    for j in 0..total {
        let i = (j as u64 * rows as u64 / total as u64) as usize;
        pca.transform(&sample[i * dim..(i + 1) * dim], &mut t)?;
        if j % step == step - 1 && queries.len() < nq * dim {
            queries.extend_from_slice(&t);
        } else if base.len() < nb * dim {
            base.extend_from_slice(&t);
        }
    }
    let nb = base.len() / dim;
    let nq = queries.len() / dim;
    let row = |m: &[f32], i: usize| -> Vec<f32> { m[i * dim..(i + 1) * dim].to_vec() };
    let nearest = |x: &[f32], k: usize, skip: Option<usize>| -> Vec<(f32, u32)> {
        let mut d: Vec<(f32, u32)> = (0..nb)
            .filter(|&i| Some(i) != skip)
            .map(|i| (l2_f32(x, &base[i * dim..(i + 1) * dim]), i as u32))
            .collect();
        let k = k.min(d.len());
        d.select_nth_unstable_by(k.saturating_sub(1), |a, b| a.0.total_cmp(&b.0));
        d.truncate(k);
        d.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
        d
    };
    // (query, record's node, its neighbours, the query's exact top k among them)
    let pairs: Vec<(usize, usize, Vec<u32>, Vec<u32>)> = (0..nq)
        .into_par_iter()
        .flat_map_iter(|qi| {
            let q = row(&queries, qi);
            nearest(&q, SHAPE_CENTRES, None)
                .into_iter()
                .map(|(_, c)| {
                    let c = c as usize;
                    let nbrs: Vec<u32> = nearest(&row(&base, c), r, Some(c))
                        .into_iter()
                        .map(|x| x.1)
                        .collect();
                    let mut by_q: Vec<(f32, u32)> = nbrs
                        .iter()
                        .map(|&u| {
                            (
                                l2_f32(&q, &base[u as usize * dim..(u as usize + 1) * dim]),
                                u,
                            )
                        })
                        .collect();
                    by_q.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
                    let top: Vec<u32> = by_q.iter().take(SHAPE_K).map(|x| x.1).collect();
                    (qi, c, nbrs, top)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let mut trials = Vec::with_capacity(shapes.len());
    for &(p, bits) in shapes {
        let rabitq = RaBitQ::new(p, plan.seed ^ ROTATION_SALT)?;
        // The stored space of this shape: rotated principal part, residual.
        let stored = |m: &[f32]| -> Result<Vec<f32>> {
            let mut out = vec![0f32; m.len()];
            for (x, y) in m.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
                rabitq.rotate(&x[..p], &mut y[..p])?;
                y[p..].copy_from_slice(&x[p..]);
            }
            Ok(out)
        };
        let ybase = stored(&base)?;
        let yq = stored(&queries)?;
        let scorer = CodedScorer::new(&pca.clone().with_principal(p)?, rabitq.clone(), r, bits)?;
        let geo = PageGeometry::with_codes(plan.page_size, dim * 4, r, p, bits, n)?;
        let o = geo.codes_offset();
        let hits: Result<usize> = pairs
            .par_iter()
            .map(|(qi, c, nbrs, top)| -> Result<usize> {
                let q = &yq[qi * dim..(qi + 1) * dim];
                let centre = &ybase[c * dim..(c + 1) * dim];
                let mut rec = vec![0u8; geo.record_size];
                write_region(&geo, &rabitq, &ybase, dim, centre, nbrs, &mut rec)?;
                let mut state = Vec::new();
                scorer.prepare(q, &mut state);
                let mut scratch = CodeScratch::default();
                scorer
                    .score_record(
                        &state,
                        q,
                        centre,
                        &rec[o..o + geo.codes],
                        nbrs.len(),
                        &mut scratch,
                    )
                    .map_err(|e| Error::Engine(format!("code shape probe: {e}")))?;
                let mut est: Vec<(f32, u32)> = scratch
                    .est
                    .iter()
                    .copied()
                    .zip(nbrs.iter().copied())
                    .collect();
                est.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
                Ok(est
                    .iter()
                    .take(SHAPE_K)
                    .filter(|(_, u)| top.contains(u))
                    .count())
            })
            .sum();
        let want: usize = pairs.iter().map(|x| x.3.len()).sum();
        trials.push(CodeTrial {
            principal_dims: p,
            bits,
            recall: hits? as f64 / want.max(1) as f64,
            k: SHAPE_K,
        });
    }
    Ok(trials)
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
