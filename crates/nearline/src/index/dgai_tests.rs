//! Tests of the DGAI composition: the decoupled layout (topology records
//! of adjacency lists only, then the vectors in pages of their own), the
//! preset end to end against exact neighbours, vector pages read only by
//! the re-rank, `check` over both kinds of page, damage, and what the
//! layout refuses.

use super::test_data::{build_error, clustered, manifest_of, open_uncached, recall_of};
use super::*;
use crate::format::{LayoutKind, Preset};
use crate::layout::{AnyLayout, IdLayout, RecordReader};
use crate::planner::{PageChoice, PresetChoice};

const N: usize = 4000;
const DIM: usize = 32;

fn opts() -> BuildOptions {
    BuildOptions {
        preset: PresetChoice::Named(Preset::Dgai),
        r: Some(32),
        build_l: Some(64),
        threads: Some(2),
        ..Default::default()
    }
}

fn build_dgai(dir: &Path) -> Vec<f32> {
    let data = clustered(N, DIM, 5);
    let m = Matrix::from_vec(data.clone(), N, DIM).unwrap();
    build(m, dir, &opts(), &|_, _, _| {}, &AtomicBool::new(false)).unwrap();
    data
}

/// `nq` queries from the clusters of the built set.
fn queries(nq: usize) -> Vec<f32> {
    clustered(N + nq, DIM, 5)[N * DIM..].to_vec()
}

#[test]
fn a_decoupled_layout_keeps_lists_and_vectors_apart_and_finds_the_neighbours() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    let data = build_dgai(&dir);
    let m = manifest_of(&dir);
    assert_eq!(m.layout.kind, LayoutKind::Decoupled);
    assert_eq!(m.spec.preset, Preset::Dgai);
    // R 32: a topology record is a degree and 32 ids (132 B), 30 a page;
    // a 32-d float32 vector is 128 B, 31 a vector page.
    assert_eq!(
        (m.layout.record_size, m.layout.records_per_block),
        (132, 30)
    );
    assert_eq!(m.layout.n_blocks, N.div_ceil(30) as u64);
    assert_eq!(m.layout.vector_blocks, N.div_ceil(31) as u64);
    let file = std::fs::metadata(dir.join("pages.bin")).unwrap().len();
    assert_eq!(file, (m.layout.n_blocks + m.layout.vector_blocks) * 4096);
    // Every stored vector is the row it was built from.
    let geo = crate::planner::geometry(&m).unwrap();
    let layout = AnyLayout::Id(IdLayout::new(geo, m.n));
    assert_eq!(layout.kind(), LayoutKind::Decoupled);
    let mut reader = RecordReader::open(&dir.join("pages.bin"), &layout).unwrap();
    for v in [0u32, 1, 30, 31, 62, (N - 1) as u32] {
        let x: Vec<f32> = reader
            .vector(v)
            .unwrap()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(x, data[v as usize * DIM..(v as usize + 1) * DIM], "{v}");
        let rec = reader.record(v).unwrap();
        assert!(rec.vector.is_empty() && !rec.neighbours.is_empty());
    }
    let idx = Index::open(&dir, &OpenOptions::default()).unwrap();
    let report = idx.check_json().unwrap();
    assert_eq!(report["problem_count"], 0, "{report}");
    assert_eq!(report["unreachable"], 0, "{report}");
    let info = idx.info();
    assert_eq!(info["layout"]["records"], "decoupled", "{info}");
    let q = queries(100);
    let o = SearchOptions::new(10);
    let r = recall_of(&idx, &data, DIM, &q, &o);
    assert!(r >= 0.95, "recall {r}");
    // The plan: a two-stage search, the targets of each topology page.
    let s = idx.plan_search(&o, None, 100).unwrap();
    assert!(matches!(s.plan.page, crate::search::PagePlan::Targets));
    assert!(matches!(
        s.plan.refine,
        crate::search::RefinePlan::Rerank { .. }
    ));
    // The build plan says how the pages split.
    let plan = crate::planner::plan_build(
        &opts(),
        &crate::planner::DataFacts {
            n: N,
            dim: DIM,
            dtype: crate::elem::DType::F32,
        },
    )
    .unwrap();
    let d = plan
        .decisions
        .iter()
        .find(|d| d.what == "decoupled")
        .expect("decoupled decision");
    assert!(
        d.value.contains("30 lists") && d.value.contains("31 vectors"),
        "{}",
        d.value
    );
}

