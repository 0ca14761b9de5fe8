//! Tests of Starling's page policy and range search on a shuffled layout:
//! block search against brute force and over the fake engine, its
//! locality, range search against brute force and the entry cutoff. The
//! fixtures and helpers are the search tests' (`search::tests`).

use crate::index::Index;
use crate::io::{EngineKind, FakeOptions, IoEngine};
use crate::planner::{BuildOptions, ExecutorChoice, PageChoice, RangeOptions};
use crate::search::executor::Scratch;
use crate::search::plan::RangeParams;
use crate::search::stats::QueryStats;
use crate::search::tests::{
    brute_force, build_with, counts, data, fixture, kinds, open, params, run_all, search,
    shuffled_fixture, test_build_options, Fixture, DIM, N, P,
};
use proptest::prelude::*;
use std::collections::HashSet;

fn with_pages(p: P, page_search: PageChoice) -> P {
    P { page_search, ..p }
}

#[test]
fn block_search_is_exact_with_a_full_list() {
    let f = fixture();
    let sf = shuffled_fixture();
    let nq = 8;
    let queries = &f.queries[..nq * DIM];
    let cases: Vec<(&str, &Index, PageChoice)> = vec![
        ("shuffled/auto", &sf.plain, PageChoice::Auto),
        ("shuffled/auto cached", &sf.cached, PageChoice::Auto),
        ("shuffled/targets", &sf.plain, PageChoice::Targets),
        ("id/block", &f.plain, PageChoice::Block),
    ];
    for (layout, idx, ps) in cases {
        for (name, p) in kinds() {
            for sigma in [0.3f32, 1.0] {
                let p = P {
                    sigma,
                    ..with_pages(p, ps)
                };
                let out = search(idx, queries, nq, &p, 2).unwrap();
                for (qi, q) in queries.chunks_exact(DIM).enumerate() {
                    let want = brute_force(f, q, 10);
                    let got: Vec<(f32, i64)> = (0..10)
                        .map(|j| (out.distances[qi * 10 + j], out.ids[qi * 10 + j]))
                        .collect();
                    assert_eq!(got, want, "{layout} {name} σ={sigma} query {qi}");
                    let st = &out.stats[qi];
                    assert!(
                        st.used_records <= st.page_records,
                        "{layout} {name}: {st:?}"
                    );
                    let block = ps == PageChoice::Block
                        || (ps == PageChoice::Auto && layout.starts_with("shuffled"));
                    // Block search expands co-located records; target
                    // search never does.
                    assert_eq!(
                        st.colocated > 0,
                        block && st.reads > 0,
                        "{layout} {name}: {st:?}"
                    );
                    assert_eq!(st.path_length() + st.colocated, st.hops);
                }
            }
        }
    }
}

#[test]
fn shuffled_layout_improves_locality_and_vertex_utilisation() {
    let f = fixture();
    let sf = shuffled_fixture();
    let m = sf.plain.manifest().unwrap();
    assert_eq!(m.layout.kind, crate::format::LayoutKind::SHUFFLED);
    let info = m.layout.shuffle.as_ref().unwrap();
    let or_g = m.layout.overlap_ratio.unwrap();
    assert!(
        or_g >= info.id_overlap_ratio,
        "{or_g} < {}",
        info.id_overlap_ratio
    );
    // Ids are shuffled, so the ID layout has almost no locality; BNF puts
    // neighbours together (at most R = 16 of a node's 29 page-mates can be
    // its neighbours).
    assert!(
        or_g > 5.0 * info.id_overlap_ratio.max(0.005),
        "OR(G) = {or_g}, ID {}",
        info.id_overlap_ratio
    );
    let id_or = f.plain.manifest().unwrap().layout.overlap_ratio.unwrap();
    assert!((id_or - info.id_overlap_ratio).abs() < 1e-9);
    // The placement is a permutation within capacity.
    let d_ref = data(&sf.plain);
    let d = &*d_ref;
    let rpb = d.geo.records_per_block;
    let mut seen = vec![0u32; N];
    for b in 0..d.geo.n_blocks {
        let mut nodes = Vec::new();
        d.layout.block_nodes(b, &mut nodes);
        assert!(nodes.len() <= rpb);
        for v in nodes {
            seen[v as usize] += 1;
        }
    }
    assert!(seen.iter().all(|&c| c == 1));
    // Block search on shuffled pages uses more of each page than the
    // ID layout's target search.
    let nq = 16;
    let queries = &f.queries[..nq * DIM];
    let p = P::new(10, 60, 4);
    let xi = |idx: &Index| {
        let out = search(idx, queries, nq, &p, 1).unwrap();
        let used: u64 = out.stats.iter().map(|s| s.used_records as u64).sum();
        let held: u64 = out.stats.iter().map(|s| s.page_records as u64).sum();
        used as f64 / held as f64
    };
    let (x_id, x_sh) = (xi(&f.plain), xi(&sf.plain));
    assert!(x_sh > 1.5 * x_id, "ξ shuffled {x_sh} vs ID {x_id}");
}

