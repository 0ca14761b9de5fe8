//! The write-ahead log (WAL) of a mutable index.
//!
//! Every mutable index kind (the SPFresh partition index, in-place graph
//! updates) logs an `insert` or `delete` here, durably, before applying it,
//! and replays the log after a crash. The log is a single append-only file.
//!
//! # File format (little-endian)
//!
//! A 32-byte header:
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | magic `NLWAL\0\0\0` |
//! | 8..10 | format major (u16, [`FORMAT_MAJOR`]); a reader refuses a higher one |
//! | 10..12 | format minor (u16, [`FORMAT_MINOR`]) |
//! | 12..20 | log id (u64): 1 for a created log, +1 at every reset |
//! | 20..28 | first sequence (u64): the sequence of the file's first record |
//! | 28..32 | CRC32C of bytes 0..28 |
//!
//! then records, back to back:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | payload length L (u32, at most [`MAX_PAYLOAD`]) |
//! | 4..12 | sequence (u64): the previous record's + 1 (the first: the header's) |
//! | 12 | kind (u8, [`kind`]) |
//! | 13..13+L | payload |
//! | 13+L..17+L | CRC32C of bytes 0..13+L of the record |
//!
//! # Reading and repair
//!
//! Opening validates every record in order. Appends only ever extend the
//! file, so a crash can damage only its tail: a record cut short, or a tail
//! the file system extended without writing (zeros or stale bytes). Hence:
//!
//! * a record that runs past the end of the file, or fails its checksum or
//!   length check **with no valid record anywhere after it**, is a torn
//!   tail: it is dropped and the file truncated back to the last good
//!   record (the loss is what was never acknowledged as durable);
//! * a damaged record **followed by a valid one**, or a valid record whose
//!   sequence is not the expected one (a gap or a repeat), is corruption:
//!   [`Error::Corrupt`] naming the file and the offset. Nothing is dropped.
//!
//! A damaged *last* record cannot be told from a torn write, so it is
//! dropped as one; if it had been synced, the storage itself lost it.
//!
//! # Durability
//!
//! * [`Wal::append`] encodes the record into an in-process buffer and
//!   returns its sequence: lost if the process dies before the next flush.
//! * [`Durability::Sync`]: [`Wal::append_durable`] returns once the record
//!   is on stable storage (`fdatasync`). Concurrent callers sharing one
//!   `Arc<Wal>` are batched (group commit): one caller, the leader, writes
//!   everything buffered and issues one `fdatasync` for all of them while the
//!   others wait; whoever finds its record not yet covered leads the next
//!   round. [`Wal::sync`] makes everything appended so far durable the same
//!   way.
//! * [`Durability::Buffered`]: [`Wal::append_durable`] returns once the
//!   record is written to the operating system (no `fdatasync`). It survives
//!   the process being killed, but an OS crash or power loss loses every
//!   record since the last [`Wal::sync`] (or [`Wal::truncate_before`]).
//!
//! A failed write or `fdatasync` makes the `Wal` refuse every later call:
//! after a failed `fdatasync` the kernel may have dropped the dirty pages, so
//! what is durable is unknown. Reopening the file recovers what is.
//! Dropping a `Wal` flushes and syncs what was appended (best effort).
//!
//! # Checkpoints and reset
//!
//! The index records in its manifest the last sequence it has applied
//! durably (its checkpoint `c`; the manifest's `wal_sequence`). The order is:
//!
//! 1. apply records up to `c` to the index files;
//! 2. write those files and the manifest with `wal_sequence = c` durably;
//! 3. [`Wal::truncate_before`]`(c + 1)`: writes a new log (log id + 1, first
//!    sequence `c + 1`, holding the records already appended after `c`) to
//!    `NAME.tmp`, fsyncs it, renames it over the log and fsyncs the
//!    directory. A crash before the rename leaves the old log (records up to
//!    `c` are skipped on replay); after it, the new one.
//!
//! On recovery, [`Wal::open_after`]`(path, c, ..)` replays the records after
//! `c`. A log that starts after `c + 1` has lost records the index needs
//! (step 3 ran before step 2 was durable): [`Error::Corrupt`]. A log that
//! ends at or before `c` (its tail was buffered and lost, but the index had
//! applied it) is reset to start at `c + 1`, so sequences never repeat.
//!
//! One process appends at a time: opening takes an exclusive `flock` on the
//! file and a second writer is refused.

