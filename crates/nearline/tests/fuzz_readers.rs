//! Byte-mutation tests of every reader: the short run of the fuzz targets
//! that CI does. Each reader gets a valid encoding mutated at random
//! (flipped bits, truncation, extension, splices, header fields overwritten
//! with extreme values such as 0, u32::MAX or huge dimensions) and must
//! return `Ok` or a clean error (`Format`, `Corrupt`, `InvalidArgument`,
//! `Version`, `Io`): never panic, never hang, never make a huge allocation
//! from a small input. A panic fails the case with the input in hex.
//!
//! The coverage-guided versions of these targets live in `fuzz/` (see
//! `fuzz/README.md`); the ignored test `build_fuzz_corpus` writes their seed
//! corpora, in the input encodings documented there.
//!
//! `NEARLINE_FUZZ_CASES` scales the number of cases (default 1: a few
//! seconds in all; 20 for a longer local run).

use nearline::data::files::{self, GroundTruth, RangeGroundTruth};
use nearline::data::matrix::{Matrix, MatrixView};
use nearline::format::page::{self, PageGeometry, LAYOUT_SHUFFLED};
use nearline::format::{LayoutKind, Manifest, MANIFEST_FILE};
use nearline::index::{build, Index};
use nearline::io::EngineKind;
use nearline::layout::ShuffledLayout;
use nearline::planner::{BuildOptions, EntryChoice, OpenOptions, SearchOptions};
use nearline::quant::pq::{PqCodebook, PQ_CENTROIDS};
use nearline::util::Budget;
use nearline::{DType, Element, Error, Metric};
use proptest::prelude::*;
use proptest::sample::Index as Pick;
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::OnceLock;
use std::time::Duration;

mod common;
use common::fuzz::*;

// ---------------------------------------------------------------------------
// Seeds: valid encodings

fn rows<T: Element>(n: usize, d: usize, seed: u64) -> Vec<T> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n * d)
        .map(|_| {
            let v: f32 = match T::DTYPE {
                DType::F32 | DType::F16 => rng.random_range(-4.0f32..4.0),
                DType::U8 => rng.random_range(0..=255) as f32,
                DType::I8 => rng.random_range(-128..=127) as f32,
            };
            T::from_f32(v).unwrap_or_else(<T as bytemuck::Zeroable>::zeroed)
        })
        .collect()
}

/// Extensions the vector readers see (the fuzz target's selector order).
const VECTOR_EXTS: [&str; 10] = [
    "fbin", "f16bin", "hbin", "u8bin", "i8bin", "bin", "fvecs", "bvecs", "ivecs", "npy",
];
const DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::U8, DType::I8];

fn write_seed<T: Element>(path: &Path, n: usize, d: usize) -> Vec<u8> {
    let data = rows::<T>(n, d, (n * 31 + d) as u64);
    let view = MatrixView::new(&data, n, d).expect("seed view");
    match files::write_vectors(path, view) {
        Ok(()) => std::fs::read(path).expect("seed read"),
        Err(_) => Vec::new(),
    }
}

/// A valid vector file of `ext` (its dtype from `dt` where the extension
/// leaves it open), as bytes.
fn vector_seed(dir: &Path, ext: &str, dt: DType, n: usize, d: usize) -> Vec<u8> {
    let p = dir.join(format!("seed.{ext}"));
    let dt = match ext {
        "fbin" | "fvecs" => DType::F32,
        "f16bin" | "hbin" => DType::F16,
        "u8bin" | "bvecs" => DType::U8,
        "i8bin" => DType::I8,
        _ => dt,
    };
    let n = if ext.ends_with("vecs") { n.max(1) } else { n };
    if ext == "ivecs" {
        // Ids (int32 rows): what an .ivecs holds; the vector readers refuse it.
        let mut b = Vec::new();
        for r in 0..n {
            b.extend_from_slice(&(d as i32).to_le_bytes());
            for c in 0..d {
                b.extend_from_slice(&((r * d + c) as i32).to_le_bytes());
            }
        }
        return b;
    }
    match dt {
        DType::F32 => write_seed::<f32>(&p, n, d),
        DType::F16 => write_seed::<half::f16>(&p, n, d),
        DType::U8 => write_seed::<u8>(&p, n, d),
        DType::I8 => write_seed::<i8>(&p, n, d),
    }
}

/// An `.npy` file with a hand-written header: the variations third-party
/// writers produce (versions 1-3, quotes, `L` suffixes, key order, padding).
#[derive(Debug, Clone)]
struct NpySeed {
    version: u8,
    descr: &'static str,
    fortran: &'static str,
    shape: String,
    double_quotes: bool,
    reversed: bool,
    pad: usize,
    dtype: DType,
    n: usize,
    d: usize,
}

fn npy_seed() -> impl Strategy<Value = NpySeed> {
    (
        prop::sample::select(vec![1u8, 2, 3]),
        0usize..4,
        prop::sample::select(vec!["False", "False", "False", "True", "0", "'no'"]),
        0usize..5,
        1usize..6,
        any::<bool>(),
        any::<bool>(),
        0usize..70,
        0usize..6,
    )
        .prop_map(
            |(version, dti, fortran, n, d, double_quotes, reversed, pad, shape_kind)| {
                let dtype = DTYPES[dti];
                let descr = match (dtype, shape_kind) {
                    (_, 5) => ">f4",
                    (DType::F32, _) => "<f4",
                    (DType::F16, _) => "<f2",
                    (DType::U8, 1) => "u1",
                    (DType::U8, _) => "|u1",
                    (DType::I8, 2) => "<i1",
                    (DType::I8, _) => "|i1",
                };
                let shape = match shape_kind {
                    0 => format!("({n}, {d})"),
                    1 => format!("({n},{d},)"),
                    2 => format!("({n}L, {d}L)"),
                    3 => format!("({},)", n * d),
                    4 => format!("({n}, {d}, 1)"),
                    _ => format!("({n}, {d})"),
                };
                NpySeed {
                    version,
                    descr,
                    fortran,
                    shape,
                    double_quotes,
                    reversed,
                    pad,
                    dtype,
                    n,
                    d,
                }
            },
        )
}

