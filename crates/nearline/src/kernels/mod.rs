//! Distance kernels with runtime CPU dispatch.
//!
//! Each public kernel picks the best implementation the CPU supports
//! (AVX-512, AVX2+FMA, portable scalar) and is tested against its scalar twin.
//!
//! The level is chosen once per process (the first call) and cached in an
//! atomic, so dispatch is one relaxed load and a predictable branch. The
//! environment variable `NEARLINE_SIMD` (`scalar`, `avx2`, `avx512`, or
//! `avx512bw` for AVX-512 without VNNI) caps the level, for tests and
//! benchmarks; a level the CPU lacks is never selected.
//!
//! Like the scalar reference, every kernel compares the first
//! `min(a.len(), b.len())` elements. Integer kernels are exact (i32/u32
//! accumulation); float kernels sum in a different order than the scalar
//! reference and agree with it to a few ulps of the sum of magnitudes.

use half::f16;
use std::sync::atomic::{AtomicU8, Ordering};

#[cfg(target_arch = "x86_64")]
mod x86;

/// Scalar reference implementations: the portable fallback and the test oracle.
pub mod scalar {
    use half::f16;

    pub fn l2_f32(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
    }
    pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }
    pub fn l2_f16(a: &[f16], b: &[f16]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(x, y)| {
                let d = x.to_f32() - y.to_f32();
                d * d
            })
            .sum()
    }
    pub fn dot_f16(a: &[f16], b: &[f16]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x.to_f32() * y.to_f32()).sum()
    }
    pub fn l2_u8(a: &[u8], b: &[u8]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| {
                let d = x as i32 - y as i32;
                (d * d) as u32
            })
            .sum::<u32>() as f32
    }
    pub fn dot_u8(a: &[u8], b: &[u8]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| x as u32 * y as u32)
            .sum::<u32>() as f32
    }
    pub fn l2_i8(a: &[i8], b: &[i8]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| {
                let d = x as i32 - y as i32;
                d * d
            })
            .sum::<i32>() as f32
    }
    pub fn dot_i8(a: &[i8], b: &[i8]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| x as i32 * y as i32)
            .sum::<i32>() as f32
    }
}

/// Portable implementations: the `scalar` level. Written with fixed-width
/// lane arrays so the compiler vectorises them for the baseline target
/// (SSE2 on x86_64, NEON on aarch64) while keeping several accumulators.
pub mod portable {
    use half::f16;

    const LANES: usize = 16;

    #[inline]
    fn reduce(acc: [f32; LANES]) -> f32 {
        let mut w = [0f32; LANES / 2];
        for k in 0..LANES / 2 {
            w[k] = acc[k] + acc[k + LANES / 2];
        }
        let mut v = [0f32; LANES / 4];
        for k in 0..LANES / 4 {
            v[k] = w[k] + w[k + LANES / 4];
        }
        (v[0] + v[2]) + (v[1] + v[3])
    }

