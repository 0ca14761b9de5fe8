//! End-to-end tests of the partition index: recall against exact
//! neighbours, updates visible at once, deletes never returned under
//! concurrent searches, LIRE keeping every live id in a posting, the log
//! replayed after a crash, damage detected.

use super::*;
use crate::index::test_data::{clustered, exact_knn, insert_until_injected_fault};
use crate::planner::options::PartitionOptions;
use crate::planner::partition::plan;
use crate::planner::BuildOptions;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};

pub(super) fn params(
    n: usize,
    dim: usize,
    f: impl FnOnce(&mut PartitionOptions),
) -> PartitionParams {
    let mut o = BuildOptions::default();
    f(&mut o.partition);
    plan(&o, n, dim, DType::F32).unwrap().params
}

pub(super) fn build_at(
    dir: &Path,
    data: &[f32],
    dim: usize,
    ids: Option<Vec<u64>>,
    p: PartitionParams,
) {
    build_index(
        data,
        dim,
        dir,
        &PartitionBuild {
            metric: Metric::L2,
            params: p,
            ids,
            overwrite: false,
            threads: Some(2),
        },
        &|_, _, _| {},
        &AtomicBool::new(false),
    )
    .unwrap();
}

pub(super) fn quiet() -> PartitionOpen {
    PartitionOpen {
        threads: Some(2),
        io: EngineKind::Pread,
        durability: Durability::Buffered,
        background: false,
        ..PartitionOpen::default()
    }
}

pub(super) fn search(idx: &PartitionIndex, q: &[f32], k: usize, nprobe: usize) -> Vec<i64> {
    idx.search(
        q,
        q.len() / idx.dim(),
        &PartitionSearch {
            k,
            nprobe,
            l: None,
            probe_cut: None,
            threads: Some(2),
            queries_in_flight: None,
        },
    )
    .unwrap()
    .ids
}

