//! Search planning: a batch's options and the facts of an open index
//! become a typed [`SearchPlan`] (no `auto` left), with the workers'
//! scratch checked against what the memory budget leaves them.

use super::memory::{self, QueryShape};
use super::preset::{self, defaults, PIPELINE_START_WIDTH};
use super::rules::{self, ExecutorKind};
use super::{geometry, Decision, RangeOptions, SearchOptions};
use crate::format::{LayoutKind, Manifest, PageGeometry, Preset};
use crate::search::{
    BeamPlan, ExecutorPlan, PagePlan, PipelinePlan, RangeParams, RefinePlan, SearchPlan,
    MAX_LIST_SIZE,
};
use crate::{Error, Result};
use serde::Serialize;

/// What the planner knows of an open index when it plans a search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchFacts {
    pub preset: Preset,
    pub layout: LayoutKind,
    pub geo: PageGeometry,
    pub n: usize,
    pub dim: usize,
    pub esz: usize,
    pub pq_m: usize,
    /// FastScan groups of the codes in the records (0: none).
    pub code_groups: usize,
    /// What the open index's cache holds.
    pub cache: preset::CacheKind,
    /// The index's default search threads.
    pub threads: usize,
    /// Bytes the search workers may hold: the budget less everything else
    /// resident.
    pub scratch_allowance: u64,
}

impl SearchFacts {
    /// The facts of the index of manifest `m`, opened with a `cache`,
    /// `threads` default threads and `allowance` bytes for its workers.
    pub fn of(
        m: &Manifest,
        cache: preset::CacheKind,
        threads: usize,
        allowance: u64,
    ) -> Result<Self> {
        Ok(SearchFacts {
            cache,
            preset: m.spec.preset,
            layout: m.layout.kind,
            geo: geometry(m)?,
            n: m.n,
            dim: m.dim,
            esz: m.dtype.size(),
            pq_m: m.spec.pq_bytes,
            code_groups: geometry(m)?.code_groups(),
            threads,
            scratch_allowance: allowance,
        })
    }
}

/// A planned batch: the plan, the workers it runs on and the decisions.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedSearch {
    pub plan: SearchPlan,
    pub threads: usize,
    /// Bytes the workers are expected to hold at most.
    pub scratch: u64,
    pub decisions: Vec<Decision>,
}

/// Plans a batch of `nq` queries (a range search when `range` holds the
/// internal radius and its options).
pub fn plan_search(
    opts: &SearchOptions,
    range: Option<(f32, RangeOptions)>,
    f: &SearchFacts,
    nq: usize,
) -> Result<PlannedSearch> {
    plan_search_with(opts, range, f, nq, &mut Notes::new(true))
}

/// [`plan_search`] without the decisions' texts: the same plan, none of the
/// strings (what every search batch calls).
pub fn plan_search_quietly(
    opts: &SearchOptions,
    range: Option<(f32, RangeOptions)>,
    f: &SearchFacts,
    nq: usize,
) -> Result<PlannedSearch> {
    plan_search_with(opts, range, f, nq, &mut Notes::new(false))
}

/// Decisions being recorded, or not (the texts are built only when kept).
struct Notes {
    keep: bool,
    list: Vec<Decision>,
}

impl Notes {
    fn new(keep: bool) -> Self {
        Notes {
            keep,
            list: Vec::new(),
        }
    }

    /// Records `what` = `value` because of the rule `why()` returns.
    fn push<V: std::fmt::Display, W: Into<String>>(
        &mut self,
        what: &'static str,
        value: V,
        why: impl FnOnce() -> W,
    ) {
        if self.keep {
            self.list.push(Decision::new(what, value, why()));
        }
    }
}

