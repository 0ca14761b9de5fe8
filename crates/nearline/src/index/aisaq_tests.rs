//! Tests of the AiSAQ composition: PQ-coded records (each record carries
//! its neighbours' PQ codes, scored from the expanded record), no codes in
//! memory, the preset end to end, updates that re-encode the records, and
//! damage to the new parts of the format.

use super::test_data::{
    build_error, clustered, manifest_of, open_uncached, open_with_budget, recall_against, recall_of,
};
use super::*;
use crate::format::{LayoutKind, Preset, Section};
use crate::layout::{AnyLayout, IdLayout, RecordReader};
use crate::planner::{CacheChoice, PageChoice, PresetChoice};
use crate::search::{PqRecordScorer, Scorer};
use crate::util::Budget;

const N: usize = 3000;
const DIM: usize = 48;

fn opts() -> BuildOptions {
    BuildOptions {
        preset: PresetChoice::Named(Preset::Aisaq),
        r: Some(32),
        build_l: Some(64),
        threads: Some(2),
        ..Default::default()
    }
}

fn build_aisaq(dir: &Path, o: &BuildOptions, metric: crate::distance::Metric) -> Vec<f32> {
    let data = clustered(N, DIM, 1);
    let m = Matrix::from_vec(data.clone(), N, DIM).unwrap();
    let o = BuildOptions {
        metric,
        ..o.clone()
    };
    build(m, dir, &o, &|_, _, _| {}, &AtomicBool::new(false)).unwrap();
    data
}

/// `nq` queries from the clusters of the built set (the generator draws
/// its centres first, so a longer draw extends the same set).
fn queries(nq: usize) -> Vec<f32> {
    clustered(N + nq, DIM, 1)[N * DIM..].to_vec()
}

#[test]
fn records_carry_their_neighbours_pq_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    build_aisaq(&dir, &opts(), crate::distance::Metric::L2);
    let m = manifest_of(&dir);
    assert_eq!(m.layout.kind, LayoutKind::PqCoded);
    assert_eq!(m.spec.preset, Preset::Aisaq);
    // 48-d float32 at R 32: a plain record (324 B) leaves a neighbour
    // (4,080 − 324) / 32 = 117 bytes, so the codes take one per dimension.
    assert_eq!(m.spec.pq_bytes, DIM);
    let geo = crate::planner::geometry(&m).unwrap();
    assert_eq!((geo.pq_code, geo.codes), (DIM, 32 * DIM));
    assert!(m.has(Section::PqCodes) && m.has(Section::PqCodebook) && m.has(Section::InDegree));
    let codes = crate::io::files::read_section(&dir, &m, Section::PqCodes).unwrap();
    let codebook = crate::format::pq::decode(
        Path::new("pq_codebook"),
        &crate::io::files::read_section(&dir, &m, Section::PqCodebook).unwrap(),
    )
    .unwrap();
    let scorer = PqRecordScorer {
        codebook,
        metric: m.metric,
        max_degree: m.layout.max_degree,
    };
    let layout = AnyLayout::Id(IdLayout::new(geo, m.n));
    let mut reader = RecordReader::open(&dir.join("pages.bin"), &layout).unwrap();
    let q = queries(1);
    let mut table = Vec::new();
    scorer.prepare(&q, &mut table);
    for v in (0..N as u32).step_by(37) {
        let rec = reader.record(v).unwrap();
        let n = rec.neighbours.len();
        assert!(n > 0);
        for (i, &u) in rec.neighbours.iter().enumerate() {
            let want = &codes[u as usize * DIM..(u as usize + 1) * DIM];
            assert_eq!(
                &rec.codes[i * DIM..(i + 1) * DIM],
                want,
                "node {v} slot {i}"
            );
        }
        // The slots past the list are zero.
        assert!(rec.codes[n * DIM..].iter().all(|&b| b == 0));
        // The estimates are the in-memory PQ scorer's, from the record.
        assert_eq!(scorer.code_len(), DIM);
        for (i, &u) in rec.neighbours.iter().enumerate() {
            let code = &codes[u as usize * DIM..(u as usize + 1) * DIM];
            let want = crate::quant::pq::adc(&table, code);
            assert_eq!(
                scorer.score_code(&table, &rec.codes[i * DIM..(i + 1) * DIM]),
                want
            );
        }
    }
}

