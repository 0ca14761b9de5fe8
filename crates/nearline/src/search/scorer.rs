//! Neighbour scorers: the cheap distance estimate that routes the search.
//!
//! When a record is expanded, each neighbour u gets an estimated distance
//! that decides its place in the candidate list. DiskANN, Starling, Gorgeous
//! and PipeANN estimate it from PQ codes held in RAM ([`PqScorer`]);
//! AlayaLaser keeps the neighbours' codes inside the record
//! ([`CodedScorer`]): the estimates of a record's neighbours come from the
//! record itself, all at once; AiSAQ keeps the neighbours' PQ codes there
//! ([`PqRecordScorer`]), with only the codebook in RAM. The executor is generic over the scorer, so
//! each one gets its own monomorphic search loop.

use crate::distance::Metric;
use crate::format::page::CODE_FACTORS;
use crate::kernels::l2_f32;
use crate::quant::fastscan::{self, FASTSCAN_BLOCK};
use crate::quant::pca::{Pca, Rotation};
use crate::quant::pq::{adc, PqCodebook, PQ_CENTROIDS};
use crate::quant::rabitq::{RaBitQ, RabitqQuery};
use crate::util::HugeBytes;

/// A distance estimate for graph neighbours, prepared once per query.
///
/// The per-query state is a float scratch buffer owned by the query's slot
/// in a worker (a PQ lookup table; later a rotated query for RaBitQ or a
/// table for codes stored in the record), so preparing a query allocates
/// nothing once the slot has served a query.
pub trait Scorer: Send + Sync {
    /// Whether neighbours are scored from the expanded record's codes
    /// ([`Scorer::score_record`]) rather than by id ([`Scorer::score`]).
    const IN_RECORD: bool = false;

    /// Whether an in-record scorer also gives the expanded node's exact
    /// distance ([`Scorer::score_record`], for vectors stored in its own
    /// space); otherwise the search computes it from the stored vector and
    /// asks only for the neighbours' estimates ([`Scorer::score_codes`]).
    const EXACT_IN_RECORD: bool = true;

    /// Prepares `state` for the query `q` (already normalised for cosine,
    /// and moved by [`Scorer::transform`]).
    fn prepare(&self, q: &[f32], state: &mut Vec<f32>);

    /// Estimated distance of node `u` to the prepared query (an in-record
    /// scorer has no estimate by id: 0, so entry nodes go first).
    fn score(&self, state: &[f32], u: u32) -> f32;

    /// Moves a query into the space the index stores its vectors in
    /// (`out` gets `q.len()` values); `false` when the index stores them
    /// as given (then `out` is untouched).
    #[inline]
    fn transform(&self, _q: &[f32], _out: &mut Vec<f32>) -> bool {
        false
    }

    /// In-record scoring: the exact distance of the expanded node (its
    /// stored vector `vector`, the query `q` in the same space) and, in
    /// `scratch.est`, the estimates of its first `n` neighbours from the
    /// record's code region `codes`. The error says what in the record is
    /// malformed.
    #[inline]
    fn score_record(
        &self,
        _state: &[f32],
        _q: &[f32],
        _vector: &[f32],
        _codes: &[u8],
        _n: usize,
        _scratch: &mut CodeScratch,
    ) -> std::result::Result<f32, String> {
        Err("this scorer does not read codes from records".into())
    }

    /// Bytes of one neighbour's code in a record whose codes are scored
    /// one by one ([`Scorer::score_code`]; 0: this scorer does not).
    #[inline]
    fn code_len(&self) -> usize {
        0
    }

    /// In-record scoring without the exact distance: the estimate of one
    /// neighbour from its code `code` ([`Scorer::code_len`] bytes) in the
    /// expanded record, so a search scores only the neighbours it has not
    /// visited.
    #[inline]
    fn score_code(&self, _state: &[f32], _code: &[u8]) -> f32 {
        0.0
    }

    /// Starts bringing what [`Scorer::score`] will read for `u` into the CPU
    /// caches, so that the misses of a node's neighbours overlap. Only a
    /// hint: scoring is correct without it.
    #[inline]
    fn prefetch(&self, _u: u32) {}
}

/// PQ codes in RAM: asymmetric distance through a per-query lookup table.
pub struct PqScorer {
    pub codebook: PqCodebook,
    /// Row-major `n × m` PQ codes (in huge pages when large: they are
    /// read at random rows).
    pub codes: HugeBytes,
    pub metric: Metric,
}

impl PqScorer {
    /// Bytes per code.
    #[inline]
    pub fn m(&self) -> usize {
        self.codebook.m()
    }
}

impl Scorer for PqScorer {
    fn prepare(&self, q: &[f32], table: &mut Vec<f32>) {
        table.resize(self.codebook.m() * PQ_CENTROIDS, 0.0);
        self.codebook.lookup_table(q, self.metric, table);
    }

    #[inline]
    fn score(&self, table: &[f32], u: u32) -> f32 {
        let m = self.codebook.m();
        let start = u as usize * m;
        adc(table, &self.codes[start..start + m])
    }

