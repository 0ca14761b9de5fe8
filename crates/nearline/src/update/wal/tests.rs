use super::file::{encode_record, tmp_path, Header};
use super::*;
use crate::elem::DType;
use std::collections::HashSet;

/// A log file image: the header and `records` (seq, kind, payload),
/// with the offset where each record starts (and the end).
fn image(first_seq: u64, records: &[(u64, u8, Vec<u8>)]) -> (Vec<u8>, Vec<u64>) {
    let mut out = Header {
        log_id: 1,
        first_seq,
    }
    .encode()
    .to_vec();
    let mut starts = Vec::new();
    for (seq, kind, payload) in records {
        starts.push(out.len() as u64);
        encode_record(&mut out, *seq, *kind, payload);
    }
    starts.push(out.len() as u64);
    (out, starts)
}

fn payload(i: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (i.wrapping_mul(131).wrapping_add(j as u64 * 17) % 253) as u8)
        .collect()
}

fn numbered(n: u64, size: impl Fn(u64) -> usize) -> Vec<(u64, u8, Vec<u8>)> {
    (1..=n)
        .map(|s| (s, (s % 3) as u8, payload(s, size(s))))
        .collect()
}

fn is_corrupt(e: &Error) -> bool {
    matches!(e, Error::Corrupt { .. })
}

#[test]
fn round_trip_many_records() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal.log");
    let wal = Wal::create(&path, 1, Durability::Sync).unwrap();
    let want = numbered(2_000, |s| (s as usize * 37) % 700);
    for (seq, kind, p) in &want {
        assert_eq!(wal.append(*kind, p).unwrap(), *seq);
    }
    assert_eq!(wal.sync().unwrap(), 2_001);
    assert_eq!(wal.durable_next_seq().unwrap(), 2_001);
    let stats = wal.stats().unwrap();
    assert_eq!((stats.records, stats.syncs), (2_000, 1));
    drop(wal);

    let (wal, got) = Wal::open(&path, Durability::Sync).unwrap();
    assert_eq!(got.len(), want.len());
    for (r, (seq, kind, p)) in got.iter().zip(&want) {
        assert_eq!((r.seq, r.kind, &r.payload), (*seq, *kind, p));
    }
    assert!(got.windows(2).all(|w| w[0].offset < w[1].offset));
    // Appends continue the sequence after a reopen.
    assert_eq!(wal.next_seq().unwrap(), 2_001);
    assert_eq!(wal.append_durable(9, b"more").unwrap(), 2_001);
    drop(wal);
    let (_, got) = Wal::open(&path, Durability::Sync).unwrap();
    assert_eq!(got.len(), 2_001);
    assert_eq!(got[2_000].payload, b"more");
}

#[test]
fn drop_writes_what_was_appended() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal.log");
    let wal = Wal::create(&path, 5, Durability::Sync).unwrap();
    assert_eq!(wal.append(1, b"a").unwrap(), 5);
    assert_eq!(wal.append(1, b"b").unwrap(), 6);
    drop(wal);
    let (_, got) = Wal::open(&path, Durability::Sync).unwrap();
    assert_eq!(got.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![5, 6]);
}

#[test]
fn replay_after_a_sequence() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal.log");
    let wal = Wal::create(&path, 1, Durability::Sync).unwrap();
    for s in 1..=50 {
        wal.append(kind::DELETE, &payload(s, 10)).unwrap();
    }
    drop(wal);
    let mut seen = Vec::new();
    let report = Wal::replay(&path, 30, &mut |r| {
        assert_eq!(r.payload, payload(r.seq, 10));
        seen.push(r.seq);
        Ok(())
    })
    .unwrap();
    assert_eq!(seen, (31..=50).collect::<Vec<_>>());
    assert_eq!(
        (report.replayed, report.first_seq, report.next_seq),
        (20, 1, 51)
    );
    // An error from the callback aborts the open.
    let e = Wal::replay(&path, 0, &mut |r| {
        if r.seq == 3 {
            Err(Error::arg("stop"))
        } else {
            Ok(())
        }
    })
    .unwrap_err();
    assert!(e.to_string().contains("stop"), "{e}");
}

