//! In-place updates of a graph index, end to end: inserts and deletes
//! rewrite the disk graph (no delta searched), inserted vectors are found,
//! deleted ids never returned, recall holds against the live set, the log
//! of page images replays after a reopen (with or without a checkpoint),
//! a torn page write is repaired from the log, failed and torn log and page
//! writes lose no acknowledged update, `check` passes, maintain
//! compacts the tombstones, and layouts that cannot be updated in place
//! are refused.

use super::test_data::{check_ok, clustered, finds_itself, recall_on_live};
use super::Index;
use crate::data::matrix::Matrix;
use crate::distance::Metric;
use crate::format::{Preset, UpdateMode};
use crate::planner::{BuildOptions, OpenOptions, PresetChoice, SearchOptions};
use crate::util::Budget;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;

const DIM: usize = 16;
const N: usize = 3000;

fn build(dir: &Path, preset: Preset, data: &[f32], n: usize, update: Option<UpdateMode>) {
    let o = BuildOptions {
        metric: Metric::L2,
        preset: PresetChoice::Named(preset),
        r: Some(24),
        build_l: Some(48),
        threads: Some(2),
        memory_budget: Some(Budget::Bytes(4 << 20)),
        update,
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

fn open(dir: &Path) -> Index {
    Index::open(
        dir,
        &OpenOptions {
            threads: Some(2),
            memory_budget: Some(Budget::Bytes(4 << 20)),
            ..Default::default()
        },
    )
    .unwrap()
}

/// A `diskann` index built in place on the first `n0` of `N + 50`
/// clustered vectors (seed `seed`; the last 50 are queries), open, in a
/// temporary directory (`idx` in it): the directory, the vectors, the index.
fn built_in_place(seed: u64, n0: usize) -> (tempfile::TempDir, Vec<f32>, Index) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let all = clustered(N + 50, DIM, seed);
    build(&dir, Preset::Diskann, &all, n0, Some(UpdateMode::InPlace));
    let idx = open(&dir);
    (tmp, all, idx)
}

/// `diskann` indexes of the same `N` clustered vectors (seed `seed`), one
/// built in place (`ip`) and one out of place (`oop`), in a temporary
/// directory: the directory and the two index paths.
fn built_both_ways(seed: u64) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let all = clustered(N, DIM, seed);
    let (ip_dir, oop_dir) = (tmp.path().join("ip"), tmp.path().join("oop"));
    build(&ip_dir, Preset::Diskann, &all, N, Some(UpdateMode::InPlace));
    build(&oop_dir, Preset::Diskann, &all, N, None);
    (tmp, ip_dir, oop_dir)
}

/// Recall@10 at L 64 against the live set (see `test_data::recall_on_live`).
fn measure(idx: &Index, live: &BTreeMap<u64, Vec<f32>>, queries: &[f32]) -> f64 {
    recall_on_live(idx, live, queries, DIM, true)
}

