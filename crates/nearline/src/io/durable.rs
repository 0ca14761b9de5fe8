//! The writes of a file that must reach the disk (the write-ahead log, and
//! the page file an in-place update patches): a positioned write and a
//! data sync, behind one trait so that tests can put a file that fails or
//! tears its writes and loses what was never synced
//! ([`super::faulty::FaultyFile`]) where the real file is.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The writes of a file whose bytes must become durable.
pub trait DurableFile: Send + Sync + std::fmt::Debug {
    /// Writes all of `buf` at byte `offset` (a short write is an error).
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every byte written so far durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
}

impl DurableFile for File {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }
}
