//! Tests of the executor: every kind against brute force, the beam against a
//! plain synchronous reference, and many queries per worker over the fake
//! engine (out of order, delayed, failing reads).

use super::candidates::CandidateList;
use super::executor::{run, search_one, Scratch};
use super::index_data::IndexData;
use super::plan::{RangeParams, SearchPlan};
use super::scorer::{AnyScorer, Scorer};
use super::stats::QueryStats;
use crate::data::matrix::Matrix;
use crate::distance::Metric;
use crate::index::{build, Index};
use crate::io::{EngineKind, FakeOptions, IoEngine};
use crate::layout::RecordReader;
use crate::planner::{
    BuildOptions, ExecutorChoice, OpenOptions, PageChoice, RangeOptions, SearchOptions,
};
use crate::util::Budget;
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

pub(crate) const N: usize = 1500;
pub(crate) const DIM: usize = 16;

pub(crate) struct Fixture {
    pub(crate) _dir: tempfile::TempDir,
    /// Row-major base vectors (row i has external id `ids[i]`).
    pub(crate) base: Vec<f32>,
    pub(crate) ids: Vec<u64>,
    pub(crate) queries: Vec<f32>,
    /// No node cache.
    pub(crate) plain: Index,
    /// 200 cached nodes.
    pub(crate) cached: Index,
    pub(crate) pages: Arc<Vec<u8>>,
}

pub(crate) fn random_rows(n: usize, dim: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n * dim)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect()
}

/// A budget the test indexes never reach (the budget rules have tests of
/// their own).
pub(crate) const ROOMY: Budget = Budget::Bytes(256 << 20);

/// The build options every test index shares: the DiskANN composition (the
/// tests set the components they test on top of it), R 16, build L 40, 8 PQ
/// bytes.
pub(crate) fn test_build_options(ids: Option<Vec<u64>>) -> BuildOptions {
    BuildOptions {
        preset: crate::planner::PresetChoice::Named(crate::format::Preset::Diskann),
        r: Some(16),
        build_l: Some(40),
        pq_bytes: Some(8),
        threads: Some(2),
        memory_budget: Some(ROOMY),
        ids,
        ..Default::default()
    }
}

pub(crate) fn build_with(dir: &Path, base: &[f32], n: usize, dim: usize, opts: &BuildOptions) {
    let m = Matrix::from_vec(base.to_vec(), n, dim).unwrap();
    build(m, dir, opts, &|_, _, _| {}, &AtomicBool::new(false)).unwrap();
}

pub(crate) fn build_index(dir: &Path, base: &[f32], n: usize, dim: usize, ids: Option<Vec<u64>>) {
    build_with(dir, base, n, dim, &test_build_options(ids));
}

pub(crate) fn open(dir: &Path, cache_nodes: usize, io: EngineKind) -> Index {
    Index::open(
        dir,
        &OpenOptions {
            cache_nodes: Some(cache_nodes),
            memory_budget: Some(ROOMY),
            io,
            ..Default::default()
        },
    )
    .unwrap()
}

pub(crate) fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let base = random_rows(N, DIM, 11);
        let mut ids: Vec<u64> = (0..N as u64).map(|i| 1000 + 7 * i).collect();
        ids.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(5));
        let path = dir.path().join("x");
        build_index(&path, &base, N, DIM, Some(ids.clone()));
        let pages = Arc::new(std::fs::read(path.join("pages.bin")).unwrap());
        Fixture {
            base,
            ids,
            queries: random_rows(40, DIM, 99),
            plain: open(&path, 0, EngineKind::Auto),
            cached: open(&path, 200, EngineKind::Auto),
            pages,
            _dir: dir,
        }
    })
}

/// The search data of a float32 graph index, held for as long as a test
/// uses it.
pub(crate) struct DataRef(std::sync::Arc<crate::index::GraphOpen>);

impl std::ops::Deref for DataRef {
    type Target = IndexData<f32>;
    fn deref(&self) -> &IndexData<f32> {
        self.0.data_f32().expect("a float32 graph index")
    }
}

pub(crate) fn data(idx: &Index) -> DataRef {
    DataRef(idx.graph().unwrap())
}

