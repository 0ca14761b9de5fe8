//! Tests of the memory budget while an index is open (issue 34): a search
//! whose scratch the budget can hold borrows from the cache instead of
//! being refused, the cache gives up its least valuable entries and takes
//! the same ones back, concurrent borrowers stay within the budget, and a
//! search that even an empty cache cannot hold is refused with the largest
//! L, W, threads and queries_in_flight that fit.

use super::test_data::{clustered, open_with_budget, recall_of};
use super::*;
use crate::cache::{AnyCache, CacheSource};
use crate::format::Preset;
use crate::layout::RecordReader;
use crate::planner::PresetChoice;
use std::collections::HashSet;

const N: usize = 3000;
const DIM: usize = 32;
/// A budget whose cache holds most records and whose workers' share
/// holds the default search on two threads.
const BUDGET: u64 = 1_000_000;

fn build_preset(dir: &Path, preset: Preset) -> Vec<f32> {
    let data = clustered(N, DIM, 5);
    let m = Matrix::from_vec(data.clone(), N, DIM).unwrap();
    let opts = BuildOptions {
        preset: PresetChoice::Named(preset),
        r: Some(16),
        build_l: Some(32),
        // The coded layout has no PQ; Gorgeous picks its own size.
        pq_bytes: matches!(preset, Preset::Diskann | Preset::Pipeann | Preset::Starling)
            .then_some(8),
        threads: Some(2),
        memory_budget: Some(crate::util::Budget::Bytes(BUDGET)),
        ..Default::default()
    };
    build(m, dir, &opts, &|_, _, _| {}, &AtomicBool::new(false)).unwrap();
    data
}

fn search_opts(l: usize, threads: usize) -> SearchOptions {
    SearchOptions {
        l: Some(l),
        threads: Some(threads),
        queries_in_flight: Some(1),
        ..SearchOptions::new(10)
    }
}

/// The bytes the workers have without borrowing, and with the cache
/// emptied, as `info()` reports them.
fn reserve_and_limit(idx: &Index) -> (u64, u64) {
    let m = &idx.info()["memory"];
    let limit = m["worker_scratch_max"].as_u64().unwrap();
    (limit - m["cache_planned"].as_u64().unwrap(), limit)
}

/// The nodes a cache holds and, for each, its record as the page file has
/// it (whole records) or its list.
fn cached(idx: &Index) -> (HashSet<u32>, usize) {
    let gref_c = idx.graph().unwrap();
    let c = gref_c.cache().unwrap();
    let held: HashSet<u32> = (0..N as u32).filter(|&v| c.get(v).is_some()).collect();
    (held, c.memory_bytes())
}

#[test]
fn a_search_a_little_short_of_its_reserve_borrows_from_the_cache_and_gives_it_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    let data = build_preset(&dir, Preset::Diskann);
    let idx = open_with_budget(&dir, BUDGET);
    let (reserve, limit) = reserve_and_limit(&idx);
    let before = cached(&idx);
    assert!(before.0.len() > N / 2, "the cache holds {}", before.0.len());
    // The smallest L whose two-thread search needs more than the reserve:
    // short by at most what one step of L adds (the case: 2 KB).
    let scratch = |l: usize| {
        idx.plan_search(&search_opts(l, 2), None, 2)
            .unwrap()
            .scratch
    };
    let l = crate::planner::search::largest(10, 4096, |l| scratch(l) <= reserve).unwrap() + 1;
    assert!(scratch(l) > reserve && scratch(l) <= limit);
    let queries = clustered(40, DIM, 9);
    let r = recall_of(&idx, &data, DIM, &queries, &search_opts(l, 2));
    assert!(r >= 0.95, "recall {r}");
    let m = &idx.info()["memory"];
    assert_eq!(m["cache_borrows"], 1, "{m}");
    let lent = m["cache_borrowed_peak"].as_u64().unwrap();
    assert!(lent > 0 && lent <= scratch(l) - reserve + 4096, "{m}");
    // Given back: the same nodes, the same bytes, every record as on disk.
    assert_eq!(cached(&idx), before);
    assert_eq!(m["cache"], m["cache_planned"], "{m}");
    assert_eq!(m["within_budget"], true, "{m}");
    assert!(m["peak_total"].as_u64().unwrap() <= BUDGET, "{m}");
    let gref_d = idx.graph().unwrap();
    let d = gref_d.data_f32().unwrap();
    let mut reader = RecordReader::open(&d.pages_path, &d.layout).unwrap();
    let gref_c = idx.graph().unwrap();
    let c = gref_c.cache().unwrap();
    for &v in &before.0 {
        let AnyCache::Bfs(nc) = &*c else {
            panic!("the diskann preset holds whole records")
        };
        assert_eq!(nc.record(v).unwrap(), reader.raw_record(v).unwrap(), "{v}");
    }
}

