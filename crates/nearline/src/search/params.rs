//! Search parameters of one batch and their validation.

use crate::{Error, Result};

/// Largest beam width accepted (reads in flight per query).
pub const MAX_BEAM_WIDTH: usize = 64;

/// Largest candidate list accepted (and so the largest k).
pub const MAX_LIST_SIZE: usize = 1 << 22;

/// Largest number of queries one worker interleaves.
pub const MAX_QUERIES_IN_FLIGHT: usize = 64;

/// `SearchParams::queries_in_flight` value that leaves the choice to the
/// planner (`planner::choose_queries_in_flight`): a batch search interleaves
/// several queries per worker when it has enough of them.
pub const QUERIES_IN_FLIGHT_AUTO: usize = 0;

/// Which executor drives a search. Every kind is the same loop
/// (`search::executor`) under a different policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExecutorKind {
    /// The planner decides from the layout (see `planner::choose_executor`).
    #[default]
    Auto,
    /// DiskANN's synchronous beam: up to W reads per hop, the next hop once
    /// the hop's reads are processed (optionally with adaptive width and
    /// early dispatch, AlayaLaser).
    Beam,
    /// PipeANN's I/O-driven pipeline: keeps up to `width` reads in flight,
    /// processes pages one at a time as they arrive and refills at once.
    Pipeline,
}

impl ExecutorKind {
    /// Parses `auto`, `beam`, `pipeline`.
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(ExecutorKind::Auto),
            "beam" => Ok(ExecutorKind::Beam),
            "pipeline" => Ok(ExecutorKind::Pipeline),
            other => Err(Error::arg(format!(
                "unknown executor {other:?}: expected auto, beam or pipeline"
            ))),
        }
    }

    /// `"auto"`, `"beam"` or `"pipeline"`.
    pub fn name(self) -> &'static str {
        match self {
            ExecutorKind::Auto => "auto",
            ExecutorKind::Beam => "beam",
            ExecutorKind::Pipeline => "pipeline",
        }
    }
}

/// What the executor does with a page when it arrives (see
/// `search::policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PageSearch {
    /// The layout's own: block search for a shuffled layout, the target
    /// records for the ID layout.
    #[default]
    Auto,
    /// DiskANN: use only the records the page was read for.
    Targets,
    /// Starling's block search: exact distances for every record of the
    /// page, expand the targets and the closest σ fraction of the others.
    Block,
}

impl PageSearch {
    /// Parses `auto`, `targets`, `block`.
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(PageSearch::Auto),
            "targets" | "target" => Ok(PageSearch::Targets),
            "block" => Ok(PageSearch::Block),
            other => Err(Error::arg(format!(
                "unknown page_search {other:?}: expected auto, targets or block"
            ))),
        }
    }

    /// `"auto"`, `"targets"` or `"block"`.
    pub fn name(self) -> &'static str {
        match self {
            PageSearch::Auto => "auto",
            PageSearch::Targets => "targets",
            PageSearch::Block => "block",
        }
    }
}

/// Default block-pruning ratio σ (Starling: 0.3 is best throughout).
pub const DEFAULT_SIGMA: f32 = 0.3;
/// Default ratio φ of Starling's range search (0.5 in the paper).
pub const DEFAULT_RANGE_RATIO: f32 = 0.5;

/// A range query: every point within `radius` (internal distance: squared
/// L2, negated inner product, 1 − cosine similarity).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RangeParams {
    /// Internal distance bound (inclusive).
    pub radius: f32,
    /// φ: the list doubles while (results within the radius) / (list size) ≥ φ.
    pub ratio: f32,
    /// Largest list size the doubling may reach (≥ L).
    pub max_l: usize,
    /// `Some(c)` (c ≥ 1): a query whose nearest entry point (exact distance,
    /// computed in memory) lies beyond `c · radius` ends with no results and
    /// no reads. Only for metrics whose internal distances are not negative
    /// (squared L2, cosine) and entry points with in-memory vectors.
    pub entry_cutoff: Option<f32>,
}