    pub fn l2_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let mut acc = [0f32; LANES];
        let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
        let (ra, rb) = (ca.remainder(), cb.remainder());
        for (x, y) in ca.zip(cb) {
            for k in 0..LANES {
                let d = x[k] - y[k];
                acc[k] += d * d;
            }
        }
        for (k, (x, y)) in ra.iter().zip(rb).enumerate() {
            let d = x - y;
            acc[k] += d * d;
        }
        reduce(acc)
    }

    pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let mut acc = [0f32; LANES];
        let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
        let (ra, rb) = (ca.remainder(), cb.remainder());
        for (x, y) in ca.zip(cb) {
            for k in 0..LANES {
                acc[k] += x[k] * y[k];
            }
        }
        for (k, (x, y)) in ra.iter().zip(rb).enumerate() {
            acc[k] += x * y;
        }
        reduce(acc)
    }

    /// Exact f16 -> f32 conversion written with integer and float ops only
    /// (no tables, no branches), so loops over it vectorise. Normal and
    /// subnormal halves are rescaled by 2^112; infinities and NaNs keep
    /// their payload under an all-ones exponent.
    #[inline(always)]
    pub fn f16_to_f32(h: f16) -> f32 {
        let h = h.to_bits() as u32;
        let sign = (h & 0x8000) << 16;
        let em = h & 0x7fff;
        let scaled = (f32::from_bits(em << 13) * f32::from_bits(0x7780_0000)).to_bits();
        let special = (em << 13) | 0x7f80_0000;
        let bits = if em >= 0x7c00 { special } else { scaled };
        f32::from_bits(bits | sign)
    }

    /// Folds `f(acc_lane, x, y)` over 16-lane chunks of `a` and `b`
    /// converted to f32, then reduces the lanes.
    #[inline(always)]
    fn fold_f16(a: &[f16], b: &[f16], f: impl Fn(f32, f32, f32) -> f32) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let mut acc = [0f32; LANES];
        let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
        let (ra, rb) = (ca.remainder(), cb.remainder());
        for (x, y) in ca.zip(cb) {
            for k in 0..LANES {
                acc[k] = f(acc[k], f16_to_f32(x[k]), f16_to_f32(y[k]));
            }
        }
        for (k, (x, y)) in ra.iter().zip(rb).enumerate() {
            acc[k] = f(acc[k], f16_to_f32(*x), f16_to_f32(*y));
        }
        reduce(acc)
    }

    pub fn l2_f16(a: &[f16], b: &[f16]) -> f32 {
        fold_f16(a, b, |s, x, y| s + (x - y) * (x - y))
    }

    pub fn dot_f16(a: &[f16], b: &[f16]) -> f32 {
        fold_f16(a, b, |s, x, y| s + x * y)
    }

    pub fn l2_u8(a: &[u8], b: &[u8]) -> f32 {
        let n = a.len().min(b.len());
        let mut s = 0u32;
        for (x, y) in a[..n].iter().zip(&b[..n]) {
            let d = x.abs_diff(*y) as u32;
            s = s.wrapping_add(d * d);
        }
        s as f32
    }

    pub fn dot_u8(a: &[u8], b: &[u8]) -> f32 {
        let n = a.len().min(b.len());
        let mut s = 0u32;
        for (x, y) in a[..n].iter().zip(&b[..n]) {
            s = s.wrapping_add(*x as u32 * *y as u32);
        }
        s as f32
    }

    pub fn l2_i8(a: &[i8], b: &[i8]) -> f32 {
        let n = a.len().min(b.len());
        let mut s = 0i32;
        for (x, y) in a[..n].iter().zip(&b[..n]) {
            let d = *x as i32 - *y as i32;
            s = s.wrapping_add(d * d);
        }
        s as f32
    }

    pub fn dot_i8(a: &[i8], b: &[i8]) -> f32 {
        let n = a.len().min(b.len());
        let mut s = 0i32;
        for (x, y) in a[..n].iter().zip(&b[..n]) {
            s = s.wrapping_add(*x as i32 * *y as i32);
        }
        s as f32
    }

    /// PQ asymmetric distances, four codes at a time for instruction-level
    /// parallelism, reading the code bytes eight at a time. Each sum runs
    /// over `j` in order (bit-identical to the reference).
    /// Preconditions (checked by the public wrapper): `m > 0`,
    /// `table.len() >= m * 256`, `out.len() * m <= codes.len()`.
    pub fn pq_adc_batch(table: &[f32], m: usize, codes: &[u8], out: &mut [f32]) {
        // Sub-tables as fixed-size arrays: a byte index needs no bounds check.
        let subs: &[[f32; 256]] = bytemuck::cast_slice(&table[..m * 256]);
        let n = out.len();
        let codes = &codes[..n * m];
        let mut rows = codes.chunks_exact(4 * m);
        let mut outs = out.chunks_exact_mut(4);
        for (c, o) in (&mut rows).zip(&mut outs) {
            let (c0, rest) = c.split_at(m);
            let (c1, rest) = rest.split_at(m);
            let (c2, c3) = rest.split_at(m);
            let cs = [c0, c1, c2, c3];
            let mut s = [0f32; 4];
            let full = m / 8 * 8;
            for (jb, t8) in subs[..full].chunks_exact(8).enumerate() {
                let w = cs.map(|c| {
                    let b = &c[jb * 8..jb * 8 + 8];
                    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
                });
                for (k, t) in t8.iter().enumerate() {
                    for r in 0..4 {
                        s[r] += t[((w[r] >> (8 * k)) & 0xff) as usize];
                    }
                }
            }
            for (j, t) in subs.iter().enumerate().skip(full) {
                for r in 0..4 {
                    s[r] += t[cs[r][j] as usize];
                }
            }
            o.copy_from_slice(&s);
        }
        for (c, o) in rows.remainder().chunks_exact(m).zip(outs.into_remainder()) {
            let mut s = 0f32;
            for (t, &cj) in subs.iter().zip(c) {
                s += t[cj as usize];
            }
            *o = s;
        }
    }
}

/// A SIMD level, from slowest to fastest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SimdLevel {
    /// Portable code (auto-vectorised for the baseline target).
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL (+ FMA, F16C), integer kernels without VNNI.
    Avx512,
    /// AVX-512 F/BW/VL plus VNNI for the integer kernels.
    Avx512Vnni,
}

impl SimdLevel {
    /// Every level, slowest first.
    pub const ALL: [SimdLevel; 4] = [
        SimdLevel::Scalar,
        SimdLevel::Avx2,
        SimdLevel::Avx512,
        SimdLevel::Avx512Vnni,
    ];

    /// Short name: `scalar`, `avx2`, `avx512`, `avx512vnni`.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Avx512Vnni => "avx512vnni",
        }
    }

    /// Whether this CPU can run the level.
    pub fn is_supported(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => {
                SimdLevel::Avx2.is_supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512Vnni => {
                SimdLevel::Avx512.is_supported() && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    fn code(self) -> u8 {
        self as u8 + 1
    }

    fn from_code(c: u8) -> Option<SimdLevel> {
        SimdLevel::ALL.get((c as usize).wrapping_sub(1)).copied()
    }
}

impl std::fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The best level this CPU supports (ignores `NEARLINE_SIMD`).
pub fn detected_level() -> SimdLevel {
    SimdLevel::ALL
        .iter()
        .rev()
        .copied()
        .find(|l| l.is_supported())
        .unwrap_or(SimdLevel::Scalar)
}

/// Every level this CPU supports, slowest first.
pub fn supported_levels() -> Vec<SimdLevel> {
    SimdLevel::ALL
        .iter()
        .copied()
        .filter(|l| l.is_supported())
        .collect()
}

/// Applies a `NEARLINE_SIMD` value to the best supported level: the value
/// caps the level; unknown or empty values leave `best` unchanged.
pub fn resolve_level(env: Option<&str>, best: SimdLevel) -> SimdLevel {
    let cap = match env.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
        Some("scalar" | "portable" | "none" | "off") => SimdLevel::Scalar,
        Some("avx2") => SimdLevel::Avx2,
        Some("avx512bw" | "avx512-novnni" | "avx512novnni") => SimdLevel::Avx512,
        Some("avx512" | "avx512vnni" | "avx512-vnni") => SimdLevel::Avx512Vnni,
        _ => return best,
    };
    best.min(cap)
}

static LEVEL: AtomicU8 = AtomicU8::new(0);

#[cold]
#[inline(never)]
fn init_level() -> SimdLevel {
    let env = std::env::var("NEARLINE_SIMD").ok();
    let level = resolve_level(env.as_deref(), detected_level());
    // Racing initialisations compute the same value.
    LEVEL.store(level.code(), Ordering::Relaxed);
    level
}

/// The level the public kernels use (detected once, capped by `NEARLINE_SIMD`).
#[inline(always)]
pub fn selected_level() -> SimdLevel {
    match SimdLevel::from_code(LEVEL.load(Ordering::Relaxed)) {
        Some(l) => l,
        None => init_level(),
    }
}

/// Name of the level the public kernels use: `scalar`, `avx2`, `avx512` or
/// `avx512vnni`.
pub fn simd_level() -> &'static str {
    selected_level().name()
}

