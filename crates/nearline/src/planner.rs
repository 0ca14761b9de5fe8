//! Presets and the automatic choice.
//!
//! A preset names a composition of components (storage, layout, cache,
//! executor). Today the engine hosts the DiskANN composition: PQ codes in
//! RAM, ID layout, static BFS node cache, synchronous beam search; `auto`
//! resolves to it. Later presets add their layouts and executors here.

use crate::{Error, Result};

/// Presets this build knows.
pub const PRESETS: &[&str] = &["auto", "diskann"];

/// Resolves a preset name to the concrete preset `auto` stands for.
pub fn resolve_preset(name: &str) -> Result<&'static str> {
    match name.to_ascii_lowercase().as_str() {
        "auto" | "diskann" => Ok("diskann"),
        other => Err(Error::arg(format!(
            "unknown preset {other:?}: expected one of {}",
            PRESETS.join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn presets_resolve() {
        assert_eq!(super::resolve_preset("auto").unwrap(), "diskann");
        assert_eq!(super::resolve_preset("DiskANN").unwrap(), "diskann");
        let e = super::resolve_preset("bogus").unwrap_err().to_string();
        assert!(e.contains("unknown preset") && e.contains("diskann"), "{e}");
    }
}