fn plan_search_with(
    opts: &SearchOptions,
    range: Option<(f32, RangeOptions)>,
    f: &SearchFacts,
    nq: usize,
    d: &mut Notes,
) -> Result<PlannedSearch> {
    let pd = defaults(f.preset);
    let threads = opts.threads.unwrap_or(f.threads);
    if threads == 0 {
        return Err(Error::arg("threads must be at least 1"));
    }
    let k = if range.is_some() { 1 } else { opts.k };
    if k == 0 {
        return Err(Error::arg(format!("k={k} must be at least 1")));
    }
    let l = match opts.l {
        Some(l) => {
            d.push("L", l, || "asked for");
            l
        }
        None => {
            let l = k.max(pd.l);
            d.push("L", l, || {
                format!("the {} preset's: max(k, {})", f.preset, pd.l)
            });
            l
        }
    };
    if l < k {
        return Err(Error::arg(format!("L={l} must be at least k={k}")));
    }
    if l > MAX_LIST_SIZE {
        return Err(Error::arg(format!(
            "L={l} exceeds the maximum list size {MAX_LIST_SIZE}"
        )));
    }
    let beam_options = opts.adaptive_beam || opts.early_dispatch.is_some();
    let (kind, why) = rules::choose_executor(
        opts.executor,
        pd.executor,
        f.geo.records_per_block,
        beam_options,
    )?;
    d.push(
        "executor",
        match kind {
            ExecutorKind::Beam => "beam",
            ExecutorKind::Pipeline => "pipeline",
        },
        || why,
    );
    let w = match opts.w {
        Some(w) => {
            d.push("W", w, || "asked for");
            w
        }
        None => {
            d.push("W", pd.width, || format!("the {} preset's", f.preset));
            pd.width
        }
    };
    let executor = match kind {
        ExecutorKind::Beam => {
            // A preset's beam options (AlayaLaser's) apply when the search
            // leaves them unset.
            let adaptive = opts.adaptive_beam || pd.adaptive_beam;
            let early_dispatch = opts.early_dispatch.or(pd.early_dispatch);
            if !opts.adaptive_beam && pd.adaptive_beam {
                d.push("adaptive_beam", true, || {
                    format!("the {} preset's: width 1, doubling to W", f.preset)
                });
            }
            if let (None, Some(e)) = (opts.early_dispatch, pd.early_dispatch) {
                d.push("early_dispatch", e, || {
                    format!(
                        "the {} preset's: the next hop goes out once this share of the current \
                         hop's pages is processed",
                        f.preset
                    )
                });
            }
            ExecutorPlan::Beam(BeamPlan {
                width: w,
                adaptive,
                early_dispatch,
            })
        }
        ExecutorKind::Pipeline => ExecutorPlan::Pipeline(PipelinePlan {
            max_width: w,
            start_width: PIPELINE_START_WIDTH.min(w).max(1),
        }),
    };
    let (page_kind, why) = rules::choose_page(opts.page_search, f.layout)?;
    let block = page_kind == rules::PageKind::Block;
    let sigma = opts.sigma.unwrap_or(pd.sigma);
    if opts.filter_ratio.is_some() && page_kind != rules::PageKind::Replicas {
        return Err(Error::arg(
            "filter_ratio applies to page_search=\"replicas\" (a replicated layout) only",
        ));
    }
    let page = match page_kind {
        rules::PageKind::Block => PagePlan::Block { sigma },
        rules::PageKind::Targets => PagePlan::Targets,
        rules::PageKind::Replicas => PagePlan::Replicas {
            filter_ratio: opts.filter_ratio.unwrap_or(pd.filter_ratio),
        },
    };
    d.push("page_search", page.name(), || why);
    // Two-stage search when the traversal may expand nodes without their
    // vectors (an adjacency cache, lists carried by replicated pages).
    let two_stage =
        f.cache == preset::CacheKind::Adjacency || page_kind == rules::PageKind::Replicas;
    let refine_ratio = match (opts.refine_ratio, two_stage) {
        (Some(r), _) if !r.is_finite() || r <= 0.0 || r > 1.0 => {
            return Err(Error::arg(format!(
                "refine_ratio={r} must be a finite fraction in (0, 1]"
            )))
        }
        (Some(_), false) => {
            return Err(Error::arg(
                "refine_ratio applies to two-stage searches: an index opened with \
                 cache=\"adjacency\" or built with a replicated layout",
            ))
        }
        (r, true) => Some(r.unwrap_or(pd.refine_ratio)),
        (None, false) => None,
    };
    let range = match range {
        None => None,
        Some((radius, o)) => {
            let max_l = o
                .max_l
                .unwrap_or_else(|| l.saturating_mul(1024).clamp(l, MAX_LIST_SIZE));
            Some(RangeParams {
                radius,
                ratio: o.ratio.unwrap_or(preset::DEFAULT_RANGE_RATIO),
                max_l,
                entry_cutoff: o.entry_cutoff,
            })
        }
    };
    let (mut qif, why) = rules::choose_queries_in_flight(opts.queries_in_flight, nq, threads);
    let refine = match refine_ratio {
        None => RefinePlan::None,
        Some(ratio) => {
            // A range search refines every list entry that needs it (its
            // answers are whatever lies within the radius).
            let candidates = match range {
                Some(r) => r.max_l,
                None => ((ratio * l as f32).ceil() as usize).clamp(k, l),
            };
            d.push("refine", candidates, || {
                format!(
                    "two-stage search: the best {candidates} list entries without an exact \
                     distance are read (refine_ratio {ratio} of L={l}, at least k)"
                )
            });
            RefinePlan::Rerank { candidates }
        }
    };
    let mut plan = SearchPlan {
        k,
        l,
        executor,
        page,
        refine,
        queries_in_flight: qif,
        range,
        repeatable: opts.repeatable,
    };
    plan.check()?;
    // The workers' scratch must fit what the budget leaves them.
    let shape = QueryShape {
        n: f.n,
        dim: f.dim,
        esz: f.esz,
        r: f.geo.max_degree,
        pq_m: f.pq_m,
        block_size: f.geo.block_size,
        records_per_block: f.geo.records_per_block,
        l: range.map_or(l, |r| r.max_l),
        width: w,
        sigma: block.then_some(sigma),
        packed: f.geo.packed,
        refine: match refine {
            RefinePlan::Rerank { candidates } => candidates,
            RefinePlan::None => 0,
        },
        code_groups: f.geo.code_groups(),
    };
    let workers = threads.min(nq.max(1)) as u64;
    let need = |q: usize| workers * memory::worker_bytes(&shape, q);
    let mut why = why;
    if need(qif) > f.scratch_allowance && opts.queries_in_flight.is_none() {
        while qif > 1 && need(qif) > f.scratch_allowance {
            qif -= 1;
        }
        why = format!(
            "auto, lowered to {qif} per worker: the budget leaves the workers {} bytes",
            f.scratch_allowance
        );
    }
    let scratch = need(qif);
    if scratch > f.scratch_allowance {
        return Err(Error::arg(format!(
            "this search needs about {scratch} bytes of worker scratch ({workers} workers × \
             {qif} queries in flight, L={}, W={w}), but the memory budget leaves the workers \
             {} bytes; open the index with a larger memory_budget or fewer cache_nodes, or \
             search with fewer threads, a smaller L or fewer queries_in_flight",
            shape.l, f.scratch_allowance
        )));
    }
    d.push("queries_in_flight", qif, || why);
    plan.queries_in_flight = qif;
    Ok(PlannedSearch {
        plan,
        threads,
        scratch,
        decisions: std::mem::take(&mut d.list),
    })
}

