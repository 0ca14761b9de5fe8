//! `preset = "auto"`: the evaluation paper's decision rules (seed 002, its
//! Figure 17 and conclusions), checked against this engine's measurements,
//! choose the graph composition. Each candidate preset is planned in full
//! (so a candidate whose plan would exceed the memory or disk budget, or
//! that an explicit option rules out, loses with the planner's own error),
//! and the first whose rule fires on its plan is kept; the plan records
//! every candidate and why it lost.
//!
//! The rules, in the order they are tried (docs/benchmarks.md, "The
//! automatic planner", has the measurements):
//!
//! 1. **Every adjacency list fits → `dgai`, else `gorgeous`.** Paper: a
//!    cache of lists turns every hop into a memory access, so only the
//!    refine stage reads. Here: `gorgeous` on wordnet (384-d) at 20% of the
//!    raw bytes 5.95× diskannpy and 2.97× the best other preset; on 1M ×
//!    128 at 20%, where half the lists stay on disk, 0.79× diskannpy. With
//!    every list in memory the two list-cache compositions read the same
//!    pages, and DGAI's (vectors in pages of their own, topology apart,
//!    pipelined) served more in every cell measured: 1.25× / 1.17×
//!    `gorgeous` at recall 0.90 / 0.95 on wordnet at 20%, 1.20× at 0.95 at
//!    40%, 1.23× / 1.22× on 100k × 128 at 40%. So `dgai` is tried first and
//!    `gorgeous` fires on the same test where an option rules DGAI's layout
//!    out, where no `memory_budget` is given or where `pq_bytes` is (outside
//!    what was measured, [`fires`] says why). It fires when the budget holds
//!    every list beside PQ codes of at
//!    least one byte per [`GORGEOUS_DIMS_PER_PQ_BYTE`] dimensions (coarser
//!    codes rank too poorly for the refine stage: wordnet at 5% left 26
//!    bytes, recall 0.79).
//! 2. **One record per page, or PQ codes too short to rank, l2 →
//!    `alayalaser`.** Paper: with one record a page a shuffle co-locates
//!    nothing, and codes in the records free the memory PQ takes; where
//!    memory per vector is too small for useful PQ codes, the codes belong
//!    in the records. Here: 2.03× diskannpy at recall 0.99 on 768-d; at
//!    128-d (five records a page) 0.97× the `diskann` preset. On 100k × 50
//!    at 5% of the raw bytes the `diskann` preset's 4-byte codes (the most
//!    any composition with codes in RAM gets there) reached recall 0.49 at
//!    the largest L the budget serves, alayalaser 0.975 at L 20. So with
//!    several records a page it also fires when the PQ codes of the
//!    composition the later rules would choose rank the data too poorly:
//!    a build measures it (PQ recall@10 on a sample of its data, below
//!    [`MIN_PQ_RANKING_RECALL`]); a plan without the data judges by size
//!    (below [`MIN_RANKING_PQ_BYTES`]). How well codes of a size rank
//!    depends on the data, not the bytes per dimension: 16 bytes rank
//!    100k × 50 synthetic vectors at 0.566 (`alayalaser` 1.07–1.21×
//!    `starling`), 41 bytes rank wordnet's 384-d embeddings at 0.704
//!    (`starling` 1.06× `alayalaser`).
//! 3. **A static collection whose page graph packs more records →
//!    `pageann`.** Paper: the page graph wins at low dimension, where a
//!    page holds many records. Here: on 1M × 128 (7 page-graph records a
//!    page against 5 plain) 1.60× `starling` at recall 0.95 with 10% of the
//!    raw bytes and 1.08× at 20%. It takes no updates, so it fires only on
//!    the hint `write_ratio=0`; without it `starling` is kept.
//! 4. **Several records per page → `starling`.** Paper: block shuffling
//!    pays when a page holds several records (its finding that layouts use
//!    a small share of each read). Here: 1M × 128 at 20% 1.06× the `diskann`
//!    preset; wordnet at 10% 1.16×, at 5% 1.32× (recall 0.90).
//! 5. **Otherwise → `diskann`** (one record a page with the ip or cosine
//!    metric, which the coded layout does not support). The PQ-coded
//!    layout (`aisaq`) is not a rule: on 100k × 768 with cosine at 5% of
//!    the raw bytes the `diskann` preset was 2.2× it at recall 0.95 (its
//!    123-byte codes in RAM against the 75 bytes a record carries), and on
//!    wordnet at 5% the two tie (docs/benchmarks.md, AiSAQ).
//!
//! With no `memory_budget` given, each candidate is planned at its own
//! preset's default budget (what a build naming that preset would get; a
//! fixed budget would change the baseline's own PQ rule). An explicit
//! `layout` names its composition: the preset whose layout it
//! is. AiSAQ has no rule (above); the partition index (`spfresh`) is the
//! user's choice (`preset="spfresh"`), never `auto`'s. Where the lists do
//! not fit, `dgai` is no rule's choice either: on wordnet at 5% it read
//! 4–5× diskannpy, and at 10% it tied `alayalaser` and `starling`
//! (docs/benchmarks.md, DGAI).