/// What the tests ask for, in the shape of the user's options; turned
/// into a plan by the index's planner, as a search would.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct P {
    pub(crate) k: usize,
    pub(crate) l: usize,
    pub(crate) w: usize,
    pub(crate) executor: ExecutorChoice,
    pub(crate) adaptive_beam: bool,
    pub(crate) early_dispatch: Option<f32>,
    /// 0: auto.
    pub(crate) queries_in_flight: usize,
    pub(crate) page_search: PageChoice,
    pub(crate) sigma: f32,
    /// Internal radius and options of a range search.
    pub(crate) range: Option<RangeParams>,
    /// Pages processed in issue order (the default).
    pub(crate) repeatable: bool,
}

impl P {
    pub(crate) fn new(k: usize, l: usize, w: usize) -> Self {
        P {
            k,
            l,
            w,
            executor: ExecutorChoice::Auto,
            adaptive_beam: false,
            early_dispatch: None,
            queries_in_flight: 0,
            page_search: PageChoice::Auto,
            sigma: 0.3,
            range: None,
            repeatable: true,
        }
    }

    pub(crate) fn opts(&self, threads: usize) -> SearchOptions {
        SearchOptions {
            k: self.k,
            l: Some(self.l),
            w: Some(self.w),
            executor: self.executor,
            adaptive_beam: self.adaptive_beam,
            early_dispatch: self.early_dispatch,
            queries_in_flight: (self.queries_in_flight > 0).then_some(self.queries_in_flight),
            page_search: self.page_search,
            sigma: Some(self.sigma),
            refine_ratio: None,
            filter_ratio: None,
            threads: Some(threads),
            repeatable: self.repeatable,
            nprobe: None,
            probe_cut: None,
        }
    }

    /// The plan the index's planner makes of these options for `nq` queries.
    pub(crate) fn plan(&self, idx: &Index, nq: usize) -> SearchPlan {
        let range = self.range.map(|r| {
            (
                r.radius,
                RangeOptions {
                    ratio: Some(r.ratio),
                    max_l: Some(r.max_l),
                    entry_cutoff: r.entry_cutoff,
                },
            )
        });
        idx.plan_search(&self.opts(1), range, nq).unwrap().plan
    }
}

/// Searches on the index with `threads` threads.
pub(crate) fn search(
    idx: &Index,
    q: &[f32],
    nq: usize,
    p: &P,
    threads: usize,
) -> crate::Result<crate::index::SearchOutput> {
    idx.search(q, nq, &p.opts(threads))
}

/// One query on worker `s`, planned by the index.
pub(crate) fn one(
    idx: &Index,
    s: &mut Scratch<f32>,
    q: &[f32],
    p: &P,
    st: &mut QueryStats,
) -> crate::Result<()> {
    search_one(&data(idx), s, q, &p.plan(idx, 1), st)
}

/// Exact k nearest external ids and distances, with the engine's kernel.
pub(crate) fn brute_force(f: &Fixture, q: &[f32], k: usize) -> Vec<(f32, i64)> {
    let mut all: Vec<(f32, usize)> = f
        .base
        .chunks_exact(DIM)
        .enumerate()
        .map(|(i, x)| (Metric::L2.distance(q, x), i))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    all.iter()
        .take(k)
        .map(|&(d, i)| (d, f.ids[i] as i64))
        .collect()
}

pub(crate) fn params(executor: ExecutorChoice, l: usize, w: usize) -> P {
    P {
        executor,
        ..P::new(10, l, w)
    }
}

/// The executor configurations the issue names.
pub(crate) fn kinds() -> Vec<(&'static str, P)> {
    let beam = params(ExecutorChoice::Beam, N, 8);
    let pipe = params(ExecutorChoice::Pipeline, N, 8);
    vec![
        ("beam", beam),
        (
            "beam+adaptive",
            P {
                adaptive_beam: true,
                ..beam
            },
        ),
        (
            "beam+early0.5",
            P {
                early_dispatch: Some(0.5),
                ..beam
            },
        ),
        (
            "beam q4",
            P {
                queries_in_flight: 4,
                ..beam
            },
        ),
        ("pipeline", pipe),
        (
            "pipeline q4",
            P {
                queries_in_flight: 4,
                ..pipe
            },
        ),
        (
            "auto adaptive+early q3",
            P {
                executor: ExecutorChoice::Auto,
                adaptive_beam: true,
                early_dispatch: Some(0.3),
                queries_in_flight: 3,
                ..beam
            },
        ),
    ]
}

