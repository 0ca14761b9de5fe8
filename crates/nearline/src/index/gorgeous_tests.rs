//! Tests of the Gorgeous composition: graph-replicated pages, the
//! adjacency-first cache, the two-stage search, the disk budget and the
//! build's memory planning.

use super::test_data::{clustered, exact_knn, l2, open_with_budget};
use super::*;
use crate::elem::DType;
use crate::format::{LayoutKind, PageGeometry, Preset, Section};
use crate::layout::{AnyLayout, Layout, RecordReader};
use crate::planner::{plan_build, CacheChoice, DataFacts, PageChoice, PresetChoice};
use crate::search::{search_one, QueryStats, Scratch};
use crate::util::Budget;

fn never() -> AtomicBool {
    AtomicBool::new(false)
}

const N: usize = 6000;
const DIM: usize = 64;

/// The gorgeous preset with its paper's layout pinned (with the layout
/// left to it, a budget that holds every list gets a shuffled one:
/// `every_list_in_memory_gets_a_shuffled_layout`).
fn gorgeous_opts() -> BuildOptions {
    BuildOptions {
        preset: PresetChoice::Named(Preset::Gorgeous),
        r: Some(24),
        build_l: Some(48),
        threads: Some(2),
        layout: Some(LayoutKind::Replicated),
        ..Default::default()
    }
}

fn build_gorgeous(dir: &Path, opts: &BuildOptions) -> (Manifest, Vec<f32>) {
    let data = clustered(N, DIM, 1);
    let m = Matrix::from_vec(data.clone(), N, DIM).unwrap();
    let man = build(m, dir, opts, &|_, _, _| {}, &never()).unwrap();
    (man, data)
}

/// One index built with `gorgeous_opts()` for the tests that only read it
/// (each used to build the same index of its own: a build is most of
/// their time). A test that changes its files works on a copy
/// (`corrupt_replicated_pages_are_detected`).
struct Shared {
    dir: PathBuf,
    man: Manifest,
    data: Vec<f32>,
    _tmp: tempfile::TempDir,
}

fn shared_gorgeous() -> &'static Shared {
    static S: std::sync::OnceLock<Shared> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("g");
        let (man, data) = build_gorgeous(&dir, &gorgeous_opts());
        Shared {
            dir,
            man,
            data,
            _tmp: tmp,
        }
    })
}

/// Bytes an adjacency cache takes to hold every list of `n` nodes at `r`.
fn every_list_bytes(n: usize, r: usize) -> u64 {
    crate::cache::AdjacencyCache::index_bytes(n)
        + n as u64 * crate::cache::AdjacencyCache::list_bytes(n, r)
}

fn recall(idx: &Index, data: &[f32], queries: &[f32], opts: &SearchOptions) -> (f64, SearchOutput) {
    let nq = queries.len() / DIM;
    let out = idx.search(queries, nq, opts).unwrap();
    let k = opts.k;
    let mut hit = 0;
    for (i, q) in queries.chunks_exact(DIM).enumerate() {
        let truth = exact_knn(data, DIM, q, k);
        hit += out.ids[i * k..(i + 1) * k]
            .iter()
            .filter(|x| truth.contains(x))
            .count();
    }
    (hit as f64 / (nq * k) as f64, out)
}

