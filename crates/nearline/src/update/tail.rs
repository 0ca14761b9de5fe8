//! Reading a write-ahead log that another process appends to: a reader of
//! an index (opened read-only beside its one writer) follows the writer's
//! log to see every update acknowledged since the checkpoint it loaded.
//!
//! The reader takes no lock and repairs nothing. It reads the records after
//! the last one it read, as far as they are complete: a record cut short,
//! or one whose checksum fails, may be one the writer is appending right
//! now, so the read stops there and the next one starts again from it. A
//! record the writer acknowledged has been written in full before its
//! `insert` or `delete` returned, so a read begun afterwards finds it.
//!
//! At a checkpoint the writer replaces the log (a new file renamed over the
//! old one, starting after the checkpoint's sequence). [`WalTail::read_new`]
//! tells the caller when the file at the log's path is no longer the one it
//! follows; the caller then reopens it, and reloads the index's state when
//! the new log starts past what it has read.

use super::wal::{parse_head, Header, Record, HEADER_BYTES, MAX_PAYLOAD, RECORD_HEAD};
use crate::error::{Error, Result};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

/// What a [`WalTail::read_new`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailStatus {
    /// Every complete record of the file is read.
    Current,
    /// The log's path names another file now (the writer reset the log at
    /// a checkpoint): reopen it.
    Replaced,
}

/// A reader of a log another process appends to.
#[derive(Debug)]
pub struct WalTail {
    path: PathBuf,
    file: File,
    /// Inode of `file`, to notice a replaced log.
    ino: u64,
    log_id: u64,
    first_seq: u64,
    /// Where the next record starts, and its sequence.
    off: u64,
    next_seq: u64,
}

impl WalTail {
    /// Opens the log at `path` for reading.
    pub fn open(path: &Path) -> Result<WalTail> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let meta = file.metadata().map_err(|e| Error::io(path, e))?;
        if meta.len() < HEADER_BYTES {
            return Err(Error::corrupt(
                path,
                format!(
                    "the log is {} bytes, shorter than its {HEADER_BYTES}-byte header",
                    meta.len()
                ),
            ));
        }
        let mut h = [0u8; HEADER_BYTES as usize];
        file.read_exact_at(&mut h, 0)
            .map_err(|e| Error::io(path, e))?;
        let header = Header::decode(path, &h)?;
        Ok(WalTail {
            path: path.to_path_buf(),
            file,
            ino: meta.ino(),
            log_id: header.log_id,
            first_seq: header.first_seq,
            off: HEADER_BYTES,
            next_seq: header.first_seq,
        })
    }

    /// The log id of the file (+1 at every reset).
    pub fn log_id(&self) -> u64 {
        self.log_id
    }

    /// The sequence of the file's first record.
    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }

    /// The sequence of the next record to read.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Reads the complete records after the last read, handing `f` those
    /// whose sequence is above `after_seq`, in order; then says whether the
    /// log's path still names this file.
    pub fn read_new(
        &mut self,
        after_seq: u64,
        f: &mut dyn FnMut(Record) -> Result<()>,
    ) -> Result<TailStatus> {
        let path = &self.path;
        let io_err = |e| Error::io(path, e);
        // Whether the path names another file is decided before reading, so
        // a reset right after the read is noticed by the next call, after
        // this file's last records have been read.
        let replaced = match std::fs::metadata(path) {
            Ok(m) => m.ino() != self.ino,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => return Err(io_err(e)),
        };
        let len = self.file.metadata().map_err(io_err)?.len();
        let mut buf = Vec::new();
        while self.off + RECORD_HEAD as u64 + 4 <= len {
            let mut head = [0u8; RECORD_HEAD];
            self.file
                .read_exact_at(&mut head, self.off)
                .map_err(io_err)?;
            let (plen, seq, kind) = parse_head(&head);
            let total = RECORD_HEAD as u64 + plen as u64 + 4;
            if plen > MAX_PAYLOAD || self.off + total > len || seq != self.next_seq {
                // Not written in full yet (or not a record: the writer's
                // own open will judge that).
                break;
            }
            buf.resize(plen as usize + 4, 0);
            self.file
                .read_exact_at(&mut buf, self.off + RECORD_HEAD as u64)
                .map_err(io_err)?;
            let (payload, crc) = buf.split_at(plen as usize);
            let got = crc32c::crc32c_append(crc32c::crc32c(&head), payload);
            if got != u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) {
                break;
            }
            if seq > after_seq {
                f(Record {
                    seq,
                    kind,
                    payload: payload.to_vec(),
                    offset: self.off,
                })?;
            }
            self.off += total;
            self.next_seq += 1;
        }
        Ok(if replaced {
            TailStatus::Replaced
        } else {
            TailStatus::Current
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::update::wal::{Durability, Wal};

    fn collect(t: &mut WalTail, after: u64) -> (Vec<u64>, TailStatus) {
        let mut seqs = Vec::new();
        let st = t
            .read_new(after, &mut |r| {
                seqs.push(r.seq);
                Ok(())
            })
            .unwrap();
        (seqs, st)
    }

    #[test]
    fn a_reader_follows_appends_stops_at_a_partial_record_and_notices_a_reset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal.log");
        let wal = Wal::create(&path, 1, Durability::Buffered).unwrap();
        let mut t = WalTail::open(&path).unwrap();
        assert_eq!(collect(&mut t, 0), (vec![], TailStatus::Current));
        for i in 0..3u8 {
            wal.append_durable(1, &[i; 10]).unwrap();
        }
        assert_eq!(collect(&mut t, 1), (vec![2, 3], TailStatus::Current));
        // Half a record at the end: not read until it is complete.
        let len = std::fs::metadata(&path).unwrap().len();
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        use std::io::Write;
        (&f).write_all(&[40, 0, 0, 0, 4, 0]).unwrap();
        assert_eq!(collect(&mut t, 0), (vec![], TailStatus::Current));
        f.set_len(len).unwrap();
        wal.append_durable(1, b"four").unwrap();
        let mut payloads = Vec::new();
        t.read_new(0, &mut |r| {
            payloads.push(r.payload);
            Ok(())
        })
        .unwrap();
        assert_eq!(payloads, vec![b"four".to_vec()]);
        // A checkpoint resets the log: the reader is told, reads what the old
        // file held, and a reopened reader starts at the new first record.
        wal.append_durable(1, b"five").unwrap();
        wal.truncate_before(5).unwrap();
        assert_eq!(collect(&mut t, 0), (vec![5], TailStatus::Replaced));
        let mut t = WalTail::open(&path).unwrap();
        assert_eq!(t.first_seq(), 5);
        assert_eq!(t.log_id(), 2);
        assert_eq!(collect(&mut t, 4), (vec![5], TailStatus::Current));
        assert_eq!(t.next_seq(), 6);
    }

    #[test]
    fn a_damaged_header_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal.log");
        drop(Wal::create(&path, 1, Durability::Buffered).unwrap());
        let mut b = std::fs::read(&path).unwrap();
        b[20] ^= 1;
        std::fs::write(&path, &b).unwrap();
        assert!(matches!(
            WalTail::open(&path).unwrap_err(),
            Error::Corrupt { .. }
        ));
        std::fs::write(&path, b"NLWAL").unwrap();
        assert!(WalTail::open(&path).is_err());
    }
}
