//! The same-run disk ceiling: how many random, aligned block reads per second
//! the device under a file serves at a fixed queue depth, measured through the
//! engine the searches use ([`IoEngine`]: io_uring when it can be set up,
//! pread otherwise, `NEARLINE_IO` honoured) on a file opened with O_DIRECT.
//!
//! The benchmark divides each system's achieved reads per second by this
//! figure ("utilisation of the disk"), measured on the index's own page file
//! in the same run, so the ratio does not depend on a number from another day.
//!
//! The loop keeps `depth` reads in flight: every completion is checked (an
//! error or a short read ends the measurement with an error) and its buffer is
//! resubmitted at a new uniformly random block until `seconds` have passed;
//! then the reads in flight are drained and counted. The rate is reads
//! completed divided by the time from the first submission to the last
//! completion.
//!
//! Besides the rate it reports the read latency distribution (p50, p99, p99.9,
//! max) and the device's *stalls*: spans of at least [`STALL_THRESHOLD`] during
//! which reads were in flight and none completed. A stall of the disk delays
//! every read in flight at once, so a search running at the same time would
//! wait for it too; the benchmark prints both next to the searches' own
//! percentiles. The measurement's CPUs mostly idle, so it does not see pauses
//! that a host imposes on a VM under CPU load (docs/benchmarks.md, "Where the
//! two-thread latency tail comes from").

use super::buffer::{AlignedBuf, ALIGN};
use super::completion::Completion;
use super::engine::{open_direct, EngineKind, IoEngine};
use crate::{Error, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest queue depth [`measure_read_ceiling`] accepts.
pub const MAX_DEPTH: u32 = 256;
/// Longest measurement [`measure_read_ceiling`] accepts, in seconds.
pub const MAX_SECONDS: f64 = 3600.0;
/// Largest block size [`measure_read_ceiling`] accepts (1 MiB).
pub const MAX_BLOCK_SIZE: usize = 1 << 20;
/// A span with reads in flight and no completion at least this long is a
/// stall: above the p99 of a 4 KiB read at queue depth 32 on the reference
/// machine (0.5–3.1 ms), beyond what queueing explains.
pub const STALL_THRESHOLD: Duration = Duration::from_millis(10);

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct CeilingOptions {
    /// Bytes per read: a positive multiple of 4096 (use the index's page size).
    pub block_size: usize,
    /// Reads kept in flight, 1..=256.
    pub depth: u32,
    /// How long to keep submitting, in seconds (> 0, at most 3600).
    pub seconds: f64,
    /// Engine choice, resolved as [`IoEngine::open`] does.
    pub io: EngineKind,
    /// Seed of the random block sequence.
    pub seed: u64,
}

impl Default for CeilingOptions {
    fn default() -> Self {
        CeilingOptions {
            block_size: 4096,
            depth: 32,
            seconds: 3.0,
            io: EngineKind::Auto,
            seed: 0,
        }
    }
}

impl CeilingOptions {
    /// Checks every field; the error names the field and the accepted range.
    pub fn validate(&self) -> Result<()> {
        if self.depth == 0 || self.depth > MAX_DEPTH {
            return Err(Error::arg(format!(
                "depth={}: expected 1..={MAX_DEPTH} reads in flight",
                self.depth
            )));
        }
        if self.block_size == 0
            || !self.block_size.is_multiple_of(ALIGN)
            || self.block_size > MAX_BLOCK_SIZE
        {
            return Err(Error::arg(format!(
                "block_size={}: expected a positive multiple of {ALIGN} bytes, at most {MAX_BLOCK_SIZE}",
                self.block_size
            )));
        }
        if !self.seconds.is_finite() || self.seconds <= 0.0 || self.seconds > MAX_SECONDS {
            return Err(Error::arg(format!(
                "seconds={}: expected a duration in (0, {MAX_SECONDS}]",
                self.seconds
            )));
        }
        Ok(())
    }
}

/// The outcome of one measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct CeilingReport {
    /// The file read.
    pub path: PathBuf,
    /// Reads completed (all of `block_size` bytes).
    pub reads: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Time from the first submission to the last completion.
    pub elapsed_s: f64,
    /// `reads / elapsed_s`.
    pub reads_per_s: f64,
    /// `bytes / elapsed_s`.
    pub bytes_per_s: f64,
    /// Mean time from a read's submission to the reaping of its completion, µs.
    pub mean_read_latency_us: f64,
    /// Read latency percentiles (same measure), µs: p50, p99, p99.9, max.
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
    pub latency_p999_us: f64,
    pub latency_max_us: f64,
    /// Spans of at least [`STALL_THRESHOLD`] with reads in flight and no
    /// completion.
    pub stalls: u64,
    /// Their total length, seconds.
    pub stall_s: f64,
    /// `"io_uring"` or `"pread"` (pread performs one read at a time, so the
    /// depth is not reached; the report says which engine ran).
    pub engine: &'static str,
    /// Whether O_DIRECT was in effect (file systems such as tmpfs refuse it;
    /// then reads may come from the page cache and the figure is not the disk's).
    pub direct_io: bool,
    /// Queue depth asked for.
    pub depth: u32,
    /// Bytes per read.
    pub block_size: usize,
    /// Whole blocks in the file (reads are drawn uniformly among them).
    pub file_blocks: u64,
}