#[test]
fn gorgeous_builds_replicated_pages_an_adjacency_section_and_finds_neighbours() {
    let Shared { dir, man, data, .. } = shared_gorgeous();
    assert_eq!(man.layout.kind, LayoutKind::Replicated);
    // 64-d float, R 24: a 4 KiB page holds the record (256 + 4 + 96
    // bytes) and 35 more lists (4 + 35 × (8 + 96) bytes).
    assert_eq!(man.layout.records_per_block, 1);
    assert_eq!(man.layout.page_size, 4096);
    assert_eq!(man.layout.packed, 35);
    let rep = man.layout.replication.expect("replication stats");
    assert!(rep.max_replicas as usize <= rep.cap);
    assert!(rep.mean_replicas > 1.0);
    assert!(man.has(Section::Adjacency) && man.has(Section::NavGraph));
    assert!(!man.build_stats.pq_trials.is_empty());
    // The smallest passing size, or, when every list fits beside larger
    // codes, up to PQ_FILL_MAX_FACTOR times it.
    let passing = man.build_stats.pq_trials.last().unwrap().pq_bytes;
    assert!(
        man.spec.pq_bytes >= passing
            && man.spec.pq_bytes <= crate::planner::PQ_FILL_MAX_FACTOR * passing,
        "{} after trials {:?}",
        man.spec.pq_bytes,
        man.build_stats.pq_trials
    );

    // A budget that holds every list and some vectors (this set is small
    // for its workers).
    let idx = open_with_budget(dir, 3 << 20);
    assert_eq!(
        idx.open_plan().unwrap().cache,
        crate::planner::preset::CacheKind::Adjacency
    );
    let queries = clustered(50, DIM, 7);
    let (r, out) = recall(&idx, data, &queries, &SearchOptions::new(10));
    assert!(r >= 0.9, "recall {r}");
    let sum = |f: fn(&QueryStats) -> u32| out.stats.iter().map(f).sum::<u32>();
    // Every list is in memory: the traversal reads nothing, the refine
    // stage reads what it ranks.
    assert!(sum(|s| s.adjacency_hits) > 0);
    assert!(sum(|s| s.refine_reads) > 0);
    assert_eq!(sum(|s| s.reads), sum(|s| s.refine_reads));
    let info = idx.info();
    assert_eq!(info["cache"]["policy"], "adjacency", "{info}");
    assert_eq!(info["cache"]["lists"], N, "{info}");
    let vectors = info["cache"]["vectors"].as_u64().unwrap() as usize;
    assert!(vectors > 0 && vectors < N, "{info}");
}

#[test]
fn replicated_records_carry_exactly_their_neighbours_lists() {
    let Shared { dir, man, .. } = shared_gorgeous();
    let geo = crate::planner::geometry(man).unwrap();
    let id = crate::layout::IdLayout::new(geo, man.n);
    let layout = AnyLayout::Id(id);
    let pages = dir.join("pages.bin");
    let mut reader = RecordReader::open(&pages, &layout).unwrap();
    let own: Vec<Vec<u32>> = (0..man.n as u32)
        .map(|v| reader.record(v).unwrap().neighbours.to_vec())
        .collect();
    let bytes = std::fs::read(&pages).unwrap();
    let mut count = vec![0usize; man.n];
    for v in 0..man.n as u32 {
        let (b, slot) = id.locate(v);
        let off = geo.block_offset(b) as usize;
        let block = &bytes[off..off + geo.block_size];
        let packed = id.packed(block, slot).unwrap();
        for i in 0..packed.len() {
            let (u, list) = packed.get(i).unwrap();
            assert!(own[v as usize].contains(&u), "{v} packs non-neighbour {u}");
            assert_eq!(list, own[u as usize].as_slice(), "list of {u} in {v}");
            count[u as usize] += 1;
        }
    }
    let cap = man.layout.replication.unwrap().cap;
    assert!(count.iter().all(|&c| c <= cap));
}

