//! Tests of building and opening indexes: determinism, cancellation, the
//! entry structures, the memory budget's split and its promise, the
//! manifest's integrity, and indexes written by earlier versions.

use super::test_data::clustered;
use super::*;
use crate::elem::DType;
use crate::format::{PageGeometry, Preset, Section, MANIFEST_FILE};
use crate::io::{FakeOptions, IoEngine};
use crate::planner::{EntryChoice, PresetChoice};
use crate::search::{search_one, QueryStats, Scratch, SearchPlan};
use crate::util::Budget;
use std::sync::Arc;

/// A budget the small test indexes never reach.
const ROOMY: Budget = Budget::Bytes(256 << 20);

fn never() -> AtomicBool {
    AtomicBool::new(false)
}

fn build_small(dir: &Path, opts: &BuildOptions) -> (Manifest, Vec<f32>) {
    let data = clustered(2000, 16, 1);
    let m = Matrix::from_vec(data.clone(), 2000, 16).unwrap();
    let man = build(m, dir, opts, &|_, _, _| {}, &never()).unwrap();
    (man, data)
}

/// The DiskANN composition (tests set what they test on top of it).
fn small_opts() -> BuildOptions {
    BuildOptions {
        preset: PresetChoice::Named(Preset::Diskann),
        r: Some(16),
        build_l: Some(40),
        pq_bytes: Some(8),
        threads: Some(2),
        memory_budget: Some(ROOMY),
        ..Default::default()
    }
}

fn open_with(dir: &Path, opts: OpenOptions) -> Result<Index> {
    Index::open(
        dir,
        &OpenOptions {
            memory_budget: opts.memory_budget.or(Some(ROOMY)),
            ..opts
        },
    )
}

fn small_index(dir: &Path) -> (Index, Vec<f32>) {
    let (_, data) = build_small(dir, &small_opts());
    let idx = open_with(
        dir,
        OpenOptions {
            cache_nodes: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    (idx, data)
}

fn pages(idx: &Index) -> Arc<Vec<u8>> {
    let gref_d = idx.graph().unwrap();
    let d = gref_d.data_f32().unwrap();
    Arc::new(std::fs::read(&d.pages_path).unwrap())
}

#[test]
fn out_of_order_delayed_completions_give_the_same_results() {
    let tmp = tempfile::tempdir().unwrap();
    let (idx, _) = small_index(&tmp.path().join("i"));
    let gref_d = idx.graph().unwrap();
    let d = gref_d.data_f32().unwrap();
    let pages = pages(&idx);
    let queries = clustered(30, 16, 9);
    let p = SearchPlan::beam(10, 60, 8);
    let mut real = Scratch::new(d).unwrap();
    for seed in 0..4 {
        let fake = IoEngine::fake(
            pages.clone(),
            FakeOptions {
                seed,
                max_delay_polls: 3,
                ..Default::default()
            },
        );
        let mut s = Scratch::with_engine(d, fake);
        for q in queries.chunks_exact(16) {
            let (mut a, mut b) = (QueryStats::default(), QueryStats::default());
            search_one(d, &mut real, q, &p, &mut a).unwrap();
            search_one(d, &mut s, q, &p, &mut b).unwrap();
            assert_eq!(real.results, s.results);
            assert_eq!(a.reads, b.reads);
            assert_eq!(s.in_flight(), 0);
        }
    }
}

#[test]
fn failed_reads_are_errors_and_leave_nothing_in_flight() {
    let tmp = tempfile::tempdir().unwrap();
    let (idx, _) = small_index(&tmp.path().join("i"));
    let gref_d = idx.graph().unwrap();
    let d = gref_d.data_f32().unwrap();
    let pages = pages(&idx);
    let fake = IoEngine::fake(
        pages.clone(),
        FakeOptions {
            seed: 1,
            max_delay_polls: 2,
            fail_probability: 0.2,
            ..Default::default()
        },
    );
    let mut s = Scratch::with_engine(d, fake);
    let p = SearchPlan::beam(10, 60, 8);
    let mut errors = 0;
    for q in clustered(20, 16, 4).chunks_exact(16) {
        let mut st = QueryStats::default();
        if search_one(d, &mut s, q, &p, &mut st).is_err() {
            errors += 1;
        }
        assert_eq!(s.in_flight(), 0, "a failed query must drain its reads");
    }
    assert!(errors > 0);
    // A truncated "file": reads past its end are short and must be refused.
    let short = Arc::new(pages[..pages.len() / 2].to_vec());
    let mut s = Scratch::with_engine(d, IoEngine::fake(short, FakeOptions::default()));
    let mut failed = false;
    for q in clustered(20, 16, 5).chunks_exact(16) {
        let mut st = QueryStats::default();
        if let Err(err) = search_one(d, &mut s, q, &p, &mut st) {
            assert!(err.to_string().contains("truncated"), "{err}");
            failed = true;
        }
    }
    assert!(failed);
}

#[test]
fn build_is_deterministic_for_a_seed() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, _) = small_index(&tmp.path().join("a"));
    let (b, _) = small_index(&tmp.path().join("b"));
    let pa = std::fs::read(tmp.path().join("a/pages.bin")).unwrap();
    let pb = std::fs::read(tmp.path().join("b/pages.bin")).unwrap();
    assert!(
        pa == pb,
        "same seed and threads must give the same page file"
    );
    assert_eq!(a.manifest().unwrap().medoid, b.manifest().unwrap().medoid);
}