use super::options::{BuildOptions, PresetChoice};
use super::{plan_named, DataFacts, Decision, PlannedBuild};
use crate::distance::Metric;
use crate::format::{LayoutKind, PageGeometry, Preset};
use crate::{Error, Result};

/// Gorgeous' rule fires only when every list fits beside PQ codes of at
/// least `ceil(dim / 4)` bytes. At 384-d the build's selection kept 115–123
/// bytes where every list fit (and its passing size was below that); at
/// 5% of wordnet the 26 bytes the lists left did not pass (recall 0.79).
pub const GORGEOUS_DIMS_PER_PQ_BYTE: usize = 4;

/// PQ codes in RAM shorter than this rank too coarsely to steer a search:
/// on 100k × 50 the `diskann` preset's 4-byte codes reached recall 0.49 at
/// L 100 and diskannpy's 9-byte codes 0.94 at L 200, where 16-byte codes
/// (`starling` at 20%) reached 0.96 at L 30 (docs/benchmarks.md, "Every
/// preset on 100k × 50").
pub const MIN_RANKING_PQ_BYTES: usize = 16;

/// PQ codes whose own ranking finds fewer than this share of a sample's
/// exact 10 nearest neighbours in its top 10 steer a search worse than the
/// codes in the records: measured on 100k × 50 at 20% of the raw bytes,
/// where `starling`'s 16-byte codes rank at 0.566 and `alayalaser` is
/// 1.07–1.21× it, and on wordnet at 5%, where `starling`'s 41-byte codes
/// rank at 0.704 and it is 1.06× `alayalaser` (docs/benchmarks.md, "The
/// automatic planner"); the threshold is their midpoint.
pub const MIN_PQ_RANKING_RECALL: f64 = 0.63;

/// The candidates in the order the rules try them, each with the rule's
/// one-line reason.
fn candidates(opts: &BuildOptions) -> Vec<(Preset, &'static str)> {
    if let Some(layout) = opts.layout {
        let p = match layout {
            LayoutKind::ID => Preset::Diskann,
            LayoutKind::SHUFFLED => Preset::Starling,
            LayoutKind::PAGE_GRAPH => Preset::Pageann,
            LayoutKind::Replicated => Preset::Gorgeous,
            LayoutKind::Coded => Preset::Alayalaser,
            LayoutKind::PqCoded => Preset::Aisaq,
            LayoutKind::Decoupled => Preset::Dgai,
        };
        return vec![(p, "the composition whose layout was asked for")];
    }
    vec![
        (
            Preset::Dgai,
            "DGAI: every adjacency list fits in memory, so no hop reads a page; the refine \
             stage reads vectors from pages that hold vectors only",
        ),
        (
            Preset::Gorgeous,
            "Gorgeous: every adjacency list fits in memory, so no hop reads a page and only \
             the refine stage does",
        ),
        (
            Preset::Alayalaser,
            "AlayaLaser: one record a page (a shuffle co-locates nothing) or PQ codes in RAM \
             too short to rank, so the neighbour codes ride in the records and the memory PQ \
             would take serves the cache",
        ),
        (
            Preset::Pageann,
            "PageANN: the collection is static and a page graph packs more records a page \
             than plain records with a list each, so a read brings more vectors and one list \
             of the page's edges",
        ),
        (
            Preset::Starling,
            "Starling: several records share a page, so a shuffled layout brings a node's \
             graph neighbours in with each read",
        ),
        (
            Preset::Diskann,
            "DiskANN: the baseline, when no other rule fires",
        ),
    ]
}

/// Records of `dim` elements of `esz` bytes and degree `r` a `page_size`
/// page holds in the plain (id-order) layout.
fn plain_records_per_page(f: &DataFacts, r: usize, page_size: usize) -> Result<usize> {
    Ok(
        PageGeometry::with_codes(page_size, f.dim * f.dtype.size(), r, 0, 0, f.n)?
            .records_per_block,
    )
}

