//! Tests of the PageANN composition: the page-graph layout (records
//! grouped into pages, the graph over pages), the preset end to end
//! against exact neighbours, a page read used whole, `check` over pages,
//! damage, and what the layout refuses.

use super::test_data::{build_error, clustered, manifest_of, open_uncached, recall_of};
use super::*;
use crate::format::{LayoutKind, Placement, Preset, Section};
use crate::planner::{PageChoice, PresetChoice};

const N: usize = 4000;
const DIM: usize = 32;

fn opts(preset: Preset) -> BuildOptions {
    BuildOptions {
        preset: PresetChoice::Named(preset),
        r: Some(32),
        build_l: Some(64),
        threads: Some(2),
        ..Default::default()
    }
}

fn build_with(dir: &Path, o: &BuildOptions) -> Vec<f32> {
    let data = clustered(N, DIM, 3);
    let m = Matrix::from_vec(data.clone(), N, DIM).unwrap();
    build(m, dir, o, &|_, _, _| {}, &AtomicBool::new(false)).unwrap();
    data
}

/// `nq` queries from the clusters of the built set.
fn queries(nq: usize) -> Vec<f32> {
    clustered(N + nq, DIM, 3)[N * DIM..].to_vec()
}

#[test]
fn a_page_graph_packs_more_records_and_finds_the_neighbours() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    let data = build_with(&dir, &opts(Preset::Pageann));
    let m = manifest_of(&dir);
    assert_eq!(m.layout.kind, LayoutKind::PAGE_GRAPH);
    assert_eq!(m.spec.preset, Preset::Pageann);
    assert!(m.has(Section::IdToLocation));
    // 32-d float32 at R 32: plain records (260 B) fit 15 a page; the page
    // graph's hold 2 edges each and fit 29, 58 edges a page (30 would
    // leave 1 each, 30 < R).
    assert_eq!((m.layout.records_per_block, m.layout.max_degree), (29, 2));
    let pg = m.layout.page_graph.expect("page graph summary");
    assert_eq!(pg.page_degree, 58);
    assert!(pg.max_degree <= 58 && pg.mean_degree >= 8.0, "{pg:?}");
    assert!(pg.mean_candidates >= 8.0 && pg.back_edges > 0, "{pg:?}");
    // Every record's edges leave its page, and no page leads twice to one.
    let idx = Index::open(&dir, &OpenOptions::default()).unwrap();
    let report = idx.check_json().unwrap();
    assert_eq!(report["problem_count"], 0, "{report}");
    assert_eq!(report["unreachable"], 0, "{report}");
    let info = idx.info();
    assert_eq!(info["layout"]["placement"], "page_graph", "{info}");
    assert_eq!(info["layout"]["records"], "plain", "{info}");
    let q = queries(100);
    let o = SearchOptions::new(10);
    let r = recall_of(&idx, &data, DIM, &q, &o);
    assert!(r >= 0.95, "recall {r}");
    // The plan: block search at sigma 1 (a page is one node).
    let s = idx.plan_search(&o, None, 100).unwrap();
    assert!(matches!(
        s.plan.page,
        crate::search::PagePlan::Block { sigma } if sigma == 1.0
    ));
    let geo = crate::planner::geometry(&m).unwrap();
    let layout = crate::layout::ShuffledLayout::from_section(
        &dir.join("id_to_location.bin"),
        &std::fs::read(dir.join("id_to_location.bin")).unwrap(),
        geo,
        m.n,
        Placement::PageGraph,
    )
    .unwrap();
    let any = crate::layout::AnyLayout::Shuffled(layout.clone());
    let mut reader = crate::layout::RecordReader::open(&dir.join("pages.bin"), &any).unwrap();
    let mut mates = Vec::new();
    for b in 0..geo.n_blocks {
        mates.clear();
        crate::layout::Layout::block_nodes(&layout, b, &mut mates);
        let mut to = Vec::new();
        for &v in &mates {
            for &u in reader.record(v).unwrap().neighbours {
                let pb = crate::layout::Layout::locate(&layout, u).0;
                assert_ne!(pb, b, "node {v} leads into its own page");
                to.push(pb);
            }
        }
        let k = to.len();
        to.sort_unstable();
        to.dedup();
        assert_eq!(k, to.len(), "page {b} leads twice to one page");
    }
}