#[test]
fn torn_tail_at_every_offset_of_the_last_record() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal.log");
    let recs = numbered(5, |s| 10 * s as usize);
    let (img, starts) = image(1, &recs);
    let (last, end) = (starts[4], starts[5]);
    for cut in last..end {
        fs::write(&path, &img[..cut as usize]).unwrap();
        let (wal, report) = Wal::open_after(&path, Durability::Sync, 0, &mut |_| Ok(())).unwrap();
        assert_eq!(report.dropped_tail_bytes, cut - last, "cut {cut}");
        assert_eq!(report.next_seq, 5, "cut {cut}");
        assert_eq!(fs::metadata(&path).unwrap().len(), last, "cut {cut}");
        // The repaired log takes appends where the torn record was.
        assert_eq!(wal.append_durable(7, b"new").unwrap(), 5);
        drop(wal);
        let (_, got) = Wal::open(&path, Durability::Sync).unwrap();
        assert_eq!(got.len(), 5, "cut {cut}");
        for (r, (seq, kind, p)) in got.iter().zip(&recs[..4]) {
            assert_eq!((r.seq, r.kind, &r.payload), (*seq, *kind, p));
        }
        assert_eq!(
            (got[4].seq, got[4].kind, &got[4].payload[..]),
            (5, 7, &b"new"[..])
        );
    }
}

#[test]
fn garbage_or_zeros_after_the_last_record_are_a_torn_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal.log");
    let (img, starts) = image(1, &numbered(3, |_| 20));
    for tail in [vec![0u8; 4096], payload(99, 1000), vec![0xff; 5]] {
        let mut bad = img.clone();
        bad.extend_from_slice(&tail);
        fs::write(&path, &bad).unwrap();
        let (_, got) = Wal::open(&path, Durability::Sync).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(fs::metadata(&path).unwrap().len(), starts[3]);
    }
}

#[test]
fn flipped_byte_in_an_earlier_record_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal.log");
    let (img, starts) = image(1, &numbered(5, |s| 8 + s as usize));
    for at in starts[1]..starts[2] {
        let mut bad = img.clone();
        bad[at as usize] ^= 0x40;
        fs::write(&path, &bad).unwrap();
        let e = Wal::open(&path, Durability::Sync).unwrap_err();
        assert!(is_corrupt(&e), "byte {at}: {e}");
        let msg = e.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains(&format!("offset {}", starts[1])), "{msg}");
        // Nothing was dropped from a corrupt log.
        assert_eq!(fs::read(&path).unwrap(), bad);
    }
    // The same damage in the last record cannot be told from a torn
    // write: that record is dropped.
    let mut bad = img.clone();
    bad[starts[4] as usize + 14] ^= 0x40;
    fs::write(&path, &bad).unwrap();
    let (_, got) = Wal::open(&path, Durability::Sync).unwrap();
    assert_eq!(got.len(), 4);
}

#[test]
fn sequence_gap_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal.log");
    let cases: [(u64, &[u64]); 3] = [(1, &[1, 2, 4, 5]), (1, &[1, 2, 2, 3]), (3, &[4, 5])];
    for (first, seqs) in cases {
        let recs: Vec<_> = seqs.iter().map(|&s| (s, 1, payload(s, 16))).collect();
        let (img, _) = image(first, &recs);
        fs::write(&path, &img).unwrap();
        let e = Wal::open(&path, Durability::Sync).unwrap_err();
        assert!(is_corrupt(&e), "{seqs:?}: {e}");
        assert!(e.to_string().contains("sequence gap"), "{e}");
    }
}