#[test]
fn aisaq_finds_neighbours_with_no_codes_in_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let queries = queries(100);
    for metric in [
        crate::distance::Metric::Cosine,
        crate::distance::Metric::L2,
        crate::distance::Metric::InnerProduct,
    ] {
        let dir = tmp.path().join(metric.to_string());
        let data = build_aisaq(&dir, &opts(), metric);
        let idx = Index::open(&dir, &OpenOptions::default()).unwrap();
        let plan = idx.open_plan().unwrap();
        assert_eq!(plan.cache, crate::planner::preset::CacheKind::InDegree);
        assert_eq!(plan.memory.pq_codes, 0);
        assert!(plan.memory.pq_codebook > 0);
        let held = idx.memory().unwrap();
        assert_eq!(held.pq_codes, 0);
        assert!(held.static_total() <= plan.memory.budget - plan.memory.worker_scratch);
        let o = SearchOptions::new(10);
        let out = idx.search(&queries, 100, &o).unwrap();
        if metric == crate::distance::Metric::L2 {
            let r = recall_against(&out.ids, &data, DIM, &queries, 10);
            assert!(r >= 0.95, "{metric}: recall {r}");
        } else {
            // Against the metric's own exact ranking.
            let truth = crate::data::groundtruth::compute_ground_truth(
                crate::data::matrix::MatrixView::new(&data, N, DIM).unwrap(),
                crate::data::matrix::MatrixView::new(&queries, 100, DIM).unwrap(),
                10,
                metric,
            )
            .unwrap()
            .ids;
            let hit = out
                .ids
                .chunks_exact(10)
                .zip(truth.chunks_exact(10))
                .map(|(a, t)| a.iter().filter(|&&x| t.contains(&(x as u32))).count())
                .sum::<usize>();
            let r = hit as f64 / 1000.0;
            assert!(r >= 0.95, "{metric}: recall {r}");
        }
        if metric != crate::distance::Metric::L2 {
            continue;
        }
        // Every record read is one read; none is served from PQ in RAM.
        let s = idx.plan_search(&o, None, 100).unwrap();
        assert!(matches!(
            s.plan.executor,
            crate::search::ExecutorPlan::Beam(_) | crate::search::ExecutorPlan::Pipeline(_)
        ));
        // A BFS cache serves too; an adjacency cache and block search are
        // refused with the layout named.
        let bfs = Index::open(
            &dir,
            &OpenOptions {
                cache: CacheChoice::Bfs,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(recall_of(&bfs, &data, DIM, &queries, &o) >= 0.95);
        let e = Index::open(
            &dir,
            &OpenOptions {
                cache: CacheChoice::Adjacency,
                ..Default::default()
            },
        )
        .err()
        .expect("refused")
        .to_string();
        assert!(e.contains("adjacency"), "{e}");
        let block = SearchOptions {
            page_search: PageChoice::Block,
            ..SearchOptions::new(10)
        };
        let e = idx.search(&queries, 100, &block).unwrap_err().to_string();
        assert!(e.contains("pq_coded layout"), "{e}");
        let report = idx.check_json().unwrap();
        assert_eq!(report["problem_count"], 0, "{report}");
    }
}

#[test]
fn five_percent_of_the_raw_bytes_holds_the_index() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    let n = 40_000;
    let all = clustered(n + 50, DIM, 3);
    let (data, queries) = (all[..n * DIM].to_vec(), all[n * DIM..].to_vec());
    let raw = (n * DIM * 4) as u64;
    let m = Matrix::from_vec(data.clone(), n, DIM).unwrap();
    let planned = crate::planner::plan_build(
        &opts(),
        &crate::planner::DataFacts {
            n,
            dim: DIM,
            dtype: crate::elem::DType::F32,
        },
    )
    .unwrap();
    // The preset's default: 5% of the raw bytes, raised to what four
    // queries a worker need (on this small set, more).
    let rule = planned
        .decisions
        .iter()
        .find(|d| d.what == "memory_budget")
        .unwrap();
    assert!(rule.rule.contains("5% of the raw vectors"), "{}", rule.rule);
    assert!(planned.memory.budget >= raw / 20);
    build(m, &dir, &opts(), &|_, _, _| {}, &AtomicBool::new(false)).unwrap();
    // Opened at exactly 5%: the codebook, one query's table a worker, and
    // an in-degree cache of the rest.
    let idx = open_with_budget(&dir, raw / 20);
    let plan = idx.open_plan().unwrap().memory;
    assert_eq!((plan.budget, plan.pq_codes), (raw / 20, 0));
    assert!(plan.cache_nodes > 0, "{plan:?}");
    let o = SearchOptions {
        l: Some(150),
        ..SearchOptions::new(10)
    };
    let r = recall_of(&idx, &data, DIM, &queries, &o);
    assert!(r >= 0.95, "recall {r}");
    let held = idx.memory().unwrap();
    assert!(
        held.static_total() + plan.worker_scratch <= raw / 20,
        "{held:?}"
    );
    assert_eq!(idx.info()["memory"]["within_budget"], true);
}