#[test]
fn static_search_reaches_recall_on_shuffled_ids() {
    let (n, dim) = (6000, 24);
    let data = clustered(n, dim, 7);
    // Shuffled external ids: results must come back in the user's ids.
    let mut ids: Vec<u64> = (0..n as u64).map(|i| i * 3 + 1000).collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    for i in (1..n).rev() {
        ids.swap(i, rng.random_range(0..=i));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idx");
    build_at(&path, &data, dim, Some(ids.clone()), params(n, dim, |_| {}));
    let idx = PartitionIndex::open(&path, &quiet()).unwrap();
    assert_eq!(idx.len(), n);
    let queries = clustered(100, dim, 99);
    let got = search(&idx, &queries, 10, DEFAULT_NPROBE);
    let mut hit = 0;
    for (qi, q) in queries.chunks_exact(dim).enumerate() {
        let truth: Vec<i64> = exact_knn(&data, dim, q, 10)
            .into_iter()
            .map(|i| ids[i as usize] as i64)
            .collect();
        hit += got[qi * 10..qi * 10 + 10]
            .iter()
            .filter(|x| truth.contains(x))
            .count();
    }
    let recall = hit as f64 / 1000.0;
    assert!(recall >= 0.9, "recall@10 {recall}");
    let rep = idx.check().unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    assert_eq!(rep.live_ids, n as u64);
    assert!(idx.info()["memory"]["within_budget"].as_bool().unwrap());
    // No more heads than the planner sized memory for.
    let ratio = idx.params().head_ratio;
    assert!(idx.info()["postings"].as_u64().unwrap() as f64 <= (n as f64 * ratio).floor());
}

#[test]
fn a_budget_is_kept_by_the_heads_it_sizes() {
    let (n, dim) = (60_000, 32);
    let data = clustered(n, dim, 11);
    let mut o = BuildOptions::default();
    let full = plan(&o, n, dim, DType::F32).unwrap().expected_bytes;
    o.memory_budget = Some(crate::util::Budget::Bytes(full * 9 / 10));
    let p = plan(&o, n, dim, DType::F32).unwrap().params;
    assert!(p.head_ratio < crate::planner::partition::HEAD_RATIO);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idx");
    build_at(&path, &data, dim, None, p.clone());
    let idx = PartitionIndex::open(&path, &quiet()).unwrap();
    let info = idx.info();
    assert!(
        info["memory"]["within_budget"].as_bool().unwrap(),
        "{}",
        info["memory"]
    );
    assert!(idx.memory_bytes() <= p.memory_budget);
}

#[test]
fn inserts_are_found_at_once_and_deletes_never_come_back() {
    let (n, dim) = (3000, 16);
    let data = clustered(n, dim, 1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idx");
    build_at(
        &path,
        &data,
        dim,
        None,
        params(n, dim, |o| o.posting_limit = Some(40)),
    );
    let idx = PartitionIndex::open(
        &path,
        &PartitionOpen {
            background: true,
            ..quiet()
        },
    )
    .unwrap();
    let fresh = clustered(500, dim, 2);
    for (j, v) in fresh.chunks_exact(dim).enumerate() {
        let id = idx.insert(v, None).unwrap()[0];
        assert_eq!(id, (n + j) as u64);
        // Its own vector finds it right after insert returns.
        assert_eq!(search(&idx, v, 1, 8)[0], id as i64, "insert {j}");
    }
    idx.maintain().unwrap();
    assert!(idx.info()["updates"]["splits"].as_u64().unwrap() > 0);
    // Deletes under concurrent searches: once delete returns, no search
    // that starts afterwards returns the id.
    let gone: Vec<u64> = (0..n as u64).step_by(3).collect();
    let deleted = std::sync::Mutex::new(HashSet::<i64>::new());
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..2 {
            let (idx, deleted, stop, data) = (&idx, &deleted, &stop, &data);
            s.spawn(move || {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    let before: HashSet<i64> = deleted.lock().unwrap().clone();
                    let q = &data[(i % n) * dim..(i % n + 1) * dim];
                    for id in search(idx, q, 10, 8) {
                        assert!(!before.contains(&id), "deleted id {id} returned");
                    }
                    i += 2;
                }
            });
        }
        for chunk in gone.chunks(50) {
            assert_eq!(idx.delete(chunk).unwrap(), chunk.len());
            deleted
                .lock()
                .unwrap()
                .extend(chunk.iter().map(|&x| x as i64));
        }
        stop.store(true, Ordering::Relaxed);
    });
    for (i, v) in data.chunks_exact(dim).enumerate().step_by(3) {
        assert!(!search(&idx, v, 10, 16).contains(&(i as i64)));
    }
    // Deleting again changes nothing; re-inserting an id revives it.
    assert_eq!(idx.delete(&gone[..5]).unwrap(), 0);
    let v = &data[..dim];
    assert_eq!(idx.insert(v, Some(&[0])).unwrap(), vec![0]);
    assert_eq!(search(&idx, v, 1, 8)[0], 0);
    // Live ids cannot be inserted twice.
    let e = idx.insert(v, Some(&[0])).unwrap_err().to_string();
    assert!(e.contains("already in the index"), "{e}");
    idx.maintain().unwrap();
    let rep = idx.check().unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    assert_eq!(rep.live_ids as usize, idx.len());
}

