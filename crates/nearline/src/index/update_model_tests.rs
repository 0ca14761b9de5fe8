//! A model-based test of updates: random sequences of inserts, deletes,
//! re-inserts of one id, searches, checkpoints, maintenance, reopens and
//! crash recoveries run against a mutable index and against an in-memory
//! brute-force model (a map from live id to its current vector). After
//! every step:
//!
//! * every live id's current vector, searched exactly, finds that id;
//! * every result is a live id of the model at the distance of its
//!   *current* vector (so no deleted id and no stale vector comes back);
//! * `len`, `live_ids` and `check` agree with the model.
//!
//! The sequences include thousands of updates of one id, and the churn that
//! reuses internal slots (delete the newest id, insert a new one).
//! `NEARLINE_MODEL_STEPS` sets the total number of steps to run (a long
//! mode: e.g. 1000000); by default a short run for CI. Every mutable index
//! kind runs through the [`Index`] facade, so a kind that takes updates is
//! covered by adding it to [`KINDS`].

use super::Index;
use crate::distance::Metric;
use crate::format::IndexKind;
use crate::io::EngineKind;
use crate::planner::{BuildOptions, OpenOptions, PresetChoice, SearchOptions};
use crate::update::wal::Durability;
use crate::util::Budget;
use proptest::prelude::*;
use proptest::test_runner::Config;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Steps and single updates (inserts and deletes of one vector) run so far
/// in this process, reported after each sequence.
static STEPS: AtomicU64 = AtomicU64::new(0);
static UPDATES: AtomicU64 = AtomicU64::new(0);

/// Dimension of the test vectors.
const DIM: usize = 8;
/// Vectors of the initial build.
const BUILD_N: usize = 60;
/// Stale vectors the model remembers (searched after every step).
const STALE_KEPT: usize = 48;
/// The id most of the re-insert steps hit.
const HOT: u64 = 7;
/// An id close to the top of the signed 64-bit range.
const TOP: u64 = i64::MAX as u64;

/// The mutable index kinds under test.
const KINDS: [IndexKind; 2] = [IndexKind::Partition, IndexKind::Graph];

/// The vector of seed `s`: around one of 6 centres, so that postings fill,
/// split and merge; every seed gives another vector.
fn vector(s: u64) -> Vec<f32> {
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(s ^ 0x9e37_79b9_7f4a_7c15);
    let c = (s % 6) as f32;
    (0..DIM)
        .map(|j| (c * (j as f32 + 1.0)).sin() * 10.0 + r.random_range(-1.0f32..1.0))
        .collect()
}

fn l2(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

/// Ids an insert names.
#[derive(Debug, Clone)]
enum Ids {
    /// The index assigns them.
    Auto,
    /// Given: new or reused ones.
    Given(Vec<u64>),
}

#[derive(Debug, Clone)]
enum Step {
    /// Insert vectors of these seeds.
    Insert {
        seeds: Vec<u64>,
        ids: Ids,
    },
    /// Delete these ids (some may be unknown).
    Delete(Vec<u64>),
    /// `rounds` times: delete `id`, insert a new vector under it.
    Replace {
        id: u64,
        seed: u64,
        rounds: u32,
    },
    /// `rounds` times: delete the newest live id, insert a new one with an
    /// automatic id (frees and reuses internal slots).
    Churn {
        seed: u64,
        rounds: u32,
    },
    Checkpoint,
    Maintain,
    /// Close cleanly and open again.
    Reopen,
    /// Close without a checkpoint (the log holds every update since the
    /// last), leaving a half-written state file as a kill during a
    /// checkpoint would; open again.
    Crash,
}

impl Step {
    /// Single-vector inserts and deletes the step asks for.
    fn updates(&self) -> u64 {
        match self {
            Step::Insert { seeds, .. } => seeds.len() as u64,
            Step::Delete(ids) => ids.len() as u64,
            Step::Replace { rounds, .. } | Step::Churn { rounds, .. } => 2 * *rounds as u64,
            _ => 0,
        }
    }
}

#[derive(Clone)]
struct Model {
    kind: IndexKind,
    live: BTreeMap<u64, Vec<f32>>,
    /// Vectors no id holds any more (replaced or deleted).
    stale: Vec<Vec<f32>>,
    /// The next automatic id: above every id ever given.
    next_auto: u64,
    /// Seeds used so far (each vector is new).
    seed: u64,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Model {{ {:?}, {} live, {} stale, next_auto {} }}",
            self.kind,
            self.live.len(),
            self.stale.len(),
            self.next_auto
        )
    }
}

impl Model {
    fn retire(&mut self, v: Vec<f32>) {
        self.stale.push(v);
        if self.stale.len() > STALE_KEPT {
            self.stale.remove(0);
        }
    }