    #[inline]
    fn prefetch(&self, u: u32) {
        let m = self.codebook.m();
        let start = u as usize * m;
        if let Some(code) = self.codes.get(start..start + m) {
            crate::util::prefetch(code);
        }
    }
}

/// AiSAQ's scorer: the PQ codebook in RAM, the codes in the records. Each
/// record carries the PQ codes of its neighbours (`max_degree` slots of
/// `m` bytes), so expanding a node scores all its neighbours from the
/// record through the query's lookup table, and no code of any node is
/// resident. Vectors are stored as given: the exact distance of the
/// expanded node is the search's own.
pub struct PqRecordScorer {
    pub codebook: PqCodebook,
    pub metric: Metric,
    /// Degree bound R (slots in a record's code region).
    pub max_degree: usize,
}

impl PqRecordScorer {
    /// Resident bytes: the codebook.
    pub fn memory_bytes(&self) -> usize {
        self.codebook.memory_bytes()
    }
}

impl Scorer for PqRecordScorer {
    const IN_RECORD: bool = true;
    const EXACT_IN_RECORD: bool = false;

    fn prepare(&self, q: &[f32], table: &mut Vec<f32>) {
        table.resize(self.codebook.m() * PQ_CENTROIDS, 0.0);
        self.codebook.lookup_table(q, self.metric, table);
    }

    #[inline]
    fn score(&self, _table: &[f32], _u: u32) -> f32 {
        0.0
    }

    #[inline]
    fn code_len(&self) -> usize {
        self.codebook.m()
    }

    #[inline]
    fn score_code(&self, table: &[f32], code: &[u8]) -> f32 {
        adc(table, code)
    }
}

/// AlayaLaser's scorer: no codes in RAM; each record carries the 1-bit
/// RaBitQ codes of its neighbours (relative to itself) over the principal
/// dimensions of the index's transform, scored for all of them in one
/// FastScan pass.
///
/// A query is moved once into the stored space (`y = M (q − μ)`, the PCA
/// basis with its principal rows rotated; see `build::codes`). Expanding
/// node c gives its exact distance as principal part `‖q_p − c_p‖²` plus
/// residual part `‖q_r − c_r‖²`; a neighbour u is estimated as RaBitQ's
/// estimate of `‖q_p − u_p‖²` (with `‖q_p − c_p‖²` as its `‖q − c‖²`) plus
/// c's residual part, since u lies near c.
pub struct CodedScorer {
    /// Dimension d and principal dimensions p.
    dim: usize,
    principal: usize,
    /// The PCA's mean.
    mean: Vec<f32>,
    /// `d × d`, row-major: the rotated principal rows, then the residual rows.
    matrix: Vec<f32>,
    /// Degree bound R (slots in a record's code region).
    max_degree: usize,
    /// Bits per dimension of the codes: 1 (RaBitQ) or 2, 4
    /// (`quant::multibit`).
    bits: usize,
}

/// Scalars at the head of a coded query's state: `ip_scale`, `ip_offset`.
const CODED_HEAD: usize = 2;

impl CodedScorer {
    /// The scorer of a coded layout with PCA `pca`, RaBitQ rotation
    /// `rabitq` over its principal dimensions, degree bound `max_degree`
    /// and codes of `bits` per dimension.
    pub fn new(pca: &Pca, rabitq: RaBitQ, max_degree: usize, bits: usize) -> crate::Result<Self> {
        let (dim, p) = (pca.dim(), pca.principal());
        if ![1, 2, 4].contains(&bits) {
            return Err(crate::Error::arg(format!(
                "codes of {bits} bits per dimension: expected 1, 2 or 4"
            )));
        }
        if rabitq.dim() != p {
            return Err(crate::Error::arg(format!(
                "the RaBitQ rotation is {}-d, the PCA keeps {p} principal dimensions",
                rabitq.dim()
            )));
        }
        let basis = pca.basis();
        let rot: &Rotation = rabitq.rotation();
        let r = rot.matrix();
        let mut matrix = vec![0f32; dim * dim];
        // Rows 0..p: R · B_p (f64 accumulation); rows p..d: B_r.
        for i in 0..p {
            for j in 0..dim {
                let mut acc = 0f64;
                for k in 0..p {
                    acc += r[i * p + k] as f64 * basis[k * dim + j] as f64;
                }
                matrix[i * dim + j] = acc as f32;
            }
        }
        matrix[p * dim..].copy_from_slice(&basis[p * dim..]);
        Ok(CodedScorer {
            dim,
            principal: p,
            mean: pca.mean().to_vec(),
            matrix,
            max_degree,
            bits,
        })
    }

    /// Principal dimensions the codes cover.
    pub fn principal(&self) -> usize {
        self.principal
    }

    /// Resident bytes (the merged transform and the mean).
    pub fn memory_bytes(&self) -> usize {
        (self.matrix.capacity() + self.mean.capacity()) * 4 + 4 * self.principal + 256
    }

