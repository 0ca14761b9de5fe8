//! The engine enum: one match per call, no dynamic dispatch on the hot path.

use super::buffer::AlignedBuf;
use super::completion::{Completion, IoCounters};
use super::fake::{FakeEngine, FakeOptions};
use super::pread::PreadEngine;
#[cfg(target_os = "linux")]
use super::uring::UringEngine;
use crate::{Error, Result};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

/// Name of the environment variable that overrides [`EngineKind::Auto`].
pub const ENGINE_ENV: &str = "NEARLINE_IO";

/// Which engine to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// io_uring when it can be set up, pread otherwise. `NEARLINE_IO=pread`
    /// (or `uring`) in the environment overrides.
    Auto,
    Uring,
    /// io_uring in polling mode: a kernel submission thread and spinning
    /// waits (lowest latency, a busy core per worker; never picked by `Auto`).
    UringPoll,
    Pread,
}

impl EngineKind {
    /// Parses `auto`, `uring`/`io_uring`, `uring-poll`, `pread`.
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(EngineKind::Auto),
            "uring" | "io_uring" | "io-uring" => Ok(EngineKind::Uring),
            "uring-poll" | "io_uring-poll" | "uring_poll" => Ok(EngineKind::UringPoll),
            "pread" | "sync" => Ok(EngineKind::Pread),
            other => Err(Error::arg(format!(
                "unknown I/O engine {other:?}: expected auto, uring, uring-poll or pread"
            ))),
        }
    }

    /// Applies the environment override: an explicit `Uring`/`Pread` is kept
    /// as is; `Auto` becomes what `env_value` (the value of `NEARLINE_IO`, if
    /// set) names. The result may still be `Auto` (try io_uring, fall back to
    /// pread). Taking the value as a parameter keeps this testable without
    /// touching the process environment.
    pub fn resolve(self, env_value: Option<&str>) -> Result<Self> {
        match (self, env_value) {
            (EngineKind::Auto, Some(v)) => EngineKind::parse(v).map_err(|_| {
                Error::arg(format!(
                    "environment variable {ENGINE_ENV}={v:?} is not a valid I/O engine: \
                     expected auto, uring, uring-poll or pread"
                ))
            }),
            (kind, _) => Ok(kind),
        }
    }

    /// [`EngineKind::resolve`] with the value of `NEARLINE_IO` from the
    /// process environment.
    pub fn resolve_from_env(self) -> Result<Self> {
        if self != EngineKind::Auto {
            return Ok(self);
        }
        match std::env::var(ENGINE_ENV) {
            Ok(v) => self.resolve(Some(&v)),
            Err(std::env::VarError::NotPresent) => Ok(self),
            Err(std::env::VarError::NotUnicode(v)) => Err(Error::arg(format!(
                "environment variable {ENGINE_ENV}={v:?} is not valid UTF-8: \
                 expected auto, uring, uring-poll or pread"
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
    ///
    /// `Auto` consults `NEARLINE_IO` and otherwise tries io_uring, silently
    /// falling back to pread when the ring cannot be set up (see
    /// [`IoEngine::name`] for which one was chosen).
    pub fn open(kind: EngineKind, file: Arc<File>, depth: u32) -> Result<Self> {
        Self::open_resolved(kind.resolve_from_env()?, file, depth)
    }

    /// [`IoEngine::open`] without consulting the environment: `Auto` means
    /// "io_uring if possible, else pread".
    pub fn open_resolved(kind: EngineKind, file: Arc<File>, depth: u32) -> Result<Self> {
        if depth == 0 {
            return Err(Error::arg("I/O engine depth: expected at least 1, got 0"));
        }
        match kind {
            EngineKind::Pread => Ok(IoEngine::Pread(PreadEngine::new(file, depth))),
            EngineKind::Uring => Self::open_uring(file, depth, false),
            EngineKind::UringPoll => Self::open_uring(file, depth, true),
            EngineKind::Auto => match Self::open_uring(Arc::clone(&file), depth, false) {
                Ok(e) => Ok(e),
                Err(_) => Ok(IoEngine::Pread(PreadEngine::new(file, depth))),
            },
        }
    }

    #[cfg(target_os = "linux")]
    fn open_uring(file: Arc<File>, depth: u32, polling: bool) -> Result<Self> {
        let e = if polling {
            UringEngine::polling(file, depth)
        } else {
            UringEngine::new(file, depth)
        };
        e.map(IoEngine::Uring)
            .map_err(|e| Error::Engine(format!("io_uring is unavailable: {e}")))
    }

    #[cfg(not(target_os = "linux"))]
    fn open_uring(_file: Arc<File>, _depth: u32, _polling: bool) -> Result<Self> {
        Err(Error::Engine(
            "io_uring is unavailable: not supported on this operating system".into(),
        ))
    }

    /// A fake engine serving reads from `data` (for tests).
    pub fn fake(data: Arc<Vec<u8>>, opts: FakeOptions) -> Self {
        IoEngine::Fake(FakeEngine::new(data, opts))
    }

    /// Queues a read of `buf.len()` bytes at byte `offset`. The read may not
    /// reach the kernel before the next [`IoEngine::flush`], `poll` or `wait`.
    #[inline]
    pub fn submit(&mut self, token: u64, offset: u64, buf: AlignedBuf) -> Result<()> {
        match self {
            #[cfg(target_os = "linux")]
            IoEngine::Uring(e) => e.submit(token, offset, buf),
            IoEngine::Pread(e) => e.submit(token, offset, buf),
            IoEngine::Fake(e) => e.submit(token, offset, buf),
        }
    }

    /// Hands reads queued by `submit` to the kernel now (one system call for
    /// the batch) without waiting. Useful when the caller has other work to
    /// do before its next `poll`.
    #[inline]
    pub fn flush(&mut self) -> Result<()> {
        match self {
            #[cfg(target_os = "linux")]
            IoEngine::Uring(e) => e.flush(),
            IoEngine::Pread(_) | IoEngine::Fake(_) => Ok(()),
        }
    }

    /// Appends up to `max` finished reads to `out` without blocking.
    #[inline]
    pub fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        match self {
            #[cfg(target_os = "linux")]
            IoEngine::Uring(e) => e.poll(out, max),
            IoEngine::Pread(e) => Ok(e.poll(out, max)),
            IoEngine::Fake(e) => Ok(e.poll(out, max)),
        }
    }

    /// Blocks until at least `min(min, in_flight)` reads finished; appends them
    /// (and any other finished read).
    #[inline]
    pub fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> Result<usize> {
        match self {
            #[cfg(target_os = "linux")]
            IoEngine::Uring(e) => e.wait(min, out),
            IoEngine::Pread(e) => Ok(e.wait(min, out)),
            IoEngine::Fake(e) => Ok(e.wait(min, out)),
        }
    }

    /// Waits for every read in flight and appends all of them to `out`
    /// (a query that stops early calls this before returning its buffers).
    pub fn drain(&mut self, out: &mut Vec<Completion>) -> Result<usize> {
        let mut total = 0;
        while self.in_flight() > 0 {
            total += self.wait(self.in_flight(), out)?;
        }
        Ok(total)
    }

    /// Reads submitted and not yet reaped.
    #[inline]
    pub fn in_flight(&self) -> usize {
        match self {
            #[cfg(target_os = "linux")]
            IoEngine::Uring(e) => e.in_flight(),
            IoEngine::Pread(e) => e.in_flight(),
            IoEngine::Fake(e) => e.in_flight(),
        }
    }

    /// Bytes this engine holds (rings and per-read bookkeeping; pread and
    /// the fake engine hold nothing worth counting).
    pub fn memory_bytes(&self) -> u64 {
        match self {
            #[cfg(target_os = "linux")]
            IoEngine::Uring(e) => e.memory_bytes(),
            IoEngine::Pread(_) | IoEngine::Fake(_) => 0,
        }
    }

    /// Bytes an engine opened for `depth` reads in flight may hold.
    pub fn bytes_for_depth(depth: usize) -> u64 {
        #[cfg(target_os = "linux")]
        {
            super::uring::ring_bytes(depth)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = depth;
            0
        }
    }

    /// `"io_uring"`, `"io_uring-poll"`, `"pread"` or `"fake"`.
    pub fn name(&self) -> &'static str {
        match self {
            #[cfg(target_os = "linux")]
            IoEngine::Uring(e) if e.is_polling() => "io_uring-poll",
            #[cfg(target_os = "linux")]
            IoEngine::Uring(_) => "io_uring",
            IoEngine::Pread(_) => "pread",
            IoEngine::Fake(_) => "fake",
        }
    }

    /// Running totals of reads and bytes.
    pub fn counters(&self) -> IoCounters {
        match self {
            #[cfg(target_os = "linux")]
            IoEngine::Uring(e) => e.counters(),
            IoEngine::Pread(e) => e.counters(),
            IoEngine::Fake(e) => e.counters(),
        }
    }
}

impl std::fmt::Debug for IoEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoEngine")
            .field("name", &self.name())
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

/// Opens `path` read-only with O_DIRECT. Returns the file and whether
/// O_DIRECT is in effect (file systems such as tmpfs refuse it; then the file
/// is opened without it and the caller may report that reads are cached).
pub fn open_direct(path: &Path) -> Result<(File, bool)> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(f) => return Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(Error::io(path, e)),
        }
    }
    File::open(path)
        .map(|f| (f, false))
        .map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_env_override() {
        let auto = EngineKind::Auto;
        assert_eq!(auto.resolve(None).unwrap(), EngineKind::Auto);
        assert_eq!(auto.resolve(Some("pread")).unwrap(), EngineKind::Pread);
        assert_eq!(auto.resolve(Some("URING")).unwrap(), EngineKind::Uring);
        assert_eq!(auto.resolve(Some("auto")).unwrap(), EngineKind::Auto);
        // An explicit choice wins over the environment.
        assert_eq!(
            EngineKind::Uring.resolve(Some("pread")).unwrap(),
            EngineKind::Uring
        );
        assert_eq!(
            EngineKind::Pread.resolve(Some("bogus")).unwrap(),
            EngineKind::Pread
        );
        let err = auto.resolve(Some("bogus")).unwrap_err().to_string();
        assert!(err.contains("NEARLINE_IO"), "{err}");
        assert!(err.contains("bogus"), "{err}");
    }

    #[test]
    fn env_pread_forces_pread_engine() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        let file = Arc::new(tmp.reopen().unwrap());
        let kind = EngineKind::Auto.resolve(Some("pread")).unwrap();
        let e = IoEngine::open_resolved(kind, file, 4).unwrap();
        assert_eq!(e.name(), "pread");
    }

    #[test]
    fn depth_zero_is_rejected() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        let file = Arc::new(tmp.reopen().unwrap());
        let err = IoEngine::open_resolved(EngineKind::Pread, file, 0).unwrap_err();
        assert!(err.to_string().contains("depth"));
    }

    #[test]
    fn parse_kinds() {
        assert_eq!(EngineKind::parse("io_uring").unwrap(), EngineKind::Uring);
        assert_eq!(EngineKind::parse("Pread").unwrap(), EngineKind::Pread);
        assert_eq!(EngineKind::parse("").unwrap(), EngineKind::Auto);
        assert!(EngineKind::parse("mmap").is_err());
    }

    #[test]
    fn open_direct_missing_file_names_path() {
        let err = open_direct(Path::new("/nonexistent/nearline/x.bin")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/nearline/x.bin"));
    }
}
