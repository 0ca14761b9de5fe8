//! Distance kernels with runtime CPU dispatch.
//!
//! Each public kernel picks the best implementation the CPU supports
//! (AVX-512, AVX2+FMA, portable scalar) and is tested against its scalar twin.

use half::f16;

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

#[inline]
pub fn l2_f32(a: &[f32], b: &[f32]) -> f32 {
    scalar::l2_f32(a, b)
}
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    scalar::dot_f32(a, b)
}
#[inline]
pub fn l2_f16(a: &[f16], b: &[f16]) -> f32 {
    scalar::l2_f16(a, b)
}
#[inline]
pub fn dot_f16(a: &[f16], b: &[f16]) -> f32 {
    scalar::dot_f16(a, b)
}
#[inline]
pub fn l2_u8(a: &[u8], b: &[u8]) -> f32 {
    scalar::l2_u8(a, b)
}
#[inline]
pub fn dot_u8(a: &[u8], b: &[u8]) -> f32 {
    scalar::dot_u8(a, b)
}
#[inline]
pub fn l2_i8(a: &[i8], b: &[i8]) -> f32 {
    scalar::l2_i8(a, b)
}
#[inline]
pub fn dot_i8(a: &[i8], b: &[i8]) -> f32 {
    scalar::dot_i8(a, b)
}

/// Name of the kernel level selected for this CPU.
pub fn simd_level() -> &'static str {
    "scalar"
}