#[test]
fn the_disk_budget_is_never_exceeded() {
    let tmp = tempfile::tempdir().unwrap();
    let vec_bytes = DIM * 4;
    let plain = PageGeometry::new(4096, vec_bytes, 24, N)
        .unwrap()
        .file_bytes();
    for factor in [1.0, 1.5, 3.0, 8.0] {
        let budget = (plain as f64 * factor) as u64;
        let dir = tmp.path().join(format!("d{factor}"));
        let opts = BuildOptions {
            disk_budget: Some(budget),
            ..gorgeous_opts()
        };
        let (man, _) = build_gorgeous(&dir, &opts);
        let size = std::fs::metadata(dir.join("pages.bin")).unwrap().len();
        assert!(size <= budget, "{size} > {budget} at {factor}");
        if factor == 1.0 {
            assert_eq!(man.layout.kind, LayoutKind::ID);
        } else {
            assert_eq!(man.layout.kind, LayoutKind::Replicated);
            assert!(man.layout.packed >= 1);
        }
        // The index still answers.
        let idx = Index::open(&dir, &OpenOptions::default()).unwrap();
        let q = clustered(5, DIM, 3);
        idx.search(&q, 5, &SearchOptions::new(10)).unwrap();
    }
    let e = plan_build(
        &BuildOptions {
            disk_budget: Some(plain - 1),
            ..gorgeous_opts()
        },
        &DataFacts {
            n: N,
            dim: DIM,
            dtype: DType::F32,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("disk_budget") && e.contains(&plain.to_string()),
        "{e}"
    );
}

#[test]
fn pq_codes_fill_what_every_list_leaves_only_when_every_list_fits() {
    // wordnet's shape: 114,895 × 384 float, R 64.
    let facts = DataFacts {
        n: 114_895,
        dim: 384,
        dtype: DType::F32,
    };
    let raw = (facts.n * facts.dim * 4) as f64;
    let plan = |frac: f64| {
        plan_build(
            &BuildOptions {
                preset: PresetChoice::Named(Preset::Gorgeous),
                memory_budget: Some(Budget::Bytes((raw * frac) as u64)),
                ..Default::default()
            },
            &facts,
        )
        .unwrap()
    };
    let lists = every_list_bytes(facts.n, 64);
    // 10%: what the codes and the cache get together does not hold every
    // list; the selection keeps its smallest passing size.
    let p10 = plan(0.10);
    let sel = p10.plan.pq_selection.unwrap();
    let m = &p10.memory;
    assert!(m.pq_codes + m.cache < lists, "{m:?}");
    assert_eq!(sel.fill, None, "{sel:?}");
    assert_eq!(sel.alternative, None, "{sel:?}");
    // 20%: every list fits beside codes of up to `fill` bytes, and not
    // beside one more.
    let p20 = plan(0.20);
    let sel = p20.plan.pq_selection.unwrap();
    let fill = sel.fill.expect("every list fits at 20%");
    let m = &p20.memory;
    assert!(
        fill <= p20.plan.pq_bytes,
        "{fill} above the cap {}",
        p20.plan.pq_bytes
    );
    assert!(crate::planner::memory::pq_codes_bytes(facts.n, fill) + lists <= m.pq_codes + m.cache);
    if fill < p20.plan.pq_bytes {
        assert!(
            crate::planner::memory::pq_codes_bytes(facts.n, fill + 1) + lists
                > m.pq_codes + m.cache
        );
    }
    assert!(fill > 96, "{fill}");
    // With a shuffled layout's maps every list still fits, beside
    // slightly smaller codes: the build may switch to it.
    let alt = sel.alternative.expect("a shuffled alternative at 20%");
    assert_eq!(alt.layout, LayoutKind::SHUFFLED);
    assert!(alt.fill < fill && alt.fill > 96, "{alt:?} against {fill}");
    assert_eq!(
        sel.keep(alt.fill, p20.plan.pq_bytes).1,
        Some(LayoutKind::SHUFFLED)
    );
    assert_eq!(sel.keep(alt.fill + 1, p20.plan.pq_bytes).1, None);
    assert!(p20
        .decisions
        .iter()
        .any(|x| x.what == "layout_if_lists_fit"));
    // Asked for a layout: no alternative.
    let asked = plan_build(
        &BuildOptions {
            preset: PresetChoice::Named(Preset::Gorgeous),
            memory_budget: Some(Budget::Bytes((raw * 0.2) as u64)),
            layout: Some(LayoutKind::Replicated),
            ..Default::default()
        },
        &facts,
    )
    .unwrap();
    assert_eq!(asked.plan.pq_selection.unwrap().alternative, None);
    // 768-d: one plain record a 4 KiB page, so shuffling co-locates
    // nothing: the alternative is the id layout (no maps).
    let f768 = DataFacts {
        n: 100_000,
        dim: 768,
        dtype: DType::F32,
    };
    let p768 = plan_build(
        &BuildOptions {
            preset: PresetChoice::Named(Preset::Gorgeous),
            memory_budget: Some(Budget::Bytes((f768.n * f768.dim * 4) as u64 / 5)),
            ..Default::default()
        },
        &f768,
    )
    .unwrap();
    let alt = p768
        .plan
        .pq_selection
        .unwrap()
        .alternative
        .expect("every list fits at 20%");
    assert_eq!(alt.layout, LayoutKind::ID);
    let why = &p20
        .decisions
        .iter()
        .find(|x| x.what == "pq_bytes")
        .unwrap()
        .rule;
    assert!(why.contains("every adjacency list"), "{why}");
}

/// With the layout left to the preset, the build writes a shuffled layout
/// when the PQ size it keeps leaves every adjacency list room in memory,
/// and the paper's replicated one when it does not; either way a search
/// reads only what the refine stage ranks when every list is held.
#[test]
fn every_list_in_memory_gets_a_shuffled_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let data = clustered(N, DIM, 1);
    let raw = (N * DIM * 4) as u64;
    let built = |name: &str, budget: u64| {
        let o = BuildOptions {
            layout: None,
            memory_budget: Some(Budget::Bytes(budget)),
            ..gorgeous_opts()
        };
        let planned = plan_build(
            &o,
            &DataFacts {
                n: N,
                dim: DIM,
                dtype: DType::F32,
            },
        )
        .unwrap();
        let dir = tmp.path().join(name);
        let m = Matrix::from_vec(data.clone(), N, DIM).unwrap();
        (
            planned,
            build(m, &dir, &o, &|_, _, _| {}, &never()).unwrap(),
            dir,
        )
    };
    // Three times the raw size (this set is small for its workers): every
    // list fits beside the codes the selection passes.
    let (planned, man, dir) = built("roomy", 3 * raw);
    let sel = planned.plan.pq_selection.unwrap();
    let alt = sel.alternative.expect("an alternative");
    assert_eq!(
        man.layout.kind,
        LayoutKind::SHUFFLED,
        "{alt:?} {sel:?} {:?} cap {}",
        man.build_stats.pq_trials,
        planned.plan.pq_bytes
    );
    assert_eq!(man.layout.packed, 0);
    assert!(man.layout.replication.is_none());
    assert!(man.has(Section::Adjacency));
    let passing = man.build_stats.pq_trials.last().unwrap().pq_bytes;
    assert_eq!(
        man.spec.pq_bytes,
        sel.keep(passing, planned.plan.pq_bytes).0
    );
    assert!(man.spec.pq_bytes <= alt.fill.max(passing));
    // Opened with a budget that holds every list but not every vector.
    let idx = open_with_budget(&dir, 3 << 20);
    let info = idx.info();
    assert_eq!(info["cache"]["policy"], "adjacency", "{info}");
    assert_eq!(info["cache"]["lists"], N, "{info}");
    let queries = clustered(50, DIM, 7);
    let (r, out) = recall(&idx, &data, &queries, &SearchOptions::new(10));
    assert!(r >= 0.9, "recall {r}");
    let sum = |f: fn(&QueryStats) -> u32| out.stats.iter().map(f).sum::<u32>();
    assert!(sum(|s| s.refine_reads) > 0);
    assert_eq!(sum(|s| s.reads), sum(|s| s.refine_reads));
    // A budget whose codes and cache cannot hold every list: replicated.
    let lists = every_list_bytes(N, 24);
    let tight = planned.memory.budget - planned.memory.cache - planned.memory.pq_codes + lists / 2;
    let (planned, man, _) = built("tight", tight);
    assert_eq!(planned.plan.pq_selection.unwrap().alternative, None);
    assert_eq!(man.layout.kind, LayoutKind::Replicated);
    assert!(man.layout.packed > 0);
}

