//! Product quantization: codebook training, encoding, per-query lookup tables
//! and asymmetric distance computation (ADC).
//!
//! A vector is split into `m` chunks of contiguous dimensions (sizes differ by
//! at most one); each chunk is replaced by the index of the nearest of 256
//! centroids trained by k-means on that chunk. For L2 and cosine the data is
//! first centred on the training mean (an index built before cosine was
//! centred stores a zero centre and is read the same way).
//!
//! Serialised form (all little-endian):
//!
//! | field       | type            | count            |
//! |-------------|-----------------|------------------|
//! | magic       | `b"NLPQ"`       | 4 bytes          |
//! | version     | u32             | 1 (= 1)          |
//! | dim         | u32             | 1                |
//! | m           | u32             | 1                |
//! | offsets     | u32             | m + 1            |
//! | center      | f32             | dim              |
//! | centroids   | f32             | 256 × dim        |
//!
//! Centroids are stored chunk after chunk, each chunk as 256 rows of its
//! chunk dimension.

use crate::data::matrix::MatrixView;
use crate::distance::Metric;
use crate::elem::Element;
use crate::quant::kmeans::{kmeans_cancellable, KMeansParams, LOWER_BOUNDS_MAX_ENTRIES};
use crate::{Error, Result};
use rayon::prelude::*;
use std::sync::atomic::AtomicBool;

/// Codewords per chunk (one byte per chunk code).
pub const PQ_CENTROIDS: usize = 256;

/// Elkan iterations per chunk during training.
pub const PQ_TRAIN_ITERS: usize = 12;

/// Largest number of PQ bytes per vector the planner chooses by itself.
pub const PQ_MAX_BYTES: usize = 512;

/// Rows per parallel work item when encoding.
const ENCODE_CHUNK: usize = 256;

/// A trained product quantizer: `m` chunks over contiguous dimension ranges,
/// 256 centroids each.
#[derive(Debug, Clone, PartialEq)]
pub struct PqCodebook {
    dim: usize,
    m: usize,
    /// `m + 1` chunk boundaries over `0..dim`.
    chunk_offsets: Vec<u32>,
    /// Subtracted before encoding (the data mean for L2, zeros otherwise).
    center: Vec<f32>,
    /// The centroids transposed per chunk: for chunk j, `chunk_dim(j)` rows
    /// of 256 floats (dimension-major), so that distances from one
    /// sub-vector to all 256 centroids vectorise. The only copy held (the
    /// row-major form is derived when it is written).
    centroids_t: Vec<f32>,
}

/// `m + 1` boundaries splitting `0..dim` into `m` contiguous ranges whose sizes
/// differ by at most one (the larger ones first).
fn make_offsets(dim: usize, m: usize) -> Vec<u32> {
    let (base, extra) = (dim / m, dim % m);
    let mut off = Vec::with_capacity(m + 1);
    let mut at = 0usize;
    off.push(0);
    for j in 0..m {
        at += base + usize::from(j < extra);
        off.push(at as u32);
    }
    off
}

/// Per-chunk transposition of row-major centroids (see
/// `PqCodebook::centroids_t`); [`untranspose`] inverts it.
fn transpose(offsets: &[u32], centroids: &[f32]) -> Vec<f32> {
    let mut t = vec![0.0f32; centroids.len()];
    for w in offsets.windows(2) {
        let (lo, hi) = (w[0] as usize, w[1] as usize);
        let cd = hi - lo;
        let base = lo * PQ_CENTROIDS;
        for c in 0..PQ_CENTROIDS {
            for d in 0..cd {
                t[base + d * PQ_CENTROIDS + c] = centroids[base + c * cd + d];
            }
        }
    }
    t
}

/// Row-major centroids from their per-chunk transposition.
fn untranspose(offsets: &[u32], t: &[f32]) -> Vec<f32> {
    let mut c = vec![0.0f32; t.len()];
    for w in offsets.windows(2) {
        let (lo, hi) = (w[0] as usize, w[1] as usize);
        let cd = hi - lo;
        let base = lo * PQ_CENTROIDS;
        for k in 0..PQ_CENTROIDS {
            for d in 0..cd {
                c[base + k * cd + d] = t[base + d * PQ_CENTROIDS + k];
            }
        }
    }
    c
}