/// Measures random aligned block reads per second on `path` (a regular file
/// of at least one block). `cancel` stops the measurement early with
/// [`Error::Cancelled`] (reads in flight are drained first).
pub fn measure_read_ceiling(
    path: &Path,
    opts: &CeilingOptions,
    cancel: Option<&AtomicBool>,
) -> Result<CeilingReport> {
    opts.validate()?;
    let (file, direct_io) = open_direct(path)?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::arg(format!(
            "{}: not a regular file (the read ceiling is measured on a file, such as an index's pages.bin)",
            path.display()
        )));
    }
    let bs = opts.block_size as u64;
    let file_blocks = meta.len() / bs;
    if file_blocks == 0 {
        return Err(Error::arg(format!(
            "{}: {} bytes is smaller than one block of {} bytes",
            path.display(),
            meta.len(),
            opts.block_size
        )));
    }
    let mut engine = IoEngine::open(opts.io, Arc::new(file), opts.depth)?;
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let depth = opts.depth as usize;
    let duration = Duration::from_secs_f64(opts.seconds);

    let start = Instant::now();
    let deadline = start + duration;
    let mut submitted_at = vec![start; depth];
    for (slot, at) in submitted_at.iter_mut().enumerate() {
        let offset = rng.random_range(0..file_blocks) * bs;
        *at = Instant::now();
        engine.submit(slot as u64, offset, AlignedBuf::new(opts.block_size))?;
    }
    engine.flush()?;

    let mut done: Vec<Completion> = Vec::with_capacity(depth);
    let mut reads = 0u64;
    let mut latency_sum = Duration::ZERO;
    // Microseconds per read (u32: 71 minutes at most, saturating).
    let mut latencies: Vec<u32> = Vec::new();
    let mut stalls = StallMeter::new(start);
    let mut cancelled = false;
    let mut failure: Option<Error> = None;
    while engine.in_flight() > 0 {
        engine.wait(1, &mut done)?;
        let now = Instant::now();
        // Reads were in flight since the previous reap (the loop runs only
        // while some are), so a long gap is the device's, not ours.
        stalls.reaped(now);
        cancelled = cancelled || cancel.is_some_and(|c| c.load(Ordering::Relaxed));
        let refill = now < deadline && !cancelled && failure.is_none();
        for Completion {
            token, buf, result, ..
        } in done.drain(..)
        {
            // Tokens are the slot numbers given above.
            let slot = token as usize;
            let at = submitted_at.get(slot).copied().unwrap_or(now);
            match result {
                Ok(n) if n == opts.block_size => {
                    reads += 1;
                    let lat = now.saturating_duration_since(at);
                    latency_sum += lat;
                    latencies.push(u32::try_from(lat.as_micros()).unwrap_or(u32::MAX));
                }
                Ok(n) => {
                    failure.get_or_insert_with(|| {
                        Error::io(
                            path,
                            std::io::Error::new(
                                std::io::ErrorKind::UnexpectedEof,
                                format!("short read: {n} of {} bytes", opts.block_size),
                            ),
                        )
                    });
                    continue;
                }
                Err(e) => {
                    failure.get_or_insert_with(|| Error::io(path, e));
                    continue;
                }
            }
            if refill {
                let offset = rng.random_range(0..file_blocks) * bs;
                if let Some(t) = submitted_at.get_mut(slot) {
                    *t = Instant::now();
                }
                engine.submit(token, offset, buf)?;
            }
        }
        if refill {
            engine.flush()?;
        }
    }
    let elapsed_s = start.elapsed().as_secs_f64();
    if let Some(e) = failure {
        return Err(e);
    }
    if cancelled {
        return Err(Error::Cancelled);
    }
    let bytes = reads * bs;
    let per_s = |x: u64| {
        if elapsed_s > 0.0 {
            x as f64 / elapsed_s
        } else {
            0.0
        }
    };
    let pct = Percentiles::of(&mut latencies);
    Ok(CeilingReport {
        path: path.to_path_buf(),
        reads,
        bytes,
        elapsed_s,
        reads_per_s: per_s(reads),
        bytes_per_s: per_s(bytes),
        mean_read_latency_us: if reads > 0 {
            latency_sum.as_secs_f64() * 1e6 / reads as f64
        } else {
            0.0
        },
        latency_p50_us: pct.p50,
        latency_p99_us: pct.p99,
        latency_p999_us: pct.p999,
        latency_max_us: pct.max,
        stalls: stalls.count,
        stall_s: stalls.total.as_secs_f64(),
        engine: engine.name(),
        direct_io,
        depth: opts.depth,
        block_size: opts.block_size,
        file_blocks,
    })
}