/// Builds on 80%, inserts the rest in place and deletes 10% of the built
/// vectors; checks results, then a reopen without a checkpoint (replay),
/// a checkpoint and reopen, and maintain's compaction.
fn round_trip(preset: Preset, update_at_build: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let all = clustered(N + 100, DIM, 11);
    let (data, queries) = all.split_at(N * DIM);
    let n0 = N * 8 / 10;
    let mode = update_at_build.then_some(UpdateMode::InPlace);
    build(&dir, preset, data, n0, mode);
    let mut live: BTreeMap<u64, Vec<f32>> = (0..n0)
        .map(|i| (i as u64, data[i * DIM..(i + 1) * DIM].to_vec()))
        .collect();
    let opts = OpenOptions {
        threads: Some(2),
        memory_budget: Some(Budget::Bytes(4 << 20)),
        update: Some(UpdateMode::InPlace),
        ..Default::default()
    };
    let idx = Index::open(&dir, &opts).unwrap();
    let before = measure(&idx, &live, queries);
    let pages = std::fs::metadata(dir.join("pages.bin")).unwrap().len();

    let ids = idx.insert(&data[n0 * DIM..], None).unwrap();
    assert_eq!(ids, (n0 as u64..N as u64).collect::<Vec<_>>());
    for (j, &i) in ids.iter().enumerate() {
        live.insert(i, data[(n0 + j) * DIM..(n0 + j + 1) * DIM].to_vec());
    }
    // The disk graph took them: the page file grew, no delta holds them.
    assert!(std::fs::metadata(dir.join("pages.bin")).unwrap().len() > pages);
    finds_itself(&idx, &live, &ids[..50]);
    let gone: Vec<u64> = (0..n0 as u64).step_by(10).collect();
    assert_eq!(idx.delete(&gone).unwrap(), gone.len());
    assert_eq!(idx.delete(&gone).unwrap(), 0, "a deleted id is not live");
    for g in &gone {
        live.remove(g);
    }
    let after = measure(&idx, &live, queries);
    assert!(
        after >= 0.9,
        "recall after in-place updates {after} (before {before})"
    );
    let mut expect: Vec<u64> = live.keys().copied().collect();
    expect.sort_unstable();
    assert_eq!(idx.live_ids().unwrap(), expect);
    check_ok(&idx);
    drop(idx);

    // Reopen: the log's page images replay.
    let idx = Index::open(&dir, &opts).unwrap();
    assert_eq!(idx.live_ids().unwrap(), expect);
    let replayed = measure(&idx, &live, queries);
    assert!((replayed - after).abs() < 1e-9, "{replayed} vs {after}");
    idx.checkpoint().unwrap();
    drop(idx);
    // After a checkpoint the index opens as it was left, in place by its
    // manifest.
    let idx = open(&dir);
    assert_eq!(idx.live_ids().unwrap(), expect);
    assert!((measure(&idx, &live, queries) - after).abs() < 1e-9);
    check_ok(&idx);
    // More updates, then maintain: the tombstones are merged away.
    let more = idx
        .insert(
            &queries[..5 * DIM],
            Some(&[90_000, 90_001, 90_002, 90_003, 90_004]),
        )
        .unwrap();
    for (j, &i) in more.iter().enumerate() {
        live.insert(i, queries[j * DIM..(j + 1) * DIM].to_vec());
    }
    idx.maintain().unwrap();
    let rep = idx.check_json().unwrap();
    assert_eq!(rep["problems"], serde_json::json!([]), "check: {rep}");
    let mut expect: Vec<u64> = live.keys().copied().collect();
    expect.sort_unstable();
    assert_eq!(idx.live_ids().unwrap(), expect);
    let compacted = measure(&idx, &live, queries);
    assert!(compacted >= 0.9, "recall after compaction {compacted}");
    finds_itself(&idx, &live, &more);
    drop(idx);
    let idx = open(&dir);
    assert_eq!(idx.live_ids().unwrap(), expect);
}

#[test]
fn diskann_preset_updates_in_place() {
    round_trip(Preset::Diskann, true);
}

#[test]
fn pipeann_preset_switches_to_in_place_at_open() {
    round_trip(Preset::Pipeann, false);
}

/// A page write lost after its log record was durable (a crash between
/// the two) is written again from the log at the next open.
#[test]
fn a_lost_page_write_is_redone_from_the_log() {
    let n0 = N - 200;
    let (tmp, all, idx) = built_in_place(5, n0);
    let dir = tmp.path().join("idx");
    let (data, queries) = all.split_at(N * DIM);
    let pages = dir.join("pages.bin");
    let clean = std::fs::read(&pages).unwrap();
    idx.insert(&data[n0 * DIM..], None).unwrap();
    idx.delete(&[1, 2, 3]).unwrap();
    let updated = std::fs::read(&pages).unwrap();
    drop(idx);
    // Undo every page write since the build (as if none reached the disk)
    // and tear one block of the inserted tail.
    let mut torn = clean.clone();
    torn.extend_from_slice(&updated[clean.len()..updated.len() - 4096]);
    torn.extend(std::iter::repeat_n(0xA5u8, 2048));
    std::fs::write(&pages, &torn).unwrap();
    let idx = open(&dir);
    assert_eq!(
        std::fs::read(&pages).unwrap(),
        updated,
        "the log rewrote every block"
    );
    let live: BTreeMap<u64, Vec<f32>> = (0..N)
        .filter(|&i| !(1..=3).contains(&i))
        .map(|i| (i as u64, data[i * DIM..(i + 1) * DIM].to_vec()))
        .collect();
    assert!(measure(&idx, &live, queries) >= 0.9);
    check_ok(&idx);
}

