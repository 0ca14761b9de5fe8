//! What an engine hands back: finished reads and writes, and running totals.

use super::buffer::AlignedBuf;

/// A finished read or write.
#[derive(Debug)]
pub struct Completion {
    /// The token given to `submit` or `submit_write`.
    pub token: u64,
    /// The buffer given to `submit` (now holding the bytes read) or to
    /// `submit_write` (unchanged).
    pub buf: AlignedBuf,
    /// Bytes read or written, or the error.
    ///
    /// A short read (past the end of the file) is reported as `Ok(n)` with
    /// `n < buf.len()`; callers treat it as truncation. A write is either
    /// whole (`Ok(buf.len())`) or an error: engines turn a short write into
    /// an `Err` (kind `WriteZero`), never into a smaller `Ok`.
    pub result: std::io::Result<usize>,
    /// Whether this completes a write (`submit_write`) rather than a read.
    pub write: bool,
}

impl Completion {
    /// The bytes actually read (shorter than the buffer after a short read),
    /// or `None` if the read failed. For a write: the bytes written.
    #[inline]
    pub fn filled(&self) -> Option<&[u8]> {
        match self.result {
            Ok(n) => Some(&self.buf.as_slice()[..n.min(self.buf.len())]),
            Err(_) => None,
        }
    }

    /// A write's result with a short write turned into an error (every
    /// engine reports writes through this).
    pub(crate) fn write_result(
        result: std::io::Result<usize>,
        len: usize,
        offset: u64,
    ) -> std::io::Result<usize> {
        match result {
            Ok(n) if n == len => Ok(n),
            Ok(n) => Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                format!("short write at byte {offset}: {n} of {len} bytes written"),
            )),
            Err(e) => Err(e),
        }
    }
}

/// Running totals of one engine (for statistics and tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoCounters {
    /// Reads submitted.
    pub reads: u64,
    /// Writes submitted.
    pub writes: u64,
    /// Reads and writes whose completion was handed back (successful or not).
    pub completed: u64,
    /// Bytes delivered by successful read completions.
    pub bytes: u64,
    /// Bytes written by successful write completions.
    pub bytes_written: u64,
    /// Completions (reads or writes) handed back with an error.
    pub errors: u64,
}

impl IoCounters {
    /// Records one completion handed back to the caller.
    #[inline]
    pub(crate) fn record(&mut self, c: &Completion) {
        self.completed += 1;
        match (&c.result, c.write) {
            (Ok(n), false) => self.bytes += *n as u64,
            (Ok(n), true) => self.bytes_written += *n as u64,
            (Err(_), _) => self.errors += 1,
        }
    }
}

impl std::ops::AddAssign for IoCounters {
    fn add_assign(&mut self, o: IoCounters) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.completed += o.completed;
        self.bytes += o.bytes;
        self.bytes_written += o.bytes_written;
        self.errors += o.errors;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_write_is_an_error() {
        assert_eq!(Completion::write_result(Ok(8192), 8192, 0).unwrap(), 8192);
        let err = Completion::write_result(Ok(4096), 8192, 12288).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::WriteZero);
        let msg = err.to_string();
        assert!(
            msg.contains("4096 of 8192") && msg.contains("12288"),
            "{msg}"
        );
        let err = Completion::write_result(Ok(0), 4096, 0).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::WriteZero);
        let e = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let err = Completion::write_result(Err(e), 4096, 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    }

    #[test]
    fn counters_keep_reads_and_writes_apart() {
        let mut k = IoCounters::default();
        let c = |result, write| Completion {
            token: 0,
            buf: AlignedBuf::new(4096),
            result,
            write,
        };
        k.record(&c(Ok(4096), false));
        k.record(&c(Ok(8192), true));
        k.record(&c(Err(std::io::Error::other("x")), true));
        assert_eq!(
            (k.completed, k.bytes, k.bytes_written, k.errors),
            (3, 4096, 8192, 1)
        );
        let mut sum = k;
        sum += k;
        assert_eq!(sum.bytes_written, 16384);
    }
}