fn npy_bytes(s: &NpySeed) -> Vec<u8> {
    let q = if s.double_quotes { '"' } else { '\'' };
    let fields = [
        format!("{q}descr{q}: {q}{}{q}", s.descr),
        format!("{q}fortran_order{q}: {}", s.fortran),
        format!("{q}shape{q}: {}", s.shape),
    ];
    let body = if s.reversed {
        format!("{{{}, {}, {}}}", fields[2], fields[1], fields[0])
    } else {
        format!("{{{}, {}, {}, }}", fields[0], fields[1], fields[2])
    };
    let mut header = body.into_bytes();
    header.extend(std::iter::repeat_n(b' ', s.pad));
    header.push(b'\n');
    let mut out = b"\x93NUMPY".to_vec();
    out.push(s.version);
    out.push(0);
    if s.version == 1 {
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(&header);
    let data_len = s.n * s.d * s.dtype.size();
    out.extend((0..data_len).map(|i| (i * 37 % 251) as u8 & 0x3f));
    out
}

fn gt_seed(n: usize, k: usize, ids_only: bool) -> GroundTruth {
    GroundTruth {
        n,
        k,
        ids: (0..(n * k) as u32).map(|i| i * 7 % 1000).collect(),
        distances: if ids_only {
            Vec::new()
        } else {
            (0..n * k).map(|i| i as f32 * 0.25).collect()
        },
    }
}

fn range_gt_seed(counts: &[u64], ids_only: bool) -> RangeGroundTruth {
    let mut lims = vec![0u64];
    for c in counts {
        lims.push(lims[lims.len() - 1] + c);
    }
    let total = lims[lims.len() - 1] as usize;
    RangeGroundTruth {
        lims,
        ids: (0..total as u32).map(|i| i * 13 % 977).collect(),
        distances: if ids_only {
            Vec::new()
        } else {
            (0..total).map(|i| i as f32 * 0.5).collect()
        },
    }
}

fn gt_ivecs_bytes(n: usize, k: usize) -> Vec<u8> {
    let mut b = Vec::new();
    for r in 0..n {
        b.extend_from_slice(&(k as i32).to_le_bytes());
        for c in 0..k {
            b.extend_from_slice(&((r * 10 + c) as i32).to_le_bytes());
        }
    }
    b
}

// ---------------------------------------------------------------------------
// The fixture indexes

const FX_N: usize = 300;
const FX_DIM: usize = 8;

struct Fixture {
    _tmp: tempfile::TempDir,
    /// ID layout with ids, a navigation graph and centroid entries.
    id: PathBuf,
    /// Shuffled layout.
    shuffled: PathBuf,
    /// PQ-coded layout (AiSAQ: neighbours' PQ codes in the records).
    pq_coded: PathBuf,
    /// Page graph (PageANN: a page's records share its edges).
    page_graph: PathBuf,
    /// Decoupled layout (DGAI: topology records, then vector pages).
    decoupled: PathBuf,
    queries: Vec<f32>,
}

/// Which fixture index a case mutates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fix {
    Id,
    Shuffled,
    PqCoded,
    PageGraph,
    Decoupled,
}

const FIXES: [Fix; 5] = [
    Fix::Id,
    Fix::Shuffled,
    Fix::PqCoded,
    Fix::PageGraph,
    Fix::Decoupled,
];

impl Fix {
    fn dir(self) -> &'static Path {
        let f = fixture();
        match self {
            Fix::Id => &f.id,
            Fix::Shuffled => &f.shuffled,
            Fix::PqCoded => &f.pq_coded,
            Fix::PageGraph => &f.page_graph,
            Fix::Decoupled => &f.decoupled,
        }
    }
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = rows::<f32>(FX_N, FX_DIM, 5);
        let never = AtomicBool::new(false);
        let opts = BuildOptions {
            r: Some(8),
            build_l: Some(20),
            pq_bytes: Some(4),
            threads: Some(1),
            ids: Some((0..FX_N as u64).map(|i| 5000 + 3 * i).collect()),
            nav_sample: Some(0.05),
            entry_clusters: Some(4),
            layout: Some(LayoutKind::ID),
            ..Default::default()
        };
        let id = tmp.path().join("id");
        let m = Matrix::from_vec(base.clone(), FX_N, FX_DIM).expect("matrix");
        build(m, &id, &opts, &|_, _, _| {}, &never).expect("build the id fixture");
        let shuffled = tmp.path().join("shuffled");
        let opts = BuildOptions {
            layout: Some(LayoutKind::SHUFFLED),
            ids: None,
            nav_sample: Some(0.0),
            entry_clusters: Some(0),
            ..opts
        };
        let m = Matrix::from_vec(base.clone(), FX_N, FX_DIM).expect("matrix");
        build(m, &shuffled, &opts, &|_, _, _| {}, &never).expect("build the shuffled fixture");
        let pq_coded = tmp.path().join("pq_coded");
        let opts = BuildOptions {
            layout: Some(LayoutKind::PqCoded),
            ..opts
        };
        let m = Matrix::from_vec(base.clone(), FX_N, FX_DIM).expect("matrix");
        build(m, &pq_coded, &opts, &|_, _, _| {}, &never).expect("build the pq_coded fixture");
        let page_graph = tmp.path().join("page_graph");
        let opts = BuildOptions {
            layout: Some(LayoutKind::PAGE_GRAPH),
            ..opts
        };
        let m = Matrix::from_vec(base.clone(), FX_N, FX_DIM).expect("matrix");
        build(m, &page_graph, &opts, &|_, _, _| {}, &never).expect("build the page_graph fixture");
        let decoupled = tmp.path().join("decoupled");
        let opts = BuildOptions {
            layout: Some(LayoutKind::Decoupled),
            ..opts
        };
        let m = Matrix::from_vec(base, FX_N, FX_DIM).expect("matrix");
        build(m, &decoupled, &opts, &|_, _, _| {}, &never).expect("build the decoupled fixture");
        Fixture {
            _tmp: tmp,
            id,
            shuffled,
            pq_coded,
            page_graph,
            decoupled,
            queries: rows::<f32>(3, FX_DIM, 77),
        }
    })
}

fn fixture_file(shuffled: bool, name: &str) -> Vec<u8> {
    fix_file(if shuffled { Fix::Shuffled } else { Fix::Id }, name)
}

fn fix_file(which: Fix, name: &str) -> Vec<u8> {
    std::fs::read(which.dir().join(name)).unwrap_or_else(|e| panic!("fixture file {name}: {e}"))
}

fn fixture_geometry(shuffled: bool) -> PageGeometry {
    fix_geometry(if shuffled { Fix::Shuffled } else { Fix::Id })
}