use crate::error::{Error, Result};
use crate::io::DurableFile;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Magic at the start of every log file.
pub const MAGIC: [u8; 8] = *b"NLWAL\0\0\0";
/// Format major version written and the highest one read.
pub const FORMAT_MAJOR: u16 = 1;
/// Format minor version written.
pub const FORMAT_MINOR: u16 = 0;
/// Bytes of the file header.
pub const HEADER_BYTES: u64 = 32;
/// Bytes a record adds to its payload (length, sequence, kind, CRC).
pub const RECORD_OVERHEAD: u64 = 17;
/// The largest payload of one record (1 GiB).
pub const MAX_PAYLOAD: u32 = 1 << 30;

/// Bytes of a record before its payload.
pub(super) const RECORD_HEAD: usize = 13;
/// Buffered records are written to the file once they exceed this.
const FLUSH_BYTES: usize = 1 << 20;
/// Read size of the sequential scan and of the search past a damaged record.
const READ_CHUNK: usize = 1 << 20;

/// Record kinds used by the index updaters. Other values are free for
/// future kinds; the log itself does not interpret them.
pub mod kind {
    /// An [`Op::Insert`](super::Op::Insert).
    pub const INSERT: u8 = 1;
    /// An [`Op::Delete`](super::Op::Delete).
    pub const DELETE: u8 = 2;
    /// An [`Op::Patch`](super::Op::Patch): one in-place graph update and
    /// the page images it writes.
    pub const PATCH: u8 = 3;
}

/// When [`Wal::append_durable`] returns (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// After `fdatasync`: survives power loss.
    Sync,
    /// After `write`: survives the process being killed, not an OS crash.
    Buffered,
}

/// One logged record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub kind: u8,
    pub payload: Vec<u8>,
    /// Byte offset of the record in the file (for error messages).
    pub offset: u64,
}

/// What opening a log found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayReport {
    pub log_id: u64,
    /// Sequence of the file's first record (after a reset on open, the new one).
    pub first_seq: u64,
    /// The sequence the next append gets.
    pub next_seq: u64,
    /// Records handed to the caller (those after the checkpoint).
    pub replayed: u64,
    /// Bytes of a torn tail that were dropped (0 for a clean log).
    pub dropped_tail_bytes: u64,
}

/// Counters of a `Wal` since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalStats {
    pub records: u64,
    /// Record bytes written to the file.
    pub bytes: u64,
    /// `fdatasync` calls (group commit makes this smaller than `records`).
    pub syncs: u64,
}

/// An append-only log shared by the threads of one process.
#[derive(Debug)]
pub struct Wal {
    path: PathBuf,
    durability: Durability,
    state: Mutex<State>,
    /// Signalled when a leader's `fdatasync` ends.
    synced: Condvar,
}

#[derive(Debug)]
struct State {
    /// Shared with a leader that syncs it outside the lock.
    file: Arc<File>,
    /// Where records are written and synced: `file` (tests put a faulty
    /// file here).
    out: Arc<dyn DurableFile>,
    log_id: u64,
    first_seq: u64,
    /// Encoded records `written_next..next_seq`, not yet in the file.
    buf: Vec<u8>,
    /// The sequence the next append gets.
    next_seq: u64,
    /// Records below this are written to the file.
    written_next: u64,
    /// Records below this are durable.
    durable_next: u64,
    /// Bytes in the file.
    len: u64,
    /// A leader is in `fdatasync` (or a reset is running).
    syncing: bool,
    /// Why the log refuses further work after a failed write or sync.
    failed: Option<String>,
    stats: WalStats,
}

mod file;
mod op;
#[cfg(test)]
mod tests;

