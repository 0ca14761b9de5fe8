//! Out-of-place updates of a graph index, end to end: every graph preset
//! (id, shuffled, replicated and coded layouts) takes inserts and deletes,
//! finds inserted vectors, never returns deleted ids, merges into a new
//! disk graph with the recall of a fresh build, replays its log after a
//! reopen, follows a writer from a read-only open, stays within its
//! memory budget, and refuses bad updates without changing anything.

use super::test_data::{
    check_ok, clustered, finds_itself, insert_until_injected_fault, recall_on_live,
};
use super::Index;
use crate::data::matrix::Matrix;
use crate::distance::Metric;
use crate::format::{Preset, Section};
use crate::planner::{BuildOptions, OpenOptions, PresetChoice, SearchOptions};
use crate::util::Budget;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;

const DIM: usize = 16;
const N: usize = 3000;

fn build(dir: &Path, preset: Preset, data: &[f32], n: usize) {
    let o = BuildOptions {
        metric: Metric::L2,
        preset: PresetChoice::Named(preset),
        r: Some(24),
        build_l: Some(48),
        threads: Some(2),
        memory_budget: Some(Budget::Bytes(4 << 20)),
        ..Default::default()
    };
    super::build(
        Matrix::from_vec(data[..n * DIM].to_vec(), n, DIM).unwrap(),
        dir,
        &o,
        &|_, _, _| {},
        &AtomicBool::new(false),
    )
    .unwrap();
}

fn open(dir: &Path, read_only: bool) -> Index {
    Index::open(
        dir,
        &OpenOptions {
            threads: Some(2),
            read_only,
            memory_budget: Some(Budget::Bytes(4 << 20)),
            ..Default::default()
        },
    )
    .unwrap()
}

/// Open options whose budget leaves `room` bytes above the open's
/// minimum, so the delta's share is small and fills.
fn tight(dir: &Path, room: u64) -> OpenOptions {
    let probe = open(dir, true);
    let budget = probe.open_plan().unwrap().memory.minimum + room;
    OpenOptions {
        threads: Some(2),
        memory_budget: Some(Budget::Bytes(budget)),
        ..Default::default()
    }
}

/// Recall@10 at L 64 against the live set (see `test_data::recall_on_live`).
fn measure(idx: &Index, live: &BTreeMap<u64, Vec<f32>>, queries: &[f32]) -> f64 {
    recall_on_live(idx, live, queries, DIM, false)
}