#[test]
fn cancelled_build_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let m = Matrix::from_vec(clustered(500, 8, 2), 500, 8).unwrap();
    let cancel = AtomicBool::new(true);
    let r = build(
        m,
        &dir,
        &BuildOptions {
            r: Some(8),
            build_l: Some(16),
            pq_bytes: Some(4),
            ..Default::default()
        },
        &|_, _, _| {},
        &cancel,
    );
    assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

/// A build cancelled as a stage starts (the flag set from the progress
/// callback) stops inside that stage, before its first step completes and
/// before any later stage reports, and leaves nothing behind: PQ training,
/// the graph, the block shuffle, the page file, the navigation graph and the
/// centroid entries each check the flag.
#[test]
fn cancel_stops_every_build_stage_before_the_next() {
    let tmp = tempfile::tempdir().unwrap();
    let (n, dim) = (3000, 8);
    let data = clustered(n, dim, 4);
    let order = ["pq", "graph", "shuffle", "layout", "nav", "centroids"];
    for (i, stage) in order.iter().enumerate() {
        let dir = tmp.path().join("c");
        let cancel = AtomicBool::new(false);
        let seen = std::sync::Mutex::new(Vec::<(String, u64)>::new());
        let r = build(
            Matrix::from_vec(data.clone(), n, dim).unwrap(),
            &dir,
            &BuildOptions {
                r: Some(8),
                build_l: Some(16),
                pq_bytes: Some(4),
                threads: Some(2),
                layout: Some(crate::layout::LayoutKind::SHUFFLED),
                nav_sample: Some(0.05),
                entry_clusters: Some(8),
                memory_budget: Some(ROOMY),
                ..Default::default()
            },
            &|s, d, _| {
                seen.lock().unwrap().push((s.to_string(), d));
                if s == *stage {
                    cancel.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            },
            &cancel,
        );
        assert!(matches!(r, Err(Error::Cancelled)), "{stage}: {r:?}");
        let seen = seen.into_inner().unwrap();
        assert!(seen.iter().any(|(s, _)| s == stage), "{stage} never began");
        for (s, d) in &seen {
            assert!(!order[i + 1..].contains(&s.as_str()), "{stage}: {s} began");
            if s == stage {
                assert_eq!(*d, 0, "{stage} went on after the flag was set");
            }
        }
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }
}

/// Finite values whose squares overflow float32 distances (1e38) are
/// refused: at build naming the row, at search naming the query; both say
/// to scale the data. Just inside the limit they build and search, with
/// finite distances.
#[test]
fn vectors_beyond_float32_distances_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (n, dim) = (2000, 8);
    let mut data = clustered(n, dim, 9);
    data[1234 * dim + 5] = 1e38;
    let opts = BuildOptions {
        r: Some(8),
        build_l: Some(16),
        pq_bytes: Some(4),
        memory_budget: Some(ROOMY),
        ..Default::default()
    };
    let m = Matrix::from_vec(data.clone(), n, dim).unwrap();
    let e = build(m, &tmp.path().join("a"), &opts, &|_, _, _| {}, &never())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("row 1234 has squared norm 1.000e76") && e.contains("scale the data"),
        "{e}"
    );
    // Large but within f32::MAX / 4 once squared and summed: accepted.
    data[1234 * dim + 5] = 9e18;
    let m = Matrix::from_vec(data.clone(), n, dim).unwrap();
    build(m, &tmp.path().join("b"), &opts, &|_, _, _| {}, &never()).unwrap();
    let idx = Index::open(
        &tmp.path().join("b"),
        &OpenOptions {
            memory_budget: Some(ROOMY),
            ..Default::default()
        },
    )
    .unwrap();
    let mut q = data[..3 * dim].to_vec();
    let out = idx.search(&q, 3, &SearchOptions::new(5)).unwrap();
    assert!(out.distances.iter().all(|d| d.is_finite()));
    q[2 * dim + 1] = -2e19;
    let e = idx
        .search(&q, 3, &SearchOptions::new(5))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("query 2 has squared norm") && e.contains("scale the data"),
        "{e}"
    );
    q[2 * dim + 1] = f32::NAN;
    let e = idx
        .search(&q, 3, &SearchOptions::new(5))
        .unwrap_err()
        .to_string();
    assert!(e.contains("query 2: value at column 1 is NaN"), "{e}");
}