#[test]
fn layouts_that_carry_other_nodes_data_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let data = clustered(1000, DIM, 3);
    for preset in [Preset::Starling, Preset::Gorgeous] {
        let dir = tmp.path().join(preset.name());
        let e = super::test_data::build_error(
            &data,
            DIM,
            &dir,
            &BuildOptions {
                preset: PresetChoice::Named(preset),
                update: Some(UpdateMode::InPlace),
                threads: Some(2),
                ..Default::default()
            },
        );
        assert!(
            e.contains("in_place") && e.contains("layout"),
            "{preset:?}: {e}"
        );
        build(&dir, preset, &data, 1000, None);
        let e = Index::open(
            &dir,
            &OpenOptions {
                update: Some(UpdateMode::InPlace),
                ..Default::default()
            },
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(e.contains("in place"), "{preset:?}: {e}");
    }
}

#[test]
fn bad_updates_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let data = clustered(1000, DIM, 9);
    build(
        &dir,
        Preset::Diskann,
        &data,
        1000,
        Some(UpdateMode::InPlace),
    );
    let idx = open(&dir);
    let before = std::fs::read(dir.join("pages.bin")).unwrap();
    let mut nan = data[..DIM].to_vec();
    nan[3] = f32::NAN;
    assert!(idx.insert(&nan, None).is_err());
    assert!(idx.insert(&data[..DIM - 1], None).is_err());
    assert!(
        idx.insert(&data[..DIM], Some(&[5])).is_err(),
        "id 5 is live"
    );
    assert!(idx.insert(&data[..2 * DIM], Some(&[7000, 7000])).is_err());
    assert_eq!(idx.delete(&[123_456]).unwrap(), 0);
    assert_eq!(std::fs::read(dir.join("pages.bin")).unwrap(), before);
    assert_eq!(idx.live_ids().unwrap().len(), 1000);
}

