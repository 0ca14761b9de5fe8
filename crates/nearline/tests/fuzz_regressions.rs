//! Inputs the fuzz targets (and `fuzz_readers`) found crashing a reader,
//! kept as regression tests: each must now give a clean error.

use nearline::data::matrix::Matrix;
use nearline::format::{Manifest, PageGeometry, Preset, MANIFEST_FILE};
use nearline::index::{build, Index};
use nearline::planner::{BuildOptions, OpenOptions, PresetChoice};
use nearline::util::Budget;
use nearline::Error;
use std::path::Path;
use std::sync::atomic::AtomicBool;

/// A tiny index (50 points, 4-d, the DiskANN composition: ID layout) in
/// `dir`; returns its manifest's JSON.
fn tiny_index(dir: &Path) -> serde_json::Value {
    let data: Vec<f32> = (0..200).map(|i| ((i * 37) % 101) as f32 / 10.0).collect();
    let m = Matrix::from_vec(data, 50, 4).expect("matrix");
    let opts = BuildOptions {
        preset: PresetChoice::Named(Preset::Diskann),
        r: Some(8),
        build_l: Some(16),
        pq_bytes: Some(2),
        threads: Some(1),
        ..Default::default()
    };
    build(m, dir, &opts, &|_, _, _| {}, &AtomicBool::new(false)).expect("build");
    let text = std::fs::read(dir.join(MANIFEST_FILE)).expect("manifest");
    serde_json::from_slice(&text).expect("manifest json")
}

/// The manifest text of `v` with a valid checksum (the CRC32C of the
/// canonical JSON without the field, as `Manifest::to_text` computes it),
/// so the edit reaches the checks behind the checksum.
fn sealed(v: &serde_json::Value) -> String {
    let mut v = v.clone();
    let o = v.as_object_mut().expect("manifest object");
    o.remove("checksum");
    let c = format!("crc32c:{:08x}", crc32c::crc32c(v.to_string().as_bytes()));
    v.as_object_mut()
        .expect("manifest object")
        .insert("checksum".into(), c.into());
    serde_json::to_string_pretty(&v).expect("json")
}

fn parse(v: &serde_json::Value) -> nearline::Result<Manifest> {
    Manifest::parse(Path::new(MANIFEST_FILE), &sealed(v))
}

/// Opens with a budget the tiny index never reaches (the budget binds).
fn open(dir: &Path) -> nearline::Result<Index> {
    Index::open(
        dir,
        &OpenOptions {
            memory_budget: Some(Budget::Bytes(256 << 20)),
            ..Default::default()
        },
    )
}

fn is_corrupt<T>(r: nearline::Result<T>) -> bool {
    matches!(r, Err(Error::Corrupt { .. }))
}

#[test]
fn the_tiny_index_opens() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("i");
    let v = tiny_index(&dir);
    parse(&v).expect("the sealed manifest parses");
    open(&dir).expect("the tiny index opens");
}

/// Found by `manifest_never_panics`: `"dim": 18446744073709551615` made
/// `Manifest::validate` multiply `dim × element size` with overflow.
#[test]
fn manifest_with_huge_dim_is_corrupt_not_a_panic() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut v = tiny_index(&tmp.path().join("i"));
    for dim in [u64::MAX, 1 << 62, (1 << 62) + 1, (1 << 62) - 1] {
        v["dim"] = serde_json::json!(dim);
        assert!(is_corrupt(parse(&v)), "dim {dim}");
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
/// open compares with the page file's size (and, since the memory budget
/// binds, the planner's sizes of what an open holds: the raw vectors, the
/// ids). `file_bytes` saturates, and a manifest claiming more nodes than
/// u32 ids can name, or a page file longer than any file can be, is
/// corrupt.
#[test]
fn index_with_huge_node_count_is_corrupt_not_a_panic() {
    let geo = PageGeometry::new(4096, 16, 8, usize::MAX - 1).expect("geometry");
    assert_eq!(geo.file_bytes(), u64::MAX);
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("i");
    let mut v = tiny_index(&dir);
    let rpb = v["layout"]["records_per_block"].as_u64().expect("rpb");
    let bs = v["layout"]["block_size"].as_u64().expect("block size");
    let set_n = |v: &mut serde_json::Value, n: u64| {
        v["n"] = serde_json::json!(n);
        v["layout"]["n_blocks"] = serde_json::json!(n.div_ceil(rpb));
    };
    for n in [u64::MAX - 1, u64::MAX / bs * rpb, u32::MAX as u64] {
        set_n(&mut v, n);
        assert!(is_corrupt(parse(&v)), "n {n}");
        std::fs::write(dir.join(MANIFEST_FILE), sealed(&v)).expect("write");
        assert!(is_corrupt(open(&dir)), "n {n}");
    }
    // The most nodes a manifest may claim: it parses, and open refuses the
    // index (its page file is far shorter) without overflowing.
    set_n(&mut v, u32::MAX as u64 - 1);
    parse(&v).expect("2^32 - 2 nodes");
    std::fs::write(dir.join(MANIFEST_FILE), sealed(&v)).expect("write");
    assert!(open(&dir).is_err());
}

/// Found by `manifest_never_panics` once manifests were resealed: a
/// manifest recording `"pq_bytes": 9223372036854775807` overflowed the
/// planner's size of the PQ codebook. Reading the planner for more of the
/// kind: a navigation graph or centroid section recording a size near
/// `u64::MAX` overflowed its sum of what an open holds (the sum now
/// saturates too). A build writes `pq_bytes` in 1..=dim, a dimension that
/// fits the sections' u32 and no file longer than `i64::MAX` bytes: other
/// values are corrupt.
#[test]
fn manifest_with_impossible_sizes_is_corrupt_not_a_panic() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("i");
    let v = tiny_index(&dir);
    for pq in [0u64, 5, 1 << 32, i64::MAX as u64, u64::MAX] {
        let mut w = v.clone();
        w["spec"]["pq_bytes"] = serde_json::json!(pq);
        assert!(is_corrupt(parse(&w)), "pq_bytes {pq}");
    }
    for s in ["pages", "pq_codebook", "pq_codes"] {
        let mut w = v.clone();
        w["sections"][s]["bytes"] = serde_json::json!(u64::MAX);
        assert!(is_corrupt(parse(&w)), "{s}");
    }
    let mut w = v.clone();
    w["dim"] = serde_json::json!(u32::MAX as u64 + 1);
    assert!(is_corrupt(parse(&w)));
}

