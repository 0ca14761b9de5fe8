//! Tests of the AlayaLaser composition: coded records (neighbours' RaBitQ
//! codes scored from the expanded record), the PCA-space storage that keeps
//! distances exact, the in-degree cache, and the preset end to end.

use super::test_data::{build_error, clustered, exact_knn, l2, open_uncached};
use super::*;
use crate::format::{LayoutKind, Preset, Section};
use crate::layout::{AnyLayout, IdLayout, RecordReader};
use crate::planner::{CacheChoice, CodeParams, PageChoice, PresetChoice};
use crate::search::{CodeScratch, CodedScorer, Scorer};
use crate::util::Budget;

const N: usize = 4000;
const DIM: usize = 64;

fn opts(principal: Option<usize>) -> BuildOptions {
    BuildOptions {
        preset: PresetChoice::Named(Preset::Alayalaser),
        r: Some(32),
        build_l: Some(64),
        threads: Some(2),
        entry_clusters: Some(40),
        codes: CodeParams {
            principal_dims: principal,
            bits: None,
        },
        memory_budget: Some(Budget::Bytes(2 << 20)),
        ..Default::default()
    }
}

fn build_coded(dir: &Path, o: &BuildOptions) -> (Manifest, Vec<f32>) {
    let data = clustered(N, DIM, 1);
    let m = Matrix::from_vec(data.clone(), N, DIM).unwrap();
    let man = build(m, dir, o, &|_, _, _| {}, &AtomicBool::new(false)).unwrap();
    (man, data)
}

fn scorer_of(dir: &Path, m: &Manifest) -> CodedScorer {
    let read = |s| crate::io::files::read_section(dir, m, s).unwrap();
    let pca = crate::format::quant::decode_pca(Path::new("pca"), &read(Section::Pca)).unwrap();
    let rq =
        crate::format::quant::decode_rabitq(Path::new("rabitq"), &read(Section::Rabitq)).unwrap();
    CodedScorer::new(&pca, rq, m.layout.max_degree, m.layout.codes.unwrap().bits).unwrap()
}

#[test]
fn coded_records_give_exact_distances_and_estimates_close_to_them() {
    let tmp = tempfile::tempdir().unwrap();
    let mut by_bits = Vec::new();
    for (principal, bits) in [
        (None, 1),
        (None, 2),
        (None, 4),
        (Some(32), 1),
        (Some(32), 2),
    ] {
        let dir = tmp.path().join(format!("a{principal:?}-{bits}"));
        let o = BuildOptions {
            codes: CodeParams {
                principal_dims: principal,
                bits: Some(bits),
            },
            ..opts(principal)
        };
        let (m, data) = build_coded(&dir, &o);
        assert_eq!(m.layout.kind, LayoutKind::Coded);
        assert_eq!(m.spec.pq_bytes, 0);
        let p = principal.unwrap_or(DIM);
        assert_eq!(m.layout.codes.map(|c| c.principal_dims), Some(p));
        assert!(m.has(Section::InDegree) && !m.has(Section::PqCodes));
        let scorer = scorer_of(&dir, &m);
        let geo = crate::planner::geometry(&m).unwrap();
        let layout = AnyLayout::Id(IdLayout::new(geo, m.n));
        let mut reader = RecordReader::open(&dir.join("pages.bin"), &layout).unwrap();
        let queries = clustered(20, DIM, 9);
        let (mut state, mut moved, mut scratch) = (Vec::new(), Vec::new(), CodeScratch::default());
        let (mut rel, mut count, mut pairs, mut ordered) = (0f64, 0usize, 0usize, 0usize);
        let mut worst = 0f64;
        for q in queries.chunks_exact(DIM) {
            assert!(scorer.transform(q, &mut moved));
            scorer.prepare(&moved, &mut state);
            for v in (0..N as u32).step_by(97) {
                let rec = reader.record(v).unwrap();
                let x: &[f32] = bytemuck::cast_slice(rec.vector);
                let n = rec.neighbours.len();
                let d = scorer
                    .score_record(&state, &moved, x, rec.codes, n, &mut scratch)
                    .unwrap();
                // Stored in the transform's space, the distance is exact.
                let truth = l2(q, &data[v as usize * DIM..(v as usize + 1) * DIM]);
                assert!((d - truth).abs() <= 1e-3 * truth.max(1.0), "{d} vs {truth}");
                let t: Vec<f32> = rec
                    .neighbours
                    .iter()
                    .map(|&u| l2(q, &data[u as usize * DIM..(u as usize + 1) * DIM]))
                    .collect();
                for (e, tr) in scratch.est.iter().zip(&t) {
                    let x = ((e - tr).abs() / tr.max(1e-6)) as f64;
                    rel += x;
                    worst = worst.max(x);
                    count += 1;
                }
                for i in 0..n {
                    for j in i + 1..n {
                        if t[i] != t[j] {
                            pairs += 1;
                            let same = (scratch.est[i] < scratch.est[j]) == (t[i] < t[j]);
                            ordered += same as usize;
                        }
                    }
                }
            }
        }
        let mean_rel = rel / count as f64;
        let order = ordered as f64 / pairs as f64;
        eprintln!(
            "principal {p} bits {bits}: mean relative error {mean_rel:.4} (worst {worst:.3}), \
             pairs ordered {order:.4}"
        );
        // Measured (p 64): 1.8% mean relative error and 76% of a record's
        // neighbour pairs in the true order at 1 bit (neighbours lie close
        // together), 0.9% and 86% at 2 bits, 0.24% and 96% at 4 bits.
        assert!(mean_rel < 0.05 && order > 0.65, "{mean_rel} {order}");
        if principal.is_none() {
            by_bits.push((bits, mean_rel, order));
        }
    }
    for w in by_bits.windows(2) {
        assert!(w[1].1 < w[0].1 && w[1].2 > w[0].2, "{by_bits:?}");
    }
}