/// Searches run while one writer inserts and deletes in place: no search
/// returns an id whose delete had returned before it began, every insert
/// is found by its own vector once it returns, and deleted slots are
/// taken again (the page file stops growing once deletes keep pace).
#[test]
fn searches_beside_in_place_updates_never_see_a_deleted_id() {
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let all = clustered(N + 600, DIM, 17);
    let n0 = N;
    build(&dir, Preset::Diskann, &all, n0, Some(UpdateMode::InPlace));
    let idx = Arc::new(open(&dir));
    let deleted: Arc<Mutex<HashSet<i64>>> = Arc::new(Mutex::new(HashSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let queries: Vec<f32> = all[..200 * DIM].to_vec();
    let searchers: Vec<_> = (0..2)
        .map(|t| {
            let (idx, deleted, stop, queries) =
                (idx.clone(), deleted.clone(), stop.clone(), queries.clone());
            std::thread::spawn(move || {
                let mut rounds = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let before = deleted.lock().unwrap().clone();
                    let q = &queries[(rounds + t) % 200 * DIM..][..DIM];
                    let out = idx.search(q, 1, &SearchOptions::new(10)).unwrap();
                    for id in out.ids {
                        assert!(!before.contains(&id), "search returned deleted id {id}");
                    }
                    rounds += 1;
                }
                rounds
            })
        })
        .collect();
    // A thread reading info() (which holds the open index for a moment and
    // may wait for the state) beside the updates.
    let informer = {
        let (idx, stop) = (idx.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                assert!(idx.info()["updates"]["strategy"] == "in_place");
                n += 1;
            }
            n
        })
    };
    for j in 0..600usize {
        // Delete one of the first 200 built ids (searched by the readers),
        // then insert a new vector.
        if j < 200 {
            assert_eq!(idx.delete(&[j as u64]).unwrap(), 1);
            deleted.lock().unwrap().insert(j as i64);
        }
        let row = &all[(n0 + j) * DIM..(n0 + j + 1) * DIM];
        let id = idx.insert(row, None).unwrap()[0];
        let out = idx.search(row, 1, &SearchOptions::new(5)).unwrap();
        assert!(
            out.ids.contains(&(id as i64)),
            "insert {id} not found by its vector"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for s in searchers {
        assert!(s.join().unwrap() > 0);
    }
    assert!(informer.join().unwrap() > 0);
    // Each insert took the slot the delete before it freed (the medoid's
    // excepted, which stays a routing tombstone): 400 new slots.
    let rep = idx.check_json().unwrap();
    assert_eq!(rep["problems"], serde_json::json!([]), "check: {rep}");
    let tomb = rep["tombstones"].as_u64().unwrap();
    assert!(tomb <= 1, "{rep}");
    assert_eq!(
        rep["nodes"].as_u64().unwrap(),
        (n0 + 400) as u64 + tomb,
        "{rep}"
    );
    assert_eq!(
        rep["live_ids"].as_u64().unwrap(),
        (n0 + 400) as u64,
        "{rep}"
    );
}

/// Once the page images logged since the last checkpoint pass the log's
/// limit, the update that passed it checkpoints: the manifest moves on, the
/// log is dropped up to it, and a reopen finds every update.
#[test]
fn a_full_log_checkpoints_by_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let all = clustered(N, DIM, 29);
    let n0 = N - 300;
    build(&dir, Preset::Diskann, &all, n0, Some(UpdateMode::InPlace));
    let idx = open(&dir);
    let super::Kind::Graph(slot) = &idx.kind else {
        panic!("not a graph index")
    };
    slot.set_in_place_log_limit(64 << 10);
    let ids = idx.insert(&all[n0 * DIM..], None).unwrap();
    let m = crate::io::files::read_manifest(&dir).unwrap();
    assert!(m.wal_sequence > 0, "no checkpoint was written");
    assert!(m.n > n0, "the checkpoint holds the inserts so far");
    let log = std::fs::metadata(dir.join("wal.log")).unwrap().len();
    assert!(
        log < 4 * (64 << 10) + 4096 * 64,
        "the log was not dropped: {log} bytes"
    );
    drop(idx);
    let idx = open(&dir);
    let live: BTreeMap<u64, Vec<f32>> = (0..N)
        .map(|i| (i as u64, all[i * DIM..(i + 1) * DIM].to_vec()))
        .collect();
    finds_itself(&idx, &live, &ids);
    check_ok(&idx);
}

/// Where a fault is put: the log's writes or the page file's.
#[derive(Clone, Copy, Debug)]
enum Target {
    Log,
    Pages,
}

