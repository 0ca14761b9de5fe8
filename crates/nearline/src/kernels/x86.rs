//! x86_64 SIMD implementations of the distance kernels and the PQ ADC helper.
//!
//! Every function here is `unsafe` only because it is compiled for CPU
//! features the process may lack: a caller must have checked them (the
//! dispatcher in [`super::kernels`] does, once). Pointer reads never go past
//! `min(a.len(), b.len())`: full vectors are read while they fit and tails use
//! masked loads (AVX-512) or scalar code (AVX2).
//!
//! Like the scalar reference, the kernels compare the first
//! `min(a.len(), b.len())` elements.

#![allow(clippy::missing_safety_doc)]
// AVX-512 intrinsics and target features are stable since Rust 1.89; the
// workspace `rust-version` still says 1.85.
#![allow(clippy::incompatible_msrv)]

/// AVX2 + FMA (+ F16C for the f16 kernels).
pub mod avx2 {
    use core::arch::x86_64::*;
    use half::f16;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum_ps(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
        _mm_cvtss_f32(s)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum_epi32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }

    /// Squared L2 distance over f32 (checked: AVX2 and FMA).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn l2_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut acc2 = _mm256_setzero_ps();
        let mut acc3 = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY: every load reads 8 floats at `i + k*8` with `i + 32 <= n`
        // (first loop) or `i + 8 <= n` (second loop), inside both slices.
        while i + 32 <= n {
            let d0 = _mm256_sub_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)));
            let d1 = _mm256_sub_ps(
                _mm256_loadu_ps(pa.add(i + 8)),
                _mm256_loadu_ps(pb.add(i + 8)),
            );
            let d2 = _mm256_sub_ps(
                _mm256_loadu_ps(pa.add(i + 16)),
                _mm256_loadu_ps(pb.add(i + 16)),
            );
            let d3 = _mm256_sub_ps(
                _mm256_loadu_ps(pa.add(i + 24)),
                _mm256_loadu_ps(pb.add(i + 24)),
            );
            acc0 = _mm256_fmadd_ps(d0, d0, acc0);
            acc1 = _mm256_fmadd_ps(d1, d1, acc1);
            acc2 = _mm256_fmadd_ps(d2, d2, acc2);
            acc3 = _mm256_fmadd_ps(d3, d3, acc3);
            i += 32;
        }
        while i + 8 <= n {
            let d = _mm256_sub_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)));
            acc0 = _mm256_fmadd_ps(d, d, acc0);
            i += 8;
        }
        let acc = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
        let mut s = hsum_ps(acc);
        for (x, y) in a[i..n].iter().zip(&b[i..n]) {
            let d = x - y;
            s += d * d;
        }
        s
    }

    /// Inner product over f32 (checked: AVX2 and FMA).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut acc2 = _mm256_setzero_ps();
        let mut acc3 = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY: loads stay below `n` as in `l2_f32`.
        while i + 32 <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 8)),
                _mm256_loadu_ps(pb.add(i + 8)),
                acc1,
            );
            acc2 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 16)),
                _mm256_loadu_ps(pb.add(i + 16)),
                acc2,
            );
            acc3 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 24)),
                _mm256_loadu_ps(pb.add(i + 24)),
                acc3,
            );
            i += 32;
        }
        while i + 8 <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
            i += 8;
        }
        let acc = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
        let mut s = hsum_ps(acc);
        for (x, y) in a[i..n].iter().zip(&b[i..n]) {
            s += x * y;
        }
        s
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_f16x8(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }

    /// Squared L2 distance over f16 (checked: AVX2, FMA and F16C).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn l2_f16(a: &[f16], b: &[f16]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut acc2 = _mm256_setzero_ps();
        let mut acc3 = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY: each load reads 8 halves at `i + k*8 + 8 <= n`.
        while i + 32 <= n {
            let d0 = _mm256_sub_ps(load_f16x8(pa.add(i)), load_f16x8(pb.add(i)));
            let d1 = _mm256_sub_ps(load_f16x8(pa.add(i + 8)), load_f16x8(pb.add(i + 8)));
            let d2 = _mm256_sub_ps(load_f16x8(pa.add(i + 16)), load_f16x8(pb.add(i + 16)));
            let d3 = _mm256_sub_ps(load_f16x8(pa.add(i + 24)), load_f16x8(pb.add(i + 24)));
            acc0 = _mm256_fmadd_ps(d0, d0, acc0);
            acc1 = _mm256_fmadd_ps(d1, d1, acc1);
            acc2 = _mm256_fmadd_ps(d2, d2, acc2);
            acc3 = _mm256_fmadd_ps(d3, d3, acc3);
            i += 32;
        }
        while i + 8 <= n {
            let d = _mm256_sub_ps(load_f16x8(pa.add(i)), load_f16x8(pb.add(i)));
            acc0 = _mm256_fmadd_ps(d, d, acc0);
            i += 8;
        }
        let acc = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
        let mut s = hsum_ps(acc);
        for (x, y) in a[i..n].iter().zip(&b[i..n]) {
            let d = x.to_f32() - y.to_f32();
            s += d * d;
        }
        s
    }

    /// Inner product over f16 (checked: AVX2, FMA and F16C).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16(a: &[f16], b: &[f16]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut acc2 = _mm256_setzero_ps();
        let mut acc3 = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY: each load reads 8 halves at `i + k*8 + 8 <= n`.
        while i + 32 <= n {
            acc0 = _mm256_fmadd_ps(load_f16x8(pa.add(i)), load_f16x8(pb.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(load_f16x8(pa.add(i + 8)), load_f16x8(pb.add(i + 8)), acc1);
            acc2 = _mm256_fmadd_ps(load_f16x8(pa.add(i + 16)), load_f16x8(pb.add(i + 16)), acc2);
            acc3 = _mm256_fmadd_ps(load_f16x8(pa.add(i + 24)), load_f16x8(pb.add(i + 24)), acc3);
            i += 32;
        }
        while i + 8 <= n {
            acc0 = _mm256_fmadd_ps(load_f16x8(pa.add(i)), load_f16x8(pb.add(i)), acc0);
            i += 8;
        }
        let acc = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
        let mut s = hsum_ps(acc);
        for (x, y) in a[i..n].iter().zip(&b[i..n]) {
            s += x.to_f32() * y.to_f32();
        }
        s
    }

    /// Sum over 32 byte pairs of `(x - y)^2` for unsigned bytes, as 8 i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sq_diff_u8x32(va: __m256i, vb: __m256i) -> __m256i {
        let d = _mm256_sub_epi8(_mm256_max_epu8(va, vb), _mm256_min_epu8(va, vb));
        let z = _mm256_setzero_si256();
        let lo = _mm256_unpacklo_epi8(d, z);
        let hi = _mm256_unpackhi_epi8(d, z);
        _mm256_add_epi32(_mm256_madd_epi16(lo, lo), _mm256_madd_epi16(hi, hi))
    }

    /// Squared L2 distance over u8, exact (checked: AVX2).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn l2_u8(a: &[u8], b: &[u8]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm256_setzero_si256();
        let mut acc1 = _mm256_setzero_si256();
        let mut i = 0;
        // SAFETY: each load reads 32 bytes at `i + k*32 + 32 <= n`.
        while i + 64 <= n {
            let a0 = _mm256_loadu_si256(pa.add(i) as *const __m256i);
            let b0 = _mm256_loadu_si256(pb.add(i) as *const __m256i);
            let a1 = _mm256_loadu_si256(pa.add(i + 32) as *const __m256i);
            let b1 = _mm256_loadu_si256(pb.add(i + 32) as *const __m256i);
            acc0 = _mm256_add_epi32(acc0, sq_diff_u8x32(a0, b0));
            acc1 = _mm256_add_epi32(acc1, sq_diff_u8x32(a1, b1));
            i += 64;
        }
        while i + 32 <= n {
            let a0 = _mm256_loadu_si256(pa.add(i) as *const __m256i);
            let b0 = _mm256_loadu_si256(pb.add(i) as *const __m256i);
            acc0 = _mm256_add_epi32(acc0, sq_diff_u8x32(a0, b0));
            i += 32;
        }
        let mut s = hsum_epi32(_mm256_add_epi32(acc0, acc1)) as u32;
        for (&x, &y) in a[i..n].iter().zip(&b[i..n]) {
            let d = x.abs_diff(y) as u32;
            s = s.wrapping_add(d * d);
        }
        s as f32
    }

    /// Squared L2 distance over i8, exact (checked: AVX2). Flipping the sign
    /// bit maps i8 to u8 by adding 128 to both sides, which keeps differences.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn l2_i8(a: &[i8], b: &[i8]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let flip = _mm256_set1_epi8(i8::MIN);
        let mut acc0 = _mm256_setzero_si256();
        let mut acc1 = _mm256_setzero_si256();
        let mut i = 0;
        // SAFETY: each load reads 32 bytes at `i + k*32 + 32 <= n`.
        while i + 64 <= n {
            let a0 = _mm256_xor_si256(_mm256_loadu_si256(pa.add(i) as *const __m256i), flip);
            let b0 = _mm256_xor_si256(_mm256_loadu_si256(pb.add(i) as *const __m256i), flip);
            let a1 = _mm256_xor_si256(_mm256_loadu_si256(pa.add(i + 32) as *const __m256i), flip);
            let b1 = _mm256_xor_si256(_mm256_loadu_si256(pb.add(i + 32) as *const __m256i), flip);
            acc0 = _mm256_add_epi32(acc0, sq_diff_u8x32(a0, b0));
            acc1 = _mm256_add_epi32(acc1, sq_diff_u8x32(a1, b1));
            i += 64;
        }
        while i + 32 <= n {
            let a0 = _mm256_xor_si256(_mm256_loadu_si256(pa.add(i) as *const __m256i), flip);
            let b0 = _mm256_xor_si256(_mm256_loadu_si256(pb.add(i) as *const __m256i), flip);
            acc0 = _mm256_add_epi32(acc0, sq_diff_u8x32(a0, b0));
            i += 32;
        }
        let mut s = hsum_epi32(_mm256_add_epi32(acc0, acc1));
        for (&x, &y) in a[i..n].iter().zip(&b[i..n]) {
            let d = x as i32 - y as i32;
            s = s.wrapping_add(d * d);
        }
        s as f32
    }

    /// Inner product over u8, exact (checked: AVX2).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_u8(a: &[u8], b: &[u8]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm256_setzero_si256();
        let mut acc1 = _mm256_setzero_si256();
        let mut i = 0;
        // SAFETY: each load reads 16 bytes at `i + k*16 + 16 <= n`.
        while i + 32 <= n {
            let a0 = _mm256_cvtepu8_epi16(_mm_loadu_si128(pa.add(i) as *const __m128i));
            let b0 = _mm256_cvtepu8_epi16(_mm_loadu_si128(pb.add(i) as *const __m128i));
            let a1 = _mm256_cvtepu8_epi16(_mm_loadu_si128(pa.add(i + 16) as *const __m128i));
            let b1 = _mm256_cvtepu8_epi16(_mm_loadu_si128(pb.add(i + 16) as *const __m128i));
            acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(a0, b0));
            acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(a1, b1));
            i += 32;
        }
        while i + 16 <= n {
            let a0 = _mm256_cvtepu8_epi16(_mm_loadu_si128(pa.add(i) as *const __m128i));
            let b0 = _mm256_cvtepu8_epi16(_mm_loadu_si128(pb.add(i) as *const __m128i));
            acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(a0, b0));
            i += 16;
        }
        let mut s = hsum_epi32(_mm256_add_epi32(acc0, acc1)) as u32;
        for (&x, &y) in a[i..n].iter().zip(&b[i..n]) {
            s = s.wrapping_add(x as u32 * y as u32);
        }
        s as f32
    }

    /// Inner product over i8, exact (checked: AVX2).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_i8(a: &[i8], b: &[i8]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm256_setzero_si256();
        let mut acc1 = _mm256_setzero_si256();
        let mut i = 0;
        // SAFETY: each load reads 16 bytes at `i + k*16 + 16 <= n`.
        while i + 32 <= n {
            let a0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(pa.add(i) as *const __m128i));
            let b0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(pb.add(i) as *const __m128i));
            let a1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(pa.add(i + 16) as *const __m128i));
            let b1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(pb.add(i + 16) as *const __m128i));
            acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(a0, b0));
            acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(a1, b1));
            i += 32;
        }
        while i + 16 <= n {
            let a0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(pa.add(i) as *const __m128i));
            let b0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(pb.add(i) as *const __m128i));
            acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(a0, b0));
            i += 16;
        }
        let mut s = hsum_epi32(_mm256_add_epi32(acc0, acc1));
        for (&x, &y) in a[i..n].iter().zip(&b[i..n]) {
            s = s.wrapping_add(x as i32 * y as i32);
        }
        s as f32
    }

    /// PQ asymmetric distances, 8 codes at a time with gathers (checked: AVX2).
    /// Preconditions (checked by the caller): `table.len() >= m * 256`,
    /// `out.len() * m <= codes.len()`, and `m * 256` fits in i32. Sums run
    /// over `j` in order, so results equal the scalar reference exactly.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn pq_adc_batch(table: &[f32], m: usize, codes: &[u8], out: &mut [f32]) {
        let n = out.len();
        let mut i = 0;
        if m >= 4 {
            let pt = table.as_ptr();
            let rows = _mm256_mullo_epi32(
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                _mm256_set1_epi32(m as i32),
            );
            let byte = _mm256_set1_epi32(0xff);
            while i + 8 <= n {
                // SAFETY: each code gather reads the 4 bytes `j..j + 4` (with
                // `j + 4 <= m`) of rows `i..i + 8 <= n`, all inside `codes`;
                // table indices are `< m * 256 <= table.len()`.
                let base = codes.as_ptr().add(i * m);
                let mut acc = _mm256_setzero_ps();
                let mut j = 0;
                while j < m {
                    // The last group may start before `j` so as not to read
                    // past the row; `skip` code bytes are then already done.
                    let start = j.min(m - 4);
                    let skip = j - start;
                    let g = _mm256_i32gather_epi32::<1>(base.add(start) as *const i32, rows);
                    for t in skip..4 {
                        let c = _mm256_and_si256(
                            _mm256_srlv_epi32(g, _mm256_set1_epi32(8 * t as i32)),
                            byte,
                        );
                        let off = _mm256_set1_epi32(((start + t) * 256) as i32);
                        let idx = _mm256_add_epi32(c, off);
                        acc = _mm256_add_ps(acc, _mm256_i32gather_ps::<4>(pt, idx));
                    }
                    j = start + 4;
                }
                _mm256_storeu_ps(out.as_mut_ptr().add(i), acc);
                i += 8;
            }
        }
        crate::kernels::portable::pq_adc_batch(table, m, &codes[i * m..], &mut out[i..]);
    }
}