#[test]
fn saturation_fills_lists_towards_r() {
    let tmp = tempfile::tempdir().unwrap();
    let mut degrees = Vec::new();
    for saturate in [false, true] {
        let (man, _) = build_small(
            &tmp.path().join(format!("s{saturate}")),
            &BuildOptions {
                saturate: Some(saturate),
                ..small_opts()
            },
        );
        assert_eq!(man.spec.saturate, saturate);
        degrees.push(man.build_stats.mean_degree);
    }
    assert!(degrees[1] > degrees[0], "{degrees:?}");
    assert!(degrees[1] >= 0.9 * 16.0, "{degrees:?}");
}

fn entry_index(dir: &Path, nav_sample: f64, entry_clusters: usize) -> Vec<f32> {
    let (man, data) = build_small(
        dir,
        &BuildOptions {
            nav_sample: Some(nav_sample),
            entry_clusters: Some(entry_clusters),
            ..small_opts()
        },
    );
    assert_eq!(man.spec.nav_sample, nav_sample);
    assert_eq!(man.spec.entry_clusters, entry_clusters);
    assert_eq!(man.has(Section::NavGraph), nav_sample > 0.0);
    assert_eq!(man.has(Section::EntryCentroids), entry_clusters > 0);
    data
}

fn open_entry(dir: &Path, entry: EntryChoice) -> Result<Index> {
    open_with(
        dir,
        OpenOptions {
            entry,
            entry_points: if entry == EntryChoice::Sampled { 64 } else { 0 },
            cache_nodes: Some(0),
            ..Default::default()
        },
    )
}

#[test]
fn every_entry_kind_is_exact_at_full_list_size() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("e");
    let data = entry_index(&dir, 0.02, 30);
    let queries = clustered(20, 16, 77);
    let k = 10;
    let exact: Vec<u32> = queries
        .chunks_exact(16)
        .flat_map(|q| {
            crate::graph::vamana::tests::brute_topk(2000, k, |i| {
                Metric::L2.distance(q, &data[i as usize * 16..(i as usize + 1) * 16])
            })
        })
        .collect();
    let opts = SearchOptions {
        l: Some(2000),
        w: Some(8),
        threads: Some(2),
        ..SearchOptions::new(k)
    };
    for (kind, want) in [
        (EntryChoice::Auto, "nav"),
        (EntryChoice::Medoid, "medoid"),
        (EntryChoice::Sampled, "sampled"),
        (EntryChoice::Nav, "nav"),
        (EntryChoice::Centroids, "centroids"),
    ] {
        let idx = open_entry(&dir, kind).unwrap();
        assert_eq!(idx.entry().unwrap().name(), want);
        assert_eq!(idx.info()["entry"]["kind"], want);
        let out = idx.search(&queries, 20, &opts).unwrap();
        let got: Vec<u32> = out.ids.iter().map(|&i| i as u32).collect();
        assert_eq!(got, exact, "entry {kind}");
    }
}