#[test]
fn each_cache_gives_up_its_least_valuable_entries_first_and_takes_the_same_back() {
    let tmp = tempfile::tempdir().unwrap();
    for preset in [Preset::Diskann, Preset::Gorgeous, Preset::Alayalaser] {
        let dir = tmp.path().join(preset.name());
        build_preset(&dir, preset);
        let idx = open_with_budget(&dir, BUDGET);
        let g = idx.graph().unwrap();
        let d = g.data_f32().unwrap();
        let m = idx.manifest().unwrap();
        let src = CacheSource {
            dir: &dir,
            manifest: &m,
            pages: &d.pages_path,
            layout: &d.layout,
        };
        let (full, full_bytes) = cached(&idx);
        let loaded = d.cache.read().unwrap().loaded();
        assert!(!full.is_empty(), "{preset}");
        for keep in [full_bytes as u64 * 2 / 3, full_bytes as u64 / 5, 1, 0] {
            let held = d.cache.write().unwrap().evict_to(keep);
            assert!(held <= keep, "{preset}: {held} > {keep}");
            let (part, bytes) = cached(&idx);
            assert_eq!(bytes as u64, held, "{preset}");
            assert!(part.is_subset(&full), "{preset}");
            let back = d
                .cache
                .write()
                .unwrap()
                .regrow(full_bytes as u64, loaded, &src)
                .unwrap();
            assert_eq!(back, full_bytes as u64, "{preset} from {keep}");
            assert_eq!(
                cached(&idx),
                (full.clone(), full_bytes),
                "{preset} from {keep}"
            );
        }
        // An adjacency cache gives up vectors before any list, and lists
        // from the end of its priority order.
        let contents = || match &*d.cache.read().unwrap() {
            AnyCache::Adjacency(a) => Some(a.contents()),
            AnyCache::Bfs(_) => None,
        };
        if let Some(before) = contents() {
            if before.vectors > 0 {
                d.cache.write().unwrap().evict_to(full_bytes as u64 - 1);
                let after = contents().unwrap();
                assert_eq!(after.lists, before.lists, "{preset}");
                assert!(after.vectors < before.vectors, "{preset}");
            }
            let mut t = full_bytes as u64;
            while contents().unwrap().vectors > 0 {
                t = t * 9 / 10;
                d.cache.write().unwrap().evict_to(t);
            }
            let index = crate::cache::AdjacencyCache::index_bytes(N);
            let now = d.cache.read().unwrap().memory_bytes() as u64;
            d.cache.write().unwrap().evict_to(index + (now - index) / 2);
            let (part, _) = cached(&idx);
            assert!(!part.is_empty() && part.len() < full.len(), "{preset}");
            let order = adjacency_order(&dir, &m);
            let kept: HashSet<u32> = order[..part.len()].iter().copied().collect();
            assert_eq!(
                part, kept,
                "{preset}: the lists kept are the first in order"
            );
        }
        // An in-degree cache keeps the first of its order.
        if preset == Preset::Alayalaser {
            d.cache.write().unwrap().evict_to(full_bytes as u64 / 2);
            let (part, _) = cached(&idx);
            let path = crate::io::files::section_path(&dir, &m, crate::format::Section::InDegree);
            let bytes =
                crate::io::files::read_section(&dir, &m, crate::format::Section::InDegree).unwrap();
            let order = crate::format::in_degree::decode(&path, &bytes, N).unwrap();
            let kept: HashSet<u32> = order[..part.len()].iter().copied().collect();
            assert!(!part.is_empty() && part.len() < full.len(), "{preset}");
            assert_eq!(
                part, kept,
                "{preset}: the records kept are the first in order"
            );
        }
    }
}

/// Node ids in the order of the index's adjacency section (the adjacency
/// cache's priority order).
fn adjacency_order(dir: &Path, m: &Manifest) -> Vec<u32> {
    let path = crate::io::files::section_path(dir, m, crate::format::Section::Adjacency);
    let mut parser = crate::format::adjacency::Parser::new(&path, m.n, m.layout.max_degree);
    let mut order = Vec::new();
    crate::io::files::read_section_stream(dir, m, crate::format::Section::Adjacency, &mut |c| {
        parser.feed(c, &mut |v, _| order.push(v))
    })
    .unwrap();
    parser.finish().unwrap();
    order
}

#[test]
fn concurrent_searches_that_each_borrow_all_run_within_the_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let data = build_preset(&dir, Preset::Starling);
    let idx = open_with_budget(&dir, BUDGET);
    let (reserve, limit) = reserve_and_limit(&idx);
    let opts = search_opts(400, 2);
    let need = idx.plan_search(&opts, None, 8).unwrap().scratch;
    // Each borrows; two at once could not both borrow what they need.
    assert!(
        need > reserve && 2 * need > limit && need <= limit,
        "{need} {reserve} {limit}"
    );
    let queries = clustered(32, DIM, 11);
    let recalls: Vec<f64> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4)
            .map(|_| sc.spawn(|| (0..3).map(|_| recall_of(&idx, &data, DIM, &queries, &opts))))
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().unwrap().collect::<Vec<_>>())
            .collect()
    });
    assert!(recalls.iter().all(|&r| r >= 0.95), "{recalls:?}");
    let m = &idx.info()["memory"];
    assert!(m["cache_borrows"].as_u64().unwrap() >= 1, "{m}");
    assert!(m["peak_total"].as_u64().unwrap() <= BUDGET, "{m}");
    assert_eq!(m["worker_scratch_running"], 0, "{m}");
    assert_eq!(m["cache"], m["cache_planned"], "{m}");
    assert_eq!(m["within_budget"], true, "{m}");
}