/// Builds on 80% of the data, inserts the rest and deletes 10% of the
/// built vectors, then merges and reopens, checking recall and results
/// at every stage.
fn round_trip(preset: Preset) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let all = clustered(N + 100, DIM, 11);
    let (data, queries) = all.split_at(N * DIM);
    let n0 = N * 8 / 10;
    build(&dir, preset, data, n0);
    let mut live: BTreeMap<u64, Vec<f32>> = (0..n0)
        .map(|i| (i as u64, data[i * DIM..(i + 1) * DIM].to_vec()))
        .collect();
    let idx = open(&dir, false);
    let reader = open(&dir, true);
    let before = measure(&idx, &live, queries);

    let new: Vec<f32> = data[n0 * DIM..].to_vec();
    let ids = idx.insert(&new, None).unwrap();
    assert_eq!(ids, (n0 as u64..N as u64).collect::<Vec<_>>());
    for (j, &i) in ids.iter().enumerate() {
        live.insert(i, new[j * DIM..(j + 1) * DIM].to_vec());
    }
    let gone: Vec<u64> = (0..n0 as u64).filter(|i| i % 10 == 3).collect();
    assert_eq!(idx.delete(&gone).unwrap(), gone.len());
    assert_eq!(
        idx.delete(&gone).unwrap(),
        0,
        "a second delete finds nothing live"
    );
    for i in &gone {
        live.remove(i);
    }
    let during = measure(&idx, &live, queries);
    finds_itself(&idx, &live, &ids[..50]);
    assert_eq!(
        measure(&reader, &live, queries),
        during,
        "{preset:?}: the reader sees the writer's updates"
    );
    assert_eq!(
        idx.live_ids().unwrap(),
        live.keys().copied().collect::<Vec<_>>()
    );
    check_ok(&idx);
    let info = idx.info();
    assert_eq!(info["updates"]["live"], live.len());
    assert_eq!(info["memory"]["within_budget"], true, "{info}");
    assert!(info["memory"]["updates"].as_u64().unwrap() > 0);

    // The merge writes a new disk graph holding the live set.
    let m0 = idx.manifest().unwrap();
    let seq = idx.checkpoint().unwrap();
    assert!(seq >= 2);
    let m = idx.manifest().unwrap();
    // The inserts are a fifth of the result: a merge keeps the codebook
    // (byte for byte) and encodes only the inserts.
    let pq_kept = idx.info()["updates"]["since_open"]["last_merge"]["pq_kept"].as_bool();
    if m0.has(Section::PqCodebook) {
        assert_eq!(pq_kept, Some(true), "{preset:?}");
        assert_eq!(
            m.sections[&Section::PqCodebook].crc32c,
            m0.sections[&Section::PqCodebook].crc32c
        );
        assert_eq!(m.spec.pq_bytes, m0.spec.pq_bytes);
    } else {
        assert_eq!(pq_kept, Some(false), "{preset:?}: a coded layout has no PQ");
    }
    assert_eq!(m.n, live.len());
    assert_eq!(m.wal_sequence, seq);
    assert_eq!(
        m.layout.kind,
        open(&dir, true).manifest().unwrap().layout.kind
    );
    let after = measure(&idx, &live, queries);
    check_ok(&idx);
    finds_itself(&idx, &live, &ids[..50]);
    assert_eq!(idx.info()["updates"]["inserted_since_merge"], 0);
    assert_eq!(
        measure(&reader, &live, queries),
        after,
        "{preset:?}: the reader loads the merged index"
    );

    // A fresh build of the same live set, for comparison.
    let fresh_dir = tmp.path().join("fresh");
    let rows: Vec<f32> = live.values().flatten().copied().collect();
    build(&fresh_dir, preset, &rows, live.len());
    let fresh = open(&fresh_dir, true);
    let keys: Vec<u64> = live.keys().copied().collect();
    let relabeled: BTreeMap<u64, Vec<f32>> = keys
        .iter()
        .enumerate()
        .map(|(j, k)| (j as u64, live[k].clone()))
        .collect();
    let fresh_recall = measure(&fresh, &relabeled, queries);
    eprintln!(
        "{preset:?}: recall@10 before {before:.3}, with updates {during:.3}, merged {after:.3}, \
         fresh build {fresh_recall:.3}"
    );
    assert!(during >= 0.9, "{preset:?}: recall with updates {during}");
    assert!(
        after >= fresh_recall - 0.03,
        "{preset:?}: merged {after} vs fresh {fresh_recall}"
    );

    // Updates after the merge, then a reopen replays them.
    let more = clustered(40, DIM, 99);
    let ids2 = idx.insert(&more, None).unwrap();
    assert_eq!(
        ids2[0], N as u64,
        "automatic ids continue above every id given"
    );
    for (j, &i) in ids2.iter().enumerate() {
        live.insert(i, more[j * DIM..(j + 1) * DIM].to_vec());
    }
    idx.delete(&ids[..5]).unwrap();
    for i in &ids[..5] {
        live.remove(i);
    }
    drop(idx);
    let idx = open(&dir, false);
    assert_eq!(
        idx.live_ids().unwrap(),
        live.keys().copied().collect::<Vec<_>>()
    );
    finds_itself(&idx, &live, &ids2);
    measure(&idx, &live, queries);
    check_ok(&idx);
}

#[test]
fn diskann_preset_updates_out_of_place() {
    round_trip(Preset::Diskann);
}

#[test]
fn starling_preset_updates_out_of_place() {
    round_trip(Preset::Starling);
}

#[test]
fn gorgeous_preset_updates_out_of_place() {
    round_trip(Preset::Gorgeous);
}