/// Counts the device's stalls from the times completions were reaped while
/// reads were in flight: a gap of at least [`STALL_THRESHOLD`] between two
/// reaps (or between the first submission and the first reap) is one stall.
#[derive(Debug, Clone)]
struct StallMeter {
    last: Instant,
    count: u64,
    total: Duration,
}

impl StallMeter {
    fn new(start: Instant) -> Self {
        StallMeter {
            last: start,
            count: 0,
            total: Duration::ZERO,
        }
    }

    /// A completion was reaped at `now`; reads were in flight since the last one.
    fn reaped(&mut self, now: Instant) {
        let gap = now.saturating_duration_since(self.last);
        if gap >= STALL_THRESHOLD {
            self.count += 1;
            self.total += gap;
        }
        self.last = now;
    }
}

/// Nearest-rank percentiles of microsecond samples (all zero when empty).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Percentiles {
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
}

impl Percentiles {
    fn of(samples: &mut [u32]) -> Self {
        samples.sort_unstable();
        let at = |q: f64| -> f64 {
            if samples.is_empty() {
                return 0.0;
            }
            // Nearest rank: the smallest sample with at least q of them at or below it.
            let rank = (q * samples.len() as f64).ceil() as usize;
            f64::from(samples[rank.clamp(1, samples.len()) - 1])
        };
        Percentiles {
            p50: at(0.50),
            p99: at(0.99),
            p999: at(0.999),
            max: samples.last().map_or(0.0, |&v| f64::from(v)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(bytes: usize) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![7u8; bytes]).unwrap();
        f.flush().unwrap();
        f
    }

    fn quick(io: EngineKind) -> CeilingOptions {
        CeilingOptions {
            seconds: 0.05,
            depth: 8,
            io,
            ..CeilingOptions::default()
        }
    }

    #[test]
    fn measures_a_positive_rate_with_every_engine() {
        let f = file_of(64 * 4096);
        for io in [EngineKind::Auto, EngineKind::Pread] {
            let r = measure_read_ceiling(f.path(), &quick(io), None).unwrap();
            assert!(r.reads > 0, "{r:?}");
            assert!(r.reads_per_s > 0.0 && r.bytes_per_s > 0.0, "{r:?}");
            assert_eq!(r.bytes, r.reads * 4096);
            assert_eq!(r.file_blocks, 64);
            assert!(r.elapsed_s >= 0.05, "{r:?}");
            assert!(r.mean_read_latency_us > 0.0, "{r:?}");
            assert!(r.latency_p50_us <= r.latency_p99_us, "{r:?}");
            assert!(r.latency_p99_us <= r.latency_p999_us, "{r:?}");
            assert!(r.latency_p999_us <= r.latency_max_us, "{r:?}");
            assert!(r.latency_max_us <= r.elapsed_s * 1e6 + 1.0, "{r:?}");
            assert!(r.stall_s <= r.elapsed_s, "{r:?}");
            assert!((r.stalls == 0) == (r.stall_s == 0.0), "{r:?}");
            assert!(["io_uring", "io_uring-poll", "pread"].contains(&r.engine));
        }
        let r = measure_read_ceiling(f.path(), &quick(EngineKind::Pread), None).unwrap();
        assert_eq!(r.engine, "pread");
    }

    #[test]
    fn stall_meter_counts_gaps_at_or_over_the_threshold() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut m = StallMeter::new(t0);
        // Reaps at 1, 2, 12 (gap 10: a stall), 13, 40 (gap 27: a stall), 49.
        for at in [1, 2, 12, 13, 40, 49] {
            m.reaped(t0 + ms(at));
        }
        assert_eq!(m.count, 2);
        assert_eq!(m.total, ms(37));
        // A first reap long after the start is a stall too.
        let mut m = StallMeter::new(t0);
        m.reaped(t0 + ms(25));
        assert_eq!((m.count, m.total), (1, ms(25)));
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let mut v: Vec<u32> = (1..=1000).rev().collect();
        let p = Percentiles::of(&mut v);
        assert_eq!((p.p50, p.p99, p.p999, p.max), (500.0, 990.0, 999.0, 1000.0));
        let mut one = vec![7u32];
        let p = Percentiles::of(&mut one);
        assert_eq!((p.p50, p.p99, p.p999, p.max), (7.0, 7.0, 7.0, 7.0));
        let p = Percentiles::of(&mut []);
        assert_eq!((p.p50, p.max), (0.0, 0.0));
    }