fn fix_geometry(which: Fix) -> PageGeometry {
    let g = PageGeometry::new(4096, FX_DIM * 4, 8, FX_N).expect("fixture geometry");
    match which {
        Fix::Id => g,
        Fix::Shuffled => g.with_layout_id(LAYOUT_SHUFFLED),
        // The fixture's 4-byte PQ codes.
        Fix::PqCoded => {
            PageGeometry::with_pq_codes(4096, FX_DIM * 4, 8, 4, FX_N).expect("fixture geometry")
        }
        Fix::PageGraph => {
            PageGeometry::page_graph(4096, FX_DIM * 4, 8, FX_N).expect("fixture geometry")
        }
        Fix::Decoupled => {
            PageGeometry::decoupled(4096, FX_DIM * 4, 8, FX_N).expect("fixture geometry")
        }
    }
}

// ---------------------------------------------------------------------------
// Vector files

fn read_vector_file(sink: &mut Sink, path: &Path, hint: Option<DType>) {
    if let Some(info) = sink.take(files::probe(path, hint)) {
        assert!(info.dim >= 1, "probe returned dim 0");
    }
    fn open<T: Element>(sink: &mut Sink, path: &Path) {
        if let Some(m) = sink.take(files::open_vectors::<T>(path)) {
            assert_eq!(m.as_slice().len(), m.n() * m.dim());
            if m.n() > 0 {
                let _ = m.row(m.n() - 1);
            }
        }
    }
    open::<f32>(sink, path);
    open::<half::f16>(sink, path);
    open::<u8>(sink, path);
    open::<i8>(sink, path);
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn vector_files_never_panic(
        ext in 0usize..VECTOR_EXTS.len(),
        dt in 0usize..4,
        hint in prop::option::of(0usize..4),
        n in 0usize..6,
        d in 1usize..9,
        muts in mutations(6),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let ext = VECTOR_EXTS[ext];
        let input = apply(vector_seed(dir.path(), ext, DTYPES[dt], n, d), &muts);
        let path = dir.path().join(format!("x.{ext}"));
        std::fs::write(&path, &input).expect("write input");
        let hint = hint.map(|h| DTYPES[h]);
        run("vector files", &input, Limits::small(input.len()), |s| {
            read_vector_file(s, &path, hint)
        })?;
    }

    #[test]
    fn npy_files_never_panic(seed in npy_seed(), muts in mutations(4)) {
        let dir = tempfile::tempdir().expect("tempdir");
        let input = apply(npy_bytes(&seed), &muts);
        let path = dir.path().join("x.npy");
        std::fs::write(&path, &input).expect("write input");
        run("npy", &input, Limits::small(input.len()), |s| {
            read_vector_file(s, &path, None)
        })?;
    }
}

#[test]
fn vector_seeds_are_valid() {
    // The mutation tests start from valid files: check they are.
    let dir = tempfile::tempdir().expect("tempdir");
    for ext in VECTOR_EXTS {
        if ext == "ivecs" {
            continue;
        }
        for dt in DTYPES {
            let b = vector_seed(dir.path(), ext, dt, 3, 4);
            let p = dir.path().join(format!("v.{ext}"));
            std::fs::write(&p, &b).expect("write");
            let hint = (ext == "bin").then_some(dt);
            let info = files::probe(&p, hint).unwrap_or_else(|e| panic!("{ext}: {e}"));
            assert_eq!((info.n, info.dim), (3, 4), "{ext}");
        }
    }
    for v in [1u8, 2, 3] {
        let s = NpySeed {
            version: v,
            descr: "<f4",
            fortran: "False",
            shape: "(3L, 4L)".into(),
            double_quotes: v == 2,
            reversed: v == 3,
            pad: 5,
            dtype: DType::F32,
            n: 3,
            d: 4,
        };
        let p = dir.path().join("v.npy");
        std::fs::write(&p, npy_bytes(&s)).expect("write");
        let m = files::open_vectors::<f32>(&p).unwrap_or_else(|e| panic!("npy v{v}: {e}"));
        assert_eq!((m.n(), m.dim()), (3, 4));
    }
}

// ---------------------------------------------------------------------------
// Ground truth

fn read_gt(sink: &mut Sink, path: &Path) {
    if let Some(gt) = sink.take(files::read_ground_truth(path)) {
        assert_eq!(gt.ids.len(), gt.n * gt.k, "ids of an accepted ground truth");
        assert!(gt.distances.is_empty() || gt.distances.len() == gt.ids.len());
    }
}

fn read_range_gt(sink: &mut Sink, path: &Path) {
    if let Some(gt) = sink.take(files::read_range_ground_truth(path)) {
        if let Err(e) = gt.validate() {
            panic!("an accepted range ground truth fails validate: {e}");
        }
    }
}

fn gt_input(
    dir: &Path,
    kind: usize,
    n: usize,
    k: usize,
    ids_only: bool,
    counts: &[u64],
) -> Vec<u8> {
    match kind {
        0 => {
            let p = dir.join("seed.bin");
            files::write_ground_truth(&p, &gt_seed(n, k, ids_only)).expect("seed gt");
            std::fs::read(&p).expect("read")
        }
        1 => gt_ivecs_bytes(n, k),
        _ => {
            let p = dir.join("seed_range.bin");
            files::write_range_ground_truth(&p, &range_gt_seed(counts, ids_only))
                .expect("seed range gt");
            std::fs::read(&p).expect("read")
        }
    }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn ground_truth_never_panics(
        kind in 0usize..3,
        n in 0usize..6,
        k in 0usize..6,
        ids_only in any::<bool>(),
        counts in prop::collection::vec(0u64..5, 0..6),
        muts in mutations(6),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let input = apply(gt_input(dir.path(), kind, n, k, ids_only, &counts), &muts);
        let name = ["gt.bin", "gt.ivecs", "range.bin"][kind];
        let path = dir.path().join(name);
        std::fs::write(&path, &input).expect("write input");
        run("ground truth", &input, Limits::small(input.len()), |s| {
            if kind == 2 {
                read_range_gt(s, &path);
                read_gt(s, &path);
            } else {
                read_gt(s, &path);
                read_range_gt(s, &path);
            }
        })?;
    }
}

// ---------------------------------------------------------------------------
// Manifest