#[test]
fn alayalaser_preset_updates_out_of_place() {
    round_trip(Preset::Alayalaser);
}

#[test]
fn dgai_preset_updates_out_of_place() {
    round_trip(Preset::Dgai);
}

#[test]
fn bad_updates_are_refused_and_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let data = clustered(500, DIM, 3);
    build(&dir, Preset::Diskann, &data, 500);
    let idx = open(&dir, false);
    let v = clustered(2, DIM, 5);
    let msg = |r: crate::Result<Vec<u64>>| r.unwrap_err().to_string();
    assert!(msg(idx.insert(&v[..DIM + 1], None)).contains("dimension"));
    let mut nan = v.clone();
    nan[3] = f32::NAN;
    assert!(msg(idx.insert(&nan, None)).contains("row 0"));
    assert!(msg(idx.insert(&v, Some(&[7, 501]))).contains("already in the index"));
    assert!(msg(idx.insert(&v, Some(&[600, 600]))).contains("appears more than once"));
    assert!(msg(idx.insert(&v, Some(&[600]))).contains("ids given for"));
    assert_eq!(idx.live_ids().unwrap().len(), 500);
    assert_eq!(idx.delete(&[10_000]).unwrap(), 0);
    let ro = open(&dir, true);
    assert!(ro
        .insert(&v, None)
        .unwrap_err()
        .to_string()
        .contains("read-only"));
    assert!(ro
        .delete(&[1])
        .unwrap_err()
        .to_string()
        .contains("read-only"));
    assert!(ro
        .checkpoint()
        .unwrap_err()
        .to_string()
        .contains("read-only"));
    assert_eq!(ro.live_ids().unwrap().len(), 500);
    // A second writer of the same index is refused at its first update.
    idx.delete(&[1]).unwrap();
    let other = open(&dir, false);
    assert!(other.delete(&[2]).is_err());
    check_ok(&idx);
}

#[test]
fn a_torn_log_tail_is_dropped_on_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let data = clustered(400, DIM, 4);
    build(&dir, Preset::Diskann, &data, 400);
    {
        let idx = open(&dir, false);
        idx.insert(&clustered(3, DIM, 8), Some(&[1000, 1001, 1002]))
            .unwrap();
        idx.delete(&[5]).unwrap();
    }
    // A record cut short by a kill.
    use std::io::Write;
    let wal = dir.join(super::fresh::WAL_FILE);
    let mut f = std::fs::OpenOptions::new().append(true).open(&wal).unwrap();
    f.write_all(&[200, 0, 0, 0, 3, 0, 0]).unwrap();
    drop(f);
    let idx = open(&dir, false);
    let live = idx.live_ids().unwrap();
    assert_eq!(live.len(), 402);
    assert!(live.contains(&1001) && !live.contains(&5));
    idx.insert(&clustered(1, DIM, 9), Some(&[2000])).unwrap();
    drop(idx);
    let idx = open(&dir, false);
    assert!(idx.live_ids().unwrap().contains(&2000));
    check_ok(&idx);
}

#[test]
fn a_full_delta_merges_within_the_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let data = clustered(2000, DIM, 6);
    build(&dir, Preset::Diskann, &data, 1000);
    // A budget just above the open's minimum leaves the delta little room.
    let probe = open(&dir, true);
    let min = probe.open_plan().unwrap().memory.minimum;
    drop(probe);
    let budget = min + (200 << 10);
    // The insert that fills the delta merges before it returns.
    let idx = Index::open(
        &dir,
        &OpenOptions {
            threads: Some(2),
            memory_budget: Some(Budget::Bytes(budget)),
            background_updates: false,
            ..Default::default()
        },
    )
    .unwrap();
    let mut live: BTreeMap<u64, Vec<f32>> = (0..1000)
        .map(|i| (i as u64, data[i * DIM..(i + 1) * DIM].to_vec()))
        .collect();
    for b in 0..10 {
        let rows = &data[(1000 + b * 100) * DIM..(1100 + b * 100) * DIM];
        let ids = idx.insert(rows, None).unwrap();
        for (j, &i) in ids.iter().enumerate() {
            live.insert(i, rows[j * DIM..(j + 1) * DIM].to_vec());
        }
        let info = idx.info();
        assert_eq!(
            info["memory"]["within_budget"], true,
            "batch {b}: {}",
            info["memory"]
        );
    }
    let info = idx.info();
    assert!(
        info["updates"]["since_open"]["merges"].as_u64().unwrap() >= 1,
        "the delta's share should have forced a merge: {}",
        info["updates"]
    );
    // Queries from the data's distribution (rows of the same clusters).
    let q = clustered(2020, DIM, 6)[2000 * DIM..].to_vec();
    let r = measure(&idx, &live, &q);
    assert!(r > 0.9, "recall@10 {r} after merges");
    check_ok(&idx);
}