/// SplitMix64 finaliser: independent per-chunk seeds from one seed.
fn mix(seed: u64, j: u64) -> u64 {
    let mut z = seed ^ j.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl PqCodebook {
    /// Trains on the row-major float `sample` (`n × dim`) with `m` chunks.
    /// L2 and cosine (whose rows are normalised) centre the data on its
    /// mean; inner product does not.
    /// Runs on the caller's current rayon pool; deterministic for a seed.
    ///
    /// Each chunk runs k-means with 256 centroids and [`PQ_TRAIN_ITERS`]
    /// iterations; with fewer than 256 sample rows the centroids are repeated
    /// to fill 256 slots (duplicates are harmless).
    pub fn train(sample: &[f32], dim: usize, m: usize, metric: Metric, seed: u64) -> Result<Self> {
        Self::train_cancellable(sample, dim, m, metric, seed, &AtomicBool::new(false))
    }

    /// [`PqCodebook::train`] that stops with [`Error::Cancelled`] soon
    /// after `cancel` is set (each chunk's k-means checks it at every seed
    /// and iteration).
    pub fn train_cancellable(
        sample: &[f32],
        dim: usize,
        m: usize,
        metric: Metric,
        seed: u64,
        cancel: &AtomicBool,
    ) -> Result<Self> {
        if dim == 0 {
            return Err(Error::arg("PQ training: dim must be at least 1"));
        }
        if !sample.len().is_multiple_of(dim) {
            return Err(Error::arg(format!(
                "PQ training: sample has {} values, not a multiple of dim = {dim}",
                sample.len()
            )));
        }
        let n = sample.len() / dim;
        if n == 0 {
            return Err(Error::arg("PQ training: the sample is empty"));
        }
        if m == 0 || m > dim {
            return Err(Error::arg(format!(
                "PQ training: m = {m} chunks, expected 1 <= m <= dim = {dim}"
            )));
        }
        if dim > u32::MAX as usize {
            return Err(Error::arg(format!("PQ training: dim = {dim} is too large")));
        }
        if let Some(pos) = sample.iter().position(|v| !v.is_finite()) {
            return Err(Error::arg(format!(
                "PQ training: sample value at row {}, column {} is {} (expected a finite number)",
                pos / dim,
                pos % dim,
                sample[pos]
            )));
        }
        let offsets = make_offsets(dim, m);
        let center = match metric {
            Metric::L2 | Metric::Cosine => column_mean(sample, dim, n),
            Metric::InnerProduct => vec![0.0; dim],
        };
        let k = PQ_CENTROIDS.min(n);
        // Chunks train concurrently: split the lower-bound memory between them.
        let lb_budget = LOWER_BOUNDS_MAX_ENTRIES / rayon::current_num_threads().max(1);
        let per_chunk: Vec<Result<Vec<f32>>> = (0..m)
            .into_par_iter()
            .map(|j| {
                let (lo, hi) = (offsets[j] as usize, offsets[j + 1] as usize);
                let cd = hi - lo;
                let mut sub = vec![0.0f32; n * cd];
                sub.par_chunks_mut(cd * 1024)
                    .enumerate()
                    .for_each(|(bi, block)| {
                        for (r, out) in block.chunks_exact_mut(cd).enumerate() {
                            let i = bi * 1024 + r;
                            let x = &sample[i * dim + lo..i * dim + hi];
                            for ((o, &v), &c) in out.iter_mut().zip(x).zip(&center[lo..hi]) {
                                *o = v - c;
                            }
                        }
                    });
                let params = KMeansParams {
                    k,
                    max_iters: PQ_TRAIN_ITERS,
                    seed: mix(seed, j as u64),
                };
                let mut c =
                    kmeans_cancellable(&sub, cd, &params, lb_budget, Some(cancel))?.centroids;
                c.reserve(PQ_CENTROIDS * cd - c.len());
                for r in k..PQ_CENTROIDS {
                    let src = (r % k) * cd;
                    c.extend_from_within(src..src + cd);
                }
                Ok(c)
            })
            .collect();
        let mut centroids = Vec::with_capacity(PQ_CENTROIDS * dim);
        for c in per_chunk {
            centroids.extend_from_slice(&c?);
        }
        Self::from_parts(dim, m, offsets, centroids, center).map_err(Error::arg)
    }

    /// A codebook from its parts (what [`crate::format::pq`] stores): `m + 1`
    /// increasing chunk offsets from 0 to `dim`, a `dim`-vector centre and
    /// `256 × dim` centroid values, all finite. The error names the part.
    pub fn from_parts(
        dim: usize,
        m: usize,
        chunk_offsets: Vec<u32>,
        centroids: Vec<f32>,
        center: Vec<f32>,
    ) -> std::result::Result<Self, String> {
        if dim == 0 || m == 0 || m > dim {
            return Err(format!("dim = {dim}, m = {m}: expected 1 <= m <= dim"));
        }
        if chunk_offsets.len() != m + 1
            || chunk_offsets[0] != 0
            || chunk_offsets[m] as usize != dim
            || chunk_offsets.windows(2).any(|w| w[1] <= w[0])
        {
            return Err(format!(
                "chunk offsets {chunk_offsets:?} must increase from 0 to dim = {dim} in {m} non-empty chunks"
            ));
        }
        if center.len() != dim || centroids.len() != PQ_CENTROIDS * dim {
            return Err(format!(
                "{} centre and {} centroid values, expected {dim} and {}",
                center.len(),
                centroids.len(),
                PQ_CENTROIDS * dim
            ));
        }
        if center.iter().chain(&centroids).any(|x| !x.is_finite()) {
            return Err("the codebook holds a non-finite value".into());
        }
        let centroids_t = transpose(&chunk_offsets, &centroids);
        Ok(PqCodebook {
            dim,
            m,
            chunk_offsets,
            center,
            centroids_t,
        })
    }

    /// Vector dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// Number of chunks = bytes per code.
    pub fn m(&self) -> usize {
        self.m
    }
    /// The `m + 1` chunk boundaries over `0..dim`.
    pub fn chunk_offsets(&self) -> &[u32] {
        &self.chunk_offsets
    }
    /// The vector subtracted before encoding (training mean for L2, else zeros).
    pub fn center(&self) -> &[f32] {
        &self.center
    }
    /// All centroids: for chunk j, 256 rows of `chunk_offsets[j+1] - chunk_offsets[j]`
    /// floats, chunk after chunk (computed: the codebook holds them transposed).
    pub fn centroids(&self) -> Vec<f32> {
        untranspose(&self.chunk_offsets, &self.centroids_t)
    }
    /// Heap and inline bytes held by the codebook.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + 4 * (self.chunk_offsets.capacity()
                + self.center.capacity()
                + self.centroids_t.capacity())
    }

    #[inline]
    fn chunk(&self, j: usize) -> (usize, usize) {
        (
            self.chunk_offsets[j] as usize,
            self.chunk_offsets[j + 1] as usize,
        )
    }

    /// Encodes one vector into `code` (`m` bytes).
    ///
    /// # Panics
    /// If `v.len() != dim` or `code.len() != m` (a caller bug).
    pub fn encode(&self, v: &[f32], code: &mut [u8]) {
        assert_eq!(v.len(), self.dim, "PqCodebook::encode: vector length");
        assert_eq!(code.len(), self.m, "PqCodebook::encode: code length");
        let mut scratch = vec![0.0f32; self.dim];
        self.encode_into(Kernels::detect(), v, code, &mut scratch);
    }

    fn encode_into(&self, kern: Kernels, v: &[f32], code: &mut [u8], scratch: &mut [f32]) {
        for ((s, &x), &c) in scratch.iter_mut().zip(v).zip(&self.center) {
            *s = x - c;
        }
        for (j, cj) in code.iter_mut().enumerate() {
            let (lo, hi) = self.chunk(j);
            *cj = kern.encode_chunk(
                &scratch[lo..hi],
                &self.centroids_t[lo * PQ_CENTROIDS..hi * PQ_CENTROIDS],
            );
        }
    }

    /// Encodes every row of `data` (converted to f32; cosine data must
    /// already be normalised) into a row-major `n × m` code array, in parallel
    /// on the caller's current rayon pool.
    ///
    /// # Panics
    /// If `data.dim() != dim` (a caller bug).
    pub fn encode_all<T: Element>(&self, data: MatrixView<'_, T>) -> Vec<u8> {
        assert_eq!(
            data.dim(),
            self.dim,
            "PqCodebook::encode_all: data dimension"
        );
        let (n, m, dim) = (data.n(), self.m, self.dim);
        let mut out = vec![0u8; n * m];
        let kern = Kernels::detect();
        out.par_chunks_mut(ENCODE_CHUNK * m)
            .enumerate()
            .for_each(|(bi, block)| {
                let mut row = vec![0.0f32; dim];
                let mut scratch = vec![0.0f32; dim];
                for (r, code) in block.chunks_exact_mut(m).enumerate() {
                    for (o, &x) in row.iter_mut().zip(data.row(bi * ENCODE_CHUNK + r)) {
                        *o = x.to_f32();
                    }
                    self.encode_into(kern, &row, code, &mut scratch);
                }
            });
        out
    }

    /// Reconstructs the vector a code stands for (`center` + centroids).
    ///
    /// # Panics
    /// If `code.len() != m` or `out.len() != dim` (a caller bug).
    pub fn decode(&self, code: &[u8], out: &mut [f32]) {
        assert_eq!(code.len(), self.m, "PqCodebook::decode: code length");
        assert_eq!(out.len(), self.dim, "PqCodebook::decode: output length");
        for (j, &c) in code.iter().enumerate() {
            let (lo, hi) = self.chunk(j);
            let t = &self.centroids_t[lo * PQ_CENTROIDS..hi * PQ_CENTROIDS];
            for (d, (o, &z)) in out[lo..hi].iter_mut().zip(&self.center[lo..hi]).enumerate() {
                *o = t[d * PQ_CENTROIDS + c as usize] + z;
            }
        }
    }

    /// Fills `table` (`m × 256`) so that [`adc`] of a code approximates the
    /// internal distance (squared L2; `-dot` for inner product and cosine)
    /// between `q` and the encoded vector.
    ///
    /// For L2, `table[j*256 + c]` is the squared distance between chunk j of
    /// `q - center` and centroid c; for inner product and cosine it is
    /// `-dot(q_j, centroid_c)` (the center is zero for those metrics; cosine
    /// callers add 1 to get `1 - dot`).
    ///
    /// # Panics
    /// If `q.len() != dim` or `table.len() < m * 256` (a caller bug).
    pub fn lookup_table(&self, q: &[f32], metric: Metric, table: &mut [f32]) {
        assert_eq!(q.len(), self.dim, "PqCodebook::lookup_table: query length");
        assert!(
            table.len() >= self.m * PQ_CENTROIDS,
            "PqCodebook::lookup_table: table needs m * 256 = {} floats, got {}",
            self.m * PQ_CENTROIDS,
            table.len()
        );
        let kern = Kernels::detect();
        let mut acc = [0.0f32; PQ_CENTROIDS];
        let mut scratch = vec![0.0f32; self.dim];
        match metric {
            Metric::L2 | Metric::Cosine => {
                for ((s, &x), &c) in scratch.iter_mut().zip(q).zip(&self.center) {
                    *s = x - c;
                }
            }
            Metric::InnerProduct => scratch.copy_from_slice(q),
        }
        for (j, out) in table
            .chunks_exact_mut(PQ_CENTROIDS)
            .take(self.m)
            .enumerate()
        {
            let (lo, hi) = self.chunk(j);
            let ct = &self.centroids_t[lo * PQ_CENTROIDS..hi * PQ_CENTROIDS];
            match metric {
                Metric::L2 => kern.l2_all(&scratch[lo..hi], ct, &mut acc),
                // Cosine rows and queries are unit vectors, for which
                // 1 − q·x = ‖q − x‖² / 2: the estimate is half the squared
                // distance to the reconstruction, on the exact distance's
                // scale. (−q·x̂ alone ranked worse: it ignores how far a
                // reconstruction's norm is from 1; on 20k × 768 at 48 bytes
                // recall@10 at L 100 was 0.90 against 0.99 for l2 on the
                // same normalised rows.)
                Metric::Cosine => {
                    kern.l2_all(&scratch[lo..hi], ct, &mut acc);
                    acc.iter_mut().for_each(|a| *a *= 0.5);
                }
                Metric::InnerProduct => kern.neg_dot_all(&scratch[lo..hi], ct, &mut acc),
            }
            out.copy_from_slice(&acc);
        }
    }
}