#[test]
fn churn_reuses_ids_and_head_slots() {
    // Delete and insert a tenth of the index twenty times over, from a
    // shifted distribution: internal ids of deleted vectors and slots of
    // retired heads are reused, so the maps follow the live set; every
    // insert is found by its own query, no deleted id comes back, and a
    // reopened index (log replayed over reused ids) answers the same.
    let (n, dim) = (3000, 16);
    let data = clustered(n, dim, 11);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idx");
    build_at(
        &path,
        &data,
        dim,
        None,
        params(n, dim, |o| o.posting_limit = Some(32)),
    );
    let mut live: Vec<u64> = (0..n as u64).collect();
    let mut gone: Vec<u64> = Vec::new();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let slots_at_start;
    {
        let idx = PartitionIndex::open(&path, &quiet()).unwrap();
        slots_at_start = read(&idx.loaded().versions).len();
        for round in 0..20u64 {
            let mut del = Vec::new();
            for _ in 0..n / 10 {
                let i = rng.random_range(0..live.len());
                del.push(live.swap_remove(i));
            }
            assert_eq!(idx.delete(&del).unwrap(), del.len());
            gone.extend(&del);
            let mut add = clustered(n / 10, dim, 1000 + round);
            for x in add.iter_mut() {
                *x += 3.0;
            }
            let got = idx.insert(&add, None).unwrap();
            for (v, &id) in add.chunks_exact(dim).zip(&got).step_by(7) {
                assert_eq!(search(&idx, v, 1, 8)[0], id as i64, "round {round}");
            }
            live.extend(&got);
            idx.maintain().unwrap();
            if round == 9 {
                idx.checkpoint().unwrap();
            }
        }
        // Ids deleted are never answered, though their internal ids now
        // carry other vectors.
        let gone_set: HashSet<i64> = gone.iter().map(|&g| g as i64).collect();
        for v in data.chunks_exact(dim).step_by(13) {
            assert!(search(&idx, v, 10, 16)
                .iter()
                .all(|id| !gone_set.contains(id)));
        }
        // One internal slot per live vector (deletes and inserts balance).
        assert_eq!(read(&idx.loaded().versions).len(), slots_at_start);
        // Appends scatter a posting's tail; once the worker is done, no
        // posting is read in more requests than a contiguous one.
        let worst = read(&idx.loaded().postings)
            .iter()
            .flatten()
            .filter(|r| scattered(&r.blocks))
            .map(|r| runs(&r.blocks).len())
            .max();
        assert_eq!(worst, None, "a posting scattered over runs");
        let info = idx.info();
        let u = &info["updates"];
        assert!(u["splits"].as_u64().unwrap() > 0, "{u}");
        let h = &info["heads"];
        let (live_heads, tomb) = (
            h["live"].as_u64().unwrap(),
            h["tombstones"].as_u64().unwrap(),
        );
        assert!(tomb <= (live_heads / 32).max(64), "{h}");
        let rep = idx.check().unwrap();
        assert!(rep.problems.is_empty(), "{:?}", rep.problems);
    }
    let idx = PartitionIndex::open(&path, &quiet()).unwrap();
    live.sort_unstable();
    assert_eq!(idx.live_ids(), live);
    let gone_set: HashSet<i64> = gone.iter().map(|&g| g as i64).collect();
    for v in data.chunks_exact(dim).step_by(13) {
        assert!(search(&idx, v, 10, 16)
            .iter()
            .all(|id| !gone_set.contains(id)));
    }
    let rep = idx.check().unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}

#[test]
fn the_log_is_replayed_and_checkpoints_trim_it() {
    let (n, dim) = (1500, 8);
    let data = clustered(n, dim, 5);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idx");
    build_at(&path, &data, dim, None, params(n, dim, |_| {}));
    let extra = clustered(200, dim, 6);
    {
        let idx = PartitionIndex::open(&path, &quiet()).unwrap();
        idx.insert(&extra[..100 * dim], None).unwrap();
        idx.delete(&[1, 2, 3]).unwrap();
        // No checkpoint: dropped as a crash would leave it.
    }
    {
        let idx = PartitionIndex::open(&path, &quiet()).unwrap();
        assert_eq!(idx.len(), n + 100 - 3);
        assert!(!idx.contains(2) && idx.contains(n as u64 + 99));
        let seq = idx.checkpoint().unwrap();
        assert_eq!(seq, 2);
        idx.insert(&extra[100 * dim..], None).unwrap();
    }
    let idx = PartitionIndex::open(&path, &quiet()).unwrap();
    assert_eq!(idx.len(), n + 200 - 3);
    assert_eq!(idx.manifest().wal_sequence, 2);
    let v = &extra[150 * dim..151 * dim];
    assert_eq!(search(&idx, v, 1, 8)[0], (n + 150) as i64);
    let rep = idx.check().unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}