/// Searches run beside inserts, deletes and the merges a small delta share
/// forces: no search fails, none returns an id deleted before it began,
/// and every vector inserted before it began is found by its own query.
#[test]
fn searches_beside_updates_and_merges_see_every_acknowledged_update() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let data = clustered(2400, DIM, 12);
    build(&dir, Preset::Diskann, &data, 1000);
    let probe = open(&dir, true);
    let budget = probe.open_plan().unwrap().memory.minimum + (150 << 10);
    drop(probe);
    let idx = Index::open(
        &dir,
        &OpenOptions {
            threads: Some(2),
            memory_budget: Some(Budget::Bytes(budget)),
            ..Default::default()
        },
    )
    .unwrap();
    // Acknowledged updates: (inserted id, deleted ids), in order.
    let inserted: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    let deleted: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let row = |i: u64| &data[i as usize * DIM..(i as usize + 1) * DIM];
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            for b in 0..70u64 {
                let ids: Vec<u64> = (1000 + b * 20..1020 + b * 20).collect();
                let rows: Vec<f32> = ids.iter().flat_map(|&i| row(i).to_vec()).collect();
                idx.insert(&rows, Some(&ids)).unwrap();
                inserted.lock().unwrap().extend(&ids);
                let gone = [b * 7 % 1000, 1000 + b * 20 + 3];
                idx.delete(&gone).unwrap();
                deleted.lock().unwrap().extend(gone);
            }
            stop.store(true, Ordering::Release);
        });
        let reader = s.spawn(|| {
            let mut rounds = 0;
            while !stop.load(Ordering::Acquire) || rounds < 3 {
                let ins: Vec<u64> = inserted.lock().unwrap().clone();
                let del: std::collections::HashSet<u64> =
                    deleted.lock().unwrap().iter().copied().collect();
                let probe: Vec<u64> = ins
                    .iter()
                    .rev()
                    .filter(|i| !del.contains(i))
                    .take(8)
                    .copied()
                    .collect();
                let mut qs: Vec<f32> = probe.iter().flat_map(|&i| row(i).to_vec()).collect();
                qs.extend_from_slice(row(5));
                let nq = probe.len() + 1;
                let out = idx.search(&qs, nq, &SearchOptions::new(5)).unwrap();
                for &id in &out.ids {
                    assert!(
                        id < 0 || !del.contains(&(id as u64)),
                        "deleted id {id} returned"
                    );
                }
                for (j, &i) in probe.iter().enumerate() {
                    assert!(
                        out.ids[j * 5..(j + 1) * 5].contains(&(i as i64)),
                        "acknowledged insert {i} not found"
                    );
                }
                rounds += 1;
            }
            rounds
        });
        writer.join().unwrap();
        let rounds = reader.join().unwrap();
        assert!(rounds >= 3);
    });
    // The last background merge may still run: the checkpoint waits for it
    // and merges the rest.
    idx.checkpoint().unwrap();
    let merges = idx.info()["updates"]["since_open"]["merges"]
        .as_u64()
        .unwrap();
    assert!(merges >= 3, "merges: {merges}");
    let del: std::collections::HashSet<u64> = deleted.into_inner().unwrap().into_iter().collect();
    let want: Vec<u64> = (0..2400u64).filter(|i| !del.contains(i)).collect();
    assert_eq!(idx.live_ids().unwrap(), want);
    check_ok(&idx);
}

