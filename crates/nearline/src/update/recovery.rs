//! The recovery protocol every mutable index kind follows: an index is its
//! last checkpoint (whose manifest names the last log sequence it holds)
//! plus the log's records after that sequence, applied in order. Opening
//! an index, a read-only open following the writer's log and a writer
//! taking over a log all apply records here, through [`Recover`], which
//! each mutable index kind implements for what it rebuilds (a graph
//! index's delta, a partition index's postings, a read-only partition
//! open's in-memory vectors).
//!
//! What is checked here, the same for every kind:
//! - the log continues the checkpoint ([`check_continues`]): a log whose
//!   first record comes after `checkpoint + 1` lost records the index never
//!   held, and the open fails rather than serve an index missing them;
//! - records at or before the last one applied are skipped (a record is
//!   applied once, whichever path reads it);
//! - a record decodes to one of the closed set of operations
//!   ([`Op`]: an unknown kind is a corrupt log, never skipped);
//! - a logged insert's rows have the index's dimension, the element type
//!   the kind logs (when it logs one only) and one row per id.
//!
//! A record that fails these checks is reported as corruption of the log,
//! with its sequence number.

use crate::elem::DType;
use crate::update::wal::{insert_rows, Op, Patch, Record};
use crate::{Error, Result};
use std::path::Path;

/// What a mutable index kind rebuilds from its log.
pub trait Recover {
    /// The dimension of the index's vectors.
    fn dim(&self) -> usize;

    /// The one element type the kind logs inserts in (`None`: any; the
    /// rows are widened to f32 either way).
    fn logged_dtype(&self) -> Option<DType> {
        None
    }

    /// The last log sequence applied.
    fn applied(&self) -> u64;

    /// Records that `seq` is applied.
    fn set_applied(&mut self, seq: u64);

    /// Applies a logged insert: `rows` (f32, `ids.len() × dim`) under
    /// `ids`. A logged id that is live already (never logged by a writer
    /// that validated its insert) takes the new vector.
    fn replay_insert(&mut self, ids: &[u64], rows: &[f32]) -> Result<()>;

    /// Applies a logged delete (ids that are not live are ignored).
    fn replay_delete(&mut self, ids: &[u64]) -> Result<()>;

    /// Applies a logged in-place graph update (its ids and its page
    /// images). Only a graph index updated in place logs these; any other
    /// kind finding one reads a log that is not its own.
    fn replay_patch(&mut self, _patch: &Patch) -> Result<()> {
        Err(Error::arg(
            "the log holds an in-place page update, which only a graph index updated in place \
             writes: this index cannot replay it",
        ))
    }
}

/// Checks that a log whose first record is `first_seq` continues a
/// checkpoint holding the records up to `checkpoint`.
pub fn check_continues(log: &Path, first_seq: u64, checkpoint: u64) -> Result<()> {
    if first_seq > checkpoint.saturating_add(1) {
        return Err(Error::corrupt(
            log,
            format!(
                "the log starts at sequence {first_seq} but the index holds only up to \
                 {checkpoint}: records {}..{first_seq} are missing",
                checkpoint + 1
            ),
        ));
    }
    Ok(())
}

