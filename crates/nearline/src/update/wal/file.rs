//! The log's bytes on disk: the header, a record's encoding, the scan that
//! validates a file (and finds a torn tail), and the writing of a new log
//! file beside the old one.

use super::{
    Record, FORMAT_MAJOR, FORMAT_MINOR, HEADER_BYTES, MAGIC, MAX_PAYLOAD, READ_CHUNK, RECORD_HEAD,
    RECORD_OVERHEAD,
};
use crate::error::{Error, Result};
use std::borrow::Cow;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The file header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::update) struct Header {
    pub(in crate::update) log_id: u64,
    pub(in crate::update) first_seq: u64,
}

impl Header {
    pub(super) fn encode(&self) -> [u8; HEADER_BYTES as usize] {
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

    pub(in crate::update) fn decode(
        path: &Path,
        h: &[u8; HEADER_BYTES as usize],
    ) -> Result<Header> {
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

pub(super) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

/// Appends the encoding of one record to `buf`.
pub(super) fn encode_record(buf: &mut Vec<u8>, seq: u64, kind: u8, payload: &[u8]) {
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
pub(in crate::update) fn parse_head(h: &[u8]) -> (u32, u64, u8) {
    (u32_at(h, 0), u64_at(h, 4), h[12])
}

/// What [`scan`] found.
pub(super) struct Scan {
    pub(super) header: Header,
    /// The sequence after the last good record.
    pub(super) next_seq: u64,
    /// End of the last good record.
    pub(super) good_len: u64,
    pub(super) file_len: u64,
    pub(super) replayed: u64,
}

/// Validates the log and hands `f` the records after `after_seq`.
pub(super) fn scan(
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
pub(super) fn find_valid_after(
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
pub(super) fn offset_of(
    path: &Path,
    file: &File,
    first_seq: u64,
    seq: u64,
    len: u64,
) -> Result<u64> {
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
pub(super) fn write_new_log(
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
pub(super) fn install(path: &Path, tmp: &Path) -> Result<()> {
    if let Err(e) = fs::rename(tmp, path) {
        let _ = fs::remove_file(tmp);
        return Err(Error::io(path, e));
    }
    sync_parent(path).map_err(|e| Error::io(path, e))
}

/// `NAME.tmp` beside the log: where a new log is written before its rename.
pub(super) fn tmp_path(path: &Path) -> Result<PathBuf> {
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
pub(super) fn sync_parent(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// Takes the single-writer lock on an open log file.
pub(super) fn lock(file: &File, path: &Path) -> Result<()> {
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