#[test]
fn a_page_read_is_one_node() {
    // Every record of a page read is used (an exact distance, its share of
    // the page's edges expanded): with no cache, the records used are the
    // records read.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    build_with(&dir, &opts(Preset::Pageann));
    let idx = open_uncached(&dir);
    let o = SearchOptions {
        l: Some(40),
        ..SearchOptions::new(10)
    };
    let out = idx.search(&queries(50), 50, &o).unwrap();
    for s in &out.stats {
        assert!(s.reads > 0);
        assert_eq!(s.used_records, s.page_records, "{s:?}");
    }
}

#[test]
fn page_graphs_refuse_what_does_not_apply() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    let data = build_with(&dir, &opts(Preset::Pageann));
    let idx = Index::open(&dir, &OpenOptions::default()).unwrap();
    let q = queries(5);
    for page_search in [PageChoice::Targets, PageChoice::Replicas] {
        let o = SearchOptions {
            page_search,
            ..SearchOptions::new(10)
        };
        let e = idx.search(&q, 5, &o).unwrap_err().to_string();
        assert!(e.contains("page_graph layout"), "{e}");
    }
    let o = SearchOptions {
        sigma: Some(0.5),
        ..SearchOptions::new(10)
    };
    let e = idx.search(&q, 5, &o).unwrap_err().to_string();
    assert!(e.contains("sigma=0.5") && e.contains("page_graph"), "{e}");
    // Updates: refused with the reason, and nothing changes.
    let e = idx.insert(&data[..DIM], None).unwrap_err().to_string();
    assert!(
        e.contains("takes no updates") && e.contains("static"),
        "{e}"
    );
    let e = idx.delete(&[0]).unwrap_err().to_string();
    assert!(e.contains("takes no updates"), "{e}");
    assert_eq!(idx.check_json().unwrap()["problem_count"], 0);
    let small = clustered(300, DIM, 3);
    for update in [
        crate::format::UpdateMode::InPlace,
        crate::format::UpdateMode::OutOfPlace,
    ] {
        let e = build_error(
            &small,
            DIM,
            &tmp.path().join("u"),
            &BuildOptions {
                update: Some(update),
                ..opts(Preset::Pageann)
            },
        );
        assert!(
            e.contains("not possible") && e.contains("page_graph"),
            "{e}"
        );
    }
}

#[test]
fn damage_to_a_page_graph_is_detected() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    build_with(&dir, &opts(Preset::Pageann));
    // A flipped byte in a page fails its checksum: check reports it and a
    // search that reads it refuses.
    let pages = dir.join("pages.bin");
    let good = std::fs::read(&pages).unwrap();
    let mut bad = good.clone();
    bad[crate::format::PAGE_HEADER_BYTES + 40] ^= 0x08;
    std::fs::write(&pages, &bad).unwrap();
    let idx = open_uncached(&dir);
    let report = idx.check_json().unwrap();
    assert!(report["problem_count"].as_u64().unwrap() >= 1, "{report}");
    drop(idx);
    std::fs::write(&pages, &good).unwrap();
    // A truncated location map is refused at open with the file named.
    let map = dir.join("id_to_location.bin");
    let m = std::fs::read(&map).unwrap();
    std::fs::write(&map, &m[..m.len() - 3]).unwrap();
    let e = Index::open(&dir, &OpenOptions::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("id_to_location"), "{e}");
    std::fs::write(&map, &m).unwrap();
    // A manifest naming the page graph without its map is corrupt.
    let mut man = manifest_of(&dir);
    man.sections.remove(&Section::IdToLocation);
    crate::io::files::write_manifest(&dir, &man).unwrap();
    let e = Index::open(&dir, &OpenOptions::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("page_graph layout needs"), "{e}");
}
