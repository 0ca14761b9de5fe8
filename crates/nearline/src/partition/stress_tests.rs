//! Visibility under concurrency: inserters, deleters and searchers in
//! threads on one partition index with LIRE running in the background.
//! An insert's own vector must find it as soon as `insert` returns; an id
//! must never come back from a search that began after its `delete`
//! returned. `NEARLINE_STRESS_INSERTS` sets the number of inserts (a long
//! mode); by default a short run for CI.

use super::tests::{build_at, params, quiet};
use super::*;
use crate::index::test_data::clustered;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::sync::atomic::AtomicUsize;

/// Inserts of the stress run: `NEARLINE_STRESS_INSERTS`, or `default`.
pub(super) fn stress_inserts(default: usize) -> usize {
    std::env::var("NEARLINE_STRESS_INSERTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn knn(idx: &PartitionIndex, q: &[f32], k: usize) -> Vec<i64> {
    idx.search(
        q,
        1,
        &PartitionSearch {
            k,
            nprobe: DEFAULT_NPROBE,
            l: None,
            probe_cut: None,
            threads: Some(1),
            queries_in_flight: None,
        },
    )
    .unwrap()
    .ids
}

#[test]
fn inserts_are_visible_and_deletes_final_under_concurrent_updates_and_searches() {
    let (n, dim) = (2000, 16);
    let data = clustered(n, dim, 11);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idx");
    // Small postings: splits, merges and reassignments all the time.
    build_at(
        &path,
        &data,
        dim,
        None,
        params(n, dim, |o| {
            o.posting_limit = Some(24);
            o.merge_threshold = Some(4);
        }),
    );
    let idx = PartitionIndex::open(
        &path,
        &PartitionOpen {
            background: true,
            ..quiet()
        },
    )
    .unwrap();
    let total = stress_inserts(6000);
    let inserters = 4;
    let searchers = 3;
    let done = AtomicUsize::new(0);
    let misses = AtomicUsize::new(0);
    let returned_deleted = AtomicUsize::new(0);
    // Ids whose delete has returned (never inserted again).
    let deleted = RwLock::new(HashSet::<i64>::new());
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..inserters {
            let (idx, done, misses, deleted, returned_deleted) =
                (&idx, &done, &misses, &deleted, &returned_deleted);
            s.spawn(move || {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(100 + t as u64);
                let fresh = clustered(total / inserters + 1, dim, 1000 + t as u64);
                let mut mine: Vec<(u64, usize)> = Vec::new();
                for (j, v) in fresh.chunks_exact(dim).enumerate() {
                    if done.fetch_add(1, Ordering::Relaxed) >= total {
                        break;
                    }
                    // Ids of their own: thread t takes n + t, n + t + 4, ...
                    let id = (n + t + j * inserters) as u64;
                    idx.insert(v, Some(&[id])).unwrap();
                    if !knn(idx, v, 10).contains(&(id as i64)) {
                        misses.fetch_add(1, Ordering::Relaxed);
                    }
                    mine.push((id, j));
                    if rng.random_range(0..4) == 0 {
                        let (gone, row) = mine.swap_remove(rng.random_range(0..mine.len()));
                        assert_eq!(idx.delete(&[gone]).unwrap(), 1);
                        deleted.write().unwrap().insert(gone as i64);
                        let q = &fresh[row * dim..(row + 1) * dim];
                        if knn(idx, q, 10).contains(&(gone as i64)) {
                            returned_deleted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
        for t in 0..searchers {
            let (idx, deleted, stop, data, returned_deleted) =
                (&idx, &deleted, &stop, &data, &returned_deleted);
            s.spawn(move || {
                let mut i = t * 7;
                while !stop.load(Ordering::Relaxed) {
                    let before = deleted.read().unwrap().clone();
                    let q = &data[(i % n) * dim..(i % n + 1) * dim];
                    for id in knn(idx, q, 10) {
                        if before.contains(&id) {
                            returned_deleted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    i += 13;
                }
            });
        }
        // The searchers run until the inserters are through.
        while done.load(Ordering::Relaxed) < total {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        stop.store(true, Ordering::Relaxed);
    });
    let inner = idx.loaded();
    let c = &inner.counters;
    eprintln!(
        "stress: {total} inserts, {} misses, {} deleted ids returned; splits {}, merges {}, \
         reassigned {}",
        misses.load(Ordering::Relaxed),
        returned_deleted.load(Ordering::Relaxed),
        c.splits.load(Ordering::Relaxed),
        c.merges.load(Ordering::Relaxed),
        c.reassigned.load(Ordering::Relaxed),
    );
    assert!(c.splits.load(Ordering::Relaxed) > 0);
    assert_eq!(
        misses.load(Ordering::Relaxed),
        0,
        "acknowledged inserts missed"
    );
    assert_eq!(
        returned_deleted.load(Ordering::Relaxed),
        0,
        "deleted ids returned"
    );
    idx.maintain().unwrap();
    let rep = idx.check().unwrap();
    assert!(rep.problems.is_empty(), "{:?}", rep.problems);
}