#[test]
fn every_executor_is_exact_with_a_full_list() {
    let f = fixture();
    let nq = 8;
    let queries = &f.queries[..nq * DIM];
    for (idx, threads) in [(&f.plain, 1), (&f.plain, 2), (&f.cached, 2)] {
        for (name, p) in kinds() {
            {
                let out = search(idx, queries, nq, &p, threads).unwrap();
                for (qi, q) in queries.chunks_exact(DIM).enumerate() {
                    let want = brute_force(f, q, 10);
                    let got: Vec<(f32, i64)> = (0..10)
                        .map(|j| (out.distances[qi * 10 + j], out.ids[qi * 10 + j]))
                        .collect();
                    assert_eq!(got, want, "{name}, {threads} threads, query {qi}");
                    let st = &out.stats[qi];
                    assert!(st.hops as usize >= N - 5, "{name}: {st:?}");
                    assert!(
                        st.reads > 0 || !data(idx).cache.read().unwrap().is_empty(),
                        "{name}"
                    );
                    assert_eq!(
                        st.bytes_read,
                        st.reads as u64 * data(idx).geo.block_size as u64
                    );
                    assert!(st.total_us >= st.cpu_us, "{name}: {st:?}");
                }
            }
        }
    }
}

/// DiskANN's synchronous beam written as plainly as possible: blocking
/// record reads, the whole hop before the next.
pub(crate) fn reference_beam(
    d: &IndexData<f32>,
    q: &[f32],
    p: &P,
) -> (Vec<(f32, u32)>, QueryStats) {
    let AnyScorer::Pq(pq) = &d.scorer else {
        panic!("the reference beam runs on PQ indexes");
    };
    let mut reader = RecordReader::open(&d.pages_path, &d.layout).unwrap();
    let mut table = Vec::new();
    pq.prepare(q, &mut table);
    let mut st = QueryStats::default();
    let mut cand = CandidateList::default();
    cand.reset(p.l);
    let mut visited = HashSet::new();
    let mut exact = Vec::new();
    let mut seeds = Vec::new();
    // Entry nodes found in memory are results, as in the executor.
    d.entries
        .seeds(d.metric, q, &mut seeds, &mut exact, &mut st);
    for v in seeds {
        if visited.insert(v) {
            st.pq_distances += 1;
            cand.insert(pq.score(&table, v), v);
        }
    }
    for hop in 0.. {
        let w = if p.adaptive_beam {
            (1usize << hop.min(16)).min(p.w)
        } else {
            p.w
        };
        let mut frontier = Vec::new();
        cand.take_unexpanded(w, &mut frontier);
        if frontier.is_empty() {
            break;
        }
        let blocks: HashSet<u64> = frontier
            .iter()
            .filter(|&&v| d.cache.read().unwrap().get(v).is_none())
            .map(|&v| d.layout.locate(v).0)
            .collect();
        st.reads += blocks.len() as u32;
        st.bytes_read += (blocks.len() * d.geo.block_size) as u64;
        for v in frontier {
            let (vb, nbrs): (Vec<u8>, Vec<u32>) = match d.cache.read().unwrap().get(v) {
                Some(c) => {
                    st.cache_hits += 1;
                    (c.vector.unwrap().to_vec(), c.neighbours.to_vec())
                }
                None => {
                    st.used_bytes += d.geo.record_size as u64;
                    let r = reader.record(v).unwrap();
                    (r.vector.to_vec(), r.neighbours.to_vec())
                }
            };
            let x: Vec<f32> = vb
                .chunks_exact(4)
                .map(bytemuck::pod_read_unaligned::<f32>)
                .collect();
            st.hops += 1;
            st.exact_distances += 1;
            exact.push((d.metric.distance(q, &x), v));
            for u in nbrs {
                if visited.insert(u) {
                    st.pq_distances += 1;
                    cand.insert(pq.score(&table, u), u);
                }
            }
        }
    }
    exact.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    exact.dedup_by_key(|e| e.1);
    exact.truncate(p.k);
    (exact, st)
}

/// Statistics without the timings.
pub(crate) fn counts(s: &QueryStats) -> [u64; 7] {
    [
        s.hops as u64,
        s.reads as u64,
        s.bytes_read,
        s.cache_hits as u64,
        s.pq_distances as u64,
        s.exact_distances as u64,
        s.used_bytes,
    ]
}