fn recall(idx: &Index, data: &[f32], queries: &[f32], o: &SearchOptions) -> f64 {
    let nq = queries.len() / DIM;
    let out = idx.search(queries, nq, o).unwrap();
    let k = o.k;
    let mut hit = 0;
    for (i, q) in queries.chunks_exact(DIM).enumerate() {
        let truth = exact_knn(data, DIM, q, k);
        hit += out.ids[i * k..(i + 1) * k]
            .iter()
            .filter(|x| truth.contains(x))
            .count();
        // Distances are the original space's.
        for (j, &id) in out.ids[i * k..(i + 1) * k].iter().enumerate() {
            let t = l2(q, &data[id as usize * DIM..(id as usize + 1) * DIM]);
            let d = out.distances[i * k + j];
            assert!((d - t).abs() <= 1e-3 * t.max(1.0), "{d} vs {t}");
        }
    }
    hit as f64 / (nq * k) as f64
}

#[test]
fn alayalaser_finds_neighbours_within_budget_with_an_in_degree_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    let (m, data) = build_coded(&dir, &opts(None));
    let idx = Index::open(&dir, &OpenOptions::default()).unwrap();
    let plan = idx.open_plan().unwrap();
    assert_eq!(plan.cache, crate::planner::preset::CacheKind::InDegree);
    assert_eq!(plan.memory.pq_codes + plan.memory.pq_codebook, 0);
    assert!(plan.memory.quantizer > 0);
    let held = idx.memory().unwrap();
    assert!(held.cache_nodes as f64 <= (0.15 * N as f64).ceil());
    assert!(held.cache_nodes > 0 && held.cache <= plan.memory.cache);
    assert!(held.static_total() <= plan.memory.budget - plan.memory.worker_scratch);
    // The cache holds the highest in-degree nodes.
    let order = crate::format::in_degree::decode(
        Path::new("in_degree"),
        &crate::io::files::read_section(&dir, &m, Section::InDegree).unwrap(),
        N,
    )
    .unwrap();
    let gref_guard = idx.graph().unwrap();
    let guard = gref_guard.cache().unwrap();
    let crate::cache::AnyCache::Bfs(cache) = &*guard else {
        panic!("an in-degree cache holds whole records");
    };
    for &v in &order[..held.cache_nodes as usize] {
        assert!(crate::cache::Cache::contains(cache, v));
    }
    let queries = clustered(100, DIM, 7);
    let r = recall(&idx, &data, &queries, &SearchOptions::new(10));
    assert!(r >= 0.95, "recall {r}");
    // The plan is the preset's: beam with adaptive width and early dispatch.
    let s = idx.plan_search(&SearchOptions::new(10), None, 100).unwrap();
    match s.plan.executor {
        crate::search::ExecutorPlan::Beam(b) => {
            assert!(b.adaptive && b.early_dispatch == Some(0.5) && b.width == 16);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.plan.l, 200);
    // Another executor, and the BFS cache on the same index.
    let pipe = SearchOptions {
        executor: crate::planner::ExecutorChoice::Pipeline,
        l: Some(100),
        ..SearchOptions::new(10)
    };
    assert!(recall(&idx, &data, &queries, &pipe) >= 0.9);
    let bfs = Index::open(
        &dir,
        &OpenOptions {
            cache: CacheChoice::Bfs,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(recall(&bfs, &data, &queries, &SearchOptions::new(10)) >= 0.95);
    // Caches and page policies that need PQ or lists are refused.
    let e = Index::open(
        &dir,
        &OpenOptions {
            cache: CacheChoice::Adjacency,
            ..Default::default()
        },
    );
    assert!(e.is_err());
    let block = SearchOptions {
        page_search: PageChoice::Block,
        ..SearchOptions::new(10)
    };
    let e = idx.search(&queries, 100, &block).unwrap_err().to_string();
    assert!(e.contains("coded layout"), "{e}");
}

#[test]
fn a_damaged_code_region_is_detected() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    let (m, _) = build_coded(&dir, &opts(None));
    let geo = crate::planner::geometry(&m).unwrap();
    // One byte inside the first record's code region.
    let at = crate::format::PAGE_HEADER_BYTES + geo.codes_offset() + 5;
    let pages = dir.join("pages.bin");
    let mut b = std::fs::read(&pages).unwrap();
    b[at] ^= 0x10;
    std::fs::write(&pages, &b).unwrap();
    let idx = open_uncached(&dir);
    let data = clustered(N, DIM, 1);
    let q = &data[..DIM];
    let o = SearchOptions {
        l: Some(N.min(1000)),
        ..SearchOptions::new(10)
    };
    let mut seen = false;
    for _ in 0..1 {
        if let Err(e) = idx.search(q, 1, &o) {
            assert!(matches!(e, Error::Corrupt { .. }), "{e}");
            seen = true;
        }
    }
    assert!(seen, "a search that reads node 0's block must fail its CRC");
}

#[test]
fn coded_builds_refuse_what_does_not_apply() {
    let tmp = tempfile::tempdir().unwrap();
    let data = clustered(500, DIM, 1);
    let try_build = |o: BuildOptions| build_error(&data, DIM, &tmp.path().join("x"), &o);
    for metric in [
        crate::distance::Metric::InnerProduct,
        crate::distance::Metric::Cosine,
    ] {
        let e = try_build(BuildOptions {
            metric,
            ..opts(None)
        });
        assert!(e.contains("l2 metric only"), "{e}");
    }
    for p in [0, 1, DIM + 1] {
        let e = try_build(opts(Some(p)));
        assert!(e.contains("principal_dims"), "{e}");
    }
    let e = try_build(BuildOptions {
        pq_bytes: Some(8),
        ..opts(None)
    });
    assert!(e.contains("pq_bytes"), "{e}");
    let e = try_build(BuildOptions {
        adjacency: Some(true),
        ..opts(None)
    });
    assert!(e.contains("adjacency"), "{e}");
    let e = try_build(BuildOptions {
        preset: PresetChoice::Named(Preset::Diskann),
        ..opts(Some(16))
    });
    assert!(
        e.contains("principal_dims applies to a coded layout"),
        "{e}"
    );
}

#[test]
fn a_coded_manifest_with_pq_bytes_is_corrupt() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    let (_, _) = build_coded(&dir, &opts(None));
    let path = dir.join(crate::format::MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    let edited = text.replace("\"pq_bytes\": 0", "\"pq_bytes\": 8");
    assert_ne!(edited, text);
    let sealed = crate::format::manifest::reseal(&path, &edited).unwrap();
    std::fs::write(&path, sealed).unwrap();
    let e = Index::open(&dir, &OpenOptions::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("expected 0 for a coded layout"), "{e}");
}

/// Finer codes route better: at the same L, 2- and 4-bit codes find more
/// of the true neighbours than 1-bit RaBitQ (queries far from every
/// cluster here, where 1-bit estimates mislead most).
#[test]
fn more_bits_per_dimension_route_better() {
    let tmp = tempfile::tempdir().unwrap();
    let queries = clustered(100, DIM, 7);
    let o = SearchOptions {
        l: Some(50),
        ..SearchOptions::new(10)
    };
    let mut got = Vec::new();
    for bits in [1, 2, 4] {
        let dir = tmp.path().join(format!("b{bits}"));
        let b = BuildOptions {
            codes: CodeParams {
                principal_dims: None,
                bits: Some(bits),
            },
            ..opts(None)
        };
        let (m, data) = build_coded(&dir, &b);
        assert_eq!(m.layout.codes.map(|c| c.bits), Some(bits));
        let idx = Index::open(&dir, &OpenOptions::default()).unwrap();
        got.push(recall(&idx, &data, &queries, &o));
    }
    // Measured: 0.792, 0.947, 0.984.
    assert!(got[0] < got[1] && got[1] < got[2], "{got:?}");
    assert!(got[2] >= 0.95, "{got:?}");
}

#[test]
fn code_bits_fill_the_block_one_bit_codes_need() {
    use crate::planner::rules::code_bits;
    // 384-d float, R 64, p 256: 1-bit records (1,796 + 2,048 + 512 =
    // 4,356 B) take an 8 KiB block, 2-bit ones (6,404 B) fit it too,
    // 4-bit ones (10,500 B) do not.
    assert_eq!(code_bits(None, 4096, 1536, 64, 256, 1000).unwrap().0, 2);
    // 768-d: 2-bit records (3,332 + 4,096 + 512 = 7,940 B) still fit.
    assert_eq!(code_bits(None, 4096, 3072, 64, 256, 1000).unwrap().0, 2);
    // 960-d: 2-bit ones (8,708 B) do not.
    assert_eq!(code_bits(None, 4096, 3840, 64, 256, 1000).unwrap().0, 1);
    // 128-d, p 128: 1-bit 2,308 B and 2-bit 3,332 B share a 4 KiB page.
    assert_eq!(code_bits(None, 4096, 512, 64, 128, 1000).unwrap().0, 2);
    assert_eq!(code_bits(Some(4), 4096, 512, 64, 128, 1000).unwrap().0, 4);
    assert!(code_bits(Some(3), 4096, 512, 64, 128, 1000).is_err());
}

#[test]
fn code_shapes_keep_the_rules_blocks() {
    use crate::format::PageGeometry;
    use crate::planner::rules::code_shapes;
    let same_block = |vec_bytes: usize, shapes: &[(usize, usize)]| {
        let g0 =
            PageGeometry::with_codes(4096, vec_bytes, 64, shapes[0].0, shapes[0].1, 1000).unwrap();
        for (i, &(p, b)) in shapes.iter().enumerate() {
            let g = PageGeometry::with_codes(4096, vec_bytes, 64, p, b, 1000).unwrap();
            assert_eq!(
                (g.block_size, g.records_per_block),
                (g0.block_size, g0.records_per_block),
                "{p}×{b}"
            );
            // Past the rule's shape, each is the widest of its bits: one
            // more step of dimensions would not fit.
            if i > 0 && p + 32 <= vec_bytes / 4 {
                let g = PageGeometry::with_codes(4096, vec_bytes, 64, p + 32, b, 1000).unwrap();
                assert!(g.block_size > g0.block_size, "{p}×{b} is not the widest");
            }
        }
    };
    // 768-d: the rule's 256 × 2 bits, 512 × 1 bit and 128 × 4 bits all
    // make 8 KiB records (the 768-d synthetic set routed better at 512 × 1).
    let s = code_shapes(4096, 3072, 64, 768, 1000, (256, 2)).unwrap();
    assert_eq!(s, vec![(256, 2), (512, 1), (128, 4)]);
    same_block(3072, &s);
    // 384-d: every dimension at 1 bit.
    let s = code_shapes(4096, 1536, 64, 384, 1000, (256, 2)).unwrap();
    assert_eq!(s, vec![(256, 2), (384, 1), (352, 2), (160, 4)]);
    same_block(1536, &s);
    // 960-d: 1-bit records of 256 dimensions take 8 KiB; 416 fit it.
    let s = code_shapes(4096, 3840, 64, 960, 1000, (256, 1)).unwrap();
    assert_eq!(s[..2], [(256, 1), (416, 1)]);
    same_block(3840, &s);
}

#[test]
fn the_rules_shape_is_kept_unless_another_ranks_clearly_better() {
    use crate::build::codes::choose_shape;
    use crate::format::CodeTrial;
    let t = |p, bits, recall| CodeTrial {
        principal_dims: p,
        bits,
        recall,
        k: 10,
    };
    assert_eq!(choose_shape(&[], 0.01), (0, 0));
    assert_eq!(choose_shape(&[t(256, 2, 0.80)], 0.01), (256, 2));
    // Within the margin: the rule's.
    assert_eq!(
        choose_shape(&[t(256, 2, 0.80), t(512, 1, 0.805)], 0.01),
        (256, 2)
    );
    // Clearly better: the best of those.
    assert_eq!(
        choose_shape(&[t(256, 2, 0.80), t(512, 1, 0.86), t(128, 4, 0.83)], 0.01),
        (512, 1)
    );
    assert_eq!(
        choose_shape(&[t(256, 2, 0.90), t(512, 1, 0.70), t(128, 4, 0.60)], 0.01),
        (256, 2)
    );
}

/// With neither principal_dims nor code_bits given, the build scores the
/// shapes that fit the rule's blocks on a sample, records the trials and
/// keeps the one `choose_shape` picks; the index it writes is that shape's.
#[test]
fn the_build_chooses_the_code_shape_on_a_sample() {
    const D: usize = 256;
    let n = 3000;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let data = clustered(n, D, 3);
    let o = BuildOptions {
        preset: PresetChoice::Named(Preset::Alayalaser),
        r: Some(32),
        build_l: Some(64),
        threads: Some(2),
        entry_clusters: Some(30),
        ..Default::default()
    };
    let plan = crate::planner::plan_build(
        &o,
        &crate::planner::DataFacts {
            n,
            dim: D,
            dtype: crate::elem::DType::F32,
        },
    )
    .unwrap();
    let sel = plan
        .plan
        .code_selection
        .clone()
        .expect("a choice of shapes");
    assert_eq!(
        sel.candidates[0],
        (plan.plan.code_dims, plan.plan.code_bits)
    );
    assert!(plan.decisions.iter().any(|d| d.what == "code_shape"));
    let m = build(
        Matrix::from_vec(data.clone(), n, D).unwrap(),
        &dir,
        &o,
        &|_, _, _| {},
        &AtomicBool::new(false),
    )
    .unwrap();
    let trials = &m.build_stats.code_trials;
    assert_eq!(
        trials
            .iter()
            .map(|t| (t.principal_dims, t.bits))
            .collect::<Vec<_>>(),
        sel.candidates
    );
    assert!(trials.iter().all(|t| t.recall > 0.0 && t.recall <= 1.0));
    let kept = crate::build::codes::choose_shape(trials, sel.margin);
    let codes = m.layout.codes.unwrap();
    assert_eq!((codes.principal_dims, codes.bits), kept);
    // Same dimensions, more bits: a finer ranking.
    let of = |p: usize, b: usize| {
        trials
            .iter()
            .find(|t| (t.principal_dims, t.bits) == (p, b))
            .map(|t| t.recall)
    };
    if let (Some(one), Some(two)) = (of(D, 1), of(D, 2)) {
        assert!(one < two, "{trials:?}");
    }
    // The index is that shape's and finds the neighbours.
    let idx = Index::open(&dir, &OpenOptions::default()).unwrap();
    let queries = clustered(50, D, 9);
    let nq = 50;
    let out = idx.search(&queries, nq, &SearchOptions::new(10)).unwrap();
    let mut hit = 0;
    for (i, q) in queries.chunks_exact(D).enumerate() {
        let truth = exact_knn(&data, D, q, 10);
        hit += out.ids[i * 10..(i + 1) * 10]
            .iter()
            .filter(|x| truth.contains(x))
            .count();
    }
    let r = hit as f64 / (nq * 10) as f64;
    assert!(r >= 0.9, "recall {r}");
    // Given a shape, the build does not choose.
    let dir2 = tmp.path().join("g");
    let m2 = build(
        Matrix::from_vec(data, n, D).unwrap(),
        &dir2,
        &BuildOptions {
            codes: CodeParams {
                bits: Some(1),
                ..o.codes
            },
            ..o
        },
        &|_, _, _| {},
        &AtomicBool::new(false),
    )
    .unwrap();
    assert!(m2.build_stats.code_trials.is_empty());
    assert_eq!(m2.layout.codes.map(|c| c.bits), Some(1));
}
