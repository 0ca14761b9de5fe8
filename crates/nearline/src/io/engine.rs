//! The engine enum: one match per call, no dynamic dispatch on the hot path.

use super::buffer::AlignedBuf;
use super::fake::FakeEngine;
use super::pread::PreadEngine;
#[cfg(target_os = "linux")]
use super::uring::UringEngine;
use crate::{Error, Result};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

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

/// Which engine to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// io_uring when it can be set up, pread otherwise. `NEARLINE_IO=pread`
    /// (or `uring`) in the environment overrides.
    Auto,
    Uring,
    Pread,
}

impl EngineKind {
    /// Parses `auto`, `uring`/`io_uring`, `pread`.
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(EngineKind::Auto),
            "uring" | "io_uring" | "io-uring" => Ok(EngineKind::Uring),
            "pread" | "sync" => Ok(EngineKind::Pread),
            other => Err(Error::arg(format!(
                "unknown I/O engine {other:?}: expected auto, uring or pread"
            ))),
        }
    }
}

/// An I/O engine owned by one worker.
pub enum IoEngine {
    #[cfg(target_os = "linux")]
    Uring(UringEngine),
    Pread(PreadEngine),
    Fake(FakeEngine),
}

impl IoEngine {
    /// Opens an engine of `kind` reading `file` with up to `depth` reads in flight.
    pub fn open(kind: EngineKind, file: Arc<File>, depth: u32) -> Result<Self> {
        let _ = (kind, file, depth);
        Err(Error::Engine("IoEngine::open: not implemented yet".into()))
    }
    /// Queues a read of `buf.len()` bytes at byte `offset`.
    pub fn submit(&mut self, token: u64, offset: u64, buf: AlignedBuf) -> Result<()> {
        let _ = (token, offset, buf);
        Err(Error::Engine("not implemented".into()))
    }
    /// Appends up to `max` finished reads to `out` without blocking.
    pub fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        let _ = (out, max);
        Ok(0)
    }
    /// Blocks until at least `min(min, in_flight)` reads finished; appends them.
    pub fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> Result<usize> {
        let _ = (min, out);
        Ok(0)
    }
    /// Reads submitted and not yet reaped.
    pub fn in_flight(&self) -> usize {
        0
    }
    /// `"io_uring"`, `"pread"` or `"fake"`.
    pub fn name(&self) -> &'static str {
        "none"
    }
}

/// Opens `path` read-only with O_DIRECT. Returns the file and whether
/// O_DIRECT is in effect (file systems such as tmpfs refuse it; then the file
/// is opened without it and the caller may report that reads are cached).
pub fn open_direct(path: &Path) -> Result<(File, bool)> {
    let _ = path;
    Err(Error::Engine("open_direct: not implemented yet".into()))
}
