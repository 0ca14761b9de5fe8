//! Harnesses of the fuzz targets: one function per reader, taking the raw
//! fuzz input. A reader may accept an input or refuse it with a clean error
//! (`Format`, `Corrupt`, `InvalidArgument`, `Version`, `Io`); anything else
//! (a panic, another error kind, an accepted value that breaks its own
//! invariants) panics here, which libFuzzer reports as a crash.
//!
//! Input encodings (the seeds `build_fuzz_corpus` writes follow them; all
//! integers little-endian):
//!
//! | target | input |
//! |---|---|
//! | `vectors` | `[ext][dtype][file]`: ext picks one of [`VECTOR_EXTS`]; dtype bit 2 set: a dtype hint `DTYPES[dtype & 3]` |
//! | `npy` | `[dtype][file]`: as `vectors`, always `.npy` |
//! | `ground_truth` | `[kind][file]`: kind % 3: DiskANN `gt.bin`, `gt.ivecs`, range `range.bin` |
//! | `manifest` | `[flags][text]`: flags bit 0: give the text a valid checksum first |
//! | `pq_codebook` | the section |
//! | `nav_graph`, `entry_centroids` | `[dtype][u32 dim][u32 n][section]` |
//! | `id_to_location` | `[page size][u32 vector bytes][u32 R][u32 n][section]` |
//! | `page` | `[page size][u32 vector bytes][u32 R][u32 n][layout id][u32 block no][flags][block]`; flags bit 0: reseal the CRC |
//! | `quant_sections` | `[kind][section]`: kind % 3: PCA, rotation, RaBitQ |
//! | `adjacency` | `[u16 n][u8 R][u8 chunk][u8 packed][section]`: the adjacency section fed in chunks of `chunk + 1` bytes, and the same bytes decoded as a replicated record with `packed` lists |
//! | `index` | `[fixture][file][flags][ops]`; see [`index`] |
//! | `partition_state` | a partition index's state file (`state-G.bin`) |
//! | `posting` | `[u16 dim][u32 count][blocks]`: posting blocks of posting 7 and the entries they hold |
//! | `wal` | a write-ahead log file: a reader's tail, then a writer's open with its repair, each record decoded |

use nearline::data::files;
use nearline::format::page::{self, PageGeometry};
use nearline::format::{LayoutKind, Manifest, MANIFEST_FILE};
use nearline::index::{build, Index};
use nearline::io::EngineKind;
use nearline::layout::{Layout, ShuffledLayout};
use nearline::planner::{BuildOptions, EntryChoice, OpenOptions, SearchOptions};
use nearline::quant::pq::PQ_CENTROIDS;
use nearline::util::Budget;
use nearline::{DType, Element, Error, Metric};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::OnceLock;

/// Extensions of the `vectors` target, by selector.
pub const VECTOR_EXTS: [&str; 10] = [
    "fbin", "f16bin", "hbin", "u8bin", "i8bin", "bin", "fvecs", "bvecs", "ivecs", "npy",
];
/// Element types, by selector.
pub const DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::U8, DType::I8];
const PAGE_SIZES: [usize; 3] = [4096, 8192, 16384];

/// `Some(value)`, `None` for a clean error; panics on any other error.
fn ok<T>(what: &str, r: nearline::Result<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(
            Error::Format { .. }
            | Error::Corrupt { .. }
            | Error::InvalidArgument(_)
            | Error::Version { .. }
            | Error::Io { .. },
        ) => None,
        Err(e) => panic!("{what}: unexpected error kind {e:?}"),
    }
}

/// A temporary directory in memory where there is one: the file readers
/// take paths, and rewriting a file on a disk file system each run (ext4
/// flushes a truncated-and-rewritten file on close) costs most of the time.
fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("nearline-fuzz")
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("a temporary directory")
}

/// A scratch directory for this process (inputs are written to files there).
fn scratch() -> &'static Path {
    static D: OnceLock<tempfile::TempDir> = OnceLock::new();
    D.get_or_init(temp_dir).path()
}

fn write_input(name: &str, bytes: &[u8]) -> PathBuf {
    let p = scratch().join(name);
    std::fs::write(&p, bytes).expect("write the input file");
    p
}

/// Little-endian u32 at `at`, 0 past the end.
fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    for (i, x) in w.iter_mut().enumerate() {
        *x = b.get(at + i).copied().unwrap_or(0);
    }
    u32::from_le_bytes(w)
}