/// Whether plan `p` holds every adjacency list in memory beside PQ codes
/// long enough to rank for the refine stage (rule 1, for `dgai` and
/// `gorgeous` alike): `Ok(why)` if so, else `Err(why not)`.
fn every_list_fits(f: &DataFacts, p: &PlannedBuild) -> std::result::Result<String, String> {
    let plan = &p.plan;
    let need = f.dim.div_ceil(GORGEOUS_DIMS_PER_PQ_BYTE).max(1);
    let fill = match &plan.pq_selection {
        Some(s) => s.alternative.map(|a| a.fill).max(s.fill),
        // PQ bytes given: whether the cache share holds every list.
        None => (p.memory.cache_nodes >= f.n as u64).then_some(plan.pq_bytes),
    };
    match fill {
        Some(m) if m >= need => Ok(format!(
            "every adjacency list (at R={}) fits in the {}-byte budget beside PQ codes of up to \
             {m} bytes (at least {need} = dim/{GORGEOUS_DIMS_PER_PQ_BYTE} needed)",
            plan.r, plan.memory_budget
        )),
        Some(m) => Err(format!(
            "every adjacency list fits only beside PQ codes of {m} bytes, below the {need} \
             (dim/{GORGEOUS_DIMS_PER_PQ_BYTE}) that rank well enough to refine"
        )),
        None => Err(format!(
            "the {}-byte budget cannot hold every adjacency list (at R={}) beside PQ codes: \
             hops that miss the cache would read pages",
            plan.memory_budget, plan.r
        )),
    }
}

/// Whether `preset`'s rule fires on its plan `p`: `Ok(why)` if so, else
/// `Err(why it lost)`.
fn fires(
    preset: Preset,
    opts: &BuildOptions,
    f: &DataFacts,
    p: &PlannedBuild,
) -> std::result::Result<String, String> {
    let plan = &p.plan;
    match preset {
        // DGAI's traversal reads topology pages, which carry no vector, and
        // its refine stage ranks by the PQ codes alone, so it is chosen only
        // where it was measured: a budget given (one nearline sizes itself
        // is split at open with four queries per worker before the lists)
        // and codes the build's selection keeps (ranking a sample well).
        Preset::Dgai if opts.memory_budget.is_none() => Err(
            "no memory_budget given: an open splits a budget nearline sizes itself with four \
             queries per worker before the lists, so hops would read topology pages, which \
             carry no vector (gorgeous' pages serve those hops)"
                .into(),
        ),
        Preset::Dgai if opts.pq_bytes.is_some() => Err(
            "pq_bytes given: DGAI's refine stage ranks by the PQ codes alone, measured only \
             with the codes the build's selection keeps for ranking a sample well"
                .into(),
        ),
        Preset::Dgai | Preset::Gorgeous => every_list_fits(f, p),
        Preset::Alayalaser => {
            let rpp =
                plain_records_per_page(f, plan.r, plan.page_size).map_err(|e| e.to_string())?;
            if opts.metric != Metric::L2 {
                Err(format!(
                    "the coded layout supports the l2 metric only (this build: {})",
                    opts.metric
                ))
            } else if rpp > 1 {
                // Decided against the composition the later rules would
                // choose (`plan_auto`).
                Err(format!(
                    "a {}-byte page holds {rpp} plain records (shuffling co-locates neighbours)",
                    plan.page_size
                ))
            } else {
                Ok(format!(
                    "a {}-byte page holds one plain record",
                    plan.page_size
                ))
            }
        }
        Preset::Pageann => {
            if opts.write_ratio != Some(0.0) {
                return Err(
                    "no write_ratio=0 hint: a page graph takes no updates, so it is chosen \
                     only for a collection declared static"
                        .into(),
                );
            }
            let rpp =
                plain_records_per_page(f, plan.r, plan.page_size).map_err(|e| e.to_string())?;
            let pg = PageGeometry::page_graph(plan.page_size, f.dim * f.dtype.size(), plan.r, f.n)
                .map_err(|e| e.to_string())?
                .records_per_block;
            if rpp > 1 && pg > rpp {
                Ok(format!(
                    "write_ratio=0 and a {}-byte page holds {pg} page-graph records against \
                     {rpp} plain ones",
                    plan.page_size
                ))
            } else {
                Err(format!(
                    "a {}-byte page holds {pg} page-graph records and {rpp} plain ones: a page \
                     graph packs no more",
                    plan.page_size
                ))
            }
        }
        Preset::Starling => {
            let rpp =
                plain_records_per_page(f, plan.r, plan.page_size).map_err(|e| e.to_string())?;
            if rpp > 1 {
                Ok(format!(
                    "a {}-byte page holds {rpp} plain records",
                    plan.page_size
                ))
            } else {
                Err(format!(
                    "a {}-byte page holds one plain record: a shuffle co-locates nothing",
                    plan.page_size
                ))
            }
        }
        _ => Ok("no other rule fired".into()),
    }
}

/// How well PQ codes of a given size rank the data being built (PQ
/// recall@10 on a sample, `build::pq::ranking_recall`); `Ok(None)` when
/// the data is too small to tell.
pub type RankingProbe<'a> = &'a dyn Fn(usize) -> Result<Option<f64>>;

