//! Byte-mutation tests of the readers of a mutable index's files: the
//! partition index's state file, its posting blocks, the write-ahead log
//! (a writer's open with its repair, and a reader's tail), and a whole
//! partition index opened — for writing and read-only — with one of its
//! files mutated. Each must return `Ok` or a clean error, never panic, hang
//! or allocate hugely (the harness of `common::fuzz`).
//!
//! `NEARLINE_FUZZ_CASES` scales the number of cases (default 1).

use nearline::partition::posting::{self, decode_run, BLOCK, PAYLOAD};
use nearline::partition::state::{State, DELETED};
use nearline::partition::store::PostingRef;
use nearline::partition::{PartitionIndex, PartitionOpen, PartitionSearch};
use nearline::update::tail::WalTail;
use nearline::update::wal::{Durability, Op, Patch, PatchAction, Wal};
use nearline::{DType, Metric};
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

mod common;
use common::fuzz::*;

/// A small valid state (3 heads, 5 slots, one deleted).
fn state_seed() -> Vec<u8> {
    State {
        dim: 3,
        head_alive: vec![true, false, true],
        head_vecs: (0..9).map(|i| i as f32).collect(),
        head_lists: vec![vec![2], vec![], vec![0]],
        head_start: 0,
        head_free: vec![1],
        postings: vec![
            Some(PostingRef {
                blocks: vec![0, 1],
                count: 5,
            }),
            None,
            Some(PostingRef {
                blocks: vec![3],
                count: 1,
            }),
        ],
        versions: vec![0, DELETED | 4, 3, 0x7fff_0000, 9],
        external: vec![10, 11, 12, 13, u64::MAX],
        next_auto_id: 14,
        blocks_end: 4,
        free_blocks: vec![2],
    }
    .encode()
}

/// Two blocks of posting 7 holding 40 entries of dimension 30.
fn postings_seed() -> Vec<u8> {
    let dim = 30;
    let mut stream = Vec::new();
    for i in 0..40u32 {
        let v: Vec<f32> = (0..dim).map(|j| (i * 31 + j) as f32).collect();
        posting::push_entry(&mut stream, i, i * 3, &v);
    }
    let nb = posting::blocks_for(40, dim as usize);
    let mut out = vec![0u8; nb * BLOCK];
    for b in 0..nb {
        let from = (b * PAYLOAD).min(stream.len());
        posting::encode_block(
            7,
            b as u32,
            &stream[from..],
            &mut out[b * BLOCK..(b + 1) * BLOCK],
        );
    }
    out
}

/// A log of a few inserts and deletes, and one in-place patch (page
/// images of two small blocks).
fn wal_seed() -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("wal.log");
    let wal = Wal::create(&path, 3, Durability::Buffered).expect("wal");
    for i in 0..4u64 {
        let op = if i % 2 == 0 {
            Op::Insert {
                ids: vec![i, i + 100],
                dim: 2,
                dtype: DType::F32,
                vectors: [1.0f32, 2.0, 3.0, 4.0]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            }
        } else {
            Op::Delete { ids: vec![i - 1] }
        };
        wal.append_op_durable(&op).expect("append");
    }
    let patch = Op::Patch(Patch {
        action: PatchAction::Insert,
        internal: 7,
        external: 42,
        dim: 2,
        dtype: DType::F32,
        vector: [0.5f32, -1.5]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        block_size: 64,
        blocks: vec![(1, vec![0xA5; 64]), (3, vec![0x5A; 64])],
    });
    wal.append_op_durable(&patch).expect("append");
    drop(wal);
    std::fs::read(&path).expect("read")
}

fn read_state(s: &mut Sink, input: &[u8]) {
    if let Some(st) = s.take(State::decode(Path::new("state-1.bin"), input)) {
        assert_eq!(st.versions.len(), st.external.len());
        assert_eq!(st.head_alive.len(), st.postings.len());
        // What decodes, encodes back to itself.
        let again = st.encode();
        assert_eq!(
            State::decode(Path::new("state-1.bin"), &again).ok(),
            Some(st)
        );
    }
}

fn read_postings(s: &mut Sink, input: &[u8], dim: usize, count: u32) {
    let blocks = input.len().div_ceil(BLOCK).max(1) as u32;
    let mut stream = Vec::new();
    if s.take(decode_run(
        Path::new("postings.dat"),
        7,
        (0, 0, blocks),
        input,
        &mut stream,
    ))
    .is_some()
    {
        let e = posting::entry_bytes(dim);
        let mut v = vec![0f32; dim];
        for i in 0..(count as usize).min(stream.len() / e) {
            posting::read_entry(&stream, dim, i, &mut v);
        }
    }
}

fn read_wal(s: &mut Sink, input: &[u8]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("wal.log");
    std::fs::write(&path, input).expect("write");
    // A reader's tail first (the file untouched), then a writer's open.
    if let Some(mut t) = s.take(WalTail::open(&path)) {
        let mut ops = Vec::new();
        let r = t.read_new(0, &mut |r| {
            ops.push(Op::decode(&r, &path));
            Ok(())
        });
        s.take(r);
        for o in ops {
            s.take(o);
        }
    }
    if let Some((_, records)) = s.take(Wal::open(&path, Durability::Buffered)) {
        for r in &records {
            s.take(Op::decode(r, &path));
        }
    }
}