/// Column means of `n × dim` rows, summed in f64 over fixed-size row blocks
/// combined in block order (thread-count independent).
fn column_mean(sample: &[f32], dim: usize, n: usize) -> Vec<f32> {
    const BLOCK: usize = 1024;
    let parts: Vec<Vec<f64>> = sample
        .par_chunks(BLOCK * dim)
        .map(|block| {
            let mut acc = vec![0.0f64; dim];
            for r in block.chunks_exact(dim) {
                for (a, &x) in acc.iter_mut().zip(r) {
                    *a += x as f64;
                }
            }
            acc
        })
        .collect();
    let mut total = vec![0.0f64; dim];
    for p in &parts {
        for (t, &x) in total.iter_mut().zip(p) {
            *t += x;
        }
    }
    total.iter().map(|&t| (t / n as f64) as f32).collect()
}

/// Index of the smallest value (the first one on ties). Eight independent
/// lanes of (value, index) kept as floats so that the selects vectorise
/// (indices < 256 are exact in f32), then a reduction preferring lower indices.
#[inline(always)]
fn argmin(acc: &[f32; PQ_CENTROIDS]) -> u8 {
    const L: usize = 8;
    let mut val = [f32::INFINITY; L];
    let mut idx = [0.0f32; L];
    for (g, chunk) in acc.chunks_exact(L).enumerate() {
        let base = (g * L) as f32;
        for l in 0..L {
            let better = chunk[l] < val[l];
            val[l] = if better { chunk[l] } else { val[l] };
            idx[l] = if better { base + l as f32 } else { idx[l] };
        }
    }
    let mut best = 0;
    for l in 1..L {
        if val[l] < val[best] || (val[l] == val[best] && idx[l] < idx[best]) {
            best = l;
        }
    }
    idx[best] as u8
}