/// A change to the manifest's JSON tree.
#[derive(Debug, Clone)]
enum JsonMut {
    Set(Pick, serde_json::Value),
    Remove(Pick),
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::{json, Value};
    prop_oneof![
        3 => extreme().prop_map(|v| json!(v)),
        1 => prop::sample::select(vec![
            json!(-1),
            json!(i64::MIN),
            json!(0.5),
            json!(-0.0),
            json!(1e300),
            json!(4096),
            json!(8192),
            json!(16384),
            json!(65535),
            json!(65536),
            json!(9007199254740993u64),
            json!(""),
            json!("id"),
            json!("shuffled"),
            json!("f32"),
            json!("float16"),
            json!("u8"),
            json!("l2"),
            json!("ip"),
            json!("cosine"),
            json!("pages.bin"),
            json!("../manifest.json"),
            json!("/dev/zero"),
            json!("."),
            json!("nearline-index"),
            Value::Null,
            json!(true),
            json!([]),
            json!({}),
            json!({"file": "x.bin", "kind": "pages", "bytes": 0, "crc32c": null}),
        ]),
    ]
}

fn json_mut() -> impl Strategy<Value = JsonMut> {
    prop_oneof![
        4 => (any::<Pick>(), json_value()).prop_map(|(p, v)| JsonMut::Set(p, v)),
        1 => any::<Pick>().prop_map(JsonMut::Remove),
    ]
}

/// JSON pointers of every node under `v` (not the root).
fn pointers(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
    let esc = |k: &str| k.replace('~', "~0").replace('/', "~1");
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                let p = format!("{at}/{}", esc(k));
                out.push(p.clone());
                pointers(x, p, out);
            }
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push(p.clone());
                pointers(x, p, out);
            }
        }
        _ => {}
    }
}

