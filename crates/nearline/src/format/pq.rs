//! The PQ codebook section (`pq_codebook.bin`), little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `NLPQ` |
//! | 4..8 | version (1) |
//! | 8..12 | dim |
//! | 12..16 | m: chunks = bytes per code |
//! | | (m + 1) × u32: chunk offsets, increasing from 0 to dim |
//! | | dim × f32: the centre subtracted before encoding |
//! | | 256 × dim × f32: centroids, chunk after chunk |
//!
//! The codes section (`pq_codes.bin`) is `n × m` bytes, row-major.

use crate::quant::pq::{PqCodebook, PQ_CENTROIDS};
use crate::{Error, Result};
use std::path::Path;

/// Magic bytes opening a serialised codebook.
pub const PQ_MAGIC: [u8; 4] = *b"NLPQ";

/// Version written by [`encode`].
pub const PQ_FORMAT_VERSION: u32 = 1;

/// Serialises a codebook (little-endian, self-describing header).
pub fn encode(cb: &PqCodebook) -> Vec<u8> {
    let mut b = Vec::with_capacity(
        16 + 4 * (cb.chunk_offsets().len() + cb.center().len() + cb.centroids().len()),
    );
    b.extend_from_slice(&PQ_MAGIC);
    b.extend_from_slice(&PQ_FORMAT_VERSION.to_le_bytes());
    b.extend_from_slice(&(cb.dim() as u32).to_le_bytes());
    b.extend_from_slice(&(cb.m() as u32).to_le_bytes());
    for &o in cb.chunk_offsets() {
        b.extend_from_slice(&o.to_le_bytes());
    }
    for &v in cb.center().iter().chain(&cb.centroids()) {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b
}

/// Parses [`encode`] output; `path` is named in errors.
pub fn decode(path: &Path, bytes: &[u8]) -> Result<PqCodebook> {
    let fmt = |msg: String| Error::format(path, format!("PQ codebook: {msg}"));
    if bytes.len() < 16 {
        return Err(fmt(format!(
            "{} bytes, shorter than the 16-byte header",
            bytes.len()
        )));
    }
    if bytes[0..4] != PQ_MAGIC {
        return Err(fmt(format!(
            "magic is {:?}, expected {:?}",
            &bytes[0..4],
            PQ_MAGIC
        )));
    }
    let word = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    let version = word(4);
    if version != PQ_FORMAT_VERSION {
        return Err(Error::Version {
            path: path.to_path_buf(),
            msg: format!(
                "PQ codebook format version {version}, this build reads version {PQ_FORMAT_VERSION}"
            ),
        });
    }
    let dim = word(8) as usize;
    let m = word(12) as usize;
    if dim == 0 {
        return Err(fmt("dim is 0, expected at least 1".into()));
    }
    if m == 0 || m > dim {
        return Err(fmt(format!("m = {m}, expected 1 <= m <= dim = {dim}")));
    }
    let expect = (m + 1)
        .checked_add(dim)
        .and_then(|w| w.checked_add(dim.checked_mul(PQ_CENTROIDS)?))
        .and_then(|w| w.checked_mul(4))
        .and_then(|w| w.checked_add(16))
        .ok_or_else(|| fmt(format!("dim = {dim} is too large")))?;
    if bytes.len() != expect {
        return Err(fmt(format!(
            "{} bytes, expected {expect} for dim = {dim}, m = {m}",
            bytes.len()
        )));
    }
    let mut at = 16;
    let mut offsets = Vec::with_capacity(m + 1);
    for _ in 0..=m {
        offsets.push(word(at));
        at += 4;
    }
    if offsets[0] != 0 || offsets[m] as usize != dim {
        return Err(fmt(format!(
            "chunk offsets run from {} to {}, expected 0 to dim = {dim}",
            offsets[0], offsets[m]
        )));
    }
    if let Some(j) = offsets.windows(2).position(|w| w[1] <= w[0]) {
        return Err(fmt(format!(
            "chunk offsets[{}] = {} is not greater than offsets[{j}] = {}: chunks must be non-empty and increasing",
            j + 1,
            offsets[j + 1],
            offsets[j]
        )));
    }
    let mut floats = |count: usize, field: &str| -> Result<Vec<f32>> {
        let mut v = Vec::with_capacity(count);
        for i in 0..count {
            let x = f32::from_bits(word(at));
            at += 4;
            if !x.is_finite() {
                return Err(fmt(format!(
                    "{field}[{i}] is {x}, expected a finite number"
                )));
            }
            v.push(x);
        }
        Ok(v)
    };
    let center = floats(dim, "center")?;
    let centroids = floats(PQ_CENTROIDS * dim, "centroids")?;
    PqCodebook::from_parts(dim, m, offsets, centroids, center).map_err(fmt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distance::Metric;

    fn clustered(n: usize, dim: usize, seed: u64) -> Vec<f32> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n * dim)
            .map(|i| (i % 7) as f32 + rng.random_range(-0.5f32..0.5))
            .collect()
    }

    #[test]
    fn serialization_round_trip_and_corruption() {
        let data = clustered(500, 9, 10);
        let pq = PqCodebook::train(&data, 9, 4, Metric::L2, 4).unwrap();
        let bytes = encode(&pq);
        assert_eq!(&bytes[..4], b"NLPQ");
        let p = Path::new("pq.bin");
        let back = decode(p, &bytes).unwrap();
        assert_eq!(back, pq);

        let is_format = |r: Result<PqCodebook>| matches!(r, Err(Error::Format { .. }));
        for len in [0, 3, 15, 16, 20, bytes.len() - 1] {
            assert!(is_format(decode(p, &bytes[..len])), "len {len}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(is_format(decode(p, &longer)));
        let patch = |at: usize, v: &[u8]| {
            let mut b = bytes.clone();
            b[at..at + v.len()].copy_from_slice(v);
            b
        };
        assert!(is_format(decode(p, &patch(0, b"XLPQ"))));
        assert!(matches!(
            decode(p, &patch(4, &2u32.to_le_bytes())),
            Err(Error::Version { .. })
        ));
        assert!(is_format(decode(p, &patch(8, &0u32.to_le_bytes()))));
        assert!(is_format(decode(p, &patch(12, &0u32.to_le_bytes()))));
        assert!(is_format(decode(p, &patch(12, &10u32.to_le_bytes()))));
        assert!(is_format(decode(p, &patch(8, &u32::MAX.to_le_bytes()))));
        // Offsets: [0, 3, 5, 7, 9]; make one chunk empty, then move the end.
        assert!(is_format(decode(p, &patch(20, &0u32.to_le_bytes()))));
        assert!(is_format(decode(p, &patch(32, &8u32.to_le_bytes()))));
        // Non-finite center and centroid values name the field.
        let center_at = 16 + 4 * 5;
        let e = decode(p, &patch(center_at + 4, &f32::NAN.to_le_bytes()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("center[1]") && e.contains("pq.bin"), "{e}");
        let e = decode(p, &patch(bytes.len() - 4, &f32::INFINITY.to_le_bytes()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("centroids[2303]"), "{e}");
    }
}
