//! Inputs the fuzz targets (and `fuzz_readers`) found crashing a reader,
//! kept as regression tests: each must now give a clean error.

use nearline::data::matrix::Matrix;
use nearline::index::{build, BuildOptions, Index, OpenOptions};
use nearline::layout::format::Manifest;
use nearline::layout::page::PageGeometry;
use nearline::Error;
use std::path::Path;
use std::sync::atomic::AtomicBool;

/// A tiny index (50 points, 4-d) in `dir`; returns its manifest text.
fn tiny_index(dir: &Path) -> serde_json::Value {
    let data: Vec<f32> = (0..200).map(|i| ((i * 37) % 101) as f32 / 10.0).collect();
    let m = Matrix::from_vec(data, 50, 4).expect("matrix");
    let opts = BuildOptions {
        r: 8,
        build_l: 16,
        pq_bytes: Some(2),
        threads: Some(1),
        ..Default::default()
    };
    build(m, dir, &opts, &|_, _, _| {}, &AtomicBool::new(false)).expect("build");
    let text = std::fs::read(dir.join("manifest.json")).expect("manifest");
    serde_json::from_slice(&text).expect("manifest json")
}

fn is_corrupt<T>(r: nearline::Result<T>) -> bool {
    matches!(r, Err(Error::Corrupt { .. }))
}

/// Found by `manifest_never_panics`: `"dim": 18446744073709551615` made
/// `Manifest::validate` multiply `dim × element size` with overflow.
#[test]
fn manifest_with_huge_dim_is_corrupt_not_a_panic() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut v = tiny_index(&tmp.path().join("i"));
    for dim in [u64::MAX, 1 << 62, (1 << 62) + 1] {
        v["dim"] = serde_json::json!(dim);
        let text = serde_json::to_string(&v).expect("json");
        assert!(
            is_corrupt(Manifest::parse(Path::new("manifest.json"), &text)),
            "dim {dim}"
        );
    }
}

/// Found by `manifest_never_panics`: a dimension just below the overflow of
/// the element size (`"dim": 4611686018427387903`, f32) overflowed the block
/// size in `PageGeometry::new` (record + header rounded up to pages).
#[test]
fn page_geometry_of_a_huge_record_is_an_error() {
    for vb in [
        usize::MAX,
        usize::MAX - 3,
        usize::MAX - 20,
        usize::MAX / 4 * 4 - 8,
    ] {
        for r in [1, 8, 65535] {
            assert!(
                matches!(
                    PageGeometry::new(4096, vb, r, 1),
                    Err(Error::InvalidArgument(_))
                ),
                "vector bytes {vb}, R {r}"
            );
        }
    }
    // The largest record that still fits: a whole number of pages.
    let g = PageGeometry::new(4096, 1 << 40, 8, 1).expect("1 TiB record");
    assert_eq!(g.block_size % 4096, 0);
}

/// Found reviewing what `Index::open` does with a manifest the parser
/// accepts (random mutation rarely makes `n` and `layout.n_blocks` agree): a
/// node count near `usize::MAX` overflowed `PageGeometry::file_bytes`, which
/// open compares with the page file's size.
#[test]
fn index_with_huge_node_count_is_corrupt_not_a_panic() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("i");
    let mut v = tiny_index(&dir);
    let n = u64::MAX - 1;
    let rpb = v["layout"]["records_per_block"].as_u64().expect("rpb");
    v["n"] = serde_json::json!(n);
    v["layout"]["n_blocks"] = serde_json::json!(n.div_ceil(rpb));
    let text = serde_json::to_string(&v).expect("json");
    let m = Manifest::parse(Path::new("manifest.json"), &text).expect("consistent manifest");
    let geo = PageGeometry::new(4096, 16, 8, m.n).expect("geometry");
    assert_eq!(geo.file_bytes(), u64::MAX);
    std::fs::write(dir.join("manifest.json"), text).expect("write");
    assert!(is_corrupt(Index::open(&dir, &OpenOptions::default())));
}

/// Found reviewing the section reads behind the `index` target: a manifest
/// naming a character device as a section (`"file": "/dev/zero"`) made
/// `Index::open` read it to the end, which never comes: memory grows until
/// the process dies. The size the manifest records is now checked against
/// the file's before reading, and no more than that is read.
#[test]
fn section_naming_an_endless_file_is_refused_without_reading_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("i");
    let mut v = tiny_index(&dir);
    v["sections"]["pq_codebook"]["file"] = serde_json::json!("/dev/zero");
    std::fs::write(dir.join("manifest.json"), v.to_string()).expect("write");
    assert!(is_corrupt(Index::open(&dir, &OpenOptions::default())));
    // Recorded as empty: nothing is read, and the empty codebook is refused.
    v["sections"]["pq_codebook"]["bytes"] = serde_json::json!(0);
    std::fs::write(dir.join("manifest.json"), v.to_string()).expect("write");
    assert!(Index::open(&dir, &OpenOptions::default()).is_err());
}