/// A search plan as `info()` and `nearline plan` show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchPlanView {
    pub k: usize,
    #[serde(rename = "L")]
    pub l: usize,
    pub executor: &'static str,
    #[serde(rename = "W")]
    pub w: usize,
    pub adaptive_beam: bool,
    pub early_dispatch: Option<f32>,
    pub page_search: &'static str,
    pub sigma: Option<f32>,
    pub refine: &'static str,
    pub queries_in_flight: usize,
    pub repeatable: bool,
    pub threads: usize,
    pub scratch: u64,
    pub decisions: Vec<Decision>,
}

impl SearchPlanView {
    /// The view of a planned search.
    pub fn of(p: &PlannedSearch) -> Self {
        let (adaptive_beam, early_dispatch) = match p.plan.executor {
            ExecutorPlan::Beam(b) => (b.adaptive, b.early_dispatch),
            ExecutorPlan::Pipeline(_) => (false, None),
        };
        SearchPlanView {
            k: p.plan.k,
            l: p.plan.l,
            executor: p.plan.executor.name(),
            w: p.plan.executor.width(),
            adaptive_beam,
            early_dispatch,
            page_search: p.plan.page.name(),
            sigma: match p.plan.page {
                PagePlan::Block { sigma } => Some(sigma),
                PagePlan::Targets | PagePlan::Replicas { .. } => None,
            },
            refine: match p.plan.refine {
                RefinePlan::None => "none",
                RefinePlan::Rerank { .. } => "rerank",
            },
            queries_in_flight: p.plan.queries_in_flight,
            repeatable: p.plan.repeatable,
            threads: p.threads,
            scratch: p.scratch,
            decisions: p.decisions.clone(),
        }
    }
}
