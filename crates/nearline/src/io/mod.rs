//! The I/O engine: owned aligned buffers, O_DIRECT files and the engines
//! behind one contract (`submit` / `poll` / `wait`).
//!
//! Contract:
//! * `submit(token, offset, buf)` queues a read of `buf.len()` bytes at byte
//!   `offset`; the engine owns `buf` until the read's completion is reaped.
//! * `poll(out, max)` appends up to `max` finished reads without blocking.
//! * `wait(min, out)` blocks until at least `min` reads (bounded by the number
//!   in flight) have finished and appends them.
//! * Dropping an engine first waits for every read in flight, so no buffer is
//!   ever freed while the kernel may still write into it.
//!
//! Engines: io_uring (one ring per worker), pread (synchronous fallback,
//! chosen when io_uring cannot be set up or forced with
//! `NEARLINE_IO=pread`), and a fake engine for tests that completes out of
//! order, with delays, and can fail reads.
//!
//! [`blocks`] reads single blocks for open-time loads, [`files`] reads and
//! writes an index directory's manifest and sections (checked, durable).
//! [`ceiling`] measures the disk's random-read rate through the same engine
//! (the benchmark's same-run reference).

pub mod blocks;
pub mod buffer;
pub mod ceiling;
pub mod completion;
pub mod engine;
pub mod fake;
pub mod files;
pub mod pread;
pub mod staging;
#[cfg(target_os = "linux")]
pub mod uring;

pub use blocks::BlockReader;
pub use buffer::{AlignedBuf, BufferPool, ALIGN};
pub use ceiling::{measure_read_ceiling, CeilingOptions, CeilingReport};
pub use completion::{Completion, IoCounters};
pub use engine::{open_direct, EngineKind, IoEngine};
pub use fake::{FakeEngine, FakeOptions};