fn apply_json(text: &[u8], muts: &[JsonMut]) -> Vec<u8> {
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(text) else {
        return text.to_vec();
    };
    for m in muts {
        let mut ptrs = Vec::new();
        pointers(&v, String::new(), &mut ptrs);
        if ptrs.is_empty() {
            break;
        }
        match m {
            JsonMut::Set(p, x) => {
                if let Some(slot) = v.pointer_mut(&ptrs[p.index(ptrs.len())]) {
                    *slot = x.clone();
                }
            }
            JsonMut::Remove(p) => {
                let ptr = &ptrs[p.index(ptrs.len())];
                let (parent, key) = ptr.rsplit_once('/').unwrap_or(("", ""));
                let key = key.replace("~1", "/").replace("~0", "~");
                match v.pointer_mut(parent) {
                    Some(serde_json::Value::Object(m)) => {
                        m.remove(&key);
                    }
                    Some(serde_json::Value::Array(a)) => {
                        if let Ok(i) = key.parse::<usize>() {
                            if i < a.len() {
                                a.remove(i);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    serde_json::to_vec_pretty(&v).unwrap_or_default()
}

/// Gives manifest text a valid checksum (the CRC32C of the canonical JSON
/// without the field, as `Manifest::to_text` computes it) so that edits
/// reach the checks behind it; text that is not a JSON object is returned
/// as it is.
fn seal_manifest(text: &[u8]) -> Vec<u8> {
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(text) else {
        return text.to_vec();
    };
    let Some(o) = v.as_object_mut() else {
        return text.to_vec();
    };
    o.remove("checksum");
    let c = format!("crc32c:{:08x}", crc32c::crc32c(v.to_string().as_bytes()));
    if let Some(o) = v.as_object_mut() {
        o.insert("checksum".into(), c.into());
    }
    serde_json::to_vec_pretty(&v).unwrap_or_else(|_| text.to_vec())
}

fn parse_manifest(sink: &mut Sink, input: &[u8]) {
    let text = String::from_utf8_lossy(input);
    if let Some(m) = sink.take(Manifest::parse(Path::new(MANIFEST_FILE), &text)) {
        // What open does next with an accepted manifest: the geometry and
        // the plan (the memory split over the manifest's sizes).
        if let Some(g) = sink.take(nearline::planner::geometry(&m)) {
            let _ = g.file_bytes();
        }
        for budget in [None, Some(Budget::Bytes(256 << 20))] {
            let opts = OpenOptions {
                memory_budget: budget,
                ..Default::default()
            };
            let _ = sink.take(nearline::planner::plan_open(&opts, &m));
        }
    }
}

proptest! {
    #![proptest_config(config(2048))]

    #[test]
    fn manifest_never_panics(
        which in prop::sample::select(FIXES.to_vec()),
        jm in prop::collection::vec(json_mut(), 1..4),
        seal in prop_oneof![3 => Just(true), 1 => Just(false)],
        muts in prop_oneof![2 => Just(Vec::new()), 1 => mutations(3)],
    ) {
        let seed = fix_file(which, "manifest.json");
        let edited = apply_json(&seed, &jm);
        let edited = if seal { seal_manifest(&edited) } else { edited };
        let input = apply(edited, &muts);
        run("manifest", &input, Limits::small(input.len()), |s| parse_manifest(s, &input))?;
    }
}

// ---------------------------------------------------------------------------
// Index sections

fn small_codebook() -> &'static [u8] {
    static B: OnceLock<Vec<u8>> = OnceLock::new();
    B.get_or_init(|| {
        let sample = rows::<f32>(300, 3, 9);
        nearline::format::pq::encode(
            &PqCodebook::train(&sample, 3, 3, Metric::L2, 1).expect("train a small codebook"),
        )
    })
}

fn read_codebook(sink: &mut Sink, input: &[u8]) {
    if let Some(cb) = sink.take(nearline::format::pq::decode(
        Path::new("pq_codebook.bin"),
        input,
    )) {
        // An accepted codebook must be usable as the search uses it.
        let (dim, m) = (cb.dim(), cb.m());
        let v = vec![0.25f32; dim];
        let mut code = vec![0u8; m];
        cb.encode(&v, &mut code);
        let mut out = vec![0f32; dim];
        cb.decode(&code, &mut out);
        let mut table = vec![0f32; m * PQ_CENTROIDS];
        for metric in [Metric::L2, Metric::InnerProduct, Metric::Cosine] {
            cb.lookup_table(&v, metric, &mut table);
        }
    }
}

fn read_nav(sink: &mut Sink, input: &[u8], dt: DType, dim: usize, n: usize) {
    let p = Path::new("nav_graph.bin");
    fn go<T: Element>(sink: &mut Sink, p: &Path, b: &[u8], dim: usize, n: usize) {
        if let Some(g) = sink.take(nearline::format::nav::decode::<T>(p, b, dim, n)) {
            assert!(g.ids().iter().all(|&v| (v as usize) < n));
            assert!(g.len() <= n);
        }
    }
    match dt {
        DType::F32 => go::<f32>(sink, p, input, dim, n),
        DType::F16 => go::<half::f16>(sink, p, input, dim, n),
        DType::U8 => go::<u8>(sink, p, input, dim, n),
        DType::I8 => go::<i8>(sink, p, input, dim, n),
    }
}

fn read_centroids(sink: &mut Sink, input: &[u8], dt: DType, dim: usize, n: usize) {
    let p = Path::new("entry_centroids.bin");
    fn go<T: Element>(sink: &mut Sink, p: &Path, b: &[u8], dim: usize, n: usize) {
        if let Some((ids, vecs)) = sink.take(nearline::format::entries::decode_centroids::<T>(
            p, b, dim, n,
        )) {
            assert!(ids.iter().all(|&v| (v as usize) < n));
            assert_eq!(vecs.len(), ids.len() * dim);
        }
    }
    match dt {
        DType::F32 => go::<f32>(sink, p, input, dim, n),
        DType::F16 => go::<half::f16>(sink, p, input, dim, n),
        DType::U8 => go::<u8>(sink, p, input, dim, n),
        DType::I8 => go::<i8>(sink, p, input, dim, n),
    }
}

fn read_location(
    sink: &mut Sink,
    input: &[u8],
    geo: PageGeometry,
    n: usize,
    placement: nearline::format::Placement,
) {
    use nearline::layout::Layout;
    let p = Path::new("id_to_location.bin");
    if let Some(l) = sink.take(ShuffledLayout::from_section(p, input, geo, n, placement)) {
        let g = *l.geometry();
        for v in 0..l.n() as u32 {
            let (b, slot) = l.locate(v);
            assert!(b < g.n_blocks && slot < g.records_per_block);
        }
        let mut out = Vec::new();
        for b in 0..g.n_blocks.min(1 << 16) {
            l.block_nodes(b, &mut out);
        }
        assert!(out.len() <= l.n());
    }
}

/// `(dim, n)` the section readers are called with: mostly the fixture's.
fn dims_and_counts() -> impl Strategy<Value = (usize, usize)> {
    prop_oneof![
        6 => Just((FX_DIM, FX_N)),
        1 => (prop::sample::select(vec![0usize, 1, 7, 9, 1 << 20, usize::MAX]),
              prop::sample::select(vec![0usize, 1, 14, 15, 299, 301, u32::MAX as usize, usize::MAX])),
    ]
}

proptest! {
    #![proptest_config(config(384))]

    #[test]
    fn pq_codebook_never_panics(small in any::<bool>(), muts in mutations(6)) {
        let seed = if small { small_codebook().to_vec() } else { fixture_file(false, "pq_codebook.bin") };
        let input = apply(seed, &muts);
        run("pq codebook", &input, Limits::small(input.len()), |s| read_codebook(s, &input))?;
    }

    #[test]
    fn nav_graph_never_panics(
        (dim, n) in dims_and_counts(),
        t in prop_oneof![4 => Just(0usize), 1 => 0usize..4],
        muts in mutations(6),
    ) {
        let input = apply(fixture_file(false, "nav_graph.bin"), &muts);
        run("nav graph", &input, Limits::small(input.len()), |s| {
            read_nav(s, &input, DTYPES[t], dim, n)
        })?;
    }

    #[test]
    fn entry_centroids_never_panic(
        (dim, n) in dims_and_counts(),
        t in prop_oneof![4 => Just(0usize), 1 => 0usize..4],
        muts in mutations(6),
    ) {
        let input = apply(fixture_file(false, "entry_centroids.bin"), &muts);
        run("entry centroids", &input, Limits::small(input.len()), |s| {
            read_centroids(s, &input, DTYPES[t], dim, n)
        })?;
    }

    #[test]
    fn id_to_location_never_panics(
        (_, n) in dims_and_counts(),
        other_geo in prop::option::of((prop::sample::select(vec![4096usize, 8192, 16384]), 0usize..70_000, 1usize..=65535, 0usize..100_000)),
        page_graph in any::<bool>(),
        muts in mutations(6),
    ) {
        let (which, placement) = if page_graph {
            (Fix::PageGraph, nearline::format::Placement::PageGraph)
        } else {
            (Fix::Shuffled, nearline::format::Placement::Shuffled)
        };
        let input = apply(fix_file(which, "id_to_location.bin"), &muts);
        let geo = match other_geo {
            None => fix_geometry(which),
            Some((ps, vb, r, gn)) => match PageGeometry::new(ps, vb, r, gn) {
                Ok(g) => g,
                Err(_) => return Ok(()),
            },
        };
        run("id-to-location", &input, Limits::small(input.len()), |s| read_location(s, &input, geo, n, placement))?;
    }
}

/// A valid in-degree section of 40 nodes listing 10.
fn in_degree_seed() -> Vec<u8> {
    let ids: Vec<u32> = (0..10).map(|i| (i * 7) % 40).collect();
    nearline::format::in_degree::encode(40, &ids)
}

fn read_in_degree(sink: &mut Sink, input: &[u8], n: usize) {
    if let Some(order) = sink.take(nearline::format::in_degree::decode(
        Path::new("in_degree.bin"),
        input,
        n,
    )) {
        // What is accepted is an order: ids below n, none twice.
        let mut seen = std::collections::HashSet::new();
        for &v in &order {
            assert!((v as usize) < n && seen.insert(v));
        }
    }
}

proptest! {
    #![proptest_config(config(384))]

    #[test]
    fn in_degree_never_panics(
        n in prop_oneof![4 => Just(40usize), 1 => prop::sample::select(vec![0usize, 1, 10, 39, 41, usize::MAX])],
        muts in mutations(6),
    ) {
        let input = apply(in_degree_seed(), &muts);
        run("in-degree", &input, Limits::small(input.len()), |s| read_in_degree(s, &input, n))?;
    }
}

/// A valid adjacency section of 3 nodes with R 2.
fn adjacency_seed() -> Vec<u8> {
    let lists: [&[u32]; 3] = [&[1, 2], &[0], &[]];
    let mut out = Vec::new();
    nearline::format::adjacency::write(&mut out, 3, 2, &[2, 0, 1], |v| lists[v as usize])
        .expect("write to a vector");
    out
}

fn read_adjacency(sink: &mut Sink, input: &[u8], n: usize, r: usize, chunk: usize) {
    let mut p = nearline::format::adjacency::Parser::new(Path::new("adjacency.bin"), n, r);
    let mut seen = std::collections::HashSet::new();
    for c in input.chunks(chunk.max(1)) {
        let fed = p.feed(c, &mut |v, list| {
            assert!((v as usize) < n && list.len() <= r);
            assert!(list.iter().all(|&u| (u as usize) < n));
            assert!(seen.insert(v), "node {v} accepted twice");
        });
        if sink.take(fed).is_none() {
            return;
        }
    }
    if sink.take(p.finish()).is_some() {
        assert_eq!(seen.len(), n);
    }
}

proptest! {
    #![proptest_config(config(384))]

    #[test]
    fn adjacency_sections_never_panic(
        n in prop_oneof![4 => Just(3usize), 1 => 0usize..6],
        r in prop_oneof![4 => Just(2usize), 1 => 0usize..4],
        chunk in 1usize..40,
        muts in mutations(6),
    ) {
        let input = apply(adjacency_seed(), &muts);
        run("adjacency", &input, Limits::small(input.len()), |s| read_adjacency(s, &input, n, r, chunk))?;
    }
}

// ---------------------------------------------------------------------------
// Quantizer sections (PCA, rotation, RaBitQ)

/// Valid PCA, rotation and RaBitQ sections, by kind.
fn quant_seeds() -> &'static [Vec<u8>; 3] {
    use nearline::format::quant;
    use nearline::quant::pca::{Pca, Rotation};
    use nearline::quant::rabitq::RaBitQ;
    static S: OnceLock<[Vec<u8>; 3]> = OnceLock::new();
    S.get_or_init(|| {
        let sample = rows::<f32>(100, 6, 11);
        [
            quant::encode_pca(&Pca::fit(&sample, 6, 3).expect("fit a PCA")),
            quant::encode_rotation(&Rotation::random(5, 1).expect("a rotation")),
            quant::encode_rabitq(&RaBitQ::new(8, 2).expect("a quantizer")),
        ]
    })
}

fn read_quant(sink: &mut Sink, kind: usize, input: &[u8]) {
    use nearline::format::quant;
    let p = Path::new("quant.bin");
    match kind {
        0 => {
            if let Some(pca) = sink.take(quant::decode_pca(p, input)) {
                let d = pca.dim();
                assert!(pca.principal() <= d);
                let x = vec![0.5f32; d];
                let (mut y, mut back) = (vec![0f32; d], vec![0f32; d]);
                let _ = sink.take(pca.transform(&x, &mut y));
                let _ = sink.take(pca.inverse_transform(&y, &mut back));
            }
        }
        1 => {
            if let Some(r) = sink.take(quant::decode_rotation(p, input)) {
                let d = r.dim();
                let x = vec![0.5f32; d];
                let (mut y, mut back) = (vec![0f32; d], vec![0f32; d]);
                let _ = sink.take(r.apply(&x, &mut y));
                let _ = sink.take(r.apply_inverse(&y, &mut back));
            }
        }
        _ => {
            if let Some(q) = sink.take(quant::decode_rabitq(p, input)) {
                let d = q.dim();
                let (o, c) = (vec![0.5f32; d], vec![0.25f32; d]);
                let mut code = vec![0u8; q.code_bytes()];
                let _ = sink.take(q.encode(&o, &c, &mut code));
                let _ = sink.take(q.prepare_query(&o));
            }
        }
    }
}

proptest! {
    #![proptest_config(config(384))]

    #[test]
    fn quant_sections_never_panic(kind in 0usize..3, muts in mutations(6)) {
        let input = apply(quant_seeds()[kind].clone(), &muts);
        run("quant sections", &input, Limits::small(input.len()), |s| {
            read_quant(s, kind, &input)
        })?;
    }
}

#[test]
fn quant_seeds_are_valid() {
    for (kind, seed) in quant_seeds().iter().enumerate() {
        let mut sink = Sink::default();
        read_quant(&mut sink, kind, seed);
        assert!(sink.errors.is_empty(), "kind {kind}: {:?}", sink.errors);
    }
}

// ---------------------------------------------------------------------------
// Pages

/// Verifies a block and, if it passes, decodes every record it claims.
fn read_block(sink: &mut Sink, block: &[u8], block_no: u64, geo: &PageGeometry) {
    match page::verify_block(block, block_no, geo) {
        Err(m) => sink.errors.push(Error::corrupt("pages.bin", m)),
        Ok(()) if geo.decoupled_vectors() && block_no >= geo.n_blocks => {
            // A vector page: every vector it claims is the layout's size.
            for slot in 0..page::block_records(block) {
                match geo.vector_at(block, slot) {
                    Ok(x) => assert_eq!(x.len(), geo.split_vector_bytes),
                    Err(m) => sink.errors.push(Error::corrupt("pages.bin", m)),
                }
            }
        }
        Ok(()) => {
            let nrec = page::block_records(block);
            for slot in 0..nrec {
                let rec = geo.record(block, slot);
                if let Some((v, nb)) = geo.split_record(rec) {
                    assert_eq!(v.len(), geo.vector_bytes);
                    assert!(page::ids(nb).count() <= geo.max_degree);
                } else {
                    sink.errors
                        .push(Error::corrupt("pages.bin", "degree above R"));
                }
                match geo.decode(block, slot) {
                    Ok(r) => {
                        assert_eq!(r.vector.len(), geo.vector_bytes);
                        assert!(r.neighbours.len() <= geo.max_degree);
                    }
                    Err(m) => sink.errors.push(Error::corrupt("pages.bin", m)),
                }
            }
        }
    }
}

/// Rewrites the CRC of every whole block so mutations reach the record
/// decoding behind the checksum.
fn reseal(bytes: &mut [u8], block_size: usize) {
    for b in bytes.chunks_exact_mut(block_size) {
        if b.len() >= page::PAGE_HEADER_BYTES {
            let crc = page::block_crc(b);
            b[12..16].copy_from_slice(&crc.to_le_bytes());
        }
    }
}

proptest! {
    #![proptest_config(config(384))]

    #[test]
    fn pages_never_panic(
        which in prop::sample::select(FIXES.to_vec()),
        block in 0u64..5,
        seal in prop_oneof![3 => Just(true), 1 => Just(false)],
        claimed in prop_oneof![4 => Just(None), 1 => any::<u64>().prop_map(Some)],
        muts in mutations(6),
    ) {
        let geo = fix_geometry(which);
        let pages = fix_file(which, "pages.bin");
        let bs = geo.block_size;
        let at = (block as usize * bs).min(pages.len().saturating_sub(bs));
        let mut input = apply(pages[at..at + bs].to_vec(), &muts);
        if seal {
            reseal(&mut input, bs);
        }
        let no = claimed.unwrap_or((at / bs) as u64);
        run("pages", &input, Limits::small(input.len()), |s| read_block(s, &input, no, &geo))?;
    }
}

// ---------------------------------------------------------------------------
// Whole index: one file mutated (checksums optionally fixed), then open and search

const INDEX_FILES: [&str; 8] = [
    "manifest.json",
    "pages.bin",
    "pq_codebook.bin",
    "pq_codes.bin",
    "ids.bin",
    "nav_graph.bin",
    "entry_centroids.bin",
    "id_to_location.bin",
];
const ENTRY_KINDS: [EntryChoice; 5] = [
    EntryChoice::Auto,
    EntryChoice::Medoid,
    EntryChoice::Sampled,
    EntryChoice::Nav,
    EntryChoice::Centroids,
];

/// Copies the fixture index `src` to `dst`, with `file` replaced by `bytes`;
/// with `fix`, the manifest's size and CRC32C of that section (and the page
/// CRCs) are made to match, and the manifest is resealed, so the mutation
/// reaches the parsers.
fn mutated_index(
    src: &Path,
    dst: &Path,
    file: &str,
    bytes: &[u8],
    fix: bool,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dst)?;
    for e in std::fs::read_dir(src)? {
        let e = e?;
        std::fs::copy(e.path(), dst.join(e.file_name()))?;
    }
    let mut bytes = bytes.to_vec();
    if fix && file != "manifest.json" {
        let text = std::fs::read(dst.join("manifest.json"))?;
        if let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&text) {
            if file == "pages.bin" {
                if let Some(bs) = v.pointer("/layout/block_size").and_then(|x| x.as_u64()) {
                    reseal(&mut bytes, bs as usize);
                }
            }
            if let Some(serde_json::Value::Object(secs)) = v.get_mut("sections") {
                for s in secs.values_mut() {
                    if s.get("file").and_then(|f| f.as_str()) == Some(file) {
                        s["bytes"] = serde_json::json!(bytes.len());
                        if !s["crc32c"].is_null() {
                            s["crc32c"] = serde_json::json!(crc32c::crc32c(&bytes));
                        }
                    }
                }
            }
            let text = serde_json::to_vec(&v).unwrap_or(text);
            std::fs::write(dst.join("manifest.json"), seal_manifest(&text))?;
        }
    }
    std::fs::write(dst.join(file), &bytes)
}

/// A budget the fixture indexes never reach (the budget binds: `None`
/// opens with the manifest's).
const ROOMY: Budget = Budget::Bytes(256 << 20);

#[allow(clippy::too_many_arguments)]
fn open_and_search(
    sink: &mut Sink,
    dir: &Path,
    entry: EntryChoice,
    cache: Option<usize>,
    budget: Option<Budget>,
    io: EngineKind,
    queries: &[f32],
) {
    let opts = OpenOptions {
        entry,
        entry_points: if entry == EntryChoice::Sampled { 16 } else { 0 },
        cache_nodes: cache,
        memory_budget: budget,
        threads: Some(1),
        io,
        ..Default::default()
    };
    if let Some(idx) = sink.take(Index::open(dir, &opts)) {
        let nq = queries.len() / FX_DIM;
        let search = SearchOptions {
            l: Some(20),
            w: Some(4),
            threads: Some(1),
            ..SearchOptions::new(5)
        };
        let _ = sink.take(idx.search(queries, nq, &search));
        let _ = idx.info();
    }
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn whole_index_never_panics(
        which in prop::sample::select(FIXES.to_vec()),
        file in 0usize..INDEX_FILES.len(),
        fix in prop_oneof![3 => Just(true), 1 => Just(false)],
        entry in 0usize..ENTRY_KINDS.len(),
        cache in prop::sample::select(vec![Some(0usize), Some(40), None]),
        budget in prop::sample::select(vec![Some(ROOMY), None]),
        io in prop::sample::select(vec![EngineKind::Pread, EngineKind::Auto]),
        jm in prop::collection::vec(json_mut(), 0..3),
        muts in mutations(4),
    ) {
        let f = fixture();
        let src = which.dir();
        let name = INDEX_FILES[file];
        let Ok(seed) = std::fs::read(src.join(name)) else {
            return Ok(()); // the shuffled and pq_coded fixtures have no ids, nav or centroids
        };
        let input = if name == "manifest.json" {
            let edited = apply_json(&seed, &jm);
            let edited = if fix { seal_manifest(&edited) } else { edited };
            apply(edited, &muts)
        } else {
            apply(seed, &muts)
        };
        let tmp = tempfile::tempdir().expect("tempdir");
        let dst = tmp.path().join("idx");
        mutated_index(src, &dst, name, &input, fix).expect("copy the fixture");
        let limits = Limits { alloc: 256 << 20, allow_engine: true, time: Duration::from_secs(20) };
        run("index", &input, limits, |s| {
            open_and_search(s, &dst, ENTRY_KINDS[entry], cache, budget, io, &f.queries)
        })?;
    }
}

#[test]
fn fixtures_open_and_search() {
    let f = fixture();
    for dir in [&f.id, &f.shuffled, &f.pq_coded, &f.page_graph] {
        for entry in ENTRY_KINDS {
            if dir != &f.id && matches!(entry, EntryChoice::Nav | EntryChoice::Centroids) {
                continue;
            }
            let mut sink = Sink::default();
            open_and_search(
                &mut sink,
                dir,
                entry,
                Some(40),
                Some(ROOMY),
                EngineKind::Pread,
                &f.queries,
            );
            assert!(sink.errors.is_empty(), "{entry:?}: {:?}", sink.errors);
        }
    }
}

// ---------------------------------------------------------------------------
// Seed corpora for the cargo-fuzz targets (see fuzz/README.md for the input
// encodings). Run by scripts/fuzz.sh:
//   NEARLINE_FUZZ_CORPUS=fuzz/corpus cargo test -p nearline --test fuzz_readers \
//       -- --ignored build_fuzz_corpus

fn u32le(v: usize) -> [u8; 4] {
    (v.min(u32::MAX as usize) as u32).to_le_bytes()
}

#[test]
#[ignore = "writes the fuzz seed corpora; run by scripts/fuzz.sh"]
fn build_fuzz_corpus() {
    let Some(root) = std::env::var_os("NEARLINE_FUZZ_CORPUS") else {
        panic!("set NEARLINE_FUZZ_CORPUS to the corpus directory");
    };
    let root = PathBuf::from(root);
    let put = |target: &str, name: String, bytes: &[u8]| {
        let d = root.join(target);
        std::fs::create_dir_all(&d).expect("corpus dir");
        std::fs::write(d.join(name), bytes).expect("seed");
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    // adjacency: [u16 n][u8 R][u8 chunk][u8 packed][section]
    for (chunk, packed) in [(0u8, 0u8), (6, 2), (255, 5)] {
        let mut b = vec![3u8, 0, 2, chunk, packed];
        b.extend(adjacency_seed());
        put("adjacency", format!("adj-{chunk}-{packed}"), &b);
    }
    // vectors: [extension selector][dtype selector][file]
    for (ei, ext) in VECTOR_EXTS.iter().enumerate() {
        for (ti, dt) in DTYPES.iter().enumerate() {
            for (n, d) in [(0usize, 3usize), (3, 4)] {
                let mut b = vec![ei as u8, ti as u8];
                b.extend(vector_seed(tmp.path(), ext, *dt, n, d));
                put("vectors", format!("{ext}-{dt}-{n}x{d}"), &b);
            }
        }
    }
    // npy: [dtype selector][file]
    let mut i = 0;
    for version in [1u8, 2, 3] {
        for (ti, dt) in DTYPES.iter().enumerate() {
            let s = NpySeed {
                version,
                descr: ["<f4", "<f2", "|u1", "|i1"][ti],
                fortran: "False",
                shape: if version == 3 {
                    "(2L, 3L)".into()
                } else {
                    "(2, 3)".into()
                },
                double_quotes: version == 2,
                reversed: version == 3,
                pad: 3,
                dtype: *dt,
                n: 2,
                d: 3,
            };
            let mut b = vec![ti as u8];
            b.extend(npy_bytes(&s));
            put("npy", format!("seed-{i}"), &b);
            i += 1;
        }
    }
    // ground_truth: [0 DiskANN bin | 1 ivecs | 2 range][file]
    for (kind, n, k, ids_only) in [
        (0usize, 3usize, 2usize, false),
        (0, 2, 2, true),
        (1, 3, 2, false),
    ] {
        let mut b = vec![kind as u8];
        b.extend(gt_input(tmp.path(), kind, n, k, ids_only, &[]));
        put("ground_truth", format!("gt-{kind}-{n}x{k}-{ids_only}"), &b);
    }
    for (counts, ids_only) in [(&[2u64, 0, 1][..], false), (&[1, 1][..], true)] {
        let mut b = vec![2u8];
        b.extend(gt_input(tmp.path(), 2, 0, 0, ids_only, counts));
        put(
            "ground_truth",
            format!("range-{}-{ids_only}", counts.len()),
            &b,
        );
    }
    // manifest: [flags: bit 0 reseal the checksum][text]
    for (name, shuffled) in [("id", false), ("shuffled", true)] {
        for flags in [0u8, 1] {
            let mut b = vec![flags];
            b.extend(fixture_file(shuffled, MANIFEST_FILE));
            put("manifest", format!("{name}-{flags}"), &b);
        }
    }
    // pq_codebook: the section
    put("pq_codebook", "small".into(), small_codebook());
    put(
        "pq_codebook",
        "fixture".into(),
        &fixture_file(false, "pq_codebook.bin"),
    );
    // nav_graph, entry_centroids: [dtype selector][u32 dim][u32 n][section]
    for (target, file) in [
        ("nav_graph", "nav_graph.bin"),
        ("entry_centroids", "entry_centroids.bin"),
    ] {
        let mut b = vec![0u8];
        b.extend(u32le(FX_DIM));
        b.extend(u32le(FX_N));
        b.extend(fixture_file(false, file));
        put(target, "fixture".into(), &b);
    }
    // id_to_location, page: [page size selector][u32 vector bytes][u32 R][u32 n] ...
    let geo_prefix = |b: &mut Vec<u8>| {
        b.push(0); // 4096
        b.extend(u32le(FX_DIM * 4));
        b.extend(u32le(8));
        b.extend(u32le(FX_N));
    };
    let mut b = Vec::new();
    geo_prefix(&mut b);
    b.extend(fixture_file(true, "id_to_location.bin"));
    put("id_to_location", "fixture".into(), &b);
    // quant_sections: [kind: 0 PCA, 1 rotation, 2 RaBitQ][section]
    for (kind, seed) in quant_seeds().iter().enumerate() {
        let mut b = vec![kind as u8];
        b.extend(seed);
        put("quant_sections", format!("kind-{kind}"), &b);
    }
    // page: ... [layout id][u32 block number][flags: bit 0 reseal][block]
    for shuffled in [false, true] {
        let geo = fixture_geometry(shuffled);
        let pages = fixture_file(shuffled, "pages.bin");
        for blk in [0usize, 4] {
            let mut b = Vec::new();
            geo_prefix(&mut b);
            b.push(geo.layout_id);
            b.extend(u32le(blk));
            b.push(1);
            b.extend(&pages[blk * geo.block_size..(blk + 1) * geo.block_size]);
            put(
                "page",
                format!("{}-{blk}", if shuffled { "shuffled" } else { "id" }),
                &b,
            );
        }
    }
    // index: [fixture: bit 0 shuffled][file selector][flags][patches]; an
    // empty patch list opens the fixture unchanged.
    for shuffled in [0u8, 1] {
        for file in 0..INDEX_FILES.len() as u8 {
            for flags in [
                0x01u8,
                0x03 | (2 << 2),
                0x01 | (3 << 2),
                0x01 | (4 << 2),
                0x21 | (1 << 2),
                0x41,
                0xc1,
                0xa1 | (3 << 2),
            ] {
                put(
                    "index",
                    format!("s{shuffled}-f{file}-x{flags:02x}"),
                    &[shuffled, file, flags],
                );
            }
        }
    }
    // A patch example: write 4 bytes at offset 24 of the manifest (flags
    // bit 0: resealed, so the edit reaches the checks behind the checksum).
    put(
        "index",
        "patch".into(),
        &[0, 0, 1, 0, 24, 0, 0, 0, 4, b'9', b'9', b'9', b'9'],
    );
}