#[test]
fn beam_gives_exactly_the_synchronous_beam() {
    let f = fixture();
    for idx in [&f.plain, &f.cached] {
        let d_ref = data(idx);
        let d = &*d_ref;
        let mut s = Scratch::new(d).unwrap();
        for (l, w) in [(20, 1), (40, 4), (60, 8), (N, 8)] {
            // Early dispatch with f = 1 waits for the whole hop: the same search.
            for early in [None, Some(1.0)] {
                let p = P {
                    early_dispatch: early,
                    ..params(ExecutorChoice::Beam, l, w)
                };
                // Exhaustive lists are slow to read: fewer queries there.
                let nq = if l == N { 6 } else { 40 };
                for q in f.queries.chunks_exact(DIM).take(nq) {
                    let (want, want_st) = reference_beam(d, q, &p);
                    let mut st = QueryStats::default();
                    one(idx, &mut s, q, &p, &mut st).unwrap();
                    assert_eq!(s.results, want, "L={l} W={w}");
                    assert_eq!(counts(&st), counts(&want_st), "L={l} W={w}");
                    assert!(st.io_wait_us >= 0.0 && st.cpu_us > 0.0);
                    assert_eq!(s.in_flight(), 0);
                }
            }
        }
        let (alloc, free) = s.buffers();
        assert_eq!(alloc, free);
    }
}

/// Adaptive beam (AlayaLaser): hop i reads min(2^i, W) blocks. The
/// executor gives exactly the synchronous beam with that width, which is
/// not the plain beam's search (a no-op adaptive beam fails here).
#[test]
fn adaptive_beam_is_the_synchronous_beam_with_doubling_width() {
    let f = fixture();
    let d_ref = data(&f.plain);
    let d = &*d_ref;
    let mut s = Scratch::new(d).unwrap();
    let mut differs = 0;
    for (l, w) in [(40, 8), (60, 16)] {
        let plain = params(ExecutorChoice::Beam, l, w);
        let adaptive = P {
            adaptive_beam: true,
            ..plain
        };
        for q in f.queries.chunks_exact(DIM).take(20) {
            let (want, want_st) = reference_beam(d, q, &adaptive);
            let mut st = QueryStats::default();
            one(&f.plain, &mut s, q, &adaptive, &mut st).unwrap();
            assert_eq!(s.results, want, "L={l} W={w}");
            assert_eq!(counts(&st), counts(&want_st), "L={l} W={w}");
            let (_, plain_st) = reference_beam(d, q, &plain);
            if counts(&plain_st) != counts(&want_st) {
                differs += 1;
            }
        }
    }
    assert!(
        differs >= 10,
        "adaptive and plain beams searched alike for {} of 40 queries",
        40 - differs
    );
}

/// Runs `p` on one worker over a fake engine (seed, delays) and returns
/// its results and the engine's largest number of reads in flight.
pub(crate) fn over_fake(
    idx: &Index,
    pages: &Arc<Vec<u8>>,
    p: &P,
    queries: &[f32],
    seed: u64,
    delay: u32,
) -> (Finished, usize) {
    let d_ref = data(idx);
    let d = &*d_ref;
    let nq = queries.len() / DIM;
    let fake = IoEngine::fake(
        pages.clone(),
        FakeOptions {
            seed,
            max_delay_polls: delay,
            ..Default::default()
        },
    );
    let mut s = Scratch::with_engine(d, fake);
    let (r, got) = run_all(d, &mut s, &p.plan(idx, nq), queries);
    r.unwrap();
    assert_eq!(s.in_flight(), 0);
    let (alloc, free) = s.buffers();
    assert_eq!(alloc, free, "every buffer back in the pool");
    let IoEngine::Fake(fe) = s.engine() else {
        panic!("fake engine expected")
    };
    assert_eq!(fe.double_completions(), 0);
    (got, fe.max_in_flight())
}

/// Early dispatch (AlayaLaser) issues the next hop while the current hop's
/// last pages are still in flight: one query keeps more than W reads in
/// flight, which the synchronous beam never does (a no-op early dispatch
/// fails here).
#[test]
fn early_dispatch_overlaps_hops() {
    let f = fixture();
    let queries = &f.queries[..8 * DIM];
    let beam = P {
        queries_in_flight: 1,
        ..params(ExecutorChoice::Beam, 60, 8)
    };
    let early = P {
        early_dispatch: Some(0.5),
        ..beam
    };
    for seed in 0..3 {
        let (_, sync) = over_fake(&f.plain, &f.pages, &beam, queries, seed, 6);
        assert!(
            sync <= 8,
            "the synchronous beam kept {sync} reads in flight"
        );
        let (_, overlapped) = over_fake(&f.plain, &f.pages, &early, queries, seed, 6);
        assert!(
            overlapped > 8,
            "early dispatch never had two hops in flight (at most {overlapped} reads)"
        );
    }
}

