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
    /// Opens an engine of `kind` reading `file` with up to `depth` reads (or
    /// writes) in flight. Writes need `file` open for writing (see
    /// [`open_direct_rw`]); on a read-only file they complete with `EBADF`.
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

    /// Queues a write of the whole of `buf` at byte `offset`; the engine owns
    /// `buf` until the completion (with `write: true`) hands it back. Like a
    /// read it may not reach the kernel before the next `flush`, `poll` or
    /// `wait`.
    ///
    /// The offset, the length and the buffer's address must be multiples of
    /// [`ALIGN`](super::buffer::ALIGN) (O_DIRECT's rule; an [`AlignedBuf`] always satisfies the
    /// last two): anything else is refused with [`Error::InvalidArgument`]
    /// and nothing is queued. A completion reports all of `buf` written or
    /// an error; a short write is an error (kind `WriteZero`), never a
    /// smaller count. The bytes are whatever the caller put there: callers
    /// write checksummed blocks (the partition index's block controller).
    /// Writes are not durable until the caller syncs the file.
    #[inline]
    pub fn submit_write(&mut self, token: u64, offset: u64, buf: AlignedBuf) -> Result<()> {
        match self {
            #[cfg(target_os = "linux")]
            IoEngine::Uring(e) => e.submit_write(token, offset, buf),
            IoEngine::Pread(e) => e.submit_write(token, offset, buf),
            IoEngine::Fake(e) => e.submit_write(token, offset, buf),
        }
    }

    /// Hands reads and writes queued by `submit`/`submit_write` to the kernel now (one system call for
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

    /// Appends up to `max` finished reads and writes to `out` without blocking.
    #[inline]
    pub fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        match self {
            #[cfg(target_os = "linux")]
            IoEngine::Uring(e) => e.poll(out, max),
            IoEngine::Pread(e) => Ok(e.poll(out, max)),
            IoEngine::Fake(e) => Ok(e.poll(out, max)),
        }
    }

    /// Blocks until at least `min(min, in_flight)` operations finished;
    /// appends them (and any other finished one).
    #[inline]
    pub fn wait(&mut self, min: usize, out: &mut Vec<Completion>) -> Result<usize> {
        match self {
            #[cfg(target_os = "linux")]
            IoEngine::Uring(e) => e.wait(min, out),
            IoEngine::Pread(e) => Ok(e.wait(min, out)),
            IoEngine::Fake(e) => Ok(e.wait(min, out)),
        }
    }

    /// Waits for every read and write in flight and appends all of them to `out`
    /// (a query that stops early calls this before returning its buffers).
    pub fn drain(&mut self, out: &mut Vec<Completion>) -> Result<usize> {
        let mut total = 0;
        while self.in_flight() > 0 {
            total += self.wait(self.in_flight(), out)?;
        }
        Ok(total)
    }

    /// Reads and writes submitted and not yet reaped.
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

    /// Running totals of reads, writes and bytes.
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

