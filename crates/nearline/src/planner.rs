//! Presets and the automatic choice.
//!
//! A preset names a composition of components (storage, layout, cache,
//! executor). Today the engine hosts the DiskANN composition: PQ codes in
//! RAM, ID layout, static BFS node cache, synchronous beam search; `auto`
//! resolves to it. Later presets add their layouts and executors here.
//!
//! Only this module knows the seed papers' decision rules; the components
//! it chooses between stay ignorant of each other.

use crate::search::ExecutorKind;
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

/// The executor a search runs: `Beam` or `Pipeline`, never `Auto`.
///
/// For `Auto`, seed 002's rule: with fewer than two records per block a
/// search is I/O-driven (each read yields one record, so keeping the device
/// busy matters most) and the pipelined executor wins; with two or more the
/// search is compute-driven and the synchronous beam wins. Asking for a
/// beam-only option (adaptive width, early dispatch) with `Auto` picks the
/// beam, since that is the executor the option configures.
pub fn choose_executor(
    requested: ExecutorKind,
    records_per_block: usize,
    beam_options: bool,
) -> ExecutorKind {
    match requested {
        ExecutorKind::Beam | ExecutorKind::Pipeline => requested,
        ExecutorKind::Auto if beam_options => ExecutorKind::Beam,
        ExecutorKind::Auto if records_per_block < 2 => ExecutorKind::Pipeline,
        ExecutorKind::Auto => ExecutorKind::Beam,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_resolve() {
        assert_eq!(resolve_preset("auto").unwrap(), "diskann");
        assert_eq!(resolve_preset("DiskANN").unwrap(), "diskann");
        let e = resolve_preset("bogus").unwrap_err().to_string();
        assert!(e.contains("unknown preset") && e.contains("diskann"), "{e}");
    }

    #[test]
    fn auto_executor_follows_records_per_block() {
        use ExecutorKind::*;
        assert_eq!(choose_executor(Auto, 1, false), Pipeline);
        assert_eq!(choose_executor(Auto, 2, false), Beam);
        assert_eq!(choose_executor(Auto, 30, false), Beam);
        assert_eq!(choose_executor(Auto, 1, true), Beam);
        assert_eq!(choose_executor(Beam, 1, false), Beam);
        assert_eq!(choose_executor(Pipeline, 30, false), Pipeline);
    }
}