#[test]
fn concurrent_appenders_share_group_commits() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal.log");
    let wal = Arc::new(Wal::create(&path, 1, Durability::Sync).unwrap());
    let per = 60u64;
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let wal = Arc::clone(&wal);
            std::thread::spawn(move || {
                (0..per)
                    .map(|i| {
                        let p = [t.to_le_bytes(), i.to_le_bytes()].concat();
                        let seq = wal.append_durable(kind::INSERT, &p).unwrap();
                        // Durable when it returns.
                        assert!(wal.durable_next_seq().unwrap() > seq);
                        (seq, t, i)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut got: Vec<(u64, u64, u64)> = threads
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    got.sort_unstable();
    assert_eq!(
        got.iter().map(|g| g.0).collect::<Vec<_>>(),
        (1..=4 * per).collect::<Vec<_>>()
    );
    let stats = wal.stats().unwrap();
    assert!(stats.syncs >= 1 && stats.syncs <= 4 * per, "{stats:?}");
    drop(wal);

    let (_, records) = Wal::open(&path, Durability::Sync).unwrap();
    assert_eq!(records.len() as u64, 4 * per);
    let mut once = HashSet::new();
    for (r, &(seq, t, i)) in records.iter().zip(&got) {
        assert_eq!(r.seq, seq);
        assert_eq!(r.payload, [t.to_le_bytes(), i.to_le_bytes()].concat());
        assert!(once.insert((t, i)));
    }
}

#[test]
fn buffered_mode_reaches_the_os_before_returning_but_not_the_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal.log");
    let copy = tmp.path().join("copy.log");
    // What a reader sees if the process were killed now: the file as
    // the OS holds it.
    let killed_now = || {
        fs::copy(&path, &copy).unwrap();
        let (_, got) = Wal::open(&copy, Durability::Sync).unwrap();
        got.len()
    };
    let wal = Wal::create(&path, 1, Durability::Buffered).unwrap();
    for i in 0..3 {
        wal.append_durable(kind::DELETE, &payload(i, 12)).unwrap();
    }
    assert_eq!(wal.stats().unwrap().syncs, 0);
    assert_eq!(wal.durable_next_seq().unwrap(), 1);
    assert_eq!(killed_now(), 3);
    // A plain append stays in the process until a flush or sync.
    wal.append(kind::DELETE, b"x").unwrap();
    assert_eq!(killed_now(), 3);
    wal.flush().unwrap();
    assert_eq!(killed_now(), 4);
    assert_eq!(wal.sync().unwrap(), 5);
    assert_eq!(wal.stats().unwrap().syncs, 1);
    assert_eq!(wal.durable_next_seq().unwrap(), 5);
}

#[test]
fn copy_from_writes_the_tail_elsewhere_and_keeps_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal.log");
    let other = tmp.path().join("next");
    fs::create_dir(&other).unwrap();
    let dest = other.join("wal.log");
    let wal = Wal::create(&path, 1, Durability::Sync).unwrap();
    for s in 1..=8 {
        wal.append(1, &payload(s, s as usize)).unwrap();
    }
    assert!(wal.copy_from(10, &dest).is_err());
    // Buffered records are written first, so the copy holds them.
    wal.copy_from(5, &dest).unwrap();
    assert!(!tmp_path(&dest).unwrap().exists());
    assert_eq!(wal.first_seq_and_log_id().unwrap(), (1, 1));
    assert_eq!(wal.append_durable(1, &payload(9, 9)).unwrap(), 9);
    drop(wal);
    let (copy, got) = Wal::open(&dest, Durability::Sync).unwrap();
    assert_eq!(copy.first_seq_and_log_id().unwrap(), (5, 2));
    assert_eq!(
        got.iter().map(|r| r.seq).collect::<Vec<_>>(),
        (5..=8).collect::<Vec<_>>()
    );
    assert!(got
        .iter()
        .all(|r| r.payload == payload(r.seq, r.seq as usize)));
    assert_eq!(copy.append_durable(1, &payload(9, 9)).unwrap(), 9);
    drop(copy);
    let (_, kept) = Wal::open(&path, Durability::Sync).unwrap();
    assert_eq!(kept.len(), 9, "the log itself is unchanged");
    // Copying from the next sequence: an empty log starting there.
    let (wal, _) = Wal::open(&path, Durability::Sync).unwrap();
    let empty = other.join("empty.log");
    wal.copy_from(10, &empty).unwrap();
    assert_eq!(fs::metadata(&empty).unwrap().len(), HEADER_BYTES);
}

#[test]
fn truncate_before_resets_the_log_after_a_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal.log");
    let wal = Wal::create(&path, 1, Durability::Sync).unwrap();
    for s in 1..=10 {
        wal.append(1, &payload(s, s as usize)).unwrap();
    }
    assert!(wal.truncate_before(12).is_err());
    wal.truncate_before(6).unwrap();
    assert_eq!(wal.first_seq_and_log_id().unwrap(), (6, 2));
    assert_eq!(wal.durable_next_seq().unwrap(), 11);
    assert_eq!(wal.append_durable(1, &payload(11, 11)).unwrap(), 11);
    // Dropping nothing is a no-op.
    wal.truncate_before(3).unwrap();
    assert_eq!(wal.first_seq_and_log_id().unwrap(), (6, 2));
    drop(wal);
    assert!(!tmp_path(&path).unwrap().exists());

    let (wal, got) = Wal::open(&path, Durability::Sync).unwrap();
    assert_eq!(
        got.iter().map(|r| r.seq).collect::<Vec<_>>(),
        (6..=11).collect::<Vec<_>>()
    );
    assert!(got
        .iter()
        .all(|r| r.payload == payload(r.seq, r.seq as usize)));
    // Everything dropped: an empty log starting at the next sequence.
    wal.truncate_before(12).unwrap();
    assert_eq!(wal.first_seq_and_log_id().unwrap(), (12, 3));
    drop(wal);
    assert_eq!(fs::metadata(&path).unwrap().len(), HEADER_BYTES);

    // A checkpoint before the log's first record: records are missing.
    let e = Wal::replay(&path, 5, &mut |_| Ok(())).unwrap_err();
    assert!(is_corrupt(&e) && e.to_string().contains("missing"), "{e}");
    let report = Wal::replay(&path, 11, &mut |_| Ok(())).unwrap();
    assert_eq!(
        (report.first_seq, report.next_seq, report.replayed),
        (12, 12, 0)
    );
}

