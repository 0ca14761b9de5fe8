//! A file for tests (the log, the page file) that fails, tears and loses
//! its writes: the chosen write fails after writing only part of its bytes (a crash in the middle
//! of a write), the chosen `fdatasync` fails, and
//! [`FaultyFile::power_loss_len`] says how much of the file a power loss
//! would leave (what was synced; the test adds part of the rest, or junk,
//! as a disk that had begun the later writes would).

use super::durable::DurableFile;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

/// Which write or sync fails (counted from 0, from when the faults are put
/// in place).
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// This write fails with `EIO` ...
    pub fail_write: Option<u64>,
    /// ... after writing its first `tear` bytes (none: nothing written).
    pub tear: Option<usize>,
    /// This `fdatasync` fails with `EIO` (nothing more becomes durable).
    pub fail_sync: Option<u64>,
}

#[derive(Debug, Default)]
struct Counts {
    writes: u64,
    syncs: u64,
    /// The end of the furthest byte written, and of the last one synced.
    written: u64,
    synced: u64,
}

/// A file whose writes go through [`Faults`].
#[derive(Debug)]
pub struct FaultyFile {
    file: Arc<File>,
    faults: Faults,
    counts: Mutex<Counts>,
}

impl FaultyFile {
    /// Faults on the writes to `file`, whose first `synced` bytes are
    /// durable already.
    pub fn new(file: Arc<File>, synced: u64, faults: Faults) -> FaultyFile {
        FaultyFile {
            file,
            faults,
            counts: Mutex::new(Counts {
                written: synced,
                synced,
                ..Counts::default()
            }),
        }
    }

    /// Bytes of the file that survive a power loss now: those synced.
    pub fn power_loss_len(&self) -> u64 {
        self.counts.lock().map_or(0, |c| c.synced)
    }

    /// Writes and syncs seen so far.
    pub fn calls(&self) -> (u64, u64) {
        self.counts.lock().map_or((0, 0), |c| (c.writes, c.syncs))
    }

    fn eio(what: &str) -> io::Error {
        io::Error::other(format!("injected {what} failure"))
    }
}

impl DurableFile for FaultyFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut c = self.counts.lock().map_err(|_| Self::eio("lock"))?;
        let n = c.writes;
        c.writes += 1;
        if self.faults.fail_write == Some(n) {
            let part = self.faults.tear.unwrap_or(0).min(buf.len());
            if part > 0 {
                FileExt::write_all_at(&*self.file, &buf[..part], offset)?;
                c.written = c.written.max(offset + part as u64);
            }
            return Err(Self::eio("write"));
        }
        FileExt::write_all_at(&*self.file, buf, offset)?;
        c.written = c.written.max(offset + buf.len() as u64);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut c = self.counts.lock().map_err(|_| Self::eio("lock"))?;
        let n = c.syncs;
        c.syncs += 1;
        if self.faults.fail_sync == Some(n) {
            return Err(Self::eio("fdatasync"));
        }
        self.file.sync_data()?;
        c.synced = c.written;
        Ok(())
    }
}