use file::{encode_record, install, lock, offset_of, scan, sync_parent, tmp_path, write_new_log};
pub(in crate::update) use file::{parse_head, Header};
pub use op::{decode_vectors, dtype_from_tag, dtype_tag, insert_rows, Op, Patch, PatchAction};

impl Wal {
    /// Creates a new, empty log whose first record will get `start_seq`
    /// (at least 1; a checkpoint `c` starts the log at `c + 1`). Refuses an
    /// existing `path`. The header is written to a temporary file, synced
    /// and renamed into place, so a crash never leaves a half-written log.
    pub fn create(path: &Path, start_seq: u64, durability: Durability) -> Result<Wal> {
        if start_seq == 0 {
            return Err(Error::arg(
                "a write-ahead log's first sequence must be at least 1 (0 means nothing applied)",
            ));
        }
        if fs::symlink_metadata(path).is_ok() {
            return Err(Error::arg(format!(
                "{} already exists; open it (Wal::open) instead of creating it",
                path.display()
            )));
        }
        let tmp = tmp_path(path)?;
        let header = Header {
            log_id: 1,
            first_seq: start_seq,
        };
        let file = write_new_log(path, &tmp, header, None)?;
        install(path, &tmp)?;
        Ok(Wal::from_parts(
            path,
            durability,
            file,
            header,
            HEADER_BYTES,
            start_seq,
        ))
    }

    /// Opens an existing log, repairs a torn tail and returns every record.
    pub fn open(path: &Path, durability: Durability) -> Result<(Wal, Vec<Record>)> {
        let mut records = Vec::new();
        let (wal, _) = Wal::open_impl(path, durability, None, &mut |r| {
            records.push(r);
            Ok(())
        })?;
        Ok((wal, records))
    }

    /// Opens an existing log for an index whose checkpoint is `checkpoint`
    /// (the last sequence applied durably; 0 for none), repairs a torn tail
    /// and hands `f` every record after the checkpoint, in order. An error
    /// from `f` aborts the open. See the module documentation for a log
    /// that starts after or ends before the checkpoint.
    pub fn open_after(
        path: &Path,
        durability: Durability,
        checkpoint: u64,
        f: &mut dyn FnMut(Record) -> Result<()>,
    ) -> Result<(Wal, ReplayReport)> {
        Wal::open_impl(path, durability, Some(checkpoint), f)
    }

    /// [`open_after`](Wal::open_after) for replay only: the log is repaired
    /// (and reset if behind the checkpoint), replayed and closed.
    pub fn replay(
        path: &Path,
        after_seq: u64,
        f: &mut dyn FnMut(Record) -> Result<()>,
    ) -> Result<ReplayReport> {
        Wal::open_after(path, Durability::Sync, after_seq, f).map(|(_, report)| report)
    }