#[test]
fn two_stage_search_equals_an_exact_rerank_of_its_candidate_list() {
    // No navigation graph (its entries would add exact distances of their
    // own) and every list in memory: the traversal reads nothing, so the
    // results are the refine stage's exact ranking of the list. (PQ bytes
    // fixed small so that every list fits beside them, and the budget
    // lowered by the vectors the cache would add, whose exact distances
    // would join the results from memory.)
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("g");
    let opts = BuildOptions {
        nav_sample: Some(0.0),
        pq_bytes: Some(16),
        memory_budget: Some(Budget::Fraction(3.0)),
        ..gorgeous_opts()
    };
    let (_, data) = build_gorgeous(&dir, &opts);
    let open = |budget: Option<u64>| {
        Index::open(
            &dir,
            &OpenOptions {
                memory_budget: budget.map(Budget::Bytes),
                ..Default::default()
            },
        )
        .unwrap()
    };
    let mut idx = open(None);
    loop {
        let info = idx.info();
        let vectors = info["cache"]["vectors"].as_u64().unwrap();
        if vectors == 0 {
            break;
        }
        let budget = info["memory"]["budget"].as_u64().unwrap();
        drop(idx);
        idx = open(Some(budget - vectors * (DIM as u64 * 4)));
    }
    assert_eq!(idx.info()["cache"]["lists"], N);
    assert_eq!(idx.info()["cache"]["vectors"], 0);
    let gref_d = idx.graph().unwrap();
    let d = gref_d.data_f32().unwrap();
    let queries = clustered(20, DIM, 5);
    for ratio in [1.0f32, 0.5] {
        let planned = idx
            .plan_search(
                &SearchOptions {
                    refine_ratio: Some(ratio),
                    l: Some(40),
                    page_search: PageChoice::Targets,
                    ..SearchOptions::new(10)
                },
                None,
                1,
            )
            .unwrap();
        let mut s = Scratch::new(d).unwrap();
        for q in queries.chunks_exact(DIM) {
            let mut st = QueryStats::default();
            search_one(d, &mut s, q, &planned.plan, &mut st).unwrap();
            assert_eq!(st.reads, st.refine_reads);
            let cands = s.candidates(0);
            let take = ((ratio * 40.0).ceil() as usize).max(10);
            let mut exact: Vec<(f32, u32)> = cands[..take]
                .iter()
                .map(|&(_, v)| (l2(q, &data[v as usize * DIM..(v as usize + 1) * DIM]), v))
                .collect();
            exact.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let want: Vec<u32> = exact[..10].iter().map(|x| x.1).collect();
            let got: Vec<u32> = s.results.iter().map(|x| x.1).collect();
            assert_eq!(got, want, "ratio {ratio}");
        }
    }
}

