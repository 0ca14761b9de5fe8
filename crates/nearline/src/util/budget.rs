//! Memory budgets as users write them: bytes, sizes with units, or a
//! fraction of the raw vector bytes (as Milvus expresses DiskANN budgets).

use crate::{Error, Result};

/// A memory budget before it is resolved against a data size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    /// An absolute number of bytes.
    Bytes(u64),
    /// A fraction in (0, 1] of the raw vector bytes.
    Fraction(f64),
}

impl Budget {
    /// Parses `"1048576"`, `"512MB"` (10^6·512), `"2GiB"` (2^31), `"0.25"`
    /// (a fraction of the raw vector bytes, in (0, 1]). Case-insensitive;
    /// `"0"` is a budget of zero bytes.
    pub fn parse(s: &str) -> Result<Budget> {
        let t = s.trim();
        let bad = || {
            Error::arg(format!(
                "invalid memory budget {s:?}: expected bytes (\"1048576\"), a size with a unit \
                 (\"512MB\", \"2GiB\"; units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB) or a fraction \
                 of the raw vector bytes in (0, 1] (\"0.25\")"
            ))
        };
        if t.is_empty() {
            return Err(bad());
        }
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let num = num.replace('_', "");
        let unit = unit.trim().to_ascii_lowercase();
        if unit.is_empty() {
            if num.contains('.') {
                let f: f64 = num.parse().map_err(|_| bad())?;
                return Budget::fraction(f);
            }
            let b: u64 = num.parse().map_err(|_| bad())?;
            return Ok(Budget::Bytes(b));
        }
        let mult: f64 = match unit.as_str() {
            "b" => 1.0,
            "kb" | "k" => 1e3,
            "mb" | "m" => 1e6,
            "gb" | "g" => 1e9,
            "tb" | "t" => 1e12,
            "kib" => 1024.0,
            "mib" => 1024.0 * 1024.0,
            "gib" => 1024.0 * 1024.0 * 1024.0,
            "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
            _ => return Err(bad()),
        };
        let v: f64 = num.parse().map_err(|_| bad())?;
        if !v.is_finite() || v < 0.0 {
            return Err(bad());
        }
        Ok(Budget::Bytes((v * mult).round() as u64))
    }

    /// A fraction budget; errors outside (0, 1] or when not finite.
    pub fn fraction(f: f64) -> Result<Budget> {
        if f.is_finite() && f > 0.0 && f <= 1.0 {
            Ok(Budget::Fraction(f))
        } else {
            Err(Error::arg(format!(
                "memory budget fraction {f} is out of range: a fraction of the raw vector bytes must be in (0, 1]"
            )))
        }
    }

    /// Bytes this budget allows for data whose raw vectors take `raw_bytes`.
    pub fn resolve(&self, raw_bytes: u64) -> u64 {
        match *self {
            Budget::Bytes(b) => b,
            Budget::Fraction(f) => (raw_bytes as f64 * f).floor() as u64,
        }
    }
}

impl std::fmt::Display for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Budget::Bytes(b) => write!(f, "{b}"),
            Budget::Fraction(x) => write!(f, "{x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_fractions() {
        assert_eq!(Budget::parse("512MB").unwrap(), Budget::Bytes(512_000_000));
        assert_eq!(Budget::parse("2GiB").unwrap(), Budget::Bytes(1 << 31));
        assert_eq!(Budget::parse("2 gib").unwrap(), Budget::Bytes(1 << 31));
        assert_eq!(Budget::parse("1048576").unwrap(), Budget::Bytes(1_048_576));
        assert_eq!(Budget::parse("0").unwrap(), Budget::Bytes(0));
        assert_eq!(Budget::parse("0.25").unwrap(), Budget::Fraction(0.25));
        assert_eq!(Budget::parse("1.0").unwrap(), Budget::Fraction(1.0));
        assert_eq!(
            Budget::parse("1.5GB").unwrap(),
            Budget::Bytes(1_500_000_000)
        );
        assert_eq!(Budget::Fraction(0.25).resolve(1000), 250);
    }

    #[test]
    fn rejects_bad_budgets() {
        for s in ["", "abc", "1.5", "0.0", "-3", "12XB", "nan", "1e9"] {
            assert!(Budget::parse(s).is_err(), "{s} should be rejected");
        }
        assert!(Budget::fraction(f64::NAN).is_err());
        assert!(Budget::fraction(0.0).is_err());
    }
}