#[test]
fn entry_structures_are_counted_in_the_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    entry_index(&dir, 0.05, 40);
    let open = |entry, budget: u64| {
        Index::open(
            &dir,
            &OpenOptions {
                entry,
                memory_budget: Some(Budget::Bytes(budget)),
                threads: Some(1),
                ..Default::default()
            },
        )
    };
    // A budget that caches about half the nodes.
    let probe = open(EntryChoice::Nav, 64 << 20).unwrap();
    let budget = probe.open_plan().unwrap().memory.minimum + 150_000;
    let plain = open(EntryChoice::Medoid, budget).unwrap();
    let nav = open(EntryChoice::Nav, budget).unwrap();
    let cen = open(EntryChoice::Centroids, budget).unwrap();
    let (pm, nm, cm) = (
        plain.memory().unwrap(),
        nav.memory().unwrap(),
        cen.memory().unwrap(),
    );
    assert_eq!(pm.entry, 0);
    // 100 sample nodes: ids, 16-d f32 vectors and R = 42 adjacency.
    assert!(nm.entry >= 100 * (4 + 64 + 4 * 32), "{nm:?}");
    assert!(cm.entry >= 40 * (4 + 64), "{cm:?}");
    // What the entry points hold comes out of the node cache.
    assert!(nm.cache_nodes < pm.cache_nodes, "{nm:?} vs {pm:?}");
    assert!(cm.cache_nodes < pm.cache_nodes, "{cm:?} vs {pm:?}");
    for idx in [&plain, &nav, &cen] {
        // The planned split is what the index holds.
        let plan = &idx.open_plan().unwrap().memory;
        let held = idx.memory().unwrap();
        assert_eq!(
            (held.pq_codes, held.pq_codebook, held.entry, held.cache),
            (plan.pq_codes, plan.pq_codebook, plan.entry, plan.cache),
            "{plan:?} vs {held:?}"
        );
        assert!(plan.fixed() + plan.cache <= budget, "{plan:?}");
        assert_eq!(idx.info()["memory"]["within_budget"], true);
    }
    // Budgets below what the structures need are refused with the minimum.
    let min = nav.open_plan().unwrap().memory.minimum;
    let e = open(EntryChoice::Nav, min - 1).err().unwrap().to_string();
    assert!(
        e.contains(&min.to_string()) && e.contains("at least"),
        "{e}"
    );
    open(EntryChoice::Nav, min).unwrap();
    let info = nav.info();
    assert_eq!(info["memory"]["entry"], nm.entry);
    assert_eq!(info["entry"]["nav_nodes"], 100);
    assert_eq!(info["entry"]["nav_L"], 32);
    assert_eq!(info["entry"]["nav_seeds"], 1);
    assert_eq!(info["build"]["nav_sample"], 0.05);
    assert_eq!(info["build"]["entry_clusters"], 40);
}