#[test]
fn updates_re_encode_the_records() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    let data = build_aisaq(
        &dir,
        &BuildOptions {
            memory_budget: Some(Budget::Bytes(4 << 20)),
            ..opts()
        },
        crate::distance::Metric::L2,
    );
    let idx = Index::open(&dir, &OpenOptions::default()).unwrap();
    // 300 more points of the same clusters (the generator draws its
    // centres first, so a longer draw extends the same set).
    let more = clustered(N + 350, DIM, 1);
    let extra = more[N * DIM..(N + 300) * DIM].to_vec();
    let queries = more[(N + 300) * DIM..].to_vec();
    let ids: Vec<u64> = (50_000..50_300).collect();
    idx.insert(&extra, Some(&ids)).unwrap();
    let gone: Vec<u64> = (0..300).collect();
    assert_eq!(idx.delete(&gone).unwrap(), 300);
    idx.checkpoint().unwrap();
    drop(idx);
    let idx = Index::open(&dir, &OpenOptions::default()).unwrap();
    let report = idx.check_json().unwrap();
    assert_eq!(report["problem_count"], 0, "{report}");
    assert_eq!(manifest_of(&dir).layout.kind, LayoutKind::PqCoded);
    // Each inserted vector is found by its own query; no deleted id returns.
    let out = idx.search(&extra, 300, &SearchOptions::new(10)).unwrap();
    let own = out
        .ids
        .chunks_exact(10)
        .zip(&ids)
        .filter(|(r, &id)| r.contains(&(id as i64)))
        .count();
    assert!(own >= 297, "{own} of 300 inserts found by their own query");
    let out = idx.search(&queries, 50, &SearchOptions::new(10)).unwrap();
    assert!(out.ids.iter().all(|&i| i >= 300));
    // Recall against the live set.
    let mut live: Vec<f32> = data[300 * DIM..].to_vec();
    live.extend_from_slice(&extra);
    let live_ids: Vec<i64> = (300..N as i64).chain(50_000..50_300).collect();
    let rows: Vec<i64> = out
        .ids
        .iter()
        .map(|id| live_ids.iter().position(|x| x == id).unwrap() as i64)
        .collect();
    let r = recall_against(&rows, &live, DIM, &queries, 10);
    assert!(r >= 0.95, "recall {r}");
}