/// Plans a build with `preset = "auto"`: the first candidate whose plan
/// succeeds and whose rule fires. `probe`: the build's measure of how well
/// PQ codes rank its data (a plan without the data has none and judges PQ
/// codes by their size).
pub(super) fn plan_auto(
    opts: &BuildOptions,
    f: &DataFacts,
    probe: Option<RankingProbe<'_>>,
) -> Result<PlannedBuild> {
    debug_assert_eq!(opts.preset, PresetChoice::Auto);
    let list = candidates(opts);
    let forced = list.len() == 1;
    let mut lost: Vec<Decision> = Vec::new();
    pick(&list, forced, opts, f, probe, &mut lost)
}

/// The first of `list` whose plan succeeds and whose rule fires, after
/// the candidates in `lost`.
fn pick(
    list: &[(Preset, &'static str)],
    forced: bool,
    opts: &BuildOptions,
    f: &DataFacts,
    probe: Option<RankingProbe<'_>>,
    lost: &mut Vec<Decision>,
) -> Result<PlannedBuild> {
    let mut last_err: Option<Error> = None;
    for (i, &(preset, reason)) in list.iter().enumerate() {
        let o = BuildOptions {
            preset: PresetChoice::Named(preset),
            ..opts.clone()
        };
        let planned = match plan_named(&o, f) {
            Ok(p) => p,
            Err(e) => {
                lost.push(Decision::new("candidate", preset, format!("lost: {e}")));
                last_err = Some(e);
                continue;
            }
        };
        let why = if forced {
            Ok(reason.to_string())
        } else {
            fires(preset, opts, f, &planned)
        };
        let fired = match why {
            Ok(why) => Some(why),
            Err(why) if preset == Preset::Alayalaser && opts.metric == Metric::L2 && !forced => {
                // Several records a page: the codes go in the records only
                // if the PQ codes of the composition the later rules would
                // choose rank this data too poorly to steer a search.
                let mut rest_lost = Vec::new();
                let rest = pick(&list[i + 1..], false, opts, f, probe, &mut rest_lost);
                let verdict = match &rest {
                    Ok(next) => pq_ranks_poorly(next, probe)?,
                    Err(e) => Some(format!(
                        "no composition with PQ codes in RAM fits the budget ({e})"
                    )),
                };
                match (verdict, rest) {
                    (Some(poor), _) => Some(poor),
                    (None, Ok(mut next)) => {
                        let ranks = pq_ranking_note(&next, probe)?;
                        // The rule the build records says what it measured
                        // for the codes it kept, as it does when they lose.
                        if let Some(rule) = next.plan.auto_rule.as_mut() {
                            rule.push_str(&format!("; {ranks}"));
                            let kept = rule.clone();
                            if let Some(d) = next.decisions.iter_mut().find(|d| d.what == "preset")
                            {
                                d.rule = kept;
                            }
                        }
                        lost.push(Decision::new(
                            "candidate",
                            preset,
                            format!("lost: {why}, and {ranks}"),
                        ));
                        lost.append(&mut rest_lost);
                        return Ok(splice_lost(next, std::mem::take(lost)));
                    }
                    (None, Err(e)) => return Err(e),
                }
            }
            Err(why) => {
                lost.push(Decision::new("candidate", preset, format!("lost: {why}")));
                None
            }
        };
        if let Some(why) = fired {
            let lost = std::mem::take(lost);
            return Ok(with_auto_decisions(planned, preset, reason, why, lost));
        }
    }
    Err(last_err.unwrap_or_else(|| Error::arg("no composition fits this build")))
}

/// `Some(why)` when the PQ codes of plan `p` rank the data too poorly to
/// steer a search: by `probe` where the build measured it (PQ recall@10
/// below [`MIN_PQ_RANKING_RECALL`]), else by their size (below
/// [`MIN_RANKING_PQ_BYTES`]).
fn pq_ranks_poorly(p: &PlannedBuild, probe: Option<RankingProbe<'_>>) -> Result<Option<String>> {
    let m = p.plan.pq_bytes;
    let preset = p.plan.preset;
    if let Some(probe) = probe {
        if let Some(r) = probe(m)? {
            return Ok((r < MIN_PQ_RANKING_RECALL).then(|| {
                format!(
                    "the {preset} composition the other rules would choose keeps PQ codes of {m} \
                     bytes, which rank this data at recall@10 {r:.3} on a sample, below the \
                     {MIN_PQ_RANKING_RECALL} that steers a search"
                )
            }));
        }
    }
    Ok((m < MIN_RANKING_PQ_BYTES).then(|| {
        format!(
            "the {preset} composition the other rules would choose keeps PQ codes of {m} bytes, \
             fewer than the {MIN_RANKING_PQ_BYTES} that rank well enough to steer a search"
        )
    }))
}

/// Why plan `p`'s PQ codes rank well enough (the complement of
/// [`pq_ranks_poorly`]).
fn pq_ranking_note(p: &PlannedBuild, probe: Option<RankingProbe<'_>>) -> Result<String> {
    let m = p.plan.pq_bytes;
    if let Some(probe) = probe {
        if let Some(r) = probe(m)? {
            return Ok(format!(
                "the {} composition's PQ codes of {m} bytes rank this data at recall@10 {r:.3} \
                 on a sample (at least {MIN_PQ_RANKING_RECALL})",
                p.plan.preset
            ));
        }
    }
    Ok(format!(
        "the {} composition's PQ codes of {m} bytes are long enough to rank (at least \
         {MIN_RANKING_PQ_BYTES}; a build measures their ranking on the data)",
        p.plan.preset
    ))
}

/// `p` with `lost` inserted right after its preset decision.
fn splice_lost(mut p: PlannedBuild, lost: Vec<Decision>) -> PlannedBuild {
    let at = p
        .decisions
        .iter()
        .position(|d| d.what == "preset")
        .map_or(0, |i| i + 1);
    p.decisions.splice(at..at, lost);
    p
}

/// `p` with its preset decision saying why `auto` chose it, after the
/// candidates that lost.
fn with_auto_decisions(
    mut p: PlannedBuild,
    preset: Preset,
    reason: &str,
    why: String,
    lost: Vec<Decision>,
) -> PlannedBuild {
    let rule = format!("auto: {reason} ({why})");
    p.plan.auto_rule = Some(rule.clone());
    match p.decisions.iter_mut().find(|d| d.what == "preset") {
        Some(d) => d.rule = rule,
        None => p.decisions.insert(0, Decision::new("preset", preset, rule)),
    }
    splice_lost(p, lost)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::BuildPlan;
    use crate::elem::DType;
    use crate::planner::plan_build;
    use crate::util::budget::Budget;

    fn facts(n: usize, dim: usize) -> DataFacts {
        DataFacts {
            n,
            dim,
            dtype: DType::F32,
        }
    }

    /// The rule the plan gives for its preset.
    fn preset_rule(p: &PlannedBuild) -> &str {
        &p.decisions
            .iter()
            .find(|d| d.what == "preset")
            .unwrap()
            .rule
    }

    /// Why candidate `preset` lost in plan `p`.
    fn lost_rule<'a>(p: &'a PlannedBuild, preset: &str) -> &'a str {
        &p.decisions
            .iter()
            .find(|d| d.what == "candidate" && d.value == preset)
            .unwrap_or_else(|| panic!("{preset} did not lose"))
            .rule
    }

    fn auto(budget: f64) -> BuildOptions {
        BuildOptions {
            memory_budget: Some(Budget::Fraction(budget)),
            ..BuildOptions::default()
        }
    }

    /// The composition `auto` picks for 100k vectors of each dimension at 5%,
    /// 20% and 40% of the raw bytes, as the rules in this module's doc say.
    #[test]
    fn auto_picks_what_the_rules_say() {
        use Preset::{Alayalaser as A, Dgai as D, Starling as S};
        // dim: [5%, 20%, 40%]. 50-d at 5% (1 MB): starling does not fit
        // and the `diskann` preset's codes would be 4 bytes; 128-d at 5%:
        // starling's codes would be 5 bytes. So the codes go in the records.
        let table: [(usize, [Preset; 3]); 5] = [
            (50, [A, S, S]),
            (128, [A, S, D]),
            (384, [S, D, D]),
            (768, [A, D, D]),
            (1536, [A, D, D]),
        ];
        let mut got = Vec::new();
        for (dim, want) in table {
            for (b, w) in [0.05, 0.2, 0.4].into_iter().zip(want) {
                let f = facts(100_000, dim);
                let p = plan_build(&auto(b), &f).unwrap();
                let lost: Vec<String> = p
                    .decisions
                    .iter()
                    .filter(|d| d.what == "candidate")
                    .map(|d| format!("{} {}", d.value, d.rule))
                    .collect();
                got.push((dim, b, p.plan.preset, w, lost));
                // Never beyond the budget it was given.
                let (held, budget) = (
                    p.memory.fixed() + p.memory.cache,
                    Budget::Fraction(b).resolve(f.raw_bytes()),
                );
                assert!(
                    p.memory.budget == budget && held <= budget,
                    "{dim}-d at {b}: {held} bytes planned in {} of {budget}",
                    p.memory.budget
                );
                let why = preset_rule(&p);
                assert!(why.starts_with("auto: "), "{why}");
            }
        }
        let wrong: Vec<_> = got.iter().filter(|g| g.2 != g.3).collect();
        assert!(wrong.is_empty(), "(dim, budget, got, want): {wrong:?}");
    }

    /// Where even the baseline's PQ codes would be too short to rank, the
    /// codes go in the records (l2); with cosine the coded layout is out
    /// and the baseline stays.
    #[test]
    fn codes_too_short_to_rank_put_the_codes_in_the_records() {
        let f = facts(100_000, 50);
        let p = plan_build(&auto(0.05), &f).unwrap();
        assert_eq!(p.plan.preset, Preset::Alayalaser);
        let why = preset_rule(&p);
        assert!(
            why.contains(
                "the diskann composition the other rules would choose keeps PQ codes of 4 bytes"
            ),
            "{why}"
        );
        // At 20% the baseline keeps 33 bytes: the rule does not fire.
        let p = plan_build(&auto(0.2), &f).unwrap();
        assert_eq!(p.plan.preset, Preset::Starling);
        let cos = BuildOptions {
            metric: Metric::Cosine,
            ..auto(0.05)
        };
        let p = plan_build(&cos, &f).unwrap();
        assert_eq!(p.plan.preset, Preset::Diskann);
    }

    /// Where the build measured how well PQ codes rank its data, that
    /// measure decides instead of their size: 50-d at 20% keeps 16-byte
    /// codes (long enough by size) for `starling`, which rank a sample of
    /// the synthetic set at 0.566 (wordnet's 41-byte codes: 0.704).
    #[test]
    fn a_measured_ranking_decides_where_the_build_has_one() {
        let f = facts(100_000, 50);
        let asked = std::cell::RefCell::new(Vec::new());
        let with = |r: f64| {
            let probe = |m: usize| -> Result<Option<f64>> {
                asked.borrow_mut().push(m);
                Ok(Some(r))
            };
            crate::planner::plan_build_probed(&auto(0.2), &f, Some(&probe)).unwrap()
        };
        let p = with(0.55);
        assert_eq!(p.plan.preset, Preset::Alayalaser);
        let why = preset_rule(&p);
        // The build records the rule in its manifest.
        assert_eq!(p.plan.auto_rule.as_deref(), Some(why));
        assert!(
            why.contains("PQ codes of 16 bytes") && why.contains("recall@10 0.550"),
            "{why}"
        );
        // Asked for the PQ size of the composition it would otherwise keep.
        assert_eq!(asked.borrow().as_slice(), &[16]);
        let p = with(0.7);
        assert_eq!(p.plan.preset, Preset::Starling);
        let lost = lost_rule(&p, "alayalaser");
        assert!(lost.contains("recall@10 0.700"), "{lost}");
        // The rule the build records for the codes it kept says so too.
        let kept = p.plan.auto_rule.as_deref().unwrap();
        assert_eq!(kept, preset_rule(&p));
        assert!(
            kept.contains("several records") && kept.contains("recall@10 0.700"),
            "{kept}"
        );
        // A sample too small to tell: the size decides (16 bytes: starling).
        let none = |_m: usize| -> Result<Option<f64>> { Ok(None) };
        let p = crate::planner::plan_build_probed(&auto(0.2), &f, Some(&none)).unwrap();
        assert_eq!(p.plan.preset, Preset::Starling);
        // A failing probe fails the plan.
        let bad = |_m: usize| -> Result<Option<f64>> { Err(Error::arg("probe failed")) };
        let e = crate::planner::plan_build_probed(&auto(0.2), &f, Some(&bad)).unwrap_err();
        assert!(e.to_string().contains("probe failed"), "{e}");
        // The coded layout is l2 only: cosine never asks.
        let cos = BuildOptions {
            metric: Metric::Cosine,
            ..auto(0.2)
        };
        asked.borrow_mut().clear();
        let probe = |m: usize| -> Result<Option<f64>> {
            asked.borrow_mut().push(m);
            Ok(Some(0.1))
        };
        let p = crate::planner::plan_build_probed(&cos, &f, Some(&probe)).unwrap();
        assert_ne!(p.plan.preset, Preset::Alayalaser);
        assert!(asked.borrow().is_empty());
    }

    /// A collection declared static (`write_ratio=0`) gets the page graph
    /// where it packs more records a page than plain records; without the
    /// hint, or where it packs no more, the other rules decide.
    #[test]
    fn a_static_collection_gets_a_page_graph_where_it_packs_more() {
        let fixed = |b: f64| BuildOptions {
            write_ratio: Some(0.0),
            ..auto(b)
        };
        for (dim, b, want) in [
            (50, 0.2, Preset::Pageann),
            (128, 0.2, Preset::Pageann),
            // At 5% the page graph's codes would be 8 bytes: too short to rank.
            (128, 0.05, Preset::Alayalaser),
            // 384-d: two records a page either way (dgai at 20%).
            (384, 0.05, Preset::Starling),
            (384, 0.2, Preset::Dgai),
            // One record a page: alayalaser.
            (768, 0.05, Preset::Alayalaser),
        ] {
            let p = plan_build(&fixed(b), &facts(100_000, dim)).unwrap();
            assert_eq!(p.plan.preset, want, "{dim}-d at {b}");
        }
        let p = plan_build(&auto(0.2), &facts(100_000, 128)).unwrap();
        assert_eq!(p.plan.preset, Preset::Starling);
        let lost = lost_rule(&p, "pageann");
        assert!(lost.contains("write_ratio=0"), "{lost}");
        let p = plan_build(
            &BuildOptions {
                write_ratio: Some(0.1),
                ..auto(0.2)
            },
            &facts(100_000, 128),
        )
        .unwrap();
        assert_eq!(p.plan.preset, Preset::Starling);
    }

    #[test]
    fn every_lost_candidate_says_why() {
        // 768-d at 5%: the lists do not fit (dgai and gorgeous lose), one
        // record a page (alayalaser wins).
        let p = plan_build(&auto(0.05), &facts(100_000, 768)).unwrap();
        let lost: Vec<_> = p
            .decisions
            .iter()
            .filter(|d| d.what == "candidate")
            .collect();
        let names: Vec<_> = lost.iter().map(|d| d.value.as_str()).collect();
        assert_eq!(names, ["dgai", "gorgeous"], "{lost:?}");
        for d in lost {
            assert!(
                d.rule.contains("cannot hold every adjacency list"),
                "{}",
                d.rule
            );
        }
    }

    /// Where every list fits, `dgai` is tried first; where a build option
    /// rules its layout out (here a disk budget its vector pages exceed,
    /// which the replicated layout meets by packing fewer lists), the same
    /// test keeps `gorgeous`.
    #[test]
    fn every_list_fitting_keeps_dgai_else_gorgeous() {
        let f = facts(100_000, 384);
        let p = plan_build(&auto(0.2), &f).unwrap();
        assert_eq!(p.plan.preset, Preset::Dgai);
        let why = preset_rule(&p);
        assert!(
            why.starts_with("auto: DGAI") && why.contains("every adjacency list"),
            "{why}"
        );
        // One plain record a page: what the page file takes without lists.
        let plain = PageGeometry::with_codes(4096, 384 * 4, 64, 0, 0, f.n)
            .unwrap()
            .file_bytes();
        let decoupled = PageGeometry::decoupled(4096, 384 * 4, 64, f.n)
            .unwrap()
            .file_bytes();
        assert!(plain < decoupled);
        let o = BuildOptions {
            disk_budget: Some(plain),
            ..auto(0.2)
        };
        let p = plan_build(&o, &f).unwrap();
        assert_eq!(p.plan.preset, Preset::Gorgeous);
        assert!(preset_rule(&p).starts_with("auto: Gorgeous"));
        let lost = lost_rule(&p, "dgai");
        assert!(lost.contains("disk_budget"), "{lost}");
        // Outside what was measured (a budget given, the build's PQ
        // selection), DGAI loses with the reason and gorgeous' test decides.
        for (o, why) in [
            (BuildOptions::default(), "no memory_budget given"),
            (
                BuildOptions {
                    pq_bytes: Some(96),
                    ..auto(0.4)
                },
                "pq_bytes given",
            ),
        ] {
            let p = plan_build(&o, &f).unwrap();
            assert_eq!(p.plan.preset, Preset::Gorgeous);
            let lost = lost_rule(&p, "dgai");
            assert!(lost.contains(why), "{lost}");
        }
    }

    #[test]
    fn the_coded_layout_is_not_chosen_for_inner_product() {
        for metric in [Metric::InnerProduct, Metric::Cosine] {
            let o = BuildOptions {
                metric,
                ..auto(0.05)
            };
            let p = plan_build(&o, &facts(100_000, 768)).unwrap();
            assert_eq!(p.plan.preset, Preset::Diskann);
            let lost: Vec<_> = p
                .decisions
                .iter()
                .filter(|d| d.what == "candidate")
                .map(|d| d.value.as_str())
                .collect();
            assert_eq!(
                lost,
                ["dgai", "gorgeous", "alayalaser", "pageann", "starling"]
            );
        }
    }

    #[test]
    fn an_option_a_candidate_refuses_makes_it_lose() {
        // pq_bytes does not apply to the coded layout: the next rule decides.
        let o = BuildOptions {
            pq_bytes: Some(64),
            ..auto(0.05)
        };
        let p = plan_build(&o, &facts(100_000, 768)).unwrap();
        assert_eq!(p.plan.preset, Preset::Diskann);
        let a = p
            .decisions
            .iter()
            .find(|d| d.value == "alayalaser")
            .unwrap();
        assert!(a.rule.contains("pq_bytes does not apply"), "{}", a.rule);
    }

    #[test]
    fn a_layout_asked_for_names_its_composition() {
        for (layout, preset) in [
            (LayoutKind::ID, Preset::Diskann),
            (LayoutKind::SHUFFLED, Preset::Starling),
            (LayoutKind::PAGE_GRAPH, Preset::Pageann),
            (LayoutKind::Replicated, Preset::Gorgeous),
            (LayoutKind::Coded, Preset::Alayalaser),
            (LayoutKind::PqCoded, Preset::Aisaq),
            (LayoutKind::Decoupled, Preset::Dgai),
        ] {
            let o = BuildOptions {
                layout: Some(layout),
                ..auto(0.2)
            };
            assert_eq!(
                plan_build(&o, &facts(50_000, 128)).unwrap().plan.preset,
                preset
            );
        }
    }

    #[test]
    fn a_disk_budget_no_candidate_meets_is_refused() {
        let o = BuildOptions {
            disk_budget: Some(1 << 20),
            ..auto(0.2)
        };
        let e = plan_build(&o, &facts(100_000, 128))
            .unwrap_err()
            .to_string();
        assert!(e.contains("disk_budget"), "{e}");
    }

    #[test]
    fn with_no_budget_each_candidate_has_its_presets_default() {
        let f = facts(100_000, 128);
        let own = BuildOptions {
            preset: PresetChoice::Named(Preset::Starling),
            ..BuildOptions::default()
        };
        let want = plan_build(&own, &f).unwrap().plan;
        let p = plan_build(&BuildOptions::default(), &f).unwrap();
        // 128-d: the lists (14 MB) do not fit gorgeous' default 20% (10.2
        // MB); five records a page.
        assert_eq!(p.plan.preset, Preset::Starling);
        // The same plan, with the rule that chose it.
        assert!(p.plan.auto_rule.is_some() && want.auto_rule.is_none());
        assert_eq!(
            BuildPlan {
                auto_rule: None,
                ..p.plan.clone()
            },
            want
        );
        assert!(p.plan.memory_budget_auto);
    }

    #[test]
    fn a_named_preset_is_planned_as_asked() {
        let o = BuildOptions {
            preset: PresetChoice::Named(Preset::Pipeann),
            ..auto(0.2)
        };
        let p = plan_build(&o, &facts(100_000, 768)).unwrap();
        assert_eq!(p.plan.preset, Preset::Pipeann);
        assert!(!p.decisions.iter().any(|d| d.what == "candidate"));
    }

    #[test]
    fn a_write_ratio_keeps_room_for_the_update_delta() {
        // wordnet's shape at 20% of the raw bytes: DiskANN's rule lets the PQ
        // codes fill what the structures leave, so the delta gets almost nothing.
        let f = facts(114_895, 384);
        let plan = |w: Option<f64>| {
            let o = BuildOptions {
                preset: PresetChoice::Named(Preset::Diskann),
                write_ratio: w,
                ..auto(0.2)
            };
            plan_build(&o, &f).unwrap()
        };
        let (read_only, writes) = (plan(None), plan(Some(0.3)));
        assert!(writes.plan.pq_bytes < read_only.plan.pq_bytes);
        // The codes give up about the reserve (30% of what the structures and
        // workers leave, nearly all of which the codes took): room the open
        // plan's delta share (half of what the budget leaves beyond its
        // minimum) then has.
        let freed = read_only.memory.pq_codes - writes.memory.pq_codes;
        assert!(
            freed as f64 >= 0.2 * read_only.memory.pq_codes as f64,
            "{freed}"
        );
        assert_eq!(writes.memory.budget, read_only.memory.budget);
        let said = |p: &PlannedBuild, what: &str| {
            p.decisions
                .iter()
                .find(|d| d.what == what)
                .map(|d| d.value.clone())
        };
        assert_eq!(said(&writes, "update_reserve").as_deref(), Some("30%"));
        assert_eq!(said(&read_only, "update_reserve").as_deref(), Some("0%"));
        assert_eq!(
            said(&writes, "update_strategy").as_deref(),
            Some("out-of-place")
        );
        // The reserve is capped at half; pq_bytes asked for is kept as asked.
        let all = plan(Some(1.0));
        assert_eq!(said(&all, "update_reserve").as_deref(), Some("50%"));
        let asked = BuildOptions {
            pq_bytes: Some(32),
            write_ratio: Some(0.5),
            ..auto(0.2)
        };
        assert_eq!(plan_build(&asked, &f).unwrap().plan.pq_bytes, 32);
        for bad in [-0.1, 1.5, f64::NAN] {
            let o = BuildOptions {
                write_ratio: Some(bad),
                ..auto(0.2)
            };
            let e = plan_build(&o, &f).unwrap_err().to_string();
            assert!(e.contains("write_ratio"), "{e}");
        }
    }
}