    #[test]
    fn larger_blocks_and_partial_tail_block() {
        // 3 whole 8 KiB blocks plus a partial one, which is never read.
        let f = file_of(3 * 8192 + 100);
        let opts = CeilingOptions {
            block_size: 8192,
            ..quick(EngineKind::Auto)
        };
        let r = measure_read_ceiling(f.path(), &opts, None).unwrap();
        assert_eq!(r.file_blocks, 3);
        assert_eq!(r.bytes, r.reads * 8192);
        assert!(r.reads > 0);
    }

    #[test]
    fn rejects_bad_arguments() {
        let f = file_of(4 * 4096);
        let bad = [
            (
                CeilingOptions {
                    depth: 0,
                    ..quick(EngineKind::Auto)
                },
                "depth=0",
            ),
            (
                CeilingOptions {
                    depth: 257,
                    ..quick(EngineKind::Auto)
                },
                "depth=257",
            ),
            (
                CeilingOptions {
                    block_size: 0,
                    ..quick(EngineKind::Auto)
                },
                "block_size=0",
            ),
            (
                CeilingOptions {
                    block_size: 5000,
                    ..quick(EngineKind::Auto)
                },
                "block_size=5000",
            ),
            (
                CeilingOptions {
                    seconds: 0.0,
                    ..quick(EngineKind::Auto)
                },
                "seconds=0",
            ),
            (
                CeilingOptions {
                    seconds: -1.0,
                    ..quick(EngineKind::Auto)
                },
                "seconds=-1",
            ),
            (
                CeilingOptions {
                    seconds: f64::NAN,
                    ..quick(EngineKind::Auto)
                },
                "seconds=NaN",
            ),
        ];
        for (opts, want) in bad {
            let err = measure_read_ceiling(f.path(), &opts, None).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
            assert!(err.to_string().contains(want), "{err} should name {want}");
        }
    }

    #[test]
    fn rejects_files_smaller_than_a_block_and_non_files() {
        let small = file_of(4095);
        let err = measure_read_ceiling(small.path(), &quick(EngineKind::Auto), None).unwrap_err();
        assert!(err.to_string().contains("smaller than one block"), "{err}");
        let empty = file_of(0);
        assert!(measure_read_ceiling(empty.path(), &quick(EngineKind::Auto), None).is_err());
        let dir = tempfile::tempdir().unwrap();
        let err = measure_read_ceiling(dir.path(), &quick(EngineKind::Auto), None).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let missing = dir.path().join("missing.bin");
        let err = measure_read_ceiling(&missing, &quick(EngineKind::Auto), None).unwrap_err();
        assert!(err.to_string().contains("missing.bin"), "{err}");
    }

    #[test]
    fn cancel_stops_with_cancelled() {
        let f = file_of(16 * 4096);
        let cancel = AtomicBool::new(true);
        let opts = CeilingOptions {
            seconds: 60.0,
            ..quick(EngineKind::Auto)
        };
        let err = measure_read_ceiling(f.path(), &opts, Some(&cancel)).unwrap_err();
        assert!(matches!(err, Error::Cancelled), "{err}");
    }
}