#[test]
fn damage_to_the_codes_is_detected() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    build_aisaq(&dir, &opts(), crate::distance::Metric::L2);
    let m = manifest_of(&dir);
    // A manifest whose PQ size disagrees with its records is corrupt.
    let path = dir.join(crate::format::MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    let edited = text.replace(
        &format!("\"pq_bytes\": {DIM}"),
        &format!("\"pq_bytes\": {}", DIM / 2),
    );
    assert_ne!(edited, text);
    std::fs::write(
        &path,
        crate::format::manifest::reseal(&path, &edited).unwrap(),
    )
    .unwrap();
    let e = Index::open(&dir, &OpenOptions::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("layout fields disagree"), "{e}");
    std::fs::write(&path, &text).unwrap();
    // A byte of a record's code region fails the block's checksum.
    let geo = crate::planner::geometry(&m).unwrap();
    let pages = dir.join("pages.bin");
    let good = std::fs::read(&pages).unwrap();
    let mut b = good.clone();
    b[crate::format::PAGE_HEADER_BYTES + geo.codes_offset() + 3] ^= 0x10;
    std::fs::write(&pages, &b).unwrap();
    let idx = open_uncached(&dir);
    let report = idx.check_json().unwrap();
    assert!(report["problem_count"].as_u64().unwrap() >= 1, "{report}");
    drop(idx);
    std::fs::write(&pages, &good).unwrap();
    // A pq_codes section that disagrees with the records (rewritten with
    // its checksum) is reported by check.
    let codes_path = crate::io::files::section_path(&dir, &m, Section::PqCodes);
    let mut c = std::fs::read(&codes_path).unwrap();
    let first = manifest_of(&dir);
    let idx = Index::open(&dir, &OpenOptions::default()).unwrap();
    let u = {
        let layout = AnyLayout::Id(IdLayout::new(geo, first.n));
        let mut reader = RecordReader::open(&pages, &layout).unwrap();
        reader.record(0).unwrap().neighbours[0]
    };
    drop(idx);
    c[u as usize * DIM] ^= 1;
    std::fs::write(&codes_path, &c).unwrap();
    let mut man = first.clone();
    if let Some(s) = man.sections.get_mut(&Section::PqCodes) {
        s.crc32c = Some(crc32c::crc32c(&c));
    }
    crate::io::files::write_manifest(&dir, &man).unwrap();
    let idx = Index::open(&dir, &OpenOptions::default()).unwrap();
    let report = idx.check_json().unwrap();
    let problems = report["problems"].to_string();
    assert!(
        problems.contains("differ from the pq_codes section"),
        "{report}"
    );
}

#[test]
fn aisaq_builds_refuse_what_does_not_apply() {
    let tmp = tempfile::tempdir().unwrap();
    let data = clustered(500, DIM, 1);
    let try_build = |o: BuildOptions| build_error(&data, DIM, &tmp.path().join("x"), &o);
    let e = try_build(BuildOptions {
        adjacency: Some(true),
        ..opts()
    });
    assert!(
        e.contains("adjacency does not apply to a pq_coded layout"),
        "{e}"
    );
    for m in [0, DIM + 1] {
        let e = try_build(BuildOptions {
            pq_bytes: Some(m),
            ..opts()
        });
        assert!(e.contains("pq_bytes"), "{e}");
    }
    let e = try_build(BuildOptions {
        codes: crate::planner::CodeParams {
            principal_dims: Some(16),
            bits: None,
        },
        ..opts()
    });
    assert!(
        e.contains("principal_dims applies to a coded layout"),
        "{e}"
    );
    // An explicit PQ size is kept, the record growing as it needs.
    let dir = tmp.path().join("given");
    let m = Matrix::from_vec(data.clone(), 500, DIM).unwrap();
    let o = BuildOptions {
        pq_bytes: Some(12),
        ..opts()
    };
    let man = build(m, &dir, &o, &|_, _, _| {}, &AtomicBool::new(false)).unwrap();
    assert_eq!(man.spec.pq_bytes, 12);
}
