//! Presets and the automatic choice.
//!
//! A preset names a composition of components (storage, layout, cache,
//! executor). `diskann`: PQ codes in RAM, ID layout, static BFS node cache,
//! medoid entry, synchronous beam search with W = 4; `auto` resolves to it.
//! `pipeann`: the same layout and codes, a navigation graph over 1% of the
//! points for entry, and the pipelined executor with width up to 32.
//! `starling`: block-shuffled layout (BNF), a navigation graph over 1% of
//! the points, block search (σ = 0.3, the shuffled layout's page policy)
//! under the pipelined executor. Later presets add their layouts and
//! executors here.
//!
//! Only this module knows the seed papers' decision rules; the components
//! it chooses between stay ignorant of each other.

use crate::layout::LayoutKind;
use crate::search::ExecutorKind;
use crate::{Error, Result};

/// Presets this build knows.
pub const PRESETS: &[&str] = &["auto", "diskann", "pipeann", "starling"];

/// Resolves a preset name to the concrete preset `auto` stands for.
pub fn resolve_preset(name: &str) -> Result<&'static str> {
    match name.to_ascii_lowercase().as_str() {
        "auto" | "diskann" => Ok("diskann"),
        "pipeann" => Ok("pipeann"),
        "starling" => Ok("starling"),
        other => Err(Error::arg(format!(
            "unknown preset {other:?}: expected one of {}",
            PRESETS.join(", ")
        ))),
    }
}

/// Width of the `starling` preset's pipelined block search.
pub const STARLING_WIDTH: usize = 8;

/// What a preset sets when the caller leaves it open.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PresetDefaults {
    /// Navigation-graph sample rate used when the build gives none (0: none).
    pub nav_sample: f64,
    /// Executor a search with `executor = auto` runs (`Auto`: the layout rule).
    pub executor: ExecutorKind,
    /// Beam / pipeline width when the search gives none.
    pub width: usize,
    /// Record placement when the build gives none.
    pub layout: LayoutKind,
}

/// The defaults of a resolved preset (`diskann` for unknown names).
pub fn preset_defaults(preset: &str) -> PresetDefaults {
    match preset {
        // PipeANN: in-memory index over a ~1% sample, pipelined search whose
        // width grows to 32.
        "pipeann" => PresetDefaults {
            nav_sample: 0.01,
            executor: ExecutorKind::Pipeline,
            width: 32,
            layout: LayoutKind::Id,
        },
        // Starling: shuffled blocks, in-memory navigation graph over ~1%,
        // block search overlapped with the next reads.
        "starling" => PresetDefaults {
            nav_sample: 0.01,
            executor: ExecutorKind::Pipeline,
            width: STARLING_WIDTH,
            layout: LayoutKind::Shuffled,
        },
        _ => PresetDefaults {
            nav_sample: 0.0,
            executor: ExecutorKind::Auto,
            width: 4,
            layout: LayoutKind::Id,
        },
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

/// Queries a worker interleaves when the caller leaves it to the planner
/// and the batch is large enough.
pub const AUTO_QUERIES_IN_FLIGHT: usize = 4;

/// Queries each of `threads` workers interleaves for a batch of `nq`
/// queries: `requested` when it names a number, else
/// [`AUTO_QUERIES_IN_FLIGHT`], fewer when the batch does not give every
/// worker that many.
///
/// A batch call returns when its last query ends, so the latency of one
/// query inside it is not the caller's to see; what interleaving buys is
/// throughput. One worker with one query leaves the device idle while it
/// computes, and a beam of W = 4 keeps only 4 reads in flight; four queries
/// per worker keep 16 (32 on two workers, the depth at which this
/// machine's disk reaches its ceiling) and let one query compute while the
/// others wait. Measured with two threads at recall@10 = 0.95 (see
/// docs/benchmarks.md, 2026-11-24): 4 per worker against 1 took the pipeann
/// preset from 1.14× to 1.69× diskannpy's QPS on wordnet (1.00× to 1.56× on
/// 1M × 128) and the diskann preset from 1.07× to 1.78× (0.96× to 1.56×).
/// A lone query (or one per worker) gets 1: no interleaving, lowest latency.
pub fn choose_queries_in_flight(requested: usize, nq: usize, threads: usize) -> usize {
    if requested != crate::search::QUERIES_IN_FLIGHT_AUTO {
        return requested;
    }
    let per_worker = nq.div_ceil(threads.max(1));
    per_worker.clamp(1, AUTO_QUERIES_IN_FLIGHT)
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
    fn pipeann_preset() {
        assert_eq!(resolve_preset("PipeANN").unwrap(), "pipeann");
        let d = preset_defaults("pipeann");
        assert_eq!(
            (d.nav_sample, d.executor, d.width),
            (0.01, ExecutorKind::Pipeline, 32)
        );
        assert_eq!(resolve_preset("Starling").unwrap(), "starling");
        let d = preset_defaults("starling");
        assert_eq!(
            (d.nav_sample, d.executor, d.layout),
            (0.01, ExecutorKind::Pipeline, LayoutKind::Shuffled)
        );
        let d = preset_defaults("diskann");
        assert_eq!(
            (d.nav_sample, d.executor, d.width),
            (0.0, ExecutorKind::Auto, 4)
        );
    }

    #[test]
    fn auto_queries_in_flight_follows_the_batch() {
        use crate::search::QUERIES_IN_FLIGHT_AUTO as AUTO;
        // Explicit values are kept.
        assert_eq!(choose_queries_in_flight(1, 10_000, 2), 1);
        assert_eq!(choose_queries_in_flight(9, 1, 1), 9);
        // Auto: a full batch interleaves 4 per worker...
        assert_eq!(choose_queries_in_flight(AUTO, 10_000, 2), 4);
        assert_eq!(choose_queries_in_flight(AUTO, 8, 2), 4);
        // ...fewer when the batch cannot fill every worker's slots...
        assert_eq!(choose_queries_in_flight(AUTO, 5, 2), 3);
        assert_eq!(choose_queries_in_flight(AUTO, 2, 2), 1);
        // ...and a single query never interleaves.
        assert_eq!(choose_queries_in_flight(AUTO, 1, 1), 1);
        assert_eq!(choose_queries_in_flight(AUTO, 1, 0), 1);
        assert_eq!(choose_queries_in_flight(AUTO, 0, 4), 1);
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