/// PipeANN's width starts at 4 and grows with useful arrivals: one query
/// keeps more than 4 reads in flight (a pipeline whose width never grows
/// fails here), and never more than W.
#[test]
fn pipeline_width_grows_from_its_start_width() {
    let f = fixture();
    let queries = &f.queries[..8 * DIM];
    for w in [8, 32] {
        let p = P {
            queries_in_flight: 1,
            ..params(ExecutorChoice::Pipeline, 100, w)
        };
        let plan = p.plan(&f.plain, 8);
        let crate::search::plan::ExecutorPlan::Pipeline(pp) = plan.executor else {
            panic!("pipeline expected")
        };
        assert_eq!(pp.start_width, 4);
        for seed in 0..3 {
            let (_, most) = over_fake(&f.plain, &f.pages, &p, queries, seed, 8);
            assert!(
                most > 4 && most <= w,
                "W={w}: at most {most} reads in flight"
            );
        }
    }
}

/// A query's index, results, counts and co-located expansions.
type Outcome = (usize, Vec<(f32, u32)>, [u64; 7], u32);

/// Results and statistics of each query, without the timings.
pub(crate) fn all_counts(got: &Finished) -> Vec<Outcome> {
    got.iter()
        .map(|(qi, (res, st))| (*qi, res.clone(), counts(st), st.colocated))
        .collect()
}

/// The same query on the same index gives the same ids, distances and
/// statistics whatever order its reads complete in: the pipeline and the
/// beam with early dispatch, with target records and with block search,
/// one or several queries per worker, over many completion orders. Without
/// the reorder buffer (`repeatable: false`) the same orders do change the
/// searches (so the orders tried are ones that matter).
#[test]
fn pipelined_searches_are_repeatable_under_any_completion_order() {
    let f = fixture();
    let sf = shuffled_fixture();
    let nq = 8;
    let queries = &f.queries[..nq * DIM];
    let pipe = params(ExecutorChoice::Pipeline, 40, 8);
    let early = P {
        early_dispatch: Some(0.5),
        ..params(ExecutorChoice::Beam, 40, 8)
    };
    let cases: Vec<(&str, &Index, &Arc<Vec<u8>>, P)> = vec![
        ("pipeline", &f.plain, &f.pages, pipe),
        (
            "pipeline q4 block",
            &sf.plain,
            &sf.pages,
            P {
                queries_in_flight: 4,
                ..pipe
            },
        ),
        ("pipeline block", &sf.plain, &sf.pages, pipe),
        (
            "beam early0.5 q3",
            &f.plain,
            &f.pages,
            P {
                queries_in_flight: 3,
                ..early
            },
        ),
        ("beam early0.5 block", &sf.plain, &sf.pages, early),
        (
            "beam early0.3 adaptive block q2",
            &sf.plain,
            &sf.pages,
            P {
                early_dispatch: Some(0.3),
                adaptive_beam: true,
                queries_in_flight: 2,
                ..early
            },
        ),
    ];
    for (name, idx, pages, p) in cases {
        // The reference: in submission order, one query at a time.
        let d_ref = data(idx);
        let d = &*d_ref;
        let mut reference = Scratch::new(d).unwrap();
        let (r0, want) = run_all(
            d,
            &mut reference,
            &P {
                queries_in_flight: 1,
                ..p
            }
            .plan(idx, nq),
            queries,
        );
        r0.unwrap();
        let want = all_counts(&want);
        let mut changed = 0;
        for seed in 0..8 {
            let delay = 1 + seed as u32 % 6;
            let (got, _) = over_fake(idx, pages, &p, queries, seed, delay);
            assert_eq!(all_counts(&got), want, "{name}, seed {seed}");
            let loose = P {
                repeatable: false,
                ..p
            };
            let (got, _) = over_fake(idx, pages, &loose, queries, seed, delay);
            if all_counts(&got) != want {
                changed += 1;
            }
        }
        assert!(
            changed > 0,
            "{name}: the completion orders tried never changed a search"
        );
    }
}