#[test]
fn nav_sections_are_deterministic_and_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    entry_index(&a, 0.03, 20);
    entry_index(&b, 0.03, 20);
    for f in ["nav_graph.bin", "entry_centroids.bin"] {
        assert!(
            std::fs::read(a.join(f)).unwrap() == std::fs::read(b.join(f)).unwrap(),
            "{f}: same seed, same section"
        );
    }
    // A flipped byte fails the manifest's section checksum.
    let mut nav = std::fs::read(a.join("nav_graph.bin")).unwrap();
    nav[40] ^= 1;
    std::fs::write(a.join("nav_graph.bin"), &nav).unwrap();
    let e = open_entry(&a, EntryChoice::Nav).err().unwrap();
    assert!(
        matches!(e, Error::Corrupt { .. }) && e.to_string().contains("CRC32C"),
        "{e}"
    );
    // Other entry kinds do not read the section.
    open_entry(&a, EntryChoice::Medoid).unwrap();
    // A truncated section, with the manifest's size and checksums made to
    // agree, fails the structural check.
    nav[40] ^= 1;
    let cut = &nav[..nav.len() - 10];
    std::fs::write(a.join("nav_graph.bin"), cut).unwrap();
    let e = open_entry(&a, EntryChoice::Nav).err().unwrap();
    assert!(e.to_string().contains("truncated"), "{e}");
    let mut man = read_manifest(&a).unwrap();
    let s = man.sections.get_mut(&Section::NavGraph).unwrap();
    s.bytes = cut.len() as u64;
    s.crc32c = Some(crc32c::crc32c(cut));
    crate::io::files::write_manifest(&a, &man).unwrap();
    let e = open_entry(&a, EntryChoice::Nav).err().unwrap();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains("navigation graph"), "{e}");
    // Centroid section damage.
    let mut c = std::fs::read(b.join("entry_centroids.bin")).unwrap();
    c[30] ^= 4;
    std::fs::write(b.join("entry_centroids.bin"), &c).unwrap();
    let e = open_entry(&b, EntryChoice::Centroids).err().unwrap();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    // A missing section file is an I/O error naming it.
    std::fs::remove_file(b.join("nav_graph.bin")).unwrap();
    let e = open_entry(&b, EntryChoice::Auto).err().unwrap();
    assert!(e.to_string().contains("nav_graph.bin"), "{e}");
}

#[test]
fn entry_arguments_are_checked() {
    let tmp = tempfile::tempdir().unwrap();
    for (nav_sample, entry_clusters, needle) in [
        (-0.1, 0, "nav_sample"),
        (0.9, 0, "nav_sample"),
        (f64::NAN, 0, "nav_sample"),
        (0.0, 101, "entry_clusters"),
    ] {
        let m = Matrix::from_vec(clustered(100, 4, 3), 100, 4).unwrap();
        let opts = BuildOptions {
            nav_sample: Some(nav_sample),
            entry_clusters: Some(entry_clusters),
            pq_bytes: Some(2),
            ..Default::default()
        };
        let e = build(m, &tmp.path().join("x"), &opts, &|_, _, _| {}, &never()).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert!(e.to_string().contains(needle), "{e}");
    }
    let dir = tmp.path().join("plain");
    entry_index(&dir, 0.0, 0);
    let e = open_entry(&dir, EntryChoice::Nav).err().unwrap();
    assert!(e.to_string().contains("nav_sample"), "{e}");
    let e = open_entry(&dir, EntryChoice::Centroids).err().unwrap();
    assert!(e.to_string().contains("entry_clusters"), "{e}");
    assert_eq!(
        open_entry(&dir, EntryChoice::Auto)
            .unwrap()
            .entry()
            .unwrap()
            .name(),
        "medoid"
    );
    for (l, s) in [(0, 1), (8, 0), (8, 9), (4097, 4)] {
        let e = open_with(
            &dir,
            OpenOptions {
                nav_l: Some(l),
                nav_seeds: Some(s),
                ..Default::default()
            },
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("nav_"), "{e}");
    }
}

/// Edits a manifest's JSON and rewrites it with a valid checksum (what a
/// different version of nearline could have written).
fn rewrite_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join(MANIFEST_FILE);
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    let o = v.as_object_mut().unwrap();
    o.remove("checksum");
    let c = format!("crc32c:{:08x}", crc32c::crc32c(v.to_string().as_bytes()));
    v.as_object_mut()
        .unwrap()
        .insert("checksum".into(), c.into());
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

