//! Synchronous pread fallback: `submit` performs the read (`submit_write`
//! the pwrite), `poll` hands it back.

use super::buffer::{check_write, AlignedBuf};
use super::completion::{Completion, IoCounters};
use crate::Result;
use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// The pread engine.
pub struct PreadEngine {
    file: Arc<File>,
    ready: VecDeque<Completion>,
    counters: IoCounters,
}

impl PreadEngine {
    /// An engine reading `file`; `depth` only sizes the completion queue.
    pub fn new(file: Arc<File>, depth: u32) -> Self {
        PreadEngine {
            file,
            ready: VecDeque::with_capacity(depth as usize),
            counters: IoCounters::default(),
        }
    }

    /// Performs the read now and queues its completion.
    pub fn submit(&mut self, token: u64, offset: u64, mut buf: AlignedBuf) -> Result<()> {
        let result = read_full_at(&self.file, buf.as_mut_slice(), offset);
        self.counters.reads += 1;
        self.ready.push_back(Completion {
            token,
            buf,
            result,
            write: false,
        });
        Ok(())
    }

    /// Performs the write now (pwrite, looping on short writes) and queues
    /// its completion. Refuses an offset or buffer that is not aligned to
    /// [`ALIGN`](super::buffer::ALIGN) without writing anything.
    pub fn submit_write(&mut self, token: u64, offset: u64, buf: AlignedBuf) -> Result<()> {
        check_write(offset, buf.as_ptr() as usize, buf.len())?;
        let result = Completion::write_result(
            write_full_at(&self.file, buf.as_slice(), offset),
            buf.len(),
            offset,
        );
        self.counters.writes += 1;
        self.ready.push_back(Completion {
            token,
            buf,
            result,
            write: true,
        });
        Ok(())
    }

    /// Hands back up to `max` queued completions.
    pub fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        let n = max.min(self.ready.len());
        for c in self.ready.drain(..n) {
            self.counters.record(&c);
            out.push(c);
        }
        n
    }

    /// Every read has already finished: hands all of them back.
    pub fn wait(&mut self, _min: usize, out: &mut Vec<Completion>) -> usize {
        self.poll(out, usize::MAX)
    }

    /// Completions not yet handed back.
    pub fn in_flight(&self) -> usize {
        self.ready.len()
    }

    /// Running totals.
    pub fn counters(&self) -> IoCounters {
        self.counters
    }
}

/// Reads `buf.len()` bytes at `offset`, looping on short reads until EOF.
/// Returns the bytes read (fewer than `buf.len()` only at end of file).
pub(crate) fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0usize;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // With O_DIRECT the follow-up of a short read is misaligned and
            // refused; a short read on a regular file only happens at EOF.
            Err(e) if done > 0 && e.raw_os_error() == Some(libc::EINVAL) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Writes `buf` at `offset`, looping on short writes. Returns the bytes
/// written: all of `buf`, or fewer when the file system stopped taking bytes
/// (a write of 0), which the caller reports as a short write. An error after
/// a partial write (with O_DIRECT the follow-up of a short write is
/// misaligned and refused) is returned as the error.
pub(crate) fn write_full_at(file: &File, buf: &[u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0usize;
    while done < buf.len() {
        match file.write_at(&buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
