//! The resolved plan of one batch: what the executor runs, with no `auto`
//! left in it. The planner (`crate::planner`) makes plans from what a user
//! asks; this module only defines them and checks their ranges, so the
//! search never consults the planner.

use crate::{Error, Result};

/// Largest beam width accepted (reads in flight per query).
pub const MAX_BEAM_WIDTH: usize = 64;

/// Largest candidate list accepted (and so the largest k).
pub const MAX_LIST_SIZE: usize = 1 << 22;

/// Largest number of queries one worker interleaves.
pub const MAX_QUERIES_IN_FLIGHT: usize = 64;

/// Default block-pruning ratio σ (Starling: 0.3 is best throughout).
pub const DEFAULT_SIGMA: f32 = 0.3;
/// Default ratio φ of Starling's range search (0.5 in the paper).
pub const DEFAULT_RANGE_RATIO: f32 = 0.5;

/// DiskANN's synchronous beam.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BeamPlan {
    /// W: reads issued per hop.
    pub width: usize,
    /// Width min(2^i, W) at hop i (AlayaLaser's adaptive beam).
    pub adaptive: bool,
    /// Issue the next hop once this fraction (in (0, 1]) of the current
    /// hop's pages has been processed; late pages fold in when they arrive
    /// (AlayaLaser's early dispatch). `None`: wait for the whole hop.
    pub early_dispatch: Option<f32>,
}

/// PipeANN's I/O-driven pipeline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PipelinePlan {
    /// The most reads in flight per query (W).
    pub max_width: usize,
    /// Width the query starts with; it grows by one per arrival up to
    /// `max_width` while few arrivals are wasted.
    pub start_width: usize,
}

/// Which executor drives the search, with its own options only: options of
/// one executor cannot be set on another.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExecutorPlan {
    Beam(BeamPlan),
    Pipeline(PipelinePlan),
}

impl ExecutorPlan {
    /// `"beam"` or `"pipeline"`.
    pub fn name(&self) -> &'static str {
        match self {
            ExecutorPlan::Beam(_) => "beam",
            ExecutorPlan::Pipeline(_) => "pipeline",
        }
    }

    /// The most reads one query keeps in flight at once.
    pub fn width(&self) -> usize {
        match self {
            ExecutorPlan::Beam(b) => b.width,
            ExecutorPlan::Pipeline(p) => p.max_width,
        }
    }
}

/// What the executor does with a page when it arrives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PagePlan {
    /// DiskANN: use only the records the page was read for.
    Targets,
    /// Starling's block search: exact distances for every record of the
    /// page, expand the targets and the closest σ fraction of the others.
    Block {
        /// σ in (0, 1].
        sigma: f32,
    },
    /// Gorgeous on a graph-replicated layout: use the target records, and
    /// keep the neighbours' lists their records carry, so that such a
    /// neighbour is later expanded without a read when its PQ distance is
    /// within `filter_ratio` of the list's worst.
    Replicas {
        /// In (0, 1]: a loaded neighbour is expanded from memory when its
        /// distance d satisfies `d − b ≤ filter_ratio · (w − b)`, where w
        /// is the list's worst distance and b is 0 for metrics whose
        /// distances are never negative (the list's best otherwise).
        filter_ratio: f32,
    },
}

impl PagePlan {
    /// `"targets"`, `"block"` or `"replicas"`.
    pub fn name(&self) -> &'static str {
        match self {
            PagePlan::Targets => "targets",
            PagePlan::Block { .. } => "block",
            PagePlan::Replicas { .. } => "replicas",
        }
    }
}

/// What happens after the traversal ends (the post-traversal stage).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RefinePlan {
    /// The results are the exact distances the traversal computed.
    None,
    /// Two-stage search: the best `candidates` list entries whose exact
    /// distance the traversal did not compute (nodes expanded from memory
    /// without their vector) are read and ranked exactly.
    Rerank {
        /// How many of the list's best entries are considered.
        candidates: usize,
    },
}

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

/// The resolved plan of one batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchPlan {
    /// Results per query (ignored by a range search).
    pub k: usize,
    /// Candidate list size (≥ k).
    pub l: usize,
    pub executor: ExecutorPlan,
    pub page: PagePlan,
    pub refine: RefinePlan,
    /// Queries each worker interleaves on its I/O engine (1..=64).
    pub queries_in_flight: usize,
    /// `Some`: a range search (Starling's candidate-list doubling).
    pub range: Option<RangeParams>,
    /// Each query processes its pages in the order it issued the reads
    /// (pages that arrive early wait in a per-query reorder buffer), so the
    /// same query on the same index gives the same results and statistics
    /// whatever the timing of its reads. `false`: pages are processed as
    /// they arrive (the beam without early dispatch and with target records
    /// is repeatable either way).
    pub repeatable: bool,
}

impl SearchPlan {
    /// A plain DiskANN beam search with `k`, `L` and `W` (tests and tools).
    pub fn beam(k: usize, l: usize, w: usize) -> Self {
        SearchPlan {
            k,
            l,
            executor: ExecutorPlan::Beam(BeamPlan {
                width: w,
                adaptive: false,
                early_dispatch: None,
            }),
            page: PagePlan::Targets,
            refine: RefinePlan::None,
            queries_in_flight: 1,
            range: None,
            repeatable: true,
        }
    }