#[test]
fn auto_picks_the_pipeline_for_one_record_per_block() {
    // 1100-d float32 records take two pages: one record per block.
    let dir = tempfile::tempdir().unwrap();
    let (n, dim) = (300, 1100);
    let base = random_rows(n, dim, 3);
    build_index(&dir.path().join("big"), &base, n, dim, None);
    // The pread engine completes reads in submission order.
    let idx = open(&dir.path().join("big"), 0, EngineKind::Pread);
    let d_ref = data(&idx);
    let d = &*d_ref;
    assert_eq!(d.geo.records_per_block, 1);
    let queries = random_rows(5, dim, 4);
    let mut s = Scratch::new(d).unwrap();
    let mut seen = Vec::new();
    for kind in [
        ExecutorChoice::Auto,
        ExecutorChoice::Pipeline,
        ExecutorChoice::Beam,
    ] {
        let p = params(kind, 40, 8);
        let mut rows = Vec::new();
        for q in queries.chunks_exact(dim) {
            let mut st = QueryStats::default();
            one(&idx, &mut s, q, &p, &mut st).unwrap();
            rows.push((s.results.clone(), counts(&st)));
        }
        seen.push(rows);
    }
    // With an in-order engine the pipeline is deterministic: auto ran it.
    assert_eq!(seen[0], seen[1]);
    assert_ne!(seen[0], seen[2], "the beam reads in another order");
    // The 16-d index holds 30 records per block: auto runs the beam.
    let f = fixture();
    let d_ref = data(&f.plain);
    let d = &*d_ref;
    assert!(d.geo.records_per_block >= 2);
    let mut s = Scratch::new(d).unwrap();
    let mut a = QueryStats::default();
    let mut b = QueryStats::default();
    let q = &f.queries[..DIM];
    one(
        &f.plain,
        &mut s,
        q,
        &params(ExecutorChoice::Auto, 40, 4),
        &mut a,
    )
    .unwrap();
    let auto = s.results.clone();
    one(
        &f.plain,
        &mut s,
        q,
        &params(ExecutorChoice::Beam, 40, 4),
        &mut b,
    )
    .unwrap();
    assert_eq!((auto, counts(&a)), (s.results.clone(), counts(&b)));
}

#[test]
fn pipeline_abandons_reads_and_reaps_them() {
    let f = fixture();
    let d_ref = data(&f.plain);
    let d = &*d_ref;
    let mut stale = 0;
    for seed in 0..6 {
        let fake = IoEngine::fake(
            f.pages.clone(),
            FakeOptions {
                seed,
                max_delay_polls: 6,
                ..Default::default()
            },
        );
        let mut s = Scratch::with_engine(d, fake);
        // Pages processed as they arrive: a page that arrives before an
        // earlier read's can push that read's node out of the list, and the
        // query may end without it. (Processed in issue order, the pages of
        // nodes that dropped out come before those of the better nodes that
        // pushed them out, so a repeatable query seldom abandons a read.)
        let p = P {
            queries_in_flight: 4,
            repeatable: false,
            ..params(ExecutorChoice::Pipeline, 10, 16)
        };
        let mut done = 0;
        let mut next = 0;
        let nq = f.queries.len() / DIM;
        run(
            d,
            &mut s,
            &p.plan(&f.plain, nq),
            &f.queries,
            &mut || {
                next += 1;
                (next <= nq).then_some(next - 1)
            },
            &mut |_, res, _| {
                assert_eq!(res.len(), 10);
                done += 1;
            },
        )
        .unwrap();
        assert_eq!(done, nq);
        assert_eq!(s.in_flight(), 0);
        let (alloc, free) = s.buffers();
        assert_eq!(alloc, free);
        stale += s.stale_completions();
    }
    assert!(stale > 0, "some pipelined reads should have been abandoned");
}