// ---------------------------------------------------------------------------
// Vector files and ground truth

fn open_all(path: &Path, hint: Option<DType>) {
    if let Some(info) = ok("probe", files::probe(path, hint)) {
        assert!(info.dim >= 1, "probe accepted dim 0");
    }
    fn open<T: Element>(path: &Path) {
        if let Some(m) = ok("open_vectors", files::open_vectors::<T>(path)) {
            assert_eq!(m.as_slice().len(), m.n() * m.dim());
            if m.n() > 0 {
                let last = m.row(m.n() - 1);
                assert_eq!(last.len(), m.dim());
            }
        }
    }
    open::<f32>(path);
    open::<half::f16>(path);
    open::<u8>(path);
    open::<i8>(path);
}

fn hint(sel: u8) -> Option<DType> {
    (sel & 4 != 0).then(|| DTYPES[(sel & 3) as usize])
}

/// `files::probe` and `files::open_vectors` for every element type.
pub fn vectors(data: &[u8]) {
    let [ext, dt, rest @ ..] = data else { return };
    let ext = VECTOR_EXTS[*ext as usize % VECTOR_EXTS.len()];
    let path = write_input(&format!("input.{ext}"), rest);
    open_all(&path, hint(*dt));
}

/// As [`vectors`], always an `.npy` file (header parsing).
pub fn npy(data: &[u8]) {
    let [dt, rest @ ..] = data else { return };
    let path = write_input("input.npy", rest);
    open_all(&path, hint(*dt));
}