    fn open_impl(
        path: &Path,
        durability: Durability,
        checkpoint: Option<u64>,
        f: &mut dyn FnMut(Record) -> Result<()>,
    ) -> Result<(Wal, ReplayReport)> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        lock(&file, path)?;
        // A reset that crashed before its rename: the log itself is intact.
        let _ = fs::remove_file(tmp_path(path)?);
        let scan = scan(path, &file, checkpoint.unwrap_or(0), f)?;
        if let Some(c) = checkpoint {
            if scan.header.first_seq.saturating_sub(1) > c {
                return Err(Error::corrupt(
                    path,
                    format!(
                        "the log starts at sequence {} but the index's checkpoint is {c}: \
                         records {}..={} are missing",
                        scan.header.first_seq,
                        c + 1,
                        scan.header.first_seq - 1
                    ),
                ));
            }
        }
        let dropped = scan.file_len - scan.good_len;
        if dropped > 0 {
            file.set_len(scan.good_len)
                .and_then(|()| file.sync_all())
                .map_err(|e| Error::io(path, e))?;
        }
        let wal = Wal::from_parts(
            path,
            durability,
            file,
            scan.header,
            scan.good_len,
            scan.next_seq,
        );
        if let Some(c) = checkpoint {
            if scan.next_seq <= c {
                let first = c.checked_add(1).ok_or_else(|| {
                    Error::arg(format!("checkpoint {c} leaves no sequence numbers"))
                })?;
                wal.reset(wal.lock()?, first)?;
            }
        }
        let report = {
            let st = wal.lock()?;
            ReplayReport {
                log_id: st.log_id,
                first_seq: st.first_seq,
                next_seq: st.next_seq,
                replayed: scan.replayed,
                dropped_tail_bytes: dropped,
            }
        };
        Ok((wal, report))
    }

    fn from_parts(
        path: &Path,
        durability: Durability,
        file: File,
        header: Header,
        len: u64,
        next_seq: u64,
    ) -> Wal {
        let file = Arc::new(file);
        Wal {
            path: path.to_path_buf(),
            durability,
            state: Mutex::new(State {
                out: Arc::clone(&file) as Arc<dyn DurableFile>,
                file,
                log_id: header.log_id,
                first_seq: header.first_seq,
                buf: Vec::new(),
                next_seq,
                written_next: next_seq,
                durable_next: next_seq,
                len,
                syncing: false,
                failed: None,
                stats: WalStats::default(),
            }),
            synced: Condvar::new(),
        }
    }

    /// Tests: the log's writes and syncs go through `wrap(file, synced
    /// bytes)` from now on (until a reset writes a new file). Everything
    /// appended so far is written and synced first.
    #[cfg(test)]
    pub(crate) fn inject(
        &self,
        wrap: impl FnOnce(Arc<File>, u64) -> Arc<dyn DurableFile>,
    ) -> Result<()> {
        self.sync()?;
        let mut st = self.lock()?;
        let len = st.len;
        st.out = wrap(Arc::clone(&st.file), len);
        Ok(())
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The durability of [`append_durable`](Wal::append_durable).
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// The sequence the next append gets.
    pub fn next_seq(&self) -> Result<u64> {
        Ok(self.lock()?.next_seq)
    }

    /// Every record with a smaller sequence is durable.
    pub fn durable_next_seq(&self) -> Result<u64> {
        Ok(self.lock()?.durable_next)
    }

    /// Sequence of the file's first record and the log id.
    pub fn first_seq_and_log_id(&self) -> Result<(u64, u64)> {
        let st = self.lock()?;
        Ok((st.first_seq, st.log_id))
    }

    /// Counters since the log was opened.
    pub fn stats(&self) -> Result<WalStats> {
        Ok(self.lock()?.stats)
    }

    /// Appends a record to the in-process buffer and returns its sequence.
    /// Not durable until [`sync`](Wal::sync), [`flush`](Wal::flush) (OS
    /// only) or a later [`append_durable`](Wal::append_durable). Raw kinds
    /// are for the log's own tests: an index logs [`Op`]s
    /// ([`append_op`](Wal::append_op)), the closed set replay decodes.
    pub(crate) fn append(&self, kind: u8, payload: &[u8]) -> Result<u64> {
        let mut st = self.lock()?;
        self.append_locked(&mut st, kind, payload)
    }

    /// Appends a record and returns its sequence once it is durable as the
    /// log's [`Durability`] says (raw kinds: see [`append`](Wal::append)).
    pub(crate) fn append_durable(&self, kind: u8, payload: &[u8]) -> Result<u64> {
        let seq = {
            let mut st = self.lock()?;
            let seq = self.append_locked(&mut st, kind, payload)?;
            if self.durability == Durability::Buffered {
                self.write_buffered(&mut st)?;
                return Ok(seq);
            }
            seq
        };
        self.wait_durable(seq + 1)?;
        Ok(seq)
    }

    /// Encodes and appends an [`Op`]; see [`append`](Wal::append).
    pub fn append_op(&self, op: &Op) -> Result<u64> {
        self.append(op.kind(), &op.encode()?)
    }

    /// Encodes and appends an [`Op`]; see [`append_durable`](Wal::append_durable).
    pub fn append_op_durable(&self, op: &Op) -> Result<u64> {
        self.append_durable(op.kind(), &op.encode()?)
    }

    /// Writes buffered records to the operating system (no `fdatasync`).
    pub fn flush(&self) -> Result<()> {
        let mut st = self.lock()?;
        self.write_buffered(&mut st)
    }

    /// Makes every record appended so far durable (one `fdatasync`, shared
    /// with concurrent callers). Returns the sequence the next append gets:
    /// every record below it is durable.
    pub fn sync(&self) -> Result<u64> {
        let upto = self.lock()?.next_seq;
        self.wait_durable(upto)?;
        Ok(upto)
    }

    /// Drops the records with a sequence below `first_kept` after a
    /// checkpoint at `first_kept - 1` (see the module documentation): the
    /// log is atomically replaced by a new one (log id + 1) holding the
    /// records from `first_kept` on. All records end up durable.
    pub fn truncate_before(&self, first_kept: u64) -> Result<()> {
        let st = self.lock()?;
        if first_kept > st.next_seq {
            return Err(Error::arg(format!(
                "cannot drop the log up to sequence {first_kept}: only records below {} exist",
                st.next_seq
            )));
        }
        if first_kept <= st.first_seq {
            return Ok(());
        }
        self.reset(st, first_kept)
    }

    /// Writes at `dest` a new log (log id + 1, synced, its name made
    /// durable) holding the records from `first_kept` on, and leaves this
    /// log as it is: the log a merged index takes with it, holding what
    /// was appended while the merge ran. The caller keeps appenders out
    /// until `dest` has taken this log's place.
    pub fn copy_from(&self, first_kept: u64, dest: &Path) -> Result<()> {
        let st = self.lock()?;
        if first_kept < st.first_seq || first_kept > st.next_seq {
            return Err(Error::arg(format!(
                "cannot copy the log from sequence {first_kept}: it holds {}..{}",
                st.first_seq, st.next_seq
            )));
        }
        let (st, from, header) = self.quiesce(st, first_kept)?;
        let tmp = tmp_path(dest)?;
        drop(write_new_log(
            dest,
            &tmp,
            header,
            Some((&st.file, from, st.len)),
        )?);
        install(dest, &tmp)
    }

    fn lock(&self) -> Result<MutexGuard<'_, State>> {
        self.state.lock().map_err(|_| self.poisoned())
    }

    fn poisoned(&self) -> Error {
        Error::io(
            &self.path,
            io::Error::other("the log's lock was poisoned by a panicking thread"),
        )
    }

    fn check(&self, st: &State) -> Result<()> {
        match &st.failed {
            None => Ok(()),
            Some(why) => Err(Error::io(
                &self.path,
                io::Error::other(format!(
                    "the log refuses work after an earlier failure ({why}); reopen it to \
                     recover the durable records"
                )),
            )),
        }
    }

    fn append_locked(&self, st: &mut State, kind: u8, payload: &[u8]) -> Result<u64> {
        self.check(st)?;
        if payload.len() > MAX_PAYLOAD as usize {
            return Err(Error::arg(format!(
                "a log record holds at most {MAX_PAYLOAD} bytes, got {}",
                payload.len()
            )));
        }
        let seq = st.next_seq;
        let next = seq
            .checked_add(1)
            .ok_or_else(|| Error::arg("the log's sequence numbers are exhausted"))?;
        encode_record(&mut st.buf, seq, kind, payload);
        st.next_seq = next;
        st.stats.records += 1;
        if st.buf.len() >= FLUSH_BYTES {
            self.write_buffered(st)?;
        }
        Ok(seq)
    }

    /// Writes the buffered records at the end of the file.
    fn write_buffered(&self, st: &mut State) -> Result<()> {
        self.check(st)?;
        if st.buf.is_empty() {
            return Ok(());
        }
        match st.out.write_all_at(&st.buf, st.len) {
            Ok(()) => {
                st.len += st.buf.len() as u64;
                st.stats.bytes += st.buf.len() as u64;
                st.buf.clear();
                st.written_next = st.next_seq;
                Ok(())
            }
            Err(e) => {
                let msg = format!("write at offset {}: {e}", st.len);
                st.failed = Some(msg);
                self.synced.notify_all();
                Err(Error::io(&self.path, e))
            }
        }
    }

    /// Returns once every record below `upto` is durable (group commit).
    fn wait_durable(&self, upto: u64) -> Result<()> {
        let mut st = self.lock()?;
        loop {
            self.check(&st)?;
            if st.durable_next >= upto {
                return Ok(());
            }
            if st.syncing {
                st = self.synced.wait(st).map_err(|_| self.poisoned())?;
                continue;
            }
            // Lead: write what every thread appended, sync it once.
            self.write_buffered(&mut st)?;
            let target = st.written_next;
            let file = Arc::clone(&st.out);
            st.syncing = true;
            drop(st);
            let r = file.sync_data();
            st = self.lock()?;
            st.syncing = false;
            match r {
                Ok(()) => {
                    st.durable_next = st.durable_next.max(target);
                    st.stats.syncs += 1;
                }
                Err(e) => st.failed = Some(format!("fdatasync: {e}")),
            }
            self.synced.notify_all();
        }
    }

    /// Waits out a running sync and writes every buffered record, then
    /// gives the byte offset of record `first` (the file's end when `first`
    /// is the next sequence or beyond) and the header of a new log starting
    /// there (log id + 1): what a reset or a copy writes.
    fn quiesce<'a>(
        &self,
        mut st: MutexGuard<'a, State>,
        first: u64,
    ) -> Result<(MutexGuard<'a, State>, u64, Header)> {
        while st.syncing {
            st = self.synced.wait(st).map_err(|_| self.poisoned())?;
        }
        self.check(&st)?;
        self.write_buffered(&mut st)?;
        let from = if first < st.next_seq {
            offset_of(&self.path, &st.file, st.first_seq, first, st.len)?
        } else {
            st.len
        };
        let header = Header {
            log_id: st
                .log_id
                .checked_add(1)
                .ok_or_else(|| Error::corrupt(&self.path, "the log id is exhausted"))?,
            first_seq: first,
        };
        Ok((st, from, header))
    }

    /// Replaces the log by one starting at `first` (see `truncate_before`;
    /// `first` past `next_seq` skips sequences, for a log behind the
    /// index's checkpoint). Holds the lock throughout: appenders wait.
    fn reset(&self, st: MutexGuard<'_, State>, first: u64) -> Result<()> {
        let (mut st, from, header) = self.quiesce(st, first)?;
        let tmp = tmp_path(&self.path)?;
        let file = write_new_log(&self.path, &tmp, header, Some((&st.file, from, st.len)))?;
        if let Err(e) = fs::rename(&tmp, &self.path) {
            let _ = fs::remove_file(&tmp);
            return Err(Error::io(&self.path, e));
        }
        // The path names the new file now: follow it whatever happens next.
        let kept = st.len - from;
        st.file = Arc::new(file);
        st.out = Arc::clone(&st.file) as Arc<dyn DurableFile>;
        st.len = HEADER_BYTES + kept;
        st.first_seq = first;
        st.log_id = header.log_id;
        st.next_seq = st.next_seq.max(first);
        st.written_next = st.next_seq;
        // `write_new_log` synced every byte of the new file.
        st.durable_next = st.next_seq;
        if let Err(e) = sync_parent(&self.path) {
            st.failed = Some(format!("fsync of the directory after a reset: {e}"));
            self.synced.notify_all();
            return Err(Error::io(&self.path, e));
        }
        Ok(())
    }
}

impl Drop for Wal {
    /// Writes and syncs what was appended (best effort: errors are lost;
    /// call [`Wal::sync`] to see them).
    fn drop(&mut self) {
        let Ok(st) = self.state.get_mut() else {
            return;
        };
        if st.failed.is_some() {
            return;
        }
        if !st.buf.is_empty() {
            if st.out.write_all_at(&st.buf, st.len).is_err() {
                return;
            }
            st.len += st.buf.len() as u64;
            st.buf.clear();
            st.written_next = st.next_seq;
        }
        if st.durable_next < st.written_next {
            let _ = st.out.sync_data();
        }
    }
}