#[test]
fn every_exact_distance_comes_from_a_vector_page() {
    // Without a cache the traversal reads topology pages only: no exact
    // distance is computed before the re-rank, which reads each vector
    // it scores from a vector page.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    build_dgai(&dir);
    let idx = open_uncached(&dir);
    let o = SearchOptions {
        l: Some(40),
        ..SearchOptions::new(10)
    };
    let out = idx.search(&queries(50), 50, &o).unwrap();
    for s in &out.stats {
        assert!(s.refine_reads > 0 && s.reads > s.refine_reads, "{s:?}");
        assert_eq!(s.exact_distances, s.refined, "{s:?}");
        // At most refine_ratio (0.4) of L is re-ranked.
        assert!(s.refined as usize <= 16, "{s:?}");
    }
    // A smaller refine ratio reads fewer vector pages.
    let few = SearchOptions {
        refine_ratio: Some(0.25),
        ..o
    };
    let out2 = idx.search(&queries(50), 50, &few).unwrap();
    let reads = |o: &SearchOutput| -> u32 { o.stats.iter().map(|s| s.refine_reads).sum() };
    assert!(
        reads(&out2) < reads(&out),
        "{} {}",
        reads(&out2),
        reads(&out)
    );
}

#[test]
fn decoupled_layouts_refuse_what_does_not_apply() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    build_dgai(&dir);
    let idx = Index::open(&dir, &OpenOptions::default()).unwrap();
    let o = SearchOptions {
        page_search: PageChoice::Block,
        ..SearchOptions::new(10)
    };
    let e = idx.search(&queries(5), 5, &o).unwrap_err().to_string();
    assert!(e.contains("decoupled layout"), "{e}");
    // In place: refused with the reason; out of place is what it takes.
    let e = build_error(
        &clustered(300, DIM, 3),
        DIM,
        &tmp.path().join("u"),
        &BuildOptions {
            update: Some(crate::format::UpdateMode::InPlace),
            ..opts()
        },
    );
    assert!(e.contains("decoupled") && e.contains("out of place"), "{e}");
    // Shuffled topology pages are not built.
    let e = crate::format::LayoutKind::new(
        crate::format::Placement::Shuffled,
        crate::format::RecordFormat::Decoupled,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("ID order"), "{e}");
}

#[test]
fn damage_to_a_decoupled_page_file_is_detected() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    let data = build_dgai(&dir);
    let m = manifest_of(&dir);
    let pages = dir.join("pages.bin");
    let good = std::fs::read(&pages).unwrap();
    // A flipped byte in the vector page holding node 0's vector: check
    // names the vector block, and a search that re-ranks node 0 refuses.
    let b = m.layout.n_blocks as usize;
    let mut bad = good.clone();
    bad[b * 4096 + crate::format::PAGE_HEADER_BYTES + 8] ^= 0x10;
    std::fs::write(&pages, &bad).unwrap();
    let idx = open_uncached(&dir);
    let report = idx.check_json().unwrap();
    assert_eq!(report["problem_count"], 1, "{report}");
    assert!(
        report["problems"][0]
            .as_str()
            .unwrap()
            .contains(&format!("vector block {b}")),
        "{report}"
    );
    let e = idx
        .search(&data[..DIM], 1, &SearchOptions::new(10))
        .unwrap_err()
        .to_string();
    assert!(e.contains("CRC32C") || e.contains("corrupt"), "{e}");
    drop(idx);
    // A vector page moved to another place claims the wrong number.
    let mut moved = good.clone();
    moved.copy_within(b * 4096..(b + 1) * 4096, (b + 1) * 4096);
    std::fs::write(&pages, &moved).unwrap();
    let report = open_uncached(&dir).check_json().unwrap();
    assert!(
        report["problems"]
            .to_string()
            .contains("claims to be block"),
        "{report}"
    );
    // A file cut by its last vector page is refused at open.
    std::fs::write(&pages, &good[..good.len() - 4096]).unwrap();
    let e = Index::open(&dir, &OpenOptions::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("truncated"), "{e}");
    std::fs::write(&pages, &good).unwrap();
    // A manifest whose vector pages disagree with its geometry is corrupt.
    let mut man = manifest_of(&dir);
    man.layout.vector_blocks += 1;
    crate::io::files::write_manifest(&dir, &man).unwrap();
    let e = Index::open(&dir, &OpenOptions::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("vector blocks"), "{e}");
}
