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

use crate::elem::DType;
use crate::error::{Error, Result};
use std::borrow::Cow;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
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

/// The file header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Header {
    pub(super) log_id: u64,
    pub(super) first_seq: u64,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_BYTES as usize] {
        let mut h = [0u8; HEADER_BYTES as usize];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..10].copy_from_slice(&FORMAT_MAJOR.to_le_bytes());
        h[10..12].copy_from_slice(&FORMAT_MINOR.to_le_bytes());
        h[12..20].copy_from_slice(&self.log_id.to_le_bytes());
        h[20..28].copy_from_slice(&self.first_seq.to_le_bytes());
        let crc = crc32c::crc32c(&h[..28]);
        h[28..32].copy_from_slice(&crc.to_le_bytes());
        h
    }

    pub(super) fn decode(path: &Path, h: &[u8; HEADER_BYTES as usize]) -> Result<Header> {
        if h[0..8] != MAGIC {
            return Err(Error::format(
                path,
                "not a nearline write-ahead log (magic is not NLWAL)",
            ));
        }
        let major = u16::from_le_bytes([h[8], h[9]]);
        if major > FORMAT_MAJOR {
            return Err(Error::Version {
                path: path.to_path_buf(),
                msg: format!(
                    "write-ahead log format {major}.x is newer than this reader ({FORMAT_MAJOR}.x)"
                ),
            });
        }
        let want = u32::from_le_bytes([h[28], h[29], h[30], h[31]]);
        if crc32c::crc32c(&h[..28]) != want {
            return Err(Error::corrupt(path, "the log header fails its checksum"));
        }
        let header = Header {
            log_id: u64_at(h, 12),
            first_seq: u64_at(h, 20),
        };
        if header.first_seq == 0 {
            return Err(Error::corrupt(path, "the log header's first sequence is 0"));
        }
        Ok(header)
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

/// Appends the encoding of one record to `buf`.
fn encode_record(buf: &mut Vec<u8>, seq: u64, kind: u8, payload: &[u8]) {
    let start = buf.len();
    // Callers check payload.len() <= MAX_PAYLOAD.
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.push(kind);
    buf.extend_from_slice(payload);
    let crc = crc32c::crc32c(&buf[start..]);
    buf.extend_from_slice(&crc.to_le_bytes());
}

/// A record's fields parsed from its first 13 bytes.
pub(super) fn parse_head(h: &[u8]) -> (u32, u64, u8) {
    (u32_at(h, 0), u64_at(h, 4), h[12])
}

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
        Wal {
            path: path.to_path_buf(),
            durability,
            state: Mutex::new(State {
                file: Arc::new(file),
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
    /// only) or a later [`append_durable`](Wal::append_durable).
    pub fn append(&self, kind: u8, payload: &[u8]) -> Result<u64> {
        let mut st = self.lock()?;
        self.append_locked(&mut st, kind, payload)
    }

    /// Appends a record and returns its sequence once it is durable as the
    /// log's [`Durability`] says.
    pub fn append_durable(&self, kind: u8, payload: &[u8]) -> Result<u64> {
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
        let mut st = self.lock()?;
        while st.syncing {
            st = self.synced.wait(st).map_err(|_| self.poisoned())?;
        }
        self.check(&st)?;
        if first_kept < st.first_seq || first_kept > st.next_seq {
            return Err(Error::arg(format!(
                "cannot copy the log from sequence {first_kept}: it holds {}..{}",
                st.first_seq, st.next_seq
            )));
        }
        self.write_buffered(&mut st)?;
        let from = if first_kept < st.next_seq {
            offset_of(&self.path, &st.file, st.first_seq, first_kept, st.len)?
        } else {
            st.len
        };
        let header = Header {
            log_id: st
                .log_id
                .checked_add(1)
                .ok_or_else(|| Error::corrupt(&self.path, "the log id is exhausted"))?,
            first_seq: first_kept,
        };
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
        match st.file.write_all_at(&st.buf, st.len) {
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
            let file = Arc::clone(&st.file);
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

    /// Replaces the log by one starting at `first` (see `truncate_before`;
    /// `first` past `next_seq` skips sequences, for a log behind the
    /// index's checkpoint). Holds the lock throughout: appenders wait.
    fn reset(&self, mut st: MutexGuard<'_, State>, first: u64) -> Result<()> {
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
        let tmp = tmp_path(&self.path)?;
        let file = write_new_log(&self.path, &tmp, header, Some((&st.file, from, st.len)))?;
        if let Err(e) = fs::rename(&tmp, &self.path) {
            let _ = fs::remove_file(&tmp);
            return Err(Error::io(&self.path, e));
        }
        // The path names the new file now: follow it whatever happens next.
        let kept = st.len - from;
        st.file = Arc::new(file);
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
            if st.file.write_all_at(&st.buf, st.len).is_err() {
                return;
            }
            st.len += st.buf.len() as u64;
            st.buf.clear();
            st.written_next = st.next_seq;
        }
        if st.durable_next < st.written_next {
            let _ = st.file.sync_data();
        }
    }
}

/// What [`scan`] found.
struct Scan {
    header: Header,
    /// The sequence after the last good record.
    next_seq: u64,
    /// End of the last good record.
    good_len: u64,
    file_len: u64,
    replayed: u64,
}

/// Validates the log and hands `f` the records after `after_seq`.
fn scan(
    path: &Path,
    file: &File,
    after_seq: u64,
    f: &mut dyn FnMut(Record) -> Result<()>,
) -> Result<Scan> {
    let io_err = |e| Error::io(path, e);
    let file_len = file.metadata().map_err(io_err)?.len();
    if file_len < HEADER_BYTES {
        return Err(Error::corrupt(
            path,
            format!("the log is {file_len} bytes, shorter than its {HEADER_BYTES}-byte header"),
        ));
    }
    let mut h = [0u8; HEADER_BYTES as usize];
    file.read_exact_at(&mut h, 0).map_err(io_err)?;
    let header = Header::decode(path, &h)?;

    let mut r = BufReader::with_capacity(READ_CHUNK, file);
    r.seek(SeekFrom::Start(HEADER_BYTES)).map_err(io_err)?;
    let mut off = HEADER_BYTES;
    let mut seq = header.first_seq;
    let mut replayed = 0;
    let mut bad = None;
    while off < file_len {
        let rest = file_len - off;
        if rest < RECORD_OVERHEAD {
            bad = Some(off);
            break;
        }
        let mut head = [0u8; RECORD_HEAD];
        r.read_exact(&mut head).map_err(io_err)?;
        let (len, rseq, kind) = parse_head(&head);
        let total = RECORD_OVERHEAD + len as u64;
        if len > MAX_PAYLOAD || total > rest {
            bad = Some(off);
            break;
        }
        // Bounded by the file's size (checked above).
        let mut payload = vec![0u8; len as usize];
        r.read_exact(&mut payload).map_err(io_err)?;
        let mut crc = [0u8; 4];
        r.read_exact(&mut crc).map_err(io_err)?;
        let got = crc32c::crc32c_append(crc32c::crc32c(&head), &payload);
        if got != u32::from_le_bytes(crc) {
            bad = Some(off);
            break;
        }
        if rseq != seq {
            return Err(Error::corrupt(
                path,
                format!("sequence gap at offset {off}: expected record {seq}, found record {rseq}"),
            ));
        }
        if seq > after_seq {
            f(Record {
                seq,
                kind,
                payload,
                offset: off,
            })?;
            replayed += 1;
        }
        off += total;
        seq = seq
            .checked_add(1)
            .ok_or_else(|| Error::corrupt(path, "sequence numbers overflow"))?;
    }
    if let Some(b) = bad {
        if let Some(valid) = find_valid_after(path, file, b, file_len, seq)? {
            return Err(Error::corrupt(
                path,
                format!(
                    "record {seq} at offset {b} is damaged (checksum or length), but a valid \
                     record follows at offset {valid}: the log is corrupt, not torn"
                ),
            ));
        }
    }
    Ok(Scan {
        header,
        next_seq: seq,
        good_len: bad.unwrap_or(file_len),
        file_len,
        replayed,
    })
}

/// The offset of a valid record after the damaged one at `bad`, if any:
/// one whose checksum holds and whose sequence is at least `seq` (the
/// damaged record's) and no more than the records that could fit.
fn find_valid_after(
    path: &Path,
    file: &File,
    bad: u64,
    file_len: u64,
    seq: u64,
) -> Result<Option<u64>> {
    let io_err = |e| Error::io(path, e);
    let max_seq = seq.saturating_add((file_len - bad) / RECORD_OVERHEAD + 1);
    let mut win: Vec<u8> = Vec::new();
    let mut win_off = bad;
    let mut o = bad + 1;
    while o + RECORD_OVERHEAD <= file_len {
        if o + RECORD_HEAD as u64 > win_off + win.len() as u64 {
            win_off = o;
            let n = (READ_CHUNK as u64).min(file_len - o) as usize;
            win.resize(n, 0);
            file.read_exact_at(&mut win, o).map_err(io_err)?;
        }
        let at = (o - win_off) as usize;
        let (len, rseq, _) = parse_head(&win[at..at + RECORD_HEAD]);
        let total = RECORD_OVERHEAD + len as u64;
        if len <= MAX_PAYLOAD && (seq..=max_seq).contains(&rseq) && o + total <= file_len {
            let rec: Cow<[u8]> = if at + total as usize <= win.len() {
                Cow::Borrowed(&win[at..at + total as usize])
            } else {
                let mut v = vec![0u8; total as usize];
                file.read_exact_at(&mut v, o).map_err(io_err)?;
                Cow::Owned(v)
            };
            let body = rec.len() - 4;
            if crc32c::crc32c(&rec[..body]) == u32_at(&rec, body) {
                return Ok(Some(o));
            }
        }
        o += 1;
    }
    Ok(None)
}

/// Offset of record `seq` in a log whose records (already validated) start
/// at `first_seq`.
fn offset_of(path: &Path, file: &File, first_seq: u64, seq: u64, len: u64) -> Result<u64> {
    let io_err = |e| Error::io(path, e);
    let mut r = BufReader::with_capacity(64 * 1024, file);
    r.seek(SeekFrom::Start(HEADER_BYTES)).map_err(io_err)?;
    let mut off = HEADER_BYTES;
    for s in first_seq..seq {
        let mut l = [0u8; 4];
        r.read_exact(&mut l).map_err(io_err)?;
        let total = RECORD_OVERHEAD + u32::from_le_bytes(l) as u64;
        if off + total > len {
            return Err(Error::corrupt(
                path,
                format!("record {s} at offset {off} runs past the end of the log"),
            ));
        }
        r.seek_relative(total as i64 - 4).map_err(io_err)?;
        off += total;
    }
    Ok(off)
}

/// Writes a log holding `header` and the bytes `from..to` of `copy` to
/// `tmp`, locked and synced. Errors name `path`, the log.
fn write_new_log(
    path: &Path,
    tmp: &Path,
    header: Header,
    copy: Option<(&File, u64, u64)>,
) -> Result<File> {
    let _ = fs::remove_file(tmp);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(tmp)
        .map_err(|e| Error::io(path, e))?;
    let written = (|| -> Result<()> {
        // Locked before it can appear under the log's name.
        lock(&file, path)?;
        let io_err = |e| Error::io(path, e);
        file.write_all_at(&header.encode(), 0).map_err(io_err)?;
        if let Some((src, from, to)) = copy {
            let mut buf = vec![0u8; (READ_CHUNK as u64).min(to - from) as usize];
            let mut at = from;
            while at < to {
                let n = (READ_CHUNK as u64).min(to - at) as usize;
                src.read_exact_at(&mut buf[..n], at).map_err(io_err)?;
                file.write_all_at(&buf[..n], HEADER_BYTES + (at - from))
                    .map_err(io_err)?;
                at += n as u64;
            }
        }
        file.sync_all().map_err(io_err)
    })();
    match written {
        Ok(()) => Ok(file),
        Err(e) => {
            let _ = fs::remove_file(tmp);
            Err(e)
        }
    }
}

/// Renames a freshly written log into place and makes the name durable.
fn install(path: &Path, tmp: &Path) -> Result<()> {
    if let Err(e) = fs::rename(tmp, path) {
        let _ = fs::remove_file(tmp);
        return Err(Error::io(path, e));
    }
    sync_parent(path).map_err(|e| Error::io(path, e))
}

/// `NAME.tmp` beside the log: where a new log is written before its rename.
fn tmp_path(path: &Path) -> Result<PathBuf> {
    let name = path.file_name().ok_or_else(|| {
        Error::arg(format!(
            "{} is not a valid write-ahead log file name",
            path.display()
        ))
    })?;
    let mut tmp = name.to_os_string();
    tmp.push(".tmp");
    Ok(path.with_file_name(tmp))
}

/// Fsyncs the directory holding `path`.
fn sync_parent(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// Takes the single-writer lock on an open log file.
fn lock(file: &File, path: &Path) -> Result<()> {
    match file.try_lock() {
        Ok(()) => Ok(()),
        Err(fs::TryLockError::WouldBlock) => Err(Error::io(
            path,
            io::Error::new(
                io::ErrorKind::WouldBlock,
                "the log is open by another writer (process or handle); only one may append",
            ),
        )),
        // A file system without locks: go on without the guard.
        Err(fs::TryLockError::Error(_)) => Ok(()),
    }
}

/// The on-disk tag of an element type in an insert record.
pub fn dtype_tag(dtype: DType) -> u8 {
    match dtype {
        DType::F32 => 1,
        DType::F16 => 2,
        DType::U8 => 3,
        DType::I8 => 4,
    }
}

/// The element type of an on-disk tag.
pub fn dtype_from_tag(tag: u8) -> Option<DType> {
    match tag {
        1 => Some(DType::F32),
        2 => Some(DType::F16),
        3 => Some(DType::U8),
        4 => Some(DType::I8),
        _ => None,
    }
}

/// The operations the index updaters log.
///
/// The rows of an insert's payload widened to f32, in the element type
/// the record logged (its dtype tag); `vectors` holds whole elements (the
/// decoder checked its length).
pub fn decode_vectors(dtype: DType, vectors: &[u8]) -> Vec<f32> {
    crate::with_dtype!(dtype, T, {
        vectors
            .chunks_exact(std::mem::size_of::<T>())
            .map(|c| crate::elem::Element::to_f32(bytemuck::pod_read_unaligned::<T>(c)))
            .collect()
    })
}

/// Payload of [`kind::INSERT`]:
///
/// | bytes | field |
/// |---|---|
/// | 0..4 | n, the number of vectors (u32) |
/// | 4..8 | dim (u32, at least 1) |
/// | 8 | dtype tag ([`dtype_tag`]: 1 f32, 2 f16, 3 u8, 4 i8) |
/// | 9..12 | zero |
/// | 12..12+8n | external ids (u64 each) |
/// | 12+8n.. | n × dim elements, row-major, exactly |
///
/// Payload of [`kind::DELETE`]: `[u32 n][n × u64 external ids]`, exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Insert {
        ids: Vec<u64>,
        dim: u32,
        dtype: DType,
        /// `ids.len() × dim` elements of `dtype`, little-endian bytes.
        vectors: Vec<u8>,
    },
    Delete {
        ids: Vec<u64>,
    },
}

impl Op {
    /// The record kind of this operation.
    pub fn kind(&self) -> u8 {
        match self {
            Op::Insert { .. } => kind::INSERT,
            Op::Delete { .. } => kind::DELETE,
        }
    }

    /// The record payload; refuses inconsistent shapes.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let count = |ids: &[u64]| {
            u32::try_from(ids.len()).map_err(|_| {
                Error::arg(format!(
                    "one log record holds at most {} ids, got {}",
                    u32::MAX,
                    ids.len()
                ))
            })
        };
        let out = match self {
            Op::Insert {
                ids,
                dim,
                dtype,
                vectors,
            } => {
                let n = count(ids)?;
                if *dim == 0 {
                    return Err(Error::arg("an insert's dimension must be at least 1"));
                }
                let want = insert_vector_bytes(ids.len(), *dim, *dtype);
                if want != Some(vectors.len()) {
                    return Err(Error::arg(format!(
                        "an insert of {} vectors of dimension {dim} ({dtype}) needs {} vector \
                         bytes, got {}",
                        ids.len(),
                        want.map_or("too many".to_string(), |w| w.to_string()),
                        vectors.len()
                    )));
                }
                let mut out = Vec::with_capacity(12 + 8 * ids.len() + vectors.len());
                out.extend_from_slice(&n.to_le_bytes());
                out.extend_from_slice(&dim.to_le_bytes());
                out.extend_from_slice(&[dtype_tag(*dtype), 0, 0, 0]);
                for id in ids {
                    out.extend_from_slice(&id.to_le_bytes());
                }
                out.extend_from_slice(vectors);
                out
            }
            Op::Delete { ids } => {
                let n = count(ids)?;
                let mut out = Vec::with_capacity(4 + 8 * ids.len());
                out.extend_from_slice(&n.to_le_bytes());
                for id in ids {
                    out.extend_from_slice(&id.to_le_bytes());
                }
                out
            }
        };
        if out.len() > MAX_PAYLOAD as usize {
            return Err(Error::arg(format!(
                "the operation needs {} bytes; a log record holds at most {MAX_PAYLOAD}: split it",
                out.len()
            )));
        }
        Ok(out)
    }

    /// Decodes a record read from the log at `path`; a payload of the wrong
    /// shape or an unknown kind is [`Error::Corrupt`] naming the file, the
    /// record and its offset.
    pub fn decode(record: &Record, path: &Path) -> Result<Op> {
        Op::decode_payload(record.kind, &record.payload).map_err(|msg| {
            Error::corrupt(
                path,
                format!("record {} at offset {}: {msg}", record.seq, record.offset),
            )
        })
    }

    fn decode_payload(kind: u8, p: &[u8]) -> std::result::Result<Op, String> {
        let ids_at = |at: usize, n: usize| -> Vec<u64> {
            p[at..at + 8 * n]
                .chunks_exact(8)
                .map(|c| u64_at(c, 0))
                .collect()
        };
        match kind {
            kind::INSERT => {
                if p.len() < 12 {
                    return Err(format!(
                        "an insert payload is {} bytes, shorter than its 12-byte head",
                        p.len()
                    ));
                }
                let n = u32_at(p, 0) as usize;
                let dim = u32_at(p, 4);
                let dtype = dtype_from_tag(p[8])
                    .ok_or_else(|| format!("unknown dtype tag {} in an insert", p[8]))?;
                if p[9..12] != [0, 0, 0] {
                    return Err("an insert's reserved bytes 9..12 are not zero".into());
                }
                if dim == 0 {
                    return Err("an insert has dimension 0".into());
                }
                let want = insert_vector_bytes(n, dim, dtype)
                    .and_then(|v| n.checked_mul(8)?.checked_add(v)?.checked_add(12));
                if want != Some(p.len()) {
                    return Err(format!(
                        "an insert of {n} vectors of dimension {dim} ({dtype}) does not fit its \
                         {}-byte payload",
                        p.len()
                    ));
                }
                Ok(Op::Insert {
                    ids: ids_at(12, n),
                    dim,
                    dtype,
                    vectors: p[12 + 8 * n..].to_vec(),
                })
            }
            kind::DELETE => {
                if p.len() < 4 {
                    return Err(format!(
                        "a delete payload is {} bytes, shorter than its 4-byte count",
                        p.len()
                    ));
                }
                let n = u32_at(p, 0) as usize;
                if n.checked_mul(8).and_then(|b| b.checked_add(4)) != Some(p.len()) {
                    return Err(format!(
                        "a delete of {n} ids does not fit its {}-byte payload",
                        p.len()
                    ));
                }
                Ok(Op::Delete { ids: ids_at(4, n) })
            }
            other => Err(format!(
                "record kind {other} is neither an insert nor a delete"
            )),
        }
    }
}

/// Bytes of `n` vectors of `dim` elements of `dtype`, if it fits a usize.
fn insert_vector_bytes(n: usize, dim: u32, dtype: DType) -> Option<usize> {
    n.checked_mul(dim as usize)?.checked_mul(dtype.size())
}

#[cfg(test)]
mod tests {
    use super::*;
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
            let (wal, report) =
                Wal::open_after(&path, Durability::Sync, 0, &mut |_| Ok(())).unwrap();
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
}