#[test]
fn any_edit_of_the_manifest_is_corruption() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    build_small(&dir, &small_opts());
    let path = dir.join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    // The metric changed by hand: the index must not open with other
    // semantics.
    for (from, to) in [
        ("\"metric\": \"l2\"", "\"metric\": \"ip\""),
        ("\"medoid\": ", "\"medoid\": 1"),
        ("\"pq_bytes\": 8", "\"pq_bytes\": 4"),
    ] {
        assert!(text.contains(from), "{from}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        let e = open_with(&dir, OpenOptions::default()).err().unwrap();
        assert!(matches!(e, Error::Corrupt { .. }), "{from}: {e}");
        assert!(e.to_string().contains("checksum"), "{e}");
    }
    // Whitespace is not content.
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    std::fs::write(&path, v.to_string()).unwrap();
    open_with(&dir, OpenOptions::default()).unwrap();
    // A 1.3 manifest without its checksum is damaged.
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v.as_object_mut().unwrap().remove("checksum");
    std::fs::write(&path, v.to_string()).unwrap();
    let e = open_with(&dir, OpenOptions::default()).err().unwrap();
    assert!(e.to_string().contains("checksum"), "{e}");
}

#[test]
fn names_of_a_newer_version_are_refused_not_guessed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    build_small(&dir, &small_opts());
    let original = std::fs::read_to_string(dir.join(MANIFEST_FILE)).unwrap();
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit); 4] = [
        ("preset", |v| v["spec"]["preset"] = "odinann".into()),
        ("layout", |v| v["layout"]["kind"] = "inline_codes".into()),
        ("index kind", |v| v["kind"] = "mutable_graph".into()),
        ("section", |v| {
            let pages = v["sections"]["pages"].clone();
            v["sections"]
                .as_object_mut()
                .unwrap()
                .insert("neighbour_codes".into(), pages);
        }),
    ];
    for (what, edit) in cases {
        std::fs::write(dir.join(MANIFEST_FILE), &original).unwrap();
        rewrite_manifest(&dir, edit);
        let e = open_with(&dir, OpenOptions::default()).err().unwrap();
        assert!(matches!(e, Error::Version { .. }), "{what}: {e}");
        let msg = e.to_string();
        assert!(msg.contains(what) && msg.contains("upgrade"), "{msg}");
    }
}

/// Manifests with a valid checksum but values no build writes (found by
/// the byte-mutation suite of `tests/fuzz_readers.rs` and by reading what
/// the planner derives from them) are corruption, named by field, and never
/// reach the planner's arithmetic.
#[test]
fn manifests_no_build_writes_are_corrupt() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    build_small(&dir, &small_opts());
    let original = std::fs::read_to_string(dir.join(MANIFEST_FILE)).unwrap();
    type Edit = fn(&mut serde_json::Value);
    /// `n` nodes of dimension `dim` (f32), with the layout fields to match.
    fn resize(v: &mut serde_json::Value, n: u64, dim: u64) {
        let r = v["layout"]["max_degree"].as_u64().unwrap() as usize;
        let g = PageGeometry::new(4096, dim as usize * 4, r, n as usize).unwrap();
        v["n"] = n.into();
        v["dim"] = dim.into();
        v["layout"]["record_size"] = g.record_size.into();
        v["layout"]["block_size"] = g.block_size.into();
        v["layout"]["records_per_block"] = g.records_per_block.into();
        v["layout"]["n_blocks"] = g.n_blocks.into();
    }
    let cases: [(&str, Edit); 7] = [
        ("\"dim\"", |v| resize(v, 2000, u32::MAX as u64 + 1)),
        ("\"n\"", |v| resize(v, u32::MAX as u64, 16)),
        ("\"spec.pq_bytes\"", |v| v["spec"]["pq_bytes"] = 0.into()),
        ("\"spec.pq_bytes\"", |v| v["spec"]["pq_bytes"] = 17.into()),
        ("\"spec.pq_bytes\"", |v| {
            v["spec"]["pq_bytes"] = (i64::MAX as u64).into()
        }),
        ("\"sections.pq_codes.bytes\"", |v| {
            v["sections"]["pq_codes"]["bytes"] = u64::MAX.into()
        }),
        // 2^30 records of 16 GiB: a page file of 2^64 bytes.
        ("\"layout.block_size\"", |v| {
            resize(v, 1 << 30, u32::MAX as u64)
        }),
    ];
    for (field, edit) in cases {
        std::fs::write(dir.join(MANIFEST_FILE), &original).unwrap();
        rewrite_manifest(&dir, edit);
        let e = open_with(&dir, OpenOptions::default()).err().unwrap();
        assert!(matches!(e, Error::Corrupt { .. }), "{field}: {e}");
        assert!(e.to_string().contains(field), "{field}: {e}");
    }
}

