//! A read-only open beside the writer: it follows the writer's log and
//! checkpoints, holds the blocks of the checkpoint it loaded, writes
//! nothing, and refuses updates.

use super::tests::{build_at, params, quiet};
use super::*;
use crate::index::test_data::clustered;

fn knn(idx: &PartitionIndex, q: &[f32]) -> Vec<i64> {
    idx.search(
        q,
        q.len() / idx.dim(),
        &PartitionSearch {
            k: 5,
            nprobe: DEFAULT_NPROBE,
            l: None,
            probe_cut: None,
            threads: Some(2),
            queries_in_flight: None,
        },
    )
    .unwrap()
    .ids
}

fn reader_of(path: &Path) -> PartitionIndex {
    PartitionIndex::open(
        path,
        &PartitionOpen {
            read_only: true,
            ..quiet()
        },
    )
    .unwrap()
}

/// Every file of `dir` with its bytes.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_reader_sees_every_acknowledged_update_of_the_writer() {
    let (n, dim) = (1500, 12);
    let data = clustered(n, dim, 5);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idx");
    build_at(
        &path,
        &data,
        dim,
        None,
        params(n, dim, |o| o.posting_limit = Some(30)),
    );
    let writer = PartitionIndex::open(&path, &quiet()).unwrap();
    let reader = reader_of(&path);
    assert!(reader.read_only());
    assert_eq!(reader.len(), n);
    let fresh = clustered(600, dim, 6);
    for (j, v) in fresh.chunks_exact(dim).enumerate() {
        let id = writer.insert(v, None).unwrap()[0];
        // The reader's next search finds it, with no reopen.
        assert_eq!(knn(&reader, v)[0], id as i64, "insert {j}");
        if j % 3 == 0 {
            assert_eq!(writer.delete(&[id]).unwrap(), 1);
            assert!(!knn(&reader, v).contains(&(id as i64)), "delete {j}");
        }
        if j % 97 == 0 {
            writer.maintain().unwrap();
            writer.checkpoint().unwrap();
        }
        if j == 300 {
            // Deletes of built vectors too.
            assert_eq!(writer.delete(&[0, 1, 2]).unwrap(), 3);
            assert!(!knn(&reader, &data[..dim]).contains(&0));
        }
    }
    assert_eq!(reader.len(), writer.len());
    assert_eq!(reader.live_ids(), writer.live_ids());
    let rep = reader.check().unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    let info = reader.info();
    assert_eq!(info["read_only"], true);
    assert_eq!(info["n"], writer.len());
    // Updates are refused, and say why.
    for e in [
        reader.insert(&fresh[..dim], None).unwrap_err(),
        reader.delete(&[5]).unwrap_err(),
        reader.checkpoint().unwrap_err(),
        reader.maintain().unwrap_err(),
    ] {
        assert!(e.to_string().contains("open read-only"), "{e}");
    }
}

#[test]
fn a_reader_writes_nothing_and_holds_the_blocks_of_its_checkpoint() {
    let (n, dim) = (1200, 8);
    let data = clustered(n, dim, 8);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idx");
    build_at(
        &path,
        &data,
        dim,
        None,
        params(n, dim, |o| o.posting_limit = Some(24)),
    );
    // Alone, with a log to follow: searching, checking and describing it
    // change no byte of the directory.
    {
        let w = PartitionIndex::open(&path, &quiet()).unwrap();
        w.insert(&clustered(50, dim, 9), None).unwrap();
        w.delete(&[3, 4]).unwrap();
    }
    let before = snapshot(&path);
    {
        let r = reader_of(&path);
        assert_eq!(r.len(), n + 48);
        knn(&r, &data[..4 * dim]);
        assert!(r.check().unwrap().problems.is_empty());
        r.info();
    }
    assert_eq!(snapshot(&path), before);
    // Beside a writer: the writer's checkpoint keeps the state the reader
    // holds, and with it every block that state names, until the reader
    // has moved on.
    let w = PartitionIndex::open(&path, &quiet()).unwrap();
    let r = reader_of(&path);
    let held = r.manifest().state_file;
    let wi = w.loaded();
    w.delete(&(0..300).collect::<Vec<u64>>()).unwrap();
    w.insert(&clustered(300, dim, 10), None).unwrap();
    w.maintain().unwrap();
    let (_, _, pending) = wi.store.counts();
    assert!(pending > 0, "the rewrites released blocks");
    w.checkpoint().unwrap();
    assert!(path.join(&held).exists(), "the held state was removed");
    let (_, _, still) = wi.store.counts();
    assert_eq!(
        still, pending,
        "blocks a reader's state may name were freed"
    );
    // The reader moves to the new checkpoint at its next search; then the
    // writer's next checkpoint frees the blocks and the old state.
    assert!(!knn(&r, &data[299 * dim..300 * dim]).contains(&299));
    assert_ne!(r.manifest().state_file, held);
    w.checkpoint().unwrap();
    assert!(!path.join(&held).exists());
    let (_, _, after) = wi.store.counts();
    assert_eq!(after, 0);
    assert!(w.check().unwrap().problems.is_empty());
    assert!(r.check().unwrap().problems.is_empty());
    assert_eq!(r.live_ids(), w.live_ids());
}