/// The log's or the page file's writes fail or tear, or a sync fails; the
/// machine then loses what was not synced (the log past its synced bytes;
/// every page write since the fault went in). The update that met the
/// fault returns an error, later updates are refused, and the reopened
/// index holds every acknowledged update: a failed one too when its log
/// record was whole (always for a page fault, which comes after the log
/// record is durable). `check` passes and the index takes updates again.
#[test]
fn failed_or_torn_log_and_page_writes_lose_no_acknowledged_update() {
    use crate::io::faulty::{Faults, FaultyFile};
    let data = clustered(1300, DIM, 17);
    let fail = |n, tear| Faults {
        fail_write: Some(n),
        tear,
        fail_sync: None,
    };
    let sync = Faults {
        fail_sync: Some(0),
        ..Faults::default()
    };
    for (case, (target, faults)) in [
        (Target::Log, fail(2, Some(40))),
        (Target::Log, fail(3, None)),
        (Target::Log, sync.clone()),
        (Target::Pages, fail(40, Some(1000))),
        (Target::Pages, fail(25, None)),
        (Target::Pages, sync),
    ]
    .into_iter()
    .enumerate()
    {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("idx");
        build(
            &dir,
            Preset::Diskann,
            &data,
            1000,
            Some(UpdateMode::InPlace),
        );
        let idx = open(&dir);
        idx.delete(&[1]).unwrap();
        let mut live: Vec<u64> = (0..1000).filter(|&i| i != 1).collect();
        let super::Kind::Graph(slot) = &idx.kind else {
            panic!("not a graph index")
        };
        let pages = dir.join("pages.bin");
        let before = std::fs::read(&pages).unwrap();
        let mut handle = None;
        let mut wrap = |f, synced| {
            let ff = std::sync::Arc::new(FaultyFile::new(f, synced, faults.clone()));
            handle = Some(std::sync::Arc::clone(&ff));
            ff as std::sync::Arc<dyn crate::io::DurableFile>
        };
        match target {
            Target::Log => slot.inject_log_faults(&mut wrap).unwrap(),
            Target::Pages => slot.inject_page_faults(&mut wrap).unwrap(),
        }
        let ff = handle.unwrap();
        // One vector a call; with page faults, a checkpoint every 4
        // inserts (it syncs the page file: what a power loss keeps).
        let mut failed = None;
        let mut synced = before;
        for e in 1000..1060u64 {
            let row = &data[e as usize * DIM..(e as usize + 1) * DIM];
            let mut r = idx.insert(row, Some(&[e])).map(drop);
            if r.is_ok() {
                live.push(e);
                if matches!(target, Target::Pages) && e % 4 == 3 {
                    r = idx.checkpoint().map(drop);
                    if r.is_ok() {
                        synced = std::fs::read(&pages).unwrap();
                    }
                }
            } else {
                failed = Some(e);
            }
            if let Err(err) = r {
                assert!(err.to_string().contains("injected"), "case {case}: {err}");
                break;
            }
        }
        assert!(ff.calls() != (0, 0), "case {case}: no write met the fault");
        assert!(
            idx.insert(&data[1200 * DIM..1201 * DIM], Some(&[1200]))
                .is_err(),
            "case {case}: an update after the fault was taken"
        );
        assert!(idx.delete(&[2]).is_err(), "case {case}");
        drop(idx);
        // The power loss.
        match target {
            Target::Log => {
                let log = dir.join("wal.log");
                let bytes = std::fs::read(&log).unwrap();
                std::fs::write(&log, &bytes[..ff.power_loss_len() as usize]).unwrap();
            }
            Target::Pages => std::fs::write(&pages, &synced).unwrap(),
        }
        drop(ff);
        let idx = open(&dir);
        let mut got = idx.live_ids().unwrap();
        live.sort_unstable();
        match (target, failed) {
            (Target::Pages, Some(f)) => {
                live.push(f);
                live.sort_unstable();
            }
            (Target::Log, Some(f)) if got.len() != live.len() => got.retain(|&i| i != f),
            _ => {}
        }
        assert_eq!(got, live, "case {case} ({target:?})");
        let map: BTreeMap<u64, Vec<f32>> = live
            .iter()
            .map(|&i| (i, data[i as usize * DIM..(i as usize + 1) * DIM].to_vec()))
            .collect();
        finds_itself(&idx, &map, &live[live.len() - 5..]);
        check_ok(&idx);
        idx.insert(&data[1250 * DIM..1251 * DIM], Some(&[1250]))
            .unwrap();
        assert!(idx.live_ids().unwrap().contains(&1250), "case {case}");
    }
}

