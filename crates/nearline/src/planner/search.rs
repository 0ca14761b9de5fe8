//! Search planning: a batch's options and the facts of an open index
//! become a typed [`SearchPlan`] (no `auto` left), with the workers'
//! scratch checked against what the memory budget can give them.

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
    /// What the memory budget gives the search workers.
    pub scratch: ScratchRoom,
}

/// What the memory budget gives a search's workers: `reserve` bytes with
/// the cache as planned (what is left of the budget), up to `limit` bytes
/// with the cache emptied (the cache lends the difference while a search
/// runs); `fixed` bytes are held besides the cache and the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScratchRoom {
    pub reserve: u64,
    pub limit: u64,
    pub fixed: u64,
}

impl ScratchRoom {
    /// No limit: nearline sized the budget itself.
    pub const UNBOUNDED: ScratchRoom = ScratchRoom {
        reserve: u64::MAX,
        limit: u64::MAX,
        fixed: 0,
    };

    /// The room `budget` leaves beside `fixed` bytes of structures and a
    /// cache of `cache` bytes.
    pub fn of(budget: u64, fixed: u64, cache: u64) -> Self {
        let limit = budget.saturating_sub(fixed);
        ScratchRoom {
            reserve: limit.saturating_sub(cache),
            limit,
            fixed,
        }
    }

    /// The room an open plan leaves (unbounded when nearline sized the
    /// budget).
    pub fn planned(open: &super::OpenPlan) -> Self {
        if open.budget_auto {
            return Self::UNBOUNDED;
        }
        let m = &open.memory;
        Self::of(m.budget, m.fixed() - m.worker_scratch, m.cache)
    }
}

