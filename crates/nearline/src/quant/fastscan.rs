//! FastScan: scores 32 codes of 4-bit sub-codes at once with register
//! shuffles (`vpshufb`) into per-query 16-entry u8 lookup tables, as in
//! Faiss's PQ4 FastScan and RaBitQ's batch estimator.
//!
//! A code is `n_groups` 4-bit sub-codes. For 1-bit RaBitQ codes of `D`
//! dimensions a sub-code is 4 consecutive bits (`n_groups = ceil(D / 4)`),
//! for 4-bit PQ it is the centroid index of one sub-space. Codes given to
//! [`pack`] are rows of `ceil(n_groups / 2)` bytes: sub-code `g` is the low
//! nibble of byte `g / 2` for even `g`, the high nibble for odd `g`; bit-packed
//! codes (bit `i` in byte `i / 8`, least significant bit first) are therefore
//! already in this form, dimension `4g + k` being bit `k` of sub-code `g`.
//!
//! # Packed layout
//!
//! Codes are packed in blocks of [`FASTSCAN_BLOCK`] = 32 vectors (the last
//! block padded with zero codes). A block is `n_groups × 16` bytes; the 16
//! bytes of group `g` are
//!
//! ```text
//! byte j (0 ≤ j < 16) = code_g(vector j) | code_g(vector j + 16) << 4
//! ```
//!
//! so one 128-bit lane holds one group's sub-codes of all 32 vectors. Groups
//! follow each other, so an AVX2 register covers groups `g, g+1` and an
//! AVX-512 register `g..g+4`, matching the lookup tables, which are
//! `n_groups × 16` bytes, table `g` at `16g..16g + 16`.
//!
//! # Kernel
//!
//! Per register: `lo = bytes & 0xf`, `hi = bytes >> 4 & 0xf`, then
//! `shuffle_epi8(lut, lo)` gives the table entries of vectors 0..16 and
//! `shuffle_epi8(lut, hi)` those of vectors 16..32, one u8 per vector and lane.
//! They are summed as u16 with Faiss's trick: adding the register as u16
//! lanes accumulates `even + 256·odd` (mod 2¹⁶), and a second accumulator
//! adds `u16 >> 8` (the odd bytes); `even = acc − (odd << 8)`. Each lane adds
//! at most 255 per step, so the u16 sums are flushed into u32 totals every
//! [`FLUSH_STEPS`] steps and any table contents and any number of groups give
//! exact sums. The result is, for every vector `v` of the block,
//!
//! ```text
//! out[v] = Σ_g luts[16g + code_g(v)]        (u32, exact)
//! ```
//!
//! identical on every path (AVX-512BW, AVX2, portable scalar).
//!
//! # Tables
//!
//! [`build_luts`] makes exact tables from an integer query (entry `c` of group
//! `g` = sum of the query values at the set bits of `c`); [`subset_sum_luts`]
//! the same from a float query, and [`quantize_luts`] turns any float tables
//! (RaBitQ subset sums, PQ distances) into u8 tables with one scale shared by
//! all groups and a per-group offset, so `Σ_g float_lut = delta·sum + bias`
//! within `max_error`.

use crate::kernels::{selected_level, SimdLevel};
use crate::{Error, Result};

/// Vectors scored together: one block of the packed layout.
pub const FASTSCAN_BLOCK: usize = 32;

/// Entries of one lookup table (one per 4-bit sub-code value).
pub const LUT_ENTRIES: usize = 16;

/// Bytes of one group in a packed block (32 nibbles).
const GROUP_BYTES: usize = 16;

/// Register steps between flushes of the u16 accumulators: each lane adds at
/// most 255 per step, and `255 × 256 < 2¹⁶`.
pub const FLUSH_STEPS: usize = 256;

/// `n` rounded up to a multiple of [`FASTSCAN_BLOCK`] (saturating at
/// `usize::MAX` for absurd `n`).
pub fn padded_count(n: usize) -> usize {
    n.div_ceil(FASTSCAN_BLOCK).saturating_mul(FASTSCAN_BLOCK)
}

/// Bytes of one code row as [`pack`] reads it: `ceil(n_groups / 2)`.
pub fn code_bytes(n_groups: usize) -> usize {
    n_groups.div_ceil(2)
}

/// Bytes of `n` packed codes of `n_groups` sub-codes (`n` padded to 32):
/// `16 · n_groups` per block of 32.
pub fn packed_len(n: usize, n_groups: usize) -> Result<usize> {
    n.div_ceil(FASTSCAN_BLOCK)
        .checked_mul(n_groups)
        .and_then(|x| x.checked_mul(GROUP_BYTES))
        .ok_or_else(|| {
            Error::arg(format!(
                "FastScan: {n} codes of {n_groups} groups overflow the address space"
            ))
        })
}

fn check_groups(n_groups: usize, what: &str) -> Result<()> {
    if n_groups == 0 {
        return Err(Error::arg(format!(
            "FastScan {what}: n_groups must be at least 1"
        )));
    }
    Ok(())
}