/// Generates a public dispatching kernel. `$a512` is the AVX-512 function
/// without VNNI and `$vnni` the one for the VNNI level.
macro_rules! dispatch {
    ($(#[$doc:meta])* $name:ident, $t:ty, $a512:ident, $vnni:ident) => {
        $(#[$doc])*
        #[inline]
        pub fn $name(a: &[$t], b: &[$t]) -> f32 {
            #[cfg(target_arch = "x86_64")]
            match selected_level() {
                // SAFETY: the level is only selected when the CPU supports
                // every feature its functions are compiled for.
                SimdLevel::Avx512Vnni => return unsafe { x86::avx512::$vnni(a, b) },
                // SAFETY: as above.
                SimdLevel::Avx512 => return unsafe { x86::avx512::$a512(a, b) },
                // SAFETY: as above.
                SimdLevel::Avx2 => return unsafe { x86::avx2::$name(a, b) },
                SimdLevel::Scalar => {}
            }
            portable::$name(a, b)
        }
    };
}

dispatch!(
    /// Squared Euclidean distance over f32.
    l2_f32, f32, l2_f32, l2_f32
);
dispatch!(
    /// Inner product over f32.
    dot_f32, f32, dot_f32, dot_f32
);
dispatch!(
    /// Squared Euclidean distance over f16, computed in f32.
    l2_f16, f16, l2_f16, l2_f16
);
dispatch!(
    /// Inner product over f16, computed in f32.
    dot_f16, f16, dot_f16, dot_f16
);
dispatch!(
    /// Squared Euclidean distance over u8 (exact integer sum).
    l2_u8, u8, l2_u8, l2_u8_vnni
);
dispatch!(
    /// Inner product over u8 (exact integer sum).
    dot_u8, u8, dot_u8, dot_u8_vnni
);
dispatch!(
    /// Squared Euclidean distance over i8 (exact integer sum).
    l2_i8, i8, l2_i8, l2_i8_vnni
);
dispatch!(
    /// Inner product over i8 (exact integer sum).
    dot_i8, i8, dot_i8, dot_i8_vnni
);

/// Reference PQ asymmetric distance computation: for each of the
/// `codes.len() / m` codes, `sum_j table[j * 256 + code[j]]`.
pub fn pq_adc_batch_scalar(table: &[f32], m: usize, codes: &[u8], out: &mut [f32]) {
    if m == 0 {
        out.fill(0.0);
        return;
    }
    for (c, o) in codes.chunks_exact(m).zip(out.iter_mut()) {
        let mut s = 0f32;
        for (j, &cj) in c.iter().enumerate() {
            s += table[j * 256 + cj as usize];
        }
        *o = s;
    }
}

/// Checks the PQ ADC arguments; returns the number of codes to compute.
fn pq_adc_count(table: &[f32], m: usize, codes: &[u8], out: &mut [f32]) -> usize {
    assert!(
        table.len() >= m * 256,
        "pq_adc_batch: table has {} entries, expected at least m * 256 = {}",
        table.len(),
        m * 256
    );
    assert!(
        m * 256 <= i32::MAX as usize,
        "pq_adc_batch: m = {m} is too large"
    );
    if m == 0 {
        out.fill(0.0);
        return 0;
    }
    (codes.len() / m).min(out.len())
}

/// PQ asymmetric distance computation (ADC) for a batch of codes.
///
/// `table` holds `m` sub-tables of 256 partial distances (`table[j * 256 +
/// c]`), `codes` holds row-major codes of `m` bytes each. For each of the
/// `min(codes.len() / m, out.len())` codes, writes
/// `out[i] = sum_j table[j * 256 + codes[i * m + j]]`, summed over `j` in
/// order (bit-identical to [`pq_adc_batch_scalar`]). With `m == 0`, `out`
/// is zeroed.
///
/// # Panics
/// If `table.len() < m * 256`: a caller bug, not a data error.
#[inline]
pub fn pq_adc_batch(table: &[f32], m: usize, codes: &[u8], out: &mut [f32]) {
    let n = pq_adc_count(table, m, codes, out);
    if n == 0 {
        return;
    }
    // The gather versions (see [`kernel_set`]) were slower than the
    // interleaved scalar loop on AMD Zen (AVX2), so every level uses it.
    portable::pq_adc_batch(table, m, &codes[..n * m], &mut out[..n])
}

/// The kernels of one SIMD level, as plain function pointers: lets tests and
/// benchmarks run a given level regardless of the one selected.
#[derive(Debug, Clone, Copy)]
pub struct KernelSet {
    pub level: SimdLevel,
    pub l2_f32: fn(&[f32], &[f32]) -> f32,
    pub dot_f32: fn(&[f32], &[f32]) -> f32,
    pub l2_f16: fn(&[f16], &[f16]) -> f32,
    pub dot_f16: fn(&[f16], &[f16]) -> f32,
    pub l2_u8: fn(&[u8], &[u8]) -> f32,
    pub dot_u8: fn(&[u8], &[u8]) -> f32,
    pub l2_i8: fn(&[i8], &[i8]) -> f32,
    pub dot_i8: fn(&[i8], &[i8]) -> f32,
    pub pq_adc_batch: fn(&[f32], usize, &[u8], &mut [f32]),
}

/// Wraps the portable PQ ADC with the public argument checks.
fn pq_adc_portable(table: &[f32], m: usize, codes: &[u8], out: &mut [f32]) {
    let n = pq_adc_count(table, m, codes, out);
    if n > 0 {
        portable::pq_adc_batch(table, m, &codes[..n * m], &mut out[..n]);
    }
}

static PORTABLE_SET: KernelSet = KernelSet {
    level: SimdLevel::Scalar,
    l2_f32: portable::l2_f32,
    dot_f32: portable::dot_f32,
    l2_f16: portable::l2_f16,
    dot_f16: portable::dot_f16,
    l2_u8: portable::l2_u8,
    dot_u8: portable::dot_u8,
    l2_i8: portable::l2_i8,
    dot_i8: portable::dot_i8,
    pq_adc_batch: pq_adc_portable,
};

#[cfg(target_arch = "x86_64")]
mod x86_sets {
    //! Safe wrappers of the x86 kernels. They are reachable only through
    //! [`super::kernel_set`], which hands a set out only when the CPU
    //! supports its level.
    use super::{pq_adc_count, x86, KernelSet, SimdLevel};
    use half::f16;

    macro_rules! wrap {
        ($w:ident, $path:path, $t:ty) => {
            fn $w(a: &[$t], b: &[$t]) -> f32 {
                // SAFETY: only stored in the KernelSet of a level whose CPU
                // features are checked before the set is handed out.
                unsafe { $path(a, b) }
            }
        };
    }
    wrap!(l2_f32_avx2, x86::avx2::l2_f32, f32);
    wrap!(dot_f32_avx2, x86::avx2::dot_f32, f32);
    wrap!(l2_f16_avx2, x86::avx2::l2_f16, f16);
    wrap!(dot_f16_avx2, x86::avx2::dot_f16, f16);
    wrap!(l2_u8_avx2, x86::avx2::l2_u8, u8);
    wrap!(dot_u8_avx2, x86::avx2::dot_u8, u8);
    wrap!(l2_i8_avx2, x86::avx2::l2_i8, i8);
    wrap!(dot_i8_avx2, x86::avx2::dot_i8, i8);
    wrap!(l2_f32_avx512, x86::avx512::l2_f32, f32);
    wrap!(dot_f32_avx512, x86::avx512::dot_f32, f32);
    wrap!(l2_f16_avx512, x86::avx512::l2_f16, f16);
    wrap!(dot_f16_avx512, x86::avx512::dot_f16, f16);
    wrap!(l2_u8_avx512, x86::avx512::l2_u8, u8);
    wrap!(dot_u8_avx512, x86::avx512::dot_u8, u8);
    wrap!(l2_i8_avx512, x86::avx512::l2_i8, i8);
    wrap!(dot_i8_avx512, x86::avx512::dot_i8, i8);
    wrap!(l2_u8_vnni, x86::avx512::l2_u8_vnni, u8);
    wrap!(dot_u8_vnni, x86::avx512::dot_u8_vnni, u8);
    wrap!(l2_i8_vnni, x86::avx512::l2_i8_vnni, i8);
    wrap!(dot_i8_vnni, x86::avx512::dot_i8_vnni, i8);

    fn pq_avx2(table: &[f32], m: usize, codes: &[u8], out: &mut [f32]) {
        let n = pq_adc_count(table, m, codes, out);
        if n > 0 {
            // SAFETY: AVX2 checked before the set is handed out; arguments
            // checked by `pq_adc_count`.
            unsafe { x86::avx2::pq_adc_batch(table, m, &codes[..n * m], &mut out[..n]) }
        }
    }
    fn pq_avx512(table: &[f32], m: usize, codes: &[u8], out: &mut [f32]) {
        let n = pq_adc_count(table, m, codes, out);
        if n > 0 {
            // SAFETY: as above, for AVX-512.
            unsafe { x86::avx512::pq_adc_batch(table, m, &codes[..n * m], &mut out[..n]) }
        }
    }

    pub(super) static AVX2_SET: KernelSet = KernelSet {
        level: SimdLevel::Avx2,
        l2_f32: l2_f32_avx2,
        dot_f32: dot_f32_avx2,
        l2_f16: l2_f16_avx2,
        dot_f16: dot_f16_avx2,
        l2_u8: l2_u8_avx2,
        dot_u8: dot_u8_avx2,
        l2_i8: l2_i8_avx2,
        dot_i8: dot_i8_avx2,
        pq_adc_batch: pq_avx2,
    };
    pub(super) static AVX512_SET: KernelSet = KernelSet {
        level: SimdLevel::Avx512,
        l2_f32: l2_f32_avx512,
        dot_f32: dot_f32_avx512,
        l2_f16: l2_f16_avx512,
        dot_f16: dot_f16_avx512,
        l2_u8: l2_u8_avx512,
        dot_u8: dot_u8_avx512,
        l2_i8: l2_i8_avx512,
        dot_i8: dot_i8_avx512,
        pq_adc_batch: pq_avx512,
    };
    pub(super) static AVX512_VNNI_SET: KernelSet = KernelSet {
        level: SimdLevel::Avx512Vnni,
        l2_u8: l2_u8_vnni,
        dot_u8: dot_u8_vnni,
        l2_i8: l2_i8_vnni,
        dot_i8: dot_i8_vnni,
        ..AVX512_SET
    };
}

/// The kernels of `level`, or `None` if this CPU cannot run it.
pub fn kernel_set(level: SimdLevel) -> Option<&'static KernelSet> {
    if !level.is_supported() {
        return None;
    }
    match level {
        SimdLevel::Scalar => Some(&PORTABLE_SET),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => Some(&x86_sets::AVX2_SET),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => Some(&x86_sets::AVX512_SET),
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni => Some(&x86_sets::AVX512_VNNI_SET),
        #[cfg(not(target_arch = "x86_64"))]
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const LENS: [usize; 22] = [
        0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 384,
    ];
    const LONG_LENS: [usize; 6] = [768, 960, 1023, 1024, 1025, 4099];

    fn all_lens() -> impl Iterator<Item = usize> {
        LENS.iter().chain(LONG_LENS.iter()).copied()
    }

    fn sets() -> Vec<&'static KernelSet> {
        let v: Vec<_> = SimdLevel::ALL
            .iter()
            .filter_map(|&l| kernel_set(l))
            .collect();
        assert!(!v.is_empty());
        v
    }

    /// Float tolerance: a few ulps of the sum of magnitudes of the terms.
    fn tol(terms: impl Iterator<Item = f32>) -> f32 {
        let mag: f64 = terms.map(|t| t.abs() as f64).sum();
        (1e-5 * mag) as f32 + f32::MIN_POSITIVE
    }

    fn check_f32(set: &KernelSet, a: &[f32], b: &[f32]) {
        let l2 = (set.l2_f32)(a, b);
        let want = scalar::l2_f32(a, b);
        let t = tol(a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)));
        assert!(
            (l2 - want).abs() <= t,
            "{} l2_f32 n={}: {l2} vs {want}",
            set.level,
            a.len()
        );
        let dot = (set.dot_f32)(a, b);
        let want = scalar::dot_f32(a, b);
        let t = tol(a.iter().zip(b).map(|(x, y)| x * y));
        assert!(
            (dot - want).abs() <= t,
            "{} dot_f32 n={}: {dot} vs {want}",
            set.level,
            a.len()
        );
    }

    fn check_f16(set: &KernelSet, a: &[f16], b: &[f16]) {
        let fa = || a.iter().map(|x| x.to_f32());
        let fb = || b.iter().map(|x| x.to_f32());
        let l2 = (set.l2_f16)(a, b);
        let want = scalar::l2_f16(a, b);
        let t = tol(fa().zip(fb()).map(|(x, y)| (x - y) * (x - y)));
        assert!(
            (l2 - want).abs() <= t,
            "{} l2_f16 n={}: {l2} vs {want}",
            set.level,
            a.len()
        );
        let dot = (set.dot_f16)(a, b);
        let want = scalar::dot_f16(a, b);
        let t = tol(fa().zip(fb()).map(|(x, y)| x * y));
        assert!(
            (dot - want).abs() <= t,
            "{} dot_f16 n={}: {dot} vs {want}",
            set.level,
            a.len()
        );
    }

    fn check_u8(set: &KernelSet, a: &[u8], b: &[u8]) {
        assert_eq!(
            (set.l2_u8)(a, b),
            scalar::l2_u8(a, b),
            "{} l2_u8 n={}",
            set.level,
            a.len()
        );
        assert_eq!(
            (set.dot_u8)(a, b),
            scalar::dot_u8(a, b),
            "{} dot_u8 n={}",
            set.level,
            a.len()
        );
    }

    fn check_i8(set: &KernelSet, a: &[i8], b: &[i8]) {
        assert_eq!(
            (set.l2_i8)(a, b),
            scalar::l2_i8(a, b),
            "{} l2_i8 n={}",
            set.level,
            a.len()
        );
        assert_eq!(
            (set.dot_i8)(a, b),
            scalar::dot_i8(a, b),
            "{} dot_i8 n={}",
            set.level,
            a.len()
        );
    }

    fn rand_f32(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| rng.random_range(-1.0f32..1.0) * scale)
            .collect()
    }

    #[test]
    fn f32_kernels_match_scalar_at_every_level() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for set in sets() {
            for n in all_lens() {
                for scale in [1.0f32, 1e-20, 1e15] {
                    // One extra element so that `[1..]` is misaligned.
                    let a = rand_f32(&mut rng, n + 1, scale);
                    let b = rand_f32(&mut rng, n + 1, scale);
                    check_f32(set, &a[..n], &b[..n]);
                    check_f32(set, &a[1..], &b[1..]);
                    check_f32(set, &a[..n], &a[..n]);
                }
            }
        }
    }

    #[test]
    fn f16_kernels_match_scalar_at_every_level() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for set in sets() {
            for n in all_lens() {
                for scale in [1.0f32, 1e-4, 200.0] {
                    let a: Vec<f16> = rand_f32(&mut rng, n + 1, scale)
                        .into_iter()
                        .map(f16::from_f32)
                        .collect();
                    let b: Vec<f16> = rand_f32(&mut rng, n + 1, scale)
                        .into_iter()
                        .map(f16::from_f32)
                        .collect();
                    check_f16(set, &a[..n], &b[..n]);
                    check_f16(set, &a[1..], &b[1..]);
                }
                // Extremes: the largest finite halves.
                let a = vec![f16::MAX; n];
                let b = vec![f16::MIN; n];
                check_f16(set, &a, &b);
            }
        }
    }

    #[test]
    fn u8_kernels_are_exact_at_every_level() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for set in sets() {
            for n in all_lens() {
                let a: Vec<u8> = (0..n + 1).map(|_| rng.random()).collect();
                let b: Vec<u8> = (0..n + 1).map(|_| rng.random()).collect();
                check_u8(set, &a[..n], &b[..n]);
                check_u8(set, &a[1..], &b[1..]);
                let hi = vec![255u8; n];
                let lo = vec![0u8; n];
                check_u8(set, &hi, &lo);
                check_u8(set, &hi, &hi);
                check_u8(set, &lo, &hi);
                let alt: Vec<u8> = (0..n).map(|i| if i % 2 == 0 { 255 } else { 0 }).collect();
                check_u8(set, &alt, &hi);
            }
            // Largest values: 255^2 * 1024 = 66_585_600 for both l2 and dot.
            let hi = vec![255u8; 1024];
            let lo = vec![0u8; 1024];
            assert_eq!((set.l2_u8)(&hi, &lo), 66_585_600.0);
            assert_eq!((set.dot_u8)(&hi, &hi), 66_585_600.0);
        }
    }

    #[test]
    fn i8_kernels_are_exact_at_every_level() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        for set in sets() {
            for n in all_lens() {
                let a: Vec<i8> = (0..n + 1).map(|_| rng.random()).collect();
                let b: Vec<i8> = (0..n + 1).map(|_| rng.random()).collect();
                check_i8(set, &a[..n], &b[..n]);
                check_i8(set, &a[1..], &b[1..]);
                let hi = vec![127i8; n];
                let lo = vec![-128i8; n];
                check_i8(set, &hi, &lo);
                check_i8(set, &lo, &lo);
                check_i8(set, &hi, &hi);
                check_i8(set, &lo, &hi);
            }
            let lo = vec![-128i8; 1024];
            let hi = vec![127i8; 1024];
            assert_eq!((set.l2_i8)(&hi, &lo), (255 * 255 * 1024) as f32);
            assert_eq!((set.dot_i8)(&lo, &lo), (128 * 128 * 1024) as f32);
            assert_eq!((set.dot_i8)(&lo, &hi), -(128 * 127 * 1024) as f32);
        }
    }

    #[test]
    fn portable_f16_conversion_is_exact_for_every_bit_pattern() {
        for bits in 0..=u16::MAX {
            let h = f16::from_bits(bits);
            let (got, want) = (portable::f16_to_f32(h), h.to_f32());
            if want.is_nan() {
                assert!(got.is_nan(), "{bits:#06x}");
                assert_eq!(got.is_sign_negative(), want.is_sign_negative());
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{bits:#06x}");
            }
        }
    }

    #[test]
    fn kernels_use_the_shorter_length() {
        for set in sets() {
            let a = [1.0f32, 2.0, 3.0, 4.0, 5.0];
            let b = [1.0f32, 1.0, 1.0];
            assert_eq!((set.l2_f32)(&a, &b), 5.0);
            assert_eq!((set.dot_f32)(&b, &a), 6.0);
            let a = [3u8; 40];
            let b = [1u8; 33];
            assert_eq!((set.l2_u8)(&a, &b), 4.0 * 33.0);
            assert_eq!((set.dot_u8)(&b, &a), 3.0 * 33.0);
            let a = [-3i8; 70];
            let b = [2i8; 65];
            assert_eq!((set.l2_i8)(&a, &b), 25.0 * 65.0);
            assert_eq!((set.dot_i8)(&b, &a), -6.0 * 65.0);
            let a = [f16::from_f32(2.0); 19];
            let b = [f16::from_f32(0.5); 17];
            assert_eq!((set.l2_f16)(&a, &b), 2.25 * 17.0);
            assert_eq!((set.dot_f16)(&a, &b), 17.0);
        }
    }

    #[test]
    fn public_kernels_match_scalar() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let a = rand_f32(&mut rng, 300, 1.0);
        let b = rand_f32(&mut rng, 300, 1.0);
        let t = tol(a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)));
        assert!((l2_f32(&a, &b) - scalar::l2_f32(&a, &b)).abs() <= t);
        let t = tol(a.iter().zip(&b).map(|(x, y)| x * y));
        assert!((dot_f32(&a, &b) - scalar::dot_f32(&a, &b)).abs() <= t);
        let ha: Vec<f16> = a.iter().map(|&x| f16::from_f32(x)).collect();
        let hb: Vec<f16> = b.iter().map(|&x| f16::from_f32(x)).collect();
        assert!((l2_f16(&ha, &hb) - scalar::l2_f16(&ha, &hb)).abs() <= 1e-3);
        assert!((dot_f16(&ha, &hb) - scalar::dot_f16(&ha, &hb)).abs() <= 1e-3);
        let ua: Vec<u8> = (0..300).map(|_| rng.random()).collect();
        let ub: Vec<u8> = (0..300).map(|_| rng.random()).collect();
        assert_eq!(l2_u8(&ua, &ub), scalar::l2_u8(&ua, &ub));
        assert_eq!(dot_u8(&ua, &ub), scalar::dot_u8(&ua, &ub));
        let ia: Vec<i8> = (0..300).map(|_| rng.random()).collect();
        let ib: Vec<i8> = (0..300).map(|_| rng.random()).collect();
        assert_eq!(l2_i8(&ia, &ib), scalar::l2_i8(&ia, &ib));
        assert_eq!(dot_i8(&ia, &ib), scalar::dot_i8(&ia, &ib));
    }

    #[test]
    fn level_selection() {
        let sel = selected_level();
        assert!(sel.is_supported());
        assert!(sel <= detected_level());
        assert_eq!(simd_level(), sel.name());
        assert_eq!(selected_level(), sel, "selection is stable");
        assert!(SimdLevel::Scalar.is_supported());
        assert!(kernel_set(SimdLevel::Scalar).is_some());
        for l in SimdLevel::ALL {
            assert_eq!(kernel_set(l).is_some(), l.is_supported());
            if let Some(s) = kernel_set(l) {
                assert_eq!(s.level, l);
            }
            assert_eq!(SimdLevel::from_code(l.code()), Some(l));
        }
        assert_eq!(SimdLevel::from_code(0), None);
        assert_eq!(supported_levels()[0], SimdLevel::Scalar);
        assert_eq!(*supported_levels().last().unwrap(), detected_level());
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            assert!(detected_level() >= SimdLevel::Avx2);
        }
    }

    #[test]
    fn env_override_caps_the_level() {
        use SimdLevel::*;
        assert_eq!(resolve_level(None, Avx512Vnni), Avx512Vnni);
        assert_eq!(resolve_level(Some("scalar"), Avx512Vnni), Scalar);
        assert_eq!(resolve_level(Some(" AVX2 "), Avx512Vnni), Avx2);
        assert_eq!(resolve_level(Some("avx512"), Avx512Vnni), Avx512Vnni);
        assert_eq!(resolve_level(Some("avx512bw"), Avx512Vnni), Avx512);
        assert_eq!(resolve_level(Some("avx512"), Avx512), Avx512);
        // Never above what the CPU supports.
        assert_eq!(resolve_level(Some("avx512"), Avx2), Avx2);
        assert_eq!(resolve_level(Some("avx2"), Scalar), Scalar);
        // Unknown values are ignored.
        assert_eq!(resolve_level(Some("sse9"), Avx2), Avx2);
        assert_eq!(resolve_level(Some(""), Avx2), Avx2);
    }

    fn pq_inputs(rng: &mut ChaCha8Rng, m: usize, n: usize) -> (Vec<f32>, Vec<u8>) {
        let table = rand_f32(rng, m * 256, 10.0);
        let codes = (0..n * m).map(|_| rng.random()).collect();
        (table, codes)
    }

    #[test]
    fn pq_adc_matches_scalar_exactly() {
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        for set in sets() {
            for m in [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 32, 48, 64, 128] {
                for n in [0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100] {
                    let (table, codes) = pq_inputs(&mut rng, m, n);
                    let mut want = vec![f32::NAN; n];
                    pq_adc_batch_scalar(&table, m, &codes, &mut want);
                    let mut got = vec![f32::NAN; n];
                    (set.pq_adc_batch)(&table, m, &codes, &mut got);
                    assert_eq!(got, want, "{} m={m} n={n}", set.level);
                }
            }
        }
        let (table, codes) = pq_inputs(&mut rng, 16, 50);
        let mut want = vec![0f32; 50];
        pq_adc_batch_scalar(&table, 16, &codes, &mut want);
        let mut got = vec![0f32; 50];
        pq_adc_batch(&table, 16, &codes, &mut got);
        assert_eq!(got, want);
    }

    #[test]
    fn pq_adc_extreme_codes_and_short_outputs() {
        for set in sets() {
            let m = 12;
            // Each sub-table holds j*1000 + c, so the sum identifies the codes.
            let table: Vec<f32> = (0..m * 256)
                .map(|i| ((i / 256) * 1000 + i % 256) as f32)
                .collect();
            for fill in [0u8, 255] {
                let codes = vec![fill; 40 * m + 5]; // a partial trailing code is ignored
                let mut out = vec![-1f32; 40];
                (set.pq_adc_batch)(&table, m, &codes, &mut out);
                let want = (0..m).map(|j| (j * 1000) as f32 + fill as f32).sum::<f32>();
                assert!(out.iter().all(|&x| x == want), "{} fill={fill}", set.level);
            }
            // `out` shorter than the batch: only `out.len()` codes are computed.
            let codes = vec![1u8; 40 * m];
            let mut out = vec![-1f32; 20];
            (set.pq_adc_batch)(&table, m, &codes, &mut out);
            assert!(out.iter().all(|&x| x != -1.0));
            // `out` longer than the batch: the rest is left alone.
            let mut out = vec![-1f32; 50];
            (set.pq_adc_batch)(&table, m, &codes, &mut out);
            assert!(out[..40].iter().all(|&x| x != -1.0));
            assert!(out[40..].iter().all(|&x| x == -1.0));
            // m == 0: zeroes.
            let mut out = vec![-1f32; 3];
            (set.pq_adc_batch)(&[], 0, &[], &mut out);
            assert_eq!(out, vec![0.0; 3]);
        }
    }

    #[test]
    #[should_panic(expected = "table has")]
    fn pq_adc_rejects_a_short_table() {
        let mut out = [0f32; 1];
        pq_adc_batch(&[0.0; 255], 1, &[0], &mut out);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn prop_f32(pairs in prop::collection::vec((-1e6f32..1e6, -1e6f32..1e6), 0..1100)) {
            let (a, b): (Vec<f32>, Vec<f32>) = pairs.into_iter().unzip();
            for set in sets() { check_f32(set, &a, &b); }
        }

        #[test]
        fn prop_f16(pairs in prop::collection::vec((-6e4f32..6e4, -6e4f32..6e4), 0..1100)) {
            let a: Vec<f16> = pairs.iter().map(|p| f16::from_f32(p.0)).collect();
            let b: Vec<f16> = pairs.iter().map(|p| f16::from_f32(p.1)).collect();
            for set in sets() { check_f16(set, &a, &b); }
        }

        #[test]
        fn prop_u8(pairs in prop::collection::vec(any::<(u8, u8)>(), 0..1100)) {
            let (a, b): (Vec<u8>, Vec<u8>) = pairs.into_iter().unzip();
            for set in sets() { check_u8(set, &a, &b); }
        }

        #[test]
        fn prop_i8(pairs in prop::collection::vec(any::<(i8, i8)>(), 0..1100)) {
            let (a, b): (Vec<i8>, Vec<i8>) = pairs.into_iter().unzip();
            for set in sets() { check_i8(set, &a, &b); }
        }

        #[test]
        fn prop_pq_adc(m in 1usize..40, n in 0usize..70, seed in any::<u64>()) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let (table, codes) = pq_inputs(&mut rng, m, n);
            let mut want = vec![0f32; n];
            pq_adc_batch_scalar(&table, m, &codes, &mut want);
            for set in sets() {
                let mut got = vec![0f32; n];
                (set.pq_adc_batch)(&table, m, &codes, &mut got);
                prop_assert_eq!(&got, &want);
            }
        }
    }

    /// Rough ns per call for every level (run with
    /// `cargo test -p nearline --release kernels::tests::bench -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn bench_kernels() {
        use std::hint::black_box;
        use std::time::Instant;
        fn time(mut f: impl FnMut() -> f32) -> f64 {
            let iters = 2_000_000u32;
            for _ in 0..10_000 {
                black_box(f());
            }
            let t = Instant::now();
            for _ in 0..iters {
                black_box(f());
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        }
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for dim in [128usize, 384, 960] {
            let fa = rand_f32(&mut rng, dim, 1.0);
            let fb = rand_f32(&mut rng, dim, 1.0);
            let ha: Vec<f16> = fa.iter().map(|&x| f16::from_f32(x)).collect();
            let hb: Vec<f16> = fb.iter().map(|&x| f16::from_f32(x)).collect();
            let ua: Vec<u8> = (0..dim).map(|_| rng.random()).collect();
            let ub: Vec<u8> = (0..dim).map(|_| rng.random()).collect();
            let ia: Vec<i8> = (0..dim).map(|_| rng.random()).collect();
            let ib: Vec<i8> = (0..dim).map(|_| rng.random()).collect();
            for set in sets() {
                println!(
                    "dim {dim:4} {:10}: l2_f32 {:6.1} dot_f32 {:6.1} l2_f16 {:6.1} dot_f16 {:6.1} \
                     l2_u8 {:6.1} dot_u8 {:6.1} l2_i8 {:6.1} dot_i8 {:6.1} ns",
                    set.level.name(),
                    time(|| (set.l2_f32)(black_box(&fa), black_box(&fb))),
                    time(|| (set.dot_f32)(black_box(&fa), black_box(&fb))),
                    time(|| (set.l2_f16)(black_box(&ha), black_box(&hb))),
                    time(|| (set.dot_f16)(black_box(&ha), black_box(&hb))),
                    time(|| (set.l2_u8)(black_box(&ua), black_box(&ub))),
                    time(|| (set.dot_u8)(black_box(&ua), black_box(&ub))),
                    time(|| (set.l2_i8)(black_box(&ia), black_box(&ib))),
                    time(|| (set.dot_i8)(black_box(&ia), black_box(&ib))),
                );
            }
            println!(
                "dim {dim:4} dispatched ({}): l2_f32 {:6.1} ns",
                simd_level(),
                time(|| l2_f32(black_box(&fa), black_box(&fb)))
            );
        }
        for m in [16usize, 32, 64] {
            let n = 64;
            let (table, codes) = pq_inputs(&mut rng, m, n);
            let mut out = vec![0f32; n];
            let mut want = vec![0f32; n];
            let base = time(|| {
                pq_adc_batch_scalar(black_box(&table), m, black_box(&codes), &mut want);
                want[0]
            });
            print!("pq_adc m={m:3} n={n}: reference {base:7.1} ns");
            for set in sets() {
                let t = time(|| {
                    (set.pq_adc_batch)(black_box(&table), m, black_box(&codes), &mut out);
                    out[0]
                });
                print!("  {} {t:7.1}", set.level.name());
            }
            println!();
        }
    }
}