/// A budget near `u64::MAX`, recorded in the manifest or asked for at
/// open, sizes the cache for every node (`NodeCache::bytes_for` overflowed
/// on the count of nodes such a budget names).
#[test]
fn a_budget_near_u64_max_caches_at_most_every_node() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    build_small(&dir, &small_opts());
    let original = std::fs::read_to_string(dir.join(MANIFEST_FILE)).unwrap();
    for b in [u64::MAX, i64::MAX as u64, 1 << 40] {
        std::fs::write(dir.join(MANIFEST_FILE), &original).unwrap();
        rewrite_manifest(&dir, |v| v["spec"]["memory_budget"] = b.into());
        for memory_budget in [None, Some(Budget::Bytes(b))] {
            let opts = OpenOptions {
                memory_budget,
                ..Default::default()
            };
            let idx = Index::open(&dir, &opts).unwrap();
            assert_eq!(idx.memory().unwrap().cache_nodes, 2000, "budget {b}");
        }
    }
    let geo = PageGeometry::new(4096, 64, 16, 2000).unwrap();
    assert_eq!(
        crate::cache::NodeCache::bytes_for(&geo, usize::MAX),
        u64::MAX
    );
}

/// Indexes written by nearline 0.1 with format 1.2 (before typed names and
/// the manifest checksum): committed fixtures, built by that version.
#[test]
fn indexes_of_format_1_2_open_and_answer_as_they_did() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/format-1.2");
    for name in ["v1_2_diskann", "v1_2_starling"] {
        let dir = root.join(name);
        let idx = Index::open(&dir, &OpenOptions::default()).unwrap();
        assert_eq!(idx.manifest().unwrap().format_minor, 2);
        let want: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap())
                .unwrap();
        let queries: Vec<f32> = want["queries"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
            })
            .collect();
        let nq = queries.len() / 8;
        let out = idx
            .search(
                &queries,
                nq,
                &SearchOptions {
                    l: Some(50),
                    ..SearchOptions::new(5)
                },
            )
            .unwrap();
        let ids: Vec<i64> = want["ids"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()))
            .collect();
        assert_eq!(out.ids, ids, "{name}");
        let dist: Vec<f32> = want["dist"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
            })
            .collect();
        for (a, b) in out.distances.iter().zip(&dist) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "{name}: {a} vs {b}"
            );
        }
    }
}