    /// FastScan groups of a code (4 bits each).
    #[inline]
    fn groups(&self) -> usize {
        (self.principal * self.bits).div_ceil(4)
    }
}

impl Scorer for CodedScorer {
    const IN_RECORD: bool = true;

    fn prepare(&self, q: &[f32], state: &mut Vec<f32>) {
        let g = self.groups();
        state.clear();
        state.resize(CODED_HEAD + 4 * g, 0.0);
        // The query is finite (checked before) and has `dim` values, so
        // this cannot fail; a failure leaves tables of zeros (every
        // estimate equal), never a wrong exact distance.
        let qp = &q[..self.principal];
        let prepared = if self.bits == 1 {
            RabitqQuery::from_rotated(qp)
                .map(|rq| (rq.ip_scale(), rq.ip_offset(), rq.luts().to_vec()))
        } else {
            crate::quant::multibit::prepare_query(qp, self.bits)
                .map(|mq| (mq.ip_scale, mq.ip_offset, mq.luts.luts().to_vec()))
        };
        if let Ok((scale, offset, tables)) = prepared {
            state[0] = scale;
            state[1] = offset;
            let luts: &mut [u8] = bytemuck::cast_slice_mut(&mut state[CODED_HEAD..]);
            luts.copy_from_slice(&tables);
        }
    }

    #[inline]
    fn score(&self, _state: &[f32], _u: u32) -> f32 {
        0.0
    }

    fn transform(&self, q: &[f32], out: &mut Vec<f32>) -> bool {
        let d = self.dim;
        if q.len() != d {
            return false;
        }
        // The centred query in `out`'s second half (no allocation once the
        // slot's buffer has grown), the transform in its first.
        out.clear();
        out.resize(2 * d, 0.0);
        let (y, centred) = out.split_at_mut(d);
        for ((c, &x), &m) in centred.iter_mut().zip(q).zip(&self.mean) {
            *c = x - m;
        }
        for (i, o) in y.iter_mut().enumerate() {
            *o = crate::kernels::dot_f32(&self.matrix[i * d..(i + 1) * d], centred);
        }
        out.truncate(d);
        true
    }

    #[inline]
    fn score_record(
        &self,
        state: &[f32],
        q: &[f32],
        vector: &[f32],
        codes: &[u8],
        n: usize,
        scratch: &mut CodeScratch,
    ) -> std::result::Result<f32, String> {
        let p = self.principal;
        let CodeScratch { sums, est: out } = scratch;
        if vector.len() != self.dim || q.len() != self.dim {
            return Err(format!(
                "record vector has {} values, the index {}",
                vector.len(),
                self.dim
            ));
        }
        let qc = l2_f32(&q[..p], &vector[..p]);
        let residual = l2_f32(&q[p..], &vector[p..]);
        out.clear();
        if n == 0 {
            return Ok(qc + residual);
        }
        if n > self.max_degree {
            return Err(format!(
                "record lists {n} neighbours, above R = {}",
                self.max_degree
            ));
        }
        let g = self.groups();
        let full = fastscan::packed_len(self.max_degree, g).map_err(|e| e.to_string())?;
        let used = fastscan::packed_len(n, g).map_err(|e| e.to_string())?;
        let fbytes = 4 * CODE_FACTORS * n;
        let (packed, factors) = match (codes.get(..used), codes.get(full..full + fbytes)) {
            (Some(pk), Some(f)) => (pk, f),
            _ => return Err(format!("code region of {} bytes is short", codes.len())),
        };
        let factors: &[[f32; CODE_FACTORS]] = bytemuck::try_cast_slice(factors)
            .map_err(|e| format!("code factors are misaligned: {e:?}"))?;
        sums.clear();
        sums.resize(n.div_ceil(FASTSCAN_BLOCK) * FASTSCAN_BLOCK, 0);
        let luts: &[u8] = bytemuck::cast_slice(&state[CODED_HEAD..CODED_HEAD + 4 * g]);
        fastscan::scan(packed, g, luts, sums).map_err(|e| e.to_string())?;
        let (scale, offset) = (state[0], state[1]);
        // RaBitQ's estimate (quant::rabitq::RabitqQuery::distance) of the
        // principal part, plus the expanded node's residual part.
        out.extend(sums[..n].iter().zip(factors).map(|(&s, &[add, rescale])| {
            add + qc + rescale * (scale * s as f32 + offset) + residual
        }));
        Ok(qc + residual)
    }
}

/// A query's scratch for in-record scoring: the FastScan sums of a
/// record's slots and the neighbours' estimates.
#[derive(Debug, Default, Clone)]
pub struct CodeScratch {
    pub sums: Vec<u32>,
    pub est: Vec<f32>,
}

impl CodeScratch {
    /// Bytes held.
    pub fn memory_bytes(&self) -> usize {
        (self.sums.capacity() + self.est.capacity()) * 4
    }
}

/// The scorers an index can use; matched once per batch.
pub enum AnyScorer {
    Pq(PqScorer),
    Coded(CodedScorer),
    PqRecord(PqRecordScorer),
}