/// A built partition index to mutate (built once).
fn fixture() -> &'static PathBuf {
    static F: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &F.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.index");
        let dim = 6;
        let data: Vec<f32> = (0..300 * dim)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0)
            .collect();
        let opts = nearline::planner::BuildOptions {
            metric: Metric::L2,
            preset: nearline::planner::PresetChoice::parse("spfresh").expect("preset"),
            threads: Some(1),
            ..Default::default()
        };
        nearline::index::build_partition(
            &data,
            dim,
            &path,
            &opts,
            &|_, _, _| {},
            &Default::default(),
        )
        .expect("build");
        {
            let idx = PartitionIndex::open(
                &path,
                &PartitionOpen {
                    background: false,
                    durability: Durability::Buffered,
                    ..Default::default()
                },
            )
            .expect("open");
            idx.insert(&data[..12], None).expect("insert");
            idx.delete(&[3, 4]).expect("delete");
        }
        (dir, path)
    })
    .1
}

/// The files of the fixture a whole-index case may mutate.
const FILES: [&str; 4] = ["manifest.json", "state-1.bin", "wal.log", "postings.dat"];

fn open_and_use(s: &mut Sink, dir: &Path, read_only: bool) {
    let opts = PartitionOpen {
        background: false,
        read_only,
        durability: Durability::Buffered,
        threads: Some(1),
        ..Default::default()
    };
    let Some(idx) = s.take(PartitionIndex::open(dir, &opts)) else {
        return;
    };
    let q = vec![1.0f32; idx.dim()];
    s.take(idx.search(
        &q,
        1,
        &PartitionSearch {
            k: 5,
            nprobe: 8,
            l: None,
            probe_cut: None,
            threads: Some(1),
            queries_in_flight: None,
        },
    ));
    s.take(idx.check());
    idx.info();
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn partition_state_files_never_panic(muts in mutations(6)) {
        let input = apply(state_seed(), &muts);
        run("partition state", &input, Limits::small(input.len()), |s| read_state(s, &input))?;
    }

    #[test]
    fn posting_blocks_never_panic(
        dim in prop_oneof![4 => Just(30usize), 1 => 1usize..2000],
        count in prop_oneof![4 => Just(40u32), 1 => any::<u32>()],
        muts in mutations(6),
    ) {
        let input = apply(postings_seed(), &muts);
        run("posting blocks", &input, Limits::small(input.len()), |s| {
            read_postings(s, &input, dim, count)
        })?;
    }

    #[test]
    fn write_ahead_logs_never_panic(muts in mutations(6)) {
        let input = apply(wal_seed(), &muts);
        run("write-ahead log", &input, Limits::small(input.len()), |s| read_wal(s, &input))?;
    }
}

proptest! {
    #![proptest_config(config(48))]

    #[test]
    fn a_partition_index_with_a_mutated_file_never_panics(
        file in 0usize..FILES.len(),
        read_only in any::<bool>(),
        muts in mutations(4),
    ) {
        let src = fixture();
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("p.index");
        std::fs::create_dir(&dir).expect("dir");
        for e in std::fs::read_dir(src).expect("fixture") {
            let e = e.expect("entry");
            std::fs::copy(e.path(), dir.join(e.file_name())).expect("copy");
        }
        let path = dir.join(FILES[file]);
        let input = apply(std::fs::read(&path).expect("read"), &muts);
        std::fs::write(&path, &input).expect("write");
        let limits = Limits { alloc: 64 << 20, allow_engine: true, time: std::time::Duration::from_secs(20) };
        run("partition index", &input, limits, |s| open_and_use(s, &dir, read_only))?;
    }
}

#[test]
fn the_seeds_are_valid() {
    let mut s = Sink::default();
    read_state(&mut s, &state_seed());
    read_postings(&mut s, &postings_seed(), 30, 40);
    read_wal(&mut s, &wal_seed());
    open_and_use(&mut s, fixture(), false);
    open_and_use(&mut s, fixture(), true);
    assert!(s.errors.is_empty(), "{:?}", s.errors);
}

#[test]
#[ignore = "writes the fuzz seed corpora of these readers; run by scripts/fuzz.sh"]
fn build_update_fuzz_corpus() {
    let Some(root) = std::env::var_os("NEARLINE_FUZZ_CORPUS") else {
        panic!("set NEARLINE_FUZZ_CORPUS to the corpus directory");
    };
    let root = PathBuf::from(root);
    let put = |target: &str, bytes: &[u8]| {
        let d = root.join(target);
        std::fs::create_dir_all(&d).expect("corpus dir");
        std::fs::write(d.join("seed"), bytes).expect("seed");
    };
    put("partition_state", &state_seed());
    let mut p = 30u16.to_le_bytes().to_vec();
    p.extend_from_slice(&40u32.to_le_bytes());
    p.extend_from_slice(&postings_seed());
    put("posting", &p);
    put("wal", &wal_seed());
}
