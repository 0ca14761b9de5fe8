//! The writes of an append-only file (the write-ahead log): a positioned
//! write and a data sync, behind one trait so that tests can put a file
//! that fails or tears its writes and loses what was never synced
//! ([`super::fake::FaultyFile`]) where the real file is.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The writes of an append-only file.
pub trait AppendFile: Send + Sync + std::fmt::Debug {
    /// Writes all of `buf` at byte `offset` (a short write is an error).
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every byte written so far durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
}

impl AppendFile for File {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }
}