/// The number after `key ≤ ` in `msg`.
fn bound(msg: &str, key: &str) -> Option<usize> {
    let at = msg.find(&format!("{key} ≤ "))? + key.len() + " ≤ ".len();
    msg[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[test]
fn a_search_no_empty_cache_can_hold_is_refused_with_what_fits() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    build_preset(&dir, Preset::Pipeann);
    let idx = open_with_budget(&dir, BUDGET);
    let nq = 64;
    let mut bounded = 0;
    for (l, w, threads, q) in [
        (200_000, 32, 3, 2),
        (3000, 32, 3, 2),
        (3000, 8, 2, 8),
        (3000, 8, 3, 2),
    ] {
        let asked = SearchOptions {
            l: Some(l),
            w: Some(w),
            threads: Some(threads),
            queries_in_flight: Some(q),
            ..SearchOptions::new(10)
        };
        let e = idx.plan_search(&asked, None, nq).unwrap_err().to_string();
        assert!(e.contains("even with the cache emptied"), "{e}");
        // Each knob, the others as asked: what the message names fits and
        // one more does not; where it says none fits, the least does not.
        type Set = fn(&mut SearchOptions, usize);
        let knobs: [(&str, Set, usize, usize, &str); 4] = [
            (
                "L",
                |o, v| o.l = Some(v),
                10,
                crate::search::MAX_LIST_SIZE,
                "no L fits",
            ),
            (
                "W",
                |o, v| o.w = Some(v),
                1,
                crate::search::MAX_BEAM_WIDTH,
                "no W fits",
            ),
            (
                "threads",
                |o, v| o.threads = Some(v),
                1,
                nq,
                "not even one thread fits",
            ),
            (
                "queries_in_flight",
                |o, v| o.queries_in_flight = Some(v),
                1,
                crate::search::MAX_QUERIES_IN_FLIGHT,
                "not even one query in flight fits",
            ),
        ];
        for (key, set, least, most, none) in knobs {
            let at = |v: usize| {
                let mut o = asked;
                set(&mut o, v);
                idx.plan_search(&o, None, nq)
            };
            match bound(&e, key) {
                Some(v) => {
                    bounded += 1;
                    assert!(at(v).is_ok(), "{key}={v}: {e}");
                    assert!(v >= most || at(v + 1).is_err(), "{key}={}: {e}", v + 1);
                }
                None => {
                    assert!(e.contains(none), "{key}: {e}");
                    assert!(at(least).is_err(), "{key}={least}: {e}");
                }
            }
        }
    }
    assert!(bounded >= 4, "every refusal named nothing that fits");
    // A named L runs, within the budget.
    let e = idx
        .plan_search(&search_opts(200_000, 1), None, 4)
        .unwrap_err()
        .to_string();
    let l = bound(&e, "L").expect("an L fits one thread");
    let queries = clustered(4, DIM, 3);
    idx.search(&queries, 4, &search_opts(l.min(4 * N), 1))
        .unwrap();
    let m = &idx.info()["memory"];
    assert_eq!(m["within_budget"], true, "{m}");
}

#[test]
fn the_open_plan_says_which_l_the_workers_share_covers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let data = build_preset(&dir, Preset::Starling);
    let idx = open_with_budget(&dir, BUDGET);
    let plan = idx.open_plan().unwrap();
    let covered = plan.memory.search_l_covered;
    let d = plan
        .decisions
        .iter()
        .find(|d| d.what == "search_L_covered")
        .expect("the open plan says which L it covers");
    assert_eq!(d.value, covered.to_string());
    // One query per worker on the default threads: up to that L the
    // workers' share holds the search, one more and it would borrow.
    let threads = plan.threads;
    let opts = |l: usize| search_opts(l, threads);
    let scratch = |l: usize| idx.plan_search(&opts(l), None, 64).unwrap().scratch;
    assert!(covered >= 100, "{covered}");
    assert!(scratch(covered) <= plan.memory.worker_scratch);
    assert!(scratch(covered + 1) > plan.memory.worker_scratch);
    let queries = clustered(64, DIM, 13);
    assert!(recall_of(&idx, &data, DIM, &queries, &opts(covered)) >= 0.95);
    assert_eq!(idx.info()["memory"]["cache_borrows"], 0);
}