/// `files::read_ground_truth` and `files::read_range_ground_truth`.
pub fn ground_truth(data: &[u8]) {
    let [kind, rest @ ..] = data else { return };
    let name = ["gt.bin", "gt.ivecs", "range.bin"][*kind as usize % 3];
    let path = write_input(name, rest);
    if let Some(gt) = ok("read_ground_truth", files::read_ground_truth(&path)) {
        assert_eq!(gt.ids.len(), gt.n * gt.k);
        assert!(gt.distances.is_empty() || gt.distances.len() == gt.ids.len());
    }
    if name != "gt.ivecs" {
        if let Some(gt) = ok(
            "read_range_ground_truth",
            files::read_range_ground_truth(&path),
        ) {
            if let Err(e) = gt.validate() {
                panic!("an accepted range ground truth fails validate: {e}");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Index sections

/// Gives manifest text a valid checksum (the CRC32C of the canonical JSON
/// without the field, as `Manifest::to_text` computes it) so that edits
/// reach the checks behind it; text that is not a JSON object is returned
/// as it is.
pub fn seal_manifest(text: &[u8]) -> Vec<u8> {
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

/// `Manifest::parse`, then what `Index::open` derives from an accepted
/// manifest: the page geometry and the open plan (the memory split over
/// the manifest's sizes), with the manifest's budget and a roomy one.
/// Input `[flags][text]`; flags bit 0 reseals the text's checksum first.
pub fn manifest(data: &[u8]) {
    let [flags, text @ ..] = data else { return };
    let sealed;
    let text = if flags & 1 != 0 {
        sealed = seal_manifest(text);
        &sealed[..]
    } else {
        text
    };
    let text = String::from_utf8_lossy(text);
    if let Some(m) = ok(
        "Manifest::parse",
        Manifest::parse(Path::new(MANIFEST_FILE), &text),
    ) {
        if let Some(g) = ok("planner::geometry", nearline::planner::geometry(&m)) {
            let _ = g.file_bytes();
        }
        for budget in [None, Some(Budget::Bytes(256 << 20))] {
            let opts = OpenOptions {
                memory_budget: budget,
                ..Default::default()
            };
            let _ = ok("plan_open", nearline::planner::plan_open(&opts, &m));
        }
    }
}

/// `format::pq::decode`; an accepted codebook is used as search uses it.
pub fn pq_codebook(data: &[u8]) {
    let Some(cb) = ok(
        "format::pq::decode",
        nearline::format::pq::decode(Path::new("pq_codebook.bin"), data),
    ) else {
        return;
    };
    let (dim, m) = (cb.dim(), cb.m());
    if dim > 1 << 16 {
        return; // valid, but too slow to exercise per input
    }
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

fn nav_as<T: Element>(b: &[u8], dim: usize, n: usize) {
    let p = Path::new("nav_graph.bin");
    if let Some(g) = ok(
        "format::nav::decode",
        nearline::format::nav::decode::<T>(p, b, dim, n),
    ) {
        assert!(g.len() <= n && g.ids().iter().all(|&v| (v as usize) < n));
    }
}

/// `format::nav::decode::<T>`.
pub fn nav_graph(data: &[u8]) {
    if data.len() < 9 {
        return;
    }
    let (dim, n) = (u32_at(data, 1) as usize, u32_at(data, 5) as usize);
    let b = &data[9..];
    match DTYPES[data[0] as usize % 4] {
        DType::F32 => nav_as::<f32>(b, dim, n),
        DType::F16 => nav_as::<half::f16>(b, dim, n),
        DType::U8 => nav_as::<u8>(b, dim, n),
        DType::I8 => nav_as::<i8>(b, dim, n),
    }
}

fn centroids_as<T: Element>(b: &[u8], dim: usize, n: usize) {
    let p = Path::new("entry_centroids.bin");
    if let Some((ids, vecs)) = ok(
        "format::entries::decode_centroids",
        nearline::format::entries::decode_centroids::<T>(p, b, dim, n),
    ) {
        assert!(ids.iter().all(|&v| (v as usize) < n));
        assert_eq!(vecs.len(), ids.len() * dim);
    }
}

/// `format::entries::decode_centroids::<T>`.
pub fn entry_centroids(data: &[u8]) {
    if data.len() < 9 {
        return;
    }
    let (dim, n) = (u32_at(data, 1) as usize, u32_at(data, 5) as usize);
    let b = &data[9..];
    match DTYPES[data[0] as usize % 4] {
        DType::F32 => centroids_as::<f32>(b, dim, n),
        DType::F16 => centroids_as::<half::f16>(b, dim, n),
        DType::U8 => centroids_as::<u8>(b, dim, n),
        DType::I8 => centroids_as::<i8>(b, dim, n),
    }
}

/// The geometry prefix `[page size][u32 vector bytes][u32 R][u32 n]`.
fn geometry(data: &[u8]) -> Option<(PageGeometry, usize)> {
    if data.len() < 13 {
        return None;
    }
    let ps = PAGE_SIZES[data[0] as usize % 3];
    let (vb, r, n) = (
        u32_at(data, 1) as usize,
        u32_at(data, 5) as usize,
        u32_at(data, 9) as usize,
    );
    PageGeometry::new(ps, vb, r, n).ok().map(|g| (g, n))
}

/// `ShuffledLayout::from_section` (`format::location::decode`, then the
/// layout's own checks); an accepted map is walked both ways.
pub fn id_to_location(data: &[u8]) {
    let Some((geo, n)) = geometry(data) else {
        return;
    };
    let p = Path::new("id_to_location.bin");
    let Some(l) = ok(
        "ShuffledLayout::from_section",
        ShuffledLayout::from_section(p, &data[13..], geo, n),
    ) else {
        return;
    };
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

/// `format::adjacency::Parser` on a section fed in chunks (every entry it
/// accepts names nodes below n with at most R neighbours, each node once),
/// and `PageGeometry::decode_packed` of the same bytes as a record of a
/// replicated layout. Input `[u16 n][u8 R][u8 chunk][u8 packed][section]`.
pub fn adjacency(data: &[u8]) {
    if data.len() < 5 {
        return;
    }
    let n = u16::from_le_bytes([data[0], data[1]]) as usize;
    let (r, chunk, packed) = (
        data[2] as usize,
        data[3] as usize + 1,
        data[4] as usize % 32,
    );
    let body = &data[5..];
    let mut p = nearline::format::adjacency::Parser::new(Path::new("adjacency.bin"), n, r);
    let mut seen = std::collections::HashSet::new();
    let mut fed = Ok(());
    for c in body.chunks(chunk) {
        fed = p.feed(c, &mut |v, list| {
            assert!((v as usize) < n && list.len() <= r);
            assert!(list.iter().all(|&u| (u as usize) < n));
            assert!(seen.insert(v), "node {v} accepted twice");
        });
        if fed.is_err() {
            break;
        }
    }
    if ok("Parser::feed", fed).is_some() && ok("Parser::finish", p.finish()).is_some() {
        assert_eq!(seen.len(), n);
    }
    // The same bytes as a replicated record: 4-byte vectors, degree bound r.
    if let Ok(geo) = PageGeometry::with_packed(4096, 4, r.max(1), packed, n.max(1)) {
        if body.len() >= geo.record_size {
            let rec = &body[..geo.record_size];
            let words: Vec<u8> = rec.to_vec();
            if let Ok(pk) = geo.decode_packed(&words) {
                assert!(pk.len() <= geo.packed);
                for i in 0..pk.len() {
                    if let Some((_, list)) = pk.get(i) {
                        assert!(list.len() <= geo.max_degree);
                    }
                }
            }
        }
    }
}

/// `page::verify_block`, then `PageGeometry::split_record` and
/// `PageGeometry::decode` on every record a verified block claims.
pub fn page(data: &[u8]) {
    let Some((geo, _)) = geometry(data) else {
        return;
    };
    if data.len() < 19 {
        return;
    }
    let geo = geo.with_layout_id(data[13]);
    let block_no = u32_at(data, 14) as u64;
    let mut block = data[19..].to_vec();
    if data[18] & 1 != 0 && block.len() >= page::PAGE_HEADER_BYTES {
        let crc = page::block_crc(&block[..geo.block_size.min(block.len())]);
        block[12..16].copy_from_slice(&crc.to_le_bytes());
    }
    if page::verify_block(&block, block_no, &geo).is_err() {
        return;
    }
    let nrec = page::block_records(&block);
    for slot in 0..nrec {
        let rec = geo.record(&block, slot);
        if let Some((v, nb)) = geo.split_record(rec) {
            assert_eq!(v.len(), geo.vector_bytes);
            assert!(page::ids(nb).count() <= geo.max_degree);
        }
        if let Ok(r) = geo.decode(&block, slot) {
            assert_eq!(r.vector.len(), geo.vector_bytes);
            assert!(r.neighbours.len() <= geo.max_degree);
        }
    }
}

/// `format::quant::{decode_pca, decode_rotation, decode_rabitq}`; an
/// accepted value transforms, rotates, encodes and prepares a query.
/// Input `[kind][section]`, kind % 3: PCA, rotation, RaBitQ.
pub fn quant_sections(data: &[u8]) {
    let [kind, b @ ..] = data else { return };
    let p = Path::new("quant.bin");
    match kind % 3 {
        0 => {
            if let Some(pca) = ok("decode_pca", nearline::format::quant::decode_pca(p, b)) {
                let d = pca.dim();
                assert!(pca.principal() <= d);
                let x = vec![0.5f32; d];
                let (mut y, mut back) = (vec![0f32; d], vec![0f32; d]);
                let _ = ok("Pca::transform", pca.transform(&x, &mut y));
                let _ = ok(
                    "Pca::inverse_transform",
                    pca.inverse_transform(&y, &mut back),
                );
            }
        }
        1 => {
            if let Some(r) = ok(
                "decode_rotation",
                nearline::format::quant::decode_rotation(p, b),
            ) {
                let d = r.dim();
                let x = vec![0.5f32; d];
                let (mut y, mut back) = (vec![0f32; d], vec![0f32; d]);
                let _ = ok("Rotation::apply", r.apply(&x, &mut y));
                let _ = ok("Rotation::apply_inverse", r.apply_inverse(&y, &mut back));
            }
        }
        _ => {
            if let Some(q) = ok(
                "decode_rabitq",
                nearline::format::quant::decode_rabitq(p, b),
            ) {
                let d = q.dim();
                let (o, c) = (vec![0.5f32; d], vec![0.25f32; d]);
                let mut code = vec![0u8; q.code_bytes()];
                let _ = ok("RaBitQ::encode", q.encode(&o, &c, &mut code));
                let _ = ok("RaBitQ::prepare_query", q.prepare_query(&o));
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Whole index

/// Files of the fixture indexes, by selector.
pub const INDEX_FILES: [&str; 8] = [
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
/// A budget the fixture indexes never reach (the budget binds).
const ROOMY: Budget = Budget::Bytes(256 << 20);
const FX_N: usize = 300;
const FX_DIM: usize = 8;

struct Fixtures {
    _tmp: tempfile::TempDir,
    /// [ID layout with ids, navigation graph and centroid entries; shuffled layout].
    dirs: [PathBuf; 2],
    work: PathBuf,
}

/// Deterministic pseudo-random rows in [-4, 4).
fn rows(n: usize, d: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n * d)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
        })
        .collect()
}

fn fixtures() -> &'static Fixtures {
    static F: OnceLock<Fixtures> = OnceLock::new();
    F.get_or_init(|| {
        let tmp = temp_dir();
        let never = AtomicBool::new(false);
        let base = rows(FX_N, FX_DIM, 5);
        let id_opts = BuildOptions {
            r: Some(8),
            build_l: Some(20),
            pq_bytes: Some(4),
            threads: Some(1),
            ids: Some((0..FX_N as u64).map(|i| 5000 + 3 * i).collect()),
            nav_sample: Some(0.05),
            entry_clusters: Some(4),
            layout: Some(LayoutKind::Id),
            ..Default::default()
        };
        let shuffled_opts = BuildOptions {
            layout: Some(LayoutKind::Shuffled),
            ids: None,
            nav_sample: Some(0.0),
            entry_clusters: Some(0),
            ..id_opts.clone()
        };
        let dirs = [tmp.path().join("id"), tmp.path().join("shuffled")];
        for (dir, opts) in dirs.iter().zip([id_opts, shuffled_opts]) {
            let m = nearline::data::matrix::Matrix::from_vec(base.clone(), FX_N, FX_DIM)
                .expect("fixture matrix");
            build(m, dir, &opts, &|_, _, _| {}, &never).expect("build a fixture index");
        }
        Fixtures {
            work: tmp.path().join("work"),
            _tmp: tmp,
            dirs,
        }
    })
}

/// Applies the patch operations: `[op][u32 offset][u8 len][len bytes]`
/// repeated; op % 3: 0 overwrite at offset (mod length + 1), 1 truncate to
/// offset (mod length + 1), 2 append.
fn patch(mut file: Vec<u8>, mut ops: &[u8]) -> Vec<u8> {
    while ops.len() >= 6 {
        let (op, off, len) = (ops[0] % 3, u32_at(ops, 1) as usize, ops[5] as usize);
        let bytes = &ops[6..(6 + len).min(ops.len())];
        ops = &ops[(6 + len).min(ops.len())..];
        let at = off % (file.len() + 1);
        match op {
            0 => {
                for (i, &b) in bytes.iter().enumerate() {
                    match file.get_mut(at + i) {
                        Some(x) => *x = b,
                        None => file.push(b),
                    }
                }
            }
            1 => file.truncate(at),
            _ => file.extend_from_slice(bytes),
        }
    }
    file
}

/// Whole index: `[fixture][file][flags][ops]`. Fixture bit 0 picks the
/// shuffled-layout index; `file` one of [`INDEX_FILES`], patched by `ops`
/// (see [`patch`]). Flags: bit 0 makes the checksums match the patched file
/// so the parsers behind them are reached (a patched manifest is resealed;
/// for another file, the manifest's size and CRC32C of that section and the
/// page CRCs are fixed, and the manifest resealed); bit 1 uses io_uring
/// (pread otherwise); bits 2-4 the entry kind; bits 5-6 the node cache:
/// none, 40 nodes, or what the budget leaves; bit 7 opens with the
/// manifest's memory budget (a roomy 256 MiB otherwise). Then
/// `Index::open` and a search: any result but a panic is fine.
pub fn index(data: &[u8]) {
    let [fixture, file, flags, ops @ ..] = data else {
        return;
    };
    let f = fixtures();
    let src = &f.dirs[(*fixture & 1) as usize];
    let name = INDEX_FILES[*file as usize % INDEX_FILES.len()];
    let Ok(orig) = std::fs::read(src.join(name)) else {
        return; // the shuffled index has no ids, navigation graph or centroids
    };
    let mut bytes = patch(orig, ops);
    let _ = std::fs::remove_dir_all(&f.work);
    std::fs::create_dir_all(&f.work).expect("work directory");
    for e in std::fs::read_dir(src).expect("fixture listing") {
        let e = e.expect("fixture entry");
        std::fs::copy(e.path(), f.work.join(e.file_name())).expect("copy the fixture");
    }
    if flags & 1 != 0 {
        if name == MANIFEST_FILE {
            bytes = seal_manifest(&bytes);
        } else {
            let text = std::fs::read(f.work.join(MANIFEST_FILE)).expect("fixture manifest");
            let mut v: serde_json::Value = serde_json::from_slice(&text).expect("fixture json");
            if name == "pages.bin" {
                let bs = v["layout"]["block_size"].as_u64().unwrap_or(4096) as usize;
                for b in bytes.chunks_exact_mut(bs) {
                    let crc = page::block_crc(b);
                    b[12..16].copy_from_slice(&crc.to_le_bytes());
                }
            }
            if let Some(secs) = v["sections"].as_object_mut() {
                for s in secs.values_mut() {
                    if s["file"].as_str() == Some(name) {
                        s["bytes"] = serde_json::json!(bytes.len());
                        if !s["crc32c"].is_null() {
                            s["crc32c"] = serde_json::json!(crc32c::crc32c(&bytes));
                        }
                    }
                }
            }
            let text = serde_json::to_vec(&v).expect("manifest json");
            std::fs::write(f.work.join(MANIFEST_FILE), seal_manifest(&text))
                .expect("write the manifest");
        }
    }
    std::fs::write(f.work.join(name), &bytes).expect("write the patched file");
    let entry = ENTRY_KINDS[((flags >> 2) & 7) as usize % ENTRY_KINDS.len()];
    let opts = OpenOptions {
        entry,
        entry_points: if entry == EntryChoice::Sampled { 16 } else { 0 },
        cache_nodes: match flags >> 5 & 3 {
            0 => Some(0),
            1 => Some(40),
            _ => None, // what the budget leaves
        },
        memory_budget: if flags & 0x80 != 0 { None } else { Some(ROOMY) },
        threads: Some(1),
        io: if flags & 2 != 0 {
            EngineKind::Auto
        } else {
            EngineKind::Pread
        },
        ..Default::default()
    };
    let Some(idx) = ok_or_engine("Index::open", Index::open(&f.work, &opts)) else {
        return;
    };
    let q = rows(3, FX_DIM, 77);
    let search = SearchOptions {
        l: Some(20),
        w: Some(4),
        threads: Some(1),
        ..SearchOptions::new(5)
    };
    let _ = ok_or_engine("Index::search", idx.search(&q, 3, &search));
    let _ = idx.info();
}

/// As [`ok`], and an I/O engine that cannot be set up here is fine too.
fn ok_or_engine<T>(what: &str, r: nearline::Result<T>) -> Option<T> {
    match r {
        Err(Error::Engine(_)) => None,
        r => ok(what, r),
    }
}

/// `partition::state::State::decode`; an accepted state re-encodes to
/// itself.
pub fn partition_state(data: &[u8]) {
    use nearline::partition::state::State;
    let p = Path::new("state-1.bin");
    if let Some(st) = ok("State::decode", State::decode(p, data)) {
        assert_eq!(st.versions.len(), st.external.len());
        assert_eq!(st.head_alive.len(), st.postings.len());
        let again = st.encode();
        assert_eq!(State::decode(p, &again).ok(), Some(st));
    }
}

/// `partition::posting::decode_run` over the input as blocks of posting 7,
/// then the entries the stream holds.
pub fn posting(data: &[u8]) {
    use nearline::partition::posting;
    let [d0, d1, c0, c1, c2, c3, blocks @ ..] = data else {
        return;
    };
    let dim = (u16::from_le_bytes([*d0, *d1]) as usize).max(1);
    let count = u32::from_le_bytes([*c0, *c1, *c2, *c3]) as usize;
    let n = blocks.len().div_ceil(posting::BLOCK).max(1) as u32;
    let mut stream = Vec::new();
    let r = posting::decode_run(Path::new("postings.dat"), 7, (0, 0, n), blocks, &mut stream);
    if ok("posting::decode_run", r).is_some() {
        let e = posting::entry_bytes(dim);
        let mut v = vec![0f32; dim];
        for i in 0..count.min(stream.len() / e) {
            posting::read_entry(&stream, dim, i, &mut v);
        }
    }
}

/// A write-ahead log: `update::tail::WalTail` reads it, then `Wal::open`
/// (which repairs a torn tail) opens it; every record is decoded.
pub fn wal(data: &[u8]) {
    use nearline::update::tail::WalTail;
    use nearline::update::wal::{Durability, Op, Wal};
    let Ok(dir) = tempfile::tempdir() else { return };
    let path = dir.path().join("wal.log");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    if let Some(mut t) = ok("WalTail::open", WalTail::open(&path)) {
        let mut records = Vec::new();
        let r = t.read_new(0, &mut |r| {
            records.push(r);
            Ok(())
        });
        let _ = ok("WalTail::read_new", r);
        for r in &records {
            let _ = ok("Op::decode", Op::decode(r, &path));
        }
    }
    if let Some((_, records)) = ok("Wal::open", Wal::open(&path, Durability::Buffered)) {
        for r in &records {
            let _ = ok("Op::decode", Op::decode(r, &path));
        }
    }
}
