//! Sections of the quantizers that live in records (AlayaLaser): the PCA
//! basis, the random rotation and the RaBitQ quantizer. Little-endian; a
//! 4-byte magic and a version, then u32 sizes and f32 arrays.

use super::section::{SectionReader, SectionWriter};
use crate::quant::pca::{
    Pca, Rotation, PCA_MAGIC, PCA_MAX_DIM, PCA_VERSION, ROTATION_MAGIC, ROTATION_VERSION,
};
use crate::quant::rabitq::{RaBitQ, RABITQ_MAGIC, RABITQ_VERSION};
use crate::Result;
use std::path::Path;

/// The section bytes of a PCA: magic `NLPC`, version, dim, principal dims,
/// then mean, variances and the row-major basis (f32).
pub fn encode_pca(p: &Pca) -> Vec<u8> {
    let mut w = SectionWriter::new(PCA_MAGIC, PCA_VERSION);
    w.u32(p.dim() as u32);
    w.u32(p.principal() as u32);
    w.elems(p.mean());
    w.elems(p.variances());
    w.elems(p.basis());
    w.bytes
}

/// Parses [`encode_pca`] output with every [`Pca::from_parts`] check;
/// `path` is named in errors.
pub fn decode_pca(path: &Path, bytes: &[u8]) -> Result<Pca> {
    let (mut r, _) = SectionReader::open(path, "PCA", bytes, PCA_MAGIC, PCA_VERSION)?;
    let dim = r.u32("dim")? as usize;
    let principal = r.u32("principal")? as usize;
    if dim == 0 || dim > PCA_MAX_DIM {
        return Err(r.err(format!("dim is {dim}, expected 1..={PCA_MAX_DIM}")));
    }
    r.expect_len(Some(16 + 4 * (2 * dim + dim * dim)))?;
    let mean = r.elems::<f32>(dim, "mean")?;
    let variances = r.elems::<f32>(dim, "variances")?;
    let basis = r.elems::<f32>(dim * dim, "basis")?;
    r.finish()?;
    Pca::from_parts(dim, principal, mean, basis, variances).map_err(|e| r.err(e.to_string()))
}

/// The section bytes of a rotation: magic `NLRT`, version, dim, then the
/// row-major matrix (f32).
pub fn encode_rotation(r: &Rotation) -> Vec<u8> {
    let mut w = SectionWriter::new(ROTATION_MAGIC, ROTATION_VERSION);
    w.u32(r.dim() as u32);
    w.elems(r.matrix());
    w.bytes
}

/// Parses [`encode_rotation`] output with every [`Rotation::from_parts`]
/// check; `path` is named in errors.
pub fn decode_rotation(path: &Path, bytes: &[u8]) -> Result<Rotation> {
    let (mut r, _) =
        SectionReader::open(path, "rotation", bytes, ROTATION_MAGIC, ROTATION_VERSION)?;
    let dim = r.u32("dim")? as usize;
    if dim == 0 || dim > PCA_MAX_DIM {
        return Err(r.err(format!("dim is {dim}, expected 1..={PCA_MAX_DIM}")));
    }
    r.expect_len(Some(12 + 4 * dim * dim))?;
    let matrix = r.elems::<f32>(dim * dim, "matrix")?;
    r.finish()?;
    Rotation::from_parts(dim, matrix).map_err(|e| r.err(e.to_string()))
}

/// The section bytes of a RaBitQ quantizer: magic `NLRQ`, version, dim,
/// bits per dimension (1), then its rotation's row-major matrix (f32).
pub fn encode_rabitq(q: &RaBitQ) -> Vec<u8> {
    let mut w = SectionWriter::new(RABITQ_MAGIC, RABITQ_VERSION);
    w.u32(q.dim() as u32);
    w.u32(1);
    w.elems(q.rotation().matrix());
    w.bytes
}