/// Packs `n` codes (rows of [`code_bytes`]`(n_groups)` bytes, see the module
/// documentation) into the blocked layout; `n` is padded to a multiple of 32
/// with zero codes.
pub fn pack(codes: &[u8], n: usize, n_groups: usize) -> Result<Vec<u8>> {
    let mut out = vec![0u8; packed_len(n, n_groups)?];
    pack_into(codes, n, n_groups, &mut out)?;
    Ok(out)
}

/// [`pack`] into a caller buffer of exactly [`packed_len`]`(n, n_groups)`
/// bytes (for example a slice of an on-disk record).
pub fn pack_into(codes: &[u8], n: usize, n_groups: usize, out: &mut [u8]) -> Result<()> {
    check_groups(n_groups, "pack")?;
    let cb = code_bytes(n_groups);
    let want = n.checked_mul(cb).ok_or_else(|| {
        Error::arg(format!(
            "FastScan pack: {n} codes of {cb} bytes overflow the address space"
        ))
    })?;
    if codes.len() != want {
        return Err(Error::arg(format!(
            "FastScan pack: {} code bytes, expected n × ceil(n_groups / 2) = {n} × {cb} = {want}",
            codes.len()
        )));
    }
    let len = packed_len(n, n_groups)?;
    if out.len() != len {
        return Err(Error::arg(format!(
            "FastScan pack: output has {} bytes, expected {len} for {n} codes of {n_groups} groups",
            out.len()
        )));
    }
    out.fill(0);
    let block_bytes = n_groups * GROUP_BYTES;
    for (v, code) in codes.chunks_exact(cb).enumerate() {
        let block = &mut out[(v / FASTSCAN_BLOCK) * block_bytes..][..block_bytes];
        let lane = v % FASTSCAN_BLOCK;
        let (j, shift) = (lane % 16, 4 * (lane / 16));
        for g in 0..n_groups {
            let nib = (code[g / 2] >> (4 * (g % 2))) & 0x0f;
            block[g * GROUP_BYTES + j] |= nib << shift;
        }
    }
    Ok(())
}

/// Sub-code `g` of vector `v` in a packed array (the inverse of [`pack`]).
pub fn nibble(packed: &[u8], n_groups: usize, v: usize, g: usize) -> Result<u8> {
    check_groups(n_groups, "nibble")?;
    if g >= n_groups {
        return Err(Error::arg(format!(
            "FastScan nibble: group {g} out of range (n_groups = {n_groups})"
        )));
    }
    let block_bytes = n_groups * GROUP_BYTES;
    let lane = v % FASTSCAN_BLOCK;
    let at = (v / FASTSCAN_BLOCK)
        .checked_mul(block_bytes)
        .and_then(|b| b.checked_add(g * GROUP_BYTES + lane % 16))
        .filter(|&at| at < packed.len())
        .ok_or_else(|| {
            Error::arg(format!(
                "FastScan nibble: vector {v} is beyond the {} packed bytes",
                packed.len()
            ))
        })?;
    Ok((packed[at] >> (4 * (lane / 16))) & 0x0f)
}

/// Exact tables for an integer query: entry `c` of group `g` is the sum of
/// `q[4g + k]` over the set bits `k` of `c` (missing dimensions of the last
/// group count as 0). Fails when a sum exceeds 255 (keep each value ≤ 63).
pub fn build_luts(q: &[u8]) -> Result<Vec<u8>> {
    if q.is_empty() {
        return Err(Error::arg("FastScan build_luts: the query is empty"));
    }
    let n_groups = q.len().div_ceil(4);
    let mut luts = vec![0u8; n_groups * LUT_ENTRIES];
    for (g, lut) in luts.chunks_exact_mut(LUT_ENTRIES).enumerate() {
        let vals: [u32; 4] = std::array::from_fn(|k| q.get(4 * g + k).map_or(0, |&x| x as u32));
        for (c, e) in lut.iter_mut().enumerate() {
            let s: u32 = (0..4).filter(|k| c >> k & 1 == 1).map(|k| vals[k]).sum();
            *e = u8::try_from(s).map_err(|_| {
                Error::arg(format!(
                    "FastScan build_luts: group {g} sums to {s} > 255 (query values {vals:?}); keep each value ≤ 63"
                ))
            })?;
        }
    }
    Ok(luts)
}