    /// Checks every range (a plan made by the planner always passes; a plan
    /// made by hand may not).
    pub fn check(&self) -> Result<()> {
        if self.k == 0 {
            return Err(Error::arg(format!("k={} must be at least 1", self.k)));
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
        let w = self.executor.width();
        if w == 0 || w > MAX_BEAM_WIDTH {
            return Err(Error::arg(format!("W={w} must be in 1..={MAX_BEAM_WIDTH}")));
        }
        match self.executor {
            ExecutorPlan::Beam(b) => {
                if let Some(f) = b.early_dispatch {
                    if !f.is_finite() || f <= 0.0 || f > 1.0 {
                        return Err(Error::arg(format!(
                            "early_dispatch={f} must be a finite fraction in (0, 1]"
                        )));
                    }
                }
            }
            ExecutorPlan::Pipeline(p) => {
                if p.start_width == 0 || p.start_width > p.max_width {
                    return Err(Error::arg(format!(
                        "pipeline start width {} must be in 1..={}",
                        p.start_width, p.max_width
                    )));
                }
            }
        }
        if self.queries_in_flight == 0 || self.queries_in_flight > MAX_QUERIES_IN_FLIGHT {
            return Err(Error::arg(format!(
                "queries_in_flight={} must be in 1..={MAX_QUERIES_IN_FLIGHT} (or auto)",
                self.queries_in_flight
            )));
        }
        if let PagePlan::Block { sigma } = self.page {
            if !sigma.is_finite() || sigma <= 0.0 || sigma > 1.0 {
                return Err(Error::arg(format!(
                    "sigma={sigma} must be a finite fraction in (0, 1]"
                )));
            }
        }
        if let PagePlan::Replicas { filter_ratio } = self.page {
            if !filter_ratio.is_finite() || filter_ratio <= 0.0 || filter_ratio > 1.0 {
                return Err(Error::arg(format!(
                    "filter_ratio={filter_ratio} must be a finite fraction in (0, 1]"
                )));
            }
        }
        if let RefinePlan::Rerank { candidates } = self.refine {
            let most = self.range.map_or(self.l, |r| r.max_l.max(self.l));
            if candidates == 0 || candidates > most {
                return Err(Error::arg(format!(
                    "refine candidates={candidates} must be in 1..={most} (the largest list)"
                )));
            }
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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(p: SearchPlan) -> String {
        p.check().unwrap_err().to_string()
    }

    #[test]
    fn hand_made_plans_are_checked() {
        let base = SearchPlan::beam(10, 100, 4);
        base.check().unwrap();
        SearchPlan::beam(1, 1, 1).check().unwrap();
        assert!(err(SearchPlan { k: 0, ..base }).contains("k=0 must be at least 1"));
        assert!(err(SearchPlan { l: 5, ..base }).contains("L=5 must be at least k=10"));
        assert!(err(SearchPlan::beam(10, 100, 0)).contains("W=0"));
        assert!(err(SearchPlan::beam(10, 100, 65)).contains("W=65"));
        for f in [0.0f32, -0.5, 1.5, f32::NAN, f32::INFINITY] {
            let e = err(SearchPlan {
                executor: ExecutorPlan::Beam(BeamPlan {
                    width: 4,
                    adaptive: false,
                    early_dispatch: Some(f),
                }),
                ..base
            });
            assert!(e.contains("early_dispatch") && e.contains("(0, 1]"), "{e}");
        }
        for q in [0, MAX_QUERIES_IN_FLIGHT + 1] {
            let e = err(SearchPlan {
                queries_in_flight: q,
                ..base
            });
            assert!(e.contains(&format!("queries_in_flight={q}")), "{e}");
        }
        for s in [0.0f32, -0.1, 1.01, f32::NAN] {
            let e = err(SearchPlan {
                page: PagePlan::Block { sigma: s },
                ..base
            });
            assert!(e.contains("sigma=") && e.contains("(0, 1]"), "{e}");
        }
        let e = err(SearchPlan {
            executor: ExecutorPlan::Pipeline(PipelinePlan {
                max_width: 8,
                start_width: 9,
            }),
            ..base
        });
        assert!(e.contains("start width"), "{e}");
        assert!(err(SearchPlan {
            refine: RefinePlan::Rerank { candidates: 101 },
            ..base
        })
        .contains("refine"));
        let range = RangeParams {
            radius: 1.0,
            ratio: DEFAULT_RANGE_RATIO,
            max_l: 1000,
            entry_cutoff: None,
        };
        SearchPlan {
            range: Some(range),
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
                ratio: 0.0,
                ..range
            },
            RangeParams { max_l: 50, ..range },
            RangeParams {
                entry_cutoff: Some(0.5),
                ..range
            },
            RangeParams {
                entry_cutoff: Some(f32::INFINITY),
                ..range
            },
        ] {
            assert!(SearchPlan {
                range: Some(bad),
                ..base
            }
            .check()
            .is_err());
        }
    }
}