#[test]
fn searches_of_any_shape_stay_within_the_budget() {
    // The refine stage's reads are all in flight at once, and workers keep
    // their scratch between batches: whatever L, threads and interleaving a
    // batch asks for, what the index holds afterwards stays within budget.
    let idx = open_with_budget(&shared_gorgeous().dir, 3 << 20);
    let q = clustered(64, DIM, 11);
    for (l, threads, qif, ratio) in [
        (128, 2, None, None),
        (200, 1, Some(1), Some(1.0)),
        (40, 2, Some(4), None),
        (300, 2, None, Some(0.5)),
        (20, 1, None, Some(0.2)),
        (200, 2, Some(2), Some(0.8)),
    ] {
        let opts = SearchOptions {
            l: Some(l),
            threads: Some(threads),
            queries_in_flight: qif,
            refine_ratio: ratio,
            ..SearchOptions::new(10)
        };
        match idx.search(&q, 64, &opts) {
            Ok(_) => {}
            // A shape the budget cannot hold is refused before it runs.
            Err(Error::InvalidArgument(m)) => {
                assert!(m.contains("worker scratch"), "{m}");
                continue;
            }
            Err(e) => panic!("{e}"),
        }
        let info = idx.info();
        assert_eq!(
            info["memory"]["within_budget"], true,
            "L={l} threads={threads} qif={qif:?}: {}",
            info["memory"]
        );
    }
}

#[test]
fn the_packed_adjacency_cache_holds_exactly_the_graphs_lists() {
    let Shared { dir, man, .. } = shared_gorgeous();
    let geo = crate::planner::geometry(man).unwrap();
    let layout = AnyLayout::Id(crate::layout::IdLayout::new(geo, man.n));
    let mut reader = RecordReader::open(&dir.join("pages.bin"), &layout).unwrap();
    // A budget that holds every list (and some vectors).
    let idx = Index::open(
        dir,
        &OpenOptions {
            memory_budget: Some(Budget::Bytes(64 << 20)),
            ..Default::default()
        },
    )
    .unwrap();
    let gref_guard = idx.graph().unwrap();
    let guard = gref_guard.cache().unwrap();
    let crate::cache::AnyCache::Adjacency(cache) = &*guard else {
        panic!("the gorgeous preset opens an adjacency cache");
    };
    let held = cache.contents();
    assert_eq!(held.lists, man.n);
    let mut edges = 0;
    for v in 0..man.n as u32 {
        let node = crate::cache::Cache::get(cache, v).unwrap();
        let want = reader.record(v).unwrap().neighbours.to_vec();
        assert_eq!(node.neighbours.len(), want.len(), "node {v}");
        assert_eq!(node.neighbours.to_vec(), want, "node {v}");
        edges += want.len();
    }
    assert_eq!(held.edges, edges);
    // Packed at ⌈log2 n⌉ bits: the lists take what `list_bytes` says.
    let bits = crate::util::bitpack::bits_for(man.n) as usize;
    assert_eq!(bits, 13);
    assert!(held.bytes as u64 >= crate::cache::AdjacencyCache::index_bytes(man.n));
    assert!(held.bytes >= 4 * man.n + (edges * bits).div_ceil(8));
}