#[test]
fn damage_is_detected() {
    let (n, dim) = (800, 8);
    let data = clustered(n, dim, 9);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idx");
    build_at(&path, &data, dim, None, params(n, dim, |_| {}));
    // A flipped byte in a posting block: searches reading it fail with a
    // corruption error, and the check reports it.
    let p = path.join(POSTINGS_FILE);
    let mut b = std::fs::read(&p).unwrap();
    b[BLOCK + 100] ^= 0x10;
    std::fs::write(&p, &b).unwrap();
    let idx = PartitionIndex::open(&path, &quiet()).unwrap();
    let rep = idx.check().unwrap();
    assert!(
        rep.problems.iter().any(|m| m.contains("checksum")),
        "{:?}",
        rep.problems
    );
    let all = search_all(&idx, &data, dim);
    assert!(all.is_err());
    drop(idx);
    // A damaged state file or manifest refuses to open.
    let m = read_manifest(&path).unwrap();
    let sp = path.join(&m.state_file);
    let mut s = std::fs::read(&sp).unwrap();
    s[20] ^= 1;
    std::fs::write(&sp, &s).unwrap();
    let e = PartitionIndex::open(&path, &quiet()).err().unwrap();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    // A truncated postings file too.
    s[20] ^= 1;
    std::fs::write(&sp, &s).unwrap();
    std::fs::write(&p, &b[..BLOCK]).unwrap();
    let e = PartitionIndex::open(&path, &quiet()).err().unwrap();
    assert!(e.to_string().contains("truncated"), "{e}");
}

/// A stale entry that reads as current (what 7-bit versions allowed after
/// 64 re-inserts into one slot), and an entry above its live id's version:
/// the check names both.
#[test]
fn the_check_sees_a_stale_entry_that_reads_as_current() {
    let (n, dim) = (600, 8);
    let data = clustered(n, dim, 12);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idx");
    build_at(&path, &data, dim, None, params(n, dim, |_| {}));
    let idx = PartitionIndex::open(&path, &quiet()).unwrap();
    assert!(idx.check().unwrap().problems.is_empty());
    let inner = idx.loaded();
    let slot = lock(&inner.ids).tracker.get(5).unwrap();
    let ver = read(&inner.versions)[slot as usize].load(Ordering::Acquire);
    let other = &data[9 * dim..10 * dim];
    let p = (0..read(&inner.heads).slots() as u32)
        .find(|&h| {
            read(&inner.postings)
                .get(h as usize)
                .cloned()
                .flatten()
                .is_some()
        })
        .unwrap();
    let mut stream = Vec::new();
    posting::push_entry(&mut stream, slot, ver, other);
    posting::push_entry(&mut stream, slot, ver + 5, other);
    assert!(inner.append(p, &stream, 2).unwrap());
    let rep = idx.check().unwrap();
    assert!(
        rep.problems
            .iter()
            .any(|m| m.contains("live id 5 has entries of two different vectors")),
        "{:?}",
        rep.problems
    );
    assert!(
        rep.problems
            .iter()
            .any(|m| m.contains(&format!("holds version {} of live id 5", ver + 5))),
        "{:?}",
        rep.problems
    );
}

fn search_all(idx: &PartitionIndex, data: &[f32], dim: usize) -> Result<()> {
    let nq = data.len() / dim;
    idx.search(
        data,
        nq,
        &PartitionSearch {
            k: 5,
            nprobe: 64,
            l: None,
            probe_cut: None,
            threads: Some(1),
            queries_in_flight: None,
        },
    )
    .map(|_| ())
}