#[test]
fn log_behind_the_checkpoint_is_reset_past_it() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal.log");
    let (img, _) = image(1, &numbered(5, |_| 4));
    fs::write(&path, img).unwrap();
    let (wal, report) = Wal::open_after(&path, Durability::Sync, 8, &mut |_| {
        panic!("nothing to replay")
    })
    .unwrap();
    assert_eq!(
        (report.first_seq, report.next_seq, report.log_id),
        (9, 9, 2)
    );
    assert_eq!(wal.append_durable(1, b"after").unwrap(), 9);
    drop(wal);
    let (_, got) = Wal::open(&path, Durability::Sync).unwrap();
    assert_eq!(got.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![9]);
}

#[test]
fn leftover_of_a_reset_killed_before_its_rename_is_ignored() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal.log");
    let (img, _) = image(1, &numbered(3, |_| 4));
    fs::write(&path, &img).unwrap();
    fs::write(tmp_path(&path).unwrap(), &img[..40]).unwrap();
    let (_, got) = Wal::open(&path, Durability::Sync).unwrap();
    assert_eq!(got.len(), 3);
    assert!(!tmp_path(&path).unwrap().exists());
}

#[test]
fn header_is_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal.log");
    let (img, _) = image(1, &numbered(2, |_| 4));
    let open = |bytes: &[u8]| {
        fs::write(&path, bytes).unwrap();
        Wal::open(&path, Durability::Sync).unwrap_err()
    };
    let mut bad = img.clone();
    bad[0] = b'X';
    assert!(matches!(open(&bad), Error::Format { .. }));
    let mut bad = img.clone();
    bad[8..10].copy_from_slice(&(FORMAT_MAJOR + 1).to_le_bytes());
    assert!(matches!(open(&bad), Error::Version { .. }));
    for at in 10..32 {
        let mut bad = img.clone();
        bad[at] ^= 1;
        assert!(is_corrupt(&open(&bad)), "header byte {at}");
    }
    assert!(is_corrupt(&open(&img[..31])));
    let mut zero_first = Header {
        log_id: 1,
        first_seq: 0,
    }
    .encode()
    .to_vec();
    zero_first.extend_from_slice(&img[32..]);
    assert!(is_corrupt(&open(&zero_first)));

    fs::write(&path, &img).unwrap();
    assert!(Wal::create(&path, 1, Durability::Sync).is_err());
    assert!(Wal::create(&tmp.path().join("new.log"), 0, Durability::Sync).is_err());
}

#[test]
fn a_second_writer_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal.log");
    let wal = Wal::create(&path, 1, Durability::Sync).unwrap();
    let e = Wal::open(&path, Durability::Sync).unwrap_err();
    assert!(e.to_string().contains("another writer"), "{e}");
    // Still refused after a reset replaced the file.
    wal.append(1, b"x").unwrap();
    wal.truncate_before(2).unwrap();
    assert!(Wal::open(&path, Durability::Sync).is_err());
    drop(wal);
    Wal::open(&path, Durability::Sync).unwrap();
}