#[test]
fn queries_served_from_the_cache_alone_all_answer() {
    // Every node cached: queries end at admission without a single read.
    let f = fixture();
    let all = open(&f._dir.path().join("x"), N, EngineKind::Auto);
    let nq = f.queries.len() / DIM;
    for (name, p) in kinds() {
        let p = P { l: 40, ..p };
        for threads in [1, 2] {
            let out = search(&all, &f.queries, nq, &p, threads).unwrap();
            let plain = search(&f.plain, &f.queries, nq, &p, threads).unwrap();
            for qi in 0..nq {
                let st = &out.stats[qi];
                assert_eq!(st.reads, 0, "{name}");
                assert!(st.hops > 0 && st.cache_hits == st.hops, "{name}: {st:?}");
                assert!(
                    out.ids[qi * 10..(qi + 1) * 10].iter().all(|&i| i >= 0),
                    "{name}"
                );
                if name.starts_with("beam") && !name.contains("early") {
                    // The cache never changes a (synchronous) beam search.
                    assert_eq!(
                        out.ids[qi * 10..(qi + 1) * 10],
                        plain.ids[qi * 10..(qi + 1) * 10]
                    );
                    assert_eq!(st.hops, plain.stats[qi].hops, "{name}");
                }
            }
        }
    }
}

#[test]
fn bad_parameters_are_refused_by_the_index() {
    let f = fixture();
    let q = &f.queries[..DIM];
    for (p, msg) in [
        (
            P {
                early_dispatch: Some(0.0),
                ..P::new(10, 100, 4)
            },
            "early_dispatch",
        ),
        (
            P {
                queries_in_flight: 1000,
                ..P::new(10, 100, 4)
            },
            "queries_in_flight=1000",
        ),
        (
            P {
                queries_in_flight: 65,
                ..P::new(10, 100, 4)
            },
            "queries_in_flight=65",
        ),
        (
            P {
                executor: ExecutorChoice::Pipeline,
                adaptive_beam: true,
                ..P::new(10, 100, 4)
            },
            "adaptive_beam",
        ),
    ] {
        let e = search(&f.plain, q, 1, &p, 1).unwrap_err().to_string();
        assert!(e.contains(msg), "{e}");
    }
    // A plan made by hand is checked by the executor too.
    let d_ref = data(&f.plain);
    let d = &*d_ref;
    let mut s = Scratch::new(d).unwrap();
    let mut st = QueryStats::default();
    for (plan, msg) in [
        (
            SearchPlan {
                queries_in_flight: 0,
                ..SearchPlan::beam(10, 100, 4)
            },
            "queries_in_flight=0",
        ),
        (SearchPlan::beam(10, 5, 4), "L=5"),
    ] {
        let e = search_one(d, &mut s, q, &plan, &mut st).unwrap_err();
        assert!(e.to_string().contains(msg), "{e}");
    }
}

/// Finished queries by index: best (distance, id) and statistics.
type Finished = BTreeMap<usize, (Vec<(f32, u32)>, QueryStats)>;

/// Runs `nq` queries on one worker and collects results by query index.
pub(crate) fn run_all(
    d: &IndexData<f32>,
    s: &mut Scratch<f32>,
    p: &SearchPlan,
    queries: &[f32],
) -> (crate::Result<()>, Finished) {
    let nq = queries.len() / d.dim;
    let mut next = 0;
    let mut out = BTreeMap::new();
    let r = run(
        d,
        s,
        p,
        queries,
        &mut || {
            next += 1;
            (next <= nq).then_some(next - 1)
        },
        &mut |qi, res, st| {
            assert!(
                out.insert(qi, (res.to_vec(), *st)).is_none(),
                "query {qi} ended twice"
            );
        },
    );
    (r, out)
}