#[test]
fn bad_input_is_refused() {
    let (n, dim) = (500, 8);
    let data = clustered(n, dim, 2);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idx");
    build_at(&path, &data, dim, None, params(n, dim, |_| {}));
    let idx = PartitionIndex::open(&path, &quiet()).unwrap();
    assert!(idx.insert(&[1.0; 7], None).is_err());
    assert!(idx.insert(&[f32::NAN; 8], None).is_err());
    assert!(idx.insert(&[1.0; 16], Some(&[9999, 9999])).is_err());
    assert!(idx.insert(&[1.0; 8], Some(&[1, 2])).is_err());
    let s = |k, nprobe, cut| {
        idx.search(
            &data[..dim],
            1,
            &PartitionSearch {
                k,
                nprobe,
                l: None,
                probe_cut: cut,
                threads: None,
                queries_in_flight: None,
            },
        )
    };
    assert!(s(0, 4, None).is_err());
    assert!(s(5, 0, None).is_err());
    assert!(s(5, 4, Some(-1.0)).is_err());
    assert!(s(5, 4, Some(0.5)).is_ok());
    // A second writer is refused while the first holds the log.
    let e = PartitionIndex::open(&path, &quiet()).err().unwrap();
    assert!(e.to_string().contains("another writer"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// Whatever mix of inserts and deletes, after splits, merges and
    /// reassignments every live id has a current entry in some posting and
    /// no deleted id does; and the posting of its nearest head holds it
    /// (SPFresh's nearest-partition assignment), so its own query finds it
    /// probing one posting.
    #[test]
    fn lire_keeps_every_live_id_in_a_posting(seed in 0u64..1000, lire in any::<bool>()) {
        let (n, dim) = (400, 8);
        let data = clustered(n, dim, seed);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idx");
        build_at(&path, &data, dim, None, params(n, dim, |o| {
            o.posting_limit = Some(24);
            o.merge_threshold = Some(6);
            o.lire = Some(lire);
        }));
        let idx = PartitionIndex::open(&path, &quiet()).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut live: Vec<u64> = (0..n as u64).collect();
        let mut vector_of: HashMap<u64, Vec<f32>> =
            data.chunks_exact(dim).enumerate().map(|(i, v)| (i as u64, v.to_vec())).collect();
        for round in 0..12 {
            // Seeds apart from the base's (seed 0, round 0 would repeat it).
            let add = clustered(60, dim, 1_000_000 + seed * 100 + round);
            let got = idx.insert(&add, None).unwrap();
            for (&id, v) in got.iter().zip(add.chunks_exact(dim)) {
                vector_of.insert(id, v.to_vec());
            }
            live.extend(got);
            let mut del = Vec::new();
            for _ in 0..50 {
                let i = rng.random_range(0..live.len());
                del.push(live.swap_remove(i));
            }
            idx.delete(&del).unwrap();
            // Searches queue merges of postings they find small.
            search(&idx, &add, 5, 16);
            idx.maintain().unwrap();
        }
        let rep = idx.check().unwrap();
        prop_assert!(rep.problems.is_empty(), "{:?}", rep.problems);
        live.sort_unstable();
        prop_assert_eq!(idx.live_ids(), live.clone());
        let queries: Vec<f32> = live.iter().flat_map(|id| vector_of[id].iter().copied()).collect();
        // Found: itself, or another id at distance 0 (a copy of its vector).
        let missed = |nprobe: usize, l: Option<usize>| -> Vec<u64> {
            let got = idx.search(&queries, live.len(), &PartitionSearch {
                k: 1, nprobe, l, probe_cut: None, threads: Some(2), queries_in_flight: None,
            }).unwrap();
            live.iter().zip(got.ids.iter().zip(&got.distances))
                .filter(|(&id, (&g, &d))| g != id as i64 && d > 0.0).map(|(&id, _)| id).collect()
        };
        // At the default nprobe every live vector is found by its own query.
        let m = missed(idx.params().nprobe.unwrap_or(DEFAULT_NPROBE), None);
        prop_assert!(m.is_empty(), "not found by their own query: {:?}", m);
        // (The calibrated nprobe can be as small as 2 here: a vector outside
        // its two nearest heads' postings is then missed. Seed 624 left 2
        // such vectors while a split read only the postings around the old
        // head; a new head far from it was nearest to them.)
        // Probing one posting, routed by the head search inserts use, misses
        // only what `check` counts outside its nearest head's posting: a
        // split reads the `reassign_k` postings nearest the old head and
        // each new one, so a vector held only beyond them whose nearest head
        // is now a new one stays where it is (and the head graph's search is
        // approximate). Measured: 0 of ~520 ids in each of 300 cases since
        // the postings around the new heads are read too; 2 of ~520 at most
        // before; before LIRE's reassignment kept every vector in its
        // nearest head's posting, 13 of ~500 were outside it after this
        // churn.
        let m1 = missed(1, Some(build::REPLICA_L));
        prop_assert_eq!(m1.len() as u64, rep.outside_nearest);
        prop_assert!(rep.outside_nearest * 100 <= live.len() as u64, "{} of {} outside their nearest head's posting", rep.outside_nearest, live.len());
        if lire {
            prop_assert!(idx.info()["updates"]["splits"].as_u64().unwrap() > 0);
        }
    }
}

/// The log's writes fail or tear, then the machine loses what was not
/// synced: the update whose record failed returns an error and changes
/// nothing, later ones are refused, and the reopened index holds every
/// acknowledged update (the failed one at most in addition, when its bytes
/// were all written) and passes `check`.
#[test]
fn a_torn_or_failed_log_write_loses_no_acknowledged_update() {
    use crate::io::faulty::{Faults, FaultyFile};
    let dim = 8;
    let data = clustered(1300, dim, 5);
    let opts = PartitionOpen {
        durability: Durability::Sync,
        ..quiet()
    };
    for (case, faults) in [
        Faults {
            fail_write: Some(2),
            tear: Some(30),
            fail_sync: None,
        },
        Faults {
            fail_sync: Some(2),
            ..Faults::default()
        },
    ]
    .into_iter()
    .enumerate()
    {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        build_at(
            &dir,
            &data[..1000 * dim],
            dim,
            None,
            params(1000, dim, |_| {}),
        );
        let idx = PartitionIndex::open(&dir, &opts).unwrap();
        let mut live: Vec<u64> = (0..1000).collect();
        let mut handle = None;
        idx.inject_log_faults(|f, synced| {
            let ff = Arc::new(FaultyFile::new(f, synced, faults.clone()));
            handle = Some(Arc::clone(&ff));
            ff
        })
        .unwrap();
        let ff = handle.unwrap();
        let failed = insert_until_injected_fault(&data, dim, &mut live, case, |rows, ids| {
            idx.insert(rows, Some(ids)).map(|_| ())
        });
        assert_eq!(idx.live_ids(), live, "case {case}");
        assert!(idx.delete(&[3]).is_err());
        assert_eq!(idx.live_ids(), live, "case {case}");
        drop(idx);
        let log = dir.join(WAL_FILE);
        let bytes = std::fs::read(&log).unwrap();
        std::fs::write(&log, &bytes[..ff.power_loss_len() as usize]).unwrap();
        drop(ff); // (it holds the file, and with it the writer's lock)
        let idx = PartitionIndex::open(&dir, &opts).unwrap();
        let mut got = idx.live_ids();
        if got.len() != live.len() {
            got.retain(|i| !failed.contains(i));
        }
        assert_eq!(got, live, "case {case}");
        let rep = idx.check().unwrap();
        assert!(rep.problems.is_empty(), "case {case}: {:?}", rep.problems);
    }
}