/// Applies the record `rec` of the log `log` to `target` (skipped when
/// `target` applied it already).
pub fn replay<R: Recover + ?Sized>(target: &mut R, rec: &Record, log: &Path) -> Result<()> {
    if rec.seq <= target.applied() {
        return Ok(());
    }
    match Op::decode(rec, log)? {
        Op::Insert {
            ids,
            dim,
            dtype,
            vectors,
        } => {
            // `Op::decode` checked that the payload holds one row of
            // `dim` elements an id; `insert_rows` that `dim` is the index's.
            let rows = insert_rows(
                log,
                target.dim(),
                dim,
                dtype,
                &vectors,
                target.logged_dtype(),
            )?;
            target.replay_insert(&ids, &rows)?;
        }
        Op::Delete { ids } => target.replay_delete(&ids)?,
        Op::Patch(p) => target.replay_patch(&p).map_err(|e| match e {
            Error::InvalidArgument(m) => Error::corrupt(log, format!("record {}: {m}", rec.seq)),
            other => other,
        })?,
    }
    target.set_applied(rec.seq);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::update::wal::{kind, Durability, Wal};

    /// A kind that remembers what it was given.
    #[derive(Default)]
    struct Seen {
        applied: u64,
        live: std::collections::BTreeMap<u64, Vec<f32>>,
        f32_only: bool,
    }

    impl Recover for Seen {
        fn dim(&self) -> usize {
            2
        }
        fn logged_dtype(&self) -> Option<DType> {
            self.f32_only.then_some(DType::F32)
        }
        fn applied(&self) -> u64 {
            self.applied
        }
        fn set_applied(&mut self, seq: u64) {
            self.applied = seq;
        }
        fn replay_insert(&mut self, ids: &[u64], rows: &[f32]) -> Result<()> {
            for (i, r) in ids.iter().zip(rows.chunks_exact(2)) {
                self.live.insert(*i, r.to_vec());
            }
            Ok(())
        }
        fn replay_delete(&mut self, ids: &[u64]) -> Result<()> {
            for i in ids {
                self.live.remove(i);
            }
            Ok(())
        }
    }

    fn insert(ids: &[u64], dim: u32, dtype: DType, rows: &[f32]) -> Op {
        let vectors = crate::with_dtype!(dtype, T, {
            rows.iter()
                .flat_map(|&x| {
                    let t = <T as crate::elem::Element>::from_f32(x).unwrap();
                    bytemuck::bytes_of(&t).to_vec()
                })
                .collect()
        });
        Op::Insert {
            ids: ids.to_vec(),
            dim,
            dtype,
            vectors,
        }
    }

    fn records(dir: &Path, ops: &[Op]) -> Vec<Record> {
        let path = dir.join("wal.log");
        let wal = Wal::create(&path, 1, Durability::Sync).unwrap();
        for op in ops {
            wal.append_op_durable(op).unwrap();
        }
        drop(wal);
        let mut out = Vec::new();
        Wal::replay(&path, 0, &mut |r| {
            out.push(r);
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn records_apply_in_order_once() {
        let dir = tempfile::tempdir().unwrap();
        let recs = records(
            dir.path(),
            &[
                insert(&[1, 2], 2, DType::F32, &[1.0, 2.0, 3.0, 4.0]),
                Op::Delete { ids: vec![1, 9] },
                insert(&[1], 2, DType::F16, &[5.0, 6.0]),
            ],
        );
        let log = dir.path().join("wal.log");
        let mut s = Seen::default();
        for r in &recs {
            replay(&mut s, r, &log).unwrap();
        }
        assert_eq!(s.applied, 3);
        assert_eq!(s.live.get(&1), Some(&vec![5.0, 6.0]));
        assert_eq!(s.live.get(&2), Some(&vec![3.0, 4.0]));
        // Applied records are skipped: the delete of 1 is not applied again.
        for r in &recs[..2] {
            replay(&mut s, r, &log).unwrap();
        }
        assert_eq!(s.live.len(), 2);
        assert_eq!(s.applied, 3);
    }

    #[test]
    fn a_record_the_index_cannot_hold_is_corruption_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("wal.log");
        let mut recs = records(
            dir.path(),
            &[
                insert(&[1], 3, DType::F32, &[1.0, 2.0, 3.0]),
                insert(&[1], 2, DType::F16, &[1.0, 2.0]),
            ],
        );
        // An insert whose payload lost its last row's bytes (no writer
        // logs it; the log's checksum would catch most such damage).
        let mut short = insert(&[1, 2], 2, DType::F32, &[1.0, 2.0, 3.0, 4.0])
            .encode()
            .unwrap();
        short.truncate(short.len() - 8);
        recs.push(Record {
            seq: 3,
            kind: kind::INSERT,
            offset: 0,
            payload: short,
        });
        let mut s = Seen {
            f32_only: true,
            ..Seen::default()
        };
        let e = replay(&mut s, &recs[0], &log).unwrap_err().to_string();
        assert!(e.contains("dimension 3"), "{e}");
        s.applied = 1;
        let e = replay(&mut s, &recs[1], &log).unwrap_err().to_string();
        assert!(e.contains("float16"), "{e}");
        s.applied = 2;
        let e = replay(&mut s, &recs[2], &log).unwrap_err().to_string();
        assert!(e.contains("record 3"), "{e}");
        assert!(s.live.is_empty());
        assert_eq!(s.applied, 2);
    }

    #[test]
    fn an_unknown_record_kind_is_corruption() {
        let path = Path::new("wal.log");
        assert!(![kind::INSERT, kind::DELETE].contains(&77));
        let recs = [Record {
            seq: 1,
            kind: 77,
            offset: 0,
            payload: vec![0; 8],
        }];
        let mut s = Seen::default();
        let e = replay(&mut s, &recs[0], path).unwrap_err().to_string();
        assert!(e.contains("77") || e.contains("kind"), "{e}");
        assert_eq!(s.applied, 0);
    }

    #[test]
    fn a_log_must_continue_its_checkpoint() {
        let p = Path::new("wal.log");
        check_continues(p, 1, 0).unwrap();
        check_continues(p, 5, 4).unwrap();
        check_continues(p, 3, 9).unwrap();
        let e = check_continues(p, 7, 4).unwrap_err().to_string();
        assert!(e.contains("records 5..7 are missing"), "{e}");
    }
}