/// A deleted slot is taken by an insert only after a sweep round removed
/// every live node's edge to it: right after the deletes, the edges their
/// repairs missed may remain and the last slots wait; updates run the
/// sweep, after which no live node points at a tombstone, inserts take the
/// freed slots before the page file grows, and `check` (which refuses an
/// edge to a free slot) passes throughout.
#[test]
fn the_sweep_frees_deleted_slots_once_no_edge_leads_to_them() {
    let n0 = N - 300;
    let (tmp, all, idx) = built_in_place(31, n0);
    let dir = tmp.path().join("idx");
    let (data, queries) = all.split_at(N * DIM);
    let report = |idx: &Index| {
        let r = idx.check_json().unwrap();
        assert_eq!(r["problems"], serde_json::json!([]), "check: {r}");
        (
            r["edges_to_tombstones"].as_u64().unwrap(),
            r["free_slots"].as_u64().unwrap(),
            r["nodes"].as_u64().unwrap(),
        )
    };
    // Each delete runs a slice of the sweep; a slot is freed by the first
    // round that starts after its delete, so the last ones still wait.
    let gone: Vec<u64> = (0..n0 as u64).step_by(10).collect();
    assert_eq!(idx.delete(&gone).unwrap(), gone.len());
    let (dangling, free, nodes) = report(&idx);
    assert_eq!(nodes, n0 as u64);
    assert!(free < gone.len() as u64, "every slot is free at once");
    // Inserts run the sweep and take the freed slots.
    let mut live: BTreeMap<u64, Vec<f32>> = (0..n0)
        .filter(|i| i % 10 != 0)
        .map(|i| (i as u64, data[i * DIM..(i + 1) * DIM].to_vec()))
        .collect();
    let mut grew = 0;
    for i in n0..N {
        let before = report(&idx).2;
        idx.insert(&data[i * DIM..(i + 1) * DIM], Some(&[i as u64]))
            .unwrap();
        live.insert(i as u64, data[i * DIM..(i + 1) * DIM].to_vec());
        grew += (report(&idx).2 > before) as usize;
    }
    let (dangling_after, _, nodes_after) = report(&idx);
    assert_eq!(
        dangling_after, 0,
        "the sweep left edges to tombstones ({dangling} before)"
    );
    assert!(
        grew < 300 && nodes_after < N as u64,
        "the inserts took no freed slot: {grew} grew the file"
    );
    assert!(measure(&idx, &live, queries) >= 0.9);
    // A reopen sweeps again before it reuses a slot.
    drop(idx);
    let idx = open(&dir);
    let (_, free, _) = report(&idx);
    assert_eq!(free, 0);
    finds_itself(&idx, &live, &[(N - 1) as u64, 5, 17]);
}

/// An index updated in place grows its PQ table where it is (address space
/// reserved at open), so a growth never holds two copies; only past that
/// room does a growth copy, and the update's reservation counts the copy.
#[test]
fn the_pq_table_grows_in_place_and_a_copy_is_counted() {
    use crate::index::graph::{load_pq, GraphIndex};
    use crate::io::EngineKind;
    let (_tmp, ip_dir, oop_dir) = built_both_ways(5);
    let m = crate::io::files::read_manifest(&ip_dir).unwrap();
    let len = N * m.spec.pq_bytes;
    let p = load_pq(&ip_dir, &m).unwrap();
    assert_eq!(p.codes.len(), len);
    assert!(
        p.codes.capacity() >= len + (64 << 20),
        "{}",
        p.codes.capacity()
    );
    let fixed = load_pq(
        &oop_dir,
        &crate::io::files::read_manifest(&oop_dir).unwrap(),
    )
    .unwrap();
    assert_eq!(
        fixed.codes.capacity(),
        len,
        "out of place: no room reserved"
    );

    let plan = crate::planner::plan_open(&OpenOptions::default(), &m).unwrap();
    let mut g = GraphIndex::open(&ip_dir, &m, &plan, EngineKind::Pread, false).unwrap();
    let before = g.pq().unwrap().codes.to_vec();
    let at = g.pq().unwrap().codes.as_ptr();
    let room = g.pq().unwrap().codes.capacity() / m.spec.pq_bytes;
    // Within the room: several huge pages' worth of rows, nothing moves.
    let n = (room - 1000).min(N + (8 << 20) / m.spec.pq_bytes);
    assert_eq!(g.moving_bytes_at(n), 0);
    g.grow_to(n).unwrap();
    let p = g.pq().unwrap();
    assert_eq!(p.codes.as_ptr(), at, "grew where it was");
    assert!(p.codes.len() >= n * m.spec.pq_bytes);
    assert_eq!(&p.codes[..len], &before[..]);
    // Past the room the table is copied, and the copy is what a
    // reservation holds beside the growth.
    let far = room + 10;
    assert_eq!(g.moving_bytes_at(far), p.codes.memory_bytes() as u64);
    g.grow_to(far).unwrap();
    let p = g.pq().unwrap();
    assert_eq!(&p.codes[..len], &before[..]);
    assert!(p.codes.capacity() >= far * m.spec.pq_bytes + (64 << 20));
}