#[test]
fn the_adjacency_cache_never_exceeds_its_share() {
    let tmp = tempfile::tempdir().unwrap();
    let Shared { dir, man, data, .. } = shared_gorgeous();
    let queries = clustered(20, DIM, 11);
    let mut last = 0;
    let open = |budget: u64| {
        Index::open(
            dir,
            &OpenOptions {
                memory_budget: Some(Budget::Bytes(budget)),
                threads: Some(2),
                ..Default::default()
            },
        )
    };
    let minimum = match open(0) {
        Err(Error::InvalidArgument(m)) => {
            let at = m.find("at least ").unwrap() + 9;
            m[at..].split(' ').next().unwrap().parse::<u64>().unwrap()
        }
        other => panic!("{:?}", other.err()),
    };
    // From nothing cached to everything and vectors.
    let graph = 4 * man.n as u64 * (2 + man.build_stats.mean_degree.ceil() as u64);
    for extra in [
        0,
        graph / 10,
        graph / 2,
        graph + (64 << 10),
        2 * graph + (1 << 20),
    ] {
        let budget = minimum + extra + (4 << 10) * 8;
        let frac = extra as f64 / graph as f64;
        let idx = open(budget).unwrap();
        let plan = idx.open_plan().unwrap().memory.clone();
        let held = idx.memory().unwrap();
        assert!(held.cache <= plan.cache, "{frac}: {held:?} {plan:?}");
        assert!(plan.fixed() + plan.cache <= budget);
        let c = idx.info()["cache"].clone();
        let lists = c["lists"].as_u64().unwrap();
        assert!(lists >= last, "more budget, fewer lists at {frac}");
        last = lists;
        if frac > 1.1 {
            // Every list fits: the rest holds vectors.
            assert_eq!(lists as usize, man.n, "{c}");
            assert!(c["vectors"].as_u64().unwrap() > 0, "{c}");
        }
        let (r, out) = recall(&idx, data, &queries, &SearchOptions::new(10));
        assert!(r >= 0.85, "recall {r} at {frac}");
        assert!(held.static_total() + held.worker_scratch <= budget);
        drop(out);
    }
    // An index without the section cannot be asked for an adjacency cache.
    let plain = tmp.path().join("plain");
    let data2 = clustered(500, DIM, 2);
    build(
        Matrix::from_vec(data2, 500, DIM).unwrap(),
        &plain,
        &BuildOptions {
            preset: PresetChoice::Named(Preset::Diskann),
            threads: Some(2),
            r: Some(16),
            ..Default::default()
        },
        &|_, _, _| {},
        &never(),
    )
    .unwrap();
    let e = Index::open(
        &plain,
        &OpenOptions {
            cache: CacheChoice::Adjacency,
            ..Default::default()
        },
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("adjacency section"), "{e}");
}

#[test]
fn corrupt_replicated_pages_are_detected() {
    // Damages its own copy of the shared index.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("g");
    let shared = shared_gorgeous();
    copy_dir(&shared.dir, &dir);
    let man = &shared.man;
    let geo = crate::planner::geometry(man).unwrap();
    let pages = dir.join("pages.bin");
    let original = std::fs::read(&pages).unwrap();
    let q = clustered(30, DIM, 3);
    // Only reads can meet the damage: no cache, every record read.
    let open = || {
        Index::open(
            &dir,
            &OpenOptions {
                cache: CacheChoice::Bfs,
                cache_nodes: Some(0),
                ..Default::default()
            },
        )
        .unwrap()
    };
    // A flipped byte in every packed region: the block checksum fails.
    let mut bad = original.clone();
    let packed_at = crate::format::PAGE_HEADER_BYTES + geo.degree_offset + 4 + 4 * geo.max_degree;
    for b in 0..geo.n_blocks as usize {
        bad[b * geo.block_size + packed_at + 9] ^= 0x40;
    }
    std::fs::write(&pages, &bad).unwrap();
    let e = open()
        .search(&q, 30, &SearchOptions::new(10))
        .err()
        .unwrap();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    // A packed count above the slots, resealed so the checksum holds: the
    // decoder refuses it.
    let mut bad = original.clone();
    for b in 0..geo.n_blocks as usize {
        let block = &mut bad[b * geo.block_size..(b + 1) * geo.block_size];
        block[packed_at..packed_at + 4].copy_from_slice(&(geo.packed as u32 + 1).to_le_bytes());
        let n = crate::format::page::block_records(block);
        crate::format::page::seal_block(block, b as u64, n, geo.layout_id);
    }
    std::fs::write(&pages, &bad).unwrap();
    let e = open()
        .search(&q, 30, &SearchOptions::new(10))
        .err()
        .unwrap();
    assert!(
        matches!(e, Error::Corrupt { .. }) && e.to_string().contains("packs"),
        "{e}"
    );
    std::fs::write(&pages, &original).unwrap();
    open().search(&q, 30, &SearchOptions::new(10)).unwrap();
}

/// Copies the files of index directory `from` (and of its subdirectories)
/// into a new directory `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}
