//! Product quantization: codebook training, encoding, per-query lookup tables
//! and asymmetric distance computation (ADC).

use crate::data::dtype::Element;
use crate::data::matrix::MatrixView;
use crate::distance::Metric;
use crate::{Error, Result};
use std::path::Path;

/// Codewords per chunk (one byte per chunk code).
pub const PQ_CENTROIDS: usize = 256;

/// A trained product quantizer: `m` chunks over contiguous dimension ranges,
/// 256 centroids each.
#[derive(Debug, Clone, PartialEq)]
pub struct PqCodebook {
    dim: usize,
    m: usize,
    /// `m + 1` chunk boundaries over `0..dim`.
    chunk_offsets: Vec<u32>,
    /// For chunk j: 256 rows of `chunk_dim(j)` floats, chunks one after another.
    centroids: Vec<f32>,
    /// Subtracted before encoding (the data mean for L2, zeros otherwise).
    center: Vec<f32>,
}

impl PqCodebook {
    /// Trains on the row-major float `sample` (`n × dim`) with `m` chunks.
    /// L2 centres the data on its mean; inner product and cosine do not.
    /// Runs on the caller's current rayon pool; deterministic for a seed.
    pub fn train(sample: &[f32], dim: usize, m: usize, metric: Metric, seed: u64) -> Result<Self> {
        let _ = (sample, dim, m, metric, seed);
        Err(Error::arg("PqCodebook::train: not implemented yet"))
    }
    /// Vector dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// Number of chunks = bytes per code.
    pub fn m(&self) -> usize {
        self.m
    }
    /// Encodes one vector into `code` (`m` bytes).
    pub fn encode(&self, v: &[f32], code: &mut [u8]) {
        let _ = (v, code);
    }
    /// Encodes every row of `data` (converted to f32; cosine data must
    /// already be normalised) into a row-major `n × m` code array, in parallel
    /// on the caller's current rayon pool.
    pub fn encode_all<T: Element>(&self, data: MatrixView<'_, T>) -> Vec<u8> {
        let _ = data;
        Vec::new()
    }
    /// Fills `table` (`m × 256`) so that [`adc`] of a code approximates the
    /// internal distance (squared L2; `-dot` for inner product and cosine)
    /// between `q` and the encoded vector.
    pub fn lookup_table(&self, q: &[f32], metric: Metric, table: &mut [f32]) {
        let _ = (q, metric, table);
    }
    /// Serialises the codebook (little-endian, self-describing header).
    pub fn to_bytes(&self) -> Vec<u8> {
        Vec::new()
    }
    /// Parses [`Self::to_bytes`] output; `path` is named in errors.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Self> {
        let _ = bytes;
        Err(Error::format(
            path,
            "PqCodebook::from_bytes: not implemented yet",
        ))
    }
}

/// Asymmetric distance of one code: `sum_j table[j*256 + code[j]]`.
#[inline]
pub fn adc(table: &[f32], code: &[u8]) -> f32 {
    code.iter()
        .enumerate()
        .map(|(j, &c)| table[j * PQ_CENTROIDS + c as usize])
        .sum()
}