/// Parses [`encode_rabitq`] output (checking the rotation); `path` is
/// named in errors.
pub fn decode_rabitq(path: &Path, bytes: &[u8]) -> Result<RaBitQ> {
    let (mut r, _) = SectionReader::open(path, "RaBitQ", bytes, RABITQ_MAGIC, RABITQ_VERSION)?;
    let dim = r.u32("dim")? as usize;
    let bits = r.u32("bits")?;
    if !(2..=PCA_MAX_DIM).contains(&dim) {
        return Err(r.err(format!("dim is {dim}, expected 2..={PCA_MAX_DIM}")));
    }
    if bits != 1 {
        return Err(r.err(format!("{bits} bits per dimension, this build reads 1")));
    }
    r.expect_len(Some(16 + 4 * dim * dim))?;
    let matrix = r.elems::<f32>(dim * dim, "rotation")?;
    r.finish()?;
    Rotation::from_parts(dim, matrix)
        .and_then(RaBitQ::from_parts)
        .map_err(|e| r.err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    /// Rows scaled per dimension (a known PCA).
    fn anisotropic(n: usize, scales: &[f32], seed: u64) -> Vec<f32> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .flat_map(|_| {
                scales
                    .iter()
                    .map(|s| s * rng.random_range(-1.0f32..1.0))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn pca_and_rotation_round_trip_and_damage() {
        let scales: Vec<f32> = (0..10).map(|i| 1.0 + i as f32).collect();
        let data = anisotropic(500, &scales, 3);
        let pca = Pca::fit(&data, 10, 4).unwrap();
        let (d, p, mean, basis, var) = pca.clone().into_parts();
        let back = Pca::from_parts(d, p, mean, basis, var).unwrap();
        assert_eq!(back, pca);
        let path = Path::new("pca.bin");
        let bytes = encode_pca(&pca);
        assert_eq!(&bytes[..4], PCA_MAGIC);
        assert_eq!(decode_pca(path, &bytes).unwrap(), pca);
        assert_eq!(pca.clone().with_principal(10).unwrap().principal(), 10);
        assert!(pca.clone().with_principal(0).is_err());
        assert!(pca.clone().with_principal(11).is_err());

        let rot = Rotation::random(9, 5).unwrap();
        let (d, m) = rot.clone().into_parts();
        assert_eq!(Rotation::from_parts(d, m).unwrap(), rot);
        let rb = encode_rotation(&rot);
        assert_eq!(decode_rotation(path, &rb).unwrap(), rot);

        // Damaged sections: truncated, longer, bad magic, NaN, non-orthonormal.
        for len in [0, 4, 8, 11, 12, bytes.len() - 1] {
            assert!(decode_pca(path, &bytes[..len]).is_err(), "len {len}");
        }
        assert!(decode_pca(path, &[bytes.clone(), vec![0]].concat()).is_err());
        assert!(decode_rotation(path, &rb[..rb.len() - 4]).is_err());
        assert!(decode_rotation(path, &bytes).is_err());
        let patch = |b: &[u8], at: usize, v: f32| {
            let mut b = b.to_vec();
            b[at..at + 4].copy_from_slice(&v.to_le_bytes());
            b
        };
        let e = decode_pca(path, &patch(&bytes, 16 + 4, f32::NAN)).unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("mean[1]"), "{e}");
        let e = decode_rotation(path, &patch(&rb, 12 + 4 * 20, 0.9)).unwrap_err();
        assert!(e.to_string().contains("orthonormal"), "{e}");
        let mut big = rb.clone();
        big[8..12].copy_from_slice(&(PCA_MAX_DIM as u32 + 1).to_le_bytes());
        assert!(decode_rotation(path, &big).is_err());
    }

    #[test]
    fn rabitq_round_trip_and_damage() {
        let q = RaBitQ::new(24, 9).unwrap();
        let back = RaBitQ::from_parts(q.clone().into_parts()).unwrap();
        assert_eq!(back, q);
        let path = Path::new("rabitq.bin");
        let bytes = encode_rabitq(&q);
        assert_eq!(&bytes[..4], RABITQ_MAGIC);
        assert_eq!(decode_rabitq(path, &bytes).unwrap(), q);
        for len in [0, 8, 12, 16, bytes.len() - 1] {
            assert!(decode_rabitq(path, &bytes[..len]).is_err());
        }
        let patch = |at: usize, v: &[u8]| {
            let mut b = bytes.clone();
            b[at..at + v.len()].copy_from_slice(v);
            b
        };
        assert!(decode_rabitq(path, &patch(12, &2u32.to_le_bytes())).is_err());
        assert!(decode_rabitq(path, &patch(8, &1u32.to_le_bytes())).is_err());
        let e = decode_rabitq(path, &patch(20, &f32::NAN.to_le_bytes())).unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        assert!(decode_rabitq(path, &patch(20, &3f32.to_le_bytes())).is_err());
    }
}