/// Float tables for a float query: entry `c` of group `g` is the sum of
/// `q[4g + k]` over the set bits `k` of `c` (the inner product of the query
/// with the 4 bits; missing dimensions of the last group count as 0).
pub fn subset_sum_luts(q: &[f32]) -> Result<Vec<f32>> {
    if q.is_empty() {
        return Err(Error::arg("FastScan subset_sum_luts: the query is empty"));
    }
    if let Some(i) = q.iter().position(|x| !x.is_finite()) {
        return Err(Error::arg(format!(
            "FastScan subset_sum_luts: query value {i} is {} (expected a finite number)",
            q[i]
        )));
    }
    let n_groups = q.len().div_ceil(4);
    let mut luts = vec![0f32; n_groups * LUT_ENTRIES];
    for (g, lut) in luts.chunks_exact_mut(LUT_ENTRIES).enumerate() {
        let vals: [f32; 4] = std::array::from_fn(|k| q.get(4 * g + k).copied().unwrap_or(0.0));
        lut[0] = 0.0;
        // Entry c = entry (c without its highest bit) + that bit's value.
        for c in 1..LUT_ENTRIES {
            let top = usize::BITS - 1 - c.leading_zeros();
            lut[c] = lut[c ^ (1 << top)] + vals[top as usize];
        }
    }
    Ok(luts)
}

/// u8 tables standing for float tables: `float_lut[16g + c] ≈ delta ·
/// luts[16g + c] + min_g`, with `delta` shared by all groups (the largest
/// group range / 255) and `min_g` the group's smallest entry. For any code,
/// `Σ_g float_lut[16g + code_g] = delta · sum + bias` with `bias = Σ_g min_g`,
/// within `max_error = n_groups · delta / 2` (round to nearest) plus float
/// rounding.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedLuts {
    luts: Vec<u8>,
    delta: f32,
    bias: f32,
    max_error: f32,
}

impl QuantizedLuts {
    /// The u8 tables, `n_groups × 16` bytes.
    pub fn luts(&self) -> &[u8] {
        &self.luts
    }
    /// Number of groups (tables).
    pub fn n_groups(&self) -> usize {
        self.luts.len() / LUT_ENTRIES
    }
    /// Float value of one u8 step.
    pub fn delta(&self) -> f32 {
        self.delta
    }
    /// Sum of the per-group offsets.
    pub fn bias(&self) -> f32 {
        self.bias
    }
    /// Largest error of `delta · sum + bias` against the float table sum.
    pub fn max_error(&self) -> f32 {
        self.max_error
    }
    /// The float value a FastScan sum stands for: `delta · sum + bias`.
    #[inline]
    pub fn value(&self, sum: u32) -> f32 {
        self.delta * sum as f32 + self.bias
    }
}

/// Quantizes float tables (`n_groups × 16` entries) to u8, see
/// [`QuantizedLuts`]. Computed in f64; all-equal tables give `delta = 0`.
pub fn quantize_luts(float_luts: &[f32]) -> Result<QuantizedLuts> {
    if float_luts.is_empty() || !float_luts.len().is_multiple_of(LUT_ENTRIES) {
        return Err(Error::arg(format!(
            "FastScan quantize_luts: {} entries, expected a positive multiple of 16",
            float_luts.len()
        )));
    }
    if let Some(i) = float_luts.iter().position(|x| !x.is_finite()) {
        return Err(Error::arg(format!(
            "FastScan quantize_luts: entry {i} is {} (expected a finite number)",
            float_luts[i]
        )));
    }
    let n_groups = float_luts.len() / LUT_ENTRIES;
    let mut mins = Vec::with_capacity(n_groups);
    let mut range = 0f64;
    for lut in float_luts.chunks_exact(LUT_ENTRIES) {
        let lo = lut.iter().fold(f64::INFINITY, |a, &x| a.min(x as f64));
        let hi = lut.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x as f64));
        mins.push(lo);
        range = range.max(hi - lo);
    }
    let delta = range / 255.0;
    let inv = if delta > 0.0 { 1.0 / delta } else { 0.0 };
    let mut luts = vec![0u8; float_luts.len()];
    for ((out, lut), &lo) in luts
        .chunks_exact_mut(LUT_ENTRIES)
        .zip(float_luts.chunks_exact(LUT_ENTRIES))
        .zip(&mins)
    {
        for (o, &x) in out.iter_mut().zip(lut) {
            *o = ((x as f64 - lo) * inv).round().clamp(0.0, 255.0) as u8;
        }
    }
    let bias: f64 = mins.iter().sum();
    Ok(QuantizedLuts {
        luts,
        delta: delta as f32,
        bias: bias as f32,
        max_error: (n_groups as f64 * delta / 2.0) as f32,
    })
}

/// A FastScan implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScanPath {
    /// Portable code (also the test oracle).
    Scalar,
    /// AVX2 `vpshufb` on 256-bit registers (two groups per step).
    Avx2,
    /// AVX-512BW `vpshufb` on 512-bit registers (four groups per step).
    Avx512,
}

