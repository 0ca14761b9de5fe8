//! Neighbour scorers: the cheap distance estimate that routes the search.
//!
//! When a record is expanded, each neighbour u gets an estimated distance
//! that decides its place in the candidate list. DiskANN, Starling, Gorgeous
//! and PipeANN estimate it from PQ codes held in RAM ([`PqScorer`]);
//! AlayaLaser and AiSAQ keep the neighbours' codes inside the record (a
//! later scorer behind the same trait). The executor is generic over the
//! scorer, so each one gets its own monomorphic search loop.

use crate::distance::Metric;
use crate::quant::pq::{adc, PqCodebook, PQ_CENTROIDS};
use crate::util::HugeBytes;

/// A distance estimate for graph neighbours, prepared once per query.
///
/// The per-query state is a float scratch buffer owned by the query's slot
/// in a worker (a PQ lookup table; later a rotated query for RaBitQ or a
/// table for codes stored in the record), so preparing a query allocates
/// nothing once the slot has served a query.
pub trait Scorer: Send + Sync {
    /// Prepares `state` for the query `q` (already normalised for cosine).
    fn prepare(&self, q: &[f32], state: &mut Vec<f32>);

    /// Estimated distance of node `u` to the prepared query.
    fn score(&self, state: &[f32], u: u32) -> f32;

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

/// The scorers an index can use; matched once per batch.
pub enum AnyScorer {
    Pq(PqScorer),
}