/// For every preset and budgets of 5%, 10% and 20% of the raw vectors: the
/// build's plan fits the budget; an index built at 5% and opened at each
/// budget holds what its open plan says, within the budget, and a search
/// batch keeps its workers within what the budget leaves them.
#[test]
fn every_preset_keeps_its_budget() {
    // 384-d (a sentence-embedding size): at 5% of 30 MB the fixed
    // structures (codebook, navigation graph, layout map, workers) fit.
    let (n, dim) = (20_000, 384);
    let data = clustered(n, dim, 3);
    let raw = (n * dim * 4) as u64;
    let queries = clustered(200, dim, 4);
    let tmp = tempfile::tempdir().unwrap();
    let facts = DataFacts {
        n,
        dim,
        dtype: DType::F32,
    };
    for preset in [Preset::Diskann, Preset::Pipeann, Preset::Starling] {
        let opts = |frac: f64| BuildOptions {
            preset: PresetChoice::Named(preset),
            r: Some(24),
            build_l: Some(32),
            memory_budget: Some(Budget::Fraction(frac)),
            threads: Some(2),
            ..Default::default()
        };
        for frac in [0.05, 0.10, 0.20] {
            let budget = (raw as f64 * frac) as u64;
            let planned = plan_build(&opts(frac), &facts).unwrap();
            let p = &planned.memory;
            assert_eq!(p.budget, budget);
            assert!(p.fixed() + p.cache <= budget, "{preset} {frac}: {p:?}");
        }
        let dir = tmp.path().join(preset.name());
        let m = Matrix::from_vec(data.clone(), n, dim).unwrap();
        let man = build(m, &dir, &opts(0.05), &|_, _, _| {}, &never()).unwrap();
        assert_eq!(man.spec.memory_budget, (raw as f64 * 0.05) as u64);
        for frac in [0.05, 0.10, 0.20] {
            let budget = (raw as f64 * frac) as u64;
            let idx = Index::open(
                &dir,
                &OpenOptions {
                    threads: Some(2),
                    memory_budget: Some(Budget::Fraction(frac)),
                    ..Default::default()
                },
            )
            .unwrap();
            let out = idx.search(&queries, 200, &SearchOptions::new(10)).unwrap();
            assert!(out.ids.iter().all(|&i| i >= 0));
            let plan = &idx.open_plan().unwrap().memory;
            let held = idx.memory().unwrap();
            assert!(
                plan.fixed() + plan.cache <= budget,
                "{preset} {frac}: {plan:?}"
            );
            assert_eq!(
                (
                    held.pq_codes,
                    held.pq_codebook,
                    held.entry,
                    held.layout_map,
                    held.cache
                ),
                (
                    plan.pq_codes,
                    plan.pq_codebook,
                    plan.entry,
                    plan.layout_map,
                    plan.cache
                ),
                "{preset} {frac}"
            );
            assert!(
                held.static_total() + held.worker_scratch <= budget,
                "{preset} {frac}: {held:?} over {budget}; planned {plan:?}"
            );
            let info = idx.info();
            assert_eq!(
                info["memory"]["within_budget"], true,
                "{preset} {frac}: {info}"
            );
            // Below the minimum: a clear error naming it.
            let min = plan.minimum;
            let e = Index::open(
                &dir,
                &OpenOptions {
                    threads: Some(2),
                    memory_budget: Some(Budget::Bytes(min - 1)),
                    ..Default::default()
                },
            )
            .err()
            .unwrap()
            .to_string();
            assert!(e.contains(&min.to_string()), "{e}");
        }
    }
}

#[test]
fn build_budgets_below_the_minimum_are_refused_with_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = clustered(2000, 16, 1);
    for budget in [Budget::Bytes(0), Budget::Bytes(1), Budget::Bytes(1000)] {
        let m = Matrix::from_vec(data.clone(), 2000, 16).unwrap();
        let e = build(
            m,
            &tmp.path().join("x"),
            &BuildOptions {
                memory_budget: Some(budget),
                ..Default::default()
            },
            &|_, _, _| {},
            &never(),
        )
        .unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("at least") && msg.contains("memory_budget"),
            "{msg}"
        );
    }
    assert!(!tmp.path().join("x").exists());
    // The default budget is raised to what the index needs.
    let m = Matrix::from_vec(data, 2000, 16).unwrap();
    let man = build(
        m,
        &tmp.path().join("d"),
        &BuildOptions::default(),
        &|_, _, _| {},
        &never(),
    )
    .unwrap();
    let idx = Index::open(&tmp.path().join("d"), &OpenOptions::default()).unwrap();
    assert_eq!(idx.info()["memory"]["within_budget"], true);
    assert!(man.spec.memory_budget >= idx.open_plan().unwrap().memory.minimum);
}

#[test]
fn overwrite_replaces_only_an_index() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "notes").unwrap();
    let opts = BuildOptions {
        overwrite: true,
        ..small_opts()
    };
    let m = Matrix::from_vec(clustered(300, 8, 2), 300, 8).unwrap();
    let e = build(m, &dir, &opts, &|_, _, _| {}, &never()).unwrap_err();
    assert!(e.to_string().contains("not a nearline index"), "{e}");
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.txt")).unwrap(),
        "notes"
    );
    // An index is replaced.
    let idx_dir = tmp.path().join("i");
    build_small(&idx_dir, &small_opts());
    let before = read_manifest(&idx_dir).unwrap();
    let m = Matrix::from_vec(clustered(300, 8, 2), 300, 8).unwrap();
    build(m, &idx_dir, &opts, &|_, _, _| {}, &never()).unwrap();
    let after = read_manifest(&idx_dir).unwrap();
    assert_eq!((before.n, after.n), (2000, 300));
}