/// An index updated in place is never read by one open while another
/// rewrites its pages: a writable open excludes every other open, read-only
/// opens share, and a compaction's new directory keeps the writer's lock.
#[test]
fn a_writable_in_place_open_excludes_other_opens() {
    let (tmp, all, idx) = built_in_place(13, 600);
    let dir = tmp.path().join("idx");
    let ro = OpenOptions {
        read_only: true,
        ..Default::default()
    };
    let refused = |opts: &OpenOptions, what: &str| {
        let e = Index::open(&dir, opts).err().expect(what).to_string();
        assert!(e.contains("updated in place"), "{what}: {e}");
        e
    };
    let e = refused(&ro, "a read-only open beside the writer");
    assert!(e.contains("cannot follow"), "{e}");
    let e = refused(&OpenOptions::default(), "a second writable open");
    assert!(e.contains("excludes every other open"), "{e}");
    // Compaction swaps a new directory in, locked before the swap.
    idx.insert(&all[600 * DIM..610 * DIM], None).unwrap();
    let dead: Vec<u64> = (0..40).collect();
    idx.delete(&dead).unwrap();
    idx.maintain().unwrap();
    refused(&ro, "a read-only open after the compaction");
    // Updates left in the log (no checkpoint), several rewriting the same
    // blocks: a read-only open replays them without writing.
    idx.insert(&all[610 * DIM..630 * DIM], None).unwrap();
    idx.delete(&[50, 51, 52, 53]).unwrap();
    let live = idx.check_json().unwrap()["live_ids"].clone();
    drop(idx);
    // Without a writer, read-only opens share the index and search it...
    let (a, b) = (
        Index::open(&dir, &ro).unwrap(),
        Index::open(&dir, &ro).unwrap(),
    );
    let q = &all[610 * DIM..611 * DIM];
    let s = SearchOptions {
        k: 5,
        ..Default::default()
    };
    assert_eq!(
        a.search(q, 1, &s).unwrap().ids,
        b.search(q, 1, &s).unwrap().ids
    );
    assert_eq!(a.check_json().unwrap()["live_ids"], live);
    check_ok(&a);
    // ...and keep a writer out while they are open.
    refused(&OpenOptions::default(), "a writable open beside readers");
    drop((a, b));
    let w = open(&dir);
    w.delete(&[100]).unwrap();
    check_ok(&w);
}