#[test]
fn ops_round_trip_through_the_log_and_decode_checks_lengths() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wal.log");
    let ops = [
        Op::Insert {
            ids: vec![7, u64::MAX],
            dim: 3,
            dtype: DType::F32,
            vectors: payload(1, 24),
        },
        Op::Insert {
            ids: vec![1],
            dim: 5,
            dtype: DType::I8,
            vectors: payload(2, 5),
        },
        Op::Delete {
            ids: vec![7, 9, 11],
        },
        Op::Delete { ids: vec![] },
    ];
    let wal = Wal::create(&path, 1, Durability::Sync).unwrap();
    for op in &ops {
        wal.append_op_durable(op).unwrap();
    }
    drop(wal);
    let (_, got) = Wal::open(&path, Durability::Sync).unwrap();
    let decoded: Vec<Op> = got.iter().map(|r| Op::decode(r, &path).unwrap()).collect();
    assert_eq!(decoded, ops);

    // Encoding refuses shapes that do not add up.
    let wrong = Op::Insert {
        ids: vec![1, 2],
        dim: 3,
        dtype: DType::F16,
        vectors: vec![0; 11],
    };
    assert!(matches!(wrong.encode(), Err(Error::InvalidArgument(_))));
    let zero_dim = Op::Insert {
        ids: vec![],
        dim: 0,
        dtype: DType::U8,
        vectors: vec![],
    };
    assert!(zero_dim.encode().is_err());

    // Decoding: every truncation or extension of a payload, a bad tag,
    // nonzero reserved bytes and an unknown kind are corrupt.
    let rec = |kind: u8, payload: Vec<u8>| Record {
        seq: 42,
        kind,
        payload,
        offset: 1234,
    };
    for op in &ops {
        let p = op.encode().unwrap();
        for len in 0..p.len() {
            let e = Op::decode(&rec(op.kind(), p[..len].to_vec()), &path).unwrap_err();
            assert!(is_corrupt(&e), "{e}");
            assert!(e.to_string().contains("record 42 at offset 1234"), "{e}");
        }
        let mut longer = p.clone();
        longer.push(0);
        assert!(Op::decode(&rec(op.kind(), longer), &path).is_err());
    }
    let mut p = ops[0].encode().unwrap();
    p[8] = 9;
    assert!(Op::decode(&rec(kind::INSERT, p), &path).is_err());
    let mut p = ops[0].encode().unwrap();
    p[10] = 1;
    assert!(Op::decode(&rec(kind::INSERT, p), &path).is_err());
    // A count so large the sizes overflow.
    let mut p = ops[0].encode().unwrap();
    p[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
    p[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(Op::decode(&rec(kind::INSERT, p), &path).is_err());
    assert!(Op::decode(&rec(77, vec![]), &path).is_err());
    for t in [DType::F32, DType::F16, DType::U8, DType::I8] {
        assert_eq!(dtype_from_tag(dtype_tag(t)), Some(t));
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// Cutting the file anywhere after its header keeps exactly the
    /// records that end before the cut and truncates to the last of them.
    #[test]
    fn any_truncation_keeps_the_complete_records(
        sizes in proptest::collection::vec(0usize..300, 1..12),
        first in 1u64..1_000_000,
        cut in proptest::prelude::any::<u64>(),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("wal.log");
        let recs: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (first + i as u64, (i % 4) as u8, payload(first + i as u64, n)))
            .collect();
        let (img, starts) = image(first, &recs);
        let cut = HEADER_BYTES + cut % (img.len() as u64 - HEADER_BYTES + 1);
        fs::write(&path, &img[..cut as usize]).unwrap();
        let (wal, got) = Wal::open(&path, Durability::Sync).unwrap();
        let kept = starts[1..].iter().filter(|&&end| end <= cut).count();
        proptest::prop_assert_eq!(got.len(), kept);
        for (r, (seq, kind, p)) in got.iter().zip(&recs) {
            proptest::prop_assert_eq!((r.seq, r.kind, &r.payload), (*seq, *kind, p));
        }
        proptest::prop_assert_eq!(fs::metadata(&path).unwrap().len(), starts[kept]);
        proptest::prop_assert_eq!(wal.next_seq().unwrap(), first + kept as u64);
    }
}

/// The payload of record `s` in the fault tests (its length varies).
fn faulted_payload(s: u64) -> Vec<u8> {
    payload(s, (s as usize * 7) % 37 + 1)
}

/// The log's writes go through a file that fails or tears a chosen write,
/// or fails a chosen `fdatasync`, and the machine then loses what was not
/// synced (keeping part of it, or junk where the file system extended the
/// file): over many seeds, reopening yields every acknowledged record,
/// intact and in order, and nothing past the one append that failed.
#[test]
fn torn_and_failed_writes_lose_only_what_was_never_acknowledged() {
    use crate::io::faulty::{Faults, FaultyFile};
    use rand::{Rng, SeedableRng};
    let mut outcomes = HashSet::new();
    for seed in 0..300u64 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("wal.log");
        let wal = Wal::create(&path, 1, Durability::Sync).unwrap();
        let pre = rng.random_range(0..4u64);
        for s in 1..=pre {
            assert_eq!(wal.append_durable(1, &faulted_payload(s)).unwrap(), s);
        }
        let faults = if rng.random_bool(0.5) {
            Faults {
                fail_write: Some(rng.random_range(0..6)),
                tear: Some(rng.random_range(0..60)),
                fail_sync: None,
            }
        } else {
            Faults {
                fail_sync: Some(rng.random_range(0..6)),
                ..Faults::default()
            }
        };
        let mut handle = None;
        wal.inject(|f, synced| {
            let ff = Arc::new(FaultyFile::new(f, synced, faults.clone()));
            handle = Some(Arc::clone(&ff));
            ff
        })
        .unwrap();
        let ff = handle.unwrap();
        let (mut acked, mut failed) = (pre, None);
        for s in pre + 1..pre + 10 {
            match wal.append_durable(1, &faulted_payload(s)) {
                Ok(q) => {
                    assert_eq!(q, s);
                    acked = s;
                }
                Err(e) => {
                    assert!(e.to_string().contains("injected"), "{e}");
                    failed = Some(s);
                    break;
                }
            }
        }
        assert!(failed.is_some(), "seed {seed}: {faults:?} never fired");
        // After a failure the log refuses work, and its drop writes nothing.
        assert!(wal.append_durable(1, b"after").is_err());
        drop(wal);
        // The power loss.
        let bytes = fs::read(&path).unwrap();
        let keep = (ff.power_loss_len() as usize).min(bytes.len());
        drop(ff); // (it holds the file, and with it the writer's lock)
        let mut image = bytes[..keep].to_vec();
        let lost = match rng.random_range(0..4) {
            0 => "everything unsynced",
            1 => {
                image = bytes.clone();
                "nothing (the process died, the machine did not)"
            }
            2 => {
                let part = rng.random_range(0..=bytes.len() - keep);
                image.extend_from_slice(&bytes[keep..keep + part]);
                "part of what was unsynced"
            }
            _ => {
                let junk = rng.random_range(1..40);
                image.extend((0..junk).map(|_| rng.random::<u8>()));
                "junk past the synced bytes"
            }
        };
        fs::write(&path, &image).unwrap();
        let (_, got) = Wal::open(&path, Durability::Sync).unwrap();
        let n = got.len() as u64;
        let ctx = format!("seed {seed}: {faults:?}, {lost}: {n} records, {acked} acknowledged");
        assert!(n >= acked, "{ctx}");
        assert!(n <= failed.unwrap_or(acked), "{ctx}");
        for (i, r) in got.iter().enumerate() {
            assert_eq!(r.seq, i as u64 + 1, "{ctx}");
            assert_eq!(r.payload, faulted_payload(r.seq), "{ctx}");
        }
        outcomes.insert(n == acked);
    }
    // Both outcomes of the failed append occur: lost, and durable anyway
    // (its bytes were all written when its sync failed).
    assert_eq!(outcomes.len(), 2);
}

#[test]
fn a_logged_inserts_rows_are_checked_against_the_replaying_index() {
    let p = Path::new("wal.log");
    let halves: Vec<u8> = [1.5f32, -2.0, 0.25, 4.0]
        .iter()
        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
        .collect();
    // A graph index replays any element type, widened to f32.
    let rows = insert_rows(p, 2, 2, DType::F16, &halves, None).unwrap();
    assert_eq!(rows, vec![1.5, -2.0, 0.25, 4.0]);
    // A partition index logs float32 only.
    let e = insert_rows(p, 2, 2, DType::F16, &halves, Some(DType::F32)).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    assert!(
        e.to_string().contains("float16") && e.to_string().contains("float32"),
        "{e}"
    );
    // A record of another dimension is damage, whichever the kind.
    let e = insert_rows(p, 4, 2, DType::F16, &halves, None).unwrap_err();
    assert!(
        e.to_string().contains("dimension 2; the index has 4"),
        "{e}"
    );
}