/// AVX-512 F/BW/VL (+ VNNI for the `*_vnni` integer kernels).
pub mod avx512 {
    use core::arch::x86_64::*;
    use half::f16;

    #[inline]
    fn mask16(rem: usize) -> __mmask16 {
        ((1u32 << rem) - 1) as __mmask16
    }
    #[inline]
    fn mask32(rem: usize) -> __mmask32 {
        ((1u64 << rem) - 1) as __mmask32
    }
    #[inline]
    fn mask64(rem: usize) -> __mmask64 {
        if rem >= 64 {
            !0
        } else {
            (1u64 << rem) - 1
        }
    }

    /// Squared L2 distance over f32 (checked: AVX-512 F/BW/VL).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
    pub unsafe fn l2_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm512_setzero_ps();
        let mut acc1 = _mm512_setzero_ps();
        let mut acc2 = _mm512_setzero_ps();
        let mut acc3 = _mm512_setzero_ps();
        let mut i = 0;
        // SAFETY: full loads read 16 floats at `i + k*16 + 16 <= n`; the tail
        // load is masked to the `n - i < 16` remaining lanes and masked-off
        // lanes are never touched.
        while i + 64 <= n {
            let d0 = _mm512_sub_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)));
            let d1 = _mm512_sub_ps(
                _mm512_loadu_ps(pa.add(i + 16)),
                _mm512_loadu_ps(pb.add(i + 16)),
            );
            let d2 = _mm512_sub_ps(
                _mm512_loadu_ps(pa.add(i + 32)),
                _mm512_loadu_ps(pb.add(i + 32)),
            );
            let d3 = _mm512_sub_ps(
                _mm512_loadu_ps(pa.add(i + 48)),
                _mm512_loadu_ps(pb.add(i + 48)),
            );
            acc0 = _mm512_fmadd_ps(d0, d0, acc0);
            acc1 = _mm512_fmadd_ps(d1, d1, acc1);
            acc2 = _mm512_fmadd_ps(d2, d2, acc2);
            acc3 = _mm512_fmadd_ps(d3, d3, acc3);
            i += 64;
        }
        while i + 16 <= n {
            let d = _mm512_sub_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)));
            acc0 = _mm512_fmadd_ps(d, d, acc0);
            i += 16;
        }
        if i < n {
            let k = mask16(n - i);
            let d = _mm512_sub_ps(
                _mm512_maskz_loadu_ps(k, pa.add(i)),
                _mm512_maskz_loadu_ps(k, pb.add(i)),
            );
            acc1 = _mm512_fmadd_ps(d, d, acc1);
        }
        _mm512_reduce_add_ps(_mm512_add_ps(
            _mm512_add_ps(acc0, acc1),
            _mm512_add_ps(acc2, acc3),
        ))
    }

    /// Inner product over f32 (checked: AVX-512 F/BW/VL).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
    pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm512_setzero_ps();
        let mut acc1 = _mm512_setzero_ps();
        let mut acc2 = _mm512_setzero_ps();
        let mut acc3 = _mm512_setzero_ps();
        let mut i = 0;
        // SAFETY: as in `l2_f32`.
        while i + 64 <= n {
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)), acc0);
            acc1 = _mm512_fmadd_ps(
                _mm512_loadu_ps(pa.add(i + 16)),
                _mm512_loadu_ps(pb.add(i + 16)),
                acc1,
            );
            acc2 = _mm512_fmadd_ps(
                _mm512_loadu_ps(pa.add(i + 32)),
                _mm512_loadu_ps(pb.add(i + 32)),
                acc2,
            );
            acc3 = _mm512_fmadd_ps(
                _mm512_loadu_ps(pa.add(i + 48)),
                _mm512_loadu_ps(pb.add(i + 48)),
                acc3,
            );
            i += 64;
        }
        while i + 16 <= n {
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)), acc0);
            i += 16;
        }
        if i < n {
            let k = mask16(n - i);
            acc1 = _mm512_fmadd_ps(
                _mm512_maskz_loadu_ps(k, pa.add(i)),
                _mm512_maskz_loadu_ps(k, pb.add(i)),
                acc1,
            );
        }
        _mm512_reduce_add_ps(_mm512_add_ps(
            _mm512_add_ps(acc0, acc1),
            _mm512_add_ps(acc2, acc3),
        ))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn load_f16x16(p: *const f16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn load_f16x16_masked(k: __mmask16, p: *const f16) -> __m512 {
        _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p as *const i16))
    }

    /// Squared L2 distance over f16 (checked: AVX-512 F/BW/VL).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
    pub unsafe fn l2_f16(a: &[f16], b: &[f16]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm512_setzero_ps();
        let mut acc1 = _mm512_setzero_ps();
        let mut acc2 = _mm512_setzero_ps();
        let mut acc3 = _mm512_setzero_ps();
        let mut i = 0;
        // SAFETY: full loads read 16 halves below `n`; the tail is masked.
        while i + 64 <= n {
            let d0 = _mm512_sub_ps(load_f16x16(pa.add(i)), load_f16x16(pb.add(i)));
            let d1 = _mm512_sub_ps(load_f16x16(pa.add(i + 16)), load_f16x16(pb.add(i + 16)));
            let d2 = _mm512_sub_ps(load_f16x16(pa.add(i + 32)), load_f16x16(pb.add(i + 32)));
            let d3 = _mm512_sub_ps(load_f16x16(pa.add(i + 48)), load_f16x16(pb.add(i + 48)));
            acc0 = _mm512_fmadd_ps(d0, d0, acc0);
            acc1 = _mm512_fmadd_ps(d1, d1, acc1);
            acc2 = _mm512_fmadd_ps(d2, d2, acc2);
            acc3 = _mm512_fmadd_ps(d3, d3, acc3);
            i += 64;
        }
        while i + 16 <= n {
            let d = _mm512_sub_ps(load_f16x16(pa.add(i)), load_f16x16(pb.add(i)));
            acc0 = _mm512_fmadd_ps(d, d, acc0);
            i += 16;
        }
        if i < n {
            let k = mask16(n - i);
            let d = _mm512_sub_ps(
                load_f16x16_masked(k, pa.add(i)),
                load_f16x16_masked(k, pb.add(i)),
            );
            acc1 = _mm512_fmadd_ps(d, d, acc1);
        }
        _mm512_reduce_add_ps(_mm512_add_ps(
            _mm512_add_ps(acc0, acc1),
            _mm512_add_ps(acc2, acc3),
        ))
    }

    /// Inner product over f16 (checked: AVX-512 F/BW/VL).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
    pub unsafe fn dot_f16(a: &[f16], b: &[f16]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm512_setzero_ps();
        let mut acc1 = _mm512_setzero_ps();
        let mut acc2 = _mm512_setzero_ps();
        let mut acc3 = _mm512_setzero_ps();
        let mut i = 0;
        // SAFETY: full loads read 16 halves below `n`; the tail is masked.
        while i + 64 <= n {
            acc0 = _mm512_fmadd_ps(load_f16x16(pa.add(i)), load_f16x16(pb.add(i)), acc0);
            acc1 = _mm512_fmadd_ps(
                load_f16x16(pa.add(i + 16)),
                load_f16x16(pb.add(i + 16)),
                acc1,
            );
            acc2 = _mm512_fmadd_ps(
                load_f16x16(pa.add(i + 32)),
                load_f16x16(pb.add(i + 32)),
                acc2,
            );
            acc3 = _mm512_fmadd_ps(
                load_f16x16(pa.add(i + 48)),
                load_f16x16(pb.add(i + 48)),
                acc3,
            );
            i += 64;
        }
        while i + 16 <= n {
            acc0 = _mm512_fmadd_ps(load_f16x16(pa.add(i)), load_f16x16(pb.add(i)), acc0);
            i += 16;
        }
        if i < n {
            let k = mask16(n - i);
            acc1 = _mm512_fmadd_ps(
                load_f16x16_masked(k, pa.add(i)),
                load_f16x16_masked(k, pb.add(i)),
                acc1,
            );
        }
        _mm512_reduce_add_ps(_mm512_add_ps(
            _mm512_add_ps(acc0, acc1),
            _mm512_add_ps(acc2, acc3),
        ))
    }

    /// `|x - y|` per unsigned byte, widened to two vectors of 32 u16 lanes
    /// (lane order differs from the input, which does not matter for sums).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn abs_diff_u8_wide(va: __m512i, vb: __m512i) -> (__m512i, __m512i) {
        let d = _mm512_sub_epi8(_mm512_max_epu8(va, vb), _mm512_min_epu8(va, vb));
        let z = _mm512_setzero_si512();
        (_mm512_unpacklo_epi8(d, z), _mm512_unpackhi_epi8(d, z))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn load_u8x64(p: *const u8) -> __m512i {
        _mm512_loadu_si512(p as *const _)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn load_u8x64_masked(k: __mmask64, p: *const u8) -> __m512i {
        _mm512_maskz_loadu_epi8(k, p as *const i8)
    }

    /// Generic byte-L2 loop: `FLIP` maps i8 to u8 (xor 0x80 on both sides,
    /// which keeps differences); `VNNI` uses `vpdpwssd` for the square-add.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn l2_bytes_bw<const FLIP: bool>(pa: *const u8, pb: *const u8, n: usize) -> i32 {
        let flip = _mm512_set1_epi8(if FLIP { i8::MIN } else { 0 });
        let mut acc0 = _mm512_setzero_si512();
        let mut acc1 = _mm512_setzero_si512();
        let mut i = 0;
        // SAFETY: full loads read 64 bytes below `n`; the tail is masked, and
        // masked-off lanes are zero on both sides (difference 0).
        while i + 64 <= n {
            let va = _mm512_xor_si512(load_u8x64(pa.add(i)), flip);
            let vb = _mm512_xor_si512(load_u8x64(pb.add(i)), flip);
            let (lo, hi) = abs_diff_u8_wide(va, vb);
            acc0 = _mm512_add_epi32(acc0, _mm512_madd_epi16(lo, lo));
            acc1 = _mm512_add_epi32(acc1, _mm512_madd_epi16(hi, hi));
            i += 64;
        }
        if i < n {
            let k = mask64(n - i);
            let va = _mm512_xor_si512(load_u8x64_masked(k, pa.add(i)), flip);
            let vb = _mm512_xor_si512(load_u8x64_masked(k, pb.add(i)), flip);
            let (lo, hi) = abs_diff_u8_wide(va, vb);
            acc0 = _mm512_add_epi32(acc0, _mm512_madd_epi16(lo, lo));
            acc1 = _mm512_add_epi32(acc1, _mm512_madd_epi16(hi, hi));
        }
        _mm512_reduce_add_epi32(_mm512_add_epi32(acc0, acc1))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn l2_bytes_vnni<const FLIP: bool>(pa: *const u8, pb: *const u8, n: usize) -> i32 {
        let flip = _mm512_set1_epi8(if FLIP { i8::MIN } else { 0 });
        let mut acc0 = _mm512_setzero_si512();
        let mut acc1 = _mm512_setzero_si512();
        let mut i = 0;
        // SAFETY: as in `l2_bytes_bw`.
        while i + 64 <= n {
            let va = _mm512_xor_si512(load_u8x64(pa.add(i)), flip);
            let vb = _mm512_xor_si512(load_u8x64(pb.add(i)), flip);
            let (lo, hi) = abs_diff_u8_wide(va, vb);
            acc0 = _mm512_dpwssd_epi32(acc0, lo, lo);
            acc1 = _mm512_dpwssd_epi32(acc1, hi, hi);
            i += 64;
        }
        if i < n {
            let k = mask64(n - i);
            let va = _mm512_xor_si512(load_u8x64_masked(k, pa.add(i)), flip);
            let vb = _mm512_xor_si512(load_u8x64_masked(k, pb.add(i)), flip);
            let (lo, hi) = abs_diff_u8_wide(va, vb);
            acc0 = _mm512_dpwssd_epi32(acc0, lo, lo);
            acc1 = _mm512_dpwssd_epi32(acc1, hi, hi);
        }
        _mm512_reduce_add_epi32(_mm512_add_epi32(acc0, acc1))
    }

    /// Squared L2 distance over u8, exact (checked: AVX-512 F/BW/VL).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn l2_u8(a: &[u8], b: &[u8]) -> f32 {
        let n = a.len().min(b.len());
        l2_bytes_bw::<false>(a.as_ptr(), b.as_ptr(), n) as u32 as f32
    }
    /// Squared L2 distance over i8, exact (checked: AVX-512 F/BW/VL).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn l2_i8(a: &[i8], b: &[i8]) -> f32 {
        let n = a.len().min(b.len());
        l2_bytes_bw::<true>(a.as_ptr() as *const u8, b.as_ptr() as *const u8, n) as f32
    }
    /// Squared L2 distance over u8, exact (checked: AVX-512 F/BW/VL/VNNI).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn l2_u8_vnni(a: &[u8], b: &[u8]) -> f32 {
        let n = a.len().min(b.len());
        l2_bytes_vnni::<false>(a.as_ptr(), b.as_ptr(), n) as u32 as f32
    }
    /// Squared L2 distance over i8, exact (checked: AVX-512 F/BW/VL/VNNI).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn l2_i8_vnni(a: &[i8], b: &[i8]) -> f32 {
        let n = a.len().min(b.len());
        l2_bytes_vnni::<true>(a.as_ptr() as *const u8, b.as_ptr() as *const u8, n) as f32
    }

    /// Inner product over u8, exact (checked: AVX-512 F/BW/VL): bytes are
    /// zero-extended to 16 bits and multiplied pairwise with `vpmaddwd`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn dot_u8(a: &[u8], b: &[u8]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let z = _mm512_setzero_si512();
        let mut acc0 = _mm512_setzero_si512();
        let mut acc1 = _mm512_setzero_si512();
        let mut i = 0;
        // SAFETY: full loads read 64 bytes below `n`; the tail is masked
        // (masked-off lanes are zero and add nothing).
        while i + 64 <= n {
            let va = load_u8x64(pa.add(i));
            let vb = load_u8x64(pb.add(i));
            acc0 = _mm512_add_epi32(
                acc0,
                _mm512_madd_epi16(_mm512_unpacklo_epi8(va, z), _mm512_unpacklo_epi8(vb, z)),
            );
            acc1 = _mm512_add_epi32(
                acc1,
                _mm512_madd_epi16(_mm512_unpackhi_epi8(va, z), _mm512_unpackhi_epi8(vb, z)),
            );
            i += 64;
        }
        if i < n {
            let k = mask64(n - i);
            let va = load_u8x64_masked(k, pa.add(i));
            let vb = load_u8x64_masked(k, pb.add(i));
            acc0 = _mm512_add_epi32(
                acc0,
                _mm512_madd_epi16(_mm512_unpacklo_epi8(va, z), _mm512_unpacklo_epi8(vb, z)),
            );
            acc1 = _mm512_add_epi32(
                acc1,
                _mm512_madd_epi16(_mm512_unpackhi_epi8(va, z), _mm512_unpackhi_epi8(vb, z)),
            );
        }
        _mm512_reduce_add_epi32(_mm512_add_epi32(acc0, acc1)) as u32 as f32
    }

    /// Inner product over i8, exact (checked: AVX-512 F/BW/VL): bytes are
    /// sign-extended to 16 bits and multiplied pairwise with `vpmaddwd`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn dot_i8(a: &[i8], b: &[i8]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm512_setzero_si512();
        let mut acc1 = _mm512_setzero_si512();
        let mut i = 0;
        // SAFETY: full loads read 32 bytes below `n`; the tail is masked
        // (masked-off lanes are zero and add nothing).
        while i + 64 <= n {
            let a0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(pa.add(i) as *const __m256i));
            let b0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(pb.add(i) as *const __m256i));
            let a1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(pa.add(i + 32) as *const __m256i));
            let b1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(pb.add(i + 32) as *const __m256i));
            acc0 = _mm512_add_epi32(acc0, _mm512_madd_epi16(a0, b0));
            acc1 = _mm512_add_epi32(acc1, _mm512_madd_epi16(a1, b1));
            i += 64;
        }
        while i < n {
            let k = mask32((n - i).min(32));
            let a0 = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(k, pa.add(i)));
            let b0 = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(k, pb.add(i)));
            acc0 = _mm512_add_epi32(acc0, _mm512_madd_epi16(a0, b0));
            i += 32;
        }
        _mm512_reduce_add_epi32(_mm512_add_epi32(acc0, acc1)) as f32
    }

    /// Inner product over u8, exact (checked: AVX-512 F/BW/VL/VNNI).
    ///
    /// `vpdpbusd` multiplies unsigned by signed bytes, so `b` is shifted into
    /// i8 range (`b - 128`, an xor of the sign bit) and the shift is added
    /// back: `a·b = a·(b - 128) + 128·Σa`, with `Σa` from `vpsadbw`.
    /// Arithmetic wraps mod 2^32, which is exact whenever `a·b < 2^32`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn dot_u8_vnni(a: &[u8], b: &[u8]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let flip = _mm512_set1_epi8(i8::MIN);
        let z = _mm512_setzero_si512();
        let mut acc0 = _mm512_setzero_si512();
        let mut acc1 = _mm512_setzero_si512();
        let mut sum_a = _mm512_setzero_si512();
        let mut i = 0;
        // SAFETY: full loads read 64 bytes below `n`; the tail is masked.
        // Masked-off lanes of `a` are zero, so they add nothing to either sum.
        while i + 128 <= n {
            let a0 = load_u8x64(pa.add(i));
            let b0 = _mm512_xor_si512(load_u8x64(pb.add(i)), flip);
            let a1 = load_u8x64(pa.add(i + 64));
            let b1 = _mm512_xor_si512(load_u8x64(pb.add(i + 64)), flip);
            acc0 = _mm512_dpbusd_epi32(acc0, a0, b0);
            acc1 = _mm512_dpbusd_epi32(acc1, a1, b1);
            sum_a = _mm512_add_epi64(sum_a, _mm512_sad_epu8(a0, z));
            sum_a = _mm512_add_epi64(sum_a, _mm512_sad_epu8(a1, z));
            i += 128;
        }
        while i < n {
            let k = mask64(n - i);
            let a0 = load_u8x64_masked(k, pa.add(i));
            let b0 = _mm512_xor_si512(load_u8x64_masked(k, pb.add(i)), flip);
            acc0 = _mm512_dpbusd_epi32(acc0, a0, b0);
            sum_a = _mm512_add_epi64(sum_a, _mm512_sad_epu8(a0, z));
            i += 64;
        }
        let dot_shifted = _mm512_reduce_add_epi32(_mm512_add_epi32(acc0, acc1)) as u32;
        let sa = _mm512_reduce_add_epi64(sum_a) as u32;
        dot_shifted.wrapping_add(sa.wrapping_mul(128)) as f32
    }

    /// Inner product over i8, exact (checked: AVX-512 F/BW/VL/VNNI).
    ///
    /// `a` is shifted into u8 range (`a + 128`, an xor of the sign bit):
    /// `a·b = (a + 128)·b - 128·Σb`, with `Σb` from `vpdpbusd(1, b)`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn dot_i8_vnni(a: &[i8], b: &[i8]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr() as *const u8, b.as_ptr() as *const u8);
        let flip = _mm512_set1_epi8(i8::MIN);
        let ones = _mm512_set1_epi8(1);
        let mut acc0 = _mm512_setzero_si512();
        let mut acc1 = _mm512_setzero_si512();
        let mut sum_b = _mm512_setzero_si512();
        let mut i = 0;
        // SAFETY: full loads read 64 bytes below `n`; the tail is masked.
        // Masked-off lanes of `b` are zero, so they add nothing.
        while i + 128 <= n {
            let a0 = _mm512_xor_si512(load_u8x64(pa.add(i)), flip);
            let b0 = load_u8x64(pb.add(i));
            let a1 = _mm512_xor_si512(load_u8x64(pa.add(i + 64)), flip);
            let b1 = load_u8x64(pb.add(i + 64));
            acc0 = _mm512_dpbusd_epi32(acc0, a0, b0);
            acc1 = _mm512_dpbusd_epi32(acc1, a1, b1);
            sum_b = _mm512_dpbusd_epi32(sum_b, ones, b0);
            sum_b = _mm512_dpbusd_epi32(sum_b, ones, b1);
            i += 128;
        }
        while i < n {
            let k = mask64(n - i);
            let a0 = _mm512_xor_si512(load_u8x64_masked(k, pa.add(i)), flip);
            let b0 = load_u8x64_masked(k, pb.add(i));
            acc0 = _mm512_dpbusd_epi32(acc0, a0, b0);
            sum_b = _mm512_dpbusd_epi32(sum_b, ones, b0);
            i += 64;
        }
        let shifted = _mm512_reduce_add_epi32(_mm512_add_epi32(acc0, acc1));
        let sb = _mm512_reduce_add_epi32(sum_b);
        shifted.wrapping_sub(sb.wrapping_mul(128)) as f32
    }

    /// PQ asymmetric distances, 16 codes at a time with gathers (checked:
    /// AVX-512 F). Same preconditions as [`super::avx2::pq_adc_batch`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn pq_adc_batch(table: &[f32], m: usize, codes: &[u8], out: &mut [f32]) {
        let n = out.len();
        let mut i = 0;
        if m >= 4 {
            let pt = table.as_ptr();
            let rows = _mm512_mullo_epi32(
                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                _mm512_set1_epi32(m as i32),
            );
            let byte = _mm512_set1_epi32(0xff);
            while i + 16 <= n {
                // SAFETY: as in the AVX2 version, code gathers read bytes
                // `j..j + 4 <= m` of rows below `n`; table indices are below
                // `m * 256 <= table.len()`.
                let base = codes.as_ptr().add(i * m);
                let mut acc = _mm512_setzero_ps();
                let mut j = 0;
                while j < m {
                    let start = j.min(m - 4);
                    let skip = j - start;
                    let g = _mm512_i32gather_epi32::<1>(rows, base.add(start) as *const _);
                    for t in skip..4 {
                        let c = _mm512_and_si512(
                            _mm512_srlv_epi32(g, _mm512_set1_epi32(8 * t as i32)),
                            byte,
                        );
                        let off = _mm512_set1_epi32(((start + t) * 256) as i32);
                        let idx = _mm512_add_epi32(c, off);
                        acc = _mm512_add_ps(acc, _mm512_i32gather_ps::<4>(idx, pt as *const _));
                    }
                    j = start + 4;
                }
                _mm512_storeu_ps(out.as_mut_ptr().add(i), acc);
                i += 16;
            }
        }
        crate::kernels::portable::pq_adc_batch(table, m, &codes[i * m..], &mut out[i..]);
    }
}