/// Code of one sub-vector: the nearest of the 256 centroids.
#[inline(always)]
fn encode_chunk_body(x: &[f32], ct: &[f32]) -> u8 {
    let mut acc = [0.0f32; PQ_CENTROIDS];
    l2_all_body(x, ct, &mut acc);
    argmin(&acc)
}

/// Centroids per register block: 64 f32 accumulators fit in 8 AVX registers.
const BLOCK: usize = 64;

/// `acc[c] = Σ_d (x[d] - ct[d*256 + c])²`: one sub-vector against all 256
/// centroids of a chunk stored dimension-major. Centroids are processed in
/// blocks whose accumulators stay in registers while the dimensions stream by.
#[inline(always)]
fn l2_all_body(x: &[f32], ct: &[f32], acc: &mut [f32; PQ_CENTROIDS]) {
    for (b, out) in acc.chunks_exact_mut(BLOCK).enumerate() {
        let mut a = [0.0f32; BLOCK];
        for (&xd, row) in x.iter().zip(ct.chunks_exact(PQ_CENTROIDS)) {
            let r = &row[b * BLOCK..(b + 1) * BLOCK];
            for (ai, &c) in a.iter_mut().zip(r) {
                let t = xd - c;
                *ai += t * t;
            }
        }
        out.copy_from_slice(&a);
    }
}

