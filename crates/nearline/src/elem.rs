//! Element types of stored vectors and their distance kernels.

use crate::kernels;
use half::f16;
use serde::{Deserialize, Serialize};

/// The element type of stored vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F16,
    U8,
    I8,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 => 2,
            DType::U8 | DType::I8 => 1,
        }
    }
    /// Canonical lowercase name (`float32`, `float16`, `uint8`, `int8`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::U8 => "uint8",
            DType::I8 => "int8",
        }
    }
    /// Parses a dtype name; accepts numpy spellings.
    pub fn parse(s: &str) -> crate::Result<DType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "float" | "<f4" | "f4" => Ok(DType::F32),
            "f16" | "float16" | "half" | "<f2" | "f2" => Ok(DType::F16),
            "u8" | "uint8" | "|u1" | "u1" => Ok(DType::U8),
            "i8" | "int8" | "|i1" | "i1" => Ok(DType::I8),
            other => Err(crate::Error::arg(format!(
                "unknown dtype {other:?}: expected one of float32, float16, uint8, int8"
            ))),
        }
    }
    /// Whether values of this type are floating point.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A vector element type the engine can store and compare.
///
/// The distance methods dispatch once per call to the best SIMD kernel the
/// CPU supports (see [`crate::kernels`]).
pub trait Element:
    Copy + Send + Sync + bytemuck::Pod + PartialEq + std::fmt::Debug + 'static
{
    /// The runtime tag of this type.
    const DTYPE: DType;
    /// Widens to f32.
    fn to_f32(self) -> f32;
    /// Converts from f32; `None` if the value is not exactly representable
    /// (out of range or, for integer types, not an integer).
    fn from_f32(v: f32) -> Option<Self>;
    /// Squared Euclidean distance.
    fn l2_sq(a: &[Self], b: &[Self]) -> f32;
    /// Inner product.
    fn dot(a: &[Self], b: &[Self]) -> f32;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline]
    fn from_f32(v: f32) -> Option<Self> {
        Some(v)
    }
    #[inline]
    fn l2_sq(a: &[Self], b: &[Self]) -> f32 {
        kernels::l2_f32(a, b)
    }
    #[inline]
    fn dot(a: &[Self], b: &[Self]) -> f32 {
        kernels::dot_f32(a, b)
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    #[inline]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline]
    fn from_f32(v: f32) -> Option<Self> {
        let h = f16::from_f32(v);
        if v.is_finite() && !h.is_finite() {
            None
        } else {
            Some(h)
        }
    }
    #[inline]
    fn l2_sq(a: &[Self], b: &[Self]) -> f32 {
        kernels::l2_f16(a, b)
    }
    #[inline]
    fn dot(a: &[Self], b: &[Self]) -> f32 {
        kernels::dot_f16(a, b)
    }
}

impl Element for u8 {
    const DTYPE: DType = DType::U8;
    #[inline]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline]
    fn from_f32(v: f32) -> Option<Self> {
        if v.fract() == 0.0 && (0.0..=255.0).contains(&v) {
            Some(v as u8)
        } else {
            None
        }
    }
    #[inline]
    fn l2_sq(a: &[Self], b: &[Self]) -> f32 {
        kernels::l2_u8(a, b)
    }
    #[inline]
    fn dot(a: &[Self], b: &[Self]) -> f32 {
        kernels::dot_u8(a, b)
    }
}

impl Element for i8 {
    const DTYPE: DType = DType::I8;
    #[inline]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline]
    fn from_f32(v: f32) -> Option<Self> {
        if v.fract() == 0.0 && (-128.0..=127.0).contains(&v) {
            Some(v as i8)
        } else {
            None
        }
    }
    #[inline]
    fn l2_sq(a: &[Self], b: &[Self]) -> f32 {
        kernels::l2_i8(a, b)
    }
    #[inline]
    fn dot(a: &[Self], b: &[Self]) -> f32 {
        kernels::dot_i8(a, b)
    }
}

/// Calls `$body` with the type alias `$T` bound to the Rust element type of
/// the runtime `DType` `$dt`: the one place runtime dtypes become generics.
#[macro_export]
macro_rules! with_dtype {
    ($dt:expr, $T:ident, $body:expr) => {
        match $dt {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::DType::I8 => {
                type $T = i8;
                $body
            }
        }
    };
}