/// Exact range answer: (distance, external id) within `r`, closest first.
fn brute_range(f: &Fixture, q: &[f32], r: f32) -> Vec<(f32, i64)> {
    let mut all = brute_force(f, q, N);
    all.retain(|e| e.0 <= r);
    all
}

#[test]
fn range_search_matches_brute_force() {
    let f = fixture();
    let sf = shuffled_fixture();
    let nq = 8;
    let queries = &f.queries[..nq * DIM];
    // A radius with ~40 true neighbours per query on average.
    let mut d40: Vec<f32> = queries
        .chunks_exact(DIM)
        .map(|q| brute_force(f, q, 40)[39].0)
        .collect();
    d40.sort_by(f32::total_cmp);
    let radius = d40[nq / 2];
    for (layout, idx) in [
        ("id", &f.plain),
        ("shuffled", &sf.plain),
        ("id cached", &f.cached),
    ] {
        for (name, p) in kinds() {
            for l in [N, 16] {
                let p = P {
                    l,
                    k: 10.min(l),
                    ..p
                };
                let out = idx
                    .range_search(
                        queries,
                        nq,
                        radius,
                        &RangeOptions {
                            max_l: Some(N),
                            ..Default::default()
                        },
                        &p.opts(2),
                    )
                    .unwrap();
                assert_eq!(out.lims.len(), nq + 1);
                let mut doubled = 0;
                for (qi, q) in queries.chunks_exact(DIM).enumerate() {
                    let want = brute_range(f, q, radius);
                    let (a, b) = (out.lims[qi] as usize, out.lims[qi + 1] as usize);
                    let got: Vec<(f32, i64)> =
                        (a..b).map(|j| (out.distances[j], out.ids[j])).collect();
                    doubled += out.stats[qi].doublings;
                    if l == N {
                        assert_eq!(got, want, "{layout} {name} L={l} query {qi}");
                    } else {
                        // Starting small, the list doubles until the answer
                        // no longer fills half of it.
                        let found: HashSet<i64> = got.iter().map(|e| e.1).collect();
                        assert!(
                            got.iter().all(|e| want.contains(e)),
                            "{layout} {name} query {qi}"
                        );
                        let ap = found.len() as f64 / want.len().max(1) as f64;
                        assert!(
                            want.is_empty() || ap >= 0.9,
                            "{layout} {name} query {qi}: AP {ap}"
                        );
                    }
                }
                if l < N {
                    assert!(doubled > 0, "{layout} {name}: the list never doubled");
                }
            }
        }
    }
    // A radius nothing is within gives empty answers; bad radii are refused.
    let out = f
        .plain
        .range_search(
            queries,
            nq,
            0.0,
            &RangeOptions::default(),
            &P::new(10, 40, 4).opts(1),
        )
        .unwrap();
    assert!(out.lims.iter().all(|&x| x == 0));
    let p = P::new(10, 40, 4);
    for (r, want) in [
        (f32::NAN, "finite"),
        (-1.0, "at least 0"),
        (f32::INFINITY, "finite"),
    ] {
        let e = f
            .plain
            .range_search(queries, nq, r, &RangeOptions::default(), &p.opts(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e}");
    }
    for (ratio, max_l) in [(0.0f32, None), (1.5, None), (0.5, Some(10))] {
        let o = RangeOptions {
            ratio: Some(ratio),
            max_l,
            entry_cutoff: None,
        };
        assert!(f
            .plain
            .range_search(queries, nq, 1.0, &o, &p.opts(1))
            .is_err());
    }
    // The entry cutoff needs the nearest entry point's distance, which a
    // medoid start does not know before its first read.
    let o = RangeOptions {
        entry_cutoff: Some(2.0),
        ..Default::default()
    };
    let e = f
        .plain
        .range_search(queries, nq, 1.0, &o, &p.opts(1))
        .unwrap_err()
        .to_string();
    assert!(e.contains("entry_cutoff") && e.contains("medoid"), "{e}");
}

/// The entry cutoff ends exactly the queries whose nearest navigation node
/// lies beyond `c · radius`, unread and empty, and leaves the others'
/// answers as they were.
#[test]
fn range_entry_cutoff_skips_only_far_queries() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nav");
    let opts = BuildOptions {
        nav_sample: Some(0.1),
        ..test_build_options(Some(f.ids.clone()))
    };
    build_with(&path, &f.base, N, DIM, &opts);
    let idx = open(&path, 0, EngineKind::Auto);
    assert_eq!(idx.entry().unwrap().name(), "nav");
    let nq = 40;
    let queries = &f.queries[..nq * DIM];
    // A radius at the median nearest-neighbour distance: about half the
    // queries have an answer.
    let mut d1: Vec<f32> = queries
        .chunks_exact(DIM)
        .map(|q| brute_force(f, q, 1)[0].0)
        .collect();
    d1.sort_by(f32::total_cmp);
    let radius = d1[nq / 2];
    // A list as large as the set: every query that is not cut gets its
    // exact answer whatever order its reads complete in.
    let p = P::new(10, N, 4);
    let d_ref = data(&idx);
    let d = &*d_ref;
    let nearest_entry: Vec<f32> = queries
        .chunks_exact(DIM)
        .map(|q| {
            let mut seeds = Vec::new();
            let mut found = Vec::new();
            let mut st = QueryStats::default();
            d.entries
                .seeds(d.metric, q, &mut seeds, &mut found, &mut st)
                .expect("navigation entry points have exact distances")
        })
        .collect();
    let answer = |out: &crate::index::SearchOutput, qi: usize| -> Vec<(f32, i64)> {
        (out.lims[qi] as usize..out.lims[qi + 1] as usize)
            .map(|j| (out.distances[j], out.ids[j]))
            .collect()
    };
    let mut cut_total = 0;
    for c in [1.0f32, 1.5, 3.0, 1e30] {
        let o = RangeOptions {
            entry_cutoff: Some(c),
            ..Default::default()
        };
        let out = idx
            .range_search(queries, nq, radius, &o, &p.opts(1))
            .unwrap();
        for qi in 0..nq {
            if nearest_entry[qi] > c * radius {
                cut_total += 1;
                assert!(c < 1e30, "query {qi} cut at an unreachable factor");
                assert!(answer(&out, qi).is_empty(), "c={c} query {qi}");
                assert_eq!(out.stats[qi].reads, 0, "c={c} query {qi}");
            } else {
                let q = &queries[qi * DIM..(qi + 1) * DIM];
                assert_eq!(
                    answer(&out, qi),
                    brute_range(f, q, radius),
                    "c={c} query {qi}"
                );
                assert!(out.stats[qi].reads > 0, "c={c} query {qi}");
            }
        }
    }
    assert!(cut_total > 0, "no query was cut at any factor");
    for bad in [0.5f32, f32::NAN, f32::INFINITY, -1.0] {
        let o = RangeOptions {
            entry_cutoff: Some(bad),
            ..Default::default()
        };
        let e = idx
            .range_search(queries, nq, radius, &o, &p.opts(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("entry_cutoff"), "{e}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Block search over the fake engine: out-of-order, delayed and failing
    /// reads, several queries per worker; with a full list the answers are
    /// the in-order engine's, and nothing is lost or freed in flight.
    #[test]
    fn block_search_over_the_fake_engine(
        seed in any::<u64>(),
        delay in 0u32..5,
        q in 1usize..6,
        pipeline in any::<bool>(),
        fail in prop_oneof![3 => Just(0.0f64), 1 => 0.002f64..0.05],
        range in any::<bool>(),
        repeatable in any::<bool>(),
    ) {
        let f = fixture();
        let sf = shuffled_fixture();
        let idx = &sf.plain;
        let d_ref = data(idx);
        let d = &*d_ref;
        let nq = 6;
        let queries = &f.queries[..nq * DIM];
        let kind = if pipeline { ExecutorChoice::Pipeline } else { ExecutorChoice::Beam };
        let mut p = P { queries_in_flight: q, repeatable, ..params(kind, N, 8) };
        if range {
            let r = brute_force(f, &queries[..DIM], 30)[29].0;
            p.range = Some(RangeParams { radius: r, ratio: 0.5, max_l: N, entry_cutoff: None });
            p.l = 32;
            p.k = 1;
        }
        let mut reference = Scratch::new(d).unwrap();
        let (r0, want) = run_all(d, &mut reference, &P { queries_in_flight: 1, ..p }.plan(idx, nq), queries);
        r0.unwrap();
        let fake = IoEngine::fake(sf.pages.clone(), FakeOptions {
            seed,
            max_delay_polls: delay,
            fail_probability: fail,
            ..Default::default()
        });
        let mut s = Scratch::with_engine(d, fake);
        let (r, got) = run_all(d, &mut s, &p.plan(idx, nq), queries);
        prop_assert_eq!(s.in_flight(), 0);
        let (alloc, free) = s.buffers();
        prop_assert_eq!(alloc, free);
        let IoEngine::Fake(fe) = s.engine() else { panic!("fake engine expected") };
        prop_assert_eq!(fe.double_completions(), 0);
        prop_assert_eq!(fe.completed(), fe.submitted());
        match r {
            Ok(()) => {
                prop_assert_eq!(got.len(), nq);
                let reads: u64 = got.values().map(|(_, st)| st.reads as u64).sum();
                prop_assert_eq!(reads, fe.submitted());
                for (qi, (res, st)) in &got {
                    if repeatable {
                        // Whatever the completion order: the same search.
                        prop_assert_eq!(res, &want[qi].0, "query {}", qi);
                        prop_assert_eq!(counts(st), counts(&want[qi].1), "query {}", qi);
                    } else if !range {
                        // A full list makes the search exact.
                        prop_assert_eq!(res, &want[qi].0, "query {}", qi);
                    }
                }
            }
            Err(e) => {
                prop_assert!(fe.counters().errors > 0, "unexpected error {}", e);
            }
        }
    }
}
