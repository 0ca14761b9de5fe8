//! What an engine hands back: finished reads and running totals.

use super::buffer::AlignedBuf;

/// A finished read.
#[derive(Debug)]
pub struct Completion {
    /// The token given to `submit`.
    pub token: u64,
    /// The buffer given to `submit`, now holding the bytes read.
    pub buf: AlignedBuf,
    /// Bytes read, or the error. A short read (past the end of the file) is
    /// reported as `Ok(n)` with `n < buf.len()`; callers treat it as truncation.
    pub result: std::io::Result<usize>,
}

impl Completion {
    /// The bytes actually read (shorter than the buffer after a short read),
    /// or `None` if the read failed.
    #[inline]
    pub fn filled(&self) -> Option<&[u8]> {
        match self.result {
            Ok(n) => Some(&self.buf.as_slice()[..n.min(self.buf.len())]),
            Err(_) => None,
        }
    }
}

/// Running totals of one engine (for statistics and tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoCounters {
    /// Reads submitted.
    pub reads: u64,
    /// Reads whose completion was handed back (successful or not).
    pub completed: u64,
    /// Bytes delivered by successful completions.
    pub bytes: u64,
    /// Completions handed back with an error.
    pub errors: u64,
}

impl IoCounters {
    /// Records one completion handed back to the caller.
    #[inline]
    pub(crate) fn record(&mut self, result: &std::io::Result<usize>) {
        self.completed += 1;
        match result {
            Ok(n) => self.bytes += *n as u64,
            Err(_) => self.errors += 1,
        }
    }
}