/// A full delta merges in the background while inserts go on into it (the
/// merge is held back here until the test lets it go): inserts and
/// deletes acknowledged meanwhile are searchable, survive the merge's
/// swap, and a reopen finds the merged index with exactly the acknowledged
/// state.
#[test]
fn inserts_go_on_while_a_background_merge_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let data = clustered(2600, DIM, 8);
    build(&dir, Preset::Diskann, &data, 1000);
    let opts = tight(&dir, 300 << 10);
    let idx = Index::open(&dir, &opts).unwrap();
    let slot = idx.slot().unwrap();
    let share = idx.info()["updates"]["delta_share"].as_u64().unwrap();
    let gate = std::sync::Arc::clone(&slot.merge_gate);
    let held = gate.lock().unwrap();
    let mut live: BTreeMap<u64, Vec<f32>> = (0..1000)
        .map(|i| (i as u64, data[i * DIM..(i + 1) * DIM].to_vec()))
        .collect();
    let mut next = 1000usize;
    let insert = |idx: &Index, live: &mut BTreeMap<u64, Vec<f32>>, next: &mut usize, n: usize| {
        let rows = &data[*next * DIM..(*next + n) * DIM];
        let ids = idx.insert(rows, None).unwrap();
        for (j, &i) in ids.iter().enumerate() {
            live.insert(i, rows[j * DIM..(j + 1) * DIM].to_vec());
        }
        *next += n;
        ids
    };
    // Fill the delta until a merge starts.
    while !slot.merging() {
        insert(&idx, &mut live, &mut next, 10);
        assert!(next < 2400, "no merge started (share {share} bytes)");
    }
    let seq_at_start = idx.info()["updates"]["wal_applied"].as_u64().unwrap();
    // It cannot finish: updates go on into the delta, and are seen.
    let during = insert(&idx, &mut live, &mut next, 10);
    assert!(slot.merging());
    let gone: Vec<u64> = vec![3, 4, during[0]];
    assert_eq!(idx.delete(&gone).unwrap(), 3);
    for g in &gone {
        live.remove(g);
    }
    finds_itself(&idx, &live, &during[1..]);
    assert_eq!(
        idx.live_ids().unwrap(),
        live.keys().copied().collect::<Vec<_>>()
    );
    assert_eq!(idx.info()["updates"]["since_open"]["merges"], 0);
    // Let it go; the checkpoint waits for it, then merges what came after.
    drop(held);
    let seq = idx.checkpoint().unwrap();
    assert!(seq > seq_at_start);
    let info = idx.info();
    assert_eq!(info["updates"]["since_open"]["merges"], 2, "{info}");
    assert_eq!(info["updates"]["inserted_since_merge"], 0);
    assert_eq!(idx.manifest().unwrap().n, live.len());
    assert_eq!(
        idx.live_ids().unwrap(),
        live.keys().copied().collect::<Vec<_>>()
    );
    finds_itself(&idx, &live, &during[1..]);
    check_ok(&idx);
    // Updates after it, then a reopen.
    let after = insert(&idx, &mut live, &mut next, 5);
    drop(idx);
    let idx = Index::open(&dir, &opts).unwrap();
    assert_eq!(
        idx.live_ids().unwrap(),
        live.keys().copied().collect::<Vec<_>>()
    );
    finds_itself(&idx, &live, &after);
    check_ok(&idx);
}