/// Search parameters of one batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchParams {
    /// Results per query.
    pub k: usize,
    /// Candidate list size (≥ k).
    pub l: usize,
    /// Beam width: reads issued per hop (Beam) or the most reads in flight
    /// per query (Pipeline).
    pub w: usize,
    /// Which executor runs the search.
    pub executor: ExecutorKind,
    /// Beam only: width min(2^i, W) at hop i (AlayaLaser's adaptive beam).
    pub adaptive_beam: bool,
    /// Beam only: issue the next hop once this fraction (in (0, 1]) of the
    /// current hop's pages has been processed; late pages fold in when they
    /// arrive (AlayaLaser's early dispatch). `None`: wait for the whole hop.
    pub early_dispatch: Option<f32>,
    /// Queries each worker interleaves on its I/O engine (1..=64), or
    /// [`QUERIES_IN_FLIGHT_AUTO`] for the planner's choice.
    pub queries_in_flight: usize,
    /// What to do with an arrived page.
    pub page_search: PageSearch,
    /// Block search: the fraction σ in (0, 1] of a page's other records
    /// whose neighbours are expanded (closest first by exact distance).
    pub sigma: f32,
    /// `Some`: a range search (Starling's candidate-list doubling) instead
    /// of a top-k search.
    pub range: Option<RangeParams>,
}

impl Default for SearchParams {
    fn default() -> Self {
        SearchParams {
            k: 10,
            l: 100,
            w: 4,
            executor: ExecutorKind::Auto,
            adaptive_beam: false,
            early_dispatch: None,
            queries_in_flight: 1,
            page_search: PageSearch::Auto,
            sigma: DEFAULT_SIGMA,
            range: None,
        }
    }
}

impl SearchParams {
    /// Parameters with `k`, `L` and `W` and defaults for the rest.
    pub fn new(k: usize, l: usize, w: usize) -> Self {
        SearchParams {
            k,
            l,
            w,
            ..SearchParams::default()
        }
    }

    /// Validates the parameters.
    pub fn check(&self) -> Result<()> {
        if self.k == 0 {
            return Err(Error::arg("k must be at least 1"));
        }
        if self.l < self.k {
            return Err(Error::arg(format!(
                "L={} must be at least k={}",
                self.l, self.k
            )));
        }
        if self.l > MAX_LIST_SIZE {
            return Err(Error::arg(format!(
                "L={} exceeds the maximum list size {MAX_LIST_SIZE}",
                self.l
            )));
        }
        if self.w == 0 || self.w > MAX_BEAM_WIDTH {
            return Err(Error::arg(format!(
                "W={} must be in 1..={MAX_BEAM_WIDTH}",
                self.w
            )));
        }
        if let Some(f) = self.early_dispatch {
            if !f.is_finite() || f <= 0.0 || f > 1.0 {
                return Err(Error::arg(format!(
                    "early_dispatch={f} must be a finite fraction in (0, 1]"
                )));
            }
        }
        if self.queries_in_flight > MAX_QUERIES_IN_FLIGHT {
            return Err(Error::arg(format!(
                "queries_in_flight={} must be in 1..={MAX_QUERIES_IN_FLIGHT} (or auto)",
                self.queries_in_flight
            )));
        }
        if !self.sigma.is_finite() || self.sigma <= 0.0 || self.sigma > 1.0 {
            return Err(Error::arg(format!(
                "sigma={} must be a finite fraction in (0, 1]",
                self.sigma
            )));
        }
        if let Some(r) = &self.range {
            if !r.radius.is_finite() {
                return Err(Error::arg(format!("radius={} must be finite", r.radius)));
            }
            if !r.ratio.is_finite() || r.ratio <= 0.0 || r.ratio > 1.0 {
                return Err(Error::arg(format!(
                    "range ratio={} must be a finite fraction in (0, 1]",
                    r.ratio
                )));
            }
            if let Some(c) = r.entry_cutoff {
                if !c.is_finite() || c < 1.0 {
                    return Err(Error::arg(format!(
                        "entry_cutoff={c} must be a finite factor of at least 1 (a query ends \
                         unread when its nearest entry point lies beyond entry_cutoff x radius)"
                    )));
                }
            }
            if r.max_l < self.l || r.max_l > MAX_LIST_SIZE {
                return Err(Error::arg(format!(
                    "max_L={} must be in L={}..={MAX_LIST_SIZE}",
                    r.max_l, self.l
                )));
            }
        }
        if self.executor == ExecutorKind::Pipeline {
            if self.adaptive_beam {
                return Err(Error::arg(
                    "adaptive_beam applies to the beam executor, not to executor=\"pipeline\" \
                     (the pipeline adapts its width by itself)",
                ));
            }
            if self.early_dispatch.is_some() {
                return Err(Error::arg(
                    "early_dispatch applies to the beam executor, not to executor=\"pipeline\"",
                ));
            }
        }
        Ok(())
    }