/// `acc[c] = -Σ_d x[d] · ct[d*256 + c]`.
#[inline(always)]
fn neg_dot_all_body(x: &[f32], ct: &[f32], acc: &mut [f32; PQ_CENTROIDS]) {
    for (b, out) in acc.chunks_exact_mut(BLOCK).enumerate() {
        let mut a = [0.0f32; BLOCK];
        for (&xd, row) in x.iter().zip(ct.chunks_exact(PQ_CENTROIDS)) {
            let r = &row[b * BLOCK..(b + 1) * BLOCK];
            for (ai, &c) in a.iter_mut().zip(r) {
                *ai -= xd * c;
            }
        }
        out.copy_from_slice(&a);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn l2_all_avx2(x: &[f32], ct: &[f32], acc: &mut [f32; PQ_CENTROIDS]) {
    l2_all_body(x, ct, acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn encode_chunk_avx2(x: &[f32], ct: &[f32]) -> u8 {
    encode_chunk_body(x, ct)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn neg_dot_all_avx2(x: &[f32], ct: &[f32], acc: &mut [f32; PQ_CENTROIDS]) {
    neg_dot_all_body(x, ct, acc)
}

/// The table kernels, chosen once per call from the CPU's features. Both
/// variants perform the same operations in the same order (no FMA
/// contraction), so they give identical results.
#[derive(Clone, Copy)]
struct Kernels {
    avx2: bool,
}

impl Kernels {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            Kernels {
                avx2: std::arch::is_x86_feature_detected!("avx2"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Kernels { avx2: false }
        }
    }

    #[inline]
    fn l2_all(self, x: &[f32], ct: &[f32], acc: &mut [f32; PQ_CENTROIDS]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: `avx2` is only set when the running CPU supports AVX2.
            unsafe { l2_all_avx2(x, ct, acc) };
            return;
        }
        l2_all_body(x, ct, acc)
    }

    #[inline]
    fn encode_chunk(self, x: &[f32], ct: &[f32]) -> u8 {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: `avx2` is only set when the running CPU supports AVX2.
            return unsafe { encode_chunk_avx2(x, ct) };
        }
        encode_chunk_body(x, ct)
    }

    #[inline]
    fn neg_dot_all(self, x: &[f32], ct: &[f32], acc: &mut [f32; PQ_CENTROIDS]) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: `avx2` is only set when the running CPU supports AVX2.
            unsafe { neg_dot_all_avx2(x, ct, acc) };
            return;
        }
        neg_dot_all_body(x, ct, acc)
    }
}

/// Asymmetric distance of one code: `sum_j table[j*256 + code[j]]`.
#[inline]
pub fn adc(table: &[f32], code: &[u8]) -> f32 {
    // Rows of exactly 256 entries: indexing one by a u8 needs no bounds check.
    let (rows, _) = table.as_chunks::<PQ_CENTROIDS>();
    // Four accumulators break the add dependency chain.
    let mut acc = [0.0f32; 4];
    let mut it = rows.chunks_exact(4).zip(code.chunks_exact(4));
    for (r, c) in &mut it {
        acc[0] += r[0][c[0] as usize];
        acc[1] += r[1][c[1] as usize];
        acc[2] += r[2][c[2] as usize];
        acc[3] += r[3][c[3] as usize];
    }
    let done = code.len() / 4 * 4;
    let mut tail = 0.0;
    for (r, &c) in rows[done..].iter().zip(&code[done..]) {
        tail += r[c as usize];
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{dot_f32, l2_f32};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// PQ training with the cancel flag set returns `Cancelled` with each
    /// chunk's k-means stopped at its first check (after its first seed):
    /// one check per chunk, where a full training makes 255 seeds' and
    /// every iteration's worth per chunk.
    #[test]
    fn cancelled_training_stops_every_chunk_after_one_seed() {
        use crate::quant::kmeans::CHECKS;
        let (n, dim, m) = (600, 16, 8);
        let sample = clustered(n, dim, 12, 1.0, 5);
        // One worker thread: every chunk's k-means runs (and counts) on it.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let run = |flag: bool| {
            pool.install(|| {
                CHECKS.with(|c| c.set(0));
                let cancel = AtomicBool::new(flag);
                let r = PqCodebook::train_cancellable(&sample, dim, m, Metric::L2, 3, &cancel);
                (r, CHECKS.with(|c| c.get()))
            })
        };
        let (r, checks) = run(true);
        assert!(matches!(r, Err(Error::Cancelled)), "{:?}", r.err());
        assert!(checks <= m, "{checks} checks for {m} chunks");
        let (r, full) = run(false);
        r.unwrap();
        assert!(full >= m * 255, "a full training made {full} checks");
    }

    fn clustered(n: usize, dim: usize, k: usize, spread: f32, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let centres: Vec<f32> = (0..k * dim)
            .map(|_| rng.random_range(-10.0..10.0))
            .collect();
        (0..n)
            .flat_map(|i| {
                let c = i % k;
                (0..dim)
                    .map(|d| centres[c * dim + d] + spread * (rng.random::<f32>() - 0.5))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn decode_all(pq: &PqCodebook, codes: &[u8]) -> Vec<f32> {
        let mut out = vec![0.0; codes.len() / pq.m() * pq.dim()];
        for (c, o) in codes
            .chunks_exact(pq.m())
            .zip(out.chunks_exact_mut(pq.dim()))
        {
            pq.decode(c, o);
        }
        out
    }

    #[test]
    fn chunks_are_balanced() {
        assert_eq!(make_offsets(10, 3), vec![0, 4, 7, 10]);
        assert_eq!(make_offsets(8, 8), vec![0, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            make_offsets(128, 32).windows(2).map(|w| w[1] - w[0]).max(),
            Some(4)
        );
        let data = clustered(600, 10, 5, 0.1, 1);
        let pq = PqCodebook::train(&data, 10, 3, Metric::L2, 0).unwrap();
        assert_eq!(pq.chunk_offsets(), &[0, 4, 7, 10]);
        assert_eq!(pq.centroids().len(), 256 * 10);
        // One copy of the centroids (transposed), the centre and the offsets.
        assert!(pq.memory_bytes() >= 256 * 10 * 4 + 10 * 4 + 4 * 4);
        assert!(pq.memory_bytes() < 2 * 256 * 10 * 4);
    }

    #[test]
    fn reconstruction_error_small_on_clustered_data() {
        let (n, dim) = (3000, 16);
        let data = clustered(n, dim, 40, 0.2, 2);
        let pq = PqCodebook::train(&data, dim, 4, Metric::L2, 7).unwrap();
        // The L2 center is the sample mean.
        for d in 0..dim {
            let mean = data
                .iter()
                .skip(d)
                .step_by(dim)
                .map(|&x| x as f64)
                .sum::<f64>()
                / n as f64;
            assert!((pq.center()[d] as f64 - mean).abs() < 1e-4);
        }
        let codes = pq.encode_all(MatrixView::new(&data, n, dim).unwrap());
        assert_eq!(codes.len(), n * 4);
        let rec = decode_all(&pq, &codes);
        let err: f64 = data
            .iter()
            .zip(&rec)
            .map(|(a, b)| ((a - b) * (a - b)) as f64)
            .sum::<f64>()
            / n as f64;
        let var: f64 = data
            .chunks_exact(dim)
            .map(|x| l2_f32(x, pq.center()) as f64)
            .sum::<f64>()
            / n as f64;
        assert!(err < 0.01 * var, "error {err} vs variance {var}");
    }

    #[test]
    fn encode_picks_nearest_centroid_per_chunk() {
        let (n, dim) = (1000, 12);
        let data = clustered(n, dim, 30, 3.0, 3);
        let pq = PqCodebook::train(&data, dim, 5, Metric::L2, 1).unwrap();
        let mut code = vec![0u8; 5];
        let centroids = pq.centroids();
        for x in data.chunks_exact(dim).take(100) {
            pq.encode(x, &mut code);
            for j in 0..5 {
                let (lo, hi) = pq.chunk(j);
                let cd = hi - lo;
                let sub: Vec<f32> = (lo..hi).map(|d| x[d] - pq.center()[d]).collect();
                let dists: Vec<f32> = (0..256)
                    .map(|c| l2_f32(&sub, &centroids[lo * 256 + c * cd..][..cd]))
                    .collect();
                let best = dists.iter().cloned().fold(f32::INFINITY, f32::min);
                assert!(dists[code[j] as usize] <= best * (1.0 + 1e-5) + 1e-6);
            }
        }
    }

    #[test]
    fn adc_equals_distance_to_reconstruction() {
        let (n, dim) = (1500, 20);
        let data = clustered(n, dim, 25, 4.0, 4);
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for metric in [Metric::L2, Metric::InnerProduct, Metric::Cosine] {
            let pq = PqCodebook::train(&data, dim, 6, metric, 3).unwrap();
            if metric == Metric::InnerProduct {
                assert!(pq.center().iter().all(|&c| c == 0.0));
            }
            let codes = pq.encode_all(MatrixView::new(&data, n, dim).unwrap());
            let rec = decode_all(&pq, &codes);
            let q: Vec<f32> = (0..dim).map(|_| rng.random_range(-10.0..10.0)).collect();
            let mut table = vec![0.0; 6 * 256];
            pq.lookup_table(&q, metric, &mut table);
            for (code, r) in codes.chunks_exact(6).zip(rec.chunks_exact(dim)) {
                let want = match metric {
                    Metric::L2 => l2_f32(&q, r),
                    Metric::Cosine => 0.5 * l2_f32(&q, r),
                    Metric::InnerProduct => -dot_f32(&q, r),
                };
                let got = adc(&table, code);
                assert!(
                    (got - want).abs() <= 1e-3 * want.abs().max(1.0),
                    "{metric}: {got} vs {want}"
                );
            }
        }
    }

    /// On unit rows cosine trains and ranks as l2 does, on half its scale
    /// (the exact cosine distance's: 1 − q·x = ‖q − x‖² / 2).
    #[test]
    fn cosine_ranks_as_l2_on_unit_rows() {
        let (n, dim) = (1500, 24);
        let mut data = clustered(n, dim, 25, 4.0, 11);
        for r in data.chunks_exact_mut(dim) {
            let norm = dot_f32(r, r).sqrt();
            r.iter_mut().for_each(|x| *x /= norm);
        }
        let cos = PqCodebook::train(&data, dim, 6, Metric::Cosine, 3).unwrap();
        let l2 = PqCodebook::train(&data, dim, 6, Metric::L2, 3).unwrap();
        assert_eq!(cos.center(), l2.center());
        assert!(cos.center().iter().any(|&c| c != 0.0));
        assert_eq!(cos.centroids(), l2.centroids());
        let codes = cos.encode_all(MatrixView::new(&data, n, dim).unwrap());
        let q = &data[7 * dim..8 * dim];
        let (mut tc, mut tl) = (vec![0.0; 6 * 256], vec![0.0; 6 * 256]);
        cos.lookup_table(q, Metric::Cosine, &mut tc);
        l2.lookup_table(q, Metric::L2, &mut tl);
        let mut err = 0f64;
        for (i, code) in codes.chunks_exact(6).enumerate() {
            let (c, l) = (adc(&tc, code), adc(&tl, code));
            assert!((c - 0.5 * l).abs() <= 1e-4 * l.max(1.0), "{c} vs {l}");
            let exact = 1.0 - dot_f32(q, &data[i * dim..(i + 1) * dim]);
            err += (c - exact).abs() as f64;
        }
        // The estimate is on the exact distance's scale (cosine distances
        // span 0..2 here).
        assert!(err / (n as f64) < 0.1, "mean error {}", err / n as f64);
    }

    #[test]
    fn encode_all_converts_element_types() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let (n, dim) = (700, 8);
        let raw: Vec<u8> = (0..n * dim).map(|_| rng.random()).collect();
        let f: Vec<f32> = raw.iter().map(|&x| x as f32).collect();
        let pq = PqCodebook::train(&f, dim, 4, Metric::L2, 2).unwrap();
        let a = pq.encode_all(MatrixView::new(&raw, n, dim).unwrap());
        let b = pq.encode_all(MatrixView::new(&f, n, dim).unwrap());
        assert_eq!(a, b);
        let mut code = [0u8; 4];
        pq.encode(&f[5 * dim..6 * dim], &mut code);
        assert_eq!(&code[..], &a[5 * 4..6 * 4]);
    }

    #[test]
    fn tiny_sample_still_has_256_centroids() {
        let data = clustered(10, 6, 10, 1.0, 6);
        let pq = PqCodebook::train(&data, 6, 3, Metric::L2, 0).unwrap();
        assert_eq!(pq.centroids().len(), 256 * 6);
        let codes = pq.encode_all(MatrixView::new(&data, 10, 6).unwrap());
        let rec = decode_all(&pq, &codes);
        for (a, b) in data.iter().zip(&rec) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    #[test]
    fn training_is_deterministic_across_thread_counts() {
        let data = clustered(2500, 16, 50, 2.0, 8);
        let train = |t: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap()
                .install(|| PqCodebook::train(&data, 16, 4, Metric::L2, 99).unwrap())
        };
        let (a, b) = (train(1), train(3));
        assert_eq!(a, b);
    }

    #[test]
    fn bad_training_arguments() {
        let data = clustered(300, 8, 5, 1.0, 11);
        assert!(PqCodebook::train(&data, 8, 0, Metric::L2, 0).is_err());
        assert!(PqCodebook::train(&data, 8, 9, Metric::L2, 0).is_err());
        assert!(PqCodebook::train(&data, 0, 1, Metric::L2, 0).is_err());
        assert!(PqCodebook::train(&data[..13], 8, 2, Metric::L2, 0).is_err());
        assert!(PqCodebook::train(&[], 8, 2, Metric::L2, 0).is_err());
        let mut bad = data.clone();
        bad[17] = f32::NAN;
        assert!(PqCodebook::train(&bad, 8, 2, Metric::InnerProduct, 0).is_err());
    }

    #[test]
    #[ignore]
    fn pq_speed() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let dim = 128;
        let data = clustered(1 << 20, dim, 1000, 6.0, 12);
        let sample = &data[..(256 << 10) * dim];
        let cpu = || {
            // SAFETY: getrusage only writes the struct it is given.
            let mut u: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: `u` is a valid, writable rusage.
            unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
            let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
            tv(u.ru_utime) + tv(u.ru_stime)
        };
        let (t, c) = (std::time::Instant::now(), cpu());
        let pq = pool.install(|| PqCodebook::train(sample, dim, 32, Metric::L2, 1).unwrap());
        println!(
            "train 256k x 128, m = 32: {:.2?} wall, {:.2}s cpu",
            t.elapsed(),
            cpu() - c
        );
        let (t, c) = (std::time::Instant::now(), cpu());
        let codes = pool.install(|| pq.encode_all(MatrixView::new(&data, 1 << 20, dim).unwrap()));
        println!(
            "encode 1M x 128: {:.2?} wall, {:.2}s cpu",
            t.elapsed(),
            cpu() - c
        );
        let rec = decode_all(&pq, &codes[..10000 * 32]);
        let err: f64 = data
            .iter()
            .zip(&rec)
            .map(|(a, b)| ((a - b) * (a - b)) as f64)
            .sum::<f64>()
            / 10000.0;
        println!("mean squared reconstruction error {err:.3}");
    }
}