    fn insert(&mut self, id: u64, v: Vec<f32>) {
        self.next_auto = self.next_auto.max(id + 1);
        self.live.insert(id, v);
    }

    /// Whether an insert of `n` vectors with automatic ids must be refused
    /// (ids beyond the signed 64-bit range).
    fn auto_overflows(&self, n: usize) -> bool {
        self.next_auto.saturating_add(n as u64) > TOP + 1
    }
}

struct Reference;

impl ReferenceStateMachine for Reference {
    type State = Model;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Model> {
        proptest::sample::select(KINDS.to_vec())
            .prop_map(|kind| {
                let mut m = Model {
                    kind,
                    live: BTreeMap::new(),
                    stale: Vec::new(),
                    next_auto: 0,
                    seed: 1_000_000,
                };
                for i in 0..BUILD_N as u64 {
                    m.insert(i, vector(i));
                }
                m
            })
            .boxed()
    }

    fn transitions(m: &Model) -> BoxedStrategy<Step> {
        let live: Vec<u64> = m.live.keys().copied().collect();
        let some_live = if live.is_empty() {
            Just(Vec::new()).boxed()
        } else {
            proptest::sample::subsequence(live.clone(), 0..=live.len().min(6)).boxed()
        };
        let seed = m.seed;
        let fresh_ids = proptest::collection::vec(
            prop_oneof![
                4 => 0u64..400,
                1 => (TOP - 4)..=TOP,
            ],
            1..4,
        );
        prop_oneof![
            6 => (1usize..6, prop_oneof![3 => Just(None), 2 => fresh_ids.prop_map(Some)])
                .prop_map(move |(n, ids)| match ids {
                    None => Step::Insert { seeds: (seed..seed + n as u64).collect(), ids: Ids::Auto },
                    Some(mut ids) => {
                        ids.sort_unstable();
                        ids.dedup();
                        Step::Insert {
                            seeds: (seed..seed + ids.len() as u64).collect(),
                            ids: Ids::Given(ids),
                        }
                    }
                }),
            4 => (some_live, proptest::collection::vec(0u64..1000, 0..2))
                .prop_map(|(mut a, b)| { a.extend(b); Step::Delete(a) }),
            // Mostly a few rounds, sometimes hundreds: a sequence updates
            // the hot id thousands of times.
            4 => (
                prop_oneof![3 => Just(HOT), 1 => 0u64..80],
                prop_oneof![4 => 1u32..20, 1 => 20u32..400],
            )
                .prop_map(move |(id, rounds)| Step::Replace { id, seed, rounds }),
            2 => prop_oneof![3 => 1u32..10, 1 => 10u32..150]
                .prop_map(move |rounds| Step::Churn { seed, rounds }),
            1 => Just(Step::Checkpoint),
            2 => Just(Step::Maintain),
            1 => Just(Step::Reopen),
            1 => Just(Step::Crash),
        ]
        .boxed()
    }

    fn apply(mut m: Model, step: &Step) -> Model {
        match step {
            Step::Insert { seeds, ids } => {
                m.seed = m.seed.max(seeds.iter().max().map_or(m.seed, |s| s + 1));
                match ids {
                    Ids::Auto => {
                        if !m.auto_overflows(seeds.len()) {
                            let first = m.next_auto;
                            for (j, &s) in seeds.iter().enumerate() {
                                m.insert(first + j as u64, vector(s));
                            }
                        }
                    }
                    Ids::Given(ids) => {
                        // All or nothing: a live id refuses the whole insert.
                        if ids.iter().all(|i| !m.live.contains_key(i)) {
                            for (&i, &s) in ids.iter().zip(seeds) {
                                m.insert(i, vector(s));
                            }
                        }
                    }
                }
            }
            Step::Delete(ids) => {
                for i in ids {
                    if let Some(v) = m.live.remove(i) {
                        m.retire(v);
                    }
                }
            }
            Step::Replace { id, seed, rounds } => {
                for r in 0..*rounds as u64 {
                    if let Some(v) = m.live.remove(id) {
                        m.retire(v);
                    }
                    m.insert(*id, vector(seed + r));
                }
                m.seed = m.seed.max(seed + *rounds as u64);
            }
            Step::Churn { seed, rounds } => {
                for r in 0..*rounds as u64 {
                    if let Some((&newest, _)) = m.live.iter().next_back() {
                        if let Some(v) = m.live.remove(&newest) {
                            m.retire(v);
                        }
                    }
                    if m.auto_overflows(1) {
                        break;
                    }
                    let id = m.next_auto;
                    m.insert(id, vector(seed + r));
                }
                m.seed = m.seed.max(seed + *rounds as u64);
            }
            Step::Checkpoint | Step::Maintain | Step::Reopen | Step::Crash => {}
        }
        m
    }
}