    /// Whether a beam-only option (adaptive width, early dispatch) is set.
    pub fn wants_beam_options(&self) -> bool {
        self.adaptive_beam || self.early_dispatch.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(p: SearchParams) -> String {
        p.check().unwrap_err().to_string()
    }

    #[test]
    fn defaults_are_valid() {
        SearchParams::default().check().unwrap();
        SearchParams::new(1, 1, 1).check().unwrap();
        let p = SearchParams {
            executor: ExecutorKind::Beam,
            adaptive_beam: true,
            early_dispatch: Some(1.0),
            queries_in_flight: MAX_QUERIES_IN_FLIGHT,
            ..SearchParams::default()
        };
        p.check().unwrap();
    }

    #[test]
    fn bad_arguments_are_refused_with_clear_messages() {
        let base = SearchParams::default();
        assert!(err(SearchParams { k: 0, ..base }).contains("k must be at least 1"));
        assert!(err(SearchParams { l: 5, ..base }).contains("L=5 must be at least k=10"));
        assert!(err(SearchParams { w: 0, ..base }).contains("W=0"));
        assert!(err(SearchParams { w: 65, ..base }).contains("W=65"));
        for f in [0.0f32, -0.5, 1.5, f32::NAN, f32::INFINITY] {
            let e = err(SearchParams {
                early_dispatch: Some(f),
                ..base
            });
            assert!(e.contains("early_dispatch") && e.contains("(0, 1]"), "{e}");
        }
        for q in [MAX_QUERIES_IN_FLIGHT + 1, usize::MAX] {
            let e = err(SearchParams {
                queries_in_flight: q,
                ..base
            });
            assert!(e.contains(&format!("queries_in_flight={q}")), "{e}");
        }
        SearchParams {
            queries_in_flight: QUERIES_IN_FLIGHT_AUTO,
            ..base
        }
        .check()
        .unwrap();
        let pipe = SearchParams {
            executor: ExecutorKind::Pipeline,
            ..base
        };
        pipe.check().unwrap();
        assert!(err(SearchParams {
            adaptive_beam: true,
            ..pipe
        })
        .contains("adaptive_beam"));
        assert!(err(SearchParams {
            early_dispatch: Some(0.5),
            ..pipe
        })
        .contains("early_dispatch"));
        for s in [0.0f32, -0.1, 1.01, f32::NAN] {
            let e = err(SearchParams { sigma: s, ..base });
            assert!(e.contains("sigma=") && e.contains("(0, 1]"), "{e}");
        }
        let range = RangeParams {
            radius: 1.0,
            ratio: DEFAULT_RANGE_RATIO,
            max_l: 1000,
            entry_cutoff: None,
        };
        SearchParams {
            range: Some(range),
            ..base
        }
        .check()
        .unwrap();
        SearchParams {
            range: Some(RangeParams {
                entry_cutoff: Some(1.0),
                ..range
            }),
            ..base
        }
        .check()
        .unwrap();
        for bad in [
            RangeParams {
                radius: f32::NAN,
                ..range
            },
            RangeParams {
                radius: f32::INFINITY,
                ..range
            },
            RangeParams {
                ratio: 0.0,
                ..range
            },
            RangeParams { max_l: 50, ..range },
            RangeParams {
                entry_cutoff: Some(0.5),
                ..range
            },
            RangeParams {
                entry_cutoff: Some(f32::NAN),
                ..range
            },
            RangeParams {
                entry_cutoff: Some(f32::INFINITY),
                ..range
            },
        ] {
            assert!(SearchParams {
                range: Some(bad),
                ..base
            }
            .check()
            .is_err());
        }
        assert_eq!(PageSearch::parse("Block").unwrap(), PageSearch::Block);
        assert!(PageSearch::parse("pages")
            .unwrap_err()
            .to_string()
            .contains("targets"));
    }

    #[test]
    fn executor_names_parse() {
        for k in [
            ExecutorKind::Auto,
            ExecutorKind::Beam,
            ExecutorKind::Pipeline,
        ] {
            assert_eq!(ExecutorKind::parse(k.name()).unwrap(), k);
        }
        assert_eq!(ExecutorKind::parse(" Beam ").unwrap(), ExecutorKind::Beam);
        let e = ExecutorKind::parse("warp").unwrap_err().to_string();
        assert!(
            e.contains("unknown executor") && e.contains("pipeline"),
            "{e}"
        );
    }
}
