//! Synchronous pread fallback: `submit` performs the read, `poll` hands it back.

use super::buffer::AlignedBuf;
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
        self.ready.push_back(Completion { token, buf, result });
        Ok(())
    }

    /// Hands back up to `max` queued completions.
    pub fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        let n = max.min(self.ready.len());
        for c in self.ready.drain(..n) {
            self.counters.record(&c.result);
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