impl SearchFacts {
    /// The facts of the index of manifest `m`, opened with a `cache`,
    /// `threads` default threads and `scratch` room for its workers.
    pub fn of(
        m: &Manifest,
        cache: preset::CacheKind,
        threads: usize,
        scratch: ScratchRoom,
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
            scratch,
        })
    }

    /// The facts of the index of manifest `m` once opened as `open` plans.
    pub fn planned(m: &Manifest, open: &super::OpenPlan) -> Result<Self> {
        Self::of(m, open.cache, open.threads, ScratchRoom::planned(open))
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
    let sigma = match (opts.sigma, f.layout.placement()) {
        (Some(s), crate::format::Placement::PageGraph) if s != 1.0 => {
            return Err(Error::arg(format!(
                "sigma={s} does not apply to a page_graph layout: a page is one graph node, so \
                 every record of a page read is expanded (sigma 1)"
            )))
        }
        (_, crate::format::Placement::PageGraph) => 1.0,
        (s, _) => s.unwrap_or(pd.sigma),
    };
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
    // vectors (an adjacency cache, lists carried by replicated pages,
    // decoupled topology records).
    let two_stage = f.cache == preset::CacheKind::Adjacency
        || page_kind == rules::PageKind::Replicas
        || f.layout.records() == crate::format::RecordFormat::Decoupled;
    let refine_ratio = match (opts.refine_ratio, two_stage) {
        (Some(r), _) if !r.is_finite() || r <= 0.0 || r > 1.0 => {
            return Err(Error::arg(format!(
                "refine_ratio={r} must be a finite fraction in (0, 1]"
            )))
        }
        (Some(_), false) => {
            return Err(Error::arg(
                "refine_ratio applies to two-stage searches: an index opened with \
                 cache=\"adjacency\" or built with a replicated or decoupled layout",
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
    // The workers' scratch must fit what the budget can give them: what it
    // reserves them, or, borrowing from the cache while the search runs,
    // everything but the fixed structures.
    let refine_at = |l: usize| match (refine, range) {
        (RefinePlan::None, _) => 0,
        (RefinePlan::Rerank { .. }, Some(_)) => l,
        (RefinePlan::Rerank { .. }, None) => match refine_ratio {
            Some(ratio) => ((ratio * l as f32).ceil() as usize).clamp(k.min(l), l),
            None => 0,
        },
    };
    let shape_at = |l: usize, w: usize| QueryShape {
        n: f.n,
        dim: f.dim,
        esz: f.esz,
        r: f.geo.max_degree,
        pq_m: f.pq_m,
        block_size: f.geo.block_size,
        records_per_block: f.geo.records_per_block,
        l,
        width: w,
        sigma: block.then_some(sigma),
        packed: f.geo.packed,
        refine: refine_at(l),
        code_groups: f.geo.code_groups(),
    };
    let list = range.map_or(l, |r| r.max_l);
    let shape = shape_at(list, w);
    let workers = threads.min(nq.max(1)) as u64;
    let need = |q: usize| workers.saturating_mul(memory::worker_bytes(&shape, q));
    let room = f.scratch;
    let mut why = why;
    if need(qif) > room.reserve && opts.queries_in_flight.is_none() && qif > 1 {
        while qif > 1 && need(qif) > room.reserve {
            qif -= 1;
        }
        why = format!(
            "auto, lowered to {qif} per worker: the budget reserves the workers {} bytes",
            room.reserve
        );
    }
    let scratch = need(qif);
    if scratch > room.limit {
        let fit = Largest::fitting(room.limit, workers, qif, &shape, k, &shape_at);
        let what = if range.is_some() { "max_L" } else { "L" };
        return Err(Error::arg(format!(
            "this search needs about {scratch} bytes of worker scratch ({workers} workers × \
             {qif} queries in flight, {what}={list}, W={w}), more than the memory budget can \
             give the workers even with the cache emptied ({} bytes); with the rest as asked, \
             {}; or open the index with a memory_budget of at least {}",
            room.limit,
            fit.describe(what),
            room.fixed.saturating_add(scratch),
        )));
    }
    if scratch > room.reserve {
        d.push("worker_scratch", scratch, || {
            format!(
                "more than the {} bytes the budget reserves the workers: the cache lends the \
                 {} bytes short (its least valuable entries) while the search runs, and takes \
                 them back after",
                room.reserve,
                scratch - room.reserve
            )
        });
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

/// The largest value of each search knob whose scratch fits a limit, the
/// others as asked (for the message of a search that does not fit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Largest {
    /// L (a range search: max_L); `None`: not even L = k fits.
    pub l: Option<usize>,
    /// W; `None`: not even 1 fits.
    pub w: Option<usize>,
    /// Threads (0: not even one fits).
    pub threads: u64,
    /// Queries in flight per worker (0: not even one fits).
    pub queries_in_flight: usize,
}

impl Largest {
    /// Each knob's largest fitting value for `workers` workers × `qif`
    /// queries of `shape` within `limit` bytes; `shape_at(l, w)` is the
    /// shape at another L or W (`l` from `k`).
    pub fn fitting(
        limit: u64,
        workers: u64,
        qif: usize,
        shape: &QueryShape,
        k: usize,
        shape_at: &dyn Fn(usize, usize) -> QueryShape,
    ) -> Self {
        let fits = |s: &QueryShape, q: usize, t: u64| {
            t.saturating_mul(memory::worker_bytes(s, q)) <= limit
        };
        let l = largest(k, MAX_LIST_SIZE, |l| {
            fits(&shape_at(l, shape.width), qif, workers)
        });
        let w = largest(1, crate::search::MAX_BEAM_WIDTH, |w| {
            fits(&shape_at(shape.l, w), qif, workers)
        });
        let threads = limit / memory::worker_bytes(shape, qif).max(1);
        let queries_in_flight = largest(1, crate::search::MAX_QUERIES_IN_FLIGHT, |q| {
            fits(shape, q, workers)
        })
        .unwrap_or(0);
        Largest {
            l,
            w,
            threads,
            queries_in_flight,
        }
    }

    /// As a message says it (`what`: "L" or "max_L").
    pub fn describe(&self, what: &str) -> String {
        let l = match self.l {
            Some(l) => format!("{what} ≤ {l}"),
            None => format!("no {what} fits"),
        };
        let w = match self.w {
            Some(w) => format!("W ≤ {w}"),
            None => "no W fits".to_string(),
        };
        let t = match self.threads {
            0 => "not even one thread fits".to_string(),
            t => format!("threads ≤ {t}"),
        };
        let q = match self.queries_in_flight {
            0 => "not even one query in flight fits".to_string(),
            q => format!("queries_in_flight ≤ {q}"),
        };
        format!("what fits is {l}, {w}, {t} or {q}")
    }
}

/// The largest `x` in `lo..=hi` with `ok(x)`, for `ok` true up to some
/// point and false after it; `None` when `ok(lo)` fails.
pub fn largest(lo: usize, hi: usize, ok: impl Fn(usize) -> bool) -> Option<usize> {
    if lo > hi || !ok(lo) {
        return None;
    }
    let (mut good, mut bad) = (lo, hi + 1);
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if ok(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Some(good)
}