pub(crate) fn kind_params(kind: usize, q: usize) -> P {
    let base = P {
        queries_in_flight: q,
        ..params(ExecutorChoice::Beam, 40, 4)
    };
    match kind {
        0 => base,
        1 => P {
            adaptive_beam: true,
            ..base
        },
        // Order-dependent kinds: exhaustive lists make them exact.
        2 => P {
            early_dispatch: Some(0.5),
            l: N,
            ..base
        },
        _ => P {
            executor: ExecutorChoice::Pipeline,
            l: N,
            w: 8,
            ..base
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn many_queries_per_worker_over_the_fake_engine(
        seed in any::<u64>(),
        delay in 0u32..5,
        q in 1usize..9,
        kind in 0usize..4,
        fail in prop_oneof![3 => Just(0.0f64), 1 => 0.002f64..0.05],
        cached in any::<bool>(),
        repeatable in any::<bool>(),
    ) {
        let f = fixture();
        let idx = if cached { &f.cached } else { &f.plain };
        let d_ref = data(idx);
        let d = &*d_ref;
        let nq = 8;
        let queries = &f.queries[..nq * DIM];
        let p = P { repeatable, ..kind_params(kind, q) };
        // The reference: one query at a time on the in-order pread engine.
        let mut reference = Scratch::new(d).unwrap();
        let (r0, want) = run_all(d, &mut reference, &P { queries_in_flight: 1, ..p }.plan(idx, nq), queries);
        r0.unwrap();
        let fake = IoEngine::fake(f.pages.clone(), FakeOptions {
            seed,
            max_delay_polls: delay,
            fail_probability: fail,
            ..Default::default()
        });
        let mut s = Scratch::with_engine(d, fake);
        let (r, got) = run_all(d, &mut s, &p.plan(idx, nq), queries);
        // Whatever happened, nothing is left in flight and every buffer is back.
        prop_assert_eq!(s.in_flight(), 0);
        let (alloc, free) = s.buffers();
        prop_assert_eq!(alloc, free);
        let IoEngine::Fake(fe) = s.engine() else { panic!("fake engine expected") };
        prop_assert_eq!(fe.double_completions(), 0);
        prop_assert_eq!(fe.completed(), fe.submitted());
        let errors = fe.counters().errors;
        match r {
            Ok(()) => {
                // A failed read may only be one its query had abandoned.
                prop_assert!(errors <= s.stale_completions());
                prop_assert_eq!(got.len(), nq);
                let reads: u64 = got.values().map(|(_, st)| st.reads as u64).sum();
                prop_assert_eq!(reads, fe.submitted(), "every read belongs to one query");
                for (qi, (res, st)) in &got {
                    let (wres, wst) = &want[qi];
                    prop_assert_eq!(res, wres, "query {}", qi);
                    if kind <= 1 || repeatable {
                        // Synchronous beams do not depend on completion
                        // order; repeatable searches of every kind do not.
                        prop_assert_eq!(counts(st), counts(wst), "query {}", qi);
                    }
                }
            }
            Err(e) => {
                prop_assert!(errors > 0, "unexpected error {}", e);
                prop_assert!(e.to_string().contains("injected failure"), "{}", e);
            }
        }
    }
}

#[test]
fn several_queries_fill_the_queue() {
    let f = fixture();
    let d_ref = data(&f.plain);
    let d = &*d_ref;
    let fake = IoEngine::fake(
        f.pages.clone(),
        FakeOptions {
            seed: 1,
            max_delay_polls: 3,
            ..Default::default()
        },
    );
    let mut s = Scratch::with_engine(d, fake);
    let p = P {
        queries_in_flight: 8,
        ..params(ExecutorChoice::Beam, 40, 4)
    };
    let (r, got) = run_all(
        d,
        &mut s,
        &p.plan(&f.plain, f.queries.len() / DIM),
        &f.queries,
    );
    r.unwrap();
    assert_eq!(got.len(), f.queries.len() / DIM);
    let IoEngine::Fake(fe) = s.engine() else {
        panic!("fake engine expected")
    };
    assert!(
        fe.max_in_flight() >= 16,
        "8 queries × W=4 should keep ≥ 16 reads in flight, saw {}",
        fe.max_in_flight()
    );
}

/// The fixture's data under a shuffled layout (Starling): same base and
/// shuffled external ids, blocks holding graph neighbours.
pub(crate) struct ShuffledFixture {
    _dir: tempfile::TempDir,
    pub(crate) plain: Index,
    pub(crate) cached: Index,
    pub(crate) pages: Arc<Vec<u8>>,
}

pub(crate) fn shuffled_fixture() -> &'static ShuffledFixture {
    static F: OnceLock<ShuffledFixture> = OnceLock::new();
    F.get_or_init(|| {
        let f = fixture();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let opts = BuildOptions {
            page_size: Some(4096),
            layout: Some(crate::layout::LayoutKind::SHUFFLED),
            ..test_build_options(Some(f.ids.clone()))
        };
        build_with(&path, &f.base, N, DIM, &opts);
        let pages = Arc::new(std::fs::read(path.join("pages.bin")).unwrap());
        ShuffledFixture {
            plain: open(&path, 0, EngineKind::Auto),
            cached: open(&path, 200, EngineKind::Auto),
            pages,
            _dir: dir,
        }
    })
}