/// An index updated in place opens its PQ table to grow, in a mapping held
/// in whole huge pages however small the table: the open plan counts it as
/// held, so the cache gets what is left and the open stays within its
/// budget (a 6.9 MB table held as 8.4 MB once overran a 13.8 MB budget).
#[test]
fn the_open_plan_counts_a_growable_pq_table_as_held() {
    let (_tmp, ip_dir, oop_dir) = built_both_ways(17);
    let huge = 2u64 << 20;
    for (dir, growable) in [(&ip_dir, true), (&oop_dir, false)] {
        let m = crate::io::files::read_manifest(dir).unwrap();
        let bare = (N * m.spec.pq_bytes) as u64;
        assert!(bare < huge, "{bare}");
        // A budget whose cache could hold every record several times over
        // if the table were counted at its bare size.
        let budget = 3 * huge;
        let idx = super::test_data::open_with_budget(dir, budget);
        let info = idx.info();
        let mem = &info["memory"];
        let want = if growable { huge } else { bare };
        assert_eq!(mem["pq_codes"], want, "{growable}: {mem}");
        assert_eq!(mem["plan"]["pq_codes"], want, "{growable}: {mem}");
        assert_eq!(mem["within_budget"], true, "{growable}: {mem}");
        assert!(
            mem["total"].as_u64().unwrap() <= budget,
            "{growable}: {mem}"
        );
    }
}

/// A BFS cache loaded at open holds the records nearest the start (in
/// hops); deletes there, and inserts taking their slots, leave it holding
/// records from anywhere (measured: on a 30k prefix of wordnet each churn
/// cycle of 5% cost 0.4 cache hits a query, most of the reads in-place
/// churn added). An in-place checkpoint loads it anew over the graph as it
/// stands, within what it held and within the budget.
#[test]
fn a_checkpoint_reloads_the_bfs_cache_over_the_updated_graph() {
    use crate::cache::{AnyCache, NodeCache};
    let n0 = N - 300;
    let (tmp, all, idx) = built_in_place(41, n0);
    drop(idx);
    let dir = tmp.path().join("idx");
    let budget = (2u64 << 20) + (300 << 10);
    let idx = super::test_data::open_with_budget(&dir, budget);
    let cached = |idx: &Index| -> Vec<u32> {
        let open = idx.graph().unwrap();
        let c = open.g.cache().unwrap();
        match &*c {
            AnyCache::Bfs(c) => c.nodes(),
            AnyCache::Adjacency(_) => panic!("a diskann index has a node cache"),
        }
    };
    let fresh_bfs = |idx: &Index, nodes: usize| -> Vec<u32> {
        let open = idx.graph().unwrap();
        let (layout, pages) = open.g.layout_and_pages();
        let medoid = open.g.manifest().medoid;
        NodeCache::load_bfs(&pages, &layout, open.g.nodes(), medoid, nodes)
            .unwrap()
            .nodes()
    };
    let before = cached(&idx);
    assert!(
        before.len() > 100 && before.len() < n0 / 2,
        "the budget caches {} of {n0} nodes",
        before.len()
    );
    assert_eq!(before, fresh_bfs(&idx, before.len()));
    // Half the cached nodes go (the start stays), and new vectors come.
    let medoid = idx.graph().unwrap().g.manifest().medoid;
    let gone: Vec<u64> = before
        .iter()
        .filter(|&&v| v != medoid)
        .step_by(2)
        .map(|&v| v as u64)
        .collect();
    assert_eq!(idx.delete(&gone).unwrap(), gone.len());
    let ids: Vec<u64> = (n0 as u64..N as u64).collect();
    idx.insert(&all[n0 * DIM..N * DIM], Some(&ids)).unwrap();
    let stale = cached(&idx);
    assert_ne!(
        stale,
        fresh_bfs(&idx, stale.len()),
        "the updates left the cache as a fresh load would have it"
    );
    idx.checkpoint().unwrap();
    let after = cached(&idx);
    assert_eq!(after, fresh_bfs(&idx, after.len()));
    assert!(
        after.len() * 10 >= before.len() * 9 && after.len() <= before.len(),
        "{} nodes cached after the reload, {} at open",
        after.len(),
        before.len()
    );
    let info = idx.info();
    let mem = &info["memory"];
    assert_eq!(mem["within_budget"], true, "{mem}");
    assert!(mem["peak_total"].as_u64().unwrap() <= budget, "{mem}");
    check_ok(&idx);
}