/// Found reviewing the section reads behind the `index` target: a manifest
/// naming a character device as a section (`"file": "/dev/zero"`) made
/// `Index::open` read it to the end, which never comes: memory grows until
/// the process dies. The size the manifest records is now checked against
/// the file's before reading, and no more than that is read; a section
/// that is not a regular file is refused before it is opened.
#[test]
fn section_naming_an_endless_file_is_refused_without_reading_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("i");
    let mut v = tiny_index(&dir);
    v["sections"]["pq_codebook"]["file"] = serde_json::json!("/dev/zero");
    std::fs::write(dir.join(MANIFEST_FILE), sealed(&v)).expect("write");
    assert!(is_corrupt(open(&dir)));
    // Recorded as empty: nothing is read, and it is refused all the same.
    v["sections"]["pq_codebook"]["bytes"] = serde_json::json!(0);
    std::fs::write(dir.join(MANIFEST_FILE), sealed(&v)).expect("write");
    assert!(is_corrupt(open(&dir)));
    // The manifest now refuses such a name itself; the reader's own check
    // still holds for a plain name that is a link to a device.
    v["sections"]["pq_codebook"]["file"] = serde_json::json!("pq_codebook.bin");
    std::fs::write(dir.join(MANIFEST_FILE), sealed(&v)).expect("write");
    std::fs::remove_file(dir.join("pq_codebook.bin")).expect("remove");
    std::os::unix::fs::symlink("/dev/zero", dir.join("pq_codebook.bin")).expect("symlink");
    let e = open(&dir).err().expect("refused");
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains("not a regular file"), "{e}");
}

/// Noted with the `/dev/zero` finding: a section's `file` is joined to the
/// index directory, so an absolute name, one with a `/` or `..` reached
/// any file on the machine, and `.` or an empty name the directory itself.
/// `Manifest::validate` refuses them as corruption naming the field; only
/// the ID layout's implicit `id_to_location` has no file.
#[test]
fn section_files_outside_the_index_directory_are_corrupt() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let v = tiny_index(&tmp.path().join("i"));
    assert_eq!(v["layout"]["kind"], "id");
    assert_eq!(v["sections"]["id_to_location"]["file"], "");
    let sections: Vec<String> = v["sections"]
        .as_object()
        .expect("sections")
        .keys()
        .cloned()
        .collect();
    for s in &sections {
        let mut bad = vec![
            "/dev/zero",
            "/etc/passwd",
            "../pages.bin",
            "sub/pages.bin",
            "pages.bin/",
            ".",
            "..",
            "a\0b",
        ];
        if s != "id_to_location" {
            bad.push("");
        }
        for name in bad {
            let mut w = v.clone();
            w["sections"][s]["file"] = serde_json::json!(name);
            let e = parse(&w)
                .err()
                .unwrap_or_else(|| panic!("{s}: {name:?} accepted"));
            assert!(matches!(e, Error::Corrupt { .. }), "{s}: {name:?}: {e}");
            let field = format!("\"sections.{s}.file\"");
            assert!(e.to_string().contains(&field), "{s}: {name:?}: {e}");
        }
        // Plain names are fine (what the file holds is checked on reading).
        let mut w = v.clone();
        w["sections"][s]["file"] = serde_json::json!("..data.bin");
        parse(&w).unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    // A shuffled layout's map is a file.
    let mut w = v.clone();
    w["layout"]["kind"] = serde_json::json!("shuffled");
    let e = parse(&w).expect_err("a shuffled layout without its map file");
    assert!(
        e.to_string().contains("\"sections.id_to_location.file\""),
        "{e}"
    );
}

/// Noted with the fuzz findings: `"n": 0` was accepted (a build refuses no
/// vectors, and the medoid check skipped it), leaving open to plan an
/// index of nothing. It is corruption.
#[test]
fn manifest_with_no_points_is_corrupt() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("i");
    let mut v = tiny_index(&dir);
    v["n"] = serde_json::json!(0);
    v["medoid"] = serde_json::json!(0);
    v["layout"]["n_blocks"] = serde_json::json!(0);
    let e = parse(&v).expect_err("n = 0 accepted");
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains("\"n\" is 0"), "{e}");
    std::fs::write(dir.join(MANIFEST_FILE), sealed(&v)).expect("write");
    assert!(is_corrupt(open(&dir)));
}