/// Closing an index while its background merge runs cancels the merge;
/// the log keeps every update and the reopen replays them.
#[test]
fn closing_during_a_background_merge_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let data = clustered(2600, DIM, 9);
    build(&dir, Preset::Diskann, &data, 1000);
    let opts = tight(&dir, 300 << 10);
    let idx = Index::open(&dir, &opts).unwrap();
    let gate = std::sync::Arc::clone(&idx.slot().unwrap().merge_gate);
    let held = gate.lock().unwrap();
    let mut n = 1000;
    while !idx.slot().unwrap().merging() {
        idx.insert(&data[n * DIM..(n + 10) * DIM], None).unwrap();
        n += 10;
        assert!(n < 2400);
    }
    idx.delete(&[7]).unwrap();
    // The merge thread waits at the gate; closing cancels it and waits for
    // the thread, which then leaves its result unused.
    let going = idx.slot().unwrap().me.clone();
    let closer = std::thread::spawn(move || drop(idx));
    while going.upgrade().is_some_and(|s| !s.cancel_requested()) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    drop(held);
    closer.join().unwrap();
    assert_eq!(going.strong_count(), 0, "the closed index is gone");
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "staging left behind: {leftovers:?}");
    let idx = Index::open(&dir, &opts).unwrap();
    let want: Vec<u64> = (0..n as u64).filter(|&i| i != 7).collect();
    assert_eq!(idx.live_ids().unwrap(), want);
    assert_eq!(idx.manifest().unwrap().n, 1000, "the merge did not happen");
    check_ok(&idx);
    // The closed index held the log's lock no longer: this open writes.
    idx.delete(&[8]).unwrap();
    assert!(!idx.live_ids().unwrap().contains(&8));
}

/// The log's writes fail or tear (a chosen write cut short, or a failed
/// `fdatasync`), then the machine loses what was not synced: the update
/// whose record failed returns an error and changes nothing in memory,
/// later updates are refused, and the reopened index holds every
/// acknowledged update (the failed one at most in addition, when its
/// bytes were all written) and passes `check`.
#[test]
fn a_torn_or_failed_log_write_loses_no_acknowledged_update() {
    use crate::io::faulty::{Faults, FaultyFile};
    let data = clustered(1400, DIM, 13);
    for (case, faults) in [
        Faults {
            fail_write: Some(2),
            tear: Some(40),
            fail_sync: None,
        },
        Faults {
            fail_write: Some(3),
            tear: None,
            fail_sync: None,
        },
        Faults {
            fail_sync: Some(1),
            ..Faults::default()
        },
    ]
    .into_iter()
    .enumerate()
    {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("idx");
        build(&dir, Preset::Diskann, &data, 1000);
        let idx = open(&dir, false);
        let mut live: Vec<u64> = (0..1000).collect();
        idx.delete(&[1]).unwrap();
        live.retain(|&i| i != 1);
        let mut handle = None;
        idx.slot()
            .unwrap()
            .inject_log_faults(|f, synced| {
                let ff = std::sync::Arc::new(FaultyFile::new(f, synced, faults.clone()));
                handle = Some(std::sync::Arc::clone(&ff));
                ff
            })
            .unwrap();
        let ff = handle.unwrap();
        let failed = insert_until_injected_fault(&data, DIM, &mut live, case, |rows, ids| {
            idx.insert(rows, Some(ids)).map(|_| ())
        });
        // Nothing of the failed insert is in memory; later updates are refused.
        live.sort_unstable();
        assert_eq!(idx.live_ids().unwrap(), live, "case {case}");
        assert!(idx.insert(&data[..DIM], Some(&[5000])).is_err());
        assert!(idx.delete(&[2]).is_err());
        assert_eq!(idx.live_ids().unwrap(), live, "case {case}");
        drop(idx);
        // The power loss: only the synced bytes of the log survive.
        let log = dir.join(super::fresh::WAL_FILE);
        let bytes = std::fs::read(&log).unwrap();
        std::fs::write(&log, &bytes[..ff.power_loss_len() as usize]).unwrap();
        drop(ff); // (it holds the file, and with it the writer's lock)
        let idx = open(&dir, false);
        let mut got = idx.live_ids().unwrap();
        if got.len() != live.len() {
            // The failed insert's record was whole on disk.
            got.retain(|i| !failed.contains(i));
        }
        assert_eq!(got, live, "case {case}");
        check_ok(&idx);
        // The reopened index takes updates again.
        idx.insert(&data[1300 * DIM..1301 * DIM], Some(&[1300]))
            .unwrap();
        assert!(idx.live_ids().unwrap().contains(&1300));
    }
}