/// The index under test, a read-only open of it that follows the writer
/// from the start (through its checkpoints, reopens and crashes), and
/// their directory.
struct Sut {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    idx: Option<Index>,
    reader: Index,
}

fn open_as(dir: &Path, read_only: bool) -> Index {
    Index::open(
        dir,
        &OpenOptions {
            threads: Some(2),
            io: EngineKind::Pread,
            durability: Durability::Buffered,
            background_updates: false,
            read_only,
            ..Default::default()
        },
    )
    .unwrap()
}

fn open(dir: &Path) -> Index {
    open_as(dir, false)
}

impl Sut {
    fn idx(&self) -> &Index {
        self.idx.as_ref().unwrap()
    }
}

struct UpdateModel;

impl StateMachineTest for UpdateModel {
    type SystemUnderTest = Sut;
    type Reference = Reference;

    fn init_test(m: &Model) -> Sut {
        // In memory where the machine has a tmpfs (the steps are many and
        // small; the disk's latency would dominate them).
        let shm = Path::new("/dev/shm");
        let tmp = if shm.is_dir() {
            tempfile::tempdir_in(shm).unwrap()
        } else {
            tempfile::tempdir().unwrap()
        };
        let dir = tmp.path().join("idx");
        let data: Vec<f32> = m.live.values().flatten().copied().collect();
        let ids: Vec<u64> = m.live.keys().copied().collect();
        let mut o = BuildOptions {
            metric: Metric::L2,
            ids: Some(ids),
            threads: Some(2),
            ..Default::default()
        };
        match m.kind {
            IndexKind::Partition => {
                o.preset = PresetChoice::parse("spfresh").unwrap();
                o.partition.posting_limit = Some(12);
                o.partition.merge_threshold = Some(3);
                o.partition.head_ratio = Some(0.2);
                o.memory_budget = Some(Budget::Bytes(1 << 24));
                super::build_partition(
                    &data,
                    DIM,
                    &dir,
                    &o,
                    &|_, _, _| {},
                    &AtomicBool::new(false),
                )
                .unwrap();
            }
            IndexKind::Graph => {
                o.r = Some(8);
                o.build_l = Some(16);
                super::build(
                    crate::data::matrix::Matrix::from_vec(data, BUILD_N, DIM).unwrap(),
                    &dir,
                    &o,
                    &|_, _, _| {},
                    &AtomicBool::new(false),
                )
                .unwrap();
            }
        }
        let idx = open(&dir);
        let reader = open_as(&dir, true);
        Sut {
            _tmp: tmp,
            dir,
            idx: Some(idx),
            reader,
        }
    }

    fn apply(mut s: Sut, m: &Model, step: Step) -> Sut {
        STEPS.fetch_add(1, Ordering::Relaxed);
        UPDATES.fetch_add(step.updates(), Ordering::Relaxed);
        match step {
            Step::Insert { seeds, ids } => {
                let v: Vec<f32> = seeds.iter().flat_map(|&x| vector(x)).collect();
                match ids {
                    Ids::Auto => {
                        let r = s.idx().insert(&v, None);
                        match r {
                            Ok(got) => {
                                // The model assigned the same ids.
                                assert_eq!(got.len(), seeds.len());
                                for (id, &x) in got.iter().zip(&seeds) {
                                    assert_eq!(m.live.get(id), Some(&vector(x)), "auto id {id}");
                                }
                            }
                            Err(e) => assert!(
                                e.to_string().contains("automatic id"),
                                "an auto-id insert failed: {e}"
                            ),
                        }
                    }
                    Ids::Given(ids) => {
                        let r = s.idx().insert(&v, Some(&ids));
                        let accepted = ids
                            .iter()
                            .zip(&seeds)
                            .all(|(i, &x)| m.live.get(i) == Some(&vector(x)));
                        match r {
                            Ok(got) => {
                                assert!(accepted, "insert of live ids {ids:?} was accepted");
                                assert_eq!(got, ids);
                            }
                            Err(e) => assert!(!accepted, "insert of {ids:?} failed: {e}"),
                        }
                    }
                }
            }
            Step::Delete(ids) => {
                s.idx().delete(&ids).unwrap();
            }
            Step::Replace { id, seed, rounds } => {
                for r in 0..rounds as u64 {
                    s.idx().delete(&[id]).unwrap();
                    s.idx().insert(&vector(seed + r), Some(&[id])).unwrap();
                }
            }
            Step::Churn { seed, rounds } => {
                for r in 0..rounds as u64 {
                    if let Some(&newest) = s.idx().live_ids().unwrap().last() {
                        s.idx().delete(&[newest]).unwrap();
                    }
                    match s.idx().insert(&vector(seed + r), None) {
                        Ok(_) => {}
                        Err(e) if e.to_string().contains("automatic id") => break,
                        Err(e) => panic!("churn insert failed: {e}"),
                    }
                }
            }
            Step::Checkpoint => {
                s.idx().checkpoint().unwrap();
            }
            Step::Maintain => s.idx().maintain().unwrap(),
            Step::Reopen => {
                s.idx = None;
                s.idx = Some(open(&s.dir));
            }
            Step::Crash if m.kind == IndexKind::Graph => {
                s.idx = None;
                // A kill during a merge leaves its staging directory (a
                // dead process's) beside the index, and a kill during an
                // append a torn record at the log's end.
                let parent = s.dir.parent().unwrap();
                let left = parent.join(".idx.building-999999999");
                std::fs::create_dir_all(&left).unwrap();
                std::fs::write(left.join("pages.bin"), b"half written").unwrap();
                let wal = s.dir.join(super::fresh::WAL_FILE);
                if wal.exists() {
                    use std::io::Write;
                    let mut f = std::fs::OpenOptions::new().append(true).open(&wal).unwrap();
                    f.write_all(&[40, 0, 0, 0, 9, 9, 9]).unwrap();
                }
                s.idx = Some(open(&s.dir));
            }
            Step::Crash => {
                s.idx = None;
                // A kill during a checkpoint leaves the next state file
                // half written and the manifest naming the previous one.
                let m = crate::partition::read_manifest(&s.dir).unwrap();
                let orphan = s.dir.join(format!("state-{}.bin", m.generation + 1));
                std::fs::write(&orphan, b"NLPSTATE half written").unwrap();
                s.idx = Some(open(&s.dir));
                assert!(
                    !orphan.exists(),
                    "the half-written state file outlived the recovery"
                );
            }
        }
        s
    }