impl ScanPath {
    /// Every path, slowest first.
    pub const ALL: [ScanPath; 3] = [ScanPath::Scalar, ScanPath::Avx2, ScanPath::Avx512];

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            ScanPath::Scalar => "scalar",
            ScanPath::Avx2 => "avx2",
            ScanPath::Avx512 => "avx512bw",
        }
    }

    /// Whether this CPU can run the path.
    pub fn is_supported(self) -> bool {
        match self {
            ScanPath::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            ScanPath::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            ScanPath::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The path [`scan`] uses: the crate's SIMD level (detected once, capped
    /// by `NEARLINE_SIMD`) mapped to AVX-512BW, AVX2 or scalar.
    #[inline]
    pub fn selected() -> ScanPath {
        let p = match selected_level() {
            SimdLevel::Avx512 | SimdLevel::Avx512Vnni => ScanPath::Avx512,
            SimdLevel::Avx2 => ScanPath::Avx2,
            SimdLevel::Scalar => ScanPath::Scalar,
        };
        // The crate level implies these features; the check is cheap (cached).
        if p.is_supported() {
            p
        } else {
            ScanPath::Scalar
        }
    }
}

/// Number of blocks in `packed`, after checking every length.
fn check_scan(packed: &[u8], n_groups: usize, luts: &[u8], out: &[u32]) -> Result<usize> {
    check_groups(n_groups, "scan")?;
    let block_bytes = n_groups
        .checked_mul(GROUP_BYTES)
        .ok_or_else(|| Error::arg(format!("FastScan scan: n_groups = {n_groups} is too large")))?;
    if luts.len() != block_bytes {
        return Err(Error::arg(format!(
            "FastScan scan: {} table bytes, expected 16 × n_groups = {block_bytes}",
            luts.len()
        )));
    }
    if !packed.len().is_multiple_of(block_bytes) {
        return Err(Error::arg(format!(
            "FastScan scan: {} packed bytes, not a multiple of the {block_bytes}-byte block of {n_groups} groups",
            packed.len()
        )));
    }
    let blocks = packed.len() / block_bytes;
    if out.len() != blocks * FASTSCAN_BLOCK {
        return Err(Error::arg(format!(
            "FastScan scan: output has {} slots, expected 32 per block = {}",
            out.len(),
            blocks * FASTSCAN_BLOCK
        )));
    }
    Ok(blocks)
}

/// Scores every packed code: `out[v] = Σ_g luts[16g + code_g(v)]` for the
/// `packed.len() / (16 · n_groups)` blocks of 32 codes (`out` holds 32 sums
/// per block; padding codes score `Σ_g luts[16g]`). Uses [`ScanPath::selected`].
#[inline]
pub fn scan(packed: &[u8], n_groups: usize, luts: &[u8], out: &mut [u32]) -> Result<()> {
    scan_with(ScanPath::selected(), packed, n_groups, luts, out)
}

/// [`scan`] on an explicit path; fails if the CPU lacks it.
pub fn scan_with(
    path: ScanPath,
    packed: &[u8],
    n_groups: usize,
    luts: &[u8],
    out: &mut [u32],
) -> Result<()> {
    check_scan(packed, n_groups, luts, out)?;
    if !path.is_supported() {
        return Err(Error::arg(format!(
            "FastScan: the {} path is not supported by this CPU",
            path.name()
        )));
    }
    match path {
        ScanPath::Scalar => scan_scalar(packed, n_groups, luts, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 was detected just above; lengths were checked by
        // `check_scan` (`packed` = blocks × 16·n_groups, `luts` = 16·n_groups,
        // `out` = 32 × blocks), which is all `x86::scan_avx2` relies on.
        ScanPath::Avx2 => unsafe { x86::scan_avx2(packed, n_groups, luts, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F/BW detected just above; lengths checked as for AVX2.
        ScanPath::Avx512 => unsafe { x86::scan_avx512(packed, n_groups, luts, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => scan_scalar(packed, n_groups, luts, out),
    }
    Ok(())
}

/// Portable FastScan (lengths checked by the caller).
fn scan_scalar(packed: &[u8], n_groups: usize, luts: &[u8], out: &mut [u32]) {
    let block_bytes = n_groups * GROUP_BYTES;
    for (block, sums) in packed
        .chunks_exact(block_bytes)
        .zip(out.chunks_exact_mut(FASTSCAN_BLOCK))
    {
        let mut acc = [0u32; FASTSCAN_BLOCK];
        for (bytes, lut) in block
            .chunks_exact(GROUP_BYTES)
            .zip(luts.chunks_exact(LUT_ENTRIES))
        {
            for (j, &b) in bytes.iter().enumerate() {
                acc[j] += lut[(b & 0x0f) as usize] as u32;
                acc[j + 16] += lut[(b >> 4) as usize] as u32;
            }
        }
        sums.copy_from_slice(&acc);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The SIMD FastScan kernels. Callers check the CPU features and that
    //! `packed.len() == blocks · 16 · n_groups`, `luts.len() == 16 · n_groups`
    //! and `out.len() == 32 · blocks` with `n_groups ≥ 1`.

    use super::{FASTSCAN_BLOCK, FLUSH_STEPS, GROUP_BYTES};
    use core::arch::x86_64::*;

    /// Adds the u16 accumulators of one flush window into the u32 totals.
    /// `e`/`o` hold `even + 256·odd` and `odd` sums per u16 lane for the
    /// vectors of one nibble half; the totals get vectors `0..8` and `8..16`
    /// of that half, one 128-bit lane per group summed together.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn flush_avx2(acc: __m256i, odd: __m256i, t_lo: &mut __m256i, t_hi: &mut __m256i) {
        let even = _mm256_sub_epi16(acc, _mm256_slli_epi16::<8>(odd));
        let a = _mm256_unpacklo_epi16(even, odd); // vectors 0..8 per lane
        let b = _mm256_unpackhi_epi16(even, odd); // vectors 8..16 per lane
        let sum_lanes = |x: __m256i| {
            _mm256_add_epi32(
                _mm256_cvtepu16_epi32(_mm256_castsi256_si128(x)),
                _mm256_cvtepu16_epi32(_mm256_extracti128_si256::<1>(x)),
            )
        };
        *t_lo = _mm256_add_epi32(*t_lo, sum_lanes(a));
        *t_hi = _mm256_add_epi32(*t_hi, sum_lanes(b));
    }

    /// AVX2 FastScan: two groups (one per 128-bit lane) per step.
    #[target_feature(enable = "avx2")]
    pub unsafe fn scan_avx2(packed: &[u8], n_groups: usize, luts: &[u8], out: &mut [u32]) {
        let block_bytes = n_groups * GROUP_BYTES;
        let blocks = out.len() / FASTSCAN_BLOCK;
        let mask = _mm256_set1_epi8(0x0f);
        let pl = luts.as_ptr();
        for b in 0..blocks {
            // SAFETY (all loads and the stores below): `pc` points at block
            // `b < blocks` of `packed`, which has `block_bytes` bytes; every
            // load reads group bytes `16g .. 16g + 16·w` with `g + w <=
            // n_groups` (w = 2 full steps, 1 for the tail), inside both the
            // block and `luts` (16·n_groups bytes). Stores write 32 u32 at
            // `out[32b..32b + 32]`, inside `out`.
            let pc = packed.as_ptr().add(b * block_bytes);
            let mut tot = [_mm256_setzero_si256(); 4];
            let mut g = 0;
            while g < n_groups {
                let end = n_groups.min(g + 2 * FLUSH_STEPS);
                let mut a_lo = _mm256_setzero_si256();
                let mut o_lo = _mm256_setzero_si256();
                let mut a_hi = _mm256_setzero_si256();
                let mut o_hi = _mm256_setzero_si256();
                while g < end {
                    let (c, lut) = if g + 2 <= end {
                        (
                            _mm256_loadu_si256(pc.add(g * GROUP_BYTES) as *const __m256i),
                            _mm256_loadu_si256(pl.add(g * GROUP_BYTES) as *const __m256i),
                        )
                    } else {
                        // One group left: the upper lane is zero codes
                        // looking up a zero table, adding nothing.
                        (
                            _mm256_zextsi128_si256(_mm_loadu_si128(
                                pc.add(g * GROUP_BYTES) as *const __m128i
                            )),
                            _mm256_zextsi128_si256(_mm_loadu_si128(
                                pl.add(g * GROUP_BYTES) as *const __m128i
                            )),
                        )
                    };
                    let lo = _mm256_and_si256(c, mask);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(c), mask);
                    let r_lo = _mm256_shuffle_epi8(lut, lo);
                    let r_hi = _mm256_shuffle_epi8(lut, hi);
                    a_lo = _mm256_add_epi16(a_lo, r_lo);
                    o_lo = _mm256_add_epi16(o_lo, _mm256_srli_epi16::<8>(r_lo));
                    a_hi = _mm256_add_epi16(a_hi, r_hi);
                    o_hi = _mm256_add_epi16(o_hi, _mm256_srli_epi16::<8>(r_hi));
                    g += 2;
                }
                g = end;
                let [t0, t1, t2, t3] = &mut tot;
                flush_avx2(a_lo, o_lo, t0, t1);
                flush_avx2(a_hi, o_hi, t2, t3);
            }
            let po = out.as_mut_ptr().add(b * FASTSCAN_BLOCK) as *mut __m256i;
            for (k, t) in tot.iter().enumerate() {
                _mm256_storeu_si256(po.add(k), *t);
            }
        }
    }

    /// As [`flush_avx2`] for four 128-bit lanes: the totals get, for vectors
    /// `0..8` (`t_lo`) and `8..16` (`t_hi`) of one nibble half, two partial
    /// sums each (256-bit halves), combined when the block is stored.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn flush_avx512(acc: __m512i, odd: __m512i, t_lo: &mut __m512i, t_hi: &mut __m512i) {
        let even = _mm512_sub_epi16(acc, _mm512_slli_epi16::<8>(odd));
        let a = _mm512_unpacklo_epi16(even, odd);
        let b = _mm512_unpackhi_epi16(even, odd);
        let sum_lanes = |x: __m512i| {
            // Lanes (0, 1) and (2, 3) widened: [lane0 | lane1] + [lane2 | lane3].
            _mm512_add_epi32(
                _mm512_cvtepu16_epi32(_mm512_castsi512_si256(x)),
                _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64::<1>(x)),
            )
        };
        *t_lo = _mm512_add_epi32(*t_lo, sum_lanes(a));
        *t_hi = _mm512_add_epi32(*t_hi, sum_lanes(b));
    }

    /// AVX-512BW FastScan: four groups (one per 128-bit lane) per step, the
    /// last step with masked loads (masked-off bytes read as zero and do not
    /// fault).
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn scan_avx512(packed: &[u8], n_groups: usize, luts: &[u8], out: &mut [u32]) {
        let block_bytes = n_groups * GROUP_BYTES;
        let blocks = out.len() / FASTSCAN_BLOCK;
        let mask = _mm512_set1_epi8(0x0f);
        let pl = luts.as_ptr();
        for b in 0..blocks {
            // SAFETY: as in `scan_avx2`; full loads read 64 bytes at group
            // `g` with `g + 4 <= n_groups`, the tail load is masked to the
            // `16 · (n_groups - g) < 64` bytes inside the block and `luts`.
            let pc = packed.as_ptr().add(b * block_bytes);
            let mut tot = [_mm512_setzero_si512(); 4];
            let mut g = 0;
            while g < n_groups {
                let end = n_groups.min(g + 4 * FLUSH_STEPS);
                let mut a_lo = _mm512_setzero_si512();
                let mut o_lo = _mm512_setzero_si512();
                let mut a_hi = _mm512_setzero_si512();
                let mut o_hi = _mm512_setzero_si512();
                while g < end {
                    let (c, lut) = if g + 4 <= end {
                        (
                            _mm512_loadu_si512(pc.add(g * GROUP_BYTES) as *const __m512i),
                            _mm512_loadu_si512(pl.add(g * GROUP_BYTES) as *const __m512i),
                        )
                    } else {
                        let m: __mmask64 = (1u64 << ((end - g) * GROUP_BYTES)) - 1;
                        (
                            _mm512_maskz_loadu_epi8(m, pc.add(g * GROUP_BYTES) as *const i8),
                            _mm512_maskz_loadu_epi8(m, pl.add(g * GROUP_BYTES) as *const i8),
                        )
                    };
                    let lo = _mm512_and_si512(c, mask);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(c), mask);
                    let r_lo = _mm512_shuffle_epi8(lut, lo);
                    let r_hi = _mm512_shuffle_epi8(lut, hi);
                    a_lo = _mm512_add_epi16(a_lo, r_lo);
                    o_lo = _mm512_add_epi16(o_lo, _mm512_srli_epi16::<8>(r_lo));
                    a_hi = _mm512_add_epi16(a_hi, r_hi);
                    o_hi = _mm512_add_epi16(o_hi, _mm512_srli_epi16::<8>(r_hi));
                    g += 4;
                }
                g = end;
                let [t0, t1, t2, t3] = &mut tot;
                flush_avx512(a_lo, o_lo, t0, t1);
                flush_avx512(a_hi, o_hi, t2, t3);
            }
            let po = out.as_mut_ptr().add(b * FASTSCAN_BLOCK) as *mut __m256i;
            for (k, t) in tot.iter().enumerate() {
                let s = _mm256_add_epi32(
                    _mm512_castsi512_si256(*t),
                    _mm512_extracti64x4_epi64::<1>(*t),
                );
                _mm256_storeu_si256(po.add(k), s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn random_codes(rng: &mut ChaCha8Rng, n: usize, n_groups: usize) -> Vec<u8> {
        let cb = code_bytes(n_groups);
        let mut codes: Vec<u8> = (0..n * cb).map(|_| rng.random()).collect();
        if n_groups % 2 == 1 {
            // The unused high nibble of the last byte: any value is ignored,
            // so leave it random in half the rows.
            for (i, row) in codes.chunks_exact_mut(cb).enumerate() {
                if i % 2 == 0 {
                    row[cb - 1] &= 0x0f;
                }
            }
        }
        codes
    }

    /// The scalar model of the arithmetic, straight from the unpacked codes:
    /// `Σ_g luts[16g + code_g(v)]`, padding codes being 0.
    fn model(codes: &[u8], n: usize, n_groups: usize, luts: &[u8]) -> Vec<u32> {
        let cb = code_bytes(n_groups);
        (0..padded_count(n))
            .map(|v| {
                (0..n_groups)
                    .map(|g| {
                        let c = if v < n {
                            (codes[v * cb + g / 2] >> (4 * (g % 2))) & 0x0f
                        } else {
                            0
                        };
                        luts[16 * g + c as usize] as u32
                    })
                    .sum()
            })
            .collect()
    }

    fn supported_paths() -> Vec<ScanPath> {
        let paths: Vec<ScanPath> = ScanPath::ALL
            .iter()
            .copied()
            .filter(|p| p.is_supported())
            .collect();
        // The CI machines have AVX2 and AVX-512: make sure the SIMD paths
        // really ran where the CPU has them.
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                assert!(paths.contains(&ScanPath::Avx2));
            }
            if std::arch::is_x86_feature_detected!("avx512bw") {
                assert!(paths.contains(&ScanPath::Avx512));
            }
        }
        paths
    }

    fn check_all_paths(codes: &[u8], n: usize, n_groups: usize, luts: &[u8]) {
        let want = model(codes, n, n_groups, luts);
        let packed = pack(codes, n, n_groups).unwrap();
        for path in supported_paths() {
            let mut out = vec![u32::MAX; want.len()];
            scan_with(path, &packed, n_groups, luts, &mut out).unwrap();
            assert_eq!(out, want, "{} n={n} n_groups={n_groups}", path.name());
        }
        let mut out = vec![0; want.len()];
        scan(&packed, n_groups, luts, &mut out).unwrap();
        assert_eq!(out, want);
    }

    #[test]
    fn every_path_equals_the_scalar_model_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for n in [32, 64, 96, 45, 1, 31, 33, 200] {
            for n_groups in [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 31, 32, 33, 64, 96, 97] {
                let codes = random_codes(&mut rng, n, n_groups);
                let luts: Vec<u8> = (0..16 * n_groups).map(|_| rng.random()).collect();
                check_all_paths(&codes, n, n_groups, &luts);
            }
        }
    }

    #[test]
    fn sums_stay_exact_past_the_u16_range() {
        // 255 per group over > 1024 groups: the u16 windows must flush.
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for n_groups in [257, 513, 1024, 1025, 1100, 2051] {
            let n = 64;
            let full = vec![0xffu8; n * code_bytes(n_groups)];
            let luts = vec![255u8; 16 * n_groups];
            check_all_paths(&full, n, n_groups, &luts);
            let codes = random_codes(&mut rng, n, n_groups);
            let luts: Vec<u8> = (0..16 * n_groups)
                .map(|_| rng.random_range(200..=255))
                .collect();
            check_all_paths(&codes, n, n_groups, &luts);
        }
        let want = model(&[0xff; 32 * 1026], 32, 2051, &[255; 16 * 2051]);
        assert_eq!(want[0], 255 * 2051);
    }

    #[test]
    fn pack_places_nibbles_and_pads_with_zero_codes() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let (n, n_groups) = (45, 7);
        let codes = random_codes(&mut rng, n, n_groups);
        let packed = pack(&codes, n, n_groups).unwrap();
        assert_eq!(packed.len(), 64 * 7 / 2);
        assert_eq!(packed_len(45, 7).unwrap(), packed.len());
        for v in 0..64 {
            for g in 0..n_groups {
                let want = if v < n {
                    (codes[v * 4 + g / 2] >> (4 * (g % 2))) & 0x0f
                } else {
                    0
                };
                assert_eq!(nibble(&packed, n_groups, v, g).unwrap(), want);
            }
        }
        // Layout: group g of vector j + 16·h is nibble h of byte 16g + j.
        let block1 = &packed[7 * 16..];
        assert_eq!(
            block1[16 * 3 + 5] >> 4,
            nibble(&packed, 7, 32 + 21, 3).unwrap()
        );
        assert_eq!(
            block1[16 * 3 + 5] & 15,
            nibble(&packed, 7, 32 + 5, 3).unwrap()
        );
        assert!(nibble(&packed, 7, 64, 0).is_err());
        assert!(nibble(&packed, 7, 0, 7).is_err());
        assert!(nibble(&packed, 0, 0, 0).is_err());
        // Bit-packed codes: dimension 4g + k is bit k of sub-code g.
        let bits = [0b1010_0110u8, 0b0000_0001];
        let p = pack(&bits, 1, 3).unwrap();
        assert_eq!(nibble(&p, 3, 0, 0).unwrap(), 0b0110);
        assert_eq!(nibble(&p, 3, 0, 1).unwrap(), 0b1010);
        assert_eq!(nibble(&p, 3, 0, 2).unwrap(), 0b0001);
    }

    #[test]
    fn bad_lengths_are_rejected() {
        let codes = vec![0u8; 10 * 4];
        assert!(pack(&codes, 10, 0).is_err());
        assert!(pack(&codes, 11, 8).is_err());
        assert!(pack(&codes[..39], 10, 8).is_err());
        assert!(pack(&codes, usize::MAX, 8).is_err());
        let mut small = vec![0u8; 100];
        assert!(pack_into(&codes, 10, 8, &mut small).is_err());
        let packed = pack(&codes, 10, 8).unwrap();
        let luts = vec![0u8; 128];
        let mut out = vec![0u32; 32];
        for path in supported_paths() {
            assert!(scan_with(path, &packed, 8, &luts, &mut out).is_ok());
            assert!(scan_with(path, &packed, 8, &luts[..127], &mut out).is_err());
            assert!(scan_with(path, &packed[..127], 8, &luts, &mut out).is_err());
            assert!(scan_with(path, &packed, 8, &luts, &mut out[..31]).is_err());
            assert!(scan_with(path, &packed, 0, &luts, &mut out).is_err());
            assert!(scan_with(path, &packed, 4, &luts, &mut out).is_err());
        }
        let mut none: Vec<u32> = vec![];
        assert!(scan(&[], 8, &luts, &mut none).is_ok());
        assert!(build_luts(&[]).is_err());
        assert!(build_luts(&[64, 64, 64, 64]).is_err());
        assert!(subset_sum_luts(&[1.0, f32::NAN]).is_err());
        assert!(quantize_luts(&[0.0; 15]).is_err());
        assert!(quantize_luts(&[]).is_err());
        let mut inf = vec![0.0; 16];
        inf[3] = f32::INFINITY;
        assert!(quantize_luts(&inf).is_err());
    }

    #[test]
    fn integer_and_float_tables_are_subset_sums() {
        let q = [3u8, 60, 0, 17, 63, 1, 2];
        let luts = build_luts(&q).unwrap();
        assert_eq!(luts.len(), 32);
        let f = subset_sum_luts(&q.map(|x| x as f32)).unwrap();
        for g in 0..2 {
            for c in 0..16 {
                let want: u32 = (0..4)
                    .filter(|k| c >> k & 1 == 1)
                    .map(|k| q.get(4 * g + k).map_or(0, |&x| x as u32))
                    .sum();
                assert_eq!(luts[16 * g + c] as u32, want);
                assert_eq!(f[16 * g + c], want as f32);
            }
        }
        assert_eq!(build_luts(&[63; 8]).unwrap()[15], 252);
    }

    #[test]
    fn quantized_tables_stay_within_their_error() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        for n_groups in [1, 5, 64, 200] {
            let fl: Vec<f32> = (0..16 * n_groups)
                .map(|_| rng.random_range(-3.0f32..5.0))
                .collect();
            let ql = quantize_luts(&fl).unwrap();
            assert_eq!(ql.n_groups(), n_groups);
            assert!(ql.delta() > 0.0);
            for _ in 0..200 {
                let code: Vec<usize> = (0..n_groups).map(|_| rng.random_range(0..16)).collect();
                let exact: f64 = code
                    .iter()
                    .enumerate()
                    .map(|(g, &c)| fl[16 * g + c] as f64)
                    .sum();
                let sum: u32 = code
                    .iter()
                    .enumerate()
                    .map(|(g, &c)| ql.luts()[16 * g + c] as u32)
                    .sum();
                let err = (ql.value(sum) as f64 - exact).abs();
                assert!(
                    err <= ql.max_error() as f64 * (1.0 + 1e-5) + 1e-4,
                    "{err} > {}",
                    ql.max_error()
                );
            }
        }
        // Constant tables: zero step, exact bias.
        let ql = quantize_luts(&[2.5; 32]).unwrap();
        assert_eq!(ql.delta(), 0.0);
        assert_eq!(ql.value(123), 5.0);
        assert!(ql.luts().iter().all(|&x| x == 0));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn prop_scan_matches_model(n in 1usize..100, n_groups in 1usize..40, seed in any::<u64>()) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let codes = random_codes(&mut rng, n, n_groups);
            let luts: Vec<u8> = (0..16 * n_groups).map(|_| rng.random()).collect();
            let want = model(&codes, n, n_groups, &luts);
            let packed = pack(&codes, n, n_groups).unwrap();
            for path in supported_paths() {
                let mut out = vec![0; want.len()];
                scan_with(path, &packed, n_groups, &luts, &mut out).unwrap();
                prop_assert_eq!(&out, &want);
            }
        }
    }

    /// Speed check, not run by default:
    /// `cargo test -p nearline --release --lib fastscan_speed -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn fastscan_speed() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for (r, dim) in [(64usize, 256usize), (128, 256), (64, 128), (64, 960)] {
            let n_groups = dim / 4;
            let records = 1024;
            let codes = random_codes(&mut rng, r * records, n_groups);
            let packed: Vec<Vec<u8>> = codes
                .chunks_exact(r * code_bytes(n_groups))
                .map(|c| pack(c, r, n_groups).unwrap())
                .collect();
            let luts: Vec<u8> = (0..16 * n_groups).map(|_| rng.random()).collect();
            let mut out = vec![0u32; r];
            for path in supported_paths() {
                let reps = 200;
                let t = std::time::Instant::now();
                let mut check = 0u64;
                for _ in 0..reps {
                    for p in &packed {
                        scan_with(path, p, n_groups, &luts, &mut out).unwrap();
                        check = check.wrapping_add(out[3] as u64);
                    }
                }
                let per = t.elapsed().as_secs_f64() / (reps * records) as f64;
                println!(
                    "R = {r:3}, D = {dim:3}, {:8}: {:7.1} ns per record ({:.2} ns per code) [{check}]",
                    path.name(),
                    per * 1e9,
                    per * 1e9 / r as f64
                );
            }
        }
    }
}