/// Opens `path` for reading and writing with O_DIRECT (creating it when
/// `create`), for an engine that writes. Returns the file and whether
/// O_DIRECT is in effect (as [`open_direct`]: without it where the file
/// system refuses it). Read-only index files keep [`open_direct`].
pub fn open_direct_rw(path: &Path, create: bool) -> Result<(File, bool)> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(true).create(create);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut od = o.clone();
        od.custom_flags(libc::O_DIRECT);
        match od.open(path) {
            Ok(f) => return Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(Error::io(path, e)),
        }
    }
    o.open(path)
        .map(|f| (f, false))
        .map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::completion::IoCounters;

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

    use crate::io::buffer::ALIGN;

    /// An engine of `kind` over `file`; `None` (test skipped) when io_uring
    /// cannot be set up here.
    fn engine_or_skip(kind: EngineKind, file: &Arc<File>, depth: u32) -> Option<IoEngine> {
        match IoEngine::open_resolved(kind, Arc::clone(file), depth) {
            Ok(e) => Some(e),
            Err(e) if kind != EngineKind::Pread => {
                eprintln!("io_uring unavailable, skipping: {e}");
                None
            }
            Err(e) => panic!("pread engine: {e}"),
        }
    }

    /// A buffer of `pages` pages, each filled with a pattern of `seed`.
    fn pattern(pages: usize, seed: u8) -> AlignedBuf {
        let mut b = AlignedBuf::new(pages * ALIGN);
        for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
            *x = seed.wrapping_add((i % 251) as u8).wrapping_mul(3);
        }
        b
    }

    /// Writes several buffers at once (more than the depth, one past the end
    /// of the file, one over an earlier one), then reads everything back.
    fn round_trip(kind: EngineKind) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.bin");
        let (f, _direct) = open_direct_rw(&path, true).unwrap();
        let file = Arc::new(f);
        let Some(mut e) = engine_or_skip(kind, &file, 3) else {
            return;
        };
        // (token, first page, pages, seed); token 5 overwrites page 2.
        let writes = [
            (0u64, 0u64, 1usize, 1u8),
            (1, 1, 2, 2),
            (2, 3, 4, 3),
            (3, 10, 1, 4),
            (4, 7, 3, 5),
            (5, 2, 1, 6),
        ];
        let mut expect = vec![0u8; 11 * ALIGN];
        for &(t, page, pages, seed) in &writes[..5] {
            let b = pattern(pages, seed);
            let off = page as usize * ALIGN;
            expect[off..off + b.len()].copy_from_slice(b.as_slice());
            e.submit_write(t, page * ALIGN as u64, b).unwrap();
        }
        let mut out = Vec::new();
        e.drain(&mut out).unwrap();
        // The overwrite goes after the first batch completed.
        let (t, page, pages, seed) = writes[5];
        let b = pattern(pages, seed);
        let off = page as usize * ALIGN;
        expect[off..off + b.len()].copy_from_slice(b.as_slice());
        e.submit_write(t, page * ALIGN as u64, b).unwrap();
        e.drain(&mut out).unwrap();
        assert_eq!(out.len(), 6, "{}", e.name());
        let mut written = 0;
        for c in &out {
            let (_, _, pages, seed) = writes[c.token as usize];
            assert!(c.write);
            assert_eq!(*c.result.as_ref().unwrap(), pages * ALIGN, "{}", e.name());
            // The buffer comes back unchanged.
            assert_eq!(c.buf.as_slice(), pattern(pages, seed).as_slice());
            written += (pages * ALIGN) as u64;
        }
        assert_eq!(
            file.metadata().unwrap().len(),
            11 * ALIGN as u64,
            "{}",
            e.name()
        );
        for page in 0..11u64 {
            e.submit(page, page * ALIGN as u64, AlignedBuf::new(ALIGN))
                .unwrap();
        }
        out.clear();
        e.drain(&mut out).unwrap();
        assert_eq!(out.len(), 11);
        for c in &out {
            assert!(!c.write);
            let off = c.token as usize * ALIGN;
            assert_eq!(
                c.filled().unwrap(),
                &expect[off..off + ALIGN],
                "{}",
                e.name()
            );
        }
        let k = e.counters();
        assert_eq!(
            (k.reads, k.writes, k.completed, k.errors),
            (11, 6, 17, 0),
            "{}",
            e.name()
        );
        assert_eq!(k.bytes_written, written);
        assert_eq!(k.bytes, 11 * ALIGN as u64);
    }

    #[test]
    fn pread_engine_writes_then_reads_back() {
        round_trip(EngineKind::Pread);
    }

    #[test]
    fn uring_engine_writes_then_reads_back() {
        round_trip(EngineKind::Uring);
    }

    #[test]
    fn misaligned_writes_are_refused_before_anything_is_queued() {
        let dir = tempfile::tempdir().unwrap();
        let (f, _) = open_direct_rw(&dir.path().join("w.bin"), true).unwrap();
        let file = Arc::new(f);
        let mut engines: Vec<IoEngine> = [EngineKind::Pread, EngineKind::Uring]
            .into_iter()
            .filter_map(|k| engine_or_skip(k, &file, 4))
            .collect();
        engines.push(IoEngine::fake(
            Arc::new(vec![0; ALIGN]),
            FakeOptions::default(),
        ));
        for e in &mut engines {
            for off in [1u64, 512, ALIGN as u64 + 8, u64::MAX] {
                let err = e.submit_write(7, off, AlignedBuf::new(ALIGN)).unwrap_err();
                assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
                let msg = err.to_string();
                assert!(msg.contains(&off.to_string()), "{msg}");
                assert!(msg.contains("4096"), "{msg}");
            }
            assert_eq!(e.in_flight(), 0, "{}", e.name());
            assert_eq!(e.counters(), IoCounters::default(), "{}", e.name());
        }
        assert_eq!(
            std::fs::metadata(dir.path().join("w.bin")).unwrap().len(),
            0
        );
    }

    #[test]
    fn write_to_a_read_only_file_completes_with_an_error() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        let (f, _) = open_direct(tmp.path()).unwrap();
        let file = Arc::new(f);
        for kind in [EngineKind::Pread, EngineKind::Uring] {
            let Some(mut e) = engine_or_skip(kind, &file, 2) else {
                continue;
            };
            e.submit_write(3, 0, AlignedBuf::new(ALIGN)).unwrap();
            let mut out = Vec::new();
            e.drain(&mut out).unwrap();
            assert_eq!(out.len(), 1);
            assert!(out[0].write);
            let err = out[0].result.as_ref().unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EBADF), "{}: {err}", e.name());
            assert_eq!(out[0].filled(), None);
            let k = e.counters();
            assert_eq!((k.writes, k.errors, k.bytes_written), (1, 1, 0));
        }
    }

    #[test]
    fn open_direct_missing_file_names_path() {
        let err = open_direct(Path::new("/nonexistent/nearline/x.bin")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/nearline/x.bin"));
    }
}