    fn teardown(s: Sut, _m: Model) {
        drop(s);
        eprintln!(
            "update model: {} steps ({} single updates) passed so far",
            STEPS.load(Ordering::Relaxed),
            UPDATES.load(Ordering::Relaxed)
        );
    }

    fn check_invariants(s: &Sut, m: &Model) {
        agrees(s.idx(), m, "writer");
        agrees(&s.reader, m, "reader");
    }
}

/// `idx` agrees with the model: its live ids, its check, and searches of
/// every live and every stale vector.
fn agrees(idx: &Index, m: &Model, who: &str) {
    let live = idx.live_ids().unwrap();
    assert_eq!(
        live,
        m.live.keys().copied().collect::<Vec<_>>(),
        "{who}: live ids"
    );
    let rep = idx.check_json().unwrap();
    assert_eq!(rep["problems"], serde_json::json!([]), "{who}: check");
    // Every live vector, then every stale one, as a query.
    let mut qs: Vec<f32> = m.live.values().flatten().copied().collect();
    qs.extend(m.stale.iter().flatten());
    let nq = m.live.len() + m.stale.len();
    if nq == 0 {
        return;
    }
    let k = 4;
    let out = idx.search(&qs, nq, &SearchOptions::new(k)).unwrap();
    let owners: Vec<Option<u64>> = m
        .live
        .keys()
        .map(|&i| Some(i))
        .chain(m.stale.iter().map(|_| None))
        .collect();
    for (qi, owner) in owners.iter().enumerate() {
        let q = &qs[qi * DIM..(qi + 1) * DIM];
        let ids = &out.ids[qi * k..(qi + 1) * k];
        let ds = &out.distances[qi * k..(qi + 1) * k];
        if let Some(own) = owner {
            assert!(
                ids.contains(&(*own as i64)),
                "{who}: live id {own} is not found by its own vector (got {ids:?} at {ds:?})"
            );
        }
        for (&id, &d) in ids.iter().zip(ds) {
            if id < 0 {
                continue;
            }
            let cur = m.live.get(&(id as u64)).unwrap_or_else(|| {
                panic!("{who}: query {qi} returned id {id}, which is not live (distance {d})")
            });
            let want = l2(q, cur);
            assert!(
                (d - want).abs() <= 1e-3 * want.max(1.0),
                "{who}: query {qi} returned id {id} at {d}, but its current vector lies at \
                 {want}: a stale vector"
            );
        }
    }
}

/// Cases and longest sequence: a short run by default, or
/// `NEARLINE_MODEL_STEPS` steps in all.
fn config() -> (Config, usize) {
    let steps: usize = std::env::var("NEARLINE_MODEL_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if steps == 0 {
        (
            Config {
                cases: 6,
                max_shrink_iters: 200,
                ..Config::default()
            },
            40,
        )
    } else {
        let len = 200;
        (
            Config {
                cases: (steps / (len / 2)).max(1) as u32,
                max_shrink_iters: 200,
                ..Config::default()
            },
            len,
        )
    }
}

prop_state_machine! {
    #![proptest_config(config().0)]
    #[test]
    fn updates_match_a_brute_force_model(sequential 1..config().1 => UpdateModel);
}
